//! Flat GEMM and GEMM on tensor cores for a [`TiledPlan`] whose units are
//! warps (FlashDecoding++ sections 4-5, TurboMind's mixed-precision GEMM).
//!
//! # Mapping
//!
//! `mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32` with the weights on
//! the m = 16 side and the tokens on the n = 8 side, so a flat GEMM pads M
//! to 8 (one n tile), not 64. Warp `w` of the block is `(w / units_h,
//! w % units_h)` and computes an `ep × hp` warp tile: `ep/8` n tiles by
//! `hp/16` m tiles of accumulators, 4 f32 registers each. Thread `lane`
//! with `g = lane >> 2`, `t = lane & 3` holds `C[h = g (+8)][e = 2t (+1)]`.
//!
//! # Pipeline (`stages` K slices in dynamic shared memory)
//!
//! Every stage holds the x slice `[tile_e][k_slice]` halves and the weight
//! slice: `[tile_h][k_slice]` halves for f16 weights, the raw codes
//! `[tile_h][k_slice·bits/8]` bytes for quantized ones (TurboMind: codes
//! travel and sit in shared memory packed, and are dequantized in
//! registers right before the `mma`). Global → shared is `cp.async.cg` of
//! 16 bytes (zero-filled past e, h and l), one commit group per stage;
//! `cp.async.wait_group stages−2` plus a barrier opens a stage, and the
//! slice `stages−1` ahead is issued before the current one computes.
//! Half rows are XOR-swizzled per 16-byte chunk so `ldmatrix` reads eight
//! rows without bank conflicts.
//!
//! # Fragments and dequantization per k16 step
//!
//! | operand | how |
//! |---|---|
//! | x (mma B) | `ldmatrix.x4` of 8 rows × 32 k: two k steps at once |
//! | f16 w (mma A) | `ldmatrix.x4` of 16 rows × 16 k |
//! | u4 w | rows g, g+8: one `ld.shared.v4` per 32 k; per byte `prmt` (byte t to both halves), `lop3` (& 0x00F0000F \| 0x64006400), one `fma.rn.f16x2` by {1, 1/16} − {1024, 64}: both nibbles exact in f16 |
//! | e0m4 w | the same `prmt`/`lop3` under 0x4000, one `fma.rn.f16x2` by {64, 4} − {126, 6}: 2 + n/8 exact |
//! | i8 w | `ld.shared.b32`, `prmt` two bytes under 0x64, `xor` 0x80 (b + 128), one `sub.f16x2` 1152 |
//!
//! then `w = scale·v + offset` by one `fma.rn.f16x2` (f16 operands, as the
//! OpenCL kernel stages dequantized halves). x is read with `cp.async`
//! only when rows are 16-byte aligned (`l % 8 == 0`); otherwise halves are
//! copied one by one.

use std::fmt::Write as _;

use tessera_dsl::{Group, ParamType};

use super::gemv::activation;
use super::writer::Body;
use super::{Args, Limits, Sm, module};
use crate::artifact::EmitError;
use crate::gpu::{Dequant, MatmulPlan, TiledPlan};
use crate::target::MMA_M16N8K16_F16;
use crate::tile::TileConfig;

/// The sizes one tiled program is built from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MmaLayout {
    /// n tiles (8 rows of e) and m tiles (16 columns of h) per warp.
    pub n_tiles: u32,
    pub m_tiles: u32,
    /// 16-byte chunks of halves per row per stage (`k_slice / 8`).
    pub row_chunks: u32,
    /// Bytes of one weight row per stage.
    pub w_row_bytes: u32,
    pub x_stage_bytes: u32,
    pub w_stage_bytes: u32,
    pub stage_bytes: u32,
    /// Dynamic shared memory of the launch.
    pub shared_bytes: u32,
}

impl MmaLayout {
    pub fn new(
        plan: &MatmulPlan,
        t: &TiledPlan,
        tile: &TileConfig,
    ) -> Result<MmaLayout, EmitError> {
        let bad = |why: String| EmitError::BadTile {
            tile: tile.summary(),
            why,
        };
        let mma = MMA_M16N8K16_F16;
        if t.unit_threads != 32 {
            return Err(bad(format!(
                "the tensor-core kernels need warp units, the plan has {} thread(s) per unit",
                t.unit_threads
            )));
        }
        if !t.ep.is_multiple_of(mma.n) || !t.hp.is_multiple_of(mma.m) {
            return Err(bad(format!(
                "warp tile {}x{} is not a multiple of the mma n x m = {}x{}",
                t.ep, t.hp, mma.n, mma.m
            )));
        }
        let wt = &plan.weights;
        if !t.k_slice.is_multiple_of(wt.lp) || !t.k_slice.is_multiple_of(32) || t.k_slice > 64 {
            return Err(bad(format!(
                "k_slice {} must be 32 or 64 (whole {}-element weight blocks, two k16 steps per ldmatrix.x4)",
                t.k_slice, wt.lp
            )));
        }
        if t.stages < 2 {
            return Err(bad(format!("{} stage(s): the pipeline needs 2", t.stages)));
        }
        let row_chunks = t.k_slice / 8;
        let w_row_bytes = t.k_slice * wt.bits / 8;
        let x_stage_bytes = t.tile_e * t.k_slice * 2;
        let w_stage_bytes = t.tile_h * w_row_bytes;
        let stage_bytes = x_stage_bytes + w_stage_bytes;
        Ok(MmaLayout {
            n_tiles: t.ep / mma.n,
            m_tiles: t.hp / mma.m,
            row_chunks,
            w_row_bytes,
            x_stage_bytes,
            w_stage_bytes,
            stage_bytes,
            shared_bytes: t.stages * stage_bytes,
        })
    }

