//! The kernel description is a contract: every backend either does what
//! each field of a matmul description says, or refuses it with an error
//! that names the field.
//!
//! The suite enumerates descriptions over every field a matmul has — the
//! activation format (f32, f16, i8dyn) and layout (row-major or the
//! `[e/ep, l/lp, ep, lp]` panels), every weight format with every group
//! (32, 64, 128, row) and parameter precision, the weight layout (CPU
//! panels `[h/hp, l/lp, hp, lp]` or the GPU layout `[l/lp, h, lp]`, each
//! with and without the int4 pair transpose, and `u4sym` codes stored
//! signed), the output format, the bias
//! (none, f32, f16), the activation (none, relu, silu) and the variant
//! (GEMV, flat GEMM, GEMM); scale and zero point follow from the formats
//! (`verify()` requires them exactly when the formats need them). For each
//! backend:
//!
//! 1. **one field at a time**: starting from the descriptions the backend
//!    emits (its baselines: float and int8 CPU kernels, the GPU A16
//!    kernel), each value of each field is substituted; a refusal must name
//!    that field (its error text contains one of the field's words);
//! 2. **sampled combinations**: a fixed-seed sample of the whole valid
//!    space; a refusal must name at least one of its fields;
//! 3. **runs**: what a backend emits is run against the reference
//!    interpreter on random inputs with tails in M, N and K where this host
//!    can run it — x86 and the cranelift host natively, NEON when the test
//!    runs on aarch64 (`scripts/test-aarch64.sh`, under qemu), OpenCL on the
//!    first OpenCL device (PoCL), PTX on the test simulator. CPU backends
//!    run every description they emit; OpenCL and the simulator, slower,
//!    run a greedy cover of every field value the backend emits.
//!
//! Step 1 and 2 make the table in `docs/CONFORMANCE.md` (backend × field
//! value: runs / refused). Whether a backend emits does not depend on the
//! host (NEON and AVX-512 code is emitted anywhere), so the table is the
//! same on every x86-64 host; the test fails when the file is stale, and
//! `TESSERA_BLESS_CONFORMANCE=1` rewrites it. On aarch64 the table is not
//! compared (the cranelift host column is the x86-64 one) and only the NEON
//! targets are surveyed and run.

#[cfg(target_arch = "x86_64")]
#[path = "../../codegen/tests/ptx_sim/mod.rs"]
mod ptx_sim;

#[cfg(target_arch = "x86_64")]
use std::collections::HashSet;
use std::fmt::Write as _;
use std::sync::OnceLock;

use half::f16;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tessera_codegen::artifact::{Artifact, Backend, EmitError, MachineCode, Variant};
use tessera_codegen::host::{HostInput, HostMatmul, HostOutput, HostTile, WeightsIn};
use tessera_codegen::neon::NeonBackend;
use tessera_codegen::{Problem, TargetCaps, TileConfig, solve};
use tessera_dsl::interp::{self, Bindings, Value};
use tessera_dsl::quant::{QuantTensor, quantize};
use tessera_dsl::{
    Activation, Format, Group, Kernel, Layout, LayoutDim, Op, ParamType, library, verify,
};

// ---------------------------------------------------------------------------
// Descriptions
// ---------------------------------------------------------------------------

/// Where the weights are laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum WLayout {
    /// `[h/hp, l/lp, hp, lp]`: the CPU panels.
    Cpu,
    /// `[l/lp, h, lp]`: MNN-LLM 5.1's GPU layout.
    Gpu,
}

/// The schedule's `parallel` and `split` lines.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Sched {
    /// `parallel e, h` (the library's).
    RowsAndColumns,
    /// `parallel h`.
    Columns,
    /// Neither line: one CPU thread.
    Serial,
    /// `parallel e, h` and `split l` (split-K, which no backend emits).
    SplitK,
}

impl Sched {
    const ALL: [Sched; 4] = [
        Sched::RowsAndColumns,
        Sched::Columns,
        Sched::Serial,
        Sched::SplitK,
    ];

    fn apply(self, k: &mut Kernel) {
        let axes: &[&str] = match self {
            Sched::RowsAndColumns | Sched::SplitK => &["e", "h"],
            Sched::Columns => &["h"],
            Sched::Serial => &[],
        };
        k.schedule.parallel = axes.iter().map(|a| a.to_string()).collect();
        k.schedule.split = (self == Sched::SplitK).then(|| "l".to_string());
    }
}

/// One matmul description (the fields the suite varies).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Desc {
    x: Format,
    /// x in `[e/ep, l/lp, ep, lp]` (else row-major `[e, l]`).
    x_panel: bool,
    w: Format,
    w_layout: WLayout,
    pair: bool,
    /// `u4sym` codes stored as q − 8 (the layout's `signed-codes`).
    signed: bool,
    y: Format,
    bias: Option<Format>,
    act: Activation,
    variant: Variant,
    schedule: Sched,
}

impl Desc {
    /// The IR kernel, or `None` when `verify()` rejects the combination
    /// (e.g. a pair transpose on 8-bit weights).
    fn kernel(&self) -> Option<Kernel> {
        let mut k = library::get("matmul-w4a8").expect("library kernel");
        k.name = "conformance".into();
        let lay = |dims: Vec<LayoutDim>, pair: bool| Layout {
            dims,
            int4_pair_transpose: pair,
            int4_signed_codes: false,
        };
        let signed = self.signed;
        for t in &mut k.tensors {
            match t.name.as_str() {
                "x" => {
                    t.format = self.x;
                    t.layout = if self.x_panel {
                        lay(
                            vec![
                                LayoutDim::outer("e", "ep"),
                                LayoutDim::outer("l", "lp"),
                                LayoutDim::inner("ep"),
                                LayoutDim::inner("lp"),
                            ],
                            false,
                        )
                    } else {
                        Layout::row_major(&["e", "l"])
                    };
                }
                "w" => {
                    t.format = self.w;
                    t.layout = match self.w_layout {
                        WLayout::Cpu => Layout {
                            int4_signed_codes: signed,
                            ..lay(
                                vec![
                                    LayoutDim::outer("h", "hp"),
                                    LayoutDim::outer("l", "lp"),
                                    LayoutDim::inner("hp"),
                                    LayoutDim::inner("lp"),
                                ],
                                self.pair,
                            )
                        },
                        WLayout::Gpu => Layout {
                            int4_signed_codes: signed,
                            ..lay(
                                vec![
                                    LayoutDim::outer("l", "lp"),
                                    LayoutDim::whole("h"),
                                    LayoutDim::inner("lp"),
                                ],
                                self.pair,
                            )
                        },
                    };
                }
                "y" => t.format = self.y,
                "bias" => {
                    if let Some(f) = self.bias {
                        t.format = f;
                    }
                }
                _ => {}
            }
        }
        if self.bias.is_none() {
            k.tensors.retain(|t| t.name != "bias");
        }
        let Op::Matmul(mm) = &mut k.op else {
            unreachable!("matmul-w4a8 is a matmul")
        };
        mm.epilogue.scale = self.x.is_quantized() || self.w.is_quantized();
        mm.epilogue.zero_point = self.w.is_asymmetric();
        mm.epilogue.bias = self.bias.map(|_| "bias".to_string());
        mm.epilogue.activation = self.act;
        self.schedule.apply(&mut k);
        verify(&k).ok().map(|()| k)
    }

