//! The PTX backend: GEMV on CUDA cores, flat GEMM and GEMM on
//! tensor cores (`mma.sync.aligned.m16n8k16`, `ldmatrix`, `cp.async`),
//! split-K decode attention, and causal prefill attention on tensor cores
//! ([`prefill`]), for `sm_80` and `sm_90`.
//!
//! ```text
//!   Kernel + TileConfig ──► gpu::plan_matmul (decisions, shared with OpenCL)
//!                       ──► ptx::{gemv, mma}::print ──► Artifact::Source { Ptx, text }
//!   Kernel              ──► gpu::plan_attention ──► ptx::attention::print (two entries)
//!   Kernel, head dim    ──► gpu::plan_prefill_attention ──► ptx::prefill::print
//! ```
//!
//! Every decision (argument order, launch geometry, work-item mapping of
//! the GEMV, block tile, K slice and stages of the tiled kernels, the
//! dequantization constants) comes from [`crate::gpu`]; the OpenCL backend
//! prints the same plans and runs on PoCL, which is what checks the index
//! math here without a GPU. What differs is only how PTX says it: warp
//! shuffles for the lane reduction, `mma` fragments instead of per-thread
//! tiles, `cp.async` instead of loads through registers.
//!
//! A program's header comment names the kernel, the plan and the argument
//! order (the host contract, `tessera_runtime::cuda`). Matmul arguments are
//! the plan's: pointers as `.u64`, ints as `.u32`, in [`MatmulPlan::args`]
//! order; the launch is the plan's [`gpu::LaunchDim`]s (CUDA grid = global /
//! local per dimension, block = local). Decode attention is one module with
//! two entries, bound the same way from [`AttentionPlan::partial_args`] and
//! [`AttentionPlan::combine_args`] and launched partial first; its shared
//! memory is static. Its index math is also checked by executing the PTX in
//! a small simulator in the tests (`codegen/tests/ptx_sim`).

pub mod attention;
pub mod gemv;
pub mod mma;
pub mod prefill;
pub mod writer;

use std::fmt::Write as _;

use tessera_dsl::Kernel;

use crate::artifact::{Artifact, Backend, EmitError, SourceLang, Variant};
use crate::gpu::{
    self, ArgKind, AttentionPlan, KernelArg, LaunchDim, LaunchExtent, MatmulPlan, MatmulShape,
    PrefillPlan, WeightMemory,
};
use crate::target::TargetCaps;
use crate::tile::TileConfig;
use writer::Body;

/// The streaming-multiprocessor generation a program targets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Sm {
    /// Ampere (A100): `mma.sync`, `ldmatrix`, `cp.async`.
    Sm80,
    /// Hopper (H100): the same instructions (no `wgmma` yet).
    Sm90,
}

impl Sm {
    pub const ALL: [Sm; 2] = [Sm::Sm80, Sm::Sm90];

    /// The target name (`ptx-sm80`).
    pub fn target_name(self) -> &'static str {
        match self {
            Sm::Sm80 => "ptx-sm80",
            Sm::Sm90 => "ptx-sm90",
        }
    }

    /// `sm_80` / `sm_90`, as `.target` and `ptxas -arch` take it.
    pub fn arch(self) -> &'static str {
        match self {
            Sm::Sm80 => "sm_80",
            Sm::Sm90 => "sm_90",
        }
    }

    /// The oldest PTX ISA that has the target and every instruction used
    /// (7.0: sm_80, mma m16n8k16, cp.async; 7.8: sm_90).
    pub fn isa_version(self) -> &'static str {
        match self {
            Sm::Sm80 => "7.0",
            Sm::Sm90 => "7.8",
        }
    }

    /// The target description plans are made against.
    pub fn caps(self) -> &'static TargetCaps {
        TargetCaps::by_name(self.target_name()).expect("the ptx targets are in the target table")
    }
}

/// The PTX backend for one SM generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PtxBackend {
    pub sm: Sm,
}

