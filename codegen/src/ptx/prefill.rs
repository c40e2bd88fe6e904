//! Causal prefill attention on tensor cores for a [`PrefillPlan`]: the
//! FlashAttention-2 loop with `mma.sync.aligned.m16n8k16` (f16 inputs, f32
//! accumulation), K and V blocks staged by `cp.async`.
//!
//! # Mapping
//!
//! Grid `(⌈t·group / rows⌉, kv_heads)`, block 4 or 8 warps of 16 rows
//! ([`BlockPlan`]). Rows are (query token, query head) pairs of one KV
//! head, token-major, as in the OpenCL prefill, so the heads of a GQA
//! group share each K/V block. Block `x` takes rows
//! `rows·(gridDim.x − 1 − x)` on: the longest causal rows start first. Warp
//! `w` owns rows `16w .. 16w + 15` of the block (the mma's m side); thread
//! `lane` with `g = lane >> 2`, `t = lane & 3` holds rows `g` and `g + 8`.
//!
//! Per key block of `keys` rows (64 up to d = 128, else 32), up to the
//! block's last causal limit (later blocks are never loaded):
//!
//! 1. `S = Q·Kᵀ`: Q's A fragments (in registers for d ≤ 128, else read
//!    from shared memory per block by `ldmatrix.x4`), K's B fragments by
//!    `ldmatrix.x4` of key rows (K row-major is the mma's column-major B).
//!    A warp whose rows see none of the block skips it.
//! 2. Keys past a row's causal limit get −∞ (only where the block crosses
//!    the warp's first limit). Online softmax per row in f32, on the
//!    quad's four lanes (`shfl.sync.bfly` 1, 2): `α = 2^((m − m')·c)`,
//!    `p = 2^(s·c − m'·c)` with `c = log2 e` (times `1/√d` where q is not
//!    prescaled: MNN-LLM 5.3's pre-scaled scores).
//! 3. `O = α·O + P·V`: P's accumulators become A fragments in registers
//!    (`cvt.rn.f16x2.f32`, the C layout of two n tiles is the A layout of
//!    one k step), V's B fragments by `ldmatrix.x4.trans` of key rows.
//!
//! The next block is issued into the other stage before the current one
//! is computed. f16 caches are copied by `cp.async` straight into the
//! tiles (zero-filled past the keys). Other formats travel as raw bytes:
//! `cp.async` copies block `j + 2` (codes, and int8 keys' row scales and
//! offsets) into one of two staging buffers while block `j` is computed,
//! and the threads decode block `j + 1` from the other into its f16 tile
//! first (int8 keys with their row's scale and offset), so no global load
//! waits in the loop. Shared rows are padded by 16 bytes, so the eight
//! rows an `ldmatrix` reads fall in distinct banks for every head dim.

use std::fmt::Write as _;

use super::attention::vec_values;
use super::writer::{Body, f32_lit};
use super::{Args, Limits, Sm, module};
use crate::artifact::EmitError;
use crate::gpu::{KvFormat, PrefillPlan};

/// How a prefill block is cut: keys per key block, where Q's fragments
/// live, and warps per block (each owns 16 query rows).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockPlan {
    pub keys: u32,
    pub q_in_registers: bool,
    pub warps: u32,
}

/// `.maxnreg` of the prefill: the O accumulators alone are `d/2` registers
/// a thread, so the kernel takes the target's per-thread maximum
/// (`GpuCaps::max_regs_per_thread`: two blocks of 128 threads per SM at
/// 255), not the matmuls' solver budget.
pub fn max_registers(sm: Sm) -> u32 {
    sm.caps().gpu.map_or(255, |g| g.max_regs_per_thread)
}

fn unsupported(what: String) -> EmitError {
    EmitError::Unsupported {
        backend: "ptx",
        what,
    }
}

/// The sizes one prefill program is built from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefillLayout {
    pub d: u32,
    /// Warps per block; query rows per block are 16 a warp.
    pub warps: u32,
    /// Keys per block.
    pub keys: u32,
    /// Bytes of one shared row of `d` halves, padded by 16.
    pub stride: u32,
    /// Q's A fragments live in registers for the whole kernel.
    pub q_in_registers: bool,
    /// Bytes of the Q tile, then of one stage (K block then V block).
    pub q_bytes: u32,
    pub stage_bytes: u32,
    /// One staging buffer of raw bytes for the quantized sides: K codes,
    /// V codes, then int8 keys' scales and offsets, at these offsets (None:
    /// the side is f16 and copied straight into its tile).
    pub raw_k: Option<u32>,
    pub raw_v: Option<u32>,
    pub raw_params: Option<u32>,
    pub raw_bytes: u32,
    /// Dynamic shared memory of the launch: Q, two stages and two staging
    /// buffers.
    pub shared_bytes: u32,
}

impl PrefillLayout {
    /// The default plan for head dim `d`: up to d = 128, Q in registers
    /// and 64-key blocks, 4 warps for f16 caches and 8 for quantized ones;
    /// above, Q in shared memory, 32-key blocks, 4 warps. (H200, `cuda_bench
    /// prefill-plans`, 2048 tokens: on f16 caches 64 keys beat 32 and 128
    /// by 10–15% and 8 warps were 2–6% slower; on kv8 caches 8 warps of 64
    /// keys beat 4 of 32 by 16–18%: each decoded block serves twice the
    /// rows.)
    pub fn new(d: u32, k: KvFormat, v: KvFormat, sm: Sm) -> Result<PrefillLayout, EmitError> {
        let small = d <= 128;
        let f16 = k == KvFormat::F16 && v == KvFormat::F16;
        let plan = BlockPlan {
            keys: if small { 64 } else { 32 },
            q_in_registers: small,
            warps: if small && !f16 { 8 } else { 4 },
        };
        PrefillLayout::with(d, k, v, sm, plan)
    }

