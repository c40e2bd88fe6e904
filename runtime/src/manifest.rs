//! Build-time kernel manifests: what `tessera-kernels-gen gen` wrote, so a
//! runtime that cannot JIT (iOS, locked-down Android, GPUs that want source
//! or PTX shipped with the app) can pick a prebuilt kernel by target, format,
//! weight shape and M — and refuse kernels from another generator.
//!
//! Schema (JSON, `schema` = [`MANIFEST_SCHEMA`]):
//!
//! ```text
//! { "schema": 1,
//!   "generator": { "version": "0.1.0", "template_hash": "…" },
//!   "model": "qwen2-1.5b",
//!   "entries": [ { "layer": "qkv", "n": 2048, "k": 1536, "format": "w4a8",
//!                  "target": "opencl", "variant": "gemv", "tile": [1, 8, 8],
//!                  "m_min": 1, "m_max": 1, "m_source": "solver",
//!                  "kernel": "matmul_…_opencl", "file": "matmul_…_opencl.gemv.cl",
//!                  "listing": null, "fnv1a64": "0123456789abcdef",
//!                  "quantizer": null } ] }
//! ```
//!
//! `quantizer` is set for machine-code kernels whose activations are `i8dyn`
//! (W4A8, W8A8): the activation quantizer+packer emitted for the same tile,
//! `{ "file": "….quant.bin", "listing": "….quant.s", "fnv1a64": "…" }`.
//!
//! `attention` (absent when empty, so manifests without it read as before and
//! older readers, which ignore unknown fields, still read new ones) lists the
//! decode attention kernels of the targets that emit them (OpenCL, PTX, host):
//!
//! ```text
//!   "attention": [ { "kind": "attention", "library": "attention-decode-f16",
//!                    "kv": "f16", "target": "opencl", "heads": 12,
//!                    "kv_heads": 2, "head_dim": 128,
//!                    "kernel": "attention_decode_…_opencl",
//!                    "file": "attention_decode_…_opencl.cl", "listing": null,
//!                    "fnv1a64": "…" } ]
//! ```
//!
//! They have no tile and no M range (one query token; the sequence length
//! and head counts are call arguments); `heads`/`kv_heads`/`head_dim` are
//! the model's, which the kernel name's `d<N>` also carries.
//!
//! One entry per (target, format, weight shape, variant); entries with the
//! same kernel share one file. `m_max` is inclusive, `null` for unbounded.
//! `fnv1a64` is FNV-1a 64 over the file's bytes, in lowercase hex: enough to
//! notice a damaged or mismatched file, not a security check.

use serde::{Deserialize, Serialize};
/// Re-exported so generated `kernels.rs` files need only this crate.
pub use tessera_dsl::ir::Variant;

use tessera_codegen::artifact::Arch;

use crate::prebuilt::{PrebuiltKernel, PrebuiltSet};
use crate::record::GeneratorId;

/// The manifest format's version; a different one is refused.
pub const MANIFEST_SCHEMA: u32 = 1;

/// Where an entry's M range came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MSource {
    /// The tuning record's measured breakpoints (m1, m2) for this shape.
    Record,
    /// No record for this shape: the generator's documented defaults.
    Solver,
}

/// One prebuilt kernel serving one M range of one weight shape.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestEntry {
    /// Layer(s) with this shape (`qkv`, `o`, `gate_up`, `down`, joined by `+`).
    pub layer: String,
    pub n: usize,
    pub k: usize,
    /// Quantization format (`w4a8`, `f16`, …).
    pub format: String,
    /// Emit target (`opencl`, `aarch64-i8mm`, `ptx-sm80`, …).
    pub target: String,
    pub variant: Variant,
    /// ep, hp, lp.
    pub tile: [u32; 3],
    /// First M this kernel serves.
    pub m_min: usize,
    /// Last M it serves (inclusive); `None` for no bound.
    pub m_max: Option<usize>,
    pub m_source: MSource,
    /// Instance name (the naming grammar of `tessera_dsl::naming`).
    pub kernel: String,
    /// The code: source (`.cl`, `.ptx`) or machine code (`.bin`), relative
    /// to the manifest's directory.
    pub file: String,
    /// The machine code's listing (`.s`), if any.
    pub listing: Option<String>,
    /// FNV-1a 64 of `file`'s bytes, lowercase hex.
    pub fnv1a64: String,
    /// The activation quantizer an `i8dyn` machine-code kernel needs.
    #[serde(default)]
    pub quantizer: Option<CodeFile>,
}

