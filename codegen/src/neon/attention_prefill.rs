//! Causal prefill attention on NEON, ABI
//! [`crate::host_attention::AttentionArgs`] with `t` query tokens: the
//! flash-attention loop of the x86 prefill (`x86/attention_prefill.rs`)
//! on 32 four-lane registers, so each K/V row is read once per block of
//! query rows instead of once per query token (MNN-LLM 5.3's fp32 online
//! softmax).
//!
//! Rows are (query token, query head) pairs of one KV head, token-major,
//! so the heads of a GQA group share every K/V block, and a row's causal
//! limit never falls as its index grows. Per block of up to
//! [`PREFILL_ROWS`] rows (`R`, padded to a multiple of 16 with zero q):
//!
//! 1. q rows widened to f32 (× 1/√d unless q is pre-scaled) and
//!    transposed, `qt[d][R]` (rows in lanes); per row its causal limit
//!    (`s − t + token`) and output row; `m = −∞`, `l = 0`, `O = 0`.
//! 2. For each block of [`PREFILL_KEYS`] keys (`C`) up to the block's last
//!    visible key (later keys are fully masked: skipped):
//!    - K rows (f16, or int8 dequantized `scale·c (+ offset)`) and V rows
//!      (f16, or fp8 decoded exactly) widened to f32 `kp[C][d]`,
//!      `vp[C][d]`, once per row block: the conversion costs 2/R of the
//!      multiply-adds, and the inner loops are the same for every format.
//!    - Scores, rows in lanes: 16-row × 4-key register tiles. Four key
//!      vectors (4 lanes of d each) serve 4 d-steps through `fmla` by
//!      element, so K needs no transposition and no broadcast loads: 20
//!      loads per 64 `fmla`. Tiles past the rows' limits are skipped.
//!    - Per 4-row vector: keys past each row's limit → −∞, the block max,
//!      the running max `m'`, `α = e^(m − m')`, `p = e^(S − m')` (masked
//!      keys exactly 0), `l = α·l + Σp`, all lane-wise.
//!    - `O = α·O + P·V` in 8-row × 3-chunk register tiles over the keys the
//!      rows see: two p vectors (4 rows each, by element) and three V
//!      chunks per key, 24 `fmla`.
//! 3. `o = O / l` to f16.
//!
//! Scratch: [`crate::host_attention::prefill_scratch_floats`] (the x86
//! layout with 4-lane chunks of `O`); `d` a multiple of 4; online softmax
//! only (an async-softmax prefill kernel keeps the decode kernel per
//! token).

use super::asm::{A64, Cond, V, X};
use super::attention::{
    AttentionSpec, EXP_LO, KeyStore, ONE, PREFILL_HEAD_DIM_MULTIPLE, ValueStore, exp,
    exp_constants, splat_f32,
};
use super::attention_asm::AttentionAsm;
use super::frame;
use crate::artifact::{Arch, EmitError, MachineCode, PrefillBlocks};
use crate::host_attention::*;

/// The blocks one emitted kernel works in, and the strides they set.
#[derive(Clone, Copy, Debug)]
struct Geometry {
    /// Query rows per block (`R`, a multiple of [`TILE_ROWS`]).
    r: u32,
    /// Keys per block (`C`, a multiple of 4).
    c: u32,
}

impl Geometry {
    /// Bytes between the d-indices of the transposed q, `qt[d][R]` (R f32
    /// and 32 spare bytes: a stride off powers of two).
    fn qts(self) -> u32 {
        4 * self.r + 32
    }

    /// Bytes between 4-lane d-chunks of `O` (R rows of 4 f32, 32 spare
    /// bytes).
    fn qs(self) -> u32 {
        16 * self.r + 32
    }

    /// Bytes between keys of the score block `st[C][R]`.
    fn sts(self) -> u32 {
        4 * self.r
    }
}

/// Spare bytes after each `kp` / `vp` row (4·d bytes).
const VPAD: u32 = 64;
/// Rows of one score tile: four 4-row vectors.
const TILE_ROWS: u32 = 16;
/// Rows of one P·V tile: two 4-row p vectors.
const PV_ROWS: u32 = 8;
/// d-chunks (4 lanes) of one P·V tile.
const PV_CHUNKS: u32 = 3;
const _: () = assert!(TILE_ROWS.is_multiple_of(PV_ROWS) && PREFILL_HEAD_DIM_MULTIPLE == 4);

// 8-byte frame slots.
const F_ARGS: u32 = 0;
const F_G: u32 = 8;
const F_QTOK: u32 = 16;
const F_KSTR: u32 = 24;
const F_VSTR: u32 = 32;
const F_KSTEP: u32 = 40;
const F_BASE: u32 = 48;
const F_QT: u32 = 56;
const F_O: u32 = 64;
const F_S: u32 = 72;
const F_KP: u32 = 80;
const F_VP: u32 = 88;
const F_LIM: u32 = 96;
const F_M: u32 = 104;
const F_L: u32 = 112;
const F_ALPHA: u32 = 120;
const F_OPTR: u32 = 128;
const F_LIMI: u32 = 136;
const F_H: u32 = 144;
const F_HEND: u32 = 152;
const F_GH: u32 = 160;
const F_ROWS: u32 = 168;
const F_KROW: u32 = 176;
const F_VROW: u32 = 184;
const F_KSC: u32 = 192;
const F_KOF: u32 = 200;
const F_RB: u32 = 208;
const F_RN: u32 = 216;
const F_RNP: u32 = 224;
const F_KEND: u32 = 232;
const F_J0: u32 = 240;
const F_CNT: u32 = 248;
const F_VROWB: u32 = 256;
const F_D: u32 = 264;
const F_DCH: u32 = 272;
const F_C0: u32 = 280;
/// 1/√d (f32) when q is not pre-scaled.
const F_SCALE: u32 = 288;
const FRAME: u32 = 304;

