//! Decode attention as PTX for an [`AttentionPlan`] (FlashDecoding++
//! section 3: split-K with the unified-max softmax), printed with warp
//! instructions.
//!
//! # Partial kernel (`<name>_partial`)
//!
//! Grid `(splits, kv_heads)`, block `wg` threads (the plan's: 128 threads,
//! 256 keys per split). Block `(split, g)` owns keys `s0 =
//! split·keys_per_split .. s0 + n` of KV head `g` and serves every query
//! head of its GQA group in turn. Per head:
//!
//! 1. Scores, in fp32 (`fma.rn.f32`). Where rows are whole 8-element
//!    vectors one warp covers (`d % 8 == 0`, `d <= 256`), a key row per
//!    group of `T` lanes (`T` the power of two at or above `d / 8`): lane
//!    `c` holds q's vector `c` in registers and reads vector `c` of each
//!    key, a warp reads whole rows, and the group's partial dots meet by
//!    `shfl.sync.bfly`. A trip's keys are copied to shared memory with
//!    `cp.async` and read back after one wait: as plain loads, ptxas sank
//!    each next to its use and kept one in flight (45–57% of the H200's
//!    read bandwidth; 67–94% staged). Otherwise a key per thread, element
//!    by element. The score goes to shared `p[i]`; every thread keeps its
//!    max and whether a score left `[phi + lo, phi + hi]` (or is NaN).
//! 2. The block agrees on the verdict: `shfl.sync.bfly` max and
//!    `vote.sync.any` within each warp, the warps' results through shared
//!    memory. In range (the common case) `m = phi`, the unified max: no
//!    split waits on another. Otherwise the split recomputes with its own
//!    max `m` (the synchronized scheme).
//! 3. `p[i] = 2^((x − m)·log2 e)` (`ex2.approx`, the exponent prescaled by
//!    log2 e), and `Σ p` by shuffles and shared memory.
//! 4. `o[j] = Σ_i p[i]·v[i][j]`: where rows are whole vectors and `d <=
//!    8·wg`, thread `tid` takes column vector `tid % (d/8)` (a 16-byte load
//!    of 8 f16 values) of keys `slot, slot + slots, ...` ([`Depth`] keys per
//!    trip, loads first) and the slots' sums meet in shared memory;
//!    otherwise threads over `j`, a value per load. Thread 0 writes the
//!    split's `m`, `Σ p` and recompute flag.
//!
//! # Combine kernel (`<name>_combine`)
//!
//! Grid `(ceil(d / 32), heads)`, block `(32, 1, Z)`: thread `(x, z)` folds
//! splits `z, z + Z, ...` of element `j` in one pass (a running max `M`,
//! and `num`, `den` rescaled when it rises, 8 splits per trip with their
//! loads first), then warp 0 folds the `Z` warps' results: `o = Σ_j
//! 2^((m_j − M)·log2 e)·o_j / Σ_j 2^((m_j − M)·log2 e)·l_j`, rounded to
//! f16. With unified maxima every factor is exactly 1.
//!
//! # Cache formats, dequantized in registers
//!
//! | format | per element |
//! |---|---|
//! | f16 | `cvt.f32.f16` |
//! | i8asym:row keys | bytes XOR 0x80 once per word, `prmt` each under 0x4B000000, `sub` 2^23 + 128; then `score = scale·Σ q·k + offset·Σ q` per row |
//! | fp8 e4m3, sm_80 | bit operations: `shl` the byte to the top, `shr.s32` 4, `and` 0x87F00000 (sign, exponent and mantissa in place), `mul` 2^120 (the bias difference); 0x7F/0xFF become NaN |
//! | fp8 e4m3, sm_90 | `cvt.rn.f16x2.e4m3x2` (sm_89 and later), two bytes per instruction, then `cvt.f32.f16` |
//! | fp8 e5m2 | the byte is an f16's top byte: `shl.b16` 8 (or `prmt` two bytes into an f16 pair), `cvt.f32.f16` |
//!
//! Every conversion is exact: every e4m3 and e5m2 value (subnormals,
//! infinities and NaNs included) is an f16 and an f32.

use super::writer::{Body, f32_lit};
use super::{Args, Limits, Sm, entry_text, preamble};
use crate::artifact::EmitError;
use crate::gpu::{AttentionPlan, KvFormat, LaunchExtent};

/// The register budget the attention kernels are held to (`.maxnreg`):
/// the target's, as for the matmuls.
pub fn register_budget(sm: Sm) -> u32 {
    sm.caps().registers
}

/// Elements of d per vector step of the score loop.
const VEC: u32 = 8;

/// Keys per trip of the P·V loop whose value loads are issued together.
const PV_UNROLL: u32 = 8;

/// Vector steps per trip of the score loop whose loads are issued together.
const QK_UNROLL: u32 = 4;

/// How deep the partial kernel's vector loops go: what a trip issues
/// before its first use. Every depth computes the same sums in the same
/// order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Depth {
    /// Key steps per trip of the vector score loop.
    pub score: u32,
    /// Keys per trip of the vector P·V loop.
    pub values: u32,
}

impl Depth {
    /// The depth [`print()`] emits.
    /// (H200, `cuda_bench attention-plans`: 16 value keys a trip took
    /// ctx 4096 from 23.3 to 22.3 µs and 32768 from 133.2 to 129.9 µs; 16
    /// score steps did less.)
    pub const DEFAULT: Depth = Depth {
        score: 8,
        values: 16,
    };
}

/// Splits per trip of the combine loop whose loads are issued together.
const COMBINE_UNROLL: u32 = 8;

fn unsupported(what: String) -> EmitError {
    EmitError::Unsupported {
        backend: "ptx",
        what,
    }
}

/// Shared-memory arrays of the partial kernel, named after its entry.
struct Shared {
    p: String,
    k_stage: String,
    red_pv: String,
    red_max: String,
    red_out: String,
    red_sum: String,
}

/// Shared-memory arrays of the combine kernel: each warp's running max,
/// denominator and numerator per lane.
struct CombineShared {
    m: String,
    l: String,
    o: String,
}

/// Both entries in one module.
pub fn print(plan: &AttentionPlan, sm: Sm, header: &str) -> Result<String, EmitError> {
    print_at(plan, sm, header, Depth::DEFAULT, register_budget(sm))
}

/// [`print()`] at another [`Depth`] and register limit (`.maxnreg`), for
/// measuring one against another.
pub fn print_at(
    plan: &AttentionPlan,
    sm: Sm,
    header: &str,
    depth: Depth,
    max_registers: u32,
) -> Result<String, EmitError> {
    if depth.score == 0 || depth.values == 0 {
        return Err(unsupported(format!("a loop depth of zero ({depth:?})")));
    }
    let warp = sm.caps().gpu.map_or(32, |g| g.warp_width);
    if plan.wg == 0 || !plan.wg.is_multiple_of(warp) {
        return Err(unsupported(format!(
            "a work group of {} threads (the PTX reductions take whole warps of {warp})",
            plan.wg
        )));
    }
    if plan.keys_per_split == 0 {
        return Err(unsupported("zero keys per split".to_string()));
    }
    if plan.combine_launch[0].local != warp || plan.combine_launch[0].per_group != warp {
        return Err(unsupported(format!(
            "a combine block of {} threads (one warp of {warp} expected)",
            plan.combine_launch[0].local
        )));
    }
    let combine_warps = plan.combine_launch[2].local;
    if combine_warps == 0 || plan.combine_launch[2].extent != LaunchExtent::One {
        return Err(unsupported(format!(
            "a combine launch of {combine_warps} warps over {:?} in z (one block of warps expected)",
            plan.combine_launch[2].extent
        )));
    }
    let warps = plan.wg / warp;
    let e = &plan.partial_entry;
    let sh = Shared {
        p: format!("{e}_p"),
        k_stage: format!("{e}_k_stage"),
        red_pv: format!("{e}_red_pv"),
        red_max: format!("{e}_red_max"),
        red_out: format!("{e}_red_out"),
        red_sum: format!("{e}_red_sum"),
    };
    let decls = vec![
        format!(".shared .align 16 .f32 {}[{}];", sh.p, plan.keys_per_split),
        format!(".shared .align 16 .f32 {}[{}];", sh.red_pv, VEC * plan.wg),
        format!(
            ".shared .align 16 .u32 {}[{}];",
            sh.k_stage,
            depth.score * plan.wg * VEC * elem_bytes(plan.k) / 4
        ),
        format!(".shared .align 4 .f32 {}[{warps}];", sh.red_max),
        format!(".shared .align 4 .u32 {}[{warps}];", sh.red_out),
        format!(".shared .align 4 .f32 {}[{warps}];", sh.red_sum),
    ];
    let c = &plan.combine_entry;
    let csh = CombineShared {
        m: format!("{c}_m"),
        l: format!("{c}_l"),
        o: format!("{c}_o"),
    };
    let mut decls = decls;
    if combine_warps > 1 {
        for name in [&csh.m, &csh.l, &csh.o] {
            decls.push(format!(
                ".shared .align 4 .f32 {name}[{}];",
                combine_warps * warp
            ));
        }
    }
    let maxnreg = max_registers;
    let mut s = preamble(sm, header, &decls);
    s.push_str(&entry_text(
        &plan.partial_entry,
        &plan.partial_args,
        Limits {
            reqntid: plan.partial_launch.map(|d| d.local),
            maxnreg,
        },
        partial(plan, sm, &sh, warp, depth),
    ));
    s.push('\n');
    s.push_str(&entry_text(
        &plan.combine_entry,
        &plan.combine_args,
        Limits {
            reqntid: plan.combine_launch.map(|d| d.local),
            maxnreg,
        },
        combine(plan, warp, &csh),
    ));
    Ok(s)
}

