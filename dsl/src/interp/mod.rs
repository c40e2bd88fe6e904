//! The reference interpreter: the oracle that defines what every kernel means.
//!
//! Every backend is tested against [`run`] on random inputs. The interpreter is
//! deliberately scalar and literal: it favours precision and clarity over
//! speed, and it ignores [`Tensor::layout`](crate::ir::Tensor) entirely.
//!
//! # Calling convention
//!
//! All tensors are bound in **logical** form: row-major over the tensor's
//! declared `dims`, whatever its layout (packing is a separate step). Float
//! tensors are bound as [`Value::F32`], [`Value::F16`] or [`Value::BF16`]
//! matching their declared format. Quantized tensors (including fp8 KV values)
//! are bound as [`Value::Quant`] with `rows` = the product of the non-reduction
//! dims and `cols` = the reduction dim, which must be the tensor's last dim:
//! weights `w[h, l]` have rows `h`, cols `l`; caches `k[s, kvh, d]` have rows
//! `s·kvh`, cols `d`. `i8dyn` activations are bound as [`Value::F32`] and
//! quantized here per row with [`crate::quant::quantize_row_i8dyn`], exactly what a
//! kernel does. Outputs are returned as f32, row-major over the output's dims,
//! already rounded to the output format.
//!
//! Everything is validated before any arithmetic (see [`InterpError`]); the
//! interpreter never panics on bad bindings.
//!
//! # Matmul: `y[e, h] = act(Σ_l x[e, l] · w[h, l] + bias[h])`
//!
//! * **Integer path** — `x` is `i8dyn` and `w` is `u4asym`, `i8sym` or
//!   `i8asym` (W4A8, W8A8). Each row of `x` is quantized to codes `qx` and a
//!   scale `sx`. Per weight group `g` of row `h` the integer sums
//!   `dot = Σ_{l∈g} qx·qw` and `Σ_{l∈g} qx` are accumulated exactly in `i64`,
//!   then in f64
//!   `y += sx·sw[h,g]·dot + sx·offset[h,g]·Σ qx`
//!   (the zero-point correction of `w = scale·q + offset`, see [`crate::quant`]).
//! * **Float path** — every other combination. Each operand is widened to f64:
//!   float data as stored, quantized data through [`QuantTensor::value`] (its
//!   f32 dequantization), `i8dyn` activations (with float-like weights) as
//!   `sx·qx`. Products and the sum over `l` (in ascending `l`) are in f64.
//! * **Epilogue** — `+ bias[h]` (f32/f16/bf16), then `relu` or
//!   `silu(y) = y / (1 + e^-y)` in f64, then the output rounding below.
//!   `epilogue.scale` must be set when an operand is quantized and
//!   `epilogue.zero_point` when the weights are asymmetric; the interpreter
//!   refuses kernels that would silently drop those terms.
//!
//! # Attention: `o[t, hq, :] = Σ_s p_s · v[s, kvh, :]`
//!
//! * GQA: query head `i` reads KV head `i / (hq / kvh)`.
//! * Scores `q·k` are summed in f64 over widened values (quantized keys
//!   through [`QuantTensor::value`]); when `q_prescaled` is false they are
//!   multiplied by `1/sqrt(d)` (in f64); when true, Q already carries that
//!   factor (seed 004, 5.3) and scores are used as they are.
//! * Decode has exactly one query token that sees all `s` keys. Prefill with
//!   `t ≤ s` query tokens is causal: query `i` sits at position `s - t + i`
//!   and sees keys `0..=s - t + i`.
//! * The softmax is computed in **f64** (seed 004 5.3 asks kernels for at
//!   least fp32; f64 makes the oracle the more precise side of every
//!   comparison). Both [`SoftmaxMode`](crate::ir::SoftmaxMode)s are implemented literally:
//!   - `Online`: keys are visited in blocks of [`ONLINE_BLOCK`]; each block
//!     updates a running max `m`, rescaling the running denominator and the
//!     running output by `e^(m_old - m_new)`.
//!   - `Async { phi, lo, hi }` (seed 003, section 3): each block is a partial
//!     vector computing `Σ e^(x - phi)` and `Σ e^(x - phi)·v` with the unified
//!     max `phi`, no max tracking; the partials are summed at the end and
//!     divided. If any score of a row has `x - phi` outside `[lo, hi]` (or is
//!     NaN) the asynchronous pass for that row is abandoned and the row is
//!     recomputed with `Online`. [`SoftmaxStats`] counts those rows.
//!
//! An attention call whose output is empty (`t`, `hq` or `d` is 0) evaluates
//! no softmax. Non-finite inputs are not rejected; they propagate as IEEE arithmetic
//! dictates (typically to NaN outputs).
//!
//! # Output rounding
//!
//! The f64 result is rounded to f32 (nearest-even) and then, for f16/bf16
//! outputs, to the output format (nearest-even) — the same two roundings as
//! a kernel that accumulates in f32 and stores f16.

