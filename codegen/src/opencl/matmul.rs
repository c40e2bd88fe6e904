//! OpenCL C for the three matmul loop structures of a [`MatmulPlan`]: the
//! GEMV (buffer or image weights, lanes reduced in local memory) and the
//! local-memory tiled flat GEMM / GEMM with a double-buffered K pipeline.

use tessera_dsl::{Activation, Format, Group, ParamType};

use super::dialect::{Dialect, Precision, Writer, float_lit};
use crate::gpu::{
    ArgKind, Dequant, GemvPlan, KernelArg, MatmulPlan, MatmulShape, TiledPlan, WeightMemory,
    WeightPlan,
};

/// The whole program text for one matmul instance.
pub fn print(plan: &MatmulPlan, dl: &Dialect, pr: &Precision, header: &str) -> String {
    let mut w = Writer::new();
    for line in header.lines() {
        w.line(format!("// {line}"));
    }
    w.blank();
    if let Some(p) = pr.pragma {
        w.line(p);
        w.blank();
    }
    if plan.memory == WeightMemory::Image {
        w.line(dl.sampler);
        w.blank();
    }
    helpers(&mut w, plan, dl, pr);
    match plan.shape {
        MatmulShape::Gemv(g) => gemv(&mut w, plan, &g, dl, pr),
        MatmulShape::Tiled(t) => tiled(&mut w, plan, &t, dl, pr),
    }
    w.finish()
}

