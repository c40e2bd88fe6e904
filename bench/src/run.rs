//! One benchmark run: limits first, then every shape with every peer, one
//! after another, each peer with its own threading.

use crate::error::BenchError;
use crate::external::{PeerCommand, method_args, run_peer};
use crate::format::WeightFormat;
use crate::impls::{self, MatmulImpl};
use crate::limits::Limits;
use crate::method::Method;
use crate::report::{Record, RunReport};
use crate::shapes::Shape;
use std::path::PathBuf;

/// Peers that run as their own programs.
pub const EXTERNAL_PEERS: [&str; 3] = ["numpy", "ggml-q4_0", "ggml-q8_0"];

#[derive(Debug, Clone)]
pub struct Config {
    pub shapes: Vec<Shape>,
    pub ms: Vec<usize>,
    pub threads: Vec<usize>,
    pub peers: Vec<String>,
    pub method: Method,
    pub quick: bool,
    pub measure_limits: bool,
    pub python: String,
    pub numpy_script: PathBuf,
    pub ggml_harness: PathBuf,
    /// The tuning record the tessera-* peers dispatch by (`--record`).
    pub record: Option<std::sync::Arc<tessera_runtime::record::TuningRecord>>,
    /// The command line, for the report.
    pub command: String,
}

/// Every accepted `--peers` name.
pub fn known_peers() -> Vec<String> {
    let mut names = impls::in_process_names();
    names.extend(EXTERNAL_PEERS.iter().map(|s| s.to_string()));
    names
}

/// Rejects unknown peer names before anything is measured.
pub fn check_peers(peers: &[String]) -> Result<(), BenchError> {
    let known = known_peers();
    for p in peers {
        if !known.contains(p) {
            return Err(BenchError::UnknownImpl {
                name: p.clone(),
                known: known.join(", "),
            });
        }
    }
    Ok(())
}

/// The format an implementation's records are judged by.
fn peer_format(name: &str) -> WeightFormat {
    match name {
        "ggml-q4_0" => WeightFormat::Int4 {
            group: 32,
            param_bytes: 2,
        },
        "ggml-q8_0" => WeightFormat::Int8 {
            group: 32,
            param_bytes: 2,
        },
        _ => impls::in_process_impl(name, None)
            .map(|i| i.weight_format())
            .unwrap_or(WeightFormat::F32),
    }
}

fn progress(r: &Record) {
    eprintln!(
        "  {:<16} {:>5}x{:<5} M={:<4} T={} {:>9.3} ms  {:>6.1} GB/s {:>6.1} GFLOP/s  ({} calls, {} copies, err {:.1e})",
        r.impl_name,
        r.n,
        r.k,
        r.m,
        r.threads,
        r.median_s * 1e3,
        r.weight_gbs(),
        r.gflops(),
        r.reps,
        r.copies,
        r.max_rel_err
    );
}

/// The f32 weights every implementation starts from for `shape`.
pub fn source_weights(shape: &Shape) -> Vec<f32> {
    let mut w = vec![0.0; shape.n * shape.k];
    impls::fill_uniform(&mut w, (shape.n as u64) << 32 | shape.k as u64);
    w
}

/// Times one in-process implementation on one shape for the given thread
/// counts and M values.
pub fn measure_in_process(
    imp: &mut dyn MatmulImpl,
    shape: &Shape,
    weights: &[f32],
    ms: &[usize],
    threads: &[usize],
    method: &Method,
    mut on_record: impl FnMut(Record),
) -> Result<(), BenchError> {
    let (n, k) = (shape.n, shape.k);
    let format = imp.weight_format();
    let weight_bytes = format.weight_bytes(n, k);
    let copies = method.copies_for(weight_bytes);
    imp.prepare(n, k, weights, copies)?;
    for &t in threads {
        imp.set_threads(t)?;
        for &m in ms {
            let mut x = vec![0.0f32; m * k];
            impls::fill_uniform(&mut x, 0xA11CE ^ m as u64);
            let mut y = vec![0.0f32; m * n];
            let mut first = true;
            let mut max_rel_err = 0.0;
            let timing = method.measure(copies, |copy| {
                imp.run(m, &x, &mut y, copy);
                if first {
                    max_rel_err = impls::relative_error(n, k, m, weights, &x, &y);
                    first = false;
                }
            });
            on_record(Record {
                impl_name: imp.name(),
                n,
                k,
                m,
                threads: t,
                median_s: timing.median_s,
                min_s: timing.min_s,
                reps: timing.reps,
                copies,
                weight_bytes,
                max_rel_err,
                tolerance: Some(format.tolerance()),
            });
            method.pause();
        }
    }
    imp.release();
    Ok(())
}

