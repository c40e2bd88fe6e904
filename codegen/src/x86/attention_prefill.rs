//! Causal prefill attention on x86 (AVX2, FMA, F16C), ABI
//! [`crate::host_attention::AttentionArgs`] with `t` query tokens: the
//! flash-attention loop, so each K/V row is read once per block of query
//! rows instead of once per query token (MNN-LLM 5.3's pre-scaled q, fp32
//! online softmax).
//!
//! Rows are (query token, query head) pairs of one KV head, token-major,
//! so the heads of a GQA group share every K/V block, and a row's causal
//! limit never falls as its index grows. Per block of up to `R` rows
//! ([`PrefillBlocks::rows`], 96 by default; the last block padded to a
//! multiple of the score tile, 24 or 48 rows, with zero q):
//!
//! 1. q rows widened to f32 and transposed, `qt[d][R]` (rows in lanes);
//!    per row its causal limit (the last key it sees, `s − t + token`) and
//!    its output row; `m = −∞`, `l = 0`, `O = 0`.
//! 2. For each block of `C` keys ([`PrefillBlocks::keys`], 128 by default)
//!    up to the block's last
//!    visible key (later keys are fully masked: skipped):
//!    - K rows widened (int8 keys dequantized: `scale·c + offset`) and V
//!      rows (fp8 values decoded exactly) to `kp[C][d]`, `vp[C][d]`: once
//!      per row block, so the conversion costs 2/R of the FMAs.
//!    - Scores with rows in lanes: 24-row × 4-key register tiles (three
//!      `qt` vectors, one broadcast key element at a time), `st[C][R]`; no
//!      horizontal sums. Tiles past the rows' limits are skipped.
//!    - Per 8-row vector: keys past each row's limit → −∞, the block max,
//!      the running max `m'`, `α = e^(m − m')`, `p = e^(S − m')` (masked
//!      keys exactly 0), `l = α·l + Σp`, all lane-wise.
//!    - `O = α·O + P·V` in 3-row × 4-chunk register tiles over the keys
//!      the rows see (12 accumulators, 3 broadcasts, 1 V vector).
//! 3. `o = O / l` to f16.
//!
//! Register plan of the two inner loops:
//!
//! | loop | ymm0–11 | ymm12–14 | ymm15 |
//! |---|---|---|---|
//! | scores (24 rows × 4 keys) | accumulators (3 row vectors × 4 keys) | `qt` row vectors | key element broadcast |
//! | P·V (3 rows × 4 chunks) | accumulators (3 rows × 4 chunks of d) | p broadcasts | V chunk |
//!
//! With AVX-512 (the caller's `ymm32`) the two loops widen: a score tile
//! is 48 rows, three zmm of 16 (the same registers as the table's, zmm),
//! where the block's rows are a multiple of 48 (every candidate the
//! autotuner times), else 24 rows as one zmm (rows 0–15) and one ymm (rows
//! 16–23); the P·V takes 3 rows × up to 8 16-lane chunks of d in zmm0–23, p
//! in zmm24–26, V in zmm27, each accumulator two of `O`'s 8-lane chunks
//! (loaded and stored as halves). Memory layouts do not change; the last
//! block's rows are padded to the tile.
//!
//! Scratch: [`crate::host_attention::prefill_scratch_floats`]; `d` a
//! multiple of 8; q pre-scaled by 1/√d; online softmax only.

use super::asm::*;
use super::attention::{
    self, EXP_REGS, FRAME, Keys, V_2P120, V_127, V_MAG, V_MIN, V_NEGINF, V_ONE, V_SIGN, Values,
    exp_ps,
};
use super::common;
use super::evex::{Kreg, Zmm};
use crate::artifact::{EmitError, MachineCode, PrefillBlocks};
use crate::host_attention::*;

/// The blocks one emitted kernel works in, and the strides they set.
#[derive(Clone, Copy, Debug)]
struct Geometry {
    /// Query rows per block (`R`, a multiple of `tile`).
    r: i32,
    /// Keys per block (`C`, a multiple of 4).
    c: i32,
    /// Rows of a score tile: [`TILE_ROWS`], or with zmm [`ZMM_TILE_ROWS`]
    /// where `R` is a multiple of it.
    tile: i32,
}

/// The geometry of `blocks` for the ymm or (`zmm`) zmm loops, or why the
/// emitter cannot take them (rows a multiple of [`TILE_ROWS`]).
fn geometry(blocks: PrefillBlocks, zmm: bool) -> Result<Geometry, EmitError> {
    blocks.check("x86", TILE_ROWS as u32)?;
    let r = blocks.rows as i32;
    Ok(Geometry {
        r,
        c: blocks.keys as i32,
        tile: if zmm && r % ZMM_TILE_ROWS == 0 {
            ZMM_TILE_ROWS
        } else {
            TILE_ROWS
        },
    })
}

impl Geometry {
    /// Bytes between d-chunks of `O` (R rows of 8 f32, one spare cache
    /// line): not a multiple of 2 KiB for the default blocks, so a chunk
    /// loop's lines spread over the L1's sets instead of piling into a few.
    fn qs(self) -> i32 {
        32 * self.r + 64
    }

    /// Bytes between the d-indices of the transposed q, `qt[d][R]` (R f32
    /// and 32 spare bytes: a stride off powers of two, 32-byte aligned).
    fn qts(self) -> i32 {
        4 * self.r + 32
    }

    /// Bytes between keys of the score block `st[C][R]`.
    fn sts(self) -> i32 {
        4 * self.r
    }
}

/// Rows of one score tile: three 8-row vectors (with zmm, where a block's
/// rows are not a multiple of [`ZMM_TILE_ROWS`], a zmm and a ymm).
const TILE_ROWS: i32 = 24;
/// Rows of a zmm score tile: three 16-row vectors, so every FMA takes 16
/// lanes where the 24-row tile's ymm third takes 8 (its scores were 39% of
/// a Llama2-7B f16 prefill's samples at s = 512 on an AMD Zen 5, its P·V,
/// the same FMAs on 16 lanes, 29%).
const ZMM_TILE_ROWS: i32 = 48;
/// Spare bytes after each `kp` / `vp` row (4·d bytes), for the same reason.
const VPAD: i32 = 64;

// 8-byte slots above the decode kernel's frame (its vector constants are
// shared: `attention::constants`).
const P_G: i32 = FRAME;
const P_D8: i32 = FRAME + 8;
const P_VROWB: i32 = FRAME + 16;
const P_BASE: i32 = FRAME + 24;
const P_QTOK: i32 = FRAME + 32;
const P_KSTRIDE: i32 = FRAME + 40;
const P_VSTRIDE: i32 = FRAME + 48;
const P_QP: i32 = FRAME + 56;
const P_O: i32 = FRAME + 64;
const P_S: i32 = FRAME + 72;
const P_KP: i32 = FRAME + 80;
const P_VP: i32 = FRAME + 88;
const P_LIM: i32 = FRAME + 96;
const P_M: i32 = FRAME + 104;
const P_L: i32 = FRAME + 112;
const P_ALPHA: i32 = FRAME + 120;
const P_OPTR: i32 = FRAME + 128;
const P_HEND: i32 = FRAME + 136;
const P_H: i32 = FRAME + 144;
const P_GH: i32 = FRAME + 152;
const P_KROW: i32 = FRAME + 160;
const P_VROW: i32 = FRAME + 168;
const P_KSC: i32 = FRAME + 176;
const P_KOF: i32 = FRAME + 184;
const P_ROWS: i32 = FRAME + 192;
const P_RB: i32 = FRAME + 200;
const P_RN: i32 = FRAME + 208;
const P_RNP: i32 = FRAME + 216;
const P_KEND: i32 = FRAME + 224;
const P_J0: i32 = FRAME + 232;
const P_CNT: i32 = FRAME + 240;
const P_C0: i32 = FRAME + 248;
const P_KSTEP: i32 = FRAME + 256;
const P_LIMI: i32 = FRAME + 272;
const P_KPF: i32 = FRAME + 280;
const P_VPF: i32 = FRAME + 288;
/// Keys ahead the K/V conversion prefetches (rows lie kvh·d apart, a new
/// page per key for large kvh, which the hardware prefetchers do not follow).
const PACK_AHEAD: i32 = 4;
/// 1.0 in every lane (the softmax steps its key index by it).
const PREFILL_FRAME: i32 = FRAME + 320;

