//! Decode attention on x86 (AVX2, FMA, F16C), ABI
//! [`crate::host_attention::AttentionArgs`]: one query token, GQA, keys f16
//! or `i8asym:row`, values f16 or fp8 e4m3, softmax in f32 as the
//! interpreter defines it. Memory-bound by design: each K and V row of a
//! KV head is read once for all the query heads of its group that the call
//! computes, and the rows of every KV head of the call are read in token
//! order.
//!
//! The call's query heads are cut into tiles (up to [`MAX_TILE`] heads of
//! one KV head: the lanes of a ymm), each with a record and areas in the
//! scratch (its rows, cursors, softmax state, q, `num`, scores). Then:
//!
//! 1. Per tile, q of each head widened to f32, interleaved by 8-lane chunk
//!    of d (`qarea[d/8][8 heads][8]`), so a chunk's heads sit at constant
//!    offsets. For int8 keys q is instead rounded per head to i16 (scale
//!    `max|q| / 32767`, 32639 in the zmm forms) in chunks of 16 d, with
//!    `Σq` per head; for the
//!    zmm score loop in chunks of 32 d (`qarea[⌈d/32⌉][8 heads][32]`).
//! 2. The keys in super-blocks of [`DECODE_SUPER_BLOCK`], each in three
//!    passes over every tile. Going tile by tile within a block of keys,
//!    not key by key within a tile, is what reads the cache in token order:
//!    one KV head's rows are `kvh·d` elements apart, a walk the hardware
//!    prefetchers follow poorly.
//!    - Scores in blocks of [`SCORE_BLOCK`] keys: per key, one K row load
//!      per 8 lanes of d (`vcvtph2ps`) feeds an FMA per head, or for int8
//!      keys per 16 lanes one `vpmovsxbw` an integer dot per head
//!      ([`KeyDot`]); the heads' partial dots are reduced together (a
//!      `vhaddps` tree) into one vector of 8 heads' scores, `sarea[j][8]`.
//!      A tile of one head (multi-head attention) takes the block's 4 keys
//!      at once instead and keeps its scores side by side; a tile of 5 or
//!      6 heads (GQA 6) takes keys two at a time, so each q chunk is loaded
//!      once for both (`key_pairs`). With AVX512-VNNI
//!      ([`DecodeIsa::zmm_scores`]) a tile of several heads takes its keys
//!      two at a time on zmm instead, 32 lanes of d a `vpdpwssd` for int8
//!      keys or 16 a `vfmadd231ps` for f16 keys (q then in 16-d chunks,
//!      `qarea[⌈d/16⌉][8 heads][16]`), the 16 sums reduced by one shuffle
//!      tree (`key_pairs_zmm`); for int8 keys of a tile of 4 to 7 heads
//!      ([`DecodeIsa::lane_scores`]) 16 at a time, a key in each dword
//!      lane, the rows transposed in registers (`lane_scores`); with
//!      AMX-INT8 too ([`DecodeIsa::amx_scores`]) 32 at a time by tile
//!      products, q's codes in two int8 parts (`amx_scores`). int8
//!      keys: `score = scale·(q scale·(q₁₆·c)) + offset·Σq`. Each tile
//!      keeps per head the running
//!      max and whether every `score − phi` lay in `[lo, hi]`.
//!    - Per tile, the reference: `phi` while the async softmax's range
//!      held, else the running max (online kernels: the max). Where it
//!      moved since the last super-block, `num` and `den` are rescaled by
//!      `e^(old − new)`; then `p = e^(score − reference)` (degree-6
//!      polynomial as the cranelift `exp`; 8 heads or, one head, 8 keys a
//!      vector; with `zmm_scores`, several heads take two keys a zmm),
//!      `den` summed.
//!    - P·V in blocks of 8–32 keys (`pv_block`): accumulators of up to
//!      3 heads × a group of 8-lane chunks (up to 8, as the heads per pass
//!      leave registers; 16 for one head in ymm0–31) live in registers
//!      across the block, in `num[d/8][9][8]` between blocks. fp8 values
//!      in ymm0–15 take every head of a tile a pass instead, fewer chunks a
//!      group, so each key's values are widened once (`pv_pass`). fp8 e4m3
//!      bytes become f32 bits of 2^-120 of the value in a register
//!      (sign-extended, shifted, one mask; exact, subnormals included), p
//!      is stored × 2^64 and `num` scaled by 2^56 where the tile finishes
//!      (`PvRegisters::fp8_f32`); where the async range is too wide for
//!      that scale they become f16 bits of 2^-8 of the value, stored and
//!      converted from memory as f16 values are, p × 2^8. With AVX512VL
//!      ([`DecodeIsa::ymm32`]) a pass takes up to 6 heads in ymm0–31, and
//!      a tile of several heads takes f16 values, or fp8 values widened to
//!      f32, by f32 FMAs on zmm, 16 lanes of d each (`pv_pass_zmm`: a hot
//!      Qwen2-1.5B f16 call 1.16–1.24× faster on Zen 5, a kv8 one 1.2×
//!      against the bf16 dots). Two packed forms replace the f32 FMAs for
//!      fp8 values where the autotuner measured them faster
//!      ([`super::X86Backend::with_fp8_values_packed`]), both rounding p
//!      to a 16-bit type for its products as FlashAttention does: with
//!      AVX512_BF16 and AVX512_VBMI ([`DecodeIsa::bf16_values`])
//!      `vdpbf16ps` on key pairs, looked up as bf16 by `vpermi2b`, p
//!      rounded to bf16 (`pv_pass_bf16`, `bf16_pairs`: o within 2^-8 of
//!      max |v|); with AVX512-FP16 ([`DecodeIsa::f16_pv`]),
//!      for f16 values too, f16 FMAs on a tile of several heads, 32 lanes
//!      of d each on zmm, p against the running max as f16 and f16 sums per
//!      `pv_block_f16` keys (`pv_pass_f16`).
//! 3. Per tile, `o = num / den` to f16; heads whose range failed count as
//!    recomputed. The call's first head leaves its softmax state where
//!    `HostAttention`'s split reads it (`den` at `s`, `num` at `s + d`, the
//!    reference at `s + 2d` of the scratch).
//!
//! The scratch is [`scratch_floats`]; `d` must be a multiple of 8 (the
//! code says so in `MachineCode::head_dim_multiple`, which `HostAttention`
//! checks before every call). q must be pre-scaled by 1/√d.

use tessera_dsl::ir::{AttentionKind, Format, Group, Kernel, ParamType, SoftmaxMode};

use super::asm::*;
use super::common;
use super::evex::{Kreg, Zmm};
use crate::artifact::{EmitError, MachineCode, PrefillBlocks};
use crate::host_attention::*;

mod amx_scores;
mod lane_scores;

/// Query heads one pass over K and V serves (lanes of a ymm).
pub const MAX_TILE: usize = DECODE_TILE_HEADS;
/// 32-byte slots per chunk of a several-head tile's `num`: one per head
/// and a pad ([`NumLayout::Interleaved`]).
const NUM_SLOTS: usize = MAX_TILE + 1;
/// Keys every tile of a call scores before any tile scores the next ones:
/// the K rows of all the call's KV heads are then read in token order. The
/// walk of one KV head alone, rows `kvh·d` elements apart, is what the
/// hardware prefetchers follow poorly (a 32-head cache read head by head
/// reached 55% of a sequential read on an AMD Zen 3, in blocks of 4
/// tokens over all heads 100%+).
pub const SCORE_BLOCK: i32 = 4;
/// Keys per P·V block (likewise over V, for every tile of the call): at
/// least this many, more while the block's V rows of all KV heads stay
/// within `PV_BLOCK_BYTES` (`pv_block`).
pub const PV_BLOCK: i32 = 8;
/// The most keys a P·V block takes outside the f16 P·V.
const PV_BLOCK_MAX: i32 = 32;
/// The V bytes (rows of every KV head) a P·V block may span. A pass loads
/// and stores its accumulators once a block, so a grouped-query tile
/// (Qwen2-1.5B: 6 heads, 24 zmm accumulators a group) paid that every 8
/// keys; its 256-byte fp8 rows take 32 keys in 8 KiB, and a cold call at
/// 4096 keys took 147 µs against 174–182 with 8 (one thread, AMD Zen 5).
/// Longer spans lose: each tile walks the block's rows of its own head,
/// `kvh·d` elements apart, and 64 keys of Qwen2's kv8 rows took 219–249
/// µs cold, 16 keys of a 32/8-head f16 cache (32 KiB) 870–886 against
/// 582–612 with 8.
const PV_BLOCK_BYTES: i32 = 16 * 1024;
/// Keys per P·V block of the f16 P·V ([`pv_pass_f16`]) for `values`: its
/// f16 sums are widened and added to `num` once a block, so a longer block
/// pays that less often (a quarter of a GQA-6 tile's P·V µops at 16 keys).
/// f16 values: 16 keys, whose sums' rounding (at most 16 f16 ulps of the
/// block sum) stays near the values' own, bounded by 16 · 65504 · 2^-8.
/// fp8 values carry 3 mantissa bits, so 64 keys' f16 rounding is still
/// far under theirs; bounded by 64 · 2^8 · 1.75 = 28672.
fn pv_block_f16(values: Values) -> i32 {
    match values {
        Values::F16 => 16,
        Values::E4M3 => 64,
    }
}

/// How many keys a [`key_blocks`] block takes: a constant, or the 8-byte
/// stack slot that holds the call's.
#[derive(Clone, Copy)]
enum BlockSize {
    Keys(i32),
    Slot(i32),
}

/// `S_PV_BLOCK` = the call's P·V block. With the f16 P·V:
/// [`pv_block_f16`] where it serves several heads a tile (group ≥ 2),
/// else 16 keys. Otherwise the most keys, from [`PV_BLOCK_MAX`] halving to
/// [`PV_BLOCK`], whose V rows of every KV head (`S_VSTRIDE` bytes a key)
/// fit [`PV_BLOCK_BYTES`]: a multi-head cache's rows are `kvh·d` apart,
/// and 64 of them a block, read tile by tile, took a Llama2 kv8 call
/// 1.5–2× the time of 16 (Sapphire Rapids-class Xeon): the block's V rows
/// of every head no longer stay in cache between the passes. Clobbers rax
/// and rdx.
fn pv_block(a: &mut X86Asm, values: Values, f16: bool) {
    let done = a.new_label();
    if f16 {
        a.mov_imm(RAX, 16);
        a.store64(mem(RSP, S_PV_BLOCK), RAX);
        a.load64(RDX, mem(RSP, S_GROUP));
        a.cmp_imm(RDX, 1);
        a.jcc(Cond::E, done);
        a.mov_imm(RAX, pv_block_f16(values));
        a.store64(mem(RSP, S_PV_BLOCK), RAX);
    } else {
        let halve = a.new_label();
        a.mov_imm(RAX, PV_BLOCK_MAX);
        a.bind(halve);
        a.store64(mem(RSP, S_PV_BLOCK), RAX);
        a.cmp_imm(RAX, PV_BLOCK);
        a.jcc(Cond::Le, done);
        a.load64(RDX, mem(RSP, S_VSTRIDE));
        a.imul(RDX, RAX);
        a.cmp_imm(RDX, PV_BLOCK_BYTES);
        a.jcc(Cond::Le, done);
        a.shr_imm(RAX, 1);
        a.jmp(halve);
    }
    a.bind(done);
}

/// Keys whose scores a tile keeps at once ([`DECODE_SUPER_BLOCK`]): the
/// exponentials of a super-block are taken against one reference per
/// head, and a reference that moves between super-blocks rescales `num`
/// and `den` (by exactly 1 where it did not move).
const SUPER: i32 = DECODE_SUPER_BLOCK as i32;
/// How far ahead the score and P·V loops prefetch K and V rows (see
/// [`Prefetch`]): 8 keys, doubled (at most twice) while that is under
/// [`AHEAD_BYTES`] of the cache, set per call from the row stride
/// (`S_KAHEAD`, `S_VAHEAD`). A GQA cache's rows are short (Qwen2-1.5B's
/// f16 K rows of both KV heads 512 bytes), and 8 keys ahead, 4 KiB, left
/// the stream behind the arithmetic: 32 read its f16 cache 4–10% faster
/// cold and kv8 3–6% (Sapphire Rapids-class Xeon, ctx 4096), where a
/// 32-head cache (8 KiB rows) lost 4–10% at 32 keys and keeps 8.
const AHEAD_KEYS: i32 = 8;
const AHEAD_BYTES: i32 = 16 * 1024;
/// The tiles whose int8 keys [`DecodeIsa::lane_scores`] puts in lanes.
pub const LANE_TILE_HEADS: std::ops::RangeInclusive<usize> = lane_scores::HEADS;
/// The head dimension must be a multiple of this.
pub const HEAD_DIM_MULTIPLE: usize = 8;

/// The cache the score and P·V loops prefetch K and V rows into, chosen
/// per loop variant by its key format and heads.
///
/// One KV head's rows lie `kvh·d` elements apart; for multi-head attention
/// that is a multiple of 4 KB, so a block of rows and the rows prefetched
/// ahead all fall in one L1 set (64 sets of 8 ways on Zen 4) and evict
/// each other before use. Prefetched into L2 (`prefetcht1`) they stay, and
/// the demand loads hit L2. A loop with int8 keys over 4 or more heads is
/// bound by its arithmetic instead, and there the L2 latency on every load
/// costs more than the conflicts: it prefetches into L1 (`prefetcht0`).
/// Measured on Zen 4 against `prefetcht0` everywhere (ctx 4096, one
/// thread, medians of 3 alternating runs): MHA and 2-head groups 13–28%
/// faster, f16 groups of 4–8 heads 5–31%; int8 keys in groups of 4, 6 and
/// 8 within −3% and +6% either way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Prefetch {
    L1,
    L2,
}

impl Prefetch {
    /// The level for a loop over `heads` query heads with `keys`.
    fn for_loop(keys: Keys, heads: usize) -> Prefetch {
        if keys == Keys::I8Asym && heads >= 4 {
            Prefetch::L1
        } else {
            Prefetch::L2
        }
    }

    /// Prefetch the line at `m`.
    fn line(self, a: &mut X86Asm, m: Mem) {
        match self {
            Prefetch::L1 => a.prefetcht0(m),
            Prefetch::L2 => a.prefetcht1(m),
        }
    }

    /// Prefetch the line at `base + index`.
    fn line_indexed(self, a: &mut X86Asm, base: Gp, index: Gp) {
        match self {
            Prefetch::L1 => a.prefetcht0_indexed(base, index),
            Prefetch::L2 => a.prefetcht1_indexed(base, index),
        }
    }
}

/// f32 of scratch one call over `s` keys in `tiles` tiles of query heads
/// ([`decode_tiles`]) needs: the split state region (`s + 3d + 8`), 16 to
/// align the tiles, and per tile its record ([`DECODE_TILE_RECORD`]),
/// `qarea` `8d` and its pad ([`DECODE_Q_PAD`]), `num` `72·d/8` and the
/// super-block's scores `8·SUPER`.
pub fn scratch_floats(s: usize, d: usize, tiles: usize) -> usize {
    (s + 3 * d + 8)
        + 16
        + tiles
            * (DECODE_TILE_RECORD + 8 * d + DECODE_Q_PAD + NUM_SLOTS * d + 8 * DECODE_SUPER_BLOCK)
}

pub(super) const FRAME: i32 = 1408;
/// The decode's frame: the shared one and its own [`V_FP8_ROW`] (the
/// prefill, which shares the rest, has no use for it).
const DECODE_FRAME: i32 = FRAME + FP8_ROW_BYTES;
// 8-byte slots.
const S_GROUP: i32 = 400;
const S_S: i32 = 408;
const S_D: i32 = 416;
const S_KVH: i32 = 424;
/// Keys per P·V block of this call ([`pv_block`]).
const S_PV_BLOCK: i32 = 432;
/// AMX score loop: keys per score block of this call (`amx_scores`).
const S_SCORE_BLOCK: i32 = 440;
const S_TILES0: i32 = 448;
const S_TILES_END: i32 = 456;
const S_TILEBYTES: i32 = 464;
const S_KROW0: i32 = 472;
const S_VROW0: i32 = 480;
const S_KSTRIDE: i32 = 488;
const S_VSTRIDE: i32 = 496;
const S_KSC0: i32 = 504;
const S_KOF0: i32 = 512;
const S_D8: i32 = 520;
/// Bytes ahead the score loop prefetches ([`AHEAD_KEYS`] K rows or more).
const S_KAHEAD: i32 = 528;
const S_C0: i32 = 536;
const S_SUB0: i32 = 544;
const S_JB: i32 = 552;
const S_JEND: i32 = 560;
/// Bytes ahead the P·V loop prefetches.
const S_VAHEAD: i32 = 568;
const S_RECOMP: i32 = 576;
const S_J0: i32 = 584;
const S_J1: i32 = 592;
const S_HCUR: i32 = 600;
const S_HEND: i32 = 608;
// 4-byte constants of q's i16 form (int8 keys).
const S_I16_MAX: i32 = 616;
const S_ABS_MASK: i32 = 620;
const S_TINY: i32 = 624;
/// AMX and keys-in-lanes score loops: 0x0080 in both i16 halves (`c +
/// 128` for q's high int8 part).
const S_W128: i32 = 628;
/// AMX and keys-in-lanes score loops: bytes from a tile's `qarea` to q's
/// int8 parts (the zmm codes' size, `⌈d/32⌉·512`).
const S_QPARTS: i32 = 632;
// 32-byte vector constants and stores.
pub(super) const V_MIN: i32 = 640;
const V_MAX: i32 = 672;
const V_LOG2E: i32 = 704;
const V_NLN2HI: i32 = 736;
const V_NLN2LO: i32 = 768;
/// Taylor coefficients 1/720 … 1: `V_POLY + 32·k`, k = 0..7.
const V_POLY: i32 = 800;
pub(super) const V_127: i32 = 1024;
const V_PHI: i32 = 1056;
const V_LO: i32 = 1088;
const V_HI: i32 = 1120;
pub(super) const V_2P120: i32 = 1152;
pub(super) const V_SIGN: i32 = 1184;
pub(super) const V_MAG: i32 = 1216;
const V_ALPHA: i32 = 1248;
/// fp8 e4m3 → f16 bits: `(sign-extended code << 7) & 0xBFFF` per i16.
const V_E4M3_F16: i32 = 1280;
/// 2^8: p for fp8 values, whose f16 form is 2^-8 of the value.
const V_P_SCALE: i32 = 1312;
pub(super) const V_NEGINF: i32 = 1344;
/// 1.0 in every lane (the decode's recomputed flags, the prefill's sums).
pub(super) const V_ONE: i32 = 1376;
/// A key's fp8 values of a P·V group as f16 bits ([`fp8_row_to_f16`]):
/// up to 16 chunks of 8.
const V_FP8_ROW: i32 = FRAME;
const FP8_ROW_BYTES: i32 = 16 * 16;
// The bf16 P·V's constants ([`pv_pass_bf16`]), past the shared frame.
/// `vpermb` index: two keys' 32 codes into the order whose lane-wise
/// byte unpack gives key pairs per d in order ([`pair_order`]).
const V_BF16_ORDER: i32 = DECODE_FRAME;
/// The low and high bytes of bf16(2^-8 · e4m3) for the 128 magnitudes.
const V_BF16_LO: i32 = DECODE_FRAME + 64;
const V_BF16_HI: i32 = DECODE_FRAME + 192;
/// `vpermw` index: two keys' 8 bf16 p side by side → (key 0, key 1) per
/// head.
const V_WORD_PAIRS: i32 = DECODE_FRAME + 320;
/// `vpermt2d` index: 8 dwords of a and 8 of b → a0 b0 a1 b1 … (one head's
/// pairs, each followed by a zero).
const V_DWORD_PAIRS: i32 = DECODE_FRAME + 352;
/// 0x80 in every byte: the e4m3 sign.
const V_BYTE_SIGN: i32 = DECODE_FRAME + 448;
/// The decode frame with the bf16 P·V's constants.
const FRAME_BF16: i32 = DECODE_FRAME + 512;
// The f16 P·V's constant ([`pv_pass_f16`]), past the shared frame.
/// 2^-8 as f16 (broadcast): f16 values are scaled by it before their FMAs.
const V_F16_DOWN: i32 = DECODE_FRAME;
/// The decode frame with the f16 P·V's constant.
const FRAME_F16: i32 = DECODE_FRAME + 32;
// The f32 widening's constants ([`PvRegisters::fp8_f32`]), past the
// shared frame.
/// fp8 e4m3 → f32 bits of 2^-120 of the value: `(sign-extended code << 20)
/// & 0x87F00000` per i32.
const V_E4M3_F32: i32 = DECODE_FRAME;
/// [`FP8_F32_NUM_UNSCALE`] in every lane: `num` back to its value once a
/// call, where a tile finishes.
const V_NUM_UNSCALE: i32 = DECODE_FRAME + 32;
/// The decode frame with the f32 widening's constants.
const FRAME_FP8_F32: i32 = DECODE_FRAME + 64;
// p's scale times num's is 2^120, the widening's.
const _: () = assert!((FP8_F32_P_SCALE * FP8_F32_NUM_UNSCALE).to_bits() == (127 + 120) << 23);
// The AMX score loop's areas start at FRAME_BF16: past these too.
const _: () = assert!(FRAME_FP8_F32 <= FRAME_BF16);
/// p × 2^64 for fp8 values widened to f32 bits of 2^-120 of the value, so
/// the P·V sums are 2^-56 of theirs: p (at most e^hi) stays far from f32's
/// overflow and the sums of the smallest products far from its subnormals.
const FP8_F32_P_SCALE: f32 = f32::from_bits((127 + 64) << 23);
/// What `num` is multiplied by where the tile finishes: 2^120 (the
/// widening's scale) over [`FP8_F32_P_SCALE`].
const FP8_F32_NUM_UNSCALE: f32 = f32::from_bits((127 + 120 - 64) << 23);

