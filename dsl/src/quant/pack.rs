//! Packing a logical tensor into any memory [`Layout`] the IR can express,
//! and back.
//!
//! A [`PackPlan`] is built once from a layout, the tensor's logical dims
//! (with extents) and the sizes of the tile variables the layout uses; it
//! validates them together and then maps logical ↔ packed positions.
//!
//! **Positions.** A layout is a list of dims, outermost first. Each is the
//! whole axis `a` (size `n_a`), the tile count `a/t` (size `ceil(n_a / t)`)
//! or the in-tile position `t` (size `t`). Logical element `(i_0, i_1, ...)`
//! sits at packed position `p = Σ coord_k · stride_k`, row-major over the
//! layout dims, with coord `i_a` for a whole axis, `i_a / t` for `a/t` and
//! `i_a % t` for `t`. Tiled axes are thereby padded to whole tiles; padding
//! positions hold zero bytes (zero codes).
//!
//! **Bytes.** Logical input is row-major over the logical dims, one element
//! per [`ElemWidth::logical_bytes`] bytes: 4-bit codes one per byte in the
//! low nibble (as in [`super::QuantTensor::codes`]), wider elements as their
//! bytes, copied verbatim (so their endianness is the caller's). Packed
//! output places element `p`:
//!
//! * 8/16/32-bit: at bytes `[p·w, (p+1)·w)`, `w` the element's byte width.
//! * 4-bit, plain: in byte `p / 2`, low nibble if `p` is even, high nibble if
//!   odd (byte `j = code[2j] | code[2j+1] << 4`).
//! * 4-bit with `int4_pair_transpose` (seed 000 IV.D, the `[n, 16, 2] →
//!   [n, 2, 16]` reshape): every run of 32 positions `32b .. 32b+32` is 16
//!   bytes `16b .. 16b+16` with byte `16b + j = code[32b + j] |
//!   code[32b + j + 16] << 4`, so one `and` yields codes 0..16 of the run and
//!   one shift codes 16..32, already in order. The trailing in-tile dims of
//!   the layout (e.g. `hp, lp`) must hold a multiple of 32 codes so no run
//!   straddles two tile blocks, or exactly 16 inside a tile count (e.g.
//!   `l/lp`): then each run is two consecutive blocks of that count, which
//!   is padded to an even size (NEON's 12×4×4 `sdot` tile: one 16-byte
//!   load holds two lp-steps of 4 columns).
//!
//! * 4-bit with `int4_signed_codes`: each code q is stored as q XOR 8
//!   (q − 8 as a two's-complement nibble), in either order above.
//!
//! The packed length is `ceil(packed_elems · bits / 8)` bytes; an odd count
//! of plain 4-bit codes leaves the last high nibble zero.

use super::QuantError;
use crate::ir::Layout;
use crate::ir::{Format, Kernel, LayoutDim, TileSize};

/// Width of one stored element.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ElemWidth {
    B4,
    B8,
    B16,
    B32,
}

impl ElemWidth {
    pub fn bits(self) -> usize {
        match self {
            ElemWidth::B4 => 4,
            ElemWidth::B8 => 8,
            ElemWidth::B16 => 16,
            ElemWidth::B32 => 32,
        }
    }

    /// Bytes per element in the logical (unpacked) form: 4-bit codes take a
    /// whole byte there.
    pub fn logical_bytes(self) -> usize {
        self.bits().div_ceil(8)
    }

    /// The width a format's codes are stored with.
    pub fn of_format(format: Format) -> ElemWidth {
        match format.bits() {
            4 => ElemWidth::B4,
            8 => ElemWidth::B8,
            16 => ElemWidth::B16,
            _ => ElemWidth::B32,
        }
    }
}

/// A tile variable bound to a concrete size: `name` splits `axis`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Tile {
    pub name: String,
    pub axis: String,
    pub size: usize,
}

impl Tile {
    pub fn new(name: &str, axis: &str, size: usize) -> Tile {
        Tile {
            name: name.to_string(),
            axis: axis.to_string(),
            size,
        }
    }
}

/// How one logical axis contributes to the packed position.
#[derive(Clone, Debug, PartialEq, Eq)]
enum AxisMap {
    /// `i · stride`.
    Whole { stride: usize },
    /// `(i / tile) · outer + (i % tile) · inner`.
    Tiled {
        tile: usize,
        outer: usize,
        inner: usize,
    },
}

