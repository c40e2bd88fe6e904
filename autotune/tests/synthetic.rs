//! The driver on synthetic cost models with a virtual clock: breakpoints,
//! ties, determinism, budget handling, resume and interrupts, with no real
//! kernel and no real time.

use std::cell::Cell;
use std::time::Duration;
use tessera_dsl::ir::ParamType;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tessera_autotune::decide::{self, Blocks};
use tessera_autotune::tune::{
    Bench, BenchError, Candidate, Event, ShapeSpec, SolverCtx, Stop, Traffic, TuneConfig,
    TuneError, tune,
};
use tessera_codegen::target::{MacClass, TargetCaps};
use tessera_codegen::tile::TileConfig;
use tessera_dsl::ir::{Format, Group, Variant};
use tessera_runtime::record::Limits;

type Model = fn(Variant, [u32; 3], usize) -> f64;

/// Time of one call in ns: a per-variant line in M, the tile adding a few
/// percent so candidates differ.
fn model(variant: Variant, tile: [u32; 3], m: usize) -> f64 {
    let m = m as f64;
    // Tiles differ by 0, 10 or 20%: clearly apart, or exactly tied.
    let tile_penalty = 1.0 + 0.1 * f64::from((tile[0] + tile[1] / 8) % 3);
    let base = match variant {
        Variant::Gemv => 100_000.0 * m,
        Variant::FlatGemm => 150_000.0 + 10_000.0 * m,
        Variant::Gemm => 400_000.0 + 2_000.0 * m,
    };
    base * tile_penalty
}

struct Sim {
    clock: Cell<f64>,
    model: Model,
    rng: ChaCha8Rng,
    noise: f64,
    calls: usize,
    stop_after: Option<usize>,
    refuse: Option<Variant>,
    /// Time factor of flat tiles on 32 registers (x86 zmm), whose shapes
    /// the ymm target may share.
    zmm_flat: f64,
    /// The same factor on one worker, where the bench can limit them
    /// (`None`: it cannot).
    zmm_flat_alone: Option<f64>,
    /// Calls run on one worker ([`Bench::limit_workers`]).
    alone: bool,
    /// Calls made on one worker.
    calls_alone: usize,
}

impl Sim {
    fn new(model: Model, seed: u64, noise: f64) -> Sim {
        Sim {
            clock: Cell::new(0.0),
            model,
            rng: ChaCha8Rng::seed_from_u64(seed),
            noise,
            calls: 0,
            stop_after: None,
            refuse: None,
            zmm_flat: 1.0,
            zmm_flat_alone: None,
            alone: false,
            calls_alone: 0,
        }
    }
}

impl Bench for Sim {
    fn elapsed(&self) -> Duration {
        Duration::from_nanos(self.clock.get() as u64)
    }
    fn prepare(&mut self, _shape: &ShapeSpec, cand: &Candidate) -> Result<(), BenchError> {
        self.clock.set(self.clock.get() + 1e6);
        if Some(cand.variant) == self.refuse {
            return Err(BenchError("refused".into()));
        }
        Ok(())
    }
    fn call(&mut self, shape: &ShapeSpec, cand: &Candidate, m: usize) -> Result<f64, BenchError> {
        self.calls += 1;
        let scale = (shape.n * shape.k) as f64 / (2048.0 * 1536.0);
        let jitter = 1.0 + self.noise * (self.rng.gen_range(-1.0..1.0));
        let zmm = cand.variant == Variant::FlatGemm && cand.tile.accounting.budget == 32;
        self.calls_alone += usize::from(self.alone);
        let zmm_factor = match self.zmm_flat_alone {
            Some(f) if self.alone => f,
            _ => self.zmm_flat,
        };
        let t = (self.model)(cand.variant, cand.tile3(), m)
            * scale
            * jitter
            * if zmm { zmm_factor } else { 1.0 };
        self.clock.set(self.clock.get() + t);
        Ok(t)
    }
    fn release(&mut self, _cand: &Candidate) {}
    fn release_all(&mut self) {}
    fn interrupted(&self) -> bool {
        self.stop_after.is_some_and(|n| self.calls >= n)
    }
    fn limit_workers(&mut self, workers: Option<usize>) -> bool {
        self.alone = self.zmm_flat_alone.is_some() && workers == Some(1);
        self.alone
    }
}