/// Bytes of a tile's record, which precedes its areas in the scratch.
const REC: i32 = 4 * DECODE_TILE_RECORD as i32;
/// Bytes after a tile's `qarea` ([`DECODE_Q_PAD`]).
const Q_PAD: i32 = 4 * DECODE_Q_PAD as i32;
/// The zmm score loop's f16-key q layout takes `⌈d/16⌉·512` bytes, at most
/// `32·d + 256`: the pad holds its last half chunk.
const _: () = assert!(Q_PAD >= 256);
// Record fields: the tile's first query head and head count, its KV
// head's K / V row at token 0, the score loop's cursors (K row, int8 key
// scale and offset, score slot), its areas, the P·V chunk group size.
const R_HEAD: i32 = 0;
const R_GT: i32 = 8;
const R_VROW0: i32 = 16;
const R_KCUR: i32 = 24;
const R_SCCUR: i32 = 32;
const R_OFCUR: i32 = 40;
const R_SCUR: i32 = 48;
const R_QAREA: i32 = 56;
const R_SAREA: i32 = 64;
const R_NUM: i32 = 72;
const R_GS: i32 = 80;
/// Bytes between keys' p in `sarea`: 32 (8 head lanes) or, for a tile of
/// one head, 4 (its keys side by side, so exponentials take 8 keys a
/// vector).
const R_PSTRIDE: i32 = 88;
// 32-byte fields: running max, in-range mask, reference max, den, Σq.
const R_MAX: i32 = 96;
const R_OK: i32 = 128;
const R_MVEC: i32 = 160;
const R_DEN: i32 = 192;
const R_SUMQ: i32 = 224;
/// int8 keys: per head lane, the scale of q's i16 form (`max|q| / 32767`,
/// 32639 in the zmm forms; past d = 512 a smaller code range, see
/// [`widen_q`]).
const R_QSCALE: i32 = 256;
/// f16 P·V ([`pv_pass_f16`]): per head lane, what the block's f16 sums
/// are multiplied by into `num` (their p is taken against the running
/// max, see [`exponentials`]).
const R_PV_SCALE: i32 = 288;
/// Keys in lanes ([`lane_scores`]): per head lane, `128·Σc` over q's i16
/// codes (what the unsigned keys add to each integer dot).
const R_CODE_BIAS: i32 = 320;
const _: () = assert!(R_CODE_BIAS + 32 <= REC);

const POLY: [f32; 7] = [
    1.0 / 720.0,
    1.0 / 120.0,
    1.0 / 24.0,
    1.0 / 6.0,
    0.5,
    1.0,
    1.0,
];

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Keys {
    F16,
    I8Asym,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Values {
    F16,
    E4M3,
}

/// The instruction that multiplies int8 keys by q in the score loop. q is
/// rounded per head to i16 (scale `max|q| / 32767`, about 15 bits where
/// q has f16's 11) and each form computes the same integer dot exactly,
/// so the choice changes the speed only: per 16 key codes one
/// `vpmovsxbw` and per head one `vpdpwssd` (or `vpmaddwd` + `vpaddd`),
/// where widening to f32 took two `vpmovsxbd`, two `vcvtdq2ps` and two
/// FMAs per head.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KeyDot {
    /// `vpmaddwd` + `vpaddd` (AVX2): runs on every x86 CPU this backend
    /// does, so [`emit`] uses it and its output is the same everywhere.
    #[default]
    Maddwd,
    /// AVX-VNNI `vpdpwssd` (VEX).
    VexVnni,
    /// AVX512-VNNI `vpdpwssd` on ymm (EVEX; needs AVX512VL too): Zen 4
    /// and Ice Lake have it without AVX-VNNI.
    EvexVnni,
}

impl From<super::int8::Dot> for KeyDot {
    /// The form of the CPU's int8 matmul dot product
    /// ([`super::X86Backend::int8_dot`]).
    fn from(dot: super::int8::Dot) -> KeyDot {
        match dot {
            super::int8::Dot::MaddUbsw => KeyDot::Maddwd,
            super::int8::Dot::VexVnni => KeyDot::VexVnni,
            super::int8::Dot::EvexVnni => KeyDot::EvexVnni,
        }
    }
}

/// What the decode kernel may use beyond AVX2, FMA and F16C.
/// [`Default`] is plain AVX2: the same code on every host.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DecodeIsa {
    /// How int8 keys meet q.
    pub key_dot: KeyDot,
    /// AVX512VL: EVEX names ymm16–31, so a P·V pass holds up to 6 heads'
    /// accumulators (3 in 16 registers): a GQA tile of 6 heads reads and
    /// widens each V chunk once per key instead of twice. A prefill
    /// kernel's flash loop then scores 16 of a tile's 24 rows in a zmm and
    /// runs its P·V on zmm (`attention_prefill`): 1.2–1.3× on Zen 5, whose
    /// zmm FMAs are twice its ymm ones.
    pub ymm32: bool,
    /// AVX512_BF16 with AVX512_VBMI and AVX512BW: P·V of fp8 values by
    /// `vdpbf16ps` on key pairs (`pv_pass_bf16`), p rounded to bf16, so o
    /// moves by at most 2^-8 of max |v| ([`Self::fp8_p_rounding`]). It needs `ymm32`
    /// (its zmm accumulators take the whole file) and has no effect
    /// without it or for f16 values.
    pub bf16_values: bool,
    /// AVX512-FP16 with AVX512VL: P·V of a tile of several query heads by
    /// `vfmadd231ph` on ymm, 16 f16 lanes an FMA where `vfmadd231ps` takes
    /// 8 (`pv_pass_f16`). p is taken against the running max, so it is at
    /// most 1, and rounded to f16; f16 values are scaled by 2^-8 (fp8
    /// values' f16 form is 2^-8 of theirs already, p × 2^8 for them); each
    /// block of `pv_block_f16` keys sums in f16 before it is added to the
    /// f32 `num`. The sums are bounded (16 · 65504 · 2^-8, or 64 · 2^8 ·
    /// 1.75), so they never overflow; o moves by a few f16 ulps of the
    /// block sums. It needs `ymm32` and takes precedence over
    /// `bf16_values`; one-head tiles keep the f32 FMAs.
    pub f16_pv: bool,
    /// AVX512-VNNI with AVX512BW: a tile of several heads scores its keys
    /// two at a time on zmm (`key_pairs_zmm`): int8 keys by `vpdpwssd`, 32
    /// lanes of d where the ymm loop takes 16, q in 32-d chunks, the 16
    /// sums reduced in i32; f16 keys by `vfmadd231ps`, 16 lanes where the
    /// ymm loop takes 8, q in 16-d chunks.
    pub zmm_scores: bool,
    /// AMX-INT8 (with the OS's permission, [`super::amx::request_tile_data`])
    /// and `zmm_scores`: a tile of several heads scores int8 keys 32 at a
    /// time by `tdpbssd`, q's i16 codes split into two int8 parts
    /// (`256·hi + lo`), so the integer dots equal the zmm loop's exactly
    /// (`amx_scores::key_tiles`); fewer than 16 keys left go by the zmm
    /// loop.
    pub amx_scores: bool,
    /// `zmm_scores` without `amx_scores`: a tile of 4 to 7 heads scores
    /// int8 keys 16 at a time with a key in each dword lane (the rows
    /// transposed in registers, `vpdpbusd` against q's two int8 parts
    /// broadcast), so no sum runs across lanes and one finish serves 16
    /// keys (`lane_scores`); the integer dots equal the pair loop's.
    pub lane_scores: bool,
}

impl DecodeIsa {
    /// Whether fp8 values take the bf16 dots: they need `ymm32`, and the
    /// f16 P·V takes precedence.
    fn bf16_pv(&self) -> bool {
        self.bf16_values && self.ymm32 && !self.f16_pv
    }

    /// The relative rounding of p in this form's P·V of fp8 values, so
    /// the most it moves o as a fraction of the largest |v| the head
    /// attends to: 2^-8 for the bf16 dots (`bf16_pairs`), 2^-11 for the
    /// f16 P·V (whose f16 block sums add their own, [`Self::f16_pv`]), 0
    /// for f32 FMAs (their f32 sums' rounding aside).
    pub fn fp8_p_rounding(&self) -> f32 {
        if self.f16_pv && self.ymm32 {
            1.0 / 2048.0
        } else if self.bf16_pv() {
            1.0 / 256.0
        } else {
            0.0
        }
    }
}

/// How a call's keys are scored ([`DecodeIsa`]'s `key_dot` for int8
/// keys, and for tiles of several heads `zmm_scores` and, int8 keys only,
/// `amx_scores`).
#[derive(Clone, Copy, Debug)]
struct ScoreForm {
    dot: KeyDot,
    zmm: bool,
    amx: bool,
    lanes: bool,
}

/// `acc.i32 += Σ₂ k.i16 · q.i16` in the form `dot` names (`tmp` is
/// clobbered by `vpmaddwd` only).
fn dot_i16(a: &mut X86Asm, dot: KeyDot, acc: Ymm, k: Ymm, q: Ymm, tmp: Ymm) {
    match dot {
        KeyDot::Maddwd => {
            a.vpmaddwd(tmp, k, q);
            a.vpaddd(acc, acc, tmp);
        }
        KeyDot::VexVnni => a.vpdpwssd(acc, k, q),
        KeyDot::EvexVnni => a.vpdpwssd_ymm_evex(acc, k, q),
    }
}

/// Loads the int8 codes of one chunk of a K row at `m` as i16: 16 codes
/// (a whole chunk), or 8 into the low half (the half chunk that leads when
/// d/8 is odd).
fn load_codes_i16(a: &mut X86Asm, dst: Ymm, m: Mem, half: bool) {
    if half {
        a.vpmovsxbw_load64(dst, m);
    } else {
        a.vpmovsxbw_load(dst, m);
    }
}

/// The int8 keys' chunk loop over rcx units of 8 lanes of d (d/8): a half
/// chunk (8 d) first where rcx is odd, then whole chunks of 16 d. With
/// two `sets` the wholes alternate between accumulator sets (ymm `i` and
/// `i + 4`, `i < sums`), a lone whole first, and set 1 is folded into set
/// 0 and cleared at the end. `step(a, set, at, half)` does chunk `at` of a
/// trip (its K codes at `16·at` bytes, its q slot at `qs·at`, `qs` =
/// [`q_chunk_bytes`]);
/// `advance(a, k_bytes, q_bytes, units)` moves on and counts rcx down by
/// `units` (its flags end the loop).
fn i16_chunks(
    a: &mut X86Asm,
    sets: usize,
    sums: usize,
    qs: i32,
    step: impl Fn(&mut X86Asm, usize, i32, bool),
    advance: impl Fn(&mut X86Asm, i32, i32, i32),
) {
    let (wholes, done) = (a.new_label(), a.new_label());
    a.test_imm(RCX, 1);
    a.jcc(Cond::E, wholes);
    step(a, 0, 0, true);
    advance(a, 8, qs, 1);
    a.bind(wholes);
    a.cmp_imm(RCX, 0);
    a.jcc(Cond::E, done);
    if sets == 2 {
        let pairs = a.new_label();
        a.test_imm(RCX, 2);
        a.jcc(Cond::E, pairs);
        step(a, 0, 0, false);
        advance(a, 16, qs, 2);
        a.jcc(Cond::E, done);
        a.bind(pairs);
        step(a, 0, 0, false);
        step(a, 1, 1, false);
        advance(a, 32, 2 * qs, 4);
        a.jcc(Cond::Ne, pairs);
        a.bind(done);
        for i in 0..sums as u8 {
            a.vpaddd(Ymm(i), Ymm(i), Ymm(i + 4));
            a.vpxor(Ymm(i + 4), Ymm(i + 4), Ymm(i + 4));
        }
    } else {
        let whole = a.new_label();
        a.bind(whole);
        step(a, 0, 0, false);
        advance(a, 16, qs, 2);
        a.jcc(Cond::Ne, whole);
        a.bind(done);
    }
}

/// Bytes from one chunk of a tile's `qarea` to the next (8 d of f32, or
/// 16 d of i16: 32 bytes a head). A tile of several heads interleaves
/// them, 8 slots a chunk (256 bytes), so one load per chunk serves the
/// tile's head lanes. A tile of one head (multi-head attention) keeps its
/// chunks side by side: interleaved, its q spread over twice the lines,
/// and a 32-head call's q (32 × 16 lines at d = 128) filled the L1 that
/// the K rows stream through. A C loop of the one-head score pass over a
/// Llama2 f16 cache (Zen 4, one thread, cold) read 18.6 GB/s with the
/// interleaved q and 24.9 with it side by side.
fn q_chunk_bytes(heads: usize) -> i32 {
    if heads == 1 { 32 } else { 32 * MAX_TILE as i32 }
}

fn unsupported(what: String) -> EmitError {
    EmitError::Unsupported {
        backend: super::NAME,
        what,
    }
}

fn splat(a: &mut X86Asm, at: i32, bits: u32) {
    for i in 0..8 {
        a.store32_imm(mem(RSP, at + 4 * i), bits as i32);
    }
}

/// Emit the attention of `kernel` (AVX2 + FMA + F16C): this decode loop,
/// or for a prefill kernel with the online softmax
/// `super::attention_prefill`'s flash loop in the default blocks (with
/// the async softmax, this decode loop, which `HostAttention::prefill`
/// runs once per query token).
pub fn emit(kernel: &Kernel) -> Result<MachineCode, EmitError> {
    emit_with(kernel, PrefillBlocks::DEFAULT)
}

/// [`emit_for`] on plain AVX2 ([`DecodeIsa::default`]).
pub fn emit_with(kernel: &Kernel, blocks: PrefillBlocks) -> Result<MachineCode, EmitError> {
    emit_for(kernel, blocks, DecodeIsa::default())
}

/// [`emit`] with a prefill kernel's flash loop in `blocks` (a decode
/// kernel ignores them): the blocks a device measured best; and the
/// decode loop on the instructions `isa` allows (the caller checks that
/// the CPU has them).
pub fn emit_for(
    kernel: &Kernel,
    blocks: PrefillBlocks,
    isa: DecodeIsa,
) -> Result<MachineCode, EmitError> {
    let dot = isa.key_dot;
    let at = kernel
        .as_attention()
        .ok_or_else(|| unsupported(format!("kernel `{}` (not attention)", kernel.name)))?;
    let fmt = |n: &str| {
        kernel
            .tensor(n)
            .map(|t| t.format)
            .ok_or_else(|| unsupported(format!("missing tensor `{n}`")))
    };
    let keys = match fmt(&at.k)? {
        Format::F16 => Keys::F16,
        Format::I8Asym(Group::Row, ParamType::F32) => Keys::I8Asym,
        f => {
            return Err(unsupported(format!(
                "attention keys {f} (x86: f16, i8asym:row)"
            )));
        }
    };
    let values = match fmt(&at.v)? {
        Format::F16 => Values::F16,
        Format::Fp8E4M3 => Values::E4M3,
        f => {
            return Err(unsupported(format!(
                "attention values {f} (x86: f16, fp8e4m3)"
            )));
        }
    };
    if fmt(&at.q)? != Format::F16 || fmt(&at.o)? != Format::F16 {
        return Err(unsupported("q and o other than f16".to_string()));
    }
    if !at.q_prescaled {
        return Err(unsupported(
            "q not pre-scaled (the x86 attention takes q × 1/√d: mark q `prescaled`)".to_string(),
        ));
    }
    for (name, d) in [
        (&at.q, [&at.tokens, &at.heads, &at.head_dim]),
        (&at.k, [&at.seq, &at.kv_heads, &at.head_dim]),
        (&at.v, [&at.seq, &at.kv_heads, &at.head_dim]),
        (&at.o, [&at.tokens, &at.heads, &at.head_dim]),
    ] {
        let t = kernel
            .tensor(name)
            .ok_or_else(|| unsupported(format!("missing tensor `{name}`")))?;
        if !t.layout.is_row_major(&d) {
            return Err(unsupported(format!("tensor `{name}` not row-major")));
        }
    }
    let softmax = at.softmax;
    let prefill = at.kind == AttentionKind::Prefill;
    if prefill && softmax == SoftmaxMode::Online {
        let header = format!("keys {}, values {}", fmt(&at.k)?, fmt(&at.v)?);
        return super::attention_prefill::emit(
            &kernel.name,
            keys,
            values,
            &header,
            blocks,
            isa.ymm32,
        );
    }
    let mut a = X86Asm::new();
    if prefill {
        a.comment(
            "prefill: this decode kernel runs once per query token with s = its causal prefix (HostAttention::prefill): the flash prefill runs the online softmax only",
        );
    }
    a.comment(&format!(
        "{} x86-avx2 attention decode: keys {}, values {}, softmax {:?}{}",
        kernel.name,
        fmt(&at.k)?,
        fmt(&at.v)?,
        softmax,
        match (keys, dot) {
            (Keys::F16, _) => "",
            (Keys::I8Asym, KeyDot::Maddwd) => ", int8 keys by vpmaddwd",
            (Keys::I8Asym, KeyDot::VexVnni) => ", int8 keys by {vex} vpdpwssd",
            (Keys::I8Asym, KeyDot::EvexVnni) => ", int8 keys by {evex} vpdpwssd",
        }
    ));
    let f16 = isa.f16_pv && isa.ymm32;
    let bf16 = isa.bf16_pv() && values == Values::E4M3;
    let fp8_f32 = values == Values::E4M3 && !bf16 && !f16 && fp8_f32_fits(softmax);
    let zmm_f32_pv = isa.ymm32 && !f16 && (values == Values::F16 || fp8_f32);
    if isa.ymm32 {
        let heads = PvRegisters {
            ymm32: true,
            widen_once: false,
            fp8_f32,
            bf16,
            f16,
            zmm_f32: zmm_f32_pv,
        }
        .heads();
        a.comment(&format!(
            "P·V passes of up to {heads} heads in ymm0-31 (AVX512VL)"
        ));
    }
    if f16 {
        a.comment(
            "P·V of several-head tiles by vfmadd231ph: p against the running max in f16, f16 values × 2^-8, sums in f16 per block of 16 keys, added to f32 num (AVX512-FP16)",
        );
    }
    if bf16 {
        a.comment(
            "P·V of fp8 values by vdpbf16ps on key pairs: e4m3 → bf16 by vpermi2b lookups, p rounded to bf16 (AVX512_BF16, AVX512_VBMI)",
        );
    }
    if zmm_f32_pv {
        a.comment("P·V of several-head tiles by vfmadd231ps on zmm, 16 lanes of d a value chunk");
    }
    let form = ScoreForm {
        dot,
        zmm: isa.zmm_scores,
        amx: isa.zmm_scores && isa.amx_scores && keys == Keys::I8Asym,
        lanes: isa.zmm_scores && !isa.amx_scores && isa.lane_scores && keys == Keys::I8Asym,
    };
    if form.lanes {
        a.comment(
            "int8 keys of 4-7-head tiles 16 a trip, a key per dword lane: rows transposed in registers, vpdpbusd against q's two int8 parts (AVX512-VNNI)",
        );
    }
    if form.amx {
        a.comment(
            "int8 keys of several-head tiles by AMX tdpbssd, 32 keys a trip; q's i16 codes as two int8 parts, 256·hi + lo (AMX-INT8)",
        );
    }
    let regs = PvRegisters {
        ymm32: isa.ymm32,
        widen_once: !isa.ymm32 && values == Values::E4M3,
        fp8_f32,
        bf16,
        f16,
        zmm_f32: zmm_f32_pv,
    };
    if regs.fp8_f32 {
        a.comment(
            "P·V of fp8 values widened to f32 bits of 2^-120 of the value (sign-extended, shifted, one mask), p × 2^64, num × 2^56 where a tile finishes",
        );
    }
    let frame = if form.amx {
        amx_scores::FRAME_AMX
    } else if form.lanes {
        lane_scores::FRAME_LANES
    } else if bf16 {
        FRAME_BF16
    } else if f16 {
        FRAME_F16
    } else if regs.fp8_f32 {
        FRAME_FP8_F32
    } else {
        DECODE_FRAME
    };
    common::prologue_framed(&mut a, frame);
    constants(&mut a, softmax);
    if regs.fp8_f32 {
        splat(&mut a, V_E4M3_F32, 0x87F0_0000);
        splat(&mut a, V_NUM_UNSCALE, FP8_F32_NUM_UNSCALE.to_bits());
        splat(&mut a, V_P_SCALE, FP8_F32_P_SCALE.to_bits());
    } else {
        if values == Values::E4M3 {
            splat(&mut a, V_E4M3_F16, 0xBFFF_BFFF);
        }
        if values == Values::E4M3 || f16 {
            splat(&mut a, V_P_SCALE, 256f32.to_bits());
        }
    }
    if f16 {
        splat(&mut a, V_F16_DOWN, 0x1C00_1C00);
    }
    if bf16 {
        bf16_constants(&mut a);
    }
    setup(&mut a, keys, values);
    pv_block(&mut a, values, f16);

    if form.amx {
        amx_scores::config(&mut a);
    }
    if form.lanes {
        lane_scores::config(&mut a);
    }
    tiles(&mut a, keys, values, regs, form);
    super_blocks(&mut a, keys, values, softmax, form, regs);
    each_tile(&mut a, |a| {
        count_recomputed(a, softmax);
        finish_tile(a, regs.fp8_f32);
    });
    if form.amx {
        a.tilerelease();
    }
    common::epilogue_framed(&mut a, frame);
    let (bytes, listing) = a.finish().map_err(EmitError::Assembler)?;
    Ok(MachineCode {
        head_dim_multiple: HEAD_DIM_MULTIPLE,
        every_head_state: true,
        ..super::machine_code(bytes, listing)
    })
}

