//! E0M4 FP4 quantization of one group (Transformer-Lite 2.3).
//!
//! Every element of a group is mapped affinely into the fp16 binade [2, 4),
//! where all values share sign and exponent (fp16 bits `0x4000 | f`, f the
//! 10 fraction bits, one unit of the top 4 fraction bits = 1/8). The code is
//! the top 4 fraction bits `y1 = f >> 6` rounded with the next bit
//! `y2 = (f >> 5) & 1`: `q = min(y1 + y2, 15)`. Dequantization is the
//! paper's shift-and-OR, `v(q) = as_f16(0x4000 | q << 6) = 2 + q/8`, and
//! (the meaning fixed in [`super`])
//!
//! ```text
//!   w ≈ scale · (2 + q/8) + bias
//! ```
//!
//! Scale and bias come from the group's `min` and `max`:
//!
//! * zero inside the group (`min ≤ 0 ≤ max`): `scale = (max − min)/1.75`
//!   (14 steps) and the mapped image of zero, `c = 2 − min/scale`, is rounded
//!   **up** onto the 1/8 grid: `c = 2 + ceil(8·(−min/scale))/8`. This is the
//!   paper's "zero the non-intercepted fraction bits of the bias" — zero
//!   lands exactly on a code, so zeros (and zero padding) dequantize to
//!   exactly 0.0 — while rounding up by less than one step keeps the group
//!   inside [2, 2 + 15/8] (that is what the 15th step is reserved for).
//!   `w1 = w/scale + c`, `bias = −scale·c`.
//! * otherwise: `scale = (max − min)/1.875` (15 steps), `w1 = (w − min)/scale
//!   + 2`, `bias = min − 2·scale`.
//! * `max == min` (or a range so small the scale underflows to 0):
//!   `scale = 0`, `q = 0`, `bias = min`, so every element decodes to `min`.
//!
//! `w1` is computed in f64, clamped to [2, 4) and rounded once to fp16
//! (nearest even), as the paper's fp16 `w1` tensor; then the 4+1 bits are
//! taken. Error bound: the 5-bit rounding is at most half a step (1/16 in w1
//! units) and the fp16 rounding before it adds at most half an fp16 ulp
//! (2^-10), so `|w − dequant(q)| ≤ scale·(1/16 + 1/1024)` plus f32 rounding
//! of the final `scale·v + bias`.

use super::QuantError;

/// The result of quantizing one E0M4 group.
#[derive(Clone, Debug, PartialEq)]
pub struct E0M4Group {
    /// One code 0..=15 per element.
    pub codes: Vec<u8>,
    pub scale: f32,
    pub bias: f32,
}

/// Quantize one group of finite values. Errors only if scale or bias does
/// not fit in f32 (a group spanning more than about 5.9e38).
pub fn quantize_group_e0m4(group: &[f32]) -> Result<E0M4Group, QuantError> {
    let (min, max) = super::quantize::min_max(group);
    let constant = E0M4Group {
        codes: vec![0; group.len()],
        scale: 0.0,
        bias: if group.is_empty() { 0.0 } else { min },
    };
    if group.is_empty() || max == min {
        return Ok(constant);
    }
    let (min, max) = (f64::from(min), f64::from(max));
    let range = max - min;
    let zero_inside = min <= 0.0 && 0.0 <= max;
    let steps = if zero_inside { 1.75 } else { 1.875 };
    let scale = (range / steps) as f32;
    if !scale.is_finite() {
        return Err(QuantError::ParamOverflow { what: "e0m4 scale" });
    }
    if scale == 0.0 {
        return Ok(constant);
    }
    let s = f64::from(scale);
    // w1 = w/s + c0 where c0 absorbs min; `shift` is what is subtracted
    // from w first, to keep the far-from-zero case well conditioned.
    let (shift, c) = if zero_inside {
        let k = (8.0 * (-min / s)).ceil().clamp(0.0, 14.0);
        (0.0, 2.0 + k / 8.0)
    } else {
        (min, 2.0)
    };
    let bias = if zero_inside { -(s * c) } else { min - 2.0 * s };
    let bias32 = bias as f32;
    if !bias32.is_finite() {
        return Err(QuantError::ParamOverflow { what: "e0m4 bias" });
    }
    let codes = group
        .iter()
        .map(|&w| {
            let w1 = ((f64::from(w) - shift) / s + c).clamp(2.0, 4.0 - 1.0 / 1024.0);
            let f = half::f16::from_f64(w1).to_bits() & 0x03FF;
            let y1 = f >> 6;
            let y2 = (f >> 5) & 1;
            (y1 + y2).min(15) as u8
        })
        .collect();
    Ok(E0M4Group {
        codes,
        scale,
        bias: bias32,
    })
}

#[cfg(test)]
mod tests {
    use super::super::e0m4_value;
    use super::*;

    fn dequant(g: &E0M4Group) -> Vec<f32> {
        g.codes
            .iter()
            .map(|&q| g.scale * e0m4_value(q) + g.bias)
            .collect()
    }

    #[test]
    fn zero_is_exact_and_grid_is_hit() {
        // min -11/16, max 17/16: scale 1; -min/scale = 0.6875 → 8·0.6875 =
        // 5.5 rounds up to 6, so c = 2.75 and bias = -2.75.
        let g = quantize_group_e0m4(&[-0.6875, 0.0, 1.0625, 0.25]).unwrap();
        assert_eq!((g.scale, g.bias), (1.0, -2.75));
        // w1 = 2.0625 (fp16 fraction 32: y1 0, y2 1), 2.75, 3.8125 (fraction
        // 928: y1 14, y2 1), 3.0.
        assert_eq!(g.codes, vec![1, 6, 15, 8]);
        let d = dequant(&g);
        assert_eq!(d[1], 0.0);
        assert_eq!(d[3], 0.25);
    }

    #[test]
    fn one_sided_group_uses_fifteen_steps() {
        let g = quantize_group_e0m4(&[1.0, 2.875]).unwrap();
        assert_eq!(g.scale, 1.0);
        assert_eq!(g.bias, -1.0);
        assert_eq!(g.codes, vec![0, 15]);
        assert_eq!(dequant(&g), vec![1.0, 2.875]);
    }

    #[test]
    fn constant_and_empty_groups() {
        let g = quantize_group_e0m4(&[3.5; 5]).unwrap();
        assert_eq!((g.scale, g.bias), (0.0, 3.5));
        assert_eq!(dequant(&g), vec![3.5; 5]);
        let g = quantize_group_e0m4(&[]).unwrap();
        assert!(g.codes.is_empty());
    }

    #[test]
    fn round_bit_and_saturation() {
        // scale 1, c = 2 (min 0): w = 1/16 is the y2 tie → rounds up to 1.
        let g = quantize_group_e0m4(&[0.0, 0.0625, 0.06, 1.75]).unwrap();
        assert_eq!(g.codes, vec![0, 1, 0, 14]);
    }

    #[test]
    fn huge_range_is_an_error_not_inf() {
        assert!(matches!(
            quantize_group_e0m4(&[-3e38, 3e38]),
            Err(QuantError::ParamOverflow { .. })
        ));
    }
}
