//! `Device::open(Backend::Cuda)` end to end on an NVIDIA GPU: the shared
//! GPU device tests (`gpu_device`), and launches on a stream of the
//! caller's with device buffers. Without a CUDA driver and device (as on
//! the machines Tessera is developed and tested on) each test prints SKIP:
//! the GPU check (`scripts/gpu-check.sh`) runs them on one.

#![cfg(feature = "cuda")]

mod gpu_device;

use std::sync::{Arc, Mutex};

use gpu_device::{Gpu, Opened, linear_case};
use half::f16;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tessera_runtime::cuda::CudaOut;
use tessera_runtime::record::TuningRecord;
use tessera_runtime::{
    Backend, Device, DeviceOptions, Input, Linear, Output, RuntimeError, WeightFormat, Weights,
};

/// One device at a time: the tests share the GPU's one context.
static LOCK: Mutex<()> = Mutex::new(());

fn open(test: &str, record: Option<TuningRecord>) -> Option<Opened> {
    let guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let options = DeviceOptions {
        record,
        ..Default::default()
    };
    match Device::open(Backend::Cuda, options) {
        Ok(d) => Some((Arc::new(d), guard)),
        Err(RuntimeError::Unavailable { why, .. }) => {
            eprintln!("SKIP {test}: no CUDA device ({why})");
            None
        }
        Err(e) => panic!("{test}: {e}"),
    }
}

const GPU: Gpu = Gpu {
    open,
    name: "CUDA",
    record_target: "ptx",
    record_backend: "cuda",
    seed: 31,
};

#[test]
fn device_objects_are_shareable_across_threads() {
    gpu_device::device_objects_are_shareable_across_threads();
}

#[test]
fn linear_every_gpu_format_at_the_default_breakpoints() {
    gpu_device::linear_every_gpu_format_at_the_default_breakpoints(&GPU);
}

#[test]
fn linear_non_finite_activations_match_the_interpreter() {
    gpu_device::linear_non_finite_activations_match_the_interpreter(&GPU);
}

#[test]
fn linear_dispatches_by_a_records_breakpoints() {
    gpu_device::linear_dispatches_by_a_records_breakpoints(&GPU);
}

#[test]
fn linear_bad_shapes_and_formats_are_errors() {
    gpu_device::linear_bad_shapes_and_formats_are_errors(&GPU);
}

#[test]
fn attention_decodes_and_prefills_across_kv_chunks_on_the_device() {
    gpu_device::attention_decodes_and_prefills_across_kv_chunks_on_the_device(&GPU);
}

#[test]
fn attention_refuses_misplaced_caches_and_bad_shapes() {
    gpu_device::attention_refuses_misplaced_caches_and_bad_shapes(&GPU);
}

#[test]
fn linear_launches_on_a_callers_stream_with_device_buffers() {
    let Some((dev, _g)) = open(
        "linear_launches_on_a_callers_stream_with_device_buffers",
        None,
    ) else {
        return;
    };
    let cuda = dev.cuda().expect("a CUDA device");
    let side = cuda.with_new_stream().unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(32);
    let (n, k) = (70, 130);
    let c = linear_case(WeightFormat::W4A16, n, k, &mut rng);
    let lin = Linear::new(
        &dev,
        WeightFormat::W4A16,
        Weights::F32(&c.raw),
        n,
        k,
        Some(&c.bias),
    )
    .unwrap();
    for m in [1, lin.plan().m1, lin.plan().m2 + 1] {
        let x: Vec<f16> = (0..m * k)
            .map(|_| f16::from_f32(rng.gen_range(-1.0..1.0)))
            .collect();
        let mut host = vec![0f32; m * n];
        lin.forward(Input::F16(&x), m, Output::F32(&mut host))
            .unwrap();
        // The same call enqueued on another stream: upload, launch and
        // read back there, ordered by an event the main stream waits on.
        let bits: Vec<u16> = x.iter().map(|v| v.to_bits()).collect();
        let xb = side.stream().clone_htod(&bits).unwrap();
        let got: Vec<f32> = if lin.cuda_writes_half(lin.variant_for(m)).unwrap() {
            let mut yb = side.stream().alloc_zeros::<u16>(m * n).unwrap();
            lin.forward_cuda(side.stream(), &xb, m, CudaOut::F16(&mut yb))
                .unwrap();
            let done = side.stream().record_event(None).unwrap();
            cuda.stream().wait(&done).unwrap();
            let b = cuda.stream().clone_dtoh(&yb).unwrap();
            b.into_iter().map(|v| f16::from_bits(v).to_f32()).collect()
        } else {
            let mut yb = side.stream().alloc_zeros::<f32>(m * n).unwrap();
            lin.forward_cuda(side.stream(), &xb, m, CudaOut::F32(&mut yb))
                .unwrap();
            let done = side.stream().record_event(None).unwrap();
            cuda.stream().wait(&done).unwrap();
            cuda.stream().clone_dtoh(&yb).unwrap()
        };
        assert_eq!(
            got, host,
            "m={m}: the stream launch computes what forward does"
        );
        // A short device buffer is an error, not a launch.
        let short = side.stream().alloc_zeros::<u16>(1).unwrap();
        let mut yb = side.stream().alloc_zeros::<f32>(m * n).unwrap();
        let e = lin
            .forward_cuda(side.stream(), &short, m, CudaOut::F32(&mut yb))
            .unwrap_err();
        assert!(e.to_string().contains("x holds"), "{e}");
    }
}
