//! The float matmul micro-kernels: `fmla .4s` (f32, and f16 widened with
//! `fcvtl` on cores without FP16 arithmetic) and `fmla .8h` (f16).
//!
//! x stays row-major (packing it would cost a pass per call), so the A
//! register of a step is gathered lane by lane, one `ld1 {v.s}[i]` (or
//! `.h`) per row from a pointer per row: rows past m in a tail block alias
//! the last valid row (XNNPACK's clamp), so nothing past x is read and
//! their results are never stored. Weights are `[h/hp, l, hp]` (lp = 1).
//! The GEMV variant (ep = 1) loads 4 (`.4s`) or 8 (`.8h`) consecutive x
//! values with one load and walks their lanes.
//!
//! The flat-GEMM variant ([`FlatPlan`]) runs panel → pass → K block →
//! row block → step with the partial sums staged per row block (see
//! [`FlatPlan`]); its gather loads lane 0 with a scalar `ldr`, so one step's
//! lane inserts do not wait on the previous step's.
//!
//! Register plan at the `fmla .4s` optimum 8×12×1: A v0-v1 (rows 0-3,
//! 4-7, one l), B v2-v4 (12 columns), v5 mask (unused here), v6 staging,
//! accumulators v8-v31 (row r, columns 4j..4j+3 in v(8 + 3r + j)).

use super::asm::{A64, Addr, Cond, Label, V, X};
use super::frame::{self, OutType, StoreRegs};
use super::{FlatPlan, RegisterPlan, unrolled_steps};
use crate::abi::{MM_BIAS, MM_K, MM_M, MM_N, MM_N0, MM_W, MM_X, MM_X_STRIDE, MM_Y, MM_Y_STRIDE};

/// Element type of an operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Elem {
    F32,
    F16,
}

impl Elem {
    pub fn bytes(self) -> u32 {
        match self {
            Elem::F32 => 4,
            Elem::F16 => 2,
        }
    }
}

/// What one float kernel instance computes.
#[derive(Clone, Copy, Debug)]
pub struct FloatSpec {
    /// `fmla .8h` (f16 accumulators) instead of `fmla .4s`.
    pub fp16_mac: bool,
    pub ep: u32,
    pub hp: u32,
    pub x: Elem,
    pub w: Elem,
    pub out: OutType,
    pub gemv: bool,
    /// The flat-GEMM nest and its numbers (None: the GEMM/GEMV nest).
    pub flat: Option<FlatPlan>,
    /// The epilogue's relu (in the tile store).
    pub relu: bool,
}

/// Row pointers: x1..x15 (so ep ≤ 15 on this path).
pub const MAX_ROWS: u32 = 15;

const ARGS: X = X(0);
const WP: X = X(16);
const CNT: X = X(17);
const WPANEL: X = X(19);
const NREM: X = X(20);
const COLS: X = X(21);
const R0: X = X(22);
const YCOL: X = X(23);
const BIAS: X = X(24);
const XBASE: X = X(25);
const XSTRIDE: X = X(26);
const YSTRIDE: X = X(27);
const STAGE: X = X(28);
const T0: X = X(29);
const T1: X = X(30);

const SLOT_WBYTES: u32 = 0;
const SLOT_BIASSTEP: u32 = 8;
/// Flat nest: first row of the current pass.
const SLOT_R0S: u32 = 16;
/// Flat nest: first l of the current K block.
const SLOT_KB0: u32 = 24;
/// Flat nest: the first row block's staged partial sums.
const SLOT_SCR0: u32 = 32;
/// Stack slots of the GEMM/GEMV nest and of the flat nest.
const SLOTS: u32 = 32;
const FLAT_SLOTS: u32 = 48;

fn row_ptr(i: u32) -> X {
    X(1 + i as u8)
}

