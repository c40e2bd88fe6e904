//! The `decode_layer` example's decoder layer with its weights from a GGUF
//! file: block N's `attn_q/k/v`, `attn_output`, `ffn_gate/up/down` (and
//! the `attn_q/k/v` biases and the two RMSNorm weights where the file has
//! them) as `Linear`s on any backend, then a prompt (prefill) and 16
//! decode steps. Every matmul is checked against an f64 matmul over the
//! file's own dequantized weights, within the bound the kernel's
//! activation precision and the tensor's conversion error allow (see
//! `runtime/tests/model_file.rs`); attention runs on the runtime's KV cache
//! (its kernels are checked by their own tests). RoPE is omitted, as in
//! `decode_layer`.
//!
//! ```text
//! cargo run --release -p tessera-runtime --example gguf_layer -- MODEL.gguf [--block N] [--backend x86|host|neon|opencl]
//! ```
//!
//! Any llama-style GGUF works (llama, qwen2, mistral, …: the shapes come
//! from `{arch}.embedding_length`, `.attention.head_count(_kv)`,
//! `.attention.key_length`, `.feed_forward_length`). Without one, write a
//! layer with Qwen2-1.5B's shapes with llama.cpp's `gguf` package (the
//! test oracle's writer; `scripts/test.sh` installs it):
//!
//! ```text
//! GGUF_EMBD=1536 GGUF_FF=8960 GGUF_HEADS=12 GGUF_KV_HEADS=2 \
//! PYTHONPATH=~/.cache/tessera/gguf python3 runtime/tests/oracle/write_gguf.py /tmp/layer 1 \
//!   blk.0.attn_q.weight:Q4_0:1536:1536 blk.0.attn_k.weight:Q4_0:256:1536 \
//!   blk.0.attn_v.weight:Q8_0:256:1536 blk.0.attn_output.weight:Q4_1:1536:1536 \
//!   blk.0.ffn_gate.weight:Q4_K:8960:1536 blk.0.ffn_up.weight:Q4_K:8960:1536 \
//!   blk.0.ffn_down.weight:Q6_K:1536:8960
//! cargo run --release -p tessera-runtime --example gguf_layer -- /tmp/layer/model.gguf
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use half::f16;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tessera_dsl::ir::Format;
use tessera_runtime::model_file::{Conversion, LoadedLinear};
use tessera_runtime::{
    Attention, Backend, Device, DeviceOptions, Input, KvCache, KvCapacity, KvFormat, ModelFile,
    Output, SharedInput,
};

type Error = Box<dyn std::error::Error>;

const DECODE_STEPS: usize = 16;
const PROMPT: usize = 8;

/// A layer's matmul: the runtime's Linear and the file's exact weights.
struct Layer {
    name: String,
    loaded: LoadedLinear,
    exact: Vec<f32>,
    bias: Vec<f32>,
    /// f16 staging bound on a GPU.
    gpu: bool,
}

struct Dims {
    hidden: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    ff: usize,
}

fn meta_usize(file: &ModelFile, key: &str) -> Result<Option<usize>, Error> {
    let h = file.gguf().ok_or("not a GGUF file")?;
    match h.meta(key) {
        None => Ok(None),
        Some(v) => Ok(Some(
            v.as_u64()
                .ok_or_else(|| format!("{}: `{key}` is not an integer", file.path()))?
                as usize,
        )),
    }
}

fn dims(file: &ModelFile) -> Result<Dims, Error> {
    let h = file.gguf().ok_or("not a GGUF file")?;
    let arch = h
        .meta("general.architecture")
        .and_then(|v| v.as_str())
        .ok_or("no general.architecture")?
        .to_string();
    let need = |k: &str| -> Result<usize, Error> {
        meta_usize(file, &format!("{arch}.{k}"))?
            .ok_or_else(|| format!("{}: no `{arch}.{k}`", file.path()).into())
    };
    let hidden = need("embedding_length")?;
    let heads = need("attention.head_count")?;
    let kv_heads = meta_usize(file, &format!("{arch}.attention.head_count_kv"))?.unwrap_or(heads);
    let head_dim =
        meta_usize(file, &format!("{arch}.attention.key_length"))?.unwrap_or(hidden / heads);
    Ok(Dims {
        hidden,
        heads,
        kv_heads,
        head_dim,
        ff: need("feed_forward_length")?,
    })
}

