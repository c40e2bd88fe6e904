//! Decode attention in cranelift IR, ABI
//! [`crate::host_attention::AttentionArgs`]: one query token, GQA, keys f16
//! / f32 or int8 per token and KV head (`w = scale·q + offset`), values
//! f16 or fp8, softmax in fp32 exactly as the interpreter defines it.
//!
//! Per query head `hq` of the call (its KV head `hq / (heads / kv_heads)`):
//!
//! 1. q widened to f32 once (scratch); scores `q·k_j` for every key, f32x4
//!    over d with a scalar tail (× 1/sqrt(d) unless q is prescaled);
//!    for the async mode, whether every `score − phi` lies in `[lo, hi]`.
//! 2. Async (all in range): per block of [`ONLINE_BLOCK`] keys a partial
//!    denominator and numerator with the unified max `phi`, summed.
//!    Otherwise (online mode, or the async recompute, counted in
//!    `recomputed`): per block the running max, the running sums rescaled
//!    by `e^(m_old − m_new)` (not before the first block).
//! 3. `o = num / den`, rounded to f16. The head's softmax state stays in
//!    scratch as on NEON (`den` at `s`, `num` at `s + d`, the max the
//!    exponentials were taken against at `s + 2d`), so
//!    [`HostAttention`] can split `s`
//!    into chunks and combine them.

use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::types::{F32, F32X4, I8X16, I16X8, I32, I32X4, I64};
use cranelift_codegen::ir::{Function, InstBuilder, Value};
use cranelift_frontend::FunctionBuilderContext;
use tessera_dsl::interp::ONLINE_BLOCK;
use tessera_dsl::ir::{Format, Group, Kernel, ParamType, SoftmaxMode};

use super::build::{Fb, lanes, mem, new_function};
use crate::artifact::EmitError;
use crate::host_attention::*;

fn unsupported(what: String) -> EmitError {
    EmitError::Unsupported {
        backend: "host",
        what,
    }
}

/// Key and value storage the emitter reads.
fn check_formats(k: Format, v: Format) -> Result<(), EmitError> {
    let k_ok = matches!(
        k,
        Format::F16
            | Format::F32
            | Format::I8Sym(Group::Row, ParamType::F32)
            | Format::I8Asym(Group::Row, ParamType::F32)
    );
    let v_ok = matches!(
        v,
        Format::F16 | Format::F32 | Format::Fp8E4M3 | Format::Fp8E5M2
    );
    if k_ok && v_ok {
        Ok(())
    } else {
        Err(unsupported(format!(
            "attention with keys {k} and values {v} (keys: f16, f32, i8sym:row, i8asym:row; values: f16, f32, fp8)"
        )))
    }
}

