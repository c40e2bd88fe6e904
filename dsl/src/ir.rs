//! The kernel IR: one `Kernel` type that flows from the DSL to every backend.
//!
//! A kernel is a loop nest over named [`Axis`]es, a set of [`Tensor`]s indexed
//! by those axes (each with a storage [`Format`] and a memory [`Layout`]), one
//! computation ([`Op`]: the matmul family or attention) and a [`Schedule`]
//! (which axes are tiled by the solver, which run in parallel, buffering and
//! softmax options). Everything is plain data with deterministic ordering
//! (vectors, never hash maps) so that the canonical text form and every
//! emitter are byte-reproducible.
//!
//! Names are ASCII identifiers (`[A-Za-z_][A-Za-z0-9_]*`); kernel names may
//! also contain `-` (library short names like `matmul-w4a8`).

use std::fmt;

/// Weight/KV quantization group along the reduction axis.
///
/// `Size(n)`: one (scale, offset) pair per `n` consecutive reduction elements
/// of a row. `Row`: one pair per whole row — per output channel for weights,
/// per token (and KV head) for a KV cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Group {
    Size(u32),
    Row,
}

impl Group {
    /// Group length for a row of `cols` reduction elements.
    pub fn len(self, cols: usize) -> usize {
        match self {
            Group::Size(n) => n as usize,
            Group::Row => cols,
        }
    }
}

impl fmt::Display for Group {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Group::Size(n) => write!(f, "g{n}"),
            Group::Row => f.write_str("row"),
        }
    }
}

/// Storage precision of a quantized format's per-group parameters (scales
/// and offsets).
///
/// At M = 1 a matmul is a read of the weights, so parameter bytes are time:
/// f16 parameters take `u4asym:g32` from 6 to 5 bits per weight, and make
/// `u4sym:g32:f16` / `i8sym:g32:f16` exactly ggml's Q4_0 / Q8_0 blocks (and
/// `u4asym:g32:f16` its Q4_1). Kernels widen f16 parameters to f32 in
/// registers; everything after the widening is computed in f32.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ParamType {
    #[default]
    F32,
    F16,
}

impl ParamType {
    /// Bytes one stored parameter takes.
    pub fn bytes(self) -> usize {
        match self {
            ParamType::F32 => 4,
            ParamType::F16 => 2,
        }
    }
}

impl fmt::Display for ParamType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ParamType::F32 => "f32",
            ParamType::F16 => "f16",
        })
    }
}

/// Storage format of a tensor's elements.
///
/// Float formats hold values directly. Quantized formats hold integer codes
/// plus per-group parameters; their exact byte layouts and formulas live in
/// [`crate::quant`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Format {
    F32,
    F16,
    BF16,
    /// Activations quantized on the fly, per row, symmetric: scale =
    /// absmax/127, q = round_ties_even(x·127/absmax) in [-127, 127]. The
    /// caller passes f32; the kernel quantizes (no scalar pre-pass).
    I8Dyn,
    /// Asymmetric 4-bit (MNN-LLM formula (1)) stored pre-converted to uint4
    /// codes 0..=15: w = scale·q + min, per group (with f16 parameters and
    /// groups of 32: ggml's Q4_1).
    U4Asym(Group, ParamType),
    /// Symmetric 4-bit, uint4 codes 0..=15 with an implied zero point of 8:
    /// w = scale·(q − 8), per group, no offset stored (with f16 parameters
    /// and groups of 32: ggml's Q4_0, bit for bit).
    U4Sym(Group, ParamType),
    /// Symmetric int8: w = scale·q, q in [-127, 127], per group (with f16
    /// parameters and groups of 32: ggml's Q8_0).
    I8Sym(Group, ParamType),
    /// Asymmetric int8 (formula (1) with clip [-128, 127]): w = scale·(q+128) + min.
    I8Asym(Group, ParamType),
    /// E0M4 FP4 (Transformer-Lite 2.3): 4 fraction bits of an fp16 in [2, 4):
    /// w = (2 + q/8)·scale + bias, per group.
    E0M4(Group, ParamType),
    /// fp8 e4m3 (OCP, finite, max 448), stored as is; used for KV values.
    Fp8E4M3,
    /// fp8 e5m2 (OCP, IEEE-like), stored as is; used for KV values.
    Fp8E5M2,
}

impl Format {
    pub fn is_float(self) -> bool {
        matches!(
            self,
            Format::F32 | Format::F16 | Format::BF16 | Format::Fp8E4M3 | Format::Fp8E5M2
        )
    }

