//! Tuning records: what the autotuner measured on a device, and what the
//! runtime loads to dispatch by M.
//!
//! A record file holds entries from any number of devices (records merge);
//! each entry is valid only for its device [`Fingerprint`] and the generator
//! ([`GeneratorId`]: version and template hash) that produced the kernels it
//! measured. Every measurement is kept, not only the winners, so a later tool
//! can re-decide with another policy.
//!
//! Schema (JSON, `schema` = [`RECORD_SCHEMA`]):
//!
//! ```text
//! { "schema": 1,
//!   "entries": [ {
//!     "fingerprint": { arch, cpu_model, features[], clusters[], logical_cpus, caches[], gpus[] },
//!     "generator": { "version": "0.1.0", "template_hash": "…" },
//!     "backend": "host", "format": "w4a8", "model": "qwen2-1.5b", "threads": 2,
//!     "partial": false, "created_unix": 1700000000,
//!     "limits": { "read_gbps": 27.4, "mac_gops": 98.0 },
//!     "core_weights": [1.0, 1.0],
//!     "shapes": [ { "name": "qkv", "n": 2048, "k": 1536, "m1": 2, "m2": 48,
//!                   "winners": [ { "variant": "gemv", "target": "x86-avx2", "tile": [1, 32, 4], "kernel": "matmul_…" },
//!                                { "variant": "flat-gemm", …, "from_m": 2 } ],
//!                   "measurements": [ { "variant", "target", "tile", "threads", "m", "median_ns", "spread_ns", "samples", "gflops", "gbps", "roofline" } ] } ] } ] }
//! ```

use std::path::Path;

use serde::{Deserialize, Serialize};
use tessera_dsl::ir::Variant;

use crate::device::Fingerprint;

/// The record format's version; a different one is refused.
pub const RECORD_SCHEMA: u32 = 1;

/// Which generator produced the kernels a record measured.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GeneratorId {
    pub version: String,
    pub template_hash: String,
}

/// The device's measured limits, so results print as roofline fractions.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Default)]
pub struct Limits {
    /// Streaming read bandwidth, GB/s.
    pub read_gbps: f64,
    /// Peak multiply-accumulate throughput of the chosen instruction, G/s.
    pub mac_gops: f64,
}

/// The kernel chosen for one variant of one weight shape.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Winner {
    pub variant: Variant,
    /// Target name (`x86-avx2`, `host`, `aarch64-i8mm`, `opencl`, …).
    pub target: String,
    /// ep, hp, lp.
    pub tile: [u32; 3],
    /// Full instance name (the naming grammar).
    pub kernel: String,
    /// Flat GEMM only: this tile serves M from here up to the next step's
    /// `from_m` (per-M flat tiles, [`ShapeEntry::flat_steps`]). Absent: the
    /// variant's tile (records written before per-M steps have only this).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_m: Option<usize>,
}

/// One timed configuration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Measurement {
    pub variant: Variant,
    pub target: String,
    pub tile: [u32; 3],
    pub threads: usize,
    pub m: usize,
    pub median_ns: f64,
    /// Dispersion (median absolute deviation), ns.
    pub spread_ns: f64,
    pub samples: u32,
    pub gflops: f64,
    pub gbps: f64,
    /// Fraction of the device roofline reached (0..1).
    pub roofline: f64,
    /// The median of each timing block, in the order taken (`median_ns` is
    /// the fastest of them); absent in records written before blocks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub block_medians_ns: Vec<f64>,
}

/// One decision the tuner made between two kernels at one M: a candidate
/// against the fastest of its variant, or a breakpoint probe (lower variant
/// against upper). Kernels are named `variant ep x hp x lp`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    /// `gemv winner`, `flat-gemm winner`, `gemm winner`, `M1` or `M2`.
    pub step: String,
    pub m: usize,
    pub a: String,
    pub b: String,
    /// time(b) / time(a) (paired block medians): below 1, `b` is faster.
    pub ratio: f64,
    /// Relative noise margin the difference had to clear.
    pub margin: f64,
    /// Within the margin: decided by the solver's cost, not by time.
    pub tie: bool,
    /// The kernel the decision went to.
    pub chose: String,
}

/// Time the chosen policy saves, as a fraction of the alternative's time
/// (0.1 = the alternative takes 10% longer than the chosen breakpoints;
/// negative: the alternative would have been faster), summed over the Ms
/// where the two differ. `None` where the alternative does not exist (M1 =
/// 1 has no M1 − 1) or could not be estimated from the measurements.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Savings {
    /// The largest M of the range the "always" alternatives are summed over
    /// (1..=range_m).
    pub range_m: usize,
    /// The M2 neighbours' distance (the M1 neighbours are at ±1).
    pub m2_step: usize,
    pub vs_m1_minus: Option<f64>,
    pub vs_m1_plus: Option<f64>,
    pub vs_m2_minus: Option<f64>,
    pub vs_m2_plus: Option<f64>,
    pub vs_always_gemv: Option<f64>,
    pub vs_always_flat: Option<f64>,
    pub vs_always_gemm: Option<f64>,
}

/// How a shape's decisions were made (absent in older records).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ShapeNotes {
    /// The run's noise floor: the median dispersion of the paired ratios
    /// of the comparisons so far (relative); every margin is at least this.
    #[serde(default)]
    pub noise_floor: f64,
    /// How far the machine itself moved: the relative spread of the GEMV
    /// leader's own block medians, its last block re-timed after the other
    /// variants' candidates (cancels in paired comparisons; shown so a
    /// record says how unquiet its machine was).
    #[serde(default)]
    pub drift: f64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub decisions: Vec<Decision>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub savings: Option<Savings>,
}

impl ShapeNotes {
    pub fn is_empty(&self) -> bool {
        *self == ShapeNotes::default()
    }

    /// The decisions that were ties.
    pub fn ties(&self) -> impl Iterator<Item = &Decision> {
        self.decisions.iter().filter(|d| d.tie)
    }
}

/// Results for one weight shape [N, K].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ShapeEntry {
    /// Which layer(s) have this shape (`qkv`, `o`, `gate_up`, `down`, …).
    pub name: String,
    pub n: usize,
    pub k: usize,
    /// GEMV for M < m1.
    pub m1: usize,
    /// Flat GEMM for m1 ≤ M < m2, GEMM for M ≥ m2.
    pub m2: usize,
    pub winners: Vec<Winner>,
    pub measurements: Vec<Measurement>,
    /// Ties, margins, noise floor and savings of the breakpoints.
    #[serde(default, skip_serializing_if = "ShapeNotes::is_empty")]
    pub notes: ShapeNotes,
}

impl ShapeEntry {
    /// The variant that serves M rows.
    pub fn variant_for(&self, m: usize) -> Variant {
        if m < self.m1 {
            Variant::Gemv
        } else if m < self.m2 {
            Variant::FlatGemm
        } else {
            Variant::Gemm
        }
    }