    /// Every field value of this description.
    fn features(&self) -> Vec<Feature> {
        vec![
            Feature::X(self.x),
            Feature::XPanel(self.x_panel),
            Feature::W(self.w),
            Feature::WLayout(self.w_layout, self.pair, self.signed),
            Feature::Y(self.y),
            Feature::Bias(self.bias),
            Feature::Act(self.act),
            Feature::Variant(self.variant),
            Feature::Schedule(self.schedule),
        ]
    }

    fn label(&self) -> String {
        format!(
            "x {}{} · w {} {:?}{}{} → y {}, bias {}, {:?}, {}, {:?}",
            self.x,
            if self.x_panel { " (panels)" } else { "" },
            self.w,
            self.w_layout,
            if self.pair { "+pair" } else { "" },
            if self.signed { "+signed" } else { "" },
            self.y,
            self.bias.map_or("none".to_string(), |b| b.to_string()),
            self.act,
            self.variant,
            self.schedule
        )
    }
}

const XS: [Format; 3] = [Format::F32, Format::F16, Format::I8Dyn];
const YS: [Format; 2] = [Format::F32, Format::F16];
const BIASES: [Option<Format>; 3] = [None, Some(Format::F32), Some(Format::F16)];
const ACTS: [Activation; 3] = [Activation::None, Activation::Relu, Activation::Silu];
/// (layout, pair transpose, signed codes).
const LAYOUTS: [(WLayout, bool, bool); 6] = [
    (WLayout::Cpu, false, false),
    (WLayout::Cpu, true, false),
    (WLayout::Cpu, true, true),
    (WLayout::Gpu, false, false),
    (WLayout::Gpu, true, false),
    (WLayout::Gpu, false, true),
];

/// Every weight format a matmul takes: f32, f16, and each quantized family
/// with groups 32, 64, 128 and whole rows, f32 and f16 parameters. (fp8
/// exists for KV values only; `verify()` refuses it as a weight.)
fn weight_formats() -> Vec<Format> {
    let mut v = vec![Format::F32, Format::F16];
    type Family = fn(Group, ParamType) -> Format;
    let families: [Family; 5] = [
        Format::U4Asym,
        Format::U4Sym,
        Format::I8Sym,
        Format::I8Asym,
        Format::E0M4,
    ];
    for fam in families {
        for p in [ParamType::F32, ParamType::F16] {
            for g in [
                Group::Size(32),
                Group::Size(64),
                Group::Size(128),
                Group::Row,
            ] {
                v.push(fam(g, p));
            }
        }
    }
    v
}

/// One value of one field: a row of the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Feature {
    X(Format),
    XPanel(bool),
    W(Format),
    WLayout(WLayout, bool, bool),
    Y(Format),
    Bias(Option<Format>),
    Act(Activation),
    Variant(Variant),
    Schedule(Sched),
}

impl Feature {
    fn all() -> Vec<Feature> {
        let mut v: Vec<Feature> = XS.iter().map(|&f| Feature::X(f)).collect();
        v.extend([Feature::XPanel(false), Feature::XPanel(true)]);
        v.extend(weight_formats().into_iter().map(Feature::W));
        v.extend(LAYOUTS.iter().map(|&(l, p, sg)| Feature::WLayout(l, p, sg)));
        v.extend(YS.iter().map(|&f| Feature::Y(f)));
        v.extend(BIASES.iter().map(|&b| Feature::Bias(b)));
        v.extend(ACTS.iter().map(|&a| Feature::Act(a)));
        v.extend(Variant::ALL.iter().map(|&x| Feature::Variant(x)));
        v.extend(Sched::ALL.iter().map(|&x| Feature::Schedule(x)));
        v
    }

    /// The field, as the table names it.
    fn field(&self) -> &'static str {
        match self {
            Feature::X(_) => "activations (x format)",
            Feature::XPanel(_) => "x layout",
            Feature::W(_) => "weights (w format)",
            Feature::WLayout(..) => "w layout",
            Feature::Y(_) => "output (y format)",
            Feature::Bias(_) => "bias",
            Feature::Act(_) => "activation",
            Feature::Variant(_) => "variant",
            Feature::Schedule(_) => "schedule",
        }
    }

    fn value(&self) -> String {
        match self {
            Feature::X(f) | Feature::W(f) | Feature::Y(f) => format!("`{f}`"),
            Feature::XPanel(false) => "row-major `[e, l]`".into(),
            Feature::XPanel(true) => "panels `[e/ep, l/lp, ep, lp]`".into(),
            Feature::WLayout(l, p, sg) => {
                let mut v = match l {
                    WLayout::Cpu => "CPU panels `[h/hp, l/lp, hp, lp]`",
                    WLayout::Gpu => "GPU `[l/lp, h, lp]`",
                }
                .to_string();
                if *p {
                    v.push_str(" + pair transpose");
                }
                if *sg {
                    v.push_str(" + signed codes");
                }
                v
            }
            Feature::Bias(None) => "none".into(),
            Feature::Bias(Some(f)) => format!("`{f}`"),
            Feature::Act(a) => format!("{a:?}").to_lowercase(),
            Feature::Variant(v) => v.to_string(),
            Feature::Schedule(Sched::RowsAndColumns) => "`parallel e, h`".into(),
            Feature::Schedule(Sched::Columns) => "`parallel h`".into(),
            Feature::Schedule(Sched::Serial) => "no `parallel`".into(),
            Feature::Schedule(Sched::SplitK) => "`split l`".into(),
        }
    }

    /// Words one of which a refusal of this field must contain
    /// (lower-case).
    fn words(&self) -> Vec<String> {
        let s = |v: &[&str]| v.iter().map(|w| w.to_string()).collect::<Vec<_>>();
        match self {
            Feature::X(f) => {
                let mut v = s(&["activation"]);
                v.push(format!("x {f}"));
                v.push(format!("{f} x"));
                if *f == Format::I8Dyn {
                    v.push("i8dyn".into());
                }
                v
            }
            Feature::XPanel(_) => s(&[
                "activations must",
                "activations not",
                "x layout",
                "row-major",
            ]),
            Feature::W(f) => {
                let mut v = vec![f.to_string()];
                let fam = f.to_string();
                v.push(fam.split(':').next().unwrap_or_default().to_string());
                v.push(format!("w {f}"));
                if f.has_f16_params() {
                    v.extend(s(&["f16 group parameters", "f16 parameters"]));
                }
                if f.group().is_some() {
                    v.push("group".into());
                }
                if !f.is_quantized() {
                    v.push(format!("{f} weights"));
                }
                v
            }
            Feature::WLayout(..) => s(&[
                "weights must use",
                "weights of",
                "weight layout",
                "w layout",
                "panel",
                "pair transpose",
                "pair_transpose",
                "pair-transpose",
                "signed-codes",
                "int4_signed_codes",
            ]),
            Feature::Y(f) => {
                let mut v = s(&["output"]);
                v.push(format!("y {f}"));
                v
            }
            Feature::Bias(_) => s(&["bias"]),
            Feature::Act(a) => {
                let mut v = s(&["activation field", "epilogue"]);
                v.push(format!("{a:?}").to_lowercase());
                v
            }
            Feature::Variant(v) => vec!["variant".into(), v.to_string()],
            Feature::Schedule(_) => s(&["schedule", "parallel", "split"]),
        }
    }

    fn named_in(&self, message: &str) -> bool {
        let m = message.to_lowercase();
        self.words().iter().any(|w| m.contains(&w.to_lowercase()))
    }

    /// `base` with this field set to this value. Setting the activation
    /// format also sets the layout it implies on the CPU (i8dyn activations
    /// in panels) and setting the weight format drops a pair transpose the
    /// new format cannot have (8-bit and float weights), as the library
    /// kernels do; the layout fields vary them on their own.
    fn apply(&self, base: &Desc) -> Desc {
        let mut d = *base;
        match *self {
            Feature::X(f) => {
                d.x = f;
                d.x_panel = f == Format::I8Dyn && d.w_layout == WLayout::Cpu;
            }
            Feature::XPanel(p) => d.x_panel = p,
            Feature::W(f) => {
                d.w = f;
                d.pair = d.pair && f.bits() == 4;
                d.signed = d.signed && matches!(f, Format::U4Sym(..));
            }
            Feature::WLayout(l, p, sg) => {
                d.w_layout = l;
                d.pair = p;
                d.signed = sg;
            }
            Feature::Y(f) => d.y = f,
            Feature::Bias(b) => d.bias = b,
            Feature::Act(a) => d.act = a,
            Feature::Variant(v) => d.variant = v,
            Feature::Schedule(x) => d.schedule = x,
        }
        d
    }
}

