//! The matmul family in cranelift IR: `y[e, h] = Σ_l x[e, l]·w[h, l]`
//! (+ scales, zero point, bias, activation), ABI [`crate::abi::MatmulArgs`].
//!
//! # Loop nest (one call: channels `n0 .. n0 + n`)
//!
//! ```text
//! for panel p in n0/hp .. ceil((n0+n)/hp)          weights stream once per row block
//!   for row block r0 in 0..m step ep
//!     ep × hp/4 accumulators (f32x4, or i32x4 + f32x4 for int8)
//!     for group g                                  per-group scales (and offsets)
//!       for l (float) / l-block of lp (int8) in the group
//!         MAC: splat(x[r, l]) · w[h0..h0+hp, l]    (float, dequantized in the loop)
//!              dot4(x[r, lb·lp..], w block)         (int8, sdot / pmaddwd tree)
//!       int8: acc_f += f32(acc_i)·scale + offset·Σqx
//!   epilogue per row < m: ·x scale (int8), + bias, activation, store columns < n0+n
//! ```
//!
//! Every address comes from the kernel's IR layouts (`super::layout`): the
//! CPU panels `[h/hp, l/lp, hp, lp]` and the GPU `[l/lp, h, lp]` are the
//! same code with other strides. Weights whose hp channels are contiguous
//! for one l load as vectors; others (4-bit codes, strided layouts, the
//! unpadded tail panel of a whole-`h` layout) are gathered lane by lane.
//! Rows past `m` in a row block reuse row `m-1` (float x is not padded) or
//! read the quantizer's zero padding (int8), and are never stored.

use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::types::{F32, F32X4, I8X16, I16X8, I32, I32X4, I64, I64X2};
use cranelift_codegen::ir::{
    ConstantData, Function, InstBuilder, StackSlot, StackSlotData, StackSlotKind, Value,
};
use cranelift_frontend::{FunctionBuilderContext, Variable};
use tessera_dsl::ir::{Activation, Format, Group, Kernel, LayoutDim, Matmul, Variant};

use super::DotLowering;
use super::build::{Fb, lanes, mem, new_function};
use super::layout::{AxisAddr, axis, tensor_addr};
use crate::abi::*;
use crate::artifact::EmitError;
use crate::tile::TileConfig;

/// Everything the emitter needs to know about one instance.
struct Plan<'k> {
    kernel: &'k Kernel,
    mm: &'k Matmul,
    x: Format,
    w: Format,
    y: Format,
    ep: i64,
    hp: i64,
    lp: i64,
    /// `Some(len)` for a fixed group size, None for one group per row.
    group: Option<i64>,
    panel_layout: bool,
    fused: bool,
    dot: DotLowering,
}

fn bad_tile(tile: &TileConfig, why: impl Into<String>) -> EmitError {
    EmitError::BadTile {
        tile: format!("{}x{}x{}", tile.ep, tile.hp, tile.lp),
        why: why.into(),
    }
}

fn unsupported(what: impl Into<String>) -> EmitError {
    EmitError::Unsupported {
        backend: "host",
        what: what.into(),
    }
}

/// Whether `kernel` takes `i8dyn` activations, i.e. needs the quantizer
/// ([`super::quantize`]) before each call.
pub fn has_quantizer(kernel: &Kernel) -> bool {
    kernel
        .as_matmul()
        .and_then(|m| kernel.tensor(&m.x))
        .is_some_and(|t| t.format == Format::I8Dyn)
}

/// Whether this emitter can index `kernel`'s layouts with `tile`.
pub fn check_tile(kernel: &Kernel, tile: &TileConfig) -> Result<(), EmitError> {
    plan(kernel, tile, DotLowering::Sdot, false).map(|_| ())
}

/// Build the cranelift function of a matmul kernel for `tile`: the default
/// loop, good for every m (the GEMV and flat GEMM variants).
///
/// `fused`: the ISA has a vector fma that needs no libcall.
pub fn build(
    kernel: &Kernel,
    tile: &TileConfig,
    dot: DotLowering,
    fused: bool,
) -> Result<Function, EmitError> {
    build_variant(kernel, tile, Variant::FlatGemm, dot, fused)
}

/// Build one variant. `Gemm` adds K blocks to the float loop where it
/// can (f32 output, weight vectors contiguous in h, l linear): each
/// panel's K block stays in L1 and the x block in L2 while the row blocks
/// stream past it, partial sums going through y. Everything else is the
/// default loop.
pub fn build_variant(
    kernel: &Kernel,
    tile: &TileConfig,
    variant: Variant,
    dot: DotLowering,
    fused: bool,
) -> Result<Function, EmitError> {
    let plan = plan(kernel, tile, dot, fused)?;
    let kc = (variant == Variant::Gemm).then(|| k_block(&plan, None));
    build_plan(&plan, kc)
}

/// The `Gemm` variant with K blocks of about `k_block` values (rounded to
/// whole unrolled trips and weight groups) instead of the L1-sized
/// default, so tests reach several K blocks with small k.
pub fn build_k_blocked(
    kernel: &Kernel,
    tile: &TileConfig,
    dot: DotLowering,
    fused: bool,
    k_block_len: usize,
) -> Result<Function, EmitError> {
    let plan = plan(kernel, tile, dot, fused)?;
    let kc = k_block(&plan, Some(k_block_len as i64));
    build_plan(&plan, Some(kc))
}

fn build_plan(plan: &Plan<'_>, kc: Option<i64>) -> Result<Function, EmitError> {
    let mut func = new_function(&plan.kernel.name);
    let mut fctx = FunctionBuilderContext::new();
    {
        let (mut fb, args) = Fb::start(&mut func, &mut fctx);
        emit(&mut fb, args, plan, kc)?;
        fb.finish();
    }
    Ok(func)
}

/// Bytes of one panel's K block in the blocked GEMM loop: an L2-resident
/// block (192 KiB of a 2 MiB L2), as in the x86 emitter, not an L1 one.
/// Each K block costs a pass of partial sums through y, which costs more
/// than reading the panel from L2: at M = 512, N = K = 4096 (6×8 tile,
/// same runs) 16 KiB blocks (k 512) gave 47 GFLOP/s, 64 KiB (2048) 52 and
/// one block for all of k 52.5.
const PANEL_BLOCK_BYTES: i64 = 192 * 1024;

/// k values per K block: the panel's block fills about
/// [`PANEL_BLOCK_BYTES`] (or about `wanted`), rounded up to whole unrolled
/// trips and weight groups (up, so that a k just past a multiple of the
/// trip does not leave a last block of a few steps).
fn k_block(plan: &Plan<'_>, wanted: Option<i64>) -> i64 {
    let per_l = plan.hp * i64::from(plan.w.bits()) / 8;
    let unroll = float_unroll(plan);
    let granule = match plan.group {
        Some(g) => unroll / gcd(unroll, g) * g,
        None => unroll,
    };
    let kc = wanted.unwrap_or(PANEL_BLOCK_BYTES / per_l).max(1);
    (kc + granule - 1) / granule * granule
}

fn gcd(a: i64, b: i64) -> i64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