    /// Another plan: `keys` per block (a multiple of 16), Q in registers or
    /// read from shared memory per block, 1 to 8 warps.
    pub fn with(
        d: u32,
        k: KvFormat,
        v: KvFormat,
        sm: Sm,
        plan: BlockPlan,
    ) -> Result<PrefillLayout, EmitError> {
        let BlockPlan {
            keys,
            q_in_registers,
            warps,
        } = plan;
        if !(1..=8).contains(&warps) {
            return Err(unsupported(format!(
                "{warps} warps per prefill block (1 to 8)"
            )));
        }
        if d == 0 || !d.is_multiple_of(16) {
            return Err(unsupported(format!(
                "head dim {d} in the tensor-core prefill (a multiple of 16: the mma's k step)"
            )));
        }
        if keys == 0 || !keys.is_multiple_of(16) {
            return Err(unsupported(format!(
                "{keys} keys per prefill block (a multiple of 16: P·V's k step)"
            )));
        }
        let stride = 2 * d + 16;
        let q_bytes = 16 * warps * stride;
        let stage_bytes = 2 * keys * stride;
        let mut raw_bytes = 0;
        let mut place = |bytes: u32| {
            let at = raw_bytes;
            raw_bytes += bytes;
            at
        };
        let raw_k = (k != KvFormat::F16).then(|| place(keys * d));
        let raw_v = (v != KvFormat::F16).then(|| place(keys * d));
        let raw_params = (k == KvFormat::I8AsymRow).then(|| place(2 * 4 * keys));
        let shared_bytes = q_bytes + 2 * stage_bytes + 2 * raw_bytes;
        let limit = sm.caps().gpu.map_or(48 * 1024, |g| g.shared_mem_bytes);
        if shared_bytes > limit {
            return Err(unsupported(format!(
                "head dim {d}: the prefill's tiles take {shared_bytes} bytes of shared memory, \
                 {} has {limit}",
                sm.arch()
            )));
        }
        Ok(PrefillLayout {
            d,
            warps,
            keys,
            stride,
            q_in_registers,
            q_bytes,
            stage_bytes,
            raw_k,
            raw_v,
            raw_params,
            raw_bytes,
            shared_bytes,
        })
    }
}

impl PrefillLayout {
    /// Query rows per block.
    pub fn rows(&self) -> u32 {
        16 * self.warps
    }

    /// Threads per block.
    pub fn threads(&self) -> u32 {
        32 * self.warps
    }
}

/// Block-invariant registers.
struct Ctx {
    /// Threads per block (an emit-time constant).
    threads: u32,
    tid: String,
    lane: String,
    warp: String,
    kv: String,
    group: String,
    rows: String,
    r0: String,
    /// The block's key end: its last row's causal limit + 1.
    kend: String,
    smem: String,
}