/// Emit the kernel; `plan` gives A, B and accumulator registers.
pub fn emit(a: &mut A64, spec: &FloatSpec, plan: &RegisterPlan) {
    let (ep, hp) = (spec.ep, spec.hp);
    let hp4 = hp.div_ceil(4) * 4;
    let row_bytes = hp4 * 4;
    let stage_off = if spec.flat.is_some() {
        FLAT_SLOTS
    } else {
        SLOTS
    };
    let blocks = spec.flat.map_or(1, |f| f.blocks);
    let zeros_off = stage_off + blocks * ep * row_bytes;
    let frame_bytes = (zeros_off + row_bytes).div_ceil(16) * 16;
    // Saving x29/x30 too: they are scratch here.
    a.push_pair(X(29), X(30));
    frame::prologue(a, frame_bytes);
    let we = spec.w.bytes();

    a.comment("per-call constants");
    a.ldr_x(NREM, ARGS, MM_N as u32);
    a.ldr_x(XSTRIDE, ARGS, MM_X_STRIDE as u32);
    a.ldr_x(YSTRIDE, ARGS, MM_Y_STRIDE as u32);
    a.ldr_x(T0, ARGS, MM_K as u32);
    a.mov_imm(T1, u64::from(hp * we));
    a.mul(T0, T0, T1);
    a.str_x_sp(T0, SLOT_WBYTES);
    a.ldr_x(T1, ARGS, MM_N0 as u32);
    a.mov_imm(CNT, u64::from(hp));
    a.udiv(CNT, T1, CNT);
    a.ldr_x(WPANEL, ARGS, MM_W as u32);
    a.madd(WPANEL, CNT, T0, WPANEL);
    let oe = match spec.out {
        OutType::F32 => 2,
        OutType::F16 => 1,
    };
    a.ldr_x(YCOL, ARGS, MM_Y as u32);
    a.add_lsl(YCOL, YCOL, T1, oe);
    a.add_from_sp(STAGE, zeros_off);
    a.ldr_x(BIAS, ARGS, MM_BIAS as u32);
    a.add_lsl(BIAS, BIAS, T1, 2);
    a.ldr_x(T0, ARGS, MM_BIAS as u32);
    a.cmp_imm(T0, 0);
    a.csel(BIAS, BIAS, STAGE, Cond::Ne);
    a.mov_imm(T1, u64::from(hp * 4));
    a.csel(T1, T1, X(31), Cond::Ne);
    a.str_x_sp(T1, SLOT_BIASSTEP);
    let z = V(0);
    a.zero(z);
    for off in (0..row_bytes).step_by(16) {
        a.str_q(z, STAGE, off);
    }
    a.add_from_sp(STAGE, stage_off);

    match &spec.flat {
        Some(f) => flat_nest(a, spec, plan, f, row_bytes),
        None => gemm_nest(a, spec, plan, row_bytes),
    }
    a.add_sp(frame_bytes);
    for p in [14u8, 12, 10, 8] {
        a.pop_pair_d(V(p), V(p + 1));
    }
    for p in [27u8, 25, 23, 21, 19] {
        a.pop_pair(X(p), X(p + 1));
    }
    a.pop_pair(X(29), X(30));
    a.ret();
}

