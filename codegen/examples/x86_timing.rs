//! A timing smoke for the x86-avx2 kernels (not a test, not a benchmark
//! harness): `cargo run --release -p tessera-codegen --example x86_timing`.
//! Prints GFLOP/s and weight GB/s for a few Llama2-7B-sized shapes.

use std::time::Instant;

use tessera_codegen::host::{HostInput, HostOutput, WeightsIn};
use tessera_codegen::tile::{Problem, TileConfig, feasible, solve};
use tessera_codegen::x86::{X86Backend, plan};

fn tile(kernel: &tessera_dsl::Kernel, want: Option<(u32, u32)>) -> TileConfig {
    let caps = plan::target();
    let problem = Problem::from_kernel(caps, kernel).unwrap();
    match want {
        Some((ep, hp)) => *feasible(caps, &problem)
            .unwrap()
            .iter()
            .find(|t| t.ep == ep && t.hp == hp)
            .unwrap(),
        None => solve(caps, &problem).unwrap()[0],
    }
}

fn time(name: &str, want: Option<(u32, u32)>, m: usize, n: usize, k: usize, threads: usize) {
    let backend = X86Backend::detect().expect("AVX2/FMA/F16C");
    let kernel = tessera_dsl::library::get(name).unwrap();
    let t = tile(&kernel, want);
    let hm = backend.load(&kernel, &t).unwrap();
    let w: Vec<f32> = (0..n * k)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    let x: Vec<f32> = (0..m * k)
        .map(|i| ((i * 104729) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    let bias = vec![0.0f32; n];
    let weights = hm.pack_weights(n, k, WeightsIn::F32(&w)).unwrap();
    let xh: Vec<half::f16> = x.iter().map(|v| half::f16::from_f32(*v)).collect();
    let mut y = vec![0f32; m * n];
    let mut yh = vec![half::f16::ZERO; m * n];
    let mut run = || {
        let input = if name == "matmul-f16" {
            HostInput::F16(&xh)
        } else {
            HostInput::F32(&x)
        };
        let out = if name == "matmul-f16" {
            HostOutput::F16(&mut yh)
        } else {
            HostOutput::F32(&mut y)
        };
        hm.run(input, m, &weights, Some(&bias), out, threads)
            .unwrap();
    };
    run();
    let flops = 2.0 * (m * n * k) as f64;
    let reps = ((2e10 / flops).ceil() as usize).clamp(3, 2000);
    let start = Instant::now();
    for _ in 0..reps {
        run();
    }
    let s = start.elapsed().as_secs_f64() / reps as f64;
    println!(
        "{name:12} tile {}x{} m={m:4} n={n} k={k} threads={threads}: {:7.1} GFLOP/s, weights {:6.1} GB/s ({:.3} ms)",
        t.ep,
        t.hp,
        flops / s / 1e9,
        weights.codes.len() as f64 / s / 1e9,
        s * 1e3
    );
}

fn main() {
    if std::env::var("GEMV").is_ok() {
        for _ in 0..3 {
            time("matmul-f32", None, 1, 4096, 4096, 1);
            time("matmul-f16", None, 1, 4096, 4096, 1);
        }
        return;
    }
    for threads in [1, 2] {
        time("matmul-f32", None, 512, 4096, 4096, threads);
        time("matmul-f32", Some((4, 16)), 512, 4096, 4096, threads);
        time("matmul-f32", None, 1, 4096, 4096, threads);
        time("matmul-f32", None, 4, 4096, 4096, threads);
        time("matmul-f16", None, 1, 4096, 4096, threads);
        time("matmul-w8a8", None, 1, 4096, 4096, threads);
        time("matmul-w4a8", None, 1, 4096, 4096, threads);
        time("matmul-w4a8", None, 512, 4096, 4096, threads);
    }
}
