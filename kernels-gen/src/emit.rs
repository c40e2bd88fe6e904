//! `tessera-kernels-gen emit`: one kernel instance for one target, as its
//! listing (machine-code targets) or source (OpenCL C, PTX).
//!
//! The tile always comes from the solver for the target and variant
//! (`--tile E,H,L` picks another feasible one); tiles an emitter refuses
//! (`BadTile`) are skipped in rank order, as the autotuner does. The header
//! lines (comments in the target's syntax) name the instance and its tile.

use tessera_codegen::artifact::{Artifact, Backend, EmitError, Variant};
use tessera_codegen::clif::ClifBackend;
use tessera_codegen::gpu::with_gpu_weight_layout;
use tessera_codegen::neon::NeonBackend;
use tessera_codegen::opencl::{Fp16Mode, OpenClBackend};
use tessera_codegen::ptx::{PtxBackend, Sm};
use tessera_codegen::tile::{Problem, TileConfig, runnable, solve};
use tessera_codegen::x86::X86Backend;
use tessera_codegen::{TargetCaps, mac_class};
use tessera_dsl::Kernel;
use tessera_kernels_gen::r#gen::targets::has_gpu_weights;

/// The targets `emit` accepts.
pub const TARGETS: &[&str] = &[
    "x86-avx2",
    "x86-avx512",
    "host",
    "aarch64-neon",
    "aarch64-fp16",
    "aarch64-dotprod",
    "aarch64-i8mm",
    "opencl",
    "ptx-sm80",
    "ptx-sm90",
];

/// What the user asked for.
pub struct EmitRequest<'a> {
    pub target: &'a str,
    pub kernel: Kernel,
    pub variant: Variant,
    pub tile: Option<[u32; 3]>,
    pub fp16: Fp16Mode,
    /// Head dim of an OpenCL prefill program (its code is specialised).
    pub head_dim: usize,
}

/// The result: printable text, and machine code bytes where there are any.
pub struct Emitted {
    pub text: String,
    pub bytes: Option<Vec<u8>>,
}

/// Parse `E,H,L`.
pub fn parse_tile(s: &str) -> Result<[u32; 3], String> {
    let parts: Vec<&str> = s.split(',').map(str::trim).collect();
    let nums: Result<Vec<u32>, _> = parts.iter().map(|p| p.parse::<u32>()).collect();
    match nums {
        Ok(v) if v.len() == 3 && v.iter().all(|&x| x > 0) => Ok([v[0], v[1], v[2]]),
        _ => Err(format!(
            "--tile `{s}`: expected three positive integers E,H,L (ep, hp, lp), e.g. 10,8,8"
        )),
    }
}

/// Representative M for a variant's solve: one row, a padded flat block,
/// or a large GEMM.
fn rows_for(variant: Variant) -> u64 {
    match variant {
        Variant::Gemv => 1,
        Variant::FlatGemm => 8,
        Variant::Gemm => tessera_codegen::tile::REPRESENTATIVE_EXTENT,
    }
}

/// Ranked tiles for `kernel` on `caps` for `variant`, or the one `--tile`
/// names (which must be feasible).
fn tiles_for(
    caps: &TargetCaps,
    kernel: &Kernel,
    variant: Variant,
    want: Option<[u32; 3]>,
) -> Result<Vec<TileConfig>, String> {
    let mut problem = Problem::from_kernel(caps, kernel).map_err(|e| e.to_string())?;
    problem.e = rows_for(variant);
    match want {
        None => solve(caps, &problem).map_err(|e| e.to_string()),
        Some([ep, hp, lp]) => {
            let all = runnable(caps, &problem).map_err(|e| e.to_string())?;
            match all.iter().find(|t| t.ep == ep && t.hp == hp && t.lp == lp) {
                Some(t) => Ok(vec![*t]),
                None => {
                    let some: Vec<String> = all
                        .iter()
                        .take(8)
                        .map(|t| format!("{},{},{}", t.ep, t.hp, t.lp))
                        .collect();
                    Err(format!(
                        "tile {ep},{hp},{lp} is not feasible for {} on {}; feasible tiles include {}",
                        kernel.name,
                        caps.name,
                        some.join(" ")
                    ))
                }
            }
        }
    }
}