/// panel → row block → all of k (the GEMM and GEMV variants).
fn gemm_nest(a: &mut A64, spec: &FloatSpec, plan: &RegisterPlan, row_bytes: u32) {
    let (ep, hp) = (spec.ep, spec.hp);
    let lanes = if spec.fp16_mac { 8 } else { 4 };
    let jn = hp / lanes;
    let panel_loop = a.new_label();
    let panel_done = a.new_label();
    a.cbz(NREM, panel_done);
    a.bind(panel_loop);
    a.comment("panel: hp output channels");
    a.mov_imm(T1, u64::from(hp));
    a.cmp(NREM, T1);
    a.csel(COLS, NREM, T1, Cond::Lo);
    a.mov_imm(R0, 0);
    a.ldr_x(XBASE, ARGS, MM_X as u32);
    let row_loop = a.new_label();
    let rows_done = a.new_label();
    a.ldr_x(T0, ARGS, MM_M as u32);
    a.cbz(T0, rows_done);
    a.bind(row_loop);
    a.comment("row block: one pointer per row, tail rows alias the last valid one");
    a.ldr_x(T0, ARGS, MM_M as u32);
    a.sub(T0, T0, R0);
    a.mov(row_ptr(0), XBASE);
    for i in 1..ep {
        a.add(T1, row_ptr(i - 1), XSTRIDE);
        a.cmp_imm(T0, i);
        a.csel(row_ptr(i), T1, row_ptr(i - 1), Cond::Hi);
    }
    a.mov(WP, WPANEL);
    for r in plan.acc.clone() {
        a.zero(V(r));
    }
    a.ldr_x(CNT, ARGS, MM_K as u32);
    k_loop(a, spec, plan, lanes, jn);

    a.comment("tile epilogue: accumulators to the staging rows");
    for r in 0..ep {
        for j in 0..jn {
            let acc = plan.acc_reg(r * jn + j);
            if spec.fp16_mac {
                let t = V(0);
                a.fcvtl_4s(t, acc);
                a.str_q(t, STAGE, r * row_bytes + 32 * j);
                a.fcvtl2_4s(t, acc);
                a.str_q(t, STAGE, r * row_bytes + 32 * j + 16);
            } else {
                a.str_q(acc, STAGE, r * row_bytes + 16 * j);
            }
        }
    }
    let rows = X(6);
    let y_row = X(7);
    a.ldr_x(rows, ARGS, MM_M as u32);
    a.sub(rows, rows, R0);
    a.mov_imm(T0, u64::from(ep));
    a.cmp(rows, T0);
    a.csel(rows, rows, T0, Cond::Lo);
    a.madd(y_row, R0, YSTRIDE, YCOL);
    let regs = StoreRegs {
        gp: [X(1), X(2), X(3), X(4), X(5)],
        v: [V(0), V(1)],
    };
    frame::store_tile(
        a, STAGE, row_bytes, hp, rows, COLS, y_row, YSTRIDE, BIAS, spec.out, spec.relu, &regs,
    );
    a.mov_imm(T0, u64::from(ep));
    a.madd(XBASE, T0, XSTRIDE, XBASE);
    a.add_imm(R0, R0, ep);
    a.ldr_x(T0, ARGS, MM_M as u32);
    a.cmp(R0, T0);
    a.b_cond(Cond::Lo, row_loop);
    a.bind(rows_done);

    a.ldr_x_sp(T0, SLOT_WBYTES);
    a.add(WPANEL, WPANEL, T0);
    let oesz = match spec.out {
        OutType::F32 => 4,
        OutType::F16 => 2,
    };
    a.add_imm(YCOL, YCOL, hp * oesz);
    a.ldr_x_sp(T0, SLOT_BIASSTEP);
    a.add(BIAS, BIAS, T0);
    a.sub(NREM, NREM, COLS);
    a.cbnz(NREM, panel_loop);
    a.bind(panel_done);
}

/// rows = min(ep, m - R0) in x6, the y row in x7, then the store of the
/// staged tile at STAGE.
fn store_row_block(a: &mut A64, spec: &FloatSpec, row_bytes: u32) {
    let rows = X(6);
    let y_row = X(7);
    a.ldr_x(rows, ARGS, MM_M as u32);
    a.sub(rows, rows, R0);
    a.mov_imm(T0, u64::from(spec.ep));
    a.cmp(rows, T0);
    a.csel(rows, rows, T0, Cond::Lo);
    a.madd(y_row, R0, YSTRIDE, YCOL);
    let regs = StoreRegs {
        gp: [X(1), X(2), X(3), X(4), X(5)],
        v: [V(0), V(1)],
    };
    frame::store_tile(
        a, STAGE, row_bytes, spec.hp, rows, COLS, y_row, YSTRIDE, BIAS, spec.out, spec.relu, &regs,
    );
}

