//! `verify` never panics on arbitrary IR (names from a small pool so that
//! references sometimes resolve, any extents, formats, layouts and floats),
//! and whatever it accepts prints and parses back to itself.

use proptest::prelude::*;
use proptest::sample::select;
use tessera_dsl::*;

const AXES: &[&str] = &["e", "h", "l", "t", "s", "d", "hq"];
const TILES: &[&str] = &["ep", "hp", "lp", "sp"];
const TENSORS: &[&str] = &["x", "w", "y", "b", "q", "k", "v", "o"];
const BAD: &[&str] = &["", "9", "a-b", "é", "h"];

/// Mostly a name from `pool`, rarely a malformed or clashing one.
fn from(pool: &'static [&'static str]) -> impl Strategy<Value = String> {
    prop_oneof![
        30 => select(pool).prop_map(str::to_string),
        1 => select(BAD).prop_map(str::to_string),
    ]
}

/// Distinct names from `pool` in random order, plus rarely one extra
/// (possibly duplicate or malformed) name.
fn declared(pool: &'static [&'static str]) -> impl Strategy<Value = Vec<String>> {
    (
        prop::sample::subsequence(pool, 0..=pool.len()).prop_shuffle(),
        prop::option::weighted(0.1, from(pool)),
    )
        .prop_map(|(names, extra)| {
            let mut names: Vec<String> = names.into_iter().map(str::to_string).collect();
            names.extend(extra);
            names
        })
}

/// One strategy-made value per declared name.
fn declare<T: std::fmt::Debug>(
    pool: &'static [&'static str],
    item: impl Strategy<Value = T>,
    make: fn(String, T) -> T,
) -> impl Strategy<Value = Vec<T>> {
    (declared(pool), prop::collection::vec(item, pool.len() + 1)).prop_map(move |(names, items)| {
        names
            .into_iter()
            .zip(items)
            .map(|(n, t)| make(n, t))
            .collect()
    })
}

fn axis_names(max: usize) -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(from(AXES), 0..=max)
}

fn format() -> impl Strategy<Value = Format> {
    let group = prop_oneof![Just(Group::Row), (0u32..70).prop_map(Group::Size)];
    prop_oneof![
        select(Format::examples()),
        group
            .clone()
            .prop_map(|g| Format::U4Asym(g, ParamType::F32)),
        group.clone().prop_map(|g| Format::U4Sym(g, ParamType::F16)),
        group.prop_map(|g| Format::I8Asym(g, ParamType::F32)),
    ]
}

fn layout_dim() -> impl Strategy<Value = LayoutDim> {
    prop_oneof![
        from(AXES).prop_map(LayoutDim::Whole),
        (from(AXES), from(TILES)).prop_map(|(axis, tile)| LayoutDim::Outer { axis, tile }),
        from(TILES).prop_map(|tile| LayoutDim::Inner { tile }),
    ]
}

fn tensor() -> impl Strategy<Value = Tensor> {
    (
        from(TENSORS),
        select(vec![Role::Input, Role::Weight, Role::Output, Role::Cache]),
        axis_names(3),
        format(),
        prop::option::of((prop::collection::vec(layout_dim(), 0..5), any::<bool>())),
    )
        .prop_map(|(name, role, dims, format, layout)| {
            let layout = match layout {
                Some((dims, int4_pair_transpose)) => Layout {
                    dims,
                    int4_pair_transpose,
                    int4_signed_codes: false,
                },
                None => Layout::row_major(&dims),
            };
            Tensor {
                name,
                role,
                dims,
                format,
                layout,
            }
        })
}

fn axis() -> impl Strategy<Value = Axis> {
    (
        from(AXES),
        prop_oneof![
            5 => Just(Extent::Dyn),
            5 => (1u32..9).prop_map(Extent::Fixed),
            1 => Just(Extent::Fixed(0)),
        ],
        select(vec![AxisKind::Spatial, AxisKind::Reduce]),
    )
        .prop_map(|(name, extent, kind)| Axis { name, extent, kind })
}

fn tile() -> impl Strategy<Value = TileVar> {
    (
        from(TILES),
        from(AXES),
        prop_oneof![
            5 => Just(TileSize::Solve),
            5 => (1u32..4).prop_map(TileSize::Fixed),
            1 => Just(TileSize::Fixed(0)),
        ],
    )
        .prop_map(|(name, axis, size)| TileVar { name, axis, size })
}

fn op() -> impl Strategy<Value = Op> {
    let matmul = (
        (
            prop::collection::vec(from(TENSORS), 3),
            prop::collection::vec(from(AXES), 3),
        )
            .prop_map(|(mut t, a)| {
                t.extend(a);
                t
            }),
        any::<(bool, bool)>(),
        prop::option::of(from(TENSORS)),
        select(vec![Activation::None, Activation::Relu, Activation::Silu]),
    )
        .prop_map(|(n, (scale, zero_point), bias, activation)| {
            Op::Matmul(Matmul {
                x: n[0].clone(),
                w: n[1].clone(),
                y: n[2].clone(),
                e: n[3].clone(),
                h: n[4].clone(),
                l: n[5].clone(),
                epilogue: Epilogue {
                    scale,
                    zero_point,
                    bias,
                    activation,
                },
            })
        });
    let softmax = prop_oneof![
        Just(SoftmaxMode::Online),
        any::<(f32, f32, f32)>().prop_map(|(phi, lo, hi)| SoftmaxMode::Async { phi, lo, hi }),
    ];
    let attention = (
        (
            prop::collection::vec(from(TENSORS), 4),
            prop::collection::vec(from(AXES), 5),
        )
            .prop_map(|(mut t, a)| {
                t.extend(a);
                t
            }),
        any::<(bool, bool)>(),
        softmax,
    )
        .prop_map(|(n, (decode, q_prescaled), softmax)| {
            Op::Attention(Attention {
                kind: if decode {
                    AttentionKind::Decode
                } else {
                    AttentionKind::Prefill
                },
                q: n[0].clone(),
                k: n[1].clone(),
                v: n[2].clone(),
                o: n[3].clone(),
                tokens: n[4].clone(),
                heads: n[5].clone(),
                kv_heads: n[6].clone(),
                head_dim: n[7].clone(),
                seq: n[8].clone(),
                q_prescaled,
                softmax,
            })
        });
    prop_oneof![matmul, attention]
}

fn kernel() -> impl Strategy<Value = Kernel> {
    (
        prop_oneof![
            10 => select(vec!["k", "matmul-w4a8"]),
            1 => select(vec!["", "-x", "a b"]),
        ],
        declare(AXES, axis(), |name, a| Axis { name, ..a }),
        declare(TENSORS, tensor(), |name, t| Tensor { name, ..t }),
        op(),
        (
            declare(TILES, tile(), |name, t| TileVar { name, ..t }),
            axis_names(3),
            prop::option::of(from(AXES)),
        ),
    )
        .prop_map(
            |(name, axes, tensors, op, (tiles, parallel, split))| Kernel {
                name: name.to_string(),
                axes,
                tensors,
                op,
                schedule: Schedule {
                    tiles,
                    parallel,
                    split,
                },
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn verify_never_panics_and_accepted_kernels_round_trip(k in kernel()) {
        let text = k.to_string();
        match verify(&k) {
            Ok(()) => prop_assert_eq!(text.parse::<Kernel>(), Ok(k)),
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
    }
}
