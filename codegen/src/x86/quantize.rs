//! The emitted `i8dyn` activation quantizer (`extern "C" fn(*const
//! QuantizeArgs)`), the exact semantics of
//! `tessera_dsl::quant::quantize_row_i8dyn`: per row, absmax over k, scale =
//! absmax/127, q = round_ties_even(x · (127/absmax)) computed in f32
//! (`vdivps`, `vmulps`, `vcvtps2dq` under the default round-to-nearest-even
//! MXCSR), rows whose absmax is 0 or not finite get scale 0 and codes 0.
//! Non-finite elements follow the reference too: the absmax ignores NaN
//! (`vmaxps` with the running maximum as its second source, which it
//! returns when either is NaN, like `f32::max`), and a NaN product (a NaN
//! element, or an infinite one times the 0 inverse of its row) becomes code
//! 0 (`vcmpps` ordered mask) where `vcvtps2dq` would give -128.
//!
//! Output: the kernel's x layout `[e/ep, l/4, ep, 4]` (row r's codes for
//! k = 4t..4t+4 at byte ((r/ep)·LB + t)·ep·4 + (r%ep)·4, LB = ceil(k/4));
//! the caller zero-fills the buffer, so padded rows and the k padding of the
//! last step stay zero. Eight elements become two dwords (`vpackssdw`,
//! `vpacksswb` within lanes). With asymmetric weights, Σq per row and
//! weight group (`group` a multiple of 8, or k) goes to `out_sums`; for an
//! implied zero point 2^s (`u4sym`'s 8, 8-bit codes read as unsigned, 128)
//! it goes as −2^s·Σq, the value the kernel's group sums start from: one
//! i32, or for int16 group sums two int16 halves, over the codes at
//! k ≡ 0, 1 and k ≡ 2, 3 (mod 4) ([`Int8Spec::sums_in_int16_halves`]).
//!
//! Registers: ymm0 absmax / broadcast, ymm1 data, ymm2 scale, ymm3
//! 127/absmax, ymm4-5 temporaries, ymm6 the group's Σq, ymm7 abs mask,
//! ymm15 the k-tail mask. rbx = row, r8 = x row, r9 = output position,
//! r10 = x position, rcx = k left, r11 = elements in the current group,
//! rsi = Σq pointer, r12 = row block base, r13 = row in block, r14 = bytes
//! per row block.

use super::asm::*;
use super::common::{self, ABS_MASK, C127, INF};
use super::int8::Int8Spec;
use crate::abi::*;
use crate::artifact::{EmitError, MachineCode};