/// Row pointers x1.. for the row block at R0, from XBASE; rows past m
/// alias the last valid one.
fn row_pointers(a: &mut A64, ep: u32) {
    a.ldr_x(T0, ARGS, MM_M as u32);
    a.sub(T0, T0, R0);
    a.mov(row_ptr(0), XBASE);
    for i in 1..ep {
        a.add(T1, row_ptr(i - 1), XSTRIDE);
        a.cmp_imm(T0, i);
        a.csel(row_ptr(i), T1, row_ptr(i - 1), Cond::Hi);
    }
}

/// Branch to `top` while R0 < m and R0 is inside the pass; clobbers T0, T1.
fn next_row_block(a: &mut A64, pass_rows: u32, top: Label) {
    let out = a.new_label();
    a.ldr_x(T0, ARGS, MM_M as u32);
    a.cmp(R0, T0);
    a.b_cond(Cond::Hs, out);
    a.ldr_x_sp(T0, SLOT_R0S);
    a.add_imm(T0, T0, pass_rows);
    a.cmp(R0, T0);
    a.b_cond(Cond::Lo, top);
    a.bind(out);
}

/// STAGE = the staged partial sums of the row block at R0: SCR0 + (R0 -
/// R0S)·row_bytes (ep rows per block).
fn row_block_stage(a: &mut A64, row_bytes: u32) {
    a.ldr_x_sp(T0, SLOT_R0S);
    a.sub(T0, R0, T0);
    a.mov_imm(T1, u64::from(row_bytes));
    a.ldr_x_sp(STAGE, SLOT_SCR0);
    a.madd(STAGE, T0, T1, STAGE);
}

