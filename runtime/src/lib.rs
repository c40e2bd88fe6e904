//! The thin runtime (filled by the runtime issue).

#[cfg(feature = "opencl")]
pub mod opencl;
