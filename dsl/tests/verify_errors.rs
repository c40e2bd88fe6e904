//! One test per `VerifyError` kind: start from a valid kernel, break one
//! thing, and check the error names exactly what was broken.

use tessera_dsl::verify::AxisUser;
use tessera_dsl::*;

fn axis(name: &str, extent: Extent, kind: AxisKind) -> Axis {
    Axis {
        name: name.into(),
        extent,
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

fn tile(name: &str, axis: &str, size: TileSize) -> TileVar {
    TileVar {
        name: name.into(),
        axis: axis.into(),
        size,
    }
}

/// A valid W4A8 matmul with a tiled, pair-transposed weight and a bias.
fn mm() -> Kernel {
    let mut w = tensor(
        "w",
        Role::Weight,
        &["h", "l"],
        Format::U4Asym(Group::Size(32), ParamType::F32),
    );
    w.layout = Layout {
        dims: vec![
            LayoutDim::outer("h", "hp"),
            LayoutDim::outer("l", "lp"),
            LayoutDim::inner("hp"),
            LayoutDim::inner("lp"),
        ],
        int4_pair_transpose: true,
        int4_signed_codes: false,
    };
    Kernel {
        name: "matmul-w4a8".into(),
        axes: vec![
            axis("e", Extent::Dyn, AxisKind::Spatial),
            axis("h", Extent::Fixed(4096), AxisKind::Spatial),
            axis("l", Extent::Dyn, AxisKind::Reduce),
        ],
        tensors: vec![
            tensor("x", Role::Input, &["e", "l"], Format::I8Dyn),
            w,
            tensor("b", Role::Input, &["h"], Format::F32),
            tensor("y", Role::Output, &["e", "h"], Format::F32),
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
        schedule: Schedule {
            tiles: vec![
                tile("hp", "h", TileSize::Solve),
                tile("lp", "l", TileSize::Fixed(32)),
            ],
            parallel: vec!["h".into()],
            split: None,
        },
    }
}

/// A valid decode attention with GQA, an int4 key cache and fp8 values.
fn attn() -> Kernel {
    Kernel {
        name: "attn".into(),
        axes: vec![
            axis("t", Extent::Fixed(1), AxisKind::Spatial),
            axis("hq", Extent::Fixed(32), AxisKind::Spatial),
            axis("kvh", Extent::Fixed(8), AxisKind::Spatial),
            axis("d", Extent::Fixed(128), AxisKind::Spatial),
            axis("s", Extent::Dyn, AxisKind::Reduce),
        ],
        tensors: vec![
            tensor("q", Role::Input, &["t", "hq", "d"], Format::F16),
            tensor(
                "k",
                Role::Cache,
                &["s", "kvh", "d"],
                Format::U4Asym(Group::Row, ParamType::F32),
            ),
            tensor("v", Role::Cache, &["s", "kvh", "d"], Format::Fp8E5M2),
            tensor("o", Role::Output, &["t", "hq", "d"], Format::F16),
        ],
        op: Op::Attention(Attention {
            kind: AttentionKind::Decode,
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
            softmax: SoftmaxMode::Async {
                phi: 5.0,
                lo: -30.0,
                hi: 10.0,
            },
        }),
        schedule: Schedule {
            tiles: vec![tile("sp", "s", TileSize::Solve)],
            parallel: vec!["hq".into()],
            split: Some("s".into()),
        },
    }
}

fn matmul_of(k: &mut Kernel) -> &mut Matmul {
    match &mut k.op {
        Op::Matmul(m) => m,
        Op::Attention(_) => unreachable!("test kernel is a matmul"),
    }
}

fn attention_of(k: &mut Kernel) -> &mut Attention {
    match &mut k.op {
        Op::Attention(a) => a,
        Op::Matmul(_) => unreachable!("test kernel is an attention"),
    }
}

fn tensor_of<'k>(k: &'k mut Kernel, name: &str) -> &'k mut Tensor {
    k.tensors.iter_mut().find(|t| t.name == name).unwrap()
}

fn axis_of<'k>(k: &'k mut Kernel, name: &str) -> &'k mut Axis {
    k.axes.iter_mut().find(|a| a.name == name).unwrap()
}