/// Bytes per cached element.
fn elem_bytes(f: KvFormat) -> u32 {
    match f {
        KvFormat::F16 => 2,
        KvFormat::I8AsymRow | KvFormat::Fp8E4M3 | KvFormat::Fp8E5M2 => 1,
    }
}

/// `base + index·scale` as a 64-bit address.
fn addr(b: &mut Body, base: &str, index: &str, scale: u32) -> String {
    let (off, a) = (b.rd(), b.rd());
    b.op(format!("mul.wide.s32 {off}, {index}, {scale}"));
    b.op(format!("add.s64 {a}, {base}, {off}"));
    a
}

/// A shared array's address plus `index·4`.
fn shared_at(b: &mut Body, base: &str, index: &str) -> String {
    let a = b.r();
    b.op(format!("mad.lo.s32 {a}, {index}, 4, {base}"));
    a
}

/// The f32 of byte `k` of `word`, an fp8 e4m3 code, with bit operations
/// (sm_80 has no fp8 conversion).
fn e4m3_bits(b: &mut Body, word: &str, k: u32) -> String {
    // The byte at bits 31..24: s eeee mmm.
    let top = if k == 3 {
        word.to_string()
    } else {
        let t = b.r();
        b.op(format!("shl.b32 {t}, {word}, {}", 24 - 8 * k));
        t
    };
    // Arithmetic shift by 4: s at bit 31, eeee mmm at bits 26..20, an f32's
    // exponent low bits and mantissa top; the mask drops the sign copies.
    let (y, f) = (b.r(), b.f());
    b.op(format!("shr.s32 {y}, {top}, 4"));
    b.op(format!("and.b32 {y}, {y}, 0x87F00000"));
    b.op(format!("mov.b32 {f}, {y}"));
    // Bias 7 against 127: times 2^120 (exact, subnormals included).
    b.op(format!("mul.f32 {f}, {f}, {}", f32_lit(2f32.powi(120))));
    let (mag, nan) = (b.r(), b.pred());
    b.op(format!("and.b32 {mag}, {top}, 0x7F000000"));
    b.op(format!("setp.eq.u32 {nan}, {mag}, 0x7F000000"));
    b.op(format!("@{nan} mov.f32 {f}, 0f7FFFFFFF"));
    f
}

/// The two f32 of an fp8 e4m3 pair (low byte first) in a 16-bit register,
/// by the sm_89+ conversion.
fn e4m3_pair_cvt(b: &mut Body, pair: &str) -> [String; 2] {
    let (x2, h0, h1, f0, f1) = (b.r(), b.h(), b.h(), b.f(), b.f());
    b.op(format!("cvt.rn.f16x2.e4m3x2 {x2}, {pair}"));
    b.op(format!("mov.b32 {{{h0}, {h1}}}, {x2}"));
    b.op(format!("cvt.f32.f16 {f0}, {h0}"));
    b.op(format!("cvt.f32.f16 {f1}, {h1}"));
    [f0, f1]
}

/// The f32 values of one element at `a` of a cache in `format`.
fn load_one(b: &mut Body, format: KvFormat, sm: Sm, a: &str) -> String {
    match format {
        KvFormat::F16 => {
            let (h, f) = (b.h(), b.f());
            b.op(format!("ld.global.nc.u16 {h}, [{a}]"));
            b.op(format!("cvt.f32.f16 {f}, {h}"));
            f
        }
        KvFormat::I8AsymRow => {
            let (i, f) = (b.r(), b.f());
            b.op(format!("ld.global.nc.s8 {i}, [{a}]"));
            b.op(format!("cvt.rn.f32.s32 {f}, {i}"));
            f
        }
        KvFormat::Fp8E5M2 => {
            // The byte is an f16's top byte: shift it there, convert.
            let (h, f) = (b.h(), b.f());
            b.op(format!("ld.global.nc.u8 {h}, [{a}]"));
            b.op(format!("shl.b16 {h}, {h}, 8"));
            b.op(format!("cvt.f32.f16 {f}, {h}"));
            f
        }
        KvFormat::Fp8E4M3 => match sm {
            Sm::Sm80 => {
                let w = b.r();
                b.op(format!("ld.global.nc.u8 {w}, [{a}]"));
                e4m3_bits(b, &w, 0)
            }
            Sm::Sm90 => {
                let h = b.h();
                b.op(format!("ld.global.nc.u8 {h}, [{a}]"));
                let [f, _] = e4m3_pair_cvt(b, &h);
                f
            }
        },
    }
}

/// The raw words of one vector step (8 elements) at `a` (16-byte aligned
/// for f16, 8-byte for bytes), loaded and not yet converted, so a trip can
/// issue all its loads before the first conversion waits on one.
pub(super) fn load_vec_words(b: &mut Body, format: KvFormat, a: &str) -> Vec<String> {
    let words = 8 * elem_bytes(format) / 4;
    let w: Vec<String> = (0..words).map(|_| b.r()).collect();
    b.op(format!(
        "ld.global.nc.v{words}.u32 {{{}}}, [{a}]",
        w.join(", ")
    ));
    w
}

/// The 8 f32 values of one vector step from its words
/// ([`load_vec_words`]). `magic` holds 0x4B000000 for int8 keys.
pub(super) fn vec_values(
    b: &mut Body,
    format: KvFormat,
    sm: Sm,
    w: &[String],
    magic: &str,
) -> Vec<String> {
    let mut out = Vec::new();
    match format {
        KvFormat::F16 => {
            for word in w {
                out.extend(halves_f32(b, word));
            }
        }
        KvFormat::I8AsymRow => {
            for word in w {
                // b ^ 0x80 = b + 128 as an unsigned byte: under 2^23's
                // exponent the float is 2^23 + 128 + b, exactly.
                let flipped = b.r();
                b.op(format!("xor.b32 {flipped}, {word}, 0x80808080"));
                for k in 0..4u32 {
                    let (bits, f) = (b.r(), b.f());
                    b.op(format!(
                        "prmt.b32 {bits}, {flipped}, {magic}, {:#06x}",
                        0x7540 | k
                    ));
                    b.op(format!("mov.b32 {f}, {bits}"));
                    b.op(format!("sub.f32 {f}, {f}, {}", f32_lit(8_388_736.0)));
                    out.push(f);
                }
            }
        }
        KvFormat::Fp8E5M2 => {
            for word in w {
                // Bytes (0, 1) and (2, 3) to the top bytes of two halves.
                for sel in [0x1404u32, 0x3424] {
                    let pair = b.r();
                    b.op(format!("prmt.b32 {pair}, {word}, 0, {sel:#06x}"));
                    out.extend(halves_f32(b, &pair));
                }
            }
        }
        KvFormat::Fp8E4M3 => {
            for word in w {
                match sm {
                    Sm::Sm80 => {
                        for k in 0..4 {
                            out.push(e4m3_bits(b, word, k));
                        }
                    }
                    Sm::Sm90 => {
                        let (lo, hi) = (b.h(), b.h());
                        b.op(format!("mov.b32 {{{lo}, {hi}}}, {word}"));
                        out.extend(e4m3_pair_cvt(b, &lo));
                        out.extend(e4m3_pair_cvt(b, &hi));
                    }
                }
            }
        }
    }
    out
}

/// The two halves of a 32-bit word as f32, low first.
fn halves_f32(b: &mut Body, word: &str) -> [String; 2] {
    let (h0, h1, f0, f1) = (b.h(), b.h(), b.f(), b.f());
    b.op(format!("mov.b32 {{{h0}, {h1}}}, {word}"));
    b.op(format!("cvt.f32.f16 {f0}, {h0}"));
    b.op(format!("cvt.f32.f16 {f1}, {h1}"));
    [f0, f1]
}

