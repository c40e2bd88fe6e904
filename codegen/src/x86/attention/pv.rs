//! The decode's P·V: a tile's p against its KV head's value rows, in
//! passes of heads × chunks of d whose accumulators stay in registers for a
//! block of keys, one pass loop per value form (f16 or fp8 values; f32 FMAs
//! on ymm or zmm, bf16 dots, f16 FMAs).

use super::*;

/// `S_PV_BLOCK` = the call's P·V block. With the f16 P·V:
/// [`pv_block_f16`] where it serves several heads a tile (group ≥ 2),
/// else 16 keys. Otherwise the most keys, from [`PV_BLOCK_MAX`] halving to
/// [`PV_BLOCK`], whose V rows of every KV head (`S_VSTRIDE` bytes a key)
/// fit [`PV_BLOCK_BYTES`]: a multi-head cache's rows are `kvh·d` apart,
/// and 64 of them a block, read tile by tile, took a Llama2 kv8 call
/// 1.5–2× the time of 16 (Sapphire Rapids-class Xeon): the block's V rows
/// of every head no longer stay in cache between the passes. Clobbers rax
/// and rdx.
pub(super) fn pv_block(a: &mut X86Asm, values: Values, f16: bool) {
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

/// The P·V pass's register file: ymm0–15, or with AVX512VL ymm0–31
/// (EVEX forms wherever an operand is past 15). A pass holds the widened
/// row's chunk in ymm0, then its heads' p broadcasts, then their
/// accumulators; or, where the broadcasts do not fit
/// ([`PvRegisters::widen_once`]), the widened chunks, one broadcast
/// register and the accumulators.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) struct PvRegisters {
    pub(super) ymm32: bool,
    /// fp8 values in ymm0–15: a pass takes every head of a tile, so each
    /// key's values are widened once, not once per pass of 3 heads, and p
    /// is broadcast one head at a time into one register. fp8's widening
    /// ([`fp8_row_to_f16`]) outweighs the broadcasts: a hot Qwen2-1.5B
    /// kv8 call (1024 keys, one thread) took 104 µs against 112 with
    /// passes of 3 heads, best of 5 (AMD Zen 3). f16 values keep passes of
    /// 3 heads: there the conversion is one load, and the broadcasts'
    /// loads made 12 FMAs slower in a loop held in L1 (5.5 TSC ticks
    /// against 4.7).
    pub(super) widen_once: bool,
    /// fp8 values widened straight to f32 bits of 2^-120 of the value, a
    /// chunk at a time in registers ([`fp8_chunk_to_f32`]), instead of to
    /// f16 bits in the frame ([`fp8_row_to_f16`]); p is then stored ×
    /// [`FP8_F32_P_SCALE`] and `num` rescaled where the tile finishes. A
    /// one-head pass of 8 chunks took 12.9 cycles a key this way against
    /// 15.3–15.7 by the frame, in a loop held in L1 on an AMD Zen 3 (the
    /// frame's `vcvtph2ps` waits on the stores it reads). With AVX512VL
    /// the several-head passes widen 16 at a time on zmm ([`pv_pass_zmm`])
    /// where the packed forms (`bf16`, `f16`) are not taken.
    pub(super) fp8_f32: bool,
    /// fp8 values by bf16 dots ([`pv_pass_bf16`]): zmm accumulators.
    pub(super) bf16: bool,
    /// Several-head tiles by f16 FMAs ([`pv_pass_f16`]): accumulators of
    /// 16 lanes (two chunks), p broadcast from memory.
    pub(super) f16: bool,
    /// Several-head tiles by f32 FMAs on zmm ([`pv_pass_zmm`]): 16 lanes
    /// an FMA where a ymm takes 8, so a pass holds 64 lanes of d for 6
    /// heads. f16 values, and fp8 values with `fp8_f32`; where the CPU has
    /// AVX512VL and the packed forms are not taken.
    pub(super) zmm_f32: bool,
}

