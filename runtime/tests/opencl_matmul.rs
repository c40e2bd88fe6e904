//! Differential tests of the OpenCL matmuls (GEMV buffer and image, flat
//! GEMM, GEMM) against the reference interpreter on whatever OpenCL device
//! exists (PoCL here), random shapes with tails in e, h and l.

mod opencl_common;

use half::f16;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tessera_codegen::artifact::Variant;
use tessera_codegen::gpu::{self, WeightMemory};
use tessera_codegen::opencl::{Fp16Mode, OpenClBackend};
use tessera_dsl::interp::{Bindings, Value, run};
use tessera_dsl::quant::quantize;
use tessera_dsl::{Format, Kernel, library};
use tessera_runtime::opencl::{BuildSource, ClDevice, ClError, run_matmul};

fn kernels() -> Vec<Kernel> {
    let mut v: Vec<Kernel> = library::gpu_matmul_names()
        .iter()
        .map(|n| library::get(n).unwrap())
        .collect();
    v.push(gpu::with_gpu_weight_layout(&library::get("matmul-f16").unwrap()).unwrap());
    v
}

struct Case {
    x: Vec<f16>,
    w: Value,
    bias: Vec<f32>,
    /// Σ_l |x|·|w| per output, for the tolerance.
    magnitude: Vec<f64>,
}

fn case(kernel: &Kernel, rng: &mut ChaCha8Rng, e: usize, h: usize, l: usize) -> Case {
    let x: Vec<f16> = (0..e * l)
        .map(|_| f16::from_f32(rng.gen_range(-1.0..1.0)))
        .collect();
    let raw: Vec<f32> = (0..h * l).map(|_| rng.gen_range(-0.5..0.7)).collect();
    let format = kernel.tensor("w").unwrap().format;
    let (w, dense) = if format == Format::F16 {
        let w: Vec<f16> = raw.iter().map(|&v| f16::from_f32(v)).collect();
        let dense = w.iter().map(|v| v.to_f32()).collect::<Vec<_>>();
        (Value::F16(w), dense)
    } else {
        let q = quantize(format, h, l, &raw).unwrap();
        let dense = q.dequantize();
        (Value::Quant(q), dense)
    };
    let bias: Vec<f32> = (0..h).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let mut magnitude = vec![0.0f64; e * h];
    for ei in 0..e {
        for hi in 0..h {
            magnitude[ei * h + hi] = (0..l)
                .map(|li| {
                    f64::from(x[ei * l + li].to_f32()).abs() * f64::from(dense[hi * l + li]).abs()
                })
                .sum::<f64>()
                + f64::from(bias[hi].abs());
        }
    }
    Case {
        x,
        w,
        bias,
        magnitude,
    }
}

fn reference(kernel: &Kernel, c: &Case, e: usize, h: usize, l: usize) -> Vec<f32> {
    let b = Bindings::new()
        .extent("e", e)
        .extent("h", h)
        .extent("l", l)
        .tensor("x", Value::F16(c.x.clone()))
        .tensor("w", c.w.clone())
        .tensor("bias", Value::F32(c.bias.clone()));
    run(kernel, &b).unwrap().get("y").unwrap().to_vec()
}

/// Runs one instance and compares: `rel` bounds the error relative to
/// Σ|x·w| (f32 accumulation ~1e-6; weights staged as halves ~2^-11).
fn check(
    dev: &ClDevice,
    kernel: &Kernel,
    variant: Variant,
    memory: WeightMemory,
    shapes: &[(usize, usize, usize)],
    rng: &mut ChaCha8Rng,
) {
    let rows = match variant {
        Variant::Gemv => 1,
        Variant::FlatGemm => 8,
        Variant::Gemm => 4096,
    };
    let rel = match variant {
        Variant::Gemv => 2e-5,
        _ => 2.0f64.powi(-10),
    };
    let tile = opencl_common::tile(kernel, rows);
    let program = OpenClBackend::new(dev.fp16_mode())
        .with_weights(memory)
        .program(kernel, &tile, variant)
        .unwrap();
    for &(e, h, l) in shapes {
        let c = case(kernel, rng, e, h, l);
        let want = reference(kernel, &c, e, h, l);
        let got =
            run_matmul(dev, &program, &c.x, &c.w, Some(&c.bias), e, h, l).unwrap_or_else(|err| {
                panic!(
                    "{} {variant} {memory:?} e={e} h={h} l={l}: {err}",
                    kernel.name
                )
            });
        assert_eq!(got.len(), want.len());
        for i in 0..want.len() {
            let tol = rel * c.magnitude[i] + 1e-5;
            let err = (f64::from(got[i]) - f64::from(want[i])).abs();
            assert!(
                err <= tol,
                "{} {variant} {memory:?} e={e} h={h} l={l} at {i}: got {} want {} (err {err:e} > tol {tol:e})",
                kernel.name,
                got[i],
                want[i]
            );
        }
    }
}