fn shapes() -> Vec<ShapeSpec> {
    [("qkv", 2048, 1536), ("o", 1536, 1536), ("down", 1536, 8960)]
        .into_iter()
        .map(|(name, n, k)| ShapeSpec {
            name: name.into(),
            n,
            k,
        })
        .collect()
}

fn config(deadline_secs: f64) -> TuneConfig {
    TuneConfig {
        threads: 2,
        deadline: Duration::from_secs_f64(deadline_secs),
        neighbours: 2,
        min_samples: 3,
        max_samples: 15,
        limits: Limits {
            read_gbps: 20.0,
            mac_gops: 100.0,
        },
        traffic: Traffic {
            x: Format::I8Dyn,
            w: Format::U4Asym(Group::Size(32), ParamType::F32),
            y: Format::F32,
        },
        target: "x86-avx2".into(),
        kernel: tessera_dsl::library::get("matmul-w4a8").ok(),
        one_weight_copy: false,
    }
}

fn accept_all(_: &TileConfig) -> bool {
    true
}

fn solver() -> SolverCtx<'static> {
    SolverCtx {
        caps: TargetCaps::by_name("x86-avx2").unwrap(),
        gemv_caps: TargetCaps::by_name("x86-avx2").unwrap(),
        gemm_caps: TargetCaps::by_name("x86-avx2").unwrap(),
        class: MacClass::Int8,
        weight_dequant: false,
        weight_groups: false,
        nibble_runs: false,
        accept: &accept_all,
    }
}

fn run(sim: &mut Sim, deadline: f64) -> tessera_autotune::tune::TuneOutcome {
    tune(
        sim,
        &solver(),
        &shapes(),
        &[],
        &config(deadline),
        &mut |_| {},
    )
    .unwrap()
}

/// Whether the upper kernel serves `m` on the exact model, by the
/// driver's rule: faster beyond the margin, or tied and preferred by the
/// solver's cost of the two winners at the upper variant's representative M.
fn upper_wins_at(
    lower: &Candidate,
    upper: &Candidate,
    tie_to_upper: bool,
    m: usize,
    n: usize,
    k: usize,
) -> bool {
    let exact = |c: &Candidate, m: usize| {
        let t = model(c.variant, c.tile3(), m) * (n * k) as f64 / (2048.0 * 1536.0);
        Blocks(vec![vec![t]; 3])
    };
    let v = decide::compare(&exact(lower, m), &exact(upper, m), 0.0).unwrap();
    decide::upper_serves(&v, tie_to_upper)
}

/// The driver's tie rule between two variants' winners.
fn tie_to_upper(lower: &Candidate, upper: &Candidate, n: usize, k: usize) -> bool {
    let s = solver();
    let m = tessera_autotune::tune::representative_m(upper.variant);
    s.cost(upper.tile3(), m, n, k) <= s.cost(lower.tile3(), m, n, k)
}

/// The flat candidate the driver times at `m`: the flat winner with
/// ep = min(m, its ep).
fn flat_at(flat: &Candidate, m: usize, n: usize, k: usize) -> Candidate {
    let s = solver();
    let want = tessera_autotune::tune::flat_tile_for(flat.tile3(), m, s.row_unit());
    let tile = tessera_codegen::tile::feasible(s.caps, &s.problem(m, n, k))
        .unwrap()
        .into_iter()
        .find(|t| [t.ep, t.hp, t.lp] == want)
        .unwrap();
    Candidate { tile, ..*flat }
}

/// The first M of the breakpoint grid where the upper kernel wins, by a
/// linear scan of the model
/// (what the galloping bisection must reproduce), the flat side at the tile
/// of each M.
fn linear_breakpoint_stepped(
    lower: &Candidate,
    upper: &Candidate,
    from: usize,
    n: usize,
    k: usize,
) -> usize {
    let tie = tie_to_upper(lower, upper, n, k);
    decide::grid(from, 4096)
        .into_iter()
        .find(|&m| {
            let (l, u) = match (lower.variant, upper.variant) {
                (Variant::FlatGemm, _) => (flat_at(lower, m, n, k), *upper),
                _ => (*lower, flat_at(upper, m, n, k)),
            };
            upper_wins_at(&l, &u, tie, m, n, k)
        })
        .unwrap_or(4097)
}

