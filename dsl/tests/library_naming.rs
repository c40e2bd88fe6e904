//! Names are a contract: every library and instance name parses back to the
//! same value, the grammar is unambiguous (a parsed name prints as itself),
//! and malformed names are rejected with a message saying what was expected.

use proptest::prelude::*;
use tessera_dsl::library;
use tessera_dsl::naming::*;
use tessera_dsl::*;

#[test]
fn every_library_name_round_trips() {
    for name in library::names() {
        let parsed: LibraryName = name.parse().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(parsed.to_string(), *name);
    }
    assert_eq!(
        "attention-decode-kv8".parse::<LibraryName>().unwrap(),
        LibraryName {
            op: LibraryOp::Attention(AttentionKind::Decode),
            variant: "kv8".into()
        }
    );
}

#[test]
fn malformed_library_names_say_what_was_expected() {
    for (bad, found) in [
        ("", ""),
        ("matmul", "matmul"),
        ("matmul-", ""),
        ("matmul-W4A8", "W4A8"),
        ("matmul-4a8", "4a8"),
        ("matmul-w4-a8", "w4-a8"),
        ("attention-f16", "f16"),
        ("attention-encode-f16", "encode"),
        ("attention-decode-", ""),
        ("conv-f32", "conv"),
        ("matmul_w4a8", "matmul_w4a8"),
    ] {
        let err = bad.parse::<LibraryName>().expect_err(bad);
        let msg = err.to_string();
        assert!(
            msg.contains("expected `matmul-<variant>` or `attention-<decode|prefill>-<variant>`"),
            "{bad}: {msg}"
        );
        assert!(msg.contains(&format!("found `{found}`")), "{bad}: {msg}");
    }
}

const TILES: [MatmulTile; 4] = [
    MatmulTile {
        ep: 10,
        hp: 8,
        lp: 8,
    },
    MatmulTile {
        ep: 12,
        hp: 8,
        lp: 4,
    },
    MatmulTile {
        ep: 1,
        hp: 4,
        lp: 32,
    },
    MatmulTile {
        ep: 8,
        hp: 64,
        lp: 32,
    },
];
const TARGETS: [&str; 4] = ["neon_i8mm", "neon_dotprod", "opencl", "ptx_sm80"];

#[test]
fn every_library_kernel_instance_name_round_trips() {
    let mut seen = std::collections::BTreeSet::new();
    for kernel in library::all() {
        for target in TARGETS {
            let instance = match &kernel.op {
                Op::Matmul(_) => TILES
                    .iter()
                    .map(|&tile| {
                        InstanceName::Matmul(
                            MatmulInstance::for_kernel(&kernel, tile, target).unwrap(),
                        )
                    })
                    .collect::<Vec<_>>(),
                Op::Attention(_) => [64, 128]
                    .iter()
                    .map(|&d| {
                        let block = AttentionBlock {
                            tokens: 1,
                            keys: 64,
                        };
                        InstanceName::Attention(
                            AttentionInstance::for_kernel(&kernel, d, block, target).unwrap(),
                        )
                    })
                    .collect(),
            };
            for name in instance {
                let text = name.to_string();
                assert_eq!(text.parse::<InstanceName>().unwrap(), name, "{text}");
                assert!(seen.insert(text.clone()), "two instances share {text}");
            }
        }
    }
}

#[test]
fn instance_names_of_library_kernels_read_as_documented() {
    let name = |lib: &str, tile: MatmulTile, target: &str| {
        MatmulInstance::for_kernel(&library::get(lib).unwrap(), tile, target)
            .unwrap()
            .to_string()
    };
    assert_eq!(
        name("matmul-w4a8", TILES[0], "neon_i8mm"),
        "matmul_f32_qsi8dxp10x8_qau4g32p8x8s16s0_10x8x8_neon_i8mm"
    );
    assert_eq!(
        name("matmul-w8a8", TILES[1], "neon_dotprod"),
        "matmul_f32_qsi8dxp12x4_qsi8cxp8x4_12x8x4_neon_dotprod"
    );
    assert_eq!(
        name("matmul-f16", TILES[3], "neon_fp16"),
        "matmul_f16_f16_f16p64x32_8x64x32_neon_fp16"
    );
    assert_eq!(
        name("matmul-w4a16", TILES[3], "opencl"),
        "matmul_f32_f16_qau4g32pl32_8x64x32_opencl"
    );
    assert_eq!(
        name("matmul-e0m4a16", TILES[3], "opencl"),
        "matmul_f32_f16_qae0m4g32pl32_8x64x32_opencl"
    );
    let kv8 = library::get("attention-decode-kv8").unwrap();
    let block = AttentionBlock {
        tokens: 1,
        keys: 64,
    };
    assert_eq!(
        AttentionInstance::for_kernel(&kv8, 128, block, "neon_fp16")
            .unwrap()
            .to_string(),
        "attention_decode_f16_f16_qai8cx_f8e4m3_async_d128_1x64_neon_fp16"
    );
}

