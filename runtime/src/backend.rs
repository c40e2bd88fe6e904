//! The device: which backend runs the kernels, its thread pool, the tuning
//! record it dispatches by, and every kernel it has prepared (each JITted or
//! mapped once, then shared by every layer that needs it).
//!
//! Plans ([`crate::dispatch::ShapePlan`]) come from the record's entry for
//! this device fingerprint, this generator ([`current_generator`]), this
//! backend and format; a refused or absent record falls back to the solver's
//! optimum per variant and says why through `tracing` (warn level).

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Mutex};

use crate::kv_append::AppendKernel;
use tessera_codegen::artifact::{MachineCode, PrefillBlocks};
use tessera_codegen::host::{HostMatmul, HostTile};
use tessera_codegen::host_attention::HostAttention;
use tessera_dsl::ir::{Kernel, Variant};
use tessera_dsl::library;

use crate::device::Fingerprint;
#[cfg(feature = "jit")]
use crate::dispatch::representative_m;
use crate::dispatch::{
    CUDA_DEFAULT_BREAKPOINTS, DEFAULT_M1, DEFAULT_M2, FlatStep, PlanSource, ShapePlan, VariantPlan,
    flat_steps_for,
};
use crate::error::RuntimeError;
use crate::format::WeightFormat;
use crate::pool::ThreadPool;
use crate::prebuilt::PrebuiltSet;
use crate::record::{GeneratorId, TuningRecord};

/// Where kernels run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Backend {
    /// x86-64 AVX2/FMA machine code (`x86-avx2`).
    HostX86,
    /// The portable cranelift JIT (x86-64 or aarch64).
    HostClif,
    /// aarch64 NEON machine code (dotprod / i8mm / fp16 as detected).
    Neon,
    OpenCl,
    Cuda,
}

impl Backend {
    pub const ALL: [Backend; 5] = [
        Backend::HostX86,
        Backend::HostClif,
        Backend::Neon,
        Backend::OpenCl,
        Backend::Cuda,
    ];

    /// The backend name tuning records use.
    pub fn record_name(self) -> &'static str {
        match self {
            Backend::HostX86 => "x86",
            Backend::HostClif => "host",
            Backend::Neon => "neon",
            Backend::OpenCl => "opencl",
            Backend::Cuda => "cuda",
        }
    }

    /// The fastest host backend this machine runs: x86 AVX2, else NEON,
    /// else cranelift.
    pub fn best_host() -> Backend {
        #[cfg(feature = "jit")]
        {
            if tessera_codegen::x86::missing_features().is_empty() {
                return Backend::HostX86;
            }
            if tessera_codegen::neon::NeonBackend::detect().is_some() {
                return Backend::Neon;
            }
        }
        #[cfg(not(feature = "jit"))]
        {
            if cfg!(target_arch = "aarch64") {
                return Backend::Neon;
            }
            if cfg!(target_arch = "x86_64") {
                return Backend::HostX86;
            }
        }
        Backend::HostClif
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.record_name())
    }
}

impl FromStr for Backend {
    type Err = RuntimeError;
    fn from_str(s: &str) -> Result<Backend, RuntimeError> {
        Backend::ALL
            .into_iter()
            .find(|b| b.record_name() == s)
            .ok_or_else(|| RuntimeError::Unavailable {
                backend: s.to_string(),
                why: "unknown backend; valid: x86, host, neon, opencl, cuda".into(),
            })
    }
}

/// How to open a [`Device`].
#[derive(Clone, Debug, Default)]
pub struct DeviceOptions {
    /// Worker threads including the caller (default: available parallelism).
    pub threads: Option<usize>,
    /// The autotuner's record; absent or refused → solver defaults.
    pub record: Option<TuningRecord>,
    /// Prebuilt machine code; required without the `jit` feature, and used
    /// instead of the JIT when given.
    pub prebuilt: Option<PrebuiltSet>,
    /// The device to match records against (default: [`Fingerprint::detect`],
    /// plus the GPU a GPU backend opened).
    pub fingerprint: Option<Fingerprint>,
    /// Where the OpenCL backend keeps compiled program binaries (default:
    /// `$TESSERA_OPENCL_CACHE`, else no cache).
    pub gpu_cache_dir: Option<std::path::PathBuf>,
    /// Keep the x86 backend on its AVX2 kernels where AVX-512 exists: to
    /// compare the two on one machine, or to run what a fleet without
    /// AVX-512 runs.
    pub x86_avx2_only: bool,
    /// Hold one packed copy of each `Linear`'s weights instead of one per
    /// distinct packing (up to three: GEMV, flat GEMM, GEMM): the GEMV and
    /// flat GEMM take tiles of the GEMM's packing. Memory is a model's
    /// size once, for devices where three copies do not fit (phones), at
    /// some speed at small M (see docs/PERFORMANCE.md). A record's GEMV or
    /// flat winner of another packing gives way to the solver's best tile
    /// of the GEMM's (`tessera-autotune --one-weight-copy` measures those).
    pub one_weight_copy: bool,
}

/// This build's generator id (records and prebuilt sets must match it).
pub fn current_generator() -> GeneratorId {
    GeneratorId {
        version: tessera_codegen::GENERATOR_VERSION.to_string(),
        template_hash: tessera_codegen::TEMPLATE_HASH.to_string(),
    }
}

/// What produces machine code.
enum Engine {
    #[cfg(feature = "jit")]
    X86(tessera_codegen::x86::X86Backend),
    #[cfg(feature = "jit")]
    Clif,
    #[cfg(feature = "jit")]
    Neon(tessera_codegen::neon::NeonBackend),
    Prebuilt(PrebuiltSet),
    #[cfg(feature = "opencl")]
    OpenCl(opencl::ClEngine),
    #[cfg(feature = "cuda")]
    Cuda(cuda::CudaEngine),
}

/// Kernel name, variant, tile and the target asked for first (None: the
/// first target that has the tile's shape).
type MatmulKey = (String, Variant, [u32; 3], Option<String>);

/// An open backend with its pool and prepared kernels.
pub struct Device {
    backend: Backend,
    engine: Engine,
    /// The cranelift backend (host matmuls on `HostClif`, and decode
    /// attention on every JIT host backend), created on first use.
    #[cfg(feature = "jit")]
    clif: Mutex<Option<Arc<tessera_codegen::clif::ClifBackend>>>,
    pool: ThreadPool,
    /// The work-split weight of each worker (see [`Device::core_weights`]).
    core_weights: Vec<f64>,
    fingerprint: Fingerprint,
    generator: GeneratorId,
    record: Option<TuningRecord>,
    matmuls: Mutex<BTreeMap<MatmulKey, Arc<HostMatmul>>>,
    attentions: Mutex<BTreeMap<String, Arc<HostAttention>>>,
    /// [`DeviceOptions::one_weight_copy`].
    one_weight_copy: bool,
    /// The NEON emitter's KV append per cache kernel (JIT NEON only).
    #[cfg(feature = "jit")]
    kv_appends: Mutex<BTreeMap<String, Arc<AppendKernel>>>,
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Device")
            .field("backend", &self.backend)
            .field("threads", &self.pool.threads())
            .field("record", &self.record.is_some())
            .finish()
    }
}

fn unavailable(backend: Backend, why: impl Into<String>) -> RuntimeError {
    RuntimeError::Unavailable {
        backend: backend.record_name().to_string(),
        why: why.into(),
    }
}