fn plan<'k>(
    kernel: &'k Kernel,
    tile: &TileConfig,
    dot: DotLowering,
    fused: bool,
) -> Result<Plan<'k>, EmitError> {
    let mm = kernel
        .as_matmul()
        .ok_or_else(|| unsupported(format!("kernel `{}` is not a matmul", kernel.name)))?;
    if let Some(split) = crate::schedule::matmul_split(kernel) {
        return Err(unsupported(split));
    }
    crate::artifact::unsigned_codes_only(
        kernel,
        "host",
        "the cranelift loops subtract the zero point from unsigned codes",
    )?;
    let fmt = |name: &str| {
        kernel
            .tensor(name)
            .map(|t| t.format)
            .ok_or_else(|| unsupported(format!("missing tensor `{name}`")))
    };
    let (x, w, y) = (fmt(&mm.x)?, fmt(&mm.w)?, fmt(&mm.y)?);
    let (ep, hp, lp) = (tile.ep as i64, tile.hp as i64, tile.lp as i64);
    if !matches!(y, Format::F32 | Format::F16 | Format::BF16) {
        return Err(unsupported(format!("output format {y}")));
    }
    if let Some(b) = &mm.epilogue.bias
        && kernel.tensor(b).is_some_and(|t| t.format != Format::F32)
    {
        return Err(unsupported(
            "a bias that is not f32 (the cranelift loops read the bias as f32)",
        ));
    }
    if w.has_f16_params() {
        return Err(unsupported(format!(
            "weights {w}: f16 group parameters (the cranelift loops read f32 parameters)"
        )));
    }
    if matches!(w, Format::U4Sym(..)) {
        return Err(unsupported(format!(
            "weights {w}: u4sym's implied zero point (the cranelift loops fold stored offsets only)"
        )));
    }
    // The description's fields first (a refusal names the field), then
    // the tile.
    if !(1..=16).contains(&ep) {
        return Err(bad_tile(tile, "ep must be 1..=16"));
    }
    if hp < 4 || hp % 4 != 0 || hp > 64 {
        return Err(bad_tile(
            tile,
            "hp must be a multiple of 4 (f32x4 lanes), at most 64",
        ));
    }
    if lp < 1 {
        return Err(bad_tile(tile, "lp must be positive"));
    }
    let group = match w.group() {
        Some(Group::Size(g)) => Some(i64::from(g)),
        _ => None,
    };
    let panel_layout = kernel
        .tensor(&mm.w)
        .is_some_and(|t| t.layout.is_panelled_by(&mm.h));
    let plan = Plan {
        kernel,
        mm,
        x,
        w,
        y,
        ep,
        hp,
        lp,
        group,
        panel_layout,
        fused,
        dot,
    };
    let pair_transpose = kernel
        .tensor(&mm.w)
        .is_some_and(|t| t.layout.int4_pair_transpose);
    if pair_transpose && x != Format::I8Dyn {
        return Err(unsupported(format!(
            "the int4 pair transpose (w layout field pair_transpose) with {x} activations: the cranelift float loops read 4-bit codes in order"
        )));
    }
    match x {
        Format::I8Dyn => {
            if !matches!(
                w,
                Format::U4Asym(..) | Format::I8Sym(..) | Format::I8Asym(..)
            ) {
                return Err(unsupported(format!("i8dyn activations with {w} weights")));
            }
            check_int8(&plan, tile)?;
        }
        Format::F32 | Format::F16 | Format::BF16 => {
            if matches!(w, Format::I8Dyn) {
                return Err(unsupported("i8dyn weights"));
            }
        }
        other => return Err(unsupported(format!("activation format {other}"))),
    }
    Ok(plan)
}

/// The int8 path indexes whole lp-runs of x and hp×lp blocks of w.
fn check_int8(plan: &Plan<'_>, tile: &TileConfig) -> Result<(), EmitError> {
    let lp = plan.lp;
    if !matches!(lp, 4 | 8 | 16) {
        return Err(bad_tile(tile, "the int8 dot needs lp of 4, 8 or 16"));
    }
    let block_codes = plan.hp * lp;
    let bits = plan.w.bits() as i64;
    if (block_codes * bits) % 128 != 0 || (bits == 4 && block_codes % 32 != 0) {
        return Err(bad_tile(
            tile,
            "hp·lp weight codes must fill whole 128-bit vectors",
        ));
    }
    if let Some(g) = plan.group
        && g % lp != 0
    {
        return Err(bad_tile(
            tile,
            format!("group size {g} is not a multiple of lp"),
        ));
    }
    let tile_axis = |name: &str| plan.kernel.tile(name).map(|t| t.axis.clone());
    let inner = |d: Option<&LayoutDim>, axis: &str| match d {
        Some(LayoutDim::Inner { tile }) => tile_axis(tile).as_deref() == Some(axis),
        _ => false,
    };
    let xt = plan.kernel.tensor(&plan.mm.x).map(|t| &t.layout.dims);
    let wt = plan.kernel.tensor(&plan.mm.w).map(|t| &t.layout.dims);
    let x_ok = xt.is_some_and(|d| inner(d.last(), &plan.mm.l));
    let w_ok = wt.is_some_and(|d| {
        d.len() >= 2 && inner(d.last(), &plan.mm.l) && inner(d.get(d.len() - 2), &plan.mm.h)
    });
    if !x_ok {
        return Err(unsupported(
            "the x layout: i8dyn activations must use a layout with lp innermost, e.g. [e/ep, l/lp, ep, lp]",
        ));
    }
    if !w_ok {
        return Err(unsupported(
            "the w layout: int8 weights must use a weight layout ending in [.., hp, lp] blocks, e.g. [h/hp, l/lp, hp, lp]",
        ));
    }
    Ok(())
}

/// Run-time values of the argument block.
struct Args {
    x: Value,
    x_stride: Value,
    x_scales: Value,
    x_sums: Value,
    w: Value,
    w_params: Value,
    bias: Value,
    y: Value,
    y_stride: Value,
    m: Value,
    k: Value,
    n_end: Value,
    n_total: Value,
}

