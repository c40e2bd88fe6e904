//! Side-by-side matmul benchmark (`y = x·Wᵀ`, weights `[N, K]`) of Tessera's
//! host kernels against the `gemm` and `matrixmultiply` crates, numpy
//! (OpenBLAS) and ggml, with the method of `shared/PEERS.md`. See
//! bench/README.md.

pub mod error;
pub mod external;
pub mod format;
pub mod impls;
pub mod limits;
pub mod method;
pub mod report;
pub mod run;
pub mod shapes;

pub use error::BenchError;
pub use format::WeightFormat;
pub use impls::MatmulImpl;
