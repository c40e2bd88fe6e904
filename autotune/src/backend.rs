//! The backends the tuner can measure on this machine, behind one small
//! trait: solver caps to derive tiles with, a filter for tiles the emitter
//! can index, and loading a kernel instance as a checked [`HostMatmul`].

use std::fmt;
use std::str::FromStr;

use tessera_codegen::artifact::{
    Artifact, Backend, EmitError, MachineCode, PrefillBlocks, Variant,
};
use tessera_codegen::clif::ClifBackend;
use tessera_codegen::host::{HostMatmul, HostTile};
use tessera_codegen::neon::NeonBackend;
use tessera_codegen::target::TargetCaps;
use tessera_codegen::tile::TileConfig;
use tessera_codegen::x86::X86Backend;
use tessera_dsl::ir::{Format, Kernel};
use tessera_runtime::record::PrefetchChoice;

/// A backend name the CLI accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum BackendKind {
    /// Cranelift JIT, 128-bit vectors, any x86-64 or aarch64 host.
    Host,
    /// AVX2 + FMA machine code.
    X86,
    Neon,
    OpenCl,
    Cuda,
}

impl BackendKind {
    pub const ALL: [BackendKind; 5] = [
        BackendKind::Host,
        BackendKind::X86,
        BackendKind::Neon,
        BackendKind::OpenCl,
        BackendKind::Cuda,
    ];

    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Host => "host",
            BackendKind::X86 => "x86",
            BackendKind::Neon => "neon",
            BackendKind::OpenCl => "opencl",
            BackendKind::Cuda => "cuda",
        }
    }

    /// Why this backend cannot tune here, or `None` when it can.
    pub fn unavailable_reason(self) -> Option<String> {
        match self {
            BackendKind::Host => ClifBackend::host().err().map(|e| e.to_string()),
            BackendKind::X86 => X86Backend::detect().err().map(|e| e.to_string()),
            BackendKind::Neon => match NeonBackend::detect() {
                Some(_) => None,
                None => Some(format!(
                    "NEON needs an aarch64 host; this is {}",
                    std::env::consts::ARCH
                )),
            },
            BackendKind::OpenCl => crate::opencl::ClTarget::unavailable_reason(),
            BackendKind::Cuda => Some(cuda_reason()),
        }
    }

    /// Backends that can tune on this machine, best first (the CPU
    /// backends before OpenCL, whose device on a CPU-only machine is PoCL
    /// on the same cores).
    pub fn available() -> Vec<BackendKind> {
        [
            BackendKind::X86,
            BackendKind::Neon,
            BackendKind::Host,
            BackendKind::OpenCl,
        ]
        .into_iter()
        .filter(|b| b.unavailable_reason().is_none())
        .collect()
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A backend name that is not one of [`BackendKind::ALL`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown backend `{0}`; valid backends: host, x86, neon, opencl, cuda")]
pub struct UnknownBackend(pub String);

impl FromStr for BackendKind {
    type Err = UnknownBackend;
    fn from_str(s: &str) -> Result<Self, UnknownBackend> {
        BackendKind::ALL
            .into_iter()
            .find(|b| b.name() == s)
            .ok_or_else(|| UnknownBackend(s.to_string()))
    }
}

/// Why CUDA cannot tune here.
fn cuda_reason() -> String {
    #[cfg(feature = "cuda")]
    {
        match tessera_runtime::cuda::CudaDevice::first() {
            Err(e) => e.to_string(),
            Ok(d) => format!(
                "found {}, but tuning the PTX kernels is not implemented yet (the runtime runs them with the solver's tiles)",
                d.name()
            ),
        }
    }
    #[cfg(not(feature = "cuda"))]
    {
        "this build has no CUDA support (build tessera-autotune with `--features cuda`; it also needs the CUDA driver)".into()
    }
}

/// The matmul formats the CLI accepts and their library kernels.
pub const FORMATS: &[(&str, &str)] = &[
    ("w4a8", "matmul-w4a8"),
    ("w8a8", "matmul-w8a8"),
    ("w4a16", "matmul-w4a16"),
    ("w8a16", "matmul-w8a16"),
    ("e0m4a16", "matmul-e0m4a16"),
    ("f16", "matmul-f16"),
    ("f32", "matmul-f32"),
    ("q4_0", "matmul-q4_0"),
    ("q4_1", "matmul-q4_1"),
    ("q8_0", "matmul-q8_0"),
    ("q4_0a16", "matmul-q4_0a16"),
    ("q4_1a16", "matmul-q4_1a16"),
    ("q8_0a16", "matmul-q8_0a16"),
];

/// The format tuned when `--format` is not given: ggml's Q4_0 blocks
/// (`u4sym:g32:f16`, int8 activations) on the x86 and NEON JITs, which run
/// them and where decode is a read of 4.5 bits per weight (measured
/// against `u4asym:g32`'s 6 in `docs/PERFORMANCE.md`); W4A8 on cranelift,
/// which refuses f16 parameters; on CUDA the same blocks with f16
/// activations (`q4_0a16`: its GEMV 2–8% faster than W4A16's at M = 1 on
/// every Llama2-7B shape, H200); W4A16 on OpenCL (no GPU has timed the
/// alternatives there).
pub fn default_format(kind: BackendKind) -> &'static str {
    match kind {
        BackendKind::Cuda => "q4_0a16",
        BackendKind::OpenCl => "w4a16",
        BackendKind::X86 | BackendKind::Neon => "q4_0",
        _ => "w4a8",
    }
}

/// A format name the CLI does not know.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown format `{0}`; valid formats: q4_0, q4_1, q8_0, w4a8, w8a8, w4a16, w8a16, e0m4a16, q4_0a16, q4_1a16, q8_0a16, f16, f32"
)]
pub struct UnknownFormat(pub String);

