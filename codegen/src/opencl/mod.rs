//! The OpenCL C backend: GEMV, flat GEMM and GEMM for the A16
//! weight formats, and split-K decode attention, for mobile GPUs.
//!
//! ```text
//!   Kernel + TileConfig ──► gpu::plan_matmul / plan_attention (decisions, shared with PTX)
//!                       ──► opencl::{matmul, attention}::print (via the Dialect table)
//!                       ──► Artifact::Source { OpenClC, text }
//! ```
//!
//! Every emitted program starts with a comment naming the kernel, the
//! variant, the precision mode, the plan (work-group shape, tiles) and the
//! argument order: the contract with the host (`tessera_runtime::opencl`).

pub mod attention;
pub mod dialect;
pub mod matmul;

use std::fmt::Write as _;

use tessera_dsl::Kernel;

pub use dialect::{Dialect, Fp16Mode, OPENCL, Precision, Writer};

use crate::artifact::{Artifact, Backend, EmitError, SourceLang, Variant};
use crate::gpu::{
    self, AttentionPlan, KernelArg, MatmulPlan, MatmulShape, PrefillPlan, WeightMemory,
};
use crate::target::TargetCaps;
use crate::tile::TileConfig;

/// The OpenCL C backend. `fp16` is picked by the host from the device
/// ([`Fp16Mode::for_extensions`]); `weights` chooses buffer or image
/// weights for the GEMV.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpenClBackend {
    pub fp16: Fp16Mode,
    pub weights: WeightMemory,
}

/// The target description this backend's plans are made against.
pub fn caps() -> &'static TargetCaps {
    TargetCaps::all()
        .iter()
        .find(|t| t.name == "opencl-gpu")
        .expect("the opencl-gpu target is in the target table")
}

/// A program for one kernel instance: its source and the plan the host
/// needs to bind and launch it.
#[derive(Clone, Debug, PartialEq)]
pub enum Program {
    Matmul { plan: MatmulPlan, source: String },
    Attention { plan: AttentionPlan, source: String },
    Prefill { plan: PrefillPlan, source: String },
}

impl Program {
    pub fn source(&self) -> &str {
        match self {
            Program::Matmul { source, .. }
            | Program::Attention { source, .. }
            | Program::Prefill { source, .. } => source,
        }
    }
}

fn args_line(args: &[KernelArg]) -> String {
    args.iter().map(|a| a.name).collect::<Vec<_>>().join(", ")
}

impl OpenClBackend {
    pub fn new(fp16: Fp16Mode) -> OpenClBackend {
        OpenClBackend {
            fp16,
            weights: WeightMemory::Buffer,
        }
    }

    /// The same backend reading GEMV weights from an image.
    pub fn with_weights(self, weights: WeightMemory) -> OpenClBackend {
        OpenClBackend { weights, ..self }
    }

    /// Plan and print one instance. Attention kernels ignore `tile` and
    /// `variant` (see [`Self::attention_program`]).
    pub fn program(
        &self,
        kernel: &Kernel,
        tile: &TileConfig,
        variant: Variant,
    ) -> Result<Program, EmitError> {
        if kernel.as_attention().is_some() {
            return self.attention_program(kernel);
        }
        let pr = Precision::new(self.fp16);
        let plan = gpu::plan_matmul(kernel, tile, variant, caps(), self.weights)?;
        let mut h = String::new();
        let _ = writeln!(
            h,
            "{}: {} ({:?} weights), OpenCL C, fp16 {}",
            kernel.name, variant, plan.memory, self.fp16
        );
        let _ = writeln!(h, "solver tile: {}", tile.summary());
        match plan.shape {
            MatmulShape::Gemv(g) => {
                let _ = writeln!(
                    h,
                    "gemv: work group {} h x {} lanes of l, lanes reduced in local memory",
                    g.wg_h, g.k_lanes
                );
            }
            MatmulShape::Tiled(t) => {
                let _ = writeln!(
                    h,
                    "tiled: {}x{} work items of {}x{} (ep x hp), block {}x{}, K slice {} x {} stages, {} bytes local",
                    t.units_e,
                    t.units_h,
                    t.ep,
                    t.hp,
                    t.tile_e,
                    t.tile_h,
                    t.k_slice,
                    t.stages,
                    t.local_bytes
                );
            }
        }
        let wt = &plan.weights;
        let _ = writeln!(
            h,
            "weights {} in [l/{lp}, h, {lp}] ({} codes per 128-bit load), params [groups, h]",
            wt.format,
            wt.elems_per_load,
            lp = wt.lp
        );
        let _ = write!(h, "{}({})", plan.entry, args_line(&plan.args));
        let source = matmul::print(&plan, &OPENCL, &pr, &h);
        Ok(Program::Matmul { plan, source })
    }

