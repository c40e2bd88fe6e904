//! Hand-written kernels: their exact canonical text, and print → parse →
//! print identity.

use tessera_dsl::*;

/// Parse must give back `k`, and printing again the same text.
fn assert_round_trip(k: &Kernel) -> String {
    let text = k.to_string();
    let parsed: Kernel = text
        .parse()
        .unwrap_or_else(|e| panic!("{e}\n--- text ---\n{text}"));
    assert_eq!(&parsed, k, "parse(print(k)) != k\n{text}");
    assert_eq!(parsed.to_string(), text);
    text
}

fn w4a8() -> Kernel {
    KernelBuilder::new("matmul-w4a8")
        .dyn_axis("e")
        .dyn_axis("h")
        .reduce_axis("l")
        .tile("ep", "e", TileSize::Solve)
        .tile("hp", "h", TileSize::Solve)
        .tile("lp", "l", TileSize::Fixed(32))
        .tensor("x", Role::Input, &["e", "l"], Format::I8Dyn)
        .tensor_with_layout(
            "w",
            Role::Weight,
            &["h", "l"],
            Format::U4Asym(Group::Size(32), ParamType::F32),
            Layout {
                dims: vec![
                    LayoutDim::outer("h", "hp"),
                    LayoutDim::outer("l", "lp"),
                    LayoutDim::inner("hp"),
                    LayoutDim::inner("lp"),
                ],
                int4_pair_transpose: true,
                int4_signed_codes: false,
            },
        )
        .tensor("b", Role::Input, &["h"], Format::F32)
        .tensor("y", Role::Output, &["e", "h"], Format::F32)
        .op(Op::Matmul(Matmul {
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
                activation: Activation::None,
            },
        }))
        .parallel("h")
        .build()
        .expect("valid w4a8 kernel")
}

#[test]
fn w4a8_matmul_text() {
    let text = assert_round_trip(&w4a8());
    assert_eq!(
        text,
        "kernel matmul-w4a8
axis e: dyn
axis h: dyn
axis l: dyn reduce
tile ep of e: solve
tile hp of h: solve
tile lp of l: 32
input x[e, l]: i8dyn
weight w[h, l]: u4asym:g32 layout [h/hp, l/lp, hp, lp] pair-transpose
input b[h]: f32
output y[e, h]: f32
matmul y[e, h] = x[e, l] * w[h, l] epilogue scale zero-point bias(b) act(none)
parallel h
"
    );
}

fn matmul(x: Format, w: Format) -> Matmul {
    Matmul {
        x: "x".into(),
        w: "w".into(),
        y: "y".into(),
        e: "m".into(),
        h: "n".into(),
        l: "k".into(),
        epilogue: Epilogue {
            scale: x.is_quantized() || w.is_quantized(),
            zero_point: w.is_asymmetric(),
            bias: None,
            activation: Activation::Relu,
        },
    }
}

#[test]
fn f32_matmul_fixed_extents() {
    let k = KernelBuilder::new("sgemm_64x96x100")
        .axis("m", Extent::Fixed(64), AxisKind::Spatial)
        .axis("n", Extent::Fixed(96), AxisKind::Spatial)
        .axis("k", Extent::Fixed(100), AxisKind::Reduce)
        .tile("mr", "m", TileSize::Fixed(8))
        .tile("nr", "n", TileSize::Fixed(12))
        .tensor("x", Role::Input, &["m", "k"], Format::F32)
        .tensor_with_layout(
            "w",
            Role::Weight,
            &["n", "k"],
            Format::F32,
            Layout {
                dims: vec![
                    LayoutDim::outer("n", "nr"),
                    LayoutDim::whole("k"),
                    LayoutDim::inner("nr"),
                ],
                int4_pair_transpose: false,
                int4_signed_codes: false,
            },
        )
        .tensor("y", Role::Output, &["m", "n"], Format::F32)
        .op(Op::Matmul(matmul(Format::F32, Format::F32)))
        .parallel("m")
        .parallel("n")
        .split("k")
        .build()
        .unwrap();
    let text = assert_round_trip(&k);
    assert_eq!(
        text,
        "kernel sgemm_64x96x100
axis m: 64
axis n: 96
axis k: 100 reduce
tile mr of m: 8
tile nr of n: 12
input x[m, k]: f32
weight w[n, k]: f32 layout [n/nr, k, nr]
output y[m, n]: f32
matmul y[m, n] = x[m, k] * w[n, k] epilogue act(relu)
parallel m, n
split k
"
    );
}

