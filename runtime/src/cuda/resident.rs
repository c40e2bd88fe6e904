//! Device-resident CUDA objects for the runtime's `Linear` and
//! `Attention` (the OpenCL device's contract): a PTX module loaded once
//! with its functions, weights packed into the GPU layout and uploaded
//! once, and a KV cache kept in device memory and appended in place (a
//! growth copies on the device).
//!
//! Every launch is enqueued on a stream the caller names; the `*_into`
//! entry points move activations in and outputs out once per call on the
//! device's own stream, while [`matmul_launch`] and [`attention_launch`]
//! work on device buffers only, so a caller can chain layers, run them on
//! streams of its own ([`CudaDevice::with_new_stream`]) and order or time
//! them with events.

use std::sync::Arc;

use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;
use half::f16;
use tessera_codegen::gpu::{
    ArgKind, AttentionPlan, KvFormat, LaunchExtent, MatmulPlan, PrefillPlan,
};
use tessera_codegen::ptx::{PtxAttentionProgram, PtxPrefillProgram, PtxProgram};
use tessera_dsl::interp::Value;

use super::{CudaDevice, CudaError, check_len, driver, input, launch_config, to_i32};
use crate::gpu_kv::{KvRows, elem_bytes};
use crate::gpu_weights::{self, GpuWeights};

/// An allocation of `len` elements (at least one, so every argument binds
/// a pointer), zeroed.
fn zeros<T>(stream: &Arc<CudaStream>, len: usize) -> Result<CudaSlice<T>, CudaError>
where
    T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits,
{
    stream.alloc_zeros::<T>(len.max(1)).map_err(driver("alloc"))
}

/// A copy of `v` on the device (one zero element for an empty `v`).
fn upload<T>(stream: &Arc<CudaStream>, v: &[T]) -> Result<CudaSlice<T>, CudaError>
where
    T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits + Clone + Default,
{
    if v.is_empty() {
        return zeros(stream, 1);
    }
    stream.clone_htod(v).map_err(driver("upload"))
}

/// A matmul program loaded once: its module's function, with the dynamic
/// shared memory opted in.
pub struct CudaMatmul {
    func: CudaFunction,
    plan: MatmulPlan,
    shared_bytes: u32,
    out_half: bool,
}

impl std::fmt::Debug for CudaMatmul {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaMatmul")
            .field("entry", &self.plan.entry)
            .field("shared_bytes", &self.shared_bytes)
            .finish()
    }
}

impl CudaMatmul {
    pub fn new(dev: &CudaDevice, program: &PtxProgram) -> Result<CudaMatmul, CudaError> {
        let func = load_entry(
            dev,
            &program.text,
            &program.plan.entry,
            program.dynamic_shared_bytes,
        )?;
        Ok(CudaMatmul {
            func,
            out_half: program.plan.args.iter().any(|a| a.kind == ArgKind::HalfOut),
            plan: program.plan.clone(),
            shared_bytes: program.dynamic_shared_bytes,
        })
    }

    pub fn plan(&self) -> &MatmulPlan {
        &self.plan
    }

    /// Whether the kernel writes `y` as f16 (else f32).
    pub fn writes_half(&self) -> bool {
        self.out_half
    }
}

/// Packed weights and bias of one `[h, l]` layer on the device.
pub struct CudaWeights {
    format: tessera_dsl::Format,
    h: usize,
    l: usize,
    codes: CudaSlice<u8>,
    /// Group parameters as the format stores them (f32 or f16 bytes).
    scales: CudaSlice<u8>,
    offsets: CudaSlice<u8>,
    bias: CudaSlice<f32>,
    bytes: usize,
}

