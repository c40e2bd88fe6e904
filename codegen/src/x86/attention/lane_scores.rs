//! Int8 key scores of a several-head tile with its keys in lanes
//! ([`DecodeIsa::lane_scores`]): 16 keys a trip, one key per dword lane of
//! a zmm, so a head's 16 scores come out of its accumulators as one
//! vector, with no sum across lanes and one finish for all 16.
//!
//! The pair loop ([`key_pairs_zmm`]) lays d along the lanes: per key pair
//! it reduces 12 accumulators of 16 partial sums (a 41-instruction tree)
//! and finishes each key alone (16 instructions). Measured on an AMD Zen 5
//! (Qwen2-1.5B kv8, 4096 keys, one thread, hot), its score pass took about
//! 6.3 ns a key and KV head, of which the `vpdpwssd` alone 3.5: the tree
//! 1.3, the finishes 1.6. Here each 64-byte chunk of the 16 rows is
//! loaded as it lies, made unsigned (xor 0x80), and transposed in
//! registers (4 shuffle stages, 8 shuffles a key at d = 128), so that
//! register r holds dword r of every key; `vpdpbusd` then multiplies it by
//! q's dword r broadcast from memory. `vpdpbusd` takes unsigned bytes
//! against signed ones, so q's i16 code goes in as the AMX loop's two
//! int8 parts (`c = 256·hi + lo`, [`amx_scores::q_int8_parts`]'s layout),
//! and the key bias comes back out once per head: `Σ(k + 128)·c =
//! Σk·c + 128·Σc`, `128·Σc` computed with q ([`q_code_bias`]). The
//! integer dots equal the pair loop's exactly (wrapping i32 arithmetic,
//! whose result is the pair loop's wherever that one fits), and the
//! finish does the pair loop's f32 operations in its order, so the scores
//! are equal bit for bit.
//!
//! Registers: the rows and transposed dwords zmm0–15, two accumulators a
//! head (hi, lo) from zmm16, the 0x80 bytes in zmm30, zmm31 the
//! transpose's spare: 2·7 accumulators fit, so tiles of 4 to 7 heads
//! ([`HEADS`]: with fewer the calls read at the memory bound in either
//! form). Fewer than 16 keys left go by the pair loop.

use super::*;

/// The area of this loop's constants and per-trip key parameters, past
/// every P·V form's frame slots (as the AMX loop's, which it never meets).
const V_LANES: i32 = FRAME_BF16;
/// 0x80 in every byte (a dword, broadcast).
const V_X80: i32 = V_LANES;
/// `vpermt2d` indices: heads 0–3 and 4–7 of keys in 128-bit lanes 0, 1
/// (`V_JOIN_LO`) and 2, 3 (`V_JOIN_HI`) side by side.
const V_JOIN_LO: i32 = V_LANES + 64;
const V_JOIN_HI: i32 = V_LANES + 128;
/// Every bit set: the in-range lanes' mask as a vector.
const V_ONES: i32 = V_LANES + 192;
/// The trip's 16 keys' scales and offsets, gathered from their strided
/// rows.
const V_KEY_SCALE: i32 = V_LANES + 256;
const V_KEY_OFFSET: i32 = V_LANES + 320;
/// `vpermt2d` indices of the even dwords 0–30 of a row loaded as dwords
/// 0–15 and 15–30 (0, 2, …, 14, then 17, 19, …, 31): the trip's keys'
/// parameters of one of two KV heads.
const V_EVEN_DWORDS: i32 = V_LANES + 384;
/// 8-byte slot: how far ahead of a trip its keys' scales and offsets are
/// prefetched (as many keys as the K rows, `S_KAHEAD`).
const V_PARAM_AHEAD: i32 = V_LANES + 448;
/// 4-byte slot: 2^-100, the least block max of int8 q ([`q8_parts`]), so a
/// block of zeros gets a finite `127/max` and zero codes.
const V_Q8_FLOOR: i32 = V_LANES + 456;
/// The decode frame with this loop's area.
pub(super) const FRAME_LANES: i32 = V_LANES + 512;
const _: () = assert!(V_LANES % 64 == 0 && FRAME_LANES >= FRAME_F16);

/// The least block max [`q8_parts`] divides by: any nonzero f16 is far
/// above it, and `127/2^-100` is a finite f32.
pub const Q8_FLOOR: f32 = 1.0 / (1u128 << 100) as f32;

