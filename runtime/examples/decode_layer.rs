//! One Qwen2-1.5B decoder layer (random weights) through the runtime:
//! a prompt (prefill) then 32 decode steps, every matmul and attention
//! call checked against the reference interpreter on the same inputs.
//!
//! Shapes: hidden 1536, 12 query heads, 2 KV heads, head_dim 128,
//! intermediate 8960; qkv [2048, 1536], o [1536, 1536], gate_up
//! [17920, 1536], down [1536, 8960], all W4A8; KV cache f16, allocated in
//! chunks of 64 tokens. RMSNorm, SiLU·up and the residual adds are plain
//! host code (they are not kernels); RoPE is omitted (it does not change
//! what the kernels compute).
//!
//! Tolerances (documented, checked): matmuls ≤ 1e-4·(1 + max|y|) — the
//! kernel and the interpreter quantize x identically, only the f32
//! summation order differs; attention ≤ 4e-3 absolute — f16 output, fp32
//! softmax (the decode kernel's asynchronous softmax against the
//! interpreter's f64 one).
//!
//! `cargo run --release -p tessera-runtime --example decode_layer`
//! (TESSERA_PROMPT=N sets the prompt length, default 16).
//!
//! `-- --backend opencl` runs the same layer on the OpenCL device (PoCL on
//! a CPU-only machine): W4A16 (f16 activations, f32 out), weights and the
//! KV cache resident on the device, prefill as one launch of the fused
//! prefill program. Its matmul tolerance is 1e-3·(1 + max|y|): the GPU kernels take
//! f16 activations and stage dequantized weights as halves. `--backend
//! x86|host|neon` picks a host backend (default: the best one).

use std::sync::Arc;
use std::time::{Duration, Instant};

use half::f16;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tessera_dsl::interp::{self, Bindings, Value};
use tessera_dsl::library;
use tessera_dsl::quant::{self, QuantTensor};
use tessera_runtime::{
    Attention, Backend, Device, DeviceOptions, Input, KvCache, KvCapacity, KvFormat, Linear,
    Output, WeightFormat, Weights,
};

const HIDDEN: usize = 1536;
const HEADS: usize = 12;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = 128;
const INTER: usize = 8960;
const QKV: usize = (HEADS + 2 * KV_HEADS) * HEAD_DIM;
const DECODE_STEPS: usize = 32;
/// Host format and tolerance; the GPU ones are in [`Run::for_backend`].
const HOST_FORMAT: WeightFormat = WeightFormat::W4A8;
const HOST_MATMUL_TOL: f32 = 1e-4;
const GPU_FORMAT: WeightFormat = WeightFormat::W4A16;
const GPU_MATMUL_TOL: f32 = 1e-3;
const ATTENTION_TOL: f32 = 4e-3;

type Error = Box<dyn std::error::Error>;

/// A linear layer with the quantized weights the interpreter checks it by.
struct Layer {
    linear: Linear,
    weights: QuantTensor,
    bias: Vec<f32>,
}

/// The format and matmul tolerance of a run.
#[derive(Clone, Copy)]
struct Run {
    format: WeightFormat,
    tol: f32,
}

impl Run {
    fn for_backend(backend: Backend) -> Run {
        match backend {
            Backend::OpenCl | Backend::Cuda => Run {
                format: GPU_FORMAT,
                tol: GPU_MATMUL_TOL,
            },
            _ => Run {
                format: HOST_FORMAT,
                tol: HOST_MATMUL_TOL,
            },
        }
    }
}

impl Layer {
    fn new(
        dev: &Arc<Device>,
        run: Run,
        r: &mut ChaCha8Rng,
        n: usize,
        k: usize,
    ) -> Result<Layer, Error> {
        let scale = 1.0 / (k as f32).sqrt();
        let w: Vec<f32> = (0..n * k).map(|_| r.gen_range(-scale..scale)).collect();
        let bias: Vec<f32> = (0..n).map(|_| r.gen_range(-0.1..0.1)).collect();
        let kernel = library::get(run.format.library_kernel())?;
        let w_format = kernel
            .as_matmul()
            .and_then(|m| kernel.tensor(&m.w))
            .map(|t| t.format)
            .ok_or("not a matmul")?;
        let weights = quant::quantize(w_format, n, k, &w)?;
        let linear = Linear::new(dev, run.format, Weights::Quant(&weights), n, k, Some(&bias))?;
        Ok(Layer {
            linear,
            weights,
            bias,
        })
    }
}

