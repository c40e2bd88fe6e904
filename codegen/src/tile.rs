//! The register-constraint tile solver (MNN-LLM formulas (2)-(4)).
//!
//! For `y[e, h] = x[e, l] · w[h, l]ᵀ` tiled `ep × hp` with reduction step
//! `lp`, the memory traffic is
//!
//! ```text
//!   cost(ep, hp) = ceil(e/ep) · ceil(h/hp) · (l·ep + l·hp + ep·hp)      (2)
//! ```
//!
//! (ceil: a tail costs a whole tile), minimised over tiles whose registers
//! fit the budget R (3), with `lp` the MAC instruction's reduction width
//! (4). Registers are counted whole, per [`crate::target`]'s module doc:
//!
//! ```text
//!   accumulators (ep/ae)·(hp/ah)·acc_regs + A ceil(ep/a_rows)·a_regs
//!     + B ceil(hp/b_cols)·b_regs + dequant + reserved  ≤  R
//! ```
//!
//! `group_sums` ([`MacInstr::group_sums`]) is one register per accumulator
//! for the current group's integer sums, for an emitter that keeps them
//! beside f32 accumulators; that loop broadcasts one A row at a time, so A
//! counts one register. No built-in target counts it now: ARM and x86 fold
//! the group sums into f32 totals through memory (Table 2 stays exact).
//!
//! `partial_sums` ([`MacInstr::gemv_partial_sums`]) is one register per
//! accumulator for a grouped int8 GEMV (e = 1) whose emitter keeps the f32
//! partial sums in registers (NEON `sdot`): each group end then costs a
//! convert and an FMA per accumulator, no stack round trip, and the GEMV
//! tile narrows to what fits (1×32 instead of 1×48 on NEON). A grouped
//! GEMM (e above the flat-GEMM rows) counts them by
//! [`MacInstr::gemm_partial_sums`] (NEON `smmla`: 10×4×8 instead of
//! 10×8×8; `sdot`: 12×4×4 instead of 12×8×4, its 4-bit weights in 16-code
//! blocks that pair two lp-steps per load, [`MacInstr::paired_nibble_steps`],
//! with two B registers).
//!
//! `dequant` is `2·(hp/ah)·acc_regs` (a scale and an offset vector for the
//! hp columns of the current group) when quantized weights meet a float MAC
//! and are dequantized in the loop; the int8 path applies scales in the
//! epilogue, where the A and B registers are free. Weights are the
//! streamed operand, so among equal costs the larger ep wins (more reuse of
//! each weight load), then the larger hp.
//!
//! # Table 2, from the descriptions alone
//!
//! Both ARM rows have 32 registers, 2 reserved (int4 nibble mask, packed
//! staging), so 30 for the tile; e = h = l = 4096 (see [`REPRESENTATIVE_EXTENT`]).
//!
//! - `sdot` (1×4, lp 4, 4 rows or 4 columns per register): 12×8 needs
//!   24 + 3 + 2 = 29. 13×8 would need 26 + 4 + 2 = 32; 8×12 (24 + 2 + 3)
//!   costs the same as 12×8 and loses the tie to the larger ep. → 12/8/4.
//! - `smmla` (2×2, lp 8, 2 rows or columns per register): with x = ep/2,
//!   y = hp/2 the count is xy + x + y, MNN's own (3) in register units;
//!   10×8 needs 20 + 5 + 4 = 29, 12×8 needs 34, 8×10 ties and loses. → 10/8/8.
//!
//! Table 2 counts the int8 tile alone (weights scaled per row). With
//! weights in groups, `smmla`'s GEMM adds a partial-sum register per
//! accumulator, `xy·2 + x + y ≤ 30`: 6×6 (9·2 + 3 + 3 = 24) is cheapest
//! but holds 48 codes a step, not whole 32-code runs of pair-transposed
//! 4-bit weights (`nibble_runs`), so 4-bit formats get 10×4 (10·2 + 5 + 2
//! = 27) and Q8_0 6×6. `sdot`'s grouped GEMM, `2·ep·hp/4 + ep/4 + B ≤
//! 30`, with 4-bit B weighted 2 ([`b_load_weight`]): 12×4 (24 + 3 + 2, two
//! B registers for one load of two steps) where unweighted (2) takes 6×8;
//! Q8_0 (8-bit B, weight 1) 6×8.
//!
//! # x86, derived the same way (and why it differs from MNN's Table 2)
//!
//! x86 has no multiply-by-element, so each A row is broadcast into a whole
//! register. The x86-avx2 loops (f32 and int8) broadcast each row into
//! one register that its MACs consume at once (renaming makes the rows
//! independent), so A counts 1 whatever ep.
//!
//! - `x86-avx2`, f32 via `vfmadd231ps` (1×8, lp 1): 16 ymm, nothing
//!   reserved (the epilogue's mask and bias temporary reuse A and B):
//!   `ep·hb + 1 + hb ≤ 16`. Past the flat-GEMM rows every A element is a
//!   broadcast load competing with the FMAs, so the cost counts it 8×
//!   ([`a_load_weight`]): per FMA `8/hp + 1/ep`. 4×24 (12 + 1 + 3 = 16)
//!   gives 0.58, 6×16 (12 + 1 + 2) 0.67, 14×8 (the unweighted optimum,
//!   14 + 1 + 1) 1.07. → **4/24/1**. Flat GEMM (M ≤ 16, weight 1, every
//!   row in one block where it fits): 2×40 at M = 2, 4×24 at M = 4, 8×8 at
//!   M = 8. (Before, ep A registers and the int4 unpack's 2 reserved ones
//!   capped f32 at 6×8.)
//! - `x86-avx2`, int8 via `vpmaddubsw`+`vpmaddwd` (1×8, lp 4): 16 ymm − 2
//!   (unpack) − 2 (int16 temp, ones vector) = 12: `ep·hb + 1 + hb ≤ 12`.
//!   10×8 needs 10 + 1 + 1 = 12; 4×16 needs 8 + 1 + 2 = 11 but costs more.
//!   → **10/8/4**. Flat GEMM: 2×24 at M = 2, 4×16 at M = 4, 6×8 at M = 6,
//!   8×8 at M = 8 (every row in one block, each weight byte read once);
//!   GEMV 1×40. With grouped weights (W4A8 g32) the registers hold the
//!   group's integer sums and the f32 totals live in the stack frame (one
//!   load/FMA/FMA/store per row and column block at a group end), so the
//!   tiles are the same. (Before, one A register per row and W4A8's f32
//!   accumulators beside its group sums capped both formats at 5×8, which
//!   took two row blocks, and two passes over the weights, at M = 6–8.)
//!   MNN-LLM lists 4/8/4, a tile of 4 + 4 + 1 = 9 ymm that leaves 7 for
//!   temporaries (one int16 temp per row, we read it).
//! - `x86-avx512`, f32 via `vfmadd231ps zmm` (1×16, lp 1; `x86::avx512`):
//!   counted as the avx2 f32 class, one renamed A register, nothing
//!   reserved: `ep·hb + 1 + hb ≤ 32`, A weighted 8 (see [`a_load_weight`]),
//!   per FMA `8/hp + 1/ep`: 9×48 (27 + 1 + 3 = 31) gives 0.28, 5×80 0.30,
//!   6×64 0.29, 14×32 0.32. → **9/48/1**. Flat GEMM at M = 8: 8×48.
//!   The emitter holds at most 14 row pointers, so tiles with ep > 14 (hp
//!   16, offered only for M > 14 without the A weight) are refused by name.
//! - `x86-avx512`, `vpdpbusd` (1×16, lp 4; `x86::avx512_int8`): the
//!   rows' codes come by `{1to16}` broadcast, the unpack's mask from
//!   memory, so nothing is reserved; W4A8 adds one i32 group-sum register
//!   per accumulator and A is the group tail's Σq register:
//!   `2·ep·hb + 1 + hb ≤ 32`. 15×16 needs 30 + 1 + 1 = 32; 7×32 needs
//!   28 + 1 + 2 = 31 but costs more. → **15/16/4**. MNN-LLM lists 4/64/4
//!   (16 accumulators + 4 broadcasts + 4 B = 24 registers): a wide-h
//!   kernel that suits its [h/hp] packing and GEMV, but under formula (2)
//!   with all 32 registers it moves more data for GEMM than 15×16.
//!
//! # GPUs
//!
//! The same solver runs per thread (OpenCL work-item) or per warp (PTX
//! `mma`, counted in per-thread fragment registers) against the per-thread
//! budget of 32-bit registers. Each tile is then given a block tile
//! ([`BlockTile`]): `units_e × units_h` threads (or warps) each computing
//! the solved tile, at least one warp/sub-group and at most
//! `max_threads_per_block`, whose `stages` K slices of `k_slice` elements of
//! both operands fit shared (local) memory; among those, the one with the
//! least formula-(2) traffic at block level (ties: more units along h,
//! where the weights stream). A thread tile no block can hold is dropped.
//!
//! # Dyn extents
//!
//! A `Dyn` axis is sized [`REPRESENTATIVE_EXTENT`] (a GEMM-sized e, so the
//! kernel's tile is the prefill tile); the autotuner builds [`Problem`]s
//! with the real M to get the GEMV and flat-GEMM tiles.

