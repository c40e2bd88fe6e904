//! Matmul semantics: `y[e, h] = act(Σ_l x[e, l] · w[h, l] + bias[h])`, the
//! exact integer path for W4A8 / W8A8 and the f64 float path for the rest.

use super::bind::{Env, Operand, alloc};
use super::{InterpError, Outputs, round_to_format};
use crate::ir::{Activation, Format, Matmul};
use crate::quant::{QuantTensor, quantize_row_i8dyn};

pub(crate) fn run(env: &Env<'_>, m: &Matmul) -> Result<Outputs, InterpError> {
    let (e_ax, h_ax, l_ax) = (m.e.as_str(), m.h.as_str(), m.l.as_str());
    for (i, a) in [e_ax, h_ax, l_ax].iter().enumerate() {
        if [e_ax, h_ax, l_ax][..i].contains(a) {
            return Err(InterpError::AxisRoles {
                axis: a.to_string(),
            });
        }
    }
    let e = env.extent(e_ax)?;
    let h = env.extent(h_ax)?;
    let l = env.extent(l_ax)?;

    let x = env.input(&m.x, &[e_ax, l_ax], Some(l_ax))?;
    let w = env.input(&m.w, &[h_ax, l_ax], Some(l_ax))?;
    if w.format == Format::I8Dyn {
        return Err(InterpError::UnsupportedFormat {
            tensor: m.w.clone(),
            format: w.format,
            why: "i8dyn is an activation format; weights are quantized offline",
        });
    }
    let out = env.output(&m.y, &[e_ax, h_ax])?;
    check_epilogue(m, x.format, w.format)?;
    let bias = match &m.epilogue.bias {
        Some(b) => Some(env.input(b, &[h_ax], None)?.dense_f64("bias")?),
        None => None,
    };

    let acc = match (x.format, w.quant()) {
        (Format::I8Dyn, Some(q))
            if matches!(
                q.format,
                Format::U4Asym(..) | Format::U4Sym(..) | Format::I8Sym(..) | Format::I8Asym(..)
            ) =>
        {
            integer_path(&x, q, e, h, l)?
        }
        _ => float_path(&x, &w, e, h, l)?,
    };

    let mut y = out.buffer()?;
    for ei in 0..e {
        for hi in 0..h {
            let mut v = acc[ei * h + hi];
            if let Some(b) = &bias {
                v += b[hi];
            }
            v = activate(m.epilogue.activation, v);
            y[out.shape.flat(&[ei, hi])] = round_to_format(v, out.format);
        }
    }
    Ok(Outputs {
        tensors: vec![(out.name, y)],
        softmax: None,
    })
}

/// The epilogue must carry the terms the operand formats need: dropping a
/// scale or a zero-point silently would give a kernel no meaning.
fn check_epilogue(m: &Matmul, x: Format, w: Format) -> Result<(), InterpError> {
    if (x.is_quantized() || w.is_quantized()) && !m.epilogue.scale {
        return Err(InterpError::Epilogue(format!(
            "x is {x} and w is {w}: a quantized operand needs `scale`"
        )));
    }
    if w.is_asymmetric() && !m.epilogue.zero_point {
        return Err(InterpError::Epilogue(format!(
            "w is {w}: asymmetric weights need `zero_point`"
        )));
    }
    Ok(())
}

fn activate(act: Activation, v: f64) -> f64 {
    match act {
        Activation::None => v,
        Activation::Relu => v.max(0.0),
        Activation::Silu => v / (1.0 + (-v).exp()),
    }
}

/// x (i8dyn) quantized per row; per weight group an exact integer dot and
/// Σqx, scaled and zero-point corrected in f64. Returns `[e, h]` row-major.
fn integer_path(
    x: &Operand<'_>,
    w: &QuantTensor,
    e: usize,
    h: usize,
    l: usize,
) -> Result<Vec<f64>, InterpError> {
    let xf = x.dense_f32("x")?;
    let group = w.group_len();
    let groups = w.groups_per_row();
    let mut acc = alloc(
        e.checked_mul(h).ok_or_else(|| InterpError::Overflow {
            what: "output".to_string(),
        })?,
        "matmul accumulators",
    )?;
    for ei in 0..e {
        let (qx, sx) = quantize_row_i8dyn(&xf[ei * l..(ei + 1) * l]);
        let sx = f64::from(sx);
        for hi in 0..h {
            let mut y = 0.0f64;
            for g in 0..groups {
                let cols = g * group..((g + 1) * group).min(l);
                let mut dot = 0i64;
                let mut sum_qx = 0i64;
                for c in cols {
                    let q = i64::from(qx[c]);
                    dot += q * i64::from(w.code(hi, c));
                    sum_qx += q;
                }
                let param = hi * groups + g;
                let sw = f64::from(w.scales[param]);
                let offset = w.offsets.get(param).map_or(0.0, |&o| f64::from(o));
                y += sx * sw * dot as f64 + sx * offset * sum_qx as f64;
            }
            acc.push(y);
        }
    }
    Ok(acc)
}

/// Every operand widened to f64 (i8dyn activations as sx·qx), summed in f64
/// in ascending l. Returns `[e, h]` row-major.
fn float_path(
    x: &Operand<'_>,
    w: &Operand<'_>,
    e: usize,
    h: usize,
    l: usize,
) -> Result<Vec<f64>, InterpError> {
    let xd = if x.format == Format::I8Dyn {
        let xf = x.dense_f32("x")?;
        let mut xd = alloc(xf.len(), "x")?;
        for row in xf.chunks(l.max(1)) {
            let (q, s) = quantize_row_i8dyn(row);
            xd.extend(q.iter().map(|&q| f64::from(s) * f64::from(q)));
        }
        xd
    } else {
        x.dense_f64("x")?
    };
    let wd = w.dense_f64("w")?;
    let mut acc = alloc(
        e.checked_mul(h).ok_or_else(|| InterpError::Overflow {
            what: "output".to_string(),
        })?,
        "matmul accumulators",
    )?;
    for ei in 0..e {
        let xr = &xd[ei * l..(ei + 1) * l];
        for hi in 0..h {
            let wr = &wd[hi * l..(hi + 1) * l];
            acc.push(xr.iter().zip(wr).fold(0.0, |sum, (a, b)| sum + a * b));
        }
    }
    Ok(acc)
}
