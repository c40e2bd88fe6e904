//! GPU lowering shared by the OpenCL and PTX backends: every per-kernel
//! decision (work-group shape, per-work-item tile, load width, loop
//! structure, dequantization sequence, argument list and launch geometry)
//! made once, as data, so the two printers differ only in syntax.
//!
//! # Pipeline
//!
//! ```text
//!   Kernel + TileConfig + Variant ──► plan_matmul ──► MatmulPlan ──► printer (OpenCL C / PTX)
//!   Kernel + TargetCaps            ──► plan_attention ──► AttentionPlan ──►   "
//! ```
//!
//! # Weights: MNN-LLM 5.1
//!
//! GPU weights are packed `[l/lp, h, lp]` with [`WEIGHT_LP`] = 32 (see
//! `tessera_dsl::quant::gpu_weight_layout`): the codes of one output channel
//! for 32 consecutive l are contiguous, and neighbouring channels are
//! neighbours in memory. A work item reads one [`LOAD_BITS`] = 128-bit chunk
//! at a time (32 4-bit codes, 16 8-bit codes or 8 halves), and consecutive
//! work items take consecutive h, so a sub-group's loads coalesce.
//! Per-group parameters are `[groups, h]` (GroupMajor), read once per chunk.
//!
//! # Dequantization (Transformer-Lite 2.3, TurboMind)
//!
//! `w = scale · v(q) + offset` with `v(q)` produced by bit operations, not
//! int→float conversions, where the format allows ([`Dequant`]):
//!
//! | format | v(q) from a 4-bit code n | half bits | float bits |
//! |---|---|---|---|
//! | `u4asym` | OR a magic exponent, subtract it: `as_half(0x6400 \| n) − 1024` | `0x6400`, −1024 | `0x4B000000`, −2^23 |
//! | `e0m4` | shift and OR, nothing else: `as_half(0x4000 \| n << 6)` = 2 + n/8 | `0x4000`, shift 6 | `0x40000000`, shift 19 |
//! | `i8sym`, `i8asym` | signed byte converted | | |
//! | `f16` | the value itself | | |
//!
//! The u4 subtract is exact (1024 + n is exact in half), and it happens
//! before the multiply so no large magic value ever enters a sum.
//!
//! # The three matmul loop structures (FlashDecoding++ sections 4-5)
//!
//! - [`GemvPlan`]: one work item per (row of e, output channel h, lane of
//!   l): lanes stride over the 128-bit chunks of l, then the work group
//!   reduces the lanes in local memory. Work group = the solver block's
//!   `units_h` consecutive h × `max_threads_per_block / units_h` lanes (one
//!   row of e leaves the block's e side free, so it splits l). Each work
//!   item owns one h: the register tile's `hp` would make neighbours' loads
//!   non-contiguous, and a GEMV is bound by the weight stream, not by MACs.
//! - [`TiledPlan`] for flat GEMM: e padded to 8 (not 64) rows per work group,
//!   the solver's `hp` columns per work item, K slices double-buffered in
//!   local memory.
//! - [`TiledPlan`] for GEMM: the solver's block tile (`units_e × units_h`
//!   work items, each the solver's `ep × hp` register tile), the same
//!   double-buffered K pipeline.
//!
//! # Decode attention (FlashDecoding++ section 3, MNN-LLM 5.3)
//!
//! See [`AttentionPlan`]: split-K over the KV sequence, one work group per
//! (KV head, split), every query head of the GQA group in turn; the
//! unified max `phi` makes splits independent, a split with a score outside
//! `[phi + lo, phi + hi]` recomputes its exponentials with its own max, and
//! a combine kernel merges `(max, sum, output)` partials.

use tessera_dsl::ir::Attention;
use tessera_dsl::{
    Activation, AttentionKind, Format, Group, Kernel, LayoutDim, ParamType, SoftmaxMode,
};

use crate::artifact::{EmitError, Variant};
use crate::target::{Arch, GpuCaps, TargetCaps};
use crate::tile::TileConfig;

/// Widest load one GPU work item issues (MNN-LLM 5.1: 128 bits, the size of
/// one CL_RGBA texel of 32-bit channels).
pub const LOAD_BITS: u32 = 128;

/// The `lp` of the GPU weight layout `[l/lp, h, lp]`: one 128-bit load of
/// the narrowest (4-bit) codes. Every GPU weight format shares it so one
/// packer serves all.
pub const WEIGHT_LP: u32 = LOAD_BITS / 4;

/// Rows a flat GEMM pads M to (FlashDecoding++ section 4: 8, not 64).
pub const FLAT_GEMM_ROWS: u32 = 8;

/// How `v(q)` is made from the bits of a weight chunk.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Dequant {
    /// f16 weights: no dequantization.
    None,
    /// `as_T(magic | n) − sub`: 4-bit codes under an exponent whose ulp is 1.
    MagicOr {
        half_magic: u16,
        float_magic: u32,
        half_sub: f32,
        float_sub: f32,
    },
    /// `as_T(base | n << shift)`: E0M4's fraction bits under a fixed
    /// exponent (Transformer-Lite 2.3), two bit operations.
    ShiftOr {
        half_base: u16,
        half_shift: u32,
        float_base: u32,
        float_shift: u32,
    },
    /// Signed bytes converted to the arithmetic type.
    SignedByte,
}

