//! The targets `gen` writes kernels for, as data: one row per target says
//! which backend emits it, what file its code goes in and its default
//! format. Adding a backend is one row here plus one arm in
//! [`Emitter::new`].

use tessera_codegen::artifact::{
    Artifact, Backend, EmitError, MachineCode, PrefillBlocks, SourceLang, Variant,
};
use tessera_codegen::clif::ClifBackend;
use tessera_codegen::gpu::with_gpu_weight_layout;
use tessera_codegen::neon::NeonBackend;
use tessera_codegen::opencl::{Fp16Mode, OpenClBackend, Program};
use tessera_codegen::ptx::{PtxBackend, Sm};
use tessera_codegen::tile::{Problem, TileConfig, runnable, solve};
use tessera_codegen::x86::X86Backend;
use tessera_codegen::{TargetCaps, mac_class};
use tessera_dsl::interp::ONLINE_BLOCK;
use tessera_dsl::{Format, Kernel};

/// Which backend emits a target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    /// dynasm x86-64 machine code.
    X86,
    /// dynasm AArch64 machine code for one feature level.
    Neon,
    /// Cranelift machine code for the build machine.
    Cranelift,
    /// OpenCL C, weights in the GPU layout, `half` as storage (portable:
    /// devices without `cl_khr_fp16` run it too).
    OpenCl,
    /// PTX text for one SM generation, weights in the GPU layout.
    Ptx(Sm),
}

/// One target `gen` accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TargetSpec {
    pub name: &'static str,
    pub backend: BackendKind,
    /// File extension of the code: `bin` (machine code, with a `.s`
    /// listing beside it), `cl`, `ptx`.
    pub ext: &'static str,
    /// The format generated when none is named: W4A8 where the target has
    /// an int8 MAC path, W4A16 on GPUs (whose plans have no int8 class).
    pub default_format: &'static str,
}

/// Every target `gen` writes, in the order help texts list them.
pub const TARGETS: &[TargetSpec] = &[
    spec("x86-avx2", BackendKind::X86, "bin", "w4a8"),
    spec("host", BackendKind::Cranelift, "bin", "w4a8"),
    spec("aarch64-neon", BackendKind::Neon, "bin", "w4a8"),
    spec("aarch64-fp16", BackendKind::Neon, "bin", "w4a8"),
    spec("aarch64-dotprod", BackendKind::Neon, "bin", "w4a8"),
    spec("aarch64-i8mm", BackendKind::Neon, "bin", "w4a8"),
    spec("opencl", BackendKind::OpenCl, "cl", "w4a16"),
    spec("ptx-sm80", BackendKind::Ptx(Sm::Sm80), "ptx", "w4a16"),
    spec("ptx-sm90", BackendKind::Ptx(Sm::Sm90), "ptx", "w4a16"),
];

const fn spec(
    name: &'static str,
    backend: BackendKind,
    ext: &'static str,
    default_format: &'static str,
) -> TargetSpec {
    TargetSpec {
        name,
        backend,
        ext,
        default_format,
    }
}

impl TargetSpec {
    /// Whether the target's kernels run on the CPU (machine code), where
    /// the flat range runs a tile per M; GPU flat tiles are not per-M.
    pub fn runs_on_cpu(&self) -> bool {
        matches!(
            self.backend,
            BackendKind::X86 | BackendKind::Neon | BackendKind::Cranelift
        )
    }
}

/// The spec of a target name.
pub fn target(name: &str) -> Option<&'static TargetSpec> {
    TARGETS.iter().find(|t| t.name == name)
}

/// Names of every target, for error messages.
pub fn target_names() -> Vec<&'static str> {
    TARGETS.iter().map(|t| t.name).collect()
}

