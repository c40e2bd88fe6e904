//! A persistent thread pool and the weighted work split (MNN-LLM 5.2).
//!
//! Kernels split the output channels (hp panels) — and prefill attention the
//! query tokens — across cores. On big.LITTLE parts an even split leaves the
//! big cores idle while the little ones finish, so each core gets a share
//! proportional to its measured throughput ([`split_weighted`]); the
//! weights come from the tuning record and default to equal.
//!
//! Per-core weights belong to CPUs, so on such parts the workers are pinned
//! ([`ThreadPool::pinned`]): worker i runs on the CPU whose weight it uses.
//! The calling thread (the engine's) is never pinned; it may run anywhere
//! and is given the smallest weight (see `Device::open`).
//!
//! [`ThreadPool::run`] calls one closure per share (the calling thread's
//! is share 0, worker i's share i) and returns only when every share is
//! done, so the closure may borrow from the caller's stack. Workers live as
//! long as the pool: no thread is spawned per call. A share its worker has
//! not taken 20 µs into the call (`STEAL_AFTER`), when the caller is done with
//! its own, runs on the caller instead (the worker is asleep, or waits for
//! a CPU other work holds): the call then takes about the one-thread time,
//! not the worker's wake-up.
//!
//! Decode runs one small matmul after another (a Qwen2-1.5B GEMV reads
//! 1–9 MB, 50–400 µs), so waking a sleeping worker through the OS (a futex
//! round trip, tens of µs on a VM) would be a visible share of each call.
//! Workers therefore spin for [`SPIN`] after their last job before they
//! sleep on the condition variable, and the caller spins as long for the
//! workers to finish; a pool used back to back never enters the kernel.
//! A wait that passes 20 µs (`YIELD_AFTER`) yields the CPU every few spins, so a
//! thread it waits for that shares its CPU (the machine's other cores
//! busy) runs instead of waiting out the spin.

use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle worker (and a caller waiting for workers) spins before
/// it sleeps: longer than the gap between a decode step's matmuls, short
/// enough that an idle pool stops burning its cores at once.
pub const SPIN: Duration = Duration::from_micros(200);
/// How long a spin wait spins before it starts to yield ([`spin_or_yield`]):
/// past the wait of back-to-back calls on idle cores.
const YIELD_AFTER: Duration = Duration::from_micros(20);
/// How long after publishing a call the caller, done with its own share,
/// runs the shares no worker has taken yet ([`steal_unclaimed`]): longer
/// than a spinning worker takes to see the call, about a sleeping one's
/// wake-up on a VM.
const STEAL_AFTER: Duration = Duration::from_micros(20);
/// Spin-wait steps between yields once it does.
const YIELD_EVERY: u32 = 16;

/// The job of one [`ThreadPool::run`] call with its borrow lifetime erased.
/// Only dereferenced while `run` blocks the caller (see the SAFETY notes).
#[derive(Clone, Copy)]
struct JobPtr(*const (dyn Fn(usize) + Sync));
// SAFETY: the pointee is `Sync` and outlives every use (run() waits for all
// workers before returning and before the borrow ends).
unsafe impl Send for JobPtr {}

struct State {
    job: Option<JobPtr>,
    panicked: bool,
    shutdown: bool,
    /// Workers asleep on `work` (notified only when some are).
    sleepers: usize,
    /// Whether the caller sleeps on `done`.
    caller_sleeps: bool,
}

struct Shared {
    state: Mutex<State>,
    /// The CPU each worker is pinned to (index 0, the caller: never).
    pins: Mutex<Vec<Option<usize>>>,
    /// Bumped per run (after `job` is set, under the lock) so a worker runs
    /// each job exactly once; read without the lock while spinning.
    generation: AtomicU64,
    /// Workers (excluding the caller) still running the current job.
    pending: AtomicUsize,
    /// The CPU the caller ran on when it published the current job
    /// (`usize::MAX`: unknown), for [`leave_callers_cpu`].
    caller_cpu: AtomicUsize,
    /// Per share (index 0, the caller's, unused): taken for this call,
    /// by its worker or by the caller ([`STEAL_AFTER`]). Cleared under
    /// the lock before each call is published; a worker takes its share
    /// under the lock in the step that reads the job, so it never runs a
    /// job of another call.
    claimed: Vec<AtomicBool>,
    work: Condvar,
    done: Condvar,
}

