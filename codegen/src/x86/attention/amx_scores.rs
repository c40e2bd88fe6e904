//! Int8 key scores of a several-head tile on AMX ([`DecodeIsa::amx_scores`]).
//!
//! The scores of 16 keys × the tile's heads are one tile product: the K
//! rows load as they lie in the cache (16 rows of 64 bytes of d, the row
//! stride `kvh·d` as the load's stride), q is the B operand, laid out once
//! per call. `tdpbssd` multiplies signed bytes, so q's i16 code `c` (the
//! zmm loop's, at most 32639) goes in as two int8 parts, `c = 256·hi + lo`
//! (`hi = (c + 128) >> 8`, `lo` the sign-extended low byte): B's columns
//! 0–7 are the 8 head slots' `hi`, 8–15 their `lo`, and a key's integer dot
//! is `256·C[key][h] + C[key][8 + h]`, exactly the zmm loop's.
//!
//! A trip takes 32 keys in two C tiles (one hides the other's latency),
//! stores them to the frame, and finishes each key's 8 head sums by
//! [`key_score`] as the other loops do. Fewer than 16 keys left go by the
//! zmm loop ([`key_pairs_zmm`]).
//!
//! The call scores in blocks of 32 keys per tile, not the other loops' 4:
//! a tile product wants 16 rows at once. Measured on a Sapphire
//! Rapids-class Xeon (Qwen2-1.5B kv8, ctx 4096, one thread, medians of 5–7
//! alternating runs), the hot call took 141 µs against the zmm loop's 173
//! with blocks of 16, 32 or 64; cold, 64-key blocks took 278 µs against
//! 267 for 16 and the zmm loop's 266 (one KV head's rows read 64 at a
//! time stream worse), so 32 (269 cold, equal within the noise). Cold
//! calls are bound by how the loads of K and V overlap the rest of the
//! arithmetic, which the tile products do not change.

use super::*;
use crate::x86::amx::{TileMem, Tmm};

/// The C tiles' rows (a trip's keys × 16 i32), 64-byte aligned, past every other
/// decode frame's slots.
const V_AMX_C: i32 = FRAME_BF16;
/// The 64-byte tile configuration.
const V_AMX_CFG: i32 = V_AMX_C + 64 * AMX_BLOCK;
/// The decode frame with the AMX score loop's areas.
pub(super) const FRAME_AMX: i32 = V_AMX_CFG + 64;
const _: () = assert!(V_AMX_C % 64 == 0 && FRAME_AMX >= FRAME_F16);

/// 16-key groups (C tiles) a trip takes.
const GROUPS: usize = 2;
/// Keys a trip takes, and the score block of a call whose group has
/// several query heads (`S_SCORE_BLOCK`).
const AMX_BLOCK: i32 = 16 * GROUPS as i32;
/// q's zmm codes (`⌈d/32⌉·512` bytes) and its int8 parts (`⌈d/64⌉·1024`)
/// fit in a tile's q area and pad for every head dim (multiples of 8).
const _: () = {
    let mut d: usize = 8;
    while d <= 1 << 16 {
        let bytes = d.div_ceil(32) * 512 + d.div_ceil(64) * 1024;
        assert!(bytes <= 32 * d + Q_PAD as usize);
        d += 8;
    }
};
/// tmm0 and tmm1 the C tiles, tmm2 and tmm3 A (K rows) and B (q) of a
/// whole 64-byte chunk of d, tmm4 and tmm5 of the last `d % 64` bytes.
const C_TILES: [Tmm; GROUPS] = [Tmm(0), Tmm(1)];
const A: Tmm = Tmm(2);
const B: Tmm = Tmm(3);
const A_TAIL: Tmm = Tmm(4);
const B_TAIL: Tmm = Tmm(5);

/// The call's tile configuration, loaded (`ldtilecfg`), with the score
/// block and the q parts' offset. Clobbers rax, rcx, ymm0.
pub(super) fn config(a: &mut X86Asm) {
    a.comment("AMX: tile configuration (palette 1), score block, q parts' offset");
    a.vxorps(Ymm(0), Ymm(0), Ymm(0));
    a.vmovups_store(mem(RSP, V_AMX_CFG), Ymm(0));
    a.vmovups_store(mem(RSP, V_AMX_CFG + 32), Ymm(0));
    // Palette 1; bytes 16 + 2t: tile t's bytes a row; 48 + t: its rows.
    // tmm0–3: 16 rows of 64 bytes.
    a.store32_imm(mem(RSP, V_AMX_CFG), 1);
    for t in [0, 2] {
        a.store32_imm(mem(RSP, V_AMX_CFG + 16 + 2 * t), 0x0040_0040);
    }
    a.store32_imm(mem(RSP, V_AMX_CFG + 48), 0x1010_1010);
    // d % 64 ≠ 0: tmm4 takes 16 rows of d % 64 bytes, tmm5 its
    // (d % 64)/4 rows of 64 (the rows as one word: 16 | (d % 64)/4 << 8).
    let whole = a.new_label();
    a.load64(RCX, mem(RSP, S_D));
    a.and_imm(RCX, 63);
    a.jcc(Cond::E, whole);
    a.store16(mem(RSP, V_AMX_CFG + 24), RCX);
    a.mov_imm(RAX, 64);
    a.store16(mem(RSP, V_AMX_CFG + 26), RAX);
    a.mov(RAX, RCX);
    a.shl_imm(RAX, 6);
    a.add_imm(RAX, 16);
    a.store16(mem(RSP, V_AMX_CFG + 52), RAX);
    a.bind(whole);
    a.ldtilecfg(RSP, V_AMX_CFG);
    int8_parts_call(a, AMX_BLOCK);
}