/// `k` must fail with exactly `want`, and the message must mention `names`.
fn expect(k: &Kernel, want: VerifyError, names: &[&str]) {
    let got = verify(k).expect_err("kernel should be rejected");
    assert_eq!(got, want);
    let msg = got.to_string();
    for n in names {
        assert!(msg.contains(n), "message {msg:?} does not mention {n:?}");
    }
}

fn s(x: &str) -> String {
    x.to_string()
}

#[test]
fn base_kernels_are_valid() {
    verify(&mm()).unwrap();
    verify(&attn()).unwrap();
}

#[test]
fn integer_weights_with_i8dyn_activations_are_fine() {
    let mut k = mm();
    tensor_of(&mut k, "w").format = Format::I8Sym(Group::Row, ParamType::F32);
    tensor_of(&mut k, "w").layout.int4_pair_transpose = false;
    matmul_of(&mut k).epilogue.zero_point = false;
    verify(&k).unwrap();
}

#[test]
fn missing_op() {
    let err = KernelBuilder::new("k").dyn_axis("e").build().unwrap_err();
    assert_eq!(err, VerifyError::MissingOp);
}

#[test]
fn invalid_names() {
    let mut k = mm();
    k.name = "9lives".into();
    expect(
        &k,
        VerifyError::InvalidName {
            what: "kernel",
            name: s("9lives"),
        },
        &["9lives"],
    );
    let mut k = mm();
    k.name = String::new();
    assert!(matches!(
        verify(&k),
        Err(VerifyError::InvalidName { what: "kernel", .. })
    ));
    let mut k = mm();
    axis_of(&mut k, "e").name = "e-1".into();
    expect(
        &k,
        VerifyError::InvalidName {
            what: "axis",
            name: s("e-1"),
        },
        &["axis", "e-1"],
    );
    let mut k = mm();
    tensor_of(&mut k, "b").name = "b ias".into();
    expect(
        &k,
        VerifyError::InvalidName {
            what: "tensor",
            name: s("b ias"),
        },
        &["b ias"],
    );
    let mut k = mm();
    k.schedule.tiles[0].name = "hpé".into();
    expect(
        &k,
        VerifyError::InvalidName {
            what: "tile",
            name: s("hpé"),
        },
        &["hpé"],
    );
}

#[test]
fn duplicate_names() {
    let mut k = mm();
    k.axes.push(axis("h", Extent::Dyn, AxisKind::Spatial));
    expect(
        &k,
        VerifyError::DuplicateName {
            what: "axis",
            name: s("h"),
        },
        &["axis name 'h'"],
    );
    let mut k = mm();
    k.tensors
        .push(tensor("b", Role::Input, &["h"], Format::F16));
    expect(
        &k,
        VerifyError::DuplicateName {
            what: "tensor",
            name: s("b"),
        },
        &["'b'"],
    );
    let mut k = mm();
    k.schedule.tiles.push(tile("hp", "e", TileSize::Solve));
    expect(
        &k,
        VerifyError::DuplicateName {
            what: "tile",
            name: s("hp"),
        },
        &["'hp'"],
    );
}

#[test]
fn axis_tile_clash() {
    let mut k = mm();
    k.schedule.tiles.push(tile("e", "e", TileSize::Solve));
    expect(&k, VerifyError::AxisTileClash { name: s("e") }, &["'e'"]);
}

#[test]
fn unknown_axes() {
    let mut k = mm();
    k.schedule.tiles.push(tile("zp", "z", TileSize::Solve));
    expect(
        &k,
        VerifyError::UnknownAxis {
            user: AxisUser::Tile(s("zp")),
            axis: s("z"),
        },
        &["tile 'zp'", "'z'"],
    );
    let mut k = mm();
    tensor_of(&mut k, "b").dims = vec![s("hh")];
    expect(
        &k,
        VerifyError::UnknownAxis {
            user: AxisUser::Tensor(s("b")),
            axis: s("hh"),
        },
        &["tensor 'b'", "'hh'"],
    );
    let mut k = mm();
    matmul_of(&mut k).l = s("kk");
    expect(
        &k,
        VerifyError::UnknownAxis {
            user: AxisUser::Op {
                op: "matmul",
                role: "l",
            },
            axis: s("kk"),
        },
        &["matmul axis l", "'kk'"],
    );
    let mut k = mm();
    k.schedule.split = Some(s("q"));
    expect(
        &k,
        VerifyError::UnknownAxis {
            user: AxisUser::Schedule("split"),
            axis: s("q"),
        },
        &["split", "'q'"],
    );
}