/// A 1-D tensor's values, if the file has it.
fn vector(file: &ModelFile, name: &str) -> Result<Option<Vec<f32>>, Error> {
    if file.tensor(name).is_err() {
        return Ok(None);
    }
    Ok(Some(file.dequantize(name)?))
}

impl Layer {
    fn load(dev: &Arc<Device>, file: &ModelFile, block: usize, part: &str) -> Result<Layer, Error> {
        let name = format!("blk.{block}.{part}.weight");
        let n = file.tensor(&name)?.shape[0];
        let bias = vector(file, &format!("blk.{block}.{part}.bias"))?.unwrap_or(vec![0.0; n]);
        let loaded = file.linear_on(dev, &name, Some(&bias))?;
        Ok(Layer {
            exact: file.dequantize(&name)?,
            name,
            loaded,
            bias,
            gpu: dev.is_gpu(),
        })
    }

    /// y = x · wᵀ + b for `m` rows, checked against the f64 oracle; returns
    /// y and the largest |error| / bound seen. `shared` is x for the layers
    /// that read it too (Q, K, V; gate, up): quantized once for all.
    fn forward(
        &self,
        x: &[f32],
        m: usize,
        shared: &SharedInput<'_>,
        time: &mut Duration,
    ) -> Result<(Vec<f32>, f64), Error> {
        let lin = &self.loaded.linear;
        let (n, k) = (lin.n(), lin.k());
        let format = self.loaded.format;
        let x16: Vec<f16> = x.iter().map(|&v| f16::from_f32(v)).collect();
        let half_in = format.input() == Format::F16;
        let xs: Vec<f32> = if half_in {
            x16.iter().map(|v| v.to_f32()).collect()
        } else {
            x.to_vec()
        };
        let mut y = vec![0.0f32; m * n];
        let mut y16 = vec![f16::ZERO; m * n];
        let input = if half_in {
            Input::F16(&x16)
        } else {
            Input::F32(x)
        };
        let f16_out = format.output() == Format::F16;
        let output = if f16_out {
            Output::F16(&mut y16)
        } else {
            Output::F32(&mut y)
        };
        let t = Instant::now();
        if half_in {
            lin.forward(input, m, output)?;
        } else {
            lin.forward_shared(shared, output)?;
        }
        *time += t.elapsed();
        if f16_out {
            y = y16.iter().map(|v| v.to_f32()).collect();
        }
        let kernel = tessera_dsl::library::get(format.library_kernel())?;
        let mm = kernel.as_matmul().ok_or("not a matmul")?;
        let x_format = kernel.tensor(&mm.x).ok_or("no x")?.format;
        let w_err = match self.loaded.conversion {
            Conversion::Requantized(s) => s.max_abs,
            _ => 0.0,
        };
        let mut worst = 0.0f64;
        for i in 0..m {
            let xr = &xs[i * k..(i + 1) * k];
            let amax = xr.iter().fold(0.0f64, |a, v| a.max(f64::from(*v).abs()));
            let sum_x: f64 = xr.iter().map(|v| f64::from(*v).abs()).sum();
            for j in 0..n {
                let wr = &self.exact[j * k..(j + 1) * k];
                let (mut want, mut sum_xw, mut sum_w) = (f64::from(self.bias[j]), 0.0, 0.0);
                for (a, b) in xr.iter().zip(wr) {
                    let (a, b) = (f64::from(*a), f64::from(*b));
                    want += a * b;
                    sum_xw += (a * b).abs();
                    sum_w += b.abs();
                }
                let act = match x_format {
                    Format::I8Dyn => amax / 127.0 * 0.5 * sum_w * 1.01,
                    Format::F16 => sum_xw * 2f64.powi(-11),
                    _ => 0.0,
                };
                let bound = act
                    + sum_x * w_err
                    + if self.gpu {
                        sum_xw * 2f64.powi(-10)
                    } else {
                        0.0
                    }
                    + if f16_out {
                        want.abs() * 2f64.powi(-10)
                    } else {
                        0.0
                    }
                    + 1e-5 * sum_xw
                    + 1e-5;
                let err = (f64::from(y[i * n + j]) - want).abs();
                if err > bound {
                    return Err(format!(
                        "{} m={m}: y[{i}, {j}] = {}, oracle {want}: error {err:.3e} above its bound {bound:.3e}",
                        self.name,
                        y[i * n + j]
                    )
                    .into());
                }
                worst = worst.max(err / bound);
            }
        }
        Ok((y, worst))
    }
}

