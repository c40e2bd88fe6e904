//! The int8 matmul micro-kernels: W4A8 and W8A8 on `sdot`, `smmla` or the
//! `smull`/`smlal2`/`sadalp` fallback.
//!
//! # Loop nest
//!
//! ```text
//! for each hp-panel of this call's channels            (weights streamed)
//!   for each ep-block of rows                           (activations packed [e/ep, l/lp, ep, lp])
//!     for each weight group g                           (32/64/128 or the whole row)
//!       for each lp-step of the group:                  (the steady-state loop)
//!         load A (ep × lp int8), load B (hp × lp codes; 4-bit: one 16-byte
//!         load per 32 codes, then `and` 0x0F → the first 16, `ushr` #4 → the
//!         next 16: the pair transpose makes them consecutive, no `zip`;
//!         u4sym GEMM and flat tiles: `eor` 0x88, `shl` #4 / `and` 0xF0,
//!         16·(q − 8) in each byte)
//!         MACs into int32 accumulators
//!       group epilogue: (u4sym: 16× sums → `scvtf` #4, or, in the GEMV,
//!         acc started at −8·Σqx[r, g]) acc → f32,
//!         partial[r, c] += sw[g, c]·acc + off[g, c]·Σqx[r, g]
//!         (sw, off stored as f32 or f16; f16 widened by fcvtl)
//!     tile epilogue: y[r, c] = sx[r]·partial[r, c] + bias[c], valid rows/columns only
//! ```
//!
//! The flat-GEMM variant ([`FlatPlan`]) reorders this to panel → pass of
//! 16 rows → K block (≤ 16 KiB, whole groups) → row block → group → step,
//! with one partial-sum area per row block of the pass, a loop per row
//! count (the last row block runs the fewest rows that cover it, rotating
//! through the idle rows' accumulators) and prefetch of the weight stream.
//!
//! The f32 partial sums of every flat tile live in a stack scratch area
//! (its row blocks take turns within a K block; the group epilogue reuses
//! the A and B registers). The grouped GEMMs keep them in registers
//! ([`crate::target::MacInstr::gemm_partial_sums`]): `smmla` 10×4×8 (10
//! accumulators, 10 partial sums) and `sdot` 12×4×4 (12 and 12), where
//! 10×8×8 and 12×8×4 loaded and stored 20 or 24 partials every group.
//! The `sdot` tile's four columns are 16 codes a step, so its 4-bit
//! weights come in 16-code blocks pair-transposed across two lp-steps
//! ([`Int8Spec::paired_steps`]): one 16-byte load and one unpack serve two
//! steps of 12 rows. Under llvm-mca 19 the Q4_0 GEMMs went from 0.91–0.95×
//! the best anchor (KleidiAI 16x4, 8x4x32; ggml on N1) on the N1, N2 and
//! V1 models to 1.04–1.09×. Where the epilogue fits in A and B, the unpack
//! constants are made once per row block (`constants_survive`).
//! A grouped GEMV on `sdot` keeps
//! them in registers too: the solver counts one per accumulator for
//! e = 1 ([`crate::target::MacInstr::gemv_partial_sums`]), so its tile is
//! 1×32 (8 accumulators, 8 B, 8 partial sums) rather than 1×48, and a
//! group end is a `scvtf` and an `fmla` per accumulator with no `ldr`/`str`
//! (under llvm-mca 19 the Q4_0 GEMV went from 0.91–1.04× KleidiAI's 1x8
//! kernel on the N1, N2, V1 and V2 models to 1.07–1.08×). A wider tile (the
//! tuner's neighbours, a recorded 12×8) falls back to the stack. Activations and weights
//! are padded with zero codes to whole tiles, so the loops never read past
//! a buffer and tails in e and h only matter when storing.
//!
//! # Register plan (v0..v31, from [`RegisterPlan`])
//!
//! `sdot` GEMM of grouped 4-bit weights at the solver's 12×4×4 (paired
//! steps):
//!
//! | registers | holds |
//! |---|---|
//! | v0-v2 | A: 12 rows × 4 int8 of one step (row r in lane r%4 of v(r/4)) |
//! | v3-v4 | B: 4 columns × 4 codes of the first step (v3) and the second (v4) |
//! | v5 | nibble mask (0xF0 with signed codes) |
//! | v6 | staging (0x88 with signed codes) |
//! | v7-v18 | 12 f32 partial sums, row r in v(7 + r) |
//! | v20-v31 | 12 accumulators: row r, columns 0-3 in v(20 + r) |
//!
//! `sdot` at 12×8×4 (MNN-LLM Table 2; per-row weights):
//!
//! | registers | holds |
//! |---|---|
//! | v0-v2 | A: 12 rows × 4 int8 (row r in lane r%4 of v(r/4)) |
//! | v3-v4 | B: 8 columns × 4 codes (v3 columns 0-3, v4 columns 4-7) |
//! | v5 | 0x0F nibble mask |
//! | v6 | spare (the packed-byte staging register the solver reserves) |
//! | v8-v31 | 24 accumulators: row r, columns 4j..4j+3 in v(8 + 2r + j) |
//!
//! With signed nibbles (`u4sym` GEMM and flat tiles) the mask holds 0xF0
//! and the staging register 0x88, the `eor` constant; likewise for `smmla`.
//!
//! `smmla` at 10×8×8 (per-row weights; a record's grouped tile of this
//! width spills its partial sums to the stack):
//!
//! | registers | holds |
//! |---|---|
//! | v0-v4 | A: 5 row pairs × 8 int8 |
//! | v5-v8 | B: 4 column pairs × 8 codes (v5, v6 from the and; v7, v8 from the ushr) |
//! | v9 | 0x0F nibble mask |
//! | v10 | spare (staging) |
//! | v12-v31 | 20 accumulators 2×2: row pair i, column pair j in v(12 + 4i + j) |
//!
//! One register is left unused in each (29 of 30 after the reservations).
//!
//! `smmla` GEMM of grouped weights at the solver's 10×4×8:
//!
//! | registers | holds |
//! |---|---|
//! | v0-v4 | A: 5 row pairs × 8 int8 |
//! | v5-v6 | B: 2 column pairs × 8 codes (the 16 bytes of one load) |
//! | v7 | nibble mask (0xF0 with signed codes) |
//! | v8 | staging (0x88 with signed codes) |
//! | v9-v18 | 10 f32 partial sums, in accumulator order |
//! | v22-v31 | 10 accumulators 2×2: row pair i, column pair j in v(22 + 2i + j) |
//!
//! `sdot` GEMV of grouped weights at the solver's 1×32×4:
//!
//! | registers | holds |
//! |---|---|
//! | v0 | A: 16 int8 of the row (four lp-steps, one per lane group) |
//! | v1-v8 | B: 32 columns × 4 codes (v1-v4 from the and, v5-v8 from the ushr) |
//! | v9 | 0x0F nibble mask |
//! | v10 | spare (staging) |
//! | v11-v18 | f32 partial sums, column block j in v(11 + j) |
//! | v24-v31 | 8 accumulators, column block j in v(24 + j) |
//!
//! # Group epilogue (registers freed by the reduction: A, B, mask, staging)
//!
//! | format | `free[0]` | `free[1]` | `free[2..]` per column block | int32 step |
//! |---|---|---|---|---|
//! | `i8sym` (f32 parameters) | - | partial-sum temporary | scale | - |
//! | `u4asym`, `i8asym` (f32) | Σqx as f32 | partial-sum temporary | scale, offset | - |
//! | `…:f16` (any of the above) | as above | as above | the same, loaded as 4 (or 2, `smmla`) f16 and widened by `fcvtl` | - |
//! | `u4sym` stored `signed-codes`, every loop (`smull` too) | - | partial-sum temporary | scale (f32 or f16 + `fcvtl`) | none: signed codes, 16× sums converted by `scvtf` #4 |
//! | `u4sym` (zero point 8), `sdot`/`smmla` GEMM and flat | - | partial-sum temporary | scale (f32 or f16 + `fcvtl`) | none: codes made signed by `eor`, 16× sums converted by `scvtf` #4 |
//! | `u4sym`, `sdot` GEMV | - | partial-sum temporary | scale | none: the accumulators started the group at −8·Σqx |
//! | `u4sym`, `smull` | 8·Σqx as int32 (`shl` #3) | partial-sum temporary | scale | acc − 8·Σqx before `scvtf` |
//!
//! Parameter strides follow the stored width: a group's scales are hp × 4
//! bytes (f32) or hp × 2 (f16), offsets after all of a panel's scales.
//!
//! The `u4sym` zero point costs a per-row term each group unless the codes
//! themselves are signed, which is what KleidiAI's 4-bit kernels store.
//! A kernel whose weight layout says `signed-codes` gets them so from the
//! packer (q XOR 8, [`tessera_dsl::Layout::int4_signed_codes`];
//! [`super::with_signed_codes`] is the pass the NEON users apply): every
//! tile then unpacks with `shl` #4 / `and` 0xF0, which leave 16·(q − 8) in
//! each byte, the sums are 16× and the fixed-point `scvtf` #4 removes that
//! exactly, and no zero-point term or per-load fix-up remains. Under
//! llvm-mca 19 that took the Q4_0 GEMV to 1.14–1.20× KleidiAI's best and
//! the dotprod and i8mm GEMMs to 1.07–1.23× (N1, N2, V1, V2).
//!
//! Where the stored codes are unsigned (the layout does not say
//! `signed-codes`; x86's `vpmaddubsw` needs them so) and it pays
//! ([`signed_nibbles_pay`]: the many-row GEMM and flat tiles), the loop
//! makes them signed with one `eor` 0x88 per loaded register; this took
//! the dotprod GEMM from 0.81–0.84× KleidiAI's 16x4 to 0.93–1.02× and the
//! i8mm GEMM from 0.67–0.74× its 8x4x32 to 0.91–1.02×. The GEMV of
//! unsigned codes (one row: the `eor`s would outnumber what they save)
//! starts each group's accumulators at −8·Σqx instead: each row's first
//! accumulator is loaded with Σqx, shifted (`shl` #3), negated and copied
//! to the row's others, in place of the `movi` that cleared them. All are
//! exact up to f32 rounding and cannot overflow int32 (|acc| ≤ 128·127·group).
//! The `smull` fallback's accumulators hold lane partials summed in the
//! epilogue, so with unsigned codes it subtracts 8·Σqx after the fold; with
//! signed codes its int16 pair sums stay within ±2·128·127.

