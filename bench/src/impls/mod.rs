//! Implementations timed in this process, behind one trait so Tessera's
//! kernels plug in beside the Rust peers (see bench/README.md).

mod gemm_peer;
mod matrixmultiply_peer;
pub mod tessera;

pub use gemm_peer::GemmPeer;
pub use matrixmultiply_peer::MatrixmultiplyPeer;

use std::sync::Arc;

use tessera_runtime::record::TuningRecord;

use crate::error::BenchError;
use crate::format::WeightFormat;

/// One matmul implementation: `y[m, n] = x[m, k] · W[n, k]ᵀ`, all row-major.
///
/// The harness calls `prepare` once per shape, then for every thread count
/// `set_threads`, then `run` many times, rotating `copy` through
/// `0..copies`; `release` frees the copies before the next shape.
pub trait MatmulImpl {
    /// Column name in the table and `impl` in JSON, e.g. `tessera-x86-w4a8`.
    fn name(&self) -> String;

    /// How the prepared weights are stored, for the bytes read per call.
    fn weight_format(&self) -> WeightFormat;

    /// Packs / quantizes `weights` (`[n, k]` f32 row-major) into `copies`
    /// independent copies, each at its own address, so the harness can rotate
    /// through more bytes than the last-level cache holds.
    fn prepare(
        &mut self,
        n: usize,
        k: usize,
        weights: &[f32],
        copies: usize,
    ) -> Result<(), BenchError>;

    /// Uses `threads` threads from now on, the way a user of this
    /// implementation would ask for them.
    fn set_threads(&mut self, threads: usize) -> Result<(), BenchError>;

    /// Computes `y = x · W_copyᵀ` for `m` rows: `x.len() == m·k`,
    /// `y.len() == m·n`. Called with `copy < copies` only.
    fn run(&self, m: usize, x: &[f32], y: &mut [f32], copy: usize);

    /// Drops the prepared copies.
    fn release(&mut self);

    /// `Some(env)` when this implementation fixes its thread count once per
    /// process (as matrixmultiply does with `MATMUL_NUM_THREADS`): the harness
    /// then runs it in a child process per thread count with `env` set.
    fn process_env_for_threads(&self, _threads: usize) -> Option<Vec<(String, String)>> {
        None
    }
}

/// Names of the implementations that run in this process.
pub fn in_process_names() -> Vec<String> {
    let mut names = vec!["gemm".to_string(), "matrixmultiply".to_string()];
    names.extend(tessera::names());
    names
}

/// The in-process implementation called `name`, if there is one; the
/// tessera-* ones dispatch by `record` when given.
pub fn in_process_impl(
    name: &str,
    record: Option<&Arc<TuningRecord>>,
) -> Option<Box<dyn MatmulImpl>> {
    match name {
        "gemm" => Some(Box::new(GemmPeer::default())),
        "matrixmultiply" => Some(Box::new(MatrixmultiplyPeer::default())),
        _ => tessera::make(name, record.cloned()),
    }
}

/// Checks `len` against what `what` must hold.
pub(crate) fn check_len(name: &str, what: &str, len: usize, want: usize) -> Result<(), BenchError> {
    if len == want {
        Ok(())
    } else {
        Err(BenchError::Impl {
            name: name.to_string(),
            why: format!("{what} has {len} elements, expected {want}"),
        })
    }
}

/// Deterministic uniform values in [-1, 1) (splitmix64), so every run and
/// every implementation sees the same data.
pub fn fill_uniform(out: &mut [f32], seed: u64) {
    let mut state = seed;
    for v in out {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        *v = ((z >> 40) as f64 / (1u64 << 23) as f64 - 1.0) as f32;
    }
}