/// The pool and its work-split weights: the record's per-CPU weights for
/// this device and backend (any format) when it has one per thread; where
/// they differ, workers pinned to their CPUs (the caller and unpinned
/// workers get the smallest weight).
fn pool_for(
    record: Option<&TuningRecord>,
    fingerprint: &Fingerprint,
    generator: &GeneratorId,
    backend: Backend,
    threads: usize,
) -> (ThreadPool, Vec<f64>) {
    let per_cpu = record.and_then(|record| {
        WeightFormat::ALL.iter().find_map(|format| {
            record
                .select(fingerprint, generator, backend.record_name(), format.name())
                .ok()
                .filter(|entry| entry.core_weights.len() >= threads)
                .map(|entry| entry.core_weights[..threads].to_vec())
        })
    });
    match per_cpu {
        Some(w) if w.iter().any(|&x| x != w[0]) => {
            let cpus: Vec<usize> = (0..threads).collect();
            let pool = ThreadPool::pinned(threads, &cpus);
            let smallest = w.iter().copied().fold(f64::INFINITY, f64::min);
            let split = pool
                .worker_cpus()
                .iter()
                .map(|cpu| cpu.map_or(smallest, |c| w[c]))
                .collect();
            (pool, split)
        }
        Some(w) => (ThreadPool::new(threads), w),
        None => (ThreadPool::new(threads), vec![1.0; threads]),
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Device {
    /// Open `backend`, or say why it is not available here.
    pub fn open(backend: Backend, options: DeviceOptions) -> Result<Device, RuntimeError> {
        let generator = current_generator();
        let prebuilt = match options.prebuilt {
            Some(set) if set.generator != generator => {
                return Err(unavailable(
                    backend,
                    format!(
                        "the prebuilt kernels were made by generator {} ({}), this is {} ({})",
                        set.generator.version,
                        set.generator.template_hash,
                        generator.version,
                        generator.template_hash
                    ),
                ));
            }
            other => other,
        };
        let (engine, gpu): (Engine, Option<crate::device::GpuInfo>) = match (backend, prebuilt) {
            (Backend::OpenCl, prebuilt) => {
                #[cfg(feature = "opencl")]
                {
                    let e = opencl::ClEngine::open(prebuilt, options.gpu_cache_dir.as_deref())?;
                    let info = e.gpu_info();
                    (Engine::OpenCl(e), Some(info))
                }
                #[cfg(not(feature = "opencl"))]
                {
                    let _ = prebuilt;
                    return Err(unavailable(
                        backend,
                        "this build has no OpenCL backend (the `opencl` feature adds it)",
                    ));
                }
            }
            (Backend::Cuda, _) => {
                #[cfg(feature = "cuda")]
                {
                    let e = cuda::CudaEngine::open()?;
                    let info = e.gpu_info();
                    (Engine::Cuda(e), Some(info))
                }
                #[cfg(not(feature = "cuda"))]
                {
                    return Err(unavailable(
                        backend,
                        "this build has no CUDA backend (the `cuda` feature adds it)",
                    ));
                }
            }
            (_, Some(set)) => (Engine::Prebuilt(set), None),
            (_, None) => (jit_engine(backend, options.x86_avx2_only)?, None),
        };
        if let Some(record) = &options.record {
            record.validate("the record in DeviceOptions")?;
        }
        // A GPU backend's host side does not split work: one thread unless asked.
        let default_threads = if gpu.is_some() {
            1
        } else {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        };
        let threads = options.threads.unwrap_or(default_threads).max(1);
        let fingerprint = options.fingerprint.unwrap_or_else(|| {
            let fp = Fingerprint::detect();
            match gpu {
                Some(g) => fp.with_gpu(g),
                None => fp,
            }
        });
        #[cfg(feature = "jit")]
        let engine = with_recorded_prefetch(
            engine,
            options.record.as_ref(),
            &fingerprint,
            &generator,
            backend,
        );
        let (pool, core_weights) = pool_for(
            options.record.as_ref(),
            &fingerprint,
            &generator,
            backend,
            threads,
        );
        Ok(Device {
            backend,
            engine,
            #[cfg(feature = "jit")]
            clif: Mutex::new(None),
            pool,
            core_weights,
            fingerprint,
            generator,
            record: options.record,
            matmuls: Mutex::new(BTreeMap::new()),
            attentions: Mutex::new(BTreeMap::new()),
            #[cfg(feature = "jit")]
            kv_appends: Mutex::new(BTreeMap::new()),
            one_weight_copy: options.one_weight_copy,
        })
    }

    /// The best host backend ([`Backend::best_host`]).
    pub fn host(options: DeviceOptions) -> Result<Device, RuntimeError> {
        Device::open(Backend::best_host(), options)
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    pub fn threads(&self) -> usize {
        self.pool.threads()
    }

    pub fn fingerprint(&self) -> &Fingerprint {
        &self.fingerprint
    }

    pub fn generator(&self) -> &GeneratorId {
        &self.generator
    }

    pub(crate) fn pool(&self) -> &ThreadPool {
        &self.pool
    }

    /// Relative throughput per worker (MNN-LLM 5.2), the work split's
    /// weights: from the record's per-CPU weights for this device and
    /// backend (any format), else equal. Where they differ (big.LITTLE),
    /// worker i is pinned to CPU i and takes CPU i's weight; the calling
    /// thread, never pinned, and any worker the OS would not pin take the
    /// smallest weight — they may run on the slowest core.
    pub fn core_weights(&self) -> Vec<f64> {
        self.core_weights.clone()
    }

    /// The CPU each worker is pinned to (index 0, the calling thread, and
    /// every worker on a machine whose record has equal weights: None).
    pub fn worker_cpus(&self) -> Vec<Option<usize>> {
        self.pool.worker_cpus()
    }

    /// Number of distinct matmul kernels prepared so far.
    pub fn prepared_kernels(&self) -> usize {
        match &self.engine {
            #[cfg(feature = "opencl")]
            Engine::OpenCl(e) => e.prepared_matmuls(),
            #[cfg(feature = "cuda")]
            Engine::Cuda(e) => e.prepared_matmuls(),
            _ => lock(&self.matmuls).len(),
        }
    }

    /// Whether kernels run on a GPU (OpenCL, CUDA) rather than this CPU.
    pub fn is_gpu(&self) -> bool {
        matches!(self.backend, Backend::OpenCl | Backend::Cuda)
    }

    /// Plan and prepare (JIT or map) every kernel a model's weight shapes
    /// need, once: what an engine calls at start-up.
    pub fn prepare(
        &self,
        format: WeightFormat,
        shapes: &[(usize, usize)],
    ) -> Result<Vec<ShapePlan>, RuntimeError> {
        #[cfg(feature = "jit")]
        self.precompile_clif(format, shapes);
        shapes
            .iter()
            .map(|&(n, k)| match &self.engine {
                #[cfg(feature = "opencl")]
                Engine::OpenCl(_) => self.plan_shape_cl(format, n, k).map(|(plan, _)| plan),
                #[cfg(feature = "cuda")]
                Engine::Cuda(_) => self.plan_shape_cuda(format, n, k).map(|(plan, _)| plan),
                _ => self.plan_shape(format, n, k).map(|(plan, _)| plan),
            })
            .collect()
    }

    /// The dispatch plan of [n, k] and its three host kernels (shared when
    /// variants share a tile and code).
    pub(crate) fn plan_shape(
        &self,
        format: WeightFormat,
        n: usize,
        k: usize,
    ) -> Result<(ShapePlan, [Arc<HostMatmul>; 3]), RuntimeError> {
        self.host_only("a host matmul")?;
        let kernel = self.host_kernel(format)?;
        let (mut plan, mut kernels) = self.plan_with(
            &kernel,
            format,
            n,
            k,
            &|variant, tile| self.matmul(&kernel, variant, tile, n, k),
            &|variant| self.default_matmul(&kernel, variant, n, k),
        )?;
        if self.one_weight_copy {
            self.share_gemm_packing(&kernel, n, k, &mut plan, &mut kernels)?;
        }
        Ok((plan, kernels))
    }

    /// [`DeviceOptions::one_weight_copy`]: the GEMV and flat GEMM move to
    /// the GEMM's packing (hp, lp). Each takes its own loop's best tile of
    /// that packing, else the flat loop's (fewest rows first for the GEMV),
    /// else the GEMM's tile itself: any of them computes any M. A flat
    /// tile of one row is passed over: it would read the weights once per
    /// row, where the GEMM's tile reads them once per ep rows.
    fn share_gemm_packing(
        &self,
        kernel: &Kernel,
        n: usize,
        k: usize,
        plan: &mut ShapePlan,
        kernels: &mut [Arc<HostMatmul>; 3],
    ) -> Result<(), RuntimeError> {
        let gemm = plan.variants[2].tile;
        let packs_like_gemm = |t: &[u32; 3]| t[1..] == gemm[1..];
        let mut moved = false;
        let mut flat_on_gemm = false;
        for variant in [Variant::Gemv, Variant::FlatGemm] {
            let i = crate::dispatch::variant_index(variant);
            if packs_like_gemm(&plan.variants[i].tile) {
                continue;
            }
            let mut found = None;
            'loops: for loop_variant in [variant, Variant::FlatGemm] {
                let mut tiles: Vec<[u32; 3]> = self
                    .candidate_tiles(kernel, loop_variant, n, k)?
                    .into_iter()
                    .filter(|t| packs_like_gemm(t) && (variant == Variant::Gemv || t[0] > 1))
                    .collect();
                if variant == Variant::Gemv && loop_variant != variant {
                    tiles.sort_by_key(|t| t[0]);
                }
                for tile in tiles {
                    if let Ok(code) = self.matmul(kernel, loop_variant, tile, n, k) {
                        found = Some((tile, code));
                        break 'loops;
                    }
                }
            }
            let (tile, code) = found.unwrap_or_else(|| {
                flat_on_gemm |= variant == Variant::FlatGemm;
                (gemm, Arc::clone(&kernels[2]))
            });
            tracing::debug!(
                variant = %variant,
                from = ?plan.variants[i].tile,
                to = ?tile,
                "one weight copy: the GEMM's packing"
            );
            plan.variants[i] = crate::dispatch::VariantPlan {
                variant,
                tile,
                kernel: kernel.name.clone(),
                from_record: false,
            };
            kernels[i] = code;
            moved = true;
        }
        if moved {
            // The GEMM kernel serving the flat range serves all of it.
            plan.flat_steps = if flat_on_gemm {
                Vec::new()
            } else {
                self.flat_steps(kernel, None, &plan.variants, plan.m1, plan.m2)
            };
        }
        Ok(())
    }

    /// The kernel of one flat step ([`ShapePlan::flat_steps`]) of [n, k],
    /// prepared once per device; `Linear` asks on the first call at an M
    /// the step serves, so start-up JITs only the three variants' kernels.
    pub(crate) fn flat_step_matmul(
        &self,
        format: WeightFormat,
        tile: [u32; 3],
        target: Option<&str>,
        n: usize,
        k: usize,
    ) -> Result<Arc<HostMatmul>, RuntimeError> {
        self.host_only("a host matmul")?;
        let kernel = self.host_kernel(format)?;
        self.matmul_on(&kernel, Variant::FlatGemm, tile, target, n, k)
    }

    /// The dispatch plan of [n, k]: breakpoints and winners from the record
    /// when it matches this device, generator, backend, format and shape,
    /// else the solver defaults (and `tracing` says why). `winner` prepares
    /// a record's tile (a failure falls back to `default`, with a warning);
    /// `default` prepares the solver's best tile the backend can build.
    pub(crate) fn plan_with<K: Clone>(
        &self,
        kernel: &Kernel,
        format: WeightFormat,
        n: usize,
        k: usize,
        winner: &dyn Fn(Variant, [u32; 3]) -> Result<K, RuntimeError>,
        default: &dyn Fn(Variant) -> Result<([u32; 3], K), RuntimeError>,
    ) -> Result<(ShapePlan, [K; 3]), RuntimeError> {
        if n == 0 || k == 0 {
            return Err(crate::error::shape(
                "weight shape [n, k]",
                "n, k ≥ 1",
                format!("[{n}, {k}]"),
            ));
        }
        let core_weights = self.core_weights.clone();
        let mut shape_entry = None;
        let mut stand_in = false;
        let why = match &self.record {
            None => "no tuning record was given".to_string(),
            Some(record) => match record.select_shape(
                &self.fingerprint,
                &self.generator,
                self.backend.record_name(),
                format.name(),
                n,
                k,
            ) {
                Err(e) => e.to_string(),
                Ok(m) if m.entry.m1 <= m.entry.m2 => {
                    if !m.exact {
                        tracing::info!(
                            backend = %self.backend,
                            format = %format,
                            n, k,
                            "the record has no shape [{n}, {k}]; using the plan measured at [{}, {}]",
                            m.entry.n, m.entry.k
                        );
                    }
                    shape_entry = Some(m.entry);
                    stand_in = !m.exact;
                    String::new()
                }
                Ok(m) => format!("its breakpoints m1={} > m2={}", m.entry.m1, m.entry.m2),
            },
        };
        let (default_m1, default_m2) = match self.backend {
            Backend::Cuda => CUDA_DEFAULT_BREAKPOINTS,
            _ => (DEFAULT_M1, DEFAULT_M2),
        };
        if shape_entry.is_none() {
            tracing::warn!(
                backend = %self.backend,
                format = %format,
                n, k,
                "not using a tuning record ({why}); using defaults m1={default_m1} m2={default_m2}"
            );
        }
        let mut plans = Vec::with_capacity(3);
        let mut kernels = Vec::with_capacity(3);
        for variant in Variant::ALL {
            let mut chosen = None;
            if let Some(w) = shape_entry.and_then(|s| s.winner(variant)) {
                match winner(variant, w.tile) {
                    Ok(code) => {
                        chosen = Some((
                            VariantPlan {
                                variant,
                                tile: w.tile,
                                kernel: w.kernel.clone(),
                                from_record: true,
                            },
                            code,
                        ));
                    }
                    Err(e) => tracing::warn!(
                        variant = %variant,
                        tile = ?w.tile,
                        "the record's winner cannot be prepared ({e}); using the solver default"
                    ),
                }
            }
            let (plan, code) = match chosen {
                Some(c) => c,
                None => {
                    let (tile, code) = default(variant)?;
                    (
                        VariantPlan {
                            variant,
                            tile,
                            kernel: kernel.name.clone(),
                            from_record: false,
                        },
                        code,
                    )
                }
            };
            plans.push(plan);
            kernels.push(code);
        }
        let (m1, m2, source) = match shape_entry {
            Some(s) if stand_in => (
                s.m1,
                s.m2,
                PlanSource::NearestRecordShape { n: s.n, k: s.k },
            ),
            Some(s) => (s.m1, s.m2, PlanSource::Record),
            None => (default_m1, default_m2, PlanSource::Defaults { why }),
        };
        let flat_steps = self.flat_steps(kernel, shape_entry, &plans, m1, m2);
        let plan = ShapePlan {
            n,
            k,
            m1,
            m2,
            variants: [plans[0].clone(), plans[1].clone(), plans[2].clone()],
            flat_steps,
            source,
            core_weights,
        };
        tracing::debug!("dispatch {plan}");
        Ok((
            plan,
            [kernels[0].clone(), kernels[1].clone(), kernels[2].clone()],
        ))
    }

    /// Per-M flat tiles on a host backend ([`flat_steps_for`]: a step may
    /// pack like any of the three `variants`, whose packed copies a
    /// `Linear` holds); GPU flat tiles are not per-M.
    fn flat_steps(
        &self,
        kernel: &Kernel,
        shape_entry: Option<&crate::record::ShapeEntry>,
        variants: &[VariantPlan],
        m1: usize,
        m2: usize,
    ) -> Vec<FlatStep> {
        if self.is_gpu() {
            return Vec::new();
        }
        let flat = &variants[crate::dispatch::variant_index(Variant::FlatGemm)];
        let held: Vec<[u32; 3]> = variants.iter().map(|v| v.tile).collect();
        let unit = self.row_unit(kernel);
        let mut steps = flat_steps_for(
            shape_entry,
            flat.tile,
            flat.from_record,
            (m1, m2),
            unit,
            &held,
        );
        // A prebuilt set serves only the steps it holds: a missing step
        // runs the set's smallest tile of the step's packing with at least
        // its rows, else the flat tile.
        // (Without `jit`, prebuilt is the only host engine.)
        #[allow(irrefutable_let_patterns)]
        if let Engine::Prebuilt(set) = &self.engine {
            let tiles = set.matmul_tiles(&kernel.name, Variant::FlatGemm);
            for s in &mut steps {
                if !tiles.contains(&s.tile) {
                    s.tile = tiles
                        .iter()
                        .filter(|t| t[1..] == s.tile[1..] && t[0] >= s.tile[0])
                        .min_by_key(|t| t[0])
                        .copied()
                        .unwrap_or(flat.tile);
                }
            }
            steps.dedup_by(|later, earlier| later.tile == earlier.tile);
        }
        steps
    }

    /// Rows of one accumulator unit of `kernel`'s MAC on this backend
    /// ([`tessera_codegen::row_unit`]); 1 where no solver target is known
    /// (prebuilt sets, whose own tiles say which steps exist).
    fn row_unit(&self, kernel: &Kernel) -> u32 {
        #[cfg(feature = "jit")]
        if let Ok(caps) = self.caps(kernel, Variant::FlatGemm) {
            return tessera_codegen::row_unit(caps, kernel);
        }
        let _ = kernel;
        1
    }

    #[cfg(any(feature = "opencl", feature = "cuda"))]
    fn not_host(&self) -> RuntimeError {
        RuntimeError::Unsupported {
            backend: self.backend.to_string(),
            what: "host machine code".into(),
        }
    }

    /// `format`'s library kernel with the weight layout this device's
    /// code reads: on NEON (JIT, or a prebuilt set of aarch64 code) `u4sym`
    /// codes stored signed ([`tessera_codegen::signed_codes::with_signed_codes`]),
    /// which the packer then writes; elsewhere the library's own.
    fn host_kernel(&self, format: WeightFormat) -> Result<Kernel, RuntimeError> {
        let kernel = library::get(format.library_kernel())?;
        let neon = match &self.engine {
            #[cfg(feature = "jit")]
            Engine::Neon(_) => true,
            Engine::Prebuilt(set) => set
                .kernels
                .iter()
                .any(|k| k.code.arch == tessera_codegen::artifact::Arch::Aarch64),
            #[allow(unreachable_patterns)]
            _ => false,
        };
        if !neon {
            return Ok(kernel);
        }
        tessera_codegen::signed_codes::with_signed_codes(&kernel).map_err(|e| {
            RuntimeError::NoKernel {
                what: kernel.name.clone(),
                why: e.to_string(),
            }
        })
    }

    /// `Err` on a GPU device (the host kernels' paths are for CPUs).
    fn host_only(&self, what: &str) -> Result<(), RuntimeError> {
        if self.is_gpu() {
            return Err(RuntimeError::Unsupported {
                backend: self.backend.to_string(),
                what: what.to_string(),
            });
        }
        Ok(())
    }

    /// The kernel of `variant` at `tile`, prepared once per device, on the
    /// first target that has a tile of that shape.
    fn matmul(
        &self,
        kernel: &Kernel,
        variant: Variant,
        tile: [u32; 3],
        n: usize,
        k: usize,
    ) -> Result<Arc<HostMatmul>, RuntimeError> {
        self.matmul_on(kernel, variant, tile, None, n, k)
    }

    /// [`Self::matmul`] on `target` first where it has the tile (a record
    /// names the target it timed a tile on).
    fn matmul_on(
        &self,
        kernel: &Kernel,
        variant: Variant,
        tile: [u32; 3],
        target: Option<&str>,
        n: usize,
        k: usize,
    ) -> Result<Arc<HostMatmul>, RuntimeError> {
        let key = (
            kernel.name.clone(),
            variant,
            tile,
            target.map(str::to_string),
        );
        if let Some(code) = lock(&self.matmuls).get(&key) {
            return Ok(Arc::clone(code));
        }
        let code = Arc::new(self.load_matmul(kernel, variant, tile, target, n, k)?);
        lock(&self.matmuls).insert(key, Arc::clone(&code));
        Ok(code)
    }

    /// The solver's best tile for `variant` that this backend can emit (or,
    /// prebuilt, the first tile the set has).
    fn default_matmul(
        &self,
        kernel: &Kernel,
        variant: Variant,
        n: usize,
        k: usize,
    ) -> Result<([u32; 3], Arc<HostMatmul>), RuntimeError> {
        let tiles = self.candidate_tiles(kernel, variant, n, k)?;
        let mut last = format!("no {} tile for this backend", kernel.name);
        for tile in tiles {
            match self.matmul(kernel, variant, tile, n, k) {
                Ok(code) => return Ok((tile, code)),
                Err(e) => last = e.to_string(),
            }
        }
        Err(RuntimeError::NoKernel {
            what: format!("{} {variant} [{n}, {k}] on {}", kernel.name, self.backend),
            why: last,
        })
    }

    /// The tiles a default for `variant` is chosen from, best first: the
    /// solver's ranking, or the tiles a prebuilt set has.
    fn candidate_tiles(
        &self,
        kernel: &Kernel,
        variant: Variant,
        n: usize,
        k: usize,
    ) -> Result<Vec<[u32; 3]>, RuntimeError> {
        #[cfg(not(feature = "jit"))]
        let _ = (n, k);
        Ok(match &self.engine {
            Engine::Prebuilt(set) => set.matmul_tiles(&kernel.name, variant),
            #[cfg(feature = "opencl")]
            Engine::OpenCl(_) => return Err(self.not_host()),
            #[cfg(feature = "cuda")]
            Engine::Cuda(_) => return Err(self.not_host()),
            #[cfg(feature = "jit")]
            _ => self
                .solver_tiles(kernel, variant, n, k)?
                .iter()
                .map(|t| [t.ep, t.hp, t.lp])
                .collect(),
        })
    }

    /// Emit (or find prebuilt) and map one matmul instance.
    fn load_matmul(
        &self,
        kernel: &Kernel,
        variant: Variant,
        tile: [u32; 3],
        target: Option<&str>,
        n: usize,
        k: usize,
    ) -> Result<HostMatmul, RuntimeError> {
        #[cfg(not(feature = "jit"))]
        let _ = (n, k, target);
        let host_tile = HostTile {
            ep: tile[0] as usize,
            hp: tile[1] as usize,
            lp: tile[2] as usize,
        };
        match &self.engine {
            Engine::Prebuilt(set) => {
                let p = set.matmul(&kernel.name, variant, tile).ok_or_else(|| {
                    RuntimeError::NoKernel {
                        what: format!("{} {variant} tile {tile:?}", kernel.name),
                        why: "not in the prebuilt set".into(),
                    }
                })?;
                Ok(HostMatmul::new(
                    kernel,
                    host_tile,
                    p.quantizer.as_ref(),
                    &p.code,
                )?)
            }
            #[cfg(feature = "opencl")]
            Engine::OpenCl(_) => Err(self.not_host()),
            #[cfg(feature = "cuda")]
            Engine::Cuda(_) => Err(self.not_host()),
            #[cfg(feature = "jit")]
            _ => {
                let (code, quantizer) = self.emit_matmul(kernel, variant, tile, target, n, k)?;
                Ok(HostMatmul::new(
                    kernel,
                    host_tile,
                    quantizer.as_ref(),
                    &code,
                )?)
            }
        }
    }

    /// A mapped decode attention kernel (`attention-decode-f16`,
    /// `attention-decode-kv8`) for head dim `d`, prepared once: on x86 the
    /// x86 emitter's where `d` is a multiple of its 8 lanes, else
    /// cranelift's.
    pub(crate) fn attention(
        &self,
        name: &str,
        d: usize,
    ) -> Result<Arc<HostAttention>, RuntimeError> {
        self.attention_in(name, d, PrefillBlocks::DEFAULT, false, false, false)
    }

    /// The decode kernel of cache `format` for `hq` query heads over `kvh`
    /// KV heads of `d` ([`Device::attention`]): fp8 values by f32 FMAs
    /// where the record measured that faster than the packed form for this
    /// grouping ([`Device::fp8_values_packed`]); f16 values have one form.
    /// int8 keys in lanes or in pairs, and q as int8 blocks or i16 for the
    /// lanes, as the record measured ([`Device::int8_keys_in_lanes`],
    /// [`Device::int8_q_in_lanes`]).
    pub(crate) fn decode_attention(
        &self,
        format: crate::attention::KvFormat,
        hq: usize,
        kvh: usize,
        d: usize,
    ) -> Result<Arc<HostAttention>, RuntimeError> {
        let fp8_values = format.value_format() == tessera_dsl::ir::Format::Fp8E4M3;
        let by_fma =
            fp8_values && self.x86_has_packed_fp8_values() && !self.fp8_values_packed(hq, kvh, d);
        let int8_keys = format.key_format() != tessera_dsl::ir::Format::F16;
        let key_pairs =
            int8_keys && self.x86_has_int8_key_lanes() && !self.int8_keys_in_lanes(hq, kvh, d);
        let int8_q = int8_keys && self.int8_q_in_lanes(hq, kvh, d);
        self.attention_in(
            format.kernel_name(),
            d,
            PrefillBlocks::DEFAULT,
            by_fma,
            key_pairs,
            int8_q,
        )
    }

    /// How this device's matmuls of `stream` prefetch their weights: on
    /// the x86 JIT device, the record's measurement or the default; None
    /// elsewhere (no such choice).
    #[cfg(feature = "jit")]
    pub fn weight_prefetch(
        &self,
        stream: tessera_codegen::x86::WeightStream,
    ) -> Option<tessera_codegen::x86::WeightPrefetch> {
        match &self.engine {
            Engine::X86(b) => Some(b.weight_prefetch(stream)),
            _ => None,
        }
    }

    /// Whether this device's decode attention multiplies fp8 values in the
    /// CPU's packed form (f16 FMAs with AVX512-FP16, else bf16 dots) for
    /// `hq` query heads over `kvh` KV heads of `d`: on the x86 JIT device
    /// with either feature, unless the record measured f32 FMAs faster
    /// here; never elsewhere.
    pub fn fp8_values_packed(&self, hq: usize, kvh: usize, d: usize) -> bool {
        self.x86_has_packed_fp8_values()
            && self
                .record
                .as_ref()
                .and_then(|r| {
                    r.fp8_values_packed(
                        &self.fingerprint,
                        &self.generator,
                        self.backend.record_name(),
                        hq,
                        kvh,
                        d,
                    )
                })
                .unwrap_or(true)
    }

    /// The packed form of fp8 values' P·V this device has
    /// ([`tessera_codegen::x86::X86Backend::packed_fp8_form`]): `f16 FMAs`
    /// or `bf16 dots` on the x86 JIT device of a CPU with AVX512-FP16 or
    /// AVX512_BF16; None elsewhere.
    pub fn packed_fp8_form(&self) -> Option<&'static str> {
        #[cfg(feature = "jit")]
        if let Engine::X86(b) = &self.engine {
            return b.packed_fp8_form();
        }
        None
    }

    /// The most this device's decode attention moves o by rounding p in
    /// the P·V of fp8 values for `hq` query heads over `kvh` KV heads of
    /// `d`, as a fraction of the largest |v| it weighs: on the x86 device
    /// 2^-8 with bf16 dots and 2^-11 with f16 FMAs where it takes the
    /// packed form ([`Self::fp8_values_packed`]), else 0.
    pub fn fp8_p_rounding(&self, hq: usize, kvh: usize, d: usize) -> f32 {
        #[cfg(feature = "jit")]
        if let Engine::X86(b) = &self.engine {
            let packed = self.fp8_values_packed(hq, kvh, d);
            return b.with_fp8_values_packed(packed).fp8_p_rounding();
        }
        let _ = (hq, kvh, d);
        0.0
    }

    /// How the decode attention scores the int8 keys of `hq` query heads
    /// over `kvh` KV heads of `d` on the x86 JIT device, the record's form
    /// ([`tessera_codegen::x86::X86Backend::int8_key_form`]: `AMX
    /// tdpbssd`, `zmm vpdpbusd, keys in lanes`, `zmm vpdpwssd`, ...); None
    /// elsewhere.
    pub fn int8_key_form(&self, hq: usize, kvh: usize, d: usize) -> Option<&'static str> {
        #[cfg(feature = "jit")]
        if let Engine::X86(b) = &self.engine {
            let lanes = self.int8_keys_in_lanes(hq, kvh, d);
            let group = hq.checked_div(kvh).unwrap_or(1);
            let form = b
                .with_int8_keys_in_lanes(lanes)
                .with_int8_q_in_lanes(self.int8_q_in_lanes(hq, kvh, d));
            return Some(form.int8_key_form(group));
        }
        let _ = (hq, kvh, d);
        None
    }

    /// Whether this device's decode attention scores the int8 keys of
    /// `hq` query heads over `kvh` KV heads of `d` with a key in each lane
    /// ([`tessera_codegen::x86::X86Backend::with_int8_keys_in_lanes`]): on
    /// the x86 JIT device with AVX512-VNNI and no AMX, unless the record
    /// measured the pair loop faster here; never elsewhere.
    pub fn int8_keys_in_lanes(&self, hq: usize, kvh: usize, d: usize) -> bool {
        #[cfg(feature = "jit")]
        if let Engine::X86(b) = &self.engine {
            return b.has_int8_key_lanes()
                && self
                    .record
                    .as_ref()
                    .and_then(|r| {
                        r.int8_keys_in_lanes(
                            &self.fingerprint,
                            &self.generator,
                            self.backend.record_name(),
                            hq,
                            kvh,
                            d,
                        )
                    })
                    .unwrap_or(true);
        }
        let _ = (hq, kvh, d);
        false
    }

    /// Whether this device's decode attention takes q as int8 in 32-d
    /// blocks for the int8 keys it scores in lanes
    /// ([`tessera_codegen::x86::X86Backend::with_int8_q_in_lanes`]): only
    /// where it scores them in lanes ([`Self::int8_keys_in_lanes`]) and
    /// the record measured int8 q faster for this grouping; never
    /// elsewhere (an accuracy trade no default makes).
    pub fn int8_q_in_lanes(&self, hq: usize, kvh: usize, d: usize) -> bool {
        #[cfg(feature = "jit")]
        if matches!(self.engine, Engine::X86(_)) {
            return self.int8_keys_in_lanes(hq, kvh, d)
                && self.record.as_ref().is_some_and(|r| {
                    r.int8_q_in_lanes(
                        &self.fingerprint,
                        &self.generator,
                        self.backend.record_name(),
                        hq,
                        kvh,
                        d,
                    ) == Some(true)
                });
        }
        let _ = (hq, kvh, d);
        false
    }

    /// The most this device's decode attention moves each element of q by
    /// rounding it, as a fraction of the largest |q| of its 32-d block,
    /// for `hq` query heads over `kvh` KV heads of `d`: 1/254 where it
    /// takes q as int8 ([`Self::int8_q_in_lanes`]), else 0.
    pub fn q_int8_rounding(&self, hq: usize, kvh: usize, d: usize) -> f32 {
        #[cfg(feature = "jit")]
        if let Engine::X86(b) = &self.engine {
            return b
                .with_int8_keys_in_lanes(self.int8_keys_in_lanes(hq, kvh, d))
                .with_int8_q_in_lanes(self.int8_q_in_lanes(hq, kvh, d))
                .q_int8_rounding();
        }
        let _ = (hq, kvh, d);
        0.0
    }

    /// The x86 JIT device on a CPU whose decode attention may score int8
    /// keys in lanes.
    fn x86_has_int8_key_lanes(&self) -> bool {
        #[cfg(feature = "jit")]
        if let Engine::X86(b) = &self.engine {
            return b.has_int8_key_lanes();
        }
        false
    }

    /// The x86 JIT device on a CPU whose decode attention may take fp8
    /// values in a packed form.
    fn x86_has_packed_fp8_values(&self) -> bool {
        self.packed_fp8_form().is_some()
    }

    /// [`Device::attention`] with a prefill kernel's flash loop in `blocks`
    /// (JIT devices; a prebuilt set's code has its own) and, on x86, fp8
    /// values by f32 FMAs where `fp8_values_by_fma` (not the packed form),
    /// int8 keys two at a time along d where `int8_key_pairs` (not in
    /// lanes) and q as int8 blocks for the keys in lanes where `int8_q`.
    fn attention_in(
        &self,
        name: &str,
        d: usize,
        blocks: PrefillBlocks,
        fp8_values_by_fma: bool,
        int8_key_pairs: bool,
        int8_q: bool,
    ) -> Result<Arc<HostAttention>, RuntimeError> {
        self.host_only("a host attention kernel")?;
        #[cfg(feature = "jit")]
        let x86 = matches!(self.engine, Engine::X86(_))
            && d.is_multiple_of(tessera_codegen::x86::attention::HEAD_DIM_MULTIPLE);
        #[cfg(not(feature = "jit"))]
        let x86 = {
            let _ = d;
            false
        };
        let mut key = if x86 {
            format!("{name} x86")
        } else {
            name.to_string()
        };
        if blocks != PrefillBlocks::DEFAULT {
            key = format!("{key} {blocks}");
        }
        if fp8_values_by_fma {
            key = format!("{key} fp8-values-by-fma");
        }
        if int8_key_pairs {
            key = format!("{key} int8-key-pairs");
        }
        if int8_q {
            key = format!("{key} int8-q");
        }
        if let Some(code) = lock(&self.attentions).get(&key) {
            return Ok(Arc::clone(code));
        }
        let kernel = library::get(name)?;
        #[cfg(feature = "jit")]
        if let (true, Engine::X86(backend)) = (x86, &self.engine) {
            let code = backend
                .with_fp8_values_packed(!fp8_values_by_fma)
                .with_int8_keys_in_lanes(!int8_key_pairs)
                .with_int8_q_in_lanes(int8_q)
                .attention(&kernel, blocks)
                .map_err(|e| RuntimeError::NoKernel {
                    what: name.to_string(),
                    why: e.to_string(),
                })?;
            let code = Arc::new(HostAttention::new(&kernel, &code)?);
            lock(&self.attentions).insert(key, Arc::clone(&code));
            return Ok(code);
        }
        let code: MachineCode = match &self.engine {
            Engine::Prebuilt(set) => {
                set.attention(name).map(|p| p.code.clone()).ok_or_else(|| {
                    RuntimeError::NoKernel {
                        what: name.to_string(),
                        why: "not in the prebuilt set".into(),
                    }
                })?
            }
            #[cfg(feature = "opencl")]
            Engine::OpenCl(_) => return Err(self.not_host()),
            #[cfg(feature = "cuda")]
            Engine::Cuda(_) => return Err(self.not_host()),
            #[cfg(feature = "jit")]
            _ => self.emit_attention(&kernel, blocks)?,
        };
        let code = Arc::new(HostAttention::new(&kernel, &code)?);
        lock(&self.attentions).insert(key, Arc::clone(&code));
        Ok(code)
    }

    /// The whole-prefill kernel `name` (`attention-prefill-f16`,
    /// `attention-prefill-kv8`) for `hq` query heads over `kvh` KV heads of
    /// head dim `d` (the record's blocks for them), mapped once, where this
    /// device has one: the x86 JIT device with `d` a multiple of 8, the
    /// NEON JIT device with `d` a multiple of 4, a prebuilt set that ships
    /// one (`tessera-kernels-gen` does for x86 and NEON) for a `d` its code
    /// takes. `None` elsewhere (prefill then runs the decode kernel per
    /// token).
    pub(crate) fn prefill_attention(
        &self,
        name: &str,
        hq: usize,
        kvh: usize,
        d: usize,
    ) -> Result<Option<Arc<HostAttention>>, RuntimeError> {
        // Only a JIT device picks blocks by the heads.
        #[cfg(not(feature = "jit"))]
        let _ = (hq, kvh);
        // The engines that can have one; the code itself says whether it
        // is a whole prefill and which head dims it takes.
        let code = match &self.engine {
            Engine::Prebuilt(set) if set.attention(name).is_some() => self.attention(name, d)?,
            #[cfg(feature = "jit")]
            Engine::X86(_) | Engine::Neon(_) => self.attention_in(
                name,
                d,
                self.prefill_blocks(hq, kvh, d),
                false,
                false,
                false,
            )?,
            _ => return Ok(None),
        };
        Ok((code.whole_prefill() && code.takes_head_dim(d)).then_some(code))
    }

    /// The blocks a JIT device emits its prefill in for `hq` query heads
    /// over `kvh` KV heads of head dim `d`: the record's, measured on this
    /// device by the autotuner ([`TuningRecord::prefill_blocks`]), else the
    /// default.
    #[cfg(feature = "jit")]
    fn prefill_blocks(&self, hq: usize, kvh: usize, d: usize) -> PrefillBlocks {
        self.record
            .as_ref()
            .and_then(|r| {
                r.prefill_blocks(
                    &self.fingerprint,
                    &self.generator,
                    self.backend.record_name(),
                    hq,
                    kvh,
                    d,
                )
            })
            .map_or(PrefillBlocks::DEFAULT, |[rows, keys]| PrefillBlocks {
                rows,
                keys,
            })
    }

    /// The KV append kernel for the caches of attention kernel `name`, on
    /// the JIT NEON device: the NEON emitter's, mapped once. `None`
    /// elsewhere (prebuilt sets ship none; other backends have no append
    /// emitter): there the host encoder writes the same bytes.
    pub(crate) fn kv_append(&self, name: &str) -> Result<Option<Arc<AppendKernel>>, RuntimeError> {
        #[cfg(feature = "jit")]
        if let Engine::Neon(neon) = &self.engine {
            if let Some(append) = lock(&self.kv_appends).get(name) {
                return Ok(Some(Arc::clone(append)));
            }
            let kernel = library::get(name)?;
            let no_kernel = |e: &dyn fmt::Display| RuntimeError::NoKernel {
                what: format!("{name} KV append"),
                why: e.to_string(),
            };
            let code = tessera_codegen::neon::attention_append::emit(neon.caps(), &kernel)
                .map_err(|e| no_kernel(&e))?;
            let append =
                AppendKernel::new(neon.caps(), &kernel, &code).map_err(|e| no_kernel(&e))?;
            let append = Arc::new(append);
            lock(&self.kv_appends).insert(name.to_string(), Arc::clone(&append));
            return Ok(Some(append));
        }
        let _ = name;
        Ok(None)
    }
}

