//! The emitted activation quantizer and packer (`i8dyn`, [`QuantizeArgs`]).
//!
//! Per row: absmax (`fabs`, `fmaxnm`: NaN-ignoring like `f32::max`), then
//! `scale = absmax / 127` and `inv = 127 / absmax` (f32 divisions; 0 for an
//! all-zero or non-finite row), `q = fcvtns(x · inv)` (round to nearest,
//! ties to even, exactly `quantize_row_i8dyn`), narrowed with saturation,
//! and stored lp bytes at a time straight into the `[e/ep, l/lp, ep, lp]`
//! packed layout. Σq per weight group is summed from the int32 lanes
//! before narrowing (for the zero-point correction). The last partial
//! lp-chunk of a row goes through a zeroed stack buffer, so padding
//! positions are written as zero codes and nothing past x is read.
//!
//! Rows `m..` of the last ep-block (padding rows) are not written: the
//! caller provides the output zero-initialised, as [`crate::host`] does.
//!
//! [`QuantizeArgs`]: crate::abi::QuantizeArgs

use super::asm::{A64, Cond, V, X};
use super::frame;
use crate::abi::{Q_GROUP, Q_K, Q_M, Q_OUT, Q_OUT_SCALES, Q_OUT_SUMS, Q_X, Q_X_STRIDE};

const ARGS: X = X(0);
const XROW: X = X(1);
const XSTRIDE: X = X(2);
const OUT: X = X(3);
const SCALES: X = X(4);
const SUMS: X = X(5);
const M: X = X(6);
const K: X = X(7);
const CPG: X = X(8);
const GROUPS: X = X(9);
const ABLOCK: X = X(10);
const R: X = X(11);
const SRC: X = X(12);
const CNT: X = X(13);
const DST: X = X(14);
const G: X = X(15);
const SP_SUMS: X = X(16);
const T0: X = X(17);
const T1: X = X(19);
const TMPBUF: X = X(20);

const VMAX: V = V(0);
const VT: V = V(1);
const VINV: V = V(2);
const VSCALE: V = V(3);
const VSUM: V = V(4);
const VZERO: V = V(5);
const VINF: V = V(6);
/// Chunk registers (up to 4 for lp = 16).
const VC: [V; 4] = [V(16), V(17), V(18), V(19)];

const FRAME: u32 = 64;