/// Keys a trip takes (the dword lanes of a zmm), and the score block of a
/// call whose group has several query heads (`S_SCORE_BLOCK`).
const TRIP: i32 = 512 / 32;
/// zmm registers the loop holds besides its accumulators: the 16 rows,
/// the 0x80 bytes and the transpose's spare.
const FIXED_ZMM: usize = 16 + 2;
/// The tiles this loop serves: as many heads as two accumulators each
/// leave room for in the 32 zmm, and at least 4. At 2 and 3 heads (8/4
/// and 12/4 caches, ctx 4096, one thread, Zen 5) a call read 78–93% of
/// the probe in either form, so the pair loop keeps them.
pub(super) const HEADS: std::ops::RangeInclusive<usize> = 4..=(32 - FIXED_ZMM) / 2;
/// The hi accumulator of head h (its lo one follows).
fn acc(h: usize, part: usize) -> Zmm {
    Zmm((16 + 2 * h + part) as u8)
}
const X80: Zmm = Zmm(30);
const SPARE: Zmm = Zmm(31);

/// What a chunk's transpose leaves where: `DWORD_OF[r]` is the dword of
/// d (within the 64-byte chunk) that zmm r holds for all 16 keys, key i in
/// lane i.
const DWORD_OF: [usize; 16] = transposed_dwords();

/// After the first two stages on 8 registers of 16 keys' scores (zmm h =
/// head h, key i in lane i): zmm s and 4 + s (s < 4) hold, in 128-bit
/// lane l, heads 0–3 and 4–7 of key `4l + KEY_OF[s]`.
const KEY_OF: [usize; 4] = in_lane_keys();

/// `regs[r][lane]` = (the register, the lane) it came from, after the
/// first `stages` stages of the in-place transpose of `n` registers:
/// unpack dwords of register pairs (i, i + 1), qwords of (i, i + 2), then
/// 128-bit lanes of (i, i + 4) and (i, i + 8).
const fn replay(stages: usize, n: usize) -> [[(usize, usize); 16]; 16] {
    let mut regs = [[(0usize, 0usize); 16]; 16];
    let mut r = 0;
    while r < 16 {
        let mut l = 0;
        while l < 16 {
            regs[r][l] = (r, l);
            l += 1;
        }
        r += 1;
    }
    let mut stage = 0;
    while stage < stages {
        let step = [1, 2, 4, 8][stage];
        let mut x = 0;
        while x < n {
            if x & step == 0 {
                let y = x + step;
                let (a, b) = (regs[x], regs[y]);
                let (mut lo, mut hi) = ([(0, 0); 16], [(0, 0); 16]);
                let mut lane = 0;
                while lane < 4 {
                    let o = 4 * lane;
                    let mut i = 0;
                    while i < 4 {
                        (lo[o + i], hi[o + i]) = match stage {
                            // vpunpck{l,h}dq: a0 b0 a1 b1 / a2 b2 a3 b3.
                            0 => {
                                let s = [0, 0, 1, 1][i];
                                if i % 2 == 0 {
                                    (a[o + s], a[o + s + 2])
                                } else {
                                    (b[o + s], b[o + s + 2])
                                }
                            }
                            // vpunpck{l,h}qdq: a0 a1 b0 b1 / a2 a3 b2 b3.
                            1 => {
                                if i < 2 {
                                    (a[o + i], a[o + i + 2])
                                } else {
                                    (b[o + i - 2], b[o + i])
                                }
                            }
                            // vshufi32x4 0x88 / 0xDD: lanes a0 a2 b0 b2 /
                            // a1 a3 b1 b3.
                            _ => {
                                let from = if lane < 2 { a } else { b };
                                let l = 2 * (lane % 2);
                                (from[4 * l + i], from[4 * (l + 1) + i])
                            }
                        };
                        i += 1;
                    }
                    lane += 1;
                }
                regs[x] = lo;
                regs[y] = hi;
            }
            x += 1;
        }
        stage += 1;
    }
    regs
}

const fn transposed_dwords() -> [usize; 16] {
    let regs = replay(4, 16);
    let mut dword = [0usize; 16];
    let mut r = 0;
    while r < 16 {
        let mut l = 0;
        while l < 16 {
            // Lane l holds key (register) l, every lane the same dword.
            assert!(regs[r][l].0 == l && regs[r][l].1 == regs[r][0].1);
            l += 1;
        }
        dword[r] = regs[r][0].1;
        r += 1;
    }
    dword
}

const fn in_lane_keys() -> [usize; 4] {
    let regs = replay(2, 8);
    let mut key = [0usize; 4];
    let mut s = 0;
    while s < 4 {
        key[s] = regs[s][0].1;
        let mut m = 0;
        while m < 2 {
            let mut lane = 0;
            while lane < 16 {
                let (head, k) = regs[4 * m + s][lane];
                assert!(head == 4 * m + lane % 4 && k == 4 * (lane / 4) + key[s]);
                lane += 1;
            }
            m += 1;
        }
        s += 1;
    }
    key
}

