//! Unit tests of the macro as a plain function: what every input means,
//! what every mistake says, and a bounded fuzz run that it never panics.

use crate::check::{Activation, LayoutDim, OpSpec, Spec};
use crate::expand::{expand, spec};
use crate::format::{Format, Group, ParamType};
use crate::parse::{AttentionKind, Role, SoftmaxMode};
use proc_macro2::TokenStream;
use std::str::FromStr;

const W4A8: &str = "
    matmul-w4a8(e, h, l) {
        tile e by ep, h by hp, l by lp;
        x: input  i8dyn      [e, l] layout [e/ep, l/lp, ep, lp];
        w: weight u4asym:g32 [h, l] layout [h/hp, l/lp, hp, lp] pair_transpose;
        b: input  f32        [h];
        y: output f32        [e, h];
        y[e, h] = sum(l) x[e, l] * w[h, l];
        epilogue scale, zero_point, bias(b);
        parallel h;
    }";

const GEMV_W4A16: &str = "
    gemv-w4a16(e = 1, h, l) {
        tile h by hp, l by lp;
        x: input  f16        [e, l];
        w: weight u4asym:g32 [h, l] layout [h/hp, l/lp, hp, lp] pair_transpose;
        y: output f16        [e, h];
        y[e, h] = sum(l) x[e, l] * w[h, l];
        epilogue scale, zero_point;
        parallel h;
    }";

const FLAT_GEMM: &str = "
    matmul-f16-flat(e, h, l) {
        tile e by ep = 8, h by hp, l by lp;
        x: input  f16 [e, l] layout [e/ep, l/lp, ep, lp];
        w: weight f16 [h, l] layout [h/hp, l/lp, hp, lp];
        y: output f16 [e, h];
        y[e, h] = sum(l) x[e, l] * w[h, l];
        parallel h;
    }";

const DECODE: &str = "
    attention-decode-f16(t = 1, hq, kvh, d = 128, s) {
        q: input  f16 [t, hq, d] prescaled;
        k: cache  f16 [s, kvh, d];
        v: cache  f16 [s, kvh, d];
        o: output f16 [t, hq, d];
        o[t, hq, d] = attention(q[t, hq, d], k[s, kvh, d], v[s, kvh, d]) decode;
        softmax async(phi = 0.0, lo = -20.0, hi = 20.0);
        split s;
        parallel hq;
    }";

const EXAMPLES: [&str; 4] = [W4A8, GEMV_W4A16, FLAT_GEMM, DECODE];

fn tokens(text: &str) -> TokenStream {
    TokenStream::from_str(text).unwrap_or_else(|e| panic!("test input does not lex: {e}"))
}

fn ok(text: &str) -> Spec {
    spec(tokens(text)).unwrap_or_else(|e| panic!("expected Ok, got: {e}"))
}

#[test]
fn w4a8_means_what_it_says() {
    let s = ok(W4A8);
    assert_eq!(s.name, "matmul-w4a8");
    let axes: Vec<(&str, Option<u32>, bool)> = s
        .axes
        .iter()
        .map(|a| (a.name.as_str(), a.fixed, a.reduce))
        .collect();
    assert_eq!(
        axes,
        [("e", None, false), ("h", None, false), ("l", None, true)]
    );
    let w = &s.tensors[1];
    assert_eq!(w.role, Role::Weight);
    assert_eq!(w.format, Format::U4Asym(Group::Size(32), ParamType::F32));
    assert!(w.pair_transpose);
    assert_eq!(
        w.layout,
        Some(vec![
            LayoutDim::Outer {
                axis: "h".into(),
                tile: "hp".into()
            },
            LayoutDim::Outer {
                axis: "l".into(),
                tile: "lp".into()
            },
            LayoutDim::Inner { tile: "hp".into() },
            LayoutDim::Inner { tile: "lp".into() },
        ])
    );
    assert_eq!(s.tensors[2].layout, None);
    let OpSpec::Matmul(m) = &s.op else {
        panic!("expected a matmul")
    };
    assert_eq!((m.x.as_str(), m.w.as_str(), m.y.as_str()), ("x", "w", "y"));
    assert_eq!((m.e.as_str(), m.h.as_str(), m.l.as_str()), ("e", "h", "l"));
    assert!(m.scale && m.zero_point);
    assert_eq!(m.bias.as_deref(), Some("b"));
    assert_eq!(m.activation, Activation::None);
    assert_eq!(s.parallel, ["h"]);
    assert!(s.tiles.iter().all(|t| t.fixed.is_none()));
}

