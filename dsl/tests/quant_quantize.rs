//! Quantizers: dequantize(quantize(x)) stays within half a quantization step
//! of x for every format, codes are in range and nearest, zero rows and
//! constant groups are exact, errors name the element.

use proptest::prelude::*;
use tessera_dsl::ir::ParamType;
use tessera_dsl::quant::{
    QuantError, QuantTensor, fp8_e4m3_to_f32, fp8_e5m2_to_f32, quantize, quantize_row_i8dyn,
};
use tessera_dsl::{Format, Group};

fn formats() -> Vec<Format> {
    let mut v = vec![Format::I8Dyn, Format::Fp8E4M3, Format::Fp8E5M2];
    for g in [Group::Size(4), Group::Size(8), Group::Size(32), Group::Row] {
        v.extend([
            Format::U4Asym(g, ParamType::F32),
            Format::I8Sym(g, ParamType::F32),
            Format::I8Asym(g, ParamType::F32),
            Format::E0M4(g, ParamType::F32),
        ]);
    }
    v
}

/// Largest |x| of the group holding (r, c), for the f32 rounding allowance.
fn group_absmax(t: &QuantTensor, data: &[f32], r: usize, c: usize) -> f32 {
    let g = t.group_len();
    let start = c / g * g;
    let end = (start + g).min(t.cols);
    data[r * t.cols + start..r * t.cols + end]
        .iter()
        .fold(0.0f32, |m, x| m.max(x.abs()))
}

/// Allowed |x − dequant| at (r, c): half a step, plus a few f32 roundings of
/// the group's magnitude (scale and offset are stored rounded, and
/// `scale·v + offset` rounds twice).
fn bound(t: &QuantTensor, data: &[f32], r: usize, c: usize) -> f32 {
    let x = data[r * t.cols + c];
    match t.format {
        // Half a step relative to x's binade; below the smallest normal the
        // subnormal spacing is absolute.
        Format::Fp8E4M3 => (x.abs() * 2f32.powi(-4)).max(2f32.powi(-10)),
        Format::Fp8E5M2 => (x.abs() * 2f32.powi(-3)).max(2f32.powi(-17)),
        f => {
            let scale = t.scale(r, c);
            let half_step = match f {
                // 5-bit rounding of the fp16 w1 plus half an fp16 ulp (2^-10).
                Format::E0M4(..) => scale * (1.0 / 16.0 + 1.0 / 1024.0),
                _ => scale / 2.0,
            };
            let mag = group_absmax(t, data, r, c) + t.offset(r, c).abs();
            half_step + 8.0 * f32::EPSILON * mag
        }
    }
}

fn check_round_trip(format: Format, rows: usize, cols: usize, data: &[f32]) {
    let t = quantize(format, rows, cols, data).unwrap();
    t.validate().unwrap();
    assert_eq!(t.codes.len(), rows * cols);
    let deq = t.dequantize();
    for r in 0..rows {
        for c in 0..cols {
            let x = data[r * cols + c];
            let y = deq[r * cols + c];
            let saturated = match format {
                Format::Fp8E4M3 if x.abs() > 448.0 => Some(448.0f32.copysign(x)),
                Format::Fp8E5M2 if x.abs() > 57344.0 => Some(57344.0f32.copysign(x)),
                _ => None,
            };
            if let Some(s) = saturated {
                assert_eq!(y, s, "{format} saturates at ({r}, {c})");
                continue;
            }
            let b = bound(&t, data, r, c);
            assert!(
                (x - y).abs() <= b,
                "{format} at ({r}, {c}): x {x} → {y}, error {} > {b} (scale {:?})",
                (x - y).abs(),
                t.format.group().map(|_| t.scale(r, c))
            );
        }
    }
}

