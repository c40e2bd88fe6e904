//! Target descriptions: what the tile solver and the emitters need to know
//! about a machine, as plain data.
//!
//! A [`TargetCaps`] lists the register file, the multiply-accumulate
//! instructions per operand class ([`MacClass`]) with the shapes of their
//! operands and accumulators, the registers the emitter keeps for itself,
//! and for GPUs the per-thread budget, shared memory and `mma` fragments.
//! Every number an emitter would otherwise hard-code lives here, so a tile
//! is always derived, never chosen by a constant in an emitter.
//!
//! # The register accounting one [`MacInstr`] defines
//!
//! One instruction updates an *accumulator unit*: `ae` rows of e (tokens) by
//! `ah` columns of h (output channels), reduced over `lp` elements of l, in
//! `acc_regs` registers. Its A operand (activations) comes in units of
//! `a_rows` rows × `lp` held in `a_regs` registers, its B operand (weights)
//! in units of `b_cols` columns × `lp` in `b_regs` registers. A tile
//! `ep × hp` (ep a multiple of `ae`, hp of `ah`) then needs
//!
//! ```text
//!   accumulators = (ep/ae)·(hp/ah)·acc_regs
//!   a_regs       = ceil(ep/a_rows)·a_regs      (one lp-slice of the ep rows)
//!   b_regs       = ceil(hp/b_cols)·b_regs      (one lp-slice of the hp columns)
//! ```
//!
//! plus the target's and the instruction's reserved registers. The units per
//! instruction (CPU registers are vector registers, GPU registers are 32-bit):
//!
//! | target / instr | ae×ah | lp | A unit | B unit |
//! |---|---|---|---|---|
//! | `sdot v.4s, v.16b, v.4b[i]` | 1×4 | 4 | 4 rows × 4 int8 = 1 reg (row picked by lane index) | 4 cols × 4 int8 = 1 reg |
//! | `smmla v.4s, v.16b, v.16b` | 2×2 | 8 | 2 rows × 8 int8 = 1 reg | 2 cols × 8 int8 = 1 reg |
//! | `fmla v.4s, v.4s, v.s[i]` | 1×4 | 1 | 4 rows = 1 reg (lane index) | 4 cols = 1 reg |
//! | `fmla v.8h, v.8h, v.h[i]` | 1×8 | 1 | 8 rows = 1 reg (lane index) | 8 cols = 1 reg |
//! | `smull`+`smlal2`+`sadalp` | 1×1 | 16 | 1 row × 16 int8 = 1 reg | 1 col × 16 int8 = 1 reg |
//! | `vfmadd231ps ymm` | 1×8 | 1 | every row broadcast in turn = 1 reg (a_rows 16) | 8 cols = 1 reg |
//! | `vpmaddubsw`+`vpmaddwd` ymm | 1×8 | 4 | every row's 4 bytes broadcast in turn = 1 reg (a_rows 16) | 8 cols × 4 int8 = 1 reg |
//! | `vfmadd231ps zmm` | 1×16 | 1 | every row broadcast in turn = 1 reg (a_rows 32) | 16 cols = 1 reg |
//! | `vpdpbusd zmm` | 1×16 | 4 | 1 row's 4 bytes broadcast = 1 reg | 16 cols × 4 int8 = 1 reg |
//! | OpenCL `mad` float4 | 1×4 (4 regs) | 4 | 1 row × float4 = 4 regs | 4 cols × float4 = 16 regs |
//! | OpenCL `mad` half4, f32 accumulate | 1×4 (4 regs) | 4 | 1 row × half4 = 2 regs | 4 cols × half4 = 8 regs |
//! | PTX `fma.rn.f32` | 1×1 (1 reg) | 1 | 1 row = 1 reg | 1 col = 1 reg |
//! | PTX `mma.m16n8k16` f16 | 8×16 (4 regs) | 16 | 8 rows × 16 = mma B fragment, 2 regs | 16 cols × 16 = mma A fragment, 4 regs |
//! | PTX `mma.m16n8k32` s8 | 8×16 (4 regs) | 32 | 8 rows × 32 = mma B fragment, 2 regs | 16 cols × 32 = mma A fragment, 4 regs |
//!
//! On x86 there is no by-element multiply, so an A row is broadcast to a
//! whole register. The x86 f32 loops and the x86-avx2 int8 loop broadcast
//! each row into one renamed register just before its MACs, so they count
//! one A register whatever ep (`a_rows` 16, or 32 on zmm); `vpdpbusd zmm`
//! still counts one register per row (MNN-LLM's own `ep + hp + ep·hp`,
//! formula (3), in register units). On PTX the tile is a warp tile and e sits on the `mma` n side (8), h on the m side (16): the
//! FlashDecoding++ flat-GEMM layout, so a small M pads to 8, not 16.

