//! Shared test tooling for Tessera's cross-crate tests (in `tests/tests/`):
//! toolchain cross-checks, the interpreter check and kernel edits that
//! more than one backend's tests use.

pub mod guarded;
pub mod kernels;
pub mod llvm_mc;
pub mod reference;
