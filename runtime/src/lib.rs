//! Tessera's thin runtime: what an inference engine links.
//!
//! - [`backend`]: open a [`Device`] on a [`Backend`] (x86 AVX2, cranelift,
//!   NEON, OpenCL, CUDA; one that cannot run here says why), with a
//!   persistent [`pool::ThreadPool`] and, optionally, a tuning record and
//!   prebuilt kernels. Every host kernel is JITted (feature `jit`) or mapped
//!   once; every OpenCL program is built once (through the binary cache).
//! - [`dispatch`]: per weight shape [N, K], GEMV below M1, flat GEMM below
//!   M2, GEMM above (FlashDecoding++ section 5), from the record or the
//!   solver's defaults (and `tracing` says which and why).
//! - [`Linear`]: weights packed once per tile (on a GPU: packed into the
//!   GPU layout and uploaded once), `forward` for any M; layers reading
//!   one input take it as a [`SharedInput`], quantized once.
//! - [`Attention`] over a [`KvCache`] appended in place (in device buffers
//!   on OpenCL, [`KvCache::for_device`]).
//! - [`device`] fingerprints this machine; [`record`] reads, checks and
//!   merges the autotuner's tuning records; [`prebuilt`] is the interface
//!   for ahead-of-time machine code (the only kernels without `jit`);
//!   [`manifest`] describes the kernel files `tessera-kernels-gen gen`
//!   writes and the table its `kernels.rs` embeds;
//!   `opencl` (feature) builds and launches the OpenCL backend's programs
//!   (one-shot runners, and the resident weights, programs and KV cache a
//!   `Device` keeps);
//!   `cuda` (feature, off by default) loads and launches the PTX backend's
//!   programs through the CUDA driver, where one exists.
//! - [`model_file`]: GGUF and safetensors weights (memory-mapped) into
//!   [`Linear`] layers: ggml's Q4_0 / Q4_1 / Q8_0 repacked bit for bit,
//!   K-quants requantized with their error reported, floats quantized on
//!   load.
//!
//! Every public entry point checks shapes, lengths and formats before any
//! unsafe call and returns a [`RuntimeError`] naming the mismatch.

pub mod attention;
pub mod backend;
pub mod device;
pub mod dispatch;
pub mod error;
pub mod format;
mod kv_append;
pub mod linear;
pub mod manifest;
pub mod model_file;
pub mod pool;
pub mod prebuilt;
pub mod read_probe;
pub mod record;

#[cfg(any(feature = "opencl", feature = "cuda"))]
pub mod gpu_kv;
#[cfg(any(feature = "opencl", feature = "cuda"))]
pub mod gpu_weights;

#[cfg(feature = "opencl")]
pub mod opencl;

#[cfg(feature = "cuda")]
pub mod cuda;

pub use attention::{Attention, KvCache, KvCapacity, KvFormat};
pub use backend::{Backend, Device, DeviceOptions, current_generator};
pub use dispatch::{PlanSource, ShapePlan};
pub use error::RuntimeError;
pub use format::WeightFormat;
pub use linear::{Input, InputBuffers, Linear, Output, SharedInput, Weights};
pub use model_file::{ModelFile, ModelFileError};
pub use prebuilt::{PrebuiltKernel, PrebuiltSet, PrebuiltSource};
