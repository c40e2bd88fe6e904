//! Float matmul kernels: one loop nest, emitted on either vector register
//! file (`regfile::RegisterFile`):
//!
//! - ymm (AVX2 + FMA, [`FloatSpec`]): f32 or f16 activations, weights and
//!   output, `vfmadd231ps` (f16 widened by `vcvtph2ps`, stored by
//!   `vcvtps2ph`);
//! - zmm (AVX-512F, [`super::avx512::Avx512Spec`]): f32 only, for the
//!   `x86-avx512` target's f32 tiles. OpenBLAS runs its SkylakeX zmm
//!   kernels on such CPUs, where a ymm kernel is capped at half the FMA
//!   peak.
//!
//! Both take [`crate::abi::MatmulArgs`] and weights packed `[h/hp, l, hp]`
//! (lp = 1): one k step of a panel is hp contiguous values, hb = hp/L
//! registers (L = 8 f32 lanes per ymm, 16 per zmm). Activations are
//! row-major (`x_stride` bytes per row); each row's element is broadcast
//! from memory.
//!
//! # Register plan
//!
//! GEMM loop (ep rows, the solver's tile; acc(s,i,j) = set s, row i, column
//! block j; R = 16 ymm or 32 zmm). S = 2 accumulator sets ([`gemm_sets`])
//! take alternate k steps when they fit, so S·ep·hb FMA chains are
//! independent. Each row's `x[k]` is broadcast (`vpbroadcastd` /
//! `vbroadcastss` from memory) into the one A register and consumed by that
//! row's FMAs at once; renaming gives every broadcast its own physical
//! register, so one A register serves every row (the solver counts one):
//!
//! | register | holds |
//! |---|---|
//! | 0 .. S·ep·hb | accumulators acc(s,i,j) = register s·ep·hb + i·hb + j |
//! | then 1 | A: the current row's `x[k]` broadcast (none with embedded broadcast) |
//! | then hb | B: the panel's hp weights of step k |
//! | R - 2 | epilogue: bias under the n-tail mask (after the loop; ep·hb ≤ R - 2) |
//! | R - 1 | epilogue: ymm: column mask for the n tail; zmm: relu's zero |
//!
//! On ymm, relu's zero comes from the frame (the mask table's zero half);
//! on zmm the n-tail mask is opmask k1 (`regfile` lists what
//! else differs). With [`super::avx512::Avx512Spec::embedded_broadcast`]
//! the zmm FMAs read `x[k]` themselves (`vfmadd231ps zmm, zmm, dword ptr
//! [x]{1to16}`) and no A register is used. With f16 activations (ymm) every
//! row's x is widened to f32 four k steps at a time into the frame
//! (`X_F32`) and broadcast from there, instead of widening each
//! broadcast.
//!
//! GEMV loop (m = 1, memory-bound): S accumulator sets (S ∈ {4, 2, 1}, the
//! most that fit: [`gemv_sets`], [`super::avx512::gemv_sets`]) take
//! consecutive k steps so S·hb FMA chains are independent; B comes
//! straight from memory for f32 weights (no B registers), through
//! `vcvtph2ps` into hb registers for f16; 1 A register; the sets are
//! summed before the epilogue. The weight stream is prefetched
//! as the backend says ([`super::WeightPrefetch::FLOAT`] by default).
//!
//! General-purpose registers: rdi = args, rsi = weight pointer (bias in the
//! epilogue), rcx = valid columns in the epilogue, r8..r13 = x row pointers
//! (y row pointers in the epilogue, 6 rows at a time), rbx = panel, rbp =
//! first row, r14 = first k of the K block, r15 = its length, rax/rdx
//! scratch. The k loop ends by comparing rsi with end pointers in the frame
//! (no counter); with more than 6 rows it saves rdi, rbx, rbp, r14, r15 to
//! the frame and uses them, rax, rdx and rcx as row pointers too, up to 14
//! rows ([`MAX_ROWS`]).
//!
//! Variants ([`emit_variant`], [`super::avx512::emit_variant`]): `Gemm` as
//! below; `FlatGemm` is the same nest without K blocks (panels → row
//! blocks of ep rows → all of k, the weight stream prefetched as for the
//! GEMV), so for m ≤ ep every weight byte is read once per call and
//! each row block past the first re-reads its panel (hp·K elements) from
//! L2; `Gemv` is the one-row loop for every row. Every variant sends m = 1
//! to the one-row loop.
//!
//! Loop nest (GEMM): K blocks of [`kc`] / [`super::avx512::kc`] (f32
//! output only: partial sums go through y; f16 output keeps all of K) →
//! panels of hp columns → row blocks of ep rows → k. A panel's K block
//! (kc·hp·4 bytes: [`PANEL_BLOCK_BYTES`] on ymm,
//! [`super::avx512::Avx512Spec::panel_block_bytes`] on zmm) stays in L2
//! while the row blocks stream the x block (m·kc·4 bytes). Rows past m alias row m - 1 (XNNPACK's trick: they compute and
//! store the same values); columns past n are padding in the weights and
//! masked at the store (`vmaskmovps` or word stores for f16 on ymm, opmask
//! k1 on zmm).

