//! Times Tessera's PTX kernels on an NVIDIA GPU as the runtime runs them
//! (feature `cuda`): `Linear` on the Llama2-7B shapes for W4A16, W8A16 and
//! f16 weights at M from 1 to 2048 (the variant the runtime's plan picks
//! for each M), and decode attention (32 query heads over 32 KV heads of
//! 128, f16 and kv8 caches) at contexts 4096 to 32768. One JSON line per
//! measurement on stdout, read by `scripts/gpu/vendor_bench.py report`
//! beside the vendor's (cuBLAS, PyTorch SDPA) timings of the same shapes.
//!
//! Method: every call reads its operands from DRAM, not the L2 cache — the
//! weights (or the KV cache) are copied on the device until the copies
//! exceed 4× the L2 size, and calls rotate through them. A batch of calls
//! sized to about 4 ms is timed with CUDA events on the launch stream;
//! the median over 7 batches, per call, is reported. Launches only: the
//! activations, outputs and scratch live on the device throughout.
//!
//! ```text
//! cargo run --release -p tessera-runtime --features cuda --example cuda_bench > ours.jsonl
//! ```

use std::sync::Arc;

use cudarc::driver::sys::{CUdevice_attribute, CUevent_flags};
use cudarc::driver::{CudaSlice, CudaStream};
use half::f16;
use tessera_codegen::gpu::KvFormat as GpuKv;
use tessera_dsl::ir::Variant;
use tessera_dsl::library;
use tessera_dsl::quant::quantize;
use tessera_runtime::cuda::{
    AttentionScratch, CudaAttention, CudaDevice, CudaKvCache, CudaOut, attention_launch,
};
use tessera_runtime::gpu_kv::{elem_bytes, encode, gpu_formats};
use tessera_runtime::{Backend, Device, DeviceOptions, KvFormat, Linear, WeightFormat, Weights};

type Failure = Box<dyn std::error::Error>;

const SHAPES: [(usize, usize); 4] = [(4096, 4096), (11008, 4096), (4096, 11008), (12288, 4096)];
const MS: [usize; 12] = [1, 2, 3, 4, 8, 16, 32, 64, 128, 256, 512, 2048];
const CONTEXTS: [usize; 4] = [4096, 8192, 16384, 32768];

/// A cheap deterministic generator (no dependency for random fill).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

/// Median per-call microseconds of `call(i)` (i rotates the operands).
fn time_calls(
    stream: &Arc<CudaStream>,
    mut call: impl FnMut(usize) -> Result<(), Failure>,
) -> Result<f64, Failure> {
    let ctx = stream.context();
    // Events that record time (cudarc's default disables timing).
    let timed = || ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT));
    let (start, end) = (timed()?, timed()?);
    let mut batch = |calls: usize, from: usize| -> Result<f64, Failure> {
        start.record(stream)?;
        for i in 0..calls {
            call(from + i)?;
        }
        end.record(stream)?;
        end.synchronize()?;
        Ok(f64::from(start.elapsed_ms(&end)?) * 1e3 / calls as f64)
    };
    // Warm up (module JIT, clocks), then size batches to about 4 ms.
    batch(3, 0)?;
    let one = batch(3, 3)?;
    let calls = ((4000.0 / one.max(0.5)) as usize).clamp(3, 200);
    let mut times: Vec<f64> = Vec::with_capacity(7);
    for b in 0..7 {
        times.push(batch(calls, b * calls)?);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[3])
}

/// How many copies of `bytes` exceed 4× the L2 (at least 2, at most
/// 8 GiB in all).
fn copies_for(bytes: usize, l2: usize) -> usize {
    (4 * l2)
        .div_ceil(bytes.max(1))
        .clamp(2, (8usize << 30).div_ceil(bytes.max(1)).max(2))
}

