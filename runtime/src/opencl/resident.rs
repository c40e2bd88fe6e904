//! Device-resident OpenCL objects for the runtime's `Linear` and
//! `Attention`: programs built once with their kernel objects, weights
//! packed into the GPU layout and uploaded once, and a KV cache kept in
//! device buffers that grows in place (a growth copies on the device).
//!
//! [`super::run_matmul`] / [`super::run_attention`] stay the one-shot
//! entry points (upload, run, read back) for tests and tools; these are
//! what a model runs every token.

use std::ptr;
use std::sync::{Mutex, MutexGuard};

use half::f16;
use opencl3::kernel::Kernel as ClKernel;
use opencl3::memory::{Buffer, CL_MEM_READ_WRITE, ClMem};
use opencl3::types::{CL_BLOCKING, cl_mem};
use tessera_codegen::gpu::{
    ArgKind, AttentionPlan, KvFormat, LaunchExtent, MatmulPlan, PrefillPlan, WeightMemory,
};
use tessera_codegen::opencl::Program;
use tessera_dsl::Format;
use tessera_dsl::interp::Value;

use super::{Arg, BuildSource, Built, ClDevice, ClError, driver, input, launch_kernel, to_int};
use crate::gpu_weights::{self, GpuWeights};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl ClDevice {
    /// An uninitialised device buffer of `len` elements (at least one).
    pub(super) fn alloc<T>(&self, len: usize) -> Result<Buffer<T>, ClError> {
        // SAFETY: no host pointer is passed; the driver allocates
        // `len.max(1)` elements of T.
        unsafe {
            Buffer::<T>::create(
                &self.context,
                CL_MEM_READ_WRITE,
                len.max(1),
                ptr::null_mut(),
            )
        }
        .map_err(driver("buffer creation"))
    }

    /// Write `data` at element `at` of `buf` (blocking); `capacity` is the
    /// buffer's length in elements, checked before the call.
    pub(super) fn write_at<T>(
        &self,
        buf: &mut Buffer<T>,
        capacity: usize,
        at: usize,
        data: &[T],
    ) -> Result<(), ClError> {
        if data.is_empty() {
            return Ok(());
        }
        if at + data.len() > capacity {
            return Err(input(format!(
                "write of {} elements at {at} exceeds a buffer of {capacity}",
                data.len()
            )));
        }
        // SAFETY: blocking write of `data` (a live slice) into the range
        // checked above.
        unsafe {
            self.queue
                .enqueue_write_buffer(buf, CL_BLOCKING, at * size_of::<T>(), data, &[])
                .map_err(driver("buffer write"))?;
        }
        Ok(())
    }

    /// Read the first `out.len()` elements of `buf` (at least that long).
    fn read_into<T>(&self, buf: &Buffer<T>, out: &mut [T]) -> Result<(), ClError> {
        if out.is_empty() {
            return Ok(());
        }
        // SAFETY: blocking read of `out.len()` elements; every caller sized
        // `buf` to at least that.
        unsafe {
            self.queue
                .enqueue_read_buffer(buf, CL_BLOCKING, 0, out, &[])
                .map_err(driver("read back"))?;
        }
        Ok(())
    }

    /// Copy the first `len` elements of `src` into `dst` on the device.
    fn copy<T>(&self, src: &Buffer<T>, dst: &mut Buffer<T>, len: usize) -> Result<(), ClError> {
        if len == 0 {
            return Ok(());
        }
        // SAFETY: both buffers hold at least `len` elements (the caller
        // grows into a larger buffer); `finish` orders the copy before use.
        unsafe {
            self.queue
                .enqueue_copy_buffer(src, dst, 0, 0, len * size_of::<T>(), &[])
                .map_err(driver("buffer copy"))?;
        }
        self.queue.finish().map_err(driver("queue finish"))
    }
}

/// A matmul program built once, with its kernel object. Launches lock the
/// kernel (arguments are per-kernel state), so one `ClMatmul` serves every
/// layer of its shape family from any thread.
pub struct ClMatmul {
    kernel: Mutex<ClKernel>,
    plan: MatmulPlan,
    /// Whether the binary cache served the build.
    pub source: BuildSource,
    _built: Built,
}

