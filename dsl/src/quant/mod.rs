//! Quantization formats: what every code means, in one place.
//!
//! A quantized tensor is logically `[rows, cols]` with `cols` along the
//! reduction axis (l for weights, d for a KV cache) and groups of
//! [`Group::len`] consecutive columns sharing one `scale` and, for
//! asymmetric formats, one `offset`. Every format dequantizes as
//!
//! ```text
//!   w = scale · v(q) + offset        (offset = 0 for symmetric formats)
//! ```
//!
//! where `v(q)` is the code's value as the kernels compute with it:
//!
//! | format | code q | v(q) | offset |
//! |---|---|---|---|
//! | `u4asym` | uint4 0..=15 (int4 pre-converted, seed 000 IV.D) | q | w_min (formula (1), clip [0, 15]) |
//! | `u4sym` | uint4 0..=15, zero point 8 (ggml Q4_0) | q − 8 | 0 |
//! | `i8sym` | int8 -127..=127 | q | 0 |
//! | `i8asym` | int8 -128..=127 | q | w_min + 128·scale (formula (1), clip [-128, 127]) |
//! | `e0m4` | 4 fraction bits of an fp16 in [2, 4) | 2 + q/8 (fp16 bits 0x4000 \| q<<6) | bias |
//! | `i8dyn` | int8 -127..=127, one group per row | q | 0 |
//! | `fp8e4m3`, `fp8e5m2` | the fp8 bits | decoded fp8 | 0, scale 1 |
//!
//! The offset form makes zero-point correction uniform for integer
//! matmuls: Σ x·w over a group = scale·Σ x·q + offset·Σ x (and for
//! `u4sym`, scale·(Σ x·q − 8·Σ x)).
//!
//! Parameters are held here as f32 whatever their storage precision; with
//! f16 parameters (`…:f16`) every value is exactly an f16 (checked by
//! [`QuantTensor::validate`]) and packers store the f16 bits.
//!
//! Where the rest lives:
//! - [`quantize()`](quantize::quantize): f32 → [`QuantTensor`] for every
//!   format (formulas in [`mod@quantize`], E0M4 in [`e0m4`], fp8 encoding in
//!   [`fp8`]).
//! - [`mod@pack`]: [`PackPlan`], logical ↔ packed bytes for any IR [`Layout`],
//!   tiles padded with zero codes, 4-bit nibble order and the int4 pair
//!   transpose, byte by byte.
//! - [`layouts`]: the kernels' concrete layouts (activations, CPU weights,
//!   GPU weights) and the order of their per-group parameters.
//!
//! [`Layout`]: crate::ir::Layout

use crate::ir::{Format, Group, ParamType};

pub mod e0m4;
pub mod fp8;
pub mod ggml;
pub mod layouts;
pub mod pack;
pub mod quantize;

pub use e0m4::{E0M4Group, quantize_group_e0m4};
pub use fp8::{f32_to_fp8_e4m3, f32_to_fp8_e5m2};
pub use ggml::GgmlBlock;
pub use layouts::{
    PackedWeights, ParamOrder, WeightPacking, activation_layout, gpu_weight_layout,
    pack_activations, pack_params, pack_weights, unpack_params, weight_layout,
};
pub use pack::{ElemWidth, PackPlan, Tile, pack, unpack};
pub use quantize::quantize;

/// A quantized `[rows, cols]` tensor in logical (unpacked) form: one code per
/// element, row-major, plus per-group parameters `[rows, groups_per_row]`.
#[derive(Clone, Debug, PartialEq)]
pub struct QuantTensor {
    pub format: Format,
    pub rows: usize,
    pub cols: usize,
    /// One code per element, row-major. Signed codes are two's-complement
    /// bytes (`q as u8`); 4-bit codes use the low nibble.
    pub codes: Vec<u8>,
    /// One scale per group, row-major `[rows, groups_per_row]`.
    pub scales: Vec<f32>,
    /// One offset per group (same shape as `scales`); empty for symmetric
    /// and fp8 formats.
    pub offsets: Vec<f32>,
}

