//! A linear layer: weights packed once per distinct kernel tile at model
//! load (offline packing, TurboMind 4.1), and `forward` for any M, which
//! picks GEMV / flat GEMM / GEMM by M and splits the output channels over
//! the device's pool by per-core weights. Layers that read one input (Q, K
//! and V; gate and up) take it as a [`SharedInput`], quantized once.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use tessera_codegen::host::{
    HostInput, HostMatmul, HostOutput, HostTile, HostWeights, QuantizedInput, RangeExecutor,
    WeightsIn,
};
use tessera_dsl::ir::Variant;
use tessera_dsl::quant::{self, QuantTensor};

use crate::backend::Device;
use crate::dispatch::{ShapePlan, variant_index};
use crate::error::{RuntimeError, check_len, shape};
use crate::format::WeightFormat;
use crate::pool::split_weighted;

/// Activations as the caller holds them (f32 for f32 / W8A8 / W4A8, f16 for
/// f16 / W4A16).
pub type Input<'a> = HostInput<'a>;
/// The output buffer (f16 for the f16 format, else f32).
pub type Output<'a> = HostOutput<'a>;

/// Weights in their source form: f32 `[n, k]` row-major (converted or
/// quantized to the format once), or already quantized in the format.
#[derive(Clone, Copy, Debug)]
pub enum Weights<'a> {
    F32(&'a [f32]),
    Quant(&'a QuantTensor),
}

/// One input for every [`Linear`] that reads it (the Q, K and V
/// projections; gate and up), through [`Linear::forward_shared`]: W8A8 and
/// W4A8 layers quantize x once per distinct quantizer instead of once per
/// layer, as KleidiAI packs one LHS for several RHS. Layers whose kernels
/// quantize differently (another tile's layout, another weight group) each
/// get their own quantization, so sharing never changes a result.
pub struct SharedInput<'x> {
    x: Input<'x>,
    m: usize,
    quantized: Mutex<Vec<Arc<QuantizedInput>>>,
    spare: Mutex<Vec<QuantizedInput>>,
    quantizations: AtomicUsize,
}

/// The buffers of a finished [`SharedInput`], for the next one
/// ([`SharedInput::with_buffers`]), so a decode step allocates nothing.
#[derive(Debug, Default)]
pub struct InputBuffers(Vec<QuantizedInput>);