fn candidate_of(shape: &tessera_runtime::record::ShapeEntry, v: Variant) -> Candidate {
    let w = shape.winner(v).unwrap();
    let s = solver();
    let all = s.candidates(v, shape.n, shape.k, 2).unwrap();
    *all.iter().find(|c| c.tile3() == w.tile).unwrap()
}

#[test]
fn breakpoints_match_a_linear_scan_of_the_model() {
    let mut sim = Sim::new(model, 1, 0.0);
    let out = run(&mut sim, 1e6);
    assert_eq!(out.stopped, None);
    assert_eq!(out.shapes.len(), 3);
    assert!(out.shapes.iter().any(|s| !s.flat_steps().is_empty()));
    for shape in &out.shapes {
        let (g, f, m) = (
            candidate_of(shape, Variant::Gemv),
            candidate_of(shape, Variant::FlatGemm),
            candidate_of(shape, Variant::Gemm),
        );
        let m1 = linear_breakpoint_stepped(&g, &f, 1, shape.n, shape.k);
        let m2 = linear_breakpoint_stepped(&f, &m, m1, shape.n, shape.k);
        // One flat step per M from M1 below the flat winner's ep, then the
        // winner from its ep, all on its hp and lp.
        let steps = shape.flat_steps();
        let ep = f.tile.ep as usize;
        let want: Vec<usize> = if m1 < ep.min(m2) {
            (m1..ep.min(m2)).chain((ep < m2).then_some(ep)).collect()
        } else {
            Vec::new()
        };
        assert_eq!(
            steps.iter().map(|(m, _)| *m).collect::<Vec<_>>(),
            want,
            "{}",
            shape.name
        );
        for (from_m, w) in &steps {
            assert_eq!(
                w.tile,
                tessera_autotune::tune::flat_tile_for(f.tile3(), *from_m, solver().row_unit())
            );
        }
        assert_eq!((shape.m1, shape.m2), (m1, m2), "{}", shape.name);
        // The model: GEMV loses from M = 2, flat GEMM near M = 31.
        assert_eq!(shape.m1, 2, "{}", shape.name);
        assert!(
            (25..=40).contains(&shape.m2),
            "{}: {}",
            shape.name,
            shape.m2
        );
        // Far fewer measurements than a dense sweep of 4096 Ms.
        assert!(
            shape.measurements.len() < 40,
            "{}",
            shape.measurements.len()
        );
        // GEMV winners have ep = 1.
        assert_eq!(shape.winner(Variant::Gemv).unwrap().tile[0], 1);
        assert!(
            shape
                .winners
                .iter()
                .all(|w| w.kernel.starts_with("matmul_"))
        );
    }
}

#[test]
fn same_seed_gives_the_same_record_and_noise_below_the_tie_width_changes_nothing() {
    let pick = |seed: u64, noise: f64| {
        let mut sim = Sim::new(model, seed, noise);
        run(&mut sim, 1e6)
            .shapes
            .into_iter()
            .map(|s| (s.m1, s.m2, s.winners))
            .collect::<Vec<_>>()
    };
    assert_eq!(pick(7, 0.01), pick(7, 0.01));
    // Other noise: the winners and M1 (a sharp crossover) do not move; M2
    // sits where the two kernels' times cross slowly, so a probe whose true
    // difference is at the tie interval's edge can go either way: it moves
    // by at most a few rows (the bounded difference docs/AUTOTUNE.md
    // describes for real timings).
    let clean = pick(1, 0.0);
    for seed in 0..8 {
        let noisy = pick(seed, 0.003);
        for (a, b) in noisy.iter().zip(&clean) {
            assert_eq!((a.0, &a.2), (b.0, &b.2), "seed {seed}");
            assert!(a.1.abs_diff(b.1) <= 3, "seed {seed}: M2 {} vs {}", a.1, b.1);
        }
    }
}

#[test]
fn ties_go_to_the_solver_cost() {
    // Every tile of a variant takes the same time: the winner is the
    // solver's optimum (order 0), run after run.
    fn flat(variant: Variant, _tile: [u32; 3], m: usize) -> f64 {
        model(variant, [0, 0, 0], m)
    }
    let mut sim = Sim::new(flat, 3, 0.005);
    let out = run(&mut sim, 1e6);
    let s = solver();
    for shape in &out.shapes {
        for v in Variant::ALL {
            let best = s.candidates(v, shape.n, shape.k, 2).unwrap()[0];
            assert_eq!(
                shape.winner(v).unwrap().tile,
                best.tile3(),
                "{} {v}",
                shape.name
            );
        }
    }
}