/// Why quantized data cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QuantError {
    #[error("format {0} is not a quantized format")]
    NotQuantized(Format),
    #[error("{what}: expected {expected} elements, got {got}")]
    Length {
        what: &'static str,
        expected: usize,
        got: usize,
    },
    #[error("code {code} at element {index} is out of range for {format}")]
    CodeRange {
        format: Format,
        index: usize,
        code: i32,
    },
    #[error("group size {group} must be a positive multiple of 4")]
    GroupSize { group: u32 },
    #[error("layout: {0}")]
    Layout(String),
    #[error("element {index} is not finite ({value})")]
    NonFinite { index: usize, value: String },
    #[error("{what} overflows usize")]
    SizeOverflow { what: &'static str },
    #[error("4-bit code at element {index} is {byte:#04x}, above 15")]
    Nibble { index: usize, byte: u8 },
    #[error("quantization parameters overflow: {what} is not finite")]
    ParamOverflow { what: &'static str },
    #[error("{what} {index} is {value}, which the format stores as f16 but is not an f16 value")]
    NotF16 {
        what: &'static str,
        index: usize,
        /// The value as printed (f32 is not `Eq`).
        value: String,
    },
}

/// Group parameters (scales or offsets) as `format` stores them, little
/// endian: f32, or f16 for the f16-parameter formats (ggml's blocks). The
/// quantizers round f16 parameters to f16 values, so the narrowing is exact.
pub fn param_bytes(format: Format, values: &[f32]) -> Vec<u8> {
    if format.params() == Some(ParamType::F16) {
        values
            .iter()
            .flat_map(|v| half::f16::from_f32(*v).to_bits().to_le_bytes())
            .collect()
    } else {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }
}

/// Number of groups in a row of `cols` elements (the last may be partial).
pub fn groups_per_row(group: Group, cols: usize) -> usize {
    let g = group.len(cols).max(1);
    cols.div_ceil(g).max(usize::from(cols == 0))
}

impl QuantTensor {
    /// Group size along a row.
    pub fn group_len(&self) -> usize {
        self.format.group().map_or(1, |g| g.len(self.cols)).max(1)
    }

    pub fn groups_per_row(&self) -> usize {
        match self.format.group() {
            Some(g) => groups_per_row(g, self.cols),
            None => 0,
        }
    }

    /// Check lengths and code ranges; every consumer calls this first.
    pub fn validate(&self) -> Result<(), QuantError> {
        if self.format.is_float() && !matches!(self.format, Format::Fp8E4M3 | Format::Fp8E5M2) {
            return Err(QuantError::NotQuantized(self.format));
        }
        if let Some(Group::Size(g)) = self.format.group()
            && (g == 0 || g % 4 != 0)
        {
            return Err(QuantError::GroupSize { group: g });
        }
        let n = self.rows * self.cols;
        if self.codes.len() != n {
            return Err(QuantError::Length {
                what: "codes",
                expected: n,
                got: self.codes.len(),
            });
        }
        let params = self.rows * self.groups_per_row();
        if self.scales.len() != params {
            return Err(QuantError::Length {
                what: "scales",
                expected: params,
                got: self.scales.len(),
            });
        }
        let offsets = if self.format.is_asymmetric() {
            params
        } else {
            0
        };
        if self.offsets.len() != offsets {
            return Err(QuantError::Length {
                what: "offsets",
                expected: offsets,
                got: self.offsets.len(),
            });
        }
        if self.format.has_f16_params() {
            let exact = |v: &f32| half::f16::from_f32(*v).to_f32().to_bits() == v.to_bits();
            if let Some(index) = self.scales.iter().position(|v| !exact(v)) {
                return Err(QuantError::NotF16 {
                    what: "scale",
                    index,
                    value: self.scales[index].to_string(),
                });
            }
            if let Some(index) = self.offsets.iter().position(|v| !exact(v)) {
                return Err(QuantError::NotF16 {
                    what: "offset",
                    index,
                    value: self.offsets[index].to_string(),
                });
            }
        }
        for (index, &b) in self.codes.iter().enumerate() {
            let code = code_of(self.format, b);
            let ok = match self.format {
                Format::U4Asym(..) | Format::E0M4(..) => b <= 15,
                Format::I8Sym(..) | Format::I8Dyn => code >= -127,
                _ => true,
            };
            if !ok {
                return Err(QuantError::CodeRange {
                    format: self.format,
                    index,
                    code,
                });
            }
        }
        Ok(())
    }

    /// The integer code of element (r, c) as kernels compute with it.
    pub fn code(&self, r: usize, c: usize) -> i32 {
        code_of(self.format, self.codes[r * self.cols + c])
    }

    /// Scale of the group holding element (r, c).
    pub fn scale(&self, r: usize, c: usize) -> f32 {
        self.scales[r * self.groups_per_row() + c / self.group_len()]
    }

    /// Offset of the group holding element (r, c) (0 for symmetric formats).
    pub fn offset(&self, r: usize, c: usize) -> f32 {
        if self.offsets.is_empty() {
            0.0
        } else {
            self.offsets[r * self.groups_per_row() + c / self.group_len()]
        }
    }

    /// Dequantized value of element (r, c), computed in f32 exactly as
    /// `scale · v(q) + offset` (one rounding per operation; no addition for
    /// formats without offsets).
    pub fn value(&self, r: usize, c: usize) -> f32 {
        let b = self.codes[r * self.cols + c];
        match self.format {
            Format::Fp8E4M3 => fp8_e4m3_to_f32(b),
            Format::Fp8E5M2 => fp8_e5m2_to_f32(b),
            // No offset, no addition: scale·v alone keeps ggml's −0 for a
            // zero scale and a negative code (Q4_0, Q8_0 bit for bit).
            f if self.offsets.is_empty() => self.scale(r, c) * code_value(f, b),
            f => self.scale(r, c) * code_value(f, b) + self.offset(r, c),
        }
    }

    /// The whole tensor dequantized, row-major.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.rows * self.cols);
        for r in 0..self.rows {
            for c in 0..self.cols {
                out.push(self.value(r, c));
            }
        }
        out
    }
}

