//! The portable host backend: kernels lowered to cranelift IR with 128-bit
//! vectors, compiled for the machine this process runs on (x86-64 or
//! aarch64).
//!
//! # Pipeline
//!
//! [`ClifBackend::emit`] builds one cranelift [`Function`] per kernel
//! instance ([`matmul`], [`quantize`], [`attention`]), prints it (the
//! listing: canonical cranelift IR text, deterministic), and compiles it
//! with `Context::compile` into position-independent bytes (constants live
//! in the buffer's own constant pool; any relocation is refused, so the
//! bytes run wherever [`crate::jit`] maps them, like every other backend's
//! machine code). Set `TESSERA_CLIF_DUMP=1` to print each function's IR to
//! stderr before it is compiled.
//!
//! Cranelift 0.135 rejects 256-bit vector types and panics on some lowerings
//! (`fma` of f16x8): kernels compute in f32x4 / i32x4, and every compilation
//! runs under [`std::panic::catch_unwind`] so a lowering panic becomes an
//! [`EmitError`] ([`compile_function`]).
//!
//! # Tiles
//!
//! Tiles come from the solver. On aarch64 the NEON targets' own caps apply
//! (`aarch64-neon`, `aarch64-fp16`, `aarch64-dotprod`: cranelift lowers the
//! i8 dot pattern to `sdot` when the host has dotprod). On x86-64 the
//! budget is [`CLIF_X86`]: 16 registers of 128 bits (SSE's xmm0-15), an
//! f32 MAC of 1×4 with a broadcast A element per multiply (no
//! multiply-by-element, as on AVX2; one A and one B register whatever
//! the tile) and an int8 dot of 1×4 lanes × 4 bytes (`pmaddwd`-based), with
//! the CPU targets' two reserved registers. The emitters check each tile
//! against the kernel's layouts and return [`EmitError::BadTile`] for one
//! they cannot index, never a silently wrong kernel.

use std::panic::{AssertUnwindSafe, catch_unwind};

use cranelift_codegen::control::ControlPlane;
use cranelift_codegen::ir::Function;
use cranelift_codegen::isa::OwnedTargetIsa;
use cranelift_codegen::settings::{self, Configurable};
use cranelift_codegen::{Context, isa::TargetIsa};
use tessera_dsl::Kernel;

use crate::artifact::{Arch, Artifact, Backend, EmitError, MachineCode, Variant};
use crate::target::{MacClass, MacInstr, Reserved, TargetCaps};
use crate::tile::TileConfig;

pub mod attention;
mod build;
mod layout;
pub mod matmul;
pub mod quantize;

const BACKEND: &str = "host";

/// The cranelift backend for this host.
pub struct ClifBackend {
    /// Decode attention: written plainly, so cranelift's optimiser (GVN,
    /// loop-invariant code motion) does the hoisting.
    isa: OwnedTargetIsa,
    /// Matmuls and the quantizer: their IR is already scheduled by hand
    /// (pointers advanced per step, one broadcast per multiply), which the
    /// optimiser would undo (it merges the broadcasts and moves them away
    /// from their loads, so they are no longer folded into
    /// `vbroadcastss` from memory); without it they also compile faster.
    isa_matmul: OwnedTargetIsa,
}

impl std::fmt::Debug for ClifBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClifBackend")
            .field("triple", &self.isa.triple().to_string())
            .finish()
    }
}

impl ClifBackend {
    /// A backend for the host CPU, with its detected features (SSE4.1,
    /// AVX, FMA on x86-64; dotprod on aarch64).
    pub fn host() -> Result<ClifBackend, EmitError> {
        Arch::host().ok_or_else(|| EmitError::Unsupported {
            backend: BACKEND,
            what: "this host architecture (x86-64 and aarch64 only)".into(),
        })?;
        let native = || {
            cranelift_native::builder().map_err(|e| EmitError::Unsupported {
                backend: BACKEND,
                what: format!("cranelift on this host: {e}"),
            })
        };
        native()?;
        let build = |opt: &str| {
            let mut flags = settings::builder();
            let set = |flags: &mut settings::Builder, k: &str, v: &str| {
                flags
                    .set(k, v)
                    .map_err(|e| EmitError::Assembler(format!("cranelift setting {k}={v}: {e}")))
            };
            set(&mut flags, "opt_level", opt)?;
            set(&mut flags, "is_pic", "true")?;
            // The IR verifier costs about a tenth of the compile time:
            // debug builds (and so the tests) keep it.
            let verify = if cfg!(debug_assertions) {
                "true"
            } else {
                "false"
            };
            set(&mut flags, "enable_verifier", verify)?;
            native()?
                .finish(settings::Flags::new(flags))
                .map_err(|e| EmitError::Assembler(format!("cranelift isa: {e}")))
        };
        Ok(ClifBackend {
            isa: build("speed")?,
            isa_matmul: build("none")?,
        })
    }

