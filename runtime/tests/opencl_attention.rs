//! Differential tests of the OpenCL split-K decode attention against the
//! reference interpreter: f16 and int8-key/fp8-value (e4m3, e5m2) caches, GQA, tails in
//! the sequence, and adversarial scores that force the recompute path; and
//! of the fused causal prefill program (one flash kernel per head dim).

mod opencl_common;

use half::f16;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tessera_codegen::opencl::Fp16Mode;
use tessera_codegen::opencl::OpenClBackend;
use tessera_dsl::interp::{Bindings, Value, run};
use tessera_dsl::ir::ParamType;
use tessera_dsl::ir::{Op, SoftmaxMode};
use tessera_dsl::quant::quantize;
use tessera_dsl::{Format, Group, Kernel, library};
use tessera_runtime::opencl::{ClDevice, run_attention, run_prefill};

struct Shape {
    hq: usize,
    kvh: usize,
    d: usize,
    s: usize,
}

fn cache(format: Format, rows: usize, d: usize, data: &[f32]) -> Value {
    match format {
        Format::F16 => Value::F16(data.iter().map(|&v| f16::from_f32(v)).collect()),
        f => Value::Quant(quantize(f, rows, d, data).unwrap()),
    }
}

/// Runs one shape with q and k drawn from ±`q_amp`, ±`k_amp`; returns the
/// (interpreter, kernel) recompute counts.
fn check(
    dev: &ClDevice,
    kernel: &Kernel,
    sh: &Shape,
    q_amp: f32,
    k_amp: f32,
    rng: &mut ChaCha8Rng,
) -> (usize, usize) {
    let Shape { hq, kvh, d, s } = *sh;
    let kf = kernel.tensor("k").unwrap().format;
    let vf = kernel.tensor("v").unwrap().format;
    let q: Vec<f16> = (0..hq * d)
        .map(|_| f16::from_f32(rng.gen_range(-q_amp..q_amp)))
        .collect();
    let kd: Vec<f32> = (0..s * kvh * d)
        .map(|_| rng.gen_range(-k_amp..k_amp))
        .collect();
    let vd: Vec<f32> = (0..s * kvh * d).map(|_| rng.gen_range(-2.0..2.0)).collect();
    let k = cache(kf, s * kvh, d, &kd);
    let v = cache(vf, s * kvh, d, &vd);
    let b =
        Bindings::decode_attention([hq, kvh, d, s], Value::F16(q.clone()), k.clone(), v.clone());
    let out = run(kernel, &b).unwrap();
    let want = out.get("o").unwrap().to_vec();
    let program = OpenClBackend::new(dev.fp16_mode())
        .attention_program(kernel)
        .unwrap();
    let got = run_attention(dev, &program, &q, &k, &v, hq, kvh, d, s)
        .unwrap_or_else(|e| panic!("{} hq={hq} kvh={kvh} d={d} s={s}: {e}", kernel.name));
    assert_eq!(got.splits, s.div_ceil(64));
    assert_eq!(got.o.len(), want.len());
    for (i, (&g, &w)) in got.o.iter().zip(&want).enumerate() {
        // Outputs are f16: a few ulps relative, plus fp32 softmax noise.
        let tol = 4e-3 * w.abs() + 2e-3;
        assert!(
            (g - w).abs() <= tol,
            "{} hq={hq} kvh={kvh} d={d} s={s} at {i}: got {g} want {w}",
            kernel.name
        );
    }
    (out.softmax.unwrap().recomputed, got.recomputed)
}

fn kernels() -> Vec<Kernel> {
    let mut v: Vec<Kernel> = ["attention-decode-f16", "attention-decode-kv8"]
        .iter()
        .map(|n| library::get(n).unwrap())
        .collect();
    assert_eq!(
        v[1].tensor("k").unwrap().format,
        Format::I8Asym(Group::Row, ParamType::F32)
    );
    assert_eq!(v[1].tensor("v").unwrap().format, Format::Fp8E4M3);
    // The shared plan's third value format: fp8 e5m2, decoded by bit
    // operations in the OpenCL C.
    let mut e5m2 = v[1].clone();
    e5m2.name = "attention-decode-kv8-e5m2".into();
    e5m2.tensors
        .iter_mut()
        .filter(|t| t.name == "v")
        .for_each(|t| t.format = Format::Fp8E5M2);
    tessera_dsl::verify(&e5m2).unwrap();
    v.push(e5m2);
    v
}