#[test]
fn a_hand_written_name_parses_to_its_fields() {
    let parsed: InstanceName = "matmul_f32_qsi8dxp4x8_qau4g128p8x8s16s0_4x8x8_neon_i8mm"
        .parse()
        .unwrap();
    let expected = InstanceName::Matmul(MatmulInstance {
        output: Format::F32,
        x: Operand {
            format: Format::I8Dyn,
            packing: Packing::Blocked { rows: 4, cols: 8 },
            int4_pair_transpose: false,
            int4_signed_codes: false,
        },
        w: Operand {
            format: Format::U4Asym(Group::Size(128), ParamType::F32),
            packing: Packing::Blocked { rows: 8, cols: 8 },
            int4_pair_transpose: true,
            int4_signed_codes: false,
        },
        tile: MatmulTile {
            ep: 4,
            hp: 8,
            lp: 8,
        },
        target: "neon_i8mm".into(),
    });
    assert_eq!(parsed, expected);

    let parsed: InstanceName = "attention_prefill_f32_bf16_qsi8g64_f8e5m2_online_d80_16x32_clif"
        .parse()
        .unwrap();
    let expected = InstanceName::Attention(AttentionInstance {
        kind: AttentionKind::Prefill,
        output: Format::F32,
        q: Format::BF16,
        k: Format::I8Sym(Group::Size(64), ParamType::F32),
        v: Format::Fp8E5M2,
        softmax: SoftmaxKind::Online,
        head_dim: 80,
        block: AttentionBlock {
            tokens: 16,
            keys: 32,
        },
        target: "clif".into(),
    });
    assert_eq!(parsed, expected);
}

#[test]
fn malformed_instance_names_say_what_was_expected() {
    let cases = [
        ("", "`matmul_...` or `attention_...`", ""),
        (
            "gemm_f32_f32_f32_1x1x1_neon",
            "`matmul_...` or `attention_...`",
            "gemm",
        ),
        ("matmul_f64_f32_f32_1x1x1_neon", "the output format", "f64"),
        (
            "matmul_f32_qsi8dxp10_f32_1x1x1_neon",
            "the activations as an operand",
            "qsi8dxp10",
        ),
        (
            "matmul_f32_f32_qau4g032_1x1x1_neon",
            "the weights as an operand",
            "qau4g032",
        ),
        (
            "matmul_f32_f32_qau4_1x1x1_neon",
            "the weights as an operand",
            "qau4",
        ),
        (
            "matmul_f32_f32_qau4g32s16s0p8x8_1x1x1_neon",
            "the weights",
            "qau4g32s16s0p8x8",
        ),
        (
            "matmul_f32_f32_f32_10x8_neon",
            "a tile <ep>x<hp>x<lp>",
            "10x8",
        ),
        (
            "matmul_f32_f32_f32_0x8x8_neon",
            "a tile <ep>x<hp>x<lp>",
            "0x8x8",
        ),
        (
            "matmul_f32_f32_f32_99999999999x8x8_neon",
            "a tile",
            "99999999999x8x8",
        ),
        ("matmul_f32_f32_f32_10x8x8", "a target", ""),
        ("matmul_f32_f32_f32_10x8x8_Neon", "a target", "Neon"),
        ("matmul_f32_f32_f32_10x8x8_neon_", "a target", "neon_"),
        (
            "matmul_f32_f32_f32_10x8x8_neon__i8mm",
            "a target",
            "neon__i8mm",
        ),
        ("matmul_f32_f32", "the weights", ""),
        (
            "attention_encode_f16_f16_f16_f16_online_d128_1x64_neon",
            "the phase",
            "encode",
        ),
        (
            "attention_decode_f16_f16_f16p8x8_f16_online_d128_1x64_neon",
            "the k format",
            "f16p8x8",
        ),
        (
            "attention_decode_f16_f16_f16_f16_fast_d128_1x64_neon",
            "the softmax",
            "fast",
        ),
        (
            "attention_decode_f16_f16_f16_f16_async_128_1x64_neon",
            "the head dimension",
            "128",
        ),
        (
            "attention_decode_f16_f16_f16_f16_async_d128_1x64x2_neon",
            "a block",
            "1x64x2",
        ),
    ];
    for (bad, expected, found) in cases {
        let err = bad.parse::<InstanceName>().expect_err(bad);
        let msg = err.to_string();
        assert!(msg.contains(&format!("name `{bad}`")), "{bad}: {msg}");
        assert!(
            msg.contains(&format!("expected {expected}")),
            "{bad}: {msg}"
        );
        assert!(msg.contains(&format!("found `{found}`")), "{bad}: {msg}");
    }
}

