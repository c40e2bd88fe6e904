//! Parsing the canonical text form: `FromStr` for [`Kernel`], [`Format`],
//! [`Group`] and [`Layout`]. The grammar is flat (one declaration per line,
//! no nesting beyond brackets), so the parser never recurses and never
//! indexes user text; every failure is a [`ParseError`] naming line and
//! problem.

use std::str::FromStr;

use super::ParseError;
use super::lex::{Tok, Token, lex_line};
use crate::ir::*;
use crate::verify::{AxisUser, VerifyError, verify};

const FORMATS_EXPECTED: &str = "f32, f16, bf16, i8dyn, fp8e4m3, fp8e5m2, \
     u4asym:G, u4sym:G, i8sym:G, i8asym:G, e0m4:G with G = gN or row, \
     optionally :f16 after G for f16 group parameters";

/// Why an old `double-buffer` line is refused rather than ignored: no
/// backend read it, and how deep loads are staged is the target's choice
/// (`GpuCaps::stages`, measured per device), not the computation's.
pub const DOUBLE_BUFFER_GONE: &str = "'double-buffer' is not a schedule statement: load staging \
     is chosen per target (its GPU stages, its CPU prefetch distance), so the line changed nothing; \
     remove it";

const KEYWORDS: &str = "kernel, axis, tile, input, weight, output, cache, matmul, attention, \
     parallel, split";

/// Parse a group: `g32` or `row`.
fn group_from(s: &str) -> Result<Group, String> {
    if s == "row" {
        return Ok(Group::Row);
    }
    match s.strip_prefix('g') {
        Some(digits) if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) => digits
            .parse::<u32>()
            .map(Group::Size)
            .map_err(|_| format!("group size '{digits}' is too large")),
        _ => Err(format!("unknown group '{s}' (expected gN or row)")),
    }
}

/// Parse a format: `f16`, `u4asym:g32`, `i8asym:row`, `u4sym:g32:f16` ...
fn format_from(s: &str) -> Result<Format, String> {
    let (base, group) = match s.split_once(':') {
        Some((b, g)) => (b, Some(g)),
        None => (s, None),
    };
    let (group, params) = match group.map(|g| g.split_once(':')) {
        Some(Some((g, p))) => (Some(g), Some(p)),
        Some(None) => (group, None),
        None => (None, None),
    };
    let plain = match base {
        "f32" => Some(Format::F32),
        "f16" => Some(Format::F16),
        "bf16" => Some(Format::BF16),
        "i8dyn" => Some(Format::I8Dyn),
        "fp8e4m3" => Some(Format::Fp8E4M3),
        "fp8e5m2" => Some(Format::Fp8E5M2),
        _ => None,
    };
    if let Some(format) = plain {
        return match group {
            None => Ok(format),
            Some(_) => Err(format!("format '{base}' takes no group")),
        };
    }
    let grouped: fn(Group, ParamType) -> Format = match base {
        "u4asym" => Format::U4Asym,
        "u4sym" => Format::U4Sym,
        "i8sym" => Format::I8Sym,
        "i8asym" => Format::I8Asym,
        "e0m4" => Format::E0M4,
        _ => {
            return Err(format!(
                "unknown format '{base}' (expected one of {FORMATS_EXPECTED})"
            ));
        }
    };
    let params = match params {
        None => ParamType::F32,
        Some("f16") => ParamType::F16,
        Some(p) => {
            return Err(format!(
                "unknown parameter precision '{p}' in '{s}' (expected f16, or nothing for f32)"
            ));
        }
    };
    match group {
        Some(g) => group_from(g).map(|g| grouped(g, params)),
        None => Err(format!(
            "format '{base}' needs a group, e.g. {base}:g32 or {base}:row"
        )),
    }
}

fn single_line_error(message: String) -> ParseError {
    ParseError {
        line: 1,
        col: 1,
        message,
    }
}

impl FromStr for Group {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, ParseError> {
        group_from(s).map_err(single_line_error)
    }
}

impl FromStr for Format {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, ParseError> {
        format_from(s).map_err(single_line_error)
    }
}

