//! Running emitted decode-attention kernels on this host, safely (the
//! attention counterpart of [`crate::host`]).
//!
//! [`AttentionArgs`] is the calling convention (`extern "C" fn(*const
//! AttentionArgs)`, field offsets `AT_*`); [`HostAttention::run`] checks
//! every shape and format, then splits the KV heads across threads (one
//! thread serves every query head of its KV group, so each K/V row is read
//! once per group), each with its own scratch and recompute counter.

use std::mem::offset_of;

use half::f16;
use tessera_dsl::ir::{AttentionKind, Format, Kernel};
use tessera_dsl::quant::QuantTensor;

use crate::abi::KernelFn;
use crate::artifact::MachineCode;
use crate::jit::{JitCode, JitError};

/// Arguments of a decode attention kernel (one query token).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AttentionArgs {
    /// f16 `[hq, d]`.
    pub q: *const u8,
    /// Key cache `[s, kvh, d]` in the kernel's key format.
    pub k: *const u8,
    /// Quantized keys: one f32 scale per (token, KV head) row, or null.
    pub k_scales: *const f32,
    /// Asymmetric keys: one f32 offset per row, or null.
    pub k_offsets: *const f32,
    /// Value cache `[s, kvh, d]` in the kernel's value format.
    pub v: *const u8,
    /// f16 `[hq, d]`.
    pub o: *mut u8,
    /// `s + 3·d` f32 of scratch for this call.
    pub scratch: *mut f32,
    /// Incremented once per row the async softmax recomputed online.
    pub recomputed: *mut u64,
    pub s: usize,
    pub hq: usize,
    pub kvh: usize,
    pub d: usize,
    /// First query head this call computes.
    pub head0: usize,
    /// Query heads this call computes.
    pub heads: usize,
}

macro_rules! offsets {
    ($($field:ident => $name:ident),* $(,)?) => {
        $(
            #[doc = concat!("Byte offset of `AttentionArgs::", stringify!($field), "`.")]
            pub const $name: i32 = offset_of!(AttentionArgs, $field) as i32;
        )*
    };
}

offsets!(
    q => AT_Q,
    k => AT_K,
    k_scales => AT_K_SCALES,
    k_offsets => AT_K_OFFSETS,
    v => AT_V,
    o => AT_O,
    scratch => AT_SCRATCH,
    recomputed => AT_RECOMPUTED,
    s => AT_S,
    hq => AT_HQ,
    kvh => AT_KVH,
    d => AT_D,
    head0 => AT_HEAD0,
    heads => AT_HEADS,
);

/// Why an attention kernel cannot be prepared or called.
#[derive(Debug, thiserror::Error)]
pub enum AttentionError {
    #[error("kernel `{kernel}` is not a decode attention kernel")]
    NotDecode { kernel: String },
    #[error("{what}: expected {expected}, got {got}")]
    Shape {
        what: &'static str,
        expected: String,
        got: String,
    },
    #[error("{0}")]
    Jit(#[from] JitError),
}

/// A KV cache as the caller holds it: f16 rows, or quantized rows
/// (`rows = s·kvh`, `cols = d`, the format the kernel declares).
#[derive(Clone, Copy, Debug)]
pub enum KvCache<'a> {
    F16(&'a [f16]),
    Quant(&'a QuantTensor),
    /// Quantized rows borrowed in place (e.g. the first `s` tokens of a
    /// runtime cache with spare capacity): `codes` one byte per element,
    /// row-major `[rows, cols]`, one scale (and, for asymmetric formats,
    /// one offset) per row. Lengths are checked; code values are the
    /// caller's (any byte is a valid code of the 8-bit cache formats).
    QuantRows {
        format: Format,
        rows: usize,
        cols: usize,
        codes: &'a [u8],
        scales: &'a [f32],
        offsets: &'a [f32],
    },
}

/// A decode attention kernel mapped executable.
pub struct HostAttention {
    kernel: Kernel,
    code: JitCode,
}

impl std::fmt::Debug for HostAttention {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostAttention")
            .field("kernel", &self.kernel.name)
            .finish()
    }
}

struct Shared(AttentionArgs);
// SAFETY: the pointers refer to buffers borrowed for the whole scoped call;
// workers read q, k, v and write disjoint heads of `o`; each worker gets its
// own scratch and counter (set per worker in `run`).
unsafe impl Sync for Shared {}

impl Shared {
    fn get(&self) -> AttentionArgs {
        self.0
    }
}

fn shape(what: &'static str, expected: impl ToString, got: impl ToString) -> AttentionError {
    AttentionError::Shape {
        what,
        expected: expected.to_string(),
        got: got.to_string(),
    }
}

impl HostAttention {
    pub fn new(kernel: &Kernel, code: &MachineCode) -> Result<HostAttention, AttentionError> {
        match kernel.as_attention() {
            Some(a) if a.kind == AttentionKind::Decode => {}
            _ => {
                return Err(AttentionError::NotDecode {
                    kernel: kernel.name.clone(),
                });
            }
        }
        Ok(HostAttention {
            kernel: kernel.clone(),
            code: JitCode::map(code)?,
        })
    }

