//! The device's own limits, measured before any kernel so every result
//! prints as a fraction of the roofline: streaming read bandwidth (a
//! STREAM-like read of a buffer four times the last-level cache) and the
//! peak multiply-accumulate rate of the instruction the chosen path uses
//! (a register-resident loop of independent chains). Per core cluster, the
//! relative single-core MAC rate gives the work split's core weights.

use std::hint::black_box;
use std::time::{Duration, Instant};

use tessera_runtime::device::Fingerprint;
use tessera_runtime::record::Limits;

/// Which MAC instruction the peak loop runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MacPath {
    /// f32 fused multiply-add over `bits`-wide vectors.
    Fma { bits: u32 },
    /// u8·s8 → i32 dot steps (`vpmaddubsw` + `vpmaddwd` on x86).
    Int8 { bits: u32 },
}

impl MacPath {
    pub fn describe(self) -> String {
        match self {
            MacPath::Fma { bits } => format!("f32 FMA, {bits}-bit"),
            MacPath::Int8 { bits } => format!("u8·s8 dot, {bits}-bit"),
        }
    }
}

/// The last-level cache in bytes (0 when unknown).
pub fn llc_bytes(fp: &Fingerprint) -> u64 {
    fp.caches
        .iter()
        .map(|c| c.size_kib * 1024)
        .max()
        .unwrap_or(0)
}

