//! Packing: byte-exact known vectors, pack/unpack identity and a brute-force
//! oracle over random layouts, padding, and errors.

use proptest::prelude::*;
use tessera_dsl::ir::ParamType;
use tessera_dsl::quant::{
    ElemWidth, PackPlan, PackedWeights, ParamOrder, QuantError, QuantTensor, Tile, WeightPacking,
    activation_layout, gpu_weight_layout, pack, pack_activations, pack_params, pack_weights,
    quantize, unpack, unpack_params, weight_layout,
};
use tessera_dsl::{
    Axis, AxisKind, Epilogue, Extent, Format, Group, Kernel, Layout, LayoutDim, Matmul, Op, Role,
    Schedule, Tensor, TileSize, TileVar,
};

fn hl_tiles(hp: usize, lp: usize) -> Vec<Tile> {
    vec![Tile::new("hp", "h", hp), Tile::new("lp", "l", lp)]
}

#[test]
fn int8_2x8_weights_hp2_lp4() {
    // w[h][l] = 8h + l. [h/2, l/4, 2, 4]: block (l 0..4) holds rows 0 and 1,
    // then block (l 4..8).
    let logical: Vec<u8> = (0..16).collect();
    let packed = pack(
        &weight_layout(false),
        &[("h", 2), ("l", 8)],
        &hl_tiles(2, 4),
        ElemWidth::B8,
        &logical,
    )
    .unwrap();
    assert_eq!(
        packed,
        [0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15]
    );
}

/// Codes of an 8x8 4-bit block, in layout order (row-major here, since
/// hp = lp = 8): 0..16, then 15..=0, then again.
fn ramp_codes() -> Vec<u8> {
    (0..64u8)
        .map(|p| {
            if (p / 16) % 2 == 0 {
                p % 16
            } else {
                15 - p % 16
            }
        })
        .collect()
}

#[test]
fn int4_8x8_plain_nibbles() {
    let packed = pack(
        &weight_layout(false),
        &[("h", 8), ("l", 8)],
        &hl_tiles(8, 8),
        ElemWidth::B4,
        &ramp_codes(),
    )
    .unwrap();
    // byte j = code[2j] | code[2j+1] << 4.
    let half = [
        0x10, 0x32, 0x54, 0x76, 0x98, 0xBA, 0xDC, 0xFE, //
        0xEF, 0xCD, 0xAB, 0x89, 0x67, 0x45, 0x23, 0x01,
    ];
    assert_eq!(packed, [half, half].concat());
}

#[test]
fn int4_8x8_pair_transposed() {
    let packed = pack(
        &weight_layout(true),
        &[("h", 8), ("l", 8)],
        &hl_tiles(8, 8),
        ElemWidth::B4,
        &ramp_codes(),
    )
    .unwrap();
    // byte j of each 32-code run = code[j] | code[j+16] << 4 = j | (15-j) << 4.
    let run = [
        0xF0, 0xE1, 0xD2, 0xC3, 0xB4, 0xA5, 0x96, 0x87, //
        0x78, 0x69, 0x5A, 0x4B, 0x3C, 0x2D, 0x1E, 0x0F,
    ];
    assert_eq!(packed, [run, run].concat());
}

/// Signed codes store each code XOR 8 (q − 8 as a nibble) in the same
/// nibble order, unpack restores the codes, and 8-bit elements refuse it.
#[test]
fn int4_8x8_pair_transposed_signed_codes() {
    let layout = Layout {
        int4_signed_codes: true,
        ..weight_layout(true)
    };
    let dims = [("h", 8), ("l", 8)];
    let packed = pack(
        &layout,
        &dims,
        &hl_tiles(8, 8),
        ElemWidth::B4,
        &ramp_codes(),
    )
    .unwrap();
    let run: Vec<u8> = (0u8..16).map(|j| (j ^ 8) | ((15 - j) ^ 8) << 4).collect();
    assert_eq!(packed, [run.clone(), run].concat());
    assert_eq!(packed[0], 0x78, "code 0 -> -8 (0x8), code 15 -> 7 (0x7)");
    let back = unpack(&layout, &dims, &hl_tiles(8, 8), ElemWidth::B4, &packed).unwrap();
    assert_eq!(back, ramp_codes());
    // Padding stays the zero byte: the signed code of q = 8, value 0.
    let padded = pack(
        &layout,
        &[("h", 5), ("l", 8)],
        &hl_tiles(8, 8),
        ElemWidth::B4,
        &ramp_codes()[..40],
    )
    .unwrap();
    // Rows 5..8 of the panel are padding: the second run's high nibbles
    // (positions 48..64) and its bytes 8..16 (positions 40..48).
    assert!(padded[16..24].iter().all(|&b| b >> 4 == 0), "{padded:?}");
    assert!(padded[24..].iter().all(|&b| b == 0), "{padded:?}");
    match PackPlan::new(&layout, &dims, &hl_tiles(8, 8), ElemWidth::B8) {
        Err(QuantError::Layout(m)) => assert!(m.contains("int4_signed_codes"), "{m}"),
        other => panic!("expected a layout error, got {other:?}"),
    }
}