fn lock_pins(shared: &Shared) -> MutexGuard<'_, Vec<Option<usize>>> {
    shared.pins.lock().unwrap_or_else(|e| e.into_inner())
}

/// Pin the calling thread to `cpu`: Linux and Android (`sched_setaffinity`);
/// false where the OS refuses (a CPU outside the process's set, a cgroup)
/// or has no such call.
pub fn pin_current_thread(cpu: usize) -> bool {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        if cpu >= libc::CPU_SETSIZE as usize {
            return false;
        }
        // SAFETY: `set` is a plain bitmask initialised by CPU_ZERO; the call
        // reads `size_of::<cpu_set_t>()` bytes of it and affects only the
        // calling thread (pid 0).
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_ZERO(&mut set);
            libc::CPU_SET(cpu, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
        }
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    {
        let _ = cpu;
        false
    }
}

/// A worker that sees a call while it runs on the caller's CPU moves to
/// another. The scheduler sometimes wakes a worker onto the caller's CPU
/// while the other is idle and leaves the two there until its next
/// balance, milliseconds later: the worker runs only when the caller
/// yields, and the caller runs the worker's shares itself. Measured on a
/// Sapphire Rapids-class VM (2 vCPUs), two-thread decode attention at 512
/// keys, 80 calls a run: in one run the worker saw 3 of the 80 calls, all
/// on the caller's CPU, and the caller ran the other 76 shares (44.5 µs a
/// call, against 27–30 in other runs and 37 on one thread). With the move,
/// 3 runs of 12 found the worker there, once each, and it left. Pinned
/// workers stay where they are.
fn leave_callers_cpu(shared: &Shared) {
    let caller = shared.caller_cpu.load(Ordering::Relaxed);
    if caller != usize::MAX && current_cpu() == Some(caller) {
        move_off_cpu(caller);
    }
}

/// Move the calling thread off `cpu` (Linux and Android): its affinity
/// without `cpu`, which migrates it at once, then its affinity as it was,
/// so the scheduler stays free to place it later (were that restore
/// refused, the thread would only stay off `cpu`). False where no other
/// CPU is allowed or the OS refuses.
pub fn move_off_cpu(cpu: usize) -> bool {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        if cpu >= libc::CPU_SETSIZE as usize {
            return false;
        }
        let size = std::mem::size_of::<libc::cpu_set_t>();
        // SAFETY: both sets are plain bitmasks, the first filled by the
        // kernel, the second a copy of it; the calls read or write `size`
        // bytes of them and affect only the calling thread (pid 0).
        unsafe {
            let mut allowed: libc::cpu_set_t = std::mem::zeroed();
            if libc::sched_getaffinity(0, size, &mut allowed) != 0 {
                return false;
            }
            let mut elsewhere = allowed;
            libc::CPU_CLR(cpu, &mut elsewhere);
            let other = (0..libc::CPU_SETSIZE as usize).any(|c| libc::CPU_ISSET(c, &elsewhere));
            if !other {
                return false;
            }
            let moved = libc::sched_setaffinity(0, size, &elsewhere) == 0;
            libc::sched_setaffinity(0, size, &allowed);
            moved
        }
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    {
        let _ = cpu;
        false
    }
}

/// The CPU the calling thread runs on now (Linux and Android), else None.
pub fn current_cpu() -> Option<usize> {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        // SAFETY: no arguments; returns the CPU number or -1.
        let cpu = unsafe { libc::sched_getcpu() };
        usize::try_from(cpu).ok()
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    {
        None
    }
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    // A poisoned lock only means a job panicked; the state stays consistent
    // (every field is updated under the lock in one step).
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Persistent worker threads; `threads()` counts the caller too.
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// Serializes `run` calls from different threads.
    running: Mutex<()>,
}

impl std::fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadPool")
            .field("threads", &self.threads())
            .finish()
    }
}

impl ThreadPool {
    /// A pool of `threads` (at least 1: the caller alone).
    pub fn new(threads: usize) -> ThreadPool {
        ThreadPool::spawn(threads, &[])
    }

