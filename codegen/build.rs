//! Bakes the generator hash (`generator_hash.rs`: emitters, IR, library
//! kernels, quantizers, packers, the `kernel!` macro and the assembler
//! crates' versions) into `TEMPLATE_HASH`, so tuning records and
//! prebuilt-kernel manifests made by another generator are refused.

use std::path::Path;

#[path = "generator_hash.rs"]
mod generator_hash;

fn main() {
    // At run time, not `env!`: a build-script binary is shared by every
    // checkout of the workspace built into one target directory (cargo
    // hashes path packages relative to the workspace), so a path baked in
    // at compile time can name another checkout.
    let dir = std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let dir = Path::new(&dir);
    let roots = generator_hash::source_roots(dir);
    let lock = generator_hash::lock_file(dir);
    let (hash, read) = generator_hash::generator_hash(&roots, lock.as_deref());
    // The emitters' own sources are always there: a hash of nothing would
    // accept every record (a build script run against a missing tree).
    assert!(
        std::fs::read_dir(&roots[0].1).is_ok(),
        "generator hash: {} is not readable",
        roots[0].1.display()
    );
    for path in read {
        println!("cargo:rerun-if-changed={}", path.display());
    }
    println!("cargo:rustc-env=TESSERA_TEMPLATE_HASH={hash}");
}