#[cfg(not(feature = "jit"))]
fn jit_engine(backend: Backend, _x86_avx2_only: bool) -> Result<Engine, RuntimeError> {
    Err(unavailable(
        backend,
        "this build has no JIT (the `jit` feature); open it with prebuilt kernels",
    ))
}

/// The x86 JIT engine with each weight stream prefetched as `record`
/// measured fastest on this device ([`TuningRecord::weight_prefetch`]);
/// other engines, or streams no entry measured, unchanged.
#[cfg(feature = "jit")]
fn with_recorded_prefetch(
    engine: Engine,
    record: Option<&TuningRecord>,
    fingerprint: &Fingerprint,
    generator: &GeneratorId,
    backend: Backend,
) -> Engine {
    use tessera_codegen::x86::WeightStream;
    let (Engine::X86(x86), Some(record)) = (&engine, record) else {
        return engine;
    };
    let mut x86 = *x86;
    for stream in [WeightStream::Int8, WeightStream::Float] {
        let Some(choice) =
            record.weight_prefetch(fingerprint, generator, backend.record_name(), stream.name())
        else {
            continue;
        };
        match choice.to_x86() {
            Ok(prefetch) => x86 = x86.with_weight_prefetch(stream, prefetch),
            Err(why) => tracing::warn!(
                stream = stream.name(),
                "not using the record's weight prefetch ({why}); using the default"
            ),
        }
    }
    Engine::X86(x86)
}