use std::cmp::Reverse;
use std::fmt::Write as _;

use serde::Serialize;
use tessera_dsl::{Extent, Kernel};

use crate::target::{Arch, ClassError, MacClass, MacInstr, TargetCaps, mac_class};

/// The size a `Dyn` axis takes when the solver has no real value.
pub const REPRESENTATIVE_EXTENT: u64 = 4096;

/// One matmul to tile: extents and the MAC class it runs in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Problem {
    /// Rows of x (tokens, M).
    pub e: u64,
    /// Output channels (N).
    pub h: u64,
    /// Reduction (K).
    pub l: u64,
    pub class: MacClass,
    /// Quantized weights dequantized in the loop for a float MAC (W4A16):
    /// costs scale and offset registers.
    pub weight_dequant: bool,
    /// Weights quantized in groups along l (`u4asym:g32`, not `:row`): an
    /// int8 MAC with [`MacInstr::group_sums`] keeps per-group sums in
    /// registers.
    pub weight_groups: bool,
    /// 4-bit weights pair-transposed (32 codes per 16 bytes): a tile's
    /// hp·lp must hold whole 32-code runs, or its weights cannot be packed.
    pub nibble_runs: bool,
}

impl Problem {
    pub fn new(e: u64, h: u64, l: u64, class: MacClass) -> Problem {
        Problem {
            e,
            h,
            l,
            class,
            weight_dequant: false,
            weight_groups: false,
            nibble_runs: false,
        }
    }