impl std::fmt::Debug for ClMatmul {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClMatmul")
            .field("entry", &self.plan.entry)
            .field("source", &self.source)
            .finish()
    }
}

impl ClMatmul {
    /// Build `program` (through the binary cache) and create its kernel.
    /// Resident weights are buffers: the image GEMV runs through
    /// [`super::run_matmul`] only.
    pub fn new(dev: &ClDevice, program: &Program) -> Result<ClMatmul, ClError> {
        let Program::Matmul { plan, source } = program else {
            return Err(input("ClMatmul needs a matmul program"));
        };
        if plan.memory != WeightMemory::Buffer {
            return Err(input(
                "resident weights live in buffers; emit the program with WeightMemory::Buffer",
            ));
        }
        let built = dev.build(source)?;
        let kernel =
            ClKernel::create(&built.program, &plan.entry).map_err(driver("kernel creation"))?;
        Ok(ClMatmul {
            kernel: Mutex::new(kernel),
            plan: plan.clone(),
            source: built.source,
            _built: built,
        })
    }

    pub fn plan(&self) -> &MatmulPlan {
        &self.plan
    }
}

/// Linear weights on the device: packed into the GPU layout `[l/lp, h,
/// lp]` once and uploaded once. The layout does not depend on the tile,
/// so one upload serves the GEMV, flat GEMM and GEMM of its shape.
pub struct ClWeights {
    format: Format,
    h: usize,
    l: usize,
    w: Buffer<u8>,
    /// Group parameters as the format stores them (f32 or f16 bytes).
    scales: Buffer<u8>,
    offsets: Buffer<u8>,
    bias: Option<Buffer<f32>>,
    bytes: usize,
}

