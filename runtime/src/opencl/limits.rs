//! The device's own limits, measured with two tiny kernels so tuned
//! kernels print as a fraction of its roofline: streaming read bandwidth
//! (the better of two access patterns: each work group summing one
//! contiguous block with its work items interleaved, which coalesces on a
//! GPU, and each work item summing its own contiguous block, which streams
//! on a CPU device such as PoCL's) and
//! the f32 multiply-add rate (independent `mad` chains in registers).
//! Each figure is the median of several timed launches (wall clock around
//! launch and finish, so a launch's fixed cost counts against it, as it
//! does for the kernels compared with it).

use std::time::Instant;

use opencl3::kernel::{ExecuteKernel, Kernel as ClKernel};
use opencl3::types::cl_int;

use super::{ClDevice, ClError, driver, input};

const SOURCE: &str = r"
__kernel void tessera_read_bw(__global const uint4* src, __global uint* out, int n) {
    int groups = get_num_groups(0);
    int per = (n + groups - 1) / groups;
    int begin = get_group_id(0) * per;
    int end = min(begin + per, n);
    uint4 acc = (uint4)(0u);
    for (int i = begin + get_local_id(0); i < end; i += get_local_size(0)) acc += src[i];
    out[get_global_id(0)] = acc.x ^ acc.y ^ acc.z ^ acc.w;
}

__kernel void tessera_read_bw_blocks(__global const uint4* src, __global uint* out, int n) {
    int gs = get_global_size(0);
    int per = (n + gs - 1) / gs;
    int begin = get_global_id(0) * per;
    int end = min(begin + per, n);
    uint4 acc = (uint4)(0u);
    for (int i = begin; i < end; i++) acc += src[i];
    out[get_global_id(0)] = acc.x ^ acc.y ^ acc.z ^ acc.w;
}

__kernel void tessera_peak_mad(__global float* out, int iters, float b) {
    int gid = get_global_id(0);
    float4 a0 = (float4)(gid * 1e-7f);
    float4 a1 = a0 + 0.25f;
    float4 a2 = a0 + 0.5f;
    float4 a3 = a0 + 0.75f;
    for (int i = 0; i < iters; i++) {
        a0 = mad(a0, b, 0.5f);
        a1 = mad(a1, b, 0.5f);
        a2 = mad(a2, b, 0.5f);
        a3 = mad(a3, b, 0.5f);
    }
    float4 s = a0 + a1 + a2 + a3;
    out[gid] = s.x + s.y + s.z + s.w;
}
";

/// Multiply-adds one work item of `tessera_peak_mad` does per iteration.
const MADS_PER_ITER: f64 = 16.0;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Time `runs` launches of `kernel` over `global` work items, seconds each.
fn time_runs(
    dev: &ClDevice,
    kernel: &ClKernel,
    global: usize,
    local: Option<usize>,
    runs: usize,
    set: &dyn Fn(&mut ExecuteKernel),
) -> Result<Vec<f64>, ClError> {
    let mut out = Vec::with_capacity(runs);
    // One untimed launch: first-touch and JIT costs are not the device's.
    for i in 0..=runs {
        let mut exec = ExecuteKernel::new(kernel);
        set(&mut exec);
        exec.set_global_work_size(global);
        if let Some(l) = local {
            exec.set_local_work_size(l);
        }
        let t0 = Instant::now();
        // SAFETY: `set` binds every argument the kernel declares with the
        // matching type; buffers outlive the call (`finish` waits).
        unsafe {
            exec.enqueue_nd_range(&dev.queue)
                .map_err(driver("kernel launch"))?;
        }
        dev.queue.finish().map_err(driver("queue finish"))?;
        if i > 0 {
            out.push(t0.elapsed().as_secs_f64().max(1e-9));
        }
    }
    Ok(out)
}

/// Streaming read bandwidth of the device's global memory, GB/s, over a
/// buffer of about `bytes` (make it several times the last-level cache).
pub fn read_bandwidth(dev: &ClDevice, bytes: usize, runs: usize) -> Result<f64, ClError> {
    let chunks = (bytes / 16).max(1 << 16);
    let n = cl_int::try_from(chunks).map_err(|_| input("bandwidth buffer too large"))?;
    let built = dev.build(SOURCE)?;
    let kernel =
        ClKernel::create(&built.program, "tessera_read_bw").map_err(driver("kernel creation"))?;
    let src = dev.alloc::<u8>(chunks * 16)?;
    // Initialise once so no driver serves untouched pages for free.
    let fill = vec![1u8; chunks * 16];
    let mut src = src;
    dev.write_at(&mut src, chunks * 16, 0, &fill)?;
    drop(fill);
    const LOCAL: usize = 64;
    let units = dev.device.max_compute_units().unwrap_or(1).max(1) as usize;
    let global = units * 16 * LOCAL;
    let out = dev.alloc::<u32>(global)?;
    let set = |exec: &mut ExecuteKernel| {
        // SAFETY: argument types match both kernels' signature.
        unsafe {
            exec.set_arg(&src).set_arg(&out).set_arg(&n);
        }
    };
    let interleaved = time_runs(dev, &kernel, global, Some(LOCAL), runs.max(1), &set)?;
    let blocks_kernel = ClKernel::create(&built.program, "tessera_read_bw_blocks")
        .map_err(driver("kernel creation"))?;
    let blocks = time_runs(dev, &blocks_kernel, units * 4, None, runs.max(1), &set)?;
    let best = median(interleaved).min(median(blocks));
    Ok((chunks * 16) as f64 / best / 1e9)
}

/// Peak f32 multiply-add rate, G multiply-adds per second.
pub fn peak_mads(dev: &ClDevice, runs: usize) -> Result<f64, ClError> {
    let built = dev.build(SOURCE)?;
    let kernel =
        ClKernel::create(&built.program, "tessera_peak_mad").map_err(driver("kernel creation"))?;
    let units = dev.device.max_compute_units().unwrap_or(1).max(1) as usize;
    let global = units * 1024;
    let out = dev.alloc::<f32>(global)?;
    let b: f32 = 0.999;
    // Calibrate to a launch of about 20 ms.
    let mut iters: cl_int = 256;
    loop {
        let t = time_runs(dev, &kernel, global, None, 1, &|exec| {
            // SAFETY: argument types match the kernel signature.
            unsafe {
                exec.set_arg(&out).set_arg(&iters).set_arg(&b);
            }
        })?;
        if t[0] >= 0.02 || iters >= 1 << 24 {
            break;
        }
        iters *= 2;
    }
    let times = time_runs(dev, &kernel, global, None, runs.max(1), &|exec| {
        // SAFETY: argument types match the kernel signature.
        unsafe {
            exec.set_arg(&out).set_arg(&iters).set_arg(&b);
        }
    })?;
    Ok(global as f64 * f64::from(iters) * MADS_PER_ITER / median(times) / 1e9)
}
