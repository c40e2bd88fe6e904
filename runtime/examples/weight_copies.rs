//! What one packed weight copy costs: the same `Linear`s on a device
//! opened with `one_weight_copy` and on one without, in alternating
//! blocks of calls in one run, over enough copies of the weights to leave the
//! caches (a decode step reads its weights from DRAM); median µs per call.
//!
//! ```text
//! cargo run --release -p tessera-runtime --example weight_copies -- [FORMAT] [THREADS] [N,K]
//! ```

use std::sync::Arc;
use std::time::Instant;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tessera_runtime::{Backend, Device, DeviceOptions, Linear, WeightFormat, Weights};

type Error = Box<dyn std::error::Error>;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), Error> {
    let mut args = std::env::args().skip(1);
    let format: WeightFormat = args.next().as_deref().unwrap_or("q4_0").parse()?;
    let threads: usize = args.next().as_deref().unwrap_or("1").parse()?;
    let shape = args.next().unwrap_or_else(|| "4096,4096".into());
    let (n, k) = shape
        .split_once(',')
        .and_then(|(n, k)| Some((n.parse::<usize>().ok()?, k.parse::<usize>().ok()?)))
        .ok_or("shape: N,K")?;
    let open = |one_weight_copy| -> Result<Arc<Device>, Error> {
        Ok(Arc::new(Device::open(
            Backend::best_host(),
            DeviceOptions {
                threads: Some(threads),
                one_weight_copy,
                ..Default::default()
            },
        )?))
    };
    let (three, one) = (open(false)?, open(true)?);
    let mut r = ChaCha8Rng::seed_from_u64(3);
    let w: Vec<f32> = (0..n * k).map(|_| r.gen_range(-1.0..1.0)).collect();
    // Copies past the L3: at 4.5 bits per weight, 96 MiB of packed weights.
    let copies = ((96usize << 20) / (n * k / 2).max(1)).clamp(2, 16);
    let mut layers = Vec::new();
    for dev in [&three, &one] {
        let mut v = Vec::new();
        for _ in 0..copies {
            v.push(Linear::new(dev, format, Weights::F32(&w), n, k, None)?);
        }
        layers.push(v);
    }
    println!(
        "{format} [{n}, {k}], {threads} thread(s), backend {:?}, {copies} copies each",
        three.backend()
    );
    println!(
        "default plan ({} packings): {}",
        layers[0][0].packings(),
        layers[0][0].plan()
    );
    println!(
        "one copy ({} packing): {}",
        layers[1][0].packings(),
        layers[1][0].plan()
    );
    println!("| m | default µs | one copy µs | one ÷ default |");
    println!("|---|---|---|---|");
    for m in [1usize, 2, 4, 8, 16, 64] {
        let x: Vec<f32> = (0..m * k).map(|_| r.gen_range(-1.0..1.0)).collect();
        let mut y = vec![0.0f32; m * n];
        let rounds = if m >= 16 { 9 } else { 25 };
        let mut times = [Vec::new(), Vec::new()];
        // Blocks of calls per device, A B A B: alternating single calls
        // would leave the idle device's workers spinning beside the busy
        // one's on a small machine.
        for block in 0..4 {
            let i = block % 2;
            for round in 0..rounds {
                let l = &layers[i][round % copies];
                let t = Instant::now();
                l.forward_f32(&x, m, &mut y)?;
                times[i].push(t.elapsed().as_secs_f64() * 1e6);
            }
        }
        let [a, b] = times.map(median);
        println!("| {m} | {a:.0} | {b:.0} | {:.3} |", b / a);
    }
    Ok(())
}
