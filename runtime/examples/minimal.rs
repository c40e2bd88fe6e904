//! The smallest program using the runtime: open the host device, make a
//! linear layer, run it. Built with and without `jit` to measure what the
//! JIT costs in binary size (docs/PERFORMANCE.md). Without `jit` (and no
//! prebuilt kernels given) it reports the device as unavailable.

use std::sync::Arc;

use tessera_runtime::{Backend, Device, DeviceOptions, Linear, WeightFormat, Weights};

fn main() {
    let device = match Device::open(
        Backend::best_host(),
        DeviceOptions {
            threads: Some(1),
            ..Default::default()
        },
    ) {
        Ok(d) => Arc::new(d),
        Err(e) => {
            println!("{e}");
            return;
        }
    };
    let w = vec![0.5f32; 8 * 16];
    let result =
        Linear::new(&device, WeightFormat::W4A8, Weights::F32(&w), 8, 16, None).and_then(|l| {
            let mut y = vec![0.0; 8];
            l.forward_f32(&[1.0; 16], 1, &mut y).map(|_| y)
        });
    println!("{result:?}");
}
