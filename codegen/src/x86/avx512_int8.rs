//! The AVX-512 int8 matmul (`i8dyn` x; `u4asym:gN`, `u4sym:gN` or
//! `i8sym:gN` w, N a power of two from 8 to 128, f32 or f16 group
//! parameters, so ggml's Q4_0, Q4_1 and Q8_0 too; f32 y): the
//! AVX2 int8 kernel's W4A8 loop nest ([`super::int8`]) on zmm registers
//! with AVX512-VNNI `vpdpbusd` (16 dword lanes × 4 int8 per instruction),
//! for the `x86-avx512` target's int8 tiles. A ymm kernel is capped at half
//! the 512-bit integer throughput of such CPUs.
//!
//! Same ABI ([`crate::abi::MatmulArgs`]), activation quantizer output
//! (`[e/ep, l/4, ep, 4]`, Σq per row and group in `x_sums`) and packed
//! weights as the AVX2 kernel; hp is a multiple of 16 (zb = hp/16 zmm per
//! packed step).
//!
//! **Unpack.** A packed step of hp channels is hp/8 pair-transposed runs
//! of 16 bytes (run r: byte b holds channel 8r + b/4 in its low nibble and
//! channel 8r + 4 + b/4 in its high one). Column block j is runs 2j, 2j+1:
//! a VEX `vmovdqu ymm` load (zeroing the upper half), `vshufi32x4` to lanes
//! (run0, run0, run1, run1), `vpsrld` by 4 under opmask k2 = lanes 1 and 3,
//! `vpandd` 0x0F: the zmm then holds channels 0-15 in order, dword c =
//! channel c's 4 codes, as `vpdpbusd` wants (unsigned weights, signed
//! activations). The activations need no register: each `vpdpbusd` reads
//! its row's 4 codes with a `{1to16}` broadcast.
//!
//! **8-bit codes** (`i8sym:gN`) are signed, and `vpdpbusd` multiplies an
//! unsigned operand by a signed one. A `vmovdqu8` load of the 64 bytes of a
//! column block and a `vpxord` with 0x80 per byte make them w + 128 as
//! unsigned bytes; the group fold then subtracts 128·Σq (the quantizer's
//! row sums), exactly as `u4sym` subtracts 8·Σq ([`ZeroPoint::Implied128`]).
//! One instruction per row and step, where the AVX2 kernel's sign trick
//! (`vpabsb`, `vpsignb`) spends three. These take no panel buffer.
//!
//! **Groups.** A group (g/4 steps, unrolled) sums in i32 (no int16 stage,
//! so long groups need no widening); then per row and column block
//! acc += sw_g·dot_g + min_g·Σq_g in f32 (`u4sym`: sw_g·(dot_g − 8·Σq_g),
//! the zero point folded in integers), and y = acc·sx at the end. f16
//! scales are widened once per group into the B registers, which the
//! group end does not otherwise use; f16 offsets into each group-sum
//! register once it has been folded.
//!
//! # Register plan (rows × zb)
//!
//! | zmm | holds |
//! |---|---|
//! | 0 .. zb | B: unpacked codes of column block j (below 16: VEX loads); zero for relu in the epilogue |
//! | zb | Σq of one row as f32 (`u4sym`: 8·Σq as i32); bias under the tail mask in the epilogue |
//! | then rows·zb | f32 accumulators acc(i,j) |
//! | then rows·zb | i32 group sums g(i,j) |
//!
//! So a tile needs 2·rows·zb + zb + 1 ≤ 32 zmm: 14 × 16 or 7 × 32.
//! Opmask k2 = the shifted lanes, k3 = the valid lanes of the column block
//! being stored.
//!
//! **Panel buffer.** With K short enough ([`PANEL_BUFFER_BYTES`]) the
//! multi-row loop unpacks each panel once into a 64-byte-aligned stack
//! buffer below the frame and its row blocks load B from there (one
//! `vmovdqu32` per column block and step instead of four instructions).
//!
//! General-purpose registers: rdi = args, rsi = weights (bias in the
//! epilogue), rcx = steps of the current group, r8 = the row block's
//! activations, r9 = scales, r10 = offsets, r11 = Σq of the block's first
//! row for the current group, r12 = Σq row stride (groups·4), r13 = Σq /
//! y row walker, rbx = panel, rbp = first row of the row block, r14 = row
//! within it (the one-row loop walks it; 0 in the multi-row loop), r15 =
//! the frame.

