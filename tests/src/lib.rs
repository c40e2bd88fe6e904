//! Shared test tooling for Tessera's cross-crate tests (in `tests/tests/`):
//! toolchain cross-checks that more than one backend's tests use.

pub mod llvm_mc;
pub mod reference;