impl std::fmt::Debug for CudaWeights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaWeights")
            .field("format", &self.format)
            .field("h", &self.h)
            .field("l", &self.l)
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl CudaWeights {
    /// Check `w` (`[h, l]`, f16 or quantized) against the format `plan`
    /// reads, pack it into the GPU layout and upload it with `bias` (zeros
    /// when none is given) once.
    pub fn upload(
        dev: &CudaDevice,
        plan: &MatmulPlan,
        w: &Value,
        bias: Option<&[f32]>,
        h: usize,
        l: usize,
    ) -> Result<CudaWeights, CudaError> {
        if let Some(b) = bias {
            check_len("bias", b.len(), h)?;
        }
        to_i32(h, "h")?;
        to_i32(l, "l")?;
        let (codes, scales, offsets) =
            match gpu_weights::prepare(plan.weights.format, w, h, l).map_err(input)? {
                GpuWeights::Halves(halves) => (
                    halves.iter().flat_map(|v| v.to_le_bytes()).collect(),
                    vec![],
                    vec![],
                ),
                GpuWeights::Quant(packed) => (packed.codes, packed.scales, packed.offsets),
            };
        let bytes = codes.len() + scales.len() + offsets.len();
        let s = &dev.stream;
        let zero_bias;
        let bias = match bias {
            Some(b) => b,
            None => {
                zero_bias = vec![0.0f32; h];
                &zero_bias
            }
        };
        Ok(CudaWeights {
            format: plan.weights.format,
            h,
            l,
            codes: upload(s, &codes)?,
            scales: upload(s, &scales)?,
            offsets: upload(s, &offsets)?,
            bias: upload(s, bias)?,
            bytes,
        })
    }

    /// A second device copy (device-to-device, on `dev`'s stream).
    pub fn try_clone(&self, dev: &CudaDevice) -> Result<CudaWeights, CudaError> {
        let copy = |what: &'static str| driver(what);
        Ok(CudaWeights {
            format: self.format,
            h: self.h,
            l: self.l,
            codes: dev
                .stream
                .clone_dtod(&self.codes)
                .map_err(copy("device copy"))?,
            scales: dev
                .stream
                .clone_dtod(&self.scales)
                .map_err(copy("device copy"))?,
            offsets: dev
                .stream
                .clone_dtod(&self.offsets)
                .map_err(copy("device copy"))?,
            bias: dev
                .stream
                .clone_dtod(&self.bias)
                .map_err(copy("device copy"))?,
            bytes: self.bytes,
        })
    }

    /// Bytes of packed weights and group parameters on the device.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// `[h, l]`.
    pub fn shape(&self) -> (usize, usize) {
        (self.h, self.l)
    }
}

