//! Tuning on an OpenCL device (PoCL on a CPU-only machine): the same
//! method as on the host, with the device's own pieces.
//!
//! - fingerprint: this machine's plus the OpenCL platform, device and
//!   driver (exactly what `Device::open(Backend::OpenCl)` matches records
//!   against);
//! - limits: a streaming-read kernel and an f32 `mad` kernel run on the
//!   device (`tessera_runtime::opencl::limits`);
//! - candidates: the solver's tiles for the `opencl-gpu` target, kept when
//!   the GPU planner accepts them;
//! - timing: programs built once (through the binary cache) and shared by
//!   every shape whose plan prints the same source; weights packed into
//!   the GPU layout and uploaded once per shape (one upload serves all
//!   three variants), with rotated copies beyond the last-level cache; a
//!   call is one launch on device-resident activations (no transfers),
//!   timed to the queue's finish.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use half::f16;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tessera_codegen::artifact::Variant;
use tessera_codegen::gpu;
use tessera_codegen::opencl::{self as cl_codegen, OpenClBackend};
use tessera_codegen::target::TargetCaps;
use tessera_codegen::tile::TileConfig;
use tessera_dsl::interp::Value;
use tessera_dsl::ir::{Format, Kernel};
use tessera_dsl::quant;
use tessera_runtime::device::{Fingerprint, fnv1a};
use tessera_runtime::opencl::{self, ClDevice, ClIo, ClMatmul, ClWeights, matmul_launch};
use tessera_runtime::record::Limits;

use crate::bench::{FLOP_CAP, WEIGHT_CAP, rotation_bytes};
use crate::tune::{Bench, BenchError, Candidate, ShapeSpec};

/// The OpenCL device and the kernel being tuned on it.
pub struct ClTarget {
    dev: ClDevice,
    kernel: Kernel,
    backend: OpenClBackend,
}

impl ClTarget {
    /// The first OpenCL device, or why there is none.
    pub fn unavailable_reason() -> Option<String> {
        ClDevice::first().err().map(|e| e.to_string())
    }

    /// Open the device for `library_kernel` (which must take f16
    /// activations: the GPU formats).
    pub fn open(library_kernel: &str) -> Result<ClTarget, String> {
        let kernel = tessera_dsl::library::get(library_kernel).map_err(|e| e.to_string())?;
        let x = kernel
            .as_matmul()
            .and_then(|m| kernel.tensor(&m.x))
            .map(|t| t.format);
        if x != Some(Format::F16) {
            return Err(format!(
                "{library_kernel} takes {} activations; the OpenCL matmuls take f16: use --format w4a16, w8a16, e0m4a16, q4_0a16, q4_1a16, q8_0a16 or f16",
                x.map_or("no".to_string(), |f| f.to_string())
            ));
        }
        let kernel = gpu::with_gpu_weight_layout(&kernel).map_err(|e| e.to_string())?;
        let dev = ClDevice::first().map_err(|e| e.to_string())?;
        let dev = dev.with_cache_dir(cache_dir());
        let backend = OpenClBackend::new(dev.fp16_mode());
        Ok(ClTarget {
            dev,
            kernel,
            backend,
        })
    }

    pub fn kernel(&self) -> &Kernel {
        &self.kernel
    }

