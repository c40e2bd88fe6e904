//! The decode's softmax between scores and P·V: per tile the reference
//! (rescaling what it has summed where that moved) and `p = e^(score −
//! reference)` with its den, and the `exp` they and the prefill share.

use super::*;

/// Per head lane of the tile at rbx, the reference the exponentials are
/// taken against: `phi` while every score so far was in range, else the
/// running max (the online softmax's, exactly where it did not move).
/// What the tile has summed against the old reference is rescaled by
/// `α = e^(old − new)`, skipped where no lane moved.
pub(super) fn rebase(a: &mut X86Asm, softmax: SoftmaxMode) {
    let (new, old) = (Ymm(0), Ymm(6));
    a.vmovups_load(new, mem(RBX, R_MAX));
    if let SoftmaxMode::Async { .. } = softmax {
        a.vmovups_load(Ymm(7), mem(RBX, R_OK));
        a.vmovups_load(Ymm(1), mem(RSP, V_PHI));
        a.vandps(Ymm(1), Ymm(7), Ymm(1));
        a.vandnps(new, Ymm(7), new);
        a.vorps(new, new, Ymm(1));
    }
    a.vmovups_load(old, mem(RBX, R_MVEC));
    a.vmovups_store(mem(RBX, R_MVEC), new);
    let same = a.new_label();
    a.vcmpps(Ymm(7), old, new, 0);
    a.vmovmskps(RAX, Ymm(7));
    a.cmp_imm(RAX, 0xff);
    a.jcc(Cond::E, same);
    // α = e^(old − new) (old −inf before the first keys: α is e^-87.3,
    // against num and den of 0).
    a.vsubps(Ymm(0), old, new);
    a.vmovups_load(Ymm(4), mem(RSP, V_127));
    exp_ps(a, Ymm(0), Ymm(1), Ymm(5), Ymm(2), Ymm(4));
    a.vmovups_store(mem(RSP, V_ALPHA), Ymm(2));
    a.vmulps_mem(Ymm(3), Ymm(2), mem(RBX, R_DEN));
    a.vmovups_store(mem(RBX, R_DEN), Ymm(3));
    scale_num(a);
    a.bind(same);
}

/// `num[c][i] ·= α_i` for each head i of the tile at rbx, α at `V_ALPHA`.
/// Clobbers rax, rcx, rdx, r11, r12, ymm0 and ymm1.
pub(super) fn scale_num(a: &mut X86Asm) {
    num_chunk_stride(a, R11);
    a.zero(R12);
    let (head, heads_done) = (a.new_label(), a.new_label());
    a.bind(head);
    a.cmp_mem(R12, mem(RBX, R_GT));
    a.jcc(Cond::Ge, heads_done);
    a.lea(RAX, mem(RSP, V_ALPHA));
    a.mov(RCX, R12);
    a.shl_imm(RCX, 2);
    a.add(RAX, RCX);
    a.vpbroadcastd_load(Ymm(1), mem(RAX, 0));
    a.mov(RDX, R12);
    a.shl_imm(RDX, 5);
    a.load64(RCX, mem(RBX, R_NUM));
    a.add(RDX, RCX);
    a.load64(RCX, mem(RSP, S_D8));
    let chunk = a.new_label();
    a.bind(chunk);
    a.vmulps_mem(Ymm(0), Ymm(1), mem(RDX, 0));
    a.vmovups_store(mem(RDX, 0), Ymm(0));
    a.add(RDX, R11);
    a.sub_imm(RCX, 1);
    a.jcc(Cond::Ne, chunk);
    a.add_imm(R12, 1);
    a.jmp(head);
    a.bind(heads_done);
}

