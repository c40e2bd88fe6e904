//! Build-time generation: every kernel a model needs on chosen targets,
//! written to a directory with a `manifest.json` and a `kernels.rs` that
//! embeds them, for runtimes that cannot JIT.
//!
//! From `build.rs`:
//!
//! ```no_run
//! use tessera_kernels_gen::{GenConfig, ModelSpec, generate};
//! let out = std::path::PathBuf::from(std::env::var("OUT_DIR").unwrap());
//! let mut cfg = GenConfig::new(["opencl", "aarch64-i8mm"], ModelSpec::named("qwen2-1.5b"), out);
//! cfg.cargo = true; // print cargo:rerun-if-changed for config.json and the record
//! generate(&cfg).unwrap();
//! // then in the crate: include!(concat!(env!("OUT_DIR"), "/kernels.rs"));
//! ```
//!
//! Attention ships too, on the targets whose backends emit it (every
//! target): decode, `attention-decode-f16` and `attention-decode-kv8`, both
//! always, since the KV cache format is the runtime's choice, not the
//! weights'; and on `x86-avx2` and the `aarch64-*` targets, whose backends
//! emit a whole causal prefill, `attention-prefill-f16` and
//! `attention-prefill-kv8` as well (the entries say `prefill_blocks` and the
//! head-dim multiple the code takes). Their code takes every extent at run
//! time, so one kernel per target and KV format serves the model; its entry
//! records the model's heads, KV heads and head dimension (explicit shapes
//! carry none, so they get no attention). They are listed in the manifest's
//! `attention` array and `kernels.rs`'s `ATTENTION` table, apart from the
//! matmuls so matmul lookups never meet them.
//!
//! What is written, for each target × format × distinct weight shape
//! `[n, k]` × variant (GEMV, flat GEMM, GEMM):
//!
//! - the code, `<instance name>.<variant>.<ext>`: `.cl` (OpenCL C), `.ptx`,
//!   or `.bin` machine code with its listing `.s` (and, for `i8dyn`
//!   kernels, the activation quantizer `<…>.quant.bin` / `.quant.s`). The instance name is the
//!   naming grammar's (`tessera_dsl::naming`); the variant is appended
//!   because the grammar does not encode it and two variants may share a
//!   tile. Instances with equal names and variants share one file.
//! - `manifest.json` ([`tessera_runtime::manifest::Manifest`]): per entry
//!   the kernel, target, tile, variant, M range, file and FNV-1a 64 hash;
//!   the generator version and template hash once.
//! - `kernels.rs`: `include_str!`/`include_bytes!` of every file (paths
//!   relative to `kernels.rs` itself, so it works from `OUT_DIR` or any
//!   other directory) and a static `KERNELS` table of
//!   [`tessera_runtime::manifest::EmbeddedKernel`].
//!
//! **Tiles and M ranges.** With a tuning record, a shape's winners give
//! the tiles and its breakpoints the ranges (GEMV for `M < m1`, flat GEMM
//! for `m1 ≤ M < m2`, GEMM above). Without one (or for a shape the record
//! lacks on that target) the solver picks each variant's tile for the real
//! `[n, k]` and the ranges are the defaults [`DEFAULT_M1`] and
//! [`DEFAULT_M2`] (the runtime's). A variant a backend has no loop for is
//! served by the next one.
//!
//! **Per-M flat steps.** On CPU targets the runtime runs the flat range
//! with a tile of the real M (ep = M rounded up to the MAC's row unit, the
//! flat tile's hp and lp: the same packed weights), by the rule
//! [`flat_steps_for`] it shares with this generator; so the flat range is
//! written as one entry per step, each with its kernel (M = 3 on an 8-row
//! x86 flat tile runs a 3-row kernel, not 8 rows of which 5 are padding).
//!
//! **Determinism.** Output order is fixed (targets and formats as given,
//! shapes in model order, variants GEMV → GEMM), nothing holds a time or a
//! path of the build machine, and files whose bytes are unchanged are not
//! rewritten (their mtimes stay, so nothing downstream rebuilds). Files a
//! previous manifest listed that are no longer produced are removed.

