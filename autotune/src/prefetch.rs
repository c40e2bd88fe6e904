//! How the GEMV and flat loops prefetch their weight stream, measured per
//! device. Distance and cache level are facts of the memory system, not of
//! the instruction set: on Zen 4 the int8 loops read fastest 4 KiB ahead
//! (M = 4 up to 1.25× faster than 2 KiB), while on a Sapphire Rapids-class
//! Xeon 2 KiB ahead read 5–20% more of the bandwidth at M = 1–8, and the
//! float loops 4 KiB ahead into L2 about 1.2× more (`docs/PERFORMANCE.md`).
//! Each candidate times the solver's optimum GEMV at M = 1 and flat GEMM at its
//! representative M (and, where the GEMM's register file is wider, that
//! file's tiles too) on one of the model's shapes; the times are summed. An
//! alternative is taken only when it beats the default by [`MARGIN`] in
//! two separate measurements, so a noisy run keeps the default.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use tessera_dsl::ir::{Kernel, Variant};
use tessera_runtime::pool::ThreadPool;
use tessera_runtime::record::{PrefetchChoice, PrefetchEntry, PrefetchMeasurement};

use crate::backend::TuneBackend;
use crate::bench::HostBench;
use crate::decide::beats_twice;
use crate::stats::median;
use crate::tune::{Bench, Candidate, ShapeSpec, SolverCtx, representative_m};

/// How much faster than the default an alternative must be, twice.
pub const MARGIN: f64 = 1.03;
/// Timed calls per candidate, prefetch and round (after one warm-up).
const CALLS: usize = 15;

/// Whether the alternative replaces the default, from two rounds of
/// summed median µs `[default, alternative]`: [`beats_twice`] by
/// [`MARGIN`].
pub fn decide(first: [f64; 2], second: Option<[f64; 2]>) -> bool {
    beats_twice(MARGIN, first, second)
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
    let [default, .., alternative]: [PrefetchChoice] = choices[..] else {
        return Ok(None);
    };
    let backends = [
        backend.with_weight_prefetch(setup.kernel, default)?,
        backend.with_weight_prefetch(setup.kernel, alternative)?,
    ];
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
    if candidates.is_empty() {
        return Ok(None);
    }
    // One pool for both: a second pool's idle workers would spin beside
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
    // Round r's summed µs per prefetch; each candidate is prepared once in
    // both benches and its rounds alternate between them.
    let mut rounds = [[0.0f64; 2]; 2];
    for (cand, m) in &candidates {
        for bench in &mut benches {
            bench.prepare(shape, cand).map_err(|e| e.0)?;
        }
        // Round two times the alternative first, so neither prefetch
        // always runs right after the other's preparation.
        for (r, round) in rounds.iter_mut().enumerate() {
            for i in if r == 0 { [0, 1] } else { [1, 0] } {
                round[i] += median_us(&mut benches[i], shape, cand, *m)?;
            }
        }
        for bench in &mut benches {
            bench.release(cand);
        }
    }
    let chosen = if decide(rounds[0], Some(rounds[1])) {
        alternative
    } else {
        default
    };
    Ok(Some(PrefetchEntry {
        stream: stream.to_string(),
        chosen,
        default,
        shape: [shape.n, shape.k],
        m: {
            let mut ms: Vec<usize> = candidates.iter().map(|(_, m)| *m).collect();
            ms.dedup();
            ms
        },
        measurements: [default, alternative]
            .into_iter()
            .enumerate()
            .map(|(i, choice)| PrefetchMeasurement {
                choice,
                us: (rounds[0][i] + rounds[1][i]) / 2.0,
            })
            .collect(),
    }))
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
    fn the_alternative_needs_the_margin_twice() {
        assert!(decide([110.0, 100.0], Some([104.0, 100.0])));
        assert!(!decide([110.0, 100.0], Some([102.0, 100.0])), "once");
        assert!(!decide([110.0, 100.0], None), "no second round");
        assert!(
            !decide([101.0, 100.0], Some([110.0, 100.0])),
            "not the first"
        );
        assert!(!decide([f64::NAN, 100.0], Some([110.0, 100.0])));
        assert!(!decide([110.0, 0.0], Some([110.0, 0.0])));
    }
}
