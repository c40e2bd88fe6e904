//! Differential tests of the x86-avx2 backend against the reference
//! interpreter: every library kernel the backend runs, random inputs, tails
//! in m, n and k, every feasible tile, 1 and 2 threads.

#![cfg(target_arch = "x86_64")]

use tessera_codegen::artifact::{EmitError, Variant};
use tessera_codegen::tile::{Problem, TileConfig, feasible, solve};
use tessera_codegen::x86::{X86Backend, plan};
use tessera_dsl::ir::{Activation, Format, Group, Kernel, ParamType};
use tessera_dsl::library;
use tessera_tests::kernels::set_epilogue as epilogue;
use tessera_tests::reference::{check_host_matmul, check_host_matmul_on};

/// Plain AVX2 (prefetching the weight streams as the tuner's alternatives
/// do), then one backend per `vpdpbusd` encoding this CPU runs
/// (AVX-VNNI's VEX form, AVX512-VNNI's EVEX form on ymm), so each int8
/// dot product is checked natively where it can be.
fn backends() -> Vec<X86Backend> {
    match X86Backend::detect() {
        Ok(b) => {
            // The autotuner's other weight prefetches, so the sweeps run
            // both natively.
            let plain = X86Backend {
                int8_prefetch: tessera_codegen::x86::WeightPrefetch::INT8_CHOICES[1],
                float_prefetch: tessera_codegen::x86::WeightPrefetch::FLOAT_CHOICES[1],
                ..X86Backend::default()
            };
            let mut all = vec![plain];
            if b.vnni {
                all.push(b);
            }
            if b.avx512_vnni {
                all.push(X86Backend { vnni: false, ..b });
            }
            all
        }
        Err(e) => {
            eprintln!("SKIP: {e}");
            vec![]
        }
    }
}

pub fn tiles(kernel: &Kernel) -> Vec<TileConfig> {
    let caps = plan::target();
    let problem = Problem::from_kernel(caps, kernel).unwrap();
    feasible(caps, &problem).unwrap()
}

pub fn best(kernel: &Kernel) -> TileConfig {
    let caps = plan::target();
    let problem = Problem::from_kernel(caps, kernel).unwrap();
    solve(caps, &problem).unwrap()[0]
}

/// Run kernel on random data with (m, n, k) and compare with the oracle.
fn check(
    backend: &X86Backend,
    kernel: &Kernel,
    tile: &TileConfig,
    shapes: &[(usize, usize, usize)],
    seed: u64,
) {
    check_variant(backend, kernel, tile, Variant::Gemm, shapes, seed);
}

/// [`check`] for one variant of the kernel.
fn check_variant(
    backend: &X86Backend,
    kernel: &Kernel,
    tile: &TileConfig,
    variant: Variant,
    shapes: &[(usize, usize, usize)],
    seed: u64,
) {
    let hm = backend
        .load_variant(kernel, tile, variant)
        .unwrap_or_else(|e| panic!("{} {variant} {}: {e}", kernel.name, tile.summary()));
    let what = format!("{variant} tile {}x{}", tile.ep, tile.hp);
    check_host_matmul(&hm, kernel, &what, shapes, seed);
}

const MS: [usize; 7] = [1, 2, 3, 5, 7, 8, 13];
const NS: [usize; 6] = [8, 16, 24, 9, 17, 40];
const KS: [usize; 8] = [1, 7, 31, 32, 33, 64, 100, 257];

fn all_shapes() -> Vec<(usize, usize, usize)> {
    let mut v = Vec::new();
    for &m in &MS {
        for &n in &NS {
            for &k in &KS {
                v.push((m, n, k));
            }
        }
    }
    v
}

fn some_shapes() -> Vec<(usize, usize, usize)> {
    vec![
        (1, 9, 33),
        (3, 40, 7),
        (7, 17, 257),
        (13, 24, 64),
        (2, 8, 1),
    ]
}

