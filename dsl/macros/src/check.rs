//! Meaning: resolve the names of a parsed [`KernelDef`] and check that they
//! agree, producing a [`Spec`]: plain data that maps one-to-one onto the IR.
//!
//! The checks mirror what `tessera_dsl::verify` rejects, and reject nothing
//! it accepts, so that a kernel the macro accepts builds, and each mistake is
//! reported at compile time on the token that caused it rather than at run
//! time (`agree.rs` runs both over the same variations).

use crate::error::{Loc, fail};
use crate::format::{Format, Group, ParamType};
use crate::parse::{
    AttentionKind, Compute, EpilogueItem, EpilogueStmt, Indexed, KernelDef, LayoutItem, Rhs, Role,
    SoftmaxMode, SoftmaxStmt, Stmt, TensorDecl, TileDecl,
};
use syn::Ident;

/// A checked kernel, ready to emit.
#[derive(Clone, Debug, PartialEq)]
pub struct Spec {
    pub name: String,
    pub axes: Vec<AxisSpec>,
    pub tiles: Vec<TileSpec>,
    pub tensors: Vec<TensorSpec>,
    pub op: OpSpec,
    pub parallel: Vec<String>,
    pub split: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AxisSpec {
    pub name: String,
    pub fixed: Option<u32>,
    pub reduce: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TileSpec {
    pub name: String,
    pub axis: String,
    pub fixed: Option<u32>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LayoutDim {
    Whole(String),
    Outer { axis: String, tile: String },
    Inner { tile: String },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSpec {
    pub name: String,
    pub role: Role,
    pub dims: Vec<String>,
    pub format: Format,
    /// `None`: row-major over `dims`.
    pub layout: Option<Vec<LayoutDim>>,
    pub pair_transpose: bool,
    /// Codes stored as q XOR 8 (`u4sym` only).
    pub signed_codes: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    None,
    Relu,
    Silu,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MatmulSpec {
    pub x: String,
    pub w: String,
    pub y: String,
    pub e: String,
    pub h: String,
    pub l: String,
    pub scale: bool,
    pub zero_point: bool,
    pub bias: Option<String>,
    pub activation: Activation,
}

#[derive(Clone, Debug, PartialEq)]
pub struct AttentionSpec {
    pub kind: AttentionKind,
    pub q: String,
    pub k: String,
    pub v: String,
    pub o: String,
    pub tokens: String,
    pub heads: String,
    pub kv_heads: String,
    pub head_dim: String,
    pub seq: String,
    pub q_prescaled: bool,
    pub softmax: SoftmaxMode,
}

#[derive(Clone, Debug, PartialEq)]
pub enum OpSpec {
    Matmul(MatmulSpec),
    Attention(AttentionSpec),
}

/// Names declared so far, with where they were declared.
struct Scope<'a> {
    /// Each axis with its fixed extent and where that extent is written.
    axes: Vec<(&'a Ident, Option<(u32, Loc)>)>,
    tiles: Vec<&'a TileDecl>,
    tensors: Vec<&'a TensorDecl>,
}

fn list<'b>(names: impl Iterator<Item = &'b Ident>) -> String {
    let names: Vec<String> = names.map(|n| format!("`{n}`")).collect();
    if names.is_empty() {
        "none".to_string()
    } else {
        names.join(", ")
    }
}

fn bracketed(names: &[Ident]) -> String {
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    format!("[{}]", names.join(", "))
}

impl<'a> Scope<'a> {
    fn is_axis(&self, name: &Ident) -> bool {
        self.axes.iter().any(|(a, _)| *a == name)
    }

    fn tile(&self, name: &Ident) -> Option<&'a TileDecl> {
        self.tiles.iter().copied().find(|t| t.tile == *name)
    }

    fn tensor(&self, name: &Ident) -> Option<&'a TensorDecl> {
        self.tensors.iter().copied().find(|t| t.name == *name)
    }

    /// The fixed extent of a declared axis, with where it is written.
    fn fixed_extent(&self, name: &Ident) -> Option<(u32, Loc)> {
        self.axes
            .iter()
            .find(|(a, _)| *a == name)
            .and_then(|(_, fixed)| *fixed)
    }

    fn axis_names(&self) -> String {
        list(self.axes.iter().map(|(a, _)| *a))
    }

    fn require_axis(&self, name: &Ident, context: &str) -> syn::Result<()> {
        if self.is_axis(name) {
            return Ok(());
        }
        let hint = match self.tile(name) {
            Some(t) => format!(" (`{name}` is the tile variable of axis `{}`)", t.axis),
            None => String::new(),
        };
        fail(
            name.span(),
            format!(
                "unknown axis `{name}` {context}{hint}; the kernel's axes are {}",
                self.axis_names()
            ),
        )
    }

    fn require_tensor(&self, name: &Ident) -> syn::Result<&'a TensorDecl> {
        self.tensor(name).ok_or_else(|| {
            Loc::of(name.span()).error(format!(
                "unknown tensor `{name}`; declared tensors: {} (declare it as `{name}: input f32 [e, l];`)",
                list(self.tensors.iter().map(|t| &t.name))
            ))
        })
    }
}

/// Check a parsed kernel; the first problem found is returned as a spanned error.
pub fn check(def: &KernelDef) -> syn::Result<Spec> {
    let mut scope = Scope {
        axes: Vec::new(),
        tiles: Vec::new(),
        tensors: Vec::new(),
    };
    if def.axes.is_empty() {
        return fail(
            def.name_loc,
            "a kernel needs its axes in the parentheses, e.g. `(e, h, l)`",
        );
    }
    for param in &def.axes {
        if scope.is_axis(&param.name) {
            return fail(
                param.name.span(),
                format!("axis `{}` is declared twice", param.name),
            );
        }
        scope.axes.push((&param.name, param.fixed));
    }

    let mut compute: Option<&Compute> = None;
    let mut epilogue: Option<&EpilogueStmt> = None;
    let mut softmax: Option<&SoftmaxStmt> = None;
    let mut parallel: Vec<&Ident> = Vec::new();
    let mut split: Option<&Ident> = None;
    for stmt in &def.body {
        match stmt {
            Stmt::Tile(decls) => {
                for decl in decls {
                    declare_tile(&mut scope, decl)?;
                }
            }
            Stmt::Tensor(decl) => {
                if scope.tensor(&decl.name).is_some() {
                    return fail(
                        decl.name.span(),
                        format!("tensor `{}` is declared twice", decl.name),
                    );
                }
                scope.tensors.push(decl);
            }
            Stmt::Compute(c) => {
                if compute.is_some() {
                    return fail(
                        c.out.tensor.span(),
                        "a kernel has exactly one computation; this is a second one",
                    );
                }
                compute = Some(c);
            }
            Stmt::Epilogue(e) => {
                if epilogue.is_some() {
                    return fail(
                        e.keyword.span(),
                        "`epilogue` is given twice; list every step in one statement",
                    );
                }
                epilogue = Some(e);
            }
            Stmt::Softmax(s) => {
                if softmax.is_some() {
                    return fail(s.keyword.span(), "`softmax` is given twice");
                }
                softmax = Some(s);
            }
            Stmt::Parallel(axes) => parallel.extend(axes),
            Stmt::Split(keyword, axis) => {
                if split.is_some() {
                    return fail(
                        keyword.span(),
                        "`split` is given twice; a kernel splits at most one axis",
                    );
                }
                split = Some(axis);
            }
        }
    }

    // Tensors are checked once every tile is known, so statement order is free.
    let mut tensors = Vec::new();
    for decl in &scope.tensors {
        tensors.push(check_tensor(&scope, decl)?);
    }

    let Some(compute) = compute else {
        return fail(
            def.body_loc,
            "the kernel has no computation: add `y[e, h] = sum(l) x[e, l] * w[h, l];` \
             or `o[t, hq, d] = attention(q[t, hq, d], k[s, kvh, d], v[s, kvh, d]) decode;`",
        );
    };
    let (op, reduce_axis) = match &compute.rhs {
        Rhs::Sum { axis, x, w } => {
            if let Some(s) = softmax {
                return fail(
                    s.keyword.span(),
                    "`softmax` applies to attention; a matmul has none",
                );
            }
            let m = check_matmul(&scope, &compute.out, axis, x, w, epilogue)?;
            let l = m.l.clone();
            (OpSpec::Matmul(m), l)
        }
        Rhs::Attention { q, k, v, kind } => {
            if let Some(e) = epilogue {
                return fail(
                    e.keyword.span(),
                    "attention has no epilogue; set its softmax with `softmax online;` or `softmax async(...);`",
                );
            }
            let a = check_attention(&scope, &compute.out, q, k, v, *kind, softmax)?;
            let s = a.seq.clone();
            (OpSpec::Attention(a), s)
        }
    };

    // Tensors and axes the op does not use are allowed, as `verify()` allows
    // them; only `prescaled`, which the IR keeps on the query alone, must
    // sit on the query.
    for decl in &scope.tensors {
        if let Some(loc) = decl.prescaled {
            let is_query = matches!(&op, OpSpec::Attention(a) if decl.name == a.q);
            if !is_query {
                return fail(
                    loc,
                    format!(
                        "`prescaled` marks the attention query as already multiplied by 1/sqrt(d); `{}` is not the query",
                        decl.name
                    ),
                );
            }
        }
    }

    let parallel_idents = parallel;
    let parallel = check_axis_list(&scope, &parallel_idents, "parallel")?;
    if let Some(axis) = parallel_idents
        .iter()
        .find(|axis| **axis == reduce_axis.as_str())
    {
        return fail(
            axis.span(),
            format!(
                "`parallel` gives each thread its own outputs; `{axis}` is reduced, so threads would race \
                 on the same outputs (use `split {axis}` to divide a reduction)"
            ),
        );
    }
    let split = match split {
        None => None,
        Some(axis) => {
            scope.require_axis(axis, "in `split`")?;
            if *axis != reduce_axis {
                return fail(
                    axis.span(),
                    format!(
                        "`split` divides the reduced axis across threads and combines the partial results; \
                         `{axis}` is not reduced (this kernel reduces `{reduce_axis}`)"
                    ),
                );
            }
            Some(axis.to_string())
        }
    };

    let axes = scope
        .axes
        .iter()
        .map(|(name, fixed)| AxisSpec {
            name: name.to_string(),
            fixed: fixed.map(|(n, _)| n),
            reduce: *name == &reduce_axis,
        })
        .collect();
    let tiles = scope
        .tiles
        .iter()
        .map(|t| TileSpec {
            name: t.tile.to_string(),
            axis: t.axis.to_string(),
            fixed: t.fixed.map(|(n, _)| n),
        })
        .collect();
    Ok(Spec {
        name: def.name.clone(),
        axes,
        tiles,
        tensors,
        op,
        parallel,
        split,
    })
}

fn declare_tile<'a>(scope: &mut Scope<'a>, decl: &'a TileDecl) -> syn::Result<()> {
    scope.require_axis(&decl.axis, "in `tile`")?;
    if scope.is_axis(&decl.tile) {
        return fail(
            decl.tile.span(),
            format!(
                "tile variable `{}` has the name of an axis; pick a new name, e.g. `{}p`",
                decl.tile, decl.axis
            ),
        );
    }
    if scope.tile(&decl.tile).is_some() {
        return fail(
            decl.tile.span(),
            format!("tile variable `{}` is declared twice", decl.tile),
        );
    }
    if let Some(other) = scope.tiles.iter().find(|t| t.axis == decl.axis) {
        return fail(
            decl.axis.span(),
            format!(
                "axis `{}` is already tiled by `{}`; an axis has at most one tile",
                decl.axis, other.tile
            ),
        );
    }
    scope.tiles.push(decl);
    Ok(())
}