    /// The problem a matmul kernel poses on `caps`: its class from the
    /// formats ([`mac_class`]), fixed extents as given, `Dyn` ones
    /// [`REPRESENTATIVE_EXTENT`].
    pub fn from_kernel(caps: &TargetCaps, kernel: &Kernel) -> Result<Problem, SolveError> {
        let class = mac_class(caps, kernel)?;
        let mm = kernel.as_matmul().ok_or_else(|| ClassError::NotMatmul {
            kernel: kernel.name.clone(),
        })?;
        let extent = |axis: &str| -> Result<u64, SolveError> {
            match kernel.axis(axis).map(|a| a.extent) {
                Some(Extent::Fixed(n)) => Ok(u64::from(n)),
                Some(Extent::Dyn) => Ok(REPRESENTATIVE_EXTENT),
                None => Err(SolveError::MissingAxis {
                    kernel: kernel.name.clone(),
                    axis: axis.to_string(),
                }),
            }
        };
        let weight_dequant = class != MacClass::Int8
            && kernel
                .tensor(&mm.w)
                .is_some_and(|t| t.format.is_quantized());
        let weight_groups = kernel
            .tensor(&mm.w)
            .is_some_and(|t| matches!(t.format.group(), Some(tessera_dsl::ir::Group::Size(_))));
        let nibble_runs = kernel
            .tensor(&mm.w)
            .is_some_and(|t| t.layout.int4_pair_transpose);
        Ok(Problem {
            e: extent(&mm.e)?,
            h: extent(&mm.h)?,
            l: extent(&mm.l)?,
            class,
            weight_dequant,
            weight_groups,
            nibble_runs,
        })
    }
}

/// Where a tile's registers go.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct RegisterAccounting {
    pub accumulators: u32,
    /// A (activation) registers for one lp-slice of the ep rows.
    pub a_regs: u32,
    /// B (weight) registers for one lp-slice of the hp columns.
    pub b_regs: u32,
    /// In-loop dequantization scale and offset registers.
    pub dequant: u32,
    /// Per-group integer sums of grouped int8 weights (x86; 0 elsewhere).
    pub group_sums: u32,
    /// f32 partial sums of a grouped int8 GEMV or GEMM kept in registers
    /// ([`MacInstr::gemv_partial_sums`], [`MacInstr::gemm_partial_sums`];
    /// 0 for flat-GEMM problems and ungrouped weights).
    pub partial_sums: u32,
    /// Target and instruction reservations.
    pub reserved: u32,
    pub total: u32,
    /// R: the target's register budget.
    pub budget: u32,
}

