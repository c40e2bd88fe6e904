//! The `matrixmultiply` crate's `sgemm` with its `threading` feature. It
//! reads `MATMUL_NUM_THREADS` once per process, so the harness runs it in a
//! child process per thread count (see `process_env_for_threads`).

use super::{MatmulImpl, check_len};
use crate::error::BenchError;
use crate::format::WeightFormat;

pub const THREADS_VAR: &str = "MATMUL_NUM_THREADS";

#[derive(Default)]
pub struct MatrixmultiplyPeer {
    n: usize,
    k: usize,
    copies: Vec<Vec<f32>>,
}

impl MatmulImpl for MatrixmultiplyPeer {
    fn name(&self) -> String {
        "matrixmultiply".into()
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
        check_len("matrixmultiply", "weights", weights.len(), n * k)?;
        self.n = n;
        self.k = k;
        self.copies = (0..copies.max(1)).map(|_| weights.to_vec()).collect();
        Ok(())
    }

    /// Only the count this process was started with can be honoured.
    fn set_threads(&mut self, threads: usize) -> Result<(), BenchError> {
        let fixed = std::env::var(THREADS_VAR)
            .ok()
            .and_then(|v| v.parse::<usize>().ok());
        match fixed {
            Some(t) if t == threads => Ok(()),
            _ => Err(BenchError::Impl {
                name: "matrixmultiply".into(),
                why: format!(
                    "{threads} threads asked but this process has {THREADS_VAR}={fixed:?}; \
                     matrixmultiply reads it once per process"
                ),
            }),
        }
    }

    fn run(&self, m: usize, x: &[f32], y: &mut [f32], copy: usize) {
        let (n, k) = (self.n, self.k);
        assert!(
            x.len() == m * k && y.len() == m * n,
            "matrixmultiply: x or y has the wrong length"
        );
        let w = &self.copies[copy];
        // SAFETY: a = x [m, k] (row stride k), b = Wᵀ [k, n] read from w [n, k]
        // (row stride 1, column stride k), c = y [m, n] (row stride n); lengths
        // checked above, c aliases neither input.
        unsafe {
            matrixmultiply::sgemm(
                m,
                k,
                n,
                1.0,
                x.as_ptr(),
                k as isize,
                1,
                w.as_ptr(),
                1,
                k as isize,
                0.0,
                y.as_mut_ptr(),
                n as isize,
                1,
            )
        }
    }

    fn release(&mut self) {
        self.copies = Vec::new();
    }

    fn process_env_for_threads(&self, threads: usize) -> Option<Vec<(String, String)>> {
        Some(vec![(THREADS_VAR.to_string(), threads.to_string())])
    }
}