use super::asm::{A64, Addr, Cond, Label, V, X};
use super::frame::{self, OutType, StoreRegs};
use super::{FlatPlan, Mac, RegisterPlan, unrolled_steps};
use crate::abi::{
    MM_BIAS, MM_K, MM_M, MM_N, MM_N0, MM_W, MM_W_PARAMS, MM_X, MM_X_SCALES, MM_X_SUMS, MM_Y,
    MM_Y_STRIDE,
};

/// What one int8 kernel instance computes.
#[derive(Clone, Copy, Debug)]
pub struct Int8Spec {
    pub mac: Mac,
    pub ep: u32,
    pub hp: u32,
    pub lp: u32,
    /// 4 (uint4 codes, pair-transposed) or 8 (int8 codes).
    pub wbits: u32,
    /// Weights carry offsets (zero points).
    pub asym: bool,
    /// Bytes of one stored group parameter (scale or offset): 4 (f32) or 2
    /// (f16 bits, widened with `fcvtl` in the group epilogue).
    pub param_bytes: u32,
    /// An implied integer zero point (`u4sym`: 8, a power of two), folded
    /// in int32 at the group end: acc − zp·Σqx, then the symmetric scale.
    pub zero_point: Option<u32>,
    /// Group length along l; None: the whole row.
    pub group: Option<u32>,
    /// The GEMV loop (ep = ae): unrolled steady state, A loaded once per
    /// four steps on `sdot`.
    pub gemv: bool,
    /// The flat-GEMM nest and its numbers (None: the GEMM/GEMV nest).
    pub flat: Option<FlatPlan>,
    /// The epilogue's relu (in the tile store).
    pub relu: bool,
    /// `u4sym` codes unpacked as signed (16·(q − 8) per byte, `scvtf` #4):
    /// stored so ([`Self::stored_signed`]) or made so in the loop where
    /// [`signed_nibbles_pay`].
    pub signed_nibbles: bool,
    /// The packer stored the `u4sym` codes as q − 8 (the weight layout's
    /// `signed-codes`): no `eor` in the loop.
    pub stored_signed: bool,
    /// 4-bit codes in 16-code blocks (hp·lp = 16, the `sdot` GEMM's 12×4×4
    /// and flat tiles at its packing): one 16-byte load holds two lp-steps,
    /// the first in the low nibbles; a panel's step count is padded to even
    /// by the packing.
    pub paired_steps: bool,
}

/// Whether a `u4sym` (zero point 8) tile on `sdot` or `smmla` should make
/// its codes signed in the loop: an `eor` with 0x88 per loaded B register
/// turns both nibbles into q − 8, and `shl` #4 / `and` 0xF0 (instead of
/// `and` 0x0F / `ushr` #4) leave 16·(q − 8) in each byte, so the sums are
/// 16× and `scvtf` #4 converts them exactly (|16·Σ| < 2^24 for groups up
/// to 128). No zero-point term remains. It pays where the fold it replaces
/// (per row each group: `ld1r`, `shl`, `neg`; per `smmla` row pair two
/// lane loads, `trn1`, `shl`, `neg`; less the `movi` that then clears the
/// row's first accumulator) costs more than the `eor`s: the many-row GEMM
/// and flat tiles, not the one-row GEMV. Whole-row groups never pay.
pub fn signed_nibbles_pay(spec: &Int8Spec) -> bool {
    let (4, Some(8), Some(g)) = (spec.wbits, spec.zero_point, spec.group) else {
        return false;
    };
    let per_unit = match spec.mac {
        Mac::Sdot => 2,
        Mac::Smmla => 4,
        Mac::Smull => return false,
    };
    // The eors of a group's 16-byte loads (32 codes each) and the second
    // constant's movi.
    let cost = spec.hp * g / 32 + 1;
    let saved = spec.ep / row_unit(spec) * per_unit;
    cost < saved
}

// General-purpose registers (x0 holds the argument block throughout).
const ARGS: X = X(0);
const M: X = X(1);
const NREM: X = X(2);
const KSTEPS: X = X(3);
const GSTEPS: X = X(5);
const WPANEL: X = X(7);
const PPANEL: X = X(8);
const YCOL: X = X(9);
const BIAS: X = X(10);
const R0: X = X(11);
const XA: X = X(12);
const WP: X = X(13);
const LEFT: X = X(14);
const CNT: X = X(15);
const PG: X = X(16);
const SG: X = X(17);
const T0: X = X(19);
const T1: X = X(20);
const T2: X = X(21);
const GSTRIDE: X = X(22);
const T3: X = X(23);
const T4: X = X(24);
const ABLOCK: X = X(25);
const YSTRIDE: X = X(26);
const COLS: X = X(27);
const SCR: X = X(28);
const STAGE: X = X(4);
const ROWS: X = X(6);

// Stack slots (bytes from sp).
const SLOT_OFFDELTA: u32 = 0;
const SLOT_WBYTES: u32 = 8;
const SLOT_PBYTES: u32 = 16;
const SLOT_BIASSTEP: u32 = 24;
const SLOT_ZEROS: u32 = 32;
/// Flat nest: first step of the current K block.
const SLOT_KB0: u32 = 40;
/// Flat nest: first row of the current pass.
const SLOT_R0S: u32 = 48;
/// Flat nest: the first row block's partial sums.
const SLOT_SCR0: u32 = 56;
const SLOTS: u32 = 64;

