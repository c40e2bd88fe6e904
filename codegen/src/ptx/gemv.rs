//! The GEMV on CUDA cores (FlashDecoding++ section 5, FastGEMV style) for
//! a [`GemvPlan`]: the OpenCL GEMV's mapping, printed as PTX.
//!
//! Block `(wg_h, k_lanes)`: thread `(x, y)` owns the `channels` output
//! channels `h = ctaid.x·wg_h·channels + x + j·wg_h` of the `rows` rows
//! `e = ctaid.z·rows + r` (one for the GEMV; the flat GEMM's batch rows,
//! [`crate::gpu::ptx_flat_rows`], so each weight chunk is loaded once for
//! all of them) and strides over the 128-bit weight chunks `c = y, y +
//! k_lanes, ...` of l, each chunk's loads (every channel's codes and group
//! parameters, then the activations, a row ahead) issued before its
//! math. The activations are converted
//! to f32 and summed once per chunk for all the thread's channels (the
//! instructions a 4-bit weight costs are what bound this kernel). Per
//! chunk and channel: one
//! `ld.global.nc.v4.u32` of codes, the matching activations (`v4` loads
//! when whole and aligned, guarded 16-bit loads at the tail), every code
//! turned into an f32 `v(q)` with bit operations, then `fma.rn.f32`:
//!
//! | format | per 8 codes (one 32-bit word) | per code |
//! |---|---|---|
//! | u4asym | `(word << 3)` and `(word >> 1)`, `lop3` (& 0x78787878): v' = 2 + q/8, with `8s` and `o − 16s` applied per chunk | `prmt` under 0x40000000 |
//! | e0m4 | `(word << 3)` and `(word >> 1)`, `lop3` (& 0x78787878) | `prmt` under 0x40000000 (= `0x40000000 \| n << 19`) |
//! | i8 | | `bfe.s32`, `cvt.rn.f32.s32` |
//! | f16 | | `cvt.f32.f16` |
//!
//! `acc += scale·Σ x·v + offset·Σ x` per chunk (one group holds whole
//! chunks). Lanes of one h that share a warp (`32 / wg_h` of them when
//! `wg_h < 32`) are reduced with `shfl.sync.bfly`, the warps' partials in
//! shared memory; thread `y = 0` adds bias, applies the activation and
//! stores.

use tessera_dsl::{Activation, Format, Group, ParamType};

use super::writer::{Body, f32_lit};
use super::{Args, Limits, Sm, module};
use crate::gpu::{Dequant, GemvPlan, MatmulPlan};

/// Lanes of one h in one warp (reduced by shuffles), given the plan.
pub fn warp_lanes(g: &GemvPlan, warp: u32) -> u32 {
    if g.wg_h < warp && warp.is_multiple_of(g.wg_h) && g.k_lanes.is_multiple_of(warp / g.wg_h) {
        warp / g.wg_h
    } else {
        1
    }
}

/// The program text.
pub fn print(plan: &MatmulPlan, g: &GemvPlan, sm: Sm, header: &str) -> String {
    print_at(plan, g, sm, header, sm.caps().registers)
}