use tessera_dsl::ir::{Activation, Format, ParamType};

use super::asm::*;
use super::common::{self, nest};
use super::evex::{Kreg, Zmm};
use super::int8::ZeroPoint;
use crate::abi::*;
use crate::artifact::{EmitError, MachineCode, Variant};
use crate::tile::TileConfig;

/// int32 / f32 lanes per zmm.
pub use super::avx512::LANES;
/// The zmm register file.
pub const ZMM_REGS: usize = super::avx512::ZMM_REGS as usize;

/// What the AVX-512 int8 kernel computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Avx512Int8Spec {
    pub ep: usize,
    /// hp / 16.
    pub zb: usize,
    /// Group length of the weights (a power of two, 8 to 128).
    pub group: usize,
    /// Stored offsets (`u4asym`), the implied 8 (`u4sym`), or the 128 of
    /// 8-bit codes read as unsigned (`i8sym`, [`ZeroPoint::Implied128`]):
    /// 4-bit codes for the first two, 8-bit for the last.
    pub zero: ZeroPoint,
    /// Storage precision of the group parameters.
    pub params: ParamType,
    pub bias: bool,
    pub activation: Activation,
}

impl Avx512Int8Spec {
    fn hp(&self) -> i32 {
        (LANES * self.zb) as i32
    }

    /// Parameter sets per group: scales, and offsets for `u4asym`.
    fn param_sets(&self) -> i32 {
        if self.zero == ZeroPoint::Offset { 2 } else { 1 }
    }

    /// 8-bit weight codes (`i8sym`), else 4-bit.
    fn bytes(&self) -> bool {
        self.zero == ZeroPoint::Implied128
    }

    /// Bytes of one packed weight step (hp channels × 4 codes).
    fn packed_step(&self) -> i32 {
        if self.bytes() {
            self.hp() * 4
        } else {
            self.hp() * 2
        }
    }

    /// The weight format's text form (`u4sym:g32:f16`).
    fn weights(&self) -> String {
        let zero = match self.zero {
            ZeroPoint::Implied8 => "u4sym",
            ZeroPoint::Implied128 => "i8sym",
            _ => "u4asym",
        };
        let params = if self.params == ParamType::F16 {
            ":f16"
        } else {
            ""
        };
        format!("{zero}:g{}{params}", self.group)
    }
}

/// zmm registers a loop of `rows` rows uses (see the register table).
pub fn zmm_needed(rows: usize, zb: usize) -> usize {
    2 * rows * zb + zb + 1
}

/// What the multi-row loop keeps live, checked against the solver's
/// `x86-avx512` accounting of the tile: accumulators equal, and the
/// kernel's zmm ([`zmm_needed`]) within the budget.
pub fn check_plan(spec: &Avx512Int8Spec, tile: &TileConfig) -> Result<(), String> {
    let acc = &tile.accounting;
    let accumulators = (spec.ep * spec.zb) as u32;
    if accumulators != acc.accumulators {
        return Err(format!(
            "avx512 int8: {accumulators} accumulators, the solver counted {}",
            acc.accumulators
        ));
    }
    let needed = zmm_needed(spec.ep, spec.zb) as u32;
    let budget = acc.budget.min(ZMM_REGS as u32);
    if needed > budget {
        return Err(format!(
            "avx512 int8 needs {needed} zmm (2 × {accumulators} + {} B + 1), more than the {budget} available",
            spec.zb
        ));
    }
    Ok(())
}

// ---- frame ---------------------------------------------------------------

