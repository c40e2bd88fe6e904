//! The differential check every host-kernel test shares: random inputs
//! (tails included), the reference interpreter's answer, and a tolerance
//! scaled by the output format.

use crate::guarded::Guarded;
use half::f16;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tessera_codegen::host::{HostInput, HostMatmul, HostOutput, WeightsIn};
use tessera_dsl::interp::{self, Bindings, Value};
use tessera_dsl::ir::{Format, Kernel};
use tessera_dsl::quant;

/// The x, w and y formats of a matmul kernel.
pub fn formats(kernel: &Kernel) -> (Format, Format, Format) {
    let mm = kernel.as_matmul().expect("a matmul kernel");
    let f = |n: &str| kernel.tensor(n).expect("the matmul's tensor").format;
    (f(&mm.x), f(&mm.w), f(&mm.y))
}

/// Run `hm` (built for `kernel`) on random inputs of each (m, n, k) with 1
/// and 2 threads and compare every output with the reference
/// interpreter's, within a tolerance scaled by the output format and by
/// Σ|x·w| (`what` names the case in a failure).
pub fn check_host_matmul(
    hm: &HostMatmul,
    kernel: &Kernel,
    what: &str,
    shapes: &[(usize, usize, usize)],
    seed: u64,
) {
    let uniform = |rng: &mut ChaCha8Rng, m: usize, n: usize, k: usize| {
        let x: Vec<f32> = (0..m * k).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let w: Vec<f32> = (0..n * k).map(|_| rng.gen_range(-1.0..1.0)).collect();
        (x, w)
    };
    check_host_matmul_on(hm, kernel, what, shapes, seed, uniform);
}

/// [`check_host_matmul`] on the x [m, k] and w [n, k] that `inputs`
/// makes for each shape (the bias stays random).
pub fn check_host_matmul_on(
    hm: &HostMatmul,
    kernel: &Kernel,
    what: &str,
    shapes: &[(usize, usize, usize)],
    seed: u64,
    inputs: impl Fn(&mut ChaCha8Rng, usize, usize, usize) -> (Vec<f32>, Vec<f32>),
) {
    let (xf, wf, yf) = formats(kernel);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    for &(m, n, k) in shapes {
        let (x, w) = inputs(&mut rng, m, n, k);
        let bias: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let has_bias = kernel.as_matmul().unwrap().epilogue.bias.is_some();
        let (w_in, w_val, w_dense) = if wf.is_quantized() {
            let q = quant::quantize(wf, n, k, &w).unwrap();
            let dense = q.dequantize();
            (Some(q.clone()), Value::Quant(q), dense)
        } else {
            let v = Value::from_f32(wf, &w).unwrap();
            let dense = match &v {
                Value::F16(h) => h.iter().map(|v| v.to_f32()).collect(),
                _ => w.clone(),
            };
            (None, v, dense)
        };
        let x_val = Value::from_f32(xf, &x).unwrap();
        let x_dense: Vec<f32> = match &x_val {
            Value::F16(h) => h.iter().map(|v| v.to_f32()).collect(),
            _ => x.clone(),
        };
        let mut bind = Bindings::new()
            .extent("e", m)
            .extent("h", n)
            .extent("l", k)
            .tensor("x", x_val)
            .tensor("w", w_val);
        if has_bias {
            bind = bind.tensor("bias", Value::F32(bias.clone()));
        }
        let out = interp::run(kernel, &bind).unwrap();
        let want = out.get("y").unwrap();

        let weights = match &w_in {
            Some(q) => hm.pack_weights(n, k, WeightsIn::Quant(q)).unwrap(),
            None => hm.pack_weights(n, k, WeightsIn::F32(&w)).unwrap(),
        };
        // x ends at an inaccessible page: a read past it faults.
        let xh: Vec<f16> = x.iter().map(|v| f16::from_f32(*v)).collect();
        let xg = if xf == Format::F16 {
            Guarded::from_halves(&xh)
        } else {
            Guarded::from_floats(&x)
        };
        let input = if xf == Format::F16 {
            HostInput::F16(xg.halves())
        } else {
            HostInput::F32(xg.floats())
        };
        for threads in [1, 2] {
            let got: Vec<f32> = if yf == Format::F16 {
                let mut y = vec![f16::from_f32(f32::NAN); m * n];
                hm.run(
                    input,
                    m,
                    &weights,
                    has_bias.then_some(&bias[..]),
                    HostOutput::F16(&mut y),
                    threads,
                )
                .unwrap();
                y.iter().map(|v| v.to_f32()).collect()
            } else {
                let mut y = vec![f32::NAN; m * n];
                hm.run(
                    input,
                    m,
                    &weights,
                    has_bias.then_some(&bias[..]),
                    HostOutput::F32(&mut y),
                    threads,
                )
                .unwrap();
                y
            };
            for e in 0..m {
                for h in 0..n {
                    let mag: f64 = (0..k)
                        .map(|l| (x_dense[e * k + l] as f64 * w_dense[h * k + l] as f64).abs())
                        .sum::<f64>()
                        + if has_bias { bias[h].abs() as f64 } else { 0.0 };
                    let (g, wv) = (got[e * n + h] as f64, want[e * n + h] as f64);
                    let tol = match yf {
                        Format::F16 => 1e-3 * wv.abs() + 2e-5 * mag + 1e-6,
                        _ => 1e-5 * mag + 1e-6,
                    };
                    assert!(
                        (g - wv).abs() <= tol,
                        "{} {what} m={m} n={n} k={k} threads={threads} y[{e},{h}] = {g}, want {wv} (tol {tol})",
                        kernel.name
                    );
                }
            }
        }
    }
}
