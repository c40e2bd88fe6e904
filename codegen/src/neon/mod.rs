//! The NEON backend: aarch64 machine code for the matmul family.
//!
//! One emitter writes every kernel through [`asm::A64`] (dynasmrt's
//! `VecAssembler`): the bytes it returns are what the JIT maps
//! ([`crate::jit`]) and what `--bin` writes, on any host. Kernels follow
//! the one-pointer ABI of [`crate::abi`]; [`crate::host::HostMatmul`] is
//! the safe, shape-checking way to call them (and runs one call per slice
//! of h-panels).
//!
//! | target | int8 (W4A8, W8A8) | f16 x (matmul-f16) | f32 |
//! |---|---|---|---|
//! | `aarch64-i8mm` | `smmla` ([`int8`]) | `fmla .8h` ([`float`]) | `fmla .4s` |
//! | `aarch64-dotprod` | `sdot` by element | `fmla .8h` | `fmla .4s` |
//! | `aarch64-fp16` | `smull`/`smlal2`/`sadalp` | `fmla .8h` | `fmla .4s` |
//! | `aarch64-neon` | `smull`/`smlal2`/`sadalp` | widened to `fmla .4s` | `fmla .4s` |
//!
//! Which target a machine runs is decided at run time by
//! [`NeonBackend::detect`]. Every listing starts with the kernel's register
//! plan as `//` lines (llvm-mc reads them as comments).

pub mod asm;
pub mod attention;
pub mod attention_append;
mod attention_asm;
pub mod attention_prefill;
pub mod attention_split;
pub mod float;
pub mod frame;
pub mod int8;
pub mod quantize;

use std::ops::Range;

use tessera_dsl::Kernel;
use tessera_dsl::ir::{Format, Group};

use crate::artifact::{Arch, Artifact, Backend, EmitError, MachineCode, Variant};
use crate::target::{MacClass, TargetCaps, mac_class};
use crate::tile::{Problem, RegisterAccounting, TileConfig, accounting};

/// The int8 MAC instruction (sequence) a kernel uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mac {
    Sdot,
    Smmla,
    Smull,
}

/// Where each vector register of a micro-kernel goes; counts equal the
/// solver's [`RegisterAccounting`] (a test asserts it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegisterPlan {
    /// A (activation) registers.
    pub a: Range<u8>,
    /// B (weight) registers.
    pub b: Range<u8>,
    /// The 0x0F mask (4-bit weights; reserved whatever the format).
    pub mask: asm::V,
    /// The packed-byte staging register the solver reserves (spare: the
    /// unpack works in place).
    pub stage: asm::V,
    /// The smull int16 temporary.
    pub temp: Option<asm::V>,
    /// Accumulators, at the top of the register file.
    pub acc: Range<u8>,
}

impl RegisterPlan {
    /// Lay out the registers the accounting counts.
    pub fn new(acc: &RegisterAccounting, a_regs: u32, b_regs: u32, temp: bool) -> RegisterPlan {
        let a_end = a_regs as u8;
        let b_end = a_end + b_regs as u8;
        let mask = asm::V(b_end);
        let stage = asm::V(b_end + 1);
        let temp = temp.then_some(asm::V(b_end + 2));
        let acc_start = 32 - acc.accumulators as u8;
        RegisterPlan {
            a: 0..a_end,
            b: a_end..b_end,
            mask,
            stage,
            temp,
            acc: acc_start..32,
        }
    }

    pub fn acc_count(&self) -> u32 {
        self.acc.len() as u32
    }

    pub fn acc_reg(&self, i: u32) -> asm::V {
        asm::V(self.acc.start + i as u8)
    }

    /// A register not holding an accumulator (for set-up code).
    pub fn scratch_v(&self, i: u8) -> asm::V {
        asm::V(i)
    }

    /// Registers free once the reduction of a group is done: A, B, the
    /// mask (re-made per group), staging and temporaries.
    pub fn free_in_epilogue(&self) -> Vec<asm::V> {
        let mut v: Vec<asm::V> = self.a.clone().chain(self.b.clone()).map(asm::V).collect();
        v.push(self.mask);
        v.push(self.stage);
        v.extend(self.temp);
        v
    }

