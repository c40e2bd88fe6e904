//! Differential tests of the x86-avx2 backend against the reference
//! interpreter: every library kernel the backend runs, random inputs, tails
//! in m, n and k, every feasible tile, 1 and 2 threads.

#![cfg(target_arch = "x86_64")]

use half::f16;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tessera_codegen::artifact::EmitError;
use tessera_codegen::host::{HostInput, HostOutput, WeightsIn};
use tessera_codegen::tile::{Problem, TileConfig, feasible, solve};
use tessera_codegen::x86::{X86Backend, plan};
use tessera_dsl::interp::{self, Bindings, Value};
use tessera_dsl::ir::{Activation, Format, Kernel};
use tessera_dsl::{library, quant};

/// Plain AVX2, and AVX-VNNI too when this CPU has it.
fn backends() -> Vec<X86Backend> {
    match X86Backend::detect() {
        Ok(b) if b.vnni => vec![X86Backend { vnni: false }, b],
        Ok(b) => vec![b],
        Err(e) => {
            eprintln!("SKIP: {e}");
            vec![]
        }
    }
}

fn formats(kernel: &Kernel) -> (Format, Format, Format) {
    let mm = kernel.as_matmul().unwrap();
    let f = |n: &str| kernel.tensor(n).unwrap().format;
    (f(&mm.x), f(&mm.w), f(&mm.y))
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
    let hm = backend
        .load(kernel, tile)
        .unwrap_or_else(|e| panic!("{} {}: {e}", kernel.name, tile.summary()));
    let (xf, wf, yf) = formats(kernel);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    for &(m, n, k) in shapes {
        let x: Vec<f32> = (0..m * k).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let w: Vec<f32> = (0..n * k).map(|_| rng.gen_range(-1.0..1.0)).collect();
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
        let xh: Vec<f16> = x.iter().map(|v| f16::from_f32(*v)).collect();
        let input = if xf == Format::F16 {
            HostInput::F16(&xh)
        } else {
            HostInput::F32(&x)
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
                        "{} tile {}x{} m={m} n={n} k={k} threads={threads} y[{e},{h}] = {g}, want {wv} (tol {tol})",
                        kernel.name,
                        tile.ep,
                        tile.hp
                    );
                }
            }
        }
    }
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

/// Every feasible tile runs, except W4A8 tiles whose int16 group sums do
/// not fit beside the solver's registers: those are refused as BadTile.
fn every_tile(name: &str) {
    let kernel = library::get(name).unwrap();
    for b in backends() {
        for t in tiles(&kernel) {
            match b.emit_code(&kernel, &t) {
                Ok(_) => check(
                    &b,
                    &kernel,
                    &t,
                    &some_shapes(),
                    t.ep as u64 * 100 + t.hp as u64,
                ),
                Err(EmitError::BadTile { why, .. }) if name == "matmul-w4a8" => {
                    assert!(why.contains("int16 group sums"), "{why}");
                    assert!(
                        2 * t.accounting.accumulators + t.hp / 8 + 4 > 16,
                        "{}",
                        t.summary()
                    );
                }
                Err(e) => panic!("{name} {}: {e}", t.summary()),
            }
        }
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
