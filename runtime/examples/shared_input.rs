//! What quantizing a shared input once saves: Qwen2-1.5B's Q, K, V (1536,
//! 256, 256 × 1536) and gate, up (8960 × 1536) as separate `Linear`s, run
//! one by one (`forward`: x quantized per layer) and through one
//! `SharedInput` (`forward_shared`: once per group, into the buffers of
//! the round before, as a decode loop would), in alternating
//! rounds of one run; the median of each.
//!
//! ```text
//! cargo run --release -p tessera-runtime --example shared_input -- [FORMAT] [THREADS]
//! ```

use std::sync::Arc;
use std::time::Instant;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tessera_runtime::{
    Backend, Device, DeviceOptions, Input, Linear, Output, SharedInput, WeightFormat, Weights,
};

type Error = Box<dyn std::error::Error>;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), Error> {
    let mut args = std::env::args().skip(1);
    let format: WeightFormat = args.next().as_deref().unwrap_or("q4_0").parse()?;
    let threads: usize = args.next().as_deref().unwrap_or("1").parse()?;
    let dev = Arc::new(Device::open(
        Backend::best_host(),
        DeviceOptions {
            threads: Some(threads),
            ..Default::default()
        },
    )?);
    let k = 1536;
    let mut r = ChaCha8Rng::seed_from_u64(3);
    let mut layer = |n: usize| -> Result<Linear, Error> {
        let w: Vec<f32> = (0..n * k).map(|_| r.gen_range(-1.0..1.0)).collect();
        Ok(Linear::new(&dev, format, Weights::F32(&w), n, k, None)?)
    };
    let groups = [
        ("q, k, v", vec![layer(1536)?, layer(256)?, layer(256)?]),
        ("gate, up", vec![layer(8960)?, layer(8960)?]),
    ];
    println!(
        "{format}, {threads} thread(s), backend {:?}; median µs per group call",
        dev.backend()
    );
    println!("| layers | m | separate | shared | shared ÷ separate | quantizations |");
    println!("|---|---|---|---|---|---|");
    for (name, layers) in &groups {
        for m in [1usize, 16, 128, 512] {
            let x: Vec<f32> = (0..m * k).map(|_| r.gen_range(-1.0..1.0)).collect();
            let mut ys: Vec<Vec<f32>> = layers.iter().map(|l| vec![0.0; m * l.n()]).collect();
            let rounds = if m >= 128 { 7 } else { 41 };
            let (mut separate, mut shared) = (Vec::new(), Vec::new());
            let mut quantizations = 0;
            let mut buffers = Some(tessera_runtime::InputBuffers::default());
            for _ in 0..rounds {
                let t = Instant::now();
                for (l, y) in layers.iter().zip(&mut ys) {
                    l.forward(Input::F32(&x), m, Output::F32(y))?;
                }
                separate.push(t.elapsed().as_secs_f64() * 1e6);
                let t = Instant::now();
                let input = SharedInput::with_buffers(
                    Input::F32(&x),
                    m,
                    buffers.take().unwrap_or_default(),
                );
                for (l, y) in layers.iter().zip(&mut ys) {
                    l.forward_shared(&input, Output::F32(y))?;
                }
                shared.push(t.elapsed().as_secs_f64() * 1e6);
                quantizations = input.quantizations();
                buffers = Some(input.into_buffers());
            }
            let (a, b) = (median(separate), median(shared));
            println!(
                "| {name} | {m} | {a:.0} | {b:.0} | {:.3} | {quantizations} of {} |",
                b / a,
                layers.len()
            );
        }
    }
    Ok(())
}