/// `(1 << v) - 1` for v = 0..=16: the opmask of v valid lanes.
const KMASKS: i32 = 0;
/// The nibble mask 0x0F0F0F0F.
const NIBBLE: i32 = 72;
/// 0x80 in every byte: flips 8-bit codes' sign bits (w + 128 unsigned).
const FLIP: i32 = 76;
/// Steps of 4 along k, groups per row, steps left in the row block.
const STEPS: i32 = 80;
const GROUPS: i32 = 88;
const LEFT: i32 = 96;
/// The unpacked panel buffer (below the frame), 0 when K is too long.
const BUF: i32 = 104;
const FRAME: i32 = 112;
/// The most bytes of unpacked panel the multi-row loop keeps on the stack
/// (K = 8192 at hp = 16); longer K unpacks in the loop.
pub const PANEL_BUFFER_BYTES: i32 = 128 * 1024;

const SAVED: [Gp; 6] = [RBX, RBP, R12, R13, R14, R15];
/// Lanes 1 and 3 (dwords 4-7, 12-15): the high nibbles' lanes.
const HIGH: Kreg = Kreg(2);
const HIGH_LANES: i32 = 0xF0F0;

/// The valid lanes of the column block being stored.
const TAIL: Kreg = Kreg(3);

#[derive(Clone, Copy)]
struct Regs {
    rows: usize,
    zb: usize,
}

impl Regs {
    fn b(&self, j: usize) -> Zmm {
        Zmm(j as u8)
    }
    fn t(&self) -> Zmm {
        Zmm(self.zb as u8)
    }
    fn acc(&self, i: usize, j: usize) -> Zmm {
        Zmm((self.zb + 1 + i * self.zb + j) as u8)
    }
    fn g(&self, i: usize, j: usize) -> Zmm {
        Zmm((self.zb + 1 + self.rows * self.zb + i * self.zb + j) as u8)
    }
}

/// Emit the GEMM variant (with the one-row loop for m = 1).
pub fn emit(spec: &Avx512Int8Spec) -> Result<MachineCode, EmitError> {
    emit_variant(spec, Variant::Gemm)
}

/// Emit one variant: `Gemv` runs every row through the one-row loop, the
/// others run tiles of ep rows (m = 1 always takes the one-row loop).
/// Every variant keeps all of K in registers per row block.
pub fn emit_variant(spec: &Avx512Int8Spec, variant: Variant) -> Result<MachineCode, EmitError> {
    let bad = |why: String| EmitError::BadTile {
        tile: format!("{}x{}x4", spec.ep, spec.hp()),
        why,
    };
    if spec.ep == 0 || spec.zb == 0 {
        return Err(bad(
            "the avx512 int8 kernel needs rows ≥ 1 and hp a positive multiple of 16".into(),
        ));
    }
    if zmm_needed(spec.ep, spec.zb) > ZMM_REGS {
        return Err(bad(format!(
            "{} zmm needed (2 × {} accumulators + {} B + 1), more than 32",
            zmm_needed(spec.ep, spec.zb),
            spec.ep * spec.zb,
            spec.zb
        )));
    }
    if !spec.group.is_power_of_two() || !(8..=super::MAX_INT4_GROUP as usize).contains(&spec.group)
    {
        return Err(bad(format!(
            "group length {} (the kernel takes powers of two from 8 to {})",
            spec.group,
            super::MAX_INT4_GROUP
        )));
    }
    if spec.zero == ZeroPoint::None {
        return Err(bad(
            "the avx512 int8 kernel reads i8sym codes as unsigned (zero point Implied128), not as signed"
                .into(),
        ));
    }
    let mut a = X86Asm::new();
    a.comment(&format!(
        "matmul avx512 {variant} x i8dyn w {} y {} tile {}x{}x4 bias {} act {:?} mac vpdpbusd zmm",
        spec.weights(),
        Format::F32,
        spec.ep,
        spec.hp(),
        spec.bias,
        spec.activation,
    ));
    prologue(&mut a, spec);
    if spec.ep > 1 && variant != Variant::Gemv {
        let (one_row, done) = (a.new_label(), a.new_label());
        a.load64(RAX, mem(RDI, MM_M));
        a.cmp_imm(RAX, 1);
        a.jcc(Cond::E, one_row);
        let direct = a.new_label();
        if !spec.bytes() {
            a.load64(RAX, mem(R15, BUF));
            a.cmp_imm(RAX, 0);
            a.jcc(Cond::E, direct);
            a.comment(&format!(
                "{variant}: {} rows per tile, panel unpacked once",
                spec.ep
            ));
            nest(&mut a, spec, spec.ep, true);
            a.jmp(done);
        }
        a.bind(direct);
        a.comment(&format!("{variant}: {} rows per tile", spec.ep));
        nest(&mut a, spec, spec.ep, false);
        a.jmp(done);
        a.bind(one_row);
        a.comment("gemv: one row");
        nest(&mut a, spec, 1, false);
        a.bind(done);
    } else {
        a.comment("gemv: one row per tile");
        nest(&mut a, spec, 1, false);
    }
    epilogue(&mut a);
    let (bytes, listing) = a.finish().map_err(EmitError::Assembler)?;
    Ok(super::machine_code(bytes, listing))
}