/// The weight side of a GPU matmul.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WeightPlan {
    pub format: Format,
    pub bits: u32,
    /// The layout's lp ([`WEIGHT_LP`]).
    pub lp: u32,
    /// Elements of l per 128-bit load.
    pub elems_per_load: u32,
    /// 128-bit chunks per lp block.
    pub chunks_per_block: u32,
    /// Quantization group along l (`None` for f16 weights).
    pub group: Option<Group>,
    pub has_scale: bool,
    pub has_offset: bool,
    /// How the group scales and offsets are stored: f32, or f16 (2 bytes
    /// each, ggml's Q4_0 / Q8_0 blocks) widened to f32 where read.
    pub params: ParamType,
    pub dequant: Dequant,
}

impl WeightPlan {
    /// The plan for weights stored in `format`.
    pub fn for_format(format: Format) -> Result<WeightPlan, EmitError> {
        let dequant = match format {
            Format::F16 => Dequant::None,
            Format::U4Asym(..) => Dequant::MagicOr {
                half_magic: 0x6400,
                float_magic: 0x4B00_0000,
                half_sub: 1024.0,
                float_sub: 8_388_608.0,
            },
            // The implied zero point of 8 (w = d·(q − 8), ggml's Q4_0) is
            // folded into the subtraction that removes the magic exponent.
            Format::U4Sym(..) => Dequant::MagicOr {
                half_magic: 0x6400,
                float_magic: 0x4B00_0000,
                half_sub: 1032.0,
                float_sub: 8_388_616.0,
            },
            Format::E0M4(..) => Dequant::ShiftOr {
                half_base: 0x4000,
                half_shift: 6,
                float_base: 0x4000_0000,
                float_shift: 19,
            },
            Format::I8Sym(..) | Format::I8Asym(..) => Dequant::SignedByte,
            other => {
                return Err(unsupported(format!(
                    "{other} weights (GPU weights are f16, u4asym, u4sym, e0m4, i8sym or i8asym)"
                )));
            }
        };
        let bits = format.bits();
        let elems_per_load = LOAD_BITS / bits;
        let group = format.group();
        if let Some(Group::Size(g)) = group
            && g % elems_per_load != 0
        {
            return Err(unsupported(format!(
                "{format} weights: a group of {g} does not hold whole {LOAD_BITS}-bit loads of {elems_per_load} codes"
            )));
        }
        Ok(WeightPlan {
            format,
            bits,
            lp: WEIGHT_LP,
            elems_per_load,
            chunks_per_block: WEIGHT_LP / elems_per_load,
            group,
            has_scale: format.is_quantized(),
            has_offset: format.is_asymmetric(),
            params: format.params().unwrap_or(ParamType::F32),
            dequant,
        })
    }

    /// Group length for a row of `l` elements (l itself for f16 or per-row).
    pub fn group_len(&self, l: u32) -> u32 {
        match self.group {
            Some(Group::Size(g)) => g,
            _ => l.max(1),
        }
    }
}

/// Where the weights live on an OpenCL device (MNN-LLM 5.1 prefers images:
/// texture caches on Adreno).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum WeightMemory {
    #[default]
    Buffer,
    /// `image2d_t`, CL_RGBA / CL_UNSIGNED_INT32: one texel is one 128-bit
    /// chunk; width `h · chunks_per_block`, height `ceil(l / lp)`.
    Image,
}

/// Output channels per thread of the PTX GEMV ([`GemvPlan::channels`]):
/// 4 for 4-bit codes, whose activation work (a conversion and, with
/// offsets, a sum per element) is the larger share of their instructions;
/// 2 for 8-bit codes and f16. Measured on an H200 (Llama2-7B shapes, M =
/// 1): 4-bit 3–20% faster with 4 than with 1, and faster than with 2 on
/// three of four shapes; 8-bit and f16 5–12% slower with 4 than with 2.
pub fn ptx_gemv_channels(weight_bits: u32) -> u32 {
    if weight_bits <= 4 { 4 } else { 2 }
}

/// The PTX flat GEMM (M = 2–16, decode of a batch) is the GEMV with
/// `rows` rows of e per thread: the tensor-core flat GEMM streamed all of
/// K through each warp and took 107–295 µs at every M on an H200 (cuBLAS:
/// 13–28 µs), while the GEMV's time grew with M only because each row of
/// e re-read and re-decoded the weights. Rows: the tile's e rounded up to
/// 1, 2 or 4, at most 4 (a row past e recomputes the last, which is
/// cheaper than a second pass over the weights); channels: 2 for
/// quantized weights, 4 for f16 — the most that fit 128 registers without
/// spills beside 4 rows' accumulators. Channels matter more than rows: a
/// thread loads each of its rows' activations once for all its channels,
/// so the activation traffic is M·l·h/channels halves whatever the rows
/// (8 rows of 1 channel moved 32× the weights' bytes of activations
/// through the L1 and were no faster than the GEMV).
pub fn ptx_flat_rows(tile_ep: u32) -> u32 {
    tile_ep.clamp(1, 4).next_power_of_two()
}

