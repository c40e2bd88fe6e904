//! Runs one Qwen2-1.5B `Linear` (the `o` projection, `[1536, 1536]`,
//! W4A16) from kernels generated at build time, without any JIT: `build.rs`
//! wrote them with `tessera-kernels-gen` and `kernels.rs` embeds them in
//! this binary (no file I/O for code at run time).
//!
//! Steps: refuse kernels from another generator (`Manifest::check`),
//! verify every embedded kernel against the manifest's hash, then dispatch
//! by M to the OpenCL kernel (GEMV for M = 1, flat GEMM for M = 5, GEMM for
//! M = 40), run it on the first OpenCL device (PoCL on a CPU-only machine)
//! and compare with the reference interpreter. Without an OpenCL platform
//! it says SKIP and exits 0. The `aarch64-i8mm` and `ptx-sm80` kernels are
//! embedded and verified too; they run on an i8mm phone (the runtime's
//! `prebuilt` loader) and an Ampere GPU (the `cuda` feature).

include!(concat!(env!("OUT_DIR"), "/kernels.rs"));

use std::process::ExitCode;

use half::f16;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tessera_codegen::gpu::{self, WeightMemory};
use tessera_codegen::opencl::{self as cl_codegen, Program};
use tessera_codegen::tile::{Problem, REPRESENTATIVE_EXTENT, solve};
use tessera_dsl::interp::{Bindings, Value, run};
use tessera_dsl::ir::Variant;
use tessera_dsl::library;
use tessera_dsl::quant::quantize;
use tessera_runtime::manifest::{EmbeddedCode, EmbeddedKernel, Manifest};
use tessera_runtime::opencl::{ClDevice, run_matmul};
use tessera_runtime::record::GeneratorId;

/// The weight shape and format run here: Qwen2-1.5B's `o` projection.
const N: usize = 1536;
const K: usize = 1536;
const FORMAT: &str = "w4a16";