#[test]
fn int4_8x8_tiled_hp8_lp4_both_ways() {
    // c[h][l] = (8h + l) % 16. [h/8, l/4, 8, 4]: the l 0..4 block reads
    // 0 1 2 3 | 8 9 10 11 per pair of rows, the l 4..8 block 4..8 | 12..16.
    let logical: Vec<u8> = (0..64u8).map(|p| p % 16).collect();
    let dims = [("h", 8), ("l", 8)];
    let plain = pack(
        &weight_layout(false),
        &dims,
        &hl_tiles(8, 4),
        ElemWidth::B4,
        &logical,
    )
    .unwrap();
    let b0 = [0x10, 0x32, 0x98, 0xBA];
    let b1 = [0x54, 0x76, 0xDC, 0xFE];
    assert_eq!(plain, [b0, b0, b0, b0, b1, b1, b1, b1].concat());
    let transposed = pack(
        &weight_layout(true),
        &dims,
        &hl_tiles(8, 4),
        ElemWidth::B4,
        &logical,
    )
    .unwrap();
    let t0 = [0x00, 0x11, 0x22, 0x33, 0x88, 0x99, 0xAA, 0xBB];
    let t1 = [0x44, 0x55, 0x66, 0x77, 0xCC, 0xDD, 0xEE, 0xFF];
    assert_eq!(transposed, [t0, t0, t1, t1].concat());
}

#[test]
fn gpu_layout_lp32_tiny_h_with_tail() {
    // h = 3, l = 40: [l/32, h, 32] = 2·3·32 bytes; c[h][l] = 40h + l.
    let logical: Vec<u8> = (0..120).collect();
    let plan = PackPlan::new(
        &gpu_weight_layout(),
        &[("h", 3), ("l", 40)],
        &[Tile::new("lp", "l", 32)],
        ElemWidth::B8,
    )
    .unwrap();
    let packed = plan.pack(&logical).unwrap();
    let mut expected = Vec::new();
    for h in 0..3u8 {
        expected.extend(40 * h..40 * h + 32);
    }
    for h in 0..3u8 {
        expected.extend(40 * h + 32..40 * h + 40);
        expected.extend([0u8; 24]);
    }
    assert_eq!(packed, expected);
    assert_eq!(plan.unpack(&packed).unwrap(), logical);
}

#[test]
fn gpu_layout_4bit_rows_are_16_bytes() {
    // h = 2, l = 32: row h is 16 bytes, byte j = c[2j] | c[2j+1] << 4.
    let logical: Vec<u8> = (0..64u8).map(|p| (p / 2) % 16).collect();
    let packed = pack(
        &gpu_weight_layout(),
        &[("h", 2), ("l", 32)],
        &[Tile::new("lp", "l", 32)],
        ElemWidth::B4,
        &logical,
    )
    .unwrap();
    let row: Vec<u8> = (0..16u8).map(|j| j | j << 4).collect();
    assert_eq!(packed, [row.clone(), row].concat());
}

#[test]
fn activations_with_tails_and_16bit_elements() {
    // e = 3, l = 3, ep = 2, lp = 2: [2, 2, 2, 2] elements of 2 bytes.
    // x[e][l] = 10e + l as little-endian u16.
    let logical: Vec<u8> = (0..3u16)
        .flat_map(|e| (0..3u16).map(move |l| 10 * e + l))
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let packed = pack_activations(ElemWidth::B16, 3, 3, 2, 2, &logical).unwrap();
    let values: Vec<u16> = packed
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect();
    // eb0 lb0: [0 1 | 10 11]; eb0 lb1: [2 0 | 12 0]; eb1 lb0: [20 21 | 0 0];
    // eb1 lb1: [22 0 | 0 0].
    assert_eq!(
        values,
        [0, 1, 10, 11, 2, 0, 12, 0, 20, 21, 0, 0, 22, 0, 0, 0]
    );
}