/// [`print()`] under a register limit of `max_registers` (`.maxnreg`) in
/// place of the target's (for measuring occupancy against spills).
pub fn print_at(
    plan: &MatmulPlan,
    g: &GemvPlan,
    sm: Sm,
    header: &str,
    max_registers: u32,
) -> String {
    let warp = sm.caps().gpu.map_or(32, |c| c.warp_width);
    let wt = &plan.weights;
    let epl = wt.elems_per_load;
    let channels = g.channels.max(1);
    let rows = g.rows.max(1);
    let lanes_per_warp = warp_lanes(g, warp);
    let partials = g.k_lanes / lanes_per_warp;
    let red = format!("{}_red", plan.entry);
    let mut b = Body::new();
    let a = Args::load(&mut b, &plan.entry, &plan.args);
    let (h, l) = (a.get("h").to_string(), a.get("l").to_string());

    b.comment(format!(
        "Thread (x, y): output channels h0 + x + j*{} (j < {channels}), lane y of l; row ei.",
        g.wg_h
    ));
    let (tx, ty, cx, cz) = (b.r(), b.r(), b.r(), b.r());
    b.op(format!("mov.u32 {tx}, %tid.x"));
    b.op(format!("mov.u32 {ty}, %tid.y"));
    b.op(format!("mov.u32 {cx}, %ctaid.x"));
    b.op(format!("mov.u32 {cz}, %ctaid.z"));
    // Channel j of this thread and whether it is past h; channel 0 past h
    // means all are, and the thread only joins the reduction.
    let mut his = Vec::new();
    let mut outs = Vec::new();
    for j in 0..channels {
        let (hj, oj) = (b.r(), b.pred());
        b.op(format!(
            "mad.lo.s32 {hj}, {cx}, {}, {tx}",
            g.wg_h * channels
        ));
        if j > 0 {
            b.op(format!("add.s32 {hj}, {hj}, {}", j * g.wg_h));
        }
        b.op(format!("setp.ge.s32 {oj}, {hj}, {h}"));
        his.push(hj);
        outs.push(oj);
    }
    // accs[r][j]: row r of this thread's rows of e, channel j.
    let accs: Vec<Vec<String>> = (0..rows)
        .map(|_| (0..channels).map(|_| b.f()).collect())
        .collect();
    for acc in accs.iter().flatten() {
        b.op(format!("mov.f32 {acc}, 0f00000000"));
    }
    let done = b.label("lanes_done");
    b.op(format!("@{} bra {done}", outs[0]));

    // Row r of e: e_r = ctaid.z·rows + r; its activations x + min(e_r,
    // e − 1)·l halves (a row past e recomputes the last and stores
    // nothing).
    // One row (the GEMV): e_r = ctaid.z, always below e.
    let e = a.get("e").to_string();
    let e0 = if rows == 1 {
        cz.clone()
    } else {
        let e0 = b.r();
        b.op(format!("mul.lo.s32 {e0}, {cz}, {rows}"));
        e0
    };
    let elast = (rows > 1).then(|| {
        let elast = b.r();
        b.op(format!("sub.s32 {elast}, {e}, 1"));
        elast
    });
    let row_ptrs: Vec<String> = (0..rows)
        .map(|r| {
            let er = match &elast {
                None => e0.clone(),
                Some(elast) => {
                    let er = b.r();
                    b.op(format!("add.s32 {er}, {e0}, {r}"));
                    b.op(format!("min.s32 {er}, {er}, {elast}"));
                    er
                }
            };
            let (eil, rowoff, row) = (b.r(), b.rd(), b.rd());
            b.op(format!("mul.lo.s32 {eil}, {er}, {l}"));
            b.op(format!("mul.wide.s32 {rowoff}, {eil}, 2"));
            b.op(format!("add.s64 {row}, {}, {rowoff}", a.get("x")));
            row
        })
        .collect();
    let chunks = b.r();
    let tmp = b.r();
    b.op(format!("add.s32 {tmp}, {l}, {}", epl - 1));
    b.op(format!("div.s32 {chunks}, {tmp}, {epl}"));
    // Activations are 16-byte aligned for v4 loads only when l % 8 == 0.
    let aligned = b.pred();
    let l7 = b.r();
    b.op(format!("and.b32 {l7}, {l}, 7"));
    b.op(format!("setp.eq.s32 {aligned}, {l7}, 0"));
    let c = b.r();
    b.op(format!("mov.u32 {c}, {ty}"));

    let top = b.label("chunk");
    let bottom = b.label("chunk_end");
    b.place(&top);
    let pend = b.pred();
    b.op(format!("setp.ge.s32 {pend}, {c}, {chunks}"));
    b.op(format!("@{pend} bra {bottom}"));
    // Every channel's codes and group parameters, then the activations,
    // all issued before the math; the activations are converted (and
    // summed, for the offsets) once for all channels.
    let weights: Vec<ChannelWeights> = (0..channels as usize)
        .map(|j| {
            let guard = (j > 0).then_some(outs[j].as_str());
            load_weights(&mut b, &a, plan, &c, &his[j], guard)
        })
        .collect();
    // Several rows: a whole, aligned chunk takes the word-major path
    // (each word of codes decoded once for every row); the tail chunk
    // takes the row-by-row path below.
    let chunk_done = (rows > 1).then(|| b.label("chunk_rows_done"));
    if let Some(chunk_done) = &chunk_done {
        let per_row = b.label("chunk_row_by_row");
        let (l0, lend, whole) = (b.r(), b.r(), b.pred());
        b.op(format!("mul.lo.s32 {l0}, {c}, {epl}"));
        b.op(format!("add.s32 {lend}, {l0}, {epl}"));
        b.op(format!("setp.le.and.s32 {whole}, {lend}, {l}, {aligned}"));
        b.op(format!("@!{whole} bra {per_row}"));
        word_major_rows(
            &mut b,
            plan,
            &weights,
            &row_ptrs,
            &l0,
            &accs,
            &RowsExact {
                a: &a,
                c: &c,
                aligned: &aligned,
            },
        );
        b.op(format!("bra {chunk_done}"));
        b.place(&per_row);
    }
    // Row by row; the weights, loaded once, serve every row.
    // (Several rows take this path for the tail chunk only: one row's
    // activations live at a time.)
    let ahead = rows == 1;
    let mut next_x = ahead.then(|| load_x(&mut b, &a, plan, &c, &row_ptrs[0], &aligned));
    for r in 0..rows as usize {
        let xw = match next_x.take() {
            Some(xw) => xw,
            None => load_x(&mut b, &a, plan, &c, &row_ptrs[r], &aligned),
        };
        if ahead && r + 1 < rows as usize {
            next_x = Some(load_x(&mut b, &a, plan, &c, &row_ptrs[r + 1], &aligned));
        }
        let (xf, sx) = convert_x(&mut b, plan, &xw);
        // The math through Σx cancels infinities against each other (inf −
        // inf); where Σx is not finite (an infinite or NaN activation in
        // the chunk) the chunk takes the exact path, x·w element by
        // element, and its outputs are what the interpreter's are.
        let exact = sx.as_ref().map(|sx| {
            let (below, finite) = (b.pred(), b.pred());
            b.op(format!("setp.lt.f32 {below}, {sx}, 0f7F800000"));
            b.op(format!(
                "setp.gt.and.f32 {finite}, {sx}, 0fFF800000, {below}"
            ));
            let label = b.label("chunk_exact");
            b.op(format!("@!{finite} bra {label}"));
            label
        });
        for (w, acc) in weights.iter().zip(&accs[r]) {
            channel_math(&mut b, plan, w, &xf, sx.as_deref(), acc);
        }
        if let Some(label) = exact {
            let joined = b.label("chunk_math_end");
            b.op(format!("bra {joined}"));
            b.place(&label);
            for (w, acc) in weights.iter().zip(&accs[r]) {
                exact_channel_math(&mut b, plan, w, &xf, acc);
            }
            b.place(&joined);
        }
    }
    if let Some(chunk_done) = &chunk_done {
        b.place(chunk_done);
    }
    b.op(format!("add.s32 {c}, {c}, {}", g.k_lanes));
    b.op(format!("bra.uni {top}"));
    b.place(&bottom);
    b.place(&done);

    // Every thread of the block reaches here (shfl.sync needs the full warp).
    if lanes_per_warp > 1 {
        b.comment(format!(
            "{lanes_per_warp} lanes of each h share a warp: butterfly over lane bits {}..{}.",
            g.wg_h.ilog2(),
            warp.ilog2() - 1
        ));
        for acc in accs.iter().flatten() {
            let mut off = g.wg_h;
            while off < warp {
                let t = b.f();
                b.op(format!(
                    "shfl.sync.bfly.b32 {t}, {acc}, {off}, 31, 0xffffffff"
                ));
                b.op(format!("add.f32 {acc}, {acc}, {t}"));
                off *= 2;
            }
        }
    }
    // Partial of channel j from warp row ywarp → red[(j·partials + ywarp)·wg_h + x].
    let slot = b.r();
    let ywarp = b.r();
    b.op(format!("shr.u32 {ywarp}, {ty}, {}", lanes_per_warp.ilog2()));
    b.op(format!("mad.lo.s32 {slot}, {ywarp}, {}, {tx}", g.wg_h));
    let sa = b.r();
    let redaddr = b.r();
    b.op(format!("mov.u32 {redaddr}, {red}"));
    b.op(format!("mad.lo.s32 {sa}, {slot}, 4, {redaddr}"));
    let writer = b.pred();
    let ylow = b.r();
    b.op(format!("and.b32 {ylow}, {ty}, {}", lanes_per_warp - 1));
    b.op(format!("setp.eq.s32 {writer}, {ylow}, 0"));
    // Slot of (row r, channel j): red[((r·channels + j)·partials + ywarp)·wg_h + x].
    for (k, acc) in accs.iter().flatten().enumerate() {
        b.op(format!(
            "@{writer} st.shared.f32 [{sa}+{}], {acc}",
            4 * k as u32 * partials * g.wg_h
        ));
    }
    b.op("bar.sync 0");
    let first = b.pred();
    b.op(format!("setp.eq.s32 {first}, {ty}, 0"));
    let exit = b.label("exit");
    b.op(format!("@!{first} bra {exit}"));
    let xa = b.r();
    b.op(format!("mad.lo.s32 {xa}, {tx}, 4, {redaddr}"));
    for (k, (r, j)) in (0..rows)
        .flat_map(|r| (0..channels as usize).map(move |j| (r, j)))
        .enumerate()
    {
        let hj = &his[j];
        let skip = b.label("channel_stored");
        b.op(format!("@{} bra {skip}", outs[j]));
        let er = if rows == 1 {
            e0.clone()
        } else {
            let (er, past) = (b.r(), b.pred());
            b.op(format!("add.s32 {er}, {e0}, {r}"));
            b.op(format!("setp.ge.s32 {past}, {er}, {e}"));
            b.op(format!("@{past} bra {skip}"));
            er
        };
        let base = 4 * k as u32 * partials * g.wg_h;
        let total = b.f();
        b.op(format!("ld.shared.f32 {total}, [{xa}+{base}]"));
        for k in 1..partials {
            let t = b.f();
            b.op(format!(
                "ld.shared.f32 {t}, [{xa}+{}]",
                base + 4 * k * g.wg_h
            ));
            b.op(format!("add.f32 {total}, {total}, {t}"));
        }
        if plan.bias {
            let (bo, ba, bv) = (b.rd(), b.rd(), b.f());
            b.op(format!("mul.wide.s32 {bo}, {hj}, 4"));
            b.op(format!("add.s64 {ba}, {}, {bo}", a.get("bias")));
            b.op(format!("ld.global.nc.f32 {bv}, [{ba}]"));
            b.op(format!("add.f32 {total}, {total}, {bv}"));
        }
        activation(&mut b, plan.activation, &total);
        let yi = b.r();
        b.op(format!("mad.lo.s32 {yi}, {er}, {h}, {hj}"));
        store_y(&mut b, plan.y_format, a.get("y"), &yi, &total);
        b.place(&skip);
    }
    b.place(&exit);
    b.op("ret");

    let decls = vec![format!(
        ".shared .align 4 .f32 {red}[{}];",
        partials * g.wg_h * channels * rows
    )];
    module(
        sm,
        header,
        &plan.entry,
        &plan.args,
        Limits {
            reqntid: [g.wg_h, g.k_lanes, 1],
            maxnreg: max_registers,
        },
        &decls,
        b,
    )
}