/// A matmul program: its text and what the host needs to launch it.
#[derive(Clone, Debug, PartialEq)]
pub struct PtxProgram {
    pub plan: MatmulPlan,
    /// Dynamic shared memory bytes the launch must provide (0 for the GEMV,
    /// whose reduction buffer is static).
    pub dynamic_shared_bytes: u32,
    pub text: String,
}

/// A causal prefill program for one head dim: one entry, launched by its
/// plan's [`gpu::LaunchDim`]s with `dynamic_shared_bytes` of dynamic
/// shared memory.
#[derive(Clone, Debug, PartialEq)]
pub struct PtxPrefillProgram {
    pub plan: PrefillPlan,
    pub dynamic_shared_bytes: u32,
    pub text: String,
}

/// A decode attention program: one module with the partial and combine
/// entries, and the plan the host binds and launches them by (the same
/// [`AttentionPlan`] the OpenCL backend prints).
#[derive(Clone, Debug, PartialEq)]
pub struct PtxAttentionProgram {
    pub plan: AttentionPlan,
    pub text: String,
}

impl PtxBackend {
    pub fn new(sm: Sm) -> PtxBackend {
        PtxBackend { sm }
    }

    /// Plan and print one matmul instance (attention kernels: see
    /// [`Self::attention_program`]).
    pub fn program(
        &self,
        kernel: &Kernel,
        tile: &TileConfig,
        variant: Variant,
    ) -> Result<PtxProgram, EmitError> {
        if kernel.as_attention().is_some() {
            return Err(EmitError::Unsupported {
                backend: self.name(),
                what: format!(
                    "`{}` is attention: use attention_program (no tile, no variant)",
                    kernel.name
                ),
            });
        }
        let plan = gpu::plan_matmul(kernel, tile, variant, self.sm.caps(), WeightMemory::Buffer)?;
        let mut h = String::new();
        let _ = writeln!(
            h,
            "{}: {} for {}, PTX ISA {}",
            kernel.name,
            variant,
            self.sm.arch(),
            self.sm.isa_version()
        );
        let _ = writeln!(h, "solver tile: {}", tile.summary());
        match plan.shape {
            MatmulShape::Gemv(g) => {
                let _ = writeln!(
                    h,
                    "gemv: block {} h x {} lanes of l, {} channels x {} rows of e per thread; lanes reduced by shfl.sync within a warp, then in shared memory",
                    g.wg_h, g.k_lanes, g.channels, g.rows
                );
            }
            MatmulShape::Tiled(t) => {
                let _ = writeln!(
                    h,
                    "mma: {}x{} warps of {}x{} (e x h) warp tiles, block {}x{}, K slice {} x {} cp.async stages",
                    t.units_e, t.units_h, t.ep, t.hp, t.tile_e, t.tile_h, t.k_slice, t.stages
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
        let (text, dynamic_shared_bytes) = match plan.shape {
            MatmulShape::Gemv(g) => (gemv::print(&plan, &g, self.sm, &h), 0),
            MatmulShape::Tiled(t) => mma::print(&plan, &t, self.sm, &h, tile)?,
        };
        Ok(PtxProgram {
            plan,
            dynamic_shared_bytes,
            text,
        })
    }
}

impl PtxBackend {
    /// Plan and print a decode attention kernel: the plan comes from the
    /// target alone ([`gpu::plan_attention`]), as on OpenCL.
    pub fn attention_program(&self, kernel: &Kernel) -> Result<PtxAttentionProgram, EmitError> {
        let plan = gpu::plan_attention(kernel, self.sm.caps())?;
        let mut h = String::new();
        let _ = writeln!(
            h,
            "{}: decode attention for {}, PTX ISA {}",
            kernel.name,
            self.sm.arch(),
            self.sm.isa_version()
        );
        let _ = writeln!(
            h,
            "split-K: {} keys per split, block {}, unified max phi {} with range [{}, {}]",
            plan.keys_per_split, plan.wg, plan.phi, plan.lo, plan.hi
        );
        let _ = writeln!(
            h,
            "K {:?}, V {:?}, q prescaled: {}, registers <= {}",
            plan.k,
            plan.v,
            plan.q_prescaled,
            attention::register_budget(self.sm)
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
        let text = attention::print(&plan, self.sm, &h)?;
        Ok(PtxAttentionProgram { plan, text })
    }
}

impl PtxBackend {
    /// Plan and print the causal prefill kernel of `kernel` for head dim
    /// `d` on tensor cores ([`prefill`]): the shared plan's arguments and
    /// formats, with the block of 64 query rows and the key block the
    /// tensor-core loop takes.
    pub fn prefill_program(
        &self,
        kernel: &Kernel,
        d: usize,
    ) -> Result<PtxPrefillProgram, EmitError> {
        self.prefill_program_at(kernel, d, None)
    }

    /// [`Self::prefill_program`] under another block plan, for measuring
    /// one against another.
    pub fn prefill_program_at(
        &self,
        kernel: &Kernel,
        d: usize,
        blocks: Option<prefill::BlockPlan>,
    ) -> Result<PtxPrefillProgram, EmitError> {
        let mut plan = gpu::plan_prefill_attention(kernel, self.sm.caps(), d)?;
        let lay = match blocks {
            None => prefill::PrefillLayout::new(plan.d, plan.k, plan.v, self.sm)?,
            Some(blocks) => prefill::PrefillLayout::with(plan.d, plan.k, plan.v, self.sm, blocks)?,
        };
        plan.rows = lay.rows();
        plan.keys = lay.keys;
        plan.launch[0] = LaunchDim {
            extent: LaunchExtent::PrefillRows,
            per_group: lay.rows(),
            local: lay.threads(),
        };
        let mut h = String::new();
        let _ = writeln!(
            h,
            "{}: causal prefill attention, head dim {}, for {}, PTX ISA {}",
            kernel.name,
            plan.d,
            self.sm.arch(),
            self.sm.isa_version()
        );
        let _ = writeln!(
            h,
            "flash on mma.sync m16n8k16: {} query rows per block (16 per warp), {} keys per block, \
             Q in {}, online softmax in f32",
            plan.rows,
            plan.keys,
            if lay.q_in_registers {
                "registers"
            } else {
                "shared memory"
            }
        );
        let _ = writeln!(
            h,
            "K {:?}, V {:?}, q prescaled: {}, registers <= {}",
            plan.k,
            plan.v,
            plan.q_prescaled,
            prefill::max_registers(self.sm)
        );
        let _ = write!(h, "{}({})", plan.entry, args_line(&plan.args));
        let (text, dynamic_shared_bytes) = prefill::print(&plan, &lay, self.sm, &h)?;
        Ok(PtxPrefillProgram {
            plan,
            dynamic_shared_bytes,
            text,
        })
    }
}

impl Backend for PtxBackend {
    fn name(&self) -> &'static str {
        self.sm.target_name()
    }

    /// The GEMM variant (or decode attention).
    fn emit(&self, kernel: &Kernel, tile: &TileConfig) -> Result<Artifact, EmitError> {
        self.emit_variant(kernel, tile, Variant::Gemm)
    }

    /// Attention kernels ignore `tile` and `variant`.
    fn emit_variant(
        &self,
        kernel: &Kernel,
        tile: &TileConfig,
        variant: Variant,
    ) -> Result<Artifact, EmitError> {
        if kernel.as_attention().is_some() {
            return Ok(Artifact::Source {
                lang: SourceLang::Ptx,
                text: self.attention_program(kernel)?.text,
            });
        }
        let program = self.program(kernel, tile, variant)?;
        Ok(Artifact::Source {
            lang: SourceLang::Ptx,
            text: program.text,
        })
    }
}

fn args_line(args: &[KernelArg]) -> String {
    args.iter().map(|a| a.name).collect::<Vec<_>>().join(", ")
}

/// The parameter name of `arg` in `entry`.
pub fn param_name(entry: &str, arg: &KernelArg) -> String {
    format!("{entry}_param_{}", arg.name)
}

/// The PTX type of a parameter: pointers are 64-bit, ints 32-bit.
pub fn param_type(kind: ArgKind) -> &'static str {
    match kind {
        ArgKind::Int => ".u32",
        _ => ".u64",
    }
}

/// The arguments loaded into registers: global pointers (converted with
/// `cvta.to.global`) and ints, by name.
pub struct Args {
    regs: Vec<(&'static str, String)>,
}

impl Args {
    pub fn load(b: &mut Body, entry: &str, args: &[KernelArg]) -> Args {
        let mut regs = Vec::new();
        for a in args {
            let p = param_name(entry, a);
            if a.kind == ArgKind::Int {
                let r = b.r();
                b.op(format!("ld.param.u32 {r}, [{p}]"));
                regs.push((a.name, r));
            } else {
                let raw = b.rd();
                let g = b.rd();
                b.op(format!("ld.param.u64 {raw}, [{p}]"));
                b.op(format!("cvta.to.global.u64 {g}, {raw}"));
                regs.push((a.name, g));
            }
        }
        Args { regs }
    }

    /// The register holding argument `name` (the plan always has it when a
    /// printer asks: printers follow the same plan).
    pub fn get(&self, name: &str) -> &str {
        self.regs
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, r)| r.as_str())
            .unwrap_or_else(|| panic!("plan has no argument `{name}`"))
    }
}

/// An entry's launch contract with ptxas: the exact block shape, and the
/// register limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub reqntid: [u32; 3],
    pub maxnreg: u32,
}

