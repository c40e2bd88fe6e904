//! Every way a benchmark run can fail, named so the message says what to fix.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("bad shape {text:?}: {why} (use llama2-7b, qwen2-1.5b or N,K[;N,K...])")]
    Shape { text: String, why: String },
    #[error("bad list {text:?}: {why} (expected positive integers separated by commas)")]
    List { text: String, why: String },
    #[error("unknown implementation {name:?}; known: {known}")]
    UnknownImpl { name: String, known: String },
    #[error("{name}: {why}")]
    Impl { name: String, why: String },
    #[error("{peer}: could not start {program}: {source}")]
    Spawn {
        peer: String,
        program: String,
        source: std::io::Error,
    },
    #[error("{peer}: unreadable output line {line:?}: {why}")]
    PeerOutput {
        peer: String,
        line: String,
        why: String,
    },
    #[error("{peer}: exited with {status}")]
    PeerFailed { peer: String, status: String },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("bad option: {0}")]
    Option(String),
}