/// One channel's loaded codes (four words) and group parameters.
struct ChannelWeights {
    words: Vec<String>,
    params: Option<(String, Option<String>)>,
}

/// Issue one channel's loads of chunk `c`: its 128-bit codes and group
/// parameters. Under `guard` (a channel past h) nothing is loaded and the
/// registers stay 0, so the channel adds 0 (its scale and offset are 0).
fn load_weights(
    b: &mut Body,
    a: &Args,
    plan: &MatmulPlan,
    c: &str,
    hi: &str,
    guard: Option<&str>,
) -> ChannelWeights {
    let wt = &plan.weights;
    let epl = wt.elems_per_load;
    let h = a.get("h").to_string();
    let pred = guard.map_or(String::new(), |p| format!("@!{p} "));
    let waddr = chunk_addr(b, a, plan, c, hi);
    let words: Vec<String> = (0..4).map(|_| b.r()).collect();
    b.comment("One 128-bit load of weight codes.");
    if guard.is_some() {
        for w in &words {
            b.op(format!("mov.b32 {w}, 0"));
        }
    }
    b.op(format!(
        "{pred}ld.global.nc.v4.u32 {{{}}}, [{waddr}]",
        words.join(", ")
    ));
    // The chunk's group parameters, loaded with its codes so both round
    // trips overlap (not after the math).
    let params = wt.has_scale.then(|| {
        let (l0, gi) = (b.r(), b.r());
        b.op(format!("mul.lo.s32 {l0}, {c}, {epl}"));
        match wt.group {
            Some(Group::Size(gs)) if gs.is_power_of_two() => {
                b.op(format!("shr.u32 {gi}, {l0}, {}", gs.ilog2()));
                b.op(format!("mad.lo.s32 {gi}, {gi}, {h}, {hi}"));
            }
            Some(Group::Size(gs)) => {
                b.op(format!("div.u32 {gi}, {l0}, {gs}"));
                b.op(format!("mad.lo.s32 {gi}, {gi}, {h}, {hi}"));
            }
            _ => b.op(format!("mov.u32 {gi}, {hi}")),
        }
        let goff = b.rd();
        let f16_params = wt.params == ParamType::F16;
        let param_bytes = if f16_params { 2 } else { 4 };
        b.op(format!("mul.wide.u32 {goff}, {gi}, {param_bytes}"));
        let mut load = |base: &str| {
            let (addr, v) = (b.rd(), b.f());
            b.op(format!("add.s64 {addr}, {base}, {goff}"));
            if guard.is_some() {
                b.op(format!("mov.f32 {v}, 0f00000000"));
            }
            if f16_params {
                // An f16 parameter (ggml's block scales) widened where read.
                let hv = b.h();
                if guard.is_some() {
                    b.op(format!("mov.b16 {hv}, 0"));
                }
                b.op(format!("{pred}ld.global.nc.b16 {hv}, [{addr}]"));
                b.op(format!("cvt.f32.f16 {v}, {hv}"));
            } else {
                b.op(format!("{pred}ld.global.nc.f32 {v}, [{addr}]"));
            }
            v
        };
        let scale = load(a.get("scales"));
        let offset = wt.has_offset.then(|| load(a.get("offsets")));
        (scale, offset)
    });
    ChannelWeights { words, params }
}