/// The C parameter list for `args`.
pub fn params(args: &[KernelArg], dl: &Dialect) -> String {
    args.iter()
        .map(|a| {
            let (g, r) = (dl.global, dl.restrict);
            match a.kind {
                ArgKind::HalfIn => format!("{g} const half* {r} {}", a.name),
                ArgKind::HalfOut => format!("{g} half* {r} {}", a.name),
                ArgKind::FloatIn => format!("{g} const float* {r} {}", a.name),
                ArgKind::FloatOut => format!("{g} float* {r} {}", a.name),
                ArgKind::BytesIn => format!("{g} const uchar* {r} {}", a.name),
                ArgKind::ChunksIn => format!("{g} const uint4* {r} {}", a.name),
                ArgKind::ImageIn => format!("{} {}", dl.image_ro, a.name),
                ArgKind::IntOut => format!("{g} int* {r} {}", a.name),
                ArgKind::Int => format!("const int {}", a.name),
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// `load_x4` (guarded activation quad), `sum4`, and the dequantizer of one
/// quad of codes.
fn helpers(w: &mut Writer, plan: &MatmulPlan, dl: &Dialect, pr: &Precision) {
    let (t, t4) = (pr.t, pr.t4);
    w.line("// Four activations from i (zero past n): one vector load when whole.");
    w.open(format!(
        "{} {t4} load_x4({} const half* {} row, const int i, const int n)",
        dl.inline, dl.global, dl.restrict
    ));
    w.line(format!(
        "if (i + 4 <= n) return {};",
        pr.load_half4("row + i")
    ));
    w.line(format!("{t4} r = ({t4})({});", pr.lit(0.0)));
    for (k, lane) in ["s0", "s1", "s2", "s3"].iter().enumerate() {
        w.line(format!(
            "if (i + {k} < n) r.{lane} = {};",
            pr.load_half(&format!("i + {k}"), "row")
        ));
    }
    w.line("return r;");
    w.close("");
    w.blank();
    w.open(format!("{} float sum4(const {t4} v)", dl.inline));
    w.line(format!("const float4 f = {};", pr.to_float4("v")));
    w.line("return (f.s0 + f.s1) + (f.s2 + f.s3);");
    w.close("");
    w.blank();
    match plan.weights.dequant {
        Dequant::None => {}
        Dequant::MagicOr {
            half_magic,
            float_magic,
            half_sub,
            float_sub,
        } => {
            w.line("// Four 4-bit codes (bits 0..16 of b): OR under an exponent whose ulp is 1,");
            w.line("// then subtract the exponent's value (exact).");
            w.open(format!("{} {t4} dequant4(const uint b)", dl.inline));
            w.line("const uint4 n = (uint4)(b, b >> 4, b >> 8, b >> 12) & (uint4)(0xFu);");
            if pr.native() {
                w.line(format!(
                    "return as_half4(convert_ushort4(n) | (ushort4)({half_magic:#06x})) - (half4)({});",
                    pr.lit(half_sub)
                ));
            } else {
                w.line(format!(
                    "return as_float4(n | (uint4)({float_magic:#010x}u)) - (float4)({});",
                    float_lit(float_sub)
                ));
            }
            w.close("");
            w.blank();
        }
        Dequant::ShiftOr {
            half_base,
            half_shift,
            float_base,
            float_shift,
        } => {
            w.line("// Four E0M4 codes (bits 0..16 of b): shift into the fraction, OR the");
            w.line("// exponent of [2, 4) (Transformer-Lite 2.3): v = 2 + q/8.");
            w.open(format!("{} {t4} dequant4(const uint b)", dl.inline));
            w.line("const uint4 n = (uint4)(b, b >> 4, b >> 8, b >> 12) & (uint4)(0xFu);");
            if pr.native() {
                w.line(format!(
                    "return as_half4((convert_ushort4(n) << (ushort4)({half_shift})) | (ushort4)({half_base:#06x}));"
                ));
            } else {
                w.line(format!(
                    "return as_float4((n << (uint4)({float_shift}u)) | (uint4)({float_base:#010x}u));"
                ));
            }
            w.close("");
            w.blank();
        }
        Dequant::SignedByte => {
            w.line("// Four signed 8-bit codes.");
            w.open(format!("{} {t4} dequant4(const uint b)", dl.inline));
            w.line(format!("return convert_{t4}(as_char4(b));"));
            w.close("");
            w.blank();
        }
    }
    let _ = t;
}

/// Expression for quad `q` of a chunk: weights as the arithmetic vector.
/// `words` names the chunk's `uint[4]`, `wv8` the f16 chunk.
fn quad(weights: &WeightPlan, q: u32) -> String {
    match weights.dequant {
        Dequant::None => format!("wv8.{}", if q == 0 { "lo" } else { "hi" }),
        Dequant::SignedByte => format!("dequant4(words[{q}])"),
        _ => {
            let (word, shift) = (q / 2, (q % 2) * 16);
            if shift == 0 {
                format!("dequant4(words[{word}])")
            } else {
                format!("dequant4(words[{word}] >> {shift})")
            }
        }
    }
}

/// The group index of l position `l0`: a literal group length, or 0 per row.
fn group_index(weights: &WeightPlan, l0: &str) -> String {
    match weights.group {
        Some(Group::Size(g)) => format!("({l0}) / {g}"),
        _ => "0".to_string(),
    }
}

fn activation(w: &mut Writer, act: Activation, v: &str) {
    match act {
        Activation::None => {}
        Activation::Relu => w.line(format!("{v} = fmax({v}, 0.0f);")),
        Activation::Silu => w.line(format!("{v} = {v} / (1.0f + exp(-{v}));")),
    }
}

fn store_y(w: &mut Writer, plan: &MatmulPlan, pr: &Precision, v: &str, idx: &str) {
    if plan.y_format == Format::F16 {
        w.line(pr.store_half(v, idx, "y"));
    } else {
        w.line(format!("y[{idx}] = {v};"));
    }
}

/// Loads one 128-bit chunk `c_expr` of row `h_expr`: `words[4]` (codes) or
/// `wv8` (f16).
fn load_chunk(
    w: &mut Writer,
    plan: &MatmulPlan,
    dl: &Dialect,
    pr: &Precision,
    block: &str,
    sub: &str,
    row: &str,
) {
    let cpb = plan.weights.chunks_per_block;
    let index = format!("(({block}) * h + ({row})) * {cpb} + ({sub})");
    match (plan.memory, plan.weights.dequant) {
        (_, Dequant::None) => {
            w.line(format!(
                "const {}8 wv8 = {};",
                pr.t,
                pr.load_half8(&index, "w")
            ));
        }
        (WeightMemory::Image, _) => {
            w.line(format!(
                "const uint4 p = {}(w, weight_sampler, (int2)(({row}) * {cpb} + ({sub}), {block}));",
                dl.read_texel
            ));
            w.line("const uint words[4] = {p.s0, p.s1, p.s2, p.s3};");
        }
        (WeightMemory::Buffer, _) => {
            w.line(format!("const uint4 p = w[{index}];"));
            w.line("const uint words[4] = {p.s0, p.s1, p.s2, p.s3};");
        }
    }
}

fn gemv(w: &mut Writer, plan: &MatmulPlan, g: &GemvPlan, dl: &Dialect, pr: &Precision) {
    let wt = &plan.weights;
    let (epl, lp) = (wt.elems_per_load, wt.lp);
    let t4 = pr.t4;
    w.line(format!(
        "{} __attribute__((reqd_work_group_size({}, {}, 1)))",
        dl.kernel, g.wg_h, g.k_lanes
    ));
    w.open(format!("void {}({})", plan.entry, params(&plan.args, dl)));
    w.line(format!("const int hi = {}(0);", dl.global_id));
    w.line(format!("const int hl = {}(0);", dl.local_id));
    w.line(format!("const int lane = {}(1);", dl.local_id));
    w.line(format!("const int ei = {}(2);", dl.global_id));
    w.line(format!(
        "{} float red[{} * {}];",
        dl.local, g.k_lanes, g.wg_h
    ));
    w.line("float acc = 0.0f;");
    w.open("if (hi < h)");
    w.line(format!(
        "{} const half* {} row = x + ei * l;",
        dl.global, dl.restrict
    ));
    w.line(format!("const int chunks = (l + {}) / {epl};", epl - 1));
    w.line(format!(
        "// Lanes stride over the {epl}-element chunks of l: one 128-bit weight load each."
    ));
    w.open(format!(
        "for (int c = lane; c < chunks; c += {})",
        g.k_lanes
    ));
    w.line(format!("const int l0 = c * {epl};"));
    load_chunk(
        w,
        plan,
        dl,
        pr,
        &format!("c / {}", wt.chunks_per_block),
        &format!("c % {}", wt.chunks_per_block),
        "hi",
    );
    w.line(format!("{t4} dot = ({t4})({});", pr.lit(0.0)));
    if wt.has_offset {
        w.line(format!("{t4} sx = ({t4})({});", pr.lit(0.0)));
    }
    for q in 0..epl / 4 {
        w.line(format!(
            "const {t4} x{q} = load_x4(row, l0 + {}, l);",
            4 * q
        ));
        w.line(format!("dot = mad(x{q}, {}, dot);", quad(wt, q)));
        if wt.has_offset {
            w.line(format!("sx += x{q};"));
        }
    }
    if wt.has_scale {
        w.line(format!(
            "const int gi = {} * h + hi;",
            group_index(wt, "l0")
        ));
        if wt.has_offset {
            // Through Σx, infinities cancel against each other (inf − inf);
            // where Σx is not finite (an infinite or NaN activation) the
            // chunk forms x·w element by element, w = scale·v + offset
            // unfused, as the interpreter does.
            w.line("const float sxs = sum4(sx);");
            w.open("if (isfinite(sxs))");
            w.line(format!(
                "acc += {} * sum4(dot) + {} * sxs;",
                param(wt, "scales", "gi"),
                param(wt, "offsets", "gi")
            ));
            w.middle("} else {");
            w.line("#pragma OPENCL FP_CONTRACT OFF");
            w.line(format!(
                "const float ws = {}, wo = {};",
                param(wt, "scales", "gi"),
                param(wt, "offsets", "gi")
            ));
            for q in 0..epl / 4 {
                w.line(format!(
                    "const float4 xw{q} = convert_float4(x{q}) * (ws * convert_float4({}) + wo);",
                    quad(wt, q)
                ));
                w.line(format!("acc += xw{q}.x + xw{q}.y + xw{q}.z + xw{q}.w;"));
            }
            w.close("");
        } else {
            w.line(format!("acc += {} * sum4(dot);", param(wt, "scales", "gi")));
        }
    } else {
        w.line("acc += sum4(dot);");
    }
    w.close("");
    w.close("");
    w.line(format!("red[lane * {} + hl] = acc;", g.wg_h));
    w.line(dl.local_barrier);
    w.open("if (lane == 0 && hi < h)");
    w.line("float v = 0.0f;");
    w.line(format!(
        "for (int k = 0; k < {}; ++k) v += red[k * {} + hl];",
        g.k_lanes, g.wg_h
    ));
    if plan.bias {
        w.line("v += bias[hi];");
    }
    activation(w, plan.activation, "v");
    store_y(w, plan, pr, "v", "ei * h + hi");
    w.close("");
    w.close("");
    let _ = lp;
}

fn tiled(w: &mut Writer, plan: &MatmulPlan, t: &TiledPlan, dl: &Dialect, pr: &Precision) {
    let wt = &plan.weights;
    let (epl, lp, cpb) = (wt.elems_per_load, wt.lp, wt.chunks_per_block);
    let (ks, te, th, threads, stages) = (t.k_slice, t.tile_e, t.tile_h, t.threads(), t.stages);
    let cps = ks / epl;
    let (g, r, loc) = (dl.global, dl.restrict, dl.local);
    let t4 = pr.t4;

    // The stage loader, shared by the prologue and the pipelined loop.
    let mut extra = Vec::new();
    let pt = match wt.params {
        ParamType::F32 => "float",
        ParamType::F16 => "half",
    };
    if wt.has_scale {
        extra.push(format!(", {g} const {pt}* {r} scales"));
    }
    if wt.has_offset {
        extra.push(format!(", {g} const {pt}* {r} offsets"));
    }
    let w_param = if wt.dequant == Dequant::None {
        format!("{g} const half* {r} w")
    } else {
        format!("{g} const uint4* {r} w")
    };
    w.line(format!(
        "// One K slice of {ks} into local stage buffers: x as [{ks}][{te}], weights dequantized as [{ks}][{th}] halves."
    ));
    w.open(format!(
        "{} void load_stage({loc} half* xs, {loc} half* ws, {g} const half* {r} x, {w_param}{}, const int e, const int h, const int l, const int e0, const int h0, const int k0, const int lid)",
        dl.inline,
        extra.join("")
    ));
    w.open(format!(
        "for (int i = lid; i < {}; i += {threads})",
        te * ks
    ));
    w.line(format!("const int rr = i / {ks}, k = i % {ks};"));
    w.line("const int ge = e0 + rr, gl = k0 + k;");
    w.line(format!(
        "const float v = (ge < e && gl < l) ? {} : 0.0f;",
        pr.load_half_f32("ge * l + gl", "x")
    ));
    w.line(pr.store_half("v", &format!("k * {te} + rr"), "xs"));
    w.close("");
    w.line("// Consecutive work items take consecutive h: the 128-bit loads coalesce.");
    w.open(format!(
        "for (int i = lid; i < {}; i += {threads})",
        th * cps
    ));
    w.line(format!("const int hr = i % {th}, sub = i / {th};"));
    w.line(format!("const int gh = h0 + hr, gl0 = k0 + sub * {epl};"));
    w.open("if (gh < h && gl0 < l)");
    load_chunk(
        w,
        plan,
        dl,
        pr,
        &format!("gl0 / {lp}"),
        &format!("(gl0 % {lp}) / {epl}"),
        "gh",
    );
    if wt.has_scale {
        w.line(format!(
            "const int gi = {} * h + gh;",
            group_index(wt, "gl0")
        ));
        w.line(format!(
            "const {} sc = ({}) {};",
            pr.t,
            pr.t,
            param(wt, "scales", "gi")
        ));
        if wt.has_offset {
            w.line(format!(
                "const {} of = ({}) {};",
                pr.t,
                pr.t,
                param(wt, "offsets", "gi")
            ));
        }
    }
    for q in 0..epl / 4 {
        let mut v = quad(wt, q);
        if wt.has_scale {
            v = if wt.has_offset {
                format!("mad({v}, ({t4})(sc), ({t4})(of))")
            } else {
                format!("{v} * sc")
            };
        }
        w.line(format!("const float4 v{q} = {};", pr.to_float4(&v)));
        for (i, lane) in ["s0", "s1", "s2", "s3"].iter().enumerate() {
            w.line(pr.store_half(
                &format!("v{q}.{lane}"),
                &format!("(sub * {epl} + {}) * {th} + hr", 4 * q + i as u32),
                "ws",
            ));
        }
    }
    w.middle("} else {");
    w.line(format!(
        "for (int k = 0; k < {epl}; ++k) {}",
        pr.store_half("0.0f", &format!("(sub * {epl} + k) * {th} + hr"), "ws")
    ));
    w.close("");
    w.close("");
    w.close("");
    w.blank();

    let _ = cpb;
    w.line(format!(
        "{} __attribute__((reqd_work_group_size({threads}, 1, 1)))",
        dl.kernel
    ));
    w.open(format!("void {}({})", plan.entry, params(&plan.args, dl)));
    w.line("// Stage buffers hold halves; declared as ushort since half arrays need cl_khr_fp16.");
    w.line(format!("{loc} ushort xs_bits[{}];", stages * ks * te));
    w.line(format!("{loc} ushort ws_bits[{}];", stages * ks * th));
    w.line(format!("{loc} half* xs = ({loc} half*)xs_bits;"));
    w.line(format!("{loc} half* ws = ({loc} half*)ws_bits;"));
    w.line(format!("const int lid = {}(0);", dl.local_id));
    w.line(format!(
        "const int te = lid / {}, th = lid % {};",
        t.units_h, t.units_h
    ));
    w.line(format!("const int h0 = {}(0) * {th};", dl.group_id));
    w.line(format!("const int e0 = {}(1) * {te};", dl.group_id));
    w.line(format!("float acc[{}][{}];", t.ep, t.hp));
    w.line(dl.unroll);
    w.line(format!(
        "for (int i = 0; i < {}; ++i) for (int j = 0; j < {}; ++j) acc[i][j] = 0.0f;",
        t.ep, t.hp
    ));
    w.line(format!("const int nk = (l + {}) / {ks};", ks - 1));
    let mut call_args = vec!["x".to_string(), "w".to_string()];
    if wt.has_scale {
        call_args.push("scales".into());
    }
    if wt.has_offset {
        call_args.push("offsets".into());
    }
    let call = |stage: &str, k0: &str| {
        format!(
            "load_stage(xs + ({stage}) * {}, ws + ({stage}) * {}, {}, e, h, l, e0, h0, {k0}, lid);",
            ks * te,
            ks * th,
            call_args.join(", ")
        )
    };
    w.line(format!(
        "// Prologue: fill {} of the {stages} stages.",
        stages - 1
    ));
    w.line(format!(
        "for (int s = 0; s < {} && s < nk; ++s) {}",
        stages - 1,
        call("s", &format!("s * {ks}"))
    ));
    w.line(dl.local_barrier);
    w.open("for (int kt = 0; kt < nk; ++kt)");
    w.line("// Load the slice stages-1 ahead while this one computes (double buffering).");
    w.line(format!("const int pre = kt + {};", stages - 1));
    w.line(format!(
        "if (pre < nk) {}",
        call(&format!("pre % {stages}"), &format!("pre * {ks}"))
    ));
    w.line(format!(
        "{loc} const half* xc = xs + (kt % {stages}) * {};",
        ks * te
    ));
    w.line(format!(
        "{loc} const half* wc = ws + (kt % {stages}) * {};",
        ks * th
    ));
    w.open(format!("for (int k = 0; k < {ks}; ++k)"));
    w.line(format!("{} a[{}], b[{}];", pr.t, t.ep, t.hp));
    w.line(dl.unroll);
    w.line(format!(
        "for (int i = 0; i < {}; ++i) a[i] = {};",
        t.ep,
        pr.load_half(&format!("k * {te} + te + i * {}", t.units_e), "xc")
    ));
    w.line(dl.unroll);
    w.line(format!(
        "for (int j = 0; j < {}; ++j) b[j] = {};",
        t.hp,
        pr.load_half(&format!("k * {th} + th + j * {}", t.units_h), "wc")
    ));
    w.line(dl.unroll);
    let mac = if pr.native() {
        "acc[i][j] += (float)(a[i] * b[j]);"
    } else {
        "acc[i][j] = mad(a[i], b[j], acc[i][j]);"
    };
    w.line(format!(
        "for (int i = 0; i < {}; ++i) for (int j = 0; j < {}; ++j) {mac}",
        t.ep, t.hp
    ));
    w.close("");
    w.line(dl.local_barrier);
    w.close("");
    w.open(format!("for (int i = 0; i < {}; ++i)", t.ep));
    w.line(format!("const int ge = e0 + te + i * {};", t.units_e));
    w.open(format!("for (int j = 0; j < {}; ++j)", t.hp));
    w.line(format!("const int gh = h0 + th + j * {};", t.units_h));
    w.line("if (ge >= e || gh >= h) continue;");
    w.line("float v = acc[i][j];");
    if plan.bias {
        w.line("v += bias[gh];");
    }
    activation(w, plan.activation, "v");
    store_y(w, plan, pr, "v", "ge * h + gh");
    w.close("");
    w.close("");
    w.close("");
}

/// Group parameter `idx` of the `name` buffer as a float: f16 parameters
/// are read with `vload_half`, which needs no half arithmetic.
fn param(wt: &WeightPlan, name: &str, idx: &str) -> String {
    match wt.params {
        ParamType::F32 => format!("{name}[{idx}]"),
        ParamType::F16 => format!("vload_half({idx}, {name})"),
    }
}