/// How one tensor dimension appears in its layout.
#[derive(Default)]
struct Coverage {
    whole: bool,
    outer: Option<Loc>,
    inner: Option<Loc>,
}

fn check_tensor(scope: &Scope, decl: &TensorDecl) -> syn::Result<TensorSpec> {
    let name = &decl.name;
    for (i, dim) in decl.dims.iter().enumerate() {
        scope.require_axis(dim, &format!("in the dimensions of `{name}`"))?;
        if decl.dims.iter().take(i).any(|d| d == dim) {
            return fail(
                dim.span(),
                format!("axis `{dim}` appears twice in the dimensions of `{name}`"),
            );
        }
    }
    let format = decl.format;
    if let Some(loc) = decl.pair_transpose
        && format.bits() != 4
    {
        return fail(
            loc,
            format!(
                "`pair_transpose` packs pairs of 4-bit codes into bytes; `{name}` is {} ({}-bit)",
                format.spelling(),
                format.bits()
            ),
        );
    }
    if let Some(loc) = decl.signed_codes
        && !matches!(format, Format::U4Sym(..))
    {
        return fail(
            loc,
            format!(
                "`signed_codes` stores q - 8 for the implied zero point 8, so it needs u4sym; `{name}` is {}",
                format.spelling()
            ),
        );
    }
    let layout = match &decl.layout {
        None => None,
        Some(items) => Some(check_layout(scope, decl, items)?),
    };
    Ok(TensorSpec {
        name: name.to_string(),
        role: decl.role,
        dims: decl.dims.iter().map(|d| d.to_string()).collect(),
        format,
        layout,
        pair_transpose: decl.pair_transpose.is_some(),
        signed_codes: decl.signed_codes.is_some(),
    })
}

