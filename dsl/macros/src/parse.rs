//! Syntax: `kernel!`'s input as a tree of spanned pieces, parsed with syn.
//!
//! This module only knows the shape of the text; what the names mean and
//! whether they agree is [`crate::check`]'s job. Every failure is a
//! `syn::Error` at the offending token saying what was expected.

use crate::error::{Loc, fail};
use crate::format::{Format, parse_format};
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream};
use syn::{Ident, LitInt, LitStr, Token, bracketed, parenthesized};

/// `NAME(AXES) { STATEMENTS }`
pub struct KernelDef {
    pub name: String,
    pub name_loc: Loc,
    pub axes: Vec<AxisParam>,
    pub body: Vec<Stmt>,
    /// The closing brace, for "missing statement" errors.
    pub body_loc: Loc,
}

/// `e` (bound at call time) or `e = 1` (fixed).
pub struct AxisParam {
    pub name: Ident,
    pub fixed: Option<(u32, Loc)>,
}

/// One `;`-terminated statement of the body.
pub enum Stmt {
    Tile(Vec<TileDecl>),
    Tensor(TensorDecl),
    Compute(Compute),
    Epilogue(EpilogueStmt),
    Softmax(SoftmaxStmt),
    Parallel(Vec<Ident>),
    Split(Ident, Ident),
}

/// `e by ep` (solver picks) or `l by lp = 32` (fixed).
pub struct TileDecl {
    pub axis: Ident,
    pub tile: Ident,
    pub fixed: Option<(u32, Loc)>,
}

/// What a tensor is to the kernel (`ir::Role`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Input,
    Weight,
    Output,
    Cache,
}

impl Role {
    pub fn keyword(self) -> &'static str {
        match self {
            Role::Input => "input",
            Role::Weight => "weight",
            Role::Output => "output",
            Role::Cache => "cache",
        }
    }
}

/// `x: input i8dyn [e, l] layout [e/ep, l/lp, ep, lp] pair_transpose prescaled;`
/// (a `u4sym` weight may add `signed_codes`)
pub struct TensorDecl {
    pub name: Ident,
    pub role: Role,
    pub role_loc: Loc,
    pub format: Format,
    pub format_loc: Loc,
    pub dims: Vec<Ident>,
    pub dims_loc: Loc,
    pub layout: Option<Vec<LayoutItem>>,
    pub pair_transpose: Option<Loc>,
    pub signed_codes: Option<Loc>,
    pub prescaled: Option<Loc>,
}

/// One layout dimension: `h/hp`, or a single name: an axis `h` or a tile
/// variable `hp` (which one is resolved once all names are known).
pub enum LayoutItem {
    Outer { axis: Ident, tile: Ident },
    Single(Ident),
}

/// `y[e, h]`: a tensor with its index axes.
pub struct Indexed {
    pub tensor: Ident,
    pub indices: Vec<Ident>,
    pub indices_loc: Loc,
}