/// Emit the causal prefill of `kernel` (formats already checked by
/// [`attention::emit`]) in `blocks`: rows a multiple of the 24-row score
/// tile, keys of 4, each from 4 to 4096. With `zmm` (AVX512F and
/// AVX512VL) the scores and the P·V run on zmm ([`scores`], [`pv`]).
pub(super) fn emit(
    name: &str,
    keys: Keys,
    values: Values,
    header: &str,
    blocks: PrefillBlocks,
    zmm: bool,
) -> Result<MachineCode, EmitError> {
    let g = geometry(blocks, zmm)?;
    let mut a = X86Asm::new();
    a.comment(&format!(
        "{name} x86-{} attention prefill (flash: {}-row × {}-key blocks{}): {header}",
        if zmm { "avx512" } else { "avx2" },
        g.r,
        g.c,
        if zmm { ", zmm scores and P.V" } else { "" }
    ));
    common::prologue_framed(&mut a, PREFILL_FRAME);
    attention::constants(&mut a, tessera_dsl::ir::SoftmaxMode::Online);
    setup(&mut a, g, keys, values);

    let (kv_loop, kv_done) = (a.new_label(), a.new_label());
    a.bind(kv_loop);
    a.load64(RAX, mem(RSP, P_H));
    a.cmp_mem(RAX, mem(RSP, P_HEND));
    a.jcc(Cond::Ge, kv_done);
    kv_setup(&mut a, keys, values);
    let (rb_loop, rb_done) = (a.new_label(), a.new_label());
    a.bind(rb_loop);
    a.load64(RAX, mem(RSP, P_RB));
    a.cmp_mem(RAX, mem(RSP, P_ROWS));
    a.jcc(Cond::Ge, rb_done);
    pack_q(&mut a, g);
    let (kb_loop, kb_done) = (a.new_label(), a.new_label());
    a.zero(RAX);
    a.store64(mem(RSP, P_J0), RAX);
    a.bind(kb_loop);
    a.load64(RAX, mem(RSP, P_J0));
    a.cmp_mem(RAX, mem(RSP, P_KEND));
    a.jcc(Cond::Ge, kb_done);
    pack_kv(&mut a, g, keys, values);
    scores(&mut a, g, zmm);
    softmax_rows(&mut a, g, zmm);
    pv(&mut a, g, zmm);
    a.load64(RAX, mem(RSP, P_J0));
    a.add_imm(RAX, g.c);
    a.store64(mem(RSP, P_J0), RAX);
    a.jmp(kb_loop);
    a.bind(kb_done);
    finish_rows(&mut a, g);
    a.load64(RAX, mem(RSP, P_RB));
    a.add_imm(RAX, g.r);
    a.store64(mem(RSP, P_RB), RAX);
    a.jmp(rb_loop);
    a.bind(rb_done);
    // Next KV head: its first query head is where this one's portion ended.
    a.load64(RAX, mem(RSP, P_H));
    a.load64(RCX, mem(RSP, P_GH));
    a.add(RAX, RCX);
    a.store64(mem(RSP, P_H), RAX);
    a.jmp(kv_loop);
    a.bind(kv_done);
    common::epilogue_framed(&mut a, PREFILL_FRAME);
    let (bytes, listing) = a.finish().map_err(EmitError::Assembler)?;
    Ok(MachineCode {
        head_dim_multiple: attention::HEAD_DIM_MULTIPLE,
        whole_prefill: Some(blocks),
        every_head_state: false,
        ..super::machine_code(bytes, listing)
    })
}

/// Call-wide values: group, strides, the causal base `s − t`, scratch
/// areas (the layout of `prefill_scratch_floats`).
fn setup(a: &mut X86Asm, g: Geometry, keys: Keys, values: Values) {
    a.comment("call setup: group, strides, s - t, scratch areas");
    a.load64(RAX, mem(RDI, AT_HQ));
    a.zero(RDX);
    a.load64(RCX, mem(RDI, AT_KVH));
    a.div(RCX);
    a.store64(mem(RSP, P_G), RAX);
    a.load64(R13, mem(RDI, AT_D));
    a.mov(RAX, R13);
    a.shr_imm(RAX, 3);
    a.store64(mem(RSP, P_D8), RAX);
    a.lea(RAX, mem(R13, VPAD / 4));
    a.shl_imm(RAX, 2);
    a.store64(mem(RSP, P_VROWB), RAX);
    a.load64(RAX, mem(RDI, AT_S));
    a.load64(RDX, mem(RDI, AT_T));
    a.sub(RAX, RDX);
    a.store64(mem(RSP, P_BASE), RAX);
    // Bytes between tokens: q and o hq·d·2; K and V kvh·d·(1 or 2).
    a.load64(RAX, mem(RDI, AT_HQ));
    a.imul(RAX, R13);
    a.shl_imm(RAX, 1);
    a.store64(mem(RSP, P_QTOK), RAX);
    a.load64(RAX, mem(RDI, AT_KVH));
    a.imul(RAX, R13);
    let kb = if keys == Keys::F16 { 2 } else { 1 };
    let vb = if values == Values::F16 { 2 } else { 1 };
    a.imul_imm(RDX, RAX, kb);
    a.store64(mem(RSP, P_KSTRIDE), RDX);
    a.imul_imm(RDX, RDX, PACK_AHEAD);
    a.store64(mem(RSP, P_KPF), RDX);
    a.imul_imm(RDX, RAX, vb);
    a.store64(mem(RSP, P_VSTRIDE), RDX);
    a.imul_imm(RDX, RDX, PACK_AHEAD);
    a.store64(mem(RSP, P_VPF), RDX);
    a.load64(RAX, mem(RDI, AT_KVH));
    a.shl_imm(RAX, 2);
    a.store64(mem(RSP, P_KSTEP), RAX);
    // qt = scratch; O = qt + QTS·d; S = O + 4·(R + 2)·d; kp = S + 4·R·C;
    // vp = kp + C·(4d + VPAD); lim = vp + C·(4d + VPAD); m, l, alpha: + 4·R
    // each; optr, limi: + 8·R each.
    // The areas start on a cache line (the caller's scratch is only
    // f32-aligned): unaligned, every other ymm load would split two lines.
    a.load64(RAX, mem(RDI, AT_SCRATCH));
    a.add_imm(RAX, 63);
    a.and_imm(RAX, -64);
    a.store64(mem(RSP, P_QP), RAX);
    let area = |a: &mut X86Asm, slot: i32, per_d: i32, fixed: i32| {
        if per_d > 0 {
            a.imul_imm(RDX, R13, 4 * per_d);
            a.add(RAX, RDX);
        }
        if fixed > 0 {
            a.add_imm(RAX, 4 * fixed);
        }
        a.store64(mem(RSP, slot), RAX);
    };
    area(a, P_O, g.qts() / 4, 0);
    area(a, P_S, g.qs() / 32, 0);
    area(a, P_KP, 0, g.r * g.c);
    area(a, P_VP, g.c, g.c * VPAD / 4);
    area(a, P_LIM, g.c, g.c * VPAD / 4);
    area(a, P_M, 0, g.r);
    area(a, P_L, 0, g.r);
    area(a, P_ALPHA, 0, g.r);
    area(a, P_OPTR, 0, g.r);
    area(a, P_LIMI, 0, 2 * g.r);
    // Heads of this call.
    a.load64(RAX, mem(RDI, AT_HEAD0));
    a.store64(mem(RSP, P_H), RAX);
    a.load64(RCX, mem(RDI, AT_HEADS));
    a.add(RAX, RCX);
    a.store64(mem(RSP, P_HEND), RAX);
}

