//! Generates Qwen2-1.5B's kernels for an Arm phone CPU (i8mm), any OpenCL
//! GPU and an Ampere GPU into OUT_DIR; `main` `include!`s the `kernels.rs`
//! written there, so the binary carries them and never JITs.

use tessera_kernels_gen::{GenConfig, ModelSpec, generate};

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let out = std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR for build scripts");
    let mut cfg = GenConfig::new(
        ["aarch64-i8mm", "opencl", "ptx-sm80"],
        ModelSpec::named("qwen2-1.5b"),
        out,
    );
    // Prints cargo:rerun-if-changed for a config.json or record, if given.
    cfg.cargo = true;
    match generate(&cfg) {
        Ok(report) => {
            for note in &report.notes {
                println!("cargo:warning={note}");
            }
        }
        Err(e) => panic!("kernel generation failed: {e}"),
    }
}
