//! Tessera's code generation: targets, the tile solver and backends.
//!
//! [`target`] describes each machine as data ([`target::TargetCaps`]);
//! [`tile`] derives every kernel's tile from it (MNN-LLM formulas (2)-(4)).
//! Backends implement [`artifact::Backend`]; machine code is mapped by
//! [`jit`] and called through the one-pointer ABI of [`abi`].

pub mod abi;
pub mod aligned;
pub mod artifact;
#[cfg(feature = "emitters")]
pub mod clif;
pub mod gpu;
pub mod host;
pub mod host_attention;
pub mod jit;
#[cfg(feature = "emitters")]
pub mod neon;
pub mod opencl;
pub mod ptx;
pub mod schedule;
pub mod signed_codes;
pub mod target;
pub mod tile;
#[cfg(feature = "emitters")]
pub mod x86;

pub use target::{MacClass, MacInstr, TargetCaps, UnknownTarget, mac_class, row_unit};
pub use tile::{
    BlockTile, Problem, RegisterAccounting, Solution, SolveError, TileConfig, neighbours, solve,
    solve_kernel,
};

/// This generator's version (the crate version).
pub const GENERATOR_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The generator hash (`generator_hash.rs`): changes whenever emitted code
/// or packed bytes can — emitters, IR, library kernels, quantizers, packers,
/// the `kernel!` macro, the assembler crates' versions.
pub const TEMPLATE_HASH: &str = env!("TESSERA_TEMPLATE_HASH");