    pub fn isa(&self) -> &dyn TargetIsa {
        &*self.isa
    }

    /// The ISA matmuls and the quantizer compile with (no optimiser: see
    /// the field), for tests that inspect their machine code.
    pub fn matmul_isa(&self) -> &dyn TargetIsa {
        &*self.isa_matmul
    }

    /// Whether the host's cranelift lowers the i8 dot tree to `sdot`.
    pub fn has_dotprod(&self) -> bool {
        self.has_flag("has_dotprod")
    }

    /// Whether an ISA flag (`has_fma`, `has_dotprod`, ...) is on.
    pub fn has_flag(&self, name: &str) -> bool {
        self.isa
            .isa_flags()
            .iter()
            .any(|f| f.name == name && f.as_bool() == Some(true))
    }

    pub fn arch(&self) -> Arch {
        // The isa is always the host's (see `host`).
        Arch::host().unwrap_or(Arch::X86_64)
    }

    /// The target caps tiles are solved with on this host: the NEON caps
    /// matching the host's features on aarch64, [`CLIF_X86`] on x86-64.
    pub fn caps(&self) -> &'static TargetCaps {
        match self.arch() {
            Arch::X86_64 => &CLIF_X86,
            _ => {
                let has = |name: &str| self.has_flag(name);
                let name = if has("has_dotprod") {
                    "aarch64-dotprod"
                } else if has("has_fp16") {
                    "aarch64-fp16"
                } else {
                    "aarch64-neon"
                };
                TargetCaps::by_name(name).unwrap_or(&CLIF_X86)
            }
        }
    }

    /// The solver's tiles for `kernel` on this host ([`Self::caps`]), best
    /// first, keeping those this backend can index (e.g. 4-bit weight
    /// blocks need hp·lp to fill whole vectors).
    pub fn tiles(&self, kernel: &Kernel) -> Result<Vec<TileConfig>, EmitError> {
        let caps = self.caps();
        let problem = crate::tile::Problem::from_kernel(caps, kernel).map_err(|e| {
            EmitError::Unsupported {
                backend: BACKEND,
                what: e.to_string(),
            }
        })?;
        let tiles = crate::tile::solve(caps, &problem).map_err(|e| EmitError::Unsupported {
            backend: BACKEND,
            what: e.to_string(),
        })?;
        Ok(tiles
            .into_iter()
            .filter(|t| matmul::check_tile(kernel, t).is_ok())
            .collect())
    }

    /// The activation quantizer (`i8dyn`, [`crate::abi::QuantizeArgs`]) of
    /// an integer matmul kernel, for the same tile as its matmul.
    pub fn emit_quantizer(
        &self,
        kernel: &Kernel,
        tile: &TileConfig,
    ) -> Result<MachineCode, EmitError> {
        let func = guarded(|| quantize::build(kernel, tile))??;
        self.finish(&*self.isa_matmul, func)
    }

    /// The `Gemm` variant of a float matmul with K blocks of about
    /// `k_block` values instead of the L1-sized default
    /// ([`matmul::build_k_blocked`]): lets tests cover several K blocks
    /// with small k.
    pub fn emit_k_blocked(
        &self,
        kernel: &Kernel,
        tile: &TileConfig,
        k_block: usize,
    ) -> Result<MachineCode, EmitError> {
        let dot = DotLowering::for_isa(self);
        let fused = self.arch() == Arch::Aarch64 || self.has_flag("has_fma");
        let func = guarded(|| matmul::build_k_blocked(kernel, tile, dot, fused, k_block))??;
        self.finish(&*self.isa_matmul, func)
    }

    /// Compile many matmul instances at once, spread over up to `threads`
    /// threads: what a runtime preparing a model's kernel set calls (each
    /// compilation is independent and single-threaded, so on n cores the
    /// set takes about 1/n of the time). Results come in job order; one
    /// job's error does not stop the others.
    pub fn emit_matmuls(
        &self,
        jobs: &[MatmulJob<'_>],
        threads: usize,
    ) -> Vec<Result<CompiledMatmul, EmitError>> {
        // Units of work: each job's matmul, and its quantizer if it has one,
        // handed out one at a time (they differ a lot in size).
        let units: Vec<(usize, bool)> = jobs
            .iter()
            .enumerate()
            .flat_map(|(i, j)| {
                let quantizer = matmul::has_quantizer(j.kernel);
                std::iter::once((i, false)).chain(quantizer.then_some((i, true)))
            })
            .collect();
        let compile = |&(i, quantizer): &(usize, bool)| -> Result<MachineCode, EmitError> {
            let j = &jobs[i];
            if quantizer {
                self.emit_quantizer(j.kernel, &j.tile)
            } else {
                match self.emit_variant(j.kernel, &j.tile, j.variant)? {
                    Artifact::Machine(code) => Ok(code),
                    Artifact::Source { .. } => unreachable!("cranelift emits machine code"),
                }
            }
        };
        let threads = threads.clamp(1, units.len().max(1));
        let mut done: Vec<Option<Result<MachineCode, EmitError>>> = vec![None; units.len()];
        if threads == 1 {
            for (slot, unit) in done.iter_mut().zip(&units) {
                *slot = Some(compile(unit));
            }
        } else {
            let next = std::sync::atomic::AtomicUsize::new(0);
            let results = std::sync::Mutex::new(&mut done);
            std::thread::scope(|scope| {
                for _ in 0..threads {
                    scope.spawn(|| {
                        loop {
                            let u = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            let Some(unit) = units.get(u) else { break };
                            let r = compile(unit);
                            results.lock().unwrap_or_else(|e| e.into_inner())[u] = Some(r);
                        }
                    });
                }
            });
        }
        let mut out: Vec<Result<CompiledMatmul, EmitError>> = Vec::with_capacity(jobs.len());
        for (unit, r) in units.iter().zip(done) {
            let r = r.unwrap_or_else(|| Err(EmitError::Assembler("not compiled".into())));
            match (unit.1, r) {
                (false, r) => out.push(r.map(|code| CompiledMatmul {
                    code,
                    quantizer: None,
                })),
                (true, r) => {
                    if let Some(Ok(c)) = out.last_mut() {
                        match r {
                            Ok(q) => c.quantizer = Some(q),
                            Err(e) => *out.last_mut().expect("a job per quantizer") = Err(e),
                        }
                    }
                }
            }
        }
        out
    }

    /// Compile a built function into machine code with its IR as listing.
    fn finish(&self, isa: &dyn TargetIsa, func: Function) -> Result<MachineCode, EmitError> {
        let listing = func.display().to_string();
        if std::env::var_os("TESSERA_CLIF_DUMP").is_some() {
            eprintln!("{listing}");
        }
        let bytes = compile_function(isa, func)?;
        Ok(MachineCode {
            arch: self.arch(),
            bytes,
            listing,
            head_dim_multiple: 1,
            whole_prefill: None,
            every_head_state: false,
        })
    }
}