/// What a manifest entry computes. Matmul entries live in
/// [`Manifest::entries`], attention entries in [`Manifest::attention`]; the
/// kind is written out so each JSON object says what it is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KernelKind {
    #[default]
    Matmul,
    Attention,
}

/// One prebuilt decode attention kernel: no tile, no M range.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttentionEntry {
    /// Always [`KernelKind::Attention`].
    pub kind: KernelKind,
    /// The library kernel (`attention-decode-f16`, `attention-decode-kv8`).
    pub library: String,
    /// The KV cache format the kernel reads: `f16` or `kv8` (int8 keys,
    /// fp8 values).
    pub kv: String,
    pub target: String,
    /// The model's query heads, KV heads and head dimension.
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Instance name (the naming grammar of `tessera_dsl::naming`).
    pub kernel: String,
    /// The code, relative to the manifest's directory.
    pub file: String,
    /// The machine code's listing (`.s`), if any.
    pub listing: Option<String>,
    /// FNV-1a 64 of `file`'s bytes, lowercase hex.
    pub fnv1a64: String,
    /// Head dims the code takes are multiples of this (x86: 8; the NEON
    /// prefill: 4). Absent in older manifests: 1.
    #[serde(default = "one")]
    pub head_dim_multiple: usize,
    /// `[rows, keys]`: the code runs a whole causal prefill call
    /// (`HostAttention::prefill` in one call per thread) in blocks of that
    /// many query rows and keys, which size its scratch. Absent (decode
    /// code, and every entry of older manifests): none.
    #[serde(default)]
    pub prefill_blocks: Option<[u32; 2]>,
    /// Decode code that leaves every head's softmax state, so split calls
    /// take every head (`MachineCode::every_head_state`). Absent in older
    /// manifests: false (split calls take one head each).
    #[serde(default)]
    pub every_head_state: bool,
}

fn one() -> usize {
    1
}

/// A companion code file (machine code with its listing).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CodeFile {
    pub file: String,
    pub listing: Option<String>,
    pub fnv1a64: String,
}

impl ManifestEntry {
    /// Whether this entry serves `m` rows.
    pub fn serves(&self, m: usize) -> bool {
        m >= self.m_min && self.m_max.is_none_or(|max| m <= max)
    }
}

/// A generated kernel set.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub schema: u32,
    pub generator: GeneratorId,
    pub model: String,
    pub entries: Vec<ManifestEntry>,
    /// Decode attention kernels; empty for matmul-only generations.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attention: Vec<AttentionEntry>,
}

/// Why a manifest or one of its files cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("{path}: not a kernel manifest: {source}")]
    Json {
        path: String,
        source: serde_json::Error,
    },
    #[error(
        "manifest schema {found} is not supported (this runtime reads schema {MANIFEST_SCHEMA})"
    )]
    Schema { found: u32 },
    #[error(
        "the prebuilt kernels are stale: they were made by generator {found_version} ({found_hash}), this runtime expects {want_version} ({want_hash}); regenerate them"
    )]
    Stale {
        found_version: String,
        found_hash: String,
        want_version: String,
        want_hash: String,
    },
    #[error(
        "kernel file {file} does not match the manifest (FNV-1a 64 {found}, manifest says {want})"
    )]
    Corrupt {
        file: String,
        found: String,
        want: String,
    },
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: {why}")]
    Unusable { path: String, why: String },
}