/// A GPU block (work-group) tile built from the solved per-thread tile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct BlockTile {
    /// Threads (OpenCL) or warps (PTX mma) along e.
    pub units_e: u32,
    /// Threads or warps along h.
    pub units_h: u32,
    pub threads: u32,
    /// Block tile rows of e: `units_e · ep`.
    pub tile_e: u32,
    /// Block tile columns of h: `units_h · hp`.
    pub tile_h: u32,
    pub k_slice: u32,
    /// Shared memory for `stages` K slices of both operands.
    pub shared_bytes: u32,
    pub shared_budget: u32,
}

/// A feasible tile with its accounting and formula-(2) cost.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct TileConfig {
    pub ep: u32,
    pub hp: u32,
    pub lp: u32,
    pub accounting: RegisterAccounting,
    /// Formula (2), exact for costs below 2^53.
    pub cost: f64,
    /// GPU targets only.
    pub block: Option<BlockTile>,
    #[serde(skip)]
    exact_cost: u128,
}

impl TileConfig {
    /// The cost as an exact integer (what ranking uses).
    pub fn exact_cost(&self) -> u128 {
        self.exact_cost
    }

    /// `ep=E hp=H lp=L` then the accounting, on one line.
    pub fn summary(&self) -> String {
        let a = &self.accounting;
        let mut s = format!(
            "ep={} hp={} lp={} acc={} a={} b={} dequant={} reserved={} total={}/{}",
            self.ep,
            self.hp,
            self.lp,
            a.accumulators,
            a.a_regs,
            a.b_regs,
            a.dequant,
            a.reserved,
            a.total,
            a.budget
        );
        if a.group_sums > 0 {
            let _ = write!(s, " group_sums={}", a.group_sums);
        }
        if a.partial_sums > 0 {
            let _ = write!(s, " partial_sums={}", a.partial_sums);
        }
        if let Some(b) = &self.block {
            let _ = write!(
                s,
                " block={}x{} threads={} shared={}/{}",
                b.tile_e, b.tile_h, b.threads, b.shared_bytes, b.shared_budget
            );
        }
        s
    }
}

/// Why no tile can be produced.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SolveError {
    #[error(transparent)]
    Class(#[from] ClassError),
    #[error("kernel `{kernel}` has no axis `{axis}`")]
    MissingAxis { kernel: String, axis: String },
    #[error("target {target} has no {class} MAC instruction")]
    NoInstruction {
        target: &'static str,
        class: MacClass,
    },
    #[error("problem extent {axis} is 0; every extent must be at least 1")]
    ZeroExtent { axis: &'static str },
    #[error(
        "target {target}: no tile fits the budget of {budget} registers; the smallest {instr} tile \
         ({ae}x{ah}) needs {needed}"
    )]
    Infeasible {
        target: &'static str,
        budget: u32,
        instr: &'static str,
        ae: u32,
        ah: u32,
        needed: u32,
    },
    #[error(
        "target {target}: no tile that fits the registers holds whole 32-code runs of the \
         pair-transposed 4-bit weights ({instr} steps lp = {lp}; hp·lp must be a multiple of 32, \
         or 16 where the instruction pairs steps)"
    )]
    NibbleRuns {
        target: &'static str,
        instr: &'static str,
        lp: u32,
    },
    #[error(
        "target {target}: no block of {ep}x{hp} tiles fits {shared} bytes of shared memory \
         (one warp needs {needed})"
    )]
    NoBlock {
        target: &'static str,
        ep: u32,
        hp: u32,
        shared: u32,
        needed: u32,
    },
}

/// The registers an `ep × hp` tile needs with `instr` on `caps`.
pub fn accounting(
    caps: &TargetCaps,
    instr: &MacInstr,
    problem: &Problem,
    ep: u32,
    hp: u32,
) -> RegisterAccounting {
    let acc_units = (ep / instr.ae) * (hp / instr.ah);
    let accumulators = acc_units * instr.acc_regs;
    let grouped = problem.weight_groups && instr.class == MacClass::Int8 && instr.group_sums > 0;
    let (a_regs, group_sums) = if grouped {
        (instr.a_regs, acc_units * instr.group_sums)
    } else {
        (ep.div_ceil(instr.a_rows) * instr.a_regs, 0)
    };
    let b_regs = if paired_nibble_steps(instr, problem, hp) {
        2
    } else {
        hp.div_ceil(instr.b_cols) * instr.b_regs
    };
    let per_unit = match problem.e {
        1 => instr.gemv_partial_sums,
        e if e > FLAT_GEMM_MAX_ROWS => instr.gemm_partial_sums,
        _ => 0,
    };
    let partial_sums = if problem.weight_groups && instr.class == MacClass::Int8 {
        acc_units * per_unit
    } else {
        0
    };
    let dequant = if problem.weight_dequant {
        2 * (hp / instr.ah) * instr.acc_regs
    } else {
        0
    };
    let reserved = caps.reserved_regs() + instr.reserved_regs();
    RegisterAccounting {
        accumulators,
        a_regs,
        b_regs,
        dequant,
        group_sums,
        partial_sums,
        reserved,
        total: accumulators + a_regs + b_regs + dequant + group_sums + partial_sums + reserved,
        budget: caps.registers,
    }
}