impl Backend for ClifBackend {
    fn name(&self) -> &'static str {
        BACKEND
    }

    /// Matmul kernels: the matmul ([`crate::abi::MatmulArgs`]); get the
    /// `i8dyn` quantizer with [`ClifBackend::emit_quantizer`]. Decode
    /// attention kernels: [`crate::host_attention::AttentionArgs`] (the
    /// tile is not used).
    fn emit(&self, kernel: &Kernel, tile: &TileConfig) -> Result<Artifact, EmitError> {
        self.emit_variant(kernel, tile, Variant::FlatGemm)
    }

    /// Every variant of a matmul: `Gemm` adds K blocks to the float loop
    /// ([`matmul::build_variant`]); GEMV and flat GEMM are the default
    /// loop. Attention kernels ignore the variant.
    fn emit_variant(
        &self,
        kernel: &Kernel,
        tile: &TileConfig,
        variant: Variant,
    ) -> Result<Artifact, EmitError> {
        let code = if kernel.as_matmul().is_some() {
            let dot = DotLowering::for_isa(self);
            let fused = self.arch() == Arch::Aarch64 || self.has_flag("has_fma");
            let func = guarded(|| matmul::build_variant(kernel, tile, variant, dot, fused))??;
            self.finish(&*self.isa_matmul, func)?
        } else {
            let func = guarded(|| attention::build(kernel))??;
            self.finish(&*self.isa, func)?
        };
        Ok(Artifact::Machine(code))
    }
}

/// One matmul instance of a batch ([`ClifBackend::emit_matmuls`]).
#[derive(Clone, Copy, Debug)]
pub struct MatmulJob<'k> {
    pub kernel: &'k Kernel,
    pub tile: TileConfig,
    pub variant: Variant,
}

/// A compiled matmul instance: its code and, for `i8dyn` activations, the
/// activation quantizer for the same tile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompiledMatmul {
    pub code: MachineCode,
    pub quantizer: Option<MachineCode>,
}

/// Which i8 dot-product tree the int8 matmul emits: the one each ISA's
/// lowering rules fold into a single instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DotLowering {
    /// `iadd(iadd_pairwise(iadd_pairwise(..)), acc)` of widened i16
    /// products: aarch64 `sdot` with dotprod.
    Sdot,
    /// `iadd_pairwise` of two `pmaddwd` trees: x86-64 SSE.
    Pmaddwd,
}