use tessera_dsl::ir::{Activation, Format};

use super::asm::*;
use super::common::{self, Store, nest};
use super::prefetch::WeightPrefetch;
use super::regfile::RegisterFile;
use crate::abi::*;
use crate::artifact::{EmitError, MachineCode, Variant};

/// Bytes of one panel's K block in the ymm GEMM loop: an L2-resident block
/// (192 KiB of a 2 MiB L2 here, of 512 KiB on Zen 3), not an L1 one. At
/// M = 512 with the 4×24 and 6×16 tiles, K blocks of 512–680 reached
/// 75–81% of the FMA peak and of 2048 87–89% (CPU-time figures, noisy
/// machine): each K block costs a pass of partial sums through y, which
/// costs more than streaming the panel from L2 (software prefetch of the
/// panel measured no better).
pub const PANEL_BLOCK_BYTES: i32 = 192 * 1024;

/// k values per K block of the ymm GEMM loop: the panel's K block fills
/// [`PANEL_BLOCK_BYTES`] (2048 for 24 f32 columns, 3072 for 16); longer
/// blocks mean fewer passes of partial sums through y and less per-block
/// overhead.
pub fn kc(spec: &FloatSpec) -> i32 {
    k_block(PANEL_BLOCK_BYTES, 8 * spec.hb, size(spec.w))
}

/// k values per K block: a panel's K block (hp columns of `w_bytes` each)
/// fills `panel_block_bytes`, a whole number of unrolled steps.
pub(super) fn k_block(panel_block_bytes: i32, hp: usize, w_bytes: i32) -> i32 {
    let per_k = hp as i32 * w_bytes;
    (panel_block_bytes / per_k).max(UNROLL as i32) / UNROLL as i32 * UNROLL as i32
}

/// k steps per unrolled iteration.
const UNROLL: usize = 8;