impl FromStr for Layout {
    type Err = ParseError;
    /// `[h/hp, l/lp, hp, lp]` with optional trailing `pair-transpose` and
    /// `signed-codes`.
    fn from_str(s: &str) -> Result<Self, ParseError> {
        if s.contains('\n') {
            return Err(single_line_error("a layout is one line".to_string()));
        }
        let toks = lex_line(s, 1)?;
        let mut cur = Cursor::new(&toks, 1, s.chars().count());
        let layout = cur.layout()?;
        cur.end()?;
        Ok(layout)
    }
}

/// A position in the text, for errors.
#[derive(Clone, Copy, Debug)]
struct Pos {
    line: usize,
    col: usize,
}

/// Reads the tokens of one line.
struct Cursor<'a> {
    toks: &'a [Token],
    at: usize,
    line: usize,
    end_col: usize,
}

impl<'a> Cursor<'a> {
    fn new(toks: &'a [Token], line: usize, line_len: usize) -> Self {
        Cursor {
            toks,
            at: 0,
            line,
            end_col: line_len + 1,
        }
    }

    fn peek(&self) -> Option<&'a Tok> {
        self.toks.get(self.at).map(|t| &t.tok)
    }

    fn col(&self) -> usize {
        self.toks.get(self.at).map_or(self.end_col, |t| t.col)
    }

    fn pos(&self) -> Pos {
        Pos {
            line: self.line,
            col: self.col(),
        }
    }

    fn error_at(&self, col: usize, message: String) -> ParseError {
        ParseError {
            line: self.line,
            col,
            message,
        }
    }

    /// An error at the current token, "expected X but found Y".
    fn expected(&self, what: &str) -> ParseError {
        let found = self
            .peek()
            .map_or_else(|| "end of line".to_string(), Tok::describe);
        self.error_at(self.col(), format!("expected {what} but found {found}"))
    }

    fn is_punct(&self, c: char) -> bool {
        self.peek() == Some(&Tok::Punct(c))
    }

    fn is_word(&self, w: &str) -> bool {
        matches!(self.peek(), Some(Tok::Word(x)) if x == w)
    }

    fn punct(&mut self, c: char) -> Result<(), ParseError> {
        if self.is_punct(c) {
            self.at += 1;
            Ok(())
        } else {
            Err(self.expected(&format!("'{c}'")))
        }
    }

    /// Consume `c` if it is next.
    fn eat_punct(&mut self, c: char) -> bool {
        let yes = self.is_punct(c);
        if yes {
            self.at += 1;
        }
        yes
    }

    fn keyword(&mut self, w: &str) -> Result<(), ParseError> {
        if self.is_word(w) {
            self.at += 1;
            Ok(())
        } else {
            Err(self.expected(&format!("'{w}'")))
        }
    }

    /// Consume the word `w` if it is next.
    fn eat_word(&mut self, w: &str) -> bool {
        let yes = self.is_word(w);
        if yes {
            self.at += 1;
        }
        yes
    }

    /// A name (validity is checked by `verify`, which names the kind).
    fn word(&mut self, what: &str) -> Result<String, ParseError> {
        match self.peek() {
            Some(Tok::Word(w)) => {
                self.at += 1;
                Ok(w.clone())
            }
            _ => Err(self.expected(what)),
        }
    }

    fn number(&mut self, what: &str) -> Result<u32, ParseError> {
        let col = self.col();
        match self.peek() {
            Some(Tok::Num(n)) if n.bytes().all(|b| b.is_ascii_digit()) => {
                self.at += 1;
                n.parse::<u32>()
                    .map_err(|_| self.error_at(col, format!("number '{n}' is too large")))
            }
            _ => Err(self.expected(what)),
        }
    }

    fn float(&mut self, what: &str) -> Result<f32, ParseError> {
        let col = self.col();
        match self.peek() {
            Some(Tok::Num(n)) | Some(Tok::Word(n)) => {
                let n = n.clone();
                self.at += 1;
                n.parse::<f32>()
                    .map_err(|_| self.error_at(col, format!("'{n}' is not a number")))
            }
            _ => Err(self.expected(what)),
        }
    }

    /// `[a, b, ...]` of names, possibly empty.
    fn name_list(&mut self, what: &str) -> Result<Vec<String>, ParseError> {
        self.punct('[')?;
        let mut names = Vec::new();
        if self.eat_punct(']') {
            return Ok(names);
        }
        loop {
            names.push(self.word(what)?);
            if self.eat_punct(']') {
                return Ok(names);
            }
            if !self.eat_punct(',') {
                return Err(self.expected("',' or ']'"));
            }
        }
    }

    /// `a, b, ...`: at least one name, to the end of the line.
    fn comma_names(&mut self, what: &str) -> Result<Vec<String>, ParseError> {
        let mut names = vec![self.word(what)?];
        while self.eat_punct(',') {
            names.push(self.word(what)?);
        }
        Ok(names)
    }

    /// A format: a word, then `:group` for grouped formats, then `:f16`
    /// for f16 group parameters.
    fn format(&mut self) -> Result<Format, ParseError> {
        let col = self.col();
        let mut text = self.word("a format")?;
        if self.eat_punct(':') {
            text.push(':');
            text.push_str(&self.word("a group (gN or row)")?);
            if self.eat_punct(':') {
                text.push(':');
                text.push_str(&self.word("a parameter precision (f16)")?);
            }
        }
        format_from(&text).map_err(|m| self.error_at(col, m))
    }

    /// `[h/hp, l/lp, hp, lp] [pair-transpose] [signed-codes]`.
    fn layout(&mut self) -> Result<Layout, ParseError> {
        self.punct('[')?;
        // (axis, Some(tile)) for `axis/tile`, (name, None) for a bare name.
        let mut raw: Vec<(String, Option<String>)> = Vec::new();
        if !self.eat_punct(']') {
            loop {
                let name = self.word("a layout dim")?;
                let tile = if self.eat_punct('/') {
                    Some(self.word("a tile name")?)
                } else {
                    None
                };
                raw.push((name, tile));
                if self.eat_punct(']') {
                    break;
                }
                if !self.eat_punct(',') {
                    return Err(self.expected("',' or ']'"));
                }
            }
        }
        let outer_tiles: Vec<String> = raw.iter().filter_map(|(_, t)| t.clone()).collect();
        let dims = raw
            .into_iter()
            .map(|(name, tile)| match tile {
                Some(tile) => LayoutDim::Outer { axis: name, tile },
                None if outer_tiles.contains(&name) => LayoutDim::Inner { tile: name },
                None => LayoutDim::Whole(name),
            })
            .collect();
        let int4_pair_transpose = self.eat_word("pair-transpose");
        let int4_signed_codes = self.eat_word("signed-codes");
        Ok(Layout {
            dims,
            int4_pair_transpose,
            int4_signed_codes,
        })
    }

    /// Nothing may follow the declaration.
    fn end(&self) -> Result<(), ParseError> {
        match self.peek() {
            None => Ok(()),
            Some(t) => Err(self.error_at(
                self.col(),
                format!(
                    "unexpected {} after the end of the declaration",
                    t.describe()
                ),
            )),
        }
    }
}