    /// A pool whose worker i (i ≥ 1) is pinned to `cpus[i]` where the OS
    /// allows it ([`ThreadPool::worker_cpus`] says which were); returns once
    /// every worker has tried.
    pub fn pinned(threads: usize, cpus: &[usize]) -> ThreadPool {
        ThreadPool::spawn(threads, cpus)
    }

    /// The CPU each worker is pinned to (None: not pinned; index 0, the
    /// calling thread, is never pinned).
    pub fn worker_cpus(&self) -> Vec<Option<usize>> {
        let pins = self.shared.pins.lock().unwrap_or_else(|e| e.into_inner());
        (0..self.threads())
            .map(|i| pins.get(i).copied().flatten())
            .collect()
    }

    fn spawn(threads: usize, cpus: &[usize]) -> ThreadPool {
        let threads = threads.max(1);
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                job: None,
                panicked: false,
                shutdown: false,
                sleepers: 0,
                caller_sleeps: false,
            }),
            pins: Mutex::new(vec![None; threads]),
            generation: AtomicU64::new(0),
            pending: AtomicUsize::new(0),
            caller_cpu: AtomicUsize::new(usize::MAX),
            claimed: (0..threads).map(|_| AtomicBool::new(false)).collect(),
            work: Condvar::new(),
            done: Condvar::new(),
        });
        // Each worker tries to pin itself first thing; `pinned` waits for
        // all of them so `worker_cpus` is final when it returns.
        let tried = Arc::new(AtomicUsize::new(0));
        let workers: Vec<JoinHandle<()>> = (1..threads)
            .map(|index| {
                let shared = Arc::clone(&shared);
                let tried = Arc::clone(&tried);
                let cpu = cpus.get(index).copied();
                std::thread::Builder::new()
                    .name(format!("tessera-{index}"))
                    .spawn(move || {
                        let pinned = cpu.is_some_and(pin_current_thread);
                        if pinned {
                            lock_pins(&shared)[index] = cpu;
                        }
                        tried.fetch_add(1, Ordering::Release);
                        worker(&shared, index, pinned)
                    })
            })
            .filter_map(Result::ok)
            .collect();
        if !cpus.is_empty() {
            while tried.load(Ordering::Acquire) < workers.len() {
                std::thread::yield_now();
            }
        }
        ThreadPool {
            shared,
            workers,
            running: Mutex::new(()),
        }
    }

    /// Worker count including the calling thread (fewer than asked only if
    /// the OS refused to spawn threads).
    pub fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Call `job(worker)` for every worker `0..threads()` concurrently and
    /// wait for all of them. A panic in any worker is re-raised here after
    /// every worker has finished.
    pub fn run(&self, job: &(dyn Fn(usize) + Sync)) {
        if self.workers.is_empty() {
            job(0);
            return;
        }
        let _serial = self.running.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: erases the borrow's lifetime. Workers dereference the
        // pointer only between publishing it here and `pending` reaching 0,
        // and this function does not return (or unwind) before that.
        let erased: JobPtr = JobPtr(unsafe {
            std::mem::transmute::<*const (dyn Fn(usize) + Sync + '_), *const (dyn Fn(usize) + Sync)>(
                job as *const _,
            )
        });
        let shared = &self.shared;
        {
            let mut s = lock(&shared.state);
            s.job = Some(erased);
            s.panicked = false;
            for c in &shared.claimed {
                c.store(false, Ordering::Relaxed);
            }
            shared.pending.store(self.workers.len(), Ordering::Release);
            let cpu = current_cpu().unwrap_or(usize::MAX);
            shared.caller_cpu.store(cpu, Ordering::Relaxed);
            shared.generation.fetch_add(1, Ordering::AcqRel);
            if s.sleepers > 0 {
                shared.work.notify_all();
            }
        }
        let published = Instant::now();
        let mine = catch_unwind(AssertUnwindSafe(|| job(0)));
        let stolen = steal_unclaimed(shared, job, published);
        let start = Instant::now();
        while shared.pending.load(Ordering::Acquire) > 0 && start.elapsed() < SPIN {
            spin_or_yield(start);
        }
        let mut s = lock(&shared.state);
        while shared.pending.load(Ordering::Acquire) > 0 {
            s.caller_sleeps = true;
            s = shared.done.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        s.caller_sleeps = false;
        s.job = None;
        let worker_panicked = s.panicked;
        drop(s);
        if let Err(payload) = mine.and(stolen) {
            resume_unwind(payload);
        }
        if worker_panicked {
            panic!("a tessera worker thread panicked");
        }
    }
}