/// The program text and its dynamic shared memory bytes.
pub fn print(
    plan: &PrefillPlan,
    lay: &PrefillLayout,
    sm: Sm,
    header: &str,
) -> Result<(String, u32), EmitError> {
    if plan.d != lay.d || plan.keys != lay.keys || plan.rows != lay.rows() {
        return Err(unsupported(format!(
            "a plan of {} rows × {} keys at d = {} for a layout of {} × {} at d = {}",
            plan.rows,
            plan.keys,
            plan.d,
            lay.rows(),
            lay.keys,
            lay.d
        )));
    }
    let smem_name = format!("{}_smem", plan.entry);
    let mut b = Body::new();
    let a = Args::load(&mut b, &plan.entry, &plan.args);
    let cx = ctx(&mut b, lay, &a, &smem_name);
    let d = lay.d;
    let (t, s, hq) = (a.get("t"), a.get("s"), a.get("hq"));

    // This thread's rows (g, g + 8) and the warp's first and last: their
    // causal limits `s − t + token` (dead rows past `rows` take the last
    // row's, so they never reach past the loaded keys).
    let (g, t4) = (b.r(), b.r());
    b.op(format!("shr.u32 {g}, {}, 2", cx.lane));
    b.op(format!("and.b32 {t4}, {}, 3", cx.lane));
    let wrow = b.r();
    b.op(format!("mad.lo.s32 {wrow}, {}, 16, {}", cx.warp, cx.r0));
    let last_row = b.r();
    b.op(format!("sub.s32 {last_row}, {}, 1", cx.rows));
    let base_lim = b.r();
    b.op(format!("sub.s32 {base_lim}, {s}, {t}"));
    let limit_of = |b: &mut Body, row: &str| {
        let (r, tok, lim) = (b.r(), b.r(), b.r());
        b.op(format!("min.s32 {r}, {row}, {last_row}"));
        b.op(format!("div.u32 {tok}, {r}, {}", cx.group));
        b.op(format!("add.s32 {lim}, {base_lim}, {tok}"));
        lim
    };
    let (row_a, row_b) = (b.r(), b.r());
    b.op(format!("add.s32 {row_a}, {wrow}, {g}"));
    b.op(format!("add.s32 {row_b}, {row_a}, 8"));
    let lim_a = limit_of(&mut b, &row_a);
    let lim_b = limit_of(&mut b, &row_b);
    let lim_first = limit_of(&mut b, &wrow);
    let wlast = b.r();
    b.op(format!("add.s32 {wlast}, {wrow}, 15"));
    let lim_last = limit_of(&mut b, &wlast);

    let nkb = b.r();
    b.op(format!("add.s32 {nkb}, {}, {}", cx.kend, lay.keys - 1));
    b.op(format!("div.u32 {nkb}, {nkb}, {}", lay.keys));

    b.comment("Prologue: Q and key block 0 into stage 0.");
    load_q(&mut b, lay, &cx, &a, hq);
    let stage0 = b.r();
    b.op(format!("add.s32 {stage0}, {}, {}", cx.smem, lay.q_bytes));
    let raw0 = b.r();
    b.op(format!("add.s32 {raw0}, {stage0}, {}", 2 * lay.stage_bytes));
    let quantized = lay.raw_bytes > 0;
    let magic = b.imm(0x4B00_0000);
    let zero = b.r();
    b.op(format!("mov.u32 {zero}, 0"));
    issue_direct(&mut b, plan, lay, &cx, &a, &stage0, &zero);
    if quantized {
        b.comment("Raw bytes of blocks 0 and 1 into the two staging buffers.");
        issue_raw(&mut b, lay, &cx, &a, &raw0, &zero);
        let (raw1, j1) = (b.r(), b.r());
        b.op(format!("add.s32 {raw1}, {raw0}, {}", lay.raw_bytes));
        b.op(format!("mov.u32 {j1}, {}", lay.keys));
        issue_raw(&mut b, lay, &cx, &a, &raw1, &j1);
    }
    b.op("cp.async.commit_group");
    if quantized {
        b.op("cp.async.wait_group 0");
        b.op("bar.sync 0");
        convert(&mut b, plan, lay, sm, &cx, &raw0, &stage0, &magic);
    }

    // Lane addresses of the fragments (relative to their tile's base):
    // A-style (rows lane & 15, chunk lane >> 4) for Q and V, B-style (rows
    // (lane & 7) + 8·(lane >> 4), chunk (lane >> 3) & 1) for K.
    let (l15, l4, a_off) = (b.r(), b.r(), b.r());
    b.op(format!("and.b32 {l15}, {}, 15", cx.lane));
    b.op(format!("shr.u32 {l4}, {}, 4", cx.lane));
    b.op(format!("shl.b32 {l4}, {l4}, 4"));
    b.op(format!("mad.lo.s32 {a_off}, {l15}, {}, {l4}", lay.stride));
    let (l7, l8, kr, k_off) = (b.r(), b.r(), b.r(), b.r());
    b.op(format!("and.b32 {l7}, {}, 7", cx.lane));
    b.op(format!("shr.u32 {l8}, {}, 4", cx.lane));
    b.op(format!("mad.lo.s32 {kr}, {l8}, 8, {l7}"));
    let kc = b.r();
    b.op(format!("bfe.u32 {kc}, {}, 3, 1", cx.lane));
    b.op(format!("shl.b32 {kc}, {kc}, 4"));
    b.op(format!("mad.lo.s32 {k_off}, {kr}, {}, {kc}", lay.stride));
    let q_frag = b.r();
    b.op(format!(
        "mad.lo.s32 {q_frag}, {}, {}, {a_off}",
        cx.warp,
        16 * lay.stride
    ));
    b.op(format!("add.s32 {q_frag}, {q_frag}, {}", cx.smem));

    let ksteps = d / 16;
    let q_regs: Vec<[String; 4]> = if lay.q_in_registers {
        if !quantized {
            b.op("cp.async.wait_group 0");
            b.op("bar.sync 0");
        }
        (0..ksteps)
            .map(|ks| {
                let r: [String; 4] = std::array::from_fn(|_| b.r());
                b.op(format!(
                    "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {{{}}}, [{q_frag}+{}]",
                    r.join(", "),
                    ks * 32
                ));
                r
            })
            .collect()
    } else {
        Vec::new()
    };

    // Softmax state of rows g, g + 8 and the O accumulators: d/8 n tiles of
    // [row g: 2 columns, row g + 8: 2 columns].
    let neg_inf = f32_lit(f32::NEG_INFINITY);
    let (m_a, m_b, l_a, l_b) = (b.f(), b.f(), b.f(), b.f());
    for m in [&m_a, &m_b] {
        b.op(format!("mov.f32 {m}, {neg_inf}"));
    }
    for l in [&l_a, &l_b] {
        b.op(format!("mov.f32 {l}, 0f00000000"));
    }
    let o: Vec<[String; 4]> = (0..d / 8).map(|_| std::array::from_fn(|_| b.f())).collect();
    for tile in &o {
        for r in tile {
            b.op(format!("mov.f32 {r}, 0f00000000"));
        }
    }
    let scale = if plan.q_prescaled {
        1.0
    } else {
        1.0 / (d as f32).sqrt()
    };
    let c = f32_lit(std::f32::consts::LOG2_E * scale);

    let jb = b.r();
    b.op(format!("mov.u32 {jb}, 0"));
    let top = b.label("key_block");
    let end = b.label("key_blocks_done");
    b.place(&top);
    let p = b.pred();
    b.op(format!("setp.ge.u32 {p}, {jb}, {nkb}"));
    b.op(format!("@{p} bra.uni {end}"));
    b.op("cp.async.wait_group 0");
    b.op("bar.sync 0");
    b.comment("Block jb + 1 into the other stage (computed last trip).");
    let next = b.r();
    b.op(format!("add.s32 {next}, {jb}, 1"));
    let skip_issue = b.label("issue_skip");
    let pn = b.pred();
    b.op(format!("setp.ge.u32 {pn}, {next}, {nkb}"));
    b.op(format!("@{pn} bra.uni {skip_issue}"));
    let (nst, nbase, nj0) = (b.r(), b.r(), b.r());
    b.op(format!("and.b32 {nst}, {next}, 1"));
    b.op(format!(
        "mad.lo.s32 {nbase}, {nst}, {}, {stage0}",
        lay.stage_bytes
    ));
    b.op(format!("mul.lo.s32 {nj0}, {next}, {}", lay.keys));
    issue_direct(&mut b, plan, lay, &cx, &a, &nbase, &nj0);
    if quantized {
        b.comment("Raw block jb + 2 into the staging buffer block jb left.");
        let (cur, far, j2) = (b.r(), b.r(), b.r());
        b.op(format!("and.b32 {cur}, {jb}, 1"));
        b.op(format!(
            "mad.lo.s32 {cur}, {cur}, {}, {raw0}",
            lay.raw_bytes
        ));
        b.op(format!("add.s32 {far}, {jb}, 2"));
        let skip_raw = b.label("raw_skip");
        let pr = b.pred();
        b.op(format!("setp.ge.u32 {pr}, {far}, {nkb}"));
        b.op(format!("@{pr} bra.uni {skip_raw}"));
        b.op(format!("mul.lo.s32 {j2}, {far}, {}", lay.keys));
        issue_raw(&mut b, lay, &cx, &a, &cur, &j2);
        b.place(&skip_raw);
        b.op("cp.async.commit_group");
        b.comment("Decode block jb + 1 from the other staging buffer.");
        let other = b.r();
        b.op(format!(
            "mad.lo.s32 {other}, {nst}, {}, {raw0}",
            lay.raw_bytes
        ));
        convert(&mut b, plan, lay, sm, &cx, &other, &nbase, &magic);
    }
    b.place(&skip_issue);
    if !quantized {
        b.op("cp.async.commit_group");
    }

    let (cst, kbase, vbase, j0) = (b.r(), b.r(), b.r(), b.r());
    b.op(format!("and.b32 {cst}, {jb}, 1"));
    b.op(format!(
        "mad.lo.s32 {kbase}, {cst}, {}, {stage0}",
        lay.stage_bytes
    ));
    b.op(format!(
        "add.s32 {vbase}, {kbase}, {}",
        lay.keys * lay.stride
    ));
    b.op(format!("mul.lo.s32 {j0}, {jb}, {}", lay.keys));
    let skip_block = b.label("block_masked");
    let pm = b.pred();
    b.op(format!("setp.gt.s32 {pm}, {j0}, {lim_last}"));
    b.comment("Every row of this warp is before the block: nothing to do.");
    b.op(format!("@{pm} bra.uni {skip_block}"));

    // 1. S = Q·Kᵀ.
    let n_tiles = lay.keys / 8;
    let sacc: Vec<[String; 4]> = (0..n_tiles)
        .map(|_| std::array::from_fn(|_| b.f()))
        .collect();
    for tile in &sacc {
        for r in tile {
            b.op(format!("mov.f32 {r}, 0f00000000"));
        }
    }
    let ka = b.r();
    b.op(format!("add.s32 {ka}, {kbase}, {k_off}"));
    for ks in 0..ksteps {
        let qa: [String; 4] = if lay.q_in_registers {
            q_regs[ks as usize].clone()
        } else {
            let r: [String; 4] = std::array::from_fn(|_| b.r());
            b.op(format!(
                "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {{{}}}, [{q_frag}+{}]",
                r.join(", "),
                ks * 32
            ));
            r
        };
        for np in 0..n_tiles / 2 {
            let kb: [String; 4] = std::array::from_fn(|_| b.r());
            b.op(format!(
                "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {{{}}}, [{ka}+{}]",
                kb.join(", "),
                np * 16 * lay.stride + ks * 32
            ));
            for (half, tile) in [(0usize, 2 * np), (1, 2 * np + 1)] {
                let acc = &sacc[tile as usize];
                mma(&mut b, acc, &qa, [&kb[2 * half], &kb[2 * half + 1]]);
            }
        }
    }

    // 2. Causal mask where the block reaches past the warp's first limit.
    let skip_mask = b.label("mask_skip");
    let (jl, pmask) = (b.r(), b.pred());
    b.op(format!("add.s32 {jl}, {j0}, {}", lay.keys - 1));
    b.op(format!("setp.le.s32 {pmask}, {jl}, {lim_first}"));
    b.op(format!("@{pmask} bra.uni {skip_mask}"));
    let key0 = b.r();
    b.op(format!("mad.lo.s32 {key0}, {t4}, 2, {j0}"));
    for (nt, tile) in sacc.iter().enumerate() {
        for (i, r) in tile.iter().enumerate() {
            let (key, pk) = (b.r(), b.pred());
            b.op(format!("add.s32 {key}, {key0}, {}", 8 * nt + (i & 1)));
            let lim = if i < 2 { &lim_a } else { &lim_b };
            b.op(format!("setp.gt.s32 {pk}, {key}, {lim}"));
            b.op(format!("@{pk} mov.f32 {r}, {neg_inf}"));
        }
    }
    b.place(&skip_mask);

    // Online softmax, rows g (accumulator registers 0, 1) and g + 8 (2, 3).
    for (half, (m, l)) in [(&m_a, &l_a), (&m_b, &l_b)].into_iter().enumerate() {
        let regs = [2 * half, 2 * half + 1];
        let mx = b.f();
        b.op(format!("mov.f32 {mx}, {neg_inf}"));
        for tile in &sacc {
            for &i in &regs {
                b.op(format!("max.f32 {mx}, {mx}, {}", tile[i]));
            }
        }
        for off in [1, 2] {
            let o2 = b.f();
            b.op(format!(
                "shfl.sync.bfly.b32 {o2}, {mx}, {off}, 31, 0xffffffff"
            ));
            b.op(format!("max.f32 {mx}, {mx}, {o2}"));
        }
        // Block 0 holds key 0, which every row sees: after it m is finite,
        // so m − m' is never −∞ − (−∞).
        let (mn, alpha, mc) = (b.f(), b.f(), b.f());
        b.op(format!("max.f32 {mn}, {m}, {mx}"));
        b.op(format!("sub.f32 {alpha}, {m}, {mn}"));
        b.op(format!("mul.f32 {alpha}, {alpha}, {c}"));
        b.op(format!("ex2.approx.ftz.f32 {alpha}, {alpha}"));
        b.op(format!("mul.f32 {mc}, {mn}, {c}"));
        b.op(format!("neg.f32 {mc}, {mc}"));
        b.op(format!("mov.f32 {m}, {mn}"));
        b.op(format!("mul.f32 {l}, {l}, {alpha}"));
        for tile in &sacc {
            for &i in &regs {
                let r = &tile[i];
                b.op(format!("fma.rn.f32 {r}, {r}, {c}, {mc}"));
                b.op(format!("ex2.approx.ftz.f32 {r}, {r}"));
                b.op(format!("add.f32 {l}, {l}, {r}"));
            }
        }
        for tile in &o {
            for &i in &regs {
                b.op(format!("mul.f32 {}, {}, {alpha}", tile[i], tile[i]));
            }
        }
    }

    // 3. O += P·V: two n tiles of P are one k step's A fragment.
    let va = b.r();
    b.op(format!("add.s32 {va}, {vbase}, {a_off}"));
    for kk in 0..lay.keys / 16 {
        let (lo, hi) = (&sacc[2 * kk as usize], &sacc[2 * kk as usize + 1]);
        let pa: [String; 4] = std::array::from_fn(|_| b.r());
        for (dst, (tile, i)) in pa.iter().zip([(lo, 0), (lo, 2), (hi, 0), (hi, 2)]) {
            b.op(format!(
                "cvt.rn.f16x2.f32 {dst}, {}, {}",
                tile[i + 1],
                tile[i]
            ));
        }
        for np in 0..d / 16 {
            let vb: [String; 4] = std::array::from_fn(|_| b.r());
            b.op(format!(
                "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {{{}}}, [{va}+{}]",
                vb.join(", "),
                kk * 16 * lay.stride + np * 32
            ));
            for (half, tile) in [(0usize, 2 * np), (1, 2 * np + 1)] {
                mma(
                    &mut b,
                    &o[tile as usize],
                    &pa,
                    [&vb[2 * half], &vb[2 * half + 1]],
                );
            }
        }
    }
    b.place(&skip_block);
    b.op(format!("add.s32 {jb}, {jb}, 1"));
    b.op(format!("bra.uni {top}"));
    b.place(&end);

    // O / l, rounded to f16, for live rows.
    for (half, (row, l)) in [(&row_a, &l_a), (&row_b, &l_b)].into_iter().enumerate() {
        for off in [1, 2] {
            let o2 = b.f();
            b.op(format!(
                "shfl.sync.bfly.b32 {o2}, {l}, {off}, 31, 0xffffffff"
            ));
            b.op(format!("add.f32 {l}, {l}, {o2}"));
        }
        let inv = b.f();
        b.op(format!("rcp.rn.f32 {inv}, {l}"));
        let skip = b.label("row_dead");
        let pd = b.pred();
        b.op(format!("setp.ge.s32 {pd}, {row}, {}", cx.rows));
        b.op(format!("@{pd} bra {skip}"));
        let (tok, head, orow) = (b.r(), b.r(), b.r());
        b.op(format!("div.u32 {tok}, {row}, {}", cx.group));
        b.op(format!("rem.u32 {head}, {row}, {}", cx.group));
        b.op(format!(
            "mad.lo.s32 {head}, {}, {}, {head}",
            cx.kv, cx.group
        ));
        b.op(format!("mad.lo.s32 {orow}, {tok}, {hq}, {head}"));
        let (col, idx, off64, dst) = (b.r(), b.r(), b.rd(), b.rd());
        b.op(format!("shl.b32 {col}, {t4}, 1"));
        b.op(format!("mad.lo.s32 {idx}, {orow}, {d}, {col}"));
        b.op(format!("mul.wide.u32 {off64}, {idx}, 2"));
        b.op(format!("add.s64 {dst}, {}, {off64}", a.get("o")));
        for (nt, tile) in o.iter().enumerate() {
            let (x0, x1, w) = (b.f(), b.f(), b.r());
            b.op(format!("mul.f32 {x0}, {}, {inv}", tile[2 * half]));
            b.op(format!("mul.f32 {x1}, {}, {inv}", tile[2 * half + 1]));
            b.op(format!("cvt.rn.f16x2.f32 {w}, {x1}, {x0}"));
            b.op(format!("st.global.b32 [{dst}+{}], {w}", 16 * nt));
        }
        b.place(&skip);
    }
    b.op("ret");

    let mut h = header.to_string();
    let _ = write!(
        h,
        "\ndynamic shared memory: {} bytes (Q {} + 2 stages x (K + V) {} + 2 staging buffers x {}), \
         rows padded to {} bytes",
        lay.shared_bytes, lay.q_bytes, lay.stage_bytes, lay.raw_bytes, lay.stride
    );
    let decls = vec![format!(".extern .shared .align 128 .b8 {smem_name}[];")];
    let text = module(
        sm,
        &h,
        &plan.entry,
        &plan.args,
        Limits {
            reqntid: [lay.threads(), 1, 1],
            maxnreg: max_registers(sm),
        },
        &decls,
        b,
    );
    Ok((text, lay.shared_bytes))
}

