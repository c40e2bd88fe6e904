//! Bad bindings and inconsistent kernels give a named `InterpError`, never a
//! panic.

use half::f16;
use proptest::prelude::*;
use tessera_dsl::interp::{Bindings, InterpError, Value, run};
use tessera_dsl::quant::{QuantError, QuantTensor};
use tessera_dsl::*;

fn tensor(name: &str, role: Role, dims: &[&str], format: Format) -> Tensor {
    Tensor {
        name: name.into(),
        role,
        dims: dims.iter().map(|d| d.to_string()).collect(),
        format,
        layout: Layout::row_major(dims),
    }
}

fn axis(name: &str, extent: Extent) -> Axis {
    Axis {
        name: name.into(),
        extent,
        kind: AxisKind::Spatial,
    }
}

const G32: Format = Format::U4Asym(Group::Size(32), ParamType::F32);

/// W4A8 matmul with `l` fixed at 40.
fn w4a8() -> Kernel {
    Kernel {
        name: "matmul-w4a8".into(),
        axes: vec![
            axis("e", Extent::Dyn),
            axis("h", Extent::Dyn),
            axis("l", Extent::Fixed(40)),
        ],
        tensors: vec![
            tensor("x", Role::Input, &["e", "l"], Format::I8Dyn),
            tensor("w", Role::Weight, &["h", "l"], G32),
            tensor("y", Role::Output, &["e", "h"], Format::F16),
            tensor("b", Role::Weight, &["h"], Format::F32),
        ],
        op: Op::Matmul(Matmul {
            x: "x".into(),
            w: "w".into(),
            y: "y".into(),
            e: "e".into(),
            h: "h".into(),
            l: "l".into(),
            epilogue: Epilogue {
                scale: true,
                zero_point: true,
                bias: Some("b".into()),
                activation: Activation::Silu,
            },
        }),
        schedule: Schedule::default(),
    }
}

fn weights(h: usize, l: usize) -> QuantTensor {
    let groups = l.div_ceil(32);
    QuantTensor {
        format: G32,
        rows: h,
        cols: l,
        codes: (0..h * l).map(|i| (i % 16) as u8).collect(),
        scales: vec![0.01; h * groups],
        offsets: vec![-0.08; h * groups],
    }
}

fn w4a8_bindings() -> Bindings {
    Bindings::new()
        .extent("e", 3)
        .extent("h", 5)
        .tensor("x", Value::F32((0..120).map(|i| i as f32 * 0.1).collect()))
        .tensor("w", Value::Quant(weights(5, 40)))
        .tensor("b", Value::F32(vec![0.5; 5]))
}

fn attention(kind: AttentionKind, softmax: SoftmaxMode) -> Kernel {
    Kernel {
        name: "attention-decode-kv8".into(),
        axes: ["t", "hq", "kvh", "d", "s"]
            .iter()
            .map(|n| axis(n, Extent::Dyn))
            .collect(),
        tensors: vec![
            tensor("q", Role::Input, &["t", "hq", "d"], Format::F16),
            tensor(
                "k",
                Role::Cache,
                &["s", "kvh", "d"],
                Format::I8Asym(Group::Row, ParamType::F32),
            ),
            tensor("v", Role::Cache, &["s", "kvh", "d"], Format::Fp8E4M3),
            tensor("o", Role::Output, &["t", "hq", "d"], Format::F32),
        ],
        op: Op::Attention(Attention {
            kind,
            q: "q".into(),
            k: "k".into(),
            v: "v".into(),
            o: "o".into(),
            tokens: "t".into(),
            heads: "hq".into(),
            kv_heads: "kvh".into(),
            head_dim: "d".into(),
            seq: "s".into(),
            q_prescaled: true,
            softmax,
        }),
        schedule: Schedule::default(),
    }
}

fn kv(format: Format, rows: usize, cols: usize) -> QuantTensor {
    let asym = format.is_asymmetric();
    QuantTensor {
        format,
        rows,
        cols,
        codes: (0..rows * cols).map(|i| (i % 100) as u8).collect(),
        scales: if format.group().is_some() {
            vec![0.01; rows]
        } else {
            Vec::new()
        },
        offsets: if asym { vec![0.1; rows] } else { Vec::new() },
    }
}

