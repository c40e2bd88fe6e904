//! Generates the C header from `src/lib.rs` with cbindgen into
//! `$OUT_DIR/tessera.h`. The committed `include/tessera.h` is what users
//! include; the `header` test fails when the two differ. Set
//! `TESSERA_BLESS_HEADER=1` to have this script also overwrite the
//! committed copy.

use std::path::PathBuf;

fn main() {
    let crate_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    println!("cargo:rerun-if-changed=src/lib.rs");
    println!("cargo:rerun-if-changed=cbindgen.toml");
    println!("cargo:rerun-if-env-changed=TESSERA_BLESS_HEADER");
    let config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml"))
        .expect("capi/cbindgen.toml is readable and valid");
    let bindings = cbindgen::Builder::new()
        .with_crate(&crate_dir)
        .with_config(config)
        .generate()
        .expect("cbindgen generates the C header from capi/src/lib.rs");
    bindings.write_to_file(out_dir.join("tessera.h"));
    if std::env::var_os("TESSERA_BLESS_HEADER").is_some_and(|v| v == "1") {
        bindings.write_to_file(crate_dir.join("include/tessera.h"));
    }
}