/// The first `stages` stages of the transpose [`replay`] describes, on
/// the registers `regs` names (logical register i in `regs[i]`) with
/// `spare`: each pair's low result goes to the spare, which then names
/// the pair's first register, and that register becomes the spare, so no
/// result is moved.
fn transpose(a: &mut X86Asm, regs: &mut [Zmm], spare: &mut Zmm, stages: usize) {
    for (stage, step) in [1usize, 2, 4, 8].into_iter().enumerate().take(stages) {
        for x in (0..regs.len()).filter(|x| x & step == 0) {
            let (zx, zy, lo) = (regs[x], regs[x + step], *spare);
            match stage {
                0 => {
                    a.vpunpckldq_zmm(lo, zx, zy);
                    a.vpunpckhdq_zmm(zy, zx, zy);
                }
                1 => {
                    a.vpunpcklqdq_zmm(lo, zx, zy);
                    a.vpunpckhqdq_zmm(zy, zx, zy);
                }
                _ => {
                    a.vshufi32x4_zmm(lo, zx, zy, 0x88);
                    a.vshufi32x4_zmm(zy, zx, zy, 0xDD);
                }
            }
            regs[x] = lo;
            *spare = zx;
        }
    }
}

/// The call's constants and score block, and the q parts' offset.
/// Clobbers rax, rcx.
pub(super) fn config(a: &mut X86Asm) {
    a.comment("keys in lanes: constants, score block, q parts' offset");
    a.store32_imm(mem(RSP, V_X80), 0x8080_8080u32 as i32);
    a.store32_imm(mem(RSP, V_Q8_FLOOR), Q8_FLOOR.to_bits() as i32);
    for i in 0..16 {
        // Dword i of [A.l0 B.l0 A.l1 B.l1] and [A.l2 B.l2 A.l3 B.l3]
        // (B's dwords are 16 on in vpermt2d's table).
        let (lane, at) = (i / 4, i % 4);
        let from = |l: i32| 4 * l + at + if lane % 2 == 1 { 16 } else { 0 };
        a.store32_imm(mem(RSP, V_JOIN_LO + 4 * i), from(lane / 2));
        a.store32_imm(mem(RSP, V_JOIN_HI + 4 * i), from(2 + lane / 2));
        a.store32_imm(mem(RSP, V_ONES + 4 * i), -1);
        a.store32_imm(mem(RSP, V_EVEN_DWORDS + 4 * i), even_dword_index(i));
    }
    // The parameters' prefetch distance: S_KAHEAD / S_KSTRIDE keys of
    // 4·kvh bytes.
    a.load64(RAX, mem(RSP, S_KAHEAD));
    a.zero(RDX);
    a.load64(RCX, mem(RSP, S_KSTRIDE));
    a.div(RCX);
    a.load64(RCX, mem(RSP, S_KVH));
    a.shl_imm(RCX, 2);
    a.imul(RAX, RCX);
    a.store64(mem(RSP, V_PARAM_AHEAD), RAX);
    amx_scores::int8_parts_call(a, TRIP);
}

/// Head r12's key bias `128·Σc` over its zmm codes (`qarea + 512·z +
/// 64·r12`, zero past d) into the record's `R_CODE_BIAS` lane. Clobbers
/// rax, rcx, rsi, ymm2–ymm4 (zmm2–zmm4).
pub(super) fn q_code_bias(a: &mut X86Asm) {
    let (sum, w128, codes) = (Zmm(2), Zmm(3), Zmm(4));
    a.load64(RSI, mem(RBX, R_QAREA));
    a.mov(RAX, R12);
    a.shl_imm(RAX, 6);
    a.add(RSI, RAX);
    a.load64(RCX, mem(RSP, S_D));
    a.add_imm(RCX, 31);
    a.shr_imm(RCX, 5);
    a.vpxord_zmm(sum, sum, sum);
    a.vpbroadcastd_zmm_load(w128, mem(RSP, S_W128));
    let chunk = a.new_label();
    a.bind(chunk);
    a.vmovdqu32_zmm_load(codes, mem(RSI, 0));
    a.vpdpwssd_zmm(sum, codes, w128);
    a.add_imm(RSI, 512);
    a.sub_imm(RCX, 1);
    a.jcc(Cond::Ne, chunk);
    a.vextracti64x4_hi(Ymm(4), sum);
    a.vpaddd(Ymm(2), Ymm(2), Ymm(4));
    horizontal(a, Ymm(2), Ymm(4), X86Asm::vpaddd);
    a.lea(RAX, mem(RBX, R_CODE_BIAS));
    a.mov(RCX, R12);
    a.shl_imm(RCX, 2);
    a.add(RAX, RCX);
    a.vmovss_store(mem(RAX, 0), Ymm(2));
}