/// Heads of the tile at rbx that fell back to the online softmax (a score
/// out of range) count in `*recomputed`.
pub(super) fn count_recomputed(a: &mut X86Asm, softmax: SoftmaxMode) {
    if softmax == SoftmaxMode::Online {
        return;
    }
    // recomputed += popcount(~ok & ((1 << gt) − 1)).
    a.vmovups_load(Ymm(0), mem(RBX, R_OK));
    a.vmovmskps(RAX, Ymm(0));
    a.not(RAX);
    a.mov_imm(RDX, 1);
    a.load64(RCX, mem(RBX, R_GT));
    let (shift, shifted) = (a.new_label(), a.new_label());
    a.bind(shift);
    a.cmp_imm(RCX, 0);
    a.jcc(Cond::E, shifted);
    a.shl_imm(RDX, 1);
    a.sub_imm(RCX, 1);
    a.jmp(shift);
    a.bind(shifted);
    a.sub_imm(RDX, 1);
    a.and(RAX, RDX);
    a.popcnt(RAX, RAX);
    a.load64(RCX, mem(RDI, AT_RECOMPUTED));
    a.load64(RDX, mem(RCX, 0));
    a.add(RDX, RAX);
    a.store64(mem(RCX, 0), RDX);
}

/// `p = e^(score − reference)` in place for the super-block's keys of the
/// tile at rbx, summed into its `den`; for fp8 values p is stored × 2^8
/// (their f16 form in P·V is 2^-8 of the value; both exact). A one-head
/// tile takes 8 keys a vector (its scores side by side), the last vector
/// masked to the keys there are. With `f16_p` ([`pv_pass_f16`]) a tile
/// of several heads stores instead `e^(score − max)` as f16 (× 2^8 for fp8
/// values), the 8 heads in the first 16 bytes of each key's 32 (at most
/// 1, or 2^8, whatever the reference; den still sums p), and per head in
/// `R_PV_SCALE` what P·V's f16 sums are multiplied by into `num`:
/// `e^(max − reference)` (× 2^8 for f16 values, which P·V scales by
/// 2^-8).
pub(super) fn exponentials(a: &mut X86Asm, values: Values, f16_p: bool, zmm: bool) {
    let (x, n, p, den) = (Ymm(0), Ymm(1), Ymm(2), Ymm(3));
    let (reference, k127) = (Ymm(6), Ymm(4));
    // f16 p: p · g, g = e^(reference − max) (× 2^8 for fp8 values).
    let g = Ymm(7);
    let scale = |a: &mut X86Asm| {
        if values == Values::E4M3 {
            a.vmulps_mem(p, p, mem(RSP, V_P_SCALE));
        }
    };
    let store_p = |a: &mut X86Asm| {
        scale(a);
        a.vmovups_store(mem(R15, 0), p);
    };
    let store_heads_p = |a: &mut X86Asm| {
        if f16_p {
            a.vmulps(p, p, g);
            a.vcvtps2ph_store(mem(R15, 0), p, 0);
        } else {
            store_p(a);
        }
    };
    a.vmovups_load(k127, mem(RSP, V_127));
    a.load64(R15, mem(RBX, R_SAREA));
    a.load64(RCX, mem(RSP, S_J1));
    a.load64(RAX, mem(RSP, S_J0));
    a.sub(RCX, RAX);
    let (one_head, done) = (a.new_label(), a.new_label());
    a.load64(RAX, mem(RBX, R_GT));
    a.cmp_imm(RAX, 1);
    a.jcc(Cond::E, one_head);
    // Heads in lanes: one vector per key.
    a.vmovups_load(reference, mem(RBX, R_MVEC));
    if f16_p {
        // e = e^(reference − max): max ≥ every score so far; a lane past
        // the tile's heads may hold −inf or NaN, which exp_ps clamps
        // (finite, never read). fp8 values (2^-8 of the value): g = 2^8·e,
        // scale 1/e; f16 values (× 2^-8 in P·V): g = e, scale 2^8/e.
        a.vsubps_mem(x, reference, mem(RBX, R_MAX));
        exp_ps(a, x, n, Ymm(5), p, k127);
        if values == Values::E4M3 {
            a.vmovups_load(x, mem(RSP, V_ONE));
            a.vmulps_mem(g, p, mem(RSP, V_P_SCALE));
        } else {
            a.vmovups_load(x, mem(RSP, V_P_SCALE));
            a.vandps(g, p, p);
        }
        a.vdivps(x, x, p);
        a.vmovups_store(mem(RBX, R_PV_SCALE), x);
    }
    a.vmovups_load(den, mem(RBX, R_DEN));
    let den_done = a.new_label();
    if zmm {
        // Two keys a zmm (AVX-512): the reference and g in both halves,
        // the pairs' den summed apart and folded in after them; a last
        // odd key goes by the ymm loop.
        let [zx, zn, zf, zp, zden, zref, zk127, zg] = [8, 9, 10, 11, 12, 13, 14, 15].map(Zmm);
        a.vshufi32x4_zmm(zref, Zmm(reference.0), Zmm(reference.0), 0x44);
        if f16_p {
            a.vshufi32x4_zmm(zg, Zmm(g.0), Zmm(g.0), 0x44);
        }
        a.vpbroadcastd_zmm_load(zk127, mem(RSP, V_127));
        a.vpxord_zmm(zden, zden, zden);
        let (pairs, single) = (a.new_label(), a.new_label());
        a.bind(pairs);
        a.cmp_imm(RCX, 2);
        a.jcc(Cond::L, single);
        a.vmovups_zmm_load(zx, mem(R15, 0));
        a.vsubps_zmm(zx, zx, zref);
        exp_ps(a, zx, zn, zf, zp, zk127);
        a.vaddps_zmm(zden, zden, zp);
        if f16_p {
            a.vmulps_zmm(zp, zp, zg);
            a.vextracti64x4_hi(Ymm(5), zp);
            a.vcvtps2ph_store(mem(R15, 0), Ymm(zp.0), 0);
            a.vcvtps2ph_store(mem(R15, 32), Ymm(5), 0);
        } else {
            if values == Values::E4M3 {
                a.vmulps_zmm_bcst(zp, zp, mem(RSP, V_P_SCALE));
            }
            a.vmovups_zmm_store(mem(R15, 0), zp);
        }
        a.add_imm(R15, 64);
        a.sub_imm(RCX, 2);
        a.jmp(pairs);
        a.bind(single);
        a.vextracti64x4_hi(Ymm(5), zden);
        a.vaddps(den, den, Ymm(zden.0));
        a.vaddps(den, den, Ymm(5));
        a.cmp_imm(RCX, 0);
        a.jcc(Cond::E, den_done);
    }
    let top = a.new_label();
    a.bind(top);
    a.vmovups_load(x, mem(R15, 0));
    a.vsubps(x, x, reference);
    exp_ps(a, x, n, Ymm(5), p, k127);
    a.vaddps(den, den, p);
    store_heads_p(a);
    a.add_imm(R15, 32);
    a.sub_imm(RCX, 1);
    a.jcc(Cond::Ne, top);
    a.bind(den_done);
    a.vmovups_store(mem(RBX, R_DEN), den);
    a.jmp(done);
    // One head: keys in lanes, 8 a vector, den summed across them.
    a.bind(one_head);
    a.vxorps(den, den, den);
    a.vpbroadcastd_load(reference, mem(RBX, R_MVEC));
    let (eight, tail) = (a.new_label(), a.new_label());
    a.bind(eight);
    a.cmp_imm(RCX, 8);
    a.jcc(Cond::L, tail);
    a.vmovups_load(x, mem(R15, 0));
    a.vsubps(x, x, reference);
    exp_ps(a, x, n, Ymm(5), p, k127);
    a.vaddps(den, den, p);
    store_p(a);
    a.add_imm(R15, 32);
    a.sub_imm(RCX, 8);
    a.jmp(eight);
    a.bind(tail);
    let summed = a.new_label();
    a.cmp_imm(RCX, 0);
    a.jcc(Cond::E, summed);
    // The last rcx < 8 keys: lanes past them are masked out of den (the
    // mask table's first rcx lanes of −1).
    a.vmovups_load(x, mem(R15, 0));
    a.vsubps(x, x, reference);
    exp_ps(a, x, n, Ymm(5), p, k127);
    a.shl_imm(RCX, 2);
    a.lea(RAX, mem(RSP, common::MASK_TABLE + 32));
    a.sub(RAX, RCX);
    a.vmovups_load(x, mem(RAX, 0));
    a.vandps(p, p, x);
    a.vaddps(den, den, p);
    store_p(a);
    a.bind(summed);
    hsum(a, den, x);
    a.vbroadcastss_reg(den, den);
    a.vaddps_mem(den, den, mem(RBX, R_DEN));
    a.vmovups_store(mem(RBX, R_DEN), den);
    a.bind(done);
}

