//! The runtime against the reference interpreter: dispatch by M around the
//! record's breakpoints, refused records, bad input, the KV cache growing
//! past its first chunk, more threads than output channels.

#![cfg(feature = "jit")]

use std::sync::Arc;
use tessera_dsl::ir::ParamType;

use half::f16;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tessera_codegen::artifact::PrefillBlocks;
use tessera_dsl::interp::{self, Bindings, Value};
use tessera_dsl::ir::{Format, Group, Variant};
use tessera_dsl::library;
use tessera_dsl::quant;
use tessera_runtime::device::Fingerprint;
use tessera_runtime::record::{
    DecodeEntry, DeviceEntry, GeneratorId, Limits, PrefetchEntry, PrefillEntry, RECORD_SCHEMA,
    ShapeEntry, TuningRecord, Winner,
};
use tessera_runtime::{
    Attention, Backend, Device, DeviceOptions, KvCache, KvCapacity, KvFormat, Linear, PlanSource,
    RuntimeError, WeightFormat, Weights, current_generator,
};

fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

fn randv(r: &mut ChaCha8Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| r.gen_range(-1.0f32..1.0)).collect()
}

fn device(backend: Backend, threads: usize, record: Option<TuningRecord>) -> Arc<Device> {
    Arc::new(
        Device::open(
            backend,
            DeviceOptions {
                threads: Some(threads),
                record,
                ..Default::default()
            },
        )
        .expect("open"),
    )
}

/// The JIT backends this machine runs: cranelift always, x86 where the CPU
/// has AVX2/FMA/F16C, NEON on aarch64 (under qemu in scripts/test-aarch64.sh).
fn host_backends() -> Vec<Backend> {
    let mut v = vec![Backend::HostClif];
    if tessera_codegen::x86::missing_features().is_empty() {
        v.push(Backend::HostX86);
    }
    if cfg!(target_arch = "aarch64") {
        v.push(Backend::Neon);
    }
    v
}

/// The interpreter's y for x [m, k], w [n, k] in `format`.
fn reference(
    format: WeightFormat,
    x: &[f32],
    w: &[f32],
    bias: &[f32],
    m: usize,
    n: usize,
    k: usize,
) -> Vec<f32> {
    let kernel = library::get(format.library_kernel()).unwrap();
    let mm = kernel.as_matmul().unwrap();
    let w_format = kernel.tensor(&mm.w).unwrap().format;
    let x_format = kernel.tensor(&mm.x).unwrap().format;
    let wv = match Value::from_f32(w_format, w) {
        Some(v) => v,
        None => Value::Quant(quant::quantize(w_format, n, k, w).unwrap()),
    };
    let b = Bindings::new()
        .extent("e", m)
        .extent("h", n)
        .extent("l", k)
        .tensor("x", Value::from_f32(x_format, x).unwrap())
        .tensor("w", wv)
        .tensor("bias", Value::F32(bias.to_vec()));
    interp::run(&kernel, &b).unwrap().get("y").unwrap().to_vec()
}

fn max_err(a: &[f32], b: &[f32]) -> (f32, f32) {
    let err = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max);
    let scale = b.iter().map(|x| x.abs()).fold(0.0, f32::max);
    (err, scale)
}

/// How far a backend's output may be from the interpreter's: f32
/// accumulation of exact products for every format but f16, whose output
/// is f16; NEON's f16 kernels also accumulate in f16 on fp16 cores
/// (`fmla .8h`), 2^-10 per √k step (the NEON suite's own bound).
fn tolerance(backend: Backend, format: WeightFormat, k: usize, scale: f32) -> f32 {
    match (backend, format) {
        (Backend::Neon, WeightFormat::F16) => {
            2f32.powi(-10) * (2.0 * (k as f32).sqrt() + 2.0) * (1.0 + scale)
        }
        (_, WeightFormat::F16) => 2e-3 * (1.0 + scale),
        _ => 1e-4 * (1.0 + scale),
    }
}

/// `lin` on x (m rows) against the interpreter, within `backend`'s
/// tolerance for the Linear's format; `what` names the case on failure.
fn assert_matches_reference(
    lin: &Linear,
    backend: Backend,
    x: &[f32],
    (w, bias): (&[f32], &[f32]),
    m: usize,
    what: &str,
) {
    let (format, n, k) = (lin.format(), lin.n(), lin.k());
    let y = run_linear(lin, x, m);
    let (err, scale) = max_err(&y, &reference(format, x, w, bias, m, n, k));
    let tol = tolerance(backend, format, k, scale);
    assert!(err <= tol, "{what}: err {err} > {tol}");
}

fn run_linear(lin: &Linear, x: &[f32], m: usize) -> Vec<f32> {
    match lin.format() {
        WeightFormat::F16 => {
            let xh: Vec<f16> = x.iter().map(|&v| f16::from_f32(v)).collect();
            let mut y = vec![f16::ZERO; m * lin.n()];
            lin.forward(
                tessera_runtime::Input::F16(&xh),
                m,
                tessera_runtime::Output::F16(&mut y),
            )
            .unwrap();
            y.iter().map(|v| v.to_f32()).collect()
        }
        _ => {
            let mut y = vec![0.0; m * lin.n()];
            lin.forward_f32(x, m, &mut y).unwrap();
            y
        }
    }
}

fn check_linear(dev: &Arc<Device>, format: WeightFormat, n: usize, k: usize, ms: &[usize]) {
    let mut r = rng((n * 31 + k) as u64);
    let w = randv(&mut r, n * k);
    let bias = randv(&mut r, n);
    let lin = Linear::new(dev, format, Weights::F32(&w), n, k, Some(&bias)).unwrap();
    assert!(lin.packings() >= 1 && lin.packings() <= 3);
    for &m in ms {
        let x = randv(&mut r, m * k);
        let y = run_linear(&lin, &x, m);
        let want = reference(format, &x, &w, &bias, m, n, k);
        let (err, scale) = max_err(&y, &want);
        let tol = tolerance(dev.backend(), format, k, scale);
        assert!(
            err <= tol,
            "{:?} {format} m={m} n={n} k={k} ({}) err {err} > {tol}",
            dev.backend(),
            lin.plan()
        );
    }
}

#[test]
fn linear_matches_the_interpreter_for_every_m_with_tails() {
    for backend in host_backends() {
        let dev = device(backend, 2, None);
        for format in [WeightFormat::F32, WeightFormat::W8A8, WeightFormat::W4A8] {
            check_linear(&dev, format, 45, 96, &[1, 2, 3, 15, 16, 17, 33]);
        }
        check_linear(&dev, WeightFormat::F16, 21, 40, &[1, 5, 19]);
    }
}

/// ggml's blocks (Q4_0, Q4_1, Q8_0: f16 group parameters, u4sym's zero point) run
/// on x86 in every M range, a partial last group included; cranelift
/// refuses them by name.
#[test]
fn ggml_block_formats_match_the_interpreter_on_x86() {
    let clif = device(Backend::HostClif, 1, None);
    let w = vec![0.5f32; 8 * 64];
    let err = Linear::new(&clif, WeightFormat::Q4_0, Weights::F32(&w), 8, 64, None).unwrap_err();
    assert!(err.to_string().contains("u4sym"), "{err}");
    if !tessera_codegen::x86::missing_features().is_empty() {
        eprintln!("SKIP: no AVX2/FMA/F16C, so no x86 backend");
        return;
    }
    let dev = device(Backend::HostX86, 2, None);
    for format in [WeightFormat::Q4_0, WeightFormat::Q4_1, WeightFormat::Q8_0] {
        check_linear(&dev, format, 45, 100, &[1, 2, 3, 15, 16, 17, 33]);
    }
}

/// Non-finite activations mean what the interpreter says on every host
/// backend: f32 kernels propagate them; the int8 kernels' per-row
/// quantizer ignores a NaN in the absmax and codes it 0, and a row with an
/// infinity gets scale 0 (so its outputs are the bias).
#[test]
fn nan_and_infinite_activations_match_the_interpreter() {
    let (n, k) = (21, 72);
    let mut r = rng(7);
    let w = randv(&mut r, n * k);
    let bias = randv(&mut r, n);
    for backend in host_backends() {
        let dev = device(backend, 2, None);
        let mut formats = vec![WeightFormat::F32, WeightFormat::W8A8, WeightFormat::W4A8];
        if backend == Backend::HostX86 {
            formats.extend([WeightFormat::Q4_0, WeightFormat::Q4_1, WeightFormat::Q8_0]);
        }
        for format in formats {
            let lin = Linear::new(&dev, format, Weights::F32(&w), n, k, Some(&bias)).unwrap();
            for m in [1, 3, 9] {
                let mut x = randv(&mut r, m * k);
                // Row 0: a NaN (in the k tail too); row 1: +inf; row 2: -inf and a NaN.
                x[5] = f32::NAN;
                x[k - 1] = f32::NAN;
                if m > 1 {
                    x[k + 7] = f32::INFINITY;
                }
                if m > 2 {
                    x[2 * k] = f32::NEG_INFINITY;
                    x[2 * k + 3] = f32::NAN;
                }
                let y = run_linear(&lin, &x, m);
                let want = reference(format, &x, &w, &bias, m, n, k);
                for (i, (&got, &exp)) in y.iter().zip(&want).enumerate() {
                    let same = if exp.is_nan() {
                        got.is_nan()
                    } else if exp.is_infinite() {
                        got == exp
                    } else {
                        got.is_finite() && (got - exp).abs() <= 1e-4 * (1.0 + exp.abs())
                    };
                    assert!(
                        same,
                        "{backend:?} {format} m={m}: y[{}, {}] = {got}, interpreter {exp}",
                        i / n,
                        i % n
                    );
                }
            }
        }
    }
}