/// The register plan, printed at the top of the listing.
const PLAN: &[&str] = &[
    "| loop | registers | holds |",
    "|---|---|---|",
    "| scores (16 rows x 4 keys) | v0-v15 | accumulators (4 row vectors x 4 keys) |",
    "| | v16-v19 | qt row vectors of one d-step |",
    "| | v20-v23 | 4 lanes of d of the 4 keys (fmla by element) |",
    "| softmax (4 rows a vector) | v16-v27 | exp constants |",
    "| P.V (8 rows x 3 chunks) | v0-v23 | accumulators (8 rows x 3 chunks of d) |",
    "| | v24 v25 | p of the 8 rows (by element); alpha first |",
    "| | v26-v28 | V chunks |",
];

/// Emit the causal prefill of `kernel` for `caps` (formats already
/// checked by [`AttentionSpec::new`]).
pub(super) fn emit(
    caps_name: &str,
    kernel_name: &str,
    spec: &AttentionSpec,
    blocks: PrefillBlocks,
) -> Result<MachineCode, EmitError> {
    blocks.check("neon", TILE_ROWS)?;
    let g = Geometry {
        r: blocks.rows,
        c: blocks.keys,
    };
    let mut a = A64::new();
    a.header(&format!(
        "{kernel_name} {caps_name} attention prefill (flash: {}-row x {}-key blocks): keys {}, values {}, q {}",
        g.r,
        g.c,
        spec.keys.name(),
        spec.values.name(),
        if spec.q_prescaled {
            "pre-scaled"
        } else {
            "x 1/sqrt(d)"
        }
    ));
    for line in PLAN {
        a.header(line);
    }
    frame::prologue(&mut a, FRAME);
    setup(&mut a, g, spec);

    let (kv_loop, kv_done) = (a.new_label(), a.new_label());
    a.bind(kv_loop);
    a.ldr_x_sp(X(1), F_H);
    a.ldr_x_sp(X(2), F_HEND);
    a.cmp(X(1), X(2));
    a.b_cond(Cond::Hs, kv_done);
    kv_setup(&mut a, spec);
    let (rb_loop, rb_done) = (a.new_label(), a.new_label());
    a.bind(rb_loop);
    a.ldr_x_sp(X(1), F_RB);
    a.ldr_x_sp(X(2), F_ROWS);
    a.cmp(X(1), X(2));
    a.b_cond(Cond::Hs, rb_done);
    pack_q(&mut a, g, spec);
    let (kb_loop, kb_done) = (a.new_label(), a.new_label());
    a.mov_imm(X(1), 0);
    a.str_x_sp(X(1), F_J0);
    a.bind(kb_loop);
    a.ldr_x_sp(X(1), F_J0);
    a.ldr_x_sp(X(2), F_KEND);
    a.cmp(X(1), X(2));
    a.b_cond(Cond::Hs, kb_done);
    pack_kv(&mut a, g, spec);
    scores(&mut a, g);
    softmax_rows(&mut a, g);
    pv(&mut a, g);
    a.ldr_x_sp(X(1), F_J0);
    a.add_imm(X(1), X(1), g.c);
    a.str_x_sp(X(1), F_J0);
    a.b(kb_loop);
    a.bind(kb_done);
    finish_rows(&mut a, g);
    a.ldr_x_sp(X(1), F_RB);
    a.add_imm(X(1), X(1), g.r);
    a.str_x_sp(X(1), F_RB);
    a.b(rb_loop);
    a.bind(rb_done);
    // Next KV head: its first query head is where this one's portion ended.
    a.ldr_x_sp(X(1), F_H);
    a.ldr_x_sp(X(2), F_GH);
    a.add(X(1), X(1), X(2));
    a.str_x_sp(X(1), F_H);
    a.b(kv_loop);
    a.bind(kv_done);
    frame::epilogue(&mut a, FRAME);
    let (bytes, listing) = a.finish().map_err(EmitError::Assembler)?;
    Ok(MachineCode {
        arch: Arch::Aarch64,
        bytes,
        listing,
        head_dim_multiple: PREFILL_HEAD_DIM_MULTIPLE,
        whole_prefill: Some(blocks),
        every_head_state: false,
    })
}