#[test]
fn params_tiled_and_group_major() {
    // 3 rows, 2 groups: s[r][g] = 10r + g.
    let s = [0.0, 1.0, 10.0, 11.0, 20.0, 21.0];
    let tiled = pack_params(&s, 3, 2, ParamOrder::RowTiled { tile: 2 }).unwrap();
    assert_eq!(
        tiled,
        [0.0, 10.0, 1.0, 11.0, 20.0, 0.0, 21.0, 0.0] // [h/2, groups, 2]
    );
    let gm = pack_params(&s, 3, 2, ParamOrder::GroupMajor).unwrap();
    assert_eq!(gm, [0.0, 10.0, 20.0, 1.0, 11.0, 21.0]);
    assert_eq!(pack_params(&s, 3, 2, ParamOrder::RowMajor).unwrap(), s);
    assert_eq!(
        pack_params(&s[..5], 3, 2, ParamOrder::GroupMajor),
        Err(QuantError::Length {
            what: "params",
            expected: 6,
            got: 5
        })
    );
    assert!(matches!(
        unpack_params(&s, 3, 2, ParamOrder::RowTiled { tile: 2 }),
        Err(QuantError::Length {
            expected: 8,
            got: 6,
            ..
        })
    ));
    for order in [
        ParamOrder::RowMajor,
        ParamOrder::RowTiled { tile: 2 },
        ParamOrder::GroupMajor,
    ] {
        let p = pack_params(&s, 3, 2, order).unwrap();
        assert_eq!(unpack_params(&p, 3, 2, order).unwrap(), s);
    }
}

#[test]
fn weights_round_trip_for_every_format_and_packing() {
    let (h, l) = (10, 72);
    let data: Vec<f32> = (0..h * l)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
        .collect();
    for format in Format::examples()
        .into_iter()
        .filter(|f| !matches!(f, Format::F32 | Format::F16 | Format::BF16))
    {
        let t = quantize(format, h, l, &data).unwrap();
        for packing in [
            WeightPacking::Cpu { hp: 8, lp: 4 },
            WeightPacking::Cpu { hp: 4, lp: 8 },
            WeightPacking::Gpu { lp: 32 },
        ] {
            let p = pack_weights(&t, packing).unwrap();
            assert_eq!(p.unpack().unwrap(), t, "{format} {packing:?}");
        }
    }
}

#[test]
fn weights_4bit_cpu_params_and_transposed_codes() {
    // h = 3, l = 8, hp = 4, lp = 8 (32 codes per block), u4asym g4.
    // w[r][c] = 100r + 20·(c/4) + 5·(c%4): every group spans 15, so scale 1,
    // offset 100r + 20g, codes 0 5 10 15.
    let data: Vec<f32> = (0..24)
        .map(|i| (100 * (i / 8) + 20 * (i % 8 / 4) + 5 * (i % 4)) as f32)
        .collect();
    let t = quantize(Format::U4Asym(Group::Size(4), ParamType::F32), 3, 8, &data).unwrap();
    let p = pack_weights(&t, WeightPacking::Cpu { hp: 4, lp: 8 }).unwrap();
    // One block of 32 codes: rows 0, 1, 2 and padding row 3, 8 codes each.
    // byte j = code[j] | code[j+16] << 4: j < 8 pairs row 0 with row 2,
    // j ≥ 8 pairs row 1 with the zero row 3.
    assert_eq!(
        p.codes,
        [
            0x00, 0x55, 0xAA, 0xFF, 0x00, 0x55, 0xAA, 0xFF, //
            0x00, 0x05, 0x0A, 0x0F, 0x00, 0x05, 0x0A, 0x0F
        ]
    );
    // Params [h/4, groups, 4]: group 0 of rows 0..4, then group 1.
    assert_eq!(p.scales, [1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 0.0]);
    assert_eq!(p.offsets, [0.0, 100.0, 200.0, 0.0, 20.0, 120.0, 220.0, 0.0]);
}