    /// The variant's tile: its winner without `from_m` (else its first).
    pub fn winner(&self, variant: Variant) -> Option<&Winner> {
        let mut of_variant = self.winners.iter().filter(|w| w.variant == variant);
        of_variant
            .clone()
            .find(|w| w.from_m.is_none())
            .or_else(|| of_variant.next())
    }

    /// The flat GEMM steps (winners with `from_m`), ascending `from_m`.
    pub fn flat_steps(&self) -> Vec<(usize, &Winner)> {
        let mut steps: Vec<(usize, &Winner)> = self
            .winners
            .iter()
            .filter(|w| w.variant == Variant::FlatGemm)
            .filter_map(|w| w.from_m.map(|m| (m, w)))
            .collect();
        steps.sort_by_key(|(m, _)| *m);
        steps
    }
}

/// Everything measured on one device for one backend and format.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeviceEntry {
    pub fingerprint: Fingerprint,
    pub generator: GeneratorId,
    pub backend: String,
    pub format: String,
    pub model: String,
    pub threads: usize,
    /// True when the tuning budget ran out before every shape finished.
    pub partial: bool,
    pub created_unix: u64,
    pub limits: Limits,
    /// Relative throughput per logical CPU, for the work split (MNN-LLM 5.2).
    pub core_weights: Vec<f64>,
    pub shapes: Vec<ShapeEntry>,
    /// The causal prefill's blocks measured for the model's heads (host
    /// backends with a whole-prefill kernel); absent in older records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill: Option<PrefillEntry>,
    /// How the decode attention multiplies fp8 values, measured for the
    /// model's heads (x86 hosts with AVX512-FP16 or AVX512_BF16); absent in
    /// older records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decode: Option<DecodeEntry>,
    /// How far ahead the int8 GEMV and flat loops prefetch the weight
    /// stream, measured on this device (x86 JIT); absent in older records
    /// and for other backends and formats.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight_prefetch: Option<PrefetchEntry>,
}

/// A weight stream's software prefetch measured on a device: each
/// candidate's time at a few batch sizes on one of the model's shapes, and
/// the one the runtime emits. Distance and cache level are facts of the
/// memory system: the int8 loops read fastest 4 KiB ahead into L1 on
/// Zen 4 but 2 KiB ahead on a Sapphire Rapids-class Xeon, whose float
/// loops want 4 KiB into L2 (`docs/PERFORMANCE.md`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PrefetchEntry {
    /// The loops it applies to: [`PREFETCH_STREAMS`] (`int8`: quantized
    /// activations; `float`: f32 or f16 ones).
    pub stream: String,
    /// What the runtime emits: a candidate that beat the default by the
    /// tuner's margin in two separate measurements, else the default.
    pub chosen: PrefetchChoice,
    pub default: PrefetchChoice,
    /// The weight shape `[n, k]` timed, and the batch sizes whose times
    /// are summed.
    pub shape: [usize; 2],
    pub m: Vec<usize>,
    /// Summed median µs of each candidate (the default first).
    pub measurements: Vec<PrefetchMeasurement>,
}

/// How far ahead, and into which cache, a stream is prefetched.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrefetchChoice {
    pub bytes: u32,
    pub level: CacheLevel,
}

/// The cache a software prefetch fills.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CacheLevel {
    L1,
    L2,
}

/// `4096 B ahead into L2`, as reports print it.
impl std::fmt::Display for PrefetchChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let level = match self.level {
            CacheLevel::L1 => "L1",
            CacheLevel::L2 => "L2",
        };
        write!(f, "{} B ahead into {level}", self.bytes)
    }
}

/// One candidate's time.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PrefetchMeasurement {
    #[serde(flatten)]
    pub choice: PrefetchChoice,
    /// At the record's threads.
    pub us: f64,
    /// On one thread, where the record's are more: the bandwidth two
    /// threads share can hide how far one core's prefetches reach.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub us_one_thread: Option<f64>,
}

#[cfg(feature = "jit")]
impl PrefetchChoice {
    /// The x86 emitter's prefetch, or why it refuses this one.
    pub fn to_x86(self) -> Result<tessera_codegen::x86::WeightPrefetch, String> {
        use tessera_codegen::x86::{PrefetchLevel, WeightPrefetch};
        let level = match self.level {
            CacheLevel::L1 => PrefetchLevel::L1,
            CacheLevel::L2 => PrefetchLevel::L2,
        };
        WeightPrefetch::new(self.bytes, level)
    }

    /// The record's form of an x86 prefetch.
    pub fn from_x86(prefetch: tessera_codegen::x86::WeightPrefetch) -> PrefetchChoice {
        use tessera_codegen::x86::PrefetchLevel;
        PrefetchChoice {
            bytes: prefetch.bytes(),
            level: match prefetch.level() {
                PrefetchLevel::L1 => CacheLevel::L1,
                PrefetchLevel::L2 => CacheLevel::L2,
            },
        }
    }
}

/// The weight streams a [`PrefetchEntry`] may name.
pub const PREFETCH_STREAMS: [&str; 2] = ["int8", "float"];

/// The longest weight prefetch distance a record may name (the x86
/// emitter's limit).
pub const MAX_PREFETCH_BYTES: u32 = 64 << 10;

/// The prefill blocks (query rows × keys) measured on a device for one
/// head layout: every candidate's time and the one the runtime uses.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PrefillEntry {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// The prompt length timed (no earlier context), and the KV format.
    pub seq: usize,
    pub kv: String,
    /// `[rows, keys]` the runtime emits the prefill in: a candidate that
    /// beat the default by the margin in two separate measurements, else
    /// the default.
    pub blocks: [u32; 2],
    pub default: [u32; 2],
    /// Median ms per call of each candidate (default first).
    pub measurements: Vec<PrefillMeasurement>,
}

/// One candidate's time.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PrefillMeasurement {
    pub blocks: [u32; 2],
    pub ms: f64,
}

