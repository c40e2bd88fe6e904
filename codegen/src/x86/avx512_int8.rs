//! The AVX-512 int8 matmul (`i8dyn` x; `u4asym:gN`, `u4sym:gN` or
//! `i8sym:gN` w, N a power of two from 8 to 128, f32 or f16 group
//! parameters, so ggml's Q4_0, Q4_1 and Q8_0 too; f32 y): the int8
//! emitter's loop nest ([`super::int8`], which lists what differs between
//! the files) on zmm registers with AVX512-VNNI `vpdpbusd` (16 dword lanes
//! × 4 int8 per instruction), for the `x86-avx512` target's int8 tiles. A
//! ymm kernel is capped at half the 512-bit integer throughput of such
//! CPUs. This module is its front-end (the spec, its checks against the
//! solver) and the zmm side of `super::int8::Int8File`: frame, unpack,
//! panel buffer and store.
//!
//! Same ABI ([`crate::abi::MatmulArgs`]), activation quantizer output
//! (`[e/ep, l/4, ep, 4]`, Σq per row and group in `x_sums`) and packed
//! weights as the AVX2 kernel; hp is a multiple of 16 (zb = hp/16 zmm per
//! packed step).
//!
//! **Unpack.** A packed step of hp channels is hp/8 pair-transposed runs
//! of 16 bytes (run r: byte b holds channel 8r + b/4 in its low nibble and
//! channel 8r + 4 + b/4 in its high one). `vpdpbusd` wants dword c of a
//! register to hold channel c's 4 codes (unsigned weights, signed
//! activations), and the dot products do not care which channel sits in
//! which dword, so the unpack leaves them in the order that costs fewest
//! instructions and the rest of the loop follows it:
//!
//! - **Pairs.** Column blocks 2p and 2p + 1 (runs 4p..4p + 3) come from
//!   one 64-byte load: `vpandd` 0x0F gives block 2p the low nibbles
//!   (channels 0-3, 8-11, 16-19, 24-27 of the pair), `vpsrld` 4 +
//!   `vpandd` block 2p + 1 the high ones (4-7, 12-15, 20-23, 28-31): 1.5
//!   instructions per 64 codes.
//! - **A lone block** (hp = 16, or the last of hp = 48): `vbroadcasti64x4`
//!   puts its two runs in both halves (a load alone), `vpsrld` 4 under
//!   opmask k2 = lanes 2 and 3 and `vpandd` leave channels 0-3, 8-11, 4-7,
//!   12-15: 2 instructions, where channel order took a `vshufi32x4` more.
//!
//! At a group end the scales (and offsets) are loaded into B in the same
//! order (a pair: `vshufi32x4` lanes 0,2 / 1,3 of two f32 vectors, or
//! `vpermq` + `vshufi32x4` of 32 f16 values before widening; a lone block:
//! `vshufi32x4` lanes 0,2,1,3), and before the store each tile's totals go
//! back to channel order (four `vshufi32x4` a pair and row, one a lone
//! block and row). Hot in L2 the pairs made the 1 × 64 GEMV and the 4 ×
//! 32 flat tile of Q4_0 about 10% faster, the lone block's form the 4 × 16
//! and 8 × 16 flat tiles about 5% (Sapphire Rapids). The activations need
//! no register: each `vpdpbusd` reads its row's 4 codes with a `{1to16}`
//! broadcast.
//!
//! **8-bit codes** (`i8sym:gN`) are signed, and `vpdpbusd` multiplies an
//! unsigned operand by a signed one. A `vmovdqu8` load of the 64 bytes of a
//! column block and a `vpxord` with 0x80 per byte make them w + 128 as
//! unsigned bytes; the group's sums then start from −128·Σq (the
//! quantizer's row sums, written so), exactly as `u4sym`'s start from
//! −8·Σq ([`ZeroPoint::Implied128`]).
//! One instruction per row and step, where the AVX2 kernel's sign trick
//! (`vpabsb`, `vpsignb`) spends three. These take no panel buffer.
//!
//! **Groups.** A group (g/4 steps, unrolled) sums in i32 (no int16 stage,
//! so long groups need no widening); then per row and column block
//! acc += sw_g·dot_g + min_g·Σq_g in f32 (`u4sym`: sw_g·(dot_g − 8·Σq_g),
//! the zero point in the sums from the group's start: a broadcast load
//! of −8·Σq_g instead of a zeroing, so the fold spends no µop on it),
//! and y = acc·sx at the end. f16
//! scales are widened once per group into the B registers, which the
//! group end does not otherwise use; f16 offsets into each group-sum
//! register once it has been folded.
//!
//! # Register plan (rows × zb)
//!
//! | zmm | holds |
//! |---|---|
//! | 0 .. zb | B: unpacked codes of column block j; zero for relu in the epilogue |
//! | zb | Σq of one row as f32 (stored offsets); bias under the tail mask in the epilogue |
//! | then rows·zb | f32 accumulators acc(i,j) |
//! | then rows·zb | i32 group sums g(i,j) |
//! | then rows·zb | with fewer sums than [`Dot::chains_in_flight`], where they fit: the odd steps' group sums |
//!
//! So a tile needs 2·rows·zb + zb + 1 ≤ 32 zmm: 14 × 16 or 7 × 32.
//! Opmask k2 = the shifted lanes, k3 = the valid lanes of the column block
//! being stored.
//!
//! **Panel buffer.** In the GEMM, with K short enough
//! ([`PANEL_BUFFER_BYTES`]) and m past one row block, the multi-row loop
//! unpacks each panel once into a 64-byte-aligned stack buffer below the
//! frame and its row blocks load B from there (one `vmovdqu32` per column
//! block and step instead of the unpack). One row block, and every flat
//! GEMM, unpacks in the loop: the buffer's extra pass halved a flat GEMM's
//! speed at one row block on Zen 4 and made it 1.6× slower at two on Zen 5.
//!
//! **Prefetch.** The flat and one-row loops prefetch the weight stream
//! as the ymm kernel does ([`WeightPrefetch`]): without it the
//! flat 8 × 16 tile read 7.8 GB/s of Q4_0 at M = 8 on Zen 4, with it 11.7.
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
use super::common;
use super::evex::{Kreg, Zmm};
use super::int8::{
    self, Dot, Int8File, Int8Frame, Int8Kernel, Int8Regs, Operand, ZeroPoint, first_column,
    packed_panel_ptr,
};
use super::prefetch::WeightPrefetch;
use super::regfile::RegisterFile;
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

    /// 8-bit weight codes (`i8sym`), else 4-bit.
    fn bytes(&self) -> bool {
        self.zero == ZeroPoint::Implied128
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
/// Lanes 2 and 3 (dwords 8-15): a lone block's high nibbles' lanes.
const HIGH: Kreg = Kreg(2);
const HIGH_LANES: i32 = 0xFF00;

/// The valid lanes of the column block being stored.
const TAIL: Kreg = Kreg(3);

/// Emit the GEMM variant (with the one-row loop for m = 1).
pub fn emit(spec: &Avx512Int8Spec) -> Result<MachineCode, EmitError> {
    emit_variant(spec, Variant::Gemm)
}

/// Emit one variant: `Gemv` runs every row through the one-row loop, the
/// others run tiles of ep rows (m = 1 always takes the one-row loop).
/// Every variant keeps all of K in registers per row block.
pub fn emit_variant(spec: &Avx512Int8Spec, variant: Variant) -> Result<MachineCode, EmitError> {
    emit_variant_prefetching(spec, variant, WeightPrefetch::INT8)
}

/// [`emit_variant`] with the weight stream prefetched by `prefetch`.
pub fn emit_variant_prefetching(
    spec: &Avx512Int8Spec,
    variant: Variant,
    prefetch: WeightPrefetch,
) -> Result<MachineCode, EmitError> {
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
    int8::emit_on::<Zmm>(
        &Int8Kernel {
            spec: int8::Int8Spec {
                ep: spec.ep,
                hb: spec.zb,
                group: Some(spec.group),
                wbits: if spec.bytes() { 8 } else { 4 },
                zero: spec.zero,
                params: spec.params,
                y: Format::F32,
                bias: spec.bias,
                activation: spec.activation,
                dot: Dot::EvexVnni,
            },
            prefetch: Some(prefetch),
        },
        variant,
    )
}

impl Int8File for Zmm {
    const INT8_FRAME: Int8Frame = Int8Frame {
        base: R15,
        steps: STEPS,
        groups: GROUPS,
        left: LEFT,
        panel_buffer: Some(BUF),
    };
    const TOTALS_IN_REGISTERS: bool = true;
    const EMBEDDED_BROADCAST: bool = true;
    const ROW_WALK: bool = true;
    const SLOW_ENTRY_LABEL: bool = false;
    const SUMS: Gp = R11;
    const SUMS_STRIDE: Gp = R12;
    const SUMS_WALK: Gp = R13;

    fn regs(rows: usize, zb: usize, _grouped: bool) -> Int8Regs {
        Int8Regs {
            rows,
            hb: zb,
            totals: zb + 1,
            sums: zb + 1 + rows * zb,
            a: None,
            sigma: zb,
            b: 0,
            b_per_block: true,
            reserved: None,
            odd_sums: None,
        }
    }
    /// After the group sums ([`zmm_needed`]).
    fn first_free(r: &Int8Regs) -> usize {
        zmm_needed(r.rows, r.hb)
    }
    fn add_i32(a: &mut X86Asm, dst: Zmm, x: Zmm, y: Zmm) {
        a.vpaddd_zmm(dst, x, y);
    }
    fn mac_name(_dot: Dot) -> &'static str {
        "vpdpbusd zmm"
    }
    fn open_frame(a: &mut X86Asm, _k: &Int8Kernel) {
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
    }
    /// steps·64·zb bytes below the frame when that is at most
    /// [`PANEL_BUFFER_BYTES`], else none (BUF = 0); none for 8-bit codes.
    fn open_panel_buffer(a: &mut X86Asm, k: &Int8Kernel) {
        let (fits, none) = (a.new_label(), a.new_label());
        a.load64(RAX, mem(R15, STEPS));
        a.imul_imm(RAX, RAX, 64 * k.hb as i32);
        if k.flip() {
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
    fn close_frame(a: &mut X86Asm) {
        a.vzeroupper();
        a.mov(RSP, R15);
        a.add_imm(RSP, FRAME);
        for r in SAVED.iter().rev() {
            a.pop(*r);
        }
        a.ret();
    }
    fn scale_param_index(a: &mut X86Asm, bytes: i32) {
        a.imul_imm(R9, R9, bytes);
    }
    fn permuted_channels(k: &Int8Kernel) -> bool {
        k.nibbles()
    }
    fn group_params_to_b(a: &mut X86Asm, k: &Int8Kernel, r: &Int8Regs, base: Gp) {
        let f16 = k.params == ParamType::F16;
        for j in 0..r.hb {
            let b: Zmm = r.b(j);
            match unpacked_as(k, j) {
                Unpack::Pair => {
                    let hi: Zmm = r.b(j + 1);
                    if f16 {
                        // Qwords (4 halves) 0,2,4,6 to the low 256 bits,
                        // 1,3,5,7 to the high, then each half widened.
                        a.vpermq_zmm_mem_imm(b, mem(base, 32 * j as i32), SWAP_MIDDLE_LANES);
                        a.vshufi32x4_zmm(b, b, b, SWAP_MIDDLE_LANES);
                        a.vextracti64x4_hi(Ymm(hi.0), b);
                        a.vcvtph2ps_zmm(hi, Ymm(hi.0));
                        a.vcvtph2ps_zmm(b, Ymm(b.0));
                    } else {
                        let second = mem(base, 64 * (j + 1) as i32);
                        a.vmovups_zmm_load(hi, mem(base, 64 * j as i32));
                        a.vshufi32x4_zmm_mem(b, hi, second, EVEN_LANES);
                        a.vshufi32x4_zmm_mem(hi, hi, second, ODD_LANES);
                    }
                }
                order @ (Unpack::Single | Unpack::Bytes) => {
                    if f16 {
                        a.vcvtph2ps_zmm_load(b, mem(base, 32 * j as i32));
                    } else {
                        a.vmovups_zmm_load(b, mem(base, 64 * j as i32));
                    }
                    if order == Unpack::Single {
                        a.vshufi32x4_zmm(b, b, b, SWAP_MIDDLE_LANES);
                    }
                }
                Unpack::WithItsPair => {}
            }
        }
    }
    /// r13 walks the buffer, 64 bytes per column block and step.
    fn unpack_panel(a: &mut X86Asm, k: &Int8Kernel, r: &Int8Regs, hp: i32) {
        let (unpack_loop, unpacked) = (a.new_label(), a.new_label());
        first_column(a, hp);
        packed_panel_ptr::<Zmm>(a, k);
        a.load64(R13, mem(R15, BUF));
        a.load64(RCX, mem(R15, STEPS));
        a.cmp_imm(RCX, 0);
        a.jcc(Cond::E, unpacked);
        a.bind(unpack_loop);
        for j in 0..r.hb {
            unpack_block(a, k, r, j, mem(RSI, 32 * j as i32));
        }
        for j in 0..r.hb {
            a.vmovups_zmm_store(mem(R13, 64 * j as i32), r.b(j));
        }
        a.add_imm(RSI, k.packed_step(hp));
        a.add_imm(R13, Self::BYTES * r.hb as i32);
        a.sub_imm(RCX, 1);
        a.jcc(Cond::Ne, unpack_loop);
        a.bind(unpacked);
    }
    /// 8-bit codes: 64 bytes, their sign bits flipped (w + 128 unsigned);
    /// 4-bit: unpacked from two runs, or loaded from the panel buffer.
    fn load_codes(
        a: &mut X86Asm,
        k: &Int8Kernel,
        r: &Int8Regs,
        j: usize,
        at: i32,
        prepacked: bool,
    ) {
        let b: Zmm = r.b(j);
        if k.flip() {
            a.vmovdqu8_zmm_load(b, mem(RSI, at + 64 * j as i32));
            a.vpxord_zmm_bcst(b, b, mem(R15, FLIP));
        } else if prepacked {
            a.vmovdqu32_zmm_load(b, mem(RSI, at + 64 * j as i32));
        } else {
            unpack_block(a, k, r, j, mem(RSI, at + 32 * j as i32));
        }
    }
    fn dot(
        a: &mut X86Asm,
        _k: &Int8Kernel,
        r: &Int8Regs,
        g: Zmm,
        j: usize,
        x: Operand<Zmm>,
        _frame: i32,
    ) {
        let Operand::Broadcast(m) = x else {
            unreachable!("zmm reads the codes with {{1to16}}")
        };
        a.vpdpbusd_zmm_bcst(g, r.b(j), m);
    }
    fn broadcast_i32(a: &mut X86Asm, dst: Zmm, m: Mem) {
        a.vpbroadcastd_zmm_load(dst, m);
    }
    fn cvt_i32(a: &mut X86Asm, dst: Zmm, src: Zmm) {
        a.vcvtdq2ps_zmm(dst, src);
    }
    fn cvt_i32_broadcast(a: &mut X86Asm, dst: Zmm, m: Mem) {
        a.vcvtdq2ps_zmm_bcst(dst, m);
    }
    fn cvt_f16(a: &mut X86Asm, dst: Zmm, m: Mem) {
        a.vcvtph2ps_zmm_load(dst, m);
    }
    fn mul(a: &mut X86Asm, dst: Zmm, src: Operand<Zmm>) {
        let Operand::Broadcast(m) = src else {
            unreachable!("zmm multiplies by broadcast scales only")
        };
        a.vmulps_zmm_bcst(dst, dst, m);
    }
    /// Per column block (its tail mask in k3, its bias in Σq's register):
    /// bias, activation and the masked store of every row below m, r13 =
    /// the row's y.
    fn store_tile(a: &mut X86Asm, k: &Int8Kernel, r: &Int8Regs, hp: i32) {
        for j in 0..r.hb {
            match unpacked_as(k, j) {
                Unpack::Single => {
                    for i in 0..r.rows {
                        let v: Zmm = r.total(i, j);
                        a.vshufi32x4_zmm(v, v, v, SWAP_MIDDLE_LANES);
                    }
                    continue;
                }
                Unpack::Pair => {}
                _ => continue,
            }
            for i in 0..r.rows {
                // (P0, P1) → channels 0-15, 16-31; the group sums are free.
                let (p0, p1, t): (Zmm, Zmm, Zmm) = (r.total(i, j), r.total(i, j + 1), r.sum(i, j));
                a.vshufi32x4_zmm(t, p0, p1, LOW_HALVES);
                a.vshufi32x4_zmm(p1, p0, p1, HIGH_HALVES);
                a.vshufi32x4_zmm(p0, t, t, SWAP_MIDDLE_LANES);
                a.vshufi32x4_zmm(p1, p1, p1, SWAP_MIDDLE_LANES);
            }
        }
        let t = Zmm::reg(r.sigma);
        let zero: Zmm = r.b(0);
        let relu = k.activation == Activation::Relu;
        if relu {
            a.vpxord_zmm(zero, zero, zero);
        }
        for j in 0..r.hb {
            a.imul_imm(RAX, RBX, hp);
            a.load64(RCX, mem(RDI, MM_N));
            a.sub(RCX, RAX);
            set_tail_mask(a, j);
            if k.bias {
                a.vmovups_zmm_load_masked(t, TAIL, mem(RSI, 64 * j as i32));
            }
            let stored = a.new_label();
            for i in 0..r.rows {
                a.mov(RAX, RBP);
                a.add(RAX, R14);
                if i > 0 {
                    a.add_imm(RAX, i as i32);
                }
                a.cmp_mem(RAX, mem(RDI, MM_M));
                a.jcc(Cond::Ge, stored);
                // r13 = y + row·y_stride + (first column + 16j)·4.
                common::row_address(a, R13, RAX, RDX, mem(RDI, MM_Y_STRIDE), mem(RDI, MM_Y));
                first_column(a, hp);
                a.shl_imm(RAX, 2);
                a.add(R13, RAX);
                let v: Zmm = r.total(i, j);
                if k.bias {
                    a.vaddps_zmm(v, v, t);
                }
                if relu {
                    a.vmaxps_zmm(v, v, zero);
                }
                a.vmovups_zmm_store_masked(mem(R13, 64 * j as i32), TAIL, v);
            }
            a.bind(stored);
        }
    }
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

/// `vshufi32x4` lanes (0, 2, 1, 3): a lone block's unpacked order to
/// channel order and back (also `vpermq`'s qwords 0, 2, 1, 3 per half).
const SWAP_MIDDLE_LANES: u8 = 0xD8;
/// `vshufi32x4` of two vectors of 16 channels: lanes 0 and 2 of each (a
/// pair's low-nibble block), and lanes 1 and 3 of each (its high one).
const EVEN_LANES: u8 = 0x88;
const ODD_LANES: u8 = 0xDD;
/// `vshufi32x4` of two vectors: lanes 0 and 1 of each, and 2 and 3 of each.
const LOW_HALVES: u8 = 0x44;
const HIGH_HALVES: u8 = 0xEE;

/// How column block j's codes are unpacked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Unpack {
    /// With block j + 1, from one 64-byte load: B(j) = the low nibbles
    /// (channels 0-3, 8-11, 16-19, 24-27 of the pair), B(j + 1) = the high
    /// ones (4-7, 12-15, 20-23, 28-31).
    Pair,
    /// By the pair of block j − 1.
    WithItsPair,
    /// Alone ([`unpack`]): channels 0-3, 8-11, 4-7, 12-15.
    Single,
    /// 8-bit codes, loaded in channel order.
    Bytes,
}

fn unpacked_as(k: &Int8Kernel, j: usize) -> Unpack {
    if !k.nibbles() {
        Unpack::Bytes
    } else if j.is_multiple_of(2) && j + 1 == k.hb {
        Unpack::Single
    } else if j.is_multiple_of(2) {
        Unpack::Pair
    } else {
        Unpack::WithItsPair
    }
}

/// Block j's codes at `m` into B (a pair's into both of its registers).
fn unpack_block(a: &mut X86Asm, k: &Int8Kernel, r: &Int8Regs, j: usize, m: Mem) {
    match unpacked_as(k, j) {
        Unpack::Pair => {
            let (lo, hi): (Zmm, Zmm) = (r.b(j), r.b(j + 1));
            a.vmovdqu32_zmm_load(hi, m);
            a.vpandd_zmm_bcst(lo, hi, mem(R15, NIBBLE));
            a.vpsrld_zmm_imm(hi, Kreg(0), hi, 4);
            a.vpandd_zmm_bcst(hi, hi, mem(R15, NIBBLE));
        }
        Unpack::Single => unpack(a, r.b(j), m),
        Unpack::WithItsPair => {}
        Unpack::Bytes => unreachable!("8-bit codes load whole (`load_codes`)"),
    }
}

/// B = the 16 channels × 4 codes of two packed runs at `m`, in the
/// order (0-3, 8-11, 4-7, 12-15): the runs broadcast to both halves
/// (lanes run 0, run 1, run 0, run 1), the upper half's high nibbles
/// shifted down, the nibbles kept. Two vector µops; a shuffle to channel
/// order would be a third in every step.
fn unpack(a: &mut X86Asm, b: Zmm, m: Mem) {
    a.vbroadcasti64x4_zmm_load(b, m);
    a.vpsrld_zmm_imm(b, HIGH, b, 4);
    a.vpandd_zmm_bcst(b, b, mem(R15, NIBBLE));
}
