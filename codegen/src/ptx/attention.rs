//! Decode attention as PTX for an [`AttentionPlan`]: the OpenCL kernel's
//! mapping (FlashDecoding++ section 3), printed with warp instructions.
//!
//! # Partial kernel (`<name>_partial`)
//!
//! Grid `(splits, kv_heads)`, block `wg` threads (the plan's). Block
//! `(split, g)` owns keys `s0 = split·keys_per_split .. s0 + n` of KV head
//! `g` and serves every query head of its GQA group in turn. Per head:
//!
//! 1. thread `tid` scores keys `tid, tid + wg, ...`: Q·K over `d` in fp32
//!    (`fma.rn.f32`), 8 elements per step from 128-bit loads of q and of f16
//!    keys (64-bit loads of byte keys) when rows are 16-byte aligned
//!    (`d % 8 == 0`), element by element otherwise and at the tail. The
//!    score goes to shared `p[i]`; the thread keeps its max and whether a
//!    score left `[phi + lo, phi + hi]` (or is NaN).
//! 2. the block agrees on the verdict: `shfl.sync.bfly` max and
//!    `vote.sync.any` within each warp, the warps' results through shared
//!    memory. In range (the common case) `m = phi`, the unified max: no
//!    split waits on another. Otherwise the split recomputes with its own
//!    max `m` (the synchronized scheme).
//! 3. `p[i] = 2^((x − m)·log2 e)` (`ex2.approx`, the exponent prescaled by
//!    log2 e), and `Σ p` by shuffles and shared memory.
//! 4. thread `tid` accumulates `o[j] = Σ_i p[i]·v[i][j]` for `j = tid, tid +
//!    wg, ...` (consecutive threads read consecutive elements of a value
//!    row), and thread 0 writes the split's `m`, `Σ p` and recompute flag.
//!
//! The score loop takes 4 vector steps and the P·V loop 8 keys per trip,
//! each trip one straight block whose loads are all issued before the
//! first FMA needs one (one step per trip waited a memory round trip per
//! step: 33–35% of the H200's read bandwidth).
//!
//! # Combine kernel (`<name>_combine`)
//!
//! Grid `(ceil(d / 32), heads)`, one warp per block: `M = max_j m_j`, `o =
//! Σ_j 2^((m_j − M)·log2 e)·o_j / Σ_j 2^((m_j − M)·log2 e)·l_j`, rounded to
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
use crate::gpu::{AttentionPlan, KvFormat};

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

fn unsupported(what: String) -> EmitError {
    EmitError::Unsupported {
        backend: "ptx",
        what,
    }
}

/// Shared-memory arrays of the partial kernel, named after its entry.
struct Shared {
    p: String,
    red_max: String,
    red_out: String,
    red_sum: String,
}