/// `x86_avx2_only` keeps an AVX-512 host on the AVX2 kernels (other GEMM
/// tiles), and they agree with the interpreter in every variant.
#[test]
fn x86_avx2_only_runs_the_avx2_kernels() {
    let Ok(x86) = tessera_codegen::x86::X86Backend::detect() else {
        eprintln!("SKIP: no AVX2/FMA/F16C, so no x86 backend");
        return;
    };
    let avx2 = Arc::new(
        Device::open(
            Backend::HostX86,
            DeviceOptions {
                threads: Some(2),
                x86_avx2_only: true,
                ..Default::default()
            },
        )
        .expect("open"),
    );
    for format in [WeightFormat::F32, WeightFormat::W4A8] {
        check_linear(&avx2, format, 45, 96, &[1, 3, 17, 70]);
    }
    if x86.avx512 {
        let default = device(Backend::HostX86, 2, None);
        let w = vec![0.5f32; 64 * 64];
        let tile = |dev: &Arc<Device>| {
            let lin = Linear::new(dev, WeightFormat::F32, Weights::F32(&w), 64, 64, None).unwrap();
            lin.plan().plan(Variant::Gemm).tile
        };
        assert_ne!(
            tile(&avx2),
            tile(&default),
            "the AVX2 device ran the AVX-512 GEMM tile"
        );
    } else {
        eprintln!("SKIP: no AVX-512 here, so both devices run the AVX2 kernels");
    }
}

/// A record for this device with the given breakpoints and the default tiles.
fn record_for(
    dev: &Device,
    format: WeightFormat,
    n: usize,
    k: usize,
    m1: usize,
    m2: usize,
) -> TuningRecord {
    let defaults = dev.prepare(format, &[(n, k)]).unwrap().remove(0);
    let winners = defaults
        .variants
        .iter()
        .map(|v| Winner {
            variant: v.variant,
            target: "test".into(),
            tile: v.tile,
            kernel: format!("{}-{}", v.kernel, v.variant),
            from_m: None,
        })
        .collect();
    TuningRecord {
        schema: RECORD_SCHEMA,
        entries: vec![DeviceEntry {
            prefill: None,
            decode: None,
            weight_prefetch: None,
            fingerprint: dev.fingerprint().clone(),
            generator: current_generator(),
            backend: dev.backend().record_name().into(),
            format: format.name().into(),
            model: "test".into(),
            threads: dev.threads(),
            partial: false,
            created_unix: 0,
            limits: Limits::default(),
            // A two-cluster part: CPU 0 little, CPU 1 three times faster.
            core_weights: vec![1.0, 3.0],
            shapes: vec![ShapeEntry {
                name: "t".into(),
                n,
                k,
                m1,
                m2,
                winners,
                measurements: vec![],
                notes: Default::default(),
            }],
        }],
    }
}

#[test]
fn dispatch_switches_at_the_records_breakpoints() {
    let (n, k, m1, m2) = (40, 64, 3, 7);
    for backend in host_backends() {
        let probe = device(backend, 2, None);
        let record = record_for(&probe, WeightFormat::W4A8, n, k, m1, m2);
        let dev = device(backend, 2, Some(record));
        let mut r = rng(7);
        let w = randv(&mut r, n * k);
        let bias = randv(&mut r, n);
        let lin = Linear::new(
            &dev,
            WeightFormat::W4A8,
            Weights::F32(&w),
            n,
            k,
            Some(&bias),
        )
        .unwrap();
        assert_eq!(lin.plan().source, PlanSource::Record);
        assert!(lin.plan().variants.iter().all(|v| v.from_record));
        // Worker 1 is pinned to CPU 1 and takes its weight; the caller,
        // never pinned, takes the smallest (it may run on the little core).
        let cpus = dev.worker_cpus();
        assert_eq!(cpus[0], None);
        let want = if cpus[1] == Some(1) {
            vec![1.0, 3.0]
        } else {
            eprintln!("worker 1 could not be pinned here: both take the smallest weight");
            vec![1.0, 1.0]
        };
        assert_eq!(lin.plan().core_weights, want);
        assert_eq!(dev.core_weights(), want);
        // Equal weights pin nothing.
        assert!(probe.worker_cpus().iter().all(Option::is_none));
        for (m, want) in [
            (m1 - 1, Variant::Gemv),
            (m1, Variant::FlatGemm),
            (m2 - 1, Variant::FlatGemm),
            (m2, Variant::Gemm),
        ] {
            assert_eq!(lin.variant_for(m), want, "m={m}");
            let x = randv(&mut r, m * k);
            let y = run_linear(&lin, &x, m);
            let (err, scale) = max_err(&y, &reference(WeightFormat::W4A8, &x, &w, &bias, m, n, k));
            assert!(err <= 1e-4 * (1.0 + scale), "m={m} err {err}");
        }
    }
}

#[test]
fn refused_records_fall_back_to_defaults_and_say_why() {
    let backend = Backend::HostClif;
    let probe = device(backend, 1, None);
    let (n, k) = (16, 32);
    // Another device.
    let mut other = record_for(&probe, WeightFormat::F32, n, k, 5, 9);
    let mut fp: Fingerprint = other.entries[0].fingerprint.clone();
    fp.features.push("made-up-feature".into());
    other.entries[0].fingerprint = fp;
    let dev = device(backend, 1, Some(other));
    let lin = Linear::new(
        &dev,
        WeightFormat::F32,
        Weights::F32(&vec![0.5; n * k]),
        n,
        k,
        None,
    )
    .unwrap();
    match &lin.plan().source {
        PlanSource::Defaults { why } => assert!(why.contains("features differ"), "{why}"),
        s => panic!("record accepted: {s:?}"),
    }
    assert_eq!((lin.plan().m1, lin.plan().m2), (2, 16));
    // Another generator.
    let mut stale = record_for(&probe, WeightFormat::F32, n, k, 5, 9);
    stale.entries[0].generator = GeneratorId {
        version: "0.0.0".into(),
        template_hash: "deadbeef".into(),
    };
    let dev = device(backend, 1, Some(stale));
    let lin = Linear::new(
        &dev,
        WeightFormat::F32,
        Weights::F32(&vec![0.5; n * k]),
        n,
        k,
        None,
    )
    .unwrap();
    match &lin.plan().source {
        PlanSource::Defaults { why } => assert!(why.contains("generator"), "{why}"),
        s => panic!("record accepted: {s:?}"),
    }
    // A record without this shape, and none of its k within twice its n.
    let other_shape = record_for(&probe, WeightFormat::F32, n, k, 5, 9);
    let dev = device(backend, 1, Some(other_shape));
    let lin = Linear::new(
        &dev,
        WeightFormat::F32,
        Weights::F32(&vec![0.5; 7 * k]),
        7,
        k,
        None,
    )
    .unwrap();
    match &lin.plan().source {
        PlanSource::Defaults { why } => assert!(why.contains("no shape [7, 32]"), "{why}"),
        s => panic!("record accepted: {s:?}"),
    }
    // Still computes correctly.
    let x = vec![1.0; 2 * k];
    let mut y = vec![0.0; 2 * 7];
    lin.forward_f32(&x, 2, &mut y).unwrap();
    assert!(y.iter().all(|&v| (v - 16.0).abs() < 1e-4), "{y:?}");
    // Half the record's n (gate or up alone where the tuner saw them
    // fused): the record's plan for [16, 32] stands in, and computes.
    let lin = Linear::new(
        &dev,
        WeightFormat::F32,
        Weights::F32(&vec![0.5; 8 * k]),
        8,
        k,
        None,
    )
    .unwrap();
    assert_eq!(
        lin.plan().source,
        PlanSource::NearestRecordShape { n, k },
        "{}",
        lin.plan()
    );
    assert_eq!((lin.plan().m1, lin.plan().m2), (5, 9));
    assert!(lin.plan().variants.iter().all(|v| v.from_record));
    for m in [2, 5, 9] {
        let x = vec![1.0; m * k];
        let mut y = vec![0.0; m * 8];
        lin.forward_f32(&x, m, &mut y).unwrap();
        assert!(y.iter().all(|&v| (v - 16.0).abs() < 1e-4), "m={m} {y:?}");
    }
}

