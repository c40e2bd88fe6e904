//! Times Tessera's PTX kernels on an NVIDIA GPU as the runtime runs them
//! (feature `cuda`): `Linear` on the Llama2-7B shapes for W4A16, Q4_0,
//! W8A16, Q8_0 and f16 weights at M from 1 to 2048 (`CUDA_BENCH_MS` for
//! fewer; the variant the runtime's plan picks for each M, and the others
//! that serve it), and decode attention (32 query heads over 32 KV heads of
//! 128, f16 and kv8 caches) at contexts 4096 to 32768, and causal prefill
//! on tensor cores (Llama2-7B's 32 × 128 heads and Qwen2-1.5B's 12 over 2,
//! prompts of 128 to 2048 tokens; `cuda_bench prefill` alone), beside the
//! per-token decode path it replaces at 512 tokens. One JSON line per
//! measurement on stdout, read by `scripts/gpu/vendor_bench.py report`
//! beside the vendor's (cuBLAS, PyTorch SDPA) timings of the same shapes.
//!
//! Method: every call reads its operands from DRAM, not the L2 cache — the
//! weights (or the KV cache) are copied on the device until the copies
//! exceed 4× the L2 size, and calls rotate through them. A batch of calls
//! sized to about 4 ms is timed with CUDA events on the launch stream;
//! the median over 7 batches, per call, is reported. Each batch is one
//! CUDA graph, as on the vendor side (plain launches where capture
//! fails; the JSON says which). Launches only: the
//! activations, outputs and scratch live on the device throughout.
//!
//! ```text
//! cargo run --release -p tessera-runtime --features cuda --example cuda_bench > ours.jsonl
//! ```

use std::sync::Arc;

use cudarc::driver::sys::{
    CUdevice_attribute, CUevent_flags, CUgraphInstantiate_flags, CUstreamCaptureMode,
};
use cudarc::driver::{CudaGraph, CudaSlice, CudaStream};
use half::f16;
use tessera_codegen::gpu::{GemvPlan, KvFormat as GpuKv, MatmulShape};
use tessera_codegen::ptx::PtxProgram;
use tessera_codegen::ptx::attention::{Depth, print_at, register_budget};
use tessera_codegen::ptx::prefill::BlockPlan;
use tessera_dsl::ir::Variant;
use tessera_dsl::library;
use tessera_dsl::quant::quantize;
use tessera_runtime::cuda::{
    AttentionScratch, CudaAttention, CudaDevice, CudaKvCache, CudaMatmul, CudaOut, CudaPrefill,
    attention_launch, matmul_launch, prefill_launch,
};
use tessera_runtime::gpu_kv::{Encoded, elem_bytes, encode, gpu_formats};
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

/// Median per-call microseconds of `call(i)` (i rotates the operands), and
/// whether the batch ran as a CUDA graph. As on the vendor side, a batch
/// of calls sized to about 4 ms is captured in one graph and replayed, so
/// neither side pays a launch gap per call; where capture fails the batch
/// is timed as plain stream launches.
fn time_calls(
    stream: &Arc<CudaStream>,
    mut call: impl FnMut(usize) -> Result<(), Failure>,
) -> Result<(f64, bool), Failure> {
    let ctx = stream.context();
    // Setup (uploads, copies, cache writes) may be on another stream.
    ctx.synchronize()?;
    // Events that record time (cudarc's default disables timing).
    let timed = || ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT));
    let (start, end) = (timed()?, timed()?);
    let time = |run: &mut dyn FnMut() -> Result<(), Failure>| -> Result<f64, Failure> {
        start.record(stream)?;
        run()?;
        end.record(stream)?;
        end.synchronize()?;
        Ok(f64::from(start.elapsed_ms(&end)?) * 1e3)
    };
    // Warm up (module JIT, clocks), then size batches to about 4 ms.
    time(&mut || (0..3).try_for_each(&mut call))?;
    let one = time(&mut || (3..6).try_for_each(&mut call))? / 3.0;
    let calls = ((4000.0 / one.max(0.5)) as usize).clamp(3, 200);
    let graph = capture(stream, calls, &mut call);
    let mut times: Vec<f64> = Vec::with_capacity(7);
    for b in 0..7 {
        let us = match &graph {
            Some(g) => time(&mut || Ok(g.launch()?))?,
            None => time(&mut || (b * calls..(b + 1) * calls).try_for_each(&mut call))?,
        };
        times.push(us / calls as f64);
    }
    times.sort_by(f64::total_cmp);
    Ok((times[3], graph.is_some()))
}