/// The decode attention's P·V of fp8 values measured on a device for one
/// head layout: in the CPU's packed form (the default: f16 FMAs,
/// `vfmadd231ph`, where it has AVX512-FP16, else bf16 dot products,
/// `vdpbf16ps`, where it has AVX512_BF16) or by f32 FMAs. Which is faster
/// depends on the core, not the feature bit: `vdpbf16ps` issues at 2 per
/// cycle on Zen 4 but about 0.5 on Sapphire Rapids (`docs/PERFORMANCE.md`).
/// Records before the f16 form named the field `fp8_values_by_bf16`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DecodeEntry {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// The context length timed, and the KV format.
    pub ctx: usize,
    pub kv: String,
    /// The form the runtime emits: the packed form unless f32 FMAs beat it
    /// by the tuner's margin in two separate measurements.
    #[serde(alias = "fp8_values_by_bf16")]
    pub fp8_values_packed: bool,
    /// The packed form timed (`f16 FMAs`, `bf16 dots`); records before the
    /// f16 form timed bf16 dots.
    #[serde(default = "bf16_dots")]
    pub packed: String,
    /// Median µs per call of each form (the packed form first); empty
    /// where the backend has one fp8 form.
    pub measurements: Vec<DecodeMeasurement>,
    /// How the int8 keys of several-head tiles are scored, where the
    /// backend has two forms (x86 with AVX512-VNNI and no AMX): a key in
    /// each lane (`true`, the default) unless the pair loop, two keys
    /// along d, beat it by the tuner's margin twice. None: not measured
    /// (the backend's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub int8_keys_in_lanes: Option<bool>,
    /// Median µs per call of each int8 key form (in lanes first), with the
    /// fp8 values' chosen form.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub key_measurements: Vec<KeyMeasurement>,
    /// Where int8 keys are scored in lanes: whether q is rounded to int8
    /// in 32-d blocks for them (`true`), as ggml rounds q to Q8_0, rather
    /// than to i16 (`false`, the default). It changes the scores, so the
    /// tuner takes it only where it beat the i16 form by its margin twice.
    /// None: not measured (i16).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub int8_q_in_lanes: Option<bool>,
    /// Median µs per call of each q form (i16 first), with the fp8 values'
    /// and the keys' chosen forms.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub q_measurements: Vec<QMeasurement>,
}

/// One q form's time.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QMeasurement {
    pub int8_q: bool,
    pub us: f64,
}

/// One int8 key form's time.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KeyMeasurement {
    pub in_lanes: bool,
    pub us: f64,
}

/// Whether two `[query heads, KV heads]` layouts group the same number of
/// query heads on each KV head (12/4 as 6/2); never where either has no
/// KV heads.
fn same_grouping([hq_a, kvh_a]: [usize; 2], [hq_b, kvh_b]: [usize; 2]) -> bool {
    let group = |hq: usize, kvh: usize| hq.checked_div(kvh);
    group(hq_a, kvh_a).is_some() && group(hq_a, kvh_a) == group(hq_b, kvh_b)
}

/// The packed form of records that predate [`DecodeEntry::packed`].
fn bf16_dots() -> String {
    "bf16 dots".to_string()
}

/// One decode form's time.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DecodeMeasurement {
    #[serde(alias = "fp8_values_by_bf16")]
    pub fp8_values_packed: bool,
    pub us: f64,
}

impl DeviceEntry {
    pub fn shape(&self, n: usize, k: usize) -> Option<&ShapeEntry> {
        self.shapes.iter().find(|s| s.n == n && s.k == k)
    }

    /// Entries that replace each other on merge.
    fn key(&self) -> (String, &GeneratorId, &str, &str, &str, usize) {
        (
            self.fingerprint.digest(),
            &self.generator,
            &self.backend,
            &self.format,
            &self.model,
            self.threads,
        )
    }
}

/// A record file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TuningRecord {
    pub schema: u32,
    pub entries: Vec<DeviceEntry>,
}

impl Default for TuningRecord {
    fn default() -> Self {
        TuningRecord {
            schema: RECORD_SCHEMA,
            entries: Vec::new(),
        }
    }
}

/// Why a record cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: not a tuning record: {source}")]
    Json {
        path: String,
        source: serde_json::Error,
    },
    #[error("record schema {found} is not supported (this runtime reads schema {RECORD_SCHEMA})")]
    Schema { found: u32 },
    #[error(
        "the record has no entry for backend `{backend}` and format `{format}` (it has: {available})"
    )]
    NoEntry {
        backend: String,
        format: String,
        available: String,
    },
    #[error("the record is stale for this device: {why}")]
    Stale { why: String },
    #[error("the record has no shape [{n}, {k}] (its entries for this device are for: {models})")]
    NoShape { n: usize, k: usize, models: String },
    #[error("{path}: {entry}: `{field}` {why}")]
    Invalid {
        path: String,
        /// Which entry (index, backend, format, model) and shape.
        entry: String,
        field: String,
        why: String,
    },
}

/// How far apart (as a ratio of n) a measured shape may be from one the
/// record lacks and still lend it its plan: a fused gate and up is twice
/// either half.
pub const NEAREST_SHAPE_MAX_N_RATIO: f64 = 2.0;

/// A record's plan for a weight shape ([`TuningRecord::select_shape`]).
#[derive(Clone, Copy, Debug)]
pub struct ShapeMatch<'a> {
    pub entry: &'a ShapeEntry,
    /// Whether `entry` is the shape asked for, or the nearest stand-in.
    pub exact: bool,
}

/// The largest ratio between two cores' weights a record may carry: no
/// real core is a thousand times another, and larger ratios (or huge
/// values) overflow the work split.
const MAX_CORE_WEIGHT_RATIO: f64 = 1e3;

/// The largest tile dimension a record may name (the solvers' tiles are
/// tens of rows; this only bounds what a hand-edited file can ask for).
const MAX_TILE_DIM: u32 = 1 << 16;

impl DeviceEntry {
    /// The values the runtime relies on: thread count, per-core weights
    /// (finite, positive, one per thread, within a sane ratio), shapes
    /// (n, k ≥ 1, 1 ≤ m1 ≤ m2) and winner tiles (every dimension ≥ 1).
    /// Returns (field, why) of the first violation, with the shape named.
    fn invalid(&self) -> Option<(String, String)> {
        if self.threads == 0 {
            return Some(("threads".into(), "is 0".into()));
        }
        let w = &self.core_weights;
        if w.len() < self.threads {
            return Some((
                "core_weights".into(),
                format!(
                    "has {} values for {} threads (one per thread at least)",
                    w.len(),
                    self.threads
                ),
            ));
        }
        if let Some((i, v)) = w
            .iter()
            .enumerate()
            .find(|(_, v)| !v.is_finite() || **v <= 0.0)
        {
            return Some((
                "core_weights".into(),
                format!("[{i}] = {v} (each must be finite and > 0)"),
            ));
        }
        let (lo, hi) = w.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), &v| {
            (lo.min(v), hi.max(v))
        });
        if hi / lo > MAX_CORE_WEIGHT_RATIO {
            return Some((
                "core_weights".into(),
                format!("range {lo}..{hi} exceeds a ratio of {MAX_CORE_WEIGHT_RATIO}"),
            ));
        }
        if let Some(p) = &self.weight_prefetch {
            if !PREFETCH_STREAMS.contains(&p.stream.as_str()) {
                return Some((
                    "weight_prefetch.stream".into(),
                    format!("is `{}` (one of {PREFETCH_STREAMS:?})", p.stream),
                ));
            }
            let bytes = p.chosen.bytes;
            if bytes == 0 || !bytes.is_multiple_of(64) || bytes > MAX_PREFETCH_BYTES {
                return Some((
                    "weight_prefetch.chosen.bytes".into(),
                    format!("is {bytes} (a positive multiple of 64, at most {MAX_PREFETCH_BYTES})"),
                ));
            }
        }
        for s in &self.shapes {
            let at = |field: &str| format!("shapes[{}, {}].{field}", s.n, s.k);
            if s.n == 0 || s.k == 0 {
                return Some((at("n, k"), "must be ≥ 1".into()));
            }
            if s.m1 == 0 || s.m1 > s.m2 {
                return Some((
                    at("m1, m2"),
                    format!("are {}, {} (need 1 ≤ m1 ≤ m2)", s.m1, s.m2),
                ));
            }
            for w in &s.winners {
                if w.tile.iter().any(|&d| d == 0 || d > MAX_TILE_DIM) {
                    return Some((
                        at("winners.tile"),
                        format!(
                            "{:?} for {} (each of ep, hp, lp must be 1..={MAX_TILE_DIM})",
                            w.tile, w.variant
                        ),
                    ));
                }
                if w.from_m == Some(0) {
                    return Some((at("winners.from_m"), "is 0".into()));
                }
            }
        }
        None
    }
}

