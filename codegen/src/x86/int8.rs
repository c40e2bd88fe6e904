//! Integer matmul kernels: `i8dyn` activations (quantized by the emitted
//! [`super::quantize`] pass into `[e/ep, l/4, ep, 4]`) with `i8sym:row`
//! (W8A8) or grouped weights: 4-bit (W4A8, int4 pair-transposed)
//! `u4asym:gN` and `u4sym:gN` (ggml Q4_0's zero point 8), and 8-bit
//! `i8sym:gN` (ggml Q8_0), N a power of two from 8 to 128, with f32 or f16
//! group parameters. Grouped 8-bit codes use W8A8's sign trick per step and
//! the 4-bit group fold.
//!
//! The MAC is `vpmaddubsw` (u8 × s8 → pairs summed to i16) then `vpmaddwd`
//! with int16 ones (→ i32, 4 bytes of l per i32 lane: lp = 4), or with
//! one `vpdpbusd` where the CPU has it ([`Dot`]: AVX-VNNI's VEX form, or
//! AVX512-VNNI's EVEX form on ymm). One ymm of B is 8 output channels × 4
//! k: dword c = channel c's 4 codes, exactly the `[hp, lp]` order of one
//! packed step. One A register is a row's 4 codes broadcast to all dwords.
//!
//! **W8A8.** vpmaddubsw wants unsigned weights: the sign moves onto the
//! activation, `|w| · (x·sign w)` (`vpabsb`, `vpsignb`); |codes| ≤ 127 so
//! pair sums (≤ 2·127·127) never saturate. One group per row, so the i32
//! accumulators run over all of K and are scaled once: y = sx·sw·acc.
//!
//! **W4A8.** One packed step of 8 channels is one pair-transposed run of 32
//! codes (16 bytes): byte b holds code b (channel b/4) in its low nibble and
//! code b + 16 (channel 4 + b/4) in its high one. `vbroadcasti128` puts the
//! run in both 128-bit lanes, `vpsrlvd` by (0,0,0,0,4,4,4,4) moves the high
//! nibbles down in the upper lane only, `vpand` 0x0F keeps the nibbles: the
//! lanes then hold channels 0-3 and 4-7 in order, no permute. Codes are
//! unsigned (0..15) and the activations signed, as vpmaddubsw wants. A
//! group (g/4 ≤ 8 steps) sums in int16 (|sum| ≤ 8·2·15·127 < 2^15), then
//! `vpmaddwd` widens it and y += sw_g·dot_g + min_g·Σq_g in f32; y·sx at
//! the end. Longer groups (64, 128, …) would overflow int16, so each step
//! widens at once (`vpmaddwd` with the ones in the frame, `vpaddd`), as
//! ggml's AVX2 loop does. `u4sym` has no stored offset: the quantizer
//! writes −8·Σq_g and a group sum starts from it (one broadcast load, the
//! way the NEON GEMV starts its `sdot` sums): an i32 sum from the whole
//! value, an int16 one from it split over its two int16 lanes
//! ([`Int8Spec::sums_in_int16_halves`]); then y += sw_g·(dot_g − 8·Σq_g)
//! with one FMA. f16 parameters are widened at the group end with
//! `vcvtph2ps` (F16C): once per group into registers the tile leaves
//! free, else per use into the shift-count register, which is reloaded
//! from the frame afterwards.
//!
//! # One nest, two register files
//!
//! The loop nest (frame counts, the m = 1 dispatch, panels → row blocks →
//! groups → k steps, the group-end fold, x scales, bias and store) is
//! written once here, generic over `Int8File`, a register file's int8
//! side; this module's [`Int8Spec`] is the ymm front-end and
//! [`super::avx512_int8::Avx512Int8Spec`] the zmm one (its module doc has
//! the zmm register plan). What differs is a property of the file:
//!
//! | | ymm | zmm |
//! |---|---|---|
//! | formats | W8A8 and every grouped one | grouped with a zero point (`vpdpbusd` only) |
//! | dot products | [`Dot`]: `vpmaddubsw` + `vpmaddwd`, the sign trick, `vpdpbusd` | `vpdpbusd` |
//! | a row's codes, x scales | broadcast into A / ymm13 | `{1to16}` operands |
//! | f32 totals of grouped weights | a stack area (too few registers) | registers |
//! | f16 group parameters | once per group into free registers, else per use into the shift counts | scales into B once per group, offsets into the folded sums |
//! | 4-bit unpack | `vbroadcasti128`, `vpsrlvd`, `vpand` | two blocks per load: `vpandd`; `vpsrld`, `vpandd` (a lone block: `vbroadcasti64x4`, `vpsrld` under k2, `vpandd`), channels in an order of its own; or a panel unpacked once |
//! | frame | `super::common`'s, rsp-based | its own, r15-based, opmask table first |
//! | Σq registers (base, stride, walker) | r13, r14, rax | r11, r12, r13 |
//! | the one-row loop | steps rbp | walks r14 within blocks of ep rows |
//! | store | `common::store_tile`, eight rows at a time | per column block under opmask k3, one y pointer per row |
//! | weight prefetch (flat, one row) | [`WeightPrefetch`] (the backend's) | the same |
//!
//! # Register plans (ymm)
//!
//! Both loops keep one register per (row, column block) live across the k
//! loop and broadcast each row's activations into ONE renamed A register
//! (as the float loop does), so up to 10 rows of one column block fit
//! (the solver's tile for GEMM; 8×8 for a flat GEMM at M = 8): every row
//! of M ≤ 8 is one row block and each weight byte is read once per call.
//!
//! W8A8 (rows = ep, or 1 for the m = 1 loop; the k loop runs column block
//! j outer, row i inner, and rebroadcasts row i's codes per block when
//! hb > 1):
//!
//! | ymm | holds |
//! |---|---|
//! | 0 .. rows·hb | i32 accumulators acc(i,j) |
//! | then 1 | A: row i's 4 codes broadcast (renamed per row) |
//! | then 1 | B: \|w\| of one column block |
//! | then 1 | raw w (reserved: packed weight bytes) |
//! | then 1 | product temp (reserved: vpmaddubsw pairs) |
//! | then 1 | int16 ones (reserved: vpmaddwd) |
//!
//! W4A8: the registers hold only the current group's integer sums; the f32
//! totals live in an aligned area of the stack, opened below the shared
//! frame for the k loop (rsp moves down by `acc_area_bytes`, so the area
//! stays above rsp and the loop addresses the shared frame with that
//! added) and read back into the accumulator registers before the
//! epilogue. At each group end, per row
//! and column block: (`vpmaddwd` with ones,) `vcvtdq2ps`, then
//! total += sw_g·dot_g + min_g·Σq_g with two FMAs on the total loaded into
//! B's first register, and stored back.
//!
//! | ymm | holds |
//! |---|---|
//! | 0 .. rows·hb | int16 group sums (i32 with VNNI) g(i,j) |
//! | then 1 | A: one row's codes; Σq as f32 at a group end |
//! | then hb | B: unpacked codes of column block j; an f32 total at a group end |
//! | then 1 | 0x0F mask (reserved) |
//! | then 1 | shift counts (reserved: in place of a staging register) |
//! | then 1 | product temp (reserved; int16 ones at a group end) |
//! | then rows·hb | with `vpdpbusd` and fewer sums than [`Dot::chains_in_flight`], where they fit: the odd steps' group sums |
//! | then hb (·2 with offsets) | f16 group parameters at a group end, where they fit (`widened_params`) |
//!
//! ymm13-15 serve the shared epilogue after the loops (`super::common`).
//!
//! General-purpose registers: rdi = args, rsi = weights (bias in the
//! epilogue), rcx = step counter (valid columns in the epilogue), r8 = the
//! row block's activations, r9 = scales, r10 = offsets, rbx = panel, rbp =
//! first row. W4A8's k loop: r11 = f32 total area, r13 = row 0's Σq of
//! the current group, r14 = Σq row stride, rax walks the rows. Epilogue:
//! r8..r15 = y rows, eight rows at a time.