/// `kc`: K blocks of kc values (the `Gemm` variant) where the float loop
/// can have them.
fn emit(fb: &mut Fb<'_>, a: Value, plan: &Plan<'_>, kc: Option<i64>) -> Result<(), EmitError> {
    let args = Args {
        x: fb.arg(a, I64, MM_X),
        x_stride: fb.arg(a, I64, MM_X_STRIDE),
        x_scales: fb.arg(a, I64, MM_X_SCALES),
        x_sums: fb.arg(a, I64, MM_X_SUMS),
        w: fb.arg(a, I64, MM_W),
        w_params: fb.arg(a, I64, MM_W_PARAMS),
        bias: fb.arg(a, I64, MM_BIAS),
        y: fb.arg(a, I64, MM_Y),
        y_stride: fb.arg(a, I64, MM_Y_STRIDE),
        m: fb.arg(a, I64, MM_M),
        k: fb.arg(a, I64, MM_K),
        n_end: {
            let n = fb.arg(a, I64, MM_N);
            let n0 = fb.arg(a, I64, MM_N0);
            fb.b.ins().iadd(n0, n)
        },
        n_total: fb.arg(a, I64, MM_N_TOTAL),
    };
    let n0 = fb.arg(a, I64, MM_N0);
    let mm = plan.mm;
    let tiles = tile_sizes(plan);
    let tiles: Vec<(&str, i64)> = tiles.iter().map(|(n, s)| (n.as_str(), *s)).collect();
    let w_addr = tensor_addr(
        fb,
        plan.kernel,
        &mm.w,
        &[(mm.h.as_str(), args.n_total), (mm.l.as_str(), args.k)],
        &tiles,
    )?;
    let h_addr = *axis(&w_addr, &mm.h)?;
    let l_addr = *axis(&w_addr, &mm.l)?;
    let x_addr = if plan.x == Format::I8Dyn {
        // The quantizer's output has m rounded up to whole ep tiles.
        let m_pad = {
            let t = fb.div_ceil(args.m, plan.ep);
            fb.b.ins().imul_imm_s(t, plan.ep)
        };
        let v = tensor_addr(
            fb,
            plan.kernel,
            &mm.x,
            &[(mm.e.as_str(), m_pad), (mm.l.as_str(), args.k)],
            &tiles,
        )?;
        Some((*axis(&v, &mm.e)?, *axis(&v, &mm.l)?))
    } else {
        None
    };
    let hp = plan.hp;
    let groups = match plan.group {
        Some(g) => fb.div_ceil(args.k, g),
        None => fb.i64c(1),
    };
    let p_begin = fb.udiv_c(n0, hp);
    let p_end = fb.div_ceil(args.n_end, hp);
    let zero = fb.i64c(0);
    let whole_k = KRange {
        lo: zero,
        hi: args.k,
        block: None,
    };
    let panel = |fb: &mut Fb<'_>, p: Value| {
        let h0 = fb.mul_c(p, hp);
        Panel {
            p,
            h0,
            groups,
            h_addr,
            l_addr,
        }
    };
    // Every row block of a panel, over kr.
    let row_blocks = |fb: &mut Fb<'_>, ctx: &Panel, kr: KRange| {
        let m = args.m;
        fb.for_range(zero, m, plan.ep, |fb, r0| match x_addr {
            Some((e_addr, xl_addr)) => int8_block(fb, plan, &args, ctx, r0, e_addr, xl_addr),
            None => {
                if h_addr.is_whole() {
                    // An unpadded channel axis: the tail panel must not read
                    // past n_total, so it takes the clamped gather path.
                    let h_end = fb.b.ins().iadd_imm_s(ctx.h0, hp);
                    let full =
                        fb.b.ins()
                            .icmp(IntCC::SignedLessThanOrEqual, h_end, args.n_total);
                    fb.if_else(
                        full,
                        |fb| float_block(fb, plan, &args, ctx, r0, false, kr),
                        |fb| float_block(fb, plan, &args, ctx, r0, true, kr),
                    );
                } else {
                    float_block(fb, plan, &args, ctx, r0, false, kr);
                }
            }
        });
    };
    let can_block = x_addr.is_none()
        && plan.y == Format::F32
        && plan.w.bits() >= 8
        && h_addr.step_const() == Some(1)
        && l_addr.linear().is_some();
    let Some(kc) = kc.filter(|_| can_block) else {
        fb.for_range(p_begin, p_end, 1, |fb, p| {
            let ctx = panel(fb, p);
            row_blocks(fb, &ctx, whole_k);
        });
        return Ok(());
    };
    // K blocks → panels → row blocks. A full panel does one K block per
    // pass (partial sums through y); the tail panel, whose columns past
    // n0 + n must not be read from y, does all of k in the first pass.
    let nkb = fb.div_ceil(args.k, kc);
    fb.for_range(zero, nkb, 1, |fb, kb| {
        let lo = fb.mul_c(kb, kc);
        let hi = fb.b.ins().iadd_imm_s(lo, kc);
        let hi = fb.imin(hi, args.k);
        let first = fb.b.ins().icmp_imm_s(IntCC::Equal, kb, 0);
        let last = fb.b.ins().icmp(IntCC::Equal, hi, args.k);
        let kr = KRange {
            lo,
            hi,
            block: Some((first, last)),
        };
        fb.for_range(p_begin, p_end, 1, |fb, p| {
            let ctx = panel(fb, p);
            let h_end = fb.b.ins().iadd_imm_s(ctx.h0, hp);
            let full =
                fb.b.ins()
                    .icmp(IntCC::SignedLessThanOrEqual, h_end, args.n_end);
            fb.if_else(
                full,
                |fb| {
                    fb.for_range(zero, args.m, plan.ep, |fb, r0| {
                        float_block(fb, plan, &args, &ctx, r0, false, kr)
                    })
                },
                |fb| fb.if_then(first, |fb| row_blocks(fb, &ctx, whole_k)),
            );
        });
    });
    Ok(())
}

/// The l range one row block reduces over: all of k, or one K block of
/// the blocked GEMM loop.
#[derive(Clone, Copy)]
struct KRange {
    lo: Value,
    hi: Value,
    /// K blocks only: whether this block is the first (accumulators start
    /// at zero, else at the partial sums in y) and the last (the epilogue
    /// runs; before it, partial sums are stored as they are).
    block: Option<(Value, Value)>,
}

fn tile_sizes(plan: &Plan<'_>) -> Vec<(String, i64)> {
    let mm = plan.mm;
    plan.kernel
        .schedule
        .tiles
        .iter()
        .filter_map(|tv| {
            let s = if tv.axis == mm.e {
                plan.ep
            } else if tv.axis == mm.h {
                plan.hp
            } else if tv.axis == mm.l {
                plan.lp
            } else {
                return None;
            };
            Some((tv.name.clone(), s))
        })
        .collect()
}

struct Panel {
    p: Value,
    h0: Value,
    groups: Value,
    h_addr: AxisAddr,
    l_addr: AxisAddr,
}

/// Byte address of parameter `which` (0 scales, 1 offsets) of group `g`,
/// column `h0 + j`, per the module doc of [`crate::host`].
fn param_addr(
    fb: &mut Fb<'_>,
    plan: &Plan<'_>,
    args: &Args,
    pan: &Panel,
    g: Value,
    which: i64,
    j: i64,
) -> Value {
    let hp = plan.hp;
    let asym = plan.w.is_asymmetric();
    let index = if plan.panel_layout {
        // [panel][which][groups][hp]
        let per_panel =
            fb.b.ins()
                .imul_imm_s(pan.groups, hp * if asym { 2 } else { 1 });
        let base = fb.b.ins().imul(pan.p, per_panel);
        let which_off = fb.b.ins().imul_imm_s(pan.groups, hp * which);
        let gi = fb.b.ins().imul_imm_s(g, hp);
        let t = fb.b.ins().iadd(base, which_off);
        let t = fb.b.ins().iadd(t, gi);
        fb.b.ins().iadd_imm_s(t, j)
    } else {
        // [which][groups][n_pad]
        let n_pad = {
            let t = fb.div_ceil(args.n_total, hp);
            fb.b.ins().imul_imm_s(t, hp)
        };
        let row = fb.b.ins().imul(g, n_pad);
        let which_off = if which == 0 {
            fb.i64c(0)
        } else {
            fb.b.ins().imul(pan.groups, n_pad)
        };
        let t = fb.b.ins().iadd(row, which_off);
        let t = fb.b.ins().iadd(t, pan.h0);
        fb.b.ins().iadd_imm_s(t, j)
    };
    fb.addr(args.w_params, index, 4)
}