/// The library kernel name of a CLI format.
pub fn library_kernel(format: &str) -> Result<&'static str, UnknownFormat> {
    FORMATS
        .iter()
        .find(|(f, _)| *f == format)
        .map(|(_, k)| *k)
        .ok_or_else(|| UnknownFormat(format.to_string()))
}

/// A backend ready to build kernels for timing.
pub trait TuneBackend {
    /// The CLI / record name (`x86`, `host`).
    fn kind(&self) -> BackendKind;
    /// The solver target `kernel`'s `variant` tiles come from: on x86 with
    /// AVX-512, the f32 and W4A8 GEMM is solved on `x86-avx512`.
    fn caps(&self, kernel: &Kernel, variant: Variant) -> &'static TargetCaps;
    /// Whether the emitter can index this tile for `kernel`.
    fn accepts(&self, kernel: &Kernel, tile: &TileConfig) -> bool;
    /// Emit and map `kernel` for `tile` and `variant`.
    fn load(
        &self,
        kernel: &Kernel,
        tile: &TileConfig,
        variant: Variant,
    ) -> Result<HostMatmul, String>;
    /// `kernel` with the weight layout this backend reads fastest (NEON:
    /// `u4sym` codes stored signed, [`tessera_codegen::neon::with_signed_codes`]),
    /// as the runtime's device of this backend packs it.
    fn weight_layout(&self, kernel: &Kernel) -> Result<Kernel, String> {
        Ok(kernel.clone())
    }
    /// Vector width of the MAC path, bits (for the peak-MAC loop).
    /// (The GEMM's: the peak bounds the compute-bound variant.)
    fn vector_bits(&self, kernel: &Kernel) -> u32 {
        self.caps(kernel, Variant::Gemm).register_bits
    }
    /// The whole-prefill attention `kernel` in `blocks`, where this backend
    /// emits one and this CPU runs it (None: the backend has none).
    fn prefill(
        &self,
        kernel: &Kernel,
        blocks: PrefillBlocks,
    ) -> Option<Result<MachineCode, String>> {
        let _ = (kernel, blocks);
        None
    }
    /// The decode attention `kernel` with fp8 values in the CPU's packed
    /// form ([`Self::packed_fp8_form`]; `fp8_values_packed`) or by f32
    /// FMAs, and int8 keys in lanes ([`Self::has_int8_key_lanes`];
    /// `int8_keys_in_lanes`) or in pairs, and for keys in lanes q as int8
    /// blocks (`int8_q`) or i16, where this backend has two forms of
    /// either and this CPU runs them (None: one form of each).
    fn decode_attention(
        &self,
        kernel: &Kernel,
        fp8_values_packed: bool,
        int8_keys_in_lanes: bool,
        int8_q: bool,
    ) -> Option<Result<MachineCode, String>> {
        let _ = (kernel, fp8_values_packed, int8_keys_in_lanes, int8_q);
        None
    }

