//! f32 → fp8 encoders (OCP e4m3 "fn" and e5m2), the inverse of
//! [`super::fp8_e4m3_to_f32`] / [`super::fp8_e5m2_to_f32`].
//!
//! Byte layout of both: bit 7 sign, then the exponent field, then the
//! mantissa field (e4m3: `s eeee mmm`, bias 7; e5m2: `s eeeee mm`, bias 15,
//! i.e. the top byte of an IEEE fp16).
//!
//! Rounding is to nearest, ties to even, done once from the exact f32 value
//! (no detour through f16, which would round twice). Overflow **saturates**
//! to the largest finite magnitude for both formats (e4m3: ±448 = 0x7E/0xFE;
//! e5m2: ±57344 = 0x7B/0xFB): KV values are finite by construction and a
//! saturated value is a smaller error than an infinity poisoning a whole
//! softmax row. Negative zero and negative values that round to zero keep
//! their sign bit (0x80). NaN input encodes as the format's canonical NaN
//! (e4m3 0x7F, e5m2 0x7E) with the input's sign; infinities saturate like
//! any other overflow. The quantizers reject non-finite input before they
//! get here, so those two rules only make the encoders total.

/// Shape of an fp8 encoding.
#[derive(Clone, Copy)]
struct Fp8Spec {
    mantissa_bits: u32,
    bias: i32,
    /// Largest finite code without the sign bit.
    max_code: u8,
    nan_code: u8,
}

const E4M3: Fp8Spec = Fp8Spec {
    mantissa_bits: 3,
    bias: 7,
    max_code: 0x7E,
    nan_code: 0x7F,
};

const E5M2: Fp8Spec = Fp8Spec {
    mantissa_bits: 2,
    bias: 15,
    max_code: 0x7B,
    nan_code: 0x7E,
};

/// f32 → fp8 e4m3 (OCP "fn"), round to nearest even, saturating at ±448.
pub fn f32_to_fp8_e4m3(x: f32) -> u8 {
    encode(E4M3, x)
}

/// f32 → fp8 e5m2, round to nearest even, saturating at ±57344.
pub fn f32_to_fp8_e5m2(x: f32) -> u8 {
    encode(E5M2, x)
}

/// Round-to-nearest-even encoding. Works in f64, where every step below is
/// exact: an f32 is exact in f64, scaling by powers of two is exact, and the
/// scaled value has at most 24 significant bits.
fn encode(spec: Fp8Spec, x: f32) -> u8 {
    let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
    if x.is_nan() {
        return sign | spec.nan_code;
    }
    if x.is_infinite() {
        return sign | spec.max_code;
    }
    let a = f64::from(x.abs());
    let m = spec.mantissa_bits as i32;
    let min_normal_exp = 1 - spec.bias;
    // Magnitude code as an integer: codes are monotonic in the value, and
    // the encoding `exp << m | frac` carries a mantissa overflow into the
    // exponent by plain addition.
    let code: i64 = if a < 2f64.powi(min_normal_exp) {
        // Subnormal (or zero): multiples of 2^(min_normal_exp - m). A result
        // of 2^m is the smallest normal, whose code is exactly 2^m.
        (a * 2f64.powi(m - min_normal_exp)).round_ties_even() as i64
    } else {
        // Normal: a = 2^e · f with f in [1, 2). `a` is a normal f32 here
        // (fp8's smallest normal is far above f32's), so e comes from its bits.
        let e = ((x.abs().to_bits() >> 23) & 0xFF) as i32 - 127;
        let f = a * 2f64.powi(-e);
        let frac = ((f - 1.0) * 2f64.powi(m)).round_ties_even() as i64;
        (i64::from(e + spec.bias) << m) + frac
    };
    let code = code.min(i64::from(spec.max_code));
    sign | code as u8
}

#[cfg(test)]
mod tests {
    use super::super::{fp8_e4m3_to_f32, fp8_e5m2_to_f32};
    use super::*;

