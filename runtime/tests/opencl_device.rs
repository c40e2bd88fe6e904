//! `Device::open(Backend::OpenCl)` end to end on whatever OpenCL device
//! exists (PoCL here): the shared GPU device tests (`gpu_device`). Without
//! an OpenCL platform each test prints SKIP (and fails under CI, where the
//! test command installed PoCL).

#![cfg(feature = "opencl")]

mod gpu_device;

use std::sync::{Arc, Mutex};

use gpu_device::{Gpu, Opened};
use tessera_runtime::record::TuningRecord;
use tessera_runtime::{Backend, Device, DeviceOptions, RuntimeError};

/// PoCL's compiler is not safe to drive from several contexts at once.
static LOCK: Mutex<()> = Mutex::new(());

fn open(test: &str, record: Option<TuningRecord>) -> Option<Opened> {
    let guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let options = DeviceOptions {
        record,
        gpu_cache_dir: Some(
            std::env::temp_dir().join(format!("tessera-rt-opencl-{}", std::process::id())),
        ),
        ..Default::default()
    };
    match Device::open(Backend::OpenCl, options) {
        Ok(d) => Some((Arc::new(d), guard)),
        Err(RuntimeError::Unavailable { why, .. }) => {
            tessera_dsl::testing::missing_tool(test, &format!("no OpenCL platform (PoCL): {why}"));
            None
        }
        Err(e) => panic!("{test}: {e}"),
    }
}

const GPU: Gpu = Gpu {
    open,
    name: "OpenCL",
    record_target: "opencl-gpu",
    record_backend: "opencl",
    seed: 21,
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
