//! The AVX-512 f32 matmul (f32 x, f32 w, f32 y): the AVX2 float kernel's
//! loop nest ([`super::float`]) on zmm registers, for the `x86-avx512`
//! target's f32 tiles. OpenBLAS runs its SkylakeX zmm kernels on such
//! CPUs, where a ymm kernel is capped at half the FMA peak.
//!
//! Same ABI ([`crate::abi::MatmulArgs`]) and weight layout `[h/hp, l, hp]`
//! as the AVX2 kernel, so the host packers and the runtime are unchanged;
//! hp is a multiple of 16 (hb = hp/16 zmm per k step).
//!
//! # Register plan
//!
//! Multi-row loops (ep rows, the solver's tile; acc(s,i,j) = set s, row i,
//! column block j). S = 2 accumulator sets take alternate k steps when a
//! second set fits ([`gemm_sets`]).
//!
//! | zmm | holds |
//! |---|---|
//! | 0 .. S·ep·hb | accumulators acc(s,i,j) = zmm(s·ep·hb + i·hb + j) |
//! | then 1 | A: the current row's x[k] (`vbroadcastss` from memory), renamed per row |
//! | then hb | B: the panel's hp weights of step k |
//! | 30 | epilogue: bias under the n-tail mask (ep·hb ≤ 30, so never an accumulator of set 0) |
//! | 31 | epilogue: zero (relu) |
//!
//! With [`Avx512Spec::embedded_broadcast`] the FMAs read x[k] themselves
//! (`vfmadd231ps zmm, zmm, dword ptr [x]{1to16}`) and no A register is
//! used. The GEMV loop (m = 1) keeps S ∈ {4, 2, 1} sets of hb
//! accumulators and reads B straight from memory. Opmask k1 holds the
//! n-tail lanes (`kmovw` from a table of `(1 << v) - 1` in the frame).
//!
//! General-purpose registers and the loop nest are the AVX2 float
//! kernel's: rdi = args, rsi = weights (bias in the epilogue), rcx = valid
//! columns in the epilogue, r8..r13 (and rdi, rbx, rbp, r14, r15, rax, rdx,
//! rcx past 6 rows, state saved to the frame) = x row pointers, rbx = panel,
//! rbp = first row, r14/r15 = K block start/length. `Gemm` blocks K by
//! [`kc`] with partial sums through y; `FlatGemm` keeps all of K and
//! prefetches the weight stream; `Gemv` runs every row through the one-row
//! loop; m = 1 always goes to the one-row loop. Rows past m alias row
//! m - 1; columns past n are padding, masked at the store.

use tessera_dsl::ir::Activation;

use super::asm::*;
use super::common::{nest, row_ptr};
use super::evex::{Kreg, Zmm};
use crate::abi::*;
use crate::artifact::{EmitError, MachineCode, Variant};
use crate::target::X86_AVX512;
use crate::tile::TileConfig;

/// f32 lanes per zmm.
pub const LANES: usize = (X86_AVX512.register_bits / 32) as usize;
/// The zmm register file.
pub const ZMM_REGS: u32 = X86_AVX512.registers;
/// Default bytes of one panel's K block in the GEMM loop: an L2-resident
/// block (kc = 2048 at hp = 48). At M = 512, N = K = 4096 with 9×48, 384
/// KiB beat 192 KiB (kc 1024) by 8–14% and 96 KiB (kc 512) by 7–13% in
/// three same-run comparisons (CPU-time figures, loaded machine): fewer
/// passes of partial sums through y, as on AVX2.
pub const PANEL_BLOCK_BYTES: i32 = 384 * 1024;
/// How far ahead of the weight stream the flat and GEMV loops prefetch.
pub const PREFETCH: i32 = 1024;
/// k steps per unrolled iteration.
const UNROLL: usize = 8;

/// What the AVX-512 f32 kernel computes, and how.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Avx512Spec {
    pub ep: usize,
    /// hp / 16.
    pub hb: usize,
    pub bias: bool,
    pub activation: Activation,
    /// The FMAs broadcast x[k] from memory themselves (no A register).
    pub embedded_broadcast: bool,
    /// Bytes of a panel's K block in the GEMM variant (see [`kc`]).
    pub panel_block_bytes: i32,
}