fn prologue(a: &mut X86Asm, spec: &Avx512Int8Spec) {
    for r in SAVED {
        a.push(r);
    }
    a.sub_imm(RSP, FRAME);
    a.mov(R15, RSP);
    for v in 0..=16 {
        a.store32_imm(mem(R15, KMASKS + 4 * v), ((1u32 << v) - 1) as i32);
    }
    a.store32_imm(mem(R15, NIBBLE), 0x0F0F_0F0F);
    a.store32_imm(mem(R15, FLIP), 0x8080_8080_u32 as i32);
    a.mov_imm(RAX, HIGH_LANES);
    a.kmovw_from_gp(HIGH, RAX);
    a.load64(RAX, mem(RDI, MM_K));
    a.add_imm(RAX, 3);
    a.shr_imm(RAX, 2);
    a.store64(mem(R15, STEPS), RAX);
    a.load64(RAX, mem(RDI, MM_K));
    a.add_imm(RAX, spec.group as i32 - 1);
    a.shr_imm(RAX, spec.group.trailing_zeros() as i8);
    a.store64(mem(R15, GROUPS), RAX);
    // The panel buffer: steps·64·zb bytes below the frame when that is at
    // most PANEL_BUFFER_BYTES, else none (BUF = 0); none for 8-bit codes.
    let (fits, none) = (a.new_label(), a.new_label());
    a.load64(RAX, mem(R15, STEPS));
    a.imul_imm(RAX, RAX, 64 * spec.zb as i32);
    if spec.bytes() {
        a.mov_imm(RAX, PANEL_BUFFER_BYTES + 1);
    }
    a.cmp_imm(RAX, PANEL_BUFFER_BYTES);
    a.jcc(Cond::Be, fits);
    a.mov_imm(RAX, 0);
    a.store64(mem(R15, BUF), RAX);
    a.jmp(none);
    a.bind(fits);
    // rsp = (rsp - bytes) rounded down to 64: whole-line zmm loads.
    a.mov(RDX, RSP);
    a.sub(RDX, RAX);
    a.shr_imm(RDX, 6);
    a.shl_imm(RDX, 6);
    a.mov(RSP, RDX);
    a.store64(mem(R15, BUF), RSP);
    a.bind(none);
}

fn epilogue(a: &mut X86Asm) {
    a.vzeroupper();
    a.mov(RSP, R15);
    a.add_imm(RSP, FRAME);
    for r in SAVED.iter().rev() {
        a.pop(*r);
    }
    a.ret();
}

/// rax = n0 + rbx·hp: the panel's first column.
fn first_column(a: &mut X86Asm, hp: i32) {
    a.imul_imm(RAX, RBX, hp);
    a.load64(RDX, mem(RDI, MM_N0));
    a.add(RAX, RDX);
}