impl TuningRecord {
    pub fn from_json(text: &str, path: &str) -> Result<TuningRecord, RecordError> {
        let record: TuningRecord =
            serde_json::from_str(text).map_err(|source| RecordError::Json {
                path: path.to_string(),
                source,
            })?;
        if record.schema != RECORD_SCHEMA {
            return Err(RecordError::Schema {
                found: record.schema,
            });
        }
        record.validate(path)?;
        Ok(record)
    }

    /// Every entry's values are ones the runtime can rely on (see
    /// `DeviceEntry::invalid`); `source` names the record in the error.
    pub fn validate(&self, source: &str) -> Result<(), RecordError> {
        for (i, e) in self.entries.iter().enumerate() {
            if let Some((field, why)) = e.invalid() {
                return Err(RecordError::Invalid {
                    path: source.to_string(),
                    entry: format!(
                        "entry {i} (backend `{}`, format `{}`, model `{}`)",
                        e.backend, e.format, e.model
                    ),
                    field,
                    why,
                });
            }
        }
        Ok(())
    }

    pub fn load(path: &Path) -> Result<TuningRecord, RecordError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| RecordError::Io {
            path: shown.clone(),
            source,
        })?;
        Self::from_json(&text, &shown)
    }

    pub fn to_json(&self) -> String {
        // Serializing plain data with string keys cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default() + "\n"
    }

    pub fn save(&self, path: &Path) -> Result<(), RecordError> {
        std::fs::write(path, self.to_json()).map_err(|source| RecordError::Io {
            path: path.display().to_string(),
            source,
        })
    }

    /// Combine records from several devices: entries with the same device,
    /// generator, backend, format, model and thread count are replaced by
    /// `other`'s (the newer measurement); the rest are kept, in order.
    pub fn merge(mut self, other: TuningRecord) -> TuningRecord {
        for entry in other.entries {
            match self.entries.iter().position(|e| e.key() == entry.key()) {
                Some(i) => self.entries[i] = entry,
                None => self.entries.push(entry),
            }
        }
        self
    }

    /// The entries measured on `device` by `generator` for `backend`, any
    /// weight format's: where attention choices are looked up.
    fn measured_on<'a>(
        &'a self,
        device: &'a Fingerprint,
        generator: &'a GeneratorId,
        backend: &'a str,
    ) -> impl Iterator<Item = &'a DeviceEntry> {
        self.entries.iter().filter(move |e| {
            e.backend == backend
                && &e.generator == generator
                && e.fingerprint.digest() == device.digest()
        })
    }

    /// The prefill blocks measured on `device` for `backend` and a head
    /// dim of `head_dim` (any weight format's entry), if a record entry
    /// carries them: the newest that measured the grouping of `heads`
    /// query heads over `kv_heads`, else the newest for that head dim. The
    /// blocks that win depend on the grouping too (a record of two models
    /// with head dim 128, Llama2-7B's 32/32 and Qwen2-1.5B's 12/2, gave
    /// either model the other's when it was newer).
    pub fn prefill_blocks(
        &self,
        device: &Fingerprint,
        generator: &GeneratorId,
        backend: &str,
        heads: usize,
        kv_heads: usize,
        head_dim: usize,
    ) -> Option<[u32; 2]> {
        self.measured_on(device, generator, backend)
            .filter_map(|e| e.prefill.as_ref().map(|p| (e.created_unix, p)))
            .filter(|(_, p)| p.head_dim == head_dim)
            .max_by_key(|(t, p)| (same_grouping([p.heads, p.kv_heads], [heads, kv_heads]), *t))
            .map(|(_, p)| p.blocks)
    }

    /// Whether the decode attention multiplies fp8 values in the packed
    /// form ([`DecodeEntry`]), as
    /// measured on `device` for `backend`, head dim `head_dim` and the
    /// grouping of `heads` query heads over `kv_heads` (the newest entry
    /// that measured that grouping, any weight format's); None where no
    /// entry did (the backend's default then).
    pub fn fp8_values_packed(
        &self,
        device: &Fingerprint,
        generator: &GeneratorId,
        backend: &str,
        heads: usize,
        kv_heads: usize,
        head_dim: usize,
    ) -> Option<bool> {
        let at = (device, generator, backend);
        self.newest_decode(at, [heads, kv_heads, head_dim], |_| true)
            .map(|p| p.fp8_values_packed)
    }

    /// The newest decode entry measured on `device` for `backend` for
    /// `[heads, kv_heads, head_dim]` (the same head dim and grouping, any
    /// weight format's entry) that `measured` accepts.
    fn newest_decode<'a>(
        &'a self,
        (device, generator, backend): (&'a Fingerprint, &'a GeneratorId, &'a str),
        [heads, kv_heads, head_dim]: [usize; 3],
        measured: impl Fn(&DecodeEntry) -> bool,
    ) -> Option<&'a DecodeEntry> {
        self.measured_on(device, generator, backend)
            .filter_map(|e| e.decode.as_ref().map(|p| (e.created_unix, p)))
            .filter(|(_, p)| {
                measured(p)
                    && p.head_dim == head_dim
                    && same_grouping([p.heads, p.kv_heads], [heads, kv_heads])
            })
            .max_by_key(|(t, _)| *t)
            .map(|(_, p)| p)
    }

    /// Whether the decode attention scores int8 keys in lanes
    /// ([`DecodeEntry::int8_keys_in_lanes`]), as measured on `device` for
    /// `backend`, head dim `head_dim` and the grouping of `heads` over
    /// `kv_heads` (the newest entry that measured it); None where none did.
    pub fn int8_keys_in_lanes(
        &self,
        device: &Fingerprint,
        generator: &GeneratorId,
        backend: &str,
        heads: usize,
        kv_heads: usize,
        head_dim: usize,
    ) -> Option<bool> {
        let at = (device, generator, backend);
        self.decode_choice(at, [heads, kv_heads, head_dim], |p| p.int8_keys_in_lanes)
    }

    /// Whether the keys-in-lanes loop takes q as int8 blocks
    /// ([`DecodeEntry::int8_q_in_lanes`]), as [`Self::int8_keys_in_lanes`]
    /// finds its entry; None where none measured it.
    pub fn int8_q_in_lanes(
        &self,
        device: &Fingerprint,
        generator: &GeneratorId,
        backend: &str,
        heads: usize,
        kv_heads: usize,
        head_dim: usize,
    ) -> Option<bool> {
        let at = (device, generator, backend);
        self.decode_choice(at, [heads, kv_heads, head_dim], |p| p.int8_q_in_lanes)
    }

    /// The choice `pick` reads from the newest decode entry for the head
    /// layout that made it.
    fn decode_choice(
        &self,
        at: (&Fingerprint, &GeneratorId, &str),
        shape: [usize; 3],
        pick: fn(&DecodeEntry) -> Option<bool>,
    ) -> Option<bool> {
        self.newest_decode(at, shape, |p| pick(p).is_some())
            .and_then(pick)
    }

    /// How `stream` (one of [`PREFETCH_STREAMS`]) is prefetched, as
    /// measured on `device` for `backend`: the newest entry that measured
    /// that stream, any weight format's (the choice is the memory
    /// system's); None where no entry did (the backend's default then).
    pub fn weight_prefetch(
        &self,
        device: &Fingerprint,
        generator: &GeneratorId,
        backend: &str,
        stream: &str,
    ) -> Option<PrefetchChoice> {
        self.measured_on(device, generator, backend)
            .filter_map(|e| e.weight_prefetch.as_ref().map(|p| (e.created_unix, p)))
            .filter(|(_, p)| p.stream == stream)
            .max_by_key(|(t, _)| *t)
            .map(|(_, p)| p.chosen)
    }

    /// The first entry for this device, generator, backend and format, or
    /// why none fits: a record measured elsewhere, or by another generator,
    /// is refused with the reason (the runtime then falls back to solver
    /// defaults and says so).
    pub fn select(
        &self,
        device: &Fingerprint,
        generator: &GeneratorId,
        backend: &str,
        format: &str,
    ) -> Result<&DeviceEntry, RecordError> {
        self.select_all(device, generator, backend, format)
            .map(|entries| entries[0])
    }

    /// The plan for shape [n, k] from any entry that fits this device,
    /// generator, backend and format (a record tuned for several models
    /// holds one entry per model, and a model's shapes are only in its
    /// own), or why none has one.
    ///
    /// A shape no entry has borrows the measured shape with the same k and
    /// the nearest n, no more than [`NEAREST_SHAPE_MAX_N_RATIO`] apart
    /// ([`ShapeMatch::exact`] false). A layer the tuner did not see (a
    /// model's gate and up run unfused; another model with a near width)
    /// then runs the tiles and breakpoints measured on this device for the
    /// same reduction, which decide the inner loops, rather than the
    /// solver's guesses; n only changes how many column panels there are.
    pub fn select_shape(
        &self,
        device: &Fingerprint,
        generator: &GeneratorId,
        backend: &str,
        format: &str,
        n: usize,
        k: usize,
    ) -> Result<ShapeMatch<'_>, RecordError> {
        let entries = self.select_all(device, generator, backend, format)?;
        let shapes = || entries.iter().flat_map(|e| e.shapes.iter());
        if let Some(entry) = shapes().find(|s| s.n == n && s.k == k) {
            return Ok(ShapeMatch { entry, exact: true });
        }
        let ratio = |s: &ShapeEntry| s.n.max(n) as f64 / s.n.min(n).max(1) as f64;
        shapes()
            .filter(|s| s.k == k && s.n > 0 && ratio(s) <= NEAREST_SHAPE_MAX_N_RATIO)
            .min_by(|a, b| ratio(a).total_cmp(&ratio(b)).then(b.n.cmp(&a.n)))
            .map(|entry| ShapeMatch {
                entry,
                exact: false,
            })
            .ok_or_else(|| RecordError::NoShape {
                n,
                k,
                models: entries
                    .iter()
                    .map(|e| e.model.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }

    /// Every entry for this device, generator, backend and format, in
    /// record order (at least one), or why none fits.
    fn select_all(
        &self,
        device: &Fingerprint,
        generator: &GeneratorId,
        backend: &str,
        format: &str,
    ) -> Result<Vec<&DeviceEntry>, RecordError> {
        let candidates: Vec<&DeviceEntry> = self
            .entries
            .iter()
            .filter(|e| e.backend == backend && e.format == format)
            .collect();
        if candidates.is_empty() {
            let available: Vec<String> = self
                .entries
                .iter()
                .map(|e| format!("{}/{}", e.backend, e.format))
                .collect();
            return Err(RecordError::NoEntry {
                backend: backend.to_string(),
                format: format.to_string(),
                available: if available.is_empty() {
                    "nothing".into()
                } else {
                    available.join(", ")
                },
            });
        }
        let mut why = String::new();
        let mut fitting = Vec::new();
        for entry in candidates {
            match entry.fingerprint.mismatch(device) {
                Some(reason) => why = reason,
                None if entry.generator != *generator => {
                    why = format!(
                        "it was made by generator {} ({}), this is {} ({})",
                        entry.generator.version,
                        entry.generator.template_hash,
                        generator.version,
                        generator.template_hash
                    );
                }
                None => fitting.push(entry),
            }
        }
        if fitting.is_empty() {
            return Err(RecordError::Stale { why });
        }
        Ok(fitting)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::from_cpuinfo;

    fn entry(model: &str, flags: &str, hash: &str) -> DeviceEntry {
        let mut fp = from_cpuinfo(&format!(
            "processor\t: 0\nmodel name\t: Test CPU\nflags\t: {flags}\n"
        ));
        fp.arch = "x86_64".into();
        DeviceEntry {
            prefill: None,
            decode: None,
            weight_prefetch: None,
            fingerprint: fp,
            generator: GeneratorId {
                version: "0.1.0".into(),
                template_hash: hash.into(),
            },
            backend: "host".into(),
            format: "w4a8".into(),
            model: model.into(),
            threads: 1,
            partial: false,
            created_unix: 0,
            limits: Limits::default(),
            core_weights: vec![1.0],
            shapes: vec![ShapeEntry {
                name: "o".into(),
                n: 1536,
                k: 1536,
                m1: 2,
                m2: 32,
                winners: vec![],
                measurements: vec![],
                notes: Default::default(),
            }],
        }
    }

    #[test]
    fn json_round_trip_and_schema_check() {
        let rec = TuningRecord {
            schema: RECORD_SCHEMA,
            entries: vec![entry("qwen2-1.5b", "avx2 fma", "aa")],
        };
        let back = TuningRecord::from_json(&rec.to_json(), "mem").unwrap();
        assert_eq!(back, rec);
        let future = rec.to_json().replace("\"schema\": 1", "\"schema\": 9");
        assert!(matches!(
            TuningRecord::from_json(&future, "mem"),
            Err(RecordError::Schema { found: 9 })
        ));
        assert!(matches!(
            TuningRecord::from_json("{", "mem"),
            Err(RecordError::Json { .. })
        ));
    }

    #[test]
    fn invalid_values_are_refused_naming_the_entry_and_field() {
        let valid = entry("qwen2-1.5b", "avx2 fma", "aa");
        type Break = Box<dyn Fn(&mut DeviceEntry)>;
        let cases: Vec<(&str, Break)> = vec![
            ("threads", Box::new(|e| e.threads = 0)),
            ("core_weights", Box::new(|e| e.core_weights = vec![])),
            (
                "core_weights",
                Box::new(|e| e.core_weights = vec![f64::NAN]),
            ),
            ("core_weights", Box::new(|e| e.core_weights = vec![-1.0])),
            ("core_weights", Box::new(|e| e.core_weights = vec![0.0])),
            (
                "core_weights",
                Box::new(|e| {
                    e.threads = 2;
                    e.core_weights = vec![1.0, 1e300];
                }),
            ),
            (
                "weight_prefetch.chosen.bytes",
                Box::new(|e| e.weight_prefetch = prefetch(0)),
            ),
            (
                "weight_prefetch.chosen.bytes",
                Box::new(|e| e.weight_prefetch = prefetch(100)),
            ),
            (
                "weight_prefetch.chosen.bytes",
                Box::new(|e| e.weight_prefetch = prefetch(MAX_PREFETCH_BYTES + 64)),
            ),
            (
                "weight_prefetch.stream",
                Box::new(|e| e.weight_prefetch = prefetch_of("f64", 4096, CacheLevel::L1)),
            ),
            ("m1, m2", Box::new(|e| e.shapes[0].m1 = 0)),
            ("m1, m2", Box::new(|e| e.shapes[0].m2 = 1)),
            ("n, k", Box::new(|e| e.shapes[0].k = 0)),
            (
                "winners.tile",
                Box::new(|e| {
                    e.shapes[0].winners.push(Winner {
                        variant: Variant::Gemm,
                        target: "host".into(),
                        tile: [0, 0, 0],
                        kernel: "k".into(),
                        from_m: None,
                    })
                }),
            ),
        ];
        for (field, break_it) in cases {
            let mut e = valid.clone();
            break_it(&mut e);
            let rec = TuningRecord {
                schema: RECORD_SCHEMA,
                entries: vec![valid.clone(), e],
            };
            // In memory (a record handed to DeviceOptions): NaN has no JSON
            // form, so the values are checked on the record itself.
            let err = rec.validate("rec.json").unwrap_err();
            let msg = err.to_string();
            assert!(matches!(err, RecordError::Invalid { .. }), "{msg}");
            assert!(
                msg.starts_with("rec.json: entry 1 (backend `host`"),
                "{msg}"
            );
            assert!(msg.contains(field), "{field}: {msg}");
        }
        // JSON has no NaN: a huge number is how a file says "absurd".
        let text = TuningRecord {
            schema: RECORD_SCHEMA,
            entries: vec![valid.clone()],
        }
        .to_json()
        .replace(
            "\"core_weights\": [\n        1.0\n      ]",
            "\"core_weights\": [1e999]",
        );
        assert!(text.contains("1e999"), "{text}");
        assert!(TuningRecord::from_json(&text, "rec.json").is_err());
    }

    #[test]
    fn select_refuses_other_devices_and_generators_with_reasons() {
        let rec = TuningRecord {
            schema: RECORD_SCHEMA,
            entries: vec![entry("qwen2-1.5b", "avx2 fma", "aa")],
        };
        let here = rec.entries[0].fingerprint.clone();
        let gen_aa = rec.entries[0].generator.clone();
        assert!(rec.select(&here, &gen_aa, "host", "w4a8").is_ok());
        let gen_bb = GeneratorId {
            template_hash: "bb".into(),
            ..gen_aa.clone()
        };
        let err = rec.select(&here, &gen_bb, "host", "w4a8").unwrap_err();
        assert!(err.to_string().contains("generator"), "{err}");
        let mut other = here.clone();
        other.features = vec!["avx2".into()];
        let err = rec.select(&other, &gen_aa, "host", "w4a8").unwrap_err();
        assert!(err.to_string().contains("features differ"), "{err}");
        let err = rec.select(&here, &gen_aa, "neon", "w4a8").unwrap_err();
        assert!(err.to_string().contains("host/w4a8"), "{err}");
    }

    /// A record tuned for two models holds an entry per model: each
    /// model's shapes are found, whichever entry comes first.
    #[test]
    fn select_shape_searches_every_model_of_this_device() {
        let mut llama = entry("llama2-7b", "avx2 fma", "aa");
        llama.shapes[0].n = 4096;
        llama.shapes[0].k = 11008;
        llama.shapes[0].m1 = 3;
        let rec = TuningRecord {
            schema: RECORD_SCHEMA,
            entries: vec![entry("qwen2-1.5b", "avx2 fma", "aa"), llama],
        };
        let here = rec.entries[0].fingerprint.clone();
        let generator = rec.entries[0].generator.clone();
        let find = |n, k| {
            rec.select_shape(&here, &generator, "host", "w4a8", n, k)
                .map(|m| m.entry)
        };
        assert_eq!(find(1536, 1536).unwrap().m1, 2);
        assert_eq!(find(4096, 11008).unwrap().m1, 3);
        let err = find(4096, 4096).unwrap_err();
        assert!(
            err.to_string().contains("[4096, 4096]")
                && err.to_string().contains("qwen2-1.5b, llama2-7b"),
            "{err}"
        );
        let mut other = here.clone();
        other.features = vec!["avx2".into()];
        let err = rec
            .select_shape(&other, &generator, "host", "w4a8", 1536, 1536)
            .unwrap_err();
        assert!(err.to_string().contains("features differ"), "{err}");
    }

    #[test]
    fn nearest_shape_lends_a_plan_of_the_same_k_within_twice_n() {
        let mut llama = entry("llama2-7b", "avx2 fma", "aa");
        let shape = llama.shapes[0].clone();
        llama.shapes = [(22016, 4096, 4), (4096, 4096, 5), (11008, 2048, 6)]
            .into_iter()
            .map(|(n, k, m1)| ShapeEntry {
                n,
                k,
                m1,
                ..shape.clone()
            })
            .collect();
        let rec = TuningRecord {
            schema: RECORD_SCHEMA,
            entries: vec![entry("qwen2-1.5b", "avx2 fma", "aa"), llama],
        };
        let here = rec.entries[0].fingerprint.clone();
        let generator = rec.entries[0].generator.clone();
        let near = |n, k| {
            rec.select_shape(&here, &generator, "host", "w4a8", n, k)
                .ok()
                .map(|m| (m.entry.n, m.entry.k, m.exact))
        };
        // Gate and up unfused: half the fused shape, same k.
        assert_eq!(near(11008, 4096), Some((22016, 4096, false)));
        // The nearer n wins; a shape the record has is exact.
        assert_eq!(near(6000, 4096), Some((4096, 4096, false)));
        assert_eq!(near(4096, 4096), Some((4096, 4096, true)));
        // Another entry's shapes count too (qwen2's [1536, 1536]).
        assert_eq!(near(3072, 1536), Some((1536, 1536, false)));
        // More than twice n apart, or another k: nothing.
        assert_eq!(near(2000, 4096), None);
        assert_eq!(near(11008, 4000), None);
        let mut other = here.clone();
        other.features = vec!["avx2".into()];
        let err = rec
            .select_shape(&other, &generator, "host", "w4a8", 11008, 4096)
            .unwrap_err();
        assert!(err.to_string().contains("features differ"), "{err}");
    }

    #[test]
    fn merge_replaces_same_key_and_keeps_others() {
        let a = TuningRecord {
            schema: RECORD_SCHEMA,
            entries: vec![entry("m", "avx2", "aa"), entry("m", "avx2 fma", "aa")],
        };
        let mut newer = entry("m", "avx2", "aa");
        newer.shapes[0].m1 = 5;
        let b = TuningRecord {
            schema: RECORD_SCHEMA,
            entries: vec![newer.clone(), entry("m", "avx512f", "aa")],
        };
        let merged = a.merge(b);
        assert_eq!(merged.entries.len(), 3);
        assert_eq!(merged.entries[0], newer);
    }

    #[test]
    fn flat_steps_round_trip_and_old_records_read_without_them() {
        let w = |variant, tile: [u32; 3], from_m| Winner {
            variant,
            target: "x86-avx2".into(),
            tile,
            kernel: String::new(),
            from_m,
        };
        let mut e = entry("m", "avx2", "aa");
        e.shapes[0].winners = vec![
            w(Variant::Gemv, [1, 32, 1], None),
            w(Variant::FlatGemm, [3, 8, 1], Some(3)),
            w(Variant::FlatGemm, [8, 8, 1], None),
            w(Variant::FlatGemm, [2, 8, 1], Some(2)),
        ];
        let rec = TuningRecord {
            schema: RECORD_SCHEMA,
            entries: vec![e],
        };
        let json = rec.to_json();
        let back = TuningRecord::from_json(&json, "mem").unwrap();
        assert_eq!(back, rec);
        let s = &back.entries[0].shapes[0];
        assert_eq!(s.winner(Variant::FlatGemm).unwrap().tile, [8, 8, 1]);
        let steps: Vec<usize> = s.flat_steps().iter().map(|(m, _)| *m).collect();
        assert_eq!(steps, vec![2, 3]);
        // A record written before per-M steps: no `from_m` keys at all.
        let mut value: serde_json::Value = serde_json::from_str(&json).unwrap();
        for w in value["entries"][0]["shapes"][0]["winners"]
            .as_array_mut()
            .unwrap()
        {
            w.as_object_mut().unwrap().remove("from_m");
        }
        let old = value.to_string();
        assert!(!old.contains("from_m"), "{old}");
        let s = &TuningRecord::from_json(&old, "mem").unwrap().entries[0].shapes[0];
        assert!(s.flat_steps().is_empty());
        assert_eq!(s.winner(Variant::FlatGemm).unwrap().tile, [3, 8, 1]);
    }

    #[test]
    fn variant_for_uses_the_breakpoints() {
        let s = &entry("m", "avx2", "aa").shapes[0];
        assert_eq!(s.variant_for(1), Variant::Gemv);
        assert_eq!(s.variant_for(2), Variant::FlatGemm);
        assert_eq!(s.variant_for(31), Variant::FlatGemm);
        assert_eq!(s.variant_for(32), Variant::Gemm);
    }

    /// Where a record of `entry(…, "avx2 fma", "aa")` entries must not
    /// answer: another device, another generator, another backend.
    fn elsewhere(
        fp: &Fingerprint,
        generator: &GeneratorId,
    ) -> [(Fingerprint, GeneratorId, &'static str); 3] {
        [
            (
                entry("x", "avx2 fma avx512f", "aa").fingerprint,
                generator.clone(),
                "host",
            ),
            (fp.clone(), entry("x", "avx2 fma", "bb").generator, "host"),
            (fp.clone(), generator.clone(), "x86"),
        ]
    }

    /// An entry of `model` on the same device and generator, made at
    /// `created_unix` (the lookups take the newest).
    fn dated(model: &str, created_unix: u64) -> DeviceEntry {
        DeviceEntry {
            created_unix,
            ..entry(model, "avx2 fma", "aa")
        }
    }

    #[test]
    fn the_decode_form_is_the_newest_measured_for_the_grouping_on_this_device() {
        let decode = |heads, kv_heads, packed| {
            Some(DecodeEntry {
                heads,
                kv_heads,
                head_dim: 128,
                ctx: 4096,
                kv: "kv8".into(),
                fp8_values_packed: packed,
                packed: "f16 FMAs".into(),
                measurements: vec![],
                int8_keys_in_lanes: None,
                key_measurements: vec![],
                int8_q_in_lanes: None,
                q_measurements: vec![],
            })
        };
        let mut older = dated("qwen2-1.5b", 1);
        older.decode = decode(12, 2, true);
        let mut newer = dated("qwen2-1.5b", 2);
        newer.format = "q8_0".into();
        newer.decode = decode(12, 2, false);
        let mut mha = dated("llama2-7b", 3);
        mha.decode = decode(32, 32, true);
        let rec = TuningRecord {
            schema: RECORD_SCHEMA,
            entries: vec![older.clone(), newer, mha],
        };
        let (fp, generator) = (&older.fingerprint, &older.generator);
        let form = |hq, kvh, d| rec.fp8_values_packed(fp, generator, "host", hq, kvh, d);
        assert_eq!(
            form(12, 2, 128),
            Some(false),
            "the newer of two, any format's"
        );
        assert_eq!(form(6, 1, 128), Some(false), "the same grouping");
        assert_eq!(form(32, 32, 128), Some(true));
        assert_eq!(form(12, 2, 64), None, "another head dim");
        assert_eq!(form(8, 2, 128), None, "another grouping");
        assert_eq!(form(12, 0, 128), None, "no KV heads");
        for (device, generator, backend) in elsewhere(fp, generator) {
            assert_eq!(
                rec.fp8_values_packed(&device, &generator, backend, 12, 2, 128),
                None
            );
        }
    }

    #[test]
    fn the_int8_key_form_is_the_newest_that_measured_it_for_the_grouping() {
        let decode = |heads, kv_heads, lanes| {
            Some(DecodeEntry {
                heads,
                kv_heads,
                head_dim: 128,
                ctx: 4096,
                kv: "kv8".into(),
                fp8_values_packed: true,
                packed: "bf16 dots".into(),
                measurements: vec![],
                int8_keys_in_lanes: lanes,
                key_measurements: vec![],
                int8_q_in_lanes: lanes.map(|l| !l),
                q_measurements: vec![],
            })
        };
        let mut older = dated("qwen2-1.5b", 1);
        older.decode = decode(12, 2, Some(false));
        // Newer, but it did not measure the key form (one form there).
        let mut unmeasured = dated("qwen2-1.5b", 2);
        unmeasured.format = "q8_0".into();
        unmeasured.decode = decode(12, 2, None);
        let mut gqa4 = dated("llama3-8b", 3);
        gqa4.decode = decode(32, 8, Some(true));
        let rec = TuningRecord {
            schema: RECORD_SCHEMA,
            entries: vec![older.clone(), unmeasured, gqa4],
        };
        let (fp, generator) = (&older.fingerprint, &older.generator);
        let form = |hq, kvh, d| rec.int8_keys_in_lanes(fp, generator, "host", hq, kvh, d);
        assert_eq!(form(12, 2, 128), Some(false), "the newest that measured it");
        // The q form is found the same way, from its own field.
        let q_form = |hq, kvh, d| rec.int8_q_in_lanes(fp, generator, "host", hq, kvh, d);
        assert_eq!(q_form(12, 2, 128), Some(true));
        assert_eq!(q_form(8, 2, 128), Some(false));
        assert_eq!(q_form(12, 2, 64), None);
        assert_eq!(form(6, 1, 128), Some(false), "the same grouping");
        assert_eq!(form(8, 2, 128), Some(true));
        assert_eq!(form(12, 2, 64), None, "another head dim");
        assert_eq!(form(16, 2, 128), None, "another grouping");
        for (device, generator, backend) in elsewhere(fp, generator) {
            assert_eq!(
                rec.int8_keys_in_lanes(&device, &generator, backend, 12, 2, 128),
                None
            );
        }
        // A record from before the key form reads as unmeasured.
        let json = serde_json::to_string(&rec).unwrap();
        let mut value: serde_json::Value = serde_json::from_str(&json).unwrap();
        for e in value["entries"].as_array_mut().unwrap() {
            let d = e["decode"].as_object_mut().unwrap();
            d.remove("int8_keys_in_lanes");
            d.remove("key_measurements");
            d.remove("int8_q_in_lanes");
            d.remove("q_measurements");
        }
        let old = TuningRecord::from_json(&value.to_string(), "mem").unwrap();
        assert_eq!(
            old.int8_keys_in_lanes(fp, generator, "host", 12, 2, 128),
            None
        );
        assert_eq!(old.int8_q_in_lanes(fp, generator, "host", 12, 2, 128), None);
    }

    /// A measured int8 prefetch of `bytes` into L1.
    fn prefetch(bytes: u32) -> Option<PrefetchEntry> {
        prefetch_of("int8", bytes, CacheLevel::L1)
    }

    fn prefetch_of(stream: &str, bytes: u32, level: CacheLevel) -> Option<PrefetchEntry> {
        let default = PrefetchChoice {
            bytes: 4096,
            level: CacheLevel::L1,
        };
        Some(PrefetchEntry {
            stream: stream.into(),
            chosen: PrefetchChoice { bytes, level },
            default,
            shape: [4096, 4096],
            m: vec![1, 8],
            measurements: vec![PrefetchMeasurement {
                choice: default,
                us: 10.0,
                us_one_thread: None,
            }],
        })
    }

    #[test]
    fn the_weight_prefetch_is_the_newest_measured_on_this_device() {
        let mut older = dated("qwen2-1.5b", 1);
        older.weight_prefetch = prefetch(4096);
        let mut newer = dated("llama2-7b", 2);
        newer.format = "q8_0".into();
        newer.weight_prefetch = prefetch(2048);
        let unmeasured = dated("x", 3);
        let mut float = dated("f32", 4);
        float.format = "f32".into();
        float.weight_prefetch = prefetch_of("float", 4096, CacheLevel::L2);
        let rec = TuningRecord {
            schema: RECORD_SCHEMA,
            entries: vec![older.clone(), newer, unmeasured, float],
        };
        let (fp, generator) = (&older.fingerprint, &older.generator);
        let chosen = |bytes, level| Some(PrefetchChoice { bytes, level });
        assert_eq!(
            rec.weight_prefetch(fp, generator, "host", "int8"),
            chosen(2048, CacheLevel::L1),
            "the newest that measured the stream, any format's"
        );
        assert_eq!(
            rec.weight_prefetch(fp, generator, "host", "float"),
            chosen(4096, CacheLevel::L2),
            "each stream its own"
        );
        let json = rec.to_json();
        assert!(json.contains("\"level\": \"l2\""), "{json}");
        let back = TuningRecord::from_json(&rec.to_json(), "mem").unwrap();
        assert_eq!(back, rec, "round trip");
        for (device, generator, backend) in elsewhere(fp, generator) {
            assert_eq!(
                rec.weight_prefetch(&device, &generator, backend, "int8"),
                None
            );
        }
        let none = TuningRecord {
            schema: RECORD_SCHEMA,
            entries: vec![dated("x", 1)],
        };
        assert_eq!(none.weight_prefetch(fp, generator, "host", "int8"), None);
        assert!(
            !none.to_json().contains("weight_prefetch"),
            "absent, not null"
        );
    }

    #[test]
    fn prefill_blocks_prefer_the_grouping_then_the_newest_for_the_head_dim() {
        let prefill = |heads, kv_heads, head_dim, blocks| {
            Some(PrefillEntry {
                heads,
                kv_heads,
                head_dim,
                seq: 512,
                kv: "f16".into(),
                blocks,
                default: [96, 128],
                measurements: vec![],
            })
        };
        let mut gqa = dated("qwen2-1.5b", 1);
        gqa.prefill = prefill(12, 2, 128, [48, 128]);
        let mut mha = dated("llama2-7b", 2);
        mha.prefill = prefill(32, 32, 128, [96, 64]);
        let mut small = dated("x", 3);
        small.prefill = prefill(12, 2, 64, [32, 32]);
        let rec = TuningRecord {
            schema: RECORD_SCHEMA,
            entries: vec![gqa.clone(), mha, small],
        };
        let (fp, generator) = (&gqa.fingerprint, &gqa.generator);
        let blocks = |hq, kvh, d| rec.prefill_blocks(fp, generator, "host", hq, kvh, d);
        assert_eq!(
            blocks(12, 2, 128),
            Some([48, 128]),
            "its grouping, though older"
        );
        assert_eq!(blocks(6, 1, 128), Some([48, 128]), "the same grouping");
        assert_eq!(blocks(32, 32, 128), Some([96, 64]));
        assert_eq!(
            blocks(8, 2, 128),
            Some([96, 64]),
            "no such grouping: the newest"
        );
        assert_eq!(blocks(12, 2, 64), Some([32, 32]));
        assert_eq!(blocks(12, 2, 80), None, "another head dim");
        assert_eq!(
            blocks(12, 0, 128),
            Some([96, 64]),
            "no KV heads: the newest"
        );
    }
}