impl AxisMap {
    fn offset(&self, i: usize) -> usize {
        match *self {
            AxisMap::Whole { stride } => i * stride,
            AxisMap::Tiled { tile, outer, inner } => i / tile * outer + i % tile * inner,
        }
    }
}

/// A validated logical ↔ packed mapping for one tensor (see the module doc).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PackPlan {
    /// Logical dims: (name, extent), outermost first.
    dims: Vec<(String, usize)>,
    /// Per logical axis, its contribution to the packed position.
    maps: Vec<AxisMap>,
    /// Sizes of the layout dims, outermost first.
    layout_sizes: Vec<usize>,
    elem: ElemWidth,
    pair_transpose: bool,
    /// Stored 4-bit codes are q XOR 8 ([`Layout::int4_signed_codes`]).
    signed_codes: bool,
    logical_elems: usize,
    packed_elems: usize,
}

fn layout_err(msg: String) -> QuantError {
    QuantError::Layout(msg)
}

impl PackPlan {
    /// Validate `layout` against the logical `dims` (name, extent) and the
    /// tile sizes, for elements of width `elem`.
    ///
    /// Errors (all [`QuantError::Layout`] unless noted): duplicate dim or
    /// tile names; a layout dim naming an axis that is not a tensor dim or a
    /// tile not in `tiles`; a tile used on an axis other than its own; a
    /// tensor dim covered zero or several times (a tiled axis needs exactly
    /// its `a/t` and its `t`); a tile size of 0; `int4_pair_transpose` on
    /// non-4-bit elements or without trailing in-tile dims holding a multiple
    /// of 32 codes; sizes overflowing usize ([`QuantError::SizeOverflow`]).
    pub fn new(
        layout: &Layout,
        dims: &[(&str, usize)],
        tiles: &[Tile],
        elem: ElemWidth,
    ) -> Result<PackPlan, QuantError> {
        for (k, (name, _)) in dims.iter().enumerate() {
            if dims[..k].iter().any(|(n, _)| n == name) {
                return Err(layout_err(format!("tensor dim `{name}` appears twice")));
            }
        }
        for (k, t) in tiles.iter().enumerate() {
            if tiles[..k].iter().any(|u| u.name == t.name) {
                return Err(layout_err(format!("tile `{}` is given twice", t.name)));
            }
        }
        let axis_index = |name: &str| -> Result<usize, QuantError> {
            dims.iter().position(|(n, _)| *n == name).ok_or_else(|| {
                layout_err(format!(
                    "layout names axis `{name}`, which is not a tensor dim"
                ))
            })
        };
        let tile_of = |name: &str| -> Result<&Tile, QuantError> {
            let t = tiles
                .iter()
                .find(|t| t.name == name)
                .ok_or_else(|| layout_err(format!("unknown tile `{name}`")))?;
            if t.size == 0 {
                return Err(layout_err(format!("tile `{name}` has size 0")));
            }
            Ok(t)
        };

        // Per layout dim: (logical axis, kind, size); per axis: its tile.
        #[derive(Clone, Copy, PartialEq)]
        enum Part {
            Whole,
            Outer,
            Inner,
        }
        let mut parts: Vec<(usize, Part, usize)> = Vec::with_capacity(layout.dims.len());
        let mut axis_tile: Vec<Option<&Tile>> = vec![None; dims.len()];
        for d in &layout.dims {
            let (axis, part, tile) = match d {
                LayoutDim::Whole(a) => (axis_index(a)?, Part::Whole, None),
                LayoutDim::Outer { axis, tile } => {
                    let t = tile_of(tile)?;
                    if t.axis != *axis {
                        return Err(layout_err(format!(
                            "`{axis}/{tile}`: tile `{tile}` splits `{}`, not `{axis}`",
                            t.axis
                        )));
                    }
                    (axis_index(axis)?, Part::Outer, Some(t))
                }
                LayoutDim::Inner { tile } => {
                    let t = tile_of(tile)?;
                    (axis_index(&t.axis)?, Part::Inner, Some(t))
                }
            };
            if parts.iter().any(|&(a, p, _)| a == axis && p == part)
                || (part == Part::Whole && parts.iter().any(|&(a, _, _)| a == axis))
                || (part != Part::Whole
                    && parts.iter().any(|&(a, p, _)| a == axis && p == Part::Whole))
            {
                return Err(layout_err(format!(
                    "axis `{}` is covered more than once",
                    dims[axis].0
                )));
            }
            if let Some(t) = tile {
                if axis_tile[axis].is_some_and(|u| u.name != t.name) {
                    return Err(layout_err(format!(
                        "axis `{}` is split by two different tiles",
                        dims[axis].0
                    )));
                }
                axis_tile[axis] = Some(t);
            }
            let extent = dims[axis].1;
            let size = match (part, tile) {
                (Part::Outer, Some(t)) => extent.div_ceil(t.size),
                (Part::Inner, Some(t)) => t.size,
                _ => extent,
            };
            parts.push((axis, part, size));
        }
        for (axis, (name, _)) in dims.iter().enumerate() {
            let count = parts.iter().filter(|&&(a, _, _)| a == axis).count();
            let whole = parts.iter().any(|&(a, p, _)| a == axis && p == Part::Whole);
            if count == 0 || (!whole && count != 2) {
                return Err(layout_err(format!(
                    "tensor dim `{name}` is not covered by the layout (a tiled axis needs both `{name}/t` and `t`)"
                )));
            }
        }

        if layout.int4_signed_codes && elem != ElemWidth::B4 {
            return Err(layout_err(format!(
                "int4_signed_codes needs 4-bit elements, not {}-bit",
                elem.bits()
            )));
        }
        if layout.int4_pair_transpose {
            if elem != ElemWidth::B4 {
                return Err(layout_err(format!(
                    "int4_pair_transpose needs 4-bit elements, not {}-bit",
                    elem.bits()
                )));
            }
            let inner = parts
                .iter()
                .rev()
                .take_while(|&&(_, p, _)| p == Part::Inner)
                .count();
            let block: usize = parts[parts.len() - inner..]
                .iter()
                .map(|&(_, _, s)| s)
                .product();
            let outside = parts.len().checked_sub(inner + 1);
            match outside {
                // 16-code blocks: a run pairs two consecutive blocks of the
                // tile count outside them, padded to an even count.
                Some(k) if inner > 0 && block == 16 && parts[k].1 == Part::Outer => {
                    parts[k].2 = parts[k].2.div_ceil(2) * 2;
                }
                _ if inner > 0 && block.is_multiple_of(32) => {}
                _ => {
                    return Err(layout_err(format!(
                        "int4_pair_transpose needs the trailing in-tile dims to hold a multiple of 32 codes (or 16 inside a tile count), they hold {}",
                        if inner > 0 { block } else { 0 }
                    )));
                }
            }
        }

        // Strides, innermost layout dim first.
        let overflow = || QuantError::SizeOverflow {
            what: "packed size",
        };
        let mut strides = vec![0usize; parts.len()];
        let mut stride = 1usize;
        for (k, &(_, _, size)) in parts.iter().enumerate().rev() {
            strides[k] = stride;
            stride = stride.checked_mul(size).ok_or_else(overflow)?;
        }
        let packed_elems = stride;
        packed_elems.checked_mul(elem.bits()).ok_or_else(overflow)?;
        let logical_elems = dims
            .iter()
            .try_fold(1usize, |acc, &(_, n)| acc.checked_mul(n))
            .and_then(|n| n.checked_mul(elem.logical_bytes()).map(|_| n))
            .ok_or(QuantError::SizeOverflow {
                what: "logical size",
            })?;
        let stride_of = |axis: usize, part: Part| {
            parts
                .iter()
                .zip(&strides)
                .find(|((a, p, _), _)| *a == axis && *p == part)
                .map_or(0, |(_, &s)| s)
        };
        let maps = (0..dims.len())
            .map(|axis| match axis_tile[axis] {
                None => AxisMap::Whole {
                    stride: stride_of(axis, Part::Whole),
                },
                Some(t) => AxisMap::Tiled {
                    tile: t.size,
                    outer: stride_of(axis, Part::Outer),
                    inner: stride_of(axis, Part::Inner),
                },
            })
            .collect();

        Ok(PackPlan {
            dims: dims.iter().map(|&(n, e)| (n.to_string(), e)).collect(),
            maps,
            layout_sizes: parts.iter().map(|&(_, _, s)| s).collect(),
            elem,
            pair_transpose: layout.int4_pair_transpose,
            signed_codes: layout.int4_signed_codes,
            logical_elems,
            packed_elems,
        })
    }