/// The KV head of query head `P_H`, the call's heads of its group from
/// there (`P_GH`), its K/V rows and parameters, rows `t·gh`.
fn kv_setup(a: &mut X86Asm, keys: Keys, values: Values) {
    a.comment("kv head: its query heads in this call, K/V row 0, rows = t·gh");
    a.load64(RAX, mem(RSP, P_H));
    a.zero(RDX);
    a.load64(RCX, mem(RSP, P_G));
    a.div(RCX);
    // rax = kv; gh = min(group − h % group, end − h).
    a.mov(RSI, RCX);
    a.sub(RSI, RDX);
    a.load64(RDX, mem(RSP, P_HEND));
    a.load64(RCX, mem(RSP, P_H));
    a.sub(RDX, RCX);
    common::min_reg(a, RSI, RDX);
    a.store64(mem(RSP, P_GH), RSI);
    a.load64(RCX, mem(RDI, AT_T));
    a.imul(RCX, RSI);
    a.store64(mem(RSP, P_ROWS), RCX);
    a.zero(RCX);
    a.store64(mem(RSP, P_RB), RCX);
    attention::kv_head_rows(a, keys, values, [P_KROW, P_VROW, P_KSC, P_KOF]);
}

/// Rows `rb ..` of this KV head: q widened into `qp`, limits, output row
/// pointers, `m`, `l`, `O` reset; padded rows get zero q and the last
/// real row's limit; `P_KEND` = that limit + 1.
fn pack_q(a: &mut X86Asm, g: Geometry) {
    a.comment("row block: q -> qt[d][R] (transposed), limits, o rows; m = -inf, l = 0, O = 0");
    // rn = min(R, rows − rb), rnp = rn rounded up to a score tile.
    a.load64(RAX, mem(RSP, P_ROWS));
    a.load64(RCX, mem(RSP, P_RB));
    a.sub(RAX, RCX);
    common::min_imm(a, RAX, g.r);
    a.store64(mem(RSP, P_RN), RAX);
    a.add_imm(RAX, g.tile - 1);
    a.zero(RDX);
    a.mov_imm(RCX, g.tile);
    a.div(RCX);
    a.imul_imm(RAX, RAX, g.tile);
    a.store64(mem(RSP, P_RNP), RAX);
    // r13 = token, r14 = head in group of row rb.
    a.load64(RAX, mem(RSP, P_RB));
    a.zero(RDX);
    a.load64(RCX, mem(RSP, P_GH));
    a.div(RCX);
    a.mov(R13, RAX);
    a.mov(R14, RDX);
    a.zero(R12);
    let (row, rows_done) = (a.new_label(), a.new_label());
    let (real, store_row) = (a.new_label(), a.new_label());
    let zero = Ymm(15);
    a.vxorps(zero, zero, zero);
    a.bind(row);
    a.cmp_mem(R12, mem(RSP, P_RNP));
    a.jcc(Cond::Ge, rows_done);
    // rdx = qt + 4·r (d-index stride QTS); r8 = O + 32·r (chunk stride QS).
    a.mov(R8, R12);
    a.shl_imm(R8, 5);
    a.load64(RCX, mem(RSP, P_O));
    a.add(R8, RCX);
    a.mov(RDX, R12);
    a.shl_imm(RDX, 2);
    a.load64(RCX, mem(RSP, P_QP));
    a.add(RDX, RCX);
    a.cmp_mem(R12, mem(RSP, P_RN));
    a.jcc(Cond::L, real);
    // Padded row: zero q (its limit is the last real row's: r13 unchanged).
    a.load64(RCX, mem(RSP, P_D8));
    let pad = a.new_label();
    a.bind(pad);
    for k in 0..8 {
        a.vmovss_store(mem(RDX, k * g.qts()), zero);
    }
    a.vmovups_store(mem(R8, 0), zero);
    a.add_imm(RDX, 8 * g.qts());
    a.add_imm(R8, g.qs());
    a.sub_imm(RCX, 1);
    a.jcc(Cond::Ne, pad);
    a.jmp(store_row);
    a.bind(real);
    // q row = q + token·qtok + (h + hi)·d·2; o row likewise.
    a.mov(RAX, R13);
    a.load64(RCX, mem(RSP, P_QTOK));
    a.imul(RAX, RCX);
    a.load64(RSI, mem(RSP, P_H));
    a.add(RSI, R14);
    a.load64(RCX, mem(RDI, AT_D));
    a.imul(RSI, RCX);
    a.shl_imm(RSI, 1);
    a.add(RAX, RSI);
    a.load64(RSI, mem(RDI, AT_O));
    a.add(RSI, RAX);
    a.load64(RCX, mem(RSP, P_OPTR));
    a.mov(R9, R12);
    a.shl_imm(R9, 3);
    a.add(RCX, R9);
    a.store64(mem(RCX, 0), RSI);
    a.load64(RSI, mem(RDI, AT_Q));
    a.add(RSI, RAX);
    // r15 = this head's q row one token on (a row a few rows ahead for
    // GQA, the next row without): prefetched, as its page is new.
    a.load64(R15, mem(RSP, P_QTOK));
    a.add(R15, RSI);
    a.load64(RCX, mem(RSP, P_D8));
    let chunk = a.new_label();
    a.bind(chunk);
    a.prefetcht0(mem(R15, 0));
    a.add_imm(R15, 16);
    a.vcvtph2ps_load(Ymm(0), mem(RSI, 0));
    // Lane k → qt[c + k][r].
    a.vextractf128_hi(Ymm(2), Ymm(0));
    for (half, src) in [(0, Ymm(0)), (4, Ymm(2))] {
        a.vmovss_store(mem(RDX, half * g.qts()), src);
        for (k, imm) in [(1, 0x55u8), (2, 0xaa), (3, 0xff)] {
            a.vpermilps_imm(Ymm(1), src, imm as i8);
            a.vmovss_store(mem(RDX, (half + k) * g.qts()), Ymm(1));
        }
    }
    a.vmovups_store(mem(R8, 0), zero);
    a.add_imm(RSI, 16);
    a.add_imm(RDX, 8 * g.qts());
    a.add_imm(R8, g.qs());
    a.sub_imm(RCX, 1);
    a.jcc(Cond::Ne, chunk);
    a.bind(store_row);
    // lim[r] = s − t + token; m[r] = −inf; l[r] = 0.
    a.load64(RAX, mem(RSP, P_BASE));
    a.add(RAX, R13);
    a.mov(R10, RAX);
    a.load64(RCX, mem(RSP, P_LIMI));
    a.mov(R9, R12);
    a.shl_imm(R9, 3);
    a.add(RCX, R9);
    a.store64(mem(RCX, 0), RAX);
    a.vcvtsi2ss(Ymm(0), RAX);
    a.mov(R9, R12);
    a.shl_imm(R9, 2);
    a.load64(RCX, mem(RSP, P_LIM));
    a.add(RCX, R9);
    a.vmovss_store(mem(RCX, 0), Ymm(0));
    a.load64(RCX, mem(RSP, P_M));
    a.add(RCX, R9);
    a.store32_imm(mem(RCX, 0), f32::NEG_INFINITY.to_bits() as i32);
    a.load64(RCX, mem(RSP, P_L));
    a.add(RCX, R9);
    a.store32_imm(mem(RCX, 0), 0);
    // The last real row's limit + 1 ends the keys this block sees.
    let keep = a.new_label();
    a.cmp_mem(R12, mem(RSP, P_RN));
    a.jcc(Cond::Ge, keep);
    a.add_imm(R10, 1);
    a.store64(mem(RSP, P_KEND), R10);
    // Next real row: hi + 1, wrapping into the next token.
    a.add_imm(R14, 1);
    a.cmp_mem(R14, mem(RSP, P_GH));
    a.jcc(Cond::L, keep);
    a.zero(R14);
    a.add_imm(R13, 1);
    a.bind(keep);
    // A padded row keeps the last real row's token (r13 went one past it
    // only when that row ended a token).
    let next = a.new_label();
    a.mov(RAX, R12);
    a.add_imm(RAX, 1);
    a.cmp_mem(RAX, mem(RSP, P_RN));
    a.jcc(Cond::Ne, next);
    a.load64(R13, mem(RSP, P_KEND));
    a.sub_imm(R13, 1);
    a.load64(RCX, mem(RSP, P_BASE));
    a.sub(R13, RCX);
    a.bind(next);
    a.add_imm(R12, 1);
    a.jmp(row);
    a.bind(rows_done);
}