impl PvRegisters {
    /// The vector registers of the target the pass runs on (`x86-avx2`,
    /// or `x86-avx512` whose EVEX names 32).
    pub(super) fn count(self) -> usize {
        let name = if self.ymm32 {
            crate::x86::AVX512_NAME
        } else {
            crate::x86::NAME
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
    pub(super) fn heads(self) -> usize {
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
    pub(super) fn p_in_registers_heads(self) -> usize {
        (self.count() - 1) / 5
    }

    /// Chunks of 8 lanes of d per P·V group for a tile of `heads` heads:
    /// as many accumulators as the file holds beside each pass's p
    /// broadcasts and the widened row (with [`Self::widen_once`] past
    /// [`Self::p_in_registers_heads`]: beside the widened chunks and one
    /// broadcast register), at most 8; or 16 where that many fit (one head in ymm0–31), so a 128-wide head takes one group and
    /// each key's pass overhead is paid once (Llama2 kv8 hot about 3%
    /// faster on Zen 4, cold within noise).
    pub(super) fn group_chunks(self, heads: usize) -> usize {
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
    pub(super) fn fma(self, a: &mut X86Asm, dst: Ymm, x: Ymm, y: Ymm) {
        if dst.0.max(x.0).max(y.0) < 16 {
            a.vfmadd231ps(dst, x, y);
        } else {
            a.vfmadd231ps_ymm_evex(dst, x, y);
        }
    }

    pub(super) fn load(self, a: &mut X86Asm, dst: Ymm, m: Mem) {
        if dst.0 < 16 {
            a.vmovups_load(dst, m);
        } else {
            a.vmovups_ymm_evex_load(dst, m);
        }
    }

    pub(super) fn store(self, a: &mut X86Asm, m: Mem, src: Ymm) {
        if src.0 < 16 {
            a.vmovups_store(m, src);
        } else {
            a.vmovups_ymm_evex_store(m, src);
        }
    }

    pub(super) fn broadcast(self, a: &mut X86Asm, dst: Ymm, m: Mem) {
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
pub(super) fn pv(a: &mut X86Asm, keys: Keys, values: Values, regs: PvRegisters) {
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
pub(super) fn dispatch(a: &mut X86Asm, reg: Gp, cases: usize) -> Vec<Label> {
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
pub(super) fn pv_passes(
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
pub(super) fn num_cursor(a: &mut X86Asm, layout: NumLayout) {
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
pub(super) enum NumLayout {
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
pub(super) fn num_chunk_stride(a: &mut X86Asm, reg: Gp) {
    let [one, several] = [NumLayout::OneHead, NumLayout::Interleaved].map(|l| l.at(1, 0));
    by_tile_heads(a, reg, one, several);
}

/// `reg` = `one` if the tile at rbx has one head, else `several` (the
/// layouts of one-head tiles differ: [`q_chunk_bytes`], [`NumLayout`]).
pub(super) fn by_tile_heads(a: &mut X86Asm, reg: Gp, one: i32, several: i32) {
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
pub(super) fn pv_cursors(a: &mut X86Asm, value_bytes: i32) {
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
pub(super) fn pv_loop_top(
    a: &mut X86Asm,
    keys: Keys,
    values: Values,
    hs: usize,
    nc: usize,
) -> (Label, i32) {
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
pub(super) fn pv_next_key(a: &mut X86Asm, top: Label) {
    a.add(RSI, R12);
    a.add(RAX, RCX);
    a.sub_imm(R8, 1);
    a.jcc(Cond::Ne, top);
}

/// One pass over the tile at rbx: `hs` heads from `S_SUB0`, `nc` chunks
/// from `S_C0`, keys `S_JB..S_JEND`, accumulators in ymm0..hs·nc.
pub(super) fn pv_pass(
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
pub(super) fn fp8_row_to_f16(a: &mut X86Asm, nc: usize, tmp: Ymm) {
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
pub(super) fn value_chunk(a: &mut X86Asm, values: Values, regs: PvRegisters, dst: Ymm, c: usize) {
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
pub(super) fn fp8_chunk_to_f32(a: &mut X86Asm, dst: Ymm, c: usize) {
    a.vpmovsxbd_load(dst, mem(RAX, 8 * c as i32));
    a.vpslld_imm(dst, dst, 20);
    a.vpand_mem(dst, dst, mem(RSP, V_E4M3_F32));
}

/// Whether p × [`FP8_F32_P_SCALE`] stays finite with room: p is at most 1
/// against the running max, or e^hi against the async softmax's phi (the
/// library's hi is 6.5; a range past 2^40 keeps the f16 widening).
pub(super) fn fp8_f32_fits(softmax: SoftmaxMode) -> bool {
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
pub(super) fn pv_pass_f16(
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
pub(super) fn pv_pass_zmm(
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
pub(super) const BF16_FIXED: usize = 6;

/// Byte `i` of the `vpermb` index that feeds [`pv_pass_bf16`]'s lookups:
/// the source byte (key·32 + d of two keys' 32 codes) whose bf16, after
/// `vpunpcklbw`/`vpunpckhbw` of the low and high bytes (lane-wise), lands
/// in dword lane d (the low unpack d 0–15, the high 16–31) as key 0's
/// half (low word) or key 1's.
pub(super) fn pair_order(i: usize) -> u8 {
    let (lane, j) = (i / 16, i % 16);
    let word = 8 * lane + j % 8;
    let (dword, key) = (word / 2, word % 2);
    let d = 8 * (dword / 8) + dword % 8 + if j >= 8 { 16 } else { 0 };
    (32 * key + d) as u8
}

/// The bf16 P·V's constants into the frame: the order index, the lookup
/// tables of bf16(2^-8 · e4m3) (p is stored × 2^8 for fp8 values, as the
/// f16 path's), the p pairing and the sign mask.
pub(super) fn bf16_constants(a: &mut X86Asm) {
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
pub(super) fn bf16_pairs(a: &mut X86Asm) {
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
pub(super) fn pv_pass_bf16(
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