#[test]
fn a_variant_that_serves_no_m_records_the_solver_pick() {
    // GEMV is slower than flat GEMM at M = 1 and GEMM slower than flat GEMM
    // everywhere, so neither serves an M; their tiles still differ by 10
    // or 20% (which would pick a winner by time). The record names the
    // solver's pick for both, as nothing that runs decides between them.
    fn neither(variant: Variant, tile: [u32; 3], m: usize) -> f64 {
        let m_f = m as f64;
        let tile_penalty = 1.0 + 0.1 * f64::from((tile[0] + tile[1] / 8) % 3);
        let base = match variant {
            Variant::Gemv => 300_000.0 * m_f,
            Variant::FlatGemm => 150_000.0 + 10_000.0 * m_f,
            Variant::Gemm => 400_000.0 + 20_000.0 * m_f,
        };
        // The penalty only among GEMV and GEMM tiles: the flat tile must
        // not change with it.
        if variant == Variant::FlatGemm {
            base
        } else {
            base * tile_penalty
        }
    }
    let mut sim = Sim::new(neither, 5, 0.0);
    let out = run(&mut sim, 1e6);
    let s = solver();
    for shape in &out.shapes {
        assert_eq!((shape.m1, shape.m2), (1, 4097), "{}", shape.name);
        for v in [Variant::Gemv, Variant::Gemm] {
            let pick = s.candidates(v, shape.n, shape.k, 2).unwrap()[0];
            assert_eq!(
                shape.winner(v).unwrap().tile,
                pick.tile3(),
                "{} {v}",
                shape.name
            );
        }
    }
}

#[test]
fn a_small_budget_stops_at_the_deadline_and_keeps_finished_shapes() {
    // A full run takes this long on the virtual clock.
    let mut sim = Sim::new(model, 1, 0.0);
    run(&mut sim, 1e6);
    let full = sim.clock.get() * 1e-9;
    for frac in [0.02, 0.3, 0.6] {
        let deadline = full * frac;
        let mut sim = Sim::new(model, 1, 0.0);
        let out = run(&mut sim, deadline);
        let used = sim.clock.get() * 1e-9;
        // Stopped, or finished on fewer samples: never far past the deadline
        // (one warm-up call of the longest probe at most).
        assert!(
            used <= deadline * 1.05 + 0.01,
            "{frac}: used {used} of {deadline}"
        );
        if let Some(stop) = out.stopped {
            assert_eq!(stop, Stop::Budget);
            assert!(out.shapes.len() < 3);
        }
        for s in &out.shapes {
            assert!(s.m1 <= s.m2 && s.winners.len() == 3 + s.flat_steps().len());
            assert!(s.measurements.iter().all(|m| m.samples >= 3));
        }
    }
    // A budget of 60% of the full run finishes by taking fewer samples.
    let samples = |o: &tessera_autotune::tune::TuneOutcome| -> u32 {
        o.shapes
            .iter()
            .flat_map(|s| s.measurements.iter().map(|m| m.samples))
            .sum()
    };
    let mut sim = Sim::new(model, 1, 0.0);
    let all = run(&mut sim, 1e6);
    let mut sim = Sim::new(model, 1, 0.0);
    let out = run(&mut sim, full * 0.6);
    assert_eq!(out.stopped, None);
    assert!(
        samples(&out) < samples(&all),
        "{} vs {}",
        samples(&out),
        samples(&all)
    );
}

#[test]
fn resume_continues_a_partial_run() {
    let mut sim = Sim::new(model, 1, 0.0);
    let full = run(&mut sim, 1e6);
    let total = sim.clock.get() * 1e-9;
    let mut sim = Sim::new(model, 1, 0.0);
    let part = run(&mut sim, total * 0.3);
    assert_eq!(part.stopped, Some(Stop::Budget));
    let kept = part.shapes.clone();
    let mut sim = Sim::new(model, 1, 0.0);
    let mut started = Vec::new();
    let rest = tune(
        &mut sim,
        &solver(),
        &shapes(),
        &kept,
        &config(1e6),
        &mut |e| {
            if let Event::ShapeStarted { name, .. } = e {
                started.push(name);
            }
        },
    )
    .unwrap();
    assert_eq!(rest.stopped, None);
    assert_eq!(started.len(), 3 - kept.len());
    let names: Vec<&str> = rest.shapes.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, vec!["qkv", "o", "down"]);
    for (a, b) in rest.shapes.iter().zip(&full.shapes) {
        assert_eq!((a.m1, a.m2, &a.winners), (b.m1, b.m2, &b.winners));
    }
}

