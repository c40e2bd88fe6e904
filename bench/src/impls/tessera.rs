//! Where Tessera's host kernels join the benchmark.
//!
//! To add one: write a type implementing [`MatmulImpl`](super::MatmulImpl)
//! (its `prepare` packs or quantizes the f32 weights into its own format,
//! once per copy; its `weight_format` states the bytes it reads), list its
//! name in [`names`] and build it in [`make`]. It is then accepted by
//! `--peers` and gets its own column. Names start with `tessera-` so the
//! table adds a ratio column for them by default.

use super::MatmulImpl;

/// Names of the Tessera implementations available in this build.
pub fn names() -> Vec<String> {
    Vec::new()
}

/// The Tessera implementation called `name`.
pub fn make(name: &str) -> Option<Box<dyn MatmulImpl>> {
    let _ = name;
    None
}
