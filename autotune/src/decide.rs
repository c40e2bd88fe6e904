//! The decision rule, as pure functions of timing blocks: which of two
//! kernels is faster at one M, by how much, and whether the difference is
//! beyond the noise the run itself shows.
//!
//! Why blocks: on a shared or frequency-scaling machine the same kernel's
//! median moves by tens of percent between runs (a GEMV measured 244, 388
//! and 269 µs in three runs), and within a run. The driver therefore times
//! the kernels it compares in interleaved blocks (A B, B A, A B, ...), so a
//! slow phase of the machine hits both, and this module compares them by
//! the *paired* ratio of their block medians: drift shared by a pair of
//! blocks cancels in the ratio. What does not cancel — the disagreement
//! between the pairs, and the spread of the leader's own repeated medians
//! (the run's noise floor) — sets the margin a difference must clear.
//! Inside the margin the decision is a tie, and ties are decided by the
//! solver's cost, which does not vary between runs.

use serde::{Deserialize, Serialize};

use crate::stats::Timing;

/// Whether an alternative replaces a default, from two rounds of times
/// `[default, alternative]` (`second` only where round one favoured the
/// alternative): only when it is faster by `margin` (a ratio, e.g. 1.05)
/// both times, so a noisy run keeps the default. The rule of the one-off
/// choices (the decode attention's fp8 form, the weight prefetch).
pub fn beats_twice(margin: f64, first: [f64; 2], second: Option<[f64; 2]>) -> bool {
    let wins = |[default, alternative]: [f64; 2]| {
        default.is_finite()
            && alternative.is_finite()
            && alternative > 0.0
            && default >= margin * alternative
    };
    wins(first) && second.is_some_and(wins)
}

/// The smallest relative margin: differences below it are never trusted,
/// however quiet the run looked (three blocks can agree by chance). The
/// previous rule's intervals (± 2% each, tied when they overlap) made 4%
/// differences ties already; a run-to-run change of 1–2% in a ratio is
/// common on a VM, so a difference must clear 5% to be reproducible.
pub const MIN_MARGIN: f64 = 0.05;

/// The largest run noise floor used in a margin: a run noisier than this
/// still decides clear differences (and the record shows the floor).
pub const MAX_FLOOR: f64 = 0.15;

/// Repeated timings of one kernel at one M: one `Vec` of call times (ns)
/// per block, in the order the blocks were taken.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Blocks(pub Vec<Vec<f64>>);

impl Blocks {
    /// The median of each non-empty block.
    pub fn medians(&self) -> Vec<f64> {
        self.0
            .iter()
            .filter_map(|b| crate::stats::median(b))
            .collect()
    }

    /// The kernel's time: the fastest block's median. Interference on a
    /// shared machine only ever adds time, so the least disturbed block is
    /// the best estimate of the kernel itself (min of medians).
    pub fn best(&self) -> Option<f64> {
        self.medians().into_iter().reduce(f64::min)
    }

    /// Relative spread of the block medians, (max − min) / min: how far
    /// this kernel's own repeated medians disagree (0 with one block).
    pub fn spread(&self) -> f64 {
        rel_range(&self.medians())
    }

    /// Every sample, blocks concatenated.
    pub fn all(&self) -> Vec<f64> {
        self.0.concat()
    }

    pub fn is_empty(&self) -> bool {
        self.0.iter().all(Vec::is_empty)
    }
}

fn rel_range(v: &[f64]) -> f64 {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if v.len() < 2 || lo <= 0.0 || !lo.is_finite() {
        0.0
    } else {
        (hi - lo) / lo
    }
}

/// The comparison of kernel `b` against kernel `a` at one M.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Verdict {
    /// time(b) / time(a): below 1 means `b` is faster.
    pub ratio: f64,
    /// Relative half-width of the tie zone around 1.
    pub margin: f64,
    /// How much the per-pair ratios disagree: four times their median
    /// absolute deviation (about three standard deviations), relative to
    /// the ratio — this comparison's own noise (part
    /// of the margin; pooled into the run's noise floor by
    /// [`pooled_floor`]). A MAD, not the range: one block in which a few
    /// calls were preempted is an outlier pair, and must not widen the
    /// margin by the preemption's 10–40%.
    pub noise: f64,
}

