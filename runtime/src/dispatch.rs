//! Dispatch by M (FlashDecoding++ section 5): per weight shape [N, K], rows
//! M < M1 run the GEMV kernel, M1 ≤ M < M2 the flat GEMM, M ≥ M2 the GEMM,
//! each with its own tile. The table comes from a tuning record when one
//! matches this device and generator; otherwise from the solver's optimum
//! per variant with [`DEFAULT_M1`] / [`DEFAULT_M2`].
//!
//! The flat range runs a tile sized for the real M ([`ShapePlan::flat_steps`]):
//! the flat tile solved at M = 8 computes 8 rows whatever M is (rows past M
//! alias row M − 1), so at M = 2 it did four times the FMAs and lost to the
//! GEMV. Each step keeps the flat tile's hp and lp, so every step runs on the
//! one packed copy of the weights, and only its ep follows M.

use std::fmt;

use tessera_dsl::ir::Variant;

/// GEMV only for one row when nothing was measured.
pub const DEFAULT_M1: usize = 2;
/// Flat GEMM up to 15 rows (a decode batch), GEMM from 16 (prefill) when
/// nothing was measured.
pub const DEFAULT_M2: usize = 16;

/// CUDA's breakpoints when nothing was measured: GEMV for 1 and 2 rows,
/// the flat GEMM (the GEMV over 4 rows of e a thread) from 3 to 16, GEMM
/// from 17. Measured on an H200 (W4A16, Q4_0, W8A16, Q8_0 and f16 on the
/// Llama2-7B shapes): at M = 4 the flat takes 13.6–38.6 µs against the
/// GEMV's 17.4–92.1 (which re-reads and re-decodes the weights per row),
/// at M = 8 and 16 it stays ahead (two and four passes of 4 rows), while
/// at M = 2 the GEMV is still faster for 4-bit weights; the GEMM's
/// tensor-core tile (108–395 µs at M ≤ 32) takes over where it was
/// measured faster before (M > 16).
pub const CUDA_DEFAULT_BREAKPOINTS: (usize, usize) = (3, 17);

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
    /// The record has no entry for this shape; the breakpoints and winners
    /// of its shape [n, k] (same k, the nearest n) stand in.
    NearestRecordShape { n: usize, k: usize },
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

/// The flat tile from one M on (until the next step's `from_m`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlatStep {
    pub from_m: usize,
    /// ep, hp, lp (hp and lp those of the flat variant's tile).
    pub tile: [u32; 3],
    /// Whether the step came from the record (false: the default rule).
    pub from_record: bool,
    /// The target the record timed this tile on, where a tile of its shape
    /// exists on two (x86 with AVX-512: ymm and zmm pack a 16-column tile
    /// alike, and the tuner times both); None: the first target that has
    /// the shape.
    pub target: Option<String>,
}

/// The flat tile for `m` rows derived from the flat variant's `base` tile:
/// ep = m rounded up to the MAC's `row_unit` ([`tessera_codegen::row_unit`]:
/// 2 for `smmla`, else 1), at most base ep; the same hp and lp (the same
/// packed weights). What the solver gives when solved at that M for the
/// small M of a decode batch, and what the autotuner times as the flat
/// candidate at each M.
pub fn flat_tile_for(base: [u32; 3], m: usize, row_unit: u32) -> [u32; 3] {
    let unit = row_unit.max(1);
    let ep = u32::try_from(m)
        .unwrap_or(u32::MAX)
        .div_ceil(unit)
        .saturating_mul(unit)
        .clamp(1, base[0].max(1));
    [ep, base[1], base[2]]
}

