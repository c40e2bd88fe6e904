//! The x86-64 AVX2/FMA backend (`x86-avx2`).
//!
//! One emitter per kernel family writes machine code through [`asm::X86Asm`],
//! which logs the listing as it encodes, so the bytes the JIT maps and the
//! listing a snapshot pins come from the same calls:
//!
//! - [`float`]: f32 / f16 weights and activations (`vfmadd231ps`, f16 via
//!   `vcvtph2ps` / `vcvtps2ph`): GEMM with K blocking, and a separate GEMV
//!   loop for one row; one loop nest for ymm and zmm, the register file a
//!   parameter;
//! - [`int8`]: W8A8 (`i8sym:row`) and grouped 4- and 8-bit weights with
//!   `vpmaddubsw` + `vpmaddwd`, or `vpdpbusd` (AVX-VNNI, or AVX512-VNNI's
//!   EVEX form on ymm);
//! - [`quantize`]: the emitted `i8dyn` activation quantizer;
//! - [`avx512`]: f32 × f32 → f32 on zmm (AVX-512F, through the [`evex`]
//!   encoder), the [`float`] nest's zmm front-end, for tiles solved on
//!   `x86-avx512` when the backend has `avx512` ([`X86Backend::target`]
//!   names the target per kernel).
//!
//! Every kernel is `extern "C" fn(*const MatmulArgs)` (or `QuantizeArgs`),
//! see [`crate::abi`]. Tiles come from the solver ([`crate::tile`]); each
//! family's register plan ([`plan`]) is checked against the solver's
//! accounting for that tile before anything is emitted.
//!
//! Run-time detection: [`X86Backend::detect`] checks AVX2, FMA and F16C (and
//! AVX-VNNI or AVX512-VNNI, which switch the int8 MAC). Emitting works on any host; only
//! [`X86Backend::load`] refuses to map code the CPU cannot run (SSE-only
//! hosts use the cranelift backend).

pub mod amx;
pub mod asm;
pub mod attention;
mod attention_prefill;
pub mod avx512;
pub mod avx512_int8;
mod common;
pub mod evex;
pub mod float;
pub mod int8;
pub mod plan;
pub mod prefetch;
pub mod quantize;
mod regfile;

use tessera_dsl::ir::{Format, Group, Kernel, Matmul, ParamType};

use crate::artifact::{Arch, Artifact, Backend, EmitError, MachineCode, PrefillBlocks, Variant};
use crate::host::{HostError, HostMatmul, HostTile};
use crate::target::TargetCaps;
use crate::tile::TileConfig;
pub use prefetch::{PrefetchLevel, WeightPrefetch, WeightStream};

/// The backend's target name.
pub const NAME: &str = "x86-avx2";

/// The target of the AVX-512 f32 kernel's tiles ([`avx512`]).
pub const AVX512_NAME: &str = "x86-avx512";

/// Longest 4-bit group the AVX2 int8 kernel takes: one group is one
/// unrolled block of g/4 steps.
pub const MAX_INT4_GROUP: u32 = 128;

/// The x86-64 AVX2 backend. `vnni` selects `vpdpbusd` for the int8 kernels
/// (AVX-VNNI); `avx512` runs f32 matmuls given an `x86-avx512` tile on the
/// AVX-512 kernel ([`X86Backend::target`] says which target to solve on).
/// [`X86Backend::default`] emits plain AVX2 so its output is the same on
/// every host, [`X86Backend::detect`] matches this CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct X86Backend {
    /// AVX-VNNI (VEX `vpdpbusd` on ymm) for the AVX2 int8 kernels.
    pub vnni: bool,
    pub avx512: bool,
    /// AVX512-VNNI (EVEX `vpdpbusd`, with AVX512BW/VL) for the AVX-512 W4A8
    /// GEMM, and on ymm for the AVX2 int8 kernels when `vnni` is off: Zen 4
    /// and Ice Lake have it without AVX-VNNI.
    pub avx512_vnni: bool,
    /// AVX512_BF16 with AVX512_VBMI (and BW/VL): the decode attention's P·V
    /// of fp8 values by `vdpbf16ps` (Zen 4, Sapphire Rapids; not Ice Lake
    /// or Zen 3).
    pub avx512_bf16: bool,
    /// AVX512-FP16 (with BW/VL): the decode attention's P·V of fp8 values
    /// by `vfmadd231ph` (Sapphire Rapids and later Intel Xeons; not Zen 4).
    /// It takes precedence over `avx512_bf16`: on the CPUs that have both,
    /// `vdpbf16ps` issues at about a quarter of the FMA rate.
    pub avx512_fp16: bool,
    /// AMX-INT8, with Linux's permission to use the tile state
    /// ([`amx::request_tile_data`]): the decode attention scores int8 keys
    /// of several-head tiles by tile products (Sapphire Rapids and later
    /// Intel Xeons; not Zen 4). It needs `avx512_vnni` too.
    pub amx: bool,
    /// With `avx512_vnni` and without `amx`: the decode attention scores
    /// int8 keys of 4- to 7-head tiles 16 at a time with a key in each
    /// dword lane ([`attention::DecodeIsa::lane_scores`]) rather than two
    /// at a time along d. On by [`Self::detect`]; a tuning record may turn
    /// it off where the pair loop measured faster
    /// ([`Self::with_int8_keys_in_lanes`]).
    pub int8_keys_in_lanes: bool,
    /// With the lanes loop: q rounded to int8 in 32-d blocks for it
    /// ([`attention::DecodeIsa::lane_int8_q`]), an accuracy trade (as
    /// ggml's Q8_0 q) off unless a tuning record turns it on where it
    /// measured faster ([`Self::with_int8_q_in_lanes`]).
    pub int8_q_in_lanes: bool,
    /// How the int8 kernels' GEMV and flat loops prefetch the weight
    /// stream: [`WeightPrefetch::INT8`], or a tuning record's choice.
    pub int8_prefetch: WeightPrefetch,
    /// The same for the float kernels (f32 and f16 weights, ymm and zmm):
    /// [`WeightPrefetch::FLOAT`], or a tuning record's choice.
    pub float_prefetch: WeightPrefetch,
}