use std::fmt;

use serde::Serialize;
use tessera_dsl::interp::ONLINE_BLOCK;
use tessera_dsl::{Format, Kernel};

/// The operand class a MAC instruction works on; what a kernel's formats
/// need is given by [`mac_class`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MacClass {
    /// fp32 multiply-add (also bf16 and f16 widened to f32, and weights
    /// dequantized to f32 in the loop).
    F32,
    /// fp16 multiply-add.
    F16,
    /// int8 × int8 → int32 (dynamic int8 activations × integer weights).
    Int8,
}

impl fmt::Display for MacClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MacClass::F32 => "f32",
            MacClass::F16 => "f16",
            MacClass::Int8 => "int8",
        })
    }
}

impl MacClass {
    /// Bytes of one operand element as the MAC reads it (weights unpacked
    /// to this width before use).
    pub fn operand_bytes(self) -> u32 {
        match self {
            MacClass::F32 => 4,
            MacClass::F16 => 2,
            MacClass::Int8 => 1,
        }
    }
}

/// Registers an emitter keeps out of the tile, and what for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Reserved {
    pub regs: u32,
    pub purpose: &'static str,
}

/// A PTX `mma.sync` shape with its per-thread fragment register counts
/// (32-bit registers, warp of 32 threads).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct MmaShape {
    pub name: &'static str,
    pub m: u32,
    pub n: u32,
    pub k: u32,
    /// A fragment (m×k) registers per thread.
    pub a_regs: u32,
    /// B fragment (k×n) registers per thread.
    pub b_regs: u32,
    /// C/D fragment (m×n) registers per thread.
    pub c_regs: u32,
}

/// One multiply-accumulate instruction (or fixed instruction sequence) and
/// the shapes the solver counts with; see the module doc for the units.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct MacInstr {
    /// Mnemonic(s) as the emitter writes them.
    pub name: &'static str,
    pub class: MacClass,
    /// Accumulator unit: rows of e.
    pub ae: u32,
    /// Accumulator unit: columns of h.
    pub ah: u32,
    /// Registers one accumulator unit occupies.
    pub acc_regs: u32,
    /// Reduction width: elements of l one instruction consumes (formula (4)).
    pub lp: u32,
    /// Rows of A (× lp) one A unit holds.
    pub a_rows: u32,
    /// Registers one A unit occupies.
    pub a_regs: u32,
    /// Columns of B (× lp) one B unit holds.
    pub b_cols: u32,
    /// Registers one B unit occupies.
    pub b_regs: u32,
    /// Temporaries this instruction sequence needs besides its operands.
    pub reserved: &'static [Reserved],
    /// The warp-level `mma` shape for PTX tensor-core instructions.
    pub mma: Option<MmaShape>,
    /// Registers per accumulator unit that hold one quantization group's
    /// integer partial sums when the weights are grouped (`u4asym:g32`), so
    /// the group's scale can be applied in f32 before the next group. 0 where
    /// the emitter folds group sums through memory or needs none (the ARM
    /// rows of Table 2). When non-zero, the grouped loop keeps every column
    /// block's B and broadcasts one A row at a time, so A counts one unit.
    pub group_sums: u32,
    /// Registers per accumulator unit that hold a grouped GEMV's f32
    /// partial sums (e = 1, weights in groups along l), so a group end
    /// applies its scale into a register instead of a load, FMA and store
    /// of stack partials. 1 for NEON's `sdot` (the GEMV of the dotprod and
    /// i8mm targets), 0 elsewhere.
    pub gemv_partial_sums: u32,
    /// The same for a grouped GEMM tile (e above the flat-GEMM rows): 1
    /// for NEON's `smmla` and `sdot`, whose 10×4×8 and 12×4×4 tiles then
    /// hold 10 or 12 accumulators and as many partial sums where 10×8 and
    /// 12×8 moved 20 or 24 partials through the stack every group; 0
    /// elsewhere. The flat GEMM keeps stack partials: its row blocks take
    /// turns within a K block.
    pub gemm_partial_sums: u32,
    /// The GEMM loop can take pair-transposed 4-bit weights in 16-code
    /// blocks (hp·lp = 16), one 16-byte load serving two lp-steps (low
    /// nibbles, then high): NEON's `sdot`, whose 12×4×4 tile then fits its
    /// partial sums beside 12 accumulators.
    pub paired_nibble_steps: bool,
}

