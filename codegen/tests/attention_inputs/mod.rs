//! Random attention inputs shared by the attention tests: q, and the K and
//! V caches in a kernel's formats, both as the interpreter binds them and
//! as the host and GPU kernels read them.

#![allow(dead_code)]

use half::f16;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tessera_codegen::host_attention::KvCache;
use tessera_dsl::interp::Value;
use tessera_dsl::ir::{Format, Kernel};
use tessera_dsl::quant::{self, QuantTensor};

#[path = "../../../tests/src/guarded.rs"]
mod guarded;
use guarded::GuardedCache;

/// One cache (K or V) of `rows` rows of `d`.
pub struct Side {
    /// As the interpreter binds it.
    pub value: Value,
    quant: Option<QuantTensor>,
    half: Vec<f16>,
}

impl Side {
    /// As the GPU kernels read it: the codes' (or halves') bytes, and the
    /// per-row scales and offsets (empty where the format has none).
    pub fn gpu_bytes(&self) -> (Vec<u8>, Vec<f32>, Vec<f32>) {
        match &self.quant {
            Some(q) => (q.codes.clone(), q.scales.clone(), q.offsets.clone()),
            None => (
                self.half
                    .iter()
                    .flat_map(|h| h.to_bits().to_le_bytes())
                    .collect(),
                Vec::new(),
                Vec::new(),
            ),
        }
    }

    /// The quantized tensor (None for f16).
    pub fn quant(&self) -> Option<&QuantTensor> {
        self.quant.as_ref()
    }

    /// As the host kernels read it.
    pub fn cache(&self) -> KvCache<'_> {
        self.quant
            .as_ref()
            .map_or(KvCache::F16(&self.half), KvCache::Quant)
    }
}

pub struct Inputs {
    pub q: Vec<f16>,
    pub k: Side,
    pub v: Side,
}

/// `q_elems` f16 of q uniform in ±`q_amp`, then K and V of `rows` rows of
/// `d` uniform in ±1 in `kernel`'s key and value formats (quantized by the
/// project's quantizer where not f16), from `seed`.
pub fn inputs(
    kernel: &Kernel,
    q_elems: usize,
    rows: usize,
    d: usize,
    q_amp: f32,
    seed: u64,
) -> Inputs {
    inputs_with_values(kernel, q_elems, rows, d, q_amp, 1.0, seed)
}

/// [`inputs`] with V uniform in ±`v_amp`.
pub fn inputs_with_values(
    kernel: &Kernel,
    q_elems: usize,
    rows: usize,
    d: usize,
    q_amp: f32,
    v_amp: f32,
    seed: u64,
) -> Inputs {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let q: Vec<f16> = (0..q_elems)
        .map(|_| f16::from_f32(rng.gen_range(-q_amp..q_amp)))
        .collect();
    let kd: Vec<f32> = (0..rows * d).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let vd: Vec<f32> = (0..rows * d)
        .map(|_| rng.gen_range(-v_amp..v_amp))
        .collect();
    inputs_from(kernel, q, &kd, &vd, rows, d)
}

/// q as given, and K and V from `kd` and `vd` (`rows` rows of `d`) in
/// `kernel`'s key and value formats.
pub fn inputs_from(
    kernel: &Kernel,
    q: Vec<f16>,
    kd: &[f32],
    vd: &[f32],
    rows: usize,
    d: usize,
) -> Inputs {
    let a = kernel.as_attention().expect("an attention kernel");
    let kf = kernel.tensor(&a.k).expect("k").format;
    let vf = kernel.tensor(&a.v).expect("v").format;
    let side = |f: Format, data: &[f32]| {
        if f == Format::F16 {
            let half: Vec<f16> = data.iter().map(|&x| f16::from_f32(x)).collect();
            Side {
                value: Value::F16(half.clone()),
                quant: None,
                half,
            }
        } else {
            let t = quant::quantize(f, rows, d, data).expect("quantize");
            Side {
                value: Value::Quant(t.clone()),
                quant: Some(t),
                half: Vec::new(),
            }
        }
    };
    Inputs {
        k: side(kf, kd),
        v: side(vf, vd),
        q,
    }
}

impl Side {
    /// This side in memory that ends at an inaccessible page (a read past
    /// it faults).
    pub fn guarded(&self) -> GuardedCache {
        match &self.quant {
            Some(t) => GuardedCache::quant(t),
            None => GuardedCache::halves(&self.half),
        }
    }
}
