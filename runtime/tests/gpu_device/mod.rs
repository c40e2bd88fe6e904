//! The GPU devices' end-to-end tests, shared by OpenCL (`opencl_device`)
//! and CUDA (`cuda_device`): `Linear` for every GPU format against the
//! reference interpreter at M around both breakpoints (defaults and a
//! record's), with tails in N and K, weights uploaded once; `Attention`
//! over a device-resident KV cache that grows past its first chunk (decode
//! and prefill, f16 and kv8); bad shapes and misplaced caches as `Err`.
//! Each backend's file opens its device (or prints SKIP) and names what
//! differs ([`Gpu`]).

use std::sync::{Arc, MutexGuard};

use half::f16;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tessera_dsl::interp::{Bindings, Value, run};
use tessera_dsl::ir::Variant;
use tessera_dsl::library;
use tessera_dsl::quant::quantize;
use tessera_runtime::device::Fingerprint;
use tessera_runtime::record::{DeviceEntry, Limits, ShapeEntry, TuningRecord, Winner};
use tessera_runtime::{
    Attention, Device, Input, KvCache, KvCapacity, KvFormat, Linear, Output, PlanSource,
    RuntimeError, WeightFormat, Weights,
};

/// An opened device with the guard that keeps other tests off it.
pub type Opened = (Arc<Device>, MutexGuard<'static, ()>);

/// What differs between the GPU backends under test.
pub struct Gpu {
    /// The device, or None after printing SKIP (or failing, under CI, where
    /// the backend's tool is required).
    pub open: fn(&str, Option<TuningRecord>) -> Option<Opened>,
    /// As the fingerprint's assertion message says it.
    pub name: &'static str,
    /// A record's winner target and backend on this GPU.
    pub record_target: &'static str,
    pub record_backend: &'static str,
    pub seed: u64,
}

/// The interpreter's y for `format` (f32, or f16 widened).
pub fn reference(
    format: WeightFormat,
    x: &[f16],
    w: &Value,
    bias: &[f32],
    m: usize,
    n: usize,
    k: usize,
) -> Vec<f32> {
    let kernel = tessera_codegen::gpu::with_gpu_weight_layout(
        &library::get(format.library_kernel()).unwrap(),
    )
    .unwrap();
    let b = Bindings::new()
        .extent("e", m)
        .extent("h", n)
        .extent("l", k)
        .tensor("x", Value::F16(x.to_vec()))
        .tensor("w", w.clone())
        .tensor("bias", Value::F32(bias.to_vec()));
    run(&kernel, &b).unwrap().get("y").unwrap().to_vec()
}

pub struct LinearCase {
    pub raw: Vec<f32>,
    pub logical: Value,
    pub dense: Vec<f32>,
    pub bias: Vec<f32>,
}

pub fn linear_case(format: WeightFormat, n: usize, k: usize, rng: &mut ChaCha8Rng) -> LinearCase {
    let raw: Vec<f32> = (0..n * k).map(|_| rng.gen_range(-0.5..0.7)).collect();
    let kernel = library::get(format.library_kernel()).unwrap();
    let wf = kernel.tensor("w").unwrap().format;
    // `dense` is what each weight's rounding scales with: the tensor-core
    // kernels form `scale·v + offset` in f16, rounding |scale·v| and
    // |offset| (many times |w| near cancellation, as E0M4's v in [2, 4)
    // against its offset).
    let (logical, dense) = if wf.is_quantized() {
        let q = quantize(wf, n, k, &raw).unwrap();
        let mut d = Vec::with_capacity(n * k);
        for r in 0..n {
            for c in 0..k {
                let w = q.value(r, c);
                let o = if q.offsets.is_empty() {
                    0.0
                } else {
                    q.offset(r, c)
                };
                d.push(w.abs() + (w - o).abs() + o.abs());
            }
        }
        (Value::Quant(q), d)
    } else {
        let h: Vec<f16> = raw.iter().map(|&v| f16::from_f32(v)).collect();
        let d = h.iter().map(|v| v.to_f32()).collect();
        (Value::F16(h), d)
    };
    let bias = (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect();
    LinearCase {
        raw,
        logical,
        dense,
        bias,
    }
}

/// Every weight format the GPU devices serve.
const GPU_FORMATS: [WeightFormat; 7] = [
    WeightFormat::F16,
    WeightFormat::W4A16,
    WeightFormat::W8A16,
    WeightFormat::E0M4A16,
    WeightFormat::Q4_0A16,
    WeightFormat::Q4_1A16,
    WeightFormat::Q8_0A16,
];

/// A random `[n, k]` case in `format` and its `Linear` on `dev`, with bias.
fn gpu_linear(
    dev: &Arc<Device>,
    format: WeightFormat,
    n: usize,
    k: usize,
    rng: &mut ChaCha8Rng,
) -> (LinearCase, Linear) {
    let c = linear_case(format, n, k, rng);
    let lin = Linear::new(dev, format, Weights::F32(&c.raw), n, k, Some(&c.bias)).unwrap();
    (c, lin)
}

/// `lin`'s output for `x` at `m` rows, as f32 (f16 outputs widened).
fn forward(lin: &Linear, x: &[f16], m: usize) -> Vec<f32> {
    let n = lin.n();
    if lin.format().output() == tessera_dsl::Format::F16 {
        let mut y = vec![f16::ZERO; m * n];
        lin.forward(Input::F16(x), m, Output::F16(&mut y)).unwrap();
        y.iter().map(|v| v.to_f32()).collect()
    } else {
        let mut y = vec![0f32; m * n];
        lin.forward(Input::F16(x), m, Output::F32(&mut y)).unwrap();
        y
    }
}

/// Runs `lin` at `m` rows and compares with the interpreter.
pub fn check_forward(lin: &Linear, c: &LinearCase, m: usize, rng: &mut ChaCha8Rng) {
    let (n, k, format) = (lin.n(), lin.k(), lin.format());
    let x: Vec<f16> = (0..m * k)
        .map(|_| f16::from_f32(rng.gen_range(-1.0..1.0)))
        .collect();
    let got = forward(lin, &x, m);
    let want = reference(format, &x, &c.logical, &c.bias, m, n, k);
    for i in 0..m * n {
        let (row, col) = (i / n, i % n);
        let magnitude: f64 = (0..k)
            .map(|l| {
                f64::from(x[row * k + l].to_f32()).abs() * f64::from(c.dense[col * k + l]).abs()
            })
            .sum::<f64>()
            + f64::from(c.bias[col].abs());
        let tol = 2f64.powi(-10) * magnitude + 1e-4 + 2f64.powi(-10) * f64::from(want[i].abs());
        let err = (f64::from(got[i]) - f64::from(want[i])).abs();
        assert!(
            err <= tol,
            "{format} m={m} ({}) [{n}, {k}] at {i}: got {} want {} (err {err:e} > {tol:e})",
            lin.variant_for(m),
            got[i],
            want[i]
        );
    }
}

pub fn device_objects_are_shareable_across_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Device>();
    send_sync::<Linear>();
    send_sync::<Attention>();
    send_sync::<KvCache>();
}

pub fn linear_every_gpu_format_at_the_default_breakpoints(gpu: &Gpu) {
    let Some((dev, _g)) = (gpu.open)("linear_every_gpu_format_at_the_default_breakpoints", None)
    else {
        return;
    };
    assert!(dev.is_gpu());
    assert!(
        !dev.fingerprint().gpus.is_empty(),
        "the fingerprint names the {} device",
        gpu.name
    );
    let mut rng = ChaCha8Rng::seed_from_u64(gpu.seed);
    let (n, k) = (37, 70);
    for format in GPU_FORMATS {
        let (c, lin) = gpu_linear(&dev, format, n, k, &mut rng);
        let plan = lin.plan().clone();
        assert!(matches!(plan.source, PlanSource::Defaults { .. }), "{plan}");
        assert_eq!(lin.packings(), 1, "one upload serves every variant");
        let (m1, m2) = (plan.m1, plan.m2);
        for m in [m1 - 1, m1, m2 - 1, m2, m2 + 3] {
            let want = if m < m1 {
                Variant::Gemv
            } else if m < m2 {
                Variant::FlatGemm
            } else {
                Variant::Gemm
            };
            assert_eq!(lin.variant_for(m), want);
            check_forward(&lin, &c, m, &mut rng);
        }
    }
    // Programs are built once per device: a second Linear of the same
    // shape family builds nothing new.
    let before = dev.prepared_kernels();
    let c = linear_case(WeightFormat::W4A16, n, k, &mut rng);
    let _again = Linear::new(&dev, WeightFormat::W4A16, Weights::F32(&c.raw), n, k, None).unwrap();
    assert_eq!(dev.prepared_kernels(), before);
}

/// Non-finite activations mean what the interpreter says, in every
/// variant and GPU format: a NaN makes its row NaN; an infinity makes it
/// ±inf (NaN where a weight is exactly 0 or infinities of both signs meet).
/// The GEMV forms weights in f32 as the interpreter does and matches it
/// exactly; the tiled kernels form them in f16 (on CUDA's tensor cores), so
/// a weight that cancels to 0 in one and not the other turns inf·w into NaN
/// or ±inf: there every output the interpreter makes non-finite must be
/// non-finite. Row 0 carries a NaN (one in the k tail too), +inf, or -inf
/// and a NaN; the other rows are finite.
pub fn linear_non_finite_activations_match_the_interpreter(gpu: &Gpu) {
    let Some((dev, _g)) = (gpu.open)("linear_non_finite_activations_match_the_interpreter", None)
    else {
        return;
    };
    let mut rng = ChaCha8Rng::seed_from_u64(gpu.seed + 1);
    let (n, k) = (37, 70);
    for format in GPU_FORMATS {
        let (c, lin) = gpu_linear(&dev, format, n, k, &mut rng);
        let (m1, m2) = (lin.plan().m1, lin.plan().m2);
        let mut ms = vec![1, m1.saturating_sub(1).max(1), m1, m2];
        ms.dedup();
        for m in ms {
            // Row 0 carries one pattern per run; the other rows are finite.
            for pattern in 0..3 {
                let mut x: Vec<f16> = (0..m * k)
                    .map(|_| f16::from_f32(rng.gen_range(-1.0..1.0)))
                    .collect();
                match pattern {
                    0 => {
                        x[5] = f16::NAN;
                        x[k - 1] = f16::NAN;
                    }
                    1 => x[7] = f16::INFINITY,
                    _ => {
                        x[0] = f16::NEG_INFINITY;
                        x[3] = f16::NAN;
                    }
                }
                let got = forward(&lin, &x, m);
                let want = reference(format, &x, &c.logical, &c.bias, m, n, k);
                let gemv = lin.variant_for(m) == Variant::Gemv;
                for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                    let row = i / n;
                    let same = if row > 0 {
                        g.is_finite()
                    } else if pattern != 1 || (gemv && w.is_nan()) {
                        g.is_nan()
                    } else if gemv {
                        g == w
                    } else {
                        !g.is_finite()
                    };
                    assert!(
                        same,
                        "{} {format} m={m} ({}) pattern {pattern}: y[{row}, {}] = {g}, \
                         interpreter {w}",
                        gpu.name,
                        lin.variant_for(m),
                        i % n
                    );
                }
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn record_for(
    gpu: &Gpu,
    fp: &Fingerprint,
    dev: &Device,
    n: usize,
    k: usize,
    m1: usize,
    m2: usize,
    tiles: [[u32; 3]; 3],
) -> TuningRecord {
    let winners = Variant::ALL
        .iter()
        .zip(tiles)
        .map(|(&variant, tile)| Winner {
            variant,
            target: gpu.record_target.into(),
            tile,
            kernel: String::new(),
            from_m: None,
        })
        .collect();
    TuningRecord {
        entries: vec![DeviceEntry {
            prefill: None,
            decode: None,
            weight_prefetch: None,
            fingerprint: fp.clone(),
            generator: dev.generator().clone(),
            backend: gpu.record_backend.into(),
            format: "w4a16".into(),
            model: "test".into(),
            threads: 1,
            partial: false,
            created_unix: 0,
            limits: Limits {
                read_gbps: 1.0,
                mac_gops: 1.0,
            },
            core_weights: vec![1.0],
            shapes: vec![ShapeEntry {
                name: "t".into(),
                n,
                k,
                m1,
                m2,
                winners,
                measurements: Vec::new(),
                notes: Default::default(),
            }],
        }],
        ..TuningRecord::default()
    }
}

pub fn linear_dispatches_by_a_records_breakpoints(gpu: &Gpu) {
    let (n, k) = (45, 96);
    let (fp, generator_dev, tiles) = {
        let Some((dev, _g)) = (gpu.open)("linear_dispatches_by_a_records_breakpoints", None) else {
            return;
        };
        // The defaults' tiles are feasible winners to name in the record.
        let lin = Linear::new(
            &dev,
            WeightFormat::W4A16,
            Weights::F32(&vec![0.1; n * k]),
            n,
            k,
            None,
        )
        .unwrap();
        let t = lin.plan().variants.clone().map(|v| v.tile);
        (dev.fingerprint().clone(), dev, t)
    };
    let record = record_for(gpu, &fp, &generator_dev, n, k, 3, 6, tiles);
    drop(generator_dev);
    let (dev, _g) = (gpu.open)("linear_dispatches_by_a_records_breakpoints", Some(record)).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(22);
    let c = linear_case(WeightFormat::W4A16, n, k, &mut rng);
    let lin = Linear::new(
        &dev,
        WeightFormat::W4A16,
        Weights::F32(&c.raw),
        n,
        k,
        Some(&c.bias),
    )
    .unwrap();
    assert_eq!(lin.plan().source, PlanSource::Record, "{}", lin.plan());
    assert!(lin.plan().variants.iter().all(|v| v.from_record));
    assert_eq!((lin.plan().m1, lin.plan().m2), (3, 6));
    for (m, v) in [
        (2, Variant::Gemv),
        (3, Variant::FlatGemm),
        (5, Variant::FlatGemm),
        (6, Variant::Gemm),
    ] {
        assert_eq!(lin.variant_for(m), v);
        check_forward(&lin, &c, m, &mut rng);
    }
    // Another device's record is refused and says why.
    let mut other = fp.clone();
    other.gpus[0].device = "some other GPU".into();
    let rec = record_for(gpu, &other, &dev, n, k, 3, 6, tiles);
    drop(lin);
    drop(dev);
    drop(_g);
    let (dev, _g) = (gpu.open)("linear_dispatches_by_a_records_breakpoints", Some(rec)).unwrap();
    let lin = Linear::new(&dev, WeightFormat::W4A16, Weights::F32(&c.raw), n, k, None).unwrap();
    match &lin.plan().source {
        PlanSource::Defaults { why } => assert!(why.contains("gpus differ"), "{why}"),
        s => panic!("expected defaults, got {s:?}"),
    }
}

pub fn linear_bad_shapes_and_formats_are_errors(gpu: &Gpu) {
    let Some((dev, _g)) = (gpu.open)("linear_bad_shapes_and_formats_are_errors", None) else {
        return;
    };
    let (n, k) = (16, 32);
    let w = vec![0.25f32; n * k];
    let e = Linear::new(&dev, WeightFormat::W4A16, Weights::F32(&w[1..]), n, k, None).unwrap_err();
    assert!(e.to_string().contains("weights elements"), "{e}");
    let e = Linear::new(
        &dev,
        WeightFormat::W4A16,
        Weights::F32(&w),
        n,
        k,
        Some(&[0.0; 3]),
    )
    .unwrap_err();
    assert!(e.to_string().contains("bias"), "{e}");
    let e = Linear::new(&dev, WeightFormat::W4A8, Weights::F32(&w), n, k, None).unwrap_err();
    assert!(e.to_string().contains("f16 activations"), "{e}");
    let e = Linear::new(&dev, WeightFormat::F32, Weights::F32(&w), n, k, None).unwrap_err();
    assert!(matches!(e, RuntimeError::Unsupported { .. }), "{e}");
    let q = quantize(
        tessera_dsl::Format::I8Sym(tessera_dsl::Group::Row, tessera_dsl::ParamType::F32),
        n,
        k,
        &w,
    )
    .unwrap();
    let e = Linear::new(&dev, WeightFormat::W4A16, Weights::Quant(&q), n, k, None).unwrap_err();
    assert!(e.to_string().contains("quantized weights"), "{e}");
    let e = Linear::new(&dev, WeightFormat::W4A16, Weights::F32(&[]), 0, k, None).unwrap_err();
    assert!(e.to_string().contains("[0, 32]"), "{e}");

    let lin = Linear::new(&dev, WeightFormat::W4A16, Weights::F32(&w), n, k, None).unwrap();
    let x = vec![f16::ONE; 2 * k];
    let mut y = vec![0f32; 2 * n];
    let e = lin
        .forward(Input::F16(&x[1..]), 2, Output::F32(&mut y))
        .unwrap_err();
    assert!(e.to_string().contains("x elements"), "{e}");
    let e = lin
        .forward(Input::F16(&x), 2, Output::F32(&mut y[1..]))
        .unwrap_err();
    assert!(e.to_string().contains("y elements"), "{e}");
    let xf = vec![1f32; 2 * k];
    let e = lin
        .forward(Input::F32(&xf), 2, Output::F32(&mut y))
        .unwrap_err();
    assert!(e.to_string().contains("x dtype"), "{e}");
    let mut yh = vec![f16::ZERO; 2 * n];
    let e = lin
        .forward(Input::F16(&x), 2, Output::F16(&mut yh))
        .unwrap_err();
    assert!(e.to_string().contains("y dtype"), "{e}");
    lin.forward(Input::F16(&[]), 0, Output::F32(&mut []))
        .unwrap();
}

/// The interpreter's decode attention of one token over `s` cached tokens.
#[allow(clippy::too_many_arguments)]
pub fn attention_reference(
    format: KvFormat,
    q: &[f16],
    kd: &[f32],
    vd: &[f32],
    hq: usize,
    kvh: usize,
    d: usize,
    s: usize,
) -> Vec<f32> {
    let kernel = library::get(format.kernel_name()).unwrap();
    let cache = |f: tessera_dsl::Format, data: &[f32]| match f {
        tessera_dsl::Format::F16 => Value::F16(data.iter().map(|&v| f16::from_f32(v)).collect()),
        f => Value::Quant(quantize(f, s * kvh, d, data).unwrap()),
    };
    let b = Bindings::decode_attention(
        [hq, kvh, d, s],
        Value::F16(q.to_vec()),
        cache(format.key_format(), &kd[..s * kvh * d]),
        cache(format.value_format(), &vd[..s * kvh * d]),
    );
    run(&kernel, &b).unwrap().get("o").unwrap().to_vec()
}

pub fn assert_close(what: &str, got: &[f16], want: &[f32]) {
    assert_eq!(got.len(), want.len());
    for (i, (g, &w)) in got.iter().zip(want).enumerate() {
        let g = g.to_f32();
        let tol = 4e-3 * w.abs() + 2e-3;
        assert!((g - w).abs() <= tol, "{what} at {i}: got {g} want {w}");
    }
}

pub fn attention_decodes_and_prefills_across_kv_chunks_on_the_device(gpu: &Gpu) {
    let Some((dev, _g)) = (gpu.open)(
        "attention_decodes_and_prefills_across_kv_chunks_on_the_device",
        None,
    ) else {
        return;
    };
    let mut rng = ChaCha8Rng::seed_from_u64(23);
    for (format, hq, kvh, d) in [(KvFormat::F16, 4, 2, 24), (KvFormat::Kv8, 6, 3, 16)] {
        let att = Attention::new(&dev, hq, kvh, d, format).unwrap();
        let mut cache = KvCache::for_device(&dev, format, kvh, d, KvCapacity::Chunked(16)).unwrap();
        assert!(cache.on_device());
        let total = 70; // past several chunks and past one 64-key split
        // A second prompt chunk after the decode steps: a prefill over a
        // cache that already holds tokens (OpenCL: the fused program).
        let chunk = 9;
        let kd: Vec<f32> = (0..(total + chunk) * kvh * d)
            .map(|_| rng.gen_range(-1.5..1.5))
            .collect();
        let vd: Vec<f32> = (0..(total + chunk) * kvh * d)
            .map(|_| rng.gen_range(-2.0..2.0))
            .collect();
        assert_eq!(
            att.prefills_whole(),
            gpu.record_backend == "opencl" || d % 16 == 0,
            "{}: OpenCL prefills with its fused program, CUDA on tensor cores where d is a \
             multiple of 16 (else per token)",
            gpu.name
        );
        let row = kvh * d;
        // Prefill a prompt of 5 tokens, then decode one token at a time.
        let prompt = 5;
        cache
            .append(&kd[..prompt * row], &vd[..prompt * row], prompt)
            .unwrap();
        let qp: Vec<f16> = (0..prompt * hq * d)
            .map(|_| f16::from_f32(rng.gen_range(-1.0..1.0)))
            .collect();
        let mut op = vec![f16::ZERO; prompt * hq * d];
        att.prefill(&qp, prompt, &cache, &mut op).unwrap();
        for i in 0..prompt {
            let want = attention_reference(
                format,
                &qp[i * hq * d..(i + 1) * hq * d],
                &kd,
                &vd,
                hq,
                kvh,
                d,
                i + 1,
            );
            assert_close(
                &format!("{format:?} prefill token {i}"),
                &op[i * hq * d..(i + 1) * hq * d],
                &want,
            );
        }
        let mut addr = cache.addresses();
        let mut cap = cache.capacity();
        for s in prompt + 1..=total {
            cache
                .append(&kd[(s - 1) * row..s * row], &vd[(s - 1) * row..s * row], 1)
                .unwrap();
            if cache.capacity() == cap {
                assert_eq!(
                    cache.addresses(),
                    addr,
                    "appends within a chunk stay in place"
                );
            } else {
                assert_eq!(cache.capacity() % 16, 0, "growth by whole chunks");
                cap = cache.capacity();
                addr = cache.addresses();
            }
            let q: Vec<f16> = (0..hq * d)
                .map(|_| f16::from_f32(rng.gen_range(-1.0..1.0)))
                .collect();
            let mut o = vec![f16::ZERO; hq * d];
            att.decode(&q, &cache, &mut o).unwrap();
            if s % 7 == 0 || s == 16 || s == 17 || s == 64 || s == 65 || s == total {
                let want = attention_reference(format, &q, &kd, &vd, hq, kvh, d, s);
                assert_close(&format!("{format:?} decode s={s}"), &o, &want);
            }
        }
        assert!(cache.growths() >= 2, "the cache grew past its first chunk");
        assert_eq!(cache.len(), total);
        let qc: Vec<f16> = (0..chunk * hq * d)
            .map(|_| f16::from_f32(rng.gen_range(-1.0..1.0)))
            .collect();
        let mut oc = vec![f16::ZERO; chunk * hq * d];
        cache
            .append(&kd[total * row..], &vd[total * row..], chunk)
            .unwrap();
        att.prefill(&qc, chunk, &cache, &mut oc).unwrap();
        for i in 0..chunk {
            let want = attention_reference(
                format,
                &qc[i * hq * d..(i + 1) * hq * d],
                &kd,
                &vd,
                hq,
                kvh,
                d,
                total + i + 1,
            );
            assert_close(
                &format!("{format:?} second prompt chunk, token {i}"),
                &oc[i * hq * d..(i + 1) * hq * d],
                &want,
            );
        }
    }
}

pub fn attention_refuses_misplaced_caches_and_bad_shapes(gpu: &Gpu) {
    let Some((dev, _g)) = (gpu.open)("attention_refuses_misplaced_caches_and_bad_shapes", None)
    else {
        return;
    };
    let e = Attention::new(&dev, 6, 4, 16, KvFormat::F16).unwrap_err();
    assert!(e.to_string().contains("multiple"), "{e}");
    let att = Attention::new(&dev, 4, 2, 16, KvFormat::F16).unwrap();
    let mut host = KvCache::new(KvFormat::F16, 2, 16, KvCapacity::Max(4)).unwrap();
    host.append(&[0.5; 32], &[0.5; 32], 1).unwrap();
    let q = vec![f16::ONE; 64];
    let mut o = vec![f16::ZERO; 64];
    let e = att.decode(&q, &host, &mut o).unwrap_err();
    assert!(e.to_string().contains("KV cache location"), "{e}");
    let mut cache = KvCache::for_device(&dev, KvFormat::F16, 2, 16, KvCapacity::Max(2)).unwrap();
    let e = att.decode(&q, &cache, &mut o).unwrap_err();
    assert!(e.to_string().contains("at least 1"), "{e}");
    cache.append(&[0.5; 64], &[0.5; 64], 2).unwrap();
    let e = cache.append(&[0.5; 32], &[0.5; 32], 1).unwrap_err();
    assert!(matches!(e, RuntimeError::CacheFull { .. }), "{e}");
    let e = att.decode(&q[1..], &cache, &mut o).unwrap_err();
    assert!(e.to_string().contains("q elements"), "{e}");
    let e = att
        .prefill(&[f16::ONE; 192], 3, &cache, &mut [f16::ZERO; 192])
        .unwrap_err();
    assert!(e.to_string().contains("prefill tokens"), "{e}");
    let kv8 = KvCache::for_device(&dev, KvFormat::Kv8, 2, 16, KvCapacity::Max(2)).unwrap();
    let e = att.decode(&q, &kv8, &mut o).unwrap_err();
    assert!(e.to_string().contains("KV cache format"), "{e}");
    att.decode(&q, &cache, &mut o).unwrap();
}