/// `acc += a·b` on one m16n8k16 tile.
fn mma(b: &mut Body, acc: &[String; 4], a: &[String; 4], bf: [&String; 2]) {
    b.op(format!(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {{{acc}}}, {{{a}}}, {{{}, {}}}, {{{acc}}}",
        bf[0],
        bf[1],
        acc = acc.join(", "),
        a = a.join(", ")
    ));
}

fn ctx(b: &mut Body, lay: &PrefillLayout, a: &Args, smem: &str) -> Ctx {
    let rows_per_block = lay.rows();
    let (tid, lane, warp, kv) = (b.r(), b.r(), b.r(), b.r());
    b.op(format!("mov.u32 {tid}, %tid.x"));
    b.op(format!("and.b32 {lane}, {tid}, 31"));
    b.op(format!("shr.u32 {warp}, {tid}, 5"));
    b.op(format!("mov.u32 {kv}, %ctaid.y"));
    let (group, rows) = (b.r(), b.r());
    b.op(format!(
        "div.u32 {group}, {}, {}",
        a.get("hq"),
        a.get("kvh")
    ));
    b.op(format!("mul.lo.s32 {rows}, {}, {group}", a.get("t")));
    b.comment("Blocks in reverse: the longest causal rows start first.");
    let (nb, cb, r0) = (b.r(), b.r(), b.r());
    b.op(format!("mov.u32 {nb}, %nctaid.x"));
    b.op(format!("mov.u32 {cb}, %ctaid.x"));
    b.op(format!("sub.s32 {r0}, {nb}, {cb}"));
    b.op(format!("sub.s32 {r0}, {r0}, 1"));
    b.op(format!("mul.lo.s32 {r0}, {r0}, {rows_per_block}"));
    let (last, kend) = (b.r(), b.r());
    b.op(format!("add.s32 {last}, {r0}, {rows_per_block}"));
    b.op(format!("min.s32 {last}, {last}, {rows}"));
    b.op(format!("sub.s32 {last}, {last}, 1"));
    b.op(format!("div.u32 {last}, {last}, {group}"));
    b.op(format!("sub.s32 {kend}, {}, {}", a.get("s"), a.get("t")));
    b.op(format!("add.s32 {kend}, {kend}, {last}"));
    b.op(format!("add.s32 {kend}, {kend}, 1"));
    let base = b.r();
    b.op(format!("mov.u32 {base}, {smem}"));
    Ctx {
        threads: lay.threads(),
        tid,
        lane,
        warp,
        kv,
        group,
        rows,
        r0,
        kend,
        smem: base,
    }
}