/// A CUDA layer of `raw` ([n, k]) in `format`, quantized here once (the
/// runtime would quantize f32 weights itself; passing codes keeps the
/// setup time of the large shapes down).
fn layer(
    device: &Arc<Device>,
    format: WeightFormat,
    raw: &[f32],
    n: usize,
    k: usize,
) -> Result<Linear, Failure> {
    let kernel = library::get(format.library_kernel())?;
    let wf = kernel.tensor("w").map(|t| t.format).ok_or("no weights")?;
    let quantized;
    let weights = if wf.is_quantized() {
        quantized = quantize(wf, n, k, raw)?;
        Weights::Quant(&quantized)
    } else {
        Weights::F32(raw)
    };
    Ok(Linear::new(device, format, weights, n, k, None)?)
}

fn bench_linear(device: &Arc<Device>, cuda: &CudaDevice, l2: usize) -> Result<(), Failure> {
    let stream = cuda.stream();
    let mut rng = Lcg(7);
    for (n, k) in SHAPES {
        let raw: Vec<f32> = (0..n * k).map(|_| rng.next() * 0.6).collect();
        for format in [WeightFormat::W4A16, WeightFormat::W8A16, WeightFormat::F16] {
            let first = layer(device, format, &raw, n, k)?;
            let bytes = first.cuda_weight_bytes().ok_or("not a CUDA layer")?;
            let copies = copies_for(bytes, l2);
            let mut layers = vec![first];
            for _ in 1..copies {
                layers.push(layers[0].duplicate_cuda()?);
            }
            eprintln!(
                "linear {format} [{n}, {k}]: {copies} copies of {bytes} bytes, m1={} m2={}",
                layers[0].plan().m1,
                layers[0].plan().m2
            );
            eprintln!("{}", layers[0].plan());
            for m in MS {
                let bits: Vec<u16> = (0..m * k)
                    .map(|_| f16::from_f32(rng.next()).to_bits())
                    .collect();
                let x: CudaSlice<u16> = stream.clone_htod(&bits)?;
                let chosen = layers[0].variant_for(m);
                // The plan's pick, and each variant where it could serve.
                for (variant, name, serves) in [
                    (Variant::Gemv, "gemv", m <= 16),
                    (Variant::FlatGemm, "flat", m <= 64),
                    (Variant::Gemm, "gemm", m >= 8),
                ] {
                    if !serves && variant != chosen {
                        continue;
                    }
                    let half = layers[0]
                        .cuda_writes_half(variant)
                        .ok_or("not a CUDA layer")?;
                    let mut yh = stream.alloc_zeros::<u16>(if half { m * n } else { 1 })?;
                    let mut yf = stream.alloc_zeros::<f32>(if half { 1 } else { m * n })?;
                    let us = time_calls(stream, |i| {
                        let y = if half {
                            CudaOut::F16(&mut yh)
                        } else {
                            CudaOut::F32(&mut yf)
                        };
                        Ok(layers[i % copies].forward_cuda_as(variant, stream, &x, m, y)?)
                    })?;
                    println!(
                        "{{\"kind\":\"linear\",\"impl\":\"tessera-ptx\",\"variant\":\"{name}\",\"chosen\":{},\"format\":\"{format}\",\"m\":{m},\"n\":{n},\"k\":{k},\"us\":{us:.3},\"weight_bytes\":{bytes},\"copies\":{copies}}}",
                        variant == chosen
                    );
                }
            }
        }
    }
    Ok(())
}

/// One launch of each variant on [4096, 4096] at M = 8, W4A16 and f16, for
/// a profiler (`ncu ... cuda_bench profile`).
fn profile_once(device: &Arc<Device>, cuda: &CudaDevice) -> Result<(), Failure> {
    let stream = cuda.stream();
    let (n, k, m) = (4096, 4096, 8);
    let mut rng = Lcg(5);
    let raw: Vec<f32> = (0..n * k).map(|_| rng.next() * 0.6).collect();
    let bits: Vec<u16> = (0..m * k)
        .map(|_| f16::from_f32(rng.next()).to_bits())
        .collect();
    let x = stream.clone_htod(&bits)?;
    for format in [WeightFormat::W4A16, WeightFormat::F16] {
        let linear = layer(device, format, &raw, n, k)?;
        for variant in [Variant::Gemv, Variant::FlatGemm, Variant::Gemm] {
            let half = linear.cuda_writes_half(variant).ok_or("not a CUDA layer")?;
            let mut yh = stream.alloc_zeros::<u16>(m * n)?;
            let mut yf = stream.alloc_zeros::<f32>(m * n)?;
            let y = if half {
                CudaOut::F16(&mut yh)
            } else {
                CudaOut::F32(&mut yf)
            };
            linear.forward_cuda_as(variant, stream, &x, m, y)?;
        }
    }
    stream.synchronize()?;
    Ok(())
}

