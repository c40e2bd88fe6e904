//! The CUDA host side of the PTX backend (feature `cuda`, off by default):
//! load a [`PtxProgram`] (matmul) or a [`PtxAttentionProgram`] (decode
//! attention: partial then combine) through the driver API and launch it
//! with the plan's arguments and geometry.
//!
//! The driver library is opened at run time (cudarc's `dynamic-loading`),
//! so this builds everywhere; where no `libcuda` exists every entry point
//! returns [`CudaError::NoDriver`] after a presence check, and nothing
//! panics. The launch follows the shared plan exactly: arguments in
//! [`tessera_codegen::gpu::MatmulPlan::args`] order (pointers as device
//! addresses, ints as 32-bit), grid `global / local` and block `local` per
//! [`tessera_codegen::gpu::LaunchDim`], dynamic shared memory from the
//! program.

use std::sync::Arc;

use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;
use half::f16;
use tessera_codegen::artifact::EmitError;
use tessera_codegen::gpu::{ArgKind, KernelArg, KvFormat, LaunchDim, LaunchExtent};
use tessera_codegen::ptx::{PtxAttentionProgram, PtxBackend, PtxProgram, Sm};
use tessera_dsl::interp::Value;
use tessera_dsl::{Format, Group, ParamType};

use crate::gpu_weights::{self, GpuWeights};

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