/// `(i, i / d8, i % d8)`: the index, row and 16-byte chunk of this
/// thread's `it`-th copy of a tile of `d8` chunks per row ([`guard`] skips
/// indices past the tile).
fn chunk_of(b: &mut Body, cx: &Ctx, it: u32, d8: u32) -> (String, String, String) {
    let (i, row, c) = (b.r(), b.r(), b.r());
    b.op(format!("add.s32 {i}, {}, {}", cx.tid, it * cx.threads));
    b.op(format!("div.u32 {row}, {i}, {d8}"));
    b.op(format!("rem.u32 {c}, {i}, {d8}"));
    (i, row, c)
}

/// Guards copy `it` when the tile's chunks do not fill every thread's
/// last trip; returns the label to place after the copy.
fn guard(b: &mut Body, cx: &Ctx, i: &str, total: u32) -> Option<String> {
    if total.is_multiple_of(cx.threads) {
        return None;
    }
    let (skip, p) = (b.label("copy_skip"), b.pred());
    b.op(format!("setp.ge.u32 {p}, {i}, {total}"));
    b.op(format!("@{p} bra {skip}"));
    Some(skip)
}

/// Q's 64 rows of the block into shared memory by `cp.async` (zeros past
/// the last row).
fn load_q(b: &mut Body, lay: &PrefillLayout, cx: &Ctx, a: &Args, hq: &str) {
    let d8 = lay.d / 8;
    let total = lay.rows() * d8;
    for it in 0..total.div_ceil(cx.threads) {
        let (i, row, c) = chunk_of(b, cx, it, d8);
        let skip = guard(b, cx, &i, total);
        let (r, valid, tok, head) = (b.r(), b.pred(), b.r(), b.r());
        b.op(format!("add.s32 {r}, {}, {row}", cx.r0));
        b.op(format!("setp.lt.s32 {valid}, {r}, {}", cx.rows));
        b.op(format!("selp.b32 {r}, {r}, 0, {valid}"));
        b.op(format!("div.u32 {tok}, {r}, {}", cx.group));
        b.op(format!("rem.u32 {head}, {r}, {}", cx.group));
        b.op(format!(
            "mad.lo.s32 {head}, {}, {}, {head}",
            cx.kv, cx.group
        ));
        let (qrow, idx) = (b.r(), b.r());
        b.op(format!("mad.lo.s32 {qrow}, {tok}, {hq}, {head}"));
        b.op(format!("mul.lo.s32 {idx}, {qrow}, {}", lay.d));
        b.op(format!("mad.lo.s32 {idx}, {c}, 8, {idx}"));
        copy_chunk(b, lay, cx, &row, &c, a.get("q"), &idx, &valid, "0");
        if let Some(s) = skip {
            b.place(&s);
        }
    }
}

