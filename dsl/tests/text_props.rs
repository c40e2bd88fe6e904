//! Property tests for the text form: random valid kernels (matmul and
//! attention, every format, tiled and permuted layouts, any f32 softmax
//! parameters) round-trip exactly; random token streams and mutations of
//! valid texts never make the parser (or verify) panic.

use proptest::array::{uniform3, uniform4, uniform5};
use proptest::prelude::*;
use proptest::sample::select;
use tessera_dsl::*;

// ---------------------------------------------------------------- generators

fn ident() -> impl Strategy<Value = String> {
    "[a-zA-Z_][a-zA-Z0-9_]{0,5}"
}

/// `n` distinct identifiers in random order.
fn names(n: usize) -> impl Strategy<Value = Vec<String>> {
    prop::collection::btree_set(ident(), n)
        .prop_map(|s| s.into_iter().collect::<Vec<_>>())
        .prop_shuffle()
}

fn kernel_name() -> impl Strategy<Value = String> {
    "[a-zA-Z_][a-zA-Z0-9_-]{0,15}"
}

fn extent() -> impl Strategy<Value = Extent> {
    prop_oneof![Just(Extent::Dyn), (1u32..=1 << 20).prop_map(Extent::Fixed)]
}

fn tile_size() -> impl Strategy<Value = Option<TileSize>> {
    prop::option::of(prop_oneof![
        Just(TileSize::Solve),
        (1u32..=512).prop_map(TileSize::Fixed)
    ])
}

fn group() -> impl Strategy<Value = Group> {
    prop_oneof![
        Just(Group::Row),
        (1u32..=64).prop_map(|n| Group::Size(4 * n))
    ]
}