/// The output of a matmul launch in device memory, in the kernel's type.
pub enum CudaOut<'a> {
    F32(&'a mut CudaSlice<f32>),
    F16(&'a mut CudaSlice<u16>),
}

/// Enqueue `y[e, h] = x[e, l] · wᵀ + bias` on `stream`: `x` holds f16
/// bits, `y` the kernel's output type. Nothing is synchronised.
pub fn matmul_launch(
    stream: &Arc<CudaStream>,
    mm: &CudaMatmul,
    w: &CudaWeights,
    x: &CudaSlice<u16>,
    e: usize,
    y: CudaOut<'_>,
) -> Result<(), CudaError> {
    let (h, l) = (w.h, w.l);
    if w.format != mm.plan.weights.format {
        return Err(input(format!(
            "weights are {}, the kernel reads {}",
            w.format, mm.plan.weights.format
        )));
    }
    if e == 0 || h == 0 {
        return Ok(());
    }
    let (ei, hi, li) = (to_i32(e, "e")?, to_i32(h, "h")?, to_i32(l, "l")?);
    let xe = e.checked_mul(l).ok_or_else(|| input("e * l overflows"))?;
    let ye = e.checked_mul(h).ok_or_else(|| input("e * h overflows"))?;
    if x.len() < xe {
        return Err(input(format!("x holds {} halves, e·l = {xe}", x.len())));
    }
    let y_len = match &y {
        CudaOut::F32(v) => v.len(),
        CudaOut::F16(v) => v.len(),
    };
    if y_len < ye {
        return Err(input(format!("y holds {y_len} elements, e·h = {ye}")));
    }
    if matches!(y, CudaOut::F16(_)) != mm.out_half {
        return Err(input(format!(
            "y is {}, the kernel writes {}",
            if mm.out_half { "f32" } else { "f16" },
            if mm.out_half { "f16" } else { "f32" }
        )));
    }
    let dims = mm.plan.launch.map(|d| {
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
        shared_mem_bytes: mm.shared_bytes,
    };
    // The output's address with a guard that records the kernel's write
    // on `stream` when dropped (after the launch), so cudarc orders later
    // uses of y, on any stream, after it.
    let (y_ptr, _y_written) = match y {
        CudaOut::F32(v) => v.device_ptr_mut(stream),
        CudaOut::F16(v) => v.device_ptr_mut(stream),
    };
    let mut launch = stream.launch_builder(&mm.func);
    for a in &mm.plan.args {
        match a.name {
            "x" => launch.arg(x),
            "w" => launch.arg(&w.codes),
            "scales" => launch.arg(&w.scales),
            "offsets" => launch.arg(&w.offsets),
            "bias" => launch.arg(&w.bias),
            "y" => launch.arg(&y_ptr),
            "e" => launch.arg(&ei),
            "h" => launch.arg(&hi),
            "l" => launch.arg(&li),
            other => return Err(input(format!("argument `{other}` is not bound"))),
        };
    }
    // SAFETY: the arguments follow the emitted signature (device pointers
    // for `.u64`, i32 for `.u32`, in the plan's order); x holds at least
    // e·l halves and y at least e·h outputs of the kernel's type (checked
    // above), the weights were packed for this format and [h, l] (padded
    // to lp by the packer) and the bias holds h values (CudaWeights::
    // upload); cudarc orders later uses of these buffers after the launch.
    unsafe { launch.launch(cfg) }.map_err(driver("kernel launch"))?;
    Ok(())
}

/// Host output of [`matmul_into`].
pub enum HostOut<'a> {
    F32(&'a mut [f32]),
    F16(&'a mut [f16]),
}

/// One call: upload `x` (`[e, l]` f16), launch, read `y` (`[e, h]`) back,
/// converting if the kernel's output type differs from the caller's.
pub fn matmul_into(
    dev: &CudaDevice,
    mm: &CudaMatmul,
    w: &CudaWeights,
    x: &[f16],
    e: usize,
    out: HostOut<'_>,
) -> Result<(), CudaError> {
    let (h, l) = (w.h, w.l);
    check_len("x", x.len(), e * l)?;
    match &out {
        HostOut::F32(v) => check_len("y", v.len(), e * h)?,
        HostOut::F16(v) => check_len("y", v.len(), e * h)?,
    }
    if e == 0 || h == 0 {
        return Ok(());
    }
    let s = &dev.stream;
    let xbits: Vec<u16> = x.iter().map(|v| v.to_bits()).collect();
    let xb = upload(s, &xbits)?;
    if mm.out_half {
        let mut yb = zeros::<u16>(s, e * h)?;
        matmul_launch(s, mm, w, &xb, e, CudaOut::F16(&mut yb))?;
        let bits = s.clone_dtoh(&yb).map_err(driver("read back"))?;
        match out {
            HostOut::F16(v) => {
                for (d, b) in v.iter_mut().zip(bits) {
                    *d = f16::from_bits(b);
                }
            }
            HostOut::F32(v) => {
                for (d, b) in v.iter_mut().zip(bits) {
                    *d = f16::from_bits(b).to_f32();
                }
            }
        }
    } else {
        let mut yb = zeros::<f32>(s, e * h)?;
        matmul_launch(s, mm, w, &xb, e, CudaOut::F32(&mut yb))?;
        match out {
            HostOut::F32(v) => s.memcpy_dtoh(&yb, v).map_err(driver("read back"))?,
            HostOut::F16(v) => {
                let vals = s.clone_dtoh(&yb).map_err(driver("read back"))?;
                for (d, f) in v.iter_mut().zip(vals) {
                    *d = f16::from_f32(f);
                }
            }
        }
    }
    Ok(())
}

/// A decode attention program loaded once: the partial and combine
/// functions of one module.
pub struct CudaAttention {
    partial: CudaFunction,
    combine: CudaFunction,
    plan: AttentionPlan,
}

impl std::fmt::Debug for CudaAttention {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaAttention")
            .field("entry", &self.plan.partial_entry)
            .finish()
    }
}

impl CudaAttention {
    pub fn new(
        dev: &CudaDevice,
        program: &PtxAttentionProgram,
    ) -> Result<CudaAttention, CudaError> {
        let module = dev
            .ctx
            .load_module(Ptx::from_src(program.text.clone()))
            .map_err(driver("PTX module load"))?;
        let load = |name: &str| {
            module
                .load_function(name)
                .map_err(driver("function lookup"))
        };
        Ok(CudaAttention {
            partial: load(&program.plan.partial_entry)?,
            combine: load(&program.plan.combine_entry)?,
            plan: program.plan.clone(),
        })
    }

    pub fn plan(&self) -> &AttentionPlan {
        &self.plan
    }
}

/// The function `entry` of the PTX module `text`, loaded, with its
/// dynamic shared memory opted in.
fn load_entry(
    dev: &CudaDevice,
    text: &str,
    entry: &str,
    dynamic_shared_bytes: u32,
) -> Result<CudaFunction, CudaError> {
    let module = dev
        .ctx
        .load_module(Ptx::from_src(text.to_string()))
        .map_err(driver("PTX module load"))?;
    let func = module
        .load_function(entry)
        .map_err(driver("function lookup"))?;
    opt_in_shared(&func, dynamic_shared_bytes)?;
    Ok(func)
}

/// Above the default 48 KiB, dynamic shared memory needs the function's
/// opt-in.
fn opt_in_shared(func: &CudaFunction, bytes: u32) -> Result<(), CudaError> {
    if bytes > 48 * 1024 {
        let bytes = i32::try_from(bytes).map_err(|_| input("shared memory size overflows"))?;
        func.set_attribute(
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            bytes,
        )
        .map_err(driver("shared memory opt-in"))?;
    }
    Ok(())
}

/// The cache holds the formats the kernel reads, and the query heads are a
/// positive multiple of its KV heads.
fn check_cache_and_heads(
    cache: &CudaKvCache,
    (k, v): (KvFormat, KvFormat),
    hq: usize,
) -> Result<(), CudaError> {
    if k != cache.k.format || v != cache.v.format {
        return Err(input(format!(
            "the cache holds K {:?} / V {:?}, the kernel reads K {k:?} / V {v:?}",
            cache.k.format, cache.v.format
        )));
    }
    if hq == 0 || !hq.is_multiple_of(cache.kvh) {
        return Err(input(format!(
            "query heads {hq} are not a positive multiple of KV heads {}",
            cache.kvh
        )));
    }
    Ok(())
}

/// A causal prefill program (one head dim) loaded once.
pub struct CudaPrefill {
    func: CudaFunction,
    plan: PrefillPlan,
    shared_bytes: u32,
}

impl std::fmt::Debug for CudaPrefill {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaPrefill")
            .field("entry", &self.plan.entry)
            .field("d", &self.plan.d)
            .finish()
    }
}

impl CudaPrefill {
    pub fn new(dev: &CudaDevice, program: &PtxPrefillProgram) -> Result<CudaPrefill, CudaError> {
        let func = load_entry(
            dev,
            &program.text,
            &program.plan.entry,
            program.dynamic_shared_bytes,
        )?;
        Ok(CudaPrefill {
            func,
            plan: program.plan.clone(),
            shared_bytes: program.dynamic_shared_bytes,
        })
    }

    pub fn plan(&self) -> &PrefillPlan {
        &self.plan
    }
}

/// Enqueue the causal prefill of `t` query tokens (`q`: `[t, hq, d]` f16
/// bits on the device), the last `t` of the first `s` cached tokens, on
/// `stream`, writing `o` (`[t, hq, d]` f16 bits). Nothing is synchronised.
#[allow(clippy::too_many_arguments)]
pub fn prefill_launch(
    stream: &Arc<CudaStream>,
    pre: &CudaPrefill,
    q: &CudaSlice<u16>,
    cache: &CudaKvCache,
    t: usize,
    s: usize,
    hq: usize,
    o: &mut CudaSlice<u16>,
) -> Result<(), CudaError> {
    let plan = &pre.plan;
    let (kvh, d) = (cache.kvh, cache.d);
    check_cache_and_heads(cache, (plan.k, plan.v), hq)?;
    if d != plan.d as usize {
        return Err(input(format!(
            "head dim {d}, the prefill program is built for {}",
            plan.d
        )));
    }
    if t == 0 || t > s || s > cache.capacity {
        return Err(input(format!(
            "prefill of {t} tokens over {s} of a cache holding {}",
            cache.capacity
        )));
    }
    let elems = t
        .checked_mul(hq)
        .and_then(|r| r.checked_mul(d))
        .ok_or_else(|| input("t * hq * d overflows"))?;
    to_i32(elems, "t * hq * d")?;
    let rows = s
        .checked_mul(kvh)
        .and_then(|r| r.checked_mul(d))
        .ok_or_else(|| input("s * kvh * d overflows"))?;
    to_i32(rows, "s * kvh * d")?;
    if q.len() < elems || o.len() < elems {
        return Err(input(format!(
            "q holds {}, o {} halves; t·hq·d = {elems}",
            q.len(),
            o.len()
        )));
    }
    let ints = [
        ("t", to_i32(t, "t")?),
        ("s", to_i32(s, "s")?),
        ("hq", to_i32(hq, "hq")?),
        ("kvh", to_i32(kvh, "kvh")?),
    ];
    let group = hq / kvh;
    let mut cfg = launch_config(&plan.launch, |x| match x {
        LaunchExtent::PrefillRows => t * group,
        LaunchExtent::KvHeads => kvh,
        _ => 1,
    })?;
    cfg.shared_mem_bytes = pre.shared_bytes;
    let (op, _op) = o.device_ptr_mut(stream);
    let mut launch = stream.launch_builder(&pre.func);
    for a in &plan.args {
        match a.name {
            "q" => launch.arg(q),
            "k" => launch.arg(&cache.k.data),
            "k_scales" => launch.arg(&cache.k.scales),
            "k_offsets" => launch.arg(&cache.k.offsets),
            "v" => launch.arg(&cache.v.data),
            "o" => launch.arg(&op),
            other => match ints.iter().find(|(n, _)| *n == other) {
                Some((_, v)) => launch.arg(v),
                None => return Err(input(format!("argument `{other}` is not bound"))),
            },
        };
    }
    // SAFETY: the arguments follow the emitted signature (device pointers
    // for `.u64`, i32 for `.u32`, in the plan's order); the cache holds
    // `capacity ≥ s` tokens of [kvh, d] in the formats the kernel reads
    // (checked above, with per-row parameters for int8 keys), d is the
    // program's head dim, q and o hold t·hq·d halves, and every index the
    // kernel forms fits its 32-bit arithmetic (checked above).
    unsafe { launch.launch(cfg) }.map_err(driver("kernel launch"))?;
    Ok(())
}

/// The causal prefill of `t` tokens (`q`, `o`: `[t, hq, d]` f16 on the
/// host), the last `t` of the first `s` cached tokens.
#[allow(clippy::too_many_arguments)]
pub fn prefill_into(
    dev: &CudaDevice,
    pre: &CudaPrefill,
    q: &[f16],
    cache: &CudaKvCache,
    t: usize,
    s: usize,
    hq: usize,
    o: &mut [f16],
) -> Result<(), CudaError> {
    let elems = t
        .checked_mul(hq)
        .and_then(|r| r.checked_mul(cache.d))
        .ok_or_else(|| input("t * hq * d overflows"))?;
    check_len("q", q.len(), elems)?;
    check_len("o", o.len(), elems)?;
    let stream = &dev.stream;
    let qbits: Vec<u16> = q.iter().map(|h| h.to_bits()).collect();
    let qb = upload(stream, &qbits)?;
    let mut ob = zeros::<u16>(stream, elems)?;
    prefill_launch(stream, pre, &qb, cache, t, s, hq, &mut ob)?;
    let bits = stream.clone_dtoh(&ob).map_err(driver("read back"))?;
    for (dst, b) in o.iter_mut().zip(bits) {
        *dst = f16::from_bits(b);
    }
    Ok(())
}

/// One of K or V on the device.
struct KvSide {
    format: KvFormat,
    data: CudaSlice<u8>,
    scales: CudaSlice<f32>,
    offsets: CudaSlice<f32>,
}

impl KvSide {
    fn new(dev: &CudaDevice, format: KvFormat, rows: usize, d: usize) -> Result<KvSide, CudaError> {
        let params = if format == KvFormat::I8AsymRow {
            rows
        } else {
            0
        };
        let bytes = rows
            .checked_mul(d)
            .and_then(|n| n.checked_mul(elem_bytes(format)))
            .ok_or_else(|| input("KV cache size overflows"))?;
        Ok(KvSide {
            format,
            data: zeros(&dev.stream, bytes)?,
            scales: zeros(&dev.stream, params)?,
            offsets: zeros(&dev.stream, params)?,
        })
    }

    /// Copy the first `rows` rows of `self` into `into` (on the device).
    fn copy_into(
        &self,
        dev: &CudaDevice,
        into: &mut KvSide,
        rows: usize,
        d: usize,
    ) -> Result<(), CudaError> {
        let bytes = rows * d * elem_bytes(self.format);
        copy_prefix(dev, &self.data, &mut into.data, bytes)?;
        if self.format == KvFormat::I8AsymRow {
            copy_prefix(dev, &self.scales, &mut into.scales, rows)?;
            copy_prefix(dev, &self.offsets, &mut into.offsets, rows)?;
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn write(
        &mut self,
        dev: &CudaDevice,
        at_row: usize,
        rows: usize,
        d: usize,
        what: &str,
        data: KvRows<'_>,
    ) -> Result<(), CudaError> {
        let eb = elem_bytes(self.format);
        match (self.format, data) {
            (KvFormat::F16, KvRows::F16(v)) => {
                check_len(what, v.len(), rows * d)?;
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect();
                write_at(dev, &mut self.data, at_row * d * eb, &bytes)
            }
            (
                f @ (KvFormat::I8AsymRow | KvFormat::Fp8E4M3 | KvFormat::Fp8E5M2),
                KvRows::Bytes {
                    codes,
                    scales,
                    offsets,
                },
            ) => {
                check_len(what, codes.len(), rows * d)?;
                let params = if f == KvFormat::I8AsymRow { rows } else { 0 };
                check_len("scales", scales.len(), params)?;
                check_len("offsets", offsets.len(), params)?;
                write_at(dev, &mut self.data, at_row * d, codes)?;
                if params > 0 {
                    write_at(dev, &mut self.scales, at_row, scales)?;
                    write_at(dev, &mut self.offsets, at_row, offsets)?;
                }
                Ok(())
            }
            (f, _) => Err(input(format!("{what}: rows not encoded as {f:?}"))),
        }
    }
}

/// Copy the first `n` elements of `src` into `dst` on the device.
fn copy_prefix<T: cudarc::driver::DeviceRepr>(
    dev: &CudaDevice,
    src: &CudaSlice<T>,
    dst: &mut CudaSlice<T>,
    n: usize,
) -> Result<(), CudaError> {
    if n == 0 {
        return Ok(());
    }
    let (Some(from), Some(mut to)) = (src.try_slice(..n), dst.try_slice_mut(..n)) else {
        return Err(input(format!(
            "device copy of {n} elements between buffers of {} and {}",
            src.len(),
            dst.len()
        )));
    };
    dev.stream
        .memcpy_dtod(&from, &mut to)
        .map_err(driver("device copy"))
}

/// Write `data` at element `at` of `buf`, within its length.
fn write_at<T: cudarc::driver::DeviceRepr>(
    dev: &CudaDevice,
    buf: &mut CudaSlice<T>,
    at: usize,
    data: &[T],
) -> Result<(), CudaError> {
    if data.is_empty() {
        return Ok(());
    }
    let len = buf.len();
    let Some(mut to) = buf.try_slice_mut(at..at + data.len()) else {
        return Err(input(format!(
            "write of {} elements at {at} exceeds a buffer of {len}",
            data.len()
        )));
    };
    dev.stream
        .memcpy_htod(data, &mut to)
        .map_err(driver("upload"))
}

/// A KV cache `[tokens, kvh, d]` in device memory. Tokens are written
/// after the last ones (in place); the kernels read the first `s` tokens
/// as a prefix. [`CudaKvCache::grow`] moves to larger buffers with one
/// device-side copy.
pub struct CudaKvCache {
    kvh: usize,
    d: usize,
    capacity: usize,
    k: KvSide,
    v: KvSide,
}

impl std::fmt::Debug for CudaKvCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaKvCache")
            .field("k", &self.k.format)
            .field("v", &self.v.format)
            .field("kvh", &self.kvh)
            .field("d", &self.d)
            .field("capacity", &self.capacity)
            .finish()
    }
}

impl CudaKvCache {
    /// Room for `tokens` tokens of `kvh` heads of dimension `d`.
    pub fn new(
        dev: &CudaDevice,
        k: KvFormat,
        v: KvFormat,
        kvh: usize,
        d: usize,
        tokens: usize,
    ) -> Result<CudaKvCache, CudaError> {
        if kvh == 0 || d == 0 || tokens == 0 {
            return Err(input(format!(
                "KV cache kvh={kvh}, d={d}, tokens={tokens}: all must be ≥ 1"
            )));
        }
        let rows = tokens
            .checked_mul(kvh)
            .ok_or_else(|| input("KV cache size overflows"))?;
        Ok(CudaKvCache {
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

    /// Device addresses of the K and V data (change only on growth).
    pub fn addresses(&self, dev: &CudaDevice) -> (usize, usize) {
        let (k, _k) = self.k.data.device_ptr(&dev.stream);
        let (v, _v) = self.v.data.device_ptr(&dev.stream);
        (k as usize, v as usize)
    }

    /// Move to buffers for `tokens` tokens, keeping the first `used`.
    pub fn grow(&mut self, dev: &CudaDevice, tokens: usize, used: usize) -> Result<(), CudaError> {
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
            CudaKvCache::new(dev, self.k.format, self.v.format, self.kvh, self.d, tokens)?;
        let rows = used * self.kvh;
        self.k.copy_into(dev, &mut bigger.k, rows, self.d)?;
        self.v.copy_into(dev, &mut bigger.v, rows, self.d)?;
        *self = bigger;
        Ok(())
    }

    /// Write `tokens` tokens at token position `at` (within the capacity).
    pub fn write(
        &mut self,
        dev: &CudaDevice,
        at: usize,
        tokens: usize,
        k: KvRows<'_>,
        v: KvRows<'_>,
    ) -> Result<(), CudaError> {
        if at + tokens > self.capacity {
            return Err(input(format!(
                "tokens {at}..{} exceed the capacity {}",
                at + tokens,
                self.capacity
            )));
        }
        let (at_row, rows) = (at * self.kvh, tokens * self.kvh);
        self.k.write(dev, at_row, rows, self.d, "keys", k)?;
        self.v.write(dev, at_row, rows, self.d, "values", v)
    }
}

/// The per-call buffers of a decode attention launch: the splits' partial
/// outputs, maxima and sums, and the recompute flags.
pub struct AttentionScratch {
    part_o: CudaSlice<f32>,
    part_m: CudaSlice<f32>,
    part_l: CudaSlice<f32>,
    recomputed: CudaSlice<i32>,
    splits: usize,
    hq: usize,
    d: usize,
}

impl AttentionScratch {
    /// Room for `s` tokens of `hq` heads of `d` under `att`'s split.
    pub fn new(
        dev: &CudaDevice,
        att: &CudaAttention,
        s: usize,
        hq: usize,
        d: usize,
    ) -> Result<AttentionScratch, CudaError> {
        let splits = s.div_ceil(att.plan.keys_per_split.max(1) as usize);
        let heads = splits
            .checked_mul(hq)
            .ok_or_else(|| input("splits * hq overflows"))?;
        let elems = heads
            .checked_mul(d)
            .ok_or_else(|| input("splits * hq * d overflows"))?;
        Ok(AttentionScratch {
            part_o: zeros(&dev.stream, elems)?,
            part_m: zeros(&dev.stream, heads)?,
            part_l: zeros(&dev.stream, heads)?,
            recomputed: zeros(&dev.stream, heads)?,
            splits,
            hq,
            d,
        })
    }

    /// How many (split, head) pairs recomputed in the last launch (reads
    /// the flags back, synchronising the stream).
    pub fn recomputed(&self, stream: &Arc<CudaStream>) -> Result<usize, CudaError> {
        let flags = stream
            .clone_dtoh(&self.recomputed)
            .map_err(driver("read back"))?;
        Ok(flags
            .iter()
            .take(self.splits * self.hq)
            .filter(|&&r| r != 0)
            .count())
    }
}

/// Enqueue one query token (`q`: `[hq, d]` f16 bits on the device) over
/// the first `s` cached tokens on `stream`, writing `o` (`[hq, d]` f16
/// bits). Nothing is synchronised.
#[allow(clippy::too_many_arguments)]
pub fn attention_launch(
    stream: &Arc<CudaStream>,
    att: &CudaAttention,
    q: &CudaSlice<u16>,
    cache: &CudaKvCache,
    s: usize,
    hq: usize,
    scratch: &mut AttentionScratch,
    o: &mut CudaSlice<u16>,
) -> Result<(), CudaError> {
    let plan = &att.plan;
    let (kvh, d) = (cache.kvh, cache.d);
    check_cache_and_heads(cache, (plan.k, plan.v), hq)?;
    if s == 0 || s > cache.capacity {
        return Err(input(format!(
            "attention over {s} tokens of a cache holding {}",
            cache.capacity
        )));
    }
    let splits = s.div_ceil(plan.keys_per_split.max(1) as usize);
    if scratch.hq != hq || scratch.d != d || scratch.splits < splits {
        return Err(input(format!(
            "scratch for {} splits of {}×{}, the call needs {splits} of {hq}×{d}",
            scratch.splits, scratch.hq, scratch.d
        )));
    }
    if q.len() < hq * d || o.len() < hq * d {
        return Err(input(format!(
            "q holds {}, o {} halves; hq·d = {}",
            q.len(),
            o.len(),
            hq * d
        )));
    }
    let ints = super::attention_ints([hq, kvh, d, s, splits], cache.capacity)?;
    stream
        .memset_zeros(&mut scratch.recomputed)
        .map_err(driver("memset"))?;
    let extent = |x: LaunchExtent| match x {
        LaunchExtent::Splits => splits,
        LaunchExtent::KvHeads => kvh,
        LaunchExtent::Heads => hq,
        LaunchExtent::HeadDim => d,
        _ => 1,
    };
    let launches = [
        (&att.partial, &plan.partial_args, &plan.partial_launch),
        (&att.combine, &plan.combine_args, &plan.combine_launch),
    ];
    for (func, args, dims) in launches {
        let cfg = launch_config(dims, extent)?;
        // Written buffers by address, each with a guard that records the
        // launch's write on `stream` when dropped after it.
        let (po, _po) = scratch.part_o.device_ptr_mut(stream);
        let (pm, _pm) = scratch.part_m.device_ptr_mut(stream);
        let (pl, _pl) = scratch.part_l.device_ptr_mut(stream);
        let (rc, _rc) = scratch.recomputed.device_ptr_mut(stream);
        let (op, _op) = o.device_ptr_mut(stream);
        let mut launch = stream.launch_builder(func);
        for a in args.iter() {
            match a.name {
                "q" => launch.arg(q),
                "k" => launch.arg(&cache.k.data),
                "k_scales" => launch.arg(&cache.k.scales),
                "k_offsets" => launch.arg(&cache.k.offsets),
                "v" => launch.arg(&cache.v.data),
                "part_o" => launch.arg(&po),
                "part_m" => launch.arg(&pm),
                "part_l" => launch.arg(&pl),
                "recomputed" => launch.arg(&rc),
                "o" => launch.arg(&op),
                other => match ints.iter().find(|(n, _)| *n == other) {
                    Some((_, v)) => launch.arg(v),
                    None => return Err(input(format!("argument `{other}` is not bound"))),
                },
            };
        }
        // SAFETY: the arguments follow the emitted signatures (device
        // pointers for `.u64`, i32 for `.u32`, in the plan's order); the
        // cache holds `capacity ≥ s` tokens of [kvh, d] in the formats the
        // kernels read (checked above, with per-row parameters for int8
        // keys), q and o hold hq·d halves, the scratch holds at least
        // `splits` partials of [hq, d]; the combine reads what the partial
        // launch before it on the same stream wrote.
        unsafe { launch.launch(cfg) }.map_err(driver("kernel launch"))?;
    }
    Ok(())
}

/// One query token (`q`, `o`: `[hq, d]` f16 on the host) over the first
/// `s` cached tokens. Returns how many (split, head) pairs recomputed.
pub fn attention_into(
    dev: &CudaDevice,
    att: &CudaAttention,
    q: &[f16],
    cache: &CudaKvCache,
    s: usize,
    hq: usize,
    o: &mut [f16],
) -> Result<usize, CudaError> {
    let d = cache.d;
    check_len("q", q.len(), hq * d)?;
    check_len("o", o.len(), hq * d)?;
    let stream = &dev.stream;
    let qbits: Vec<u16> = q.iter().map(|h| h.to_bits()).collect();
    let qb = upload(stream, &qbits)?;
    let mut ob = zeros::<u16>(stream, hq * d)?;
    let mut scratch = AttentionScratch::new(dev, att, s, hq, d)?;
    attention_launch(stream, att, &qb, cache, s, hq, &mut scratch, &mut ob)?;
    let bits = stream.clone_dtoh(&ob).map_err(driver("read back"))?;
    for (dst, b) in o.iter_mut().zip(bits) {
        *dst = f16::from_bits(b);
    }
    scratch.recomputed(stream)
}