/// Butterfly over the warp: every lane ends with `op` of all 32.
fn warp_reduce(b: &mut Body, op: &str, v: &str, warp: u32) {
    let mut off = warp / 2;
    while off > 0 {
        let t = b.f();
        b.op(format!(
            "shfl.sync.bfly.b32 {t}, {v}, {off}, 31, 0xffffffff"
        ));
        b.op(format!("{op} {v}, {v}, {t}"));
        off /= 2;
    }
}

fn partial(plan: &AttentionPlan, sm: Sm, sh: &Shared, warp: u32, depth: Depth) -> Body {
    let (wg, kps) = (plan.wg, plan.keys_per_split);
    let warps = wg / warp;
    let int8_keys = plan.k == KvFormat::I8AsymRow;
    let mut b = Body::new();
    let a = Args::load(&mut b, &plan.partial_entry, &plan.partial_args);
    let [hq, kvh, d, s] = ["hq", "kvh", "d", "s"].map(|n| a.get(n).to_string());

    b.comment("Block (split, g): keys s0 .. s0 + n of KV head g; thread tid.");
    let (tid, split, g, lane, wid) = (b.r(), b.r(), b.r(), b.r(), b.r());
    b.op(format!("mov.u32 {tid}, %tid.x"));
    b.op(format!("mov.u32 {split}, %ctaid.x"));
    b.op(format!("mov.u32 {g}, %ctaid.y"));
    b.op(format!("and.b32 {lane}, {tid}, {}", warp - 1));
    b.op(format!("shr.u32 {wid}, {tid}, {}", warp.ilog2()));
    let (s0, n, group) = (b.r(), b.r(), b.r());
    b.op(format!("mul.lo.s32 {s0}, {split}, {kps}"));
    b.op(format!("sub.s32 {n}, {s}, {s0}"));
    b.op(format!("min.s32 {n}, {n}, {kps}"));
    b.op(format!("div.s32 {group}, {hq}, {kvh}"));
    b.comment("Elements from one token's row of head g to the next token's.");
    let kvd = b.r();
    b.op(format!("mul.lo.s32 {kvd}, {kvh}, {d}"));
    b.comment("Rows are 16-byte aligned (vector steps) only when d % 8 == 0.");
    let (d7, vec_end, aligned) = (b.r(), b.r(), b.pred());
    b.op(format!("and.b32 {d7}, {d}, {}", VEC - 1));
    b.op(format!("setp.eq.s32 {aligned}, {d7}, 0"));
    b.op(format!("selp.b32 {vec_end}, {d}, 0, {aligned}"));
    let [p_base, max_base, out_base, sum_base] = [&sh.p, &sh.red_max, &sh.red_out, &sh.red_sum]
        .map(|name| {
            let r = b.r();
            b.op(format!("mov.u32 {r}, {name}"));
            r
        });
    let scale = if plan.q_prescaled {
        None
    } else {
        b.comment("q is not prescaled: scores times 1/sqrt(d).");
        let f = b.f();
        b.op(format!("cvt.rn.f32.s32 {f}, {d}"));
        b.op(format!("sqrt.rn.f32 {f}, {f}"));
        b.op(format!("rcp.rn.f32 {f}, {f}"));
        Some(f)
    };
    let magic = if int8_keys {
        b.imm(0x4B00_0000)
    } else {
        String::new()
    };
    let log2e = f32_lit(std::f32::consts::LOG2_E);

    b.comment("Every query head of KV head g's GQA group, one after another.");
    let hh = b.r();
    b.op(format!("mov.u32 {hh}, 0"));
    let head_top = b.label("head");
    let head_end = b.label("head_end");
    b.place(&head_top);
    let pdone = b.pred();
    b.op(format!("setp.ge.s32 {pdone}, {hh}, {group}"));
    b.op(format!("@{pdone} bra.uni {head_end}"));
    let head = b.r();
    b.op(format!("mad.lo.s32 {head}, {g}, {group}, {hh}"));
    let qoff = b.r();
    b.op(format!("mul.lo.s32 {qoff}, {head}, {d}"));
    let qr = addr(&mut b, a.get("q"), &qoff, 2);
    let (mx, out) = (b.f(), b.r());
    b.op(format!("mov.f32 {mx}, 0fFF800000"));
    b.op(format!("mov.u32 {out}, 0"));

    let split_state = Split {
        plan,
        sm,
        a: &a,
        tid: &tid,
        d: &d,
        n: &n,
        s0: &s0,
        kvh: &kvh,
        g: &g,
        kvd: &kvd,
        p_base: &p_base,
        aligned: &aligned,
    };

    // 1. Scores.
    let key_end = b.label("key_end");
    let scalar_scores = b.label("scores_scalar");
    vector_scores(
        &mut b,
        &VectorScores {
            split: &split_state,
            qr: &qr,
            scale: scale.as_deref(),
            magic: &magic,
            mx: &mx,
            out: &out,
            warp,
            unroll: depth.score,
            stage: &sh.k_stage,
        },
        &scalar_scores,
        &key_end,
    );
    b.place(&scalar_scores);
    b.comment("Scalar scores (rows not in 8-element vectors, or d > 8*warp): thread per key.");
    let i = b.r();
    b.op(format!("mov.u32 {i}, {tid}"));
    let key_top = b.label("key");
    b.place(&key_top);
    let pk = b.pred();
    b.op(format!("setp.ge.s32 {pk}, {i}, {n}"));
    b.op(format!("@{pk} bra {key_end}"));
    let row = b.r();
    b.op(format!("add.s32 {row}, {s0}, {i}"));
    b.op(format!("mad.lo.s32 {row}, {row}, {kvh}, {g}"));
    let koff = b.r();
    b.op(format!("mul.lo.s32 {koff}, {row}, {d}"));
    let kr = addr(&mut b, a.get("k"), &koff, elem_bytes(plan.k));
    let (x, qsum) = (b.f(), b.f());
    b.op(format!("mov.f32 {x}, 0f00000000"));
    if int8_keys {
        b.op(format!("mov.f32 {qsum}, 0f00000000"));
    }
    let j = b.r();
    b.op(format!("mov.u32 {j}, 0"));
    // One vector step at element `js`: its loads, then its FMAs.
    let load_step = |b: &mut Body, js: &str| {
        let qa = addr(b, &qr, js, 2);
        let ka = addr(b, &kr, js, elem_bytes(plan.k));
        let qw: Vec<String> = (0..4).map(|_| b.r()).collect();
        b.op(format!("ld.global.nc.v4.u32 {{{}}}, [{qa}]", qw.join(", ")));
        let kw = load_vec_words(b, plan.k, &ka);
        (qw, kw)
    };
    let fma_step = |b: &mut Body, qw: &[String], kw: &[String]| {
        let kv = vec_values(b, plan.k, sm, kw, &magic);
        for (t, word) in qw.iter().enumerate() {
            let qf = halves_f32(b, word);
            for (u, qe) in qf.iter().enumerate() {
                b.op(format!("fma.rn.f32 {x}, {qe}, {}, {x}", kv[2 * t + u]));
                if int8_keys {
                    b.op(format!("add.f32 {qsum}, {qsum}, {qe}"));
                }
            }
        }
    };
    // QK_UNROLL vector steps per trip in one straight block (every load
    // issued before the first FMA needs it), then single steps; the FMAs
    // keep the element order, so the score is the single-step loop's.
    let wide_top = b.label("qk_vecs");
    let wide_done = b.label("qk_vecs_end");
    b.place(&wide_top);
    let (wide_last, wide_past) = (b.r(), b.pred());
    b.op(format!("add.s32 {wide_last}, {j}, {}", QK_UNROLL * VEC));
    b.op(format!("setp.gt.s32 {wide_past}, {wide_last}, {vec_end}"));
    b.op(format!("@{wide_past} bra {wide_done}"));
    let mut steps = Vec::new();
    for step in 0..QK_UNROLL {
        let js = b.r();
        b.op(format!("add.s32 {js}, {j}, {}", step * VEC));
        steps.push(load_step(&mut b, &js));
    }
    for (qw, kv) in &steps {
        fma_step(&mut b, qw, kv);
    }
    b.op(format!("mov.u32 {j}, {wide_last}"));
    b.op(format!("bra {wide_top}"));
    b.place(&wide_done);
    // Vector steps.
    let vec_top = b.label("qk_vec");
    let vec_done = b.label("qk_vec_end");
    b.place(&vec_top);
    let pv = b.pred();
    b.op(format!("setp.ge.s32 {pv}, {j}, {vec_end}"));
    b.op(format!("@{pv} bra {vec_done}"));
    let (qw, kv) = load_step(&mut b, &j);
    fma_step(&mut b, &qw, &kv);
    b.op(format!("add.s32 {j}, {j}, {VEC}"));
    b.op(format!("bra {vec_top}"));
    b.place(&vec_done);
    // Element by element (unaligned rows, and the tail).
    let one_top = b.label("qk_one");
    let one_done = b.label("qk_one_end");
    b.place(&one_top);
    let po = b.pred();
    b.op(format!("setp.ge.s32 {po}, {j}, {d}"));
    b.op(format!("@{po} bra {one_done}"));
    let qa1 = addr(&mut b, &qr, &j, 2);
    let ka1 = addr(&mut b, &kr, &j, elem_bytes(plan.k));
    let (qh, qe) = (b.h(), b.f());
    b.op(format!("ld.global.nc.u16 {qh}, [{qa1}]"));
    b.op(format!("cvt.f32.f16 {qe}, {qh}"));
    let ke = load_one(&mut b, plan.k, sm, &ka1);
    b.op(format!("fma.rn.f32 {x}, {qe}, {ke}, {x}"));
    if int8_keys {
        b.op(format!("add.f32 {qsum}, {qsum}, {qe}"));
    }
    b.op(format!("add.s32 {j}, {j}, 1"));
    b.op(format!("bra {one_top}"));
    b.place(&one_done);
    if int8_keys {
        b.comment("k = scale*c + offset per row: score = scale*sum(q*c) + offset*sum(q).");
        let sa = addr(&mut b, a.get("k_scales"), &row, 4);
        let oa = addr(&mut b, a.get("k_offsets"), &row, 4);
        let (ks, ko) = (b.f(), b.f());
        b.op(format!("ld.global.nc.f32 {ks}, [{sa}]"));
        b.op(format!("ld.global.nc.f32 {ko}, [{oa}]"));
        b.op(format!("mul.f32 {x}, {ks}, {x}"));
        b.op(format!("fma.rn.f32 {x}, {ko}, {qsum}, {x}"));
    }
    if let Some(sc) = &scale {
        b.op(format!("mul.f32 {x}, {x}, {sc}"));
    }
    let pa = shared_at(&mut b, &p_base, &i);
    b.op(format!("st.shared.f32 [{pa}], {x}"));
    b.comment("Outside [lo, hi] around phi (or NaN): the unified max is unsafe here.");
    let (shifted, inr) = (b.f(), b.pred());
    b.op(format!("sub.f32 {shifted}, {x}, {}", f32_lit(plan.phi)));
    b.op(format!(
        "setp.ge.f32 {inr}, {shifted}, {}",
        f32_lit(plan.lo)
    ));
    b.op(format!(
        "setp.le.and.f32 {inr}, {shifted}, {}, {inr}",
        f32_lit(plan.hi)
    ));
    b.op(format!("@!{inr} mov.u32 {out}, 1"));
    b.op(format!("max.f32 {mx}, {mx}, {x}"));
    b.op(format!("add.s32 {i}, {i}, {wg}"));
    b.op(format!("bra {key_top}"));
    b.place(&key_end);

    // 2. The split's verdict.
    b.comment("Block max and verdict: butterflies within warps, warps via shared memory.");
    warp_reduce(&mut b, "max.f32", &mx, warp);
    let (mine, any) = (b.pred(), b.pred());
    b.op(format!("setp.ne.u32 {mine}, {out}, 0"));
    b.op(format!("vote.sync.any.pred {any}, {mine}, 0xffffffff"));
    let anyr = b.r();
    b.op(format!("selp.u32 {anyr}, 1, 0, {any}"));
    let lead = b.pred();
    b.op(format!("setp.eq.u32 {lead}, {lane}, 0"));
    let (wm, wo) = (
        shared_at(&mut b, &max_base, &wid),
        shared_at(&mut b, &out_base, &wid),
    );
    b.op(format!("@{lead} st.shared.f32 [{wm}], {mx}"));
    b.op(format!("@{lead} st.shared.u32 [{wo}], {anyr}"));
    b.op("bar.sync 0");
    let (m_split, recompute) = (b.f(), b.r());
    b.op(format!("ld.shared.f32 {m_split}, [{max_base}]"));
    b.op(format!("ld.shared.u32 {recompute}, [{out_base}]"));
    for w in 1..warps {
        let (t, o) = (b.f(), b.r());
        b.op(format!("ld.shared.f32 {t}, [{max_base}+{}]", 4 * w));
        b.op(format!("max.f32 {m_split}, {m_split}, {t}"));
        b.op(format!("ld.shared.u32 {o}, [{out_base}+{}]", 4 * w));
        b.op(format!("or.b32 {recompute}, {recompute}, {o}"));
    }
    b.comment("Async: the unified max phi. Recompute: the split's own max.");
    let (prc, m) = (b.pred(), b.f());
    b.op(format!("setp.ne.u32 {prc}, {recompute}, 0"));
    b.op(format!(
        "selp.f32 {m}, {m_split}, {}, {prc}",
        f32_lit(plan.phi)
    ));

    // 3. Exponentials and their sum.
    let lsum = b.f();
    b.op(format!("mov.f32 {lsum}, 0f00000000"));
    b.op(format!("mov.u32 {i}, {tid}"));
    let exp_top = b.label("exp");
    let exp_end = b.label("exp_end");
    b.place(&exp_top);
    let pe = b.pred();
    b.op(format!("setp.ge.s32 {pe}, {i}, {n}"));
    b.op(format!("@{pe} bra {exp_end}"));
    let pa2 = shared_at(&mut b, &p_base, &i);
    let pv2 = b.f();
    b.op(format!("ld.shared.f32 {pv2}, [{pa2}]"));
    b.op(format!("sub.f32 {pv2}, {pv2}, {m}"));
    b.op(format!("mul.f32 {pv2}, {pv2}, {log2e}"));
    b.op(format!("ex2.approx.ftz.f32 {pv2}, {pv2}"));
    b.op(format!("st.shared.f32 [{pa2}], {pv2}"));
    b.op(format!("add.f32 {lsum}, {lsum}, {pv2}"));
    b.op(format!("add.s32 {i}, {i}, {wg}"));
    b.op(format!("bra {exp_top}"));
    b.place(&exp_end);
    warp_reduce(&mut b, "add.f32", &lsum, warp);
    let ws = shared_at(&mut b, &sum_base, &wid);
    b.op(format!("@{lead} st.shared.f32 [{ws}], {lsum}"));
    b.op("bar.sync 0");
    b.op(format!("ld.shared.f32 {lsum}, [{sum_base}]"));
    for w in 1..warps {
        let t = b.f();
        b.op(format!("ld.shared.f32 {t}, [{sum_base}+{}]", 4 * w));
        b.op(format!("add.f32 {lsum}, {lsum}, {t}"));
    }

    // 4. P·V over this split's keys, threads over d.
    let part = b.r();
    b.op(format!("mad.lo.s32 {part}, {split}, {hq}, {head}"));
    let (vrow0, vstride) = (b.r(), b.rd());
    b.op(format!("mad.lo.s32 {vrow0}, {s0}, {kvh}, {g}"));
    b.op(format!("mul.lo.s32 {vrow0}, {vrow0}, {d}"));
    b.op(format!(
        "mul.wide.s32 {vstride}, {kvd}, {}",
        elem_bytes(plan.v)
    ));
    let pod = b.r();
    b.op(format!("mul.lo.s32 {pod}, {part}, {d}"));
    let pv_end = b.label("pv_end");
    let scalar_pv = b.label("pv_scalar");
    vector_pv(
        &mut b,
        &VectorPv {
            split: &split_state,
            red: &sh.red_pv,
            pod: &pod,
            unroll: depth.values,
        },
        &scalar_pv,
        &pv_end,
    );
    b.place(&scalar_pv);
    b.comment("Scalar P*V (rows not in 8-element vectors, or d > 8*wg): thread per element.");
    b.op(format!("mov.u32 {j}, {tid}"));
    let pv_top = b.label("pv");
    b.place(&pv_top);
    let pj = b.pred();
    b.op(format!("setp.ge.s32 {pj}, {j}, {d}"));
    b.op(format!("@{pj} bra {pv_end}"));
    let o = b.f();
    b.op(format!("mov.f32 {o}, 0f00000000"));
    let vidx = b.r();
    b.op(format!("add.s32 {vidx}, {vrow0}, {j}"));
    let va = addr(&mut b, a.get("v"), &vidx, elem_bytes(plan.v));
    let pp = b.r();
    b.op(format!("mov.u32 {pp}, {p_base}"));
    let ii = b.r();
    b.op(format!("mov.u32 {ii}, 0"));
    // PV_UNROLL keys per trip in one straight block, so their value loads
    // are all in flight before the first FMA needs one (a loop of one key
    // per trip waited a memory round trip per key); the FMAs keep the
    // key order, so the sum is the one-key loop's bit for bit.
    let wide_top = b.label("pv_keys");
    let wide_end = b.label("pv_keys_end");
    b.place(&wide_top);
    let (wide_last, wide_past) = (b.r(), b.pred());
    b.op(format!("add.s32 {wide_last}, {ii}, {PV_UNROLL}"));
    b.op(format!("setp.gt.s32 {wide_past}, {wide_last}, {n}"));
    b.op(format!("@{wide_past} bra {wide_end}"));
    let mut terms = Vec::new();
    for k in 0..PV_UNROLL {
        let pval = b.f();
        b.op(format!("ld.shared.f32 {pval}, [{pp}+{}]", 4 * k));
        let ve = load_one(&mut b, plan.v, sm, &va);
        b.op(format!("add.s64 {va}, {va}, {vstride}"));
        terms.push((pval, ve));
    }
    for (pval, ve) in &terms {
        b.op(format!("fma.rn.f32 {o}, {pval}, {ve}, {o}"));
    }
    b.op(format!("add.s32 {pp}, {pp}, {}", 4 * PV_UNROLL));
    b.op(format!("mov.u32 {ii}, {wide_last}"));
    b.op(format!("bra {wide_top}"));
    b.place(&wide_end);
    let in_top = b.label("pv_key");
    let in_end = b.label("pv_key_end");
    b.place(&in_top);
    let pi = b.pred();
    b.op(format!("setp.ge.s32 {pi}, {ii}, {n}"));
    b.op(format!("@{pi} bra {in_end}"));
    let pval = b.f();
    b.op(format!("ld.shared.f32 {pval}, [{pp}]"));
    let ve = load_one(&mut b, plan.v, sm, &va);
    b.op(format!("fma.rn.f32 {o}, {pval}, {ve}, {o}"));
    b.op(format!("add.s64 {va}, {va}, {vstride}"));
    b.op(format!("add.s32 {pp}, {pp}, 4"));
    b.op(format!("add.s32 {ii}, {ii}, 1"));
    b.op(format!("bra {in_top}"));
    b.place(&in_end);
    let oidx = b.r();
    b.op(format!("add.s32 {oidx}, {pod}, {j}"));
    let oa = addr(&mut b, a.get("part_o"), &oidx, 4);
    b.op(format!("st.global.f32 [{oa}], {o}"));
    b.op(format!("add.s32 {j}, {j}, {wg}"));
    b.op(format!("bra {pv_top}"));
    b.place(&pv_end);
    let first = b.pred();
    b.op(format!("setp.eq.u32 {first}, {tid}, 0"));
    let ma = addr(&mut b, a.get("part_m"), &part, 4);
    let la = addr(&mut b, a.get("part_l"), &part, 4);
    let ra = addr(&mut b, a.get("recomputed"), &part, 4);
    b.op(format!("@{first} st.global.f32 [{ma}], {m}"));
    b.op(format!("@{first} st.global.f32 [{la}], {lsum}"));
    b.op(format!("@{first} st.global.u32 [{ra}], {recompute}"));
    b.comment("p and the reductions are reused by the next head.");
    b.op("bar.sync 0");
    b.op(format!("add.s32 {hh}, {hh}, 1"));
    b.op(format!("bra.uni {head_top}"));
    b.place(&head_end);
    b.op("ret");
    b
}

