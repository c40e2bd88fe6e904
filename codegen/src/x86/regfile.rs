//! The vector register files the float matmul emitter ([`super::float`])
//! runs on: ymm through VEX ([`super::asm`]) and zmm through EVEX
//! ([`super::evex`]). The loop nest is written once over [`RegisterFile`];
//! what differs between the files is here: register count and lanes (from
//! their [`TargetCaps`]), instruction encodings, the frame, and how an n
//! tail is masked.
//!
//! | | ymm | zmm |
//! |---|---|---|
//! | registers × f32 lanes | 16 × 8 | 32 × 16 |
//! | n-tail mask | ymm15, loaded from the frame's mask table (`vmaskmovps`) | opmask k1, `kmovw` from a table of `(1 << v) - 1` |
//! | relu's zero | the mask table's zero half, a memory operand | zmm31, zeroed before the store |
//! | bias temporary | ymm14 | zmm30 |
//! | f16 operands | x, w, y (`vcvtph2ps`, `vcvtps2ph`) | none: f32 only |
//! | FMA with x[k] broadcast from memory | none | `{1to16}` |
//! | frame | [`common::prologue`]'s, aligned to a cache line | its own, the opmask table first |

use tessera_dsl::ir::Format;

use super::asm::*;
use super::common;
use super::evex::{Kreg, Zmm};
use crate::target::{TargetCaps, X86_AVX2, X86_AVX512};

/// Frame slots of the float loop nest (rsp-relative after the prologue).
#[derive(Clone, Copy, Debug)]
pub struct FloatFrame {
    /// x row pointers while they are computed (14 rows).
    pub row_slots: i32,
    /// rdi, rbx, rbp, r14, r15 while the k loop holds more than 6 rows.
    pub save_slots: i32,
    /// End of the k loop's weight stream, and its last whole unrolled step.
    pub k_end: i32,
    pub k_end_unrolled: i32,
}

/// One vector register file: its size, its instructions and its frame.
/// Methods taking a [`Format`] widen f16 on load and narrow on store;
/// only ymm has f16 operands.
pub trait RegisterFile: Copy {
    /// The target whose register count and width this file has (the
    /// solver sizes tiles from the same caps).
    const CAPS: TargetCaps;
    /// f32 lanes per register.
    const LANES: usize = (Self::CAPS.register_bits / 32) as usize;
    /// Registers in the file.
    const REGISTERS: usize = Self::CAPS.registers as usize;
    /// Bytes of one register of f32.
    const BYTES: i32 = (Self::LANES * 4) as i32;
    /// The float nest's frame slots.
    const FRAME: FloatFrame;
    /// What a float kernel's listing header calls it.
    const LISTING_NAME: &'static str;
    /// Whether [`common::store_tile`] opens a label after each n-tail
    /// column block, the target of [`common::Store::row_check`]'s guards.
    /// Only ymm kernels check rows. ymm opens it even when they do not and
    /// zmm never does: listings number their labels in order, and the
    /// snapshots pin those numbers.
    const ROW_GUARD_LABELS: bool;

    /// Register `n`.
    fn reg(n: usize) -> Self;
    /// The epilogue's bias temporary: the second-to-last register, never
    /// an accumulator of set 0 while ep·hb ≤ R - 2 (the last is the tail
    /// mask or relu's zero).
    fn bias_tmp() -> Self {
        Self::reg(Self::REGISTERS - 2)
    }

    /// Save callee-saved registers, open the frame, write its tables.
    fn prologue(a: &mut X86Asm);
    /// Clean the upper vector state, close the frame, return.
    fn epilogue(a: &mut X86Asm);