fn check_layout(
    scope: &Scope,
    decl: &TensorDecl,
    items: &[LayoutItem],
) -> syn::Result<Vec<LayoutDim>> {
    let name = &decl.name;
    let dims_text = bracketed(&decl.dims);
    let mut coverage: Vec<Coverage> = decl.dims.iter().map(|_| Coverage::default()).collect();
    let dim_index = |axis: &Ident, at: Loc| -> syn::Result<usize> {
        decl.dims.iter().position(|d| d == axis).ok_or_else(|| {
            at.error(format!(
                "`{name}` has no axis `{axis}` (its dimensions are {dims_text}), so its layout cannot use it"
            ))
        })
    };
    let twice = |at: Loc, what: &str| {
        fail::<()>(
            at,
            format!("{what} appears twice in the layout of `{name}`"),
        )
    };
    let mut out = Vec::new();
    for item in items {
        match item {
            LayoutItem::Outer { axis, tile } => {
                let at = Loc::of(axis.span()).to(Loc::of(tile.span()));
                scope.require_axis(axis, &format!("in the layout of `{name}`"))?;
                let Some(tile_decl) = scope.tile(tile) else {
                    return fail(
                        tile.span(),
                        format!(
                            "unknown tile variable `{tile}`; declare it with `tile {axis} by {tile};` (tiles so far: {})",
                            list(scope.tiles.iter().map(|t| &t.tile))
                        ),
                    );
                };
                if tile_decl.axis != *axis {
                    return fail(
                        tile.span(),
                        format!(
                            "tile `{tile}` splits axis `{}`, not `{axis}`: `{axis}/{tile}` does not match the tile axes",
                            tile_decl.axis
                        ),
                    );
                }
                let i = dim_index(axis, at)?;
                let c = coverage
                    .get_mut(i)
                    .ok_or_else(|| at.error("internal: bad dimension"))?;
                if c.whole {
                    return fail(
                        at,
                        format!(
                            "axis `{axis}` appears both whole and tiled in the layout of `{name}`"
                        ),
                    );
                }
                if c.outer.is_some() {
                    twice(at, &format!("`{axis}/{tile}`"))?;
                }
                c.outer = Some(at);
                out.push(LayoutDim::Outer {
                    axis: axis.to_string(),
                    tile: tile.to_string(),
                });
            }
            LayoutItem::Single(single) => {
                let at = Loc::of(single.span());
                if scope.is_axis(single) {
                    let i = dim_index(single, at)?;
                    let c = coverage
                        .get_mut(i)
                        .ok_or_else(|| at.error("internal: bad dimension"))?;
                    if c.outer.is_some() || c.inner.is_some() {
                        return fail(
                            at,
                            format!(
                                "axis `{single}` appears both whole and tiled in the layout of `{name}`"
                            ),
                        );
                    }
                    if c.whole {
                        twice(at, &format!("axis `{single}`"))?;
                    }
                    c.whole = true;
                    out.push(LayoutDim::Whole(single.to_string()));
                } else if let Some(tile_decl) = scope.tile(single) {
                    let i = dim_index(&tile_decl.axis, at)?;
                    let c = coverage
                        .get_mut(i)
                        .ok_or_else(|| at.error("internal: bad dimension"))?;
                    if c.whole {
                        return fail(
                            at,
                            format!(
                                "axis `{}` appears both whole and tiled in the layout of `{name}`",
                                tile_decl.axis
                            ),
                        );
                    }
                    if c.inner.is_some() {
                        twice(at, &format!("tile `{single}`"))?;
                    }
                    c.inner = Some(at);
                    out.push(LayoutDim::Inner {
                        tile: single.to_string(),
                    });
                } else {
                    return fail(
                        at,
                        format!(
                            "unknown name `{single}` in the layout of `{name}`: expected an axis ({}) or a tile variable ({})",
                            scope.axis_names(),
                            list(scope.tiles.iter().map(|t| &t.tile))
                        ),
                    );
                }
            }
        }
    }
    for (dim, c) in decl.dims.iter().zip(&coverage) {
        let tile = scope
            .tiles
            .iter()
            .find(|t| t.axis == *dim)
            .map_or_else(|| format!("{dim}p"), |t| t.tile.to_string());
        match (c.whole, c.outer, c.inner) {
            (true, None, None) | (false, Some(_), Some(_)) => {}
            (false, Some(at), None) => {
                return fail(
                    at,
                    format!(
                        "the layout of `{name}` has `{dim}/{tile}` but not `{tile}`: a tiled axis needs both the tile count and the position in the tile"
                    ),
                );
            }
            (false, None, Some(at)) => {
                return fail(
                    at,
                    format!(
                        "the layout of `{name}` has `{tile}` but not `{dim}/{tile}`: a tiled axis needs both the tile count and the position in the tile"
                    ),
                );
            }
            _ => {
                return fail(
                    decl.dims_loc,
                    format!(
                        "the layout of `{name}` leaves out axis `{dim}`: every dimension of {dims_text} must appear, whole (`{dim}`) or tiled (`{dim}/{tile}` and `{tile}`)"
                    ),
                );
            }
        }
    }
    Ok(out)
}

