//! What the GPU backends (OpenCL, CUDA) share on the device side: which
//! library kernel a format runs as (weights in the GPU layout) and the
//! solver problem each variant's tile is chosen for.

use tessera_codegen::gpu;
use tessera_codegen::tile::Problem;
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
            "the GPU matmuls take f16 activations: use f16, w4a16, w8a16 or e0m4a16".into(),
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
