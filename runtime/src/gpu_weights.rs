//! Weights for the GPU backends (OpenCL and CUDA): checked against the
//! format the kernel's plan wants, then packed into the GPU layout
//! `[l/lp, h, lp]` (MNN-LLM 5.1, lp = `WEIGHT_LP`). The host-side half of
//! the shared `tessera_codegen::gpu` lowering, so both APIs pack alike.

use half::f16;
use tessera_codegen::gpu::WEIGHT_LP;
use tessera_dsl::Format;
use tessera_dsl::interp::Value;
use tessera_dsl::quant::{
    ElemWidth, PackPlan, PackedWeights, Tile, WeightPacking, gpu_weight_layout, pack_weights,
    param_bytes,
};

/// Weights ready to upload.
pub enum GpuWeights {
    /// f16 values as half bits, `[l/lp, h, lp]`.
    Halves(Vec<u16>),
    /// Quantized codes `[l/lp, h, lp]` and their group-major parameters.
    Quant(GpuQuant),
}

/// Quantized weights as the kernels read them: the codes, and the group
/// parameters in the precision the format stores them (f32, or f16 for
/// ggml's blocks: 2 bytes each), little-endian.
pub struct GpuQuant {
    pub codes: Vec<u8>,
    pub scales: Vec<u8>,
    /// Empty for symmetric formats.
    pub offsets: Vec<u8>,
}

impl GpuQuant {
    fn new(p: PackedWeights) -> GpuQuant {
        GpuQuant {
            scales: param_bytes(p.format, &p.scales),
            offsets: param_bytes(p.format, &p.offsets),
            codes: p.codes,
        }
    }

    /// Device bytes of the codes and parameters.
    pub fn bytes(&self) -> usize {
        self.codes.len() + self.scales.len() + self.offsets.len()
    }
}

/// f16 weights `[h, l]` in the GPU layout, as half bits.
pub fn pack_f16_gpu(h: usize, l: usize, w: &[f16]) -> Result<Vec<u16>, String> {
    let plan = PackPlan::new(
        &gpu_weight_layout(),
        &[("h", h), ("l", l)],
        &[Tile::new("lp", "l", WEIGHT_LP as usize)],
        ElemWidth::B16,
    )
    .map_err(|e| e.to_string())?;
    let bytes: Vec<u8> = w.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect();
    let packed = plan.pack(&bytes).map_err(|e| e.to_string())?;
    Ok(packed
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect())
}

/// Check `w` (`[h, l]`) against the format the kernel wants and pack it.
/// The error names the mismatch.
pub fn prepare(wanted: Format, w: &Value, h: usize, l: usize) -> Result<GpuWeights, String> {
    match w {
        Value::F16(data) => {
            if wanted != Format::F16 {
                return Err(format!("f16 weights given, the kernel wants {wanted}"));
            }
            if data.len() != h * l {
                return Err(format!(
                    "w: expected {} elements, got {}",
                    h * l,
                    data.len()
                ));
            }
            Ok(GpuWeights::Halves(pack_f16_gpu(h, l, data)?))
        }
        Value::Quant(q) => {
            if q.rows != h || q.cols != l || q.format != wanted {
                return Err(format!(
                    "weights are {} [{}, {}], the kernel wants {wanted} [{h}, {l}]",
                    q.format, q.rows, q.cols
                ));
            }
            let packing = WeightPacking::Gpu {
                lp: WEIGHT_LP as usize,
            };
            Ok(GpuWeights::Quant(GpuQuant::new(
                pack_weights(q, packing).map_err(|e| e.to_string())?,
            )))
        }
        other => Err(format!("weights bound as {}", other.kind())),
    }
}
