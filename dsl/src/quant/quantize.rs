//! f32 → [`QuantTensor`]: the quantizer of every quantized format.
//!
//! Input is a row-major `[rows, cols]` f32 matrix; groups run along `cols`
//! (`Group::Size(n)`: `n` consecutive columns, the last group of a row may be
//! shorter; `Group::Row`: the whole row). Output codes are one byte per
//! element (row-major, signed codes as two's complement, 4-bit codes in the
//! low nibble) and parameters are `[rows, groups_per_row]` row-major, exactly
//! as [`QuantTensor`] documents. Rounding is to nearest, ties to even,
//! everywhere. Per format (`min`, `max`, `absmax` are the group's):
//!
//! | format | scale | code | offset |
//! |---|---|---|---|
//! | `u4asym` | (max−min)/15 | round((w−min)/scale), clip [0, 15] | min |
//! | `i8asym` | (max−min)/255 | round((w−min)/scale) − 128, clip [−128, 127] | min + 128·scale |
//! | `i8sym` | absmax/127 | round(w·(127/absmax)), clip [−127, 127] | — |
//! | `i8dyn` | absmax/127 per row | as `i8sym` ([`quantize_row_i8dyn`]) | — |
//! | `u4sym` (ggml Q4_0) | m/−8, m the group's value of largest magnitude (first if tied) | min(15, trunc(w·(1/scale) + 8.5)) | — (v(q) = q − 8) |
//! | `e0m4` | see [`super::e0m4`] | top 4 fp16 fraction bits of w mapped to [2, 4) | bias |
//! | `fp8e4m3`/`fp8e5m2` | — | [`super::fp8`] encoding (RNE, saturating) | — |
//!
//! `u4asym` / `i8asym` are MNN-LLM formula (1), `q = round((w − min) /
//! ((max − min)/(clip_max − clip_min))) + clip_min`; the int4 codes are
//! stored pre-converted to uint4 (seed 000 IV.D), so `u4asym` uses clip
//! [0, 15] directly. Scales are computed in f64 from the f32 min/max and
//! stored as f32; codes are computed in f64 against that stored f32 scale,
//! so `|w − (scale·v(q) + offset)| ≤ scale/2` up to the f32 rounding of the
//! dequantization itself. A group with `max == min` (or a range whose scale
//! underflows to 0) gets scale 0, code `clip_min` and offset `min`, so it
//! decodes exactly to `min`. An all-zero symmetric group gets scale 0 and
//! codes 0. A row with no columns has one (empty) group with parameters 0.
//!
//! **f16 parameters** (`…:f16`). Where the format is one of ggml's blocks
//! (`u4sym` = Q4_0, `u4asym` = Q4_1, `i8sym` = Q8_0, any group size) the
//! quantizer is ggml's reference one, step for step in f32: the scale (and
//! min) in f32, codes against that f32 scale (`u4asym`: min(15,
//! trunc((w − min)·(1/scale) + 0.5)); `i8sym`: round-half-away(w·(1/scale))),
//! then the parameters rounded to f16 (ties to even). So the same f32
//! weights give the same bytes as llama.cpp's quantizer, and the stored
//! parameters decode exactly as ggml decodes them. `i8asym` and `e0m4`
//! with f16 parameters quantize as with f32 ones, then round the
//! parameters to f16. Parameters beyond f16's range are an error.

use super::e0m4::quantize_group_e0m4;
use super::fp8::{f32_to_fp8_e4m3, f32_to_fp8_e5m2};
use super::{QuantError, QuantTensor, groups_per_row, quantize_row_i8dyn};
use crate::ir::{Format, Group, ParamType};

