//! Prebuilt machine code (what a build without `jit` runs): emitted ahead of
//! time here with the cranelift backend, handed to the device as bytes +
//! tile + variant + kernel name, and run through the same checked paths.

#![cfg(feature = "jit")]

use std::sync::Arc;

use half::f16;
use tessera_codegen::artifact::{Artifact, Backend as _};
use tessera_codegen::clif::ClifBackend;
use tessera_dsl::ir::Variant;
use tessera_dsl::library;
use tessera_runtime::{
    Attention, Backend, Device, DeviceOptions, KvCache, KvCapacity, KvFormat, Linear, PlanSource,
    PrebuiltKernel, PrebuiltSet, RuntimeError, WeightFormat, Weights, current_generator,
};

fn prebuilt_set() -> PrebuiltSet {
    let clif = ClifBackend::host().unwrap();
    let kernel = library::get("matmul-f32").unwrap();
    let tile = clif.tiles(&kernel).unwrap()[0];
    let mut set = PrebuiltSet::new(current_generator());
    for variant in Variant::ALL {
        push_f32_matmul(&mut set, &clif, &tile, variant);
    }
    let att = library::get("attention-decode-f16").unwrap();
    let Artifact::Machine(code) = clif.emit(&att, &tile).unwrap() else {
        panic!("source")
    };
    set.push(PrebuiltKernel::attention(
        "attention-decode-f16",
        "test",
        code.arch,
        code.bytes,
        code.head_dim_multiple,
        code.whole_prefill,
        code.every_head_state,
    ));
    set
}

fn clif_device(set: PrebuiltSet) -> Arc<Device> {
    clif_device_with(set, None)
}

/// Two threads on the cranelift backend with `set` and a tuning record.
fn clif_device_with(
    set: PrebuiltSet,
    record: Option<tessera_runtime::record::TuningRecord>,
) -> Arc<Device> {
    Arc::new(
        Device::open(
            Backend::HostClif,
            DeviceOptions {
                threads: Some(2),
                prebuilt: Some(set),
                record,
                ..Default::default()
            },
        )
        .unwrap(),
    )
}

/// The cranelift backend's feasible `matmul-f32` tiles at 8 rows.
fn f32_tiles_at_8_rows(clif: &ClifBackend) -> Vec<tessera_codegen::tile::TileConfig> {
    let kernel = library::get("matmul-f32").unwrap();
    let caps = clif.caps();
    let mut problem = tessera_codegen::tile::Problem::from_kernel(caps, &kernel).unwrap();
    problem.e = 8;
    tessera_codegen::tile::feasible(caps, &problem).unwrap()
}

/// Emit `matmul-f32` at `tile` for `variant` with cranelift into `set`.
fn push_f32_matmul(
    set: &mut PrebuiltSet,
    clif: &ClifBackend,
    tile: &tessera_codegen::tile::TileConfig,
    variant: Variant,
) {
    let kernel = library::get("matmul-f32").unwrap();
    let Artifact::Machine(code) = clif.emit_variant(&kernel, tile, variant).unwrap() else {
        panic!("source")
    };
    set.push(PrebuiltKernel::matmul(
        "matmul-f32",
        "test",
        variant,
        [tile.ep, tile.hp, tile.lp],
        code.arch,
        code.bytes,
        None,
    ));
}

/// `lin`'s y for m rows of x against the reference interpreter's
/// `matmul-f32` (weights `w` [n, k], no bias).
fn check_f32(lin: &Linear, w: &[f32], m: usize, n: usize, k: usize) {
    use tessera_dsl::interp::{Bindings, Value, run};
    let x: Vec<f32> = (0..m * k)
        .map(|i| ((i * 5) % 13) as f32 / 13.0 - 0.5)
        .collect();
    let mut y = vec![0.0; m * n];
    lin.forward_f32(&x, m, &mut y).unwrap();
    let b = Bindings::new()
        .extent("e", m)
        .extent("h", n)
        .extent("l", k)
        .tensor("x", Value::F32(x))
        .tensor("w", Value::F32(w.to_vec()))
        .tensor("bias", Value::F32(vec![0.0; n]));
    let kernel = library::get("matmul-f32").unwrap();
    let want = run(&kernel, &b).unwrap().get("y").unwrap().to_vec();
    for (i, (got, want)) in y.iter().zip(&want).enumerate() {
        assert!(
            (got - want).abs() < 1e-4,
            "m={m} y[{i}] = {got}, want {want}"
        );
    }
}