mod attention;
mod bind;
mod matmul;

use crate::ir::{Format, Kernel, Op};
use crate::quant::{QuantError, QuantTensor};

pub use attention::ONLINE_BLOCK;

/// A bound tensor in logical (row-major over its dims) form.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// For `f32` tensors and `i8dyn` activations.
    F32(Vec<f32>),
    F16(Vec<half::f16>),
    BF16(Vec<half::bf16>),
    /// For quantized and fp8 tensors.
    Quant(QuantTensor),
}

impl Value {
    /// `data` stored in float `format` (rounded to nearest-even for f16 and
    /// bf16); `i8dyn` takes f32 as is. `None` for formats bound as
    /// [`Value::Quant`].
    pub fn from_f32(format: Format, data: &[f32]) -> Option<Value> {
        match format {
            Format::F32 | Format::I8Dyn => Some(Value::F32(data.to_vec())),
            Format::F16 => Some(Value::F16(
                data.iter().map(|&x| half::f16::from_f32(x)).collect(),
            )),
            Format::BF16 => Some(Value::BF16(
                data.iter().map(|&x| half::bf16::from_f32(x)).collect(),
            )),
            _ => None,
        }
    }

    /// What kind of value this is, for error messages.
    pub fn kind(&self) -> String {
        match self {
            Value::F32(_) => "f32 data".to_string(),
            Value::F16(_) => "f16 data".to_string(),
            Value::BF16(_) => "bf16 data".to_string(),
            Value::Quant(q) => format!("quantized {} data", q.format),
        }
    }
}

/// Axis extents and input tensors for one call. Built with chained calls:
/// `Bindings::new().extent("e", 3).tensor("x", Value::F32(x))`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Bindings {
    extents: Vec<(String, usize)>,
    tensors: Vec<(String, Value)>,
}

impl Bindings {
    pub fn new() -> Self {
        Self::default()
    }

    /// Bind axis `name` to `n` (required for `Dyn` axes; for `Fixed` axes it
    /// must agree with the kernel).
    pub fn extent(mut self, name: impl Into<String>, n: usize) -> Self {
        self.extents.push((name.into(), n));
        self
    }

    /// Bind input, weight or cache tensor `name`.
    pub fn tensor(mut self, name: impl Into<String>, value: Value) -> Self {
        self.tensors.push((name.into(), value));
        self
    }

    /// A decode attention call (the library's `attention-decode-*`
    /// kernels): one query token, `hq` query heads over `kvh` KV heads of
    /// `d`, `s` cached tokens; q `[1, hq, d]`, caches k and v `[s, kvh, d]`.
    pub fn decode_attention([hq, kvh, d, s]: [usize; 4], q: Value, k: Value, v: Value) -> Self {
        Self::new()
            .extent("t", 1)
            .extent("hq", hq)
            .extent("kvh", kvh)
            .extent("d", d)
            .extent("s", s)
            .tensor("q", q)
            .tensor("k", k)
            .tensor("v", v)
    }

    pub fn extents(&self) -> &[(String, usize)] {
        &self.extents
    }

    pub fn tensors(&self) -> &[(String, Value)] {
        &self.tensors
    }
}

/// How many attention rows (one query token × one query head) the softmax
/// processed, and how many of them the `Async` mode had to recompute with the
/// online mode because a score left `[phi + lo, phi + hi]`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SoftmaxStats {
    pub rows: usize,
    pub recomputed: usize,
}

/// The result of [`run`].
#[derive(Clone, Debug, PartialEq)]
pub struct Outputs {
    /// Every output tensor: f32, row-major over its dims, already rounded to
    /// the output format.
    pub tensors: Vec<(String, Vec<f32>)>,
    /// Softmax statistics (attention kernels only).
    pub softmax: Option<SoftmaxStats>,
}