struct Layout {
    scratch: u32,
    stage: u32,
    zeros: u32,
    frame: u32,
    row_bytes: u32,
}

fn layout(spec: &Int8Spec, plan: &RegisterPlan) -> Layout {
    let hp4 = spec.hp.div_ceil(4) * 4;
    let scratch = SLOTS;
    let blocks = spec.flat.map_or(1, |f| f.blocks);
    let scratch_bytes = plan.acc_count() * 16 * blocks;
    let stage = scratch + scratch_bytes;
    let row_bytes = hp4 * 4;
    let zeros = stage + spec.ep * row_bytes;
    let frame = (zeros + row_bytes).div_ceil(16) * 16;
    Layout {
        scratch,
        stage,
        zeros,
        frame,
        row_bytes,
    }
}

/// The listing header line that says what the group epilogue holds for
/// the compact formats (f16 parameters, an implied zero point); None for
/// f32 parameters without one.
pub fn epilogue_note(spec: &Int8Spec) -> Option<String> {
    if spec.param_bytes == 4 && spec.zero_point.is_none() {
        return None;
    }
    let params = if spec.asym {
        "scales and offsets"
    } else {
        "scales"
    };
    let width = if spec.param_bytes == 2 {
        format!("f16 {params} (hp x 2 bytes a group), widened by fcvtl")
    } else {
        format!("f32 {params}")
    };
    let zp = match spec.zero_point {
        Some(z) if spec.stored_signed => format!(
            "; zero point {z}: codes stored signed (q-{z}; shl #4 / and 0xF0 leave 16*(q-{z}) \
             in each byte), sums converted by scvtf #4"
        ),
        Some(z) if spec.signed_nibbles => format!(
            "; zero point {z}: codes made signed in the loop (eor 0x88, then shl #4 / and 0xF0 \
             leave 16*(q-{z}) in each byte), sums converted by scvtf #4"
        ),
        Some(z) if zero_point_at_start(spec) => format!(
            "; zero point {z}: the accumulators start each group at -{z}*sum(qx) (shl #{}, neg)",
            z.trailing_zeros()
        ),
        Some(z) => format!(
            "; zero point {z}: acc -= {z}*sum(qx) in int32 (shl #{}) before scvtf",
            z.trailing_zeros()
        ),
        None => String::new(),
    };
    Some(format!("group epilogue: {width}{zp}"))
}

/// Emit the matmul kernel.
pub fn emit(a: &mut A64, spec: &Int8Spec, plan: &RegisterPlan) {
    assert!(
        matches!(spec.param_bytes, 2 | 4),
        "group parameters are f16 or f32"
    );
    assert!(
        spec.zero_point
            .is_none_or(|z| z.is_power_of_two() && !spec.asym),
        "an implied zero point is a power of two, of a format without offsets"
    );
    let lay = layout(spec, plan);
    let (ep, hp, lp) = (spec.ep, spec.hp, spec.lp);
    let step_a = ep * lp;
    let step_w = hp * lp * spec.wbits / 8;
    frame::prologue(a, lay.frame);

    a.comment("arguments and per-call constants");
    a.ldr_x(M, ARGS, MM_M as u32);
    a.ldr_x(NREM, ARGS, MM_N as u32);
    a.ldr_x(T0, ARGS, MM_K as u32);
    a.add_imm(T0, T0, lp - 1);
    a.lsr_imm(KSTEPS, T0, lp.trailing_zeros());
    // groups = ceil(k / G); GSTEPS = G / lp (the whole row: ksteps).
    a.ldr_x(T0, ARGS, MM_K as u32);
    match spec.group {
        Some(g) => {
            a.add_imm(T0, T0, g - 1);
            a.mov_imm(T1, u64::from(g));
            a.udiv(T0, T0, T1);
            a.mov_imm(GSTEPS, u64::from(g / lp));
        }
        None => {
            a.mov_imm(T0, 1);
            a.mov(GSTEPS, KSTEPS);
        }
    }
    // T0 = groups. Sums row stride, parameter sizes.
    a.lsl_imm(GSTRIDE, T0, 2);
    a.mov_imm(T1, u64::from(hp * spec.param_bytes));
    a.mul(T2, T0, T1);
    a.str_x_sp(T2, SLOT_OFFDELTA);
    let params_per_group: u32 = if spec.asym { 2 } else { 1 };
    a.mov_imm(T1, u64::from(params_per_group));
    a.mul(T2, T2, T1);
    a.str_x_sp(T2, SLOT_PBYTES);
    a.mov_imm(T1, u64::from(step_w));
    if spec.paired_steps {
        // The packing pads a panel to an even step count.
        a.add_imm(T3, KSTEPS, 1);
        a.lsr_imm(T3, T3, 1);
        a.lsl_imm(T3, T3, 1);
        a.mul(T3, T3, T1);
    } else {
        a.mul(T3, KSTEPS, T1);
    }
    a.str_x_sp(T3, SLOT_WBYTES);
    a.mov_imm(T1, u64::from(step_a));
    a.mul(ABLOCK, KSTEPS, T1);
    // First panel of this call: P0 = n0 / hp.
    a.ldr_x(T0, ARGS, MM_N0 as u32);
    a.mov_imm(T1, u64::from(hp));
    a.udiv(T4, T0, T1);
    a.ldr_x(WPANEL, ARGS, MM_W as u32);
    a.madd(WPANEL, T4, T3, WPANEL);
    a.ldr_x(PPANEL, ARGS, MM_W_PARAMS as u32);
    a.ldr_x_sp(T2, SLOT_PBYTES);
    a.madd(PPANEL, T4, T2, PPANEL);
    a.ldr_x(YSTRIDE, ARGS, MM_Y_STRIDE as u32);
    a.ldr_x(YCOL, ARGS, MM_Y as u32);
    a.add_lsl(YCOL, YCOL, T0, 2);
    // Bias: the tile's columns, or the zero area when there is none.
    a.add_from_sp(SCR, lay.zeros);
    a.str_x_sp(SCR, SLOT_ZEROS);
    a.ldr_x(BIAS, ARGS, MM_BIAS as u32);
    a.add_lsl(BIAS, BIAS, T0, 2);
    a.mov_imm(T1, u64::from(hp * 4));
    a.ldr_x(T2, ARGS, MM_BIAS as u32);
    a.cmp_imm(T2, 0);
    a.csel(BIAS, BIAS, SCR, Cond::Ne);
    a.csel(T1, T1, X(31), Cond::Ne);
    a.str_x_sp(T1, SLOT_BIASSTEP);
    // Zero the zero area.
    let z = plan.scratch_v(0);
    a.zero(z);
    for off in (0..lay.row_bytes).step_by(16) {
        a.str_q(z, SCR, off);
    }
    a.add_from_sp(SCR, lay.scratch);
    a.add_from_sp(STAGE, lay.stage);
    match &spec.flat {
        Some(f) => flat_nest(a, spec, plan, &lay, f),
        None => gemm_nest(a, spec, plan, &lay),
    }
    frame::epilogue(a, lay.frame);
}

