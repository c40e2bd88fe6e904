//! Hashes the emitter sources into `TEMPLATE_HASH`, so tuning records and
//! prebuilt-kernel manifests made by another generator are refused.

use std::path::{Path, PathBuf};

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&root, &mut files);
    files.sort();
    // 64-bit FNV-1a over (relative path, contents) of every source file.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut feed = |bytes: &[u8]| {
        for &b in bytes {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    for file in &files {
        let rel = file.strip_prefix(&root).unwrap_or(file);
        feed(rel.to_string_lossy().as_bytes());
        feed(&std::fs::read(file).unwrap_or_default());
    }
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rustc-env=TESSERA_TEMPLATE_HASH={h:016x}");
}
