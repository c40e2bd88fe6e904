//! The model-file error: every variant names the file and, where it
//! applies, the tensor (or metadata key) and the field that was wrong.

use std::fmt;

use tessera_dsl::quant::QuantError;

use crate::error::RuntimeError;

/// Where in a file a problem is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    /// The fixed header (magic, version, counts) or the layout as a whole.
    Header,
    /// A metadata entry: its key, or `#index` before the key is read.
    Metadata(String),
    /// A tensor: its name, or `#index` before the name is read.
    Tensor(String),
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Header => f.write_str("header"),
            Location::Metadata(k) => write!(f, "metadata `{k}`"),
            Location::Tensor(t) => write!(f, "tensor `{t}`"),
        }
    }
}

/// Why a model file or one of its tensors cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ModelFileError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    /// The file breaks its format: truncated, bad magic or version,
    /// out-of-range or overlapping data, absurd counts, …
    #[error("{path}: {at}: `{field}`: {why}")]
    Format {
        path: String,
        at: Location,
        field: String,
        why: String,
    },
    #[error(
        "{path}: tensor `{tensor}` has type {dtype}, which Tessera does not load (supported: {supported})"
    )]
    UnsupportedType {
        path: String,
        tensor: String,
        dtype: String,
        supported: String,
    },
    #[error("{path}: no tensor named `{tensor}`")]
    NoTensor { path: String, tensor: String },
    #[error("{path}: tensor `{tensor}`: {why}")]
    Tensor {
        path: String,
        tensor: String,
        why: String,
    },
    #[error("{path}: tensor `{tensor}`: {source}")]
    Quant {
        path: String,
        tensor: String,
        source: QuantError,
    },
    #[error("{path}: tensor `{tensor}`: {source}")]
    Runtime {
        path: String,
        tensor: String,
        source: Box<RuntimeError>,
    },
}
