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
//! ggml's AVX2 loop does. `u4sym` has no stored offset: the zero point is
//! folded in integers at the group end, dot_g − 8·Σq_g (`vpslld`, `vpsubd`),
//! then y += sw_g·(that) with one FMA. f16 parameters are widened at the
//! group end with `vcvtph2ps` (F16C) into the shift-count register, which
//! is reloaded from the frame afterwards.
//!
//! # Register plans
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
//!
//! ymm13-15 serve the shared epilogue after the loops ([`super::common`]).
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

    fn name(self) -> &'static str {
        match self {
            Dot::MaddUbsw => "vpmaddubsw+vpmaddwd",
            Dot::VexVnni => "vpdpbusd",
            Dot::EvexVnni => "{evex} vpdpbusd",
        }
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
}

/// The register plan of one loop (see the module doc's tables).
#[derive(Clone, Copy)]
struct Regs {
    rows: usize,
    hb: usize,
    /// Grouped weights: one B register per column block.
    grouped: bool,
}

impl Regs {
    /// Accumulator (W8A8: i32 over all of K; W4A8: the group's integer
    /// sums, and the f32 totals once read back for the epilogue).
    fn acc(&self, i: usize, j: usize) -> Ymm {
        Ymm((i * self.hb + j) as u8)
    }
    fn a(&self) -> Ymm {
        Ymm((self.rows * self.hb) as u8)
    }
    fn b(&self, j: usize) -> Ymm {
        Ymm((self.rows * self.hb + 1 + if self.grouped { j } else { 0 }) as u8)
    }
    fn after_b(&self) -> usize {
        self.rows * self.hb + 1 + if self.grouped { self.hb } else { 1 }
    }
    /// W8A8: raw weights; W4A8: the nibble mask.
    fn r0(&self) -> Ymm {
        Ymm(self.after_b() as u8)
    }
    /// W8A8: product temp; W4A8: shift counts.
    fn r1(&self) -> Ymm {
        Ymm((self.after_b() + 1) as u8)
    }
    /// W8A8: ones; W4A8: product temp (int16 ones at a group end).
    fn r2(&self) -> Ymm {
        Ymm((self.after_b() + 2) as u8)
    }
}

/// Where a group parameter vector is read from at the group end.
#[derive(Clone, Copy)]
enum ParamOperand {
    Reg(Ymm),
    Mem(Mem),
}

/// Bytes W4A8's k loop moves rsp down by: the f32 totals of `rows` × `hb`
/// column blocks, plus slack to align them to 32 bytes.
fn acc_area_bytes(rows: usize, hb: usize) -> i32 {
    (32 * rows * hb + 32) as i32
}

/// How far ahead of the weight stream the GEMV and flat-GEMM loops
/// prefetch, in bytes.
pub const PREFETCH: i32 = 2048;

/// Emit the kernel: the GEMM variant (with the one-row loop for m = 1).
pub fn emit(spec: &Int8Spec) -> Result<MachineCode, EmitError> {
    emit_variant(spec, Variant::Gemm)
}