#[cfg(feature = "jit")]
fn jit_engine(backend: Backend, x86_avx2_only: bool) -> Result<Engine, RuntimeError> {
    use tessera_codegen::neon::NeonBackend;
    use tessera_codegen::x86::X86Backend;
    match backend {
        Backend::HostX86 => X86Backend::detect()
            .map(|b| {
                Engine::X86(X86Backend {
                    avx512: b.avx512 && !x86_avx2_only,
                    avx512_vnni: b.avx512_vnni && !x86_avx2_only,
                    avx512_bf16: b.avx512_bf16 && !x86_avx2_only,
                    avx512_fp16: b.avx512_fp16 && !x86_avx2_only,
                    amx: b.amx && !x86_avx2_only,
                    ..b
                })
            })
            .map_err(|e| unavailable(backend, e.to_string())),
        Backend::HostClif => tessera_codegen::clif::ClifBackend::host()
            .map(|_| Engine::Clif)
            .map_err(|e| unavailable(backend, e.to_string())),
        Backend::Neon => NeonBackend::detect().map(Engine::Neon).ok_or_else(|| {
            unavailable(
                backend,
                format!(
                    "NEON needs an aarch64 host; this is {}",
                    std::env::consts::ARCH
                ),
            )
        }),
        Backend::OpenCl | Backend::Cuda => Err(unavailable(backend, "not a host JIT backend")),
    }
}

