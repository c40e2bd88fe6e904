//! The search over M: where a predicate ("the upper kernel serves M")
//! starts to hold, in few probes. What the predicate decides is
//! [`crate::decide`]'s.

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
    }
}