#[test]
fn interrupts_and_unbuildable_variants() {
    let mut sim = Sim::new(model, 1, 0.0);
    sim.stop_after = Some(60);
    let out = run(&mut sim, 1e6);
    assert_eq!(out.stopped, Some(Stop::Interrupted));
    let mut sim = Sim::new(model, 1, 0.0);
    sim.refuse = Some(Variant::FlatGemm);
    let err = tune(
        &mut sim,
        &solver(),
        &shapes(),
        &[],
        &config(1e6),
        &mut |_| {},
    )
    .unwrap_err();
    assert!(matches!(
        err,
        TuneError::NoCandidate {
            variant: Variant::FlatGemm,
            ..
        }
    ));
    assert!(err.to_string().contains("refused"), "{err}");
}

/// `one_weight_copy`: the GEMM is tuned first and every winner of a shape
/// (GEMV, flat GEMM and its steps, GEMM) shares its packing (hp, lp), so a
/// runtime holding one weight copy runs the record's tiles as measured;
/// without it the same model picks winners of several packings.
#[test]
fn one_weight_copy_winners_share_the_gemm_packing() {
    let packings = |one_weight_copy: bool| {
        let mut sim = Sim::new(model, 9, 0.0);
        let cfg = TuneConfig {
            one_weight_copy,
            ..config(1e6)
        };
        let out = tune(&mut sim, &solver(), &shapes(), &[], &cfg, &mut |_| {}).unwrap();
        out.shapes
            .iter()
            .map(|shape| {
                let mut p: Vec<[u32; 2]> = shape
                    .winners
                    .iter()
                    .map(|w| [w.tile[1], w.tile[2]])
                    .collect();
                p.sort();
                p.dedup();
                p.len()
            })
            .collect::<Vec<_>>()
    };
    let one = packings(true);
    assert!(one.iter().all(|&p| p == 1), "{one:?}");
    let free = packings(false);
    assert!(free.iter().any(|&p| p > 1), "{free:?}");
}

/// How much faster (or slower) [`wide_model`] makes steps of the GEMM's
/// packing, in percent of [`model`]'s time.
static WIDE_FACTOR_PERCENT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(100);

/// [`model`] with the flat winner kept on hp 8 (wider flat tiles twice as
/// slow at 8 rows, where it is chosen) and the GEMM winner on hp 16 (those
/// tiles twice as fast), so the two pack differently; and flat tiles of
/// other packings scaled by [`WIDE_FACTOR_PERCENT`] below 8 rows (where
/// only steps are timed).
fn wide_model(variant: Variant, tile: [u32; 3], m: usize) -> f64 {
    let t = model(variant, tile, m);
    match variant {
        Variant::Gemm if tile[1] == 16 => t / 2.0,
        Variant::FlatGemm if tile[1] != 8 && m == 8 => t * 2.0,
        Variant::FlatGemm if tile[1] != 8 => {
            let percent = WIDE_FACTOR_PERCENT.load(std::sync::atomic::Ordering::Relaxed);
            t * f64::from(percent) / 100.0
        }
        _ => t,
    }
}

