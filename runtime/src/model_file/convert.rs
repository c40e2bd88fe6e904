//! A file tensor's bytes into the weights a kernel takes, and what that
//! did to the values:
//!
//! | file type | kernel weights | how | values |
//! |---|---|---|---|
//! | Q4_0, Q4_1, Q8_0 | the same block format (`u4sym:g32:f16`, `u4asym:g32:f16`, `i8sym:g32:f16`) | blocks repacked | ggml's, bit for bit |
//! | Q4_0, Q4_1 | `u4asym:g32` (f32 scale and min: w4a8, w4a16) | same codes; Q4_0's `d·(q − 8)` stored as `d·q + (−8·d)` | unchanged (every product and sum is exact in f32) |
//! | any supported type | f32 | dequantized as ggml does | unchanged |
//! | any other pair | the kernel's format | dequantized as ggml does, then quantized (or rounded to f16) | max abs and rms error reported |
//!
//! The last row is how K-quants load (Q4_K, Q6_K have no Tessera kernel)
//! and how F32 / F16 / BF16 weights are quantized on load.

use half::{bf16, f16};
use tessera_dsl::ir::{Format, Group, ParamType};
use tessera_dsl::quant::{self, GgmlBlock, QuantError, QuantTensor};

use super::ggml_type::GgmlType;
use super::kquants;

/// What loading did to a tensor's values.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Conversion {
    /// ggml blocks repacked into the same format: every weight dequantizes
    /// to ggml's value, bit for bit.
    Repacked,
    /// Stored in another form with every value unchanged (Q4_0 / Q4_1 into
    /// f32-parameter `u4asym:g32`; any type into f32; f16 into f16).
    Exact,
    /// Quantized (or rounded) from the file's exact values; the error of
    /// the kernel's weights against them.
    Requantized(ErrorStats),
}

/// Error of converted weights against the file's exact values.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ErrorStats {
    pub max_abs: f64,
    pub rms: f64,
    /// Largest |weight| of the file's values (to read the error against).
    pub max_weight: f64,
}

impl std::fmt::Display for Conversion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Conversion::Repacked => f.write_str("repacked (bit-exact)"),
            Conversion::Exact => f.write_str("converted exactly"),
            Conversion::Requantized(e) => write!(
                f,
                "requantized: max abs error {:.3e}, rms {:.3e} (max |w| {:.3e})",
                e.max_abs, e.rms, e.max_weight
            ),
        }
    }
}

/// Weights ready for [`crate::Linear::new`].
#[derive(Clone, Debug, PartialEq)]
pub enum OwnedWeights {
    F32(Vec<f32>),
    Quant(QuantTensor),
}

fn alloc_err(what: &str, e: std::collections::TryReserveError) -> QuantError {
    QuantError::Layout(format!("cannot allocate {what}: {e}"))
}

/// A `Vec` with room for `n` values, or an error instead of an abort.
fn vec_with(n: usize, what: &str) -> Result<Vec<f32>, QuantError> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|e| alloc_err(what, e))?;
    Ok(v)
}

/// Check `bytes` holds exactly `[rows, cols]` of `dtype`.
fn check_bytes(dtype: GgmlType, rows: usize, cols: usize, bytes: &[u8]) -> Result<(), QuantError> {
    let want = dtype
        .row_bytes(cols as u64)
        .ok_or_else(|| {
            QuantError::Layout(format!(
                "{dtype} rows hold whole blocks of {}: a row of {cols} does not",
                dtype.block_len()
            ))
        })?
        .checked_mul(rows as u64)
        .ok_or(QuantError::SizeOverflow {
            what: "tensor bytes",
        })?;
    if want != bytes.len() as u64 {
        return Err(QuantError::Length {
            what: "tensor bytes",
            expected: want as usize,
            got: bytes.len(),
        });
    }
    Ok(())
}

/// The tensor's values exactly as ggml dequantizes them (row-major).
pub fn dequantize(
    dtype: GgmlType,
    rows: usize,
    cols: usize,
    bytes: &[u8],
) -> Result<Vec<f32>, QuantError> {
    check_bytes(dtype, rows, cols, bytes)?;
    let n = rows * cols;
    let mut out = vec_with(n, "the dequantized tensor")?;
    match dtype {
        GgmlType::F32 => out.extend(
            bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
        ),
        GgmlType::F16 => out.extend(
            bytes
                .chunks_exact(2)
                .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32()),
        ),
        GgmlType::BF16 => out.extend(
            bytes
                .chunks_exact(2)
                .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32()),
        ),
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0 => {
            let block = dtype.block().expect("a ggml block type");
            let t = block.decode(rows, cols, bytes)?;
            for r in 0..rows {
                out.extend((0..cols).map(|c| t.value(r, c)));
            }
        }
        GgmlType::Q4_K => {
            for b in bytes.chunks_exact(dtype.block_bytes()) {
                kquants::dequantize_q4_k_block(b, &mut out);
            }
        }
        GgmlType::Q6_K => {
            for b in bytes.chunks_exact(dtype.block_bytes()) {
                kquants::dequantize_q6_k_block(b, &mut out);
            }
        }
        other => {
            return Err(QuantError::Layout(format!(
                "type {other} cannot be dequantized by Tessera"
            )));
        }
    }
    debug_assert_eq!(out.len(), n);
    Ok(out)
}

/// `u4asym:g32` with f32 parameters (the w4a8 / w4a16 weights).
fn u4asym_g32_f32() -> Format {
    Format::U4Asym(Group::Size(32), ParamType::F32)
}