/// Call-wide values: group, strides, the causal base `s − t`, scratch
/// areas (the layout of `prefill_scratch_floats`), 1/√d.
fn setup(a: &mut A64, g: Geometry, spec: &AttentionSpec) {
    a.comment("call setup: group, strides, s - t, scratch areas");
    let args = X(0);
    a.str_x_sp(args, F_ARGS);
    a.ldr_x(X(1), args, AT_HQ as u32);
    a.ldr_x(X(2), args, AT_KVH as u32);
    a.udiv(X(3), X(1), X(2));
    a.str_x_sp(X(3), F_G);
    a.ldr_x(X(4), args, AT_D as u32);
    a.str_x_sp(X(4), F_D);
    a.lsr_imm(X(5), X(4), 2);
    a.str_x_sp(X(5), F_DCH);
    a.add_imm(X(5), X(4), VPAD / 4);
    a.lsl_imm(X(5), X(5), 2);
    a.str_x_sp(X(5), F_VROWB);
    a.ldr_x(X(6), args, AT_S as u32);
    a.ldr_x(X(7), args, AT_T as u32);
    a.sub(X(6), X(6), X(7));
    a.str_x_sp(X(6), F_BASE);
    // Bytes between tokens: q and o hq·d·2; K and V kvh·d·(1 or 2).
    a.mul(X(6), X(1), X(4));
    a.lsl_imm(X(6), X(6), 1);
    a.str_x_sp(X(6), F_QTOK);
    a.mul(X(6), X(2), X(4));
    a.lsl_imm(X(7), X(6), spec.key_bytes().trailing_zeros());
    a.str_x_sp(X(7), F_KSTR);
    a.lsl_imm(X(7), X(6), spec.value_bytes().trailing_zeros());
    a.str_x_sp(X(7), F_VSTR);
    a.lsl_imm(X(7), X(2), 2);
    a.str_x_sp(X(7), F_KSTEP);
    // qt = scratch (aligned to a cache line); O = qt + QTS·d;
    // S = O + (QS/4)·d; kp = S + 4·R·C; vp = kp + C·vrowb;
    // lim = vp + C·vrowb; m, l, alpha: + 4·R each; optr: + 4·R; limi: + 8·R.
    a.ldr_x(X(8), args, AT_SCRATCH as u32);
    a.add_imm(X(8), X(8), 63);
    a.mov_imm(X(9), !63u64);
    a.and(X(8), X(8), X(9));
    a.str_x_sp(X(8), F_QT);
    a.mov_imm(X(9), u64::from(g.qts()));
    a.madd(X(8), X(9), X(4), X(8));
    a.str_x_sp(X(8), F_O);
    a.mov_imm(X(9), u64::from(g.qs() / 4));
    a.madd(X(8), X(9), X(4), X(8));
    a.str_x_sp(X(8), F_S);
    a.add_imm(X(8), X(8), 4 * g.r * g.c);
    a.str_x_sp(X(8), F_KP);
    a.mov_imm(X(9), u64::from(g.c));
    a.madd(X(8), X(9), X(5), X(8));
    a.str_x_sp(X(8), F_VP);
    a.madd(X(8), X(9), X(5), X(8));
    for (slot, bytes) in [
        (F_LIM, 4 * g.r),
        (F_M, 4 * g.r),
        (F_L, 4 * g.r),
        (F_ALPHA, 4 * g.r),
        (F_OPTR, 8 * g.r),
        (F_LIMI, 0),
    ] {
        a.str_x_sp(X(8), slot);
        if bytes > 0 {
            a.add_imm(X(8), X(8), bytes);
        }
    }
    // Heads of this call.
    a.ldr_x(X(1), args, AT_HEAD0 as u32);
    a.str_x_sp(X(1), F_H);
    a.ldr_x(X(2), args, AT_HEADS as u32);
    a.add(X(1), X(1), X(2));
    a.str_x_sp(X(1), F_HEND);
    if !spec.q_prescaled {
        a.comment("1/sqrt(d)");
        a.ucvtf_s_x(V(0), X(4));
        a.fsqrt_s(V(0), V(0));
        a.mov_imm(X(9), u64::from(1f32.to_bits()));
        a.fmov_s_w(V(1), X(9));
        a.fdiv_s(V(1), V(1), V(0));
        a.add_from_sp(X(9), F_SCALE);
        a.str_s(V(1), X(9), 0);
    }
}

/// The KV head of query head `F_H`, the call's heads of its group from
/// there (`F_GH`), its K/V rows and parameters, rows `t·gh`.
fn kv_setup(a: &mut A64, spec: &AttentionSpec) {
    a.comment("kv head: its query heads in this call, K/V row 0, rows = t·gh");
    // x1 = h, x2 = hend (from the loop test).
    a.ldr_x_sp(X(3), F_G);
    a.udiv(X(4), X(1), X(3));
    a.mul(X(5), X(4), X(3));
    a.sub(X(5), X(1), X(5));
    // gh = min(group − h % group, hend − h).
    a.sub(X(6), X(3), X(5));
    a.sub(X(7), X(2), X(1));
    a.cmp(X(6), X(7));
    a.csel(X(6), X(6), X(7), Cond::Lo);
    a.str_x_sp(X(6), F_GH);
    a.ldr_x_sp(X(0), F_ARGS);
    a.ldr_x(X(8), X(0), AT_T as u32);
    a.mul(X(8), X(8), X(6));
    a.str_x_sp(X(8), F_ROWS);
    a.mov_imm(X(8), 0);
    a.str_x_sp(X(8), F_RB);
    // K row = k + kv·d·kbytes; V likewise; parameters at kv·4.
    a.ldr_x_sp(X(9), F_D);
    a.mul(X(10), X(4), X(9));
    a.ldr_x(X(11), X(0), AT_K as u32);
    a.add_lsl(X(12), X(11), X(10), spec.key_bytes().trailing_zeros());
    a.str_x_sp(X(12), F_KROW);
    a.ldr_x(X(11), X(0), AT_V as u32);
    a.add_lsl(X(12), X(11), X(10), spec.value_bytes().trailing_zeros());
    a.str_x_sp(X(12), F_VROW);
    if let KeyStore::I8 { asym } = spec.keys {
        a.ldr_x(X(11), X(0), AT_K_SCALES as u32);
        a.add_lsl(X(12), X(11), X(4), 2);
        a.str_x_sp(X(12), F_KSC);
        if asym {
            a.ldr_x(X(11), X(0), AT_K_OFFSETS as u32);
            a.add_lsl(X(12), X(11), X(4), 2);
            a.str_x_sp(X(12), F_KOF);
        }
    }
}