/// FNV-1a 64 of `bytes`, lowercase hex: the manifest's content hash.
pub fn fnv1a64_hex(bytes: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

fn verify_hash(file: &str, want: &str, bytes: &[u8]) -> Result<(), ManifestError> {
    let found = fnv1a64_hex(bytes);
    if found == want {
        Ok(())
    } else {
        Err(ManifestError::Corrupt {
            file: file.to_string(),
            found,
            want: want.to_string(),
        })
    }
}

impl Manifest {
    /// Parse a manifest; `path` names it in errors.
    pub fn from_json(text: &str, path: &str) -> Result<Manifest, ManifestError> {
        let manifest: Manifest =
            serde_json::from_str(text).map_err(|source| ManifestError::Json {
                path: path.to_string(),
                source,
            })?;
        if manifest.schema != MANIFEST_SCHEMA {
            return Err(ManifestError::Schema {
                found: manifest.schema,
            });
        }
        Ok(manifest)
    }

    /// Pretty JSON with a trailing newline; field and entry order are fixed,
    /// so equal manifests print byte-identically.
    pub fn to_json(&self) -> String {
        // Plain data with string keys: serializing cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default() + "\n"
    }

    /// Refuse kernels made by another generator (version or templates):
    /// their code or calling convention may differ from what this runtime
    /// binds.
    pub fn check(&self, generator: &GeneratorId) -> Result<(), ManifestError> {
        if self.generator == *generator {
            Ok(())
        } else {
            Err(ManifestError::Stale {
                found_version: self.generator.version.clone(),
                found_hash: self.generator.template_hash.clone(),
                want_version: generator.version.clone(),
                want_hash: generator.template_hash.clone(),
            })
        }
    }

    /// The kernel for `m` rows of weight shape `[n, k]` on `target` in
    /// `format`.
    pub fn lookup(
        &self,
        target: &str,
        format: &str,
        n: usize,
        k: usize,
        m: usize,
    ) -> Option<&ManifestEntry> {
        self.entries.iter().find(|e| {
            e.target == target && e.format == format && e.n == n && e.k == k && e.serves(m)
        })
    }

    /// The decode attention kernel on `target` for a `kv` cache (`f16`,
    /// `kv8`).
    pub fn lookup_attention(&self, target: &str, kv: &str) -> Option<&AttentionEntry> {
        self.attention
            .iter()
            .find(|e| e.target == target && e.kv == kv && e.prefill_blocks.is_none())
    }

    /// The whole-prefill attention kernel on `target` for a `kv` cache,
    /// where the target has one (x86, NEON).
    pub fn lookup_prefill(&self, target: &str, kv: &str) -> Option<&AttentionEntry> {
        self.attention
            .iter()
            .find(|e| e.target == target && e.kv == kv && e.prefill_blocks.is_some())
    }

    /// Check an attention kernel's bytes against its entry's hash.
    pub fn verify_attention(entry: &AttentionEntry, bytes: &[u8]) -> Result<(), ManifestError> {
        verify_hash(&entry.file, &entry.fnv1a64, bytes)
    }

    /// Check a file's bytes against its entry's hash.
    pub fn verify(entry: &ManifestEntry, bytes: &[u8]) -> Result<(), ManifestError> {
        verify_hash(&entry.file, &entry.fnv1a64, bytes)
    }

    /// Check a quantizer file's bytes against its hash.
    pub fn verify_file(file: &CodeFile, bytes: &[u8]) -> Result<(), ManifestError> {
        verify_hash(&file.file, &file.fnv1a64, bytes)
    }
}

/// A kernel embedded in the binary by the `kernels.rs` that
/// `tessera-kernels-gen` writes (`include_bytes!`/`include_str!`), so
/// loading needs no file I/O.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EmbeddedKernel {
    pub kernel: &'static str,
    pub layer: &'static str,
    pub n: usize,
    pub k: usize,
    pub format: &'static str,
    pub target: &'static str,
    pub variant: Variant,
    pub tile: [u32; 3],
    pub m_min: usize,
    /// Inclusive; `usize::MAX` for no bound.
    pub m_max: usize,
    pub code: EmbeddedCode,
    /// `GENERATOR_VERSION` and `TEMPLATE_HASH` of the generator that made it.
    pub generator_version: &'static str,
    pub template_hash: &'static str,
}

