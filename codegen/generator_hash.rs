//! The generator hash: one 64-bit FNV-1a over everything that changes the
//! code Tessera emits or the bytes it packs — the emitters (`codegen/src`),
//! the IR, library kernels, quantizers and packers (`dsl/src`), the `kernel!`
//! macro (`dsl/macros/src`) and the versions of the crates that assemble
//! or convert (cranelift, dynasm, half). Tuning records and prebuilt sets
//! made by another generator are refused on this hash, so an input missing
//! here is a stale record nobody notices.
//!
//! Shared by `build.rs` (which bakes it into `TEMPLATE_HASH`) and the test
//! that shows an edit to a library kernel changes it.

use std::path::{Path, PathBuf};

/// The source trees hashed, as (name, folder); `codegen_dir` is this
/// crate's manifest folder. A tree that does not exist (the crate built
/// outside its workspace) hashes as empty.
pub fn source_roots(codegen_dir: &Path) -> Vec<(&'static str, PathBuf)> {
    let workspace = codegen_dir.parent().unwrap_or(codegen_dir);
    vec![
        ("codegen", codegen_dir.join("src")),
        ("dsl", workspace.join("dsl/src")),
        ("macros", workspace.join("dsl/macros/src")),
    ]
}

/// The lock file whose code-changing crate versions are hashed: the first
/// `Cargo.lock` in `codegen_dir` or a folder above it.
pub fn lock_file(codegen_dir: &Path) -> Option<PathBuf> {
    codegen_dir
        .ancestors()
        .map(|d| d.join("Cargo.lock"))
        .find(|p| p.is_file())
}

/// Crates whose version changes emitted code or converted values.
const CODE_CHANGING_CRATES: &[&str] = &["cranelift-", "dynasm", "half"];

fn rust_sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `name version` of each code-changing package in a Cargo.lock text.
fn locked_versions(lock: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut name: Option<&str> = None;
    for line in lock.lines() {
        if let Some(v) = line.strip_prefix("name = ") {
            name = Some(v.trim_matches('"'));
        } else if let (Some(v), Some(n)) = (line.strip_prefix("version = "), name.take())
            && CODE_CHANGING_CRATES.iter().any(|c| n.starts_with(c))
        {
            out.push(format!("{n} {}", v.trim_matches('"')));
        }
    }
    out.sort();
    out
}

/// The hash, as 16 hex digits, and the files it read (for rerun-if-changed).
pub fn generator_hash(roots: &[(&str, PathBuf)], lock: Option<&Path>) -> (String, Vec<PathBuf>) {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut feed = |bytes: &[u8]| {
        for &b in bytes {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        // A separator, so (a, bc) and (ab, c) differ.
        h ^= 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    };
    let mut read = Vec::new();
    for (name, root) in roots {
        let mut files = Vec::new();
        rust_sources(root, &mut files);
        files.sort();
        for file in &files {
            let rel = file.strip_prefix(root).unwrap_or(file);
            feed(name.as_bytes());
            feed(rel.to_string_lossy().as_bytes());
            feed(&std::fs::read(file).unwrap_or_default());
        }
        read.push(root.clone());
    }
    if let Some(lock) = lock {
        let text = std::fs::read_to_string(lock).unwrap_or_default();
        for line in locked_versions(&text) {
            feed(line.as_bytes());
        }
        read.push(lock.to_path_buf());
    }
    (format!("{h:016x}"), read)
}
