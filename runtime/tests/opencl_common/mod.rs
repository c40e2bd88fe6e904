//! Shared by the OpenCL differential tests: the device (or a visible SKIP)
//! and the solver's tiles.

use std::sync::{Mutex, MutexGuard};

use tessera_codegen::{Problem, TileConfig, opencl, solve};
use tessera_dsl::Kernel;
use tessera_runtime::opencl::ClDevice;

/// Serializes the tests of one binary: PoCL's compiler is not safe to
/// drive from several contexts at once (parallel builds crash it).
static DEVICE_LOCK: Mutex<()> = Mutex::new(());

/// Holds the lock for the test's duration, with the device.
pub struct Locked {
    pub dev: ClDevice,
    _guard: MutexGuard<'static, ()>,
}

impl std::ops::Deref for Locked {
    type Target = ClDevice;
    fn deref(&self) -> &ClDevice {
        &self.dev
    }
}

/// The first OpenCL device with a per-process cache dir, or `None` after
/// printing a SKIP line (no platform on this machine).
pub fn device(test: &str) -> Option<Locked> {
    let guard = DEVICE_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    match ClDevice::first() {
        Ok(d) => Some(Locked {
            _guard: guard,
            dev: d.with_cache_dir(
                std::env::temp_dir().join(format!("tessera-opencl-cache-{}", std::process::id())),
            ),
        }),
        Err(e) => {
            tessera_dsl::testing::missing_tool(test, &format!("no OpenCL platform (PoCL): {e}"));
            None
        }
    }
}

#[allow(dead_code)]
/// The solver's best OpenCL tile for `kernel` at `e` rows.
pub fn tile(kernel: &Kernel, e: u64) -> TileConfig {
    let caps = opencl::caps();
    let mut p = Problem::from_kernel(caps, kernel).expect("a GPU matmul");
    p.e = e;
    solve(caps, &p).expect("a feasible tile").remove(0)
}