/// panel → row block → group → step (the GEMM and GEMV variants).
fn gemm_nest(a: &mut A64, spec: &Int8Spec, plan: &RegisterPlan, lay: &Layout) {
    let (ep, hp) = (spec.ep, spec.hp);
    let panel_loop = a.new_label();
    let panel_done = a.new_label();
    a.cbz(NREM, panel_done);
    a.bind(panel_loop);
    a.comment("panel: hp output channels");
    a.mov_imm(T1, u64::from(hp));
    a.cmp(NREM, T1);
    a.csel(COLS, NREM, T1, Cond::Lo);
    a.mov_imm(R0, 0);
    let row_loop = a.new_label();
    let rows_done = a.new_label();
    a.cbz(M, rows_done);
    a.bind(row_loop);
    a.comment("row block: ep rows");
    // XA = x + (R0 / ep) · ABLOCK (R0 is a multiple of ep).
    a.mov_imm(T1, u64::from(ep));
    a.udiv(T0, R0, T1);
    a.ldr_x(XA, ARGS, MM_X as u32);
    a.madd(XA, T0, ABLOCK, XA);
    a.mov(WP, WPANEL);
    a.mov(PG, PPANEL);
    a.ldr_x(SG, ARGS, MM_X_SUMS as u32);
    a.mul(T0, R0, GSTRIDE);
    a.add(SG, SG, T0);
    a.mov(LEFT, KSTEPS);
    for r in plan.acc.clone() {
        a.zero(V(r));
    }
    if plan.partials.is_empty() {
        let acc0 = V(plan.acc.start);
        for i in 0..plan.acc_count() {
            a.str_q(acc0, SCR, 16 * i);
        }
    } else {
        for r in plan.partials.clone() {
            a.zero(V(r));
        }
    }

    let survive = constants_survive(spec, plan);
    if survive {
        unpack_constants(a, spec, plan);
    }
    let group_loop = a.new_label();
    a.bind(group_loop);
    a.comment("weight group");
    a.cmp(LEFT, GSTEPS);
    a.csel(CNT, LEFT, GSTEPS, Cond::Lo);
    a.sub(LEFT, LEFT, CNT);
    start_group(a, spec, plan);
    if !survive {
        unpack_constants(a, spec, plan);
    }
    k_loop(a, spec, plan);
    group_epilogue(a, spec, plan);
    a.add_imm(PG, PG, hp * spec.param_bytes);
    a.add_imm(SG, SG, 4);
    a.cbnz(LEFT, group_loop);

    tile_epilogue(a, spec, plan, lay);
    a.add_imm(R0, R0, ep);
    a.cmp(R0, M);
    a.b_cond(Cond::Lo, row_loop);
    a.bind(rows_done);
    next_panel(a, hp);
    a.cbnz(NREM, panel_loop);
    a.bind(panel_done);
}

/// Advance the panel pointers past one panel; NREM -= COLS.
fn next_panel(a: &mut A64, hp: u32) {
    a.ldr_x_sp(T0, SLOT_WBYTES);
    a.add(WPANEL, WPANEL, T0);
    a.ldr_x_sp(T0, SLOT_PBYTES);
    a.add(PPANEL, PPANEL, T0);
    a.add_imm(YCOL, YCOL, hp * 4);
    a.ldr_x_sp(T0, SLOT_BIASSTEP);
    a.add(BIAS, BIAS, T0);
    a.sub(NREM, NREM, COLS);
}

/// Branch to `top` while R0 < m and R0 is inside the pass (R0 < R0S +
/// pass rows); clobbers T0.
fn next_row_block(a: &mut A64, pass_rows: u32, top: Label) {
    let out = a.new_label();
    a.cmp(R0, M);
    a.b_cond(Cond::Hs, out);
    a.ldr_x_sp(T0, SLOT_R0S);
    a.add_imm(T0, T0, pass_rows);
    a.cmp(R0, T0);
    a.b_cond(Cond::Lo, top);
    a.bind(out);
}

/// SCR = the partial sums of the row block at R0: SCR0 + (R0 - R0S)/ep ·
/// (accumulators · 16 bytes).
fn row_block_partials(a: &mut A64, spec: &Int8Spec, plan: &RegisterPlan) {
    a.ldr_x_sp(T0, SLOT_R0S);
    a.sub(T0, R0, T0);
    a.mov_imm(T1, u64::from(spec.ep));
    a.udiv(T0, T0, T1);
    a.mov_imm(T1, u64::from(plan.acc_count() * 16));
    a.ldr_x_sp(SCR, SLOT_SCR0);
    a.madd(SCR, T0, T1, SCR);
}

/// The flat-GEMM nest ([`FlatPlan`]): panel → pass → K block → row block →
/// group → step, each row block's f32 partial sums in its own stack area.
fn flat_nest(a: &mut A64, spec: &Int8Spec, plan: &RegisterPlan, lay: &Layout, f: &FlatPlan) {
    let (ep, hp, lp) = (spec.ep, spec.hp, spec.lp);
    let step_a = ep * lp;
    let step_w = f.step_bytes;
    let pass_rows = f.pass_rows();
    a.str_x_sp(SCR, SLOT_SCR0);
    if let (Some(kb), None) = (f.k_block_steps, spec.group) {
        // Whole-row symmetric scales: a K block is one (virtual) group.
        a.mov_imm(GSTEPS, u64::from(kb));
    }
    let panel_loop = a.new_label();
    let panel_done = a.new_label();
    let panel_next = a.new_label();
    a.cbz(NREM, panel_done);
    a.bind(panel_loop);
    a.comment("panel: hp output channels");
    a.mov_imm(T1, u64::from(hp));
    a.cmp(NREM, T1);
    a.csel(COLS, NREM, T1, Cond::Lo);
    a.mov_imm(T0, 0);
    a.str_x_sp(T0, SLOT_R0S);
    a.cbz(M, panel_next);

    let pass_loop = a.new_label();
    a.bind(pass_loop);
    a.comment(&format!(
        "pass: up to {pass_rows} rows share every weight byte read from memory"
    ));
    let z = plan.scratch_v(0);
    a.zero(z);
    a.ldr_x_sp(T0, SLOT_SCR0);
    a.mov_imm(T1, u64::from(f.blocks * plan.acc_count()));
    let zero_loop = a.new_label();
    a.bind(zero_loop);
    a.str_q_post(z, T0, 16);
    a.subs_imm(T1, T1, 1);
    a.b_cond(Cond::Ne, zero_loop);
    a.mov_imm(T0, 0);
    a.str_x_sp(T0, SLOT_KB0);

    let kblock_loop = a.new_label();
    a.bind(kblock_loop);
    a.comment("K block: the first row block streams it, the others find it in L1");
    a.ldr_x_sp(R0, SLOT_R0S);
    let row_loop = a.new_label();
    a.bind(row_loop);
    a.comment("row block: ep rows, accumulators in registers");
    row_block_partials(a, spec, plan);
    a.ldr_x_sp(T2, SLOT_KB0);
    // XA = x + (R0/ep)·ABLOCK + KB0·ep·lp; WP = WPANEL + KB0·step_w.
    a.mov_imm(T1, u64::from(ep));
    a.udiv(T0, R0, T1);
    a.ldr_x(XA, ARGS, MM_X as u32);
    a.madd(XA, T0, ABLOCK, XA);
    a.mov_imm(T1, u64::from(step_a));
    a.madd(XA, T2, T1, XA);
    a.mov_imm(T1, u64::from(step_w));
    a.madd(WP, T2, T1, WPANEL);
    // The K block's first group: its parameters and activation sums.
    a.mov(PG, PPANEL);
    a.ldr_x(SG, ARGS, MM_X_SUMS as u32);
    a.mul(T0, R0, GSTRIDE);
    a.add(SG, SG, T0);
    if let Some(g) = spec.group {
        a.mov_imm(T1, u64::from(g / lp));
        a.udiv(T3, T2, T1);
        a.mov_imm(T1, u64::from(hp * spec.param_bytes));
        a.madd(PG, T3, T1, PG);
        a.add_lsl(SG, SG, T3, 2);
    }
    // LEFT = min(ksteps - KB0, K block).
    a.sub(LEFT, KSTEPS, T2);
    if let Some(kb) = f.k_block_steps {
        a.mov_imm(T1, u64::from(kb));
        a.cmp(LEFT, T1);
        a.csel(LEFT, LEFT, T1, Cond::Lo);
    }
    for r in plan.acc.clone() {
        a.zero(V(r));
    }
    // The last row block of a call may hold fewer rows: run the loop for
    // the smallest row count that covers them (MACs and group epilogues of
    // the rows only; the packed A still has ep rows per step).
    let counts = f.row_counts();
    let joined = a.new_label();
    let labels: Vec<Label> = counts.iter().map(|_| a.new_label()).collect();
    if counts.len() > 1 {
        a.sub(T0, M, R0);
        for (&c, &l) in counts.iter().zip(&labels).take(counts.len() - 1) {
            a.cmp_imm(T0, c);
            a.b_cond(Cond::Ls, l);
        }
        a.b(labels[counts.len() - 1]);
    }
    for (i, (&c, &l)) in counts.iter().zip(&labels).enumerate() {
        a.bind(l);
        let rows = Int8Spec { ep: c, ..*spec };
        group_loop(a, &rows, plan, f, (ep - c) * lp);
        if i + 1 < counts.len() {
            a.b(joined);
        }
    }
    a.bind(joined);
    a.add_imm(R0, R0, ep);
    next_row_block(a, pass_rows, row_loop);
    if let Some(kb) = f.k_block_steps {
        a.ldr_x_sp(T0, SLOT_KB0);
        a.add_imm(T0, T0, kb);
        a.str_x_sp(T0, SLOT_KB0);
        a.cmp(T0, KSTEPS);
        a.b_cond(Cond::Lo, kblock_loop);
    }

    a.comment("the pass's tile epilogues");
    a.ldr_x_sp(R0, SLOT_R0S);
    let epi_loop = a.new_label();
    a.bind(epi_loop);
    row_block_partials(a, spec, plan);
    tile_epilogue(a, spec, plan, lay);
    a.add_imm(R0, R0, ep);
    next_row_block(a, pass_rows, epi_loop);
    a.ldr_x_sp(T0, SLOT_R0S);
    a.add_imm(T0, T0, pass_rows);
    a.str_x_sp(T0, SLOT_R0S);
    a.cmp(T0, M);
    a.b_cond(Cond::Lo, pass_loop);

    a.bind(panel_next);
    next_panel(a, hp);
    a.cbnz(NREM, panel_loop);
    a.bind(panel_done);
}

