//! A tensor's IR layout as run-time address arithmetic: the packed element
//! position of a logical index, `Σ coord·stride` over the layout's dims
//! (see `tessera_dsl::quant::pack`), with each logical axis contributing
//! `i·stride` (whole) or `(i / t)·outer + (i % t)·inner` (tiled). Strides
//! are cranelift values computed once in the prologue from the call's
//! extents; a stride that is a compile-time constant is also known as one,
//! so emitters can pick contiguous vector loads.

use cranelift_codegen::ir::{InstBuilder, Value};
use tessera_dsl::ir::{Kernel, LayoutDim};

use super::build::Fb;
use crate::artifact::EmitError;

/// How one logical axis contributes to the packed position.
#[derive(Clone, Copy, Debug)]
pub(crate) enum AxisAddr {
    Whole {
        stride: Value,
        stride_const: Option<i64>,
    },
    Tiled {
        tile: i64,
        outer: Value,
        outer_const: Option<i64>,
        inner: Value,
        inner_const: Option<i64>,
    },
}

impl AxisAddr {
    /// Position contribution of index `i`.
    pub(crate) fn at(&self, fb: &mut Fb<'_>, i: Value) -> Value {
        let times = |fb: &mut Fb<'_>, x: Value, v: Value, c: Option<i64>| match c {
            Some(c) => fb.mul_c(x, c),
            None => fb.b.ins().imul(x, v),
        };
        match *self {
            AxisAddr::Whole {
                stride,
                stride_const,
            } => times(fb, i, stride, stride_const),
            AxisAddr::Tiled {
                tile,
                outer,
                outer_const,
                inner,
                inner_const,
            } => {
                if tile == 1 {
                    return times(fb, i, outer, outer_const);
                }
                let q = fb.udiv_c(i, tile);
                let r = fb.urem_c(i, tile);
                let a = times(fb, q, outer, outer_const);
                let c = times(fb, r, inner, inner_const);
                fb.b.ins().iadd(a, c)
            }
        }
    }

    /// Contribution of index `t0 + j` where `t0` is a multiple of the tile
    /// (or any index for a whole axis): `(base, step)` with position
    /// `base + j·step`, step as a constant when known.
    pub(crate) fn tile_start(&self, fb: &mut Fb<'_>, t0: Value) -> (Value, Value, Option<i64>) {
        match *self {
            AxisAddr::Whole {
                stride,
                stride_const,
            } => (fb.b.ins().imul(t0, stride), stride, stride_const),
            AxisAddr::Tiled {
                tile,
                outer,
                inner,
                inner_const,
                ..
            } => {
                let q = fb.udiv_c(t0, tile);
                (fb.b.ins().imul(q, outer), inner, inner_const)
            }
        }
    }

    /// `Some((stride, stride as a constant if known))` when index `i`
    /// sits at `i·stride` (a whole axis, or a tile of 1), so a loop over
    /// the axis can advance a pointer instead of recomputing the position.
    pub(crate) fn linear(&self) -> Option<(Value, Option<i64>)> {
        match *self {
            AxisAddr::Whole {
                stride,
                stride_const,
            } => Some((stride, stride_const)),
            AxisAddr::Tiled {
                tile: 1,
                outer,
                outer_const,
                ..
            } => Some((outer, outer_const)),
            AxisAddr::Tiled { .. } => None,
        }
    }

    /// The position step between consecutive indices inside a tile (or of
    /// a whole axis), when it is a compile-time constant.
    pub(crate) fn step_const(&self) -> Option<i64> {
        match *self {
            AxisAddr::Whole { stride_const, .. } => stride_const,
            AxisAddr::Tiled { inner_const, .. } => inner_const,
        }
    }

    pub(crate) fn is_whole(&self) -> bool {
        matches!(self, AxisAddr::Whole { .. })
    }
}