impl Verdict {
    /// The difference is within the noise.
    pub fn tie(&self) -> bool {
        (self.ratio - 1.0).abs() <= self.margin
    }

    /// `b` is faster by more than the noise.
    pub fn b_clearly_faster(&self) -> bool {
        self.ratio < 1.0 - self.margin
    }
}

/// Compare `b` with `a`. The ratio is the median over block pairs of
/// median(b_i) / median(a_i) (the driver interleaves the blocks, so pair i
/// shares the machine's state); the margin is the largest of
/// [`MIN_MARGIN`], the dispersion of those per-pair ratios (how much the
/// comparison itself moved during the measurement, [`Verdict::noise`])
/// and `floor`, the run's noise floor (capped at [`MAX_FLOOR`]). `None` when either has no
/// samples.
pub fn compare(a: &Blocks, b: &Blocks, floor: f64) -> Option<Verdict> {
    let (ma, mb) = (a.medians(), b.medians());
    if ma.is_empty() || mb.is_empty() {
        return None;
    }
    let ratios: Vec<f64> = ma
        .iter()
        .zip(&mb)
        .filter(|(x, _)| **x > 0.0)
        .map(|(x, y)| y / x)
        .collect();
    let ratio = match crate::stats::median(&ratios) {
        Some(r) if ratios.len() >= 2 => r,
        // Unpaired (one block each): the best times.
        _ => b.best()? / a.best()?.max(f64::MIN_POSITIVE),
    };
    let floor = if floor.is_finite() {
        floor.clamp(0.0, MAX_FLOOR)
    } else {
        0.0
    };
    let noise = match Timing::from_samples(&ratios) {
        Some(t) if ratios.len() >= 2 && ratio > 0.0 => 4.0 * t.mad_ns / ratio,
        _ => 0.0,
    };
    let margin = MIN_MARGIN.max(floor);
    Some(Verdict {
        ratio,
        margin,
        noise,
    })
}

/// A clear verdict checked by a second, independent measurement of the same
/// pair: it stands only if the second is clear the same way (the combined
/// ratio is their geometric mean); otherwise the pair is a tie, with the
/// margin widened to cover both ratios. On a VM a whole block pair can be
/// slowed for one candidate, and a margin from the MAD (which must ignore
/// such pairs) then lets a 15% excursion through as a "clear" win — in
/// the middle of a range where two kernels are within a few percent, which
/// sent M2 to 48, 96 or 384 in three runs of the same command.
pub fn confirm(first: Verdict, second: Verdict) -> Verdict {
    let same_way = !second.tie() && first.b_clearly_faster() == second.b_clearly_faster();
    if first.tie() || same_way {
        return Verdict {
            ratio: (first.ratio * second.ratio).sqrt(),
            margin: first.margin.max(second.margin),
            noise: first.noise.max(second.noise),
        };
    }
    let margin = first
        .margin
        .max(second.margin)
        .max((first.ratio - 1.0).abs())
        .max((second.ratio - 1.0).abs());
    Verdict {
        ratio: (first.ratio * second.ratio).sqrt(),
        margin,
        noise: first.noise.max(second.noise),
    }
}

/// The run's noise floor from the comparisons made so far: the median of
/// their own noise. One comparison's three pairs can agree by luck; the
/// median over a run's comparisons is what the machine shows, and it moves
/// little between runs, so the margins — and with them the decisions near
/// the margin — move little too.
pub fn pooled_floor(verdicts: &[Verdict]) -> f64 {
    let noise: Vec<f64> = verdicts.iter().map(|v| v.noise).collect();
    crate::stats::median(&noise).unwrap_or(0.0)
}

/// A candidate as [`choose`] sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct Entrant {
    pub blocks: Blocks,
    /// The solver's formula-(2) cost (lower wins a tie).
    pub cost: u128,
    /// The solver's order (0 = optimum; lower wins an equal cost).
    pub order: usize,
}

/// The outcome of [`choose`]: the winner, and each other candidate's
/// comparison against the fastest one.
#[derive(Clone, Debug, PartialEq)]
pub struct Choice {
    pub winner: usize,
    /// The fastest by best time (the leader the others are compared with).
    pub fastest: usize,
    /// (candidate, its verdict against the fastest), for every candidate
    /// other than the fastest.
    pub verdicts: Vec<(usize, Verdict)>,
}

