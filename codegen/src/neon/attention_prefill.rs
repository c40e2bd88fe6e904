//! Causal prefill attention on NEON: a block of `t` query tokens over a
//! cache of `s ≥ t` tokens, query token `i` seeing the first
//! `s − t + i + 1` of them (the interpreter's rule).
//!
//! This is the decode kernel's loop with a per-row causal length: the
//! emitted code is the decode kernel of [`super::attention`] (a prefill
//! kernel emits exactly that), and [`NeonPrefill::run`] calls it once per
//! query token with `s` set to that token's visible prefix, reading the
//! cache in place (a prefix of `[s, kvh, d]` rows is itself a cache). A
//! fused prefill kernel (several query rows per K/V pass) is not written.

use half::f16;
use tessera_dsl::ir::{AttentionKind, Kernel, Op};

use crate::artifact::MachineCode;
use crate::host_attention::{AttentionError, HostAttention, KvCache};

/// A prefill attention kernel mapped executable.
#[derive(Debug)]
pub struct NeonPrefill {
    decode: HostAttention,
}

fn shape(what: &'static str, expected: impl ToString, got: impl ToString) -> AttentionError {
    AttentionError::Shape {
        what,
        expected: expected.to_string(),
        got: got.to_string(),
    }
}

/// The first `rows` rows of a cache of `cols` columns, borrowed in place.
pub(crate) fn prefix<'a>(
    c: KvCache<'a>,
    rows: usize,
    cols: usize,
) -> Result<KvCache<'a>, AttentionError> {
    let elems = rows * cols;
    match c {
        KvCache::F16(x) => x
            .get(..elems)
            .map(KvCache::F16)
            .ok_or_else(|| shape("cache elements", elems, x.len())),
        KvCache::Quant(t) => {
            // One scale (and offset) per row, or none (fp8): what the
            // decode kernel reads; other groupings are refused there.
            let per_row = |v: &'a [f32]| -> Result<&'a [f32], AttentionError> {
                if v.is_empty() {
                    Ok(v)
                } else if v.len() == t.rows {
                    Ok(&v[..rows])
                } else {
                    Err(shape("cache parameters", "one per row", v.len()))
                }
            };
            if t.rows < rows || t.cols != cols {
                return Err(shape(
                    "quantized cache [rows, cols]",
                    format!("at least [{rows}, {cols}]"),
                    format!("[{}, {}]", t.rows, t.cols),
                ));
            }
            Ok(KvCache::QuantRows {
                format: t.format,
                rows,
                cols,
                codes: t
                    .codes
                    .get(..elems)
                    .ok_or_else(|| shape("cache codes", elems, t.codes.len()))?,
                scales: per_row(&t.scales)?,
                offsets: per_row(&t.offsets)?,
            })
        }
        KvCache::QuantRows {
            format,
            rows: r,
            cols: c,
            codes,
            scales,
            offsets,
        } => {
            if r < rows || c != cols {
                return Err(shape(
                    "quantized cache [rows, cols]",
                    format!("at least [{rows}, {cols}]"),
                    format!("[{r}, {c}]"),
                ));
            }
            let cut = |v: &'a [f32]| if v.len() == r { &v[..rows] } else { v };
            Ok(KvCache::QuantRows {
                format,
                rows,
                cols,
                codes: codes
                    .get(..elems)
                    .ok_or_else(|| shape("cache codes", elems, codes.len()))?,
                scales: cut(scales),
                offsets: cut(offsets),
            })
        }
    }
}

impl NeonPrefill {
    /// `kernel` a prefill attention kernel, `code` what the NEON backend
    /// emitted for it.
    pub fn new(kernel: &Kernel, code: &MachineCode) -> Result<NeonPrefill, AttentionError> {
        let mut decode = kernel.clone();
        match &mut decode.op {
            Op::Attention(a) if a.kind == AttentionKind::Prefill => a.kind = AttentionKind::Decode,
            _ => {
                return Err(AttentionError::NotDecode {
                    kernel: format!("{} (not a prefill attention kernel)", kernel.name),
                });
            }
        }
        Ok(NeonPrefill {
            decode: HostAttention::new(&decode, code)?,
        })
    }

    /// o[t, hq, d] = causal softmax(q·kᵀ)·v; returns the rows the async
    /// softmax recomputed.
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &self,
        q: &[f16],
        k: KvCache<'_>,
        v: KvCache<'_>,
        t: usize,
        s: usize,
        hq: usize,
        kvh: usize,
        d: usize,
        o: &mut [f16],
        threads: usize,
    ) -> Result<u64, AttentionError> {
        if s < t {
            return Err(shape("sequence length", format!("at least t = {t}"), s));
        }
        let row = hq
            .checked_mul(d)
            .ok_or_else(|| shape("hq·d", "no overflow", "overflow"))?;
        let all = row
            .checked_mul(t)
            .ok_or_else(|| shape("t·hq·d", "no overflow", "overflow"))?;
        if q.len() != all {
            return Err(shape("q elements (t·hq·d)", all, q.len()));
        }
        if o.len() != all {
            return Err(shape("o elements (t·hq·d)", all, o.len()));
        }
        let cols = d;
        // Every token's prefix lies within the whole: check it up front.
        let whole = s
            .checked_mul(kvh)
            .ok_or_else(|| shape("s·kvh", "no overflow", "overflow"))?;
        prefix(k, whole, cols)?;
        prefix(v, whole, cols)?;
        let mut recomputed = 0;
        for i in 0..t {
            let visible = s - t + i + 1;
            let rows = visible
                .checked_mul(kvh)
                .ok_or_else(|| shape("s·kvh", "no overflow", "overflow"))?;
            recomputed += self.decode.run(
                &q[i * row..][..row],
                prefix(k, rows, cols)?,
                prefix(v, rows, cols)?,
                visible,
                hq,
                kvh,
                d,
                &mut o[i * row..][..row],
                threads,
            )?;
        }
        Ok(recomputed)
    }
}