/// The element of x at byte address `p + disp` as an f32x4 splat.
fn x_splat_at(fb: &mut Fb<'_>, plan: &Plan<'_>, p: Value, disp: i32) -> Value {
    match plan.x {
        Format::F32 => {
            let v = fb.load(F32, p, disp);
            fb.b.ins().splat(F32X4, v)
        }
        _ => {
            let bits = fb.b.ins().uload16(I32, mem(), p, disp);
            let v = fb.b.ins().splat(I32X4, bits);
            if plan.x == Format::F16 {
                fb.f16_to_f32(v)
            } else {
                fb.bf16_to_f32(v)
            }
        }
    }
}

/// Weight code lanes (i32x4, zero-extended storage bits) → f32 values v(q)
/// (float formats: the values; quantized: before scale and offset).
fn w_values(fb: &mut Fb<'_>, w: Format, lanes_u: Value) -> Value {
    match w {
        Format::F32 => fb.b.ins().bitcast(F32X4, lanes(), lanes_u),
        Format::F16 => fb.f16_to_f32(lanes_u),
        Format::BF16 => fb.bf16_to_f32(lanes_u),
        Format::Fp8E4M3 => fb.e4m3_to_f32(lanes_u),
        Format::Fp8E5M2 => fb.e5m2_to_f32(lanes_u),
        // u4sym is refused in `plan` (its zero point is not folded here).
        Format::U4Asym(..) | Format::U4Sym(..) => fb.b.ins().fcvt_from_uint(F32X4, lanes_u),
        Format::I8Sym(..) | Format::I8Asym(..) | Format::I8Dyn => {
            let s = fb.b.ins().ishl_imm_s(lanes_u, 24);
            let s = fb.b.ins().sshr_imm_s(s, 24);
            fb.b.ins().fcvt_from_sint(F32X4, s)
        }
        Format::E0M4(..) => {
            // 2 + q/8, exact.
            let q = fb.b.ins().fcvt_from_uint(F32X4, lanes_u);
            let eighth = fb.f32x4c(0.125);
            let two = fb.f32x4c(2.0);
            let t = fb.b.ins().fmul(q, eighth);
            fb.b.ins().fadd(t, two)
        }
    }
}

/// Storage lanes of 4 weights at element positions `pos0 + c·step`
/// (c = 0..4), gathered one by one; `clamp` limits the channel index.
fn gather_w(fb: &mut Fb<'_>, plan: &Plan<'_>, args: &Args, positions: [Value; 4]) -> Value {
    let bits = plan.w.bits();
    let mut v = fb.i32x4c(0);
    for (c, pos) in positions.into_iter().enumerate() {
        let x = if bits == 4 {
            let byte = fb.b.ins().ushr_imm_s(pos, 1);
            let p = fb.b.ins().iadd(args.w, byte);
            let b = fb.load_u32(p, 8);
            let odd = fb.b.ins().band_imm_s(pos, 1);
            let sh = fb.b.ins().imul_imm_s(odd, 4);
            let sh = fb.b.ins().ireduce(I32, sh);
            let b = fb.b.ins().ushr(b, sh);
            fb.b.ins().band_imm_s(b, 15)
        } else {
            let p = fb.addr(args.w, pos, i64::from(bits / 8));
            fb.load_u32(p, bits)
        };
        v = fb.b.ins().insertlane(v, x, c as u8);
    }
    v
}