/// Each M's flat step is timed against the step of the same rows on the
/// GEMM winner's packing: where that one is faster beyond the tie margin
/// the record takes it, where it is slower the flat packing's stays.
#[test]
fn flat_steps_take_the_gemm_packing_where_it_is_faster() {
    let solver = SolverCtx {
        gemm_caps: TargetCaps::by_name("x86-avx512").unwrap(),
        ..solver()
    };
    let steps = |percent: u32| {
        WIDE_FACTOR_PERCENT.store(percent, std::sync::atomic::Ordering::Relaxed);
        let mut sim = Sim::new(wide_model, 3, 0.0);
        let out = tune(&mut sim, &solver, &shapes(), &[], &config(1e6), &mut |_| {}).unwrap();
        out.shapes
            .into_iter()
            .map(|s| {
                let flat = s.winner(Variant::FlatGemm).unwrap().tile;
                let gemm = s.winner(Variant::Gemm).unwrap().tile;
                let steps: Vec<(usize, [u32; 3])> =
                    s.flat_steps().iter().map(|(m, w)| (*m, w.tile)).collect();
                (flat, gemm, steps)
            })
            .collect::<Vec<_>>()
    };
    let mut checked = 0;
    for (percent, wide_wins) in [(60, true), (150, false)] {
        for (flat, gemm, steps) in steps(percent) {
            assert_ne!(flat[1..], gemm[1..], "the test needs two packings");
            for (m, tile) in steps.iter().filter(|(m, _)| *m < flat[0] as usize) {
                // Rows whose GEMM-packed tile the flat target lacks keep
                // the flat packing's step.
                let feasible =
                    tessera_codegen::tile::feasible(solver.caps, &solver.problem(*m, 2048, 1536))
                        .unwrap()
                        .iter()
                        .any(|t| [t.ep, t.hp, t.lp] == [*m as u32, gemm[1], gemm[2]]);
                let wide = tile[1..] == gemm[1..];
                assert_eq!(
                    wide,
                    wide_wins && feasible,
                    "{percent}% m={m} {tile:?} flat {flat:?}"
                );
                assert_eq!(tile[0] as usize, *m, "{tile:?}");
                checked += usize::from(wide);
            }
        }
    }
    assert!(checked > 0);
}

/// [`model`] with zmm-wide flat tiles (hp 16, 8 rows or more) twice as
/// fast at 8 rows, so an AVX-512 GEMM target's flat tile wins there.
fn zmm_flat_model(variant: Variant, tile: [u32; 3], m: usize) -> f64 {
    let t = model(variant, tile, m);
    if variant == Variant::FlatGemm && tile[1] == 16 && tile[0] >= 8 {
        t / 2.0
    } else {
        t
    }
}

/// Grouped 4-bit weights (Q4_0's problem) with an AVX-512 GEMM: the zmm
/// flat candidates are 8 × 16 and 9 × 16, whose packing the AVX2 target
/// has tiles of.
fn q4_with_a_zmm_gemm() -> SolverCtx<'static> {
    SolverCtx {
        gemm_caps: TargetCaps::by_name("x86-avx512").unwrap(),
        weight_groups: true,
        nibble_runs: true,
        ..solver()
    }
}

/// A zmm flat winner steps, at each M of fewer rows, to a tile of M rows:
/// the AVX2 target's where it has that shape (here its zmm twin times the
/// same, and a tie keeps the AVX2 one; both pack alike), else the zmm one,
/// never the winner itself with rows to spare.
#[test]
fn a_zmm_flat_winner_steps_to_tiles_of_m_rows() {
    let solver = q4_with_a_zmm_gemm();
    let mut sim = Sim::new(zmm_flat_model, 5, 0.0);
    let out = tune(&mut sim, &solver, &shapes(), &[], &config(1e6), &mut |_| {}).unwrap();
    let mut checked = 0;
    for s in &out.shapes {
        let flat = s.winner(Variant::FlatGemm).unwrap();
        assert_eq!(flat.target, "x86-avx512", "{s:?}");
        let stepped: Vec<usize> = s.flat_steps().iter().map(|(m, _)| *m).collect();
        let below: Vec<usize> = (s.m1..s.m2.min(flat.tile[0] as usize)).collect();
        assert!(
            below.iter().all(|m| stepped.contains(m)),
            "{stepped:?} {below:?}"
        );
        for (m, w) in s.flat_steps() {
            if m >= flat.tile[0] as usize {
                continue;
            }
            assert_eq!(w.tile[0] as usize, m, "{m} {w:?}");
            assert_eq!(w.tile[1..], flat.tile[1..], "{m} {w:?}");
            let on_avx2 =
                tessera_codegen::tile::feasible(solver.caps, &solver.problem(m, s.n, s.k))
                    .unwrap()
                    .iter()
                    .any(|t| [t.ep, t.hp, t.lp] == w.tile);
            let want = if on_avx2 { "x86-avx2" } else { "x86-avx512" };
            assert_eq!(w.target, want, "{m} {w:?}");
            checked += 1;
        }
    }
    assert!(checked > 0);
}