impl std::fmt::Debug for ClWeights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClWeights")
            .field("format", &self.format)
            .field("h", &self.h)
            .field("l", &self.l)
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl ClWeights {
    /// Check `w` (`[h, l]`, f16 or quantized in `format`) and `bias`
    /// (`[h]`), pack and upload them.
    pub fn upload(
        dev: &ClDevice,
        format: Format,
        w: &Value,
        bias: Option<&[f32]>,
        h: usize,
        l: usize,
    ) -> Result<ClWeights, ClError> {
        if h == 0 || l == 0 {
            return Err(input(format!("weights [{h}, {l}]: both sides must be ≥ 1")));
        }
        if let Some(b) = bias
            && b.len() != h
        {
            return Err(input(format!(
                "bias: expected {h} elements, got {}",
                b.len()
            )));
        }
        let (codes, scales, offsets) = match gpu_weights::prepare(format, w, h, l).map_err(input)? {
            GpuWeights::Halves(bits) => (
                bits.iter()
                    .flat_map(|b| b.to_le_bytes())
                    .collect::<Vec<u8>>(),
                Vec::new(),
                Vec::new(),
            ),
            GpuWeights::Quant(p) => (p.codes, p.scales, p.offsets),
        };
        let bytes = codes.len() + scales.len() + offsets.len();
        Ok(ClWeights {
            format,
            h,
            l,
            w: dev.buffer(&codes)?,
            scales: dev.buffer(&scales)?,
            offsets: dev.buffer(&offsets)?,
            bias: bias.map(|b| dev.buffer(b)).transpose()?,
            bytes,
        })
    }

    /// Device bytes of the packed weights and their parameters.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// Where a resident matmul writes (the plan's output dtype).
pub enum ClOutput<'a> {
    F32(&'a mut [f32]),
    F16(&'a mut [f16]),
}

/// Activations and output kept on the device between calls (the
/// autotuner's timing loop: launches only, no transfers).
pub struct ClIo {
    x: Buffer<f16>,
    x_len: usize,
    y: Buffer<u8>,
    e: usize,
    h: usize,
}

impl ClIo {
    /// Upload `x` (`[e, l]`) and room for `[e, h]` outputs of either dtype.
    pub fn new(dev: &ClDevice, x: &[f16], e: usize, h: usize) -> Result<ClIo, ClError> {
        Ok(ClIo {
            x: dev.buffer(x)?,
            x_len: x.len(),
            y: dev.alloc::<u8>(e * h * 4)?,
            e,
            h,
        })
    }
}

fn check_call(k: &ClMatmul, w: &ClWeights, e: usize) -> Result<(), ClError> {
    let plan = &k.plan;
    if w.format != plan.weights.format {
        return Err(input(format!(
            "weights are {}, the kernel reads {}",
            w.format, plan.weights.format
        )));
    }
    if plan.bias && w.bias.is_none() {
        return Err(input(format!(
            "the kernel needs a bias of {} elements",
            w.h
        )));
    }
    to_int(e, "e")?;
    to_int(w.h, "h")?;
    to_int(w.l, "l")?;
    Ok(())
}

fn run_resident(
    dev: &ClDevice,
    k: &ClMatmul,
    w: &ClWeights,
    x: &Buffer<f16>,
    y: cl_mem,
    e: usize,
) -> Result<(), ClError> {
    let plan = &k.plan;
    let unused = &w.scales;
    let bound = [
        ("x", Arg::Mem(x.get())),
        ("w", Arg::Mem(w.w.get())),
        ("scales", Arg::Mem(w.scales.get())),
        ("offsets", Arg::Mem(w.offsets.get())),
        (
            "bias",
            Arg::Mem(w.bias.as_ref().map_or(unused.get(), |b| b.get())),
        ),
        ("y", Arg::Mem(y)),
        ("e", Arg::Int(to_int(e, "e")?)),
        ("h", Arg::Int(to_int(w.h, "h")?)),
        ("l", Arg::Int(to_int(w.l, "l")?)),
    ];
    let kernel = lock(&k.kernel);
    launch_kernel(
        dev,
        &kernel,
        &plan.args,
        &bound,
        &plan.launch,
        |x| match x {
            LaunchExtent::E => e,
            LaunchExtent::H => w.h,
            _ => 1,
        },
    )
}

/// `y[e, h] = x[e, l] · wᵀ + bias` with resident weights: uploads `x`,
/// launches, reads `y` back. Every length and dtype is checked first.
pub fn matmul_into(
    dev: &ClDevice,
    k: &ClMatmul,
    w: &ClWeights,
    x: &[f16],
    e: usize,
    y: ClOutput<'_>,
) -> Result<(), ClError> {
    check_call(k, w, e)?;
    let (h, l) = (w.h, w.l);
    super::check_len("x", x.len(), e * l)?;
    let half_out = k.plan.args.iter().any(|a| a.kind == ArgKind::HalfOut);
    let y_len = match &y {
        ClOutput::F32(v) if !half_out => v.len(),
        ClOutput::F16(v) if half_out => v.len(),
        _ => {
            return Err(input(format!(
                "y dtype: the kernel writes {}",
                k.plan.y_format
            )));
        }
    };
    super::check_len("y", y_len, e * h)?;
    if e == 0 {
        return Ok(());
    }
    let xb = dev.buffer(x)?;
    match y {
        ClOutput::F32(out) => {
            let yb = dev.alloc::<f32>(e * h)?;
            run_resident(dev, k, w, &xb, yb.get(), e)?;
            dev.read_into(&yb, out)
        }
        ClOutput::F16(out) => {
            let yb = dev.alloc::<f16>(e * h)?;
            run_resident(dev, k, w, &xb, yb.get(), e)?;
            dev.read_into(&yb, out)
        }
    }
}

/// One resident launch on `io` (no transfers): what the autotuner times.
pub fn matmul_launch(
    dev: &ClDevice,
    k: &ClMatmul,
    w: &ClWeights,
    io: &ClIo,
    e: usize,
) -> Result<(), ClError> {
    check_call(k, w, e)?;
    if e > io.e || w.h > io.h || io.x_len < e * w.l {
        return Err(input(format!(
            "io buffers hold [{}, {}], the call needs e={e}, h={}, l={}",
            io.e, io.h, w.h, w.l
        )));
    }
    if e == 0 {
        return Ok(());
    }
    run_resident(dev, k, w, &io.x, io.y.get(), e)
}

/// A decode attention program built once, with its two kernel objects.
pub struct ClAttention {
    kernels: Mutex<(ClKernel, ClKernel)>,
    plan: AttentionPlan,
    pub source: BuildSource,
    _built: Built,
}

impl std::fmt::Debug for ClAttention {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClAttention")
            .field("entry", &self.plan.partial_entry)
            .field("source", &self.source)
            .finish()
    }
}

impl ClAttention {
    pub fn new(dev: &ClDevice, program: &Program) -> Result<ClAttention, ClError> {
        let Program::Attention { plan, source } = program else {
            return Err(input("ClAttention needs an attention program"));
        };
        let built = dev.build(source)?;
        let partial = ClKernel::create(&built.program, &plan.partial_entry)
            .map_err(driver("kernel creation"))?;
        let combine = ClKernel::create(&built.program, &plan.combine_entry)
            .map_err(driver("kernel creation"))?;
        Ok(ClAttention {
            kernels: Mutex::new((partial, combine)),
            plan: plan.clone(),
            source: built.source,
            _built: built,
        })
    }

    pub fn plan(&self) -> &AttentionPlan {
        &self.plan
    }
}

/// A causal prefill program (one head dim) built once, with its kernel.
pub struct ClPrefill {
    kernel: Mutex<ClKernel>,
    plan: PrefillPlan,
    pub source: BuildSource,
    _built: Built,
}

impl std::fmt::Debug for ClPrefill {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClPrefill")
            .field("entry", &self.plan.entry)
            .field("d", &self.plan.d)
            .field("source", &self.source)
            .finish()
    }
}