/// One key's loaded vector words, and its row's scale and offset (int8
/// keys).
type KeyLoad = (Vec<String>, Option<(String, String)>);

/// The split a partial block works on, as both vector loops read it.
struct Split<'a> {
    plan: &'a AttentionPlan,
    sm: Sm,
    a: &'a Args,
    tid: &'a str,
    d: &'a str,
    n: &'a str,
    s0: &'a str,
    kvh: &'a str,
    g: &'a str,
    /// Elements from one token's row of head g to the next token's.
    kvd: &'a str,
    p_base: &'a str,
    /// Rows are 16-byte aligned (`d % 8 == 0`).
    aligned: &'a str,
}

impl Split<'_> {
    /// Branch to `scalar` unless rows are whole 8-element vectors, at most
    /// `max_cols` of them (`d % 8 == 0`, `8 <= d <= 8·max_cols`).
    fn require_vectors(&self, b: &mut Body, max_cols: u32, scalar: &str) {
        let ok = b.pred();
        b.op(format!(
            "setp.le.and.s32 {ok}, {}, {}, {}",
            self.d,
            VEC * max_cols,
            self.aligned
        ));
        b.op(format!("setp.ge.and.s32 {ok}, {}, {VEC}, {ok}", self.d));
        b.op(format!("@!{ok} bra {scalar}"));
    }

    /// For key `first` of the split: its cache row `(s0 + first)·kvh + g`,
    /// a pointer into `base` (elements of `eb` bytes) at element `col`
    /// of that row, and the byte step to key `first + keys`.
    fn key_pointer(
        &self,
        b: &mut Body,
        base: &str,
        first: &str,
        col: &str,
        keys: &str,
        eb: u32,
    ) -> (String, String, String) {
        let (row, idx) = (b.r(), b.r());
        b.op(format!("add.s32 {row}, {}, {first}", self.s0));
        b.op(format!("mad.lo.s32 {row}, {row}, {}, {}", self.kvh, self.g));
        b.op(format!("mad.lo.s32 {idx}, {row}, {}, {col}", self.d));
        let ptr = addr(b, base, &idx, eb);
        let (rows, step) = (b.r(), b.rd());
        b.op(format!("mul.lo.s32 {rows}, {}, {keys}", self.kvd));
        b.op(format!("mul.wide.s32 {step}, {rows}, {eb}"));
        (row, ptr, step)
    }
}

