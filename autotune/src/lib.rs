//! Tessera's autotuner: measures this device and writes the tuning record
//! the runtime loads (`tessera_runtime::record`).
//!
//! For each weight shape [N, K] of a model it times the solver's optimum
//! and nearest neighbours per matmul variant, keeps the winners, and finds
//! the breakpoints M1 (GEMV → flat GEMM) and M2 (flat GEMM → GEMM) by
//! bisection over M (FlashDecoding++ section 5: measured inflection points,
//! searched offline, looked up at run time). See `docs/AUTOTUNE.md`.
//!
//! - [`stats`]: median, MAD and the tie interval;
//! - [`search`]: the galloping bisection over M (pure logic);
//! - [`decide`]: the decision rule over timing blocks: paired ratios, the
//!   noise margin, ties to the solver's cost, confirmed breakpoints;
//! - [`savings`]: what the chosen breakpoints save against their
//!   neighbours and against never switching;
//! - [`remote`]: tuning another device (build, copy, run, fetch, merge);
//! - [`tune`]: the budgeted driver over a [`tune::Bench`];
//! - [`bench`](mod@bench): timing real kernels with rotated weight copies;
//! - [`backend`]: the backends that can tune here;
//! - [`opencl`]: tuning on an OpenCL device (its bench and limits);
//! - [`limits`]: read bandwidth, peak MAC rate, core weights;
//! - [`prefetch`]: the int8 weight stream's prefetch distance;
//! - [`model_source`]: what `--model` names (embedded model, config.json,
//!   GGUF file, shape list) as shapes and their formats;
//! - [`report`]: summary tables and SVG plots;
//! - [`cli`]: the `tessera-autotune` command.

pub mod backend;
pub mod bench;
pub mod cli;
pub mod decide;
pub mod decode;
pub mod limits;
pub mod model_source;
pub mod opencl;
pub mod prefetch;
pub mod prefill;
pub mod remote;
pub mod report;
pub mod savings;
pub mod search;
pub mod stats;
pub mod tune;