#[cfg(feature = "cuda")]
mod cuda;
#[cfg(any(feature = "opencl", feature = "cuda"))]
mod gpu;
#[cfg(feature = "opencl")]
mod opencl;

#[cfg(feature = "jit")]
mod jit {
    //! Emitting kernels at device start (feature `jit`).

    use std::sync::Arc;

    use tessera_codegen::artifact::{Artifact, Backend as _, EmitError, MachineCode};
    use tessera_codegen::clif::ClifBackend;
    use tessera_codegen::target::TargetCaps;
    use tessera_codegen::tile::{self, Problem, TileConfig};
    use tessera_dsl::ir::{Format, Kernel, Variant};
    use tessera_dsl::library;

    use super::{Device, Engine, lock};
    use crate::error::RuntimeError;

    fn emit_err(what: &str, e: impl std::fmt::Display) -> RuntimeError {
        RuntimeError::NoKernel {
            what: what.to_string(),
            why: e.to_string(),
        }
    }

    fn machine(what: &str, a: Artifact) -> Result<MachineCode, RuntimeError> {
        match a {
            Artifact::Machine(code) => Ok(code),
            Artifact::Source { .. } => Err(emit_err(what, "the backend emitted source text")),
        }
    }

    /// The backend's own loop for `variant`, else its default loop (whose
    /// tile is what makes it that variant), as the autotuner times them.
    fn emit_variant(
        backend: &dyn tessera_codegen::artifact::Backend,
        kernel: &Kernel,
        tile: &TileConfig,
        variant: Variant,
    ) -> Result<Artifact, EmitError> {
        match backend.emit_variant(kernel, tile, variant) {
            Err(EmitError::Unsupported { .. }) if variant != Variant::Gemm => {
                backend.emit(kernel, tile)
            }
            other => other,
        }
    }

