//! Tessera's thin runtime.
//!
//! [`device`] fingerprints this machine; [`record`] reads, checks and merges
//! the autotuner's tuning records (the M1/M2 breakpoints per weight shape);
//! [`manifest`] describes kernels generated at build time (no JIT needed);
//! `opencl` (feature, on by default) builds and launches the OpenCL
//! backend's programs. Dispatch by M, `Linear` and `Attention` come with the
//! runtime issue.

pub mod device;
pub mod manifest;
pub mod record;

#[cfg(feature = "opencl")]
pub mod opencl;