/// Where each declaration is, so verify errors can name a line.
#[derive(Default)]
struct Spans {
    kernel: Option<Pos>,
    axes: Vec<(String, Pos)>,
    tiles: Vec<(String, Pos)>,
    tensors: Vec<(String, Pos)>,
    op: Option<Pos>,
    parallel: Option<Pos>,
    split: Option<Pos>,
}

fn find(list: &[(String, Pos)], name: &str, last: bool) -> Option<Pos> {
    let mut hits = list.iter().filter(|(n, _)| n == name).map(|(_, p)| *p);
    if last { hits.next_back() } else { hits.next() }
}

impl Spans {
    /// The line of the declaration a verify error is about.
    fn locate(&self, e: &VerifyError) -> Pos {
        use VerifyError as E;
        let axis = |n: &str| find(&self.axes, n, false);
        let tile = |n: &str| find(&self.tiles, n, false);
        let tensor = |n: &str| find(&self.tensors, n, false);
        let schedule = |list: &str| match list {
            "parallel" => self.parallel,
            _ => self.split,
        };
        let pos = match e {
            E::MissingOp => None,
            E::InvalidName { what, name } | E::DuplicateName { what, name } => match *what {
                "axis" => find(&self.axes, name, true),
                "tile" => find(&self.tiles, name, true),
                "tensor" => find(&self.tensors, name, true),
                _ => self.kernel,
            },
            E::AxisTileClash { name } => tile(name),
            E::UnknownAxis { user, .. } => match user {
                AxisUser::Tile(t) => tile(t),
                AxisUser::Tensor(t) => tensor(t),
                AxisUser::Op { .. } => self.op,
                AxisUser::Schedule(list) => schedule(list),
            },
            E::ZeroExtent { axis: a } => axis(a),
            E::ZeroTile { tile: t } => tile(t),
            E::DuplicateTile { second, .. } => tile(second),
            E::RepeatedTensorDim { tensor: t, .. }
            | E::LayoutUnknownTile { tensor: t, .. }
            | E::LayoutTileAxis { tensor: t, .. }
            | E::LayoutForeignDim { tensor: t, .. }
            | E::LayoutUnpairedTile { tensor: t, .. }
            | E::LayoutMissingDim { tensor: t, .. }
            | E::LayoutRepeatedDim { tensor: t, .. }
            | E::PairTransposeFormat { tensor: t, .. }
            | E::SignedCodesFormat { tensor: t, .. }
            | E::GroupSize { tensor: t, .. }
            | E::OperandRole { tensor: t, .. }
            | E::OperandFormat { tensor: t, .. }
            | E::CacheSeqNotOutermost { tensor: t, .. } => tensor(t),
            E::AxisKind { axis: a, .. } | E::DecodeTokens { axis: a, .. } => axis(a),
            E::HeadsNotMultiple { kv_heads, .. } => axis(kv_heads),
            E::RepeatedScheduleAxis { list, .. } => schedule(list),
            E::ParallelReduce { .. } => schedule("parallel"),
            E::SplitNotReduce { .. } => self.split,
            E::UnknownTensor { .. }
            | E::SameTensor { .. }
            | E::SameAxis { .. }
            | E::OperandDims { .. }
            | E::MissingScale { .. }
            | E::UnexpectedScale
            | E::MissingZeroPoint { .. }
            | E::UnexpectedZeroPoint { .. }
            | E::SoftmaxPhi { .. }
            | E::SoftmaxBounds { .. } => self.op,
        };
        pos.or(self.op)
            .or(self.kernel)
            .unwrap_or(Pos { line: 1, col: 1 })
    }
}