fn bench_attention(cuda: &CudaDevice, l2: usize) -> Result<(), Failure> {
    let stream = cuda.stream();
    let (hq, kvh, d) = (32usize, 32usize, 128usize);
    let mut rng = Lcg(11);
    // One block of tokens, encoded once and written repeatedly.
    let block = 1024;
    let kd: Vec<f32> = (0..block * kvh * d).map(|_| rng.next() * 1.5).collect();
    let vd: Vec<f32> = (0..block * kvh * d).map(|_| rng.next() * 2.0).collect();
    let q: Vec<u16> = (0..hq * d)
        .map(|_| f16::from_f32(rng.next() * 0.09).to_bits())
        .collect();
    let qb = stream.clone_htod(&q)?;
    let mut ob = stream.alloc_zeros::<u16>(hq * d)?;
    for (format, name) in [(KvFormat::F16, "f16"), (KvFormat::Kv8, "kv8")] {
        let program = cuda
            .backend()
            .attention_program(&library::get(format.kernel_name())?)?;
        let att = CudaAttention::new(cuda, &program)?;
        let (kf, vf): (GpuKv, GpuKv) = gpu_formats(format);
        let ke = encode(format.key_format(), block * kvh, d, &kd)?;
        let ve = encode(format.value_format(), block * kvh, d, &vd)?;
        for s in CONTEXTS {
            let kv_bytes = s * kvh * d * (elem_bytes(kf) + elem_bytes(vf))
                + if kf == GpuKv::I8AsymRow {
                    s * kvh * 8
                } else {
                    0
                };
            let copies = copies_for(kv_bytes, l2);
            let mut caches = Vec::with_capacity(copies);
            for _ in 0..copies {
                let mut c = CudaKvCache::new(cuda, kf, vf, kvh, d, s)?;
                for at in (0..s).step_by(block) {
                    c.write(cuda, at, block.min(s - at), ke.rows(), ve.rows())?;
                }
                caches.push(c);
            }
            let mut scratch = AttentionScratch::new(cuda, &att, s, hq, d)?;
            let us = time_calls(stream, |i| {
                Ok(attention_launch(
                    stream,
                    &att,
                    &qb,
                    &caches[i % copies],
                    s,
                    hq,
                    &mut scratch,
                    &mut ob,
                )?)
            })?;
            eprintln!("attention {name} ctx {s}: {us:.1} us over {copies} caches");
            println!(
                "{{\"kind\":\"attention\",\"impl\":\"tessera-ptx\",\"kv\":\"{name}\",\"ctx\":{s},\"hq\":{hq},\"kvh\":{kvh},\"d\":{d},\"us\":{us:.3},\"kv_bytes\":{kv_bytes},\"copies\":{copies}}}"
            );
        }
    }
    Ok(())
}

fn main() -> Result<(), Failure> {
    let device = Arc::new(Device::open(Backend::Cuda, DeviceOptions::default())?);
    let cuda = device.cuda().ok_or("not a CUDA device")?.clone();
    let l2 = cuda
        .context()
        .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)? as usize;
    eprintln!("{} ({:?}), L2 {l2} bytes", cuda.name(), cuda.sm());
    let only = std::env::args().nth(1).unwrap_or_default();
    if only == "profile" {
        return profile_once(&device, &cuda);
    }
    if only.is_empty() || only == "attention" {
        bench_attention(&cuda, l2)?;
    }
    if only.is_empty() || only == "linear" {
        bench_linear(&device, &cuda, l2)?;
    }
    Ok(())
}