fn best_tile_all_shapes(name: &str) {
    let kernel = library::get(name).unwrap();
    for b in backends() {
        check(&b, &kernel, &best(&kernel), &all_shapes(), 1);
    }
}

/// Every feasible tile runs (the solver offers no tile the emitter must
/// refuse).
fn every_tile(name: &str) {
    let kernel = library::get(name).unwrap();
    for b in backends() {
        for t in tiles(&kernel) {
            if let Err(e) = b.emit_code(&kernel, &t) {
                panic!("{name} {}: {e}", t.summary());
            }
            check(
                &b,
                &kernel,
                &t,
                &some_shapes(),
                t.ep as u64 * 100 + t.hp as u64,
            );
        }
    }
}

/// The solver's tiles for a small real M (what the autotuner asks for the
/// flat-GEMM and GEMV variants): the best and a few more.
fn tiles_for_m(kernel: &Kernel, m: u64) -> Vec<TileConfig> {
    let caps = plan::target();
    let mut problem = Problem::from_kernel(caps, kernel).unwrap();
    problem.e = m;
    solve(caps, &problem).unwrap().into_iter().take(3).collect()
}

/// A variant over every shape of [`all_shapes`] (tails in m, n and k, m past
/// the tile's rows) with the solver's best tile, and over a few shapes with
/// the best tiles for M = 1, 4 and 8.
fn variant_all_shapes(name: &str, variant: Variant) {
    let kernel = library::get(name).unwrap();
    for b in backends() {
        check_variant(&b, &kernel, &best(&kernel), variant, &all_shapes(), 21);
        for m in [1, 4, 8] {
            for t in tiles_for_m(&kernel, m) {
                check_variant(&b, &kernel, &t, variant, &some_shapes(), 22 + m);
            }
        }
    }
}

#[test]
fn flat_gemm_f32() {
    variant_all_shapes("matmul-f32", Variant::FlatGemm);
}

#[test]
fn flat_gemm_f16() {
    variant_all_shapes("matmul-f16", Variant::FlatGemm);
}

/// The per-M flat tiles the runtime runs (ep = M on the flat tile's hp),
/// with f16 and f32 activations: f16 x of up to 8 rows is widened once per
/// 8 k steps into the frame, taller tiles widen per step.
#[test]
fn flat_gemm_per_m_tiles() {
    for name in ["matmul-f16", "matmul-f32"] {
        let kernel = library::get(name).unwrap();
        for b in backends() {
            for ep in 1..=10u32 {
                let Some(t) = tiles(&kernel).into_iter().find(|t| t.ep == ep && t.hp == 8) else {
                    continue;
                };
                let mut shapes = some_shapes();
                shapes.extend([(ep as usize, 17, 257), (ep as usize + 1, 8, 16)]);
                check_variant(&b, &kernel, &t, Variant::FlatGemm, &shapes, 40 + ep as u64);
            }
        }
    }
}

#[test]
fn flat_gemm_w8a8() {
    variant_all_shapes("matmul-w8a8", Variant::FlatGemm);
}

#[test]
fn flat_gemm_w4a8() {
    variant_all_shapes("matmul-w4a8", Variant::FlatGemm);
}

