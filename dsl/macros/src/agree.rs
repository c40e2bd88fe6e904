//! Differential test: the macro's compile-time checks against
//! `tessera_dsl::verify`, the one definition of a valid kernel.
//!
//! Each case is a small set of parameters (formats, roles, epilogue, extents,
//! layouts, schedule) rendered twice: as `kernel!` text and as the IR built
//! by hand. The macro must accept the text exactly when `verify()` accepts
//! the IR, and then produce that IR. Parameters sweep every format through
//! every operand slot, every role, and the op-specific rules.

use crate::check::{self, OpSpec, Spec};
use crate::expand::spec;
use crate::parse;
use proc_macro2::TokenStream;
use std::str::FromStr;
use tessera_dsl::ir::{self, Format, Role};
use tessera_dsl::verify;

/// A checked spec as the IR kernel its expansion builds (mirrors `emit`).
fn to_ir(s: &Spec) -> ir::Kernel {
    let format = |f: crate::format::Format| {
        Format::from_str(&f.spelling()).unwrap_or_else(|e| panic!("{}: {e}", f.spelling()))
    };
    let role = |r: parse::Role| match r {
        parse::Role::Input => Role::Input,
        parse::Role::Weight => Role::Weight,
        parse::Role::Output => Role::Output,
        parse::Role::Cache => Role::Cache,
    };
    let layout_dim = |d: &check::LayoutDim| match d {
        check::LayoutDim::Whole(a) => ir::LayoutDim::whole(a),
        check::LayoutDim::Outer { axis, tile } => ir::LayoutDim::outer(axis, tile),
        check::LayoutDim::Inner { tile } => ir::LayoutDim::inner(tile),
    };
    let op = match &s.op {
        OpSpec::Matmul(m) => ir::Op::Matmul(ir::Matmul {
            x: m.x.clone(),
            w: m.w.clone(),
            y: m.y.clone(),
            e: m.e.clone(),
            h: m.h.clone(),
            l: m.l.clone(),
            epilogue: ir::Epilogue {
                scale: m.scale,
                zero_point: m.zero_point,
                bias: m.bias.clone(),
                activation: match m.activation {
                    check::Activation::None => ir::Activation::None,
                    check::Activation::Relu => ir::Activation::Relu,
                    check::Activation::Silu => ir::Activation::Silu,
                },
            },
        }),
        OpSpec::Attention(a) => ir::Op::Attention(ir::Attention {
            kind: match a.kind {
                parse::AttentionKind::Decode => ir::AttentionKind::Decode,
                parse::AttentionKind::Prefill => ir::AttentionKind::Prefill,
            },
            q: a.q.clone(),
            k: a.k.clone(),
            v: a.v.clone(),
            o: a.o.clone(),
            tokens: a.tokens.clone(),
            heads: a.heads.clone(),
            kv_heads: a.kv_heads.clone(),
            head_dim: a.head_dim.clone(),
            seq: a.seq.clone(),
            q_prescaled: a.q_prescaled,
            softmax: match a.softmax {
                parse::SoftmaxMode::Online => ir::SoftmaxMode::Online,
                parse::SoftmaxMode::Async { phi, lo, hi } => ir::SoftmaxMode::Async { phi, lo, hi },
            },
        }),
    };
    ir::Kernel {
        name: s.name.clone(),
        axes: s
            .axes
            .iter()
            .map(|a| ir::Axis {
                name: a.name.clone(),
                extent: a.fixed.map_or(ir::Extent::Dyn, ir::Extent::Fixed),
                kind: if a.reduce {
                    ir::AxisKind::Reduce
                } else {
                    ir::AxisKind::Spatial
                },
            })
            .collect(),
        tensors: s
            .tensors
            .iter()
            .map(|t| ir::Tensor {
                name: t.name.clone(),
                role: role(t.role),
                dims: t.dims.clone(),
                format: format(t.format),
                layout: match &t.layout {
                    Some(dims) => ir::Layout {
                        dims: dims.iter().map(layout_dim).collect(),
                        int4_pair_transpose: t.pair_transpose,
                        int4_signed_codes: t.signed_codes,
                    },
                    None => ir::Layout {
                        int4_pair_transpose: t.pair_transpose,
                        int4_signed_codes: t.signed_codes,
                        ..ir::Layout::row_major(&t.dims)
                    },
                },
            })
            .collect(),
        op,
        schedule: ir::Schedule {
            tiles: s
                .tiles
                .iter()
                .map(|t| ir::TileVar {
                    name: t.name.clone(),
                    axis: t.axis.clone(),
                    size: t.fixed.map_or(ir::TileSize::Solve, ir::TileSize::Fixed),
                })
                .collect(),
            parallel: s.parallel.clone(),
            split: s.split.clone(),
        },
    }
}