/// The reason of an `Unnameable` error.
fn reason<T: std::fmt::Debug>(result: Result<T, NamingError>) -> String {
    match result {
        Err(NamingError::Unnameable { reason, .. }) => reason,
        other => panic!("expected Unnameable, got {other:?}"),
    }
}

#[test]
fn kernels_that_cannot_be_named_say_why() {
    let mm = library::get("matmul-f32").unwrap();
    let att = library::get("attention-decode-f16").unwrap();
    let tile = TILES[0];
    let block = AttentionBlock {
        tokens: 1,
        keys: 64,
    };

    assert_eq!(
        reason(MatmulInstance::for_kernel(&att, tile, "neon")),
        "not a matmul"
    );
    assert_eq!(
        reason(AttentionInstance::for_kernel(&mm, 128, block, "neon")),
        "not an attention kernel"
    );
    assert!(reason(MatmulInstance::for_kernel(&mm, tile, "Neon")).contains("target `Neon`"));

    let mut fixed = mm.clone();
    fixed.schedule.tiles[0].size = TileSize::Fixed(4);
    assert_eq!(
        reason(MatmulInstance::for_kernel(&fixed, tile, "neon")),
        "tile `ep` is fixed at 4, the instance uses 10"
    );
    // Fixed at the instance's size is fine.
    fixed.schedule.tiles[0].size = TileSize::Fixed(10);
    assert!(MatmulInstance::for_kernel(&fixed, tile, "neon").is_ok());

    let mut transposed = mm.clone();
    let w = transposed
        .tensors
        .iter_mut()
        .find(|t| t.name == "w")
        .unwrap();
    w.layout = Layout::row_major(&["l", "h"]);
    assert_eq!(
        reason(MatmulInstance::for_kernel(&transposed, tile, "neon")),
        "layout of `w` has no name"
    );

    let mut d128 = att.clone();
    d128.axes.iter_mut().find(|a| a.name == "d").unwrap().extent = Extent::Fixed(128);
    assert!(AttentionInstance::for_kernel(&d128, 128, block, "neon").is_ok());
    assert_eq!(
        reason(AttentionInstance::for_kernel(&d128, 64, block, "neon")),
        "head dimension is fixed at 128, the instance uses 64"
    );
}

fn group() -> impl Strategy<Value = Group> {
    prop_oneof![Just(Group::Row), (1u32..=4096).prop_map(Group::Size)]
}

fn format() -> impl Strategy<Value = Format> {
    prop_oneof![
        prop::sample::select(vec![
            Format::F32,
            Format::F16,
            Format::BF16,
            Format::I8Dyn,
            Format::Fp8E4M3,
            Format::Fp8E5M2,
        ]),
        (group(), params()).prop_map(|(g, p)| Format::U4Asym(g, p)),
        (group(), params()).prop_map(|(g, p)| Format::U4Sym(g, p)),
        (group(), params()).prop_map(|(g, p)| Format::I8Sym(g, p)),
        (group(), params()).prop_map(|(g, p)| Format::I8Asym(g, p)),
        (group(), params()).prop_map(|(g, p)| Format::E0M4(g, p)),
    ]
}

fn params() -> impl Strategy<Value = ParamType> {
    prop_oneof![Just(ParamType::F32), Just(ParamType::F16)]
}

