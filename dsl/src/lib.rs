//! Tessera's kernel description layer.
//!
//! Pipeline: a kernel is described (the `kernel!` macro or [`builder`]) as a
//! [`ir::Kernel`], checked by [`verify::verify`], printed and parsed in its
//! canonical text form ([`text`]), and given meaning by the reference
//! interpreter ([`interp`]), the oracle every backend is tested against.
//! [`quant`] defines every storage format and packed layout byte by byte;
//! [`library`] holds the built-in kernels.

// Lets `kernel!`'s expansion name `::tessera_dsl::...` inside this crate too.
extern crate self as tessera_dsl;

pub mod builder;
pub mod interp;
pub mod ir;
pub mod library;
pub mod models;
pub mod naming;
pub mod quant;
pub mod testing;
pub mod text;
pub mod verify;

pub use builder::KernelBuilder;
pub use ir::*;
/// Describe a kernel as loops over named axes; expands to a
/// [`KernelBuilder`] chain whose value is `Result<Kernel, VerifyError>`.
pub use tessera_macros::kernel;
pub use verify::{VerifyError, verify};