/// Emit one variant. Every variant keeps all of K in registers per row
/// block (panel → row block → K), so with m ≤ ep each weight byte is read
/// once per call and larger m re-reads the panel from L2. `Gemv` runs
/// every row through the one-row loop; `FlatGemm` and the one-row loop
/// prefetch the weight stream [`PREFETCH`] bytes ahead; `Gemm` leaves it to
/// the hardware prefetcher (compute-bound).
pub fn emit_variant(spec: &Int8Spec, variant: Variant) -> Result<MachineCode, EmitError> {
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
    let mut a = X86Asm::new();
    a.comment(&format!(
        "matmul {variant} x i8dyn w {} y {} tile {}x{}x4 bias {} act {:?} mac {}",
        match spec.group {
            Some(g) => format!(
                "{}:g{g}{}",
                match (spec.wbits, spec.zero) {
                    (8, _) => "i8sym",
                    (_, ZeroPoint::Implied8) => "u4sym",
                    _ => "u4asym",
                },
                if spec.params == ParamType::F16 {
                    ":f16"
                } else {
                    ""
                }
            ),
            None => "i8sym:row".into(),
        },
        spec.y,
        spec.ep,
        spec.hb * 8,
        spec.bias,
        spec.activation,
        spec.dot.name()
    ));
    common::prologue(&mut a);
    for i in 0..8 {
        a.store32_imm(mem(RSP, ONES16 + 4 * i), 0x0001_0001);
        a.store32_imm(mem(RSP, SHIFTS + 4 * i), if i < 4 { 0 } else { 4 });
    }
    // The byte mask: 4-bit codes' nibbles, or 8-bit codes' sign bits
    // (Implied128 flips them).
    let byte_mask = if spec.zero == ZeroPoint::Implied128 {
        0x8080_8080_u32 as i32
    } else {
        0x0F0F_0F0F
    };
    a.store32_imm(mem(RSP, NIBBLE), byte_mask);
    // LOCAL1 = steps of 4 along k, LOCAL2 = groups per row.
    a.load64(RAX, mem(RDI, MM_K));
    a.add_imm(RAX, 3);
    a.shr_imm(RAX, 2);
    a.store64(mem(RSP, LOCAL1), RAX);
    match spec.group {
        Some(g) => {
            a.load64(RAX, mem(RDI, MM_K));
            a.add_imm(RAX, g as i32 - 1);
            a.shr_imm(RAX, g.trailing_zeros() as i8);
        }
        None => a.mov_imm(RAX, 1),
    }
    a.store64(mem(RSP, LOCAL2), RAX);
    if spec.ep > 1 && variant != Variant::Gemv {
        let (gemv, done) = (a.new_label(), a.new_label());
        a.load64(RAX, mem(RDI, MM_M));
        a.cmp_imm(RAX, 1);
        a.jcc(Cond::E, gemv);
        a.comment(&format!("{variant}: {} rows per tile", spec.ep));
        let prefetch = (variant == Variant::FlatGemm).then_some(PREFETCH);
        nest(&mut a, spec, spec.ep, prefetch);
        a.jmp(done);
        a.bind(gemv);
        a.comment("gemv: one row");
        nest(&mut a, spec, 1, Some(PREFETCH));
        a.bind(done);
    } else {
        a.comment("gemv: one row per tile");
        nest(&mut a, spec, 1, Some(PREFETCH));
    }
    common::epilogue(&mut a);
    let (bytes, listing) = a.finish().map_err(EmitError::Assembler)?;
    Ok(super::machine_code(bytes, listing))
}

fn nest(a: &mut X86Asm, spec: &Int8Spec, rows: usize, prefetch: Option<i32>) {
    let hb = spec.hb;
    let hp = 8 * hb as i32;
    let ep = spec.ep as i32;
    let grouped = spec.group.is_some();
    let nibbles = grouped && spec.wbits == 4;
    let r = Regs { rows, hb, grouped };
    // Bytes of one packed weight step and its parameter stride per panel.
    let wstep = if nibbles { hp * 2 } else { hp * 4 };

    let panel_loop = nest::panels_head(a);
    let row_loop = nest::rows_head(a);

    // r8 = x + rbp·LB·4 (row block rbp/ep, ep rows of 4 bytes per step).
    a.mov(RAX, RBP);
    a.load64(RDX, mem(RSP, LOCAL1));
    a.imul(RAX, RDX);
    a.shl_imm(RAX, 2);
    a.load64(RDX, mem(RDI, MM_X));
    a.add(RAX, RDX);
    a.mov(R8, RAX);
    // rsi = w + (n0 + rbx·hp)·LB·(4 or 2 bytes per channel and step).
    a.imul_imm(RAX, RBX, hp);
    a.load64(RDX, mem(RDI, MM_N0));
    a.add(RAX, RDX);
    a.mov(R9, RAX); // first column, kept for the parameters
    a.load64(RDX, mem(RSP, LOCAL1));
    a.imul(RAX, RDX);
    a.shl_imm(RAX, if nibbles { 1 } else { 2 });
    a.load64(RDX, mem(RDI, MM_W));
    a.add(RAX, RDX);
    a.mov(RSI, RAX);
    // r9 = params + first column·groups·param_bytes·param_sets; r10 = r9 +
    // groups·hp·param_bytes (the panel's offsets, asymmetric formats).
    let param_bytes = if grouped {
        spec.params.bytes() as i32
    } else {
        4
    };
    let param_sets = if grouped && spec.zero == ZeroPoint::Offset {
        2
    } else {
        1
    };
    a.load64(RDX, mem(RSP, LOCAL2));
    a.imul(R9, RDX);
    a.shl_imm(R9, (param_bytes * param_sets).trailing_zeros() as i8);
    a.load64(RAX, mem(RDI, MM_W_PARAMS));
    a.add(R9, RAX);

    if grouped {
        a.imul_imm(R10, RDX, hp * param_bytes);
        a.add(R10, R9);
        // r14 = Σq row stride (groups·4), r13 = x_sums + rbp·stride.
        a.mov(R14, RDX);
        a.shl_imm(R14, 2);
        a.mov(R13, RBP);
        a.imul(R13, R14);
        a.load64(RAX, mem(RDI, MM_X_SUMS));
        a.add(R13, RAX);
        grouped_loop(a, spec, &r, ep, wstep, prefetch);
    } else {
        for i in 0..rows {
            for j in 0..hb {
                let v = r.acc(i, j);
                a.vxorps(v, v, v);
            }
        }
        int8_loop(a, spec, &r, ep, wstep, prefetch);
    }

    // Scale: y = acc·sx (·sw for W8A8), then the shared epilogue.
    a.mov(RAX, RBP);
    a.shl_imm(RAX, 2);
    a.load64(RDX, mem(RDI, MM_X_SCALES));
    a.add(RAX, RDX);
    for i in 0..rows {
        a.vpbroadcastd_load(common::TMP, mem(RAX, 4 * i as i32));
        for j in 0..hb {
            let v = r.acc(i, j);
            if !grouped {
                a.vcvtdq2ps(v, v);
                a.vmulps_mem(v, v, mem(R9, 32 * j as i32));
            }
            a.vmulps(v, v, common::TMP);
        }
    }
    if spec.bias {
        a.imul_imm(RAX, RBX, hp);
        a.load64(RDX, mem(RDI, MM_N0));
        a.add(RAX, RDX);
        a.shl_imm(RAX, 2);
        a.load64(RSI, mem(RDI, MM_BIAS));
        a.add(RSI, RAX);
    }
    // Eight rows at a time (one y pointer each); rbp moves to the chunk's
    // first row so the row pointers and guards count from it.
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
            a.shl_imm(RAX, if spec.y == Format::F32 { 2 } else { 1 });
            a.add(yr, RAX);
        }
        a.imul_imm(RAX, RBX, hp);
        a.load64(RCX, mem(RDI, MM_N));
        a.sub(RCX, RAX);
        let store = Store {
            rows: chunk,
            hb,
            y: spec.y,
            finalize: true,
            bias: spec.bias,
            activation: spec.activation,
            row_check: true,
            tmp: common::TMP,
        };
        common::store_tile(a, &store, |i, j| r.acc(first + i, j), |i| YROWS[i]);
        if first > 0 {
            a.sub_imm(RBP, first as i32);
        }
    }

    nest::rows_tail(a, row_loop, rows);
    nest::panels_tail(a, panel_loop, hp);
}