fn size() -> impl Strategy<Value = u32> {
    prop_oneof![1u32..=64, 1u32..=u32::MAX]
}

fn operand() -> impl Strategy<Value = Operand> {
    let packing = prop_oneof![
        Just(Packing::RowMajor),
        (size(), size()).prop_map(|(rows, cols)| Packing::Blocked { rows, cols }),
        size().prop_map(|k| Packing::Columns { k }),
    ];
    // Signed codes exist only for u4sym (KleidiAI's `qsi4`).
    (format(), packing, any::<bool>(), any::<bool>()).prop_map(
        |(format, packing, int4_pair_transpose, signed)| Operand {
            format,
            packing,
            int4_pair_transpose,
            int4_signed_codes: signed && matches!(format, Format::U4Sym(..)),
        },
    )
}

fn target() -> impl Strategy<Value = String> {
    prop::collection::vec("[a-z0-9]{1,6}", 1..4).prop_map(|tokens| tokens.join("_"))
}

fn instance() -> impl Strategy<Value = InstanceName> {
    let matmul = (
        format(),
        operand(),
        operand(),
        (size(), size(), size()),
        target(),
    )
        .prop_map(|(output, x, w, (ep, hp, lp), target)| {
            InstanceName::Matmul(MatmulInstance {
                output,
                x,
                w,
                tile: MatmulTile { ep, hp, lp },
                target,
            })
        });
    let kind = prop_oneof![Just(AttentionKind::Decode), Just(AttentionKind::Prefill)];
    let softmax = prop_oneof![Just(SoftmaxKind::Online), Just(SoftmaxKind::Async)];
    let attention = (
        kind,
        (format(), format(), format(), format()),
        softmax,
        (size(), size(), size()),
        target(),
    )
        .prop_map(
            |(kind, (output, q, k, v), softmax, (head_dim, tokens, keys), target)| {
                InstanceName::Attention(AttentionInstance {
                    kind,
                    output,
                    q,
                    k,
                    v,
                    softmax,
                    head_dim,
                    block: AttentionBlock { tokens, keys },
                    target,
                })
            },
        );
    prop_oneof![matmul, attention]
}

/// Mutations that keep names close to valid ones, where ambiguity would hide.
#[derive(Clone, Debug)]
enum Edit {
    Delete(usize),
    Insert(usize, char),
    Replace(usize, char),
}

fn edit() -> impl Strategy<Value = Edit> {
    let ch = prop::sample::select("abcdefgilmopqstux0123456789_-".chars().collect::<Vec<_>>());
    prop_oneof![
        any::<usize>().prop_map(Edit::Delete),
        (any::<usize>(), ch.clone()).prop_map(|(i, c)| Edit::Insert(i, c)),
        (any::<usize>(), ch).prop_map(|(i, c)| Edit::Replace(i, c)),
    ]
}

fn apply(name: &str, edits: &[Edit]) -> String {
    let mut chars: Vec<char> = name.chars().collect();
    for e in edits {
        let n = chars.len();
        match *e {
            Edit::Delete(i) if n > 0 => {
                chars.remove(i % n);
            }
            Edit::Insert(i, c) => chars.insert(i % (n + 1), c),
            Edit::Replace(i, c) if n > 0 => chars[i % n] = c,
            _ => {}
        }
    }
    chars.into_iter().collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn any_instance_name_round_trips(name in instance()) {
        let text = name.to_string();
        prop_assert_eq!(text.parse::<InstanceName>().unwrap(), name);
    }

    /// Parsing never panics, and whatever parses prints back as exactly the
    /// input: one value, one spelling.
    #[test]
    fn edited_names_parse_canonically_or_fail(
        name in instance(),
        edits in prop::collection::vec(edit(), 1..4),
    ) {
        let text = apply(&name.to_string(), &edits);
        if let Ok(parsed) = text.parse::<InstanceName>() {
            prop_assert_eq!(parsed.to_string(), text);
        }
    }

    #[test]
    fn edited_library_names_parse_canonically_or_fail(
        index in 0..library::names().len(),
        edits in prop::collection::vec(edit(), 1..4),
    ) {
        let text = apply(library::names()[index], &edits);
        if let Ok(parsed) = text.parse::<LibraryName>() {
            prop_assert_eq!(parsed.to_string(), text);
        }
    }
}