/// Keys `j0 .. j0 + cnt` of this KV head (cnt = min(C, kend − j0)):
/// K → `kp[C][d]` (keys up to the next multiple of 4 zero), V →
/// `vp[C][d]`, both f32, rows `4·d + VPAD` bytes apart.
fn pack_kv(a: &mut X86Asm, g: Geometry, keys: Keys, values: Values) {
    a.comment("key block: K -> kp[C][d], V -> vp[C][d] (f32)");
    a.load64(RAX, mem(RSP, P_KEND));
    a.load64(RCX, mem(RSP, P_J0));
    a.sub(RAX, RCX);
    common::min_imm(a, RAX, g.c);
    a.store64(mem(RSP, P_CNT), RAX);
    // rsi = K row j0, r8 = V row j0, r9/r10 = key scale/offset of j0.
    a.load64(RAX, mem(RSP, P_J0));
    a.mov(RSI, RAX);
    a.load64(RCX, mem(RSP, P_KSTRIDE));
    a.imul(RSI, RCX);
    a.load64(RCX, mem(RSP, P_KROW));
    a.add(RSI, RCX);
    a.mov(R8, RAX);
    a.load64(RCX, mem(RSP, P_VSTRIDE));
    a.imul(R8, RCX);
    a.load64(RCX, mem(RSP, P_VROW));
    a.add(R8, RCX);
    if keys == Keys::I8Asym {
        a.mov(R9, RAX);
        a.load64(RCX, mem(RSP, P_KSTEP));
        a.imul(R9, RCX);
        a.mov(R10, R9);
        a.load64(RCX, mem(RSP, P_KSC));
        a.add(R9, RCX);
        a.load64(RCX, mem(RSP, P_KOF));
        a.add(R10, RCX);
    }
    if values == Values::E4M3 {
        a.vmovups_load(Ymm(13), mem(RSP, V_SIGN));
        a.vmovups_load(Ymm(14), mem(RSP, V_MAG));
        a.vmovups_load(Ymm(12), mem(RSP, V_2P120));
    }
    // r11 = kp row j, rdx = vp row j.
    a.load64(R11, mem(RSP, P_KP));
    a.load64(RDX, mem(RSP, P_VP));
    a.zero(R12);
    let (key, keys_done) = (a.new_label(), a.new_label());
    a.bind(key);
    a.cmp_mem(R12, mem(RSP, P_CNT));
    a.jcc(Cond::Ge, keys_done);
    if keys == Keys::I8Asym {
        a.vpbroadcastd_load(Ymm(10), mem(R9, 0));
        a.vpbroadcastd_load(Ymm(11), mem(R10, 0));
    }
    a.mov(RAX, RSI);
    a.mov(RBX, R11);
    a.mov(RBP, R8);
    a.mov(R13, RDX);
    // r14, r15: the K and V rows PACK_AHEAD keys on, prefetched.
    a.load64(R14, mem(RSP, P_KPF));
    a.add(R14, RSI);
    a.load64(R15, mem(RSP, P_VPF));
    a.add(R15, R8);
    a.load64(RCX, mem(RSP, P_D8));
    let chunk = a.new_label();
    a.bind(chunk);
    a.prefetcht0(mem(R14, 0));
    a.prefetcht0(mem(R15, 0));
    a.add_imm(R14, if keys == Keys::F16 { 16 } else { 8 });
    a.add_imm(R15, if values == Values::F16 { 16 } else { 8 });
    match keys {
        Keys::F16 => {
            a.vcvtph2ps_load(Ymm(0), mem(RAX, 0));
            a.add_imm(RAX, 16);
        }
        Keys::I8Asym => {
            a.vpmovsxbd_load(Ymm(0), mem(RAX, 0));
            a.vcvtdq2ps(Ymm(0), Ymm(0));
            a.vmulps(Ymm(0), Ymm(0), Ymm(10));
            a.vaddps(Ymm(0), Ymm(0), Ymm(11));
            a.add_imm(RAX, 8);
        }
    }
    a.vmovups_store(mem(RBX, 0), Ymm(0));
    a.add_imm(RBX, 32);
    match values {
        Values::F16 => {
            a.vcvtph2ps_load(Ymm(1), mem(RBP, 0));
            a.add_imm(RBP, 16);
        }
        Values::E4M3 => {
            let (vx, t) = (Ymm(1), Ymm(2));
            a.vpmovzxbd_load(vx, mem(RBP, 0));
            attention::widen_e4m3(a, vx, t, [Ymm(13), Ymm(14), Ymm(12)]);
            a.add_imm(RBP, 8);
        }
    }
    a.vmovups_store(mem(R13, 0), Ymm(1));
    a.add_imm(R13, 32);
    a.sub_imm(RCX, 1);
    a.jcc(Cond::Ne, chunk);
    a.load64(RCX, mem(RSP, P_KSTRIDE));
    a.add(RSI, RCX);
    a.load64(RCX, mem(RSP, P_VSTRIDE));
    a.add(R8, RCX);
    if keys == Keys::I8Asym {
        a.load64(RCX, mem(RSP, P_KSTEP));
        a.add(R9, RCX);
        a.add(R10, RCX);
    }
    a.load64(RCX, mem(RSP, P_VROWB));
    a.add(R11, RCX);
    a.add(RDX, RCX);
    a.add_imm(R12, 1);
    a.jmp(key);
    a.bind(keys_done);
    // Zero keys up to the next multiple of 4 (their scores are masked,
    // but must not be NaN-producing garbage either way).
    let (pad, pad_done) = (a.new_label(), a.new_label());
    let zero = Ymm(15);
    a.vxorps(zero, zero, zero);
    a.bind(pad);
    a.mov(RAX, R12);
    a.and_imm(RAX, 3);
    a.jcc(Cond::E, pad_done);
    a.mov(RBX, R11);
    a.load64(RCX, mem(RSP, P_D8));
    let zc = a.new_label();
    a.bind(zc);
    a.vmovups_store(mem(RBX, 0), zero);
    a.add_imm(RBX, 32);
    a.sub_imm(RCX, 1);
    a.jcc(Cond::Ne, zc);
    a.load64(RCX, mem(RSP, P_VROWB));
    a.add(R11, RCX);
    a.add_imm(R12, 1);
    a.jmp(pad);
    a.bind(pad_done);
}