    /// XOR of a half row's 16-byte chunk index: eight consecutive rows
    /// read at one logical chunk land in distinct banks.
    fn swizzle_shift(&self) -> u32 {
        (8 / self.row_chunks).max(1).ilog2()
    }
}

/// Thread-invariant registers the loops use.
struct Ctx {
    /// Per k16 step: the swizzled offset of this lane's `ldmatrix` row of
    /// the x tile (n tile 0) and of the f16 weight tile (m tile 0); further
    /// tiles are immediate offsets (8 or 16 rows keep the swizzle).
    x_frag: Vec<String>,
    w_frag: Vec<String>,
    /// Byte offset of this thread's weight row g of m tile 0 (codes).
    w_row: String,
    tid: String,
    g: String,
    t4: String,
    warp_e: String,
    warp_h: String,
    e0: String,
    h0: String,
    smem: String,
    e: String,
    h: String,
    l: String,
    aligned: String,
}

/// The program text and its dynamic shared memory bytes.
pub fn print(
    plan: &MatmulPlan,
    t: &TiledPlan,
    sm: Sm,
    header: &str,
    tile: &TileConfig,
) -> Result<(String, u32), EmitError> {
    let lay = MmaLayout::new(plan, t, tile)?;
    let smem = format!("{}_smem", plan.entry);
    let mut b = Body::new();
    let a = Args::load(&mut b, &plan.entry, &plan.args);
    let cx = ctx(&mut b, t, &lay, plan, &a, &smem);

    // Accumulators.
    let acc: Vec<Vec<[String; 4]>> = (0..lay.m_tiles)
        .map(|_| {
            (0..lay.n_tiles)
                .map(|_| std::array::from_fn(|_| b.f()))
                .collect()
        })
        .collect();
    for row in &acc {
        for c in row {
            for r in c {
                b.op(format!("mov.f32 {r}, 0f00000000"));
            }
        }
    }
    let nk = b.r();
    let tmp = b.r();
    b.op(format!("add.s32 {tmp}, {}, {}", cx.l, t.k_slice - 1));
    b.op(format!("div.s32 {nk}, {tmp}, {}", t.k_slice));

    // Row-quantized weights: one scale (and offset) per row, loaded once.
    let row_params =
        if plan.weights.has_scale && !matches!(plan.weights.group, Some(Group::Size(_))) {
            let zero = b.r();
            b.op(format!("mov.u32 {zero}, 0"));
            Some(params(&mut b, plan, t, &lay, &cx, &a, &zero))
        } else {
            None
        };

    b.comment(format!(
        "Prologue: issue {} of {} stages.",
        t.stages - 1,
        t.stages
    ));
    for s in 0..t.stages - 1 {
        let k0 = b.r();
        b.op(format!("mov.u32 {k0}, {}", s * t.k_slice));
        let skip = b.label("prologue_skip");
        let p = b.pred();
        b.op(format!("setp.ge.s32 {p}, {k0}, {}", cx.l));
        b.op(format!("@{p} bra.uni {skip}"));
        let base = b.r();
        b.op(format!(
            "add.s32 {base}, {}, {}",
            cx.smem,
            s * lay.stage_bytes
        ));
        load_stage(&mut b, plan, t, &lay, &cx, &a, &base, &k0);
        b.place(&skip);
        b.op("cp.async.commit_group");
    }

    let kt = b.r();
    b.op(format!("mov.u32 {kt}, 0"));
    let top = b.label("k_loop");
    let end = b.label("k_end");
    b.place(&top);
    let p = b.pred();
    b.op(format!("setp.ge.s32 {p}, {kt}, {nk}"));
    b.op(format!("@{p} bra.uni {end}"));
    b.op(format!("cp.async.wait_group {}", t.stages - 2));
    b.op("bar.sync 0");
    b.comment(format!(
        "Issue slice kt + {} into the stage computed last trip.",
        t.stages - 1
    ));
    let pre = b.r();
    b.op(format!("add.s32 {pre}, {kt}, {}", t.stages - 1));
    let skip = b.label("issue_skip");
    let pp = b.pred();
    b.op(format!("setp.ge.s32 {pp}, {pre}, {nk}"));
    b.op(format!("@{pp} bra.uni {skip}"));
    let (ps, pbase, pk0) = (b.r(), b.r(), b.r());
    b.op(format!("rem.u32 {ps}, {pre}, {}", t.stages));
    b.op(format!(
        "mad.lo.s32 {pbase}, {ps}, {}, {}",
        lay.stage_bytes, cx.smem
    ));
    b.op(format!("mul.lo.s32 {pk0}, {pre}, {}", t.k_slice));
    load_stage(&mut b, plan, t, &lay, &cx, &a, &pbase, &pk0);
    b.place(&skip);
    b.op("cp.async.commit_group");

    let (cs, cbase, ck0) = (b.r(), b.r(), b.r());
    b.op(format!("rem.u32 {cs}, {kt}, {}", t.stages));
    b.op(format!(
        "mad.lo.s32 {cbase}, {cs}, {}, {}",
        lay.stage_bytes, cx.smem
    ));
    b.op(format!("mul.lo.s32 {ck0}, {kt}, {}", t.k_slice));
    compute_stage(
        &mut b,
        plan,
        t,
        &lay,
        &cx,
        &a,
        &cbase,
        &ck0,
        &acc,
        row_params.as_ref(),
    );
    b.op(format!("add.s32 {kt}, {kt}, 1"));
    b.op(format!("bra.uni {top}"));
    b.place(&end);
    b.op("cp.async.wait_all");

    epilogue(&mut b, plan, t, &lay, &cx, &a, &acc);
    b.op("ret");

    let mut h = header.to_string();
    let _ = write!(
        h,
        "\ndynamic shared memory: {} bytes ({} stages x (x {} + w {}))",
        lay.shared_bytes, t.stages, lay.x_stage_bytes, lay.w_stage_bytes
    );
    let decls = vec![format!(".extern .shared .align 128 .b8 {smem}[];")];
    let text = module(
        sm,
        &h,
        &plan.entry,
        &plan.args,
        Limits {
            reqntid: [t.threads(), 1, 1],
            maxnreg: sm.caps().registers,
        },
        &decls,
        b,
    );
    Ok((text, lay.shared_bytes))
}