    /// Has integer codes whose real value needs a scale in the epilogue.
    pub fn is_quantized(self) -> bool {
        !self.is_float()
    }

    /// Has an offset (min / bias) term, so a matmul needs zero-point correction.
    pub fn is_asymmetric(self) -> bool {
        matches!(
            self,
            Format::U4Asym(..) | Format::I8Asym(..) | Format::E0M4(..)
        )
    }

    /// Whether an integer matmul needs Σ x per weight group: asymmetric
    /// formats for their offset term, `u4sym` for its implied zero point
    /// (Σ x·(q − 8) = Σ x·q − 8·Σ x).
    pub fn needs_x_sums(self) -> bool {
        self.is_asymmetric() || matches!(self, Format::U4Sym(..))
    }

    /// Quantization group, if the format has one.
    pub fn group(self) -> Option<Group> {
        match self {
            Format::U4Asym(g, _)
            | Format::U4Sym(g, _)
            | Format::I8Sym(g, _)
            | Format::I8Asym(g, _)
            | Format::E0M4(g, _) => Some(g),
            Format::I8Dyn => Some(Group::Row),
            _ => None,
        }
    }

    /// Storage precision of the per-group parameters of a format stored
    /// with them (`None` for float formats and `i8dyn`, whose one scale
    /// per row the kernel computes and keeps in f32).
    pub fn params(self) -> Option<ParamType> {
        match self {
            Format::U4Asym(_, p)
            | Format::U4Sym(_, p)
            | Format::I8Sym(_, p)
            | Format::I8Asym(_, p)
            | Format::E0M4(_, p) => Some(p),
            _ => None,
        }
    }

    /// Whether the per-group parameters are stored as f16.
    pub fn has_f16_params(self) -> bool {
        self.params() == Some(ParamType::F16)
    }

    /// Stored bits per element, parameters included (amortised over the
    /// group; `Row` groups count as free): the figure decode time follows.
    pub fn bits_per_weight(self) -> f64 {
        let bits = f64::from(self.bits());
        match (self.group(), self.params()) {
            (Some(Group::Size(g)), Some(p)) => {
                let n = if self.is_asymmetric() { 2.0 } else { 1.0 };
                bits + n * 8.0 * p.bytes() as f64 / f64::from(g)
            }
            _ => bits,
        }
    }

    /// Bits per stored element (codes only, parameters excluded).
    pub fn bits(self) -> u32 {
        match self {
            Format::F32 => 32,
            Format::F16 | Format::BF16 => 16,
            Format::I8Dyn | Format::I8Sym(..) | Format::I8Asym(..) => 8,
            Format::Fp8E4M3 | Format::Fp8E5M2 => 8,
            Format::U4Asym(..) | Format::U4Sym(..) | Format::E0M4(..) => 4,
        }
    }

    /// Every format, with a representative group, for exhaustive tests.
    pub fn examples() -> Vec<Format> {
        let mut v = vec![
            Format::F32,
            Format::F16,
            Format::BF16,
            Format::I8Dyn,
            Format::Fp8E4M3,
            Format::Fp8E5M2,
        ];
        for g in [
            Group::Size(32),
            Group::Size(64),
            Group::Size(128),
            Group::Row,
        ] {
            for p in [ParamType::F32, ParamType::F16] {
                v.extend([
                    Format::U4Asym(g, p),
                    Format::U4Sym(g, p),
                    Format::I8Sym(g, p),
                    Format::I8Asym(g, p),
                    Format::E0M4(g, p),
                ]);
            }
        }
        v
    }
}

impl fmt::Display for Format {
    /// Canonical spelling, also accepted by the parser: `f32`, `f16`, `bf16`,
    /// `i8dyn`, `u4asym:g32`, `u4sym:g32:f16`, `i8sym:row`, `i8asym:g64`,
    /// `e0m4:g128`, `fp8e4m3`, `fp8e5m2`. f32 parameters are the default and
    /// are not spelled; f16 parameters add `:f16`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Format::F32 => f.write_str("f32"),
            Format::F16 => f.write_str("f16"),
            Format::BF16 => f.write_str("bf16"),
            Format::I8Dyn => f.write_str("i8dyn"),
            Format::U4Asym(g, p) => write!(f, "u4asym:{g}{}", param_suffix(*p)),
            Format::U4Sym(g, p) => write!(f, "u4sym:{g}{}", param_suffix(*p)),
            Format::I8Sym(g, p) => write!(f, "i8sym:{g}{}", param_suffix(*p)),
            Format::I8Asym(g, p) => write!(f, "i8asym:{g}{}", param_suffix(*p)),
            Format::E0M4(g, p) => write!(f, "e0m4:{g}{}", param_suffix(*p)),
            Format::Fp8E4M3 => f.write_str("fp8e4m3"),
            Format::Fp8E5M2 => f.write_str("fp8e5m2"),
        }
    }
}