/// How many B elements one A element's load is worth on `caps` for
/// `problem`. x86 has no by-element FMA: each A element of the f32 class
/// is its own broadcast load, while one B load brings a register of
/// `lanes` elements. When the kernel is compute-bound (more rows than the
/// [`FLAT_GEMM_MAX_ROWS`] of a flat GEMM) those loads compete with the
/// FMAs, so (2) counts A in register loads: `lanes·l·ep + l·hp + ep·hp`.
/// With few rows the weight stream from memory is what costs, and (2) as
/// written (weight 1) keeps every row in one row block. On ARM (by-element
/// FMA: an A register holds `lanes` rows) and for the int8 classes the
/// weight is always 1. Measured on x86 (CPU-time figures, noisy machine):
/// at M = 512 the unweighted optimum 14×8 reached 55–63% of the FMA peak,
/// the weighted one (4×24, and 6×16) 75–89%; at M = 8 the unweighted 8×8
/// read 67% of the read bandwidth, the weighted 4×24 55%.
///
/// On `x86-avx512` (zmm, 16 lanes) the weight stays 8, not 16: the
/// panel's K block streams from L2, and a 64-byte zmm B load costs about
/// two broadcasts. At M = 512 the lane count (16) picks 5×80, which ran
/// 10–20% slower than 9×48 (weight 8) in every same-run comparison
/// (CPU-time figures, loaded machine); 8×48, 6×64 and 14×32 sat between.
pub fn a_load_weight(caps: &TargetCaps, instr: &MacInstr, problem: &Problem) -> u128 {
    if caps.arch == Arch::X86_64 && instr.class == MacClass::F32 && problem.e > FLAT_GEMM_MAX_ROWS {
        u128::from(caps.register_bits.min(256) / 32)
    } else {
        1
    }
}

/// The most rows a flat GEMM serves (M = 2..16, FlashDecoding++'s flat
/// GEMM on a CPU); above it the x86 f32 cost counts broadcast loads.
pub const FLAT_GEMM_MAX_ROWS: u64 = 16;

/// How many A elements one B element is worth on `caps` for `problem`:
/// 2 for pair-transposed 4-bit weights on ARM's `sdot` and `smmla`, whose
/// every 16-byte load of 32 codes is unpacked by two or three vector ops
/// (`and` and `ushr`, or `eor`, `shl` and `and`) on the pipes the MACs
/// use, where the A operand (several rows a register) is a plain load.
/// Under llvm-mca 19 that makes a grouped `sdot` GEMM's 12×4 (unpack
/// shared by 12 rows) 1.04–1.09× KleidiAI's 16x4 on the N1, N2 and V1
/// models where the 6×8 that formula (2) prefers unweighted is 0.95×.
/// Else 1 (the `smull` fallback, one row an A register, is unmeasured).
pub fn b_load_weight(caps: &TargetCaps, instr: &MacInstr, problem: &Problem) -> u128 {
    if caps.arch == Arch::Aarch64
        && instr.class == MacClass::Int8
        && instr.a_rows > 1
        && problem.nibble_runs
    {
        2
    } else {
        1
    }
}

/// The cost the solver ranks tiles by on `caps`: formula (2) with the A
/// term weighted by [`a_load_weight`] and the B term by [`b_load_weight`]
/// (so exactly [`cost`] off x86 f32 and ARM's 4-bit int8), and on a GPU
/// multiplied by how starved its block leaves the grid.
pub fn target_cost(
    caps: &TargetCaps,
    instr: &MacInstr,
    problem: &Problem,
    ep: u32,
    hp: u32,
) -> u128 {
    let w = a_load_weight(caps, instr, problem);
    let wb = b_load_weight(caps, instr, problem);
    let (e, h, l) = (
        u128::from(problem.e),
        u128::from(problem.h),
        u128::from(problem.l),
    );
    // On a GPU, times how many too few blocks the tile's block leaves.
    let starved = block_tile(caps, instr, problem, ep, hp)
        .map_or(1, |b| starvation(caps, instr, problem, b.tile_e, b.tile_h));
    let (ep, hp) = (u128::from(ep), u128::from(hp));
    e.div_ceil(ep) * h.div_ceil(hp) * (w * l * ep + wb * l * hp + ep * hp) * starved
}

