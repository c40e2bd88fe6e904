//! The NEON backend: aarch64 machine code for the matmul family.
//!
//! One emitter writes every kernel through [`asm::A64`] (dynasmrt's
//! `VecAssembler`): the bytes it returns are what the JIT maps
//! ([`crate::jit`]) and what `--bin` writes, on any host. Kernels follow
//! the one-pointer ABI of [`crate::abi`]; [`crate::host::HostMatmul`] is
//! the safe, shape-checking way to call them (and runs one call per slice
//! of h-panels).
//!
//! | target | int8 (W4A8, W8A8) | f16 x (matmul-f16) | f32 |
//! |---|---|---|---|
//! | `aarch64-i8mm` | `smmla` ([`int8`]) | `fmla .8h` ([`float`]) | `fmla .4s` |
//! | `aarch64-dotprod` | `sdot` by element | `fmla .8h` | `fmla .4s` |
//! | `aarch64-fp16` | `smull`/`smlal2`/`sadalp` | `fmla .8h` | `fmla .4s` |
//! | `aarch64-neon` | `smull`/`smlal2`/`sadalp` | widened to `fmla .4s` | `fmla .4s` |
//!
//! The int8 kernels take `u4asym`, `u4sym` (ggml Q4_0: implied zero
//! point 8, folded in int32 at the group end), `i8sym` and `i8asym`
//! weights, per row or in groups (a multiple of lp: 32, 64, 128, …), with
//! f32 or f16 group parameters (f16 widened by `fcvtl`, base NEON) on
//! every target and variant: `matmul-q4_0`, `matmul-q4_1` and
//! `matmul-q8_0` run everywhere.
//!
//! Variants: `Gemm` (panel → row block → all of K), `Gemv` (one row block
//! of ae rows, unrolled), `FlatGemm` ([`FlatPlan`]: M = 2–16 read each
//! weight byte from memory once, K blocks stay in L1 across row blocks,
//! prefetch, loops for fewer rows than the tile).
//!
//! `u4sym` weights read fastest stored as signed codes (q − 8, the layout's
//! `signed-codes`, as KleidiAI stores its 4-bit weights): no zero-point
//! term and no per-load fix-up. [`with_signed_codes`] is the explicit
//! `Kernel -> Kernel` pass that asks the packer for them; the runtime,
//! the generator and the tuner apply it for NEON. Unsigned codes still
//! run on every target.
//!
//! Which target a machine runs is decided at run time by
//! [`NeonBackend::detect`]. Every listing starts with the kernel's register
//! plan as `//` lines (llvm-mc reads them as comments).

pub mod asm;
pub mod attention;
pub mod attention_append;
mod attention_asm;
mod attention_prefill;
pub mod float;
pub mod frame;
pub mod int8;
pub mod quantize;

use std::ops::Range;

use tessera_dsl::Kernel;
use tessera_dsl::ir::{Activation, Format, Group, ParamType};

use crate::artifact::{Arch, Artifact, Backend, EmitError, MachineCode, Variant};
use crate::target::{MacClass, TargetCaps, mac_class};
use crate::tile::{
    FLAT_GEMM_MAX_ROWS, Problem, RegisterAccounting, TileConfig, spilled_accounting,
};

pub use crate::signed_codes::with_signed_codes;

/// The int8 MAC instruction (sequence) a kernel uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mac {
    Sdot,
    Smmla,
    Smull,
}

/// Where each vector register of a micro-kernel goes; counts equal the
/// solver's [`RegisterAccounting`] (a test asserts it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegisterPlan {
    /// A (activation) registers.
    pub a: Range<u8>,
    /// B (weight) registers.
    pub b: Range<u8>,
    /// The 0x0F mask (4-bit weights; reserved whatever the format).
    pub mask: asm::V,
    /// The packed-byte staging register the solver reserves (spare: the
    /// unpack works in place).
    pub stage: asm::V,
    /// The smull int16 temporary.
    pub temp: Option<asm::V>,
    /// f32 partial sums of a grouped GEMV (one per accumulator, empty when
    /// they live in the stack scratch instead).
    pub partials: Range<u8>,
    /// Accumulators, at the top of the register file.
    pub acc: Range<u8>,
}

/// How a 4-bit int8 loop unpacks its codes (for the register table).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NibbleUnpack {
    /// `and` 0x0F / `ushr` #4: codes 0..15.
    Unsigned,
    /// `eor` 0x88, then `shl` #4 / `and` 0xF0: 16·(q − 8).
    SignedInLoop,
    /// Stored as q − 8 (`signed-codes`): `shl` #4 / `and` 0xF0 alone.
    StoredSigned,
}

impl RegisterPlan {
    /// Lay out the registers the accounting counts.
    pub fn new(acc: &RegisterAccounting, a_regs: u32, b_regs: u32, temp: bool) -> RegisterPlan {
        let a_end = a_regs as u8;
        let b_end = a_end + b_regs as u8;
        let mask = asm::V(b_end);
        let stage = asm::V(b_end + 1);
        let temp = temp.then_some(asm::V(b_end + 2));
        let partials_start = b_end + 2 + u8::from(temp.is_some());
        let acc_start = 32 - acc.accumulators as u8;
        RegisterPlan {
            a: 0..a_end,
            b: a_end..b_end,
            mask,
            stage,
            temp,
            partials: partials_start..partials_start + acc.partial_sums as u8,
            acc: acc_start..32,
        }
    }