impl ClPrefill {
    pub fn new(dev: &ClDevice, program: &Program) -> Result<ClPrefill, ClError> {
        let Program::Prefill { plan, source } = program else {
            return Err(input("ClPrefill needs a prefill program"));
        };
        let built = dev.build(source)?;
        let kernel =
            ClKernel::create(&built.program, &plan.entry).map_err(driver("kernel creation"))?;
        Ok(ClPrefill {
            kernel: Mutex::new(kernel),
            plan: plan.clone(),
            source: built.source,
            _built: built,
        })
    }

    pub fn plan(&self) -> &PrefillPlan {
        &self.plan
    }
}

pub use crate::gpu_kv::KvRows;
use crate::gpu_kv::elem_bytes;

/// One of K or V on the device.
struct KvSide {
    format: KvFormat,
    data: Buffer<u8>,
    scales: Buffer<f32>,
    offsets: Buffer<f32>,
}

impl KvSide {
    fn new(dev: &ClDevice, format: KvFormat, rows: usize, d: usize) -> Result<KvSide, ClError> {
        let params = if format == KvFormat::I8AsymRow {
            rows
        } else {
            0
        };
        Ok(KvSide {
            format,
            data: dev.alloc::<u8>(rows * d * elem_bytes(format))?,
            scales: dev.alloc::<f32>(params)?,
            offsets: dev.alloc::<f32>(params)?,
        })
    }