fn ctx(
    b: &mut Body,
    t: &TiledPlan,
    lay: &MmaLayout,
    plan: &MatmulPlan,
    a: &Args,
    smem: &str,
) -> Ctx {
    let (tid, lane, warp, g, t4) = (b.r(), b.r(), b.r(), b.r(), b.r());
    b.op(format!("mov.u32 {tid}, %tid.x"));
    b.op(format!("and.b32 {lane}, {tid}, 31"));
    b.op(format!("shr.u32 {warp}, {tid}, 5"));
    b.op(format!("shr.u32 {g}, {lane}, 2"));
    b.op(format!("and.b32 {t4}, {lane}, 3"));
    let (warp_e, warp_h) = (b.r(), b.r());
    b.op(format!("div.u32 {warp_e}, {warp}, {}", t.units_h));
    b.op(format!("rem.u32 {warp_h}, {warp}, {}", t.units_h));
    let (cx, cy, e0, h0) = (b.r(), b.r(), b.r(), b.r());
    b.op(format!("mov.u32 {cx}, %ctaid.x"));
    b.op(format!("mov.u32 {cy}, %ctaid.y"));
    b.op(format!("mul.lo.s32 {h0}, {cx}, {}", t.tile_h));
    b.op(format!("mul.lo.s32 {e0}, {cy}, {}", t.tile_e));
    let base = b.r();
    b.op(format!("mov.u32 {base}, {smem}"));
    let l = a.get("l").to_string();
    let (l7, aligned) = (b.r(), b.pred());
    b.op(format!("and.b32 {l7}, {l}, 7"));
    b.op(format!("setp.eq.s32 {aligned}, {l7}, 0"));
    let steps = t.k_slice / 16;
    let (xrow, r7, xbit) = (b.r(), b.r(), b.r());
    b.op(format!("and.b32 {r7}, {lane}, 7"));
    b.op(format!("mad.lo.s32 {xrow}, {warp_e}, {}, {r7}", t.ep));
    b.op(format!("bfe.u32 {xbit}, {lane}, 3, 1"));
    let x_frag = (0..steps)
        .map(|s| {
            let c = b.r();
            b.op(format!("add.s32 {c}, {xbit}, {}", 2 * s));
            swizzled(b, lay, &xrow, &c)
        })
        .collect();
    let w_frag = if plan.weights.dequant == Dequant::None {
        let (wrow, r15, wbit) = (b.r(), b.r(), b.r());
        b.op(format!("and.b32 {r15}, {lane}, 15"));
        b.op(format!("mad.lo.s32 {wrow}, {warp_h}, {}, {r15}", t.hp));
        b.op(format!("shr.u32 {wbit}, {lane}, 4"));
        (0..steps)
            .map(|s| {
                let c = b.r();
                b.op(format!("add.s32 {c}, {wbit}, {}", 2 * s));
                swizzled(b, lay, &wrow, &c)
            })
            .collect()
    } else {
        Vec::new()
    };
    let w_row = b.r();
    b.op(format!("mad.lo.s32 {w_row}, {warp_h}, {}, {g}", t.hp));
    b.op(format!("mul.lo.s32 {w_row}, {w_row}, {}", lay.w_row_bytes));
    if plan.weights.bits == 8 {
        // 8-bit: this thread's bytes 2t, 2t + 1 sit in word t / 2.
        let tb = b.r();
        b.op(format!("shr.u32 {tb}, {t4}, 1"));
        b.op(format!("mad.lo.s32 {w_row}, {tb}, 4, {w_row}"));
    }
    Ctx {
        x_frag,
        w_frag,
        w_row,
        tid,
        g,
        t4,
        warp_e,
        warp_h,
        e0,
        h0,
        smem: base,
        e: a.get("e").to_string(),
        h: a.get("h").to_string(),
        l,
        aligned,
    }
}