/// The text form's parameter suffix: none for the default f32, `:f16`.
fn param_suffix(p: ParamType) -> &'static str {
    match p {
        ParamType::F32 => "",
        ParamType::F16 => ":f16",
    }
}

/// Size of an axis: fixed in the kernel, or bound when the kernel is called.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Extent {
    Dyn,
    Fixed(u32),
}

/// Whether an axis indexes the output or is summed over.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AxisKind {
    Spatial,
    Reduce,
}

/// A named loop axis.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Axis {
    pub name: String,
    pub extent: Extent,
    pub kind: AxisKind,
}

/// What a tensor is to the kernel, which decides who may write it and when
/// its layout is produced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// Activations, read each call.
    Input,
    /// Weights: packed once offline into `layout`, read each call.
    Weight,
    /// Written by the kernel.
    Output,
    /// KV cache: persistent state, appended in place along its outermost
    /// axis, never re-laid out per step.
    Cache,
}

/// One dimension of a memory layout, outermost first.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum LayoutDim {
    /// The whole axis: `h`.
    Whole(String),
    /// The number of tiles of `axis`: `h/hp`.
    Outer { axis: String, tile: String },
    /// The position inside one tile: `hp` (the tile variable names its axis).
    Inner { tile: String },
}

/// A memory layout: the order of (possibly tiled) dimensions, outermost
/// first. Row-major over the tensor's dims is `[d0, d1, ...]`.
///
/// Tiled dimensions are padded to a whole number of tiles (tails are zero).
/// `int4_pair_transpose` (seed 000 IV.D) stores every run of 32 consecutive
/// 4-bit codes (in layout order) as 16 bytes with byte j = `code[j] |
/// code[j+16] << 4`, so unpacking is one `and` and one shift, no `zip`.
///
/// `int4_signed_codes` stores each code q of a format with the implied zero
/// point 8 (`u4sym`, ggml's Q4_0) as q XOR 8, i.e. q − 8 in two's
/// complement, the way KleidiAI's `qsi4` kernels store theirs: a shift
/// then leaves 16·(q − 8) in a byte, so an int8 dot product needs no
/// zero-point term and no per-load fix-up in the loop. The values are the
/// same; only the stored bits differ.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Layout {
    pub dims: Vec<LayoutDim>,
    pub int4_pair_transpose: bool,
    pub int4_signed_codes: bool,
}

impl Layout {
    /// Row-major over the given axes.
    pub fn row_major<S: AsRef<str>>(axes: &[S]) -> Layout {
        Layout {
            dims: axes
                .iter()
                .map(|a| LayoutDim::Whole(a.as_ref().to_string()))
                .collect(),
            int4_pair_transpose: false,
            int4_signed_codes: false,
        }
    }

    /// Is this exactly row-major over `axes`?
    pub fn is_row_major<S: AsRef<str>>(&self, axes: &[S]) -> bool {
        *self == Layout::row_major(axes)
    }

    /// Is this `[a/at, b/bt, at, bt]`: both axes tiled, tile counts
    /// outermost (the CPU panel layouts of activations and weights)?
    pub fn is_blocked(&self, a: &str, at: &str, b: &str, bt: &str) -> bool {
        self.dims
            == [
                LayoutDim::Outer {
                    axis: a.to_string(),
                    tile: at.to_string(),
                },
                LayoutDim::Outer {
                    axis: b.to_string(),
                    tile: bt.to_string(),
                },
                LayoutDim::Inner {
                    tile: at.to_string(),
                },
                LayoutDim::Inner {
                    tile: bt.to_string(),
                },
            ]
    }

    /// Is the outermost dimension the tile count of `axis` (`[axis/t, …]`),
    /// so one tile of `axis` is contiguous (CPU weight panels)? The GPU
    /// layout `[l/lp, h, lp]` is not panelled by `h`.
    pub fn is_panelled_by(&self, axis: &str) -> bool {
        matches!(self.dims.first(), Some(LayoutDim::Outer { axis: a, .. }) if a == axis)
    }
}