    /// Whether [`Self::decode_attention`] can score int8 keys in lanes as
    /// well as in pairs.
    fn has_int8_key_lanes(&self) -> bool {
        false
    }

    /// The name of the packed form [`Self::decode_attention`] times
    /// against f32 FMAs (None: it has none).
    fn packed_fp8_form(&self) -> Option<&'static str> {
        None
    }

    /// The weight stream `kernel`'s GEMV and flat loops prefetch (its
    /// record name, [`tessera_runtime::record::PREFETCH_STREAMS`]) and the
    /// prefetches this backend can emit them with and this CPU runs, the
    /// default first; None where it has no such choice.
    fn weight_prefetch_choices(
        &self,
        kernel: &Kernel,
    ) -> Option<(&'static str, Vec<PrefetchChoice>)> {
        let _ = kernel;
        None
    }

    /// This backend with `kernel`'s weight stream prefetched by `choice`
    /// (one of [`Self::weight_prefetch_choices`]).
    fn with_weight_prefetch(
        &self,
        kernel: &Kernel,
        choice: PrefetchChoice,
    ) -> Result<Box<dyn TuneBackend>, String> {
        let _ = choice;
        Err(format!(
            "backend `{}` has no weight prefetch to set for {}",
            self.kind(),
            kernel.name
        ))
    }
}

/// The backend for `kind`, or why it is unavailable (naming those that are).
pub fn open(kind: BackendKind) -> Result<Box<dyn TuneBackend>, String> {
    if let Some(why) = kind.unavailable_reason() {
        let available: Vec<&str> = BackendKind::available().iter().map(|b| b.name()).collect();
        return Err(format!(
            "backend `{kind}` is not available: {why}; available here: {}",
            if available.is_empty() {
                "none".to_string()
            } else {
                available.join(", ")
            }
        ));
    }
    match kind {
        BackendKind::X86 => X86Backend::detect()
            .map(|b| Box::new(X86Tune(b)) as Box<dyn TuneBackend>)
            .map_err(|e| e.to_string()),
        BackendKind::Host => ClifBackend::host()
            .map(|b| Box::new(ClifTune(b)) as Box<dyn TuneBackend>)
            .map_err(|e| e.to_string()),
        BackendKind::Neon => NeonBackend::detect()
            .map(|b| Box::new(NeonTune(b)) as Box<dyn TuneBackend>)
            .ok_or_else(|| "no NEON target detected".to_string()),
        other => Err(format!(
            "backend `{other}` does not time host machine code (it has its own bench)"
        )),
    }
}

/// Emit a variant: the backend's own loop for it when it has one, else its
/// default loop (whose tile — ep = 1 for GEMV, the solver's small-M tile
/// for flat GEMM — is what makes it that variant).
fn emit_variant(
    backend: &dyn Backend,
    kernel: &Kernel,
    tile: &TileConfig,
    variant: Variant,
) -> Result<Artifact, EmitError> {
    match backend.emit_variant(kernel, tile, variant) {
        Err(EmitError::Unsupported { .. }) if variant != Variant::Gemm => {
            backend.emit(kernel, tile)
        }
        other => other,
    }
}

