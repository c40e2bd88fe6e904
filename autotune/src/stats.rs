//! Timing statistics: median and median absolute deviation (robust against
//! the occasional preempted call on a shared machine). How two timings are
//! compared is [`crate::decide`]'s.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// Median and dispersion of repeated calls.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Timing {
    pub median_ns: f64,
    /// Median absolute deviation, ns.
    pub mad_ns: f64,
    pub samples: u32,
}

impl Timing {
    /// From raw samples (ns). `None` when there are none.
    pub fn from_samples(samples: &[f64]) -> Option<Timing> {
        let median = median(samples)?;
        let deviations: Vec<f64> = samples.iter().map(|s| (s - median).abs()).collect();
        Some(Timing {
            median_ns: median,
            mad_ns: median_of(deviations)?,
            samples: samples.len() as u32,
        })
    }
}

/// The median seconds per `call` after one untimed warm-up: at least
/// `min_calls` timed one by one, more while `slice` lasts, at most
/// `max_calls` (`min_calls` ≥ 1). The first error ends it.
pub fn median_call_secs<E>(
    mut call: impl FnMut() -> Result<(), E>,
    min_calls: usize,
    max_calls: usize,
    slice: Duration,
) -> Result<f64, E> {
    call()?;
    let (mut secs, start) = (Vec::new(), Instant::now());
    while secs.len() < min_calls.max(1) || (start.elapsed() < slice && secs.len() < max_calls) {
        let t0 = Instant::now();
        call()?;
        secs.push(t0.elapsed().as_secs_f64());
    }
    Ok(median(&secs).unwrap_or(f64::NAN))
}

pub fn median(samples: &[f64]) -> Option<f64> {
    median_of(samples.to_vec())
}

fn median_of(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_is_warmed_up_then_timed_at_least_and_at_most_as_asked() {
        let mut calls = 0;
        let t = median_call_secs(
            || {
                calls += 1;
                Ok::<(), ()>(())
            },
            4,
            6,
            Duration::ZERO,
        );
        assert!(t.is_ok_and(|t| t.is_finite() && t >= 0.0));
        assert_eq!(calls, 1 + 4, "a warm-up and the minimum");
        calls = 0;
        let _ = median_call_secs(
            || {
                calls += 1;
                Ok::<(), ()>(())
            },
            1,
            6,
            Duration::from_secs(60),
        );
        assert_eq!(calls, 1 + 6, "the slice lasts: the maximum");
        let mut left = 3;
        let failed = median_call_secs(
            || {
                left -= 1;
                if left == 0 { Err("third call") } else { Ok(()) }
            },
            5,
            5,
            Duration::ZERO,
        );
        assert_eq!(failed, Err("third call"));
    }

    #[test]
    fn median_and_mad() {
        let t = Timing::from_samples(&[10.0, 12.0, 11.0, 100.0, 9.0]).unwrap();
        assert_eq!(t.median_ns, 11.0);
        // deviations 1, 1, 0, 89, 2 -> median 1
        assert_eq!(t.mad_ns, 1.0);
        assert_eq!(t.samples, 5);
        let even = Timing::from_samples(&[1.0, 3.0]).unwrap();
        assert_eq!(even.median_ns, 2.0);
        assert!(Timing::from_samples(&[]).is_none());
    }
}