#[test]
fn padding_is_zero() {
    // 5 x 3 bytes of 0xFF into [h/4, l/2, 4, 2]: 2·2·4·2 = 32 positions.
    let plan = PackPlan::new(
        &weight_layout(false),
        &[("h", 5), ("l", 3)],
        &hl_tiles(4, 2),
        ElemWidth::B8,
    )
    .unwrap();
    let packed = plan.pack(&[0xFF; 15]).unwrap();
    assert_eq!(packed.len(), 32);
    assert_eq!(packed.iter().filter(|&&b| b == 0xFF).count(), 15);
    for (p, &b) in packed.iter().enumerate() {
        assert_eq!(b == 0, plan.logical_index(p).is_none(), "position {p}");
    }
}

#[test]
fn layout_errors() {
    let dims = [("h", 8), ("l", 8)];
    let err =
        |layout: &Layout, tiles: &[Tile], elem| match PackPlan::new(layout, &dims, tiles, elem) {
            Err(QuantError::Layout(m)) => m,
            other => panic!("expected a layout error, got {other:?}"),
        };
    let m = err(
        &weight_layout(false),
        &[Tile::new("hp", "h", 4)],
        ElemWidth::B8,
    );
    assert!(m.contains("unknown tile `lp`"), "{m}");
    let m = err(&Layout::row_major(&["h", "x"]), &[], ElemWidth::B8);
    assert!(m.contains("`x`"), "{m}");
    let m = err(&Layout::row_major(&["h"]), &[], ElemWidth::B8);
    assert!(m.contains("`l` is not covered"), "{m}");
    let m = err(&Layout::row_major(&["h", "l", "l"]), &[], ElemWidth::B8);
    assert!(m.contains("more than once"), "{m}");
    let m = err(
        &weight_layout(false),
        &[Tile::new("hp", "l", 4), Tile::new("lp", "l", 4)],
        ElemWidth::B8,
    );
    assert!(m.contains("splits `l`, not `h`"), "{m}");
    let m = err(
        &Layout {
            dims: vec![LayoutDim::outer("h", "hp"), LayoutDim::whole("l")],
            int4_pair_transpose: false,
            int4_signed_codes: false,
        },
        &hl_tiles(4, 4),
        ElemWidth::B8,
    );
    assert!(m.contains("`h` is not covered"), "{m}");
    let m = err(&weight_layout(false), &hl_tiles(0, 4), ElemWidth::B8);
    assert!(m.contains("size 0"), "{m}");
    let m = err(
        &Layout {
            dims: vec![
                LayoutDim::outer("h", "hp"),
                LayoutDim::whole("l"),
                LayoutDim::inner("hq"),
            ],
            int4_pair_transpose: false,
            int4_signed_codes: false,
        },
        &[Tile::new("hp", "h", 4), Tile::new("hq", "h", 4)],
        ElemWidth::B8,
    );
    assert!(m.contains("two different tiles"), "{m}");
    // Pair transpose: 2x4 = 8 codes per block, and 8-bit elements.
    let m = err(&weight_layout(true), &hl_tiles(2, 4), ElemWidth::B4);
    assert!(m.contains("multiple of 32"), "{m}");
    let m = err(&weight_layout(true), &hl_tiles(8, 4), ElemWidth::B8);
    assert!(m.contains("4-bit"), "{m}");
    assert!(matches!(
        pack_weights(
            &quantize(Format::U4Asym(Group::Row, ParamType::F32), 4, 4, &[0.0; 16]).unwrap(),
            WeightPacking::Cpu { hp: 2, lp: 4 }
        ),
        Err(QuantError::Layout(_))
    ));
}

/// 16-code blocks (hp = lp = 4) pair-transposed: each 16-byte run holds two
/// consecutive lp-steps of one panel (low nibbles the first, high the
/// second), and a panel's odd step count is padded with a zero block.
#[test]
fn int4_pair_transpose_pairs_16_code_blocks_along_l() {
    let (h, l) = (6, 12); // 2 panels of 4 rows; 3 steps of 4, padded to 4
    let plan = PackPlan::new(
        &weight_layout(true),
        &[("h", h), ("l", l)],
        &hl_tiles(4, 4),
        ElemWidth::B4,
    )
    .unwrap();
    let code = |r: usize, c: usize| ((r * 7 + c * 3) % 16) as u8;
    let logical: Vec<u8> = (0..h * l).map(|i| code(i / l, i % l)).collect();
    let packed = plan.pack(&logical).unwrap();
    // 2 panels × 4 steps (one of them padding) × 16 codes / 2.
    assert_eq!(packed.len(), 2 * 4 * 8);
    let want = |panel: usize, step: usize, j: usize| -> u8 {
        let (row, k) = (panel * 4 + j / 4, step * 4 + j % 4);
        if row < h && k < l { code(row, k) } else { 0 }
    };
    for panel in 0..2 {
        for pair in 0..2 {
            for j in 0..16 {
                let byte = packed[panel * 32 + pair * 16 + j];
                assert_eq!(
                    byte & 15,
                    want(panel, 2 * pair, j),
                    "panel {panel} pair {pair} byte {j}"
                );
                assert_eq!(
                    byte >> 4,
                    want(panel, 2 * pair + 1, j),
                    "panel {panel} pair {pair} byte {j}"
                );
            }
        }
    }
    assert_eq!(plan.unpack(&packed).unwrap(), logical);
}