/// `st[j][r] = qt[·][r] · kp_j` for the block's rows (rnp) and keys (cnt
/// rounded up to 4), in tiles of `g.tile` rows (three row vectors of `qt`:
/// ymm, or with `zmm` zmm where the tile is [`ZMM_TILE_ROWS`], else a zmm
/// and a ymm) × 4 keys (broadcast from their `kp` rows): 12 accumulators,
/// 7 loads per 12 FMAs, no horizontal reduction. Row tiles outer (a tile's
/// `qt` columns, 12 KiB at d = 128 and 24 rows, stay in L1 across the key
/// quads); a quad past the tile's last causal limit ends it (rows are in
/// limit order).
fn scores(a: &mut X86Asm, g: Geometry, zmm: bool) {
    let form = if !zmm {
        ScoreTile::Ymm
    } else if g.tile == ZMM_TILE_ROWS {
        ScoreTile::Zmm
    } else {
        ScoreTile::ZmmYmm
    };
    a.comment(&format!(
        "scores: {}-row x 4-key tiles (rows in lanes{}), st[C][R]",
        g.tile,
        match form {
            ScoreTile::Ymm => "",
            ScoreTile::Zmm => ": three zmm",
            ScoreTile::ZmmYmm => ": a zmm and a ymm",
        }
    ));
    // r14 = tile's first row, r15 = its last row's limit − j0, r12 = quad.
    a.zero(R14);
    let (tile, tiles_done) = (a.new_label(), a.new_label());
    a.bind(tile);
    a.cmp_mem(R14, mem(RSP, P_RNP));
    a.jcc(Cond::Ge, tiles_done);
    a.mov(RAX, R14);
    a.shl_imm(RAX, 3);
    a.load64(RCX, mem(RSP, P_LIMI));
    a.add(RAX, RCX);
    a.load64(R15, mem(RAX, 8 * (g.tile - 1)));
    a.load64(RCX, mem(RSP, P_J0));
    a.sub(R15, RCX);
    a.zero(R12);
    let (quad, quads_done) = (a.new_label(), a.new_label());
    a.bind(quad);
    a.cmp_mem(R12, mem(RSP, P_CNT));
    a.jcc(Cond::Ge, quads_done);
    a.cmp(R12, R15);
    a.jcc(Cond::G, quads_done);
    for v in form.vectors() {
        for j in 0..4 {
            v.zero(a, form.acc(v.index, j));
        }
    }
    // rsi = qt + 4·r0; r8..r11 = kp rows j .. j+3; rcx = d/8.
    a.mov(RSI, R14);
    a.shl_imm(RSI, 2);
    a.load64(RAX, mem(RSP, P_QP));
    a.add(RSI, RAX);
    a.load64(RDX, mem(RSP, P_VROWB));
    a.mov(R8, R12);
    a.imul(R8, RDX);
    a.load64(RAX, mem(RSP, P_KP));
    a.add(R8, RAX);
    a.lea(R9, mem(R8, 0));
    a.add(R9, RDX);
    a.lea(R10, mem(R9, 0));
    a.add(R10, RDX);
    a.lea(R11, mem(R10, 0));
    a.add(R11, RDX);
    a.load64(RCX, mem(RSP, P_D8));
    let step = a.new_label();
    a.bind(step);
    let (q, kx) = (|v: u8| 12 + v, 15);
    for k in 0..8 {
        for v in form.vectors() {
            v.load(a, q(v.index), mem(RSI, k * g.qts() + v.offset));
        }
        for (j, base) in [R8, R9, R10, R11].into_iter().enumerate() {
            // One broadcast a key; its low 8 lanes serve a ymm vector.
            form.broadcast(a, kx, mem(base, 4 * k));
            for v in form.vectors() {
                v.fma(a, form.acc(v.index, j as u8), q(v.index), kx);
            }
        }
    }
    a.add_imm(RSI, 8 * g.qts());
    for base in [R8, R9, R10, R11] {
        a.add_imm(base, 32);
    }
    a.sub_imm(RCX, 1);
    a.jcc(Cond::Ne, step);
    // st + j·STS + 4·r0: key j's rows, each vector at its row offset.
    a.mov(RAX, R12);
    a.imul_imm(RAX, RAX, g.sts());
    a.mov(RCX, R14);
    a.shl_imm(RCX, 2);
    a.add(RAX, RCX);
    a.load64(RCX, mem(RSP, P_S));
    a.add(RAX, RCX);
    for j in 0..4u8 {
        for v in form.vectors() {
            v.store(
                a,
                mem(RAX, g.sts() * j as i32 + v.offset),
                form.acc(v.index, j),
            );
        }
    }
    a.add_imm(R12, 4);
    a.jmp(quad);
    a.bind(quads_done);
    a.add_imm(R14, g.tile);
    a.jmp(tile);
    a.bind(tiles_done);
}

/// The register forms of a score tile's row vectors: three ymm (24 rows),
/// three zmm (48), or a zmm and a ymm (24 rows, 16–23 in the ymm; zmm
/// blocks whose rows are not a multiple of 48). Accumulator (v, j) of
/// vector v and key j is register 4v + j, q's vectors 12–14, the broadcast
/// 15.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ScoreTile {
    Ymm,
    Zmm,
    ZmmYmm,
}

/// One row vector of a score tile: its register index, width and byte
/// offset within the tile's rows.
#[derive(Clone, Copy)]
struct RowVector {
    index: u8,
    wide: bool,
    offset: i32,
}

impl ScoreTile {
    fn vectors(self) -> Vec<RowVector> {
        let widths = match self {
            ScoreTile::Ymm => [false; 3].to_vec(),
            ScoreTile::Zmm => [true; 3].to_vec(),
            ScoreTile::ZmmYmm => vec![true, false],
        };
        let mut offset = 0;
        widths
            .into_iter()
            .enumerate()
            .map(|(i, wide)| {
                let v = RowVector {
                    index: i as u8,
                    wide,
                    offset,
                };
                offset += if wide { 64 } else { 32 };
                v
            })
            .collect()
    }

    fn acc(self, v: u8, j: u8) -> u8 {
        4 * v + j
    }

    /// Register `r` = the dword at `m` in every lane of the tile's widest
    /// vector.
    fn broadcast(self, a: &mut X86Asm, r: u8, m: Mem) {
        if self == ScoreTile::Ymm {
            a.vpbroadcastd_load(Ymm(r), m);
        } else {
            a.vbroadcastss_zmm_load(Zmm(r), m);
        }
    }
}

impl RowVector {
    fn zero(self, a: &mut X86Asm, r: u8) {
        if self.wide {
            a.vpxord_zmm(Zmm(r), Zmm(r), Zmm(r));
        } else {
            a.vxorps(Ymm(r), Ymm(r), Ymm(r));
        }
    }

    fn load(self, a: &mut X86Asm, r: u8, m: Mem) {
        if self.wide {
            a.vmovups_zmm_load(Zmm(r), m);
        } else {
            a.vmovups_load(Ymm(r), m);
        }
    }

    fn fma(self, a: &mut X86Asm, acc: u8, x: u8, y: u8) {
        if self.wide {
            a.vfmadd231ps_zmm(Zmm(acc), Zmm(x), Zmm(y));
        } else {
            a.vfmadd231ps(Ymm(acc), Ymm(x), Ymm(y));
        }
    }

    fn store(self, a: &mut X86Asm, m: Mem, r: u8) {
        if self.wide {
            a.vmovups_zmm_store(m, Zmm(r));
        } else {
            a.vmovups_store(m, Ymm(r));
        }
    }
}