/// One loop nest. With `prepacked` each panel is unpacked once into the
/// stack buffer (64 bytes per column block and step) and every row block
/// loads its B registers from there instead of unpacking again.
fn nest(a: &mut X86Asm, spec: &Avx512Int8Spec, rows: usize, prepacked: bool) {
    let zb = spec.zb;
    let hp = spec.hp();
    let ep = spec.ep as i32;
    let r = Regs { rows, zb };
    let packed_step = spec.packed_step();
    let unpacked_step = 64 * zb as i32;

    let panel_loop = nest::panels_head(a);
    if prepacked {
        // rsi = w + first column·steps·2; r13 = the buffer; rcx = steps.
        let (unpack_loop, unpacked) = (a.new_label(), a.new_label());
        first_column(a, hp);
        packed_panel_ptr(a, spec);
        a.load64(R13, mem(R15, BUF));
        a.load64(RCX, mem(R15, STEPS));
        a.cmp_imm(RCX, 0);
        a.jcc(Cond::E, unpacked);
        a.bind(unpack_loop);
        for j in 0..zb {
            unpack(a, r.b(j), mem(RSI, 32 * j as i32));
            a.vmovups_zmm_store(mem(R13, 64 * j as i32), r.b(j));
        }
        a.add_imm(RSI, packed_step);
        a.add_imm(R13, unpacked_step);
        a.sub_imm(RCX, 1);
        a.jcc(Cond::Ne, unpack_loop);
        a.bind(unpacked);
    }
    a.mov_imm(R14, 0);
    let row_loop = nest::rows_head(a);

    // r8 = x + rbp·steps·4 + r14·4 (row block rbp/ep: ep rows of 4 bytes
    // per step; r14 = the row within it).
    a.mov(RAX, RBP);
    a.load64(RDX, mem(R15, STEPS));
    a.imul(RAX, RDX);
    a.add(RAX, R14);
    a.shl_imm(RAX, 2);
    a.load64(RDX, mem(RDI, MM_X));
    a.add(RAX, RDX);
    a.mov(R8, RAX);
    // rsi = w + first column·steps·2 (or the unpacked panel).
    first_column(a, hp);
    a.mov(R9, RAX);
    if prepacked {
        a.load64(RSI, mem(R15, BUF));
    } else {
        packed_panel_ptr(a, spec);
    }
    // r9 = params + first column·groups·param bytes·sets; r10 = r9 +
    // groups·hp·param bytes (the panel's offsets, u4asym).
    let param_bytes = spec.params.bytes() as i32;
    a.load64(RDX, mem(R15, GROUPS));
    a.imul(R9, RDX);
    a.imul_imm(R9, R9, param_bytes * spec.param_sets());
    a.load64(RAX, mem(RDI, MM_W_PARAMS));
    a.add(R9, RAX);
    a.imul_imm(R10, RDX, hp * param_bytes);
    a.add(R10, R9);
    // r12 = groups·4; r11 = x_sums + (rbp + r14)·r12.
    a.mov(R12, RDX);
    a.shl_imm(R12, 2);
    a.mov(R11, RBP);
    a.add(R11, R14);
    a.imul(R11, R12);
    a.load64(RAX, mem(RDI, MM_X_SUMS));
    a.add(R11, RAX);
    for i in 0..rows {
        for j in 0..zb {
            let v = r.acc(i, j);
            a.vpxord_zmm(v, v, v);
        }
    }

    group_loop(a, spec, &r, ep, prepacked);

    // y = acc·sx (rows past m too: x_scales is padded to whole row blocks).
    a.mov(RAX, RBP);
    a.add(RAX, R14);
    a.shl_imm(RAX, 2);
    a.load64(RDX, mem(RDI, MM_X_SCALES));
    a.add(RAX, RDX);
    for i in 0..rows {
        for j in 0..zb {
            let v = r.acc(i, j);
            a.vmulps_zmm_bcst(v, v, mem(RAX, 4 * i as i32));
        }
    }
    // Then per column block (its tail mask in k3, its bias in T): bias,
    // activation and the store of every row below m.
    if spec.bias {
        first_column(a, hp);
        a.shl_imm(RAX, 2);
        a.load64(RSI, mem(RDI, MM_BIAS));
        a.add(RSI, RAX);
    }
    let relu = spec.activation == Activation::Relu;
    if relu {
        a.vpxord_zmm(r.b(0), r.b(0), r.b(0));
    }
    for j in 0..zb {
        a.imul_imm(RAX, RBX, hp);
        a.load64(RCX, mem(RDI, MM_N));
        a.sub(RCX, RAX);
        set_tail_mask(a, j);
        if spec.bias {
            a.vmovups_zmm_load_masked(r.t(), TAIL, mem(RSI, 64 * j as i32));
        }
        let stored = a.new_label();
        for i in 0..rows {
            a.mov(RAX, RBP);
            a.add(RAX, R14);
            if i > 0 {
                a.add_imm(RAX, i as i32);
            }
            a.cmp_mem(RAX, mem(RDI, MM_M));
            a.jcc(Cond::Ge, stored);
            // r13 = y + row·y_stride + (first column + 16j)·4.
            a.mov(R13, RAX);
            a.load64(RDX, mem(RDI, MM_Y_STRIDE));
            a.imul(R13, RDX);
            a.load64(RDX, mem(RDI, MM_Y));
            a.add(R13, RDX);
            first_column(a, hp);
            a.shl_imm(RAX, 2);
            a.add(R13, RAX);
            let v = r.acc(i, j);
            if spec.bias {
                a.vaddps_zmm(v, v, r.t());
            }
            if relu {
                a.vmaxps_zmm(v, v, r.b(0));
            }
            a.vmovups_zmm_store_masked(mem(R13, 64 * j as i32), TAIL, v);
        }
        a.bind(stored);
    }

    if rows == 1 && ep > 1 {
        // One row at a time through blocks of ep rows: r14 walks the block.
        let same_block = a.new_label();
        a.add_imm(R14, 1);
        a.cmp_imm(R14, ep);
        a.jcc(Cond::L, same_block);
        a.mov_imm(R14, 0);
        a.add_imm(RBP, ep);
        a.bind(same_block);
        a.mov(RAX, RBP);
        a.add(RAX, R14);
        a.cmp_mem(RAX, mem(RDI, MM_M));
    } else {
        a.add_imm(RBP, rows as i32);
        a.cmp_mem(RBP, mem(RDI, MM_M));
    }
    a.jcc(Cond::L, row_loop);
    nest::panels_tail(a, panel_loop, hp);
}