fn main() -> ExitCode {
    match run_example() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run_example() -> Result<(), String> {
    let generator = GeneratorId {
        version: tessera_codegen::GENERATOR_VERSION.to_string(),
        template_hash: tessera_codegen::TEMPLATE_HASH.to_string(),
    };
    let manifest =
        Manifest::from_json(MANIFEST_JSON, "manifest.json").map_err(|e| e.to_string())?;
    manifest.check(&generator).map_err(|e| e.to_string())?;
    if manifest.entries.len() != KERNELS.len() {
        return Err(format!(
            "kernels.rs has {} kernels, the manifest {}",
            KERNELS.len(),
            manifest.entries.len()
        ));
    }
    for (embedded, entry) in KERNELS.iter().zip(&manifest.entries) {
        embedded.check(&generator).map_err(|e| e.to_string())?;
        let bytes = match embedded.code {
            EmbeddedCode::Source(text) => text.as_bytes(),
            EmbeddedCode::Machine { bytes, .. } => bytes,
        };
        Manifest::verify(entry, bytes).map_err(|e| e.to_string())?;
    }
    println!(
        "{} prebuilt kernels for {} (generator {} {}), all verified:",
        KERNELS.len(),
        manifest.model,
        GENERATOR_VERSION,
        TEMPLATE_HASH
    );
    for target in ["aarch64-i8mm", "opencl", "ptx-sm80"] {
        let mut names: Vec<&str> = KERNELS
            .iter()
            .filter(|k| k.target == target)
            .map(|k| k.kernel)
            .collect();
        names.sort_unstable();
        names.dedup();
        println!(
            "  {target}: {} distinct kernels, e.g. {}",
            names.len(),
            names.first().unwrap_or(&"-")
        );
    }

    let dev = match ClDevice::first() {
        Ok(d) => d,
        Err(e) => {
            println!("SKIP the OpenCL Linear: {e}");
            return Ok(());
        }
    };
    println!("OpenCL device: {} ({})", dev.name, dev.version);
    let mut rng = ChaCha8Rng::seed_from_u64(12);
    for m in [1, 5, 40] {
        let embedded =
            EmbeddedKernel::find(KERNELS, "opencl", FORMAT, N, K, m).ok_or_else(|| {
                format!("no prebuilt opencl {FORMAT} kernel for [{N}, {K}] at M = {m}")
            })?;
        let worst = linear(&dev, embedded, m, &mut rng)?;
        println!(
            "  M = {m:>2}: {} ({}) matches the reference interpreter (worst error {worst:.2} of the tolerance)",
            embedded.kernel, embedded.variant
        );
    }
    Ok(())
}

/// The launch plan of an embedded OpenCL kernel. Planning is arithmetic on
/// the kernel description (no code is generated): the same solver problem
/// the generator posed for this variant and shape, the tile the manifest
/// names, the plan that binds and sizes the launch.
fn program(embedded: &EmbeddedKernel) -> Result<Program, String> {
    let EmbeddedCode::Source(source) = embedded.code else {
        return Err(format!("{} is not source text", embedded.kernel));
    };
    let library_kernel =
        library::get(&format!("matmul-{}", embedded.format)).map_err(|e| e.to_string())?;
    let kernel = gpu::with_gpu_weight_layout(&library_kernel).map_err(|e| e.to_string())?;
    let caps = cl_codegen::caps();
    let mut problem = Problem::from_kernel(caps, &kernel).map_err(|e| e.to_string())?;
    problem.e = match embedded.variant {
        Variant::Gemv => 1,
        Variant::FlatGemm => 8,
        Variant::Gemm => REPRESENTATIVE_EXTENT,
    };
    problem.h = embedded.n as u64;
    problem.l = embedded.k as u64;
    let [ep, hp, lp] = embedded.tile;
    let tile = solve(caps, &problem)
        .map_err(|e| e.to_string())?
        .into_iter()
        .find(|t| t.ep == ep && t.hp == hp && t.lp == lp)
        .ok_or_else(|| {
            format!(
                "tile {ep}x{hp}x{lp} of {} is not a solver tile",
                embedded.kernel
            )
        })?;
    let plan = gpu::plan_matmul(&kernel, &tile, embedded.variant, caps, WeightMemory::Buffer)
        .map_err(|e| e.to_string())?;
    if !source.contains(&format!("{}(", plan.entry)) {
        return Err(format!(
            "{}: the embedded source has no entry point `{}`",
            embedded.kernel, plan.entry
        ));
    }
    Ok(Program::Matmul {
        plan,
        source: source.to_string(),
    })
}

/// Run `m` rows through the embedded kernel and the reference interpreter;
/// returns the worst error as a fraction of its tolerance (≤ 1).
fn linear(
    dev: &ClDevice,
    embedded: &EmbeddedKernel,
    m: usize,
    rng: &mut ChaCha8Rng,
) -> Result<f64, String> {
    let program = program(embedded)?;
    let (e, h, l) = (m, N, K);
    let x: Vec<f16> = (0..e * l)
        .map(|_| f16::from_f32(rng.gen_range(-1.0..1.0)))
        .collect();
    let raw: Vec<f32> = (0..h * l).map(|_| rng.gen_range(-0.5..0.7)).collect();
    let library_kernel =
        library::get(&format!("matmul-{}", embedded.format)).map_err(|e| e.to_string())?;
    let format = library_kernel
        .tensor("w")
        .ok_or("the library kernel has no `w`")?
        .format;
    let q = quantize(format, h, l, &raw).map_err(|e| e.to_string())?;
    let dense = q.dequantize();
    let w = Value::Quant(q);
    let bias: Vec<f32> = (0..h).map(|_| rng.gen_range(-1.0..1.0)).collect();

    let got = run_matmul(dev, &program, &x, &w, Some(&bias), e, h, l).map_err(|e| e.to_string())?;
    let bindings = Bindings::new()
        .extent("e", e)
        .extent("h", h)
        .extent("l", l)
        .tensor("x", Value::F16(x.clone()))
        .tensor("w", w)
        .tensor("bias", Value::F32(bias.clone()));
    let want = run(&library_kernel, &bindings)
        .map_err(|e| e.to_string())?
        .get("y")
        .ok_or("the interpreter gave no `y`")?
        .to_vec();
    if got.len() != want.len() {
        return Err(format!("{} outputs, expected {}", got.len(), want.len()));
    }
    // Error relative to Σ|x·w| + |bias|: f32 sums (GEMV) or weights staged
    // as halves (tiled), as the OpenCL differential tests bound it.
    let rel = if embedded.variant == Variant::Gemv {
        2e-5
    } else {
        2f64.powi(-10)
    };
    let mut worst = 0.0f64;
    for ei in 0..e {
        for hi in 0..h {
            let magnitude: f64 = (0..l)
                .map(|li| {
                    f64::from(x[ei * l + li].to_f32()).abs() * f64::from(dense[hi * l + li]).abs()
                })
                .sum::<f64>()
                + f64::from(bias[hi].abs());
            let tol = rel * magnitude + 1e-5;
            let i = ei * h + hi;
            let err = (f64::from(got[i]) - f64::from(want[i])).abs();
            if err > tol {
                return Err(format!(
                    "{} M = {m}: y[{ei}, {hi}] = {} but the reference says {} (tolerance {tol:.2e})",
                    embedded.kernel, got[i], want[i]
                ));
            }
            worst = worst.max(err / tol);
        }
    }
    Ok(worst)
}
