//! Bytes of weights each implementation reads per call, by storage format.
//!
//! Weight GB/s = `weight_bytes(N, K) / median time`. For a format that
//! stores `bits` per code and `param_bytes` of per-group parameters
//! (scale, plus offset for asymmetric formats) for every `group` codes of a row:
//!
//! `weight_bytes = N · (ceil(K · bits / 8) + ceil(K / group) · param_bytes)`
//!
//! so f32 = 4 B/weight, f16 = 2, int8 with an f32 scale per 32 = 1 + 4/32 =
//! 1.125, int4 g32 with an f32 scale = 0.5 + 4/32 = 0.625, and ggml's Q4_0
//! (f16 scale per 32) = 0.5 + 2/32 = 0.5625, Q8_0 = 1 + 2/32 = 1.0625.

use serde::{Deserialize, Serialize};

/// How an implementation stores the weights it reads on every call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum WeightFormat {
    F32,
    F16,
    /// 8-bit codes with `param_bytes` of parameters per `group` codes.
    Int8 {
        group: usize,
        param_bytes: usize,
    },
    /// 4-bit codes, two per byte, with `param_bytes` per `group` codes.
    Int4 {
        group: usize,
        param_bytes: usize,
    },
}

impl WeightFormat {
    pub fn code_bits(self) -> usize {
        match self {
            WeightFormat::F32 => 32,
            WeightFormat::F16 => 16,
            WeightFormat::Int8 { .. } => 8,
            WeightFormat::Int4 { .. } => 4,
        }
    }

    /// Bytes of one `[n, k]` weight matrix as stored (see the module formula).
    pub fn weight_bytes(self, n: usize, k: usize) -> u64 {
        let codes = (k * self.code_bits()).div_ceil(8);
        let params = match self {
            WeightFormat::F32 | WeightFormat::F16 => 0,
            WeightFormat::Int8 { group, param_bytes }
            | WeightFormat::Int4 { group, param_bytes } => k.div_ceil(group.max(1)) * param_bytes,
        };
        (n as u64) * ((codes + params) as u64)
    }

    /// Largest expected `max |y - y_ref| / max(|y_ref|, sqrt(K)/3)` on the
    /// harness's uniform [-1, 1) data; above it a result is flagged as wrong.
    pub fn tolerance(self) -> f64 {
        match self {
            WeightFormat::F32 => 1e-4,
            WeightFormat::F16 => 5e-3,
            WeightFormat::Int8 { .. } => 0.05,
            WeightFormat::Int4 { .. } => 0.25,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_per_weight_formula() {
        assert_eq!(WeightFormat::F32.weight_bytes(4096, 4096), 4 * 4096 * 4096);
        assert_eq!(WeightFormat::F16.weight_bytes(3, 5), 3 * 10);
        let q4_0 = WeightFormat::Int4 {
            group: 32,
            param_bytes: 2,
        };
        // ggml's Q4_0 block: 18 bytes per 32 weights.
        assert_eq!(q4_0.weight_bytes(1024, 1024), 1024 * 32 * 18);
        let q8_0 = WeightFormat::Int8 {
            group: 32,
            param_bytes: 2,
        };
        assert_eq!(q8_0.weight_bytes(1000, 1024), 1_088_000);
        // Tails: a partial group still carries its parameters; odd K rounds the nibbles up.
        let w4 = WeightFormat::Int4 {
            group: 32,
            param_bytes: 8,
        };
        assert_eq!(w4.weight_bytes(2, 33), 2 * (17 + 2 * 8));
    }
}