use tessera_dsl::ir::{Activation, Format, ParamType};

use super::asm::*;
use super::common::{self, LOCAL0, LOCAL1, LOCAL2, NIBBLE, ONES16, SHIFTS, Store, nest};
use super::prefetch::WeightPrefetch;
use super::regfile::RegisterFile;
use crate::abi::*;
use crate::artifact::{EmitError, MachineCode, Variant};

/// k steps (of 4) per unrolled W8A8 iteration.
const UNROLL: usize = 4;
/// y row pointers in the epilogue; a taller tile stores eight rows at a time.
const YROWS: [Gp; 8] = [R8, R9, R10, R11, R12, R13, R14, R15];
/// Most rows the emitter handles (the register plan is the real limit:
/// accumulators must stay below the epilogue's ymm13).
pub const MAX_ROWS: usize = 12;

/// What an int8 kernel computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Int8Spec {
    pub ep: usize,
    /// hp / lanes (8 on ymm).
    pub hb: usize,
    /// Group length of grouped weights (4-bit, or 8-bit `i8sym:gN`);
    /// None for `i8sym:row`.
    pub group: Option<usize>,
    /// Bits per weight code of grouped weights (4 or 8).
    pub wbits: u32,
    /// How grouped weights' zero point enters the group fold.
    pub zero: ZeroPoint,
    /// Storage precision of grouped weights' parameters.
    pub params: ParamType,
    pub y: Format,
    pub bias: bool,
    pub activation: Activation,
    /// The dot-product instruction of the k loop.
    pub dot: Dot,
}

/// The instruction that multiplies u8 by s8 codes and sums them into i32
/// lanes. Every x86 CPU with AVX2 has the first; `vpdpbusd` does the same
/// in one instruction (and without int16 saturation) in either encoding.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Dot {
    /// `vpmaddubsw` (pairs to int16) then `vpmaddwd` with ones (to i32).
    #[default]
    MaddUbsw,
    /// `{vex} vpdpbusd` (AVX-VNNI: Alder Lake, Sapphire Rapids, Zen 5).
    VexVnni,
    /// `{evex} vpdpbusd` on ymm (AVX512-VNNI with AVX512VL: Zen 4, Ice
    /// Lake, which lack AVX-VNNI).
    EvexVnni,
}

impl Dot {
    /// Whether the k loop sums with `vpdpbusd` (straight into i32).
    pub fn is_vnni(self) -> bool {
        self != Dot::MaddUbsw
    }

    /// Independent sums this dot product needs in flight to issue every
    /// cycle it can, where a loop with fewer is bound by their chains:
    /// `vpdpbusd` adds into its destination, latency 4-5 cycles, two a
    /// cycle on ymm (measured on Zen 4: 4 cycles, 0.53 cycles apart; zmm
    /// one a cycle there, two on CPUs with two 512-bit units), so 8.
    /// None for `vpmaddubsw` + `vpmaddwd`, whose sums take a 1-cycle add.
    pub fn chains_in_flight(self) -> Option<usize> {
        self.is_vnni().then_some(8)
    }

    fn name(self) -> &'static str {
        match self {
            Dot::MaddUbsw => "vpmaddubsw+vpmaddwd",
            Dot::VexVnni => "vpdpbusd",
            Dot::EvexVnni => "{evex} vpdpbusd",
        }
    }

    /// `acc.i32 += Σ₄ u.u8 · s.s8` with this dot product: one `vpdpbusd`,
    /// or `vpmaddubsw` into `t`, `vpmaddwd` with the int16 `ones`, `vpaddd`
    /// (`t` may be `s`).
    fn accumulate(self, a: &mut X86Asm, acc: Ymm, u: Ymm, s: Ymm, t: Ymm, ones: Operand<Ymm>) {
        if self.is_vnni() {
            return self.dpbusd(a, acc, u, s);
        }
        a.vpmaddubsw(t, u, s);
        match ones {
            Operand::Reg(o) => a.vpmaddwd(t, t, o),
            Operand::Mem(m) => a.vpmaddwd_mem(t, t, m),
            Operand::Broadcast(_) => unreachable!("the int16 ones are a whole vector"),
        }
        a.vpaddd(acc, acc, t);
    }

    /// `acc.i32 += Σ₄ u.u8 · s.s8` in this encoding (VNNI forms only).
    fn dpbusd(self, a: &mut X86Asm, acc: Ymm, u: Ymm, s: Ymm) {
        match self {
            Dot::VexVnni => a.vpdpbusd(acc, u, s),
            Dot::EvexVnni => a.vpdpbusd_ymm_evex(acc, u, s),
            Dot::MaddUbsw => unreachable!("vpmaddubsw has no one-instruction dot"),
        }
    }
}

/// How grouped weights' zero point enters the group fold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ZeroPoint {
    /// Symmetric codes (`i8sym:gN`): total += sw·dot.
    None,
    /// Stored offsets (`u4asym`): total += sw·dot + min·Σq.
    Offset,
    /// `u4sym`'s implied 8: total += sw·(dot − 8·Σq).
    Implied8,
    /// Symmetric 8-bit codes read as unsigned w + 128 (their sign bit
    /// flipped, so `vpdpbusd` takes them as its unsigned operand):
    /// total += sw·(dot − 128·Σq). With `vpdpbusd` one instruction per row
    /// and step, where the sign trick (`vpabsb` per column block, `vpsignb`
    /// per row) takes three; `vpmaddubsw` would saturate on such codes, so
    /// that dot product refuses it.
    Implied128,
}

impl ZeroPoint {
    /// Whether the fold reads Σq per row and group (the quantizer's sums).
    pub fn needs_sums(self) -> bool {
        self != ZeroPoint::None
    }

    /// The power of two (as a shift) of an implied zero point. The
    /// quantizer writes Σq already times it and negated, −2^shift·Σq
    /// ([`super::quantize`]), so a group's sums start from it (no zero
    /// point left to take off at the fold; int16 sums from its two halves).
    pub fn implied_shift(self) -> Option<u8> {
        match self {
            ZeroPoint::Implied8 => Some(3),
            ZeroPoint::Implied128 => Some(7),
            _ => None,
        }
    }
}

/// Emit the kernel: the GEMM variant (with the one-row loop for m = 1).
pub fn emit(spec: &Int8Spec) -> Result<MachineCode, EmitError> {
    emit_variant(spec, Variant::Gemm)
}

/// Emit one variant. Every variant keeps all of K in registers per row
/// block (panel → row block → K), so with m ≤ ep each weight byte is read
/// once per call and larger m re-reads the panel from L2. `Gemv` runs
/// every row through the one-row loop; `FlatGemm` and the one-row loop
/// prefetch the weight stream ([`WeightPrefetch::INT8`]); `Gemm` leaves it to
/// the hardware prefetcher (compute-bound).
pub fn emit_variant(spec: &Int8Spec, variant: Variant) -> Result<MachineCode, EmitError> {
    emit_variant_prefetching(spec, variant, WeightPrefetch::INT8)
}

/// [`emit_variant`] with the weight stream prefetched by `prefetch`.
pub fn emit_variant_prefetching(
    spec: &Int8Spec,
    variant: Variant,
    prefetch: WeightPrefetch,
) -> Result<MachineCode, EmitError> {
    if spec.ep > MAX_ROWS || spec.ep == 0 || spec.hb == 0 {
        return Err(EmitError::BadTile {
            tile: format!("{}x{}x4", spec.ep, spec.hb * 8),
            why: format!("the int8 kernel keeps 1 to {MAX_ROWS} rows"),
        });
    }
    if spec.zero == ZeroPoint::Implied128 && (!spec.dot.is_vnni() || spec.wbits != 8) {
        return Err(EmitError::Unsupported {
            backend: super::NAME,
            what: "8-bit codes read as unsigned (zero point 128) without vpdpbusd, whose int16 pair sums would saturate"
                .into(),
        });
    }
    emit_on::<Ymm>(
        &Int8Kernel {
            spec: *spec,
            prefetch: Some(prefetch),
        },
        variant,
    )
}

