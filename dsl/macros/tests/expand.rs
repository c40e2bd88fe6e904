//! The kernels `kernel!` must express, built for real and compared field by
//! field with the IR written out by hand.

use tessera_dsl::ir::ParamType;
use tessera_dsl::ir::*;
use tessera_dsl::kernel;

fn s(x: &str) -> String {
    x.to_string()
}

fn axis(name: &str, extent: Extent, kind: AxisKind) -> Axis {
    Axis {
        name: s(name),
        extent,
        kind,
    }
}

fn tensor(name: &str, role: Role, dims: &[&str], format: Format, layout: Layout) -> Tensor {
    Tensor {
        name: s(name),
        role,
        dims: dims.iter().map(|d| s(d)).collect(),
        format,
        layout,
    }
}

fn tile(name: &str, axis: &str, size: TileSize) -> TileVar {
    TileVar {
        name: s(name),
        axis: s(axis),
        size,
    }
}

fn packed(dims: Vec<LayoutDim>, pair: bool) -> Layout {
    Layout {
        dims,
        int4_pair_transpose: pair,
        int4_signed_codes: false,
    }
}

use LayoutDim as D;

fn matmul(epilogue: Epilogue) -> Op {
    Op::Matmul(Matmul {
        x: s("x"),
        w: s("w"),
        y: s("y"),
        e: s("e"),
        h: s("h"),
        l: s("l"),
        epilogue,
    })
}

const NO_EPILOGUE: Epilogue = Epilogue {
    scale: false,
    zero_point: false,
    bias: None,
    activation: Activation::None,
};

#[test]
fn w4a8_linear_layer() {
    let k = kernel! {
        matmul-w4a8(e, h, l) {
            tile e by ep, h by hp, l by lp;
            x: input  i8dyn      [e, l] layout [e/ep, l/lp, ep, lp];
            w: weight u4asym:g32 [h, l] layout [h/hp, l/lp, hp, lp] pair_transpose;
            b: input  f32        [h];
            y: output f32        [e, h];
            y[e, h] = sum(l) x[e, l] * w[h, l];
            epilogue scale, zero_point, bias(b);
            parallel h;
        }
    };
    let expected = Kernel {
        name: s("matmul-w4a8"),
        axes: vec![
            axis("e", Extent::Dyn, AxisKind::Spatial),
            axis("h", Extent::Dyn, AxisKind::Spatial),
            axis("l", Extent::Dyn, AxisKind::Reduce),
        ],
        tensors: vec![
            tensor(
                "x",
                Role::Input,
                &["e", "l"],
                Format::I8Dyn,
                packed(
                    vec![
                        D::outer("e", "ep"),
                        D::outer("l", "lp"),
                        D::inner("ep"),
                        D::inner("lp"),
                    ],
                    false,
                ),
            ),
            tensor(
                "w",
                Role::Weight,
                &["h", "l"],
                Format::U4Asym(Group::Size(32), ParamType::F32),
                packed(
                    vec![
                        D::outer("h", "hp"),
                        D::outer("l", "lp"),
                        D::inner("hp"),
                        D::inner("lp"),
                    ],
                    true,
                ),
            ),
            tensor(
                "b",
                Role::Input,
                &["h"],
                Format::F32,
                Layout::row_major(&["h"]),
            ),
            tensor(
                "y",
                Role::Output,
                &["e", "h"],
                Format::F32,
                Layout::row_major(&["e", "h"]),
            ),
        ],
        op: matmul(Epilogue {
            scale: true,
            zero_point: true,
            bias: Some(s("b")),
            activation: Activation::None,
        }),
        schedule: Schedule {
            tiles: vec![
                tile("ep", "e", TileSize::Solve),
                tile("hp", "h", TileSize::Solve),
                tile("lp", "l", TileSize::Solve),
            ],
            parallel: vec![s("h")],
            split: None,
        },
    };
    assert_eq!(k, Ok(expected));
}