/// The groups of one K block for the first `spec.ep` rows of a row block;
/// `skip` bytes of packed A (the rows not computed) follow each step's.
fn group_loop(a: &mut A64, spec: &Int8Spec, plan: &RegisterPlan, f: &FlatPlan, skip: u32) {
    a.comment(&format!("{} row(s)", spec.ep));
    let group_loop = a.new_label();
    a.bind(group_loop);
    a.comment("weight group");
    a.cmp(LEFT, GSTEPS);
    a.csel(CNT, LEFT, GSTEPS, Cond::Lo);
    a.sub(LEFT, LEFT, CNT);
    start_group(a, spec, plan);
    unpack_constants(a, spec, plan);
    let sets = f.sets(spec.ep);
    flat_k_loop(a, spec, plan, f, skip);
    fold_sets(a, plan, sets, set_regs(spec, plan, f));
    group_epilogue(a, spec, plan);
    if spec.group.is_some() {
        a.add_imm(PG, PG, spec.hp * spec.param_bytes);
        a.add_imm(SG, SG, 4);
    }
    a.cbnz(LEFT, group_loop);
}

/// Accumulator registers of one set of the `spec.ep`-row loop (the
/// row block's share for those rows).
fn set_regs(spec: &Int8Spec, plan: &RegisterPlan, f: &FlatPlan) -> u32 {
    plan.acc_count() * spec.ep / f.row_block
}

/// Sum accumulator sets 1.. into set 0 (int32) and clear them.
fn fold_sets(a: &mut A64, plan: &RegisterPlan, sets: u32, per_set: u32) {
    if sets < 2 {
        return;
    }
    a.comment(&format!("fold {sets} accumulator sets"));
    for k in 1..sets {
        for i in 0..per_set {
            let (d, s) = (plan.acc_reg(i), plan.acc_reg(k * per_set + i));
            a.add_4s(d, d, s);
            a.zero(s);
        }
    }
}

/// One flat step: A of `spec.ep` rows (then `skip` bytes), B, MACs into
/// the accumulator set `set` of the plan; with `at`, step `s` of an
/// unrolled iteration whose loads use offsets.
fn flat_step(
    a: &mut A64,
    spec: &Int8Spec,
    set: &RegisterPlan,
    skip: u32,
    at: Option<(u32, &FlatPlan)>,
) {
    match at {
        Some((s, f)) => {
            load_a_at(a, spec, set, &mut Addr::Offset(s * f.row_block * spec.lp));
            load_b_at(a, spec, set, &mut Addr::Offset(s * f.step_bytes));
        }
        None => {
            load_a(a, spec, set);
            if skip > 0 {
                a.add_imm(XA, XA, skip);
            }
            load_b(a, spec, set);
        }
    }
    macs(a, spec, set, None);
}

/// The flat loop over the CNT lp-steps of one group: `unroll` steps per
/// iteration behind one prefetch pair, then single steps.
fn flat_k_loop(a: &mut A64, spec: &Int8Spec, plan: &RegisterPlan, f: &FlatPlan, skip: u32) {
    if spec.paired_steps {
        return flat_paired_k_loop(a, spec, plan, f, skip);
    }
    let u = f.unroll_for(spec.ep);
    let per_set = set_regs(spec, plan, f);
    let set = |k: u32| plan.shifted_acc(k * per_set);
    let sets = f.sets(spec.ep);
    let done = a.new_label();
    let offsets = offsets_fit(spec, f, u);
    unrolled_steps(
        a,
        CNT,
        done,
        u,
        &|a| {
            a.comment(&format!("steady state (flat): {u} lp-step(s), prefetch"));
            f.prefetch(a, WP);
            for s in 0..u {
                flat_step(a, spec, &set(s % sets), skip, offsets.then_some((s, f)));
            }
            if offsets {
                a.add_imm(XA, XA, u * f.row_block * spec.lp);
                a.add_imm(WP, WP, u * f.step_bytes);
            }
        },
        &|a| flat_step(a, spec, &set(0), skip, None),
    );
    a.bind(done);
}

/// [`flat_k_loop`] for paired steps ([`Int8Spec::paired_steps`]): `u`
/// steps (u/2 loads of codes) behind one prefetch pair, then pairs, then
/// an odd last step on a padded load's low half. Post-indexed throughout
/// (a step is 8 bytes of codes, under the offset form's 16).
fn flat_paired_k_loop(a: &mut A64, spec: &Int8Spec, plan: &RegisterPlan, f: &FlatPlan, skip: u32) {
    let u = f.unroll_for(spec.ep).div_ceil(2) * 2;
    let per_set = set_regs(spec, plan, f);
    let set = |k: u32| plan.shifted_acc(k * per_set);
    let sets = f.sets(spec.ep);
    let done = a.new_label();
    let tail = a.new_label();
    let top = a.new_label();
    a.cmp_imm(CNT, u);
    a.b_cond(Cond::Lo, tail);
    a.bind(top);
    a.comment(&format!(
        "steady state (flat): {u} lp-steps, two per 16-byte load of codes, prefetch"
    ));
    f.prefetch(a, WP);
    for p in 0..u / 2 {
        flat_pair(a, spec, &set(p % sets), skip, true);
    }
    a.sub_imm(CNT, CNT, u);
    a.cmp_imm(CNT, u);
    a.b_cond(Cond::Hs, top);
    a.bind(tail);
    let first = set(0);
    unrolled_steps(
        a,
        CNT,
        done,
        2,
        &|a| flat_pair(a, spec, &first, skip, true),
        &|a| flat_pair(a, spec, &first, skip, false),
    );
    a.bind(done);
}