/// Per row vector (rows in lanes, no horizontal work): keys past each
/// row's limit → −∞, the block max, the running max `m'`, `α = e^(m −
/// m')`, `p = e^(S − m')` in place (masked keys exactly 0), `l = α·l + Σp`.
/// 8 rows a ymm; with `zmm` 16 a zmm while 16 are left, then a last 8-row
/// half by ymm (the softmax was 12% of a Llama2-7B f16 prefill's samples
/// on ymm alone).
fn softmax_rows(a: &mut X86Asm, g: Geometry, zmm: bool) {
    a.comment(if zmm {
        "online softmax, 16 rows a zmm (8 a ymm for a last half): mask, max, alpha, p, l"
    } else {
        "online softmax, 8 rows a vector: mask, max, alpha, p, l"
    });
    a.vmovups_load(Ymm(SM_NEGINF), mem(RSP, V_NEGINF));
    a.vmovups_load(EXP_REGS[3], mem(RSP, V_127));
    a.load64(RAX, mem(RSP, P_J0));
    a.vcvtsi2ss(Ymm(SM_J0), RAX);
    a.vbroadcastss_reg(Ymm(SM_J0), Ymm(SM_J0));
    // r12 = the vector's byte offset in the per-row arrays (4 a row).
    a.zero(R12);
    if zmm {
        softmax_vectors(a, g, RowLanes::Zmm);
    }
    softmax_vectors(a, g, RowLanes::Ymm);
}

// The softmax's registers (indices; ymm or zmm by [`RowLanes`]); the
// exponentials take `EXP_REGS`' (1, 2, 4, 5).
const SM_X: u8 = 0;
const SM_MOLD: u8 = 6;
const SM_LNEW: u8 = 7;
const SM_SUM: u8 = 9;
const SM_MNEW: u8 = 10;
const SM_KV: u8 = 11;
const SM_MMAX: u8 = 12;
const SM_LIM: u8 = 13;
const SM_J0: u8 = 14;
const SM_NEGINF: u8 = 15;

/// The softmax's row vectors while whole ones are left from r12 (left at
/// the first row not taken): the steps of [`softmax_rows`], their masks
/// and constants as `lanes` keeps them.
fn softmax_vectors(a: &mut X86Asm, g: Geometry, lanes: RowLanes) {
    let [x, mold, lnew, sum, mnew, mmax, lim] =
        [SM_X, SM_MOLD, SM_LNEW, SM_SUM, SM_MNEW, SM_MMAX, SM_LIM];
    lanes.prepare(a);
    let row_array = |a: &mut X86Asm, slot: i32| {
        a.load64(RAX, mem(RSP, slot));
        a.add(RAX, R12);
    };
    let (vec, vecs_done) = (a.new_label(), a.new_label());
    a.bind(vec);
    lanes.exit_unless_whole(a, vecs_done);
    row_array(a, P_LIM);
    lanes.load(a, lim, mem(RAX, 0));
    row_array(a, P_M);
    lanes.load(a, mold, mem(RAX, 0));
    lanes.start_keys(a);
    // Pass 1 over the block's keys: mask, store, max.
    a.load64(RSI, mem(RSP, P_S));
    a.add(RSI, R12);
    a.load64(RCX, mem(RSP, P_CNT));
    let pass1 = a.new_label();
    a.bind(pass1);
    lanes.load(a, x, mem(RSI, 0));
    lanes.mask_past_limits(a);
    lanes.store(a, mem(RSI, 0), x);
    lanes.op(a, Op3::Max, mmax, mmax, x);
    lanes.next_key(a);
    a.add_imm(RSI, g.sts());
    a.sub_imm(RCX, 1);
    a.jcc(Cond::Ne, pass1);
    // m' = max(m, block max); α = e^(m − m'); l·α.
    lanes.op(a, Op3::Max, mnew, mmax, mold);
    row_array(a, P_M);
    lanes.store(a, mem(RAX, 0), mnew);
    lanes.op(a, Op3::Sub, x, mold, mnew);
    lanes.exp(a);
    row_array(a, P_ALPHA);
    lanes.store(a, mem(RAX, 0), EXP_REGS[2].0);
    row_array(a, P_L);
    lanes.scale_by_mem(a, lnew, EXP_REGS[2].0, mem(RAX, 0));
    // Pass 2: p = e^(S − m'), Σp; masked keys (−∞ − m' = −∞) and anything
    // below e^-87 exactly 0, a NaN kept.
    lanes.zero(a, sum);
    a.load64(RSI, mem(RSP, P_S));
    a.add(RSI, R12);
    a.load64(RCX, mem(RSP, P_CNT));
    let pass2 = a.new_label();
    a.bind(pass2);
    lanes.load(a, x, mem(RSI, 0));
    lanes.op(a, Op3::Sub, x, x, mnew);
    lanes.mark_under_floor(a);
    lanes.exp(a);
    lanes.zero_under_floor(a);
    lanes.op(a, Op3::Add, sum, sum, EXP_REGS[2].0);
    lanes.store(a, mem(RSI, 0), EXP_REGS[2].0);
    a.add_imm(RSI, g.sts());
    a.sub_imm(RCX, 1);
    a.jcc(Cond::Ne, pass2);
    lanes.op(a, Op3::Add, lnew, lnew, sum);
    lanes.store(a, mem(RAX, 0), lnew);
    a.add_imm(R12, lanes.bytes());
    a.jmp(vec);
    a.bind(vecs_done);
}

/// The register file of [`softmax_vectors`]: 8 rows a ymm, masks in
/// vectors (ymm3, the floor's in ymm8) and constants from the frame; or
/// 16 rows a zmm, masks in k1/k2 and constants in registers (1.0 in zmm16,
/// the floor in zmm17; −∞, j0 and 127 widened in place, their low halves
/// unchanged for the ymm vectors after).
#[derive(Clone, Copy, PartialEq, Eq)]
enum RowLanes {
    Ymm,
    Zmm,
}

#[derive(Clone, Copy)]
enum Op3 {
    Add,
    Sub,
    Max,
}

const SM_ONE: Zmm = Zmm(16);
const SM_FLOOR: Zmm = Zmm(17);

impl RowLanes {
    fn bytes(self) -> i32 {
        match self {
            RowLanes::Ymm => 32,
            RowLanes::Zmm => 64,
        }
    }

    fn prepare(self, a: &mut X86Asm) {
        if self == RowLanes::Zmm {
            let j0 = Zmm(SM_J0);
            a.vshufi32x4_zmm(j0, j0, j0, 0x44);
            a.vbroadcastss_zmm_load(Zmm(SM_NEGINF), mem(RSP, V_NEGINF));
            a.vpbroadcastd_zmm_load(Zmm(EXP_REGS[3].0), mem(RSP, V_127));
            a.vbroadcastss_zmm_load(SM_ONE, mem(RSP, V_ONE));
            a.vbroadcastss_zmm_load(SM_FLOOR, mem(RSP, V_MIN));
        }
    }

    /// To `done` unless a whole vector of rows is left from r12.
    fn exit_unless_whole(self, a: &mut X86Asm, done: Label) {
        a.mov(RAX, R12);
        a.shr_imm(RAX, 2);
        match self {
            RowLanes::Ymm => {
                a.cmp_mem(RAX, mem(RSP, P_RNP));
                a.jcc(Cond::Ge, done);
            }
            RowLanes::Zmm => {
                a.add_imm(RAX, 16);
                a.cmp_mem(RAX, mem(RSP, P_RNP));
                a.jcc(Cond::G, done);
            }
        }
    }

    fn load(self, a: &mut X86Asm, r: u8, m: Mem) {
        match self {
            RowLanes::Ymm => a.vmovups_load(Ymm(r), m),
            RowLanes::Zmm => a.vmovups_zmm_load(Zmm(r), m),
        }
    }

    fn store(self, a: &mut X86Asm, m: Mem, r: u8) {
        match self {
            RowLanes::Ymm => a.vmovups_store(m, Ymm(r)),
            RowLanes::Zmm => a.vmovups_zmm_store(m, Zmm(r)),
        }
    }

    fn zero(self, a: &mut X86Asm, r: u8) {
        match self {
            RowLanes::Ymm => a.vxorps(Ymm(r), Ymm(r), Ymm(r)),
            RowLanes::Zmm => a.vpxord_zmm(Zmm(r), Zmm(r), Zmm(r)),
        }
    }