// ---- the loop nest, on either register file --------------------------------

/// What the emitter builds, whichever register file: the front-ends
/// ([`Int8Spec`], [`super::avx512_int8::Avx512Int8Spec`]) check their spec
/// and fill this in.
#[derive(Clone, Copy, Debug)]
pub(super) struct Int8Kernel {
    /// What to compute; its hb counts the register file's lanes (16 for
    /// zmm).
    pub spec: Int8Spec,
    /// How the flat and one-row loops prefetch the weight stream (distance
    /// and cache); None: never.
    pub prefetch: Option<WeightPrefetch>,
}

/// The kernel reads as its spec (`k.ep`, `k.group`, …).
impl std::ops::Deref for Int8Kernel {
    type Target = Int8Spec;
    fn deref(&self) -> &Int8Spec {
        &self.spec
    }
}

impl Int8Spec {
    /// 8-bit codes (W8A8's, or grouped).
    pub fn bytes(&self) -> bool {
        self.wbits == 8
    }
    /// k steps per group (W8A8: unused).
    fn steps_per_group(&self) -> i32 {
        self.group.unwrap_or(32) as i32 / 4
    }
    /// Without `vpdpbusd`, group sums widen to i32 at every step: int16
    /// sums of 4-bit codes stay exact up to 8 steps (32 codes), and 8-bit
    /// codes' pair sums (≤ 2·127·127) already fill an int16.
    pub fn wide(&self) -> bool {
        !self.dot.is_vnni() && (self.steps_per_group() > 8 || self.bytes())
    }
    /// int16 group sums, widened once at the group end.
    fn narrow(&self) -> bool {
        !self.dot.is_vnni() && !self.wide()
    }
    /// Whether the quantizer writes a group's −2^s·Σq as two int16 halves
    /// of one dword, the low one over the codes at k ≡ 0, 1 (mod 4) and
    /// the high one over k ≡ 2, 3: the two int16 lanes `vpmaddubsw` sums
    /// each channel's pairs into, so int16 group sums start from it as
    /// i32 ones do. Exact for `u4sym`: each half is at most 8·16·127 =
    /// 16256 in magnitude, and so is every partial sum from it, each step
    /// replacing −8·x by (q − 8)·x with |q − 8| ≤ 8.
    pub fn sums_in_int16_halves(&self) -> bool {
        self.narrow() && self.zero.implied_shift().is_some()
    }
}

impl Int8Kernel {
    fn grouped(&self) -> bool {
        self.group.is_some()
    }
    /// Grouped 4-bit codes (two per byte).
    pub fn nibbles(&self) -> bool {
        self.grouped() && self.wbits == 4
    }
    /// 8-bit codes read as unsigned w + 128.
    pub fn flip(&self) -> bool {
        self.zero == ZeroPoint::Implied128
    }
    fn f16_params(&self) -> bool {
        self.params == ParamType::F16
    }
    /// Bytes of one group parameter (W8A8's row scales: f32).
    fn param_bytes(&self) -> i32 {
        if self.grouped() {
            self.params.bytes() as i32
        } else {
            4
        }
    }
    /// Parameter sets per group: scales, and offsets for `u4asym`.
    fn param_sets(&self) -> i32 {
        if self.grouped() && self.zero == ZeroPoint::Offset {
            2
        } else {
            1
        }
    }
    /// Bytes of one packed weight step of `hp` channels.
    pub fn packed_step(&self, hp: i32) -> i32 {
        if self.nibbles() { hp * 2 } else { hp * 4 }
    }
    /// The weight format's text form (`u4sym:g32:f16`).
    fn weights(&self) -> String {
        match self.group {
            Some(g) => format!(
                "{}:g{g}{}",
                match (self.wbits, self.zero) {
                    (8, _) => "i8sym",
                    (_, ZeroPoint::Implied8) => "u4sym",
                    _ => "u4asym",
                },
                if self.f16_params() { ":f16" } else { "" }
            ),
            None => "i8sym:row".into(),
        }
    }
}

/// Frame slots the nest reads, at `base`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Int8Frame {
    pub base: Gp,
    /// Steps of 4 along k.
    pub steps: i32,
    /// Groups per row (1 for W8A8).
    pub groups: i32,
    /// Steps left in the row block (the group loop's counter).
    pub left: i32,
    /// Files whose multi-row loop may run on a panel unpacked once into a
    /// stack buffer: the slot of its pointer (0 when K is too long).
    pub panel_buffer: Option<i32>,
}

/// The vector registers of one loop, as register numbers (see the module
/// doc's tables).
#[derive(Clone, Copy, Debug)]
pub(super) struct Int8Regs {
    pub rows: usize,
    pub hb: usize,
    /// First f32 total acc(i,j) (W8A8: its i32 sums), the epilogue's
    /// accumulators.
    pub totals: usize,
    /// First integer group sum g(i,j) (the totals' registers when the
    /// totals live in memory).
    pub sums: usize,
    /// A: a row's codes broadcast (None with embedded broadcast).
    pub a: Option<usize>,
    /// Σq of one row at a group end.
    pub sigma: usize,
    /// First B register.
    pub b: usize,
    /// One B register per column block (else one for all).
    pub b_per_block: bool,
    /// First of the file's reserved registers (None: it has none).
    pub reserved: Option<usize>,
    /// First register of a second set of group sums that a group's odd
    /// steps add into ([`loop_regs`]); None: every step adds into
    /// `sums`.
    pub odd_sums: Option<usize>,
}

impl Int8Regs {
    pub fn total<V: RegisterFile>(&self, i: usize, j: usize) -> V {
        V::reg(self.totals + i * self.hb + j)
    }
    pub fn sum<V: RegisterFile>(&self, i: usize, j: usize) -> V {
        V::reg(self.sums + i * self.hb + j)
    }
    /// The sum register step `u` of a group adds into.
    pub fn step_sum<V: RegisterFile>(&self, i: usize, j: usize, u: i32) -> V {
        match self.odd_sums {
            Some(first) if u % 2 == 1 => V::reg(first + i * self.hb + j),
            _ => self.sum(i, j),
        }
    }
    pub fn b<V: RegisterFile>(&self, j: usize) -> V {
        V::reg(self.b + if self.b_per_block { j } else { 0 })
    }
    pub fn a<V: RegisterFile>(&self) -> V {
        V::reg(self.a.expect("an A register"))
    }
    pub fn reserved<V: RegisterFile>(&self, n: usize) -> V {
        V::reg(self.reserved.expect("reserved registers") + n)
    }
}

/// The register plan of a loop of `rows` rows: the file's, with the
/// second set of group sums ([`Int8Regs::odd_sums`]) where the dot
/// product's chains want more sums than the tile has
/// ([`Dot::chains_in_flight`]) and the file has a register for each.
pub(super) fn loop_regs<V: Int8File>(k: &Int8Spec, rows: usize) -> Int8Regs {
    let grouped = k.group.is_some();
    let mut r = V::regs(rows, k.hb, grouped);
    let sums = rows * k.hb;
    let free = V::first_free(&r);
    let short = k.dot.chains_in_flight().is_some_and(|chains| sums < chains);
    if grouped && short && free + sums <= V::REGISTERS {
        r.odd_sums = Some(free);
    }
    r
}

/// A vector operand: a register, a full vector in memory, or one dword in
/// memory broadcast by the instruction itself (`{1to16}`).
#[derive(Clone, Copy, Debug)]
pub(super) enum Operand<V> {
    Reg(V),
    Mem(Mem),
    Broadcast(Mem),
}

