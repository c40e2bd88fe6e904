//! Attention semantics: GQA, causal prefill, and the two softmax modes
//! (online with a running max; FlashDecoding++'s unified max with recompute).

use super::bind::{Env, alloc};
use super::{InterpError, Outputs, SoftmaxStats, round_to_format};
use crate::ir::{Attention, AttentionKind, Format, SoftmaxMode};

/// Keys per block of the online softmax, and per partial vector of the async
/// softmax — the granularity kernels use (one block per warp / loop trip).
pub const ONLINE_BLOCK: usize = 64;

pub(crate) fn run(env: &Env<'_>, a: &Attention) -> Result<Outputs, InterpError> {
    let names = [
        a.tokens.as_str(),
        a.heads.as_str(),
        a.kv_heads.as_str(),
        a.head_dim.as_str(),
        a.seq.as_str(),
    ];
    for (i, n) in names.iter().enumerate() {
        if names[..i].contains(n) {
            return Err(InterpError::AxisRoles {
                axis: n.to_string(),
            });
        }
    }
    let [t_ax, hq_ax, kvh_ax, d_ax, s_ax] = names;
    let t = env.extent(t_ax)?;
    let hq = env.extent(hq_ax)?;
    let kvh = env.extent(kvh_ax)?;
    let d = env.extent(d_ax)?;
    let s = env.extent(s_ax)?;

    let q = env.input(&a.q, &[t_ax, hq_ax, d_ax], None)?;
    let k = env.input(&a.k, &[s_ax, kvh_ax, d_ax], Some(d_ax))?;
    let v = env.input(&a.v, &[s_ax, kvh_ax, d_ax], Some(d_ax))?;
    for (name, op) in [(&a.k, &k), (&a.v, &v)] {
        if op.format == Format::I8Dyn {
            return Err(InterpError::UnsupportedFormat {
                tensor: name.clone(),
                format: op.format,
                why: "a KV cache is stored quantized, not quantized per call",
            });
        }
    }
    let out = env.output(&a.o, &[t_ax, hq_ax, d_ax])?;

    if kvh == 0 || hq % kvh != 0 {
        return Err(InterpError::Gqa {
            heads: hq,
            kv_heads: kvh,
        });
    }
    match a.kind {
        AttentionKind::Decode if t != 1 => {
            return Err(InterpError::DecodeTokens {
                axis: t_ax.to_string(),
                tokens: t,
            });
        }
        AttentionKind::Prefill if s < t => {
            return Err(InterpError::PrefillSeq { seq: s, tokens: t });
        }
        _ => {}
    }
    if t > 0 && s == 0 {
        return Err(InterpError::EmptySequence {
            axis: s_ax.to_string(),
        });
    }
    if let SoftmaxMode::Async { phi, lo, hi } = a.softmax
        && !(phi.is_finite() && lo.is_finite() && hi.is_finite() && lo <= hi)
    {
        return Err(InterpError::SoftmaxBounds { phi, lo, hi });
    }

    if out.shape.len == 0 {
        // Nothing to write (t, hq or d is 0): no softmax is evaluated.
        return Ok(Outputs {
            tensors: vec![(out.name, Vec::new())],
            softmax: Some(SoftmaxStats::default()),
        });
    }
    let qd = q.dense_f64("q")?;
    let kd = k.dense_f64("k cache")?;
    let vd = v.dense_f64("v cache")?;
    let scale = if a.q_prescaled || d == 0 {
        1.0
    } else {
        1.0 / (d as f64).sqrt()
    };
    let group = hq / kvh;
    let mut o = out.buffer()?;
    let mut stats = SoftmaxStats::default();
    let mut scores: Vec<f64> = alloc(s, "scores")?;
    for ti in 0..t {
        let visible = match a.kind {
            AttentionKind::Decode => s,
            AttentionKind::Prefill => s - t + ti + 1,
        };
        for hi in 0..hq {
            let kv = hi / group;
            let qrow = &qd[(ti * hq + hi) * d..][..d];
            scores.clear();
            scores.extend((0..visible).map(|j| {
                let krow = &kd[(j * kvh + kv) * d..][..d];
                qrow.iter().zip(krow).fold(0.0, |acc, (x, y)| acc + x * y) * scale
            }));
            let vrow = |j: usize| &vd[(j * kvh + kv) * d..][..d];
            stats.rows += 1;
            let row = match a.softmax {
                SoftmaxMode::Online => online(&scores, vrow, d),
                SoftmaxMode::Async { phi, lo, hi } => {
                    match unified_max(&scores, vrow, d, phi.into(), lo.into(), hi.into()) {
                        Some(row) => row,
                        None => {
                            stats.recomputed += 1;
                            online(&scores, vrow, d)
                        }
                    }
                }
            };
            for (di, val) in row.into_iter().enumerate() {
                o[out.shape.flat(&[ti, hi, di])] = round_to_format(val, out.format);
            }
        }
    }
    Ok(Outputs {
        tensors: vec![(out.name, o)],
        softmax: Some(stats),
    })
}