/// The descriptions each backend family is built around; the one-field
/// substitutions start from those a backend emits.
fn baselines() -> Vec<Desc> {
    let mut v = Vec::new();
    for variant in Variant::ALL {
        let base = Desc {
            x: Format::F32,
            x_panel: false,
            w: Format::F32,
            w_layout: WLayout::Cpu,
            pair: false,
            signed: false,
            y: Format::F32,
            bias: Some(Format::F32),
            act: Activation::None,
            variant,
            schedule: Sched::RowsAndColumns,
        };
        v.push(base);
        v.push(Desc {
            x: Format::F16,
            w: Format::F16,
            y: Format::F16,
            ..base
        });
        v.push(Desc {
            x: Format::I8Dyn,
            x_panel: true,
            w: Format::U4Asym(Group::Size(32), ParamType::F32),
            pair: true,
            ..base
        });
        v.push(Desc {
            x: Format::F16,
            w: Format::U4Asym(Group::Size(32), ParamType::F32),
            w_layout: WLayout::Gpu,
            ..base
        });
        // ggml's Q4_0 (u4sym, f16 parameters): the layout rows' signed
        // codes apply to it alone.
        let q4_0 = Format::U4Sym(Group::Size(32), ParamType::F16);
        v.push(Desc {
            x: Format::I8Dyn,
            x_panel: true,
            w: q4_0,
            pair: true,
            ..base
        });
        v.push(Desc {
            x: Format::F16,
            w: q4_0,
            w_layout: WLayout::Gpu,
            ..base
        });
    }
    v
}

