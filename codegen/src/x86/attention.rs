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
//!
//! This file holds the frame, the setup and the loops over tiles and
//! super-blocks; each phase's code is a submodule: `scores` (q's forms and
//! the score loops), `lane_scores` and `amx_scores` (two more score loops),
//! `softmax` (the reference and the exponentials) and `pv` (the P·V
//! passes).

use tessera_dsl::ir::{AttentionKind, Format, Group, Kernel, ParamType, SoftmaxMode};

use super::asm::*;
use super::common;
use super::evex::{Kreg, Zmm};
use crate::artifact::{EmitError, MachineCode, PrefillBlocks};
use crate::host_attention::*;

mod amx_scores;
mod lane_scores;
mod pv;
mod scores;
mod softmax;

use pv::*;
use scores::*;
use softmax::*;
pub(super) use softmax::{EXP_REGS, exp_ps};

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
/// The least block max of int8 q ([`DecodeIsa::lane_int8_q`]): a block
/// of zeros gets zero codes.
pub const LANE_Q8_FLOOR: f32 = lane_scores::Q8_FLOOR;
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
    /// With `lane_scores`: q rounded to int8 in blocks of 32 d, each with
    /// its f32 scale `max|q|/127`, as ggml rounds q to Q8_0 against a
    /// q8_0 K cache, so the lanes loop takes one `vpdpbusd` and one q
    /// broadcast per key dword and head where the i16 form takes two
    /// (`lane_scores::q8_parts`). A score moves by at most half a step of
    /// each block's q: [`Self::q_int8_rounding`].
    pub lane_int8_q: bool,
}

impl DecodeIsa {
    /// Whether the keys-in-lanes loop takes q as int8 blocks.
    fn lane_q8(&self) -> bool {
        self.lane_int8_q && self.lane_scores && self.zmm_scores && !self.amx_scores
    }

    /// The most rounding q moves each of its elements by, as a fraction
    /// of the largest |q| in its 32-d block: 1/254 where the lanes loop
    /// takes q as int8 ([`Self::lane_int8_q`]), else 0 (the i16 form's
    /// 2^-16 aside). A score `q·k` then moves by at most that times
    /// `Σ_blocks max|q_block|·Σ|k_block|`.
    pub fn q_int8_rounding(&self) -> f32 {
        if self.lane_q8() { 1.0 / 254.0 } else { 0.0 }
    }

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
    /// The lanes loop takes q as int8 blocks ([`DecodeIsa::lane_int8_q`]).
    q8: bool,
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
        q8: isa.lane_q8() && keys == Keys::I8Asym,
    };
    if form.lanes {
        a.comment(if form.q8 {
            "int8 keys of 4-7-head tiles 16 a trip, a key per dword lane: rows transposed in registers, vpdpbusd against q rounded to int8 in 32-d blocks, max|q|/127 each (AVX512-VNNI)"
        } else {
            "int8 keys of 4-7-head tiles 16 a trip, a key per dword lane: rows transposed in registers, vpdpbusd against q's two int8 parts (AVX512-VNNI)"
        });
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
