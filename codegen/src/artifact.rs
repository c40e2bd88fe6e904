//! What a backend produces, and the one trait every backend implements.
//!
//! Text backends (OpenCL C, PTX) give source; machine-code backends give
//! [`MachineCode`] (bytes plus a listing). The JIT maps those same bytes
//! executable ([`crate::jit`]): there is never a second code path for the JIT.

use std::fmt;

use tessera_dsl::Kernel;

pub use crate::target::Arch;

impl Arch {
    /// The CPU architecture this process runs on, if Tessera emits machine
    /// code for it.
    pub fn host() -> Option<Arch> {
        if cfg!(target_arch = "x86_64") {
            Some(Arch::X86_64)
        } else if cfg!(target_arch = "aarch64") {
            Some(Arch::Aarch64)
        } else {
            None
        }
    }
}

/// Emitted machine code: position-independent bytes whose entry is offset 0,
/// and a listing (one instruction per line, assembler syntax that `llvm-mc`
/// accepts) taken from the emitter's own instruction log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MachineCode {
    pub arch: Arch,
    pub bytes: Vec<u8>,
    pub listing: String,
    /// Attention code only: the head dims the code handles are multiples
    /// of this (x86's works in whole 8-lane chunks); 1 everywhere else.
    /// `HostAttention` refuses other calls, so the requirement travels
    /// with the bytes rather than with each caller.
    pub head_dim_multiple: usize,
    /// Attention code only: the code computes a whole causal prefill call
    /// (every query token of `AttentionArgs::t`, each K/V block read once
    /// per block of query rows) in these blocks, which size its scratch.
    /// None for the decode loop, which `HostAttention::prefill` calls once
    /// per query token.
    pub whole_prefill: Option<PrefillBlocks>,
    /// Decode attention code only: the code leaves every head's softmax
    /// state where `AttentionArgs::states` points (when not null), so
    /// `HostAttention` may split a call's keys with every head in each
    /// part; without it a split part takes one head. False where bytes
    /// come without saying so (a prebuilt set's).
    pub every_head_state: bool,
}

/// The blocks of a whole causal prefill: query rows kept at once (their q,
/// output accumulators and softmax state) and keys converted at once (K and
/// V as f32). The x86 and NEON emitters take any multiple of their register
/// tiles, so the best blocks for a device can be measured and recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PrefillBlocks {
    pub rows: u32,
    pub keys: u32,
}

impl PrefillBlocks {
    /// What the emitters use unless told otherwise: measured on an AMD Zen 3
    /// (128 keys 1.2× faster than 64 on Qwen2-1.5B heads; 256 slower).
    pub const DEFAULT: PrefillBlocks = PrefillBlocks {
        rows: 96,
        keys: 128,
    };

    /// Whether `backend`'s emitter, whose score tiles hold `tile_rows`
    /// rows and 4 keys, takes these blocks (each at most 4096).
    pub fn check(self, backend: &'static str, tile_rows: u32) -> Result<(), EmitError> {
        let PrefillBlocks { rows, keys } = self;
        if rows == 0 || rows > 4096 || !rows.is_multiple_of(tile_rows) {
            return Err(EmitError::Unsupported {
                backend,
                what: format!(
                    "prefill blocks of {rows} rows (a multiple of {tile_rows}, at most 4096)"
                ),
            });
        }
        if keys == 0 || keys > 4096 || !keys.is_multiple_of(4) {
            return Err(EmitError::Unsupported {
                backend,
                what: format!("prefill blocks of {keys} keys (a multiple of 4, at most 4096)"),
            });
        }
        Ok(())
    }
}

impl std::fmt::Display for PrefillBlocks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}x{}", self.rows, self.keys)
    }
}

/// The source language of a text artifact.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SourceLang {
    OpenClC,
    Ptx,
    /// Cranelift IR text (the portable JIT's listing).
    Clif,
}

/// What `Backend::emit` returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Artifact {
    Source { lang: SourceLang, text: String },
    Machine(MachineCode),
}

impl fmt::Display for Artifact {
    /// The listing or the source: what snapshot tests pin.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Artifact::Source { text, .. } => f.write_str(text),
            Artifact::Machine(code) => f.write_str(&code.listing),
        }
    }
}

/// Refuse, naming the field, a matmul whose weights store `u4sym` codes
/// as q − 8 (the layout's `signed-codes`) on `backend`, whose loops read
/// the codes unsigned (`why`). Only NEON reads signed codes.
pub(crate) fn unsigned_codes_only(
    kernel: &Kernel,
    backend: &'static str,
    why: &str,
) -> Result<(), EmitError> {
    let signed = kernel.as_matmul().is_some_and(|mm| {
        kernel
            .tensor(&mm.w)
            .is_some_and(|t| t.layout.int4_signed_codes)
    });
    if signed {
        return Err(EmitError::Unsupported {
            backend,
            what: format!(
                "kernel `{}`: weights with signed-codes (layout field int4_signed_codes): {why}",
                kernel.name
            ),
        });
    }
    Ok(())
}

/// Why a kernel could not be emitted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EmitError {
    #[error("backend {backend} does not support {what}")]
    Unsupported { backend: &'static str, what: String },
    #[error("tile {tile} is not valid for this kernel: {why}")]
    BadTile { tile: String, why: String },
    #[error("assembler failed: {0}")]
    Assembler(String),
}

pub use tessera_dsl::ir::Variant;

/// Every backend: kernel plus tile in, artifact out.
pub trait Backend {
    /// The target name the CLI accepts.
    fn name(&self) -> &'static str;

    /// The backend's default instance of `kernel` for `tile`.
    fn emit(&self, kernel: &Kernel, tile: &crate::tile::TileConfig) -> Result<Artifact, EmitError>;

    /// A specific matmul variant. Backends that emit distinct loops per
    /// variant override this; the default only knows the default loop.
    fn emit_variant(
        &self,
        kernel: &Kernel,
        tile: &crate::tile::TileConfig,
        variant: Variant,
    ) -> Result<Artifact, EmitError> {
        match variant {
            Variant::Gemm => self.emit(kernel, tile),
            other => Err(EmitError::Unsupported {
                backend: self.name(),
                what: format!("the {other} variant"),
            }),
        }
    }
}
