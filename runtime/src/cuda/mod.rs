//! The CUDA host side of the PTX backend (feature `cuda`, off by default):
//! load a [`PtxProgram`] (matmul) or a [`PtxAttentionProgram`] (decode
//! attention: partial then combine) through the driver API and launch it
//! with the plan's arguments and geometry, or a [`PtxPrefillProgram`]
//! (causal prefill on tensor cores, one head dim). [`resident`] keeps modules,
//! weights and KV caches on the device (what the runtime's `Linear` and
//! `Attention` use); [`run_matmul`] and [`run_attention`] are one-shot
//! wrappers over it for tests and tools.
//!
//! The driver library is opened at run time (cudarc's `dynamic-loading`),
//! so this builds everywhere; where no `libcuda` exists every entry point
//! returns [`CudaError::NoDriver`] after a presence check, and nothing
//! panics. The launch follows the shared plan exactly: arguments in
//! [`tessera_codegen::gpu::MatmulPlan::args`] order (pointers as device
//! addresses, ints as 32-bit), grid `global / local` and block `local` per
//! [`tessera_codegen::gpu::LaunchDim`], dynamic shared memory from the
//! program.

pub mod resident;

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream, LaunchConfig};
use half::f16;
use tessera_codegen::artifact::EmitError;
use tessera_codegen::gpu::{KvFormat, LaunchDim, LaunchExtent};
use tessera_codegen::ptx::{PtxAttentionProgram, PtxBackend, PtxPrefillProgram, PtxProgram, Sm};
use tessera_dsl::interp::Value;
use tessera_dsl::{Format, Group, ParamType};

pub use resident::{
    AttentionScratch, CudaAttention, CudaKvCache, CudaMatmul, CudaOut, CudaPrefill, CudaWeights,
    HostOut, attention_into, attention_launch, matmul_into, matmul_launch, prefill_into,
    prefill_launch,
};

use crate::gpu_kv::KvRows;
use crate::gpu_weights;