/// One load of paired codes and its steps (both, or only the first).
fn flat_pair(a: &mut A64, spec: &Int8Spec, set: &RegisterPlan, skip: u32, both: bool) {
    let lo = b_unit(spec, set, 0);
    let hi = b_unit(spec, set, 1);
    load_a(a, spec, set);
    if skip > 0 {
        a.add_imm(XA, XA, skip);
    }
    load_b(a, spec, set);
    macs_of(a, spec, set, None, &|_| lo);
    if both {
        load_a(a, spec, set);
        if skip > 0 {
            a.add_imm(XA, XA, skip);
        }
        macs_of(a, spec, set, None, &|_| hi);
    }
}

/// Load one lp-step of A (ep × lp int8) into the A registers.
fn load_a(a: &mut A64, spec: &Int8Spec, plan: &RegisterPlan) {
    load_a_at(a, spec, plan, &mut Addr::Post);
}

/// [`load_a`] at `at` (offsets: not for a 12-byte tail, see [`offsets_fit`]).
fn load_a_at(a: &mut A64, spec: &Int8Spec, plan: &RegisterPlan, at: &mut Addr) {
    let bytes = spec.ep * spec.lp;
    let full = bytes / 16;
    let regs: Vec<V> = plan.a.clone().map(V).collect();
    let mut i = 0;
    while i + 1 < full {
        a.ldp_q_at(regs[i as usize], regs[i as usize + 1], XA, at);
        i += 2;
    }
    if i < full {
        a.ldr_q_at(regs[i as usize], XA, at);
    }
    match bytes % 16 {
        0 => {}
        4 => a.ldr_s_at(regs[full as usize], XA, at),
        8 => a.ldr_d_at(regs[full as usize], XA, at),
        _ => {
            assert_eq!(*at, Addr::Post, "a 12-byte A tail loads post-indexed");
            a.ldr_d_post(regs[full as usize], XA, 8);
            a.ld1_s_lane_post4(regs[full as usize], 2, XA);
        }
    }
}

/// Load one lp-step of B (hp × lp codes) and unpack 4-bit codes.
fn load_b(a: &mut A64, spec: &Int8Spec, plan: &RegisterPlan) {
    load_b_at(a, spec, plan, &mut Addr::Post);
}

/// [`load_b`] at `at`.
fn load_b_at(a: &mut A64, spec: &Int8Spec, plan: &RegisterPlan, at: &mut Addr) {
    let nb = plan.b.len() as u32;
    let b0 = u32::from(plan.b.start);
    if spec.wbits == 8 {
        let mut j = 0;
        while j + 1 < nb {
            a.ldp_q_at(V((b0 + j) as u8), V((b0 + j + 1) as u8), WP, at);
            j += 2;
        }
        if j < nb {
            a.ldr_q_at(V((b0 + j) as u8), WP, at);
        }
        return;
    }
    let runs = nb / 2;
    let hi = |q: u32| V((b0 + runs + q) as u8);
    let lo = |q: u32| V((b0 + q) as u8);
    let mut q = 0;
    while q + 1 < runs {
        a.ldp_q_at(hi(q), hi(q + 1), WP, at);
        q += 2;
    }
    if q < runs {
        a.ldr_q_at(hi(q), WP, at);
    }
    for q in 0..runs {
        if spec.signed_nibbles {
            if !spec.stored_signed {
                a.eor_16b(hi(q), hi(q), plan.stage);
            }
            a.shl_16b(lo(q), hi(q), 4);
            a.and_16b(hi(q), hi(q), plan.mask);
        } else {
            a.and_16b(lo(q), hi(q), plan.mask);
            a.ushr_16b(hi(q), hi(q), 4);
        }
    }
}

/// Whether an unrolled flat iteration of `u` steps can address A and B at
/// offsets: 16-byte aligned strides within `ldp`'s reach, no 12-byte tail.
fn offsets_fit(spec: &Int8Spec, f: &FlatPlan, u: u32) -> bool {
    let a_stride = f.row_block * spec.lp;
    a_stride.is_multiple_of(16)
        && f.step_bytes.is_multiple_of(16)
        && (spec.ep * spec.lp) % 16 != 12
        && u * a_stride.max(f.step_bytes) <= 1008
}

/// The register holding B unit j (16 bytes of codes at index j).
fn b_unit(spec: &Int8Spec, plan: &RegisterPlan, j: u32) -> V {
    let nb = plan.b.len() as u32;
    let b0 = u32::from(plan.b.start);
    if spec.wbits == 8 {
        V((b0 + j) as u8)
    } else if j.is_multiple_of(2) {
        V((b0 + j / 2) as u8)
    } else {
        V((b0 + nb / 2 + j / 2) as u8)
    }
}

/// The MACs of one lp-step; `lane` picks the A lane group on the GEMV
/// sdot path (A holds four steps of one row).
fn macs(a: &mut A64, spec: &Int8Spec, plan: &RegisterPlan, gemv_lane: Option<u32>) {
    macs_of(a, spec, plan, gemv_lane, &|j| b_unit(spec, plan, j));
}

/// [`macs`] with B unit j in `b(j)` (paired steps: the second step's
/// codes are in the load's high-nibble register).
fn macs_of(
    a: &mut A64,
    spec: &Int8Spec,
    plan: &RegisterPlan,
    gemv_lane: Option<u32>,
    b: &dyn Fn(u32) -> V,
) {
    match spec.mac {
        Mac::Sdot => {
            let jn = spec.hp / 4;
            for r in 0..spec.ep {
                let (areg, lane) = match gemv_lane {
                    Some(l) => (V(plan.a.start), l),
                    None => (V(plan.a.start + (r / 4) as u8), r % 4),
                };
                for j in 0..jn {
                    a.sdot_elem(plan.acc_reg(r * jn + j), b(j), areg, lane);
                }
            }
        }
        Mac::Smmla => {
            let jn = spec.hp / 2;
            for i in 0..spec.ep / 2 {
                for j in 0..jn {
                    a.smmla(plan.acc_reg(i * jn + j), V(plan.a.start + i as u8), b(j));
                }
            }
        }
        Mac::Smull => {
            let t = plan.temp.expect("smull needs its int16 temporary");
            for r in 0..spec.ep {
                let areg = V(plan.a.start + r as u8);
                for c in 0..spec.hp {
                    let b = b(c);
                    a.smull_8b(t, areg, b);
                    a.smlal2_16b(t, areg, b);
                    a.sadalp_8h(plan.acc_reg(r * spec.hp + c), t);
                }
            }
        }
    }
}

/// The steady-state loop over the CNT lp-steps of one group.
fn k_loop(a: &mut A64, spec: &Int8Spec, plan: &RegisterPlan) {
    let done = a.new_label();
    if spec.gemv && spec.mac == Mac::Sdot && spec.ep == 1 {
        // Four steps per iteration: one 16-byte load of A serves four sdot
        // lane groups.
        unrolled_steps(
            a,
            CNT,
            done,
            4,
            &|a| {
                a.comment("steady state (gemv): 4 lp-steps");
                a.ldr_q_post(V(plan.a.start), XA, 16);
                for lane in 0..4 {
                    load_b(a, spec, plan);
                    macs(a, spec, plan, Some(lane));
                }
            },
            &|a| {
                load_a(a, spec, plan);
                load_b(a, spec, plan);
                macs(a, spec, plan, None);
            },
        );
    } else if spec.paired_steps {
        // Two steps per iteration: the 16-byte load's low nibbles are the
        // first step's codes, its high nibbles the second's. An odd last
        // step (the end of K) uses the low half of a padded load.
        let lo = b_unit(spec, plan, 0);
        let hi = b_unit(spec, plan, 1);
        unrolled_steps(
            a,
            CNT,
            done,
            2,
            &|a| {
                a.comment("steady state: two lp-steps per 16-byte load of codes");
                load_a(a, spec, plan);
                load_b(a, spec, plan);
                macs_of(a, spec, plan, None, &|_| lo);
                load_a(a, spec, plan);
                macs_of(a, spec, plan, None, &|_| hi);
            },
            &|a| {
                load_a(a, spec, plan);
                load_b(a, spec, plan);
                macs_of(a, spec, plan, None, &|_| lo);
            },
        );
    } else {
        let top = a.new_label();
        a.cbz(CNT, done);
        a.bind(top);
        a.comment("steady state: one lp-step");
        load_a(a, spec, plan);
        load_b(a, spec, plan);
        macs(a, spec, plan, None);
        a.subs_imm(CNT, CNT, 1);
        a.b_cond(Cond::Ne, top);
    }
    a.bind(done);
}