fn attention_bindings(t: usize, hq: usize, kvh: usize, d: usize, s: usize) -> Bindings {
    Bindings::new()
        .extent("t", t)
        .extent("hq", hq)
        .extent("kvh", kvh)
        .extent("d", d)
        .extent("s", s)
        .tensor(
            "q",
            Value::F16(
                (0..t * hq * d)
                    .map(|i| f16::from_f32(i as f32 * 0.01))
                    .collect(),
            ),
        )
        .tensor(
            "k",
            Value::Quant(kv(Format::I8Asym(Group::Row, ParamType::F32), s * kvh, d)),
        )
        .tensor("v", Value::Quant(kv(Format::Fp8E4M3, s * kvh, d)))
}

fn decode() -> Kernel {
    attention(AttentionKind::Decode, SoftmaxMode::Online)
}

fn prefill() -> Kernel {
    attention(AttentionKind::Prefill, SoftmaxMode::Online)
}

#[test]
fn valid_bindings_run() {
    let y = run(&w4a8(), &w4a8_bindings()).unwrap();
    assert_eq!(y.get("y").unwrap().len(), 15);
    let o = run(&decode(), &attention_bindings(1, 8, 2, 20, 9)).unwrap();
    assert_eq!(o.get("o").unwrap().len(), 160);
    assert!(o.get("o").unwrap().iter().all(|x| x.is_finite()));
    let o = run(&prefill(), &attention_bindings(4, 8, 2, 20, 9)).unwrap();
    assert_eq!(o.get("o").unwrap().len(), 640);
}

#[test]
fn missing_and_unknown_bindings() {
    let b = Bindings::new()
        .extent("e", 3)
        .extent("h", 5)
        .tensor("x", Value::F32(vec![0.0; 120]))
        .tensor("b", Value::F32(vec![0.5; 5]));
    assert_eq!(
        run(&w4a8(), &b),
        Err(InterpError::UnboundTensor { tensor: "w".into() })
    );
    let b = Bindings::new().extent("h", 5);
    assert_eq!(
        run(&w4a8(), &b),
        Err(InterpError::UnboundAxis { axis: "e".into() })
    );
    let b = w4a8_bindings().extent("m", 1);
    assert_eq!(
        run(&w4a8(), &b),
        Err(InterpError::UnknownAxisBinding { axis: "m".into() })
    );
    let b = w4a8_bindings().tensor("z", Value::F32(vec![]));
    assert_eq!(
        run(&w4a8(), &b),
        Err(InterpError::UnknownTensorBinding { tensor: "z".into() })
    );
    let b = w4a8_bindings().tensor("y", Value::F16(vec![]));
    assert_eq!(
        run(&w4a8(), &b),
        Err(InterpError::UnknownTensorBinding { tensor: "y".into() })
    );
    let b = w4a8_bindings().extent("e", 3);
    assert_eq!(
        run(&w4a8(), &b),
        Err(InterpError::DuplicateBinding { name: "e".into() })
    );
    let b = w4a8_bindings().tensor("b", Value::F32(vec![0.5; 5]));
    assert_eq!(
        run(&w4a8(), &b),
        Err(InterpError::DuplicateBinding { name: "b".into() })
    );
}

#[test]
fn fixed_extents_are_checked() {
    let b = w4a8_bindings().extent("l", 41);
    assert_eq!(
        run(&w4a8(), &b),
        Err(InterpError::FixedExtent {
            axis: "l".into(),
            fixed: 40,
            bound: 41
        })
    );
    // Binding a fixed axis to its own value is fine.
    run(&w4a8(), &w4a8_bindings().extent("l", 40)).unwrap();
}

#[test]
fn values_must_match_the_declared_format() {
    let replace = |name: &str, v: Value| {
        let mut b = Bindings::new().extent("e", 3).extent("h", 5);
        for (n, old) in w4a8_bindings().tensors() {
            b = b.tensor(n.clone(), if n == name { v.clone() } else { old.clone() });
        }
        run(&w4a8(), &b)
    };
    assert!(matches!(
        replace("x", Value::F16(vec![f16::ZERO; 120])),
        Err(InterpError::WrongValue { tensor, expected: "Value::F32", .. }) if tensor == "x"
    ));
    assert!(matches!(
        replace("w", Value::F32(vec![0.0; 200])),
        Err(InterpError::WrongValue { tensor, .. }) if tensor == "w"
    ));
    let mut other_group = weights(5, 40);
    other_group.format = Format::U4Asym(Group::Size(64), ParamType::F32);
    other_group.scales.truncate(5);
    other_group.offsets.truncate(5);
    assert!(matches!(
        replace("w", Value::Quant(other_group)),
        Err(InterpError::WrongValue { tensor, .. }) if tensor == "w"
    ));
    assert_eq!(
        replace("x", Value::F32(vec![0.0; 119])),
        Err(InterpError::Length {
            tensor: "x".into(),
            expected: 120,
            got: 119
        })
    );
    assert_eq!(
        replace("w", Value::Quant(weights(4, 40))),
        Err(InterpError::QuantShape {
            tensor: "w".into(),
            expected_rows: 5,
            expected_cols: 40,
            rows: 4,
            cols: 40
        })
    );
    let mut bad_code = weights(5, 40);
    bad_code.codes[7] = 16;
    assert!(matches!(
        replace("w", Value::Quant(bad_code)),
        Err(InterpError::Quant { tensor, source: QuantError::CodeRange { index: 7, .. } })
            if tensor == "w"
    ));
    let mut short = weights(5, 40);
    short.offsets.pop();
    assert!(matches!(
        replace("w", Value::Quant(short)),
        Err(InterpError::Quant {
            source: QuantError::Length {
                what: "offsets",
                ..
            },
            ..
        })
    ));
    assert!(matches!(
        replace("b", Value::BF16(vec![])),
        Err(InterpError::WrongValue { tensor, .. }) if tensor == "b"
    ));
}