#[test]
fn decode_attention_matches_the_interpreter() {
    let Some(dev) = opencl_common::device("decode_attention_matches_the_interpreter") else {
        return;
    };
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let mut shapes = vec![
        Shape {
            hq: 4,
            kvh: 1,
            d: 64,
            s: 1,
        },
        Shape {
            hq: 8,
            kvh: 2,
            d: 20,
            s: 130,
        },
        Shape {
            hq: 2,
            kvh: 2,
            d: 128,
            s: 64,
        },
        Shape {
            hq: 6,
            kvh: 3,
            d: 80,
            s: 65,
        },
    ];
    for _ in 0..3 {
        let kvh = rng.gen_range(1..=3);
        shapes.push(Shape {
            hq: kvh * rng.gen_range(1..=4),
            kvh,
            d: rng.gen_range(1..=96),
            s: rng.gen_range(1..=300),
        });
    }
    for k in kernels() {
        for sh in &shapes {
            // Benign scores: |q·k| stays well inside [-16.8, 6.5].
            let amp = (1.0 / sh.d as f32).sqrt();
            let (interp, kernel) = check(&dev, &k, sh, amp, 1.0, &mut rng);
            assert_eq!(interp, 0, "benign scores never recompute in the oracle");
            assert_eq!(kernel, 0, "benign scores never recompute in the kernel");
        }
    }
}

#[test]
fn adversarial_scores_take_the_recompute_path() {
    let Some(dev) = opencl_common::device("adversarial_scores_take_the_recompute_path") else {
        return;
    };
    let mut rng = ChaCha8Rng::seed_from_u64(12);
    for k in kernels() {
        for sh in [
            Shape {
                hq: 4,
                kvh: 2,
                d: 32,
                s: 200,
            },
            Shape {
                hq: 2,
                kvh: 1,
                d: 64,
                s: 64,
            },
        ] {
            // Scores of tens to hundreds: e^(x - 0) would overflow fp32 past
            // 88, so the unified max must be abandoned.
            let (interp, kernel) = check(&dev, &k, &sh, 3.0, 3.0, &mut rng);
            assert!(interp > 0, "the oracle recomputed");
            assert!(kernel > 0, "the kernel took the recompute path");
        }
    }
}

/// One causal prefill (p tokens cached before t prompt tokens) against the
/// interpreter.
#[allow(clippy::too_many_arguments)]
fn check_prefill(
    dev: &ClDevice,
    kernel: &Kernel,
    (p, t, hq, kvh, d): (usize, usize, usize, usize, usize),
    q_amp: f32,
    rng: &mut ChaCha8Rng,
) {
    let s = p + t;
    let kf = kernel.tensor("k").unwrap().format;
    let vf = kernel.tensor("v").unwrap().format;
    let q: Vec<f16> = (0..t * hq * d)
        .map(|_| f16::from_f32(rng.gen_range(-q_amp..q_amp)))
        .collect();
    let kd: Vec<f32> = (0..s * kvh * d).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let vd: Vec<f32> = (0..s * kvh * d).map(|_| rng.gen_range(-2.0..2.0)).collect();
    let k = cache(kf, s * kvh, d, &kd);
    let v = cache(vf, s * kvh, d, &vd);
    let b = Bindings::new()
        .extent("t", t)
        .extent("hq", hq)
        .extent("kvh", kvh)
        .extent("d", d)
        .extent("s", s)
        .tensor("q", Value::F16(q.clone()))
        .tensor("k", k.clone())
        .tensor("v", v.clone());
    let want = run(kernel, &b).unwrap().get("o").unwrap().to_vec();
    let program = OpenClBackend::new(dev.fp16_mode())
        .prefill_program(kernel, d)
        .unwrap();
    let what = format!(
        "{} p={p} t={t} hq={hq} kvh={kvh} d={d} amp={q_amp}",
        kernel.name
    );
    let got = run_prefill(dev, &program, &q, &k, &v, t, s, hq, kvh)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
        let tol = 4e-3 * w.abs() + 2e-3;
        assert!(
            (g - w).abs() <= tol,
            "{what}: o[{i}] (token {}, head {}) = {g}, want {w}",
            i / (hq * d),
            i / d % hq
        );
    }
}