/// The winner among candidates timed together: the fastest, unless
/// candidates within the noise of it (ties) have a lower solver cost
/// (then solver order). `None` when no candidate has samples.
pub fn choose(entrants: &[Entrant], floor: f64) -> Option<Choice> {
    let timed: Vec<(usize, f64)> = entrants
        .iter()
        .enumerate()
        .filter_map(|(i, e)| e.blocks.best().map(|t| (i, t)))
        .collect();
    let &(fastest, _) = timed.iter().min_by(|x, y| {
        x.1.total_cmp(&y.1)
            .then(entrants[x.0].cost.cmp(&entrants[y.0].cost))
            .then(entrants[x.0].order.cmp(&entrants[y.0].order))
    })?;
    let mut verdicts = Vec::new();
    let mut tied = vec![fastest];
    for &(i, _) in &timed {
        if i == fastest {
            continue;
        }
        if let Some(v) = compare(&entrants[fastest].blocks, &entrants[i].blocks, floor) {
            if v.tie() {
                tied.push(i);
            }
            verdicts.push((i, v));
        }
    }
    let winner = tied
        .into_iter()
        .min_by_key(|&i| (entrants[i].cost, entrants[i].order))?;
    Some(Choice {
        winner,
        fastest,
        verdicts,
    })
}

/// The winner [`choose`] found, settled: one that beat the solver's pick
/// (the cheapest) on time is timed again (`again`: the same entrants'
/// fresh blocks), and where the second measurement names another winner a
/// third decides: the winner two of the three name, else the cheapest of
/// the three, as a tie would go. GEMV tiles at M = 1 are often within the
/// run-to-run noise of each other on a VM, and one repeat alone named a
/// different tile in one run of three.
pub fn settle_winner<E>(
    choice: &Choice,
    entrants: &[Entrant],
    floor: f64,
    mut again: impl FnMut() -> Result<Vec<Blocks>, E>,
) -> Result<usize, E> {
    let by_cost = |i: usize| (entrants[i].cost, entrants[i].order);
    let cheapest = (0..entrants.len()).min_by_key(|&i| by_cost(i)).unwrap_or(0);
    if choice.winner == cheapest {
        return Ok(choice.winner);
    }
    let mut remeasured = || -> Result<Option<usize>, E> {
        let fresh: Vec<Entrant> = entrants
            .iter()
            .zip(again()?)
            .map(|(e, blocks)| Entrant {
                blocks,
                ..e.clone()
            })
            .collect();
        Ok(choose(&fresh, floor).map(|c| c.winner))
    };
    let first = choice.winner;
    let Some(second) = remeasured()? else {
        return Ok(first);
    };
    if second == first {
        return Ok(first);
    }
    let Some(third) = remeasured()? else {
        return Ok(if by_cost(second) < by_cost(first) {
            second
        } else {
            first
        });
    };
    Ok(if third == first || third == second {
        third
    } else {
        [first, second, third]
            .into_iter()
            .min_by_key(|&i| by_cost(i))
            .unwrap_or(first)
    })
}

/// A breakpoint duel's verdict, settled by a second measurement
/// (`again`: fresh blocks of the pair) and, where the two disagree, a
/// third: the verdict two of them give (both clear the same way, or both
/// within the margin) decides; three different answers are a tie. Every
/// verdict of the search moves the breakpoint, a tie as much as a win (a
/// tie goes to one side), so none is taken from one measurement: on a VM
/// one measurement of a real 17% lead came out at 2.5% (a tie) about once
/// in fifty, and one of a tie as a clear 8% win, and M2 moved with them.
pub fn settle_verdict<E>(
    first: Verdict,
    mut again: impl FnMut() -> Result<Verdict, E>,
) -> Result<Verdict, E> {
    let second = again()?;
    if let Some(v) = agreed(first, second) {
        return Ok(v);
    }
    let third = again()?;
    Ok(agreed(first, third)
        .or_else(|| agreed(second, third))
        .unwrap_or_else(|| confirm(first, second)))
}

/// Two measurements' common verdict, where they give the same answer: both
/// clear the same way ([`confirm`]'s combination) or both ties.
fn agreed(a: Verdict, b: Verdict) -> Option<Verdict> {
    let class = |v: &Verdict| (v.tie(), v.b_clearly_faster());
    (class(&a) == class(&b)).then(|| confirm(a, b))
}