/// Row `r`'s state: limit `lim` (u64 and f32), `m = −∞` (v30), `l = 0`
/// (v31). Clobbers x11, v1.
fn row_state(a: &mut A64, r: X, lim: X) {
    a.ldr_x_sp(X(11), F_LIMI);
    a.add_lsl(X(11), X(11), r, 3);
    a.str_x(lim, X(11), 0);
    a.ucvtf_s_x(V(1), lim);
    for (slot, v) in [(F_LIM, V(1)), (F_M, V(30)), (F_L, V(31))] {
        a.ldr_x_sp(X(11), slot);
        a.add_lsl(X(11), X(11), r, 2);
        a.str_s(v, X(11), 0);
    }
}

/// Rows `rb ..` of this KV head: q widened into `qt`, limits, output row
/// pointers, `m`, `l`, `O` reset; padded rows get zero q and the last
/// real row's limit; `F_KEND` = that limit + 1.
fn pack_q(a: &mut A64, g: Geometry, spec: &AttentionSpec) {
    a.comment("row block: q -> qt[d][R] (transposed), limits, o rows; m = -inf, l = 0, O = 0");
    // rn = min(R, rows − rb), rnp = rn rounded up to a score tile (16).
    a.ldr_x_sp(X(1), F_ROWS);
    a.ldr_x_sp(X(2), F_RB);
    a.sub(X(1), X(1), X(2));
    a.mov_imm(X(3), u64::from(g.r));
    a.cmp(X(1), X(3));
    a.csel(X(1), X(1), X(3), Cond::Lo);
    a.str_x_sp(X(1), F_RN);
    a.add_imm(X(3), X(1), TILE_ROWS - 1);
    a.lsr_imm(X(3), X(3), TILE_ROWS.trailing_zeros());
    a.lsl_imm(X(3), X(3), TILE_ROWS.trailing_zeros());
    a.str_x_sp(X(3), F_RNP);
    // x19 = r, x20 = rn, x21 = gh, x22 = QTS, x23 = QS, x24 = rb, x25 = h,
    // x26 = qtok, x27 = d, x28 = the last real row's limit.
    a.ldr_x_sp(X(20), F_RN);
    a.ldr_x_sp(X(21), F_GH);
    a.mov_imm(X(22), u64::from(g.qts()));
    a.mov_imm(X(23), u64::from(g.qs()));
    a.ldr_x_sp(X(24), F_RB);
    a.ldr_x_sp(X(25), F_H);
    a.ldr_x_sp(X(26), F_QTOK);
    a.ldr_x_sp(X(27), F_D);
    a.zero(V(31));
    splat_f32(a, V(30), f32::NEG_INFINITY, X(9));
    if !spec.q_prescaled {
        a.add_from_sp(X(9), F_SCALE);
        a.ld1r_4s(V(29), X(9));
    }
    a.mov_imm(X(19), 0);
    let (row, real_done) = (a.new_label(), a.new_label());
    a.bind(row);
    a.cmp(X(19), X(20));
    a.b_cond(Cond::Hs, real_done);
    // token = (rb + r) / gh (x2), head in group = (rb + r) % gh (x3).
    a.add(X(1), X(24), X(19));
    a.udiv(X(2), X(1), X(21));
    a.mul(X(3), X(2), X(21));
    a.sub(X(3), X(1), X(3));
    // Byte offset of the row in q and o: token·qtok + (h + hi)·d·2.
    a.mul(X(4), X(2), X(26));
    a.add(X(5), X(25), X(3));
    a.mul(X(5), X(5), X(27));
    a.add_lsl(X(4), X(4), X(5), 1);
    a.ldr_x_sp(X(0), F_ARGS);
    a.ldr_x(X(6), X(0), AT_O as u32);
    a.add(X(6), X(6), X(4));
    a.ldr_x_sp(X(7), F_OPTR);
    a.add_lsl(X(7), X(7), X(19), 3);
    a.str_x(X(6), X(7), 0);
    a.ldr_x(X(6), X(0), AT_Q as u32);
    a.add(X(6), X(6), X(4));
    // x8 = qt + 4·r (stepped by QTS per d), x9 = O + 16·r (by QS per chunk).
    a.ldr_x_sp(X(8), F_QT);
    a.add_lsl(X(8), X(8), X(19), 2);
    a.ldr_x_sp(X(9), F_O);
    a.add_lsl(X(9), X(9), X(19), 4);
    a.ldr_x_sp(X(10), F_DCH);
    let chunk = a.new_label();
    a.bind(chunk);
    a.ldr_d_post(V(0), X(6), 8);
    a.fcvtl_4s(V(0), V(0));
    if !spec.q_prescaled {
        a.fmul_4s(V(0), V(0), V(29));
    }
    for lane in 0..4 {
        a.st1_s_lane_post(V(0), lane, X(8), X(22));
    }
    a.str_q(V(31), X(9), 0);
    a.add(X(9), X(9), X(23));
    a.subs_imm(X(10), X(10), 1);
    a.b_cond(Cond::Ne, chunk);
    a.ldr_x_sp(X(1), F_BASE);
    a.add(X(28), X(1), X(2));
    row_state(a, X(19), X(28));
    a.add_imm(X(19), X(19), 1);
    a.b(row);
    a.bind(real_done);
    // Padded rows: zero q and O, the last real row's limit.
    a.ldr_x_sp(X(20), F_RNP);
    let (pad, pad_done) = (a.new_label(), a.new_label());
    a.bind(pad);
    a.cmp(X(19), X(20));
    a.b_cond(Cond::Hs, pad_done);
    a.ldr_x_sp(X(8), F_QT);
    a.add_lsl(X(8), X(8), X(19), 2);
    a.ldr_x_sp(X(9), F_O);
    a.add_lsl(X(9), X(9), X(19), 4);
    a.ldr_x_sp(X(10), F_DCH);
    let zchunk = a.new_label();
    a.bind(zchunk);
    for _ in 0..4 {
        a.st1_s_lane_post(V(31), 0, X(8), X(22));
    }
    a.str_q(V(31), X(9), 0);
    a.add(X(9), X(9), X(23));
    a.subs_imm(X(10), X(10), 1);
    a.b_cond(Cond::Ne, zchunk);
    row_state(a, X(19), X(28));
    a.add_imm(X(19), X(19), 1);
    a.b(pad);
    a.bind(pad_done);
    a.add_imm(X(1), X(28), 1);
    a.str_x_sp(X(1), F_KEND);
}