/// The default flat steps of the range `m1..m2` for the flat variant's
/// `base` tile: a step where M's tile ([`flat_tile_for`]) changes, up to
/// the base tile from its ep on. Empty when the range never needs fewer
/// rows than base ep (the base tile serves all of it).
pub fn default_flat_steps(base: [u32; 3], m1: usize, m2: usize, row_unit: u32) -> Vec<FlatStep> {
    let base_ep = base[0] as usize;
    let first = m1.max(1);
    if first >= base_ep || first >= m2 {
        return Vec::new();
    }
    let mut steps: Vec<FlatStep> = Vec::new();
    for m in first..m2.min(base_ep + 1) {
        let tile = flat_tile_for(base, m, row_unit);
        if steps.last().is_none_or(|s| s.tile != tile) {
            steps.push(FlatStep {
                from_m: m,
                tile,
                from_record: false,
                target: None,
            });
        }
    }
    steps
}

/// The flat steps of a shape's flat range `m1..m2` on a host backend:
/// the record's steps when its flat tile came from the record
/// (`flat_from_record`), each packed like the flat tile or like one of
/// `held` (the other variants' tiles, whose packed copies the caller
/// holds too: a step of few rows may run faster on the GEMM's wider
/// packing, at no extra copy); a recorded step of any other packing takes
/// its M's default step instead. None for such a record without steps
/// (its breakpoints were measured with the one flat tile); else
/// [`default_flat_steps`]. One rule for the runtime and for the
/// generator's prebuilt sets, so both ship and pick the same kernels.
pub fn flat_steps_for(
    shape_entry: Option<&crate::record::ShapeEntry>,
    flat_tile: [u32; 3],
    flat_from_record: bool,
    (m1, m2): (usize, usize),
    row_unit: u32,
    held: &[[u32; 3]],
) -> Vec<FlatStep> {
    if let Some(s) = shape_entry
        && flat_from_record
    {
        let packs_held =
            |t: &[u32; 3]| t[1..] == flat_tile[1..] || held.iter().any(|h| h[1..] == t[1..]);
        let mut steps: Vec<FlatStep> = Vec::new();
        for (from_m, w) in s.flat_steps() {
            let (tile, from_record, target) = if packs_held(&w.tile) {
                (w.tile, true, Some(w.target.clone()))
            } else {
                tracing::warn!(
                    step = ?w.tile,
                    flat = ?flat_tile,
                    "a recorded flat step packs like no variant's tile; using the default step"
                );
                (flat_tile_for(flat_tile, from_m, row_unit), false, None)
            };
            if steps
                .last()
                .is_none_or(|l: &FlatStep| (&l.tile, &l.target) != (&tile, &target))
            {
                steps.push(FlatStep {
                    from_m,
                    tile,
                    from_record,
                    target,
                });
            }
        }
        return steps;
    }
    default_flat_steps(flat_tile, m1, m2, row_unit)
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
    /// Flat tiles per M, ascending `from_m` (host backends); empty: the flat
    /// variant's tile serves the whole flat range.
    pub flat_steps: Vec<FlatStep>,
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

    /// The flat step serving `m` rows: the last step starting at or below
    /// `m`, or None when the flat variant's own tile serves it.
    pub fn flat_step(&self, m: usize) -> Option<(usize, &FlatStep)> {
        self.flat_steps
            .iter()
            .enumerate()
            .rev()
            .find(|(_, s)| s.from_m <= m)
    }

    /// The tile `forward` runs for `m` rows.
    pub fn tile_for(&self, m: usize) -> [u32; 3] {
        let variant = self.variant_for(m);
        match (variant, self.flat_step(m)) {
            (Variant::FlatGemm, Some((_, s))) => s.tile,
            _ => self.plan(variant).tile,
        }
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
        if !self.flat_steps.is_empty() {
            write!(f, " flat-steps=")?;
            for (i, s) in self.flat_steps.iter().enumerate() {
                write!(
                    f,
                    "{}{}:{}x{}x{}{}",
                    if i > 0 { "," } else { "" },
                    s.from_m,
                    s.tile[0],
                    s.tile[1],
                    s.tile[2],
                    if s.from_record { "" } else { "*" }
                )?;
                if let Some(target) = &s.target {
                    write!(f, "@{target}")?;
                }
            }
        }
        match &self.source {
            PlanSource::Record => write!(f, " (record)"),
            PlanSource::NearestRecordShape { n, k } => {
                write!(f, " (record, measured at [{n}, {k}])")
            }
            PlanSource::Defaults { why } => write!(f, " (defaults: {why})"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(m1: usize, m2: usize, flat: [u32; 3]) -> ShapePlan {
        let v = |variant, tile| VariantPlan {
            variant,
            tile,
            kernel: String::new(),
            from_record: false,
        };
        ShapePlan {
            n: 64,
            k: 64,
            m1,
            m2,
            variants: [
                v(Variant::Gemv, [1, 32, 1]),
                v(Variant::FlatGemm, flat),
                v(Variant::Gemm, [6, 16, 1]),
            ],
            flat_steps: default_flat_steps(flat, m1, m2, 1),
            source: PlanSource::Defaults { why: "test".into() },
            core_weights: vec![1.0],
        }
    }

    #[test]
    fn flat_tile_follows_m_up_to_the_base_ep() {
        assert_eq!(flat_tile_for([8, 8, 1], 1, 1), [1, 8, 1]);
        assert_eq!(flat_tile_for([8, 8, 1], 3, 1), [3, 8, 1]);
        assert_eq!(flat_tile_for([8, 8, 1], 8, 1), [8, 8, 1]);
        assert_eq!(flat_tile_for([8, 8, 1], 100, 1), [8, 8, 1]);
        assert_eq!(flat_tile_for([4, 16, 4], usize::MAX, 1), [4, 16, 4]);
    }

    #[test]
    fn every_m_of_the_flat_range_runs_min_m_base_ep_rows() {
        for (m1, m2) in [(2, 16), (3, 6), (1, 4), (2, 9), (8, 16), (5, 5), (2, 2)] {
            let p = plan(m1, m2, [8, 8, 1]);
            for m in 1..40 {
                let want = match p.variant_for(m) {
                    Variant::FlatGemm => [m.min(8) as u32, 8, 1],
                    Variant::Gemv => [1, 32, 1],
                    Variant::Gemm => [6, 16, 1],
                };
                assert_eq!(p.tile_for(m), want, "m1={m1} m2={m2} m={m}");
            }
            assert!(p.flat_steps.windows(2).all(|w| w[0].from_m < w[1].from_m));
            assert!(p.flat_steps.iter().all(|s| s.tile[1..] == [8, 1]));
        }
    }

    /// With `smmla`'s 2-row units, odd M runs the next even ep (M = 3
    /// on a 4-row tile), and M of one tile share one step.
    #[test]
    fn steps_round_m_up_to_the_row_unit() {
        assert_eq!(flat_tile_for([8, 8, 8], 3, 2), [4, 8, 8]);
        assert_eq!(flat_tile_for([8, 8, 8], 1, 2), [2, 8, 8]);
        assert_eq!(flat_tile_for([8, 8, 8], 9, 2), [8, 8, 8]);
        let steps: Vec<(usize, u32)> = default_flat_steps([8, 8, 8], 2, 16, 2)
            .iter()
            .map(|s| (s.from_m, s.tile[0]))
            .collect();
        assert_eq!(steps, [(2, 2), (3, 4), (5, 6), (7, 8)]);
        let steps: Vec<(usize, u32)> = default_flat_steps([8, 8, 1], 2, 16, 1)
            .iter()
            .map(|s| (s.from_m, s.tile[0]))
            .collect();
        assert_eq!(steps, (2..=8).map(|m| (m, m as u32)).collect::<Vec<_>>());
    }

    #[test]
    fn no_steps_when_the_range_starts_at_the_base_ep() {
        assert!(default_flat_steps([8, 8, 1], 8, 16, 1).is_empty());
        assert!(default_flat_steps([4, 8, 1], 6, 16, 1).is_empty());
        let p = plan(8, 16, [8, 8, 1]);
        assert_eq!(p.tile_for(9), [8, 8, 1]);
        assert!(!p.to_string().contains("flat-steps"));
        assert!(
            plan(2, 16, [8, 8, 1])
                .to_string()
                .contains("flat-steps=2:2x8x1*,")
        );
    }
}