    #[test]
    fn every_finite_code_round_trips() {
        for b in 0..=255u8 {
            let v = fp8_e4m3_to_f32(b);
            if !v.is_nan() {
                assert_eq!(f32_to_fp8_e4m3(v), b, "e4m3 {b:#04x} = {v}");
            }
            let v = fp8_e5m2_to_f32(b);
            if v.is_finite() {
                assert_eq!(f32_to_fp8_e5m2(v), b, "e5m2 {b:#04x} = {v}");
            }
        }
    }

    #[test]
    fn known_values_and_saturation() {
        assert_eq!(f32_to_fp8_e4m3(1.0), 0x38);
        assert_eq!(f32_to_fp8_e4m3(-1.0), 0xB8);
        assert_eq!(f32_to_fp8_e4m3(448.0), 0x7E);
        assert_eq!(f32_to_fp8_e4m3(464.0), 0x7E); // would round to 480, saturates
        assert_eq!(f32_to_fp8_e4m3(1e30), 0x7E);
        assert_eq!(f32_to_fp8_e4m3(-1e30), 0xFE);
        assert_eq!(f32_to_fp8_e4m3(f32::INFINITY), 0x7E);
        assert_eq!(f32_to_fp8_e4m3(f32::NAN), 0x7F);
        // Smallest subnormal 2^-9; half of it is a tie that goes to even 0.
        assert_eq!(f32_to_fp8_e4m3(2f32.powi(-9)), 0x01);
        assert_eq!(f32_to_fp8_e4m3(2f32.powi(-10)), 0x00);
        assert_eq!(f32_to_fp8_e4m3(1.5 * 2f32.powi(-9)), 0x02); // tie 1.5 → 2
        assert_eq!(f32_to_fp8_e4m3(-0.0), 0x80);
        // 1 + 1/16 is the tie between 1.0 (0x38, even) and 1.125 (0x39).
        assert_eq!(f32_to_fp8_e4m3(1.0625), 0x38);
        assert_eq!(f32_to_fp8_e4m3(1.1875), 0x3A); // tie 1.125 / 1.25 → even 0x3A
        // Largest subnormal 7·2^-9 rounds up into the smallest normal.
        assert_eq!(f32_to_fp8_e4m3(7.6 * 2f32.powi(-9)), 0x08);
        assert_eq!(f32_to_fp8_e5m2(1.0), 0x3C);
        assert_eq!(f32_to_fp8_e5m2(57344.0), 0x7B);
        assert_eq!(f32_to_fp8_e5m2(1e9), 0x7B);
        assert_eq!(f32_to_fp8_e5m2(-1e9), 0xFB);
        assert_eq!(f32_to_fp8_e5m2(2f32.powi(-16)), 0x01);
    }

    /// e5m2 is the top byte of an fp16, so for every finite fp16 value (exact
    /// in f32) the encoder must equal integer round-to-nearest-even of the
    /// fp16 bits to 8 bits, saturated: an independent oracle.
    #[test]
    fn e5m2_matches_fp16_bit_rounding() {
        for bits in 0..=u16::MAX {
            let h = half::f16::from_bits(bits);
            if !h.is_finite() {
                continue;
            }
            let sign = (bits >> 8) as u8 & 0x80;
            let mag = bits & 0x7FFF;
            let (hi, lo) = (mag >> 8, mag & 0xFF);
            let up = lo > 0x80 || (lo == 0x80 && hi & 1 == 1);
            let rounded = (hi + u16::from(up)).min(0x7B) as u8;
            assert_eq!(
                f32_to_fp8_e5m2(h.to_f32()),
                sign | rounded,
                "fp16 bits {bits:#06x}"
            );
        }
    }

    /// For e4m3, every value between two adjacent codes goes to the nearer
    /// one, and exact midpoints go to the even code.
    #[test]
    fn e4m3_midpoints_round_to_even() {
        for b in 0..0x7Eu8 {
            let (lo, hi) = (fp8_e4m3_to_f32(b), fp8_e4m3_to_f32(b + 1));
            let mid = (lo + hi) / 2.0;
            let even = if b % 2 == 0 { b } else { b + 1 };
            assert_eq!(f32_to_fp8_e4m3(mid), even, "mid of {b:#04x}");
            assert_eq!(f32_to_fp8_e4m3(mid.next_down()), b);
            assert_eq!(f32_to_fp8_e4m3(mid.next_up()), b + 1);
        }
    }
}