pub(super) fn constants(a: &mut X86Asm, softmax: SoftmaxMode) {
    a.comment("vector constants");
    splat(a, V_MIN, (-87.3f32).to_bits());
    splat(a, V_MAX, 88.7f32.to_bits());
    splat(a, V_LOG2E, std::f32::consts::LOG2_E.to_bits());
    splat(a, V_NLN2HI, (-0.693_359_4f32).to_bits());
    splat(a, V_NLN2LO, 2.121_944_4e-4f32.to_bits());
    for (k, c) in POLY.iter().enumerate() {
        splat(a, V_POLY + 32 * k as i32, c.to_bits());
    }
    splat(a, V_127, 127);
    let (phi, lo, hi) = match softmax {
        SoftmaxMode::Async { phi, lo, hi } => (phi, lo, hi),
        SoftmaxMode::Online => (0.0, 0.0, 0.0),
    };
    splat(a, V_PHI, phi.to_bits());
    splat(a, V_LO, lo.to_bits());
    splat(a, V_HI, hi.to_bits());
    splat(a, V_2P120, 2f32.powi(120).to_bits());
    splat(a, V_SIGN, 0x8000_0000);
    splat(a, V_MAG, 0x07F0_0000);
    splat(a, V_NEGINF, f32::NEG_INFINITY.to_bits());
    splat(a, V_ONE, 1f32.to_bits());
}

/// Call-wide values: group, extents, strides, scratch areas.
fn setup(a: &mut X86Asm, keys: Keys, values: Values) {
    a.comment("call setup: group = hq / kvh, strides, scratch areas");
    a.load64(RAX, mem(RDI, AT_HQ));
    a.zero(RDX);
    a.load64(RCX, mem(RDI, AT_KVH));
    a.store64(mem(RSP, S_KVH), RCX);
    a.div(RCX);
    a.store64(mem(RSP, S_GROUP), RAX);
    a.load64(R12, mem(RDI, AT_S));
    a.store64(mem(RSP, S_S), R12);
    a.load64(R13, mem(RDI, AT_D));
    a.store64(mem(RSP, S_D), R13);
    a.mov(RAX, R13);
    a.shr_imm(RAX, 3);
    a.store64(mem(RSP, S_D8), RAX);
    // Key / value strides between tokens: kvh·d elements.
    a.mov(RAX, RCX);
    a.imul(RAX, R13);
    let kb = if keys == Keys::F16 { 2 } else { 1 };
    let vb = if values == Values::F16 { 2 } else { 1 };
    a.imul_imm(RDX, RAX, kb);
    a.store64(mem(RSP, S_KSTRIDE), RDX);
    prefetch_distance(a, S_KAHEAD);
    a.imul_imm(RDX, RAX, vb);
    a.store64(mem(RSP, S_VSTRIDE), RDX);
    prefetch_distance(a, S_VAHEAD);
    // The tiles start at scratch + 4·(s + 3d + 8), rounded up to a cache
    // line; each takes REC + Q_PAD + 4·(8d + 9d + 8·SUPER) bytes.
    a.load64(RAX, mem(RDI, AT_SCRATCH));
    a.lea(RDX, mem(R12, 8 + 16));
    a.add(RDX, R13);
    a.add(RDX, R13);
    a.add(RDX, R13);
    a.shl_imm(RDX, 2);
    a.add(RAX, RDX);
    a.and_imm(RAX, -64);
    a.store64(mem(RSP, S_TILES0), RAX);
    a.imul_imm(RDX, R13, 68);
    a.add_imm(RDX, REC + Q_PAD + 32 * SUPER);
    a.store64(mem(RSP, S_TILEBYTES), RDX);
    a.mov_imm(RAX, 0);
    a.store64(mem(RSP, S_RECOMP), RAX);
}

/// Every tile of the call (heads `head0 .. head0 + heads`, each tile
/// `gt = min(group − h % group, end − h, 8)` heads of one KV head) gets
/// its record and areas: rows, cursors, q widened, `num` cleared, the
/// softmax state empty. Leaves `S_TILES_END`.
fn tiles(a: &mut X86Asm, keys: Keys, values: Values, regs: PvRegisters, form: ScoreForm) {
    a.comment("tiles: records, q widened, num cleared, softmax state empty");
    a.load64(RAX, mem(RDI, AT_HEAD0));
    a.store64(mem(RSP, S_HCUR), RAX);
    a.load64(RDX, mem(RDI, AT_HEADS));
    a.add(RDX, RAX);
    a.store64(mem(RSP, S_HEND), RDX);
    a.load64(RBX, mem(RSP, S_TILES0));
    let (tile, done) = (a.new_label(), a.new_label());
    a.bind(tile);
    a.load64(RAX, mem(RSP, S_HCUR));
    a.cmp_mem(RAX, mem(RSP, S_HEND));
    a.jcc(Cond::Ge, done);
    a.store64(mem(RBX, R_HEAD), RAX);
    a.zero(RDX);
    a.load64(RCX, mem(RSP, S_GROUP));
    a.div(RCX);
    // rax = kv, rdx = h % group; gt = min(group − h % group, end − h, 8).
    a.mov(RSI, RCX);
    a.sub(RSI, RDX);
    a.load64(RDX, mem(RSP, S_HEND));
    a.load64(RCX, mem(RSP, S_HCUR));
    a.sub(RDX, RCX);
    common::min_reg(a, RSI, RDX);
    a.mov_imm(RDX, MAX_TILE as i32);
    common::min_reg(a, RSI, RDX);
    a.store64(mem(RBX, R_GT), RSI);
    kv_head_rows(a, keys, values, [S_KROW0, S_VROW0, S_KSC0, S_KOF0]);
    for (from, to) in [(S_KROW0, R_KCUR), (S_VROW0, R_VROW0)] {
        a.load64(RCX, mem(RSP, from));
        a.store64(mem(RBX, to), RCX);
    }
    if keys == Keys::I8Asym {
        for (from, to) in [(S_KSC0, R_SCCUR), (S_KOF0, R_OFCUR)] {
            a.load64(RCX, mem(RSP, from));
            a.store64(mem(RBX, to), RCX);
        }
    }
    // Areas: qarea (8d f32 and the pad), num (9d), sarea (8·SUPER).
    a.lea(RAX, mem(RBX, REC));
    a.store64(mem(RBX, R_QAREA), RAX);
    a.load64(RCX, mem(RSP, S_D));
    a.shl_imm(RCX, 5);
    a.add(RAX, RCX);
    a.add_imm(RAX, Q_PAD);
    a.store64(mem(RBX, R_NUM), RAX);
    a.load64(RCX, mem(RSP, S_D));
    a.imul_imm(RCX, RCX, 4 * NUM_SLOTS as i32);
    a.add(RAX, RCX);
    a.store64(mem(RBX, R_SAREA), RAX);
    // P·V chunk group: as many chunks as the registers hold for the
    // tile's heads per pass.
    let gs = a.new_label();
    a.load64(RSI, mem(RBX, R_GT));
    for heads in 1..regs.heads() {
        a.mov_imm(RAX, regs.group_chunks(heads) as i32);
        a.cmp_imm(RSI, heads as i32);
        a.jcc(Cond::E, gs);
    }
    a.mov_imm(RAX, regs.group_chunks(regs.heads()) as i32);
    a.bind(gs);
    a.store64(mem(RBX, R_GS), RAX);
    let wide = a.new_label();
    a.mov_imm(RAX, 32);
    a.cmp_imm(RSI, 1);
    a.jcc(Cond::Ne, wide);
    a.mov_imm(RAX, 4);
    a.bind(wide);
    a.store64(mem(RBX, R_PSTRIDE), RAX);
    // Softmax state: no max yet, every score in range so far, den 0.
    a.vmovups_load(Ymm(0), mem(RSP, V_NEGINF));
    a.vmovups_store(mem(RBX, R_MAX), Ymm(0));
    a.vmovups_store(mem(RBX, R_MVEC), Ymm(0));
    a.vcmpps(Ymm(1), Ymm(0), Ymm(0), 0);
    a.vmovups_store(mem(RBX, R_OK), Ymm(1));
    a.vxorps(Ymm(0), Ymm(0), Ymm(0));
    a.vmovups_store(mem(RBX, R_DEN), Ymm(0));
    a.load64(RSI, mem(RBX, R_NUM));
    a.load64(RCX, mem(RSP, S_D8));
    a.imul_imm(RCX, RCX, NUM_SLOTS as i32);
    let clr = a.new_label();
    a.bind(clr);
    a.vmovups_store(mem(RSI, 0), Ymm(0));
    a.add_imm(RSI, 32);
    a.sub_imm(RCX, 1);
    a.jcc(Cond::Ne, clr);
    widen_q(a, keys, form);
    a.load64(RAX, mem(RBX, R_GT));
    a.load64(RCX, mem(RSP, S_HCUR));
    a.add(RCX, RAX);
    a.store64(mem(RSP, S_HCUR), RCX);
    a.load64(RAX, mem(RSP, S_TILEBYTES));
    a.add(RBX, RAX);
    a.jmp(tile);
    a.bind(done);
    a.store64(mem(RSP, S_TILES_END), RBX);
}

/// `body` once per tile, rbx at its record (the body keeps rbx).
fn each_tile(a: &mut X86Asm, body: impl FnOnce(&mut X86Asm)) {
    let (tile, done) = (a.new_label(), a.new_label());
    a.load64(RBX, mem(RSP, S_TILES0));
    a.bind(tile);
    a.cmp_mem(RBX, mem(RSP, S_TILES_END));
    a.jcc(Cond::Ae, done);
    body(a);
    a.load64(RAX, mem(RSP, S_TILEBYTES));
    a.add(RBX, RAX);
    a.jmp(tile);
    a.bind(done);
}

/// `body` once per block of `size` keys of the super-block (`S_JB ..
/// S_JEND`).
fn key_blocks(a: &mut X86Asm, size: BlockSize, body: impl FnOnce(&mut X86Asm)) {
    let (block, done) = (a.new_label(), a.new_label());
    a.load64(RAX, mem(RSP, S_J0));
    a.store64(mem(RSP, S_JB), RAX);
    a.bind(block);
    a.load64(RAX, mem(RSP, S_JB));
    a.cmp_mem(RAX, mem(RSP, S_J1));
    a.jcc(Cond::Ge, done);
    match size {
        BlockSize::Keys(n) => a.lea(RDX, mem(RAX, n)),
        BlockSize::Slot(slot) => {
            a.load64(RDX, mem(RSP, slot));
            a.add(RDX, RAX);
        }
    }
    common::min_mem(a, RDX, mem(RSP, S_J1));
    a.store64(mem(RSP, S_JEND), RDX);
    body(a);
    a.load64(RAX, mem(RSP, S_JEND));
    a.store64(mem(RSP, S_JB), RAX);
    a.jmp(block);
    a.bind(done);
}

/// The keys in super-blocks of `SUPER`: scores of every tile in blocks of
/// [`SCORE_BLOCK`] keys, then per tile its reference max (rescaling what
/// it has summed where that moved) and exponentials, then P·V of every
/// tile in blocks of `S_PV_BLOCK` keys ([`pv_block`]).
fn super_blocks(
    a: &mut X86Asm,
    keys: Keys,
    values: Values,
    softmax: SoftmaxMode,
    form: ScoreForm,
    regs: PvRegisters,
) {
    a.comment("super-blocks of keys: scores, reference max and exponentials, P·V");
    let (sb, done) = (a.new_label(), a.new_label());
    a.zero(RAX);
    a.store64(mem(RSP, S_J0), RAX);
    a.bind(sb);
    a.load64(RAX, mem(RSP, S_J0));
    a.cmp_mem(RAX, mem(RSP, S_S));
    a.jcc(Cond::Ge, done);
    a.lea(RDX, mem(RAX, SUPER));
    common::min_mem(a, RDX, mem(RSP, S_S));
    a.store64(mem(RSP, S_J1), RDX);
    each_tile(a, |a| {
        a.load64(RAX, mem(RBX, R_SAREA));
        a.store64(mem(RBX, R_SCUR), RAX);
    });
    let score_block = if form.amx || form.lanes {
        BlockSize::Slot(S_SCORE_BLOCK)
    } else {
        BlockSize::Keys(SCORE_BLOCK)
    };
    key_blocks(a, score_block, |a| {
        each_tile(a, |a| scores(a, keys, softmax, form))
    });
    each_tile(a, |a| {
        rebase(a, softmax);
        exponentials(a, values, regs.f16, form.zmm);
        if regs.bf16 {
            bf16_pairs(a);
        }
    });
    key_blocks(a, BlockSize::Slot(S_PV_BLOCK), |a| {
        each_tile(a, |a| pv(a, keys, values, regs))
    });
    a.load64(RAX, mem(RSP, S_J1));
    a.store64(mem(RSP, S_J0), RAX);
    a.jmp(sb);
    a.bind(done);
}

/// `slot` = the prefetch distance for rows rdx bytes apart: [`AHEAD_KEYS`]
/// rows, doubled at most twice while under [`AHEAD_BYTES`]. Clobbers rdx.
fn prefetch_distance(a: &mut X86Asm, slot: i32) {
    let done = a.new_label();
    a.shl_imm(RDX, AHEAD_KEYS.trailing_zeros() as i8);
    for _ in 0..2 {
        a.cmp_imm(RDX, AHEAD_BYTES);
        a.jcc(Cond::Ge, done);
        a.shl_imm(RDX, 1);
    }
    a.bind(done);
    a.store64(mem(RSP, slot), RDX);
}

/// KV head `rax`'s rows at token 0 (`kv·d` elements into each cache) into
/// the frame slots `[krow, vrow, ksc, kof]`, the last two (its int8 keys'
/// scale and offset pointers) for int8 keys only. Keeps rax; clobbers
/// rcx, rdx, rsi.
pub(super) fn kv_head_rows(a: &mut X86Asm, keys: Keys, values: Values, slots: [i32; 4]) {
    let [krow, vrow, ksc, kof] = slots;
    a.load64(RCX, mem(RDI, AT_D));
    a.mov(RDX, RAX);
    a.imul(RDX, RCX);
    let kb = if keys == Keys::F16 { 2 } else { 1 };
    let vb = if values == Values::F16 { 2 } else { 1 };
    a.imul_imm(RSI, RDX, kb);
    a.load64(RCX, mem(RDI, AT_K));
    a.add(RSI, RCX);
    a.store64(mem(RSP, krow), RSI);
    a.imul_imm(RSI, RDX, vb);
    a.load64(RCX, mem(RDI, AT_V));
    a.add(RSI, RCX);
    a.store64(mem(RSP, vrow), RSI);
    if keys == Keys::I8Asym {
        a.mov(RSI, RAX);
        a.shl_imm(RSI, 2);
        a.load64(RCX, mem(RDI, AT_K_SCALES));
        a.add(RCX, RSI);
        a.store64(mem(RSP, ksc), RCX);
        a.load64(RCX, mem(RDI, AT_K_OFFSETS));
        a.add(RCX, RSI);
        a.store64(mem(RSP, kof), RCX);
    }
}

