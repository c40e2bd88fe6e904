//! OpenCL host side: pick a device, build programs through a binary cache
//! (keyed by device, driver and source hash, like MNN's cache file), create
//! buffers and images, launch the kernels `tessera_codegen::opencl` emits
//! and read the results back.
//!
//! Every driver failure comes back as a [`ClError`] (a failed build with
//! its log); nothing here panics on a missing platform or a bad argument.
//! `opencl3`'s `dynamic` feature loads libOpenCL at run time, so a machine
//! without an ICD loader gets [`ClError::NoDevice`].
//!
//! The runners ([`run_matmul`], [`run_attention`]) take the same logical
//! values as the reference interpreter (`tessera_dsl::interp::Value`), pack
//! the weights into the GPU layout, bind arguments in the plan's order and
//! size the NDRange from the plan's launch dims.

use std::ffi::c_void;
use std::path::{Path, PathBuf};
use std::ptr;

use half::f16;
use opencl3::command_queue::CommandQueue;
use opencl3::context::Context;
use opencl3::device::{CL_DEVICE_TYPE_ALL, CL_DEVICE_TYPE_GPU, Device};
use opencl3::kernel::{ExecuteKernel, Kernel as ClKernel};
use opencl3::memory::{
    Buffer, CL_MEM_COPY_HOST_PTR, CL_MEM_OBJECT_IMAGE2D, CL_MEM_READ_ONLY, CL_MEM_READ_WRITE,
    CL_RGBA, CL_UNSIGNED_INT32, ClMem, Image, cl_image_desc, cl_image_format,
};
use opencl3::platform::get_platforms;
use opencl3::program::Program as ClProgram;
use opencl3::types::{CL_BLOCKING, cl_int, cl_mem};
use tessera_codegen::artifact::EmitError;
use tessera_codegen::gpu::{
    ArgKind, KernelArg, KvFormat, LaunchDim, LaunchExtent, WEIGHT_LP, WeightMemory,
};
use tessera_codegen::opencl::{Fp16Mode, Program};
use tessera_dsl::interp::Value;

pub mod limits;
mod resident;

pub use resident::{
    ClAttention, ClIo, ClKvCache, ClMatmul, ClOutput, ClPrefill, ClWeights, KvRows, attention_into,
    matmul_into, matmul_launch, prefill_into,
};

use crate::device::GpuInfo;
use crate::gpu_weights::{self, GpuWeights};

/// Why an OpenCL operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ClError {
    #[error("no OpenCL device: {0}")]
    NoDevice(String),
    #[error("OpenCL {what} failed: {detail}")]
    Driver { what: &'static str, detail: String },
    #[error("OpenCL build failed for {device}:\n{log}")]
    Build { device: String, log: String },
    #[error(transparent)]
    Emit(#[from] EmitError),
    #[error("bad input: {0}")]
    Input(String),
}

fn driver(what: &'static str) -> impl Fn(opencl3::error_codes::ClError) -> ClError {
    move |e| ClError::Driver {
        what,
        detail: e.to_string(),
    }
}

fn input(msg: impl Into<String>) -> ClError {
    ClError::Input(msg.into())
}

/// One device with its context and in-order queue.
pub struct ClDevice {
    device: Device,
    context: Context,
    queue: CommandQueue,
    pub name: String,
    pub driver_version: String,
    pub version: String,
    pub extensions: String,
    /// The platform's name (part of the device fingerprint).
    pub platform: String,
    cache_dir: Option<PathBuf>,
}

impl std::fmt::Debug for ClDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClDevice")
            .field("name", &self.name)
            .field("driver_version", &self.driver_version)
            .field("version", &self.version)
            .finish()
    }
}

/// Whether a program came from the binary cache or was compiled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BuildSource {
    Cache,
    Compiled,
}

/// A built program.
pub struct Built {
    program: ClProgram,
    pub source: BuildSource,
}

