//! Bakes the generator hash (`generator_hash.rs`: emitters, IR, library
//! kernels, quantizers, packers, the `kernel!` macro and the assembler
//! crates' versions) into `TEMPLATE_HASH`, so tuning records and
//! prebuilt-kernel manifests made by another generator are refused.

use std::path::Path;

#[path = "generator_hash.rs"]
mod generator_hash;

fn main() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let roots = generator_hash::source_roots(dir);
    let lock = generator_hash::lock_file(dir);
    let (hash, read) = generator_hash::generator_hash(&roots, lock.as_deref());
    for path in read {
        println!("cargo:rerun-if-changed={}", path.display());
    }
    println!("cargo:rustc-env=TESSERA_TEMPLATE_HASH={hash}");
}