/// A tensor the kernel reads or writes, indexed by axis names.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Tensor {
    pub name: String,
    pub role: Role,
    /// Logical dimensions, by axis name, outermost first.
    pub dims: Vec<String>,
    pub format: Format,
    pub layout: Layout,
}

/// How a tile size is chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TileSize {
    /// By the register-constraint solver for the target.
    Solve,
    Fixed(u32),
}

/// A tile variable (`ep`, `hp`, `lp`) splitting one axis.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TileVar {
    pub name: String,
    pub axis: String,
    pub size: TileSize,
}

/// Softmax evaluation for attention. Both modes compute in fp32 and give the
/// same result; they differ in synchronization.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SoftmaxMode {
    /// Online softmax: running max with rescaling of partial sums whenever the
    /// max grows (synchronized).
    Online,
    /// FlashDecoding++ section 3: every partial uses one unified max `phi`
    /// (no synchronization); if any `score - phi` leaves `[lo, hi]` the whole
    /// row is recomputed with the online mode.
    Async { phi: f32, lo: f32, hi: f32 },
}

/// Epilogue activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Activation {
    None,
    Relu,
    Silu,
}

/// What happens to the accumulators before they are stored.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Epilogue {
    /// Multiply by the operands' dequantization scales (required when any
    /// operand is quantized).
    pub scale: bool,
    /// Add the offset term of asymmetric weights, `min·Σx` per group
    /// (required for asymmetric weight formats).
    pub zero_point: bool,
    /// Optional bias tensor, indexed by the output-channel axis.
    pub bias: Option<String>,
    pub activation: Activation,
}

/// y[e, h] = Σ_l x[e, l] · w[h, l] (+ epilogue). GEMV, flat GEMM and GEMM
/// are the same op at different extents of `e`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Matmul {
    /// Activations `x[e, l]`.
    pub x: String,
    /// Weights `w[h, l]`.
    pub w: String,
    /// Output `y[e, h]`; its format is the output dtype.
    pub y: String,
    /// Rows of x (tokens): `e`.
    pub e: String,
    /// Output channels: `h`.
    pub h: String,
    /// Reduction: `l`.
    pub l: String,
    pub epilogue: Epilogue,
}

/// Decode attends one query token to the whole cache; prefill attends a
/// block of query tokens, causally, to the cache that already holds them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttentionKind {
    Decode,
    Prefill,
}

/// o[t, hq, d] = softmax_s(q[t, hq, :] · k[s, hq/group, :]) · v[s, hq/group, d],
/// with GQA (hq a multiple of the KV heads). The caches `k[s, kvh, d]` and
/// `v[s, kvh, d]` have the growing sequence axis `s` outermost so appends are
/// in place. For prefill with `t` query tokens, query i sits at position
/// `s - t + i` and sees keys `0..=s - t + i`.
#[derive(Clone, Debug, PartialEq)]
pub struct Attention {
    pub kind: AttentionKind,
    pub q: String,
    pub k: String,
    pub v: String,
    pub o: String,
    /// Query tokens: `t` (extent 1 for decode).
    pub tokens: String,
    /// Query heads: `hq`.
    pub heads: String,
    /// KV heads: `kvh` (divides the query heads).
    pub kv_heads: String,
    /// Head dimension: `d`.
    pub head_dim: String,
    /// KV sequence (the cache's growing axis): `s`.
    pub seq: String,
    /// Q arrives already multiplied by 1/sqrt(d) (MNN-LLM 5.3), so no scale
    /// is applied to the scores. If false the kernel applies it.
    pub q_prescaled: bool,
    pub softmax: SoftmaxMode,
}

/// The computation.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    Matmul(Matmul),
    Attention(Attention),
}

/// How the loop nest is executed. Each field is a contract: a backend (or
/// the runtime driving it) does what it says or refuses the kernel naming
/// the field. How deep loads are staged is not here: that is the target's
/// (GPU stages, CPU prefetch distance), measured per device.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Schedule {
    pub tiles: Vec<TileVar>,
    /// Axes whose iterations may go to different CPU threads or GPU thread
    /// blocks. A CPU runtime spreads a matmul's `h` (an attention's `kvh`)
    /// over its threads only when listed, else runs on one thread; a GPU
    /// backend needs every axis its grid spreads listed, or refuses.
    pub parallel: Vec<String>,
    /// A reduction axis cut into chunks computed apart and combined after
    /// (flash-decoding over the KV sequence). Attention's `s` only: the GPU
    /// decode launch is split-K and needs it; the host cuts `s` across
    /// threads when the KV heads alone would leave threads idle. No backend
    /// splits a matmul's K, so each refuses `split` on a matmul.
    pub split: Option<String>,
}

