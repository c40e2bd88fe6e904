//! OpenCL C for decode attention (an [`AttentionPlan`]): the split-K
//! partial kernel with FlashDecoding++'s unified-max softmax and its
//! recompute path, and the combine kernel; and for causal prefill (a
//! [`PrefillPlan`]): one flash kernel. Softmax, scores and sums are
//! fp32 (MNN-LLM 5.3); the precision mode only changes how halves load.

use super::dialect::{Dialect, Precision, Writer, float_lit};
use super::matmul::params;
use crate::gpu::{AttentionPlan, KvFormat, PrefillPlan};

/// The whole program text: both kernels.
pub fn print(plan: &AttentionPlan, dl: &Dialect, pr: &Precision, header: &str) -> String {
    let mut w = preamble(header, pr);
    fp8_decoders(&mut w, plan.k, plan.v, dl);
    partial(&mut w, plan, dl, pr);
    w.blank();
    combine(&mut w, plan, dl, pr);
    w.finish()
}

/// A program's header comment and its precision pragma.
fn preamble(header: &str, pr: &Precision) -> Writer {
    let mut w = Writer::new();
    for line in header.lines() {
        w.line(format!("// {line}"));
    }
    w.blank();
    if let Some(p) = pr.pragma {
        w.line(p);
        w.blank();
    }
    w
}

/// The fp8 decoders the cache formats `k`, `v` need.
fn fp8_decoders(w: &mut Writer, k: KvFormat, v: KvFormat, dl: &Dialect) {
    if [k, v].contains(&KvFormat::Fp8E4M3) {
        w.line("// fp8 e4m3 (OCP, finite) to float with bit operations.");
        w.open(format!(
            "{} float fp8e4m3_to_float(const uchar b)",
            dl.inline
        ));
        w.line("const uint e = (b >> 3) & 0xFu, m = b & 0x7u;");
        w.line("if (e == 0xFu && m == 0x7u) return NAN;");
        w.line("const float sub = (float)m * 0.001953125f;");
        w.line("if (e == 0u) return (b & 0x80u) ? -sub : sub;");
        w.line("return as_float(((uint)(b & 0x80u) << 24) | ((e + 120u) << 23) | (m << 20));");
        w.close("");
        w.blank();
    }
    if [k, v].contains(&KvFormat::Fp8E5M2) {
        w.line("// fp8 e5m2 (the top byte of a half) to float with bit operations.");
        w.open(format!(
            "{} float fp8e5m2_to_float(const uchar b)",
            dl.inline
        ));
        w.line("const uint e = (b >> 2) & 0x1Fu, m = b & 0x3u;");
        w.line("const uint s = (uint)(b & 0x80u) << 24;");
        w.line("if (e == 0x1Fu) return as_float(s | 0x7F800000u | (m << 21));");
        w.line("if (e == 0u) return as_float(s | as_uint((float)m * 0.0000152587890625f));");
        w.line("return as_float(s | ((e + 112u) << 23) | (m << 21));");
        w.close("");
        w.blank();
    }
}

fn load_kv(format: KvFormat, pr: &Precision, idx: &str, ptr: &str) -> String {
    match format {
        KvFormat::F16 => pr.load_half_f32(idx, ptr),
        KvFormat::I8AsymRow => format!("(float)as_char({ptr}[{idx}])"),
        KvFormat::Fp8E4M3 => format!("fp8e4m3_to_float({ptr}[{idx}])"),
        KvFormat::Fp8E5M2 => format!("fp8e5m2_to_float({ptr}[{idx}])"),
    }
}