#[test]
fn bad_shapes_and_formats_are_errors_naming_the_mismatch() {
    let dev = device(Backend::HostClif, 2, None);
    let (n, k) = (8, 32);
    let w = vec![0.1; n * k];
    let e = Linear::new(&dev, WeightFormat::F32, Weights::F32(&w[1..]), n, k, None).unwrap_err();
    assert!(e.to_string().contains("weights elements"), "{e}");
    let e = Linear::new(
        &dev,
        WeightFormat::F32,
        Weights::F32(&w),
        n,
        k,
        Some(&[0.0; 3]),
    )
    .unwrap_err();
    assert!(e.to_string().contains("bias"), "{e}");
    let q = quant::quantize(Format::I8Sym(Group::Row, ParamType::F32), n, k, &w).unwrap();
    let e = Linear::new(&dev, WeightFormat::W4A8, Weights::Quant(&q), n, k, None).unwrap_err();
    assert!(e.to_string().contains("quantized weights"), "{e}");
    let e = Linear::new(&dev, WeightFormat::F32, Weights::F32(&[]), 0, k, None).unwrap_err();
    assert!(matches!(e, RuntimeError::Shape { .. }), "{e}");
    assert!(
        "q4".parse::<WeightFormat>()
            .unwrap_err()
            .to_string()
            .contains("w4a8")
    );

    let lin = Linear::new(&dev, WeightFormat::F32, Weights::F32(&w), n, k, None).unwrap();
    let mut y = vec![0.0; 2 * n];
    let e = lin.forward_f32(&[0.0; 2 * 32 - 1], 2, &mut y).unwrap_err();
    assert!(e.to_string().contains("x elements (m·k)"), "{e}");
    let e = lin.forward_f32(&[0.0; 3 * 32], 3, &mut y).unwrap_err();
    assert!(e.to_string().contains("y elements"), "{e}");
    let xh = vec![f16::ZERO; 2 * k];
    let e = lin
        .forward(
            tessera_runtime::Input::F16(&xh),
            2,
            tessera_runtime::Output::F32(&mut y),
        )
        .unwrap_err();
    assert!(e.to_string().contains("x dtype"), "{e}");
    assert!(lin.forward_f32(&[], 0, &mut []).is_ok());

    let e = Attention::new(&dev, 12, 5, 64, KvFormat::F16).unwrap_err();
    assert!(e.to_string().contains("query heads"), "{e}");
    let att = Attention::new(&dev, 4, 2, 16, KvFormat::F16).unwrap();
    let mut cache = KvCache::new(KvFormat::F16, 2, 16, KvCapacity::Max(4)).unwrap();
    let mut o = vec![f16::ZERO; 4 * 16];
    let q = vec![f16::ZERO; 4 * 16];
    let e = att.decode(&q, &cache, &mut o).unwrap_err();
    assert!(e.to_string().contains("KV cache tokens"), "{e}");
    let e = cache.append(&[0.0; 31], &[0.0; 32], 1).unwrap_err();
    assert!(e.to_string().contains("keys elements"), "{e}");
    cache.append(&[0.0; 32 * 4], &[0.0; 32 * 4], 4).unwrap();
    let e = cache.append(&[0.0; 32], &[0.0; 32], 1).unwrap_err();
    assert!(matches!(e, RuntimeError::CacheFull { max: 4, .. }), "{e}");
    let e = att.decode(&q[1..], &cache, &mut o).unwrap_err();
    assert!(e.to_string().contains("q elements"), "{e}");
    let e = att
        .prefill(
            &vec![f16::ZERO; 5 * 64],
            5,
            &cache,
            &mut vec![f16::ZERO; 5 * 64],
        )
        .unwrap_err();
    assert!(e.to_string().contains("prefill tokens"), "{e}");
    let wrong = KvCache::new(KvFormat::Kv8, 2, 16, KvCapacity::Max(4)).unwrap();
    let e = att.decode(&q, &wrong, &mut o).unwrap_err();
    assert!(e.to_string().contains("KV cache format"), "{e}");
    let e = Device::open(Backend::Cuda, DeviceOptions::default()).unwrap_err();
    assert!(
        e.to_string().contains("cuda") && e.to_string().contains("not available"),
        "{e}"
    );
    if !cfg!(target_arch = "aarch64") {
        let e = Device::open(Backend::Neon, DeviceOptions::default()).unwrap_err();
        assert!(e.to_string().contains("aarch64"), "{e}");
    }
}

/// The interpreter's attention over the whole cache for the last t tokens.
#[allow(clippy::too_many_arguments)]
fn reference_attention(
    format: KvFormat,
    q: &[f16],
    k: &[f32],
    v: &[f32],
    t: usize,
    s: usize,
    hq: usize,
    kvh: usize,
    d: usize,
) -> Vec<f32> {
    let name = if t == 1 {
        format.kernel_name()
    } else {
        format.prefill_kernel_name()
    };
    let kernel = library::get(name).unwrap();
    let bind = |f: Format, x: &[f32]| match f {
        Format::F16 => Value::F16(x.iter().map(|&v| f16::from_f32(v)).collect()),
        f => Value::Quant(quant::quantize(f, s * kvh, d, x).unwrap()),
    };
    let mut b = Bindings::new()
        .extent("hq", hq)
        .extent("kvh", kvh)
        .extent("d", d)
        .extent("s", s)
        .tensor("q", Value::F16(q.to_vec()))
        .tensor("k", bind(format.key_format(), k))
        .tensor("v", bind(format.value_format(), v));
    if t != 1 {
        b = b.extent("t", t);
    }
    interp::run(&kernel, &b).unwrap().get("o").unwrap().to_vec()
}

fn randh(r: &mut ChaCha8Rng, n: usize, scale: f32) -> Vec<f16> {
    (0..n)
        .map(|_| f16::from_f32(r.gen_range(-1.0f32..1.0) * scale))
        .collect()
}

#[test]
fn an_impossible_kv_cache_is_an_error_not_an_abort() {
    // 2^44 tokens of 64 f16 values: 2^51 bytes, past any address space.
    for format in [KvFormat::F16, KvFormat::Kv8] {
        for capacity in [KvCapacity::Max(1 << 44), KvCapacity::Chunked(1 << 44)] {
            let err = KvCache::new(format, 1, 64, capacity).unwrap_err();
            assert!(
                matches!(err, RuntimeError::OutOfMemory { .. }),
                "{format:?} {capacity:?}: {err}"
            );
            assert!(err.to_string().contains("KV cache"), "{err}");
        }
    }
}

#[test]
fn kv_cache_grows_past_its_first_chunk_in_place_and_decode_stays_exact() {
    let (hq, kvh, d) = (4, 2, 32);
    // Every JIT host backend: cranelift's attention, and on aarch64 the NEON
    // emitter's (the NEON device's own).
    for (format, backend) in [KvFormat::F16, KvFormat::Kv8]
        .into_iter()
        .flat_map(|f| host_backends().into_iter().map(move |b| (f, b)))
    {
        let dev = device(backend, 2, None);
        let att = Attention::new(&dev, hq, kvh, d, format).unwrap();
        let mut cache = KvCache::new(format, kvh, d, KvCapacity::Chunked(4)).unwrap();
        let mut r = rng(3);
        let (mut ks, mut vs) = (Vec::new(), Vec::new());
        let mut base = cache.addresses();
        let mut growths = 0;
        for step in 0..11 {
            let k = randv(&mut r, kvh * d);
            let v = randv(&mut r, kvh * d);
            cache.append(&k, &v, 1).unwrap();
            if cache.growths() == growths {
                assert_eq!(
                    cache.addresses(),
                    base,
                    "moved without growing at step {step}"
                );
            } else {
                growths = cache.growths();
                base = cache.addresses();
            }
            ks.extend(k);
            vs.extend(v);
            let q = randh(&mut r, hq * d, 0.3);
            let mut o = vec![f16::ZERO; hq * d];
            att.decode(&q, &cache, &mut o).unwrap();
            let s = cache.len();
            let want = reference_attention(format, &q, &ks, &vs, 1, s, hq, kvh, d);
            let got: Vec<f32> = o.iter().map(|x| x.to_f32()).collect();
            let (err, _) = max_err(&got, &want);
            assert!(err <= 4e-3, "{backend:?} {format:?} step {step}: err {err}");
        }
        assert!(cache.growths() >= 1 && cache.capacity() >= 11, "{cache:?}");
    }
}