impl MacInstr {
    pub fn reserved_regs(&self) -> u32 {
        self.reserved.iter().map(|r| r.regs).sum()
    }
}

/// What only GPU targets have.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct GpuCaps {
    /// Warp (CUDA) or sub-group (OpenCL) width in threads.
    pub warp_width: u32,
    /// Most threads (work-items) per block the emitter launches.
    pub max_threads_per_block: u32,
    /// Shared (CUDA) / local (OpenCL) memory per block, bytes.
    pub shared_mem_bytes: u32,
    /// Hardware limit of 32-bit registers per thread (the solver's budget,
    /// [`TargetCaps::registers`], is kept below it for occupancy).
    pub max_regs_per_thread: u32,
    /// Elements of l staged into shared memory per pipeline stage.
    pub k_slice: u32,
    /// Pipeline stages of K slices resident in shared memory (2: double
    /// buffering, the next slice loads while this one computes).
    pub stages: u32,
    /// Blocks a tiled (tensor-core) grid should have so every SM holds a
    /// few: the solver ranks a tile whose grid has fewer as that many times
    /// slower (0: no floor). Two per SM of the largest part of the
    /// generation (132-SM H100/H200, 108-SM A100).
    pub min_blocks: u32,
    /// How decode attention splits the KV sequence on this target.
    pub attention: AttentionCaps,
}

/// Decode attention's split on a GPU target (see `gpu::plan_attention`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct AttentionCaps {
    /// Threads per block of the partial kernel.
    pub block: u32,
    /// Keys per split (one partial per split and head).
    pub keys_per_split: u32,
    /// Threads in z of the combine kernel's block, each folding every
    /// `combine_warps`-th split (1: one thread folds them all).
    pub combine_warps: u32,
}

/// OpenCL's split: the interpreter's partial-vector block ([`ONLINE_BLOCK`]
/// keys), one
/// work item per key per trip, so its partials are the interpreter's.
const OPENCL_ATTENTION: AttentionCaps = AttentionCaps {
    block: ONLINE_BLOCK as u32,
    keys_per_split: ONLINE_BLOCK as u32,
    combine_warps: 1,
};

/// PTX's split, measured on an H200 (`cuda_bench attention-plans`,
/// docs/PERFORMANCE.md): 256 keys for 128 threads, and 8 warps folding
/// the partials (64-key splits left the combine s/64 partials to fold
/// one L2 round trip at a time).
const PTX_ATTENTION: AttentionCaps = AttentionCaps {
    block: 128,
    keys_per_split: 256,
    combine_warps: 8,
};

/// Instruction-set family of a target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Arch {
    Aarch64,
    X86_64,
    OpenCl,
    Ptx,
}

/// Everything the solver and the emitters need to know about one target.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TargetCaps {
    /// The name the CLI accepts (`aarch64-i8mm`).
    pub name: &'static str,
    pub arch: Arch,
    /// The solver's register budget R: vector registers on a CPU, 32-bit
    /// registers per thread on a GPU.
    pub registers: u32,
    /// Width of one register in bits.
    pub register_bits: u32,
    /// MAC instructions, preferred first within each class.
    pub macs: &'static [MacInstr],
    /// Registers the emitter keeps whatever the tile.
    pub reserved: &'static [Reserved],
    /// Feature names (`dotprod`, `i8mm`, `fp16`, `avx2`, `fma`, `avx512vnni`, `sm_80` ...).
    pub features: &'static [&'static str],
    pub gpu: Option<GpuCaps>,
}

/// A target name the CLI does not know.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown target `{name}`; valid targets: {}", TargetCaps::names().join(", "))]
pub struct UnknownTarget {
    pub name: String,
}

/// A kernel whose formats a target (or Tessera) has no MAC path for.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ClassError {
    #[error("kernel `{kernel}` is not a matmul; the tile solver handles matmuls")]
    NotMatmul { kernel: String },
    #[error("kernel `{kernel}`: tensor `{tensor}` is missing")]
    MissingTensor { kernel: String, tensor: String },
    #[error(
        "target {target} has no MAC path for activations {x} with weights {w} (needs the {class} class); \
         it supports: {supported}"
    )]
    Unsupported {
        target: &'static str,
        x: Format,
        w: Format,
        class: String,
        supported: String,
    },
}