/// One 16-byte `cp.async` of halves `idx ..` of `src` to row `row`, chunk
/// `c` of the tile at `tile` (zero-filled where `valid` is false).
#[allow(clippy::too_many_arguments)]
fn copy_chunk(
    b: &mut Body,
    lay: &PrefillLayout,
    cx: &Ctx,
    row: &str,
    c: &str,
    src: &str,
    idx: &str,
    valid: &str,
    tile: &str,
) {
    let (dst, bytes, off64, from) = (b.r(), b.r(), b.rd(), b.rd());
    b.op(format!("mad.lo.s32 {dst}, {row}, {}, {tile}", lay.stride));
    b.op(format!("mad.lo.s32 {dst}, {c}, 16, {dst}"));
    if tile == "0" {
        b.op(format!("add.s32 {dst}, {dst}, {}", cx.smem));
    }
    b.op(format!("selp.b32 {bytes}, 16, 0, {valid}"));
    b.op(format!("mul.wide.u32 {off64}, {idx}, 2"));
    b.op(format!("add.s64 {from}, {src}, {off64}"));
    b.op(format!(
        "cp.async.cg.shared.global [{dst}], [{from}], 16, {bytes}"
    ));
}

/// Key `j0 + row` of this block: its cache row `key·kvh + kv` (row 0 past
/// the block's key end, where `valid` is false).
fn key_row(b: &mut Body, cx: &Ctx, a: &Args, j0: &str, row: &str) -> (String, String) {
    let (key, valid, grow) = (b.r(), b.pred(), b.r());
    b.op(format!("add.s32 {key}, {j0}, {row}"));
    b.op(format!("setp.lt.s32 {valid}, {key}, {}", cx.kend));
    b.op(format!("selp.b32 {key}, {key}, 0, {valid}"));
    b.op(format!(
        "mad.lo.s32 {grow}, {key}, {}, {}",
        a.get("kvh"),
        cx.kv
    ));
    (grow, valid)
}