/// Plain AVX2 (no VNNI, no AVX-512), the default prefetches: the same
/// code on every host.
impl Default for X86Backend {
    fn default() -> X86Backend {
        X86Backend {
            vnni: false,
            avx512: false,
            avx512_vnni: false,
            avx512_bf16: false,
            avx512_fp16: false,
            amx: false,
            int8_keys_in_lanes: false,
            int8_q_in_lanes: false,
            int8_prefetch: WeightPrefetch::INT8,
            float_prefetch: WeightPrefetch::FLOAT,
        }
    }
}

/// Why x86 code cannot run here.
#[derive(Debug, thiserror::Error)]
pub enum X86Error {
    #[error(
        "this CPU lacks {missing}, which the x86-avx2 backend needs; use the cranelift backend (`host`) instead"
    )]
    MissingFeature { missing: String },
    #[error("{0}")]
    Emit(#[from] EmitError),
    #[error("{0}")]
    Host(#[from] HostError),
}

/// The CPU features the x86-avx2 code needs that this host lacks (empty
/// when it can run it; always non-empty off x86-64).
pub fn missing_features() -> Vec<&'static str> {
    #[cfg(target_arch = "x86_64")]
    {
        let mut missing = Vec::new();
        if !std::arch::is_x86_feature_detected!("avx2") {
            missing.push("avx2");
        }
        if !std::arch::is_x86_feature_detected!("fma") {
            missing.push("fma");
        }
        if !std::arch::is_x86_feature_detected!("f16c") {
            missing.push("f16c");
        }
        missing
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        vec!["x86-64"]
    }
}