/// Keys `j0 .. j0 + cnt` of this KV head (cnt = min(C, kend − j0)):
/// K → `kp[C][d]` (keys up to the next multiple of 4 zero), V →
/// `vp[C][d]`, both f32, rows `4·d + VPAD` bytes apart.
fn pack_kv(a: &mut A64, g: Geometry, spec: &AttentionSpec) {
    a.comment("key block: K -> kp[C][d], V -> vp[C][d] (f32)");
    a.ldr_x_sp(X(1), F_KEND);
    a.ldr_x_sp(X(2), F_J0);
    a.sub(X(1), X(1), X(2));
    a.mov_imm(X(3), u64::from(g.c));
    a.cmp(X(1), X(3));
    a.csel(X(25), X(1), X(3), Cond::Lo);
    a.str_x_sp(X(25), F_CNT);
    // x19 = K row j0, x20 = V row j0, x21/x22 = its scale/offset.
    a.ldr_x_sp(X(27), F_KSTR);
    a.mul(X(4), X(2), X(27));
    a.ldr_x_sp(X(5), F_KROW);
    a.add(X(19), X(5), X(4));
    a.ldr_x_sp(X(17), F_VSTR);
    a.mul(X(4), X(2), X(17));
    a.ldr_x_sp(X(5), F_VROW);
    a.add(X(20), X(5), X(4));
    let quant_keys = matches!(spec.keys, KeyStore::I8 { .. });
    let asym = spec.keys == KeyStore::I8 { asym: true };
    if quant_keys {
        a.ldr_x_sp(X(28), F_KSTEP);
        a.mul(X(4), X(2), X(28));
        a.ldr_x_sp(X(5), F_KSC);
        a.add(X(21), X(5), X(4));
        if asym {
            a.ldr_x_sp(X(5), F_KOF);
            a.add(X(22), X(5), X(4));
        }
    }
    if spec.values == ValueStore::E4M3 {
        a.mvni_bfff_8h(V(7));
        splat_f32(a, V(6), 256.0, X(9));
    }
    // x23 = kp row, x24 = vp row, x26 = their stride, x16 = keys left.
    a.ldr_x_sp(X(23), F_KP);
    a.ldr_x_sp(X(24), F_VP);
    a.ldr_x_sp(X(26), F_VROWB);
    a.mov(X(16), X(25));
    let key = a.new_label();
    a.bind(key);
    if quant_keys {
        a.ld1r_4s(V(4), X(21));
        a.add(X(21), X(21), X(28));
        if asym {
            a.ld1r_4s(V(5), X(22));
            a.add(X(22), X(22), X(28));
        }
    }
    a.mov(X(9), X(19));
    a.mov(X(10), X(23));
    a.mov(X(11), X(20));
    a.mov(X(12), X(24));
    a.ldr_x_sp(X(13), F_DCH);
    let chunk = a.new_label();
    a.bind(chunk);
    match spec.keys {
        KeyStore::F16 => {
            a.ldr_d_post(V(0), X(9), 8);
            a.fcvtl_4s(V(0), V(0));
        }
        KeyStore::I8 { .. } => {
            a.ldr_s_post(V(0), X(9), 4);
            a.sxtl_8h(V(0), V(0));
            a.sxtl_4s(V(0), V(0));
            a.scvtf_4s(V(0), V(0));
            a.fmul_4s(V(0), V(0), V(4));
            if asym {
                a.fadd_4s(V(0), V(0), V(5));
            }
        }
    }
    a.str_q_post(V(0), X(10), 16);
    match spec.values {
        ValueStore::F16 => {
            a.ldr_d_post(V(1), X(11), 8);
            a.fcvtl_4s(V(1), V(1));
        }
        ValueStore::E4M3 | ValueStore::E5M2 => {
            // The byte as the high half of an f16: e5m2 exactly; e4m3 as
            // v·2⁻⁸ after the shift, undone by an exact ×256.
            a.ldr_s_post(V(1), X(11), 4);
            a.shll_8h(V(1), V(1));
            if spec.values == ValueStore::E4M3 {
                a.sshr1_8h(V(1), V(1));
                a.and_16b(V(1), V(1), V(7));
            }
            a.fcvtl_4s(V(1), V(1));
            if spec.values == ValueStore::E4M3 {
                a.fmul_4s(V(1), V(1), V(6));
            }
        }
    }
    a.str_q_post(V(1), X(12), 16);
    a.subs_imm(X(13), X(13), 1);
    a.b_cond(Cond::Ne, chunk);
    a.add(X(19), X(19), X(27));
    a.add(X(20), X(20), X(17));
    a.add(X(23), X(23), X(26));
    a.add(X(24), X(24), X(26));
    a.subs_imm(X(16), X(16), 1);
    a.b_cond(Cond::Ne, key);
    // Zero keys up to the next multiple of 4 (their scores are masked,
    // but must not be NaN-producing garbage either way).
    a.zero(V(31));
    a.mov(X(16), X(25));
    let (pad, pad_done) = (a.new_label(), a.new_label());
    a.bind(pad);
    a.lsl_imm(X(9), X(16), 62);
    a.cbz(X(9), pad_done);
    a.mov(X(10), X(23));
    a.ldr_x_sp(X(13), F_DCH);
    let zc = a.new_label();
    a.bind(zc);
    a.str_q_post(V(31), X(10), 16);
    a.subs_imm(X(13), X(13), 1);
    a.b_cond(Cond::Ne, zc);
    a.add(X(23), X(23), X(26));
    a.add_imm(X(16), X(16), 1);
    a.b(pad);
    a.bind(pad_done);
}