/// Every valid description (the cross product `verify()` accepts).
fn space() -> Vec<Desc> {
    let mut v = Vec::new();
    for x in XS {
        for x_panel in [false, true] {
            for w in weight_formats() {
                for (w_layout, pair, signed) in LAYOUTS {
                    if (pair && w.bits() != 4) || (signed && !matches!(w, Format::U4Sym(..))) {
                        continue;
                    }
                    for y in YS {
                        for bias in BIASES {
                            for act in ACTS {
                                for variant in Variant::ALL {
                                    v.push(Desc {
                                        x,
                                        x_panel,
                                        w,
                                        w_layout,
                                        pair,
                                        signed,
                                        y,
                                        bias,
                                        act,
                                        variant,
                                        schedule: Sched::RowsAndColumns,
                                    });
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    v
}

/// Sizes of the sampled parts of the space: uniform over every valid
/// combination (mostly refusals: most combinations mix a CPU field with a
/// GPU one), and over the combinations whose layouts follow a family's
/// conventions (CPU: weight panels, pair-transposed 4-bit codes and
/// activation panels with i8dyn; GPU: the GPU weight layout, row-major
/// activations), so that many sampled descriptions are emitted and run.
const SAMPLES: [(&str, usize); 3] = [("uniform", 300), ("CPU layouts", 300), ("GPU layouts", 150)];

/// Whether `d` is in the sample stratum `kind` (an index into [`SAMPLES`]).
fn in_stratum(kind: usize, d: &Desc) -> bool {
    match kind {
        1 => {
            d.w_layout == WLayout::Cpu
                && d.pair == (d.w.bits() == 4 && d.x == Format::I8Dyn)
                && d.x_panel == (d.x == Format::I8Dyn)
        }
        2 => d.w_layout == WLayout::Gpu && !d.pair && !d.x_panel,
        _ => true,
    }
}

/// The fixed-seed samples of the valid space, one list per stratum.
fn sample() -> Vec<Vec<Desc>> {
    let mut all = space();
    let mut rng = ChaCha8Rng::seed_from_u64(0x7e55e7a);
    all.shuffle(&mut rng);
    SAMPLES
        .iter()
        .enumerate()
        .map(|(kind, &(_, n))| {
            all.iter()
                .filter(|d| in_stratum(kind, d) && d.kernel().is_some())
                .take(n)
                .copied()
                .collect()
        })
        .collect()
}

// ---------------------------------------------------------------------------
// Backends
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Be {
    X86,
    X86Avx512,
    Host,
    Neon(&'static str),
    OpenCl,
    Ptx80,
    Ptx90,
}

const NEON_TARGETS: [&str; 4] = [
    "aarch64-i8mm",
    "aarch64-dotprod",
    "aarch64-fp16",
    "aarch64-neon",
];

impl Be {
    fn all() -> Vec<Be> {
        let mut v = vec![Be::X86, Be::X86Avx512, Be::Host];
        v.extend(NEON_TARGETS.iter().map(|&t| Be::Neon(t)));
        v.extend([Be::OpenCl, Be::Ptx80, Be::Ptx90]);
        v
    }

    /// The backends surveyed on this host (see the module doc).
    fn surveyed() -> Vec<Be> {
        if cfg!(target_arch = "x86_64") {
            Be::all()
        } else {
            NEON_TARGETS.iter().map(|&t| Be::Neon(t)).collect()
        }
    }

    fn name(self) -> &'static str {
        match self {
            Be::X86 => "x86-avx2",
            Be::X86Avx512 => "x86-avx512",
            Be::Host => "host",
            Be::Neon(t) => t,
            Be::OpenCl => "opencl",
            Be::Ptx80 => "ptx-sm80",
            Be::Ptx90 => "ptx-sm90",
        }
    }

    fn is_gpu(self) -> bool {
        matches!(self, Be::OpenCl | Be::Ptx80 | Be::Ptx90)
    }
}

/// What a backend emitted for one description.
enum Emitted {
    Cpu {
        tile: TileConfig,
        code: MachineCode,
        quant: Option<MachineCode>,
    },
    Gpu {
        // Read by the GPU runs, which exist only on x86-64 hosts.
        #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
        tile: TileConfig,
    },
}

/// Rows the tile is solved for, per variant (as the runtime does).
fn rows(v: Variant) -> u64 {
    match v {
        Variant::Gemv => 1,
        Variant::FlatGemm => 8,
        Variant::Gemm => 4096,
    }
}

/// How many of the solver's ranked tiles are tried before refusing.
const TILE_TRIES: usize = 12;

fn tiles(caps: &TargetCaps, kernel: &Kernel, variant: Variant) -> Result<Vec<TileConfig>, String> {
    let mut p = Problem::from_kernel(caps, kernel).map_err(|e| e.to_string())?;
    p.e = rows(variant);
    let mut t = solve(caps, &p).map_err(|e| e.to_string())?;
    t.truncate(TILE_TRIES);
    Ok(t)
}

/// Tries the solver's tiles in rank order, as kernels-gen and the runtime
/// do: the first that emits wins. A refusal (`Unsupported`) does not
/// depend on the tile, so it ends the search; if only tiles were refused,
/// the first tile error is the answer.
fn first_tile<T>(
    tiles: &[TileConfig],
    mut f: impl FnMut(&TileConfig) -> Result<T, EmitError>,
) -> Result<(TileConfig, T), String> {
    let mut first = None;
    for t in tiles {
        match f(t) {
            Ok(v) => return Ok((*t, v)),
            Err(e @ EmitError::Unsupported { .. }) => return Err(e.to_string()),
            Err(e) => {
                first.get_or_insert(e.to_string());
            }
        }
    }
    Err(first.unwrap_or_else(|| "the solver gave no tile".into()))
}

fn machine(a: Artifact) -> MachineCode {
    match a {
        Artifact::Machine(m) => m,
        Artifact::Source { .. } => unreachable!("a CPU backend emitted source"),
    }
}

fn clif() -> &'static tessera_codegen::clif::ClifBackend {
    static B: OnceLock<tessera_codegen::clif::ClifBackend> = OnceLock::new();
    B.get_or_init(|| tessera_codegen::clif::ClifBackend::host().expect("cranelift for this host"))
}

/// Emit `d` on `be`, or the refusal's message.
fn emit(be: Be, kernel: &Kernel, d: &Desc) -> Result<Emitted, String> {
    use tessera_codegen::x86::X86Backend;
    let v = d.variant;
    match be {
        Be::X86 | Be::X86Avx512 => {
            let x = if be == Be::X86 {
                X86Backend::default()
            } else {
                X86Backend {
                    avx512: true,
                    avx512_vnni: true,
                    ..X86Backend::default()
                }
            };
            let ts = tiles(x.target(kernel, v), kernel, v)?;
            let (tile, code) = first_tile(&ts, |t| x.emit_code_variant(kernel, t, v))?;
            let quant = x.emit_quantizer(kernel, &tile).map_err(|e| e.to_string())?;
            Ok(Emitted::Cpu { tile, code, quant })
        }
        Be::Host => {
            let c = clif();
            // The tiles cranelift can index (`ClifBackend::tiles`), with
            // its refusal when it indexes none.
            let ts = tiles(c.caps(), kernel, v)?;
            let (tile, code) = first_tile(&ts, |t| {
                tessera_codegen::clif::matmul::check_tile(kernel, t)?;
                c.emit_variant(kernel, t, v).map(machine)
            })?;
            let quant = if d.x == Format::I8Dyn {
                Some(c.emit_quantizer(kernel, &tile).map_err(|e| e.to_string())?)
            } else {
                None
            };
            Ok(Emitted::Cpu { tile, code, quant })
        }
        Be::Neon(target) => {
            let n = NeonBackend::new(target).map_err(|e| e.to_string())?;
            let ts = tiles(n.caps(), kernel, v)?;
            let (tile, code) = first_tile(&ts, |t| n.emit_variant(kernel, t, v).map(machine))?;
            let quant = n.quantizer(kernel, &tile).map_err(|e| e.to_string())?;
            Ok(Emitted::Cpu { tile, code, quant })
        }
        Be::OpenCl => {
            let cl = tessera_codegen::opencl::OpenClBackend::new(
                tessera_codegen::opencl::Fp16Mode::Storage,
            );
            let ts = tiles(tessera_codegen::opencl::caps(), kernel, v)?;
            let (tile, _) = first_tile(&ts, |t| cl.program(kernel, t, v))?;
            Ok(Emitted::Gpu { tile })
        }
        Be::Ptx80 | Be::Ptx90 => {
            let p = tessera_codegen::ptx::PtxBackend::new(sm(be));
            let ts = tiles(sm(be).caps(), kernel, v)?;
            let (tile, _) = first_tile(&ts, |t| p.program(kernel, t, v))?;
            Ok(Emitted::Gpu { tile })
        }
    }
}

fn sm(be: Be) -> tessera_codegen::ptx::Sm {
    match be {
        Be::Ptx90 => tessera_codegen::ptx::Sm::Sm90,
        _ => tessera_codegen::ptx::Sm::Sm80,
    }
}

// ---------------------------------------------------------------------------
// The survey: emission decisions, the naming checks, the table
// ---------------------------------------------------------------------------

/// One backend's answer for one description.
struct Outcome {
    desc: Desc,
    kernel: Kernel,
    result: Result<Emitted, String>,
}

struct BackendSurvey {
    be: Be,
    /// One field at a time: per feature, the outcomes of its substitutions.
    single: Vec<(Feature, Vec<usize>)>,
    /// Sampled combinations per stratum (indices into `outcomes`).
    sampled: Vec<Vec<usize>>,
    outcomes: Vec<Outcome>,
    /// Contract violations found while surveying.
    problems: Vec<String>,
}

impl BackendSurvey {
    fn find(&self, d: &Desc) -> Option<usize> {
        self.outcomes.iter().position(|o| o.desc == *d)
    }

    fn add(&mut self, d: Desc) -> Option<usize> {
        if let Some(i) = self.find(&d) {
            return Some(i);
        }
        let kernel = d.kernel()?;
        let result = emit(self.be, &kernel, &d);
        self.outcomes.push(Outcome {
            desc: d,
            kernel,
            result,
        });
        Some(self.outcomes.len() - 1)
    }

    /// The table cell of `f`.
    fn cell(&self, f: &Feature) -> &'static str {
        let Some((_, idx)) = self.single.iter().find(|(g, _)| g == f) else {
            return "—";
        };
        if idx.is_empty() {
            "—"
        } else if idx.iter().any(|&i| self.outcomes[i].result.is_ok()) {
            "runs"
        } else {
            "refused"
        }
    }
}

fn survey_backend(be: Be, samples: &[Vec<Desc>]) -> BackendSurvey {
    let mut s = BackendSurvey {
        be,
        single: Vec::new(),
        sampled: Vec::new(),
        outcomes: Vec::new(),
        problems: Vec::new(),
    };
    let native: Vec<Desc> = baselines()
        .into_iter()
        .filter(|d| s.add(*d).is_some_and(|i| s.outcomes[i].result.is_ok()))
        .collect();
    if native.is_empty() {
        s.problems
            .push(format!("{}: emits none of the baselines", be.name()));
    }
    for f in Feature::all() {
        let mut idx = Vec::new();
        for base in &native {
            let d = f.apply(base);
            let Some(i) = s.add(d) else { continue };
            idx.push(i);
            if let Err(msg) = &s.outcomes[i].result
                && !f.named_in(msg)
            {
                s.problems.push(format!(
                    "{}: refusal of {} = {} does not name the field ({})\n    description: {}\n    error: {msg}",
                    be.name(),
                    f.field(),
                    f.value(),
                    f.words().join(" | "),
                    d.label()
                ));
            }
        }
        s.single.push((f, idx));
    }
    for (kind, d) in samples
        .iter()
        .enumerate()
        .flat_map(|(kind, list)| list.iter().map(move |d| (kind, d)))
    {
        let Some(i) = s.add(*d) else { continue };
        if s.sampled.len() <= kind {
            s.sampled.resize(kind + 1, Vec::new());
        }
        s.sampled[kind].push(i);
        if let Err(msg) = &s.outcomes[i].result
            && !d.features().iter().any(|f| f.named_in(msg))
        {
            s.problems.push(format!(
                "{}: refusal names none of the description's fields\n    description: {}\n    error: {msg}",
                be.name(),
                d.label()
            ));
        }
    }
    // Fields the host ABI cannot carry: the bias pointer is f32 on every
    // backend, so a bias stored in another format must be refused.
    for o in &s.outcomes {
        if o.result.is_ok() && o.desc.bias.is_some_and(|b| b != Format::F32) {
            s.problems.push(format!(
                "{}: emits a kernel whose bias is {} but reads the bias as f32 (the bias field is ignored)\n    description: {}",
                be.name(),
                o.desc.bias.unwrap_or(Format::F32),
                o.desc.label()
            ));
        }
    }
    s
}

struct Survey {
    backends: Vec<BackendSurvey>,
}

fn survey() -> &'static Survey {
    static S: OnceLock<Survey> = OnceLock::new();
    S.get_or_init(|| {
        let samples = sample();
        let bes = Be::surveyed();
        // Two threads (CI has two cores): backends alternate between them.
        type Share = Vec<(usize, Be)>;
        let (a, b): (Share, Share) = bes
            .iter()
            .copied()
            .enumerate()
            .partition(|(i, _)| i % 2 == 0);
        let run = |list: Vec<(usize, Be)>| {
            list.into_iter()
                .map(|(i, be)| (i, survey_backend(be, &samples)))
                .collect::<Vec<_>>()
        };
        let mut out: Vec<(usize, BackendSurvey)> = std::thread::scope(|sc| {
            let h = sc.spawn(|| run(b));
            let mut v = run(a);
            v.extend(h.join().expect("survey thread"));
            v
        });
        out.sort_by_key(|(i, _)| *i);
        Survey {
            backends: out.into_iter().map(|(_, s)| s).collect(),
        }
    })
}

fn table(s: &Survey) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "# Conformance: the kernel description is a contract\n\n\
         Generated by `TESSERA_BLESS_CONFORMANCE=1 cargo test -p tessera-tests --test conformance`\n\
         (`tests/tests/conformance.rs`); the same test fails when this file is stale.\n\n\
         Every backend either does what each field of a matmul description says or refuses\n\
         the description with an error naming the field. The suite checks both halves: a\n\
         refusal must name the field (its message contains one of the field's words), and\n\
         everything a backend emits is run against the reference interpreter on random\n\
         inputs with tails in M, N and K wherever the test host can run it (x86 and the\n\
         cranelift host natively, NEON under qemu-aarch64 via `scripts/test-aarch64.sh`,\n\
         OpenCL on PoCL, PTX on the test simulator). Scale and zero point are not fields of\n\
         their own: `verify()` requires them exactly when the formats need them, so they\n\
         follow the weight and activation formats. fp8 is a KV-cache format; `verify()`\n\
         refuses it as a matmul weight.\n\n\
         **runs**: the backend emits this value of the field (with at least one of its\n\
         baselines: f32, f16, W4A8 and Q4_0 CPU kernels, the W4A16 and Q4_0 A16 GPU kernels,\n\
         each as GEMV, flat GEMM and GEMM), and the emitted code agrees with the interpreter. **refused**: every\n\
         such description is refused with an error naming the field. x86-avx512 is the x86\n\
         backend with AVX-512 on: its own kernels serve f32 and W4A8 (u4asym, f32 parameters,\n\
         groups up to 32) GEMMs, everything else runs the AVX2 kernels. The host column is\n\
         cranelift on x86-64.\n\n\
         The schedule rows: a CPU kernel's code is the same whatever `parallel` says; the\n\
         host run spreads output channels over threads only when `h` is listed, and runs\n\
         every range on the calling thread otherwise (`clif_matmul.rs` tests both). A GPU\n\
         launch spreads rows and channels over thread blocks, so it needs both listed. No\n\
         backend splits a matmul's K, so `split l` is refused everywhere.\n"
    );
    let names: Vec<&str> = s.backends.iter().map(|b| b.be.name()).collect();
    let _ = writeln!(t, "## One field at a time\n");
    let _ = writeln!(t, "| field | value | {} |", names.join(" | "));
    let _ = writeln!(t, "|---|---|{}", "---|".repeat(names.len()));
    let mut last = "";
    for f in Feature::all() {
        let field = if f.field() == last { "" } else { f.field() };
        last = f.field();
        let cells: Vec<&str> = s.backends.iter().map(|b| b.cell(&f)).collect();
        let _ = writeln!(t, "| {field} | {} | {} |", f.value(), cells.join(" | "));
    }
    let valid = space().iter().filter(|d| d.kernel().is_some()).count();
    let _ = writeln!(
        t,
        "\n## Sampled combinations\n\n\
         Descriptions drawn with a fixed seed from the {valid} valid combinations of the\n\
         fields above: uniformly, and among those whose layouts follow the CPU or the GPU\n\
         conventions (weight panels with pair-transposed 4-bit codes and activation panels\n\
         for i8dyn; the GPU weight layout with row-major activations). Each refusal names\n\
         one of its fields; each emitted kernel is run where the host can (CPU backends:\n\
         all of them; OpenCL and PTX: a cover of every field value they emit).\n"
    );
    let _ = writeln!(t, "| sample | | {} |", names.join(" | "));
    let _ = writeln!(t, "|---|---|{}", "---|".repeat(names.len()));
    for (kind, (label, n)) in SAMPLES.iter().enumerate() {
        for (ok, what) in [(true, "runs"), (false, "refused")] {
            let cells: Vec<String> = s
                .backends
                .iter()
                .map(|b| {
                    b.sampled
                        .get(kind)
                        .map_or(0, |v| {
                            v.iter()
                                .filter(|&&i| b.outcomes[i].result.is_ok() == ok)
                                .count()
                        })
                        .to_string()
                })
                .collect();
            let head = if ok {
                format!("{label} ({n})")
            } else {
                String::new()
            };
            let _ = writeln!(t, "| {head} | {what} | {} |", cells.join(" | "));
        }
    }
    t
}

fn doc_path() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/CONFORMANCE.md")
}

/// Refusals name their field; the table in `docs/CONFORMANCE.md` is the
/// one this survey makes.
#[test]
fn refusals_name_the_field_and_the_table_is_current() {
    let s = survey();
    let problems: Vec<&String> = s.backends.iter().flat_map(|b| &b.problems).collect();
    assert!(
        problems.is_empty(),
        "{} contract violations:\n{}",
        problems.len(),
        problems
            .iter()
            .map(|p| p.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
    if !cfg!(target_arch = "x86_64") {
        eprintln!("SKIP table: docs/CONFORMANCE.md is generated and compared on x86-64 hosts");
        return;
    }
    let want = table(s);
    let path = doc_path();
    if std::env::var_os("TESSERA_BLESS_CONFORMANCE").is_some() {
        std::fs::write(&path, &want).expect("write docs/CONFORMANCE.md");
        return;
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    if have != want {
        let diff: Vec<String> = want
            .lines()
            .zip(have.lines().chain(std::iter::repeat("")))
            .filter(|(w, h)| w != h)
            .take(10)
            .map(|(w, h)| format!("  doc:  {h}\n  want: {w}"))
            .collect();
        panic!(
            "docs/CONFORMANCE.md is stale; regenerate it with \
             TESSERA_BLESS_CONFORMANCE=1 cargo test -p tessera-tests --test conformance\n{}",
            diff.join("\n")
        );
    }
}

/// The survey sees both halves of the contract on every backend: each
/// emits its baselines and refuses something.
#[test]
fn every_backend_emits_and_refuses() {
    for b in &survey().backends {
        let ok = b.outcomes.iter().filter(|o| o.result.is_ok()).count();
        assert!(ok > 0, "{} emitted nothing", b.be.name());
        assert!(ok < b.outcomes.len(), "{} refused nothing", b.be.name());
    }
}

// ---------------------------------------------------------------------------
// Runs against the interpreter
// ---------------------------------------------------------------------------

/// One random problem: inputs, the interpreter's answer and the tolerance
/// of each output.
struct Case {
    m: usize,
    n: usize,
    k: usize,
    x: Vec<f32>,
    w_raw: Vec<f32>,
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    w: Value,
    qt: Option<QuantTensor>,
    bias: Option<Vec<f32>>,
    want: Vec<f32>,
    mag: Vec<f32>,
}

/// A shape for the variant with tails in M, N and K.
fn shape(v: Variant, rng: &mut ChaCha8Rng) -> (usize, usize, usize) {
    let m = match v {
        Variant::Gemv => 1,
        Variant::FlatGemm => rng.gen_range(2..=16),
        Variant::Gemm => rng.gen_range(1..=23),
    };
    (m, rng.gen_range(1..=41), rng.gen_range(1..=300))
}

fn case(kernel: &Kernel, d: &Desc, seed: u64) -> Case {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (m, n, k) = shape(d.variant, &mut rng);
    let round = |f: Format, v: Vec<f32>| match f {
        Format::F16 => v.iter().map(|&a| f16::from_f32(a).to_f32()).collect(),
        _ => v,
    };
    let x: Vec<f32> = round(d.x, (0..m * k).map(|_| rng.gen_range(-1.0..1.0)).collect());
    let w_raw: Vec<f32> = (0..n * k).map(|_| rng.gen_range(-0.6..0.7)).collect();
    let bias: Option<Vec<f32>> = d.bias.map(|f| {
        round(
            f,
            (0..n)
                .map(|_| rng.gen_range(-1.0f32..1.0))
                .collect::<Vec<_>>(),
        )
    });
    let (w, qt, dense) = if d.w.is_quantized() {
        let q = quantize(d.w, n, k, &w_raw).expect("quantize");
        let dense = q.dequantize();
        (Value::Quant(q.clone()), Some(q), dense)
    } else {
        let dense = round(d.w, w_raw.clone());
        (Value::from_f32(d.w, &w_raw).expect("float"), None, dense)
    };
    let mut b = Bindings::new()
        .extent("e", m)
        .extent("h", n)
        .extent("l", k)
        .tensor("x", Value::from_f32(d.x, &x).expect("x"))
        .tensor("w", w.clone());
    if let (Some(f), Some(bv)) = (d.bias, &bias) {
        b = b.tensor("bias", Value::from_f32(f, bv).expect("bias"));
    }
    let want = interp::run(kernel, &b)
        .expect("the interpreter runs every valid description")
        .get("y")
        .expect("y")
        .to_vec();
    let mut mag = vec![0f32; m * n];
    for r in 0..m {
        for c in 0..n {
            mag[r * n + c] = (0..k)
                .map(|l| (x[r * k + l] * dense[c * k + l]).abs())
                .sum::<f32>()
                + bias.as_ref().map_or(0.0, |b| b[c].abs());
        }
    }
    Case {
        m,
        n,
        k,
        x,
        w_raw,
        w,
        qt,
        bias,
        want,
        mag,
    }
}

/// Compares with a tolerance relative to Σ|x·w| + |bias|: f32 accumulation
/// on the float paths (growing with √k), the f32 rounding of the int8
/// path's scale products, half-precision staging on the GPU and f16
/// operands, f16 accumulation (growing with √k) where NEON multiplies f16
/// by f16 (`fmla .8h`, every target with fp16 arithmetic), f16 rounding of
/// f16 outputs.
fn compare(be: Be, d: &Desc, c: &Case, got: &[f32]) -> Result<(), String> {
    let f16_macs = matches!(be, Be::Neon(t) if t != "aarch64-neon")
        && d.x == Format::F16
        && d.w == Format::F16;
    let rel = if f16_macs {
        2f32.powi(-10) * (2.0 * (c.k as f32).sqrt() + 2.0)
    } else if be.is_gpu() {
        if d.variant == Variant::Gemv && d.w != Format::F16 {
            2e-5
        } else {
            2f32.powi(-10)
        }
    } else if d.x == Format::I8Dyn {
        2f32.powi(-20)
    } else if d.x == Format::F16 || d.w == Format::F16 {
        2f32.powi(-10)
    } else {
        2f32.powi(-22) * (2.0 * (c.k as f32).sqrt() + 2.0)
    };
    if got.len() != c.want.len() {
        return Err(format!("{} outputs, want {}", got.len(), c.want.len()));
    }
    for (i, (&g, &w)) in got.iter().zip(&c.want).enumerate() {
        let out_round = if d.y == Format::F16 {
            2f32.powi(-10) * w.abs()
        } else {
            0.0
        };
        let tol = rel * c.mag[i] + out_round + 1e-5;
        if (g - w).abs() > tol || g.is_nan() {
            return Err(format!(
                "m={} n={} k={}: y[{}, {}] = {g}, interpreter {w} (tolerance {tol:e})",
                c.m,
                c.n,
                c.k,
                i / c.n,
                i % c.n
            ));
        }
    }
    Ok(())
}

/// Runs emitted CPU code for one case.
fn run_cpu(
    kernel: &Kernel,
    d: &Desc,
    tile: &TileConfig,
    code: &MachineCode,
    quant: Option<&MachineCode>,
    c: &Case,
    threads: usize,
) -> Result<Vec<f32>, String> {
    let host =
        HostMatmul::new(kernel, HostTile::from(tile), quant, code).map_err(|e| e.to_string())?;
    let weights = match &c.qt {
        Some(q) => host.pack_weights(c.n, c.k, WeightsIn::Quant(q)),
        None => host.pack_weights(c.n, c.k, WeightsIn::F32(&c.w_raw)),
    }
    .map_err(|e| e.to_string())?;
    let xh: Vec<f16> = c.x.iter().map(|&v| f16::from_f32(v)).collect();
    let input = if d.x == Format::F16 {
        HostInput::F16(&xh)
    } else {
        HostInput::F32(&c.x)
    };
    let bias = c.bias.as_deref();
    if d.y == Format::F16 {
        let mut y = vec![f16::NAN; c.m * c.n];
        host.run(input, c.m, &weights, bias, HostOutput::F16(&mut y), threads)
            .map_err(|e| e.to_string())?;
        Ok(y.iter().map(|v| v.to_f32()).collect())
    } else {
        let mut y = vec![f32::NAN; c.m * c.n];
        host.run(input, c.m, &weights, bias, HostOutput::F32(&mut y), threads)
            .map_err(|e| e.to_string())?;
        Ok(y)
    }
}

/// Runs every description `be` emitted (one field at a time and sampled)
/// on this CPU and compares with the interpreter; returns how many ran.
fn run_cpu_backend(be: Be) -> usize {
    let Some(b) = survey().backends.iter().find(|b| b.be == be) else {
        return 0;
    };
    let mut failures = Vec::new();
    let mut ran = 0;
    for (i, o) in b.outcomes.iter().enumerate() {
        let Ok(Emitted::Cpu { tile, code, quant }) = &o.result else {
            continue;
        };
        let c = case(&o.kernel, &o.desc, 1000 + i as u64);
        ran += 1;
        let got = run_cpu(
            &o.kernel,
            &o.desc,
            tile,
            code,
            quant.as_ref(),
            &c,
            1 + i % 2,
        );
        if let Err(e) = got.and_then(|g| compare(be, &o.desc, &c, &g)) {
            failures.push(format!(
                "{} tile {}x{}x{}: {}\n    {e}",
                be.name(),
                tile.ep,
                tile.hp,
                tile.lp,
                o.desc.label()
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {ran} emitted kernels disagree with the interpreter:\n{}",
        failures.len(),
        failures.join("\n")
    );
    eprintln!(
        "{}: {ran} emitted kernels agree with the interpreter",
        be.name()
    );
    ran
}

#[cfg(target_arch = "x86_64")]
#[test]
fn x86_avx2_runs_match_the_interpreter() {
    let missing = tessera_codegen::x86::missing_features();
    if !missing.is_empty() {
        eprintln!("SKIP x86-avx2 runs: this CPU lacks {}", missing.join(", "));
        return;
    }
    assert!(run_cpu_backend(Be::X86) > 0);
}

#[cfg(target_arch = "x86_64")]
#[test]
fn x86_avx512_runs_match_the_interpreter() {
    use tessera_codegen::x86::{host_has_avx512, host_has_avx512_vnni};
    if !(host_has_avx512() && host_has_avx512_vnni()) {
        eprintln!(
            "SKIP x86-avx512 runs: this CPU lacks AVX-512F/BW/VNNI (its emission is surveyed)"
        );
        return;
    }
    assert!(run_cpu_backend(Be::X86Avx512) > 0);
}

#[cfg(target_arch = "x86_64")]
#[test]
fn host_runs_match_the_interpreter() {
    assert!(run_cpu_backend(Be::Host) > 0);
}

/// NEON targets this CPU runs (feature detection: a SIGILL would kill the
/// whole binary).
#[cfg(target_arch = "aarch64")]
fn neon_runnable(target: &str) -> bool {
    use std::arch::is_aarch64_feature_detected as has;
    match target {
        "aarch64-i8mm" => has!("i8mm") && has!("dotprod") && has!("fp16"),
        "aarch64-dotprod" => has!("dotprod") && has!("fp16"),
        "aarch64-fp16" => has!("fp16"),
        _ => true,
    }
}

#[cfg(target_arch = "aarch64")]
#[test]
fn neon_runs_match_the_interpreter() {
    for t in NEON_TARGETS {
        if neon_runnable(t) {
            assert!(run_cpu_backend(Be::Neon(t)) > 0);
        } else {
            eprintln!("SKIP {t} runs: this CPU lacks its features");
        }
    }
}

/// At most this many OpenCL programs or simulated PTX kernels per backend.
#[cfg(target_arch = "x86_64")]
const RUN_CAP: usize = 48;

/// A greedy cover of every field value `be` emits: the descriptions to run
/// where running is slow (OpenCL builds, the PTX simulator).
#[cfg(target_arch = "x86_64")]
fn cover(b: &BackendSurvey, cap: usize) -> Vec<usize> {
    let mut uncovered: HashSet<Feature> = b
        .outcomes
        .iter()
        .filter(|o| o.result.is_ok())
        .flat_map(|o| o.desc.features())
        .collect();
    let mut chosen = Vec::new();
    while !uncovered.is_empty() && chosen.len() < cap {
        let best = b
            .outcomes
            .iter()
            .enumerate()
            .filter(|(i, o)| o.result.is_ok() && !chosen.contains(i))
            .max_by_key(|(i, o)| {
                (
                    o.desc
                        .features()
                        .iter()
                        .filter(|f| uncovered.contains(f))
                        .count(),
                    std::cmp::Reverse(*i),
                )
            });
        let Some((i, o)) = best else { break };
        for f in o.desc.features() {
            uncovered.remove(&f);
        }
        chosen.push(i);
    }
    assert!(
        uncovered.is_empty(),
        "{}: {cap} runs do not cover {uncovered:?}",
        b.be.name()
    );
    chosen
}

#[cfg(target_arch = "x86_64")]
#[test]
fn opencl_runs_match_the_interpreter() {
    use tessera_codegen::opencl::OpenClBackend;
    use tessera_runtime::opencl::{ClDevice, run_matmul};
    let b = survey()
        .backends
        .iter()
        .find(|b| b.be == Be::OpenCl)
        .expect("surveyed");
    let dev = match ClDevice::first() {
        Ok(d) => d.with_cache_dir(
            std::env::temp_dir().join(format!("tessera-conformance-cl-{}", std::process::id())),
        ),
        Err(e) => {
            tessera_dsl::testing::missing_tool(
                "conformance OpenCL runs",
                &format!("no OpenCL platform (PoCL): {e}"),
            );
            return;
        }
    };
    let mut failures = Vec::new();
    let chosen = cover(b, RUN_CAP);
    for &i in &chosen {
        let o = &b.outcomes[i];
        let Ok(Emitted::Gpu { tile }) = &o.result else {
            unreachable!()
        };
        let program = OpenClBackend::new(dev.fp16_mode())
            .program(&o.kernel, tile, o.desc.variant)
            .expect("emitted in Storage mode, so in the device's");
        let c = case(&o.kernel, &o.desc, 2000 + i as u64);
        let xh: Vec<f16> = c.x.iter().map(|&v| f16::from_f32(v)).collect();
        let got = run_matmul(&dev, &program, &xh, &c.w, c.bias.as_deref(), c.m, c.n, c.k)
            .map_err(|e| e.to_string());
        if let Err(e) = got.and_then(|g| compare(Be::OpenCl, &o.desc, &c, &g)) {
            failures.push(format!("opencl: {}\n    {e}", o.desc.label()));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} OpenCL kernels disagree with the interpreter:\n{}",
        failures.len(),
        chosen.len(),
        failures.join("\n")
    );
    eprintln!(
        "opencl: {} kernels agree with the interpreter",
        chosen.len()
    );
}

#[cfg(target_arch = "x86_64")]
fn run_ptx(be: Be, o: &Outcome, tile: &TileConfig, c: &Case) -> Result<Vec<f32>, String> {
    use tessera_codegen::gpu::WEIGHT_LP;
    use tessera_dsl::quant::{
        ElemWidth, PackPlan, Tile, WeightPacking, gpu_weight_layout, pack_weights,
    };
    let prog = tessera_codegen::ptx::PtxBackend::new(sm(be))
        .program(&o.kernel, tile, o.desc.variant)
        .map_err(|e| e.to_string())?;
    let (codes, scales, offsets) = match (&c.w, &c.qt) {
        (_, Some(q)) => {
            let p = pack_weights(
                q,
                WeightPacking::Gpu {
                    lp: WEIGHT_LP as usize,
                },
            )
            .map_err(|e| e.to_string())?;
            (
                p.codes,
                tessera_dsl::quant::param_bytes(q.format, &p.scales),
                tessera_dsl::quant::param_bytes(q.format, &p.offsets),
            )
        }
        (Value::F16(w), None) => {
            let plan = PackPlan::new(
                &gpu_weight_layout(),
                &[("h", c.n), ("l", c.k)],
                &[Tile::new("lp", "l", WEIGHT_LP as usize)],
                ElemWidth::B16,
            )
            .map_err(|e| e.to_string())?;
            let bytes: Vec<u8> = w.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect();
            (
                plan.pack(&bytes).map_err(|e| e.to_string())?,
                vec![],
                vec![],
            )
        }
        _ => return Err(format!("weights {} on the PTX simulator", o.desc.w)),
    };
    let x_f16: Vec<u8> =
        c.x.iter()
            .flat_map(|&v| f16::from_f32(v).to_bits().to_le_bytes())
            .collect();
    let ops = ptx_sim::MatmulOperands {
        x_f16,
        codes,
        scales,
        offsets,
        bias: c.bias.clone().unwrap_or_default(),
    };
    Ok(ptx_sim::run_matmul(&prog, ops, [c.m, c.n, c.k]))
}

#[cfg(target_arch = "x86_64")]
#[test]
fn ptx_runs_match_the_simulator() {
    for be in [Be::Ptx80, Be::Ptx90] {
        let b = survey()
            .backends
            .iter()
            .find(|b| b.be == be)
            .expect("surveyed");
        let chosen = cover(b, RUN_CAP);
        let mut failures = Vec::new();
        for &i in &chosen {
            let o = &b.outcomes[i];
            let Ok(Emitted::Gpu { tile }) = &o.result else {
                unreachable!()
            };
            let c = case(&o.kernel, &o.desc, 3000 + i as u64);
            let got = run_ptx(be, o, tile, &c);
            if let Err(e) = got.and_then(|g| compare(be, &o.desc, &c, &g)) {
                failures.push(format!("{}: {}\n    {e}", be.name(), o.desc.label()));
            }
        }
        assert!(
            failures.is_empty(),
            "{} of {} PTX kernels disagree with the interpreter:\n{}",
            failures.len(),
            chosen.len(),
            failures.join("\n")
        );
        eprintln!(
            "{}: {} kernels agree with the interpreter (simulated)",
            be.name(),
            chosen.len()
        );
    }
}