impl TargetCaps {
    /// Every target, in the order the CLI lists them.
    pub fn all() -> &'static [TargetCaps] {
        ALL
    }

    pub fn names() -> Vec<&'static str> {
        ALL.iter().map(|t| t.name).collect()
    }

    pub fn by_name(name: &str) -> Result<&'static TargetCaps, UnknownTarget> {
        ALL.iter()
            .find(|t| t.name == name)
            .ok_or_else(|| UnknownTarget {
                name: name.to_string(),
            })
    }

    /// The preferred MAC instruction of a class, if the target has one.
    pub fn mac(&self, class: MacClass) -> Option<&'static MacInstr> {
        self.macs.iter().find(|m| m.class == class)
    }

    /// Registers reserved whatever the instruction.
    pub fn reserved_regs(&self) -> u32 {
        self.reserved.iter().map(|r| r.regs).sum()
    }

    pub fn has_feature(&self, feature: &str) -> bool {
        self.features.contains(&feature)
    }

    /// The same target with another register budget (what-if studies and
    /// property tests).
    pub fn with_registers(&self, registers: u32) -> TargetCaps {
        TargetCaps {
            registers,
            ..self.clone()
        }
    }

    /// The classes this target can run, in [`MacClass`] order.
    pub fn classes(&self) -> Vec<MacClass> {
        let mut v: Vec<MacClass> = self.macs.iter().map(|m| m.class).collect();
        v.sort();
        v.dedup();
        v
    }

    /// Human-readable list of the (activation × weight) format families this
    /// target runs, for error messages.
    pub fn supported_formats(&self) -> String {
        let mut parts =
            vec!["f32/bf16 x with f32, f16, bf16 or 4/8-bit integer weights".to_string()];
        parts.push(if self.mac(MacClass::F16).is_some() {
            "f16 x (f16 MAC)".to_string()
        } else {
            "f16 x (widened to f32)".to_string()
        });
        if self.mac(MacClass::Int8).is_some() {
            parts.push("i8dyn x with u4asym, u4sym, i8sym or i8asym weights".to_string());
        }
        parts.join("; ")
    }
}

/// Rows of e one accumulator unit of `kernel`'s MAC covers on `caps` (2
/// for `smmla`'s 2×2 blocks, else 1): every tile's ep is a multiple of it,
/// so a tile for M rows has ep = M rounded up to it. 1 when the target has
/// no MAC for the kernel (nothing to round).
pub fn row_unit(caps: &TargetCaps, kernel: &Kernel) -> u32 {
    mac_class(caps, kernel)
        .ok()
        .and_then(|class| caps.mac(class))
        .map_or(1, |mac| mac.ae.max(1))
}

/// The MAC class a matmul kernel needs on `caps`, from its x and w formats:
///
/// - `i8dyn` x with integer weights (`u4asym`, `i8sym`, `i8asym`): int8
///   (W4A8, W8A8), if the target has an int8 path;
/// - `f16` x: f16 where the target multiplies in f16, else f32 (widened);
///   this is where W4A16 lands;
/// - `f32` / `bf16` x: f32 (bf16 widens exactly);
/// - weights in a float or 4/8-bit integer format for float x (dequantized
///   in the loop, `e0m4` by shift-and-OR).
///
/// Anything else (fp8 operands, `i8dyn` x with float weights, int8 on a
/// target without an int8 path) is an error naming the formats and listing
/// what the target supports.
pub fn mac_class(caps: &TargetCaps, kernel: &Kernel) -> Result<MacClass, ClassError> {
    let mm = kernel.as_matmul().ok_or_else(|| ClassError::NotMatmul {
        kernel: kernel.name.clone(),
    })?;
    let format_of = |name: &str| {
        kernel
            .tensor(name)
            .map(|t| t.format)
            .ok_or_else(|| ClassError::MissingTensor {
                kernel: kernel.name.clone(),
                tensor: name.to_string(),
            })
    };
    let x = format_of(&mm.x)?;
    let w = format_of(&mm.w)?;
    let unsupported = |class: &str| ClassError::Unsupported {
        target: caps.name,
        x,
        w,
        class: class.to_string(),
        supported: caps.supported_formats(),
    };
    let float_weights = matches!(
        w,
        Format::F32
            | Format::F16
            | Format::BF16
            | Format::U4Asym(..)
            | Format::U4Sym(..)
            | Format::I8Sym(..)
            | Format::I8Asym(..)
            | Format::E0M4(..)
    );
    match x {
        Format::I8Dyn => match w {
            Format::U4Asym(..) | Format::U4Sym(..) | Format::I8Sym(..) | Format::I8Asym(..) => caps
                .mac(MacClass::Int8)
                .map(|_| MacClass::Int8)
                .ok_or_else(|| unsupported("int8")),
            _ => Err(unsupported("int8")),
        },
        Format::F16 if float_weights => Ok(if caps.mac(MacClass::F16).is_some() {
            MacClass::F16
        } else {
            MacClass::F32
        }),
        Format::F32 | Format::BF16 if float_weights => caps
            .mac(MacClass::F32)
            .map(|_| MacClass::F32)
            .ok_or_else(|| unsupported("f32")),
        _ => Err(unsupported("none")),
    }
}