#[test]
fn w4a16_gemv() {
    let k = KernelBuilder::new("gemv-w4a16")
        .axis("m", Extent::Fixed(1), AxisKind::Spatial)
        .dyn_axis("n")
        .reduce_axis("k")
        .tile("kp", "k", TileSize::Solve)
        .tensor("x", Role::Input, &["m", "k"], Format::F16)
        .tensor_with_layout(
            "w",
            Role::Weight,
            &["n", "k"],
            Format::E0M4(Group::Size(128), ParamType::F32),
            Layout {
                dims: vec![
                    LayoutDim::whole("n"),
                    LayoutDim::outer("k", "kp"),
                    LayoutDim::inner("kp"),
                ],
                int4_pair_transpose: true,
                int4_signed_codes: false,
            },
        )
        .tensor("y", Role::Output, &["m", "n"], Format::F16)
        .op(Op::Matmul(Matmul {
            epilogue: Epilogue {
                activation: Activation::Silu,
                ..matmul(Format::F16, Format::E0M4(Group::Size(128), ParamType::F32)).epilogue
            },
            ..matmul(Format::F16, Format::E0M4(Group::Size(128), ParamType::F32))
        }))
        .parallel("n")
        .build()
        .unwrap();
    let text = assert_round_trip(&k);
    assert!(text.contains("weight w[n, k]: e0m4:g128 layout [n, k/kp, kp] pair-transpose\n"));
    assert!(text.contains("epilogue scale zero-point act(silu)\n"));
}

fn attention_kernel(kind: AttentionKind, softmax: SoftmaxMode, t: Extent) -> Kernel {
    KernelBuilder::new("attn")
        .axis("t", t, AxisKind::Spatial)
        .axis("hq", Extent::Fixed(32), AxisKind::Spatial)
        .axis("kvh", Extent::Fixed(8), AxisKind::Spatial)
        .axis("d", Extent::Fixed(128), AxisKind::Spatial)
        .reduce_axis("s")
        .tile("sp", "s", TileSize::Fixed(64))
        .tensor("q", Role::Input, &["t", "hq", "d"], Format::F16)
        .tensor_with_layout(
            "k",
            Role::Cache,
            &["s", "kvh", "d"],
            Format::U4Asym(Group::Row, ParamType::F32),
            Layout {
                dims: vec![
                    LayoutDim::outer("s", "sp"),
                    LayoutDim::whole("kvh"),
                    LayoutDim::inner("sp"),
                    LayoutDim::whole("d"),
                ],
                int4_pair_transpose: false,
                int4_signed_codes: false,
            },
        )
        .tensor("v", Role::Cache, &["s", "kvh", "d"], Format::Fp8E4M3)
        .tensor("o", Role::Output, &["t", "hq", "d"], Format::F32)
        .op(Op::Attention(Attention {
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
            q_prescaled: kind == AttentionKind::Decode,
            softmax,
        }))
        .parallel("hq")
        .split("s")
        .build()
        .unwrap()
}

#[test]
fn decode_attention_async_softmax() {
    let k = attention_kernel(
        AttentionKind::Decode,
        SoftmaxMode::Async {
            phi: 0.1 + 0.2,
            lo: -20.5,
            hi: 1.0e-7,
        },
        Extent::Fixed(1),
    );
    let text = assert_round_trip(&k);
    assert!(text.contains(
        "attention decode o[t, hq, d] = softmax(q[t, hq, d] * k[s, kvh, d]) * v[s, kvh, d] \
         q-prescaled softmax async(phi=0.3, lo=-20.5, hi=1e-7)\n"
    ));
    assert!(text.contains("cache k[s, kvh, d]: u4asym:row layout [s/sp, kvh, sp, d]\n"));
    assert!(text.ends_with("parallel hq\nsplit s\n"));
}

#[test]
fn async_softmax_floats_round_trip_exactly() {
    for (phi, lo, hi) in [
        (f32::MIN_POSITIVE / 3.0, f32::NEG_INFINITY, f32::INFINITY),
        (f32::MAX, -f32::MAX, f32::MAX),
        (-0.0, 16_777_217.0, 1.0e30),
        (std::f32::consts::PI, -1.0e-38, 1.0e-38),
    ] {
        let k = attention_kernel(
            AttentionKind::Decode,
            SoftmaxMode::Async { phi, lo, hi },
            Extent::Dyn,
        );
        let back: Kernel = k.to_string().parse().unwrap();
        let Some(SoftmaxMode::Async {
            phi: p,
            lo: l,
            hi: h,
        }) = back.as_attention().map(|a| a.softmax)
        else {
            panic!("lost the async mode");
        };
        assert_eq!(
            (p.to_bits(), l.to_bits(), h.to_bits()),
            (phi.to_bits(), lo.to_bits(), hi.to_bits())
        );
    }
}