/// Emit the quantizer for an int8 kernel's activations.
pub fn emit(spec: &Int8Spec) -> Result<MachineCode, EmitError> {
    let ep = spec.ep as i32;
    let sums = spec.group.is_some() && spec.zero.needs_sums();
    let implied = spec.zero.implied_shift();
    let halves = sums && spec.sums_in_int16_halves();
    let mut a = X86Asm::new();
    a.comment(&format!(
        "quantize i8dyn rows into [e/{ep}, l/4, {ep}, 4]{}",
        if sums { " with group sums" } else { "" }
    ));
    common::prologue(&mut a);
    a.store32_imm(mem(RSP, ABS_MASK), 0x7FFF_FFFF);
    a.store32_imm(mem(RSP, C127), 127.0f32.to_bits() as i32);
    a.store32_imm(mem(RSP, INF), f32::INFINITY.to_bits() as i32);
    a.vpbroadcastd_load(Ymm(7), mem(RSP, ABS_MASK));
    // r14 = LB·ep·4 bytes per row block.
    a.load64(R14, mem(RDI, Q_K));
    a.add_imm(R14, 3);
    a.shr_imm(R14, 2);
    a.imul_imm(R14, R14, ep * 4);
    a.mov_imm(R12, 0);
    a.mov_imm(R13, 0);
    a.mov_imm(RBX, 0);
    if sums {
        a.load64(RSI, mem(RDI, Q_OUT_SUMS));
    }
    let (row_loop, done) = (a.new_label(), a.new_label());
    a.bind(row_loop);
    a.cmp_mem(RBX, mem(RDI, Q_M));
    a.jcc(Cond::Ge, done);
    // r8 = x + row·x_stride; r9 = out + block base + row in block·4.
    common::row_address(&mut a, R8, RBX, RAX, mem(RDI, Q_X_STRIDE), mem(RDI, Q_X));
    a.mov(R9, R13);
    a.shl_imm(R9, 2);
    a.add(R9, R12);
    a.load64(RAX, mem(RDI, Q_OUT));
    a.add(R9, RAX);

    // absmax
    let (y0, y1, y2, y3, y4, y5, sum) = (Ymm(0), Ymm(1), Ymm(2), Ymm(3), Ymm(4), Ymm(5), Ymm(6));
    a.vxorps(y0, y0, y0);
    a.mov(R10, R8);
    a.load64(RCX, mem(RDI, Q_K));
    let (am, am_tail, am_done) = (a.new_label(), a.new_label(), a.new_label());
    a.bind(am);
    a.cmp_imm(RCX, 8);
    a.jcc(Cond::L, am_tail);
    a.vmovups_load(y1, mem(R10, 0));
    a.vandps(y1, y1, Ymm(7));
    a.vmaxps(y0, y1, y0);
    a.add_imm(R10, 32);
    a.sub_imm(RCX, 8);
    a.jmp(am);
    a.bind(am_tail);
    a.cmp_imm(RCX, 0);
    a.jcc(Cond::E, am_done);
    common::column_mask(&mut a, 0, RCX);
    a.vmaskmovps_load(y1, common::MASK, mem(R10, 0));
    a.vandps(y1, y1, Ymm(7));
    a.vmaxps(y0, y1, y0);
    a.bind(am_done);
    a.vextractf128_hi(y1, y0);
    a.vmaxps(y0, y0, y1);
    a.vpermilps_imm(y1, y0, 0x0E);
    a.vmaxps(y0, y0, y1);
    a.vpermilps_imm(y1, y0, 0x01);
    a.vmaxps(y0, y0, y1);
    a.vbroadcastss_reg(y0, y0);
    // scale = absmax/127, inv = 127/absmax, both 0 unless 0 < absmax < inf.
    a.vpbroadcastd_load(y4, mem(RSP, C127));
    a.vdivps(y2, y0, y4);
    a.vdivps(y3, y4, y0);
    a.vxorps(y4, y4, y4);
    a.vcmpps(y5, y4, y0, 1);
    a.vpbroadcastd_load(y4, mem(RSP, INF));
    a.vcmpps(y4, y0, y4, 1);
    a.vandps(y5, y5, y4);
    a.vandps(y2, y2, y5);
    a.vandps(y3, y3, y5);
    a.mov(RAX, RBX);
    a.shl_imm(RAX, 2);
    a.load64(RDX, mem(RDI, Q_OUT_SCALES));
    a.add(RAX, RDX);
    a.vmovss_store(mem(RAX, 0), y2);

    // quantize, 8 elements (two steps of 4) at a time
    let flush = |a: &mut X86Asm| {
        // Lane l of `sum` holds the codes at k ≡ l (mod 8): fold to k mod 4.
        a.vextracti128_hi(y5, sum);
        a.vpaddd(sum, sum, y5);
        if !halves {
            a.vpshufd(y5, sum, 0x4E);
            a.vpaddd(sum, sum, y5);
        }
        // Lanes 0 and 2: k ≡ 0, 1 and k ≡ 2, 3 (whole: lane 0 all of it).
        a.vpshufd(y5, sum, 0xB1u8 as i8);
        a.vpaddd(sum, sum, y5);
        if let Some(bits) = implied {
            // −2^bits·Σq, what the kernel's group sums start from.
            a.vpslld_imm(sum, sum, bits as i8);
            a.vxorps(y5, y5, y5);
            a.vpsubd(sum, y5, sum);
        }
        if halves {
            // Lanes 0 and 2 as the dword's two int16 halves (|half| ≤
            // 8·16·127: no saturation).
            a.vpshufd(sum, sum, 0x08);
            a.vpackssdw(sum, sum, sum);
        }
        a.vmovd_store(mem(RSI, 0), sum);
        a.add_imm(RSI, 4);
        a.vxorps(sum, sum, sum);
        a.mov_imm(R11, 0);
    };
    let convert = |a: &mut X86Asm| {
        a.vmulps(y1, y1, y3);
        // NaN products become 0.0 (ordered-compare mask), hence code 0.
        a.vcmpps(y4, y1, y1, 7);
        a.vandps(y1, y1, y4);
        a.vcvtps2dq(y1, y1);
        if sums {
            a.vpaddd(sum, sum, y1);
        }
        a.vpackssdw(y1, y1, y1);
        a.vpacksswb(y1, y1, y1);
        a.vmovd_store(mem(R9, 0), y1);
        a.vextracti128_hi(y5, y1);
    };
    a.vxorps(sum, sum, sum);
    a.mov_imm(R11, 0);
    a.mov(R10, R8);
    a.load64(RCX, mem(RDI, Q_K));
    let (q, q_tail, q_done) = (a.new_label(), a.new_label(), a.new_label());
    a.bind(q);
    a.cmp_imm(RCX, 8);
    a.jcc(Cond::L, q_tail);
    a.vmovups_load(y1, mem(R10, 0));
    convert(&mut a);
    a.vmovd_store(mem(R9, ep * 4), y5);
    a.add_imm(R10, 32);
    a.add_imm(R9, 2 * ep * 4);
    a.sub_imm(RCX, 8);
    if sums {
        let no_flush = a.new_label();
        a.add_imm(R11, 8);
        a.cmp_mem(R11, mem(RDI, Q_GROUP));
        a.jcc(Cond::L, no_flush);
        flush(&mut a);
        a.bind(no_flush);
    }
    a.jmp(q);
    a.bind(q_tail);
    a.cmp_imm(RCX, 0);
    a.jcc(Cond::E, q_done);
    common::column_mask(&mut a, 0, RCX);
    a.vmaskmovps_load(y1, common::MASK, mem(R10, 0));
    convert(&mut a);
    let one_step = a.new_label();
    a.cmp_imm(RCX, 4);
    a.jcc(Cond::Le, one_step);
    a.vmovd_store(mem(R9, ep * 4), y5);
    a.bind(one_step);
    if sums {
        a.add(R11, RCX);
    }
    a.bind(q_done);
    if sums {
        let no_flush = a.new_label();
        a.cmp_imm(R11, 0);
        a.jcc(Cond::E, no_flush);
        flush(&mut a);
        a.bind(no_flush);
    }

    // next row
    let same_block = a.new_label();
    a.add_imm(RBX, 1);
    a.add_imm(R13, 1);
    a.cmp_imm(R13, ep);
    a.jcc(Cond::L, same_block);
    a.mov_imm(R13, 0);
    a.add(R12, R14);
    a.bind(same_block);
    a.jmp(row_loop);
    a.bind(done);
    common::epilogue(&mut a);
    let (bytes, listing) = a.finish().map_err(EmitError::Assembler)?;
    Ok(super::machine_code(bytes, listing))
}