    pub fn acc_count(&self) -> u32 {
        self.acc.len() as u32
    }

    pub fn acc_reg(&self, i: u32) -> asm::V {
        asm::V(self.acc.start + i as u8)
    }

    /// The same plan with the accumulators starting `n` registers higher:
    /// accumulator set k of a flat loop of fewer rows than ep is the plan
    /// shifted by k · (accumulators per set).
    pub fn shifted_acc(&self, n: u32) -> RegisterPlan {
        RegisterPlan {
            acc: self.acc.start + n as u8..self.acc.end,
            ..self.clone()
        }
    }

    /// A register not holding an accumulator (for set-up code).
    pub fn scratch_v(&self, i: u8) -> asm::V {
        asm::V(i)
    }

    /// Registers free once the reduction of a group is done: A, B, the
    /// mask (re-made per group), staging and temporaries.
    pub fn free_in_epilogue(&self) -> Vec<asm::V> {
        let mut v: Vec<asm::V> = self.a.clone().chain(self.b.clone()).map(asm::V).collect();
        v.push(self.mask);
        v.push(self.stage);
        v.extend(self.temp);
        v
    }

    /// The register of partial sum `i` (row unit, column block order, as
    /// the stack scratch lays them out), if they live in registers.
    pub fn partial_reg(&self, i: u32) -> Option<asm::V> {
        (!self.partials.is_empty()).then(|| asm::V(self.partials.start + i as u8))
    }

    /// Vector registers used in all.
    pub fn total(&self) -> u32 {
        (self.a.len()
            + self.b.len()
            + 2
            + usize::from(self.temp.is_some())
            + self.partials.len()
            + self.acc.len()) as u32
    }

    /// The plan as `//` lines for a listing header.
    pub fn table(&self) -> Vec<String> {
        self.table_with(NibbleUnpack::Unsigned)
    }

    /// [`Self::table`] for a 4-bit unpack of `unpack`'s kind: signed codes
    /// take 0xF0 in the mask, and made signed in the loop 0x88 in the
    /// staging register ([`int8::signed_nibbles_pay`]).
    pub fn table_with(&self, unpack: NibbleUnpack) -> Vec<String> {
        let signed_nibbles = unpack != NibbleUnpack::Unsigned;
        let range = |r: &Range<u8>| {
            if r.is_empty() {
                "-".to_string()
            } else {
                format!("v{}-v{}", r.start, r.end - 1)
            }
        };
        let mut rows = vec![
            "| registers | holds |".to_string(),
            "|---|---|".to_string(),
            format!(
                "| {} | A: activations, one lp-slice of the ep rows |",
                range(&self.a)
            ),
            format!(
                "| {} | B: weights, one lp-slice of the hp columns |",
                range(&self.b)
            ),
            if signed_nibbles {
                format!("| {} | 0xF0 nibble mask (signed codes) |", self.mask)
            } else {
                format!("| {} | 0x0F nibble mask |", self.mask)
            },
            if unpack == NibbleUnpack::SignedInLoop {
                format!("| {} | 0x88: makes both nibbles q - 8 (eor) |", self.stage)
            } else {
                format!("| {} | packed-weight staging (spare) |", self.stage)
            },
        ];
        if let Some(t) = self.temp {
            rows.push(format!("| {t} | int16 products before sadalp |"));
        }
        if !self.partials.is_empty() {
            rows.push(format!(
                "| {} | f32 partial sums (a group end scales into them; no stack round trip) |",
                range(&self.partials)
            ));
        }
        rows.push(format!("| {} | accumulators |", range(&self.acc)));
        rows
    }
}

/// Rows one pass of the flat-GEMM loop covers at least (the default flat
/// range is M = 2..16, `tessera_runtime::dispatch::DEFAULT_M2`): the pass's
/// row blocks share every weight byte read from memory.
pub const FLAT_ROWS: u32 = 16;

/// Weight bytes of one panel's K block in the flat loop: half of the
/// smallest L1 data cache among the targets (32 KiB on Cortex-A72; 64 KiB
/// on A76 / Neoverse N1), the rest for the activations and partial sums.
pub const FLAT_K_BLOCK_BYTES: u32 = 16 * 1024;

/// How far ahead of the weight pointer the flat loop's `prfm pldl1keep`
/// reaches, in bytes (8 cache lines: covers ~100 ns of DRAM latency at a
/// few bytes per cycle).
pub const FLAT_PREFETCH_L1: u32 = 512;