fn keyword(role: Role) -> &'static str {
    match role {
        Role::Input => "input",
        Role::Weight => "weight",
        Role::Output => "output",
        Role::Cache => "cache",
    }
}

const ROLES: [Role; 4] = [Role::Input, Role::Weight, Role::Output, Role::Cache];

/// Every format with several groups, plus the smallest legal group, `g4`.
fn formats() -> Vec<Format> {
    let mut all = Format::examples();
    all.push(Format::U4Asym(ir::Group::Size(4), ir::ParamType::F32));
    all
}

fn axis(name: &str, fixed: Option<u32>, reduce: bool) -> ir::Axis {
    ir::Axis {
        name: name.into(),
        extent: fixed.map_or(ir::Extent::Dyn, ir::Extent::Fixed),
        kind: if reduce {
            ir::AxisKind::Reduce
        } else {
            ir::AxisKind::Spatial
        },
    }
}

fn axis_text(name: &str, fixed: Option<u32>) -> String {
    match fixed {
        Some(n) => format!("{name} = {n}"),
        None => name.into(),
    }
}

/// One operand: role, format, and an optional layout (text, IR).
#[derive(Clone)]
struct Operand {
    role: Role,
    format: Format,
    layout: Option<(&'static str, Vec<ir::LayoutDim>)>,
}

impl Operand {
    fn new(role: Role, format: Format) -> Self {
        Operand {
            role,
            format,
            layout: None,
        }
    }

    fn text(&self, name: &str, dims: &[&str]) -> String {
        let layout = self
            .layout
            .as_ref()
            .map_or(String::new(), |(t, _)| format!(" layout {t}"));
        format!(
            "{name}: {} {} [{}]{layout};",
            keyword(self.role),
            self.format,
            dims.join(", ")
        )
    }

    fn ir(&self, name: &str, dims: &[&str]) -> ir::Tensor {
        ir::Tensor {
            name: name.into(),
            role: self.role,
            dims: dims.iter().map(|d| d.to_string()).collect(),
            format: self.format,
            layout: match &self.layout {
                Some((_, dims)) => ir::Layout {
                    dims: dims.clone(),
                    int4_pair_transpose: false,
                    int4_signed_codes: false,
                },
                None => ir::Layout::row_major(dims),
            },
        }
    }
}

#[derive(Clone)]
struct MatmulCase {
    e: Option<u32>,
    x: Operand,
    w: Operand,
    y: Operand,
    scale: bool,
    zero_point: bool,
    /// Bias role, format and its one dim.
    bias: Option<(Role, Format, &'static str)>,
    parallel: &'static [&'static str],
    split: Option<&'static str>,
}

impl MatmulCase {
    fn base() -> Self {
        MatmulCase {
            e: None,
            x: Operand::new(Role::Input, Format::F32),
            w: Operand::new(Role::Weight, Format::F32),
            y: Operand::new(Role::Output, Format::F32),
            scale: false,
            zero_point: false,
            bias: None,
            parallel: &[],
            split: None,
        }
    }

    /// The same case with the epilogue `verify()` wants for its formats.
    fn fitting(mut self) -> Self {
        self.scale = self.x.format.is_quantized() || self.w.format.is_quantized();
        self.zero_point = self.w.format.is_asymmetric();
        self
    }