    fn op(self, a: &mut X86Asm, op: Op3, d: u8, x: u8, y: u8) {
        match (self, op) {
            (RowLanes::Ymm, Op3::Add) => a.vaddps(Ymm(d), Ymm(x), Ymm(y)),
            (RowLanes::Ymm, Op3::Sub) => a.vsubps(Ymm(d), Ymm(x), Ymm(y)),
            (RowLanes::Ymm, Op3::Max) => a.vmaxps(Ymm(d), Ymm(x), Ymm(y)),
            (RowLanes::Zmm, Op3::Add) => a.vaddps_zmm(Zmm(d), Zmm(x), Zmm(y)),
            (RowLanes::Zmm, Op3::Sub) => a.vsubps_zmm(Zmm(d), Zmm(x), Zmm(y)),
            (RowLanes::Zmm, Op3::Max) => a.vmaxps_zmm(Zmm(d), Zmm(x), Zmm(y)),
        }
    }

    /// The key index = j0 in every lane, the block max −∞.
    fn start_keys(self, a: &mut X86Asm) {
        match self {
            RowLanes::Ymm => {
                a.vxorps(Ymm(SM_KV), Ymm(SM_KV), Ymm(SM_KV));
                a.vaddps(Ymm(SM_KV), Ymm(SM_KV), Ymm(SM_J0));
                a.vmovups_load(Ymm(SM_MMAX), mem(RSP, V_NEGINF));
            }
            RowLanes::Zmm => {
                a.vmovaps_zmm_masked(Zmm(SM_KV), Kreg(0), Zmm(SM_J0), false);
                a.vmovaps_zmm_masked(Zmm(SM_MMAX), Kreg(0), Zmm(SM_NEGINF), false);
            }
        }
    }

    fn next_key(self, a: &mut X86Asm) {
        match self {
            RowLanes::Ymm => a.vaddps_mem(Ymm(SM_KV), Ymm(SM_KV), mem(RSP, V_ONE)),
            RowLanes::Zmm => a.vaddps_zmm(Zmm(SM_KV), Zmm(SM_KV), SM_ONE),
        }
    }

    /// x = −∞ where the key is past the row's limit (ordered `>`).
    fn mask_past_limits(self, a: &mut X86Asm) {
        let (x, kv, lim, neginf) = (SM_X, SM_KV, SM_LIM, SM_NEGINF);
        match self {
            RowLanes::Ymm => {
                let mask = Ymm(3);
                a.vcmpps(mask, Ymm(kv), Ymm(lim), 14);
                a.vandnps(Ymm(x), mask, Ymm(x));
                a.vandps(Ymm(1), mask, Ymm(neginf));
                a.vorps(Ymm(x), Ymm(x), Ymm(1));
            }
            RowLanes::Zmm => {
                a.vcmpps_zmm_k(Kreg(1), Zmm(kv), Zmm(lim), 14);
                a.vmovaps_zmm_masked(Zmm(x), Kreg(1), Zmm(neginf), false);
            }
        }
    }

    /// `d = p · [m]`.
    fn scale_by_mem(self, a: &mut X86Asm, d: u8, p: u8, m: Mem) {
        match self {
            RowLanes::Ymm => a.vmulps_mem(Ymm(d), Ymm(p), m),
            RowLanes::Zmm => {
                a.vmovups_zmm_load(Zmm(d), m);
                a.vmulps_zmm(Zmm(d), Zmm(p), Zmm(d));
            }
        }
    }

    /// Before the exponentials: which lanes of x lie under e^-87's
    /// exponent (ymm8 set there; k2 set where they do not, NaN included).
    fn mark_under_floor(self, a: &mut X86Asm) {
        match self {
            RowLanes::Ymm => {
                a.vmovups_load(Ymm(8), mem(RSP, V_MIN));
                a.vcmpps(Ymm(8), Ymm(SM_X), Ymm(8), 1); // x < min (ordered)
            }
            RowLanes::Zmm => a.vcmpps_zmm_k(Kreg(2), Zmm(SM_X), SM_FLOOR, 5), // not less (unordered)
        }
    }

    /// p = 0 in the lanes [`Self::mark_under_floor`] marked.
    fn zero_under_floor(self, a: &mut X86Asm) {
        let p = EXP_REGS[2].0;
        match self {
            RowLanes::Ymm => a.vandnps(Ymm(p), Ymm(8), Ymm(p)),
            RowLanes::Zmm => a.vmovaps_zmm_masked(Zmm(p), Kreg(2), Zmm(p), true),
        }
    }

    /// p = e^x (x, and the exponentials' n and f, clobbered).
    fn exp(self, a: &mut X86Asm) {
        let [n, f, p, k127] = EXP_REGS;
        match self {
            RowLanes::Ymm => exp_ps(a, Ymm(SM_X), n, f, p, k127),
            RowLanes::Zmm => {
                let z = |r: Ymm| Zmm(r.0);
                exp_ps(a, Zmm(SM_X), z(n), z(f), z(p), z(k127));
            }
        }
    }
}

/// `O = α·O + P·V` over the block's `cnt` keys: groups of chunks (outer:
/// their V columns stay in L1) × row triples. On ymm a group is up to 4
/// 8-lane chunks; with `zmm` up to [`ZMM_PV_CHUNKS`] 16-lane chunks (each
/// two of `O`'s 8-lane chunks), so an FMA takes 16 lanes and each key's p
/// broadcasts serve twice the lanes, and a last odd 8-lane chunk (d an
/// odd multiple of 8) takes the ymm pass.
fn pv(a: &mut X86Asm, g: Geometry, zmm: bool) {
    // (8-lane chunks, on zmm) of each pass, widest first: a group takes
    // the first whose chunks are left.
    let passes: Vec<(usize, bool)> = if zmm {
        (1..=ZMM_PV_CHUNKS)
            .rev()
            .map(|nz| (2 * nz, true))
            .chain([(1, false)])
            .collect()
    } else {
        (1..=4).rev().map(|nc| (nc, false)).collect()
    };
    a.comment(if zmm {
        "P.V on zmm: up to 8 16-lane chunks x 3-row passes, O = alpha.O + P.V"
    } else {
        "P.V: 4-chunk groups x 3-row passes, O = alpha.O + P.V"
    });
    a.zero(RAX);
    a.store64(mem(RSP, P_C0), RAX);
    let (group, groups_done) = (a.new_label(), a.new_label());
    a.bind(group);
    a.load64(RAX, mem(RSP, P_C0));
    a.cmp_mem(RAX, mem(RSP, P_D8));
    a.jcc(Cond::Ge, groups_done);
    // rdx = 8-lane chunks left (at least 1).
    a.load64(RDX, mem(RSP, P_D8));
    a.sub(RDX, RAX);
    let labels: Vec<Label> = passes.iter().map(|_| a.new_label()).collect();
    for (&(chunks, _), l) in passes.iter().zip(&labels).take(passes.len() - 1) {
        a.cmp_imm(RDX, chunks as i32);
        a.jcc(Cond::Ge, *l);
    }
    a.jmp(labels[passes.len() - 1]);
    for (&(chunks, on_zmm), l) in passes.iter().zip(&labels) {
        a.bind(*l);
        if on_zmm {
            pv_rows_zmm(a, g, chunks / 2);
        } else {
            pv_rows(a, g, chunks);
        }
        a.load64(RAX, mem(RSP, P_C0));
        a.add_imm(RAX, chunks as i32);
        a.store64(mem(RSP, P_C0), RAX);
        a.jmp(group);
    }
    a.bind(groups_done);
}

/// Most 16-lane chunks one zmm P·V pass holds for three rows: 24
/// accumulators, 3 p broadcasts and a V chunk in zmm0–27.
const ZMM_PV_CHUNKS: usize = 8;