impl<'x> SharedInput<'x> {
    /// x of `m` rows (checked against each layer's k when it runs).
    pub fn new(x: Input<'x>, m: usize) -> SharedInput<'x> {
        SharedInput::with_buffers(x, m, InputBuffers::default())
    }

    /// [`SharedInput::new`], quantizing into an earlier input's buffers.
    pub fn with_buffers(x: Input<'x>, m: usize, buffers: InputBuffers) -> SharedInput<'x> {
        SharedInput {
            x,
            m,
            quantized: Mutex::new(Vec::new()),
            spare: Mutex::new(buffers.0),
            quantizations: AtomicUsize::new(0),
        }
    }

    /// Rows of x.
    pub fn m(&self) -> usize {
        self.m
    }

    /// How often x has been quantized so far: once per distinct quantizer
    /// among the layers that ran (0 for float layers).
    pub fn quantizations(&self) -> usize {
        self.quantizations.load(Ordering::Relaxed)
    }

    /// The buffers, for [`SharedInput::with_buffers`].
    pub fn into_buffers(self) -> InputBuffers {
        let mut buffers = self.spare.into_inner().unwrap_or_else(|e| e.into_inner());
        let quantized = self
            .quantized
            .into_inner()
            .unwrap_or_else(|e| e.into_inner());
        buffers.extend(
            quantized
                .into_iter()
                .filter_map(|q| Arc::try_unwrap(q).ok()),
        );
        InputBuffers(buffers)
    }

    /// x as `kernel` quantizes it: an earlier layer's quantization where
    /// the kernel reads it, else a new one (kept for the next layer).
    fn quantized_for(
        &self,
        kernel: &HostMatmul,
        k: usize,
        spread: (&RangeExecutor<'_>, usize),
    ) -> Result<Arc<QuantizedInput>, RuntimeError> {
        let mut quantized = self.quantized.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(q) = quantized.iter().find(|q| kernel.reads(q)) {
            return Ok(Arc::clone(q));
        }
        let HostInput::F32(x) = self.x else {
            return Err(shape(
                "x dtype for a quantizing kernel",
                "f32",
                "another dtype",
            ));
        };
        let reuse = self.spare.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let q = Arc::new(kernel.quantize_input_on(x, self.m, k, reuse, Some(spread))?);
        self.quantizations.fetch_add(1, Ordering::Relaxed);
        quantized
            .try_reserve(1)
            .map_err(|_| shape("shared input quantizations", "memory", "none left"))?;
        quantized.push(Arc::clone(&q));
        Ok(q)
    }
}

/// `y[m, n] = x[m, k] · wᵀ + bias`, dispatched by M.
pub struct Linear {
    device: Arc<Device>,
    format: WeightFormat,
    plan: ShapePlan,
    imp: Imp,
}

/// Where the kernels and packed weights live.
enum Imp {
    Host {
        kernels: [Arc<HostMatmul>; 3],
        /// The kernel of each flat step (`plan.flat_steps`), prepared on the
        /// first call at an M the step serves; None: it could not be
        /// prepared and the flat variant's own kernel serves instead.
        flat: Vec<OnceLock<Option<Arc<HostMatmul>>>>,
        /// Weights packed once per distinct packing (hp, lp; a flat step
        /// reads the copy of its own packing: the flat variant's, or the
        /// GEMV's or GEMM's).
        packed: Vec<HostWeights>,
        /// Which `packed` entry each variant (Gemv, FlatGemm, Gemm) uses.
        packed_of: [usize; 3],
        bias: Vec<f32>,
    },
    /// Three built programs over one upload: the GPU layout `[l/lp, h,
    /// lp]` does not depend on the tile.
    #[cfg(feature = "opencl")]
    OpenCl {
        kernels: [Arc<crate::opencl::ClMatmul>; 3],
        weights: crate::opencl::ClWeights,
    },
    /// Three loaded modules over one upload (the GPU layout does not
    /// depend on the tile).
    #[cfg(feature = "cuda")]
    Cuda {
        kernels: [Arc<crate::cuda::CudaMatmul>; 3],
        weights: crate::cuda::CudaWeights,
    },
}

impl std::fmt::Debug for Linear {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Linear")
            .field("format", &self.format)
            .field("backend", &self.device.backend())
            .field("plan", &self.plan.to_string())
            .field("packings", &self.packings())
            .finish()
    }
}

fn tile_of(t: [u32; 3]) -> HostTile {
    HostTile {
        ep: t[0] as usize,
        hp: t[1] as usize,
        lp: t[2] as usize,
    }
}

impl Linear {
    /// Plan [n, k] on `device`, prepare its kernels (once per device) and
    /// pack `weights` once per distinct tile. `bias` (n values) defaults
    /// to zeros.
    pub fn new(
        device: &Arc<Device>,
        format: WeightFormat,
        weights: Weights<'_>,
        n: usize,
        k: usize,
        bias: Option<&[f32]>,
    ) -> Result<Linear, RuntimeError> {
        let nk = n
            .checked_mul(k)
            .ok_or_else(|| shape("n·k", "no overflow", "overflow"))?;
        match device.backend() {
            #[cfg(feature = "opencl")]
            crate::Backend::OpenCl => {
                return Linear::new_opencl(device, format, weights, n, k, bias);
            }
            #[cfg(feature = "cuda")]
            crate::Backend::Cuda => {
                return Linear::new_cuda(device, format, weights, n, k, bias);
            }
            _ => {}
        }
        let (plan, kernels) = device.plan_shape(format, n, k)?;
        let w_format = kernels[0]
            .kernel()
            .as_matmul()
            .and_then(|m| kernels[0].kernel().tensor(&m.w))
            .map(|t| t.format)
            .ok_or_else(|| shape("kernel", "a matmul", kernels[0].kernel().name.clone()))?;
        // Quantize once; every tile packs the same codes.
        let quantized;
        let source = match weights {
            Weights::F32(v) => {
                check_len("weights elements (n·k)", nk, v.len())?;
                if w_format.is_quantized() {
                    quantized = quant::quantize(w_format, n, k, v)?;
                    WeightsIn::Quant(&quantized)
                } else {
                    WeightsIn::F32(v)
                }
            }
            Weights::Quant(t) => {
                if t.format != w_format || t.rows != n || t.cols != k {
                    return Err(shape(
                        "quantized weights",
                        format!("{w_format} [{n}, {k}]"),
                        format!("{} [{}, {}]", t.format, t.rows, t.cols),
                    ));
                }
                WeightsIn::Quant(t)
            }
        };
        let bias = match bias {
            Some(b) => {
                check_len("bias elements (n)", n, b.len())?;
                b.to_vec()
            }
            None => vec![0.0; n],
        };
        let mut packed: Vec<HostWeights> = Vec::new();
        let mut packed_of = [0usize; 3];
        for variant in Variant::ALL {
            let tile = tile_of(plan.plan(variant).tile);
            let i = match packed.iter().position(|p| p.tile.packs_like(&tile)) {
                Some(i) => i,
                None => {
                    packed.push(kernels[variant_index(variant)].pack_weights(n, k, source)?);
                    packed.len() - 1
                }
            };
            packed_of[variant_index(variant)] = i;
        }
        let flat = plan.flat_steps.iter().map(|_| OnceLock::new()).collect();
        Ok(Linear {
            device: Arc::clone(device),
            format,
            plan,
            imp: Imp::Host {
                kernels,
                flat,
                packed,
                packed_of,
                bias,
            },
        })
    }

    pub fn format(&self) -> WeightFormat {
        self.format
    }

    pub fn n(&self) -> usize {
        self.plan.n
    }

    pub fn k(&self) -> usize {
        self.plan.k
    }

    /// The dispatch plan (breakpoints, tiles, provenance).
    pub fn plan(&self) -> &ShapePlan {
        &self.plan
    }

    /// How many packed copies of the weights exist (one per distinct tile
    /// on the host; one upload on a GPU).
    pub fn packings(&self) -> usize {
        match &self.imp {
            Imp::Host { packed, .. } => packed.len(),
            #[cfg(feature = "opencl")]
            Imp::OpenCl { .. } => 1,
            #[cfg(feature = "cuda")]
            Imp::Cuda { .. } => 1,
        }
    }

    /// The variant `forward` uses for `m` rows.
    pub fn variant_for(&self, m: usize) -> Variant {
        self.plan.variant_for(m)
    }

    /// y[m, n] = x[m, k] · wᵀ + bias for any m (m = 0 does nothing).
    pub fn forward(&self, x: Input<'_>, m: usize, y: Output<'_>) -> Result<(), RuntimeError> {
        self.forward_from(x, m, None, y)
    }

    /// [`Linear::forward`] of a [`SharedInput`]: a W8A8 or W4A8 layer
    /// reuses the quantization of an earlier layer that read the same x
    /// with the same quantizer, else quantizes it once for the layers after.
    pub fn forward_shared(&self, x: &SharedInput<'_>, y: Output<'_>) -> Result<(), RuntimeError> {
        self.forward_from(x.x, x.m, Some(x), y)
    }

    fn forward_from(
        &self,
        x: Input<'_>,
        m: usize,
        shared: Option<&SharedInput<'_>>,
        y: Output<'_>,
    ) -> Result<(), RuntimeError> {
        let (n, k) = (self.plan.n, self.plan.k);
        let (x_len, x_dtype) = match x {
            HostInput::F32(v) => (v.len(), tessera_dsl::ir::Format::F32),
            HostInput::F16(v) => (v.len(), tessera_dsl::ir::Format::F16),
            HostInput::BF16(v) => (v.len(), tessera_dsl::ir::Format::BF16),
        };
        if x_dtype != self.format.input() {
            return Err(shape(
                format!("x dtype for format {}", self.format),
                self.format.input(),
                x_dtype,
            ));
        }
        let y_dtype = match &y {
            HostOutput::F32(_) => tessera_dsl::ir::Format::F32,
            HostOutput::F16(_) => tessera_dsl::ir::Format::F16,
            HostOutput::BF16(_) => tessera_dsl::ir::Format::BF16,
        };
        if y_dtype != self.format.output() {
            return Err(shape(
                format!("y dtype for format {}", self.format),
                self.format.output(),
                y_dtype,
            ));
        }
        let y_len = match &y {
            HostOutput::F32(v) => v.len(),
            HostOutput::F16(v) => v.len(),
            HostOutput::BF16(v) => v.len(),
        };
        let mk = m
            .checked_mul(k)
            .ok_or_else(|| shape("m·k", "no overflow", "overflow"))?;
        let mn = m
            .checked_mul(n)
            .ok_or_else(|| shape("m·n", "no overflow", "overflow"))?;
        check_len("x elements (m·k)", mk, x_len)?;
        check_len("y elements (m·n)", mn, y_len)?;
        if m == 0 {
            return Ok(());
        }
        let variant = self.plan.variant_for(m);
        let v = variant_index(variant);
        match &self.imp {
            Imp::Host {
                kernels,
                flat,
                packed,
                packed_of,
                bias,
            } => {
                let kernel = self.host_kernel(kernels, flat, m);
                // A flat step may run on another variant's packing.
                let weights = packed
                    .iter()
                    .find(|p| p.tile.packs_like(&kernel.tile()))
                    .unwrap_or(&packed[packed_of[v]]);
                let pool = self.device.pool();
                let panels = n.div_ceil(weights.tile.hp.max(1));
                let ranges = split_weighted(panels, &self.plan.core_weights);
                let exec = |call: &(dyn Fn(usize) + Sync)| {
                    if ranges.len() == 1 {
                        call(0);
                    } else {
                        pool.run(&|worker| call(worker));
                    }
                };
                match shared {
                    Some(shared) if kernel.quantizes_input() => {
                        let q = shared.quantized_for(kernel, k, (&exec, ranges.len()))?;
                        kernel.run_ranges_quantized(&q, weights, Some(bias), y, &ranges, &exec)?;
                    }
                    _ => kernel.run_ranges(x, m, weights, Some(bias), y, &ranges, &exec)?,
                }
                Ok(())
            }
            #[cfg(feature = "opencl")]
            Imp::OpenCl { kernels, weights } => {
                let (HostInput::F16(x), Some(dev)) = (x, self.device.opencl()) else {
                    return Err(shape("x dtype on opencl", "f16", "another dtype"));
                };
                let out = match y {
                    HostOutput::F32(v) => crate::opencl::ClOutput::F32(v),
                    HostOutput::F16(v) => crate::opencl::ClOutput::F16(v),
                    HostOutput::BF16(_) => {
                        return Err(shape("y dtype on opencl", "f32 or f16", "bf16"));
                    }
                };
                crate::opencl::matmul_into(dev, &kernels[v], weights, x, m, out)
                    .map_err(|e| gpu_err(&self.device, e))
            }
            #[cfg(feature = "cuda")]
            Imp::Cuda { kernels, weights } => {
                let (HostInput::F16(x), Ok(engine)) = (x, self.device.cuda_engine()) else {
                    return Err(shape("x dtype on cuda", "f16", "another dtype"));
                };
                let out = match y {
                    HostOutput::F32(v) => crate::cuda::HostOut::F32(v),
                    HostOutput::F16(v) => crate::cuda::HostOut::F16(v),
                    HostOutput::BF16(_) => {
                        return Err(shape("y dtype on cuda", "f32 or f16", "bf16"));
                    }
                };
                crate::cuda::matmul_into(&engine.dev, &kernels[v], weights, x, m, out)
                    .map_err(|e| gpu_err(&self.device, e))
            }
        }
    }

    /// Enqueue `y = x·wᵀ + bias` for `m` rows on `stream` with operands
    /// already on the device (`x`: f16 bits `[m, k]`; `y` `[m, n]` in the
    /// output type of the kernel serving `m`, [`Linear::cuda_writes_half`]
    /// of [`Linear::variant_for`]). Nothing is
    /// synchronised: chain layers, overlap streams, time with events.
    #[cfg(feature = "cuda")]
    pub fn forward_cuda(
        &self,
        stream: &Arc<cudarc::driver::CudaStream>,
        x: &cudarc::driver::CudaSlice<u16>,
        m: usize,
        y: crate::cuda::CudaOut<'_>,
    ) -> Result<(), RuntimeError> {
        self.forward_cuda_as(self.plan.variant_for(m), stream, x, m, y)
    }

    /// [`Linear::forward_cuda`] with `variant`'s kernel whatever the plan
    /// picks for `m` (how a benchmark or a tuner compares the variants).
    #[cfg(feature = "cuda")]
    pub fn forward_cuda_as(
        &self,
        variant: Variant,
        stream: &Arc<cudarc::driver::CudaStream>,
        x: &cudarc::driver::CudaSlice<u16>,
        m: usize,
        y: crate::cuda::CudaOut<'_>,
    ) -> Result<(), RuntimeError> {
        let Imp::Cuda { kernels, weights } = &self.imp else {
            return Err(RuntimeError::Unsupported {
                backend: self.device.backend().to_string(),
                what: "a CUDA launch".into(),
            });
        };
        crate::cuda::matmul_launch(stream, &kernels[variant_index(variant)], weights, x, m, y)
            .map_err(|e| gpu_err(&self.device, e))
    }

    /// The same layer over a second device copy of its weights (a
    /// device-to-device copy; the loaded kernels are shared). What a
    /// benchmark rotates through so every call reads its weights from
    /// DRAM rather than the L2 cache.
    #[cfg(feature = "cuda")]
    pub fn duplicate_cuda(&self) -> Result<Linear, RuntimeError> {
        let (Imp::Cuda { kernels, weights }, Ok(engine)) = (&self.imp, self.device.cuda_engine())
        else {
            return Err(RuntimeError::Unsupported {
                backend: self.device.backend().to_string(),
                what: "a CUDA weight copy".into(),
            });
        };
        Ok(Linear {
            device: Arc::clone(&self.device),
            format: self.format,
            plan: self.plan.clone(),
            imp: Imp::Cuda {
                kernels: kernels.clone(),
                weights: weights
                    .try_clone(&engine.dev)
                    .map_err(|e| gpu_err(&self.device, e))?,
            },
        })
    }

    /// Bytes of packed weights and parameters on the CUDA device; None off
    /// CUDA.
    #[cfg(feature = "cuda")]
    pub fn cuda_weight_bytes(&self) -> Option<usize> {
        match &self.imp {
            Imp::Cuda { weights, .. } => Some(weights.bytes()),
            _ => None,
        }
    }

    /// `variant`'s loaded CUDA kernel and this layer's device weights, for
    /// a caller's own launches (`cuda::matmul_launch`), such as timing
    /// another plan against the same weights; None off CUDA.
    #[cfg(feature = "cuda")]
    pub fn cuda_parts(
        &self,
        variant: Variant,
    ) -> Option<(&crate::cuda::CudaMatmul, &crate::cuda::CudaWeights)> {
        let Imp::Cuda { kernels, weights } = &self.imp else {
            return None;
        };
        Some((&kernels[variant_index(variant)], weights))
    }

    /// Whether `variant`'s CUDA kernel writes f16 (else f32); None off
    /// CUDA.
    #[cfg(feature = "cuda")]
    pub fn cuda_writes_half(&self, variant: Variant) -> Option<bool> {
        let Imp::Cuda { kernels, .. } = &self.imp else {
            return None;
        };
        Some(kernels[variant_index(variant)].writes_half())
    }

    /// The host kernel serving `m` rows: the flat step's when M has one
    /// (prepared now if this is its first call), else the variant's.
    fn host_kernel<'k>(
        &self,
        kernels: &'k [Arc<HostMatmul>; 3],
        flat: &'k [OnceLock<Option<Arc<HostMatmul>>>],
        m: usize,
    ) -> &'k Arc<HostMatmul> {
        let variant = self.plan.variant_for(m);
        let step = match variant {
            Variant::FlatGemm => self.plan.flat_step(m),
            _ => None,
        };
        step.and_then(|(i, s)| {
            flat.get(i)?
                .get_or_init(|| self.flat_step_kernel(s))
                .as_ref()
        })
        .unwrap_or(&kernels[variant_index(variant)])
    }