/// Emit with the first tile the backend accepts.
fn first_accepted(
    backend: &dyn Backend,
    kernel: &Kernel,
    tiles: &[TileConfig],
    variant: Variant,
) -> Result<(TileConfig, Artifact), String> {
    let mut last = String::from("the solver offered no tile");
    for tile in tiles {
        match backend.emit_variant(kernel, tile, variant) {
            Ok(a) => return Ok((*tile, a)),
            Err(EmitError::BadTile { tile, why }) => last = format!("tile {tile}: {why}"),
            Err(e) => return Err(e.to_string()),
        }
    }
    Err(format!("no solver tile could be emitted ({last})"))
}

fn header(
    comment: &str,
    target: &str,
    kernel: &Kernel,
    variant: Variant,
    tile: Option<&TileConfig>,
) -> String {
    let mut h = if kernel.as_matmul().is_some() {
        format!("{comment} {} on {target}, variant {variant}\n", kernel.name)
    } else {
        format!("{comment} {} on {target}\n", kernel.name)
    };
    if let Some(t) = tile {
        h.push_str(&format!("{comment} tile {}\n", t.summary()));
    }
    if let Some(w) = kernel
        .as_matmul()
        .and_then(|m| kernel.tensor(&m.w))
        .filter(|w| w.layout.int4_signed_codes)
    {
        h.push_str(&format!(
            "{comment} weights {}: {} layout {}\n",
            w.name, w.format, w.layout
        ));
    }
    h
}

fn machine(artifact: Artifact) -> (String, Option<Vec<u8>>) {
    match artifact {
        Artifact::Machine(code) => (code.listing, Some(code.bytes)),
        Artifact::Source { text, .. } => (text, None),
    }
}