#[test]
fn zero_extent_and_zero_tile() {
    let mut k = mm();
    axis_of(&mut k, "h").extent = Extent::Fixed(0);
    expect(&k, VerifyError::ZeroExtent { axis: s("h") }, &["'h'"]);
    let mut k = mm();
    k.schedule.tiles[1].size = TileSize::Fixed(0);
    expect(&k, VerifyError::ZeroTile { tile: s("lp") }, &["'lp'"]);
}

#[test]
fn duplicate_tile_per_axis() {
    let mut k = mm();
    k.schedule.tiles.push(tile("hq", "h", TileSize::Fixed(4)));
    expect(
        &k,
        VerifyError::DuplicateTile {
            axis: s("h"),
            first: s("hp"),
            second: s("hq"),
        },
        &["'h'", "'hp'", "'hq'"],
    );
}

#[test]
fn repeated_tensor_dim() {
    let mut k = mm();
    let b = tensor_of(&mut k, "b");
    b.dims = vec![s("h"), s("h")];
    b.layout = Layout::row_major(&["h", "h"]);
    expect(
        &k,
        VerifyError::RepeatedTensorDim {
            tensor: s("b"),
            axis: s("h"),
        },
        &["'b'", "'h'"],
    );
}

fn set_w_layout(k: &mut Kernel, dims: Vec<LayoutDim>) {
    tensor_of(k, "w").layout.dims = dims;
}

#[test]
fn layout_unknown_tile() {
    let mut k = mm();
    set_w_layout(
        &mut k,
        vec![
            LayoutDim::outer("h", "hx"),
            LayoutDim::whole("l"),
            LayoutDim::inner("hx"),
        ],
    );
    expect(
        &k,
        VerifyError::LayoutUnknownTile {
            tensor: s("w"),
            tile: s("hx"),
        },
        &["'w'", "'hx'"],
    );
}

#[test]
fn layout_tile_of_another_axis() {
    let mut k = mm();
    set_w_layout(
        &mut k,
        vec![
            LayoutDim::outer("h", "lp"),
            LayoutDim::outer("l", "hp"),
            LayoutDim::inner("hp"),
            LayoutDim::inner("lp"),
        ],
    );
    expect(
        &k,
        VerifyError::LayoutTileAxis {
            tensor: s("w"),
            tile: s("lp"),
            tile_axis: s("l"),
            axis: s("h"),
        },
        &["'w'", "'lp'", "'l'", "'h'"],
    );
}

#[test]
fn layout_foreign_dim() {
    let mut k = mm();
    set_w_layout(
        &mut k,
        vec![
            LayoutDim::whole("h"),
            LayoutDim::whole("l"),
            LayoutDim::whole("e"),
        ],
    );
    expect(
        &k,
        VerifyError::LayoutForeignDim {
            tensor: s("w"),
            name: s("e"),
        },
        &["'w'", "'e'"],
    );
}

#[test]
fn layout_unpaired_tile() {
    // Outer without inner.
    let mut k = mm();
    set_w_layout(
        &mut k,
        vec![LayoutDim::outer("h", "hp"), LayoutDim::whole("l")],
    );
    expect(
        &k,
        VerifyError::LayoutUnpairedTile {
            tensor: s("w"),
            tile: s("hp"),
            axis: s("h"),
        },
        &["'w'", "'hp'"],
    );
    // A bare tile name without its outer part (what the parser makes of `[h, l, lp]`).
    let mut k = mm();
    set_w_layout(
        &mut k,
        vec![
            LayoutDim::whole("h"),
            LayoutDim::whole("l"),
            LayoutDim::whole("lp"),
        ],
    );
    expect(
        &k,
        VerifyError::LayoutUnpairedTile {
            tensor: s("w"),
            tile: s("lp"),
            axis: s("l"),
        },
        &["'w'", "'lp'"],
    );
}