    fn zero(a: &mut X86Asm, v: Self);
    fn load(a: &mut X86Asm, f: Format, dst: Self, m: Mem);
    fn store(a: &mut X86Asm, f: Format, m: Mem, src: Self);
    fn add(a: &mut X86Asm, dst: Self, x: Self, y: Self);
    fn add_mem(a: &mut X86Asm, dst: Self, x: Self, m: Mem);
    fn fma(a: &mut X86Asm, acc: Self, x: Self, y: Self);
    fn fma_mem(a: &mut X86Asm, acc: Self, x: Self, m: Mem);
    /// acc += x · (the f32 at `m`, broadcast by the FMA itself). Only
    /// files with embedded broadcast implement it.
    fn fma_broadcast(_a: &mut X86Asm, _acc: Self, _x: Self, _m: Mem) {
        unreachable!("no embedded broadcast on this register file")
    }
    /// dst = the value at `m` in every lane.
    fn broadcast(a: &mut X86Asm, f: Format, dst: Self, m: Mem);
    /// The 4 f16 values at `src` as f32 at `slot` (16 bytes), through
    /// `tmp`. Only files with f16 operands implement it.
    fn stage_f16x4(_a: &mut X86Asm, _tmp: Self, _src: Mem, _slot: Mem) {
        unreachable!("no f16 operands on this register file")
    }

    /// Prefetch `bytes` bytes of y at `base` (a row block's partial sums).
    fn prefetch_row(a: &mut X86Asm, base: Gp, bytes: i32);
    /// Load the f32 blocks `acc(j)`, j < hb, from `base` (rcx valid
    /// columns, fewer than the panel's): lanes past n read as zero.
    /// May jump to `done` once no block has a valid lane. Clobbers rax, rdx.
    fn load_tail(a: &mut X86Asm, hb: usize, acc: impl Fn(usize) -> Self, base: Gp, done: Label);
    /// Select the valid lanes of column block `j` (rcx valid columns) for
    /// [`Self::masked_load`] and [`Self::masked_store`]; jump to `none`
    /// when it has none. Clobbers rax, rdx.
    fn tail_mask(a: &mut X86Asm, j: usize, none: Label);
    fn masked_load(a: &mut X86Asm, dst: Self, m: Mem);
    fn masked_store(a: &mut X86Asm, f: Format, m: Mem, src: Self);
    /// Whatever [`Self::relu`] needs, once before a tile's stores.
    fn relu_setup(_a: &mut X86Asm) {}
    /// v = max(v, 0).
    fn relu(a: &mut X86Asm, v: Self);
}

impl RegisterFile for Ymm {
    const CAPS: TargetCaps = X86_AVX2;
    const FRAME: FloatFrame = FloatFrame {
        row_slots: common::ROW_SLOTS,
        save_slots: common::SAVE_SLOTS,
        k_end: common::K_END,
        k_end_unrolled: common::K_END_UNROLLED,
    };
    const LISTING_NAME: &'static str = "matmul";
    const ROW_GUARD_LABELS: bool = true;