/// `calls` calls captured in one CUDA graph (uploaded), or `None` where
/// capture fails (the stream is left out of capture either way).
fn capture(
    stream: &Arc<CudaStream>,
    calls: usize,
    call: &mut impl FnMut(usize) -> Result<(), Failure>,
) -> Option<CudaGraph> {
    if let Err(e) = stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED) {
        eprintln!("graph capture refused ({e:?}): timing plain launches");
        return None;
    }
    let captured = (0..calls).try_for_each(&mut *call);
    let graph = stream.end_capture(CUgraphInstantiate_flags(0));
    let failed = |what: String| {
        eprintln!("graph {what}: timing plain launches");
        None
    };
    match (captured, graph) {
        (Ok(()), Ok(Some(g))) => match g.upload().and_then(|()| g.launch()) {
            Ok(()) => match stream.synchronize() {
                Ok(()) => Some(g),
                Err(e) => failed(format!("replay failed ({e:?})")),
            },
            Err(e) => failed(format!("launch failed ({e:?})")),
        },
        (captured, graph) => failed(format!(
            "capture failed ({:?}, {:?})",
            captured.err(),
            graph.err()
        )),
    }
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

/// The batch sizes `linear` times: [`MS`], or the comma-separated list in
/// `CUDA_BENCH_MS` (a shorter run on a machine lent for minutes).
fn batch_sizes() -> Vec<usize> {
    std::env::var("CUDA_BENCH_MS")
        .ok()
        .map(|v| v.split(',').filter_map(|m| m.trim().parse().ok()).collect())
        .filter(|ms: &Vec<usize>| !ms.is_empty())
        .unwrap_or_else(|| MS.to_vec())
}