/// Emit the quantizer for activation tiles `ep × lp`.
pub fn emit(a: &mut A64, ep: u32, lp: u32) {
    a.header(&format!(
        "i8dyn activation quantizer+packer: [e/ep, l/lp, ep, lp] with ep={ep} lp={lp}"
    ));
    frame::prologue(a, FRAME);
    a.ldr_x(XROW, ARGS, Q_X as u32);
    a.ldr_x(XSTRIDE, ARGS, Q_X_STRIDE as u32);
    a.ldr_x(OUT, ARGS, Q_OUT as u32);
    a.ldr_x(SCALES, ARGS, Q_OUT_SCALES as u32);
    a.ldr_x(SUMS, ARGS, Q_OUT_SUMS as u32);
    a.ldr_x(M, ARGS, Q_M as u32);
    a.ldr_x(K, ARGS, Q_K as u32);
    // cpg = ceil(group / lp) chunks per group; groups = ceil(k / group).
    a.ldr_x(T0, ARGS, Q_GROUP as u32);
    a.add_imm(CPG, T0, lp - 1);
    a.lsr_imm(CPG, CPG, lp.trailing_zeros());
    a.add(GROUPS, K, T0);
    a.sub_imm(GROUPS, GROUPS, 1);
    a.udiv(GROUPS, GROUPS, T0);
    // A block of ep rows: ceil(k / lp) · ep · lp bytes.
    a.add_imm(ABLOCK, K, lp - 1);
    a.lsr_imm(ABLOCK, ABLOCK, lp.trailing_zeros());
    a.mov_imm(T0, u64::from(ep * lp));
    a.mul(ABLOCK, ABLOCK, T0);
    a.mov_imm(T0, 0x7f80_0000);
    a.fmov_s_w(VINF, T0);
    a.zero(VZERO);
    a.add_from_sp(TMPBUF, 0);
    a.mov_imm(R, 0);

    let row_loop = a.new_label();
    let done = a.new_label();
    a.cbz(M, done);
    a.bind(row_loop);
    a.comment("absmax of the row");
    a.zero(VMAX);
    a.mov(SRC, XROW);
    a.mov(CNT, K);
    let vec_loop = a.new_label();
    let vec_done = a.new_label();
    a.cmp_imm(CNT, 4);
    a.b_cond(Cond::Lo, vec_done);
    a.bind(vec_loop);
    a.ldr_q_post(VT, SRC, 16);
    a.fabs_4s(VT, VT);
    a.fmaxnm_4s(VMAX, VMAX, VT);
    a.sub_imm(CNT, CNT, 4);
    a.cmp_imm(CNT, 4);
    a.b_cond(Cond::Hs, vec_loop);
    a.bind(vec_done);
    a.fmaxnmv_4s(VMAX, VMAX);
    let scalar_done = a.new_label();
    let scalar_loop = a.new_label();
    a.cbz(CNT, scalar_done);
    a.bind(scalar_loop);
    a.ldr_s_post(VT, SRC, 4);
    a.fabs_s(VT, VT);
    a.fmaxnm_s(VMAX, VMAX, VT);
    a.subs_imm(CNT, CNT, 1);
    a.b_cond(Cond::Ne, scalar_loop);
    a.bind(scalar_done);

    a.comment("scale = absmax/127, inv = 127/absmax (0 for a zero or non-finite row)");
    a.zero(VINV);
    a.zero(VSCALE);
    let store_scale = a.new_label();
    a.fcmp_s(VMAX, VZERO);
    a.b_cond(Cond::Eq, store_scale);
    a.fcmp_s(VMAX, VINF);
    a.b_cond(Cond::Eq, store_scale);
    a.mov_imm(T0, u64::from(127f32.to_bits()));
    a.fmov_s_w(VT, T0);
    a.fdiv_s(VINV, VT, VMAX);
    a.fdiv_s(VSCALE, VMAX, VT);
    a.bind(store_scale);
    a.add_lsl(T0, SCALES, R, 2);
    a.str_s(VSCALE, T0, 0);

    a.comment("codes into [e/ep, l/lp, ep, lp]");
    // DST = out + (R / ep)·ABLOCK + (R % ep)·lp
    a.mov_imm(T0, u64::from(ep));
    a.udiv(T1, R, T0);
    a.madd(DST, T1, ABLOCK, OUT);
    a.mul(T1, T1, T0);
    a.sub(T1, R, T1);
    a.mov_imm(T0, u64::from(lp));
    a.madd(DST, T1, T0, DST);
    // Sums of this row: SUMS + R·groups·4.
    a.mul(T0, R, GROUPS);
    a.add_lsl(SP_SUMS, SUMS, T0, 2);
    a.mov(SRC, XROW);
    a.lsr_imm(CNT, K, lp.trailing_zeros());
    a.mov(G, CPG);
    a.zero(VSUM);
    let chunk_loop = a.new_label();
    let chunks_done = a.new_label();
    a.cbz(CNT, chunks_done);
    a.bind(chunk_loop);
    chunk(a, ep, lp, SRC);
    a.subs_imm(G, G, 1);
    let no_flush = a.new_label();
    a.b_cond(Cond::Ne, no_flush);
    flush_sums(a);
    a.mov(G, CPG);
    a.bind(no_flush);
    a.subs_imm(CNT, CNT, 1);
    a.b_cond(Cond::Ne, chunk_loop);
    a.bind(chunks_done);

    a.comment("the last partial lp-chunk, through a zeroed buffer");
    let no_tail = a.new_label();
    let row_end = a.new_label();
    // k % lp via k - (k >> log2 lp) << log2 lp
    a.lsr_imm(T0, K, lp.trailing_zeros());
    a.lsl_imm(T0, T0, lp.trailing_zeros());
    a.sub(CNT, K, T0);
    a.cbz(CNT, no_tail);
    a.stp_q(VZERO, VZERO, TMPBUF, 0);
    a.stp_q(VZERO, VZERO, TMPBUF, 32);
    a.mov(T0, TMPBUF);
    let copy = a.new_label();
    a.bind(copy);
    a.ldr_s_post(VT, SRC, 4);
    a.str_s_post(VT, T0, 4);
    a.subs_imm(CNT, CNT, 1);
    a.b_cond(Cond::Ne, copy);
    a.mov(SRC, TMPBUF);
    chunk(a, ep, lp, SRC);
    flush_sums(a);
    a.b(row_end);
    a.bind(no_tail);
    // A group cut short by the end of the row still needs its sum.
    a.cmp(G, CPG);
    a.b_cond(Cond::Eq, row_end);
    flush_sums(a);
    a.bind(row_end);

    a.add(XROW, XROW, XSTRIDE);
    a.add_imm(R, R, 1);
    a.cmp(R, M);
    a.b_cond(Cond::Lo, row_loop);
    a.bind(done);
    frame::epilogue(a, FRAME);
}

/// Quantize lp floats at `src` (advanced), add their codes to VSUM and
/// store them at DST (advanced by ep·lp).
fn chunk(a: &mut A64, ep: u32, lp: u32, src: X) {
    let n = (lp / 4) as usize;
    let mut i = 0;
    while i + 1 < n {
        a.ldp_q_post(VC[i], VC[i + 1], src, 32);
        i += 2;
    }
    if i < n {
        a.ldr_q_post(VC[i], src, 16);
    }
    for &c in &VC[..n] {
        a.fmul_4s_elem(c, c, VINV, 0);
        a.fcvtns_4s(c, c);
        a.add_4s(VSUM, VSUM, c);
    }
    // Narrow: int32 → int16 → int8 (saturating; |q| ≤ 127 already).
    a.sqxtn_4h(VC[0], VC[0]);
    if n > 1 {
        a.sqxtn2_8h(VC[0], VC[1]);
    }
    if n > 2 {
        a.sqxtn_4h(VC[2], VC[2]);
        a.sqxtn2_8h(VC[2], VC[3]);
    }
    a.sqxtn_8b(VC[0], VC[0]);
    if n > 2 {
        a.sqxtn2_16b(VC[0], VC[2]);
    }
    match lp {
        4 => a.str_s(VC[0], DST, 0),
        8 => a.str_d(VC[0], DST, 0),
        _ => a.str_q(VC[0], DST, 0),
    }
    a.add_imm(DST, DST, ep * lp);
}

/// Store Σq of the finished group (when sums are wanted) and reset it.
fn flush_sums(a: &mut A64) {
    let skip = a.new_label();
    a.addv_4s(VSUM, VSUM);
    a.cbz(SUMS, skip);
    a.str_s_post(VSUM, SP_SUMS, 4);
    a.bind(skip);
    a.zero(VSUM);
}
