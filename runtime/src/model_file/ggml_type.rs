//! ggml's tensor types as a GGUF file names them: the id stored in a tensor
//! info, the name, and the block geometry (weights per block, bytes per
//! block) that fixes a tensor's byte size. Values from ggml's
//! `ggml.h` / gguf-py's `GGML_QUANT_SIZES`.

use std::fmt;

use tessera_dsl::quant::GgmlBlock;

/// Weights per K-quant super-block.
pub const QK_K: usize = 256;

/// Every ggml type id a GGUF file may hold (ids 4, 5 and 31–33 were
/// removed from ggml and are unknown here).
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    IQ2_XXS,
    IQ2_XS,
    IQ3_XXS,
    IQ1_S,
    IQ4_NL,
    IQ3_S,
    IQ2_S,
    IQ4_XS,
    I8,
    I16,
    I32,
    I64,
    F64,
    IQ1_M,
    BF16,
    TQ1_0,
    TQ2_0,
    MXFP4,
    NVFP4,
    Q1_0,
}

/// (type, id, name, weights per block, bytes per block)
const TABLE: &[(GgmlType, u32, &str, usize, usize)] = &[
    (GgmlType::F32, 0, "F32", 1, 4),
    (GgmlType::F16, 1, "F16", 1, 2),
    (GgmlType::Q4_0, 2, "Q4_0", 32, 18),
    (GgmlType::Q4_1, 3, "Q4_1", 32, 20),
    (GgmlType::Q5_0, 6, "Q5_0", 32, 22),
    (GgmlType::Q5_1, 7, "Q5_1", 32, 24),
    (GgmlType::Q8_0, 8, "Q8_0", 32, 34),
    (GgmlType::Q8_1, 9, "Q8_1", 32, 40),
    (GgmlType::Q2_K, 10, "Q2_K", QK_K, 84),
    (GgmlType::Q3_K, 11, "Q3_K", QK_K, 110),
    (GgmlType::Q4_K, 12, "Q4_K", QK_K, 144),
    (GgmlType::Q5_K, 13, "Q5_K", QK_K, 176),
    (GgmlType::Q6_K, 14, "Q6_K", QK_K, 210),
    (GgmlType::Q8_K, 15, "Q8_K", QK_K, 292),
    (GgmlType::IQ2_XXS, 16, "IQ2_XXS", QK_K, 66),
    (GgmlType::IQ2_XS, 17, "IQ2_XS", QK_K, 74),
    (GgmlType::IQ3_XXS, 18, "IQ3_XXS", QK_K, 98),
    (GgmlType::IQ1_S, 19, "IQ1_S", QK_K, 50),
    (GgmlType::IQ4_NL, 20, "IQ4_NL", 32, 18),
    (GgmlType::IQ3_S, 21, "IQ3_S", QK_K, 110),
    (GgmlType::IQ2_S, 22, "IQ2_S", QK_K, 82),
    (GgmlType::IQ4_XS, 23, "IQ4_XS", QK_K, 136),
    (GgmlType::I8, 24, "I8", 1, 1),
    (GgmlType::I16, 25, "I16", 1, 2),
    (GgmlType::I32, 26, "I32", 1, 4),
    (GgmlType::I64, 27, "I64", 1, 8),
    (GgmlType::F64, 28, "F64", 1, 8),
    (GgmlType::IQ1_M, 29, "IQ1_M", QK_K, 56),
    (GgmlType::BF16, 30, "BF16", 1, 2),
    (GgmlType::TQ1_0, 34, "TQ1_0", QK_K, 54),
    (GgmlType::TQ2_0, 35, "TQ2_0", QK_K, 66),
    (GgmlType::MXFP4, 39, "MXFP4", 32, 17),
    (GgmlType::NVFP4, 40, "NVFP4", 64, 36),
    (GgmlType::Q1_0, 41, "Q1_0", 128, 18),
];

/// The types Tessera loads (the others are refused by name).
pub const SUPPORTED: [GgmlType; 8] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
];

impl GgmlType {
    fn row(self) -> &'static (GgmlType, u32, &'static str, usize, usize) {
        TABLE
            .iter()
            .find(|r| r.0 == self)
            .expect("every GgmlType has a table row")
    }

    /// The type of a GGUF tensor-info id, if ggml defines it.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        TABLE.iter().find(|r| r.1 == id).map(|r| r.0)
    }

    pub fn id(self) -> u32 {
        self.row().1
    }

    /// ggml's name (`Q4_K`).
    pub fn name(self) -> &'static str {
        self.row().2
    }

    /// Weights per block (1 for plain element types).
    pub fn block_len(self) -> usize {
        self.row().3
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        self.row().4
    }

    /// Whether Tessera can load tensors of this type.
    pub fn is_supported(self) -> bool {
        SUPPORTED.contains(&self)
    }

    /// The Tessera format stored bit for bit, for ggml's 32-weight blocks.
    pub fn block(self) -> Option<GgmlBlock> {
        match self {
            GgmlType::Q4_0 => Some(GgmlBlock::Q4_0),
            GgmlType::Q4_1 => Some(GgmlBlock::Q4_1),
            GgmlType::Q8_0 => Some(GgmlBlock::Q8_0),
            _ => None,
        }
    }

    /// A K-quant (requantized on load, never repacked).
    pub fn is_k_quant(self) -> bool {
        matches!(self, GgmlType::Q4_K | GgmlType::Q6_K)
    }

    /// Bytes of one row of `cols` weights; None when `cols` is not a whole
    /// number of blocks or the size overflows.
    pub fn row_bytes(self, cols: u64) -> Option<u64> {
        let len = self.block_len() as u64;
        if !cols.is_multiple_of(len) {
            return None;
        }
        (cols / len).checked_mul(self.block_bytes() as u64)
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The supported type names, for error messages.
pub fn supported_names() -> String {
    SUPPORTED
        .iter()
        .map(|t| t.name())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_names_are_unique_and_round_trip() {
        for (i, r) in TABLE.iter().enumerate() {
            assert_eq!(GgmlType::from_id(r.1), Some(r.0));
            assert_eq!(r.0.id(), r.1);
            for s in &TABLE[i + 1..] {
                assert_ne!(r.1, s.1, "{} and {}", r.2, s.2);
                assert_ne!(r.2, s.2);
            }
        }
        for gone in [4, 5, 31, 32, 33, 42, u32::MAX] {
            assert_eq!(GgmlType::from_id(gone), None, "id {gone}");
        }
    }

    #[test]
    fn ggml_block_types_agree_with_the_dsl() {
        for b in [GgmlBlock::Q4_0, GgmlBlock::Q4_1, GgmlBlock::Q8_0] {
            let t = SUPPORTED.iter().find(|t| t.block() == Some(b)).unwrap();
            assert_eq!(t.name(), b.name());
            assert_eq!(t.block_bytes(), b.block_bytes());
            assert_eq!(t.block_len(), tessera_dsl::quant::ggml::BLOCK);
        }
        assert_eq!(GgmlType::Q4_K.row_bytes(512), Some(288));
        assert_eq!(GgmlType::Q4_K.row_bytes(100), None);
        assert_eq!(GgmlType::F32.row_bytes(u64::MAX), None);
    }
}