/// The address of output channel `hi`'s 16-byte chunk `c`: chunk index
/// `((c / cpb)·h + hi)·cpb + c % cpb`.
fn chunk_addr(b: &mut Body, a: &Args, plan: &MatmulPlan, c: &str, hi: &str) -> String {
    let cpb = plan.weights.chunks_per_block;
    let (blk, sub, idx) = (b.r(), b.r(), b.r());
    b.op(format!("shr.u32 {blk}, {c}, {}", cpb.ilog2()));
    b.op(format!("and.b32 {sub}, {c}, {}", cpb - 1));
    b.op(format!("mad.lo.s32 {idx}, {blk}, {}, {hi}", a.get("h")));
    b.op(format!("mad.lo.s32 {idx}, {idx}, {cpb}, {sub}"));
    let (woff, waddr) = (b.rd(), b.rd());
    b.op(format!("mul.wide.u32 {woff}, {idx}, 16"));
    b.op(format!("add.s64 {waddr}, {}, {woff}", a.get("w")));
    waddr
}

/// Issue the loads of chunk `c`'s activations: `epl` halves from `row`
/// as `epl / 2` words (`v4` loads when whole and aligned, guarded halves
/// otherwise, zero past l).
fn load_x(
    b: &mut Body,
    a: &Args,
    plan: &MatmulPlan,
    c: &str,
    row: &str,
    aligned: &str,
) -> Vec<String> {
    let epl = plan.weights.elems_per_load;
    let l = a.get("l").to_string();
    let l0 = b.r();
    b.op(format!("mul.lo.s32 {l0}, {c}, {epl}"));
    let xw: Vec<String> = (0..epl / 2).map(|_| b.r()).collect();
    let (xoff, xaddr) = (b.rd(), b.rd());
    b.op(format!("mul.wide.s32 {xoff}, {l0}, 2"));
    b.op(format!("add.s64 {xaddr}, {row}, {xoff}"));
    let whole = b.pred();
    let lend = b.r();
    b.op(format!("add.s32 {lend}, {l0}, {epl}"));
    b.op(format!("setp.le.and.s32 {whole}, {lend}, {l}, {aligned}"));
    let slow = b.label("x_tail");
    let joined = b.label("x_ready");
    b.op(format!("@!{whole} bra {slow}"));
    for q in 0..epl / 8 {
        let regs = &xw[4 * q as usize..4 * q as usize + 4];
        b.op(format!(
            "ld.global.nc.v4.u32 {{{}}}, [{xaddr}+{}]",
            regs.join(", "),
            16 * q
        ));
    }
    b.op(format!("bra.uni {joined}"));
    b.place(&slow);
    b.comment("Tail (or unaligned rows): halves one by one, zero past l.");
    for i in 0..epl / 2 {
        let mut halves = Vec::new();
        for k in 0..2 {
            let e = 2 * i + k;
            let hreg = b.h();
            let p = b.pred();
            let li = b.r();
            b.op(format!("mov.b16 {hreg}, 0"));
            b.op(format!("add.s32 {li}, {l0}, {e}"));
            b.op(format!("setp.lt.s32 {p}, {li}, {l}"));
            b.op(format!("@{p} ld.global.nc.u16 {hreg}, [{xaddr}+{}]", 2 * e));
            halves.push(hreg);
        }
        b.op(format!(
            "mov.b32 {}, {{{}, {}}}",
            xw[i as usize], halves[0], halves[1]
        ));
    }
    b.place(&joined);
    xw
}