    /// Vector registers used in all.
    pub fn total(&self) -> u32 {
        (self.a.len() + self.b.len() + 2 + usize::from(self.temp.is_some()) + self.acc.len()) as u32
    }

    /// The plan as `//` lines for a listing header.
    pub fn table(&self) -> Vec<String> {
        let range = |r: &Range<u8>| {
            if r.is_empty() {
                "-".to_string()
            } else {
                format!("v{}-v{}", r.start, r.end - 1)
            }
        };
        let mut rows = vec![
            "| registers | holds |".to_string(),
            "|---|---|".to_string(),
            format!(
                "| {} | A: activations, one lp-slice of the ep rows |",
                range(&self.a)
            ),
            format!(
                "| {} | B: weights, one lp-slice of the hp columns |",
                range(&self.b)
            ),
            format!("| {} | 0x0F nibble mask |", self.mask),
            format!("| {} | packed-weight staging (spare) |", self.stage),
        ];
        if let Some(t) = self.temp {
            rows.push(format!("| {t} | int16 products before sadalp |"));
        }
        rows.push(format!("| {} | accumulators |", range(&self.acc)));
        rows
    }
}

/// The NEON backend for one aarch64 target.
#[derive(Clone, Copy, Debug)]
pub struct NeonBackend {
    caps: &'static TargetCaps,
}

impl NeonBackend {
    /// The backend for target `name` (`aarch64-i8mm`, `aarch64-dotprod`,
    /// `aarch64-fp16`, `aarch64-neon`).
    pub fn new(name: &str) -> Result<NeonBackend, EmitError> {
        let caps = TargetCaps::by_name(name).map_err(|e| EmitError::Unsupported {
            backend: "neon",
            what: e.to_string(),
        })?;
        if caps.arch != Arch::Aarch64 {
            return Err(EmitError::Unsupported {
                backend: "neon",
                what: format!("target {name} (not aarch64)"),
            });
        }
        Ok(NeonBackend { caps })
    }

