//! Tessera's code generation: targets, the tile solver and backends.
//!
//! [`target`] describes each machine as data ([`target::TargetCaps`]);
//! [`tile`] derives every kernel's tile from it (MNN-LLM formulas (2)-(4)).

pub mod target;
pub mod tile;

pub use target::{MacClass, MacInstr, TargetCaps, UnknownTarget, mac_class};
pub use tile::{
    BlockTile, Problem, RegisterAccounting, Solution, SolveError, TileConfig, neighbours, solve,
    solve_kernel,
};