/// The module text: header comment, `.version`/`.target`, then one entry
/// under `limits`.
pub fn module(
    sm: Sm,
    header: &str,
    entry: &str,
    args: &[KernelArg],
    limits: Limits,
    decls: &[String],
    body: Body,
) -> String {
    let mut s = preamble(sm, header, decls);
    s.push_str(&entry_text(entry, args, limits, body));
    s
}

/// Header comment, `.version`/`.target`/`.address_size`, then the
/// module-scope declarations (shared arrays) of every entry that follows.
pub fn preamble(sm: Sm, header: &str, decls: &[String]) -> String {
    let mut s = String::new();
    for line in header.lines() {
        let _ = writeln!(s, "// {line}");
    }
    let _ = writeln!(s);
    let _ = writeln!(s, ".version {}", sm.isa_version());
    let _ = writeln!(s, ".target {}", sm.arch());
    let _ = writeln!(s, ".address_size 64");
    let _ = writeln!(s);
    for d in decls {
        let _ = writeln!(s, "{d}");
    }
    if !decls.is_empty() {
        let _ = writeln!(s);
    }
    s
}

/// One `.visible .entry`: parameters in `args` order, the launch contract,
/// the body.
pub fn entry_text(entry: &str, args: &[KernelArg], limits: Limits, body: Body) -> String {
    let mut s = String::new();
    let _ = writeln!(s, ".visible .entry {entry}(");
    let params: Vec<String> = args
        .iter()
        .map(|a| format!("\t.param {} {}", param_type(a.kind), param_name(entry, a)))
        .collect();
    let _ = writeln!(s, "{}", params.join(",\n"));
    let _ = writeln!(s, ")");
    let [x, y, z] = limits.reqntid;
    let _ = writeln!(s, ".reqntid {x}, {y}, {z}");
    // The solver's budget as ptxas's limit: without it ptxas trades
    // registers for occupancy on its own (64 at 256 threads) and spills.
    let _ = writeln!(s, ".maxnreg {}", limits.maxnreg);
    let _ = writeln!(s, "{{");
    s.push_str(&body.finish());
    let _ = writeln!(s, "}}");
    s
}