/// What the vector scores read beyond the split.
struct VectorScores<'a> {
    split: &'a Split<'a>,
    qr: &'a str,
    scale: Option<&'a str>,
    magic: &'a str,
    mx: &'a str,
    out: &'a str,
    warp: u32,
    unroll: u32,
    stage: &'a str,
}

/// Scores with a key row per group of `T` lanes, where rows are whole
/// 8-element vectors that one warp covers (`d % 8 == 0`, `8 <= d <=
/// 8·warp`); otherwise it branches to `scalar`. `T` is the power of two
/// at or above `cols = d / 8`; lane `c < cols` of a group holds q's vector
/// `c` in registers for the whole split and reads vector `c` of each of
/// its keys (one 16-byte load per 8 f16 keys: a warp reads whole rows),
/// and the group's partial dots meet by butterfly shuffles, so every lane
/// of the group holds the score. The block steps over keys `step·G + grp`
/// (`G = wg / T` groups) in block-uniform trips, `unroll` steps with
/// every load issued first, so all lanes reach every shuffle.
fn vector_scores(b: &mut Body, c: &VectorScores<'_>, scalar: &str, done: &str) {
    let sp = c.split;
    let plan = sp.plan;
    let (wg, eb, warp) = (plan.wg, elem_bytes(plan.k), c.warp);
    let int8_keys = plan.k == KvFormat::I8AsymRow;
    let (d, n) = (sp.d, sp.n);
    sp.require_vectors(b, warp, scalar);
    b.comment("Vector scores: T = 2^ceil(log2(d/8)) lanes per key row.");
    let (cols, log_t, t, lane_t) = (b.r(), b.r(), b.r(), b.r());
    b.op(format!("shr.u32 {cols}, {d}, {}", VEC.ilog2()));
    let cm1 = b.r();
    b.op(format!("sub.u32 {cm1}, {cols}, 1"));
    b.op(format!("clz.b32 {log_t}, {cm1}"));
    b.op(format!("sub.u32 {log_t}, 32, {log_t}"));
    b.op(format!("shl.b32 {t}, 1, {log_t}"));
    let (grp, groups) = (b.r(), b.r());
    b.op(format!("shr.u32 {grp}, {}, {log_t}", sp.tid));
    b.op(format!("sub.u32 {lane_t}, {t}, 1"));
    b.op(format!("and.b32 {lane_t}, {}, {lane_t}", sp.tid));
    b.op(format!("shr.u32 {groups}, {wg}, {log_t}"));
    let (lane_on, writer) = (b.pred(), b.pred());
    b.op(format!("setp.lt.u32 {lane_on}, {lane_t}, {cols}"));
    b.op(format!("setp.eq.u32 {writer}, {lane_t}, 0"));
    // Butterfly rounds within the group: offsets below T.
    let rounds: Vec<(u32, String)> = (0..warp.ilog2())
        .map(|k| {
            let off = warp >> (k + 1);
            let on = b.pred();
            b.op(format!("setp.lt.u32 {on}, {off}, {t}"));
            (off, on)
        })
        .collect();
    // Every lane of a group ends with the group's sum of each of `xs`;
    // each round over every x, so the shuffles' latencies overlap.
    let group_sums = |b: &mut Body, xs: &[String]| {
        for (off, on) in &rounds {
            let ys: Vec<String> = xs
                .iter()
                .map(|x| {
                    let y = b.f();
                    b.op(format!(
                        "shfl.sync.bfly.b32 {y}, {x}, {off}, 31, 0xffffffff"
                    ));
                    y
                })
                .collect();
            for (x, y) in xs.iter().zip(&ys) {
                b.op(format!("@{on} add.f32 {x}, {x}, {y}"));
            }
        }
    };
    b.comment("q's vector c in registers (zero on lanes past the row).");
    let qw: Vec<String> = (0..4).map(|_| b.r()).collect();
    for w in &qw {
        b.op(format!("mov.b32 {w}, 0"));
    }
    let qoff = b.r();
    b.op(format!("shl.b32 {qoff}, {lane_t}, {}", VEC.ilog2()));
    let qa = addr(b, c.qr, &qoff, 2);
    b.op(format!(
        "@{lane_on} ld.global.nc.v4.u32 {{{}}}, [{qa}]",
        qw.join(", ")
    ));
    let qf: Vec<String> = qw.iter().flat_map(|w| halves_f32(b, w)).collect();
    let qsum = int8_keys.then(|| {
        let qs = b.f();
        b.op(format!("mov.f32 {qs}, 0f00000000"));
        for q in &qf {
            b.op(format!("add.f32 {qs}, {qs}, {q}"));
        }
        group_sums(b, std::slice::from_ref(&qs));
        qs
    });
    // Key step·G + grp: element ((s0 + key)·kvh + g)·d + 8c; a step moves
    // G rows.
    // Lanes past the row read its last vector (their q is zero): every
    // load of a whole trip is then unpredicated, which lets ptxas issue
    // them all before the first use (predicated, it kept one in flight).
    let (kcol, last_col) = (b.r(), b.r());
    b.op(format!("sub.s32 {last_col}, {cols}, 1"));
    b.op(format!("min.s32 {kcol}, {lane_t}, {last_col}"));
    b.op(format!("shl.b32 {kcol}, {kcol}, {}", VEC.ilog2()));
    let (prow, ka, kstep) = sp.key_pointer(b, sp.a.get("k"), &grp, &kcol, &groups, eb);
    let params = int8_keys.then(|| {
        let sa = addr(b, sp.a.get("k_scales"), &prow, 4);
        let oa = addr(b, sp.a.get("k_offsets"), &prow, 4);
        let (prows, pstep) = (b.r(), b.rd());
        b.op(format!("mul.lo.s32 {prows}, {}, {groups}", sp.kvh));
        b.op(format!("mul.wide.s32 {pstep}, {prows}, 4"));
        (sa, oa, pstep)
    });
    let stage_base = b.r();
    b.op(format!("mov.u32 {stage_base}, {}", c.stage));
    b.op(format!(
        "mad.lo.s32 {stage_base}, {}, {}, {stage_base}",
        sp.tid,
        VEC * eb
    ));
    let step = b.r();
    b.op(format!("mov.u32 {step}, 0"));
    // One key's loads (under `valid`, when given) at the current pointers.
    // A key's vector: loaded into registers (under `valid`), or, in a whole
    // trip, copied to this thread's shared slot `stage` by `cp.async` and
    // read back after the trip's wait (ptxas sinks plain loads next to
    // their use and kept one in flight; asynchronous copies all are).
    let piece = VEC * eb;
    let load = |b: &mut Body, valid: Option<&str>, stage: Option<&str>| {
        let words: Vec<String> = (0..2 * eb).map(|_| b.r()).collect();
        match (stage, valid) {
            (Some(slot), _) => {
                let kind = if piece == 16 { "cg" } else { "ca" };
                b.op(format!(
                    "cp.async.{kind}.shared.global [{slot}], [{ka}], {piece}, {piece}"
                ));
            }
            (None, valid) => {
                let guard = match valid {
                    Some(v) => {
                        for w in &words {
                            b.op(format!("mov.b32 {w}, 0"));
                        }
                        format!("@{v} ")
                    }
                    None => String::new(),
                };
                b.op(format!(
                    "{guard}ld.global.nc.v{}.u32 {{{}}}, [{ka}]",
                    2 * eb,
                    words.join(", ")
                ));
            }
        }
        let kp = params.as_ref().map(|(sa, oa, _)| {
            let (ks, ko) = (b.f(), b.f());
            let pg = valid.map_or(String::new(), |v| format!("@{v} "));
            b.op(format!("mov.f32 {ks}, 0f00000000"));
            b.op(format!("mov.f32 {ko}, 0f00000000"));
            b.op(format!("{pg}ld.global.nc.f32 {ks}, [{sa}]"));
            b.op(format!("{pg}ld.global.nc.f32 {ko}, [{oa}]"));
            (ks, ko)
        });
        b.op(format!("add.s64 {ka}, {ka}, {kstep}"));
        if let Some((sa, oa, pstep)) = &params {
            b.op(format!("add.s64 {sa}, {sa}, {pstep}"));
            b.op(format!("add.s64 {oa}, {oa}, {pstep}"));
        }
        (words, kp)
    };
    // One key's score from its loads: the group's dot, the row's scale and
    // offset, 1/sqrt(d); stored to p by lane 0 of the group, checked
    // against [phi + lo, phi + hi] and folded into the max by every lane.
    // A trip's scores in three passes over its keys: the lanes' partial
    // dots, element by element across the keys (each element's FMAs need
    // every key's load, so all are in flight at once: one key's whole dot
    // at a time, ptxas sank each load to just before its dot and kept one
    // in flight), then the butterfly rounds, then the rest per key.
    let dots = |b: &mut Body, loaded: &[KeyLoad]| {
        let vals: Vec<Vec<String>> = loaded
            .iter()
            .map(|(words, _)| vec_values(b, plan.k, sp.sm, words, c.magic))
            .collect();
        let xs: Vec<String> = vals
            .iter()
            .map(|v| {
                let x = b.f();
                b.op(format!("mul.f32 {x}, {}, {}", qf[0], v[0]));
                x
            })
            .collect();
        for (e, q) in qf.iter().enumerate().skip(1) {
            for (x, v) in xs.iter().zip(&vals) {
                b.op(format!("fma.rn.f32 {x}, {q}, {}, {x}", v[e]));
            }
        }
        xs
    };
    // The rest of a key's score (the row's scale and offset, 1/sqrt(d)):
    // stored to p by lane 0 of the group, checked against [phi + lo, phi +
    // hi] and folded into the max by every lane.
    let finish = |b: &mut Body,
                  x: &str,
                  kp: &Option<(String, String)>,
                  key_step: &str,
                  valid: Option<&str>| {
        if let (Some((ks, ko)), Some(qs)) = (kp, &qsum) {
            b.op(format!("mul.f32 {x}, {ks}, {x}"));
            b.op(format!("fma.rn.f32 {x}, {ko}, {qs}, {x}"));
        }
        if let Some(sc) = c.scale {
            b.op(format!("mul.f32 {x}, {x}, {sc}"));
        }
        let key = b.r();
        b.op(format!("mad.lo.s32 {key}, {key_step}, {groups}, {grp}"));
        let pa = shared_at(b, sp.p_base, &key);
        let (st, inr) = (b.pred(), b.pred());
        match valid {
            Some(v) => b.op(format!("and.pred {st}, {writer}, {v}")),
            None => b.op(format!("mov.pred {st}, {writer}")),
        }
        b.op(format!("@{st} st.shared.f32 [{pa}], {x}"));
        let shifted = b.f();
        b.op(format!("sub.f32 {shifted}, {x}, {}", f32_lit(plan.phi)));
        b.op(format!(
            "setp.ge.f32 {inr}, {shifted}, {}",
            f32_lit(plan.lo)
        ));
        b.op(format!(
            "setp.le.and.f32 {inr}, {shifted}, {}, {inr}",
            f32_lit(plan.hi)
        ));
        let pg = valid.map_or(String::new(), |v| format!("@{v} "));
        if let Some(v) = valid {
            let bad = b.pred();
            b.op(format!("not.pred {bad}, {inr}"));
            b.op(format!("and.pred {bad}, {bad}, {v}"));
            b.op(format!("@{bad} mov.u32 {}, 1", c.out));
        } else {
            b.op(format!("@!{inr} mov.u32 {}, 1", c.out));
        }
        b.op(format!("{pg}max.f32 {}, {}, {x}", c.mx, c.mx));
    };
    let wide_top = b.label("qk_keys");
    let wide_end = b.label("qk_keys_end");
    b.place(&wide_top);
    let (last, past) = (b.r(), b.pred());
    b.op(format!("add.s32 {last}, {step}, {}", c.unroll));
    b.op(format!("mul.lo.s32 {last}, {last}, {groups}"));
    b.op(format!("setp.gt.s32 {past}, {last}, {n}"));
    b.op(format!("@{past} bra.uni {wide_end}"));
    let slots: Vec<String> = (0..c.unroll)
        .map(|u| {
            let slot = b.r();
            b.op(format!(
                "add.s32 {slot}, {stage_base}, {}",
                u * plan.wg * piece
            ));
            slot
        })
        .collect();
    let loaded: Vec<_> = slots.iter().map(|slot| load(b, None, Some(slot))).collect();
    b.op("cp.async.commit_group");
    b.op("cp.async.wait_group 0");
    for ((words, _), slot) in loaded.iter().zip(&slots) {
        b.op(format!(
            "ld.shared.v{}.u32 {{{}}}, [{slot}]",
            2 * eb,
            words.join(", ")
        ));
    }
    let xs = dots(b, &loaded);
    group_sums(b, &xs);
    for (u, (x, (_, kp))) in xs.iter().zip(&loaded).enumerate() {
        let ks = b.r();
        b.op(format!("add.s32 {ks}, {step}, {u}"));
        finish(b, x, kp, &ks, None);
    }
    b.op(format!("add.s32 {step}, {step}, {}", c.unroll));
    b.op(format!("bra.uni {wide_top}"));
    b.place(&wide_end);
    let one_top = b.label("qk_key");
    b.place(&one_top);
    let (first, more) = (b.r(), b.pred());
    b.op(format!("mul.lo.s32 {first}, {step}, {groups}"));
    b.op(format!("setp.ge.s32 {more}, {first}, {n}"));
    b.op(format!("@{more} bra.uni {done}"));
    let (key, valid) = (b.r(), b.pred());
    b.op(format!("add.s32 {key}, {first}, {grp}"));
    b.op(format!("setp.lt.s32 {valid}, {key}, {n}"));
    let l = load(b, Some(&valid), None);
    let x = dots(b, std::slice::from_ref(&l)).remove(0);
    group_sums(b, std::slice::from_ref(&x));
    finish(b, &x, &l.1, &step, Some(&valid));
    b.op(format!("add.s32 {step}, {step}, 1"));
    b.op(format!("bra.uni {one_top}"));
}