/// Build the decode attention function of `kernel`. A prefill kernel gets
/// the same function: `HostAttention::prefill` calls it once per query
/// token with that token's causal prefix (as on NEON).
pub fn build(kernel: &Kernel) -> Result<Function, EmitError> {
    let a = kernel.as_attention().ok_or_else(|| {
        unsupported(format!(
            "kernel `{}` is neither matmul nor attention",
            kernel.name
        ))
    })?;
    let fmt = |n: &str| {
        kernel
            .tensor(n)
            .map(|t| t.format)
            .ok_or_else(|| unsupported(format!("missing tensor `{n}`")))
    };
    let (qf, kf, vf, of) = (fmt(&a.q)?, fmt(&a.k)?, fmt(&a.v)?, fmt(&a.o)?);
    if qf != Format::F16 || of != Format::F16 {
        return Err(unsupported("attention q and o other than f16".into()));
    }
    check_formats(kf, vf)?;
    let softmax = a.softmax;
    let prescaled = a.q_prescaled;

    let mut func = new_function(&kernel.name);
    let mut fctx = FunctionBuilderContext::new();
    {
        let (mut fb, args) = Fb::start(&mut func, &mut fctx);
        let q = fb.arg(args, I64, AT_Q);
        let k = fb.arg(args, I64, AT_K);
        let k_scales = fb.arg(args, I64, AT_K_SCALES);
        let k_offsets = fb.arg(args, I64, AT_K_OFFSETS);
        let v = fb.arg(args, I64, AT_V);
        let o = fb.arg(args, I64, AT_O);
        let scratch = fb.arg(args, I64, AT_SCRATCH);
        let recomputed = fb.arg(args, I64, AT_RECOMPUTED);
        let s = fb.arg(args, I64, AT_S);
        let hq = fb.arg(args, I64, AT_HQ);
        let kvh = fb.arg(args, I64, AT_KVH);
        let d = fb.arg(args, I64, AT_D);
        let head0 = fb.arg(args, I64, AT_HEAD0);
        let heads = fb.arg(args, I64, AT_HEADS);
        let group = fb.b.ins().udiv(hq, kvh);
        let d4 = fb.b.ins().band_imm_s(d, !3);
        let kbytes = i64::from(kf.bits() / 8);
        let vbytes = i64::from(vf.bits() / 8);
        let scores = scratch;
        let qs = fb.addr(scratch, s, 4);
        let num = fb.addr(qs, d, 4);
        let part = fb.addr(num, d, 4);
        let inv_sqrt_d = {
            let df = fb.b.ins().fcvt_from_uint(F32, d);
            let r = fb.b.ins().sqrt(df);
            let one = fb.f32c(1.0);
            fb.b.ins().fdiv(one, r)
        };
        let head_end = fb.b.ins().iadd(head0, heads);
        let zero = fb.i64c(0);
        fb.for_range(head0, head_end, 1, |fb, h| {
            let kv = fb.b.ins().udiv(h, group);
            // q row → f32 scratch.
            let qrow_el = fb.b.ins().imul(h, d);
            let qrow = fb.addr(q, qrow_el, 2);
            fb.for_range(zero, d, 1, |fb, i| {
                let p = fb.addr(qrow, i, 2);
                let x = load1(fb, Format::F16, p);
                let dst = fb.addr(qs, i, 4);
                fb.store(x, dst, 0);
            });
            // Scores, and the async range check.
            let one32 = fb.i32c(1);
            let in_range = fb.var(I32, one32);
            fb.for_range(zero, s, 1, |fb, j| {
                let row = fb.b.ins().imul(j, kvh);
                let row = fb.b.ins().iadd(row, kv);
                let kel = fb.b.ins().imul(row, d);
                let krow = fb.addr(k, kel, kbytes);
                let (ks, ko) = if kf.is_quantized() {
                    let sp = fb.addr(k_scales, row, 4);
                    let sc = fb.load(F32, sp, 0);
                    let off = if kf.is_asymmetric() {
                        let op = fb.addr(k_offsets, row, 4);
                        fb.load(F32, op, 0)
                    } else {
                        fb.f32c(0.0)
                    };
                    (Some(sc), Some(off))
                } else {
                    (None, None)
                };
                let z4 = fb.f32x4c(0.0);
                let acc = fb.var(F32X4, z4);
                fb.for_range(zero, d4, 4, |fb, i| {
                    let kp = fb.addr(krow, i, kbytes);
                    let mut kx = load4(fb, kf, kp);
                    if let (Some(sc), Some(off)) = (ks, ko) {
                        let s4 = fb.b.ins().splat(F32X4, sc);
                        let o4 = fb.b.ins().splat(F32X4, off);
                        kx = fb.b.ins().fmul(kx, s4);
                        kx = fb.b.ins().fadd(kx, o4);
                    }
                    let qp = fb.addr(qs, i, 4);
                    let qx = fb.load(F32X4, qp, 0);
                    let c = fb.get(acc);
                    let m = fb.b.ins().fmul(qx, kx);
                    let r = fb.b.ins().fadd(c, m);
                    fb.set(acc, r);
                });
                let a4 = fb.get(acc);
                let sum0 = fb.hsum(a4);
                let sum = fb.var(F32, sum0);
                fb.for_range(d4, d, 1, |fb, i| {
                    let kp = fb.addr(krow, i, kbytes);
                    let mut kx = load1(fb, kf, kp);
                    if let (Some(sc), Some(off)) = (ks, ko) {
                        kx = fb.b.ins().fmul(kx, sc);
                        kx = fb.b.ins().fadd(kx, off);
                    }
                    let qp = fb.addr(qs, i, 4);
                    let qx = fb.load(F32, qp, 0);
                    let m = fb.b.ins().fmul(qx, kx);
                    let c = fb.get(sum);
                    let r = fb.b.ins().fadd(c, m);
                    fb.set(sum, r);
                });
                let mut score = fb.get(sum);
                if !prescaled {
                    score = fb.b.ins().fmul(score, inv_sqrt_d);
                }
                let sp = fb.addr(scores, j, 4);
                fb.store(score, sp, 0);
                if let SoftmaxMode::Async { phi, lo, hi } = softmax {
                    let phi = fb.f32c(phi);
                    let x = fb.b.ins().fsub(score, phi);
                    let lo = fb.f32c(lo);
                    let hi = fb.f32c(hi);
                    let a = fb.b.ins().fcmp(FloatCC::GreaterThanOrEqual, x, lo);
                    let b = fb.b.ins().fcmp(FloatCC::LessThanOrEqual, x, hi);
                    let ok = fb.b.ins().band(a, b);
                    let ok = fb.b.ins().uextend(I32, ok);
                    let cur = fb.get(in_range);
                    let n = fb.b.ins().band(cur, ok);
                    fb.set(in_range, n);
                }
            });
            let ctx = Rows {
                v,
                vf,
                vbytes,
                kvh,
                kv,
                d,
                d4,
                scores,
                num,
                part,
                s,
            };
            let z = fb.f32c(0.0);
            let den = fb.var(F32, z);
            let max = fb.var(F32, z);
            match softmax {
                SoftmaxMode::Online => online(fb, &ctx, den, max),
                SoftmaxMode::Async { phi, .. } => {
                    let ok = fb.get(in_range);
                    fb.if_else(
                        ok,
                        |fb| unified(fb, &ctx, den, max, phi),
                        |fb| {
                            let c = fb.load(I64, recomputed, 0);
                            let c = fb.b.ins().iadd_imm_s(c, 1);
                            fb.store(c, recomputed, 0);
                            online(fb, &ctx, den, max);
                        },
                    );
                }
            }
            // The head's softmax state for a split over s: `den` at s, `num`
            // at s + d (where it already is), the max at s + 2d.
            let dn = fb.get(den);
            fb.store(dn, qs, 0);
            let mx = fb.get(max);
            fb.store(mx, part, 0);
            // o = num / den → f16.
            let dn = fb.get(den);
            let orow_el = fb.b.ins().imul(h, d);
            let orow = fb.addr(o, orow_el, 2);
            fb.for_range(zero, d, 1, |fb, i| {
                let np = fb.addr(num, i, 4);
                let n = fb.load(F32, np, 0);
                let r = fb.b.ins().fdiv(n, dn);
                let rv = fb.b.ins().splat(F32X4, r);
                let bits = fb.f32_to_f16(rv);
                let op = fb.addr(orow, i, 2);
                fb.store_u16_lane(bits, 0, op);
            });
        });
        fb.finish();
    }
    Ok(func)
}