/// `st[j][r] = qt[·][r] · kp_j` for the block's rows (rnp) and keys (cnt
/// rounded up to 4), in tiles of 16 rows (four 4-row vectors of `qt`) × 4
/// keys. Row tiles outer (a tile's `qt` columns stay in L1 across the key
/// quads); a quad past the tile's last causal limit ends it (rows are in
/// limit order).
fn scores(a: &mut A64, g: Geometry) {
    a.comment("scores: 16-row x 4-key tiles (rows in lanes, keys by element), st[C][R]");
    let acc = |v: u32, j: u32| V((v * 4 + j) as u8);
    let qv = |v: u32| V((16 + v) as u8);
    let kv = |j: u32| V((20 + j) as u8);
    // x19 = tile's first row, x20 = rnp, x21 = quad's first key, x22 = the
    // tile's last limit − j0, x23 = cnt, x24 = kp row stride, x25 = qt,
    // x26 = kp, x27 = st, x28 = j0, x17 = limi, x16 = d/4.
    a.ldr_x_sp(X(20), F_RNP);
    a.ldr_x_sp(X(23), F_CNT);
    a.ldr_x_sp(X(24), F_VROWB);
    a.ldr_x_sp(X(25), F_QT);
    a.ldr_x_sp(X(26), F_KP);
    a.ldr_x_sp(X(27), F_S);
    a.ldr_x_sp(X(28), F_J0);
    a.ldr_x_sp(X(17), F_LIMI);
    a.ldr_x_sp(X(16), F_DCH);
    a.mov_imm(X(19), 0);
    let (tile, tiles_done) = (a.new_label(), a.new_label());
    a.bind(tile);
    a.cmp(X(19), X(20));
    a.b_cond(Cond::Hs, tiles_done);
    a.add_lsl(X(1), X(17), X(19), 3);
    a.ldr_x(X(22), X(1), 8 * (TILE_ROWS - 1));
    a.sub(X(22), X(22), X(28));
    a.mov_imm(X(21), 0);
    let (quad, quads_done) = (a.new_label(), a.new_label());
    a.bind(quad);
    a.cmp(X(21), X(23));
    a.b_cond(Cond::Hs, quads_done);
    a.cmp(X(21), X(22));
    a.b_cond(Cond::Gt, quads_done);
    for v in 0..4 {
        for j in 0..4 {
            a.zero(acc(v, j));
        }
    }
    // x9 = qt + 4·r0; x10..x13 = kp rows j .. j+3; x14 = d/4 steps.
    a.add_lsl(X(9), X(25), X(19), 2);
    a.mul(X(10), X(21), X(24));
    a.add(X(10), X(26), X(10));
    a.add(X(11), X(10), X(24));
    a.add(X(12), X(11), X(24));
    a.add(X(13), X(12), X(24));
    a.mov(X(14), X(16));
    let step = a.new_label();
    a.bind(step);
    for j in 0..4 {
        a.ldr_q_post(kv(j), X(10 + j as u8), 16);
    }
    for dd in 0..4 {
        for v in 0..4 {
            a.ldr_q(qv(v), X(9), dd * g.qts() + 16 * v);
        }
        for j in 0..4 {
            for v in 0..4 {
                a.fmla_4s_elem(acc(v, j), qv(v), kv(j), dd);
            }
        }
    }
    a.add_imm(X(9), X(9), 4 * g.qts());
    a.subs_imm(X(14), X(14), 1);
    a.b_cond(Cond::Ne, step);
    // st + j·STS + 4·r0: key j's rows, vector v at + 16·v.
    a.mov_imm(X(1), u64::from(g.sts()));
    a.mul(X(15), X(21), X(1));
    a.add(X(15), X(27), X(15));
    a.add_lsl(X(15), X(15), X(19), 2);
    for j in 0..4 {
        for v in 0..4 {
            a.str_q(acc(v, j), X(15), g.sts() * j + 16 * v);
        }
    }
    a.add_imm(X(21), X(21), 4);
    a.b(quad);
    a.bind(quads_done);
    a.add_imm(X(19), X(19), TILE_ROWS);
    a.b(tile);
    a.bind(tiles_done);
}