/// One step of a spin wait begun at `start`, which gives the CPU away now
/// and then once it has lasted [`YIELD_AFTER`]: where the thread it waits
/// for shares this CPU (another process holds the other cores), pure
/// spinning kept it off for the whole [`SPIN`] on every call, and a
/// two-thread decode attention call took 3–5× its one-thread time
/// (`docs/PERFORMANCE.md`). `sched_yield` returns at once when nothing
/// else is runnable here.
fn spin_or_yield(start: Instant) {
    thread_local!(static SPINS: std::cell::Cell<u32> = const { std::cell::Cell::new(0) });
    let n = SPINS.with(|c| {
        let n = c.get().wrapping_add(1);
        c.set(n);
        n
    });
    if n.is_multiple_of(YIELD_EVERY) && start.elapsed() > YIELD_AFTER {
        std::thread::yield_now();
    } else {
        std::hint::spin_loop();
    }
}

/// After the caller's own share: once [`STEAL_AFTER`] has passed since the
/// call was published, the shares no worker has taken yet run here, one
/// after another (a worker that is asleep, or waits for a CPU the machine's
/// other work holds, would otherwise hold up the call). Waits for that
/// moment while some share is untaken and some worker still runs. Returns
/// the first panic of a share it ran.
fn steal_unclaimed(
    shared: &Shared,
    job: &(dyn Fn(usize) + Sync),
    published: Instant,
) -> std::thread::Result<()> {
    let untaken = || {
        shared.claimed[1..]
            .iter()
            .any(|c| !c.load(Ordering::Acquire))
    };
    while untaken() && published.elapsed() < STEAL_AFTER {
        spin_or_yield(published);
    }
    let mut result = Ok(());
    for (index, c) in shared.claimed.iter().enumerate().skip(1) {
        if !c.swap(true, Ordering::AcqRel) {
            let r = catch_unwind(AssertUnwindSafe(|| job(index)));
            if result.is_ok() {
                result = r;
            }
            shared.pending.fetch_sub(1, Ordering::AcqRel);
        }
    }
    result
}

