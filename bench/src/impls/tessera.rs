//! Tessera's host kernels in the benchmark, called the way an inference
//! engine calls them: `tessera_runtime::Linear::forward` on a `Device`
//! (weights packed once per tile at `prepare`, dispatch by M, the runtime's
//! thread pool). No tuning record is loaded, so the runtime's solver
//! defaults choose the tiles and the M1/M2 switch points; run the autotuner
//! and compare to see what tuning adds.
//!
//! Names: `tessera-<backend>-<format>`, backend `x86` (the x86 JIT, with
//! its AVX-512 kernels where the CPU has them), `x86avx2` (the x86 JIT on
//! AVX2 only) or `host` (cranelift), format `f32`, `w8a8`, `w4a8` or ggml's
//! blocks `q4_0`, `q4_1`, `q8_0` (f16 group parameters). f16 is left out:
//! its library kernel takes f16 activations, which this harness does not
//! feed.

use std::sync::Arc;

use tessera_runtime::record::TuningRecord;
use tessera_runtime::{
    Backend, Device, DeviceOptions, Linear, PlanSource, WeightFormat as RtFormat, Weights,
};

use super::{MatmulImpl, check_len};
use crate::error::BenchError;
use crate::format::WeightFormat;

/// (name, backend, AVX2 only): `x86avx2` keeps the x86 backend off its
/// AVX-512 kernels, the x86 kernels the host-backend targets compare cranelift with.
const BACKENDS: [(&str, Backend, bool); 3] = [
    ("x86", Backend::HostX86, false),
    ("x86avx2", Backend::HostX86, true),
    ("host", Backend::HostClif, false),
];
const FORMATS: [(&str, RtFormat); 6] = [
    ("f32", RtFormat::F32),
    ("w8a8", RtFormat::W8A8),
    ("w4a8", RtFormat::W4A8),
    ("q4_0", RtFormat::Q4_0),
    ("q4_1", RtFormat::Q4_1),
    ("q8_0", RtFormat::Q8_0),
];

/// Names of the Tessera implementations available in this build.
pub fn names() -> Vec<String> {
    let mut out = Vec::new();
    for (b, _, _) in BACKENDS {
        for (f, _) in FORMATS {
            out.push(format!("tessera-{b}-{f}"));
        }
    }
    out
}

/// The Tessera implementation called `name`, dispatching by `record`
/// when given.
pub fn make(name: &str, record: Option<Arc<TuningRecord>>) -> Option<Box<dyn MatmulImpl>> {
    for (b, backend, avx2_only) in BACKENDS {
        for (f, format) in FORMATS {
            if name == format!("tessera-{b}-{f}") {
                return Some(Box::new(TesseraLinear {
                    name: name.to_string(),
                    backend,
                    avx2_only,
                    record: record.clone(),
                    format,
                    n: 0,
                    k: 0,
                    weights: Vec::new(),
                    copies: 0,
                    threads: 1,
                    linears: Vec::new(),
                }));
            }
        }
    }
    None
}

/// One `Linear` per weight copy, rebuilt when the thread count changes
/// (the device owns the pool).
struct TesseraLinear {
    name: String,
    backend: Backend,
    avx2_only: bool,
    record: Option<Arc<TuningRecord>>,
    format: RtFormat,
    n: usize,
    k: usize,
    weights: Vec<f32>,
    copies: usize,
    threads: usize,
    linears: Vec<Linear>,
}

impl TesseraLinear {
    fn err(&self, why: impl std::fmt::Display) -> BenchError {
        BenchError::Impl {
            name: self.name.clone(),
            why: why.to_string(),
        }
    }

    fn build(&mut self) -> Result<(), BenchError> {
        self.linears.clear();
        let options = DeviceOptions {
            threads: Some(self.threads),
            x86_avx2_only: self.avx2_only,
            record: self.record.as_deref().cloned(),
            ..DeviceOptions::default()
        };
        let device = Arc::new(Device::open(self.backend, options).map_err(|e| self.err(e))?);
        for _ in 0..self.copies {
            let linear = Linear::new(
                &device,
                self.format,
                Weights::F32(&self.weights),
                self.n,
                self.k,
                None,
            )
            .map_err(|e| self.err(e))?;
            if self.record.is_some() && self.linears.is_empty() {
                match &linear.plan().source {
                    PlanSource::Defaults { why } => eprintln!(
                        "  {} [{}, {}]: not using --record ({why}); solver defaults",
                        self.name, self.n, self.k
                    ),
                    PlanSource::NearestRecordShape { n, k } => eprintln!(
                        "  {} [{}, {}]: not in --record; its plan for [{n}, {k}] stands in",
                        self.name, self.n, self.k
                    ),
                    PlanSource::Record => {}
                }
            }
            self.linears.push(linear);
        }
        Ok(())
    }
}

impl MatmulImpl for TesseraLinear {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn weight_format(&self) -> WeightFormat {
        match self.format {
            RtFormat::W8A8 => WeightFormat::Int8 {
                // one f32 scale per row
                group: usize::MAX,
                param_bytes: 4,
            },
            RtFormat::W4A8 => WeightFormat::Int4 {
                // f32 scale and offset per group of 32
                group: 32,
                param_bytes: 8,
            },
            RtFormat::W8A16 => WeightFormat::Int8 {
                group: usize::MAX,
                param_bytes: 4,
            },
            // f32 scale and zero point per group of 32 (4-bit codes).
            RtFormat::W4A16 | RtFormat::E0M4A16 => WeightFormat::Int4 {
                group: 32,
                param_bytes: 8,
            },
            // One f16 scale per group of 32 (ggml Q4_0: 4.5 bits per weight).
            RtFormat::Q4_0 | RtFormat::Q4_0A16 => WeightFormat::Int4 {
                group: 32,
                param_bytes: 2,
            },
            // f16 scale and min per group of 32 (ggml Q4_1: 5 bits).
            RtFormat::Q4_1 | RtFormat::Q4_1A16 => WeightFormat::Int4 {
                group: 32,
                param_bytes: 4,
            },
            // One f16 scale per group of 32 (ggml Q8_0: 8.5 bits).
            RtFormat::Q8_0 | RtFormat::Q8_0A16 => WeightFormat::Int8 {
                group: 32,
                param_bytes: 2,
            },
            RtFormat::F16 => WeightFormat::F16,
            RtFormat::F32 => WeightFormat::F32,
        }
    }

    fn prepare(
        &mut self,
        n: usize,
        k: usize,
        weights: &[f32],
        copies: usize,
    ) -> Result<(), BenchError> {
        check_len(&self.name, "weights", weights.len(), n * k)?;
        self.n = n;
        self.k = k;
        self.weights = weights.to_vec();
        self.copies = copies.max(1);
        self.build()
    }

    fn set_threads(&mut self, threads: usize) -> Result<(), BenchError> {
        if threads.max(1) != self.threads || self.linears.is_empty() {
            self.threads = threads.max(1);
            if self.copies > 0 {
                self.build()?;
            }
        }
        Ok(())
    }

    fn run(&self, m: usize, x: &[f32], y: &mut [f32], copy: usize) {
        // The runtime checks every length; a failure here is a harness bug.
        if let Err(e) = self.linears[copy].forward_f32(x, m, y) {
            panic!("{}: {e}", self.name);
        }
    }

    fn release(&mut self) {
        self.linears.clear();
        self.weights = Vec::new();
    }
}