/// Per 4-row vector (rows in lanes, no horizontal work): keys past each
/// row's limit → −∞, the block max, the running max `m'`, `α = e^(m −
/// m')`, `p = e^(S − m')` in place (masked keys exactly 0), `l = α·l + Σp`.
fn softmax_rows(a: &mut A64, g: Geometry) {
    a.comment("online softmax, 4 rows a vector: mask, max, alpha, p, l");
    exp_constants(a, X(9));
    let (x, mask, mold, lnew, sum, mnew, key, mmax, lim) =
        (V(0), V(1), V(2), V(3), V(4), V(5), V(6), V(7), V(8));
    let (t1, t2, neginf, j0v) = (V(9), V(10), V(11), V(14));
    splat_f32(a, neginf, f32::NEG_INFINITY, X(9));
    a.ldr_x_sp(X(1), F_J0);
    a.ucvtf_s_x(j0v, X(1));
    a.dup_4s(j0v, j0v, 0);
    // x19 = 16·v (the vector's byte offset in the per-row arrays).
    a.ldr_x_sp(X(20), F_RNP);
    a.ldr_x_sp(X(21), F_LIM);
    a.ldr_x_sp(X(22), F_M);
    a.ldr_x_sp(X(23), F_L);
    a.ldr_x_sp(X(24), F_ALPHA);
    a.ldr_x_sp(X(25), F_S);
    a.ldr_x_sp(X(26), F_CNT);
    a.mov_imm(X(27), u64::from(g.sts()));
    a.mov_imm(X(19), 0);
    let (vec, vecs_done) = (a.new_label(), a.new_label());
    a.bind(vec);
    a.lsr_imm(X(1), X(19), 2);
    a.cmp(X(1), X(20));
    a.b_cond(Cond::Hs, vecs_done);
    a.add(X(1), X(21), X(19));
    a.ldr_q(lim, X(1), 0);
    a.add(X(2), X(22), X(19));
    a.ldr_q(mold, X(2), 0);
    a.mov_v(key, j0v);
    a.mov_v(mmax, neginf);
    // Pass 1 over the block's keys: mask, store, max.
    a.add(X(3), X(25), X(19));
    a.mov(X(4), X(26));
    let pass1 = a.new_label();
    a.bind(pass1);
    a.ldr_q(x, X(3), 0);
    a.fcmgt_4s(mask, key, lim);
    a.bit_16b(x, neginf, mask);
    a.str_q(x, X(3), 0);
    a.add(X(3), X(3), X(27));
    a.fmaxnm_4s(mmax, mmax, x);
    a.fadd_4s(key, key, ONE);
    a.subs_imm(X(4), X(4), 1);
    a.b_cond(Cond::Ne, pass1);
    // m' = max(m, block max); α = e^(m − m'); l·α.
    a.fmaxnm_4s(mnew, mmax, mold);
    a.str_q(mnew, X(2), 0);
    a.fsub_4s(x, mold, mnew);
    exp(a, x, t1, t2);
    a.add(X(1), X(24), X(19));
    a.str_q(x, X(1), 0);
    a.add(X(1), X(23), X(19));
    a.ldr_q(lnew, X(1), 0);
    a.fmul_4s(lnew, lnew, x);
    // Pass 2: p = e^(S − m'), Σp.
    a.zero(sum);
    a.add(X(3), X(25), X(19));
    a.mov(X(4), X(26));
    let pass2 = a.new_label();
    a.bind(pass2);
    a.ldr_q(x, X(3), 0);
    a.fsub_4s(x, x, mnew);
    // Masked keys (−∞ − m' = −∞) and anything below the exp clamp: 0.
    a.fcmgt_4s(mask, EXP_LO, x);
    exp(a, x, t1, t2);
    a.bic_16b(x, x, mask);
    a.fadd_4s(sum, sum, x);
    a.str_q(x, X(3), 0);
    a.add(X(3), X(3), X(27));
    a.subs_imm(X(4), X(4), 1);
    a.b_cond(Cond::Ne, pass2);
    a.fadd_4s(lnew, lnew, sum);
    a.str_q(lnew, X(1), 0);
    a.add_imm(X(19), X(19), 16);
    a.b(vec);
    a.bind(vecs_done);
}

/// `O = α·O + P·V` over the block's `cnt` keys: groups of 3 chunks
/// (outer: their V columns stay in L1) × 8-row passes.
fn pv(a: &mut A64, g: Geometry) {
    a.comment("P.V: 3-chunk groups x 8-row passes, O = alpha.O + P.V");
    a.mov_imm(X(1), 0);
    a.str_x_sp(X(1), F_C0);
    let (group, groups_done) = (a.new_label(), a.new_label());
    a.bind(group);
    a.ldr_x_sp(X(1), F_C0);
    a.ldr_x_sp(X(2), F_DCH);
    a.cmp(X(1), X(2));
    a.b_cond(Cond::Hs, groups_done);
    // Dispatch on the chunks left in this group (1..=3).
    a.sub(X(3), X(2), X(1));
    let after = a.new_label();
    let by_chunks: Vec<_> = (0..PV_CHUNKS).map(|_| a.new_label()).collect();
    for (i, l) in by_chunks.iter().enumerate().take(PV_CHUNKS as usize - 1) {
        a.cmp_imm(X(3), i as u32 + 1);
        a.b_cond(Cond::Eq, *l);
    }
    a.b(by_chunks[PV_CHUNKS as usize - 1]);
    for (i, l) in by_chunks.iter().enumerate() {
        a.bind(*l);
        pv_rows(a, g, i as u32 + 1);
        a.b(after);
    }
    a.bind(after);
    a.ldr_x_sp(X(1), F_C0);
    a.add_imm(X(1), X(1), PV_CHUNKS);
    a.str_x_sp(X(1), F_C0);
    a.b(group);
    a.bind(groups_done);
}