/// x row pointers of up to 6 rows (y row pointers in the epilogue).
const XROWS: [Gp; 6] = [R8, R9, R10, R11, R12, R13];
/// x row pointers of the k loop: r8..r13, then, with more than 6 rows,
/// the registers of [`SAVED_STATE`] and rax, rdx, rcx (the loop ends by
/// comparing the weight pointer against end pointers in the frame, so it
/// needs no counter). rsi streams the weights.
const KROWS: [Gp; 14] = [
    R8, R9, R10, R11, R12, R13, RDI, RBX, RBP, R14, R15, RAX, RDX, RCX,
];
/// Frame bytes where the ymm multi-row loops with f16 activations keep
/// each row's next 4 x values widened to f32 (16 bytes per row): one
/// `vcvtph2ps` per row every 4 k steps, then plain broadcast loads.
/// Broadcasting and widening x[k] at every step (`vpbroadcastw` +
/// `vcvtph2ps`, three uops on the vector ports per row and k beside the
/// FMA) held the 8×8 flat loop to about half the read bandwidth.
///
/// The offset is 16-byte aligned (rsp ≡ 8 mod 16 after the prologue, as at
/// entry), so no 16-byte store splits a cache line and every broadcast is
/// forwarded from one store. 32-byte stores at a fixed frame offset (which
/// split a line for half the stack alignments) made one run in five up to
/// 3× slower. The bytes are the epilogue's f16 scratch, the int8 kernels'
/// constants (unused here) and the row pointer slots (read before the k
/// loop only): all free while the k loop runs.
const X_F32: i32 = common::F16_SCRATCH + 8;
/// x values widened per store.
const X_F32_STEPS: usize = 4;
const _: () = assert!(X_F32 + 16 * MAX_ROWS as i32 <= common::SAVE_SLOTS);
const _: () = assert!(X_F32 >= common::F16_SCRATCH && UNROLL.is_multiple_of(X_F32_STEPS));

/// Loop state saved to the frame while the k loop holds more than 6 rows.
const SAVED_STATE: [Gp; 5] = [RDI, RBX, RBP, R14, R15];
/// The most rows a float tile can have (one x pointer each).
pub const MAX_ROWS: usize = KROWS.len();

/// What the ymm float kernel computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FloatSpec {
    pub ep: usize,
    /// hp / lanes (8 on ymm).
    pub hb: usize,
    pub x: Format,
    pub w: Format,
    pub y: Format,
    pub bias: bool,
    pub activation: Activation,
}

/// Accumulator sets of the ymm GEMV loop: the most of 4, 2, 1 that fit
/// beside 1 A register and the B registers (f16 weights); the sets are
/// summed before the epilogue needs its mask and temporary.
pub fn gemv_sets(spec: &FloatSpec) -> usize {
    let b = if spec.w == Format::F32 { 0 } else { spec.hb };
    sets_that_fit(&[4, 2, 1], spec.hb, 1 + b, <Ymm as RegisterFile>::REGISTERS)
}

fn size(f: Format) -> i32 {
    if f == Format::F32 { 4 } else { 2 }
}

fn log2(v: i32) -> i8 {
    v.trailing_zeros() as i8
}

/// Accumulator sets of the ymm multi-row loops: 2 when a second set of
/// ep·hb accumulators fits beside 1 A, hb B and the epilogue's 2 registers
/// (6×8: 12 FMA chains instead of 6, enough to cover the FMA latency),
/// else 1.
pub fn gemm_sets(spec: &FloatSpec) -> usize {
    multi_row_sets::<Ymm>(spec.ep, spec.hb, 1)
}

/// Accumulator sets of the multi-row loops on `V`: 2 when a second set
/// fits beside `a_regs` A and hb B registers and the epilogue's two, else 1.
pub(super) fn multi_row_sets<V: RegisterFile>(ep: usize, hb: usize, a_regs: usize) -> usize {
    sets_that_fit(&[2, 1], ep * hb, a_regs + hb, V::REGISTERS - 2)
}

/// The first of `candidates` (most first) whose sets of `per_set`
/// registers fit `budget` beside `others`; 1 when none does.
pub(super) fn sets_that_fit(
    candidates: &[usize],
    per_set: usize,
    others: usize,
    budget: usize,
) -> usize {
    candidates
        .iter()
        .copied()
        .find(|s| s * per_set + others <= budget)
        .unwrap_or(1)
}

/// Emit the ymm kernel: the GEMM variant (with the GEMV loop for m = 1).
pub fn emit(spec: &FloatSpec) -> Result<MachineCode, EmitError> {
    emit_variant(spec, Variant::Gemm)
}

