//! Causal prefill attention on the x86 device (`Attention::prefill`, its
//! whole-prefill kernel on the device's pool), timed against this
//! machine's FMA peak in the same run and against the per-token paths: the
//! x86 decode kernel once per prompt token over its prefix, and the
//! cranelift device's prefill (its decode kernel per token, what the x86
//! runtime ran before it had an x86 attention kernel).
//!
//! `cargo run --release -p tessera-runtime --example prefill_bench --
//! [--threads 1,2] [--seq 128,512,2048] [--model llama2-7b|qwen2-1.5b]
//! [--format f16|kv8] [--per-token-max 512] [--blocks 48x128,96x128,...]`
//!
//! With `--blocks`, it times the x86 prefill kernel emitted in each of the
//! given blocks (query rows × keys) instead, side by side with the
//! default blocks in the same run (`HostAttention::prefill`, scoped
//! threads for every candidate alike).
//!
//! Prompts of s tokens with no earlier context (p = 0, the causal square),
//! heads of Llama2-7B (32 / 32 × 128) and Qwen2-1.5B (12 / 2 × 128). Each
//! line: ms per call (median of at least 5 and 0.5 s), GFLOP/s of the
//! causal work (4·hq·d per visible query–key pair: QKᵀ and P·V), that as a
//! share of the widest FMA loop (zmm with AVX-512) on as many threads
//! measured just before, and each
//! per-token path's time and its ratio to the prefill's.

use std::sync::Arc;
use std::time::Instant;

use half::f16;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tessera_codegen::artifact::PrefillBlocks;
use tessera_codegen::host_attention::HostAttention;
use tessera_dsl::library;
use tessera_runtime::{Attention, Backend, Device, DeviceOptions, KvCache, KvCapacity, KvFormat};

type Error = Box<dyn std::error::Error>;

/// The machine's FMA peak on `threads` threads, GFLOP/s: the 16-lane
/// loop's where the CPU has AVX-512 (a zmm FMA is twice a ymm one on Zen 5
/// and the server Xeons, the same on Zen 4), else the 8-lane loop's; and
/// the name of the one used.
fn fma_peak(threads: usize) -> (f64, &'static str) {
    let ymm = fma_peak_ymm(threads);
    let zmm = fma_peak_zmm(threads);
    if zmm > ymm {
        (zmm, "zmm")
    } else {
        (ymm, "ymm")
    }
}

/// Runs `chains` (a thread's share) on `threads` threads, best of 5, as
/// GFLOP/s for `flops` per call.
fn best_rate(threads: usize, flops: usize, chains: &(dyn Fn() -> f32 + Sync)) -> f64 {
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let t0 = Instant::now();
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| std::hint::black_box(chains()));
            }
        });
        best = best.min(t0.elapsed().as_secs_f64());
    }
    (threads * flops) as f64 / best / 1e9
}

/// GFLOP/s of independent 16-lane FMAs (12 chains a thread); 0 without
/// AVX-512F.
fn fma_peak_zmm(threads: usize) -> f64 {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::*;
        if !std::arch::is_x86_feature_detected!("avx512f") {
            return 0.0;
        }
        #[target_feature(enable = "avx512f")]
        unsafe fn chains(iters: usize) -> f32 {
            let (m, c) = (_mm512_set1_ps(0.999_999), _mm512_set1_ps(1e-7));
            let mut acc = [_mm512_set1_ps(1.0); 12];
            for _ in 0..iters {
                for a in acc.iter_mut() {
                    *a = _mm512_fmadd_ps(*a, m, c);
                }
            }
            let mut t = acc[0];
            for a in &acc[1..] {
                t = _mm512_add_ps(t, *a);
            }
            _mm512_reduce_add_ps(t)
        }
        let iters = 10_000_000;
        // SAFETY: AVX-512F was detected just above.
        best_rate(threads, iters * 12 * 32, &|| unsafe { chains(iters) })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = threads;
        0.0
    }
}

/// GFLOP/s of independent 8-lane FMAs on `threads` threads (12 chains
/// each, enough to cover the FMA latency on every x86 core), best of 5.
fn fma_peak_ymm(threads: usize) -> f64 {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::*;
        #[target_feature(enable = "avx,fma")]
        unsafe fn chains(iters: usize) -> f32 {
            let (m, c) = (_mm256_set1_ps(0.999_999), _mm256_set1_ps(1e-7));
            let mut acc = [_mm256_set1_ps(1.0); 12];
            for _ in 0..iters {
                for a in acc.iter_mut() {
                    *a = _mm256_fmadd_ps(*a, m, c);
                }
            }
            let mut s = [0f32; 8];
            let mut t = acc[0];
            for a in &acc[1..] {
                t = _mm256_add_ps(t, *a);
            }
            // SAFETY: `s` holds 8 f32.
            unsafe { _mm256_storeu_ps(s.as_mut_ptr(), t) };
            s.iter().sum()
        }
        let iters = 20_000_000;
        // SAFETY: the caller checked AVX and FMA (main).
        best_rate(threads, iters * 12 * 16, &|| unsafe { chains(iters) })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = threads;
        f64::NAN
    }
}