/// Formula (2) with ceil, exact.
pub fn cost(problem: &Problem, ep: u32, hp: u32) -> u128 {
    let (e, h, l) = (
        u128::from(problem.e),
        u128::from(problem.h),
        u128::from(problem.l),
    );
    let (ep, hp) = (u128::from(ep), u128::from(hp));
    e.div_ceil(ep) * h.div_ceil(hp) * (l * ep + l * hp + ep * hp)
}

fn check(caps: &TargetCaps, problem: &Problem) -> Result<&'static MacInstr, SolveError> {
    for (axis, v) in [("e", problem.e), ("h", problem.h), ("l", problem.l)] {
        if v == 0 {
            return Err(SolveError::ZeroExtent { axis });
        }
    }
    caps.mac(problem.class).ok_or(SolveError::NoInstruction {
        target: caps.name,
        class: problem.class,
    })
}

/// The registers of an `ep × hp` tile as the emitters lay it out: partial
/// sums that do not fit beside the tile go to the stack (counted as none).
pub fn spilled_accounting(
    caps: &TargetCaps,
    instr: &MacInstr,
    problem: &Problem,
    ep: u32,
    hp: u32,
) -> RegisterAccounting {
    let mut a = accounting(caps, instr, problem, ep, hp);
    if a.total > a.budget && a.partial_sums > 0 {
        a.total -= a.partial_sums;
        a.partial_sums = 0;
    }
    a
}

fn accounting_for(
    caps: &TargetCaps,
    instr: &MacInstr,
    problem: &Problem,
    ep: u32,
    hp: u32,
    spill: bool,
) -> RegisterAccounting {
    if spill {
        spilled_accounting(caps, instr, problem, ep, hp)
    } else {
        accounting(caps, instr, problem, ep, hp)
    }
}

/// Whether an int8 tile `hp` wide holds whole 32-code runs of
/// pair-transposed 4-bit weights per step (float MACs dequantize codes
/// their own way and refuse such layouts by name).
fn whole_nibble_runs(instr: &MacInstr, problem: &Problem, hp: u32) -> bool {
    !problem.nibble_runs
        || instr.class != MacClass::Int8
        || (hp * instr.lp).is_multiple_of(32)
        || paired_nibble_steps(instr, problem, hp)
}

/// Whether the tile's 4-bit weights come in 16-code blocks that pair two
/// lp-steps per 16-byte load ([`MacInstr::paired_nibble_steps`]): the load
/// then fills two B registers.
pub fn paired_nibble_steps(instr: &MacInstr, problem: &Problem, hp: u32) -> bool {
    problem.nibble_runs
        && instr.class == MacClass::Int8
        && instr.paired_nibble_steps
        && hp * instr.lp == 16
}

fn tile(
    caps: &TargetCaps,
    instr: &MacInstr,
    problem: &Problem,
    ep: u32,
    hp: u32,
    spill: bool,
) -> Option<TileConfig> {
    let accounting = accounting_for(caps, instr, problem, ep, hp, spill);
    if accounting.total > caps.registers || !whole_nibble_runs(instr, problem, hp) {
        return None;
    }
    let block = match caps.gpu {
        Some(_) => Some(block_tile(caps, instr, problem, ep, hp)?),
        None => None,
    };
    let exact = target_cost(caps, instr, problem, ep, hp);
    Some(TileConfig {
        ep,
        hp,
        lp: instr.lp,
        accounting,
        cost: exact as f64,
        block,
        exact_cost: exact,
    })
}

/// Every tile whose registers fit, unordered. Register use grows with ep
/// and with hp, so each row of the lattice stops at its first misfit.
/// GPU tiles without a feasible block are left out.
pub fn feasible(caps: &TargetCaps, problem: &Problem) -> Result<Vec<TileConfig>, SolveError> {
    feasible_tiles(caps, problem, false)
}

/// [`feasible`] plus the tiles that fit once their partial sums go to the
/// stack ([`MacInstr::gemm_partial_sums`] and the GEMV's), as the emitters
/// then lay them out: what a tuning record's tile is looked up in, so a
/// record from before the partial sums were counted still runs.
pub fn runnable(caps: &TargetCaps, problem: &Problem) -> Result<Vec<TileConfig>, SolveError> {
    feasible_tiles(caps, problem, true)
}