/// Int8 flat GEMM, plain AVX2 and AVX-VNNI: the solver's tiles for M =
/// 2, 4, 6 and 8 (8x8 holds every row of M <= 8 in one row block) and the
/// tallest one (10 rows: the epilogue stores eight rows, then two), over
/// m = 1..=9, 12 and 16 (one block, several, a partial last one), n with
/// a tail, and k with a partial last step and, for W4A8 (g32 and g16), a
/// partial last group.
#[test]
fn flat_gemm_int8_every_m() {
    let set_w = |k: &mut Kernel, f: Format| {
        k.tensors.iter_mut().find(|t| t.name == "w").unwrap().format = f;
    };
    let kernels = [
        library::get("matmul-w8a8").unwrap(),
        library::get("matmul-w4a8").unwrap(),
        variant("matmul-w4a8", |k| {
            set_w(k, Format::U4Asym(Group::Size(16), ParamType::F32))
        }),
        // The compact formats: ggml's Q4_0 and Q4_1 blocks, and the long
        // groups whose int16 sums would overflow (widened every step).
        library::get("matmul-q4_0").unwrap(),
        library::get("matmul-q4_1").unwrap(),
        library::get("matmul-q8_0").unwrap(),
        variant("matmul-q8_0", |k| {
            set_w(k, Format::I8Sym(Group::Size(64), ParamType::F32))
        }),
        variant("matmul-q4_0", |k| {
            set_w(k, Format::U4Sym(Group::Size(64), ParamType::F16))
        }),
        variant("matmul-w4a8", |k| {
            set_w(k, Format::U4Asym(Group::Size(128), ParamType::F32))
        }),
    ];
    let ms: Vec<usize> = (1..=9).chain([12, 16]).collect();
    let shapes: Vec<(usize, usize, usize)> = ms
        .iter()
        .flat_map(|&m| [(m, 19, 45), (m, 40, 100), (m, 8, 7)])
        .collect();
    for kernel in &kernels {
        let mut picked: Vec<TileConfig> = Vec::new();
        for m in [2, 4, 6, 8] {
            picked.push(tiles_for_m(kernel, m)[0]);
        }
        picked.push(best(kernel));
        picked.dedup_by_key(|t| (t.ep, t.hp));
        let dims: Vec<(u32, u32)> = picked.iter().map(|t| (t.ep, t.hp)).collect();
        assert!(dims.contains(&(8, 8)), "{}: {dims:?}", kernel.name);
        assert!(dims.contains(&(10, 8)), "{}: {dims:?}", kernel.name);
        for b in backends() {
            for t in &picked {
                check_variant(&b, kernel, t, Variant::FlatGemm, &shapes, 51 + t.ep as u64);
            }
        }
    }
}

/// `u4sym` groups of 8 to 32 whose int16 sums start from the quantizer's
/// two halves of −8·Σq (`vpmaddubsw` lanes k ≡ 0, 1 and k ≡ 2, 3 mod 4),
/// on inputs at the bounds: x at ±absmax and codes 15 or 0 (w = 7 or −8
/// per unit scale) in a pattern that changes with k mod 4, the sign of the
/// pattern flipped for odd rows and columns. Each int16 lane then comes
/// within 16256 of its limit at some step, and halves seeded into the
/// wrong lanes would overflow (by up to 46736) where random inputs never
/// come near.
#[test]
fn u4sym_int16_group_sums_at_their_bounds() {
    let set_w = |k: &mut Kernel, f: Format| {
        k.tensors.iter_mut().find(|t| t.name == "w").unwrap().format = f;
    };
    let kernels = [8, 16, 32].map(|g| {
        variant("matmul-q4_0", |k| {
            set_w(k, Format::U4Sym(Group::Size(g), ParamType::F16))
        })
    });
    // rows × k values: `high` where k mod 4 < 2 on even rows (odd rows the
    // other way round), else `low`.
    let pattern = |rows: usize, k: usize, high: f32, low: f32| -> Vec<f32> {
        (0..rows * k)
            .map(|i| {
                if (i % k % 4 < 2) == (i / k).is_multiple_of(2) {
                    high
                } else {
                    low
                }
            })
            .collect()
    };
    let inputs = |_: &mut rand_chacha::ChaCha8Rng, m: usize, n: usize, k: usize| {
        (pattern(m, k, 1.0, -1.0), pattern(n, k, 7.0, -8.0))
    };
    let shapes = [(1, 16, 64), (4, 24, 96), (8, 9, 100), (3, 40, 33)];
    for kernel in &kernels {
        for b in backends() {
            for m in [1, 4, 8] {
                let t = tiles_for_m(kernel, m)[0];
                for v in [Variant::Gemv, Variant::FlatGemm, Variant::Gemm] {
                    let hm = b.load_variant(kernel, &t, v).unwrap();
                    let what = format!("{v} tile {}x{} at the int16 bounds", t.ep, t.hp);
                    check_host_matmul_on(&hm, kernel, &what, &shapes, 5, inputs);
                }
            }
        }
    }
}