/// GEMV: see the module doc.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemvPlan {
    /// Work items along h in one work group (one sub-group / warp).
    pub wg_h: u32,
    /// Work items along l in one work group, reduced in local memory.
    pub k_lanes: u32,
    /// Output channels per work item (`h`, `h + wg_h`, ...): its chunk of
    /// activations is converted and summed once for all of them
    /// ([`ptx_gemv_channels`] on PTX, where those instructions bound the
    /// GEMV; 1 on OpenCL).
    pub channels: u32,
    /// Rows of e per work item: every weight chunk it loads serves each
    /// (1 for the GEMV; the PTX flat GEMM's rows, [`ptx_flat_rows`]).
    pub rows: u32,
}

/// Flat GEMM and GEMM: a block tile staged through local memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TiledPlan {
    /// Per-work-item register tile.
    pub ep: u32,
    pub hp: u32,
    /// Work items along e and h.
    pub units_e: u32,
    pub units_h: u32,
    /// Block tile: `units_e·ep` rows, `units_h·hp` columns.
    pub tile_e: u32,
    pub tile_h: u32,
    /// Elements of l per stage.
    pub k_slice: u32,
    /// Local-memory stages (2 = double buffering).
    pub stages: u32,
    /// Bytes of local memory: `stages · k_slice · (tile_e + tile_h)` halves.
    pub local_bytes: u32,
    /// Threads per unit: 1 when a unit is a work item (OpenCL, CUDA cores),
    /// the warp width when a unit is a warp issuing `mma` (PTX tensor cores,
    /// where the solver's tile is a warp tile).
    pub unit_threads: u32,
}

impl TiledPlan {
    pub fn threads(&self) -> u32 {
        self.units_e * self.units_h * self.unit_threads
    }

    /// Units (work items or warps) in the block.
    pub fn units(&self) -> u32 {
        self.units_e * self.units_h
    }
}

/// The loop structure of one matmul instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatmulShape {
    Gemv(GemvPlan),
    Tiled(TiledPlan),
}

/// An extent a launch is sized by, bound at call time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LaunchExtent {
    /// Tokens (matmul e).
    E,
    /// Output channels (matmul h).
    H,
    /// Query heads.
    Heads,
    /// KV heads.
    KvHeads,
    /// KV sequence splits: `ceil(s / keys_per_split)`.
    Splits,
    /// Head dimension.
    HeadDim,
    /// Query rows of a prefill: prompt tokens × query heads per KV head.
    PrefillRows,
    /// Exactly one group.
    One,
}

/// One NDRange dimension: `ceil(extent / per_group)` work groups of
/// `local` work items.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchDim {
    pub extent: LaunchExtent,
    pub per_group: u32,
    pub local: u32,
}

impl LaunchDim {
    /// The global size for a bound extent.
    pub fn global(&self, extent: usize) -> usize {
        extent.div_ceil(self.per_group as usize).max(1) * self.local as usize
    }
}

/// What a kernel argument is, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgKind {
    /// Global buffer of halves, read.
    HalfIn,
    /// Global buffer of halves, written.
    HalfOut,
    /// Global buffer of floats, read.
    FloatIn,
    /// Global buffer of floats, written.
    FloatOut,
    /// Global buffer of bytes, read.
    BytesIn,
    /// Global buffer of 128-bit chunks (`uint4`), read.
    ChunksIn,
    /// `image2d_t` of 128-bit texels, read.
    ImageIn,
    /// Global buffer of ints, written.
    IntOut,
    /// A 32-bit int by value.
    Int,
}

/// One kernel argument.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelArg {
    pub name: &'static str,
    pub kind: ArgKind,
}

const fn arg(name: &'static str, kind: ArgKind) -> KernelArg {
    KernelArg { name, kind }
}

/// Everything a printer needs for one matmul instance.
#[derive(Clone, Debug, PartialEq)]
pub struct MatmulPlan {
    /// The entry point's name (C identifier).
    pub entry: String,
    pub variant: Variant,
    pub shape: MatmulShape,
    pub weights: WeightPlan,
    pub memory: WeightMemory,
    /// Output format (f32 or f16).
    pub y_format: Format,
    pub bias: bool,
    pub activation: Activation,
    /// Arguments in order; ints are `e`, `h`, `l`.
    pub args: Vec<KernelArg>,
    /// NDRange dims 0..3.
    pub launch: [LaunchDim; 3],
}

fn unsupported(what: String) -> EmitError {
    EmitError::Unsupported {
        backend: "gpu",
        what,
    }
}

fn bad_tile(tile: &TileConfig, why: String) -> EmitError {
    EmitError::BadTile {
        tile: tile.summary(),
        why,
    }
}

/// The GPU caps of a target, or an error for CPU targets.
pub fn gpu_caps(caps: &TargetCaps) -> Result<GpuCaps, EmitError> {
    caps.gpu
        .ok_or_else(|| unsupported(format!("CPU target {} for a GPU kernel", caps.name)))
}