    pub fn caps(&self) -> &'static TargetCaps {
        self.caps
    }

    /// Decode attention for this target ([`attention`]; ABI
    /// [`crate::host_attention::AttentionArgs`]).
    pub fn emit_attention(&self, kernel: &Kernel) -> Result<MachineCode, EmitError> {
        attention::emit(self.caps, kernel)
    }

    /// The best target this CPU runs, from run-time feature detection:
    /// i8mm, then dotprod, then fp16, then plain NEON. On a non-aarch64
    /// host there is nothing to detect: None.
    pub fn detect() -> Option<NeonBackend> {
        Self::detect_name().and_then(|n| Self::new(n).ok())
    }

    /// The target name [`Self::detect`] picks.
    pub fn detect_name() -> Option<&'static str> {
        #[cfg(target_arch = "aarch64")]
        {
            use std::arch::is_aarch64_feature_detected as has;
            Some(if has!("i8mm") && has!("dotprod") && has!("fp16") {
                "aarch64-i8mm"
            } else if has!("dotprod") && has!("fp16") {
                "aarch64-dotprod"
            } else if has!("fp16") {
                "aarch64-fp16"
            } else {
                "aarch64-neon"
            })
        }
        #[cfg(not(target_arch = "aarch64"))]
        {
            None
        }
    }

    /// The activation quantizer+packer a kernel needs (its x is `i8dyn`),
    /// for `tile`; None for float kernels.
    pub fn quantizer(
        &self,
        kernel: &Kernel,
        tile: &TileConfig,
    ) -> Result<Option<MachineCode>, EmitError> {
        let spec = self.spec(kernel, tile, Variant::Gemm)?;
        match spec {
            KernelSpec::Int8(s) => {
                let mut a = asm::A64::new();
                quantize::emit(&mut a, s.ep, s.lp);
                finish(a).map(Some)
            }
            KernelSpec::Float(_) => Ok(None),
        }
    }

    /// The register plan of `kernel` at `tile`, with the solver's accounting
    /// it was laid out from.
    pub fn plan(
        &self,
        kernel: &Kernel,
        tile: &TileConfig,
    ) -> Result<(RegisterPlan, RegisterAccounting), EmitError> {
        let class = mac_class(self.caps, kernel).map_err(|e| self.unsupported(e.to_string()))?;
        let instr = self
            .caps
            .mac(class)
            .ok_or_else(|| self.unsupported(format!("the {class} class")))?;
        let problem =
            Problem::from_kernel(self.caps, kernel).map_err(|e| self.unsupported(e.to_string()))?;
        let acc = accounting(self.caps, instr, &problem, tile.ep, tile.hp);
        let a_regs = acc.a_regs;
        let plan = RegisterPlan::new(&acc, a_regs, acc.b_regs, !instr.reserved.is_empty());
        Ok((plan, acc))
    }

    fn unsupported(&self, what: String) -> EmitError {
        EmitError::Unsupported {
            backend: self.caps.name,
            what,
        }
    }

    fn bad_tile(tile: &TileConfig, why: impl Into<String>) -> EmitError {
        EmitError::BadTile {
            tile: format!("{}x{}x{}", tile.ep, tile.hp, tile.lp),
            why: why.into(),
        }
    }

    fn spec(
        &self,
        kernel: &Kernel,
        tile: &TileConfig,
        variant: Variant,
    ) -> Result<KernelSpec, EmitError> {
        let mm = kernel
            .as_matmul()
            .ok_or_else(|| self.unsupported(format!("kernel `{}` (not a matmul)", kernel.name)))?;
        let class = mac_class(self.caps, kernel).map_err(|e| self.unsupported(e.to_string()))?;
        let instr = self
            .caps
            .mac(class)
            .ok_or_else(|| self.unsupported(format!("the {class} class")))?;
        let problem =
            Problem::from_kernel(self.caps, kernel).map_err(|e| self.unsupported(e.to_string()))?;
        if tile.lp != instr.lp
            || tile.ep == 0
            || tile.hp == 0
            || !tile.ep.is_multiple_of(instr.ae)
            || !tile.hp.is_multiple_of(instr.ah)
        {
            return Err(Self::bad_tile(
                tile,
                format!(
                    "{} needs ep a multiple of {}, hp of {}, lp = {}",
                    instr.name, instr.ae, instr.ah, instr.lp
                ),
            ));
        }
        let acc = accounting(self.caps, instr, &problem, tile.ep, tile.hp);
        if acc.total > self.caps.registers {
            return Err(Self::bad_tile(
                tile,
                format!(
                    "needs {} vector registers, the target has {}",
                    acc.total, self.caps.registers
                ),
            ));
        }
        if variant == Variant::Gemv && tile.ep != instr.ae {
            return Err(Self::bad_tile(
                tile,
                format!(
                    "the gemv variant runs one row block of ep = {} (the solver's tile for e = 1)",
                    instr.ae
                ),
            ));
        }
        let format_of = |t: &str| kernel.tensor(t).map(|t| t.format);
        let (Some(xf), Some(wf), Some(yf)) = (format_of(&mm.x), format_of(&mm.w), format_of(&mm.y))
        else {
            return Err(self.unsupported("a matmul with missing tensors".into()));
        };
        let out = match yf {
            Format::F32 => frame::OutType::F32,
            Format::F16 => frame::OutType::F16,
            f => return Err(self.unsupported(format!("output format {f}"))),
        };
        match class {
            MacClass::Int8 => {
                if out != frame::OutType::F32 {
                    return Err(self.unsupported(format!("int8 kernels with {yf} output")));
                }
                let (wbits, asym, group) = match wf {
                    Format::U4Asym(g) => (4, true, g),
                    Format::I8Sym(g) => (8, false, g),
                    Format::I8Asym(g) => (8, true, g),
                    f => {
                        return Err(self.unsupported(format!("{f} weights with i8dyn activations")));
                    }
                };
                if wbits == 4 && !(tile.hp * tile.lp).is_multiple_of(32) {
                    return Err(Self::bad_tile(
                        tile,
                        "the int4 pair transpose packs 32 codes per 16 bytes: hp·lp must be a multiple of 32",
                    ));
                }
                let group = match group {
                    Group::Row => None,
                    Group::Size(g) if g > 0 && g.is_multiple_of(tile.lp) => Some(g),
                    Group::Size(g) => {
                        return Err(self.unsupported(format!(
                            "group size {g} (not a multiple of lp = {})",
                            tile.lp
                        )));
                    }
                };
                let mac = match instr.name {
                    n if n.starts_with("sdot") => Mac::Sdot,
                    n if n.starts_with("smmla") => Mac::Smmla,
                    _ => Mac::Smull,
                };
                let _ = xf;
                Ok(KernelSpec::Int8(int8::Int8Spec {
                    mac,
                    ep: tile.ep,
                    hp: tile.hp,
                    lp: tile.lp,
                    wbits,
                    asym,
                    group,
                    gemv: variant == Variant::Gemv,
                }))
            }
            MacClass::F32 | MacClass::F16 => {
                if tile.ep > float::MAX_ROWS {
                    return Err(Self::bad_tile(
                        tile,
                        format!(
                            "the float path keeps one pointer per row: ep must be at most {}",
                            float::MAX_ROWS
                        ),
                    ));
                }
                let elem = |f: Format| match f {
                    Format::F32 => Ok(float::Elem::F32),
                    Format::F16 => Ok(float::Elem::F16),
                    f => Err(self.unsupported(format!("{f} operands on the NEON float path"))),
                };
                Ok(KernelSpec::Float(float::FloatSpec {
                    fp16_mac: class == MacClass::F16,
                    ep: tile.ep,
                    hp: tile.hp,
                    x: elem(xf)?,
                    w: elem(wf)?,
                    out,
                    gemv: variant == Variant::Gemv,
                }))
            }
        }
    }
}