fn partial(w: &mut Writer, plan: &AttentionPlan, dl: &Dialect, pr: &Precision) {
    let (wg, kps) = (plan.wg, plan.keys_per_split);
    let loc = dl.local;
    w.line(format!(
        "{} __attribute__((reqd_work_group_size({wg}, 1, 1)))",
        dl.kernel
    ));
    w.open(format!(
        "void {}({})",
        plan.partial_entry,
        params(&plan.partial_args, dl)
    ));
    w.line(format!("const int split = {}(0);", dl.group_id));
    w.line(format!("const int g = {}(1);", dl.group_id));
    w.line(format!("const int lid = {}(0);", dl.local_id));
    w.line(format!("const int s0 = split * {kps};"));
    w.line(format!("const int n = min({kps}, s - s0);"));
    w.line("const int group = hq / kvh;");
    w.line(format!("{loc} float p[{kps}];"));
    w.line(format!("{loc} float red_max[{wg}];"));
    w.line(format!("{loc} int red_out[{wg}];"));
    w.line("// Every query head of this KV head's GQA group, one after another.");
    w.open("for (int hh = 0; hh < group; ++hh)");
    w.line("const int head = g * group + hh;");
    w.line(format!(
        "{} const half* {} qr = q + head * d;",
        dl.global, dl.restrict
    ));
    if plan.k == KvFormat::I8AsymRow {
        w.line("float qsum = 0.0f;");
        w.line(format!(
            "for (int j = 0; j < d; ++j) qsum += {};",
            pr.load_half_f32("j", "qr")
        ));
    }
    w.line("float mx = -INFINITY;");
    w.line("int out = 0;");
    w.open(format!("for (int i = lid; i < n; i += {wg})"));
    w.line("const int row = (s0 + i) * kvh + g;");
    w.line("float x = 0.0f;");
    w.line(format!(
        "for (int j = 0; j < d; ++j) x = fma({}, {}, x);",
        pr.load_half_f32("j", "qr"),
        load_kv(plan.k, pr, "row * d + j", "k")
    ));
    if plan.k == KvFormat::I8AsymRow {
        w.line("x = k_scales[row] * x + k_offsets[row] * qsum;");
    }
    if !plan.q_prescaled {
        w.line("x *= rsqrt((float)d);");
    }
    w.line("p[i] = x;");
    w.line(format!(
        "const float shifted = x - {};",
        float_lit(plan.phi)
    ));
    w.line("// Outside [lo, hi] (or NaN): the unified max is unsafe for this split.");
    w.line(format!(
        "out |= !(shifted >= {} && shifted <= {});",
        float_lit(plan.lo),
        float_lit(plan.hi)
    ));
    w.line("mx = fmax(mx, x);");
    w.close("");
    w.line("red_max[lid] = mx;");
    w.line("red_out[lid] = out;");
    w.line(dl.local_barrier);
    w.line("float m_split = -INFINITY;");
    w.line("int recompute = 0;");
    w.open(format!("for (int t = 0; t < {wg}; ++t)"));
    w.line("m_split = fmax(m_split, red_max[t]);");
    w.line("recompute |= red_out[t];");
    w.close("");
    w.line("// Async: the unified max phi, no max needed. Recompute: the split's own max.");
    w.line(format!(
        "const float m = recompute ? m_split : {};",
        float_lit(plan.phi)
    ));
    w.line(format!(
        "for (int i = lid; i < n; i += {wg}) p[i] = exp(p[i] - m);"
    ));
    w.line(dl.local_barrier);
    w.line("float lsum = 0.0f;");
    w.line("for (int i = 0; i < n; ++i) lsum += p[i];");
    w.line("const int part = split * hq + head;");
    w.open(format!("for (int j = lid; j < d; j += {wg})"));
    w.line("float o = 0.0f;");
    w.line(format!(
        "for (int i = 0; i < n; ++i) o = fma(p[i], {}, o);",
        load_kv(plan.v, pr, "((s0 + i) * kvh + g) * d + j", "v")
    ));
    w.line("part_o[part * d + j] = o;");
    w.close("");
    w.open("if (lid == 0)");
    w.line("part_m[part] = m;");
    w.line("part_l[part] = lsum;");
    w.line("recomputed[part] = recompute;");
    w.close("");
    w.line("// p and the reductions are reused by the next head.");
    w.line(dl.local_barrier);
    w.close("");
    w.close("");
}

fn combine(w: &mut Writer, plan: &AttentionPlan, dl: &Dialect, pr: &Precision) {
    w.line("// o = sum_j e^(m_j - M) o_j / sum_j e^(m_j - M) l_j; every factor is 1 when all");
    w.line("// splits used the unified max.");
    w.line(dl.kernel);
    w.open(format!(
        "void {}({})",
        plan.combine_entry,
        params(&plan.combine_args, dl)
    ));
    w.line(format!("const int j = {}(0);", dl.global_id));
    w.line(format!("const int head = {}(1);", dl.global_id));
    w.line("if (j >= d || head >= hq) return;");
    w.line("float big = -INFINITY;");
    w.line("for (int t = 0; t < splits; ++t) big = fmax(big, part_m[t * hq + head]);");
    w.line("float den = 0.0f, num = 0.0f;");
    w.open("for (int t = 0; t < splits; ++t)");
    w.line("const int part = t * hq + head;");
    w.line("const float f = exp(part_m[part] - big);");
    w.line("den = fma(f, part_l[part], den);");
    w.line("num = fma(f, part_o[part * d + j], num);");
    w.close("");
    w.line(pr.store_half("num / den", "head * d + j", "o"));
    w.close("");
}