/// `max |y - y_ref| / max(max |y_ref|, sqrt(K)/3)` over rows {0, n/2, n-1} of
/// W and rows {0, m-1} of x, with `y_ref` in f64 from the f32 weights. The
/// floor `sqrt(K)/3` is the typical |y| for uniform [-1, 1) data, so a row
/// that happens to sum near 0 does not inflate the error.
pub fn relative_error(n: usize, k: usize, m: usize, weights: &[f32], x: &[f32], y: &[f32]) -> f64 {
    let mut max_err = 0.0f64;
    let mut max_ref = 0.0f64;
    for &r in &[0, n / 2, n - 1] {
        for &i in &[0, m - 1] {
            let reference: f64 = (0..k)
                .map(|c| f64::from(weights[r * k + c]) * f64::from(x[i * k + c]))
                .sum();
            let got = f64::from(y[i * n + r]);
            let err = if got.is_finite() {
                (reference - got).abs()
            } else {
                f64::INFINITY
            };
            max_err = max_err.max(err);
            max_ref = max_ref.max(reference.abs());
        }
    }
    max_err / max_ref.max((k as f64).sqrt() / 3.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn naive(m: usize, n: usize, k: usize, x: &[f32], w: &[f32]) -> Vec<f32> {
        let mut y = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                y[i * n + j] = (0..k)
                    .map(|c| f64::from(x[i * k + c]) * f64::from(w[j * k + c]))
                    .sum::<f64>() as f32;
            }
        }
        y
    }

    fn check_impl(name: &str, m: usize, n: usize, k: usize, threads: usize) {
        let mut imp = in_process_impl(name, None).unwrap();
        let mut w = vec![0.0; n * k];
        fill_uniform(&mut w, 1 + n as u64);
        let mut x = vec![0.0; m * k];
        fill_uniform(&mut x, 7 + k as u64);
        imp.prepare(n, k, &w, 3).unwrap();
        // matrixmultiply takes its thread count from the environment of the
        // process (the harness sets it in a child); results do not depend on it.
        if name != "matrixmultiply" {
            imp.set_threads(threads).unwrap();
        }
        let want = naive(m, n, k, &x, &w);
        for copy in 0..3 {
            let mut y = vec![f32::NAN; m * n];
            imp.run(m, &x, &mut y, copy);
            for (a, b) in y.iter().zip(&want) {
                assert!(
                    (a - b).abs() <= 1e-4 * (k as f32).sqrt(),
                    "{name} {m}x{n}x{k}: {a} vs {b}"
                );
            }
            assert!(relative_error(n, k, m, &w, &x, &y) < imp.weight_format().tolerance());
        }
        imp.release();
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        #[test]
        fn gemm_matches_plain_math(m in 1usize..20, n in 1usize..70, k in 1usize..90, t in 1usize..3) {
            check_impl("gemm", m, n, k, t);
        }

        #[test]
        fn matrixmultiply_matches_plain_math(m in 1usize..20, n in 1usize..70, k in 1usize..90) {
            check_impl("matrixmultiply", m, n, k, 1);
        }
    }

    #[test]
    fn relative_error_sees_a_wrong_element() {
        let (m, n, k) = (2, 5, 16);
        let mut w = vec![0.0; n * k];
        fill_uniform(&mut w, 3);
        let mut x = vec![0.0; m * k];
        fill_uniform(&mut x, 4);
        let mut y = naive(m, n, k, &x, &w);
        assert!(relative_error(n, k, m, &w, &x, &y) < 1e-6);
        y[n - 1] += 1.0; // row 0 of x, last row of W
        assert!(relative_error(n, k, m, &w, &x, &y) > 0.1);
        y[n - 1] = f32::NAN;
        assert!(relative_error(n, k, m, &w, &x, &y).is_infinite());
    }

    #[test]
    fn uniform_is_deterministic_and_in_range() {
        let mut a = vec![0.0; 1000];
        let mut b = vec![0.0; 1000];
        fill_uniform(&mut a, 42);
        fill_uniform(&mut b, 42);
        assert_eq!(a, b);
        assert!(a.iter().all(|v| (-1.0..1.0).contains(v)));
        let mean: f32 = a.iter().sum::<f32>() / 1000.0;
        assert!(mean.abs() < 0.1);
    }

    #[test]
    fn bad_weight_length_is_an_error() {
        for name in ["gemm", "matrixmultiply"] {
            let mut imp = in_process_impl(name, None).unwrap();
            let err = imp.prepare(4, 4, &[0.0; 15], 2).unwrap_err().to_string();
            assert!(err.contains("expected 16"), "{err}");
        }
    }
}
