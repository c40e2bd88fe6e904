//! The `i8dyn` activation quantizer in cranelift IR, ABI
//! [`crate::abi::QuantizeArgs`]: per row, absmax (vectorized, NaN ignored
//! like `f32::max`), scale = absmax/127, q = round_ties_even(x·(127/absmax))
//! clamped to ±127 — the exact f32 operations of
//! `tessera_dsl::quant::quantize_row_i8dyn` — written into the kernel's x
//! layout, with Σq per weight group when `out_sums` is not null. An
//! all-zero or non-finite row gets scale 0 and codes 0.

use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::types::{F32, F32X4, I32, I64};
use cranelift_codegen::ir::{Function, InstBuilder};
use cranelift_frontend::FunctionBuilderContext;
use tessera_dsl::ir::{Format, Kernel};

use super::build::{Fb, new_function};
use super::layout::{axis, tensor_addr};
use crate::abi::*;
use crate::artifact::EmitError;
use crate::tile::TileConfig;

/// Build the quantizer of an `i8dyn` matmul kernel for `tile`.
pub fn build(kernel: &Kernel, tile: &TileConfig) -> Result<Function, EmitError> {
    let unsupported = |what: String| EmitError::Unsupported {
        backend: "host",
        what,
    };
    let mm = kernel
        .as_matmul()
        .ok_or_else(|| unsupported(format!("kernel `{}` is not a matmul", kernel.name)))?;
    let xf = kernel.tensor(&mm.x).map(|t| t.format);
    if xf != Some(Format::I8Dyn) {
        return Err(unsupported(format!(
            "kernel `{}` has no i8dyn activations to quantize",
            kernel.name
        )));
    }
    let tiles: Vec<(String, i64)> = kernel
        .schedule
        .tiles
        .iter()
        .filter_map(|tv| {
            let s = if tv.axis == mm.e {
                tile.ep
            } else if tv.axis == mm.h {
                tile.hp
            } else if tv.axis == mm.l {
                tile.lp
            } else {
                return None;
            };
            Some((tv.name.clone(), i64::from(s)))
        })
        .collect();
    let tiles: Vec<(&str, i64)> = tiles.iter().map(|(n, s)| (n.as_str(), *s)).collect();
    let ep = i64::from(tile.ep.max(1));

    let mut func = new_function(&format!("{}-quantize", kernel.name));
    let mut fctx = FunctionBuilderContext::new();
    {
        let (mut fb, a) = Fb::start(&mut func, &mut fctx);
        let x = fb.arg(a, I64, Q_X);
        let x_stride = fb.arg(a, I64, Q_X_STRIDE);
        let out = fb.arg(a, I64, Q_OUT);
        let out_scales = fb.arg(a, I64, Q_OUT_SCALES);
        let out_sums = fb.arg(a, I64, Q_OUT_SUMS);
        let m = fb.arg(a, I64, Q_M);
        let k = fb.arg(a, I64, Q_K);
        let group = fb.arg(a, I64, Q_GROUP);
        let one = fb.i64c(1);
        let group = fb.b.ins().smax(group, one);
        let m_pad = {
            let t = fb.div_ceil(m, ep);
            fb.b.ins().imul_imm_s(t, ep)
        };
        let addr = tensor_addr(
            &mut fb,
            kernel,
            &mm.x,
            &[(mm.e.as_str(), m_pad), (mm.l.as_str(), k)],
            &tiles,
        )?;
        let e_addr = *axis(&addr, &mm.e)?;
        let l_addr = *axis(&addr, &mm.l)?;
        let groups = {
            let t = fb.b.ins().iadd(k, group);
            let t = fb.b.ins().iadd_imm_s(t, -1);
            fb.b.ins().udiv(t, group)
        };
        let k4 = fb.b.ins().band_imm_s(k, !3);
        let zero = fb.i64c(0);
        fb.for_range(zero, m, 1, |fb, r| {
            let off = fb.b.ins().imul(r, x_stride);
            let row = fb.b.ins().iadd(x, off);
            let z4 = fb.f32x4c(0.0);
            let mx = fb.var(F32X4, z4);
            let zero = fb.i64c(0);
            fb.for_range(zero, k4, 4, |fb, l| {
                let p = fb.addr(row, l, 4);
                let v = fb.load(F32X4, p, 0);
                let a = fb.b.ins().fabs(v);
                let cur = fb.get(mx);
                let gt = fb.b.ins().fcmp(FloatCC::GreaterThan, a, cur);
                let gt = fb.b.ins().bitcast(F32X4, super::build::lanes(), gt);
                let n = fb.b.ins().bitselect(gt, a, cur);
                fb.set(mx, n);
            });
            let v = fb.get(mx);
            let z = fb.f32c(0.0);
            let ms = fb.var(F32, z);
            let max_into = |fb: &mut Fb<'_>, a: cranelift_codegen::ir::Value| {
                let cur = fb.get(ms);
                let gt = fb.b.ins().fcmp(FloatCC::GreaterThan, a, cur);
                let n = fb.b.ins().select(gt, a, cur);
                fb.set(ms, n);
            };
            for lane in 0..4 {
                let a = fb.b.ins().extractlane(v, lane);
                max_into(fb, a);
            }
            fb.for_range(k4, k, 1, |fb, l| {
                let p = fb.addr(row, l, 4);
                let v = fb.load(F32, p, 0);
                let a = fb.b.ins().fabs(v);
                max_into(fb, a);
            });
            let absmax = fb.get(ms);
            let zero = fb.f32c(0.0);
            let inf = fb.f32c(f32::INFINITY);
            let pos = fb.b.ins().fcmp(FloatCC::GreaterThan, absmax, zero);
            let fin = fb.b.ins().fcmp(FloatCC::LessThan, absmax, inf);
            let ok = fb.b.ins().band(pos, fin);
            let c127 = fb.f32c(127.0);
            let inv = fb.b.ins().fdiv(c127, absmax);
            let scale = fb.b.ins().fdiv(absmax, c127);
            let inv = fb.b.ins().select(ok, inv, zero);
            let scale = fb.b.ins().select(ok, scale, zero);
            let sp = fb.addr(out_scales, r, 4);
            fb.store(scale, sp, 0);
            let er = e_addr.at(fb, r);
            let zero_i = fb.i64c(0);
            fb.for_range(zero_i, groups, 1, |fb, g| {
                let z32 = fb.i32c(0);
                let sum = fb.var(I32, z32);
                let l_lo = fb.b.ins().imul(g, group);
                let l_hi = fb.b.ins().iadd(l_lo, group);
                let l_hi = fb.imin(l_hi, k);
                fb.for_range(l_lo, l_hi, 1, |fb, l| {
                    let p = fb.addr(row, l, 4);
                    let v = fb.load(F32, p, 0);
                    let t = fb.b.ins().fmul(v, inv);
                    let t = fb.b.ins().nearest(t);
                    let lo = fb.f32c(-127.0);
                    let hi = fb.f32c(127.0);
                    let t = fb.b.ins().fmax(t, lo);
                    let t = fb.b.ins().fmin(t, hi);
                    let q = fb.b.ins().fcvt_to_sint_sat(I32, t);
                    let lpos = l_addr.at(fb, l);
                    let pos = fb.b.ins().iadd(er, lpos);
                    let qp = fb.b.ins().iadd(out, pos);
                    fb.store_i8(q, qp);
                    let s = fb.get(sum);
                    let s = fb.b.ins().iadd(s, q);
                    fb.set(sum, s);
                });
                let has_sums = fb.b.ins().icmp_imm_s(IntCC::NotEqual, out_sums, 0);
                fb.if_then(has_sums, |fb| {
                    let idx = fb.b.ins().imul(r, groups);
                    let idx = fb.b.ins().iadd(idx, g);
                    let p = fb.addr(out_sums, idx, 4);
                    let s = fb.get(sum);
                    fb.store(s, p, 0);
                });
            });
        });
        fb.finish();
    }
    Ok(func)
}
