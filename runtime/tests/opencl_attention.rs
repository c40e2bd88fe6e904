//! Differential tests of the OpenCL split-K decode attention against the
//! reference interpreter: f16 and int8-key/fp8-value (e4m3, e5m2) caches, GQA, tails in
//! the sequence, and adversarial scores that force the recompute path.

mod opencl_common;

use half::f16;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tessera_codegen::opencl::OpenClBackend;
use tessera_dsl::interp::{Bindings, Value, run};
use tessera_dsl::ir::ParamType;
use tessera_dsl::quant::quantize;
use tessera_dsl::{Format, Group, Kernel, library};
use tessera_runtime::opencl::{ClDevice, run_attention};

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