/// The registers [`exp_ps`] takes besides x, as the decode kernel uses
/// them: n, f, p (the result) and the splat of 127 (`V_127`, loaded by
/// the caller).
pub(in crate::x86) const EXP_REGS: [Ymm; 4] = [Ymm(1), Ymm(5), Ymm(2), Ymm(4)];

/// `p = e^x` for the lanes of a register (x clamped to [−87.3, 88.7],
/// clobbered; n, f clobbered; `k127` holds 127 in every lane): 2^n by the
/// exponent field times a degree-6 Taylor polynomial of the Cody–Waite
/// remainder, as the cranelift `exp`. A NaN x becomes the lower clamp
/// (`vmaxps` returns its second source on NaN). One sequence for both
/// register files, so a zmm lane equals the ymm form's bit for bit.
pub(in crate::x86) fn exp_ps<R: ExpRegister>(a: &mut X86Asm, x: R, n: R, f: R, p: R, k127: R) {
    // The clamps take x as the second source, the one `vmaxps`/`vminps`
    // return where either is NaN: a NaN score stays NaN (as the
    // interpreter's e^NaN), where a memory splat second would turn it into
    // e^-87.3 and a head whose q holds a NaN would give the mean of V.
    R::load_splat(a, n, mem(RSP, V_MIN));
    R::max(a, x, n, x);
    R::load_splat(a, n, mem(RSP, V_MAX));
    R::min(a, x, n, x);
    R::mul_splat(a, n, x, mem(RSP, V_LOG2E));
    R::to_i32(a, n);
    R::to_f32(a, f, n);
    R::fma231_splat(a, x, f, mem(RSP, V_NLN2HI));
    R::fma231_splat(a, x, f, mem(RSP, V_NLN2LO));
    R::load_splat(a, p, mem(RSP, V_POLY));
    for k in 1..POLY.len() as i32 {
        R::fma213_splat(a, p, x, mem(RSP, V_POLY + 32 * k));
    }
    R::add_i32(a, n, k127);
    R::shift_to_exponent(a, n);
    R::mul(a, p, n);
}