/// Max errors seen, per kind, and time spent in the runtime.
#[derive(Default)]
struct Stats {
    matmul_rel: f32,
    attention_abs: f32,
    runtime: Duration,
    /// The part of `runtime` in attention calls (the rest is the matmuls
    /// and the cache append), so a slower step names its cause.
    attention: Duration,
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn linear(
    layer: &Layer,
    run: Run,
    x: &[f32],
    m: usize,
    stats: &mut Stats,
) -> Result<Vec<f32>, Error> {
    let n = layer.linear.n();
    let k = layer.linear.k();
    let mut y = vec![0.0; m * n];
    // f16 activations (the A16 formats) are rounded once, for both sides.
    let x16: Vec<f16> = x.iter().map(|&v| f16::from_f32(v)).collect();
    let half_in = run.format.input() == tessera_dsl::Format::F16;
    let t = Instant::now();
    if half_in {
        layer
            .linear
            .forward(Input::F16(&x16), m, Output::F32(&mut y))?;
    } else {
        layer.linear.forward_f32(x, m, &mut y)?;
    }
    stats.runtime += t.elapsed();
    let kernel = library::get(run.format.library_kernel())?;
    let x_value = if half_in {
        Value::F16(x16)
    } else {
        Value::F32(x.to_vec())
    };
    let b = Bindings::new()
        .extent("e", m)
        .extent("h", n)
        .extent("l", k)
        .tensor("x", x_value)
        .tensor("w", Value::Quant(layer.weights.clone()))
        .tensor("bias", Value::F32(layer.bias.clone()));
    let out = interp::run(&kernel, &b)?;
    let want = out.get("y").ok_or("no y")?;
    let scale = want.iter().map(|v| v.abs()).fold(0.0, f32::max);
    let rel = max_abs_diff(&y, want) / (1.0 + scale);
    if rel > run.tol {
        return Err(format!("[{n}, {k}] m={m}: error {rel} above {}", run.tol).into());
    }
    stats.matmul_rel = stats.matmul_rel.max(rel);
    Ok(y)
}

fn rms_norm(x: &[f32]) -> Vec<f32> {
    x.chunks(HIDDEN)
        .flat_map(|row| {
            let ms = row.iter().map(|v| v * v).sum::<f32>() / HIDDEN as f32;
            let inv = 1.0 / (ms + 1e-6).sqrt();
            row.iter().map(move |v| v * inv)
        })
        .collect()
}

/// Attention over the cache for the last `t` tokens, checked.
#[allow(clippy::too_many_arguments)]
fn attend(
    att: &Attention,
    cache: &KvCache,
    keys: &[f32],
    values: &[f32],
    q: &[f16],
    t: usize,
    stats: &mut Stats,
) -> Result<Vec<f32>, Error> {
    let mut o = vec![f16::ZERO; t * HEADS * HEAD_DIM];
    let start = Instant::now();
    if t == 1 {
        att.decode(q, cache, &mut o)?;
    } else {
        att.prefill(q, t, cache, &mut o)?;
    }
    stats.runtime += start.elapsed();
    stats.attention += start.elapsed();
    let s = cache.len();
    let name = if t == 1 {
        "attention-decode-f16"
    } else {
        "attention-prefill-f16"
    };
    let kernel = library::get(name)?;
    let half = |v: &[f32]| Value::F16(v.iter().map(|&x| f16::from_f32(x)).collect());
    let mut b = Bindings::new()
        .extent("hq", HEADS)
        .extent("kvh", KV_HEADS)
        .extent("d", HEAD_DIM)
        .extent("s", s)
        .tensor("q", Value::F16(q.to_vec()))
        .tensor("k", half(keys))
        .tensor("v", half(values));
    if t != 1 {
        b = b.extent("t", t);
    }
    let out = interp::run(&kernel, &b)?;
    let got: Vec<f32> = o.iter().map(|v| v.to_f32()).collect();
    let err = max_abs_diff(&got, out.get("o").ok_or("no o")?);
    if err > ATTENTION_TOL {
        return Err(format!("attention t={t} s={s}: error {err} above {ATTENTION_TOL}").into());
    }
    stats.attention_abs = stats.attention_abs.max(err);
    Ok(got)
}

struct Model {
    run: Run,
    qkv: Layer,
    o: Layer,
    gate_up: Layer,
    down: Layer,
    att: Attention,
}

/// One layer step over `t` new tokens `x` ([t, HIDDEN]); returns the output.
fn step(
    model: &Model,
    cache: &mut KvCache,
    keys: &mut Vec<f32>,
    values: &mut Vec<f32>,
    x: &[f32],
    t: usize,
    stats: &mut Stats,
) -> Result<Vec<f32>, Error> {
    let h = rms_norm(x);
    let run = model.run;
    let qkv = linear(&model.qkv, run, &h, t, stats)?;
    let (qd, kvd) = (HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM);
    let scale = 1.0 / (HEAD_DIM as f32).sqrt();
    let mut q = Vec::with_capacity(t * qd);
    let mut k = Vec::with_capacity(t * kvd);
    let mut v = Vec::with_capacity(t * kvd);
    for row in qkv.chunks(QKV) {
        q.extend(row[..qd].iter().map(|&x| f16::from_f32(x * scale)));
        k.extend_from_slice(&row[qd..qd + kvd]);
        v.extend_from_slice(&row[qd + kvd..]);
    }
    let start = Instant::now();
    cache.append(&k, &v, t)?;
    stats.runtime += start.elapsed();
    keys.extend_from_slice(&k);
    values.extend_from_slice(&v);
    let attn = attend(&model.att, cache, keys, values, &q, t, stats)?;
    let proj = linear(&model.o, run, &attn, t, stats)?;
    let x1: Vec<f32> = x.iter().zip(&proj).map(|(a, b)| a + b).collect();
    let h2 = rms_norm(&x1);
    let gu = linear(&model.gate_up, run, &h2, t, stats)?;
    let act: Vec<f32> = gu
        .chunks(2 * INTER)
        .flat_map(|row| {
            let (g, u) = row.split_at(INTER);
            g.iter()
                .zip(u)
                .map(|(&g, &u)| g / (1.0 + (-g).exp()) * u)
                .collect::<Vec<f32>>()
        })
        .collect();
    let down = linear(&model.down, run, &act, t, stats)?;
    Ok(x1.iter().zip(&down).map(|(a, b)| a + b).collect())
}

fn main() -> Result<(), Error> {
    let prompt: usize = std::env::var("TESSERA_PROMPT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(16);
    let args: Vec<String> = std::env::args().skip(1).collect();
    let backend = match args.as_slice() {
        [] => Backend::best_host(),
        [flag, name] if flag == "--backend" => name.parse::<Backend>()?,
        other => {
            return Err(format!(
                "usage: decode_layer [--backend x86|host|neon|opencl|cuda], got {other:?}"
            )
            .into());
        }
    };
    let start = Instant::now();
    let dev = Arc::new(Device::open(backend, DeviceOptions::default())?);
    let run = Run::for_backend(backend);
    let mut r = ChaCha8Rng::seed_from_u64(2024);
    let model = Model {
        run,
        qkv: Layer::new(&dev, run, &mut r, QKV, HIDDEN)?,
        o: Layer::new(&dev, run, &mut r, HIDDEN, HIDDEN)?,
        gate_up: Layer::new(&dev, run, &mut r, 2 * INTER, HIDDEN)?,
        down: Layer::new(&dev, run, &mut r, HIDDEN, INTER)?,
        att: Attention::new(&dev, HEADS, KV_HEADS, HEAD_DIM, KvFormat::F16)?,
    };
    println!(
        "device: {} backend, {} threads, {}; {} kernels prepared, weights packed in {:.2?}",
        dev.backend(),
        dev.threads(),
        run.format,
        dev.prepared_kernels(),
        start.elapsed()
    );
    for (name, layer) in [
        ("qkv", &model.qkv),
        ("o", &model.o),
        ("gate_up", &model.gate_up),
        ("down", &model.down),
    ] {
        println!(
            "  {name:8} {} ({} packing(s))",
            layer.linear.plan(),
            layer.linear.packings()
        );
    }
    let mut cache = KvCache::for_device(
        &dev,
        KvFormat::F16,
        KV_HEADS,
        HEAD_DIM,
        KvCapacity::Chunked(64),
    )?;
    let (mut keys, mut values) = (Vec::new(), Vec::new());

    let mut stats = Stats::default();
    let x: Vec<f32> = (0..prompt * HIDDEN)
        .map(|_| r.gen_range(-1.0..1.0))
        .collect();
    let mut out = step(
        &model,
        &mut cache,
        &mut keys,
        &mut values,
        &x,
        prompt,
        &mut stats,
    )?;
    let prefill_time = stats.runtime;
    let prefill = std::mem::take(&mut stats);

    let mut decode = Stats::default();
    for _ in 0..DECODE_STEPS {
        // Feed back the last row (a stand-in for the next token's embedding).
        let last = out[out.len() - HIDDEN..].to_vec();
        let x = rms_norm(&last);
        out = step(
            &model,
            &mut cache,
            &mut keys,
            &mut values,
            &x,
            1,
            &mut decode,
        )?;
    }
    println!(
        "prefill: {prompt} tokens in {:.2?} = {:.1} tokens/s (runtime time only)",
        prefill_time,
        prompt as f64 / prefill_time.as_secs_f64()
    );
    println!(
        "decode:  {DECODE_STEPS} steps in {:.2?} = {:.1} tokens/s (runtime time only; attention {:.2?})",
        decode.runtime,
        DECODE_STEPS as f64 / decode.runtime.as_secs_f64(),
        decode.attention
    );
    println!(
        "max error vs interpreter: matmul {:.2e} (relative, tolerance {:.0e}), attention {:.2e} (absolute, tolerance {ATTENTION_TOL:.0e})",
        prefill.matmul_rel.max(decode.matmul_rel),
        run.tol,
        prefill.attention_abs.max(decode.attention_abs)
    );
    println!(
        "KV cache: {} tokens, capacity {}, grew {} time(s), in {}",
        cache.len(),
        cache.capacity(),
        cache.growths(),
        if cache.on_device() {
            "device buffers"
        } else {
            "host memory"
        }
    );
    Ok(())
}