/// The GEMV variant computes any m (one row at a time); every format, on
/// one-row tiles and on a tile of several rows (whose x layout interleaves
/// ep rows per block, which the one-row loop then walks).
#[test]
fn gemv_variant_every_format() {
    for name in tessera_tests::kernels::X86_MATMULS {
        let kernel = library::get(name).unwrap();
        let mut tiles = tiles_for_m(&kernel, 1);
        tiles.push(tiles_for_m(&kernel, 4)[0]);
        for b in backends() {
            for &t in &tiles {
                check_variant(&b, &kernel, &t, Variant::Gemv, &some_shapes(), 31);
            }
        }
    }
}

/// Flat GEMM over K long enough for the prefetch to run past a panel, with
/// every epilogue, and mixed float formats.
#[test]
fn flat_gemm_long_k_epilogues_and_mixed_formats() {
    let set = |k: &mut Kernel, tensor: &str, f: Format| {
        k.tensors
            .iter_mut()
            .find(|t| t.name == tensor)
            .unwrap()
            .format = f;
    };
    let mut kernels = vec![
        variant("matmul-f32", |k| set(k, "w", Format::F16)),
        variant("matmul-f32", |k| set(k, "y", Format::F16)),
        variant("matmul-w4a8", |k| set(k, "y", Format::F16)),
    ];
    for name in ["matmul-f32", "matmul-f16", "matmul-w8a8", "matmul-w4a8"] {
        kernels.push(variant(name, |k| epilogue(k, false, Activation::Relu)));
    }
    for kernel in &kernels {
        for b in backends() {
            for t in tiles_for_m(kernel, 4).iter().take(2) {
                check_variant(
                    &b,
                    kernel,
                    t,
                    Variant::FlatGemm,
                    &[(3, 19, 600), (6, 40, 1000), (1, 24, 513)],
                    41,
                );
            }
        }
    }
}

/// GEMM with K longer than one K block (partial sums through y, then the
/// finalizing block), with tails in m and n, bias and relu, on the f32
/// tiles of every width (4x24 blocks K at 2048, 6x16 at 3072, 14x8 at
/// 6144), the 14-row tile spilling its loop state.
#[test]
fn gemm_k_blocks_partial_sums() {
    let plain = library::get("matmul-f32").unwrap();
    let relu_k = variant("matmul-f32", |k| epilogue(k, true, Activation::Relu));
    let picked = [(4, 24), (6, 16), (14, 8), (2, 40)];
    for kernel in [&plain, &relu_k] {
        for b in backends() {
            let chosen: Vec<TileConfig> = tiles(kernel)
                .into_iter()
                .filter(|t| picked.contains(&(t.ep, t.hp)))
                .collect();
            assert_eq!(chosen.len(), picked.len());
            for t in &chosen {
                check_variant(
                    &b,
                    kernel,
                    t,
                    Variant::Gemm,
                    &[(5, 30, 2100), (9, 17, 3100), (15, 9, 6200)],
                    43,
                );
            }
        }
    }
}

/// The Backend trait's emit_variant gives the same bytes as the inherent
/// method, and each variant is distinct code.
#[test]
fn emit_variant_through_the_backend_trait() {
    use tessera_codegen::artifact::{Artifact, Backend};
    let b = X86Backend::default();
    for name in ["matmul-f32", "matmul-w4a8"] {
        let kernel = library::get(name).unwrap();
        let t = best(&kernel);
        let mut listings = Vec::new();
        for v in Variant::ALL {
            let Artifact::Machine(code) = b.emit_variant(&kernel, &t, v).unwrap() else {
                panic!("x86 emits machine code");
            };
            assert_eq!(code, b.emit_code_variant(&kernel, &t, v).unwrap());
            assert!(code.listing.contains(&format!("matmul {v}")), "{v}");
            listings.push(code.listing);
        }
        listings.dedup();
        assert_eq!(listings.len(), 3, "{name}: variants must differ");
    }
}

