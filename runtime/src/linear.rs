//! A linear layer: weights packed once per distinct kernel tile at model
//! load (offline packing, TurboMind 4.1), and `forward` for any M, which
//! picks GEMV / flat GEMM / GEMM by M and splits the output channels over
//! the device's pool by per-core weights.

use std::sync::Arc;

use tessera_codegen::host::{HostInput, HostMatmul, HostOutput, HostTile, HostWeights, WeightsIn};
use tessera_dsl::ir::Variant;
use tessera_dsl::quant::{self, QuantTensor};

use crate::backend::Device;
use crate::dispatch::{ShapePlan, variant_index};
use crate::error::{RuntimeError, check_len, shape};
use crate::format::WeightFormat;
use crate::pool::split_weighted;

/// Activations as the caller holds them (f32 for f32 / W8A8 / W4A8, f16 for
/// f16 / W4A16).
pub type Input<'a> = HostInput<'a>;
/// The output buffer (f16 for the f16 format, else f32).
pub type Output<'a> = HostOutput<'a>;

/// Weights in their source form: f32 `[n, k]` row-major (converted or
/// quantized to the format once), or already quantized in the format.
#[derive(Clone, Copy, Debug)]
pub enum Weights<'a> {
    F32(&'a [f32]),
    Quant(&'a QuantTensor),
}

/// `y[m, n] = x[m, k] · wᵀ + bias`, dispatched by M.
pub struct Linear {
    device: Arc<Device>,
    format: WeightFormat,
    plan: ShapePlan,
    kernels: [Arc<HostMatmul>; 3],
    /// Weights packed once per distinct tile.
    packed: Vec<HostWeights>,
    /// Which `packed` entry each variant (Gemv, FlatGemm, Gemm) uses.
    packed_of: [usize; 3],
    bias: Vec<f32>,
}

impl std::fmt::Debug for Linear {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Linear")
            .field("format", &self.format)
            .field("plan", &self.plan.to_string())
            .field("packings", &self.packed.len())
            .finish()
    }
}

fn tile_of(t: [u32; 3]) -> HostTile {
    HostTile {
        ep: t[0] as usize,
        hp: t[1] as usize,
        lp: t[2] as usize,
    }
}

impl Linear {
    /// Plan [n, k] on `device`, prepare its kernels (once per device) and
    /// pack `weights` once per distinct tile. `bias` (n values) defaults
    /// to zeros.
    pub fn new(
        device: &Arc<Device>,
        format: WeightFormat,
        weights: Weights<'_>,
        n: usize,
        k: usize,
        bias: Option<&[f32]>,
    ) -> Result<Linear, RuntimeError> {
        let nk = n
            .checked_mul(k)
            .ok_or_else(|| shape("n·k", "no overflow", "overflow"))?;
        let (plan, kernels) = device.plan_shape(format, n, k)?;
        let w_format = kernels[0]
            .kernel()
            .as_matmul()
            .and_then(|m| kernels[0].kernel().tensor(&m.w))
            .map(|t| t.format)
            .ok_or_else(|| shape("kernel", "a matmul", kernels[0].kernel().name.clone()))?;
        // Quantize once; every tile packs the same codes.
        let quantized;
        let source = match weights {
            Weights::F32(v) => {
                check_len("weights elements (n·k)", nk, v.len())?;
                if w_format.is_quantized() {
                    quantized = quant::quantize(w_format, n, k, v)?;
                    WeightsIn::Quant(&quantized)
                } else {
                    WeightsIn::F32(v)
                }
            }
            Weights::Quant(t) => {
                if t.format != w_format || t.rows != n || t.cols != k {
                    return Err(shape(
                        "quantized weights",
                        format!("{w_format} [{n}, {k}]"),
                        format!("{} [{}, {}]", t.format, t.rows, t.cols),
                    ));
                }
                WeightsIn::Quant(t)
            }
        };
        let bias = match bias {
            Some(b) => {
                check_len("bias elements (n)", n, b.len())?;
                b.to_vec()
            }
            None => vec![0.0; n],
        };
        let mut packed: Vec<HostWeights> = Vec::new();
        let mut packed_of = [0usize; 3];
        for variant in Variant::ALL {
            let tile = tile_of(plan.plan(variant).tile);
            let i = match packed.iter().position(|p| p.tile == tile) {
                Some(i) => i,
                None => {
                    packed.push(kernels[variant_index(variant)].pack_weights(n, k, source)?);
                    packed.len() - 1
                }
            };
            packed_of[variant_index(variant)] = i;
        }
        Ok(Linear {
            device: Arc::clone(device),
            format,
            plan,
            kernels,
            packed,
            packed_of,
            bias,
        })
    }