/// Emit one variant of the ymm kernel. `Gemv` runs every row through the
/// one-row loop; `FlatGemm` keeps all K in the accumulators of ep rows
/// (each weight byte read once per call while m ≤ ep, else once per row
/// block with the panel still in L2) and prefetches the weight stream;
/// `Gemm` blocks K by [`kc`] (f32 output) so a panel's K block stays in L2
/// across row blocks. Both multi-row variants send m = 1 to the GEMV loop.
pub fn emit_variant(spec: &FloatSpec, variant: Variant) -> Result<MachineCode, EmitError> {
    emit_variant_prefetching(spec, variant, WeightPrefetch::FLOAT)
}

/// [`emit_variant`] with the weight stream prefetched by `prefetch`.
pub fn emit_variant_prefetching(
    spec: &FloatSpec,
    variant: Variant,
    prefetch: WeightPrefetch,
) -> Result<MachineCode, EmitError> {
    if spec.ep > MAX_ROWS || spec.ep == 0 || spec.hb == 0 {
        return Err(EmitError::BadTile {
            tile: format!("{}x{}x1", spec.ep, spec.hb * 8),
            why: format!("the float kernel keeps at most {MAX_ROWS} row pointers"),
        });
    }
    emit_on::<Ymm>(
        &FloatKernel {
            spec: *spec,
            embedded_broadcast: false,
            kc: kc(spec),
            gemm_sets: gemm_sets(spec),
            gemv_sets: gemv_sets(spec),
            prefetch,
        },
        variant,
    )
}

/// What the emitter builds, whichever register file: the front-ends
/// ([`FloatSpec`], [`super::avx512::Avx512Spec`]) check their spec and fill
/// this in.
#[derive(Clone, Copy, Debug)]
pub(super) struct FloatKernel {
    /// What to compute; its hb counts the register file's lanes (16 for
    /// zmm).
    pub spec: FloatSpec,
    /// The multi-row FMAs broadcast x[k] from memory themselves (no A
    /// register; register files with embedded broadcast only).
    pub embedded_broadcast: bool,
    /// K block of the `Gemm` variant (f32 output).
    pub kc: i32,
    pub gemm_sets: usize,
    pub gemv_sets: usize,
    /// How the flat and one-row loops prefetch the weight stream.
    pub prefetch: WeightPrefetch,
}

/// The kernel reads as its spec (`k.ep`, `k.x`, …).
impl std::ops::Deref for FloatKernel {
    type Target = FloatSpec;
    fn deref(&self) -> &FloatSpec {
        &self.spec
    }
}

/// One loop nest: rows per tile, accumulator sets, K blocking, prefetch.
#[derive(Clone, Copy, Debug)]
struct Loop {
    rows: usize,
    sets: usize,
    /// K block length (partial sums through y), or all of K at once.
    kc: Option<i32>,
    /// How the weight stream is prefetched; None: not at all.
    prefetch: Option<WeightPrefetch>,
}