/// Both entries in one module.
pub fn print(plan: &AttentionPlan, sm: Sm, header: &str) -> Result<String, EmitError> {
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
    let warps = plan.wg / warp;
    let e = &plan.partial_entry;
    let sh = Shared {
        p: format!("{e}_p"),
        red_max: format!("{e}_red_max"),
        red_out: format!("{e}_red_out"),
        red_sum: format!("{e}_red_sum"),
    };
    let decls = vec![
        format!(".shared .align 16 .f32 {}[{}];", sh.p, plan.keys_per_split),
        format!(".shared .align 4 .f32 {}[{warps}];", sh.red_max),
        format!(".shared .align 4 .u32 {}[{warps}];", sh.red_out),
        format!(".shared .align 4 .f32 {}[{warps}];", sh.red_sum),
    ];
    let maxnreg = register_budget(sm);
    let mut s = preamble(sm, header, &decls);
    s.push_str(&entry_text(
        &plan.partial_entry,
        &plan.partial_args,
        Limits {
            reqntid: plan.partial_launch.map(|d| d.local),
            maxnreg,
        },
        partial(plan, sm, &sh, warp),
    ));
    s.push('\n');
    s.push_str(&entry_text(
        &plan.combine_entry,
        &plan.combine_args,
        Limits {
            reqntid: plan.combine_launch.map(|d| d.local),
            maxnreg,
        },
        combine(plan, warp),
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

/// The 8 f32 values of one vector step of keys at `a` (16-byte aligned for
/// f16, 8-byte for bytes). `magic` holds 0x4B000000 for int8 keys.
fn load_vec(b: &mut Body, format: KvFormat, sm: Sm, a: &str, magic: &str) -> Vec<String> {
    let mut out = Vec::new();
    match format {
        KvFormat::F16 => {
            let w: Vec<String> = (0..4).map(|_| b.r()).collect();
            b.op(format!("ld.global.nc.v4.u32 {{{}}}, [{a}]", w.join(", ")));
            for word in &w {
                out.extend(halves_f32(b, word));
            }
        }
        KvFormat::I8AsymRow => {
            let w = [b.r(), b.r()];
            b.op(format!("ld.global.nc.v2.u32 {{{}, {}}}, [{a}]", w[0], w[1]));
            for word in &w {
                // b ^ 0x80 = b + 128 as an unsigned byte: under 2^23's
                // exponent the float is 2^23 + 128 + b, exactly.
                b.op(format!("xor.b32 {word}, {word}, 0x80808080"));
                for k in 0..4u32 {
                    let (bits, f) = (b.r(), b.f());
                    b.op(format!(
                        "prmt.b32 {bits}, {word}, {magic}, {:#06x}",
                        0x7540 | k
                    ));
                    b.op(format!("mov.b32 {f}, {bits}"));
                    b.op(format!("sub.f32 {f}, {f}, {}", f32_lit(8_388_736.0)));
                    out.push(f);
                }
            }
        }
        KvFormat::Fp8E5M2 => {
            let w = [b.r(), b.r()];
            b.op(format!("ld.global.nc.v2.u32 {{{}, {}}}, [{a}]", w[0], w[1]));
            for word in &w {
                // Bytes (0, 1) and (2, 3) to the top bytes of two halves.
                for sel in [0x1404u32, 0x3424] {
                    let pair = b.r();
                    b.op(format!("prmt.b32 {pair}, {word}, 0, {sel:#06x}"));
                    out.extend(halves_f32(b, &pair));
                }
            }
        }
        KvFormat::Fp8E4M3 => {
            let w = [b.r(), b.r()];
            b.op(format!("ld.global.nc.v2.u32 {{{}, {}}}, [{a}]", w[0], w[1]));
            for word in &w {
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

fn partial(plan: &AttentionPlan, sm: Sm, sh: &Shared, warp: u32) -> Body {
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

    // 1. Scores.
    let i = b.r();
    b.op(format!("mov.u32 {i}, {tid}"));
    let key_top = b.label("key");
    let key_end = b.label("key_end");
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
        let kv = load_vec(b, plan.k, sm, &ka, &magic);
        (qw, kv)
    };
    let fma_step = |b: &mut Body, qw: &[String], kv: &[String]| {
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
    b.op(format!("mov.u32 {j}, {tid}"));
    let pv_top = b.label("pv");
    let pv_end = b.label("pv_end");
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

fn combine(plan: &AttentionPlan, warp: u32) -> Body {
    let mut b = Body::new();
    let a = Args::load(&mut b, &plan.combine_entry, &plan.combine_args);
    let [hq, d, splits] = ["hq", "d", "splits"].map(|n| a.get(n).to_string());
    b.comment("Thread: element j of head `head`.");
    let (tx, cx, head, j) = (b.r(), b.r(), b.r(), b.r());
    b.op(format!("mov.u32 {tx}, %tid.x"));
    b.op(format!("mov.u32 {cx}, %ctaid.x"));
    b.op(format!("mov.u32 {head}, %ctaid.y"));
    b.op(format!("mad.lo.s32 {j}, {cx}, {warp}, {tx}"));
    let (pout, exit) = (b.pred(), b.label("exit"));
    b.op(format!("setp.ge.s32 {pout}, {j}, {d}"));
    b.op(format!("setp.ge.or.s32 {pout}, {head}, {hq}, {pout}"));
    b.op(format!("@{pout} bra {exit}"));
    let (big, t) = (b.f(), b.r());
    b.op(format!("mov.f32 {big}, 0fFF800000"));
    b.op(format!("mov.u32 {t}, 0"));
    let max_top = b.label("max");
    let max_end = b.label("max_end");
    b.place(&max_top);
    let pm = b.pred();
    b.op(format!("setp.ge.s32 {pm}, {t}, {splits}"));
    b.op(format!("@{pm} bra {max_end}"));
    let part = b.r();
    b.op(format!("mad.lo.s32 {part}, {t}, {hq}, {head}"));
    let ma = addr(&mut b, a.get("part_m"), &part, 4);
    let mv = b.f();
    b.op(format!("ld.global.f32 {mv}, [{ma}]"));
    b.op(format!("max.f32 {big}, {big}, {mv}"));
    b.op(format!("add.s32 {t}, {t}, 1"));
    b.op(format!("bra {max_top}"));
    b.place(&max_end);
    b.comment("Factors 2^((m_j - M)*log2 e): exactly 1 for splits that used the unified max.");
    let (den, num) = (b.f(), b.f());
    b.op(format!("mov.f32 {den}, 0f00000000"));
    b.op(format!("mov.f32 {num}, 0f00000000"));
    b.op(format!("mov.u32 {t}, 0"));
    let sum_top = b.label("sum");
    let sum_end = b.label("sum_end");
    b.place(&sum_top);
    let ps = b.pred();
    b.op(format!("setp.ge.s32 {ps}, {t}, {splits}"));
    b.op(format!("@{ps} bra {sum_end}"));
    let part2 = b.r();
    b.op(format!("mad.lo.s32 {part2}, {t}, {hq}, {head}"));
    let ma2 = addr(&mut b, a.get("part_m"), &part2, 4);
    let la = addr(&mut b, a.get("part_l"), &part2, 4);
    let oidx = b.r();
    b.op(format!("mad.lo.s32 {oidx}, {part2}, {d}, {j}"));
    let oa = addr(&mut b, a.get("part_o"), &oidx, 4);
    let (f, lv, ov) = (b.f(), b.f(), b.f());
    b.op(format!("ld.global.f32 {f}, [{ma2}]"));
    b.op(format!("ld.global.f32 {lv}, [{la}]"));
    b.op(format!("ld.global.f32 {ov}, [{oa}]"));
    b.op(format!("sub.f32 {f}, {f}, {big}"));
    b.op(format!(
        "mul.f32 {f}, {f}, {}",
        f32_lit(std::f32::consts::LOG2_E)
    ));
    b.op(format!("ex2.approx.ftz.f32 {f}, {f}"));
    b.op(format!("fma.rn.f32 {den}, {f}, {lv}, {den}"));
    b.op(format!("fma.rn.f32 {num}, {f}, {ov}, {num}"));
    b.op(format!("add.s32 {t}, {t}, 1"));
    b.op(format!("bra {sum_top}"));
    b.place(&sum_end);
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