/// `Attention::append` takes f16 rows as the projections produce them: on
/// the JIT NEON device its emitted append kernel writes them in place, on
/// the others the cache's encoder. Either way the cache holds what
/// `KvCache::append` of the same values writes: decode reads bit-identical
/// outputs from both, through growths, and both match the interpreter.
#[test]
fn attention_append_writes_what_the_cache_encoder_writes() {
    let (hq, kvh, d) = (4, 2, 40);
    for (format, backend) in [KvFormat::F16, KvFormat::Kv8]
        .into_iter()
        .flat_map(|f| host_backends().into_iter().map(move |b| (f, b)))
    {
        let dev = device(backend, 2, None);
        let att = Attention::new(&dev, hq, kvh, d, format).unwrap();
        assert_eq!(
            att.appends_in_kernel(),
            backend == Backend::Neon,
            "{backend:?}"
        );
        let mut by_attention = KvCache::new(format, kvh, d, KvCapacity::Chunked(4)).unwrap();
        let mut by_cache = KvCache::new(format, kvh, d, KvCapacity::Chunked(4)).unwrap();
        let mut r = rng(17);
        let (mut ks, mut vs) = (Vec::new(), Vec::new());
        for tokens in [1usize, 3, 2, 5] {
            let k = randh(&mut r, tokens * kvh * d, 2.0);
            let v = randh(&mut r, tokens * kvh * d, 2.0);
            att.append(&mut by_attention, &k, &v, tokens).unwrap();
            let (kw, vw): (Vec<f32>, Vec<f32>) = (
                k.iter().map(|x| x.to_f32()).collect(),
                v.iter().map(|x| x.to_f32()).collect(),
            );
            by_cache.append(&kw, &vw, tokens).unwrap();
            ks.extend(kw);
            vs.extend(vw);
            let q = randh(&mut r, hq * d, 0.3);
            let (mut oa, mut oc) = (vec![f16::ZERO; hq * d], vec![f16::ZERO; hq * d]);
            att.decode(&q, &by_attention, &mut oa).unwrap();
            att.decode(&q, &by_cache, &mut oc).unwrap();
            assert_eq!(oa, oc, "{backend:?} {format:?} after {tokens} tokens");
            let s = by_attention.len();
            let want = reference_attention(format, &q, &ks, &vs, 1, s, hq, kvh, d);
            let got: Vec<f32> = oa.iter().map(|x| x.to_f32()).collect();
            let (err, _) = max_err(&got, &want);
            // V is within ±2: a form that rounds p moves o by up to its
            // bound of that.
            let tol = match format {
                KvFormat::Kv8 => 4e-3 + 2.0 * dev.fp8_p_rounding(hq, kvh, d),
                _ => 4e-3,
            };
            assert!(err <= tol, "{backend:?} {format:?} s={s}: err {err}");
        }
        assert!(by_attention.growths() >= 2, "{by_attention:?}");
        // Bad rows are refused and leave the cache as it was.
        let len = by_attention.len();
        let mut bad = randh(&mut r, kvh * d, 1.0);
        bad[5] = f16::NAN;
        let err = att.append(&mut by_attention, &bad, &bad, 1).unwrap_err();
        assert!(err.to_string().contains("finite"), "{err}");
        let short = att
            .append(&mut by_attention, &bad[1..], &bad, 1)
            .unwrap_err();
        assert!(short.to_string().contains("keys elements"), "{short}");
        let mut other = KvCache::new(format, 1, d, KvCapacity::Max(4)).unwrap();
        let wrong = att.append(&mut other, &bad, &bad, 1).unwrap_err();
        assert!(
            wrong.to_string().contains("KV cache (format, kvh, d)"),
            "{wrong}"
        );
        assert_eq!(by_attention.len(), len);
    }
}

#[test]
fn prefill_is_causal_and_matches_the_interpreter() {
    for backend in host_backends() {
        prefill_is_causal_on(backend, &device(backend, 2, None));
    }
}

/// A record's prefill blocks (measured by the autotuner) are the blocks
/// the x86 and NEON devices emit their prefill in, and it still matches
/// the interpreter; a record for another head dim leaves the default.
#[test]
fn prefill_runs_in_the_records_blocks() {
    for backend in host_backends() {
        if !matches!(backend, Backend::HostX86 | Backend::Neon) {
            continue;
        }
        let probe = device(backend, 2, None);
        let mut record = record_for(&probe, WeightFormat::W4A8, 40, 64, 3, 7);
        let blocks = PrefillBlocks { rows: 48, keys: 64 };
        record.entries[0].prefill = Some(PrefillEntry {
            heads: 6,
            kv_heads: 2,
            head_dim: 16,
            seq: 512,
            kv: "f16".into(),
            blocks: [blocks.rows, blocks.keys],
            default: [96, 128],
            measurements: vec![],
        });
        let dev = device(backend, 2, Some(record));
        let att = Attention::new(&dev, 6, 2, 16, KvFormat::F16).unwrap();
        assert_eq!(att.prefill_blocks(), Some(blocks), "{backend:?}");
        let other = Attention::new(&dev, 6, 2, 32, KvFormat::F16).unwrap();
        assert_eq!(
            other.prefill_blocks(),
            Some(PrefillBlocks::DEFAULT),
            "{backend:?}"
        );
        prefill_is_causal_on(backend, &dev);
    }
}

/// A record's decode form for fp8 values (measured by the autotuner) is
/// the one the x86 device emits for that head grouping, and decode still
/// matches the interpreter; another grouping keeps the default (the packed
/// form, f16 FMAs or bf16 dots, where the CPU has AVX512-FP16 or
/// AVX512_BF16, FMAs elsewhere).
#[test]
fn decode_runs_the_records_fp8_value_form() {
    if !host_backends().contains(&Backend::HostX86) {
        return;
    }
    let (hq, kvh, d) = (6, 2, 16);
    let probe = device(Backend::HostX86, 2, None);
    let default = probe.fp8_values_packed(hq, kvh, d);
    assert_eq!(
        default,
        tessera_codegen::x86::X86Backend::detect().is_ok_and(|b| b.packed_fp8_form().is_some()),
        "without a record: the packed form exactly where the CPU has one"
    );
    let mut record = record_for(&probe, WeightFormat::W4A8, 40, 64, 3, 7);
    record.entries[0].decode = Some(DecodeEntry {
        fp8_values_packed: false,
        packed: "f16 FMAs".into(),
        ..kv8_decode_entry(12, 4, d)
    });
    let dev = device(Backend::HostX86, 2, Some(record));
    assert!(!dev.fp8_values_packed(hq, kvh, d), "12/4 groups as 6/2");
    // The packed forms round p (bf16 dots to bf16, f16 FMAs to f16); f32
    // FMAs do not.
    let rounding = match probe.packed_fp8_form() {
        Some("bf16 dots") => 1.0 / 256.0,
        Some("f16 FMAs") => 1.0 / 2048.0,
        _ => 0.0,
    };
    assert_eq!(probe.fp8_p_rounding(hq, kvh, d), rounding);
    assert_eq!(dev.fp8_p_rounding(hq, kvh, d), 0.0, "the record's FMAs");
    assert_eq!(dev.fp8_p_rounding(hq, 1, d), rounding, "another grouping");
    assert_eq!(dev.fp8_values_packed(hq, 1, d), default, "another grouping");
    assert_eq!(
        dev.fp8_values_packed(hq, kvh, 32),
        default,
        "another head dim"
    );
    // Where the forms differ, their roundings do: the device must have
    // emitted the record's form, not merely reported it.
    let outputs = kv8_decode_bits_of([&probe, &dev], [hq, kvh, d], [1, 9, 70], 11);
    assert_eq!(
        outputs[0] != outputs[1],
        default,
        "the two devices' outputs differ exactly where the forms do"
    );
}

/// A kv8 `decode` entry for `heads` over `kv_heads` of `head_dim`: the
/// packed fp8 form (bf16 dots), no key or q form measured.
fn kv8_decode_entry(heads: usize, kv_heads: usize, head_dim: usize) -> DecodeEntry {
    DecodeEntry {
        heads,
        kv_heads,
        head_dim,
        ctx: 4096,
        kv: "kv8".into(),
        fp8_values_packed: true,
        packed: "bf16 dots".into(),
        measurements: vec![],
        int8_keys_in_lanes: None,
        key_measurements: vec![],
        int8_q_in_lanes: None,
        q_measurements: vec![],
    }
}

/// [`kv8_decode_bits`] of two devices on the same random inputs, for each
/// of `contexts` (`[hq, kvh, d]`, inputs from `seed`).
fn kv8_decode_bits_of(
    devs: [&Arc<Device>; 2],
    [hq, kvh, d]: [usize; 3],
    contexts: [usize; 3],
    seed: u64,
) -> [Vec<u16>; 2] {
    let mut r = rng(seed);
    let mut outputs: [Vec<u16>; 2] = Default::default();
    for s in contexts {
        let (k, v) = (randv(&mut r, s * kvh * d), randv(&mut r, s * kvh * d));
        let q = randh(&mut r, hq * d, 0.3);
        for (dev, bits) in devs.into_iter().zip(&mut outputs) {
            let why = format!(
                "s {s}, packed {}, key {:?}",
                dev.fp8_values_packed(hq, kvh, d),
                dev.int8_key_form(hq, kvh, d)
            );
            bits.extend(kv8_decode_bits(dev, [hq, kvh, d, s], &q, &k, &v, &why));
        }
    }
    outputs
}

