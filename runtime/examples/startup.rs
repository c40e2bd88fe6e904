//! Start-up bench: time to open a device and prepare (JIT and map) every
//! kernel a whole Qwen2-1.5B model needs — its four weight shapes × the
//! three variants, plus decode attention — for each JIT backend and format.
//! Target: ≤ 20 ms per backend and format on this machine.
//!
//! `cargo run --release -p tessera-runtime --example startup`

use std::time::{Duration, Instant};

use tessera_runtime::{Backend, Device, DeviceOptions, WeightFormat};

/// qkv, o, gate_up, down as [N, K].
const QWEN2_1_5B: [(usize, usize); 4] = [(2048, 1536), (1536, 1536), (17920, 1536), (1536, 8960)];
const RUNS: usize = 7;

fn main() {
    println!(
        "Qwen2-1.5B kernel set (4 shapes × 3 variants + decode attention), median of {RUNS} fresh devices"
    );
    for backend in [Backend::HostX86, Backend::HostClif, Backend::Neon] {
        for format in [
            WeightFormat::W4A8,
            WeightFormat::W8A8,
            WeightFormat::F32,
            WeightFormat::F16,
        ] {
            let mut times: Vec<Duration> = Vec::new();
            let mut kernels = 0;
            let mut failure = None;
            for _ in 0..RUNS {
                let start = Instant::now();
                let result = Device::open(
                    backend,
                    DeviceOptions {
                        threads: Some(1),
                        ..Default::default()
                    },
                )
                .and_then(|dev| {
                    dev.prepare(format, &QWEN2_1_5B)?;
                    let att = std::sync::Arc::new(dev);
                    tessera_runtime::Attention::new(
                        &att,
                        12,
                        2,
                        128,
                        tessera_runtime::KvFormat::F16,
                    )?;
                    Ok(att.prepared_kernels())
                });
                match result {
                    Ok(n) => {
                        times.push(start.elapsed());
                        kernels = n;
                    }
                    Err(e) => {
                        failure = Some(e.to_string());
                        break;
                    }
                }
            }
            match failure {
                Some(why) => println!("{backend:>5} {format:>5}: unavailable ({why})"),
                None => {
                    times.sort();
                    let median = times[times.len() / 2];
                    println!(
                        "{backend:>5} {format:>5}: {:>8.2?} median ({} matmul kernels + attention; min {:.2?}, max {:.2?}){}",
                        median,
                        kernels,
                        times[0],
                        times[times.len() - 1],
                        if median <= Duration::from_millis(20) {
                            ""
                        } else {
                            "  ABOVE the 20 ms target"
                        }
                    );
                }
            }
        }
    }
}
