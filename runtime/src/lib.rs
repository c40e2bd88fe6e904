//! Tessera's thin runtime.
//!
//! [`device`] fingerprints this machine; [`record`] reads, checks and merges
//! the autotuner's tuning records (the M1/M2 breakpoints per weight shape);
//! `opencl` (feature, on by default) builds and launches the OpenCL
//! backend's programs; `cuda` (feature, off by default) loads and launches
//! the PTX backend's programs through the CUDA driver, where one exists. Dispatch by M, `Linear` and `Attention` come with the
//! runtime issue.

pub mod device;
pub mod record;

#[cfg(feature = "opencl")]
pub mod opencl;

#[cfg(feature = "cuda")]
pub mod cuda;
