//! Pieces every x86 kernel shares: the stack frame, row pointers, column
//! masks for the n tail, and the epilogue (bias, activation, store).
//!
//! Frame (rsp-relative after the prologue; no calls, so no alignment need):
//!
//! | offset | bytes | holds |
//! |---|---|---|
//! | 0 | 64 | column-mask table: 8 × -1 then 8 × 0; the mask for v valid columns is the 8 dwords at 4·(8 - v) |
//! | 64 | 16 | f16 tail scratch (8 halves before a partial store) |
//! | 96 | 32 | int16 ones (vpmaddwd) |
//! | 128 | 32 | int4 shift counts 0,0,0,0,4,4,4,4 (vpsrlvd) |
//! | 160 | 4 | 0x0F0F0F0F nibble mask |
//! | 164 | 4 | 127.0 |
//! | 168 | 4 | 0x7FFFFFFF (abs mask) |
//! | 172 | 4 | +inf |
//! | 176.. | 8 each | loop locals |
//! | 208 | 8 × 14 | float kernels: x row pointers while they are computed |
//! | 320 | 8 × 5 | float kernels: rdi, rbx, rbp, r14, r15 while the k loop holds more than 6 row pointers |
//! | 360 | 8 × 2 | float kernels: the k loop's end pointers (all steps; the last whole unrolled step) |
//! | 376 | 8 | rsp before the frame was aligned (see [`prologue_framed`]) |
//!
//! The zeros of the mask table (offset 32) double as relu's zero vector, so
//! no register is reserved for it.

use tessera_dsl::ir::{Activation, Format};

use super::asm::*;
use super::regfile::RegisterFile;
use crate::abi::MM_M;

pub const MASK_TABLE: i32 = 0;
pub const F16_SCRATCH: i32 = 64;
pub const ONES16: i32 = 96;
pub const SHIFTS: i32 = 128;
pub const NIBBLE: i32 = 160;
pub const C127: i32 = 164;
pub const ABS_MASK: i32 = 168;
pub const INF: i32 = 172;
pub const LOCAL0: i32 = 176;
pub const LOCAL1: i32 = 184;
pub const LOCAL2: i32 = 192;
/// Row pointer slots (float kernels).
pub const ROW_SLOTS: i32 = 208;
/// Saved loop registers (float kernels with more than 6 rows).
pub const SAVE_SLOTS: i32 = 320;
/// End of the k loop's weight stream, and its last whole unrolled step.
pub const K_END: i32 = 360;
pub const K_END_UNROLLED: i32 = 368;
/// rsp before [`prologue_framed`] rounded it down to a cache line.
const OLD_RSP: i32 = 376;
/// Eight zero f32 (the second half of the mask table).
pub const ZEROS: i32 = MASK_TABLE + 32;
const FRAME: i32 = 384;

/// Column mask for the n tail (never an accumulator).
pub const MASK: Ymm = Ymm(15);
/// Epilogue temporary of the int8 kernels (bias, scales); the float
/// kernels use ymm14 (see [`Store::tmp`]).
pub const TMP: Ymm = Ymm(13);

const SAVED: [Gp; 6] = [RBX, RBP, R12, R13, R14, R15];

/// Save callee-saved registers, open the frame, write the mask table.
pub fn prologue(a: &mut X86Asm) {
    prologue_framed(a, FRAME);
}

/// [`prologue`] with a frame of `frame` bytes (at least the standard one),
/// rounded down to a cache line: the frame's 32-byte constants and stores
/// then never split two lines. The caller's rsp is only 16-aligned and its
/// value mod 64 changes between runs (stack randomization), which made the
/// same kernel's speed differ by a third from run to run. The frame moves
/// down by at most 48 bytes, below the caller's stack pointer; the old rsp
/// waits at `[rsp + OLD_RSP]` for [`epilogue_framed`].
pub fn prologue_framed(a: &mut X86Asm, frame: i32) {
    for r in SAVED {
        a.push(r);
    }
    a.sub_imm(RSP, frame.max(FRAME));
    a.mov(RAX, RSP);
    a.and_imm(RSP, -64);
    a.store64(mem(RSP, OLD_RSP), RAX);
    for i in 0..16 {
        a.store32_imm(mem(RSP, MASK_TABLE + 4 * i), if i < 8 { -1 } else { 0 });
    }
}

/// `dst = min(dst, src)`, unsigned.
pub fn min_reg(a: &mut X86Asm, dst: Gp, src: Gp) {
    let done = a.new_label();
    a.cmp(dst, src);
    a.jcc(Cond::Be, done);
    a.mov(dst, src);
    a.bind(done);
}