    impl Device {
        pub(super) fn clif(&self) -> Result<Arc<ClifBackend>, RuntimeError> {
            let mut slot = lock(&self.clif);
            if let Some(b) = slot.as_ref() {
                return Ok(Arc::clone(b));
            }
            let b = Arc::new(ClifBackend::host().map_err(|e| emit_err("cranelift backend", e))?);
            *slot = Some(Arc::clone(&b));
            Ok(b)
        }

        /// The target `kernel`'s tiles are solved on (x86: `x86-avx512`
        /// for f32 matmuls on an AVX-512 host, see `X86Backend::target`;
        /// NEON: the dotprod GEMV on i8mm, see `NeonBackend::target`).
        pub(super) fn caps(
            &self,
            kernel: &Kernel,
            variant: Variant,
        ) -> Result<&'static TargetCaps, RuntimeError> {
            match &self.engine {
                Engine::X86(b) => Ok(b.target(kernel, variant)),
                Engine::Clif => Ok(self.clif()?.caps()),
                Engine::Neon(b) => Ok(b.target(kernel, variant)),
                Engine::Prebuilt(_) => Err(emit_err("solver", "prebuilt kernels have no solver")),
                #[allow(unreachable_patterns)]
                _ => Err(emit_err("solver", "not a host JIT backend")),
            }
        }