/// Head r12's q (f16 row at r8) rounded to int8 in blocks of 32 d for the
/// int8-q trips ([`DecodeIsa::lane_int8_q`]): per block the scale `s =
/// max|q|/127` (the max at least [`Q8_FLOOR`]) and codes `round(q/s)`,
/// laid out where the i16 form's parts go (`qarea + S_QPARTS`, 1024 bytes
/// a 64-d chunk): d's dword r of chunk c at `1024·c + 64·r + 4·r12` (the
/// `hi` slots), the scale of the chunk's block b at `1024·c + 512·b + 32 +
/// 4·r12` (the first `lo` slot of its dwords). Blocks past d keep the
/// cleared area's zero codes and scales. The record's `R_CODE_BIAS` lane
/// takes `−128·Σ_b s_b·Σc_b` as f32: what the unsigned keys add to the
/// scaled dots. The head's i16 codes (the pair loop's, which scores the
/// keys the trips leave, and every key of a tile of another size) are
/// rewritten from the rounded q, `round(c·s_b/s)` with the head's scale
/// `s` (`R_QSCALE`, which [`q_to_i16`] set), so every key of the tile
/// meets the same q. Clobbers rax, rcx, rdx, rsi, ymm1–ymm15.
pub(super) fn q8_parts(a: &mut X86Asm) {
    let (c127, minus128, abs_mask, tiny, bias) = (Ymm(10), Ymm(11), Ymm(12), Ymm(13), Ymm(14));
    for (reg, value) in [(c127, 127), (minus128, -128)] {
        a.mov_imm(RAX, value);
        a.vcvtsi2ss(reg, RAX);
        a.vbroadcastss_reg(reg, reg);
    }
    a.vpbroadcastd_load(abs_mask, mem(RSP, S_ABS_MASK));
    a.vpbroadcastd_load(tiny, mem(RSP, V_Q8_FLOOR));
    a.vxorps(bias, bias, bias);
    // 1/s, and rax = the head's i16 codes (`qarea + 512·z + 64·r12`).
    let inv_head = Ymm(1);
    a.lea(RAX, mem(RBX, R_QSCALE));
    a.mov(RCX, R12);
    a.shl_imm(RCX, 2);
    a.add(RAX, RCX);
    a.vpbroadcastd_load(Ymm(2), mem(RAX, 0));
    a.mov_imm(RAX, 1);
    a.vcvtsi2ss(inv_head, RAX);
    a.vbroadcastss_reg(inv_head, inv_head);
    a.vdivps(inv_head, inv_head, Ymm(2));
    a.mov(RSI, R8);
    a.load64(RDX, mem(RBX, R_QAREA));
    a.load64(RAX, mem(RSP, S_QPARTS));
    a.add(RDX, RAX);
    a.mov(RAX, R12);
    a.shl_imm(RAX, 2);
    a.add(RDX, RAX);
    a.load64(RAX, mem(RBX, R_QAREA));
    a.mov(RCX, R12);
    a.shl_imm(RCX, 6);
    a.add(RAX, RCX);
    let block = |a: &mut X86Asm, groups: usize| {
        let ys = [Ymm(2), Ymm(3), Ymm(4), Ymm(5)];
        let (m, t, inv) = (Ymm(6), Ymm(7), Ymm(8));
        for (k, &y) in ys.iter().enumerate() {
            if k < groups {
                a.vcvtph2ps_load(y, mem(RSI, 16 * k as i32));
            } else {
                a.vxorps(y, y, y);
            }
        }
        a.vandps(m, ys[0], abs_mask);
        for &y in &ys[1..] {
            a.vandps(t, y, abs_mask);
            a.vmaxps(m, m, t);
        }
        horizontal(a, m, t, X86Asm::vmaxps);
        a.vmaxps(m, m, tiny);
        a.vbroadcastss_reg(m, m);
        a.vdivps(inv, c127, m);
        a.vdivps(m, m, c127);
        a.vmovss_store(mem(RDX, 32), m);
        for &y in &ys {
            a.vmulps(y, y, inv);
            a.vcvtps2dq(y, y);
        }
        // bias += s·Σc (lane 0).
        a.vpaddd(t, ys[0], ys[1]);
        a.vpaddd(inv, ys[2], ys[3]);
        a.vpaddd(t, t, inv);
        horizontal(a, t, inv, X86Asm::vpaddd);
        a.vcvtdq2ps(t, t);
        a.vmulps(t, t, m);
        a.vaddps(bias, bias, t);
        // 32 codes: i32 → i16 in order (d 0–15, 16–31), → i8: 128-bit
        // lane 0 holds dwords 0, 1, 4, 5 of the block, lane 1 2, 3, 6, 7.
        let (lo, hi, spare) = (Ymm(8), Ymm(9), Ymm(15));
        for (dst, pair) in [(lo, [ys[0], ys[1]]), (hi, [ys[2], ys[3]])] {
            a.vperm2f128(dst, pair[0], pair[1], 0x20);
            a.vperm2f128(spare, pair[0], pair[1], 0x31);
            a.vpackssdw(dst, dst, spare);
        }
        a.vpacksswb(lo, lo, hi);
        a.vextracti128_hi(hi, lo);
        for (v, dwords) in [(lo, [0, 1, 4, 5]), (hi, [2, 3, 6, 7])] {
            a.vmovd_store(mem(RDX, 64 * dwords[0]), v);
            for (i, &dw) in dwords.iter().enumerate().skip(1) {
                a.vpextrd_store(mem(RDX, 64 * dw), v, i as i8);
            }
        }
        // The i16 codes of the rounded q: round(c·s_b/s), in order.
        a.vmulps(t, m, inv_head);
        for &y in &ys {
            a.vcvtdq2ps(y, y);
            a.vmulps(y, y, t);
            a.vcvtps2dq(y, y);
        }
        for (half, pair) in [[ys[0], ys[1]], [ys[2], ys[3]]].into_iter().enumerate() {
            a.vperm2f128(lo, pair[0], pair[1], 0x20);
            a.vperm2f128(spare, pair[0], pair[1], 0x31);
            a.vpackssdw(lo, lo, spare);
            a.vmovups_store(mem(RAX, 32 * half as i32), lo);
        }
    };
    let (whole, tail, done) = (a.new_label(), a.new_label(), a.new_label());
    a.load64(RCX, mem(RSP, S_D));
    a.shr_imm(RCX, 5);
    a.bind(whole);
    a.cmp_imm(RCX, 0);
    a.jcc(Cond::E, tail);
    block(a, 4);
    a.add_imm(RSI, 64);
    a.add_imm(RDX, 512);
    a.add_imm(RAX, 512);
    a.sub_imm(RCX, 1);
    a.jmp(whole);
    // The last d % 32 (8, 16 or 24: d is a multiple of 8).
    a.bind(tail);
    a.load64(RCX, mem(RSP, S_D));
    a.and_imm(RCX, 31);
    a.shr_imm(RCX, 3);
    for groups in 1..4 {
        let next = a.new_label();
        a.cmp_imm(RCX, groups as i32);
        a.jcc(Cond::Ne, next);
        block(a, groups);
        a.jmp(done);
        a.bind(next);
    }
    a.bind(done);
    a.vmulps(bias, bias, minus128);
    a.lea(RAX, mem(RBX, R_CODE_BIAS));
    a.mov(RCX, R12);
    a.shl_imm(RCX, 2);
    a.add(RAX, RCX);
    a.vmovss_store(mem(RAX, 0), bias);
}