/// One kv8 decode step on `dev` over `s` keys (`[hq, kvh, d, s]`), checked
/// against the interpreter's attention (`why` names the case), as f16 bits.
fn kv8_decode_bits(
    dev: &Arc<Device>,
    [hq, kvh, d, s]: [usize; 4],
    q: &[f16],
    k: &[f32],
    v: &[f32],
    why: &str,
) -> Vec<u16> {
    let att = Attention::new(dev, hq, kvh, d, KvFormat::Kv8).unwrap();
    let mut cache = KvCache::new(KvFormat::Kv8, kvh, d, KvCapacity::Max(s)).unwrap();
    cache.append(k, v, s).unwrap();
    let mut o = vec![f16::ZERO; hq * d];
    att.decode(q, &cache, &mut o).unwrap();
    let want = reference_attention(KvFormat::Kv8, q, k, v, 1, s, hq, kvh, d);
    let got: Vec<f32> = o.iter().map(|x| x.to_f32()).collect();
    let (err, _) = max_err(&got, &want);
    let v_max = v.iter().fold(0f32, |m, x| m.max(x.abs()));
    // Where q is rounded to int8 blocks, each score moves by at most
    // `r·Σ_b max|q_b|·Σ_b|k|` (r the rounding), and o by at most
    // `(e^{2·that} − 1)·max|v|`.
    let r = dev.q_int8_rounding(hq, kvh, d);
    let group = hq / kvh;
    let score_shift = (0..hq)
        .flat_map(|h| (0..s).map(move |j| (h, j)))
        .map(|(h, j)| {
            let (qh, kj) = (&q[h * d..(h + 1) * d], &k[(j * kvh + h / group) * d..][..d]);
            qh.chunks(32)
                .zip(kj.chunks(32))
                .map(|(qb, kb)| {
                    let m = qb.iter().fold(0f32, |m, x| m.max(x.to_f32().abs()));
                    m * kb.iter().map(|x| x.abs()).sum::<f32>()
                })
                .sum::<f32>()
        })
        .fold(0f32, f32::max)
        * r;
    let q_share = (2.0 * score_shift).exp_m1();
    let tol = 4e-3 + v_max * (dev.fp8_p_rounding(hq, kvh, d) + q_share);
    assert!(err <= tol, "{why}: err {err}");
    o.iter().map(|x| x.to_bits()).collect()
}

/// A record's int8 key form (measured by the autotuner) is the one the
/// x86 device reports and emits for that head grouping, keys in lanes by
/// default where the CPU has AVX512-VNNI and no AMX; both forms' decode
/// equals the interpreter's (and each other's, bit for bit: the forms
/// compute the same integer dots).
#[test]
fn decode_runs_the_records_int8_key_form() {
    if !host_backends().contains(&Backend::HostX86) {
        return;
    }
    let (hq, kvh, d) = (12, 2, 80);
    let probe = device(Backend::HostX86, 2, None);
    let lanes = tessera_codegen::x86::X86Backend::detect().is_ok_and(|b| b.has_int8_key_lanes());
    assert_eq!(
        probe.int8_keys_in_lanes(hq, kvh, d),
        lanes,
        "without a record: in lanes exactly where the CPU has the form"
    );
    let mut record = record_for(&probe, WeightFormat::W4A8, 40, 64, 3, 7);
    record.entries[0].decode = Some(DecodeEntry {
        int8_keys_in_lanes: Some(false),
        ..kv8_decode_entry(6, 1, d)
    });
    let dev = device(Backend::HostX86, 2, Some(record));
    assert!(!dev.int8_keys_in_lanes(hq, kvh, d), "6/1 groups as 12/2");
    assert_eq!(dev.int8_keys_in_lanes(8, 2, d), lanes, "another grouping");
    assert_eq!(
        dev.int8_keys_in_lanes(hq, kvh, 64),
        lanes,
        "another head dim"
    );
    if lanes {
        assert_eq!(
            probe.int8_key_form(hq, kvh, d),
            Some("zmm vpdpbusd, keys in lanes")
        );
        assert_eq!(dev.int8_key_form(hq, kvh, d), Some("zmm vpdpwssd"));
        assert_eq!(
            probe.int8_key_form(16, 2, d),
            Some("zmm vpdpwssd"),
            "tiles of 8"
        );
        assert_eq!(
            probe.int8_key_form(24, 2, d),
            Some("zmm vpdpbusd keys in lanes, vpdpwssd pairs"),
            "tiles of 8 and 4"
        );
        assert_eq!(
            probe.int8_key_form(4, 2, d),
            Some("zmm vpdpwssd"),
            "tiles of 2"
        );
    }
    let outputs = kv8_decode_bits_of([&probe, &dev], [hq, kvh, d], [3, 16, 70], 12);
    assert_eq!(outputs[0], outputs[1], "the key forms' outputs are equal");
}

/// A record's q form for keys in lanes (measured by the autotuner: int8
/// in 32-d blocks or i16) is the one the x86 device reports and emits for
/// that head grouping, only where it scores keys in lanes; without a
/// record q stays i16. Decode stays within the rounding's bound of the
/// interpreter, and differs from the i16 form's.
#[test]
fn decode_runs_the_records_int8_q_form() {
    if !host_backends().contains(&Backend::HostX86) {
        return;
    }
    let (hq, kvh, d) = (12, 2, 80);
    let probe = device(Backend::HostX86, 2, None);
    let lanes = tessera_codegen::x86::X86Backend::detect().is_ok_and(|b| b.has_int8_key_lanes());
    assert!(!probe.int8_q_in_lanes(hq, kvh, d), "without a record: i16");
    assert_eq!(probe.q_int8_rounding(hq, kvh, d), 0.0);
    let entry = |int8_keys_in_lanes| DecodeEntry {
        int8_keys_in_lanes,
        int8_q_in_lanes: Some(true),
        ..kv8_decode_entry(6, 1, d)
    };
    let mut record = record_for(&probe, WeightFormat::W4A8, 40, 64, 3, 7);
    record.entries[0].decode = Some(entry(Some(true)));
    let dev = device(Backend::HostX86, 2, Some(record.clone()));
    assert_eq!(dev.int8_q_in_lanes(hq, kvh, d), lanes, "6/1 groups as 12/2");
    let rounding = if lanes { 1.0 / 254.0 } else { 0.0 };
    assert_eq!(dev.q_int8_rounding(hq, kvh, d), rounding);
    assert!(!dev.int8_q_in_lanes(8, 2, d), "another grouping");
    assert!(!dev.int8_q_in_lanes(hq, kvh, 64), "another head dim");
    // Keys in pairs: no lanes loop to take int8 q.
    record.entries[0].decode = Some(entry(Some(false)));
    let pairs = device(Backend::HostX86, 2, Some(record));
    assert!(!pairs.int8_q_in_lanes(hq, kvh, d), "keys in pairs");
    if lanes {
        assert_eq!(
            dev.int8_key_form(hq, kvh, d),
            Some("zmm vpdpbusd, keys in lanes, q int8 in 32-d blocks")
        );
    }
    let outputs = kv8_decode_bits_of([&probe, &dev], [hq, kvh, d], [3, 16, 70], 13);
    assert_eq!(
        outputs[0] != outputs[1],
        lanes,
        "the outputs differ exactly where the device took int8 q"
    );
}

/// A record's weight prefetches (measured by the autotuner) are the ones
/// the x86 device emits its int8 and float matmuls with, and they still
/// match the interpreter; without a record the defaults stay, and entries
/// on another device are ignored.
#[test]
fn matmuls_prefetch_as_the_record_measured() {
    use tessera_codegen::x86::{WeightPrefetch, WeightStream};
    use tessera_runtime::record::{CacheLevel, PrefetchChoice};
    if !host_backends().contains(&Backend::HostX86) {
        return;
    }
    let probe = device(Backend::HostX86, 2, None);
    assert_eq!(
        probe.weight_prefetch(WeightStream::Int8),
        Some(WeightPrefetch::INT8)
    );
    assert_eq!(
        probe.weight_prefetch(WeightStream::Float),
        Some(WeightPrefetch::FLOAT)
    );
    let (n, k) = (40, 96);
    let entry = |format, stream: &str, bytes, level| {
        let mut r = record_for(&probe, format, n, k, 3, 7);
        let choice = |bytes, level| PrefetchChoice { bytes, level };
        r.entries[0].weight_prefetch = Some(PrefetchEntry {
            stream: stream.into(),
            chosen: choice(bytes, level),
            default: choice(4096, CacheLevel::L1),
            shape: [n, k],
            m: vec![1, 8],
            measurements: vec![],
        });
        r.entries.remove(0)
    };
    let record = TuningRecord {
        schema: RECORD_SCHEMA,
        entries: vec![
            entry(WeightFormat::Q4_0, "int8", 2048, CacheLevel::L1),
            entry(WeightFormat::F32, "float", 8192, CacheLevel::L2),
        ],
    };
    let mut elsewhere = record.clone();
    for e in &mut elsewhere.entries {
        e.fingerprint = Fingerprint {
            cpu_model: "another CPU".into(),
            ..probe.fingerprint().clone()
        };
    }
    let dev = device(Backend::HostX86, 2, Some(record));
    let int8 = dev.weight_prefetch(WeightStream::Int8).unwrap();
    assert_eq!(
        (int8.bytes(), int8.level()),
        (2048, tessera_codegen::x86::PrefetchLevel::L1)
    );
    let float = dev.weight_prefetch(WeightStream::Float).unwrap();
    assert_eq!(
        (float.bytes(), float.level()),
        (8192, tessera_codegen::x86::PrefetchLevel::L2)
    );
    for format in [
        WeightFormat::Q4_0,
        WeightFormat::W4A8,
        WeightFormat::Q8_0,
        WeightFormat::F32,
        WeightFormat::F16,
    ] {
        check_linear(&dev, format, n, k, &[1, 2, 5, 9]);
    }
    let other = device(Backend::HostX86, 2, Some(elsewhere));
    assert_eq!(
        other.weight_prefetch(WeightStream::Int8),
        Some(WeightPrefetch::INT8)
    );
    assert_eq!(
        other.weight_prefetch(WeightStream::Float),
        Some(WeightPrefetch::FLOAT)
    );
    if host_backends().contains(&Backend::HostClif) {
        let clif = device(Backend::HostClif, 1, None);
        assert_eq!(clif.weight_prefetch(WeightStream::Int8), None);
    }
}