/// A decode attention kernel embedded by `kernels.rs` (its `ATTENTION`
/// table, apart from the matmul `KERNELS` so matmul lookups never meet
/// one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EmbeddedAttention {
    pub kernel: &'static str,
    pub library: &'static str,
    /// `f16` or `kv8`.
    pub kv: &'static str,
    pub target: &'static str,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// As [`AttentionEntry::head_dim_multiple`].
    pub head_dim_multiple: usize,
    /// As [`AttentionEntry::prefill_blocks`].
    pub prefill_blocks: Option<[u32; 2]>,
    /// As [`AttentionEntry::every_head_state`].
    pub every_head_state: bool,
    /// OpenCL C source, or host machine code
    /// ([`crate::manifest::EmbeddedCode::Machine`], no quantizer).
    pub code: EmbeddedCode,
    pub generator_version: &'static str,
    pub template_hash: &'static str,
}

impl EmbeddedAttention {
    /// Refuse a kernel made by another generator (see [`Manifest::check`]).
    pub fn check(&self, generator: &GeneratorId) -> Result<(), ManifestError> {
        check_embedded(self.generator_version, self.template_hash, generator)
    }

    /// The embedded decode attention kernel on `target` for a `kv` cache.
    pub fn find<'a>(
        table: &'a [EmbeddedAttention],
        target: &str,
        kv: &str,
    ) -> Option<&'a EmbeddedAttention> {
        table
            .iter()
            .find(|e| e.target == target && e.kv == kv && e.prefill_blocks.is_none())
    }
}

fn check_embedded(
    version: &str,
    template_hash: &str,
    generator: &GeneratorId,
) -> Result<(), ManifestError> {
    if version == generator.version && template_hash == generator.template_hash {
        Ok(())
    } else {
        Err(ManifestError::Stale {
            found_version: version.to_string(),
            found_hash: template_hash.to_string(),
            want_version: generator.version.clone(),
            want_hash: generator.template_hash.clone(),
        })
    }
}

/// An embedded kernel's code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EmbeddedCode {
    /// OpenCL C or PTX text.
    Source(&'static str),
    /// Position-independent machine code (entry at offset 0), its listing,
    /// and the activation quantizer of `i8dyn` kernels.
    Machine {
        bytes: &'static [u8],
        listing: &'static str,
        quantizer: Option<&'static [u8]>,
    },
}

impl EmbeddedKernel {
    /// Whether this kernel serves `m` rows.
    pub fn serves(&self, m: usize) -> bool {
        m >= self.m_min && m <= self.m_max
    }

    /// Refuse a kernel made by another generator (see [`Manifest::check`]).
    pub fn check(&self, generator: &GeneratorId) -> Result<(), ManifestError> {
        check_embedded(self.generator_version, self.template_hash, generator)
    }

    /// The machine code's architecture (see [`target_arch`]).
    pub fn arch(&self) -> Option<Arch> {
        target_arch(self.target)
    }

    /// A machine-code kernel as the runtime's [`PrebuiltKernel`] (for
    /// `DeviceOptions::prebuilt`); `None` for source kernels (OpenCL, PTX).
    pub fn to_prebuilt(&self) -> Option<PrebuiltKernel> {
        let EmbeddedCode::Machine {
            bytes, quantizer, ..
        } = self.code
        else {
            return None;
        };
        Some(PrebuiltKernel::matmul(
            &format!("matmul-{}", self.format),
            self.kernel,
            self.variant,
            self.tile,
            self.arch()?,
            bytes.to_vec(),
            quantizer.map(<[u8]>::to_vec),
        ))
    }

