//! The tuning driver: for each weight shape, time the solver's candidates
//! per variant, pick the winners, and find the breakpoints M1 and M2 — all
//! within a time budget planned up front.
//!
//! The driver is generic over a [`Bench`] (what runs and times a kernel)
//! so the same code tunes real kernels ([`crate::bench::HostBench`]) and
//! synthetic cost models in tests, with a virtual clock.
//!
//! # Budget
//!
//! The run has a hard deadline. Each shape gets a share of the time left,
//! proportional to its weight count (a large shape's calls take longer),
//! re-planned when a shape finishes so savings flow to the next. Each
//! measurement gets a slice of its shape's share: one warm-up call
//! estimates the call time, then as many samples as fit the slice, at least
//! [`TuneConfig::min_samples`] and at most [`TuneConfig::max_samples`]. A
//! measurement that cannot take its minimum before the deadline stops the
//! run: shapes finished so far are kept and the result is marked partial.

use std::collections::BTreeMap;
use std::time::Duration;

use tessera_codegen::target::{MacClass, TargetCaps};
use tessera_codegen::tile::{self, Problem, SolveError, TileConfig};
use tessera_dsl::ir::{Format, Variant};
use tessera_runtime::record::{Decision, Limits, Measurement, ShapeEntry, ShapeNotes, Winner};

use crate::decide::{self, Blocks, Entrant, Verdict};
use crate::stats::Timing;

/// The largest M the breakpoint search considers.
pub const MAX_M: usize = 4096;

/// The flat tile timed at M: the flat winner with ep = min(M, its ep), as
/// the runtime runs it ([`tessera_runtime::dispatch::flat_tile_for`]).
pub use tessera_runtime::dispatch::flat_tile_for;

/// The M each variant's candidates are compared at: one token (decode), a
/// few tokens (speculative or batched decode), a prefill chunk.
pub fn representative_m(variant: Variant) -> usize {
    match variant {
        Variant::Gemv => 1,
        Variant::FlatGemm => 8,
        Variant::Gemm => 128,
    }
}

/// One weight shape to tune.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShapeSpec {
    pub name: String,
    pub n: usize,
    pub k: usize,
}

/// A kernel configuration to time: a variant with one solver tile.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate {
    pub variant: Variant,
    pub tile: TileConfig,
    /// Position in the solver's ranking for this variant (0 = optimum).
    pub order: usize,
}

impl Candidate {
    pub fn tile3(&self) -> [u32; 3] {
        [self.tile.ep, self.tile.hp, self.tile.lp]
    }

    /// Variant, tile shape and register budget: a tile of one shape may
    /// exist on two targets (x86 ymm and zmm), which are two candidates.
    pub fn key(&self) -> (u8, [u32; 3], u32) {
        (
            variant_index(self.variant),
            self.tile3(),
            self.tile.accounting.budget,
        )
    }
}

/// `tiles` as `variant`'s candidates, in their order.
fn as_candidates(variant: Variant, tiles: Vec<TileConfig>) -> Vec<Candidate> {
    tiles
        .into_iter()
        .enumerate()
        .map(|(order, tile)| Candidate {
            variant,
            tile,
            order,
        })
        .collect()
}

fn variant_index(v: Variant) -> u8 {
    match v {
        Variant::Gemv => 0,
        Variant::FlatGemm => 1,
        Variant::Gemm => 2,
    }
}

/// Why a bench could not run a candidate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BenchError(pub String);

/// What runs and times kernels (real or simulated).
pub trait Bench {
    /// Time since the run started (the budget's clock).
    fn elapsed(&self) -> Duration;
    /// Make `cand` ready to call for `shape` (emit, map, pack weights).
    fn prepare(&mut self, shape: &ShapeSpec, cand: &Candidate) -> Result<(), BenchError>;
    /// One timed call of a prepared candidate at `m` rows: nanoseconds for
    /// [`Bench::rows`] output channels.
    fn call(&mut self, shape: &ShapeSpec, cand: &Candidate, m: usize) -> Result<f64, BenchError>;
    /// Output channels one call at `m` computes (≤ n: a bench may time a
    /// slice of a large shape; times are scaled to the whole shape).
    fn rows(&self, shape: &ShapeSpec, m: usize) -> usize {
        let _ = m;
        shape.n
    }
    /// Forget a candidate (free its weights).
    fn release(&mut self, cand: &Candidate);
    /// Forget everything of the current shape.
    fn release_all(&mut self);
    /// Whether the user asked to stop.
    fn interrupted(&self) -> bool {
        false
    }
    /// Run later calls on at most `workers` threads (`None`: all of the
    /// bench's again). True when calls now run on fewer threads than the
    /// bench has; false where that changes nothing (a bench of one
    /// thread, or one that cannot limit them).
    fn limit_workers(&mut self, workers: Option<usize>) -> bool {
        let _ = workers;
        false
    }
}

/// The solver's view of the kernel being tuned.
#[derive(Clone, Copy)]
pub struct SolverCtx<'a> {
    /// The target of the flat-GEMM tiles (and the record's).
    pub caps: &'a TargetCaps,
    /// The target of the GEMV tiles (NEON with i8mm: `aarch64-dotprod`).
    pub gemv_caps: &'a TargetCaps,
    /// The target of the GEMM tiles (x86 with AVX-512: `x86-avx512`).
    pub gemm_caps: &'a TargetCaps,
    pub class: MacClass,
    pub weight_dequant: bool,
    /// Weights quantized in groups along K (x86 int8 needs group-sum
    /// registers for them).
    pub weight_groups: bool,
    /// 4-bit pair-transposed weights (tiles hold whole 32-code runs).
    pub nibble_runs: bool,
    /// Tiles the backend can emit (its register plan may be stricter than
    /// the solver's accounting); candidates are drawn from these only.
    pub accept: &'a dyn Fn(&TileConfig) -> bool,
}