/// Whether this host has AVX-VNNI (`vpdpbusd` on ymm).
pub fn host_has_avx_vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avxvnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether this host runs the AVX-512 f32 kernel (AVX-512F; its opmask
/// moves need nothing more).
pub fn host_has_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether this host runs the decode attention's bf16 P·V of fp8 values:
/// AVX512_BF16 `vdpbf16ps`, AVX512_VBMI `vpermb`/`vpermi2b`, AVX512BW
/// byte-masked loads, and AVX512VL for the rest of the kernel.
pub fn host_has_avx512_bf16() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("avx512vbmi")
            && std::arch::is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether this host runs the decode attention's f16 P·V: AVX512-FP16
/// `vfmadd231ph` on ymm (AVX512VL), with AVX512F/BW for the rest of the
/// kernel's EVEX forms.
pub fn host_has_avx512_fp16() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("avx512fp16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether this host runs the AVX-512 int8 kernel ([`avx512_int8`]):
/// AVX512-VNNI `vpdpbusd` on zmm, with AVX512F/BW; and the AVX2 int8
/// kernels' EVEX `vpdpbusd` on ymm, which needs AVX512VL too.
pub fn host_has_avx512_vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

impl X86Backend {
    /// This backend with the decode attention's fp8 values by the CPU's
    /// packed form (f16 FMAs with AVX512-FP16, else bf16 dots with
    /// AVX512_BF16) only where `packed`, else by f32 FMAs; it never
    /// enables a missing feature. The two forms the autotuner measures and
    /// the runtime emits from its record.
    pub fn with_fp8_values_packed(self, packed: bool) -> X86Backend {
        X86Backend {
            avx512_bf16: self.avx512_bf16 && packed,
            avx512_fp16: self.avx512_fp16 && packed,
            ..self
        }
    }

    /// This backend with the decode attention's int8 keys of several-head
    /// tiles in lanes only where `lanes` ([`Self::int8_keys_in_lanes`]),
    /// else along d two keys at a time; it never enables a missing
    /// feature. The two forms the autotuner measures (where the CPU has
    /// AVX512-VNNI and no AMX) and the runtime emits from its record.
    pub fn with_int8_keys_in_lanes(self, lanes: bool) -> X86Backend {
        X86Backend {
            int8_keys_in_lanes: self.int8_keys_in_lanes && lanes,
            ..self
        }
    }

    /// This backend with q rounded to int8 in 32-d blocks for the lanes
    /// loop where `int8_q` ([`Self::int8_q_in_lanes`]; no effect without
    /// that loop). Unlike the other forms it changes the scores (by at
    /// most [`Self::q_int8_rounding`] of each block's largest |q|), so
    /// only a record turns it on.
    pub fn with_int8_q_in_lanes(self, int8_q: bool) -> X86Backend {
        X86Backend {
            int8_q_in_lanes: int8_q,
            ..self
        }
    }

    /// The most rounding q moves each element of a 32-d block by in this
    /// backend's decode attention, as a fraction of the block's largest
    /// |q| ([`attention::DecodeIsa::q_int8_rounding`]).
    pub fn q_int8_rounding(&self) -> f32 {
        self.decode_isa().q_int8_rounding()
    }

    /// Whether this backend's decode attention has the two int8 key forms
    /// [`Self::with_int8_keys_in_lanes`] chooses between: AVX512-VNNI
    /// without AMX (whose tile products take precedence).
    pub fn has_int8_key_lanes(&self) -> bool {
        self.avx512_vnni && !self.amx && self.int8_keys_in_lanes
    }

    /// Which of this backend's prefetches `kernel`'s GEMV and flat loops
    /// use: [`Self::int8_prefetch`] for quantized activations (i8dyn),
    /// [`Self::float_prefetch`] for f32 or f16 ones; None for other
    /// kernels (attention).
    pub fn weight_stream(kernel: &Kernel) -> Option<WeightStream> {
        let mm = kernel.as_matmul()?;
        match kernel.tensor(&mm.x)?.format {
            Format::I8Dyn => Some(WeightStream::Int8),
            Format::F32 | Format::F16 => Some(WeightStream::Float),
            _ => None,
        }
    }

    /// This backend with `stream`'s loops prefetching by `prefetch`.
    pub fn with_weight_prefetch(
        self,
        stream: WeightStream,
        prefetch: WeightPrefetch,
    ) -> X86Backend {
        match stream {
            WeightStream::Int8 => X86Backend {
                int8_prefetch: prefetch,
                ..self
            },
            WeightStream::Float => X86Backend {
                float_prefetch: prefetch,
                ..self
            },
        }
    }

    /// How `stream`'s loops prefetch.
    pub fn weight_prefetch(&self, stream: WeightStream) -> WeightPrefetch {
        match stream {
            WeightStream::Int8 => self.int8_prefetch,
            WeightStream::Float => self.float_prefetch,
        }
    }

    /// The packed form this backend's decode attention multiplies fp8
    /// values in ([`Self::with_fp8_values_packed`]), named for records and
    /// reports: `f16 FMAs` with AVX512-FP16, which takes precedence (as in
    /// [`attention::emit_for`]), else `bf16 dots` with AVX512_BF16; None
    /// where it has neither (f32 FMAs only).
    pub fn packed_fp8_form(&self) -> Option<&'static str> {
        if self.avx512_fp16 {
            Some("f16 FMAs")
        } else if self.avx512_bf16 {
            Some("bf16 dots")
        } else {
            None
        }
    }

    /// How this backend's decode attention scores the int8 keys of a group
    /// of `group` query heads on a KV head, named for reports: AMX tile
    /// products, the zmm loops (AVX512-VNNI: keys in lanes for a tile of 4
    /// to 7 heads where [`Self::int8_keys_in_lanes`], else key pairs by
    /// `vpdpwssd`), or a ymm integer dot.
    pub fn int8_key_form(&self, group: usize) -> &'static str {
        // The tiles of one KV head's group, as the decode call cuts them.
        let (lanes, pairs) = crate::host_attention::decode_tile_heads(0, group, group.max(1))
            .filter(|&t| t > 1)
            .fold((false, false), |(lanes, pairs), t| {
                let here = self.has_int8_key_lanes() && attention::LANE_TILE_HEADS.contains(&t);
                (lanes || here, pairs || !here)
            });
        let int8_q = lanes && self.int8_q_in_lanes;
        match (self.avx512_vnni, self.amx, self.int8_dot()) {
            (true, true, _) => "AMX tdpbssd",
            (true, false, _) if int8_q && pairs => {
                "zmm vpdpbusd keys in lanes (q int8 in 32-d blocks), vpdpwssd pairs"
            }
            (true, false, _) if int8_q => "zmm vpdpbusd, keys in lanes, q int8 in 32-d blocks",
            (true, false, _) if lanes && pairs => "zmm vpdpbusd keys in lanes, vpdpwssd pairs",
            (true, false, _) if lanes => "zmm vpdpbusd, keys in lanes",
            (true, false, _) => "zmm vpdpwssd",
            (false, _, int8::Dot::VexVnni) => "ymm vpdpwssd",
            (false, _, _) => "ymm vpmaddwd",
        }
    }

    /// The backend for this CPU: fails with the missing feature names when
    /// AVX2, FMA or F16C is absent; uses `vpdpbusd` when AVX-VNNI exists
    /// and the AVX-512 f32 kernel when AVX-512F does.
    pub fn detect() -> Result<X86Backend, X86Error> {
        let missing = missing_features();
        if !missing.is_empty() {
            return Err(X86Error::MissingFeature {
                missing: missing.join(", "),
            });
        }
        Ok(X86Backend {
            vnni: host_has_avx_vnni(),
            avx512: host_has_avx512(),
            avx512_vnni: host_has_avx512_vnni(),
            avx512_bf16: host_has_avx512_bf16(),
            avx512_fp16: host_has_avx512_fp16(),
            amx: amx::request_tile_data(),
            int8_keys_in_lanes: true,
            int8_q_in_lanes: false,
            int8_prefetch: WeightPrefetch::INT8,
            float_prefetch: WeightPrefetch::FLOAT,
        })
    }

    /// The target whose solver tiles this backend should be given for
    /// `kernel`'s `variant`: `x86-avx512` for the GEMM variant of an f32 ×
    /// f32 → f32 matmul when `avx512` is on (the AVX-512 kernel), else
    /// `x86-avx2`. GEMV and flat GEMM default to AVX2: they are bound by
    /// the weight stream, and on the CPU first measured the zmm kernels'
    /// wider flat tiles read less of the bandwidth at M = 8 (f32 62%
    /// against 69%, W4A8 49% against 61%). On Zen 4 the zmm f32 flat read
    /// 69% against 37%: the autotuner times the zmm flat tiles as
    /// candidates too and the record says which won.
    ///
    /// Grouped int8 kernels, which the AVX-512 int8 kernel reads (u4asym,
    /// u4sym and i8sym in groups of 8–128, f32 or f16 parameters: ggml's
    /// Q4_0, Q4_1 and Q8_0 too; not per-row W8A8) get
    /// `x86-avx512` tiles when both `avx512` and `avx512_vnni` are on (the
    /// EVEX form it uses, which [`Self::load`] still checks; Zen 4 and Ice
    /// Lake have it without AVX-VNNI). The answer depends on the flags only, so emitted code is
    /// the same on every host.
    pub fn target(&self, kernel: &Kernel, variant: Variant) -> &'static TargetCaps {
        let name = if variant == Variant::Gemm
            && self.avx512
            && (is_f32_matmul(kernel) || (self.avx512_vnni && is_avx512_int8_matmul(kernel)))
        {
            AVX512_NAME
        } else {
            NAME
        };
        TargetCaps::by_name(name).expect("x86 targets are built in")
    }

    /// The dot product of the AVX2 int8 kernels: `vpdpbusd` wherever the
    /// CPU has one (VEX when AVX-VNNI exists, the EVEX ymm form with
    /// AVX512-VNNI), which replaces `vpmaddubsw` + `vpmaddwd` (+ `vpaddd`)
    /// in the k loop by one instruction.
    pub fn int8_dot(&self) -> int8::Dot {
        if self.vnni {
            int8::Dot::VexVnni
        } else if self.avx512_vnni {
            int8::Dot::EvexVnni
        } else {
            int8::Dot::MaddUbsw
        }
    }

    /// `spec` as this backend emits `variant` of it: its dot product, and
    /// with `vpdpbusd` grouped 8-bit codes read as unsigned w + 128
    /// ([`int8::ZeroPoint::Implied128`]: one instruction per row and step
    /// instead of the sign trick's three; their quantizer then writes Σq).
    ///
    /// The GEMV of 8-bit codes keeps `vpmaddubsw` where the only
    /// `vpdpbusd` is AVX512-VNNI's EVEX form: on Zen 4 that GEMV read
    /// 0.67–1.10× the `vpmaddubsw` one's bandwidth from DRAM (Q8_0, Llama2
    /// and Qwen2 shapes, 1 and 2 threads, same runs; 1.3× faster with the
    /// weights in L2), while the flat GEMM at M = 8 gained 1.5–1.9×. 4-bit
    /// GEMVs were level, and CPUs with AVX-VNNI keep the VEX form they
    /// always ran.
    fn int8_spec(&self, spec: int8::Int8Spec, variant: Variant) -> int8::Int8Spec {
        let mut dot = self.int8_dot();
        if dot == int8::Dot::EvexVnni && variant == Variant::Gemv && spec.wbits == 8 {
            dot = int8::Dot::MaddUbsw;
        }
        let flip = dot.is_vnni() && spec.wbits == 8 && spec.group.is_some();
        int8::Int8Spec {
            dot,
            zero: if flip {
                int8::ZeroPoint::Implied128
            } else {
                spec.zero
            },
            ..spec
        }
    }

    /// The AVX-512 kernel's spec when this kernel and tile go to it: the
    /// backend has `avx512`, the kernel is f32 × f32 → f32 and the tile was
    /// solved on `x86-avx512` (its budget is the 32 zmm; an `x86-avx2`
    /// tile keeps the AVX2 kernel).
    fn avx512_spec(
        &self,
        kernel: &Kernel,
        tile: &TileConfig,
    ) -> Result<Option<avx512::Avx512Spec>, EmitError> {
        if !self.avx512 || !is_f32_matmul(kernel) || tile.accounting.budget != avx512::ZMM_REGS {
            return Ok(None);
        }
        classify_avx512(kernel, tile).map(Some)
    }

    /// The AVX-512 int8 kernel's spec when this kernel and tile go to it:
    /// the backend has `avx512`, the kernel is W4A8 and the tile was solved
    /// on `x86-avx512`. Emission does not look at the host; loading does.
    fn avx512_int8_spec(
        &self,
        kernel: &Kernel,
        tile: &TileConfig,
    ) -> Result<Option<avx512_int8::Avx512Int8Spec>, EmitError> {
        if !self.avx512
            || !has_avx512_int8_operands(kernel)
            || tile.accounting.budget != avx512::ZMM_REGS
        {
            return Ok(None);
        }
        classify_avx512_int8(kernel, tile).map(Some)
    }

    /// The activation quantizer an `i8dyn` kernel needs (None for float x).
    pub fn emit_quantizer(
        &self,
        kernel: &Kernel,
        tile: &TileConfig,
    ) -> Result<Option<MachineCode>, EmitError> {
        crate::artifact::unsigned_codes_only(kernel, NAME, UNSIGNED_CODES)?;
        if self.avx512_spec(kernel, tile)?.is_some() {
            return Ok(None);
        }
        if let Some(spec) = self.avx512_int8_spec(kernel, tile)? {
            // The AVX2 kernel's quantizer for ep rows, with the i32 Σq of
            // `vpdpbusd` sums.
            return quantize::emit(&int8::Int8Spec {
                ep: spec.ep,
                hb: spec.zb * 2,
                group: Some(spec.group),
                wbits: if spec.zero == int8::ZeroPoint::Implied128 {
                    8
                } else {
                    4
                },
                zero: spec.zero,
                params: spec.params,
                y: Format::F32,
                bias: spec.bias,
                activation: spec.activation,
                dot: int8::Dot::EvexVnni,
            })
            .map(Some);
        }
        match classify(kernel, tile)? {
            Family::Float(_) => Ok(None),
            // Σq whenever some variant folds a zero point of 128.
            Family::Int8(spec) => quantize::emit(&self.int8_spec(spec, Variant::Gemm)).map(Some),
        }
    }

    /// The attention kernel's code on this backend's instructions: the
    /// int8-key dot of [`Self::int8_dot`], with `avx512_vnni` (which
    /// comes with AVX512VL and AVX512BW) ymm16–31 for P·V and the zmm score
    /// loop for the keys of several-head tiles, and with that fp8 values'
    /// P·V by f16 FMAs (`avx512_fp16`) or else bf16 dots (`avx512_bf16`),
    /// and with `amx` too the AMX score loop; a prefill kernel's flash loop
    /// in `blocks`. With `amx` it asks Linux for the tile state first
    /// ([`amx::request_tile_data`], once a process), so code emitted here
    /// runs here even when the backend was not made by [`Self::detect`].
    pub fn attention(
        &self,
        kernel: &Kernel,
        blocks: PrefillBlocks,
    ) -> Result<MachineCode, EmitError> {
        if self.amx {
            amx::request_tile_data();
        }
        attention::emit_for(kernel, blocks, self.decode_isa())
    }

    /// What [`Self::attention`] emits with.
    fn decode_isa(&self) -> attention::DecodeIsa {
        attention::DecodeIsa {
            key_dot: self.int8_dot().into(),
            ymm32: self.avx512_vnni,
            bf16_values: self.avx512_bf16,
            f16_pv: self.avx512_fp16,
            zmm_scores: self.avx512_vnni,
            amx_scores: self.amx && self.avx512_vnni,
            lane_scores: self.avx512_vnni && self.int8_keys_in_lanes,
            lane_int8_q: self.int8_q_in_lanes,
        }
    }

    /// The most this backend's decode attention moves o by rounding p in
    /// the P·V of fp8 values, as a fraction of the largest |v| it weighs
    /// ([`attention::DecodeIsa::fp8_p_rounding`]): 2^-8 with bf16 dots,
    /// 2^-11 with f16 FMAs (their f16 block sums add their own), 0 with
    /// f32 FMAs.
    pub fn fp8_p_rounding(&self) -> f32 {
        self.decode_isa().fp8_p_rounding()
    }

    /// Emit the matmul machine code (the GEMM variant).
    pub fn emit_code(&self, kernel: &Kernel, tile: &TileConfig) -> Result<MachineCode, EmitError> {
        self.emit_code_variant(kernel, tile, Variant::Gemm)
    }

    /// Emit one variant's machine code (see [`float::emit_variant`] and
    /// [`int8::emit_variant`]). Every variant computes any m; they differ in
    /// loop order, K blocking and prefetch, so the autotuner picks per M.
    pub fn emit_code_variant(
        &self,
        kernel: &Kernel,
        tile: &TileConfig,
        variant: Variant,
    ) -> Result<MachineCode, EmitError> {
        if kernel.as_attention().is_some() {
            return self.attention(kernel, PrefillBlocks::DEFAULT);
        }
        crate::artifact::unsigned_codes_only(kernel, NAME, UNSIGNED_CODES)?;
        if let Some(spec) = self.avx512_spec(kernel, tile)? {
            return avx512::emit_variant_prefetching(&spec, variant, self.float_prefetch);
        }
        if let Some(spec) = self.avx512_int8_spec(kernel, tile)? {
            return avx512_int8::emit_variant_prefetching(&spec, variant, self.int8_prefetch);
        }
        match classify(kernel, tile)? {
            Family::Float(spec) => {
                float::emit_variant_prefetching(&spec, variant, self.float_prefetch)
            }
            Family::Int8(spec) => int8::emit_variant_prefetching(
                &self.int8_spec(spec, variant),
                variant,
                self.int8_prefetch,
            ),
        }
    }

    /// Emit the GEMM variant, check that this CPU runs the code, and map it.
    pub fn load(&self, kernel: &Kernel, tile: &TileConfig) -> Result<HostMatmul, X86Error> {
        self.load_variant(kernel, tile, Variant::Gemm)
    }

    /// Emit one variant, check that this CPU runs the code, and map it.
    pub fn load_variant(
        &self,
        kernel: &Kernel,
        tile: &TileConfig,
        variant: Variant,
    ) -> Result<HostMatmul, X86Error> {
        let missing = missing_features();
        if !missing.is_empty() {
            return Err(X86Error::MissingFeature {
                missing: missing.join(", "),
            });
        }
        if self.avx512 && !host_has_avx512() {
            return Err(X86Error::MissingFeature {
                missing: "avx512f".into(),
            });
        }
        let evex_int8 = self.int8_dot() == int8::Dot::EvexVnni
            && matches!(classify(kernel, tile), Ok(Family::Int8(_)));
        if (evex_int8 || self.avx512_int8_spec(kernel, tile)?.is_some()) && !host_has_avx512_vnni()
        {
            return Err(X86Error::MissingFeature {
                missing: "avx512vnni, avx512bw, avx512vl".into(),
            });
        }
        if self.vnni && !host_has_avx_vnni() {
            return Err(X86Error::MissingFeature {
                missing: "avxvnni".into(),
            });
        }
        let code = self.emit_code_variant(kernel, tile, variant)?;
        let quantizer = self.emit_quantizer(kernel, tile)?;
        Ok(HostMatmul::new(
            kernel,
            HostTile::from(tile),
            quantizer.as_ref(),
            &code,
        )?)
    }
}

