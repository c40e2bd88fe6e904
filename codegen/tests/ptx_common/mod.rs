//! Shared by the PTX tests: the kernel set, solver tiles, and `ptxas -v`.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;

use tessera_codegen::artifact::Variant;
use tessera_codegen::gpu;
use tessera_codegen::ptx::Sm;
use tessera_codegen::{Problem, TileConfig, solve};
use tessera_dsl::{Kernel, library};

/// The GPU matmul kernels: the library's A16 kernels and f16 weights in
/// the GPU layout.
pub fn matmuls() -> Vec<Kernel> {
    let mut v: Vec<Kernel> = library::gpu_matmul_names()
        .iter()
        .map(|n| library::get(n).unwrap())
        .collect();
    v.push(gpu::with_gpu_weight_layout(&library::get("matmul-f16").unwrap()).unwrap());
    v
}

/// Rows each variant is solved for.
pub fn rows(v: Variant) -> u64 {
    match v {
        Variant::Gemv => 1,
        Variant::FlatGemm => 8,
        Variant::Gemm => 4096,
    }
}

/// The solver's ranked tiles for `kernel` at `e` rows on `sm`.
pub fn tiles(sm: Sm, kernel: &Kernel, e: u64) -> Vec<TileConfig> {
    let caps = sm.caps();
    let mut p = Problem::from_kernel(caps, kernel).unwrap();
    p.e = e;
    solve(caps, &p).unwrap()
}

/// `ptxas`: `$PTXAS`, else on PATH, else the pip wheel in Tessera's cache
/// folder (scripts/test.sh installs it there) or in Python's site packages.
pub fn ptxas() -> Option<PathBuf> {
    let works = |p: &PathBuf| {
        Command::new(p)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    let mut candidates = Vec::new();
    if let Some(p) = std::env::var_os("PTXAS") {
        candidates.push(PathBuf::from(p));
    }
    candidates.push(PathBuf::from("ptxas"));
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")));
    if let Some(c) = cache {
        candidates.push(c.join("tessera/nvcc/nvidia/cuda_nvcc/bin/ptxas"));
    }
    if let Ok(out) = Command::new("python3")
        .args(["-m", "pip", "show", "nvidia-cuda-nvcc-cu12"])
        .output()
        && let Some(loc) = String::from_utf8_lossy(&out.stdout)
            .lines()
            .find_map(|l| l.strip_prefix("Location: "))
    {
        candidates.push(PathBuf::from(loc.trim()).join("nvidia/cuda_nvcc/bin/ptxas"));
    }
    let found = candidates.into_iter().find(works);
    if found.is_none() {
        tessera_dsl::testing::missing_tool(
            "ptxas checks",
            "ptxas not found (set PTXAS, or run scripts/test.sh, which pip-installs \
             nvidia-cuda-nvcc-cu12)",
        );
    }
    found
}

/// What `ptxas -v` reports for one entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PtxasReport {
    pub registers: u32,
    pub spill_stores: u32,
    pub spill_loads: u32,
    pub stack_frame: u32,
}

/// The number before `unit` in `text` (`"40 registers"` → 40).
fn number_before(text: &str, unit: &str) -> Option<u32> {
    let at = text.find(unit)?;
    text[..at].split_whitespace().last()?.parse().ok()
}

/// Parses `ptxas -v` output (one entry function).
pub fn parse_report(out: &str) -> Option<PtxasReport> {
    let used = out.lines().find(|l| l.contains("Used "))?;
    let props = out.lines().find(|l| l.contains("spill stores"))?;
    Some(PtxasReport {
        registers: number_before(used, " registers")?,
        spill_stores: number_before(props, " bytes spill stores")?,
        spill_loads: number_before(props, " bytes spill loads")?,
        stack_frame: number_before(props, " bytes stack frame")?,
    })
}

/// Runs `ptxas -arch=<sm> -v` on `text`; the combined log, or the error.
fn run_ptxas(ptxas: &PathBuf, sm: Sm, name: &str, text: &str) -> Result<String, String> {
    let dir = std::env::temp_dir().join(format!("tessera-ptx-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let src = dir.join(format!("{name}-{}.ptx", sm.arch()));
    let obj = dir.join(format!("{name}-{}.cubin", sm.arch()));
    std::fs::write(&src, text).map_err(|e| e.to_string())?;
    let out = Command::new(ptxas)
        .arg(format!("-arch={}", sm.arch()))
        .arg("-v")
        .arg("-o")
        .arg(&obj)
        .arg(&src)
        .output()
        .map_err(|e| e.to_string())?;
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() {
        return Err(format!("{name} ({}): ptxas failed:\n{log}", sm.arch()));
    }
    Ok(log)
}

/// Assembles `text` for `sm` and returns the report, or the error output.
pub fn assemble(ptxas: &PathBuf, sm: Sm, name: &str, text: &str) -> Result<PtxasReport, String> {
    let log = run_ptxas(ptxas, sm, name, text)?;
    parse_report(&log).ok_or_else(|| format!("{name}: cannot parse the ptxas report:\n{log}"))
}

/// Assembles a module with several entries; one report per entry, by
/// entry name, in the order ptxas prints them.
pub fn assemble_entries(
    ptxas: &PathBuf,
    sm: Sm,
    name: &str,
    text: &str,
) -> Result<Vec<(String, PtxasReport)>, String> {
    let log = run_ptxas(ptxas, sm, name, text)?;
    let marker = "Compiling entry function '";
    let mut out = Vec::new();
    for section in log.split(marker).skip(1) {
        let entry = section.split('\'').next().unwrap_or_default().to_string();
        let report = parse_report(section)
            .ok_or_else(|| format!("{name}: cannot parse the report of {entry}:\n{log}"))?;
        out.push((entry, report));
    }
    Ok(out)
}