impl SolverCtx<'_> {
    /// Rows of one accumulator unit of the flat tiles' MAC (2 for `smmla`,
    /// else 1): a flat step's ep is M rounded up to it.
    pub fn row_unit(&self) -> u32 {
        self.caps.mac(self.class).map_or(1, |mac| mac.ae.max(1))
    }

    /// Whether the GEMM's target is a wider register file than the flat
    /// GEMM's (x86 with AVX-512), whose kernels' GEMV and flat tiles are
    /// then candidates too.
    fn wider_gemm(&self) -> bool {
        self.gemm_caps.name != self.caps.name
    }

    /// The target `tile` of `variant` was solved on: the variant's own, or
    /// for a GEMV or flat GEMM tile with the wider GEMM target's register
    /// budget (a zmm candidate, [`SolverCtx::candidates`]) the GEMM's.
    pub fn caps_of(&self, variant: Variant, tile: &TileConfig) -> &TargetCaps {
        let own = self.caps_for(variant);
        if variant != Variant::Gemm
            && self.wider_gemm()
            && self.gemm_caps.name != own.name
            && tile.accounting.budget == self.gemm_caps.registers
            && tile.accounting.budget != own.registers
        {
            self.gemm_caps
        } else {
            own
        }
    }

    /// Whether `[ep, hp, lp]` is a feasible tile of `caps` at `m` rows.
    /// The variants' candidates of the wider target are only shapes the
    /// narrower has no tile of (the runtime rebuilds a variant's recorded
    /// tile on the first target that has it); the flat steps time a shape
    /// on both ([`ShapeTuner::wider_twin`]) and name the winner's target.
    fn feasible_on(&self, caps: &TargetCaps, tile: [u32; 3], m: usize, n: usize, k: usize) -> bool {
        tile::feasible(caps, &self.problem(m, n, k))
            .is_ok_and(|ts| ts.iter().any(|t| [t.ep, t.hp, t.lp] == tile))
    }

    /// The target `variant`'s tiles are solved on.
    pub fn caps_for(&self, variant: Variant) -> &TargetCaps {
        match variant {
            Variant::Gemm => self.gemm_caps,
            Variant::Gemv => self.gemv_caps,
            Variant::FlatGemm => self.caps,
        }
    }

    pub fn problem(&self, m: usize, n: usize, k: usize) -> Problem {
        Problem {
            e: m as u64,
            h: n as u64,
            l: k as u64,
            class: self.class,
            weight_dequant: self.weight_dequant,
            weight_groups: self.weight_groups,
            nibble_runs: self.nibble_runs,
        }
    }

    /// Formula (2) for `tile` at `m` rows.
    pub fn cost(&self, tile: [u32; 3], m: usize, n: usize, k: usize) -> u128 {
        tile::cost(&self.problem(m, n, k), tile[0], tile[1])
    }

    /// `flat` with ep = m rounded up to the row unit, at most its ep
    /// ([`flat_tile_for`]), when the solver and backend accept that tile,
    /// else `flat` itself (always on a GPU, whose flat tiles the runtime
    /// does not step). No kernel is built.
    pub fn flat_step(&self, flat: &Candidate, m: usize, n: usize, k: usize) -> Candidate {
        if self.caps.gpu.is_some() {
            return *flat;
        }
        let want = flat_tile_for(flat.tile3(), m, self.row_unit());
        if want == flat.tile3() {
            return *flat;
        }
        // A wider target's flat tile (zmm) steps on that target to a shape
        // the flat target has no tile of, else to the flat target's tile
        // (both pack alike), which the tuner then times against its zmm
        // twin.
        let mut caps = self.caps_of(Variant::FlatGemm, &flat.tile);
        if caps.name != self.caps.name && self.feasible_on(self.caps, want, m, n, k) {
            caps = self.caps;
        }
        let problem = self.problem(m, n, k);
        tile::feasible(caps, &problem)
            .ok()
            .and_then(|tiles| {
                tiles
                    .into_iter()
                    .find(|t| [t.ep, t.hp, t.lp] == want && (self.accept)(t))
            })
            .map_or(*flat, |tile| Candidate {
                variant: Variant::FlatGemm,
                tile,
                order: flat.order,
            })
    }

    /// The solver's best `count` tiles for `variant` on [n, k] whose
    /// packing (hp, lp) is `packing`'s, on the variant's target and, where
    /// the GEMM's is wider (zmm), on that one: the candidates of a tuning
    /// for one weight copy.
    pub fn candidates_packed_like(
        &self,
        variant: Variant,
        n: usize,
        k: usize,
        count: usize,
        packing: [u32; 3],
    ) -> Result<Vec<Candidate>, SolveError> {
        let m = representative_m(variant);
        let problem = self.problem(m, n, k);
        let caps = self.caps_for(variant);
        let fits = |t: &TileConfig| {
            [t.hp, t.lp] == packing[1..]
                && (variant != Variant::Gemv || t.ep == 1)
                && (self.accept)(t)
        };
        let mut tiles: Vec<TileConfig> = tile::solve(caps, &problem)?
            .into_iter()
            .filter(|t| fits(t))
            .take(count)
            .collect();
        tiles.extend(self.wider_tiles(variant, n, k, count, &fits));
        Ok(as_candidates(variant, tiles))
    }

    /// Where the GEMM runs on a wider register file (x86 with AVX-512:
    /// zmm), up to `count` of its target's tiles for the GEMV or flat
    /// GEMM that `keep` takes, best first: only tiles the variant's own
    /// target has no tile of the same shape for (the record names a
    /// variant's tile by its shape). Empty elsewhere.
    fn wider_tiles(
        &self,
        variant: Variant,
        n: usize,
        k: usize,
        count: usize,
        keep: &dyn Fn(&TileConfig) -> bool,
    ) -> Vec<TileConfig> {
        let caps = self.caps_for(variant);
        if variant == Variant::Gemm || !self.wider_gemm() || self.gemm_caps.name == caps.name {
            return Vec::new();
        }
        let m = representative_m(variant);
        tile::solve(self.gemm_caps, &self.problem(m, n, k))
            .unwrap_or_default()
            .into_iter()
            .filter(|t| keep(t))
            .filter(|t| !self.feasible_on(caps, [t.ep, t.hp, t.lp], m, n, k))
            .take(count)
            .collect()
    }

    /// The solver's optimum for `variant` on [n, k] and its `neighbours`
    /// nearest feasible tiles. GEMV keeps only tiles of the optimum's ep
    /// (one row at a time).
    pub fn candidates(
        &self,
        variant: Variant,
        n: usize,
        k: usize,
        neighbours: usize,
    ) -> Result<Vec<Candidate>, SolveError> {
        let problem = self.problem(representative_m(variant), n, k);
        let caps = self.caps_for(variant);
        let ranked = tile::solve(caps, &problem)?;
        let Some(best) = ranked.iter().find(|t| (self.accept)(t)).copied() else {
            return Ok(Vec::new());
        };
        let mut tiles = vec![best];
        let near = tile::neighbours(caps, &problem, &best, ranked.len())?;
        tiles.extend(
            near.into_iter()
                .filter(|t| variant != Variant::Gemv || t.ep == best.ep)
                .filter(|t| (self.accept)(t))
                .take(neighbours),
        );
        // A GEMV solved on another target than the flat GEMM's (the dotprod
        // GEMV of NEON i8mm) also meets the flat target's own GEMV tile, so
        // the measurement, not the rule, decides between the two loops; the
        // record's tile says which won (its lp).
        if variant == Variant::Gemv && caps.name != self.caps.name {
            let own = tile::solve(self.caps, &problem)?;
            if let Some(t) = own.iter().find(|t| (self.accept)(t)) {
                tiles.push(*t);
            }
        }
        // The wider GEMM target's GEMV and flat tiles too: the measurement,
        // not a rule, decides between ymm and zmm loops (one CPU's winner
        // is another's loser).
        let keep = |t: &TileConfig| (variant != Variant::Gemv || t.ep == 1) && (self.accept)(t);
        tiles.extend(self.wider_tiles(variant, n, k, neighbours.max(1), &keep));
        Ok(as_candidates(variant, tiles))
    }
}