/// One emitted instance.
#[derive(Clone)]
pub struct Instance {
    /// The tile it was emitted with (the one the kernel name encodes).
    pub tile: [u32; 3],
    /// The kernel as emitted (GPU targets re-lay the weights out), for
    /// naming.
    pub kernel: Kernel,
    pub artifact: Artifact,
    /// The `i8dyn` activation quantizer for the same tile (machine-code
    /// targets, integer kernels).
    pub quantizer: Option<MachineCode>,
}

/// Emits the activation quantizer of an `i8dyn` kernel for a tile.
type QuantizerFn = Box<dyn Fn(&Kernel, &TileConfig) -> Result<Option<MachineCode>, EmitError>>;

/// Why one instance could not be emitted.
pub enum EmitFail {
    /// The backend has no loop for this variant: another variant serves
    /// its M range.
    VariantUnsupported(String),
    /// The backend does not take this kernel at all (its formats or
    /// layouts): the format is skipped for this target.
    FormatUnsupported(String),
    /// Anything else: the format cannot run on the target, no tile fits…
    Other(String),
}

/// A backend ready to emit one kernel (one format) for one target.
pub struct Emitter {
    spec: &'static TargetSpec,
    backend: Box<dyn Backend>,
    /// The kernel as this backend takes it.
    kernel: Kernel,
    /// The solver's target description (a recorded or per-M tile is
    /// looked up among its feasible tiles).
    caps: &'static TargetCaps,
    /// The GEMV's target (NEON i8mm: `aarch64-dotprod`).
    gemv_caps: &'static TargetCaps,
    /// Cranelift ranks its own tiles, the same for every shape; `None`:
    /// the solver ranks them per shape.
    fixed_tiles: Option<Vec<TileConfig>>,
    /// Machine-code targets: the activation quantizer emitter.
    quantizer: Option<QuantizerFn>,
}

/// Whether a matmul's weights are already in a GPU layout `[l/lp, h, lp]`
/// (so the GPU backends need no `with_gpu_weight_layout` pass).
pub fn has_gpu_weights(kernel: &Kernel) -> bool {
    tessera_dsl::library::has_gpu_weight_layout(kernel)
}

/// Representative M for a variant's solve: one row, a padded flat block,
/// or a large GEMM (as `emit` and the autotuner use).
fn rows_for(variant: Variant) -> u64 {
    match variant {
        Variant::Gemv => 1,
        Variant::FlatGemm => 8,
        Variant::Gemm => tessera_codegen::tile::REPRESENTATIVE_EXTENT,
    }
}

