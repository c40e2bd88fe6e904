//! Prebuilt machine code: what a runtime built without `jit` runs.
//!
//! The kernels-gen step emits each kernel instance ahead of time; the
//! application hands the bytes in as [`PrebuiltKernel`]s (embedded with
//! `include_bytes!` or read from disk) and opens the device with them. The
//! bytes are mapped exactly as the JIT maps freshly emitted code
//! (`tessera_codegen::jit`), checked for architecture, and run through the
//! same checked [`tessera_codegen::host::HostMatmul`] entry points.

use tessera_codegen::artifact::{Arch, MachineCode, PrefillBlocks};
use tessera_dsl::ir::Variant;

use crate::manifest::{EmbeddedAttention, EmbeddedCode, EmbeddedKernel, ManifestError};
use crate::record::GeneratorId;

/// One prebuilt kernel instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrebuiltKernel {
    /// Library kernel name (`matmul-w4a8`, `attention-decode-f16`).
    pub kernel: String,
    /// Full instance name (the naming grammar), for messages.
    pub instance: String,
    /// The matmul variant it implements (None for attention).
    pub variant: Option<Variant>,
    /// ep, hp, lp it was emitted for (ignored for attention).
    pub tile: [u32; 3],
    /// The kernel's machine code (entry at offset 0).
    pub code: MachineCode,
    /// The `i8dyn` activation quantizer emitted for the same tile, when the
    /// kernel's x is `i8dyn`.
    pub quantizer: Option<MachineCode>,
}

impl PrebuiltKernel {
    /// A matmul instance from raw bytes.
    pub fn matmul(
        kernel: &str,
        instance: &str,
        variant: Variant,
        tile: [u32; 3],
        arch: Arch,
        bytes: Vec<u8>,
        quantizer: Option<Vec<u8>>,
    ) -> PrebuiltKernel {
        let code = |bytes| MachineCode {
            arch,
            bytes,
            listing: String::new(),
            head_dim_multiple: 1,
            whole_prefill: None,
            every_head_state: false,
        };
        PrebuiltKernel {
            kernel: kernel.to_string(),
            instance: instance.to_string(),
            variant: Some(variant),
            tile,
            code: code(bytes),
            quantizer: quantizer.map(code),
        }
    }

    /// An attention instance from raw bytes: decode, or a whole prefill in
    /// the blocks `whole_prefill` gives, taking head dims that are
    /// multiples of `head_dim_multiple`, leaving every head's state or not
    /// (as its manifest entry says).
    pub fn attention(
        kernel: &str,
        instance: &str,
        arch: Arch,
        bytes: Vec<u8>,
        head_dim_multiple: usize,
        whole_prefill: Option<PrefillBlocks>,
        every_head_state: bool,
    ) -> PrebuiltKernel {
        PrebuiltKernel {
            kernel: kernel.to_string(),
            instance: instance.to_string(),
            variant: None,
            tile: [0; 3],
            code: MachineCode {
                arch,
                bytes,
                listing: String::new(),
                head_dim_multiple: head_dim_multiple.max(1),
                whole_prefill,
                every_head_state,
            },
            quantizer: None,
        }
    }
}

/// One prebuilt kernel as source text (OpenCL C): what a GPU backend
/// builds instead of generating the program itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrebuiltSource {
    /// The generator's target name (`opencl`).
    pub target: String,
    /// Library kernel name.
    pub kernel: String,
    /// Full instance name, for messages.
    pub instance: String,
    /// The matmul variant (None for attention).
    pub variant: Option<Variant>,
    /// ep, hp, lp (zeros for attention).
    pub tile: [u32; 3],
    pub text: String,
}

/// The prebuilt kernels of one generator (its id must match this build's,
/// like a tuning record's).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrebuiltSet {
    pub generator: GeneratorId,
    /// Host machine code.
    pub kernels: Vec<PrebuiltKernel>,
    /// GPU source text.
    pub sources: Vec<PrebuiltSource>,
}

impl PrebuiltSet {
    pub fn new(generator: GeneratorId) -> PrebuiltSet {
        PrebuiltSet {
            generator,
            kernels: Vec::new(),
            sources: Vec::new(),
        }
    }

    pub fn push(&mut self, kernel: PrebuiltKernel) {
        self.kernels.push(kernel);
    }

