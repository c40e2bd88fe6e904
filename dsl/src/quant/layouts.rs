//! The concrete layouts the kernels read, as [`PackPlan`]s: activations
//! `[e/ep, l/lp, ep, lp]`, CPU weights `[h/hp, l/lp, hp, lp]` (4-bit codes
//! pair-transposed, seed 000 IV.D), GPU weights `[l/lp, h, lp]` (MNN-LLM 5.1,
//! lp = 32 so one 128-bit load fetches a row's 32 4-bit codes or 16 bytes of
//! 8-bit codes), and the per-group parameters in the order the kernels read
//! them.
//!
//! Parameters (scales, offsets) are f32 values `[rows, groups]` logically
//! (as in [`QuantTensor`]); packed they are f32 in one of the
//! [`ParamOrder`]s, padding rows 0.0. CPU weights use `RowTiled { tile: hp }`
//! = `[h/hp, groups, hp]`: the kernel walking one `hp`-row panel along `l`
//! finds the `hp` scales of group `g` contiguous, next to those of `g + 1`.
//! GPU weights use `GroupMajor` = `[groups, h]`: a work item per output
//! channel walking `l` reads, per group, one value from a row shared by
//! neighbouring work items (coalesced).

use super::pack::{ElemWidth, PackPlan, Tile};
use super::{QuantError, QuantTensor, groups_per_row};
use crate::ir::{Format, Layout, LayoutDim};

/// `[e/ep, l/lp, ep, lp]` over dims `(e, l)`, tiles `ep`, `lp`.
pub fn activation_layout() -> Layout {
    Layout {
        dims: vec![
            LayoutDim::outer("e", "ep"),
            LayoutDim::outer("l", "lp"),
            LayoutDim::inner("ep"),
            LayoutDim::inner("lp"),
        ],
        int4_pair_transpose: false,
        int4_signed_codes: false,
    }
}

/// `[h/hp, l/lp, hp, lp]` over dims `(h, l)`, tiles `hp`, `lp`.
pub fn weight_layout(int4_pair_transpose: bool) -> Layout {
    Layout {
        dims: vec![
            LayoutDim::outer("h", "hp"),
            LayoutDim::outer("l", "lp"),
            LayoutDim::inner("hp"),
            LayoutDim::inner("lp"),
        ],
        int4_pair_transpose,
        int4_signed_codes: false,
    }
}

/// `[l/lp, h, lp]` over dims `(h, l)`, tile `lp` (MNN-LLM 5.1).
pub fn gpu_weight_layout() -> Layout {
    Layout {
        dims: vec![
            LayoutDim::outer("l", "lp"),
            LayoutDim::whole("h"),
            LayoutDim::inner("lp"),
        ],
        int4_pair_transpose: false,
        int4_signed_codes: false,
    }
}

/// Pack activations `[e, l]` (logical bytes as [`PackPlan::pack`] takes
/// them) into `[e/ep, l/lp, ep, lp]`.
pub fn pack_activations(
    elem: ElemWidth,
    e: usize,
    l: usize,
    ep: usize,
    lp: usize,
    logical: &[u8],
) -> Result<Vec<u8>, QuantError> {
    activation_plan(elem, e, l, ep, lp)?.pack(logical)
}

/// The plan behind [`pack_activations`].
pub fn activation_plan(
    elem: ElemWidth,
    e: usize,
    l: usize,
    ep: usize,
    lp: usize,
) -> Result<PackPlan, QuantError> {
    PackPlan::new(
        &activation_layout(),
        &[("e", e), ("l", l)],
        &[Tile::new("ep", "e", ep), Tile::new("lp", "l", lp)],
        elem,
    )
}

/// Order of packed per-group parameters (logical `[rows, groups]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamOrder {
    /// `[rows, groups]`, as in [`QuantTensor`].
    RowMajor,
    /// `[rows/tile, groups, tile]`, rows padded with 0.0 to whole tiles.
    RowTiled { tile: usize },
    /// `[groups, rows]`.
    GroupMajor,
}

fn param_plan(rows: usize, groups: usize, order: ParamOrder) -> Result<PackPlan, QuantError> {
    let (layout, tiles) = match order {
        ParamOrder::RowMajor => (Layout::row_major(&["r", "g"]), vec![]),
        ParamOrder::RowTiled { tile } => (
            Layout {
                dims: vec![
                    LayoutDim::outer("r", "rt"),
                    LayoutDim::whole("g"),
                    LayoutDim::inner("rt"),
                ],
                int4_pair_transpose: false,
                int4_signed_codes: false,
            },
            vec![Tile::new("rt", "r", tile)],
        ),
        ParamOrder::GroupMajor => (Layout::row_major(&["g", "r"]), vec![]),
    };
    PackPlan::new(
        &layout,
        &[("r", rows), ("g", groups)],
        &tiles,
        ElemWidth::B32,
    )
}

