//! Shared by the model-file tests: llama.cpp's `gguf` package (the oracle
//! that writes GGUF files and dequantizes them), and the backends here.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use tessera_runtime::{Backend, Device, DeviceOptions, RuntimeError};

/// Where `gguf` is installed, or None after a SKIP (a failure under CI).
pub fn gguf_pythonpath(test: &str) -> Option<PathBuf> {
    tessera_dsl::testing::gguf_pythonpath(test)
}

/// A fresh temporary folder for one test.
pub fn temp_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tessera-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Write `dir/model.gguf` with gguf's writer (tests/oracle/write_gguf.py):
/// tensors `name:TYPE:rows:cols`, plus `dir/<name>.deq` (gguf's
/// dequantization). `env` sets the llama metadata the script reads.
pub fn write_gguf(
    pythonpath: &Path,
    dir: &Path,
    seed: u64,
    specs: &[String],
    env: &[(&str, usize)],
) {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/oracle/write_gguf.py");
    let mut cmd = Command::new("python3");
    cmd.arg(&script)
        .arg(dir)
        .arg(seed.to_string())
        .args(specs)
        .env("PYTHONPATH", pythonpath);
    for (k, v) in env {
        cmd.env(k, v.to_string());
    }
    let out = cmd.output().expect("python3 runs");
    assert!(
        out.status.success(),
        "write_gguf.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

pub fn read_f32(path: &Path) -> Vec<f32> {
    std::fs::read(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// The backends this machine runs, opened: cranelift always, x86 where the
/// CPU has AVX2/FMA/F16C, NEON on aarch64 (under qemu in
/// scripts/test-aarch64.sh), OpenCL where a platform exists (a SKIP line
/// otherwise).
pub fn devices(test: &str, threads: usize) -> Vec<std::sync::Arc<Device>> {
    let mut backends = vec![Backend::HostClif];
    if tessera_codegen::x86::missing_features().is_empty() {
        backends.push(Backend::HostX86);
    }
    if cfg!(target_arch = "aarch64") {
        backends.push(Backend::Neon);
    }
    if cfg!(feature = "opencl") {
        backends.push(Backend::OpenCl);
    }
    let mut out = Vec::new();
    for b in backends {
        let options = DeviceOptions {
            threads: Some(threads),
            gpu_cache_dir: Some(
                std::env::temp_dir().join(format!("tessera-model-file-cl-{}", std::process::id())),
            ),
            ..Default::default()
        };
        match Device::open(b, options) {
            Ok(d) => out.push(std::sync::Arc::new(d)),
            Err(RuntimeError::Unavailable { why, .. }) => println!("SKIP {test} on {b}: {why}"),
            Err(e) => panic!("{test}: opening {b}: {e}"),
        }
    }
    out
}