/// Integer reading of a stored code byte.
pub fn code_of(format: Format, b: u8) -> i32 {
    match format {
        Format::I8Sym(..) | Format::I8Asym(..) | Format::I8Dyn => b as i8 as i32,
        // ggml Q4_0: the stored nibble less the implied zero point.
        Format::U4Sym(..) => i32::from(b) - 8,
        _ => b as i32,
    }
}

/// v(q): the value a code contributes before scale and offset.
pub fn code_value(format: Format, b: u8) -> f32 {
    match format {
        Format::E0M4(..) => e0m4_value(b),
        Format::Fp8E4M3 => fp8_e4m3_to_f32(b),
        Format::Fp8E5M2 => fp8_e5m2_to_f32(b),
        f => code_of(f, b) as f32,
    }
}

/// E0M4 code → its fp16 value in [2, 4): bits 0x4000 | q << 6, i.e. the
/// "shift and OR" dequantization of Transformer-Lite 2.3.
pub fn e0m4_value(q: u8) -> f32 {
    half::f16::from_bits(0x4000 | (u16::from(q & 0x0F) << 6)).to_f32()
}

/// fp8 e4m3 (OCP "fn": no infinities, 0x7F/0xFF are NaN, max 448) → f32.
pub fn fp8_e4m3_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0f32 } else { 1.0 };
    let exp = i32::from((b >> 3) & 0x0F);
    let man = f32::from(b & 0x07);
    if exp == 0x0F && b & 0x07 == 0x07 {
        return f32::NAN;
    }
    if exp == 0 {
        sign * man / 8.0 * 2f32.powi(-6)
    } else {
        sign * (1.0 + man / 8.0) * 2f32.powi(exp - 7)
    }
}

/// fp8 e5m2 (OCP, IEEE-like: infinities and NaNs, max 57344) → f32.
pub fn fp8_e5m2_to_f32(b: u8) -> f32 {
    // e5m2 is the top byte of an fp16.
    half::f16::from_bits(u16::from(b) << 8).to_f32()
}

/// Dynamic per-row symmetric int8 quantization of activations (the `i8dyn`
/// format): scale = absmax/127; q = round_ties_even(x · (127/absmax)),
/// computed in f32 exactly like the emitted quantizers (multiply by the
/// reciprocal, round to nearest even). An all-zero row gets scale 0 and
/// codes 0.
pub fn quantize_row_i8dyn(row: &[f32]) -> (Vec<i8>, f32) {
    let absmax = row.iter().fold(0.0f32, |m, &x| m.max(x.abs()));
    if absmax == 0.0 || !absmax.is_finite() {
        return (vec![0; row.len()], 0.0);
    }
    let inv = 127.0 / absmax;
    let codes = row
        .iter()
        .map(|&x| (x * inv).round_ties_even().clamp(-127.0, 127.0) as i8)
        .collect();
    (codes, absmax / 127.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::ParamType;

    #[test]
    fn e0m4_values_span_two_to_four() {
        assert_eq!(e0m4_value(0), 2.0);
        assert_eq!(e0m4_value(1), 2.125);
        assert_eq!(e0m4_value(15), 3.875);
    }

    #[test]
    fn fp8_known_values() {
        assert_eq!(fp8_e4m3_to_f32(0x38), 1.0);
        assert_eq!(fp8_e4m3_to_f32(0x7E), 448.0);
        assert_eq!(fp8_e4m3_to_f32(0x01), 2f32.powi(-9));
        assert_eq!(fp8_e4m3_to_f32(0xB8), -1.0);
        assert!(fp8_e4m3_to_f32(0x7F).is_nan());
        assert_eq!(fp8_e5m2_to_f32(0x3C), 1.0);
        assert_eq!(fp8_e5m2_to_f32(0x7B), 57344.0);
        assert_eq!(fp8_e5m2_to_f32(0x7C), f32::INFINITY);
    }

    #[test]
    fn i8dyn_row() {
        let (q, s) = quantize_row_i8dyn(&[1.0, -2.0, 0.5, 0.0]);
        assert_eq!(s, 2.0 / 127.0);
        assert_eq!(q, vec![64, -127, 32, 0]); // 63.5 rounds to even 64; 31.75 -> 32
        assert_eq!(quantize_row_i8dyn(&[0.0, 0.0]), (vec![0, 0], 0.0));
    }

    #[test]
    fn validate_rejects_bad_lengths_and_codes() {
        let t = QuantTensor {
            format: Format::U4Asym(Group::Size(4), ParamType::F32),
            rows: 1,
            cols: 6,
            codes: vec![0, 1, 2, 3, 4, 16],
            scales: vec![1.0, 1.0],
            offsets: vec![0.0, 0.0],
        };
        assert!(matches!(
            t.validate(),
            Err(QuantError::CodeRange { index: 5, .. })
        ));
        let mut ok = t.clone();
        ok.codes[5] = 15;
        ok.validate().unwrap();
        assert_eq!(ok.value(0, 5), 15.0);
        let mut short = ok.clone();
        short.scales.pop();
        assert!(matches!(
            short.validate(),
            Err(QuantError::Length { what: "scales", .. })
        ));
    }
}