/// Whether a chunk's math needs `Σ x`: for the offsets (`offset·Σ x`), and
/// for 4-bit codes read as `v' = 2 + q/8` ([`channel_math`]).
fn needs_x_sum(plan: &MatmulPlan) -> bool {
    plan.weights.has_offset || matches!(plan.weights.dequant, Dequant::MagicOr { .. })
}

/// `v' = 2 + q/8` for a 4-bit code q: the code under an exponent of 1
/// (`0x40000000 | q << 19`, E0M4's bit operations), so `q = 8·v' − 16`.
const U4_AS_SHIFT_OR: Dequant = Dequant::ShiftOr {
    half_base: 0x4000,
    half_shift: 6,
    float_base: 0x4000_0000,
    float_shift: 19,
};

/// The chunk's activations as f32, in l order, and their sum when the
/// math needs it ([`needs_x_sum`]); shared by every channel.
fn convert_x(b: &mut Body, plan: &MatmulPlan, xw: &[String]) -> (Vec<String>, Option<String>) {
    let mut xf = Vec::with_capacity(2 * xw.len());
    for w in xw {
        let (h0, h1) = (b.h(), b.h());
        b.op(format!("mov.b32 {{{h0}, {h1}}}, {w}"));
        for hh in [h0, h1] {
            let f = b.f();
            b.op(format!("cvt.f32.f16 {f}, {hh}"));
            xf.push(f);
        }
    }
    let sx = needs_x_sum(plan).then(|| {
        let sx = b.f();
        b.op(format!("mov.f32 {sx}, 0f00000000"));
        for f in &xf {
            b.op(format!("add.f32 {sx}, {sx}, {f}"));
        }
        sx
    });
    (xf, sx)
}