/// `off = row·row_chunks·16 + (chunk ^ swizzle(row))·16` for a half tile.
fn swizzled(b: &mut Body, lay: &MmaLayout, row: &str, chunk: &str) -> String {
    let (sw, x, off) = (b.r(), b.r(), b.r());
    b.op(format!("shr.u32 {sw}, {row}, {}", lay.swizzle_shift()));
    b.op(format!("and.b32 {sw}, {sw}, {}", lay.row_chunks - 1));
    b.op(format!("xor.b32 {x}, {chunk}, {sw}"));
    b.op(format!("shl.b32 {x}, {x}, 4"));
    b.op(format!(
        "mad.lo.s32 {off}, {row}, {}, {x}",
        lay.row_chunks * 16
    ));
    off
}

/// Issues the copies of one K slice starting at `k0` into the stage at
/// shared address `base`.
#[allow(clippy::too_many_arguments)]
fn load_stage(
    b: &mut Body,
    plan: &MatmulPlan,
    t: &TiledPlan,
    lay: &MmaLayout,
    cx: &Ctx,
    a: &Args,
    base: &str,
    k0: &str,
) {
    let threads = t.threads();
    let wt = &plan.weights;
    // x: tile_e rows × row_chunks chunks.
    let nx = t.tile_e * lay.row_chunks;
    b.comment(format!(
        "x slice: {} rows x {} chunks of 8 halves.",
        t.tile_e, lay.row_chunks
    ));
    for it in 0..nx.div_ceil(threads) {
        let i = b.r();
        b.op(format!("add.s32 {i}, {}, {}", cx.tid, it * threads));
        let skip = b.label("x_skip");
        if !nx.is_multiple_of(threads) {
            let p = b.pred();
            b.op(format!("setp.ge.u32 {p}, {i}, {nx}"));
            b.op(format!("@{p} bra {skip}"));
        }
        let (row, c) = (b.r(), b.r());
        b.op(format!("shr.u32 {row}, {i}, {}", lay.row_chunks.ilog2()));
        b.op(format!("and.b32 {c}, {i}, {}", lay.row_chunks - 1));
        let off = swizzled(b, lay, &row, &c);
        let dst = b.r();
        b.op(format!("add.s32 {dst}, {base}, {off}"));
        let (ge, gl) = (b.r(), b.r());
        b.op(format!("add.s32 {ge}, {}, {row}", cx.e0));
        b.op(format!("mad.lo.s32 {gl}, {c}, 8, {k0}"));
        let (valid, rem, bytes) = (b.pred(), b.r(), b.r());
        b.op(format!("setp.lt.s32 {valid}, {ge}, {}", cx.e));
        b.op(format!("setp.lt.and.s32 {valid}, {gl}, {}, {valid}", cx.l));
        // bytes = valid ? min(16, 2·(l − gl)) : 0
        b.op(format!("sub.s32 {rem}, {}, {gl}", cx.l));
        b.op(format!("shl.b32 {rem}, {rem}, 1"));
        b.op(format!("min.s32 {rem}, {rem}, 16"));
        b.op(format!("selp.b32 {bytes}, {rem}, 0, {valid}"));
        let (idx, off64, src) = (b.r(), b.rd(), b.rd());
        b.op(format!("mad.lo.s32 {idx}, {ge}, {}, {gl}", cx.l));
        b.op(format!("selp.b32 {idx}, {idx}, 0, {valid}"));
        b.op(format!("mul.wide.u32 {off64}, {idx}, 2"));
        b.op(format!("add.s64 {src}, {}, {off64}", a.get("x")));
        let slow = b.label("x_unaligned");
        b.op(format!("@!{} bra {slow}", cx.aligned));
        b.op(format!(
            "cp.async.cg.shared.global [{dst}], [{src}], 16, {bytes}"
        ));
        b.op(format!("bra.uni {skip}"));
        b.place(&slow);
        // Rows not 16-byte aligned: eight guarded halves, one 16-byte store.
        let mut words = Vec::new();
        for k in 0..4 {
            let mut hs = Vec::new();
            for j in 0..2 {
                let el = 2 * k + j;
                let (hr, p, li) = (b.h(), b.pred(), b.r());
                b.op(format!("mov.b16 {hr}, 0"));
                b.op(format!("add.s32 {li}, {gl}, {el}"));
                b.op(format!("setp.lt.and.s32 {p}, {li}, {}, {valid}", cx.l));
                b.op(format!("@{p} ld.global.nc.u16 {hr}, [{src}+{}]", 2 * el));
                hs.push(hr);
            }
            let w = b.r();
            b.op(format!("mov.b32 {w}, {{{}, {}}}", hs[0], hs[1]));
            words.push(w);
        }
        b.op(format!(
            "st.shared.v4.b32 [{dst}], {{{}}}",
            words.join(", ")
        ));
        b.place(&skip);
    }

    // Weights: tile_h rows × blocks × chunks_per_block chunks, chunk
    // fastest then row (consecutive threads read consecutive 16 bytes).
    let cpb = wt.chunks_per_block;
    let blocks = t.k_slice / wt.lp;
    let nw = t.tile_h * blocks * cpb;
    b.comment(format!(
        "w slice: {} rows x {} block(s) x {} chunk(s) of 16 bytes.",
        t.tile_h, blocks, cpb
    ));
    let nblocks = b.r();
    let tmp = b.r();
    b.op(format!("add.s32 {tmp}, {}, {}", cx.l, wt.lp - 1));
    b.op(format!("div.u32 {nblocks}, {tmp}, {}", wt.lp));
    let kb0 = b.r();
    b.op(format!("div.u32 {kb0}, {k0}, {}", wt.lp));
    for it in 0..nw.div_ceil(threads) {
        let i = b.r();
        b.op(format!("add.s32 {i}, {}, {}", cx.tid, it * threads));
        let skip = b.label("w_skip");
        if !nw.is_multiple_of(threads) {
            let p = b.pred();
            b.op(format!("setp.ge.u32 {p}, {i}, {nw}"));
            b.op(format!("@{p} bra {skip}"));
        }
        let (sub, rest, row, bb) = (b.r(), b.r(), b.r(), b.r());
        b.op(format!("rem.u32 {sub}, {i}, {cpb}"));
        b.op(format!("div.u32 {rest}, {i}, {cpb}"));
        b.op(format!("rem.u32 {row}, {rest}, {}", t.tile_h));
        b.op(format!("div.u32 {bb}, {rest}, {}", t.tile_h));
        let off = if wt.dequant == Dequant::None {
            let c = b.r();
            b.op(format!("mad.lo.s32 {c}, {bb}, {cpb}, {sub}"));
            swizzled(b, lay, &row, &c)
        } else {
            let (off, c) = (b.r(), b.r());
            b.op(format!("mad.lo.s32 {c}, {bb}, {cpb}, {sub}"));
            b.op(format!("shl.b32 {c}, {c}, 4"));
            b.op(format!("mad.lo.s32 {off}, {row}, {}, {c}", lay.w_row_bytes));
            off
        };
        let dst = b.r();
        b.op(format!("add.s32 {dst}, {base}, {}", off));
        b.op(format!("add.s32 {dst}, {dst}, {}", lay.x_stage_bytes));
        let (gh, kb) = (b.r(), b.r());
        b.op(format!("add.s32 {gh}, {}, {row}", cx.h0));
        b.op(format!("add.s32 {kb}, {kb0}, {bb}"));
        let (valid, bytes) = (b.pred(), b.r());
        b.op(format!("setp.lt.s32 {valid}, {gh}, {}", cx.h));
        b.op(format!("setp.lt.and.u32 {valid}, {kb}, {nblocks}, {valid}"));
        b.op(format!("selp.b32 {bytes}, 16, 0, {valid}"));
        let (idx, off64, src) = (b.r(), b.rd(), b.rd());
        b.op(format!("mad.lo.s32 {idx}, {kb}, {}, {gh}", cx.h));
        b.op(format!("mad.lo.s32 {idx}, {idx}, {cpb}, {sub}"));
        b.op(format!("selp.b32 {idx}, {idx}, 0, {valid}"));
        b.op(format!("mul.wide.u32 {off64}, {idx}, 16"));
        b.op(format!("add.s64 {src}, {}, {off64}", a.get("w")));
        b.op(format!(
            "cp.async.cg.shared.global [{dst}], [{src}], 16, {bytes}"
        ));
        b.place(&skip);
    }
}