    /// The tile (ep, hp, lp) of the host kernel `forward` runs for `m` rows
    /// (preparing a flat step's kernel on first use); None on a GPU.
    pub fn kernel_tile(&self, m: usize) -> Option<[u32; 3]> {
        match &self.imp {
            Imp::Host { kernels, flat, .. } => {
                let t = self.host_kernel(kernels, flat, m).tile();
                Some([t.ep as u32, t.hp as u32, t.lp as u32])
            }
            #[cfg(feature = "opencl")]
            Imp::OpenCl { .. } => None,
            #[cfg(feature = "cuda")]
            Imp::Cuda { .. } => None,
        }
    }

    /// Prepare one flat step's kernel, or warn and let the flat variant's
    /// kernel serve its M.
    fn flat_step_kernel(&self, step: &crate::dispatch::FlatStep) -> Option<Arc<HostMatmul>> {
        let (n, k, tile) = (self.plan.n, self.plan.k, step.tile);
        match self
            .device
            .flat_step_matmul(self.format, tile, step.target.as_deref(), n, k)
        {
            Ok(kernel) => Some(kernel),
            Err(e) => {
                tracing::warn!(
                    format = %self.format,
                    n, k,
                    tile = ?tile,
                    "flat step kernel cannot be prepared ({e}); the flat tile serves its M"
                );
                None
            }
        }
    }