mod embed;
pub mod targets;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use tessera_codegen::artifact::{Artifact, Variant};
use tessera_codegen::{GENERATOR_VERSION, TEMPLATE_HASH};
use tessera_dsl::library;
use tessera_dsl::models::{LayerShape, ModelDims, ModelError, ModelShapes};
use tessera_dsl::naming::{AttentionBlock, AttentionInstance, MatmulInstance, MatmulTile};
use tessera_runtime::dispatch::{FlatStep, flat_steps_for};
use tessera_runtime::manifest::{
    AttentionEntry, CodeFile, KernelKind, MANIFEST_SCHEMA, MSource, Manifest, ManifestEntry,
    fnv1a64_hex,
};
use tessera_runtime::record::{GeneratorId, RecordError, ShapeEntry, TuningRecord};

pub use targets::{TARGETS, TargetSpec, target_names};

/// The M ranges without a record (GEMV below `DEFAULT_M1`, flat GEMM
/// below `DEFAULT_M2`, GEMM above) are the runtime's, so a manifest's
/// ranges say what a runtime opened on the set will run.
pub use tessera_runtime::dispatch::{DEFAULT_M1, DEFAULT_M2};

/// Name of the manifest file in the output directory.
pub const MANIFEST_FILE: &str = tessera_runtime::manifest::MANIFEST_FILE;
/// Name of the Rust file to `include!`.
pub const KERNELS_RS: &str = "kernels.rs";

/// Which weight shapes to generate for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelSpec {
    /// An embedded model name (`qwen2-1.5b`) or a Hugging Face
    /// `config.json` path.
    Model {
        name_or_config: String,
        /// Also the `lm_head` shape (`[vocab, hidden]`).
        lm_head: bool,
    },
    /// Explicit `[n, k]` shapes under a model name.
    Shapes {
        model: String,
        shapes: Vec<LayerShape>,
    },
}

impl ModelSpec {
    /// An embedded model or config path, without `lm_head`.
    pub fn named(name_or_config: impl Into<String>) -> ModelSpec {
        ModelSpec::Model {
            name_or_config: name_or_config.into(),
            lm_head: false,
        }
    }
}

/// What to generate, and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GenConfig {
    /// Target names (see [`TARGETS`]).
    pub targets: Vec<String>,
    pub model: ModelSpec,
    /// Format names (`w4a8`, `w8a8`, `f16`, … — the `matmul-<format>`
    /// library kernels); empty means each target's default
    /// ([`TargetSpec::default_format`]: W4A8 on CPUs, W4A16 on OpenCL). A
    /// named format a target cannot run is skipped for it with a note; a
    /// target left with no format is an error.
    pub formats: Vec<String>,
    /// A tuning record (`tessera-autotune` output) for tiles and M ranges.
    pub record: Option<PathBuf>,
    pub out_dir: PathBuf,
    /// Print `cargo:rerun-if-changed` for the inputs (set it in `build.rs`).
    pub cargo: bool,
}

impl GenConfig {
    /// Targets and model with the default format, no record, no cargo
    /// lines.
    pub fn new<T: Into<String>>(
        targets: impl IntoIterator<Item = T>,
        model: ModelSpec,
        out_dir: impl Into<PathBuf>,
    ) -> GenConfig {
        GenConfig {
            targets: targets.into_iter().map(Into::into).collect(),
            model,
            formats: Vec::new(),
            record: None,
            out_dir: out_dir.into(),
            cargo: false,
        }
    }
}

/// What a generation did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GenReport {
    /// Manifest entries (target × format × shape × variant served).
    pub entries: usize,
    /// Decode attention entries (target × KV format).
    pub attention: usize,
    /// Distinct kernel files (code only, listings not counted).
    pub kernels: usize,
    /// Files written because they were new or their bytes changed.
    pub written: Vec<PathBuf>,
    /// Files left alone because their bytes were already right.
    pub unchanged: Vec<PathBuf>,
    /// Files of a previous generation that are no longer produced.
    pub removed: Vec<PathBuf>,
    /// Things the user should know (record made by another generator, a
    /// variant served by another, …), in generation order.
    pub notes: Vec<String>,
    /// Inputs whose change should rerun the generation.
    pub inputs: Vec<PathBuf>,
}