/// A C identifier from a kernel name (`matmul-w4a16` → `matmul_w4a16`).
pub fn c_ident(name: &str) -> String {
    let mut s: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    if s.starts_with(|c: char| c.is_ascii_digit()) || s.is_empty() {
        s.insert(0, 'k');
    }
    s
}

/// Is `w`'s layout the GPU layout `[l/lp, h, lp]` over its `(h, l)` dims?
fn is_gpu_layout(kernel: &Kernel, w: &str, h: &str, l: &str) -> bool {
    let Some(t) = kernel.tensor(w) else {
        return false;
    };
    let lp_of_l = |tile: &str| kernel.tile(tile).is_some_and(|tv| tv.axis == l);
    match t.layout.dims.as_slice() {
        [
            LayoutDim::Outer { axis, tile },
            LayoutDim::Whole(hh),
            LayoutDim::Inner { tile: inner },
        ] => {
            axis == l && hh == h && tile == inner && lp_of_l(tile) && !t.layout.int4_pair_transpose
        }
        _ => false,
    }
}

/// The same matmul kernel with its weights in the GPU layout `[l/lp, h,
/// lp]` (a `Kernel -> Kernel` pass): lets a CPU-family kernel such as
/// `matmul-f16` run on a GPU backend. The weight layout is a contract with
/// the packer, so this is explicit, never applied silently.
pub fn with_gpu_weight_layout(kernel: &Kernel) -> Result<Kernel, EmitError> {
    let mm = kernel
        .as_matmul()
        .ok_or_else(|| unsupported(format!("`{}` is not a matmul", kernel.name)))?;
    let lp = kernel
        .schedule
        .tiles
        .iter()
        .find(|t| t.axis == mm.l)
        .map(|t| t.name.clone())
        .ok_or_else(|| unsupported(format!("`{}` has no tile on `{}`", kernel.name, mm.l)))?;
    let mut out = kernel.clone();
    for t in &mut out.tensors {
        if t.name == mm.w {
            t.layout = tessera_dsl::Layout {
                dims: vec![
                    LayoutDim::Outer {
                        axis: mm.l.clone(),
                        tile: lp.clone(),
                    },
                    LayoutDim::Whole(mm.h.clone()),
                    LayoutDim::Inner { tile: lp.clone() },
                ],
                int4_pair_transpose: false,
                int4_signed_codes: false,
            };
        }
    }
    tessera_dsl::verify(&out).map_err(|e| unsupported(format!("GPU layout: {e}")))?;
    Ok(out)
}