/// Column blocks of the accumulator layout: (width in columns of one
/// accumulator register lane group, number of blocks).
fn col_blocks(spec: &Int8Spec) -> (u32, u32) {
    match spec.mac {
        Mac::Sdot | Mac::Smull => (4, spec.hp.div_ceil(4)),
        Mac::Smmla => (2, spec.hp / 2),
    }
}

/// Rows of one accumulator register.
fn row_unit(spec: &Int8Spec) -> u32 {
    match spec.mac {
        Mac::Smmla => 2,
        _ => 1,
    }
}

/// Load the `cols` (≤ 4) f32 at [base + off] into `v` without reading past
/// them.
fn load_cols(a: &mut A64, v: V, base: X, off: u32, cols: u32, tmp: X) {
    match cols {
        4 => a.ldr_q(v, base, off),
        2 => a.ldr_d(v, base, off),
        1 => a.ldr_s(v, base, off),
        _ => {
            a.ldr_d(v, base, off);
            a.add_imm(tmp, base, off + 8);
            a.ld1_s_lane(v, 2, tmp);
        }
    }
}

/// Load the `cols` (≤ 4) f16 at [base + off] into the low half of `v`
/// without reading past them, and widen them to f32 (`fcvtl`).
fn load_cols_f16(a: &mut A64, v: V, base: X, off: u32, cols: u32, tmp: X) {
    match cols {
        4 => a.ldr_d(v, base, off),
        2 => a.ldr_s(v, base, off),
        1 => a.ldr_h_off(v, base, off),
        _ => {
            a.ldr_s(v, base, off);
            a.add_imm(tmp, base, off + 4);
            a.ld1_h_lane(v, 2, tmp);
        }
    }
    a.fcvtl_4s(v, v);
}

/// Load the group parameters (scales or offsets) of accumulator column
/// block `j` at `base` into `v` as f32: `cols` columns for the 1×4 blocks,
/// the column pair replicated over both rows for `smmla`'s 2×2 blocks.
/// f16 parameters are widened with `fcvtl`.
fn load_params(a: &mut A64, spec: &Int8Spec, v: V, base: X, j: u32, cols: u32) {
    let pb = spec.param_bytes;
    match (spec.mac, pb) {
        (Mac::Smmla, 4) => {
            a.add_imm(T3, base, j * 8);
            a.ld1r_2d(v, T3);
        }
        (Mac::Smmla, _) => {
            a.add_imm(T3, base, j * 4);
            a.ld1r_2s(v, T3);
            a.fcvtl_4s(v, v);
        }
        (_, 4) => load_cols(a, v, base, j * 16, cols, T3),
        _ => load_cols_f16(a, v, base, j * 8, cols, T3),
    }
}

/// `v` = Σqx of the next accumulator row at T1 (which moves on by
/// GSTRIDE per row): one row broadcast, or the row pair (r, r, r+1, r+1)
/// of an `smmla` 2×2 block.
fn load_row_sums(a: &mut A64, spec: &Int8Spec, v: V) {
    match spec.mac {
        Mac::Smmla => {
            // A whole-register load first: a lane insert would wait for the
            // previous row pair's use of `v` (a chain through every row
            // pair of the group).
            a.ldr_s(v, T1, 0);
            a.add(T1, T1, GSTRIDE);
            a.ld1_s_lane_post(v, 2, T1, GSTRIDE);
            a.trn1_4s(v, v, v);
        }
        _ => a.ld1r_4s_post(v, T1, GSTRIDE),
    }
}

/// Whether the implied zero point is folded into the accumulators' start
/// value (−zp·Σqx, set before the group's MACs) rather than subtracted
/// from each accumulator after them. The `smull` accumulators hold lane
/// partials that the epilogue sums, so they keep the subtraction.
fn zero_point_at_start(spec: &Int8Spec) -> bool {
    spec.zero_point.is_some() && spec.mac != Mac::Smull && !spec.signed_nibbles
}

/// The nibble-unpack constants, set at every group start (the group
/// epilogue reuses their registers): 0x0F in the mask, or for signed
/// nibbles 0xF0 in the mask and 0x88 in the staging register.
/// Whether the group epilogue's registers fit in A and B alone, so the
/// unpack constants (mask, staging) survive it and are made once per row
/// block rather than every group (two `movi` a group on the vector pipes).
fn constants_survive(spec: &Int8Spec, plan: &RegisterPlan) -> bool {
    let per_block = if spec.asym { 2 } else { 1 };
    let (_, jn) = col_blocks(spec);
    spec.mac != Mac::Smull && (plan.a.len() + plan.b.len()) as u32 >= 2 + jn * per_block
}

/// The registers the group epilogue may use: [`RegisterPlan::free_in_epilogue`]
/// less the unpack constants where they survive ([`constants_survive`]).
fn group_epilogue_regs(spec: &Int8Spec, plan: &RegisterPlan) -> Vec<V> {
    let mut free = plan.free_in_epilogue();
    if constants_survive(spec, plan) {
        free.retain(|&v| v != plan.mask && v != plan.stage);
    }
    free
}

fn unpack_constants(a: &mut A64, spec: &Int8Spec, plan: &RegisterPlan) {
    if spec.wbits != 4 {
        return;
    }
    if spec.signed_nibbles {
        a.movi_16b(plan.mask, 0xF0);
        if !spec.stored_signed {
            a.movi_16b(plan.stage, 0x88);
        }
    } else {
        a.movi_16b(plan.mask, 15);
    }
}

/// Before a group's MACs, with [`zero_point_at_start`]: every accumulator
/// of set 0 starts at −zp·Σqx of its row (row pair for `smmla`), built in
/// the row's first accumulator and copied to the others. The epilogue then
/// converts the sums as they are and leaves the accumulators for this to
/// overwrite, which saves a `sub` and a `movi` per accumulator per group.
fn start_group(a: &mut A64, spec: &Int8Spec, plan: &RegisterPlan) {
    let Some(zp) = spec.zero_point.filter(|_| zero_point_at_start(spec)) else {
        return;
    };
    let (_, jn) = col_blocks(spec);
    a.mov(T1, SG);
    for i in 0..spec.ep / row_unit(spec) {
        let first = plan.acc_reg(i * jn);
        load_row_sums(a, spec, first);
        a.shl_4s(first, first, zp.trailing_zeros());
        a.neg_4s(first, first);
        for j in 1..jn {
            a.mov_v(plan.acc_reg(i * jn + j), first);
        }
    }
}

