//! Timing table for the x86-avx2 kernels (not a test): every weight format ×
//! M × threads at one [N, K] shape, with a same-run read-bandwidth loop and
//! an FMA-peak loop as the references the ratios are taken against.
//!
//! `cargo run --release -p tessera-codegen --example x86_timing`
//!
//! Environment (all optional): `FORMATS=f32,f16,w8a8,w4a8` (also `q4_0`,
//! `q4_1`, `q8_0`: the library's ggml kernels),
//! `MS=1,2,4,8,16,64,512`, `THREADS=1,2`, `N=4096`, `K=4096`,
//! `ROTATE_KIB=262144` (weight copies rotated; 1 keeps two copies, hot in
//! L2 when they fit),
//! `TILES=all` (also time the solver's neighbour tiles at M ≥ 64),
//! `TILE=14x8,6x16` (time exactly these feasible tiles, ep×hp, instead),
//! `VARIANT=gemv|flat-gemm|gemm` (one variant for every M),
//! `AVX512=0|1|both` (f32 and w4a8: time the AVX2 kernel, the AVX-512
//! kernel on `x86-avx512` tiles — for w4a8 the int8 one, where the CPU has
//! AVX512-VNNI — or both in the same run; default both when the CPU has
//! AVX-512F), `AVX512_TILE=5x80,8x48` (the AVX-512 kernel's
//! tiles, as `TILE`), `AVX512_KC_BYTES=196608` (its K block, bytes of a
//! panel), `AVX512_BCST=1` (its FMAs broadcast x from memory, `{1to16}`).
//! The reference line adds a zmm FMA-peak loop on AVX-512 hosts; the
//! table gives every row against both peaks.
//!
//! Method (docs/PERFORMANCE.md, ../shared/PEERS.md): weights rotate through
//! copies totalling ≥ 256 MiB so no call is served from the last-level
//! cache; each figure is the median of ≥ 5 calls (and ≥ 0.4 s of calls),
//! also given per CPU second (/proc/self/stat) because the machine is
//! shared; the tile comes from the solver for the real M; the variant is
//! GEMV at M = 1, flat GEMM up to M = 64 (measured at least as fast as GEMM
//! there), GEMM above. M ≤ 8 is read as weight GB/s against the read loop,
//! M ≥ 16 as GFLOP/s against the FMA loop.

use std::time::{Duration, Instant};

use tessera_codegen::artifact::Variant;
use tessera_codegen::host::{HostInput, HostMatmul, HostOutput, HostTile, HostWeights, WeightsIn};
use tessera_codegen::target::TargetCaps;
use tessera_codegen::tile::{Problem, TileConfig, neighbours, solve};
use tessera_codegen::x86::avx512::{self, Avx512Spec};
use tessera_codegen::x86::{
    AVX512_NAME, PrefetchLevel, WeightPrefetch, WeightStream, X86Backend, host_has_avx512, plan,
};

const ROTATE_BYTES: usize = 256 << 20;

fn env_list(name: &str, default: &str) -> Vec<String> {
    std::env::var(name)
        .unwrap_or_else(|_| default.into())
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// CPU seconds this process has run (all threads, exited ones included),
/// from /proc/self/stat (utime + stime, 100 ticks per second); None off
/// Linux.
fn process_cpu_secs() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0)
}

/// Seconds per call of `f(i)` (i = call number) over ≥ 5 calls and ≥ 0.4 s:
/// the wall-clock median, and the CPU time per call divided by `threads`
/// (what a call costs when the machine is shared: other processes' time
/// slices do not count).
fn secs_per_call(threads: usize, mut f: impl FnMut(usize)) -> (f64, f64) {
    f(0);
    let mut times = Vec::new();
    let start = Instant::now();
    let cpu0 = process_cpu_secs();
    let mut i = 1;
    while times.len() < 5 || start.elapsed() < Duration::from_millis(400) {
        let t = Instant::now();
        f(i);
        times.push(t.elapsed().as_secs_f64());
        i += 1;
        if times.len() >= 400 {
            break;
        }
    }
    let cpu = match (cpu0, process_cpu_secs()) {
        (Some(a), Some(b)) if b > a => (b - a) / times.len() as f64 / threads as f64,
        _ => f64::NAN,
    };
    times.sort_by(|a, b| a.total_cmp(b));
    (times[times.len() / 2], cpu)
}

