//! One grammar for kernel names, printed by `Display` and read back by
//! `FromStr`, so a name is a contract: tools, records and the runtime can
//! recover everything a name encodes without a side table.
//!
//! Two kinds of names:
//!
//! - **Library names** ([`LibraryName`]) — short names of built-in kernels:
//!
//!   ```text
//!   library   := "matmul-" variant | "attention-" phase "-" variant
//!   phase     := "decode" | "prefill"
//!   variant   := [a-z] [a-z0-9_]*                e.g. w4a8, f16, kv8, q4_0 (ggml's block names)
//!   ```
//!
//! - **Instance names** ([`InstanceName`]) — one emitted kernel, in the style
//!   of KleidiAI's micro-kernel names (`kai_matmul_clamp_f32_qai8dxp1x8_
//!   qsi4c32p4x8_1x4x32_neon_dotprod`: output, operands with their packing,
//!   tile, target), with `_` between fields and no `_` inside one:
//!
//!   ```text
//!   matmul    := "matmul_" format "_" operand "_" operand "_" N "x" N "x" N "_" target
//!   attention := "attention_" phase "_" format "_" format "_" format "_" format "_"
//!                softmax "_d" N "_" N "x" N "_" target
//!   operand   := format packing? "s16s0"?
//!   packing   := "p" N "x" N        [outer/R, l/C, R, C] blocks: [e/ep, l/lp, ep, lp], [h/hp, l/lp, hp, lp]
//!              | "pl" N             [l/K, h, K], the GPU layout of MNN-LLM 5.1
//!   format    := "f32" | "f16" | "bf16" | "f8e4m3" | "f8e5m2"
//!              | "qsi8dx"                        i8dyn: symmetric int8, dynamic, per row
//!              | ("qsi8" | "qai8" | "qau4" | "qsu4" | "qsi4" | "qae0m4") group params?
//!   group     := "g" N | "cx"                    N codes per group | one group per row (channel)
//!   params    := "f16"                           group parameters stored as f16 (default f32)
//!   softmax   := "online" | "async"
//!   target    := token ("_" token)*,  token := [a-z0-9]+   e.g. neon_i8mm, opencl, ptx_sm80
//!   N         := [1-9] [0-9]*                    (fits in u32)
//!   ```
//!
//!   The `q` formats read as KleidiAI's: quantized, `s`ymmetric or
//!   `a`symmetric, `i`nt or `u`int or `e0m4`, bits, granularity (`qsu4`:
//!   uint4 with the implied zero point 8, ggml's Q4_0 with `g32f16`; `qsi4`:
//!   the same values with the codes stored as q − 8, the layout's
//!   `signed-codes`, as KleidiAI's `qsi4` kernels store them). `s16s0`
//!   marks the int4 pair transpose (byte j holds codes j and j+16, seed 000
//!   IV.D), KleidiAI's spelling of the same nibble order. The matmul tile is
//!   `ep x hp x lp`; the attention tile is query tokens × keys per block, and
//!   the four attention formats are output, q, k, v.
//!
//!   Example: `matmul_f32_qsi8dxp10x8_qau4g32p8x8s16s0_10x8x8_neon_i8mm` is
//!   W4A8 with f32 output for i8mm at MNN-LLM's ep = 10, hp = 8, lp = 8
//!   (the design notes' example spells the activations `qai8dx`; Tessera's
//!   dynamic activations are symmetric, so the name says `qsi8dx`).

use std::fmt;
use std::str::FromStr;

use crate::ir::{
    AttentionKind, Format, Group, Kernel, LayoutDim, ParamType, SoftmaxMode, TileSize,
};

/// Why a name cannot be parsed, or a kernel cannot be named.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NamingError {
    #[error("malformed {kind} name `{name}`: expected {expected}, found `{found}`")]
    Malformed {
        /// `library` or `instance`.
        kind: &'static str,
        name: String,
        expected: String,
        found: String,
    },
    #[error("kernel `{kernel}` has no instance name: {reason}")]
    Unnameable { kernel: String, reason: String },
}

fn malformed(kind: &'static str, name: &str, expected: &str, found: &str) -> NamingError {
    NamingError::Malformed {
        kind,
        name: name.to_string(),
        expected: expected.to_string(),
        found: found.to_string(),
    }
}

// ---------------------------------------------------------------------------
// Library names

/// The operation a library kernel performs, as its name says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LibraryOp {
    Matmul,
    Attention(AttentionKind),
}

