//! `verify()`: rejects inconsistent kernels with an error naming the axis,
//! tensor or attribute at fault. Never panics.
//!
//! What a valid kernel is:
//!
//! - Names: axes, tiles and tensors are identifiers (`[A-Za-z_][A-Za-z0-9_]*`),
//!   the kernel name may also contain `-`. Axis and tile names share one
//!   namespace (a bare name in a layout is a whole axis or a tile's inner
//!   part); tensor names are unique among tensors.
//! - Extents and tile sizes are never `0`; at most one tile per axis.
//! - A layout permutes exactly its tensor's dims: each dim appears either
//!   whole, or as `axis/tile` plus `tile` with the tile belonging to that axis.
//!   `pair-transpose` only on 4-bit formats, `signed-codes` only on `u4sym`
//!   (the implied zero point 8). Group sizes are multiples of 4.
//! - Matmul `y[e, h] = Σ_l x[e, l] · w[h, l]`: roles x Input, w Weight,
//!   y Output; `e`, `h` Spatial, `l` Reduce. x is f32/f16/bf16/i8dyn, w any
//!   weight format (not i8dyn or fp8), y f32/f16/bf16. The epilogue scales
//!   iff an operand is quantized and has a zero-point iff w is asymmetric; a
//!   bias is an Input `[h]` in f32/f16/bf16.
//! - Attention `o[t, hq, d] = softmax_s(q[t, hq, d] · k[s, kvh, d]) · v[s, kvh, d]`:
//!   `t`, `hq`, `kvh`, `d` are Spatial (they index outputs or select a cache
//!   head; `d` is contracted in q·k but indexes o), `s` is Reduce (softmax and
//!   the weighted sum run over it). q Input, k/v Cache with `s` outermost in
//!   their layout (appends stay in place), o Output. q and o are
//!   f32/f16/bf16; k f32/f16/bf16 or per-token asymmetric `i8asym:row` /
//!   `u4asym:row`; v f32/f16/bf16, fp8 or `i8asym:row`. Decode has one (or a
//!   dyn number of) query tokens; async softmax needs a finite `phi` and
//!   `lo < hi`; fixed heads are a multiple of fixed kv heads.
//! - An op's axis slots name distinct axes (matmul `e` ≠ `h`; attention
//!   `t`, `hq`, `kvh`, `d` pairwise) and attention's k and v are different
//!   tensors. Tensors the op does not use get only the generic checks.
//! - Schedule axes exist, appear once per list; `split` is a reduce axis and
//!   `parallel` never is.

use crate::ir::*;