#[test]
fn layout_missing_and_repeated_dims() {
    let mut k = mm();
    set_w_layout(&mut k, vec![LayoutDim::whole("l")]);
    expect(
        &k,
        VerifyError::LayoutMissingDim {
            tensor: s("w"),
            axis: s("h"),
        },
        &["'w'", "'h'"],
    );
    let mut k = mm();
    set_w_layout(
        &mut k,
        vec![
            LayoutDim::whole("h"),
            LayoutDim::outer("h", "hp"),
            LayoutDim::inner("hp"),
            LayoutDim::whole("l"),
        ],
    );
    expect(
        &k,
        VerifyError::LayoutRepeatedDim {
            tensor: s("w"),
            axis: s("h"),
        },
        &["'w'", "'h'"],
    );
    let mut k = mm();
    set_w_layout(
        &mut k,
        vec![
            LayoutDim::whole("h"),
            LayoutDim::whole("l"),
            LayoutDim::whole("l"),
        ],
    );
    expect(
        &k,
        VerifyError::LayoutRepeatedDim {
            tensor: s("w"),
            axis: s("l"),
        },
        &["'l'"],
    );
}

#[test]
fn pair_transpose_needs_4_bits() {
    let mut k = mm();
    tensor_of(&mut k, "w").format = Format::I8Asym(Group::Size(32), ParamType::F32);
    expect(
        &k,
        VerifyError::PairTransposeFormat {
            tensor: s("w"),
            format: Format::I8Asym(Group::Size(32), ParamType::F32),
        },
        &["'w'", "i8asym:g32"],
    );
}

#[test]
fn signed_codes_need_u4sym() {
    let mut k = mm();
    tensor_of(&mut k, "w").layout.int4_signed_codes = true;
    let format = tensor_of(&mut k, "w").format;
    assert!(!matches!(format, Format::U4Sym(..)), "{format}");
    expect(
        &k,
        VerifyError::SignedCodesFormat {
            tensor: s("w"),
            format,
        },
        &["'w'", "signed-codes", "u4sym"],
    );
    tensor_of(&mut k, "w").format = Format::U4Sym(Group::Size(32), ParamType::F16);
    if let Op::Matmul(m) = &mut k.op {
        m.epilogue.zero_point = false;
    }
    verify(&k).unwrap();
}

#[test]
fn group_sizes() {
    for bad in [0, 2, 30, 33] {
        let mut k = mm();
        let f = Format::U4Asym(Group::Size(bad), ParamType::F32);
        tensor_of(&mut k, "w").format = f;
        expect(
            &k,
            VerifyError::GroupSize {
                tensor: s("w"),
                format: f,
            },
            &["'w'", &f.to_string()],
        );
    }
    for good in [4, 32, 64, 128, 256] {
        let mut k = mm();
        tensor_of(&mut k, "w").format = Format::U4Asym(Group::Size(good), ParamType::F32);
        verify(&k).unwrap();
    }
}

#[test]
fn unknown_operand_tensors() {
    let mut k = mm();
    matmul_of(&mut k).w = s("ww");
    expect(
        &k,
        VerifyError::UnknownTensor {
            op: "matmul",
            operand: "w",
            tensor: s("ww"),
        },
        &["'ww'"],
    );
    let mut k = mm();
    matmul_of(&mut k).epilogue.bias = Some(s("bb"));
    expect(
        &k,
        VerifyError::UnknownTensor {
            op: "matmul",
            operand: "bias",
            tensor: s("bb"),
        },
        &["bias", "'bb'"],
    );
}

#[test]
fn same_tensor_and_same_axis() {
    let mut k = attn();
    attention_of(&mut k).v = s("k");
    expect(
        &k,
        VerifyError::SameTensor {
            op: "attention",
            first: "k",
            second: "v",
            tensor: s("k"),
        },
        &["'k'"],
    );
    let mut k = attn();
    attention_of(&mut k).kv_heads = s("hq");
    expect(
        &k,
        VerifyError::SameAxis {
            op: "attention",
            first: "heads",
            second: "kv_heads",
            axis: s("hq"),
        },
        &["'hq'"],
    );
}

#[test]
fn operand_dims() {
    let mut k = mm();
    let x = tensor_of(&mut k, "x");
    x.dims = vec![s("l"), s("e")];
    x.layout = Layout::row_major(&["l", "e"]);
    expect(
        &k,
        VerifyError::OperandDims {
            op: "matmul",
            operand: "x",
            tensor: s("x"),
            expected: vec![s("e"), s("l")],
            got: vec![s("l"), s("e")],
        },
        &["'x'", "[e, l]", "[l, e]"],
    );
    let mut k = mm();
    let b = tensor_of(&mut k, "b");
    b.dims = vec![s("e")];
    b.layout = Layout::row_major(&["e"]);
    assert!(matches!(
        verify(&k),
        Err(VerifyError::OperandDims {
            operand: "bias",
            ..
        })
    ));
}

