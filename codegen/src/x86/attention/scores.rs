//! The decode's score pass: q in the form each loop reads (f32 chunks, or
//! i16 codes with their scale and sum for int8 keys), and the loops over a
//! block of keys that score every head of a tile (one head, key pairs on
//! ymm or zmm; the lane and AMX loops are [`super::lane_scores`] and
//! [`super::amx_scores`]).

use super::*;

/// `acc.i32 += Σ₂ k.i16 · q.i16` in the form `dot` names (`tmp` is
/// clobbered by `vpmaddwd` only).
pub(super) fn dot_i16(a: &mut X86Asm, dot: KeyDot, acc: Ymm, k: Ymm, q: Ymm, tmp: Ymm) {
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
pub(super) fn load_codes_i16(a: &mut X86Asm, dst: Ymm, m: Mem, half: bool) {
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
pub(super) fn i16_chunks(
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
pub(super) fn q_chunk_bytes(heads: usize) -> i32 {
    if heads == 1 { 32 } else { 32 * MAX_TILE as i32 }
}

/// q rows of the tile (record at rbx) → `qarea[d/8][8][8]` f32 (unused
/// heads zero); for int8 keys instead q's i16 form, `qarea[⌈d/16⌉][8][16]`
/// (a half chunk of 8 d first where d/8 is odd), or with `zmm` for tiles
/// of several heads `qarea[⌈d/32⌉][8][32]` ([`q_to_i16_zmm`]), with per
/// head `Σq` and the form's scale in the record.
pub(super) fn widen_q(a: &mut X86Asm, keys: Keys, form: ScoreForm) {
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
            let i16_parts = a.new_label();
            if form.q8 {
                // Tiles the lanes loop takes get q as int8 blocks (and
                // their pair loop the same q); other sizes keep i16.
                a.load64(RAX, mem(RBX, R_GT));
                a.cmp_imm(RAX, *lane_scores::HEADS.start() as i32);
                a.jcc(Cond::B, i16_parts);
                a.cmp_imm(RAX, *lane_scores::HEADS.end() as i32);
                a.jcc(Cond::A, i16_parts);
                lane_scores::q8_parts(a);
                a.jmp(packed);
            }
            a.bind(i16_parts);
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
pub(super) fn q_to_i16(a: &mut X86Asm, lane_bytes: Gp, zmm: bool) {
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
pub(super) fn q_to_i16_zmm(a: &mut X86Asm, pack_store_at: impl Fn(&mut X86Asm, i32)) {
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

/// Scores of the block's keys (`S_JB .. S_JEND`) for the tile at rbx into
/// its `sarea[j][8]` from the record's cursors, with the running max and
/// the in-range mask per head lane; dispatched on the tile's head count so
/// each variant's FMAs have constant offsets.
pub(super) fn scores(a: &mut X86Asm, keys: Keys, softmax: SoftmaxMode, form: ScoreForm) {
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
pub(super) fn score_one_head(a: &mut X86Asm, keys: Keys, softmax: SoftmaxMode, dot: KeyDot) {
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
pub(super) fn even_odd_chunks(
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
pub(super) fn reduce_lanes(a: &mut X86Asm) {
    reduce_lanes_from(a, [0, 1, 2, 3, 4, 5, 6, 7]);
}

/// ymm1 = the sums of the 8 registers `r`, lane i the sum of `r[i]`
/// (clobbers them, ymm1 and ymm3; a register may stand twice where it is
/// zero).
pub(super) fn reduce_lanes_from(a: &mut X86Asm, r: [u8; 8]) {
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
pub(super) fn chunk_cursors(a: &mut X86Asm) {
    a.mov(RSI, R13);
    a.load64(RAX, mem(RBX, R_QAREA));
    a.load64(RCX, mem(RSP, S_D8));
    a.load64(RDX, mem(RSP, S_KAHEAD));
    a.add(RDX, R13);
}

pub(super) fn score_loop(
    a: &mut X86Asm,
    keys: Keys,
    softmax: SoftmaxMode,
    form: ScoreForm,
    g: usize,
) {
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
            lane_scores::key_trips(a, softmax, g, form.q8);
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
pub(super) fn f16_key_chunks(a: &mut X86Asm, g: usize) {
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
pub(super) fn key_score(
    a: &mut X86Asm,
    keys: Keys,
    softmax: SoftmaxMode,
    g: usize,
    maxv: Ymm,
    ok: Ymm,
) {
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
pub(super) const PAIR_HEADS: usize = 6;

/// Keys two at a time while r12 ≥ 2, for tiles of 5 or 6 heads (GQA 6:
/// Qwen2): each q chunk is loaded once into a register for both keys'
/// FMAs. The one-key loop reads q from memory for every FMA: 7 vector
/// loads per 6 FMAs, and Zen 4 issues two vector loads a cycle (llvm-mca's
/// znver4 model: 58 of the 69 cycles a key are the load pipes); here 8
/// loads feed 12 FMAs. Key 0's heads sum in ymm0–5, key 1's in ymm6–11,
/// the keys widen into ymm12 and ymm13, q goes in ymm14. The running max
/// and range flags stay in the tile record (the one-key loop holds them
/// in ymm13 and ymm14).
pub(super) fn key_pairs(a: &mut X86Asm, keys: Keys, softmax: SoftmaxMode, dot: KeyDot, g: usize) {
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
pub(super) const PAIR_SLOTS: [u8; 16] = [0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15];
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
pub(super) fn sum_tree(a: &mut X86Asm, t: Zmm, zero: Zmm, g: usize, int: bool) {
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
pub(super) fn key_pairs_zmm(a: &mut X86Asm, keys: Keys, softmax: SoftmaxMode, g: usize) {
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
