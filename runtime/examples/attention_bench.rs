//! Decode attention on a host device, timed against this machine's read
//! bandwidth in the same run: what fraction of the bound a decode step
//! reaches at each context length.
//!
//! `cargo run --release -p tessera-runtime --example attention_bench --
//! [--backend x86|host|neon] [--threads 1,2] [--ctx 4096,32768]
//! [--model llama2-7b|qwen2-1.5b] [--heads HQ/KVH] [--format f16|kv8] [--hot]
//! [--record FILE]`
//!
//! Heads: Llama2-7B (32 query / 32 KV heads × 128) and Qwen2-1.5B (12 / 2 ×
//! 128); caches f16 and kv8 (int8 keys, fp8 values). Each line: µs per
//! decode step (median of blocks), GB/s of KV bytes read, and that as a
//! share of the read probe over 1 GiB measured just before: the GEMV-like
//! loop of `tessera_runtime::read_probe`, the one `tessera-bench` divides
//! by. Enough cache copies are rotated that every step reads DRAM.
//! With `--record` (a `tessera-autotune` record of this machine), kv8
//! lines run the fp8 values' P·V form it measured faster for the heads,
//! and say which: the packed form (`f16` FMAs or `bf16` dots, as the CPU
//! has them) or `fma`; on x86, grouped-query kv8 lines also name how the
//! int8 keys are scored (`AMX tdpbssd`, `zmm vpdpwssd`, ...).

use std::sync::Arc;
use std::time::Instant;

use half::f16;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tessera_runtime::read_probe::{BANDWIDTH_ROW, gemv_read};
use tessera_runtime::{Attention, Backend, Device, DeviceOptions, KvCache, KvCapacity, KvFormat};

type Error = Box<dyn std::error::Error>;

/// Bytes of KV one decode step reads (codes plus per-row parameters).
fn kv_bytes(format: KvFormat, s: usize, kvh: usize, d: usize) -> usize {
    let rows = s * kvh;
    match format {
        KvFormat::F16 => 2 * rows * d * 2,
        KvFormat::Kv8 => 2 * rows * d + rows * 8,
    }
}

/// GB/s of the read probe over `buf` (rows of `BANDWIDTH_ROW`) on
/// `threads` threads, best of 5.
fn read_bandwidth(buf: &[f32], threads: usize) -> f64 {
    let x = vec![1.0f32; BANDWIDTH_ROW];
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let t0 = Instant::now();
        std::hint::black_box(gemv_read(buf, &x, threads));
        best = best.min(t0.elapsed().as_secs_f64());
    }
    (buf.len() * 4) as f64 / best / 1e9
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

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().collect();
    let backend = match args.iter().position(|a| a == "--backend") {
        Some(i) => args.get(i + 1).ok_or("--backend needs a value")?.parse()?,
        None => Backend::best_host(),
    };
    let threads = list(&args, "--threads", &[1, 2])?;
    let contexts = list(&args, "--ctx", &[4096, 32768])?;
    let only = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let (model, kv_format) = (only("--model"), only("--format"));
    let mut heads: Vec<(&str, usize, usize)> =
        [("llama2-7b", 32usize, 32usize), ("qwen2-1.5b", 12, 2)]
            .into_iter()
            .filter(|(name, _, _)| model.as_deref().is_none_or(|m| m == *name))
            .collect();
    // `--heads HQ/KVH`: another head layout, in place of the models'.
    if let Some(h) = only("--heads") {
        let (hq, kvh) = h.split_once('/').ok_or("--heads takes HQ/KVH")?;
        heads = vec![("custom", hq.parse()?, kvh.parse()?)];
    }
    let record = only("--record")
        .map(|path| tessera_runtime::record::TuningRecord::load(std::path::Path::new(&path)))
        .transpose()?;
    let d = 128;
    // One cache, read again every step: the kernel's speed with the KV in
    // the caches, what the DRAM-bound figure is set against.
    let hot = args.iter().any(|a| a == "--hot");
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let big: Vec<f32> = (0..1usize << 28).map(|i| (i % 7) as f32).collect();
    for &t in &threads {
        let dev = Arc::new(Device::open(
            backend,
            DeviceOptions {
                threads: Some(t),
                record: record.clone(),
                ..Default::default()
            },
        )?);
        let bw = read_bandwidth(&big, t);
        println!("{backend:?}, {t} thread(s): read probe {bw:.1} GB/s");
        for &(name, hq, kvh) in &heads {
            for format in [KvFormat::F16, KvFormat::Kv8].into_iter().filter(|f| {
                kv_format
                    .as_deref()
                    .is_none_or(|k| k.eq_ignore_ascii_case(&format!("{f:?}")))
            }) {
                for &s in &contexts {
                    let bytes = kv_bytes(format, s, kvh, d);
                    // At least 1 GiB of caches in rotation.
                    let copies = if hot {
                        1
                    } else {
                        (1usize << 30).div_ceil(bytes).clamp(2, 64)
                    };
                    let att = Attention::new(&dev, hq, kvh, d, format)?;
                    let mut caches = Vec::new();
                    for _ in 0..copies {
                        let mut c = KvCache::new(format, kvh, d, KvCapacity::Max(s))?;
                        let k: Vec<f32> =
                            (0..s * kvh * d).map(|_| rng.gen_range(-1.0..1.0)).collect();
                        c.append(&k, &k, s)?;
                        caches.push(c);
                    }
                    let q: Vec<f16> = (0..hq * d)
                        .map(|_| f16::from_f32(rng.gen_range(-0.1..0.1)))
                        .collect();
                    let mut o = vec![f16::ZERO; hq * d];
                    // Steps per block: every copy once, or the one hot copy 16 times.
                    let steps = if hot { 16 } else { copies };
                    let mut blocks = Vec::new();
                    for _ in 0..5 {
                        let t0 = Instant::now();
                        for c in caches.iter().cycle().take(steps) {
                            att.decode(&q, c, &mut o)?;
                        }
                        blocks.push(t0.elapsed().as_secs_f64() / steps as f64);
                    }
                    blocks.sort_by(f64::total_cmp);
                    let step = blocks[blocks.len() / 2];
                    let gbs = bytes as f64 / step / 1e9;
                    let keys = match dev.int8_key_form(hq, kvh, d) {
                        Some(form) if hq > kvh => format!("; keys by {form}"),
                        _ => String::new(),
                    };
                    let pv = match format {
                        KvFormat::Kv8 if dev.fp8_values_packed(hq, kvh, d) => {
                            let packed = dev.packed_fp8_form().unwrap_or("packed");
                            format!("  ({packed}{keys})")
                        }
                        KvFormat::Kv8 => format!("  (fma{keys})"),
                        _ => String::new(),
                    };
                    println!(
                        "  {name:<10} {format:?} ctx {s:>6}: {:>9.1} µs  {gbs:>5.1} GB/s  {:>3.0}% of the probe{pv}",
                        step * 1e6,
                        100.0 * gbs / bw
                    );
                }
            }
        }
    }
    Ok(())
}