/// The int8 side of a register file: its frame, register plan, how codes
/// are loaded and multiplied, and how a tile is stored. Methods a file
/// never reaches (its front-end refuses the format) keep the default.
pub(super) trait Int8File: RegisterFile {
    const INT8_FRAME: Int8Frame;
    /// Where the group's f32 totals live: registers, or (too few of them)
    /// a stack area below the frame.
    const TOTALS_IN_REGISTERS: bool;
    /// Instructions read a row's codes and scale with a `{1to16}`
    /// broadcast (no A register, no scale temporary).
    const EMBEDDED_BROADCAST: bool;
    /// r14 = the row within the block of ep rows, which the one-row loop
    /// walks.
    const ROW_WALK: bool;
    /// The partial group's loop has a label of its own before the loop's
    /// (listings number labels in order, and the snapshots pin them).
    const SLOW_ENTRY_LABEL: bool;
    /// Σq of the row block's first row for the current group, its row
    /// stride (groups·4), and the register that walks the rows.
    const SUMS: Gp;
    const SUMS_STRIDE: Gp;
    const SUMS_WALK: Gp;

    fn regs(rows: usize, hb: usize, grouped: bool) -> Int8Regs;
    /// The first register a grouped loop of `r`'s plan leaves free.
    fn first_free(r: &Int8Regs) -> usize;
    /// dst = x + y, i32 lanes.
    fn add_i32(a: &mut X86Asm, dst: Self, x: Self, y: Self);
    fn mac_name(dot: Dot) -> &'static str;
    /// Save registers, open the frame, write its constants.
    fn open_frame(a: &mut X86Asm, k: &Int8Kernel);
    /// After the step and group counts: size the panel buffer.
    fn open_panel_buffer(_a: &mut X86Asm, _k: &Int8Kernel) {}
    fn close_frame(a: &mut X86Asm);
    /// r9 = r9 · `bytes` (a power of two).
    fn scale_param_index(a: &mut X86Asm, bytes: i32);
    /// Unpack the panel (rax = its first column) into the buffer.
    fn unpack_panel(_a: &mut X86Asm, _k: &Int8Kernel, _r: &Int8Regs, _hp: i32) {
        unreachable!("no panel buffer on this register file")
    }
    /// W8A8: all of K into the i32 totals.
    fn row_scaled_loop(
        _a: &mut X86Asm,
        _k: &Int8Kernel,
        _r: &Int8Regs,
        _wstep: i32,
        _prefetch: Option<WeightPrefetch>,
    ) {
        unreachable!("no i8sym:row on this register file")
    }
    /// Loop constants of the grouped loop.
    fn group_constants(_a: &mut X86Asm, _r: &Int8Regs) {}
    /// Whether the unpack leaves a tile's channels in an order of the
    /// file's own ([`Int8File::group_params_to_b`] then loads the group
    /// parameters in that order, and [`Int8File::store_tile`] restores
    /// the natural one).
    fn permuted_channels(_k: &Int8Kernel) -> bool {
        false
    }
    /// B(j) = the group parameters at `base` of column block j as f32, in
    /// the order its codes were unpacked (files with the totals in
    /// registers).
    fn group_params_to_b(_a: &mut X86Asm, _k: &Int8Kernel, _r: &Int8Regs, _base: Gp) {
        unreachable!("group parameters are memory operands on this register file")
    }
    /// B register of column block j = the codes of step `at` (rsi
    /// relative) as u8 lanes.
    fn load_codes(a: &mut X86Asm, k: &Int8Kernel, r: &Int8Regs, j: usize, at: i32, prepacked: bool);
    /// g += the dot of B(j) with a row's codes (`x`: the A register, or
    /// a broadcast memory operand). `frame` shifts frame offsets (rsp
    /// moved by the totals area).
    fn dot(
        a: &mut X86Asm,
        k: &Int8Kernel,
        r: &Int8Regs,
        g: Self,
        j: usize,
        x: Operand<Self>,
        frame: i32,
    );
    /// int16 group sums: load the ones, then widen each sum to i32.
    fn narrow_setup(_a: &mut X86Asm, _r: &Int8Regs, _frame: i32) {
        unreachable!("no int16 group sums on this register file")
    }
    fn widen_narrow(_a: &mut X86Asm, _r: &Int8Regs, _g: Self) {
        unreachable!("no int16 group sums on this register file")
    }
    /// The register f16 parameters widen into when the totals live in
    /// memory, and its restore after the fold.
    fn f16_param_reg(_r: &Int8Regs) -> Self {
        unreachable!("f16 parameters widen into B and group sums on this register file")
    }
    fn restore_f16_param_reg(_a: &mut X86Asm, _r: &Int8Regs, _frame: i32) {}

    /// Where a row's x scale is broadcast (files without embedded
    /// broadcast).
    fn x_scale_reg() -> Self {
        unreachable!("x scales are broadcast by the multiply on this register file")
    }

    fn broadcast_i32(a: &mut X86Asm, dst: Self, m: Mem);
    fn cvt_i32(a: &mut X86Asm, dst: Self, src: Self);
    /// dst = the i32 at `m`, broadcast and converted to f32.
    fn cvt_i32_broadcast(_a: &mut X86Asm, _dst: Self, _m: Mem) {
        unreachable!("no embedded broadcast on this register file")
    }
    fn cvt_f16(a: &mut X86Asm, dst: Self, m: Mem);
    /// dst ·= `src`.
    fn mul(a: &mut X86Asm, dst: Self, src: Operand<Self>);
    /// Bias, activation and the store of rows·hb totals (rsi = the
    /// panel's bias). Clobbers every general register but rdi, rbx, rbp
    /// (and r14 with [`Self::ROW_WALK`]).
    fn store_tile(a: &mut X86Asm, k: &Int8Kernel, r: &Int8Regs, hp: i32);
}

/// Emit one variant of `k` on register file `V` (see the module doc).
pub(super) fn emit_on<V: Int8File>(
    k: &Int8Kernel,
    variant: Variant,
) -> Result<MachineCode, EmitError> {
    let f = V::INT8_FRAME;
    let mut a = X86Asm::new();
    a.comment(&format!(
        "{} {variant} x i8dyn w {} y {} tile {}x{}x4 bias {} act {:?} mac {}",
        V::LISTING_NAME,
        k.weights(),
        k.y,
        k.ep,
        k.hb * V::LANES,
        k.bias,
        k.activation,
        V::mac_name(k.dot)
    ));
    V::open_frame(&mut a, k);
    a.load64(RAX, mem(RDI, MM_K));
    a.add_imm(RAX, 3);
    a.shr_imm(RAX, 2);
    a.store64(mem(f.base, f.steps), RAX);
    match k.group {
        Some(g) => {
            a.load64(RAX, mem(RDI, MM_K));
            a.add_imm(RAX, g as i32 - 1);
            a.shr_imm(RAX, g.trailing_zeros() as i8);
        }
        None => a.mov_imm(RAX, 1),
    }
    a.store64(mem(f.base, f.groups), RAX);
    // Only the GEMM unpacks a panel once for all its row blocks. A flat
    // GEMM's M spans a few row blocks, where the buffer's extra pass (a
    // store and a reload of every unpacked byte) costs more than the
    // unpacks it saves: on Zen 5 it made flat M = 9–16 1.6× slower than
    // unpacking in each row block (Q4_0 4096×4096), and with one row
    // block it halved a flat GEMM's speed on Zen 4.
    let buffered = variant == Variant::Gemm && k.nibbles();
    if buffered {
        V::open_panel_buffer(&mut a, k);
    }
    if k.ep > 1 && variant != Variant::Gemv {
        let (one_row, done) = (a.new_label(), a.new_label());
        a.load64(RAX, mem(RDI, MM_M));
        a.cmp_imm(RAX, 1);
        a.jcc(Cond::E, one_row);
        if let Some(buffer) = f.panel_buffer {
            let direct = a.new_label();
            if buffered {
                a.load64(RAX, mem(f.base, buffer));
                a.cmp_imm(RAX, 0);
                a.jcc(Cond::E, direct);
                // One row block reads each panel once: unpacking in the
                // loop is the cheaper way to read it.
                a.load64(RAX, mem(RDI, MM_M));
                a.cmp_imm(RAX, k.ep as i32);
                a.jcc(Cond::Be, direct);
                a.comment(&format!(
                    "{variant}: {} rows per tile, panel unpacked once",
                    k.ep
                ));
                nest::<V>(&mut a, k, k.ep, None, true);
                a.jmp(done);
            }
            a.bind(direct);
        }
        a.comment(&format!("{variant}: {} rows per tile", k.ep));
        let prefetch = k.prefetch.filter(|_| variant == Variant::FlatGemm);
        nest::<V>(&mut a, k, k.ep, prefetch, false);
        a.jmp(done);
        a.bind(one_row);
        a.comment("gemv: one row");
        nest::<V>(&mut a, k, 1, k.prefetch, false);
        a.bind(done);
    } else {
        a.comment("gemv: one row per tile");
        nest::<V>(&mut a, k, 1, k.prefetch, false);
    }
    V::close_frame(&mut a);
    let (bytes, listing) = a.finish().map_err(EmitError::Assembler)?;
    Ok(super::machine_code(bytes, listing))
}