/// Bytes one call moves, from the kernel's formats (roofline accounting).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Traffic {
    pub x: Format,
    pub w: Format,
    pub y: Format,
}

impl Traffic {
    fn elem_bytes(f: Format) -> f64 {
        match f {
            // The caller hands f32 to the quantizer.
            Format::I8Dyn => 4.0,
            f => f64::from(f.bits()) / 8.0,
        }
    }

    /// Weights (codes and per-group parameters), x and y.
    pub fn bytes(&self, m: usize, n: usize, k: usize) -> f64 {
        let (m, n, k) = (m as f64, n as f64, k as f64);
        let params = match self.w.group() {
            Some(g) => {
                let per = if self.w.is_asymmetric() { 8.0 } else { 4.0 };
                (k / g.len(k as usize) as f64).ceil() * per
            }
            None => 0.0,
        };
        n * (k * Self::elem_bytes(self.w) + params)
            + m * k * Self::elem_bytes(self.x)
            + m * n * Self::elem_bytes(self.y)
    }
}

/// Everything the driver needs besides the bench.
#[derive(Clone, Debug)]
pub struct TuneConfig {
    pub threads: usize,
    /// Hard deadline, on the bench's clock.
    pub deadline: Duration,
    pub neighbours: usize,
    pub min_samples: u32,
    pub max_samples: u32,
    pub limits: Limits,
    pub traffic: Traffic,
    /// Target name written into winners and measurements.
    pub target: String,
    /// The library kernel, to name winners by the instance grammar.
    pub kernel: Option<tessera_dsl::Kernel>,
    /// Winners for a runtime with `one_weight_copy`: the GEMM is tuned
    /// first, then GEMV and flat GEMM among tiles of its packing.
    pub one_weight_copy: bool,
}

/// How a run ended early.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// The budget ran out.
    Budget,
    /// The user interrupted.
    Interrupted,
}

/// What the driver reports as it goes (for a progress bar).
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    ShapeStarted {
        index: usize,
        total: usize,
        name: String,
    },
    Phase(String),
    Measured,
    ShapeDone {
        index: usize,
        entry: Box<ShapeEntry>,
    },
    /// A candidate the backend could not build (skipped).
    Skipped {
        candidate: String,
        why: String,
    },
}

/// The driver's result: finished shapes, and why it stopped early if it
/// did.
#[derive(Clone, Debug, PartialEq)]
pub struct TuneOutcome {
    pub shapes: Vec<ShapeEntry>,
    pub stopped: Option<Stop>,
}

/// Errors that end a shape other than the budget.
#[derive(Debug, thiserror::Error)]
pub enum TuneError {
    #[error("shape {shape} [{n}, {k}]: {source}")]
    Solve {
        shape: String,
        n: usize,
        k: usize,
        source: Box<SolveError>,
    },
    #[error("shape {shape} [{n}, {k}]: no {variant} candidate could be built: {why}")]
    NoCandidate {
        shape: String,
        n: usize,
        k: usize,
        variant: Variant,
        why: String,
    },
}

enum ShapeFail {
    Stop(Stop),
    Error(TuneError),
}

impl From<Stop> for ShapeFail {
    fn from(s: Stop) -> Self {
        ShapeFail::Stop(s)
    }
}

/// Measurements expected per shape beyond the candidates: two breakpoint
/// searches of about log2 of the grid's 16 points, with their
/// confirmations, two kernels each, each verdict measured twice and
/// sometimes three times ([`decide::settle_verdict`]), and the
/// breakpoints' neighbours.
const EXPECTED_PROBES: usize = 64;

/// Blocks each measurement is split into: kernels compared at one M are
/// timed in interleaved blocks (A B, B A, A B), so drift of the machine
/// hits all of them and the paired ratios of [`decide::compare`] cancel it.
pub const BLOCKS: u64 = 3;