/// Which loop structure a matmul instance uses (FlashDecoding++ section 5:
/// the runtime switches GEMV → flat GEMM → GEMM at M1 and M2).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum Variant {
    /// One token row (M = 1): memory-bound, streams the weights once.
    Gemv,
    /// A few token rows (M small, padded to the tile): all rows'
    /// accumulators in registers, weights read once.
    FlatGemm,
    /// Many rows: tiled for reuse from cache or local memory.
    Gemm,
}

impl Variant {
    pub const ALL: [Variant; 3] = [Variant::Gemv, Variant::FlatGemm, Variant::Gemm];
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Variant::Gemv => "gemv",
            Variant::FlatGemm => "flat-gemm",
            Variant::Gemm => "gemm",
        })
    }
}

impl std::str::FromStr for Variant {
    type Err = String;
    fn from_str(s: &str) -> Result<Variant, String> {
        Variant::ALL
            .into_iter()
            .find(|v| v.to_string() == s)
            .ok_or_else(|| format!("unknown variant `{s}`; valid: gemv, flat-gemm, gemm"))
    }
}

/// The one IR type.
#[derive(Clone, Debug, PartialEq)]
pub struct Kernel {
    pub name: String,
    pub axes: Vec<Axis>,
    pub tensors: Vec<Tensor>,
    pub op: Op,
    pub schedule: Schedule,
}

impl Kernel {
    pub fn axis(&self, name: &str) -> Option<&Axis> {
        self.axes.iter().find(|a| a.name == name)
    }

    pub fn tensor(&self, name: &str) -> Option<&Tensor> {
        self.tensors.iter().find(|t| t.name == name)
    }

    pub fn tile(&self, name: &str) -> Option<&TileVar> {
        self.schedule.tiles.iter().find(|t| t.name == name)
    }

    /// The tile variable that splits `axis`, if any (verify() allows one).
    pub fn tile_of(&self, axis: &str) -> Option<&TileVar> {
        self.schedule.tiles.iter().find(|t| t.axis == axis)
    }

    /// Is tensor `tensor` laid out `[a/at, b/bt, at, bt]` with the tile
    /// variables this kernel declares for `a` and `b`?
    pub fn is_blocked(&self, tensor: &str, a: &str, b: &str) -> bool {
        match (self.tensor(tensor), self.tile_of(a), self.tile_of(b)) {
            (Some(t), Some(at), Some(bt)) => t.layout.is_blocked(a, &at.name, b, &bt.name),
            _ => false,
        }
    }

    pub fn as_matmul(&self) -> Option<&Matmul> {
        match &self.op {
            Op::Matmul(m) => Some(m),
            Op::Attention(_) => None,
        }
    }

    pub fn as_attention(&self) -> Option<&Attention> {
        match &self.op {
            Op::Attention(a) => Some(a),
            Op::Matmul(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocked_and_panelled_layouts() {
        let cpu = Layout {
            dims: vec![
                LayoutDim::outer("h", "hp"),
                LayoutDim::outer("l", "lp"),
                LayoutDim::inner("hp"),
                LayoutDim::inner("lp"),
            ],
            int4_pair_transpose: true,
            int4_signed_codes: false,
        };
        assert!(cpu.is_blocked("h", "hp", "l", "lp"));
        assert!(!cpu.is_blocked("l", "lp", "h", "hp"));
        assert!(cpu.is_panelled_by("h"));
        let gpu = Layout {
            dims: vec![
                LayoutDim::outer("l", "lp"),
                LayoutDim::whole("h"),
                LayoutDim::inner("lp"),
            ],
            int4_pair_transpose: false,
            int4_signed_codes: false,
        };
        assert!(!gpu.is_blocked("h", "hp", "l", "lp"));
        assert!(!gpu.is_panelled_by("h"));
        assert!(gpu.is_panelled_by("l"));
        assert!(!Layout::row_major(&["h", "l"]).is_panelled_by("h"));
    }
}