/// rax = n0 + rbx·hp: the panel's first column.
pub(super) fn first_column(a: &mut X86Asm, hp: i32) {
    a.imul_imm(RAX, RBX, hp);
    a.load64(RDX, mem(RDI, MM_N0));
    a.add(RAX, RDX);
}

/// rsi = w + rax·steps·(2 or 4 bytes): the packed panel whose first column
/// is rax. Clobbers rax, rdx.
pub(super) fn packed_panel_ptr<V: Int8File>(a: &mut X86Asm, k: &Int8Kernel) {
    let f = V::INT8_FRAME;
    a.load64(RDX, mem(f.base, f.steps));
    a.imul(RAX, RDX);
    a.shl_imm(RAX, if k.nibbles() { 1 } else { 2 });
    a.load64(RDX, mem(RDI, MM_W));
    a.add(RAX, RDX);
    a.mov(RSI, RAX);
}

/// One loop nest of `rows` rows per tile. With `prepacked` each panel is
/// unpacked once into the stack buffer and every row block loads its B
/// registers from there.
fn nest<V: Int8File>(
    a: &mut X86Asm,
    k: &Int8Kernel,
    rows: usize,
    prefetch: Option<WeightPrefetch>,
    prepacked: bool,
) {
    let f = V::INT8_FRAME;
    let hb = k.hb;
    let hp = (V::LANES * hb) as i32;
    let r = loop_regs::<V>(k, rows);
    let wstep = if prepacked {
        V::BYTES * hb as i32
    } else {
        k.packed_step(hp)
    };

    let panel_loop = nest::panels_head(a);
    if prepacked {
        V::unpack_panel(a, k, &r, hp);
    }
    if V::ROW_WALK {
        a.mov_imm(R14, 0);
    }
    let row_loop = nest::rows_head(a);

    // r8 = x + rbp·steps·4 (row block rbp/ep: ep rows of 4 bytes per step;
    // + r14·4, the row within it, where the one-row loop walks one).
    a.mov(RAX, RBP);
    if !V::ROW_WALK && rows == 1 && k.ep > 1 {
        // One row at a time through blocks of ep rows (the GEMV variant of
        // a tile of several; rbp counts rows): row rbp sits in block
        // rbp/ep at lane rbp%ep, (rbp − rbp%ep)·steps·4 + (rbp%ep)·4.
        let first = a.new_label();
        a.cmp_imm(RBP, 0);
        a.jcc(Cond::E, first);
        a.zero(RDX);
        a.mov_imm(RCX, k.ep as i32);
        a.div(RCX);
        a.imul_imm(RAX, RAX, k.ep as i32);
        a.mov(RCX, RDX);
        a.load64(RDX, mem(f.base, f.steps));
        a.imul(RAX, RDX);
        a.add(RAX, RCX);
        a.bind(first);
    } else {
        a.load64(RDX, mem(f.base, f.steps));
        a.imul(RAX, RDX);
        if V::ROW_WALK {
            a.add(RAX, R14);
        }
    }
    a.shl_imm(RAX, 2);
    a.load64(RDX, mem(RDI, MM_X));
    a.add(RAX, RDX);
    a.mov(R8, RAX);
    // rsi = w + (n0 + rbx·hp)·steps·(4 or 2 bytes per channel and step),
    // or the unpacked panel.
    first_column(a, hp);
    a.mov(R9, RAX); // first column, kept for the parameters
    if let Some(buffer) = f.panel_buffer.filter(|_| prepacked) {
        a.load64(RSI, mem(f.base, buffer));
    } else {
        packed_panel_ptr::<V>(a, k);
    }
    // r9 = params + first column·groups·param_bytes·param_sets; r10 = r9 +
    // groups·hp·param_bytes (the panel's offsets, asymmetric formats).
    let param_bytes = k.param_bytes();
    a.load64(RDX, mem(f.base, f.groups));
    a.imul(R9, RDX);
    V::scale_param_index(a, param_bytes * k.param_sets());
    a.load64(RAX, mem(RDI, MM_W_PARAMS));
    a.add(R9, RAX);

    if k.grouped() {
        a.imul_imm(R10, RDX, hp * param_bytes);
        a.add(R10, R9);
        // Σq stride = groups·4, Σq = x_sums + (rbp + r14)·stride.
        a.mov(V::SUMS_STRIDE, RDX);
        a.shl_imm(V::SUMS_STRIDE, 2);
        a.mov(V::SUMS, RBP);
        if V::ROW_WALK {
            a.add(V::SUMS, R14);
        }
        a.imul(V::SUMS, V::SUMS_STRIDE);
        a.load64(RAX, mem(RDI, MM_X_SUMS));
        a.add(V::SUMS, RAX);
        grouped_loop::<V>(a, k, &r, wstep, prefetch, prepacked);
    } else {
        for i in 0..rows {
            for j in 0..hb {
                V::zero(a, r.total(i, j));
            }
        }
        V::row_scaled_loop(a, k, &r, wstep, prefetch);
    }

    // y = acc·sx (·sw for W8A8; rows past m too: x_scales is padded to
    // whole row blocks), then bias, activation and the store.
    a.mov(RAX, RBP);
    if V::ROW_WALK {
        a.add(RAX, R14);
    }
    a.shl_imm(RAX, 2);
    a.load64(RDX, mem(RDI, MM_X_SCALES));
    a.add(RAX, RDX);
    for i in 0..rows {
        let at = mem(RAX, 4 * i as i32);
        let sx = if V::EMBEDDED_BROADCAST {
            Operand::Broadcast(at)
        } else {
            let tmp = V::x_scale_reg();
            V::broadcast_i32(a, tmp, at);
            Operand::Reg(tmp)
        };
        for j in 0..hb {
            let v = r.total::<V>(i, j);
            if !k.grouped() {
                V::cvt_i32(a, v, v);
                V::mul(a, v, Operand::Mem(mem(R9, V::BYTES * j as i32)));
            }
            V::mul(a, v, sx);
        }
    }
    if k.bias {
        first_column(a, hp);
        a.shl_imm(RAX, 2);
        a.load64(RSI, mem(RDI, MM_BIAS));
        a.add(RSI, RAX);
    }
    V::store_tile(a, k, &r, hp);

    if V::ROW_WALK && rows == 1 && k.ep > 1 {
        // One row at a time through blocks of ep rows: r14 walks the block.
        let same_block = a.new_label();
        a.add_imm(R14, 1);
        a.cmp_imm(R14, k.ep as i32);
        a.jcc(Cond::L, same_block);
        a.mov_imm(R14, 0);
        a.add_imm(RBP, k.ep as i32);
        a.bind(same_block);
        a.mov(RAX, RBP);
        a.add(RAX, R14);
        a.cmp_mem(RAX, mem(RDI, MM_M));
        a.jcc(Cond::L, row_loop);
    } else {
        nest::rows_tail(a, row_loop, rows);
    }
    nest::panels_tail(a, panel_loop, hp);
}

/// Bytes the k loop moves rsp down by when the totals live in memory: the
/// f32 totals of `rows` × `hb` column blocks, plus slack to align them to a
/// register's size (the area register [`TOTALS`] holds the aligned start).
fn totals_area_bytes<V: RegisterFile>(rows: usize, hb: usize) -> i32 {
    V::BYTES * (rows * hb) as i32 + V::BYTES
}