enum KernelSpec {
    Int8(int8::Int8Spec),
    Float(float::FloatSpec),
}

fn finish(a: asm::A64) -> Result<MachineCode, EmitError> {
    let (bytes, listing) = a.finish().map_err(EmitError::Assembler)?;
    Ok(MachineCode {
        arch: Arch::Aarch64,
        bytes,
        listing,
    })
}

impl Backend for NeonBackend {
    fn name(&self) -> &'static str {
        self.caps.name
    }

    fn emit(&self, kernel: &Kernel, tile: &TileConfig) -> Result<Artifact, EmitError> {
        self.emit_variant(kernel, tile, Variant::Gemm)
    }

    /// `Gemv` is its own loop (ep = ae, A loaded once per four sdot steps);
    /// `FlatGemm` on a CPU is the GEMM loop at the solver's small-M tile.
    fn emit_variant(
        &self,
        kernel: &Kernel,
        tile: &TileConfig,
        variant: Variant,
    ) -> Result<Artifact, EmitError> {
        let spec = self.spec(kernel, tile, variant)?;
        let (plan, acc) = self.plan(kernel, tile)?;
        let mut a = asm::A64::new();
        a.header(&format!(
            "{} {} variant={} tile ep={} hp={} lp={}",
            kernel.name, self.caps.name, variant, tile.ep, tile.hp, tile.lp
        ));
        a.header(&format!(
            "registers: acc={} a={} b={} dequant={} reserved={} total={}/{}",
            acc.accumulators,
            acc.a_regs,
            acc.b_regs,
            acc.dequant,
            acc.reserved,
            acc.total,
            acc.budget
        ));
        for line in plan.table() {
            a.header(&line);
        }
        match &spec {
            KernelSpec::Int8(s) => int8::emit(&mut a, s, &plan),
            KernelSpec::Float(s) => float::emit(&mut a, s, &plan),
        }
        finish(a).map(Artifact::Machine)
    }
}