/// Per m tile, the thread's rows g and g + 8: scale and offset (if any)
/// as f16x2 registers.
type GroupParams = Vec<[(String, Option<String>); 2]>;

/// Scale (and offset) of the thread's two rows (g, g + 8) of every m tile
/// for group `gi`, as f16x2 pairs `[m_tile][row]`.
fn params(
    b: &mut Body,
    plan: &MatmulPlan,
    t: &TiledPlan,
    lay: &MmaLayout,
    cx: &Ctx,
    a: &Args,
    gi: &str,
) -> GroupParams {
    let wt = &plan.weights;
    let mut out = Vec::new();
    for i in 0..lay.m_tiles {
        let mut rows: Vec<(String, Option<String>)> = Vec::new();
        for half in 0..2 {
            let gh = b.r();
            b.op(format!(
                "mad.lo.s32 {gh}, {}, {}, {}",
                cx.warp_h, t.hp, cx.h0
            ));
            b.op(format!("add.s32 {gh}, {gh}, {}", cx.g));
            b.op(format!("add.s32 {gh}, {gh}, {}", 16 * i + 8 * half));
            let (p, idx, off) = (b.pred(), b.r(), b.rd());
            b.op(format!("setp.lt.s32 {p}, {gh}, {}", cx.h));
            b.op(format!("mad.lo.s32 {idx}, {gi}, {}, {gh}", cx.h));
            let f16_params = wt.params == ParamType::F16;
            let param_bytes = if f16_params { 2 } else { 4 };
            b.op(format!("mul.wide.u32 {off}, {idx}, {param_bytes}"));
            let mut pair = |name: &str| {
                let addr = b.rd();
                let f = (!f16_params).then(|| b.f());
                let (hv, x2) = (b.h(), b.r());
                b.op(format!("add.s64 {addr}, {}, {off}", a.get(name)));
                if let Some(f) = f {
                    b.op(format!("mov.f32 {f}, 0f00000000"));
                    b.op(format!("@{p} ld.global.nc.f32 {f}, [{addr}]"));
                    b.op(format!("cvt.rn.f16.f32 {hv}, {f}"));
                } else {
                    b.op(format!("mov.b16 {hv}, 0"));
                    b.op(format!("@{p} ld.global.nc.b16 {hv}, [{addr}]"));
                }
                b.op(format!("mov.b32 {x2}, {{{hv}, {hv}}}"));
                x2
            };
            let s = pair("scales");
            let o = wt.has_offset.then(|| pair("offsets"));
            rows.push((s, o));
        }
        let second = rows.pop().expect("two rows");
        let first = rows.pop().expect("two rows");
        out.push([first, second]);
    }
    out
}