// ---------------------------------------------------------------- targets

const NONE: &[Reserved] = &[];

/// The 4-bit weight unpack (seed 000 IV.D: `and` with 0x0F and a shift)
/// keeps its mask resident and stages the packed bytes in one register
/// before splitting them into two B registers. Reserved for every class so
/// one emitter skeleton serves all weight formats. The epilogue (scales,
/// zero-point `min·Σx`, bias) runs after the reduction and reuses the A and
/// B registers, so it reserves nothing.
const CPU_RESERVED: &[Reserved] = &[
    Reserved {
        regs: 1,
        purpose: "0x0F nibble mask for the int4 unpack",
    },
    Reserved {
        regs: 1,
        purpose: "packed int4 weight bytes before unpacking",
    },
];

const SMULL_TEMP: &[Reserved] = &[Reserved {
    regs: 1,
    purpose: "int16 products of smull/smlal2 before sadalp",
}];

/// x86-avx2's int8 MAC: its own two temporaries plus the 4-bit unpack's
/// two registers, which only this class needs (on x86 the float class
/// reserves none, see [`VFMADD_YMM`]).
const VPMADD_TEMPS: &[Reserved] = &[
    Reserved {
        regs: 1,
        purpose: "int16 pair sums of vpmaddubsw before vpmaddwd",
    },
    Reserved {
        regs: 1,
        purpose: "int16 ones vector for vpmaddwd",
    },
    Reserved {
        regs: 1,
        purpose: "0x0F nibble mask for the int4 unpack",
    },
    Reserved {
        regs: 1,
        purpose: "packed int4 weight bytes before unpacking",
    },
];

const OPENCL_RESERVED: &[Reserved] = &[Reserved {
    regs: 8,
    purpose: "global/local ids, buffer offsets, loop counter, group index",
}];

const PTX_RESERVED: &[Reserved] = &[Reserved {
    regs: 16,
    purpose: "64-bit global pointers, shared-memory offsets, lane/warp ids, loop counters",
}];

const FMLA_4S: MacInstr = MacInstr {
    name: "fmla .4s (by element)",
    class: MacClass::F32,
    ae: 1,
    ah: 4,
    acc_regs: 1,
    lp: 1,
    a_rows: 4,
    a_regs: 1,
    b_cols: 4,
    b_regs: 1,
    reserved: NONE,
    mma: None,
    group_sums: 0,
    gemv_partial_sums: 0,
    gemm_partial_sums: 0,
    paired_nibble_steps: false,
};

const FMLA_8H: MacInstr = MacInstr {
    name: "fmla .8h (by element)",
    class: MacClass::F16,
    ae: 1,
    ah: 8,
    acc_regs: 1,
    lp: 1,
    a_rows: 8,
    a_regs: 1,
    b_cols: 8,
    b_regs: 1,
    reserved: NONE,
    mma: None,
    group_sums: 0,
    gemv_partial_sums: 0,
    gemm_partial_sums: 0,
    paired_nibble_steps: false,
};

/// Without dotprod: each (row, column) pair multiplies 16 int8 along l with
/// `smull` (low 8) and `smlal2` (high 8) into int16 (|127·15·2| and
/// |127·127·2| both fit), then `sadalp` folds the pairs into 4 int32 lanes
/// of that pair's accumulator; the lanes are summed with `addp` in the
/// epilogue. So one accumulator register per output element (1×1) and
/// lp = 16 (one full register of int8 along l).
const SMULL_SADALP: MacInstr = MacInstr {
    name: "smull+smlal2+sadalp",
    class: MacClass::Int8,
    ae: 1,
    ah: 1,
    acc_regs: 1,
    lp: 16,
    a_rows: 1,
    a_regs: 1,
    b_cols: 1,
    b_regs: 1,
    reserved: SMULL_TEMP,
    mma: None,
    group_sums: 0,
    gemv_partial_sums: 0,
    gemm_partial_sums: 0,
    paired_nibble_steps: false,
};