    /// The plan for tensor `tensor` of `kernel`: its dims, layout and format
    /// from the IR, extents from the axes (`extents` binds dynamic ones and
    /// may override fixed ones), tile sizes from the schedule (`solved`
    /// gives the sizes of `TileSize::Solve` tiles, and may override).
    pub fn for_tensor(
        kernel: &Kernel,
        tensor: &str,
        extents: &[(&str, usize)],
        solved: &[(&str, usize)],
    ) -> Result<PackPlan, QuantError> {
        let t = kernel.tensor(tensor).ok_or_else(|| {
            layout_err(format!("no tensor `{tensor}` in kernel `{}`", kernel.name))
        })?;
        let mut dims = Vec::with_capacity(t.dims.len());
        for d in &t.dims {
            let extent = match extents.iter().find(|(n, _)| n == d) {
                Some(&(_, e)) => e,
                None => match kernel.axis(d).map(|a| a.extent) {
                    Some(crate::ir::Extent::Fixed(e)) => e as usize,
                    _ => {
                        return Err(layout_err(format!("no extent given for axis `{d}`")));
                    }
                },
            };
            dims.push((d.as_str(), extent));
        }
        let mut tiles = Vec::new();
        for tv in &kernel.schedule.tiles {
            let size = match (solved.iter().find(|(n, _)| *n == tv.name), tv.size) {
                (Some(&(_, s)), _) => s,
                (None, TileSize::Fixed(s)) => s as usize,
                // Unused by this tensor's layout is fine; used is caught by `new`.
                (None, TileSize::Solve) => continue,
            };
            tiles.push(Tile::new(&tv.name, &tv.axis, size));
        }
        PackPlan::new(&t.layout, &dims, &tiles, ElemWidth::of_format(t.format))
    }