/// What the softmax passes need.
struct Rows {
    v: Value,
    vf: Format,
    vbytes: i64,
    kvh: Value,
    kv: Value,
    d: Value,
    d4: Value,
    scores: Value,
    num: Value,
    part: Value,
    s: Value,
}

/// 4 consecutive elements of `f` at `p`, widened to f32x4 (fp8 and int8
/// read exactly 4 bytes, so the last row of a cache never over-reads).
fn load4(fb: &mut Fb<'_>, f: Format, p: Value) -> Value {
    match f {
        Format::F32 => fb.load(F32X4, p, 0),
        Format::F16 => {
            let h = fb.b.ins().uload16x4(mem(), p, 0);
            fb.f16_to_f32(h)
        }
        _ => {
            let w = fb.load(I32, p, 0);
            let v = fb.b.ins().scalar_to_vector(I32X4, w);
            let b = fb.b.ins().bitcast(I8X16, lanes(), v);
            match f {
                Format::I8Sym(..) | Format::I8Asym(..) => {
                    let h = fb.b.ins().swiden_low(b);
                    let i = fb.b.ins().swiden_low(h);
                    fb.b.ins().fcvt_from_sint(F32X4, i)
                }
                _ => {
                    let h = fb.b.ins().uwiden_low(b);
                    let i = fb.b.ins().uwiden_low(h);
                    if f == Format::Fp8E5M2 {
                        fb.e5m2_to_f32(i)
                    } else {
                        fb.e4m3_to_f32(i)
                    }
                }
            }
        }
    }
}

