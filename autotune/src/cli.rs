//! The `tessera-autotune` command: argument handling, the run, the output
//! files and exit codes.
//!
//! Exit codes: 0 done; 1 an I/O or record error; 2 bad input (unknown
//! model, backend or format, unreadable or malformed config, unavailable
//! backend, too small a budget, nothing to resume); 3 the budget ran out
//! (a partial record was written); 130 interrupted (a partial record was
//! written; `--resume` continues).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tessera_codegen::target::{MacClass, mac_class};
use tessera_dsl::models::{DEFAULT_MODEL, ModelError};
use tessera_runtime::device::Fingerprint;
use tessera_runtime::record::{
    DeviceEntry, GeneratorId, PrefetchChoice, RecordError, ShapeEntry, TuningRecord,
};

use tessera_codegen::tile::TileConfig;

use crate::backend::{self, BackendKind, TuneBackend};
use crate::bench::HostBench;
use crate::decode;
use crate::limits::{self, MacPath};
use crate::model_source::{AttentionHeads, TunePlan};
use crate::opencl::ClTarget;
use crate::prefetch;
use crate::prefill;
use crate::report;
use crate::tune::{self, Bench, Event, ShapeSpec, SolverCtx, Stop, Traffic, TuneConfig};

/// The smallest budget that can measure anything (limits alone take ~1 s).
pub const MIN_BUDGET_SECS: f64 = 2.0;

/// Time kept back from the budget for writing the record and plots.
const RESERVE: Duration = Duration::from_millis(400);
/// Time per prefill-block candidate (nine of them, the best re-measured).
const PREFILL_SLICE: Duration = Duration::from_millis(150);
/// Time per decode form (two of them, re-measured when FMAs win).
const DECODE_SLICE: Duration = Duration::from_millis(200);

#[derive(Parser, Debug)]
#[command(
    name = "tessera-autotune",
    about = "Measure this device and write the tuning record the Tessera runtime loads",
    args_conflicts_with_subcommands = true
)]
pub struct Args {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Embedded model (qwen2-1.5b, qwen2-7b, llama2-7b, chatglm2-6b,
    /// gemma-2b), a Hugging Face config.json, or a .gguf file (its shapes
    /// in its tensors' formats, one record entry per format).
    #[arg(long, default_value = DEFAULT_MODEL)]
    pub model: String,
    /// host (cranelift), x86 (AVX2), neon, opencl, cuda [default: the best available CPU backend]
    #[arg(long)]
    pub backend: Option<String>,
    /// q4_0, q4_1, q8_0 (ggml's blocks), w4a8, w8a8, w4a16, w8a16, e0m4a16, q4_0a16, q4_1a16, q8_0a16 (ggml's blocks, f16 activations), f16, f32 [default: q4_0 on x86 and NEON, w4a8 on cranelift, w4a16 on GPUs].
    #[arg(long)]
    pub format: Option<String>,
    /// Threads per call [default: all logical CPUs; 1 host thread on a GPU].
    #[arg(long)]
    pub threads: Option<usize>,
    /// Seconds the whole run may take (start-up aside).
    #[arg(long, default_value_t = 60.0)]
    pub budget: f64,
    /// The record file (merged into when it already holds other entries).
    #[arg(long, default_value = "tessera-record.json")]
    pub out: PathBuf,
    /// Continue a partial record in --out.
    #[arg(long)]
    pub resume: bool,
    /// Also tune the lm_head shape [vocab, hidden].
    #[arg(long)]
    pub lm_head: bool,
    /// Tune for a runtime opened with `one_weight_copy`: the GEMM first,
    /// then GEMV and flat GEMM tiles of the GEMM winner's packing only, so
    /// the record's winners share one packed copy of the weights.
    #[arg(long)]
    pub one_weight_copy: bool,
    /// Directory for the SVG plots (default: the --out path with -plots
    /// appended).
    #[arg(long)]
    pub plots: Option<PathBuf>,
    /// Write no plots.
    #[arg(long)]
    pub no_plots: bool,
    /// No progress bar.
    #[arg(long, short)]
    pub quiet: bool,
    /// Tune another device: ssh://user@host or ssh://user@host:port, adb
    /// or adb:SERIAL, or
    /// run:COMMAND (a runner prefix on this filesystem, e.g. qemu). The
    /// record comes back and is merged into --out.
    #[arg(long, value_name = "TARGET")]
    pub remote: Option<String>,
    /// The device's Rust target triple, to cross-build the tuner for.
    #[arg(long, default_value = "aarch64-unknown-linux-gnu")]
    pub remote_target: String,
    /// A tuner already built for the device (skips the cross-build).
    #[arg(long, value_name = "PATH")]
    pub remote_bin: Option<PathBuf>,
    /// The cargo profile of the cross-build (`release` times the kernels
    /// as a user's build would; another profile reuses what a test or dev
    /// build of that target already compiled).
    #[arg(long, value_name = "NAME", default_value = "release")]
    pub remote_profile: String,
    /// An ssh/scp option (-o) for --remote ssh://, e.g.
    /// IdentityFile=~/.ssh/board; repeatable.
    #[arg(long, value_name = "OPTION")]
    pub ssh_option: Vec<String>,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Combine records from several devices into one file.
    Merge {
        a: PathBuf,
        b: PathBuf,
        #[arg(short, long, default_value = "tessera-record.json")]
        out: PathBuf,
    },
}

/// Everything that ends the command early, with its exit code.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{0}")]
    Model(#[from] ModelError),
    #[error("{0}")]
    Source(#[from] crate::model_source::SourceError),
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    Record(#[from] RecordError),
    #[error("{0}")]
    Tune(#[from] tune::TuneError),
    #[error(
        "the budget of {budget:.0} s ran out after {done} of {total} shapes; wrote a partial record to {out}. \
         Continue with --resume (and a larger --budget)"
    )]
    Partial {
        budget: f64,
        done: usize,
        total: usize,
        out: String,
    },
    #[error(
        "interrupted after {done} of {total} shapes; wrote a partial record to {out}. Continue with --resume"
    )]
    Interrupted {
        done: usize,
        total: usize,
        out: String,
    },
    #[error("{0}")]
    Io(String),
    #[error("{0}")]
    Remote(#[from] crate::remote::RemoteError),
}

impl CliError {
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Model(_) | CliError::Source(_) | CliError::Usage(_) => 2,
            CliError::Partial { .. } => 3,
            CliError::Interrupted { .. } => 130,
            CliError::Record(_) | CliError::Tune(_) | CliError::Io(_) | CliError::Remote(_) => 1,
        }
    }
}