/// A register-file duel tied at the record's threads (the bandwidth
/// hiding the arithmetic) is timed again on one worker, and that verdict
/// names the step's target; a tie there too keeps the ymm one. The shape's
/// measurements stay those of all the threads.
#[test]
fn a_register_tie_is_timed_again_on_one_thread() {
    let solver = q4_with_a_zmm_gemm();
    for (alone, want) in [(0.8, "x86-avx512"), (1.0, "x86-avx2"), (1.25, "x86-avx2")] {
        let mut sim = Sim::new(zmm_flat_model, 5, 0.0);
        sim.zmm_flat_alone = Some(alone);
        let out = tune(&mut sim, &solver, &shapes(), &[], &config(1e6), &mut |_| {}).unwrap();
        assert!(sim.calls_alone > 0, "×{alone}: nothing timed on one worker");
        assert!(!sim.alone, "×{alone}: the workers were not given back");
        let mut checked = 0;
        for s in &out.shapes {
            let alone_duels: Vec<_> = s
                .notes
                .decisions
                .iter()
                .filter(|d| d.step == "flat step registers on one thread")
                .collect();
            for d in &alone_duels {
                let tied = s
                    .notes
                    .decisions
                    .iter()
                    .find(|e| e.step == "flat step registers" && e.m == d.m)
                    .unwrap_or_else(|| panic!("no duel on all threads at M = {}", d.m));
                assert!(tied.tie, "{tied:?}");
                assert!(d.chose.ends_with(&format!(" on {want}")), "×{alone}: {d:?}");
                // (A duel at an M the GEMV serves names no step.)
                let Some((_, step)) = s.flat_steps().into_iter().find(|(m, _)| *m == d.m) else {
                    continue;
                };
                assert_eq!(step.target, want, "×{alone} at M = {}", d.m);
                // Every measurement is on all threads: the zmm step's time
                // is the model's, not the one-worker factor's.
                for x in s.measurements.iter().filter(|x| x.m == d.m) {
                    assert_eq!(x.threads, 2, "{x:?}");
                    let scale = (s.n * s.k) as f64 / (2048.0 * 1536.0);
                    let full = zmm_flat_model(x.variant, x.tile, x.m) * scale;
                    assert!(
                        (x.median_ns - full).abs() <= 1e-6 * full,
                        "×{alone}: {x:?} against {full}"
                    );
                }
                checked += 1;
            }
        }
        assert!(checked > 0, "×{alone}: no duel timed on one worker");
    }
}

/// Where a flat step's shape exists on both x86 targets (ymm and zmm pack
/// a 16-column tile alike) the two are timed against each other and the
/// record names the faster one's target; a tie keeps the ymm one.
#[test]
fn a_flat_step_on_both_register_files_takes_the_faster() {
    let solver = q4_with_a_zmm_gemm();
    for (zmm_flat, want) in [(0.7, "x86-avx512"), (1.3, "x86-avx2"), (1.0, "x86-avx2")] {
        let mut sim = Sim::new(zmm_flat_model, 5, 0.0);
        sim.zmm_flat = zmm_flat;
        let out = tune(&mut sim, &solver, &shapes(), &[], &config(1e6), &mut |_| {}).unwrap();
        let mut checked = 0;
        for s in &out.shapes {
            for (m, w) in s.flat_steps() {
                let problem = solver.problem(m, s.n, s.k);
                let on = |caps: &TargetCaps| {
                    tessera_codegen::tile::feasible(caps, &problem)
                        .unwrap()
                        .iter()
                        .any(|t| [t.ep, t.hp, t.lp] == w.tile)
                };
                if !(on(solver.caps) && on(solver.gemm_caps)) {
                    continue;
                }
                assert_eq!(w.target, want, "zmm ×{zmm_flat} at M = {m}: {w:?}");
                let duel = s
                    .notes
                    .decisions
                    .iter()
                    .find(|d| d.step == "flat step registers" && d.m == m)
                    .unwrap_or_else(|| panic!("no duel at M = {m}: {:?}", s.notes.decisions));
                assert!(duel.chose.ends_with(&format!(" on {want}")), "{duel:?}");
                checked += 1;
            }
        }
        assert!(
            checked > 0,
            "zmm ×{zmm_flat}: no step shared by both targets"
        );
    }
}