    fn text(&self) -> String {
        let mut body = vec![
            self.x.text("x", &["e", "l"]),
            self.w.text("w", &["h", "l"]),
            self.y.text("y", &["e", "h"]),
        ];
        if let Some((role, format, dim)) = self.bias {
            body.push(format!("b: {} {format} [{dim}];", keyword(role)));
        }
        body.push("y[e, h] = sum(l) x[e, l] * w[h, l];".into());
        let mut epilogue = Vec::new();
        if self.scale {
            epilogue.push("scale");
        }
        if self.zero_point {
            epilogue.push("zero_point");
        }
        if self.bias.is_some() {
            epilogue.push("bias(b)");
        }
        if !epilogue.is_empty() {
            body.push(format!("epilogue {};", epilogue.join(", ")));
        }
        schedule_text(&mut body, self.parallel, self.split);
        format!(
            "m({}, h, l) {{ {} }}",
            axis_text("e", self.e),
            body.join(" ")
        )
    }

    fn ir(&self) -> ir::Kernel {
        let mut tensors = vec![
            self.x.ir("x", &["e", "l"]),
            self.w.ir("w", &["h", "l"]),
            self.y.ir("y", &["e", "h"]),
        ];
        if let Some((role, format, dim)) = self.bias {
            tensors.push(Operand::new(role, format).ir("b", &[dim]));
        }
        ir::Kernel {
            name: "m".into(),
            axes: vec![
                axis("e", self.e, false),
                axis("h", None, false),
                axis("l", None, true),
            ],
            tensors,
            op: ir::Op::Matmul(ir::Matmul {
                x: "x".into(),
                w: "w".into(),
                y: "y".into(),
                e: "e".into(),
                h: "h".into(),
                l: "l".into(),
                epilogue: ir::Epilogue {
                    scale: self.scale,
                    zero_point: self.zero_point,
                    bias: self.bias.map(|_| "b".into()),
                    activation: ir::Activation::None,
                },
            }),
            schedule: schedule_ir(self.parallel, self.split),
        }
    }
}

fn schedule_text(body: &mut Vec<String>, parallel: &[&str], split: Option<&str>) {
    if !parallel.is_empty() {
        body.push(format!("parallel {};", parallel.join(", ")));
    }
    if let Some(axis) = split {
        body.push(format!("split {axis};"));
    }
}

fn schedule_ir(parallel: &[&str], split: Option<&str>) -> ir::Schedule {
    let strings = |axes: &[&str]| axes.iter().map(|a| a.to_string()).collect();
    ir::Schedule {
        tiles: Vec::new(),
        parallel: strings(parallel),
        split: split.map(String::from),
    }
}

#[derive(Clone)]
struct AttentionCase {
    t: Option<u32>,
    hq: Option<u32>,
    kvh: Option<u32>,
    /// The KV-heads axis the caches use: `kvh`, or `hq` (which verify rejects).
    kv_axis: &'static str,
    q: Operand,
    k: Operand,
    v: Operand,
    o: Operand,
    /// `v` is the same tensor as `k`.
    v_is_k: bool,
    decode: bool,
    prescaled: bool,
    softmax: Option<(&'static str, ir::SoftmaxMode)>,
    split: Option<&'static str>,
}

impl AttentionCase {
    fn base() -> Self {
        AttentionCase {
            t: Some(1),
            hq: None,
            kvh: None,
            kv_axis: "kvh",
            q: Operand::new(Role::Input, Format::F16),
            k: Operand::new(Role::Cache, Format::F16),
            v: Operand::new(Role::Cache, Format::F16),
            o: Operand::new(Role::Output, Format::F16),
            v_is_k: false,
            decode: true,
            prescaled: false,
            softmax: None,
            split: None,
        }
    }

    fn text(&self) -> String {
        let kv = ["s", self.kv_axis, "d"];
        let mut q = self.q.text("q", &["t", "hq", "d"]);
        if self.prescaled {
            q = q.replace(';', " prescaled;");
        }
        let mut body = vec![q, self.k.text("k", &kv)];
        if !self.v_is_k {
            body.push(self.v.text("v", &kv));
        }
        body.push(self.o.text("o", &["t", "hq", "d"]));
        let v = if self.v_is_k { "k" } else { "v" };
        let kind = if self.decode { "decode" } else { "prefill" };
        let kvh = self.kv_axis;
        body.push(format!(
            "o[t, hq, d] = attention(q[t, hq, d], k[s, {kvh}, d], {v}[s, {kvh}, d]) {kind};"
        ));
        if let Some((text, _)) = self.softmax {
            body.push(format!("softmax {text};"));
        }
        schedule_text(&mut body, &[], self.split);
        format!(
            "a({}, {}, {}, d, s) {{ {} }}",
            axis_text("t", self.t),
            axis_text("hq", self.hq),
            axis_text("kvh", self.kvh),
            body.join(" ")
        )
    }