/// Quantize a row-major `[rows, cols]` f32 matrix into `format`.
///
/// Errors: `format` not quantized (f32/f16/bf16: use `half` for those),
/// a group size that is not a positive multiple of 4, `data.len() !=
/// rows·cols`, a non-finite element (by index), or parameters that overflow
/// f32 (only for groups spanning more than ~1e38).
pub fn quantize(
    format: Format,
    rows: usize,
    cols: usize,
    data: &[f32],
) -> Result<QuantTensor, QuantError> {
    if matches!(format, Format::F32 | Format::F16 | Format::BF16) {
        return Err(QuantError::NotQuantized(format));
    }
    if let Some(Group::Size(g)) = format.group()
        && (g == 0 || g % 4 != 0)
    {
        return Err(QuantError::GroupSize { group: g });
    }
    let n = rows.checked_mul(cols).ok_or(QuantError::SizeOverflow {
        what: "rows × cols",
    })?;
    if data.len() != n {
        return Err(QuantError::Length {
            what: "data",
            expected: n,
            got: data.len(),
        });
    }
    if let Some(index) = data.iter().position(|x| !x.is_finite()) {
        return Err(QuantError::NonFinite {
            index,
            value: data[index].to_string(),
        });
    }
    let mut t = QuantTensor {
        format,
        rows,
        cols,
        codes: Vec::with_capacity(n),
        scales: Vec::new(),
        offsets: Vec::new(),
    };
    match format {
        Format::Fp8E4M3 => t.codes.extend(data.iter().map(|&x| f32_to_fp8_e4m3(x))),
        Format::Fp8E5M2 => t.codes.extend(data.iter().map(|&x| f32_to_fp8_e5m2(x))),
        _ => {
            let group = format.group().unwrap_or(Group::Row);
            let glen = group.len(cols).max(1);
            t.scales.reserve(rows * groups_per_row(group, cols));
            for r in 0..rows {
                if cols == 0 {
                    // The one (empty) group of an empty row.
                    t.scales.push(0.0);
                    if format.is_asymmetric() {
                        t.offsets.push(0.0);
                    }
                    continue;
                }
                for g in data[r * cols..(r + 1) * cols].chunks(glen) {
                    quantize_group(format, g, &mut t)?;
                }
            }
        }
    }
    debug_assert!(t.validate().is_ok());
    Ok(t)
}

/// Quantize one group, appending its codes and parameters to `t`.
fn quantize_group(format: Format, g: &[f32], t: &mut QuantTensor) -> Result<(), QuantError> {
    match format {
        Format::U4Asym(_, ParamType::F16) => {
            let (scale, min) = ggml_q4_1_group(g, &mut t.codes);
            t.scales.push(scale);
            t.offsets.push(min);
        }
        Format::U4Sym(..) => t.scales.push(ggml_q4_0_group(g, &mut t.codes)),
        Format::I8Sym(_, ParamType::F16) => t.scales.push(ggml_q8_0_group(g, &mut t.codes)),
        Format::U4Asym(..) => {
            let (scale, offset) = affine_group(g, 0, 15, &mut t.codes)?;
            t.scales.push(scale);
            t.offsets.push(offset);
        }
        Format::I8Asym(..) => {
            let (scale, min) = affine_group(g, -128, 127, &mut t.codes)?;
            t.scales.push(scale);
            t.offsets
                .push((f64::from(min) + 128.0 * f64::from(scale)) as f32);
        }
        Format::I8Sym(..) | Format::I8Dyn => {
            let (codes, scale) = quantize_row_i8dyn(g);
            t.codes.extend(codes.iter().map(|&q| q as u8));
            t.scales.push(scale);
        }
        Format::E0M4(..) => {
            let q = quantize_group_e0m4(g)?;
            t.codes.extend(q.codes);
            t.scales.push(q.scale);
            t.offsets.push(q.bias);
        }
        // Float formats never reach here (handled by `quantize`).
        Format::F32 | Format::F16 | Format::BF16 | Format::Fp8E4M3 | Format::Fp8E5M2 => {
            return Err(QuantError::NotQuantized(format));
        }
    }
    if format.has_f16_params() {
        round_last_params_to_f16(t)?;
    }
    check_decodes_finite(format, t)
}

/// Round the group just pushed's parameters to f16 (ties to even), the
/// precision they are stored in; a parameter beyond f16's range is an error.
fn round_last_params_to_f16(t: &mut QuantTensor) -> Result<(), QuantError> {
    let round = |v: &mut f32, what: &'static str| {
        let h = half::f16::from_f32(*v);
        if h.is_finite() {
            *v = h.to_f32();
            Ok(())
        } else {
            Err(QuantError::ParamOverflow { what })
        }
    };
    if let Some(s) = t.scales.last_mut() {
        round(s, "scale (beyond f16's range)")?;
    }
    if let Some(o) = t.offsets.last_mut() {
        round(o, "offset (beyond f16's range)")?;
    }
    Ok(())
}

/// ggml's `quantize_row_q4_0_ref` on one group: scale = m/−8 for the value m
/// of largest magnitude, codes min(15, trunc(w/scale + 8.5)) in f32.
/// Returns the f32 scale (rounded to f16 by the caller where stored so).
fn ggml_q4_0_group(g: &[f32], codes: &mut Vec<u8>) -> f32 {
    let mut amax = 0.0f32;
    let mut max = 0.0f32;
    for &w in g {
        if amax < w.abs() {
            amax = w.abs();
            max = w;
        }
    }
    let scale = max / -8.0;
    let inv = if scale != 0.0 { 1.0 / scale } else { 0.0 };
    // w·inv + 8.5 lies in [0.5, 16.5]: truncation is the C cast to int8.
    codes.extend(g.iter().map(|&w| ((w * inv + 8.5).trunc() as u8).min(15)));
    scale
}

