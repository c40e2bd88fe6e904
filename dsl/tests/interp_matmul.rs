//! The matmul oracle checked against plain dense f64 math over dequantized
//! values, for every weight format combination, odd sizes and group tails.

use half::{bf16, f16};
use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tessera_dsl::interp::{Bindings, InterpError, Value, round_to_format, run};
use tessera_dsl::ir::ParamType;
use tessera_dsl::quant::{QuantTensor, groups_per_row, quantize_row_i8dyn};
use tessera_dsl::*;

fn axis(name: &str, kind: AxisKind) -> Axis {
    Axis {
        name: name.into(),
        extent: Extent::Dyn,
        kind,
    }
}

fn tensor(name: &str, role: Role, dims: &[&str], format: Format) -> Tensor {
    Tensor {
        name: name.into(),
        role,
        dims: dims.iter().map(|d| d.to_string()).collect(),
        format,
        layout: Layout::row_major(dims),
    }
}

struct Spec {
    x: Format,
    w: Format,
    y: Format,
    bias: Option<Format>,
    act: Activation,
}

impl Spec {
    fn new(x: Format, w: Format) -> Self {
        Spec {
            x,
            w,
            y: Format::F32,
            bias: None,
            act: Activation::None,
        }
    }
}

/// A matmul kernel as a struct literal (no reliance on `verify`).
fn kernel(spec: &Spec, x_dims: &[&str]) -> Kernel {
    let mut tensors = vec![
        tensor("x", Role::Input, x_dims, spec.x),
        tensor("w", Role::Weight, &["h", "l"], spec.w),
        tensor("y", Role::Output, &["e", "h"], spec.y),
    ];
    if let Some(b) = spec.bias {
        tensors.push(tensor("bias", Role::Weight, &["h"], b));
    }
    Kernel {
        name: "matmul-test".into(),
        axes: vec![
            axis("e", AxisKind::Spatial),
            axis("h", AxisKind::Spatial),
            axis("l", AxisKind::Reduce),
        ],
        tensors,
        op: Op::Matmul(Matmul {
            x: "x".into(),
            w: "w".into(),
            y: "y".into(),
            e: "e".into(),
            h: "h".into(),
            l: "l".into(),
            epilogue: Epilogue {
                scale: spec.x.is_quantized() || spec.w.is_quantized(),
                zero_point: spec.w.is_asymmetric(),
                bias: spec.bias.map(|_| "bias".to_string()),
                activation: spec.act,
            },
        }),
        schedule: Schedule::default(),
    }
}

/// Float data in `format`, and the stored values widened to f64.
fn float_value(format: Format, data: &[f32]) -> (Value, Vec<f64>) {
    match format {
        Format::F32 | Format::I8Dyn => (
            Value::F32(data.to_vec()),
            data.iter().map(|&v| f64::from(v)).collect(),
        ),
        Format::F16 => {
            let v: Vec<f16> = data.iter().map(|&v| f16::from_f32(v)).collect();
            let w = v.iter().map(|&v| f64::from(v)).collect();
            (Value::F16(v), w)
        }
        Format::BF16 => {
            let v: Vec<bf16> = data.iter().map(|&v| bf16::from_f32(v)).collect();
            let w = v.iter().map(|&v| f64::from(v)).collect();
            (Value::BF16(v), w)
        }
        f => panic!("not a float format: {f}"),
    }
}

/// Random codes, scales and offsets for a quantized `[rows, cols]` tensor.
fn random_quant(rng: &mut impl Rng, format: Format, rows: usize, cols: usize) -> QuantTensor {
    let params = format.group().map_or(0, |g| rows * groups_per_row(g, cols));
    let codes = (0..rows * cols)
        .map(|_| match format {
            Format::U4Asym(..) | Format::E0M4(..) => rng.gen_range(0u8..=15),
            Format::I8Sym(..) => rng.gen_range(-127i8..=127) as u8,
            Format::I8Asym(..) => rng.gen_range(-128i8..=127) as u8,
            f => panic!("unexpected {f}"),
        })
        .collect();
    let scales = (0..params).map(|_| rng.gen_range(0.001f32..0.05)).collect();
    let offsets = if format.is_asymmetric() {
        (0..params).map(|_| rng.gen_range(-0.5f32..0.5)).collect()
    } else {
        Vec::new()
    };
    let q = QuantTensor {
        format,
        rows,
        cols,
        codes,
        scales,
        offsets,
    };
    q.validate().unwrap();
    q
}