/// Why generation failed.
#[derive(Debug, thiserror::Error)]
pub enum GenError {
    #[error("unknown target `{name}`; valid targets: {}", target_names().join(", "))]
    UnknownTarget { name: String },
    #[error("no target given; valid targets: {}", target_names().join(", "))]
    NoTarget,
    #[error("unknown format `{name}`; valid formats: {}", format_names().join(", "))]
    UnknownFormat { name: String },
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("no weight shapes to generate for")]
    NoShapes,
    #[error("tuning record: {0}")]
    Record(#[from] RecordError),
    #[error("{target} cannot generate format {format}: {why}")]
    Unsupported {
        target: String,
        format: String,
        why: String,
    },
    #[error("{target}, format {format}, shape {layer} [{n}, {k}], {variant}: {why}")]
    Emit {
        target: String,
        format: String,
        layer: String,
        n: usize,
        k: usize,
        variant: Variant,
        why: String,
    },
    #[error("{target}, {library}: {why}")]
    Attention {
        target: String,
        library: String,
        why: String,
    },
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
}

/// The formats `gen` accepts: the library's matmul kernels.
pub fn format_names() -> Vec<&'static str> {
    library::names()
        .iter()
        .filter_map(|n| n.strip_prefix("matmul-"))
        .collect()
}

/// The generator these kernels come from.
pub fn generator() -> GeneratorId {
    GeneratorId {
        version: GENERATOR_VERSION.to_string(),
        template_hash: TEMPLATE_HASH.to_string(),
    }
}

/// One file to write.
struct OutFile {
    name: String,
    bytes: Vec<u8>,
}

/// Everything one generation produces, before it touches the disk.
pub(crate) struct Plan {
    manifest: Manifest,
    /// Code and listing files by name (sorted: BTreeMap).
    files: BTreeMap<String, Vec<u8>>,
    notes: Vec<String>,
}

/// Generate every kernel `cfg` asks for into `cfg.out_dir`.
pub fn generate(cfg: &GenConfig) -> Result<GenReport, GenError> {
    let mut inputs = Vec::new();
    if let ModelSpec::Model { name_or_config, .. } = &cfg.model
        && ModelShapes::embedded(name_or_config).is_err()
    {
        inputs.push(PathBuf::from(name_or_config));
    }
    inputs.extend(cfg.record.iter().cloned());
    if cfg.cargo {
        for input in &inputs {
            println!("cargo:rerun-if-changed={}", input.display());
        }
    }
    let plan = plan(cfg)?;
    let mut report = write(&plan, &cfg.out_dir)?;
    report.inputs = inputs;
    Ok(report)
}