/// `OUT = RHS;`
pub struct Compute {
    pub out: Indexed,
    pub rhs: Rhs,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionKind {
    Decode,
    Prefill,
}

pub enum Rhs {
    /// `sum(l) x[e, l] * w[h, l]`
    Sum { axis: Ident, x: Indexed, w: Indexed },
    /// `attention(q[..], k[..], v[..]) decode`
    Attention {
        q: Indexed,
        k: Indexed,
        v: Indexed,
        kind: AttentionKind,
    },
}

/// `epilogue scale, zero_point, bias(b), relu;`
pub struct EpilogueStmt {
    pub keyword: Ident,
    pub items: Vec<EpilogueItem>,
}

pub enum EpilogueItem {
    Scale(Ident),
    ZeroPoint(Ident),
    Bias(Ident, Ident),
    Relu(Ident),
    Silu(Ident),
}

/// `softmax online;` or `softmax async(phi = 0.0, lo = -20.0, hi = 20.0);`
pub struct SoftmaxStmt {
    pub keyword: Ident,
    pub mode: SoftmaxMode,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SoftmaxMode {
    Online,
    Async { phi: f32, lo: f32, hi: f32 },
}

const STATEMENT_KEYWORDS: [&str; 6] = [
    "tile",
    "epilogue",
    "softmax",
    "parallel",
    "double_buffer",
    "split",
];

const STATEMENT_HELP: &str = "expected a statement: `tile e by ep, ...;`, a tensor `x: input f32 [e, l];`, \
     the computation `y[e, h] = ...;`, `epilogue ...;`, `softmax ...;`, `parallel ...;` \
     or `split ...;`";

impl Parse for KernelDef {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        if input.is_empty() {
            return fail(
                input.span(),
                "expected a kernel: `name(e, h, l) { ... }` (see the `kernel!` docs)",
            );
        }
        let (name, name_loc) = parse_kernel_name(input)?;
        if !input.peek(syn::token::Paren) {
            return fail(
                input.span(),
                format!(
                    "expected the axes of kernel `{name}` in parentheses, e.g. `{name}(e, h, l)` or `{name}(e = 1, h, l)`"
                ),
            );
        }
        let params;
        parenthesized!(params in input);
        let axes = parse_comma_list(&params, parse_axis_param)?;
        if !input.peek(syn::token::Brace) {
            return fail(
                input.span(),
                "expected the kernel body in braces: `{ tensors; computation; schedule }`",
            );
        }
        let body_input;
        let brace = syn::braced!(body_input in input);
        let mut body = Vec::new();
        while !body_input.is_empty() {
            body.push(parse_stmt(&body_input)?);
        }
        if !input.is_empty() {
            return fail(
                input.span(),
                "unexpected tokens after the kernel body: one `kernel!` describes one kernel",
            );
        }
        Ok(KernelDef {
            name,
            name_loc,
            axes,
            body,
            body_loc: Loc::of(brace.span.close()),
        })
    }
}

/// Any identifier, keywords included (`async`, `type`), with a raw `r#`
/// prefix removed. Names end up in the IR, which allows ASCII only.
pub fn any_ident(input: ParseStream) -> syn::Result<Ident> {
    let ident = input.call(Ident::parse_any)?.unraw();
    if !ident.to_string().is_ascii() {
        return fail(
            ident.span(),
            format!("`{ident}`: names in a kernel are ASCII identifiers"),
        );
    }
    Ok(ident)
}

/// An identifier, or an error at the next token saying what was expected.
pub fn ident_or(input: ParseStream, expected: impl std::fmt::Display) -> syn::Result<Ident> {
    if input.peek(Ident::peek_any) {
        any_ident(input)
    } else {
        fail(input.span(), expected)
    }
}

/// `matmul-w4a8` (identifiers joined by `-`) or a string literal.
fn parse_kernel_name(input: ParseStream) -> syn::Result<(String, Loc)> {
    if input.peek(LitStr) {
        let lit: LitStr = input.parse()?;
        let name = lit.value();
        let valid = name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !valid {
            return fail(
                lit.span(),
                "invalid kernel name: expected letters, digits, `_` and `-`, starting with a letter or `_`",
            );
        }
        return Ok((name, Loc::of(lit.span())));
    }
    let first = ident_or(
        input,
        "expected a kernel name, e.g. `matmul-w4a8` or `\"my-kernel\"`",
    )?;
    let mut name = first.to_string();
    let mut loc = Loc::of(first.span());
    while input.peek(Token![-]) {
        let _dash: Token![-] = input.parse()?;
        let part = ident_or(
            input,
            "expected a name part after `-`; for names such parts cannot spell, use a string literal: `\"my-kernel\"`",
        )?;
        name.push('-');
        name.push_str(&part.to_string());
        loc = loc.to(Loc::of(part.span()));
    }
    Ok((name, loc))
}

fn parse_comma_list<T>(
    input: ParseStream,
    item: fn(ParseStream) -> syn::Result<T>,
) -> syn::Result<Vec<T>> {
    let mut items = Vec::new();
    while !input.is_empty() {
        items.push(item(input)?);
        if input.is_empty() {
            break;
        }
        if !input.peek(Token![,]) {
            return fail(input.span(), "expected `,` between list items");
        }
        let _comma: Token![,] = input.parse()?;
    }
    Ok(items)
}

fn parse_name(input: ParseStream, what: &str) -> syn::Result<Ident> {
    ident_or(input, format!("expected {what}"))
}

/// A positive integer literal without suffix.
fn parse_size(input: ParseStream, what: &str) -> syn::Result<(u32, Loc)> {
    let lit: LitInt = input
        .parse()
        .map_err(|e| Loc::of(e.span()).error(format!("expected {what} (a positive integer)")))?;
    let loc = Loc::of(lit.span());
    if !lit.suffix().is_empty() {
        return fail(
            loc,
            format!("expected {what} as a plain integer, without a type suffix"),
        );
    }
    match lit.base10_parse::<u32>() {
        Ok(n) if n > 0 => Ok((n, loc)),
        _ => fail(
            loc,
            format!("{what} must be a positive integer that fits in u32"),
        ),
    }
}

fn parse_axis_param(input: ParseStream) -> syn::Result<AxisParam> {
    let name = parse_name(input, "an axis name, e.g. `e` or `e = 1`")?;
    let fixed = if input.peek(Token![=]) {
        let _eq: Token![=] = input.parse()?;
        Some(parse_size(input, "the axis's fixed extent")?)
    } else if input.peek(Token![:]) {
        return fail(
            input.span(),
            format!(
                "write `{name}` for an extent bound at call time or `{name} = 8` for a fixed extent"
            ),
        );
    } else {
        None
    };
    Ok(AxisParam { name, fixed })
}

fn expect_semicolon(input: ParseStream, after: &str) -> syn::Result<()> {
    if input.peek(Token![;]) {
        let _semi: Token![;] = input.parse()?;
        Ok(())
    } else {
        fail(input.span(), format!("expected `;` after {after}"))
    }
}

fn parse_stmt(input: ParseStream) -> syn::Result<Stmt> {
    if input.peek(Ident::peek_any) && input.peek2(Token![:]) && !input.peek2(Token![::]) {
        return parse_tensor(input).map(Stmt::Tensor);
    }
    if input.peek(Ident::peek_any) && input.peek2(syn::token::Bracket) {
        return parse_compute(input).map(Stmt::Compute);
    }
    let keyword = ident_or(input, STATEMENT_HELP)?;
    let what = format!("`{keyword}` statement");
    let stmt = match keyword.to_string().as_str() {
        "tile" => Stmt::Tile(parse_comma_until_semi(input, parse_tile_decl)?),
        "epilogue" => {
            let items = parse_comma_until_semi(input, parse_epilogue_item)?;
            Stmt::Epilogue(EpilogueStmt { keyword, items })
        }
        "softmax" => {
            let mode = parse_softmax_mode(input)?;
            Stmt::Softmax(SoftmaxStmt { keyword, mode })
        }
        "parallel" => {
            let axes = parse_comma_until_semi(input, |i| parse_name(i, "an axis name"))?;
            Stmt::Parallel(axes)
        }
        // Kept as a keyword so an old kernel gets the reason, not a parse
        // error about a tensor declaration.
        "double_buffer" => {
            return fail(
                keyword.span(),
                "`double_buffer` is not a schedule statement: load staging is chosen per target \
                 (its GPU stages, its CPU prefetch distance), so the line changed nothing; remove it",
            );
        }
        "split" => {
            let axis = parse_name(input, "the axis to split across threads, e.g. `split s;`")?;
            Stmt::Split(keyword, axis)
        }
        _ => return fail(keyword.span(), STATEMENT_HELP),
    };
    expect_semicolon(input, &what)?;
    Ok(stmt)
}

/// A non-empty comma-separated list running to the next `;` (not consumed).
fn parse_comma_until_semi<T>(
    input: ParseStream,
    item: impl Fn(ParseStream) -> syn::Result<T>,
) -> syn::Result<Vec<T>> {
    let mut items = vec![item(input)?];
    while input.peek(Token![,]) {
        let _comma: Token![,] = input.parse()?;
        items.push(item(input)?);
    }
    Ok(items)
}

fn parse_tile_decl(input: ParseStream) -> syn::Result<TileDecl> {
    let axis = parse_name(input, "an axis to tile: `tile e by ep`")?;
    let by = any_ident(input).ok();
    if by.as_ref().is_none_or(|b| b != "by") {
        let loc = by.map_or(input.span(), |b| b.span());
        return fail(
            loc,
            format!(
                "expected `by`: `tile {axis} by {axis}p` (solver picks) or `tile {axis} by {axis}p = 8` (fixed)"
            ),
        );
    }
    let tile = parse_name(input, "a tile variable name, e.g. `ep`")?;
    let fixed = if input.peek(Token![=]) {
        let _eq: Token![=] = input.parse()?;
        Some(parse_size(input, "the fixed tile size")?)
    } else {
        None
    };
    Ok(TileDecl { axis, tile, fixed })
}

fn parse_role(input: ParseStream) -> syn::Result<(Role, Loc)> {
    let help = "expected the tensor's role: `input`, `weight`, `output` or `cache`";
    let ident = ident_or(input, help)?;
    let role = match ident.to_string().as_str() {
        "input" => Role::Input,
        "weight" => Role::Weight,
        "output" => Role::Output,
        "cache" => Role::Cache,
        other => return fail(ident.span(), format!("unknown role `{other}`; {help}")),
    };
    Ok((role, Loc::of(ident.span())))
}

/// `[a, b, c]` of identifiers, with the bracket's location.
fn parse_axis_list(input: ParseStream, what: &str) -> syn::Result<(Vec<Ident>, Loc)> {
    if !input.peek(syn::token::Bracket) {
        return fail(
            input.span(),
            format!("expected {what} in brackets, e.g. `[e, l]`"),
        );
    }
    let inner;
    let bracket = bracketed!(inner in input);
    let items = parse_comma_list(&inner, |i| parse_name(i, "an axis name"))?;
    let loc = Loc {
        first: bracket.span.open(),
        last: bracket.span.close(),
    };
    Ok((items, loc))
}

fn parse_tensor(input: ParseStream) -> syn::Result<TensorDecl> {
    let name = any_ident(input)?;
    let _colon: Token![:] = input.parse()?;
    let (role, role_loc) = parse_role(input)?;
    let (format, format_loc) = parse_format(input)?;
    let (dims, dims_loc) = parse_axis_list(input, &format!("the dimensions of `{name}`"))?;
    let mut decl = TensorDecl {
        name,
        role,
        role_loc,
        format,
        format_loc,
        dims,
        dims_loc,
        layout: None,
        pair_transpose: None,
        signed_codes: None,
        prescaled: None,
    };
    while !input.peek(Token![;]) {
        let attr = ident_or(
            input,
            format!(
                "expected `layout [...]`, `pair_transpose`, `signed_codes`, `prescaled` or `;` after tensor `{}`",
                decl.name
            ),
        )?;
        let loc = Loc::of(attr.span());
        let duplicate = || {
            fail(
                loc,
                format!("`{attr}` is given twice for tensor `{}`", decl.name),
            )
        };
        match attr.to_string().as_str() {
            "layout" => {
                if decl.layout.is_some() {
                    return duplicate();
                }
                if !input.peek(syn::token::Bracket) {
                    return fail(
                        input.span(),
                        "expected the layout in brackets, outermost first, e.g. `[h/hp, l/lp, hp, lp]`",
                    );
                }
                let inner;
                bracketed!(inner in input);
                decl.layout = Some(parse_comma_list(&inner, parse_layout_item)?);
            }
            "pair_transpose" => {
                if decl.pair_transpose.is_some() {
                    return duplicate();
                }
                decl.pair_transpose = Some(loc);
            }
            "signed_codes" => {
                if decl.signed_codes.is_some() {
                    return duplicate();
                }
                decl.signed_codes = Some(loc);
            }
            "prescaled" => {
                if decl.prescaled.is_some() {
                    return duplicate();
                }
                decl.prescaled = Some(loc);
            }
            other => {
                // A statement's start right after a declaration means a missing `;`.
                let starts_statement = input.peek(Token![:])
                    || input.peek(syn::token::Bracket)
                    || STATEMENT_KEYWORDS.contains(&other);
                let message = if starts_statement {
                    format!(
                        "expected `;` before `{other}`, to end the declaration of `{}`",
                        decl.name
                    )
                } else {
                    format!(
                        "unknown tensor attribute `{other}`; expected `layout [...]`, `pair_transpose`, `signed_codes`, `prescaled` or `;`"
                    )
                };
                return fail(loc, message);
            }
        }
    }
    let _semi: Token![;] = input.parse()?;
    Ok(decl)
}

fn parse_layout_item(input: ParseStream) -> syn::Result<LayoutItem> {
    let first = parse_name(
        input,
        "a layout dimension: an axis `h`, its tile count `h/hp`, or a tile variable `hp`",
    )?;
    if input.peek(Token![/]) {
        let _slash: Token![/] = input.parse()?;
        let tile = parse_name(input, "a tile variable after `/`, e.g. `h/hp`")?;
        return Ok(LayoutItem::Outer { axis: first, tile });
    }
    Ok(LayoutItem::Single(first))
}

fn parse_indexed(input: ParseStream, what: &str) -> syn::Result<Indexed> {
    let tensor = parse_name(input, what)?;
    let (indices, indices_loc) = parse_axis_list(input, &format!("the axes indexing `{tensor}`"))?;
    Ok(Indexed {
        tensor,
        indices,
        indices_loc,
    })
}

const RHS_HELP: &str = "expected `sum(l) x[e, l] * w[h, l]` (matmul) or \
     `attention(q[t, hq, d], k[s, kvh, d], v[s, kvh, d]) decode` (or `prefill`)";

fn parse_compute(input: ParseStream) -> syn::Result<Compute> {
    let out = parse_indexed(input, "the output tensor")?;
    if !input.peek(Token![=]) {
        return fail(
            input.span(),
            format!("expected `=` after `{}[...]`", out.tensor),
        );
    }
    let _eq: Token![=] = input.parse()?;
    let head = ident_or(input, RHS_HELP)?;
    let rhs = match head.to_string().as_str() {
        "sum" => {
            if !input.peek(syn::token::Paren) {
                return fail(
                    input.span(),
                    "expected the summed axis in parentheses: `sum(l)`",
                );
            }
            let inner;
            parenthesized!(inner in input);
            let axis = parse_name(&inner, "the summed axis, e.g. `sum(l)`")?;
            if !inner.is_empty() {
                return fail(
                    inner.span(),
                    "a matmul sums over exactly one axis: `sum(l)`",
                );
            }
            let x = parse_indexed(input, "the activations, e.g. `x[e, l]`")?;
            if !input.peek(Token![*]) {
                return fail(
                    input.span(),
                    "expected `*` between the activations and the weights",
                );
            }
            let _star: Token![*] = input.parse()?;
            let w = parse_indexed(input, "the weights, e.g. `w[h, l]`")?;
            Rhs::Sum { axis, x, w }
        }
        "attention" => {
            if !input.peek(syn::token::Paren) {
                return fail(
                    input.span(),
                    "expected the operands in parentheses: `attention(q[t, hq, d], k[s, kvh, d], v[s, kvh, d])`",
                );
            }
            let inner;
            parenthesized!(inner in input);
            let q = parse_indexed(&inner, "the query, e.g. `q[t, hq, d]`")?;
            expect_comma(&inner, "the query")?;
            let k = parse_indexed(&inner, "the key cache, e.g. `k[s, kvh, d]`")?;
            expect_comma(&inner, "the keys")?;
            let v = parse_indexed(&inner, "the value cache, e.g. `v[s, kvh, d]`")?;
            if !inner.is_empty() {
                return fail(
                    inner.span(),
                    "attention takes exactly three operands: q, k, v",
                );
            }
            let kind_help = "expected `decode` (one query token against the cache) or `prefill` (causal) after `attention(...)`";
            let kind_ident = ident_or(input, kind_help)?;
            let kind = match kind_ident.to_string().as_str() {
                "decode" => AttentionKind::Decode,
                "prefill" => AttentionKind::Prefill,
                _ => return fail(kind_ident.span(), kind_help),
            };
            Rhs::Attention { q, k, v, kind }
        }
        _ => return fail(head.span(), RHS_HELP),
    };
    expect_semicolon(input, "the computation")?;
    Ok(Compute { out, rhs })
}

fn expect_comma(input: ParseStream, after: &str) -> syn::Result<()> {
    if input.peek(Token![,]) {
        let _comma: Token![,] = input.parse()?;
        Ok(())
    } else {
        fail(input.span(), format!("expected `,` after {after}"))
    }
}

fn parse_epilogue_item(input: ParseStream) -> syn::Result<EpilogueItem> {
    let help = "expected an epilogue step: `scale`, `zero_point`, `bias(b)`, `relu` or `silu`";
    let ident = ident_or(input, help)?;
    Ok(match ident.to_string().as_str() {
        "scale" => EpilogueItem::Scale(ident),
        "zero_point" => EpilogueItem::ZeroPoint(ident),
        "relu" => EpilogueItem::Relu(ident),
        "silu" => EpilogueItem::Silu(ident),
        "bias" => {
            if !input.peek(syn::token::Paren) {
                return fail(
                    input.span(),
                    "expected the bias tensor in parentheses: `bias(b)`",
                );
            }
            let inner;
            parenthesized!(inner in input);
            let tensor = parse_name(&inner, "the bias tensor, e.g. `bias(b)`")?;
            if !inner.is_empty() {
                return fail(inner.span(), "`bias(...)` takes one tensor name");
            }
            EpilogueItem::Bias(ident, tensor)
        }
        _ => return fail(ident.span(), help),
    })
}

fn parse_softmax_mode(input: ParseStream) -> syn::Result<SoftmaxMode> {
    let help = "expected `online` or `async(phi = 0.0, lo = -20.0, hi = 20.0)`";
    let ident = ident_or(input, help)?;
    match ident.to_string().as_str() {
        "online" => Ok(SoftmaxMode::Online),
        "async" => {
            if !input.peek(syn::token::Paren) {
                return fail(
                    input.span(),
                    "expected the unified max and bounds: `async(phi = 0.0, lo = -20.0, hi = 20.0)`",
                );
            }
            let inner;
            parenthesized!(inner in input);
            let mut values = [None, None, None];
            let names = ["phi", "lo", "hi"];
            let args = parse_comma_list(&inner, |i| {
                let name = parse_name(i, "`phi`, `lo` or `hi`")?;
                if !i.peek(Token![=]) {
                    return fail(i.span(), format!("expected `=` after `{name}`"));
                }
                let _eq: Token![=] = i.parse()?;
                let value = parse_f32(i)?;
                Ok((name, value))
            })?;
            for (name, value) in args {
                let slot = names.iter().position(|n| name == n);
                match slot.and_then(|s| values.get_mut(s)) {
                    Some(Some(_)) => return fail(name.span(), format!("`{name}` is given twice")),
                    Some(slot) => *slot = Some((value, name.span())),
                    None => {
                        return fail(
                            name.span(),
                            format!(
                                "unknown softmax parameter `{name}`; expected `phi`, `lo` and `hi`"
                            ),
                        );
                    }
                }
            }
            let [Some(phi), Some(lo), Some(hi)] = values else {
                let missing: Vec<&str> = names
                    .iter()
                    .zip(values.iter())
                    .filter(|(_, v)| v.is_none())
                    .map(|(n, _)| *n)
                    .collect();
                return fail(
                    ident.span(),
                    format!(
                        "`async` needs `phi` (the unified max), `lo` and `hi` (the bounds on score - phi); missing: {}",
                        missing.join(", ")
                    ),
                );
            };
            if lo.0 >= hi.0 {
                return fail(
                    hi.1,
                    format!(
                        "the bounds must satisfy lo < hi, got lo = {} and hi = {}",
                        lo.0, hi.0
                    ),
                );
            }
            Ok(SoftmaxMode::Async {
                phi: phi.0,
                lo: lo.0,
                hi: hi.0,
            })
        }
        _ => fail(
            ident.span(),
            format!("unknown softmax mode `{ident}`; {help}"),
        ),
    }
}

/// A finite f32 from `1.5`, `-20`, `-0.25` (no suffix).
fn parse_f32(input: ParseStream) -> syn::Result<f32> {
    let negative = if input.peek(Token![-]) {
        let _minus: Token![-] = input.parse()?;
        true
    } else {
        false
    };
    let (digits, loc) = if input.peek(syn::LitFloat) {
        let lit: syn::LitFloat = input.parse()?;
        if !lit.suffix().is_empty() {
            return fail(lit.span(), "expected a plain number, without a type suffix");
        }
        (lit.base10_digits().to_string(), Loc::of(lit.span()))
    } else if input.peek(LitInt) {
        let lit: LitInt = input.parse()?;
        if !lit.suffix().is_empty() {
            return fail(lit.span(), "expected a plain number, without a type suffix");
        }
        (lit.base10_digits().to_string(), Loc::of(lit.span()))
    } else {
        return fail(input.span(), "expected a number, e.g. `-20.0`");
    };
    match digits.parse::<f32>() {
        Ok(v) if v.is_finite() => Ok(if negative { -v } else { v }),
        _ => fail(loc, "the number does not fit in a finite f32"),
    }
}