/// Per logical dim of `tensor`, in the tensor's dim order, its address
/// contribution; `extents` gives every dim's run-time extent, `tiles` the
/// size of every tile variable.
pub(crate) fn tensor_addr(
    fb: &mut Fb<'_>,
    kernel: &Kernel,
    tensor: &str,
    extents: &[(&str, Value)],
    tiles: &[(&str, i64)],
) -> Result<Vec<(String, AxisAddr)>, EmitError> {
    let bad = |why: String| EmitError::Unsupported {
        backend: "host",
        what: format!("layout of tensor `{tensor}`: {why}"),
    };
    let t = kernel
        .tensor(tensor)
        .ok_or_else(|| bad("no such tensor".into()))?;
    let extent = |axis: &str| {
        extents
            .iter()
            .find(|(n, _)| *n == axis)
            .map(|&(_, v)| v)
            .ok_or_else(|| bad(format!("no extent for axis `{axis}`")))
    };
    let tile_of = |name: &str| -> Result<(String, i64), EmitError> {
        let tv = kernel
            .tile(name)
            .ok_or_else(|| bad(format!("unknown tile `{name}`")))?;
        let size = tiles
            .iter()
            .find(|(n, _)| *n == name)
            .map(|&(_, s)| s)
            .ok_or_else(|| bad(format!("no size for tile `{name}`")))?;
        Ok((tv.axis.clone(), size))
    };
    // (axis, part: 0 whole / 1 outer / 2 inner, size value, size const)
    let mut parts = Vec::new();
    for d in &t.layout.dims {
        match d {
            LayoutDim::Whole(a) => parts.push((a.clone(), 0, extent(a)?, None)),
            LayoutDim::Outer { axis, tile } => {
                let (_, size) = tile_of(tile)?;
                let e = extent(axis)?;
                let n = fb.div_ceil(e, size);
                parts.push((axis.clone(), 1, n, None));
            }
            LayoutDim::Inner { tile } => {
                let (axis, size) = tile_of(tile)?;
                let v = fb.i64c(size);
                parts.push((axis, 2, v, Some(size)));
            }
        }
    }
    let mut strides = vec![(fb.i64c(1), Some(1i64)); parts.len()];
    let mut acc = (fb.i64c(1), Some(1i64));
    for k in (0..parts.len()).rev() {
        strides[k] = acc;
        let (ref _a, _, size, size_c) = parts[k];
        let v = fb.b.ins().imul(acc.0, size);
        let c = match (acc.1, size_c) {
            (Some(a), Some(b)) => Some(a * b),
            _ => None,
        };
        acc = (v, c);
    }
    let mut out = Vec::new();
    for dim in &t.dims {
        let find = |part: i32| {
            parts
                .iter()
                .zip(&strides)
                .find(|((a, p, _, _), _)| a == dim && *p == part)
                .map(|(_, s)| *s)
        };
        let addr = if let Some((stride, stride_const)) = find(0) {
            AxisAddr::Whole {
                stride,
                stride_const,
            }
        } else {
            let (outer, outer_const) =
                find(1).ok_or_else(|| bad(format!("axis `{dim}` not covered")))?;
            let (inner, inner_const) =
                find(2).ok_or_else(|| bad(format!("axis `{dim}` not covered")))?;
            let tile = t
                .layout
                .dims
                .iter()
                .find_map(|d| match d {
                    LayoutDim::Outer { axis, tile } if axis == dim => Some(tile.clone()),
                    _ => None,
                })
                .ok_or_else(|| bad(format!("axis `{dim}` has no tile")))?;
            let (_, size) = tile_of(&tile)?;
            AxisAddr::Tiled {
                tile: size,
                outer,
                outer_const,
                inner,
                inner_const,
            }
        };
        out.push((dim.clone(), addr));
    }
    Ok(out)
}

/// The address contribution of `axis` in a [`tensor_addr`] result.
pub(crate) fn axis<'a>(
    addr: &'a [(String, AxisAddr)],
    axis: &str,
) -> Result<&'a AxisAddr, EmitError> {
    addr.iter()
        .find(|(n, _)| n == axis)
        .map(|(_, a)| a)
        .ok_or_else(|| EmitError::Unsupported {
            backend: "host",
            what: format!("axis `{axis}` missing from a layout"),
        })
}