/// `dst = min(dst, qword [m])`, signed.
pub fn min_mem(a: &mut X86Asm, dst: Gp, m: Mem) {
    let done = a.new_label();
    a.cmp_mem(dst, m);
    a.jcc(Cond::Le, done);
    a.load64(dst, m);
    a.bind(done);
}

/// Leave: clean upper ymm state, close the frame, restore, return.
pub fn epilogue(a: &mut X86Asm) {
    epilogue_framed(a, FRAME);
}

/// [`epilogue`] for a [`prologue_framed`] frame.
pub fn epilogue_framed(a: &mut X86Asm, frame: i32) {
    a.vzeroupper();
    a.load64(RSP, mem(RSP, OLD_RSP));
    a.add_imm(RSP, frame.max(FRAME));
    for r in SAVED.iter().rev() {
        a.pop(*r);
    }
    a.ret();
}

/// The GEMM loop nest's control, the same in every x86 kernel: K blocks
/// (r14 = first k, r15 = the block's length) → panels of hp columns (rbx
/// = panel) → row blocks (rbp = first row). Each head returns the label
/// its tail jumps back to.
pub mod nest {
    use super::*;
    use crate::abi::{MM_K, MM_N};

    /// r14 = 0, then per block r15 = min(k - r14, kc) (all of k without
    /// `kc`).
    pub fn k_blocks_head(a: &mut X86Asm, kc: Option<i32>) -> Label {
        let head = a.new_label();
        a.mov_imm(R14, 0);
        a.bind(head);
        a.load64(R15, mem(RDI, MM_K));
        if let Some(kc) = kc {
            a.sub(R15, R14);
            min_imm(a, R15, kc);
        }
        head
    }

    /// r14 += r15; again while r14 < k.
    pub fn k_blocks_tail(a: &mut X86Asm, head: Label) {
        a.add(R14, R15);
        a.cmp_mem(R14, mem(RDI, MM_K));
        a.jcc(Cond::L, head);
    }

    /// rbx = 0.
    pub fn panels_head(a: &mut X86Asm) -> Label {
        let head = a.new_label();
        a.mov_imm(RBX, 0);
        a.bind(head);
        head
    }

    /// rbx += 1; again while rbx·hp < n. Clobbers rax.
    pub fn panels_tail(a: &mut X86Asm, head: Label, hp: i32) {
        a.add_imm(RBX, 1);
        a.imul_imm(RAX, RBX, hp);
        a.cmp_mem(RAX, mem(RDI, MM_N));
        a.jcc(Cond::L, head);
    }

    /// rbp = 0.
    pub fn rows_head(a: &mut X86Asm) -> Label {
        let head = a.new_label();
        a.mov_imm(RBP, 0);
        a.bind(head);
        head
    }

    /// rbp += rows; again while rbp < m.
    pub fn rows_tail(a: &mut X86Asm, head: Label, rows: usize) {
        a.add_imm(RBP, rows as i32);
        a.cmp_mem(RBP, mem(RDI, MM_M));
        a.jcc(Cond::L, head);
    }
}

/// `r = min(r, max)` (signed).
pub fn min_imm(a: &mut X86Asm, r: Gp, max: i32) {
    let ok = a.new_label();
    a.cmp_imm(r, max);
    a.jcc(Cond::Le, ok);
    a.mov_imm(r, max);
    a.bind(ok);
}

/// The head of a loop over weight groups of `spg` k steps, the steps left
/// in `left`: to `done` when none are left, else rcx = this group's steps
/// and `left` -= rcx. Clobbers rax.
pub fn next_group(a: &mut X86Asm, left: Mem, spg: i32, done: Label) {
    a.load64(RAX, left);
    a.cmp_imm(RAX, 0);
    a.jcc(Cond::E, done);
    a.mov(RCX, RAX);
    min_imm(a, RCX, spg);
    a.sub(RAX, RCX);
    a.store64(left, RAX);
}

/// `dst = base + row·stride` with row = rbp + i, clamped to m - 1 when
/// `clamp` (XNNPACK's tail trick: missing rows alias the last one).
/// Clobbers rax, rdx.
pub fn row_ptr(a: &mut X86Asm, dst: Gp, i: usize, clamp: bool, base: i32, stride: i32) {
    a.mov(RAX, RBP);
    if i > 0 {
        a.add_imm(RAX, i as i32);
    }
    if clamp {
        let ok = a.new_label();
        a.load64(RDX, mem(RDI, MM_M));
        a.sub_imm(RDX, 1);
        a.cmp(RAX, RDX);
        a.jcc(Cond::Le, ok);
        a.mov(RAX, RDX);
        a.bind(ok);
    }
    row_address(a, RAX, RAX, RDX, mem(RDI, stride), mem(RDI, base));
    a.mov(dst, RAX);
}