#[test]
fn data_errors() {
    let plan = PackPlan::new(
        &weight_layout(false),
        &[("h", 2), ("l", 4)],
        &hl_tiles(2, 2),
        ElemWidth::B4,
    )
    .unwrap();
    assert_eq!(
        plan.pack(&[0, 1, 2, 3, 16, 0, 0, 0]),
        Err(QuantError::Nibble { index: 4, byte: 16 })
    );
    assert!(matches!(
        plan.pack(&[0; 7]),
        Err(QuantError::Length {
            expected: 8,
            got: 7,
            ..
        })
    ));
    assert!(matches!(
        plan.unpack(&[0; 5]),
        Err(QuantError::Length {
            expected: 4,
            got: 5,
            ..
        })
    ));
    assert!(matches!(
        PackPlan::new(
            &Layout::row_major(&["a", "b"]),
            &[("a", usize::MAX), ("b", 3)],
            &[],
            ElemWidth::B8
        ),
        Err(QuantError::SizeOverflow { .. })
    ));
    let bad = PackedWeights {
        format: Format::I8Sym(Group::Row, ParamType::F32),
        h: 2,
        l: 4,
        packing: WeightPacking::Gpu { lp: 32 },
        codes: vec![0x80; 64],
        scales: vec![1.0, 1.0],
        offsets: vec![],
    };
    assert!(matches!(
        bad.unpack(),
        Err(QuantError::CodeRange { index: 0, .. })
    ));
}

#[test]
fn plan_from_kernel_tensor() {
    let axis = |name: &str, extent, kind| Axis {
        name: name.into(),
        extent,
        kind,
    };
    let tensor = |name: &str, role, dims: &[&str], format, layout| Tensor {
        name: name.into(),
        role,
        dims: dims.iter().map(|d| d.to_string()).collect(),
        format,
        layout,
    };
    let tile = |name: &str, axis: &str, size| TileVar {
        name: name.into(),
        axis: axis.into(),
        size,
    };
    let kernel = Kernel {
        name: "matmul-w4a8".into(),
        axes: vec![
            axis("e", Extent::Dyn, AxisKind::Spatial),
            axis("h", Extent::Fixed(16), AxisKind::Spatial),
            axis("l", Extent::Fixed(40), AxisKind::Reduce),
        ],
        tensors: vec![
            tensor(
                "x",
                Role::Input,
                &["e", "l"],
                Format::I8Dyn,
                activation_layout(),
            ),
            tensor(
                "w",
                Role::Weight,
                &["h", "l"],
                Format::U4Asym(Group::Size(32), ParamType::F32),
                weight_layout(true),
            ),
            tensor(
                "y",
                Role::Output,
                &["e", "h"],
                Format::F32,
                Layout::row_major(&["e", "h"]),
            ),
        ],
        op: Op::Matmul(Matmul {
            x: "x".into(),
            w: "w".into(),
            y: "y".into(),
            e: "e".into(),
            h: "h".into(),
            l: "l".into(),
            epilogue: Epilogue {
                scale: true,
                zero_point: true,
                bias: None,
                activation: tessera_dsl::Activation::None,
            },
        }),
        schedule: Schedule {
            tiles: vec![
                tile("ep", "e", TileSize::Solve),
                tile("hp", "h", TileSize::Solve),
                tile("lp", "l", TileSize::Fixed(8)),
            ],
            ..Schedule::default()
        },
    };
    let plan = PackPlan::for_tensor(&kernel, "w", &[], &[("hp", 8)]).unwrap();
    assert_eq!(plan.elem(), ElemWidth::B4);
    assert_eq!(plan.layout_sizes(), [2, 5, 8, 8]);
    assert_eq!(plan.packed_bytes(), 16 * 40 / 2);
    // Unsolved hp is an unknown tile for w; e without an extent for x.
    assert!(matches!(
        PackPlan::for_tensor(&kernel, "w", &[], &[]),
        Err(QuantError::Layout(m)) if m.contains("unknown tile `hp`")
    ));
    assert!(matches!(
        PackPlan::for_tensor(&kernel, "x", &[], &[("ep", 4)]),
        Err(QuantError::Layout(m)) if m.contains("axis `e`")
    ));
    let x = PackPlan::for_tensor(&kernel, "x", &[("e", 5)], &[("ep", 4)]).unwrap();
    assert_eq!(x.layout_sizes(), [2, 5, 4, 8]);
    assert!(matches!(
        PackPlan::for_tensor(&kernel, "nope", &[], &[]),
        Err(QuantError::Layout(_))
    ));
}

