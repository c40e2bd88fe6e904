//! Tessera's code generation: targets, the tile solver and backends.
pub mod abi;
pub mod artifact;
pub mod jit;
pub mod x86;
pub mod tile {
    pub struct TileConfig;
}