/// Two dequantized halves (k = 2t, 2t + 1 of an 8-group) of one weight
/// row from its code word(s), as f16x2 `v(q)`.
fn dequant_pair(b: &mut Body, dq: Dequant, word: &str, sel: &str, k: &DequantConsts) -> String {
    let (y, z, v) = (b.r(), b.r(), b.r());
    match dq {
        Dequant::MagicOr { .. } | Dequant::ShiftOr { .. } => {
            b.op(format!("prmt.b32 {y}, {word}, 0, {sel}"));
            b.op(format!("lop3.b32 {z}, {y}, 0x00F0000F, {}, 0xEA", k.or));
            b.op(format!("fma.rn.f16x2 {v}, {z}, {}, {}", k.mul, k.add));
        }
        Dequant::SignedByte => {
            b.op(format!("prmt.b32 {y}, {word}, {}, {sel}", k.or));
            b.op(format!("xor.b32 {z}, {y}, 0x00800080"));
            b.op(format!("sub.f16x2 {v}, {z}, {}", k.add));
        }
        Dequant::None => unreachable!("f16 weights are read with ldmatrix"),
    }
    v
}

/// The f16x2 constants of one dequantization (f16x2 operands must be
/// registers).
struct DequantConsts {
    or: String,
    mul: String,
    add: String,
}

impl DequantConsts {
    fn new(b: &mut Body, dq: Dequant) -> Option<DequantConsts> {
        let (or, mul, add) = match dq {
            // {1024 + n0, 1024 + 16·n1} · {1, 1/16} − {1024, 64} = {n0, n1};
            // u4sym's implied zero point subtracts 8 more from each.
            Dequant::MagicOr { half_sub, .. } => {
                let zero = half_sub - 1024.0;
                let minus = |v: f32| u32::from(half::f16::from_f32(-(v + zero)).to_bits());
                (
                    0x6400_6400,
                    0x2C00_3C00,
                    (minus(64.0) << 16) | minus(1024.0),
                )
            }
            // {2 + n0/512, 2 + n1/32} · {64, 4} − {126, 6} = 2 + n/8
            Dequant::ShiftOr { .. } => (0x4000_4000, 0x4400_5400, 0xC600_D7E0),
            // 0x64 above each byte; 1024 + (b + 128) − 1152 = b
            Dequant::SignedByte => (0x0064_0064, 0, 0x6480_6480),
            Dequant::None => return None,
        };
        b.comment("Dequantization constants (f16x2).");
        Some(DequantConsts {
            or: b.imm(or),
            mul: b.imm(mul),
            add: b.imm(add),
        })
    }
}

