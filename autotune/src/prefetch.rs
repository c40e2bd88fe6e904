//! How the GEMV and flat loops prefetch their weight stream, measured per
//! device. Distance and cache level are facts of the memory system, not of
//! the instruction set: on Zen 4 the int8 loops read fastest 4 KiB ahead
//! (M = 4 up to 1.25× faster than 2 KiB), while on a Sapphire Rapids-class
//! Xeon 2 KiB ahead read 5–20% more of the bandwidth at M = 1–8, on Zen 5
//! 8 KiB ahead 8–18% more at one thread, and the float loops 4 KiB ahead
//! into L2 about 1.2× more (`docs/PERFORMANCE.md`).
//! Each candidate times the solver's optimum GEMV at M = 1 and flat GEMM at its
//! representative M (and, where the GEMM's register file is wider, that
//! file's tiles too), and the flat candidates' steps of 1 and 4 rows, on
//! one of the model's shapes; each choice's times are compared with the
//! default's as a geometric mean of their ratios ([`relative_cost`]),
//! at the record's threads and, where those are more, on one thread: the
//! bandwidth two threads share can hide how far one core's prefetches
//! reach (Zen 5's 8 KiB tied 4 KiB at two threads). An alternative is
//! taken only when it beats the default by [`MARGIN`] in two separate
//! measurements of one setting and loses to it so in none, so a noisy run
//! keeps the default.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use tessera_dsl::ir::{Kernel, Variant};
use tessera_runtime::pool::ThreadPool;
use tessera_runtime::record::{PrefetchEntry, PrefetchMeasurement};

use crate::backend::TuneBackend;
use crate::bench::HostBench;
use crate::decide::beats_twice;
use crate::stats::median;
use crate::tune::{Bench, Candidate, ShapeSpec, SolverCtx, representative_m};

/// How much faster than the default an alternative must be, twice.
pub const MARGIN: f64 = 1.03;
/// Timed calls per candidate, prefetch and round (after one warm-up).
const CALLS: usize = 15;
/// Rows of the flat steps timed beside the GEMV and flat candidates.
const STEP_ROWS: [usize; 2] = [1, 4];

/// Two rounds of a cost per choice (the default first) in one setting (a
/// thread count): [`relative_cost`].
pub type Rounds = [Vec<f64>; 2];

/// The index of the choice the runtime emits, from each setting's
/// [`Rounds`]: among the alternatives that beat the default by [`MARGIN`]
/// in both rounds of some setting ([`beats_twice`]) and that the default
/// beats so in none, the one whose times are the smallest against the
/// default's (their ratios' product over every round); else the default.
pub fn choose(settings: &[Rounds]) -> usize {
    let pair = |r: &Vec<f64>, i: usize| [r[0], r[i]];
    let choices = settings.iter().map(|s| s[0].len().min(s[1].len())).min();
    let mut best: Option<(f64, usize)> = None;
    for i in 1..choices.unwrap_or(0) {
        let wins = settings
            .iter()
            .any(|[a, b]| beats_twice(MARGIN, pair(a, i), Some(pair(b, i))));
        let loses = settings
            .iter()
            .any(|[a, b]| beats_twice(MARGIN, [a[i], a[0]], Some([b[i], b[0]])));
        if !wins || loses {
            continue;
        }
        let ratio: f64 = settings
            .iter()
            .flat_map(|s| s.iter())
            .map(|r| r[i] / r[0])
            .product();
        if best.is_none_or(|(b, _)| ratio < b) {
            best = Some((ratio, i));
        }
    }
    best.map_or(0, |(_, i)| i)
}

/// Where the prefetches are timed.
pub struct Setup<'a> {
    pub kernel: &'a Kernel,
    pub solver: &'a SolverCtx<'a>,
    pub shape: &'a ShapeSpec,
    pub threads: usize,
    pub llc_bytes: u64,
    pub start: Instant,
    pub stop: Arc<AtomicBool>,
}