#[test]
fn operand_roles() {
    let mut k = mm();
    tensor_of(&mut k, "w").role = Role::Input;
    expect(
        &k,
        VerifyError::OperandRole {
            op: "matmul",
            operand: "w",
            tensor: s("w"),
            expected: Role::Weight,
            got: Role::Input,
        },
        &["'w'", "Weight"],
    );
    let mut k = attn();
    tensor_of(&mut k, "k").role = Role::Weight;
    assert!(matches!(
        verify(&k),
        Err(VerifyError::OperandRole {
            operand: "k",
            expected: Role::Cache,
            ..
        })
    ));
    let mut k = mm();
    tensor_of(&mut k, "b").role = Role::Weight;
    assert!(matches!(
        verify(&k),
        Err(VerifyError::OperandRole {
            operand: "bias",
            ..
        })
    ));
}

#[test]
fn operand_formats() {
    /// (base kernel, tensor, operand slot, bad format).
    type Case = (fn() -> Kernel, &'static str, &'static str, Format);
    let cases: Vec<Case> = vec![
        (mm, "x", "x", Format::Fp8E4M3),
        (mm, "x", "x", Format::I8Sym(Group::Row, ParamType::F32)),
        (mm, "w", "w", Format::I8Dyn),
        (mm, "w", "w", Format::Fp8E5M2),
        (mm, "y", "y", Format::I8Dyn),
        (mm, "y", "y", Format::Fp8E4M3),
        (
            mm,
            "b",
            "bias",
            Format::U4Asym(Group::Size(32), ParamType::F32),
        ),
        (attn, "q", "q", Format::I8Dyn),
        (
            attn,
            "k",
            "k",
            Format::I8Asym(Group::Size(32), ParamType::F32),
        ),
        (attn, "k", "k", Format::Fp8E4M3),
        (attn, "v", "v", Format::U4Asym(Group::Row, ParamType::F32)),
        (attn, "o", "o", Format::Fp8E4M3),
    ];
    for (make, name, operand, format) in cases {
        let mut k = make();
        let t = tensor_of(&mut k, name);
        t.format = format;
        t.layout.int4_pair_transpose = false;
        match verify(&k) {
            Err(VerifyError::OperandFormat {
                operand: o,
                tensor,
                format: f,
                ..
            }) => {
                assert_eq!((o, tensor.as_str(), f), (operand, name, format));
            }
            other => panic!("{name} as {format}: {other:?}"),
        }
    }
    for v in [
        Format::F32,
        Format::BF16,
        Format::Fp8E4M3,
        Format::I8Asym(Group::Row, ParamType::F32),
    ] {
        let mut k = attn();
        tensor_of(&mut k, "v").format = v;
        verify(&k).unwrap();
    }
}

#[test]
fn axis_kinds() {
    let mut k = mm();
    axis_of(&mut k, "l").kind = AxisKind::Spatial;
    expect(
        &k,
        VerifyError::AxisKind {
            op: "matmul",
            role: "l",
            axis: s("l"),
            expected: AxisKind::Reduce,
        },
        &["'l'", "Reduce"],
    );
    let mut k = attn();
    axis_of(&mut k, "d").kind = AxisKind::Reduce;
    assert!(matches!(
        verify(&k),
        Err(VerifyError::AxisKind {
            role: "head_dim",
            expected: AxisKind::Spatial,
            ..
        })
    ));
}

#[test]
fn scale_rules() {
    let mut k = mm();
    matmul_of(&mut k).epilogue.scale = false;
    expect(
        &k,
        VerifyError::MissingScale {
            tensor: s("x"),
            format: Format::I8Dyn,
        },
        &["'x'", "i8dyn"],
    );
    let mut k = mm();
    tensor_of(&mut k, "x").format = Format::F16;
    matmul_of(&mut k).epilogue.scale = false;
    expect(
        &k,
        VerifyError::MissingScale {
            tensor: s("w"),
            format: Format::U4Asym(Group::Size(32), ParamType::F32),
        },
        &["'w'", "u4asym:g32"],
    );
    let mut k = mm();
    tensor_of(&mut k, "x").format = Format::F32;
    let w = tensor_of(&mut k, "w");
    w.format = Format::BF16;
    w.layout.int4_pair_transpose = false;
    matmul_of(&mut k).epilogue.zero_point = false;
    expect(&k, VerifyError::UnexpectedScale, &["scale"]);
}