/// A tensor used in the computation: declared, and indexed exactly as declared.
fn check_use<'a>(scope: &Scope<'a>, used: &Indexed) -> syn::Result<&'a TensorDecl> {
    let decl = scope.require_tensor(&used.tensor)?;
    for index in &used.indices {
        scope.require_axis(index, &format!("indexing `{}`", used.tensor))?;
    }
    if used.indices.len() != decl.dims.len() {
        return fail(
            used.indices_loc,
            format!(
                "`{}` is declared with {} dimensions {} but indexed with {}",
                decl.name,
                decl.dims.len(),
                bracketed(&decl.dims),
                used.indices.len()
            ),
        );
    }
    for (i, (index, dim)) in used.indices.iter().zip(&decl.dims).enumerate() {
        if index != dim {
            return fail(
                index.span(),
                format!(
                    "`{}` is declared {}: index {} must be `{dim}`, not `{index}`",
                    decl.name,
                    bracketed(&decl.dims),
                    i + 1
                ),
            );
        }
    }
    Ok(decl)
}

fn require_role(decl: &TensorDecl, role: Role, what: &str) -> syn::Result<()> {
    if decl.role == role {
        return Ok(());
    }
    fail(
        decl.role_loc,
        format!(
            "`{}` is {what}, so it must be declared `{}`, not `{}`",
            decl.name,
            role.keyword(),
            decl.role.keyword()
        ),
    )
}