/// Keys of the tile at rbx (a tile of `g` heads, [`HEADS`]) in trips of
/// 16 while r12 ≥ 16 (registers as [`score_loop`] sets them: r13 the K
/// row, r14 its stride, r15 the score cursor, r8 and r9 the key scale and
/// offset cursors, r10 their stride, r12 the keys left). Clobbers rax,
/// rcx, rdx, rsi, rbp, r11.
///
/// With `q8` ([`DecodeIsa::lane_int8_q`]) each head's lo accumulator takes
/// f32 sums instead: its hi one collects a 32-d block's integer dots (one
/// `vpdpbusd` per dword against q's int8 code), then is converted and
/// added × the block's scale.
pub(super) fn key_trips(a: &mut X86Asm, softmax: SoftmaxMode, g: usize, q8: bool) {
    assert!(HEADS.contains(&g), "keys in lanes serve tiles of 4–7 heads");
    let (trip, out) = (a.new_label(), a.new_label());
    let prefetch = Prefetch::for_loop(Keys::I8Asym, g);
    // k3: the dwords of a last chunk of d % 64 bytes.
    a.load64(RCX, mem(RSP, S_D));
    a.and_imm(RCX, 63);
    a.shr_imm(RCX, 2);
    a.mov_imm(RAX, 1);
    a.shl_cl(RAX);
    a.sub_imm(RAX, 1);
    a.kmovw_from_gp(Kreg(3), RAX);
    a.bind(trip);
    a.cmp_imm(R12, TRIP);
    a.jcc(Cond::L, out);
    key_parameters(a, prefetch);
    for h in 0..g {
        for part in 0..2 {
            a.vpxord_zmm(acc(h, part), acc(h, part), acc(h, part));
        }
    }
    a.vpbroadcastd_zmm_load(X80, mem(RSP, V_X80));
    // rdx = the chunk's bytes of the first row, rax = its q parts, rbp =
    // the prefetch distance, rcx = whole chunks left.
    a.mov(RDX, R13);
    a.load64(RAX, mem(RBX, R_QAREA));
    a.load64(RCX, mem(RSP, S_QPARTS));
    a.add(RAX, RCX);
    a.load64(RBP, mem(RSP, S_KAHEAD));
    let chunk_dots = |a: &mut X86Asm, k: Kreg| {
        let mut rows: Vec<Zmm> = (0..16).map(Zmm).collect();
        a.mov(RSI, RDX);
        for &row in &rows {
            a.vpxord_zmm_load_masked(row, k, X80, mem(RSI, 0));
            prefetch.line_indexed(a, RSI, RBP);
            a.add(RSI, R14);
        }
        transpose(a, &mut rows, &mut SPARE.clone(), 4);
        if q8 {
            for block in 0..2 {
                let in_block = rows
                    .iter()
                    .zip(&DWORD_OF)
                    .filter(|&(_, &dw)| dw / 8 == block);
                for (&row, &dword) in in_block {
                    for h in 0..g {
                        let at = 64 * dword as i32 + 4 * h as i32;
                        a.vpdpbusd_zmm_bcst(acc(h, 0), row, mem(RAX, at));
                    }
                }
                for h in 0..g {
                    let (dots, sum) = (acc(h, 0), acc(h, 1));
                    let scale = 512 * block as i32 + 32 + 4 * h as i32;
                    a.vcvtdq2ps_zmm(dots, dots);
                    a.vfmadd231ps_zmm_bcst(sum, dots, mem(RAX, scale));
                    a.vpxord_zmm(dots, dots, dots);
                }
            }
            return;
        }
        for (&row, &dword) in rows.iter().zip(&DWORD_OF) {
            for h in 0..g {
                for part in 0..2 {
                    let at = 64 * dword as i32 + 32 * part as i32 + 4 * h as i32;
                    a.vpdpbusd_zmm_bcst(acc(h, part), row, mem(RAX, at));
                }
            }
        }
    };
    amx_scores::int8_chunks(a, RDX, |a, whole| {
        chunk_dots(a, if whole { Kreg(0) } else { Kreg(3) })
    });
    finish(a, softmax, g, q8);
    a.mov(RAX, R14);
    a.shl_imm(RAX, 4);
    a.add(R13, RAX);
    a.add_imm(R15, 32 * TRIP);
    a.sub_imm(R12, TRIP);
    a.jmp(trip);
    a.bind(out);
}