fn random_f32(rng: &mut impl Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(-2.0f32..2.0)).collect()
}

/// One problem: bindings plus the widened operands the reference uses.
struct Case {
    bindings: Bindings,
    /// x as the kernel sees it: float data widened, i8dyn as sx·qx.
    x: Vec<f64>,
    /// w dequantized (QuantTensor::value) or widened.
    w: Vec<f64>,
    /// The size of what makes each w: `|scale·v| + |offset|` for quantized
    /// weights, whose scale and offset terms the integer path sums apart
    /// (where they cancel, its rounding is of their size, not of w's),
    /// else `|w|`.
    w_terms: Vec<f64>,
    bias: Option<Vec<f64>>,
}

fn make_case(rng: &mut impl Rng, spec: &Spec, e: usize, h: usize, l: usize) -> Case {
    let xs = random_f32(rng, e * l);
    let (xv, x) = if spec.x == Format::I8Dyn {
        let mut x = Vec::new();
        for row in xs.chunks(l.max(1)) {
            let (q, s) = quantize_row_i8dyn(row);
            x.extend(q.iter().map(|&q| f64::from(s) * f64::from(q)));
        }
        (Value::F32(xs), x)
    } else {
        float_value(spec.x, &xs)
    };
    let (wv, w, w_terms) = if spec.w.is_float() {
        let (wv, w) = float_value(spec.w, &random_f32(rng, h * l));
        let w_terms = w.iter().map(|v: &f64| v.abs()).collect();
        (wv, w, w_terms)
    } else {
        let q = random_quant(rng, spec.w, h, l);
        let w = q.dequantize().iter().map(|&v| f64::from(v)).collect();
        let w_terms = (0..h * l)
            .map(|i| {
                let (r, c) = (i / l, i % l);
                let offset = f64::from(q.offset(r, c));
                (f64::from(q.value(r, c)) - offset).abs() + offset.abs()
            })
            .collect();
        (Value::Quant(q), w, w_terms)
    };
    let mut bindings = Bindings::new()
        .extent("e", e)
        .extent("h", h)
        .extent("l", l)
        .tensor("x", xv)
        .tensor("w", wv);
    let bias = spec.bias.map(|bf| {
        let (bv, b) = float_value(bf, &random_f32(rng, h));
        bindings = bindings.clone().tensor("bias", bv);
        b
    });
    Case {
        bindings,
        x,
        w,
        w_terms,
        bias,
    }
}

fn activate(act: Activation, v: f64) -> f64 {
    match act {
        Activation::None => v,
        Activation::Relu => v.max(0.0),
        Activation::Silu => v / (1.0 + (-v).exp()),
    }
}

/// Plain dense math: y[e,h] = act(Σ_l x·w + b), plus Σ|x|·[`Case::w_terms`]
/// (+ |b|) per element for error bounds.
fn dense(case: &Case, act: Activation, e: usize, h: usize, l: usize) -> Vec<(f64, f64)> {
    let mut out = Vec::new();
    for ei in 0..e {
        for hi in 0..h {
            let mut sum = 0.0;
            let mut mag = 0.0;
            for li in 0..l {
                let (x, at) = (case.x[ei * l + li], hi * l + li);
                sum += x * case.w[at];
                mag += x.abs() * case.w_terms[at];
            }
            if let Some(b) = &case.bias {
                sum += b[hi];
                mag += b[hi].abs();
            }
            out.push((activate(act, sum), mag));
        }
    }
    out
}

/// Relative rounding unit of an output format (with a factor 2 of slack).
fn out_eps(format: Format) -> f64 {
    match format {
        Format::F16 => 2f64.powi(-10),
        Format::BF16 => 2f64.powi(-7),
        _ => 2f64.powi(-23),
    }
}

