//! ggml's block formats as Tessera formats, byte for byte: `Q4_0` is
//! `u4sym:g32:f16`, `Q4_1` is `u4asym:g32:f16`, `Q8_0` is `i8sym:g32:f16`.
//! A GGUF tensor in one of these types is repacked (its blocks decoded into
//! a [`QuantTensor`] and packed for a kernel), never requantized, so every
//! weight dequantizes to the value ggml computes for it.
//!
//! Block layouts (ggml `ggml-common.h`), 32 weights of one row each:
//!
//! | type | bytes | layout |
//! |---|---|---|
//! | `Q4_0` | 18 | f16 d, then 16 bytes: byte j = `q[j] \| q[j + 16] << 4` |
//! | `Q4_1` | 20 | f16 d, f16 m, then the 16 nibble bytes as `Q4_0` |
//! | `Q8_0` | 34 | f16 d, then 32 int8 codes |

use half::f16;

use super::{QuantError, QuantTensor};
use crate::ir::{Format, Group, ParamType};

/// Weights per ggml block of the types here.
pub const BLOCK: usize = 32;

/// A ggml block type Tessera stores losslessly.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgmlBlock {
    Q4_0,
    Q4_1,
    Q8_0,
}

impl GgmlBlock {
    /// The Tessera format whose dequantization is this type's.
    pub fn format(self) -> Format {
        let (g, p) = (Group::Size(BLOCK as u32), ParamType::F16);
        match self {
            GgmlBlock::Q4_0 => Format::U4Sym(g, p),
            GgmlBlock::Q4_1 => Format::U4Asym(g, p),
            GgmlBlock::Q8_0 => Format::I8Sym(g, p),
        }
    }

    /// The ggml type stored exactly as `format`, if any.
    pub fn of_format(format: Format) -> Option<GgmlBlock> {
        [GgmlBlock::Q4_0, GgmlBlock::Q4_1, GgmlBlock::Q8_0]
            .into_iter()
            .find(|b| b.format() == format)
    }

    /// Bytes of one block.
    pub fn block_bytes(self) -> usize {
        match self {
            GgmlBlock::Q4_0 => 18,
            GgmlBlock::Q4_1 => 20,
            GgmlBlock::Q8_0 => 34,
        }
    }