const SDOT: MacInstr = MacInstr {
    name: "sdot .4s (by element)",
    class: MacClass::Int8,
    ae: 1,
    ah: 4,
    acc_regs: 1,
    lp: 4,
    a_rows: 4,
    a_regs: 1,
    b_cols: 4,
    b_regs: 1,
    reserved: NONE,
    mma: None,
    group_sums: 0,
    gemv_partial_sums: 1,
    gemm_partial_sums: 1,
    paired_nibble_steps: true,
};

const SMMLA: MacInstr = MacInstr {
    name: "smmla .4s",
    class: MacClass::Int8,
    ae: 2,
    ah: 2,
    acc_regs: 1,
    lp: 8,
    a_rows: 2,
    a_regs: 1,
    b_cols: 2,
    b_regs: 1,
    reserved: NONE,
    mma: None,
    group_sums: 0,
    gemv_partial_sums: 0,
    gemm_partial_sums: 1,
    paired_nibble_steps: false,
};

/// x86 has no by-element FMA, so each row's activation is broadcast
/// (`vpbroadcastd` from memory) into a register the row's FMAs consume at
/// once; the next row's broadcast reuses that register and renaming keeps
/// the rows independent. One A unit therefore serves every row a tile can
/// have (a_rows = the 16 registers), and the loop reserves nothing: the
/// n-tail mask and the bias temporary of the epilogue reuse the A and B
/// registers after the loop.
const VFMADD_YMM: MacInstr = MacInstr {
    name: "vfmadd231ps ymm",
    class: MacClass::F32,
    ae: 1,
    ah: 8,
    acc_regs: 1,
    lp: 1,
    a_rows: 16,
    a_regs: 1,
    b_cols: 8,
    b_regs: 1,
    reserved: NONE,
    mma: None,
    group_sums: 0,
    gemv_partial_sums: 0,
    gemm_partial_sums: 0,
    paired_nibble_steps: false,
};

/// `vpmaddubsw` multiplies unsigned by signed bytes: the u4 weight codes are
/// the unsigned operand, the int8 activations the signed one (no +128
/// shift). Pairs land in int16, `vpmaddwd` with ones sums them to int32:
/// four bytes of l per int32 lane, lp = 4. As in the float loop, each row's
/// four codes are broadcast into one renamed register just before their
/// MACs, so A counts one whatever ep (a_rows 16). With grouped weights
/// (W4A8) the registers hold the current group's integer sums (the
/// accumulators) and the loop folds them into f32 totals kept in the stack
/// frame at each group end, so group sums take no extra registers.
const VPMADD_YMM: MacInstr = MacInstr {
    name: "vpmaddubsw+vpmaddwd+vpaddd ymm",
    class: MacClass::Int8,
    ae: 1,
    ah: 8,
    acc_regs: 1,
    lp: 4,
    a_rows: 16,
    a_regs: 1,
    b_cols: 8,
    b_regs: 1,
    reserved: VPMADD_TEMPS,
    mma: None,
    group_sums: 0,
    gemv_partial_sums: 0,
    gemm_partial_sums: 0,
    paired_nibble_steps: false,
};

/// The AVX-512 f32 kernel (`x86::avx512`) counts as [`VFMADD_YMM`] does:
/// each row's x[k] is broadcast (`vbroadcastss zmm` from memory) into one
/// register its FMAs consume at once, renamed per row, so one A unit
/// serves every row (a_rows = the 32 registers); nothing is reserved (the
/// epilogue's bias temporary and relu zero take registers the accumulators
/// leave, which the kernel's plan checks).
const VFMADD_ZMM: MacInstr = MacInstr {
    name: "vfmadd231ps zmm",
    class: MacClass::F32,
    ae: 1,
    ah: 16,
    acc_regs: 1,
    lp: 1,
    a_rows: 32,
    a_regs: 1,
    b_cols: 16,
    b_regs: 1,
    reserved: NONE,
    mma: None,
    group_sums: 0,
    gemv_partial_sums: 0,
    gemm_partial_sums: 0,
    paired_nibble_steps: false,
};