/// Streaming read bandwidth with `threads` threads, GB/s. Each thread
/// reads its part of a buffer of `bytes` in 1 MiB chunks, `passes` times,
/// timing every chunk; the result is the sum over threads of each
/// thread's median chunk rate. Short timed chunks with a median make the
/// figure robust on a shared machine (a chunk rarely straddles a
/// preemption), like the kernel timings it is compared with.
pub fn read_bandwidth(bytes: usize, threads: usize, passes: usize) -> f64 {
    const CHUNK_WORDS: usize = (1 << 20) / 8;
    let words = (bytes / 8).max(4 * CHUNK_WORDS);
    let buf: Vec<u64> = (0..words as u64).collect();
    let threads = threads.max(1);
    let part = words.div_ceil(threads);
    std::thread::scope(|s| {
        let handles: Vec<_> = buf
            .chunks(part)
            .map(|mine| {
                s.spawn(move || {
                    let mut rates = Vec::new();
                    for _ in 0..passes.max(1) {
                        for chunk in mine.chunks(CHUNK_WORDS) {
                            let t0 = Instant::now();
                            black_box(sum_words(black_box(chunk)));
                            let secs = t0.elapsed().as_secs_f64().max(1e-9);
                            rates.push((chunk.len() * 8) as f64 / secs / 1e9);
                        }
                    }
                    crate::stats::median(&rates).unwrap_or(0.0)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or(0.0)).sum()
    })
}

/// Eight independent accumulators, so the loop is bound by loads.
fn sum_words(v: &[u64]) -> u64 {
    let mut acc = [0u64; 8];
    let chunks = v.chunks_exact(8);
    let tail: u64 = chunks
        .remainder()
        .iter()
        .copied()
        .fold(0, u64::wrapping_add);
    for c in chunks {
        for i in 0..8 {
            acc[i] = acc[i].wrapping_add(c[i]);
        }
    }
    acc.iter().copied().fold(tail, u64::wrapping_add)
}

/// Peak MAC rate of `path` on `threads` threads, GMAC/s: every thread
/// times chunks of about 100 µs of the loop for `duration`; the sum over
/// threads of each thread's median chunk rate (see [`read_bandwidth`]).
pub fn peak_macs(path: MacPath, threads: usize, duration: Duration) -> f64 {
    let threads = threads.max(1);
    // Calibrate one chunk to about 100 µs (the fastest of a few tries).
    let mut iters = 1u64 << 8;
    loop {
        let fastest = (0..3)
            .map(|_| {
                let t0 = Instant::now();
                black_box(mac_loop(path, iters));
                t0.elapsed()
            })
            .min()
            .unwrap_or_default();
        if fastest >= Duration::from_micros(100) || iters >= 1 << 32 {
            break;
        }
        iters *= 2;
    }
    let chunks = (duration.as_micros() / 100).clamp(8, 10_000) as usize;
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(move || {
                    let rates: Vec<f64> = (0..chunks)
                        .map(|_| {
                            let t0 = Instant::now();
                            let (_, macs) = black_box(mac_loop(path, iters));
                            macs / t0.elapsed().as_secs_f64().max(1e-9) / 1e9
                        })
                        .collect();
                    crate::stats::median(&rates).unwrap_or(0.0)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or(0.0)).sum()
    })
}

/// Run the loop; returns a value to keep it alive and the MACs done.
fn mac_loop(path: MacPath, iters: u64) -> (f32, f64) {
    #[cfg(target_arch = "x86_64")]
    {
        let avx2 = std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma");
        let avx512 = std::arch::is_x86_feature_detected!("avx512f");
        match path {
            MacPath::Fma { bits: 512 } if avx512 => {
                // SAFETY: AVX-512F was detected on this CPU just above.
                return (unsafe { x86::fma512(iters) }, (iters * 12 * 16) as f64);
            }
            MacPath::Fma { bits: 256 | 512 } if avx2 => {
                // SAFETY: AVX2 and FMA were detected on this CPU just above.
                return (unsafe { x86::fma256(iters) }, (iters * 12 * 8) as f64);
            }
            MacPath::Int8 { bits: 256 } if avx2 => {
                // SAFETY: AVX2 was detected on this CPU just above.
                return (unsafe { x86::dot256(iters) }, (iters * 10 * 32) as f64);
            }
            MacPath::Fma { .. } => {
                // SAFETY: SSE2 is baseline on x86-64.
                return (unsafe { x86::mul_add128(iters) }, (iters * 12 * 4) as f64);
            }
            MacPath::Int8 { .. } => {
                // SAFETY: SSE2 is baseline on x86-64.
                return (unsafe { x86::madd128(iters) }, (iters * 8 * 8) as f64);
            }
        }
    }
    #[allow(unreachable_code)]
    {
        let _ = path;
        portable(iters)
    }
}

/// Twelve independent f32x4 multiply-add chains in plain Rust (other
/// architectures: the compiler vectorizes it to the base SIMD width).
#[allow(dead_code)]
fn portable(iters: u64) -> (f32, f64) {
    let mut acc = [[0.5f32; 4]; 12];
    let a = black_box([1.000_001f32; 4]);
    let b = black_box([0.999_999f32; 4]);
    for _ in 0..iters {
        for chain in &mut acc {
            for l in 0..4 {
                chain[l] = chain[l].mul_add(a[l], b[l]);
            }
        }
    }
    let s: f32 = acc.iter().flatten().sum();
    (s, (iters * 12 * 4) as f64)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// 12 chains of `vfmadd231ps ymm` (2 FMA ports × 4-cycle latency need
    /// at least 8 in flight).
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn fma256(iters: u64) -> f32 {
        let a = _mm256_set1_ps(1.000_001);
        let b = _mm256_set1_ps(0.999_999);
        let mut acc = [_mm256_set1_ps(0.5); 12];
        for _ in 0..iters {
            for c in &mut acc {
                *c = _mm256_fmadd_ps(*c, a, b);
            }
        }
        let mut s = _mm256_setzero_ps();
        for c in acc {
            s = _mm256_add_ps(s, c);
        }
        let mut out = [0f32; 8];
        // SAFETY: `out` holds 8 f32; unaligned store.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), s) };
        out.iter().sum()
    }

    /// 12 chains of `vfmadd231ps zmm`: the peak the AVX-512 f32 kernel
    /// (`x86-avx512` tiles) is measured against.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn fma512(iters: u64) -> f32 {
        let a = _mm512_set1_ps(1.000_001);
        let b = _mm512_set1_ps(0.999_999);
        let mut acc = [_mm512_set1_ps(0.5); 12];
        for _ in 0..iters {
            for c in &mut acc {
                *c = _mm512_fmadd_ps(*c, a, b);
            }
        }
        let mut s = _mm512_setzero_ps();
        for c in acc {
            s = _mm512_add_ps(s, c);
        }
        _mm512_reduce_add_ps(s)
    }

    /// 10 chains of `vpmaddubsw` + `vpmaddwd` + `vpaddd` (32 u8·s8 MACs
    /// per step), the W4A8/W8A8 x86 path.
    #[target_feature(enable = "avx2")]
    pub unsafe fn dot256(iters: u64) -> f32 {
        let a = _mm256_set1_epi8(3);
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_set1_epi8(1); 10];
        for _ in 0..iters {
            for c in &mut acc {
                // The accumulator is also the s8 operand, so nothing is
                // loop-invariant (values wrap; only the timing matters).
                let p = _mm256_maddubs_epi16(a, *c);
                *c = _mm256_add_epi32(*c, _mm256_madd_epi16(p, ones));
            }
        }
        let mut s = _mm256_setzero_si256();
        for c in acc {
            s = _mm256_add_epi32(s, c);
        }
        _mm256_extract_epi32::<0>(s) as f32
    }

    /// 12 chains of 128-bit multiply then add (what cranelift emits where
    /// it cannot fuse; an upper bound for the 128-bit host path either way).
    #[target_feature(enable = "sse2")]
    pub unsafe fn mul_add128(iters: u64) -> f32 {
        let a = _mm_set1_ps(1.000_001);
        let b = _mm_set1_ps(0.999_999);
        let mut acc = [_mm_set1_ps(0.5); 12];
        for _ in 0..iters {
            for c in &mut acc {
                *c = _mm_add_ps(_mm_mul_ps(*c, a), b);
            }
        }
        let mut s = _mm_setzero_ps();
        for c in acc {
            s = _mm_add_ps(s, c);
        }
        _mm_cvtss_f32(s)
    }

    /// 8 chains of 128-bit `pmaddwd` + `paddd` (8 i16 MACs per step: the
    /// cranelift int8 path widens to i16 first).
    #[target_feature(enable = "sse2")]
    pub unsafe fn madd128(iters: u64) -> f32 {
        let a = _mm_set1_epi16(3);
        let mut acc = [_mm_set1_epi16(1); 8];
        for _ in 0..iters {
            for c in &mut acc {
                *c = _mm_add_epi32(*c, _mm_madd_epi16(a, *c));
            }
        }
        let mut s = _mm_setzero_si128();
        for c in acc {
            s = _mm_add_epi32(s, c);
        }
        _mm_cvtsi128_si32(s) as f32
    }
}