/// Time `backend`'s weight prefetches for `setup.kernel` and decide; None
/// where the backend has no choice for this kernel.
pub fn tune(backend: &dyn TuneBackend, setup: &Setup<'_>) -> Result<Option<PrefetchEntry>, String> {
    let Some((stream, choices)) = backend.weight_prefetch_choices(setup.kernel) else {
        return Ok(None);
    };
    if choices.len() < 2 {
        return Ok(None);
    }
    let backends = choices
        .iter()
        .map(|&c| backend.with_weight_prefetch(setup.kernel, c))
        .collect::<Result<Vec<_>, String>>()?;
    let shape = setup.shape;
    let mut candidates: Vec<(Candidate, usize)> = Vec::new();
    for variant in [Variant::Gemv, Variant::FlatGemm] {
        let m = representative_m(variant);
        let found = setup
            .solver
            .candidates(variant, shape.n, shape.k, 0)
            .map_err(|e| e.to_string())?;
        candidates.extend(found.into_iter().map(|c| (c, m)));
    }
    // The flat candidates' steps of fewer rows, which the runtime runs
    // below their ep and where the stream's bandwidth shows most (on Zen 5
    // the tiles of 8 rows are bound by their arithmetic at one thread).
    let flats: Vec<Candidate> = candidates
        .iter()
        .filter(|(c, _)| c.variant == Variant::FlatGemm)
        .map(|(c, _)| *c)
        .collect();
    for flat in flats {
        for m in STEP_ROWS {
            let step = setup.solver.flat_step(&flat, m, shape.n, shape.k);
            if !candidates.iter().any(|(c, _)| c.key() == step.key()) {
                candidates.push((step, m));
            }
        }
    }
    if candidates.is_empty() {
        return Ok(None);
    }
    // One pool for all: a second pool's idle workers would spin beside
    // the other's calls on the same CPUs (measured: a 30 µs call timed
    // right after the other bench's ran 1.5–3× slower).
    let pool = Arc::new(ThreadPool::new(setup.threads.max(1)));
    let mut benches = backends
        .iter()
        .map(|b| {
            HostBench::with_pool(
                b.as_ref(),
                setup.kernel.clone(),
                setup.llc_bytes,
                setup.start,
                setup.stop.clone(),
                pool.clone(),
            )
        })
        .collect::<Result<Vec<_>, String>>()?;
    // Settings: the record's threads, then one worker where that is fewer.
    let workers: Vec<Option<usize>> = if setup.threads > 1 {
        vec![None, Some(1)]
    } else {
        vec![None]
    };
    // µs per setting, round, candidate and choice.
    let mut times = vec![[vec![], vec![]]; workers.len()];
    let mut unbuilt = None;
    for (cand, m) in &candidates {
        // A candidate some prefetch's backend cannot build is left out
        // (the others still decide), not the whole tuning.
        if let Err(e) = benches.iter_mut().try_for_each(|b| b.prepare(shape, cand)) {
            benches.iter_mut().for_each(|b| b.release(cand));
            unbuilt = Some(e.0);
            continue;
        }
        for (setting, &limit) in times.iter_mut().zip(&workers) {
            for bench in &mut benches {
                bench.limit_workers(limit);
            }
            // Round two times the choices in reverse, so none always runs
            // right after another's preparation.
            for (r, round) in setting.iter_mut().enumerate() {
                let mut us = vec![0.0f64; choices.len()];
                let order: Vec<usize> = if r == 0 {
                    (0..choices.len()).collect()
                } else {
                    (0..choices.len()).rev().collect()
                };
                for i in order {
                    us[i] = median_us(&mut benches[i], shape, cand, *m)?;
                }
                round.push(us);
            }
        }
        for bench in &mut benches {
            bench.limit_workers(None);
            bench.release(cand);
        }
    }
    if times[0][0].is_empty() {
        return Err(format!(
            "no candidate could be built to time the weight prefetch: {}",
            unbuilt.unwrap_or_default()
        ));
    }
    let settings: Vec<Rounds> = times
        .iter()
        .map(|rounds| rounds.clone().map(|r| relative_cost(&r)))
        .collect();
    // Summed µs of a choice in a setting, both rounds' mean (the record's
    // report).
    let mean = |s: usize, i: usize| times[s].iter().flatten().map(|us| us[i]).sum::<f64>() / 2.0;
    Ok(Some(PrefetchEntry {
        stream: stream.to_string(),
        chosen: choices[choose(&settings)],
        default: choices[0],
        shape: [shape.n, shape.k],
        m: {
            let mut ms: Vec<usize> = candidates.iter().map(|(_, m)| *m).collect();
            ms.sort_unstable();
            ms.dedup();
            ms
        },
        measurements: choices
            .iter()
            .enumerate()
            .map(|(i, &choice)| PrefetchMeasurement {
                choice,
                us: mean(0, i),
                us_one_thread: (times.len() > 1).then(|| mean(1, i)),
            })
            .collect(),
    }))
}