/// How the flat-GEMM variant walks one call; the same numbers for the
/// int8 and the float loops.
///
/// ```text
/// for each hp-panel of this call's channels
///   for each pass of blocks·row_block rows               (1 pass for m ≤ FLAT_ROWS)
///     for each K block of the panel (k_block_steps lp-steps, ≤ 16 KiB)
///       for each row block of the pass (row_block = ep rows, accumulators in registers;
///       the last one runs the loop of the fewest rows ≥ its valid rows, see
///       row_counts, with the idle rows' accumulators as extra sets)
///         the K block's steps, unrolled by `unroll`, loads at offsets and one
///         pointer bump per iteration, one prfm pldl1keep
///         (this block, FLAT_PREFETCH_L1 ahead) and one prfm pldl2strm
///         (the same place of the next K block) per unrolled iteration
///         → f32 partial sums of the row block (stack, per row block)
///     tile epilogue of each row block
/// ```
///
/// The first row block of a K block streams the block from memory; the
/// others find it in L1. So within a pass each weight byte comes from
/// memory once; a call reads the weights `passes(m)` times (once for
/// m ≤ blocks·row_block).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlatPlan {
    /// Rows whose accumulators live in registers: the tile's ep, as the
    /// solver's accounting sized it.
    pub row_block: u32,
    /// Row blocks per pass: ceil([`FLAT_ROWS`] / row_block).
    pub blocks: u32,
    /// Weight bytes of one lp-step of one panel (hp columns).
    pub step_bytes: u32,
    /// lp-steps per K block (a whole number of weight groups); None: all of
    /// K at once (asymmetric whole-row weights, whose zero-point term needs
    /// the whole row's activation sum at once).
    pub k_block_steps: Option<u32>,
    /// Rows one MAC instruction covers (2 for `smmla`, else 1): the row
    /// counts of [`Self::row_counts`] are multiples of it.
    pub row_unit: u32,
    /// lp-steps per unrolled iteration: one prefetch pair per ≥ 64 bytes
    /// (one cache line), at most 8 steps.
    pub unroll: u32,
}

impl FlatPlan {
    /// The plan for a tile of `row_block` rows whose panel step is
    /// `step_bytes` of weights; `group_steps` is the weight group in
    /// lp-steps (None: one group per row), `whole_row` forces one K block.
    pub fn new(
        row_block: u32,
        step_bytes: u32,
        group_steps: Option<u32>,
        whole_row: bool,
    ) -> FlatPlan {
        Self::sized(
            row_block,
            step_bytes,
            group_steps,
            whole_row,
            FLAT_K_BLOCK_BYTES,
        )
    }

    /// [`Self::new`] with K blocks of at most `k_block_bytes` (at least one
    /// group).
    pub fn sized(
        row_block: u32,
        step_bytes: u32,
        group_steps: Option<u32>,
        whole_row: bool,
        k_block_bytes: u32,
    ) -> FlatPlan {
        let fit = (k_block_bytes / step_bytes).max(1);
        let k_block_steps = if whole_row {
            None
        } else {
            Some(match group_steps {
                Some(g) => (fit / g).max(1) * g,
                None => fit,
            })
        };
        FlatPlan {
            row_block,
            row_unit: 1,
            blocks: FLAT_ROWS.div_ceil(row_block),
            step_bytes,
            k_block_steps,
            unroll: 64u32.div_ceil(step_bytes).min(8),
        }
    }

    /// The same plan for a MAC of `unit` rows.
    pub fn with_row_unit(self, unit: u32) -> FlatPlan {
        FlatPlan {
            row_unit: unit,
            ..self
        }
    }

    /// The row counts the loop is emitted for: unit, 2·unit, 4·unit, …
    /// below the row block, then the row block. A row block of r valid
    /// rows runs the smallest count ≥ r, so a call with m < ep rows does
    /// the MACs of (about) m rows, not ep: M = 2 costs a 2-row loop.
    pub fn row_counts(&self) -> Vec<u32> {
        let mut out = Vec::new();
        let mut c = self.row_unit.max(1);
        while c < self.row_block {
            out.push(c);
            c *= 2;
        }
        out.push(self.row_block);
        out
    }

    /// Accumulator sets the loop of `rows` rows rotates through: the
    /// accumulator registers of the row block's other rows, so the MAC
    /// chains of a small row count are independent (ep / rows of them)
    /// and the loop is bound by throughput, not MAC latency.
    pub fn sets(&self, rows: u32) -> u32 {
        (self.row_block / rows.max(1)).max(1)
    }

    /// lp-steps per unrolled iteration of the loop of `rows` rows: whole
    /// cache lines of weights and a whole number of accumulator sets.
    pub fn unroll_for(&self, rows: u32) -> u32 {
        let sets = self.sets(rows);
        self.unroll.div_ceil(sets) * sets
    }

    /// Rows one pass covers.
    pub fn pass_rows(&self) -> u32 {
        self.blocks * self.row_block
    }

    /// Bytes of one panel's K block (None: the whole panel).
    pub fn k_block_bytes(&self) -> Option<u32> {
        self.k_block_steps.map(|s| s * self.step_bytes)
    }

    /// The `prfm pldl2strm` distance: one K block ahead, when it fits the
    /// instruction's offset field.
    pub fn prefetch_l2(&self) -> Option<u32> {
        self.k_block_bytes()
            .filter(|&b| b < 32768 && b.is_multiple_of(8))
    }

    /// The prefetches of one unrolled flat iteration at the weight stream
    /// `base`: L1 a fixed distance ahead, L2 one K block ahead.
    pub(super) fn prefetch(&self, a: &mut asm::A64, base: asm::X) {
        a.prfm(asm::Prefetch::Pldl1keep, base, FLAT_PREFETCH_L1);
        if let Some(d) = self.prefetch_l2() {
            a.prfm(asm::Prefetch::Pldl2strm, base, d);
        }
    }