#[allow(clippy::too_many_arguments)]
fn compute_stage(
    b: &mut Body,
    plan: &MatmulPlan,
    t: &TiledPlan,
    lay: &MmaLayout,
    cx: &Ctx,
    a: &Args,
    base: &str,
    k0: &str,
    acc: &[Vec<[String; 4]>],
    row_params: Option<&GroupParams>,
) {
    let wt = &plan.weights;
    let wbase = b.r();
    b.op(format!("add.s32 {wbase}, {base}, {}", lay.x_stage_bytes));
    let consts = DequantConsts::new(b, wt.dequant);
    // The prmt selector for this thread's bytes (t of a 4-bit word, 2t and
    // 2t + 1 of an 8-bit one).
    let sel = match wt.dequant {
        Dequant::MagicOr { .. } | Dequant::ShiftOr { .. } => {
            let s = b.r();
            b.op(format!("mul.lo.s32 {s}, {}, 0x0101", cx.t4));
            b.op(format!("or.b32 {s}, {s}, 0x4040"));
            Some(s)
        }
        Dequant::SignedByte => {
            let (s, odd) = (b.r(), b.r());
            b.op(format!("and.b32 {odd}, {}, 1", cx.t4));
            b.op(format!("mad.lo.s32 {s}, {odd}, 0x0202, 0x6140"));
            Some(s)
        }
        Dequant::None => None,
    };
    let group_size = match wt.group {
        Some(Group::Size(g)) if wt.has_scale => Some(g),
        _ => None,
    };
    let mut stage_params = None;
    for s in 0..t.k_slice / 16 {
        let (p, u) = (s / 2, s % 2);
        // B fragments (x) of this k16 step: rows of e, chunks 2s, 2s + 1.
        let xaddr = b.r();
        b.op(format!(
            "add.s32 {xaddr}, {base}, {}",
            cx.x_frag[s as usize]
        ));
        let bfrag: Vec<[String; 2]> = (0..lay.n_tiles)
            .map(|j| {
                let regs: [String; 2] = std::array::from_fn(|_| b.r());
                b.op(format!(
                    "ldmatrix.sync.aligned.m8n8.x2.shared.b16 {{{}}}, [{xaddr}+{}]",
                    regs.join(", "),
                    8 * j * lay.row_chunks * 16
                ));
                regs
            })
            .collect();
        let waddr = b.r();
        if wt.dequant == Dequant::None {
            b.op(format!(
                "add.s32 {waddr}, {wbase}, {}",
                cx.w_frag[s as usize]
            ));
        } else {
            b.op(format!("add.s32 {waddr}, {wbase}, {}", cx.w_row));
        }
        {
            // Per-group parameters for this k16 step.
            let kparams = match (group_size, row_params) {
                (_, Some(rp)) => Some(rp.clone()),
                (Some(gs), None) => {
                    if gs.is_multiple_of(t.k_slice) {
                        if stage_params.is_none() {
                            let gi = b.r();
                            b.op(format!("div.u32 {gi}, {k0}, {gs}"));
                            stage_params = Some(params(b, plan, t, lay, cx, a, &gi));
                        }
                        stage_params.clone()
                    } else {
                        let gi = b.r();
                        b.op(format!("add.s32 {gi}, {k0}, {}", 16 * s));
                        b.op(format!("div.u32 {gi}, {gi}, {gs}"));
                        Some(params(b, plan, t, lay, cx, a, &gi))
                    }
                }
                (None, None) => None,
            };
            for i in 0..lay.m_tiles as usize {
                let afrag: [String; 4] = if wt.dequant == Dequant::None {
                    let regs: [String; 4] = std::array::from_fn(|_| b.r());
                    b.op(format!(
                        "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {{{}}}, [{waddr}+{}]",
                        regs.join(", "),
                        16 * i as u32 * lay.row_chunks * 16
                    ));
                    regs
                } else {
                    let sel = sel.as_deref().expect("quantized weights have a selector");
                    // a0a1: row g, k 2t..; a2a3: row g+8; a4a5, a6a7: k + 8.
                    let mut words: Vec<String> = Vec::new();
                    for (half, k8) in [(0usize, 0u32), (1, 0), (0, 1), (1, 1)] {
                        if wt.bits == 4 {
                            // 4-bit: word 2u + k8 of the row's 16-byte block p.
                            let wd = b.r();
                            b.op(format!(
                                "ld.shared.b32 {wd}, [{waddr}+{}]",
                                (16 * i as u32 + 8 * half as u32) * lay.w_row_bytes
                                    + 16 * p
                                    + 4 * (2 * u + k8)
                            ));
                            words.push(wd);
                        } else {
                            // 8-bit: word (16u + 8·k8 + 2t) / 4 of the row's 32 k.
                            let wd = b.r();
                            b.op(format!(
                                "ld.shared.b32 {wd}, [{waddr}+{}]",
                                (16 * i as u32 + 8 * half as u32) * lay.w_row_bytes
                                    + 32 * p
                                    + 16 * u
                                    + 8 * k8
                            ));
                            words.push(wd);
                        }
                    }
                    let mut regs: Vec<String> = Vec::new();
                    for (n, word) in words.iter().enumerate() {
                        let k = consts.as_ref().expect("quantized weights have constants");
                        let v = dequant_pair(b, wt.dequant, word, sel, k);
                        let half = [0usize, 1, 0, 1][n];
                        let wv = b.r();
                        match &kparams {
                            Some(ps) => {
                                let (s2, o2) = &ps[i][half];
                                match o2 {
                                    Some(o2) => b.op(format!("fma.rn.f16x2 {wv}, {v}, {s2}, {o2}")),
                                    None => b.op(format!("mul.rn.f16x2 {wv}, {v}, {s2}")),
                                }
                            }
                            None => b.op(format!("mov.b32 {wv}, {v}")),
                        }
                        regs.push(wv);
                    }
                    [
                        regs[0].clone(),
                        regs[1].clone(),
                        regs[2].clone(),
                        regs[3].clone(),
                    ]
                };
                for (j, bf) in bfrag.iter().enumerate() {
                    let c = &acc[i][j];
                    let (b0, b1) = (&bf[0], &bf[1]);
                    b.op(format!(
                        "{} {{{}}}, {{{}}}, {{{b0}, {b1}}}, {{{}}}",
                        MMA_M16N8K16_F16.name,
                        c.join(", "),
                        afrag.join(", "),
                        c.join(", ")
                    ));
                }
            }
        }
    }
}