/// Q4_0 / Q4_1 blocks as f32-parameter `u4asym:g32`: the same codes, scale
/// `d` and offset `−8·d` (Q4_0) or `m` (Q4_1). `d·q + (−8·d)` equals ggml's
/// `d·(q − 8)` exactly: d is an f16 and |q − 8| ≤ 8, so both need at most
/// 15 significant bits.
fn reparameterize(block: GgmlBlock, t: QuantTensor) -> Result<QuantTensor, QuantError> {
    let offsets = match block {
        GgmlBlock::Q4_0 => {
            let mut o = vec_with(t.scales.len(), "offsets")?;
            o.extend(t.scales.iter().map(|d| -8.0 * d));
            o
        }
        _ => t.offsets,
    };
    let out = QuantTensor {
        format: u4asym_g32_f32(),
        rows: t.rows,
        cols: t.cols,
        codes: t.codes,
        scales: t.scales,
        offsets,
    };
    out.validate()?;
    Ok(out)
}

/// Error of `got` against `exact`.
pub fn error_stats(exact: &[f32], got: impl Iterator<Item = f32>) -> ErrorStats {
    let (mut max_abs, mut sum, mut max_weight) = (0.0f64, 0.0f64, 0.0f64);
    let mut n = 0usize;
    for (&e, g) in exact.iter().zip(got) {
        let d = (f64::from(g) - f64::from(e)).abs();
        max_abs = max_abs.max(d);
        sum += d * d;
        max_weight = max_weight.max(f64::from(e).abs());
        n += 1;
    }
    ErrorStats {
        max_abs,
        rms: if n == 0 { 0.0 } else { (sum / n as f64).sqrt() },
        max_weight,
    }
}

/// `[rows, cols]` of `dtype` as weights in `target` (a kernel's weight
/// format: quantized, f32 or f16), with what the conversion did.
pub fn convert(
    dtype: GgmlType,
    rows: usize,
    cols: usize,
    bytes: &[u8],
    target: Format,
) -> Result<(OwnedWeights, Conversion), QuantError> {
    if let Some(block) = dtype.block() {
        if block.format() == target {
            return Ok((
                OwnedWeights::Quant(block.decode(rows, cols, bytes)?),
                Conversion::Repacked,
            ));
        }
        if matches!(block, GgmlBlock::Q4_0 | GgmlBlock::Q4_1) && target == u4asym_g32_f32() {
            let t = reparameterize(block, block.decode(rows, cols, bytes)?)?;
            return Ok((OwnedWeights::Quant(t), Conversion::Exact));
        }
    }
    let values = dequantize(dtype, rows, cols, bytes)?;
    match target {
        Format::F32 => Ok((OwnedWeights::F32(values), Conversion::Exact)),
        Format::F16 => {
            let stats = error_stats(&values, values.iter().map(|&v| f16::from_f32(v).to_f32()));
            let conversion = if stats.max_abs == 0.0 {
                Conversion::Exact
            } else {
                Conversion::Requantized(stats)
            };
            Ok((OwnedWeights::F32(values), conversion))
        }
        t if t.is_quantized() => {
            let q = quant::quantize(t, rows, cols, &values)?;
            let stats = error_stats(
                &values,
                (0..rows)
                    .flat_map(|r| (0..cols).map(move |c| (r, c)))
                    .map(|(r, c)| q.value(r, c)),
            );
            Ok((OwnedWeights::Quant(q), Conversion::Requantized(stats)))
        }
        other => Err(QuantError::Layout(format!(
            "no conversion of {dtype} weights into {other}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// Q4_0 / Q4_1 reparameterized into f32-parameter u4asym:g32 keep every
    /// value (compared as values: ±0 may differ in sign).
    #[test]
    fn q4_blocks_reparameterize_exactly() {
        let mut r = ChaCha8Rng::seed_from_u64(3);
        let (rows, cols) = (5, 96);
        let w: Vec<f32> = (0..rows * cols)
            .map(|i| r.gen_range(-1.0f32..1.0) * [1e-3, 1.0, 300.0][i % 3])
            .collect();
        for block in [GgmlBlock::Q4_0, GgmlBlock::Q4_1] {
            let t = quant::quantize(block.format(), rows, cols, &w).unwrap();
            let bytes = block.encode(&t).unwrap();
            let dtype = if block == GgmlBlock::Q4_0 {
                GgmlType::Q4_0
            } else {
                GgmlType::Q4_1
            };
            let exact = dequantize(dtype, rows, cols, &bytes).unwrap();
            let (got, conv) = convert(dtype, rows, cols, &bytes, u4asym_g32_f32()).unwrap();
            assert_eq!(conv, Conversion::Exact);
            let OwnedWeights::Quant(q) = got else {
                panic!("quantized")
            };
            for (i, e) in exact.iter().enumerate() {
                assert_eq!(q.value(i / cols, i % cols), *e, "{block:?} weight {i}");
            }
        }
    }

    #[test]
    fn wrong_lengths_and_unloadable_types_are_errors() {
        assert!(matches!(
            dequantize(GgmlType::Q4_K, 1, 256, &[0; 143]),
            Err(QuantError::Length { .. })
        ));
        assert!(matches!(
            dequantize(GgmlType::Q6_K, 1, 200, &[0; 210]),
            Err(QuantError::Layout(_))
        ));
        assert!(dequantize(GgmlType::IQ2_XXS, 1, 256, &[0; 66]).is_err());
    }
}