#[test]
fn inconsistent_kernels_are_refused() {
    let mut k = w4a8();
    k.tensors[0].dims = vec!["e".into(), "h".into()];
    assert!(matches!(
        run(&k, &w4a8_bindings()),
        Err(InterpError::Dims { tensor, .. }) if tensor == "x"
    ));
    // A quantized tensor must have the reduction axis innermost.
    let mut k = w4a8();
    k.tensors[1].dims = vec!["l".into(), "h".into()];
    assert!(matches!(
        run(&k, &w4a8_bindings()),
        Err(InterpError::Dims { tensor, .. }) if tensor == "w"
    ));
    let mut k = w4a8();
    if let Op::Matmul(m) = &mut k.op {
        m.w = "nope".into();
    }
    assert_eq!(
        run(&k, &w4a8_bindings()),
        Err(InterpError::UndeclaredTensor {
            tensor: "nope".into()
        })
    );
    let mut k = w4a8();
    if let Op::Matmul(m) = &mut k.op {
        m.h = "e".into();
    }
    assert_eq!(
        run(&k, &w4a8_bindings()),
        Err(InterpError::AxisRoles { axis: "e".into() })
    );
    let mut k = w4a8();
    k.tensors[1].format = Format::I8Dyn;
    let b = w4a8_bindings();
    assert!(matches!(
        run(&k, &b),
        Err(InterpError::WrongValue { .. } | InterpError::UnsupportedFormat { .. })
    ));
    let mut k = w4a8();
    k.tensors[2].format = Format::I8Sym(Group::Row, ParamType::F32);
    assert!(matches!(
        run(&k, &w4a8_bindings()),
        Err(InterpError::UnsupportedFormat { tensor, .. }) if tensor == "y"
    ));
    let mut k = w4a8();
    k.tensors[3].format = Format::I8Dyn;
    assert!(matches!(
        run(&k, &w4a8_bindings()),
        Err(InterpError::UnsupportedFormat { tensor, .. }) if tensor == "b"
    ));
    let mut k = decode();
    k.tensors[0].format = Format::I8Sym(Group::Row, ParamType::F32);
    assert!(matches!(
        run(&k, &attention_bindings(1, 8, 2, 20, 9)),
        Err(InterpError::UnsupportedFormat { tensor, .. }) if tensor == "q"
    ));
}