/// Why the x86 kernels refuse `signed-codes` weights.
const UNSIGNED_CODES: &str =
    "the x86 loops read unsigned codes (vpmaddubsw multiplies unsigned by signed bytes)";

impl Backend for X86Backend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn emit(&self, kernel: &Kernel, tile: &TileConfig) -> Result<Artifact, EmitError> {
        self.emit_code(kernel, tile).map(Artifact::Machine)
    }

    fn emit_variant(
        &self,
        kernel: &Kernel,
        tile: &TileConfig,
        variant: Variant,
    ) -> Result<Artifact, EmitError> {
        self.emit_code_variant(kernel, tile, variant)
            .map(Artifact::Machine)
    }
}

pub(crate) fn machine_code(bytes: Vec<u8>, listing: String) -> MachineCode {
    MachineCode {
        arch: Arch::X86_64,
        bytes,
        listing,
        head_dim_multiple: 1,
        whole_prefill: None,
        every_head_state: false,
    }
}

fn unsupported(what: String) -> EmitError {
    EmitError::Unsupported {
        backend: NAME,
        what,
    }
}

/// What every x86 kernel family asks of a matmul: weights in the CPU
/// panel layout and an epilogue x86 emits (no silu yet). `what` words the
/// refusal for the family. Returns the epilogue's activation.
fn check_cpu_matmul(
    kernel: &Kernel,
    mm: &Matmul,
    what: &dyn Fn(&str) -> EmitError,
) -> Result<tessera_dsl::ir::Activation, EmitError> {
    if !is_cpu_weight_layout(kernel, mm) {
        return Err(what(
            "weights must use the CPU panel layout [h/hp, l/lp, hp, lp] (GPU-layout kernels go to opencl/ptx)",
        ));
    }
    if let Some(b) = &mm.epilogue.bias
        && kernel.tensor(b).is_some_and(|t| t.format != Format::F32)
    {
        return Err(what(
            "the bias must be f32 (the x86 kernels read the bias as f32)",
        ));
    }
    if let Some(split) = crate::schedule::matmul_split(kernel) {
        return Err(what(&split));
    }
    let activation = mm.epilogue.activation;
    if activation == tessera_dsl::ir::Activation::Silu {
        return Err(what(
            "the silu epilogue is not emitted on x86 yet (needs a vector exp); use none or relu",
        ));
    }
    Ok(activation)
}