/// What a call of a score loop on q's int8 parts sets (this one and the
/// keys-in-lanes loop): the score block, `trip` keys where the call's
/// group has several query heads, else [`SCORE_BLOCK`]; where q's parts
/// start in a tile's q area (`S_QPARTS`: past its zmm codes); the i16 pair
/// (128, 128) at `S_W128`. Clobbers rax, rcx.
pub(super) fn int8_parts_call(a: &mut X86Asm, trip: i32) {
    let done = a.new_label();
    a.mov_imm(RAX, trip);
    a.load64(RCX, mem(RSP, S_GROUP));
    a.cmp_imm(RCX, 1);
    a.jcc(Cond::Ne, done);
    a.mov_imm(RAX, SCORE_BLOCK);
    a.bind(done);
    a.store64(mem(RSP, S_SCORE_BLOCK), RAX);
    a.load64(RAX, mem(RSP, S_D));
    a.add_imm(RAX, 31);
    a.shr_imm(RAX, 5);
    a.shl_imm(RAX, 9);
    a.store64(mem(RSP, S_QPARTS), RAX);
    a.store32_imm(mem(RSP, S_W128), 0x0080_0080);
}

/// Head r12's q parts into B's layout, from its zmm codes (32 d at
/// `qarea + 512·z + 64·r12`): d's byte `4r + i` of 64-d chunk c at
/// `parts + 1024·c + 64·r + i` (that is `16·d`), `hi` in column r12
/// (`+ 4·r12`), `lo` in column 8 + r12 (`+ 32 + 4·r12`). Codes past d are
/// zero, so their parts are too; the area was cleared with the q area.
/// Clobbers rax, rcx, rdx, rsi, ymm2–ymm6.
pub(super) fn q_int8_parts(a: &mut X86Asm) {
    a.load64(RSI, mem(RBX, R_QAREA));
    a.mov(RDX, RSI);
    a.load64(RAX, mem(RSP, S_QPARTS));
    a.add(RDX, RAX);
    a.mov(RAX, R12);
    a.shl_imm(RAX, 2);
    a.add(RDX, RAX);
    a.shl_imm(RAX, 4);
    a.add(RSI, RAX);
    a.load64(RCX, mem(RSP, S_D));
    a.add_imm(RCX, 31);
    a.shr_imm(RCX, 5);
    a.vpbroadcastd_load(Ymm(6), mem(RSP, S_W128));
    let chunk = a.new_label();
    a.bind(chunk);
    for half in 0..2 {
        let (c, hi, parts) = (Ymm(2), Ymm(3), Ymm(4));
        a.vmovdqu_load(c, mem(RSI, 32 * half));
        a.vpaddw(hi, c, Ymm(6));
        a.vpsraw_imm(hi, hi, 8);
        a.vpsllw_imm(c, c, 8);
        a.vpsraw_imm(c, c, 8);
        // Per 128-bit lane: hi of 8 d (rows r, r + 1), then lo of them.
        a.vpacksswb(hi, hi, c);
        a.vextracti128_hi(parts, hi);
        for (lane, v) in [(0, hi), (1, parts)] {
            let row = mem(RDX, 256 * half + 128 * lane);
            a.vmovd_store(row, v);
            a.vpextrd_store(mem(RDX, row.disp + 64), v, 1);
            a.vpextrd_store(mem(RDX, row.disp + 32), v, 2);
            a.vpextrd_store(mem(RDX, row.disp + 96), v, 3);
        }
    }
    a.add_imm(RSI, 512);
    a.add_imm(RDX, 512);
    a.sub_imm(RCX, 1);
    a.jcc(Cond::Ne, chunk);
}

