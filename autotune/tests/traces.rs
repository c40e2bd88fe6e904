//! The decision rule on timing traces of one device in three runs, with the
//! noise users saw on an idle 2-core VM: the same GEMV at 244, 388 and
//! 269 µs in three runs (a whole-run factor), the machine drifting between
//! blocks within a run, and 10–40% outliers in a fifth of the calls.
//!
//! The decisions (the three winners, M1, M2) are a pure function of the
//! trace; the three runs must give the same ones. The previous rule (one
//! median ± max(2·MAD, 2%) per kernel, ties to the cost at each M, plain
//! bisection) is replayed on the same traces to show the test can fail: it
//! does not agree with itself across the runs.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tessera_autotune::decide::{self, Blocks, Entrant};
use tessera_autotune::search;
use tessera_autotune::stats::{Timing, median};

/// A kernel of the device model: time at M (ns) and its tile.
#[derive(Clone, Copy)]
struct Kernel {
    name: &'static str,
    tile: [u64; 2],
    base: f64,
    per_m: f64,
    /// Flat GEMM: below its tile's rows the tuner runs a step of M rows.
    stepped: bool,
}

impl Kernel {
    /// A kernel runs whole tiles: the rows it wastes at M
    /// (ceil(M / ep) · ep − M) cost like real ones, the sawtooth the main
    /// job measures between flat GEMM and GEMM. Below its tile's rows flat
    /// GEMM runs a step of M rows (per-M tiles), so no waste there.
    fn time(&self, m: usize) -> f64 {
        let ep = self.tile[0] as usize;
        let rows = if self.stepped && m <= ep {
            m
        } else {
            m.div_ceil(ep) * ep
        };
        self.base + self.per_m * (rows as f64 - 1.0)
    }

    /// Formula (2) of the solver for [2048, 1536] at M rows.
    fn cost(&self, m: usize) -> u128 {
        let (n, k) = (2048u64, 1536u64);
        let [ep, hp] = self.tile;
        u128::from((m as u64).div_ceil(ep) * n.div_ceil(hp) * (k * ep + k * hp + ep * hp))
    }
}

/// qkv [2048, 1536], W4A8: three GEMV tiles (two within 1.5% of each
/// other), three flat tiles, three GEMM tiles; flat GEMM overtakes GEMV
/// at M = 2, and GEMM overtakes flat GEMM slowly (equal near M = 52: 14%
/// slower at 33, 9% faster at 73, the values users saw M2 jump between).
const GEMV: [Kernel; 3] = [
    Kernel {
        name: "gemv 1x32",
        tile: [1, 32],
        base: 244e3,
        per_m: 200e3,
        stepped: false,
    },
    Kernel {
        name: "gemv 1x16",
        tile: [1, 16],
        base: 247.6e3,
        per_m: 203e3,
        stepped: false,
    },
    Kernel {
        name: "gemv 1x8",
        tile: [1, 8],
        base: 305e3,
        per_m: 250e3,
        stepped: false,
    },
];
const FLAT: [Kernel; 3] = [
    Kernel {
        name: "flat 8x8",
        tile: [8, 8],
        base: 300e3,
        per_m: 12e3,
        stepped: true,
    },
    Kernel {
        name: "flat 4x8",
        tile: [4, 8],
        base: 360e3,
        per_m: 15e3,
        stepped: true,
    },
    Kernel {
        name: "flat 8x16",
        tile: [8, 16],
        base: 306e3,
        per_m: 12.2e3,
        stepped: true,
    },
];
const GEMM: [Kernel; 3] = [
    Kernel {
        name: "gemm 5x8",
        tile: [5, 8],
        base: 553e3,
        per_m: 7e3,
        stepped: false,
    },
    Kernel {
        name: "gemm 6x8",
        tile: [6, 8],
        base: 700e3,
        per_m: 8e3,
        stepped: false,
    },
    Kernel {
        name: "gemm 5x16",
        tile: [5, 16],
        base: 560e3,
        per_m: 7.1e3,
        stepped: false,
    },
];

/// A second device where GEMM never pulls away: the tiles the main job
/// picked on a Zen 3 (flat GEMM 8 rows, GEMM 10), within ±7% of each other
/// from M = 48 to 4096 along the sawtooth of their tiles' rows (17% apart
/// at 32, 6% at 48, 2% at 128, 1.5% the other way at 2048), as measured.
const GEMM_ALONG_THE_SAWTOOTH: [Kernel; 3] = [
    Kernel {
        name: "gemm 10x8",
        tile: [10, 8],
        base: 340e3,
        per_m: 12.0e3,
        stepped: false,
    },
    Kernel {
        name: "gemm 10x16",
        tile: [10, 16],
        base: 335e3,
        per_m: 11.95e3,
        stepped: false,
    },
    Kernel {
        name: "gemm 6x8",
        tile: [6, 8],
        base: 360e3,
        per_m: 12.5e3,
        stepped: false,
    },
];

/// One run's noise: a whole-run factor, per-block drift shared by the
/// kernels timed in that block pair, outliers and jitter per call.
struct Run {
    seed: u64,
    factor: f64,
}