impl Emitter {
    /// The backend of `spec` for matmul `kernel` (a library kernel in the
    /// CPU layout).
    pub fn new(spec: &'static TargetSpec, kernel: &Kernel) -> Result<Emitter, String> {
        let emitter = |backend: Box<dyn Backend>, kernel: Kernel, caps, quantizer| Emitter {
            spec,
            backend,
            kernel,
            caps,
            gemv_caps: caps,
            fixed_tiles: None,
            quantizer,
        };
        match spec.backend {
            BackendKind::X86 | BackendKind::Neon => {
                let caps = TargetCaps::by_name(spec.name).map_err(|e| e.to_string())?;
                mac_class(caps, kernel).map_err(|e| e.to_string())?;
                let (backend, quantizer): (Box<dyn Backend>, QuantizerFn) =
                    if spec.backend == BackendKind::X86 {
                        let q = X86Backend::default();
                        (
                            Box::new(X86Backend::default()),
                            Box::new(move |k: &Kernel, t: &TileConfig| q.emit_quantizer(k, t)),
                        )
                    } else {
                        let neon = || NeonBackend::new(spec.name).map_err(|e| e.to_string());
                        let q = neon()?;
                        (
                            Box::new(neon()?),
                            Box::new(move |k: &Kernel, t: &TileConfig| q.quantizer(k, t)),
                        )
                    };
                // NEON reads `u4sym` weights stored as signed codes; the
                // runtime's NEON devices pack them so.
                let kernel = if spec.backend == BackendKind::Neon {
                    tessera_codegen::neon::with_signed_codes(kernel).map_err(|e| e.to_string())?
                } else {
                    kernel.clone()
                };
                let mut e = emitter(backend, kernel.clone(), caps, Some(quantizer));
                if spec.backend == BackendKind::Neon {
                    // NEON i8mm solves its int8 GEMV on aarch64-dotprod.
                    e.gemv_caps = NeonBackend::new(spec.name)
                        .map_err(|e| e.to_string())?
                        .target(&kernel, Variant::Gemv);
                }
                Ok(e)
            }
            BackendKind::OpenCl | BackendKind::Ptx(_) => {
                // The GPU kernels read weights as [l/lp, h, lp] (MNN-LLM
                // 5.1); CPU-layout library kernels are re-laid out by the IR
                // pass.
                let gpu = if has_gpu_weights(kernel) {
                    kernel.clone()
                } else {
                    with_gpu_weight_layout(kernel).map_err(|e| e.to_string())?
                };
                let (backend, caps): (Box<dyn Backend>, _) = match spec.backend {
                    BackendKind::Ptx(sm) => (Box::new(PtxBackend::new(sm)), sm.caps()),
                    _ => (
                        Box::new(OpenClBackend::new(Fp16Mode::Storage)),
                        tessera_codegen::opencl::caps(),
                    ),
                };
                mac_class(caps, &gpu).map_err(|e| e.to_string())?;
                Ok(emitter(backend, gpu, caps, None))
            }
            BackendKind::Cranelift => {
                let backend = ClifBackend::host().map_err(|e| e.to_string())?;
                let caps = backend.caps();
                let fixed_tiles = backend.tiles(kernel).map_err(|e| e.to_string())?;
                let q = ClifBackend::host().map_err(|e| e.to_string())?;
                let quantizer: QuantizerFn = Box::new(move |k: &Kernel, t: &TileConfig| {
                    let i8dyn = k
                        .as_matmul()
                        .and_then(|mm| k.tensor(&mm.x))
                        .is_some_and(|x| x.format == Format::I8Dyn);
                    if i8dyn {
                        q.emit_quantizer(k, t).map(Some)
                    } else {
                        Ok(None)
                    }
                });
                Ok(Emitter {
                    spec,
                    backend: Box::new(backend),
                    kernel: kernel.clone(),
                    caps,
                    gemv_caps: caps,
                    fixed_tiles: Some(fixed_tiles),
                    quantizer: Some(quantizer),
                })
            }
        }
    }