/// The f32 totals area while the totals live in memory.
const TOTALS: Gp = R11;

/// Grouped weights: per group, integer sums (int16, or i32 with
/// `vpdpbusd`, groups over 32 steps or 8-bit codes) in registers; at the
/// group end the f32 totals take sw·dot + min·Σq (`u4sym`: sw·(dot −
/// 8·Σq); `i8sym` read as unsigned: sw·(dot − 128·Σq); `i8sym`: sw·dot),
/// the implied zero points by starting i32 sums from the quantizer's
/// −2^s·Σq ([`seeds_group_sums`]).
/// Leaves the totals in their registers and rsp where it found it.
/// Expects r9/r10 = the panel's scales/offsets and Σq at [`Int8File::SUMS`].
fn grouped_loop<V: Int8File>(
    a: &mut X86Asm,
    k: &Int8Kernel,
    r: &Int8Regs,
    wstep: i32,
    prefetch: Option<WeightPrefetch>,
    prepacked: bool,
) {
    let f = V::INT8_FRAME;
    let (rows, hb) = (r.rows, r.hb);
    let hp = (V::LANES * hb) as i32;
    let ep = k.ep as i32;
    let spg = k.steps_per_group();
    if V::TOTALS_IN_REGISTERS {
        for i in 0..rows {
            for j in 0..hb {
                V::zero(a, r.total(i, j));
            }
        }
    }
    V::group_constants(a, r);
    a.load64(RAX, mem(f.base, f.steps));
    a.store64(mem(f.base, f.left), RAX);
    // Open the totals area: TOTALS = its first aligned byte. An rsp-based
    // frame is now `area` bytes further from rsp.
    let area = if V::TOTALS_IN_REGISTERS {
        0
    } else {
        totals_area_bytes::<V>(rows, hb)
    };
    let shift = if f.base == RSP { area } else { 0 };
    let left = mem(f.base, f.left + shift);
    let total_at = |i: usize, j: usize| mem(TOTALS, V::BYTES * (i * hb + j) as i32);
    if !V::TOTALS_IN_REGISTERS {
        let align = V::BYTES.trailing_zeros() as i8;
        a.sub_imm(RSP, area);
        a.lea(TOTALS, mem(RSP, V::BYTES - 1));
        a.shr_imm(TOTALS, align);
        a.shl_imm(TOTALS, align);
        let zero = r.reserved::<V>(2);
        V::zero(a, zero);
        for i in 0..rows {
            for j in 0..hb {
                V::store(a, Format::F32, total_at(i, j), zero);
            }
        }
    }
    let step = |a: &mut X86Asm, u: i32| {
        for j in 0..hb {
            V::load_codes(a, k, r, j, u * wstep, prepacked);
        }
        for i in 0..rows {
            let at = mem(R8, u * ep * 4 + 4 * i as i32);
            let x = if V::EMBEDDED_BROADCAST {
                Operand::Broadcast(at)
            } else {
                let av = r.a::<V>();
                V::broadcast_i32(a, av, at);
                Operand::Reg(av)
            };
            for j in 0..hb {
                V::dot(a, k, r, r.step_sum(i, j, u), j, x, shift);
            }
        }
    };
    let group_loop = a.new_label();
    let slow = V::SLOW_ENTRY_LABEL.then(|| a.new_label());
    let (slow_loop, group_end, done) = (a.new_label(), a.new_label(), a.new_label());
    a.bind(group_loop);
    // rcx = steps in this group, left -= rcx.
    common::next_group(a, left, spg, done);
    let seeded = seeds_group_sums(k);
    if seeded {
        a.mov(V::SUMS_WALK, V::SUMS);
    }
    for i in 0..rows {
        for j in 0..hb {
            if seeded {
                V::broadcast_i32(a, r.sum(i, j), mem(V::SUMS_WALK, 0));
            } else {
                V::zero(a, r.sum(i, j));
            }
            if r.odd_sums.is_some() {
                V::zero(a, r.step_sum(i, j, 1));
            }
        }
        if seeded && i + 1 < rows {
            a.add(V::SUMS_WALK, V::SUMS_STRIDE);
        }
    }
    a.cmp_imm(RCX, spg);
    a.jcc(Cond::Ne, slow.unwrap_or(slow_loop));
    for u in 0..spg {
        step(a, u);
    }
    if let Some(prefetch) = prefetch {
        prefetch.emit(a, RSI, spg * wstep);
    }
    a.add_imm(R8, spg * ep * 4);
    a.add_imm(RSI, spg * wstep);
    a.jmp(group_end);
    if let Some(slow) = slow {
        a.bind(slow);
    }
    one_step_loop(a, slow_loop, &step, ep, wstep);
    a.bind(group_end);
    if r.odd_sums.is_some() {
        for i in 0..rows {
            for j in 0..hb {
                V::add_i32(a, r.sum(i, j), r.sum(i, j), r.step_sum(i, j, 1));
            }
        }
    }
    fold_group::<V>(a, k, r, shift, total_at);
    if k.zero.needs_sums() {
        a.add_imm(V::SUMS, 4);
    }
    let param_bytes = k.param_bytes();
    a.add_imm(R9, hp * param_bytes);
    if k.zero == ZeroPoint::Offset {
        a.add_imm(R10, hp * param_bytes);
    }
    a.jmp(group_loop);
    a.bind(done);
    if !V::TOTALS_IN_REGISTERS {
        for i in 0..rows {
            for j in 0..hb {
                V::load(a, Format::F32, r.total(i, j), total_at(i, j));
            }
        }
        a.add_imm(RSP, area);
    }
}

/// Whether a group's sums start from the quantizer's −2^s·Σq (a
/// broadcast load, no vector ALU µop) instead of zero: an implied zero
/// point leaves the fold nothing to take off, two µops less per row and
/// group. int16 sums (`vpmaddubsw` groups) start from it split into their
/// two int16 lanes ([`Int8Spec::sums_in_int16_halves`]); on an AMD Zen 3
/// that and the f16 scales widened once per group ([`fold_group`]) took
/// a hot 4-row group from 36 to 33 cycles and an 8-row one from 64 to 58.
fn seeds_group_sums(k: &Int8Kernel) -> bool {
    k.zero.implied_shift().is_some()
}

