//! A [`Device`] on CUDA (feature `cuda`): device 0 through the driver
//! opened at run time, PTX programs from `tessera_codegen::ptx` planned
//! once per (variant, tile) and shared by every layer.
//!
//! Each program's module is loaded once per device ([`CudaMatmul`],
//! [`CudaAttention`]); `Linear` uploads its weights once and `Attention`
//! reads a KV cache kept in device memory (`crate::cuda::resident`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tessera_codegen::ptx::{PtxBackend, PtxProgram};
use tessera_codegen::tile::TileConfig;
use tessera_dsl::ir::Variant;

use super::gpu::{default_tile, gpu_kernel, no_kernel, recorded_tile};
use super::{Backend, Device, Engine, lock, unavailable};
use crate::cuda::{CudaAttention, CudaDevice, CudaMatmul, CudaPrefill};
use crate::device::{GpuInfo, fnv1a};
use crate::dispatch::ShapePlan;
use crate::error::RuntimeError;
use crate::format::WeightFormat;

/// The CUDA side of a device.
pub(crate) struct CudaEngine {
    pub(crate) dev: CudaDevice,
    backend: PtxBackend,
    programs: Mutex<BTreeMap<u64, Arc<PtxProgram>>>,
    /// Loaded modules by program text hash.
    matmuls: Mutex<BTreeMap<u64, Arc<CudaMatmul>>>,
    attentions: Mutex<BTreeMap<String, Arc<CudaAttention>>>,
    /// Loaded prefill programs by (library kernel, head dim).
    prefills: Mutex<BTreeMap<(String, usize), Arc<CudaPrefill>>>,
}

impl CudaEngine {
    /// Device 0, or why there is none (no driver, no device, too old).
    pub(super) fn open() -> Result<CudaEngine, RuntimeError> {
        let dev = CudaDevice::first().map_err(|e| unavailable(Backend::Cuda, e.to_string()))?;
        let backend = dev.backend();
        Ok(CudaEngine {
            dev,
            backend,
            programs: Mutex::new(BTreeMap::new()),
            matmuls: Mutex::new(BTreeMap::new()),
            attentions: Mutex::new(BTreeMap::new()),
            prefills: Mutex::new(BTreeMap::new()),
        })
    }

    pub(super) fn gpu_info(&self) -> GpuInfo {
        GpuInfo {
            api: "cuda".into(),
            platform: format!("{:?}", self.dev.sm()),
            device: self.dev.name().to_string(),
            driver: String::new(),
        }
    }

    pub(super) fn prepared_matmuls(&self) -> usize {
        lock(&self.programs).len()
    }

    /// `program`'s module, loaded on first use.
    pub(crate) fn matmul(&self, program: &PtxProgram) -> Result<Arc<CudaMatmul>, RuntimeError> {
        let key = fnv1a(program.text.as_bytes());
        if let Some(m) = lock(&self.matmuls).get(&key) {
            return Ok(Arc::clone(m));
        }
        let loaded = Arc::new(CudaMatmul::new(&self.dev, program).map_err(gpu_error)?);
        Ok(Arc::clone(lock(&self.matmuls).entry(key).or_insert(loaded)))
    }

    /// The decode attention program of library kernel `name`, loaded on
    /// first use.
    pub(crate) fn attention(&self, name: &str) -> Result<Arc<CudaAttention>, RuntimeError> {
        if let Some(a) = lock(&self.attentions).get(name) {
            return Ok(Arc::clone(a));
        }
        let kernel = tessera_dsl::library::get(name)?;
        let program = self.backend.attention_program(&kernel).map_err(gpu_error)?;
        let loaded = Arc::new(CudaAttention::new(&self.dev, &program).map_err(gpu_error)?);
        Ok(Arc::clone(
            lock(&self.attentions)
                .entry(name.to_string())
                .or_insert(loaded),
        ))
    }
}

impl CudaEngine {
    /// The tensor-core prefill program of library kernel `name` for head
    /// dim `d`, loaded on first use; None where the tensor-core loop does
    /// not take `d` (not a multiple of 16, or past
    /// [`tessera_codegen::gpu::PREFILL_MAX_HEAD_DIM`]): prefill then
    /// decodes per prompt token.
    pub(crate) fn prefill(
        &self,
        name: &str,
        d: usize,
    ) -> Result<Option<Arc<CudaPrefill>>, RuntimeError> {
        if !d.is_multiple_of(16) || d > tessera_codegen::gpu::PREFILL_MAX_HEAD_DIM as usize {
            return Ok(None);
        }
        let key = (name.to_string(), d);
        if let Some(p) = lock(&self.prefills).get(&key) {
            return Ok(Some(Arc::clone(p)));
        }
        let kernel = tessera_dsl::library::get(name)?;
        let program = self
            .backend
            .prefill_program(&kernel, d)
            .map_err(gpu_error)?;
        let loaded = Arc::new(CudaPrefill::new(&self.dev, &program).map_err(gpu_error)?);
        Ok(Some(Arc::clone(
            lock(&self.prefills).entry(key).or_insert(loaded),
        )))
    }
}

fn gpu_error(e: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Gpu {
        backend: "cuda".into(),
        why: e.to_string(),
    }
}

impl Device {
    /// The CUDA device this runtime device runs on (for streams, events
    /// and device buffers of the caller's own); None on other backends.
    pub fn cuda(&self) -> Option<&CudaDevice> {
        self.cuda_engine().ok().map(|e| &e.dev)
    }

    pub(crate) fn cuda_engine(&self) -> Result<&CudaEngine, RuntimeError> {
        match &self.engine {
            Engine::Cuda(e) => Ok(e),
            #[allow(unreachable_patterns)]
            _ => Err(RuntimeError::Unsupported {
                backend: self.backend.to_string(),
                what: "a CUDA kernel".into(),
            }),
        }
    }

    /// The dispatch plan of [n, k] and its three PTX programs.
    pub(crate) fn plan_shape_cuda(
        &self,
        format: WeightFormat,
        n: usize,
        k: usize,
    ) -> Result<(ShapePlan, [Arc<PtxProgram>; 3]), RuntimeError> {
        let engine = self.cuda_engine()?;
        let kernel = gpu_kernel(format, self.backend)?;
        let caps = engine.backend.sm.caps();
        let build = |variant: Variant, config: &TileConfig| {
            let program = engine
                .backend
                .program(&kernel, config, variant)
                .map_err(|e| no_kernel(format!("{} {variant}", kernel.name), e))?;
            let key = fnv1a(program.text.as_bytes());
            let mut programs = lock(&engine.programs);
            Ok::<_, RuntimeError>(Arc::clone(
                programs.entry(key).or_insert_with(|| Arc::new(program)),
            ))
        };
        let winner = |variant: Variant, tile3: [u32; 3]| {
            recorded_tile(caps, &kernel, (variant, tile3), (n, k), &build)
        };
        let default =
            |variant: Variant| default_tile(caps, &kernel, variant, (n, k), Backend::Cuda, &build);
        self.plan_with(&kernel, format, n, k, &winner, &default)
    }
}