    fn reg(n: usize) -> Ymm {
        Ymm(n as u8)
    }
    fn prologue(a: &mut X86Asm) {
        common::prologue(a);
    }
    fn epilogue(a: &mut X86Asm) {
        common::epilogue(a);
    }
    fn zero(a: &mut X86Asm, v: Ymm) {
        a.vxorps(v, v, v);
    }
    fn load(a: &mut X86Asm, f: Format, dst: Ymm, m: Mem) {
        match f {
            Format::F32 => a.vmovups_load(dst, m),
            _ => a.vcvtph2ps_load(dst, m),
        }
    }
    fn store(a: &mut X86Asm, f: Format, m: Mem, src: Ymm) {
        match f {
            Format::F16 => a.vcvtps2ph_store(m, src, 0),
            _ => a.vmovups_store(m, src),
        }
    }
    fn add(a: &mut X86Asm, dst: Ymm, x: Ymm, y: Ymm) {
        a.vaddps(dst, x, y);
    }
    fn add_mem(a: &mut X86Asm, dst: Ymm, x: Ymm, m: Mem) {
        a.vaddps_mem(dst, x, m);
    }
    fn fma(a: &mut X86Asm, acc: Ymm, x: Ymm, y: Ymm) {
        a.vfmadd231ps(acc, x, y);
    }
    fn fma_mem(a: &mut X86Asm, acc: Ymm, x: Ymm, m: Mem) {
        a.vfmadd231ps_mem(acc, x, m);
    }
    fn broadcast(a: &mut X86Asm, f: Format, dst: Ymm, m: Mem) {
        match f {
            Format::F32 => a.vpbroadcastd_load(dst, m),
            _ => {
                a.vpbroadcastw_load(dst, m);
                a.vcvtph2ps_reg(dst, dst);
            }
        }
    }
    fn stage_f16x4(a: &mut X86Asm, tmp: Ymm, src: Mem, slot: Mem) {
        a.vcvtph2ps_load64(tmp, src);
        a.vmovups_store128(slot, tmp);
    }
    /// The row's first and last byte.
    fn prefetch_row(a: &mut X86Asm, base: Gp, bytes: i32) {
        a.prefetcht0(mem(base, 0));
        a.prefetcht0(mem(base, bytes - 1));
    }
    /// A fully masked `vmaskmovps` reads zeros, so every block loads.
    fn load_tail(a: &mut X86Asm, hb: usize, acc: impl Fn(usize) -> Ymm, base: Gp, _done: Label) {
        for j in 0..hb {
            common::column_mask(a, j, RCX);
            a.vmaskmovps_load(acc(j), common::MASK, mem(base, Self::BYTES * j as i32));
        }
    }
    /// Leaves rdx = 8 - valid lanes, which an f16 [`Self::masked_store`]
    /// reads.
    fn tail_mask(a: &mut X86Asm, j: usize, none: Label) {
        common::column_mask(a, j, RCX);
        a.cmp_imm(RDX, Self::LANES as i32);
        a.jcc(Cond::E, none);
    }
    fn masked_load(a: &mut X86Asm, dst: Ymm, m: Mem) {
        a.vmaskmovps_load(dst, common::MASK, m);
    }
    /// f16: through the frame's scratch, one word store per valid lane
    /// (rdx from [`Self::tail_mask`]).
    fn masked_store(a: &mut X86Asm, f: Format, m: Mem, src: Ymm) {
        match f {
            Format::F16 => {
                a.vcvtps2ph_store(mem(RSP, common::F16_SCRATCH), src, 0);
                let end = a.new_label();
                for c in 0..8i32 {
                    if c > 0 {
                        a.cmp_imm(RDX, 8 - c);
                        a.jcc(Cond::Ge, end);
                    }
                    a.load16(RAX, mem(RSP, common::F16_SCRATCH + 2 * c));
                    a.store16(mem(m.base, m.disp + 2 * c), RAX);
                }
                a.bind(end);
            }
            _ => a.vmaskmovps_store(m, common::MASK, src),
        }
    }
    fn relu(a: &mut X86Asm, v: Ymm) {
        a.vmaxps_mem(v, v, mem(RSP, common::ZEROS));
    }
}

// ---- the zmm frame --------------------------------------------------------

/// `(1 << v) - 1` for v = 0..=16 (dwords): the opmask of v valid lanes.
const KMASKS: i32 = 0;
/// The float nest's slots after the opmask table (68 bytes).
const ZMM_FRAME: FloatFrame = FloatFrame {
    row_slots: 72,
    save_slots: 72 + 8 * 14,
    k_end: 72 + 8 * 14 + 8 * 5,
    k_end_unrolled: 72 + 8 * 14 + 8 * 5 + 8,
};
const ZMM_FRAME_BYTES: i32 = ZMM_FRAME.k_end_unrolled + 8;
const ZMM_SAVED: [Gp; 6] = [RBX, RBP, R12, R13, R14, R15];
/// The n-tail lanes of one column block.
const TAIL: Kreg = Kreg(1);
/// Relu's zero (the last register; see [`RegisterFile::bias_tmp`]).
const ZERO: Zmm = Zmm(31);

/// The f32-only message of zmm's format-taking methods.
const ZMM_F32_ONLY: &str = "the zmm float kernel takes f32 operands only";

impl RegisterFile for Zmm {
    const CAPS: TargetCaps = X86_AVX512;
    const FRAME: FloatFrame = ZMM_FRAME;
    const LISTING_NAME: &'static str = "matmul avx512";
    const ROW_GUARD_LABELS: bool = false;

