//! KV cache rows for the GPU backends (OpenCL and CUDA): the runtime's
//! cache formats named as the GPU kernels read them, and appended tokens
//! encoded the way a device cache stores them (f16 halves, or one byte
//! per element with per-row parameters for int8 keys), so both APIs write
//! alike.

use half::f16;
use tessera_codegen::gpu::KvFormat as GpuKv;
use tessera_dsl::Format;
use tessera_dsl::quant;

use crate::attention::KvFormat;
use crate::error::RuntimeError;

/// Rows of keys or values to append, already in the cache's encoding.
pub enum KvRows<'a> {
    F16(&'a [f16]),
    /// One byte per element, with one scale and offset per row for int8
    /// keys (empty for fp8).
    Bytes {
        codes: &'a [u8],
        scales: &'a [f32],
        offsets: &'a [f32],
    },
}

/// Bytes of one cached element.
pub fn elem_bytes(format: GpuKv) -> usize {
    match format {
        GpuKv::F16 => 2,
        GpuKv::I8AsymRow | GpuKv::Fp8E4M3 | GpuKv::Fp8E5M2 => 1,
    }
}

/// The GPU kernels' names for a cache format's K and V.
pub fn gpu_formats(format: KvFormat) -> (GpuKv, GpuKv) {
    match format {
        KvFormat::F16 => (GpuKv::F16, GpuKv::F16),
        KvFormat::Kv8 => (GpuKv::I8AsymRow, GpuKv::Fp8E4M3),
    }
}

/// Rows encoded as a device cache stores them.
pub enum Encoded {
    F16(Vec<f16>),
    Bytes {
        codes: Vec<u8>,
        scales: Vec<f32>,
        offsets: Vec<f32>,
    },
}

impl Encoded {
    pub fn rows(&self) -> KvRows<'_> {
        match self {
            Encoded::F16(v) => KvRows::F16(v),
            Encoded::Bytes {
                codes,
                scales,
                offsets,
            } => KvRows::Bytes {
                codes,
                scales,
                offsets,
            },
        }
    }
}

/// Encode `rows` rows of `d` values in `format` (quantized per row, as the
/// host cache stores them).
pub fn encode(
    format: Format,
    rows: usize,
    d: usize,
    data: &[f32],
) -> Result<Encoded, RuntimeError> {
    match format {
        Format::F16 => Ok(Encoded::F16(
            data.iter().map(|&x| f16::from_f32(x)).collect(),
        )),
        f => {
            let t = quant::quantize(f, rows, d, data)?;
            let per_row = f.group().is_some();
            Ok(Encoded::Bytes {
                codes: t.codes,
                scales: if per_row { t.scales } else { Vec::new() },
                offsets: if f.is_asymmetric() {
                    t.offsets
                } else {
                    Vec::new()
                },
            })
        }
    }
}