/// Whether the kernel for larger M (`upper`) serves M rather than `lower`:
/// faster beyond the noise, or tied and preferred by `tie_to_upper` — the
/// solver's cost of the two tiles compared once per pair of kernels (at the
/// upper variant's representative M), not at each M: formula (2) at M
/// carries ceil(M / ep), which flips back and forth between two tiles of
/// different ep as M grows, and a tie rule that flips with M makes the
/// bisection's predicate non-monotone, so the breakpoint it lands on
/// depends on which Ms the noise led it to probe.
pub fn upper_serves(v: &Verdict, tie_to_upper: bool) -> bool {
    if v.tie() { tie_to_upper } else { v.ratio < 1.0 }
}

/// The Ms a breakpoint may take: every M up to 8, two per octave up to 32
/// (12, 16, 24, 32), then one per two octaves (128, 512, 2048) and `hi`. Above 8
/// rows the kernels' times cross slowly, a few percent per ten rows, and
/// above 32 the flat GEMM and GEMM tiles differ less by their trend than by
/// the rows their tiles waste at each M (ceil(M / ep): a GEMM tile of 10
/// rows runs 70 rows at M = 64 where a flat tile of 8 runs 64, 9% more
/// work, and 100 at M = 96, 4%). Measured on the main job (Zen 3), the pair
/// is within ±7% from M = 48 to 2048 along that sawtooth, so a breakpoint
/// on a finer grid lands wherever the noise puts one tooth across the tie
/// margin: M2 was 48, 96 or 32 in three runs of the same command. On this
/// grid the search sees one point per tooth-free stretch, and what a step
/// either way costs is in the record's savings.
pub fn grid(lo: usize, hi: usize) -> Vec<usize> {
    let mut g: Vec<usize> = (1..=8).chain([12, 16, 24, 32]).collect();
    let mut p = 32usize;
    while p.saturating_mul(4) <= hi {
        p *= 4;
        g.push(p);
    }
    // The largest M tuned is always a point: where GEMM first serves
    // there, the record says so.
    g.push(hi);
    let mut g: Vec<usize> = g.into_iter().filter(|&m| m > lo && m <= hi).collect();
    if lo <= hi {
        g.insert(0, lo.max(1));
    }
    g.dedup();
    g
}