/// Every row triple of the block over the 8-lane chunks `c0 .. c0 + 2·nz`
/// on zmm: accumulator (r, c) holds `O`'s chunks 2c and 2c + 1 of row r,
/// loaded and stored as two halves.
fn pv_rows_zmm(a: &mut X86Asm, g: Geometry, nz: usize) {
    let zmm_registers = crate::target::TargetCaps::by_name(super::AVX512_NAME)
        .expect("x86 targets are built in")
        .registers as usize;
    assert!(3 * ZMM_PV_CHUNKS + 4 <= zmm_registers, "zmm P·V registers");
    let acc = |r: usize, c: usize| Zmm((r * nz + c) as u8);
    let p = |r: usize| Zmm((3 * ZMM_PV_CHUNKS + r) as u8);
    let vx = Zmm(3 * ZMM_PV_CHUNKS as u8 + 3);
    let half =
        |c: usize, hi: usize, r: usize| mem(RDX, g.qs() * (2 * c + hi) as i32 + 32 * r as i32);
    row_triples(
        a,
        |a| {
            for r in 0..3 {
                for c in 0..nz {
                    a.vmovups_ymm_evex_load(Ymm(acc(r, c).0), half(c, 0, r));
                    a.vinsertf64x4_hi_mem(acc(r, c), acc(r, c), half(c, 1, r));
                    a.vmulps_zmm_bcst(acc(r, c), acc(r, c), mem(RAX, 4 * r as i32));
                }
            }
        },
        |a| {
            for r in 0..3 {
                a.vbroadcastss_zmm_load(p(r), mem(RSI, 4 * r as i32));
            }
            for c in 0..nz {
                a.vmovups_zmm_load(vx, mem(RAX, 64 * c as i32));
                for r in 0..3 {
                    a.vfmadd231ps_zmm(acc(r, c), vx, p(r));
                }
            }
        },
        |a| {
            for r in 0..3 {
                for c in 0..nz {
                    a.vmovups_ymm_evex_store(half(c, 0, r), Ymm(acc(r, c).0));
                    a.vextractf64x4_hi_store(half(c, 1, r), acc(r, c));
                }
            }
        },
        g,
    );
}

/// Every row triple of the block over chunks `c0 .. c0 + nc`.
fn pv_rows(a: &mut X86Asm, g: Geometry, nc: usize) {
    let acc = |r: usize, c: usize| Ymm((r * nc + c) as u8);
    let p = |r: usize| Ymm((12 + r) as u8);
    let vx = Ymm(15);
    row_triples(
        a,
        |a| {
            for r in 0..3 {
                a.vpbroadcastd_load(p(r), mem(RAX, 4 * r as i32));
                for c in 0..nc {
                    a.vmulps_mem(acc(r, c), p(r), mem(RDX, g.qs() * c as i32 + 32 * r as i32));
                }
            }
        },
        |a| {
            for r in 0..3 {
                a.vpbroadcastd_load(p(r), mem(RSI, 4 * r as i32));
            }
            for c in 0..nc {
                a.vmovups_load(vx, mem(RAX, 32 * c as i32));
                for r in 0..3 {
                    a.vfmadd231ps(acc(r, c), vx, p(r));
                }
            }
        },
        |a| {
            for r in 0..3 {
                for c in 0..nc {
                    a.vmovups_store(mem(RDX, g.qs() * c as i32 + 32 * r as i32), acc(r, c));
                }
            }
        },
        g,
    );
}

/// The row-triple loop of a P·V pass, its register file's parts given:
/// `scale` sets the accumulators to α·O (rdx = `O + c0·QS + 32·r`, rax =
/// the triple's α), `key` adds one key's p·V (rsi = its p of row r, rax =
/// its V row at chunk c0), `store` writes the accumulators back to `O` at
/// rdx. A triple whose rows see no key of the block is skipped (every p
/// is 0 and α = e^0 = 1 exactly, so O stays).
fn row_triples(
    a: &mut X86Asm,
    scale: impl Fn(&mut X86Asm),
    key: impl Fn(&mut X86Asm),
    store: impl Fn(&mut X86Asm),
    g: Geometry,
) {
    a.zero(R12);
    let (triple, triples_done) = (a.new_label(), a.new_label());
    a.bind(triple);
    a.cmp_mem(R12, mem(RSP, P_RNP));
    a.jcc(Cond::Ge, triples_done);
    // r8 = keys this triple sees in the block: min(cnt, lim(r+2) − j0 + 1)
    // (rows are in limit order; later keys have p = 0 for all three).
    let next_triple = a.new_label();
    a.mov(RAX, R12);
    a.shl_imm(RAX, 3);
    a.load64(RCX, mem(RSP, P_LIMI));
    a.add(RAX, RCX);
    a.load64(R8, mem(RAX, 16));
    a.load64(RCX, mem(RSP, P_J0));
    a.sub(R8, RCX);
    a.add_imm(R8, 1);
    a.cmp_imm(R8, 0);
    a.jcc(Cond::Le, next_triple);
    common::min_mem(a, R8, mem(RSP, P_CNT));
    // rdx = O + c0·QS + 32·r.
    a.load64(RAX, mem(RSP, P_C0));
    a.imul_imm(RAX, RAX, g.qs());
    a.mov(RCX, R12);
    a.shl_imm(RCX, 5);
    a.add(RAX, RCX);
    a.load64(RDX, mem(RSP, P_O));
    a.add(RDX, RAX);
    // rax = α of the triple's first row.
    a.mov(RAX, R12);
    a.shl_imm(RAX, 2);
    a.load64(RCX, mem(RSP, P_ALPHA));
    a.add(RAX, RCX);
    scale(a);
    // rsi = p of (key 0, r) (key stride STS); rax = vp + 32·c0 (row
    // stride 4·d + VPAD); r8 = keys.
    a.mov(RSI, R12);
    a.shl_imm(RSI, 2);
    a.load64(RAX, mem(RSP, P_S));
    a.add(RSI, RAX);
    a.load64(RAX, mem(RSP, P_C0));
    a.shl_imm(RAX, 5);
    a.load64(RCX, mem(RSP, P_VP));
    a.add(RAX, RCX);
    a.load64(RCX, mem(RSP, P_VROWB));
    let top = a.new_label();
    a.bind(top);
    key(a);
    a.add_imm(RSI, g.sts());
    a.add(RAX, RCX);
    a.sub_imm(R8, 1);
    a.jcc(Cond::Ne, top);
    store(a);
    a.bind(next_triple);
    a.add_imm(R12, 3);
    a.jmp(triple);
    a.bind(triples_done);
}

/// `o = O / l` to f16 for the block's real rows.
fn finish_rows(a: &mut X86Asm, g: Geometry) {
    a.comment("o = O / l (f16) for the real rows");
    a.zero(R12);
    let (row, rows_done) = (a.new_label(), a.new_label());
    a.bind(row);
    a.cmp_mem(R12, mem(RSP, P_RN));
    a.jcc(Cond::Ge, rows_done);
    a.mov(RAX, R12);
    a.shl_imm(RAX, 2);
    a.load64(RCX, mem(RSP, P_L));
    a.add(RAX, RCX);
    a.vpbroadcastd_load(Ymm(1), mem(RAX, 0));
    a.mov(RAX, R12);
    a.shl_imm(RAX, 3);
    a.load64(RCX, mem(RSP, P_OPTR));
    a.add(RAX, RCX);
    a.load64(RSI, mem(RAX, 0));
    a.mov(RDX, R12);
    a.shl_imm(RDX, 5);
    a.load64(RCX, mem(RSP, P_O));
    a.add(RDX, RCX);
    attention::store_normalized_row(a, mem(RSP, P_D8), attention::Stride::Bytes(g.qs()));
    a.add_imm(R12, 1);
    a.jmp(row);
    a.bind(rows_done);
}