pub fn main() -> ExitCode {
    let args = Args::parse();
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tessera-autotune: error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

/// The command without process concerns (tests call it).
pub fn run(args: Args) -> Result<(), CliError> {
    if let Some(Command::Merge { a, b, out }) = &args.command {
        return merge(a, b, out);
    }
    if let Some(target) = &args.remote {
        return remote_command(&args, target);
    }
    tune_command(&args)
}

fn check_budget(budget: f64) -> Result<(), CliError> {
    if budget.is_finite() && budget >= MIN_BUDGET_SECS {
        Ok(())
    } else {
        Err(CliError::Usage(format!(
            "a budget of {budget} s is too small: measuring the device's limits alone takes about a second; give --budget {MIN_BUDGET_SECS} or more"
        )))
    }
}

/// `--remote`: build (or take `--remote-bin`), copy, run with this run's
/// options, fetch the record, merge it into `--out`, print its summary and
/// plot it here.
fn remote_command(args: &Args, target: &str) -> Result<(), CliError> {
    use crate::remote::{self, Step};
    check_budget(args.budget)?;
    if args.resume {
        return Err(CliError::Usage(
            "--resume is not supported with --remote (rerun with a larger --budget)".into(),
        ));
    }
    let plan = TunePlan::resolve(&args.model)?;
    let mut transport = remote::parse(target, &args.ssh_option).map_err(CliError::Usage)?;
    let say = |msg: String| {
        if !args.quiet {
            eprintln!("{msg}");
        }
    };
    let bin = match &args.remote_bin {
        Some(p) if p.is_file() => p.clone(),
        Some(p) => {
            return Err(CliError::Usage(format!(
                "--remote-bin {}: no such file",
                p.display()
            )));
        }
        None => {
            say(format!(
                "building tessera-autotune for {} (cargo build --profile {})",
                args.remote_target, args.remote_profile
            ));
            remote::build(&args.remote_target, &args.remote_profile)?
        }
    };
    say(format!("tuning on {}", transport.describe()));
    let dir = transport.workdir()?;
    let exe = transport.copy(&bin, &dir)?;
    let mut rargs: Vec<String> = vec![
        "--budget".into(),
        args.budget.to_string(),
        "--out".into(),
        "tessera-record.json".into(),
        "--no-plots".into(),
        "--quiet".into(),
    ];
    // A model file travels as its shape list (a GGUF file may be
    // gigabytes); a config.json travels too, named as it is here.
    let mut ship = |file: &str, text: String| -> Result<String, CliError> {
        let local = std::env::temp_dir().join(format!(
            "tessera-autotune-model-{}/{file}",
            std::process::id()
        ));
        if let Some(parent) = local.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| CliError::Io(format!("cannot create {}: {e}", parent.display())))?;
        }
        std::fs::write(&local, text)
            .map_err(|e| CliError::Io(format!("cannot write {}: {e}", local.display())))?;
        Ok(transport.copy(&local, &dir)?)
    };
    if plan.has_formats() {
        let there = ship("shapes.json", plan.to_shape_list())?;
        rargs.extend(["--model".into(), there]);
    } else if Path::new(&args.model).is_file() {
        let text = std::fs::read_to_string(&args.model)
            .map_err(|e| CliError::Usage(format!("cannot read {}: {e}", args.model)))?;
        let mut json: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| CliError::Usage(format!("{}: {e}", args.model)))?;
        if let Some(o) = json.as_object_mut() {
            o.insert("_name_or_path".into(), plan.name.clone().into());
        }
        let there = ship("config.json", json.to_string())?;
        rargs.extend(["--model".into(), there]);
    } else {
        rargs.extend(["--model".into(), args.model.clone()]);
    }
    for (flag, value) in [
        ("--backend", &args.backend),
        ("--format", &args.format),
        ("--threads", &args.threads.map(|t| t.to_string())),
    ] {
        if let Some(v) = value {
            rargs.extend([flag.to_string(), v.clone()]);
        }
    }
    if args.lm_head {
        rargs.push("--lm-head".into());
    }
    if args.one_weight_copy {
        rargs.push("--one-weight-copy".into());
    }
    let out = transport.run(&dir, &exe, &rargs)?;
    let code = out.status.code();
    // 0 done, 3 partial (a record was written); anything else failed.
    if !matches!(code, Some(0) | Some(3)) {
        return Err(remote::RemoteError {
            step: Step::Run,
            what: format!(
                "{exe} on {} exited with {}: {}",
                transport.describe(),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        }
        .into());
    }
    let fetched = std::env::temp_dir().join(format!(
        "tessera-autotune-fetched-{}.json",
        std::process::id()
    ));
    transport.fetch(&format!("{dir}/tessera-record.json"), &fetched)?;
    let merge_err = |e: RecordError| remote::RemoteError {
        step: Step::Merge,
        what: e.to_string(),
    };
    let theirs = TuningRecord::load(&fetched).map_err(merge_err)?;
    let _ = std::fs::remove_file(&fetched);
    let base = if args.out.exists() {
        TuningRecord::load(&args.out).map_err(merge_err)?
    } else {
        TuningRecord::default()
    };
    let merged = base.merge(theirs.clone());
    merged.save(&args.out).map_err(merge_err)?;
    for entry in &theirs.entries {
        println!("{}", report::summary(entry, "measured on the device"));
    }
    if !args.no_plots {
        let dir = plots_dir(args);
        for entry in &theirs.entries {
            write_plots(entry, &dir)?;
        }
        println!("plots: {}", dir.display());
    }
    println!(
        "record: {} (merged {} entr{} from {})",
        args.out.display(),
        theirs.entries.len(),
        if theirs.entries.len() == 1 {
            "y"
        } else {
            "ies"
        },
        transport.describe()
    );
    if code == Some(3) {
        return Err(CliError::Partial {
            budget: args.budget,
            done: theirs.entries.first().map_or(0, |e| e.shapes.len()),
            total: plan
                .groups(args.lm_head, args.format.as_deref(), "-")
                .iter()
                .map(|(_, s)| s.len())
                .sum(),
            out: args.out.display().to_string(),
        });
    }
    Ok(())
}