#[allow(clippy::too_many_arguments)]
fn float_block(
    fb: &mut Fb<'_>,
    plan: &Plan<'_>,
    args: &Args,
    pan: &Panel,
    r0: Value,
    clamp_cols: bool,
    kr: KRange,
) {
    let (ep, hp) = (plan.ep as usize, plan.hp as usize);
    let nv = hp / 4;
    let quant = plan.w.is_quantized();
    let asym = plan.w.is_asymmetric();
    // Row pointers (rows past m reuse row m-1).
    let m1 = fb.b.ins().iadd_imm_s(args.m, -1);
    let rows: Vec<Value> = (0..ep)
        .map(|i| {
            let r = fb.b.ins().iadd_imm_s(r0, i as i64);
            let r = fb.imin(r, m1);
            let off = fb.b.ins().imul(r, args.x_stride);
            fb.b.ins().iadd(args.x, off)
        })
        .collect();
    let zero = fb.f32x4c(0.0);
    let acc: Vec<Variable> = (0..ep * nv).map(|_| fb.var(F32X4, zero)).collect();
    if let Some((first, _)) = kr.block {
        // Later K blocks start from the partial sums in y (full panels
        // only; rows past m read row m-1 and are never stored).
        let later = fb.b.ins().bxor_imm_s(first, 1);
        fb.if_then(later, |fb| {
            for i in 0..ep {
                let r = fb.b.ins().iadd_imm_s(r0, i as i64);
                let r = fb.imin(r, m1);
                let off = fb.b.ins().imul(r, args.y_stride);
                let yrow = fb.b.ins().iadd(args.y, off);
                let yp = fb.addr(yrow, pan.h0, 4);
                for j in 0..nv {
                    let v = fb.load(F32X4, yp, 16 * j as i32);
                    fb.set(acc[i * nv + j], v);
                }
            }
        });
    }
    let (h_base, h_step, h_step_c) = pan.h_addr.tile_start(fb, pan.h0);
    let contiguous = h_step_c == Some(1) && !clamp_cols && plan.w.bits() >= 8;
    // Channel positions of each lane (gather path), clamped to n_total-1.
    let n_last = fb.b.ins().iadd_imm_s(args.n_total, -1);
    let col_pos: Vec<Value> = if contiguous {
        Vec::new()
    } else {
        (0..hp)
            .map(|j| {
                if clamp_cols {
                    let h = fb.b.ins().iadd_imm_s(pan.h0, j as i64);
                    let h = fb.imin(h, n_last);
                    pan.h_addr.at(fb, h)
                } else {
                    let t = fb.b.ins().imul_imm_s(h_step, j as i64);
                    fb.b.ins().iadd(h_base, t)
                }
            })
            .collect()
    };
    let streamed = contiguous.then(|| pan.l_addr.linear()).flatten();
    // The groups that overlap kr (K blocks hold whole groups), each
    // reduced over its part of kr.
    let (glen, g_lo, g_hi) = match plan.group {
        Some(g) => (fb.i64c(g), fb.udiv_c(kr.lo, g), fb.div_ceil(kr.hi, g)),
        None => (args.k, fb.i64c(0), fb.i64c(1)),
    };
    let x_slot = (plan.x != Format::F32).then(|| {
        fb.b.create_sized_stack_slot(StackSlotData::new(
            StackSlotKind::ExplicitSlot,
            16 * ep as u32,
            4,
        ))
    });
    let mac = Mac {
        plan,
        rows: &rows,
        acc: &acc,
        x_slot,
    };
    fb.for_range(g_lo, g_hi, 1, |fb, g| {
        let mut params = Vec::new();
        if quant {
            for j in 0..nv {
                let ps = param_addr(fb, plan, args, pan, g, 0, 4 * j as i64);
                let s = fb.load(F32X4, ps, 0);
                let o = if asym {
                    let po = param_addr(fb, plan, args, pan, g, 1, 4 * j as i64);
                    Some(fb.load(F32X4, po, 0))
                } else {
                    None
                };
                params.push((s, o));
            }
        }
        let g_start = fb.b.ins().imul(g, glen);
        let l_lo = fb.b.ins().smax(g_start, kr.lo);
        let l_hi = fb.b.ins().iadd(g_start, glen);
        let l_hi = fb.imin(l_hi, kr.hi);
        if let Some(l_stride) = streamed {
            mac.streamed(fb, args, h_base, l_stride, &params, l_lo, l_hi);
            return;
        }
        fb.for_range(l_lo, l_hi, 1, |fb, l| {
            let pos_l = pan.l_addr.at(fb, l);
            let xb = i64::from(plan.x.bits() / 8);
            let xo = fb.mul_c(l, xb);
            mac.step_with(fb, xo, 0, |fb, j| {
                let lanes_u = if col_pos.is_empty() {
                    let pos = fb.b.ins().iadd(h_base, pos_l);
                    let pos = fb.b.ins().iadd_imm_s(pos, 4 * j as i64);
                    let bytes = i64::from(plan.w.bits() / 8);
                    let p = fb.addr(args.w, pos, bytes);
                    fb.load_lanes_u(p, 0, plan.w.bits())
                } else {
                    let ps: Vec<Value> = (0..4)
                        .map(|c| fb.b.ins().iadd(col_pos[4 * j + c], pos_l))
                        .collect();
                    gather_w(fb, plan, args, [ps[0], ps[1], ps[2], ps[3]])
                };
                let v = w_values(fb, plan.w, lanes_u);
                dequant(fb, v, params.get(j))
            });
        });
    });
    let store = |fb: &mut Fb<'_>| {
        for i in 0..ep {
            let vals: Vec<Value> = (0..nv).map(|j| fb.get(acc[i * nv + j])).collect();
            store_row(fb, plan, args, pan, r0, i as i64, vals);
        }
    };
    match kr.block {
        None => store(fb),
        Some((_, last)) => fb.if_else(last, store, |fb| {
            // A partial sum: full panel, f32, no epilogue yet.
            for i in 0..ep {
                let r = fb.b.ins().iadd_imm_s(r0, i as i64);
                let valid = fb.b.ins().icmp(IntCC::SignedLessThan, r, args.m);
                let vals: Vec<Value> = (0..nv).map(|j| fb.get(acc[i * nv + j])).collect();
                fb.if_then(valid, |fb| {
                    let off = fb.b.ins().imul(r, args.y_stride);
                    let yrow = fb.b.ins().iadd(args.y, off);
                    let yp = fb.addr(yrow, pan.h0, 4);
                    for (j, &v) in vals.iter().enumerate() {
                        fb.store(v, yp, 16 * j as i32);
                    }
                });
            }
        }),
    }
}

/// `v·scale (+ offset)` for quantized weights; `v` for float ones.
fn dequant(fb: &mut Fb<'_>, v: Value, param: Option<&(Value, Option<Value>)>) -> Value {
    let Some(&(s, o)) = param else { return v };
    let v = fb.b.ins().fmul(v, s);
    match o {
        Some(o) => fb.b.ins().fadd(v, o),
        None => v,
    }
}

/// Reduction steps of the float loop per trip of its unrolled loop.
///
/// Cranelift's x86-64 `fma` overwrites a multiplicand (`vfmadd213ps` /
/// `vfmadd132ps`, never the addend), so each result lands in the register
/// of its fresh broadcast and the accumulators move through the register
/// file as the trip goes on; regalloc2 has to bring them back to the
/// loop-header registers on the back edge, and depending on how the
/// trip's rotation falls it does so with moves, or with spills. Counted
/// in the GEMM loop's machine code (12 accumulators: 4×12 and 6×8): 4
/// steps gave 6–12 moves and 4–8 spill slots per trip, 8 steps 4 moves,
/// 12 steps none. Grouped weights reduce a group at a time, so they take
/// 8 steps, which divides the usual group sizes.
fn float_unroll(plan: &Plan<'_>) -> i64 {
    match plan.group {
        Some(g) if g % 12 != 0 => 8,
        _ => 12,
    }
}

/// The float MAC of one row block: `acc[i][j] += x[row i, l]·b[j]`.
///
/// Column by column: each weight vector `b[j]` is loaded (or dequantized)
/// just before its ep multiplies and dies after them, so one B register
/// is live besides the accumulators, and every multiply gets its own
/// broadcast of x (a `vbroadcastss` from memory that the x86-64 fma then
/// overwrites in place: see [`float_unroll`]), so one A register is. The
/// tile's register count is accumulators + 2 ([`super::CLIF_X86`]).
/// A one-row tile (GEMV) instead broadcasts x once per step and makes the
/// weight vector the overwritten operand (cranelift folds its load into a
/// `vfmadd132ps` on a copy of the broadcast): a third fewer instructions
/// and half the loads, which took the f32 GEMV from 0.83× to 0.91–0.94×
/// of the x86 JIT's (`clif_timing`, M = 1, weights streamed from DRAM).
/// Activations that are not f32 are widened once per row and step and
/// parked as f32 in a stack slot, which the broadcasts then read.
struct Mac<'a, 'k> {
    plan: &'a Plan<'k>,
    /// Byte address of each row of x (at l = 0).
    rows: &'a [Value],
    acc: &'a [Variable],
    /// 16 bytes per row: the step's widened x (non-f32 activations).
    x_slot: Option<StackSlot>,
}