fn shapes(rng: &mut ChaCha8Rng, e_max: usize, n: usize) -> Vec<(usize, usize, usize)> {
    // Always one shape with every tail, then random ones.
    let mut v = vec![(e_max.min(3), 37, 70)];
    for _ in 0..n {
        v.push((
            rng.gen_range(1..=e_max),
            rng.gen_range(1..=150),
            rng.gen_range(1..=260),
        ));
    }
    v
}

#[test]
fn gemv_matches_the_interpreter() {
    let Some(dev) = opencl_common::device("gemv_matches_the_interpreter") else {
        return;
    };
    assert_eq!(dev.fp16_mode(), Fp16Mode::for_extensions(&dev.extensions));
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    for k in kernels() {
        let s = shapes(&mut rng, 3, 4);
        check(&dev, &k, Variant::Gemv, WeightMemory::Buffer, &s, &mut rng);
        if k.tensor("w").unwrap().format != Format::F16 && dev.supports_images() {
            check(&dev, &k, Variant::Gemv, WeightMemory::Image, &s, &mut rng);
        }
    }
}

#[test]
fn flat_gemm_matches_the_interpreter() {
    let Some(dev) = opencl_common::device("flat_gemm_matches_the_interpreter") else {
        return;
    };
    let mut rng = ChaCha8Rng::seed_from_u64(8);
    for k in kernels() {
        let s = shapes(&mut rng, 11, 3);
        check(
            &dev,
            &k,
            Variant::FlatGemm,
            WeightMemory::Buffer,
            &s,
            &mut rng,
        );
    }
}

#[test]
fn gemm_matches_the_interpreter() {
    let Some(dev) = opencl_common::device("gemm_matches_the_interpreter") else {
        return;
    };
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    for k in kernels() {
        let mut s = shapes(&mut rng, 40, 2);
        s.push((97, 65, 33));
        check(&dev, &k, Variant::Gemm, WeightMemory::Buffer, &s, &mut rng);
    }
}

#[test]
fn binary_cache_hits_and_build_errors_carry_the_log() {
    let Some(dev) = opencl_common::device("binary_cache_hits_and_build_errors_carry_the_log")
    else {
        return;
    };
    let dir =
        std::env::temp_dir().join(format!("tessera-opencl-cache-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let dev = dev.dev.with_cache_dir(&dir);
    let src = "__kernel void twice(__global float* a) { a[get_global_id(0)] *= 2.0f; }\n";
    assert_eq!(dev.build(src).unwrap().source, BuildSource::Compiled);
    assert_eq!(dev.build(src).unwrap().source, BuildSource::Cache);
    // Another source, another key.
    assert_ne!(
        dev.cache_key(src, ""),
        dev.cache_key(&format!("{src} "), "")
    );
    // A corrupt cache file is rebuilt, not trusted.
    for f in std::fs::read_dir(&dir).unwrap() {
        std::fs::write(f.unwrap().path(), b"garbage").unwrap();
    }
    assert_eq!(dev.build(src).unwrap().source, BuildSource::Compiled);
    match dev.build("__kernel void broken(__global float* a) { a[0] = undefined_name; }") {
        Err(ClError::Build { log, .. }) => assert!(log.contains("undefined_name"), "{log}"),
        Err(other) => panic!("expected a build error, got {other}"),
        Ok(_) => panic!("a broken program built"),
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_inputs_are_errors_not_panics() {
    let Some(dev) = opencl_common::device("bad_inputs_are_errors_not_panics") else {
        return;
    };
    let k = library::get("matmul-w4a16").unwrap();
    let tile = opencl_common::tile(&k, 1);
    let program = OpenClBackend::new(dev.fp16_mode())
        .program(&k, &tile, Variant::Gemv)
        .unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let c = case(&k, &mut rng, 1, 8, 32);
    // x too short.
    assert!(matches!(
        run_matmul(&dev, &program, &c.x[..31], &c.w, Some(&c.bias), 1, 8, 32),
        Err(ClError::Input(_))
    ));
    // Missing bias.
    assert!(run_matmul(&dev, &program, &c.x, &c.w, None, 1, 8, 32).is_err());
    // Weights of the wrong format.
    let f16w = Value::F16(vec![f16::ZERO; 8 * 32]);
    assert!(run_matmul(&dev, &program, &c.x, &f16w, Some(&c.bias), 1, 8, 32).is_err());
}
