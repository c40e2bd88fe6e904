//! The cranelift kernels against the x86 JIT's, side by side in one run
//! (not a test): the host-backend targets want cranelift within 2× of x86 for f32 GEMM and
//! within 1.2× for GEMV. Each implementation gets the solver's tile for its
//! own target and the real M; the x86 side runs the variant the runtime
//! picks (GEMV at M = 1, flat GEMM up to 64, GEMM above).
//!
//! `cargo run --release -p tessera-codegen --example clif_timing`
//!
//! Environment (optional): `FORMATS=f32,f16,w8a8,w4a8`, `MS=1,512`,
//! `THREADS=1`, `N=4096`, `K=4096`, `ROUNDS=5`, `CLOCK=cpu`, `ROTATE_MIB=1024`.
//!
//! `CLOCK=cpu` (Linux, `THREADS=1` only: the call runs on this thread)
//! times each call by the thread's own CPU time instead of the wall clock,
//! so time the thread spends preempted by other processes on a loaded
//! machine does not count (cache and memory contention still do).
//!
//! Method: weights rotate through copies totalling ≥ `ROTATE_MIB` MiB per
//! implementation (default 1 GiB: more than the largest last-level cache
//! we run on, 480 MiB, so memory-bound calls stream from DRAM as in a
//! model's decode step; 256 MiB fit that cache and flattered GEMV); the two implementations alternate in rounds of ≥ 3
//! calls and ≥ 0.2 s each, and the figure is the median call over all
//! rounds, so a burst of load from other processes hits both alike. The
//! ratio is time(x86) / time(cranelift): above 0.5 meets "within 2×".

use std::time::{Duration, Instant};

use tessera_codegen::artifact::{Artifact, Backend, Variant};
use tessera_codegen::clif::ClifBackend;
use tessera_codegen::host::{HostInput, HostMatmul, HostOutput, HostTile, HostWeights, WeightsIn};
use tessera_codegen::tile::{Problem, TileConfig, solve};
use tessera_codegen::x86::{X86Backend, plan};