    /// Plan and print a decode attention kernel (no tile: the plan comes
    /// from the target, see [`gpu::plan_attention`]).
    /// The causal prefill program of `kernel` for head dim `d` (the head
    /// dim is a constant of the program, so a row's q and accumulators can
    /// live in registers).
    pub fn prefill_program(&self, kernel: &Kernel, d: usize) -> Result<Program, EmitError> {
        let pr = Precision::new(self.fp16);
        let plan = gpu::plan_prefill_attention(kernel, caps(), d)?;
        let mut h = String::new();
        let _ = writeln!(
            h,
            "{}: causal prefill attention, head dim {}, OpenCL C, fp16 {}",
            kernel.name, plan.d, self.fp16
        );
        let _ = writeln!(
            h,
            "flash: {} query rows per work group (one per work item), {} keys per local block, online softmax",
            plan.rows, plan.keys
        );
        let _ = writeln!(
            h,
            "K {:?}, V {:?}, q prescaled: {}",
            plan.k, plan.v, plan.q_prescaled
        );
        let _ = write!(h, "{}({})", plan.entry, args_line(&plan.args));
        let source = attention::print_prefill(&plan, &OPENCL, &pr, &h);
        Ok(Program::Prefill { plan, source })
    }

    pub fn attention_program(&self, kernel: &Kernel) -> Result<Program, EmitError> {
        let pr = Precision::new(self.fp16);
        let plan = gpu::plan_attention(kernel, caps())?;
        if plan.combine_launch[2].local != 1 {
            return Err(EmitError::Unsupported {
                backend: "opencl",
                what: format!(
                    "combine_launch z block of {} (the OpenCL combine is one work item per element)",
                    plan.combine_launch[2].local
                ),
            });
        }
        let mut h = String::new();
        let _ = writeln!(
            h,
            "{}: decode attention, OpenCL C, fp16 {}",
            kernel.name, self.fp16
        );
        let _ = writeln!(
            h,
            "split-K: {} keys per split, work group {}, unified max phi {} with range [{}, {}]",
            plan.keys_per_split, plan.wg, plan.phi, plan.lo, plan.hi
        );
        let _ = writeln!(
            h,
            "K {:?}, V {:?}, q prescaled: {}",
            plan.k, plan.v, plan.q_prescaled
        );
        let _ = writeln!(
            h,
            "{}({})",
            plan.partial_entry,
            args_line(&plan.partial_args)
        );
        let _ = write!(
            h,
            "{}({})",
            plan.combine_entry,
            args_line(&plan.combine_args)
        );
        let source = attention::print(&plan, &OPENCL, &pr, &h);
        Ok(Program::Attention { plan, source })
    }
}

impl Backend for OpenClBackend {
    fn name(&self) -> &'static str {
        "opencl"
    }

    /// The GEMM variant (or decode attention).
    fn emit(&self, kernel: &Kernel, tile: &TileConfig) -> Result<Artifact, EmitError> {
        self.emit_variant(kernel, tile, Variant::Gemm)
    }

    fn emit_variant(
        &self,
        kernel: &Kernel,
        tile: &TileConfig,
        variant: Variant,
    ) -> Result<Artifact, EmitError> {
        let program = self.program(kernel, tile, variant)?;
        Ok(Artifact::Source {
            lang: SourceLang::OpenClC,
            text: program.source().to_string(),
        })
    }
}
