//! What the chosen breakpoints are worth: the time they save against their
//! neighbours (M1 ± 1, M2 ± a step) and against never switching (always
//! GEMV, always flat GEMM, always GEMM), from the measurements of a shape.
//!
//! A breakpoint found inside the noise saves nothing against its
//! neighbours, and saying so (a saving near 0) is what makes a moved
//! breakpoint harmless; one that saves 30% against "always GEMV" is what
//! the tuning was for.
//!
//! Times at Ms that were not measured are interpolated linearly between
//! measured Ms of the same kernel, held at the first measurement below it
//! (fewer rows never make a call faster than the smallest one measured)
//! and grown in proportion to M above the last (rows past the last
//! measurement cost at least as much as the ones before). Each M of a range
//! counts once (every batch size equally likely).

use tessera_dsl::ir::Variant;
use tessera_runtime::record::{Measurement, Savings, ShapeEntry};

use crate::tune::MAX_M;

/// (M, ns) of the kernel that serves `variant` at each measured M: the
/// variant's winner tile; for flat GEMM the per-M step (the smallest ep ≥ M
/// on the winner's hp and lp), as the runtime runs it.
pub fn points(shape: &ShapeEntry, variant: Variant) -> Vec<(usize, f64)> {
    let Some(w) = shape.winner(variant) else {
        return Vec::new();
    };
    let mut pts: Vec<(usize, f64)> = Vec::new();
    let mine: Vec<&Measurement> = shape
        .measurements
        .iter()
        .filter(|m| m.variant == variant && m.median_ns > 0.0)
        .collect();
    let mut ms: Vec<usize> = mine.iter().map(|m| m.m).collect();
    ms.sort_unstable();
    ms.dedup();
    for m in ms {
        let mut at = mine.iter().copied().filter(|x| x.m == m);
        let pick = if variant == Variant::FlatGemm {
            at.filter(|x| x.tile[1..] == w.tile[1..])
                .filter(|x| x.tile[0] as usize >= m.min(w.tile[0] as usize))
                .min_by_key(|x| x.tile[0])
        } else {
            at.find(|x| x.tile == w.tile)
        };
        if let Some(x) = pick {
            pts.push((m, x.median_ns));
        }
    }
    pts
}

/// The time at `m` from sorted points (see the module doc).
pub fn time_at(pts: &[(usize, f64)], m: usize) -> Option<f64> {
    let first = pts.first()?;
    let last = pts.last()?;
    if m <= first.0 {
        return Some(first.1);
    }
    if m >= last.0 {
        return Some(last.1 * m as f64 / last.0 as f64);
    }
    let i = pts.partition_point(|p| p.0 < m);
    let (a, b) = (pts[i - 1], pts[i]);
    if b.0 == m {
        return Some(b.1);
    }
    let f = (m - a.0) as f64 / (b.0 - a.0) as f64;
    Some(a.1 + f * (b.1 - a.1))
}

/// The three kernels' curves.
struct Curves {
    gemv: Vec<(usize, f64)>,
    flat: Vec<(usize, f64)>,
    gemm: Vec<(usize, f64)>,
}

impl Curves {
    /// Time at `m` under breakpoints (m1, m2).
    fn policy(&self, m1: usize, m2: usize, m: usize) -> Option<f64> {
        if m < m1 {
            time_at(&self.gemv, m)
        } else if m < m2 {
            time_at(&self.flat, m)
        } else {
            time_at(&self.gemm, m)
        }
    }

    fn total(&self, ms: std::ops::Range<usize>, f: impl Fn(usize) -> Option<f64>) -> Option<f64> {
        ms.map(f).sum()
    }
}

/// The fraction of the alternative's time the chosen policy saves over
/// `ms`: (alt − chosen) / alt.
fn saved(chosen: Option<f64>, alt: Option<f64>) -> Option<f64> {
    match (chosen, alt) {
        (Some(c), Some(a)) if a > 0.0 => Some((a - c) / a),
        _ => None,
    }
}