/// Decide how a matmul kernel runs as `variant` for `tile` on `caps`.
pub fn plan_matmul(
    kernel: &Kernel,
    tile: &TileConfig,
    variant: Variant,
    caps: &TargetCaps,
    memory: WeightMemory,
) -> Result<MatmulPlan, EmitError> {
    let gpu = gpu_caps(caps)?;
    let mm = kernel
        .as_matmul()
        .ok_or_else(|| unsupported(format!("`{}` is not a matmul", kernel.name)))?;
    crate::artifact::unsigned_codes_only(
        kernel,
        "gpu",
        "the GPU dequantization (lop3/prmt, OpenCL's nibble masks) reads unsigned codes",
    )?;
    // Every variant's grid spreads rows and output channels over blocks.
    if let Some(why) = crate::schedule::matmul_split(kernel)
        .or_else(|| crate::schedule::gpu_grid(kernel, &[&mm.e, &mm.h], None))
    {
        return Err(unsupported(why));
    }
    let format_of = |name: &str| {
        kernel
            .tensor(name)
            .map(|t| t.format)
            .ok_or_else(|| unsupported(format!("missing tensor `{name}`")))
    };
    let x = format_of(&mm.x)?;
    if x != Format::F16 {
        return Err(unsupported(format!(
            "{x} activations (the GPU matmuls take f16 activations)"
        )));
    }
    let x_layout = &kernel.tensor(&mm.x).map(|t| t.layout.clone());
    if !x_layout
        .as_ref()
        .is_some_and(|lay| lay.is_row_major(&[&mm.e, &mm.l]))
    {
        return Err(unsupported("activations not row-major [e, l]".to_string()));
    }
    let weights = WeightPlan::for_format(format_of(&mm.w)?)?;
    if !is_gpu_layout(kernel, &mm.w, &mm.h, &mm.l) {
        return Err(unsupported(format!(
            "weights of `{}` not in the GPU layout [l/lp, h, lp] (see gpu::with_gpu_weight_layout)",
            kernel.name
        )));
    }
    let y_format = format_of(&mm.y)?;
    if !matches!(y_format, Format::F32 | Format::F16) {
        return Err(unsupported(format!("{y_format} output (f32 or f16)")));
    }
    if let Some(b) = &mm.epilogue.bias
        && format_of(b)? != Format::F32
    {
        return Err(unsupported("a bias that is not f32".to_string()));
    }
    if memory == WeightMemory::Image && weights.dequant == Dequant::None {
        return Err(unsupported(
            "f16 weights in an image (images hold packed integer codes)".to_string(),
        ));
    }
    let block = tile.block.ok_or_else(|| {
        bad_tile(
            tile,
            "no block tile: solve the tile for a GPU target".to_string(),
        )
    })?;
    if tile.ep == 0 || tile.hp == 0 || block.threads == 0 {
        return Err(bad_tile(tile, "zero-sized tile".to_string()));
    }
    let shape = match variant {
        Variant::Gemv => {
            // The solver's work items along h stay (consecutive h: coalesced
            // 128-bit loads); one row of e leaves the rest of the work group
            // free, so it splits l instead.
            let wg_h = block.units_h.max(1);
            let k_lanes = (gpu.max_threads_per_block / wg_h).max(1);
            let channels = match caps.arch {
                Arch::Ptx => ptx_gemv_channels(weights.bits),
                _ => 1,
            };
            MatmulShape::Gemv(GemvPlan {
                wg_h,
                k_lanes,
                channels,
                rows: 1,
            })
        }
        Variant::FlatGemm if caps.arch == Arch::Ptx && memory == WeightMemory::Buffer => {
            // The GEMV's work group (4 channels of h per warp row, the rest
            // of the block along l), several rows of e per thread.
            let wg_h = 4;
            MatmulShape::Gemv(GemvPlan {
                wg_h,
                k_lanes: (gpu.max_threads_per_block / wg_h).max(1),
                channels: if weights.bits < 16 { 2 } else { 4 },
                rows: ptx_flat_rows(tile.ep),
            })
        }
        Variant::FlatGemm | Variant::Gemm => {
            if memory == WeightMemory::Image {
                return Err(unsupported(format!(
                    "the image weight variant of {variant} (images serve the GEMV)"
                )));
            }
            if gpu.stages < 2 {
                return Err(bad_tile(
                    tile,
                    format!("{} stage(s): double buffering needs 2", gpu.stages),
                ));
            }
            let k_slice = block.k_slice;
            if k_slice == 0 || k_slice % weights.elems_per_load != 0 {
                return Err(bad_tile(
                    tile,
                    format!(
                        "k_slice {k_slice} is not a multiple of {} codes per load",
                        weights.elems_per_load
                    ),
                ));
            }
            // A tensor-core target's tile is a warp tile: its units are warps.
            let unit_threads = crate::target::mac_class(caps, kernel)
                .ok()
                .and_then(|class| caps.mac(class))
                .and_then(|instr| instr.mma)
                .map_or(1, |_| gpu.warp_width);
            let (ep, units_e, units_h) = if variant == Variant::FlatGemm {
                let ep = [8u32, 4, 2, 1]
                    .into_iter()
                    .find(|&d| d <= tile.ep)
                    .unwrap_or(1);
                let units_e = FLAT_GEMM_ROWS / ep;
                (ep, units_e, (block.threads / unit_threads / units_e).max(1))
            } else {
                (tile.ep, block.units_e, block.units_h)
            };
            let hp = tile.hp;
            let (tile_e, tile_h) = (units_e * ep, units_h * hp);
            let local_bytes = gpu.stages * k_slice * (tile_e + tile_h) * 2;
            if local_bytes > gpu.shared_mem_bytes {
                return Err(bad_tile(
                    tile,
                    format!(
                        "{local_bytes} bytes of local memory exceed {}",
                        gpu.shared_mem_bytes
                    ),
                ));
            }
            if units_e * units_h * unit_threads > gpu.max_threads_per_block {
                return Err(bad_tile(
                    tile,
                    format!(
                        "{} work items exceed {}",
                        units_e * units_h * unit_threads,
                        gpu.max_threads_per_block
                    ),
                ));
            }
            MatmulShape::Tiled(TiledPlan {
                ep,
                hp,
                units_e,
                units_h,
                tile_e,
                tile_h,
                k_slice,
                stages: gpu.stages,
                local_bytes,
                unit_threads,
            })
        }
    };
    let bias = mm.epilogue.bias.is_some();
    let mut args = vec![arg("x", ArgKind::HalfIn)];
    args.push(match (memory, weights.dequant) {
        (WeightMemory::Image, _) => arg("w", ArgKind::ImageIn),
        (_, Dequant::None) => arg("w", ArgKind::HalfIn),
        _ => arg("w", ArgKind::ChunksIn),
    });
    let param_kind = match weights.params {
        ParamType::F32 => ArgKind::FloatIn,
        ParamType::F16 => ArgKind::HalfIn,
    };
    if weights.has_scale {
        args.push(arg("scales", param_kind));
    }
    if weights.has_offset {
        args.push(arg("offsets", param_kind));
    }
    if bias {
        args.push(arg("bias", ArgKind::FloatIn));
    }
    args.push(arg(
        "y",
        if y_format == Format::F16 {
            ArgKind::HalfOut
        } else {
            ArgKind::FloatOut
        },
    ));
    args.extend([
        arg("e", ArgKind::Int),
        arg("h", ArgKind::Int),
        arg("l", ArgKind::Int),
    ]);
    let launch = match shape {
        MatmulShape::Gemv(g) => [
            LaunchDim {
                extent: LaunchExtent::H,
                per_group: g.wg_h * g.channels,
                local: g.wg_h,
            },
            LaunchDim {
                extent: LaunchExtent::One,
                per_group: 1,
                local: g.k_lanes,
            },
            LaunchDim {
                extent: LaunchExtent::E,
                per_group: g.rows,
                local: 1,
            },
        ],
        MatmulShape::Tiled(t) => [
            LaunchDim {
                extent: LaunchExtent::H,
                per_group: t.tile_h,
                local: t.threads(),
            },
            LaunchDim {
                extent: LaunchExtent::E,
                per_group: t.tile_e,
                local: 1,
            },
            LaunchDim {
                extent: LaunchExtent::One,
                per_group: 1,
                local: 1,
            },
        ],
    };
    let suffix = match (variant, memory) {
        (Variant::Gemv, WeightMemory::Image) => "gemv_image".to_string(),
        (v, _) => v.to_string().replace('-', "_"),
    };
    Ok(MatmulPlan {
        entry: format!("{}_{suffix}", c_ident(&kernel.name)),
        variant,
        shape,
        weights,
        memory,
        y_format,
        bias,
        activation: mm.epilogue.activation,
        args,
        launch,
    })
}

