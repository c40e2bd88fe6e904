//! The machine's limits, measured in the same run as the implementations so
//! every "fraction of" column is a same-run ratio: DRAM read bandwidth with a
//! GEMV-like loop (8 weight rows at once against one activation row, in plain
//! Rust) and the FP32 FMA peak (a register-resident FMA loop, ymm and, where
//! the CPU has AVX-512, zmm).

use crate::method::Method;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::Instant;

pub use tessera_runtime::read_probe::{BANDWIDTH_ROW, gemv_read};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Limits {
    /// threads → GB/s read by the GEMV-like loop.
    pub read_gbs: BTreeMap<usize, f64>,
    /// threads → GFLOP/s of 256-bit FMA (the AVX2 peak Tessera's x86 kernels target).
    pub fma_ymm_gflops: BTreeMap<usize, f64>,
    /// threads → GFLOP/s of 512-bit FMA, where AVX-512 exists.
    pub fma_zmm_gflops: BTreeMap<usize, f64>,
}

impl Limits {
    /// Measures every limit for each thread count in `threads`.
    pub fn measure(threads: &[usize], method: &Method, quick: bool) -> Limits {
        let mut limits = Limits::default();
        let rows = (method.total_bytes as usize / (4 * BANDWIDTH_ROW))
            .div_ceil(8)
            .max(1)
            * 8;
        let mut weights = vec![0.0f32; rows * BANDWIDTH_ROW];
        crate::impls::fill_uniform(&mut weights, 11);
        let mut x = vec![0.0f32; BANDWIDTH_ROW];
        crate::impls::fill_uniform(&mut x, 12);
        let fma_iters = if quick { 2_000_000 } else { 40_000_000 };
        for &t in threads {
            let timing = method.measure(1, |_| {
                black_box(gemv_read(&weights, &x, t));
            });
            limits
                .read_gbs
                .insert(t, weights.len() as f64 * 4.0 / timing.median_s / 1e9);
            method.pause();
            if let Some(g) = fma_peak(t, fma_iters, FmaWidth::Ymm, method) {
                limits.fma_ymm_gflops.insert(t, g);
            }
            if let Some(g) = fma_peak(t, fma_iters, FmaWidth::Zmm, method) {
                limits.fma_zmm_gflops.insert(t, g);
            }
        }
        limits
    }
}

/// One thread's FMA loop: iterations → a value to keep the work alive.
type FmaKernel = fn(u64) -> f32;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FmaWidth {
    Ymm,
    Zmm,
}

/// GFLOP/s of `threads` threads each running `iters` iterations of 12
/// independent FMA chains; `None` where the CPU lacks the width.
pub fn fma_peak(threads: usize, iters: u64, width: FmaWidth, method: &Method) -> Option<f64> {
    let (lanes, kernel): (u64, fn(u64) -> f32) = fma_kernel(width)?;
    let flops_per_thread = iters * 12 * lanes * 2;
    let mut samples = Vec::new();
    for _ in 0..method.min_reps.max(3) {
        let start = Instant::now();
        std::thread::scope(|s| {
            for _ in 0..threads.max(1) {
                s.spawn(move || black_box(kernel(black_box(iters))));
            }
        });
        samples.push(start.elapsed().as_secs_f64());
    }
    let t = crate::method::Timing::from_samples(&mut samples);
    method.pause();
    Some(flops_per_thread as f64 * threads.max(1) as f64 / t.median_s / 1e9)
}

#[cfg(target_arch = "x86_64")]
fn fma_kernel(width: FmaWidth) -> Option<(u64, FmaKernel)> {
    match width {
        FmaWidth::Ymm if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") => {
            // SAFETY (of the call inside): features detected just above.
            Some((8, |iters| unsafe { x86::fma_ymm(iters) }))
        }
        FmaWidth::Zmm if is_x86_feature_detected!("avx512f") => {
            Some((16, |iters| unsafe { x86::fma_zmm(iters) }))
        }
        _ => None,
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn fma_kernel(_width: FmaWidth) -> Option<(u64, FmaKernel)> {
    None
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;
    use std::hint::black_box;

    macro_rules! fma_chains {
        ($set1:ident, $fmadd:ident, $add:ident, $store:ident, $vec:ty, $lanes:expr, $iters:expr) => {{
            let m = $set1(black_box(0.999_999f32));
            let b = $set1(black_box(1e-7f32));
            let mut a: [$vec; 12] = [$set1(black_box(1.0f32)); 12];
            for _ in 0..$iters {
                a[0] = $fmadd(a[0], m, b);
                a[1] = $fmadd(a[1], m, b);
                a[2] = $fmadd(a[2], m, b);
                a[3] = $fmadd(a[3], m, b);
                a[4] = $fmadd(a[4], m, b);
                a[5] = $fmadd(a[5], m, b);
                a[6] = $fmadd(a[6], m, b);
                a[7] = $fmadd(a[7], m, b);
                a[8] = $fmadd(a[8], m, b);
                a[9] = $fmadd(a[9], m, b);
                a[10] = $fmadd(a[10], m, b);
                a[11] = $fmadd(a[11], m, b);
            }
            let mut s = a[0];
            for v in &a[1..] {
                s = $add(s, *v);
            }
            let mut out = [0.0f32; $lanes];
            // SAFETY: `out` holds exactly one vector of f32 lanes.
            unsafe { $store(out.as_mut_ptr(), s) };
            out.iter().sum()
        }};
    }

    #[target_feature(enable = "avx2,fma")]
    pub fn fma_ymm(iters: u64) -> f32 {
        fma_chains!(
            _mm256_set1_ps,
            _mm256_fmadd_ps,
            _mm256_add_ps,
            _mm256_storeu_ps,
            __m256,
            8,
            iters
        )
    }

    #[target_feature(enable = "avx512f")]
    pub fn fma_zmm(iters: u64) -> f32 {
        fma_chains!(
            _mm512_set1_ps,
            _mm512_fmadd_ps,
            _mm512_add_ps,
            _mm512_storeu_ps,
            __m512,
            16,
            iters
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fma_peak_is_positive_where_measurable() {
        let m = Method::quick(0);
        if let Some(g) = fma_peak(1, 10_000, FmaWidth::Ymm, &m) {
            assert!(g > 0.1 && g.is_finite());
        }
    }
}