/// One channel's `acc += scale·Σ x·v + offset·Σ x` (or `Σ x·v`).
fn channel_math(
    b: &mut Body,
    plan: &MatmulPlan,
    w: &ChannelWeights,
    xf: &[String],
    sx: Option<&str>,
    acc: &str,
) {
    let wt = &plan.weights;
    // 4-bit codes are read as v' = 2 + q/8 (two bit operations per word of
    // eight codes, one `prmt` per code, no subtraction), so
    // Σ x·v = 8·Σ x·v' − 16·Σ x: acc += 8s·Σ x·v' + (o − 16s)·Σ x. The
    // cancellation costs about 2^-19·s·Σ|x|, far under f16 output
    // precision; the `sub` per code it saves was a fifth of the kernel's
    // instructions.
    let (dq, stretch) = chunk_dequant(plan);
    let dot = b.f();
    b.op(format!("mov.f32 {dot}, 0f00000000"));
    // v(q) word by word, each word's values used at once, so a word's
    // values are all that is live beside the activations.
    let per_word = (wt.elems_per_load as usize / w.words.len()) as u32;
    for (k, word) in w.words.iter().enumerate() {
        let v = dequant(b, dq, std::slice::from_ref(word), per_word);
        for (xi, vi) in xf[k * per_word as usize..].iter().zip(&v) {
            b.op(format!("fma.rn.f32 {dot}, {xi}, {vi}, {dot}"));
        }
    }
    apply_dot(b, w, stretch, &dot, sx, acc);
}

/// `acc += scale·dot + offset·Σx` for one channel's chunk (with the 4-bit
/// stretch: `acc += α·s·dot + (β·s + o)·Σx`).
fn apply_dot(
    b: &mut Body,
    w: &ChannelWeights,
    stretch: Option<(f32, f32)>,
    dot: &str,
    sx: Option<&str>,
    acc: &str,
) {
    match (&w.params, stretch) {
        (Some((scale, offset)), Some((alpha, beta))) => {
            // t = α·s, u = β·s + o: acc += t·Σ x·v' + u·Σ x.
            let (t, u) = (b.f(), b.f());
            b.op(format!("mul.f32 {t}, {scale}, {}", f32_lit(alpha)));
            match offset {
                Some(o) => b.op(format!("fma.rn.f32 {u}, {scale}, {}, {o}", f32_lit(beta))),
                None => b.op(format!("mul.f32 {u}, {scale}, {}", f32_lit(beta))),
            }
            b.op(format!("fma.rn.f32 {acc}, {t}, {dot}, {acc}"));
            if let Some(sx) = sx {
                b.op(format!("fma.rn.f32 {acc}, {u}, {sx}, {acc}"));
            }
        }
        (Some((scale, offset)), None) => {
            b.op(format!("fma.rn.f32 {acc}, {scale}, {dot}, {acc}"));
            if let (Some(o), Some(sx)) = (offset, sx) {
                b.op(format!("fma.rn.f32 {acc}, {o}, {sx}, {acc}"));
            }
        }
        (None, _) => b.op(format!("add.f32 {acc}, {acc}, {dot}")),
    }
}

/// What the word-major path needs to redo a row exactly.
struct RowsExact<'a> {
    a: &'a Args,
    c: &'a str,
    aligned: &'a str,
}