/// Work per second, by wall clock and by CPU time.
#[derive(Clone, Copy)]
struct Rate {
    wall: f64,
    cpu: f64,
}

impl Rate {
    fn of(work: f64, (wall, cpu): (f64, f64)) -> Rate {
        Rate {
            wall: work / wall,
            cpu: work / cpu,
        }
    }
}

/// Read bandwidth, GEMV-like: the buffer split over `threads`, each
/// thread's part read as 8 interleaved streams (8 weight rows at once) with
/// 256-bit loads into 8 accumulators. Returns GB/s.
fn read_bandwidth(buf: &[u64], threads: usize) -> Rate {
    let per = buf.len().div_ceil(threads);
    let s = secs_per_call(threads, |_| {
        let total: u64 = if threads == 1 {
            read_streams(buf)
        } else {
            std::thread::scope(|sc| {
                let hs: Vec<_> = buf
                    .chunks(per)
                    .map(|c| sc.spawn(move || read_streams(c)))
                    .collect();
                hs.into_iter()
                    .map(|h| h.join().unwrap())
                    .fold(0, u64::wrapping_add)
            })
        };
        std::hint::black_box(total);
    });
    Rate::of((buf.len() * 8) as f64 / 1e9, s)
}

#[cfg(target_arch = "x86_64")]
fn read_streams(v: &[u64]) -> u64 {
    #[target_feature(enable = "avx2")]
    fn streams(v: &[u64]) -> u64 {
        use std::arch::x86_64::*;
        let rows = v.len() / 8 / 4 * 4;
        let mut acc = [_mm256_setzero_si256(); 8];
        for i in (0..rows).step_by(4) {
            for (r, a) in acc.iter_mut().enumerate() {
                let p = v[r * rows + i..r * rows + i + 4].as_ptr() as *const __m256i;
                // SAFETY: the slice above holds these 4 u64 (32 bytes).
                *a = _mm256_add_epi64(*a, unsafe { _mm256_loadu_si256(p) });
            }
        }
        let mut out = [0u64; 4];
        let mut s = acc[0];
        for a in &acc[1..] {
            s = _mm256_add_epi64(s, *a);
        }
        // SAFETY: out holds 4 u64.
        unsafe { _mm256_storeu_si256(out.as_mut_ptr() as *mut __m256i, s) };
        out.iter().fold(0, |x, y| x.wrapping_add(*y))
    }
    // SAFETY: main() checked AVX2 through X86Backend::detect.
    unsafe { streams(v) }
}

#[cfg(not(target_arch = "x86_64"))]
fn read_streams(v: &[u64]) -> u64 {
    v.iter().fold(0, |x, y| x.wrapping_add(*y))
}

/// FMA peak: 10 independent ymm FMA chains per thread. GFLOP/s.
#[cfg(target_arch = "x86_64")]
fn fma_peak(threads: usize) -> Rate {
    #[target_feature(enable = "avx2,fma")]
    fn chains(iters: usize) -> f32 {
        use std::arch::x86_64::*;
        let mut acc = [_mm256_set1_ps(0.0); 10];
        let (a, b) = (_mm256_set1_ps(0.999_999), _mm256_set1_ps(1e-7));
        for _ in 0..iters {
            for v in acc.iter_mut() {
                *v = _mm256_fmadd_ps(*v, a, b);
            }
        }
        let mut out = [0f32; 8];
        let mut s = acc[0];
        for v in &acc[1..] {
            s = _mm256_add_ps(s, *v);
        }
        // SAFETY: out holds 8 f32.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), s) };
        out.iter().sum()
    }
    let iters = 20_000_000;
    let run = || {
        // SAFETY: main() checked AVX2 and FMA through X86Backend::detect.
        std::hint::black_box(unsafe { chains(iters) });
    };
    let s = secs_per_call(threads, |_| on_threads(threads, run));
    Rate::of((threads * iters * 10 * 16) as f64 / 1e9, s)
}

/// `run` on `threads` threads at once (on this one for 1).
fn on_threads(threads: usize, run: impl Fn() + Sync) {
    if threads == 1 {
        run();
    } else {
        std::thread::scope(|sc| {
            for _ in 0..threads {
                sc.spawn(&run);
            }
        });
    }
}