/// Each choice's cost in one round against the default's: the geometric
/// mean over the candidates of its µs over the default's (the default's
/// is 1). A mean of ratios, so a long call's noise does not outweigh a
/// short one's difference.
pub fn relative_cost(round: &[Vec<f64>]) -> Vec<f64> {
    let choices = round.iter().map(Vec::len).min().unwrap_or(0);
    (0..choices)
        .map(|i| {
            let logs: Vec<f64> = round.iter().map(|us| (us[i] / us[0]).ln()).collect();
            (logs.iter().sum::<f64>() / logs.len().max(1) as f64).exp()
        })
        .collect()
}

/// Median µs of [`CALLS`] calls of a prepared candidate, after one warm-up.
fn median_us(
    bench: &mut dyn Bench,
    shape: &ShapeSpec,
    cand: &Candidate,
    m: usize,
) -> Result<f64, String> {
    bench.call(shape, cand, m).map_err(|e| e.0)?;
    let ns = (0..CALLS)
        .map(|_| bench.call(shape, cand, m).map_err(|e| e.0))
        .collect::<Result<Vec<f64>, String>>()?;
    Ok(median(&ns).unwrap_or(f64::NAN) / 1e3)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_alternative_needs_the_margin_twice_in_one_setting() {
        let r = |d: f64, a: f64| vec![d, a];
        // All threads only.
        assert_eq!(choose(&[[r(110.0, 100.0), r(104.0, 100.0)]]), 1);
        assert_eq!(choose(&[[r(110.0, 100.0), r(102.0, 100.0)]]), 0, "once");
        assert_eq!(choose(&[[r(101.0, 100.0), r(110.0, 100.0)]]), 0);
        assert_eq!(choose(&[[r(f64::NAN, 100.0), r(110.0, 100.0)]]), 0);
        assert_eq!(choose(&[[r(110.0, 0.0), r(110.0, 0.0)]]), 0);
        // A tie at all threads, clear on one: taken.
        let tie = [r(100.0, 100.0), r(101.0, 100.0)];
        assert_eq!(
            choose(&[tie.clone(), [r(112.0, 100.0), r(110.0, 100.0)]]),
            1
        );
        // Faster on one thread, slower at all: kept off.
        let slower = [r(100.0, 110.0), r(100.0, 108.0)];
        assert_eq!(choose(&[slower, [r(112.0, 100.0), r(110.0, 100.0)]]), 0);
        // Two qualify: the faster against the default.
        let three = |a: f64, b: f64| vec![110.0, a, b];
        assert_eq!(choose(&[[three(100.0, 90.0), three(100.0, 92.0)]]), 2);
        assert_eq!(choose(&[[three(90.0, 100.0), three(92.0, 100.0)]]), 1);
        // One slower, one faster: the faster.
        assert_eq!(choose(&[[three(130.0, 100.0), three(125.0, 100.0)]]), 2);
        assert_eq!(choose(&[]), 0);
    }

    #[test]
    fn a_long_call_does_not_outweigh_a_short_ones_difference() {
        // A 1000 µs call 2% slower, two 100 µs calls 10% faster: summed,
        // the alternative would lose 0.6%; by ratios it wins.
        let round = [vec![1000.0, 1020.0], vec![100.0, 90.0], vec![100.0, 90.0]];
        let cost = relative_cost(&round);
        assert_eq!(cost[0], 1.0);
        let want = (1.02f64 * 0.9 * 0.9).cbrt();
        assert!((cost[1] - want).abs() < 1e-12, "{cost:?}");
        assert_eq!(choose(&[[cost.clone(), cost]]), 1);
        assert!(relative_cost(&[vec![f64::NAN, 1.0]])[1].is_nan());
    }
}