/// d in 64-byte chunks of the int8 rows at `row` and q's parts at rax
/// (1024 bytes a chunk): `chunk(a, true)` per whole chunk, each moving
/// `row` 64 bytes and rax 1024 on, then `chunk(a, false)` once for a last
/// `d % 64` bytes. Clobbers rcx.
pub(super) fn int8_chunks(a: &mut X86Asm, row: Gp, chunk: impl Fn(&mut X86Asm, bool)) {
    let (whole, tail, done) = (a.new_label(), a.new_label(), a.new_label());
    a.load64(RCX, mem(RSP, S_D));
    a.shr_imm(RCX, 6);
    a.jcc(Cond::E, tail);
    a.bind(whole);
    chunk(a, true);
    a.add_imm(row, 64);
    a.add_imm(RAX, 1024);
    a.sub_imm(RCX, 1);
    a.jcc(Cond::Ne, whole);
    a.bind(tail);
    a.load64(RCX, mem(RSP, S_D));
    a.test_imm(RCX, 63);
    a.jcc(Cond::E, done);
    chunk(a, false);
    a.bind(done);
}

/// Keys of the tile at rbx in trips of 32 while r12 ≥ 32, then of 16
/// while r12 ≥ 16 (registers as [`score_loop`] sets them: r13 the K row,
/// r14 its stride, r15 the score cursor, r8 and r9 the key scale and
/// offset cursors, r10 their stride, r12 the keys left).
pub(super) fn key_tiles(a: &mut X86Asm, softmax: SoftmaxMode, g: usize) {
    for groups in [GROUPS, 1] {
        key_groups(a, softmax, g, groups);
    }
}

/// Trips of `16·groups` keys while r12 has that many: per 64-byte chunk
/// of d one B load and per group a K tile load and `tdpbssd` (with a
/// prefetch of the chunk's line of each of its rows, `S_KAHEAD` on);
/// then the C tiles to the frame and per key its 8 head sums to
/// [`key_score`]. Clobbers rax, rcx, rdx, rsi, rbp, r11.
fn key_groups(a: &mut X86Asm, softmax: SoftmaxMode, g: usize, groups: usize) {
    let keys = 16 * groups as i32;
    let (trip, out) = (a.new_label(), a.new_label());
    let prefetch = Prefetch::for_loop(Keys::I8Asym, g);
    a.bind(trip);
    a.cmp_imm(R12, keys);
    a.jcc(Cond::L, out);
    for &c in &C_TILES[..groups] {
        a.tilezero(c);
    }
    // rbp = the chunk's K bytes of the first row, rax = its B rows.
    a.mov(RBP, R13);
    a.load64(RAX, mem(RBX, R_QAREA));
    a.load64(RCX, mem(RSP, S_QPARTS));
    a.add(RAX, RCX);
    a.mov_imm(R11, 64);
    a.load64(RDX, mem(RSP, S_KAHEAD));
    let chunk_products = |a: &mut X86Asm, k: Tmm, q: Tmm| {
        a.tileloadd(
            q,
            TileMem {
                base: RAX,
                stride: R11,
                disp: 0,
            },
        );
        a.mov(RSI, RBP);
        for &c in &C_TILES[..groups] {
            a.tileloadd(
                k,
                TileMem {
                    base: RSI,
                    stride: R14,
                    disp: 0,
                },
            );
            a.tdpbssd(c, k, q);
            // The next group's rows follow this one's 16.
            for _ in 0..16 {
                prefetch.line_indexed(a, RSI, RDX);
                a.add(RSI, R14);
            }
        }
    };
    int8_chunks(a, RBP, |a, whole| {
        if whole {
            chunk_products(a, A, B)
        } else {
            chunk_products(a, A_TAIL, B_TAIL)
        }
    });
    for (j, &c) in C_TILES[..groups].iter().enumerate() {
        let at = V_AMX_C + 1024 * j as i32;
        a.tilestored(
            TileMem {
                base: RSP,
                stride: R11,
                disp: at,
            },
            c,
        );
    }
    // Per key: 256·hi dot + lo dot, 8 head slots, to f32.
    let (maxv, ok) = (Ymm(15), Ymm(14));
    a.vmovups_load(maxv, mem(RBX, R_MAX));
    a.vmovups_load(ok, mem(RBX, R_OK));
    a.lea(RSI, mem(RSP, V_AMX_C));
    a.mov_imm(RCX, keys);
    let key = a.new_label();
    a.bind(key);

    a.vmovdqu_load(Ymm(1), mem(RSI, 0));
    a.vmovdqu_load(Ymm(2), mem(RSI, 32));
    a.vpslld_imm(Ymm(1), Ymm(1), 8);
    a.vpaddd(Ymm(1), Ymm(1), Ymm(2));
    a.vcvtdq2ps(Ymm(1), Ymm(1));
    key_score(a, Keys::I8Asym, softmax, g, maxv, ok);
    a.add_imm(RSI, 64);
    a.sub_imm(RCX, 1);
    a.jcc(Cond::Ne, key);
    a.vmovups_store(mem(RBX, R_MAX), maxv);
    a.vmovups_store(mem(RBX, R_OK), ok);
    a.sub_imm(R12, keys);
    a.jmp(trip);
    a.bind(out);
}
