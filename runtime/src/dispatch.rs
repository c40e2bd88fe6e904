//! Dispatch by M (FlashDecoding++ section 5): per weight shape [N, K], rows
//! M < M1 run the GEMV kernel, M1 ≤ M < M2 the flat GEMM, M ≥ M2 the GEMM,
//! each with its own tile. The table comes from a tuning record when one
//! matches this device and generator; otherwise from the solver's optimum
//! per variant with [`DEFAULT_M1`] / [`DEFAULT_M2`].

use std::fmt;

use tessera_dsl::ir::Variant;

/// GEMV only for one row when nothing was measured.
pub const DEFAULT_M1: usize = 2;
/// Flat GEMM up to 15 rows (a decode batch), GEMM from 16 (prefill) when
/// nothing was measured.
pub const DEFAULT_M2: usize = 16;

/// The M each variant's default tile is solved for (the autotuner compares
/// its candidates at the same rows).
pub fn representative_m(variant: Variant) -> usize {
    match variant {
        Variant::Gemv => 1,
        Variant::FlatGemm => 8,
        Variant::Gemm => 128,
    }
}

/// Where a shape's plan came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlanSource {
    /// The tuning record's breakpoints and winners.
    Record,
    /// Solver defaults; `why` says why the record was not used.
    Defaults { why: String },
}

/// The kernel one variant of one shape runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VariantPlan {
    pub variant: Variant,
    /// ep, hp, lp.
    pub tile: [u32; 3],
    /// Full instance name when the record gave one, else the library name.
    pub kernel: String,
    /// Whether this tile came from the record (false: solver default).
    pub from_record: bool,
}

/// The dispatch of one weight shape [N, K].
#[derive(Clone, Debug, PartialEq)]
pub struct ShapePlan {
    pub n: usize,
    pub k: usize,
    pub m1: usize,
    pub m2: usize,
    /// Gemv, FlatGemm, Gemm, in that order.
    pub variants: [VariantPlan; 3],
    pub source: PlanSource,
    /// Relative throughput per worker thread (MNN-LLM 5.2).
    pub core_weights: Vec<f64>,
}

/// Index of a variant in [`ShapePlan::variants`].
pub fn variant_index(v: Variant) -> usize {
    match v {
        Variant::Gemv => 0,
        Variant::FlatGemm => 1,
        Variant::Gemm => 2,
    }
}

impl ShapePlan {
    /// The variant serving M rows.
    pub fn variant_for(&self, m: usize) -> Variant {
        if m < self.m1 {
            Variant::Gemv
        } else if m < self.m2 {
            Variant::FlatGemm
        } else {
            Variant::Gemm
        }
    }

    pub fn plan(&self, variant: Variant) -> &VariantPlan {
        &self.variants[variant_index(variant)]
    }
}

impl fmt::Display for ShapePlan {
    /// One line per shape: breakpoints, tiles, provenance.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}, {}] m1={} m2={}", self.n, self.k, self.m1, self.m2)?;
        for v in &self.variants {
            write!(
                f,
                " {}={}x{}x{}{}",
                v.variant,
                v.tile[0],
                v.tile[1],
                v.tile[2],
                if v.from_record { "" } else { "*" }
            )?;
        }
        match &self.source {
            PlanSource::Record => write!(f, " (record)"),
            PlanSource::Defaults { why } => write!(f, " (defaults: {why})"),
        }
    }
}
