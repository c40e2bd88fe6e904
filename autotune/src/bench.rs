//! Timing real kernels on this host (the method of `shared/PEERS.md`).
//!
//! - Weights are random, quantized and packed once per candidate, then
//!   copied so that the copies together exceed the last-level cache
//!   several times ([`rotation_bytes`]); calls rotate through them, so
//!   no call is served from cache (decode streams each weight from DRAM
//!   once per token, and so must the measurement).
//! - Calls are timed one by one (the driver takes the median and MAD).
//! - Threads come from a persistent pool ([`ThreadPool`], the runtime's):
//!   spawning and joining OS threads per call, as a plain
//!   [`HostMatmul::run`] does, adds tens of microseconds that vary from
//!   call to call on a VM — a large and noisy part of a 250 µs GEMV that
//!   the runtime never pays.
//! - Large shapes are timed on a slice of their output channels: at most
//!   [`WEIGHT_CAP`] weights for memory-bound calls, and at most
//!   [`FLOP_CAP`] flops per call for large M, never below a few panels
//!   per thread. Kernels split N into independent panels, so time scales
//!   with N; the driver scales the times back to the whole shape.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use half::f16;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tessera_codegen::host::{HostInput, HostMatmul, HostOutput, HostTile, HostWeights, WeightsIn};
use tessera_dsl::ir::{Format, Kernel};
use tessera_dsl::quant::{self, QuantTensor};
use tessera_runtime::pool::{ThreadPool, split_weighted};

use crate::backend::TuneBackend;
use crate::tune::{Bench, BenchError, Candidate, ShapeSpec};

/// Most weights a memory-bound call reads (a slice of larger shapes).
pub const WEIGHT_CAP: usize = 6 << 20;
/// Most flops a call does (large M is timed on fewer channels).
pub const FLOP_CAP: f64 = 1.5e9;

/// Bytes the rotated weight copies add up to: four times the last-level
/// cache, between 64 and 256 MiB.
pub fn rotation_bytes(llc_bytes: u64) -> usize {
    (llc_bytes.saturating_mul(4)).clamp(64 << 20, 256 << 20) as usize
}

struct Prepared {
    matmul: HostMatmul,
    copies: Vec<HostWeights>,
    next: usize,
    /// Weights for fewer rows (large M), by row count.
    slices: BTreeMap<usize, HostWeights>,
}

struct ShapeData {
    n: usize,
    k: usize,
    /// Rows timed for memory-bound calls.
    base_rows: usize,
    /// f32 weights [base_rows, k].
    source: Vec<f32>,
    quantized: Option<QuantTensor>,
}

/// Times candidates of one library kernel on a [`TuneBackend`].
pub struct HostBench<'a> {
    backend: &'a dyn TuneBackend,
    kernel: Kernel,
    x_format: Format,
    w_format: Format,
    y_format: Format,
    threads: usize,
    /// Workers of the timed calls (the runtime's pool: no spawn per call).
    pool: Arc<ThreadPool>,
    /// Channels per thread below which no slice goes (whole panels).
    min_rows: usize,
    /// At most this many workers per call ([`Bench::limit_workers`]).
    worker_limit: Option<usize>,
    rotate: usize,
    start: Instant,
    rng: ChaCha8Rng,
    shape: Option<ShapeData>,
    prepared: BTreeMap<(u8, [u32; 3], u32), Prepared>,
    x32: Vec<f32>,
    x16: Vec<f16>,
    y32: Vec<f32>,
    y16: Vec<f16>,
    stop: Arc<AtomicBool>,
}

fn key(c: &Candidate) -> (u8, [u32; 3], u32) {
    c.key()
}