/// A library short name: `matmul-w4a8`, `attention-decode-kv8`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LibraryName {
    pub op: LibraryOp,
    /// Formats in short: `f32`, `w4a8`, `kv8`, ...
    pub variant: String,
}

const LIBRARY_GRAMMAR: &str =
    "`matmul-<variant>` or `attention-<decode|prefill>-<variant>` with variant [a-z][a-z0-9_]*";

impl fmt::Display for LibraryName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.op {
            LibraryOp::Matmul => write!(f, "matmul-{}", self.variant),
            LibraryOp::Attention(kind) => {
                write!(f, "attention-{}-{}", phase_token(kind), self.variant)
            }
        }
    }
}

impl FromStr for LibraryName {
    type Err = NamingError;

    fn from_str(name: &str) -> Result<Self, NamingError> {
        let err = |found: &str| malformed("library", name, LIBRARY_GRAMMAR, found);
        let (op, variant) = if let Some(variant) = name.strip_prefix("matmul-") {
            (LibraryOp::Matmul, variant)
        } else if let Some(rest) = name.strip_prefix("attention-") {
            let (phase, variant) = rest.split_once('-').ok_or_else(|| err(rest))?;
            let kind = parse_phase(phase).ok_or_else(|| err(phase))?;
            (LibraryOp::Attention(kind), variant)
        } else {
            return Err(err(name.split('-').next().unwrap_or(name)));
        };
        if !is_variant(variant) {
            return Err(err(variant));
        }
        Ok(LibraryName {
            op,
            variant: variant.to_string(),
        })
    }
}

fn is_variant(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

fn phase_token(kind: AttentionKind) -> &'static str {
    match kind {
        AttentionKind::Decode => "decode",
        AttentionKind::Prefill => "prefill",
    }
}

fn parse_phase(s: &str) -> Option<AttentionKind> {
    match s {
        "decode" => Some(AttentionKind::Decode),
        "prefill" => Some(AttentionKind::Prefill),
        _ => None,
    }
}

// ---------------------------------------------------------------------------
// Formats, packing, operands

/// How an operand is laid out in memory, as far as the name tells.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Packing {
    /// Row-major over the tensor's dims (no suffix).
    RowMajor,
    /// `p<rows>x<cols>`: `[outer/rows, l/cols, rows, cols]` blocks.
    Blocked { rows: u32, cols: u32 },
    /// `pl<k>`: `[l/k, h, k]`, the GPU weight layout.
    Columns { k: u32 },
}

/// A matmul operand: its format, packing and int4 nibble order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Operand {
    pub format: Format,
    pub packing: Packing,
    /// Printed as `s16s0`; see the module doc.
    pub int4_pair_transpose: bool,
    /// `u4sym` codes stored as q − 8: the format prints as `qsi4` (see the
    /// module doc).
    pub int4_signed_codes: bool,
}

impl Operand {
    /// A row-major operand without the pair transpose.
    pub fn plain(format: Format) -> Self {
        Operand {
            format,
            packing: Packing::RowMajor,
            int4_pair_transpose: false,
            int4_signed_codes: false,
        }
    }
}

const FORMAT_GRAMMAR: &str = "format: one of f32, f16, bf16, f8e4m3, f8e5m2, qsi8dx, or qsi8/qai8/qau4/qae0m4 followed by g<N> or cx";
const OPERAND_GRAMMAR: &str = "an operand: a format (f32, f16, bf16, f8e4m3, f8e5m2, qsi8dx, or qsi8/qai8/qau4/qae0m4 followed by g<N> or cx), then optionally p<N>x<N> or pl<N>, then optionally s16s0";

/// Formats without a group, longest-match first where prefixes overlap.
const PLAIN_FORMATS: [(&str, Format); 6] = [
    ("f32", Format::F32),
    ("f16", Format::F16),
    ("bf16", Format::BF16),
    ("f8e4m3", Format::Fp8E4M3),
    ("f8e5m2", Format::Fp8E5M2),
    ("qsi8dx", Format::I8Dyn),
];

/// Makes a grouped format from its group and parameter precision.
type WithGroup = fn(Group, ParamType) -> Format;

/// Grouped formats: prefix, then a group, then `f16` for f16 parameters
/// (KleidiAI spells the symmetric uint4 with zero point 8 `qsu4`).
const GROUPED_FORMATS: [(&str, WithGroup); 5] = [
    ("qsi8", Format::I8Sym),
    ("qai8", Format::I8Asym),
    ("qau4", Format::U4Asym),
    ("qsu4", Format::U4Sym),
    ("qae0m4", Format::E0M4),
];

