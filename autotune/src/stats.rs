//! Timing statistics: median and median absolute deviation (robust against
//! the occasional preempted call on a shared machine), and the interval two
//! timings are compared with.

use serde::{Deserialize, Serialize};

/// Relative half-width every interval has at least: differences below it
/// are noise on a VM and are not allowed to flip a winner (so two runs
/// agree; the solver's cost decides instead).
pub const MIN_REL_SPREAD: f64 = 0.02;

/// How many MADs the interval extends each side of the median.
pub const MAD_WIDTH: f64 = 2.0;

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

    /// Half-width of the interval around the median.
    pub fn half_width(&self) -> f64 {
        (MAD_WIDTH * self.mad_ns).max(MIN_REL_SPREAD * self.median_ns)
    }

    pub fn interval(&self) -> (f64, f64) {
        let h = self.half_width();
        (self.median_ns - h, self.median_ns + h)
    }

    /// Whether the two intervals overlap: the timings do not tell the
    /// candidates apart.
    pub fn ties(&self, other: &Timing) -> bool {
        let (a0, a1) = self.interval();
        let (b0, b1) = other.interval();
        a0 <= b1 && b0 <= a1
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

    #[test]
    fn intervals_tie_when_they_overlap() {
        let t = |m: f64, mad: f64| Timing {
            median_ns: m,
            mad_ns: mad,
            samples: 5,
        };
        // 2% floor: 100 ± 2 and 104 ± 2.08 touch at 102 / 101.92: overlap.
        assert!(t(100.0, 0.0).ties(&t(104.0, 0.0)));
        assert!(!t(100.0, 0.0).ties(&t(105.0, 0.0)));
        // Wide dispersion widens the interval.
        assert!(t(100.0, 15.0).ties(&t(130.0, 0.0)));
        assert!(!t(100.0, 15.0).ties(&t(130.0, 0.0).with_mad(0.0).shifted(20.0)));
    }

    impl Timing {
        fn with_mad(mut self, mad: f64) -> Timing {
            self.mad_ns = mad;
            self
        }
        fn shifted(mut self, by: f64) -> Timing {
            self.median_ns += by;
            self
        }
    }
}