impl<'a> HostBench<'a> {
    /// `start` is the budget's origin; `stop` is set by an interrupt handler.
    pub fn new(
        backend: &'a dyn TuneBackend,
        kernel: Kernel,
        threads: usize,
        llc_bytes: u64,
        start: Instant,
        stop: Arc<AtomicBool>,
    ) -> Result<HostBench<'a>, String> {
        let pool = Arc::new(ThreadPool::new(threads.max(1)));
        Self::with_pool(backend, kernel, llc_bytes, start, stop, pool)
    }

    /// [`Self::new`] on `pool`'s workers (its thread count): benches timed
    /// in turn share one pool, so no bench's idle workers spin beside
    /// another's calls.
    pub fn with_pool(
        backend: &'a dyn TuneBackend,
        kernel: Kernel,
        llc_bytes: u64,
        start: Instant,
        stop: Arc<AtomicBool>,
        pool: Arc<ThreadPool>,
    ) -> Result<HostBench<'a>, String> {
        let threads = pool.threads();
        let mm = kernel
            .as_matmul()
            .ok_or_else(|| format!("kernel `{}` is not a matmul", kernel.name))?;
        let fmt = |t: &str| {
            kernel
                .tensor(t)
                .map(|t| t.format)
                .ok_or_else(|| format!("kernel `{}` has no tensor `{t}`", kernel.name))
        };
        let (x_format, w_format, y_format) = (fmt(&mm.x)?, fmt(&mm.w)?, fmt(&mm.y)?);
        Ok(HostBench {
            backend,
            x_format,
            w_format,
            y_format,
            kernel,
            threads: threads.max(1),
            pool,
            min_rows: 64 * threads.max(1),
            worker_limit: None,
            rotate: rotation_bytes(llc_bytes),
            start,
            rng: ChaCha8Rng::seed_from_u64(0x7e55e7a),
            shape: None,
            prepared: BTreeMap::new(),
            x32: Vec::new(),
            x16: Vec::new(),
            y32: Vec::new(),
            y16: Vec::new(),
            stop,
        })
    }

    fn shape_data(&mut self, shape: &ShapeSpec) -> Result<&ShapeData, BenchError> {
        let fresh = !matches!(&self.shape, Some(s) if s.n == shape.n && s.k == shape.k);
        if fresh {
            self.prepared.clear();
            let base_rows = shape
                .n
                .min((WEIGHT_CAP / shape.k.max(1)).div_ceil(64) * 64)
                .max(shape.n.min(self.min_rows));
            let source: Vec<f32> = (0..base_rows * shape.k)
                .map(|_| self.rng.gen_range(-1.0f32..1.0))
                .collect();
            let quantized = if self.w_format.is_quantized() {
                Some(
                    quant::quantize(self.w_format, base_rows, shape.k, &source)
                        .map_err(|e| BenchError(e.to_string()))?,
                )
            } else {
                None
            };
            self.shape = Some(ShapeData {
                n: shape.n,
                k: shape.k,
                base_rows,
                source,
                quantized,
            });
        }
        Ok(self.shape.as_ref().expect("set above"))
    }

    fn pack(&self, tile: HostTile, rows: usize) -> Result<HostWeights, BenchError> {
        let s = self.shape.as_ref().ok_or(BenchError("no shape".into()))?;
        let w = if rows == s.base_rows {
            match &s.quantized {
                Some(q) => WeightsIn::Quant(q),
                None => WeightsIn::F32(&s.source),
            }
        } else {
            WeightsIn::F32(&s.source[..rows * s.k])
        };
        HostWeights::pack(&self.kernel, tile, rows, s.k, w).map_err(|e| BenchError(e.to_string()))
    }

    fn ensure_buffers(&mut self, m: usize, k: usize, rows: usize) {
        let (mk, mn) = (m * k, m * rows);
        match self.x_format {
            Format::F16 => {
                if self.x16.len() < mk {
                    let old = self.x16.len();
                    self.x16.resize(mk, f16::ZERO);
                    for v in &mut self.x16[old..] {
                        *v = f16::from_f32(self.rng.gen_range(-1.0f32..1.0));
                    }
                }
            }
            _ => {
                if self.x32.len() < mk {
                    let old = self.x32.len();
                    self.x32.resize(mk, 0.0);
                    for v in &mut self.x32[old..] {
                        *v = self.rng.gen_range(-1.0f32..1.0);
                    }
                }
            }
        }
        match self.y_format {
            Format::F16 => {
                if self.y16.len() < mn {
                    self.y16.resize(mn, f16::ZERO);
                }
            }
            _ => {
                if self.y32.len() < mn {
                    self.y32.resize(mn, 0.0);
                }
            }
        }
    }
}