/// The smallest M of [`grid`]`(lo, hi)` from which `upper_wins` holds and
/// keeps holding: the galloping bisection of [`crate::search::breakpoint`]
/// over the grid's points, its answer then confirmed at the next grid
/// point; a win that does not hold there was noise, and the search goes on
/// above that point. `hi + 1` when there is no such M in range.
pub fn confirmed_breakpoint<E>(
    lo: usize,
    hi: usize,
    mut upper_wins: impl FnMut(usize) -> Result<bool, E>,
) -> Result<usize, E> {
    let g = grid(lo.max(1), hi);
    if g.is_empty() {
        return Ok(lo.max(1).max(hi + 1));
    }
    let last = g.len() - 1;
    let mut from = 0usize;
    loop {
        // Indices are 1-based for `search::breakpoint` (its lower bound is 1).
        let found = crate::search::breakpoint(from + 1, last + 1, |i| upper_wins(g[i - 1]))? - 1;
        if found > last {
            return Ok(hi + 1);
        }
        if found == last || upper_wins(g[found + 1])? {
            return Ok(g[found]);
        }
        from = found + 2;
        if from > last {
            return Ok(hi + 1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(blocks: &[&[f64]]) -> Blocks {
        Blocks(blocks.iter().map(|x| x.to_vec()).collect())
    }

    #[test]
    fn a_clear_verdict_stands_only_if_a_second_measurement_agrees() {
        let v = |ratio: f64| Verdict {
            ratio,
            margin: 0.1,
            noise: 0.02,
        };
        // Both clear, the same way: clear, at their geometric mean.
        let c = confirm(v(0.8), v(0.85));
        assert!(c.b_clearly_faster() && (c.ratio - (0.8f64 * 0.85).sqrt()).abs() < 1e-12);
        let c = confirm(v(1.2), v(1.3));
        assert!(!c.tie() && !c.b_clearly_faster());
        // A lone excursion (1.15, then 0.99): a tie, the margin covers both.
        let c = confirm(v(1.15), v(0.99));
        assert!(c.tie(), "{c:?}");
        assert!(c.margin >= 0.15 - 1e-12);
        // Opposite clear verdicts: a tie.
        assert!(confirm(v(0.8), v(1.2)).tie());
        // A tie first stays a tie-or-better judged on both.
        assert!(confirm(v(1.02), v(0.98)).tie());
    }

    #[test]
    fn a_verdict_is_what_two_of_up_to_three_measurements_say() {
        let v = |ratio: f64| Verdict {
            ratio,
            margin: 0.1,
            noise: 0.02,
        };
        // Replays the given measurements after `first`, counting them.
        let settle = |first: f64, rest: &[f64]| {
            let mut taken = 0;
            let out = settle_verdict(v(first), || {
                taken += 1;
                Ok::<_, ()>(v(rest[taken - 1]))
            })
            .unwrap();
            (out, taken)
        };
        // Two agreeing measurements decide; a tie is measured twice too.
        let (c, n) = settle(0.8, &[0.82]);
        assert!(c.b_clearly_faster() && n == 1);
        let (c, n) = settle(1.03, &[0.98]);
        assert!(c.tie() && n == 1);
        // A clear first, a tie second: the third sides with the first ...
        let (c, n) = settle(0.8, &[1.0, 0.83]);
        assert!(c.b_clearly_faster() && n == 2, "{c:?}");
        // ... or with the second.
        let (c, n) = settle(0.8, &[1.0, 1.02]);
        assert!(c.tie() && n == 2, "{c:?}");
        // A tie that a second and third measurement both call clear: clear
        // (the real 17% lead the first measurement saw as 2.5%).
        let (c, _) = settle(1.025, &[1.17, 1.16]);
        assert!(!c.tie() && !c.b_clearly_faster(), "{c:?}");
        // Three different answers: a tie.
        let (c, n) = settle(0.8, &[1.0, 1.2]);
        assert!(c.tie() && n == 2, "{c:?}");
    }

    #[test]
    fn a_winner_off_the_solver_pick_is_what_two_of_three_measurements_name() {
        // Three entrants; entrant 0 is the cheapest (the solver's pick).
        let entrants = |times: [f64; 3]| -> Vec<Entrant> {
            times
                .iter()
                .enumerate()
                .map(|(i, &t)| Entrant {
                    blocks: b(&[&[t], &[t], &[t]]),
                    cost: 10 + i as u128,
                    order: i,
                })
                .collect()
        };
        let settle = |first: [f64; 3], rest: &[[f64; 3]]| {
            let e = entrants(first);
            let choice = choose(&e, 0.0).unwrap();
            let mut taken = 0;
            let w = settle_winner(&choice, &e, 0.0, || {
                taken += 1;
                Ok::<_, ()>(
                    entrants(rest[taken - 1])
                        .into_iter()
                        .map(|x| x.blocks)
                        .collect(),
                )
            })
            .unwrap();
            (w, taken)
        };
        // The solver's pick winning is not measured again.
        assert_eq!(settle([1.0, 2.0, 2.0], &[]), (0, 0));
        // Another winner repeated once stands.
        assert_eq!(settle([2.0, 1.0, 2.0], &[[2.0, 1.0, 2.0]]), (1, 1));
        // Named once each by three measurements: the cheapest of them.
        assert_eq!(
            settle([2.0, 1.0, 2.0], &[[2.0, 2.0, 1.0], [1.0, 2.0, 2.0]]),
            (0, 2)
        );
        // Two of three name entrant 2.
        assert_eq!(
            settle([2.0, 2.0, 1.0], &[[2.0, 1.0, 2.0], [2.0, 2.0, 1.0]]),
            (2, 2)
        );
    }

    #[test]
    fn best_is_the_fastest_block_median_and_spread_its_range() {
        let x = b(&[&[10.0, 11.0, 30.0], &[12.0, 12.0, 12.0], &[9.0, 40.0, 9.5]]);
        assert_eq!(x.medians(), vec![11.0, 12.0, 9.5]);
        assert_eq!(x.best(), Some(9.5));
        assert!((x.spread() - 2.5 / 9.5).abs() < 1e-12);
        assert_eq!(Blocks::default().best(), None);
        assert_eq!(b(&[&[5.0]]).spread(), 0.0);
    }

    #[test]
    fn paired_ratios_cancel_shared_drift() {
        // The machine slows by 60% in the second pair: both kernels see it.
        let a = b(&[&[100.0], &[160.0], &[110.0]]);
        let c = b(&[&[90.0], &[144.0], &[99.0]]);
        let v = compare(&a, &c, 0.0).unwrap();
        assert!((v.ratio - 0.9).abs() < 1e-12);
        assert_eq!(v.margin, MIN_MARGIN);
        assert!(v.b_clearly_faster() && !v.tie());
        // Pairs that disagree widen the margin: 0.9, 0.97, 1.05 -> a tie.
        let d = b(&[&[90.0], &[155.2], &[115.5]]);
        let v = compare(&a, &d, 0.0).unwrap();
        assert!(v.tie(), "{v:?}");
        // One outlier pair does not: 0.9, 0.9, 1.3 -> still clear.
        let o = b(&[&[90.0], &[144.0], &[143.0]]);
        let v = compare(&a, &o, 0.0).unwrap();
        assert!(v.b_clearly_faster(), "{v:?}");
        // The run's floor widens it too, up to MAX_FLOOR.
        assert!(compare(&a, &c, 0.12).unwrap().tie());
        assert!(
            !compare(&a, &b(&[&[50.0], &[80.0], &[55.0]]), 9.0)
                .unwrap()
                .tie()
        );
        assert!(compare(&a, &Blocks::default(), 0.0).is_none());
    }

    #[test]
    fn ties_go_to_cost_then_order() {
        let e = |t: f64, cost: u128, order: usize| Entrant {
            blocks: b(&[&[t], &[t], &[t]]),
            cost,
            order,
        };
        let c = choose(&[e(100.0, 5, 0), e(98.0, 9, 1), e(150.0, 1, 2)], 0.0).unwrap();
        assert_eq!((c.winner, c.fastest), (0, 1));
        assert_eq!(c.verdicts.len(), 2);
        let c = choose(&[e(100.0, 5, 0), e(80.0, 9, 1)], 0.0).unwrap();
        assert_eq!(c.winner, 1);
        let c = choose(&[e(100.0, 5, 1), e(100.5, 5, 0)], 0.0).unwrap();
        assert_eq!(c.winner, 1);
        assert!(choose(&[], 0.0).is_none());
    }

    #[test]
    fn upper_serves_on_clear_wins_and_on_ties_by_the_pair_rule() {
        let v = |ratio| Verdict {
            ratio,
            margin: 0.05,
            noise: 0.0,
        };
        assert!(upper_serves(&v(0.9), false));
        assert!(!upper_serves(&v(1.1), true));
        assert!(upper_serves(&v(0.97), true));
        assert!(!upper_serves(&v(0.97), false));
    }

    #[test]
    fn a_lone_noisy_win_below_the_crossover_is_not_a_breakpoint() {
        // Truly from 33 on; M = 8 looks like a win once (noise).
        let pred = |m: usize| Ok::<bool, ()>(m == 8 || m >= 33);
        assert_eq!(confirmed_breakpoint(1, 4096, pred), Ok(128));
        assert_eq!(crate::search::breakpoint(1, 4096, pred), Ok(8));
        assert_eq!(
            grid(1, 40),
            vec![1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32, 40]
        );
        assert_eq!(
            grid(1, 4096),
            vec![1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32, 128, 512, 2048, 4096]
        );
        assert_eq!(grid(13, 4096).first(), Some(&13));
        assert_eq!(grid(13, 4096).last(), Some(&4096));
        let never = |_| Ok::<bool, ()>(false);
        assert_eq!(confirmed_breakpoint(1, 4096, never), Ok(4097));
        let always = |_| Ok::<bool, ()>(true);
        assert_eq!(confirmed_breakpoint(3, 4096, always), Ok(3));
        assert_eq!(confirmed_breakpoint(4096, 4096, always), Ok(4096));
        // A win at the top that does not hold at its neighbour: none.
        let blip = |m: usize| Ok::<bool, ()>(m == 3000);
        assert_eq!(confirmed_breakpoint(3000, 4096, blip), Ok(4097));
    }
}