impl Mac<'_, '_> {
    /// One step: `b(fb, j)` gives weight vector j (emitted where it is
    /// needed); x is read at byte offset `xo + disp` of each row.
    fn step_with(
        &self,
        fb: &mut Fb<'_>,
        xo: Value,
        disp: i32,
        mut b: impl FnMut(&mut Fb<'_>, usize) -> Value,
    ) {
        let plan = self.plan;
        let nv = self.acc.len() / self.rows.len();
        let slot = self.x_slot.map(|s| fb.b.ins().stack_addr(I64, s, 0));
        let sources: Vec<(Value, i32)> = self
            .rows
            .iter()
            .enumerate()
            .map(|(i, &row)| {
                let p = fb.b.ins().iadd(row, xo);
                match slot {
                    None => (p, disp),
                    Some(slot) => {
                        let v = x_splat_at(fb, plan, p, disp);
                        let off = 16 * i as i32;
                        fb.store(v, slot, off);
                        (slot, off)
                    }
                }
            })
            .collect();
        if let [(p, d)] = sources[..] {
            // One row: each weight vector has one multiply, so it is the
            // operand the x86-64 fma overwrites, and one broadcast of x
            // serves the whole step.
            let v = fb.load(F32, p, d);
            let a = fb.b.ins().splat(F32X4, v);
            for j in 0..nv {
                let bj = b(fb, j);
                let c = fb.get(self.acc[j]);
                let r = fb.madd(plan.fused, bj, a, c);
                fb.set(self.acc[j], r);
            }
            return;
        }
        for j in 0..nv {
            let bj = b(fb, j);
            for (i, &(p, d)) in sources.iter().enumerate() {
                let v = fb.load(F32, p, d);
                let a = fb.b.ins().splat(F32X4, v);
                let c = fb.get(self.acc[i * nv + j]);
                let r = fb.madd(plan.fused, a, bj, c);
                fb.set(self.acc[i * nv + j], r);
            }
        }
    }

    /// One step: the weight vectors at byte address `wp + disp`, times
    /// every row.
    fn step(
        &self,
        fb: &mut Fb<'_>,
        params: &[(Value, Option<Value>)],
        wp: Value,
        wdisp: i32,
        xo: Value,
        xdisp: i32,
    ) {
        let plan = self.plan;
        let wb = (plan.w.bits() / 8) as i32;
        self.step_with(fb, xo, xdisp, |fb, j| {
            let off = wdisp + 4 * j as i32 * wb;
            let v = if plan.w == Format::F32 {
                fb.load(F32X4, wp, off)
            } else {
                let lanes_u = fb.load_lanes_u(wp, off, plan.w.bits());
                w_values(fb, plan.w, lanes_u)
            };
            dequant(fb, v, params.get(j))
        });
    }

    /// l in `l_lo .. l_hi` with the panel's hp channels contiguous at each
    /// l and l at `l·stride`: a weight pointer and an x offset advance by
    /// a step (nothing is recomputed from l), [`float_unroll`] steps per
    /// trip, then the remaining steps one by one.
    #[allow(clippy::too_many_arguments)]
    fn streamed(
        &self,
        fb: &mut Fb<'_>,
        args: &Args,
        h_base: Value,
        (l_stride, l_stride_c): (Value, Option<i64>),
        params: &[(Value, Option<Value>)],
        l_lo: Value,
        l_hi: Value,
    ) {
        let plan = self.plan;
        let wb = i64::from(plan.w.bits() / 8);
        let xb = i64::from(plan.x.bits() / 8);
        let unroll = float_unroll(plan);
        // Weight bytes per step of l: an immediate when the layout fixes it.
        let w_step_c = l_stride_c
            .map(|c| c * wb)
            .filter(|c| c * unroll < i64::from(i32::MAX / 2));
        let w_step = match w_step_c {
            Some(c) => fb.i64c(c),
            None => fb.mul_c(l_stride, wb),
        };
        let pos = match l_stride_c {
            Some(c) => fb.mul_c(l_lo, c),
            None => fb.b.ins().imul(l_lo, l_stride),
        };
        let pos = fb.b.ins().iadd(h_base, pos);
        let w0 = fb.addr(args.w, pos, wb);
        let x0 = fb.mul_c(l_lo, xb);
        let x_end = fb.mul_c(l_hi, xb);
        let wp = fb.var(I64, w0);
        let xo = fb.var(I64, x0);
        // Whole trips of `unroll` steps.
        let count = fb.b.ins().isub(l_hi, l_lo);
        let trips = fb.udiv_c(count, unroll);
        let main_bytes = fb.mul_c(trips, unroll * xb);
        let x_main_end = fb.b.ins().iadd(x0, main_bytes);
        let more = |end: Value| {
            move |fb: &mut Fb<'_>| {
                let x = fb.get(xo);
                fb.b.ins().icmp(IntCC::NotEqual, x, end)
            }
        };
        fb.while_loop(more(x_main_end), |fb| {
            let w = fb.get(wp);
            let x = fb.get(xo);
            let mut w_u = w;
            for u in 0..unroll {
                let (wbase, wdisp) = match w_step_c {
                    Some(c) => (w, (u * c) as i32),
                    None => {
                        if u > 0 {
                            w_u = fb.b.ins().iadd(w_u, w_step);
                        }
                        (w_u, 0)
                    }
                };
                self.step(fb, params, wbase, wdisp, x, (u * xb) as i32);
            }
            let w_next = match w_step_c {
                Some(c) => fb.b.ins().iadd_imm_s(w, c * unroll),
                None => fb.b.ins().iadd(w_u, w_step),
            };
            let x_next = fb.b.ins().iadd_imm_s(x, unroll * xb);
            fb.set(wp, w_next);
            fb.set(xo, x_next);
        });
        // The last (l_hi - l_lo) % unroll steps.
        fb.while_loop(more(x_end), |fb| {
            let w = fb.get(wp);
            let x = fb.get(xo);
            self.step(fb, params, w, 0, x, 0);
            let w_next = fb.b.ins().iadd(w, w_step);
            let x_next = fb.b.ins().iadd_imm_s(x, xb);
            fb.set(wp, w_next);
            fb.set(xo, x_next);
        });
    }
}

/// One i8 dot step: `acc + dot4(a, b)` per i32 lane, as the tree the ISA's
/// lowering folds into one instruction.
fn dot4(fb: &mut Fb<'_>, lowering: DotLowering, acc: Value, a: Value, b: Value) -> Value {
    match lowering {
        DotLowering::Sdot => {
            let al = fb.b.ins().swiden_low(a);
            let bl = fb.b.ins().swiden_low(b);
            let lo = fb.b.ins().imul(al, bl);
            let ah = fb.b.ins().swiden_high(a);
            let bh = fb.b.ins().swiden_high(b);
            let hi = fb.b.ins().imul(ah, bh);
            let lo_l = fb.b.ins().swiden_low(lo);
            let lo_h = fb.b.ins().swiden_high(lo);
            let t1 = fb.b.ins().iadd_pairwise(lo_l, lo_h);
            let hi_l = fb.b.ins().swiden_low(hi);
            let hi_h = fb.b.ins().swiden_high(hi);
            let t2 = fb.b.ins().iadd_pairwise(hi_l, hi_h);
            let t = fb.b.ins().iadd_pairwise(t1, t2);
            fb.b.ins().iadd(t, acc)
        }
        DotLowering::Pmaddwd => {
            let al = fb.b.ins().swiden_low(a);
            let bl = fb.b.ins().swiden_low(b);
            let ah = fb.b.ins().swiden_high(a);
            let bh = fb.b.ins().swiden_high(b);
            let d1 = {
                let x0 = fb.b.ins().swiden_low(al);
                let y0 = fb.b.ins().swiden_low(bl);
                let p0 = fb.b.ins().imul(x0, y0);
                let x1 = fb.b.ins().swiden_high(al);
                let y1 = fb.b.ins().swiden_high(bl);
                let p1 = fb.b.ins().imul(x1, y1);
                fb.b.ins().iadd_pairwise(p0, p1)
            };
            let d2 = {
                let x0 = fb.b.ins().swiden_low(ah);
                let y0 = fb.b.ins().swiden_low(bh);
                let p0 = fb.b.ins().imul(x0, y0);
                let x1 = fb.b.ins().swiden_high(ah);
                let y1 = fb.b.ins().swiden_high(bh);
                let p1 = fb.b.ins().imul(x1, y1);
                fb.b.ins().iadd_pairwise(p0, p1)
            };
            let t = fb.b.ins().iadd_pairwise(d1, d2);
            fb.b.ins().iadd(acc, t)
        }
    }
}