/// The kernel being assembled, before the op is known.
#[derive(Default)]
struct Parts {
    name: Option<String>,
    axes: Vec<Axis>,
    tensors: Vec<Tensor>,
    op: Option<Op>,
    schedule: Schedule,
    spans: Spans,
}

/// Parse kernel text without running `verify` (for tools that want to
/// report every problem themselves; `str::parse::<Kernel>` verifies).
pub fn parse_unverified(text: &str) -> Result<Kernel, ParseError> {
    parse_with_spans(text).map(|(k, _)| k)
}

fn parse_with_spans(text: &str) -> Result<(Kernel, Spans), ParseError> {
    let mut parts = Parts::default();
    let mut last_line = 1;
    for (i, line) in text.lines().enumerate() {
        let line_no = i + 1;
        last_line = line_no;
        let toks = lex_line(line, line_no)?;
        if toks.is_empty() {
            continue;
        }
        let mut cur = Cursor::new(&toks, line_no, line.chars().count());
        parts.declaration(&mut cur)?;
        cur.end()?;
    }
    let Some(name) = parts.name else {
        return Err(ParseError {
            line: last_line,
            col: 1,
            message: "no 'kernel NAME' declaration".to_string(),
        });
    };
    let Some(op) = parts.op else {
        let pos = parts.spans.kernel.unwrap_or(Pos { line: 1, col: 1 });
        return Err(ParseError {
            line: pos.line,
            col: pos.col,
            message: format!("kernel '{name}' has no operation (matmul or attention)"),
        });
    };
    let kernel = Kernel {
        name,
        axes: parts.axes,
        tensors: parts.tensors,
        op,
        schedule: parts.schedule,
    };
    Ok((kernel, parts.spans))
}