/// Emit everything in memory.
pub(crate) fn plan(cfg: &GenConfig) -> Result<Plan, GenError> {
    if cfg.targets.is_empty() {
        return Err(GenError::NoTarget);
    }
    let mut specs: Vec<&'static TargetSpec> = Vec::new();
    for name in &cfg.targets {
        let spec =
            targets::target(name).ok_or_else(|| GenError::UnknownTarget { name: name.clone() })?;
        if !specs.contains(&spec) {
            specs.push(spec);
        }
    }
    let mut formats: Vec<String> = Vec::new();
    for f in &cfg.formats {
        if !format_names().contains(&f.as_str()) {
            return Err(GenError::UnknownFormat { name: f.clone() });
        }
        if !formats.contains(f) {
            formats.push(f.clone());
        }
    }
    let (model, shapes, dims) = match &cfg.model {
        ModelSpec::Model {
            name_or_config,
            lm_head,
        } => {
            let m = ModelShapes::resolve(name_or_config)?;
            let shapes = m.distinct(*lm_head);
            (m.name, shapes, Some(m.dims))
        }
        ModelSpec::Shapes { model, shapes } => (model.clone(), shapes.clone(), None),
    };
    if shapes.is_empty() || shapes.iter().any(|s| s.n == 0 || s.k == 0) {
        return Err(GenError::NoShapes);
    }
    let record = cfg.record.as_deref().map(TuningRecord::load).transpose()?;
    let this_generator = generator();

    let mut entries = Vec::new();
    let mut attention = Vec::new();
    let mut files: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut notes = Vec::new();
    for spec in &specs {
        let target_formats = if formats.is_empty() {
            vec![spec.default_format.to_string()]
        } else {
            formats.clone()
        };
        let mut refused = Vec::new();
        for format in &target_formats {
            let kernel =
                library::get(&format!("matmul-{format}")).map_err(|e| GenError::UnknownFormat {
                    name: format!("{format} ({e})"),
                })?;
            let emitter = match targets::Emitter::new(spec, &kernel) {
                Ok(e) => e,
                Err(why) => {
                    notes.push(format!("{} skips format {format}: {why}", spec.name));
                    refused.push((format.clone(), why));
                    continue;
                }
            };
            // Kept apart until the whole format succeeds, so a refused
            // format leaves nothing behind.
            let mut format_entries = Vec::new();
            let mut format_files = BTreeMap::new();
            let mut format_notes = Vec::new();
            let mut refusal = None;
            for shape in &shapes {
                let recorded = record
                    .as_ref()
                    .and_then(|r| recorded_shape(r, spec.name, format, shape));
                if let Some((generator, _)) = recorded
                    && *generator != this_generator
                {
                    format_notes.push(format!(
                        "{} {format} {}: the record was measured with generator {} ({}); this is {} ({})",
                        spec.name,
                        shape.name,
                        generator.version,
                        generator.template_hash,
                        this_generator.version,
                        this_generator.template_hash
                    ));
                }
                let recorded = recorded.map(|(_, s)| s);
                match shape_entries(
                    &emitter,
                    spec,
                    format,
                    shape,
                    recorded,
                    &mut format_files,
                    &mut format_notes,
                ) {
                    Ok(new) => format_entries.extend(new),
                    Err(ShapeFail::Refused(why)) => {
                        refusal = Some(why);
                        break;
                    }
                    Err(ShapeFail::Error(e)) => return Err(e),
                }
            }
            match refusal {
                Some(why) => {
                    notes.push(format!("{} skips format {format}: {why}", spec.name));
                    refused.push((format.clone(), why));
                }
                None => {
                    entries.extend(format_entries);
                    files.extend(format_files);
                    notes.extend(format_notes);
                }
            }
        }
        if refused.len() == target_formats.len()
            && let Some((format, why)) = refused.pop()
        {
            return Err(GenError::Unsupported {
                target: spec.name.to_string(),
                format,
                why,
            });
        }
        match &dims {
            Some(dims) => attention.extend(attention_entries(spec, dims, &mut files, &mut notes)?),
            None => {
                let note = "explicit weight shapes give no head counts: no attention kernels";
                if !notes.iter().any(|n| n == note) {
                    notes.push(note.to_string());
                }
            }
        }
    }
    Ok(Plan {
        manifest: Manifest {
            schema: MANIFEST_SCHEMA,
            generator: this_generator,
            model,
            entries,
            attention,
        },
        files,
        notes,
    })
}

/// The record's entry for this target, format and shape: the first device
/// entry (in file order) for the format whose shape `[n, k]` has a winner
/// on the target.
fn recorded_shape<'r>(
    record: &'r TuningRecord,
    target: &str,
    format: &str,
    shape: &LayerShape,
) -> Option<(&'r GeneratorId, &'r ShapeEntry)> {
    record
        .entries
        .iter()
        .filter(|e| e.format == format)
        .find_map(|e| {
            e.shape(shape.n, shape.k)
                .filter(|s| s.winners.iter().any(|w| w.target == target))
                .map(|s| (&e.generator, s))
        })
}

/// The M range of each variant: GEMV `[1, m1)`, flat GEMM `[m1, m2)`,
/// GEMM `[m2, ∞)`; empty ranges (m1 = 1, or m1 = m2) are dropped.
fn ranges(m1: usize, m2: usize) -> Vec<(Variant, usize, Option<usize>)> {
    let m1 = m1.max(1);
    let m2 = m2.max(m1);
    let mut out = Vec::new();
    if m1 > 1 {
        out.push((Variant::Gemv, 1, Some(m1 - 1)));
    }
    if m2 > m1 {
        out.push((Variant::FlatGemm, m1, Some(m2 - 1)));
    }
    out.push((Variant::Gemm, m2, None));
    out
}