fn epilogue(
    b: &mut Body,
    plan: &MatmulPlan,
    t: &TiledPlan,
    lay: &MmaLayout,
    cx: &Ctx,
    a: &Args,
    acc: &[Vec<[String; 4]>],
) {
    b.comment("Epilogue: C[h = g (+8)][e = 2t (+1)] of every tile, guarded.");
    let (hb, eb) = (b.r(), b.r());
    b.op(format!(
        "mad.lo.s32 {hb}, {}, {}, {}",
        cx.warp_h, t.hp, cx.h0
    ));
    b.op(format!("add.s32 {hb}, {hb}, {}", cx.g));
    b.op(format!(
        "mad.lo.s32 {eb}, {}, {}, {}",
        cx.warp_e, t.ep, cx.e0
    ));
    b.op(format!("mad.lo.s32 {eb}, {}, 2, {eb}", cx.t4));
    for i in 0..lay.m_tiles {
        for j in 0..lay.n_tiles {
            for k in 0..4u32 {
                let v = &acc[i as usize][j as usize][k as usize];
                let (gh, ge, p) = (b.r(), b.r(), b.pred());
                b.op(format!("add.s32 {gh}, {hb}, {}", 16 * i + 8 * (k / 2)));
                b.op(format!("add.s32 {ge}, {eb}, {}", 8 * j + k % 2));
                b.op(format!("setp.lt.s32 {p}, {gh}, {}", cx.h));
                b.op(format!("setp.lt.and.s32 {p}, {ge}, {}, {p}", cx.e));
                if plan.bias {
                    let (off, addr, bv) = (b.rd(), b.rd(), b.f());
                    b.op(format!("mul.wide.s32 {off}, {gh}, 4"));
                    b.op(format!("add.s64 {addr}, {}, {off}", a.get("bias")));
                    b.op(format!("mov.f32 {bv}, 0f00000000"));
                    b.op(format!("@{p} ld.global.nc.f32 {bv}, [{addr}]"));
                    b.op(format!("add.f32 {v}, {v}, {bv}"));
                }
                activation(b, plan.activation, v);
                let (idx, off, addr) = (b.r(), b.rd(), b.rd());
                b.op(format!("mad.lo.s32 {idx}, {ge}, {}, {gh}", cx.h));
                if plan.y_format == tessera_dsl::Format::F16 {
                    let hv = b.h();
                    b.op(format!("mul.wide.s32 {off}, {idx}, 2"));
                    b.op(format!("add.s64 {addr}, {}, {off}", a.get("y")));
                    b.op(format!("cvt.rn.f16.f32 {hv}, {v}"));
                    b.op(format!("@{p} st.global.b16 [{addr}], {hv}"));
                } else {
                    b.op(format!("mul.wide.s32 {off}, {idx}, 4"));
                    b.op(format!("add.s64 {addr}, {}, {off}", a.get("y")));
                    b.op(format!("@{p} st.global.f32 [{addr}], {v}"));
                }
            }
        }
    }
}