/// zmm FMA peak: 12 independent zmm FMA chains per thread. GFLOP/s.
#[cfg(target_arch = "x86_64")]
fn fma_peak_zmm(threads: usize) -> Rate {
    #[target_feature(enable = "avx512f")]
    fn chains(iters: usize) -> f32 {
        use std::arch::x86_64::*;
        let mut acc = [_mm512_set1_ps(0.0); 12];
        let (a, b) = (_mm512_set1_ps(0.999_999), _mm512_set1_ps(1e-7));
        for _ in 0..iters {
            for v in acc.iter_mut() {
                *v = _mm512_fmadd_ps(*v, a, b);
            }
        }
        let mut s = acc[0];
        for v in &acc[1..] {
            s = _mm512_add_ps(s, *v);
        }
        _mm512_reduce_add_ps(s)
    }
    let iters = 10_000_000;
    let run = || {
        // SAFETY: main() checked AVX-512F before calling this.
        std::hint::black_box(unsafe { chains(iters) });
    };
    let s = secs_per_call(threads, |_| on_threads(threads, run));
    Rate::of((threads * iters * 12 * 32) as f64 / 1e9, s)
}

fn kernel_name(format: &str) -> String {
    format!("matmul-{format}")
}

/// The solver's best tile for the real M (and its neighbours with `all`).
fn tiles_for(
    caps: &TargetCaps,
    tile_env: &str,
    kernel: &tessera_dsl::Kernel,
    m: usize,
    n: usize,
    k: usize,
    all: bool,
) -> Vec<TileConfig> {
    let mut problem = Problem::from_kernel(caps, kernel).unwrap();
    (problem.e, problem.h, problem.l) = (m as u64, n as u64, k as u64);
    let ranked = solve(caps, &problem).unwrap();
    if let Ok(list) = std::env::var(tile_env) {
        let want: Vec<String> = list.split(',').map(|s| s.trim().to_string()).collect();
        return ranked
            .into_iter()
            .filter(|t| want.contains(&format!("{}x{}", t.ep, t.hp)))
            .collect();
    }
    let mut out = vec![ranked[0]];
    if all {
        out.extend(neighbours(caps, &problem, &ranked[0], 3).unwrap());
    }
    out
}

fn variant_for(m: usize) -> Variant {
    if let Some(v) = std::env::var("VARIANT").ok().and_then(|v| v.parse().ok()) {
        return v;
    }
    match m {
        1 => Variant::Gemv,
        2..=64 => Variant::FlatGemm,
        _ => Variant::Gemm,
    }
}

struct Row {
    /// `f32` or `f32/avx512` (the AVX-512 kernel).
    format: String,
    m: usize,
    threads: usize,
    variant: Variant,
    tile: String,
    gbs: Rate,
    gflops: Rate,
}

#[allow(clippy::too_many_arguments)]
fn time_one(
    hm: &HostMatmul,
    format: &str,
    label: &str,
    tile: &TileConfig,
    variant: Variant,
    copies: &[HostWeights],
    x: &[f32],
    m: usize,
    threads: usize,
) -> Row {
    let w0 = &copies[0];
    let (n, k) = (w0.n, w0.k);
    let xh: Vec<half::f16> = x[..m * k].iter().map(|v| half::f16::from_f32(*v)).collect();
    let bias = vec![0.0f32; n];
    let mut y = vec![0f32; m * n];
    let mut yh = vec![half::f16::ZERO; m * n];
    let f16 = format == "f16";
    let s = secs_per_call(threads, |i| {
        let w = &copies[i % copies.len()];
        let input = if f16 {
            HostInput::F16(&xh)
        } else {
            HostInput::F32(&x[..m * k])
        };
        let out = if f16 {
            HostOutput::F16(&mut yh)
        } else {
            HostOutput::F32(&mut y)
        };
        hm.run(input, m, w, Some(&bias), out, threads).unwrap();
    });
    // Parameters are stored in the format's own precision (f16 for Q4_0).
    let bytes = (w0.codes.len() + w0.params.len()) as f64;
    Row {
        format: label.into(),
        m,
        threads,
        variant,
        tile: format!("{}x{}x{}", tile.ep, tile.hp, tile.lp),
        gbs: Rate::of(bytes / 1e9, s),
        gflops: Rate::of(2.0 * (m * n * k) as f64 / 1e9, s),
    }
}