impl DotLowering {
    fn for_isa(backend: &ClifBackend) -> DotLowering {
        match backend.arch() {
            Arch::X86_64 => DotLowering::Pmaddwd,
            _ => DotLowering::Sdot,
        }
    }
}

/// Run `f`, turning a panic into an [`EmitError`].
fn guarded<T>(f: impl FnOnce() -> T) -> Result<T, EmitError> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|payload| {
        let msg = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        EmitError::Assembler(format!("cranelift panicked: {msg}"))
    })
}

/// Compile `func` for `isa` to position-independent bytes. A cranelift
/// error or panic becomes an [`EmitError`]; so does any relocation (the
/// bytes must run wherever they are mapped).
pub fn compile_function(isa: &dyn TargetIsa, func: Function) -> Result<Vec<u8>, EmitError> {
    guarded(|| {
        let mut ctx = Context::for_function(func);
        let code = ctx
            .compile(isa, &mut ControlPlane::default())
            .map_err(|e| EmitError::Assembler(format!("cranelift: {:?}", e.inner)))?;
        if let Some(r) = code.buffer.relocs().first() {
            return Err(EmitError::Assembler(format!(
                "cranelift emitted a relocation ({:?} at offset {}): the code would not be position independent",
                r.kind, r.offset
            )));
        }
        Ok(code.code_buffer().to_vec())
    })?
}

const CLIF_RESERVED: &[Reserved] = &[
    Reserved {
        regs: 1,
        purpose: "0x0F nibble mask for the int4 unpack",
    },
    Reserved {
        regs: 1,
        purpose: "packed int4 weight bytes before unpacking",
    },
];

/// The f32 MAC as [`matmul`] emits it: column by column, each multiply
/// with its own broadcast of x (overwritten in place by the x86-64 fma),
/// so whatever the tile one A and one B register are live besides the
/// accumulators (A counts once for up to 16 rows, B once for up to 64
/// columns, the emitter's limits).
const CLIF_FMA_4S: MacInstr = MacInstr {
    name: "fma f32x4 (broadcast row)",
    class: MacClass::F32,
    ae: 1,
    ah: 4,
    acc_regs: 1,
    lp: 1,
    a_rows: 16,
    a_regs: 1,
    b_cols: 64,
    b_regs: 1,
    reserved: &[],
    mma: None,
    group_sums: 0,
    gemv_partial_sums: 0,
    gemm_partial_sums: 0,
    paired_nibble_steps: false,
};

const CLIF_DOT_TEMPS: &[Reserved] = &[Reserved {
    regs: 2,
    purpose: "i16 widened operands of the pmaddwd pair",
}];

/// The unit is 8 channels × 4 bytes of l: one 32-code run of the int4
/// pair transpose (16 packed bytes), two i32x4 accumulators per row, two
/// B vectors once unpacked.
const CLIF_DOT4: MacInstr = MacInstr {
    name: "i8 dot4 i32x4 (pmaddwd pair + iadd_pairwise)",
    class: MacClass::Int8,
    ae: 1,
    ah: 8,
    acc_regs: 2,
    lp: 4,
    a_rows: 1,
    a_regs: 1,
    b_cols: 8,
    b_regs: 2,
    reserved: CLIF_DOT_TEMPS,
    mma: None,
    group_sums: 0,
    gemv_partial_sums: 0,
    gemm_partial_sums: 0,
    paired_nibble_steps: false,
};

/// Cranelift on x86-64: 16 xmm registers of 128 bits. Per f32 tile:
/// `ep·hp/4` f32x4 accumulators, one broadcast A and one B vector, plus
/// the CPU targets' two reserved registers: 12 accumulators (4×12 at
/// M = 512: 12 + 1 + 1 + 2 = 16). Int8: `ep·hp/4` i32x4 accumulators,
/// `ep` A runs, `hp/4` B vectors, the reserved two and two i16
/// temporaries.
pub static CLIF_X86: TargetCaps = TargetCaps {
    name: "host-clif-x86",
    arch: Arch::X86_64,
    registers: 16,
    register_bits: 128,
    macs: &[CLIF_FMA_4S, CLIF_DOT4],
    reserved: CLIF_RESERVED,
    features: &["sse4.1"],
    gpu: None,
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_inside_the_guard_becomes_an_error() {
        let r: Result<(), EmitError> = guarded(|| panic!("lowering exploded"));
        match r {
            Err(EmitError::Assembler(msg)) => assert!(msg.contains("lowering exploded"), "{msg}"),
            other => panic!("expected an Assembler error, got {other:?}"),
        }
        assert_eq!(guarded(|| 7).unwrap(), 7);
    }
}