    /// Passes over the weights for `m` rows.
    pub fn passes(&self, m: u64) -> u64 {
        m.div_ceil(u64::from(self.pass_rows())).max(1)
    }
}

/// The dotprod target, whose int8 GEMV an i8mm target runs
/// ([`NeonBackend::target`]).
const DOTPROD: &str = "aarch64-dotprod";

/// The NEON backend for one aarch64 target.
#[derive(Clone, Copy, Debug)]
pub struct NeonBackend {
    caps: &'static TargetCaps,
}

impl NeonBackend {
    /// The backend for target `name` (`aarch64-i8mm`, `aarch64-dotprod`,
    /// `aarch64-fp16`, `aarch64-neon`).
    pub fn new(name: &str) -> Result<NeonBackend, EmitError> {
        let caps = TargetCaps::by_name(name).map_err(|e| EmitError::Unsupported {
            backend: "neon",
            what: e.to_string(),
        })?;
        if caps.arch != Arch::Aarch64 {
            return Err(EmitError::Unsupported {
                backend: "neon",
                what: format!("target {name} (not aarch64)"),
            });
        }
        Ok(NeonBackend { caps })
    }

    pub fn caps(&self) -> &'static TargetCaps {
        self.caps
    }

    /// The target `kernel`'s `variant` tiles are solved on: on an i8mm
    /// target the int8 GEMV is the dotprod loop (`aarch64-dotprod`; every
    /// i8mm core has dotprod), since at M = 1 a two-row `smmla` tile wastes
    /// half of every instruction (llvm-mca 19, one K = 32 group: the
    /// dotprod GEMV reads 1.4× the weights per cycle of the i8mm one on
    /// Neoverse N2, V1 and V2). This backend emits tiles of either.
    pub fn target(&self, kernel: &Kernel, variant: Variant) -> &'static TargetCaps {
        let smmla = self.caps.mac(MacClass::Int8).is_some_and(|m| m.ae > 1);
        if variant == Variant::Gemv
            && smmla
            && mac_class(self.caps, kernel).is_ok_and(|c| c == MacClass::Int8)
        {
            TargetCaps::by_name(DOTPROD).expect("aarch64-dotprod is built in")
        } else {
            self.caps
        }
    }

    /// The target and MAC instruction `tile` was solved for: this
    /// target's, or on an i8mm target the dotprod one of a tile solved on
    /// `aarch64-dotprod` (its lp, 4, tells it apart: [`Self::target`]).
    fn mac_for(
        &self,
        kernel: &Kernel,
        tile: &TileConfig,
    ) -> Result<(&'static TargetCaps, &'static crate::target::MacInstr), EmitError> {
        let class = mac_class(self.caps, kernel).map_err(|e| self.unsupported(e.to_string()))?;
        let instr = self
            .caps
            .mac(class)
            .ok_or_else(|| self.unsupported(format!("the {class} class")))?;
        if tile.lp != instr.lp && class == MacClass::Int8 && instr.ae > 1 {
            let dotprod = TargetCaps::by_name(DOTPROD).expect("aarch64-dotprod is built in");
            if let Some(d) = dotprod.mac(class).filter(|d| d.lp == tile.lp) {
                return Ok((dotprod, d));
            }
        }
        Ok((self.caps, instr))
    }

    /// Decode attention for this target ([`attention`]; ABI
    /// [`crate::host_attention::AttentionArgs`]).
    pub fn emit_attention(&self, kernel: &Kernel) -> Result<MachineCode, EmitError> {
        attention::emit(self.caps, kernel)
    }

    /// [`NeonBackend::emit_attention`] with a prefill kernel's flash loop
    /// in `blocks`.
    pub fn emit_attention_with(
        &self,
        kernel: &Kernel,
        blocks: crate::artifact::PrefillBlocks,
    ) -> Result<MachineCode, EmitError> {
        attention::emit_with(self.caps, kernel, blocks)
    }

    /// The best target this CPU runs, from run-time feature detection:
    /// i8mm, then dotprod, then fp16, then plain NEON. On a non-aarch64
    /// host there is nothing to detect: None.
    pub fn detect() -> Option<NeonBackend> {
        Self::detect_name().and_then(|n| Self::new(n).ok())
    }

    /// The target name [`Self::detect`] picks.
    pub fn detect_name() -> Option<&'static str> {
        #[cfg(target_arch = "aarch64")]
        {
            use std::arch::is_aarch64_feature_detected as has;
            Some(if has!("i8mm") && has!("dotprod") && has!("fp16") {
                "aarch64-i8mm"
            } else if has!("dotprod") && has!("fp16") {
                "aarch64-dotprod"
            } else if has!("fp16") {
                "aarch64-fp16"
            } else {
                "aarch64-neon"
            })
        }
        #[cfg(not(target_arch = "aarch64"))]
        {
            None
        }
    }

    /// The activation quantizer+packer a kernel needs (its x is `i8dyn`),
    /// for `tile`; None for float kernels.
    pub fn quantizer(
        &self,
        kernel: &Kernel,
        tile: &TileConfig,
    ) -> Result<Option<MachineCode>, EmitError> {
        let spec = self.spec(kernel, tile, Variant::Gemm, None)?;
        match spec {
            KernelSpec::Int8(s) => {
                let mut a = asm::A64::new();
                quantize::emit(&mut a, s.ep, s.lp);
                finish(a).map(Some)
            }
            KernelSpec::Float(_) => Ok(None),
        }
    }

    /// The register plan of `kernel` at `tile`, with the solver's accounting
    /// it was laid out from.
    pub fn plan(
        &self,
        kernel: &Kernel,
        tile: &TileConfig,
    ) -> Result<(RegisterPlan, RegisterAccounting), EmitError> {
        self.plan_for(kernel, tile, Variant::Gemm)
    }

    /// [`Self::plan`] for one variant: the GEMV variant is accounted as
    /// the e = 1 problem and the flat variant at its rows, so a grouped
    /// GEMV (`sdot`) or GEMM (`smmla`) keeps its partial sums in registers
    /// where they fit beside the tile (the solver's tiles do); a wider
    /// tile, and every flat tile, keeps them in the stack scratch.
    pub fn plan_for(
        &self,
        kernel: &Kernel,
        tile: &TileConfig,
        variant: Variant,
    ) -> Result<(RegisterPlan, RegisterAccounting), EmitError> {
        let (caps, instr) = self.mac_for(kernel, tile)?;
        let mut problem =
            Problem::from_kernel(caps, kernel).map_err(|e| self.unsupported(e.to_string()))?;
        match variant {
            Variant::Gemv => problem.e = 1,
            // Its row blocks take turns within a K block, so its partial
            // sums stay in the stack scratch whatever the tile.
            Variant::FlatGemm => problem.e = problem.e.clamp(2, FLAT_GEMM_MAX_ROWS),
            Variant::Gemm => {}
        }
        let acc = spilled_accounting(caps, instr, &problem, tile.ep, tile.hp);
        if acc.total > caps.registers {
            return Err(Self::bad_tile(
                tile,
                format!(
                    "needs {} vector registers, the target has {}",
                    acc.total, caps.registers
                ),
            ));
        }
        let a_regs = acc.a_regs;
        let plan = RegisterPlan::new(&acc, a_regs, acc.b_regs, !instr.reserved.is_empty());
        Ok((plan, acc))
    }

    /// The flat-GEMM plan of `kernel` at `tile` (its row block is the
    /// tile's ep, as the solver's accounting sized it).
    pub fn flat_plan(&self, kernel: &Kernel, tile: &TileConfig) -> Result<FlatPlan, EmitError> {
        let spec = self.spec(kernel, tile, Variant::FlatGemm, None)?;
        let (plan, acc) = self.plan_for(kernel, tile, Variant::FlatGemm)?;
        let flat = spec.flat().expect("the flat variant has a flat plan");
        Self::check_flat(tile, &plan, &acc, &flat)?;
        Ok(flat)
    }

    /// The flat-GEMM variant with K blocks of at most `k_block_bytes` of
    /// weights instead of [`FLAT_K_BLOCK_BYTES`] (so tests reach K-block
    /// boundaries with a small k, and the autotuner may try other sizes).
    pub fn emit_flat(
        &self,
        kernel: &Kernel,
        tile: &TileConfig,
        k_block_bytes: u32,
    ) -> Result<Artifact, EmitError> {
        if k_block_bytes == 0 {
            return Err(Self::bad_tile(
                tile,
                "a flat K block needs at least one byte",
            ));
        }
        self.emit_with(kernel, tile, Variant::FlatGemm, Some(k_block_bytes))
    }

    /// The flat loop keeps the row block's accumulators in the registers
    /// the solver counted for the tile: row block = ep, the plan's
    /// accumulators and total equal the accounting's, within the budget.
    fn check_flat(
        tile: &TileConfig,
        plan: &RegisterPlan,
        acc: &RegisterAccounting,
        flat: &FlatPlan,
    ) -> Result<(), EmitError> {
        let why = if flat.row_block != tile.ep {
            Some(format!(
                "flat row block {} is not the tile's ep",
                flat.row_block
            ))
        } else if plan.acc_count() != acc.accumulators {
            Some(format!(
                "flat loop holds {} accumulators, the solver counted {}",
                plan.acc_count(),
                acc.accumulators
            ))
        } else if plan.total() > acc.total || acc.total > acc.budget {
            Some(format!(
                "flat loop uses {} vector registers, the solver counted {} of {}",
                plan.total(),
                acc.total,
                acc.budget
            ))
        } else {
            None
        };
        match why {
            Some(w) => Err(Self::bad_tile(tile, w)),
            None => Ok(()),
        }
    }

    fn unsupported(&self, what: String) -> EmitError {
        EmitError::Unsupported {
            backend: self.caps.name,
            what,
        }
    }

    fn bad_tile(tile: &TileConfig, why: impl Into<String>) -> EmitError {
        EmitError::BadTile {
            tile: format!("{}x{}x{}", tile.ep, tile.hp, tile.lp),
            why: why.into(),
        }
    }

    /// What the NEON loops read, checked against the description: weights
    /// in the CPU panel layout `[h/hp, l/lp, hp, lp]` (4-bit codes pair-
    /// transposed, which is how the loops unpack them), quantized
    /// activations in `[e/ep, l/lp, ep, lp]`, and an epilogue the tile
    /// store emits (bias, relu; no silu yet). Returns whether to relu.
    fn check_epilogue_and_layouts(
        &self,
        kernel: &Kernel,
        mm: &tessera_dsl::ir::Matmul,
        wf: Format,
        xf: Format,
    ) -> Result<bool, EmitError> {
        let what = |why: &str| self.unsupported(format!("kernel `{}`: {why}", kernel.name));
        if !kernel.is_blocked(&mm.w, &mm.h, &mm.l) {
            return Err(what(
                "weights must use the CPU panel layout [h/hp, l/lp, hp, lp] (GPU-layout kernels go to opencl/ptx)",
            ));
        }
        let pair_transposed = kernel
            .tensor(&mm.w)
            .is_some_and(|t| t.layout.int4_pair_transpose);
        // Every 4-bit format (e0m4 too, which NEON refuses by format below).
        let four_bit = wf.bits() == 4;
        // The int8 loops unpack pair-transposed codes; the float path takes
        // no 4-bit weights at all (refused by format below).
        if four_bit && !pair_transposed && xf == Format::I8Dyn {
            return Err(what(
                "4-bit weights need the int4 pair transpose (layout field pair_transpose)",
            ));
        }
        if !four_bit && pair_transposed {
            return Err(what(
                "the int4 pair transpose applies to 4-bit weights only",
            ));
        }
        if xf == Format::I8Dyn
            && !(kernel.is_blocked(&mm.x, &mm.e, &mm.l)
                && kernel
                    .tensor(&mm.x)
                    .is_some_and(|t| !t.layout.int4_pair_transpose))
        {
            return Err(what(
                "i8dyn activations must use the layout [e/ep, l/lp, ep, lp]",
            ));
        }
        if xf != Format::I8Dyn
            && !kernel
                .tensor(&mm.x)
                .is_some_and(|t| t.layout.is_row_major(&[&mm.e, &mm.l]))
        {
            return Err(what(
                "float activations must be row-major [e, l] (the x layout field)",
            ));
        }
        if let Some(b) = &mm.epilogue.bias
            && kernel.tensor(b).is_some_and(|t| t.format != Format::F32)
        {
            return Err(what(
                "the bias must be f32 (the NEON kernels read the bias as f32)",
            ));
        }
        match mm.epilogue.activation {
            Activation::None => Ok(false),
            Activation::Relu => Ok(true),
            Activation::Silu => Err(what(
                "the silu epilogue (activation field) is not emitted on NEON yet (needs a vector exp); use none or relu",
            )),
        }
    }

    fn spec(
        &self,
        kernel: &Kernel,
        tile: &TileConfig,
        variant: Variant,
        k_block_bytes: Option<u32>,
    ) -> Result<KernelSpec, EmitError> {
        let k_block_bytes = k_block_bytes.unwrap_or(FLAT_K_BLOCK_BYTES);
        let mm = kernel
            .as_matmul()
            .ok_or_else(|| self.unsupported(format!("kernel `{}` (not a matmul)", kernel.name)))?;
        if let Some(split) = crate::schedule::matmul_split(kernel) {
            return Err(self.unsupported(split));
        }
        let class = mac_class(self.caps, kernel).map_err(|e| self.unsupported(e.to_string()))?;
        let (_, instr) = self.mac_for(kernel, tile)?;
        if tile.lp != instr.lp
            || tile.ep == 0
            || tile.hp == 0
            || !tile.ep.is_multiple_of(instr.ae)
            || !tile.hp.is_multiple_of(instr.ah)
        {
            return Err(Self::bad_tile(
                tile,
                format!(
                    "{} needs ep a multiple of {}, hp of {}, lp = {}",
                    instr.name, instr.ae, instr.ah, instr.lp
                ),
            ));
        }
        // The variant's own accounting (partial sums it cannot fit go to
        // the stack instead of failing the tile); a tile whose registers do
        // not fit is refused there.
        self.plan_for(kernel, tile, variant)?;
        if variant == Variant::Gemv && tile.ep != instr.ae {
            return Err(Self::bad_tile(
                tile,
                format!(
                    "the gemv variant runs one row block of ep = {} (the solver's tile for e = 1)",
                    instr.ae
                ),
            ));
        }
        let format_of = |t: &str| kernel.tensor(t).map(|t| t.format);
        let (Some(xf), Some(wf), Some(yf)) = (format_of(&mm.x), format_of(&mm.w), format_of(&mm.y))
        else {
            return Err(self.unsupported("a matmul with missing tensors".into()));
        };
        let relu = self.check_epilogue_and_layouts(kernel, mm, wf, xf)?;
        let out = match yf {
            Format::F32 => frame::OutType::F32,
            Format::F16 => frame::OutType::F16,
            f => return Err(self.unsupported(format!("output format {f}"))),
        };
        match class {
            MacClass::Int8 => {
                if out != frame::OutType::F32 {
                    return Err(self.unsupported(format!("int8 kernels with {yf} output")));
                }
                // (code bits, stored offsets, implied zero point, group,
                // parameter precision).
                let (wbits, asym, zero_point, group, params) = match wf {
                    Format::U4Asym(g, p) => (4, true, None, g, p),
                    Format::U4Sym(g, p) => (4, false, Some(8), g, p),
                    Format::I8Sym(g, p) => (8, false, None, g, p),
                    Format::I8Asym(g, p) => (8, true, None, g, p),
                    f => {
                        return Err(self.unsupported(format!("{f} weights with i8dyn activations")));
                    }
                };
                let param_bytes = match params {
                    ParamType::F32 => 4,
                    ParamType::F16 => 2,
                };
                let mac = match instr.name {
                    n if n.starts_with("sdot") => Mac::Sdot,
                    n if n.starts_with("smmla") => Mac::Smmla,
                    _ => Mac::Smull,
                };
                // 16-code blocks: one 16-byte load holds two lp-steps, where
                // the instruction's loops pair them (the solver's rule).
                let paired_steps = wbits == 4 && tile.hp * tile.lp == 16;
                if paired_steps && (!instr.paired_nibble_steps || variant == Variant::Gemv) {
                    return Err(Self::bad_tile(
                        tile,
                        "4-bit codes in 16-code blocks (two lp-steps per 16-byte load) are read by the sdot GEMM and flat loops only",
                    ));
                }
                if wbits == 4 && !paired_steps && !(tile.hp * tile.lp).is_multiple_of(32) {
                    return Err(Self::bad_tile(
                        tile,
                        "the int4 pair transpose packs 32 codes per 16 bytes: hp·lp must be a multiple of 32 (or 16 for the sdot GEMM and flat loops)",
                    ));
                }
                let group = match group {
                    Group::Row => None,
                    Group::Size(g)
                        if g > 0
                            && g.is_multiple_of(tile.lp * if paired_steps { 2 } else { 1 }) =>
                    {
                        Some(g)
                    }
                    Group::Size(g) if paired_steps && g.is_multiple_of(tile.lp) => {
                        return Err(Self::bad_tile(
                            tile,
                            format!(
                                "group size {g}: paired lp-steps need groups of an even step count"
                            ),
                        ));
                    }
                    Group::Size(g) => {
                        return Err(self.unsupported(format!(
                            "group size {g} (not a multiple of lp = {})",
                            tile.lp
                        )));
                    }
                };
                let _ = xf;
                // Codes the packer stored as q − 8 (only `u4sym`, by verify).
                let stored_signed = kernel
                    .tensor(&mm.w)
                    .is_some_and(|t| t.layout.int4_signed_codes);
                if stored_signed && group.is_none() {
                    return Err(self.unsupported(
                        "signed-codes (layout field int4_signed_codes) with whole-row groups: the loops convert 16x sums, which a row could overflow; use a grouped format".into(),
                    ));
                }
                let flat = (variant == Variant::FlatGemm).then(|| {
                    FlatPlan::sized(
                        tile.ep,
                        tile.hp * tile.lp * wbits / 8,
                        group.map(|g| g / tile.lp),
                        // The activation-sum terms need the whole row's Σqx
                        // at once.
                        group.is_none() && (asym || zero_point.is_some()),
                        k_block_bytes,
                    )
                    .with_row_unit(instr.ae)
                });
                let mut spec = int8::Int8Spec {
                    mac,
                    ep: tile.ep,
                    hp: tile.hp,
                    lp: tile.lp,
                    wbits,
                    asym,
                    param_bytes,
                    zero_point,
                    group,
                    gemv: variant == Variant::Gemv,
                    flat,
                    relu,
                    signed_nibbles: false,
                    stored_signed,
                    paired_steps,
                };
                spec.signed_nibbles = stored_signed || int8::signed_nibbles_pay(&spec);
                Ok(KernelSpec::Int8(spec))
            }
            MacClass::F32 | MacClass::F16 => {
                if tile.ep > float::MAX_ROWS {
                    return Err(Self::bad_tile(
                        tile,
                        format!(
                            "the float path keeps one pointer per row: ep must be at most {}",
                            float::MAX_ROWS
                        ),
                    ));
                }
                let elem = |f: Format| {
                    match f {
                    Format::F32 => Ok(float::Elem::F32),
                    Format::F16 => Ok(float::Elem::F16),
                    f => Err(self.unsupported(format!(
                        "{f} operands on the NEON float path (x {xf}, w {wf}; quantized weights take i8dyn activations)"
                    ))),
                }
                };
                let w = elem(wf)?;
                if class == MacClass::F16 && wf != Format::F16 {
                    return Err(self.unsupported(format!(
                        "f16 activations with {wf} weights on {}: its fp16 path (fmla.8h) multiplies f16 by f16, so the w format must be f16 (aarch64-neon widens both to f32)",
                        self.caps.name
                    )));
                }
                let flat = (variant == Variant::FlatGemm).then(|| {
                    FlatPlan::sized(tile.ep, tile.hp * w.bytes(), None, false, k_block_bytes)
                });
                Ok(KernelSpec::Float(float::FloatSpec {
                    fp16_mac: class == MacClass::F16,
                    ep: tile.ep,
                    hp: tile.hp,
                    x: elem(xf)?,
                    w,
                    out,
                    gemv: variant == Variant::Gemv,
                    flat,
                    relu,
                }))
            }
        }
    }
}