    /// [`Linear::forward`] for f32 activations and output.
    pub fn forward_f32(&self, x: &[f32], m: usize, y: &mut [f32]) -> Result<(), RuntimeError> {
        self.forward(HostInput::F32(x), m, HostOutput::F32(y))
    }
}

/// A GPU driver error as the runtime's error.
#[cfg(any(feature = "opencl", feature = "cuda"))]
fn gpu_err(device: &Device, e: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Gpu {
        backend: device.backend().to_string(),
        why: e.to_string(),
    }
}

/// The logical weights (f16 or quantized in the kernel's format) a GPU
/// packer takes, after checking their size and format.
#[cfg(any(feature = "opencl", feature = "cuda"))]
fn gpu_value(
    w_format: tessera_dsl::ir::Format,
    weights: Weights<'_>,
    n: usize,
    k: usize,
) -> Result<tessera_dsl::interp::Value, RuntimeError> {
    use tessera_dsl::interp::Value;
    match weights {
        Weights::F32(v) => {
            check_len("weights elements (n·k)", n * k, v.len())?;
            if w_format.is_quantized() {
                Ok(Value::Quant(quant::quantize(w_format, n, k, v)?))
            } else {
                Ok(Value::F16(
                    v.iter().map(|&x| half::f16::from_f32(x)).collect(),
                ))
            }
        }
        Weights::Quant(t) => {
            if t.format != w_format || t.rows != n || t.cols != k {
                return Err(shape(
                    "quantized weights",
                    format!("{w_format} [{n}, {k}]"),
                    format!("{} [{}, {}]", t.format, t.rows, t.cols),
                ));
            }
            t.validate()
                .map_err(|e| shape("quantized weights", "valid", e))?;
            Ok(Value::Quant(t.clone()))
        }
    }
}