/// ggml's `quantize_row_q4_1_ref` on one group: scale = (max − min)/15,
/// codes min(15, trunc((w − min)/scale + 0.5)) in f32. Returns (scale, min).
fn ggml_q4_1_group(g: &[f32], codes: &mut Vec<u8>) -> (f32, f32) {
    let (min, max) = min_max(g);
    let scale = (max - min) / 15.0;
    let inv = if scale != 0.0 { 1.0 / scale } else { 0.0 };
    codes.extend(
        g.iter()
            .map(|&w| (((w - min) * inv + 0.5).trunc() as u8).min(15)),
    );
    (scale, min)
}

/// ggml's `quantize_row_q8_0_ref` on one group: scale = absmax/127, codes
/// round-half-away-from-zero(w/scale) in f32. Returns the scale.
///
/// The clamp to ±127 changes nothing where ggml's C is defined (|w·inv| ≤
/// 127 up to rounding); it matters when absmax is subnormal: 1/scale is
/// then +inf, w·inv ±inf, and C's cast to int8 undefined — here the code
/// stays in i8sym's range (and the scale rounds to 0 in f16 anyway).
fn ggml_q8_0_group(g: &[f32], codes: &mut Vec<u8>) -> f32 {
    let amax = g.iter().fold(0.0f32, |m, &w| m.max(w.abs()));
    let scale = amax / 127.0;
    let inv = if scale != 0.0 { 1.0 / scale } else { 0.0 };
    codes.extend(
        g.iter()
            .map(|&w| (w * inv).round().clamp(-127.0, 127.0) as i8 as u8),
    );
    scale
}

/// The kernels (and [`QuantTensor::value`]) compute `scale·v(q) + offset`
/// in f32; refuse parameters for which that overflows at either end of the
/// code range (only groups spanning more than ~1e38 get here).
fn check_decodes_finite(format: Format, t: &QuantTensor) -> Result<(), QuantError> {
    let (v_lo, v_hi) = match format {
        Format::U4Asym(..) => (0.0, 15.0),
        Format::I8Asym(..) => (-128.0, 127.0),
        Format::E0M4(..) => (2.0, 3.875),
        _ => (-127.0, 127.0),
    };
    let scale = t.scales.last().copied().unwrap_or(0.0);
    let offset = t.offsets.last().copied().unwrap_or(0.0);
    if (scale * v_lo + offset).is_finite() && (scale * v_hi + offset).is_finite() {
        Ok(())
    } else {
        Err(QuantError::ParamOverflow {
            what: "scale·v(q) + offset",
        })
    }
}

/// MNN-LLM formula (1) on one non-empty group: pushes the codes (as bytes)
/// and returns `(scale, min)`.
fn affine_group(
    g: &[f32],
    clip_min: i32,
    clip_max: i32,
    codes: &mut Vec<u8>,
) -> Result<(f32, f32), QuantError> {
    let (min, max) = min_max(g);
    let steps = f64::from(clip_max - clip_min);
    let scale = ((f64::from(max) - f64::from(min)) / steps) as f32;
    if scale == 0.0 {
        codes.extend(std::iter::repeat_n(clip_min as u8, g.len()));
        return Ok((0.0, min));
    }
    let (s, lo) = (f64::from(scale), f64::from(min));
    codes.extend(g.iter().map(|&w| {
        let q = ((f64::from(w) - lo) / s).round_ties_even() + f64::from(clip_min);
        q.clamp(f64::from(clip_min), f64::from(clip_max)) as i32 as u8
    }));
    Ok((scale, min))
}