        /// The solver's tiles for `kernel`'s `variant` on [n, k] (at the
        /// variant's representative M), best first.
        pub(super) fn solver_tiles(
            &self,
            kernel: &Kernel,
            variant: Variant,
            n: usize,
            k: usize,
        ) -> Result<Vec<TileConfig>, RuntimeError> {
            let caps = self.caps(kernel, variant)?;
            let problem = self.problem(caps, kernel, super::representative_m(variant), n, k)?;
            tile::solve(caps, &problem).map_err(|e| emit_err(&kernel.name, e))
        }

        fn problem(
            &self,
            caps: &TargetCaps,
            kernel: &Kernel,
            m: usize,
            n: usize,
            k: usize,
        ) -> Result<Problem, RuntimeError> {
            let base = Problem::from_kernel(caps, kernel).map_err(|e| emit_err(&kernel.name, e))?;
            Ok(Problem {
                e: m as u64,
                h: n as u64,
                l: k as u64,
                ..base
            })
        }

        /// The solver's configuration of exactly `tile` (its register
        /// accounting is what the emitters check their plans against).
        fn tile_config(
            &self,
            kernel: &Kernel,
            variant: Variant,
            tile: [u32; 3],
            target: Option<&str>,
            n: usize,
            k: usize,
        ) -> Result<TileConfig, RuntimeError> {
            let caps = self.caps(kernel, variant)?;
            // x86 with AVX-512 solves GEMM on x86-avx512 and the rest on
            // x86-avx2; a record's tile solved on the other x86 target
            // (an older record) still runs, on that target's kernel.
            let mut targets = vec![caps];
            if let Engine::X86(b) = &self.engine {
                let other = if caps.name == tessera_codegen::x86::NAME {
                    tessera_codegen::x86::AVX512_NAME
                } else {
                    tessera_codegen::x86::NAME
                };
                if b.avx512 {
                    targets.extend(TargetCaps::by_name(other).ok());
                }
                // A recorded target goes first: a 16-column int8 tile of
                // few rows exists on both, and the tuner timed one.
                if let Some(first) = targets.iter().position(|c| Some(c.name) == target) {
                    targets.swap(0, first);
                }
            }
            // NEON with i8mm solves the GEMV on aarch64-dotprod; a record's
            // i8mm GEMV tile (the tuner measures both) runs as well.
            if let Engine::Neon(b) = &self.engine
                && b.caps().name != caps.name
            {
                targets.push(b.caps());
            }
            let mut found = None;
            for caps in targets {
                let problem = self.problem(caps, kernel, super::representative_m(variant), n, k)?;
                found = tile::runnable(caps, &problem)
                    .map_err(|e| emit_err(&kernel.name, e))?
                    .into_iter()
                    .find(|t| [t.ep, t.hp, t.lp] == tile);
                if found.is_some() {
                    break;
                }
            }
            found.ok_or_else(|| {
                emit_err(
                    &format!("{} tile {tile:?}", kernel.name),
                    format!("not a feasible tile on {}", caps.name),
                )
            })
        }