fn plots_dir(args: &Args) -> PathBuf {
    args.plots.clone().unwrap_or_else(|| {
        let mut p = args.out.clone().into_os_string();
        p.push("-plots");
        PathBuf::from(p)
    })
}

/// One SVG per shape of `entry` into `dir` (a plot that fails is a warning).
fn write_plots(entry: &DeviceEntry, dir: &Path) -> Result<(), CliError> {
    std::fs::create_dir_all(dir)
        .map_err(|e| CliError::Io(format!("cannot create {}: {e}", dir.display())))?;
    for shape in &entry.shapes {
        let file = dir.join(format!(
            "{}_{}x{}.svg",
            shape.name.replace('+', "-"),
            shape.n,
            shape.k
        ));
        if let Err(e) = report::plot(shape, &file) {
            eprintln!("tessera-autotune: warning: {e}");
        }
    }
    Ok(())
}

fn merge(a: &Path, b: &Path, out: &Path) -> Result<(), CliError> {
    let ra = TuningRecord::load(a)?;
    let rb = TuningRecord::load(b)?;
    let merged = ra.merge(rb);
    merged.save(out)?;
    println!(
        "merged {} and {} into {} ({} entries)",
        a.display(),
        b.display(),
        out.display(),
        merged.entries.len()
    );
    Ok(())
}