/// Why one shape produced nothing.
enum ShapeFail {
    /// The backend refuses the format: skip it on this target.
    Refused(String),
    Error(GenError),
}

/// Emit the variants of one shape and return their manifest entries.
fn shape_entries(
    emitter: &targets::Emitter,
    spec: &TargetSpec,
    format: &str,
    shape: &LayerShape,
    recorded: Option<&ShapeEntry>,
    files: &mut BTreeMap<String, Vec<u8>>,
    notes: &mut Vec<String>,
) -> Result<Vec<ManifestEntry>, ShapeFail> {
    let (m1, m2, m_source) = match recorded {
        Some(s) => (s.m1, s.m2, MSource::Record),
        None => (DEFAULT_M1, DEFAULT_M2, MSource::Solver),
    };
    let fail = |variant: Variant, why: String| GenError::Emit {
        target: spec.name.to_string(),
        format: format.to_string(),
        layer: shape.name.clone(),
        n: shape.n,
        k: shape.k,
        variant,
        why,
    };
    // Emit each variant that has a range; one the backend lacks hands its
    // range to the next (GEMM to the previous).
    let wanted = ranges(m1, m2);
    // (variant, m_min, m_max, instance, whether the tile is the record's)
    let mut emitted: Vec<(Variant, usize, Option<usize>, targets::Instance, bool)> = Vec::new();
    let mut pending: Option<(usize, Option<usize>)> = None;
    for (variant, lo, hi) in wanted {
        let want = recorded
            .and_then(|s| s.winner(variant))
            .filter(|w| w.target == spec.name)
            .map(|w| w.tile);
        let result = match emitter.emit(shape.n, shape.k, variant, want) {
            Err(targets::EmitFail::Other(why)) if want.is_some() => {
                notes.push(format!(
                    "{} {format} {} {variant}: recorded tile not usable ({why}); using the solver's",
                    spec.name, shape.name
                ));
                emitter.emit(shape.n, shape.k, variant, None)
            }
            other => other,
        };
        let lo = pending.map_or(lo, |(plo, _)| plo);
        match result {
            Ok(instance) => {
                let from_record = want == Some(instance.tile);
                emitted.push((variant, lo, hi, instance, from_record));
                pending = None;
            }
            Err(targets::EmitFail::VariantUnsupported(_)) => {
                let note = format!(
                    "{} {format}: no {variant} loop; the next variant serves its M range",
                    spec.name
                );
                if !notes.contains(&note) {
                    notes.push(note);
                }
                pending = Some((lo, hi));
            }
            Err(targets::EmitFail::Other(why)) => return Err(ShapeFail::Error(fail(variant, why))),
            Err(targets::EmitFail::FormatUnsupported(why)) => return Err(ShapeFail::Refused(why)),
        }
    }
    if let Some((_, hi)) = pending {
        // The last variant (GEMM) was unsupported: the previous one runs on.
        match emitted.last_mut() {
            Some(last) => last.2 = hi,
            None => {
                return Err(ShapeFail::Error(fail(
                    Variant::Gemm,
                    "no variant could be emitted".into(),
                )));
            }
        }
    }

    // A Linear holds a packed copy per variant's packing; a flat step
    // may run on any of them.
    let held: Vec<[u32; 3]> = emitted.iter().map(|e| e.3.tile).collect();
    let mut segments = Vec::new();
    for (variant, lo, hi, instance, from_record) in emitted {
        if variant == Variant::FlatGemm && spec.runs_on_cpu() {
            let m2 = hi.map_or(usize::MAX, |h| h + 1);
            let steps = flat_steps_for(
                recorded,
                instance.tile,
                from_record,
                (lo, m2),
                emitter.row_unit(),
                &held,
            );
            segments.extend(flat_segments(
                emitter, spec, format, shape, lo, hi, instance, &steps, notes,
            ));
        } else {
            segments.push((variant, lo, hi, instance));
        }
    }

    let naming_target = spec.name.replace('-', "_");
    let mut out = Vec::new();
    for (variant, m_min, m_max, instance) in segments {
        let [ep, hp, lp] = instance.tile;
        let name =
            MatmulInstance::for_kernel(&instance.kernel, MatmulTile { ep, hp, lp }, &naming_target)
                .map_err(|e| ShapeFail::Error(fail(variant, e.to_string())))?
                .to_string();
        let stem = format!("{name}.{variant}");
        // Equal name and variant mean equal code; the text may still
        // differ in header comments (the solver's cost for this shape), so
        // the first shape's file is kept and shared.
        let mut put = |stem: &str, artifact: Artifact| -> CodeFile {
            let (code, listing) = code_files(stem, spec.ext, artifact);
            let file = code.name.clone();
            let fnv1a64 = fnv1a64_hex(files.entry(code.name).or_insert(code.bytes));
            let listing = listing.map(|l| {
                let n = l.name.clone();
                files.entry(l.name).or_insert(l.bytes);
                n
            });
            CodeFile {
                file,
                listing,
                fnv1a64,
            }
        };
        let code = put(&stem, instance.artifact);
        let quantizer = instance
            .quantizer
            .map(|q| put(&format!("{stem}.quant"), Artifact::Machine(q)));
        out.push(ManifestEntry {
            layer: shape.name.clone(),
            n: shape.n,
            k: shape.k,
            format: format.to_string(),
            target: spec.name.to_string(),
            variant,
            tile: instance.tile,
            m_min,
            m_max,
            m_source,
            kernel: name,
            file: code.file,
            listing: code.listing,
            fnv1a64: code.fnv1a64,
            quantizer,
        });
    }
    Ok(out)
}