/// Emit one variant of `k` on register file `V` (see the module doc).
pub(super) fn emit_on<V: RegisterFile>(
    k: &FloatKernel,
    variant: Variant,
) -> Result<MachineCode, EmitError> {
    let mut a = X86Asm::new();
    a.comment(&format!(
        "{} {variant} x {} w {} y {} tile {}x{}x1 bias {} act {:?}{}",
        V::LISTING_NAME,
        k.x,
        k.w,
        k.y,
        k.ep,
        k.hb * V::LANES,
        k.bias,
        k.activation,
        if k.embedded_broadcast {
            " a {1to16}"
        } else {
            ""
        }
    ));
    V::prologue(&mut a);
    let gemv = Loop {
        rows: 1,
        sets: k.gemv_sets,
        kc: None,
        prefetch: Some(k.prefetch),
    };
    let multi = match variant {
        Variant::Gemv => None,
        Variant::FlatGemm => Some(Loop {
            rows: k.ep,
            sets: k.gemm_sets,
            kc: None,
            prefetch: Some(k.prefetch),
        }),
        Variant::Gemm => Some(Loop {
            rows: k.ep,
            sets: k.gemm_sets,
            kc: (k.y == Format::F32).then_some(k.kc),
            prefetch: None,
        }),
    };
    match multi {
        Some(l) if k.ep > 1 => {
            let (one_row, done) = (a.new_label(), a.new_label());
            a.load64(RAX, mem(RDI, MM_M));
            a.cmp_imm(RAX, 1);
            a.jcc(Cond::E, one_row);
            a.comment(&format!("{variant}: {} rows per tile", k.ep));
            nest::<V>(&mut a, k, l);
            a.jmp(done);
            a.bind(one_row);
            a.comment("gemv: one row");
            nest::<V>(&mut a, k, gemv);
            a.bind(done);
        }
        _ => {
            a.comment("gemv: one row per tile");
            nest::<V>(&mut a, k, gemv);
        }
    }
    V::epilogue(&mut a);
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
    fn acc<V: RegisterFile>(&self, s: usize, i: usize, j: usize) -> V {
        V::reg(s * self.rows * self.hb + i * self.hb + j)
    }
    /// One A register for every row: each broadcast is consumed by its
    /// row's FMAs at once, and register renaming gives every broadcast its
    /// own physical register, so the rows do not wait on each other.
    fn a<V: RegisterFile>(&self) -> V {
        V::reg(self.sets * self.rows * self.hb)
    }
    fn b<V: RegisterFile>(&self, j: usize) -> V {
        V::reg(self.sets * self.rows * self.hb + self.a + j)
    }
}

/// rax = (n0 + rbx·hp) · `elem` (the panel's first column, in bytes).
fn column_offset(a: &mut X86Asm, hp: i32, elem: i32) {
    a.imul_imm(RAX, RBX, hp);
    a.load64(RDX, mem(RDI, MM_N0));
    a.add(RAX, RDX);
    if elem > 1 {
        a.shl_imm(RAX, log2(elem));
    }
}

/// rcx = columns of this panel that exist: n - rbx·hp.
fn valid_columns(a: &mut X86Asm, hp: i32) {
    a.imul_imm(RAX, RBX, hp);
    a.load64(RCX, mem(RDI, MM_N));
    a.sub(RCX, RAX);
}