impl Avx512Spec {
    /// The kernel for an `ep × hp` tile, with the default K blocking and
    /// broadcasts into a register.
    pub fn new(ep: usize, hp: usize, bias: bool, activation: Activation) -> Avx512Spec {
        Avx512Spec {
            ep,
            hb: hp / LANES,
            bias,
            activation,
            embedded_broadcast: false,
            panel_block_bytes: PANEL_BLOCK_BYTES,
        }
    }

    fn hp(&self) -> i32 {
        (LANES * self.hb) as i32
    }
}

/// k values per K block of the GEMM loop: the panel's K block fills
/// `panel_block_bytes`, a whole number of unrolled steps.
pub fn kc(spec: &Avx512Spec) -> i32 {
    let per_k = spec.hp() * 4;
    (spec.panel_block_bytes / per_k).max(UNROLL as i32) / UNROLL as i32 * UNROLL as i32
}

/// A registers of the multi-row loop (0 with embedded broadcasts).
fn a_regs(spec: &Avx512Spec) -> usize {
    usize::from(!spec.embedded_broadcast)
}

/// Accumulator sets of the multi-row loops: 2 when a second set fits
/// beside A and B (and the epilogue's two registers), else 1.
pub fn gemm_sets(spec: &Avx512Spec) -> usize {
    let used = |s: usize| s * spec.ep * spec.hb + a_regs(spec) + spec.hb;
    if used(2) <= ZMM_REGS as usize - 2 {
        2
    } else {
        1
    }
}

/// Accumulator sets of the GEMV loop (B from memory, 1 A register).
pub fn gemv_sets(spec: &Avx512Spec) -> usize {
    [4, 2, 1]
        .into_iter()
        .find(|s| s * spec.hb < ZMM_REGS as usize - 2)
        .unwrap_or(1)
}

/// What the multi-row loop keeps live, checked against the solver's
/// `x86-avx512` accounting of the tile: accumulators equal, A and B within
/// the solver's count, the loop (second set included) and the epilogue
/// (accumulators + bias temporary + zero) within the 32 zmm.
pub fn check_plan(spec: &Avx512Spec, tile: &TileConfig) -> Result<(), String> {
    let acc = &tile.accounting;
    let (ep, hb) = (spec.ep as u32, spec.hb as u32);
    let accumulators = ep * hb;
    let (a, b) = (a_regs(spec) as u32, hb);
    if accumulators != acc.accumulators {
        return Err(format!(
            "avx512 gemm: {accumulators} accumulators, the solver counted {}",
            acc.accumulators
        ));
    }
    if a > acc.a_regs || b > acc.b_regs {
        return Err(format!(
            "avx512 gemm: A {a} / B {b} registers exceed the solver's {} / {}",
            acc.a_regs, acc.b_regs
        ));
    }
    let budget = acc.budget.min(ZMM_REGS);
    let sets = gemm_sets(spec) as u32;
    let main = sets * accumulators + a + b;
    if main > budget || accumulators + 2 > budget {
        return Err(format!(
            "avx512 gemm needs {main} zmm ({sets} × {accumulators} accumulators + {a} A + {b} B; \
             epilogue {} ), more than the {budget} available",
            accumulators + 2
        ));
    }
    Ok(())
}

// ---- frame ---------------------------------------------------------------

/// `(1 << v) - 1` for v = 0..=16 (dwords): the opmask of v valid lanes.
const KMASKS: i32 = 0;
/// x row pointers while they are computed (14 rows).
const ROW_SLOTS: i32 = 72;
/// rdi, rbx, rbp, r14, r15 while the k loop holds more than 6 rows.
const SAVE_SLOTS: i32 = ROW_SLOTS + 8 * 14;
/// End of the k loop's weight stream, and its last whole unrolled step.
const K_END: i32 = SAVE_SLOTS + 8 * 5;
const K_END_UNROLLED: i32 = K_END + 8;
const FRAME: i32 = K_END_UNROLLED + 8;

const SAVED: [Gp; 6] = [RBX, RBP, R12, R13, R14, R15];

/// The n-tail lanes of one column block.
const TAIL: Kreg = Kreg(1);
/// Epilogue temporaries (see the register table).
const BIAS_TMP: Zmm = Zmm(30);
const ZERO: Zmm = Zmm(31);