impl FromStr for Kernel {
    type Err = ParseError;
    /// Parse the canonical text and [`verify`] the result; a verify error is
    /// reported at the declaration it is about.
    fn from_str(text: &str) -> Result<Self, ParseError> {
        let (kernel, spans) = parse_with_spans(text)?;
        verify(&kernel).map_err(|e| {
            let pos = spans.locate(&e);
            ParseError {
                line: pos.line,
                col: pos.col,
                message: e.to_string(),
            }
        })?;
        Ok(kernel)
    }
}

/// A once-only slot: error if the declaration was already seen.
fn once(slot: &mut Option<Pos>, here: Pos, what: &str) -> Result<(), ParseError> {
    if let Some(first) = slot {
        return Err(ParseError {
            line: here.line,
            col: here.col,
            message: format!("duplicate {what} (first on line {})", first.line),
        });
    }
    *slot = Some(here);
    Ok(())
}

impl Parts {
    fn declaration(&mut self, cur: &mut Cursor) -> Result<(), ParseError> {
        let start = cur.pos();
        let keyword = match cur.peek() {
            Some(Tok::Word(w)) => w.clone(),
            _ => return Err(cur.expected("a keyword")),
        };
        if keyword != "kernel" && self.name.is_none() {
            return Err(cur.error_at(
                start.col,
                format!("expected 'kernel NAME' before '{keyword}'"),
            ));
        }
        cur.at += 1;
        match keyword.as_str() {
            "kernel" => {
                once(&mut self.spans.kernel, start, "'kernel' line")?;
                self.name = Some(cur.word("a kernel name")?);
            }
            "axis" => self.axis(cur)?,
            "tile" => self.tile(cur)?,
            "input" => self.tensor(cur, Role::Input)?,
            "weight" => self.tensor(cur, Role::Weight)?,
            "output" => self.tensor(cur, Role::Output)?,
            "cache" => self.tensor(cur, Role::Cache)?,
            "matmul" => {
                once(&mut self.spans.op, start, "operation")?;
                self.op = Some(Op::Matmul(matmul(cur)?));
            }
            "attention" => {
                once(&mut self.spans.op, start, "operation")?;
                self.op = Some(Op::Attention(attention(cur)?));
            }
            "parallel" => {
                once(&mut self.spans.parallel, start, "'parallel' line")?;
                self.schedule.parallel = cur.comma_names("an axis name")?;
            }
            "split" => {
                once(&mut self.spans.split, start, "'split' line")?;
                self.schedule.split = Some(cur.word("an axis name")?);
            }
            "double-buffer" => {
                return Err(cur.error_at(start.col, DOUBLE_BUFFER_GONE.to_string()));
            }
            _ => {
                return Err(cur.error_at(
                    start.col,
                    format!("unknown keyword '{keyword}' (expected one of {KEYWORDS})"),
                ));
            }
        }
        Ok(())
    }

    /// `axis NAME: (dyn | N) [spatial | reduce]`
    fn axis(&mut self, cur: &mut Cursor) -> Result<(), ParseError> {
        let pos = cur.pos();
        let name = cur.word("an axis name")?;
        cur.punct(':')?;
        let extent = if cur.eat_word("dyn") {
            Extent::Dyn
        } else {
            Extent::Fixed(cur.number("an extent (dyn or a number)")?)
        };
        let kind = if cur.eat_word("reduce") {
            AxisKind::Reduce
        } else {
            cur.eat_word("spatial");
            AxisKind::Spatial
        };
        self.spans.axes.push((name.clone(), pos));
        self.axes.push(Axis { name, extent, kind });
        Ok(())
    }

    /// `tile NAME of AXIS: (solve | N)`
    fn tile(&mut self, cur: &mut Cursor) -> Result<(), ParseError> {
        let pos = cur.pos();
        let name = cur.word("a tile name")?;
        cur.keyword("of")?;
        let axis = cur.word("an axis name")?;
        cur.punct(':')?;
        let size = if cur.eat_word("solve") {
            TileSize::Solve
        } else {
            TileSize::Fixed(cur.number("a tile size (solve or a number)")?)
        };
        self.spans.tiles.push((name.clone(), pos));
        self.schedule.tiles.push(TileVar { name, axis, size });
        Ok(())
    }