/// `dst = [base] + row·[stride]` (a row of a row-major operand whose base
/// pointer and byte stride are argument fields); clobbers `tmp`.
pub fn row_address(a: &mut X86Asm, dst: Gp, row: Gp, tmp: Gp, stride: Mem, base: Mem) {
    if dst != row {
        a.mov(dst, row);
    }
    a.load64(tmp, stride);
    a.imul(dst, tmp);
    a.load64(tmp, base);
    a.add(dst, tmp);
}

/// MASK = lanes of column block `j` that are valid, given `valid` (rcx)
/// columns in the panel; leaves rdx = 8 - (valid lanes of block j).
/// Clobbers rax.
pub fn column_mask(a: &mut X86Asm, j: usize, valid: Gp) {
    let (lo, hi) = (a.new_label(), a.new_label());
    a.mov_imm(RDX, 8 + 8 * j as i32);
    a.sub(RDX, valid);
    a.cmp_imm(RDX, 0);
    a.jcc(Cond::Ge, lo);
    a.mov_imm(RDX, 0);
    a.bind(lo);
    a.cmp_imm(RDX, 8);
    a.jcc(Cond::Le, hi);
    a.mov_imm(RDX, 8);
    a.bind(hi);
    a.mov(RAX, RDX);
    a.shl_imm(RAX, 2);
    a.add(RAX, RSP);
    a.vmovups_load(MASK, mem(RAX, MASK_TABLE));
}

/// How the epilogue treats the accumulators.
#[derive(Clone, Copy, Debug)]
pub struct Store<V> {
    pub rows: usize,
    pub hb: usize,
    pub y: Format,
    /// Add bias (rsi points at the panel's first bias) and apply the
    /// activation; false for a partial K block.
    pub finalize: bool,
    pub bias: bool,
    pub activation: Activation,
    /// Skip rows ≥ m (kernels whose missing rows are not aliases).
    pub row_check: bool,
    /// Temporary for the masked bias (never an accumulator, never the
    /// register file's tail mask or zero).
    pub tmp: V,
}

/// Store an accumulator tile, on either register file. Expects: y row
/// pointers in `yrow(i)` (already at the panel's first column), rcx =
/// valid columns of the panel, rsi = bias pointer (when finalizing with
/// bias). Clobbers rax, rdx and the accumulators.
pub fn store_tile<V: RegisterFile>(
    a: &mut X86Asm,
    s: &Store<V>,
    acc: impl Fn(usize, usize) -> V,
    yrow: impl Fn(usize) -> Gp,
) {
    let hp = (V::LANES * s.hb) as i32;
    let y_bytes = |j: usize| (V::LANES * j) as i32 * if s.y == Format::F16 { 2 } else { 4 };
    let bias = s.finalize && s.bias;
    let relu = s.finalize && s.activation == Activation::Relu;
    if relu {
        V::relu_setup(a);
    }
    let (tail, done) = (a.new_label(), a.new_label());
    a.cmp_imm(RCX, hp);
    a.jcc(Cond::L, tail);
    for i in 0..s.rows {
        if s.row_check {
            row_guard(a, i, done);
        }
        for j in 0..s.hb {
            let r = acc(i, j);
            if bias {
                V::add_mem(a, r, r, mem(RSI, V::BYTES * j as i32));
            }
            if relu {
                V::relu(a, r);
            }
            V::store(a, s.y, mem(yrow(i), y_bytes(j)), r);
        }
    }
    a.jmp(done);
    a.bind(tail);
    for j in 0..s.hb {
        V::tail_mask(a, j, done);
        if bias {
            V::masked_load(a, s.tmp, mem(RSI, V::BYTES * j as i32));
        }
        let next = V::ROW_GUARD_LABELS.then(|| a.new_label());
        for i in 0..s.rows {
            if s.row_check {
                let next = next.expect("row guards need the file's per-block labels");
                row_guard(a, i, next);
            }
            let r = acc(i, j);
            if bias {
                V::add(a, r, r, s.tmp);
            }
            if relu {
                V::relu(a, r);
            }
            V::masked_store(a, s.y, mem(yrow(i), y_bytes(j)), r);
        }
        if let Some(next) = next {
            a.bind(next);
        }
    }
    a.bind(done);
}

/// Jump to `skip` when row rbp + i is past m. Clobbers rax.
fn row_guard(a: &mut X86Asm, i: usize, skip: Label) {
    a.mov(RAX, RBP);
    if i > 0 {
        a.add_imm(RAX, i as i32);
    }
    a.cmp_mem(RAX, mem(RDI, MM_M));
    a.jcc(Cond::Ge, skip);
}