fn prefill_is_causal_on(backend: Backend, dev: &Arc<Device>) {
    let dev = Arc::clone(dev);
    let (hq, kvh, d) = (6, 2, 16);
    // A prompt chunk of 9 (under one x86 row block) and of 60 (over it).
    for (format, t) in [KvFormat::F16, KvFormat::Kv8]
        .into_iter()
        .flat_map(|f| [9, 60].map(move |t| (f, t)))
    {
        let att = Attention::new(&dev, hq, kvh, d, format).unwrap();
        assert_eq!(
            att.prefills_whole(),
            matches!(backend, Backend::HostX86 | Backend::Neon),
            "{backend:?} {format:?}: the x86 and NEON devices run the whole prefill"
        );
        let mut cache = KvCache::new(format, kvh, d, KvCapacity::Max(80)).unwrap();
        let mut r = rng(11);
        // Three earlier tokens, then the prompt.
        let k0 = randv(&mut r, 3 * kvh * d);
        let v0 = randv(&mut r, 3 * kvh * d);
        cache.append(&k0, &v0, 3).unwrap();
        let k1 = randv(&mut r, t * kvh * d);
        let v1 = randv(&mut r, t * kvh * d);
        cache.append(&k1, &v1, t).unwrap();
        let q = randh(&mut r, t * hq * d, 0.3);
        let mut o = vec![f16::ZERO; t * hq * d];
        att.prefill(&q, t, &cache, &mut o).unwrap();
        let ks: Vec<f32> = k0.iter().chain(&k1).copied().collect();
        let vs: Vec<f32> = v0.iter().chain(&v1).copied().collect();
        let want = reference_attention(format, &q, &ks, &vs, t, 3 + t, hq, kvh, d);
        let got: Vec<f32> = o.iter().map(|x| x.to_f32()).collect();
        let (err, _) = max_err(&got, &want);
        assert!(err <= 4e-3, "{backend:?} {format:?} t={t} err {err}");
    }
}

/// A NaN in one head's q makes that head's output NaN on every device, as
/// in the interpreter (e^NaN is NaN), decode and prefill alike; the other
/// heads match it. A kernel whose exponential clamps NaN to its range's
/// floor gave the mean of V there instead, a plausible wrong answer.
#[test]
fn a_nan_in_q_is_nan_in_its_heads_output_on_every_device() {
    let (hq, kvh, d, s) = (6, 2, 32, 40);
    for (format, backend) in [KvFormat::F16, KvFormat::Kv8]
        .into_iter()
        .flat_map(|f| host_backends().into_iter().map(move |b| (f, b)))
    {
        let dev = device(backend, 2, None);
        let att = Attention::new(&dev, hq, kvh, d, format).unwrap();
        let mut cache = KvCache::new(format, kvh, d, KvCapacity::Max(s)).unwrap();
        let mut r = rng(17);
        let (ks, vs) = (randv(&mut r, s * kvh * d), randv(&mut r, s * kvh * d));
        cache.append(&ks, &vs, s).unwrap();
        for t in [1, 5] {
            let mut q = randh(&mut r, t * hq * d, 0.3);
            // Head 1 of the last token (of every token for decode).
            q[(t - 1) * hq * d + d + 3] = f16::NAN;
            let mut o = vec![f16::ZERO; t * hq * d];
            if t == 1 {
                att.decode(&q, &cache, &mut o).unwrap();
            } else {
                att.prefill(&q, t, &cache, &mut o).unwrap();
            }
            let want = reference_attention(format, &q, &ks, &vs, t, s, hq, kvh, d);
            for (i, (g, w)) in o.iter().zip(&want).enumerate() {
                let (g, what) = (g.to_f32(), format!("{backend:?} {format:?} t={t} o[{i}]"));
                let nan_row = i / d == (t - 1) * hq + 1;
                assert_eq!(w.is_nan(), nan_row, "{what}: the interpreter's NaN");
                if nan_row {
                    assert!(g.is_nan(), "{what} = {g}, want NaN");
                } else {
                    assert!((g - w).abs() <= 4e-3, "{what} = {g}, want {w}");
                }
            }
        }
    }
}

/// Appending a prompt and attending to it in one call is the two calls in
/// order and matches the interpreter; a call refused for q's shape leaves
/// the cache as it was.
#[test]
fn append_prefill_is_append_then_prefill() {
    let (hq, kvh, d, t) = (4, 2, 16, 7);
    for backend in host_backends() {
        let dev = device(backend, 2, None);
        for format in [KvFormat::F16, KvFormat::Kv8] {
            let att = Attention::new(&dev, hq, kvh, d, format).unwrap();
            let mut r = rng(23);
            let k = randh(&mut r, t * kvh * d, 1.0);
            let v = randh(&mut r, t * kvh * d, 1.0);
            let q = randh(&mut r, t * hq * d, 0.3);
            let (mut one, mut two) = (
                KvCache::new(format, kvh, d, KvCapacity::Chunked(4)).unwrap(),
                KvCache::new(format, kvh, d, KvCapacity::Chunked(4)).unwrap(),
            );
            let (mut o1, mut o2) = (vec![f16::ZERO; t * hq * d], vec![f16::ZERO; t * hq * d]);
            att.append_prefill(&mut one, &q, &k, &v, t, &mut o1)
                .unwrap();
            att.append(&mut two, &k, &v, t).unwrap();
            att.prefill(&q, t, &two, &mut o2).unwrap();
            assert_eq!(o1, o2, "{backend:?} {format:?}");
            let f32s = |x: &[f16]| -> Vec<f32> { x.iter().map(|h| h.to_f32()).collect() };
            let want = reference_attention(format, &q, &f32s(&k), &f32s(&v), t, t, hq, kvh, d);
            let (err, _) = max_err(&f32s(&o1), &want);
            assert!(err <= 4e-3, "{backend:?} {format:?} err {err}");
            assert_eq!(one.len(), t);
            let e = att
                .append_prefill(&mut one, &q[1..], &k, &v, t, &mut o1)
                .unwrap_err();
            assert!(e.to_string().contains("q elements"), "{e}");
            assert_eq!(one.len(), t, "a refused call appended nothing");
        }
    }
}

#[test]
fn more_threads_than_output_channels_is_still_correct() {
    for backend in host_backends() {
        let dev = device(backend, 8, None);
        assert_eq!(dev.threads(), 8);
        check_linear(&dev, WeightFormat::F32, 3, 40, &[1, 4, 20]);
        check_linear(&dev, WeightFormat::W4A8, 5, 64, &[1, 9, 17]);
        let att = Attention::new(&dev, 2, 1, 16, KvFormat::F16).unwrap();
        let mut cache = KvCache::new(KvFormat::F16, 1, 16, KvCapacity::Chunked(2)).unwrap();
        let mut r = rng(5);
        let k = randv(&mut r, 3 * 16);
        let v = randv(&mut r, 3 * 16);
        cache.append(&k, &v, 3).unwrap();
        let q = randh(&mut r, 3 * 2 * 16, 0.3);
        let mut o = vec![f16::ZERO; 3 * 2 * 16];
        att.prefill(&q, 3, &cache, &mut o).unwrap();
        let want = reference_attention(KvFormat::F16, &q, &k, &v, 3, 3, 2, 1, 16);
        let got: Vec<f32> = o.iter().map(|x| x.to_f32()).collect();
        assert!(max_err(&got, &want).0 <= 4e-3);
    }
}

#[test]
fn kernels_are_prepared_once_per_device() {
    let dev = device(Backend::HostClif, 1, None);
    let shapes = [(32, 64), (32, 64), (48, 64)];
    dev.prepare(WeightFormat::F32, &shapes).unwrap();
    let after = dev.prepared_kernels();
    dev.prepare(WeightFormat::F32, &shapes).unwrap();
    assert_eq!(dev.prepared_kernels(), after);
    assert!(after <= 6, "{after}");
}