/// Run the case and compare with dense math: exactly (same f64 sum, same
/// rounding) on float paths, within `rel`·Σ|x|·(|scale·v| + |offset|) on the integer path.
fn check(spec: &Spec, e: usize, h: usize, l: usize, seed: u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let case = make_case(&mut rng, spec, e, h, l);
    let k = kernel(spec, &["e", "l"]);
    let out = run(&k, &case.bindings)
        .unwrap_or_else(|err| panic!("{} x {} e{e} h{h} l{l}: {err}", spec.x, spec.w));
    let y = out.get("y").unwrap();
    assert_eq!(y.len(), e * h);
    assert_eq!(out.softmax, None);
    let integer = spec.x == Format::I8Dyn
        && matches!(
            spec.w,
            Format::U4Asym(..) | Format::I8Sym(..) | Format::I8Asym(..)
        );
    for (i, (&got, &(want, mag))) in y.iter().zip(&dense(&case, spec.act, e, h, l)).enumerate() {
        let ctx = || {
            format!(
                "{} x {} -> {} e{e} h{h} l{l} at {i}",
                spec.x, spec.w, spec.y
            )
        };
        assert_eq!(
            round_to_format(f64::from(got), spec.y),
            got,
            "{}: not representable in the output format",
            ctx()
        );
        if integer {
            let tol = 1e-6 * mag + out_eps(spec.y) * want.abs() + 1e-30;
            assert!(
                (f64::from(got) - want).abs() <= tol,
                "{}: got {got}, dense {want}, tol {tol}",
                ctx()
            );
        } else {
            assert_eq!(got, round_to_format(want, spec.y), "{}", ctx());
        }
    }
}

const SIZES: [(usize, usize, usize); 6] = [
    (1, 1, 1),
    (1, 17, 70),
    (3, 5, 70),
    (7, 17, 129),
    (3, 1, 33),
    (7, 5, 256),
];

#[test]
fn float_by_float_every_combination() {
    let floats = [Format::F32, Format::F16, Format::BF16];
    for (n, (&x, &w)) in floats
        .iter()
        .flat_map(|x| floats.iter().map(move |w| (x, w)))
        .enumerate()
    {
        for (i, &(e, h, l)) in SIZES.iter().enumerate() {
            check(&Spec::new(x, w), e, h, l, (n * 100 + i) as u64);
        }
    }
}

fn groups() -> [Group; 4] {
    [
        Group::Size(32),
        Group::Size(64),
        Group::Size(128),
        Group::Row,
    ]
}

#[test]
fn w4a8_every_group_with_tails() {
    for (n, g) in groups().into_iter().enumerate() {
        for (i, &(e, h, l)) in SIZES.iter().enumerate() {
            check(
                &Spec::new(Format::I8Dyn, Format::U4Asym(g, ParamType::F32)),
                e,
                h,
                l,
                (n * 100 + i) as u64,
            );
        }
    }
}

#[test]
fn w8a8_symmetric_and_asymmetric() {
    for (n, g) in groups().into_iter().enumerate() {
        for w in [
            Format::I8Sym(g, ParamType::F32),
            Format::I8Asym(g, ParamType::F32),
        ] {
            for (i, &(e, h, l)) in SIZES.iter().enumerate() {
                check(&Spec::new(Format::I8Dyn, w), e, h, l, (n * 100 + i) as u64);
            }
        }
    }
}

#[test]
fn float_activations_with_quantized_weights() {
    // W4A16, W8A16 (sym and asym), E0M4-A16, with f16, bf16 and f32 activations.
    for (n, g) in groups().into_iter().enumerate() {
        for w in [
            Format::U4Asym(g, ParamType::F32),
            Format::I8Sym(g, ParamType::F32),
            Format::I8Asym(g, ParamType::F32),
            Format::E0M4(g, ParamType::F32),
        ] {
            for x in [Format::F16, Format::BF16, Format::F32] {
                for (i, &(e, h, l)) in SIZES.iter().enumerate() {
                    check(&Spec::new(x, w), e, h, l, (n * 100 + i) as u64);
                }
            }
        }
    }
}