fn main() {
    let mut backend = X86Backend::detect().expect("this example needs AVX2, FMA and F16C");
    for (var, stream) in [
        ("INT8_PREFETCH", WeightStream::Int8),
        ("FLOAT_PREFETCH", WeightStream::Float),
    ] {
        if let Ok(value) = std::env::var(var) {
            let (bytes, level) = value.split_once(':').unwrap_or((&value, "l1"));
            let level = match level {
                "l1" => PrefetchLevel::L1,
                "l2" => PrefetchLevel::L2,
                _ => panic!("{var}: bytes[:l1|l2]"),
            };
            let bytes = bytes
                .parse()
                .unwrap_or_else(|_| panic!("{var}: bytes[:l1|l2]"));
            let prefetch =
                WeightPrefetch::new(bytes, level).unwrap_or_else(|e| panic!("{var}: {e}"));
            backend = backend.with_weight_prefetch(stream, prefetch);
        }
    }
    let formats = env_list("FORMATS", "f32,f16,w8a8,w4a8");
    let ms: Vec<usize> = env_list("MS", "1,2,4,8,16,64,512")
        .iter()
        .map(|s| s.parse().expect("MS: numbers"))
        .collect();
    let threads: Vec<usize> = env_list("THREADS", "1,2")
        .iter()
        .map(|s| s.parse().expect("THREADS: numbers"))
        .collect();
    let (n, k) = (env_usize("N", 4096), env_usize("K", 4096));
    let all_tiles = std::env::var("TILES").is_ok_and(|v| v == "all");
    let avx512_on = host_has_avx512();
    let engines: Vec<bool> = match std::env::var("AVX512").as_deref() {
        Ok("0") => vec![false],
        Ok("1") => vec![true],
        _ => vec![false, true],
    }
    .into_iter()
    .filter(|&e| !e || avx512_on)
    .collect();
    let kc_bytes = env_usize("AVX512_KC_BYTES", avx512::PANEL_BLOCK_BYTES as usize) as i32;
    let bcst = std::env::var("AVX512_BCST").is_ok_and(|v| v == "1");
    println!(
        "x86_timing: N={n} K={k}, vnni={}, {} MiB of weight copies per format",
        backend.vnni,
        ROTATE_BYTES >> 20
    );

    let buf: Vec<u64> = (0..ROTATE_BYTES / 8).map(|i| i as u64).collect();
    let mut bw = Vec::new();
    let mut peak = Vec::new();
    let mut peak_zmm = Vec::new();
    for &t in &threads {
        let (b, p) = (read_bandwidth(&buf, t), fma_peak(t));
        let z = if avx512_on {
            fma_peak_zmm(t)
        } else {
            Rate {
                wall: f64::NAN,
                cpu: f64::NAN,
            }
        };
        println!(
            "reference {t}T: read {:.1} GB/s (by cpu time {:.1}), FMA peak {:.1} GFLOP/s (by cpu time {:.1}), zmm FMA peak {:.1} GFLOP/s (by cpu time {:.1})",
            b.wall, b.cpu, p.wall, p.cpu, z.wall, z.cpu
        );
        bw.push(b);
        peak.push(p);
        peak_zmm.push(z);
    }
    drop(buf);

    let w: Vec<f32> = (0..n * k)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    let max_m = ms.iter().copied().max().unwrap_or(1);
    let x: Vec<f32> = (0..max_m * k)
        .map(|i| ((i * 104729) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    let mut rows = Vec::new();
    for format in &formats {
        let kernel = tessera_dsl::library::get(&kernel_name(format)).unwrap();
        for &m in &ms {
            let variant = variant_for(m);
            let mut runs: Vec<(String, TileConfig, HostMatmul)> = Vec::new();
            for &zmm in &engines {
                let int8_family = matches!(format.as_str(), "w4a8" | "q4_0" | "q4_1" | "q8_0");
                if zmm && format != "f32" && !int8_family {
                    continue;
                }
                let (caps, tile_env) = if zmm {
                    (TargetCaps::by_name(AVX512_NAME).unwrap(), "AVX512_TILE")
                } else {
                    (plan::target(), "TILE")
                };
                for tile in tiles_for(caps, tile_env, &kernel, m, n, k, all_tiles && m >= 64) {
                    if zmm && int8_family {
                        // The AVX-512 int8 kernel, through the backend's routing.
                        if !tessera_codegen::x86::host_has_avx512_vnni()
                            || backend.emit_code_variant(&kernel, &tile, variant).is_err()
                        {
                            continue;
                        }
                        let hm = backend.load_variant(&kernel, &tile, variant).unwrap();
                        runs.push((format!("{format}/avx512"), tile, hm));
                    } else if zmm {
                        let mut spec = Avx512Spec::new(
                            tile.ep as usize,
                            tile.hp as usize,
                            true,
                            tessera_dsl::ir::Activation::None,
                        );
                        spec.panel_block_bytes = kc_bytes;
                        spec.embedded_broadcast = bcst;
                        let Ok(code) = avx512::emit_variant_prefetching(
                            &spec,
                            variant,
                            backend.float_prefetch,
                        ) else {
                            continue;
                        };
                        let hm =
                            HostMatmul::new(&kernel, HostTile::from(&tile), None, &code).unwrap();
                        runs.push((format!("{format}/avx512"), tile, hm));
                    } else {
                        if backend.emit_code_variant(&kernel, &tile, variant).is_err() {
                            continue;
                        }
                        let hm = backend.load_variant(&kernel, &tile, variant).unwrap();
                        runs.push((format.clone(), tile, hm));
                    }
                }
            }
            for (label, tile, hm) in &runs {
                let tile = *tile;
                let first = hm.pack_weights(n, k, WeightsIn::F32(&w)).unwrap();
                let bytes = first.codes.len() + first.params.len();
                let rotate = env_usize("ROTATE_KIB", ROTATE_BYTES >> 10) << 10;
                let count = rotate.div_ceil(bytes).max(2);
                let copies: Vec<HostWeights> = (0..count).map(|_| first.clone()).collect();
                for (ti, &t) in threads.iter().enumerate() {
                    std::thread::sleep(Duration::from_millis(150));
                    let r = time_one(hm, format, label, &tile, variant, &copies, &x, m, t);
                    println!(
                        "{:10} M={:4} {}T {:9} tile {:7}: {:7.2} GB/s ({:5.1}% of read) {:7.1} GFLOP/s ({:5.1}% of peak, {:5.1}% of zmm peak); by cpu time {:5.1}% of read, {:5.1}% of peak",
                        r.format,
                        r.m,
                        r.threads,
                        r.variant.to_string(),
                        r.tile,
                        r.gbs.wall,
                        100.0 * r.gbs.wall / bw[ti].wall,
                        r.gflops.wall,
                        100.0 * r.gflops.wall / peak[ti].wall,
                        100.0 * r.gflops.wall / peak_zmm[ti].wall,
                        100.0 * r.gbs.cpu / bw[ti].cpu,
                        100.0 * r.gflops.cpu / peak[ti].cpu
                    );
                    rows.push(r);
                }
            }
        }
    }
    println!(
        "\n| format | M | threads | variant | tile | weight GB/s | % read bw | GFLOP/s | % FMA peak | % zmm FMA peak | cpu-time % read bw | cpu-time % FMA peak |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in &rows {
        let ti = threads.iter().position(|t| *t == r.threads).unwrap();
        println!(
            "| {} | {} | {} | {} | {} | {:.2} | {:.0}% | {:.1} | {:.0}% | {:.0}% | {:.0}% | {:.0}% |",
            r.format,
            r.m,
            r.threads,
            r.variant,
            r.tile,
            r.gbs.wall,
            100.0 * r.gbs.wall / bw[ti].wall,
            r.gflops.wall,
            100.0 * r.gflops.wall / peak[ti].wall,
            100.0 * r.gflops.wall / peak_zmm[ti].wall,
            100.0 * r.gbs.cpu / bw[ti].cpu,
            100.0 * r.gflops.cpu / peak[ti].cpu
        );
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn fma_peak_zmm(_threads: usize) -> Rate {
    Rate {
        wall: f64::NAN,
        cpu: f64::NAN,
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn fma_peak(_threads: usize) -> Rate {
    Rate {
        wall: f64::NAN,
        cpu: f64::NAN,
    }
}