/// One device with its context and stream.
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

    fn upload<T>(&self, v: &[T]) -> Result<CudaSlice<T>, CudaError>
    where
        T: cudarc::driver::DeviceRepr + Clone + Default,
    {
        // Zero-length arguments (no scales, no bias) still bind a pointer.
        if v.is_empty() {
            return self
                .stream
                .clone_htod(&[T::default()])
                .map_err(driver("upload"));
        }
        self.stream.clone_htod(v).map_err(driver("upload"))
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
    let (ei, hi, li) = (to_i32(e, "e")?, to_i32(h, "h")?, to_i32(l, "l")?);
    if e == 0 || h == 0 {
        return Ok(Vec::new());
    }
    let (codes, scales, offsets): (Vec<u8>, Vec<f32>, Vec<f32>) =
        match gpu_weights::prepare(plan.weights.format, w, h, l).map_err(input)? {
            GpuWeights::Halves(halves) => (
                halves.iter().flat_map(|v| v.to_le_bytes()).collect(),
                vec![],
                vec![],
            ),
            GpuWeights::Quant(packed) => (packed.codes, packed.scales, packed.offsets),
        };
    let module = dev
        .ctx
        .load_module(Ptx::from_src(program.text.clone()))
        .map_err(driver("PTX module load"))?;
    let func = module
        .load_function(&plan.entry)
        .map_err(driver("function lookup"))?;
    if program.dynamic_shared_bytes > 48 * 1024 {
        let bytes = i32::try_from(program.dynamic_shared_bytes)
            .map_err(|_| input("shared memory size overflows"))?;
        func.set_attribute(
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            bytes,
        )
        .map_err(driver("shared memory opt-in"))?;
    }
    let xbits: Vec<u16> = x.iter().map(|v| v.to_bits()).collect();
    let xb = dev.upload(&xbits)?;
    let wb = dev.upload(&codes)?;
    let sb = dev.upload(&scales)?;
    let ob = dev.upload(&offsets)?;
    let bb = dev.upload(bias.unwrap_or(&[]))?;
    let out_half = plan.args.iter().any(|a| a.kind == ArgKind::HalfOut);
    let yf = dev
        .stream
        .alloc_zeros::<f32>(if out_half { 1 } else { e * h })
        .map_err(driver("alloc"))?;
    let yh = dev
        .stream
        .alloc_zeros::<u16>(if out_half { e * h } else { 1 })
        .map_err(driver("alloc"))?;
    let dims = plan.launch.map(|d| {
        let extent = match d.extent {
            LaunchExtent::E => e,
            LaunchExtent::H => h,
            _ => 1,
        };
        (d.global(extent) / d.local as usize, d.local)
    });
    let grid = |i: usize| u32::try_from(dims[i].0).map_err(|_| input("grid too large"));
    let cfg = LaunchConfig {
        grid_dim: (grid(0)?, grid(1)?, grid(2)?),
        block_dim: (dims[0].1, dims[1].1, dims[2].1),
        shared_mem_bytes: program.dynamic_shared_bytes,
    };
    let mut launch = dev.stream.launch_builder(&func);
    for a in &plan.args {
        match a.name {
            "x" => launch.arg(&xb),
            "w" => launch.arg(&wb),
            "scales" => launch.arg(&sb),
            "offsets" => launch.arg(&ob),
            "bias" => launch.arg(&bb),
            "y" if out_half => launch.arg(&yh),
            "y" => launch.arg(&yf),
            "e" => launch.arg(&ei),
            "h" => launch.arg(&hi),
            "l" => launch.arg(&li),
            other => return Err(input(format!("argument `{other}` is not bound"))),
        };
    }
    // `y` is bound by shared reference: the read-back on the same stream
    // orders after the kernel's writes.
    // SAFETY: the arguments follow the emitted signature (device pointers
    // for `.u64`, i32 for `.u32`), every buffer holds what the kernel
    // indexes for these e, h, l (weights padded to lp by the packer), and
    // the buffers outlive the synchronous read-back below.
    unsafe { launch.launch(cfg) }.map_err(driver("kernel launch"))?;
    if out_half {
        let bits = dev.stream.clone_dtoh(&yh).map_err(driver("read back"))?;
        Ok(bits
            .into_iter()
            .map(|b| f16::from_bits(b).to_f32())
            .collect())
    } else {
        dev.stream.clone_dtoh(&yf).map_err(driver("read back"))
    }
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
    check_len("q", q.len(), hq * d)?;
    let splits = s.div_ceil(plan.keys_per_split as usize);
    for (v, what) in [
        (hq, "hq"),
        (kvh, "kvh"),
        (d, "d"),
        (s, "s"),
        (splits, "splits"),
    ] {
        to_i32(v, what)?;
    }
    // The largest element index the kernels form in 32 bits.
    to_i32(
        s.checked_mul(kvh)
            .and_then(|r| r.checked_mul(d))
            .ok_or_else(|| input("s * kvh * d overflows"))?,
        "s * kvh * d",
    )?;
    to_i32(
        splits
            .checked_mul(hq)
            .and_then(|r| r.checked_mul(d))
            .ok_or_else(|| input("splits * hq * d overflows"))?,
        "splits * hq * d",
    )?;
    Ok(AttentionInputs {
        k: cache_bytes(plan.k, k, s * kvh, d, "k")?,
        v: cache_bytes(plan.v, v, s * kvh, d, "v")?,
        splits,
    })
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
    let module = dev
        .ctx
        .load_module(Ptx::from_src(program.text.clone()))
        .map_err(driver("PTX module load"))?;
    let partial = module
        .load_function(&plan.partial_entry)
        .map_err(driver("function lookup"))?;
    let combine = module
        .load_function(&plan.combine_entry)
        .map_err(driver("function lookup"))?;
    let qbits: Vec<u16> = q.iter().map(|h| h.to_bits()).collect();
    let qb = dev.upload(&qbits)?;
    let kb = dev.upload(&inputs.k.codes)?;
    let ks = dev.upload(&inputs.k.scales)?;
    let ko = dev.upload(&inputs.k.offsets)?;
    let vb = dev.upload(&inputs.v.codes)?;
    let alloc = |n: usize| dev.stream.alloc_zeros::<f32>(n).map_err(driver("alloc"));
    let po = alloc(splits * hq * d)?;
    let pm = alloc(splits * hq)?;
    let pl = alloc(splits * hq)?;
    let rc = dev
        .stream
        .alloc_zeros::<i32>(splits * hq)
        .map_err(driver("alloc"))?;
    let ob = dev
        .stream
        .alloc_zeros::<u16>(hq * d)
        .map_err(driver("alloc"))?;
    let ints = [
        ("hq", to_i32(hq, "hq")?),
        ("kvh", to_i32(kvh, "kvh")?),
        ("d", to_i32(d, "d")?),
        ("s", to_i32(s, "s")?),
        ("splits", to_i32(splits, "splits")?),
    ];
    let extent = |x: LaunchExtent| match x {
        LaunchExtent::Splits => splits,
        LaunchExtent::KvHeads => kvh,
        LaunchExtent::Heads => hq,
        LaunchExtent::HeadDim => d,
        _ => 1,
    };
    let launches = [
        (&partial, &plan.partial_args, &plan.partial_launch),
        (&combine, &plan.combine_args, &plan.combine_launch),
    ];
    for (func, args, dims) in launches {
        let cfg = launch_config(dims, extent)?;
        let mut launch = dev.stream.launch_builder(func);
        for a in args.iter() {
            let KernelArg { name, .. } = a;
            match *name {
                "q" => launch.arg(&qb),
                "k" => launch.arg(&kb),
                "k_scales" => launch.arg(&ks),
                "k_offsets" => launch.arg(&ko),
                "v" => launch.arg(&vb),
                "part_o" => launch.arg(&po),
                "part_m" => launch.arg(&pm),
                "part_l" => launch.arg(&pl),
                "recomputed" => launch.arg(&rc),
                "o" => launch.arg(&ob),
                other => match ints.iter().find(|(n, _)| *n == other) {
                    Some((_, v)) => launch.arg(v),
                    None => return Err(input(format!("argument `{other}` is not bound"))),
                },
            };
        }
        // SAFETY: the arguments follow the emitted signatures (device
        // pointers for `.u64`, i32 for `.u32`, in the plan's order), every
        // buffer holds what the kernels index for these extents (checked
        // by check_attention: q [hq, d], caches [s·kvh, d], partials
        // [splits, hq(, d)], o [hq, d]), the partial buffers the combine
        // reads are written by the partial launch before it on the same
        // stream, and every buffer outlives the synchronous read-back.
        unsafe { launch.launch(cfg) }.map_err(driver("kernel launch"))?;
    }
    let bits = dev.stream.clone_dtoh(&ob).map_err(driver("read back"))?;
    let flags = dev.stream.clone_dtoh(&rc).map_err(driver("read back"))?;
    Ok(AttentionResult {
        o: bits
            .into_iter()
            .map(|b| f16::from_bits(b).to_f32())
            .collect(),
        recomputed: flags.into_iter().filter(|&r| r != 0).count(),
        splits,
    })
}