    pub fn elem(&self) -> ElemWidth {
        self.elem
    }

    /// Logical dims (name, extent), outermost first.
    pub fn dims(&self) -> impl Iterator<Item = (&str, usize)> {
        self.dims.iter().map(|(n, e)| (n.as_str(), *e))
    }

    /// Sizes of the layout's dims, outermost first (tile counts rounded up).
    pub fn layout_sizes(&self) -> &[usize] {
        &self.layout_sizes
    }

    /// Number of logical elements.
    pub fn logical_elems(&self) -> usize {
        self.logical_elems
    }

    /// Number of packed element positions, padding included.
    pub fn packed_elems(&self) -> usize {
        self.packed_elems
    }

    /// Length of the logical byte form `pack` takes.
    pub fn logical_bytes(&self) -> usize {
        self.logical_elems * self.elem.logical_bytes()
    }

    /// Length of the packed byte form `pack` returns.
    pub fn packed_bytes(&self) -> usize {
        (self.packed_elems * self.elem.bits()).div_ceil(8)
    }

    /// Packed position of a logical index (one coordinate per dim), or
    /// `None` if the index is out of bounds or has the wrong rank.
    pub fn packed_index(&self, index: &[usize]) -> Option<usize> {
        if index.len() != self.dims.len()
            || index.iter().zip(&self.dims).any(|(&i, (_, n))| i >= *n)
        {
            return None;
        }
        Some(
            index
                .iter()
                .zip(&self.maps)
                .map(|(&i, m)| m.offset(i))
                .sum(),
        )
    }

    /// Logical index stored at a packed position, or `None` for padding (or
    /// a position past the end).
    pub fn logical_index(&self, packed: usize) -> Option<Vec<usize>> {
        if packed >= self.packed_elems {
            return None;
        }
        let mut index = Vec::with_capacity(self.dims.len());
        for ((_, n), m) in self.dims.iter().zip(&self.maps) {
            let i = match *m {
                AxisMap::Whole { stride } => packed / stride % n.max(&1),
                AxisMap::Tiled { tile, outer, inner } => {
                    let outer_count = n.div_ceil(tile).max(1);
                    packed / outer % outer_count * tile + packed / inner % tile
                }
            };
            if i >= *n {
                return None;
            }
            index.push(i);
        }
        Some(index)
    }

