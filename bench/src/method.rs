//! The measurement method of `shared/PEERS.md`, shared by every peer so the
//! numbers compare: rotate through weight copies so no call is served from the
//! last-level cache, one untimed warm-up call per block, calls timed one by
//! one, the median reported, and a pause between blocks (OpenBLAS and OpenMP
//! threads spin after a call).
//!
//! A block stops once `reps >= min_reps && elapsed >= min_time`, or early once
//! `reps >= 3 && elapsed >= max_time` (so M = 512 on big shapes takes 3 calls
//! instead of several seconds). `numpy_peer.py` and `ggml_peer.c` implement
//! the same rule.

use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

/// Safety stop for blocks of tiny calls.
const MAX_REPS: usize = 100_000;

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Method {
    /// Bytes the rotated weight copies must add up to at least.
    pub total_bytes: u64,
    pub min_reps: usize,
    pub min_time_s: f64,
    pub max_time_s: f64,
    pub sleep_ms: u64,
}

impl Method {
    /// The full method: at least `total_bytes` of copies, ≥ 5 calls and ~0.4 s.
    pub fn standard(total_bytes: u64) -> Self {
        Method {
            total_bytes,
            min_reps: 5,
            min_time_s: 0.4,
            max_time_s: 1.5,
            sleep_ms: 150,
        }
    }

    /// Smoke-test method: few copies, few and short calls.
    pub fn quick(total_bytes: u64) -> Self {
        Method {
            total_bytes,
            min_reps: 3,
            min_time_s: 0.02,
            max_time_s: 0.1,
            sleep_ms: 10,
        }
    }

    /// Number of weight copies to rotate through: enough to exceed
    /// `total_bytes`, and never fewer than 2 so consecutive calls never read
    /// the same copy.
    pub fn copies_for(&self, bytes_per_copy: u64) -> usize {
        let bytes = bytes_per_copy.max(1);
        (self.total_bytes.div_ceil(bytes) as usize).max(2)
    }

    /// Whether a block with `reps` calls taking `elapsed_s` in total is done.
    pub fn block_done(&self, reps: usize, elapsed_s: f64) -> bool {
        (reps >= self.min_reps && elapsed_s >= self.min_time_s)
            || (reps >= 3 && elapsed_s >= self.max_time_s)
            || reps >= MAX_REPS
    }

    /// Times `call(copy)` one call at a time, rotating `copy` through
    /// `0..copies`, after one untimed warm-up call on the last copy.
    pub fn measure(&self, copies: usize, mut call: impl FnMut(usize)) -> Timing {
        let copies = copies.max(1);
        call(copies - 1);
        let mut times = Vec::new();
        let mut elapsed = 0.0;
        let mut copy = 0;
        loop {
            let start = Instant::now();
            call(copy);
            let dt = start.elapsed().as_secs_f64();
            times.push(dt);
            elapsed += dt;
            copy = (copy + 1) % copies;
            if self.block_done(times.len(), elapsed) {
                break;
            }
        }
        Timing::from_samples(&mut times)
    }

    /// The pause between blocks.
    pub fn pause(&self) {
        std::thread::sleep(Duration::from_millis(self.sleep_ms));
    }
}

/// Summary of one block of timed calls.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Timing {
    pub median_s: f64,
    pub min_s: f64,
    pub reps: usize,
}

impl Timing {
    /// Median (mean of the middle two for an even count) and minimum.
    pub fn from_samples(samples: &mut [f64]) -> Timing {
        assert!(!samples.is_empty(), "a block has at least one call");
        samples.sort_by(f64::total_cmp);
        let n = samples.len();
        let median_s = if n % 2 == 1 {
            samples[n / 2]
        } else {
            0.5 * (samples[n / 2 - 1] + samples[n / 2])
        };
        Timing {
            median_s,
            min_s: samples[0],
            reps: n,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn copies_exceed_the_total() {
        let m = Method::standard(256 << 20);
        assert_eq!(m.copies_for(64 << 20), 4);
        assert_eq!(m.copies_for(100 << 20), 3);
        assert_eq!(m.copies_for(1 << 30), 2);
        assert_eq!(m.copies_for(0), 256 << 20);
    }

    #[test]
    fn stop_rule() {
        let m = Method::standard(0);
        assert!(!m.block_done(4, 1.0));
        assert!(m.block_done(4, 10.0));
        assert!(!m.block_done(5, 0.3));
        assert!(m.block_done(5, 0.4));
        assert!(!m.block_done(2, 5.0));
        assert!(m.block_done(3, 1.5));
    }

    #[test]
    fn measure_rotates_copies_after_a_warm_up() {
        let mut m = Method::quick(0);
        m.min_reps = 7;
        m.min_time_s = 0.0;
        let mut seen = Vec::new();
        let t = m.measure(3, |c| seen.push(c));
        assert_eq!(seen, [2, 0, 1, 2, 0, 1, 2, 0]);
        assert_eq!(t.reps, 7);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]
        #[test]
        fn median_is_the_middle(mut v in proptest::collection::vec(0.0f64..1.0, 1..40)) {
            let t = Timing::from_samples(&mut v.clone());
            v.sort_by(f64::total_cmp);
            let below = v.iter().filter(|&&x| x < t.median_s).count();
            let above = v.iter().filter(|&&x| x > t.median_s).count();
            prop_assert!(below <= v.len() / 2 && above <= v.len() / 2);
            prop_assert_eq!(t.min_s, v[0]);
            prop_assert_eq!(t.reps, v.len());
        }
    }
}