    /// Every machine-code kernel of `table` for `target` and `format`, as
    /// a [`PrebuiltSet`] of `generator`. Kernels serving several shapes
    /// appear once per (variant, tile). A variant the target has no loop
    /// for (x86 and cranelift have only GEMM) is served by the kernels of
    /// the next variant (the last by the previous), as the generator's M
    /// ranges say, since the runtime looks kernels up per variant.
    pub fn prebuilt_set(
        table: &[EmbeddedKernel],
        target: &str,
        format: &str,
        generator: GeneratorId,
    ) -> PrebuiltSet {
        let mut set = PrebuiltSet::new(generator);
        let mine: Vec<Candidate> = table
            .iter()
            .filter(|k| k.target == target && k.format == format)
            .filter_map(|k| {
                Some(Candidate {
                    variant: k.variant,
                    n: k.n,
                    k: k.k,
                    m_min: k.m_min,
                    kernel: k.to_prebuilt()?,
                })
            })
            .collect();
        add_format(&mut set, format, mine);
        set
    }

    /// The embedded kernel for `m` rows of `[n, k]` on `target` in `format`.
    pub fn find<'a>(
        table: &'a [EmbeddedKernel],
        target: &str,
        format: &str,
        n: usize,
        k: usize,
        m: usize,
    ) -> Option<&'a EmbeddedKernel> {
        table.iter().find(|e| {
            e.target == target && e.format == format && e.n == n && e.k == k && e.serves(m)
        })
    }
}

/// The machine code architecture of a generator target: `aarch64-*`
/// targets are AArch64, `x86-avx2` x86-64, `host` (cranelift) the machine
/// that ran the generator, taken to be this one (cross builds name their
/// target); `None` for source targets (OpenCL, PTX).
pub fn target_arch(target: &str) -> Option<Arch> {
    match target {
        t if t.starts_with("aarch64-") => Some(Arch::Aarch64),
        "x86-avx2" => Some(Arch::X86_64),
        "host" => Arch::host(),
        _ => None,
    }
}

/// One machine-code matmul kernel of a generated set, with what orders it.
struct Candidate {
    variant: Variant,
    n: usize,
    k: usize,
    m_min: usize,
    kernel: PrebuiltKernel,
}

/// Add one format's kernels to `set`. Kernels serving several shapes
/// appear once per (variant, tile). A variant the target has no loop for
/// (x86 and cranelift have only GEMM) is served by the kernels of the next
/// variant (the last by the previous), as the generator's M ranges say,
/// since the runtime looks kernels up per variant.
fn add_format(set: &mut PrebuiltSet, format: &str, mine: Vec<Candidate>) {
    let name = format!("matmul-{format}");
    // A variant's range may be split into per-M flat steps; the kernel
    // serving the top of each shape's range is the variant's own tile (the
    // runtime takes a prebuilt variant's first tile, and derives the steps
    // from it), so those come first.
    let is_top = |c: &Candidate| {
        !mine
            .iter()
            .any(|o| o.variant == c.variant && o.n == c.n && o.k == c.k && o.m_min > c.m_min)
    };
    let (top, steps): (Vec<&Candidate>, Vec<&Candidate>) = mine.iter().partition(|c| is_top(c));
    for c in top.into_iter().chain(steps) {
        if set.matmul(&name, c.variant, c.kernel.tile).is_none() {
            set.push(c.kernel.clone());
        }
    }
    let has = |set: &PrebuiltSet, v: Variant| !set.matmul_tiles(&name, v).is_empty();
    let all = Variant::ALL;
    for (i, &v) in all.iter().enumerate() {
        if has(set, v) {
            continue;
        }
        let donor = all[i + 1..]
            .iter()
            .chain(all[..i].iter().rev())
            .copied()
            .find(|&d| has(set, d));
        if let Some(d) = donor {
            let copies: Vec<PrebuiltKernel> = set
                .kernels
                .iter()
                .filter(|p| p.kernel == name && p.variant == Some(d))
                .map(|p| PrebuiltKernel {
                    variant: Some(v),
                    ..p.clone()
                })
                .collect();
            for p in copies {
                set.push(p);
            }
        }
    }
}