/// Per-M flat tiles: with solver defaults every flat M runs a kernel of
/// min(M, flat ep) rows on the flat tile's one packing, prepared on first
/// use, and matches the interpreter.
#[test]
fn the_flat_range_runs_a_tile_of_the_real_m() {
    for backend in host_backends() {
        let dev = device(backend, 2, None);
        for format in [WeightFormat::F32, WeightFormat::F16, WeightFormat::W8A8] {
            let (n, k) = (37, 72);
            let mut r = rng(11);
            let w = randv(&mut r, n * k);
            let bias = randv(&mut r, n);
            let lin = Linear::new(&dev, format, Weights::F32(&w), n, k, Some(&bias)).unwrap();
            let plan = lin.plan().clone();
            let flat = plan.plan(Variant::FlatGemm).tile;
            assert!(
                !plan.flat_steps.is_empty() || flat[0] as usize <= plan.m1,
                "{plan}"
            );
            // The row unit of the MAC (2 rows for i8mm's smmla, else 1):
            // every flat tile's ep is a multiple of it.
            let gcd = |mut a: u32, mut b: u32| {
                while b != 0 {
                    (a, b) = (b, a % b);
                }
                a
            };
            let unit = plan.flat_steps.iter().map(|s| s.tile[0]).fold(flat[0], gcd);
            let before = dev.prepared_kernels();
            for m in 1..plan.m2 + 2 {
                let want_tile = plan.tile_for(m);
                if lin.variant_for(m) == Variant::FlatGemm {
                    let rows = (m as u32).min(flat[0]).div_ceil(unit) * unit;
                    assert_eq!(
                        want_tile,
                        [rows, flat[1], flat[2]],
                        "{backend:?} {format} m={m}"
                    );
                }
                assert_eq!(
                    lin.kernel_tile(m),
                    Some(want_tile),
                    "{backend:?} {format} m={m}"
                );
                let x = randv(&mut r, m * k);
                let what = format!("{backend:?} {format} m={m} ({plan})");
                assert_matches_reference(&lin, backend, &x, (&w, &bias), m, &what);
            }
            let steps_below_ep = plan.flat_steps.iter().filter(|s| s.tile != flat).count();
            assert!(dev.prepared_kernels() >= before + steps_below_ep.min(1));
            assert!(lin.packings() <= 3);
        }
    }
}

/// A record's flat steps are followed as written; a record without steps
/// (written before them) keeps its one flat tile for the whole flat range.
#[test]
fn records_with_and_without_flat_steps() {
    let (n, k, m1, m2) = (40, 64, 2, 12);
    let backend = *host_backends().last().unwrap();
    let probe = device(backend, 1, None);
    let old = record_for(&probe, WeightFormat::F32, n, k, m1, m2);
    let flat = old.entries[0].shapes[0]
        .winner(Variant::FlatGemm)
        .unwrap()
        .tile;
    let mut r = rng(5);
    let w = randv(&mut r, n * k);
    let dev = device(backend, 1, Some(old.clone()));
    let lin = Linear::new(&dev, WeightFormat::F32, Weights::F32(&w), n, k, None).unwrap();
    assert!(lin.plan().flat_steps.is_empty(), "{}", lin.plan());
    for m in m1..m2 {
        assert_eq!(lin.kernel_tile(m), Some(flat), "m={m}");
    }

    let mut stepped = old;
    let step = |from_m: usize, ep: u32| Winner {
        variant: Variant::FlatGemm,
        target: "test".into(),
        tile: [ep, flat[1], flat[2]],
        kernel: String::new(),
        from_m: Some(from_m),
    };
    // M 2-3: 2 rows (M = 3 as two row blocks), M 4-11: 4 rows.
    stepped.entries[0].shapes[0]
        .winners
        .extend([step(4, 4), step(2, 2)]);
    let dev = device(backend, 1, Some(stepped));
    let bias = vec![0.0; n];
    let lin = Linear::new(&dev, WeightFormat::F32, Weights::F32(&w), n, k, None).unwrap();
    assert!(lin.plan().flat_steps.iter().all(|s| s.from_record));
    for (m, ep) in [
        (1, None),
        (2, Some(2)),
        (3, Some(2)),
        (4, Some(4)),
        (11, Some(4)),
    ] {
        let got = lin.kernel_tile(m);
        match ep {
            Some(ep) => assert_eq!(got, Some([ep, flat[1], flat[2]]), "m={m}"),
            None => assert_eq!(lin.variant_for(m), Variant::Gemv),
        }
        let x = randv(&mut r, m * k);
        let y = run_linear(&lin, &x, m);
        let (err, scale) = max_err(&y, &reference(WeightFormat::F32, &x, &w, &bias, m, n, k));
        assert!(err <= 1e-4 * (1.0 + scale), "m={m} err {err}");
    }
}

/// A recorded flat step may run on the GEMM's packing (the tuner times the
/// two at each M of few rows): the Linear reads the GEMM's packed copy for
/// it, holds no new one, and matches the interpreter; a recorded step of a
/// packing no variant has takes its M's default step. Every host backend,
/// a 4-bit format (Q4_0; W4A8 on cranelift, which reads f32 parameters)
/// and f32.
#[test]
fn a_flat_step_may_run_on_the_gemm_packing() {
    let (n, k, m1, m2) = (72, 96, 2, 12);
    for backend in host_backends() {
        let four_bit = match backend {
            Backend::HostClif => WeightFormat::W4A8,
            _ => WeightFormat::Q4_0,
        };
        for format in [four_bit, WeightFormat::F32] {
            let probe = device(backend, 1, None);
            let mut rec = record_for(&probe, format, n, k, m1, m2);
            let shape = &rec.entries[0].shapes[0];
            let flat = shape.winner(Variant::FlatGemm).unwrap().tile;
            let gemm = shape.winner(Variant::Gemm).unwrap().tile;
            if gemm[1..] == flat[1..] {
                eprintln!("SKIP {backend:?} {format}: the GEMM packs like the flat tile");
                continue;
            }
            let step = |from_m: usize, tile: [u32; 3]| Winner {
                variant: Variant::FlatGemm,
                target: "test".into(),
                tile,
                kernel: String::new(),
                from_m: Some(from_m),
            };
            let held: Vec<u32> = shape.winners.iter().map(|w| w.tile[1]).collect();
            let odd_hp = (2..)
                .map(|times| flat[1] * times)
                .find(|hp| !held.contains(hp))
                .unwrap();
            let odd = [3, odd_hp, flat[2]];
            rec.entries[0].shapes[0].winners.extend([
                step(2, [2, gemm[1], gemm[2]]),
                step(3, odd),
                step(4, [4, flat[1], flat[2]]),
            ]);
            let dev = device(backend, 2, Some(rec));
            let mut r = rng(13);
            let w = randv(&mut r, n * k);
            let bias = randv(&mut r, n);
            let lin = Linear::new(&dev, format, Weights::F32(&w), n, k, Some(&bias)).unwrap();
            let plan = lin.plan().to_string();
            assert!(lin.packings() <= 3, "{plan}");
            // M = 3 takes its default step: 3 rows of the flat packing, or
            // 4 where the MAC's row unit is 2 (i8mm's smmla).
            let wants = [
                (2, [2, gemm[1], gemm[2]]),
                (3, [3, flat[1], flat[2]]),
                (4, [4, flat[1], flat[2]]),
                (11, [4, flat[1], flat[2]]),
            ];
            for (m, want) in wants {
                let got = lin.kernel_tile(m).unwrap();
                let rounded_up = m == 3 && got == [4, flat[1], flat[2]];
                assert!(
                    got == want || rounded_up,
                    "{backend:?} {format} m={m}: {got:?}, want {want:?} ({plan})"
                );
                let x = randv(&mut r, m * k);
                let what = format!("{backend:?} {format} m={m} ({plan})");
                assert_matches_reference(&lin, backend, &x, (&w, &bias), m, &what);
            }
        }
    }
}

/// A record whose GEMV and flat winners are zmm tiles (the tuner offers the
/// AVX-512 kernels' tiles on x86 with AVX-512, in shapes the AVX2 target
/// has no tile of) runs them on the AVX-512 kernel, flat steps included,
/// and matches the interpreter. SKIP without AVX-512.
#[test]
fn zmm_gemv_and_flat_winners_run_on_the_avx512_kernel() {
    if !(tessera_codegen::x86::missing_features().is_empty()
        && tessera_codegen::x86::host_has_avx512())
    {
        eprintln!("SKIP: no AVX-512");
        return;
    }
    let (n, k, m1, m2) = (100, 200, 2, 12);
    let probe = device(Backend::HostX86, 1, None);
    let mut rec = record_for(&probe, WeightFormat::F32, n, k, m1, m2);
    let zmm = |from_m: Option<usize>, ep: u32| Winner {
        variant: Variant::FlatGemm,
        target: "x86-avx512".into(),
        tile: [ep, 48, 1],
        kernel: String::new(),
        from_m,
    };
    let winners = &mut rec.entries[0].shapes[0].winners;
    winners.retain(|w| w.variant == Variant::Gemm);
    winners.extend([zmm(None, 8), zmm(Some(2), 2), zmm(Some(4), 8)]);
    // 8 zmm accumulators: no AVX2 tile has this shape.
    winners.push(Winner {
        variant: Variant::Gemv,
        target: "x86-avx512".into(),
        tile: [1, 128, 1],
        kernel: String::new(),
        from_m: None,
    });
    let dev = device(Backend::HostX86, 2, Some(rec));
    let mut r = rng(9);
    let w = randv(&mut r, n * k);
    let bias = vec![0.0; n];
    let lin = Linear::new(&dev, WeightFormat::F32, Weights::F32(&w), n, k, None).unwrap();
    for (m, tile) in [
        (1, [1, 128, 1]),
        (2, [2, 48, 1]),
        (3, [2, 48, 1]),
        (4, [8, 48, 1]),
        (11, [8, 48, 1]),
    ] {
        assert_eq!(lin.kernel_tile(m), Some(tile), "m={m}");
        let x = randv(&mut r, m * k);
        let y = run_linear(&lin, &x, m);
        let (err, scale) = max_err(&y, &reference(WeightFormat::F32, &x, &w, &bias, m, n, k));
        assert!(err <= 1e-4 * (1.0 + scale), "m={m} err {err}");
    }
}