enum KernelSpec {
    Int8(int8::Int8Spec),
    Float(float::FloatSpec),
}

impl KernelSpec {
    fn flat(&self) -> Option<FlatPlan> {
        match self {
            KernelSpec::Int8(s) => s.flat,
            KernelSpec::Float(s) => s.flat,
        }
    }
}

impl FlatPlan {
    /// The plan as one `//` header line.
    pub fn summary(&self) -> String {
        let k_block = match self.k_block_steps {
            Some(s) => format!("{s} steps ({} B)", s * self.step_bytes),
            None => "all of k".to_string(),
        };
        let l2 = match self.prefetch_l2() {
            Some(d) => format!(", pldl2strm +{d}"),
            None => String::new(),
        };
        format!(
            "flat: row block {} x {} per pass ({} rows), K block {k_block}, unroll {}, prfm pldl1keep +{FLAT_PREFETCH_L1}{l2}",
            self.row_block,
            self.blocks,
            self.pass_rows(),
            self.unroll
        )
    }
}

/// A k-loop over the `cnt` steps left: `per` steps an iteration (`many`)
/// while at least `per` are left, then single steps (`one`); branches to
/// `done` (bound by the caller after) when none is left. With `per` = 1,
/// `many` is the only loop.
pub(super) fn unrolled_steps(
    a: &mut asm::A64,
    cnt: asm::X,
    done: asm::Label,
    per: u32,
    many: &dyn Fn(&mut asm::A64),
    one: &dyn Fn(&mut asm::A64),
) {
    let single = a.new_label();
    let top = a.new_label();
    if per > 1 {
        a.cmp_imm(cnt, per);
        a.b_cond(asm::Cond::Lo, single);
    } else {
        a.cbz(cnt, done);
    }
    a.bind(top);
    many(a);
    if per > 1 {
        a.sub_imm(cnt, cnt, per);
        a.cmp_imm(cnt, per);
        a.b_cond(asm::Cond::Hs, top);
        a.bind(single);
        a.cbz(cnt, done);
        let each = a.new_label();
        a.bind(each);
        one(a);
        a.subs_imm(cnt, cnt, 1);
        a.b_cond(asm::Cond::Ne, each);
    } else {
        a.subs_imm(cnt, cnt, 1);
        a.b_cond(asm::Cond::Ne, top);
        a.bind(single);
    }
}