#[test]
fn decode_attention_roles_come_from_positions() {
    let s = ok(DECODE);
    let OpSpec::Attention(a) = &s.op else {
        panic!("expected attention")
    };
    assert_eq!(a.kind, AttentionKind::Decode);
    assert_eq!(
        [&a.tokens, &a.heads, &a.kv_heads, &a.head_dim, &a.seq].map(|x| x.as_str()),
        ["t", "hq", "kvh", "d", "s"]
    );
    assert!(a.q_prescaled);
    assert_eq!(
        a.softmax,
        SoftmaxMode::Async {
            phi: 0.0,
            lo: -20.0,
            hi: 20.0
        }
    );
    assert_eq!(s.split.as_deref(), Some("s"));
    assert!(s.axes.iter().all(|x| x.reduce == (x.name == "s")));
}

#[test]
fn expansion_is_one_builder_expression() {
    for text in EXAMPLES {
        let out = expand(tokens(text));
        let code = out.to_string();
        assert!(!code.contains("compile_error"), "{code}");
        assert!(
            code.contains(":: tessera_dsl :: KernelBuilder :: new"),
            "{code}"
        );
        assert!(code.trim_end().ends_with(". build ()"), "{code}");
        syn::parse2::<syn::Expr>(out).expect("the expansion is an expression");
    }
    let code = expand(tokens(DECODE)).to_string();
    assert!(code.contains("lo : - 20f32"), "{code}");
    assert!(code.contains("hi : 20f32"), "{code}");
}

#[test]
fn errors_expand_to_compile_error() {
    let code = expand(tokens("matmul-f32(e) { }")).to_string();
    assert!(code.starts_with(":: core :: compile_error !"), "{code}");
}

/// Every statement order gives the same kernel: only the relative order of
/// tensors, tiles and schedule entries matters.
#[test]
fn statement_order_is_free() {
    for text in EXAMPLES {
        let reference = ok(text);
        let (head, body) = text.split_once('{').expect("a body");
        let body = body.trim_end().trim_end_matches('}');
        let statements: Vec<&str> = body
            .split(';')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect();
        // Rotate the statements: tensors keep their relative order.
        for shift in 1..statements.len() {
            let mut rotated = statements.clone();
            rotated.rotate_left(shift);
            let moved: Vec<&str> = rotated
                .iter()
                .filter(|s| !s.contains(": "))
                .copied()
                .collect();
            let tensors: Vec<&str> = statements
                .iter()
                .filter(|s| s.contains(": "))
                .copied()
                .collect();
            let text = format!("{head}{{ {}; {}; }}", moved.join("; "), tensors.join("; "));
            assert_eq!(ok(&text), reference, "{text}");
        }
    }
}

#[test]
fn raw_identifiers_lose_their_prefix() {
    let s = ok("r#fn(e, h, l) {
        r#type: input f32 [e, l];
        w: weight f32 [h, l];
        y: output f32 [e, h];
        y[e, h] = sum(l) r#type[e, l] * w[h, l];
    }");
    assert_eq!(s.name, "fn");
    assert_eq!(s.tensors[0].name, "type");
}