/// The instructions of [`exp_ps`] on one register file: ymm through VEX
/// (the frame's 32-byte splats as memory operands), zmm through EVEX (the
/// same splats read as `{1to16}` broadcasts).
pub(in crate::x86) trait ExpRegister: Copy {
    /// `dst = max(a, b)`, b where either is NaN.
    fn max(a: &mut X86Asm, dst: Self, x: Self, y: Self);
    /// `dst = min(a, b)`, b where either is NaN.
    fn min(a: &mut X86Asm, dst: Self, x: Self, y: Self);
    fn mul_splat(a: &mut X86Asm, dst: Self, x: Self, m: Mem);
    /// f32 to i32 in place, rounded to nearest.
    fn to_i32(a: &mut X86Asm, v: Self);
    fn to_f32(a: &mut X86Asm, dst: Self, v: Self);
    /// `acc += x · splat`
    fn fma231_splat(a: &mut X86Asm, acc: Self, x: Self, m: Mem);
    fn load_splat(a: &mut X86Asm, dst: Self, m: Mem);
    /// `p = p · x + splat`
    fn fma213_splat(a: &mut X86Asm, p: Self, x: Self, m: Mem);
    fn add_i32(a: &mut X86Asm, v: Self, w: Self);
    /// `v <<= 23` per i32: an exponent field.
    fn shift_to_exponent(a: &mut X86Asm, v: Self);
    /// `p *= v`
    fn mul(a: &mut X86Asm, p: Self, v: Self);
}