    /// Ranked tiles for weight shape `[n, k]` and `variant`, or exactly
    /// `want` (a record's winner, a per-M flat step) when it is feasible.
    fn tiles(
        &self,
        n: usize,
        k: usize,
        variant: Variant,
        want: Option<[u32; 3]>,
    ) -> Result<Vec<TileConfig>, String> {
        let ranked = |caps: &'static TargetCaps| -> Result<Vec<TileConfig>, String> {
            let mut problem =
                Problem::from_kernel(caps, &self.kernel).map_err(|e| e.to_string())?;
            problem.e = rows_for(variant);
            problem.h = n as u64;
            problem.l = k as u64;
            match want {
                None => solve(caps, &problem),
                Some(_) => runnable(caps, &problem),
            }
            .map_err(|e| e.to_string())
        };
        let mut tiles = match (&self.fixed_tiles, want) {
            (Some(fixed), None) => fixed.clone(),
            _ if variant == Variant::Gemv => {
                let mut t = ranked(self.gemv_caps)?;
                // A record's GEMV tile of the target's own loop (NEON
                // i8mm's smmla GEMV, which the tuner also measures).
                if want.is_some() && self.gemv_caps.name != self.caps.name {
                    t.extend(ranked(self.caps)?);
                }
                t
            }
            _ => ranked(self.caps)?,
        };
        if let Some([ep, hp, lp]) = want {
            tiles.retain(|t| t.ep == ep && t.hp == hp && t.lp == lp);
        }
        Ok(tiles)
    }

    /// Rows of one accumulator unit of this kernel's MAC on the target
    /// ([`tessera_codegen::row_unit`]), for the per-M flat steps.
    pub fn row_unit(&self) -> u32 {
        tessera_codegen::row_unit(self.caps, &self.kernel)
    }

    /// Emit `variant` for weight shape `[n, k]`: the record's tile `want`
    /// if given, else the first solver tile the backend accepts (tiles it
    /// refuses as `BadTile` are skipped in rank order, as the autotuner
    /// does).
    pub fn emit(
        &self,
        n: usize,
        k: usize,
        variant: Variant,
        want: Option<[u32; 3]>,
    ) -> Result<Instance, EmitFail> {
        let tiles = self.tiles(n, k, variant, want).map_err(EmitFail::Other)?;
        let mut last = match want {
            Some([e, h, l]) => format!("the recorded tile {e},{h},{l} is not feasible here"),
            None => "the solver offered no tile".to_string(),
        };
        for tile in &tiles {
            match self.backend.emit_variant(&self.kernel, tile, variant) {
                Ok(artifact) => {
                    let quantizer = match &self.quantizer {
                        Some(q) => q(&self.kernel, tile).map_err(|e| {
                            EmitFail::Other(format!("the activation quantizer: {e}"))
                        })?,
                        None => None,
                    };
                    return Ok(Instance {
                        tile: [tile.ep, tile.hp, tile.lp],
                        kernel: self.kernel.clone(),
                        artifact,
                        quantizer,
                    });
                }
                Err(EmitError::BadTile { tile, why }) => last = format!("tile {tile}: {why}"),
                Err(EmitError::Unsupported { what, .. }) if what.contains("variant") => {
                    return Err(EmitFail::VariantUnsupported(what));
                }
                Err(e @ EmitError::Unsupported { .. }) => {
                    return Err(EmitFail::FormatUnsupported(e.to_string()));
                }
                Err(e) => return Err(EmitFail::Other(e.to_string())),
            }
        }
        Err(EmitFail::Other(format!(
            "{} on {}: no tile could be emitted ({last})",
            self.kernel.name, self.spec.name
        )))
    }
}

/// The KV cache formats `gen` writes decode attention for, with their
/// library kernels. Both, always: the KV format is the runtime's choice
/// (memory against accuracy), not a property of the weights, so a build
/// ships both and the runtime picks.
pub const ATTENTION_KV: &[(&str, &str)] = &[
    ("f16", "attention-decode-f16"),
    ("kv8", "attention-decode-kv8"),
];

/// The prefill kernels over the same caches, shipped where the target's
/// backend emits a whole prefill ([`has_whole_prefill`]).
pub const PREFILL_KV: &[(&str, &str)] = &[
    ("f16", "attention-prefill-f16"),
    ("kv8", "attention-prefill-kv8"),
];

/// One emitted attention kernel.
pub struct AttentionInstance {
    pub artifact: Artifact,
    /// Query tokens (rows) and keys one work unit takes (the split size on
    /// OpenCL and PTX, the online softmax block on the host; a whole
    /// prefill's row and key blocks), for the instance name's block.
    pub tokens: u32,
    pub keys: u32,
}

impl AttentionInstance {
    /// The blocks of host code that runs whole prefill calls.
    pub fn prefill_blocks(&self) -> Option<PrefillBlocks> {
        match &self.artifact {
            Artifact::Machine(code) => code.whole_prefill,
            Artifact::Source { .. } => None,
        }
    }

    /// Whether the decode code leaves every head's softmax state.
    pub fn every_head_state(&self) -> bool {
        match &self.artifact {
            Artifact::Machine(code) => code.every_head_state,
            Artifact::Source { .. } => false,
        }
    }