    /// `ROLE NAME[dims]: FORMAT [layout LAYOUT]`
    fn tensor(&mut self, cur: &mut Cursor, role: Role) -> Result<(), ParseError> {
        let pos = cur.pos();
        let name = cur.word("a tensor name")?;
        let dims = cur.name_list("an axis name")?;
        cur.punct(':')?;
        let format = cur.format()?;
        let layout = if cur.eat_word("layout") {
            cur.layout()?
        } else {
            Layout::row_major(&dims)
        };
        self.spans.tensors.push((name.clone(), pos));
        self.tensors.push(Tensor {
            name,
            role,
            dims,
            format,
            layout,
        });
        Ok(())
    }
}

/// `NAME[a, b, ...]` with exactly `n` indices; returns the name, the
/// indices and the column of the name.
fn indexed(
    cur: &mut Cursor,
    what: &str,
    n: usize,
) -> Result<(String, Vec<String>, usize), ParseError> {
    let col = cur.col();
    let name = cur.word(what)?;
    let idx = cur.name_list("an axis name")?;
    if idx.len() != n {
        return Err(cur.error_at(
            col,
            format!("{what} '{name}' needs {n} indices, found {}", idx.len()),
        ));
    }
    Ok((name, idx, col))
}

/// Check that an index slot repeats an earlier one.
fn same_index(
    cur: &Cursor,
    col: usize,
    got: &str,
    want: &str,
    shape: &str,
) -> Result<(), ParseError> {
    if got == want {
        Ok(())
    } else {
        Err(cur.error_at(
            col,
            format!("index '{got}' should be '{want}' (the form is {shape})"),
        ))
    }
}

/// Index `i` of a list `indexed` has checked to be long enough.
fn at(idx: &[String], i: usize) -> String {
    idx.get(i).cloned().unwrap_or_default()
}

/// `matmul Y[e, h] = X[e, l] * W[h, l] [epilogue ITEM...]`
fn matmul(cur: &mut Cursor) -> Result<Matmul, ParseError> {
    const SHAPE: &str = "y[e, h] = x[e, l] * w[h, l]";
    let (y, yi, _) = indexed(cur, "output", 2)?;
    cur.punct('=')?;
    let (x, xi, xcol) = indexed(cur, "activation", 2)?;
    cur.punct('*')?;
    let (w, wi, wcol) = indexed(cur, "weight", 2)?;
    let (e, h, l) = (at(&yi, 0), at(&yi, 1), at(&xi, 1));
    same_index(cur, xcol, &at(&xi, 0), &e, SHAPE)?;
    same_index(cur, wcol, &at(&wi, 0), &h, SHAPE)?;
    same_index(cur, wcol, &at(&wi, 1), &l, SHAPE)?;
    let mut epilogue = Epilogue {
        scale: false,
        zero_point: false,
        bias: None,
        activation: Activation::None,
    };
    if cur.eat_word("epilogue") {
        let mut seen: Vec<String> = Vec::new();
        while let Some(tok) = cur.peek() {
            let col = cur.col();
            let Tok::Word(item) = tok else {
                return Err(cur.expected("an epilogue item"));
            };
            if seen.contains(item) {
                return Err(cur.error_at(col, format!("duplicate epilogue item '{item}'")));
            }
            seen.push(item.clone());
            cur.at += 1;
            match item.as_str() {
                "scale" => epilogue.scale = true,
                "zero-point" => epilogue.zero_point = true,
                "bias" => {
                    cur.punct('(')?;
                    epilogue.bias = Some(cur.word("a bias tensor name")?);
                    cur.punct(')')?;
                }
                "act" => {
                    cur.punct('(')?;
                    let acol = cur.col();
                    epilogue.activation = match cur.word("an activation")?.as_str() {
                        "none" => Activation::None,
                        "relu" => Activation::Relu,
                        "silu" => Activation::Silu,
                        other => {
                            return Err(cur.error_at(
                                acol,
                                format!(
                                    "unknown activation '{other}' (expected none, relu or silu)"
                                ),
                            ));
                        }
                    };
                    cur.punct(')')?;
                }
                other => {
                    return Err(cur.error_at(
                        col,
                        format!(
                            "unknown epilogue item '{other}' (expected scale, zero-point, \
                             bias(NAME) or act(none|relu|silu))"
                        ),
                    ));
                }
            }
        }
    }
    Ok(Matmul {
        x,
        w,
        y,
        e,
        h,
        l,
        epilogue,
    })
}