fn weight_format() -> impl Strategy<Value = Format> {
    prop_oneof![
        select(vec![Format::F32, Format::F16, Format::BF16]),
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

fn plain_float() -> impl Strategy<Value = Format> {
    select(vec![Format::F32, Format::F16, Format::BF16])
}

/// How one tensor is laid out: which dims are split by their tile, a sort
/// key per layout dim (the permutation) and the pair-transpose wish.
#[derive(Clone, Debug)]
struct LayoutPlan {
    split: [bool; 3],
    keys: [u32; 6],
    pair_transpose: bool,
}

fn layout_plan() -> impl Strategy<Value = LayoutPlan> {
    (any::<[bool; 3]>(), any::<[u32; 6]>(), any::<bool>()).prop_map(
        |(split, keys, pair_transpose)| LayoutPlan {
            split,
            keys,
            pair_transpose,
        },
    )
}

/// Sort `items` by `keys` (stable), the permutation a strategy chose.
fn permute<T>(items: Vec<T>, keys: &[u32]) -> Vec<T> {
    let mut keyed: Vec<(u32, T)> = items
        .into_iter()
        .enumerate()
        .map(|(i, t)| (keys.get(i).copied().unwrap_or(0), t))
        .collect();
    keyed.sort_by_key(|(k, _)| *k);
    keyed.into_iter().map(|(_, t)| t).collect()
}

fn make_layout(
    dims: &[&str],
    tiles: &[TileVar],
    format: Format,
    plan: &LayoutPlan,
    outermost: Option<&str>,
) -> Layout {
    let mut parts = Vec::new();
    for (i, d) in dims.iter().enumerate() {
        match tiles.iter().find(|t| t.axis == *d) {
            Some(t) if plan.split.get(i).copied().unwrap_or(false) => {
                parts.push(LayoutDim::outer(d, &t.name));
                parts.push(LayoutDim::inner(&t.name));
            }
            _ => parts.push(LayoutDim::whole(d)),
        }
    }
    let mut dims = permute(parts, &plan.keys);
    if let Some(s) = outermost {
        let first = dims.iter().position(|d| match d {
            LayoutDim::Whole(a) => a == s,
            LayoutDim::Outer { axis, .. } => axis == s,
            LayoutDim::Inner { .. } => false,
        });
        if let Some(i) = first {
            let d = dims.remove(i);
            dims.insert(0, d);
        }
    }
    Layout {
        dims,
        int4_pair_transpose: plan.pair_transpose && format.bits() == 4,
        int4_signed_codes: false,
    }
}

fn tensor(name: &str, role: Role, dims: &[&str], format: Format, layout: Layout) -> Tensor {
    Tensor {
        name: name.into(),
        role,
        dims: dims.iter().map(|d| d.to_string()).collect(),
        format,
        layout,
    }
}

fn make_tiles(axes: &[String], tile_names: &[String], sizes: &[Option<TileSize>]) -> Vec<TileVar> {
    axes.iter()
        .zip(tile_names)
        .zip(sizes)
        .filter_map(|((a, n), s)| {
            s.map(|size| TileVar {
                name: n.clone(),
                axis: a.clone(),
                size,
            })
        })
        .collect()
}

/// Which axes to run in parallel (and in what order), and whether to split
/// the reduce axis.
#[derive(Clone, Debug)]
struct SchedulePlan {
    parallel: [bool; 5],
    keys: [u32; 5],
    split: bool,
}

fn schedule_plan() -> impl Strategy<Value = SchedulePlan> {
    (any::<[bool; 5]>(), any::<[u32; 5]>(), any::<bool>()).prop_map(|(parallel, keys, split)| {
        SchedulePlan {
            parallel,
            keys,
            split,
        }
    })
}

fn make_schedule(
    axes: &[String],
    reduce: &str,
    tiles: Vec<TileVar>,
    plan: &SchedulePlan,
    tile_keys: &[u32],
) -> Schedule {
    let pick = |mask: &[bool; 5]| {
        let chosen: Vec<String> = axes
            .iter()
            .zip(mask)
            .filter(|(a, m)| **m && a.as_str() != reduce)
            .map(|(a, _)| a.clone())
            .collect();
        permute(chosen, &plan.keys)
    };
    Schedule {
        tiles: permute(tiles, tile_keys),
        // verify() rejects a parallel reduce axis (threads would race).
        parallel: pick(&plan.parallel),
        split: plan.split.then(|| reduce.to_string()),
    }
}

fn activation() -> impl Strategy<Value = Activation> {
    select(vec![Activation::None, Activation::Relu, Activation::Silu])
}

prop_compose! {
    fn matmul_kernel()(
        kname in kernel_name(),
        ids in names(6),
        tnames in names(4),
        extents in uniform3(extent()),
        sizes in uniform3(tile_size()),
        formats in (
            select(vec![Format::F32, Format::F16, Format::BF16, Format::I8Dyn]),
            weight_format(),
            plain_float(),
            plain_float(),
        ),
        layouts in uniform4(layout_plan()),
        (bias, act) in (any::<bool>(), activation()),
        sched in schedule_plan(),
        order in any::<[u32; 10]>(),
    ) -> Kernel {
        let (e, h, l) = (ids[0].clone(), ids[1].clone(), ids[2].clone());
        let axis_names = vec![e.clone(), h.clone(), l.clone()];
        let kinds = [AxisKind::Spatial, AxisKind::Spatial, AxisKind::Reduce];
        let axes: Vec<Axis> = axis_names
            .iter()
            .zip(extents)
            .zip(kinds)
            .map(|((n, extent), kind)| Axis { name: n.clone(), extent, kind })
            .collect();
        let tiles = make_tiles(&axis_names, &ids[3..6], &sizes);
        let (xf, wf, yf, bf) = formats;
        let (x, w, y, b) = (&tnames[0], &tnames[1], &tnames[2], &tnames[3]);
        let mut tensors = vec![
            tensor(x, Role::Input, &[&e, &l], xf, make_layout(&[&e, &l], &tiles, xf, &layouts[0], None)),
            tensor(w, Role::Weight, &[&h, &l], wf, make_layout(&[&h, &l], &tiles, wf, &layouts[1], None)),
            tensor(y, Role::Output, &[&e, &h], yf, make_layout(&[&e, &h], &tiles, yf, &layouts[2], None)),
        ];
        if bias {
            tensors.push(tensor(b, Role::Input, &[&h], bf, make_layout(&[&h], &tiles, bf, &layouts[3], None)));
        }
        let schedule = make_schedule(&axis_names, &l, tiles, &sched, &order[3..6]);
        Kernel {
            name: kname,
            axes: permute(axes, &order[0..3]),
            tensors: permute(tensors, &order[6..10]),
            op: Op::Matmul(Matmul {
                x: x.clone(),
                w: w.clone(),
                y: y.clone(),
                e,
                h,
                l,
                epilogue: Epilogue {
                    scale: xf.is_quantized() || wf.is_quantized(),
                    zero_point: wf.is_asymmetric(),
                    bias: bias.then(|| b.clone()),
                    activation: act,
                },
            }),
            schedule,
        }
    }
}

fn finite_f32() -> impl Strategy<Value = f32> {
    prop_oneof![
        any::<f32>().prop_filter("finite", |x| x.is_finite()),
        -100.0f32..100.0,
    ]
}

fn softmax() -> impl Strategy<Value = SoftmaxMode> {
    let bound = prop_oneof![
        4 => any::<f32>().prop_filter("not NaN", |x| !x.is_nan()),
        1 => -100.0f32..100.0,
    ];
    prop_oneof![
        Just(SoftmaxMode::Online),
        (finite_f32(), bound.clone(), bound)
            .prop_filter("lo != hi", |(_, a, b)| a != b)
            .prop_map(|(phi, a, b)| SoftmaxMode::Async {
                phi,
                lo: a.min(b),
                hi: a.max(b),
            }),
    ]
}

prop_compose! {
    fn attention_kernel()(
        kname in kernel_name(),
        ids in names(10),
        tnames in names(4),
        decode in any::<bool>(),
        extents in (extent(), prop::option::of((1u32..=64, 1u32..=8)), extent(), extent()),
        sizes in uniform5(tile_size()),
        formats in (
            plain_float(),
            select(vec![
                Format::F32, Format::F16, Format::BF16,
                Format::I8Asym(Group::Row, ParamType::F32), Format::U4Asym(Group::Row, ParamType::F32),
            ]),
            select(vec![
                Format::F32, Format::F16, Format::BF16, Format::Fp8E4M3,
                Format::Fp8E5M2, Format::I8Asym(Group::Row, ParamType::F32),
            ]),
            plain_float(),
        ),
        layouts in uniform4(layout_plan()),
        (q_prescaled, softmax) in (any::<bool>(), softmax()),
        sched in schedule_plan(),
        order in any::<[u32; 14]>(),
    ) -> Kernel {
        let n: Vec<String> = ids[..5].to_vec();
        let (t, hq, kvh, d, s) = (&n[0], &n[1], &n[2], &n[3], &n[4]);
        let (t_extent, heads, d_extent, s_extent) = extents;
        let t_extent = match (decode, t_extent) {
            (true, Extent::Fixed(_)) => Extent::Fixed(1),
            (_, x) => x,
        };
        let (hq_extent, kvh_extent) = match heads {
            Some((kv, group)) => (Extent::Fixed(kv * group), Extent::Fixed(kv)),
            None => (Extent::Dyn, Extent::Dyn),
        };
        let spatial = AxisKind::Spatial;
        let axes = vec![
            Axis { name: t.clone(), extent: t_extent, kind: spatial },
            Axis { name: hq.clone(), extent: hq_extent, kind: spatial },
            Axis { name: kvh.clone(), extent: kvh_extent, kind: spatial },
            Axis { name: d.clone(), extent: d_extent, kind: spatial },
            Axis { name: s.clone(), extent: s_extent, kind: AxisKind::Reduce },
        ];
        let tiles = make_tiles(&n, &ids[5..10], &sizes);
        let (qf, kf, vf, of) = formats;
        let qdims = [t.as_str(), hq, d];
        let kdims = [s.as_str(), kvh, d];
        let tensors = vec![
            tensor(&tnames[0], Role::Input, &qdims, qf, make_layout(&qdims, &tiles, qf, &layouts[0], None)),
            tensor(&tnames[1], Role::Cache, &kdims, kf, make_layout(&kdims, &tiles, kf, &layouts[1], Some(s))),
            tensor(&tnames[2], Role::Cache, &kdims, vf, make_layout(&kdims, &tiles, vf, &layouts[2], Some(s))),
            tensor(&tnames[3], Role::Output, &qdims, of, make_layout(&qdims, &tiles, of, &layouts[3], None)),
        ];
        let schedule = make_schedule(&n, s, tiles, &sched, &order[5..10]);
        Kernel {
            name: kname,
            axes: permute(axes, &order[0..5]),
            tensors: permute(tensors, &order[10..14]),
            op: Op::Attention(Attention {
                kind: if decode { AttentionKind::Decode } else { AttentionKind::Prefill },
                q: tnames[0].clone(),
                k: tnames[1].clone(),
                v: tnames[2].clone(),
                o: tnames[3].clone(),
                tokens: t.clone(),
                heads: hq.clone(),
                kv_heads: kvh.clone(),
                head_dim: d.clone(),
                seq: s.clone(),
                q_prescaled,
                softmax,
            }),
            schedule,
        }
    }
}

fn valid_kernel() -> impl Strategy<Value = Kernel> {
    prop_oneof![matmul_kernel(), attention_kernel()]
}

// ---------------------------------------------------------------- round trip

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_valid_kernels_round_trip(k in valid_kernel()) {
        prop_assert_eq!(verify(&k), Ok(()), "generator made an invalid kernel:\n{}", k);
        let text = k.to_string();
        let parsed: Kernel = text.parse().map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
        prop_assert_eq!(&parsed, &k);
        if let (Some(a), Some(b)) = (parsed.as_attention(), k.as_attention())
            && let (SoftmaxMode::Async { phi, lo, hi }, SoftmaxMode::Async { phi: p, lo: l, hi: h }) =
                (a.softmax, b.softmax)
        {
            // Bit-exact, not just ==.
            prop_assert_eq!((phi.to_bits(), lo.to_bits(), hi.to_bits()), (p.to_bits(), l.to_bits(), h.to_bits()));
        }
        prop_assert_eq!(parsed.to_string(), text);
    }
}

// ---------------------------------------------------------------- fuzz

const VOCAB: &[&str] = &[
    "kernel",
    "axis",
    "tile",
    "of",
    "input",
    "weight",
    "output",
    "cache",
    "matmul",
    "attention",
    "parallel",
    "split",
    "layout",
    "pair-transpose",
    "epilogue",
    "scale",
    "zero-point",
    "bias",
    "act",
    "none",
    "relu",
    "silu",
    "decode",
    "prefill",
    "softmax",
    "online",
    "async",
    "phi",
    "lo",
    "hi",
    "q-prescaled",
    "dyn",
    "reduce",
    "spatial",
    "solve",
    "e",
    "h",
    "l",
    "x",
    "w",
    "y",
    "b",
    "hp",
    "lp",
    "t",
    "hq",
    "kvh",
    "d",
    "s",
    "q",
    "k",
    "v",
    "o",
    "f32",
    "f16",
    "bf16",
    "i8dyn",
    "u4asym",
    "i8sym",
    "i8asym",
    "e0m4",
    "fp8e4m3",
    "fp8e5m2",
    "g32",
    "g0",
    "row",
    "0",
    "1",
    "32",
    "4096",
    "99999999999",
    "-1.5",
    "1e-7",
    "inf",
    "-inf",
    "NaN",
    "-",
    "+",
    ".",
    "[",
    "]",
    "(",
    ")",
    ",",
    ":",
    "/",
    "=",
    "*",
    "#",
    "\n",
    "\n",
    "\n",
    "\t",
    "\r",
    "é",
    "\u{1F600}",
    "\u{0}",
];

fn token_stream() -> impl Strategy<Value = String> {
    (
        any::<bool>(),
        prop::collection::vec((0..VOCAB.len(), any::<bool>()), 0..80),
    )
        .prop_map(|(header, toks)| {
            let mut s = if header {
                "kernel k\n".to_string()
            } else {
                String::new()
            };
            for (i, space) in toks {
                s.push_str(VOCAB[i]);
                if space {
                    s.push(' ');
                }
            }
            s
        })
}

/// Parsing must not panic; whatever parses is valid and round-trips.
fn check_parse(text: &str) -> Result<(), TestCaseError> {
    if let Ok(k) = text.parse::<Kernel>() {
        prop_assert_eq!(verify(&k), Ok(()));
        let printed = k.to_string();
        let reparsed = printed.parse::<Kernel>();
        prop_assert_eq!(reparsed, Ok(k));
    }
    if let Ok(k) = text::parse_unverified(text) {
        let _ = verify(&k);
        let _ = k.to_string();
    }
    for line in text.lines() {
        let _ = line.parse::<Format>();
        let _ = line.parse::<Group>();
        let _ = line.parse::<Layout>();
    }
    Ok(())
}

/// Pieces whose concatenation is the text: runs of word characters, runs of
/// whitespace, single other characters.
fn pieces(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let class = |c: char| {
        if c.is_alphanumeric() || c == '_' || c == '-' || c == '.' {
            0
        } else if c.is_whitespace() {
            1
        } else {
            2
        }
    };
    for c in text.chars() {
        match out.last_mut() {
            Some(last) if class(c) != 2 && last.chars().last().map(class) == Some(class(c)) => {
                last.push(c)
            }
            _ => out.push(c.to_string()),
        }
    }
    out
}

#[derive(Clone, Debug)]
enum Mutation {
    Delete(usize),
    Duplicate(usize),
    Swap(usize, usize),
    Insert(usize, usize),
    TruncateChars(usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        any::<usize>().prop_map(Mutation::Delete),
        any::<usize>().prop_map(Mutation::Duplicate),
        (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Mutation::Swap(a, b)),
        (any::<usize>(), 0..VOCAB.len()).prop_map(|(a, v)| Mutation::Insert(a, v)),
        any::<usize>().prop_map(Mutation::TruncateChars),
    ]
}

fn mutate(text: &str, muts: &[Mutation]) -> String {
    let mut p = pieces(text);
    for m in muts {
        let n = p.len().max(1);
        match *m {
            Mutation::Delete(i) if !p.is_empty() => {
                p.remove(i % n);
            }
            Mutation::Duplicate(i) if !p.is_empty() => {
                let x = p[i % n].clone();
                p.insert(i % n, x);
            }
            Mutation::Swap(a, b) if !p.is_empty() => p.swap(a % n, b % n),
            Mutation::Insert(i, v) => p.insert(i % (p.len() + 1), VOCAB[v].to_string()),
            Mutation::TruncateChars(i) => {
                let joined: String = p.concat();
                let keep = i % (joined.chars().count() + 1);
                p = vec![joined.chars().take(keep).collect()];
                p = pieces(&p.concat());
            }
            _ => {}
        }
    }
    p.concat()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_token_streams_never_panic(text in token_stream()) {
        check_parse(&text)?;
    }

    #[test]
    fn arbitrary_strings_never_panic(text in any::<String>()) {
        check_parse(&text)?;
    }

    #[test]
    fn mutated_valid_texts_never_panic(
        k in valid_kernel(),
        muts in prop::collection::vec(mutation(), 1..6),
    ) {
        let text = mutate(&k.to_string(), &muts);
        check_parse(&text)?;
    }
}

// ---------------------------------------------------------------- IR mutations

const POOL: &[&str] = &[
    "e", "h", "l", "x", "w", "y", "b", "hp", "lp", "s", "t", "d", "q", "k", "v", "o", "", "1x",
    "a-b",
];

/// One small edit of a kernel's IR: `what` picks the field, `i` and `j`
/// pick the element and the new value (both taken modulo what exists).
fn mutate_ir(k: &mut Kernel, what: u8, i: usize, j: usize) {
    let name = POOL[j % POOL.len()].to_string();
    let formats = Format::examples();
    let format = formats[j % formats.len()];
    let na = k.axes.len().max(1);
    let nt = k.tensors.len().max(1);
    let ntile = k.schedule.tiles.len().max(1);
    match what % 14 {
        0 => {
            if let Some(a) = k.axes.get_mut(i % na) {
                a.name = name;
            }
        }
        1 => {
            if let Some(a) = k.axes.get_mut(i % na) {
                a.extent = if j.is_multiple_of(3) {
                    Extent::Dyn
                } else {
                    Extent::Fixed((j % 5) as u32)
                };
            }
        }
        2 => {
            if let Some(a) = k.axes.get_mut(i % na) {
                a.kind = if j.is_multiple_of(2) {
                    AxisKind::Spatial
                } else {
                    AxisKind::Reduce
                };
            }
        }
        3 => {
            if let Some(t) = k.tensors.get_mut(i % nt) {
                t.format = format;
            }
        }
        4 => {
            if let Some(t) = k.tensors.get_mut(i % nt) {
                t.layout.int4_pair_transpose ^= true;
            }
        }
        5 => {
            if let Some(t) = k.tensors.get_mut(i % nt) {
                let n = t.layout.dims.len().max(1);
                t.layout.dims.swap(i % n, j % n);
                if j.is_multiple_of(4) && !t.layout.dims.is_empty() {
                    t.layout.dims.remove(j % n);
                }
            }
        }
        6 => {
            if let Some(t) = k.tensors.get_mut(i % nt) {
                t.role = [Role::Input, Role::Weight, Role::Output, Role::Cache][j % 4];
            }
        }
        7 => {
            if let Some(t) = k.tensors.get_mut(i % nt) {
                let n = t.dims.len().max(1);
                if let Some(d) = t.dims.get_mut(j % n) {
                    *d = name;
                }
            }
        }
        8 => {
            if let Some(t) = k.schedule.tiles.get_mut(i % ntile) {
                match j % 3 {
                    0 => t.size = TileSize::Fixed((j % 3) as u32),
                    1 => t.axis = name,
                    _ => t.name = name,
                }
            }
        }
        9 => match &mut k.op {
            Op::Matmul(m) => {
                let slots = [&mut m.x, &mut m.w, &mut m.y, &mut m.e, &mut m.h, &mut m.l];
                if let Some(s) = slots.into_iter().nth(i % 6) {
                    *s = name;
                }
            }
            Op::Attention(a) => {
                let slots = [
                    &mut a.q,
                    &mut a.k,
                    &mut a.v,
                    &mut a.o,
                    &mut a.tokens,
                    &mut a.heads,
                    &mut a.kv_heads,
                    &mut a.head_dim,
                    &mut a.seq,
                ];
                if let Some(s) = slots.into_iter().nth(i % 9) {
                    *s = name;
                }
            }
        },
        10 => match &mut k.op {
            Op::Matmul(m) => match j % 3 {
                0 => m.epilogue.scale ^= true,
                1 => m.epilogue.zero_point ^= true,
                _ => m.epilogue.bias = Some(name),
            },
            Op::Attention(a) => {
                let f = [f32::NAN, f32::INFINITY, 0.0, -1.0, 1.0][j % 5];
                a.softmax = match i % 4 {
                    0 => SoftmaxMode::Online,
                    1 => SoftmaxMode::Async {
                        phi: f,
                        lo: -1.0,
                        hi: 1.0,
                    },
                    2 => SoftmaxMode::Async {
                        phi: 0.0,
                        lo: f,
                        hi: 0.5,
                    },
                    _ => SoftmaxMode::Async {
                        phi: 0.0,
                        lo: -0.5,
                        hi: f,
                    },
                };
                if j.is_multiple_of(2) {
                    a.kind = AttentionKind::Decode;
                }
            }
        },
        11 => match j % 2 {
            0 => k.schedule.parallel.push(name),
            _ => k.schedule.split = Some(name),
        },
        12 => {
            if !k.tensors.is_empty() {
                k.tensors.remove(i % nt);
            }
        }
        _ => {
            if !k.axes.is_empty() && j.is_multiple_of(2) {
                k.axes.remove(i % na);
            } else if !k.schedule.tiles.is_empty() {
                k.schedule.tiles.remove(i % ntile);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// verify never panics on edited kernels; if an edit keeps the kernel
    /// valid, it still round-trips.
    #[test]
    fn mutated_ir_verifies_without_panic(
        k in valid_kernel(),
        edits in prop::collection::vec((any::<u8>(), any::<usize>(), any::<usize>()), 1..4),
    ) {
        let mut k = k;
        for (what, i, j) in edits {
            mutate_ir(&mut k, what, i, j);
        }
        let text = k.to_string();
        if verify(&k).is_ok() {
            prop_assert_eq!(text.parse::<Kernel>(), Ok(k));
        } else {
            check_parse(&text)?;
        }
    }
}

#[test]
fn pieces_concatenate_back() {
    let k = "kernel a-b\naxis e: dyn # é\n";
    assert_eq!(pieces(k).concat(), k);
    assert!(pieces(k).contains(&"a-b".to_string()));
}