/// The K and V cache formats a GPU decode attention reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvFormat {
    F16,
    /// Asymmetric int8 with one (scale, offset) per cached row (token × KV
    /// head): score = scale·Σ q·k + offset·Σ q.
    I8AsymRow,
    /// fp8 e4m3 bytes, decoded with bit operations.
    Fp8E4M3,
    /// fp8 e5m2 bytes: the top byte of an f16, decoded by a shift.
    Fp8E5M2,
}

impl KvFormat {
    fn of(format: Format, tensor: &str) -> Result<KvFormat, EmitError> {
        match format {
            Format::F16 => Ok(KvFormat::F16),
            Format::I8Asym(Group::Row, ParamType::F32) => Ok(KvFormat::I8AsymRow),
            Format::Fp8E4M3 => Ok(KvFormat::Fp8E4M3),
            Format::Fp8E5M2 => Ok(KvFormat::Fp8E5M2),
            other => Err(unsupported(format!(
                "{other} for the {tensor} cache (f16, i8asym:row, fp8e4m3 or fp8e5m2)"
            ))),
        }
    }
}

/// Decode attention: two kernels, `<name>_partial` and `<name>_combine`.
///
/// Partial kernel: NDRange `(splits · wg, kv_heads)`, work group `wg`. A
/// work group owns `keys_per_split` consecutive keys of one KV head and
/// serves every query head of its GQA group in turn. Per head: work items
/// take keys `lid, lid + wg, ...`, compute the score (Q pre-scaled, f32)
/// into local memory and check `score − phi ∈ [lo, hi]`; a local reduction
/// gives the split's verdict. In range (the common case) `p = e^(x − phi)`
/// with the unified max, no max reduction; otherwise the split recomputes
/// with its own max `m` (the synchronized scheme). It writes its max (`phi`
/// or `m`), `Σ p` and `Σ p·v` (work items over d) to the partial buffers.
///
/// Combine kernel: NDRange `(d, heads, z)`: `M = max_j m_j`, `o = Σ_j
/// e^(m_j − M)·o_j / Σ_j e^(m_j − M)·l_j`. With unified maxima every
/// factor is 1: no split ever waited on another. Where the z block is
/// wider than one (PTX), thread z folds splits `z, z + Z, ...` and the
/// block folds its threads' results.
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionPlan {
    pub partial_entry: String,
    pub combine_entry: String,
    pub k: KvFormat,
    pub v: KvFormat,
    /// Work items per work group (also keys per trip).
    pub wg: u32,
    pub keys_per_split: u32,
    pub phi: f32,
    pub lo: f32,
    pub hi: f32,
    /// Q already carries 1/sqrt(d); otherwise the kernel applies it.
    pub q_prescaled: bool,
    pub partial_args: Vec<KernelArg>,
    pub combine_args: Vec<KernelArg>,
    pub partial_launch: [LaunchDim; 3],
    pub combine_launch: [LaunchDim; 3],
}

/// The K and V cache formats of attention `kernel` (op `a`), after the
/// checks every GPU attention program shares: row-major tensors, f16 q and
/// o, no int8 values.
fn attention_formats(kernel: &Kernel, a: &Attention) -> Result<(KvFormat, KvFormat), EmitError> {
    let format_of = |name: &str| {
        kernel
            .tensor(name)
            .map(|t| t.format)
            .ok_or_else(|| unsupported(format!("missing tensor `{name}`")))
    };
    for (name, dims) in [
        (&a.q, [&a.tokens, &a.heads, &a.head_dim]),
        (&a.k, [&a.seq, &a.kv_heads, &a.head_dim]),
        (&a.v, [&a.seq, &a.kv_heads, &a.head_dim]),
        (&a.o, [&a.tokens, &a.heads, &a.head_dim]),
    ] {
        let t = kernel
            .tensor(name)
            .ok_or_else(|| unsupported(format!("missing tensor `{name}`")))?;
        if !t.layout.is_row_major(&dims) {
            return Err(unsupported(format!("tensor `{name}` not row-major")));
        }
    }
    if format_of(&a.q)? != Format::F16 || format_of(&a.o)? != Format::F16 {
        return Err(unsupported("q and o must be f16".to_string()));
    }
    let k = KvFormat::of(format_of(&a.k)?, "key")?;
    let v = KvFormat::of(format_of(&a.v)?, "value")?;
    if v == KvFormat::I8AsymRow {
        return Err(unsupported(
            "int8 values (f16, fp8e4m3 or fp8e5m2)".to_string(),
        ));
    }
    Ok((k, v))
}