/// The flat-GEMM nest ([`FlatPlan`]): panel → pass → K block → row block →
/// step; each row block's f32 partial sums are staged rows on the stack,
/// which the store then reads directly.
fn flat_nest(a: &mut A64, spec: &FloatSpec, plan: &RegisterPlan, f: &FlatPlan, row_bytes: u32) {
    let (ep, hp) = (spec.ep, spec.hp);
    let we = spec.w.bytes();
    let xe = spec.x.bytes();
    let pass_rows = f.pass_rows();
    a.str_x_sp(STAGE, SLOT_SCR0);
    let panel_loop = a.new_label();
    let panel_done = a.new_label();
    let panel_next = a.new_label();
    a.cbz(NREM, panel_done);
    a.bind(panel_loop);
    a.comment("panel: hp output channels");
    a.mov_imm(T1, u64::from(hp));
    a.cmp(NREM, T1);
    a.csel(COLS, NREM, T1, Cond::Lo);
    a.mov_imm(R0, 0);
    a.str_x_sp(R0, SLOT_R0S);
    a.ldr_x(T0, ARGS, MM_M as u32);
    a.cbz(T0, panel_next);

    let pass_loop = a.new_label();
    a.bind(pass_loop);
    a.comment(&format!(
        "pass: up to {pass_rows} rows share every weight byte read from memory"
    ));
    let z = V(0);
    a.zero(z);
    a.ldr_x_sp(T0, SLOT_SCR0);
    a.mov_imm(T1, u64::from(f.blocks * ep * row_bytes / 16));
    let zero_loop = a.new_label();
    a.bind(zero_loop);
    a.str_q_post(z, T0, 16);
    a.subs_imm(T1, T1, 1);
    a.b_cond(Cond::Ne, zero_loop);
    a.mov_imm(T0, 0);
    a.str_x_sp(T0, SLOT_KB0);

    let kblock_loop = a.new_label();
    a.bind(kblock_loop);
    a.comment("K block: the first row block streams it, the others find it in L1");
    a.ldr_x_sp(R0, SLOT_R0S);
    let row_loop = a.new_label();
    a.bind(row_loop);
    a.comment("row block: ep rows, accumulators in registers");
    // XBASE = x + R0·x_stride + KB0·elem; WP = WPANEL + KB0·hp·elem.
    a.ldr_x(XBASE, ARGS, MM_X as u32);
    a.madd(XBASE, R0, XSTRIDE, XBASE);
    a.ldr_x_sp(T1, SLOT_KB0);
    a.add_lsl(XBASE, XBASE, T1, xe.trailing_zeros());
    a.mov_imm(T0, u64::from(hp * we));
    a.madd(WP, T1, T0, WPANEL);
    // CNT = min(k - KB0, K block).
    a.ldr_x(CNT, ARGS, MM_K as u32);
    a.sub(CNT, CNT, T1);
    if let Some(kb) = f.k_block_steps {
        a.mov_imm(T0, u64::from(kb));
        a.cmp(CNT, T0);
        a.csel(CNT, CNT, T0, Cond::Lo);
    }
    row_pointers(a, ep);
    for r in plan.acc.clone() {
        a.zero(V(r));
    }
    // The last row block may hold fewer rows: the smallest row count
    // that covers them (see FlatPlan::row_counts).
    let counts = f.row_counts();
    let joined = a.new_label();
    let labels: Vec<Label> = counts.iter().map(|_| a.new_label()).collect();
    if counts.len() > 1 {
        a.ldr_x(T0, ARGS, MM_M as u32);
        a.sub(T0, T0, R0);
        for (&c, &l) in counts.iter().zip(&labels).take(counts.len() - 1) {
            a.cmp_imm(T0, c);
            a.b_cond(Cond::Ls, l);
        }
        a.b(labels[counts.len() - 1]);
    }
    for (i, (&c, &l)) in counts.iter().zip(&labels).enumerate() {
        a.bind(l);
        a.comment(&format!("{c} row(s)"));
        let rows = FloatSpec { ep: c, ..*spec };
        flat_rows(a, &rows, plan, f, row_bytes);
        if i + 1 < counts.len() {
            a.b(joined);
        }
    }
    a.bind(joined);
    a.add_imm(R0, R0, ep);
    next_row_block(a, pass_rows, row_loop);
    if let Some(kb) = f.k_block_steps {
        a.ldr_x_sp(T0, SLOT_KB0);
        a.add_imm(T0, T0, kb);
        a.str_x_sp(T0, SLOT_KB0);
        a.ldr_x(T1, ARGS, MM_K as u32);
        a.cmp(T0, T1);
        a.b_cond(Cond::Lo, kblock_loop);
    }

    a.comment("the pass's tile stores");
    a.ldr_x_sp(R0, SLOT_R0S);
    let store_loop = a.new_label();
    a.bind(store_loop);
    row_block_stage(a, row_bytes);
    store_row_block(a, spec, row_bytes);
    a.add_imm(R0, R0, ep);
    next_row_block(a, pass_rows, store_loop);
    a.ldr_x_sp(T0, SLOT_R0S);
    a.add_imm(T0, T0, pass_rows);
    a.str_x_sp(T0, SLOT_R0S);
    a.ldr_x(T1, ARGS, MM_M as u32);
    a.cmp(T0, T1);
    a.b_cond(Cond::Lo, pass_loop);

    a.bind(panel_next);
    a.ldr_x_sp(T0, SLOT_WBYTES);
    a.add(WPANEL, WPANEL, T0);
    let oesz = match spec.out {
        OutType::F32 => 4,
        OutType::F16 => 2,
    };
    a.add_imm(YCOL, YCOL, hp * oesz);
    a.ldr_x_sp(T0, SLOT_BIASSTEP);
    a.add(BIAS, BIAS, T0);
    a.sub(NREM, NREM, COLS);
    a.cbnz(NREM, panel_loop);
    a.bind(panel_done);
}