    fn reg(n: usize) -> Zmm {
        Zmm(n as u8)
    }
    fn prologue(a: &mut X86Asm) {
        for r in ZMM_SAVED {
            a.push(r);
        }
        a.sub_imm(RSP, ZMM_FRAME_BYTES);
        for v in 0..=Self::LANES as u32 {
            a.store32_imm(mem(RSP, KMASKS + 4 * v as i32), ((1u32 << v) - 1) as i32);
        }
    }
    fn epilogue(a: &mut X86Asm) {
        a.vzeroupper();
        a.add_imm(RSP, ZMM_FRAME_BYTES);
        for r in ZMM_SAVED.iter().rev() {
            a.pop(*r);
        }
        a.ret();
    }
    fn zero(a: &mut X86Asm, v: Zmm) {
        a.vpxord_zmm(v, v, v);
    }
    fn load(a: &mut X86Asm, f: Format, dst: Zmm, m: Mem) {
        assert_eq!(f, Format::F32, "{ZMM_F32_ONLY}");
        a.vmovups_zmm_load(dst, m);
    }
    fn store(a: &mut X86Asm, f: Format, m: Mem, src: Zmm) {
        assert_eq!(f, Format::F32, "{ZMM_F32_ONLY}");
        a.vmovups_zmm_store(m, src);
    }
    fn add(a: &mut X86Asm, dst: Zmm, x: Zmm, y: Zmm) {
        a.vaddps_zmm(dst, x, y);
    }
    fn add_mem(a: &mut X86Asm, dst: Zmm, x: Zmm, m: Mem) {
        a.vaddps_zmm_mem(dst, x, m);
    }
    fn fma(a: &mut X86Asm, acc: Zmm, x: Zmm, y: Zmm) {
        a.vfmadd231ps_zmm(acc, x, y);
    }
    fn fma_mem(a: &mut X86Asm, acc: Zmm, x: Zmm, m: Mem) {
        a.vfmadd231ps_zmm_mem(acc, x, m);
    }
    fn fma_broadcast(a: &mut X86Asm, acc: Zmm, x: Zmm, m: Mem) {
        a.vfmadd231ps_zmm_bcst(acc, x, m);
    }
    fn broadcast(a: &mut X86Asm, f: Format, dst: Zmm, m: Mem) {
        assert_eq!(f, Format::F32, "{ZMM_F32_ONLY}");
        a.vbroadcastss_zmm_load(dst, m);
    }
    /// Every cache line of the row.
    fn prefetch_row(a: &mut X86Asm, base: Gp, bytes: i32) {
        for c in (0..bytes).step_by(64) {
            a.prefetcht0(mem(base, c));
        }
    }
    /// Blocks past n stay zero (their stores are masked off).
    fn load_tail(a: &mut X86Asm, hb: usize, acc: impl Fn(usize) -> Zmm, base: Gp, done: Label) {
        for j in 0..hb {
            Self::zero(a, acc(j));
        }
        for j in 0..hb {
            Self::tail_mask(a, j, done);
            a.vmovups_zmm_load_masked(acc(j), TAIL, mem(base, Self::BYTES * j as i32));
        }
    }
    /// k1 from the frame's opmask table.
    fn tail_mask(a: &mut X86Asm, j: usize, none: Label) {
        let lanes = Self::LANES as i32;
        let full = a.new_label();
        a.mov(RDX, RCX);
        if j > 0 {
            a.sub_imm(RDX, lanes * j as i32);
        }
        a.cmp_imm(RDX, 0);
        a.jcc(Cond::Le, none);
        a.cmp_imm(RDX, lanes);
        a.jcc(Cond::Le, full);
        a.mov_imm(RDX, lanes);
        a.bind(full);
        a.shl_imm(RDX, 2);
        a.add(RDX, RSP);
        a.load16(RAX, mem(RDX, KMASKS));
        a.kmovw_from_gp(TAIL, RAX);
    }
    fn masked_load(a: &mut X86Asm, dst: Zmm, m: Mem) {
        a.vmovups_zmm_load_masked(dst, TAIL, m);
    }
    fn masked_store(a: &mut X86Asm, f: Format, m: Mem, src: Zmm) {
        assert_eq!(f, Format::F32, "{ZMM_F32_ONLY}");
        a.vmovups_zmm_store_masked(m, TAIL, src);
    }
    fn relu_setup(a: &mut X86Asm) {
        Self::zero(a, ZERO);
    }
    fn relu(a: &mut X86Asm, v: Zmm) {
        a.vmaxps_zmm(v, v, ZERO);
    }
}