/// x row pointers of up to 6 rows (y row pointers in the epilogue).
const XROWS: [Gp; 6] = [R8, R9, R10, R11, R12, R13];
/// x row pointers of the k loop (see [`super::float`]).
const KROWS: [Gp; 14] = [
    R8, R9, R10, R11, R12, R13, RDI, RBX, RBP, R14, R15, RAX, RDX, RCX,
];
const SAVED_STATE: [Gp; 5] = [RDI, RBX, RBP, R14, R15];
/// The most rows a tile can have (one x pointer each).
pub const MAX_ROWS: usize = KROWS.len();

fn prologue(a: &mut X86Asm) {
    for r in SAVED {
        a.push(r);
    }
    a.sub_imm(RSP, FRAME);
    for v in 0..=16 {
        a.store32_imm(mem(RSP, KMASKS + 4 * v), ((1u32 << v) - 1) as i32);
    }
}

fn epilogue(a: &mut X86Asm) {
    a.vzeroupper();
    a.add_imm(RSP, FRAME);
    for r in SAVED.iter().rev() {
        a.pop(*r);
    }
    a.ret();
}

/// One loop nest: rows per tile, accumulator sets, K blocking, prefetch.
#[derive(Clone, Copy, Debug)]
struct Loop {
    rows: usize,
    sets: usize,
    kc: Option<i32>,
    prefetch: Option<i32>,
}

/// Emit the GEMM variant (with the one-row loop for m = 1).
pub fn emit(spec: &Avx512Spec) -> Result<MachineCode, EmitError> {
    emit_variant(spec, Variant::Gemm)
}

/// Emit one variant (see the module doc).
pub fn emit_variant(spec: &Avx512Spec, variant: Variant) -> Result<MachineCode, EmitError> {
    let bad = |why: String| EmitError::BadTile {
        tile: format!("{}x{}x1", spec.ep, spec.hp()),
        why,
    };
    if spec.ep == 0 || spec.ep > MAX_ROWS || spec.hb == 0 {
        return Err(bad(format!(
            "the avx512 kernel needs 1..={MAX_ROWS} rows and hp a positive multiple of 16"
        )));
    }
    if spec.ep * spec.hb > ZMM_REGS as usize - 2
        || spec.ep * spec.hb + a_regs(spec) + spec.hb > ZMM_REGS as usize
    {
        return Err(bad(format!(
            "{} accumulators + {} A + {} B do not fit 32 zmm (the epilogue needs 2 beside the accumulators)",
            spec.ep * spec.hb,
            a_regs(spec),
            spec.hb
        )));
    }
    if spec.panel_block_bytes <= 0 {
        return Err(bad(
            "the panel block must be a positive number of bytes".into()
        ));
    }
    let mut a = X86Asm::new();
    a.comment(&format!(
        "matmul avx512 {variant} x f32 w f32 y f32 tile {}x{}x1 bias {} act {:?}{}",
        spec.ep,
        spec.hp(),
        spec.bias,
        spec.activation,
        if spec.embedded_broadcast {
            " a {1to16}"
        } else {
            ""
        }
    ));
    prologue(&mut a);
    let gemv = Loop {
        rows: 1,
        sets: gemv_sets(spec),
        kc: None,
        prefetch: Some(PREFETCH),
    };
    let multi = match variant {
        Variant::Gemv => None,
        Variant::FlatGemm => Some(Loop {
            rows: spec.ep,
            sets: gemm_sets(spec),
            kc: None,
            prefetch: Some(PREFETCH),
        }),
        Variant::Gemm => Some(Loop {
            rows: spec.ep,
            sets: gemm_sets(spec),
            kc: Some(kc(spec)),
            prefetch: None,
        }),
    };
    match multi {
        Some(l) if spec.ep > 1 => {
            let (one_row, done) = (a.new_label(), a.new_label());
            a.load64(RAX, mem(RDI, MM_M));
            a.cmp_imm(RAX, 1);
            a.jcc(Cond::E, one_row);
            a.comment(&format!("{variant}: {} rows per tile", spec.ep));
            nest(&mut a, spec, l);
            a.jmp(done);
            a.bind(one_row);
            a.comment("gemv: one row");
            nest(&mut a, spec, gemv);
            a.bind(done);
        }
        _ => {
            a.comment("gemv: one row per tile");
            nest(&mut a, spec, gemv);
        }
    }
    epilogue(&mut a);
    let (bytes, listing) = a.finish().map_err(EmitError::Assembler)?;
    Ok(super::machine_code(bytes, listing))
}