/// The f16 sides of keys `j0 .. j0 + keys` into the stage at shared
/// address `base` by `cp.async` (zeros from the block's key end on).
fn issue_direct(
    b: &mut Body,
    plan: &PrefillPlan,
    lay: &PrefillLayout,
    cx: &Ctx,
    a: &Args,
    base: &str,
    j0: &str,
) {
    let sides: Vec<(&str, u32)> = [("k", plan.k, 0), ("v", plan.v, lay.keys * lay.stride)]
        .into_iter()
        .filter(|&(_, f, _)| f == KvFormat::F16)
        .map(|(n, _, off)| (n, off))
        .collect();
    if sides.is_empty() {
        return;
    }
    let d8 = lay.d / 8;
    let total = lay.keys * d8;
    b.comment(format!(
        "f16 K/V block: {} keys x {d8} chunks of 8 halves.",
        lay.keys
    ));
    for it in 0..total.div_ceil(cx.threads) {
        let (i, row, c) = chunk_of(b, cx, it, d8);
        let skip = guard(b, cx, &i, total);
        let (grow, valid) = key_row(b, cx, a, j0, &row);
        let idx = b.r();
        b.op(format!("mul.lo.s32 {idx}, {grow}, {}", lay.d));
        b.op(format!("mad.lo.s32 {idx}, {c}, 8, {idx}"));
        for &(name, off) in &sides {
            let tile = b.r();
            b.op(format!("add.s32 {tile}, {base}, {off}"));
            copy_chunk(b, lay, cx, &row, &c, a.get(name), &idx, &valid, &tile);
        }
        if let Some(s) = skip {
            b.place(&s);
        }
    }
}

