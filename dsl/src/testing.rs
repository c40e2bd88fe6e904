//! For Tessera's own tests: what a check does when the toolchain it checks
//! against (llvm-mc, ptxas, clang, PoCL, the gguf oracle, ssh, qemu) is
//! missing. On a developer's machine without it the check prints a visible
//! SKIP; where the tools are supposed to be there — under CI, and in
//! `scripts/test.sh`, which has just installed them — a missing tool fails
//! the run naming it, so a check can never pass by not running.

/// Whether a missing tool fails: `CI` or `TESSERA_REQUIRE_TOOLS` is set
/// (`scripts/test.sh` sets the latter).
pub fn tools_required() -> bool {
    std::env::var_os("CI").is_some() || std::env::var_os("TESSERA_REQUIRE_TOOLS").is_some()
}

/// Report that `check` cannot run because `why` (naming the tool): panics
/// when tools are required, else prints `SKIP <check>: <why>`.
pub fn missing_tool(check: &str, why: &str) {
    if tools_required() {
        panic!("{check}: {why} (required under CI and in scripts/test.sh, which installs it)");
    }
    eprintln!("SKIP {check}: {why}");
}

/// Where llama.cpp's `gguf` package (the oracle for ggml's blocks and GGUF
/// files) is installed: `TESSERA_GGUF_PYTHONPATH`, else
/// `~/.cache/tessera/gguf`, where `scripts/test.sh` puts it. None after
/// [`missing_tool`] (a SKIP, or a failure under CI).
pub fn gguf_pythonpath(check: &str) -> Option<std::path::PathBuf> {
    use std::path::PathBuf;
    let path = std::env::var_os("TESSERA_GGUF_PYTHONPATH")
        .map(PathBuf::from)
        .or_else(|| {
            let cache = std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
            Some(cache.join("tessera/gguf"))
        })
        .filter(|p| p.join("gguf").is_dir());
    if path.is_none() {
        missing_tool(
            check,
            "the gguf package (llama.cpp's GGUF writer and quantizers) is not installed",
        );
    }
    path
}

/// Attention `kernel` with its key and value caches in `kf` and `vf`, named
/// after them (`<name>-<kf>-<vf>`): the format sweeps of the attention tests.
pub fn attention_with_formats(
    mut kernel: crate::ir::Kernel,
    kf: crate::ir::Format,
    vf: crate::ir::Format,
) -> crate::ir::Kernel {
    for t in &mut kernel.tensors {
        match t.name.as_str() {
            "k" => t.format = kf,
            "v" => t.format = vf,
            _ => {}
        }
    }
    kernel.name = format!("{}-{kf}-{vf}", kernel.name);
    kernel
}