// ---------------------------------------------------------------- proptest

/// A random tensor of rank 1..=3 with a random layout: each axis whole or
/// tiled, the layout dims in a random order (in-tile dims may even come
/// before their tile counts).
#[derive(Debug, Clone)]
struct Case {
    dims: Vec<(String, usize)>,
    tiles: Vec<Tile>,
    layout: Layout,
    elem: ElemWidth,
    seed: u64,
}

fn case() -> impl Strategy<Value = Case> {
    (
        prop::collection::vec((0usize..10, prop::option::of(1usize..6)), 1..=3),
        prop::sample::select(vec![
            ElemWidth::B4,
            ElemWidth::B8,
            ElemWidth::B16,
            ElemWidth::B32,
        ]),
        any::<u64>(),
        any::<u64>(),
    )
        .prop_map(|(axes, elem, perm_seed, seed)| {
            let names = ["a", "b", "c"];
            let mut dims = Vec::new();
            let mut tiles = Vec::new();
            let mut layout_dims = Vec::new();
            for (k, &(extent, tile)) in axes.iter().enumerate() {
                dims.push((names[k].to_string(), extent));
                match tile {
                    Some(t) => {
                        let tname = format!("{}p", names[k]);
                        tiles.push(Tile::new(&tname, names[k], t));
                        layout_dims.push(LayoutDim::outer(names[k], &tname));
                        layout_dims.push(LayoutDim::inner(&tname));
                    }
                    None => layout_dims.push(LayoutDim::whole(names[k])),
                }
            }
            // Deterministic shuffle from the seed.
            let mut s = perm_seed | 1;
            for i in (1..layout_dims.len()).rev() {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                layout_dims.swap(i, (s % (i as u64 + 1)) as usize);
            }
            Case {
                dims,
                tiles,
                layout: Layout {
                    dims: layout_dims,
                    int4_pair_transpose: false,
                    int4_signed_codes: false,
                },
                elem,
                seed,
            }
        })
}

fn random_logical(plan: &PackPlan, seed: u64) -> Vec<u8> {
    let mut s = seed | 1;
    (0..plan.logical_bytes())
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let b = (s >> 24) as u8;
            if plan.elem() == ElemWidth::B4 {
                b & 15
            } else {
                b | 1
            }
        })
        .collect()
}

