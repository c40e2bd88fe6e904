//! The weight/activation formats a [`crate::Linear`] can be created with,
//! each naming its library kernel and the dtypes its callers pass.

use std::fmt;
use std::str::FromStr;

use tessera_dsl::ir::Format;

use crate::error::RuntimeError;

/// A matmul format (the names tuning records use).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum WeightFormat {
    /// f32 weights and activations, f32 out.
    F32,
    /// f16 weights and activations, f16 out.
    F16,
    /// int8 per-row symmetric weights, dynamic int8 activations, f32 out.
    W8A8,
    /// uint4 asymmetric weights (groups of 32), dynamic int8 activations.
    W4A8,
    /// uint4 asymmetric weights, f16 activations (the GPU family's layout).
    W4A16,
    /// int8 per-row symmetric weights, f16 activations (GPU family).
    W8A16,
    /// E0M4 4-bit weights (groups of 32), f16 activations (GPU family).
    E0M4A16,
    /// ggml's Q4_0 blocks (`u4sym:g32:f16`, 4.5 bits per weight), dynamic
    /// int8 activations.
    Q4_0,
    /// ggml's Q4_1 blocks (`u4asym:g32:f16`, 5 bits per weight), dynamic
    /// int8 activations.
    Q4_1,
    /// ggml's Q8_0 blocks (`i8sym:g32:f16`, 8.5 bits per weight), dynamic
    /// int8 activations.
    Q8_0,
    /// ggml's Q4_0 blocks, f16 activations (GPU family).
    Q4_0A16,
    /// ggml's Q4_1 blocks, f16 activations (GPU family).
    Q4_1A16,
    /// ggml's Q8_0 blocks, f16 activations (GPU family).
    Q8_0A16,
}

impl WeightFormat {
    pub const ALL: [WeightFormat; 13] = [
        WeightFormat::F32,
        WeightFormat::F16,
        WeightFormat::W8A8,
        WeightFormat::W4A8,
        WeightFormat::W4A16,
        WeightFormat::W8A16,
        WeightFormat::E0M4A16,
        WeightFormat::Q4_0,
        WeightFormat::Q4_1,
        WeightFormat::Q8_0,
        WeightFormat::Q4_0A16,
        WeightFormat::Q4_1A16,
        WeightFormat::Q8_0A16,
    ];

    /// Record / CLI name.
    pub fn name(self) -> &'static str {
        match self {
            WeightFormat::F32 => "f32",
            WeightFormat::F16 => "f16",
            WeightFormat::W8A8 => "w8a8",
            WeightFormat::W4A8 => "w4a8",
            WeightFormat::W4A16 => "w4a16",
            WeightFormat::W8A16 => "w8a16",
            WeightFormat::E0M4A16 => "e0m4a16",
            WeightFormat::Q4_0 => "q4_0",
            WeightFormat::Q4_1 => "q4_1",
            WeightFormat::Q8_0 => "q8_0",
            WeightFormat::Q4_0A16 => "q4_0a16",
            WeightFormat::Q4_1A16 => "q4_1a16",
            WeightFormat::Q8_0A16 => "q8_0a16",
        }
    }

    /// The library kernel implementing it.
    pub fn library_kernel(self) -> &'static str {
        match self {
            WeightFormat::F32 => "matmul-f32",
            WeightFormat::F16 => "matmul-f16",
            WeightFormat::W8A8 => "matmul-w8a8",
            WeightFormat::W4A8 => "matmul-w4a8",
            WeightFormat::W4A16 => "matmul-w4a16",
            WeightFormat::W8A16 => "matmul-w8a16",
            WeightFormat::E0M4A16 => "matmul-e0m4a16",
            WeightFormat::Q4_0 => "matmul-q4_0",
            WeightFormat::Q4_1 => "matmul-q4_1",
            WeightFormat::Q8_0 => "matmul-q8_0",
            WeightFormat::Q4_0A16 => "matmul-q4_0a16",
            WeightFormat::Q4_1A16 => "matmul-q4_1a16",
            WeightFormat::Q8_0A16 => "matmul-q8_0a16",
        }
    }

    /// The activations' dtype as callers hold them (`i8dyn` takes f32).
    pub fn input(self) -> Format {
        match self {
            WeightFormat::F16
            | WeightFormat::W4A16
            | WeightFormat::W8A16
            | WeightFormat::E0M4A16
            | WeightFormat::Q4_0A16
            | WeightFormat::Q4_1A16
            | WeightFormat::Q8_0A16 => Format::F16,
            _ => Format::F32,
        }
    }

    /// The output dtype.
    pub fn output(self) -> Format {
        match self {
            WeightFormat::F16 => Format::F16,
            _ => Format::F32,
        }
    }
}

impl fmt::Display for WeightFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for WeightFormat {
    type Err = RuntimeError;
    fn from_str(s: &str) -> Result<Self, RuntimeError> {
        WeightFormat::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| RuntimeError::UnknownFormat(s.to_string()))
    }
}