#[test]
fn gpu_layout_and_fixed_tiles() {
    let s = ok("
        matmul-w4a16-gpu(e, h, l) {
            tile l by lp = 32;
            x: input  f16        [e, l];
            w: weight u4asym:row [h, l] layout [l/lp, h, lp];
            y: output f16        [e, h];
            y[e, h] = sum(l) x[e, l] * w[h, l];
            epilogue scale, zero_point, silu;
        }");
    assert_eq!(s.tiles[0].fixed, Some(32));
    assert_eq!(
        s.tensors[1].layout.as_deref(),
        Some(
            &[
                LayoutDim::Outer {
                    axis: "l".into(),
                    tile: "lp".into()
                },
                LayoutDim::Whole("h".into()),
                LayoutDim::Inner { tile: "lp".into() },
            ][..]
        )
    );
    assert!(matches!(&s.op, OpSpec::Matmul(m) if m.activation == Activation::Silu));
}

/// Each malformed input and a fragment its error message must contain.
const MISTAKES: &[(&str, &str)] = &[
    ("", "expected a kernel"),
    ("matmul", "expected the axes of kernel `matmul`"),
    ("matmul(e, h, l)", "expected the kernel body in braces"),
    (
        "matmul(e, h, l) { } extra",
        "unexpected tokens after the kernel body",
    ),
    ("matmul-(e) {}", "expected a name part after `-`"),
    ("\"bad name!\"(e) {}", "invalid kernel name"),
    ("m() {}", "a kernel needs its axes"),
    ("m(é) {}", "names in a kernel are ASCII identifiers"),
    ("m(e, e) {}", "axis `e` is declared twice"),
    ("m(e: dyn) {}", "write `e` for an extent bound at call time"),
    ("m(e = 0) {}", "must be a positive integer"),
    ("m(e = 8u32) {}", "without a type suffix"),
    ("m(e = x) {}", "expected the axis's fixed extent"),
    ("m(e h) {}", "expected `,`"),
    ("m(e) { }", "the kernel has no computation"),
    ("m(e) { vectorize e; }", "expected a statement"),
    ("m(e) { 5; }", "expected a statement"),
    ("m(e) { tile e ep; }", "expected `by`"),
    ("m(e) { tile e by ep = 0; }", "must be a positive integer"),
    ("m(e) { tile q by qp; }", "unknown axis `q` in `tile`"),
    ("m(e) { tile e by e; }", "has the name of an axis"),
    (
        "m(e, h) { tile e by p, h by p; }",
        "tile variable `p` is declared twice",
    ),
    ("m(e) { tile e by ep, e by eq; }", "already tiled by `ep`"),
    ("m(e) { x: in f32 [e]; }", "unknown role `in`"),
    ("m(e) { x: input f64 [e]; }", "unknown format `f64`"),
    (
        "m(e) { x: input u4asym [e]; }",
        "needs a quantization group",
    ),
    (
        "m(e) { x: input u4asym:g6 [e]; }",
        "invalid quantization group `g6`",
    ),
    (
        "m(e) { x: input f32 e; }",
        "expected the dimensions of `x` in brackets",
    ),
    (
        "m(e) { x: input f32 [e] packed; }",
        "unknown tensor attribute `packed`",
    ),
    (
        "m(e) { x: input f32 [e] layout; }",
        "expected the layout in brackets",
    ),
    (
        "m(e) { x: input f32 [e] y: output f32 [e]; }",
        "expected `;` before `y`",
    ),
    (
        "m(e) { x: input f32 [e] pair_transpose pair_transpose; }",
        "given twice",
    ),
    (
        "m(e) { x: input f32 [e] layout [e/]; }",
        "expected a tile variable after `/`",
    ),
];

/// Semantic mistakes, on an otherwise valid matmul written with `{}` holes.
const MATMUL: &str =
    "m(e, h, l) {{ {tiles} x: {x}; w: {w}; y: {y}; {extra} y[e, h] = {rhs}; {after} }}";

struct Holes {
    tiles: &'static str,
    x: &'static str,
    w: &'static str,
    y: &'static str,
    extra: &'static str,
    rhs: &'static str,
    after: &'static str,
}

const BASE: Holes = Holes {
    tiles: "tile e by ep, h by hp, l by lp;",
    x: "input f32 [e, l]",
    w: "weight f32 [h, l]",
    y: "output f32 [e, h]",
    extra: "",
    rhs: "sum(l) x[e, l] * w[h, l]",
    after: "",
};

fn matmul(h: Holes) -> String {
    MATMUL
        .replace("{{", "{")
        .replace("}}", "}")
        .replace("{tiles}", h.tiles)
        .replace("{x}", h.x)
        .replace("{w}", h.w)
        .replace("{y}", h.y)
        .replace("{extra}", h.extra)
        .replace("{rhs}", h.rhs)
        .replace("{after}", h.after)
}

#[test]
fn the_matmul_template_is_valid() {
    ok(&matmul(BASE));
}

#[test]
fn every_mistake_names_the_problem() {
    let mut cases: Vec<(String, &str)> = MISTAKES
        .iter()
        .map(|(text, expect)| (text.to_string(), *expect))
        .collect();
    let matmul_cases: Vec<(Holes, &str)> = vec![
        (
            Holes {
                x: "input f32 [e, k]",
                ..BASE
            },
            "unknown axis `k` in the dimensions of `x`",
        ),
        (
            Holes {
                x: "input f32 [e, e]",
                ..BASE
            },
            "appears twice in the dimensions",
        ),
        (
            Holes {
                x: "input f32 []",
                ..BASE
            },
            "`x` is declared with 0 dimensions [] but indexed with 2",
        ),
        (
            Holes {
                y: "output i8dyn [e, h]",
                ..BASE
            },
            "output `y` must be f32, f16 or bf16",
        ),
        (
            Holes {
                w: "weight i8dyn [h, l]",
                ..BASE
            },
            "weights `w` must be f32, f16, bf16 or a grouped format",
        ),
        (
            Holes {
                x: "input u4asym:g32 [e, l]",
                ..BASE
            },
            "activations `x` must be",
        ),
        (
            Holes {
                x: "input f32 [e, l]",
                w: "input f32 [h, l]",
                ..BASE
            },
            "`w` is the weights, so it must be declared `weight`",
        ),
        (
            Holes {
                y: "input f32 [e, h]",
                ..BASE
            },
            "`y` is the result, so it must be declared `output`",
        ),
        (
            Holes {
                rhs: "sum(k) x[e, l] * w[h, l]",
                ..BASE
            },
            "unknown axis `k` in `sum`",
        ),
        (
            Holes {
                rhs: "sum(h) x[e, l] * w[h, l]",
                ..BASE
            },
            "cannot sum over `h`: the output `y` keeps it",
        ),
        (
            Holes {
                rhs: "sum(l) x[l] * w[h, l]",
                ..BASE
            },
            "`x` is declared with 2 dimensions [e, l] but indexed with 1",
        ),
        (
            Holes {
                rhs: "sum(l) x[e, l] * w[l, h]",
                ..BASE
            },
            "index 1 must be `h`, not `l`",
        ),
        (
            Holes {
                rhs: "sum(l) x[e, l] * z[h, l]",
                ..BASE
            },
            "unknown tensor `z`",
        ),
        (
            Holes {
                rhs: "sum(l) x[e, l] + w[h, l]",
                ..BASE
            },
            "expected `*`",
        ),
        (
            Holes {
                rhs: "sum(l, e) x[e, l] * w[h, l]",
                ..BASE
            },
            "exactly one axis",
        ),
        (
            Holes {
                rhs: "max(l) x[e, l] * w[h, l]",
                ..BASE
            },
            "expected `sum(l) x[e, l] * w[h, l]`",
        ),
        (
            Holes {
                rhs: "sum(l) w[h, l] * x[e, l]",
                ..BASE
            },
            "the activations `w`",
        ),
        (
            Holes {
                x: "input f32 [e, l] layout [e/hp, l/lp, ep, lp]",
                ..BASE
            },
            "tile `hp` splits axis `h`, not `e`",
        ),
        (
            Holes {
                x: "input f32 [e, l] layout [e/zp, l]",
                ..BASE
            },
            "unknown tile variable `zp`",
        ),
        (
            Holes {
                x: "input f32 [e, l] layout [ep/e, l]",
                ..BASE
            },
            "unknown axis `ep` in the layout of `x` (`ep` is the tile variable of axis `e`)",
        ),
        (
            Holes {
                x: "input f32 [e, l] layout [e, l, zz]",
                ..BASE
            },
            "unknown name `zz` in the layout of `x`",
        ),
        (
            Holes {
                x: "input f32 [e, l] layout [e, l, hp]",
                ..BASE
            },
            "`x` has no axis `h`",
        ),
        (
            Holes {
                x: "input f32 [e, l] layout [e, h/hp, l]",
                ..BASE
            },
            "`x` has no axis `h`",
        ),
        (
            Holes {
                x: "input f32 [e, l] layout [e]",
                ..BASE
            },
            "leaves out axis `l`",
        ),
        (
            Holes {
                x: "input f32 [e, l] layout [e, e, l]",
                ..BASE
            },
            "axis `e` appears twice in the layout",
        ),
        (
            Holes {
                x: "input f32 [e, l] layout [e/ep, e, ep, l]",
                ..BASE
            },
            "both whole and tiled",
        ),
        (
            Holes {
                x: "input f32 [e, l] layout [e, e/ep, ep, l]",
                ..BASE
            },
            "both whole and tiled",
        ),
        (
            Holes {
                x: "input f32 [e, l] layout [e, ep, l]",
                ..BASE
            },
            "both whole and tiled",
        ),
        (
            Holes {
                x: "input f32 [e, l] layout [e/ep, e/ep, ep, l]",
                ..BASE
            },
            "`e/ep` appears twice",
        ),
        (
            Holes {
                x: "input f32 [e, l] layout [e/ep, ep, ep, l]",
                ..BASE
            },
            "tile `ep` appears twice",
        ),
        (
            Holes {
                x: "input f32 [e, l] layout [e/ep, l]",
                ..BASE
            },
            "has `e/ep` but not `ep`",
        ),
        (
            Holes {
                x: "input f32 [e, l] layout [ep, l]",
                ..BASE
            },
            "has `ep` but not `e/ep`",
        ),
        (
            Holes {
                x: "input f32 [e, l] pair_transpose",
                ..BASE
            },
            "`pair_transpose` packs pairs of 4-bit codes",
        ),
        (
            Holes {
                w: "weight u4asym:g32 [h, l] layout [h/hp, l/lp, hp, lp] pair_transpose signed_codes",
                ..BASE
            },
            "`signed_codes` stores q - 8 for the implied zero point 8, so it needs u4sym",
        ),
        (
            Holes {
                x: "input f32 [e, l] prescaled",
                ..BASE
            },
            "`x` is not the query",
        ),
        (
            Holes {
                w: "weight u4asym:g32 [h, l]",
                ..BASE
            },
            "add `epilogue scale, zero_point;`",
        ),
        (
            Holes {
                w: "weight i8sym:g32 [h, l]",
                ..BASE
            },
            "add `epilogue scale;`",
        ),
        (
            Holes {
                w: "weight u4asym:g32 [h, l]",
                after: "epilogue zero_point;",
                ..BASE
            },
            "the epilogue is missing `scale`: `w` (u4asym:g32) is quantized",
        ),
        (
            Holes {
                x: "input i8dyn [e, l]",
                w: "weight u4asym:g32 [h, l]",
                after: "epilogue relu;",
                ..BASE
            },
            "`x` (i8dyn) and `w` (u4asym:g32) are quantized",
        ),
        (
            Holes {
                w: "weight u4asym:g32 [h, l]",
                after: "epilogue scale;",
                ..BASE
            },
            "missing `zero_point`",
        ),
        (
            Holes {
                w: "weight i8sym:g32 [h, l]",
                after: "epilogue scale, zero_point;",
                ..BASE
            },
            "`zero_point` corrects asymmetric weights",
        ),
        (
            Holes {
                after: "epilogue scale;",
                ..BASE
            },
            "neither `x` (f32) nor `w` (f32) is quantized",
        ),
        (
            Holes {
                after: "epilogue relu, silu;",
                ..BASE
            },
            "already applies `relu`",
        ),
        (
            Holes {
                after: "epilogue relu, relu;",
                ..BASE
            },
            "already applies",
        ),
        (
            Holes {
                after: "epilogue bias(b), bias(b);",
                extra: "b: input f32 [h];",
                ..BASE
            },
            "given twice in the epilogue",
        ),
        (
            Holes {
                after: "epilogue bias(b);",
                ..BASE
            },
            "unknown tensor `b`",
        ),
        (
            Holes {
                after: "epilogue bias(b);",
                extra: "b: input f32 [e];",
                ..BASE
            },
            "must be declared `[h]`",
        ),
        (
            Holes {
                after: "epilogue bias(b);",
                extra: "b: output f32 [h];",
                ..BASE
            },
            "the bias `b` is read each call like the activations, so it must be declared `input`, not `output`",
        ),
        (
            Holes {
                after: "epilogue bias(b);",
                extra: "b: input i8sym:row [h];",
                ..BASE
            },
            "the bias `b` must be f32",
        ),
        (
            Holes {
                after: "epilogue bias;",
                ..BASE
            },
            "expected the bias tensor in parentheses",
        ),
        (
            Holes {
                after: "epilogue bias(b, c);",
                ..BASE
            },
            "takes one tensor name",
        ),
        (
            Holes {
                after: "epilogue gelu;",
                ..BASE
            },
            "expected an epilogue step",
        ),
        (
            Holes {
                after: "epilogue relu; epilogue silu;",
                ..BASE
            },
            "`epilogue` is given twice",
        ),
        (
            Holes {
                after: "softmax online;",
                ..BASE
            },
            "a matmul has none",
        ),
        (
            Holes {
                after: "epilogue bias(b);",
                extra: "b: weight f32 [h];",
                ..BASE
            },
            "must be declared `input`, not `weight`",
        ),
        (
            Holes {
                w: "weight fp8e4m3 [h, l]",
                ..BASE
            },
            "weights `w` must be",
        ),
        (
            Holes {
                y: "output u4asym:row [e, h]",
                ..BASE
            },
            "output `y` must be f32, f16 or bf16",
        ),
        (
            Holes {
                extra: "x: input f32 [e, l];",
                ..BASE
            },
            "tensor `x` is declared twice",
        ),
        (
            Holes {
                after: "y[e, h] = sum(l) x[e, l] * w[h, l];",
                ..BASE
            },
            "exactly one computation",
        ),
        (
            Holes {
                after: "parallel h, h;",
                ..BASE
            },
            "listed twice in `parallel`",
        ),
        (
            Holes {
                after: "parallel q;",
                ..BASE
            },
            "unknown axis `q` in `parallel`",
        ),
        (
            Holes {
                after: "double_buffer l;",
                ..BASE
            },
            "`double_buffer` is not a schedule statement",
        ),
        (
            Holes {
                after: "split h;",
                ..BASE
            },
            "`h` is not reduced",
        ),
        (
            Holes {
                after: "split l; split l;",
                ..BASE
            },
            "`split` is given twice",
        ),
        (
            Holes {
                after: "parallel h",
                ..BASE
            },
            "expected `;` after `parallel` statement",
        ),
        (
            Holes {
                rhs: "sum(l) x[e, l] * w[h, l] extra",
                ..BASE
            },
            "expected `;` after the computation",
        ),
    ];
    for (holes, expect) in matmul_cases {
        cases.push((matmul(holes), expect));
    }
    let three_d = "m(e, h, l, z) { x: input f32 [e, l]; w: weight f32 [h, l]; y: output f32 [e, h, z]; y[e, h, z] = sum(l) x[e, l] * w[h, l]; }";
    cases.push((three_d.into(), "a matmul writes a 2-D output"));

    let attention = |q: &str, k: &str, o: &str, stmt: &str, after: &str| {
        format!(
            "a(t = 1, hq, kvh, d, s) {{ q: {q}; k: {k}; v: cache f16 [s, kvh, d]; o: {o}; {stmt}; {after} }}"
        )
    };
    let q = "input f16 [t, hq, d]";
    let k = "cache f16 [s, kvh, d]";
    let o = "output f16 [t, hq, d]";
    let stmt = "o[t, hq, d] = attention(q[t, hq, d], k[s, kvh, d], v[s, kvh, d]) decode";
    assert!(spec(tokens(&attention(q, k, o, stmt, ""))).is_ok());
    let attention_cases: Vec<(String, &str)> = vec![
        (
            attention(q, k, o, stmt, "epilogue scale;"),
            "attention has no epilogue",
        ),
        (
            attention(q, k, o, stmt, "softmax fast;"),
            "unknown softmax mode `fast`",
        ),
        (
            attention(q, k, o, stmt, "softmax async;"),
            "expected the unified max and bounds",
        ),
        (
            attention(q, k, o, stmt, "softmax async(phi = 0.0, lo = -1.0);"),
            "missing: hi",
        ),
        (
            attention(
                q,
                k,
                o,
                stmt,
                "softmax async(phi = 0.0, lo = 1.0, hi = -1.0);",
            ),
            "lo < hi",
        ),
        (
            attention(
                q,
                k,
                o,
                stmt,
                "softmax async(phi = 0.0, phi = 1.0, lo = 1.0, hi = 2.0);",
            ),
            "`phi` is given twice",
        ),
        (
            attention(
                q,
                k,
                o,
                stmt,
                "softmax async(phi = 0.0, mid = 1.0, lo = 1.0, hi = 2.0);",
            ),
            "unknown softmax parameter `mid`",
        ),
        (
            attention(
                q,
                k,
                o,
                stmt,
                "softmax async(phi = 1e40, lo = 1.0, hi = 2.0);",
            ),
            "finite f32",
        ),
        (
            attention(
                q,
                k,
                o,
                stmt,
                "softmax async(phi = 1.0f32, lo = 1.0, hi = 2.0);",
            ),
            "without a type suffix",
        ),
        (
            attention(q, k, o, stmt, "softmax async(phi = x, lo = 1.0, hi = 2.0);"),
            "expected a number",
        ),
        (
            attention(q, k, o, stmt, "softmax async(phi 0.0, lo = 1.0, hi = 2.0);"),
            "expected `=` after `phi`",
        ),
        (
            attention(q, k, o, stmt, "softmax online; softmax online;"),
            "`softmax` is given twice",
        ),
        (
            attention(q, k, o, stmt, "split hq;"),
            "`hq` is not reduced (this kernel reduces `s`)",
        ),
        (
            attention("input i8sym:row [t, hq, d]", k, o, stmt, ""),
            "the query `q` must be f32",
        ),
        (
            attention(q, "input f16 [s, kvh, d]", o, stmt, ""),
            "`k` is the key cache, so it must be declared `cache`",
        ),
        (
            attention(q, "cache f16 [s, kvh, d] prescaled", o, stmt, ""),
            "`k` is not the query",
        ),
        (
            attention(
                q,
                k,
                o,
                "o[t, hq, d] = attention(q[t, hq, d], k[s, kvh, d]) decode",
                "",
            ),
            "expected `,` after the keys",
        ),
        (
            attention(
                q,
                k,
                o,
                "o[t, hq, d] = attention(q[t, hq, d], k[s, kvh, d], v[s, kvh, d], q[t, hq, d]) decode",
                "",
            ),
            "exactly three operands",
        ),
        (
            attention(
                q,
                k,
                o,
                "o[t, hq, d] = attention(q[t, hq, d], k[s, kvh, d], v[s, kvh, d]) causal",
                "",
            ),
            "expected `decode`",
        ),
        (
            attention(q, k, o, "o[t, hq, d] = attention q[t, hq, d]", ""),
            "expected the operands in parentheses",
        ),
        (
            attention(
                q,
                k,
                o,
                "o[t, hq, d] = attention(q[t, hq, d], k[s, kvh, d], k[s, kvh, d]) decode",
                "",
            ),
            "the key and value caches must be different tensors; `k` is used for both",
        ),
        (
            attention(
                q,
                k,
                o,
                "o[t, hq, d] = attention(q[t, hq, d], k[s, kvh, d], v[s, hq, d]) decode",
                "",
            ),
            "`v` is declared [s, kvh, d]: index 2 must be `kvh`",
        ),
        (
            attention(
                "input f16 [t, s, d]",
                k,
                "output f16 [t, s, d]",
                "o[t, s, d] = attention(q[t, s, d], k[s, kvh, d], v[s, kvh, d]) decode",
                "",
            ),
            "the sequence axis `s` is reduced",
        ),
        (
            attention(
                q,
                "cache f16 [s, kvh]",
                o,
                "o[t, hq, d] = attention(q[t, hq, d], k[s, kvh], v[s, kvh, d]) decode",
                "",
            ),
            "must be indexed [s, kvh, d]",
        ),
        (
            attention(
                q,
                "cache f16 [s, d, d]",
                o,
                "o[t, hq, d] = attention(q[t, hq, d], k[s, d, d], v[s, kvh, d]) decode",
                "",
            ),
            "appears twice in the dimensions of `k`",
        ),
        (
            attention(
                q,
                "cache f16 [s, t, d]",
                o,
                "o[t, hq, d] = attention(q[t, hq, d], k[s, t, d], v[s, kvh, d]) decode",
                "",
            ),
            "the KV-heads axis `t` must differ",
        ),
        (
            attention(
                q,
                k,
                "output f16 [t, hq]",
                "o[t, hq] = attention(q[t, hq, d], k[s, kvh, d], v[s, kvh, d]) decode",
                "",
            ),
            "attention writes a 3-D output",
        ),
    ];
    cases.extend(attention_cases);

    // What `verify()` adds for attention: distinct head axes, cache formats
    // and layouts, one decode token, whole GQA groups.
    let attention_with = |axes: &str, k: &str, v: &str, o: &str, kind: &str| {
        let kvh = if k.contains("hq") { "hq" } else { "kvh" };
        format!(
            "a({axes}) {{ q: input f16 [t, hq, d]; k: {k}; v: {v}; o: {o}; \
             o[t, hq, d] = attention(q[t, hq, d], k[s, {kvh}, d], v[s, {kvh}, d]) {kind}; }}"
        )
    };
    let axes = "t = 1, hq, kvh, d, s";
    let v = "cache f16 [s, kvh, d]";
    let verify_cases: Vec<(String, &str)> = vec![
        (
            attention_with(
                "t, hq, d, s",
                "cache f16 [s, hq, d]",
                "cache f16 [s, hq, d]",
                o,
                "prefill",
            ),
            "the KV-heads axis must differ from the query-heads axis `hq`",
        ),
        (
            attention_with(axes, "cache i8sym:row [s, kvh, d]", v, o, "decode"),
            "the key cache `k` must be f32, f16, bf16, or quantized per token",
        ),
        (
            attention_with(axes, "cache i8asym:g32 [s, kvh, d]", v, o, "decode"),
            "not i8asym:g32",
        ),
        (
            attention_with(axes, "cache fp8e4m3 [s, kvh, d]", v, o, "decode"),
            "the key cache `k` must be",
        ),
        (
            attention_with(axes, k, "cache u4asym:row [s, kvh, d]", o, "decode"),
            "the value cache `v` must be f32, f16, bf16, fp8e4m3, fp8e5m2",
        ),
        (
            attention_with(axes, k, v, "output fp8e5m2 [t, hq, d]", "decode"),
            "output `o` must be f32, f16 or bf16",
        ),
        (
            attention_with(
                axes,
                "cache f16 [s, kvh, d] layout [kvh, s, d]",
                v,
                o,
                "decode",
            ),
            "so its layout must start with `s`",
        ),
        (
            attention_with(
                axes,
                k,
                "cache f16 [s, kvh, d] layout [d, kvh, s]",
                o,
                "decode",
            ),
            "the cache `v` is appended along its sequence axis `s`",
        ),
        (
            attention_with("t = 4, hq, kvh, d, s", k, v, o, "decode"),
            "decode attends one query token, so the tokens axis must be `t = 1`",
        ),
        (
            attention_with("t, hq = 8, kvh = 3, d, s", k, v, o, "prefill"),
            "the query heads `hq` = 8 must be a multiple of the KV heads `kvh` = 3",
        ),
    ];
    cases.extend(verify_cases);

    let mut failures = Vec::new();
    for (text, expect) in &cases {
        let lexed = match TokenStream::from_str(text) {
            Ok(t) => t,
            Err(e) => {
                failures.push(format!("{text}\n  does not lex: {e}"));
                continue;
            }
        };
        match spec(lexed) {
            Ok(_) => failures.push(format!("{text}\n  was accepted; expected: {expect}")),
            Err(e) if !e.to_string().contains(expect) => {
                failures.push(format!("{text}\n  said: {e}\n  expected: {expect}"));
            }
            Err(_) => {}
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A small deterministic PRNG (splitmix64) so the fuzz run is reproducible.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Run `expand` on `text`, reporting the input if it panics.
fn expand_survives(text: &str) {
    let Ok(input) = TokenStream::from_str(text) else {
        return;
    };
    let result = std::panic::catch_unwind(|| expand(input));
    match result {
        Err(_) => panic!("expand panicked on: {text}"),
        Ok(out) => {
            assert!(!out.is_empty(), "empty expansion for: {text}");
            if !out.to_string().contains("compile_error") {
                assert!(
                    syn::parse2::<syn::Expr>(out).is_ok(),
                    "accepted input gave a non-expression: {text}"
                );
            }
        }
    }
}

#[test]
fn fuzz_mutations_and_random_streams_never_panic() {
    let words_of = |text: &str| -> Vec<String> {
        tokens(text)
            .to_string()
            .split_whitespace()
            .map(String::from)
            .collect()
    };
    let mut vocabulary: Vec<String> = EXAMPLES.iter().flat_map(|t| words_of(t)).collect();
    vocabulary.extend(
        [
            "0",
            "-1",
            "99999999999",
            "1e400",
            "g0",
            "g3",
            "1.5",
            "\"x\"",
            "\"\"",
            "::",
            "#",
            "dyn",
            "async",
            "{",
            "}",
            "(",
            ")",
            "[",
            "]",
            ",",
            ";",
            ":",
            "=",
            "/",
            "*",
            "-",
            "'a",
            "b'c'",
            "prefill",
            "online",
            "relu",
            "silu",
            "cache",
            "row",
            "i8sym",
            "e0m4",
            "bf16",
            "8u8",
        ]
        .map(String::from),
    );
    vocabulary.sort();
    vocabulary.dedup();
    let mut rng = Rng(0x7E55_E4A0);
    for example in EXAMPLES {
        let base = words_of(example);
        for _ in 0..600 {
            let mut words = base.clone();
            for _ in 0..=rng.below(4) {
                let i = rng.below(words.len());
                match rng.below(5) {
                    0 if !words.is_empty() => {
                        words.remove(i);
                    }
                    1 if i < words.len() => {
                        let w = words[i].clone();
                        words.insert(i, w);
                    }
                    2 => {
                        let j = rng.below(words.len());
                        if i < words.len() && j < words.len() {
                            words.swap(i, j);
                        }
                    }
                    3 => {
                        let w = vocabulary[rng.below(vocabulary.len())].clone();
                        words.insert(i.min(words.len()), w);
                    }
                    _ if i < words.len() => {
                        words[i] = vocabulary[rng.below(vocabulary.len())].clone();
                    }
                    _ => {}
                }
            }
            expand_survives(&words.join(" "));
        }
    }
    for _ in 0..1000 {
        let len = rng.below(40);
        let words: Vec<&str> = (0..len)
            .map(|_| vocabulary[rng.below(vocabulary.len())].as_str())
            .collect();
        expand_survives(&words.join(" "));
    }
}