/// A whole chunk for every row, word-major: every row's activations of a
/// word are loaded (one 4-, 8- or 16-byte load per row) and converted
/// once for all channels, then each channel's word of codes is decoded
/// once and meets every row, summed into per-(row, channel) dots; then each row's dots
/// go into its accumulators, or, where its Σx is not finite, the row's
/// chunk is redone element by element ([`exact_channel_math`]).
#[allow(clippy::too_many_arguments)]
fn word_major_rows(
    b: &mut Body,
    plan: &MatmulPlan,
    weights: &[ChannelWeights],
    row_ptrs: &[String],
    l0: &str,
    accs: &[Vec<String>],
    ex: &RowsExact<'_>,
) {
    let (dq, stretch) = chunk_dequant(plan);
    let words = weights[0].words.len();
    let per_word = plan.weights.elems_per_load / words as u32;
    let x_sum = needs_x_sum(plan);
    let rows = row_ptrs.len();
    let dots: Vec<Vec<String>> = (0..rows)
        .map(|_| weights.iter().map(|_| b.f()).collect())
        .collect();
    for d in dots.iter().flatten() {
        b.op(format!("mov.f32 {d}, 0f00000000"));
    }
    let sums: Vec<String> = (0..rows).map(|_| b.f()).collect();
    if x_sum {
        for sx in &sums {
            b.op(format!("mov.f32 {sx}, 0f00000000"));
        }
    }
    // This chunk's activations start l0 halves into each row.
    let xoff = b.rd();
    b.op(format!("mul.wide.s32 {xoff}, {l0}, 2"));
    let row_at: Vec<String> = row_ptrs
        .iter()
        .map(|row| {
            let at = b.rd();
            b.op(format!("add.s64 {at}, {row}, {xoff}"));
            at
        })
        .collect();
    b.comment(format!(
        "Word-major: {words} words of {per_word} codes, each decoded once for {rows} rows."
    ));
    for k in 0..words {
        // Every row's activations of word k, converted once for all
        // channels; then each channel's word decoded and met by every row.
        let mut xfs = Vec::with_capacity(rows);
        for r in 0..rows {
            // per_word halves of row r: one load of 2·per_word bytes.
            let xw: Vec<String> = (0..per_word / 2).map(|_| b.r()).collect();
            let at = 2 * per_word * k as u32;
            let ty = match xw.len() {
                1 => format!("ld.global.nc.u32 {}, [{}+{at}]", xw[0], row_at[r]),
                n => format!(
                    "ld.global.nc.v{n}.u32 {{{}}}, [{}+{at}]",
                    xw.join(", "),
                    row_at[r]
                ),
            };
            b.op(ty);
            let mut xf = Vec::with_capacity(per_word as usize);
            for w in &xw {
                let (h0, h1) = (b.h(), b.h());
                b.op(format!("mov.b32 {{{h0}, {h1}}}, {w}"));
                for hh in [h0, h1] {
                    let f = b.f();
                    b.op(format!("cvt.f32.f16 {f}, {hh}"));
                    if x_sum {
                        b.op(format!("add.f32 {}, {}, {f}", sums[r], sums[r]));
                    }
                    xf.push(f);
                }
            }
            xfs.push(xf);
        }
        for (j, w) in weights.iter().enumerate() {
            let v = dequant(b, dq, std::slice::from_ref(&w.words[k]), per_word);
            for (xf, dots) in xfs.iter().zip(&dots) {
                for (xi, vi) in xf.iter().zip(&v) {
                    b.op(format!("fma.rn.f32 {}, {xi}, {vi}, {}", dots[j], dots[j]));
                }
            }
        }
    }
    for r in 0..rows {
        let next = b.label("row_applied");
        if x_sum {
            // As on the row-by-row path: a non-finite Σx takes the exact path.
            let (below, finite) = (b.pred(), b.pred());
            let sx = &sums[r];
            b.op(format!("setp.lt.f32 {below}, {sx}, 0f7F800000"));
            b.op(format!(
                "setp.gt.and.f32 {finite}, {sx}, 0fFF800000, {below}"
            ));
            let fast = b.label("row_fast");
            b.op(format!("@{finite} bra {fast}"));
            let xw = load_x(b, ex.a, plan, ex.c, &row_ptrs[r], ex.aligned);
            let (xf, _) = convert_x(b, plan, &xw);
            for (w, acc) in weights.iter().zip(&accs[r]) {
                exact_channel_math(b, plan, w, &xf, acc);
            }
            b.op(format!("bra {next}"));
            b.place(&fast);
        }
        for ((w, dot), acc) in weights.iter().zip(&dots[r]).zip(&accs[r]) {
            let sx = x_sum.then_some(sums[r].as_str());
            apply_dot(b, w, stretch, dot, sx, acc);
        }
        b.place(&next);
    }
}

/// The dequantization [`channel_math`] uses (4-bit codes read as `v' = 2 +
/// q/8`), and its stretch `(α, β)`: `q = α·v' + β`.
fn chunk_dequant(plan: &MatmulPlan) -> (Dequant, Option<(f32, f32)>) {
    match plan.weights.dequant {
        // A magic subtraction past 2^23 is u4sym's implied zero point
        // (q − 8): it moves β by as much.
        Dequant::MagicOr { float_sub, .. } => (
            U4_AS_SHIFT_OR,
            Some((8.0f32, -16.0f32 - (float_sub - 8_388_608.0))),
        ),
        other => (other, None),
    }
}

/// One channel's `acc += Σ x·w` with `w = scale·v + offset` formed per
/// element as the interpreter forms it (a multiply, then an add), so
/// infinities meet weights, not each other: the path of a chunk whose Σx
/// is not finite.
fn exact_channel_math(
    b: &mut Body,
    plan: &MatmulPlan,
    w: &ChannelWeights,
    xf: &[String],
    acc: &str,
) {
    let (dq, stretch) = chunk_dequant(plan);
    let per_word = (plan.weights.elems_per_load as usize / w.words.len()) as u32;
    for (k, word) in w.words.iter().enumerate() {
        let v = dequant(b, dq, std::slice::from_ref(word), per_word);
        for (xi, vi) in xf[k * per_word as usize..].iter().zip(&v) {
            // q = α·v' + β is exact (v' = 2 + q/8).
            let q = match stretch {
                Some((alpha, beta)) => {
                    let q = b.f();
                    b.op(format!(
                        "fma.rn.f32 {q}, {vi}, {}, {}",
                        f32_lit(alpha),
                        f32_lit(beta)
                    ));
                    q
                }
                None => vi.clone(),
            };
            let wi = match &w.params {
                Some((scale, offset)) => {
                    let wi = b.f();
                    b.op(format!("mul.rn.f32 {wi}, {scale}, {q}"));
                    if let Some(o) = offset {
                        b.op(format!("add.rn.f32 {wi}, {wi}, {o}"));
                    }
                    wi
                }
                None => q,
            };
            b.op(format!("fma.rn.f32 {acc}, {xi}, {wi}, {acc}"));
        }
    }
}