/// q rows of the tile (record at rbx) → `qarea[d/8][8][8]` f32 (unused
/// heads zero); for int8 keys instead q's i16 form, `qarea[⌈d/16⌉][8][16]`
/// (a half chunk of 8 d first where d/8 is odd), or with `zmm` for tiles
/// of several heads `qarea[⌈d/32⌉][8][32]` ([`q_to_i16_zmm`]), with per
/// head `Σq` and the form's scale in the record.
fn widen_q(a: &mut X86Asm, keys: Keys, form: ScoreForm) {
    let zmm = form.zmm;
    let int8 = keys == Keys::I8Asym;
    a.comment(if int8 {
        "q → i16 by head scale max|q|/C (C = 32767, 32639 in the zmm forms), interleaved by chunk: qarea[c][head][16]"
    } else if zmm {
        "q → f32, interleaved by chunk: qarea[c][head][8], for several heads qarea[c][head][16]"
    } else {
        "q → f32, interleaved by chunk: qarea[c][head][8]"
    });
    let zero = Ymm(0);
    a.vxorps(zero, zero, zero);
    a.vmovups_store(mem(RBX, R_SUMQ), zero);
    if int8 {
        a.vmovups_store(mem(RBX, R_QSCALE), zero);
        // The i16 form's largest code: 32767, or (2^24 − 1)/d where that
        // is smaller, so a head's integer dot (d terms of |c| ≤ 128)
        // stays below 2^31 for any d (32767 holds up to d = 512).
        let d_ok = a.new_label();
        a.load64(RCX, mem(RSP, S_D));
        a.cmp_imm(RCX, 0);
        a.jcc(Cond::Ne, d_ok);
        a.mov_imm(RCX, 1);
        a.bind(d_ok);
        a.mov_imm(RAX, (1 << 24) - 1);
        a.zero(RDX);
        a.div(RCX);
        // The zmm forms take 32639 = 127·257: its codes split into two
        // int8 parts for AMX (`256·hi + lo`, hi = (c + 128) >> 8 ≤ 127),
        // and the zmm and AMX scores stay equal bit for bit.
        a.mov_imm(RDX, if zmm { 32639 } else { 32767 });
        common::min_reg(a, RAX, RDX);
        a.vcvtsi2ss(Ymm(2), RAX);
        a.vmovss_store(mem(RSP, S_I16_MAX), Ymm(2));
        a.store32_imm(mem(RSP, S_ABS_MASK), 0x7FFF_FFFF);
        a.store32_imm(mem(RSP, S_TINY), f32::MIN_POSITIVE.to_bits() as i32);
    }
    // Clear every head slot first (unused heads must read zero), the pad
    // too.
    a.load64(RSI, mem(RBX, R_QAREA));
    a.load64(RCX, mem(RSP, S_D));
    a.add_imm(RCX, Q_PAD / 32);
    let (clr, clr_done) = (a.new_label(), a.new_label());
    a.bind(clr);
    a.cmp_imm(RCX, 0);
    a.jcc(Cond::Le, clr_done);
    a.vmovups_store(mem(RSI, 0), zero);
    a.add_imm(RSI, 32);
    a.sub_imm(RCX, 1);
    a.jmp(clr);
    a.bind(clr_done);
    // r10 = the chunk stride (`q_chunk_bytes` of the tile's heads).
    by_tile_heads(a, R10, q_chunk_bytes(1), q_chunk_bytes(MAX_TILE));
    // For head i of the tile: q row (h + i).
    a.zero(R12);
    let (head_loop, heads_done) = (a.new_label(), a.new_label());
    a.bind(head_loop);
    a.cmp_mem(R12, mem(RBX, R_GT));
    a.jcc(Cond::Ge, heads_done);
    a.load64(RAX, mem(RBX, R_HEAD));
    a.add(RAX, R12);
    a.load64(RCX, mem(RSP, S_D));
    a.imul(RAX, RCX);
    a.shl_imm(RAX, 1);
    a.load64(RSI, mem(RDI, AT_Q));
    a.add(RSI, RAX);
    // dst = qarea + 32·i, step r10 per chunk.
    a.load64(RDX, mem(RBX, R_QAREA));
    a.mov(RAX, R12);
    a.shl_imm(RAX, 5);
    a.add(RDX, RAX);
    a.load64(RCX, mem(RSP, S_D8));
    a.mov(R8, RSI);
    a.mov(R9, RDX);
    let (sum, absmax, abs_mask) = (Ymm(1), Ymm(4), Ymm(3));
    a.vxorps(sum, sum, sum);
    if int8 {
        a.vxorps(absmax, absmax, absmax);
        a.vpbroadcastd_load(abs_mask, mem(RSP, S_ABS_MASK));
    }
    let (chunk, chunks_done) = (a.new_label(), a.new_label());
    if !int8 && zmm {
        // Several heads: the zmm score loop's layout, 16 d a chunk
        // (`qarea[⌈d/16⌉][8 heads][16]`): dst = qarea + 64·i, each pair of
        // 8-d chunks side by side.
        let (narrow, pairs, single) = (a.new_label(), a.new_label(), a.new_label());
        a.load64(RAX, mem(RBX, R_GT));
        a.cmp_imm(RAX, 1);
        a.jcc(Cond::E, narrow);
        a.mov(RAX, R12);
        a.shl_imm(RAX, 5);
        a.add(RDX, RAX);
        a.bind(pairs);
        a.cmp_imm(RCX, 2);
        a.jcc(Cond::L, single);
        for half in 0..2 {
            a.vcvtph2ps_load(Ymm(2), mem(RSI, 16 * half));
            a.vmovups_store(mem(RDX, 32 * half), Ymm(2));
        }
        a.add_imm(RSI, 32);
        a.add_imm(RDX, 512);
        a.sub_imm(RCX, 2);
        a.jmp(pairs);
        a.bind(single);
        a.cmp_imm(RCX, 0);
        a.jcc(Cond::E, chunks_done);
        a.vcvtph2ps_load(Ymm(2), mem(RSI, 0));
        a.vmovups_store(mem(RDX, 0), Ymm(2));
        a.jmp(chunks_done);
        a.bind(narrow);
    }
    a.bind(chunk);
    a.cmp_imm(RCX, 0);
    a.jcc(Cond::Le, chunks_done);
    a.vcvtph2ps_load(Ymm(2), mem(RSI, 0));
    if int8 {
        a.vandps(Ymm(5), Ymm(2), abs_mask);
        a.vmaxps(absmax, absmax, Ymm(5));
    } else {
        a.vmovups_store(mem(RDX, 0), Ymm(2));
    }
    a.vaddps(sum, sum, Ymm(2));
    a.add_imm(RSI, 16);
    a.add(RDX, R10);
    a.sub_imm(RCX, 1);
    a.jmp(chunk);
    a.bind(chunks_done);
    if int8 {
        // Σq and the i16 form's scale of head i → lane i of the record's.
        hsum(a, sum, Ymm(2));
        a.mov(RCX, R12);
        a.shl_imm(RCX, 2);
        a.lea(RAX, mem(RBX, R_SUMQ));
        a.add(RAX, RCX);
        a.vmovss_store(mem(RAX, 0), sum);
        if zmm {
            // Several heads: the zmm score loop's layout.
            let (one, packed) = (a.new_label(), a.new_label());
            a.load64(RAX, mem(RBX, R_GT));
            a.cmp_imm(RAX, 1);
            a.jcc(Cond::E, one);
            q_to_i16(a, RCX, true);
            if form.amx || form.lanes {
                amx_scores::q_int8_parts(a);
            }
            if form.lanes {
                lane_scores::q_code_bias(a);
            }
            a.jmp(packed);
            a.bind(one);
            q_to_i16(a, RCX, false);
            a.bind(packed);
        } else {
            q_to_i16(a, RCX, false);
        }
    }
    a.add_imm(R12, 1);
    a.jmp(head_loop);
    a.bind(heads_done);
}

/// After [`widen_q`]'s f32 pass over head r12 (row at r8, its qarea
/// column at r9, max|q| per lane in ymm4): the scale `m / C` (m = max|q|,
/// at least the least normal f32; C the code range at `S_I16_MAX`, 32767
/// or 32639 in the zmm forms up to d = 512) into the record's lane at
/// `rcx` bytes, and q·C/m
/// rounded to i16 into the head's chunks (a half chunk of 8 d first where
/// d/8 is odd, its upper 8 lanes zero).
fn q_to_i16(a: &mut X86Asm, lane_bytes: Gp, zmm: bool) {
    let (m, inv, t) = (Ymm(4), Ymm(6), Ymm(5));
    horizontal(a, m, t, X86Asm::vmaxps);
    a.vpbroadcastd_load(t, mem(RSP, S_TINY));
    a.vmaxps(m, m, t);
    a.vbroadcastss_reg(m, m);
    a.vpbroadcastd_load(t, mem(RSP, S_I16_MAX));
    a.vdivps(inv, t, m);
    a.vdivps(m, m, t);
    a.lea(RAX, mem(RBX, R_QSCALE));
    a.add(RAX, lane_bytes);
    a.vmovss_store(mem(RAX, 0), m);
    a.mov(RSI, R8);
    a.mov(RDX, R9);
    a.load64(RCX, mem(RSP, S_D8));
    // Two vectors of 8 f32 (ymm2, ymm3) → 16 i16 in order at [rdx + at].
    let pack_store_at = |a: &mut X86Asm, at: i32| {
        for v in [Ymm(2), Ymm(3)] {
            a.vmulps(v, v, inv);
            a.vcvtps2dq(v, v);
        }
        a.vperm2f128(Ymm(7), Ymm(2), Ymm(3), 0x20);
        a.vperm2f128(Ymm(8), Ymm(2), Ymm(3), 0x31);
        a.vpackssdw(Ymm(7), Ymm(7), Ymm(8));
        a.vmovups_store(mem(RDX, at), Ymm(7));
    };
    if zmm {
        return q_to_i16_zmm(a, pack_store_at);
    }
    let pack_store = |a: &mut X86Asm| {
        pack_store_at(a, 0);
        a.add(RDX, R10);
    };
    let (wholes, done) = (a.new_label(), a.new_label());
    a.test_imm(RCX, 1);
    a.jcc(Cond::E, wholes);
    a.vcvtph2ps_load(Ymm(2), mem(RSI, 0));
    a.vxorps(Ymm(3), Ymm(3), Ymm(3));
    pack_store(a);
    a.add_imm(RSI, 16);
    a.sub_imm(RCX, 1);
    a.bind(wholes);
    let whole = a.new_label();
    a.bind(whole);
    a.cmp_imm(RCX, 0);
    a.jcc(Cond::E, done);
    a.vcvtph2ps_load(Ymm(2), mem(RSI, 0));
    a.vcvtph2ps_load(Ymm(3), mem(RSI, 16));
    pack_store(a);
    a.add_imm(RSI, 32);
    a.sub_imm(RCX, 2);
    a.jmp(whole);
    a.bind(done);
}

/// [`q_to_i16`]'s codes in the zmm score loop's layout ([`key_pairs_zmm`]):
/// 32 d of head r12 at `qarea + 512·z + 64·r12` for chunk z, the last
/// chunk's lanes past d zero (rsi at q's row, rcx = d/8).
fn q_to_i16_zmm(a: &mut X86Asm, pack_store_at: impl Fn(&mut X86Asm, i32)) {
    a.load64(RDX, mem(RBX, R_QAREA));
    a.mov(RAX, R12);
    a.shl_imm(RAX, 6);
    a.add(RDX, RAX);
    let (whole, rest, half, done) = (a.new_label(), a.new_label(), a.new_label(), a.new_label());
    a.bind(whole);
    a.cmp_imm(RCX, 4);
    a.jcc(Cond::L, rest);
    for at in 0..2 {
        a.vcvtph2ps_load(Ymm(2), mem(RSI, 32 * at));
        a.vcvtph2ps_load(Ymm(3), mem(RSI, 32 * at + 16));
        pack_store_at(a, 32 * at);
    }
    a.add_imm(RSI, 64);
    a.add_imm(RDX, 512);
    a.sub_imm(RCX, 4);
    a.jmp(whole);
    a.bind(rest);
    a.cmp_imm(RCX, 2);
    a.jcc(Cond::L, half);
    a.vcvtph2ps_load(Ymm(2), mem(RSI, 0));
    a.vcvtph2ps_load(Ymm(3), mem(RSI, 16));
    pack_store_at(a, 0);
    a.add_imm(RSI, 32);
    a.add_imm(RDX, 32);
    a.sub_imm(RCX, 2);
    a.bind(half);
    a.cmp_imm(RCX, 0);
    a.jcc(Cond::E, done);
    a.vcvtph2ps_load(Ymm(2), mem(RSI, 0));
    a.vxorps(Ymm(3), Ymm(3), Ymm(3));
    pack_store_at(a, 0);
    a.bind(done);
}

/// Lane 0 of `v` = the sum of its 8 lanes (`t` clobbered).
fn hsum(a: &mut X86Asm, v: Ymm, t: Ymm) {
    horizontal(a, v, t, X86Asm::vaddps);
}

/// Lane 0 of `v` = `op` over its 8 lanes (`t` clobbered).
fn horizontal(a: &mut X86Asm, v: Ymm, t: Ymm, op: fn(&mut X86Asm, Ymm, Ymm, Ymm)) {
    a.vextractf128_hi(t, v);
    op(a, v, v, t);
    a.vpermilps_imm(t, v, 0x4e);
    op(a, v, v, t);
    a.vpermilps_imm(t, v, 0xb1u8 as i8);
    op(a, v, v, t);
}

/// Scores of the block's keys (`S_JB .. S_JEND`) for the tile at rbx into
/// its `sarea[j][8]` from the record's cursors, with the running max and
/// the in-range mask per head lane; dispatched on the tile's head count so
/// each variant's FMAs have constant offsets.
fn scores(a: &mut X86Asm, keys: Keys, softmax: SoftmaxMode, form: ScoreForm) {
    let dot = form.dot;
    let done = a.new_label();
    let variants: Vec<Label> = (0..MAX_TILE).map(|_| a.new_label()).collect();
    a.load64(RAX, mem(RBX, R_GT));
    for (g, l) in variants.iter().enumerate() {
        a.cmp_imm(RAX, g as i32 + 1);
        a.jcc(Cond::E, *l);
    }
    a.jmp(done);
    for (g, l) in variants.iter().enumerate() {
        a.bind(*l);
        if g == 0 {
            // One head: a whole block's keys at once where it has them.
            let per_key = a.new_label();
            a.load64(RAX, mem(RSP, S_JEND));
            a.load64(RDX, mem(RSP, S_JB));
            a.sub(RAX, RDX);
            a.cmp_imm(RAX, SCORE_BLOCK);
            a.jcc(Cond::Ne, per_key);
            score_one_head(a, keys, softmax, dot);
            a.jmp(done);
            a.bind(per_key);
        }
        score_loop(a, keys, softmax, form, g + 1);
        a.jmp(done);
    }
    a.bind(done);
}

/// A tile of one query head (multi-head attention: a KV head per query
/// head) scores the block's 4 keys at once: each loaded q chunk meets 4 K
/// rows, 8 accumulators (4 keys × even and odd chunks) keep 8 FMA chains
/// in flight where one head alone would wait on one, and one reduction
/// serves 4 keys. Lanes 0–3 of the result are the keys' scores, stored
/// side by side (the one-head `sarea` layout); the running max and
/// in-range mask take all four in every lane (only lane 0 is the tile's).
fn score_one_head(a: &mut X86Asm, keys: Keys, softmax: SoftmaxMode, dot: KeyDot) {
    let (maxv, ok, q) = (Ymm(13), Ymm(14), Ymm(12));
    let rows = [RSI, R8, R9, RBP];
    a.vmovups_load(maxv, mem(RBX, R_MAX));
    a.vmovups_load(ok, mem(RBX, R_OK));
    a.load64(R13, mem(RBX, R_KCUR));
    a.load64(R14, mem(RSP, S_KSTRIDE));
    // Prefetch the rows S_KAHEAD bytes on, whole.
    a.load64(RDX, mem(RSP, S_KAHEAD));
    a.add(RDX, R13);
    let row_bytes = if keys == Keys::F16 { 2 } else { 1 };
    for _ in 0..SCORE_BLOCK {
        a.mov(RSI, RDX);
        a.load64(RCX, mem(RSP, S_D));
        a.imul_imm(RCX, RCX, row_bytes);
        let line = a.new_label();
        a.bind(line);
        Prefetch::for_loop(keys, 1).line(a, mem(RSI, 0));
        a.add_imm(RSI, 64);
        a.sub_imm(RCX, 64);
        a.jcc(Cond::G, line);
        a.add(RDX, R14);
    }
    a.mov(rows[0], R13);
    for i in 1..4 {
        a.mov(rows[i], rows[i - 1]);
        a.add(rows[i], R14);
    }
    for i in 0..8 {
        a.vxorps(Ymm(i), Ymm(i), Ymm(i));
    }
    a.load64(RAX, mem(RBX, R_QAREA));
    a.load64(RCX, mem(RSP, S_D8));
    if keys == Keys::I8Asym {
        // q's i16 chunk against each key's codes as i16, into ymm key +
        // 4·set; the sums to f32 (exact below 2^24 a lane, and rounded by
        // at most 2^-24 of the sum above).
        let qs = q_chunk_bytes(1);
        let step = |a: &mut X86Asm, set: usize, at: i32, half: bool| {
            a.vmovdqu_load(q, mem(RAX, qs * at));
            for (i, &row) in rows.iter().enumerate() {
                let kx = Ymm(8 + i as u8);
                load_codes_i16(a, kx, mem(row, 16 * at), half);
                dot_i16(a, dot, Ymm((i + 4 * set) as u8), kx, q, Ymm(15));
            }
        };
        let advance = |a: &mut X86Asm, k_bytes: i32, q_bytes: i32, units: i32| {
            for &row in &rows {
                a.add_imm(row, k_bytes);
            }
            a.add_imm(RAX, q_bytes);
            a.sub_imm(RCX, units);
        };
        i16_chunks(a, 2, 4, qs, step, advance);
        for i in 0..4 {
            a.vcvtdq2ps(Ymm(i), Ymm(i));
        }
    } else {
        // Chunk `at` into accumulator set `set` (ymm key + 4·set).
        let qs = q_chunk_bytes(1);
        let chunk_step = |a: &mut X86Asm, set: usize, at: i32| {
            a.vmovups_load(q, mem(RAX, qs * at));
            for (i, &row) in rows.iter().enumerate() {
                let kx = Ymm(8 + i as u8);
                a.vcvtph2ps_load(kx, mem(row, at * 16));
                a.vfmadd231ps(Ymm((i + 4 * set) as u8), kx, q);
            }
        };
        let advance = |a: &mut X86Asm, chunks: i32| {
            for &row in &rows {
                a.add_imm(row, chunks * 16);
            }
            a.add_imm(RAX, qs * chunks);
            a.sub_imm(RCX, chunks);
        };
        even_odd_chunks(a, 4, chunk_step, advance);
    }
    reduce_lanes(a);
    let score = Ymm(1);
    if keys == Keys::I8Asym {
        // score = scale·dot + offset·Σq, the 4 keys' parameters gathered
        // into lanes 0–3 (the rest zero).
        a.load64(R10, mem(RSP, S_KVH));
        a.shl_imm(R10, 2);
        for (cursor, v) in [(R_SCCUR, Ymm(2)), (R_OFCUR, Ymm(3))] {
            a.load64(RSI, mem(RBX, cursor));
            a.vmovss_load(v, mem(RSI, 0));
            for lane in 1..4i8 {
                a.add(RSI, R10);
                a.vinsertps_load(v, v, mem(RSI, 0), lane << 4);
            }
            a.add(RSI, R10);
            a.store64(mem(RBX, cursor), RSI);
        }
        a.vpbroadcastd_load(Ymm(4), mem(RBX, R_QSCALE));
        a.vmulps(score, score, Ymm(4));
        a.vmulps(score, score, Ymm(2));
        a.vpbroadcastd_load(Ymm(2), mem(RBX, R_SUMQ));
        a.vfmadd231ps(score, Ymm(3), Ymm(2));
    }
    a.load64(R15, mem(RBX, R_SCUR));
    a.vmovups_store128(mem(R15, 0), score);
    a.add_imm(R15, 4 * SCORE_BLOCK);
    a.store64(mem(RBX, R_SCUR), R15);
    // The 4 keys' max in every lane.
    a.vpermilps_imm(Ymm(2), score, 0x4e);
    a.vmaxps(Ymm(2), score, Ymm(2));
    a.vpermilps_imm(Ymm(3), Ymm(2), 0xb1u8 as i8);
    a.vmaxps(Ymm(2), Ymm(2), Ymm(3));
    a.vperm2f128(Ymm(2), Ymm(2), Ymm(2), 0x00);
    a.vmaxps(maxv, Ymm(2), maxv);
    if let SoftmaxMode::Async { .. } = softmax {
        // ok &= every one of the 4 keys in range, in every lane.
        a.vsubps_mem(Ymm(2), score, mem(RSP, V_PHI));
        a.vmovups_load(Ymm(3), mem(RSP, V_LO));
        a.vcmpps(Ymm(4), Ymm(2), Ymm(3), 13); // ge (ordered)
        a.vmovups_load(Ymm(3), mem(RSP, V_HI));
        a.vcmpps(Ymm(5), Ymm(2), Ymm(3), 2); // le (ordered)
        a.vandps(Ymm(4), Ymm(4), Ymm(5));
        a.vpermilps_imm(Ymm(5), Ymm(4), 0x4e);
        a.vandps(Ymm(4), Ymm(4), Ymm(5));
        a.vpermilps_imm(Ymm(5), Ymm(4), 0xb1u8 as i8);
        a.vandps(Ymm(4), Ymm(4), Ymm(5));
        a.vperm2f128(Ymm(4), Ymm(4), Ymm(4), 0x00);
        a.vandps(ok, ok, Ymm(4));
    }
    a.mov(RAX, R14);
    a.imul_imm(RAX, RAX, SCORE_BLOCK);
    a.add(R13, RAX);
    a.store64(mem(RBX, R_KCUR), R13);
    a.vmovups_store(mem(RBX, R_MAX), maxv);
    a.vmovups_store(mem(RBX, R_OK), ok);
}