fn needs_quantizer(kernel: &Kernel) -> bool {
    kernel
        .as_matmul()
        .and_then(|m| kernel.tensor(&m.x))
        .is_some_and(|t| t.format == Format::I8Dyn)
}

struct X86Tune(X86Backend);

impl TuneBackend for X86Tune {
    fn kind(&self) -> BackendKind {
        BackendKind::X86
    }
    fn caps(&self, kernel: &Kernel, variant: Variant) -> &'static TargetCaps {
        self.0.target(kernel, variant)
    }
    fn accepts(&self, kernel: &Kernel, tile: &TileConfig) -> bool {
        self.0.emit_code(kernel, tile).is_ok()
    }
    fn load(
        &self,
        kernel: &Kernel,
        tile: &TileConfig,
        variant: Variant,
    ) -> Result<HostMatmul, String> {
        let code = match emit_variant(&self.0, kernel, tile, variant).map_err(|e| e.to_string())? {
            Artifact::Machine(code) => code,
            Artifact::Source { .. } => return Err("x86 emitted source, not machine code".into()),
        };
        let quantizer = self
            .0
            .emit_quantizer(kernel, tile)
            .map_err(|e| e.to_string())?;
        if tessera_codegen::x86::missing_features().is_empty() {
            HostMatmul::new(kernel, HostTile::from(tile), quantizer.as_ref(), &code)
                .map_err(|e| e.to_string())
        } else {
            Err("this CPU cannot run x86-avx2 code".into())
        }
    }
    fn prefill(
        &self,
        kernel: &Kernel,
        blocks: PrefillBlocks,
    ) -> Option<Result<MachineCode, String>> {
        tessera_codegen::x86::missing_features()
            .is_empty()
            .then(|| self.0.attention(kernel, blocks).map_err(|e| e.to_string()))
    }
    fn decode_attention(
        &self,
        kernel: &Kernel,
        fp8_values_packed: bool,
        int8_keys_in_lanes: bool,
        int8_q: bool,
    ) -> Option<Result<MachineCode, String>> {
        (self.packed_fp8_form().is_some() || self.has_int8_key_lanes()).then(|| {
            self.0
                .with_fp8_values_packed(fp8_values_packed)
                .with_int8_keys_in_lanes(int8_keys_in_lanes)
                .with_int8_q_in_lanes(int8_q)
                .attention(kernel, PrefillBlocks::DEFAULT)
                .map_err(|e| e.to_string())
        })
    }

    fn has_int8_key_lanes(&self) -> bool {
        tessera_codegen::x86::missing_features().is_empty() && self.0.has_int8_key_lanes()
    }

    fn packed_fp8_form(&self) -> Option<&'static str> {
        if !tessera_codegen::x86::missing_features().is_empty() {
            return None;
        }
        self.0.packed_fp8_form()
    }

    fn weight_prefetch_choices(
        &self,
        kernel: &Kernel,
    ) -> Option<(&'static str, Vec<PrefetchChoice>)> {
        if !tessera_codegen::x86::missing_features().is_empty() {
            return None;
        }
        let stream = X86Backend::weight_stream(kernel)?;
        let choices = stream
            .choices()
            .iter()
            .copied()
            .map(PrefetchChoice::from_x86);
        Some((stream.name(), choices.collect()))
    }

    fn with_weight_prefetch(
        &self,
        kernel: &Kernel,
        choice: PrefetchChoice,
    ) -> Result<Box<dyn TuneBackend>, String> {
        let stream = X86Backend::weight_stream(kernel)
            .ok_or_else(|| format!("{} streams no weights", kernel.name))?;
        Ok(Box::new(X86Tune(
            self.0.with_weight_prefetch(stream, choice.to_x86()?),
        )))
    }
}