fn nest<V: RegisterFile>(a: &mut X86Asm, k: &FloatKernel, l: Loop) {
    let Loop {
        rows,
        sets,
        kc,
        prefetch,
    } = l;
    let hb = k.hb;
    let hp = (V::LANES * hb) as i32;
    // The one-row loop always broadcasts into A (its B comes from memory).
    let embedded = rows > 1 && k.embedded_broadcast;
    let r = Regs {
        rows,
        hb,
        sets,
        a: usize::from(!embedded),
    };
    let acc = |s, i, j| r.acc::<V>(s, i, j);
    let (xs, ws, ys) = (size(k.x), size(k.w), size(k.y));
    let xrows = &KROWS[..rows];
    let frame = V::FRAME;

    let kc_loop = nest::k_blocks_head(a, kc);
    let panel_loop = nest::panels_head(a);
    let row_loop = nest::rows_head(a);

    // Accumulators: zero, or the partial sums of earlier K blocks from y.
    let zero_all = |a: &mut X86Asm| {
        for s in 0..sets {
            for i in 0..rows {
                for j in 0..hb {
                    V::zero(a, acc(s, i, j));
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
            common::row_ptr(a, RSI, i, true, MM_Y, MM_Y_STRIDE);
            column_offset(a, hp, ys);
            a.add(RSI, RAX);
            let (tail, done) = (a.new_label(), a.new_label());
            a.cmp_imm(RCX, hp);
            a.jcc(Cond::L, tail);
            for j in 0..hb {
                V::load(a, Format::F32, acc(0, i, j), mem(RSI, V::BYTES * j as i32));
            }
            a.jmp(done);
            a.bind(tail);
            V::load_tail(a, hb, |j| acc(0, i, j), RSI, done);
            a.bind(done);
            for s in 1..sets {
                for j in 0..hb {
                    V::zero(a, acc(s, i, j));
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

    // With K blocks, the next row block's partial sums are cache misses
    // (y rows are n·4 bytes apart, no stream the hardware follows): prefetch
    // them now so the k loop hides the latency. Prefetches past the end of
    // y are harmless (they never fault).
    if kc.is_some() {
        for i in 0..rows {
            common::row_ptr(a, RSI, rows + i, false, MM_Y, MM_Y_STRIDE);
            column_offset(a, hp, ys);
            a.add(RSI, RAX);
            V::prefetch_row(a, RSI, hp * ys);
        }
    }

    // Weight pointer: w + ((n0 + rbx·hp)·K + r14·hp)·ws.
    let wstep = hp * ws;
    a.imul_imm(RAX, RBX, hp);
    a.load64(RDX, mem(RDI, MM_N0));
    a.add(RAX, RDX);
    a.load64(RDX, mem(RDI, MM_K));
    a.imul(RAX, RDX);
    a.imul_imm(RDX, R14, hp);
    a.add(RAX, RDX);
    a.shl_imm(RAX, log2(ws));
    a.load64(RDX, mem(RDI, MM_W));
    a.add(RAX, RDX);
    a.mov(RSI, RAX);
    // The loop ends by pointer: k_end after the block's last step,
    // k_end_unrolled where fewer than UNROLL steps remain.
    a.imul_imm(RAX, R15, wstep);
    a.add(RAX, RSI);
    a.store64(mem(RSP, frame.k_end), RAX);
    a.sub_imm(RAX, UNROLL as i32 * wstep);
    a.store64(mem(RSP, frame.k_end_unrolled), RAX);

    // x row pointers at this K block. Past 6 rows the loop state moves to
    // the frame and its registers hold row pointers too.
    let spill = rows > XROWS.len();
    for (i, &xr) in xrows.iter().enumerate() {
        let dst = if spill { R8 } else { xr };
        common::row_ptr(a, dst, i, true, MM_X, MM_X_STRIDE);
        a.mov(RAX, R14);
        a.shl_imm(RAX, log2(xs));
        a.add(dst, RAX);
        if spill {
            a.store64(mem(RSP, frame.row_slots + 8 * i as i32), R8);
        }
    }
    if spill {
        for (i, &g) in SAVED_STATE.iter().enumerate() {
            a.store64(mem(RSP, frame.save_slots + 8 * i as i32), g);
        }
        for (i, &xr) in xrows.iter().enumerate() {
            a.load64(xr, mem(RSP, frame.row_slots + 8 * i as i32));
        }
    }

    // The k loop.
    let b_regs = rows > 1 || k.w != Format::F32;
    let x_widened = k.x == Format::F16 && rows > 1;
    let av = r.a::<V>();
    // Unrolled iterations with widened x: every X_F32_STEPS steps, each
    // row's next X_F32_STEPS values of x become f32 in the frame.
    let widen_x = |a: &mut X86Asm, u: usize| {
        for (i, &xr) in xrows.iter().enumerate() {
            V::stage_f16x4(
                a,
                av,
                mem(xr, u as i32 * xs),
                mem(RSP, X_F32 + 16 * i as i32),
            );
        }
    };
    let step = |a: &mut X86Asm, u: usize, s: usize, widened: bool| {
        let (xo, wo) = (u as i32 * xs, u as i32 * wstep);
        if b_regs {
            for j in 0..hb {
                let at = mem(RSI, wo + (V::LANES * j) as i32 * ws);
                V::load(a, k.w, r.b::<V>(j), at);
            }
        }
        for (i, &xr) in xrows.iter().enumerate() {
            if embedded {
                for j in 0..hb {
                    V::fma_broadcast(a, acc(s, i, j), r.b::<V>(j), mem(xr, xo));
                }
                continue;
            }
            if widened {
                let slot = X_F32 + 16 * i as i32 + 4 * (u % X_F32_STEPS) as i32;
                V::broadcast(a, Format::F32, av, mem(RSP, slot));
            } else {
                V::broadcast(a, k.x, av, mem(xr, xo));
            }
            for j in 0..hb {
                if b_regs {
                    V::fma(a, acc(s, i, j), av, r.b::<V>(j));
                } else {
                    V::fma_mem(a, acc(s, i, j), av, mem(RSI, wo + V::BYTES * j as i32));
                }
            }
        }
    };
    let (unrolled, tail, tail_loop, k_done) =
        (a.new_label(), a.new_label(), a.new_label(), a.new_label());
    a.cmp_mem(RSI, mem(RSP, frame.k_end_unrolled));
    a.jcc(Cond::A, tail);
    a.bind(unrolled);
    for u in 0..UNROLL {
        if x_widened && u.is_multiple_of(X_F32_STEPS) {
            widen_x(a, u);
        }
        step(a, u, u % sets, x_widened);
    }
    if let Some(prefetch) = prefetch {
        prefetch.emit(a, RSI, UNROLL as i32 * wstep);
    }
    for &xr in xrows {
        a.add_imm(xr, UNROLL as i32 * xs);
    }
    a.add_imm(RSI, UNROLL as i32 * wstep);
    a.cmp_mem(RSI, mem(RSP, frame.k_end_unrolled));
    a.jcc(Cond::Be, unrolled);
    a.bind(tail);
    a.cmp_mem(RSI, mem(RSP, frame.k_end));
    a.jcc(Cond::Ae, k_done);
    a.bind(tail_loop);
    step(a, 0, 0, false);
    for &xr in xrows {
        a.add_imm(xr, xs);
    }
    a.add_imm(RSI, wstep);
    a.cmp_mem(RSI, mem(RSP, frame.k_end));
    a.jcc(Cond::B, tail_loop);
    a.bind(k_done);
    if spill {
        for (i, &g) in SAVED_STATE.iter().enumerate() {
            a.load64(g, mem(RSP, frame.save_slots + 8 * i as i32));
        }
    }
    for s in 1..sets {
        for i in 0..rows {
            for j in 0..hb {
                V::add(a, acc(0, i, j), acc(0, i, j), acc(s, i, j));
            }
        }
    }

    // Epilogue, in chunks of at most 6 rows (y row pointers in r8..r13,
    // aliased past m): bias pointer and valid columns first, as the chunks
    // keep rsi and rcx.
    if k.bias {
        column_offset(a, hp, 4);
        a.load64(RSI, mem(RDI, MM_BIAS));
        a.add(RSI, RAX);
    }
    valid_columns(a, hp);
    let store = |finalize, rows| Store {
        rows,
        hb,
        y: k.y,
        finalize,
        bias: k.bias,
        activation: k.activation,
        row_check: false,
        tmp: V::bias_tmp(),
    };
    let store_all = |a: &mut X86Asm, finalize: bool| {
        for first in (0..rows).step_by(XROWS.len()) {
            let chunk = (rows - first).min(XROWS.len());
            for (i, &yr) in XROWS[..chunk].iter().enumerate() {
                common::row_ptr(a, yr, first + i, true, MM_Y, MM_Y_STRIDE);
                column_offset(a, hp, ys);
                a.add(yr, RAX);
            }
            common::store_tile(
                a,
                &store(finalize, chunk),
                |i, j| acc(0, first + i, j),
                |i| XROWS[i],
            );
        }
    };
    if kc.is_some() {
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
    } else {
        store_all(a, true);
    }

    nest::rows_tail(a, row_loop, rows);
    nest::panels_tail(a, panel_loop, hp);
    nest::k_blocks_tail(a, kc_loop);
}