fn bench_linear(device: &Arc<Device>, cuda: &CudaDevice, l2: usize) -> Result<(), Failure> {
    let stream = cuda.stream();
    let mut rng = Lcg(7);
    for (n, k) in SHAPES {
        let raw: Vec<f32> = (0..n * k).map(|_| rng.next() * 0.6).collect();
        for format in [
            WeightFormat::W4A16,
            WeightFormat::Q4_0A16,
            WeightFormat::W8A16,
            WeightFormat::Q8_0A16,
            WeightFormat::F16,
        ] {
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
            for m in batch_sizes() {
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
                    let (us, graph) = time_calls(stream, |i| {
                        let y = if half {
                            CudaOut::F16(&mut yh)
                        } else {
                            CudaOut::F32(&mut yf)
                        };
                        Ok(layers[i % copies].forward_cuda_as(variant, stream, &x, m, y)?)
                    })?;
                    println!(
                        "{{\"kind\":\"linear\",\"impl\":\"tessera-ptx\",\"variant\":\"{name}\",\"chosen\":{},\"format\":\"{format}\",\"m\":{m},\"n\":{n},\"k\":{k},\"us\":{us:.3},\"weight_bytes\":{bytes},\"copies\":{copies},\"graph\":{graph}}}",
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

/// The timed attention's query heads, KV heads and head dimension (Llama2-7B).
const HQ: usize = 32;
const KVH: usize = 32;
const HEAD_DIM: usize = 128;
/// Tokens of one block of K and V rows, encoded once and written repeatedly.
const BLOCK: usize = 1024;

/// One block of random K and V rows (f32), and a query on the device.
type AttentionInputs = (Vec<f32>, Vec<f32>, CudaSlice<u16>);

fn attention_inputs(stream: &Arc<CudaStream>, seed: u64) -> Result<AttentionInputs, Failure> {
    let mut rng = Lcg(seed);
    let rows = BLOCK * KVH * HEAD_DIM;
    let kd: Vec<f32> = (0..rows).map(|_| rng.next() * 1.5).collect();
    let vd: Vec<f32> = (0..rows).map(|_| rng.next() * 2.0).collect();
    let q: Vec<u16> = (0..HQ * HEAD_DIM)
        .map(|_| f16::from_f32(rng.next() * 0.09).to_bits())
        .collect();
    Ok((kd, vd, stream.clone_htod(&q)?))
}

/// The largest difference of `got` from the first output of a sweep (kept
/// in `reference`; 0 for the first itself).
fn against_first(reference: &mut Option<Vec<f32>>, got: Vec<f32>) -> f32 {
    match reference {
        None => {
            *reference = Some(got);
            0.0
        }
        Some(r) => r
            .iter()
            .zip(&got)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max),
    }
}

/// `copies` caches of `s` tokens of `kvh` heads of `d`, each filled with
/// the encoded `block` rows over and over.
fn filled_caches(
    cuda: &CudaDevice,
    (kf, vf): (GpuKv, GpuKv),
    (kvh, d, s): (usize, usize, usize),
    copies: usize,
    (ke, ve): (&Encoded, &Encoded),
    block: usize,
) -> Result<Vec<CudaKvCache>, Failure> {
    let mut caches = Vec::with_capacity(copies);
    for _ in 0..copies {
        let mut c = CudaKvCache::new(cuda, kf, vf, kvh, d, s)?;
        for at in (0..s).step_by(block) {
            c.write(cuda, at, block.min(s - at), ke.rows(), ve.rows())?;
        }
        caches.push(c);
    }
    Ok(caches)
}

/// [`time_calls`] of `att` over each of `caches` in turn (all of one length).
fn time_attention(
    stream: &Arc<CudaStream>,
    att: &CudaAttention,
    q: &CudaSlice<u16>,
    caches: &[CudaKvCache],
    hq: usize,
    scratch: &mut AttentionScratch,
    o: &mut CudaSlice<u16>,
) -> Result<(f64, bool), Failure> {
    let s = caches.first().map_or(0, CudaKvCache::capacity);
    time_calls(stream, |i| {
        Ok(attention_launch(
            stream,
            att,
            q,
            &caches[i % caches.len()],
            s,
            hq,
            scratch,
            o,
        )?)
    })
}

fn bench_attention(cuda: &CudaDevice, l2: usize) -> Result<(), Failure> {
    let stream = cuda.stream();
    let (hq, kvh, d, block) = (HQ, KVH, HEAD_DIM, BLOCK);
    let (kd, vd, qb) = attention_inputs(stream, 11)?;
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
            let caches = filled_caches(cuda, (kf, vf), (kvh, d, s), copies, (&ke, &ve), block)?;
            let mut scratch = AttentionScratch::new(cuda, &att, s, hq, d)?;
            let (us, graph) =
                time_attention(stream, &att, &qb, &caches, hq, &mut scratch, &mut ob)?;
            eprintln!("attention {name} ctx {s}: {us:.1} us over {copies} caches");
            println!(
                "{{\"kind\":\"attention\",\"impl\":\"tessera-ptx\",\"kv\":\"{name}\",\"ctx\":{s},\"hq\":{hq},\"kvh\":{kvh},\"d\":{d},\"us\":{us:.3},\"kv_bytes\":{kv_bytes},\"copies\":{copies},\"graph\":{graph}}}"
            );
        }
    }
    Ok(())
}

/// Prompt lengths of the prefill timings (no prefix cached).
const PROMPTS: [usize; 3] = [128, 512, 2048];

/// A cache of `t` random tokens in `format` and `t` random query tokens
/// (host bits and a device copy), from `seed`.
fn prefill_inputs(
    cuda: &CudaDevice,
    format: KvFormat,
    (t, hq, kvh, d): (usize, usize, usize, usize),
    seed: u64,
) -> Result<(CudaKvCache, Vec<u16>, CudaSlice<u16>), Failure> {
    let mut rng = Lcg(seed);
    let rows = t * kvh * d;
    let kd: Vec<f32> = (0..rows).map(|_| rng.next() * 1.5).collect();
    let vd: Vec<f32> = (0..rows).map(|_| rng.next() * 2.0).collect();
    let ke = encode(format.key_format(), t * kvh, d, &kd)?;
    let ve = encode(format.value_format(), t * kvh, d, &vd)?;
    let (kf, vf): (GpuKv, GpuKv) = gpu_formats(format);
    let mut cache = CudaKvCache::new(cuda, kf, vf, kvh, d, t)?;
    cache.write(cuda, 0, t, ke.rows(), ve.rows())?;
    let q: Vec<u16> = (0..t * hq * d)
        .map(|_| f16::from_f32(rng.next() * 0.09).to_bits())
        .collect();
    let qb = cuda.stream().clone_htod(&q)?;
    Ok((cache, q, qb))
}

/// Causal prefill (`p = 0`) on tensor cores for two head layouts, f16 and
/// kv8 caches; at 512 tokens also the per-token decode path (two launches
/// a token) it replaces. The operands of one prefill stay in the L2 as the
/// vendor's do: prefill is bound by the tensor cores, not by DRAM.
fn bench_prefill(cuda: &CudaDevice) -> Result<(), Failure> {
    let stream = cuda.stream();
    for (hq, kvh, d, heads) in [(32, 32, 128, "llama2-7b"), (12, 2, 128, "qwen2-1.5b")] {
        for (format, name) in [(KvFormat::F16, "f16"), (KvFormat::Kv8, "kv8")] {
            let program = cuda
                .backend()
                .prefill_program(&library::get(format.prefill_kernel_name())?, d)?;
            let pre = CudaPrefill::new(cuda, &program)?;
            for t in PROMPTS {
                let (cache, q, qb) = prefill_inputs(cuda, format, (t, hq, kvh, d), 17 + t as u64)?;
                let mut ob = stream.alloc_zeros::<u16>(t * hq * d)?;
                let (us, graph) = time_calls(stream, |_| {
                    Ok(prefill_launch(
                        stream, &pre, &qb, &cache, t, t, hq, &mut ob,
                    )?)
                })?;
                // Causal: row i meets i + 1 keys; 2 FLOPs a MAC, Q·Kᵀ and P·V.
                let flops = 4 * hq * d * t * (t + 1) / 2;
                let per_token = if t == 512 && format == KvFormat::F16 {
                    per_token_decode_us(cuda, format, &cache, &q, (t, hq, d))?
                } else {
                    None
                };
                eprintln!(
                    "prefill {heads} {name} t {t}: {us:.1} us ({:.1} TFLOP/s){}",
                    flops as f64 / us / 1e6,
                    per_token.map_or(String::new(), |p| format!(", per token {p:.1} us"))
                );
                println!(
                    "{{\"kind\":\"prefill\",\"impl\":\"tessera-ptx\",\"heads\":\"{heads}\",\"kv\":\"{name}\",\"t\":{t},\"p\":0,\"hq\":{hq},\"kvh\":{kvh},\"d\":{d},\"us\":{us:.3},\"flops\":{flops},\"per_token_us\":{},\"graph\":{graph}}}",
                    per_token.map_or("null".to_string(), |p| format!("{p:.3}"))
                );
            }
        }
    }
    Ok(())
}

/// The prefill at 512 and 2048 tokens under other block plans (keys per
/// block, Q in registers or shared memory) than the default (the first
/// row), each checked against the default's output
/// (`cuda_bench prefill-plans`).
fn sweep_prefill_plans(cuda: &CudaDevice) -> Result<(), Failure> {
    let stream = cuda.stream();
    let plan = |keys, q_in_registers, warps| {
        Some(BlockPlan {
            keys,
            q_in_registers,
            warps,
        })
    };
    let plans = [
        None,
        plan(32, true, 4),
        plan(64, true, 8),
        plan(32, true, 8),
        plan(64, true, 2),
        plan(128, true, 4),
    ];
    for (hq, kvh, d, heads) in [(32, 32, 128, "llama2-7b"), (12, 2, 128, "qwen2-1.5b")] {
        for (format, name) in [(KvFormat::F16, "f16"), (KvFormat::Kv8, "kv8")] {
            let kernel = library::get(format.prefill_kernel_name())?;
            for t in [512, 2048] {
                let (cache, _, qb) = prefill_inputs(cuda, format, (t, hq, kvh, d), 29 + t as u64)?;
                let mut ob = stream.alloc_zeros::<u16>(t * hq * d)?;
                let mut reference = None;
                for blocks in plans {
                    let program = match cuda.backend().prefill_program_at(&kernel, d, blocks) {
                        Ok(p) => p,
                        Err(e) => {
                            eprintln!("prefill plan {blocks:?}: {e}");
                            continue;
                        }
                    };
                    let pre = CudaPrefill::new(cuda, &program)?;
                    let (us, graph) = time_calls(stream, |_| {
                        Ok(prefill_launch(
                            stream, &pre, &qb, &cache, t, t, hq, &mut ob,
                        )?)
                    })?;
                    prefill_launch(stream, &pre, &qb, &cache, t, t, hq, &mut ob)?;
                    let got: Vec<f32> = stream
                        .clone_dtoh(&ob)?
                        .into_iter()
                        .map(|b| f16::from_bits(b).to_f32())
                        .collect();
                    let worst = against_first(&mut reference, got);
                    let flops = 4 * hq * d * t * (t + 1) / 2;
                    let (keys, warps) = (program.plan.keys, program.plan.rows / 16);
                    let q_regs = blocks.map_or(d <= 128, |b| b.q_in_registers);
                    eprintln!(
                        "prefill plan {heads} {name} t {t} keys {keys} q_in_registers {q_regs} warps {warps}: {us:.1} us ({:.1} TFLOP/s), max diff {worst}",
                        flops as f64 / us / 1e6
                    );
                    println!(
                        "{{\"kind\":\"prefill-plan\",\"heads\":\"{heads}\",\"kv\":\"{name}\",\"t\":{t},\"keys\":{keys},\"q_in_registers\":{q_regs},\"warps\":{warps},\"us\":{us:.3},\"flops\":{flops},\"max_diff\":{worst},\"graph\":{graph}}}"
                    );
                    println!(
                        "{{\"kind\":\"prefill-plan\",\"heads\":\"{heads}\",\"kv\":\"{name}\",\"t\":{t},\"keys\":{keys},\"q_in_registers\":{q_regs},\"us\":{us:.3},\"flops\":{flops},\"max_diff\":{worst},\"graph\":{graph}}}"
                    );
                }
            }
        }
    }
    Ok(())
}

/// The per-token path (one split-K decode launch pair per prompt token
/// over its causal prefix, as `Attention::prefill` ran before the
/// tensor-core program) over the same cache; µs for the whole prompt.
fn per_token_decode_us(
    cuda: &CudaDevice,
    format: KvFormat,
    cache: &CudaKvCache,
    q: &[u16],
    (t, hq, d): (usize, usize, usize),
) -> Result<Option<f64>, Failure> {
    let stream = cuda.stream();
    let program = cuda
        .backend()
        .attention_program(&library::get(format.kernel_name())?)?;
    let att = CudaAttention::new(cuda, &program)?;
    let qs: Vec<CudaSlice<u16>> = q
        .chunks(hq * d)
        .map(|row| stream.clone_htod(row))
        .collect::<Result<_, _>>()?;
    let mut ob = stream.alloc_zeros::<u16>(hq * d)?;
    let mut scratch = AttentionScratch::new(cuda, &att, t, hq, d)?;
    let (us, _) = time_calls(stream, |_| {
        for (i, qi) in qs.iter().enumerate() {
            attention_launch(stream, &att, qi, cache, i + 1, hq, &mut scratch, &mut ob)?;
        }
        Ok(())
    })?;
    Ok(Some(us))
}

/// The f16 decode attention at ctx 4096 and 32768 under other partial
/// blocks, split lengths, combine widths and loop depths than the plan's
/// (the plan is the first row), each checked against the plan's output:
/// how the plan's constants were chosen (`cuda_bench attention-plans`).
/// With `profile`, one launch of the plan at ctx 32768, for a profiler
/// (`ncu ... cuda_bench profile-attention`).
fn sweep_attention_plans(cuda: &CudaDevice, l2: usize, profile: bool) -> Result<(), Failure> {
    let stream = cuda.stream();
    let (hq, kvh, d, block) = (HQ, KVH, HEAD_DIM, BLOCK);
    let (kd, vd, qb) = attention_inputs(stream, 13)?;
    let format = KvFormat::F16;
    let base = cuda
        .backend()
        .attention_program(&library::get(format.kernel_name())?)?;
    let (kf, vf): (GpuKv, GpuKv) = gpu_formats(format);
    let ke = encode(format.key_format(), block * kvh, d, &kd)?;
    let ve = encode(format.value_format(), block * kvh, d, &vd)?;
    let plan = &base.plan;
    let full = register_budget(cuda.sm());
    let deep = |score, values, registers| (Depth { score, values }, registers);
    let variants = [
        (
            plan.wg,
            plan.keys_per_split,
            plan.combine_launch[2].local,
            (Depth::DEFAULT, full),
        ),
        (128, 256, 8, deep(8, 8, full)),
        (128, 256, 8, deep(8, 16, 80)),
        (128, 256, 8, deep(8, 8, 64)),
        (128, 256, 8, deep(16, 16, full)),
        (64, 256, 8, deep(8, 16, full)),
        (64, 128, 8, deep(8, 16, full)),
    ];
    let contexts: &[usize] = if profile { &[32768] } else { &[4096, 32768] };
    let variants: &[_] = if profile { &variants[..1] } else { &variants };
    for &s in contexts {
        let kv_bytes = s * kvh * d * (elem_bytes(kf) + elem_bytes(vf));
        let copies = copies_for(kv_bytes, l2);
        let caches = filled_caches(cuda, (kf, vf), (kvh, d, s), copies, (&ke, &ve), block)?;
        let mut reference: Option<Vec<f32>> = None;
        for &(wg, kps, cw, (depth, registers)) in variants {
            let mut p = plan.clone();
            p.wg = wg;
            p.keys_per_split = kps;
            p.partial_launch[0].local = wg;
            p.combine_launch[2].local = cw;
            let text = print_at(&p, cuda.sm(), "plan sweep", depth, registers)?;
            let program = tessera_codegen::ptx::PtxAttentionProgram { plan: p, text };
            let att = CudaAttention::new(cuda, &program)?;
            let mut scratch = AttentionScratch::new(cuda, &att, s, hq, d)?;
            let mut ob = stream.alloc_zeros::<u16>(hq * d)?;
            if profile {
                attention_launch(stream, &att, &qb, &caches[0], s, hq, &mut scratch, &mut ob)?;
                stream.synchronize()?;
                return Ok(());
            }
            let (us, graph) =
                time_attention(stream, &att, &qb, &caches, hq, &mut scratch, &mut ob)?;
            attention_launch(stream, &att, &qb, &caches[0], s, hq, &mut scratch, &mut ob)?;
            let got: Vec<f32> = stream
                .clone_dtoh(&ob)?
                .into_iter()
                .map(|b| f16::from_bits(b).to_f32())
                .collect();
            let worst = against_first(&mut reference, got);
            println!(
                "{{\"kind\":\"attention-plan\",\"ctx\":{s},\"wg\":{wg},\"keys_per_split\":{kps},\"combine_warps\":{cw},\"score_unroll\":{},\"pv_unroll\":{},\"registers\":{registers},\"us\":{us:.3},\"gbps\":{:.0},\"max_diff\":{worst},\"graph\":{graph}}}",
                depth.score,
                depth.values,
                kv_bytes as f64 / us / 1e3
            );
        }
    }
    Ok(())
}

/// The W4A16 GEMV at M = 1 on every shape under other work-group shapes,
/// channel counts and register limits than the plan's (the plan is the
/// first row), each checked against the plan's output (`cuda_bench
/// gemv-plans`).
fn sweep_gemv_plans(device: &Arc<Device>, cuda: &CudaDevice, l2: usize) -> Result<(), Failure> {
    let stream = cuda.stream();
    let mut rng = Lcg(17);
    for (n, k) in SHAPES {
        let raw: Vec<f32> = (0..n * k).map(|_| rng.next() * 0.6).collect();
        let first = layer(device, WeightFormat::W4A16, &raw, n, k)?;
        let bytes = first.cuda_weight_bytes().ok_or("not a CUDA layer")?;
        let copies = copies_for(bytes, l2);
        let mut layers = vec![first];
        for _ in 1..copies {
            layers.push(layers[0].duplicate_cuda()?);
        }
        let bits: Vec<u16> = (0..k)
            .map(|_| f16::from_f32(rng.next()).to_bits())
            .collect();
        let x: CudaSlice<u16> = stream.clone_htod(&bits)?;
        let (mm, _) = layers[0].cuda_parts(Variant::Gemv).ok_or("no CUDA GEMV")?;
        let base = mm.plan().clone();
        let MatmulShape::Gemv(g0) = base.shape else {
            return Err("the GEMV plan is not a GEMV".into());
        };
        let full = cuda.sm().caps().registers;
        let variants = [
            (g0.wg_h, g0.k_lanes, g0.channels, full),
            (g0.wg_h, g0.k_lanes, g0.channels, 96),
            (g0.wg_h, g0.k_lanes, g0.channels, 80),
            (g0.wg_h, g0.k_lanes, g0.channels, 64),
            (4, 32, 4, full),
            (4, 32, 4, 80),
            (4, 32, 4, 64),
            (4, 64, 2, 64),
            (4, 64, 2, 48),
        ];
        let mut reference: Option<Vec<f32>> = None;
        for (wg_h, k_lanes, channels, registers) in variants {
            let g = GemvPlan {
                wg_h,
                k_lanes,
                channels,
                rows: 1,
            };
            let mut plan = base.clone();
            plan.shape = MatmulShape::Gemv(g);
            plan.launch[0].per_group = wg_h * channels;
            plan.launch[0].local = wg_h;
            plan.launch[1].local = k_lanes;
            let text =
                tessera_codegen::ptx::gemv::print_at(&plan, &g, cuda.sm(), "gemv sweep", registers);
            let program = PtxProgram {
                plan,
                dynamic_shared_bytes: 0,
                text,
            };
            let mm = CudaMatmul::new(cuda, &program)?;
            let half = mm.writes_half();
            let mut yh = stream.alloc_zeros::<u16>(if half { n } else { 1 })?;
            let mut yf = stream.alloc_zeros::<f32>(if half { 1 } else { n })?;
            fn out<'a>(
                half: bool,
                yh: &'a mut CudaSlice<u16>,
                yf: &'a mut CudaSlice<f32>,
            ) -> CudaOut<'a> {
                if half {
                    CudaOut::F16(yh)
                } else {
                    CudaOut::F32(yf)
                }
            }
            let (us, graph) = time_calls(stream, |i| {
                let (_, w) = layers[i % copies]
                    .cuda_parts(Variant::Gemv)
                    .ok_or("no CUDA GEMV")?;
                Ok(matmul_launch(
                    stream,
                    &mm,
                    w,
                    &x,
                    1,
                    out(half, &mut yh, &mut yf),
                )?)
            })?;
            let (_, w) = layers[0].cuda_parts(Variant::Gemv).ok_or("no CUDA GEMV")?;
            matmul_launch(stream, &mm, w, &x, 1, out(half, &mut yh, &mut yf))?;
            let got: Vec<f32> = if half {
                stream
                    .clone_dtoh(&yh)?
                    .into_iter()
                    .map(|b| f16::from_bits(b).to_f32())
                    .collect()
            } else {
                stream.clone_dtoh(&yf)?
            };
            let worst = against_first(&mut reference, got);
            println!(
                "{{\"kind\":\"gemv-plan\",\"n\":{n},\"k\":{k},\"wg_h\":{wg_h},\"k_lanes\":{k_lanes},\"channels\":{channels},\"registers\":{registers},\"us\":{us:.3},\"gbps\":{:.0},\"max_diff\":{worst},\"graph\":{graph}}}",
                bytes as f64 / us / 1e3
            );
        }
    }
    Ok(())
}

