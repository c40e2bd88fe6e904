//! `tessera-bench`: see bench/README.md.

use clap::Parser;
use std::path::PathBuf;
use std::process::ExitCode;
use tessera_bench::BenchError;
use tessera_bench::method::Method;
use tessera_bench::report::TableSpec;
use tessera_bench::run::{self, Config};
use tessera_bench::shapes::{parse_list, parse_shapes};

#[derive(Parser, Debug)]
#[command(
    name = "tessera-bench",
    about = "Side-by-side matmul benchmark (y = x·Wᵀ, W [N, K]) against gemm, matrixmultiply, numpy and ggml"
)]
struct Cli {
    /// `llama2-7b`, `qwen2-1.5b`, or `N,K[;N,K...]` (mixable with `;`).
    #[arg(long, default_value = "llama2-7b")]
    shapes: String,
    /// Rows of x (batch / tokens), comma-separated.
    #[arg(long, default_value = "1,8,64,512")]
    m: String,
    /// Thread counts, comma-separated.
    #[arg(long, default_value = "1,2")]
    threads: String,
    /// Implementations, in column order: gemm, matrixmultiply, numpy, ggml-q4_0, ggml-q8_0, and any tessera-* built in.
    #[arg(long, default_value = "gemm,matrixmultiply,numpy,ggml-q4_0,ggml-q8_0")]
    peers: String,
    /// Also write the whole run as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Smoke test: fewer weight copies (32 MiB unless --total-mib), fewer and shorter calls.
    #[arg(long)]
    quick: bool,
    /// Weight copies rotated per implementation add up to at least this many MiB
    /// (default: the larger of 256 and twice the L3 size).
    #[arg(long)]
    total_mib: Option<f64>,
    #[arg(long)]
    min_reps: Option<usize>,
    /// Seconds of calls a block runs at least (with at least --min-reps calls).
    #[arg(long)]
    min_time: Option<f64>,
    /// Seconds after which a block stops once it has 3 calls.
    #[arg(long)]
    max_time: Option<f64>,
    /// Pause between blocks, in milliseconds.
    #[arg(long)]
    sleep_ms: Option<u64>,
    /// Implementation the ratio columns divide by (if it is among --peers).
    #[arg(long, default_value = "numpy")]
    baseline: String,
    /// Implementations that get their own "vs baseline" column (default: every tessera-* peer).
    #[arg(long)]
    ratio: Option<String>,
    /// Rows with M up to this report weight GB/s; larger M report GFLOP/s.
    #[arg(long, default_value_t = 8)]
    gbs_max_m: usize,
    /// Before starting, wait (up to --wait-minutes) until the 1-minute load
    /// average is below this.
    #[arg(long)]
    wait_idle: Option<f64>,
    #[arg(long, default_value_t = 10.0)]
    wait_minutes: f64,
    /// Skip measuring read bandwidth and FMA peak.
    #[arg(long)]
    no_limits: bool,
    #[arg(long, default_value = "python3")]
    python: String,
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/peers/numpy_peer.py"))]
    numpy_script: PathBuf,
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../target/ggml-peer/ggml_peer"))]
    ggml_harness: PathBuf,
    /// A tuning record (`tessera-autotune --out`): the tessera-* peers
    /// dispatch by its breakpoints and winners where it matches this CPU,
    /// backend and format (else the defaults, with a warning), so the run
    /// times what a tuned user gets.
    #[arg(long)]
    record: Option<PathBuf>,
    /// Internal: time in-process implementations and print JSON lines.
    #[arg(long, hide = true)]
    worker: bool,
}

fn method(cli: &Cli) -> Result<Method, BenchError> {
    let default_total = if cli.quick {
        32.0
    } else {
        let l3_mib = run::l3_bytes().unwrap_or(0) as f64 / f64::from(1u32 << 20);
        (2.0 * l3_mib).max(256.0)
    };
    let total_mib = cli.total_mib.unwrap_or(default_total);
    if !(total_mib.is_finite() && total_mib >= 0.0) {
        return Err(BenchError::Option(format!(
            "--total-mib {total_mib} is not a size"
        )));
    }
    let total = (total_mib * f64::from(1u32 << 20)) as u64;
    let mut m = if cli.quick {
        Method::quick(total)
    } else {
        Method::standard(total)
    };
    if let Some(v) = cli.min_reps {
        m.min_reps = v.max(1);
    }
    for (name, v, slot) in [
        ("--min-time", cli.min_time, &mut m.min_time_s),
        ("--max-time", cli.max_time, &mut m.max_time_s),
    ] {
        if let Some(v) = v {
            if !(v.is_finite() && v >= 0.0) {
                return Err(BenchError::Option(format!("{name} {v} is not a duration")));
            }
            *slot = v;
        }
    }
    if let Some(v) = cli.sleep_ms {
        m.sleep_ms = v;
    }
    Ok(m)
}

fn main_inner() -> Result<(), BenchError> {
    let cli = Cli::parse();
    let peers: Vec<String> = cli
        .peers
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(String::from)
        .collect();
    if peers.is_empty() {
        return Err(BenchError::Option("--peers is empty".into()));
    }
    let config = Config {
        shapes: parse_shapes(&cli.shapes)?,
        ms: parse_list(&cli.m)?,
        threads: parse_list(&cli.threads)?,
        peers: peers.clone(),
        method: method(&cli)?,
        quick: cli.quick,
        measure_limits: !cli.no_limits,
        python: cli.python.clone(),
        numpy_script: cli.numpy_script.clone(),
        ggml_harness: cli.ggml_harness.clone(),
        record: match &cli.record {
            Some(path) => Some(std::sync::Arc::new(
                tessera_runtime::record::TuningRecord::load(path)
                    .map_err(|e| BenchError::Option(format!("--record: {e}")))?,
            )),
            None => None,
        },
        command: std::iter::once("tessera-bench".to_string())
            .chain(std::env::args().skip(1))
            .collect::<Vec<_>>()
            .join(" "),
    };
    if cli.worker {
        return run::run_worker(&config);
    }
    if let Some(max_load) = cli.wait_idle {
        let minutes = if cli.wait_minutes.is_finite() {
            cli.wait_minutes.max(0.0)
        } else {
            0.0
        };
        let load = run::wait_for_idle(max_load, std::time::Duration::from_secs_f64(60.0 * minutes));
        eprintln!("starting at load average {load}");
    }
    let report = run::run(&config)?;
    let ratio_impls = match &cli.ratio {
        Some(list) => list
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(String::from)
            .collect(),
        None => peers
            .iter()
            .filter(|p| p.starts_with("tessera"))
            .cloned()
            .collect(),
    };
    let spec = TableSpec {
        impls: peers.clone(),
        gbs_max_m: cli.gbs_max_m,
        baseline: peers.contains(&cli.baseline).then(|| cli.baseline.clone()),
        ratio_impls,
    };
    println!("{}", report.markdown(&spec));
    if let Some(path) = &cli.json {
        let text =
            serde_json::to_string_pretty(&report).map_err(|e| BenchError::Option(e.to_string()))?;
        std::fs::write(path, text + "\n").map_err(|source| BenchError::Io {
            path: path.clone(),
            source,
        })?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

fn main() -> ExitCode {
    match main_inner() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tessera-bench: {e}");
            ExitCode::FAILURE
        }
    }
}
