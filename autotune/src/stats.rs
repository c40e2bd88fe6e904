//! Timing statistics: median and median absolute deviation (robust against
//! the occasional preempted call on a shared machine). How two timings are
//! compared is [`crate::decide`]'s.

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
