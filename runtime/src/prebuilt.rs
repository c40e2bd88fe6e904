//! Prebuilt machine code: what a runtime built without `jit` runs.
//!
//! The kernels-gen step emits each kernel instance ahead of time; the
//! application hands the bytes in as [`PrebuiltKernel`]s (embedded with
//! `include_bytes!` or read from disk) and opens the device with them. The
//! bytes are mapped exactly as the JIT maps freshly emitted code
//! (`tessera_codegen::jit`), checked for architecture, and run through the
//! same checked [`tessera_codegen::host::HostMatmul`] entry points.

use tessera_codegen::artifact::{Arch, MachineCode};
use tessera_dsl::ir::Variant;

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

    /// A decode attention instance from raw bytes.
    pub fn attention(kernel: &str, instance: &str, arch: Arch, bytes: Vec<u8>) -> PrebuiltKernel {
        PrebuiltKernel {
            kernel: kernel.to_string(),
            instance: instance.to_string(),
            variant: None,
            tile: [0; 3],
            code: MachineCode {
                arch,
                bytes,
                listing: String::new(),
            },
            quantizer: None,
        }
    }
}

/// The prebuilt kernels of one generator (its id must match this build's,
/// like a tuning record's).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrebuiltSet {
    pub generator: GeneratorId,
    pub kernels: Vec<PrebuiltKernel>,
}

impl PrebuiltSet {
    pub fn new(generator: GeneratorId) -> PrebuiltSet {
        PrebuiltSet {
            generator,
            kernels: Vec::new(),
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
}