/// The flat range `lo..=hi` of one shape split by its per-M steps (as the
/// runtime runs it, [`flat_steps_for`]): M below the first step, and each
/// step whose kernel cannot be emitted (with a note), run the flat tile
/// `base`; each other step its own tile, from its `from_m` to the next
/// step's. Adjacent ranges of one tile are merged.
#[allow(clippy::too_many_arguments)]
fn flat_segments(
    emitter: &targets::Emitter,
    spec: &TargetSpec,
    format: &str,
    shape: &LayerShape,
    lo: usize,
    hi: Option<usize>,
    base: targets::Instance,
    steps: &[FlatStep],
    notes: &mut Vec<String>,
) -> Vec<(Variant, usize, Option<usize>, targets::Instance)> {
    let mut bounds: Vec<(usize, Option<[u32; 3]>)> = vec![(lo, None)];
    for s in steps.iter().filter(|s| hi.is_none_or(|h| s.from_m <= h)) {
        let tile = (s.tile != base.tile).then_some(s.tile);
        if s.from_m <= lo {
            bounds[0].1 = tile;
        } else {
            bounds.push((s.from_m, tile));
        }
    }
    let mut out: Vec<(Variant, usize, Option<usize>, targets::Instance)> = Vec::new();
    for (i, &(from, tile)) in bounds.iter().enumerate() {
        let to = bounds.get(i + 1).map_or(hi, |(next, _)| Some(next - 1));
        let step = tile.and_then(|t| {
            match emitter.emit(shape.n, shape.k, Variant::FlatGemm, Some(t)) {
                Ok(instance) => Some(instance),
                Err(e) => {
                    let why = match e {
                        targets::EmitFail::VariantUnsupported(w)
                        | targets::EmitFail::FormatUnsupported(w)
                        | targets::EmitFail::Other(w) => w,
                    };
                    notes.push(format!(
                        "{} {format} {} flat step {}x{}x{} from M = {from}: {why}; the flat tile serves it",
                        spec.name, shape.name, t[0], t[1], t[2]
                    ));
                    None
                }
            }
        });
        let instance = step.unwrap_or_else(|| base.clone());
        match out.last_mut() {
            Some(last) if last.3.tile == instance.tile => last.2 = to,
            _ => out.push((Variant::FlatGemm, from, to, instance)),
        }
    }
    out
}