/// The name token's suffix for f16 group parameters.
const F16_PARAMS: &str = "f16";

/// The name token of a format (see the module grammar).
pub fn format_token(format: Format) -> String {
    let group = |g: Group, p: ParamType| {
        let g = match g {
            Group::Size(n) => format!("g{n}"),
            Group::Row => "cx".to_string(),
        };
        match p {
            ParamType::F32 => g,
            ParamType::F16 => format!("{g}{F16_PARAMS}"),
        }
    };
    match format {
        Format::F32 => "f32".into(),
        Format::F16 => "f16".into(),
        Format::BF16 => "bf16".into(),
        Format::Fp8E4M3 => "f8e4m3".into(),
        Format::Fp8E5M2 => "f8e5m2".into(),
        Format::I8Dyn => "qsi8dx".into(),
        Format::I8Sym(g, p) => format!("qsi8{}", group(g, p)),
        Format::I8Asym(g, p) => format!("qai8{}", group(g, p)),
        Format::U4Asym(g, p) => format!("qau4{}", group(g, p)),
        Format::U4Sym(g, p) => format!("qsu4{}", group(g, p)),
        Format::E0M4(g, p) => format!("qae0m4{}", group(g, p)),
    }
}

/// A canonical positive decimal (no sign, no leading zero) at the start of
/// `s`, and the rest.
fn take_number(s: &str) -> Option<(u32, &str)> {
    let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let digits = &s[..end];
    if digits.is_empty() || digits.starts_with('0') {
        return None;
    }
    Some((digits.parse().ok()?, &s[end..]))
}

/// A whole field that is exactly one positive number.
fn number(s: &str) -> Option<u32> {
    match take_number(s)? {
        (n, "") => Some(n),
        _ => None,
    }
}

/// A format token at the start of `s`, and the rest.
fn take_format(s: &str) -> Option<(Format, &str)> {
    for (token, format) in PLAIN_FORMATS {
        if let Some(rest) = s.strip_prefix(token) {
            return Some((format, rest));
        }
    }
    for (token, make) in GROUPED_FORMATS {
        if let Some(rest) = s.strip_prefix(token) {
            let (group, rest) = match rest.strip_prefix("cx") {
                Some(rest) => (Group::Row, rest),
                None => {
                    let (n, rest) = take_number(rest.strip_prefix('g')?)?;
                    (Group::Size(n), rest)
                }
            };
            return Some(match rest.strip_prefix(F16_PARAMS) {
                Some(rest) => (make(group, ParamType::F16), rest),
                None => (make(group, ParamType::F32), rest),
            });
        }
    }
    None
}

/// A field that is exactly one format token.
fn format_field(s: &str) -> Option<Format> {
    match take_format(s)? {
        (f, "") => Some(f),
        _ => None,
    }
}

/// `<a>x<b>` at the start of `s`.
fn take_pair(s: &str) -> Option<(u32, u32, &str)> {
    let (a, rest) = take_number(s)?;
    let (b, rest) = take_number(rest.strip_prefix('x')?)?;
    Some((a, b, rest))
}

impl fmt::Display for Operand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let token = format_token(self.format);
        match token.strip_prefix(SIGNED_U4SYM.0) {
            Some(rest) if self.int4_signed_codes => write!(f, "{}{rest}", SIGNED_U4SYM.1)?,
            _ => f.write_str(&token)?,
        }
        match self.packing {
            Packing::RowMajor => {}
            Packing::Blocked { rows, cols } => write!(f, "p{rows}x{cols}")?,
            Packing::Columns { k } => write!(f, "pl{k}")?,
        }
        if self.int4_pair_transpose {
            f.write_str("s16s0")?;
        }
        Ok(())
    }
}

/// `u4sym` with signed codes: KleidiAI's `qsi4` in place of `qsu4`.
const SIGNED_U4SYM: (&str, &str) = ("qsu4", "qsi4");