/// The i8x16 weight vectors of one hp×lp block at byte address `p`.
fn w_block(fb: &mut Fb<'_>, plan: &Plan<'_>, p: Value, pair_transpose: bool) -> Vec<Value> {
    let block_bytes = plan.hp * plan.lp * i64::from(plan.w.bits()) / 8;
    let loads = (block_bytes / 16) as i32;
    let mut out = Vec::new();
    for v in 0..loads {
        let raw = fb.load(I8X16, p, 16 * v);
        if plan.w.bits() == 8 {
            out.push(raw);
            continue;
        }
        let mask = {
            let c = fb.b.ins().iconst(cranelift_codegen::ir::types::I8, 15);
            fb.b.ins().splat(I8X16, c)
        };
        let lo = fb.b.ins().band(raw, mask);
        let hi = fb.b.ins().ushr_imm_s(raw, 4);
        if pair_transpose {
            out.push(lo);
            out.push(hi);
        } else {
            // byte j = code 2j | code 2j+1 << 4: interleave lo and hi.
            let m0: Vec<u8> = (0..8).flat_map(|j| [j, 16 + j]).collect();
            let m1: Vec<u8> = (8..16).flat_map(|j| [j, 16 + j]).collect();
            for m in [m0, m1] {
                let imm = fb.b.func.dfg.immediates.push(ConstantData::from(m));
                out.push(fb.b.ins().shuffle(lo, hi, imm));
            }
        }
    }
    out
}

/// `lp` activation bytes at `p` repeated across 16 bytes.
fn x_run(fb: &mut Fb<'_>, lp: i64, p: Value) -> Value {
    match lp {
        4 => {
            let v = fb.load(I32, p, 0);
            let s = fb.b.ins().splat(I32X4, v);
            fb.b.ins().bitcast(I8X16, lanes(), s)
        }
        8 => {
            let v = fb.load(I64, p, 0);
            let s = fb.b.ins().splat(I64X2, v);
            fb.b.ins().bitcast(I8X16, lanes(), s)
        }
        _ => fb.load(I8X16, p, 0),
    }
}

#[allow(clippy::too_many_arguments)]
fn int8_block(
    fb: &mut Fb<'_>,
    plan: &Plan<'_>,
    args: &Args,
    pan: &Panel,
    r0: Value,
    e_addr: AxisAddr,
    xl_addr: AxisAddr,
) {
    let (ep, lp) = (plan.ep as usize, plan.lp);
    let nv = (plan.hp * lp / 16) as usize;
    let cols_per_vec = (16 / lp) as usize;
    let lanes_per_col = (lp / 4) as usize;
    let asym = plan.w.is_asymmetric();
    let pair_transpose = plan
        .kernel
        .tensor(&plan.mm.w)
        .is_some_and(|t| t.layout.int4_pair_transpose);
    let zero_f = fb.f32x4c(0.0);
    let zero_i = fb.i32x4c(0);
    let accf: Vec<Variable> = (0..ep * nv).map(|_| fb.var(F32X4, zero_f)).collect();
    let acci: Vec<Variable> = (0..ep * nv).map(|_| fb.var(I32X4, zero_i)).collect();
    // Row bases in x (r0 is a multiple of ep).
    let (x_row0, x_row_step, _) = e_addr.tile_start(fb, r0);
    let x_rows: Vec<Value> = (0..ep)
        .map(|i| {
            let t = fb.b.ins().imul_imm_s(x_row_step, i as i64);
            fb.b.ins().iadd(x_row0, t)
        })
        .collect();
    let (w_panel, _, _) = pan.h_addr.tile_start(fb, pan.h0);
    let lp_v = fb.i64c(lp);
    let (_, x_lb_stride, _) = xl_addr.tile_start(fb, lp_v);
    let (_, w_lb_stride, _) = pan.l_addr.tile_start(fb, lp_v);
    let _ = (x_lb_stride, w_lb_stride);
    let lb_total = fb.div_ceil(args.k, lp);
    let blocks_per_group = match plan.group {
        Some(g) => fb.i64c(g / lp),
        None => lb_total,
    };
    let wbits = i64::from(plan.w.bits());
    let zero = fb.i64c(0);
    fb.for_range(zero, pan.groups, 1, |fb, g| {
        for &v in &acci {
            let z = fb.i32x4c(0);
            fb.set(v, z);
        }
        let lb_lo = fb.b.ins().imul(g, blocks_per_group);
        let lb_hi = fb.b.ins().iadd(lb_lo, blocks_per_group);
        let lb_hi = fb.imin(lb_hi, lb_total);
        fb.for_range(lb_lo, lb_hi, 1, |fb, lb| {
            let l = fb.b.ins().imul_imm_s(lb, lp);
            let wpos = pan.l_addr.at(fb, l);
            let wpos = fb.b.ins().iadd(w_panel, wpos);
            let wbyte = fb.b.ins().imul_imm_s(wpos, wbits);
            let wbyte = fb.b.ins().ushr_imm_s(wbyte, 3);
            let wp = fb.b.ins().iadd(args.w, wbyte);
            let wv = w_block(fb, plan, wp, pair_transpose);
            let xl = xl_addr.at(fb, l);
            for (i, &row) in x_rows.iter().enumerate() {
                let pos = fb.b.ins().iadd(row, xl);
                let p = fb.b.ins().iadd(args.x, pos);
                let a = x_run(fb, lp, p);
                for (v, &b) in wv.iter().enumerate() {
                    let c = fb.get(acci[i * nv + v]);
                    let r = dot4(fb, plan.dot, c, a, b);
                    fb.set(acci[i * nv + v], r);
                }
            }
        });
        // Fold the group: f32(acc)·scale (+ offset·Σqx, one lane per column).
        let mut sv = Vec::new();
        for v in 0..nv {
            let col0 = (v * cols_per_vec) as i64;
            let (s, o) = if lp == 4 {
                let ps = param_addr(fb, plan, args, pan, g, 0, col0);
                let s = fb.load(F32X4, ps, 0);
                let o = if asym {
                    let po = param_addr(fb, plan, args, pan, g, 1, col0);
                    Some(fb.load(F32X4, po, 0))
                } else {
                    None
                };
                (s, o)
            } else {
                let mut s = fb.f32x4c(0.0);
                let mut o = fb.f32x4c(0.0);
                for lane in 0..4 {
                    let col = col0 + (lane / lanes_per_col) as i64;
                    let ps = param_addr(fb, plan, args, pan, g, 0, col);
                    let sc = fb.load(F32, ps, 0);
                    s = fb.b.ins().insertlane(s, sc, lane as u8);
                    if asym && lane % lanes_per_col == 0 {
                        let po = param_addr(fb, plan, args, pan, g, 1, col);
                        let oc = fb.load(F32, po, 0);
                        o = fb.b.ins().insertlane(o, oc, lane as u8);
                    }
                }
                (s, asym.then_some(o))
            };
            sv.push((s, o));
        }
        for i in 0..ep {
            let sumq = if asym {
                let r = fb.b.ins().iadd_imm_s(r0, i as i64);
                let idx = fb.b.ins().imul(r, pan.groups);
                let idx = fb.b.ins().iadd(idx, g);
                let p = fb.addr(args.x_sums, idx, 4);
                let s = fb.load(I32, p, 0);
                let f = fb.b.ins().fcvt_from_sint(F32, s);
                Some(fb.b.ins().splat(F32X4, f))
            } else {
                None
            };
            for (v, &(s, o)) in sv.iter().enumerate() {
                let c = fb.get(acci[i * nv + v]);
                let cf = fb.b.ins().fcvt_from_sint(F32X4, c);
                let f = fb.get(accf[i * nv + v]);
                let mut r = fb.madd(plan.fused, cf, s, f);
                if let (Some(o), Some(q)) = (o, sumq) {
                    r = fb.madd(plan.fused, o, q, r);
                }
                fb.set(accf[i * nv + v], r);
            }
        }
    });
    // Epilogue: × x scale, columns gathered back into f32x4 of 4 channels.
    for i in 0..ep {
        let r = fb.b.ins().iadd_imm_s(r0, i as i64);
        let p = fb.addr(args.x_scales, r, 4);
        let sx = fb.load(F32, p, 0);
        let sx = fb.b.ins().splat(F32X4, sx);
        let scaled: Vec<Value> = (0..nv)
            .map(|v| {
                let a = fb.get(accf[i * nv + v]);
                fb.b.ins().fmul(a, sx)
            })
            .collect();
        let vals = if lanes_per_col == 1 {
            scaled
        } else {
            let mut cols = Vec::new();
            for &vec in &scaled {
                let l: Vec<Value> = (0..4).map(|k| fb.b.ins().extractlane(vec, k)).collect();
                for c in 0..cols_per_vec {
                    let mut s = l[c * lanes_per_col];
                    for k in 1..lanes_per_col {
                        s = fb.b.ins().fadd(s, l[c * lanes_per_col + k]);
                    }
                    cols.push(s);
                }
            }
            cols.chunks(4)
                .map(|c| {
                    let mut v = fb.f32x4c(0.0);
                    for (k, &x) in c.iter().enumerate() {
                        v = fb.b.ins().insertlane(v, x, k as u8);
                    }
                    v
                })
                .collect()
        };
        store_row(fb, plan, args, pan, r0, i as i64, vals);
    }
}