/// Decide how a decode attention kernel runs on `caps`: the split length,
/// work group and combine block per backend (below).
pub fn plan_attention(kernel: &Kernel, caps: &TargetCaps) -> Result<AttentionPlan, EmitError> {
    let gpu = gpu_caps(caps)?;
    let a = kernel
        .as_attention()
        .ok_or_else(|| unsupported(format!("`{}` is not attention", kernel.name)))?;
    if a.kind != AttentionKind::Decode {
        return Err(unsupported(
            "prefill attention in a decode program (OpenCL: a prefill program per head dim, \
             `prefill_program`; PTX: a tensor-core prefill program per head dim, \
             `prefill_program`)"
                .to_string(),
        ));
    }
    // Blocks over (splits of s, KV heads): split-K, so `split s` too.
    if let Some(why) = crate::schedule::gpu_grid(kernel, &[&a.kv_heads], Some(&a.seq)) {
        return Err(unsupported(why));
    }
    let (k, v) = attention_formats(kernel, a)?;
    let (phi, lo, hi) = match a.softmax {
        SoftmaxMode::Async { phi, lo, hi } => (phi, lo, hi),
        // Online: an empty range sends every split down the recompute
        // (synchronized) path, which is exactly the online softmax.
        SoftmaxMode::Online => (0.0, f32::INFINITY, f32::NEG_INFINITY),
    };
    if a.softmax != SoftmaxMode::Online && !(phi.is_finite() && lo.is_finite() && hi.is_finite()) {
        return Err(unsupported("non-finite softmax bounds".to_string()));
    }
    // The target's split (OpenCL: the interpreter's 64-key partial
    // vectors; PTX: 256 keys for 128 threads, measured).
    let split = gpu.attention;
    let (wg, keys_per_split, combine_warps) = (
        split.block.min(gpu.max_threads_per_block),
        split.keys_per_split,
        split.combine_warps,
    );
    let base = c_ident(&kernel.name);
    let mut partial_args = vec![arg("q", ArgKind::HalfIn)];
    partial_args.push(match k {
        KvFormat::F16 => arg("k", ArgKind::HalfIn),
        _ => arg("k", ArgKind::BytesIn),
    });
    if k == KvFormat::I8AsymRow {
        partial_args.push(arg("k_scales", ArgKind::FloatIn));
        partial_args.push(arg("k_offsets", ArgKind::FloatIn));
    }
    partial_args.push(match v {
        KvFormat::F16 => arg("v", ArgKind::HalfIn),
        _ => arg("v", ArgKind::BytesIn),
    });
    partial_args.extend([
        arg("part_o", ArgKind::FloatOut),
        arg("part_m", ArgKind::FloatOut),
        arg("part_l", ArgKind::FloatOut),
        arg("recomputed", ArgKind::IntOut),
        arg("hq", ArgKind::Int),
        arg("kvh", ArgKind::Int),
        arg("d", ArgKind::Int),
        arg("s", ArgKind::Int),
    ]);
    let combine_args = vec![
        arg("part_o", ArgKind::FloatIn),
        arg("part_m", ArgKind::FloatIn),
        arg("part_l", ArgKind::FloatIn),
        arg("o", ArgKind::HalfOut),
        arg("hq", ArgKind::Int),
        arg("d", ArgKind::Int),
        arg("splits", ArgKind::Int),
    ];
    let one = LaunchDim {
        extent: LaunchExtent::One,
        per_group: 1,
        local: 1,
    };
    Ok(AttentionPlan {
        partial_entry: format!("{base}_partial"),
        combine_entry: format!("{base}_combine"),
        k,
        v,
        wg,
        keys_per_split,
        phi,
        lo,
        hi,
        q_prescaled: a.q_prescaled,
        partial_args,
        combine_args,
        partial_launch: [
            LaunchDim {
                extent: LaunchExtent::Splits,
                per_group: 1,
                local: wg,
            },
            LaunchDim {
                extent: LaunchExtent::KvHeads,
                per_group: 1,
                local: 1,
            },
            one,
        ],
        combine_launch: [
            LaunchDim {
                extent: LaunchExtent::HeadDim,
                per_group: gpu.warp_width,
                local: gpu.warp_width,
            },
            LaunchDim {
                extent: LaunchExtent::Heads,
                per_group: 1,
                local: 1,
            },
            LaunchDim {
                extent: LaunchExtent::One,
                per_group: 1,
                local: combine_warps,
            },
        ],
    })
}