/// `attention KIND O[t, hq, d] = softmax(Q[t, hq, d] * K[s, kvh, d]) * V[s, kvh, d]
/// [q-prescaled] softmax MODE`
fn attention(cur: &mut Cursor) -> Result<Attention, ParseError> {
    const SHAPE: &str = "o[t, hq, d] = softmax(q[t, hq, d] * k[s, kvh, d]) * v[s, kvh, d]";
    let kcol = cur.col();
    let kind = match cur.word("'decode' or 'prefill'")?.as_str() {
        "decode" => AttentionKind::Decode,
        "prefill" => AttentionKind::Prefill,
        other => {
            return Err(cur.error_at(
                kcol,
                format!("unknown attention kind '{other}' (expected decode or prefill)"),
            ));
        }
    };
    let (o, oi, _) = indexed(cur, "output", 3)?;
    cur.punct('=')?;
    cur.keyword("softmax")?;
    cur.punct('(')?;
    let (q, qi, qcol) = indexed(cur, "query", 3)?;
    cur.punct('*')?;
    let (k, ki, kcol) = indexed(cur, "key cache", 3)?;
    cur.punct(')')?;
    cur.punct('*')?;
    let (v, vi, vcol) = indexed(cur, "value cache", 3)?;
    for i in 0..3 {
        same_index(cur, qcol, &at(&qi, i), &at(&oi, i), SHAPE)?;
        same_index(cur, vcol, &at(&vi, i), &at(&ki, i), SHAPE)?;
    }
    same_index(cur, kcol, &at(&ki, 2), &at(&oi, 2), SHAPE)?;

    let mut q_prescaled = false;
    let mut softmax = None;
    while let Some(tok) = cur.peek() {
        let col = cur.col();
        match tok {
            Tok::Word(w) if w == "q-prescaled" && !q_prescaled => {
                cur.at += 1;
                q_prescaled = true;
            }
            Tok::Word(w) if w == "softmax" && softmax.is_none() => {
                cur.at += 1;
                softmax = Some(softmax_mode(cur)?);
            }
            Tok::Word(w) if w == "q-prescaled" || w == "softmax" => {
                return Err(cur.error_at(col, format!("duplicate '{w}'")));
            }
            _ => return Err(cur.expected("'q-prescaled' or 'softmax'")),
        }
    }
    let Some(softmax) = softmax else {
        return Err(cur.expected("'softmax online' or 'softmax async(...)'"));
    };
    Ok(Attention {
        kind,
        q,
        k,
        v,
        o,
        tokens: at(&oi, 0),
        heads: at(&oi, 1),
        kv_heads: at(&ki, 1),
        head_dim: at(&oi, 2),
        seq: at(&ki, 0),
        q_prescaled,
        softmax,
    })
}

/// `online` or `async(phi=F, lo=F, hi=F)`.
fn softmax_mode(cur: &mut Cursor) -> Result<SoftmaxMode, ParseError> {
    if cur.eat_word("online") {
        return Ok(SoftmaxMode::Online);
    }
    if !cur.eat_word("async") {
        return Err(cur.expected("'online' or 'async'"));
    }
    cur.punct('(')?;
    let mut values = [0.0f32; 3];
    for (i, (name, value)) in ["phi", "lo", "hi"].iter().zip(&mut values).enumerate() {
        if i > 0 {
            cur.punct(',')?;
        }
        cur.keyword(name)?;
        cur.punct('=')?;
        *value = cur.float("a number")?;
    }
    cur.punct(')')?;
    let [phi, lo, hi] = values;
    Ok(SoftmaxMode::Async { phi, lo, hi })
}