fn activation(fb: &mut Fb<'_>, act: Activation, v: Value) -> Value {
    match act {
        Activation::None => v,
        Activation::Relu => {
            let z = fb.f32x4c(0.0);
            fb.b.ins().fmax(v, z)
        }
        Activation::Silu => {
            let n = fb.b.ins().fneg(v);
            let e = fb.exp(n);
            let one = fb.f32x4c(1.0);
            let d = fb.b.ins().fadd(one, e);
            fb.b.ins().fdiv(v, d)
        }
    }
}

/// Bias, activation and store of row `r0 + i` (if `< m`), columns `h0 ..
/// h0 + hp` that are `< n0 + n`: vector stores for a whole panel, lane by
/// lane for the tail.
fn store_row(
    fb: &mut Fb<'_>,
    plan: &Plan<'_>,
    args: &Args,
    pan: &Panel,
    r0: Value,
    i: i64,
    vals: Vec<Value>,
) {
    let r = fb.b.ins().iadd_imm_s(r0, i);
    let valid = fb.b.ins().icmp(IntCC::SignedLessThan, r, args.m);
    let has_bias = plan.mm.epilogue.bias.is_some();
    let act = plan.mm.epilogue.activation;
    let ybytes = i64::from(plan.y.bits() / 8);
    fb.if_then(valid, |fb| {
        let off = fb.b.ins().imul(r, args.y_stride);
        let yrow = fb.b.ins().iadd(args.y, off);
        let h_end = fb.b.ins().iadd_imm_s(pan.h0, plan.hp);
        let full =
            fb.b.ins()
                .icmp(IntCC::SignedLessThanOrEqual, h_end, args.n_end);
        let vals2 = vals.clone();
        fb.if_else(
            full,
            |fb| {
                for (j, &v) in vals.iter().enumerate() {
                    let h = fb.b.ins().iadd_imm_s(pan.h0, 4 * j as i64);
                    let mut v = v;
                    if has_bias {
                        let bp = fb.addr(args.bias, h, 4);
                        let b = fb.load(F32X4, bp, 0);
                        v = fb.b.ins().fadd(v, b);
                    }
                    v = activation(fb, act, v);
                    let yp = fb.addr(yrow, h, ybytes);
                    match plan.y {
                        Format::F32 => fb.store(v, yp, 0),
                        _ => {
                            let bits = if plan.y == Format::F16 {
                                fb.f32_to_f16(v)
                            } else {
                                fb.f32_to_bf16(v)
                            };
                            let n = fb.b.ins().unarrow(bits, bits);
                            let n64 = fb.b.ins().bitcast(I64X2, lanes(), n);
                            let lo = fb.b.ins().extractlane(n64, 0);
                            fb.store(lo, yp, 0);
                        }
                    }
                }
            },
            |fb| {
                for (j, &v) in vals2.iter().enumerate() {
                    for c in 0..4u8 {
                        let h = fb.b.ins().iadd_imm_s(pan.h0, 4 * j as i64 + i64::from(c));
                        let ok = fb.b.ins().icmp(IntCC::SignedLessThan, h, args.n_end);
                        fb.if_then(ok, |fb| {
                            let x = fb.b.ins().extractlane(v, c);
                            let mut v = fb.b.ins().splat(F32X4, x);
                            if has_bias {
                                let bp = fb.addr(args.bias, h, 4);
                                let b = fb.load(F32, bp, 0);
                                let b = fb.b.ins().splat(F32X4, b);
                                v = fb.b.ins().fadd(v, b);
                            }
                            v = activation(fb, act, v);
                            let yp = fb.addr(yrow, h, ybytes);
                            match plan.y {
                                Format::F32 => {
                                    let s = fb.b.ins().extractlane(v, 0);
                                    fb.store(s, yp, 0);
                                }
                                _ => {
                                    let bits = if plan.y == Format::F16 {
                                        fb.f32_to_f16(v)
                                    } else {
                                        fb.f32_to_bf16(v)
                                    };
                                    fb.store_u16_lane(bits, 0, yp);
                                }
                            }
                        });
                    }
                }
            },
        );
    });
    let _ = I16X8;
    let _ = mem;
}