impl Manifest {
    /// The machine-code kernels of a set `tessera-kernels-gen gen` wrote to
    /// `dir`, for `target` (every format it holds), as a [`PrebuiltSet`] of
    /// `generator`, read at run time: what a caller that cannot compile
    /// `kernels.rs` into its binary (a C engine) passes to
    /// `DeviceOptions::prebuilt`. The manifest must come from this
    /// generator and every file must match its hash.
    pub fn load_prebuilt(
        dir: &std::path::Path,
        target: &str,
        generator: &GeneratorId,
    ) -> Result<PrebuiltSet, ManifestError> {
        let read = |name: &str| {
            let path = dir.join(name);
            std::fs::read(&path).map_err(|source| ManifestError::Io {
                path: path.display().to_string(),
                source,
            })
        };
        let manifest_path = dir.join(MANIFEST_FILE);
        let text = read(MANIFEST_FILE)?;
        let text = String::from_utf8(text).map_err(|e| ManifestError::Unusable {
            path: manifest_path.display().to_string(),
            why: format!("not UTF-8 ({e})"),
        })?;
        let manifest = Manifest::from_json(&text, &manifest_path.display().to_string())?;
        manifest.check(generator)?;
        let Some(arch) = target_arch(target) else {
            return Err(ManifestError::Unusable {
                path: manifest_path.display().to_string(),
                why: format!("target `{target}` has no machine code to load"),
            });
        };
        let mut formats: Vec<&str> = manifest
            .entries
            .iter()
            .filter(|e| e.target == target)
            .map(|e| e.format.as_str())
            .collect();
        formats.sort_unstable();
        formats.dedup();
        if formats.is_empty() {
            return Err(ManifestError::Unusable {
                path: manifest_path.display().to_string(),
                why: format!("no kernels for target `{target}`"),
            });
        }
        let mut set = PrebuiltSet::new(generator.clone());
        for format in formats {
            let mut mine = Vec::new();
            for e in manifest
                .entries
                .iter()
                .filter(|e| e.target == target && e.format == format)
            {
                let bytes = read(&e.file)?;
                Manifest::verify(e, &bytes)?;
                let quantizer = match &e.quantizer {
                    Some(q) => {
                        let qb = read(&q.file)?;
                        Manifest::verify_file(q, &qb)?;
                        Some(qb)
                    }
                    None => None,
                };
                mine.push(Candidate {
                    variant: e.variant,
                    n: e.n,
                    k: e.k,
                    m_min: e.m_min,
                    kernel: PrebuiltKernel::matmul(
                        &format!("matmul-{format}"),
                        &e.kernel,
                        e.variant,
                        e.tile,
                        arch,
                        bytes,
                        quantizer,
                    ),
                });
            }
            add_format(&mut set, format, mine);
        }
        Ok(set)
    }
}

/// The manifest's file name in a generated directory.
pub const MANIFEST_FILE: &str = "manifest.json";

#[cfg(test)]
mod tests {
    use super::*;

    fn generator(hash: &str) -> GeneratorId {
        GeneratorId {
            version: "0.1.0".into(),
            template_hash: hash.into(),
        }
    }

    fn entry(variant: Variant, m_min: usize, m_max: Option<usize>) -> ManifestEntry {
        ManifestEntry {
            layer: "o".into(),
            n: 1536,
            k: 1536,
            format: "w4a8".into(),
            target: "opencl".into(),
            variant,
            tile: [1, 8, 8],
            m_min,
            m_max,
            m_source: MSource::Solver,
            kernel: "matmul_x".into(),
            file: "matmul_x.cl".into(),
            listing: None,
            fnv1a64: fnv1a64_hex(b"abc"),
            quantizer: None,
        }
    }

    fn manifest(hash: &str) -> Manifest {
        Manifest {
            schema: MANIFEST_SCHEMA,
            generator: generator(hash),
            model: "m".into(),
            entries: vec![
                entry(Variant::Gemv, 1, Some(1)),
                entry(Variant::FlatGemm, 2, Some(31)),
                entry(Variant::Gemm, 32, None),
            ],
            attention: Vec::new(),
        }
    }