#[cfg(any(feature = "opencl", feature = "cuda"))]
fn bias_or_zeros(bias: Option<&[f32]>, n: usize) -> Result<Vec<f32>, RuntimeError> {
    match bias {
        Some(b) => {
            check_len("bias elements (n)", n, b.len())?;
            Ok(b.to_vec())
        }
        None => Ok(vec![0.0; n]),
    }
}

impl Linear {
    #[cfg(feature = "opencl")]
    fn new_opencl(
        device: &Arc<Device>,
        format: WeightFormat,
        weights: Weights<'_>,
        n: usize,
        k: usize,
        bias: Option<&[f32]>,
    ) -> Result<Linear, RuntimeError> {
        let (plan, kernels) = device.plan_shape_cl(format, n, k)?;
        let w_format = kernels[0].plan().weights.format;
        let value = gpu_value(w_format, weights, n, k)?;
        let bias = bias_or_zeros(bias, n)?;
        let dev = device
            .opencl()
            .ok_or_else(|| gpu_err(device, "no OpenCL device"))?;
        let weights = crate::opencl::ClWeights::upload(dev, w_format, &value, Some(&bias), n, k)
            .map_err(|e| gpu_err(device, e))?;
        Ok(Linear {
            device: Arc::clone(device),
            format,
            plan,
            imp: Imp::OpenCl { kernels, weights },
        })
    }

    #[cfg(feature = "cuda")]
    fn new_cuda(
        device: &Arc<Device>,
        format: WeightFormat,
        weights: Weights<'_>,
        n: usize,
        k: usize,
        bias: Option<&[f32]>,
    ) -> Result<Linear, RuntimeError> {
        let (plan, programs) = device.plan_shape_cuda(format, n, k)?;
        let engine = device.cuda_engine()?;
        let w_format = programs[0].plan.weights.format;
        let weights = gpu_value(w_format, weights, n, k)?;
        let bias = bias_or_zeros(bias, n)?;
        let kernels = [
            engine.matmul(&programs[0])?,
            engine.matmul(&programs[1])?,
            engine.matmul(&programs[2])?,
        ];
        let weights = crate::cuda::CudaWeights::upload(
            &engine.dev,
            &programs[0].plan,
            &weights,
            Some(&bias),
            n,
            k,
        )
        .map_err(|e| gpu_err(device, e))?;
        Ok(Linear {
            device: Arc::clone(device),
            format,
            plan,
            imp: Imp::Cuda { kernels, weights },
        })
    }
}