#[test]
fn f32_best_tile_all_shapes() {
    best_tile_all_shapes("matmul-f32");
}

#[test]
fn f32_every_tile() {
    every_tile("matmul-f32");
}

#[test]
fn f16_best_tile_all_shapes() {
    best_tile_all_shapes("matmul-f16");
}

#[test]
fn f16_every_tile() {
    every_tile("matmul-f16");
}

#[test]
fn w8a8_best_tile_all_shapes() {
    best_tile_all_shapes("matmul-w8a8");
}

#[test]
fn w8a8_every_tile() {
    every_tile("matmul-w8a8");
}

#[test]
fn w4a8_best_tile_all_shapes() {
    best_tile_all_shapes("matmul-w4a8");
}

#[test]
fn w4a8_every_tile() {
    every_tile("matmul-w4a8");
}

#[allow(dead_code)]
fn relu(kernel: &mut Kernel) {
    if let tessera_dsl::ir::Op::Matmul(mm) = &mut kernel.op {
        mm.epilogue.activation = Activation::Relu;
    }
}

/// A library kernel with another epilogue or weight format (plain data edits
/// of the IR, the oracle reads the same kernel).
fn variant(name: &str, edit: impl Fn(&mut Kernel)) -> Kernel {
    let mut k = library::get(name).unwrap();
    edit(&mut k);
    k
}

#[test]
fn relu_and_no_bias_on_every_family() {
    for name in ["matmul-f32", "matmul-f16", "matmul-w8a8", "matmul-w4a8"] {
        for (bias, act) in [
            (false, Activation::None),
            (true, Activation::Relu),
            (false, Activation::Relu),
        ] {
            let kernel = variant(name, |k| epilogue(k, bias, act));
            for b in backends() {
                for t in tiles(&kernel)
                    .iter()
                    .filter(|t| b.emit_code(&kernel, t).is_ok())
                    .take(4)
                {
                    check(&b, &kernel, t, &some_shapes(), 5);
                }
            }
        }
    }
}

#[test]
fn mixed_float_formats() {
    let set = |k: &mut Kernel, tensor: &str, f: Format| {
        k.tensors
            .iter_mut()
            .find(|t| t.name == tensor)
            .unwrap()
            .format = f;
    };
    let kernels = [
        variant("matmul-f32", |k| set(k, "w", Format::F16)),
        variant("matmul-f32", |k| set(k, "y", Format::F16)),
        variant("matmul-f16", |k| set(k, "y", Format::F32)),
        variant("matmul-w4a8", |k| set(k, "y", Format::F16)),
    ];
    for kernel in &kernels {
        for b in backends() {
            check(&b, kernel, &best(kernel), &some_shapes(), 9);
        }
    }
}

/// K past the GEMM's K block (16 KiB of a panel: 512 f32 k at hp = 8, 256
/// at hp = 16, 1024 for f16 weights at hp = 8) so partial sums go through y.
#[test]
fn larger_k_crosses_several_k_blocks() {
    let kernel = library::get("matmul-f32").unwrap();
    for b in backends() {
        for t in tiles(&kernel).iter().take(3) {
            check(
                &b,
                &kernel,
                t,
                &[(7, 19, 600), (1, 24, 600), (6, 8, 513), (9, 16, 1100)],
                11,
            );
        }
    }
    let f16w = variant("matmul-f32", |k| {
        k.tensors.iter_mut().find(|t| t.name == "w").unwrap().format = Format::F16;
    });
    for b in backends() {
        check(&b, &f16w, &best(&f16w), &[(7, 19, 2100), (13, 8, 1025)], 12);
    }
}