/// The solver's MAC path of `class` on a backend, for the peak loop.
fn mac_path(class: MacClass, backend: &dyn TuneBackend, kernel: &tessera_dsl::Kernel) -> MacPath {
    let bits = backend.vector_bits(kernel);
    match class {
        MacClass::Int8 => MacPath::Int8 { bits },
        _ => MacPath::Fma { bits },
    }
}

/// The device being tuned: host machine code, or an OpenCL device.
enum Target {
    Host(Box<dyn TuneBackend>),
    OpenCl(Box<ClTarget>),
}

impl Target {
    fn caps(
        &self,
        kernel: &tessera_dsl::Kernel,
        variant: tessera_dsl::ir::Variant,
    ) -> &'static tessera_codegen::target::TargetCaps {
        match self {
            Target::Host(b) => b.caps(kernel, variant),
            Target::OpenCl(t) => t.caps(),
        }
    }

    fn accepts(&self, kernel: &tessera_dsl::Kernel, tile: &TileConfig) -> bool {
        match self {
            Target::Host(b) => b.accepts(kernel, tile),
            Target::OpenCl(t) => t.accepts(tile),
        }
    }

    /// Build `tile` once so a kernel this backend cannot build fails
    /// before the budget is spent.
    fn probe(&self, kernel: &tessera_dsl::Kernel, tile: &TileConfig) -> Result<(), String> {
        match self {
            Target::Host(b) => b
                .load(kernel, tile, tessera_dsl::ir::Variant::Gemm)
                .map(|_| ()),
            Target::OpenCl(t) => t.probe(tile),
        }
    }
}

fn tune_command(args: &Args) -> Result<(), CliError> {
    let plan = TunePlan::resolve(&args.model)?;
    let kind = match &args.backend {
        Some(name) => name
            .parse::<BackendKind>()
            .map_err(|e| CliError::Usage(e.to_string()))?,
        // The best CPU backend (probing no GPU driver unless asked).
        None => [BackendKind::X86, BackendKind::Neon, BackendKind::Host]
            .into_iter()
            .find(|b| b.unavailable_reason().is_none())
            .ok_or_else(|| {
                CliError::Usage(
                    "no CPU backend can run on this machine (need x86-64 or aarch64); try --backend opencl"
                        .into(),
                )
            })?,
    };
    check_budget(args.budget)?;
    let groups = plan.groups(
        args.lm_head,
        args.format.as_deref(),
        backend::default_format(kind),
    );
    for (format, _) in &groups {
        backend::library_kernel(format).map_err(|e| CliError::Usage(e.to_string()))?;
    }
    // A model file in several formats: one record entry per format, the
    // budget shared by shape count.
    let total: usize = groups.iter().map(|(_, s)| s.len()).sum();
    let budgets: Vec<f64> = groups
        .iter()
        .map(|(_, s)| args.budget * s.len() as f64 / total.max(1) as f64)
        .collect();
    if groups.len() > 1 && budgets.iter().any(|&b| b < MIN_BUDGET_SECS) {
        let least = groups
            .iter()
            .map(|(_, s)| MIN_BUDGET_SECS * total as f64 / s.len() as f64)
            .fold(0.0, f64::max);
        return Err(CliError::Usage(format!(
            "{} stores its {total} shapes in {} formats ({}), tuned one after another with the budget shared by shape count: give --budget {:.0} or more, or tune one format with --format",
            args.model,
            groups.len(),
            groups
                .iter()
                .map(|(f, s)| format!("{f}: {}", s.len()))
                .collect::<Vec<_>>()
                .join(", "),
            least.ceil()
        )));
    }
    let mut partial = None;
    for (i, ((format, shapes), budget)) in groups.iter().zip(budgets).enumerate() {
        let job = Job {
            kind,
            model: &plan.name,
            attention: plan.attention.filter(|_| i == 0),
            format,
            shapes: shapes.clone(),
            budget,
            resume_fresh_ok: groups.len() > 1,
        };
        match tune_group(args, &job) {
            Ok(()) => {}
            Err(e @ CliError::Partial { .. }) => {
                partial.get_or_insert(e);
            }
            Err(e) => return Err(e),
        }
    }
    partial.map_or(Ok(()), Err)
}

/// One tuning run: one format, its shapes, its share of the budget.
struct Job<'a> {
    kind: BackendKind,
    model: &'a str,
    /// The model's attention heads, to tune the prefill blocks for (the
    /// first format's run only: the blocks do not depend on the weights).
    attention: Option<AttentionHeads>,
    format: &'a str,
    shapes: Vec<ShapeSpec>,
    budget: f64,
    /// With several formats, `--resume` tunes a format with no entry yet
    /// instead of refusing.
    resume_fresh_ok: bool,
}