impl Outputs {
    /// The output tensor `name`.
    pub fn get(&self, name: &str) -> Option<&[f32]> {
        self.tensors
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
    }
}

/// Why a kernel cannot be interpreted with the given bindings.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum InterpError {
    #[error("kernel references axis `{axis}`, which it does not declare")]
    UndeclaredAxis { axis: String },
    #[error("kernel references tensor `{tensor}`, which it does not declare")]
    UndeclaredTensor { tensor: String },
    #[error("`{name}` is bound more than once")]
    DuplicateBinding { name: String },
    #[error("extent bound for `{axis}`, which is not an axis of the kernel")]
    UnknownAxisBinding { axis: String },
    #[error("tensor `{tensor}` is bound but is not an input, weight or cache of the kernel")]
    UnknownTensorBinding { tensor: String },
    #[error("axis `{axis}` is dynamic and has no extent bound")]
    UnboundAxis { axis: String },
    #[error("axis `{axis}` is fixed at {fixed} but bound to {bound}")]
    FixedExtent {
        axis: String,
        fixed: usize,
        bound: usize,
    },
    #[error("tensor `{tensor}` is not bound")]
    UnboundTensor { tensor: String },
    #[error("tensor `{tensor}` must have dims {expected}, got [{}]", got.join(", "))]
    Dims {
        tensor: String,
        expected: String,
        got: Vec<String>,
    },
    #[error("operation uses axis `{axis}` in two roles")]
    AxisRoles { axis: String },
    #[error("tensor `{tensor}` has format {format}: {why}")]
    UnsupportedFormat {
        tensor: String,
        format: Format,
        why: &'static str,
    },
    #[error("tensor `{tensor}` is declared {format} and must be bound as {expected}, got {got}")]
    WrongValue {
        tensor: String,
        format: Format,
        expected: &'static str,
        got: String,
    },
    #[error("tensor `{tensor}`: expected {expected} elements, got {got}")]
    Length {
        tensor: String,
        expected: usize,
        got: usize,
    },
    #[error(
        "quantized tensor `{tensor}` must be [{expected_rows}, {expected_cols}], got [{rows}, {cols}]"
    )]
    QuantShape {
        tensor: String,
        expected_rows: usize,
        expected_cols: usize,
        rows: usize,
        cols: usize,
    },
    #[error("quantized tensor `{tensor}` is invalid: {source}")]
    Quant {
        tensor: String,
        #[source]
        source: QuantError,
    },
    #[error("size of {what} overflows usize")]
    Overflow { what: String },
    #[error("cannot allocate {elements} elements for {what}")]
    Allocation { what: String, elements: usize },
    #[error("epilogue: {0}")]
    Epilogue(String),
    #[error("query heads {heads} are not a multiple of KV heads {kv_heads}")]
    Gqa { heads: usize, kv_heads: usize },
    #[error("prefill needs seq >= tokens: seq is {seq}, tokens is {tokens}")]
    PrefillSeq { seq: usize, tokens: usize },
    #[error("decode attends exactly one query token, `{axis}` is bound to {tokens}")]
    DecodeTokens { axis: String, tokens: usize },
    #[error("attention over an empty KV sequence `{axis}`")]
    EmptySequence { axis: String },
    #[error(
        "async softmax needs finite phi, lo, hi with lo <= hi; got phi {phi}, lo {lo}, hi {hi}"
    )]
    SoftmaxBounds { phi: f32, lo: f32, hi: f32 },
}

/// Interpret `kernel` on `bindings`; see the module doc for the semantics.
pub fn run(kernel: &Kernel, bindings: &Bindings) -> Result<Outputs, InterpError> {
    let env = bind::Env::new(kernel, bindings)?;
    match &kernel.op {
        Op::Matmul(m) => matmul::run(&env, m),
        Op::Attention(a) => attention::run(&env, a),
    }
}

/// Round an f64 result to the output format, returned as f32: f64 → f32
/// (nearest-even), then f32 → f16/bf16 (nearest-even).
pub fn round_to_format(value: f64, format: Format) -> f32 {
    let v = value as f32;
    match format {
        Format::F16 => half::f16::from_f32(v).to_f32(),
        Format::BF16 => half::bf16::from_f32(v).to_f32(),
        _ => v,
    }
}