/// Tune every shape not already in `done` (resume), in order. Shapes of
/// `done` are kept as they are.
pub fn tune<B: Bench + ?Sized>(
    bench: &mut B,
    solver: &SolverCtx<'_>,
    shapes: &[ShapeSpec],
    done: &[ShapeEntry],
    cfg: &TuneConfig,
    events: &mut dyn FnMut(Event),
) -> Result<TuneOutcome, TuneError> {
    let mut out: Vec<ShapeEntry> = Vec::new();
    let todo: Vec<(usize, &ShapeSpec)> = shapes
        .iter()
        .enumerate()
        .filter(|(_, s)| !done.iter().any(|d| d.n == s.n && d.k == s.k))
        .collect();
    // Keep resumed shapes in model order.
    let weight = |s: &ShapeSpec| (s.n * s.k) as f64;
    let mut stopped = None;
    // The run's noise floor so far (each shape measures its own and passes
    // it on: the first decisions of the next shape use it).
    let mut floor = 0.0f64;
    let mut seen: Vec<Verdict> = Vec::new();
    for (pos, &(index, shape)) in todo.iter().enumerate() {
        let now = bench.elapsed();
        if now >= cfg.deadline {
            stopped = Some(Stop::Budget);
            break;
        }
        let left: f64 = todo[pos..].iter().map(|(_, s)| weight(s)).sum();
        let share = (cfg.deadline - now).mul_f64(weight(shape) / left.max(1.0));
        events(Event::ShapeStarted {
            index,
            total: shapes.len(),
            name: shape.name.clone(),
        });
        let mut tuner = ShapeTuner {
            bench: &mut *bench,
            solver,
            shape,
            cfg,
            shape_deadline: now + share,
            timings: BTreeMap::new(),
            measurements: Vec::new(),
            expected_left: 0,
            events: &mut *events,
            flat_steps: BTreeMap::new(),
            gemm_winner: None,
            groups: 0,
            floor,
            seen: std::mem::take(&mut seen),
            drift: 0.0,
            decisions: Vec::new(),
            one_worker: false,
        };
        let result = tuner.run();
        floor = tuner.floor;
        seen = std::mem::take(&mut tuner.seen);
        match result {
            Ok(entry) => {
                bench.release_all();
                events(Event::ShapeDone {
                    index,
                    entry: Box::new(entry.clone()),
                });
                out.push(entry);
            }
            Err(ShapeFail::Stop(s)) => {
                bench.release_all();
                stopped = Some(s);
                break;
            }
            Err(ShapeFail::Error(e)) => {
                bench.release_all();
                return Err(e);
            }
        }
    }
    // Model order: resumed and new shapes interleaved as the model lists them.
    let mut shapes_out = Vec::new();
    for s in shapes {
        if let Some(d) = done.iter().find(|d| d.n == s.n && d.k == s.k) {
            shapes_out.push(d.clone());
        } else if let Some(e) = out.iter().find(|e| e.n == s.n && e.k == s.k) {
            shapes_out.push(e.clone());
        }
    }
    Ok(TuneOutcome {
        shapes: shapes_out,
        stopped,
    })
}

/// A candidate's key and the M it was timed at.
type TimingKey = ((u8, [u32; 3], u32), usize);

struct ShapeTuner<'a, B: Bench + ?Sized> {
    bench: &'a mut B,
    solver: &'a SolverCtx<'a>,
    shape: &'a ShapeSpec,
    cfg: &'a TuneConfig,
    shape_deadline: Duration,
    /// Blocks per (candidate, M), with the group they were timed in (only
    /// kernels timed in one group are compared by paired blocks).
    timings: BTreeMap<TimingKey, (u64, Blocks)>,
    measurements: Vec<Measurement>,
    expected_left: usize,
    events: &'a mut dyn FnMut(Event),
    /// The flat candidate decided for each M below the flat winner's ep
    /// ([`ShapeTuner::flat_at`]).
    flat_steps: BTreeMap<usize, Candidate>,
    /// The GEMM winner, once decided: a flat step may run on its packing
    /// ([`ShapeTuner::gemm_packed_step`]).
    gemm_winner: Option<Candidate>,
    /// Groups timed so far (their ids).
    groups: u64,
    /// The run's noise floor ([`decide::compare`], [`decide::pooled_floor`]).
    floor: f64,
    /// The candidate comparisons of the run so far (the floor's source).
    seen: Vec<Verdict>,
    /// The GEMV leader's own spread, re-timed later ([`ShapeNotes::drift`]).
    drift: f64,
    decisions: Vec<Decision>,
    /// Calls run on one worker ([`ShapeTuner::register_duel`]): their
    /// times decide a duel but are neither kept for reuse nor recorded as
    /// the shape's measurements, which are at the record's threads.
    one_worker: bool,
}

/// A kernel as the record's decisions name it.
fn label(c: &Candidate) -> String {
    let [e, h, l] = c.tile3();
    format!("{} {e}x{h}x{l}", c.variant)
}