impl Bench for HostBench<'_> {
    fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    fn limit_workers(&mut self, workers: Option<usize>) -> bool {
        self.worker_limit = workers;
        workers.is_some_and(|w| w < self.threads.min(self.pool.threads()))
    }

    fn prepare(&mut self, shape: &ShapeSpec, cand: &Candidate) -> Result<(), BenchError> {
        self.shape_data(shape)?;
        if self.prepared.contains_key(&key(cand)) {
            return Ok(());
        }
        if !self.backend.accepts(&self.kernel, &cand.tile) {
            return Err(BenchError(format!(
                "{} cannot index tile {:?} for {}",
                self.backend.kind(),
                cand.tile3(),
                self.kernel.name
            )));
        }
        let matmul = self
            .backend
            .load(&self.kernel, &cand.tile, cand.variant)
            .map_err(BenchError)?;
        let base_rows = self.shape.as_ref().map_or(0, |s| s.base_rows);
        let first = self.pack(matmul.tile(), base_rows)?;
        let bytes = (first.codes.len() + 4 * first.params.len()).max(1);
        let copies = self.rotate.div_ceil(bytes).clamp(1, 256);
        let mut all = Vec::with_capacity(copies);
        for _ in 1..copies {
            all.push(first.clone());
        }
        all.push(first);
        self.prepared.insert(
            key(cand),
            Prepared {
                matmul,
                copies: all,
                next: 0,
                slices: BTreeMap::new(),
            },
        );
        Ok(())
    }

    fn rows(&self, shape: &ShapeSpec, m: usize) -> usize {
        let Some(s) = &self.shape else {
            return shape.n;
        };
        let flops = 2.0 * (m * s.base_rows * s.k) as f64;
        if flops <= FLOP_CAP {
            return s.base_rows;
        }
        let rows = (FLOP_CAP / (2.0 * (m * s.k) as f64)) as usize;
        rows.div_ceil(64)
            .saturating_mul(64)
            .clamp(self.min_rows.min(s.base_rows), s.base_rows)
    }

    fn call(&mut self, shape: &ShapeSpec, cand: &Candidate, m: usize) -> Result<f64, BenchError> {
        let rows = self.rows(shape, m);
        let (k, base_rows) = match &self.shape {
            Some(s) => (s.k, s.base_rows),
            None => return Err(BenchError("no shape prepared".into())),
        };
        self.ensure_buffers(m, k, rows);
        let needs_slice = rows != base_rows
            && self
                .prepared
                .get(&key(cand))
                .is_some_and(|p| !p.slices.contains_key(&rows));
        if needs_slice {
            let tile = self.prepared[&key(cand)].matmul.tile();
            let w = self.pack(tile, rows)?;
            if let Some(p) = self.prepared.get_mut(&key(cand)) {
                p.slices.insert(rows, w);
            }
        }
        let p = self
            .prepared
            .get_mut(&key(cand))
            .ok_or_else(|| BenchError("candidate not prepared".into()))?;
        let w = if rows == base_rows {
            let i = p.next % p.copies.len();
            p.next = p.next.wrapping_add(1);
            &p.copies[i]
        } else {
            &p.slices[&rows]
        };
        let x = match self.x_format {
            Format::F16 => HostInput::F16(&self.x16[..m * k]),
            _ => HostInput::F32(&self.x32[..m * k]),
        };
        let y = match self.y_format {
            Format::F16 => HostOutput::F16(&mut self.y16[..m * rows]),
            _ => HostOutput::F32(&mut self.y32[..m * rows]),
        };
        let bias = self
            .kernel
            .as_matmul()
            .and_then(|mm| mm.epilogue.bias.as_ref())
            .map(|_| vec![0.0f32; rows]);
        // An even split of the hp panels over the pool's workers, as
        // `HostMatmul::run` splits them (the runtime weights it by core).
        let panels = w.n.div_ceil(p.matmul.tile().hp.max(1));
        let workers = self
            .threads
            .min(self.pool.threads())
            .min(self.worker_limit.unwrap_or(usize::MAX))
            .clamp(1, panels.max(1));
        let ranges = split_weighted(panels, &vec![1.0; workers]);
        let pool = &self.pool;
        let t0 = Instant::now();
        p.matmul
            .run_ranges(x, m, w, bias.as_deref(), y, &ranges, &|call| {
                pool.run(&|worker| call(worker));
            })
            .map_err(|e| BenchError(e.to_string()))?;
        Ok(t0.elapsed().as_nanos() as f64)
    }

    fn release(&mut self, cand: &Candidate) {
        self.prepared.remove(&key(cand));
    }

    fn release_all(&mut self) {
        self.prepared.clear();
        self.shape = None;
        self.x32 = Vec::new();
        self.x16 = Vec::new();
        self.y32 = Vec::new();
        self.y16 = Vec::new();
    }

    fn interrupted(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}