/// The group end, per row and column block: the group sum to i32, to f32,
/// then total += sw·that (+ min·Σq). Sums of an implied zero point
/// started from it ([`seeds_group_sums`]), so nothing is left to take off.
/// Where the unpack leaves channels in an order of its own
/// ([`Int8File::permuted_channels`]) the scales go into the B registers in
/// that order once per group, and the offsets after them in a second pass
/// over the rows. Otherwise f32 parameters are memory operands and f16
/// ones widen into a register: with the totals in registers, the scales
/// into the B registers once per group and each offset into its group-sum
/// register once that is folded; with the totals in memory (B's first
/// register then carries each total), once per group into the registers
/// the tile leaves free ([`widened_params`]), else into
/// [`Int8File::f16_param_reg`] per use.
fn fold_group<V: Int8File>(
    a: &mut X86Asm,
    k: &Int8Kernel,
    r: &Int8Regs,
    shift: i32,
    total_at: impl Fn(usize, usize) -> Mem,
) {
    let (rows, hb) = (r.rows, r.hb);
    let f16 = k.f16_params();
    let offset = k.zero == ZeroPoint::Offset;
    let in_registers = V::TOTALS_IN_REGISTERS;
    let narrow = k.narrow();
    let param = |a: &mut X86Asm, base: Gp, j: usize, tmp: V| -> Operand<V> {
        if f16 {
            V::cvt_f16(a, tmp, mem(base, V::BYTES / 2 * j as i32));
            Operand::Reg(tmp)
        } else {
            Operand::Mem(mem(base, V::BYTES * j as i32))
        }
    };
    let fma = |a: &mut X86Asm, acc: V, x: V, p: Operand<V>| match p {
        Operand::Reg(v) => V::fma(a, acc, x, v),
        Operand::Mem(m) => V::fma_mem(a, acc, x, m),
        Operand::Broadcast(_) => unreachable!("group parameters are whole vectors"),
    };
    if narrow {
        V::narrow_setup(a, r, shift);
    }
    let permuted = V::permuted_channels(k);
    let params_in_b = in_registers && (f16 || permuted);
    if params_in_b {
        V::group_params_to_b(a, k, r, R9);
    }
    // The scales of column block j (and its offsets, hb registers on).
    let widened = widened_params::<V>(k, r);
    if let Some(first) = widened {
        for j in 0..hb {
            param(a, R9, j, V::reg(first + j));
            if offset {
                param(a, R10, j, V::reg(first + hb + j));
            }
        }
    }
    let memory_param = |a: &mut X86Asm, base: Gp, j: usize| match widened {
        Some(first) => Operand::Reg(V::reg(first + j + if base == R10 { hb } else { 0 })),
        None => param(a, base, j, V::f16_param_reg(r)),
    };
    if offset {
        a.mov(V::SUMS_WALK, V::SUMS);
    }
    let s = V::reg(r.sigma);
    for i in 0..rows {
        if offset && !in_registers {
            V::broadcast_i32(a, s, mem(V::SUMS_WALK, 0));
            V::cvt_i32(a, s, s);
        }
        for j in 0..hb {
            let g = r.sum(i, j);
            if narrow {
                V::widen_narrow(a, r, g);
            }
            V::cvt_i32(a, g, g);
            if in_registers {
                let sw = if params_in_b {
                    Operand::Reg(r.b(j))
                } else {
                    param(a, R9, j, g)
                };
                fma(a, r.total(i, j), g, sw);
            }
        }
        if in_registers {
            if offset && !permuted {
                V::cvt_i32_broadcast(a, s, mem(V::SUMS_WALK, 0));
                for j in 0..hb {
                    let min = param(a, R10, j, r.sum(i, j));
                    fma(a, r.total(i, j), s, min);
                }
            }
            if offset && i + 1 < rows {
                a.add(V::SUMS_WALK, V::SUMS_STRIDE);
            }
        } else {
            if offset && i + 1 < rows {
                a.add(V::SUMS_WALK, V::SUMS_STRIDE);
            }
            for j in 0..hb {
                let total = r.b(0);
                V::load(a, Format::F32, total, total_at(i, j));
                let sw = memory_param(a, R9, j);
                fma(a, total, r.sum(i, j), sw);
                if offset {
                    let min = memory_param(a, R10, j);
                    fma(a, total, s, min);
                }
                V::store(a, Format::F32, total_at(i, j), total);
            }
        }
    }
    if in_registers && offset && permuted {
        // The offsets in the unpacked order into B, then min·Σq per row.
        V::group_params_to_b(a, k, r, R10);
        a.mov(V::SUMS_WALK, V::SUMS);
        for i in 0..rows {
            V::cvt_i32_broadcast(a, s, mem(V::SUMS_WALK, 0));
            for j in 0..hb {
                V::fma(a, r.total(i, j), s, r.b(j));
            }
            if i + 1 < rows {
                a.add(V::SUMS_WALK, V::SUMS_STRIDE);
            }
        }
    }
    if f16 && !in_registers && widened.is_none() {
        V::restore_f16_param_reg(a, r, shift);
    }
}

/// With the totals in memory and f16 group parameters, the first of the
/// registers the group end widens them into once per group (each column
/// block's scales, then its offsets): the registers past the loop's plan
/// where enough are free (flat and GEMM tiles of ymm), else None (widened
/// per row and use). Per row, that was one `vcvtph2ps` per column block and
/// parameter set of each group.
fn widened_params<V: Int8File>(k: &Int8Kernel, r: &Int8Regs) -> Option<usize> {
    if V::TOTALS_IN_REGISTERS || !k.f16_params() {
        return None;
    }
    let first = r
        .odd_sums
        .map_or(V::first_free(r), |odd| odd + r.rows * r.hb);
    let needed = r.hb * k.param_sets() as usize;
    (first + needed <= V::REGISTERS).then_some(first)
}

// ---- ymm -----------------------------------------------------------------

/// ymm's reserved registers, after B: grouped, the nibble (or sign-bit)
/// mask, the shift counts and the product temporary; W8A8, the raw
/// weights, the product temporary and the int16 ones.
const MASK: usize = 0;
const SHIFT_COUNTS: usize = 1;
const PRODUCT: usize = 2;
const RAW: usize = 0;
const ROW_PRODUCT: usize = 1;
const ONES: usize = 2;

impl Int8File for Ymm {
    const INT8_FRAME: Int8Frame = Int8Frame {
        base: RSP,
        steps: LOCAL1,
        groups: LOCAL2,
        left: LOCAL0,
        panel_buffer: None,
    };
    const TOTALS_IN_REGISTERS: bool = false;
    const EMBEDDED_BROADCAST: bool = false;
    const ROW_WALK: bool = false;
    const SLOW_ENTRY_LABEL: bool = true;
    const SUMS: Gp = R13;
    const SUMS_STRIDE: Gp = R14;
    const SUMS_WALK: Gp = RAX;

