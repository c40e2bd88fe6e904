//! The `gemm` crate (0.19) in f32, threaded as its users do: its own
//! `Parallelism::Rayon(n)` inside a rayon pool of `n` threads.

use super::{MatmulImpl, check_len};
use crate::error::BenchError;
use crate::format::WeightFormat;
use gemm::Parallelism;

#[derive(Default)]
pub struct GemmPeer {
    n: usize,
    k: usize,
    copies: Vec<Vec<f32>>,
    threads: usize,
    pool: Option<rayon::ThreadPool>,
}

impl MatmulImpl for GemmPeer {
    fn name(&self) -> String {
        "gemm".into()
    }

    fn weight_format(&self) -> WeightFormat {
        WeightFormat::F32
    }

    fn prepare(
        &mut self,
        n: usize,
        k: usize,
        weights: &[f32],
        copies: usize,
    ) -> Result<(), BenchError> {
        check_len("gemm", "weights", weights.len(), n * k)?;
        self.n = n;
        self.k = k;
        self.copies = (0..copies.max(1)).map(|_| weights.to_vec()).collect();
        Ok(())
    }

    fn set_threads(&mut self, threads: usize) -> Result<(), BenchError> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads.max(1))
            .build()
            .map_err(|e| BenchError::Impl {
                name: "gemm".into(),
                why: format!("rayon pool of {threads} threads: {e}"),
            })?;
        self.threads = threads.max(1);
        self.pool = Some(pool);
        Ok(())
    }

    fn run(&self, m: usize, x: &[f32], y: &mut [f32], copy: usize) {
        let (n, k) = (self.n, self.k);
        assert!(
            x.len() == m * k && y.len() == m * n,
            "gemm: x or y has the wrong length"
        );
        let w = &self.copies[copy];
        let parallelism = if self.threads > 1 {
            Parallelism::Rayon(self.threads)
        } else {
            Parallelism::None
        };
        let mut call = move || {
            // SAFETY: x is [m, k] (row stride k), w is [n, k] read as Wᵀ [k, n]
            // (row stride 1, column stride k), y is [m, n] (row stride n); the
            // lengths were checked above and y does not alias x or w.
            unsafe {
                gemm::gemm(
                    m,
                    n,
                    k,
                    y.as_mut_ptr(),
                    1,
                    n as isize,
                    false,
                    x.as_ptr(),
                    1,
                    k as isize,
                    w.as_ptr(),
                    k as isize,
                    1,
                    0.0f32,
                    1.0f32,
                    false,
                    false,
                    false,
                    parallelism,
                )
            }
        };
        match &self.pool {
            Some(pool) => pool.install(call),
            None => call(),
        }
    }

    fn release(&mut self) {
        self.copies = Vec::new();
    }
}