/// A tile the x86 emitters refuse, and why.
fn bad_tile(tile: &TileConfig, why: String) -> EmitError {
    EmitError::BadTile {
        tile: format!("{}x{}x{}", tile.ep, tile.hp, tile.lp),
        why,
    }
}

/// The matmul of `kernel`, or the refusal of anything else.
fn as_matmul(kernel: &Kernel) -> Result<&Matmul, EmitError> {
    kernel
        .as_matmul()
        .ok_or_else(|| unsupported(format!("kernel `{}`: only matmuls", kernel.name)))
}

/// Which emitter a kernel goes to, with everything it needs.
enum Family {
    Float(float::FloatSpec),
    Int8(int8::Int8Spec),
}

/// `[h/hp, l/lp, hp, lp]` (the CPU weight layout) over the matmul's axes.
fn is_cpu_weight_layout(kernel: &Kernel, mm: &Matmul) -> bool {
    kernel.is_blocked(&mm.w, &mm.h, &mm.l)
}

/// `[e/ep, l/lp, ep, lp]` for the quantized activations.
fn is_packed_x_layout(kernel: &Kernel, mm: &Matmul) -> bool {
    kernel.is_blocked(&mm.x, &mm.e, &mm.l)
        && kernel
            .tensor(&mm.x)
            .is_some_and(|t| !t.layout.int4_pair_transpose)
}

