//! Differential tests of the PTX matmuls (GEMV, flat GEMM, GEMM) against
//! the reference interpreter on a CUDA device, random shapes with tails in
//! e, h and l. Without a CUDA driver (as on the machines Tessera is
//! developed on) each test prints a visible SKIP line, and the no-driver
//! path is itself checked to be a clear error.

#![cfg(feature = "cuda")]

use half::f16;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tessera_codegen::artifact::Variant;
use tessera_codegen::gpu;
use tessera_codegen::ptx::Sm;
use tessera_codegen::{Problem, TileConfig, solve};
use tessera_dsl::interp::{Bindings, Value, run};
use tessera_dsl::quant::quantize;
use tessera_dsl::{Format, Kernel, library};
use tessera_runtime::cuda::{CudaDevice, CudaError, driver_present, run_matmul};

/// The device, or a SKIP line naming why there is none.
fn device(test: &str) -> Option<CudaDevice> {
    if !driver_present() {
        eprintln!("SKIP {test}: no CUDA driver (libcuda not found)");
        return None;
    }
    match CudaDevice::first() {
        Ok(d) => Some(d),
        Err(e) => {
            eprintln!("SKIP {test}: no CUDA device ({e})");
            None
        }
    }
}

#[test]
fn no_driver_is_a_clear_error() {
    if driver_present() {
        eprintln!("SKIP no_driver_is_a_clear_error: a CUDA driver is installed");
        return;
    }
    eprintln!("SKIP: no CUDA driver (libcuda not found); checking the error path only");
    match CudaDevice::first() {
        Err(CudaError::NoDriver(msg)) => assert!(msg.contains("driver"), "{msg}"),
        other => panic!("expected NoDriver, got {other:?}"),
    }
}

fn kernels() -> Vec<Kernel> {
    let mut v: Vec<Kernel> = ["matmul-w4a16", "matmul-w8a16", "matmul-e0m4a16"]
        .iter()
        .map(|n| library::get(n).unwrap())
        .collect();
    v.push(gpu::with_gpu_weight_layout(&library::get("matmul-f16").unwrap()).unwrap());
    v
}

fn tile(sm: Sm, kernel: &Kernel, e: u64) -> TileConfig {
    let caps = sm.caps();
    let mut p = Problem::from_kernel(caps, kernel).unwrap();
    p.e = e;
    solve(caps, &p).unwrap().remove(0)
}

struct Case {
    x: Vec<f16>,
    w: Value,
    bias: Vec<f32>,
    magnitude: Vec<f64>,
}

fn case(kernel: &Kernel, rng: &mut ChaCha8Rng, e: usize, h: usize, l: usize) -> Case {
    let x: Vec<f16> = (0..e * l)
        .map(|_| f16::from_f32(rng.gen_range(-1.0..1.0)))
        .collect();
    let raw: Vec<f32> = (0..h * l).map(|_| rng.gen_range(-0.5..0.7)).collect();
    let format = kernel.tensor("w").unwrap().format;
    // `dense` is what the rounding of each weight scales with: |w| for f16
    // weights; for quantized ones the tensor-core kernels form
    // `scale·v + offset` in f16, so each of |scale·v| and |offset| is
    // rounded, which near cancellation (E0M4's v in [2, 4) against its
    // offset) is many times |w|.
    let (w, dense) = if format == Format::F16 {
        let w: Vec<f16> = raw.iter().map(|&v| f16::from_f32(v)).collect();
        let dense = w.iter().map(|v| v.to_f32()).collect::<Vec<_>>();
        (Value::F16(w), dense)
    } else {
        let q = quantize(format, h, l, &raw).unwrap();
        let mut dense = Vec::with_capacity(h * l);
        for r in 0..h {
            for c in 0..l {
                let offset = if q.offsets.is_empty() {
                    0.0
                } else {
                    q.offset(r, c)
                };
                dense.push(q.value(r, c).abs() + (q.value(r, c) - offset).abs() + offset.abs());
            }
        }
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

fn check(dev: &CudaDevice, variant: Variant, e_max: usize, seed: u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    // GEMV accumulates in f32; the tensor-core kernels multiply halves
    // (weights dequantized to f16, ~2^-11 each).
    let rel = match variant {
        Variant::Gemv => 2e-5,
        _ => 2.0f64.powi(-10),
    };
    let rows = match variant {
        Variant::Gemv => 1,
        Variant::FlatGemm => 8,
        Variant::Gemm => 4096,
    };
    for k in kernels() {
        let program = dev
            .backend()
            .program(&k, &tile(dev.sm(), &k, rows), variant)
            .unwrap();
        let mut shapes = vec![(e_max.min(3), 37, 70), (e_max.min(2), 130, 264)];
        for _ in 0..3 {
            shapes.push((
                rng.gen_range(1..=e_max),
                rng.gen_range(1..=300),
                rng.gen_range(1..=520),
            ));
        }
        for (e, h, l) in shapes {
            let c = case(&k, &mut rng, e, h, l);
            let want = reference(&k, &c, e, h, l);
            let got = run_matmul(dev, &program, &c.x, &c.w, Some(&c.bias), e, h, l)
                .unwrap_or_else(|err| panic!("{} {variant} e={e} h={h} l={l}: {err}", k.name));
            assert_eq!(got.len(), want.len());
            for i in 0..want.len() {
                let tol = rel * c.magnitude[i] + 1e-5;
                let err = (f64::from(got[i]) - f64::from(want[i])).abs();
                assert!(
                    err <= tol,
                    "{} {variant} e={e} h={h} l={l} at {i}: got {} want {} (err {err:e} > {tol:e})",
                    k.name,
                    got[i],
                    want[i]
                );
            }
        }
    }
}

#[test]
fn gemv_matches_the_interpreter() {
    if let Some(dev) = device("gemv_matches_the_interpreter") {
        check(&dev, Variant::Gemv, 3, 17);
    }
}

#[test]
fn flat_gemm_matches_the_interpreter() {
    if let Some(dev) = device("flat_gemm_matches_the_interpreter") {
        check(&dev, Variant::FlatGemm, 11, 18);
    }
}

#[test]
fn gemm_matches_the_interpreter() {
    if let Some(dev) = device("gemm_matches_the_interpreter") {
        check(&dev, Variant::Gemm, 140, 19);
    }
}