#[test]
fn attention_shape_rules() {
    assert_eq!(
        run(&decode(), &attention_bindings(1, 8, 3, 20, 9)),
        Err(InterpError::Gqa {
            heads: 8,
            kv_heads: 3
        })
    );
    assert_eq!(
        run(&decode(), &attention_bindings(1, 8, 0, 20, 9)),
        Err(InterpError::Gqa {
            heads: 8,
            kv_heads: 0
        })
    );
    assert_eq!(
        run(&prefill(), &attention_bindings(10, 8, 2, 20, 9)),
        Err(InterpError::PrefillSeq { seq: 9, tokens: 10 })
    );
    assert_eq!(
        run(&decode(), &attention_bindings(2, 8, 2, 20, 9)),
        Err(InterpError::DecodeTokens {
            axis: "t".into(),
            tokens: 2
        })
    );
    assert_eq!(
        run(&decode(), &attention_bindings(1, 8, 2, 20, 0)),
        Err(InterpError::EmptySequence { axis: "s".into() })
    );
    for (phi, lo, hi) in [
        (0.0, 1.0, -1.0),
        (f32::NAN, -1.0, 1.0),
        (0.0, f32::NEG_INFINITY, 1.0),
    ] {
        let k = attention(AttentionKind::Decode, SoftmaxMode::Async { phi, lo, hi });
        assert!(matches!(
            run(&k, &attention_bindings(1, 8, 2, 20, 9)),
            Err(InterpError::SoftmaxBounds { .. })
        ));
    }
    // Values cached as an activation format make no sense.
    let mut k = decode();
    k.tensors[2].format = Format::I8Dyn;
    let b = attention_bindings(1, 8, 2, 20, 9);
    let mut b2 = Bindings::new();
    for (n, e) in b.extents() {
        b2 = b2.extent(n.clone(), *e);
    }
    for (n, v) in b.tensors() {
        b2 = b2.tensor(
            n.clone(),
            if n == "v" {
                Value::F32(vec![0.0; 9 * 2 * 20])
            } else {
                v.clone()
            },
        );
    }
    assert!(matches!(
        run(&k, &b2),
        Err(InterpError::UnsupportedFormat { tensor, .. }) if tensor == "v"
    ));
}

#[test]
fn overflowing_extents_are_errors() {
    let b = Bindings::new()
        .extent("e", usize::MAX / 2)
        .extent("h", 5)
        .tensor("x", Value::F32(vec![]))
        .tensor("w", Value::Quant(weights(5, 40)))
        .tensor("b", Value::F32(vec![0.5; 5]));
    assert!(matches!(
        run(&w4a8(), &b),
        Err(InterpError::Overflow { .. })
    ));
    let b = Bindings::new()
        .extent("t", 1)
        .extent("hq", usize::MAX)
        .extent("kvh", 1)
        .extent("d", 4)
        .extent("s", 1);
    assert!(matches!(
        run(&decode(), &b),
        Err(InterpError::Overflow { .. })
    ));
}

#[test]
fn empty_outputs_are_valid_and_do_no_work() {
    let o = run(&decode(), &attention_bindings(1, 8, 2, 0, 1000)).unwrap();
    assert_eq!(o.get("o"), Some(&[][..]));
    assert_eq!(o.softmax.map(|s| s.rows), Some(0));
    let o = run(&prefill(), &attention_bindings(0, 8, 2, 20, 9)).unwrap();
    assert_eq!(o.get("o"), Some(&[][..]));
    let b = Bindings::new()
        .extent("e", 0)
        .extent("h", 5)
        .tensor("x", Value::F32(vec![]))
        .tensor("w", Value::Quant(weights(5, 40)))
        .tensor("b", Value::F32(vec![0.5; 5]));
    assert_eq!(run(&w4a8(), &b).unwrap().get("y"), Some(&[][..]));
}

/// One way of breaking a valid binding set.
#[derive(Clone, Debug)]
enum Mutation {
    DropTensor(usize),
    DropExtent(usize),
    ShiftExtent(usize, usize),
    Resize(usize, usize),
    Retype(usize),
    CorruptCode(usize, u8),
    DropParam(usize),
    Unknown,
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (0usize..8).prop_map(Mutation::DropTensor),
        (0usize..8).prop_map(Mutation::DropExtent),
        (0usize..8, 1usize..1000).prop_map(|(i, d)| Mutation::ShiftExtent(i, d)),
        (0usize..8, 1usize..100).prop_map(|(i, d)| Mutation::Resize(i, d)),
        (0usize..8).prop_map(Mutation::Retype),
        (0usize..4096, 128u8..=255).prop_map(|(i, c)| Mutation::CorruptCode(i, c)),
        (0usize..8).prop_map(Mutation::DropParam),
        Just(Mutation::Unknown),
    ]
}