/// An operand's format must be one the op computes with.
fn require_format(decl: &TensorDecl, ok: bool, what: &str, allowed: &str) -> syn::Result<()> {
    if ok {
        return Ok(());
    }
    fail(
        decl.format_loc,
        format!(
            "{what} `{}` must be {allowed}, not {}",
            decl.name,
            decl.format.spelling()
        ),
    )
}

/// Check that `used` is indexed by exactly `expected` (axis names).
fn require_indices(used: &Indexed, expected: &[&Ident], what: &str) -> syn::Result<()> {
    let text: Vec<String> = expected.iter().map(|e| e.to_string()).collect();
    let text = format!("[{}]", text.join(", "));
    if used.indices.len() != expected.len() {
        return fail(used.indices_loc, format!("{what} must be indexed {text}"));
    }
    for (index, want) in used.indices.iter().zip(expected) {
        if index != *want {
            return fail(
                index.span(),
                format!("{what} must be indexed {text}: expected `{want}` here, not `{index}`"),
            );
        }
    }
    Ok(())
}

fn check_matmul(
    scope: &Scope,
    out: &Indexed,
    sum_axis: &Ident,
    x: &Indexed,
    w: &Indexed,
    epilogue: Option<&EpilogueStmt>,
) -> syn::Result<MatmulSpec> {
    let y_decl = check_use(scope, out)?;
    let [e, h] = out.indices.as_slice() else {
        return fail(
            out.indices_loc,
            format!(
                "a matmul writes a 2-D output `{}[e, h]` (rows, output channels)",
                out.tensor
            ),
        );
    };
    scope.require_axis(sum_axis, "in `sum`")?;
    if out.indices.iter().any(|i| i == sum_axis) {
        return fail(
            sum_axis.span(),
            format!(
                "cannot sum over `{sum_axis}`: the output `{}` keeps it; sum over the axis that `{}` and `{}` share and the output drops",
                out.tensor, x.tensor, w.tensor
            ),
        );
    }
    let x_decl = check_use(scope, x)?;
    let w_decl = check_use(scope, w)?;
    require_indices(
        x,
        &[e, sum_axis],
        &format!(
            "the activations `{}` (rows of `{}`, then the summed axis)",
            x.tensor, out.tensor
        ),
    )?;
    require_indices(
        w,
        &[h, sum_axis],
        &format!(
            "the weights `{}` (output channels of `{}`, then the summed axis)",
            w.tensor, out.tensor
        ),
    )?;
    require_role(y_decl, Role::Output, "the result")?;
    require_role(x_decl, Role::Input, "the activations")?;
    require_role(w_decl, Role::Weight, "the weights")?;
    require_format(
        x_decl,
        x_decl.format.is_compute_float() || x_decl.format == Format::I8Dyn,
        "activations",
        "f32, f16, bf16 or i8dyn (quantized per row on the fly)",
    )?;
    require_format(
        w_decl,
        !matches!(
            w_decl.format,
            Format::I8Dyn | Format::Fp8E4M3 | Format::Fp8E5M2
        ),
        "weights",
        "f32, f16, bf16 or a grouped format (u4asym:G, i8sym:G, i8asym:G, e0m4:G); \
         i8dyn is for activations quantized on the fly, fp8 for KV values",
    )?;
    require_format(
        y_decl,
        y_decl.format.is_compute_float(),
        "output",
        "f32, f16 or bf16 (the kernel writes real values)",
    )?;

    let mut scale = None;
    let mut zero_point = None;
    let mut bias = None;
    let mut activation: Option<(Activation, &Ident)> = None;
    for item in epilogue.map(|e| e.items.as_slice()).unwrap_or_default() {
        let twice =
            |i: &Ident| fail::<()>(i.span(), format!("`{i}` is given twice in the epilogue"));
        match item {
            EpilogueItem::Scale(i) => {
                if scale.is_some() {
                    twice(i)?;
                }
                scale = Some(i);
            }
            EpilogueItem::ZeroPoint(i) => {
                if zero_point.is_some() {
                    twice(i)?;
                }
                zero_point = Some(i);
            }
            EpilogueItem::Bias(i, tensor) => {
                if bias.is_some() {
                    twice(i)?;
                }
                bias = Some(tensor);
            }
            EpilogueItem::Relu(i) | EpilogueItem::Silu(i) => {
                if let Some((_, previous)) = activation {
                    return fail(
                        i.span(),
                        format!(
                            "the epilogue already applies `{previous}`; one activation at most"
                        ),
                    );
                }
                let act = if matches!(item, EpilogueItem::Relu(_)) {
                    Activation::Relu
                } else {
                    Activation::Silu
                };
                activation = Some((act, i));
            }
        }
    }

    let quantized: Vec<&TensorDecl> = [x_decl, w_decl]
        .into_iter()
        .filter(|t| t.format.is_quantized())
        .collect();
    let described: Vec<String> = quantized
        .iter()
        .map(|t| format!("`{}` ({})", t.name, t.format.spelling()))
        .collect();
    let (subject, verb) = match described.as_slice() {
        [one] => (one.clone(), "is"),
        _ => (described.join(" and "), "are"),
    };
    match (quantized.first(), scale, epilogue) {
        (Some(_), None, Some(ep)) => {
            return fail(
                ep.keyword.span(),
                format!(
                    "the epilogue is missing `scale`: {subject} {verb} quantized, so the accumulators must be multiplied by the dequantization scales"
                ),
            );
        }
        (Some(t), None, None) => {
            let needs = if w_decl.format.is_asymmetric() {
                "epilogue scale, zero_point;"
            } else {
                "epilogue scale;"
            };
            return fail(
                t.format_loc,
                format!(
                    "{subject} {verb} quantized, so the kernel needs an epilogue that applies the dequantization scales: add `{needs}`"
                ),
            );
        }
        (None, Some(s), _) => {
            return fail(
                s.span(),
                format!(
                    "`scale` multiplies by dequantization scales, but neither `{}` ({}) nor `{}` ({}) is quantized",
                    x_decl.name,
                    x_decl.format.spelling(),
                    w_decl.name,
                    w_decl.format.spelling()
                ),
            );
        }
        _ => {}
    }
    match (w_decl.format.is_asymmetric(), zero_point) {
        (true, None) => {
            let at = epilogue.map_or(w_decl.format_loc, |ep| Loc::of(ep.keyword.span()));
            return fail(
                at,
                format!(
                    "the epilogue is missing `zero_point`: weights `{}` are {}, an asymmetric format, whose offset term must be added back",
                    w_decl.name,
                    w_decl.format.spelling()
                ),
            );
        }
        (false, Some(z)) => {
            return fail(
                z.span(),
                format!(
                    "`zero_point` corrects asymmetric weights, but `{}` is {}, which has no offset",
                    w_decl.name,
                    w_decl.format.spelling()
                ),
            );
        }
        _ => {}
    }
    if let Some(b) = bias {
        let b_decl = scope.require_tensor(b)?;
        if b_decl.dims.len() != 1 || b_decl.dims.iter().any(|d| d != h) {
            return fail(
                b_decl.dims_loc,
                format!(
                    "the bias `{b}` is added per output channel, so it must be declared `[{h}]`, not {}",
                    bracketed(&b_decl.dims)
                ),
            );
        }
        if b_decl.role != Role::Input {
            return fail(
                b_decl.role_loc,
                format!(
                    "the bias `{b}` is read each call like the activations, so it must be declared `input`, not `{}`",
                    b_decl.role.keyword()
                ),
            );
        }
        if !b_decl.format.is_compute_float() {
            return fail(
                b_decl.format_loc,
                format!(
                    "the bias `{b}` must be f32, f16 or bf16, not {}",
                    b_decl.format.spelling()
                ),
            );
        }
    }

    Ok(MatmulSpec {
        x: x.tensor.to_string(),
        w: w.tensor.to_string(),
        y: out.tensor.to_string(),
        e: e.to_string(),
        h: h.to_string(),
        l: sum_axis.to_string(),
        scale: scale.is_some(),
        zero_point: zero_point.is_some(),
        bias: bias.map(|b| b.to_string()),
        activation: activation.map_or(Activation::None, |(a, _)| a),
    })
}