#[test]
fn prebuilt_kernels_run_without_the_jit_path() {
    let dev = clif_device(prebuilt_set());
    let (n, k) = (19, 24);
    let w: Vec<f32> = (0..n * k)
        .map(|i| ((i * 7) % 11) as f32 / 11.0 - 0.5)
        .collect();
    let lin = Linear::new(&dev, WeightFormat::F32, Weights::F32(&w), n, k, None).unwrap();
    assert!(matches!(lin.plan().source, PlanSource::Defaults { .. }));
    assert_eq!(lin.packings(), 1, "one tile, packed once");
    // The set has no per-M flat kernels: its flat tile serves every flat M.
    let flat = lin.plan().plan(Variant::FlatGemm).tile;
    assert!(lin.plan().flat_steps.iter().all(|s| s.tile == flat));
    assert_eq!(lin.kernel_tile(3), Some(flat));
    for m in [1, 3, 20] {
        check_f32(&lin, &w, m, n, k);
    }
    // A format the set lacks is a clear error.
    let e = Linear::new(&dev, WeightFormat::W4A8, Weights::F32(&w), n, k, None).unwrap_err();
    assert!(matches!(e, RuntimeError::NoKernel { .. }), "{e}");
    // Attention from prebuilt bytes.
    let att = Attention::new(&dev, 2, 1, 8, KvFormat::F16).unwrap();
    let mut cache = KvCache::new(KvFormat::F16, 1, 8, KvCapacity::Max(2)).unwrap();
    cache.append(&[0.5; 8], &[2.0; 8], 1).unwrap();
    let mut o = vec![f16::ZERO; 16];
    att.decode(&[f16::from_f32(0.1); 16], &cache, &mut o)
        .unwrap();
    assert!(o.iter().all(|v| (v.to_f32() - 2.0).abs() < 1e-3), "{o:?}");
    let e = Attention::new(&dev, 2, 1, 8, KvFormat::Kv8).unwrap_err();
    assert!(e.to_string().contains("prebuilt"), "{e}");
}

#[test]
fn prebuilt_sets_from_another_generator_are_refused() {
    let mut set = prebuilt_set();
    set.generator.template_hash = "0000".into();
    let e = Device::open(
        Backend::HostClif,
        DeviceOptions {
            prebuilt: Some(set),
            ..Default::default()
        },
    )
    .unwrap_err();
    assert!(e.to_string().contains("generator"), "{e}");
}

/// A prebuilt set with some of the flat range's per-M steps: each M runs
/// the set's smallest kernel of the flat tile's packing with at least M
/// rows (the flat tile when none is smaller), and every result is right.
#[test]
fn prebuilt_flat_steps_run_the_next_larger_kernel_the_set_holds() {
    let clif = ClifBackend::host().unwrap();
    let feasible = f32_tiles_at_8_rows(&clif);
    let find = |ep: u32, hp: u32| {
        feasible
            .iter()
            .find(|t| t.ep == ep && t.hp == hp && t.lp == 1)
            .copied()
    };
    // A 6-row flat tile and steps of 2 and 4 rows, same packing.
    let hp = [8, 12, 4]
        .into_iter()
        .find(|&hp| find(6, hp).is_some() && find(2, hp).is_some() && find(4, hp).is_some())
        .expect("6-, 4- and 2-row f32 tiles of one width");
    let mut set = PrebuiltSet::new(current_generator());
    for (variant, ep) in [
        (Variant::Gemv, 6),
        (Variant::FlatGemm, 6),
        (Variant::FlatGemm, 2),
        (Variant::FlatGemm, 4),
        (Variant::Gemm, 6),
    ] {
        push_f32_matmul(&mut set, &clif, &find(ep, hp).unwrap(), variant);
    }
    let dev = clif_device(set);
    let (n, k) = (2 * hp as usize + 3, 37);
    let w: Vec<f32> = (0..n * k)
        .map(|i| ((i * 7) % 11) as f32 / 11.0 - 0.5)
        .collect();
    let lin = Linear::new(&dev, WeightFormat::F32, Weights::F32(&w), n, k, None).unwrap();
    assert_eq!(lin.plan().plan(Variant::FlatGemm).tile, [6, hp, 1]);
    for (m, ep) in [(2, 2), (3, 4), (4, 4), (5, 6), (6, 6), (9, 6)] {
        assert_eq!(
            lin.kernel_tile(m),
            Some([ep, hp, 1]),
            "m={m}: {}",
            lin.plan()
        );
        check_f32(&lin, &w, m, n, k);
    }
}