fn feasible_tiles(
    caps: &TargetCaps,
    problem: &Problem,
    spill: bool,
) -> Result<Vec<TileConfig>, SolveError> {
    let instr = check(caps, problem)?;
    let fits = |ep: u32, hp: u32| {
        accounting_for(caps, instr, problem, ep, hp, spill).total <= caps.registers
    };
    let mut out = Vec::new();
    let mut ep = instr.ae;
    while fits(ep, instr.ah) {
        let mut hp = instr.ah;
        while fits(ep, hp) {
            out.extend(tile(caps, instr, problem, ep, hp, spill));
            hp += instr.ah;
        }
        ep += instr.ae;
    }
    if out.is_empty() {
        let needed = accounting(caps, instr, problem, instr.ae, instr.ah).total;
        if needed <= caps.registers && caps.gpu.is_none() {
            return Err(SolveError::NibbleRuns {
                target: caps.name,
                instr: instr.name,
                lp: instr.lp,
            });
        }
        if needed <= caps.registers {
            let gpu = caps
                .gpu
                .expect("only GPU tiles are dropped for want of a block");
            return Err(SolveError::NoBlock {
                target: caps.name,
                ep: instr.ae,
                hp: instr.ah,
                shared: gpu.shared_mem_bytes,
                needed: shared_bytes(problem, gpu.k_slice, gpu.stages, instr.ae, instr.ah),
            });
        }
        return Err(SolveError::Infeasible {
            target: caps.name,
            budget: caps.registers,
            instr: instr.name,
            ae: instr.ae,
            ah: instr.ah,
            needed,
        });
    }
    Ok(out)
}

fn rank_key(t: &TileConfig) -> (u128, Reverse<u32>, Reverse<u32>) {
    (t.exact_cost, Reverse(t.ep), Reverse(t.hp))
}

/// All feasible tiles, best first: least cost, then larger ep, then larger hp.
pub fn solve(caps: &TargetCaps, problem: &Problem) -> Result<Vec<TileConfig>, SolveError> {
    let mut tiles = feasible(caps, problem)?;
    tiles.sort_by_key(rank_key);
    Ok(tiles)
}

/// The `n` feasible tiles nearest `best` on the (ep/ae, hp/ah) lattice
/// (Chebyshev distance, so the first ring is the 8 one-step moves), nearest
/// first and by cost within a ring; `best` itself is excluded. These are
/// the candidates the autotuner measures beside the optimum.
pub fn neighbours(
    caps: &TargetCaps,
    problem: &Problem,
    best: &TileConfig,
    n: usize,
) -> Result<Vec<TileConfig>, SolveError> {
    let instr = check(caps, problem)?;
    let steps = |a: u32, b: u32, unit: u32| a.abs_diff(b).div_ceil(unit);
    let mut tiles: Vec<TileConfig> = feasible(caps, problem)?
        .into_iter()
        .filter(|t| (t.ep, t.hp) != (best.ep, best.hp))
        .collect();
    tiles.sort_by_key(|t| {
        let ring = steps(t.ep, best.ep, instr.ae).max(steps(t.hp, best.hp, instr.ah));
        (ring, rank_key(t))
    });
    tiles.truncate(n);
    Ok(tiles)
}

fn shared_bytes(problem: &Problem, k_slice: u32, stages: u32, tile_e: u32, tile_h: u32) -> u32 {
    stages * k_slice * (tile_e + tile_h) * problem.class.operand_bytes()
}

/// How many times too few blocks a tensor-core grid of `tile_e × tile_h`
/// blocks has for `problem` ([`crate::target::GpuCaps::min_blocks`]), at
/// least 1: each block's warps stream the whole of K, so a grid of 11
/// blocks on 132 SMs leaves 121 idle (measured on an H200: the W4A16 flat
/// GEMM of [4096, 4096] ran as 11 blocks, 6% occupancy, 170 µs).
fn starvation(
    caps: &TargetCaps,
    instr: &MacInstr,
    problem: &Problem,
    tile_e: u32,
    tile_h: u32,
) -> u128 {
    let Some(gpu) = caps.gpu else { return 1 };
    // A one-row problem is a GEMV (its grid does not follow the block
    // tile); a GEMM tile is solved at a representative M but serves every
    // M above it, and a grid-filling tile at M = 128 ran the 2048-row
    // prefill 1.7× slower on the H200: only flat GEMMs are held to it.
    let flat = (2..=FLAT_GEMM_MAX_ROWS).contains(&problem.e);
    if instr.mma.is_none() || !flat || gpu.min_blocks == 0 {
        return 1;
    }
    let blocks = u128::from(problem.e.div_ceil(u64::from(tile_e.max(1))))
        * u128::from(problem.h.div_ceil(u64::from(tile_h.max(1))));
    u128::from(gpu.min_blocks).div_ceil(blocks.max(1)).max(1)
}