/// The chunk loop over rcx chunks into two accumulator sets (ymm `i` for
/// even chunks, ymm `i + 4` for odd ones, `i < sums`), an odd chunk first;
/// then the odd set folded into the even one and cleared. `step(a, set,
/// at)` does chunk `at` of a trip into `set`; `advance(a, n)` moves n
/// chunks on and counts rcx down (its flags end the loop). Clobbers r11.
fn even_odd_chunks(
    a: &mut X86Asm,
    sums: usize,
    step: impl Fn(&mut X86Asm, usize, i32),
    advance: impl Fn(&mut X86Asm, i32),
) {
    let (pairs, even, done) = (a.new_label(), a.new_label(), a.new_label());
    a.mov(R11, RCX);
    a.and_imm(R11, 1);
    a.jcc(Cond::E, even);
    step(a, 0, 0);
    advance(a, 1);
    a.jcc(Cond::E, done);
    a.bind(even);
    a.bind(pairs);
    step(a, 0, 0);
    step(a, 1, 1);
    advance(a, 2);
    a.jcc(Cond::Ne, pairs);
    a.bind(done);
    for i in 0..sums as u8 {
        a.vaddps(Ymm(i), Ymm(i), Ymm(i + 4));
        a.vxorps(Ymm(i + 4), Ymm(i + 4), Ymm(i + 4));
    }
}

/// ymm1 = the sums of ymm0 … ymm7, lane i the sum of ymm i (clobbers
/// ymm0–ymm7).
fn reduce_lanes(a: &mut X86Asm) {
    reduce_lanes_from(a, [0, 1, 2, 3, 4, 5, 6, 7]);
}

/// ymm1 = the sums of the 8 registers `r`, lane i the sum of `r[i]`
/// (clobbers them, ymm1 and ymm3; a register may stand twice where it is
/// zero).
fn reduce_lanes_from(a: &mut X86Asm, r: [u8; 8]) {
    let y = |i: usize| Ymm(r[i]);
    a.vhaddps(y(0), y(0), y(1));
    a.vhaddps(y(2), y(2), y(3));
    a.vhaddps(y(4), y(4), y(5));
    a.vhaddps(y(6), y(6), y(7));
    a.vhaddps(y(0), y(0), y(2));
    a.vhaddps(y(4), y(4), y(6));
    a.vperm2f128(Ymm(1), y(0), y(4), 0x20);
    a.vperm2f128(Ymm(3), y(0), y(4), 0x31);
    a.vaddps(Ymm(1), Ymm(1), Ymm(3));
}

/// A key's chunk loop cursors: rsi = its K row (r13), rax = the tile's
/// qarea, rcx = chunks (d/8), rdx = the row `S_KAHEAD` bytes on, which
/// the loop prefetches.
fn chunk_cursors(a: &mut X86Asm) {
    a.mov(RSI, R13);
    a.load64(RAX, mem(RBX, R_QAREA));
    a.load64(RCX, mem(RSP, S_D8));
    a.load64(RDX, mem(RSP, S_KAHEAD));
    a.add(RDX, R13);
}

fn score_loop(a: &mut X86Asm, keys: Keys, softmax: SoftmaxMode, form: ScoreForm, g: usize) {
    let (dot, zmm) = (form.dot, form.zmm);
    let (maxv, ok) = (Ymm(13), Ymm(14));
    a.load64(R13, mem(RBX, R_KCUR));
    a.load64(R14, mem(RSP, S_KSTRIDE));
    a.load64(R15, mem(RBX, R_SCUR));
    if keys == Keys::I8Asym {
        a.load64(R8, mem(RBX, R_SCCUR));
        a.load64(R9, mem(RBX, R_OFCUR));
        a.load64(R10, mem(RSP, S_KVH));
        a.shl_imm(R10, 2);
    }
    // r12 = keys left in the block (at least one).
    a.load64(R12, mem(RSP, S_JEND));
    a.load64(RAX, mem(RSP, S_JB));
    a.sub(R12, RAX);
    let keys_done = a.new_label();
    if zmm && g > 1 {
        if form.amx {
            amx_scores::key_tiles(a, softmax, g);
            a.cmp_imm(R12, 0);
            a.jcc(Cond::E, keys_done);
        }
        if form.lanes && lane_scores::HEADS.contains(&g) {
            lane_scores::key_trips(a, softmax, g);
            a.cmp_imm(R12, 0);
            a.jcc(Cond::E, keys_done);
        }
        key_pairs_zmm(a, keys, softmax, g);
        a.jmp(keys_done);
    }
    if (MAX_TILE / 2 + 1..=PAIR_HEADS).contains(&g) {
        key_pairs(a, keys, softmax, dot, g);
        a.cmp_imm(R12, 0);
        a.jcc(Cond::E, keys_done);
    }
    a.vmovups_load(maxv, mem(RBX, R_MAX));
    a.vmovups_load(ok, mem(RBX, R_OK));
    let key_loop = a.new_label();
    a.bind(key_loop);
    for i in 0..MAX_TILE {
        a.vxorps(Ymm(i as u8), Ymm(i as u8), Ymm(i as u8));
    }
    chunk_cursors(a);
    if keys == Keys::I8Asym {
        // Heads ≤ 4: two accumulator sets (ymm i, i + 4), so no head's sum
        // waits on one chain; more heads: one set.
        let sets = if g <= MAX_TILE / 2 { 2 } else { 1 };
        let qs = q_chunk_bytes(g);
        let step = |a: &mut X86Asm, set: usize, at: i32, half: bool| {
            let kx = Ymm(8 + set as u8);
            Prefetch::for_loop(keys, g).line(a, mem(RDX, 16 * at));
            load_codes_i16(a, kx, mem(RSI, 16 * at), half);
            for i in 0..g {
                a.vmovdqu_load(Ymm(10), mem(RAX, qs * at + 32 * i as i32));
                dot_i16(a, dot, Ymm((i + 4 * set) as u8), kx, Ymm(10), Ymm(11));
            }
        };
        let advance = |a: &mut X86Asm, k_bytes: i32, q_bytes: i32, units: i32| {
            a.add_imm(RSI, k_bytes);
            a.add_imm(RDX, k_bytes);
            a.add_imm(RAX, q_bytes);
            a.sub_imm(RCX, units);
        };
        i16_chunks(a, sets, g, qs, step, advance);
        for i in 0..g as u8 {
            a.vcvtdq2ps(Ymm(i), Ymm(i));
        }
    } else {
        f16_key_chunks(a, g);
    }
    // Reduce 8 accumulators to one vector of 8 head sums.
    reduce_lanes(a);
    key_score(a, keys, softmax, g, maxv, ok);
    a.sub_imm(R12, 1);
    a.jcc(Cond::Ne, key_loop);
    a.vmovups_store(mem(RBX, R_MAX), maxv);
    a.vmovups_store(mem(RBX, R_OK), ok);
    a.bind(keys_done);
    a.store64(mem(RBX, R_KCUR), R13);
    a.store64(mem(RBX, R_SCUR), R15);
    if keys == Keys::I8Asym {
        a.store64(mem(RBX, R_SCCUR), R8);
        a.store64(mem(RBX, R_OFCUR), R9);
    }
}

/// f16 keys: one key's chunk loop for a tile of `g` heads (cursors from
/// [`chunk_cursors`]) into ymm0–7, lane sums still to reduce.
fn f16_key_chunks(a: &mut X86Asm, g: usize) {
    let step = 16;
    let qs = q_chunk_bytes(g);
    // One chunk into accumulator set `set` (ymm i + 4·set for head i).
    let chunk_step = |a: &mut X86Asm, set: usize, at: i32| {
        let kx = Ymm(8 + set as u8);
        Prefetch::for_loop(Keys::F16, g).line(a, mem(RDX, at * step));
        a.vcvtph2ps_load(kx, mem(RSI, at * step));
        for i in 0..g {
            a.vfmadd231ps_mem(
                Ymm((i + 4 * set) as u8),
                kx,
                mem(RAX, qs * at + 32 * i as i32),
            );
        }
    };
    let advance = |a: &mut X86Asm, chunks: i32| {
        a.add_imm(RSI, chunks * step);
        a.add_imm(RDX, chunks * step);
        a.add_imm(RAX, qs * chunks);
        a.sub_imm(RCX, chunks);
    };
    if g <= MAX_TILE / 2 {
        // Two accumulators per head (even and odd chunks), so no head's
        // sum waits on one FMA chain d/8 long.
        even_odd_chunks(a, g, chunk_step, advance);
    } else {
        // More heads than two accumulator sets hold: one set, 4 chunks a
        // trip (a line of f16 keys, one prefetch), then single chunks.
        let quad_step = |a: &mut X86Asm, at: i32| {
            let kx = Ymm(8 + (at % 2) as u8);
            a.vcvtph2ps_load(kx, mem(RSI, at * step));
            for i in 0..g {
                a.vfmadd231ps_mem(Ymm(i as u8), kx, mem(RAX, qs * at + 32 * i as i32));
            }
        };
        let (quads, single, chunk, chunks_done) =
            (a.new_label(), a.new_label(), a.new_label(), a.new_label());
        a.bind(quads);
        a.cmp_imm(RCX, 4);
        a.jcc(Cond::L, single);
        Prefetch::for_loop(Keys::F16, g).line(a, mem(RDX, 0));
        for at in 0..4 {
            quad_step(a, at);
        }
        advance(a, 4);
        a.jmp(quads);
        a.bind(single);
        a.cmp_imm(RCX, 0);
        a.jcc(Cond::E, chunks_done);
        a.bind(chunk);
        chunk_step(a, 0, 0);
        advance(a, 1);
        a.jcc(Cond::Ne, chunk);
        a.bind(chunks_done);
    }
}

/// After a key's head sums are in ymm1: its scores (int8 keys:
/// `scale·dot + offset·Σq`) stored, the running max and the range flags
/// updated; r13 and r15 (and the int8 parameter cursors) moved on.
/// Clobbers ymm2–ymm5.
fn key_score(a: &mut X86Asm, keys: Keys, softmax: SoftmaxMode, g: usize, maxv: Ymm, ok: Ymm) {
    let score = Ymm(1);
    if keys == Keys::I8Asym {
        // score = scale·(q scale·dot) + offset·Σq.
        a.vmulps_mem(score, score, mem(RBX, R_QSCALE));
        a.vpbroadcastd_load(Ymm(2), mem(R8, 0));
        a.vmulps(score, score, Ymm(2));
        a.vpbroadcastd_load(Ymm(2), mem(R9, 0));
        a.vfmadd231ps_mem(score, Ymm(2), mem(RBX, R_SUMQ));
        a.add(R8, R10);
        a.add(R9, R10);
    }
    // A one-head tile keeps its keys' scores side by side.
    let p_stride = if g == 1 {
        a.vmovss_store(mem(R15, 0), score);
        4
    } else {
        a.vmovups_store(mem(R15, 0), score);
        32
    };
    a.vmaxps(maxv, score, maxv);
    if let SoftmaxMode::Async { .. } = softmax {
        // ok &= (score − phi ≥ lo) & (score − phi ≤ hi); NaN is out.
        a.vsubps_mem(Ymm(2), score, mem(RSP, V_PHI));
        a.vmovups_load(Ymm(3), mem(RSP, V_LO));
        a.vcmpps(Ymm(4), Ymm(2), Ymm(3), 13); // ge (ordered)
        a.vmovups_load(Ymm(3), mem(RSP, V_HI));
        a.vcmpps(Ymm(5), Ymm(2), Ymm(3), 2); // le (ordered)
        a.vandps(ok, ok, Ymm(4));
        a.vandps(ok, ok, Ymm(5));
    }
    a.add(R13, R14);
    a.add_imm(R15, p_stride);
}

/// The most heads [`key_pairs`] serves: two keys' accumulators (2·6), both
/// keys widened and one q chunk fill 15 ymm.
const PAIR_HEADS: usize = 6;

/// Keys two at a time while r12 ≥ 2, for tiles of 5 or 6 heads (GQA 6:
/// Qwen2): each q chunk is loaded once into a register for both keys'
/// FMAs. The one-key loop reads q from memory for every FMA: 7 vector
/// loads per 6 FMAs, and Zen 4 issues two vector loads a cycle (llvm-mca's
/// znver4 model: 58 of the 69 cycles a key are the load pipes); here 8
/// loads feed 12 FMAs. Key 0's heads sum in ymm0–5, key 1's in ymm6–11,
/// the keys widen into ymm12 and ymm13, q goes in ymm14. The running max
/// and range flags stay in the tile record (the one-key loop holds them
/// in ymm13 and ymm14).
fn key_pairs(a: &mut X86Asm, keys: Keys, softmax: SoftmaxMode, dot: KeyDot, g: usize) {
    let (pairs, done) = (a.new_label(), a.new_label());
    let (kx0, kx1, q) = (Ymm(12), Ymm(13), Ymm(14));
    let acc = |key: usize, h: usize| Ymm((key * PAIR_HEADS + h) as u8);
    let qs = q_chunk_bytes(g);
    a.bind(pairs);
    a.cmp_imm(R12, 2);
    a.jcc(Cond::L, done);
    for i in 0..2 * PAIR_HEADS as u8 {
        a.vxorps(Ymm(i), Ymm(i), Ymm(i));
    }
    // r11 = the second key's row (both keys' lines are prefetched from
    // rdx, the first key's S_KAHEAD bytes on).
    chunk_cursors(a);
    a.lea(R11, mem(R13, 0));
    a.add(R11, R14);
    let prefetch = Prefetch::for_loop(keys, g);
    let prefetch_both = |a: &mut X86Asm, at: i32| {
        prefetch.line(a, mem(RDX, at));
        a.add(RDX, R14);
        prefetch.line(a, mem(RDX, at));
        a.sub(RDX, R14);
    };
    if keys == Keys::I8Asym {
        // q's i16 chunks; ymm15 is `vpmaddwd`'s product.
        let step = |a: &mut X86Asm, _set: usize, at: i32, half: bool| {
            prefetch_both(a, 16 * at);
            for (kx, row) in [(kx0, RSI), (kx1, R11)] {
                load_codes_i16(a, kx, mem(row, 16 * at), half);
            }
            for h in 0..g {
                a.vmovdqu_load(q, mem(RAX, qs * at + 32 * h as i32));
                dot_i16(a, dot, acc(0, h), kx0, q, Ymm(15));
                dot_i16(a, dot, acc(1, h), kx1, q, Ymm(15));
            }
        };
        let advance = |a: &mut X86Asm, k_bytes: i32, q_bytes: i32, units: i32| {
            a.add_imm(RSI, k_bytes);
            a.add_imm(R11, k_bytes);
            a.add_imm(RDX, k_bytes);
            a.add_imm(RAX, q_bytes);
            a.sub_imm(RCX, units);
        };
        i16_chunks(a, 1, g, qs, step, advance);
        for i in 0..2 * PAIR_HEADS as u8 {
            a.vcvtdq2ps(Ymm(i), Ymm(i));
        }
    } else {
        let chunk = a.new_label();
        a.bind(chunk);
        prefetch_both(a, 0);
        for (kx, row) in [(kx0, RSI), (kx1, R11)] {
            a.vcvtph2ps_load(kx, mem(row, 0));
        }
        for h in 0..g {
            a.vmovups_load(q, mem(RAX, 32 * h as i32));
            a.vfmadd231ps(acc(0, h), kx0, q);
            a.vfmadd231ps(acc(1, h), kx1, q);
        }
        a.add_imm(RSI, 16);
        a.add_imm(R11, 16);
        a.add_imm(RDX, 16);
        a.add_imm(RAX, qs);
        a.sub_imm(RCX, 1);
        a.jcc(Cond::Ne, chunk);
    }
    // Per key: the head sums into ymm1 (the unused lanes from a zeroed
    // ymm12), then its score; the max and flags in ymm15 and ymm14.
    let (maxv, ok, zero) = (Ymm(15), Ymm(14), Ymm(12));
    a.vxorps(zero, zero, zero);
    a.vmovups_load(maxv, mem(RBX, R_MAX));
    a.vmovups_load(ok, mem(RBX, R_OK));
    for key in 0..2 {
        let mut r = [zero.0; 8];
        for (h, slot) in r.iter_mut().enumerate().take(g) {
            *slot = acc(key, h).0;
        }
        reduce_lanes_from(a, r);
        key_score(a, keys, softmax, g, maxv, ok);
    }
    a.vmovups_store(mem(RBX, R_MAX), maxv);
    a.vmovups_store(mem(RBX, R_OK), ok);
    a.sub_imm(R12, 2);
    a.jmp(pairs);
    a.bind(done);
}

/// The accumulator of key k's head h in [`key_pairs_zmm`]: [`sum_tree`]
/// leaves the sum of zmm `PAIR_SLOTS[i]` in lane i, so lanes 0–7 are key
/// 0's heads and 8–15 key 1's.
const PAIR_SLOTS: [u8; 16] = [0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15];
const _: () = assert!(PAIR_SLOTS.len() == 2 * MAX_TILE);

/// zmm0 lane i = the sum (i32 where `int`, else f32) of zmm
/// `PAIR_SLOTS[i]`'s 16 lanes for the slots of heads below `g` (the others
/// read as zero, whatever their registers hold; zmm0–15 and `t` clobbered,
/// `zero` read): pairs of two
/// lane shuffles and an add, halving the lanes per sum while doubling the
/// sums per register (512 → 256 → 128 bits by `vshufi32x4`, 64 by
/// `vpunpck{l,h}qdq`, 32 by `vshufps`). A pair with no live slot is
/// skipped; a first-level pair whose upper slot is not live folds its
/// lower one by an extract and a 256-bit add (which zeroes the upper half):
/// a GQA-4 tile's tree takes 37 instructions, GQA-6's 41, against 45.
fn sum_tree(a: &mut X86Asm, t: Zmm, zero: Zmm, g: usize, int: bool) {
    let mut live = [false; 16];
    for key in 0..2 {
        for h in 0..g {
            live[PAIR_SLOTS[8 * key + h] as usize] = true;
        }
    }
    type Shuffle<'s> = &'s dyn Fn(&mut X86Asm, Zmm, Zmm, Zmm, bool);
    let fold = |a: &mut X86Asm, live: &mut [bool; 16], x: u8, y: u8, shuffle: Shuffle| {
        let (lx, ly) = (live[x as usize], live[y as usize]);
        let src = |r: u8, l: bool| if l { Zmm(r) } else { zero };
        if lx || ly {
            shuffle(a, t, src(x, lx), src(y, ly), false);
            shuffle(a, Zmm(y), src(x, lx), src(y, ly), true);
            if int {
                a.vpaddd_zmm(Zmm(x), t, Zmm(y));
            } else {
                a.vaddps_zmm(Zmm(x), t, Zmm(y));
            }
        }
        live[x as usize] = lx || ly;
    };
    let lanes = |imm_lo: u8, imm_hi: u8| {
        move |a: &mut X86Asm, d: Zmm, x: Zmm, y: Zmm, hi: bool| {
            a.vshufi32x4_zmm(d, x, y, if hi { imm_hi } else { imm_lo })
        }
    };
    for i in 0..8 {
        if live[i as usize] && !live[i as usize + 8] {
            a.vextracti64x4_hi(Ymm(i + 8), Zmm(i));
            if int {
                a.vpaddd(Ymm(i), Ymm(i), Ymm(i + 8));
            } else {
                a.vaddps(Ymm(i), Ymm(i), Ymm(i + 8));
            }
        } else {
            fold(a, &mut live, i, i + 8, &lanes(0x44, 0xEE));
        }
    }
    for i in 0..4 {
        fold(a, &mut live, i, i + 4, &lanes(0x88, 0xDD));
    }
    let qwords = |a: &mut X86Asm, d: Zmm, x: Zmm, y: Zmm, hi: bool| {
        if hi {
            a.vpunpckhqdq_zmm(d, x, y)
        } else {
            a.vpunpcklqdq_zmm(d, x, y)
        }
    };
    for i in 0..2 {
        fold(a, &mut live, i, i + 2, &qwords);
    }
    let dwords = |a: &mut X86Asm, d: Zmm, x: Zmm, y: Zmm, hi: bool| {
        a.vshufps_zmm(d, x, y, if hi { 0xDD } else { 0x88 })
    };
    fold(a, &mut live, 0, 1, &dwords);
}