fn prefill_kernels() -> Vec<Kernel> {
    let f16 = library::get("attention-prefill-f16").unwrap();
    let kv8 = library::get("attention-prefill-kv8").unwrap();
    let mut e5m2 = kv8.clone();
    e5m2.name = "attention-prefill-kv8-e5m2".into();
    e5m2.tensors
        .iter_mut()
        .filter(|t| t.name == "v")
        .for_each(|t| t.format = Format::Fp8E5M2);
    let mut unscaled = f16.clone();
    unscaled.name = "attention-prefill-f16-unscaled".into();
    if let Op::Attention(a) = &mut unscaled.op {
        a.q_prescaled = false;
    }
    for k in [&e5m2, &unscaled] {
        tessera_dsl::verify(k).unwrap();
    }
    vec![f16, kv8, e5m2, unscaled]
}

/// The fused prefill program: every cache format, q scaled by the kernel
/// or not, GQA groups 1 to 6, head dims 20 to 256 (the key block shrinks
/// as d grows), prefixes 0, 1 and 17, prompts across the 64-row work group
/// and contexts across several key blocks, and scores far outside the
/// usual range (the running max jumps between blocks).
#[test]
fn prefill_matches_the_interpreter() {
    let Some(dev) = opencl_common::device("prefill_matches_the_interpreter") else {
        return;
    };
    let mut rng = ChaCha8Rng::seed_from_u64(23);
    // Every program build costs PoCL a second or two: the f16 kernel takes
    // every head dim, the other formats two.
    for (i, kernel) in prefill_kernels().into_iter().enumerate() {
        let mut shapes = vec![
            (0, 1, 4, 1, 64),
            (17, 9, 8, 2, 64),
            (1, 70, 2, 2, 128),
            (200, 5, 6, 6, 64),
        ];
        if i == 0 {
            shapes.extend([(17, 9, 8, 2, 20), (0, 33, 12, 2, 80), (17, 40, 4, 2, 256)]);
        }
        for shape in shapes {
            check_prefill(&dev, &kernel, shape, 0.5, &mut rng);
        }
        check_prefill(&dev, &kernel, (3, 50, 4, 1, 128), 8.0, &mut rng);
    }
}

#[test]
fn prefill_refuses_what_it_cannot_run() {
    let be = OpenClBackend::new(Fp16Mode::Storage);
    let prefill = library::get("attention-prefill-f16").unwrap();
    let e = be.prefill_program(&prefill, 300).unwrap_err().to_string();
    assert!(e.contains("head dim 300"), "{e}");
    let decode = library::get("attention-decode-f16").unwrap();
    let e = be.prefill_program(&decode, 64).unwrap_err().to_string();
    assert!(e.contains("decode attention"), "{e}");
    let mut slow = prefill.clone();
    if let Op::Attention(a) = &mut slow.op {
        a.softmax = SoftmaxMode::Async {
            phi: 0.0,
            lo: -16.8,
            hi: 6.5,
        };
    }
    let e = be.prefill_program(&slow, 64).unwrap_err().to_string();
    assert!(e.contains("softmax"), "{e}");
    let Some(dev) = opencl_common::device("prefill_refuses_what_it_cannot_run") else {
        return;
    };
    let program = OpenClBackend::new(dev.fp16_mode())
        .prefill_program(&prefill, 8)
        .unwrap();
    let (q, kv) = (
        vec![f16::ZERO; 2 * 2 * 8],
        Value::F16(vec![f16::ZERO; 3 * 8]),
    );
    let e = run_prefill(&dev, &program, &q, &kv, &kv, 2, 4, 2, 1).unwrap_err();
    assert!(e.to_string().contains("k"), "{e}");
    let e = run_prefill(&dev, &program, &q, &kv, &kv, 2, 1, 2, 1).unwrap_err();
    assert!(e.to_string().contains("prefill of 2 tokens over 1"), "{e}");
}
