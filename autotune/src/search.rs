//! The decisions, as pure functions of timings: which candidate wins, and
//! where one kernel overtakes another as M grows.
//!
//! Both are deterministic given the timings, and insensitive to noise below
//! the interval width of [`crate::stats`]: candidates whose intervals
//! overlap are tied, and a tie goes to the solver's formula-(2) cost (then
//! to the solver's own order), so on one device two runs agree unless a
//! difference straddles the interval edge.

use crate::stats::Timing;

/// A timed candidate as [`choose`] sees it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Scored {
    pub timing: Timing,
    /// The solver's cost of this tile for the problem at hand (lower wins a
    /// tie).
    pub cost: u128,
    /// The solver's order (0 = optimum; lower wins an equal cost).
    pub order: usize,
}

/// Index of the winner: the fastest, unless candidates tied with it have a
/// lower solver cost. `None` for an empty slice.
pub fn choose(scored: &[Scored]) -> Option<usize> {
    let fastest = (0..scored.len()).min_by(|&a, &b| {
        let (x, y) = (&scored[a], &scored[b]);
        x.timing
            .median_ns
            .total_cmp(&y.timing.median_ns)
            .then(x.cost.cmp(&y.cost))
            .then(x.order.cmp(&y.order))
    })?;
    (0..scored.len())
        .filter(|&i| i == fastest || scored[i].timing.ties(&scored[fastest].timing))
        .min_by_key(|&i| (scored[i].cost, scored[i].order))
}

/// Whether the kernel for larger M (`upper`) should serve M rather than the
/// one for smaller M (`lower`): faster outright, or tied and not costlier by
/// the solver's formula (2) at this M (an equal cost goes to `upper`, so two
/// identical kernels put the breakpoint at the start of the range).
pub fn upper_wins(lower: &Timing, lower_cost: u128, upper: &Timing, upper_cost: u128) -> bool {
    if lower.ties(upper) {
        upper_cost <= lower_cost
    } else {
        upper.median_ns < lower.median_ns
    }
}

/// The smallest M in `[lo, hi]` where `upper_wins(M)` holds, assuming it
/// holds from some M on; `hi + 1` when it never does in the range.
///
/// Galloping then bisection: probe lo, 2·lo, 4·lo, ... up to hi until the
/// upper kernel wins, then bisect the last doubling. About 2·log2(M) probes,
/// and none far beyond the breakpoint, which matters because a probe costs
/// time proportional to M. Every probe goes through `upper_wins`, whose
/// error (a spent budget, an interrupt) aborts the search.
pub fn breakpoint<E>(
    lo: usize,
    hi: usize,
    mut upper_wins: impl FnMut(usize) -> Result<bool, E>,
) -> Result<usize, E> {
    let lo = lo.max(1);
    if lo > hi {
        return Ok(lo);
    }
    if upper_wins(lo)? {
        return Ok(lo);
    }
    // Invariant: upper loses at `below`; the answer is in (below, hi + 1].
    let mut below = lo;
    let above = loop {
        if below >= hi {
            return Ok(hi + 1);
        }
        let next = below.saturating_mul(2).min(hi);
        if upper_wins(next)? {
            break next;
        }
        below = next;
    };
    // Upper loses at `below`, wins at `above`.
    let (mut below, mut above) = (below, above);
    while above - below > 1 {
        let mid = below + (above - below) / 2;
        if upper_wins(mid)? {
            above = mid;
        } else {
            below = mid;
        }
    }
    Ok(above)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn t(median: f64) -> Timing {
        Timing {
            median_ns: median,
            mad_ns: 0.0,
            samples: 5,
        }
    }

    fn s(median: f64, cost: u128, order: usize) -> Scored {
        Scored {
            timing: t(median),
            cost,
            order,
        }
    }

    #[test]
    fn fastest_wins_when_clearly_faster() {
        let v = [s(100.0, 5, 0), s(80.0, 9, 1), s(120.0, 1, 2)];
        assert_eq!(choose(&v), Some(1));
        assert_eq!(choose(&[]), None);
    }

    #[test]
    fn ties_go_to_the_solver_cost_then_order() {
        // 100 and 101 tie (2% floor); the costlier-by-solver fast one loses.
        let v = [s(101.0, 5, 0), s(100.0, 9, 1), s(150.0, 1, 2)];
        assert_eq!(choose(&v), Some(0));
        let v = [s(100.0, 5, 1), s(100.5, 5, 0)];
        assert_eq!(choose(&v), Some(1));
    }

    #[test]
    fn upper_wins_uses_cost_on_ties() {
        assert!(upper_wins(&t(100.0), 5, &t(90.0), 9));
        assert!(!upper_wins(&t(90.0), 9, &t(100.0), 5));
        assert!(upper_wins(&t(100.0), 9, &t(101.0), 5));
        assert!(!upper_wins(&t(100.0), 5, &t(101.0), 9));
        assert!(upper_wins(&t(100.0), 5, &t(100.0), 5));
    }

    #[test]
    fn breakpoint_edges() {
        let never = |_m: usize| Ok::<bool, ()>(false);
        assert_eq!(breakpoint(1, 4096, never), Ok(4097));
        let always = |_m: usize| Ok::<bool, ()>(true);
        assert_eq!(breakpoint(1, 4096, always), Ok(1));
        assert_eq!(breakpoint(7, 4096, always), Ok(7));
        assert_eq!(breakpoint(9, 8, never), Ok(9));
        assert_eq!(breakpoint(0, 1, |m| Ok::<bool, ()>(m >= 1)), Ok(1));
        // Errors abort.
        assert_eq!(
            breakpoint(1, 64, |m| if m > 4 { Err("spent") } else { Ok(false) }),
            Err("spent")
        );
    }

    #[test]
    fn breakpoint_probes_few_and_never_far_past_the_answer() {
        for answer in [2usize, 3, 5, 17, 100, 1000, 4096] {
            let mut probes = Vec::new();
            let found = breakpoint(1, 4096, |m| {
                probes.push(m);
                Ok::<bool, ()>(m >= answer)
            })
            .unwrap();
            assert_eq!(found, answer);
            let bound = 2 * (usize::BITS - answer.leading_zeros()) as usize + 2;
            assert!(probes.len() <= bound, "{answer}: {probes:?}");
            assert!(
                probes.iter().all(|&m| m < 2 * answer),
                "{answer}: {probes:?}"
            );
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// For any monotone predicate the answer is the exact threshold.
        #[test]
        fn breakpoint_finds_the_threshold(lo in 1usize..64, span in 0usize..5000, th in 0usize..6000) {
            let hi = lo + span;
            let found = breakpoint(lo, hi, |m| Ok::<bool, ()>(m >= th)).unwrap();
            let expected = th.clamp(lo, hi + 1);
            prop_assert_eq!(found, expected);
        }

        /// Ties are decided by cost alone, whatever the order of the list.
        #[test]
        fn choose_is_order_independent(medians in prop::collection::vec(90.0f64..110.0, 1..6)) {
            let v: Vec<Scored> = medians.iter().enumerate()
                .map(|(i, &m)| s(m, 100 - i as u128, i)).collect();
            let w = choose(&v).unwrap();
            let mut r = v.clone();
            r.reverse();
            let wr = choose(&r).unwrap();
            prop_assert_eq!(v[w], r[wr]);
        }
    }
}