fn operand_field(s: &str) -> Option<Operand> {
    let (int4_signed_codes, unsigned);
    match s.strip_prefix(SIGNED_U4SYM.1) {
        Some(rest) => {
            int4_signed_codes = true;
            unsigned = format!("{}{rest}", SIGNED_U4SYM.0);
        }
        None => {
            int4_signed_codes = false;
            unsigned = s.to_string();
        }
    }
    let (format, rest) = take_format(&unsigned)?;
    let (packing, rest) = if let Some(rest) = rest.strip_prefix("pl") {
        let (k, rest) = take_number(rest)?;
        (Packing::Columns { k }, rest)
    } else if let Some(rest) = rest.strip_prefix('p') {
        let (rows, cols, rest) = take_pair(rest)?;
        (Packing::Blocked { rows, cols }, rest)
    } else {
        (Packing::RowMajor, rest)
    };
    let (int4_pair_transpose, rest) = match rest.strip_prefix("s16s0") {
        Some(rest) => (true, rest),
        None => (false, rest),
    };
    rest.is_empty().then_some(Operand {
        format,
        packing,
        int4_pair_transpose,
        int4_signed_codes,
    })
}

fn is_target(s: &str) -> bool {
    !s.is_empty()
        && s.split('_').all(|token| {
            !token.is_empty()
                && token
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        })
}

const TARGET_GRAMMAR: &str = "a target: tokens of [a-z0-9]+ joined by `_` (e.g. neon_i8mm)";

// ---------------------------------------------------------------------------
// Instance names

/// The matmul tile of an instance: `ep x hp x lp`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MatmulTile {
    pub ep: u32,
    pub hp: u32,
    pub lp: u32,
}

/// One emitted matmul: `matmul_<y>_<x>_<w>_<ep>x<hp>x<lp>_<target>`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MatmulInstance {
    pub output: Format,
    pub x: Operand,
    pub w: Operand,
    pub tile: MatmulTile,
    pub target: String,
}

/// Which softmax an attention instance runs; the async bounds are kernel
/// parameters, not part of the name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SoftmaxKind {
    Online,
    Async,
}

impl From<SoftmaxMode> for SoftmaxKind {
    fn from(mode: SoftmaxMode) -> Self {
        match mode {
            SoftmaxMode::Online => SoftmaxKind::Online,
            SoftmaxMode::Async { .. } => SoftmaxKind::Async,
        }
    }
}

/// The block an attention instance processes: query tokens × keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AttentionBlock {
    pub tokens: u32,
    pub keys: u32,
}

/// One emitted attention kernel:
/// `attention_<phase>_<o>_<q>_<k>_<v>_<softmax>_d<head_dim>_<tokens>x<keys>_<target>`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct AttentionInstance {
    pub kind: AttentionKind,
    pub output: Format,
    pub q: Format,
    pub k: Format,
    pub v: Format,
    pub softmax: SoftmaxKind,
    /// Emitted code is specialised to one head dimension.
    pub head_dim: u32,
    pub block: AttentionBlock,
    pub target: String,
}

/// The full name of one emitted kernel.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum InstanceName {
    Matmul(MatmulInstance),
    Attention(AttentionInstance),
}

const MATMUL_GRAMMAR: &str = "matmul_<output>_<x>_<w>_<ep>x<hp>x<lp>_<target>";
const ATTENTION_GRAMMAR: &str =
    "attention_<decode|prefill>_<o>_<q>_<k>_<v>_<online|async>_d<N>_<tokens>x<keys>_<target>";

impl fmt::Display for MatmulInstance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let MatmulTile { ep, hp, lp } = self.tile;
        write!(
            f,
            "matmul_{}_{}_{}_{ep}x{hp}x{lp}_{}",
            format_token(self.output),
            self.x,
            self.w,
            self.target
        )
    }
}

impl fmt::Display for AttentionInstance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let softmax = match self.softmax {
            SoftmaxKind::Online => "online",
            SoftmaxKind::Async => "async",
        };
        write!(
            f,
            "attention_{}_{}_{}_{}_{}_{softmax}_d{}_{}x{}_{}",
            phase_token(self.kind),
            format_token(self.output),
            format_token(self.q),
            format_token(self.k),
            format_token(self.v),
            self.head_dim,
            self.block.tokens,
            self.block.keys,
            self.target
        )
    }
}

impl fmt::Display for InstanceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InstanceName::Matmul(m) => m.fmt(f),
            InstanceName::Attention(a) => a.fmt(f),
        }
    }
}

/// Reads `_`-separated fields in order, reporting the first one that does
/// not fit with what was expected there.
struct Fields<'a> {
    name: &'a str,
    rest: Option<&'a str>,
}

impl<'a> Fields<'a> {
    fn new(name: &'a str) -> Self {
        Fields {
            name,
            rest: Some(name),
        }
    }