    pub fn format(&self) -> WeightFormat {
        self.format
    }

    pub fn n(&self) -> usize {
        self.plan.n
    }

    pub fn k(&self) -> usize {
        self.plan.k
    }

    /// The dispatch plan (breakpoints, tiles, provenance).
    pub fn plan(&self) -> &ShapePlan {
        &self.plan
    }

    /// How many packed copies of the weights exist (one per distinct tile).
    pub fn packings(&self) -> usize {
        self.packed.len()
    }

    /// The variant `forward` uses for `m` rows.
    pub fn variant_for(&self, m: usize) -> Variant {
        self.plan.variant_for(m)
    }

    /// y[m, n] = x[m, k] · wᵀ + bias for any m (m = 0 does nothing).
    pub fn forward(&self, x: Input<'_>, m: usize, y: Output<'_>) -> Result<(), RuntimeError> {
        let (n, k) = (self.plan.n, self.plan.k);
        let (x_len, x_dtype) = match x {
            HostInput::F32(v) => (v.len(), tessera_dsl::ir::Format::F32),
            HostInput::F16(v) => (v.len(), tessera_dsl::ir::Format::F16),
            HostInput::BF16(v) => (v.len(), tessera_dsl::ir::Format::BF16),
        };
        if x_dtype != self.format.input() {
            return Err(shape(
                format!("x dtype for format {}", self.format),
                self.format.input(),
                x_dtype,
            ));
        }
        let y_dtype = match &y {
            HostOutput::F32(_) => tessera_dsl::ir::Format::F32,
            HostOutput::F16(_) => tessera_dsl::ir::Format::F16,
            HostOutput::BF16(_) => tessera_dsl::ir::Format::BF16,
        };
        if y_dtype != self.format.output() {
            return Err(shape(
                format!("y dtype for format {}", self.format),
                self.format.output(),
                y_dtype,
            ));
        }
        let y_len = match &y {
            HostOutput::F32(v) => v.len(),
            HostOutput::F16(v) => v.len(),
            HostOutput::BF16(v) => v.len(),
        };
        let mk = m
            .checked_mul(k)
            .ok_or_else(|| shape("m·k", "no overflow", "overflow"))?;
        let mn = m
            .checked_mul(n)
            .ok_or_else(|| shape("m·n", "no overflow", "overflow"))?;
        check_len("x elements (m·k)", mk, x_len)?;
        check_len("y elements (m·n)", mn, y_len)?;
        if m == 0 {
            return Ok(());
        }
        let v = variant_index(self.plan.variant_for(m));
        let kernel = &self.kernels[v];
        let weights = &self.packed[self.packed_of[v]];
        let pool = self.device.pool();
        let panels = n.div_ceil(weights.tile.hp.max(1));
        let ranges = split_weighted(panels, &self.plan.core_weights);
        kernel.run_ranges(x, m, weights, Some(&self.bias), y, &ranges, &|call| {
            if ranges.len() == 1 {
                call(0);
            } else {
                pool.run(&|worker| call(worker));
            }
        })?;
        Ok(())
    }

    /// [`Linear::forward`] for f32 activations and output.
    pub fn forward_f32(&self, x: &[f32], m: usize, y: &mut [f32]) -> Result<(), RuntimeError> {
        self.forward(HostInput::F32(x), m, HostOutput::F32(y))
    }
}