/// Reorder `[rows, groups]` parameters into `order`.
pub fn pack_params(
    values: &[f32],
    rows: usize,
    groups: usize,
    order: ParamOrder,
) -> Result<Vec<f32>, QuantError> {
    let plan = param_plan(rows, groups, order)?;
    check_len("params", plan.logical_elems(), values.len())?;
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    Ok(f32s(&plan.pack(&bytes)?))
}

/// Inverse of [`pack_params`].
pub fn unpack_params(
    packed: &[f32],
    rows: usize,
    groups: usize,
    order: ParamOrder,
) -> Result<Vec<f32>, QuantError> {
    let plan = param_plan(rows, groups, order)?;
    check_len("packed params", plan.packed_elems(), packed.len())?;
    let bytes: Vec<u8> = packed.iter().flat_map(|v| v.to_le_bytes()).collect();
    Ok(f32s(&plan.unpack(&bytes)?))
}

fn check_len(what: &'static str, expected: usize, got: usize) -> Result<(), QuantError> {
    if expected == got {
        Ok(())
    } else {
        Err(QuantError::Length {
            what,
            expected,
            got,
        })
    }
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Which kernel layout a [`PackedWeights`] is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightPacking {
    /// Codes `[h/hp, l/lp, hp, lp]` (pair-transposed if 4-bit), params
    /// `[h/hp, groups, hp]`.
    Cpu { hp: usize, lp: usize },
    /// Codes `[l/lp, h, lp]`, params `[groups, h]`.
    Gpu { lp: usize },
}

/// A weight tensor packed for a kernel: codes in the kernel's layout and
/// its parameters in the matching [`ParamOrder`].
#[derive(Clone, Debug, PartialEq)]
pub struct PackedWeights {
    pub format: Format,
    /// Output channels `h` (the tensor's rows).
    pub h: usize,
    /// Reduction length `l` (the tensor's columns).
    pub l: usize,
    pub packing: WeightPacking,
    pub codes: Vec<u8>,
    pub scales: Vec<f32>,
    /// Empty for symmetric and fp8 formats.
    pub offsets: Vec<f32>,
}

impl WeightPacking {
    fn plans(
        self,
        format: Format,
        h: usize,
        l: usize,
    ) -> Result<(PackPlan, ParamOrder), QuantError> {
        let elem = ElemWidth::of_format(format);
        let dims = [("h", h), ("l", l)];
        match self {
            WeightPacking::Cpu { hp, lp } => Ok((
                PackPlan::new(
                    &weight_layout(elem == ElemWidth::B4),
                    &dims,
                    &[Tile::new("hp", "h", hp), Tile::new("lp", "l", lp)],
                    elem,
                )?,
                ParamOrder::RowTiled { tile: hp },
            )),
            WeightPacking::Gpu { lp } => Ok((
                PackPlan::new(
                    &gpu_weight_layout(),
                    &dims,
                    &[Tile::new("lp", "l", lp)],
                    elem,
                )?,
                ParamOrder::GroupMajor,
            )),
        }
    }
}

/// Pack a validated weight tensor (`rows` = h, `cols` = l) for `packing`.
/// 4-bit CPU weights are pair-transposed, which needs `hp·lp` to be a
/// multiple of 32.
pub fn pack_weights(t: &QuantTensor, packing: WeightPacking) -> Result<PackedWeights, QuantError> {
    t.validate()?;
    let (plan, order) = packing.plans(t.format, t.rows, t.cols)?;
    let groups = t.groups_per_row();
    let params = |v: &[f32]| {
        if v.is_empty() {
            Ok(Vec::new())
        } else {
            pack_params(v, t.rows, groups, order)
        }
    };
    Ok(PackedWeights {
        format: t.format,
        h: t.rows,
        l: t.cols,
        packing,
        codes: plan.pack(&t.codes)?,
        scales: params(&t.scales)?,
        offsets: params(&t.offsets)?,
    })
}

impl PackedWeights {
    /// Back to the logical [`QuantTensor`] (validated).
    pub fn unpack(&self) -> Result<QuantTensor, QuantError> {
        let (plan, order) = self.packing.plans(self.format, self.h, self.l)?;
        let groups = match self.format.group() {
            Some(g) => groups_per_row(g, self.l),
            None => 0,
        };
        let params = |v: &[f32]| {
            if v.is_empty() {
                Ok(Vec::new())
            } else {
                unpack_params(v, self.h, groups, order)
            }
        };
        let t = QuantTensor {
            format: self.format,
            rows: self.h,
            cols: self.l,
            codes: plan.unpack(&self.codes)?,
            scales: params(&self.scales)?,
            offsets: params(&self.offsets)?,
        };
        t.validate()?;
        Ok(t)
    }
}