/// The attention kernels of one target for the model's heads: decode, one
/// per KV format ([`targets::ATTENTION_KV`]), and where the backend emits
/// a whole causal prefill (x86, NEON) the prefill kernels over the same
/// caches ([`targets::PREFILL_KV`]). A target (or KV format) without them
/// gets a note, not an error; so does a kernel whose head-dim multiple the
/// model's head dim is not.
fn attention_entries(
    spec: &TargetSpec,
    dims: &ModelDims,
    files: &mut BTreeMap<String, Vec<u8>>,
    notes: &mut Vec<String>,
) -> Result<Vec<AttentionEntry>, GenError> {
    let mut out = Vec::new();
    if !targets::has_attention(spec) {
        notes.push(format!(
            "{}: no decode attention kernels (its backend emits none)",
            spec.name
        ));
        return Ok(out);
    }
    let fail = |library: &str, why: String| GenError::Attention {
        target: spec.name.to_string(),
        library: library.to_string(),
        why,
    };
    let head_dim = u32::try_from(dims.head_dim)
        .map_err(|_| fail("attention", format!("head_dim {} too large", dims.head_dim)))?;
    let prefill: &[(&str, &str)] = if targets::has_whole_prefill(spec) {
        targets::PREFILL_KV
    } else {
        &[]
    };
    for &(kv, library_name) in targets::ATTENTION_KV.iter().chain(prefill) {
        let kernel = library::get(library_name).map_err(|e| fail(library_name, e.to_string()))?;
        let instance = match targets::emit_attention(spec, &kernel) {
            Ok(i) => i,
            Err(Ok(why)) => {
                notes.push(format!(
                    "{} has no decode attention ({library_name}): {why}",
                    spec.name
                ));
                continue;
            }
            Err(Err(why)) => return Err(fail(library_name, why)),
        };
        let (head_dim_multiple, prefill_blocks, every_head_state) = (
            instance.head_dim_multiple(),
            instance.prefill_blocks().map(|b| [b.rows, b.keys]),
            instance.every_head_state(),
        );
        if !dims.head_dim.is_multiple_of(head_dim_multiple) {
            notes.push(format!(
                "{}: no {library_name}: its code takes head dims that are multiples of {head_dim_multiple}, the model's is {}",
                spec.name, dims.head_dim
            ));
            continue;
        }
        // The code takes every extent at run time; the name carries the
        // model's head dimension, as the grammar asks.
        let name = AttentionInstance::for_kernel(
            &kernel,
            head_dim,
            AttentionBlock {
                tokens: instance.tokens,
                keys: instance.keys,
            },
            &spec.name.replace('-', "_"),
        )
        .map_err(|e| fail(library_name, e.to_string()))?
        .to_string();
        let (code, listing) = code_files(&name, spec.ext, instance.artifact);
        let file = code.name.clone();
        let fnv1a64 = fnv1a64_hex(files.entry(code.name).or_insert(code.bytes));
        let listing = listing.map(|l| {
            let n = l.name.clone();
            files.entry(l.name).or_insert(l.bytes);
            n
        });
        out.push(AttentionEntry {
            kind: KernelKind::Attention,
            library: library_name.to_string(),
            kv: kv.to_string(),
            target: spec.name.to_string(),
            heads: dims.heads,
            kv_heads: dims.kv_heads,
            head_dim: dims.head_dim,
            kernel: name,
            file,
            listing,
            fnv1a64,
            head_dim_multiple,
            prefill_blocks,
            every_head_state,
        });
    }
    Ok(out)
}

/// The code file (and listing, for machine code) of an artifact.
fn code_files(stem: &str, ext: &str, artifact: Artifact) -> (OutFile, Option<OutFile>) {
    match artifact {
        Artifact::Machine(code) => (
            OutFile {
                name: format!("{stem}.{ext}"),
                bytes: code.bytes,
            },
            Some(OutFile {
                name: format!("{stem}.s"),
                bytes: code.listing.into_bytes(),
            }),
        ),
        Artifact::Source { text, .. } => (
            OutFile {
                name: format!("{stem}.{ext}"),
                bytes: text.into_bytes(),
            },
            None,
        ),
    }
}