/// Apply `m`; the result must be invalid for the kernel.
fn mutate(b: &Bindings, m: &Mutation) -> Bindings {
    let mut extents = b.extents().to_vec();
    let mut tensors = b.tensors().to_vec();
    match *m {
        Mutation::DropTensor(i) => {
            tensors.remove(i % tensors.len());
        }
        Mutation::DropExtent(i) => {
            extents.remove(i % extents.len());
        }
        Mutation::ShiftExtent(i, d) => {
            let n = extents.len();
            extents[i % n].1 += d;
        }
        Mutation::Resize(i, d) => {
            let n = tensors.len();
            match &mut tensors[i % n].1 {
                Value::F32(v) => v.resize(v.len() + d, 0.0),
                Value::F16(v) => v.truncate(v.len().saturating_sub(d)),
                Value::BF16(v) => v.push(half::bf16::ZERO),
                Value::Quant(q) => q.codes.resize(q.codes.len() + d, 0),
            }
        }
        Mutation::Retype(i) => {
            let n = tensors.len();
            let v = &mut tensors[i % n].1;
            *v = match v {
                Value::F16(_) => Value::F32(vec![]),
                _ => Value::F16(vec![]),
            };
        }
        Mutation::CorruptCode(i, c) => {
            // Codes >= 128 are out of range for u4asym, and for i8asym the
            // extra code is pushed past the end instead.
            let q = tensors.iter_mut().find_map(|(_, v)| match v {
                Value::Quant(q) if matches!(q.format, Format::U4Asym(..)) => Some(q),
                _ => None,
            });
            match q {
                Some(q) if !q.codes.is_empty() => {
                    let n = q.codes.len();
                    q.codes[i % n] = c;
                }
                _ => tensors.push(("unknown".into(), Value::F32(vec![]))),
            }
        }
        Mutation::DropParam(i) => {
            let quants: Vec<usize> = (0..tensors.len())
                .filter(|&j| matches!(&tensors[j].1, Value::Quant(q) if !q.scales.is_empty()))
                .collect();
            if quants.is_empty() {
                tensors.push(("unknown".into(), Value::F32(vec![])));
            } else if let Value::Quant(q) = &mut tensors[quants[i % quants.len()]].1 {
                q.scales.pop();
            }
        }
        Mutation::Unknown => extents.push(("unknown".into(), 1)),
    }
    let mut out = Bindings::new();
    for (n, e) in extents {
        out = out.extent(n, e);
    }
    for (n, v) in tensors {
        out = out.tensor(n, v);
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn broken_matmul_bindings_are_errors(m in mutation()) {
        let b = mutate(&w4a8_bindings(), &m);
        prop_assert!(run(&w4a8(), &b).is_err(), "{m:?} was accepted");
    }

    #[test]
    fn broken_attention_bindings_are_errors(m in mutation(), prefill_kind in any::<bool>()) {
        let (k, b) = if prefill_kind {
            (prefill(), attention_bindings(3, 8, 2, 12, 7))
        } else {
            (decode(), attention_bindings(1, 8, 2, 12, 7))
        };
        let b = mutate(&b, &m);
        prop_assert!(run(&k, &b).is_err(), "{m:?} was accepted");
    }

    /// Arbitrary extents, including absurd ones, with small data: an answer
    /// or an error, never a panic.
    #[test]
    fn arbitrary_extents_never_panic(
        ext in proptest::collection::vec(
            prop_oneof![0usize..12, Just(usize::MAX), Just(1usize << 40), any::<usize>()],
            5,
        ),
        n in 0usize..300,
    ) {
        let names = ["t", "hq", "kvh", "d", "s"];
        let mut b = Bindings::new();
        for (name, &e) in names.iter().zip(&ext) {
            b = b.extent(*name, e);
        }
        let rows = ext[4].saturating_mul(ext[2]).min(64);
        let b = b
            .tensor("q", Value::F16(vec![f16::ONE; n]))
            .tensor("k", Value::Quant(kv(Format::I8Asym(Group::Row, ParamType::F32), rows, ext[3].min(16))))
            .tensor("v", Value::Quant(kv(Format::Fp8E4M3, rows, ext[3].min(16))));
        let _ = run(&decode(), &b);
        let _ = run(&prefill(), &b);
        let mb = Bindings::new()
            .extent("e", ext[0])
            .extent("h", ext[1])
            .tensor("x", Value::F32(vec![1.0; n]))
            .tensor("w", Value::Quant(weights(ext[1].min(8), 40)))
            .tensor("b", Value::F32(vec![0.0; ext[1].min(8)]));
        let _ = run(&w4a8(), &mb);
    }
}

#[test]
fn value_from_f32_rounds_to_the_format() {
    let data = [1.0f32 + 2f32.powi(-12), -3.5];
    assert_eq!(
        Value::from_f32(Format::F16, &data),
        Some(Value::F16(vec![f16::from_f32(1.0), f16::from_f32(-3.5)]))
    );
    assert_eq!(
        Value::from_f32(Format::I8Dyn, &data),
        Some(Value::F32(data.to_vec()))
    );
    assert!(matches!(
        Value::from_f32(Format::BF16, &data),
        Some(Value::BF16(v)) if v[0].to_f32() == 1.0
    ));
    assert_eq!(Value::from_f32(Format::Fp8E4M3, &data), None);
}