/// The quantized sides' raw bytes of keys `j0 .. j0 + keys` into the
/// staging buffer at `raw` by `cp.async` (zeros from the block's key end
/// on: they decode to finite values).
fn issue_raw(b: &mut Body, lay: &PrefillLayout, cx: &Ctx, a: &Args, raw: &str, j0: &str) {
    let d16 = lay.d / 16;
    let total = lay.keys * d16;
    let sides: Vec<(&str, u32)> = [("k", lay.raw_k), ("v", lay.raw_v)]
        .into_iter()
        .filter_map(|(n, off)| off.map(|o| (n, o)))
        .collect();
    for it in 0..total.div_ceil(cx.threads) {
        let (i, row, c) = chunk_of(b, cx, it, d16);
        let skip = guard(b, cx, &i, total);
        let (grow, valid) = key_row(b, cx, a, j0, &row);
        let (src_off, bytes) = (b.r(), b.r());
        b.op(format!("mul.lo.s32 {src_off}, {grow}, {}", lay.d));
        b.op(format!("mad.lo.s32 {src_off}, {c}, 16, {src_off}"));
        b.op(format!("selp.b32 {bytes}, 16, 0, {valid}"));
        let off64 = b.rd();
        b.op(format!("cvt.u64.u32 {off64}, {src_off}"));
        for &(name, at) in &sides {
            let (dst, src) = (b.r(), b.rd());
            b.op(format!("mad.lo.s32 {dst}, {row}, {}, {raw}", lay.d));
            b.op(format!("mad.lo.s32 {dst}, {c}, 16, {dst}"));
            b.op(format!("add.s32 {dst}, {dst}, {at}"));
            b.op(format!("add.s64 {src}, {}, {off64}", a.get(name)));
            b.op(format!(
                "cp.async.cg.shared.global [{dst}], [{src}], 16, {bytes}"
            ));
        }
        if let Some(s) = skip {
            b.place(&s);
        }
    }
    if let Some(at) = lay.raw_params {
        // Scale then offset of each key row: 2·keys 4-byte copies.
        let total = 2 * lay.keys;
        for it in 0..total.div_ceil(cx.threads) {
            let i = b.r();
            b.op(format!("add.s32 {i}, {}, {}", cx.tid, it * cx.threads));
            let skip = guard(b, cx, &i, total);
            let (row, which) = (b.r(), b.r());
            b.op(format!("shr.u32 {row}, {i}, 1"));
            b.op(format!("and.b32 {which}, {i}, 1"));
            let (grow, valid) = key_row(b, cx, a, j0, &row);
            let (bytes, dst, o64, src, alt) = (b.r(), b.r(), b.rd(), b.rd(), b.pred());
            b.op(format!("selp.b32 {bytes}, 4, 0, {valid}"));
            b.op(format!(
                "mad.lo.s32 {dst}, {which}, {}, {raw}",
                4 * lay.keys
            ));
            b.op(format!("mad.lo.s32 {dst}, {row}, 4, {dst}"));
            b.op(format!("add.s32 {dst}, {dst}, {at}"));
            b.op(format!("mul.wide.u32 {o64}, {grow}, 4"));
            b.op(format!("setp.ne.s32 {alt}, {which}, 0"));
            b.op(format!("add.s64 {src}, {}, {o64}", a.get("k_scales")));
            b.op(format!(
                "@{alt} add.s64 {src}, {}, {o64}",
                a.get("k_offsets")
            ));
            b.op(format!(
                "cp.async.ca.shared.global [{dst}], [{src}], 4, {bytes}"
            ));
            if let Some(s) = skip {
                b.place(&s);
            }
        }
    }
}

/// The quantized sides of the staging buffer at `raw` decoded to f16 into
/// the stage at `base`: int8 keys as `scale·q + offset` of their row, fp8
/// values exactly. `magic` holds 0x4B000000 (the int8 decode's).
#[allow(clippy::too_many_arguments)]
fn convert(
    b: &mut Body,
    plan: &PrefillPlan,
    lay: &PrefillLayout,
    sm: Sm,
    cx: &Ctx,
    raw: &str,
    base: &str,
    magic: &str,
) {
    let d8 = lay.d / 8;
    let total = lay.keys * d8;
    let sides = [
        (plan.k, lay.raw_k, 0),
        (plan.v, lay.raw_v, lay.keys * lay.stride),
    ];
    for it in 0..total.div_ceil(cx.threads) {
        let (i, row, c) = chunk_of(b, cx, it, d8);
        let skip = guard(b, cx, &i, total);
        for (format, raw_at, tile_off) in sides {
            let Some(at) = raw_at else { continue };
            let src = b.r();
            b.op(format!("mad.lo.s32 {src}, {row}, {}, {raw}", lay.d));
            b.op(format!("mad.lo.s32 {src}, {c}, 8, {src}"));
            let words = [b.r(), b.r()];
            b.op(format!(
                "ld.shared.v2.b32 {{{}, {}}}, [{src}+{at}]",
                words[0], words[1]
            ));
            let mut vals = vec_values(b, format, sm, &words, magic);
            if format == KvFormat::I8AsymRow {
                let p = lay
                    .raw_params
                    .expect("int8 keys stage their row parameters");
                let (pa, sc, of) = (b.r(), b.f(), b.f());
                b.op(format!("mad.lo.s32 {pa}, {row}, 4, {raw}"));
                b.op(format!("ld.shared.f32 {sc}, [{pa}+{p}]"));
                b.op(format!("ld.shared.f32 {of}, [{pa}+{}]", p + 4 * lay.keys));
                for v in vals.iter_mut() {
                    b.op(format!("fma.rn.f32 {v}, {v}, {sc}, {of}"));
                }
            }
            let packed: Vec<String> = vals
                .chunks(2)
                .map(|pair| {
                    let w = b.r();
                    b.op(format!("cvt.rn.f16x2.f32 {w}, {}, {}", pair[1], pair[0]));
                    w
                })
                .collect();
            let dst = b.r();
            b.op(format!("mad.lo.s32 {dst}, {row}, {}, {base}", lay.stride));
            b.op(format!("mad.lo.s32 {dst}, {c}, 16, {dst}"));
            b.op(format!(
                "st.shared.v4.b32 [{dst}+{tile_off}], {{{}}}",
                packed.join(", ")
            ));
        }
        if let Some(s) = skip {
            b.place(&s);
        }
    }
}