    fn attention_entry(target: &str, kv: &str) -> AttentionEntry {
        AttentionEntry {
            kind: KernelKind::Attention,
            library: format!("attention-decode-{kv}"),
            kv: kv.into(),
            target: target.into(),
            heads: 12,
            kv_heads: 2,
            head_dim: 128,
            kernel: "attention_x".into(),
            file: format!("attention_{kv}.cl"),
            listing: None,
            fnv1a64: fnv1a64_hex(b"attn"),
            head_dim_multiple: 1,
            prefill_blocks: None,
            every_head_state: false,
        }
    }

    #[test]
    fn attention_is_additive_and_looked_up_by_target_and_kv() {
        // A matmul-only manifest prints no `attention` key, so it reads the
        // same as before the field existed.
        let plain = manifest("aa");
        assert!(!plain.to_json().contains("attention"));
        let mut m = plain.clone();
        m.attention = vec![
            attention_entry("opencl", "f16"),
            attention_entry("opencl", "kv8"),
        ];
        let json = m.to_json();
        assert!(json.contains("\"kind\": \"attention\""), "{json}");
        let back = Manifest::from_json(&json, "mem").unwrap();
        assert_eq!(back, m);
        assert!(back.check(&generator("aa")).is_ok());
        // Matmul lookups are untouched by attention entries.
        assert_eq!(
            back.lookup("opencl", "w4a8", 1536, 1536, 1)
                .map(|e| e.variant),
            Some(Variant::Gemv)
        );
        let kv8 = back.lookup_attention("opencl", "kv8").unwrap();
        assert_eq!(kv8.library, "attention-decode-kv8");
        assert!(back.lookup_attention("host", "f16").is_none());
        assert!(Manifest::verify_attention(kv8, b"attn").is_ok());
        assert!(matches!(
            Manifest::verify_attention(kv8, b"attm"),
            Err(ManifestError::Corrupt { .. })
        ));
        // A manifest written before the field existed still parses.
        let old = plain.to_json();
        assert_eq!(Manifest::from_json(&old, "old").unwrap().attention, vec![]);
    }

    #[test]
    fn embedded_attention_is_found_and_checked() {
        let table = [EmbeddedAttention {
            kernel: "attention_x",
            library: "attention-decode-f16",
            kv: "f16",
            target: "host",
            heads: 12,
            kv_heads: 2,
            head_dim: 128,
            head_dim_multiple: 1,
            prefill_blocks: None,
            every_head_state: false,
            code: EmbeddedCode::Machine {
                bytes: &CODE,
                listing: "",
                quantizer: None,
            },
            generator_version: "0.1.0",
            template_hash: "aa",
        }];
        let a = EmbeddedAttention::find(&table, "host", "f16").unwrap();
        assert!(a.check(&generator("aa")).is_ok());
        assert!(matches!(
            a.check(&generator("bb")),
            Err(ManifestError::Stale { .. })
        ));
        assert!(EmbeddedAttention::find(&table, "host", "kv8").is_none());
        assert!(EmbeddedAttention::find(&table, "opencl", "f16").is_none());
    }

    static CODE: [u8; 4] = [1, 2, 3, 4];
    static QUANT: [u8; 2] = [9, 9];

    fn embedded(target: &'static str, variant: Variant, code: EmbeddedCode) -> EmbeddedKernel {
        EmbeddedKernel {
            kernel: "matmul_x",
            layer: "o",
            n: 8,
            k: 8,
            format: "w4a8",
            target,
            variant,
            tile: [2, 8, 8],
            m_min: 1,
            m_max: usize::MAX,
            code,
            generator_version: "0.1.0",
            template_hash: "aa",
        }
    }