fn rms_norm(x: &[f32], w: &[f32]) -> Vec<f32> {
    let d = w.len();
    x.chunks(d)
        .flat_map(|row| {
            let ms = row.iter().map(|v| v * v).sum::<f32>() / d as f32;
            let inv = 1.0 / (ms + 1e-6).sqrt();
            row.iter().zip(w).map(move |(v, g)| v * inv * g)
        })
        .collect()
}

struct Model {
    d: Dims,
    q: Layer,
    k: Layer,
    v: Layer,
    o: Layer,
    gate: Layer,
    up: Layer,
    down: Layer,
    attn_norm: Vec<f32>,
    ffn_norm: Vec<f32>,
    att: Attention,
}

#[derive(Default)]
struct Stats {
    worst: f64,
    runtime: Duration,
    /// Quantizations of the inputs shared by Q, K, V and by gate, up.
    shared_quantizations: usize,
}

fn step(
    m: &Model,
    cache: &mut KvCache,
    x: &[f32],
    t: usize,
    s: &mut Stats,
) -> Result<Vec<f32>, Error> {
    let d = &m.d;
    let mut run = |layer: &Layer, x: &[f32], shared: &SharedInput<'_>| -> Result<Vec<f32>, Error> {
        let (y, w) = layer.forward(x, t, shared, &mut s.runtime)?;
        s.worst = s.worst.max(w);
        Ok(y)
    };
    let alone = |x| SharedInput::new(Input::F32(x), t);
    let h = rms_norm(x, &m.attn_norm);
    let hs = SharedInput::new(Input::F32(&h), t);
    let scale = 1.0 / (d.head_dim as f32).sqrt();
    let q: Vec<f16> = run(&m.q, &h, &hs)?
        .iter()
        .map(|&v| f16::from_f32(v * scale))
        .collect();
    let k = run(&m.k, &h, &hs)?;
    let v = run(&m.v, &h, &hs)?;
    cache.append(&k, &v, t)?;
    let mut o = vec![f16::ZERO; t * d.heads * d.head_dim];
    if t == 1 {
        m.att.decode(&q, cache, &mut o)?;
    } else {
        m.att.prefill(&q, t, cache, &mut o)?;
    }
    let attn: Vec<f32> = o.iter().map(|v| v.to_f32()).collect();
    let proj = run(&m.o, &attn, &alone(&attn))?;
    let x1: Vec<f32> = x.iter().zip(&proj).map(|(a, b)| a + b).collect();
    let h2 = rms_norm(&x1, &m.ffn_norm);
    let h2s = SharedInput::new(Input::F32(&h2), t);
    let g = run(&m.gate, &h2, &h2s)?;
    let u = run(&m.up, &h2, &h2s)?;
    let act: Vec<f32> = g
        .iter()
        .zip(&u)
        .map(|(&g, &u)| g / (1.0 + (-g).exp()) * u)
        .collect();
    let down = run(&m.down, &act, &alone(&act))?;
    s.shared_quantizations += hs.quantizations() + h2s.quantizations();
    Ok(x1.iter().zip(&down).map(|(a, b)| a + b).collect())
}

