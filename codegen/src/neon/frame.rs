//! What every NEON kernel shares: the AAPCS64 prologue/epilogue (x19..x28
//! and d8..d15 are callee-saved; the kernels use all 32 vector registers)
//! and the tile store, which adds the bias and writes only the valid rows
//! and columns of a tile, so tails in e and h never touch memory outside y.

use super::asm::{A64, Cond, V, X};

/// Save the callee-saved registers and reserve `frame` bytes (a multiple
/// of 16) of stack; `sp` then points at the frame.
pub fn prologue(a: &mut A64, frame: u32) {
    for p in [19u8, 21, 23, 25, 27] {
        a.push_pair(X(p), X(p + 1));
    }
    for p in [8u8, 10, 12, 14] {
        a.push_pair_d(V(p), V(p + 1));
    }
    a.sub_sp(frame);
}

/// Undo [`prologue`] and return.
pub fn epilogue(a: &mut A64, frame: u32) {
    a.add_sp(frame);
    for p in [14u8, 12, 10, 8] {
        a.pop_pair_d(V(p), V(p + 1));
    }
    for p in [27u8, 25, 23, 21, 19] {
        a.pop_pair(X(p), X(p + 1));
    }
    a.ret();
}

/// Registers [`store_tile`] may clobber.
pub struct StoreRegs {
    /// Row counter, source, destination row, bias cursor, column counter.
    pub gp: [X; 5],
    pub v: [V; 2],
}

/// Output element type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutType {
    F32,
    F16,
}

/// Copy a tile of final f32 values from `stage` (row-major, `row_bytes`
/// apart, `hp` valid columns at most) to y, adding the f32 bias: rows
/// `0..rows` (a register) to `y_row`, `y_stride` bytes apart, columns
/// `0..cols` (a register). A full-width tile stores with vectors; a
/// column tail goes element by element. `bias` points at the tile's first
/// column (a zero area when the kernel has no bias). `relu` clamps the
/// sum at 0 with `fmaxnm` (a NaN sum becomes 0, like `f32::max`, the
/// interpreter's relu); the tile is stored once, after the whole of k.
#[allow(clippy::too_many_arguments)]
pub fn store_tile(
    a: &mut A64,
    stage: X,
    row_bytes: u32,
    hp: u32,
    rows: X,
    cols: X,
    y_row: X,
    y_stride: X,
    bias: X,
    out: OutType,
    relu: bool,
    r: &StoreRegs,
) {
    let [cnt, src, dst, bp, col] = r.gp;
    let [t0, t1] = r.v;
    let esz = match out {
        OutType::F32 => 4,
        OutType::F16 => 2,
    };
    a.comment(if relu {
        "store the tile: y = max(acc + bias, 0), valid rows and columns only"
    } else {
        "store the tile: y = acc + bias, valid rows and columns only"
    });
    a.mov(cnt, rows);
    a.mov(src, stage);
    a.mov(dst, y_row);
    let row_loop = a.new_label();
    let partial = a.new_label();
    let next_row = a.new_label();
    let done = a.new_label();
    a.cbz(cnt, done);
    a.bind(row_loop);
    a.mov(bp, bias);
    a.mov_imm(col, u64::from(hp));
    a.cmp(cols, col);
    a.b_cond(Cond::Ne, partial);
    // Full width: whole vectors, then the hp % 4 remainder.
    let full = hp / 4;
    for c in 0..full {
        a.ldr_q(t0, src, 16 * c);
        a.ldr_q(t1, bp, 16 * c);
        a.fadd_4s(t0, t0, t1);
        if relu {
            a.zero(t1);
            a.fmaxnm_4s(t0, t0, t1);
        }
        match out {
            OutType::F32 => a.str_q(t0, dst, 16 * c),
            OutType::F16 => {
                a.fcvtn_4h(t0, t0);
                a.str_d(t0, dst, 8 * c);
            }
        }
    }
    for c in full * 4..hp {
        a.ldr_s(t0, src, 4 * c);
        a.ldr_s(t1, bp, 4 * c);
        a.fadd_s(t0, t0, t1);
        if relu {
            a.zero(t1);
            a.fmaxnm_s(t0, t0, t1);
        }
        match out {
            OutType::F32 => a.str_s(t0, dst, 4 * c),
            OutType::F16 => {
                a.fcvt_h_s(t0, t0);
                a.add_imm(col, dst, esz * c);
                a.str_h_post(t0, col, 2);
            }
        }
    }
    a.b(next_row);
    // Column tail: element by element.
    a.bind(partial);
    a.mov(col, cols);
    a.push_pair(src, dst);
    let elem = a.new_label();
    let elems_done = a.new_label();
    a.cbz(col, elems_done);
    a.bind(elem);
    a.ldr_s_post(t0, src, 4);
    a.ldr_s_post(t1, bp, 4);
    a.fadd_s(t0, t0, t1);
    if relu {
        a.zero(t1);
        a.fmaxnm_s(t0, t0, t1);
    }
    match out {
        OutType::F32 => a.str_s_post(t0, dst, 4),
        OutType::F16 => {
            a.fcvt_h_s(t0, t0);
            a.str_h_post(t0, dst, 2);
        }
    }
    a.subs_imm(col, col, 1);
    a.b_cond(Cond::Ne, elem);
    a.bind(elems_done);
    a.pop_pair(src, dst);
    a.bind(next_row);
    a.add_imm(src, src, row_bytes);
    a.add(dst, dst, y_stride);
    a.subs_imm(cnt, cnt, 1);
    a.b_cond(Cond::Ne, row_loop);
    a.bind(done);
}