/// Minimum and maximum of a slice of finite values ((0, 0) if empty).
pub(crate) fn min_max(g: &[f32]) -> (f32, f32) {
    if g.is_empty() {
        return (0.0, 0.0);
    }
    g.iter()
        .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &x| {
            (lo.min(x), hi.max(x))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by fuzzing model files: a group of subnormals makes 1/scale
    /// infinite; every format still gives a valid tensor.
    #[test]
    fn subnormal_groups_quantize_to_valid_tensors() {
        // absmax/127 is a nonzero subnormal whose reciprocal overflows.
        let a = 1e-38f32;
        assert!((1.0 / (a / 127.0)).is_infinite() && a / 127.0 > 0.0);
        let g: Vec<f32> = (0..32).map(|i| [a, -a, 0.0, 0.3 * a][i % 4]).collect();
        let g32 = Group::Size(32);
        for format in [
            Format::I8Sym(g32, ParamType::F16),
            Format::I8Sym(g32, ParamType::F32),
            Format::U4Sym(g32, ParamType::F16),
            Format::U4Asym(g32, ParamType::F16),
            Format::U4Asym(g32, ParamType::F32),
            Format::I8Asym(g32, ParamType::F32),
        ] {
            let t = quantize(format, 1, 32, &g).unwrap();
            t.validate().unwrap_or_else(|e| panic!("{format}: {e}"));
        }
    }

    #[test]
    fn u4asym_formula_one() {
        // min 0, max 15 → scale 1, offset 0; 7.5 is a tie → even 8.
        let t = quantize(
            Format::U4Asym(Group::Row, ParamType::F32),
            1,
            4,
            &[0.0, 15.0, 7.5, 6.5],
        )
        .unwrap();
        assert_eq!(t.codes, vec![0, 15, 8, 6]);
        assert_eq!((t.scales[0], t.offsets[0]), (1.0, 0.0));
    }

    #[test]
    fn i8asym_offset_is_min_plus_128_scale() {
        let t = quantize(
            Format::I8Asym(Group::Row, ParamType::F32),
            1,
            3,
            &[-1.0, 254.0, 0.0],
        )
        .unwrap();
        assert_eq!(t.scales, vec![1.0]);
        assert_eq!(t.offsets, vec![127.0]);
        assert_eq!(t.codes, vec![(-128i8) as u8, 127, (-127i8) as u8]);
        assert_eq!(t.dequantize(), vec![-1.0, 254.0, 0.0]);
    }

    #[test]
    fn partial_last_group() {
        let data: Vec<f32> = (0..10).map(|i| i as f32).collect();
        let t = quantize(Format::I8Sym(Group::Size(8), ParamType::F32), 1, 10, &data).unwrap();
        assert_eq!(t.scales, vec![7.0 / 127.0, 9.0 / 127.0]);
        assert_eq!(t.codes[8..], [113, 127]); // 8·127/9 = 112.9
    }

    #[test]
    fn errors_name_the_problem() {
        assert_eq!(
            quantize(Format::I8Dyn, 2, 2, &[0.0, 1.0, f32::NAN, 2.0]),
            Err(QuantError::NonFinite {
                index: 2,
                value: "NaN".into()
            })
        );
        assert!(matches!(
            quantize(Format::I8Dyn, 2, 2, &[0.0; 3]),
            Err(QuantError::Length {
                expected: 4,
                got: 3,
                ..
            })
        ));
        assert_eq!(
            quantize(Format::F16, 1, 1, &[0.0]),
            Err(QuantError::NotQuantized(Format::F16))
        );
        assert_eq!(
            quantize(
                Format::U4Asym(Group::Size(6), ParamType::F32),
                1,
                6,
                &[0.0; 6]
            ),
            Err(QuantError::GroupSize { group: 6 })
        );
        assert!(matches!(
            quantize(Format::I8Dyn, usize::MAX, 2, &[]),
            Err(QuantError::SizeOverflow { .. })
        ));
    }

    #[test]
    fn empty_rows_and_cols() {
        let t = quantize(Format::U4Asym(Group::Size(32), ParamType::F32), 3, 0, &[]).unwrap();
        assert_eq!((t.scales.len(), t.offsets.len()), (3, 3));
        t.validate().unwrap();
        let t = quantize(Format::I8Sym(Group::Row, ParamType::F32), 0, 5, &[]).unwrap();
        assert!(t.scales.is_empty());
        t.validate().unwrap();
    }

    #[test]
    fn extreme_values_decode_finite_or_error() {
        let formats = [
            Format::U4Asym(Group::Row, ParamType::F32),
            Format::I8Asym(Group::Row, ParamType::F32),
            Format::I8Sym(Group::Row, ParamType::F32),
            Format::E0M4(Group::Row, ParamType::F32),
        ];
        for f in formats {
            let t = quantize(f, 1, 4, &[-1e37, 1e37, 0.0, 1.0]).unwrap();
            assert!(t.dequantize().iter().all(|x| x.is_finite()), "{f}");
        }
        for f in [formats[0], formats[1], formats[3]] {
            assert!(
                matches!(
                    quantize(f, 1, 2, &[-3.4e38, 3.4e38]),
                    Err(QuantError::ParamOverflow { .. })
                ),
                "{f}"
            );
        }
    }
}