fn tune_group(args: &Args, job: &Job<'_>) -> Result<(), CliError> {
    let start = Instant::now();
    let kind = job.kind;
    let format = job.format.to_string();
    let kernel_name =
        backend::library_kernel(&format).map_err(|e| CliError::Usage(e.to_string()))?;
    let logical = std::thread::available_parallelism().map_or(1, |n| n.get());
    let gpu = matches!(kind, BackendKind::OpenCl | BackendKind::Cuda);
    let threads = args.threads.unwrap_or(if gpu { 1 } else { logical });
    if threads == 0 {
        return Err(CliError::Usage("--threads must be at least 1".into()));
    }
    let target = match kind {
        BackendKind::OpenCl => {
            if let Some(why) = kind.unavailable_reason() {
                return Err(CliError::Usage(format!(
                    "backend `opencl` is not available: {why}"
                )));
            }
            Target::OpenCl(Box::new(ClTarget::open(kernel_name).map_err(|why| {
                CliError::Usage(format!(
                    "backend `opencl` cannot run --format {format} ({kernel_name}): {why}"
                ))
            })?))
        }
        _ => Target::Host(backend::open(kind).map_err(CliError::Usage)?),
    };
    let kernel = match &target {
        Target::OpenCl(t) => t.kernel().clone(),
        Target::Host(backend) => backend
            .weight_layout(
                &tessera_dsl::library::get(kernel_name)
                    .map_err(|e| CliError::Usage(e.to_string()))?,
            )
            .map_err(CliError::Usage)?,
    };
    // Flat GEMM candidates (and the record's target) come from this
    // target; the GEMM's may come from a wider one (x86-avx512), the
    // GEMV's from another (the dotprod GEMV on NEON i8mm).
    let caps = target.caps(&kernel, tessera_dsl::ir::Variant::FlatGemm);
    let gemv_caps = target.caps(&kernel, tessera_dsl::ir::Variant::Gemv);
    let gemm_caps = target.caps(&kernel, tessera_dsl::ir::Variant::Gemm);
    let class = mac_class(caps, &kernel).map_err(|e| {
        CliError::Usage(format!(
            "backend `{kind}` cannot run --format {format}: {e}"
        ))
    })?;
    let problem = tessera_codegen::tile::Problem::from_kernel(caps, &kernel)
        .map_err(|e| CliError::Usage(format!("--format {format}: {e}")))?;
    // Check the backend builds this kernel at all before spending the budget.
    let probe = tessera_codegen::tile::solve(caps, &problem)
        .map_err(|e| CliError::Usage(format!("--format {format}: {e}")))?;
    let cannot = |why: String| {
        CliError::Usage(format!(
            "backend `{kind}` cannot run --format {format} ({kernel_name}): {why}"
        ))
    };
    match probe.iter().find(|t| target.accepts(&kernel, t)) {
        Some(first) => target.probe(&kernel, first).map_err(cannot)?,
        // No tile is usable: the emitter's own reason for the optimum.
        None => {
            let why = match probe.first() {
                Some(t) => target
                    .probe(&kernel, t)
                    .err()
                    .unwrap_or_else(|| "no solver tile is usable".into()),
                None => "the solver found no tile".into(),
            };
            return Err(cannot(why));
        }
    }

    let fingerprint = match &target {
        Target::OpenCl(t) => t.fingerprint(),
        Target::Host(_) => Fingerprint::detect(),
    };
    let generator = GeneratorId {
        version: tessera_codegen::GENERATOR_VERSION.to_string(),
        template_hash: tessera_codegen::TEMPLATE_HASH.to_string(),
    };
    let shapes: Vec<ShapeSpec> = job.shapes.clone();

    // The existing file: merged into; with --resume, its partial entry
    // for this device and configuration supplies the finished shapes.
    let existing = if args.out.exists() {
        Some(TuningRecord::load(&args.out)?)
    } else {
        None
    };
    let same = |e: &DeviceEntry| {
        e.fingerprint.mismatch(&fingerprint).is_none()
            && e.generator == generator
            && e.backend == kind.name()
            && e.format == format
            && e.model == job.model
            && e.threads == threads
    };
    let mut done: Vec<ShapeEntry> = Vec::new();
    if args.resume {
        let Some(record) = &existing else {
            return Err(CliError::Usage(format!(
                "nothing to resume: {} does not exist",
                args.out.display()
            )));
        };
        match record.entries.iter().find(|e| same(e)) {
            None if job.resume_fresh_ok => {}
            None => {
                return Err(CliError::Usage(format!(
                    "nothing to resume: {} has no entry for this device, generator, backend `{kind}`, format `{}`, model `{}` and {threads} thread(s)",
                    args.out.display(),
                    format,
                    job.model
                )));
            }
            Some(entry) if !entry.partial => {
                println!(
                    "{} is already complete for format {format}; nothing to resume",
                    args.out.display()
                );
                return Ok(());
            }
            Some(entry) => done = entry.shapes.clone(),
        }
    }

    let quiet = args.quiet;
    let say = |msg: String| {
        if !quiet {
            eprintln!("{msg}");
        }
    };
    let device = match &target {
        Target::OpenCl(t) => format!("{} on {}", caps.name, t.device_name()),
        Target::Host(_) => caps.name.to_string(),
    };
    say(format!(
        "tuning {} ({} shape(s)) with backend {kind} ({device}), format {format} ({kernel_name}), {threads} thread(s), budget {:.0} s",
        job.model,
        shapes.len(),
        job.budget
    ));
    let quick = job.budget < 20.0;
    let llc = limits::llc_bytes(&fingerprint);
    let (measured, core_weights, path_name) = match &target {
        Target::Host(b) => {
            let path = mac_path(class, b.as_ref(), &kernel);
            (
                limits::measure(&fingerprint, path, threads, quick),
                limits::core_weights(&fingerprint, path),
                path.describe(),
            )
        }
        Target::OpenCl(t) => (
            t.limits(llc, quick)
                .map_err(|e| CliError::Io(format!("measuring the OpenCL device: {e}")))?,
            vec![1.0],
            "f32 mad on the OpenCL device".to_string(),
        ),
    };
    say(format!(
        "limits: read {:.1} GB/s, peak {:.1} GMAC/s ({path_name})",
        measured.read_gbps, measured.mac_gops,
    ));
    // One weight per thread at least (a record says so): threads beyond
    // the CPUs measured share the machine and weigh 1.
    let mut core_weights = core_weights;
    if core_weights.len() < threads {
        core_weights.resize(threads, 1.0);
    }

    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        // A second handler cannot be installed (tests run `run` twice in one
        // process): the first stays and still sets a flag; ignore the error.
        let _ = ctrlc::set_handler(move || stop.store(true, Ordering::Relaxed));
    }
    let mm = kernel
        .as_matmul()
        .ok_or_else(|| CliError::Usage("not a matmul".into()))?;
    let fmt = |t: &str| kernel.tensor(t).map(|t| t.format);
    let traffic = match (fmt(&mm.x), fmt(&mm.w), fmt(&mm.y)) {
        (Some(x), Some(w), Some(y)) => Traffic { x, w, y },
        _ => {
            return Err(CliError::Usage(format!(
                "kernel `{}` lacks a tensor",
                kernel.name
            )));
        }
    };
    let budget = Duration::from_secs_f64(job.budget);
    let cfg = TuneConfig {
        threads,
        deadline: budget.saturating_sub(RESERVE),
        neighbours: 2,
        min_samples: 3,
        max_samples: 25,
        limits: measured.clone(),
        traffic,
        target: caps.name.to_string(),
        kernel: Some(kernel.clone()),
        one_weight_copy: args.one_weight_copy,
    };
    let accept = |t: &TileConfig| target.accepts(&kernel, t);
    let solver = SolverCtx {
        caps,
        gemv_caps,
        gemm_caps,
        class,
        weight_dequant: problem.weight_dequant,
        weight_groups: problem.weight_groups,
        nibble_runs: problem.nibble_runs,
        accept: &accept,
    };
    // The weight stream's prefetch first (x86: distance and cache level),
    // so the shapes' tiles are timed as the runtime will emit them.
    let weight_prefetch = match (&target, shapes.iter().max_by_key(|s| s.n * s.k)) {
        (Target::Host(b), Some(largest)) if b.weight_prefetch_choices(&kernel).is_some() => {
            prefetch::tune(
                b.as_ref(),
                &prefetch::Setup {
                    kernel: &kernel,
                    solver: &solver,
                    shape: largest,
                    threads,
                    llc_bytes: llc,
                    start,
                    stop: stop.clone(),
                },
            )
            .map_err(CliError::Usage)?
        }
        _ => None,
    };
    let prefetching: Option<Box<dyn backend::TuneBackend>> = match (&target, &weight_prefetch) {
        (Target::Host(b), Some(p)) => Some(
            b.with_weight_prefetch(&kernel, p.chosen)
                .map_err(CliError::Usage)?,
        ),
        _ => None,
    };
    let mut bench: Box<dyn Bench + '_> = match &target {
        Target::Host(b) => Box::new(
            HostBench::new(
                prefetching.as_deref().unwrap_or(b.as_ref()),
                kernel.clone(),
                threads,
                llc,
                start,
                stop.clone(),
            )
            .map_err(CliError::Usage)?,
        ),
        Target::OpenCl(t) => Box::new(t.bench(llc, &measured, start, stop.clone())),
    };

    let entry_for = |shapes: Vec<ShapeEntry>, partial: bool| DeviceEntry {
        fingerprint: fingerprint.clone(),
        generator: generator.clone(),
        backend: kind.name().to_string(),
        format: format.clone(),
        model: job.model.to_string(),
        threads,
        partial,
        created_unix: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        limits: measured.clone(),
        core_weights: core_weights.clone(),
        shapes,
        prefill: None,
        decode: None,
        weight_prefetch: weight_prefetch.clone(),
    };
    let save = |entry: DeviceEntry| -> Result<(), CliError> {
        let base = existing.clone().unwrap_or_default();
        let record = base.merge(TuningRecord {
            entries: vec![entry],
            ..TuningRecord::default()
        });
        record.save(&args.out).map_err(CliError::from)
    };

    let bar = if quiet {
        ProgressBar::hidden()
    } else {
        let b =
            ProgressBar::with_draw_target(Some(shapes.len() as u64), ProgressDrawTarget::stderr());
        b.set_style(
            ProgressStyle::with_template("{elapsed:>4} [{bar:24}] {pos}/{len} shapes  {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        b.set_position(done.len() as u64);
        b
    };
    let mut finished: Vec<ShapeEntry> = done.clone();
    let mut save_error: Option<CliError> = None;
    let mut skipped: Vec<String> = Vec::new();
    let outcome = tune::tune(
        &mut *bench,
        &solver,
        &shapes,
        &done,
        &cfg,
        &mut |event| match event {
            Event::ShapeStarted { name, .. } => bar.set_message(name),
            Event::Phase(p) => bar.set_message(p),
            Event::Measured => bar.tick(),
            Event::Skipped { candidate, why } => {
                let line = format!("{candidate}: {why}");
                if !skipped.contains(&line) {
                    skipped.push(line);
                }
            }
            Event::ShapeDone { entry, .. } => {
                bar.inc(1);
                finished.push(*entry);
                // Saved as it goes, so an interrupted run leaves what it had.
                let ordered: Vec<ShapeEntry> = shapes
                    .iter()
                    .filter_map(|s| finished.iter().find(|f| f.n == s.n && f.k == s.k).cloned())
                    .collect();
                if let Err(e) = save(entry_for(ordered, true)) {
                    save_error.get_or_insert(e);
                }
            }
        },
    )?;
    bar.finish_and_clear();
    if let Some(e) = save_error {
        return Err(e);
    }
    let partial = outcome.stopped.is_some();
    let mut entry = entry_for(outcome.shapes.clone(), partial);
    // The prefill blocks for the model's heads, on a backend with a whole
    // prefill, once the matmuls are done (a run out of budget skips them).
    if let (Target::Host(b), Some(heads), false) = (&target, job.attention, partial) {
        entry.prefill = prefill::tune(
            &|k, blocks| b.prefill(k, blocks),
            heads,
            threads,
            PREFILL_SLICE,
        )
        .map_err(CliError::Usage)?;
        entry.decode = decode::tune(
            &|k, packed, lanes, int8_q| b.decode_attention(k, packed, lanes, int8_q),
            decode::DecodeForms {
                packed: b.packed_fp8_form(),
                key_lanes: b.has_int8_key_lanes(),
            },
            heads,
            threads,
            DECODE_SLICE,
        )
        .map_err(CliError::Usage)?;
    }
    save(entry.clone())?;

    println!("{}", report::summary(&entry, &path_name));
    if let Some(p) = &entry.prefill {
        let ms = |b: [u32; 2]| {
            p.measurements
                .iter()
                .find(|m| m.blocks == b)
                .map_or(f64::NAN, |m| m.ms)
        };
        println!(
            "prefill blocks ({} / {} heads × {}, s = {}): {}x{} at {:.2} ms{}",
            p.heads,
            p.kv_heads,
            p.head_dim,
            p.seq,
            p.blocks[0],
            p.blocks[1],
            ms(p.blocks),
            if p.blocks == p.default {
                format!(
                    " (the default; no candidate beat it by {:.0}% twice)",
                    (prefill::MARGIN - 1.0) * 100.0
                )
            } else {
                format!(
                    " (default {}x{} at {:.2} ms)",
                    p.default[0],
                    p.default[1],
                    ms(p.default)
                )
            }
        );
    }
    if let Some(p) = &entry.weight_prefetch {
        let us = |c: PrefetchChoice| {
            p.measurements
                .iter()
                .find(|m| m.choice == c)
                .map_or(f64::NAN, |m| m.us)
        };
        let alone = |c: PrefetchChoice| {
            p.measurements
                .iter()
                .find(|m| m.choice == c)
                .and_then(|m| m.us_one_thread)
                .map_or(String::new(), |t| format!(", one thread {t:.0} µs"))
        };
        let others: Vec<String> = p
            .measurements
            .iter()
            .filter(|m| m.choice != p.chosen)
            .map(|m| format!("{} {:.0} µs{}", m.choice, m.us, alone(m.choice)))
            .collect();
        println!(
            "{} weight prefetch ([{}, {}], M = {:?}): {} at {:.0} µs{}{} ({})",
            p.stream,
            p.shape[0],
            p.shape[1],
            p.m,
            p.chosen,
            us(p.chosen),
            alone(p.chosen),
            if p.chosen == p.default {
                format!(
                    ", the default; no other beat it by {:.0}% twice",
                    (prefetch::MARGIN - 1.0) * 100.0
                )
            } else {
                String::new()
            },
            others.join("; ")
        );
    }
    if let Some(p) = &entry.decode {
        let us = |ms: &[(bool, f64)], form: bool| {
            ms.iter()
                .find(|&&(f, _)| f == form)
                .map_or(f64::NAN, |&(_, us)| us)
        };
        if !p.measurements.is_empty() {
            let ms: Vec<_> = p
                .measurements
                .iter()
                .map(|m| (m.fp8_values_packed, m.us))
                .collect();
            print_decode_duel(
                p,
                "fp8 values",
                p.fp8_values_packed,
                [
                    (p.packed.as_str(), us(&ms, true)),
                    ("f32 FMAs", us(&ms, false)),
                ],
                "FMAs",
            );
        }
        if let Some(lanes) = p.int8_keys_in_lanes {
            let ms: Vec<_> = p
                .key_measurements
                .iter()
                .map(|m| (m.in_lanes, m.us))
                .collect();
            print_decode_duel(
                p,
                "int8 keys",
                lanes,
                [("in lanes", us(&ms, true)), ("in pairs", us(&ms, false))],
                "pairs",
            );
        }
        if let Some(int8_q) = p.int8_q_in_lanes {
            let ms: Vec<_> = p.q_measurements.iter().map(|m| (!m.int8_q, m.us)).collect();
            print_decode_duel(
                p,
                "q for keys in lanes",
                !int8_q,
                [
                    ("i16", us(&ms, true)),
                    ("int8 in 32-d blocks", us(&ms, false)),
                ],
                "int8 q",
            );
        }
    }
    if !skipped.is_empty() {
        println!("skipped candidates (the backend could not build them):");
        for s in &skipped {
            println!("  {s}");
        }
    }
    if !args.no_plots && !entry.shapes.is_empty() {
        let dir = plots_dir(args);
        write_plots(&entry, &dir)?;
        println!("plots: {}", dir.display());
    }
    println!(
        "record: {} ({} of {} shapes{}) in {:.1} s",
        args.out.display(),
        entry.shapes.len(),
        shapes.len(),
        if partial { ", PARTIAL" } else { "" },
        start.elapsed().as_secs_f64()
    );
    match outcome.stopped {
        None => Ok(()),
        Some(Stop::Budget) => Err(CliError::Partial {
            budget: job.budget,
            done: entry.shapes.len(),
            total: shapes.len(),
            out: args.out.display().to_string(),
        }),
        Some(Stop::Interrupted) => Err(CliError::Interrupted {
            done: entry.shapes.len(),
            total: shapes.len(),
            out: args.out.display().to_string(),
        }),
    }
}

/// One line of a decode form's duel: the form chosen (`default` true: the
/// first of `forms`, each with its median µs) and, where the default
/// stayed, what the other (`challenger`) needs to switch.
fn print_decode_duel(
    p: &tessera_runtime::record::DecodeEntry,
    what: &str,
    default: bool,
    forms: [(&str, f64); 2],
    challenger: &str,
) {
    let [(first, first_us), (second, second_us)] = forms;
    println!(
        "decode {what} ({} / {} heads × {}, {} keys): {} ({first} {first_us:.0} µs, {second} {second_us:.0} µs{})",
        p.heads,
        p.kv_heads,
        p.head_dim,
        p.ctx,
        if default { first } else { second },
        if default {
            format!(
                "; {challenger} need {:.0}% twice to switch",
                (decode::MARGIN - 1.0) * 100.0
            )
        } else {
            String::new()
        }
    );
}