/// After a group: partial += sw·(acc − zp·Σqx) + off·Σqx, accumulators
/// cleared (the offset term for asymmetric weights, the implied zero point
/// for `u4sym`, neither for symmetric ones).
fn group_epilogue(a: &mut A64, spec: &Int8Spec, plan: &RegisterPlan) {
    if spec.param_bytes == 4 && spec.zero_point.is_none() {
        a.comment("group epilogue: int32 -> f32, scale, zero point, into the partial sums");
    } else {
        a.comment(&format!(
            "group epilogue: int32{} -> f32, {} scale{}, into the partial sums",
            match spec.zero_point {
                Some(_) if spec.signed_nibbles =>
                    " (16x sums of signed codes, scvtf #4)".to_string(),
                Some(_) if zero_point_at_start(spec) =>
                    " (zero point folded in at the group start)".to_string(),
                Some(z) => format!(" - {z}*sum(qx)"),
                None => String::new(),
            },
            if spec.param_bytes == 2 {
                "f16 (fcvtl)"
            } else {
                "f32"
            },
            if spec.asym { " and offset" } else { "" }
        ));
    }
    let (bw, jn) = col_blocks(spec);
    let ru = row_unit(spec);
    let rn = spec.ep / ru;
    // smull: fold the 1x1 accumulators into 1x4 blocks first.
    if spec.mac == Mac::Smull {
        for r in 0..spec.ep {
            for j in 0..jn {
                let c0 = 4 * j;
                let reg = |c: u32| plan.acc_reg(r * spec.hp + c.min(spec.hp - 1));
                match spec.hp - c0 {
                    1 => {
                        a.addp_4s(reg(c0), reg(c0), reg(c0));
                        a.addp_4s(reg(c0), reg(c0), reg(c0));
                    }
                    2 => {
                        a.addp_4s(reg(c0), reg(c0), reg(c0 + 1));
                        a.addp_4s(reg(c0), reg(c0), reg(c0));
                    }
                    _ => {
                        // Three columns: the fourth operand repeats the third.
                        a.addp_4s(reg(c0), reg(c0), reg(c0 + 1));
                        a.addp_4s(reg(c0 + 2), reg(c0 + 2), reg(c0 + 3));
                        a.addp_4s(reg(c0), reg(c0), reg(c0 + 2));
                    }
                }
            }
        }
    }
    let acc_of = |r: u32, j: u32| -> V {
        match spec.mac {
            Mac::Smull => plan.acc_reg(r * spec.hp + 4 * j),
            _ => plan.acc_reg(r * jn + j),
        }
    };
    let free = group_epilogue_regs(spec, plan);
    let per_block = if spec.asym { 2 } else { 1 };
    let chunk = ((free.len() as u32 - 2) / per_block).clamp(1, jn);
    let sumv = free[0];
    let tmp = free[1];
    let vecs = &free[2..];
    let mut j0 = 0;
    while j0 < jn {
        let jc = chunk.min(jn - j0);
        if spec.asym {
            a.ldr_x_sp(T2, SLOT_OFFDELTA);
            a.add(T2, PG, T2);
        }
        for jj in 0..jc {
            let j = j0 + jj;
            let cols = (spec.hp - j * bw).min(bw);
            let sc = vecs[(jj * per_block) as usize];
            load_params(a, spec, sc, PG, j, cols);
            if spec.asym {
                let of = vecs[(jj * per_block + 1) as usize];
                load_params(a, spec, of, T2, j, cols);
            }
        }
        // Where the accumulators start at −zp·Σqx (their next group start
        // overwrites them) and where no zero-point term is left to apply.
        let started = zero_point_at_start(spec);
        let folded = started || spec.signed_nibbles;
        let sums = spec.asym || (spec.zero_point.is_some() && !folded);
        if sums {
            a.mov(T1, SG);
        }
        for i in 0..rn {
            if sums {
                load_row_sums(a, spec, sumv);
            }
            if let Some(z) = spec.zero_point.filter(|_| !folded) {
                a.shl_4s(sumv, sumv, z.trailing_zeros());
            }
            if spec.asym {
                a.scvtf_4s(sumv, sumv);
            }
            for jj in 0..jc {
                let j = j0 + jj;
                let acc = acc_of(i, j);
                let off = 16 * (i * jn + j);
                let sc = vecs[(jj * per_block) as usize];
                if spec.signed_nibbles {
                    a.scvtf_4s_fixed(acc, acc, 4);
                } else {
                    if spec.zero_point.is_some() && !folded {
                        a.sub_4s(acc, acc, sumv);
                    }
                    a.scvtf_4s(acc, acc);
                }
                let partial = plan.partial_reg(i * jn + j);
                let sum = partial.unwrap_or(tmp);
                if partial.is_none() {
                    a.ldr_q(tmp, SCR, off);
                }
                a.fmla_4s(sum, acc, sc);
                if spec.asym {
                    let of = vecs[(jj * per_block + 1) as usize];
                    a.fmla_4s(sum, of, sumv);
                }
                if partial.is_none() {
                    a.str_q(tmp, SCR, off);
                }
                if !started {
                    a.zero(acc);
                }
            }
        }
        j0 += jc;
    }
    if spec.mac == Mac::Smull {
        // The folded-away registers still hold int32 sums: clear them too.
        for r in plan.acc.clone() {
            a.zero(V(r));
        }
    }
}

/// Partial sum `i` of the row block: its register, or loaded from the
/// stack scratch into `tmp`.
fn partial_sum(a: &mut A64, plan: &RegisterPlan, i: u32, tmp: V) -> V {
    plan.partial_reg(i).unwrap_or_else(|| {
        a.ldr_q(tmp, SCR, 16 * i);
        tmp
    })
}

/// After all groups: stage[r, c] = sx[r]·partial[r, c], then the store.
fn tile_epilogue(a: &mut A64, spec: &Int8Spec, plan: &RegisterPlan, lay: &Layout) {
    a.comment("tile epilogue: activation scale, bias, store");
    let (_, jn) = col_blocks(spec);
    let free = plan.free_in_epilogue();
    let (sx, tmp) = (free[0], free[1]);
    a.ldr_x(T1, ARGS, MM_X_SCALES as u32);
    a.add_lsl(T1, T1, R0, 2);
    match spec.mac {
        Mac::Smmla => {
            for i in 0..spec.ep / 2 {
                a.ldr_d_post(sx, T1, 8);
                a.zip1_4s(sx, sx, sx);
                for j in 0..jn {
                    let part = partial_sum(a, plan, i * jn + j, tmp);
                    a.fmul_4s(tmp, part, sx);
                    let row0 = 2 * i * lay.row_bytes + 8 * j;
                    a.str_d(tmp, STAGE, row0);
                    a.add_imm(T3, STAGE, row0 + lay.row_bytes);
                    a.st1_d_lane1(tmp, T3);
                }
            }
        }
        _ => {
            for r in 0..spec.ep {
                a.ldr_s_post(sx, T1, 4);
                for j in 0..jn {
                    let part = partial_sum(a, plan, r * jn + j, tmp);
                    a.fmul_4s_elem(tmp, part, sx, 0);
                    a.str_q(tmp, STAGE, r * lay.row_bytes + 16 * j);
                }
            }
        }
    }
    // rows = min(ep, m - R0); y row = YCOL + R0·y_stride.
    a.sub(ROWS, M, R0);
    a.mov_imm(T0, u64::from(spec.ep));
    a.cmp(ROWS, T0);
    a.csel(ROWS, ROWS, T0, Cond::Lo);
    a.madd(T0, R0, YSTRIDE, YCOL);
    let regs = StoreRegs {
        gp: [T1, T2, T3, T4, X(30)],
        v: [sx, tmp],
    };
    // x30 (the link register) is a scratch here: save it around the store.
    a.push_pair(X(29), X(30));
    frame::store_tile(
        a,
        STAGE,
        lay.row_bytes,
        spec.hp,
        ROWS,
        COLS,
        T0,
        YSTRIDE,
        BIAS,
        OutType::F32,
        spec.relu,
        &regs,
    );
    a.pop_pair(X(29), X(30));
}