/// A prebuilt set built from a record whose flat steps run on the GEMM's
/// packing (the tuner's choice where few rows run faster there): each M
/// runs the recorded step, or the set's smallest kernel of that step's
/// packing with at least M rows, reading the GEMM's packed copy; every
/// result is right and no new copy is packed.
#[test]
fn prebuilt_flat_steps_on_the_gemm_packing() {
    use tessera_runtime::record::{
        DeviceEntry, Limits, RECORD_SCHEMA, ShapeEntry, TuningRecord, Winner,
    };
    let clif = ClifBackend::host().unwrap();
    let feasible = f32_tiles_at_8_rows(&clif);
    let has = |ep: u32, hp: u32| feasible.iter().any(|t| [t.ep, t.hp, t.lp] == [ep, hp, 1]);
    // Flat (and GEMV) 6 rows of one width, GEMM and steps of 2 and 4 rows
    // of another.
    let widths = [4u32, 8, 12, 16];
    let (flat_hp, gemm_hp) = widths
        .iter()
        .flat_map(|&a| widths.iter().map(move |&b| (a, b)))
        .find(|&(a, b)| a != b && has(6, a) && has(6, b) && has(2, b) && has(4, b))
        .expect("two f32 widths with 6-row tiles and 2-, 4-row tiles of the second");
    let tiles = [
        (Variant::Gemv, [6, flat_hp, 1]),
        (Variant::FlatGemm, [6, flat_hp, 1]),
        (Variant::FlatGemm, [2, gemm_hp, 1]),
        (Variant::FlatGemm, [4, gemm_hp, 1]),
        (Variant::Gemm, [6, gemm_hp, 1]),
    ];
    let mut set = PrebuiltSet::new(current_generator());
    for (variant, tile) in tiles {
        let t = feasible
            .iter()
            .find(|t| [t.ep, t.hp, t.lp] == tile)
            .unwrap();
        push_f32_matmul(&mut set, &clif, t, variant);
    }
    let (n, k) = (2 * gemm_hp.max(flat_hp) as usize + 3, 37);
    let winner = |variant, tile: [u32; 3], from_m| Winner {
        variant,
        target: "test".into(),
        tile,
        kernel: String::new(),
        from_m,
    };
    // Steps: 2 rows and 3 rows (the set lacks 3: it runs 4) on the GEMM's
    // packing, then the flat tile from 4.
    let mut winners: Vec<Winner> = tiles
        .iter()
        .filter(|(_, tile)| tile[0] == 6)
        .map(|(v, tile)| winner(*v, *tile, None))
        .collect();
    winners.extend([
        winner(Variant::FlatGemm, [2, gemm_hp, 1], Some(2)),
        winner(Variant::FlatGemm, [3, gemm_hp, 1], Some(3)),
        winner(Variant::FlatGemm, [6, flat_hp, 1], Some(4)),
    ]);
    let probe = clif_device(PrebuiltSet::new(current_generator()));
    let record = TuningRecord {
        schema: RECORD_SCHEMA,
        entries: vec![DeviceEntry {
            prefill: None,
            decode: None,
            weight_prefetch: None,
            fingerprint: probe.fingerprint().clone(),
            generator: current_generator(),
            backend: probe.backend().record_name().into(),
            format: "f32".into(),
            model: "test".into(),
            threads: 2,
            partial: false,
            created_unix: 0,
            limits: Limits::default(),
            core_weights: vec![1.0, 1.0],
            shapes: vec![ShapeEntry {
                name: "t".into(),
                n,
                k,
                m1: 2,
                m2: 12,
                winners,
                measurements: vec![],
                notes: Default::default(),
            }],
        }],
    };
    let dev = clif_device_with(set, Some(record));
    let w: Vec<f32> = (0..n * k)
        .map(|i| ((i * 7) % 11) as f32 / 11.0 - 0.5)
        .collect();
    let lin = Linear::new(&dev, WeightFormat::F32, Weights::F32(&w), n, k, None).unwrap();
    assert!(
        matches!(lin.plan().source, PlanSource::Record),
        "{}",
        lin.plan()
    );
    assert_eq!(lin.packings(), 2, "{}", lin.plan());
    for (m, tile) in [
        (2, [2, gemm_hp, 1]),
        (3, [4, gemm_hp, 1]),
        (4, [6, flat_hp, 1]),
        (9, [6, flat_hp, 1]),
    ] {
        assert_eq!(lin.kernel_tile(m), Some(tile), "m={m}: {}", lin.plan());
        check_f32(&lin, &w, m, n, k);
    }
}