/// This thread's CPU time in ns: `clock_gettime(CLOCK_THREAD_CPUTIME_ID)`
/// (exact; `/proc/thread-self/schedstat` only advances at scheduler ticks
/// for a running thread, too coarse for a GEMV call of a few ms).
#[cfg(target_os = "linux")]
fn thread_cpu_ns() -> Option<u64> {
    #[repr(C)]
    struct Timespec {
        tv_sec: i64,
        tv_nsec: i64,
    }
    unsafe extern "C" {
        fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
    }
    const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
    let mut ts = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec (64-bit time_t and long on
    // the 64-bit Linux targets this example runs on).
    let r = unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    (r == 0).then(|| ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

#[cfg(not(target_os = "linux"))]
fn thread_cpu_ns() -> Option<u64> {
    None
}

/// Seconds since `start` on the chosen clock.
#[derive(Clone, Copy)]
enum Clock {
    Wall,
    ThreadCpu,
}

impl Clock {
    fn now(self) -> (Instant, u64) {
        let cpu = match self {
            Clock::Wall => 0,
            Clock::ThreadCpu => thread_cpu_ns().unwrap_or(0),
        };
        (Instant::now(), cpu)
    }

    fn since(self, (t, cpu): (Instant, u64)) -> f64 {
        match self {
            Clock::Wall => t.elapsed().as_secs_f64(),
            Clock::ThreadCpu => (thread_cpu_ns().unwrap_or(0) - cpu) as f64 * 1e-9,
        }
    }
}

fn env_list(name: &str, default: &str) -> Vec<String> {
    std::env::var(name)
        .unwrap_or_else(|_| default.into())
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn best_tile(
    caps: &tessera_codegen::target::TargetCaps,
    kernel: &tessera_dsl::Kernel,
    m: usize,
    n: usize,
    k: usize,
) -> TileConfig {
    let mut problem = Problem::from_kernel(caps, kernel).unwrap();
    (problem.e, problem.h, problem.l) = (m as u64, n as u64, k as u64);
    solve(caps, &problem).unwrap()[0]
}

/// One implementation under test: its mapped kernel and weight copies.
struct Side {
    name: &'static str,
    tile: TileConfig,
    host: HostMatmul,
    copies: Vec<HostWeights>,
    times: Vec<f64>,
}

impl Side {
    fn new(
        name: &'static str,
        tile: TileConfig,
        host: HostMatmul,
        w: &[f32],
        n: usize,
        k: usize,
    ) -> Side {
        let first = host.pack_weights(n, k, WeightsIn::F32(w)).unwrap();
        let bytes = first.codes.len() + 4 * first.params.len();
        let rotate = env_usize("ROTATE_MIB", 1024) << 20;
        let count = rotate.div_ceil(bytes).max(2);
        let copies = (0..count).map(|_| first.clone()).collect();
        Side {
            name,
            tile,
            host,
            copies,
            times: Vec::new(),
        }
    }

    /// One round: ≥ 3 calls and ≥ 0.2 s.
    #[allow(clippy::too_many_arguments)]
    fn round(
        &mut self,
        x: &[f32],
        xh: &[half::f16],
        m: usize,
        threads: usize,
        f16: bool,
        clock: Clock,
    ) {
        let n = self.copies[0].n;
        let bias = vec![0.0f32; n];
        let mut y = vec![0f32; m * n];
        let mut yh = vec![half::f16::ZERO; m * n];
        let start = Instant::now();
        let mut i = self.times.len();
        let mut calls = 0;
        while calls < 3 || start.elapsed() < Duration::from_millis(200) {
            let w = &self.copies[i % self.copies.len()];
            let input = if f16 {
                HostInput::F16(xh)
            } else {
                HostInput::F32(x)
            };
            let out = if f16 {
                HostOutput::F16(&mut yh)
            } else {
                HostOutput::F32(&mut y)
            };
            let t = clock.now();
            self.host
                .run(input, m, w, Some(&bias), out, threads)
                .unwrap();
            self.times.push(clock.since(t));
            i += 1;
            calls += 1;
        }
    }

    fn median(&self) -> f64 {
        let mut t = self.times.clone();
        t.sort_by(|a, b| a.total_cmp(b));
        t[t.len() / 2]
    }
}

fn main() {
    let x86 = X86Backend::detect().expect("this example needs AVX2, FMA and F16C");
    let clif = ClifBackend::host().expect("cranelift backend");
    let formats = env_list("FORMATS", "f32");
    let ms: Vec<usize> = env_list("MS", "1,512")
        .iter()
        .map(|s| s.parse().expect("MS: numbers"))
        .collect();
    let threads = env_usize("THREADS", 1);
    let rounds = env_usize("ROUNDS", 5);
    let (n, k) = (env_usize("N", 4096), env_usize("K", 4096));
    let clock = match std::env::var("CLOCK").as_deref() {
        Ok("cpu") if threads == 1 && thread_cpu_ns().is_some() => Clock::ThreadCpu,
        Ok("cpu") => panic!("CLOCK=cpu needs THREADS=1 on Linux"),
        _ => Clock::Wall,
    };
    let w: Vec<f32> = (0..n * k)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    let max_m = ms.iter().copied().max().unwrap_or(1);
    let x: Vec<f32> = (0..max_m * k)
        .map(|i| ((i * 104729) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    let xh: Vec<half::f16> = x.iter().map(|v| half::f16::from_f32(*v)).collect();
    let clock_name = match clock {
        Clock::Wall => "wall clock",
        Clock::ThreadCpu => "thread CPU time",
    };
    println!(
        "clif_timing: N={n} K={k}, {threads} thread(s), {rounds} alternating rounds, {clock_name}"
    );
    println!(
        "| format | M | x86 tile | x86 GFLOP/s | cranelift tile | cranelift GFLOP/s | x86 time / cranelift time |"
    );
    println!("|---|---|---|---|---|---|---|");
    for format in &formats {
        let kernel = tessera_dsl::library::get(&format!("matmul-{format}")).unwrap();
        let f16 = format == "f16";
        for &m in &ms {
            let variant = match m {
                1 => Variant::Gemv,
                2..=64 => Variant::FlatGemm,
                _ => Variant::Gemm,
            };
            let xt = best_tile(plan::target(), &kernel, m, n, k);
            let xhost = x86.load_variant(&kernel, &xt, variant).unwrap();
            let ct = best_tile(clif.caps(), &kernel, m, n, k);
            let Artifact::Machine(code) = clif.emit_variant(&kernel, &ct, variant).unwrap() else {
                unreachable!("cranelift emits machine code")
            };
            let q = if kernel.name.contains("a8") {
                Some(clif.emit_quantizer(&kernel, &ct).unwrap())
            } else {
                None
            };
            let chost = HostMatmul::new(&kernel, HostTile::from(&ct), q.as_ref(), &code).unwrap();
            let mut sides = vec![
                Side::new("x86", xt, xhost, &w, n, k),
                Side::new("cranelift", ct, chost, &w, n, k),
            ];
            // `EXTRA_TILE=EPxHP`: also time cranelift with that tile.
            if let Some((ep, hp)) = std::env::var("EXTRA_TILE").ok().and_then(|t| {
                let (a, b) = t.split_once('x')?;
                Some((a.parse::<u32>().ok()?, b.parse::<u32>().ok()?))
            }) {
                let mut et = ct;
                (et.ep, et.hp) = (ep, hp);
                let Artifact::Machine(code) = clif.emit_variant(&kernel, &et, variant).unwrap()
                else {
                    unreachable!("cranelift emits machine code")
                };
                let host =
                    HostMatmul::new(&kernel, HostTile::from(&et), q.as_ref(), &code).unwrap();
                sides.push(Side::new("cranelift-extra", et, host, &w, n, k));
            }
            for _ in 0..rounds {
                for s in sides.iter_mut() {
                    if std::env::var("ONLY").is_ok_and(|o| o != s.name) {
                        s.times = vec![1.0];
                        continue;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                    s.round(&x[..m * k], &xh[..m * k], m, threads, f16, clock);
                }
            }
            let gflops = |s: &Side| 2.0 * (m * n * k) as f64 / s.median() / 1e9;
            let tile = |s: &Side| format!("{}x{}x{}", s.tile.ep, s.tile.hp, s.tile.lp);
            for s in &sides[1..] {
                println!(
                    "| {format} | {m} | {} | {:.1} | {} | {:.1} | {:.2}× |",
                    tile(&sides[0]),
                    gflops(&sides[0]),
                    tile(s),
                    gflops(s),
                    sides[0].median() / s.median()
                );
            }
        }
    }
}