/// Keys for a tile of several heads on zmm, two at a time while r12 ≥ 2
/// (then one, paired with itself). Per 32 bytes of each K row (a chunk:
/// 32 lanes of d for int8 keys, by `vpmovsxbw` and AVX512-VNNI
/// `vpdpwssd`; 16 for f16 keys, by `vcvtph2ps` and `vfmadd231ps`; the last
/// chunk under k2 where d is not a whole number of them) one widening
/// load per key and per head one q load and a product per key, where the
/// ymm loops take two of each; two chunks (a line of each row, one
/// prefetch each) a trip. The 16 sums (2 keys × 8 head slots) reduce
/// through one tree ([`sum_tree`], in i32 for int8 keys, converted once).
/// The keys widen into zmm16 and zmm17, q goes in zmm18, zmm19 is the
/// tree's, zmm20 zero. f16 keys of Qwen2-1.5B's 6-head tiles took 96 ymm
/// FMAs a key on the ymm loop, 48 here.
fn key_pairs_zmm(a: &mut X86Asm, keys: Keys, softmax: SoftmaxMode, g: usize) {
    let (kx0, kx1, q) = (Zmm(16), Zmm(17), Zmm(18));
    let acc = |key: usize, h: usize| Zmm(PAIR_SLOTS[8 * key + h]);
    // A chunk: 32 bytes of each K row, 32 lanes of d (int8 keys as i16)
    // or 16 (f16 keys as f32); k2 = the lanes of a last chunk of d % lanes.
    let int8 = keys == Keys::I8Asym;
    let lanes: i32 = if int8 { 32 } else { 16 };
    a.load64(RCX, mem(RSP, S_D));
    a.and_imm(RCX, lanes - 1);
    a.mov_imm(RAX, 1);
    a.shl_cl(RAX);
    a.sub_imm(RAX, 1);
    a.kmovd_from_gp(Kreg(2), RAX);
    let zero = Zmm(20);
    a.vpxord_zmm(zero, zero, zero);
    let (pair, chunk, tail, reduce) = (a.new_label(), a.new_label(), a.new_label(), a.new_label());
    a.bind(pair);
    for key in 0..2 {
        for h in 0..g {
            a.vpxord_zmm(acc(key, h), acc(key, h), acc(key, h));
        }
    }
    // rsi, r11 = the two keys' rows (the same where one key is left),
    // rdx = the first's `S_KAHEAD` bytes on, rax = q, rcx = whole chunks.
    a.mov(RSI, R13);
    a.mov(R11, R13);
    let single = a.new_label();
    a.cmp_imm(R12, 2);
    a.jcc(Cond::L, single);
    a.add(R11, R14);
    a.bind(single);
    a.load64(RDX, mem(RSP, S_KAHEAD));
    a.add(RDX, R13);
    a.load64(RAX, mem(RBX, R_QAREA));
    a.load64(RCX, mem(RSP, S_D));
    a.shr_imm(RCX, lanes.trailing_zeros() as i8);
    a.cmp_imm(RCX, 0);
    a.jcc(Cond::E, tail);
    // Chunk `at` of a trip.
    let step = |a: &mut X86Asm, k: Kreg, at: i32| {
        for (kx, row) in [(kx0, RSI), (kx1, R11)] {
            if int8 {
                a.vpmovsxbw_zmm_load_masked(kx, k, mem(row, 32 * at));
            } else {
                a.vcvtph2ps_zmm_load_masked(kx, k, mem(row, 32 * at));
            }
        }
        for h in 0..g {
            a.vmovdqu32_zmm_load(q, mem(RAX, 512 * at + 64 * h as i32));
            for (key, kx) in [kx0, kx1].into_iter().enumerate() {
                if int8 {
                    a.vpdpwssd_zmm(acc(key, h), kx, q);
                } else {
                    a.vfmadd231ps_zmm(acc(key, h), kx, q);
                }
            }
        }
    };
    let prefetch = Prefetch::for_loop(keys, g);
    let prefetch_both = |a: &mut X86Asm| {
        prefetch.line(a, mem(RDX, 0));
        a.add(RDX, R14);
        prefetch.line(a, mem(RDX, 0));
        a.sub(RDX, R14);
    };
    let advance = |a: &mut X86Asm, chunks: i32| {
        a.add_imm(RSI, 32 * chunks);
        a.add_imm(R11, 32 * chunks);
        a.add_imm(RDX, 32 * chunks);
        a.add_imm(RAX, 512 * chunks);
        a.sub_imm(RCX, chunks);
    };
    // Two chunks (a line of each row, one prefetch each) a trip, then a
    // lone one.
    let (lone, chunks_done) = (a.new_label(), a.new_label());
    a.bind(chunk);
    a.cmp_imm(RCX, 2);
    a.jcc(Cond::L, lone);
    prefetch_both(a);
    step(a, Kreg(0), 0);
    step(a, Kreg(0), 1);
    advance(a, 2);
    a.jmp(chunk);
    a.bind(lone);
    a.cmp_imm(RCX, 0);
    a.jcc(Cond::E, chunks_done);
    prefetch_both(a);
    step(a, Kreg(0), 0);
    advance(a, 1);
    a.bind(chunks_done);
    a.bind(tail);
    a.load64(RCX, mem(RSP, S_D));
    a.test_imm(RCX, lanes - 1);
    a.jcc(Cond::E, reduce);
    step(a, Kreg(2), 0);
    a.bind(reduce);
    sum_tree(a, Zmm(19), zero, g, int8);
    if int8 {
        a.vcvtdq2ps_zmm(Zmm(0), Zmm(0));
    }
    // Key 1's head sums in ymm6 (key_score keeps ymm6), key 0's in ymm1.
    a.vextracti64x4_hi(Ymm(6), Zmm(0));
    a.vmovaps_reg(Ymm(1), Ymm(0));
    let (maxv, ok) = (Ymm(15), Ymm(14));
    a.vmovups_load(maxv, mem(RBX, R_MAX));
    a.vmovups_load(ok, mem(RBX, R_OK));
    key_score(a, keys, softmax, g, maxv, ok);
    let one = a.new_label();
    a.sub_imm(R12, 1);
    a.jcc(Cond::E, one);
    a.vmovaps_reg(Ymm(1), Ymm(6));
    key_score(a, keys, softmax, g, maxv, ok);
    a.sub_imm(R12, 1);
    a.bind(one);
    a.vmovups_store(mem(RBX, R_MAX), maxv);
    a.vmovups_store(mem(RBX, R_OK), ok);
    a.cmp_imm(R12, 0);
    a.jcc(Cond::Ne, pair);
}