/// Why a kernel is inconsistent.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error("kernel has no operation (matmul or attention)")]
    MissingOp,
    #[error("invalid {what} name '{name}'")]
    InvalidName { what: &'static str, name: String },
    #[error("duplicate {what} name '{name}'")]
    DuplicateName { what: &'static str, name: String },
    #[error("name '{name}' is used by both an axis and a tile")]
    AxisTileClash { name: String },
    #[error("{user} refers to unknown axis '{axis}'")]
    UnknownAxis { user: AxisUser, axis: String },
    #[error("axis '{axis}' has extent 0")]
    ZeroExtent { axis: String },
    #[error("tile '{tile}' has size 0")]
    ZeroTile { tile: String },
    #[error("axis '{axis}' has two tiles, '{first}' and '{second}'")]
    DuplicateTile {
        axis: String,
        first: String,
        second: String,
    },
    #[error("tensor '{tensor}' lists axis '{axis}' twice")]
    RepeatedTensorDim { tensor: String, axis: String },
    #[error("layout of '{tensor}' uses unknown tile '{tile}'")]
    LayoutUnknownTile { tensor: String, tile: String },
    #[error("layout of '{tensor}': tile '{tile}' belongs to axis '{tile_axis}', not '{axis}'")]
    LayoutTileAxis {
        tensor: String,
        tile: String,
        tile_axis: String,
        axis: String,
    },
    #[error("layout of '{tensor}' uses '{name}', which is not one of its dims")]
    LayoutForeignDim { tensor: String, name: String },
    #[error(
        "layout of '{tensor}' has inner tile '{tile}' without its outer '{axis}/{tile}' (or the reverse)"
    )]
    LayoutUnpairedTile {
        tensor: String,
        tile: String,
        axis: String,
    },
    #[error("layout of '{tensor}' is missing dim '{axis}'")]
    LayoutMissingDim { tensor: String, axis: String },
    #[error("layout of '{tensor}' repeats dim '{axis}'")]
    LayoutRepeatedDim { tensor: String, axis: String },
    #[error("tensor '{tensor}': pair-transpose needs a 4-bit format, not {format}")]
    PairTransposeFormat { tensor: String, format: Format },
    #[error(
        "tensor '{tensor}': signed-codes stores q - 8 for the implied zero point 8, so it needs u4sym, not {format}"
    )]
    SignedCodesFormat { tensor: String, format: Format },
    #[error("tensor '{tensor}': group size of {format} must be a multiple of 4 and at least 4")]
    GroupSize { tensor: String, format: Format },
    #[error("{op} operand {operand} refers to unknown tensor '{tensor}'")]
    UnknownTensor {
        op: &'static str,
        operand: &'static str,
        tensor: String,
    },
    #[error("{op} operands {first} and {second} are the same tensor '{tensor}'")]
    SameTensor {
        op: &'static str,
        first: &'static str,
        second: &'static str,
        tensor: String,
    },
    #[error("{op} axes {first} and {second} are the same axis '{axis}'")]
    SameAxis {
        op: &'static str,
        first: &'static str,
        second: &'static str,
        axis: String,
    },
    #[error("{op} operand {operand} '{tensor}' must have dims [{}], not [{}]", expected.join(", "), got.join(", "))]
    OperandDims {
        op: &'static str,
        operand: &'static str,
        tensor: String,
        expected: Vec<String>,
        got: Vec<String>,
    },
    #[error("{op} operand {operand} '{tensor}' must have role {expected:?}, not {got:?}")]
    OperandRole {
        op: &'static str,
        operand: &'static str,
        tensor: String,
        expected: Role,
        got: Role,
    },
    #[error("{op} operand {operand} '{tensor}' cannot have format {format} (allowed: {allowed})")]
    OperandFormat {
        op: &'static str,
        operand: &'static str,
        tensor: String,
        format: Format,
        allowed: &'static str,
    },
    #[error("{op} axis {role} '{axis}' must be a {expected:?} axis")]
    AxisKind {
        op: &'static str,
        role: &'static str,
        axis: String,
        expected: AxisKind,
    },
    #[error("tensor '{tensor}' has quantized format {format} but the epilogue has no scale")]
    MissingScale { tensor: String, format: Format },
    #[error("epilogue has a scale but no operand is quantized")]
    UnexpectedScale,
    #[error("weight '{tensor}' has asymmetric format {format} but the epilogue has no zero-point")]
    MissingZeroPoint { tensor: String, format: Format },
    #[error("epilogue has a zero-point but weight '{tensor}' has symmetric format {format}")]
    UnexpectedZeroPoint { tensor: String, format: Format },
    #[error("cache '{tensor}' must have the sequence axis '{seq}' outermost in its layout")]
    CacheSeqNotOutermost { tensor: String, seq: String },
    #[error("decode attention needs tokens axis '{axis}' of extent 1 or dyn, not {extent}")]
    DecodeTokens { axis: String, extent: u32 },
    #[error("async softmax needs a finite phi, not {phi}")]
    SoftmaxPhi { phi: String },
    #[error("async softmax needs lo < hi, got lo = {lo}, hi = {hi}")]
    SoftmaxBounds { lo: String, hi: String },
    #[error(
        "heads axis '{heads}' ({heads_extent}) is not a multiple of kv_heads axis '{kv_heads}' ({kv_extent})"
    )]
    HeadsNotMultiple {
        heads: String,
        heads_extent: u32,
        kv_heads: String,
        kv_extent: u32,
    },
    #[error("schedule {list} lists axis '{axis}' twice")]
    RepeatedScheduleAxis { list: &'static str, axis: String },
    #[error("split axis '{axis}' must be a reduce axis")]
    SplitNotReduce { axis: String },
    /// Threads writing the same outputs while each sums part of the
    /// reduction would race; `split` is the schedule that combines them.
    #[error(
        "parallel axis '{axis}' is reduced: threads would race on the same outputs (use `split {axis}` to divide a reduction)"
    )]
    ParallelReduce { axis: String },
}

