//! Tessera's thin runtime.
//!
//! [`device`] fingerprints this machine; [`record`] reads, checks and merges
//! the autotuner's tuning records (the M1/M2 breakpoints per weight shape).
//! Loading kernels, dispatch by M, `Linear` and `Attention` come with the
//! runtime issue.

pub mod device;
pub mod record;