fn finish(a: asm::A64) -> Result<MachineCode, EmitError> {
    let (bytes, listing) = a.finish().map_err(EmitError::Assembler)?;
    Ok(MachineCode {
        arch: Arch::Aarch64,
        bytes,
        listing,
        head_dim_multiple: 1,
        whole_prefill: None,
        every_head_state: false,
    })
}

impl Backend for NeonBackend {
    fn name(&self) -> &'static str {
        self.caps.name
    }

    fn emit(&self, kernel: &Kernel, tile: &TileConfig) -> Result<Artifact, EmitError> {
        self.emit_variant(kernel, tile, Variant::Gemm)
    }

    /// `Gemv` is its own loop (ep = ae, A loaded once per four sdot steps);
    /// `FlatGemm` is its own nest ([`FlatPlan`]): K blocks that stay in L1
    /// across the row blocks of a pass, prefetch of the weight stream.
    fn emit_variant(
        &self,
        kernel: &Kernel,
        tile: &TileConfig,
        variant: Variant,
    ) -> Result<Artifact, EmitError> {
        self.emit_with(kernel, tile, variant, None)
    }
}

impl NeonBackend {
    fn emit_with(
        &self,
        kernel: &Kernel,
        tile: &TileConfig,
        variant: Variant,
        k_block_bytes: Option<u32>,
    ) -> Result<Artifact, EmitError> {
        let spec = self.spec(kernel, tile, variant, k_block_bytes)?;
        let (plan, acc) = self.plan_for(kernel, tile, variant)?;
        let mut a = asm::A64::new();
        a.header(&format!(
            "{} {} variant={} tile ep={} hp={} lp={}",
            kernel.name, self.caps.name, variant, tile.ep, tile.hp, tile.lp
        ));
        let partials = if acc.partial_sums > 0 {
            format!(" partial_sums={}", acc.partial_sums)
        } else {
            String::new()
        };
        a.header(&format!(
            "registers: acc={} a={} b={} dequant={} reserved={}{partials} total={}/{}",
            acc.accumulators,
            acc.a_regs,
            acc.b_regs,
            acc.dequant,
            acc.reserved,
            acc.total,
            acc.budget
        ));
        let unpack = match &spec {
            KernelSpec::Int8(s) if s.stored_signed => NibbleUnpack::StoredSigned,
            KernelSpec::Int8(s) if s.signed_nibbles => NibbleUnpack::SignedInLoop,
            _ => NibbleUnpack::Unsigned,
        };
        for line in plan.table_with(unpack) {
            a.header(&line);
        }
        if let Some(f) = spec.flat() {
            Self::check_flat(tile, &plan, &acc, &f)?;
            a.header(&f.summary());
        }
        if let Some(note) = match &spec {
            KernelSpec::Int8(s) => int8::epilogue_note(s),
            KernelSpec::Float(_) => None,
        } {
            a.header(&note);
        }
        match &spec {
            KernelSpec::Int8(s) => int8::emit(&mut a, s, &plan),
            KernelSpec::Float(s) => float::emit(&mut a, s, &plan),
        }
        finish(a).map(Artifact::Machine)
    }
}