impl<B: Bench + ?Sized> ShapeTuner<'_, B> {
    fn fail(&self, variant: Variant, why: String) -> ShapeFail {
        ShapeFail::Error(TuneError::NoCandidate {
            shape: self.shape.name.clone(),
            n: self.shape.n,
            k: self.shape.k,
            variant,
            why,
        })
    }

    fn run(&mut self) -> Result<ShapeEntry, ShapeFail> {
        let (n, k) = (self.shape.n, self.shape.k);
        let mut per_variant = Vec::new();
        for variant in Variant::ALL {
            let c = self
                .solver
                .candidates(variant, n, k, self.cfg.neighbours)
                .map_err(|source| {
                    ShapeFail::Error(TuneError::Solve {
                        shape: self.shape.name.clone(),
                        n,
                        k,
                        source: Box::new(source),
                    })
                })?;
            per_variant.push((variant, c));
        }
        let total: usize = per_variant.iter().map(|(_, c)| c.len()).sum();
        // Each variant's group may be timed twice, and rarely three times
        // (a winner against the solver's pick is re-timed).
        self.expected_left = 2 * total + EXPECTED_PROBES;

        // Winners per variant at the variant's representative M, and the
        // solver's pick of each (the cheapest), which a variant that
        // serves no M records instead.
        let mut winners: Vec<Option<Candidate>> = vec![None; 3];
        let mut picks: Vec<Option<Candidate>> = vec![None; 3];
        // One weight copy: the GEMM's winner first, then the others among
        // tiles of its packing (unconstrained where there are none: the
        // runtime then re-plans that variant on the GEMM's packing).
        if self.cfg.one_weight_copy {
            per_variant.rotate_right(1);
        }
        for (variant, mut cands) in per_variant {
            let vi = variant_index(variant) as usize;
            if let (true, Some(gemm)) = (self.cfg.one_weight_copy, winners[2]) {
                let packed = self
                    .solver
                    .candidates_packed_like(variant, n, k, self.cfg.neighbours + 1, gemm.tile3())
                    .unwrap_or_default();
                if packed.is_empty() {
                    (self.events)(Event::Skipped {
                        candidate: format!("{variant} of the GEMM's packing {:?}", gemm.tile3()),
                        why: "no such tile: tuned unconstrained".into(),
                    });
                } else {
                    cands = packed;
                }
            }
            (self.events)(Event::Phase(format!(
                "{} {variant} candidates",
                self.shape.name
            )));
            let m = representative_m(variant);
            let mut ready = Vec::new();
            let mut why = String::from("no candidates");
            for c in cands {
                match self.bench.prepare(self.shape, &c) {
                    Ok(()) => ready.push(c),
                    Err(e) => {
                        self.expected_left = self.expected_left.saturating_sub(1);
                        (self.events)(Event::Skipped {
                            candidate: format!("{variant} {:?}", c.tile3()),
                            why: e.0.clone(),
                        });
                        why = e.0;
                    }
                }
            }
            if ready.is_empty() {
                return Err(self.fail(variant, why));
            }
            let blocks = self.measure_group(&ready, m)?;
            let entrants: Vec<Entrant> = ready
                .iter()
                .zip(blocks)
                .map(|(c, blocks)| Entrant {
                    blocks,
                    cost: self.solver.cost(c.tile3(), m, n, k),
                    order: c.order,
                })
                .collect();
            let w = match decide::choose(&entrants, self.floor) {
                Some(choice) => {
                    self.seen.extend(choice.verdicts.iter().map(|(_, v)| *v));
                    self.floor = decide::pooled_floor(&self.seen);
                    for (i, v) in &choice.verdicts {
                        self.note(
                            format!("{variant} winner"),
                            m,
                            &ready[choice.fastest],
                            &ready[*i],
                            v,
                            &ready[choice.winner],
                        );
                    }
                    decide::settle_winner(&choice, &entrants, self.floor, || {
                        for c in &ready {
                            self.timings.remove(&(c.key(), m));
                        }
                        self.measure_group(&ready, m)
                    })?
                }
                None => 0,
            };
            for (i, c) in ready.iter().enumerate() {
                if i != w {
                    self.bench.release(c);
                }
            }
            winners[vi] = Some(ready[w]);
            let cheapest = ready
                .iter()
                .min_by_key(|c| (self.solver.cost(c.tile3(), m, n, k), c.order));
            picks[vi] = Some(*cheapest.unwrap_or(&ready[w]));
        }
        let (Some(gemv), Some(flat), Some(gemm)) = (winners[0], winners[1], winners[2]) else {
            return Err(self.fail(Variant::Gemv, "a variant has no winner".into()));
        };
        let mut winners = vec![gemv, flat, gemm];
        self.gemm_winner = Some(gemm);
        let picks: Vec<Candidate> = picks
            .into_iter()
            .zip(&winners)
            .map(|(p, w)| p.unwrap_or(*w))
            .collect();

        // How far the machine moved: the GEMV leader re-timed now, after
        // the other variants' candidates, against its own earlier blocks.
        self.retime(&gemv, representative_m(Variant::Gemv))?;
        if let Some((_, b)) = self.timings.get(&(gemv.key(), 1)) {
            self.drift = b.spread();
        }

        (self.events)(Event::Phase(format!(
            "{} M1 (gemv | flat-gemm)",
            self.shape.name
        )));
        // A tie between two variants goes by the solver's cost of the two
        // tiles at the upper variant's representative M: one answer for
        // the whole search (see `decide::upper_serves`).
        let tie_up = |lower: &Candidate, upper: &Candidate| {
            let m = representative_m(upper.variant);
            self.solver.cost(upper.tile3(), m, n, k) <= self.solver.cost(lower.tile3(), m, n, k)
        };
        let (tie_m1, tie_m2) = (tie_up(&gemv, &flat), tie_up(&flat, &gemm));
        // The flat side of both duels runs the tile of the real M, as the
        // runtime does (per-M flat steps).
        let m1 = decide::confirmed_breakpoint(1, MAX_M, |m| {
            let f = self.flat_at(&flat, m);
            let upper = self.duel("M1", &gemv, &f, m, tie_m1);
            self.release_step(&f, &flat);
            upper
        })?;
        (self.events)(Event::Phase(format!(
            "{} M2 (flat-gemm | gemm)",
            self.shape.name
        )));
        let m2 = decide::confirmed_breakpoint(m1.min(MAX_M), MAX_M, |m| {
            let f = self.flat_at(&flat, m);
            let upper = self.duel("M2", &f, &gemm, m, tie_m2);
            self.release_step(&f, &flat);
            upper
        })?;
        let m2 = m2.max(m1);

        // The breakpoints' neighbours, for the savings report (best
        // effort: a spent budget keeps the shape without them).
        let step = m2_step(m2);
        let pairs = [
            (m1.wrapping_sub(1), &gemv, &flat),
            (m1, &gemv, &flat),
            (m1 + 1, &gemv, &flat),
            (m2.wrapping_sub(step), &flat, &gemm),
            (m2, &flat, &gemm),
            (m2 + step, &flat, &gemm),
        ];
        for (m, lower, upper) in pairs {
            if !(1..=MAX_M).contains(&m) {
                continue;
            }
            let (lo, up) = if lower.variant == Variant::FlatGemm {
                (self.flat_at(lower, m), *upper)
            } else {
                (*lower, self.flat_at(upper, m))
            };
            let r = self.measure_group(&[lo, up], m);
            self.release_step(&lo, &flat);
            self.release_step(&up, &flat);
            match r {
                Ok(_) | Err(Stop::Budget) => {}
                Err(Stop::Interrupted) => return Err(Stop::Interrupted.into()),
            }
        }

        // A variant that serves no M (GEMV when M1 = 1, GEMM when M2 is past
        // the largest M tuned) records the solver's pick: no M it runs
        // decides between its tiles, and on a VM GEMV tiles within 10–30%
        // of each other swap places from run to run, which made two records
        // differ where nothing that runs differed.
        if m1 <= 1 {
            winners[0] = picks[0];
        }
        if m2 > MAX_M {
            winners[2] = picks[2];
        }
        let mut winners: Vec<Winner> = winners.iter().map(|c| self.winner(c, None)).collect();
        // Flat steps: one per M of the flat range below the flat winner's
        // ep whose tile the backend accepts, then the winner itself.
        // Each M's step is decided (timed against the GEMM-packed one)
        // where the breakpoint search did not already; a step must pack
        // like a variant the runtime keeps a copy for.
        let base_ep = flat.tile.ep as usize;
        let held = [winners[0].tile, flat.tile3(), winners[2].tile];
        let mut steps = Vec::new();
        for m in m1.max(1)..m2.min(base_ep) {
            let mut c = self.flat_at(&flat, m);
            self.release_step(&c, &flat);
            if !held.iter().any(|t| t[1..] == c.tile3()[1..]) {
                c = self.flat_packed_step(&flat, m);
            }
            if c.tile3() != flat.tile3() {
                steps.push(self.winner(&c, Some(m)));
            }
        }
        if !steps.is_empty() && base_ep < m2 {
            steps.push(self.winner(&flat, Some(base_ep)));
        }
        winners.splice(2..2, steps);
        let mut measurements = std::mem::take(&mut self.measurements);
        measurements.sort_by(|a, b| {
            (variant_index(a.variant), a.tile, a.m).cmp(&(variant_index(b.variant), b.tile, b.m))
        });
        let mut entry = ShapeEntry {
            name: self.shape.name.clone(),
            n,
            k,
            m1,
            m2,
            winners,
            measurements,
            notes: ShapeNotes {
                noise_floor: self.floor,
                drift: self.drift,
                decisions: std::mem::take(&mut self.decisions),
                savings: None,
            },
        };
        entry.notes.savings = crate::savings::savings(&entry, step);
        Ok(entry)
    }

    fn winner(&self, c: &Candidate, from_m: Option<usize>) -> Winner {
        Winner {
            variant: c.variant,
            target: self.target_of(c),
            tile: c.tile3(),
            kernel: self.instance_name(c),
            from_m,
        }
    }

    /// The step of `m` rows on the GEMM winner's packing, where that
    /// differs from the flat tile's and the flat target has such a tile of
    /// `m` rows (rounded up to the row unit) below the flat tile's ep: a
    /// wider packing reuses each row's broadcast codes across more
    /// columns, which few rows need most, and the runtime holds that copy
    /// anyway. None on a GPU. No kernel is built.
    fn gemm_packed_step(&self, flat: &Candidate, m: usize) -> Option<Candidate> {
        let gemm = self.gemm_winner?.tile3();
        let base = flat.tile3();
        if self.solver.caps.gpu.is_some() || gemm[1..] == base[1..] || m >= base[0] as usize {
            return None;
        }
        let want = flat_tile_for([base[0], gemm[1], gemm[2]], m, self.solver.row_unit());
        let problem = self.solver.problem(m, self.shape.n, self.shape.k);
        tile::feasible(self.solver.caps, &problem)
            .ok()?
            .into_iter()
            .find(|t| [t.ep, t.hp, t.lp] == want && (self.solver.accept)(t))
            .map(|tile| Candidate {
                variant: Variant::FlatGemm,
                tile,
                order: flat.order + 1,
            })
    }

    /// [`SolverCtx::flat_step`] of this shape.
    fn flat_packed_step(&self, flat: &Candidate, m: usize) -> Candidate {
        self.solver.flat_step(flat, m, self.shape.n, self.shape.k)
    }

    /// The flat candidate timed at `m`, decided once per M and prepared:
    /// the flat packing's step ([`ShapeTuner::flat_packed_step`]), or the
    /// GEMM-packed one ([`ShapeTuner::gemm_packed_step`]) where the two
    /// timed together say it is faster (a tie goes to the lower
    /// formula-(2) cost at M, then to the flat packing's).
    /// One the bench cannot build is skipped; a spent budget keeps the
    /// flat packing's step.
    fn flat_at(&mut self, flat: &Candidate, m: usize) -> Candidate {
        if let Some(c) = self.flat_steps.get(&m) {
            return *c;
        }
        let mut own = self.prepared_or(self.flat_packed_step(flat, m), *flat, m);
        if let Some(twin) = self.wider_twin(&own, m)
            && self.prepared(&twin, m)
        {
            match self.register_duel(&own, &twin, m) {
                Ok(true) => {
                    self.release_step(&own, flat);
                    own = twin;
                }
                _ => self.release_step(&twin, flat),
            }
        }
        let c = match self.gemm_packed_step(flat, m) {
            Some(wide) if self.prepared(&wide, m) => {
                // A tie goes by the solver's cost at M, as every tie does.
                let (n, k) = (self.shape.n, self.shape.k);
                let cost = |c: &Candidate| self.solver.cost(c.tile3(), m, n, k);
                let tie_to_wide = cost(&wide) < cost(&own);
                match self.duel("flat step", &own, &wide, m, tie_to_wide) {
                    Ok(true) => {
                        self.release_step(&own, flat);
                        wide
                    }
                    _ => {
                        self.bench.release(&wide);
                        own
                    }
                }
            }
            _ => own,
        };
        self.flat_steps.insert(m, c);
        c
    }

    /// Whether `twin` (the same step, shape and packing on the wider
    /// registers) serves `m` rather than `own`. Both read the same bytes,
    /// so at the record's threads the bandwidth can hide what their
    /// arithmetic costs: on Zen 5 a 4-row Q4_0 step tied at two threads
    /// and read 82–89% of the one-thread probe on ymm against 103–111% on
    /// zmm. A tie is therefore timed again on one worker, where a core has
    /// bandwidth to spare (as when the runtime is called on fewer threads
    /// than it was tuned for); a tie there too keeps the narrower, the
    /// tile's first target.
    fn register_duel(
        &mut self,
        own: &Candidate,
        twin: &Candidate,
        m: usize,
    ) -> Result<bool, ShapeFail> {
        let wins = self.duel("flat step registers", own, twin, m, false)?;
        // (A settled duel notes its decision last.)
        let tied = self.decisions.last().is_some_and(|d| d.tie);
        if !tied || !self.bench.limit_workers(Some(1)) {
            return Ok(wins);
        }
        self.one_worker = true;
        let alone = self.duel("flat step registers on one thread", own, twin, m, false);
        self.one_worker = false;
        self.bench.limit_workers(None);
        alone
    }

    /// `step` on the wider GEMM target (x86 zmm) when it is on the flat
    /// target and the wider one has a tile of the same shape at `m` rows
    /// (the same packing): the runtime builds a recorded tile on the
    /// target the record names, so both are candidates. No kernel is
    /// built.
    fn wider_twin(&self, step: &Candidate, m: usize) -> Option<Candidate> {
        let wide = self.solver.caps_for(Variant::Gemm);
        let own = self.solver.caps_of(Variant::FlatGemm, &step.tile);
        if !self.solver.wider_gemm() || own.name == wide.name || self.solver.caps.gpu.is_some() {
            return None;
        }
        let problem = self.solver.problem(m, self.shape.n, self.shape.k);
        tile::feasible(wide, &problem)
            .ok()?
            .into_iter()
            .find(|t| [t.ep, t.hp, t.lp] == step.tile3() && (self.solver.accept)(t))
            .map(|tile| Candidate {
                variant: Variant::FlatGemm,
                tile,
                order: step.order,
            })
    }

    /// `c` prepared for timing at `m`, or `fallback` when the bench
    /// cannot build it (and says why).
    fn prepared_or(&mut self, c: Candidate, fallback: Candidate, m: usize) -> Candidate {
        if c.key() == fallback.key() || self.prepared(&c, m) {
            c
        } else {
            fallback
        }
    }

    /// Prepare `c`; false (and an event saying why) when it cannot be.
    fn prepared(&mut self, c: &Candidate, m: usize) -> bool {
        match self.bench.prepare(self.shape, c) {
            Ok(()) => true,
            Err(e) => {
                (self.events)(Event::Skipped {
                    candidate: format!("{} {:?} at M = {m}", c.variant, c.tile3()),
                    why: e.0,
                });
                false
            }
        }
    }

    /// Free a step candidate's weights once timed: each is timed at its
    /// own M only (and the timing is kept), and every prepared candidate
    /// holds a full rotation of weight copies.
    fn release_step(&mut self, step: &Candidate, flat: &Candidate) {
        if step.key() != flat.key() {
            self.bench.release(step);
        }
    }

    /// The target `variant`'s tiles were solved on: the GEMM's may be a
    /// wider one (x86-avx512) than the run's (`cfg.target`).
    /// The target name recorded for `c`: the wider GEMM target
    /// (x86-avx512) for the GEMM and the zmm GEMV and flat tiles, else the
    /// flat target's.
    fn target_of(&self, c: &Candidate) -> String {
        let gemm = self.solver.gemm_caps;
        let wide = match c.variant {
            Variant::Gemm => self.solver.wider_gemm(),
            v => self.solver.wider_gemm() && self.solver.caps_of(v, &c.tile).name == gemm.name,
        };
        if wide {
            gemm.name.to_string()
        } else {
            self.cfg.target.clone()
        }
    }

    /// The winner's instance name (`matmul_..._x86_avx2`), or empty when
    /// the kernel is unknown or unnameable.
    fn instance_name(&self, c: &Candidate) -> String {
        let Some(kernel) = &self.cfg.kernel else {
            return String::new();
        };
        let target = self.target_of(c).replace('-', "_");
        let tile = tessera_dsl::naming::MatmulTile {
            ep: c.tile.ep,
            hp: c.tile.hp,
            lp: c.tile.lp,
        };
        tessera_dsl::naming::MatmulInstance::for_kernel(kernel, tile, &target)
            .map(|i| i.to_string())
            .unwrap_or_default()
    }

    /// Record one decision (a verdict of `b` against `a`).
    fn note(
        &mut self,
        step: String,
        m: usize,
        a: &Candidate,
        b: &Candidate,
        v: &Verdict,
        chose: &Candidate,
    ) {
        self.decisions.push(Decision {
            step,
            m,
            a: label(a),
            b: label(b),
            ratio: v.ratio,
            margin: v.margin,
            tie: v.tie(),
            chose: label(chose),
        });
    }

    /// Whether `upper` should serve M rather than `lower`: both timed
    /// together in interleaved blocks, then [`decide::upper_serves`].
    fn duel(
        &mut self,
        step: &str,
        lower: &Candidate,
        upper: &Candidate,
        m: usize,
        tie_to_upper: bool,
    ) -> Result<bool, ShapeFail> {
        let blocks = self.measure_group(&[*lower, *upper], m)?;
        let Some(first) = decide::compare(&blocks[0], &blocks[1], self.floor) else {
            return Err(Stop::Budget.into());
        };
        let v = decide::settle_verdict(first, || {
            self.timings.remove(&(lower.key(), m));
            self.timings.remove(&(upper.key(), m));
            let again = self.measure_group(&[*lower, *upper], m)?;
            decide::compare(&again[0], &again[1], self.floor).ok_or(Stop::Budget)
        })?;
        let wins = decide::upper_serves(&v, tie_to_upper);
        let chose = if wins { upper } else { lower };
        self.note(step.to_string(), m, lower, upper, &v, chose);
        if label(lower) == label(upper) {
            // One shape on two targets: the labels name them.
            let on = |c: &Candidate| format!(" on {}", self.target_of(c));
            let (a, b, c) = (on(lower), on(upper), on(chose));
            if let Some(d) = self.decisions.last_mut() {
                d.a += &a;
                d.b += &b;
                d.chose += &c;
            }
        }
        Ok(wins)
    }

    /// Time `cands` at `m` together: a warm-up call each (which also
    /// estimates the call time), then [`BLOCKS`] blocks, each taking every
    /// candidate's share of samples in turn, the order rotating from block
    /// to block. Reuses timings only when all of `cands` were timed in one
    /// group at `m` (pairs must share the machine's state).
    fn measure_group(&mut self, cands: &[Candidate], m: usize) -> Result<Vec<Blocks>, Stop> {
        let cached: Vec<Option<&(u64, Blocks)>> = cands
            .iter()
            .map(|c| self.timings.get(&(c.key(), m)))
            .collect();
        if let Some(Some((g, _))) = cached.first()
            && !self.one_worker
            && cached.iter().all(|e| matches!(e, Some((h, _)) if h == g))
        {
            return Ok(cached.into_iter().flatten().map(|e| e.1.clone()).collect());
        }
        if self.bench.interrupted() {
            return Err(Stop::Interrupted);
        }
        let deadline = self.cfg.deadline;
        if self.bench.elapsed() >= deadline {
            return Err(Stop::Budget);
        }
        // Warm-up: also estimates the call time. A failing call stops the
        // run like a spent budget (what was finished is kept), and says why.
        // (Prepared again first: a flat step is released after its probe
        // and may be timed again for a breakpoint's neighbour; a no-op for
        // one still prepared.)
        let mut warm = Vec::with_capacity(cands.len());
        for c in cands {
            let r = self
                .bench
                .prepare(self.shape, c)
                .and_then(|()| self.bench.call(self.shape, c, m));
            match r {
                Ok(t) => warm.push(t.max(1.0)),
                Err(e) => {
                    (self.events)(Event::Skipped {
                        candidate: format!("{} {:?} at M = {m}", c.variant, c.tile3()),
                        why: e.0,
                    });
                    return Err(Stop::Budget);
                }
            }
        }
        let now = self.bench.elapsed();
        let slice = self
            .shape_deadline
            .saturating_sub(now)
            .div_f64(self.expected_left.max(1) as f64);
        let hard = deadline.saturating_sub(now);
        let round: f64 = warm.iter().sum();
        // Samples per candidate: as many as its slice holds, within the
        // configured bounds, and all of them before the hard deadline.
        let fits = |d: Duration, per: f64| (d.as_nanos() as f64 / per).floor() as u64;
        let min = u64::from(self.cfg.min_samples.max(1));
        if fits(hard, round) < min {
            return Err(Stop::Budget);
        }
        let most = u64::from(self.cfg.max_samples.max(self.cfg.min_samples));
        let samples = fits(slice.mul_f64(cands.len() as f64), round)
            .clamp(min, most)
            .min(fits(hard, round));
        let blocks = BLOCKS.min(samples).max(1);
        let mut times: Vec<Vec<Vec<f64>>> = vec![vec![Vec::new(); blocks as usize]; cands.len()];
        #[allow(clippy::needless_range_loop)] // b indexes blocks of every candidate
        for b in 0..blocks as usize {
            let per = samples / blocks + u64::from((b as u64) < samples % blocks);
            let n = cands.len();
            for j in 0..n {
                // Rotate, and reverse every other block: A B, B A, A B, ...
                let i = if b % 2 == 0 {
                    (j + b) % n
                } else {
                    (n - 1 - j + b) % n
                };
                for _ in 0..per {
                    if self.bench.interrupted() {
                        return Err(Stop::Interrupted);
                    }
                    let t = self
                        .bench
                        .call(self.shape, &cands[i], m)
                        .map_err(|_| Stop::Budget)?;
                    times[i][b].push(t);
                }
            }
        }
        self.expected_left = self.expected_left.saturating_sub(cands.len());
        self.groups += 1;
        let rows = self.bench.rows(self.shape, m).clamp(1, self.shape.n);
        let scale = self.shape.n as f64 / rows as f64;
        let mut out = Vec::with_capacity(cands.len());
        for (c, t) in cands.iter().zip(times) {
            let blocks = Blocks(
                t.into_iter()
                    .map(|b| b.into_iter().map(|x| x * scale).collect())
                    .collect(),
            );
            if !self.one_worker {
                self.timings
                    .insert((c.key(), m), (self.groups, blocks.clone()));
                self.record(c, m, &blocks);
            }
            (self.events)(Event::Measured);
            out.push(blocks);
        }
        Ok(out)
    }

    /// One more block of a timed candidate, appended to its blocks (the
    /// leader re-timed later in the run: the spread of its own medians is
    /// the run's noise floor).
    fn retime(&mut self, c: &Candidate, m: usize) -> Result<(), Stop> {
        let Some((_, blocks)) = self.timings.get(&(c.key(), m)) else {
            return Ok(());
        };
        let per = blocks.0.first().map_or(1, Vec::len).max(1);
        if self.bench.interrupted() {
            return Err(Stop::Interrupted);
        }
        if self.bench.elapsed() >= self.cfg.deadline {
            return Err(Stop::Budget);
        }
        let rows = self.bench.rows(self.shape, m).clamp(1, self.shape.n);
        let scale = self.shape.n as f64 / rows as f64;
        // A warm-up call first, as every measurement has.
        self.bench
            .call(self.shape, c, m)
            .map_err(|_| Stop::Budget)?;
        let mut block = Vec::with_capacity(per);
        for _ in 0..per {
            let t = self
                .bench
                .call(self.shape, c, m)
                .map_err(|_| Stop::Budget)?;
            block.push(t * scale);
        }
        let mut blocks = self
            .timings
            .get(&(c.key(), m))
            .map(|e| e.1.clone())
            .unwrap_or_default();
        blocks.0.push(block);
        if let Some(e) = self.timings.get_mut(&(c.key(), m)) {
            e.1 = blocks.clone();
        }
        self.record(c, m, &blocks);
        Ok(())
    }

    /// Keep the measurement of `c` at `m` (replacing an earlier one).
    fn record(&mut self, c: &Candidate, m: usize, blocks: &Blocks) {
        let all = blocks.all();
        let Some(raw) = Timing::from_samples(&all) else {
            return;
        };
        let timing = Timing {
            median_ns: blocks.best().unwrap_or(raw.median_ns),
            ..raw
        };
        let mut meas = self.measurement(c, m, &timing);
        meas.block_medians_ns = blocks.medians();
        let target = meas.target.clone();
        self.measurements.retain(|x| {
            !(x.variant == c.variant && x.tile == c.tile3() && x.m == m && x.target == target)
        });
        self.measurements.push(meas);
    }

    fn measurement(&self, c: &Candidate, m: usize, t: &Timing) -> Measurement {
        let (n, k) = (self.shape.n, self.shape.k);
        let secs = t.median_ns * 1e-9;
        let flops = 2.0 * (m * n * k) as f64;
        let bytes = self.cfg.traffic.bytes(m, n, k);
        let limits = &self.cfg.limits;
        let roof_secs =
            (bytes / (limits.read_gbps * 1e9)).max((m * n * k) as f64 / (limits.mac_gops * 1e9));
        let roofline = if roof_secs.is_finite() && secs > 0.0 {
            roof_secs / secs
        } else {
            0.0
        };
        Measurement {
            variant: c.variant,
            target: self.target_of(c),
            tile: c.tile3(),
            threads: self.cfg.threads,
            m,
            median_ns: t.median_ns,
            spread_ns: t.mad_ns,
            samples: t.samples,
            gflops: flops / secs / 1e9,
            gbps: bytes / secs / 1e9,
            roofline,
            block_medians_ns: Vec::new(),
        }
    }
}

/// The distance of M2's neighbours in the savings report: an eighth of M2,
/// at least 1 (the bisection's resolution near M2 is about that).
pub fn m2_step(m2: usize) -> usize {
    (m2 / 8).max(1)
}