/// Online softmax over blocks of [`ONLINE_BLOCK`] keys: a running max `m`,
/// with the running denominator and output rescaled by `e^(m_old - m_new)`
/// whenever a block raises it.
fn online<'v>(scores: &[f64], v: impl Fn(usize) -> &'v [f64], d: usize) -> Vec<f64> {
    let mut max = f64::NEG_INFINITY;
    let mut den = 0.0f64;
    let mut num = vec![0.0f64; d];
    for (b, block) in scores.chunks(ONLINE_BLOCK).enumerate() {
        let new_max = block.iter().fold(max, |m, &x| m.max(x));
        // Before the first block nothing has been accumulated: no rescale
        // (and no e^(-inf - -inf) = NaN).
        let rescale = if b == 0 { 0.0 } else { (max - new_max).exp() };
        den *= rescale;
        num.iter_mut().for_each(|n| *n *= rescale);
        for (i, &x) in block.iter().enumerate() {
            let p = (x - new_max).exp();
            den += p;
            let vj = v(b * ONLINE_BLOCK + i);
            num.iter_mut().zip(vj).for_each(|(n, &vv)| *n += p * vv);
        }
        max = new_max;
    }
    num.into_iter().map(|n| n / den).collect()
}

/// FlashDecoding++ asynchronized softmax: each block of keys is a partial
/// vector using the unified max `phi` (no max tracking, no rescale); the
/// partial numerators and denominators are summed at the end. `None` as soon
/// as a score has `x - phi` outside `[lo, hi]` (or NaN): the caller then
/// recomputes the row with [`online`].
fn unified_max<'v>(
    scores: &[f64],
    v: impl Fn(usize) -> &'v [f64],
    d: usize,
    phi: f64,
    lo: f64,
    hi: f64,
) -> Option<Vec<f64>> {
    let mut den = 0.0f64;
    let mut num = vec![0.0f64; d];
    let mut part_num = vec![0.0f64; d];
    for (b, block) in scores.chunks(ONLINE_BLOCK).enumerate() {
        let mut part_den = 0.0f64;
        part_num.iter_mut().for_each(|n| *n = 0.0);
        for (i, &x) in block.iter().enumerate() {
            let shifted = x - phi;
            if !(lo..=hi).contains(&shifted) {
                return None;
            }
            let p = shifted.exp();
            part_den += p;
            let vj = v(b * ONLINE_BLOCK + i);
            part_num
                .iter_mut()
                .zip(vj)
                .for_each(|(n, &vv)| *n += p * vv);
        }
        den += part_den;
        num.iter_mut().zip(&part_num).for_each(|(n, p)| *n += p);
    }
    Some(num.into_iter().map(|n| n / den).collect())
}