/// Lane `i`'s `vpermt2d` index of [`V_EVEN_DWORDS`]: dword `2i` of a
/// two-head parameter row held as dwords 0..TRIP (the first register) and
/// TRIP − 1..2·TRIP − 1 (the second, table entries TRIP on), so the loads
/// end at dword `2·(TRIP − 1)`, the trip's last key.
const fn even_dword_index(i: i32) -> i32 {
    if 2 * i < TRIP {
        2 * i
    } else {
        TRIP + 2 * i - (TRIP - 1)
    }
}

/// The trip's 16 keys' scales and offsets side by side at `V_KEY_SCALE`
/// and `V_KEY_OFFSET`, the cursors r8 and r9 moved 16 keys on. Their rows
/// lie kvh dwords apart (r10 bytes): with one KV head they are a vector,
/// with two the even dwords of dwords 0–15 and 15–30 (never the next
/// key's, which may lie past the cache), else one by one (32 loads and 32
/// stores a trip, which the score loop, bound by its loads, pays for).
/// With one or two KV heads each trip prefetches its lines
/// `V_PARAM_AHEAD` bytes on.
/// Clobbers rax, rdx, rsi and zmm0–zmm2.
fn key_parameters(a: &mut X86Asm, prefetch: Prefetch) {
    let params = [(R8, V_KEY_SCALE), (R9, V_KEY_OFFSET)];
    let (one_by_one, one_head, done) = (a.new_label(), a.new_label(), a.new_label());
    a.mov(RAX, R10);
    a.shl_imm(RAX, 4);
    a.cmp_imm(R10, 8);
    a.jcc(Cond::A, one_by_one);
    // The lines of the trip `V_PARAM_AHEAD` bytes on: without them each
    // new line of either stream waited on memory (Qwen2-1.5B kv8, 4096
    // keys, one thread, AMD Zen 5: 99 µs cold against 105, medians of
    // eight alternating runs, with the gather below). With more KV heads
    // every tile of a score block would prefetch the same lines again
    // (32/8 heads: 3–5% slower), so only one or two do.
    a.load64(RDX, mem(RSP, V_PARAM_AHEAD));
    for cursor in params.map(|(c, _)| c) {
        // The trip's 16·4·kvh bytes: one or two lines.
        let one_line = a.new_label();
        a.lea(RSI, mem(RDX, 0));
        a.add(RSI, cursor);
        prefetch.line(a, mem(RSI, 0));
        a.cmp_imm(R10, 4);
        a.jcc(Cond::E, one_line);
        prefetch.line(a, mem(RSI, 64));
        a.bind(one_line);
    }
    a.cmp_imm(R10, 4);
    a.jcc(Cond::E, one_head);
    let (lo, hi, even) = (Zmm(0), Zmm(1), Zmm(2));
    a.vmovups_zmm_load(even, mem(RSP, V_EVEN_DWORDS));
    for (cursor, at) in params {
        a.vmovups_zmm_load(lo, mem(cursor, 0));
        a.vmovups_zmm_load(hi, mem(cursor, 4 * (TRIP - 1)));
        a.vpermt2d_zmm(lo, even, hi);
        a.vmovups_zmm_store(mem(RSP, at), lo);
        a.add(cursor, RAX);
    }
    a.jmp(done);
    a.bind(one_head);
    for (cursor, at) in params {
        a.vmovups_zmm_load(lo, mem(cursor, 0));
        a.vmovups_zmm_store(mem(RSP, at), lo);
        a.add(cursor, RAX);
    }
    a.jmp(done);
    a.bind(one_by_one);
    for (cursor, at) in params {
        for i in 0..TRIP {
            let v = Ymm((i % 4) as u8);
            a.vmovss_load(v, mem(cursor, 0));
            a.vmovss_store(mem(RSP, at + 4 * i), v);
            a.add(cursor, R10);
        }
    }
    a.bind(done);
}