        pub(super) fn emit_matmul(
            &self,
            kernel: &Kernel,
            variant: Variant,
            tile: [u32; 3],
            target: Option<&str>,
            n: usize,
            k: usize,
        ) -> Result<(MachineCode, Option<MachineCode>), RuntimeError> {
            let config = self.tile_config(kernel, variant, tile, target, n, k)?;
            let what = format!("{} {variant} tile {tile:?}", kernel.name);
            let err = |e: EmitError| emit_err(&what, e);
            let i8dyn = kernel
                .as_matmul()
                .and_then(|m| kernel.tensor(&m.x))
                .is_some_and(|t| t.format == Format::I8Dyn);
            match &self.engine {
                Engine::X86(b) => {
                    let code = machine(
                        &what,
                        emit_variant(b, kernel, &config, variant).map_err(err)?,
                    )?;
                    let q = b.emit_quantizer(kernel, &config).map_err(err)?;
                    Ok((code, q))
                }
                Engine::Clif => {
                    let b = self.clif()?;
                    let code = machine(
                        &what,
                        emit_variant(&*b, kernel, &config, variant).map_err(err)?,
                    )?;
                    let q = if i8dyn {
                        Some(b.emit_quantizer(kernel, &config).map_err(err)?)
                    } else {
                        None
                    };
                    Ok((code, q))
                }
                Engine::Neon(b) => {
                    let code = machine(
                        &what,
                        emit_variant(b, kernel, &config, variant).map_err(err)?,
                    )?;
                    let q = b.quantizer(kernel, &config).map_err(err)?;
                    Ok((code, q))
                }
                Engine::Prebuilt(_) => Err(emit_err(&what, "prebuilt device")),
                #[allow(unreachable_patterns)]
                _ => Err(emit_err(&what, "not a host JIT backend")),
            }
        }

        /// Cranelift only: compile the solver-default kernels of every
        /// shape and variant at once, in parallel over the cores
        /// ([`ClifBackend::emit_matmuls`]), into the kernel cache that
        /// `plan_shape` then reads. Anything that fails here is left to
        /// `plan_shape`, which reports it (or falls back to another tile).
        pub(super) fn precompile_clif(
            &self,
            format: crate::format::WeightFormat,
            shapes: &[(usize, usize)],
        ) {
            use tessera_codegen::clif::MatmulJob;
            use tessera_codegen::host::{HostMatmul, HostTile};
            // A tuning record names its own tiles; only the defaults are
            // known in advance.
            if !matches!(self.engine, Engine::Clif) || self.record.is_some() {
                return;
            }
            let (Ok(kernel), Ok(clif)) = (library::get(format.library_kernel()), self.clif())
            else {
                return;
            };
            let mut jobs: Vec<MatmulJob<'_>> = Vec::new();
            for &(n, k) in shapes {
                for variant in Variant::ALL {
                    let Some(tile) = self
                        .solver_tiles(&kernel, variant, n, k)
                        .ok()
                        .and_then(|t| t.first().copied())
                    else {
                        continue;
                    };
                    let key = (
                        kernel.name.clone(),
                        variant,
                        [tile.ep, tile.hp, tile.lp],
                        None,
                    );
                    let known = lock(&self.matmuls).contains_key(&key)
                        || jobs.iter().any(|j| {
                            j.variant == variant && [j.tile.ep, j.tile.hp, j.tile.lp] == key.2
                        });
                    if !known {
                        jobs.push(MatmulJob {
                            kernel: &kernel,
                            tile,
                            variant,
                        });
                    }
                }
            }
            let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
            let results = clif.emit_matmuls(&jobs, threads);
            for (job, result) in jobs.iter().zip(results) {
                let Ok(c) = result else { continue };
                let host_tile = HostTile::from(&job.tile);
                if let Ok(host) = HostMatmul::new(&kernel, host_tile, c.quantizer.as_ref(), &c.code)
                {
                    let key = (
                        kernel.name.clone(),
                        job.variant,
                        [job.tile.ep, job.tile.hp, job.tile.lp],
                        None,
                    );
                    lock(&self.matmuls).insert(key, Arc::new(host));
                }
            }
        }

        /// Decode attention: the NEON emitter's on a NEON device (the
        /// code the prebuilt NEON targets ship), cranelift's on the other
        /// JIT host backends (x86's own is chosen in `attention`, where
        /// the head dim suits it).
        pub(super) fn emit_attention(
            &self,
            kernel: &Kernel,
            blocks: tessera_codegen::artifact::PrefillBlocks,
        ) -> Result<MachineCode, RuntimeError> {
            if let Engine::Neon(neon) = &self.engine {
                return neon
                    .emit_attention_with(kernel, blocks)
                    .map_err(|e| emit_err(&kernel.name, e));
            }
            let clif = self.clif()?;
            // The attention emitter ignores the tile; any solver tile will do.
            let f32_kernel = library::get("matmul-f32")?;
            let tile = *clif
                .tiles(&f32_kernel)
                .map_err(|e| emit_err(&kernel.name, e))?
                .first()
                .ok_or_else(|| emit_err(&kernel.name, "no tile"))?;
            machine(
                &kernel.name,
                clif.emit(kernel, &tile)
                    .map_err(|e| emit_err(&kernel.name, e))?,
            )
        }
    }

    #[cfg(test)]
    mod tests {
        use super::super::{Backend, Device, DeviceOptions};
        use crate::format::WeightFormat;
        use tessera_dsl::ir::Variant;

        /// A 4-row, 16-column Q4_0 flat tile exists on both x86 targets
        /// with AVX-512: unnamed it is built on the first (ymm), named it
        /// is built on the target the record timed. SKIP without
        /// AVX512-VNNI (the zmm int8 kernel).
        #[test]
        fn a_named_target_goes_first() {
            use tessera_codegen::x86;
            if !(x86::missing_features().is_empty()
                && x86::host_has_avx512()
                && x86::host_has_avx512_vnni())
            {
                eprintln!("SKIP: no AVX512-VNNI");
                return;
            }
            let dev = Device::open(Backend::HostX86, DeviceOptions::default()).unwrap();
            let kernel = dev.host_kernel(WeightFormat::Q4_0).unwrap();
            let (tile, n, k) = ([4, 16, 4], 64, 256);
            let budget = |target| {
                dev.tile_config(&kernel, Variant::FlatGemm, tile, target, n, k)
                    .unwrap()
                    .accounting
                    .budget
            };
            assert_eq!(budget(None), 16);
            assert_eq!(budget(Some(x86::NAME)), 16);
            assert_eq!(budget(Some(x86::AVX512_NAME)), 32);
            // A target that has no such tile is passed over, not an error.
            assert_eq!(budget(Some("aarch64-i8mm")), 16);
        }
    }
}