/// The causal prefill program ([`PrefillPlan`]): one kernel, the head dim
/// a constant. Softmax, scores and sums are fp32 (MNN-LLM 5.3).
pub fn print_prefill(plan: &PrefillPlan, dl: &Dialect, pr: &Precision, header: &str) -> String {
    let mut w = preamble(header, pr);
    fp8_decoders(&mut w, plan.k, plan.v, dl);
    let (hd, br, bc) = (plan.d, plan.rows, plan.keys);
    let loc = dl.local;
    w.line(format!(
        "{} __attribute__((reqd_work_group_size({br}, 1, 1)))",
        dl.kernel
    ));
    w.open(format!("void {}({})", plan.entry, params(&plan.args, dl)));
    w.line(format!("const int kv = {}(1);", dl.group_id));
    w.line(format!("const int lid = {}(0);", dl.local_id));
    w.line("const int group = hq / kvh;");
    w.line("const int rows = t * group;");
    w.line(format!("const int r0 = {}(0) * {br};", dl.group_id));
    w.line("// Rows past the end compute the last row again and store nothing.");
    w.line("const int live = r0 + lid < rows;");
    w.line("const int r = live ? r0 + lid : rows - 1;");
    w.line("const int token = r / group;");
    w.line("const int head = kv * group + r % group;");
    w.line("// The last key this row sees; the work group's last row sees the most.");
    w.line("const int lim = s - t + token;");
    w.line(format!(
        "const int kend = s - t + (min(r0 + {br}, rows) - 1) / group + 1;"
    ));
    w.line(format!("{loc} float ks[{}];", bc * hd));
    w.line(format!("{loc} float vs[{}];", bc * hd));
    w.line(format!("float qr[{hd}], acc[{hd}], sc[{bc}];"));
    w.line(format!("const int qo = (token * hq + head) * {hd};"));
    let scale = if plan.q_prescaled {
        String::new()
    } else {
        format!(" * {}", float_lit(1.0 / (hd as f32).sqrt()))
    };
    w.open(format!("for (int c = 0; c < {hd}; ++c)"));
    w.line(format!(
        "qr[c] = {}{scale};",
        pr.load_half_f32("qo + c", "q")
    ));
    w.line("acc[c] = 0.0f;");
    w.close("");
    w.line("float m = -INFINITY, l = 0.0f;");
    w.open(format!("for (int j0 = 0; j0 < kend; j0 += {bc})"));
    w.line(format!("const int n = min({bc}, kend - j0);"));
    w.line("// The previous block is done with before it is overwritten.");
    w.line(dl.local_barrier);
    w.open(format!("for (int i = lid; i < n * {hd}; i += {br})"));
    w.line(format!("const int row = (j0 + i / {hd}) * kvh + kv;"));
    w.line(format!("const int e = row * {hd} + i % {hd};"));
    let key = load_kv(plan.k, pr, "e", "k");
    if plan.k == KvFormat::I8AsymRow {
        w.line(format!(
            "ks[i] = fma(k_scales[row], {key}, k_offsets[row]);"
        ));
    } else {
        w.line(format!("ks[i] = {key};"));
    }
    w.line(format!("vs[i] = {};", load_kv(plan.v, pr, "e", "v")));
    w.close("");
    w.line(dl.local_barrier);
    w.line("// The keys of this block the row may see (none: the row waits).");
    w.line("const int nv = min(n, lim - j0 + 1);");
    w.open("if (nv > 0)");
    w.line("float bm = -INFINITY;");
    w.open("for (int i = 0; i < nv; ++i)");
    w.line("float x = 0.0f;");
    w.line(format!(
        "for (int c = 0; c < {hd}; ++c) x = fma(qr[c], ks[i * {hd} + c], x);"
    ));
    w.line("sc[i] = x;");
    w.line("bm = fmax(bm, x);");
    w.close("");
    w.line("// m = -inf before the first block: alpha = e^-inf = 0.");
    w.line("const float mn = fmax(m, bm);");
    w.line("const float alpha = exp(m - mn);");
    w.line("l *= alpha;");
    w.line(format!("for (int c = 0; c < {hd}; ++c) acc[c] *= alpha;"));
    w.open("for (int i = 0; i < nv; ++i)");
    w.line("const float p = exp(sc[i] - mn);");
    w.line("l += p;");
    w.line(format!(
        "for (int c = 0; c < {hd}; ++c) acc[c] = fma(p, vs[i * {hd} + c], acc[c]);"
    ));
    w.close("");
    w.line("m = mn;");
    w.close("");
    w.close("");
    w.open("if (live)");
    w.line(format!(
        "for (int c = 0; c < {hd}; ++c) {}",
        pr.store_half("acc[c] / l", "qo + c", "o")
    ));
    w.close("");
    w.close("");
    w.finish()
}