/// Write `bytes` to `path` unless it already holds exactly them. Returns
/// whether it wrote.
fn write_if_changed(path: &Path, bytes: &[u8]) -> Result<bool, GenError> {
    if std::fs::read(path).is_ok_and(|old| old == bytes) {
        return Ok(false);
    }
    std::fs::write(path, bytes).map_err(|source| GenError::Io {
        path: path.display().to_string(),
        source,
    })?;
    Ok(true)
}

/// Put a plan on disk: code files, `manifest.json`, `kernels.rs`; remove
/// what a previous manifest listed and this one does not.
fn write(plan: &Plan, out_dir: &Path) -> Result<GenReport, GenError> {
    std::fs::create_dir_all(out_dir).map_err(|source| GenError::Io {
        path: out_dir.display().to_string(),
        source,
    })?;
    let manifest_path = out_dir.join(MANIFEST_FILE);
    let previous: Vec<String> = std::fs::read_to_string(&manifest_path)
        .ok()
        .and_then(|text| Manifest::from_json(&text, "previous manifest").ok())
        .map(|m| {
            let attention: Vec<String> = m
                .attention
                .into_iter()
                .flat_map(|a| std::iter::once(a.file).chain(a.listing))
                .collect();
            m.entries
                .into_iter()
                .flat_map(|e| {
                    let q = e
                        .quantizer
                        .into_iter()
                        .flat_map(|q| std::iter::once(q.file).chain(q.listing));
                    std::iter::once(e.file).chain(e.listing).chain(q)
                })
                .chain(attention)
                .collect()
        })
        .unwrap_or_default();

    let mut report = GenReport {
        entries: plan.manifest.entries.len(),
        attention: plan.manifest.attention.len(),
        kernels: {
            let mut files: Vec<&str> = plan
                .manifest
                .entries
                .iter()
                .map(|e| e.file.as_str())
                .chain(plan.manifest.attention.iter().map(|a| a.file.as_str()))
                .collect();
            files.sort_unstable();
            files.dedup();
            files.len()
        },
        notes: plan.notes.clone(),
        ..GenReport::default()
    };
    let mut put = |name: &str, bytes: &[u8]| -> Result<(), GenError> {
        let path = out_dir.join(name);
        if write_if_changed(&path, bytes)? {
            report.written.push(path);
        } else {
            report.unchanged.push(path);
        }
        Ok(())
    };
    for (name, bytes) in &plan.files {
        put(name, bytes)?;
    }
    put(MANIFEST_FILE, plan.manifest.to_json().as_bytes())?;
    put(KERNELS_RS, embed::kernels_rs(&plan.manifest).as_bytes())?;

    let mut stale: Vec<&String> = previous
        .iter()
        .filter(|f| !plan.files.contains_key(*f))
        .collect();
    stale.sort_unstable();
    stale.dedup();
    for name in stale {
        // Only plain file names the manifest could have written.
        if name.contains('/') || name.contains('\\') || name.starts_with('.') {
            continue;
        }
        let path = out_dir.join(name);
        if std::fs::remove_file(&path).is_ok() {
            report.removed.push(path);
        }
    }
    Ok(report)
}

/// The manifest a generation would write, without writing anything.
pub fn manifest(cfg: &GenConfig) -> Result<Manifest, GenError> {
    plan(cfg).map(|p| p.manifest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        /// Whatever the breakpoints (even inverted or zero), every M ≥ 1 is
        /// served by exactly one variant, and that variant is the record's
        /// `ShapeEntry::variant_for` when m1 ≤ m2.
        #[test]
        fn ranges_cover_every_m_once(m1 in 0usize..80, m2 in 0usize..80, m in 1usize..200) {
            let r = ranges(m1, m2);
            let serving: Vec<Variant> = r
                .iter()
                .filter(|(_, lo, hi)| m >= *lo && hi.is_none_or(|h| m <= h))
                .map(|(v, _, _)| *v)
                .collect();
            prop_assert_eq!(serving.len(), 1);
            if 1 <= m1 && m1 <= m2 {
                let shape = ShapeEntry {
                    name: "s".into(),
                    n: 1,
                    k: 1,
                    m1,
                    m2,
                    winners: vec![],
                    measurements: vec![],
                    notes: Default::default(),
                };
                prop_assert_eq!(serving[0], shape.variant_for(m));
            }
        }
    }
}