/// The K block of the first `spec.ep` rows of a row block: the flat loop,
/// then the accumulators into the row block's staged partial sums.
fn flat_rows(a: &mut A64, spec: &FloatSpec, plan: &RegisterPlan, f: &FlatPlan, row_bytes: u32) {
    let lanes = if spec.fp16_mac { 8 } else { 4 };
    let jn = spec.hp / lanes;
    let ep = spec.ep;
    flat_k_loop(a, spec, plan, f, lanes, jn);
    let sets = f.sets(ep);
    if sets > 1 {
        a.comment(&format!("fold {sets} accumulator sets"));
        let per_set = ep * jn;
        for k in 1..sets {
            for i in 0..per_set {
                let (d, s) = (plan.acc_reg(i), plan.acc_reg(k * per_set + i));
                if spec.fp16_mac {
                    a.fadd_8h(d, d, s);
                } else {
                    a.fadd_4s(d, d, s);
                }
            }
        }
    }
    a.comment("K block done: accumulators into the row block's partial sums");
    row_block_stage(a, row_bytes);
    let (t, p) = (V(0), V(1));
    for r in 0..ep {
        for j in 0..jn {
            let acc = plan.acc_reg(r * jn + j);
            if spec.fp16_mac {
                for (half, off) in [(false, 32 * j), (true, 32 * j + 16)] {
                    if half {
                        a.fcvtl2_4s(t, acc);
                    } else {
                        a.fcvtl_4s(t, acc);
                    }
                    a.ldr_q(p, STAGE, r * row_bytes + off);
                    a.fadd_4s(p, p, t);
                    a.str_q(p, STAGE, r * row_bytes + off);
                }
            } else {
                a.ldr_q(p, STAGE, r * row_bytes + 16 * j);
                a.fadd_4s(p, p, acc);
                a.str_q(p, STAGE, r * row_bytes + 16 * j);
            }
        }
    }
}

/// The flat loop over CNT steps: `unroll` steps per iteration behind one
/// prefetch pair, then single steps.
fn flat_k_loop(
    a: &mut A64,
    spec: &FloatSpec,
    plan: &RegisterPlan,
    f: &FlatPlan,
    lanes: u32,
    jn: u32,
) {
    let u = f.unroll_for(spec.ep);
    let sets = f.sets(spec.ep);
    let set = |k: u32| plan.shifted_acc(k * spec.ep * jn);
    let done = a.new_label();
    // B at offsets from WP, bumped once per iteration (ldr q needs
    // 16-byte aligned offsets, ldp reaches 1008).
    let offsets = f.step_bytes.is_multiple_of(16) && u * f.step_bytes <= 1008;
    unrolled_steps(
        a,
        CNT,
        done,
        u,
        &|a| {
            a.comment(&format!("steady state (flat): {u} l-step(s), prefetch"));
            f.prefetch(a, WP);
            for s in 0..u {
                gather_a(a, spec, plan, lanes, true);
                if offsets {
                    load_b_at(a, spec, plan, &mut Addr::Offset(s * f.step_bytes));
                } else {
                    load_b(a, spec, plan);
                }
                macs(a, spec, &set(s % sets), lanes, jn, None);
            }
            if offsets {
                a.add_imm(WP, WP, u * f.step_bytes);
            }
        },
        &|a| {
            gather_a(a, spec, plan, lanes, true);
            load_b(a, spec, plan);
            macs(a, spec, plan, lanes, jn, None);
        },
    );
    a.bind(done);
}

/// Load the hp weights of one l into B (widening f16 for `.4s`).
fn load_b(a: &mut A64, spec: &FloatSpec, plan: &RegisterPlan) {
    load_b_at(a, spec, plan, &mut Addr::Post);
}

/// [`load_b`] at `at`.
fn load_b_at(a: &mut A64, spec: &FloatSpec, plan: &RegisterPlan, at: &mut Addr) {
    let b: Vec<V> = plan.b.clone().map(V).collect();
    let n = b.len();
    if spec.fp16_mac || spec.w == Elem::F32 {
        let mut j = 0;
        while j + 1 < n {
            a.ldp_q_at(b[j], b[j + 1], WP, at);
            j += 2;
        }
        if j < n {
            a.ldr_q_at(b[j], WP, at);
        }
        return;
    }
    // f16 weights widened: 8 halves per load → two registers.
    let mut j = 0;
    while j + 1 < n {
        a.ldr_q_at(b[j + 1], WP, at);
        a.fcvtl_4s(b[j], b[j + 1]);
        a.fcvtl2_4s(b[j + 1], b[j + 1]);
        j += 2;
    }
    if j < n {
        a.ldr_d_at(b[j], WP, at);
        a.fcvtl_4s(b[j], b[j]);
    }
}