    /// Copy the first `rows` rows of `self` into `into`.
    fn copy_into(
        &self,
        dev: &ClDevice,
        into: &mut KvSide,
        rows: usize,
        d: usize,
    ) -> Result<(), ClError> {
        dev.copy(
            &self.data,
            &mut into.data,
            rows * d * elem_bytes(self.format),
        )?;
        if self.format == KvFormat::I8AsymRow {
            dev.copy(&self.scales, &mut into.scales, rows)?;
            dev.copy(&self.offsets, &mut into.offsets, rows)?;
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn write(
        &mut self,
        dev: &ClDevice,
        cap_rows: usize,
        at_row: usize,
        rows: usize,
        d: usize,
        what: &str,
        data: KvRows<'_>,
    ) -> Result<(), ClError> {
        let eb = elem_bytes(self.format);
        match (self.format, data) {
            (KvFormat::F16, KvRows::F16(v)) => {
                super::check_len(what, v.len(), rows * d)?;
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect();
                dev.write_at(&mut self.data, cap_rows * d * eb, at_row * d * eb, &bytes)
            }
            (
                f @ (KvFormat::I8AsymRow | KvFormat::Fp8E4M3 | KvFormat::Fp8E5M2),
                KvRows::Bytes {
                    codes,
                    scales,
                    offsets,
                },
            ) => {
                super::check_len(what, codes.len(), rows * d)?;
                let params = if f == KvFormat::I8AsymRow { rows } else { 0 };
                super::check_len("scales", scales.len(), params)?;
                super::check_len("offsets", offsets.len(), params)?;
                dev.write_at(&mut self.data, cap_rows * d, at_row * d, codes)?;
                if params > 0 {
                    dev.write_at(&mut self.scales, cap_rows, at_row, scales)?;
                    dev.write_at(&mut self.offsets, cap_rows, at_row, offsets)?;
                }
                Ok(())
            }
            (f, _) => Err(input(format!("{what}: rows not encoded as {f:?}"))),
        }
    }
}

/// A KV cache `[tokens, kvh, d]` in device buffers. Tokens are written
/// after the last ones (in place); the kernels read the first `s` tokens
/// as a prefix. [`ClKvCache::grow`] moves to larger buffers with one
/// device-side copy.
pub struct ClKvCache {
    kvh: usize,
    d: usize,
    capacity: usize,
    k: KvSide,
    v: KvSide,
}

impl std::fmt::Debug for ClKvCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClKvCache")
            .field("k", &self.k.format)
            .field("v", &self.v.format)
            .field("kvh", &self.kvh)
            .field("d", &self.d)
            .field("capacity", &self.capacity)
            .finish()
    }
}

impl ClKvCache {
    /// Room for `tokens` tokens of `kvh` heads of dimension `d`.
    pub fn new(
        dev: &ClDevice,
        k: KvFormat,
        v: KvFormat,
        kvh: usize,
        d: usize,
        tokens: usize,
    ) -> Result<ClKvCache, ClError> {
        if kvh == 0 || d == 0 || tokens == 0 {
            return Err(input(format!(
                "KV cache kvh={kvh}, d={d}, tokens={tokens}: all must be ≥ 1"
            )));
        }
        let rows = tokens
            .checked_mul(kvh)
            .and_then(|r| r.checked_mul(d).map(|_| r))
            .ok_or_else(|| input("KV cache size overflows"))?;
        Ok(ClKvCache {
            kvh,
            d,
            capacity: tokens,
            k: KvSide::new(dev, k, rows, d)?,
            v: KvSide::new(dev, v, rows, d)?,
        })
    }

    /// Tokens the buffers hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The K and V buffer handles (change only when the cache grows).
    pub fn addresses(&self) -> (usize, usize) {
        (self.k.data.get() as usize, self.v.data.get() as usize)
    }

    /// Move to buffers for `tokens` tokens, keeping the first `used`.
    pub fn grow(&mut self, dev: &ClDevice, tokens: usize, used: usize) -> Result<(), ClError> {
        if tokens <= self.capacity {
            return Ok(());
        }
        if used > self.capacity {
            return Err(input(format!(
                "{used} used tokens exceed the capacity {}",
                self.capacity
            )));
        }
        let mut bigger =
            ClKvCache::new(dev, self.k.format, self.v.format, self.kvh, self.d, tokens)?;
        let rows = used * self.kvh;
        self.k.copy_into(dev, &mut bigger.k, rows, self.d)?;
        self.v.copy_into(dev, &mut bigger.v, rows, self.d)?;
        *self = bigger;
        Ok(())
    }