/// Per head lane of the tile at rbx, the reference the exponentials are
/// taken against: `phi` while every score so far was in range, else the
/// running max (the online softmax's, exactly where it did not move).
/// What the tile has summed against the old reference is rescaled by
/// `α = e^(old − new)`, skipped where no lane moved.
fn rebase(a: &mut X86Asm, softmax: SoftmaxMode) {
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
fn scale_num(a: &mut X86Asm) {
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
fn count_recomputed(a: &mut X86Asm, softmax: SoftmaxMode) {
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
fn exponentials(a: &mut X86Asm, values: Values, f16_p: bool, zmm: bool) {
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
pub(super) const EXP_REGS: [Ymm; 4] = [Ymm(1), Ymm(5), Ymm(2), Ymm(4)];

/// `p = e^x` for the lanes of a register (x clamped to [−87.3, 88.7],
/// clobbered; n, f clobbered; `k127` holds 127 in every lane): 2^n by the
/// exponent field times a degree-6 Taylor polynomial of the Cody–Waite
/// remainder, as the cranelift `exp`. A NaN x becomes the lower clamp
/// (`vmaxps` returns its second source on NaN). One sequence for both
/// register files, so a zmm lane equals the ymm form's bit for bit.
pub(super) fn exp_ps<R: ExpRegister>(a: &mut X86Asm, x: R, n: R, f: R, p: R, k127: R) {
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
pub(super) trait ExpRegister: Copy {
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

/// One output row: `d/8` chunks (their count at `d8`) of the numerator at
/// rdx, `stride` bytes apart, over the denominator in ymm1, to f16 at rsi.
/// Clobbers rcx, rdx, rsi, ymm0.
pub(super) fn store_normalized_row(a: &mut X86Asm, d8: Mem, stride: Stride) {
    a.load64(RCX, d8);
    let chunk = a.new_label();
    a.bind(chunk);
    a.vmovups_load(Ymm(0), mem(RDX, 0));
    a.vdivps(Ymm(0), Ymm(0), Ymm(1));
    a.vcvtps2ph_store(mem(RSI, 0), Ymm(0), 0);
    a.add_imm(RSI, 16);
    stride.advance(a, RDX);
    a.sub_imm(RCX, 1);
    a.jcc(Cond::Ne, chunk);
}

/// How far a loop's cursor moves per chunk: a constant, or a register's
/// value (a stride known only at run time).
#[derive(Clone, Copy, Debug)]
pub(super) enum Stride {
    Bytes(i32),
    Reg(Gp),
}

impl Stride {
    fn advance(self, a: &mut X86Asm, cursor: Gp) {
        match self {
            Stride::Bytes(n) => a.add_imm(cursor, n),
            Stride::Reg(r) => a.add(cursor, r),
        }
    }
}

/// 8 fp8 e4m3 codes (zero-extended to dwords in `vx`) → f32 in `vx`,
/// exactly, subnormals included: sign to bit 31, exponent and mantissa
/// shifted into f32's fields (2^-120 of the value), then × 2^120 (a power
/// of two). `consts` hold `V_SIGN`, `V_MAG`, `V_2P120`; `t` is clobbered.
pub(super) fn widen_e4m3(a: &mut X86Asm, vx: Ymm, t: Ymm, consts: [Ymm; 3]) {
    let [sign, mag, scale] = consts;
    a.vpslld_imm(t, vx, 24);
    a.vpslld_imm(vx, vx, 20);
    a.vpand(t, t, sign);
    a.vpand(vx, vx, mag);
    a.vorps(vx, vx, t);
    a.vmulps(vx, vx, scale);
}

/// The P·V pass's register file: ymm0–15, or with AVX512VL ymm0–31
/// (EVEX forms wherever an operand is past 15). A pass holds the widened
/// row's chunk in ymm0, then its heads' p broadcasts, then their
/// accumulators; or, where the broadcasts do not fit
/// ([`PvRegisters::widen_once`]), the widened chunks, one broadcast
/// register and the accumulators.
#[derive(Clone, Copy, PartialEq, Eq)]
struct PvRegisters {
    ymm32: bool,
    /// fp8 values in ymm0–15: a pass takes every head of a tile, so each
    /// key's values are widened once, not once per pass of 3 heads, and p
    /// is broadcast one head at a time into one register. fp8's widening
    /// ([`fp8_row_to_f16`]) outweighs the broadcasts: a hot Qwen2-1.5B
    /// kv8 call (1024 keys, one thread) took 104 µs against 112 with
    /// passes of 3 heads, best of 5 (AMD Zen 3). f16 values keep passes of
    /// 3 heads: there the conversion is one load, and the broadcasts'
    /// loads made 12 FMAs slower in a loop held in L1 (5.5 TSC ticks
    /// against 4.7).
    widen_once: bool,
    /// fp8 values widened straight to f32 bits of 2^-120 of the value, a
    /// chunk at a time in registers ([`fp8_chunk_to_f32`]), instead of to
    /// f16 bits in the frame ([`fp8_row_to_f16`]); p is then stored ×
    /// [`FP8_F32_P_SCALE`] and `num` rescaled where the tile finishes. A
    /// one-head pass of 8 chunks took 12.9 cycles a key this way against
    /// 15.3–15.7 by the frame, in a loop held in L1 on an AMD Zen 3 (the
    /// frame's `vcvtph2ps` waits on the stores it reads). With AVX512VL
    /// the several-head passes widen 16 at a time on zmm ([`pv_pass_zmm`])
    /// where the packed forms (`bf16`, `f16`) are not taken.
    fp8_f32: bool,
    /// fp8 values by bf16 dots ([`pv_pass_bf16`]): zmm accumulators.
    bf16: bool,
    /// Several-head tiles by f16 FMAs ([`pv_pass_f16`]): accumulators of
    /// 16 lanes (two chunks), p broadcast from memory.
    f16: bool,
    /// Several-head tiles by f32 FMAs on zmm ([`pv_pass_zmm`]): 16 lanes
    /// an FMA where a ymm takes 8, so a pass holds 64 lanes of d for 6
    /// heads. f16 values, and fp8 values with `fp8_f32`; where the CPU has
    /// AVX512VL and the packed forms are not taken.
    zmm_f32: bool,
}

impl PvRegisters {
    /// The vector registers of the target the pass runs on (`x86-avx2`,
    /// or `x86-avx512` whose EVEX names 32).
    fn count(self) -> usize {
        let name = if self.ymm32 {
            super::AVX512_NAME
        } else {
            super::NAME
        };
        crate::target::TargetCaps::by_name(name)
            .expect("x86 targets are built in")
            .registers as usize
    }

    /// Heads per pass: the most whose accumulators for 4 chunks, their
    /// broadcasts and the widened row fit ([`Self::p_in_registers_heads`]).
    /// With [`Self::widen_once`] a whole tile, its p broadcast a head at a
    /// time past that many heads. The bf16 pass sums 2 chunks per zmm, so
    /// a whole tile fits ([`MAX_TILE`]: 8 heads at 4 chunks, 6 at 6) and a
    /// GQA-7 or GQA-8 tile converts each key's values once, not twice.
    fn heads(self) -> usize {
        if self.f16 || self.widen_once {
            return MAX_TILE;
        }
        if self.bf16 {
            // A head's p and at least one accumulator.
            return ((self.count() - BF16_FIXED) / 2).min(MAX_TILE);
        }
        self.p_in_registers_heads()
    }

    /// Heads whose accumulators for 4 chunks and p broadcasts fit beside
    /// one row register (16 registers: 3, 32: 6).
    fn p_in_registers_heads(self) -> usize {
        (self.count() - 1) / 5
    }

    /// Chunks of 8 lanes of d per P·V group for a tile of `heads` heads:
    /// as many accumulators as the file holds beside each pass's p
    /// broadcasts and the widened row (with [`Self::widen_once`] past
    /// [`Self::p_in_registers_heads`]: beside the widened chunks and one
    /// broadcast register), at most 8; or 16 where that many fit (one head in ymm0–31), so a 128-wide head takes one group and
    /// each key's pass overhead is paid once (Llama2 kv8 hot about 3%
    /// faster on Zen 4, cold within noise).
    fn group_chunks(self, heads: usize) -> usize {
        let heads = heads.min(self.heads());
        if self.f16 {
            // 32-lane accumulators (4 chunks) beside the row and the
            // flush's scale.
            return (4 * ((self.count() - 2) / heads)).min(16);
        }
        if self.bf16 {
            // zmm accumulators of 2 chunks beside the heads' p and the
            // pass's 6 others.
            return (2 * ((self.count() - BF16_FIXED - heads) / heads)).min(16);
        }
        if self.zmm_f32 {
            // zmm accumulators of 2 chunks beside the p broadcasts and the
            // value chunk.
            return (2 * ((self.count() - 1 - heads) / heads)).min(16);
        }
        if self.widen_once && heads > self.p_in_registers_heads() {
            return ((self.count() - 1) / (heads + 1)).min(8);
        }
        let fit = (self.count() - 1 - heads) / heads;
        if fit >= 16 { 16 } else { fit.min(8) }
    }

    /// `vfmadd231ps`, VEX or EVEX by the registers.
    fn fma(self, a: &mut X86Asm, dst: Ymm, x: Ymm, y: Ymm) {
        if dst.0.max(x.0).max(y.0) < 16 {
            a.vfmadd231ps(dst, x, y);
        } else {
            a.vfmadd231ps_ymm_evex(dst, x, y);
        }
    }

    fn load(self, a: &mut X86Asm, dst: Ymm, m: Mem) {
        if dst.0 < 16 {
            a.vmovups_load(dst, m);
        } else {
            a.vmovups_ymm_evex_load(dst, m);
        }
    }

    fn store(self, a: &mut X86Asm, m: Mem, src: Ymm) {
        if src.0 < 16 {
            a.vmovups_store(m, src);
        } else {
            a.vmovups_ymm_evex_store(m, src);
        }
    }

    fn broadcast(self, a: &mut X86Asm, dst: Ymm, m: Mem) {
        if dst.0 < 16 {
            a.vpbroadcastd_load(dst, m);
        } else {
            a.vbroadcastss_ymm_evex_load(dst, m);
        }
    }
}

/// `num[c][head] += Σ_j p[j][head]·v_j[c]` over the block's keys (`S_JB ..
/// S_JEND`) for the tile at rbx: groups of its chunk group size × passes of
/// `pv_heads` heads.
fn pv(a: &mut X86Asm, keys: Keys, values: Values, regs: PvRegisters) {
    let hs = regs.heads();
    // c0: chunk group start.
    a.zero(RAX);
    a.store64(mem(RSP, S_C0), RAX);
    let (group, groups_done) = (a.new_label(), a.new_label());
    a.bind(group);
    a.load64(RAX, mem(RSP, S_C0));
    a.cmp_mem(RAX, mem(RSP, S_D8));
    a.jcc(Cond::Ge, groups_done);
    a.zero(RAX);
    a.store64(mem(RSP, S_SUB0), RAX);
    let (pass, passes_done) = (a.new_label(), a.new_label());
    a.bind(pass);
    a.load64(RAX, mem(RSP, S_SUB0));
    a.cmp_mem(RAX, mem(RBX, R_GT));
    a.jcc(Cond::Ge, passes_done);
    // Dispatch on the heads left (1..=hs) and the chunks left in this
    // group (1..=its size), so no pass computes a head or chunk that is
    // not there.
    a.load64(RAX, mem(RSP, S_D8));
    a.load64(R11, mem(RSP, S_C0));
    a.sub(RAX, R11);
    common::min_mem(a, RAX, mem(RBX, R_GS));
    a.load64(RDX, mem(RBX, R_GT));
    a.load64(R11, mem(RSP, S_SUB0));
    a.sub(RDX, R11);
    let after = a.new_label();
    let by_heads = dispatch(a, RDX, hs);
    for (h, hl) in by_heads.iter().enumerate() {
        a.bind(*hl);
        // A pass of one head is a one-head tile's (its own `num` layout)
        // or the last head of a larger tile's.
        if h == 0 {
            let interleaved = a.new_label();
            a.load64(R11, mem(RBX, R_GT));
            a.cmp_imm(R11, 1);
            a.jcc(Cond::Ne, interleaved);
            pv_passes(a, keys, values, regs, NumLayout::OneHead, 1, after);
            a.bind(interleaved);
        }
        pv_passes(a, keys, values, regs, NumLayout::Interleaved, h + 1, after);
    }
    a.bind(after);
    a.load64(RAX, mem(RSP, S_SUB0));
    a.add_imm(RAX, hs as i32);
    a.store64(mem(RSP, S_SUB0), RAX);
    a.jmp(pass);
    a.bind(passes_done);
    a.load64(RAX, mem(RSP, S_C0));
    a.load64(RDX, mem(RBX, R_GS));
    a.add(RAX, RDX);
    a.store64(mem(RSP, S_C0), RAX);
    a.jmp(group);
    a.bind(groups_done);
}

/// `cases` new labels, and a jump to label `n − 1` for `n` (1 ..= cases)
/// in `reg`, the last taking any larger value; the caller binds them.
fn dispatch(a: &mut X86Asm, reg: Gp, cases: usize) -> Vec<Label> {
    let labels: Vec<Label> = (0..cases).map(|_| a.new_label()).collect();
    for (i, l) in labels.iter().enumerate().take(cases - 1) {
        a.cmp_imm(reg, i as i32 + 1);
        a.jcc(Cond::E, *l);
    }
    a.jmp(labels[cases - 1]);
    labels
}

/// The passes of `heads` heads by the chunks left in the group (rax,
/// 1 ..= the group size), each jumping to `after`.
fn pv_passes(
    a: &mut X86Asm,
    keys: Keys,
    values: Values,
    regs: PvRegisters,
    layout: NumLayout,
    heads: usize,
    after: Label,
) {
    let by_chunks = dispatch(a, RAX, regs.group_chunks(heads));
    for (i, l) in by_chunks.iter().enumerate() {
        a.bind(*l);
        pv_pass(a, keys, values, regs, layout, heads, i + 1);
        a.jmp(after);
    }
}

/// rdx = the pass's first accumulator in `num`, `num + 32·(9·c0 + sub0)`
/// (chunk c of head h 32·(9c + h) on), or in a one-head tile's
/// ([`NumLayout::OneHead`]) `num + 32·c0`. Clobbers rax and r11.
fn num_cursor(a: &mut X86Asm, layout: NumLayout) {
    a.load64(RAX, mem(RSP, S_C0));
    if layout == NumLayout::Interleaved {
        a.imul_imm(RAX, RAX, NUM_SLOTS as i32);
        a.load64(R11, mem(RSP, S_SUB0));
        a.add(RAX, R11);
    }
    a.shl_imm(RAX, 5);
    a.load64(RDX, mem(RBX, R_NUM));
    a.add(RDX, RAX);
}

/// Where a tile keeps its P·V sums `num`. A tile of several heads
/// interleaves them, 9 slots of 32 bytes a chunk (8 heads and a pad), so a
/// pass finds each head's chunk at a fixed offset. A tile of one head
/// (multi-head attention) keeps its chunks side by side: interleaved, each
/// 8-key block loaded and stored 16 lines per head at d = 128 where 8 hold
/// them, and a 32-head call's sums filled the L1 that the V rows stream
/// through (as with q: [`q_chunk_bytes`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum NumLayout {
    Interleaved,
    OneHead,
}

impl NumLayout {
    /// Byte offset of chunk `c` of head `h` (from the tile's `num`).
    fn at(self, c: usize, h: usize) -> i32 {
        match self {
            NumLayout::Interleaved => 32 * (NUM_SLOTS * c + h) as i32,
            NumLayout::OneHead => 32 * c as i32,
        }
    }
}

/// `reg` = the chunk stride of the tile at rbx's `num` (288 bytes, or 32
/// in a one-head tile).
fn num_chunk_stride(a: &mut X86Asm, reg: Gp) {
    let [one, several] = [NumLayout::OneHead, NumLayout::Interleaved].map(|l| l.at(1, 0));
    by_tile_heads(a, reg, one, several);
}

/// `reg` = `one` if the tile at rbx has one head, else `several` (the
/// layouts of one-head tiles differ: [`q_chunk_bytes`], [`NumLayout`]).
fn by_tile_heads(a: &mut X86Asm, reg: Gp, one: i32, several: i32) {
    let done = a.new_label();
    a.load64(reg, mem(RBX, R_GT));
    a.cmp_imm(reg, 1);
    a.mov_imm(reg, one);
    a.jcc(Cond::E, done);
    a.mov_imm(reg, several);
    a.bind(done);
}

/// A P·V pass's cursors at key jb: rsi = p of (jb − j0, head sub0), r12
/// (`R_PSTRIDE`) a key; rax = V row jb at chunk c0 (`value_bytes` a
/// chunk), rcx a row; r8 = keys left; r10 = `S_VAHEAD` bytes (the lines the
/// pass prefetches). Clobbers r9 and r11.
fn pv_cursors(a: &mut X86Asm, value_bytes: i32) {
    a.load64(R12, mem(RBX, R_PSTRIDE));
    a.load64(RAX, mem(RSP, S_JB));
    a.mov(RSI, RAX);
    a.load64(R11, mem(RSP, S_J0));
    a.sub(RSI, R11);
    a.imul(RSI, R12);
    a.load64(R11, mem(RBX, R_SAREA));
    a.add(RSI, R11);
    a.load64(R9, mem(RSP, S_SUB0));
    a.shl_imm(R9, 2);
    a.add(RSI, R9);
    a.load64(RCX, mem(RSP, S_VSTRIDE));
    a.imul(RAX, RCX);
    a.load64(R11, mem(RBX, R_VROW0));
    a.add(RAX, R11);
    a.load64(R9, mem(RSP, S_C0));
    a.imul_imm(R9, R9, value_bytes);
    a.add(RAX, R9);
    a.load64(R8, mem(RSP, S_JEND));
    a.load64(R11, mem(RSP, S_JB));
    a.sub(R8, R11);
    a.load64(R10, mem(RSP, S_VAHEAD));
}

/// The key loop of a P·V pass of `hs` heads and `nc` chunks: its cursors
/// ([`pv_cursors`]), then, bound, the loop's top and the prefetch of the
/// chunks' V lines `S_VAHEAD` bytes on. Returns the top and the bytes of
/// V a chunk (8 values) takes.
fn pv_loop_top(a: &mut X86Asm, keys: Keys, values: Values, hs: usize, nc: usize) -> (Label, i32) {
    let vb = if values == Values::F16 { 16 } else { 8 };
    pv_cursors(a, vb);
    let top = a.new_label();
    a.bind(top);
    a.mov(R9, RAX);
    a.add(R9, R10);
    for line in (0..nc * vb as usize).step_by(64) {
        Prefetch::for_loop(keys, hs).line(a, mem(R9, line as i32));
    }
    (top, vb)
}

/// The end of a P·V pass's key loop: p and the value row one key on, and
/// back to `top` while keys are left (r8).
fn pv_next_key(a: &mut X86Asm, top: Label) {
    a.add(RSI, R12);
    a.add(RAX, RCX);
    a.sub_imm(R8, 1);
    a.jcc(Cond::Ne, top);
}

/// One pass over the tile at rbx: `hs` heads from `S_SUB0`, `nc` chunks
/// from `S_C0`, keys `S_JB..S_JEND`, accumulators in ymm0..hs·nc.
fn pv_pass(
    a: &mut X86Asm,
    keys: Keys,
    values: Values,
    regs: PvRegisters,
    layout: NumLayout,
    hs: usize,
    nc: usize,
) {
    if regs.bf16 {
        return pv_pass_bf16(a, keys, regs, layout, hs, nc);
    }
    if regs.f16 && layout == NumLayout::Interleaved {
        return pv_pass_f16(a, keys, values, regs, hs, nc);
    }
    if regs.zmm_f32 && layout == NumLayout::Interleaved {
        return pv_pass_zmm(a, keys, values, regs, hs, nc);
    }
    // The heads' p broadcasts in registers beside the accumulators, one
    // row register; or, where they do not fit ([`PvRegisters::widen_once`]),
    // every chunk of the key widened first into ymm0..nc and each head's p
    // broadcast in turn into ymm`nc`.
    let p_in_registers = 1 + hs + hs * nc <= regs.count();
    let first_acc = if p_in_registers { 1 + hs } else { nc + 1 };
    assert!(first_acc + hs * nc <= regs.count(), "P·V registers");
    let acc = |h: usize, c: usize| Ymm((first_acc + h * nc + c) as u8);
    num_cursor(a, layout);
    for h in 0..hs {
        for c in 0..nc {
            regs.load(a, acc(h, c), mem(RDX, layout.at(c, h)));
        }
    }
    let (top, _) = pv_loop_top(a, keys, values, hs, nc);
    if p_in_registers {
        let (vx, p) = (Ymm(0), |h: usize| Ymm((1 + h) as u8));
        for h in 0..hs {
            regs.broadcast(a, p(h), mem(RSI, 4 * h as i32));
        }
        if values == Values::E4M3 && !regs.fp8_f32 {
            fp8_row_to_f16(a, nc, vx);
        }
        for c in 0..nc {
            value_chunk(a, values, regs, vx, c);
            for h in 0..hs {
                regs.fma(a, acc(h, c), vx, p(h));
            }
        }
    } else {
        let (v, p) = (|c: usize| Ymm(c as u8), Ymm(nc as u8));
        if values == Values::E4M3 && !regs.fp8_f32 {
            fp8_row_to_f16(a, nc, v(0));
        }
        for c in 0..nc {
            value_chunk(a, values, regs, v(c), c);
        }
        for h in 0..hs {
            regs.broadcast(a, p, mem(RSI, 4 * h as i32));
            for c in 0..nc {
                regs.fma(a, acc(h, c), v(c), p);
            }
        }
    }
    pv_next_key(a, top);
    num_cursor(a, layout);
    for h in 0..hs {
        for c in 0..nc {
            regs.store(a, mem(RDX, layout.at(c, h)), acc(h, c));
        }
    }
}

/// A key's `nc` chunks of fp8 e4m3 codes at rax → f16 bits of 2^-8 of the
/// values at `V_FP8_ROW` (exact, subnormals included): sign-extended,
/// shifted so the exponent and mantissa land in f16's, the sign copy at
/// bit 14 cleared; 16 codes a trip through `tmp`. The P·V loop then
/// converts them from memory, as it does f16 values: `vcvtph2ps` from a
/// register is the slow form on an AMD Zen 3 (8 of them and 8 FMAs took
/// 8.9 TSC ticks in a loop held in L1, 8 from memory with their FMAs 3.5),
/// and a one-head pass of 8 chunks took 7.7 ticks a key this way against
/// 12.1 converting each pair in registers. The passes in ymm0–15 widen to
/// f32 instead ([`PvRegisters::fp8_f32`]) unless the async range is too
/// wide for its scale of p.
fn fp8_row_to_f16(a: &mut X86Asm, nc: usize, tmp: Ymm) {
    assert!(16 * nc as i32 <= FP8_ROW_BYTES, "fp8 row slot");
    for c in (0..nc).step_by(2) {
        let (from, to) = (mem(RAX, 8 * c as i32), mem(RSP, V_FP8_ROW + 16 * c as i32));
        if c + 1 < nc {
            a.vpmovsxbw_load(tmp, from);
        } else {
            a.vpmovsxbw_load64(tmp, from);
        }
        a.vpsllw_imm(tmp, tmp, 7);
        a.vpand_mem(tmp, tmp, mem(RSP, V_E4M3_F16));
        if c + 1 < nc {
            a.vmovups_store(to, tmp);
        } else {
            a.vmovups_store128(to, tmp);
        }
    }
}

/// Chunk `c` of a key's values (f16 at rax, fp8 at rax widened here
/// ([`PvRegisters::fp8_f32`]), or fp8 already at `V_FP8_ROW` as f16 bits)
/// → f32 in `dst` (for fp8, 2^-120 or 2^-8 of the values).
fn value_chunk(a: &mut X86Asm, values: Values, regs: PvRegisters, dst: Ymm, c: usize) {
    let at = match values {
        Values::F16 => mem(RAX, 16 * c as i32),
        Values::E4M3 if regs.fp8_f32 => return fp8_chunk_to_f32(a, dst, c),
        Values::E4M3 => mem(RSP, V_FP8_ROW + 16 * c as i32),
    };
    a.vcvtph2ps_load(dst, at);
}

/// Chunk `c` of a key's fp8 e4m3 codes at rax → f32 bits of 2^-120 of the
/// values in `dst` (exact, subnormals included): sign-extended to i32, the
/// exponent and mantissa shifted into f32's fields (bit 27 up holds sign
/// copies), the sign and those fields kept by one mask.
fn fp8_chunk_to_f32(a: &mut X86Asm, dst: Ymm, c: usize) {
    a.vpmovsxbd_load(dst, mem(RAX, 8 * c as i32));
    a.vpslld_imm(dst, dst, 20);
    a.vpand_mem(dst, dst, mem(RSP, V_E4M3_F32));
}

/// Whether p × [`FP8_F32_P_SCALE`] stays finite with room: p is at most 1
/// against the running max, or e^hi against the async softmax's phi (the
/// library's hi is 6.5; a range past 2^40 keeps the f16 widening).
fn fp8_f32_fits(softmax: SoftmaxMode) -> bool {
    match softmax {
        SoftmaxMode::Online => true,
        SoftmaxMode::Async { hi, .. } => hi * std::f32::consts::LOG2_E <= 40.0,
    }
}

/// [`pv_pass`] for a tile of several heads by AVX512-FP16 FMAs on zmm: per
/// key and 4 chunks (32 lanes of d) one row load, f16 values scaled by
/// 2^-8 and fp8 values widened to f16 bits (2^-8 of the value), feeds one
/// `vfmadd231ph` per head, whose p ([`exponentials`]: f16, against the
/// running max) is broadcast from memory; the last 4 chunks of a group
/// that is not a multiple of 4 load under k1. Accumulators are f16, zeroed
/// at the block's start; at its end each chunk (128-bit lane) is widened to
/// f32 and added to `num` times its head's `R_PV_SCALE`. A quarter of the
/// FMAs of the f32 pass and no `vcvtph2ps` per key: the f32 pass of a
/// GQA-6 tile was bound by ports 0 and 1 on a Sapphire Rapids-class Xeon
/// (llvm-mca 19: 16.7 cycles per key and pass of 4 chunks), and the same
/// pass on ymm (16 lanes an FMA, two passes of a 128-wide GQA-6 tile)
/// took 8% longer than this one (ctx 1024 in cache). A tile has at most
/// [`MAX_TILE`] heads, one pass here, so its heads start at 0 (p of head h
/// at byte 2h of a key's slot).
fn pv_pass_f16(
    a: &mut X86Asm,
    keys: Keys,
    values: Values,
    regs: PvRegisters,
    hs: usize,
    nc: usize,
) {
    let (v, scale) = (Zmm(0), Ymm(1));
    let quads = nc.div_ceil(4);
    assert!(2 + hs * quads <= regs.count(), "f16 P·V registers");
    let acc = |h: usize, q: usize| Zmm((2 + h * quads + q) as u8);
    for h in 0..hs {
        for q in 0..quads {
            a.vpxord_zmm(acc(h, q), acc(h, q), acc(h, q));
        }
    }
    let tail = nc % 4;
    if tail != 0 {
        a.mov_imm(R9, ((1u64 << (8 * tail)) - 1) as i32);
        a.kmovd_from_gp(Kreg(1), R9);
    }
    let (top, vb) = pv_loop_top(a, keys, values, hs, nc);
    for q in 0..quads {
        let k = if 4 * q + 4 > nc { Kreg(1) } else { Kreg(0) };
        let at = 4 * vb * q as i32;
        match values {
            Values::F16 => {
                a.vmovdqu16_zmm_load_masked(v, k, mem(RAX, at));
                a.vmulph_zmm_bcst(v, v, mem(RSP, V_F16_DOWN));
            }
            Values::E4M3 => {
                a.vpmovsxbw_zmm_load_masked(v, k, mem(RAX, at));
                a.vpsllw_zmm_imm(v, v, 7);
                a.vpandd_zmm_bcst(v, v, mem(RSP, V_E4M3_F16));
            }
        }
        for h in 0..hs {
            a.vfmadd231ph_zmm_bcst(acc(h, q), v, mem(RSI, 2 * h as i32));
        }
    }
    pv_next_key(a, top);
    // num += scale · the block's sums, widened a chunk at a time.
    let w = Ymm(0);
    num_cursor(a, NumLayout::Interleaved);
    for h in 0..hs {
        a.vpbroadcastd_load(scale, mem(RBX, R_PV_SCALE + 4 * h as i32));
        for q in 0..quads {
            let r = acc(h, q);
            for lane in 0..4 {
                let c = 4 * q + lane;
                if c >= nc {
                    break;
                }
                if lane == 0 {
                    a.vcvtph2ps_ymm_evex(w, Ymm(r.0));
                } else {
                    a.vextracti32x4_zmm(w, r, lane as u8);
                    a.vcvtph2ps_reg(w, w);
                }
                let at = mem(RDX, NumLayout::Interleaved.at(c, h));
                a.vfmadd213ps_mem(w, scale, at);
                a.vmovups_store(at, w);
            }
        }
    }
}

/// [`pv_pass`] on zmm ([`PvRegisters::zmm_f32`]): `hs` heads' p broadcasts
/// in zmm1.., the value chunk in zmm0 (f16 values converted, fp8 values
/// widened to f32 bits of 2^-120 of the value as [`fp8_chunk_to_f32`]
/// does, 16 at a time), accumulator (h, z) holding `num`'s chunks 2z and
/// 2z + 1 of head h (loaded and stored as halves); an odd last chunk takes
/// the low half alone, its values loaded under a mask (no read past the
/// row). For fp8 values of a GQA-6 tile this body took 26–30 cycles a key
/// in a loop held in L1 on an AMD Zen 5, against 33 for the bf16 dots'
/// ([`pv_pass_bf16`]: its lookups and unpacks share the dots' ports).
fn pv_pass_zmm(
    a: &mut X86Asm,
    keys: Keys,
    values: Values,
    regs: PvRegisters,
    hs: usize,
    nc: usize,
) {
    assert!(
        values == Values::F16 || regs.fp8_f32,
        "zmm f32 P·V: f16 values, or fp8 widened to f32"
    );
    let nz = nc.div_ceil(2);
    let half_tail = nc % 2 == 1;
    let (vx, p) = (Zmm(0), |h: usize| Zmm((1 + h) as u8));
    let acc = |h: usize, z: usize| Zmm((1 + hs + h * nz + z) as u8);
    assert!(1 + hs + hs * nz <= regs.count(), "zmm P·V registers");
    let whole = |z: usize| !(half_tail && z + 1 == nz);
    let layout = NumLayout::Interleaved;
    if half_tail {
        a.mov_imm(R9, 0xFF);
        a.kmovd_from_gp(Kreg(1), R9);
    }
    num_cursor(a, layout);
    for h in 0..hs {
        for z in 0..nz {
            a.vmovups_ymm_evex_load(Ymm(acc(h, z).0), mem(RDX, layout.at(2 * z, h)));
            if whole(z) {
                a.vinsertf64x4_hi_mem(acc(h, z), acc(h, z), mem(RDX, layout.at(2 * z + 1, h)));
            }
        }
    }
    let (top, _) = pv_loop_top(a, keys, values, hs, nc);
    for h in 0..hs {
        a.vbroadcastss_zmm_load(p(h), mem(RSI, 4 * h as i32));
    }
    for z in 0..nz {
        let k = if whole(z) { Kreg(0) } else { Kreg(1) };
        if values == Values::F16 {
            a.vcvtph2ps_zmm_load_masked(vx, k, mem(RAX, 32 * z as i32));
        } else {
            a.vpmovsxbd_zmm_load_masked(vx, k, mem(RAX, 16 * z as i32));
            a.vpslld_zmm_imm(vx, vx, 20);
            a.vpandd_zmm_bcst(vx, vx, mem(RSP, V_E4M3_F32));
        }
        for h in 0..hs {
            a.vfmadd231ps_zmm(acc(h, z), vx, p(h));
        }
    }
    pv_next_key(a, top);
    num_cursor(a, layout);
    for h in 0..hs {
        for z in 0..nz {
            a.vmovups_ymm_evex_store(mem(RDX, layout.at(2 * z, h)), Ymm(acc(h, z).0));
            if whole(z) {
                a.vextractf64x4_hi_store(mem(RDX, layout.at(2 * z + 1, h)), acc(h, z));
            }
        }
    }
}

/// Vector registers a bf16 P·V pass holds besides its accumulators and
/// its heads' p: the codes, their low and high bytes (the unpacked halves
/// take the codes' and the high bytes' registers), the order index and
/// the two tables' first halves.
const BF16_FIXED: usize = 6;

/// Byte `i` of the `vpermb` index that feeds [`pv_pass_bf16`]'s lookups:
/// the source byte (key·32 + d of two keys' 32 codes) whose bf16, after
/// `vpunpcklbw`/`vpunpckhbw` of the low and high bytes (lane-wise), lands
/// in dword lane d (the low unpack d 0–15, the high 16–31) as key 0's
/// half (low word) or key 1's.
fn pair_order(i: usize) -> u8 {
    let (lane, j) = (i / 16, i % 16);
    let word = 8 * lane + j % 8;
    let (dword, key) = (word / 2, word % 2);
    let d = 8 * (dword / 8) + dword % 8 + if j >= 8 { 16 } else { 0 };
    (32 * key + d) as u8
}

/// The bf16 P·V's constants into the frame: the order index, the lookup
/// tables of bf16(2^-8 · e4m3) (p is stored × 2^8 for fp8 values, as the
/// f16 path's), the p pairing and the sign mask.
fn bf16_constants(a: &mut X86Asm) {
    let word = |b: [u8; 4]| i32::from_le_bytes(b);
    let order: Vec<u8> = (0..64).map(pair_order).collect();
    for (i, c) in order.chunks(4).enumerate() {
        a.store32_imm(
            mem(RSP, V_BF16_ORDER + 4 * i as i32),
            word([c[0], c[1], c[2], c[3]]),
        );
    }
    let bf16 = |code: u8| {
        let v = tessera_dsl::quant::fp8_e4m3_to_f32(code) * 2f32.powi(-8);
        // Exact: every e4m3 value × 2^-8 has at most 4 significant bits and
        // a normal bf16 exponent; NaN stays NaN.
        (v.to_bits() >> 16) as u16
    };
    let lo: Vec<u8> = (0..128).map(|c| bf16(c) as u8).collect();
    let hi: Vec<u8> = (0..128).map(|c| (bf16(c) >> 8) as u8).collect();
    for (at, table) in [(V_BF16_LO, &lo), (V_BF16_HI, &hi)] {
        for (i, c) in table.chunks(4).enumerate() {
            a.store32_imm(mem(RSP, at + 4 * i as i32), word([c[0], c[1], c[2], c[3]]));
        }
    }
    for h in 0..8 {
        a.store32_imm(mem(RSP, V_WORD_PAIRS + 4 * h), h | (h + 8) << 16);
    }
    for i in 0..16 {
        a.store32_imm(mem(RSP, V_DWORD_PAIRS + 4 * i), i / 2 + 16 * (i % 2));
    }
    a.store32_imm(mem(RSP, V_BYTE_SIGN), 0x8080_8080u32 as i32);
}

// The pairs start at the super-block's first key and every P·V block
// starts on a pair (even block sizes); an odd count's zero partner slot
// (key n < SUPER) and the one-head pass's 16-key reads stay inside `sarea`
// (8·SUPER floats).
const _: () = assert!(
    PV_BLOCK % 2 == 0 && SUPER % PV_BLOCK_MAX == 0 && SUPER % 2 == 0 && SUPER + 16 <= 8 * SUPER
);

/// After the exponentials: the super-block's p of the tile at rbx as bf16
/// pairs in place, each p rounded to the nearest bf16. Pair i (keys 2i and
/// 2i + 1, key 2i in each dword's low word) takes the first key's slot:
/// heads in lanes, 8 dwords; one head, one dword (the next is zero). An
/// odd count's last key pairs with p = 0.
///
/// One bf16 part, as FlashAttention rounds P to its 16-bit input type for
/// the P·V products: p's relative error is at most 2^-8 (8 significant
/// bits), so o moves by at most 2^-8 of the largest |v| it weighs — a 16th
/// of an e4m3 value's own rounding (2^-4). den sums the f32 p. Keeping the
/// rest as a second bf16 part (about 16 bits) doubled the dots: a
/// Qwen2-1.5B kv8 call at 4096 keys took 157 µs that way against 145 for
/// the f32 FMAs, one thread, AMD Zen 5.
fn bf16_pairs(a: &mut X86Asm) {
    let (one_head, done) = (a.new_label(), a.new_label());
    a.load64(RCX, mem(RSP, S_J1));
    a.load64(RAX, mem(RSP, S_J0));
    a.sub(RCX, RAX);
    a.load64(RSI, mem(RBX, R_SAREA));
    let even = a.new_label();
    a.load64(RAX, mem(RBX, R_GT));
    a.cmp_imm(RAX, 1);
    a.jcc(Cond::E, one_head);
    // Heads in lanes, 32 bytes a key: an odd count's partner is zeros.
    a.test_imm(RCX, 1);
    a.jcc(Cond::E, even);
    a.mov(RAX, RCX);
    a.shl_imm(RAX, 5);
    a.add(RAX, RSI);
    a.vxorps(Ymm(0), Ymm(0), Ymm(0));
    a.vmovups_store(mem(RAX, 0), Ymm(0));
    a.bind(even);
    a.add_imm(RCX, 1);
    a.shr_imm(RCX, 1);
    a.vmovdqu_load(Ymm(15), mem(RSP, V_WORD_PAIRS));
    let pair = a.new_label();
    a.bind(pair);
    let (p0, p1, pairs) = (Ymm(0), Ymm(1), Ymm(2));
    a.vmovups_load(p0, mem(RSI, 0));
    a.vmovups_load(p1, mem(RSI, 32));
    a.vcvtne2ps2bf16_ymm(pairs, p1, p0);
    a.vpermw_ymm(pairs, Ymm(15), pairs);
    a.vmovups_store(mem(RSI, 0), pairs);
    a.add_imm(RSI, 64);
    a.sub_imm(RCX, 1);
    a.jcc(Cond::Ne, pair);
    a.jmp(done);
    // One head, keys side by side, 16 a step (the area holds SUPER keys
    // and 16 more): the bf16 array is the pairs, each followed by a zero
    // dword. An odd count's partner is 0 already: the exponentials zero
    // the lanes of their last vector past the count.
    a.bind(one_head);
    a.add_imm(RCX, 15);
    a.shr_imm(RCX, 4);
    a.vmovdqu32_zmm_load(Zmm(15), mem(RSP, V_DWORD_PAIRS));
    let sixteen = a.new_label();
    a.bind(sixteen);
    let (p, pairs) = (Zmm(0), Zmm(1));
    a.vmovups_zmm_load(p, mem(RSI, 0));
    a.vcvtneps2bf16_zmm(Ymm(pairs.0), p);
    a.vpxord_zmm(p, p, p);
    a.vpermt2d_zmm(pairs, Zmm(15), p);
    a.vmovups_zmm_store(mem(RSI, 0), pairs);
    a.add_imm(RSI, 64);
    a.sub_imm(RCX, 1);
    a.jcc(Cond::Ne, sixteen);
    a.bind(done);
}

/// [`pv_pass`] for fp8 values by bf16 dots (AVX512_BF16): keys two at a
/// time, 32 lanes of d a step. Two keys' codes load into one zmm (masked,
/// so a short last step reads nothing past its chunks), one `vpermb` puts
/// them in pair order, two `vpermi2b` look up their bf16's low and high
/// bytes (the sign ORed back; the tables' second halves in the file's last
/// two registers where the pass leaves them free, as a GQA-6 tile's does,
/// else memory operands), and the byte unpacks give per d the pair
/// (key 0, key 1) that `vdpbf16ps` multiplies by each head's p pair, which
/// [`bf16_pairs`] left and the pass broadcasts into a register once a pair
/// of keys. Accumulators are zmm of two chunks. An odd last key pairs with
/// itself, against p = 0.
///
/// The lookups replace the f16 route's widening (`vpmovsxbw`, shift, mask,
/// `vcvtph2ps` per 8 values); one dot per pair does two f32 FMAs' work. p
/// in registers, not broadcast from memory by every dot: the loads, not
/// the dots, bounded the body, which took 21.4 cycles for two keys × 64 d
/// of a GQA-6 tile that way against 14.5 with six broadcasts a pair, in a
/// loop held in L1 on an AMD Zen 5 (its 24 f32 FMAs: 24.6 for one key).
fn pv_pass_bf16(
    a: &mut X86Asm,
    keys: Keys,
    regs: PvRegisters,
    layout: NumLayout,
    hs: usize,
    nc: usize,
) {
    // The codes, then the first unpacked half; their low bytes; their
    // high bytes, then the second half.
    let (codes, lo, hi) = (Zmm(0), Zmm(1), Zmm(2));
    let (w0, w1) = (codes, hi);
    let (order, tlo, thi) = (Zmm(3), Zmm(4), Zmm(5));
    let pairs = nc.div_ceil(2);
    assert!(
        BF16_FIXED + hs + hs * pairs <= regs.count(),
        "bf16 P·V registers"
    );
    let p = |h: usize| Zmm((BF16_FIXED + h) as u8);
    let acc = |h: usize, cp: usize| Zmm((BF16_FIXED + hs + h * pairs + cp) as u8);
    let low = |z: Zmm| Ymm(z.0);
    let num_at = |c: usize, h: usize| layout.at(c, h);
    num_cursor(a, layout);
    for h in 0..hs {
        for cp in 0..pairs {
            regs.load(a, low(acc(h, cp)), mem(RDX, num_at(2 * cp, h)));
            if 2 * cp + 1 < nc {
                a.vinsertf64x4_hi_mem(acc(h, cp), acc(h, cp), mem(RDX, num_at(2 * cp + 1, h)));
            }
        }
    }
    a.vmovdqu8_zmm_load(order, mem(RSP, V_BF16_ORDER));
    a.vmovdqu8_zmm_load(tlo, mem(RSP, V_BF16_LO));
    a.vmovdqu8_zmm_load(thi, mem(RSP, V_BF16_HI));
    // The tables' second halves in the last two registers where the pass
    // leaves them free (a GQA-6 tile does), else memory operands.
    let free = regs.count() - (BF16_FIXED + hs + hs * pairs);
    let second_halves = (free >= 2).then(|| {
        let (lo2, hi2) = (Zmm(regs.count() as u8 - 2), Zmm(regs.count() as u8 - 1));
        a.vmovdqu8_zmm_load(lo2, mem(RSP, V_BF16_LO + 64));
        a.vmovdqu8_zmm_load(hi2, mem(RSP, V_BF16_HI + 64));
        (lo2, hi2)
    });
    let lookup = |a: &mut X86Asm, idx: Zmm, first: Zmm, second: usize| match second_halves {
        Some(halves) => a.vpermi2b_zmm(idx, first, [halves.0, halves.1][second]),
        None => a.vpermi2b_zmm_mem(idx, first, mem(RSP, [V_BF16_LO, V_BF16_HI][second] + 64)),
    };
    // Byte masks: k1/k2 a whole step's 32 codes of key 0 / key 1 (bytes
    // 0–31 / 32–63), k3/k4 the last step's where it is short.
    let steps = nc.div_ceil(4);
    let last_bytes = 8 * (nc - 4 * (steps - 1));
    a.mov_imm(RAX, -1);
    a.shr_imm(RAX, 32);
    a.kmovq_from_gp(Kreg(1), RAX);
    a.shl_imm(RAX, 32);
    a.kmovq_from_gp(Kreg(2), RAX);
    if last_bytes < 32 {
        a.mov_imm(RAX, (1 << last_bytes) - 1);
        a.kmovq_from_gp(Kreg(3), RAX);
        a.shl_imm(RAX, 32);
        a.kmovq_from_gp(Kreg(4), RAX);
    }
    // rsi = the p pair of keys (jb, jb + 1) for head sub0 (key jb's slot;
    // keys r12 apart).
    pv_cursors(a, 8);
    let (top, paired) = (a.new_label(), a.new_label());
    a.bind(top);
    // r11 = key 1's row: the next, or for an odd last key its own.
    a.lea(R11, mem(RAX, 0));
    a.add(R11, RCX);
    a.cmp_imm(R8, 1);
    a.jcc(Cond::Ne, paired);
    a.mov(R11, RAX);
    a.bind(paired);
    let prefetch = Prefetch::for_loop(keys, hs);
    for row in [RAX, R11] {
        a.lea(RDX, mem(row, 0));
        a.add(RDX, R10);
        for line in (0..nc * 8).step_by(64) {
            prefetch.line(a, mem(RDX, line as i32));
        }
    }
    for h in 0..hs {
        a.vpbroadcastd_zmm_load(p(h), mem(RSI, 4 * h as i32));
    }
    for step in 0..steps {
        let (k0, k1) = if step + 1 == steps && last_bytes < 32 {
            (Kreg(3), Kreg(4))
        } else {
            (Kreg(1), Kreg(2))
        };
        let at = 32 * step as i32;
        a.vmovdqu8_zmm_load_masked(codes, k0, true, mem(RAX, at));
        a.vmovdqu8_zmm_load_masked(codes, k1, false, mem(R11, at - 32));
        a.vpermb_zmm(codes, order, codes);
        a.vmovdqa64_zmm(lo, codes);
        lookup(a, lo, tlo, 0);
        a.vmovdqa64_zmm(hi, codes);
        lookup(a, hi, thi, 1);
        // hi |= codes & 0x80 (the sign).
        a.vpternlogd_zmm_bcst(hi, codes, mem(RSP, V_BYTE_SIGN), 0xF8);
        let second = 4 * step + 2 < nc;
        a.vpunpcklbw_zmm(w0, lo, hi);
        if second {
            a.vpunpckhbw_zmm(w1, lo, hi);
        }
        for h in 0..hs {
            a.vdpbf16ps_zmm(acc(h, 2 * step), w0, p(h));
            if second {
                a.vdpbf16ps_zmm(acc(h, 2 * step + 1), w1, p(h));
            }
        }
    }
    a.add(RSI, R12);
    a.add(RSI, R12);
    a.add(RAX, RCX);
    a.add(RAX, RCX);
    a.sub_imm(R8, 2);
    a.jcc(Cond::G, top);
    num_cursor(a, layout);
    for h in 0..hs {
        for cp in 0..pairs {
            regs.store(a, mem(RDX, num_at(2 * cp, h)), low(acc(h, cp)));
            if 2 * cp + 1 < nc {
                a.vextractf64x4_hi_store(mem(RDX, num_at(2 * cp + 1, h)), acc(h, cp));
            }
        }
    }
}

/// `o = num / den` to f16 for each head of the tile at rbx; the first
/// tile's head 0 leaves its softmax state in the split region. With
/// `fp8_f32` `num` is first scaled back to its value ([`V_NUM_UNSCALE`]).
fn finish_tile(a: &mut X86Asm, fp8_f32: bool) {
    if fp8_f32 {
        a.vmovups_load(Ymm(0), mem(RSP, V_NUM_UNSCALE));
        a.vmovups_store(mem(RSP, V_ALPHA), Ymm(0));
        scale_num(a);
    }
    num_chunk_stride(a, R11);
    a.zero(R12);
    let (head, heads_done) = (a.new_label(), a.new_label());
    a.bind(head);
    a.cmp_mem(R12, mem(RBX, R_GT));
    a.jcc(Cond::Ge, heads_done);
    // den of head i broadcast.
    a.lea(RAX, mem(RBX, R_DEN));
    a.mov(RCX, R12);
    a.shl_imm(RCX, 2);
    a.add(RAX, RCX);
    a.vpbroadcastd_load(Ymm(1), mem(RAX, 0));
    // o row (h + i), num slot of head i (chunk stride r11).
    a.load64(RSI, mem(RBX, R_HEAD));
    a.add(RSI, R12);
    a.load64(RCX, mem(RSP, S_D));
    a.imul(RSI, RCX);
    a.shl_imm(RSI, 1);
    a.load64(RCX, mem(RDI, AT_O));
    a.add(RSI, RCX);
    a.mov(RDX, R12);
    a.shl_imm(RDX, 5);
    a.load64(RCX, mem(RBX, R_NUM));
    a.add(RDX, RCX);
    store_normalized_row(a, mem(RSP, S_D8), Stride::Reg(R11));
    a.add_imm(R12, 1);
    a.jmp(head);
    a.bind(heads_done);
    every_head_state(a);
    // State of the call's first head: den at s, num at s + d, max at s + 2d.
    let not_first = a.new_label();
    a.cmp_mem(RBX, mem(RSP, S_TILES0));
    a.jcc(Cond::Ne, not_first);
    a.load64(RSI, mem(RDI, AT_SCRATCH));
    a.load64(RAX, mem(RSP, S_S));
    a.shl_imm(RAX, 2);
    a.add(RSI, RAX);
    a.vmovss_load(Ymm(0), mem(RBX, R_DEN));
    a.vmovss_store(mem(RSI, 0), Ymm(0));
    a.load64(RAX, mem(RSP, S_D));
    a.shl_imm(RAX, 2);
    a.add(RSI, RAX);
    a.load64(RDX, mem(RBX, R_NUM));
    copy_num_row(a);
    a.vmovss_load(Ymm(0), mem(RBX, R_MVEC));
    a.vmovss_store(mem(RSI, 0), Ymm(0));
    a.bind(not_first);
}

/// Where `AttentionArgs::states` is not null: each head of the tile at rbx
/// leaves `num[d]`, `den`, its reference and its recomputed flag (1.0 where
/// the range failed) at `states + 4·state_stride·(h − head0)`.
fn every_head_state(a: &mut X86Asm) {
    let done = a.new_label();
    a.load64(RAX, mem(RDI, AT_STATES));
    a.cmp_imm(RAX, 0);
    a.jcc(Cond::E, done);
    // Flags: 1.0 in the lanes whose range failed (ok = 0).
    a.vmovups_load(Ymm(0), mem(RBX, R_OK));
    a.vmovups_load(Ymm(1), mem(RSP, V_ONE));
    a.vandnps(Ymm(0), Ymm(0), Ymm(1));
    a.vmovups_store(mem(RSP, V_ALPHA), Ymm(0));
    num_chunk_stride(a, R11);
    a.zero(R12);
    let head = a.new_label();
    a.bind(head);
    a.cmp_mem(R12, mem(RBX, R_GT));
    a.jcc(Cond::Ge, done);
    // rsi = states + 4·stride·(h + i − head0).
    a.load64(RSI, mem(RBX, R_HEAD));
    a.add(RSI, R12);
    a.load64(RAX, mem(RDI, AT_HEAD0));
    a.sub(RSI, RAX);
    a.load64(RAX, mem(RDI, AT_STATE_STRIDE));
    a.imul(RSI, RAX);
    a.shl_imm(RSI, 2);
    a.load64(RAX, mem(RDI, AT_STATES));
    a.add(RSI, RAX);
    // num: chunk c of head i at num + r11·c + 32·i.
    a.mov(RDX, R12);
    a.shl_imm(RDX, 5);
    a.load64(RCX, mem(RBX, R_NUM));
    a.add(RDX, RCX);
    copy_num_row(a);
    // den, reference, flag: lane i of each.
    a.mov(RCX, R12);
    a.shl_imm(RCX, 2);
    for (k, (base, at)) in [(RBX, R_DEN), (RBX, R_MVEC), (RSP, V_ALPHA)]
        .into_iter()
        .enumerate()
    {
        a.lea(RAX, mem(base, at));
        a.add(RAX, RCX);
        a.vmovss_load(Ymm(0), mem(RAX, 0));
        a.vmovss_store(mem(RSI, 4 * k as i32), Ymm(0));
    }
    a.add_imm(R12, 1);
    a.jmp(head);
    a.bind(done);
}

/// One head's `num` (its slot at rdx, chunks r11 bytes apart) to `d`
/// contiguous f32 at rsi; leaves rsi past them. Clobbers rcx, rdx, ymm0.
fn copy_num_row(a: &mut X86Asm) {
    a.load64(RCX, mem(RSP, S_D8));
    let chunk = a.new_label();
    a.bind(chunk);
    a.vmovups_load(Ymm(0), mem(RDX, 0));
    a.vmovups_store(mem(RSI, 0), Ymm(0));
    a.add_imm(RSI, 32);
    a.add(RDX, R11);
    a.sub_imm(RCX, 1);
    a.jcc(Cond::Ne, chunk);
}