/// rsi = w + rax·steps·(2 or 4 bytes): the packed panel whose first column
/// is rax. Clobbers rax, rdx.
fn packed_panel_ptr(a: &mut X86Asm, spec: &Avx512Int8Spec) {
    a.load64(RDX, mem(R15, STEPS));
    a.imul(RAX, RDX);
    a.shl_imm(RAX, if spec.bytes() { 2 } else { 1 });
    a.load64(RDX, mem(RDI, MM_W));
    a.add(RAX, RDX);
    a.mov(RSI, RAX);
}

/// k3 = the valid lanes of column block j, given rcx valid columns in the
/// panel (none when the block is past n). Clobbers rax, rdx.
fn set_tail_mask(a: &mut X86Asm, j: usize) {
    let (low, high) = (a.new_label(), a.new_label());
    a.mov(RDX, RCX);
    if j > 0 {
        a.sub_imm(RDX, (LANES * j) as i32);
    }
    a.cmp_imm(RDX, 0);
    a.jcc(Cond::Ge, low);
    a.mov_imm(RDX, 0);
    a.bind(low);
    a.cmp_imm(RDX, LANES as i32);
    a.jcc(Cond::Le, high);
    a.mov_imm(RDX, LANES as i32);
    a.bind(high);
    a.shl_imm(RDX, 2);
    a.add(RDX, R15);
    a.load16(RAX, mem(RDX, KMASKS));
    a.kmovw_from_gp(TAIL, RAX);
}

/// B = the 16 channels × 4 codes of two packed runs at `m` (see the
/// module doc). `b` must be below zmm16 (a VEX load).
fn unpack(a: &mut X86Asm, b: Zmm, m: Mem) {
    a.vmovdqu_load(Ymm(b.0), m);
    a.vshufi32x4_zmm(b, b, b, 0x50);
    a.vpsrld_zmm_imm(b, HIGH, b, 4);
    a.vpandd_zmm_bcst(b, b, mem(R15, NIBBLE));
}