/// Read bandwidth and peak MAC rate on `threads` threads.
pub fn measure(fp: &Fingerprint, path: MacPath, threads: usize, quick: bool) -> Limits {
    let bytes = crate::bench::rotation_bytes(llc_bytes(fp));
    let bytes = if quick { bytes / 4 } else { bytes };
    let passes = if quick { 1 } else { 2 };
    let dur = Duration::from_millis(if quick { 20 } else { 80 });
    Limits {
        read_gbps: read_bandwidth(bytes, threads, passes),
        mac_gops: peak_macs(path, threads, dur),
    }
}

/// Relative single-core throughput per logical CPU (index = CPU number),
/// the fastest cluster 1.0. One cluster: all 1.0 by definition. Several:
/// the peak loop pinned to each cluster's first CPU (Linux); where pinning
/// is not possible, equal weights.
pub fn core_weights(fp: &Fingerprint, path: MacPath) -> Vec<f64> {
    let cpus = fp.logical_cpus.max(1) as usize;
    let mut weights = vec![1.0; cpus];
    if fp.clusters.len() < 2 {
        return weights;
    }
    let mut rates = Vec::new();
    for cluster in &fp.clusters {
        let Some(&cpu) = cluster.cpus.first() else {
            rates.push(0.0);
            continue;
        };
        let rate = std::thread::scope(|s| {
            s.spawn(move || {
                if pin_to(cpu) {
                    peak_macs(path, 1, Duration::from_millis(30))
                } else {
                    0.0
                }
            })
            .join()
            .unwrap_or(0.0)
        });
        rates.push(rate);
    }
    let best = rates.iter().copied().fold(0.0, f64::max);
    if best <= 0.0 {
        return weights;
    }
    for (cluster, rate) in fp.clusters.iter().zip(&rates) {
        for &cpu in &cluster.cpus {
            if let Some(w) = weights.get_mut(cpu as usize) {
                *w = (rate / best * 1000.0).round() / 1000.0;
            }
        }
    }
    weights
}

/// Pin the calling thread to one CPU; false where that is not possible.
fn pin_to(cpu: u32) -> bool {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        if cpu as usize >= libc::CPU_SETSIZE as usize {
            return false;
        }
        // SAFETY: `set` is a plain bitmask initialised by CPU_ZERO; the
        // call reads `size_of::<cpu_set_t>()` bytes of it and affects only
        // the calling thread (pid 0).
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_ZERO(&mut set);
            libc::CPU_SET(cpu as usize, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
        }
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    {
        let _ = cpu;
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_positive_and_plausible() {
        let bw = read_bandwidth(16 << 20, 1, 1);
        assert!(bw > 0.1 && bw < 10_000.0, "{bw}");
        for path in [MacPath::Fma { bits: 256 }, MacPath::Int8 { bits: 128 }] {
            let g = peak_macs(path, 1, Duration::from_millis(5));
            assert!(g > 0.1 && g < 100_000.0, "{path:?}: {g}");
        }
    }

    #[test]
    fn one_cluster_means_equal_weights() {
        let fp = tessera_runtime::device::from_cpuinfo(
            "processor\t: 0\nmodel name\t: X\n\nprocessor\t: 1\nmodel name\t: X\n",
        );
        assert_eq!(
            core_weights(&fp, MacPath::Fma { bits: 128 }),
            vec![1.0, 1.0]
        );
    }
}