fn main() -> Result<(), Error> {
    let mut args = std::env::args().skip(1);
    let mut path = None;
    let mut block = 0usize;
    let mut backend = Backend::best_host();
    while let Some(a) = args.next() {
        match a.as_str() {
            "--block" => block = args.next().ok_or("--block N")?.parse()?,
            "--backend" => backend = args.next().ok_or("--backend NAME")?.parse()?,
            p if path.is_none() => path = Some(p.to_string()),
            other => return Err(format!("unexpected argument `{other}`").into()),
        }
    }
    let path = path.ok_or(
        "usage: gguf_layer MODEL.gguf [--block N] [--backend x86|host|neon|opencl] (see the example's doc comment to write one)",
    )?;
    let start = Instant::now();
    let file = ModelFile::open(&path)?;
    let d = dims(&file)?;
    println!(
        "{}: {}, {} tensors; block {block}: hidden {}, {} heads / {} KV heads × {}, feed-forward {}",
        file.path(),
        file.format_name(),
        file.tensor_count(),
        d.hidden,
        d.heads,
        d.kv_heads,
        d.head_dim,
        d.ff
    );
    let dev = Arc::new(Device::open(backend, DeviceOptions::default())?);
    let layer = |part: &str| Layer::load(&dev, &file, block, part);
    let norm = |part: &str| -> Result<Vec<f32>, Error> {
        Ok(vector(&file, &format!("blk.{block}.{part}.weight"))?.unwrap_or(vec![1.0; d.hidden]))
    };
    let model = Model {
        q: layer("attn_q")?,
        k: layer("attn_k")?,
        v: layer("attn_v")?,
        o: layer("attn_output")?,
        gate: layer("ffn_gate")?,
        up: layer("ffn_up")?,
        down: layer("ffn_down")?,
        attn_norm: norm("attn_norm")?,
        ffn_norm: norm("ffn_norm")?,
        att: Attention::new(&dev, d.heads, d.kv_heads, d.head_dim, KvFormat::F16)?,
        d,
    };
    println!(
        "device: {} backend, {} threads; loaded in {:.2?}",
        dev.backend(),
        dev.threads(),
        start.elapsed()
    );
    for l in [
        &model.q,
        &model.k,
        &model.v,
        &model.o,
        &model.gate,
        &model.up,
        &model.down,
    ] {
        let t = file.tensor(&l.name)?;
        println!(
            "  {:28} {:5} {:?} → {:6} {}",
            l.name, t.dtype, t.shape, l.loaded.format, l.loaded.conversion
        );
    }
    let mut cache = KvCache::for_device(
        &dev,
        KvFormat::F16,
        model.d.kv_heads,
        model.d.head_dim,
        KvCapacity::Chunked(64),
    )?;
    let mut r = ChaCha8Rng::seed_from_u64(7);
    let x: Vec<f32> = (0..PROMPT * model.d.hidden)
        .map(|_| r.gen_range(-1.0..1.0))
        .collect();
    let mut prefill = Stats::default();
    let mut out = step(&model, &mut cache, &x, PROMPT, &mut prefill)?;
    let mut decode = Stats::default();
    for _ in 0..DECODE_STEPS {
        let last = out[out.len() - model.d.hidden..].to_vec();
        out = step(&model, &mut cache, &last, 1, &mut decode)?;
    }
    println!(
        "prefill: {PROMPT} tokens, matmuls {:.2?}; decode: {DECODE_STEPS} steps, matmuls {:.2?} (runtime time only)",
        prefill.runtime, decode.runtime
    );
    println!(
        "the inputs of Q, K, V and of gate, up: quantized {} times for {} layer calls ({} steps)",
        prefill.shared_quantizations + decode.shared_quantizations,
        5 * (1 + DECODE_STEPS),
        1 + DECODE_STEPS
    );
    println!(
        "every matmul within its bound against the f64 oracle on the file's weights (worst error / bound {:.2})",
        prefill.worst.max(decode.worst)
    );
    Ok(())
}