/// One element of `f` at `p`, widened to f32.
fn load1(fb: &mut Fb<'_>, f: Format, p: Value) -> Value {
    let v = match f {
        Format::F32 => {
            let x = fb.load(F32, p, 0);
            return x;
        }
        Format::F16 => {
            let x = fb.load_u32(p, 16);
            let v = fb.b.ins().splat(I32X4, x);
            fb.f16_to_f32(v)
        }
        Format::I8Sym(..) | Format::I8Asym(..) => {
            let x = fb.b.ins().sload8(I32, mem(), p, 0);
            let v = fb.b.ins().splat(I32X4, x);
            fb.b.ins().fcvt_from_sint(F32X4, v)
        }
        Format::Fp8E5M2 => {
            let x = fb.load_u32(p, 8);
            let v = fb.b.ins().splat(I32X4, x);
            fb.e5m2_to_f32(v)
        }
        _ => {
            let x = fb.load_u32(p, 8);
            let v = fb.b.ins().splat(I32X4, x);
            fb.e4m3_to_f32(v)
        }
    };
    fb.b.ins().extractlane(v, 0)
}

/// `dst[0..d] = dst·keep + p·v_j` (keep None: `dst += p·v_j`).
fn axpy(fb: &mut Fb<'_>, c: &Rows, dst: Value, p: Value, j: Value) {
    let row = fb.b.ins().imul(j, c.kvh);
    let row = fb.b.ins().iadd(row, c.kv);
    let el = fb.b.ins().imul(row, c.d);
    let vrow = fb.addr(c.v, el, c.vbytes);
    let p4 = fb.b.ins().splat(F32X4, p);
    let zero = fb.i64c(0);
    fb.for_range(zero, c.d4, 4, |fb, i| {
        let vp = fb.addr(vrow, i, c.vbytes);
        let vx = load4(fb, c.vf, vp);
        let np = fb.addr(dst, i, 4);
        let n = fb.load(F32X4, np, 0);
        let m = fb.b.ins().fmul(p4, vx);
        let r = fb.b.ins().fadd(n, m);
        fb.store(r, np, 0);
    });
    fb.for_range(c.d4, c.d, 1, |fb, i| {
        let vp = fb.addr(vrow, i, c.vbytes);
        let vx = load1(fb, c.vf, vp);
        let np = fb.addr(dst, i, 4);
        let n = fb.load(F32, np, 0);
        let m = fb.b.ins().fmul(p, vx);
        let r = fb.b.ins().fadd(n, m);
        fb.store(r, np, 0);
    });
}

/// `dst[0..d] *= f` (f = 0 clears).
fn scale_vec(fb: &mut Fb<'_>, c: &Rows, dst: Value, f: Value) {
    let zero = fb.i64c(0);
    fb.for_range(zero, c.d, 1, |fb, i| {
        let np = fb.addr(dst, i, 4);
        let n = fb.load(F32, np, 0);
        let r = fb.b.ins().fmul(n, f);
        fb.store(r, np, 0);
    });
}

fn clear(fb: &mut Fb<'_>, c: &Rows, dst: Value) {
    let zero = fb.i64c(0);
    let z = fb.f32c(0.0);
    fb.for_range(zero, c.d, 1, |fb, i| {
        let np = fb.addr(dst, i, 4);
        fb.store(z, np, 0);
    });
}