/// Per group: i32 sums over its steps, then f32 scale and zero point.
fn group_loop(a: &mut X86Asm, spec: &Avx512Int8Spec, r: &Regs, ep: i32, prepacked: bool) {
    let spg = spec.group as i32 / 4;
    let hp = spec.hp();
    let wstep = if prepacked {
        64 * r.zb as i32
    } else {
        spec.packed_step()
    };
    let step = |a: &mut X86Asm, u: i32| {
        for j in 0..r.zb {
            if spec.bytes() {
                let b = r.b(j);
                a.vmovdqu8_zmm_load(b, mem(RSI, u * wstep + 64 * j as i32));
                a.vpxord_zmm_bcst(b, b, mem(R15, FLIP));
            } else if prepacked {
                a.vmovdqu32_zmm_load(r.b(j), mem(RSI, u * wstep + 64 * j as i32));
            } else {
                unpack(a, r.b(j), mem(RSI, u * wstep + 32 * j as i32));
            }
        }
        for i in 0..r.rows {
            for j in 0..r.zb {
                a.vpdpbusd_zmm_bcst(r.g(i, j), r.b(j), mem(R8, u * ep * 4 + 4 * i as i32));
            }
        }
    };
    let (group_top, slow_loop, group_end, done) =
        (a.new_label(), a.new_label(), a.new_label(), a.new_label());
    a.load64(RAX, mem(R15, STEPS));
    a.store64(mem(R15, LEFT), RAX);
    a.bind(group_top);
    // rcx = steps in this group, LEFT -= rcx.
    common::next_group(a, mem(R15, LEFT), spg, done);
    for i in 0..r.rows {
        for j in 0..r.zb {
            let g = r.g(i, j);
            a.vpxord_zmm(g, g, g);
        }
    }
    a.cmp_imm(RCX, spg);
    a.jcc(Cond::Ne, slow_loop);
    for u in 0..spg {
        step(a, u);
    }
    a.add_imm(R8, spg * ep * 4);
    a.add_imm(RSI, spg * wstep);
    a.jmp(group_end);
    a.bind(slow_loop);
    step(a, 0);
    a.add_imm(R8, ep * 4);
    a.add_imm(RSI, wstep);
    a.sub_imm(RCX, 1);
    a.jcc(Cond::Ne, slow_loop);
    a.bind(group_end);
    // acc += sw·dot + min·Σq (u4sym: sw·(dot − 8·Σq); i8sym: sw·(dot −
    // 128·Σq)), per row and column
    // block. f16 scales go to the B registers once per group.
    let f16 = spec.params == ParamType::F16;
    let param_bytes = spec.params.bytes() as i32;
    if f16 {
        for j in 0..r.zb {
            a.vcvtph2ps_zmm_load(r.b(j), mem(R9, 32 * j as i32));
        }
    }
    a.mov(R13, R11);
    for i in 0..r.rows {
        let implied = match spec.zero {
            ZeroPoint::Implied8 => Some(3),
            ZeroPoint::Implied128 => Some(7),
            _ => None,
        };
        if let Some(shift) = implied {
            // t = Σq·(8 or 128) as i32.
            a.vpbroadcastd_zmm_load(r.t(), mem(R13, 0));
            a.vpslld_zmm_imm(r.t(), r.t(), shift);
        }
        for j in 0..r.zb {
            let g = r.g(i, j);
            if implied.is_some() {
                a.vpsubd_zmm(g, g, r.t());
            }
            a.vcvtdq2ps_zmm(g, g);
            if f16 {
                a.vfmadd231ps_zmm(r.acc(i, j), g, r.b(j));
            } else {
                a.vfmadd231ps_zmm_mem(r.acc(i, j), g, mem(R9, 64 * j as i32));
            }
        }
        if spec.zero == ZeroPoint::Offset {
            a.vcvtdq2ps_zmm_bcst(r.t(), mem(R13, 0));
            for j in 0..r.zb {
                if f16 {
                    let min = r.g(i, j);
                    a.vcvtph2ps_zmm_load(min, mem(R10, 32 * j as i32));
                    a.vfmadd231ps_zmm(r.acc(i, j), r.t(), min);
                } else {
                    a.vfmadd231ps_zmm_mem(r.acc(i, j), r.t(), mem(R10, 64 * j as i32));
                }
            }
        }
        if i + 1 < r.rows {
            a.add(R13, R12);
        }
    }
    a.add_imm(R11, 4);
    a.add_imm(R9, hp * param_bytes);
    if spec.zero == ZeroPoint::Offset {
        a.add_imm(R10, hp * param_bytes);
    }
    a.jmp(group_top);
    a.bind(done);
}