/// What the vector P·V reads beyond the split.
struct VectorPv<'a> {
    split: &'a Split<'a>,
    red: &'a str,
    pod: &'a str,
    unroll: u32,
}

/// P·V with 8-element vector loads of value rows, where rows are whole
/// vectors (`d % 8 == 0`) and a row's `cols = d / 8` vectors fit the block
/// (`d <= 8·wg`); otherwise it branches to `scalar`. Thread `tid` takes
/// column vector `tid % cols` of keys `slot, slot + slots, ...` (`slot =
/// tid / cols`, `slots = wg / cols`), `unroll` keys per trip with every
/// load issued first; the slots' sums meet in shared memory and threads
/// over d write `part_o`. One 16-byte load per 8 values (the scalar loop
/// issued a 2-byte load per value), and a warp reads whole rows.
fn vector_pv(b: &mut Body, c: &VectorPv<'_>, scalar: &str, done: &str) {
    let sp = c.split;
    let plan = sp.plan;
    let (wg, eb) = (plan.wg, elem_bytes(plan.v));
    let (tid, d, n) = (sp.tid, sp.d, sp.n);
    sp.require_vectors(b, wg, scalar);
    b.comment("Vector P*V: column vector tid % cols of keys slot, slot + slots, ...");
    let (cols, slots, col, slot) = (b.r(), b.r(), b.r(), b.r());
    b.op(format!("shr.u32 {cols}, {d}, {}", VEC.ilog2()));
    b.op(format!("div.u32 {slots}, {wg}, {cols}"));
    b.op(format!("rem.u32 {col}, {tid}, {cols}"));
    b.op(format!("div.u32 {slot}, {tid}, {cols}"));
    let active = b.pred();
    b.op(format!("setp.lt.u32 {active}, {slot}, {slots}"));
    let acc: Vec<String> = (0..VEC).map(|_| b.f()).collect();
    for x in &acc {
        b.op(format!("mov.f32 {x}, 0f00000000"));
    }
    let acc_done = b.label("pv_vec_acc_end");
    b.op(format!("@!{active} bra {acc_done}"));
    let col_elem = b.r();
    b.op(format!("shl.b32 {col_elem}, {col}, {}", VEC.ilog2()));
    let (_, va, vstep) = sp.key_pointer(b, sp.a.get("v"), &slot, &col_elem, &slots, eb);
    let (pp, pstep) = (b.r(), b.r());
    b.op(format!("mad.lo.s32 {pp}, {slot}, 4, {}", sp.p_base));
    b.op(format!("shl.b32 {pstep}, {slots}, 2"));
    let (i, span) = (b.r(), b.r());
    b.op(format!("mov.u32 {i}, {slot}"));
    b.op(format!("mul.lo.s32 {span}, {slots}, {}", c.unroll - 1));
    let key = |b: &mut Body| {
        let pval = b.f();
        b.op(format!("ld.shared.f32 {pval}, [{pp}]"));
        let words = load_vec_words(b, plan.v, &va);
        b.op(format!("add.s32 {pp}, {pp}, {pstep}"));
        b.op(format!("add.s64 {va}, {va}, {vstep}"));
        (pval, words)
    };
    let fmas = |b: &mut Body, (pval, words): &(String, Vec<String>)| {
        let vals = vec_values(b, plan.v, sp.sm, words, "");
        for (x, v) in acc.iter().zip(&vals) {
            b.op(format!("fma.rn.f32 {x}, {pval}, {v}, {x}"));
        }
    };
    let wide_top = b.label("pv_vec_keys");
    let wide_end = b.label("pv_vec_keys_end");
    b.place(&wide_top);
    let (last, past) = (b.r(), b.pred());
    b.op(format!("add.s32 {last}, {i}, {span}"));
    b.op(format!("setp.ge.s32 {past}, {last}, {n}"));
    b.op(format!("@{past} bra {wide_end}"));
    let keys: Vec<_> = (0..c.unroll).map(|_| key(b)).collect();
    for k in &keys {
        fmas(b, k);
    }
    b.op(format!("add.s32 {i}, {last}, {slots}"));
    b.op(format!("bra {wide_top}"));
    b.place(&wide_end);
    let one_top = b.label("pv_vec_key");
    b.place(&one_top);
    let pi = b.pred();
    b.op(format!("setp.ge.s32 {pi}, {i}, {n}"));
    b.op(format!("@{pi} bra {acc_done}"));
    let k = key(b);
    fmas(b, &k);
    b.op(format!("add.s32 {i}, {i}, {slots}"));
    b.op(format!("bra {one_top}"));
    b.place(&acc_done);
    b.comment("The slots' sums: red[slot*d + col*8 + e], then threads over d add them.");
    let (ridx, ra) = (b.r(), b.r());
    b.op(format!("mul.lo.s32 {ridx}, {slot}, {d}"));
    b.op(format!("mad.lo.s32 {ridx}, {col}, {VEC}, {ridx}"));
    let rbase = b.r();
    b.op(format!("mov.u32 {rbase}, {}", c.red));
    b.op(format!("mad.lo.s32 {ra}, {ridx}, 4, {rbase}"));
    for q in 0..VEC / 4 {
        let part = &acc[4 * q as usize..4 * q as usize + 4];
        b.op(format!(
            "@{active} st.shared.v4.f32 [{ra}+{}], {{{}}}",
            16 * q,
            part.join(", ")
        ));
    }
    b.op("bar.sync 0");
    let jj = b.r();
    b.op(format!("mov.u32 {jj}, {tid}"));
    let out_top = b.label("pv_vec_out");
    b.place(&out_top);
    let pj = b.pred();
    b.op(format!("setp.ge.s32 {pj}, {jj}, {d}"));
    b.op(format!("@{pj} bra {done}"));
    let (o, s, sa) = (b.f(), b.r(), b.r());
    b.op(format!("mov.f32 {o}, 0f00000000"));
    b.op(format!("mov.u32 {s}, 0"));
    b.op(format!("mad.lo.s32 {sa}, {jj}, 4, {rbase}"));
    let sum_top = b.label("pv_vec_slot");
    let sum_end = b.label("pv_vec_slot_end");
    b.place(&sum_top);
    let ps = b.pred();
    b.op(format!("setp.ge.u32 {ps}, {s}, {slots}"));
    b.op(format!("@{ps} bra {sum_end}"));
    let t = b.f();
    b.op(format!("ld.shared.f32 {t}, [{sa}]"));
    b.op(format!("add.f32 {o}, {o}, {t}"));
    b.op(format!("mad.lo.s32 {sa}, {d}, 4, {sa}"));
    b.op(format!("add.s32 {s}, {s}, 1"));
    b.op(format!("bra {sum_top}"));
    b.place(&sum_end);
    let oidx = b.r();
    b.op(format!("add.s32 {oidx}, {}, {jj}", c.pod));
    let oa = addr(b, sp.a.get("part_o"), &oidx, 4);
    b.op(format!("st.global.f32 [{oa}], {o}"));
    b.op(format!("add.s32 {jj}, {jj}, {wg}"));
    b.op(format!("bra {out_top}"));
}