/// A recorded flat step names the target it was timed on: a Q4_0 tile of
/// 4 rows and 16 columns exists on both x86 targets with AVX-512 (the
/// GEMM's packing), and the record's zmm choice and ymm choice each run and
/// match the interpreter; the plan shows the named targets. SKIP without
/// AVX512-VNNI.
#[test]
fn a_flat_step_runs_on_the_target_its_record_names() {
    use tessera_codegen::x86;
    if !(x86::missing_features().is_empty()
        && x86::host_has_avx512()
        && x86::host_has_avx512_vnni())
    {
        eprintln!("SKIP: no AVX512-VNNI");
        return;
    }
    let (n, k, m1, m2) = (72, 96, 2, 12);
    let probe = device(Backend::HostX86, 1, None);
    let rec = record_for(&probe, WeightFormat::Q4_0, n, k, m1, m2);
    let gemm = rec.entries[0].shapes[0].winner(Variant::Gemm).unwrap().tile;
    if gemm[1] != 16 {
        eprintln!("SKIP: the GEMM tile {gemm:?} is not 16 columns wide");
        return;
    }
    let mut r = rng(17);
    let w = randv(&mut r, n * k);
    let bias = randv(&mut r, n);
    for (two, four) in [(x86::NAME, x86::AVX512_NAME), (x86::AVX512_NAME, x86::NAME)] {
        let mut rec = rec.clone();
        let step = |from_m: usize, ep: u32, target: &str| Winner {
            variant: Variant::FlatGemm,
            target: target.into(),
            tile: [ep, gemm[1], gemm[2]],
            kernel: String::new(),
            from_m: Some(from_m),
        };
        rec.entries[0].shapes[0]
            .winners
            .extend([step(2, 2, two), step(4, 4, four)]);
        let dev = device(Backend::HostX86, 2, Some(rec));
        let lin = Linear::new(
            &dev,
            WeightFormat::Q4_0,
            Weights::F32(&w),
            n,
            k,
            Some(&bias),
        )
        .unwrap();
        let plan = lin.plan().to_string();
        assert!(plan.contains(&format!("2:2x16x4@{two}")), "{plan}");
        assert!(plan.contains(&format!("4:4x16x4@{four}")), "{plan}");
        for m in 2..8 {
            let x = randv(&mut r, m * k);
            let what = format!("m={m} ({plan})");
            assert_matches_reference(&lin, Backend::HostX86, &x, (&w, &bias), m, &what);
        }
    }
}

/// Layers that read one input (Q, K, V; gate, up) through a `SharedInput`:
/// the result is bit for bit each layer's own `forward`, which matches the
/// interpreter; layers of one shape share one quantization; layers of
/// other formats (another weight group, 8-bit weights) get their own; the
/// buffers carry over to the next call's input without stale values.
#[test]
fn shared_input_quantizes_once_and_changes_no_result() {
    let k = 96;
    for backend in host_backends() {
        let dev = device(backend, 2, None);
        let mut formats = vec![WeightFormat::W4A8, WeightFormat::W8A8];
        if backend != Backend::HostClif {
            formats.push(WeightFormat::Q4_0);
        }
        let mut r = rng(71);
        // Q, K, V of one format (K and V of one shape), then one layer of
        // every other format.
        let mut layers = Vec::new();
        for (i, &format) in formats.iter().enumerate() {
            let ns: &[usize] = if i == 0 { &[45, 13, 13] } else { &[13] };
            for &n in ns {
                let w = randv(&mut r, n * k);
                let bias = randv(&mut r, n);
                let lin = Linear::new(&dev, format, Weights::F32(&w), n, k, Some(&bias)).unwrap();
                layers.push((lin, w, bias));
            }
        }
        let mut buffers = tessera_runtime::InputBuffers::default();
        // 400 rows: m·k above the size where the quantizer splits over threads.
        for m in [1usize, 3, 17, 2, 400, 33] {
            let x = randv(&mut r, m * k);
            let shared = tessera_runtime::SharedInput::with_buffers(
                tessera_runtime::Input::F32(&x),
                m,
                buffers,
            );
            for (lin, w, bias) in &layers {
                let n = lin.n();
                let mut got = vec![f32::NAN; m * n];
                lin.forward_shared(&shared, tessera_runtime::Output::F32(&mut got))
                    .unwrap();
                let own = run_linear(lin, &x, m);
                assert_eq!(
                    got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    own.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    "{backend:?} {} n={n} m={m}: sharing changed the result",
                    lin.format()
                );
                let want = reference(lin.format(), &x, w, bias, m, n, k);
                let (err, scale) = max_err(&got, &want);
                let tol = tolerance(backend, lin.format(), k, scale);
                assert!(
                    err <= tol,
                    "{backend:?} {} m={m}: {err} > {tol}",
                    lin.format()
                );
            }
            // K and V share one plan, so at most every layer but one
            // quantized; the 4-bit formats' groups of 32 and W8A8's whole
            // rows need two quantizations at least (Q4_0 and W4A8 may share
            // one: same quantizer, same group).
            let q = shared.quantizations();
            assert!(
                q >= 2 && q < layers.len(),
                "{backend:?} m={m}: {q} quantizations for {} layers",
                layers.len()
            );
            buffers = shared.into_buffers();
        }
    }
}

/// `one_weight_copy`: every Linear holds one packed copy of its weights
/// (the GEMM's packing) and still matches the interpreter at every M, the
/// GEMV and flat ranges included.
#[test]
fn one_weight_copy_packs_once_and_matches_the_interpreter() {
    for backend in host_backends() {
        let dev = Arc::new(
            Device::open(
                backend,
                DeviceOptions {
                    threads: Some(2),
                    one_weight_copy: true,
                    ..Default::default()
                },
            )
            .expect("open"),
        );
        let mut formats = vec![
            WeightFormat::F32,
            WeightFormat::W8A8,
            WeightFormat::W4A8,
            WeightFormat::F16,
        ];
        if backend != Backend::HostClif {
            formats.extend([WeightFormat::Q4_0, WeightFormat::Q8_0]);
        }
        let (n, k) = (45, 96);
        for format in formats {
            let mut r = rng(5);
            let w = randv(&mut r, n * k);
            let bias = randv(&mut r, n);
            let lin = Linear::new(&dev, format, Weights::F32(&w), n, k, Some(&bias)).unwrap();
            assert_eq!(lin.packings(), 1, "{backend:?} {format}: {}", lin.plan());
            for m in [1usize, 2, 3, 5, 15, 16, 17, 33] {
                let x = randv(&mut r, m * k);
                let what = format!("{backend:?} {format} m={m} ({})", lin.plan());
                assert_matches_reference(&lin, backend, &x, (&w, &bias), m, &what);
            }
        }
    }
}

/// A prebuilt set of NEON Q4_0 code (what `tessera-kernels-gen` writes
/// for the aarch64 targets: the loops of signed codes) runs on a device
/// opened with it, so the runtime packs its weights signed to match: the
/// device's kernel layout follows the set's architecture, not the JIT.
#[cfg(target_arch = "aarch64")]
#[test]
fn a_prebuilt_neon_set_gets_the_signed_codes_its_code_reads() {
    use tessera_codegen::artifact::{Arch, Artifact, Backend as _};
    use tessera_codegen::neon::{NeonBackend, with_signed_codes};
    use tessera_codegen::tile::{Problem, solve};
    use tessera_runtime::{PrebuiltKernel, PrebuiltSet};

    let neon = NeonBackend::detect().expect("an aarch64 host");
    let kernel = with_signed_codes(&library::get("matmul-q4_0").unwrap()).unwrap();
    let mut set = PrebuiltSet::new(current_generator());
    for variant in Variant::ALL {
        let caps = neon.target(&kernel, variant);
        let mut problem = Problem::from_kernel(caps, &kernel).unwrap();
        problem.e = match variant {
            Variant::Gemv => 1,
            Variant::FlatGemm => 8,
            Variant::Gemm => 256,
        };
        let (tile, code) = solve(caps, &problem)
            .unwrap()
            .into_iter()
            .find_map(|t| match neon.emit_variant(&kernel, &t, variant) {
                Ok(Artifact::Machine(code)) => Some((t, code)),
                _ => None,
            })
            .expect("a tile NEON emits");
        let quantizer = neon.quantizer(&kernel, &tile).unwrap().map(|q| q.bytes);
        set.push(PrebuiltKernel::matmul(
            "matmul-q4_0",
            "signed codes",
            variant,
            [tile.ep, tile.hp, tile.lp],
            Arch::Aarch64,
            code.bytes,
            quantizer,
        ));
    }
    let dev = Arc::new(
        Device::open(
            Backend::Neon,
            DeviceOptions {
                threads: Some(2),
                prebuilt: Some(set),
                ..Default::default()
            },
        )
        .expect("open with the prebuilt set"),
    );
    check_linear(&dev, WeightFormat::Q4_0, 45, 96, &[1, 2, 5, 17, 33]);
}