/// f32 activations, weights and output (what the AVX-512 kernel runs).
fn is_f32_matmul(kernel: &Kernel) -> bool {
    kernel.as_matmul().is_some_and(|mm| {
        [&mm.x, &mm.w, &mm.y]
            .iter()
            .all(|t| kernel.tensor(t).is_some_and(|t| t.format == Format::F32))
    })
}

/// i8dyn activations with the weights the AVX-512 int8 kernel reads, in
/// groups of 8 to 128 with f32 or f16 parameters, into f32 y: 4-bit codes
/// (u4asym or u4sym, pair-transposed: ggml's Q4_0 and Q4_1 too) or 8-bit
/// `i8sym` (Q8_0). Per-row W8A8 and f16 outputs get `x86-avx2` tiles and
/// the AVX2 kernel, which takes them, instead of an AVX-512 tile no kernel
/// can run.
fn is_avx512_int8_matmul(kernel: &Kernel) -> bool {
    has_avx512_int8_operands(kernel)
        && kernel
            .as_matmul()
            .and_then(|mm| kernel.tensor(&mm.y))
            .is_some_and(|t| t.format == Format::F32)
}

/// i8dyn activations and weights the AVX-512 int8 kernel reads, whatever
/// the output: an `x86-avx512` tile of such a kernel goes to that kernel,
/// which names what else it refuses.
fn has_avx512_int8_operands(kernel: &Kernel) -> bool {
    kernel.as_matmul().is_some_and(|mm| {
        kernel
            .tensor(&mm.x)
            .is_some_and(|t| t.format == Format::I8Dyn)
            && kernel.tensor(&mm.w).is_some_and(|t| {
                avx512_int8_weights(t.format).is_some_and(|(_, zero, _)| {
                    t.layout.int4_pair_transpose == (zero != int8::ZeroPoint::Implied128)
                })
            })
    })
}

/// The group, zero point and parameter precision of weights the AVX-512
/// int8 kernel reads, or None.
fn avx512_int8_weights(format: Format) -> Option<(usize, int8::ZeroPoint, ParamType)> {
    let (g, zero, params) = match format {
        Format::U4Asym(Group::Size(g), p) => (g, int8::ZeroPoint::Offset, p),
        Format::U4Sym(Group::Size(g), p) => (g, int8::ZeroPoint::Implied8, p),
        Format::I8Sym(Group::Size(g), p) => (g, int8::ZeroPoint::Implied128, p),
        _ => return None,
    };
    (g.is_power_of_two() && (8..=MAX_INT4_GROUP).contains(&g)).then_some((g as usize, zero, params))
}

/// The AVX-512 int8 kernel for an `x86-avx512` W4A8 tile: the AVX2 int8
/// kernel's layout rules, f32 output, hp a multiple of 16 and a register
/// plan within the 32 zmm.
fn classify_avx512_int8(
    kernel: &Kernel,
    tile: &TileConfig,
) -> Result<avx512_int8::Avx512Int8Spec, EmitError> {
    let mm = as_matmul(kernel)?;
    let what = |why: &str| unsupported(format!("kernel `{}` (avx512 w4a8): {why}", kernel.name));
    let activation = check_cpu_matmul(kernel, mm, &what)?;
    if !is_packed_x_layout(kernel, mm) {
        return Err(what(
            "i8dyn activations must use the layout [e/ep, l/lp, ep, lp]",
        ));
    }
    let w = kernel.tensor(&mm.w);
    let Some((group, zero, params)) = w.and_then(|t| avx512_int8_weights(t.format)) else {
        return Err(what(&format!(
            "weights must be u4asym, u4sym or i8sym in groups of a power of two from 8 to {MAX_INT4_GROUP} (per-row i8sym runs on the AVX2 kernel)"
        )));
    };
    let nibbles = zero != int8::ZeroPoint::Implied128;
    if nibbles && !w.is_some_and(|t| t.layout.int4_pair_transpose) {
        return Err(what("4-bit weights need the int4 pair transpose"));
    }
    if !nibbles && w.is_some_and(|t| t.layout.int4_pair_transpose) {
        return Err(what("8-bit weights take no int4 pair transpose"));
    }
    if kernel.tensor(&mm.y).map(|t| t.format) != Some(Format::F32) {
        return Err(what("the output must be f32"));
    }
    let tile_err = |why: String| bad_tile(tile, why);
    if tile.ep == 0 || tile.hp == 0 || !tile.hp.is_multiple_of(16) || tile.lp != 4 {
        return Err(tile_err(
            "the avx512 int8 kernel needs hp a positive multiple of 16 (one zmm) and lp = 4".into(),
        ));
    }
    let spec = avx512_int8::Avx512Int8Spec {
        ep: tile.ep as usize,
        zb: tile.hp as usize / 16,
        group,
        zero,
        params,
        bias: mm.epilogue.bias.is_some(),
        activation,
    };
    avx512_int8::check_plan(&spec, tile).map_err(tile_err)?;
    Ok(spec)
}