/// A KV cache grows by appending along the sequence axis, so `s` must be
/// outermost in its layout: whole (`s`) or as the tile count `s/sp`.
fn require_seq_outermost(cache: &TensorDecl, s: &Ident) -> syn::Result<()> {
    let Some(items) = &cache.layout else {
        // Row-major over dims that start with `s` (checked by the indexing).
        return Ok(());
    };
    let (first, outermost) = match items.first() {
        Some(LayoutItem::Outer { axis, .. }) => (Loc::of(axis.span()), axis == s),
        Some(LayoutItem::Single(name)) => (Loc::of(name.span()), name == s),
        None => (cache.dims_loc, false),
    };
    if outermost {
        return Ok(());
    }
    fail(
        first,
        format!(
            "the cache `{}` is appended along its sequence axis `{s}`, so its layout must start with `{s}` (whole, or tiled as `{s}/TILE`)",
            cache.name
        ),
    )
}

#[allow(clippy::too_many_arguments)]
fn check_attention(
    scope: &Scope,
    out: &Indexed,
    q: &Indexed,
    k: &Indexed,
    v: &Indexed,
    kind: AttentionKind,
    softmax: Option<&SoftmaxStmt>,
) -> syn::Result<AttentionSpec> {
    let o_decl = check_use(scope, out)?;
    let [t, hq, d] = out.indices.as_slice() else {
        return fail(
            out.indices_loc,
            format!(
                "attention writes a 3-D output `{}[t, hq, d]` (query tokens, query heads, head dimension)",
                out.tensor
            ),
        );
    };
    let k_decl = check_use(scope, k)?;
    let [s, kvh, _] = k.indices.as_slice() else {
        return fail(
            k.indices_loc,
            format!(
                "the key cache `{}` must be indexed [s, kvh, {d}] (sequence, KV heads, head dimension)",
                k.tensor
            ),
        );
    };
    if out.indices.iter().any(|i| i == s) {
        return fail(
            s.span(),
            format!(
                "the sequence axis `{s}` is reduced by the softmax-weighted sum, but the output `{}` keeps it; the cache's first axis must be the KV sequence",
                out.tensor
            ),
        );
    }
    if kvh == hq {
        return fail(
            kvh.span(),
            format!(
                "the KV-heads axis must differ from the query-heads axis `{hq}`; for plain multi-head \
                 attention declare a separate KV-heads axis with the same extent, e.g. `kvh`"
            ),
        );
    }
    if kvh == t || kvh == d {
        return fail(
            kvh.span(),
            format!(
                "the KV-heads axis `{kvh}` must differ from the tokens axis `{t}` and the head-dimension axis `{d}`"
            ),
        );
    }
    let q_decl = check_use(scope, q)?;
    let v_decl = check_use(scope, v)?;
    require_indices(
        q,
        &[t, hq, d],
        &format!("the query `{}` (like the output)", q.tensor),
    )?;
    require_indices(
        k,
        &[s, kvh, d],
        &format!(
            "the key cache `{}` (sequence, KV heads, head dimension)",
            k.tensor
        ),
    )?;
    require_indices(
        v,
        &[s, kvh, d],
        &format!("the value cache `{}` (like the keys)", v.tensor),
    )?;
    require_role(o_decl, Role::Output, "the result")?;
    require_role(q_decl, Role::Input, "the query")?;
    require_role(k_decl, Role::Cache, "the key cache")?;
    require_role(v_decl, Role::Cache, "the value cache")?;
    if k_decl.name == v_decl.name {
        return fail(
            v.tensor.span(),
            format!(
                "the key and value caches must be different tensors; `{}` is used for both",
                v.tensor
            ),
        );
    }
    require_format(
        q_decl,
        q_decl.format.is_compute_float(),
        "the query",
        "f32, f16 or bf16",
    )?;
    require_format(
        k_decl,
        k_decl.format.is_compute_float()
            || matches!(
                k_decl.format,
                Format::I8Asym(Group::Row, ParamType::F32)
                    | Format::U4Asym(Group::Row, ParamType::F32)
            ),
        "the key cache",
        "f32, f16, bf16, or quantized per token: i8asym:row or u4asym:row",
    )?;
    require_format(
        v_decl,
        v_decl.format.is_compute_float()
            || matches!(
                v_decl.format,
                Format::Fp8E4M3 | Format::Fp8E5M2 | Format::I8Asym(Group::Row, ParamType::F32)
            ),
        "the value cache",
        "f32, f16, bf16, fp8e4m3, fp8e5m2, or quantized per token: i8asym:row",
    )?;
    require_format(
        o_decl,
        o_decl.format.is_compute_float(),
        "output",
        "f32, f16 or bf16 (the kernel writes real values)",
    )?;
    for cache in [k_decl, v_decl] {
        require_seq_outermost(cache, s)?;
    }
    if kind == AttentionKind::Decode
        && let Some((n, at)) = scope.fixed_extent(t)
        && n != 1
    {
        return fail(
            at,
            format!(
                "decode attends one query token, so the tokens axis must be `{t} = 1` or bound at call time, \
                 not {n}; use `prefill` for several query tokens"
            ),
        );
    }
    if let (Some((nh, _)), Some((nkv, at))) = (scope.fixed_extent(hq), scope.fixed_extent(kvh))
        && nh % nkv != 0
    {
        return fail(
            at,
            format!(
                "the query heads `{hq}` = {nh} must be a multiple of the KV heads `{kvh}` = {nkv} \
                 (each KV head serves a whole group of query heads)"
            ),
        );
    }
    Ok(AttentionSpec {
        kind,
        q: q.tensor.to_string(),
        k: k.tensor.to_string(),
        v: v.tensor.to_string(),
        o: out.tensor.to_string(),
        tokens: t.to_string(),
        heads: hq.to_string(),
        kv_heads: kvh.to_string(),
        head_dim: d.to_string(),
        seq: s.to_string(),
        q_prescaled: q_decl.prescaled.is_some(),
        softmax: softmax.map_or(SoftmaxMode::Online, |s| s.mode),
    })
}

fn check_axis_list(scope: &Scope, axes: &[&Ident], statement: &str) -> syn::Result<Vec<String>> {
    let mut out: Vec<String> = Vec::new();
    for axis in axes {
        scope.require_axis(axis, &format!("in `{statement}`"))?;
        if out.iter().any(|a| *axis == a) {
            return fail(
                axis.span(),
                format!("axis `{axis}` is listed twice in `{statement}`"),
            );
        }
        out.push(axis.to_string());
    }
    Ok(out)
}
