//! Tessera's kernel generator as a library, for `build.rs`: its `gen` module
//! writes a model's kernels, a manifest and an embeddable `kernels.rs`
//! (`tessera-kernels-gen gen` does the same from the command line).
//!
//! `gen` is a reserved word in edition 2024, so the module is spelled
//! `r#gen`; its main items are re-exported here:
//! `use tessera_kernels_gen::{GenConfig, ModelSpec, generate};`.

pub mod r#gen;

pub use r#gen::{GenConfig, GenError, GenReport, ModelSpec, generate};