#[test]
fn unsupported_kernels_are_named_errors() {
    let b = X86Backend::default();
    let f32_tile = best(&library::get("matmul-f32").unwrap());
    for name in ["matmul-w4a16", "matmul-w8a16", "matmul-e0m4a16"] {
        let kernel = library::get(name).unwrap();
        match b.emit_code(&kernel, &f32_tile) {
            Err(EmitError::Unsupported { backend, what }) => {
                assert_eq!(backend, "x86-avx2");
                assert!(what.contains(name), "{what}");
            }
            other => panic!("{name}: {other:?}"),
        }
    }
    // silu is refused, naming the activation
    let kernel = variant("matmul-f32", |k| epilogue(k, true, Activation::Silu));
    let err = b.emit_code(&kernel, &f32_tile).unwrap_err();
    assert!(err.to_string().contains("silu"), "{err}");
    // a tile of the wrong class
    let w8 = library::get("matmul-w8a8").unwrap();
    let err = b.emit_code(&w8, &f32_tile).unwrap_err();
    assert!(matches!(err, EmitError::BadTile { .. }), "{err}");
}

/// A weight prefetch reaches the GEMV and flat loops of its stream's
/// kernels, ymm and zmm (the GEMV loop serves m = 1 in every variant, so
/// every variant's listing carries it), at its distance and cache level,
/// and leaves the other stream's kernels alone.
#[test]
fn a_weight_prefetch_reaches_its_streams_loops() {
    use tessera_codegen::target::TargetCaps;
    use tessera_codegen::x86::{AVX512_NAME, PrefetchLevel, WeightPrefetch, WeightStream};
    let avx2 = plan::target();
    let zmm = TargetCaps::by_name(AVX512_NAME).unwrap();
    let best = |caps, kernel: &Kernel| {
        solve(caps, &Problem::from_kernel(caps, kernel).unwrap()).unwrap()[0]
    };
    let odd = [
        WeightPrefetch::new(12288, PrefetchLevel::L1).unwrap(),
        WeightPrefetch::new(640, PrefetchLevel::L2).unwrap(),
    ];
    let line = |p: WeightPrefetch| {
        let op = match p.level() {
            PrefetchLevel::L1 => "prefetcht0",
            PrefetchLevel::L2 => "prefetcht1",
        };
        format!("{op} byte ptr [rsi + {}]", p.bytes())
    };
    for (name, stream) in [
        ("matmul-q4_0", WeightStream::Int8),
        ("matmul-f32", WeightStream::Float),
    ] {
        let kernel = library::get(name).unwrap();
        let other = match stream {
            WeightStream::Int8 => WeightStream::Float,
            WeightStream::Float => WeightStream::Int8,
        };
        let mut all = stream.choices().to_vec();
        all.extend(odd);
        for tile in [best(avx2, &kernel), best(zmm, &kernel)] {
            for v in Variant::ALL {
                for &p in &all {
                    let backend = X86Backend {
                        vnni: true,
                        avx512: true,
                        avx512_vnni: true,
                        ..X86Backend::default()
                    }
                    .with_weight_prefetch(stream, p)
                    .with_weight_prefetch(other, odd[0]);
                    let listing = backend
                        .emit_code_variant(&kernel, &tile, v)
                        .unwrap()
                        .listing;
                    let tag = format!("{name} {} {v} {p}", tile.summary());
                    assert!(listing.contains(&line(p)), "{tag}: {listing}");
                    for &q in all.iter().filter(|&&q| q != p) {
                        assert!(!listing.contains(&line(q)), "{tag}: {} too", line(q));
                    }
                }
            }
        }
    }
    assert_eq!(
        WeightStream::Int8.choices()[0],
        X86Backend::default().int8_prefetch
    );
    assert_eq!(
        WeightStream::Float.choices()[0],
        X86Backend::default().float_prefetch
    );
}