#[test]
fn zero_point_rules() {
    let mut k = mm();
    matmul_of(&mut k).epilogue.zero_point = false;
    expect(
        &k,
        VerifyError::MissingZeroPoint {
            tensor: s("w"),
            format: Format::U4Asym(Group::Size(32), ParamType::F32),
        },
        &["'w'", "u4asym:g32"],
    );
    let mut k = mm();
    let w = tensor_of(&mut k, "w");
    w.format = Format::I8Sym(Group::Size(64), ParamType::F32);
    w.layout.int4_pair_transpose = false;
    expect(
        &k,
        VerifyError::UnexpectedZeroPoint {
            tensor: s("w"),
            format: Format::I8Sym(Group::Size(64), ParamType::F32),
        },
        &["'w'", "i8sym:g64"],
    );
}

#[test]
fn cache_seq_outermost() {
    let mut k = attn();
    tensor_of(&mut k, "v").layout = Layout::row_major(&["kvh", "s", "d"]);
    expect(
        &k,
        VerifyError::CacheSeqNotOutermost {
            tensor: s("v"),
            seq: s("s"),
        },
        &["'v'", "'s'"],
    );
    // Tiled s outermost is fine.
    let mut k = attn();
    tensor_of(&mut k, "k").layout.dims = vec![
        LayoutDim::outer("s", "sp"),
        LayoutDim::whole("kvh"),
        LayoutDim::whole("d"),
        LayoutDim::inner("sp"),
    ];
    verify(&k).unwrap();
}

#[test]
fn decode_tokens() {
    let mut k = attn();
    axis_of(&mut k, "t").extent = Extent::Fixed(4);
    expect(
        &k,
        VerifyError::DecodeTokens {
            axis: s("t"),
            extent: 4,
        },
        &["'t'", "4"],
    );
    attention_of(&mut k).kind = AttentionKind::Prefill;
    verify(&k).unwrap();
    let mut k = attn();
    axis_of(&mut k, "t").extent = Extent::Dyn;
    verify(&k).unwrap();
}

#[test]
fn softmax_parameters() {
    for phi in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let mut k = attn();
        attention_of(&mut k).softmax = SoftmaxMode::Async {
            phi,
            lo: -1.0,
            hi: 1.0,
        };
        assert!(
            matches!(verify(&k), Err(VerifyError::SoftmaxPhi { .. })),
            "{phi}"
        );
    }
    for (lo, hi) in [(1.0, 1.0), (2.0, -2.0), (f32::NAN, 1.0), (0.0, f32::NAN)] {
        let mut k = attn();
        attention_of(&mut k).softmax = SoftmaxMode::Async { phi: 0.0, lo, hi };
        expect(
            &k,
            VerifyError::SoftmaxBounds {
                lo: format!("{lo:?}"),
                hi: format!("{hi:?}"),
            },
            &["lo", "hi"],
        );
    }
}

#[test]
fn heads_multiple_of_kv_heads() {
    let mut k = attn();
    axis_of(&mut k, "kvh").extent = Extent::Fixed(5);
    expect(
        &k,
        VerifyError::HeadsNotMultiple {
            heads: s("hq"),
            heads_extent: 32,
            kv_heads: s("kvh"),
            kv_extent: 5,
        },
        &["'hq'", "'kvh'", "32", "5"],
    );
    axis_of(&mut k, "kvh").extent = Extent::Dyn;
    verify(&k).unwrap();
}

#[test]
fn schedule_rules() {
    let mut k = mm();
    k.schedule.parallel.push(s("h"));
    expect(
        &k,
        VerifyError::RepeatedScheduleAxis {
            list: "parallel",
            axis: s("h"),
        },
        &["parallel", "'h'"],
    );
    let mut k = mm();
    k.schedule.split = Some(s("h"));
    expect(&k, VerifyError::SplitNotReduce { axis: s("h") }, &["'h'"]);
    let mut k = mm();
    k.schedule.split = Some(s("l"));
    verify(&k).unwrap();
    let mut k = mm();
    k.schedule.parallel = vec![s("l")];
    expect(
        &k,
        VerifyError::ParallelReduce { axis: s("l") },
        &["'l'", "split l"],
    );
}