#[test]
fn w4a16_gemv() {
    let k = kernel! {
        gemv-w4a16(e = 1, h, l) {
            tile h by hp, l by lp;
            x: input  f16        [e, l];
            w: weight u4asym:g32 [h, l] layout [h/hp, l/lp, hp, lp] pair_transpose;
            y: output f16        [e, h];
            y[e, h] = sum(l) x[e, l] * w[h, l];
            epilogue scale, zero_point;
            parallel h;
        }
    }
    .expect("the GEMV builds");
    assert_eq!(k.name, "gemv-w4a16");
    assert_eq!(k.axes[0], axis("e", Extent::Fixed(1), AxisKind::Spatial));
    assert_eq!(k.tensors[0].layout, Layout::row_major(&["e", "l"]));
    assert_eq!(k.tensors[0].format, Format::F16);
    assert_eq!(
        k.schedule.tiles,
        [
            tile("hp", "h", TileSize::Solve),
            tile("lp", "l", TileSize::Solve)
        ]
    );
    assert_eq!(
        k.op,
        matmul(Epilogue {
            scale: true,
            zero_point: true,
            bias: None,
            activation: Activation::None
        })
    );
}

#[test]
fn flat_gemm_f16_and_f32() {
    let f16 = kernel! {
        matmul-f16-flat(e, h, l) {
            tile e by ep = 8, h by hp, l by lp;
            x: input  f16 [e, l] layout [e/ep, l/lp, ep, lp];
            w: weight f16 [h, l] layout [h/hp, l/lp, hp, lp];
            y: output f16 [e, h];
            y[e, h] = sum(l) x[e, l] * w[h, l];
            parallel h;
        }
    }
    .expect("the flat GEMM builds");
    assert_eq!(f16.schedule.tiles[0], tile("ep", "e", TileSize::Fixed(8)));
    assert_eq!(f16.schedule.parallel, [s("h")]);
    assert_eq!(f16.op, matmul(NO_EPILOGUE));

    let f32 = kernel! {
        matmul-f32(e, h, l) {
            tile e by ep = 8, h by hp, l by lp;
            x: input  f32 [e, l] layout [e/ep, l/lp, ep, lp];
            w: weight f32 [h, l] layout [h/hp, l/lp, hp, lp];
            y: output f32 [e, h];
            y[e, h] = sum(l) x[e, l] * w[h, l];
        }
    }
    .expect("the f32 flat GEMM builds");
    assert!(f32.tensors.iter().all(|t| t.format == Format::F32));
}

#[test]
fn decode_attention_async_softmax() {
    let k = kernel! {
        attention-decode-f16(t = 1, hq, kvh, d = 128, s) {
            q: input  f16 [t, hq, d] prescaled;
            k: cache  f16 [s, kvh, d];
            v: cache  f16 [s, kvh, d];
            o: output f16 [t, hq, d];
            o[t, hq, d] = attention(q[t, hq, d], k[s, kvh, d], v[s, kvh, d]) decode;
            softmax async(phi = 0.5, lo = -20.0, hi = 20);
            split s;
            parallel hq;
        }
    }
    .expect("decode attention builds");
    assert_eq!(
        k.axes,
        [
            axis("t", Extent::Fixed(1), AxisKind::Spatial),
            axis("hq", Extent::Dyn, AxisKind::Spatial),
            axis("kvh", Extent::Dyn, AxisKind::Spatial),
            axis("d", Extent::Fixed(128), AxisKind::Spatial),
            axis("s", Extent::Dyn, AxisKind::Reduce),
        ]
    );
    assert_eq!(k.tensors[1].role, Role::Cache);
    assert_eq!(
        k.op,
        Op::Attention(Attention {
            kind: AttentionKind::Decode,
            q: s("q"),
            k: s("k"),
            v: s("v"),
            o: s("o"),
            tokens: s("t"),
            heads: s("hq"),
            kv_heads: s("kvh"),
            head_dim: s("d"),
            seq: s("s"),
            q_prescaled: true,
            softmax: SoftmaxMode::Async {
                phi: 0.5,
                lo: -20.0,
                hi: 20.0
            },
        })
    );
    assert_eq!(k.schedule.split, Some(s("s")));
    assert_eq!(k.schedule.parallel, [s("hq")]);
}