/// Register assignment of one loop (see the module doc's table).
#[derive(Clone, Copy)]
struct Regs {
    rows: usize,
    hb: usize,
    sets: usize,
    /// A registers (0 with embedded broadcasts).
    a: usize,
}

impl Regs {
    fn acc(&self, s: usize, i: usize, j: usize) -> Zmm {
        Zmm((s * self.rows * self.hb + i * self.hb + j) as u8)
    }
    fn a(&self) -> Zmm {
        Zmm((self.sets * self.rows * self.hb) as u8)
    }
    fn b(&self, j: usize) -> Zmm {
        Zmm((self.sets * self.rows * self.hb + self.a + j) as u8)
    }
}

/// rax = (n0 + rbx·hp) · 4: the panel's first column, in bytes.
fn column_offset(a: &mut X86Asm, hp: i32) {
    a.imul_imm(RAX, RBX, hp);
    a.load64(RDX, mem(RDI, MM_N0));
    a.add(RAX, RDX);
    a.shl_imm(RAX, 2);
}

/// rcx = columns of this panel that exist: n - rbx·hp.
fn valid_columns(a: &mut X86Asm, hp: i32) {
    a.imul_imm(RAX, RBX, hp);
    a.load64(RCX, mem(RDI, MM_N));
    a.sub(RCX, RAX);
}

/// k1 = the valid lanes of column block `j` given rcx valid columns in
/// the panel; jumps to `none` when the block has none. Clobbers rax, rdx.
fn tail_mask(a: &mut X86Asm, j: usize, none: Label) {
    let full = a.new_label();
    a.mov(RDX, RCX);
    if j > 0 {
        a.sub_imm(RDX, (LANES * j) as i32);
    }
    a.cmp_imm(RDX, 0);
    a.jcc(Cond::Le, none);
    a.cmp_imm(RDX, LANES as i32);
    a.jcc(Cond::Le, full);
    a.mov_imm(RDX, LANES as i32);
    a.bind(full);
    a.shl_imm(RDX, 2);
    a.add(RDX, RSP);
    a.load16(RAX, mem(RDX, KMASKS));
    a.kmovw_from_gp(TAIL, RAX);
}