/// As the AVX-512 int8 kernel (`x86::avx512_int8`) runs it: each
/// `vpdpbusd` reads its row's 4 codes with a `{1to16}` broadcast, so A
/// counts the one register the group tail converts Σq into; grouped
/// weights (W4A8) keep one i32 group-sum register per accumulator; the
/// 4-bit unpack keeps nothing resident (its 0x0F mask is a memory
/// broadcast, its lane select an opmask), so nothing is reserved.
const VPDPBUSD_ZMM: MacInstr = MacInstr {
    name: "vpdpbusd zmm",
    class: MacClass::Int8,
    ae: 1,
    ah: 16,
    acc_regs: 1,
    lp: 4,
    a_rows: 1,
    a_regs: 1,
    b_cols: 16,
    b_regs: 1,
    reserved: NONE,
    mma: None,
    group_sums: 1,
    gemv_partial_sums: 0,
    gemm_partial_sums: 0,
    paired_nibble_steps: false,
};

const CL_MAD_FLOAT4: MacInstr = MacInstr {
    name: "mad float4",
    class: MacClass::F32,
    ae: 1,
    ah: 4,
    acc_regs: 4,
    lp: 4,
    a_rows: 1,
    a_regs: 4,
    b_cols: 4,
    b_regs: 16,
    reserved: NONE,
    mma: None,
    group_sums: 0,
    gemv_partial_sums: 0,
    gemm_partial_sums: 0,
    paired_nibble_steps: false,
};

const CL_MAD_HALF4: MacInstr = MacInstr {
    name: "mad half4 (float accumulators)",
    class: MacClass::F16,
    ae: 1,
    ah: 4,
    acc_regs: 4,
    lp: 4,
    a_rows: 1,
    a_regs: 2,
    b_cols: 4,
    b_regs: 8,
    reserved: NONE,
    mma: None,
    group_sums: 0,
    gemv_partial_sums: 0,
    gemm_partial_sums: 0,
    paired_nibble_steps: false,
};

const PTX_FMA_F32: MacInstr = MacInstr {
    name: "fma.rn.f32",
    class: MacClass::F32,
    ae: 1,
    ah: 1,
    acc_regs: 1,
    lp: 1,
    a_rows: 1,
    a_regs: 1,
    b_cols: 1,
    b_regs: 1,
    reserved: NONE,
    mma: None,
    group_sums: 0,
    gemv_partial_sums: 0,
    gemm_partial_sums: 0,
    paired_nibble_steps: false,
};

/// m16n8k16 f16 with f32 accumulators: A (16×16 f16) 8 halves per thread =
/// 4 registers of f16x2, B (16×8) 2 registers, C (16×8 f32) 4 registers.
pub const MMA_M16N8K16_F16: MmaShape = MmaShape {
    name: "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
    m: 16,
    n: 8,
    k: 16,
    a_regs: 4,
    b_regs: 2,
    c_regs: 4,
};

/// m16n8k32 s8 with s32 accumulators: A (16×32 s8) 16 bytes per thread = 4
/// registers, B (32×8) 2 registers, C (16×8 s32) 4 registers.
pub const MMA_M16N8K32_S8: MmaShape = MmaShape {
    name: "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32",
    m: 16,
    n: 8,
    k: 32,
    a_regs: 4,
    b_regs: 2,
    c_regs: 4,
};

/// The tile is a warp tile; e (tokens) is the mma n side, h the m side, so
/// A-operand units (activations) are mma B fragments and B-operand units
/// (weights) are mma A fragments.
const fn mma_instr(name: &'static str, class: MacClass, shape: MmaShape) -> MacInstr {
    MacInstr {
        name,
        class,
        ae: shape.n,
        ah: shape.m,
        acc_regs: shape.c_regs,
        lp: shape.k,
        a_rows: shape.n,
        a_regs: shape.b_regs,
        b_cols: shape.m,
        b_regs: shape.a_regs,
        reserved: NONE,
        mma: Some(shape),
        group_sums: 0,
        gemv_partial_sums: 0,
        gemm_partial_sums: 0,
        paired_nibble_steps: false,
    }
}

const PTX_MMA_F16: MacInstr = mma_instr("mma.sync m16n8k16 f16", MacClass::F16, MMA_M16N8K16_F16);
const PTX_MMA_S8: MacInstr = mma_instr("mma.sync m16n8k32 s8", MacClass::Int8, MMA_M16N8K32_S8);

/// Budget 128 of the 255 registers a thread may have: 65536 registers per
/// SM then hold 512 threads, enough warps to hide shared-memory latency;
/// `ptxas -v` checks the emitted kernel stays within it.
const PTX_BUDGET: u32 = 128;