    fn next<T>(
        &mut self,
        expected: &str,
        parse: impl FnOnce(&'a str) -> Option<T>,
    ) -> Result<T, NamingError> {
        let rest = self.rest.unwrap_or("");
        let (field, rest) = match rest.split_once('_') {
            Some((field, rest)) => (field, Some(rest)),
            None => (rest, None),
        };
        self.rest = rest;
        parse(field).ok_or_else(|| malformed("instance", self.name, expected, field))
    }

    /// Everything left, as the target.
    fn target(self) -> Result<String, NamingError> {
        let rest = self.rest.unwrap_or("");
        if is_target(rest) {
            Ok(rest.to_string())
        } else {
            Err(malformed("instance", self.name, TARGET_GRAMMAR, rest))
        }
    }
}

impl FromStr for MatmulInstance {
    type Err = NamingError;

    fn from_str(name: &str) -> Result<Self, NamingError> {
        let mut fields = Fields::new(name);
        fields.next(MATMUL_GRAMMAR, |s| (s == "matmul").then_some(()))?;
        let output = fields.next(&format!("the output {FORMAT_GRAMMAR}"), format_field)?;
        let x = fields.next(
            &format!("the activations as {OPERAND_GRAMMAR}"),
            operand_field,
        )?;
        let w = fields.next(&format!("the weights as {OPERAND_GRAMMAR}"), operand_field)?;
        let tile = fields.next("a tile <ep>x<hp>x<lp> of positive numbers", |s| {
            let (ep, hp, rest) = take_pair(s)?;
            let lp = number(rest.strip_prefix('x')?)?;
            Some(MatmulTile { ep, hp, lp })
        })?;
        let target = fields.target()?;
        Ok(MatmulInstance {
            output,
            x,
            w,
            tile,
            target,
        })
    }
}

impl FromStr for AttentionInstance {
    type Err = NamingError;

    fn from_str(name: &str) -> Result<Self, NamingError> {
        let mut fields = Fields::new(name);
        fields.next(ATTENTION_GRAMMAR, |s| (s == "attention").then_some(()))?;
        let kind = fields.next("the phase, decode or prefill", parse_phase)?;
        let output = fields.next(&format!("the output {FORMAT_GRAMMAR}"), format_field)?;
        let q = fields.next(&format!("the q {FORMAT_GRAMMAR}"), format_field)?;
        let k = fields.next(&format!("the k {FORMAT_GRAMMAR}"), format_field)?;
        let v = fields.next(&format!("the v {FORMAT_GRAMMAR}"), format_field)?;
        let softmax = fields.next("the softmax, online or async", |s| match s {
            "online" => Some(SoftmaxKind::Online),
            "async" => Some(SoftmaxKind::Async),
            _ => None,
        })?;
        let head_dim = fields.next("the head dimension d<N>", |s| number(s.strip_prefix('d')?))?;
        let block = fields.next("a block <tokens>x<keys> of positive numbers", |s| {
            let (tokens, keys, rest) = take_pair(s)?;
            rest.is_empty().then_some(AttentionBlock { tokens, keys })
        })?;
        let target = fields.target()?;
        Ok(AttentionInstance {
            kind,
            output,
            q,
            k,
            v,
            softmax,
            head_dim,
            block,
            target,
        })
    }
}

impl FromStr for InstanceName {
    type Err = NamingError;