fn nest(a: &mut X86Asm, spec: &Avx512Spec, l: Loop) {
    let Loop {
        rows,
        sets,
        kc,
        prefetch,
    } = l;
    let hb = spec.hb;
    let hp = spec.hp();
    // The one-row loop always broadcasts into A (its B comes from memory).
    let a_count = if rows > 1 { a_regs(spec) } else { 1 };
    let r = Regs {
        rows,
        hb,
        sets,
        a: a_count,
    };
    let xrows = &KROWS[..rows];

    let kc_loop = nest::k_blocks_head(a, kc);
    let panel_loop = nest::panels_head(a);
    let row_loop = nest::rows_head(a);

    // Accumulators: zero, or the partial sums of earlier K blocks from y.
    let zero_all = |a: &mut X86Asm| {
        for s in 0..sets {
            for i in 0..rows {
                for j in 0..hb {
                    let v = r.acc(s, i, j);
                    a.vpxord_zmm(v, v, v);
                }
            }
        }
    };
    if kc.is_some() {
        let (zero, init_done) = (a.new_label(), a.new_label());
        a.cmp_imm(R14, 0);
        a.jcc(Cond::E, zero);
        valid_columns(a, hp);
        for i in 0..rows {
            row_ptr(a, RSI, i, true, MM_Y, MM_Y_STRIDE);
            column_offset(a, hp);
            a.add(RSI, RAX);
            let (tail, done) = (a.new_label(), a.new_label());
            a.cmp_imm(RCX, hp);
            a.jcc(Cond::L, tail);
            for j in 0..hb {
                a.vmovups_zmm_load(r.acc(0, i, j), mem(RSI, 64 * j as i32));
            }
            a.jmp(done);
            a.bind(tail);
            for j in 0..hb {
                // Blocks past n stay zero (their stores are masked off).
                let v = r.acc(0, i, j);
                a.vpxord_zmm(v, v, v);
            }
            for j in 0..hb {
                tail_mask(a, j, done);
                a.vmovups_zmm_load_masked(r.acc(0, i, j), TAIL, mem(RSI, 64 * j as i32));
            }
            a.bind(done);
            for s in 1..sets {
                for j in 0..hb {
                    let v = r.acc(s, i, j);
                    a.vpxord_zmm(v, v, v);
                }
            }
        }
        a.jmp(init_done);
        a.bind(zero);
        zero_all(a);
        a.bind(init_done);
    } else {
        zero_all(a);
    }

    // With K blocks, prefetch the next row block's partial sums (y rows
    // are n·4 bytes apart, no stream the hardware follows).
    if kc.is_some() {
        for i in 0..rows {
            row_ptr(a, RSI, rows + i, false, MM_Y, MM_Y_STRIDE);
            column_offset(a, hp);
            a.add(RSI, RAX);
            for c in (0..hp * 4).step_by(64) {
                a.prefetcht0(mem(RSI, c));
            }
        }
    }

    // Weight pointer: w + ((n0 + rbx·hp)·K + r14·hp)·4.
    let wstep = hp * 4;
    a.imul_imm(RAX, RBX, hp);
    a.load64(RDX, mem(RDI, MM_N0));
    a.add(RAX, RDX);
    a.load64(RDX, mem(RDI, MM_K));
    a.imul(RAX, RDX);
    a.imul_imm(RDX, R14, hp);
    a.add(RAX, RDX);
    a.shl_imm(RAX, 2);
    a.load64(RDX, mem(RDI, MM_W));
    a.add(RAX, RDX);
    a.mov(RSI, RAX);
    a.imul_imm(RAX, R15, wstep);
    a.add(RAX, RSI);
    a.store64(mem(RSP, K_END), RAX);
    a.sub_imm(RAX, UNROLL as i32 * wstep);
    a.store64(mem(RSP, K_END_UNROLLED), RAX);

    // x row pointers at this K block (past 6 rows the loop state moves to
    // the frame and its registers hold row pointers too).
    let spill = rows > XROWS.len();
    for (i, &xr) in xrows.iter().enumerate() {
        let dst = if spill { R8 } else { xr };
        row_ptr(a, dst, i, true, MM_X, MM_X_STRIDE);
        a.mov(RAX, R14);
        a.shl_imm(RAX, 2);
        a.add(dst, RAX);
        if spill {
            a.store64(mem(RSP, ROW_SLOTS + 8 * i as i32), R8);
        }
    }
    if spill {
        for (i, &g) in SAVED_STATE.iter().enumerate() {
            a.store64(mem(RSP, SAVE_SLOTS + 8 * i as i32), g);
        }
        for (i, &xr) in xrows.iter().enumerate() {
            a.load64(xr, mem(RSP, ROW_SLOTS + 8 * i as i32));
        }
    }

    // The k loop.
    let b_regs = rows > 1;
    let step = |a: &mut X86Asm, u: usize, s: usize| {
        let (xo, wo) = (4 * u as i32, u as i32 * wstep);
        if b_regs {
            for j in 0..hb {
                a.vmovups_zmm_load(r.b(j), mem(RSI, wo + 64 * j as i32));
            }
        }
        for (i, &xr) in xrows.iter().enumerate() {
            if b_regs && spec.embedded_broadcast {
                for j in 0..hb {
                    a.vfmadd231ps_zmm_bcst(r.acc(s, i, j), r.b(j), mem(xr, xo));
                }
                continue;
            }
            a.vbroadcastss_zmm_load(r.a(), mem(xr, xo));
            for j in 0..hb {
                if b_regs {
                    a.vfmadd231ps_zmm(r.acc(s, i, j), r.a(), r.b(j));
                } else {
                    a.vfmadd231ps_zmm_mem(r.acc(s, i, j), r.a(), mem(RSI, wo + 64 * j as i32));
                }
            }
        }
    };
    let (unrolled, tail, tail_loop, k_done) =
        (a.new_label(), a.new_label(), a.new_label(), a.new_label());
    a.cmp_mem(RSI, mem(RSP, K_END_UNROLLED));
    a.jcc(Cond::A, tail);
    a.bind(unrolled);
    for u in 0..UNROLL {
        step(a, u, u % sets);
    }
    if let Some(distance) = prefetch {
        for c in (0..UNROLL as i32 * wstep).step_by(64) {
            a.prefetcht0(mem(RSI, distance + c));
        }
    }
    for &xr in xrows {
        a.add_imm(xr, UNROLL as i32 * 4);
    }
    a.add_imm(RSI, UNROLL as i32 * wstep);
    a.cmp_mem(RSI, mem(RSP, K_END_UNROLLED));
    a.jcc(Cond::Be, unrolled);
    a.bind(tail);
    a.cmp_mem(RSI, mem(RSP, K_END));
    a.jcc(Cond::Ae, k_done);
    a.bind(tail_loop);
    step(a, 0, 0);
    for &xr in xrows {
        a.add_imm(xr, 4);
    }
    a.add_imm(RSI, wstep);
    a.cmp_mem(RSI, mem(RSP, K_END));
    a.jcc(Cond::B, tail_loop);
    a.bind(k_done);
    if spill {
        for (i, &g) in SAVED_STATE.iter().enumerate() {
            a.load64(g, mem(RSP, SAVE_SLOTS + 8 * i as i32));
        }
    }
    for s in 1..sets {
        for i in 0..rows {
            for j in 0..hb {
                a.vaddps_zmm(r.acc(0, i, j), r.acc(0, i, j), r.acc(s, i, j));
            }
        }
    }

    // Epilogue, in chunks of at most 6 rows (y row pointers in r8..r13,
    // aliased past m); bias pointer and valid columns first.
    if spec.bias {
        column_offset(a, hp);
        a.load64(RSI, mem(RDI, MM_BIAS));
        a.add(RSI, RAX);
    }
    valid_columns(a, hp);
    let store_all = |a: &mut X86Asm, finalize: bool| {
        for first in (0..rows).step_by(XROWS.len()) {
            let chunk = (rows - first).min(XROWS.len());
            for (i, &yr) in XROWS[..chunk].iter().enumerate() {
                row_ptr(a, yr, first + i, true, MM_Y, MM_Y_STRIDE);
                column_offset(a, hp);
                a.add(yr, RAX);
            }
            store_tile(a, spec, finalize, chunk, |i, j| r.acc(0, first + i, j));
        }
    };
    match kc {
        Some(_) => {
            let (partial, stored) = (a.new_label(), a.new_label());
            a.mov(RAX, R14);
            a.add(RAX, R15);
            a.cmp_mem(RAX, mem(RDI, MM_K));
            a.jcc(Cond::Ne, partial);
            store_all(a, true);
            a.jmp(stored);
            a.bind(partial);
            store_all(a, false);
            a.bind(stored);
        }
        None => store_all(a, true),
    }

    nest::rows_tail(a, row_loop, rows);
    nest::panels_tail(a, panel_loop, hp);
    nest::k_blocks_tail(a, kc_loop);
}