#[test]
fn prefill_attention_online() {
    let k = attention_kernel(AttentionKind::Prefill, SoftmaxMode::Online, Extent::Dyn);
    let text = assert_round_trip(&k);
    assert!(text.contains(
        "attention prefill o[t, hq, d] = softmax(q[t, hq, d] * k[s, kvh, d]) * v[s, kvh, d] \
         softmax online\n"
    ));
}

#[test]
fn comments_blank_lines_and_any_order_parse_to_the_canonical_kernel() {
    let text = "
# a W4A8 matmul, written by hand
kernel matmul-w4a8   # name
parallel h

output y[e, h]: f32
axis e: dyn spatial
axis h: dyn
axis l: dyn reduce
matmul y[e,h]=x[e,l]*w[h,l] epilogue act(none) bias(b) zero-point scale
tile lp of l: 32
tile hp of h: solve
tile ep of e: solve
input x[e, l]: i8dyn
weight w[h, l]: u4asym:g32 layout [h/hp, l/lp, hp, lp] pair-transpose
input b[h]: f32
";
    let k: Kernel = text.parse().unwrap();
    let canonical = w4a8();
    // Same declarations, different order: equal after sorting the lists.
    let mut a = k.clone();
    let mut b = canonical.clone();
    for kk in [&mut a, &mut b] {
        kk.axes.sort_by(|x, y| x.name.cmp(&y.name));
        kk.tensors.sort_by(|x, y| x.name.cmp(&y.name));
        kk.schedule.tiles.sort_by(|x, y| x.name.cmp(&y.name));
    }
    assert_eq!(a, b);
    let reprinted: Kernel = k.to_string().parse().unwrap();
    assert_eq!(reprinted, k);
}

/// Q4_0 with its codes stored signed (the layout NEON packs) prints the
/// flag on the weight line and parses back to the same kernel.
#[test]
fn signed_codes_round_trip() {
    let mut k = library::get("matmul-q4_0").unwrap();
    for t in &mut k.tensors {
        if t.name == "w" {
            t.layout.int4_signed_codes = true;
        }
    }
    verify(&k).unwrap();
    let text = assert_round_trip(&k);
    assert!(
        text.contains(
            "weight w[h, l]: u4sym:g32:f16 layout [h/hp, l/lp, hp, lp] pair-transpose signed-codes"
        ),
        "{text}"
    );
}

#[test]
fn format_group_and_layout_from_str() {
    for f in Format::examples() {
        assert_eq!(f.to_string().parse::<Format>().unwrap(), f);
    }
    assert_eq!("g64".parse::<Group>().unwrap(), Group::Size(64));
    assert_eq!("row".parse::<Group>().unwrap(), Group::Row);
    assert!("g".parse::<Group>().is_err());
    assert!("g+4".parse::<Group>().is_err());
    assert!("g99999999999".parse::<Group>().is_err());
    let e = "u4asym".parse::<Format>().unwrap_err();
    assert!(e.message.contains("needs a group"), "{e}");
    let e = "f16:g32".parse::<Format>().unwrap_err();
    assert!(e.message.contains("takes no group"), "{e}");

    let layout: Layout = "[h/hp, l/lp, hp, lp] pair-transpose".parse().unwrap();
    assert_eq!(
        layout.dims,
        vec![
            LayoutDim::outer("h", "hp"),
            LayoutDim::outer("l", "lp"),
            LayoutDim::inner("hp"),
            LayoutDim::inner("lp"),
        ]
    );
    assert!(layout.int4_pair_transpose);
    assert!(!layout.int4_signed_codes);
    assert_eq!(layout.to_string(), "[h/hp, l/lp, hp, lp] pair-transpose");
    let signed: Layout = "[h/hp, l/lp, hp, lp] pair-transpose signed-codes"
        .parse()
        .unwrap();
    assert!(signed.int4_pair_transpose && signed.int4_signed_codes);
    assert_eq!(
        signed.to_string(),
        "[h/hp, l/lp, hp, lp] pair-transpose signed-codes"
    );
    let rm: Layout = "[a, b]".parse().unwrap();
    assert!(rm.is_row_major(&["a", "b"]));
    assert_eq!(rm.to_string(), "[a, b]");
    assert!("[a, b".parse::<Layout>().is_err());
    assert!("[a, b] extra".parse::<Layout>().is_err());
}