fn list(args: &[String], flag: &str, default: &[usize]) -> Result<Vec<usize>, Error> {
    match args.iter().position(|a| a == flag) {
        None => Ok(default.to_vec()),
        Some(i) => {
            let v = args.get(i + 1).ok_or(format!("{flag} needs a value"))?;
            Ok(v.split(',').map(str::parse).collect::<Result<_, _>>()?)
        }
    }
}

fn value<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}

/// Median seconds of `f` over at least 5 calls and 0.5 s (one warm-up).
fn time(mut f: impl FnMut() -> Result<(), Error>) -> Result<f64, Error> {
    f()?;
    let (mut times, start) = (Vec::new(), Instant::now());
    while times.len() < 5 || start.elapsed().as_secs_f64() < 0.5 {
        let t0 = Instant::now();
        f()?;
        times.push(t0.elapsed().as_secs_f64());
        if times.len() >= 200 {
            break;
        }
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

fn main() -> Result<(), Error> {
    if !tessera_codegen::x86::missing_features().is_empty() {
        return Err("this bench needs x86 with AVX2, FMA and F16C".into());
    }
    let args: Vec<String> = std::env::args().collect();
    let threads = list(&args, "--threads", &[1, 2])?;
    let seqs = list(&args, "--seq", &[128, 512, 2048])?;
    let per_token_max = list(&args, "--per-token-max", &[512])?[0];
    let models: Vec<(&str, usize, usize)> = match value(&args, "--model") {
        None => vec![("llama2-7b", 32, 32), ("qwen2-1.5b", 12, 2)],
        Some("llama2-7b") => vec![("llama2-7b", 32, 32)],
        Some("qwen2-1.5b") => vec![("qwen2-1.5b", 12, 2)],
        Some(m) => return Err(format!("unknown --model {m}").into()),
    };
    let formats: Vec<KvFormat> = match value(&args, "--format") {
        None => vec![KvFormat::F16, KvFormat::Kv8],
        Some("f16") => vec![KvFormat::F16],
        Some("kv8") => vec![KvFormat::Kv8],
        Some(f) => return Err(format!("unknown --format {f}").into()),
    };
    let d = 128;
    println!("CPU: {}", cpu_name());
    if let Some(spec) = value(&args, "--blocks") {
        let blocks = spec
            .split(',')
            .map(|b| {
                let (r, k) = b.split_once('x').ok_or(format!("--blocks {b}: RxC"))?;
                Ok(PrefillBlocks {
                    rows: r.parse()?,
                    keys: k.parse()?,
                })
            })
            .collect::<Result<Vec<_>, Error>>()?;
        return sweep_blocks(&blocks, &threads, &seqs, &models, &formats, d);
    }
    println!(
        "{:<11} {:>4} {:>5} {:>2} {:>10} {:>8} {:>6} {:>11} {:>6} {:>11} {:>6}",
        "model",
        "kv",
        "s",
        "T",
        "prefill ms",
        "GFLOP/s",
        "%peak",
        "x86/tok ms",
        "ratio",
        "clif/tok ms",
        "ratio"
    );
    for &t in &threads {
        let (peak, width) = fma_peak(t);
        let open = |backend| -> Result<Arc<Device>, Error> {
            let options = DeviceOptions {
                threads: Some(t),
                ..Default::default()
            };
            Ok(Arc::new(Device::open(backend, options)?))
        };
        let (x86, clif) = (open(Backend::HostX86)?, open(Backend::HostClif)?);
        println!("{t} thread(s): FMA peak {peak:.1} GFLOP/s ({width})");
        for &(model, hq, kvh) in &models {
            for &format in &formats {
                // The per-token path on x86: its decode kernel once per token.
                let kernel = library::get(format.kernel_name())?;
                let code = tessera_codegen::x86::attention::emit(&kernel)?;
                let per_token = HostAttention::new(&kernel, &code)?;
                let whole = Attention::new(&x86, hq, kvh, d, format)?;
                if !whole.prefills_whole() {
                    return Err("the x86 device has no whole-prefill kernel".into());
                }
                let on_clif = Attention::new(&clif, hq, kvh, d, format)?;
                for &s in &seqs {
                    let (q, cache) = inputs(s, hq, kvh, d, format)?;
                    let mut o = vec![f16::ZERO; s * hq * d];
                    let flops = 4.0 * (hq * d) as f64 * (s * (s + 1) / 2) as f64;
                    let secs = time(|| {
                        whole.prefill(&q, s, &cache, &mut o)?;
                        Ok(())
                    })?;
                    let gf = flops / secs / 1e9;
                    let (mut x86_tok, mut clif_tok) = (String::from("-"), String::from("-"));
                    let (mut x86_ratio, mut clif_ratio) = (String::from("-"), String::from("-"));
                    if s <= per_token_max {
                        let (k, v) = cache.views(s).ok_or("cache not on the host")?;
                        let p = time(|| {
                            per_token.prefill(&q, k, v, s, s, hq, kvh, d, &mut o, t)?;
                            Ok(())
                        })?;
                        x86_tok = format!("{:.2}", p * 1e3);
                        x86_ratio = format!("{:.1}×", p / secs);
                        let c = time(|| {
                            on_clif.prefill(&q, s, &cache, &mut o)?;
                            Ok(())
                        })?;
                        clif_tok = format!("{:.2}", c * 1e3);
                        clif_ratio = format!("{:.1}×", c / secs);
                    }
                    let kv_name = format!("{format:?}").to_lowercase();
                    println!(
                        "{model:<11} {kv_name:>4} {s:>5} {t:>2} {:>10.2} {gf:>8.1} {:>5.0}% {x86_tok:>11} {x86_ratio:>6} {clif_tok:>11} {clif_ratio:>6}",
                        secs * 1e3,
                        100.0 * gf / peak
                    );
                }
            }
        }
    }
    Ok(())
}

/// A prompt of `s` tokens (q, f16 `[s, hq, d]`) and a cache of its `s`
/// keys and values in `format`, random from the seed `s`.
fn inputs(
    s: usize,
    hq: usize,
    kvh: usize,
    d: usize,
    format: KvFormat,
) -> Result<(Vec<f16>, KvCache), Error> {
    let mut rng = ChaCha8Rng::seed_from_u64(s as u64);
    let q: Vec<f16> = (0..s * hq * d)
        .map(|_| f16::from_f32(rng.gen_range(-0.5..0.5)))
        .collect();
    let kv: Vec<f32> = (0..s * kvh * d).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let mut cache = KvCache::new(format, kvh, d, KvCapacity::Max(s))?;
    cache.append(&kv, &kv, s)?;
    Ok((q, cache))
}

/// Each of `blocks` against the default blocks, same run: ms per call
/// (median, as [`time`]) and the ratio default ÷ candidate (above 1: the
/// candidate is faster).
fn sweep_blocks(
    blocks: &[PrefillBlocks],
    threads: &[usize],
    seqs: &[usize],
    models: &[(&str, usize, usize)],
    formats: &[KvFormat],
    d: usize,
) -> Result<(), Error> {
    println!(
        "{:<11} {:>4} {:>5} {:>2} {:>9} {:>10} {:>8}",
        "model", "kv", "s", "T", "blocks", "ms", "vs dflt"
    );
    for &t in threads {
        for &(model, hq, kvh) in models {
            for &format in formats {
                let kernel = library::get(format.prefill_kernel_name())?;
                let mut runs = Vec::new();
                for &b in std::iter::once(&PrefillBlocks::DEFAULT).chain(blocks) {
                    let code = tessera_codegen::x86::attention::emit_with(&kernel, b)?;
                    runs.push((b, HostAttention::new(&kernel, &code)?));
                }
                for &s in seqs {
                    let (q, cache) = inputs(s, hq, kvh, d, format)?;
                    let (k, v) = cache.views(s).ok_or("cache not on the host")?;
                    let mut o = vec![f16::ZERO; s * hq * d];
                    let mut default_secs = f64::NAN;
                    for (i, (b, att)) in runs.iter().enumerate() {
                        let secs = time(|| {
                            att.prefill(&q, k, v, s, s, hq, kvh, d, &mut o, t)?;
                            Ok(())
                        })?;
                        if i == 0 {
                            default_secs = secs;
                        }
                        let kv_name = format!("{format:?}").to_lowercase();
                        println!(
                            "{model:<11} {kv_name:>4} {s:>5} {t:>2} {:>9} {:>10.2} {:>7.2}×",
                            b.to_string(),
                            secs * 1e3,
                            default_secs / secs
                        );
                    }
                }
            }
        }
    }
    Ok(())
}

fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}