/// Store `rows` rows of accumulators to the y rows in r8.., adding the
/// bias (rsi) and applying the activation when `finalize`. Expects rcx =
/// valid columns of the panel. Clobbers rax, rdx and the accumulators.
fn store_tile(
    a: &mut X86Asm,
    spec: &Avx512Spec,
    finalize: bool,
    rows: usize,
    acc: impl Fn(usize, usize) -> Zmm,
) {
    let hp = spec.hp();
    let bias = finalize && spec.bias;
    let relu = finalize && spec.activation == Activation::Relu;
    if relu {
        a.vpxord_zmm(ZERO, ZERO, ZERO);
    }
    let (tail, done) = (a.new_label(), a.new_label());
    a.cmp_imm(RCX, hp);
    a.jcc(Cond::L, tail);
    for (i, &yr) in XROWS[..rows].iter().enumerate() {
        for j in 0..spec.hb {
            let v = acc(i, j);
            if bias {
                a.vaddps_zmm_mem(v, v, mem(RSI, 64 * j as i32));
            }
            if relu {
                a.vmaxps_zmm(v, v, ZERO);
            }
            a.vmovups_zmm_store(mem(yr, 64 * j as i32), v);
        }
    }
    a.jmp(done);
    a.bind(tail);
    for j in 0..spec.hb {
        tail_mask(a, j, done);
        if bias {
            a.vmovups_zmm_load_masked(BIAS_TMP, TAIL, mem(RSI, 64 * j as i32));
        }
        for (i, &yr) in XROWS[..rows].iter().enumerate() {
            let v = acc(i, j);
            if bias {
                a.vaddps_zmm(v, v, BIAS_TMP);
            }
            if relu {
                a.vmaxps_zmm(v, v, ZERO);
            }
            a.vmovups_zmm_store_masked(mem(yr, 64 * j as i32), TAIL, v);
        }
    }
    a.bind(done);
}