fn rng(parts: &[u64]) -> ChaCha8Rng {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        h ^= p;
        h = h.wrapping_mul(0x0000_0100_0000_01b3).rotate_left(29);
    }
    ChaCha8Rng::seed_from_u64(h)
}

fn name_hash(s: &str) -> u64 {
    s.bytes()
        .fold(7u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)))
}

const BLOCKS: usize = 3;
const PER_BLOCK: usize = 5;

impl Run {
    /// The machine's state in block `b` of the measurement `group` at `m`
    /// (drift of up to ±12% between blocks, shared by the kernels
    /// interleaved in it).
    fn drift(&self, group: u64, m: usize, b: usize) -> f64 {
        let mut r = rng(&[self.seed, group, m as u64, b as u64, 1]);
        1.0 + r.gen_range(-0.12..0.12)
    }

    fn block(&self, k: &Kernel, group: u64, m: usize, b: usize) -> Vec<f64> {
        let d = self.drift(group, m, b);
        let mut r = rng(&[self.seed, name_hash(k.name), group, m as u64, b as u64, 2]);
        (0..PER_BLOCK)
            .map(|_| {
                let jitter = 1.0 + r.gen_range(-0.02..0.02);
                let outlier = if r.gen_bool(0.2) {
                    1.0 + r.gen_range(0.10..0.40)
                } else {
                    1.0
                };
                k.time(m) * self.factor * d * jitter * outlier
            })
            .collect()
    }

    /// The blocks of kernels timed together (interleaved) at `m`.
    fn group(&self, ks: &[&Kernel], group: u64, m: usize) -> Vec<Blocks> {
        ks.iter()
            .map(|k| Blocks((0..BLOCKS).map(|b| self.block(k, group, m, b)).collect()))
            .collect()
    }
}