    /// Write `tokens` tokens at token position `at` (within the capacity).
    pub fn write(
        &mut self,
        dev: &ClDevice,
        at: usize,
        tokens: usize,
        k: KvRows<'_>,
        v: KvRows<'_>,
    ) -> Result<(), ClError> {
        if at + tokens > self.capacity {
            return Err(input(format!(
                "tokens {at}..{} exceed the capacity {}",
                at + tokens,
                self.capacity
            )));
        }
        let (cap, at_row, rows) = (self.capacity * self.kvh, at * self.kvh, tokens * self.kvh);
        self.k.write(dev, cap, at_row, rows, self.d, "keys", k)?;
        self.v.write(dev, cap, at_row, rows, self.d, "values", v)
    }
}

/// One query token (`q`, `o`: `[hq, d]` f16) over the first `s` cached
/// tokens. Returns how many (split, head) pairs recomputed.
pub fn attention_into(
    dev: &ClDevice,
    att: &ClAttention,
    q: &[f16],
    cache: &ClKvCache,
    s: usize,
    hq: usize,
    o: &mut [f16],
) -> Result<usize, ClError> {
    let plan = &att.plan;
    let (kvh, d) = (cache.kvh, cache.d);
    if plan.k != cache.k.format || plan.v != cache.v.format {
        return Err(input(format!(
            "the cache holds K {:?} / V {:?}, the kernel reads K {:?} / V {:?}",
            cache.k.format, cache.v.format, plan.k, plan.v
        )));
    }
    if hq == 0 || !hq.is_multiple_of(kvh) {
        return Err(input(format!(
            "query heads {hq} are not a positive multiple of KV heads {kvh}"
        )));
    }
    if s == 0 || s > cache.capacity {
        return Err(input(format!(
            "attention over {s} tokens of a cache holding {}",
            cache.capacity
        )));
    }
    super::check_len("q", q.len(), hq * d)?;
    super::check_len("o", o.len(), hq * d)?;
    let splits = s.div_ceil(plan.keys_per_split as usize);
    let qb = dev.buffer(q)?;
    let po = dev.alloc::<f32>(splits * hq * d)?;
    let pm = dev.alloc::<f32>(splits * hq)?;
    let pl = dev.alloc::<f32>(splits * hq)?;
    let rc = dev.buffer(&vec![0i32; splits * hq])?;
    let ob = dev.alloc::<f16>(hq * d)?;
    let mut bound = vec![
        ("q", Arg::Mem(qb.get())),
        ("k", Arg::Mem(cache.k.data.get())),
        ("k_scales", Arg::Mem(cache.k.scales.get())),
        ("k_offsets", Arg::Mem(cache.k.offsets.get())),
        ("v", Arg::Mem(cache.v.data.get())),
        ("part_o", Arg::Mem(po.get())),
        ("part_m", Arg::Mem(pm.get())),
        ("part_l", Arg::Mem(pl.get())),
        ("recomputed", Arg::Mem(rc.get())),
        ("o", Arg::Mem(ob.get())),
    ];
    bound.extend([
        ("hq", Arg::Int(to_int(hq, "hq")?)),
        ("kvh", Arg::Int(to_int(kvh, "kvh")?)),
        ("d", Arg::Int(to_int(d, "d")?)),
        ("s", Arg::Int(to_int(s, "s")?)),
        ("splits", Arg::Int(to_int(splits, "splits")?)),
    ]);
    let extent = |x: LaunchExtent| match x {
        LaunchExtent::Splits => splits,
        LaunchExtent::KvHeads => kvh,
        LaunchExtent::Heads => hq,
        LaunchExtent::HeadDim => d,
        _ => 1,
    };
    {
        let kernels = lock(&att.kernels);
        launch_kernel(
            dev,
            &kernels.0,
            &plan.partial_args,
            &bound,
            &plan.partial_launch,
            extent,
        )?;
        launch_kernel(
            dev,
            &kernels.1,
            &plan.combine_args,
            &bound,
            &plan.combine_launch,
            extent,
        )?;
    }
    dev.read_into(&ob, o)?;
    let mut flags = vec![0i32; splits * hq];
    dev.read_into(&rc, &mut flags)?;
    Ok(flags.iter().filter(|&&r| r != 0).count())
}