fn worker(shared: &Shared, index: usize, pinned: bool) {
    let mut seen = 0u64;
    loop {
        let start = Instant::now();
        while shared.generation.load(Ordering::Acquire) == seen && start.elapsed() < SPIN {
            spin_or_yield(start);
        }
        if !pinned && shared.generation.load(Ordering::Acquire) != seen {
            leave_callers_cpu(shared);
        }
        let job = {
            let mut s = lock(&shared.state);
            loop {
                if s.shutdown {
                    return;
                }
                let generation = shared.generation.load(Ordering::Acquire);
                if generation != seen
                    && let Some(job) = s.job
                {
                    seen = generation;
                    // The caller may have run this share already.
                    let mine = !shared.claimed[index].swap(true, Ordering::AcqRel);
                    break mine.then_some(job);
                }
                s.sleepers += 1;
                s = shared.work.wait(s).unwrap_or_else(|e| e.into_inner());
                s.sleepers -= 1;
            }
        };
        let Some(job) = job else {
            continue;
        };
        // SAFETY: `run` keeps the job alive until `pending` reaches 0, which
        // happens only after this call returns (below).
        let result = catch_unwind(AssertUnwindSafe(|| unsafe { (*job.0)(index) }));
        if result.is_err() {
            lock(&shared.state).panicked = true;
        }
        // The last worker out wakes a sleeping caller; it takes the lock
        // first so the caller cannot check `pending` and then miss this.
        if shared.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
            let s = lock(&shared.state);
            if s.caller_sleeps {
                shared.done.notify_all();
            }
        }
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        lock(&self.shared.state).shutdown = true;
        // Spinning workers see the new generation and then `shutdown`.
        self.shared.generation.fetch_add(1, Ordering::AcqRel);
        self.shared.work.notify_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// Split `units` (hp panels, tokens) into one contiguous range per weight,
/// each proportional to its weight (largest remainder, ties to the lower
/// index, so the split is deterministic). Non-finite or non-positive
/// weights count as zero; if all are zero the split is even. Ranges may be
/// empty (more workers than units).
pub fn split_weighted(units: usize, weights: &[f64]) -> Vec<std::ops::Range<usize>> {
    let n = weights.len().max(1);
    let clean: Vec<f64> = (0..n)
        .map(|i| {
            let w = weights.get(i).copied().unwrap_or(1.0);
            if w.is_finite() && w > 0.0 { w } else { 0.0 }
        })
        .collect();
    let total: f64 = clean.iter().sum();
    let clean = if total > 0.0 { clean } else { vec![1.0; n] };
    let total: f64 = clean.iter().sum();
    let exact: Vec<f64> = clean.iter().map(|w| units as f64 * w / total).collect();
    let mut counts: Vec<usize> = exact.iter().map(|x| x.floor() as usize).collect();
    let mut left = units.saturating_sub(counts.iter().sum());
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| {
        let ra = exact[a] - exact[a].floor();
        let rb = exact[b] - exact[b].floor();
        rb.total_cmp(&ra).then(a.cmp(&b))
    });
    for &i in order.iter().cycle().take(n * 2) {
        if left == 0 {
            break;
        }
        if clean[i] > 0.0 {
            counts[i] += 1;
            left -= 1;
        }
    }
    let mut start = 0;
    counts
        .into_iter()
        .map(|c| {
            let r = start..start + c;
            start += c;
            r
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn split_covers_every_unit_once_in_proportion() {
        let r = split_weighted(10, &[1.0, 1.0]);
        assert_eq!(r, vec![0..5, 5..10]);
        let r = split_weighted(12, &[3.0, 1.0]);
        assert_eq!(r, vec![0..9, 9..12]);
        let r = split_weighted(2, &[1.0, 1.0, 1.0, 1.0]);
        assert_eq!(r.iter().map(|r| r.len()).sum::<usize>(), 2);
        assert_eq!(r.last().unwrap().end, 2);
        let r = split_weighted(7, &[0.0, f64::NAN, -1.0]);
        assert_eq!(r.iter().map(|r| r.len()).sum::<usize>(), 7);
        let r = split_weighted(5, &[2.0, 0.0]);
        assert_eq!(r, vec![0..5, 5..5]);
        for units in 0..50 {
            let r = split_weighted(units, &[4.0, 1.3, 0.7]);
            let mut next = 0;
            for x in &r {
                assert_eq!(x.start, next);
                next = x.end;
            }
            assert_eq!(next, units);
        }
    }

    /// A two-cluster machine: worker 1 pinned to CPU 1 runs there on every
    /// call; the caller is never pinned. Where the OS refuses (one CPU, a
    /// restricted cpuset, not Linux) the pool says so and still runs.
    #[test]
    fn pinned_workers_run_on_their_cpus() {
        let pool = ThreadPool::pinned(2, &[0, 1]);
        let cpus = pool.worker_cpus();
        assert_eq!(cpus[0], None, "the caller is never pinned");
        let online = std::thread::available_parallelism().map_or(1, |n| n.get());
        if cpus[1].is_none() {
            assert!(
                online < 2 || current_cpu().is_none() || !pin_current_thread_probe(1),
                "CPU 1 exists and allows pinning, but worker 1 was not pinned"
            );
            eprintln!(
                "worker 1 not pinned here (CPUs: {online}); the split uses the smallest weight"
            );
        } else {
            assert_eq!(cpus[1], Some(1));
            let seen = Mutex::new(Vec::new());
            for _ in 0..20 {
                pool.run(&|w| {
                    // The caller's share outlasts the steal delay, so the
                    // worker takes its own; only its runs are recorded.
                    if w == 0 {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    if w == 1 && std::thread::current().name() == Some("tessera-1") {
                        lock_vec(&seen).push(current_cpu());
                    }
                });
            }
            let seen = lock_vec(&seen);
            assert!(!seen.is_empty(), "worker 1 never ran its share");
            assert!(seen.iter().all(|c| *c == Some(1)), "{seen:?}");
        }
        // An unpinned pool reports no pins.
        assert!(ThreadPool::new(2).worker_cpus().iter().all(Option::is_none));
    }

    /// `move_off_cpu` leaves the CPU it is given at once and restores the
    /// thread's affinity. (The scheduler state it repairs in the pool, a
    /// worker woken onto the caller's CPU and left there, is not one a test
    /// can bring about: pinning the caller there moves the worker away.)
    #[test]
    #[cfg(any(target_os = "linux", target_os = "android"))]
    fn move_off_cpu_leaves_the_cpu_and_keeps_the_affinity() {
        let online = std::thread::available_parallelism().map_or(1, |n| n.get());
        std::thread::spawn(move || {
            let Some(cpu) = current_cpu() else {
                assert!(!move_off_cpu(0), "no CPU numbers, yet it moved");
                return;
            };
            let before = affinity();
            if online < 2 {
                assert!(!move_off_cpu(cpu), "one CPU, yet it moved");
                return;
            }
            assert!(move_off_cpu(cpu), "two CPUs allowed, yet it did not move");
            assert_ne!(current_cpu(), Some(cpu), "still on CPU {cpu}");
            assert_eq!(affinity(), before, "the affinity was not restored");
        })
        .join()
        .unwrap();
    }

    /// The CPUs the calling thread may run on.
    #[cfg(any(target_os = "linux", target_os = "android"))]
    fn affinity() -> Vec<usize> {
        let size = std::mem::size_of::<libc::cpu_set_t>();
        // SAFETY: a plain bitmask the kernel fills, `size` bytes of it.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            assert_eq!(libc::sched_getaffinity(0, size, &mut set), 0);
            (0..libc::CPU_SETSIZE as usize)
                .filter(|&c| libc::CPU_ISSET(c, &set))
                .collect()
        }
    }

    fn lock_vec<T>(m: &Mutex<Vec<T>>) -> MutexGuard<'_, Vec<T>> {
        m.lock().unwrap()
    }

    /// Whether a fresh thread may pin itself to `cpu` (the check the pool's
    /// result is compared with).
    fn pin_current_thread_probe(cpu: usize) -> bool {
        std::thread::spawn(move || pin_current_thread(cpu))
            .join()
            .unwrap_or(false)
    }

    #[test]
    fn pool_runs_every_worker_once_per_call_and_borrows() {
        let pool = ThreadPool::new(3);
        assert_eq!(pool.threads(), 3);
        let hits: Vec<AtomicUsize> = (0..3).map(|_| AtomicUsize::new(0)).collect();
        for _ in 0..100 {
            pool.run(&|w| {
                hits[w].fetch_add(1, Ordering::Relaxed);
            });
        }
        for h in &hits {
            assert_eq!(h.load(Ordering::Relaxed), 100);
        }
    }

    /// Calls whose workers are asleep (each after more than the spin) are
    /// where the caller takes shares: every share still runs exactly once
    /// a call, whoever runs it, and on its own index.
    #[test]
    fn every_share_runs_once_when_the_caller_takes_some() {
        let pool = ThreadPool::new(3);
        let by_caller = AtomicUsize::new(0);
        for call in 0..200 {
            let hits: Vec<AtomicUsize> = (0..3).map(|_| AtomicUsize::new(0)).collect();
            pool.run(&|w| {
                hits[w].fetch_add(1, Ordering::Relaxed);
                let on_worker = std::thread::current()
                    .name()
                    .is_some_and(|n| n.starts_with("tessera-"));
                if w > 0 && !on_worker {
                    by_caller.fetch_add(1, Ordering::Relaxed);
                }
            });
            for h in &hits {
                assert_eq!(h.load(Ordering::Relaxed), 1, "call {call}");
            }
            if call % 4 == 0 {
                std::thread::sleep(SPIN * 2);
            }
        }
        eprintln!(
            "{} of 400 worker shares ran on the caller",
            by_caller.load(Ordering::Relaxed)
        );
    }

    #[test]
    fn a_panicking_job_is_reported_and_the_pool_survives() {
        let pool = ThreadPool::new(2);
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool.run(&|w| {
                if w == 1 {
                    panic!("boom");
                }
            })
        }));
        assert!(r.is_err());
        let count = AtomicUsize::new(0);
        pool.run(&|_| {
            count.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(count.load(Ordering::Relaxed), 2);
    }
}