    #[test]
    fn embedded_machine_code_becomes_prebuilt_kernels() {
        let machine = EmbeddedCode::Machine {
            bytes: &CODE,
            listing: "",
            quantizer: Some(&QUANT),
        };
        let table = [
            embedded("aarch64-i8mm", Variant::Gemv, machine),
            // Same variant and tile for another shape: one prebuilt kernel.
            embedded("aarch64-i8mm", Variant::Gemv, machine),
            embedded("aarch64-i8mm", Variant::Gemm, machine),
            embedded("opencl", Variant::Gemv, EmbeddedCode::Source("kernel")),
        ];
        let p = table[0].to_prebuilt().unwrap();
        assert_eq!(p.kernel, "matmul-w4a8");
        assert_eq!(p.variant, Some(Variant::Gemv));
        assert_eq!(p.code.arch, Arch::Aarch64);
        assert_eq!(p.code.bytes, CODE);
        assert_eq!(p.quantizer.unwrap().bytes, QUANT);
        assert!(table[3].to_prebuilt().is_none());
        let set = EmbeddedKernel::prebuilt_set(&table, "aarch64-i8mm", "w4a8", generator("aa"));
        // gemv and gemm as generated; flat GEMM served by the GEMM kernel.
        assert_eq!(set.kernels.len(), 3);
        assert_eq!(
            set.matmul_tiles("matmul-w4a8", Variant::FlatGemm),
            vec![[2, 8, 8]]
        );
        assert!(table[0].check(&generator("aa")).is_ok());
        assert!(table[0].check(&generator("bb")).is_err());
        assert_eq!(
            EmbeddedKernel::find(&table, "opencl", "w4a8", 8, 8, 3).map(|k| k.variant),
            Some(Variant::Gemv)
        );
    }

    #[test]
    fn fnv1a64_matches_the_published_vectors() {
        // Test vectors of the FNV reference (Noll): "" and "a".
        assert_eq!(fnv1a64_hex(b""), "cbf29ce484222325");
        assert_eq!(fnv1a64_hex(b"a"), "af63dc4c8601ec8c");
    }

    #[test]
    fn json_round_trip_and_schema_check() {
        let m = manifest("aa");
        assert_eq!(Manifest::from_json(&m.to_json(), "mem").unwrap(), m);
        let future = m.to_json().replace("\"schema\": 1", "\"schema\": 7");
        assert!(matches!(
            Manifest::from_json(&future, "mem"),
            Err(ManifestError::Schema { found: 7 })
        ));
        assert!(matches!(
            Manifest::from_json("[]", "mem"),
            Err(ManifestError::Json { .. })
        ));
    }

    #[test]
    fn check_refuses_another_generator_naming_both() {
        let m = manifest("aa");
        assert!(m.check(&generator("aa")).is_ok());
        let err = m.check(&generator("bb")).unwrap_err().to_string();
        assert!(err.contains("(aa)") && err.contains("(bb)"), "{err}");
        let newer = GeneratorId {
            version: "0.2.0".into(),
            template_hash: "aa".into(),
        };
        assert!(m.check(&newer).is_err());
    }

    #[test]
    fn lookup_dispatches_by_m_and_verify_checks_bytes() {
        let m = manifest("aa");
        let v = |rows| {
            m.lookup("opencl", "w4a8", 1536, 1536, rows)
                .map(|e| e.variant)
        };
        assert_eq!(v(1), Some(Variant::Gemv));
        assert_eq!(v(2), Some(Variant::FlatGemm));
        assert_eq!(v(31), Some(Variant::FlatGemm));
        assert_eq!(v(32), Some(Variant::Gemm));
        assert_eq!(v(100_000), Some(Variant::Gemm));
        assert!(m.lookup("opencl", "w4a8", 1536, 1537, 1).is_none());
        assert!(m.lookup("opencl", "w4a8", 1536, 1536, 0).is_none());
        let e = &m.entries[0];
        assert!(Manifest::verify(e, b"abc").is_ok());
        assert!(matches!(
            Manifest::verify(e, b"abd"),
            Err(ManifestError::Corrupt { .. })
        ));
    }
}