/// `v(q)` as f32 registers for the `epl` codes of one 128-bit chunk held
/// in `words`, in l order.
fn dequant(b: &mut Body, dq: Dequant, words: &[String], epl: u32) -> Vec<String> {
    let mut out = Vec::new();
    match dq {
        Dequant::None => {
            for w in words {
                let (h0, h1) = (b.h(), b.h());
                b.op(format!("mov.b32 {{{h0}, {h1}}}, {w}"));
                for hh in [h0, h1] {
                    let f = b.f();
                    b.op(format!("cvt.f32.f16 {f}, {hh}"));
                    out.push(f);
                }
            }
        }
        Dequant::SignedByte => {
            for w in words {
                for k in 0..4 {
                    let (i, f) = (b.r(), b.f());
                    b.op(format!("bfe.s32 {i}, {w}, {}, 8", 8 * k));
                    b.op(format!("cvt.rn.f32.s32 {f}, {i}"));
                    out.push(f);
                }
            }
        }
        Dequant::MagicOr {
            float_magic,
            float_sub,
            ..
        } => {
            let magic = b.imm(float_magic);
            for w in words {
                // Low nibbles (even elements) and high nibbles (odd), one per byte.
                let (lo, sh, hi) = (b.r(), b.r(), b.r());
                b.op(format!("lop3.b32 {lo}, {w}, 0x0F0F0F0F, 0, 0xC0"));
                b.op(format!("shr.u32 {sh}, {w}, 4"));
                b.op(format!("lop3.b32 {hi}, {sh}, 0x0F0F0F0F, 0, 0xC0"));
                for k in 0..4u32 {
                    for src in [&lo, &hi] {
                        let (bits, f) = (b.r(), b.f());
                        // byte 0 = nibble byte k, bytes 1..3 from the magic.
                        b.op(format!(
                            "prmt.b32 {bits}, {src}, {magic}, {:#06x}",
                            0x7540 | k
                        ));
                        b.op(format!("mov.b32 {f}, {bits}"));
                        b.op(format!("sub.f32 {f}, {f}, {}", f32_lit(float_sub)));
                        out.push(f);
                    }
                }
            }
        }
        Dequant::ShiftOr {
            float_base,
            float_shift,
            ..
        } => {
            // n << 19 = (n << 3) << 16: each byte holds n << 3, prmt puts
            // it in byte 2 under the base's byte 3.
            let pre = float_shift - 16;
            let base = b.imm(float_base);
            let mask = 0x0F0F_0F0Fu32 << pre;
            for w in words {
                let (lo, hi, t0, t1) = (b.r(), b.r(), b.r(), b.r());
                b.op(format!("shl.b32 {t0}, {w}, {pre}"));
                b.op(format!("lop3.b32 {lo}, {t0}, {mask:#010x}, 0, 0xC0"));
                b.op(format!("shr.u32 {t1}, {w}, {}", 4 - pre));
                b.op(format!("lop3.b32 {hi}, {t1}, {mask:#010x}, 0, 0xC0"));
                for k in 0..4u32 {
                    for src in [&lo, &hi] {
                        let (bits, f) = (b.r(), b.f());
                        b.op(format!(
                            "prmt.b32 {bits}, {src}, {base}, {:#06x}",
                            0x7044 | (k << 8)
                        ));
                        b.op(format!("mov.b32 {f}, {bits}"));
                        out.push(f);
                    }
                }
            }
        }
    }
    debug_assert_eq!(out.len() as u32, epl);
    out
}

/// `v = act(v)` in f32.
pub fn activation(b: &mut Body, act: Activation, v: &str) {
    match act {
        Activation::None => {}
        Activation::Relu => b.op(format!("max.f32 {v}, {v}, 0f00000000")),
        Activation::Silu => {
            // v / (1 + 2^(-v·log2 e))
            let t = b.f();
            b.op(format!(
                "mul.f32 {t}, {v}, {}",
                f32_lit(-std::f32::consts::LOG2_E)
            ));
            b.op(format!("ex2.approx.f32 {t}, {t}"));
            b.op(format!("add.f32 {t}, {t}, 0f3F800000"));
            b.op(format!("div.rn.f32 {v}, {v}, {t}"));
        }
    }
}

/// `y[index] = v` as f32 or f16.
pub fn store_y(b: &mut Body, y_format: Format, y: &str, index: &str, v: &str) {
    let (off, addr) = (b.rd(), b.rd());
    if y_format == Format::F16 {
        b.op(format!("mul.wide.s32 {off}, {index}, 2"));
        b.op(format!("add.s64 {addr}, {y}, {off}"));
        let hv = b.h();
        b.op(format!("cvt.rn.f16.f32 {hv}, {v}"));
        b.op(format!("st.global.b16 [{addr}], {hv}"));
    } else {
        b.op(format!("mul.wide.s32 {off}, {index}, 4"));
        b.op(format!("add.s64 {addr}, {y}, {off}"));
        b.op(format!("st.global.f32 [{addr}], {v}"));
    }
}