/// Why a CUDA operation failed.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    #[error("no CUDA driver: {0}")]
    NoDriver(String),
    #[error("CUDA {what} failed: {detail}")]
    Driver { what: &'static str, detail: String },
    #[error(transparent)]
    Emit(#[from] EmitError),
    #[error("bad input: {0}")]
    Input(String),
}

fn driver(what: &'static str) -> impl Fn(cudarc::driver::DriverError) -> CudaError {
    move |e| CudaError::Driver {
        what,
        detail: e.to_string(),
    }
}

fn input(msg: impl Into<String>) -> CudaError {
    CudaError::Input(msg.into())
}

/// Whether the CUDA driver library can be opened (only tries `dlopen`;
/// never touches a driver entry point).
pub fn driver_present() -> bool {
    // SAFETY: the probe only attempts to load the shared library by name
    // and drops it; no symbol is called.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// One device with its context and the stream its work is enqueued on
/// (clones share both; [`CudaDevice::with_new_stream`] gives a handle
/// whose work runs on a stream of its own).
#[derive(Clone)]
pub struct CudaDevice {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    sm: Sm,
    name: String,
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaDevice")
            .field("name", &self.name)
            .field("sm", &self.sm)
            .finish()
    }
}

impl CudaDevice {
    /// Device 0, if a driver and a device of compute capability 8.0 or
    /// later exist (sm_90 code for 9.x and later, sm_80 for 8.x).
    pub fn first() -> Result<CudaDevice, CudaError> {
        if !driver_present() {
            return Err(CudaError::NoDriver(
                "the CUDA driver library (libcuda.so) is not installed".to_string(),
            ));
        }
        let count = CudaContext::device_count().map_err(driver("device count"))?;
        if count < 1 {
            return Err(CudaError::NoDriver(
                "the CUDA driver reports no device".to_string(),
            ));
        }
        let ctx = CudaContext::new(0).map_err(driver("context creation"))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(driver("compute capability"))?;
        let sm = match major {
            8 => Sm::Sm80,
            m if m >= 9 => Sm::Sm90,
            _ => {
                return Err(CudaError::NoDriver(format!(
                    "device compute capability {major}.{minor}: the PTX kernels need 8.0 or later"
                )));
            }
        };
        let name = ctx.name().map_err(driver("device name"))?;
        let stream = ctx.default_stream();
        Ok(CudaDevice {
            ctx,
            stream,
            sm,
            name,
        })
    }

    pub fn sm(&self) -> Sm {
        self.sm
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The backend whose programs this device runs.
    pub fn backend(&self) -> PtxBackend {
        PtxBackend::new(self.sm)
    }

    /// The context every stream of this device shares.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The stream this handle enqueues on (for events and for buffers a
    /// caller allocates itself).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The same device and context, with a new stream: work enqueued
    /// through the returned handle may overlap this one's; order the two
    /// with events (`stream().record_event`, `stream().wait`).
    pub fn with_new_stream(&self) -> Result<CudaDevice, CudaError> {
        Ok(CudaDevice {
            stream: self.ctx.new_stream().map_err(driver("stream creation"))?,
            ..self.clone()
        })
    }

    /// Wait until everything enqueued on this handle's stream has run.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.stream.synchronize().map_err(driver("synchronize"))
    }
}

/// f16 weights `[h, l]` in the GPU layout `[l/lp, h, lp]`, as half bits.
pub fn pack_f16_gpu(h: usize, l: usize, w: &[f16]) -> Result<Vec<u16>, CudaError> {
    gpu_weights::pack_f16_gpu(h, l, w).map_err(input)
}

fn check_len(what: &str, got: usize, expected: usize) -> Result<(), CudaError> {
    if got == expected {
        Ok(())
    } else {
        Err(input(format!(
            "{what}: expected {expected} elements, got {got}"
        )))
    }
}

fn to_i32(v: usize, what: &str) -> Result<i32, CudaError> {
    i32::try_from(v).map_err(|_| input(format!("{what} = {v} does not fit a 32-bit int")))
}

/// Run a matmul program: `x` is `[e, l]` f16, `w` the logical weights (an
/// f16 `[h, l]` value or a quantized tensor with rows `h`), `bias` `[h]`.
/// Returns `y` `[e, h]` as f32.
#[allow(clippy::too_many_arguments)]
pub fn run_matmul(
    dev: &CudaDevice,
    program: &PtxProgram,
    x: &[f16],
    w: &Value,
    bias: Option<&[f32]>,
    e: usize,
    h: usize,
    l: usize,
) -> Result<Vec<f32>, CudaError> {
    let plan = &program.plan;
    check_len("x", x.len(), e * l)?;
    if plan.bias && bias.is_none_or(|b| b.len() != h) {
        return Err(input(format!("the kernel needs a bias of {h} elements")));
    }
    to_i32(e, "e")?;
    if e == 0 || h == 0 {
        return Ok(Vec::new());
    }
    let weights = CudaWeights::upload(dev, plan, w, bias, h, l)?;
    let matmul = CudaMatmul::new(dev, program)?;
    let mut y = vec![0.0f32; e * h];
    matmul_into(dev, &matmul, &weights, x, e, HostOut::F32(&mut y))?;
    Ok(y)
}

/// A cache's rows as the device cache takes them: halves for f16, the
/// bytes and per-row parameters otherwise.
fn as_rows<'a>(format: KvFormat, bytes: &'a CacheBytes, halves: &'a [f16]) -> KvRows<'a> {
    match format {
        KvFormat::F16 => KvRows::F16(halves),
        _ => KvRows::Bytes {
            codes: &bytes.codes,
            scales: &bytes.scales,
            offsets: &bytes.offsets,
        },
    }
}

/// A device cache of `s` tokens holding the checked bytes of K and V.
fn uploaded_cache(
    dev: &CudaDevice,
    (kf, vf): (KvFormat, KvFormat),
    (kb, vb): (&CacheBytes, &CacheBytes),
    kvh: usize,
    d: usize,
    s: usize,
) -> Result<CudaKvCache, CudaError> {
    let mut cache = CudaKvCache::new(dev, kf, vf, kvh, d, s)?;
    let halves = |c: &CacheBytes| -> Vec<f16> {
        c.codes
            .chunks_exact(2)
            .map(|b| f16::from_bits(u16::from_le_bytes([b[0], b[1]])))
            .collect()
    };
    let (kh, vh) = (halves(kb), halves(vb));
    cache.write(dev, 0, s, as_rows(kf, kb, &kh), as_rows(vf, vb, &vh))?;
    Ok(cache)
}

/// What a decode attention call returns (as `tessera_runtime::opencl`'s).
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionResult {
    /// `o[1, hq, d]` as f32 (rounded to f16 by the kernel).
    pub o: Vec<f32>,
    /// (split, head) pairs that left the unified-max range and recomputed.
    pub recomputed: usize,
    pub splits: usize,
}

/// One KV cache as the kernel reads it: codes (half bits as bytes for
/// f16) and, for int8 keys, the per-row scales and offsets.
#[derive(Clone, Debug, PartialEq)]
pub struct CacheBytes {
    pub codes: Vec<u8>,
    pub scales: Vec<f32>,
    pub offsets: Vec<f32>,
}

/// Checks a cache bound as `value` against the format the kernel reads
/// (`rows = s·kvh` rows of `d`) and returns its bytes. No device needed:
/// every input error surfaces before a driver call.
pub fn cache_bytes(
    format: KvFormat,
    value: &Value,
    rows: usize,
    d: usize,
    what: &str,
) -> Result<CacheBytes, CudaError> {
    match (format, value) {
        (KvFormat::F16, Value::F16(data)) => {
            check_len(what, data.len(), rows * d)?;
            Ok(CacheBytes {
                codes: data
                    .iter()
                    .flat_map(|h| h.to_bits().to_le_bytes())
                    .collect(),
                scales: Vec::new(),
                offsets: Vec::new(),
            })
        }
        (KvFormat::I8AsymRow | KvFormat::Fp8E4M3 | KvFormat::Fp8E5M2, Value::Quant(qt)) => {
            let want = match format {
                KvFormat::I8AsymRow => Format::I8Asym(Group::Row, ParamType::F32),
                KvFormat::Fp8E5M2 => Format::Fp8E5M2,
                _ => Format::Fp8E4M3,
            };
            if qt.format != want {
                return Err(input(format!(
                    "{what} cache is {}, the kernel reads {want}",
                    qt.format
                )));
            }
            if qt.rows != rows || qt.cols != d {
                return Err(input(format!(
                    "{what} cache is [{}, {}], expected [{rows}, {d}]",
                    qt.rows, qt.cols
                )));
            }
            qt.validate().map_err(|e| input(format!("{what}: {e}")))?;
            let per_row = format == KvFormat::I8AsymRow;
            Ok(CacheBytes {
                codes: qt.codes.clone(),
                scales: if per_row {
                    qt.scales.clone()
                } else {
                    Vec::new()
                },
                offsets: if per_row {
                    qt.offsets.clone()
                } else {
                    Vec::new()
                },
            })
        }
        (f, other) => Err(input(format!(
            "{what} cache bound as {}, the kernel reads {f:?}",
            other.kind()
        ))),
    }
}

/// The checked inputs of one decode attention call.
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionInputs {
    pub k: CacheBytes,
    pub v: CacheBytes,
    pub splits: usize,
}

/// Every check [`run_attention`] makes before touching the device (the
/// same as the OpenCL runner's): GQA divides, a non-empty sequence, `q`
/// `[hq, d]`, caches `[s·kvh, d]` in the program's formats, extents that
/// fit the kernels' 32-bit ints.
#[allow(clippy::too_many_arguments)]
pub fn check_attention(
    program: &PtxAttentionProgram,
    q: &[f16],
    k: &Value,
    v: &Value,
    hq: usize,
    kvh: usize,
    d: usize,
    s: usize,
) -> Result<AttentionInputs, CudaError> {
    let plan = &program.plan;
    if kvh == 0 || !hq.is_multiple_of(kvh) {
        return Err(input(format!(
            "query heads {hq} are not a multiple of KV heads {kvh}"
        )));
    }
    if s == 0 {
        return Err(input("attention over an empty KV sequence"));
    }
    let splits = s.div_ceil(plan.keys_per_split as usize);
    // First: every product below is then known to fit.
    attention_ints([hq, kvh, d, s, splits], s)?;
    check_len("q", q.len(), hq * d)?;
    Ok(AttentionInputs {
        k: cache_bytes(plan.k, k, s * kvh, d, "k")?,
        v: cache_bytes(plan.v, v, s * kvh, d, "v")?,
        splits,
    })
}

/// The attention kernels' int arguments `[hq, kvh, d, s, splits]` by name,
/// each checked to fit an i32, as are the largest element indices the
/// kernels form in 32 bits: `rows·kvh·d` into a cache of `rows` tokens and
/// `splits·hq·d` into the partials.
pub(crate) fn attention_ints(
    [hq, kvh, d, s, splits]: [usize; 5],
    rows: usize,
) -> Result<[(&'static str, i32); 5], CudaError> {
    let product = |a: usize, b: usize, c: usize, what: &str| {
        a.checked_mul(b)
            .and_then(|r| r.checked_mul(c))
            .ok_or_else(|| input(format!("{what} overflows")))
            .and_then(|v| to_i32(v, what))
    };
    product(rows, kvh, d, "s * kvh * d")?;
    product(splits, hq, d, "splits * hq * d")?;
    Ok([
        ("hq", to_i32(hq, "hq")?),
        ("kvh", to_i32(kvh, "kvh")?),
        ("d", to_i32(d, "d")?),
        ("s", to_i32(s, "s")?),
        ("splits", to_i32(splits, "splits")?),
    ])
}

/// Grid and block of one launch for bound extents.
fn launch_config(
    dims: &[LaunchDim; 3],
    extent: impl Fn(LaunchExtent) -> usize,
) -> Result<LaunchConfig, CudaError> {
    let grid = |d: &LaunchDim| {
        u32::try_from(d.global(extent(d.extent)) / d.local as usize)
            .map_err(|_| input("grid too large"))
    };
    Ok(LaunchConfig {
        grid_dim: (grid(&dims[0])?, grid(&dims[1])?, grid(&dims[2])?),
        block_dim: (dims[0].local, dims[1].local, dims[2].local),
        shared_mem_bytes: 0,
    })
}

/// Run a decode attention program (the OpenCL runner's contract): `q`
/// `[1, hq, d]` f16, caches `k`, `v` `[s, kvh, d]` as the interpreter binds
/// them (f16, or quantized with rows `s·kvh`). The partial kernel, then
/// the combine kernel, on the device's stream.
#[allow(clippy::too_many_arguments)]
pub fn run_attention(
    dev: &CudaDevice,
    program: &PtxAttentionProgram,
    q: &[f16],
    k: &Value,
    v: &Value,
    hq: usize,
    kvh: usize,
    d: usize,
    s: usize,
) -> Result<AttentionResult, CudaError> {
    let plan = &program.plan;
    let inputs = check_attention(program, q, k, v, hq, kvh, d, s)?;
    let splits = inputs.splits;
    if hq == 0 || d == 0 {
        return Ok(AttentionResult {
            o: Vec::new(),
            recomputed: 0,
            splits,
        });
    }
    let attention = CudaAttention::new(dev, program)?;
    let cache = uploaded_cache(dev, (plan.k, plan.v), (&inputs.k, &inputs.v), kvh, d, s)?;
    let mut o = vec![f16::ZERO; hq * d];
    let recomputed = attention_into(dev, &attention, q, &cache, s, hq, &mut o)?;
    Ok(AttentionResult {
        o: o.into_iter().map(f16::to_f32).collect(),
        recomputed,
        splits,
    })
}

/// Run a causal prefill program: `q` `[t, hq, d]` f16, the last `t` of `s`
/// cached tokens, caches `k`, `v` `[s, kvh, d]` as the interpreter binds
/// them (f16, or quantized with rows `s·kvh`); returns `o` `[t, hq, d]` as
/// f32 (rounded to f16 by the kernel). Inputs are checked before the
/// device is touched.
#[allow(clippy::too_many_arguments)]
pub fn run_prefill(
    dev: &CudaDevice,
    program: &PtxPrefillProgram,
    q: &[f16],
    k: &Value,
    v: &Value,
    t: usize,
    hq: usize,
    kvh: usize,
    s: usize,
) -> Result<Vec<f32>, CudaError> {
    let plan = &program.plan;
    let d = plan.d as usize;
    if kvh == 0 || hq == 0 || !hq.is_multiple_of(kvh) {
        return Err(input(format!(
            "query heads {hq} are not a positive multiple of KV heads {kvh}"
        )));
    }
    if t == 0 || t > s {
        return Err(input(format!("a prefill of {t} tokens over {s}")));
    }
    attention_ints([hq, kvh, d, s, t], s)?;
    check_len("q", q.len(), t * hq * d)?;
    let kb = cache_bytes(plan.k, k, s * kvh, d, "k")?;
    let vb = cache_bytes(plan.v, v, s * kvh, d, "v")?;
    let prefill = CudaPrefill::new(dev, program)?;
    let cache = uploaded_cache(dev, (plan.k, plan.v), (&kb, &vb), kvh, d, s)?;
    let mut o = vec![f16::ZERO; t * hq * d];
    prefill_into(dev, &prefill, q, &cache, t, s, hq, &mut o)?;
    Ok(o.into_iter().map(f16::to_f32).collect())
}