    fn from_str(name: &str) -> Result<Self, NamingError> {
        match name.split('_').next() {
            Some("matmul") => name.parse().map(InstanceName::Matmul),
            Some("attention") => name.parse().map(InstanceName::Attention),
            _ => Err(malformed(
                "instance",
                name,
                "`matmul_...` or `attention_...`",
                name.split('_').next().unwrap_or(name),
            )),
        }
    }
}

// ---------------------------------------------------------------------------
// Naming a kernel

fn unnameable(kernel: &Kernel, reason: impl Into<String>) -> NamingError {
    NamingError::Unnameable {
        kernel: kernel.name.clone(),
        reason: reason.into(),
    }
}

impl MatmulInstance {
    /// The name of `kernel` emitted with `tile` for `target`: formats come
    /// from the tensors, packing from their layouts with the tile's sizes.
    pub fn for_kernel(
        kernel: &Kernel,
        tile: MatmulTile,
        target: &str,
    ) -> Result<Self, NamingError> {
        let m = kernel
            .as_matmul()
            .ok_or_else(|| unnameable(kernel, "not a matmul"))?;
        if !is_target(target) {
            return Err(unnameable(
                kernel,
                format!("target `{target}` is not {TARGET_GRAMMAR}"),
            ));
        }
        // Tile size of each tile variable, via the axis it splits.
        let size_of = |tile_var: &str| -> Result<u32, NamingError> {
            let var = kernel
                .tile(tile_var)
                .ok_or_else(|| unnameable(kernel, format!("unknown tile `{tile_var}`")))?;
            let size = if var.axis == m.e {
                tile.ep
            } else if var.axis == m.h {
                tile.hp
            } else if var.axis == m.l {
                tile.lp
            } else {
                return Err(unnameable(
                    kernel,
                    format!("tile `{tile_var}` splits `{}`, not e, h or l", var.axis),
                ));
            };
            match var.size {
                TileSize::Fixed(n) if n != size => Err(unnameable(
                    kernel,
                    format!("tile `{tile_var}` is fixed at {n}, the instance uses {size}"),
                )),
                _ => Ok(size),
            }
        };
        // Every tile of the kernel must agree with the instance, used in a
        // layout or not.
        for var in &kernel.schedule.tiles {
            size_of(&var.name)?;
        }
        let operand = |tensor_name: &str| -> Result<Operand, NamingError> {
            let t = kernel
                .tensor(tensor_name)
                .ok_or_else(|| unnameable(kernel, format!("no tensor `{tensor_name}`")))?;
            let dims = &t.layout.dims;
            let packing = if t.layout.is_row_major(&t.dims) {
                Packing::RowMajor
            } else {
                match dims.as_slice() {
                    [
                        LayoutDim::Outer { axis: a, tile: at },
                        LayoutDim::Outer { axis: b, tile: bt },
                        LayoutDim::Inner { tile: ai },
                        LayoutDim::Inner { tile: bi },
                    ] if t.dims == [a.clone(), b.clone()] && at == ai && bt == bi => {
                        Packing::Blocked {
                            rows: size_of(at)?,
                            cols: size_of(bt)?,
                        }
                    }
                    [
                        LayoutDim::Outer { axis: l, tile: lt },
                        LayoutDim::Whole(h),
                        LayoutDim::Inner { tile: li },
                    ] if t.dims == [h.clone(), l.clone()] && lt == li => {
                        Packing::Columns { k: size_of(lt)? }
                    }
                    _ => {
                        return Err(unnameable(
                            kernel,
                            format!("layout of `{tensor_name}` has no name"),
                        ));
                    }
                }
            };
            Ok(Operand {
                format: t.format,
                packing,
                int4_pair_transpose: t.layout.int4_pair_transpose,
                int4_signed_codes: t.layout.int4_signed_codes,
            })
        };
        let output = kernel
            .tensor(&m.y)
            .ok_or_else(|| unnameable(kernel, format!("no tensor `{}`", m.y)))?
            .format;
        Ok(MatmulInstance {
            output,
            x: operand(&m.x)?,
            w: operand(&m.w)?,
            tile,
            target: target.to_string(),
        })
    }
}

impl AttentionInstance {
    /// The name of `kernel` emitted for one head dimension and block.
    pub fn for_kernel(
        kernel: &Kernel,
        head_dim: u32,
        block: AttentionBlock,
        target: &str,
    ) -> Result<Self, NamingError> {
        let a = kernel
            .as_attention()
            .ok_or_else(|| unnameable(kernel, "not an attention kernel"))?;
        if !is_target(target) {
            return Err(unnameable(
                kernel,
                format!("target `{target}` is not {TARGET_GRAMMAR}"),
            ));
        }
        if let Some(axis) = kernel.axis(&a.head_dim)
            && let crate::ir::Extent::Fixed(d) = axis.extent
            && d != head_dim
        {
            return Err(unnameable(
                kernel,
                format!("head dimension is fixed at {d}, the instance uses {head_dim}"),
            ));
        }
        let format = |name: &str| {
            kernel
                .tensor(name)
                .map(|t| t.format)
                .ok_or_else(|| unnameable(kernel, format!("no tensor `{name}`")))
        };
        Ok(AttentionInstance {
            kind: a.kind,
            output: format(&a.o)?,
            q: format(&a.q)?,
            k: format(&a.k)?,
            v: format(&a.v)?,
            softmax: a.softmax.into(),
            head_dim,
            block,
            target: target.to_string(),
        })
    }
}