#[test]
fn library_shapes_are_expressible() {
    // GPU weight layout [l/lp, h, lp] with a fixed lp, bias and SiLU.
    let gpu = kernel! {
        "matmul-w8a16-gpu"(e, h, l) {
            tile l by lp = 32;
            x: input  f16      [e, l];
            w: weight i8sym:row [h, l] layout [l/lp, h, lp];
            b: input  f16      [h];
            y: output f16      [e, h];
            y[e, h] = sum(l) x[e, l] * w[h, l];
            epilogue scale, bias(b), silu;
        }
    }
    .expect("the GPU layout builds");
    assert_eq!(
        gpu.tensors[1].layout,
        packed(
            vec![D::outer("l", "lp"), D::whole("h"), D::inner("lp")],
            false
        )
    );
    assert_eq!(gpu.schedule.tiles, [tile("lp", "l", TileSize::Fixed(32))]);
    let ep = &gpu.as_matmul().expect("a matmul").epilogue;
    assert_eq!((ep.scale, ep.zero_point), (true, false));
    assert_eq!(ep.bias.as_deref(), Some("b"));
    assert_eq!(ep.activation, Activation::Silu);

    // E0M4 weights with ReLU; W8A8 with asymmetric int8.
    let e0m4 = kernel! {
        matmul-e0m4a16(e, h, l) {
            x: input  f16       [e, l];
            w: weight e0m4:g128 [h, l] pair_transpose;
            y: output f32       [e, h];
            y[e, h] = sum(l) x[e, l] * w[h, l];
            epilogue relu, zero_point, scale;
        }
    }
    .expect("e0m4 builds");
    assert_eq!(
        e0m4.tensors[1].format,
        Format::E0M4(Group::Size(128), ParamType::F32)
    );
    assert!(e0m4.tensors[1].layout.int4_pair_transpose);
    assert!(!e0m4.tensors[1].layout.int4_signed_codes);
    // Q4_0 with its codes stored signed (q - 8), as NEON packs them.
    let q4_signed = kernel! {
        matmul-q4s(e, h, l) {
            tile e by ep, h by hp, l by lp;
            x: input  i8dyn         [e, l] layout [e/ep, l/lp, ep, lp];
            w: weight u4sym:g32:f16 [h, l] layout [h/hp, l/lp, hp, lp] pair_transpose signed_codes;
            y: output f32           [e, h];
            y[e, h] = sum(l) x[e, l] * w[h, l];
            epilogue scale;
        }
    }
    .expect("signed-code q4_0 builds");
    let w = &q4_signed.tensors[1].layout;
    assert!(w.int4_pair_transpose && w.int4_signed_codes);
    assert!(
        q4_signed
            .to_string()
            .contains("pair-transpose signed-codes")
    );
    let w8a8 = kernel! {
        matmul-w8a8(e, h, l) {
            x: input  i8dyn     [e, l];
            w: weight i8asym:g64 [h, l];
            y: output bf16      [e, h];
            y[e, h] = sum(l) x[e, l] * w[h, l];
            epilogue scale, zero_point;
        }
    }
    .expect("w8a8 builds");
    assert_eq!(w8a8.tensors[2].format, Format::BF16);

    // Prefill, online softmax, int8 keys and fp8 values, plain multi-head:
    // the KV heads are their own axis, of the same extent as the query heads.
    let prefill = kernel! {
        attention-prefill-kv8(t, hq = 32, kvh = 32, d, s) {
            q: input  f32        [t, hq, d];
            k: cache  i8asym:row [s, kvh, d];
            v: cache  fp8e4m3    [s, kvh, d];
            o: output f32        [t, hq, d];
            o[t, hq, d] = attention(q[t, hq, d], k[s, kvh, d], v[s, kvh, d]) prefill;
            softmax online;
            parallel t, hq;
        }
    }
    .expect("prefill builds");
    let a = prefill.as_attention().expect("attention");
    assert_eq!(a.kind, AttentionKind::Prefill);
    assert_eq!(a.softmax, SoftmaxMode::Online);
    assert!(!a.q_prescaled);
    assert_eq!((a.heads.as_str(), a.kv_heads.as_str()), ("hq", "kvh"));
    assert_eq!(prefill.tensors[2].format, Format::Fp8E4M3);
}

#[test]
fn names_keep_underscores_and_accept_literals() {
    let k = kernel! {
        my_gemv(e = 1, h, l) {
            x: input f32 [e, l];
            w: weight f32 [h, l];
            y: output f32 [e, h];
            y[e, h] = sum(l) x[e, l] * w[h, l];
        }
    };
    assert_eq!(k.map(|k| k.name), Ok(s("my_gemv")));
    let k = kernel! {
        "gemm-4x8"(e, h, l) {
            x: input f32 [e, l];
            w: weight f32 [h, l];
            y: output f32 [e, h];
            y[e, h] = sum(l) x[e, l] * w[h, l];
        }
    };
    assert_eq!(k.map(|k| k.name), Ok(s("gemm-4x8")));
}