/// W8A8: all of K into i32 accumulators. Column block j outer, row i
/// inner: B (|w|) and the raw bytes serve every row, row i's codes are
/// broadcast into the one A register just before their use.
fn int8_loop(
    a: &mut X86Asm,
    spec: &Int8Spec,
    r: &Regs,
    ep: i32,
    wstep: i32,
    prefetch: Option<i32>,
) {
    let (raw, t, ones) = (r.r0(), r.r1(), r.r2());
    if !spec.dot.is_vnni() {
        a.vmovdqu_load(ones, mem(RSP, ONES16));
    }
    let step = |a: &mut X86Asm, u: i32| {
        let x = |i: usize| mem(R8, u * ep * 4 + 4 * i as i32);
        if r.rows == 1 {
            a.vpbroadcastd_load(r.a(), x(0));
        }
        for j in 0..r.hb {
            a.vmovdqu_load(raw, mem(RSI, u * wstep + 32 * j as i32));
            a.vpabsb(r.b(0), raw);
            for i in 0..r.rows {
                let acc = r.acc(i, j);
                if r.rows > 1 {
                    a.vpbroadcastd_load(r.a(), x(i));
                }
                a.vpsignb(t, r.a(), raw);
                if spec.dot.is_vnni() {
                    spec.dot.dpbusd(a, acc, r.b(0), t);
                } else {
                    a.vpmaddubsw(t, r.b(0), t);
                    a.vpmaddwd(t, t, ones);
                    a.vpaddd(acc, acc, t);
                }
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
    if let Some(distance) = prefetch {
        for c in (0..UNROLL as i32 * wstep).step_by(64) {
            a.prefetcht0(mem(RSI, distance + c));
        }
    }
    a.add_imm(R8, UNROLL as i32 * ep * 4);
    a.add_imm(RSI, UNROLL as i32 * wstep);
    a.sub_imm(RCX, UNROLL as i32);
    a.cmp_imm(RCX, UNROLL as i32);
    a.jcc(Cond::Ge, unrolled);
    a.bind(tail);
    a.cmp_imm(RCX, 0);
    a.jcc(Cond::E, done);
    a.bind(tail_loop);
    step(a, 0);
    a.add_imm(R8, ep * 4);
    a.add_imm(RSI, wstep);
    a.sub_imm(RCX, 1);
    a.jcc(Cond::Ne, tail_loop);
    a.bind(done);
}

/// Grouped weights (W4A8, and `i8sym:gN`): per group, int16 (or i32:
/// VNNI, groups over 32, 8-bit codes) sums in registers; at the group end
/// the f32 totals in the stack area take sw·dot + min·Σq (`u4sym`:
/// sw·(dot − 8·Σq); `i8sym`: sw·dot). Leaves the totals in the accumulator
/// registers and rsp where it found it. Expects r9/r10 = the panel's
/// scales/offsets, r13 = row 0's Σq, r14 = the Σq row stride.
fn grouped_loop(
    a: &mut X86Asm,
    spec: &Int8Spec,
    r: &Regs,
    ep: i32,
    wstep: i32,
    prefetch: Option<i32>,
) {
    let spg = spec.group.unwrap_or(32) as i32 / 4;
    // int16 group sums of 4-bit codes stay exact up to 8 steps (32 codes);
    // longer groups widen every step, and so do 8-bit codes, whose pair
    // sums (≤ 2·127·127) already fill an int16.
    let bytes = spec.wbits == 8;
    let flip = spec.zero == ZeroPoint::Implied128;
    let wide = !spec.dot.is_vnni() && (spg > 8 || bytes);
    let f16_params = spec.params == ParamType::F16;
    let param_bytes = spec.params.bytes() as i32;
    let hp = 8 * r.hb as i32;
    let (mask, shifts, t) = (r.r0(), r.r1(), r.r2());
    a.vpbroadcastd_load(mask, mem(RSP, NIBBLE));
    a.vmovdqu_load(shifts, mem(RSP, SHIFTS));
    a.load64(RAX, mem(RSP, LOCAL1));
    a.store64(mem(RSP, LOCAL0), RAX);
    // Open the totals area: r11 = its first 32-byte aligned byte. The
    // shared frame is now `area` bytes further from rsp.
    let area = acc_area_bytes(r.rows, r.hb);
    let frame = |off: i32| mem(RSP, area + off);
    a.sub_imm(RSP, area);
    a.lea(R11, mem(RSP, 31));
    a.shr_imm(R11, 5);
    a.shl_imm(R11, 5);
    let total = |i: usize, j: usize| mem(R11, 32 * (i * r.hb + j) as i32);
    a.vxorps(t, t, t);
    for i in 0..r.rows {
        for j in 0..r.hb {
            a.vmovups_store(total(i, j), t);
        }
    }
    let step = |a: &mut X86Asm, u: i32| {
        for j in 0..r.hb {
            let b = r.b(j);
            if flip {
                // w + 128 as unsigned bytes.
                a.vmovdqu_load(b, mem(RSI, u * wstep + 32 * j as i32));
                a.vpxor(b, b, mask);
            } else if bytes {
                // Raw signed codes; |w| and the sign move per row below.
                a.vmovdqu_load(b, mem(RSI, u * wstep + 32 * j as i32));
            } else {
                a.vbroadcasti128_load(b, mem(RSI, u * wstep + 16 * j as i32));
                a.vpsrlvd(b, b, shifts);
                a.vpand(b, b, mask);
            }
        }
        let av = r.a();
        for i in 0..r.rows {
            a.vpbroadcastd_load(av, mem(R8, u * ep * 4 + 4 * i as i32));
            for j in 0..r.hb {
                let g = r.acc(i, j);
                if flip {
                    spec.dot.dpbusd(a, g, r.b(j), av);
                } else if bytes {
                    // vpmaddubsw wants unsigned weights: |w| · (x·sign w),
                    // |w| into the nibble-mask register (unused for bytes).
                    a.vpabsb(mask, r.b(j));
                    a.vpsignb(t, av, r.b(j));
                    if spec.dot.is_vnni() {
                        spec.dot.dpbusd(a, g, mask, t);
                    } else {
                        a.vpmaddubsw(t, mask, t);
                        a.vpmaddwd_mem(t, t, frame(ONES16));
                        a.vpaddd(g, g, t);
                    }
                } else if spec.dot.is_vnni() {
                    spec.dot.dpbusd(a, g, r.b(j), av);
                } else if wide {
                    a.vpmaddubsw(t, r.b(j), av);
                    a.vpmaddwd_mem(t, t, frame(ONES16));
                    a.vpaddd(g, g, t);
                } else {
                    a.vpmaddubsw(t, r.b(j), av);
                    a.vpaddw(g, g, t);
                }
            }
        }
    };
    let (group_loop, slow, slow_loop, group_end, done) = (
        a.new_label(),
        a.new_label(),
        a.new_label(),
        a.new_label(),
        a.new_label(),
    );
    a.bind(group_loop);
    // rcx = steps in this group, LOCAL0 -= rcx.
    common::next_group(a, frame(LOCAL0), spg, done);
    for i in 0..r.rows {
        for j in 0..r.hb {
            let g = r.acc(i, j);
            a.vxorps(g, g, g);
        }
    }
    a.cmp_imm(RCX, spg);
    a.jcc(Cond::Ne, slow);
    for u in 0..spg {
        step(a, u);
    }
    if let Some(distance) = prefetch {
        for c in (0..spg * wstep).step_by(64) {
            a.prefetcht0(mem(RSI, distance + c));
        }
    }
    a.add_imm(R8, spg * ep * 4);
    a.add_imm(RSI, spg * wstep);
    a.jmp(group_end);
    a.bind(slow);
    a.bind(slow_loop);
    step(a, 0);
    a.add_imm(R8, ep * 4);
    a.add_imm(RSI, wstep);
    a.sub_imm(RCX, 1);
    a.jcc(Cond::Ne, slow_loop);
    a.bind(group_end);
    // total += sw·dot + min·Σq (u4sym: sw·(dot − 8·Σq)), per row and column
    // block; rax walks Σq.
    let narrow = !spec.dot.is_vnni() && !wide;
    if narrow {
        a.vmovdqu_load(t, frame(ONES16));
    }
    // The group's parameters of column block j: f32 from memory, or f16
    // widened into the shift-count register (reloaded below).
    let param = |a: &mut X86Asm, base: Gp, j: usize| -> ParamOperand {
        if f16_params {
            a.vcvtph2ps_load(shifts, mem(base, 16 * j as i32));
            ParamOperand::Reg(shifts)
        } else {
            ParamOperand::Mem(mem(base, 32 * j as i32))
        }
    };
    let fma = |a: &mut X86Asm, acc: Ymm, x: Ymm, p: ParamOperand| match p {
        ParamOperand::Reg(v) => a.vfmadd231ps(acc, x, v),
        ParamOperand::Mem(m) => a.vfmadd231ps_mem(acc, x, m),
    };
    let sums = spec.zero.needs_sums();
    if sums {
        a.mov(RAX, R13);
    }
    for i in 0..r.rows {
        let s = r.a();
        match spec.zero {
            ZeroPoint::Implied8 | ZeroPoint::Implied128 => {
                // s = Σq·(8 or 128) as i32.
                a.vpbroadcastd_load(s, mem(RAX, 0));
                a.vpslld_imm(s, s, if flip { 7 } else { 3 });
            }
            ZeroPoint::Offset => {
                a.vpbroadcastd_load(s, mem(RAX, 0));
                a.vcvtdq2ps(s, s);
            }
            ZeroPoint::None => {}
        }
        for j in 0..r.hb {
            let g = r.acc(i, j);
            if narrow {
                a.vpmaddwd(g, g, t);
            }
            if matches!(spec.zero, ZeroPoint::Implied8 | ZeroPoint::Implied128) {
                a.vpsubd(g, g, s);
            }
            a.vcvtdq2ps(g, g);
        }
        if sums && i + 1 < r.rows {
            a.add(RAX, R14);
        }
        for j in 0..r.hb {
            let g = r.acc(i, j);
            let sum = r.b(0);
            a.vmovups_load(sum, total(i, j));
            let sw = param(a, R9, j);
            fma(a, sum, g, sw);
            if spec.zero == ZeroPoint::Offset {
                let min = param(a, R10, j);
                fma(a, sum, s, min);
            }
            a.vmovups_store(total(i, j), sum);
        }
    }
    if f16_params {
        a.vmovdqu_load(shifts, frame(SHIFTS));
    }
    if sums {
        a.add_imm(R13, 4);
    }
    a.add_imm(R9, hp * param_bytes);
    if spec.zero == ZeroPoint::Offset {
        a.add_imm(R10, hp * param_bytes);
    }
    a.jmp(group_loop);
    a.bind(done);
    for i in 0..r.rows {
        for j in 0..r.hb {
            a.vmovups_load(r.acc(i, j), total(i, j));
        }
    }
    a.add_imm(RSP, area);
}