/// What refers to an axis, for [`VerifyError::UnknownAxis`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AxisUser {
    Tile(String),
    Tensor(String),
    /// An op's axis slot, e.g. matmul `l`.
    Op {
        op: &'static str,
        role: &'static str,
    },
    /// A schedule list: `parallel`, `double-buffer` or `split`.
    Schedule(&'static str),
}

impl std::fmt::Display for AxisUser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AxisUser::Tile(t) => write!(f, "tile '{t}'"),
            AxisUser::Tensor(t) => write!(f, "tensor '{t}'"),
            AxisUser::Op { op, role } => write!(f, "{op} axis {role}"),
            AxisUser::Schedule(list) => write!(f, "schedule {list}"),
        }
    }
}

/// Is `s` an identifier `[A-Za-z_][A-Za-z0-9_]*`?
pub fn is_ident(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Is `s` a kernel name: an identifier that may also contain `-`?
pub fn is_kernel_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// Check a kernel for consistency.
pub fn verify(kernel: &Kernel) -> Result<(), VerifyError> {
    check_names(kernel)?;
    check_axes_and_tiles(kernel)?;
    for t in &kernel.tensors {
        check_tensor(kernel, t)?;
    }
    match &kernel.op {
        Op::Matmul(m) => check_matmul(kernel, m)?,
        Op::Attention(a) => check_attention(kernel, a)?,
    }
    check_schedule(kernel)
}

fn check_names(k: &Kernel) -> Result<(), VerifyError> {
    if !is_kernel_name(&k.name) {
        return Err(VerifyError::InvalidName {
            what: "kernel",
            name: k.name.clone(),
        });
    }
    let groups: [(&'static str, Vec<&str>); 3] = [
        ("axis", k.axes.iter().map(|a| a.name.as_str()).collect()),
        (
            "tile",
            k.schedule.tiles.iter().map(|t| t.name.as_str()).collect(),
        ),
        (
            "tensor",
            k.tensors.iter().map(|t| t.name.as_str()).collect(),
        ),
    ];
    for (what, names) in &groups {
        for (i, name) in names.iter().enumerate() {
            if !is_ident(name) {
                return Err(VerifyError::InvalidName {
                    what,
                    name: name.to_string(),
                });
            }
            if names[..i].contains(name) {
                return Err(VerifyError::DuplicateName {
                    what,
                    name: name.to_string(),
                });
            }
        }
    }
    for t in &k.schedule.tiles {
        if k.axis(&t.name).is_some() {
            return Err(VerifyError::AxisTileClash {
                name: t.name.clone(),
            });
        }
    }
    Ok(())
}

fn check_axes_and_tiles(k: &Kernel) -> Result<(), VerifyError> {
    for a in &k.axes {
        if a.extent == Extent::Fixed(0) {
            return Err(VerifyError::ZeroExtent {
                axis: a.name.clone(),
            });
        }
    }
    for (i, t) in k.schedule.tiles.iter().enumerate() {
        if k.axis(&t.axis).is_none() {
            return Err(VerifyError::UnknownAxis {
                user: AxisUser::Tile(t.name.clone()),
                axis: t.axis.clone(),
            });
        }
        if t.size == TileSize::Fixed(0) {
            return Err(VerifyError::ZeroTile {
                tile: t.name.clone(),
            });
        }
        if let Some(first) = k.schedule.tiles[..i].iter().find(|o| o.axis == t.axis) {
            return Err(VerifyError::DuplicateTile {
                axis: t.axis.clone(),
                first: first.name.clone(),
                second: t.name.clone(),
            });
        }
    }
    Ok(())
}

fn check_tensor(k: &Kernel, t: &Tensor) -> Result<(), VerifyError> {
    for (i, d) in t.dims.iter().enumerate() {
        if k.axis(d).is_none() {
            return Err(VerifyError::UnknownAxis {
                user: AxisUser::Tensor(t.name.clone()),
                axis: d.clone(),
            });
        }
        if t.dims[..i].contains(d) {
            return Err(VerifyError::RepeatedTensorDim {
                tensor: t.name.clone(),
                axis: d.clone(),
            });
        }
    }
    check_layout(k, t)?;
    if t.layout.int4_pair_transpose && t.format.bits() != 4 {
        return Err(VerifyError::PairTransposeFormat {
            tensor: t.name.clone(),
            format: t.format,
        });
    }
    if t.layout.int4_signed_codes && !matches!(t.format, Format::U4Sym(..)) {
        return Err(VerifyError::SignedCodesFormat {
            tensor: t.name.clone(),
            format: t.format,
        });
    }
    if let Some(Group::Size(n)) = t.format.group()
        && (n < 4 || n % 4 != 0)
    {
        return Err(VerifyError::GroupSize {
            tensor: t.name.clone(),
            format: t.format,
        });
    }
    Ok(())
}

/// How one tensor dim appears in a layout.
#[derive(Default)]
struct DimUse<'a> {
    whole: usize,
    outer: Vec<&'a str>,
    inner: Vec<&'a str>,
}

fn check_layout(k: &Kernel, t: &Tensor) -> Result<(), VerifyError> {
    let tensor = || t.name.clone();
    let mut uses: Vec<DimUse> = t.dims.iter().map(|_| DimUse::default()).collect();
    let slot = |axis: &str| t.dims.iter().position(|d| d == axis);
    for dim in &t.layout.dims {
        match dim {
            LayoutDim::Whole(name) => {
                let Some(i) = slot(name) else {
                    if let Some(tv) = k.tile(name) {
                        return Err(VerifyError::LayoutUnpairedTile {
                            tensor: tensor(),
                            tile: name.clone(),
                            axis: tv.axis.clone(),
                        });
                    }
                    return Err(VerifyError::LayoutForeignDim {
                        tensor: tensor(),
                        name: name.clone(),
                    });
                };
                uses[i].whole += 1;
            }
            LayoutDim::Outer { axis, tile } => {
                let Some(tv) = k.tile(tile) else {
                    return Err(VerifyError::LayoutUnknownTile {
                        tensor: tensor(),
                        tile: tile.clone(),
                    });
                };
                if tv.axis != *axis {
                    return Err(VerifyError::LayoutTileAxis {
                        tensor: tensor(),
                        tile: tile.clone(),
                        tile_axis: tv.axis.clone(),
                        axis: axis.clone(),
                    });
                }
                let Some(i) = slot(axis) else {
                    return Err(VerifyError::LayoutForeignDim {
                        tensor: tensor(),
                        name: axis.clone(),
                    });
                };
                uses[i].outer.push(tile);
            }
            LayoutDim::Inner { tile } => {
                let Some(tv) = k.tile(tile) else {
                    return Err(VerifyError::LayoutUnknownTile {
                        tensor: tensor(),
                        tile: tile.clone(),
                    });
                };
                let Some(i) = slot(&tv.axis) else {
                    return Err(VerifyError::LayoutForeignDim {
                        tensor: tensor(),
                        name: tile.clone(),
                    });
                };
                uses[i].inner.push(tile);
            }
        }
    }
    for (axis, u) in t.dims.iter().zip(&uses) {
        let count = u.whole + u.outer.len().max(u.inner.len());
        if count == 0 {
            return Err(VerifyError::LayoutMissingDim {
                tensor: tensor(),
                axis: axis.clone(),
            });
        }
        if count > 1 || u.outer.len() > 1 || u.inner.len() > 1 {
            return Err(VerifyError::LayoutRepeatedDim {
                tensor: tensor(),
                axis: axis.clone(),
            });
        }
        if u.outer.len() != u.inner.len() {
            let tile = u.outer.first().or(u.inner.first()).copied().unwrap_or("");
            return Err(VerifyError::LayoutUnpairedTile {
                tensor: tensor(),
                tile: tile.to_string(),
                axis: axis.clone(),
            });
        }
    }
    Ok(())
}

const FLOAT_OUT: &str = "f32, f16, bf16";
const MATMUL_X: &str = "f32, f16, bf16, i8dyn";
const MATMUL_W: &str = "f32, f16, bf16, u4asym, i8sym, i8asym, e0m4";
const ATTN_K: &str = "f32, f16, bf16, i8asym:row, u4asym:row";
const ATTN_V: &str = "f32, f16, bf16, fp8e4m3, fp8e5m2, i8asym:row";

fn is_plain_float(f: Format) -> bool {
    matches!(f, Format::F32 | Format::F16 | Format::BF16)
}

/// Look up an operand and check its role and dims.
fn operand<'k>(
    k: &'k Kernel,
    op: &'static str,
    operand: &'static str,
    name: &str,
    role: Role,
    dims: &[&str],
) -> Result<&'k Tensor, VerifyError> {
    let t = k.tensor(name).ok_or_else(|| VerifyError::UnknownTensor {
        op,
        operand,
        tensor: name.to_string(),
    })?;
    if t.role != role {
        return Err(VerifyError::OperandRole {
            op,
            operand,
            tensor: t.name.clone(),
            expected: role,
            got: t.role,
        });
    }
    if t.dims.iter().map(String::as_str).ne(dims.iter().copied()) {
        return Err(VerifyError::OperandDims {
            op,
            operand,
            tensor: t.name.clone(),
            expected: dims.iter().map(|d| d.to_string()).collect(),
            got: t.dims.clone(),
        });
    }
    Ok(t)
}

