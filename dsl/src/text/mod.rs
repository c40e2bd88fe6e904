//! The canonical text form of a [`Kernel`](crate::ir::Kernel): one
//! declaration per line, in a fixed order, readable like the math.
//!
//! ```text
//! kernel matmul-w4a8
//! axis e: dyn
//! axis h: 4096
//! axis l: 4096 reduce
//! tile hp of h: solve
//! tile lp of l: 32
//! input x[e, l]: i8dyn
//! weight w[h, l]: u4asym:g32 layout [h/hp, l/lp, hp, lp] pair-transpose
//! input b[h]: f32
//! output y[e, h]: f32
//! matmul y[e, h] = x[e, l] * w[h, l] epilogue scale zero-point bias(b) act(none)
//! parallel h
//! ```
//!
//! Grammar (`#` starts a comment; blank lines are ignored; `kernel` comes
//! first, the other lines may come in any order and print in the order above):
//!
//! ```text
//! kernel NAME
//! axis NAME: (dyn | N) [spatial | reduce]
//! tile NAME of AXIS: (solve | N)
//! (input | weight | output | cache) NAME[AXIS, ...]: FORMAT [layout LAYOUT]
//! matmul Y[e, h] = X[e, l] * W[h, l] [epilogue ITEM...]
//!     ITEM = scale | zero-point | bias(NAME) | act(none | relu | silu)
//! attention (decode | prefill) O[t, hq, d] = softmax(Q[t, hq, d] * K[s, kvh, d]) * V[s, kvh, d]
//!     [q-prescaled] softmax (online | async(phi=F, lo=F, hi=F))
//! parallel AXIS, ...
//! split AXIS
//! ```
//!
//! `FORMAT` is [`Format`](crate::ir::Format)'s `Display` (`u4asym:g32`);
//! `LAYOUT` is [`Layout`](crate::ir::Layout)'s (`[h/hp, l/lp, hp, lp]
//! pair-transpose`), omitted when row-major without pair-transpose. In a
//! layout a bare name is a tile's inner part if the same layout has that
//! tile's `axis/tile`, otherwise a whole axis. Floats print with `{:?}`, which
//! round-trips every `f32` exactly.
//!
//! Parsing ([`Kernel`](crate::ir::Kernel)'s `FromStr`) runs
//! [`verify`](crate::verify::verify), so a parsed kernel is always valid, and
//! `parse(print(k)) == k` for every valid kernel.

mod lex;
mod parse;
mod print;

pub use parse::parse_unverified;

/// Why kernel text (or a format, group or layout) could not be parsed.
/// `line` and `col` are 1-based (`col` counts chars).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct ParseError {
    pub line: usize,
    pub col: usize,
    pub message: String,
}