struct ClifTune(ClifBackend);

impl TuneBackend for ClifTune {
    fn kind(&self) -> BackendKind {
        BackendKind::Host
    }
    fn caps(&self, _kernel: &Kernel, _variant: Variant) -> &'static TargetCaps {
        self.0.caps()
    }
    fn accepts(&self, kernel: &Kernel, tile: &TileConfig) -> bool {
        tessera_codegen::clif::matmul::check_tile(kernel, tile).is_ok()
    }
    fn load(
        &self,
        kernel: &Kernel,
        tile: &TileConfig,
        variant: Variant,
    ) -> Result<HostMatmul, String> {
        let code = match emit_variant(&self.0, kernel, tile, variant).map_err(|e| e.to_string())? {
            Artifact::Machine(code) => code,
            Artifact::Source { .. } => {
                return Err("cranelift emitted source, not machine code".into());
            }
        };
        let quantizer = if needs_quantizer(kernel) {
            Some(
                self.0
                    .emit_quantizer(kernel, tile)
                    .map_err(|e| e.to_string())?,
            )
        } else {
            None
        };
        HostMatmul::new(kernel, HostTile::from(tile), quantizer.as_ref(), &code)
            .map_err(|e| e.to_string())
    }
}

/// The NEON JIT kernels (aarch64 hosts: i8mm, dotprod, fp16 or plain
/// NEON, as detected).
struct NeonTune(NeonBackend);

impl TuneBackend for NeonTune {
    fn kind(&self) -> BackendKind {
        BackendKind::Neon
    }
    fn caps(&self, kernel: &Kernel, variant: Variant) -> &'static TargetCaps {
        self.0.target(kernel, variant)
    }
    fn accepts(&self, kernel: &Kernel, tile: &TileConfig) -> bool {
        self.0.plan(kernel, tile).is_ok() && self.0.emit(kernel, tile).is_ok()
    }
    fn weight_layout(&self, kernel: &Kernel) -> Result<Kernel, String> {
        tessera_codegen::neon::with_signed_codes(kernel).map_err(|e| e.to_string())
    }
    fn load(
        &self,
        kernel: &Kernel,
        tile: &TileConfig,
        variant: Variant,
    ) -> Result<HostMatmul, String> {
        let code = match emit_variant(&self.0, kernel, tile, variant).map_err(|e| e.to_string())? {
            Artifact::Machine(code) => code,
            Artifact::Source { .. } => return Err("NEON emitted source, not machine code".into()),
        };
        let quantizer = self.0.quantizer(kernel, tile).map_err(|e| e.to_string())?;
        HostMatmul::new(kernel, HostTile::from(tile), quantizer.as_ref(), &code)
            .map_err(|e| e.to_string())
    }
    fn prefill(
        &self,
        kernel: &Kernel,
        blocks: PrefillBlocks,
    ) -> Option<Result<MachineCode, String>> {
        Some(
            self.0
                .emit_attention_with(kernel, blocks)
                .map_err(|e| e.to_string()),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknowns_list_the_valid_ones() {
        for b in BackendKind::ALL {
            assert_eq!(b.name().parse::<BackendKind>(), Ok(b));
        }
        let e = "tpu".parse::<BackendKind>().unwrap_err().to_string();
        assert!(
            e.contains("unknown backend `tpu`") && e.contains("opencl"),
            "{e}"
        );
        assert_eq!(library_kernel("w4a8"), Ok("matmul-w4a8"));
        assert!(
            library_kernel("q4")
                .unwrap_err()
                .to_string()
                .contains("w8a8")
        );
    }

    #[test]
    fn unavailable_backends_say_what_is_available() {
        let e = open(BackendKind::Cuda).err().unwrap();
        assert!(
            e.contains("not available") && e.contains("available here"),
            "{e}"
        );
        assert!(!BackendKind::available().contains(&BackendKind::Cuda));
    }
}