/// The block tile for a per-thread (per-warp) tile on a GPU target (None on
/// a CPU, or when no block fits); see the module doc.
pub fn block_tile(
    caps: &TargetCaps,
    instr: &MacInstr,
    problem: &Problem,
    ep: u32,
    hp: u32,
) -> Option<BlockTile> {
    let gpu = caps.gpu?;
    let unit_threads = if instr.mma.is_some() {
        gpu.warp_width
    } else {
        1
    };
    let max_units = gpu.max_threads_per_block / unit_threads;
    let min_units = gpu.warp_width.div_ceil(unit_threads);
    let powers = || (0..=max_units.ilog2()).map(|p| 1u32 << p);
    let mut best: Option<(u128, BlockTile)> = None;
    for units_e in powers() {
        for units_h in powers() {
            let units = units_e * units_h;
            if units > max_units || units < min_units {
                continue;
            }
            let (tile_e, tile_h) = (units_e * ep, units_h * hp);
            let shared = shared_bytes(problem, gpu.k_slice, gpu.stages, tile_e, tile_h);
            if shared > gpu.shared_mem_bytes {
                continue;
            }
            let block = BlockTile {
                units_e,
                units_h,
                threads: units * unit_threads,
                tile_e,
                tile_h,
                k_slice: gpu.k_slice,
                shared_bytes: shared,
                shared_budget: gpu.shared_mem_bytes,
            };
            let c =
                cost(problem, tile_e, tile_h) * starvation(caps, instr, problem, tile_e, tile_h);
            let better = match &best {
                None => true,
                Some((bc, b)) => (c, Reverse(units_h)) < (*bc, Reverse(b.units_h)),
            };
            if better {
                best = Some((c, block));
            }
        }
    }
    best.map(|(_, b)| b)
}

/// The solver's answer for one kernel on one target, as the CLI prints it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Solution {
    pub target: &'static str,
    pub kernel: String,
    pub class: MacClass,
    pub instr: &'static str,
    pub problem: Problem,
    /// Best first.
    pub tiles: Vec<TileConfig>,
    /// Nearest feasible neighbours of the best tile.
    pub neighbours: Vec<TileConfig>,
}

/// How many neighbours [`solve_kernel`] reports.
pub const NEIGHBOURS: usize = 8;

/// Solve a matmul kernel on a target: the ranked tiles and the best tile's
/// neighbours.
pub fn solve_kernel(caps: &TargetCaps, kernel: &Kernel) -> Result<Solution, SolveError> {
    let problem = Problem::from_kernel(caps, kernel)?;
    let tiles = solve(caps, &problem)?;
    let neighbours = neighbours(caps, &problem, &tiles[0], NEIGHBOURS)?;
    let instr = check(caps, &problem)?;
    Ok(Solution {
        target: caps.name,
        kernel: kernel.name.clone(),
        class: problem.class,
        instr: instr.name,
        problem,
        tiles,
        neighbours,
    })
}

impl Solution {
    /// The `top` best tiles (at least one).
    pub fn top(&self, top: usize) -> &[TileConfig] {
        &self.tiles[..top.clamp(1, self.tiles.len())]
    }

    /// Plain text: the best tile with its accounting on the first line, then
    /// the `top` best (rank, tile, cost) and the neighbours.
    pub fn to_text(&self, top: usize) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{} instr={} class={}",
            self.tiles[0].summary(),
            self.instr,
            self.class
        );
        let _ = writeln!(
            s,
            "target={} kernel={} e={} h={} l={}",
            self.target, self.kernel, self.problem.e, self.problem.h, self.problem.l
        );
        for (rank, t) in self.top(top).iter().enumerate() {
            let _ = writeln!(s, "#{} {} cost={}", rank + 1, t.summary(), t.exact_cost());
        }
        for t in &self.neighbours {
            let _ = writeln!(s, "neighbour {} cost={}", t.summary(), t.exact_cost());
        }
        s
    }

    /// The same as [`Self::to_text`] as a serializable value: the solution
    /// with `tiles` cut to the `top` best.
    pub fn to_report(&self, top: usize) -> Solution {
        Solution {
            tiles: self.top(top).to_vec(),
            ..self.clone()
        }
    }
}