    /// o[hq, d] = softmax(q·kᵀ)·v over `s` cached tokens; returns how many
    /// rows the async softmax recomputed online.
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &self,
        q: &[f16],
        k: KvCache<'_>,
        v: KvCache<'_>,
        s: usize,
        hq: usize,
        kvh: usize,
        d: usize,
        o: &mut [f16],
        threads: usize,
    ) -> Result<u64, AttentionError> {
        let a = self
            .kernel
            .as_attention()
            .ok_or_else(|| AttentionError::NotDecode {
                kernel: self.kernel.name.clone(),
            })?;
        let fmt = |n: &str| self.kernel.tensor(n).map(|t| t.format);
        if kvh == 0 || !hq.is_multiple_of(kvh) {
            return Err(shape(
                "query heads",
                format!("a multiple of kv heads {kvh}"),
                hq,
            ));
        }
        if s == 0 {
            return Err(shape("sequence length", "at least 1", s));
        }
        let rows = s
            .checked_mul(kvh)
            .ok_or_else(|| shape("s·kvh", "no overflow", "overflow"))?;
        let cache = rows
            .checked_mul(d)
            .ok_or_else(|| shape("s·kvh·d", "no overflow", "overflow"))?;
        if q.len() != hq * d {
            return Err(shape("q elements (hq·d)", hq * d, q.len()));
        }
        if o.len() != hq * d {
            return Err(shape("o elements (hq·d)", hq * d, o.len()));
        }
        let mut ptrs = Vec::new();
        for (name, c) in [(&a.k, k), (&a.v, v)] {
            let want = fmt(name).ok_or_else(|| shape("tensor", name, "missing"))?;
            let p = match c {
                KvCache::F16(x) if want == Format::F16 => {
                    if x.len() != cache {
                        return Err(shape("cache elements (s·kvh·d)", cache, x.len()));
                    }
                    (x.as_ptr() as *const u8, std::ptr::null(), std::ptr::null())
                }
                KvCache::Quant(t) if t.format == want => {
                    t.validate()
                        .map_err(|e| shape("quantized cache", "valid", e))?;
                    if t.rows != rows || t.cols != d {
                        return Err(shape(
                            "quantized cache [rows, cols]",
                            format!("[{rows}, {d}]"),
                            format!("[{}, {}]", t.rows, t.cols),
                        ));
                    }
                    let offsets = if t.offsets.is_empty() {
                        std::ptr::null()
                    } else {
                        t.offsets.as_ptr()
                    };
                    let scales = if t.scales.is_empty() {
                        std::ptr::null()
                    } else {
                        t.scales.as_ptr()
                    };
                    (t.codes.as_ptr(), scales, offsets)
                }
                KvCache::QuantRows {
                    format,
                    rows: r,
                    cols,
                    codes,
                    scales,
                    offsets,
                } if format == want => {
                    if r != rows || cols != d {
                        return Err(shape(
                            "quantized cache [rows, cols]",
                            format!("[{rows}, {d}]"),
                            format!("[{r}, {cols}]"),
                        ));
                    }
                    let want_scales = match format.group() {
                        Some(tessera_dsl::ir::Group::Row) => rows,
                        None if matches!(format, Format::Fp8E4M3 | Format::Fp8E5M2) => 0,
                        _ => {
                            return Err(shape(
                                "cache rows format",
                                "one group per row, or fp8",
                                format,
                            ));
                        }
                    };
                    if codes.len() != cache {
                        return Err(shape("cache codes (s·kvh·d)", cache, codes.len()));
                    }
                    if scales.len() != want_scales {
                        return Err(shape("cache scales", want_scales, scales.len()));
                    }
                    let want_offsets = if format.is_asymmetric() { rows } else { 0 };
                    if offsets.len() != want_offsets {
                        return Err(shape("cache offsets", want_offsets, offsets.len()));
                    }
                    let nonnull = |v: &[f32]| {
                        if v.is_empty() {
                            std::ptr::null()
                        } else {
                            v.as_ptr()
                        }
                    };
                    (codes.as_ptr(), nonnull(scales), nonnull(offsets))
                }
                _ => return Err(shape("cache format", want, "another format")),
            };
            ptrs.push(p);
        }
        let group = hq / kvh;
        let threads = threads.clamp(1, kvh);
        let per = kvh.div_ceil(threads);
        let scratch_len = s + 3 * d;
        let mut scratch = vec![0f32; scratch_len * threads];
        let mut counters = vec![0u64; threads];
        let base = Shared(AttentionArgs {
            q: q.as_ptr() as *const u8,
            k: ptrs[0].0,
            k_scales: ptrs[0].1,
            k_offsets: ptrs[0].2,
            v: ptrs[1].0,
            o: o.as_mut_ptr() as *mut u8,
            scratch: std::ptr::null_mut(),
            recomputed: std::ptr::null_mut(),
            s,
            hq,
            kvh,
            d,
            head0: 0,
            heads: 0,
        });
        // An address, so the worker closure is Sync.
        let entry = self.code.entry() as usize;
        let work: Vec<(usize, &mut [f32], &mut u64)> = scratch
            .chunks_mut(scratch_len.max(1))
            .zip(counters.iter_mut())
            .enumerate()
            .map(|(t, (sc, c))| (t, sc, c))
            .collect();
        let call = |t: usize, sc: &mut [f32], c: &mut u64| {
            let kv0 = t * per;
            let kv1 = ((t + 1) * per).min(kvh);
            if kv0 >= kv1 {
                return;
            }
            let args = AttentionArgs {
                scratch: sc.as_mut_ptr(),
                recomputed: c as *mut u64,
                head0: kv0 * group,
                heads: (kv1 - kv0) * group,
                ..base.get()
            };
            // SAFETY: the code was emitted for this kernel with the
            // AttentionArgs ABI; q and o hold hq·d f16, the caches s·kvh·d
            // elements of their declared formats with per-row parameters
            // (all checked above); the scratch holds s + 3·d f32 and the
            // counter is this worker's own; workers write disjoint heads.
            unsafe {
                let f: KernelFn<AttentionArgs> = std::mem::transmute(entry as *const u8);
                f(&args);
            }
        };
        if threads == 1 {
            for (t, sc, c) in work {
                call(t, sc, c);
            }
        } else {
            std::thread::scope(|sc| {
                for (t, s_, c) in work {
                    let call = &call;
                    sc.spawn(move || call(t, s_, c));
                }
            });
        }
        Ok(counters.iter().sum())
    }
}