fn operand_format(
    op: &'static str,
    operand: &'static str,
    t: &Tensor,
    ok: bool,
    allowed: &'static str,
) -> Result<(), VerifyError> {
    if ok {
        Ok(())
    } else {
        Err(VerifyError::OperandFormat {
            op,
            operand,
            tensor: t.name.clone(),
            format: t.format,
            allowed,
        })
    }
}

/// Check that an op's axis exists and has the expected kind.
fn op_axis(
    k: &Kernel,
    op: &'static str,
    role: &'static str,
    name: &str,
    expected: AxisKind,
) -> Result<(), VerifyError> {
    let a = k.axis(name).ok_or_else(|| VerifyError::UnknownAxis {
        user: AxisUser::Op { op, role },
        axis: name.to_string(),
    })?;
    if a.kind != expected {
        return Err(VerifyError::AxisKind {
            op,
            role,
            axis: name.to_string(),
            expected,
        });
    }
    Ok(())
}

/// Reject two op slots naming the same thing.
fn distinct(
    op: &'static str,
    items: &[(&'static str, &str)],
    axes: bool,
) -> Result<(), VerifyError> {
    for (i, (first, a)) in items.iter().enumerate() {
        if let Some((second, _)) = items[i + 1..].iter().find(|(_, b)| a == b) {
            return Err(if axes {
                VerifyError::SameAxis {
                    op,
                    first,
                    second,
                    axis: a.to_string(),
                }
            } else {
                VerifyError::SameTensor {
                    op,
                    first,
                    second,
                    tensor: a.to_string(),
                }
            });
        }
    }
    Ok(())
}

/// Matmul: x in {f32, f16, bf16, i8dyn}; w any weight format; y a plain
/// float; the epilogue scales iff an operand is quantized and corrects the
/// zero point iff w is asymmetric; bias is an Input `[h]` in a plain float.
fn check_matmul(k: &Kernel, m: &Matmul) -> Result<(), VerifyError> {
    const OP: &str = "matmul";
    op_axis(k, OP, "e", &m.e, AxisKind::Spatial)?;
    op_axis(k, OP, "h", &m.h, AxisKind::Spatial)?;
    op_axis(k, OP, "l", &m.l, AxisKind::Reduce)?;
    distinct(OP, &[("e", &m.e), ("h", &m.h)], true)?;
    let (e, h, l) = (m.e.as_str(), m.h.as_str(), m.l.as_str());
    let x = operand(k, OP, "x", &m.x, Role::Input, &[e, l])?;
    let w = operand(k, OP, "w", &m.w, Role::Weight, &[h, l])?;
    let y = operand(k, OP, "y", &m.y, Role::Output, &[e, h])?;
    operand_format(
        OP,
        "x",
        x,
        is_plain_float(x.format) || x.format == Format::I8Dyn,
        MATMUL_X,
    )?;
    operand_format(
        OP,
        "w",
        w,
        !matches!(w.format, Format::I8Dyn | Format::Fp8E4M3 | Format::Fp8E5M2),
        MATMUL_W,
    )?;
    operand_format(OP, "y", y, is_plain_float(y.format), FLOAT_OUT)?;

    let ep = &m.epilogue;
    let quantized = [x, w].into_iter().find(|t| t.format.is_quantized());
    match (quantized, ep.scale) {
        (Some(t), false) => {
            return Err(VerifyError::MissingScale {
                tensor: t.name.clone(),
                format: t.format,
            });
        }
        (None, true) => return Err(VerifyError::UnexpectedScale),
        _ => {}
    }
    match (w.format.is_asymmetric(), ep.zero_point) {
        (true, false) => {
            return Err(VerifyError::MissingZeroPoint {
                tensor: w.name.clone(),
                format: w.format,
            });
        }
        (false, true) => {
            return Err(VerifyError::UnexpectedZeroPoint {
                tensor: w.name.clone(),
                format: w.format,
            });
        }
        _ => {}
    }
    if let Some(bias) = &ep.bias {
        let b = operand(k, OP, "bias", bias, Role::Input, &[h])?;
        operand_format(OP, "bias", b, is_plain_float(b.format), FLOAT_OUT)?;
    }
    Ok(())
}

/// Attention: see the module doc for roles and axis kinds; q a plain float,
/// k per-token asymmetric int (or float), v float/fp8/i8asym:row, o float.
fn check_attention(k: &Kernel, a: &Attention) -> Result<(), VerifyError> {
    const OP: &str = "attention";
    op_axis(k, OP, "tokens", &a.tokens, AxisKind::Spatial)?;
    op_axis(k, OP, "heads", &a.heads, AxisKind::Spatial)?;
    op_axis(k, OP, "kv_heads", &a.kv_heads, AxisKind::Spatial)?;
    op_axis(k, OP, "head_dim", &a.head_dim, AxisKind::Spatial)?;
    op_axis(k, OP, "seq", &a.seq, AxisKind::Reduce)?;
    distinct(
        OP,
        &[
            ("tokens", &a.tokens),
            ("heads", &a.heads),
            ("kv_heads", &a.kv_heads),
            ("head_dim", &a.head_dim),
        ],
        true,
    )?;
    distinct(OP, &[("k", &a.k), ("v", &a.v)], false)?;
    let (t, hq, kvh, d, s) = (
        a.tokens.as_str(),
        a.heads.as_str(),
        a.kv_heads.as_str(),
        a.head_dim.as_str(),
        a.seq.as_str(),
    );
    let q = operand(k, OP, "q", &a.q, Role::Input, &[t, hq, d])?;
    let kc = operand(k, OP, "k", &a.k, Role::Cache, &[s, kvh, d])?;
    let v = operand(k, OP, "v", &a.v, Role::Cache, &[s, kvh, d])?;
    let o = operand(k, OP, "o", &a.o, Role::Output, &[t, hq, d])?;
    operand_format(OP, "q", q, is_plain_float(q.format), FLOAT_OUT)?;
    operand_format(
        OP,
        "k",
        kc,
        is_plain_float(kc.format)
            || matches!(
                kc.format,
                Format::I8Asym(Group::Row, ParamType::F32)
                    | Format::U4Asym(Group::Row, ParamType::F32)
            ),
        ATTN_K,
    )?;
    operand_format(
        OP,
        "v",
        v,
        is_plain_float(v.format)
            || matches!(
                v.format,
                Format::Fp8E4M3 | Format::Fp8E5M2 | Format::I8Asym(Group::Row, ParamType::F32)
            ),
        ATTN_V,
    )?;
    operand_format(OP, "o", o, is_plain_float(o.format), FLOAT_OUT)?;
    for cache in [kc, v] {
        let outermost = match cache.layout.dims.first() {
            Some(LayoutDim::Whole(x)) => x == s,
            Some(LayoutDim::Outer { axis, .. }) => axis == s,
            _ => false,
        };
        if !outermost {
            return Err(VerifyError::CacheSeqNotOutermost {
                tensor: cache.name.clone(),
                seq: s.to_string(),
            });
        }
    }
    if a.kind == AttentionKind::Decode
        && let Some(Extent::Fixed(n)) = k.axis(t).map(|ax| ax.extent)
        && n != 1
    {
        return Err(VerifyError::DecodeTokens {
            axis: t.to_string(),
            extent: n,
        });
    }
    if let SoftmaxMode::Async { phi, lo, hi } = a.softmax {
        if !phi.is_finite() {
            return Err(VerifyError::SoftmaxPhi {
                phi: format!("{phi:?}"),
            });
        }
        if lo.partial_cmp(&hi) != Some(std::cmp::Ordering::Less) {
            return Err(VerifyError::SoftmaxBounds {
                lo: format!("{lo:?}"),
                hi: format!("{hi:?}"),
            });
        }
    }
    let extent = |name: &str| k.axis(name).map(|ax| ax.extent);
    if let (Some(Extent::Fixed(nh)), Some(Extent::Fixed(nkv))) = (extent(hq), extent(kvh))
        && nh % nkv != 0
    {
        return Err(VerifyError::HeadsNotMultiple {
            heads: hq.to_string(),
            heads_extent: nh,
            kv_heads: kvh.to_string(),
            kv_extent: nkv,
        });
    }
    Ok(())
}

fn check_schedule(k: &Kernel) -> Result<(), VerifyError> {
    let s = &k.schedule;
    let lists: [(&'static str, &[String]); 2] =
        [("parallel", &s.parallel), ("split", s.split.as_slice())];
    for (list, axes) in lists {
        for (i, axis) in axes.iter().enumerate() {
            if k.axis(axis).is_none() {
                return Err(VerifyError::UnknownAxis {
                    user: AxisUser::Schedule(list),
                    axis: axis.clone(),
                });
            }
            if axes[..i].contains(axis) {
                return Err(VerifyError::RepeatedScheduleAxis {
                    list,
                    axis: axis.clone(),
                });
            }
        }
    }
    if let Some(axis) = &s.split
        && k.axis(axis).map(|a| a.kind) != Some(AxisKind::Reduce)
    {
        return Err(VerifyError::SplitNotReduce { axis: axis.clone() });
    }
    if let Some(axis) = s
        .parallel
        .iter()
        .find(|axis| k.axis(axis).map(|a| a.kind) == Some(AxisKind::Reduce))
    {
        return Err(VerifyError::ParallelReduce { axis: axis.clone() });
    }
    Ok(())
}