/// Independent oracle: walk the packed positions in layout order with an
/// odometer over the layout dims, derive each logical coordinate from the
/// layout dim kinds, and write the element (or leave padding zero).
fn oracle(case: &Case, logical: &[u8]) -> Vec<u8> {
    let tile = |name: &str| case.tiles.iter().find(|t| t.name == name).unwrap();
    let axis = |name: &str| case.dims.iter().position(|(n, _)| n == name).unwrap();
    let sizes: Vec<usize> = case
        .layout
        .dims
        .iter()
        .map(|d| match d {
            LayoutDim::Whole(a) => case.dims[axis(a)].1,
            LayoutDim::Outer { axis: a, tile: t } => case.dims[axis(a)].1.div_ceil(tile(t).size),
            LayoutDim::Inner { tile: t } => tile(t).size,
        })
        .collect();
    let total: usize = sizes.iter().product();
    let bits = case.elem.bits();
    let w = case.elem.logical_bytes();
    let mut out = vec![0u8; (total * bits).div_ceil(8)];
    let mut coord = vec![0usize; sizes.len()];
    for p in 0..total {
        let mut index = vec![0usize; case.dims.len()];
        for (d, &c) in case.layout.dims.iter().zip(&coord) {
            match d {
                LayoutDim::Whole(a) => index[axis(a)] += c,
                LayoutDim::Outer { axis: a, tile: t } => index[axis(a)] += c * tile(t).size,
                LayoutDim::Inner { tile: t } => index[axis(&tile(t).axis)] += c,
            }
        }
        let inside = index.iter().zip(&case.dims).all(|(&i, (_, n))| i < *n);
        if inside {
            let l = index
                .iter()
                .zip(&case.dims)
                .fold(0, |acc, (&i, (_, n))| acc * n + i);
            if bits == 4 {
                out[p / 2] |= logical[l] << (4 * (p % 2));
            } else {
                out[p * w..(p + 1) * w].copy_from_slice(&logical[l * w..(l + 1) * w]);
            }
        }
        for k in (0..coord.len()).rev() {
            coord[k] += 1;
            if coord[k] < sizes[k] {
                break;
            }
            coord[k] = 0;
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn pack_matches_oracle_and_unpack_inverts(case in case()) {
        let names: Vec<(&str, usize)> = case.dims.iter().map(|(n, e)| (n.as_str(), *e)).collect();
        let plan = PackPlan::new(&case.layout, &names, &case.tiles, case.elem).unwrap();
        let logical = random_logical(&plan, case.seed);
        let packed = plan.pack(&logical).unwrap();
        prop_assert_eq!(&packed, &oracle(&case, &logical));
        prop_assert_eq!(plan.unpack(&packed).unwrap(), logical.clone());
        // The one-shot functions agree with the plan.
        prop_assert_eq!(
            unpack(&case.layout, &names, &case.tiles, case.elem, &packed).unwrap(),
            logical
        );
        // packed_index / logical_index are inverse on every position.
        for p in 0..plan.packed_elems() {
            if let Some(ix) = plan.logical_index(p) {
                prop_assert_eq!(plan.packed_index(&ix), Some(p));
            }
        }
    }

    /// Pair transpose: unpacking inverts packing, and nibble k of run b sits
    /// at byte 16b + k % 16, low half iff k < 16.
    #[test]
    fn pair_transpose_round_trips(
        h in 0usize..20,
        l in 0usize..20,
        (hp, lp) in prop::sample::select(vec![
            (1usize, 32usize), (2, 16), (4, 8), (8, 4), (8, 8), (4, 16), (16, 2), (32, 1),
            (3, 32), (6, 16), (12, 8), (12, 16),
        ]),
        seed in any::<u64>(),
    ) {
        let dims = [("h", h), ("l", l)];
        let tiles = hl_tiles(hp, lp);
        let plan = PackPlan::new(&weight_layout(true), &dims, &tiles, ElemWidth::B4).unwrap();
        let plain = PackPlan::new(&weight_layout(false), &dims, &tiles, ElemWidth::B4).unwrap();
        let logical = random_logical(&plan, seed);
        let packed = plan.pack(&logical).unwrap();
        prop_assert_eq!(plan.unpack(&packed).unwrap(), logical.clone());
        let straight = plain.pack(&logical).unwrap();
        let nib = |bytes: &[u8], byte: usize, high: bool| (bytes[byte] >> (4 * usize::from(high))) & 15;
        for p in 0..plan.packed_elems() {
            let k = p % 32;
            prop_assert_eq!(
                nib(&packed, p / 32 * 16 + k % 16, k >= 16),
                nib(&straight, p / 2, p % 2 == 1)
            );
        }
    }

    #[test]
    fn weights_round_trip_random_shapes(
        h in 0usize..13, l in 0usize..70, pick in 0usize..4, seed in any::<u64>()
    ) {
        let formats = [
            Format::U4Asym(Group::Size(8), ParamType::F32),
            Format::E0M4(Group::Row, ParamType::F32),
            Format::I8Asym(Group::Size(32), ParamType::F32),
            Format::Fp8E5M2,
        ];
        let mut s = seed | 1;
        let data: Vec<f32> = (0..h * l)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s % 2001) as f32 / 100.0 - 10.0
            })
            .collect();
        let t: QuantTensor = quantize(formats[pick], h, l, &data).unwrap();
        for packing in [WeightPacking::Cpu { hp: 8, lp: 8 }, WeightPacking::Gpu { lp: 32 }] {
            let p = pack_weights(&t, packing).unwrap();
            prop_assert_eq!(p.unpack().unwrap(), t.clone());
        }
    }
}