impl ExpRegister for Ymm {
    fn max(a: &mut X86Asm, dst: Ymm, x: Ymm, y: Ymm) {
        a.vmaxps(dst, x, y);
    }
    fn min(a: &mut X86Asm, dst: Ymm, x: Ymm, y: Ymm) {
        a.vminps(dst, x, y);
    }
    fn mul_splat(a: &mut X86Asm, dst: Ymm, x: Ymm, m: Mem) {
        a.vmulps_mem(dst, x, m);
    }
    fn to_i32(a: &mut X86Asm, v: Ymm) {
        a.vcvtps2dq(v, v);
    }
    fn to_f32(a: &mut X86Asm, dst: Ymm, v: Ymm) {
        a.vcvtdq2ps(dst, v);
    }
    fn fma231_splat(a: &mut X86Asm, acc: Ymm, x: Ymm, m: Mem) {
        a.vfmadd231ps_mem(acc, x, m);
    }
    fn load_splat(a: &mut X86Asm, dst: Ymm, m: Mem) {
        a.vmovups_load(dst, m);
    }
    fn fma213_splat(a: &mut X86Asm, p: Ymm, x: Ymm, m: Mem) {
        a.vfmadd213ps_mem(p, x, m);
    }
    fn add_i32(a: &mut X86Asm, v: Ymm, w: Ymm) {
        a.vpaddd(v, v, w);
    }
    fn shift_to_exponent(a: &mut X86Asm, v: Ymm) {
        a.vpslld_imm(v, v, 23);
    }
    fn mul(a: &mut X86Asm, p: Ymm, v: Ymm) {
        a.vmulps(p, p, v);
    }
}

impl ExpRegister for Zmm {
    fn max(a: &mut X86Asm, dst: Zmm, x: Zmm, y: Zmm) {
        a.vmaxps_zmm(dst, x, y);
    }
    fn min(a: &mut X86Asm, dst: Zmm, x: Zmm, y: Zmm) {
        a.vminps_zmm(dst, x, y);
    }
    fn mul_splat(a: &mut X86Asm, dst: Zmm, x: Zmm, m: Mem) {
        a.vmulps_zmm_bcst(dst, x, m);
    }
    fn to_i32(a: &mut X86Asm, v: Zmm) {
        a.vcvtps2dq_zmm(v, v);
    }
    fn to_f32(a: &mut X86Asm, dst: Zmm, v: Zmm) {
        a.vcvtdq2ps_zmm(dst, v);
    }
    fn fma231_splat(a: &mut X86Asm, acc: Zmm, x: Zmm, m: Mem) {
        a.vfmadd231ps_zmm_bcst(acc, x, m);
    }
    fn load_splat(a: &mut X86Asm, dst: Zmm, m: Mem) {
        a.vbroadcastss_zmm_load(dst, m);
    }
    fn fma213_splat(a: &mut X86Asm, p: Zmm, x: Zmm, m: Mem) {
        a.vfmadd213ps_zmm_bcst(p, x, m);
    }
    fn add_i32(a: &mut X86Asm, v: Zmm, w: Zmm) {
        a.vpaddd_zmm(v, v, w);
    }
    fn shift_to_exponent(a: &mut X86Asm, v: Zmm) {
        a.vpslld_zmm_imm(v, v, 23);
    }
    fn mul(a: &mut X86Asm, p: Zmm, v: Zmm) {
        a.vmulps_zmm(p, p, v);
    }
}