#[test]
fn i8dyn_activations_with_non_integer_weights_use_the_float_path() {
    for w in [
        Format::E0M4(Group::Size(32), ParamType::F32),
        Format::F16,
        Format::F32,
    ] {
        for (i, &(e, h, l)) in SIZES.iter().enumerate() {
            check(&Spec::new(Format::I8Dyn, w), e, h, l, i as u64);
        }
    }
}

#[test]
fn bias_activation_and_output_formats() {
    let mut seed = 0;
    for bias in [
        None,
        Some(Format::F32),
        Some(Format::F16),
        Some(Format::BF16),
    ] {
        for act in [Activation::None, Activation::Relu, Activation::Silu] {
            for y in [Format::F32, Format::F16, Format::BF16] {
                for (x, w) in [
                    (Format::F16, Format::F16),
                    (
                        Format::I8Dyn,
                        Format::U4Asym(Group::Size(32), ParamType::F32),
                    ),
                    (Format::F32, Format::I8Asym(Group::Row, ParamType::F32)),
                ] {
                    seed += 1;
                    let spec = Spec { x, w, y, bias, act };
                    check(&spec, 3, 17, 70, seed);
                }
            }
        }
    }
}

#[test]
fn relu_zeroes_negative_outputs() {
    // w = -1 everywhere, x = 1: every pre-activation is -l, relu gives 0.
    let spec = Spec {
        act: Activation::Relu,
        ..Spec::new(Format::F32, Format::F32)
    };
    let b = Bindings::new()
        .extent("e", 2)
        .extent("h", 3)
        .extent("l", 4)
        .tensor("x", Value::F32(vec![1.0; 8]))
        .tensor("w", Value::F32(vec![-1.0; 12]));
    let out = run(&kernel(&spec, &["e", "l"]), &b).unwrap();
    assert_eq!(out.get("y").unwrap(), &[0.0; 6]);
    let spec = Spec {
        act: Activation::None,
        ..spec
    };
    let out = run(&kernel(&spec, &["e", "l"]), &b).unwrap();
    assert_eq!(out.get("y").unwrap(), &[-4.0; 6]);
}

#[test]
fn integer_path_is_exact_where_f32_accumulation_is_not() {
    // x rows have absmax 127, so sx = 1 and qx = x; w is i8sym per row with
    // scale 1: y is the integer dot itself, well beyond 2^24.
    let l = 4099;
    let x: Vec<f32> = (0..l)
        .map(|i| {
            if i % 3 == 0 {
                127.0
            } else {
                125.0 - (i % 7) as f32
            }
        })
        .collect();
    let wq: Vec<i8> = (0..l).map(|i| 127 - (i % 5) as i8).collect();
    let exact: i64 = x
        .iter()
        .zip(&wq)
        .map(|(&a, &b)| a as i64 * i64::from(b))
        .sum();
    assert!(exact > 1 << 24);
    let f32_sum = x
        .iter()
        .zip(&wq)
        .fold(0.0f32, |s, (&a, &b)| s + a * f32::from(b));
    assert_ne!(
        f32_sum, exact as f32,
        "the case must defeat f32 accumulation"
    );

    let w = QuantTensor {
        format: Format::I8Sym(Group::Row, ParamType::F32),
        rows: 1,
        cols: l,
        codes: wq.iter().map(|&q| q as u8).collect(),
        scales: vec![1.0],
        offsets: vec![],
    };
    let b = Bindings::new()
        .extent("e", 1)
        .extent("h", 1)
        .extent("l", l)
        .tensor("x", Value::F32(x))
        .tensor("w", Value::Quant(w));
    let spec = Spec::new(Format::I8Dyn, Format::I8Sym(Group::Row, ParamType::F32));
    let y = run(&kernel(&spec, &["e", "l"]), &b).unwrap();
    assert_eq!(y.get("y").unwrap(), &[exact as f32]);
}

