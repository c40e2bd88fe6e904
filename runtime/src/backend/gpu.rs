//! What the GPU backends (OpenCL, CUDA) share on the device side: which
//! library kernel a format runs as (weights in the GPU layout), the solver
//! problem each variant's tile is chosen for, and how a record's tile or the
//! solver's default becomes a built program.

use tessera_codegen::gpu;
use tessera_codegen::tile::{self, Problem, TileConfig};
use tessera_dsl::ir::{Format, Kernel, Variant};
use tessera_dsl::library;

use super::Backend;
use crate::dispatch::representative_m;
use crate::error::RuntimeError;
use crate::format::WeightFormat;

/// The format's library kernel with its weights in the GPU layout, or why
/// the format has no GPU matmul.
pub(crate) fn gpu_kernel(format: WeightFormat, backend: Backend) -> Result<Kernel, RuntimeError> {
    let kernel = library::get(format.library_kernel())?;
    let refuse = |why: String| RuntimeError::Unsupported {
        backend: backend.to_string(),
        what: format!("format {format} ({why})"),
    };
    let x = kernel
        .as_matmul()
        .and_then(|m| kernel.tensor(&m.x))
        .map(|t| t.format);
    if x != Some(Format::F16) {
        return Err(refuse(
            "the GPU matmuls take f16 activations: use f16, w4a16, w8a16, e0m4a16, q4_0a16, q4_1a16 or q8_0a16".into(),
        ));
    }
    gpu::with_gpu_weight_layout(&kernel).map_err(|e| refuse(e.to_string()))
}

/// The solver's problem for `variant` of [n, k] on `caps`.
pub(crate) fn gpu_problem(
    caps: &tessera_codegen::TargetCaps,
    kernel: &Kernel,
    variant: Variant,
    n: usize,
    k: usize,
) -> Result<Problem, RuntimeError> {
    let base = Problem::from_kernel(caps, kernel).map_err(|e| RuntimeError::NoKernel {
        what: kernel.name.clone(),
        why: e.to_string(),
    })?;
    Ok(Problem {
        e: representative_m(variant) as u64,
        h: n as u64,
        l: k as u64,
        ..base
    })
}

/// A kernel that could not be planned or built, and why.
pub(crate) fn no_kernel(what: impl Into<String>, why: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::NoKernel {
        what: what.into(),
        why: why.to_string(),
    }
}

/// The program for a tuning record's `tile3`, which must still be a
/// feasible tile for `variant` of [n, k] on `caps`.
pub(crate) fn recorded_tile<P>(
    caps: &tessera_codegen::TargetCaps,
    kernel: &Kernel,
    (variant, tile3): (Variant, [u32; 3]),
    (n, k): (usize, usize),
    build: &dyn Fn(Variant, &TileConfig) -> Result<P, RuntimeError>,
) -> Result<P, RuntimeError> {
    let problem = gpu_problem(caps, kernel, variant, n, k)?;
    let config = tile::feasible(caps, &problem)
        .map_err(|e| no_kernel(&kernel.name, e))?
        .into_iter()
        .find(|t| [t.ep, t.hp, t.lp] == tile3)
        .ok_or_else(|| {
            no_kernel(
                format!("{} tile {tile3:?}", kernel.name),
                format!("not a feasible tile on {}", caps.name),
            )
        })?;
    build(variant, &config)
}

/// The solver's best tile for `variant` that builds, with its program;
/// the last build error names why none did.
pub(crate) fn default_tile<P>(
    caps: &tessera_codegen::TargetCaps,
    kernel: &Kernel,
    variant: Variant,
    (n, k): (usize, usize),
    backend: Backend,
    build: &dyn Fn(Variant, &TileConfig) -> Result<P, RuntimeError>,
) -> Result<([u32; 3], P), RuntimeError> {
    let problem = gpu_problem(caps, kernel, variant, n, k)?;
    let tiles = tile::solve(caps, &problem).map_err(|e| no_kernel(&kernel.name, e))?;
    let mut last = format!("no {} tile for {backend}", kernel.name);
    for config in tiles {
        match build(variant, &config) {
            Ok(p) => return Ok(([config.ep, config.hp, config.lp], p)),
            Err(e) => last = e.to_string(),
        }
    }
    Err(no_kernel(
        format!("{} {variant} [{n}, {k}] on {backend}", kernel.name),
        last,
    ))
}