/// A trip's 16 keys × `g` heads of integer dots to scores, as
/// [`key_score`] computes each: `scale·(q scale·dot) + offset·Σq`, stored
/// key by key into `sarea[j][8]` (head lanes past g zero), the running
/// max and (async softmax) the range flags updated.
fn finish(a: &mut X86Asm, softmax: SoftmaxMode, g: usize, q8: bool) {
    let (scale, offset) = (Zmm(30), Zmm(31));
    a.vmovups_zmm_load(scale, mem(RSP, V_KEY_SCALE));
    a.vmovups_zmm_load(offset, mem(RSP, V_KEY_OFFSET));
    for h in 0..8 {
        let s = Zmm(h as u8);
        if h >= g {
            a.vpxord_zmm(s, s, s);
            continue;
        }
        let at = 4 * h as i32;
        if q8 {
            // scale·(Σ_b s_b·dot_b − 128·Σ_b s_b·Σc_b) + offset·Σq.
            a.vmulps_zmm(s, acc(h, 1), scale);
            a.vfmadd231ps_zmm_bcst(s, scale, mem(RBX, R_CODE_BIAS + at));
            a.vfmadd231ps_zmm_bcst(s, offset, mem(RBX, R_SUMQ + at));
            continue;
        }
        a.vpslld_zmm_imm(s, acc(h, 0), 8);
        a.vpaddd_zmm(s, s, acc(h, 1));
        a.vpsubd_zmm_bcst(s, s, mem(RBX, R_CODE_BIAS + at));
        a.vcvtdq2ps_zmm(s, s);
        a.vmulps_zmm_bcst(s, s, mem(RBX, R_QSCALE + at));
        a.vmulps_zmm(s, s, scale);
        a.vfmadd231ps_zmm_bcst(s, offset, mem(RBX, R_SUMQ + at));
    }
    // Heads × keys to keys × heads: within 128-bit lanes as the K rows'
    // transpose, heads[s] (s < 4) then holds heads 0–3 and heads[4 + s]
    // heads 4–7 of key `4·lane + KEY_OF[s]`; vpermt2d puts each key's 8
    // heads in a ymm half.
    let mut heads: Vec<Zmm> = (0..8).map(Zmm).collect();
    transpose(a, &mut heads, &mut SPARE.clone(), 2);
    let (join_lo, join_hi) = (Zmm(12), Zmm(13));
    a.vmovups_zmm_load(join_lo, mem(RSP, V_JOIN_LO));
    a.vmovups_zmm_load(join_hi, mem(RSP, V_JOIN_HI));
    let mut rows = Vec::new();
    for s in 0..4u8 {
        let (lo, heads_lo, heads_hi) = (Zmm(8 + s), heads[s as usize], heads[4 + s as usize]);
        a.vmovdqa64_zmm(lo, heads_lo);
        a.vpermt2d_zmm(lo, join_lo, heads_hi);
        a.vpermt2d_zmm(heads_lo, join_hi, heads_hi);
        let key = KEY_OF[s as usize] as i32;
        for (v, first) in [(lo, key), (heads_lo, 8 + key)] {
            if v.0 < 16 {
                a.vmovups_store(mem(R15, 32 * first), Ymm(v.0));
            } else {
                a.vmovups_ymm_evex_store(mem(R15, 32 * first), Ymm(v.0));
            }
            a.vextractf64x4_hi_store(mem(R15, 32 * (first + 4)), v);
            rows.push(v);
        }
    }
    // The running max: the pair loop's `vmaxps(score, max)` keeps the old
    // max where a score is NaN; here a NaN may reach the max, but a NaN
    // score also fails the range (the tile recomputes) and makes the
    // head's output NaN either way.
    // A tree over the 8 rows (zmm20–23: the accumulators are spent).
    let pairs: Vec<Zmm> = (20..24).map(Zmm).collect();
    for (i, &m) in pairs.iter().enumerate() {
        a.vmaxps_zmm(m, rows[2 * i], rows[2 * i + 1]);
    }
    a.vmaxps_zmm(pairs[0], pairs[0], pairs[1]);
    a.vmaxps_zmm(pairs[2], pairs[2], pairs[3]);
    a.vmaxps_zmm(Zmm(14), pairs[0], pairs[2]);
    a.vextracti64x4_hi(Ymm(15), Zmm(14));
    a.vmaxps(Ymm(14), Ymm(14), Ymm(15));
    a.vmaxps_mem(Ymm(14), Ymm(14), mem(RBX, R_MAX));
    a.vmovups_store(mem(RBX, R_MAX), Ymm(14));
    if let SoftmaxMode::Async { .. } = softmax {
        // ok &= (score − phi ≥ lo) & (score − phi ≤ hi) for every key;
        // NaN is out. Two rows a chain of masked compares, four chains
        // (k1, k2, k4, k5; k3 holds the tail's dwords) ANDed at the end.
        // The rows lie in zmm0–11 and zmm31; the accumulators are spent.
        let (phi, lo, hi) = (Zmm(16), Zmm(17), Zmm(18));
        a.vbroadcasti64x4_zmm_load(phi, mem(RSP, V_PHI));
        a.vbroadcasti64x4_zmm_load(lo, mem(RSP, V_LO));
        a.vbroadcasti64x4_zmm_load(hi, mem(RSP, V_HI));
        let chains = [Kreg(1), Kreg(2), Kreg(4), Kreg(5)];
        for (i, &r) in rows.iter().enumerate() {
            let (k, t) = (chains[i / 2], Zmm(24 + i as u8));
            a.vsubps_zmm(t, r, phi);
            if i % 2 == 0 {
                a.vcmpps_zmm_k(k, t, lo, 13); // ge (ordered)
            } else {
                a.vcmpps_zmm_k_masked(k, k, t, lo, 13);
            }
            a.vcmpps_zmm_k_masked(k, k, t, hi, 2); // le (ordered)
        }
        a.kandw(Kreg(1), Kreg(1), Kreg(2));
        a.kandw(Kreg(4), Kreg(4), Kreg(5));
        a.kandw(Kreg(1), Kreg(1), Kreg(4));
        a.vmovups_zmm_load_masked(Zmm(7), Kreg(1), mem(RSP, V_ONES));
        a.vextracti64x4_hi(Ymm(8), Zmm(7));
        a.vandps(Ymm(7), Ymm(7), Ymm(8));
        a.vmovups_load(Ymm(8), mem(RBX, R_OK));
        a.vandps(Ymm(7), Ymm(7), Ymm(8));
        a.vmovups_store(mem(RBX, R_OK), Ymm(7));
    }
}