fn main() -> Result<(), Failure> {
    let device = Arc::new(Device::open(Backend::Cuda, DeviceOptions::default())?);
    let cuda = device.cuda().ok_or("not a CUDA device")?.clone();
    // SAFETY: with tracking off, cudarc no longer orders a buffer's uses
    // across streams; here every timing starts with a context-wide
    // synchronize (`time_calls`) and all timed work is on one stream.
    unsafe { cuda.context().disable_event_tracking() };
    // A stream of its own: the legacy default stream cannot be captured.
    let cuda = cuda.with_new_stream()?;
    let l2 = cuda
        .context()
        .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)? as usize;
    eprintln!("{} ({:?}), L2 {l2} bytes", cuda.name(), cuda.sm());
    let only = std::env::args().nth(1).unwrap_or_default();
    if only == "profile" {
        return profile_once(&device, &cuda);
    }
    if only == "attention-plans" {
        return sweep_attention_plans(&cuda, l2, false);
    }
    if only == "profile-attention" {
        return sweep_attention_plans(&cuda, l2, true);
    }
    if only == "prefill-plans" {
        return sweep_prefill_plans(&cuda);
    }
    if only == "gemv-plans" {
        return sweep_gemv_plans(&device, &cuda, l2);
    }
    if only.is_empty() || only == "attention" {
        bench_attention(&cuda, l2)?;
    }
    if only.is_empty() || only == "prefill" {
        bench_prefill(&cuda)?;
    }
    if only.is_empty() || only == "linear" {
        bench_linear(&device, &cuda, l2)?;
    }
    Ok(())
}