/// The AVX-512 f32 kernel for an `x86-avx512` tile, its plan checked
/// against the solver's accounting.
fn classify_avx512(kernel: &Kernel, tile: &TileConfig) -> Result<avx512::Avx512Spec, EmitError> {
    let mm = as_matmul(kernel)?;
    let what = |why: &str| unsupported(format!("kernel `{}` (avx512 f32): {why}", kernel.name));
    let activation = check_cpu_matmul(kernel, mm, &what)?;
    if kernel
        .tensor(&mm.x)
        .is_some_and(|t| !t.layout.is_row_major(&[&mm.e, &mm.l]))
    {
        return Err(what("float activations must be row-major [e, l]"));
    }
    let tile_err = |why: String| bad_tile(tile, why);
    if tile.ep == 0 || tile.hp == 0 || !tile.hp.is_multiple_of(16) || tile.lp != 1 {
        return Err(tile_err(
            "the avx512 f32 kernel needs hp a positive multiple of 16 (one zmm) and lp = 1".into(),
        ));
    }
    let spec = avx512::Avx512Spec::new(
        tile.ep as usize,
        tile.hp as usize,
        mm.epilogue.bias.is_some(),
        activation,
    );
    avx512::check_plan(&spec, tile).map_err(tile_err)?;
    Ok(spec)
}

