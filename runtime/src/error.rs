//! The runtime's one error type: every public entry point returns it, and
//! each variant names what was wrong (shape, length, format, backend).

use tessera_codegen::host::HostError;
use tessera_codegen::host_attention::AttentionError;

/// Why a runtime call failed.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("backend {backend} is not available here: {why}")]
    Unavailable { backend: String, why: String },
    #[error("{what} is not supported on backend {backend}")]
    Unsupported { backend: String, what: String },
    #[error("{what}: expected {expected}, got {got}")]
    Shape {
        what: String,
        expected: String,
        got: String,
    },
    #[error("unknown format `{0}`; valid formats: {valid}", valid = crate::WeightFormat::ALL.map(crate::WeightFormat::name).join(", "))]
    UnknownFormat(String),
    #[error("no kernel for {what}: {why}")]
    NoKernel { what: String, why: String },
    #[error("KV cache full: {len} tokens + {adding} exceeds its maximum of {max}")]
    CacheFull {
        len: usize,
        adding: usize,
        max: usize,
    },
    #[error("{backend} driver: {why}")]
    Gpu { backend: String, why: String },
    /// An allocation sized by the caller's input could not be made.
    #[error("cannot allocate {what}: {bytes} bytes")]
    OutOfMemory { what: String, bytes: usize },
    #[error("{0}")]
    Host(#[from] HostError),
    #[error("{0}")]
    Attention(#[from] AttentionError),
    #[error("{0}")]
    Quant(#[from] tessera_dsl::quant::QuantError),
    #[error("{0}")]
    Library(#[from] tessera_dsl::library::LibraryError),
    #[error("tuning record: {0}")]
    Record(#[from] crate::record::RecordError),
}

/// A shape/length mismatch error.
pub(crate) fn shape(
    what: impl Into<String>,
    expected: impl ToString,
    got: impl ToString,
) -> RuntimeError {
    RuntimeError::Shape {
        what: what.into(),
        expected: expected.to_string(),
        got: got.to_string(),
    }
}

/// `Err` unless `got == expected`.
pub(crate) fn check_len(what: &str, expected: usize, got: usize) -> Result<(), RuntimeError> {
    if expected == got {
        Ok(())
    } else {
        Err(shape(what, expected, got))
    }
}
