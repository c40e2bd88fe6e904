//! Results of a run: one record per (implementation, shape, M, threads), the
//! markdown table and the JSON file.

use crate::limits::Limits;
use crate::method::Method;
use crate::shapes::Shape;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// One timed block. External peers print exactly these fields as JSON lines.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    #[serde(rename = "impl")]
    pub impl_name: String,
    pub n: usize,
    pub k: usize,
    pub m: usize,
    pub threads: usize,
    pub median_s: f64,
    pub min_s: f64,
    pub reps: usize,
    pub copies: usize,
    /// Bytes of weights one call reads (see `format::WeightFormat::weight_bytes`).
    pub weight_bytes: u64,
    /// Error of the warm-up call's result (see `impls::relative_error`).
    pub max_rel_err: f64,
    /// Error above which the result counts as wrong; set by the harness.
    #[serde(default)]
    pub tolerance: Option<f64>,
}

impl Record {
    pub fn weight_gbs(&self) -> f64 {
        self.weight_bytes as f64 / self.median_s / 1e9
    }

    pub fn gflops(&self) -> f64 {
        2.0 * (self.m * self.n * self.k) as f64 / self.median_s / 1e9
    }

    pub fn is_wrong(&self) -> bool {
        let tolerance = self.tolerance.unwrap_or(f64::INFINITY);
        self.max_rel_err.is_nan() || self.max_rel_err > tolerance
    }
}

/// A line an external peer prints: a record or a description of itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum PeerLine {
    Info { info: String, detail: String },
    Record(Record),
}

/// Everything one run produced, as written to `--json`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RunReport {
    pub command: String,
    pub cpu: String,
    pub l3_bytes: Option<u64>,
    pub load_before: String,
    pub load_after: String,
    pub method: Option<Method>,
    pub limits: Limits,
    /// The same limits measured again after the last block: a large change
    /// means the machine was busy with something else during the run.
    #[serde(default)]
    pub limits_after: Option<Limits>,
    /// Implementation → description (library version, kernels, buffer type).
    pub info: BTreeMap<String, String>,
    pub shapes: Vec<Shape>,
    pub records: Vec<Record>,
    /// Peers skipped or failed, and why.
    pub notes: Vec<String>,
}

/// How the table is laid out.
#[derive(Debug, Clone)]
pub struct TableSpec {
    /// Column order.
    pub impls: Vec<String>,
    /// Rows with M up to this report weight GB/s, above it GFLOP/s.
    pub gbs_max_m: usize,
    /// Implementation the ratio columns divide by.
    pub baseline: Option<String>,
    /// Implementations with their own "X vs baseline" column.
    pub ratio_impls: Vec<String>,
}

