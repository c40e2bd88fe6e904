//! The built-in library stays what its docs say: every name builds a
//! verified kernel of that name, names describe the formats, and each kernel
//! has the axes, formats, layouts, epilogue and schedule documented in
//! `library.rs`.

use tessera_dsl::ir::ParamType;
use tessera_dsl::library::{self, ASYNC_SOFTMAX, LibraryError};
use tessera_dsl::naming::{LibraryName, LibraryOp};
use tessera_dsl::*;

#[test]
fn names_are_sorted_unique_and_cover_the_library() {
    let names = library::names();
    assert!(
        names.windows(2).all(|w| w[0] < w[1]),
        "not strictly sorted: {names:?}"
    );
    for required in [
        "matmul-f32",
        "matmul-f16",
        "matmul-w4a8",
        "matmul-w8a8",
        "matmul-w4a16",
        "matmul-w8a16",
        "matmul-e0m4a16",
        "attention-decode-f16",
        "attention-decode-kv8",
        "attention-prefill-f16",
        "attention-prefill-kv8",
    ] {
        assert!(names.contains(&required), "missing {required}");
    }
}

#[test]
fn get_returns_a_kernel_named_as_asked_and_all_agrees() {
    let all = library::all();
    assert_eq!(all.len(), library::names().len());
    for (name, from_all) in library::names().iter().zip(&all) {
        let kernel = library::get(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(kernel.name, *name);
        assert_eq!(&kernel, from_all, "{name}: get and all disagree");
        // The builder verified it; check again directly.
        verify(&kernel).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

#[test]
fn unknown_names_are_errors_listing_every_valid_name() {
    for bad in [
        "",
        "matmul",
        "matmul-W4A8",
        "matmul-w4a8 ",
        "attention-decode",
        "conv-f32",
    ] {
        let err = library::get(bad).expect_err(bad);
        assert!(
            matches!(&err, LibraryError::Unknown { name, .. } if name == bad),
            "{bad:?}: {err:?}"
        );
        let message = err.to_string();
        assert!(message.contains(&format!("`{bad}`")), "{message}");
        for valid in library::names() {
            assert!(message.contains(valid), "{message} lacks {valid}");
        }
    }
}

/// The short variant the formats call for: `f32`/`f16` for plain float
/// matmuls, ggml's block name for the formats that are ggml's blocks
/// (`q4_0`, `q4_1`, `q8_0`; `q4_0a16` … with f16 activations), `w<bits>a<bits>` (or `e0m4a<bits>`) for other
/// quantized weights, `f16` / `kv8` for attention caches.
fn variant_from_formats(kernel: &Kernel) -> String {
    let format = |name: &str| kernel.tensor(name).unwrap().format;
    match &kernel.op {
        Op::Matmul(m) => {
            let (x, w) = (format(&m.x), format(&m.w));
            let g32f16 = (Group::Size(32), ParamType::F16);
            let block = if w == Format::U4Sym(g32f16.0, g32f16.1) {
                Some("q4_0")
            } else if w == Format::U4Asym(g32f16.0, g32f16.1) {
                Some("q4_1")
            } else if w == Format::I8Sym(g32f16.0, g32f16.1) {
                Some("q8_0")
            } else {
                None
            };
            if x.is_float() && x == w {
                x.to_string()
            } else if let Some(block) = block {
                // The GPU family's f16 activations say so: `q4_0a16`.
                if x == Format::F16 {
                    format!("{block}a16")
                } else {
                    block.into()
                }
            } else if let Format::E0M4(..) = w {
                format!("e0m4a{}", x.bits())
            } else {
                format!("w{}a{}", w.bits(), x.bits())
            }
        }
        Op::Attention(a) => {
            let (k, v) = (format(&a.k), format(&a.v));
            if k == Format::F16 && v == Format::F16 {
                "f16".into()
            } else {
                assert_eq!(k.bits(), v.bits(), "{}", kernel.name);
                format!("kv{}", k.bits())
            }
        }
    }
}

#[test]
fn names_parse_and_describe_op_phase_and_formats() {
    for kernel in library::all() {
        let name: LibraryName = kernel.name.parse().unwrap();
        match (&name.op, &kernel.op) {
            (LibraryOp::Matmul, Op::Matmul(_)) => {}
            (LibraryOp::Attention(kind), Op::Attention(a)) => assert_eq!(*kind, a.kind),
            _ => panic!("{}: name says {:?}", kernel.name, name.op),
        }
        assert_eq!(
            name.variant,
            variant_from_formats(&kernel),
            "{}",
            kernel.name
        );
    }
}

/// A tensor's role, format and dims, for one-line comparisons.
fn sig(t: &Tensor) -> (Role, Format, Vec<&str>) {
    (
        t.role,
        t.format,
        t.dims.iter().map(String::as_str).collect(),
    )
}

fn packed(outer: &str, tile: &str, reduce: &str, rtile: &str) -> Vec<LayoutDim> {
    vec![
        LayoutDim::outer(outer, tile),
        LayoutDim::outer(reduce, rtile),
        LayoutDim::inner(tile),
        LayoutDim::inner(rtile),
    ]
}

fn gpu() -> Vec<LayoutDim> {
    vec![
        LayoutDim::outer("l", "lp"),
        LayoutDim::whole("h"),
        LayoutDim::inner("lp"),
    ]
}

struct MatmulExpect {
    name: &'static str,
    x: Format,
    x_packed: bool,
    w: Format,
    w_dims: Vec<LayoutDim>,
    pair_transpose: bool,
    y: Format,
    scale: bool,
    zero_point: bool,
}

fn matmul_table() -> Vec<MatmulExpect> {
    let g32 = Group::Size(32);
    let cpu = |name, x, x_packed, w, pair_transpose, y, scale, zero_point| MatmulExpect {
        name,
        x,
        x_packed,
        w,
        w_dims: packed("h", "hp", "l", "lp"),
        pair_transpose,
        y,
        scale,
        zero_point,
    };
    let a16 = |name, w, zero_point| MatmulExpect {
        name,
        x: Format::F16,
        x_packed: false,
        w,
        w_dims: gpu(),
        pair_transpose: false,
        y: Format::F32,
        scale: true,
        zero_point,
    };
    vec![
        cpu(
            "matmul-f32",
            Format::F32,
            false,
            Format::F32,
            false,
            Format::F32,
            false,
            false,
        ),
        cpu(
            "matmul-f16",
            Format::F16,
            false,
            Format::F16,
            false,
            Format::F16,
            false,
            false,
        ),
        cpu(
            "matmul-w4a8",
            Format::I8Dyn,
            true,
            Format::U4Asym(g32, ParamType::F32),
            true,
            Format::F32,
            true,
            true,
        ),
        cpu(
            "matmul-w8a8",
            Format::I8Dyn,
            true,
            Format::I8Sym(Group::Row, ParamType::F32),
            false,
            Format::F32,
            true,
            false,
        ),
        cpu(
            "matmul-q4_0",
            Format::I8Dyn,
            true,
            Format::U4Sym(g32, ParamType::F16),
            true,
            Format::F32,
            true,
            false,
        ),
        cpu(
            "matmul-q4_1",
            Format::I8Dyn,
            true,
            Format::U4Asym(g32, ParamType::F16),
            true,
            Format::F32,
            true,
            true,
        ),
        cpu(
            "matmul-q8_0",
            Format::I8Dyn,
            true,
            Format::I8Sym(g32, ParamType::F16),
            false,
            Format::F32,
            true,
            false,
        ),
        a16("matmul-w4a16", Format::U4Asym(g32, ParamType::F32), true),
        a16(
            "matmul-w8a16",
            Format::I8Sym(Group::Row, ParamType::F32),
            false,
        ),
        a16("matmul-e0m4a16", Format::E0M4(g32, ParamType::F32), true),
        a16("matmul-q4_0a16", Format::U4Sym(g32, ParamType::F16), false),
        a16("matmul-q4_1a16", Format::U4Asym(g32, ParamType::F16), true),
        a16("matmul-q8_0a16", Format::I8Sym(g32, ParamType::F16), false),
    ]
}

#[test]
fn matmul_kernels_match_their_documentation() {
    let table = matmul_table();
    let matmul_names: Vec<_> = library::names()
        .iter()
        .filter(|n| n.starts_with("matmul-"))
        .collect();
    assert_eq!(matmul_names.len(), table.len(), "table covers every matmul");
    for ex in table {
        let k = library::get(ex.name).unwrap();
        let m = k
            .as_matmul()
            .unwrap_or_else(|| panic!("{}: not a matmul", ex.name));
        let ctx = ex.name;

        for (axis, kind) in [
            ("e", AxisKind::Spatial),
            ("h", AxisKind::Spatial),
            ("l", AxisKind::Reduce),
        ] {
            let a = k
                .axis(axis)
                .unwrap_or_else(|| panic!("{ctx}: no axis {axis}"));
            assert_eq!(
                (a.extent, a.kind),
                (Extent::Dyn, kind),
                "{ctx}: axis {axis}"
            );
        }
        assert_eq!(k.axes.len(), 3, "{ctx}");
        for (tile, axis) in [("ep", "e"), ("hp", "h"), ("lp", "l")] {
            let t = k
                .tile(tile)
                .unwrap_or_else(|| panic!("{ctx}: no tile {tile}"));
            assert_eq!(
                (t.axis.as_str(), t.size),
                (axis, TileSize::Solve),
                "{ctx}: {tile}"
            );
        }
        assert_eq!(
            (&*m.x, &*m.w, &*m.y, &*m.e, &*m.h, &*m.l),
            ("x", "w", "y", "e", "h", "l"),
            "{ctx}"
        );

        let x = k.tensor("x").unwrap();
        assert_eq!(sig(x), (Role::Input, ex.x, vec!["e", "l"]), "{ctx}: x");
        if ex.x_packed {
            assert_eq!(
                x.layout.dims,
                packed("e", "ep", "l", "lp"),
                "{ctx}: x layout"
            );
        } else {
            assert!(x.layout.is_row_major(&["e", "l"]), "{ctx}: x layout");
        }
        assert!(!x.layout.int4_pair_transpose, "{ctx}");

        let w = k.tensor("w").unwrap();
        assert_eq!(sig(w), (Role::Weight, ex.w, vec!["h", "l"]), "{ctx}: w");
        assert_eq!(w.layout.dims, ex.w_dims, "{ctx}: w layout");
        assert_eq!(w.layout.int4_pair_transpose, ex.pair_transpose, "{ctx}");
        // The pair transpose only makes sense for 4-bit codes.
        assert!(
            !w.layout.int4_pair_transpose || w.format.bits() == 4,
            "{ctx}"
        );

        let y = k.tensor("y").unwrap();
        assert_eq!(sig(y), (Role::Output, ex.y, vec!["e", "h"]), "{ctx}: y");
        assert!(y.layout.is_row_major(&["e", "h"]), "{ctx}: y layout");

        let bias = k.tensor("bias").unwrap();
        assert_eq!(
            sig(bias),
            (Role::Input, Format::F32, vec!["h"]),
            "{ctx}: bias"
        );
        assert_eq!(k.tensors.len(), 4, "{ctx}");

        assert_eq!(
            m.epilogue,
            Epilogue {
                scale: ex.scale,
                zero_point: ex.zero_point,
                bias: Some("bias".into()),
                activation: Activation::None,
            },
            "{ctx}: epilogue"
        );
        // The epilogue follows from the formats.
        assert_eq!(
            ex.scale,
            ex.x.is_quantized() || ex.w.is_quantized(),
            "{ctx}"
        );
        assert_eq!(ex.zero_point, ex.w.is_asymmetric(), "{ctx}");

        assert_eq!(k.schedule.parallel, ["e", "h"], "{ctx}: parallel");
        assert_eq!(k.schedule.split, None, "{ctx}: split");
    }
}

#[test]
fn attention_kernels_match_their_documentation() {
    let table = [
        (
            "attention-decode-f16",
            AttentionKind::Decode,
            Format::F16,
            Format::F16,
        ),
        (
            "attention-decode-kv8",
            AttentionKind::Decode,
            Format::I8Asym(Group::Row, ParamType::F32),
            Format::Fp8E4M3,
        ),
        (
            "attention-prefill-f16",
            AttentionKind::Prefill,
            Format::F16,
            Format::F16,
        ),
        (
            "attention-prefill-kv8",
            AttentionKind::Prefill,
            Format::I8Asym(Group::Row, ParamType::F32),
            Format::Fp8E4M3,
        ),
    ];
    let count = library::names()
        .iter()
        .filter(|n| n.starts_with("attention-"))
        .count();
    assert_eq!(count, table.len(), "table covers every attention kernel");
    for (name, kind, kf, vf) in table {
        let k = library::get(name).unwrap();
        let a = k
            .as_attention()
            .unwrap_or_else(|| panic!("{name}: not attention"));
        let decode = kind == AttentionKind::Decode;
        assert_eq!(a.kind, kind, "{name}");
        assert_eq!(
            (
                &*a.q,
                &*a.k,
                &*a.v,
                &*a.o,
                &*a.tokens,
                &*a.heads,
                &*a.kv_heads,
                &*a.head_dim,
                &*a.seq
            ),
            ("q", "k", "v", "o", "t", "hq", "kvh", "d", "s"),
            "{name}"
        );
        let t_extent = if decode {
            Extent::Fixed(1)
        } else {
            Extent::Dyn
        };
        for (axis, extent, ak) in [
            ("t", t_extent, AxisKind::Spatial),
            ("hq", Extent::Dyn, AxisKind::Spatial),
            ("kvh", Extent::Dyn, AxisKind::Spatial),
            ("d", Extent::Dyn, AxisKind::Spatial),
            ("s", Extent::Dyn, AxisKind::Reduce),
        ] {
            let ax = k
                .axis(axis)
                .unwrap_or_else(|| panic!("{name}: no axis {axis}"));
            assert_eq!((ax.extent, ax.kind), (extent, ak), "{name}: axis {axis}");
        }
        assert_eq!(k.axes.len(), 5, "{name}");

        for (tensor, role, format, dims) in [
            ("q", Role::Input, Format::F16, ["t", "hq", "d"]),
            ("k", Role::Cache, kf, ["s", "kvh", "d"]),
            ("v", Role::Cache, vf, ["s", "kvh", "d"]),
            ("o", Role::Output, Format::F16, ["t", "hq", "d"]),
        ] {
            let t = k.tensor(tensor).unwrap();
            assert_eq!(sig(t), (role, format, dims.to_vec()), "{name}: {tensor}");
            // Caches grow along s, which must stay outermost for in-place appends.
            assert!(t.layout.is_row_major(&dims), "{name}: {tensor} layout");
        }
        assert_eq!(k.tensors.len(), 4, "{name}");

        assert!(a.q_prescaled, "{name}: q is pre-scaled by 1/sqrt(d)");
        if decode {
            assert_eq!(a.softmax, ASYNC_SOFTMAX, "{name}");
            assert_eq!(
                k.schedule.split.as_deref(),
                Some("s"),
                "{name}: flash-decoding split"
            );
        } else {
            assert_eq!(a.softmax, SoftmaxMode::Online, "{name}");
            assert_eq!(k.schedule.split, None, "{name}");
        }
        assert_eq!(k.schedule.parallel, ["kvh"], "{name}: parallel");
        assert!(k.schedule.tiles.is_empty(), "{name}");
    }
}

#[test]
fn async_softmax_defaults_are_the_papers_llama2_range() {
    // FlashDecoding++ Figure 5, Llama2-7B: 99.99% of softmax inputs in [-16.8, 6.5].
    let SoftmaxMode::Async { phi, lo, hi } = ASYNC_SOFTMAX else {
        panic!("not async");
    };
    assert_eq!((phi, lo, hi), (0.0, -16.8, 6.5));
    // Exponents stay far from fp32 overflow (e^88.7) within the bounds.
    assert!(lo < 0.0 && 0.0 < hi && hi.exp().is_finite() && (hi - lo).exp() < 1e11);
}
