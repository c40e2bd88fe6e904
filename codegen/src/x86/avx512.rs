//! The AVX-512 f32 matmul (f32 x, f32 w, f32 y): the float emitter's loop
//! nest ([`super::float`], whose module doc has the register plan of both
//! files) on zmm, for the `x86-avx512` target's f32 tiles. This module is
//! its front-end: the spec, its K blocking and accumulator sets, and the
//! check against the solver's accounting.
//!
//! Same ABI ([`crate::abi::MatmulArgs`]) and weight layout `[h/hp, l, hp]`
//! as the AVX2 kernel, so the host packers and the runtime are unchanged;
//! hp is a multiple of 16 (hb = hp/16 zmm per k step).

use tessera_dsl::ir::{Activation, Format};

use super::evex::Zmm;
use super::float::{self, FloatKernel};
use super::prefetch::WeightPrefetch;
use super::regfile::RegisterFile;
use crate::artifact::{EmitError, MachineCode, Variant};
use crate::tile::TileConfig;

/// f32 lanes per zmm.
pub const LANES: usize = <Zmm as RegisterFile>::LANES;
/// The zmm register file.
pub const ZMM_REGS: u32 = <Zmm as RegisterFile>::REGISTERS as u32;
/// Default bytes of one panel's K block in the GEMM loop: an L2-resident
/// block (kc = 2048 at hp = 48). At M = 512, N = K = 4096 with 9×48, 384
/// KiB beat 192 KiB (kc 1024) by 8–14% and 96 KiB (kc 512) by 7–13% in
/// three same-run comparisons (CPU-time figures, loaded machine): fewer
/// passes of partial sums through y, as on AVX2.
pub const PANEL_BLOCK_BYTES: i32 = 384 * 1024;
pub use super::float::MAX_ROWS;

/// What the AVX-512 f32 kernel computes, and how.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Avx512Spec {
    pub ep: usize,
    /// hp / 16.
    pub hb: usize,
    pub bias: bool,
    pub activation: Activation,
    /// The FMAs broadcast `x[k]` from memory themselves (no A register).
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

    fn hp(&self) -> usize {
        LANES * self.hb
    }
}

/// k values per K block of the GEMM loop: the panel's K block fills
/// `panel_block_bytes`, a whole number of unrolled steps.
pub fn kc(spec: &Avx512Spec) -> i32 {
    float::k_block(spec.panel_block_bytes, spec.hp(), 4)
}

/// A registers of the multi-row loop (0 with embedded broadcasts).
fn a_regs(spec: &Avx512Spec) -> usize {
    usize::from(!spec.embedded_broadcast)
}

/// Accumulator sets of the multi-row loops: 2 when a second set fits
/// beside A and B (and the epilogue's two registers), else 1.
pub fn gemm_sets(spec: &Avx512Spec) -> usize {
    float::multi_row_sets::<Zmm>(spec.ep, spec.hb, a_regs(spec))
}

/// Accumulator sets of the GEMV loop (B from memory, 1 A register), the
/// epilogue's two registers kept out as in the multi-row loops.
pub fn gemv_sets(spec: &Avx512Spec) -> usize {
    float::sets_that_fit(&[4, 2, 1], spec.hb, 1, ZMM_REGS as usize - 2)
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

/// Emit the GEMM variant (with the one-row loop for m = 1).
pub fn emit(spec: &Avx512Spec) -> Result<MachineCode, EmitError> {
    emit_variant(spec, Variant::Gemm)
}

/// Emit one variant (see [`super::float`]'s module doc).
pub fn emit_variant(spec: &Avx512Spec, variant: Variant) -> Result<MachineCode, EmitError> {
    emit_variant_prefetching(spec, variant, WeightPrefetch::FLOAT)
}

/// [`emit_variant`] with the weight stream prefetched by `prefetch`.
pub fn emit_variant_prefetching(
    spec: &Avx512Spec,
    variant: Variant,
    prefetch: WeightPrefetch,
) -> Result<MachineCode, EmitError> {
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
    float::emit_on::<Zmm>(
        &FloatKernel {
            spec: float::FloatSpec {
                ep: spec.ep,
                hb: spec.hb,
                x: Format::F32,
                w: Format::F32,
                y: Format::F32,
                bias: spec.bias,
                activation: spec.activation,
            },
            embedded_broadcast: spec.embedded_broadcast,
            kc: kc(spec),
            gemm_sets: gemm_sets(spec),
            gemv_sets: gemv_sets(spec),
            prefetch,
        },
        variant,
    )
}