    /// Head dims the code takes are multiples of this.
    pub fn head_dim_multiple(&self) -> usize {
        match &self.artifact {
            Artifact::Machine(code) => code.head_dim_multiple.max(1),
            Artifact::Source { .. } => 1,
        }
    }
}

/// A machine-code attention instance: a whole prefill's blocks, or one
/// decode token over the online softmax block.
fn host_instance(code: MachineCode) -> AttentionInstance {
    let (tokens, keys) = match code.whole_prefill {
        Some(b) => (b.rows, b.keys),
        None => (1, ONLINE_BLOCK as u32),
    };
    AttentionInstance {
        artifact: Artifact::Machine(code),
        tokens,
        keys,
    }
}

/// Emit decode attention `kernel` for `spec`. `Err(Ok(why))`: the target
/// (or the backend for this KV format) has no decode attention, a note;
/// `Err(Err(why))`: emission failed, an error.
pub fn emit_attention(
    spec: &TargetSpec,
    kernel: &Kernel,
) -> Result<AttentionInstance, Result<String, String>> {
    let refused = |e: EmitError| match e {
        EmitError::Unsupported { .. } => Err(Ok(e.to_string())),
        other => Err(Err(other.to_string())),
    };
    match spec.backend {
        BackendKind::OpenCl => {
            match OpenClBackend::new(Fp16Mode::Storage).attention_program(kernel) {
                Ok(Program::Attention { plan, source }) => Ok(AttentionInstance {
                    tokens: 1,
                    keys: plan.keys_per_split,
                    artifact: Artifact::Source {
                        text: source,
                        lang: SourceLang::OpenClC,
                    },
                }),
                Ok(Program::Matmul { .. } | Program::Prefill { .. }) => {
                    Err(Err("not a decode attention program".into()))
                }
                Err(e) => refused(e),
            }
        }
        BackendKind::Cranelift => {
            let backend = ClifBackend::host().map_err(|e| Err(e.to_string()))?;
            // The attention emitter ignores the tile (the ABI takes every
            // extent at run time); any of cranelift's tiles will do.
            let any = tessera_dsl::library::get("matmul-f32").map_err(|e| Err(e.to_string()))?;
            let tiles = backend.tiles(&any).map_err(|e| Err(e.to_string()))?;
            let tile = tiles
                .first()
                .ok_or_else(|| Err("cranelift offered no tile".to_string()))?;
            match backend.emit(kernel, tile) {
                Ok(artifact) => Ok(AttentionInstance {
                    artifact,
                    tokens: 1,
                    keys: ONLINE_BLOCK as u32,
                }),
                Err(e) => refused(e),
            }
        }
        BackendKind::Ptx(sm) => match PtxBackend::new(sm).attention_program(kernel) {
            Ok(program) => Ok(AttentionInstance {
                tokens: 1,
                keys: program.plan.keys_per_split,
                artifact: Artifact::Source {
                    text: program.text,
                    lang: SourceLang::Ptx,
                },
            }),
            Err(e) => refused(e),
        },
        BackendKind::Neon => {
            let backend = NeonBackend::new(spec.name).map_err(|e| Err(e.to_string()))?;
            backend
                .emit_attention(kernel)
                .map(host_instance)
                .or_else(refused)
        }
        BackendKind::X86 => tessera_codegen::x86::attention::emit(kernel)
            .map(host_instance)
            .or_else(refused),
    }
}

/// Whether `spec`'s backend emits decode attention at all.
pub fn has_attention(spec: &TargetSpec) -> bool {
    matches!(
        spec.backend,
        BackendKind::OpenCl
            | BackendKind::Cranelift
            | BackendKind::Ptx(_)
            | BackendKind::Neon
            | BackendKind::X86
    )
}

/// Whether `spec`'s backend emits a whole causal prefill (machine code the
/// runtime's `HostAttention::prefill` calls once per thread).
pub fn has_whole_prefill(spec: &TargetSpec) -> bool {
    matches!(spec.backend, BackendKind::Neon | BackendKind::X86)
}