#[derive(Debug, PartialEq, Eq)]
struct Decisions {
    winners: [&'static str; 3],
    m1: usize,
    m2: usize,
}

/// The tuner's rule (`decide`, as `tune` calls it: winners and clear
/// breakpoint verdicts settled by a second measurement), replayed on a
/// run's trace.
fn decide_new(run: &Run, gemm: &'static [Kernel; 3]) -> Decisions {
    let mut floor = 0.0;
    let mut seen = Vec::new();
    let mut winners = Vec::new();
    for (i, (kernels, m)) in [(&GEMV, 1usize), (&FLAT, 8), (gemm, 128)]
        .into_iter()
        .enumerate()
    {
        let refs: Vec<&Kernel> = kernels.iter().collect();
        let blocks = run.group(&refs, 10 + i as u64, m);
        let entrants: Vec<Entrant> = kernels
            .iter()
            .zip(&blocks)
            .enumerate()
            .map(|(order, (k, b))| Entrant {
                blocks: b.clone(),
                cost: k.cost(m),
                order,
            })
            .collect();
        let c = decide::choose(&entrants, floor).unwrap();
        seen.extend(c.verdicts.iter().map(|v| v.1));
        floor = decide::pooled_floor(&seen);
        let w = decide::settle_winner(&c, &entrants, floor, || {
            Ok::<_, ()>(run.group(&refs, 20 + i as u64, m))
        })
        .unwrap();
        winners.push(kernels[w]);
    }
    let (g, f, e) = (winners[0], winners[1], winners[2]);
    let tie_up = |lo: &Kernel, up: &Kernel, rep: usize| up.cost(rep) <= lo.cost(rep);
    let duel = |lo: &Kernel, up: &Kernel, group: u64, tie: bool, m: usize| {
        let b = run.group(&[lo, up], group, m);
        let first = decide::compare(&b[0], &b[1], floor).unwrap();
        let mut retimes = 0;
        let v = decide::settle_verdict(first, || {
            retimes += 1;
            let again = run.group(&[lo, up], group + 100 * retimes, m);
            Ok::<_, ()>(decide::compare(&again[0], &again[1], floor).unwrap())
        })?;
        Ok::<bool, ()>(decide::upper_serves(&v, tie))
    };
    let m1 =
        decide::confirmed_breakpoint(1, 4096, |m| duel(&g, &f, 1, tie_up(&g, &f, 8), m)).unwrap();
    let m2 = decide::confirmed_breakpoint(m1, 4096, |m| duel(&f, &e, 2, tie_up(&f, &e, 128), m))
        .unwrap();
    Decisions {
        winners: [g.name, f.name, e.name],
        m1,
        m2,
    }
}

/// The previous rule: per kernel one median ± max(2·MAD, 2%) over all its
/// samples; the fastest wins unless tied with a cheaper one; a breakpoint
/// probe tied goes to the cost at that M; plain galloping bisection.
fn decide_old(run: &Run, gemm: &'static [Kernel; 3]) -> Decisions {
    let timing = |b: &Blocks| Timing::from_samples(&b.all()).unwrap();
    let half = |t: &Timing| (2.0 * t.mad_ns).max(0.02 * t.median_ns);
    let ties = |a: &Timing, b: &Timing| {
        a.median_ns - half(a) <= b.median_ns + half(b)
            && b.median_ns - half(b) <= a.median_ns + half(a)
    };
    let mut winners = Vec::new();
    for (i, (kernels, m)) in [(&GEMV, 1usize), (&FLAT, 8), (gemm, 128)]
        .into_iter()
        .enumerate()
    {
        let refs: Vec<&Kernel> = kernels.iter().collect();
        let t: Vec<Timing> = run
            .group(&refs, 10 + i as u64, m)
            .iter()
            .map(timing)
            .collect();
        let fastest = (0..3)
            .min_by(|&a, &b| t[a].median_ns.total_cmp(&t[b].median_ns))
            .unwrap();
        let w = (0..3)
            .filter(|&j| j == fastest || ties(&t[j], &t[fastest]))
            .min_by_key(|&j| (kernels[j].cost(m), j))
            .unwrap();
        winners.push(kernels[w]);
    }
    let (g, f, e) = (winners[0], winners[1], winners[2]);
    let duel = |lo: &Kernel, up: &Kernel, group: u64, m: usize| {
        let b = run.group(&[lo, up], group, m);
        let (tl, tu) = (timing(&b[0]), timing(&b[1]));
        Ok::<bool, ()>(if ties(&tl, &tu) {
            up.cost(m) <= lo.cost(m)
        } else {
            tu.median_ns < tl.median_ns
        })
    };
    let m1 = search::breakpoint(1, 4096, |m| duel(&g, &f, 1, m)).unwrap();
    let m2 = search::breakpoint(m1, 4096, |m| duel(&f, &e, 2, m)).unwrap();
    Decisions {
        winners: [g.name, f.name, e.name],
        m1,
        m2,
    }
}

/// Three runs of one device: the factors of the GEMV users saw (244, 388,
/// 269 µs).
fn runs(device: u64) -> [Run; 3] {
    [1.0, 388.0 / 244.0, 269.0 / 244.0].map(|factor| Run {
        seed: device * 1000 + (factor * 100.0) as u64,
        factor,
    })
}

/// Whether three runs decide the same: the same winners, M1 and M2.
fn agree(d: &[Decisions]) -> bool {
    d.windows(2).all(|w| w[0] == w[1])
}

/// The two device models: GEMM overtaking flat GEMM (equal near M = 52),
/// and GEMM tied with it along the sawtooth.
const DEVICES: [(&str, &[Kernel; 3]); 2] = [
    ("overtaking", &GEMM),
    ("along the sawtooth", &GEMM_ALONG_THE_SAWTOOTH),
];

/// Simulated devices per model.
const DEVICE_COUNT: u64 = 200;

#[test]
fn three_noisy_runs_of_one_device_decide_the_same() {
    for (model, gemm) in DEVICES {
        let mut disagree = Vec::new();
        for device in 0..DEVICE_COUNT {
            let d: Vec<Decisions> = runs(device).iter().map(|r| decide_new(r, gemm)).collect();
            if !agree(&d) {
                disagree.push((device, d));
                continue;
            }
            // What they agree on is right: never a clearly slower tile, M1
            // at the sharp crossover, M2 past the crossing (GEMM 21% faster
            // at 128) or, where the two tie, at the first tie once flat
            // GEMM's clear lead (17% at 32) is over.
            assert!(
                d[0].winners[0] != "gemv 1x8" && d[0].m1 == 2 && d[0].m2 == 128,
                "{model}, device {device}: {d:?}"
            );
        }
        // The trace's tails (a run whose noise floor reaches the 15% cap,
        // two measurements of a 2% gap both at 17%) still split a device's
        // runs now and then: at most 1 in 50 devices.
        eprintln!(
            "{model}: three runs disagree on {} of {DEVICE_COUNT} devices",
            disagree.len()
        );
        assert!(
            disagree.len() as u64 * 50 <= DEVICE_COUNT,
            "{model}: {disagree:?}"
        );
    }
}

#[test]
fn the_previous_rule_does_not_agree_with_itself_on_the_same_traces() {
    for (model, gemm) in DEVICES {
        let old: Vec<Vec<Decisions>> = (0..DEVICE_COUNT)
            .map(|device| runs(device).iter().map(|r| decide_old(r, gemm)).collect())
            .collect();
        let disagree = old.iter().filter(|d| !agree(d)).count();
        eprintln!(
            "{model}: the previous rule disagrees with itself on {disagree} of {DEVICE_COUNT} devices"
        );
        // The assertion the new rule passes fails for the old one.
        assert!(disagree as u64 * 50 > DEVICE_COUNT, "{model}: {disagree}");
    }
}

#[test]
fn the_trace_has_the_noise_it_claims() {
    // Sanity of the generator: the GEMV's medians across the three runs
    // differ like the users' (about 60%), and a fifth of calls are outliers.
    let k = &GEMV[0];
    let med: Vec<f64> = runs(0)
        .iter()
        .map(|r| median(&r.group(&[k], 10, 1)[0].all()).unwrap())
        .collect();
    let spread =
        med.iter().copied().fold(0.0, f64::max) / med.iter().copied().fold(f64::MAX, f64::min);
    assert!(spread > 1.4, "{med:?}");
}