/// Mixed data: ordinary values at a random magnitude, exact zeros, whole
/// zero rows and constant runs.
fn matrix() -> impl Strategy<Value = (usize, usize, Vec<f32>)> {
    (0usize..5, 0usize..41, -6i32..7).prop_flat_map(|(rows, cols, exp)| {
        let mag = 10f32.powi(exp);
        let elem = prop_oneof![
            6 => (-1.0f32..1.0).prop_map(move |x| x * mag),
            1 => Just(0.0f32),
            1 => Just(mag / 3.0),
        ];
        (
            Just(rows),
            Just(cols),
            prop::collection::vec(elem, rows * cols),
            prop::collection::vec(any::<bool>(), rows),
        )
            .prop_map(|(rows, cols, mut data, zero_rows)| {
                for (r, z) in zero_rows.iter().enumerate() {
                    if *z && r % 2 == 0 {
                        data[r * cols..(r + 1) * cols].fill(0.0);
                    }
                }
                (rows, cols, data)
            })
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn round_trip_within_half_a_step((rows, cols, data) in matrix(), pick in 0usize..19) {
        let format = formats()[pick];
        check_round_trip(format, rows, cols, &data);
    }

    /// Affine codes are the nearest grid point of formula (1) (ties may go
    /// either way by rounding of the scale): |(w − min)/scale − (q − clip_min)|
    /// ≤ 1/2 (+ tiny), and within the clip range.
    #[test]
    fn affine_codes_are_nearest((rows, cols, data) in matrix(), asym_i8 in any::<bool>()) {
        let (format, clip_min, clip_max) = if asym_i8 {
            (Format::I8Asym(Group::Size(8), ParamType::F32), -128i32, 127i32)
        } else {
            (Format::U4Asym(Group::Size(8), ParamType::F32), 0, 15)
        };
        let t = quantize(format, rows, cols, &data).unwrap();
        for r in 0..rows {
            for c in 0..cols {
                let q = t.code(r, c);
                prop_assert!((clip_min..=clip_max).contains(&q));
                let start = c / 8 * 8;
                let g = &data[r * cols + start..r * cols + (start + 8).min(cols)];
                let min = g.iter().fold(f32::INFINITY, |m, &x| m.min(x));
                let scale = t.scale(r, c);
                if scale == 0.0 {
                    prop_assert_eq!(q, clip_min);
                    continue;
                }
                let exact = (f64::from(data[r * cols + c]) - f64::from(min)) / f64::from(scale);
                prop_assert!((exact - f64::from(q - clip_min)).abs() <= 0.5 + 1e-9);
            }
        }
    }

    /// i8dyn is per-row `quantize_row_i8dyn`, and i8sym with a row group is
    /// the same quantizer.
    #[test]
    fn i8dyn_is_per_row((rows, cols, data) in matrix()) {
        let t = quantize(Format::I8Dyn, rows, cols, &data).unwrap();
        let s = quantize(Format::I8Sym(Group::Row, ParamType::F32), rows, cols, &data).unwrap();
        prop_assert_eq!(&t.codes, &s.codes);
        prop_assert_eq!(&t.scales, &s.scales);
        for r in 0..rows {
            let (codes, scale) = quantize_row_i8dyn(&data[r * cols..(r + 1) * cols]);
            let bytes: Vec<u8> = codes.iter().map(|&q| q as u8).collect();
            prop_assert_eq!(&t.codes[r * cols..(r + 1) * cols], &bytes[..]);
            prop_assert_eq!(t.scales[r], scale);
        }
    }

    /// E0M4: a zero inside a group that spans zero dequantizes to exactly 0.
    #[test]
    fn e0m4_zero_is_exact((rows, cols, data) in matrix()) {
        let t = quantize(Format::E0M4(Group::Size(8), ParamType::F32), rows, cols, &data).unwrap();
        let deq = t.dequantize();
        for (i, (&x, &y)) in data.iter().zip(&deq).enumerate() {
            if x == 0.0 {
                prop_assert_eq!(y, 0.0, "element {}", i);
            }
        }
    }

    /// A non-finite element is reported by its index, whatever the format.
    #[test]
    fn non_finite_is_named(len in 1usize..30, at in any::<prop::sample::Index>(), pick in 0usize..19, kind in 0usize..3) {
        let bad = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY][kind];
        let index = at.index(len);
        let mut data = vec![1.0f32; len];
        data[index] = bad;
        let err = quantize(formats()[pick], 1, len, &data).unwrap_err();
        prop_assert_eq!(err, QuantError::NonFinite { index, value: bad.to_string() });
    }
}

#[test]
fn zero_rows_and_constant_groups_are_exact() {
    let data = [
        0.0f32, 0.0, 0.0, 0.0, 2.5, 2.5, 2.5, 2.5, -1.0, -1.0, -1.0, -1.0,
    ];
    for format in formats() {
        let t = quantize(format, 3, 4, &data).unwrap();
        let deq = t.dequantize();
        assert_eq!(&deq[..4], &[0.0; 4], "{format}: zero row");
        if !matches!(
            format,
            Format::Fp8E4M3 | Format::Fp8E5M2 | Format::I8Sym(..) | Format::I8Dyn
        ) {
            assert_eq!(&deq[4..], &data[4..], "{format}: constant groups");
        }
    }
}

#[test]
fn fp8_round_trip_is_exact_on_codes() {
    // Every finite fp8 value quantizes to itself.
    let e4: Vec<f32> = (0..=255u8)
        .map(fp8_e4m3_to_f32)
        .filter(|x| !x.is_nan())
        .collect();
    let t = quantize(Format::Fp8E4M3, 1, e4.len(), &e4).unwrap();
    assert_eq!(t.dequantize(), e4);
    assert!(t.scales.is_empty() && t.offsets.is_empty());
    let e5: Vec<f32> = (0..=255u8)
        .map(fp8_e5m2_to_f32)
        .filter(|x| x.is_finite())
        .collect();
    let t = quantize(Format::Fp8E5M2, 1, e5.len(), &e5).unwrap();
    assert_eq!(t.dequantize(), e5);
}

#[test]
fn tails_and_large_rows() {
    // cols not a multiple of the group: 3 full groups of 32 and one of 5.
    let data: Vec<f32> = (0..2 * 101)
        .map(|i| ((i * 29) % 53) as f32 - 26.0)
        .collect();
    for format in formats() {
        let t = quantize(format, 2, 101, &data).unwrap();
        if let Some(Group::Size(32)) = format.group() {
            assert_eq!(t.scales.len(), 2 * 4, "{format}");
        }
        check_round_trip(format, 2, 101, &data);
    }
}