pub fn run(req: EmitRequest<'_>) -> Result<Emitted, String> {
    let EmitRequest {
        target,
        kernel,
        variant,
        tile,
        fp16,
        head_dim,
    } = req;
    let is_matmul = kernel.as_matmul().is_some();
    match target {
        "x86-avx2" | "x86-avx512" | "aarch64-neon" | "aarch64-fp16" | "aarch64-dotprod"
        | "aarch64-i8mm" => {
            let x86 = target.starts_with("x86-");
            // x86-avx512 has the f32 and W4A8 kernels (AVX512-VNNI); the
            // backend says which target a kernel's tiles come from. Any
            // variant can be emitted; the runtime uses them for GEMM.
            let x86_backend = X86Backend {
                vnni: target == "x86-avx512",
                avx512: target == "x86-avx512",
                avx512_vnni: target == "x86-avx512",
                avx512_bf16: false,
                avx512_fp16: false,
                amx: false,
                ..X86Backend::default()
            };
            if target == "x86-avx512"
                && (!is_matmul || x86_backend.target(&kernel, Variant::Gemm).name != target)
            {
                return Err(format!(
                    "{target} emits the f32 and W4A8 matmul kernels only; `{}` runs on x86-avx2",
                    kernel.name
                ));
            }
            if !is_matmul {
                // Attention takes no tile (its loops run over d and s).
                let code = if x86 {
                    tessera_codegen::x86::attention::emit(&kernel)
                } else {
                    NeonBackend::new(target)
                        .map_err(|e| e.to_string())?
                        .emit_attention(&kernel)
                }
                .map_err(|e| e.to_string())?;
                return Ok(Emitted {
                    text: header("//", target, &kernel, variant, None) + &code.listing,
                    bytes: Some(code.bytes),
                });
            }
            // NEON reads `u4sym` weights stored as signed codes (the
            // layout's `signed-codes`); the header says so.
            let kernel = if x86 {
                kernel
            } else {
                tessera_codegen::neon::with_signed_codes(&kernel).map_err(|e| e.to_string())?
            };
            let caps = TargetCaps::by_name(target).map_err(|e| e.to_string())?;
            mac_class(caps, &kernel).map_err(|e| e.to_string())?;
            // NEON i8mm solves its int8 GEMV on aarch64-dotprod.
            let caps = if x86 {
                caps
            } else {
                NeonBackend::new(target)
                    .map_err(|e| e.to_string())?
                    .target(&kernel, variant)
            };
            let tiles = tiles_for(caps, &kernel, variant, tile)?;
            let (chosen, artifact) = if x86 {
                first_accepted(&x86_backend, &kernel, &tiles, variant)?
            } else {
                let neon = NeonBackend::new(target).map_err(|e| e.to_string())?;
                first_accepted(&neon, &kernel, &tiles, variant)?
            };
            let comment = if x86 { "#" } else { "//" };
            let (text, bytes) = machine(artifact);
            Ok(Emitted {
                text: header(comment, target, &kernel, variant, Some(&chosen)) + &text,
                bytes,
            })
        }
        "host" => {
            let backend = ClifBackend::host().map_err(|e| e.to_string())?;
            let matmul_tiles = |k: &Kernel| backend.tiles(k).map_err(|e| e.to_string());
            let (chosen, artifact) = if is_matmul {
                let mut tiles = matmul_tiles(&kernel)?;
                if let Some([ep, hp, lp]) = tile {
                    tiles.retain(|t| t.ep == ep && t.hp == hp && t.lp == lp);
                    if tiles.is_empty() {
                        return Err(format!(
                            "tile {ep},{hp},{lp} is not one the cranelift backend can emit for {}",
                            kernel.name
                        ));
                    }
                }
                let (t, a) = first_accepted(&backend, &kernel, &tiles, Variant::Gemm)?;
                (Some(t), a)
            } else {
                // Attention takes no tile; any solver tile satisfies the trait.
                let any = tessera_dsl::library::get("matmul-f32").map_err(|e| e.to_string())?;
                let t = *matmul_tiles(&any)?
                    .first()
                    .ok_or("the solver offered no tile")?;
                let a = backend.emit(&kernel, &t).map_err(|e| e.to_string())?;
                (None, a)
            };
            let (text, bytes) = machine(artifact);
            Ok(Emitted {
                text: header(";", target, &kernel, variant, chosen.as_ref()) + &text,
                bytes,
            })
        }
        "opencl" => {
            let backend = OpenClBackend::new(fp16);
            if !is_matmul {
                let prefill = kernel
                    .as_attention()
                    .is_some_and(|a| a.kind == tessera_dsl::ir::AttentionKind::Prefill);
                let program = if prefill {
                    backend.prefill_program(&kernel, head_dim)
                } else {
                    backend.attention_program(&kernel)
                }
                .map_err(|e| e.to_string())?;
                return Ok(Emitted {
                    text: header("//", target, &kernel, variant, None) + &program_source(program),
                    bytes: None,
                });
            }
            // The GPU kernels read weights as [l/lp, h, lp] (MNN-LLM 5.1);
            // CPU-layout library kernels are re-laid out by the IR pass.
            let kernel = if has_gpu_weights(&kernel) {
                kernel
            } else {
                with_gpu_weight_layout(&kernel).map_err(|e| e.to_string())?
            };
            let caps = tessera_codegen::opencl::caps();
            let tiles = tiles_for(caps, &kernel, variant, tile)?;
            let (chosen, artifact) = first_accepted(&backend, &kernel, &tiles, variant)?;
            let (text, _) = machine(artifact);
            Ok(Emitted {
                text: header("//", target, &kernel, variant, Some(&chosen)) + &text,
                bytes: None,
            })
        }
        "ptx-sm80" | "ptx-sm90" => {
            let sm = if target == "ptx-sm80" {
                Sm::Sm80
            } else {
                Sm::Sm90
            };
            if !is_matmul {
                // Decode attention: no tile, no variant (the plan comes
                // from the target, as on OpenCL).
                let program = PtxBackend::new(sm)
                    .attention_program(&kernel)
                    .map_err(|e| e.to_string())?;
                return Ok(Emitted {
                    text: header("//", target, &kernel, variant, None) + &program.text,
                    bytes: None,
                });
            }
            let kernel = if has_gpu_weights(&kernel) {
                kernel
            } else {
                with_gpu_weight_layout(&kernel).map_err(|e| e.to_string())?
            };
            let caps = sm.caps();
            let tiles = tiles_for(caps, &kernel, variant, tile)?;
            let (chosen, artifact) =
                first_accepted(&PtxBackend::new(sm), &kernel, &tiles, variant)?;
            let (text, _) = machine(artifact);
            Ok(Emitted {
                text: header("//", target, &kernel, variant, Some(&chosen)) + &text,
                bytes: None,
            })
        }
        other => Err(format!(
            "unknown emit target `{other}`; valid targets: {}",
            TARGETS.join(", ")
        )),
    }
}

fn program_source(program: tessera_codegen::opencl::Program) -> String {
    program.source().to_string()
}