/// x86-64 with AVX2 and FMA (16 ymm of 256 bits): the float emitter's
/// ymm register file takes its register count and lane count from here.
pub const X86_AVX2: TargetCaps = TargetCaps {
    name: "x86-avx2",
    arch: Arch::X86_64,
    registers: 16,
    register_bits: 256,
    macs: &[VFMADD_YMM, VPMADD_YMM],
    reserved: NONE,
    features: &["avx2", "fma", "f16c"],
    gpu: None,
};

/// x86-64 with AVX-512 (32 zmm of 512 bits): the float emitter's zmm
/// register file (`x86::avx512`) and the `x86::avx512_int8` emitter take
/// their register count and lane count from here.
pub const X86_AVX512: TargetCaps = TargetCaps {
    name: "x86-avx512",
    arch: Arch::X86_64,
    registers: 32,
    register_bits: 512,
    macs: &[VFMADD_ZMM, VPDPBUSD_ZMM],
    reserved: NONE,
    features: &["avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vnni"],
    gpu: None,
};

static ALL: &[TargetCaps] = &[
    TargetCaps {
        name: "aarch64-neon",
        arch: Arch::Aarch64,
        registers: 32,
        register_bits: 128,
        macs: &[FMLA_4S, SMULL_SADALP],
        reserved: CPU_RESERVED,
        features: &["neon"],
        gpu: None,
    },
    TargetCaps {
        name: "aarch64-fp16",
        arch: Arch::Aarch64,
        registers: 32,
        register_bits: 128,
        macs: &[FMLA_4S, FMLA_8H, SMULL_SADALP],
        reserved: CPU_RESERVED,
        features: &["neon", "fp16"],
        gpu: None,
    },
    TargetCaps {
        name: "aarch64-dotprod",
        arch: Arch::Aarch64,
        registers: 32,
        register_bits: 128,
        macs: &[FMLA_4S, FMLA_8H, SDOT],
        reserved: CPU_RESERVED,
        features: &["neon", "fp16", "dotprod"],
        gpu: None,
    },
    TargetCaps {
        name: "aarch64-i8mm",
        arch: Arch::Aarch64,
        registers: 32,
        register_bits: 128,
        macs: &[FMLA_4S, FMLA_8H, SMMLA, SDOT],
        reserved: CPU_RESERVED,
        features: &["neon", "fp16", "dotprod", "i8mm"],
        gpu: None,
    },
    X86_AVX2,
    X86_AVX512,
    TargetCaps {
        name: "opencl-gpu",
        arch: Arch::OpenCl,
        registers: 64,
        register_bits: 32,
        macs: &[CL_MAD_FLOAT4, CL_MAD_HALF4],
        reserved: OPENCL_RESERVED,
        features: &["opencl1.2", "cl_khr_fp16"],
        gpu: Some(GpuCaps {
            warp_width: 16,
            max_threads_per_block: 256,
            shared_mem_bytes: 32 * 1024,
            max_regs_per_thread: 128,
            k_slice: 32,
            stages: 2,
            min_blocks: 0,
            attention: OPENCL_ATTENTION,
        }),
    },
    TargetCaps {
        name: "ptx-sm80",
        arch: Arch::Ptx,
        registers: PTX_BUDGET,
        register_bits: 32,
        macs: &[PTX_FMA_F32, PTX_MMA_F16, PTX_MMA_S8],
        reserved: PTX_RESERVED,
        features: &["sm_80", "mma.sync", "cp.async"],
        gpu: Some(GpuCaps {
            warp_width: 32,
            max_threads_per_block: 256,
            // Opt-in maximum per block on sm_80 (163 KiB).
            shared_mem_bytes: 163 * 1024,
            max_regs_per_thread: 255,
            k_slice: 32,
            stages: 2,
            min_blocks: 2 * 108,
            attention: PTX_ATTENTION,
        }),
    },
    TargetCaps {
        name: "ptx-sm90",
        arch: Arch::Ptx,
        registers: PTX_BUDGET,
        register_bits: 32,
        macs: &[PTX_FMA_F32, PTX_MMA_F16, PTX_MMA_S8],
        reserved: PTX_RESERVED,
        features: &["sm_90", "mma.sync", "cp.async", "tma"],
        gpu: Some(GpuCaps {
            warp_width: 32,
            max_threads_per_block: 256,
            // Opt-in maximum per block on sm_90 (227 KiB).
            shared_mem_bytes: 227 * 1024,
            max_regs_per_thread: 255,
            k_slice: 32,
            stages: 2,
            min_blocks: 2 * 132,
            attention: PTX_ATTENTION,
        }),
    },
];