/// Blocks of keys: `(block start, block end)` loop.
fn blocks(fb: &mut Fb<'_>, c: &Rows, mut body: impl FnMut(&mut Fb<'_>, Value, Value)) {
    let zero = fb.i64c(0);
    let s = c.s;
    fb.for_range(zero, s, ONLINE_BLOCK as i64, |fb, b0| {
        let b1 = fb.b.ins().iadd_imm_s(b0, ONLINE_BLOCK as i64);
        let b1 = fb.imin(b1, s);
        body(fb, b0, b1);
    });
}

fn score(fb: &mut Fb<'_>, c: &Rows, j: Value) -> Value {
    let p = fb.addr(c.scores, j, 4);
    fb.load(F32, p, 0)
}

/// `den` and `num` against the running max, which ends in `out_max`.
fn online(
    fb: &mut Fb<'_>,
    c: &Rows,
    den: cranelift_frontend::Variable,
    out_max: cranelift_frontend::Variable,
) {
    clear(fb, c, c.num);
    let z = fb.f32c(0.0);
    fb.set(den, z);
    let ninf = fb.f32c(f32::NEG_INFINITY);
    let max = fb.var(F32, ninf);
    blocks(fb, c, |fb, b0, b1| {
        let m0 = fb.get(max);
        let nm = fb.var(F32, m0);
        fb.for_range(b0, b1, 1, |fb, j| {
            let x = score(fb, c, j);
            let cur = fb.get(nm);
            let gt = fb.b.ins().fcmp(FloatCC::GreaterThan, x, cur);
            let n = fb.b.ins().select(gt, x, cur);
            fb.set(nm, n);
        });
        let new_max = fb.get(nm);
        let first = fb.b.ins().icmp_imm_s(IntCC::Equal, b0, 0);
        let old = fb.get(max);
        let diff = fb.b.ins().fsub(old, new_max);
        let e = fb.exp_scalar(diff);
        let zero = fb.f32c(0.0);
        let rescale = fb.b.ins().select(first, zero, e);
        let dn = fb.get(den);
        let dn = fb.b.ins().fmul(dn, rescale);
        fb.set(den, dn);
        scale_vec(fb, c, c.num, rescale);
        fb.for_range(b0, b1, 1, |fb, j| {
            let x = score(fb, c, j);
            let t = fb.b.ins().fsub(x, new_max);
            let p = fb.exp_scalar(t);
            let dn = fb.get(den);
            let dn = fb.b.ins().fadd(dn, p);
            fb.set(den, dn);
            axpy(fb, c, c.num, p, j);
        });
        fb.set(max, new_max);
    });
    let m = fb.get(max);
    fb.set(out_max, m);
}

/// `den` and `num` against the unified max `phi`, which goes to `out_max`.
fn unified(
    fb: &mut Fb<'_>,
    c: &Rows,
    den: cranelift_frontend::Variable,
    out_max: cranelift_frontend::Variable,
    phi: f32,
) {
    clear(fb, c, c.num);
    let z = fb.f32c(0.0);
    fb.set(den, z);
    let phi = fb.f32c(phi);
    fb.set(out_max, phi);
    blocks(fb, c, |fb, b0, b1| {
        clear(fb, c, c.part);
        let z = fb.f32c(0.0);
        let pden = fb.var(F32, z);
        fb.for_range(b0, b1, 1, |fb, j| {
            let x = score(fb, c, j);
            let t = fb.b.ins().fsub(x, phi);
            let p = fb.exp_scalar(t);
            let dn = fb.get(pden);
            let dn = fb.b.ins().fadd(dn, p);
            fb.set(pden, dn);
            axpy(fb, c, c.part, p, j);
        });
        let dn = fb.get(den);
        let pd = fb.get(pden);
        let dn = fb.b.ins().fadd(dn, pd);
        fb.set(den, dn);
        let zero = fb.i64c(0);
        fb.for_range(zero, c.d, 1, |fb, i| {
            let np = fb.addr(c.num, i, 4);
            let pp = fb.addr(c.part, i, 4);
            let n = fb.load(F32, np, 0);
            let q = fb.load(F32, pp, 0);
            let r = fb.b.ins().fadd(n, q);
            fb.store(r, np, 0);
        });
    });
    let _ = I16X8;
}