#[test]
fn zero_point_correction_is_exact_for_u4asym() {
    // u4asym with scale 1, offset -8 is signed int4 shifted; x = qx exactly.
    let l = 70;
    let x: Vec<f32> = (0..l).map(|i| ((i * 37) % 255) as f32 - 127.0).collect();
    let codes: Vec<u8> = (0..l).map(|i| ((i * 11) % 16) as u8).collect();
    let exact: i64 = x
        .iter()
        .zip(&codes)
        .map(|(&a, &q)| a as i64 * (i64::from(q) - 8))
        .sum();
    let w = QuantTensor {
        format: Format::U4Asym(Group::Size(32), ParamType::F32),
        rows: 1,
        cols: l,
        codes,
        scales: vec![1.0; 3],
        offsets: vec![-8.0; 3],
    };
    let b = Bindings::new()
        .extent("e", 1)
        .extent("h", 1)
        .extent("l", l)
        .tensor("x", Value::F32(x))
        .tensor("w", Value::Quant(w));
    let spec = Spec::new(
        Format::I8Dyn,
        Format::U4Asym(Group::Size(32), ParamType::F32),
    );
    let y = run(&kernel(&spec, &["e", "l"]), &b).unwrap();
    assert_eq!(y.get("y").unwrap(), &[exact as f32]);
}

#[test]
fn transposed_activation_dims_are_read_in_logical_order() {
    let (e, h, l) = (3, 5, 70);
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let spec = Spec::new(Format::F32, Format::U4Asym(Group::Size(32), ParamType::F32));
    let case = make_case(&mut rng, &spec, e, h, l);
    let want = run(&kernel(&spec, &["e", "l"]), &case.bindings).unwrap();
    // Same x bound as [l, e].
    let mut xt = vec![0.0f32; e * l];
    for ei in 0..e {
        for li in 0..l {
            xt[li * e + ei] = case.x[ei * l + li] as f32;
        }
    }
    let b = Bindings::new()
        .extent("e", e)
        .extent("h", h)
        .extent("l", l)
        .tensor("x", Value::F32(xt))
        .tensor("w", case.bindings.tensors()[1].1.clone());
    let got = run(&kernel(&spec, &["l", "e"]), &b).unwrap();
    assert_eq!(got, want);
}

#[test]
fn missing_epilogue_terms_are_refused() {
    let spec = Spec::new(
        Format::I8Dyn,
        Format::U4Asym(Group::Size(32), ParamType::F32),
    );
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let case = make_case(&mut rng, &spec, 1, 2, 32);
    let mut k = kernel(&spec, &["e", "l"]);
    if let Op::Matmul(m) = &mut k.op {
        m.epilogue.zero_point = false;
    }
    assert!(matches!(
        run(&k, &case.bindings),
        Err(InterpError::Epilogue(_))
    ));
    if let Op::Matmul(m) = &mut k.op {
        m.epilogue.zero_point = true;
        m.epilogue.scale = false;
    }
    assert!(matches!(
        run(&k, &case.bindings),
        Err(InterpError::Epilogue(_))
    ));
}

fn any_format() -> impl Strategy<Value = (Format, Format)> {
    let group = prop_oneof![
        Just(Group::Size(32)),
        Just(Group::Size(64)),
        Just(Group::Size(128)),
        Just(Group::Row),
        (1u32..=12).prop_map(|n| Group::Size(4 * n)),
    ];
    let float = prop_oneof![Just(Format::F32), Just(Format::F16), Just(Format::BF16)];
    let quant = group.prop_flat_map(|g| {
        prop_oneof![
            Just(Format::U4Asym(g, ParamType::F32)),
            Just(Format::I8Sym(g, ParamType::F32)),
            Just(Format::I8Asym(g, ParamType::F32)),
            Just(Format::E0M4(g, ParamType::F32)),
        ]
    });
    let x = prop_oneof![float.clone(), Just(Format::I8Dyn)];
    let w = prop_oneof![float, quant];
    (x, w)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn random_shapes_match_dense_math(
        (x, w) in any_format(),
        e in 1usize..9,
        h in 1usize..21,
        l in 1usize..150,
        seed in any::<u64>(),
    ) {
        check(&Spec::new(x, w), e, h, l, seed);
    }
}