/// Every 8-row pass of the block over chunks `c0 .. c0 + nc`.
fn pv_rows(a: &mut A64, g: Geometry, nc: u32) {
    let acc = |r: u32, c: u32| V((r * nc + c) as u8);
    let p = |r: u32| V((24 + r / 4) as u8);
    let vx = |c: u32| V((26 + c) as u8);
    // x19 = r, x20 = rnp, x21 = limi, x22 = j0, x23 = cnt, x24 = O + c0·QS,
    // x25 = alpha, x26 = st, x27 = vp + 16·c0, x28 = vp row stride.
    a.ldr_x_sp(X(20), F_RNP);
    a.ldr_x_sp(X(21), F_LIMI);
    a.ldr_x_sp(X(22), F_J0);
    a.ldr_x_sp(X(23), F_CNT);
    a.ldr_x_sp(X(1), F_C0);
    a.mov_imm(X(2), u64::from(g.qs()));
    a.mul(X(3), X(1), X(2));
    a.ldr_x_sp(X(24), F_O);
    a.add(X(24), X(24), X(3));
    a.ldr_x_sp(X(25), F_ALPHA);
    a.ldr_x_sp(X(26), F_S);
    a.ldr_x_sp(X(27), F_VP);
    a.add_lsl(X(27), X(27), X(1), 4);
    a.ldr_x_sp(X(28), F_VROWB);
    a.mov_imm(X(19), 0);
    let (pass, passes_done) = (a.new_label(), a.new_label());
    a.bind(pass);
    a.cmp(X(19), X(20));
    a.b_cond(Cond::Hs, passes_done);
    // x8 = keys these rows see in the block: min(cnt, lim(r+7) − j0 + 1)
    // (rows are in limit order; later keys have p = 0 for all eight).
    // None: skip (every p is 0 and α = e^0 = 1 exactly, so O stays).
    let next = a.new_label();
    a.add_lsl(X(1), X(21), X(19), 3);
    a.ldr_x(X(8), X(1), 8 * (PV_ROWS - 1));
    a.sub(X(8), X(8), X(22));
    a.add_imm(X(8), X(8), 1);
    a.cmp_imm(X(8), 0);
    a.b_cond(Cond::Le, next);
    a.cmp(X(8), X(23));
    a.csel(X(8), X(8), X(23), Cond::Lt);
    // x9 = O + c0·QS + 16·r: acc (r', c') at + c'·QS + 16·r'.
    a.add_lsl(X(9), X(24), X(19), 4);
    // acc = α·O.
    a.add_lsl(X(10), X(25), X(19), 2);
    a.ldp_q(p(0), p(4), X(10), 0);
    for r in 0..PV_ROWS {
        for c in 0..nc {
            a.ldr_q(acc(r, c), X(9), g.qs() * c + 16 * r);
            a.fmul_4s_elem(acc(r, c), acc(r, c), p(r), r % 4);
        }
    }
    // x11 = p of (key 0, r) (key stride STS); x12 = vp + 16·c0 (row
    // stride x28).
    a.add_lsl(X(11), X(26), X(19), 2);
    a.mov(X(12), X(27));
    let top = a.new_label();
    a.bind(top);
    a.ldp_q_post(p(0), p(4), X(11), g.sts() as i32);
    for c in 0..nc {
        a.ldr_q(vx(c), X(12), 16 * c);
    }
    a.add(X(12), X(12), X(28));
    for c in 0..nc {
        for r in 0..PV_ROWS {
            a.fmla_4s_elem(acc(r, c), vx(c), p(r), r % 4);
        }
    }
    a.subs_imm(X(8), X(8), 1);
    a.b_cond(Cond::Ne, top);
    for r in 0..PV_ROWS {
        for c in 0..nc {
            a.str_q(acc(r, c), X(9), g.qs() * c + 16 * r);
        }
    }
    a.bind(next);
    a.add_imm(X(19), X(19), PV_ROWS);
    a.b(pass);
    a.bind(passes_done);
}

/// `o = O / l` to f16 for the block's real rows.
fn finish_rows(a: &mut A64, g: Geometry) {
    a.comment("o = O / l (f16) for the real rows");
    a.ldr_x_sp(X(20), F_RN);
    a.ldr_x_sp(X(21), F_L);
    a.ldr_x_sp(X(22), F_OPTR);
    a.ldr_x_sp(X(23), F_O);
    a.ldr_x_sp(X(24), F_DCH);
    a.mov_imm(X(25), u64::from(g.qs()));
    a.mov_imm(X(19), 0);
    let (row, rows_done) = (a.new_label(), a.new_label());
    a.bind(row);
    a.cmp(X(19), X(20));
    a.b_cond(Cond::Hs, rows_done);
    a.add_lsl(X(1), X(21), X(19), 2);
    a.ld1r_4s(V(1), X(1));
    a.add_lsl(X(1), X(22), X(19), 3);
    a.ldr_x(X(2), X(1), 0);
    a.add_lsl(X(3), X(23), X(19), 4);
    a.mov(X(4), X(24));
    let chunk = a.new_label();
    a.bind(chunk);
    a.ldr_q(V(0), X(3), 0);
    a.add(X(3), X(3), X(25));
    a.fdiv_4s(V(0), V(0), V(1));
    a.fcvtn_4h(V(0), V(0));
    a.str_d_post(V(0), X(2), 8);
    a.subs_imm(X(4), X(4), 1);
    a.b_cond(Cond::Ne, chunk);
    a.add_imm(X(19), X(19), 1);
    a.b(row);
    a.bind(rows_done);
}