/// The savings of `shape`'s M1 and M2; `m2_step` is the M2 neighbours'
/// distance. `None` without measurements of all three winners.
pub fn savings(shape: &ShapeEntry, m2_step: usize) -> Option<Savings> {
    let c = Curves {
        gemv: points(shape, Variant::Gemv),
        flat: points(shape, Variant::FlatGemm),
        gemm: points(shape, Variant::Gemm),
    };
    if c.gemv.is_empty() || c.flat.is_empty() || c.gemm.is_empty() {
        return None;
    }
    let range_m = shape
        .measurements
        .iter()
        .map(|m| m.m)
        .max()
        .unwrap_or(1)
        .clamp(1, MAX_M);
    let (m1, m2) = (shape.m1, shape.m2.max(shape.m1));
    let step = m2_step.max(1);
    // Chosen (m1, m2) against alternative (a1, a2) over the Ms where they
    // differ, when those are within the measured range.
    let against = |a1: usize, a2: usize| -> Option<f64> {
        let lo = m1.min(a1).min(m2).min(a2).max(1);
        let hi = m1.max(a1).max(m2).max(a2).min(range_m + 1);
        let ms: Vec<usize> = (lo..hi)
            .filter(|&m| {
                let v = |b1: usize, b2: usize| (m >= b1) as u8 + (m >= b2) as u8;
                v(m1, m2) != v(a1, a2)
            })
            .collect();
        if ms.is_empty() {
            return None;
        }
        let sum = |b1, b2| -> Option<f64> { ms.iter().map(|&m| c.policy(b1, b2, m)).sum() };
        saved(sum(m1, m2), sum(a1, a2))
    };
    let in_range = |m: usize| (1..=MAX_M).contains(&m);
    let whole = |b1: usize, b2: usize| c.total(1..range_m + 1, |m| c.policy(b1, b2, m));
    let chosen = whole(m1, m2);
    Some(Savings {
        range_m,
        m2_step: step,
        vs_m1_minus: (m1 >= 2 && in_range(m1 - 1))
            .then(|| against(m1 - 1, m2))
            .flatten(),
        vs_m1_plus: in_range(m1)
            .then(|| against(m1 + 1, m2.max(m1 + 1)))
            .flatten(),
        vs_m2_minus: (m2 > step && m2 - step >= m1 && in_range(m2))
            .then(|| against(m1, m2 - step))
            .flatten(),
        vs_m2_plus: in_range(m2).then(|| against(m1, m2 + step)).flatten(),
        vs_always_gemv: saved(chosen, whole(usize::MAX, usize::MAX)),
        vs_always_flat: saved(chosen, whole(1, usize::MAX)),
        vs_always_gemm: saved(chosen, whole(1, 1)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_runtime::record::{ShapeNotes, Winner};

    fn meas(variant: Variant, tile: [u32; 3], m: usize, ns: f64) -> Measurement {
        Measurement {
            variant,
            target: "t".into(),
            tile,
            threads: 1,
            m,
            median_ns: ns,
            spread_ns: 0.0,
            samples: 3,
            gflops: 0.0,
            gbps: 0.0,
            roofline: 0.0,
            block_medians_ns: Vec::new(),
        }
    }

    fn winner(variant: Variant, tile: [u32; 3]) -> Winner {
        Winner {
            variant,
            target: "t".into(),
            tile,
            kernel: String::new(),
            from_m: None,
        }
    }

    /// GEMV 100·M, flat 150 + 10·M, GEMM 400 + 2·M: the exact crossovers
    /// are M = 2 (GEMV vs flat: 200 vs 170) and M = 32 (flat 470 vs GEMM 464).
    fn shape(m1: usize, m2: usize) -> ShapeEntry {
        let (g, f, e) = ([1, 32, 4], [8, 8, 4], [5, 8, 4]);
        let mut measurements = Vec::new();
        for m in [1, 2, 3, 4, 8, 16, 24, 31, 32, 33, 36, 64] {
            measurements.push(meas(Variant::Gemv, g, m, 100.0 * m as f64));
            let ep = (m as u32).min(8);
            measurements.push(meas(
                Variant::FlatGemm,
                [ep, 8, 4],
                m,
                150.0 + 10.0 * m as f64,
            ));
            measurements.push(meas(Variant::Gemm, e, m, 400.0 + 2.0 * m as f64));
        }
        ShapeEntry {
            name: "s".into(),
            n: 64,
            k: 64,
            m1,
            m2,
            winners: vec![
                winner(Variant::Gemv, g),
                winner(Variant::FlatGemm, f),
                winner(Variant::Gemm, e),
            ],
            measurements,
            notes: ShapeNotes::default(),
        }
    }

    #[test]
    fn interpolation_holds_below_and_grows_above() {
        let p = [(2, 10.0), (4, 30.0)];
        assert_eq!(time_at(&p, 1), Some(10.0));
        assert_eq!(time_at(&p, 3), Some(20.0));
        assert_eq!(time_at(&p, 8), Some(60.0));
        assert_eq!(time_at(&[], 3), None);
    }

    #[test]
    fn the_right_breakpoints_save_against_every_alternative() {
        let s = savings(&shape(2, 32), 4).unwrap();
        assert_eq!((s.range_m, s.m2_step), (64, 4));
        for v in [
            s.vs_m1_minus,
            s.vs_m1_plus,
            s.vs_m2_minus,
            s.vs_m2_plus,
            s.vs_always_gemv,
            s.vs_always_flat,
            s.vs_always_gemm,
        ] {
            assert!(v.unwrap() >= 0.0, "{s:?}");
        }
        // M1 = 1 has no M1 − 1; flat at M = 1 (160) beats nothing: M1 + 1
        // keeps GEMV (100) at M = 1.
        let s = savings(&shape(1, 32), 4).unwrap();
        assert_eq!(s.vs_m1_minus, None);
        assert!(s.vs_m1_plus.unwrap() < 0.0);
        // Never switching to GEMM (M2 > 4096): no M2 neighbours measured.
        let s = savings(&shape(2, 4097), 4).unwrap();
        assert_eq!((s.vs_m2_minus, s.vs_m2_plus), (None, None));
        assert!(s.vs_always_flat.unwrap() > 0.0);
    }
}