/// Gather one l of every row into the A registers.
fn load_a(a: &mut A64, spec: &FloatSpec, plan: &RegisterPlan, lanes: u32) {
    gather_a(a, spec, plan, lanes, false);
}

/// The gather of [`load_a`]; with `fresh`, lane 0 of each A register is a
/// scalar `ldr` (which zeroes the other lanes), so the lane inserts of one
/// step do not wait on the previous step's: without it the inserts form a
/// loop-carried chain (llvm-mca, Cortex-A76: ~30 cycles per step at 8×12).
fn gather_a(a: &mut A64, spec: &FloatSpec, plan: &RegisterPlan, lanes: u32, fresh: bool) {
    for r in 0..spec.ep {
        let areg = V(plan.a.start + (r / lanes) as u8);
        let lane = r % lanes;
        match (spec.x, fresh && lane == 0) {
            (Elem::F32, true) => a.ldr_s_post(areg, row_ptr(r), 4),
            (Elem::F16, true) => a.ldr_h_post(areg, row_ptr(r), 2),
            (Elem::F32, false) => a.ld1_s_lane_post4(areg, lane, row_ptr(r)),
            (Elem::F16, false) => a.ld1_h_lane_post2(areg, lane, row_ptr(r)),
        }
    }
    if spec.x == Elem::F16 && !spec.fp16_mac {
        for i in plan.a.clone() {
            a.fcvtl_4s(V(i), V(i));
        }
    }
}

fn macs(
    a: &mut A64,
    spec: &FloatSpec,
    plan: &RegisterPlan,
    lanes: u32,
    jn: u32,
    gemv_lane: Option<u32>,
) {
    for r in 0..spec.ep {
        let (areg, lane) = match gemv_lane {
            Some(l) => (V(plan.a.start), l),
            None => (V(plan.a.start + (r / lanes) as u8), r % lanes),
        };
        for j in 0..jn {
            let acc = plan.acc_reg(r * jn + j);
            let b = V(plan.b.start + j as u8);
            if spec.fp16_mac {
                a.fmla_8h_elem(acc, b, areg, lane);
            } else {
                a.fmla_4s_elem(acc, b, areg, lane);
            }
        }
    }
}

fn k_loop(a: &mut A64, spec: &FloatSpec, plan: &RegisterPlan, lanes: u32, jn: u32) {
    let done = a.new_label();
    let single = a.new_label();
    if spec.gemv && spec.ep == 1 {
        let multi = a.new_label();
        a.cmp_imm(CNT, lanes);
        a.b_cond(Cond::Lo, single);
        a.bind(multi);
        a.comment("steady state (gemv): one x load serves several l");
        let areg = V(plan.a.start);
        match (spec.x, spec.fp16_mac) {
            (Elem::F32, _) => a.ldr_q_post(areg, row_ptr(0), 16),
            (Elem::F16, true) => a.ldr_q_post(areg, row_ptr(0), 16),
            (Elem::F16, false) => {
                a.ldr_d_post(areg, row_ptr(0), 8);
                a.fcvtl_4s(areg, areg);
            }
        }
        for lane in 0..lanes {
            load_b(a, spec, plan);
            macs(a, spec, plan, lanes, jn, Some(lane));
        }
        a.sub_imm(CNT, CNT, lanes);
        a.cmp_imm(CNT, lanes);
        a.b_cond(Cond::Hs, multi);
    }
    a.bind(single);
    a.cbz(CNT, done);
    let top = a.new_label();
    a.bind(top);
    a.comment("steady state: one l");
    load_a(a, spec, plan, lanes);
    load_b(a, spec, plan);
    macs(a, spec, plan, lanes, jn, None);
    a.subs_imm(CNT, CNT, 1);
    a.b_cond(Cond::Ne, top);
    a.bind(done);
}
