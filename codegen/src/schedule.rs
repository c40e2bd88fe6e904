//! The schedule statements as backends read them: one place that says what
//! `parallel` and `split` make a backend do, so no backend can ignore them.
//! Each check returns what a refusing backend names in its error.
//!
//! - `split` on a matmul: no backend splits K with a combine step, so every
//!   backend refuses it ([`matmul_split`]).
//! - GPU launches spread fixed axes over thread blocks (a matmul's `e` and
//!   `h`, an attention's `kvh`, and a decode's `s` by split-K); a kernel
//!   that does not allow one of them is refused ([`gpu_grid`]).
//! - CPU threads: the host runtime spreads an axis across threads only when
//!   the kernel lists it ([`spreads`]); otherwise it runs on one thread.

use tessera_dsl::ir::Kernel;

/// A matmul's `split`, which every backend refuses.
pub fn matmul_split(kernel: &Kernel) -> Option<String> {
    kernel.schedule.split.as_ref().map(|axis| {
        format!(
            "schedule `split {axis}` on a matmul (split-K with a combine step is not \
             implemented by any backend; remove the line)"
        )
    })
}

/// What a GPU launch cannot honour: an axis of `grid` (the axes it spreads
/// over thread blocks) missing from `parallel`, or a `split` other than
/// `split` (the axis it splits across blocks, if any).
pub fn gpu_grid(kernel: &Kernel, grid: &[&str], split: Option<&str>) -> Option<String> {
    let s = &kernel.schedule;
    if let Some(axis) = grid.iter().find(|a| !s.parallel.iter().any(|p| p == *a)) {
        return Some(format!(
            "a schedule without `parallel {axis}` (the launch spreads {} over thread blocks: \
             list them in `parallel`)",
            grid.join(", ")
        ));
    }
    match (split, s.split.as_deref()) {
        (Some(want), got) if got != Some(want) => Some(format!(
            "a schedule without `split {want}` (the launch splits {want} across thread blocks \
             and combines the parts)"
        )),
        (None, Some(got)) => Some(format!(
            "schedule `split {got}` (this launch does not split)"
        )),
        _ => None,
    }
}

/// Whether a CPU run may give `axis` of `kernel` to different threads.
pub fn spreads(kernel: &Kernel, axis: &str) -> bool {
    kernel.schedule.parallel.iter().any(|a| a == axis)
}