/// A causal prefill of `t` query tokens (`q`, `o`: f16 `[t, hq, d]`) over
/// the first `s ≥ t` tokens of the device cache, token i at position
/// `s − t + i`, in one launch (the cache stays on the device).
#[allow(clippy::too_many_arguments)]
pub fn prefill_into(
    dev: &ClDevice,
    pre: &ClPrefill,
    q: &[f16],
    cache: &ClKvCache,
    t: usize,
    s: usize,
    hq: usize,
    o: &mut [f16],
) -> Result<(), ClError> {
    let plan = &pre.plan;
    let (kvh, d) = (cache.kvh, cache.d);
    if plan.k != cache.k.format || plan.v != cache.v.format {
        return Err(input(format!(
            "the cache holds K {:?} / V {:?}, the kernel reads K {:?} / V {:?}",
            cache.k.format, cache.v.format, plan.k, plan.v
        )));
    }
    if d != plan.d as usize {
        return Err(input(format!(
            "a cache of head dim {d} for a prefill program of head dim {}",
            plan.d
        )));
    }
    if s > cache.capacity {
        return Err(input(format!(
            "a prefill over {s} tokens of a cache holding {}",
            cache.capacity
        )));
    }
    let elems = prefill_elems(t, s, hq, kvh, d)?;
    super::check_len("q", q.len(), elems)?;
    super::check_len("o", o.len(), elems)?;
    if elems == 0 {
        return Ok(());
    }
    let qb = dev.buffer(q)?;
    let ob = dev.alloc::<f16>(elems)?;
    launch_prefill(
        dev,
        pre,
        [
            qb.get(),
            cache.k.data.get(),
            cache.k.scales.get(),
            cache.k.offsets.get(),
            cache.v.data.get(),
            ob.get(),
        ],
        [t, s, hq, kvh],
    )?;
    dev.read_into(&ob, o)
}

/// The elements of q and o (`t·hq·d`) of a prefill of `t` tokens over `s`
/// with `hq` query heads over `kvh` KV heads, after checking the shape.
pub(super) fn prefill_elems(
    t: usize,
    s: usize,
    hq: usize,
    kvh: usize,
    d: usize,
) -> Result<usize, ClError> {
    if kvh == 0 || hq == 0 || !hq.is_multiple_of(kvh) {
        return Err(input(format!(
            "query heads {hq} are not a positive multiple of KV heads {kvh}"
        )));
    }
    if s < t {
        return Err(input(format!(
            "a prefill of {t} tokens over {s} cached ones"
        )));
    }
    t.checked_mul(hq)
        .and_then(|n| n.checked_mul(d))
        .ok_or_else(|| input("t·hq·d overflows"))
}

/// Bind a prefill's buffers (`q, k, k_scales, k_offsets, v, o`) and sizes
/// (`t, s, hq, kvh`, checked by [`prefill_elems`]), launch and wait.
pub(super) fn launch_prefill(
    dev: &ClDevice,
    pre: &ClPrefill,
    mems: [cl_mem; 6],
    [t, s, hq, kvh]: [usize; 4],
) -> Result<(), ClError> {
    let [q, k, k_scales, k_offsets, v, o] = mems;
    let bound = [
        ("q", Arg::Mem(q)),
        ("k", Arg::Mem(k)),
        ("k_scales", Arg::Mem(k_scales)),
        ("k_offsets", Arg::Mem(k_offsets)),
        ("v", Arg::Mem(v)),
        ("o", Arg::Mem(o)),
        ("t", Arg::Int(to_int(t, "t")?)),
        ("s", Arg::Int(to_int(s, "s")?)),
        ("hq", Arg::Int(to_int(hq, "hq")?)),
        ("kvh", Arg::Int(to_int(kvh, "kvh")?)),
    ];
    let rows = t * (hq / kvh);
    launch_kernel(
        dev,
        &lock(&pre.kernel),
        &pre.plan.args,
        &bound,
        &pre.plan.launch,
        |x| match x {
            LaunchExtent::PrefillRows => rows,
            LaunchExtent::KvHeads => kvh,
            _ => 1,
        },
    )
}