    fn ir(&self) -> ir::Kernel {
        let kv = ["s", self.kv_axis, "d"];
        let mut tensors = vec![self.q.ir("q", &["t", "hq", "d"]), self.k.ir("k", &kv)];
        if !self.v_is_k {
            tensors.push(self.v.ir("v", &kv));
        }
        tensors.push(self.o.ir("o", &["t", "hq", "d"]));
        ir::Kernel {
            name: "a".into(),
            axes: vec![
                axis("t", self.t, false),
                axis("hq", self.hq, false),
                axis("kvh", self.kvh, false),
                axis("d", None, false),
                axis("s", None, true),
            ],
            tensors,
            op: ir::Op::Attention(ir::Attention {
                kind: if self.decode {
                    ir::AttentionKind::Decode
                } else {
                    ir::AttentionKind::Prefill
                },
                q: "q".into(),
                k: "k".into(),
                v: if self.v_is_k { "k" } else { "v" }.into(),
                o: "o".into(),
                tokens: "t".into(),
                heads: "hq".into(),
                kv_heads: self.kv_axis.into(),
                head_dim: "d".into(),
                seq: "s".into(),
                q_prescaled: self.prescaled,
                softmax: self.softmax.map_or(ir::SoftmaxMode::Online, |(_, m)| m),
            }),
            schedule: schedule_ir(&[], self.split),
        }
    }
}

/// Macro verdict vs `verify()` verdict for one case; `None` if they agree.
fn disagreement(text: &str, expected: &ir::Kernel) -> Option<String> {
    let tokens = match TokenStream::from_str(text) {
        Ok(tokens) => tokens,
        Err(e) => return Some(format!("{text}\n  does not lex: {e}")),
    };
    let macro_verdict = spec(tokens).map(|s| to_ir(&s));
    match (macro_verdict, verify(expected)) {
        (Ok(got), Ok(())) if got == *expected => None,
        (Ok(got), Ok(())) => Some(format!(
            "{text}\n  macro built {got:?}\n  expected   {expected:?}"
        )),
        (Err(_), Err(_)) => None,
        (Ok(_), Err(e)) => Some(format!("{text}\n  macro accepts, verify says: {e}")),
        (Err(e), Ok(())) => Some(format!("{text}\n  verify accepts, macro says: {e}")),
    }
}

fn run(cases: impl IntoIterator<Item = (String, ir::Kernel)>) -> usize {
    let mut failures = Vec::new();
    let mut count = 0;
    for (text, kernel) in cases {
        count += 1;
        failures.extend(disagreement(&text, &kernel));
    }
    assert!(
        failures.is_empty(),
        "{} of {count} cases disagree:\n{}",
        failures.len(),
        failures[..failures.len().min(20)].join("\n")
    );
    count
}

#[test]
fn matmul_checks_agree_with_verify() {
    let mut cases: Vec<MatmulCase> = Vec::new();
    let fmts = formats();
    // Every x × w format pair, with every epilogue (scale, zero point).
    for &xf in &fmts {
        for &wf in &fmts {
            for (scale, zero_point) in [(false, false), (true, false), (false, true), (true, true)]
            {
                let mut c = MatmulCase::base();
                c.x.format = xf;
                c.w.format = wf;
                c.scale = scale;
                c.zero_point = zero_point;
                cases.push(c);
            }
        }
    }
    // Every output format; every role in every slot.
    for &f in &fmts {
        let mut c = MatmulCase::base();
        c.y.format = f;
        cases.push(c);
    }
    for role in ROLES {
        for slot in 0..3 {
            let mut c = MatmulCase::base();
            [&mut c.x, &mut c.w, &mut c.y][slot].role = role;
            cases.push(c);
        }
    }
    // Bias: every role and format, right and wrong dim, quantized or not.
    for role in ROLES {
        for &f in &fmts {
            for dim in ["h", "e"] {
                let mut c = MatmulCase::base();
                c.bias = Some((role, f, dim));
                cases.push(c.clone());
                c.x.format = Format::I8Dyn;
                c.w.format = Format::U4Asym(ir::Group::Size(32), ir::ParamType::F32);
                cases.push(c.fitting());
            }
        }
    }
    // Extents and schedules.
    for e in [None, Some(1), Some(7)] {
        let axes: [&'static [&'static str]; 5] = [&[], &["h"], &["l"], &["e", "h"], &["h", "h"]];
        for parallel in axes {
            for split in [None, Some("l"), Some("h")] {
                let mut c = MatmulCase::base();
                c.e = e;
                c.parallel = parallel;
                c.split = split;
                cases.push(c);
            }
        }
    }
    // Layouts of x: row-major, transposed, tiled without a tile (invalid).
    for (text, dims) in [
        (
            "[l, e]",
            vec![ir::LayoutDim::whole("l"), ir::LayoutDim::whole("e")],
        ),
        (
            "[e, l]",
            vec![ir::LayoutDim::whole("e"), ir::LayoutDim::whole("l")],
        ),
        ("[e]", vec![ir::LayoutDim::whole("e")]),
    ] {
        let mut c = MatmulCase::base();
        c.x.layout = Some((text, dims));
        cases.push(c);
    }
    let n = run(cases.iter().map(|c| (c.text(), c.ir())));
    assert!(n > 2000, "{n} cases");
}

#[test]
fn attention_checks_agree_with_verify() {
    let mut cases: Vec<AttentionCase> = Vec::new();
    let fmts = formats();
    for &kf in &fmts {
        for &vf in &fmts {
            let mut c = AttentionCase::base();
            c.k.format = kf;
            c.v.format = vf;
            cases.push(c);
        }
    }
    for &f in &fmts {
        for slot in [0, 3] {
            let mut c = AttentionCase::base();
            [&mut c.q, &mut c.k, &mut c.v, &mut c.o][slot].format = f;
            cases.push(c);
        }
    }
    for role in ROLES {
        for slot in 0..4 {
            let mut c = AttentionCase::base();
            [&mut c.q, &mut c.k, &mut c.v, &mut c.o][slot].role = role;
            cases.push(c);
        }
    }
    for t in [None, Some(1), Some(4)] {
        for hq in [None, Some(8)] {
            for kvh in [None, Some(2), Some(3)] {
                for decode in [true, false] {
                    for kv_axis in ["kvh", "hq"] {
                        let mut c = AttentionCase::base();
                        (c.t, c.hq, c.kvh, c.decode, c.kv_axis) = (t, hq, kvh, decode, kv_axis);
                        cases.push(c);
                    }
                }
            }
        }
    }
    let layouts = || {
        use ir::LayoutDim as D;
        [
            None,
            Some((
                "[s, kvh, d]",
                vec![D::whole("s"), D::whole("kvh"), D::whole("d")],
            )),
            Some((
                "[s, d, kvh]",
                vec![D::whole("s"), D::whole("d"), D::whole("kvh")],
            )),
            Some((
                "[kvh, s, d]",
                vec![D::whole("kvh"), D::whole("s"), D::whole("d")],
            )),
        ]
    };
    for kl in layouts() {
        for vl in layouts() {
            let mut c = AttentionCase::base();
            c.k.layout = kl.clone();
            c.v.layout = vl;
            cases.push(c);
        }
    }
    let softmaxes = [
        None,
        Some(("online", ir::SoftmaxMode::Online)),
        Some((
            "async(phi = 0.0, lo = -16.8, hi = 6.5)",
            ir::SoftmaxMode::Async {
                phi: 0.0,
                lo: -16.8,
                hi: 6.5,
            },
        )),
    ];
    for softmax in softmaxes {
        for prescaled in [false, true] {
            for split in [None, Some("s"), Some("d")] {
                for v_is_k in [false, true] {
                    let mut c = AttentionCase::base();
                    (c.softmax, c.prescaled, c.split, c.v_is_k) =
                        (softmax, prescaled, split, v_is_k);
                    cases.push(c);
                }
            }
        }
    }
    let n = run(cases.iter().map(|c| (c.text(), c.ir())));
    assert!(n > 500, "{n} cases");
}