/// FNV-1a, 64 bits: a stable hash (std's hasher may change between
/// releases, which would orphan every cache file).
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for &b in *part {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        // Separator so ("ab", "c") and ("a", "bc") differ.
        h ^= 0xff;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

impl ClDevice {
    /// The first GPU of any platform, else the first device of any type
    /// (PoCL's CPU device). The cache directory defaults to
    /// `$TESSERA_OPENCL_CACHE` when set.
    pub fn first() -> Result<ClDevice, ClError> {
        // PoCL 5's device queries are not safe from two threads at once:
        // two tests probing for a device at the same time crashed in its
        // `clGetDeviceInfo` (a strlen on a name being filled in). Device
        // discovery is rare and cheap, so it takes one lock.
        static DISCOVERY: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _one_at_a_time = DISCOVERY
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let platforms =
            get_platforms().map_err(|e| ClError::NoDevice(format!("no OpenCL platform ({e})")))?;
        if platforms.is_empty() {
            return Err(ClError::NoDevice("no OpenCL platform installed".into()));
        }
        let mut chosen = None;
        for kind in [CL_DEVICE_TYPE_GPU, CL_DEVICE_TYPE_ALL] {
            for p in &platforms {
                if let Ok(ids) = p.get_devices(kind)
                    && let Some(&id) = ids.first()
                {
                    chosen = Some((id, p.name().unwrap_or_default()));
                    break;
                }
            }
            if chosen.is_some() {
                break;
            }
        }
        let (id, platform) =
            chosen.ok_or_else(|| ClError::NoDevice("platforms have no devices".into()))?;
        ClDevice::new(Device::new(id), platform)
    }

    fn new(device: Device, platform: String) -> Result<ClDevice, ClError> {
        let context = Context::from_device(&device).map_err(driver("context creation"))?;
        #[allow(deprecated)]
        let queue = CommandQueue::create_default(&context, 0).map_err(driver("queue creation"))?;
        Ok(ClDevice {
            name: device.name().map_err(driver("device query"))?,
            driver_version: device.driver_version().map_err(driver("device query"))?,
            version: device.version().map_err(driver("device query"))?,
            extensions: device.extensions().map_err(driver("device query"))?,
            platform,
            device,
            context,
            queue,
            cache_dir: std::env::var_os("TESSERA_OPENCL_CACHE").map(PathBuf::from),
        })
    }

    /// Keep compiled program binaries in `dir` (created on first write).
    pub fn with_cache_dir(mut self, dir: impl AsRef<Path>) -> ClDevice {
        self.cache_dir = Some(dir.as_ref().to_path_buf());
        self
    }

    /// What the device fingerprint records of this device.
    pub fn gpu_info(&self) -> GpuInfo {
        GpuInfo {
            api: "opencl".into(),
            platform: self.platform.clone(),
            device: self.name.clone(),
            driver: self.driver_version.clone(),
        }
    }

    /// The precision mode this device supports (native half under
    /// `cl_khr_fp16`).
    pub fn fp16_mode(&self) -> Fp16Mode {
        Fp16Mode::for_extensions(&self.extensions)
    }

    pub fn supports_images(&self) -> bool {
        self.device.image_support().unwrap_or(false)
    }

    /// The cache key: device, driver, OpenCL version, options and source.
    pub fn cache_key(&self, source: &str, options: &str) -> String {
        format!(
            "{:016x}",
            fnv1a(&[
                self.name.as_bytes(),
                self.driver_version.as_bytes(),
                self.version.as_bytes(),
                options.as_bytes(),
                source.as_bytes(),
            ])
        )
    }

    fn cache_path(&self, source: &str, options: &str) -> Option<PathBuf> {
        self.cache_dir
            .as_ref()
            .map(|d| d.join(format!("{}.clbin", self.cache_key(source, options))))
    }

    /// Build `source`, from the binary cache when a matching binary exists
    /// (a stale or corrupt one is rebuilt from source and replaced). A
    /// failed compile returns [`ClError::Build`] with the driver's log.
    pub fn build(&self, source: &str) -> Result<Built, ClError> {
        let options = "-cl-std=CL1.2";
        let path = self.cache_path(source, options);
        if let Some(p) = &path
            && let Ok(bin) = std::fs::read(p)
            && let Ok(program) =
                ClProgram::create_and_build_from_binary(&self.context, &[&bin], options)
        {
            return Ok(Built {
                program,
                source: BuildSource::Cache,
            });
        }
        let program = ClProgram::create_and_build_from_source(&self.context, source, options)
            .map_err(|log| ClError::Build {
                device: self.name.clone(),
                log,
            })?;
        if let Some(p) = &path
            && let Ok(bins) = program.get_binaries()
            && let Some(bin) = bins.first().filter(|b| !b.is_empty())
        {
            // The cache is an optimisation: failing to write it is not an error.
            if let Some(dir) = p.parent() {
                let _ = std::fs::create_dir_all(dir);
            }
            let tmp = p.with_extension("tmp");
            if std::fs::write(&tmp, bin).is_ok() {
                let _ = std::fs::rename(&tmp, p);
            }
        }
        Ok(Built {
            program,
            source: BuildSource::Compiled,
        })
    }

    fn buffer<T: Copy>(&self, data: &[T]) -> Result<Buffer<T>, ClError> {
        // Zero-sized buffers are invalid in OpenCL: keep one element.
        let mut owned;
        let data = if data.is_empty() {
            owned = Vec::with_capacity(1);
            // SAFETY: one zeroed element of a plain-data type (f32, u8, f16, i32).
            owned.push(unsafe { std::mem::zeroed::<T>() });
            &owned[..]
        } else {
            data
        };
        // SAFETY: COPY_HOST_PTR copies `data.len()` elements from a live slice
        // during the call; the pointer is not retained.
        unsafe {
            Buffer::<T>::create(
                &self.context,
                CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
                data.len(),
                data.as_ptr() as *mut c_void,
            )
        }
        .map_err(driver("buffer creation"))
    }

    /// A CL_RGBA / CL_UNSIGNED_INT32 image of `width × height` 16-byte texels.
    fn image_u32x4(&self, bytes: &[u8], width: usize, height: usize) -> Result<Image, ClError> {
        if bytes.len() != width * height * 16 {
            return Err(input(format!(
                "image data is {} bytes, {width}x{height} texels need {}",
                bytes.len(),
                width * height * 16
            )));
        }
        let max_w = self.device.image2d_max_width().unwrap_or(0);
        let max_h = self.device.image2d_max_height().unwrap_or(0);
        if !self.supports_images() || width > max_w || height > max_h {
            return Err(input(format!(
                "{width}x{height} image exceeds the device's image2d limits {max_w}x{max_h} (or images unsupported)"
            )));
        }
        let format = cl_image_format {
            image_channel_order: CL_RGBA,
            image_channel_data_type: CL_UNSIGNED_INT32,
        };
        let desc = cl_image_desc {
            image_type: CL_MEM_OBJECT_IMAGE2D,
            image_width: width,
            image_height: height,
            image_depth: 1,
            image_array_size: 1,
            image_row_pitch: 0,
            image_slice_pitch: 0,
            num_mip_levels: 0,
            num_samples: 0,
            buffer: ptr::null_mut(),
        };
        // SAFETY: format and desc are live locals; COPY_HOST_PTR copies
        // width·height·16 bytes (checked above) during the call.
        unsafe {
            Image::create(
                &self.context,
                CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                &format,
                &desc,
                bytes.as_ptr() as *mut c_void,
            )
        }
        .map_err(driver("image creation"))
    }

    fn read<T: Copy + Default>(&self, buf: &Buffer<T>, len: usize) -> Result<Vec<T>, ClError> {
        let mut out = vec![T::default(); len.max(1)];
        // SAFETY: blocking read of `out.len()` elements, no more than the
        // buffer holds (every output buffer is created with at least that).
        unsafe {
            self.queue
                .enqueue_read_buffer(buf, CL_BLOCKING, 0, &mut out, &[])
                .map_err(driver("read back"))?;
        }
        out.truncate(len);
        Ok(out)
    }
}

/// A bound kernel argument.
enum Arg {
    Mem(cl_mem),
    Int(cl_int),
}

fn launch(
    dev: &ClDevice,
    built: &Built,
    entry: &str,
    args: &[KernelArg],
    bound: &[(&'static str, Arg)],
    dims: &[LaunchDim; 3],
    extent: impl Fn(LaunchExtent) -> usize,
) -> Result<(), ClError> {
    let kernel = ClKernel::create(&built.program, entry).map_err(driver("kernel creation"))?;
    launch_kernel(dev, &kernel, args, bound, dims, extent)
}

/// Bind `bound` in the order of `args`, launch and wait.
fn launch_kernel(
    dev: &ClDevice,
    kernel: &ClKernel,
    args: &[KernelArg],
    bound: &[(&'static str, Arg)],
    dims: &[LaunchDim; 3],
    extent: impl Fn(LaunchExtent) -> usize,
) -> Result<(), ClError> {
    let mut exec = ExecuteKernel::new(kernel);
    for a in args {
        let (_, value) = bound
            .iter()
            .find(|(n, _)| *n == a.name)
            .ok_or_else(|| input(format!("argument `{}` is not bound", a.name)))?;
        // SAFETY: each argument matches the kind the emitted signature
        // declares (memory objects for pointers/images, cl_int for ints).
        unsafe {
            match value {
                Arg::Mem(m) => exec.set_arg(m),
                Arg::Int(i) => exec.set_arg(i),
            };
        }
    }
    let global: Vec<usize> = dims.iter().map(|d| d.global(extent(d.extent))).collect();
    let local: Vec<usize> = dims.iter().map(|d| d.local as usize).collect();
    exec.set_global_work_sizes(&global)
        .set_local_work_sizes(&local);
    // SAFETY: all arguments are set and every buffer outlives the call
    // (`finish` below waits for completion before they drop).
    unsafe {
        exec.enqueue_nd_range(&dev.queue)
            .map_err(driver("kernel launch"))?;
    }
    dev.queue.finish().map_err(driver("queue finish"))?;
    Ok(())
}

fn to_int(v: usize, what: &str) -> Result<cl_int, ClError> {
    cl_int::try_from(v).map_err(|_| input(format!("{what} = {v} does not fit a 32-bit int")))
}

/// f16 weights `[h, l]` in the GPU layout `[l/lp, h, lp]`, as halves.
pub fn pack_f16_gpu(h: usize, l: usize, w: &[f16]) -> Result<Vec<f16>, ClError> {
    let bits = gpu_weights::pack_f16_gpu(h, l, w).map_err(input)?;
    Ok(bits.into_iter().map(f16::from_bits).collect())
}

/// Run a matmul program: `x` is `[e, l]` f16, `w` the logical weights (an
/// f16 `[h, l]` value or a quantized tensor with rows `h`), `bias` `[h]`.
/// Returns `y` `[e, h]` as f32.
#[allow(clippy::too_many_arguments)]
pub fn run_matmul(
    dev: &ClDevice,
    program: &Program,
    x: &[f16],
    w: &Value,
    bias: Option<&[f32]>,
    e: usize,
    h: usize,
    l: usize,
) -> Result<Vec<f32>, ClError> {
    let Program::Matmul { plan, source } = program else {
        return Err(input("run_matmul needs a matmul program"));
    };
    check_len("x", x.len(), e * l)?;
    if plan.bias && bias.is_none_or(|b| b.len() != h) {
        return Err(input(format!("the kernel needs a bias of {h} elements")));
    }
    let built = dev.build(source)?;
    let xb = dev.buffer(x)?;
    let (mut mems, scales, offsets): (Vec<WeightMem>, Vec<u8>, Vec<u8>) =
        match gpu_weights::prepare(plan.weights.format, w, h, l).map_err(input)? {
            GpuWeights::Halves(bits) => {
                let halves: Vec<f16> = bits.into_iter().map(f16::from_bits).collect();
                (vec![WeightMem::Buf(dev.buffer(&halves)?)], vec![], vec![])
            }
            GpuWeights::Quant(packed) => {
                let mem = match plan.memory {
                    WeightMemory::Buffer => WeightMem::Bytes(dev.buffer(&packed.codes)?),
                    WeightMemory::Image => {
                        let width = h * plan.weights.chunks_per_block as usize;
                        let height = l.div_ceil(WEIGHT_LP as usize);
                        WeightMem::Image(dev.image_u32x4(
                            &packed.codes,
                            width.max(1),
                            height.max(1),
                        )?)
                    }
                };
                (vec![mem], packed.scales, packed.offsets)
            }
        };
    let sb = dev.buffer(&scales)?;
    let ob = dev.buffer(&offsets)?;
    let bb = dev.buffer(bias.unwrap_or(&[]))?;
    let ylen = e * h;
    let yf = dev.buffer(&vec![0f32; ylen])?;
    let yh = dev.buffer(&vec![f16::ZERO; ylen])?;
    let out_half = plan.args.iter().any(|a| a.kind == ArgKind::HalfOut);
    let wmem = mems.remove(0);
    let bound = [
        ("x", Arg::Mem(xb.get())),
        ("w", Arg::Mem(wmem.get())),
        ("scales", Arg::Mem(sb.get())),
        ("offsets", Arg::Mem(ob.get())),
        ("bias", Arg::Mem(bb.get())),
        ("y", Arg::Mem(if out_half { yh.get() } else { yf.get() })),
        ("e", Arg::Int(to_int(e, "e")?)),
        ("h", Arg::Int(to_int(h, "h")?)),
        ("l", Arg::Int(to_int(l, "l")?)),
    ];
    if e == 0 || h == 0 {
        return Ok(Vec::new());
    }
    launch(
        dev,
        &built,
        &plan.entry,
        &plan.args,
        &bound,
        &plan.launch,
        |x| match x {
            LaunchExtent::E => e,
            LaunchExtent::H => h,
            _ => 1,
        },
    )?;
    if out_half {
        Ok(dev.read(&yh, ylen)?.into_iter().map(f16::to_f32).collect())
    } else {
        dev.read(&yf, ylen)
    }
}

fn check_len(what: &str, got: usize, expected: usize) -> Result<(), ClError> {
    if got == expected {
        Ok(())
    } else {
        Err(input(format!(
            "{what}: expected {expected} elements, got {got}"
        )))
    }
}

enum WeightMem {
    Buf(Buffer<f16>),
    Bytes(Buffer<u8>),
    Image(Image),
}

impl WeightMem {
    fn get(&self) -> cl_mem {
        match self {
            WeightMem::Buf(b) => b.get(),
            WeightMem::Bytes(b) => b.get(),
            WeightMem::Image(i) => i.get(),
        }
    }
}

/// What a decode attention call returns.
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionResult {
    /// `o[1, hq, d]` as f32 (rounded to f16 by the kernel).
    pub o: Vec<f32>,
    /// (split, head) pairs that left the unified-max range and recomputed.
    pub recomputed: usize,
    pub splits: usize,
}

/// Run a decode attention program: `q` `[1, hq, d]` f16, caches `k`, `v`
/// `[s, kvh, d]` as the interpreter binds them (f16 or quantized with rows
/// `s·kvh`).
#[allow(clippy::too_many_arguments)]
pub fn run_attention(
    dev: &ClDevice,
    program: &Program,
    q: &[f16],
    k: &Value,
    v: &Value,
    hq: usize,
    kvh: usize,
    d: usize,
    s: usize,
) -> Result<AttentionResult, ClError> {
    let Program::Attention { plan, source } = program else {
        return Err(input("run_attention needs an attention program"));
    };
    if kvh == 0 || !hq.is_multiple_of(kvh) {
        return Err(input(format!(
            "query heads {hq} are not a multiple of KV heads {kvh}"
        )));
    }
    if s == 0 {
        return Err(input("attention over an empty KV sequence"));
    }
    check_len("q", q.len(), hq * d)?;
    let built = dev.build(source)?;
    let splits = s.div_ceil(plan.keys_per_split as usize);
    let qb = dev.buffer(q)?;
    let (kb, ks, ko) = cache_buffers(dev, plan.k, k, s * kvh, d, "k")?;
    let (vb, _, _) = cache_buffers(dev, plan.v, v, s * kvh, d, "v")?;
    let po = dev.buffer(&vec![0f32; splits * hq * d])?;
    let pm = dev.buffer(&vec![0f32; splits * hq])?;
    let pl = dev.buffer(&vec![0f32; splits * hq])?;
    let rc = dev.buffer(&vec![0i32; splits * hq])?;
    let ob = dev.buffer(&vec![f16::ZERO; hq * d])?;
    if hq == 0 || d == 0 {
        return Ok(AttentionResult {
            o: Vec::new(),
            recomputed: 0,
            splits,
        });
    }
    let ints = [
        ("hq", Arg::Int(to_int(hq, "hq")?)),
        ("kvh", Arg::Int(to_int(kvh, "kvh")?)),
        ("d", Arg::Int(to_int(d, "d")?)),
        ("s", Arg::Int(to_int(s, "s")?)),
        ("splits", Arg::Int(to_int(splits, "splits")?)),
    ];
    let mut bound = vec![
        ("q", Arg::Mem(qb.get())),
        ("k", Arg::Mem(kb.get())),
        ("k_scales", Arg::Mem(ks.get())),
        ("k_offsets", Arg::Mem(ko.get())),
        ("v", Arg::Mem(vb.get())),
        ("part_o", Arg::Mem(po.get())),
        ("part_m", Arg::Mem(pm.get())),
        ("part_l", Arg::Mem(pl.get())),
        ("recomputed", Arg::Mem(rc.get())),
        ("o", Arg::Mem(ob.get())),
    ];
    bound.extend(ints);
    let extent = |x: LaunchExtent| match x {
        LaunchExtent::Splits => splits,
        LaunchExtent::KvHeads => kvh,
        LaunchExtent::Heads => hq,
        LaunchExtent::HeadDim => d,
        _ => 1,
    };
    launch(
        dev,
        &built,
        &plan.partial_entry,
        &plan.partial_args,
        &bound,
        &plan.partial_launch,
        extent,
    )?;
    launch(
        dev,
        &built,
        &plan.combine_entry,
        &plan.combine_args,
        &bound,
        &plan.combine_launch,
        extent,
    )?;
    let o = dev
        .read(&ob, hq * d)?
        .into_iter()
        .map(f16::to_f32)
        .collect();
    let recomputed = dev
        .read(&rc, splits * hq)?
        .into_iter()
        .filter(|&r| r != 0)
        .count();
    Ok(AttentionResult {
        o,
        recomputed,
        splits,
    })
}

type CacheBuffers = (WeightMem, Buffer<f32>, Buffer<f32>);

/// Run a causal prefill program: `q` `[t, hq, d]` f16, caches `k`, `v`
/// `[s, kvh, d]` as the interpreter binds them (f16 or quantized with rows
/// `s·kvh`), token i of t at position `s − t + i`. Returns `o[t, hq, d]`
/// as f32 (rounded to f16 by the kernel).
#[allow(clippy::too_many_arguments)]
pub fn run_prefill(
    dev: &ClDevice,
    program: &Program,
    q: &[f16],
    k: &Value,
    v: &Value,
    t: usize,
    s: usize,
    hq: usize,
    kvh: usize,
) -> Result<Vec<f32>, ClError> {
    let pre = ClPrefill::new(dev, program)?;
    let plan = pre.plan();
    let d = plan.d as usize;
    let elems = resident::prefill_elems(t, s, hq, kvh, d)?;
    check_len("q", q.len(), elems)?;
    if elems == 0 {
        return Ok(Vec::new());
    }
    let qb = dev.buffer(q)?;
    let (kb, ks, ko) = cache_buffers(dev, plan.k, k, s * kvh, d, "k")?;
    let (vb, _, _) = cache_buffers(dev, plan.v, v, s * kvh, d, "v")?;
    let ob = dev.buffer(&vec![f16::ZERO; elems])?;
    resident::launch_prefill(
        dev,
        &pre,
        [qb.get(), kb.get(), ks.get(), ko.get(), vb.get(), ob.get()],
        [t, s, hq, kvh],
    )?;
    Ok(dev.read(&ob, elems)?.into_iter().map(f16::to_f32).collect())
}

fn cache_buffers(
    dev: &ClDevice,
    format: KvFormat,
    value: &Value,
    rows: usize,
    d: usize,
    what: &str,
) -> Result<CacheBuffers, ClError> {
    match (format, value) {
        (KvFormat::F16, Value::F16(data)) => {
            check_len(what, data.len(), rows * d)?;
            Ok((
                WeightMem::Buf(dev.buffer(data)?),
                dev.buffer::<f32>(&[])?,
                dev.buffer::<f32>(&[])?,
            ))
        }
        (KvFormat::I8AsymRow | KvFormat::Fp8E4M3 | KvFormat::Fp8E5M2, Value::Quant(qt)) => {
            if qt.rows != rows || qt.cols != d {
                return Err(input(format!(
                    "{what} cache is [{}, {}], expected [{rows}, {d}]",
                    qt.rows, qt.cols
                )));
            }
            qt.validate().map_err(|e| input(format!("{what}: {e}")))?;
            let per_row = format == KvFormat::I8AsymRow;
            if per_row && qt.groups_per_row() != 1 {
                return Err(input(format!("{what}: one group per row expected")));
            }
            Ok((
                WeightMem::Bytes(dev.buffer(&qt.codes)?),
                dev.buffer(if per_row { &qt.scales } else { &[] })?,
                dev.buffer(if per_row { &qt.offsets } else { &[] })?,
            ))
        }
        (f, other) => Err(input(format!(
            "{what} cache bound as {}, the kernel reads {f:?}",
            other.kind()
        ))),
    }
}