fn fmt_value(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

fn fmt_pct(v: f64, limit: Option<&f64>) -> String {
    match limit {
        Some(l) if *l > 0.0 => format!(" ({:.0}%)", 100.0 * v / l),
        _ => String::new(),
    }
}

impl RunReport {
    fn find(&self, name: &str, shape: &Shape, m: usize, threads: usize) -> Option<&Record> {
        self.records.iter().find(|r| {
            r.impl_name == name
                && r.n == shape.n
                && r.k == shape.k
                && r.m == m
                && r.threads == threads
        })
    }

    /// Thread counts and M values present, in first-seen order.
    fn axes(&self) -> (Vec<usize>, Vec<usize>) {
        let mut threads = Vec::new();
        let mut ms = Vec::new();
        for r in &self.records {
            if !threads.contains(&r.threads) {
                threads.push(r.threads);
            }
            if !ms.contains(&r.m) {
                ms.push(r.m);
            }
        }
        (threads, ms)
    }

    /// The limits table and the results table, in markdown.
    pub fn markdown(&self, spec: &TableSpec) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "Command: `{}`\n", self.command);
        let l3 = self
            .l3_bytes
            .map(|b| format!(", L3 {} MiB", b >> 20))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "CPU: {}{l3}. Load average before: {}; after: {}.",
            self.cpu, self.load_before, self.load_after
        );
        if let Some(m) = &self.method {
            let _ = writeln!(
                out,
                "Method: weights [N, K] row-major, y = x·Wᵀ; copies totalling ≥ {} MiB rotated; median of ≥ {} calls \
                 and ≥ {} s (or ≥ 3 calls once past {} s); {} ms pause between blocks.",
                m.total_bytes >> 20,
                m.min_reps,
                m.min_time_s,
                m.max_time_s,
                m.sleep_ms
            );
        }
        for (name, detail) in &self.info {
            let _ = writeln!(out, "- {name}: {detail}");
        }
        for note in &self.notes {
            let _ = writeln!(out, "- NOTE: {note}");
        }
        out.push('\n');

        let (threads, ms) = self.axes();
        let lim = &self.limits;
        if !lim.read_gbs.is_empty() {
            let _ = write!(out, "| limit |");
            for t in &threads {
                let _ = write!(out, " {t}T |");
            }
            let _ = write!(out, "\n|---|");
            for _ in &threads {
                out.push_str("---|");
            }
            out.push('\n');
            let mut rows: Vec<(String, &BTreeMap<usize, f64>)> = vec![
                ("DRAM read, GEMV-like 8 rows (GB/s)".into(), &lim.read_gbs),
                ("FP32 FMA ymm (GFLOP/s)".into(), &lim.fma_ymm_gflops),
                ("FP32 FMA zmm (GFLOP/s)".into(), &lim.fma_zmm_gflops),
            ];
            if let Some(after) = &self.limits_after {
                rows.push(("DRAM read, end of run (GB/s)".into(), &after.read_gbs));
                rows.push((
                    "FP32 FMA ymm, end of run (GFLOP/s)".into(),
                    &after.fma_ymm_gflops,
                ));
            }
            for (label, map) in rows {
                if map.is_empty() {
                    continue;
                }
                let _ = write!(out, "| {label} |");
                for t in &threads {
                    let _ = write!(
                        out,
                        " {} |",
                        map.get(t)
                            .map(|v| fmt_value(*v))
                            .unwrap_or_else(|| "–".into())
                    );
                }
                out.push('\n');
            }
            out.push('\n');
        }

        let _ = write!(out, "| shape [N, K] | M | T | unit |");
        for name in &spec.impls {
            let _ = write!(out, " {name} |");
        }
        let baseline = spec.baseline.as_deref();
        if let Some(b) = baseline {
            for r in &spec.ratio_impls {
                let _ = write!(out, " {r} vs {b} |");
            }
            let _ = write!(out, " best vs {b} |");
        }
        let _ = write!(out, "\n|---|---|---|---|");
        let extra = spec.impls.len() + baseline.map_or(0, |_| spec.ratio_impls.len() + 1);
        for _ in 0..extra {
            out.push_str("---|");
        }
        out.push('\n');

        for shape in &self.shapes {
            for &t in &threads {
                for &m in &ms {
                    let row: Vec<Option<&Record>> = spec
                        .impls
                        .iter()
                        .map(|name| self.find(name, shape, m, t))
                        .collect();
                    if row.iter().all(Option::is_none) {
                        continue;
                    }
                    let gbs = m <= spec.gbs_max_m;
                    let unit = if gbs {
                        "GB/s (% read BW)"
                    } else {
                        "GFLOP/s (% ymm FMA)"
                    };
                    let _ = write!(
                        out,
                        "| {} {}×{} | {m} | {t} | {unit} |",
                        shape.label, shape.n, shape.k
                    );
                    for rec in &row {
                        match rec {
                            None => out.push_str(" – |"),
                            Some(r) => {
                                let (v, limit) = if gbs {
                                    (r.weight_gbs(), lim.read_gbs.get(&t))
                                } else {
                                    (r.gflops(), lim.fma_ymm_gflops.get(&t))
                                };
                                let flag = if r.is_wrong() { " WRONG" } else { "" };
                                let _ =
                                    write!(out, " {}{}{flag} |", fmt_value(v), fmt_pct(v, limit));
                            }
                        }
                    }
                    if let Some(b) = baseline {
                        let base = self.find(b, shape, m, t).map(|r| r.median_s);
                        for name in &spec.ratio_impls {
                            match (base, self.find(name, shape, m, t)) {
                                (Some(bt), Some(r)) => {
                                    let _ = write!(out, " {:.2}× |", bt / r.median_s);
                                }
                                _ => out.push_str(" – |"),
                            }
                        }
                        let best = row
                            .iter()
                            .flatten()
                            .filter(|r| r.impl_name != b && !r.is_wrong())
                            .min_by(|x, y| x.median_s.total_cmp(&y.median_s));
                        match (base, best) {
                            (Some(bt), Some(r)) => {
                                let _ = write!(out, " {} {:.2}× |", r.impl_name, bt / r.median_s);
                            }
                            _ => out.push_str(" – |"),
                        }
                    }
                    out.push('\n');
                }
            }
        }
        out.push_str(
            "\nCells: the median call's rate and, in parentheses, its fraction of the same-run limit for that thread \
             count. GB/s counts the bytes of weights the implementation stores (f32 4 B/weight; ggml Q8_0 1.0625, \
             Q4_0 0.5625). Ratios are time(baseline) / time(implementation) for the same shape, M and threads. \
             WRONG: result outside the format's tolerance (never counted as best).\n",
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(name: &str, m: usize, t: usize, median_s: f64) -> Record {
        Record {
            impl_name: name.into(),
            n: 1000,
            k: 500,
            m,
            threads: t,
            median_s,
            min_s: median_s,
            reps: 5,
            copies: 2,
            weight_bytes: 2_000_000,
            max_rel_err: 1e-7,
            tolerance: Some(1e-4),
        }
    }

    #[test]
    fn rates() {
        let r = rec("a", 4, 1, 1e-3);
        assert!((r.weight_gbs() - 2.0).abs() < 1e-12);
        assert!((r.gflops() - 4.0).abs() < 1e-12);
    }

    #[test]
    fn peer_lines_parse() {
        let info: PeerLine =
            serde_json::from_str(r#"{"info":"numpy","detail":"openblas 0.3"}"#).unwrap();
        assert_eq!(
            info,
            PeerLine::Info {
                info: "numpy".into(),
                detail: "openblas 0.3".into()
            }
        );
        let line = r#"{"impl":"ggml-q4_0","n":1000,"k":500,"m":1,"threads":2,"median_s":0.001,"min_s":0.0009,
                       "reps":5,"copies":3,"weight_bytes":281250,"max_rel_err":0.003}"#;
        match serde_json::from_str::<PeerLine>(line).unwrap() {
            PeerLine::Record(r) => {
                assert_eq!(
                    (r.impl_name.as_str(), r.m, r.threads, r.tolerance),
                    ("ggml-q4_0", 1, 2, None)
                );
            }
            other => panic!("{other:?}"),
        }
        assert!(serde_json::from_str::<PeerLine>(r#"{"impl":"x"}"#).is_err());
    }

    #[test]
    fn table_has_units_fractions_and_ratios() {
        let mut report = RunReport {
            command: "tessera-bench".into(),
            shapes: vec![Shape::new("s", 1000, 500)],
            ..Default::default()
        };
        report.limits.read_gbs.insert(1, 4.0);
        report.limits.fma_ymm_gflops.insert(1, 100.0);
        report.records = vec![
            rec("base", 1, 1, 1e-3),
            rec("fast", 1, 1, 0.5e-3),
            rec("base", 64, 1, 1e-2),
            rec("fast", 64, 1, 2e-2),
        ];
        let mut wrong = rec("broken", 64, 1, 1e-4);
        wrong.max_rel_err = 1.0;
        report.records.push(wrong);
        let spec = TableSpec {
            impls: vec!["base".into(), "fast".into(), "broken".into()],
            gbs_max_m: 8,
            baseline: Some("base".into()),
            ratio_impls: vec!["fast".into()],
        };
        let md = report.markdown(&spec);
        assert!(md.contains("| s 1000×500 | 1 | 1 | GB/s (% read BW) | 2.0 (50%) | 4.0 (100%) | – | 2.00× | fast 2.00× |"), "{md}");
        assert!(md.contains("| s 1000×500 | 64 | 1 | GFLOP/s (% ymm FMA) | 6.4 (6%) | 3.2 (3%) | 640 (640%) WRONG | 0.50× | fast 0.50× |"), "{md}");
        assert!(
            md.contains("| DRAM read, GEMV-like 8 rows (GB/s) | 4.0 |"),
            "{md}"
        );
    }
}