    /// The instance of `kernel` for `variant` at `tile`.
    pub fn matmul(
        &self,
        kernel: &str,
        variant: Variant,
        tile: [u32; 3],
    ) -> Option<&PrebuiltKernel> {
        self.kernels
            .iter()
            .find(|p| p.kernel == kernel && p.variant == Some(variant) && p.tile == tile)
    }

    /// Every tile `kernel` was prebuilt at for `variant`, in the set's order
    /// (the generator lists the solver's optimum first).
    pub fn matmul_tiles(&self, kernel: &str, variant: Variant) -> Vec<[u32; 3]> {
        self.kernels
            .iter()
            .filter(|p| p.kernel == kernel && p.variant == Some(variant))
            .map(|p| p.tile)
            .collect()
    }

    pub fn attention(&self, kernel: &str) -> Option<&PrebuiltKernel> {
        self.kernels
            .iter()
            .find(|p| p.kernel == kernel && p.variant.is_none())
    }

    /// The source of `kernel` on `target` (`variant` None for attention).
    pub fn source(
        &self,
        target: &str,
        kernel: &str,
        variant: Option<Variant>,
        tile: [u32; 3],
    ) -> Option<&PrebuiltSource> {
        self.sources.iter().find(|p| {
            p.target == target
                && p.kernel == kernel
                && p.variant == variant
                && (variant.is_none() || p.tile == tile)
        })
    }

    /// Add the decode attention kernels `kernels.rs`'s `ATTENTION` table
    /// holds for `target`: host machine code (`host`, `x86-avx2`,
    /// `aarch64-*`) becomes [`PrebuiltKernel`]s run through
    /// `HostAttention`, OpenCL C becomes [`PrebuiltSource`]s. Entries from
    /// another generator are refused (the error names both). Returns how
    /// many were added; a kernel already in the set is kept.
    pub fn add_attention(
        &mut self,
        table: &[EmbeddedAttention],
        target: &str,
    ) -> Result<usize, ManifestError> {
        let mut added = 0;
        for a in table.iter().filter(|a| a.target == target) {
            a.check(&self.generator)?;
            match a.code {
                EmbeddedCode::Machine { bytes, .. } => {
                    let Some(arch) = target_arch(target) else {
                        continue;
                    };
                    if self.attention(a.library).is_none() {
                        self.push(PrebuiltKernel::attention(
                            a.library,
                            a.kernel,
                            arch,
                            bytes.to_vec(),
                            a.head_dim_multiple,
                            a.prefill_blocks
                                .map(|[rows, keys]| PrefillBlocks { rows, keys }),
                            a.every_head_state,
                        ));
                        added += 1;
                    }
                }
                EmbeddedCode::Source(text) => {
                    if self.source(target, a.library, None, [0; 3]).is_none() {
                        self.sources.push(PrebuiltSource {
                            target: target.to_string(),
                            kernel: a.library.to_string(),
                            instance: a.kernel.to_string(),
                            variant: None,
                            tile: [0; 3],
                            text: text.to_string(),
                        });
                        added += 1;
                    }
                }
            }
        }
        Ok(added)
    }

    /// Add the source-text matmul kernels of `table` for `target` and
    /// `format` (`w4a16`, ...), one per (variant, tile). Refuses kernels
    /// from another generator. Returns how many were added.
    pub fn add_matmul_sources(
        &mut self,
        table: &[EmbeddedKernel],
        target: &str,
        format: &str,
    ) -> Result<usize, ManifestError> {
        let name = format!("matmul-{format}");
        let mut added = 0;
        for k in table
            .iter()
            .filter(|k| k.target == target && k.format == format)
        {
            k.check(&self.generator)?;
            let EmbeddedCode::Source(text) = k.code else {
                continue;
            };
            if self
                .source(target, &name, Some(k.variant), k.tile)
                .is_none()
            {
                self.sources.push(PrebuiltSource {
                    target: target.to_string(),
                    kernel: name.clone(),
                    instance: k.kernel.to_string(),
                    variant: Some(k.variant),
                    tile: k.tile,
                    text: text.to_string(),
                });
                added += 1;
            }
        }
        Ok(added)
    }
}

/// The architecture of a machine-code target's kernels (as
/// [`EmbeddedKernel::arch`] reads it).
fn target_arch(target: &str) -> Option<Arch> {
    match target {
        t if t.starts_with("aarch64-") => Some(Arch::Aarch64),
        "x86-avx2" => Some(Arch::X86_64),
        "host" => Arch::host(),
        _ => None,
    }
}