fn classify(kernel: &Kernel, tile: &TileConfig) -> Result<Family, EmitError> {
    let mm = as_matmul(kernel)?;
    let format = |name: &str| {
        kernel.tensor(name).map(|t| t.format).ok_or_else(|| {
            unsupported(format!("kernel `{}`: tensor `{name}` missing", kernel.name))
        })
    };
    let (x, w, y) = (format(&mm.x)?, format(&mm.w)?, format(&mm.y)?);
    let what = |why: &str| {
        unsupported(format!(
            "kernel `{}` (x {x}, w {w}, y {y}): {why}",
            kernel.name
        ))
    };
    let activation = check_cpu_matmul(kernel, mm, &what)?;
    if !matches!(y, Format::F32 | Format::F16) {
        return Err(what("the output must be f32 or f16"));
    }
    let bias = mm.epilogue.bias.is_some();
    let tile_err = |why: String| bad_tile(tile, why);
    if tile.ep == 0 || tile.hp == 0 || !tile.hp.is_multiple_of(8) {
        return Err(tile_err(
            "hp must be a positive multiple of 8 (one ymm of f32 / i32)".into(),
        ));
    }
    match (x, w) {
        (Format::F32 | Format::F16, Format::F32 | Format::F16) => {
            if kernel
                .tensor(&mm.x)
                .is_some_and(|t| !t.layout.is_row_major(&[&mm.e, &mm.l]))
            {
                return Err(what("float activations must be row-major [e, l]"));
            }
            if tile.lp != 1 {
                return Err(tile_err("the f32 class (vfmadd231ps) needs lp = 1".into()));
            }
            let spec = float::FloatSpec {
                ep: tile.ep as usize,
                hb: tile.hp as usize / 8,
                x,
                w,
                y,
                bias,
                activation,
            };
            plan::float_plan(&spec).check(tile).map_err(tile_err)?;
            Ok(Family::Float(spec))
        }
        (Format::I8Dyn, Format::I8Sym(Group::Row, ParamType::F32))
        | (
            Format::I8Dyn,
            Format::U4Asym(..) | Format::U4Sym(..) | Format::I8Sym(Group::Size(_), _),
        ) => {
            if !is_packed_x_layout(kernel, mm) {
                return Err(what(
                    "i8dyn activations must use the layout [e/ep, l/lp, ep, lp]",
                ));
            }
            if tile.lp != 4 {
                return Err(tile_err("the int8 class (vpmaddubsw) needs lp = 4".into()));
            }
            let group = match w {
                Format::U4Asym(Group::Size(g), _)
                | Format::U4Sym(Group::Size(g), _)
                | Format::I8Sym(Group::Size(g), _)
                    if g.is_power_of_two() && (8..=MAX_INT4_GROUP).contains(&g) =>
                {
                    Some(g as usize)
                }
                Format::U4Asym(..) | Format::U4Sym(..) | Format::I8Sym(Group::Size(_), _) => {
                    return Err(what(&format!(
                        "weight groups must be a power of two from 8 to {MAX_INT4_GROUP} (one group is one unrolled block of steps)"
                    )));
                }
                _ => None,
            };
            let pair = kernel
                .tensor(&mm.w)
                .is_some_and(|t| t.layout.int4_pair_transpose);
            if group.is_some() && !matches!(w, Format::I8Sym(..)) && !pair {
                return Err(what("4-bit weights need the int4 pair transpose"));
            }
            let spec = int8::Int8Spec {
                ep: tile.ep as usize,
                hb: tile.hp as usize / 8,
                group,
                wbits: if matches!(w, Format::I8Sym(..)) { 8 } else { 4 },
                zero: match w {
                    Format::U4Sym(..) => int8::ZeroPoint::Implied8,
                    Format::U4Asym(..) => int8::ZeroPoint::Offset,
                    _ => int8::ZeroPoint::None,
                },
                params: w.params().unwrap_or_default(),
                y,
                bias,
                activation,
                dot: int8::Dot::MaddUbsw,
            };
            plan::int8_plan(&spec).check(tile).map_err(tile_err)?;
            Ok(Family::Int8(spec))
        }
        _ => Err(what(
            "x86-avx2 runs f32/f16 x with f32/f16 weights, and i8dyn x with i8sym:row (f32 scale), or u4asym, u4sym or i8sym weights in groups of 8 to 128 (f32 or f16 parameters)",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::{AVX512_NAME, NAME, X86Backend};
    use tessera_dsl::ir::Variant;
    use tessera_dsl::library;

    /// The measured choice of fp8 values' form only ever turns the packed
    /// forms off: a record cannot make a CPU without AVX512_BF16 or
    /// AVX512-FP16 run them.
    #[test]
    fn the_fp8_value_form_never_enables_a_missing_feature() {
        let with = X86Backend {
            avx512_bf16: true,
            avx512_fp16: true,
            ..X86Backend::default()
        };
        let without = X86Backend::default();
        assert!(with.with_fp8_values_packed(true).avx512_bf16);
        assert!(!with.with_fp8_values_packed(false).avx512_bf16);
        assert!(!without.with_fp8_values_packed(true).avx512_bf16);
        assert!(with.with_fp8_values_packed(true).avx512_fp16);
        assert!(!with.with_fp8_values_packed(false).avx512_fp16);
        assert!(!without.with_fp8_values_packed(true).avx512_fp16);
        // f16 FMAs take precedence; the FMA form has no packed form.
        assert_eq!(with.packed_fp8_form(), Some("f16 FMAs"));
        let bf16_only = X86Backend {
            avx512_fp16: false,
            amx: false,
            ..with
        };
        assert_eq!(bf16_only.packed_fp8_form(), Some("bf16 dots"));
        assert_eq!(with.with_fp8_values_packed(false).packed_fp8_form(), None);
        assert_eq!(without.packed_fp8_form(), None);
        assert_eq!(
            X86Backend {
                avx512_bf16: false,
                avx512_fp16: false,
                amx: false,
                ..with
            },
            with.with_fp8_values_packed(false),
            "nothing else changes"
        );
    }

    /// With AVX-512 and AVX512-VNNI (Zen 4, Sapphire Rapids), only the
    /// weights the AVX-512 int8 kernel reads get `x86-avx512` GEMM tiles:
    /// every grouped format (ggml's Q4_0, Q4_1 and Q8_0 included); per-row
    /// W8A8 stays on AVX2, whose kernel takes it (an AVX-512 tile has no
    /// kernel for it: before the AVX-512 kernel read Q4_0, the GEMM of
    /// every GGUF Q4 tensor failed to build on such CPUs).
    #[test]
    fn avx512_gemm_tiles_only_for_weights_the_avx512_kernels_read() {
        let be = X86Backend {
            avx512: true,
            avx512_vnni: true,
            ..X86Backend::default()
        };
        for (name, want) in [
            ("matmul-w4a8", AVX512_NAME),
            ("matmul-f32", AVX512_NAME),
            ("matmul-q4_0", AVX512_NAME),
            ("matmul-q4_1", AVX512_NAME),
            ("matmul-q8_0", AVX512_NAME),
            ("matmul-w8a8", NAME),
        ] {
            let k = library::get(name).unwrap();
            assert_eq!(be.target(&k, Variant::Gemm).name, want, "{name}");
            assert_eq!(be.target(&k, Variant::Gemv).name, NAME, "{name} GEMV");
        }
        // f16 output: the AVX2 kernel writes it, the AVX-512 one does not.
        let mut f16_y = library::get("matmul-q4_0").unwrap();
        f16_y
            .tensors
            .iter_mut()
            .find(|t| t.name == "y")
            .unwrap()
            .format = tessera_dsl::Format::F16;
        assert_eq!(be.target(&f16_y, Variant::Gemm).name, NAME);
        let no_vnni = X86Backend {
            avx512_vnni: false,
            avx512_bf16: false,
            avx512_fp16: false,
            amx: false,
            ..be
        };
        let w4a8 = library::get("matmul-w4a8").unwrap();
        assert_eq!(no_vnni.target(&w4a8, Variant::Gemm).name, NAME);
    }

    /// With only AVX512-VNNI's EVEX `vpdpbusd`, 8-bit GEMVs keep
    /// `vpmaddubsw` (measured faster from DRAM on Zen 4); their flat GEMM,
    /// 4-bit GEMVs and every AVX-VNNI kernel take `vpdpbusd`.
    #[test]
    fn which_int8_loops_take_vpdpbusd() {
        use crate::tile::{Problem, solve};
        let evex = X86Backend {
            avx512_vnni: true,
            ..X86Backend::default()
        };
        let vex = X86Backend { vnni: true, ..evex };
        let caps = super::plan::target();
        for (be, name, variant, mac) in [
            (
                evex,
                "matmul-q8_0",
                Variant::Gemv,
                "mac vpmaddubsw+vpmaddwd",
            ),
            (
                evex,
                "matmul-w8a8",
                Variant::Gemv,
                "mac vpmaddubsw+vpmaddwd",
            ),
            (
                evex,
                "matmul-q8_0",
                Variant::FlatGemm,
                "mac {evex} vpdpbusd",
            ),
            (evex, "matmul-q4_0", Variant::Gemv, "mac {evex} vpdpbusd"),
            (vex, "matmul-q8_0", Variant::Gemv, "mac vpdpbusd"),
        ] {
            let k = library::get(name).unwrap();
            let tile = solve(caps, &Problem::from_kernel(caps, &k).unwrap()).unwrap()[0];
            let code = be.emit_code_variant(&k, &tile, variant).unwrap();
            let head = code.listing.lines().next().unwrap_or_default().to_string();
            assert!(head.ends_with(mac), "{name} {variant}: {head}");
        }
    }
}