/// Causal prefill: one kernel, `<name>_prefill`, for one head dim.
///
/// NDRange `(⌈t·group / rows⌉ · rows, kv_heads)`, work group `rows`. Rows
/// are (query token, query head) pairs of one KV head, token-major, so the
/// heads of a GQA group share every K/V block and a row's causal limit
/// never falls as its index grows. Each work item owns one row: its q and
/// output accumulators (`d` floats each) stay in private memory, `d` a
/// compile-time constant so they can live in registers. The work group
/// loads blocks of `keys` K and V rows into local memory as f32 (formats
/// decoded once per block), up to its last row's causal limit (later
/// blocks are fully masked: never loaded); each work item then takes the
/// keys of the block it may see with the online softmax (max, rescale,
/// exp, P·V) in f32 (MNN-LLM 5.3).
#[derive(Clone, Debug, PartialEq)]
pub struct PrefillPlan {
    pub entry: String,
    pub k: KvFormat,
    pub v: KvFormat,
    /// Head dim (the program is built per head dim).
    pub d: u32,
    /// Query rows per work group, one per work item.
    pub rows: u32,
    /// Keys per local-memory block.
    pub keys: u32,
    /// Q already carries 1/sqrt(d); otherwise the kernel applies it.
    pub q_prescaled: bool,
    pub args: Vec<KernelArg>,
    /// `(⌈t·group / rows⌉ · rows, kv_heads, 1)`, work group `(rows, 1, 1)`.
    pub launch: [LaunchDim; 3],
}

/// Bytes of local memory a prefill work group's K and V blocks take.
pub const PREFILL_LOCAL_BYTES: u32 = 16 * 1024;

/// The largest head dim a prefill program takes (its private q and
/// accumulators are `d` floats each).
pub const PREFILL_MAX_HEAD_DIM: u32 = 256;

/// Decide how a causal prefill kernel runs on `caps` for head dim `d`: a
/// work group of query rows as large as the attention split's block, and
/// as many keys per block as [`PREFILL_LOCAL_BYTES`] holds (K and V as
/// f32).
pub fn plan_prefill_attention(
    kernel: &Kernel,
    caps: &TargetCaps,
    d: usize,
) -> Result<PrefillPlan, EmitError> {
    let gpu = gpu_caps(caps)?;
    let a = kernel
        .as_attention()
        .ok_or_else(|| unsupported(format!("`{}` is not attention", kernel.name)))?;
    if a.kind != AttentionKind::Prefill {
        return Err(unsupported(format!(
            "`{}` is decode attention (a prefill program needs a prefill kernel)",
            kernel.name
        )));
    }
    if a.softmax != SoftmaxMode::Online {
        return Err(unsupported(format!(
            "softmax {:?} in prefill (the GPU prefill runs the exact online softmax: declare `softmax online`)",
            a.softmax
        )));
    }
    // Work groups over KV heads (and blocks of query rows, which are
    // independent): `parallel kvh`, no split.
    if let Some(why) = crate::schedule::gpu_grid(kernel, &[&a.kv_heads], None) {
        return Err(unsupported(why));
    }
    let (k, v) = attention_formats(kernel, a)?;
    let d = u32::try_from(d)
        .ok()
        .filter(|&d| (1..=PREFILL_MAX_HEAD_DIM).contains(&d))
        .ok_or_else(|| {
            unsupported(format!(
                "head dim {d} in prefill (1 to {PREFILL_MAX_HEAD_DIM})"
            ))
        })?;
    let rows = gpu.attention.block.min(gpu.max_threads_per_block);
    let keys = (PREFILL_LOCAL_BYTES / (2 * 4 * d)).clamp(1, 32);
    let mut args = vec![arg("q", ArgKind::HalfIn)];
    args.push(match k {
        KvFormat::F16 => arg("k", ArgKind::HalfIn),
        _ => arg("k", ArgKind::BytesIn),
    });
    if k == KvFormat::I8AsymRow {
        args.push(arg("k_scales", ArgKind::FloatIn));
        args.push(arg("k_offsets", ArgKind::FloatIn));
    }
    args.push(match v {
        KvFormat::F16 => arg("v", ArgKind::HalfIn),
        _ => arg("v", ArgKind::BytesIn),
    });
    args.extend([
        arg("o", ArgKind::HalfOut),
        arg("t", ArgKind::Int),
        arg("s", ArgKind::Int),
        arg("hq", ArgKind::Int),
        arg("kvh", ArgKind::Int),
    ]);
    Ok(PrefillPlan {
        entry: format!("{}_prefill", c_ident(&kernel.name)),
        k,
        v,
        d,
        rows,
        keys,
        q_prescaled: a.q_prescaled,
        args,
        launch: [
            LaunchDim {
                extent: LaunchExtent::PrefillRows,
                per_group: rows,
                local: rows,
            },
            LaunchDim {
                extent: LaunchExtent::KvHeads,
                per_group: 1,
                local: 1,
            },
            LaunchDim {
                extent: LaunchExtent::One,
                per_group: 1,
                local: 1,
            },
        ],
    })
}

#[cfg(test)]
mod tests {
    use super::ptx_flat_rows;

    #[test]
    fn flat_rows_round_the_tile_up_to_a_power_of_two_at_most_four() {
        let got: Vec<u32> = (0..=9).map(ptx_flat_rows).collect();
        assert_eq!(got, [1, 1, 2, 4, 4, 4, 4, 4, 4, 4]);
    }
}
