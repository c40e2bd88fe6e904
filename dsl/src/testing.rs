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