    /// ggml's name for the type.
    pub fn name(self) -> &'static str {
        match self {
            GgmlBlock::Q4_0 => "Q4_0",
            GgmlBlock::Q4_1 => "Q4_1",
            GgmlBlock::Q8_0 => "Q8_0",
        }
    }

    /// Bytes of a `[rows, cols]` tensor in this type (`cols` a multiple of
    /// 32, as ggml requires).
    pub fn tensor_bytes(self, rows: usize, cols: usize) -> Result<usize, QuantError> {
        if !cols.is_multiple_of(BLOCK) {
            return Err(QuantError::Layout(format!(
                "{} rows must hold whole blocks of {BLOCK}: a row of {cols} does not",
                self.name()
            )));
        }
        rows.checked_mul(cols / BLOCK)
            .and_then(|b| b.checked_mul(self.block_bytes()))
            .ok_or(QuantError::SizeOverflow {
                what: "ggml tensor bytes",
            })
    }

    /// Decode `[rows, cols]` of this type (row-major blocks, as in a GGUF
    /// file) into the equivalent [`QuantTensor`]. Fails on a wrong length
    /// or a non-finite scale (ggml would produce non-finite weights).
    pub fn decode(self, rows: usize, cols: usize, bytes: &[u8]) -> Result<QuantTensor, QuantError> {
        let want = self.tensor_bytes(rows, cols)?;
        if bytes.len() != want {
            return Err(QuantError::Length {
                what: "ggml blocks (bytes)",
                expected: want,
                got: bytes.len(),
            });
        }
        let blocks = rows * (cols / BLOCK);
        let mut codes = Vec::new();
        let mut scales = Vec::new();
        let mut offsets = Vec::new();
        let reserve = |e: std::collections::TryReserveError| {
            QuantError::Layout(format!(
                "cannot allocate a decoded {} tensor of {rows}×{cols}: {e}",
                self.name()
            ))
        };
        codes.try_reserve_exact(rows * cols).map_err(reserve)?;
        scales.try_reserve_exact(blocks).map_err(reserve)?;
        if self == GgmlBlock::Q4_1 {
            offsets.try_reserve_exact(blocks).map_err(reserve)?;
        }
        for (index, block) in bytes.chunks_exact(self.block_bytes()).enumerate() {
            let half_at = |at: usize| f16::from_le_bytes([block[at], block[at + 1]]).to_f32();
            let d = half_at(0);
            if !d.is_finite() {
                return Err(QuantError::NonFinite {
                    index,
                    value: format!("{d} (scale of block {index})"),
                });
            }
            scales.push(d);
            match self {
                GgmlBlock::Q4_0 | GgmlBlock::Q4_1 => {
                    let qs = if self == GgmlBlock::Q4_1 {
                        let m = half_at(2);
                        if !m.is_finite() {
                            return Err(QuantError::NonFinite {
                                index,
                                value: format!("{m} (min of block {index})"),
                            });
                        }
                        offsets.push(m);
                        &block[4..20]
                    } else {
                        &block[2..18]
                    };
                    codes.extend(qs.iter().map(|b| b & 0x0F));
                    codes.extend(qs.iter().map(|b| b >> 4));
                }
                GgmlBlock::Q8_0 => codes.extend_from_slice(&block[2..34]),
            }
        }
        let t = QuantTensor {
            format: self.format(),
            rows,
            cols,
            codes,
            scales,
            offsets,
        };
        t.validate()?;
        Ok(t)
    }

    /// Encode a tensor of [`GgmlBlock::format`] as this type's blocks (the
    /// inverse of [`GgmlBlock::decode`]).
    pub fn encode(self, t: &QuantTensor) -> Result<Vec<u8>, QuantError> {
        t.validate()?;
        if t.format != self.format() {
            return Err(QuantError::Layout(format!(
                "{} blocks hold {}, not {}",
                self.name(),
                self.format(),
                t.format
            )));
        }
        let mut out = Vec::new();
        out.try_reserve_exact(self.tensor_bytes(t.rows, t.cols)?)
            .map_err(|e| QuantError::Layout(format!("cannot allocate ggml blocks: {e}")))?;
        for (b, codes) in t.codes.chunks_exact(BLOCK).enumerate() {
            out.extend(f16::from_f32(t.scales[b]).to_le_bytes());
            if self == GgmlBlock::Q4_1 {
                out.extend(f16::from_f32(t.offsets[b]).to_le_bytes());
            }
            match self {
                GgmlBlock::Q4_0 | GgmlBlock::Q4_1 => {
                    out.extend((0..BLOCK / 2).map(|j| codes[j] | (codes[j + BLOCK / 2] << 4)))
                }
                GgmlBlock::Q8_0 => out.extend_from_slice(codes),
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::quantize;

    #[test]
    fn blocks_round_trip_through_quant_tensors() {
        let data: Vec<f32> = (0..3 * 64)
            .map(|i| ((i * 37) % 101) as f32 / 13.0 - 3.5)
            .collect();
        for b in [GgmlBlock::Q4_0, GgmlBlock::Q4_1, GgmlBlock::Q8_0] {
            let t = quantize(b.format(), 3, 64, &data).unwrap();
            let bytes = b.encode(&t).unwrap();
            assert_eq!(bytes.len(), 3 * 2 * b.block_bytes(), "{b:?}");
            assert_eq!(b.decode(3, 64, &bytes).unwrap(), t, "{b:?}");
            assert_eq!(GgmlBlock::of_format(b.format()), Some(b));
        }
    }

    #[test]
    fn bad_blocks_are_named_errors() {
        let b = GgmlBlock::Q4_0;
        assert!(matches!(
            b.decode(1, 30, &[0; 18]),
            Err(QuantError::Layout(_))
        ));
        assert!(matches!(
            b.decode(1, 32, &[0; 17]),
            Err(QuantError::Length {
                expected: 18,
                got: 17,
                ..
            })
        ));
        let mut inf = vec![0u8; 18];
        inf[..2].copy_from_slice(&f16::INFINITY.to_le_bytes());
        assert!(matches!(
            b.decode(1, 32, &inf),
            Err(QuantError::NonFinite { .. })
        ));
    }
}