    pub fn caps(&self) -> &'static TargetCaps {
        cl_codegen::caps()
    }

    pub fn device_name(&self) -> String {
        format!("{} ({})", self.dev.name, self.dev.platform)
    }

    /// Whether the GPU planner takes `tile` for some variant.
    pub fn accepts(&self, tile: &TileConfig) -> bool {
        Variant::ALL.iter().any(|&v| {
            gpu::plan_matmul(
                &self.kernel,
                tile,
                v,
                self.caps(),
                gpu::WeightMemory::Buffer,
            )
            .is_ok()
        })
    }

    /// Build the program of `tile` once, so a kernel the device cannot
    /// compile fails before the budget is spent.
    pub fn probe(&self, tile: &TileConfig) -> Result<(), String> {
        let program = self
            .backend
            .program(&self.kernel, tile, Variant::Gemm)
            .map_err(|e| e.to_string())?;
        ClMatmul::new(&self.dev, &program)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    /// This machine plus the OpenCL device.
    pub fn fingerprint(&self) -> Fingerprint {
        Fingerprint::detect().with_gpu(self.dev.gpu_info())
    }

    /// Read bandwidth and peak multiply-add rate measured on the device.
    pub fn limits(&self, llc_bytes: u64, quick: bool) -> Result<Limits, String> {
        let (bytes, runs) = if quick {
            (32 << 20, 3)
        } else {
            (rotation_bytes(llc_bytes), 7)
        };
        let read_gbps =
            opencl::limits::read_bandwidth(&self.dev, bytes, runs).map_err(|e| e.to_string())?;
        let mac_gops = opencl::limits::peak_mads(&self.dev, runs).map_err(|e| e.to_string())?;
        Ok(Limits {
            read_gbps,
            mac_gops,
        })
    }

    /// A bench timing candidates on this device. Large-M calls are timed on
    /// fewer channels so one call takes about 10 ms at the device's
    /// measured peak (`limits`), never more work than the host bench's cap.
    pub fn bench(
        &self,
        llc_bytes: u64,
        limits: &Limits,
        start: Instant,
        stop: Arc<AtomicBool>,
    ) -> ClBench<'_> {
        let flop_cap = if limits.mac_gops.is_finite() && limits.mac_gops > 0.0 {
            (limits.mac_gops * 2e9 * 0.01).clamp(1e6, FLOP_CAP)
        } else {
            FLOP_CAP
        };
        ClBench {
            target: self,
            flop_cap,
            rotate: rotation_bytes(llc_bytes),
            start,
            stop,
            rng: ChaCha8Rng::seed_from_u64(0x0c1_7e55),
            shape: None,
            programs: BTreeMap::new(),
            prepared: BTreeMap::new(),
            weights: BTreeMap::new(),
            next: 0,
            io: None,
        }
    }
}

/// `$TESSERA_OPENCL_CACHE`, else a directory in the system's temp dir, so
/// a second run (and the runtime, given the same directory) skips the
/// compiles.
fn cache_dir() -> std::path::PathBuf {
    std::env::var_os("TESSERA_OPENCL_CACHE")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("tessera-opencl-cache"))
}

/// Fewest output channels a large-M call is timed on: one 16-wide block
/// of the tiled kernels (a slow device at M = 4096 and K = 8960 still
/// takes about a second for 16 channels).
const MIN_ROWS: usize = 16;

struct ShapeData {
    n: usize,
    k: usize,
    base_rows: usize,
    source: Vec<f32>,
}

/// Times OpenCL candidates (see the module doc).
pub struct ClBench<'a> {
    target: &'a ClTarget,
    /// Most flops one timed call does.
    flop_cap: f64,
    rotate: usize,
    start: Instant,
    stop: Arc<AtomicBool>,
    rng: ChaCha8Rng,
    shape: Option<ShapeData>,
    /// Built programs by source hash (kept across shapes).
    programs: BTreeMap<u64, Arc<ClMatmul>>,
    /// Candidate → its program.
    prepared: BTreeMap<(u8, [u32; 3], u32), Arc<ClMatmul>>,
    /// Uploaded weights by row count (rotated copies for the full slice).
    weights: BTreeMap<usize, Vec<ClWeights>>,
    next: usize,
    /// Device-resident activations: (buffers, rows of e, channels).
    io: Option<(ClIo, usize, usize)>,
}

fn key(c: &Candidate) -> (u8, [u32; 3], u32) {
    c.key()
}