    /// What a stored 4-bit code is XORed with: 8 for signed codes (q − 8 in
    /// two's complement), else 0. Padding stays 0, the signed zero.
    fn code_flip(&self) -> u8 {
        if self.signed_codes { 8 } else { 0 }
    }

    /// Byte index and nibble shift (0 or 4) of a 4-bit packed position.
    fn nibble_slot(&self, p: usize) -> (usize, u32) {
        if self.pair_transpose {
            let k = p % 32;
            (p / 32 * 16 + k % 16, if k >= 16 { 4 } else { 0 })
        } else {
            (p / 2, if p % 2 == 1 { 4 } else { 0 })
        }
    }

    /// Visit every logical element in row-major order with its packed
    /// position.
    fn for_each(&self, mut f: impl FnMut(usize, usize)) {
        if self.logical_elems == 0 {
            return;
        }
        let rank = self.dims.len();
        let mut index = vec![0usize; rank];
        for l in 0..self.logical_elems {
            let p = index
                .iter()
                .zip(&self.maps)
                .map(|(&i, m)| m.offset(i))
                .sum();
            f(l, p);
            for k in (0..rank).rev() {
                index[k] += 1;
                if index[k] < self.dims[k].1 {
                    break;
                }
                index[k] = 0;
            }
        }
    }

    /// Logical bytes → packed bytes (module doc). Errors: wrong length, or a
    /// 4-bit code byte with its high nibble set ([`QuantError::Nibble`]
    /// naming the element).
    pub fn pack(&self, logical: &[u8]) -> Result<Vec<u8>, QuantError> {
        if logical.len() != self.logical_bytes() {
            return Err(QuantError::Length {
                what: "logical bytes",
                expected: self.logical_bytes(),
                got: logical.len(),
            });
        }
        let mut out = vec![0u8; self.packed_bytes()];
        match self.elem {
            ElemWidth::B4 => {
                if let Some(index) = logical.iter().position(|&b| b > 15) {
                    return Err(QuantError::Nibble {
                        index,
                        byte: logical[index],
                    });
                }
                let flip = self.code_flip();
                self.for_each(|l, p| {
                    let (byte, shift) = self.nibble_slot(p);
                    out[byte] |= (logical[l] ^ flip) << shift;
                });
            }
            _ => {
                let w = self.elem.logical_bytes();
                self.for_each(|l, p| {
                    out[p * w..(p + 1) * w].copy_from_slice(&logical[l * w..(l + 1) * w]);
                });
            }
        }
        Ok(out)
    }

    /// Packed bytes → logical bytes, the inverse of [`PackPlan::pack`].
    /// Padding is ignored. Errors: wrong length.
    pub fn unpack(&self, packed: &[u8]) -> Result<Vec<u8>, QuantError> {
        if packed.len() != self.packed_bytes() {
            return Err(QuantError::Length {
                what: "packed bytes",
                expected: self.packed_bytes(),
                got: packed.len(),
            });
        }
        let mut out = vec![0u8; self.logical_bytes()];
        match self.elem {
            ElemWidth::B4 => {
                let flip = self.code_flip();
                self.for_each(|l, p| {
                    let (byte, shift) = self.nibble_slot(p);
                    out[l] = ((packed[byte] >> shift) & 0x0F) ^ flip;
                })
            }
            _ => {
                let w = self.elem.logical_bytes();
                self.for_each(|l, p| {
                    out[l * w..(l + 1) * w].copy_from_slice(&packed[p * w..(p + 1) * w]);
                });
            }
        }
        Ok(out)
    }
}

/// One-shot [`PackPlan::new`] + [`PackPlan::pack`].
pub fn pack(
    layout: &Layout,
    dims: &[(&str, usize)],
    tiles: &[Tile],
    elem: ElemWidth,
    logical: &[u8],
) -> Result<Vec<u8>, QuantError> {
    PackPlan::new(layout, dims, tiles, elem)?.pack(logical)
}

/// One-shot [`PackPlan::new`] + [`PackPlan::unpack`].
pub fn unpack(
    layout: &Layout,
    dims: &[(&str, usize)],
    tiles: &[Tile],
    elem: ElemWidth,
    packed: &[u8],
) -> Result<Vec<u8>, QuantError> {
    PackPlan::new(layout, dims, tiles, elem)?.unpack(packed)
}