fn list(values: &[usize]) -> String {
    values
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// The child-process command for an external peer, or why it cannot run.
fn external_command(config: &Config, peer: &str, shape: &Shape) -> Result<PeerCommand, String> {
    let mut args = Vec::new();
    let program;
    match peer {
        "numpy" => {
            // OpenBLAS's overrides are unset for this command only.
            program = "env".to_string();
            args.extend(["-u", "OPENBLAS_CORETYPE", "-u", "OPENBLAS_L2_SIZE"].map(String::from));
            args.push(config.python.clone());
            args.push(config.numpy_script.display().to_string());
        }
        _ => {
            if !config.ggml_harness.is_file() {
                return Err(format!(
                    "{peer} skipped: ggml harness {} not built (run `bash bench/peers/ggml/build.sh`)",
                    config.ggml_harness.display()
                ));
            }
            program = config.ggml_harness.display().to_string();
            args.push("--type".into());
            args.push(peer.trim_start_matches("ggml-").to_string());
        }
    }
    args.extend([
        "--n".into(),
        shape.n.to_string(),
        "--k".into(),
        shape.k.to_string(),
        "--m".into(),
        list(&config.ms),
        "--threads".into(),
        list(&config.threads),
    ]);
    args.extend(method_args(&config.method));
    Ok(PeerCommand {
        peer: peer.to_string(),
        program,
        args,
        env: Vec::new(),
    })
}

/// The same binary in `--worker` mode for one implementation, one shape and
/// one thread count, with the implementation's environment.
fn worker_command(
    config: &Config,
    peer: &str,
    shape: &Shape,
    threads: usize,
    env: Vec<(String, String)>,
) -> Result<PeerCommand, String> {
    let exe = std::env::current_exe()
        .map_err(|e| format!("{peer} skipped: cannot find this executable: {e}"))?;
    let mut args = vec![
        "--worker".to_string(),
        "--peers".into(),
        peer.to_string(),
        "--shapes".into(),
        format!("{},{}", shape.n, shape.k),
        "--m".into(),
        list(&config.ms),
        "--threads".into(),
        threads.to_string(),
    ];
    args.extend(method_args(&config.method));
    Ok(PeerCommand {
        peer: peer.to_string(),
        program: exe.display().to_string(),
        args,
        env,
    })
}

fn read_trimmed(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

/// "model name" of the first CPU.
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

/// Size of the last-level (L3) cache, from sysfs.
pub fn l3_bytes() -> Option<u64> {
    let text = read_trimmed("/sys/devices/system/cpu/cpu0/cache/index3/size")?;
    let (digits, unit) = text.split_at(
        text.find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len()),
    );
    let v: u64 = digits.parse().ok()?;
    Some(match unit {
        "K" => v << 10,
        "M" => v << 20,
        "G" => v << 30,
        _ => v,
    })
}

/// The 1/5/15-minute load averages.
pub fn load_average() -> String {
    read_trimmed("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| "unknown".into())
}

/// Limits that moved by more than 15% between the start and the end of the
/// run, as a warning that other work shared the machine.
pub fn limits_drift(before: &Limits, after: &Limits) -> Option<String> {
    let mut moved = Vec::new();
    for (name, b, a) in [
        ("read bandwidth", &before.read_gbs, &after.read_gbs),
        (
            "ymm FMA peak",
            &before.fma_ymm_gflops,
            &after.fma_ymm_gflops,
        ),
    ] {
        for (t, vb) in b {
            if let Some(va) = a.get(t)
                && (va - vb).abs() > 0.15 * vb.max(*va)
            {
                moved.push(format!("{name} {t}T {vb:.1} → {va:.1}"));
            }
        }
    }
    (!moved.is_empty()).then(|| {
        format!(
            "limits changed during the run ({}): other load on the machine; rerun when it is idle",
            moved.join(", ")
        )
    })
}

/// Waits until the 1-minute load average is below `max_load` or `timeout`
/// passes; returns the load average it ends with.
pub fn wait_for_idle(max_load: f64, timeout: std::time::Duration) -> String {
    let start = std::time::Instant::now();
    loop {
        let load = load_average();
        let one: f64 = load
            .split_whitespace()
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        if one < max_load || start.elapsed() >= timeout {
            return load;
        }
        eprintln!("waiting for load average {one:.2} < {max_load} ...");
        std::thread::sleep(std::time::Duration::from_secs(15));
    }
}

/// The whole run.
pub fn run(config: &Config) -> Result<RunReport, BenchError> {
    check_peers(&config.peers)?;
    let mut report = RunReport {
        command: config.command.clone(),
        cpu: cpu_model(),
        l3_bytes: l3_bytes(),
        load_before: load_average(),
        method: Some(config.method),
        shapes: config.shapes.clone(),
        ..Default::default()
    };
    if config.measure_limits {
        eprintln!("measuring limits (read bandwidth, FMA peak) ...");
        report.limits = Limits::measure(&config.threads, &config.method, config.quick);
        eprintln!("  {:?}", report.limits);
    }
    let mut skipped: Vec<String> = Vec::new();
    for shape in &config.shapes {
        eprintln!("{} [{}, {}]", shape.label, shape.n, shape.k);
        let weights = source_weights(shape);
        for peer in &config.peers {
            let tolerance = peer_format(peer).tolerance();
            let mut commands = Vec::new();
            if let Some(mut imp) = impls::in_process_impl(peer, config.record.as_ref()) {
                if imp.process_env_for_threads(1).is_none() {
                    let result = measure_in_process(
                        imp.as_mut(),
                        shape,
                        &weights,
                        &config.ms,
                        &config.threads,
                        &config.method,
                        |r| {
                            progress(&r);
                            report.records.push(r);
                        },
                    );
                    if let Err(e) = result {
                        report
                            .notes
                            .push(format!("{peer} on {}x{}: {e}", shape.n, shape.k));
                        eprintln!("  {e}");
                    }
                    continue;
                }
                for &t in &config.threads {
                    let env = imp.process_env_for_threads(t).unwrap_or_default();
                    commands.push(worker_command(config, peer, shape, t, env));
                }
            } else {
                commands.push(external_command(config, peer, shape));
            }
            for command in commands {
                let command = match command {
                    Ok(c) => c,
                    Err(why) => {
                        if !skipped.contains(&why) {
                            eprintln!("  {why}");
                            report.notes.push(why.clone());
                            skipped.push(why);
                        }
                        continue;
                    }
                };
                match run_peer(&command, progress) {
                    Ok(out) => {
                        for (name, detail) in out.info {
                            report.info.entry(name).or_insert(detail);
                        }
                        report.records.extend(out.records.into_iter().map(|mut r| {
                            r.tolerance = Some(tolerance);
                            r
                        }));
                    }
                    Err(e) => {
                        eprintln!("  {e}");
                        report
                            .notes
                            .push(format!("{peer} on {}x{}: {e}", shape.n, shape.k));
                    }
                }
                config.method.pause();
            }
        }
    }
    if config.measure_limits {
        eprintln!("measuring limits again ...");
        let after = Limits::measure(&config.threads, &config.method, config.quick);
        if let Some(why) = limits_drift(&report.limits, &after) {
            eprintln!("  {why}");
            report.notes.push(why);
        }
        report.limits_after = Some(after);
    }
    report.load_after = load_average();
    Ok(report)
}

/// `--worker`: time the named in-process implementations and print records
/// as JSON lines (the parent process merges them).
pub fn run_worker(config: &Config) -> Result<(), BenchError> {
    for shape in &config.shapes {
        let weights = source_weights(shape);
        for peer in &config.peers {
            let mut imp =
                impls::in_process_impl(peer, config.record.as_ref()).ok_or_else(|| {
                    BenchError::UnknownImpl {
                        name: peer.clone(),
                        known: impls::in_process_names().join(", "),
                    }
                })?;
            let mut failure = None;
            measure_in_process(
                imp.as_mut(),
                shape,
                &weights,
                &config.ms,
                &config.threads,
                &config.method,
                |r| match serde_json::to_string(&r) {
                    Ok(line) => println!("{line}"),
                    Err(e) => failure = Some(e.to_string()),
                },
            )?;
            if let Some(why) = failure {
                return Err(BenchError::Impl {
                    name: peer.clone(),
                    why,
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_peers_are_rejected_with_the_known_list() {
        let err = check_peers(&["gemm".into(), "blas".into()])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("\"blas\"") && err.contains("ggml-q4_0"),
            "{err}"
        );
        check_peers(&known_peers()).unwrap();
    }

    #[test]
    fn drift_is_reported_only_past_15_percent() {
        let mut a = Limits::default();
        a.read_gbs.insert(1, 20.0);
        a.fma_ymm_gflops.insert(1, 100.0);
        let mut b = a.clone();
        b.read_gbs.insert(1, 18.0);
        assert_eq!(limits_drift(&a, &b), None);
        b.fma_ymm_gflops.insert(1, 40.0);
        let why = limits_drift(&a, &b).unwrap();
        assert!(why.contains("ymm FMA peak 1T 100.0 → 40.0"), "{why}");
    }

    #[test]
    fn l3_size_parses() {
        if let Some(b) = l3_bytes() {
            assert!(b >= 1 << 20);
        }
    }

    #[test]
    fn in_process_records_have_rates_and_small_errors() {
        let shape = Shape::new("t", 37, 70);
        let weights = source_weights(&shape);
        let mut method = Method::quick(1 << 16);
        method.sleep_ms = 0;
        let mut imp = impls::in_process_impl("gemm", None).unwrap();
        let mut records = Vec::new();
        measure_in_process(
            imp.as_mut(),
            &shape,
            &weights,
            &[1, 3],
            &[1, 2],
            &method,
            |r| records.push(r),
        )
        .unwrap();
        assert_eq!(records.len(), 4);
        for r in &records {
            assert_eq!(r.weight_bytes, 37 * 70 * 4);
            assert!(r.copies >= 2 && r.reps >= 3 && r.median_s > 0.0);
            assert!(!r.is_wrong(), "{r:?}");
        }
    }
}