    fn regs(rows: usize, hb: usize, grouped: bool) -> Int8Regs {
        let acc = rows * hb;
        Int8Regs {
            rows,
            hb,
            totals: 0,
            sums: 0,
            a: Some(acc),
            sigma: acc,
            b: acc + 1,
            b_per_block: grouped,
            reserved: Some(acc + 1 + if grouped { hb } else { 1 }),
            odd_sums: None,
        }
    }
    /// After the three reserved registers (mask, shift counts, product).
    fn first_free(r: &Int8Regs) -> usize {
        r.reserved.map_or(0, |first| first + 3)
    }
    fn add_i32(a: &mut X86Asm, dst: Ymm, x: Ymm, y: Ymm) {
        a.vpaddd(dst, x, y);
    }
    fn mac_name(dot: Dot) -> &'static str {
        dot.name()
    }
    fn open_frame(a: &mut X86Asm, k: &Int8Kernel) {
        common::prologue(a);
        for i in 0..8 {
            a.store32_imm(mem(RSP, ONES16 + 4 * i), 0x0001_0001);
            a.store32_imm(mem(RSP, SHIFTS + 4 * i), if i < 4 { 0 } else { 4 });
        }
        // The byte mask: 4-bit codes' nibbles, or 8-bit codes' sign bits
        // (Implied128 flips them).
        let byte_mask = if k.flip() {
            0x8080_8080_u32 as i32
        } else {
            0x0F0F_0F0F
        };
        a.store32_imm(mem(RSP, NIBBLE), byte_mask);
    }
    fn close_frame(a: &mut X86Asm) {
        common::epilogue(a);
    }
    fn scale_param_index(a: &mut X86Asm, bytes: i32) {
        a.shl_imm(R9, bytes.trailing_zeros() as i8);
    }
    fn row_scaled_loop(
        a: &mut X86Asm,
        k: &Int8Kernel,
        r: &Int8Regs,
        wstep: i32,
        prefetch: Option<WeightPrefetch>,
    ) {
        row_scaled_loop(a, k, r, wstep, prefetch);
    }
    fn group_constants(a: &mut X86Asm, r: &Int8Regs) {
        a.vpbroadcastd_load(r.reserved(MASK), mem(RSP, NIBBLE));
        a.vmovdqu_load(r.reserved(SHIFT_COUNTS), mem(RSP, SHIFTS));
    }
    /// 8-bit codes: raw (the sign trick), or their sign bits flipped (w +
    /// 128 unsigned). 4-bit: one pair-transposed run of 16 bytes in both
    /// lanes, the upper lane's high nibbles shifted down, the nibbles kept.
    fn load_codes(
        a: &mut X86Asm,
        k: &Int8Kernel,
        r: &Int8Regs,
        j: usize,
        at: i32,
        _prepacked: bool,
    ) {
        let (b, mask): (Ymm, Ymm) = (r.b(j), r.reserved(MASK));
        if k.flip() {
            a.vmovdqu_load(b, mem(RSI, at + 32 * j as i32));
            a.vpxor(b, b, mask);
        } else if k.bytes() {
            // |w| and the sign move per row (see `dot`).
            a.vmovdqu_load(b, mem(RSI, at + 32 * j as i32));
        } else {
            a.vbroadcasti128_load(b, mem(RSI, at + 16 * j as i32));
            a.vpsrlvd(b, b, r.reserved(SHIFT_COUNTS));
            a.vpand(b, b, mask);
        }
    }
    fn dot(
        a: &mut X86Asm,
        k: &Int8Kernel,
        r: &Int8Regs,
        g: Ymm,
        j: usize,
        x: Operand<Ymm>,
        frame: i32,
    ) {
        let Operand::Reg(av) = x else {
            unreachable!("ymm broadcasts the codes into A")
        };
        let (b, t): (Ymm, Ymm) = (r.b(j), r.reserved(PRODUCT));
        let ones = Operand::Mem(mem(RSP, frame + ONES16));
        if k.flip() {
            k.dot.dpbusd(a, g, b, av);
        } else if k.bytes() {
            // vpmaddubsw wants unsigned weights: |w| · (x·sign w), |w|
            // into the mask register (unused for bytes).
            let mask = r.reserved(MASK);
            a.vpabsb(mask, b);
            a.vpsignb(t, av, b);
            k.dot.accumulate(a, g, mask, t, t, ones);
        } else if k.dot.is_vnni() || k.wide() {
            k.dot.accumulate(a, g, b, av, t, ones);
        } else {
            a.vpmaddubsw(t, b, av);
            a.vpaddw(g, g, t);
        }
    }
    fn narrow_setup(a: &mut X86Asm, r: &Int8Regs, frame: i32) {
        a.vmovdqu_load(r.reserved(PRODUCT), mem(RSP, frame + ONES16));
    }
    fn widen_narrow(a: &mut X86Asm, r: &Int8Regs, g: Ymm) {
        a.vpmaddwd(g, g, r.reserved(PRODUCT));
    }
    /// The shift counts, reloaded from the frame after the fold.
    fn f16_param_reg(r: &Int8Regs) -> Ymm {
        r.reserved(SHIFT_COUNTS)
    }
    fn restore_f16_param_reg(a: &mut X86Asm, r: &Int8Regs, frame: i32) {
        a.vmovdqu_load(r.reserved(SHIFT_COUNTS), mem(RSP, frame + SHIFTS));
    }
    fn x_scale_reg() -> Ymm {
        common::TMP
    }
    fn broadcast_i32(a: &mut X86Asm, dst: Ymm, m: Mem) {
        a.vpbroadcastd_load(dst, m);
    }
    fn cvt_i32(a: &mut X86Asm, dst: Ymm, src: Ymm) {
        a.vcvtdq2ps(dst, src);
    }
    fn cvt_f16(a: &mut X86Asm, dst: Ymm, m: Mem) {
        a.vcvtph2ps_load(dst, m);
    }
    fn mul(a: &mut X86Asm, dst: Ymm, src: Operand<Ymm>) {
        match src {
            Operand::Reg(v) => a.vmulps(dst, dst, v),
            Operand::Mem(m) => a.vmulps_mem(dst, dst, m),
            Operand::Broadcast(_) => unreachable!("no embedded broadcast on ymm"),
        }
    }
    /// The shared epilogue ([`common::store_tile`]), eight rows at a time
    /// (one y pointer each); rbp moves to the chunk's first row so the row
    /// pointers and guards count from it.
    fn store_tile(a: &mut X86Asm, k: &Int8Kernel, r: &Int8Regs, hp: i32) {
        let rows = r.rows;
        for first in (0..rows).step_by(YROWS.len()) {
            let chunk = (rows - first).min(YROWS.len());
            if first > 0 {
                a.add_imm(RBP, first as i32);
            }
            for (i, &yr) in YROWS[..chunk].iter().enumerate() {
                common::row_ptr(a, yr, i, false, MM_Y, MM_Y_STRIDE);
                a.imul_imm(RAX, RBX, hp);
                a.load64(RDX, mem(RDI, MM_N0));
                a.add(RAX, RDX);
                a.shl_imm(RAX, if k.y == Format::F32 { 2 } else { 1 });
                a.add(yr, RAX);
            }
            a.imul_imm(RAX, RBX, hp);
            a.load64(RCX, mem(RDI, MM_N));
            a.sub(RCX, RAX);
            let store = Store {
                rows: chunk,
                hb: r.hb,
                y: k.y,
                finalize: true,
                bias: k.bias,
                activation: k.activation,
                row_check: true,
                tmp: common::TMP,
            };
            common::store_tile(a, &store, |i, j| r.total(first + i, j), |i| YROWS[i]);
            if first > 0 {
                a.sub_imm(RBP, first as i32);
            }
        }
    }
}

/// W8A8 (ymm): all of K into i32 totals. Column block j outer, row i
/// inner: B (|w|) and the raw bytes serve every row, row i's codes are
/// broadcast into the one A register just before their use.
fn row_scaled_loop(
    a: &mut X86Asm,
    k: &Int8Kernel,
    r: &Int8Regs,
    wstep: i32,
    prefetch: Option<WeightPrefetch>,
) {
    let ep = k.ep as i32;
    let (raw, t, ones): (Ymm, Ymm, Ymm) =
        (r.reserved(RAW), r.reserved(ROW_PRODUCT), r.reserved(ONES));
    let (av, b): (Ymm, Ymm) = (r.a(), r.b(0));
    if !k.dot.is_vnni() {
        a.vmovdqu_load(ones, mem(RSP, ONES16));
    }
    let step = |a: &mut X86Asm, u: i32| {
        let x = |i: usize| mem(R8, u * ep * 4 + 4 * i as i32);
        if r.rows == 1 {
            a.vpbroadcastd_load(av, x(0));
        }
        for j in 0..r.hb {
            a.vmovdqu_load(raw, mem(RSI, u * wstep + 32 * j as i32));
            a.vpabsb(b, raw);
            for i in 0..r.rows {
                let acc = r.total(i, j);
                if r.rows > 1 {
                    a.vpbroadcastd_load(av, x(i));
                }
                a.vpsignb(t, av, raw);
                k.dot.accumulate(a, acc, b, t, t, Operand::Reg(ones));
            }
        }
    };
    let (unrolled, tail, tail_loop, done) =
        (a.new_label(), a.new_label(), a.new_label(), a.new_label());
    a.load64(RCX, mem(RSP, LOCAL1));
    a.cmp_imm(RCX, UNROLL as i32);
    a.jcc(Cond::L, tail);
    a.bind(unrolled);
    for u in 0..UNROLL as i32 {
        step(a, u);
    }
    if let Some(prefetch) = prefetch {
        prefetch.emit(a, RSI, UNROLL as i32 * wstep);
    }
    a.add_imm(R8, UNROLL as i32 * ep * 4);
    a.add_imm(RSI, UNROLL as i32 * wstep);
    a.sub_imm(RCX, UNROLL as i32);
    a.cmp_imm(RCX, UNROLL as i32);
    a.jcc(Cond::Ge, unrolled);
    a.bind(tail);
    a.cmp_imm(RCX, 0);
    a.jcc(Cond::E, done);
    one_step_loop(a, tail_loop, &step, ep, wstep);
    a.bind(done);
}

/// The k loop one step at a time over rcx (> 0) steps from `top`: x (r8)
/// moves ep rows of 4 codes a step, the weights (rsi) `wstep` bytes.
fn one_step_loop(a: &mut X86Asm, top: Label, step: &dyn Fn(&mut X86Asm, i32), ep: i32, wstep: i32) {
    a.bind(top);
    step(a, 0);
    a.add_imm(R8, ep * 4);
    a.add_imm(RSI, wstep);
    a.sub_imm(RCX, 1);
    a.jcc(Cond::Ne, top);
}