fn combine(plan: &AttentionPlan, warp: u32, sh: &CombineShared) -> Body {
    let warps = plan.combine_launch[2].local;
    let mut b = Body::new();
    let a = Args::load(&mut b, &plan.combine_entry, &plan.combine_args);
    let [hq, d, splits] = ["hq", "d", "splits"].map(|n| a.get(n).to_string());
    b.comment(format!(
        "Thread (x, z): element j of head `head`, splits z, z + {warps}, ..."
    ));
    let (tx, tz, cx, head, j) = (b.r(), b.r(), b.r(), b.r(), b.r());
    b.op(format!("mov.u32 {tx}, %tid.x"));
    b.op(format!("mov.u32 {tz}, %tid.z"));
    b.op(format!("mov.u32 {cx}, %ctaid.x"));
    b.op(format!("mov.u32 {head}, %ctaid.y"));
    b.op(format!("mad.lo.s32 {j}, {cx}, {warp}, {tx}"));
    let pout = b.pred();
    b.op(format!("setp.ge.s32 {pout}, {j}, {d}"));
    b.op(format!("setp.ge.or.s32 {pout}, {head}, {hq}, {pout}"));
    b.comment("One pass: a running max M, and num, den rescaled when it rises.");
    let (big, den, num, t) = (b.f(), b.f(), b.f(), b.r());
    b.op(format!("mov.f32 {big}, 0fFF800000"));
    b.op(format!("mov.f32 {den}, 0f00000000"));
    b.op(format!("mov.f32 {num}, 0f00000000"));
    b.op(format!("mov.u32 {t}, {tz}"));
    let folded = b.label("folded");
    // Threads past d or hq fold nothing but reach the barrier.
    b.op(format!("@{pout} bra {folded}"));
    // Split `at`'s m, l and o_j: three loads, issued before any is used.
    let load = |b: &mut Body, at: &str| {
        let part = b.r();
        b.op(format!("mad.lo.s32 {part}, {at}, {hq}, {head}"));
        let ma = addr(b, a.get("part_m"), &part, 4);
        let la = addr(b, a.get("part_l"), &part, 4);
        let oidx = b.r();
        b.op(format!("mad.lo.s32 {oidx}, {part}, {d}, {j}"));
        let oa = addr(b, a.get("part_o"), &oidx, 4);
        let (mv, lv, ov) = (b.f(), b.f(), b.f());
        b.op(format!("ld.global.f32 {mv}, [{ma}]"));
        b.op(format!("ld.global.f32 {lv}, [{la}]"));
        b.op(format!("ld.global.f32 {ov}, [{oa}]"));
        (mv, lv, ov)
    };
    let log2e = f32_lit(std::f32::consts::LOG2_E);
    // Fold (m, l, o) into (M, den, num): where m > M, den and num take
    // 2^((M - m)·log2 e) and M = m; then both add 2^((m - M)·log2 e)·(l,
    // o), a factor of exactly 1 for every split that used the unified max.
    let fold = |b: &mut Body, mv: &str, lv: &str, ov: &str| {
        let (rises, c, f) = (b.pred(), b.f(), b.f());
        b.op(format!("setp.gt.f32 {rises}, {mv}, {big}"));
        b.op(format!("sub.f32 {c}, {big}, {mv}"));
        b.op(format!("mul.f32 {c}, {c}, {log2e}"));
        b.op(format!("ex2.approx.ftz.f32 {c}, {c}"));
        b.op(format!("@{rises} mul.f32 {num}, {num}, {c}"));
        b.op(format!("@{rises} mul.f32 {den}, {den}, {c}"));
        b.op(format!("@{rises} mov.f32 {big}, {mv}"));
        b.op(format!("sub.f32 {f}, {mv}, {big}"));
        b.op(format!("mul.f32 {f}, {f}, {log2e}"));
        b.op(format!("ex2.approx.ftz.f32 {f}, {f}"));
        b.op(format!("fma.rn.f32 {den}, {f}, {lv}, {den}"));
        b.op(format!("fma.rn.f32 {num}, {f}, {ov}, {num}"));
    };
    // COMBINE_UNROLL splits per trip, every load issued first (a loop of
    // one split per trip waited an L2 round trip per split), then single
    // splits.
    let wide_top = b.label("splits_wide");
    let wide_end = b.label("splits_wide_end");
    b.place(&wide_top);
    let (last, past) = (b.r(), b.pred());
    b.op(format!(
        "add.s32 {last}, {t}, {}",
        (COMBINE_UNROLL - 1) * warps
    ));
    b.op(format!("setp.ge.s32 {past}, {last}, {splits}"));
    b.op(format!("@{past} bra {wide_end}"));
    let mut loaded = Vec::new();
    for u in 0..COMBINE_UNROLL {
        let at = b.r();
        b.op(format!("add.s32 {at}, {t}, {}", u * warps));
        loaded.push(load(&mut b, &at));
    }
    for (mv, lv, ov) in &loaded {
        fold(&mut b, mv, lv, ov);
    }
    b.op(format!("add.s32 {t}, {t}, {}", COMBINE_UNROLL * warps));
    b.op(format!("bra {wide_top}"));
    b.place(&wide_end);
    let one_top = b.label("split");
    b.place(&one_top);
    let ps = b.pred();
    b.op(format!("setp.ge.s32 {ps}, {t}, {splits}"));
    b.op(format!("@{ps} bra {folded}"));
    let (mv, lv, ov) = load(&mut b, &t);
    fold(&mut b, &mv, &lv, &ov);
    b.op(format!("add.s32 {t}, {t}, {warps}"));
    b.op(format!("bra {one_top}"));
    b.place(&folded);
    let exit = b.label("exit");
    if warps > 1 {
        b.comment("The warps' (M, den, num) meet in shared memory; warp 0 folds them.");
        let slot = b.r();
        b.op(format!("mad.lo.s32 {slot}, {tz}, {warp}, {tx}"));
        let [sm_, sl, so] = [&sh.m, &sh.l, &sh.o].map(|name| {
            let (base, at) = (b.r(), b.r());
            b.op(format!("mov.u32 {base}, {name}"));
            b.op(format!("mad.lo.s32 {at}, {slot}, 4, {base}"));
            at
        });
        b.op(format!("st.shared.f32 [{sm_}], {big}"));
        b.op(format!("st.shared.f32 [{sl}], {den}"));
        b.op(format!("st.shared.f32 [{so}], {num}"));
        b.op("bar.sync 0");
        let lead = b.pred();
        b.op(format!("setp.ne.u32 {lead}, {tz}, 0"));
        b.op(format!("@{lead} bra {exit}"));
        b.op(format!("@{pout} bra {exit}"));
        for w in 1..warps {
            let off = 4 * w * warp;
            let (mv, lv, ov) = (b.f(), b.f(), b.f());
            b.op(format!("ld.shared.f32 {mv}, [{sm_}+{off}]"));
            b.op(format!("ld.shared.f32 {lv}, [{sl}+{off}]"));
            b.op(format!("ld.shared.f32 {ov}, [{so}+{off}]"));
            fold(&mut b, &mv, &lv, &ov);
        }
    } else {
        b.op(format!("@{pout} bra {exit}"));
    }
    let r = b.f();
    b.op(format!("div.rn.f32 {r}, {num}, {den}"));
    let hv = b.h();
    b.op(format!("cvt.rn.f16.f32 {hv}, {r}"));
    let yi = b.r();
    b.op(format!("mad.lo.s32 {yi}, {head}, {d}, {j}"));
    let ya = addr(&mut b, a.get("o"), &yi, 2);
    b.op(format!("st.global.b16 [{ya}], {hv}"));
    b.place(&exit);
    b.op("ret");
    b
}