impl ClBench<'_> {
    fn err(e: impl std::fmt::Display) -> BenchError {
        BenchError(e.to_string())
    }

    fn shape_data(&mut self, shape: &ShapeSpec) {
        let fresh = !matches!(&self.shape, Some(s) if s.n == shape.n && s.k == shape.k);
        if fresh {
            self.prepared.clear();
            self.weights.clear();
            self.io = None;
            let base_rows = shape
                .n
                .min((WEIGHT_CAP / shape.k.max(1)).div_ceil(64) * 64)
                .max(shape.n.min(64));
            let source = (0..base_rows * shape.k)
                .map(|_| self.rng.gen_range(-1.0f32..1.0))
                .collect();
            self.shape = Some(ShapeData {
                n: shape.n,
                k: shape.k,
                base_rows,
                source,
            });
        }
    }

    /// Weights of the first `rows` channels, uploaded once (rotated copies
    /// of the full slice).
    fn ensure_weights(&mut self, rows: usize) -> Result<(), BenchError> {
        if self.weights.contains_key(&rows) {
            return Ok(());
        }
        let s = self.shape.as_ref().ok_or_else(|| Self::err("no shape"))?;
        let kernel = &self.target.kernel;
        let wf = kernel
            .as_matmul()
            .and_then(|m| kernel.tensor(&m.w))
            .map(|t| t.format)
            .ok_or_else(|| Self::err("kernel has no weights"))?;
        let src = &s.source[..rows * s.k];
        let value = if wf.is_quantized() {
            Value::Quant(quant::quantize(wf, rows, s.k, src).map_err(Self::err)?)
        } else {
            Value::F16(src.iter().map(|&v| f16::from_f32(v)).collect())
        };
        let bias = vec![0f32; rows];
        let first = ClWeights::upload(&self.target.dev, wf, &value, Some(&bias), rows, s.k)
            .map_err(Self::err)?;
        let copies = if rows == s.base_rows {
            self.rotate.div_ceil(first.bytes().max(1)).clamp(1, 64)
        } else {
            1
        };
        let mut all = vec![first];
        for _ in 1..copies {
            all.push(
                ClWeights::upload(&self.target.dev, wf, &value, Some(&bias), rows, s.k)
                    .map_err(Self::err)?,
            );
        }
        self.weights.insert(rows, all);
        Ok(())
    }

    fn ensure_io(&mut self, m: usize, rows: usize) -> Result<(), BenchError> {
        if matches!(&self.io, Some((_, e, h)) if *e >= m && *h >= rows) {
            return Ok(());
        }
        let k = self.shape.as_ref().map_or(0, |s| s.k);
        let (e, h) = match &self.io {
            Some((_, e, h)) => ((*e).max(m), (*h).max(rows)),
            None => (m, rows),
        };
        let x: Vec<f16> = (0..e * k)
            .map(|_| f16::from_f32(self.rng.gen_range(-1.0f32..1.0)))
            .collect();
        let io = ClIo::new(&self.target.dev, &x, e, h).map_err(Self::err)?;
        self.io = Some((io, e, h));
        Ok(())
    }
}

impl Bench for ClBench<'_> {
    fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    fn prepare(&mut self, shape: &ShapeSpec, cand: &Candidate) -> Result<(), BenchError> {
        self.shape_data(shape);
        if self.prepared.contains_key(&key(cand)) {
            return Ok(());
        }
        let program = self
            .target
            .backend
            .program(&self.target.kernel, &cand.tile, cand.variant)
            .map_err(Self::err)?;
        let hash = fnv1a(program.source().as_bytes());
        let built = match self.programs.get(&hash) {
            Some(p) => Arc::clone(p),
            None => {
                let p = Arc::new(ClMatmul::new(&self.target.dev, &program).map_err(Self::err)?);
                self.programs.insert(hash, Arc::clone(&p));
                p
            }
        };
        let base = self.shape.as_ref().map_or(0, |s| s.base_rows);
        self.ensure_weights(base)?;
        self.prepared.insert(key(cand), built);
        Ok(())
    }

    fn rows(&self, shape: &ShapeSpec, m: usize) -> usize {
        let Some(s) = &self.shape else {
            return shape.n;
        };
        let flops = 2.0 * (m * s.base_rows * s.k) as f64;
        if flops <= self.flop_cap {
            return s.base_rows;
        }
        let rows = (self.flop_cap / (2.0 * (m * s.k) as f64)) as usize;
        rows.div_ceil(MIN_ROWS)
            .saturating_mul(MIN_ROWS)
            .clamp(MIN_ROWS.min(s.base_rows), s.base_rows)
    }

    fn call(&mut self, shape: &ShapeSpec, cand: &Candidate, m: usize) -> Result<f64, BenchError> {
        let rows = self.rows(shape, m);
        self.ensure_weights(rows)?;
        self.ensure_io(m, rows)?;
        let program = self
            .prepared
            .get(&key(cand))
            .ok_or_else(|| Self::err("candidate not prepared"))?;
        let copies = &self.weights[&rows];
        let w = &copies[self.next % copies.len()];
        self.next = self.next.wrapping_add(1);
        let (io, _, _) = self.io.as_ref().ok_or_else(|| Self::err("no io"))?;
        let t0 = Instant::now();
        matmul_launch(&self.target.dev, program, w, io, m).map_err(Self::err)?;
        Ok(t0.elapsed().as_nanos() as f64)
    }

    fn release(&mut self, cand: &Candidate) {
        self.prepared.remove(&key(cand));
    }

    fn release_all(&mut self) {
        self.prepared.clear();
        self.weights.clear();
        self.io = None;
        self.shape = None;
    }

    fn interrupted(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}
