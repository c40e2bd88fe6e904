//! Running emitted decode-attention kernels on this host, safely (the
//! attention counterpart of [`crate::host`]).
//!
//! [`AttentionArgs`] is the calling convention (`extern "C" fn(*const
//! AttentionArgs)`, field offsets `AT_*`); [`HostAttention::run`] checks
//! every shape and format, then runs the kernel as its schedule says:
//! - `parallel kvh`: KV heads across threads (one thread serves every query
//!   head of its KV group, so each K/V row is read once per group), each
//!   with its own scratch and recompute counter; without it, one thread.
//! - `split s`: where the KV heads leave threads idle (few KV heads, batch
//!   1), the sequence is also cut into chunks computed apart and combined
//!   (flash-decoding), from the softmax state each call leaves in scratch.

use std::mem::offset_of;
use std::ops::Range;
use std::sync::Mutex;

use half::f16;
use half::slice::HalfFloatSliceExt;
use tessera_dsl::ir::{AttentionKind, Format, Kernel, Op};
use tessera_dsl::quant::QuantTensor;

use crate::abi::KernelFn;
use crate::artifact::{MachineCode, PrefillBlocks};
use crate::host::RangeExecutor;
use crate::jit::{JitCode, JitError};
use crate::schedule::spreads;

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
    /// `9·s + 20·d + 16` f32 of scratch for this call (the most any host
    /// emitter uses; cranelift and NEON need `s + 3·d`).
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
    /// Query tokens (`q`, `o`: f16 `[t, hq, d]`) of a whole-prefill call
    /// ([`MachineCode::whole_prefill`]), token i at position `s − t + i`;
    /// decode code reads one token and ignores this.
    pub t: usize,
    /// Null, or where decode code whose [`MachineCode::every_head_state`]
    /// holds leaves each head's softmax state: head `head0 + i` at
    /// `states + i·state_stride`, `d + 3` f32: `num[d]`, `den`, the
    /// reference max, and 1.0 if the async softmax fell back (else 0.0).
    pub states: *mut f32,
    /// f32 between two heads' states.
    pub state_stride: usize,
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
    t => AT_T,
    states => AT_STATES,
    state_stride => AT_STATE_STRIDE,
);

/// Why an attention kernel cannot be prepared or called.
#[derive(Debug, thiserror::Error)]
pub enum AttentionError {
    #[error("kernel `{kernel}` is not an attention kernel")]
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
    /// The code handles head dims that are multiples of this only (from
    /// [`MachineCode::head_dim_multiple`]); other calls are refused.
    head_dim_multiple: usize,
    /// The code runs whole prefill calls in these blocks
    /// ([`MachineCode::whole_prefill`]).
    whole_prefill: Option<PrefillBlocks>,
    /// Decode scratch kept between calls.
    scratch: ScratchPool,
    /// The decode code leaves every head's softmax state
    /// ([`MachineCode::every_head_state`]).
    every_head_state: bool,
}

/// Decode scratch buffers kept between calls: allocating and clearing a
/// call's scratch (x86: tens of KiB per tile of query heads) costs more
/// than a short context's attention itself. The decode kernels write every
/// scratch element before they read it, so a reused buffer is not cleared;
/// debug builds fill it with NaN, so a kernel that reads what it did not
/// write fails its tests.
#[derive(Default)]
struct ScratchPool(Mutex<Vec<Vec<f32>>>);

impl ScratchPool {
    /// At least `len` f32: a kept buffer if one is long enough, else a new
    /// one (allocated fallibly).
    fn take(&self, len: usize) -> Result<Vec<f32>, AttentionError> {
        let kept = self
            .0
            .lock()
            .map_or(None, |mut bufs| bufs.pop())
            .filter(|b| b.len() >= len);
        let Some(mut buf) = kept else {
            return zeroed(len, 1);
        };
        if cfg!(debug_assertions) {
            buf.fill(f32::NAN);
        }
        Ok(buf)
    }

    /// `buf` kept for the next call (at most two: a caller and one more
    /// at a time).
    fn give(&self, buf: Vec<f32>) {
        if let Ok(mut bufs) = self.0.lock()
            && bufs.len() < 2
        {
            bufs.push(buf);
        }
    }
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
    /// `code` as emitted for `kernel`. A prefill kernel's code is either a
    /// whole-prefill kernel (x86: [`MachineCode::whole_prefill`]) or its
    /// decode loop (cranelift and NEON emit the same code for both), which
    /// [`HostAttention::prefill`] runs once per query token.
    pub fn new(kernel: &Kernel, code: &MachineCode) -> Result<HostAttention, AttentionError> {
        let mut decode = kernel.clone();
        match &mut decode.op {
            Op::Attention(a)
                if code.whole_prefill.is_some() && a.kind != AttentionKind::Prefill =>
            {
                return Err(shape(
                    "kernel of whole-prefill code",
                    "a prefill attention kernel",
                    &kernel.name,
                ));
            }
            Op::Attention(a) if code.whole_prefill.is_none() => a.kind = AttentionKind::Decode,
            Op::Attention(_) => {}
            _ => {
                return Err(AttentionError::NotDecode {
                    kernel: kernel.name.clone(),
                });
            }
        }
        Ok(HostAttention {
            kernel: decode,
            code: JitCode::map(code)?,
            head_dim_multiple: code.head_dim_multiple.max(1),
            whole_prefill: code.whole_prefill,
            scratch: ScratchPool::default(),
            every_head_state: code.every_head_state,
        })
    }

    /// Whether the code takes head dim `d` (a positive multiple of its
    /// [`MachineCode::head_dim_multiple`]); calls with another are refused.
    pub fn takes_head_dim(&self, d: usize) -> bool {
        d > 0 && d.is_multiple_of(self.head_dim_multiple)
    }

    /// Whether the code computes a whole prefill call at once (each K/V
    /// block read once per block of query rows) rather than per token.
    pub fn whole_prefill(&self) -> bool {
        self.whole_prefill.is_some()
    }

    /// The blocks of whole-prefill code (None for decode code).
    pub fn prefill_blocks(&self) -> Option<PrefillBlocks> {
        self.whole_prefill
    }

    /// Causal prefill: `t` query tokens (`q`, `o`: f16 `[t, hq, d]`) over a
    /// cache of `s ≥ t` tokens, token i seeing the first `s − t + i + 1`
    /// (the interpreter's rule). Whole-prefill code gives each thread whole
    /// KV heads where they divide evenly, else a run of tokens of equal
    /// cost (`prefill_parts`); decode code is called once per
    /// token over its prefix, read in place, each as [`HostAttention::run`]
    /// with `threads`.
    #[allow(clippy::too_many_arguments)]
    pub fn prefill(
        &self,
        q: &[f16],
        k: KvCache<'_>,
        v: KvCache<'_>,
        t: usize,
        s: usize,
        hq: usize,
        kvh: usize,
        d: usize,
        o: &mut [f16],
        threads: usize,
    ) -> Result<u64, AttentionError> {
        self.prefill_on(
            q,
            k,
            v,
            t,
            s,
            hq,
            kvh,
            d,
            o,
            threads,
            &scoped_threads(threads),
        )
    }

    /// [`HostAttention::prefill`] with the workers of the caller's executor
    /// (as [`HostAttention::run_on`]): a runtime's persistent pool.
    #[allow(clippy::too_many_arguments)]
    pub fn prefill_on(
        &self,
        q: &[f16],
        k: KvCache<'_>,
        v: KvCache<'_>,
        t: usize,
        s: usize,
        hq: usize,
        kvh: usize,
        d: usize,
        o: &mut [f16],
        threads: usize,
        exec: &RangeExecutor<'_>,
    ) -> Result<u64, AttentionError> {
        if s < t {
            return Err(shape("sequence length", format!("at least t = {t}"), s));
        }
        if self.whole_prefill.is_some() {
            if t == 0 {
                return Ok(0);
            }
            return self.prefill_whole(q, k, v, t, s, hq, kvh, d, o, threads, exec);
        }
        let row = hq
            .checked_mul(d)
            .ok_or_else(|| shape("hq·d", "no overflow", "overflow"))?;
        let all = row
            .checked_mul(t)
            .ok_or_else(|| shape("t·hq·d", "no overflow", "overflow"))?;
        if q.len() != all {
            return Err(shape("q elements (t·hq·d)", all, q.len()));
        }
        if o.len() != all {
            return Err(shape("o elements (t·hq·d)", all, o.len()));
        }
        // Every token's prefix lies within the whole: check it up front.
        let whole = s
            .checked_mul(kvh)
            .ok_or_else(|| shape("s·kvh", "no overflow", "overflow"))?;
        prefix(k, whole, d)?;
        prefix(v, whole, d)?;
        let mut recomputed = 0;
        for i in 0..t {
            let visible = s - t + i + 1;
            let rows = visible * kvh;
            recomputed += self.run_on(
                &q[i * row..][..row],
                prefix(k, rows, d)?,
                prefix(v, rows, d)?,
                visible,
                hq,
                kvh,
                d,
                &mut o[i * row..][..row],
                threads,
                exec,
            )?;
        }
        Ok(recomputed)
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
        self.run_with(
            q,
            k,
            v,
            s,
            hq,
            kvh,
            d,
            o,
            threads,
            None,
            &scoped_threads(threads),
        )
    }

    /// [`HostAttention::run`] with the workers the caller's executor runs
    /// (`exec(job)` calls `job(t)` for every `t` in `0..threads`, in
    /// parallel, and returns when all are done): a runtime's persistent
    /// pool, so a decode step spawns no thread. Worker indices past the
    /// call's work return at once.
    #[allow(clippy::too_many_arguments)]
    pub fn run_on(
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
        exec: &RangeExecutor<'_>,
    ) -> Result<u64, AttentionError> {
        self.run_with(q, k, v, s, hq, kvh, d, o, threads, None, exec)
    }

    /// Like [`HostAttention::run`] with `s` cut into chunks of `chunk` keys
    /// (the last shorter) whatever the thread count: for tests and
    /// benchmarks of the split. The kernel's schedule must `split s`.
    #[allow(clippy::too_many_arguments)]
    pub fn run_chunked(
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
        chunk: usize,
    ) -> Result<u64, AttentionError> {
        let splits = self
            .kernel
            .as_attention()
            .is_some_and(|a| self.kernel.schedule.split.as_deref() == Some(a.seq.as_str()));
        if !splits {
            return Err(shape(
                "schedule of a chunked attention call",
                "`split s`",
                format!("{:?}", self.kernel.schedule.split),
            ));
        }
        if chunk == 0 {
            return Err(shape("keys per chunk", "at least 1", 0));
        }
        self.run_with(
            q,
            k,
            v,
            s,
            hq,
            kvh,
            d,
            o,
            threads,
            Some(chunk),
            &scoped_threads(threads),
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn run_with(
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
        chunk: Option<usize>,
        exec: &RangeExecutor<'_>,
    ) -> Result<u64, AttentionError> {
        if self.whole_prefill.is_some() {
            // A decode call is a prefill of one token that sees every key.
            return self.prefill_whole(q, k, v, 1, s, hq, kvh, d, o, threads, exec);
        }
        let (base, sides) = self.call_args(q, k, v, 1, s, hq, kvh, d, o)?;
        let chunk = match chunk {
            Some(c) => c,
            None => self.keys_per_chunk(s, kvh, threads),
        };
        if chunk >= s {
            self.run_whole(&base, s, hq, kvh, d, threads, exec)
        } else {
            let split = KeySplit {
                s,
                hq,
                kvh,
                d,
                threads,
                chunk,
            };
            self.run_chunks(&base, sides, split, o, exec)
        }
    }

    /// The checked arguments of a call over `t` query tokens and `s` keys
    /// (scratch, counter and heads left to each worker), and the bytes per
    /// element of the key and value caches.
    #[allow(clippy::too_many_arguments)]
    fn call_args(
        &self,
        q: &[f16],
        k: KvCache<'_>,
        v: KvCache<'_>,
        t: usize,
        s: usize,
        hq: usize,
        kvh: usize,
        d: usize,
        o: &mut [f16],
    ) -> Result<(Shared, [usize; 2]), AttentionError> {
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
        if d == 0 || !d.is_multiple_of(self.head_dim_multiple) {
            return Err(shape(
                "head dimension",
                format!("a positive multiple of {}", self.head_dim_multiple),
                d,
            ));
        }
        let rows = s
            .checked_mul(kvh)
            .ok_or_else(|| shape("s·kvh", "no overflow", "overflow"))?;
        let cache = rows
            .checked_mul(d)
            .ok_or_else(|| shape("s·kvh·d", "no overflow", "overflow"))?;
        let elems = t
            .checked_mul(hq)
            .and_then(|n| n.checked_mul(d))
            .ok_or_else(|| shape("t·hq·d", "no overflow", "overflow"))?;
        if q.len() != elems {
            return Err(shape("q elements (t·hq·d)", elems, q.len()));
        }
        if o.len() != elems {
            return Err(shape("o elements (t·hq·d)", elems, o.len()));
        }
        let mut ptrs = Vec::new();
        for (name, c) in [(&a.k, k), (&a.v, v)] {
            let want = fmt(name).ok_or_else(|| shape("tensor", name, "missing"))?;
            let p = match c {
                KvCache::F16(x) if want == Format::F16 => {
                    if x.len() != cache {
                        return Err(shape("cache elements (s·kvh·d)", cache, x.len()));
                    }
                    (
                        x.as_ptr() as *const u8,
                        std::ptr::null(),
                        std::ptr::null(),
                        2,
                    )
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
                    (t.codes.as_ptr(), scales, offsets, 1)
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
                    (codes.as_ptr(), nonnull(scales), nonnull(offsets), 1)
                }
                _ => return Err(shape("cache format", want, "another format")),
            };
            ptrs.push(p);
        }
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
            t,
            states: std::ptr::null_mut(),
            state_stride: 0,
        });
        Ok((base, [ptrs[0].3, ptrs[1].3]))
    }

    /// A whole-prefill call shared among the workers of `exec` as
    /// [`prefill_parts`] says: each part a prefill of its own over its
    /// tokens' causal prefix. Each worker's scratch is followed by a guard
    /// the kernel must leave as it was (checked in debug builds: the
    /// scratch size is this module's formula, the writes the emitter's).
    #[allow(clippy::too_many_arguments)]
    fn prefill_whole(
        &self,
        q: &[f16],
        k: KvCache<'_>,
        v: KvCache<'_>,
        t: usize,
        s: usize,
        hq: usize,
        kvh: usize,
        d: usize,
        o: &mut [f16],
        threads: usize,
        exec: &RangeExecutor<'_>,
    ) -> Result<u64, AttentionError> {
        if s < t {
            return Err(shape("sequence length", format!("at least t = {t}"), s));
        }
        let (base, _) = self.call_args(q, k, v, t, s, hq, kvh, d, o)?;
        let blocks = self
            .whole_prefill
            .ok_or_else(|| shape("attention code", "whole-prefill code", "decode code"))?;
        let scratch_len = prefill_scratch_floats(d, blocks)?;
        let parts = prefill_parts(s, t, hq, kvh, threads);
        let stride = scratch_len + SCRATCH_GUARD;
        let mut scratch = zeroed(stride, parts.len())?;
        for sc in scratch.chunks_mut(stride) {
            sc[scratch_len..].fill(f32::from_bits(GUARD_BITS));
        }
        let mut counters = vec![0u64; parts.len()];
        let entry = self.code.entry() as usize;
        let row_bytes = hq * d * 2;
        let call = |((run, heads), sc, counter): (PrefillPart, &mut [f32], &mut u64)| {
            let args0 = base.get();
            let args = AttentionArgs {
                q: args0.q.wrapping_add(run.start * row_bytes),
                o: args0.o.wrapping_add(run.start * row_bytes),
                scratch: sc.as_mut_ptr(),
                recomputed: counter as *mut u64,
                s: s - t + run.end,
                t: run.len(),
                head0: heads.start,
                heads: heads.len(),
                ..args0
            };
            // SAFETY: whole-prefill code of this kernel's formats
            // (AttentionArgs ABI with t); q and o hold t·hq·d f16 and this
            // part's tokens start + run.len() ≤ t and heads ≤ hq lie within
            // them; its keys s − t + run.end ≤ s rows of both caches and
            // their per-row parameters were checked by `call_args`; the
            // scratch holds prefill_scratch_floats(d, blocks) f32 (the
            // blocks the code was emitted for) and the counter
            // is this part's own; parts write disjoint (token, head) rows
            // of o.
            unsafe {
                let f: KernelFn<AttentionArgs> = std::mem::transmute(entry as *const u8);
                f(&args);
            }
        };
        let work: Vec<_> = parts
            .into_iter()
            .zip(scratch.chunks_mut(stride))
            .zip(counters.iter_mut())
            .map(|((r, sc), c)| (r, sc, c))
            .collect();
        if work.len() == 1 {
            work.into_iter().for_each(call);
        } else {
            on_workers(work, exec, call);
        }
        debug_assert!(
            scratch
                .chunks(stride)
                .all(|sc| sc[scratch_len..].iter().all(|g| g.to_bits() == GUARD_BITS)),
            "the prefill kernel wrote past its {scratch_len} f32 of scratch"
        );
        Ok(counters.iter().sum())
    }

    /// Keys per chunk for a call: `s` (no split) unless the kernel splits
    /// `s` and its KV heads alone would leave threads idle; then enough
    /// chunks to use them, none shorter than [`MIN_SPLIT_KEYS`].
    pub fn keys_per_chunk(&self, s: usize, kvh: usize, threads: usize) -> usize {
        let Some(a) = self.kernel.as_attention() else {
            return s;
        };
        if self.kernel.schedule.split.as_deref() != Some(a.seq.as_str()) {
            return s;
        }
        // Code that leaves every head's state splits the keys with every
        // head in each part, so each worker reads whole token rows in order.
        let units = if !self.every_head_state && spreads(&self.kernel, &a.kv_heads) {
            kvh
        } else {
            1
        };
        let chunks = threads
            .div_ceil(units.max(1))
            .min(s / MIN_SPLIT_KEYS)
            .max(1);
        s.div_ceil(chunks)
    }

    /// Every key in one call per worker; workers take whole KV heads when
    /// the schedule spreads `kvh`, else one worker takes them all.
    #[allow(clippy::too_many_arguments)]
    fn run_whole(
        &self,
        base: &Shared,
        s: usize,
        hq: usize,
        kvh: usize,
        d: usize,
        threads: usize,
        exec: &RangeExecutor<'_>,
    ) -> Result<u64, AttentionError> {
        let group = hq / kvh;
        let spread = self
            .kernel
            .as_attention()
            .is_some_and(|a| spreads(&self.kernel, &a.kv_heads));
        let threads = if spread { threads.clamp(1, kvh) } else { 1 };
        let per = kvh.div_ceil(threads);
        let scratch_len = scratch_floats(s, d, decode_tiles(0, per * group, group))?;
        let total = scratch_len
            .checked_mul(threads)
            .ok_or_else(|| shape("attention scratch", "no overflow", "overflow"))?;
        let mut scratch = self.scratch.take(total)?;
        let mut counters = vec![0u64; threads];
        // An address, so the worker closure is Sync.
        let entry = self.code.entry() as usize;
        let work: Vec<(usize, &mut [f32], &mut u64)> = scratch[..total]
            .chunks_mut(scratch_len)
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
            // (all checked by `run_with`); the scratch holds scratch_floats(s,
            // d, tiles) f32 for the tiles of `per` KV heads (at most) and
            // the counter is this worker's own; workers write disjoint heads.
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
            on_workers(work, exec, |(t, sc, c)| call(t, sc, c));
        }
        self.scratch.give(scratch);
        Ok(counters.iter().sum())
    }

    /// Flash-decoding: `s` cut into chunks of `chunk` keys. A job is one
    /// chunk of one KV head's query heads (of every head when the schedule
    /// does not spread `kvh`), one call per query head, whose softmax state
    /// the kernel leaves in scratch (`den` at `len`, `num` at `len + d`, the
    /// max at `len + 2d`); jobs go to threads in contiguous runs. The
    /// combine, per head: `M = max_c m_c`, `o = Σ_c e^(m_c − M)·num_c /
    /// Σ_c e^(m_c − M)·den_c`. A head counts as recomputed when any of its
    /// chunks fell back to the online softmax (one of its scores was out
    /// of range: the interpreter's rule).
    fn run_chunks(
        &self,
        base: &Shared,
        sides: [usize; 2],
        split: KeySplit,
        o: &mut [f16],
        exec: &RangeExecutor<'_>,
    ) -> Result<u64, AttentionError> {
        let KeySplit {
            s,
            hq,
            kvh,
            d,
            threads,
            chunk,
        } = split;
        if self.every_head_state {
            return self.run_chunks_every_head(base, sides, split, o, exec);
        }
        let group = hq / kvh;
        let spread = self
            .kernel
            .as_attention()
            .is_some_and(|a| spreads(&self.kernel, &a.kv_heads));
        let (units, heads_per_unit) = if spread { (kvh, group) } else { (1, hq) };
        let chunks = s.div_ceil(chunk);
        let jobs: Vec<(usize, usize)> = (0..units)
            .flat_map(|u| (0..chunks).map(move |c| (u, c)))
            .collect();
        let threads = threads.clamp(1, jobs.len());
        let per = jobs.len().div_ceil(threads);
        // Per head and chunk: num[d], den, max, recomputed (as f32 0/1).
        let state = d + 3;
        let mut partials = zeroed(hq * chunks * state, 1)?;
        let scratch_len = scratch_floats(chunk, d, 1)?;
        let total = scratch_len
            .checked_mul(threads)
            .ok_or_else(|| shape("attention scratch", "no overflow", "overflow"))?;
        let mut scratch = self.scratch.take(total)?;
        let mut sink = zeroed_f16(hq * d, threads)?;
        let entry = self.code.entry() as usize;
        // Each job's partial slots: its heads × its chunk, disjoint.
        let mut slots: Vec<Vec<&mut [f32]>> = (0..jobs.len()).map(|_| Vec::new()).collect();
        for (h, head) in partials.chunks_mut(chunks * state).enumerate() {
            for (c, slot) in head.chunks_mut(state).enumerate() {
                slots[(h / heads_per_unit) * chunks + c].push(slot);
            }
        }
        let run_job = |job: usize, slots: Vec<&mut [f32]>, sc: &mut [f32], out: &mut [f16]| {
            let (u, c) = jobs[job];
            let s0 = c * chunk;
            let len = chunk.min(s - s0);
            let args0 = chunk_args(base.get(), sides, kvh, d, s0, len);
            for (i, slot) in slots.into_iter().enumerate() {
                let mut counter = 0u64;
                let args = AttentionArgs {
                    o: out.as_mut_ptr() as *mut u8,
                    scratch: sc.as_mut_ptr(),
                    recomputed: &mut counter,
                    head0: u * heads_per_unit + i,
                    heads: 1,
                    ..args0
                };
                // SAFETY: the code is the decode kernel of this kernel's
                // formats (AttentionArgs ABI); rows r0 .. r0 + len·kvh of
                // both caches and their per-row parameters lie within the
                // s·kvh rows checked by `run_with`; q holds hq·d f16, `out`
                // (this worker's own) hq·d, the scratch scratch_floats(chunk, d,
                // 1) f32 (one head: one tile).
                unsafe {
                    let f: KernelFn<AttentionArgs> = std::mem::transmute(entry as *const u8);
                    f(&args);
                }
                slot[..d].copy_from_slice(&sc[len + d..len + 2 * d]);
                slot[d] = sc[len];
                slot[d + 1] = sc[len + 2 * d];
                slot[d + 2] = if counter > 0 { 1.0 } else { 0.0 };
            }
        };
        let mut runs: Vec<Vec<JobSlots<'_>>> = Vec::new();
        let mut slots = slots.into_iter().enumerate().peekable();
        while slots.peek().is_some() {
            runs.push(slots.by_ref().take(per).collect());
        }
        let workers = runs
            .into_iter()
            .zip(scratch[..total].chunks_mut(scratch_len))
            .zip(sink.chunks_mut(hq * d));
        if threads == 1 {
            for ((run, sc), out) in workers {
                for (job, slots) in run {
                    run_job(job, slots, sc, out);
                }
            }
        } else {
            on_workers(workers.collect(), exec, |((run, sc), out)| {
                for (job, slots) in run {
                    run_job(job, slots, sc, out);
                }
            });
        }
        self.scratch.give(scratch);
        Ok(combine(&mut partials, chunks, d, o))
    }

    /// Flash-decoding with code that leaves every head's state
    /// ([`MachineCode::every_head_state`]): a job is one chunk of `chunk`
    /// keys with every query head, its states written straight into the
    /// partials; workers take contiguous runs of chunks; the combine as
    /// [`HostAttention::run_chunks`]'.
    fn run_chunks_every_head(
        &self,
        base: &Shared,
        sides: [usize; 2],
        split: KeySplit,
        o: &mut [f16],
        exec: &RangeExecutor<'_>,
    ) -> Result<u64, AttentionError> {
        let KeySplit {
            s,
            hq,
            kvh,
            d,
            threads,
            chunk,
        } = split;
        let chunks = s.div_ceil(chunk);
        let threads = threads.clamp(1, chunks);
        let per = chunks.div_ceil(threads);
        // Per head and chunk: num[d], den, max, recomputed (as f32 0/1).
        let state = d + 3;
        let mut partials = zeroed(hq * chunks * state, 1)?;
        let scratch_len = scratch_floats(chunk, d, decode_tiles(0, hq, hq / kvh))?;
        let total = scratch_len
            .checked_mul(threads)
            .ok_or_else(|| shape("attention scratch", "no overflow", "overflow"))?;
        let mut scratch = self.scratch.take(total)?;
        let mut sink = zeroed_f16(hq * d, threads)?;
        let entry = self.code.entry() as usize;
        // An address, so the worker closure is Sync.
        let states = partials.as_mut_ptr() as usize;
        let run_job = |c: usize, sc: &mut [f32], out: &mut [f16]| {
            let s0 = c * chunk;
            let len = chunk.min(s - s0);
            let mut counter = 0u64;
            let args = AttentionArgs {
                o: out.as_mut_ptr() as *mut u8,
                scratch: sc.as_mut_ptr(),
                recomputed: &mut counter,
                head0: 0,
                heads: hq,
                states: (states as *mut f32).wrapping_add(c * state),
                state_stride: chunks * state,
                ..chunk_args(base.get(), sides, kvh, d, s0, len)
            };
            // SAFETY: the code is decode code that leaves every head's
            // state (`every_head_state`) with the AttentionArgs ABI; rows
            // r0 .. r0 + len·kvh of both caches and their per-row
            // parameters lie within the s·kvh rows checked by `run_with`;
            // q holds hq·d f16, `out` (this worker's own) hq·d, the scratch
            // scratch_floats(chunk, d, tiles of every head) f32; the states
            // it writes, head h's at h·chunks·state + c·state (d + 3 f32),
            // lie within `partials` and are this chunk's alone.
            unsafe {
                let f: KernelFn<AttentionArgs> = std::mem::transmute(entry as *const u8);
                f(&args);
            }
        };
        let runs: Vec<Range<usize>> = (0..threads)
            .map(|w| (w * per).min(chunks)..((w + 1) * per).min(chunks))
            .collect();
        let workers = runs
            .into_iter()
            .zip(scratch[..total].chunks_mut(scratch_len))
            .zip(sink.chunks_mut(hq * d));
        if threads == 1 {
            for ((run, sc), out) in workers {
                run.for_each(|c| run_job(c, sc, out));
            }
        } else {
            on_workers(workers.collect(), exec, |((run, sc), out)| {
                run.for_each(|c| run_job(c, sc, out));
            });
        }
        self.scratch.give(scratch);
        Ok(combine(&mut partials, chunks, d, o))
    }
}

/// A decode call split over the keys: `s` keys in chunks of `chunk`,
/// `hq` query heads over `kvh` KV heads of `d`, on up to `threads`.
#[derive(Clone, Copy, Debug)]
struct KeySplit {
    s: usize,
    hq: usize,
    kvh: usize,
    d: usize,
    threads: usize,
    chunk: usize,
}

/// A split job's arguments over keys `s0 .. s0 + len`: both caches and
/// their per-row parameters from token `s0` on (`sides`: bytes per element
/// of K and V), `s = len`. The pointers are offset with `wrapping_add`; the
/// callers' SAFETY comments say why they stay within the checked caches.
fn chunk_args(
    args: AttentionArgs,
    sides: [usize; 2],
    kvh: usize,
    d: usize,
    s0: usize,
    len: usize,
) -> AttentionArgs {
    let r0 = s0 * kvh;
    let rows = |p: *const f32| {
        if p.is_null() { p } else { p.wrapping_add(r0) }
    };
    AttentionArgs {
        k: args.k.wrapping_add(r0 * d * sides[0]),
        k_scales: rows(args.k_scales),
        k_offsets: rows(args.k_offsets),
        v: args.v.wrapping_add(r0 * d * sides[1]),
        s: len,
        ..args
    }
}

/// The split combine, per head of `partials` (`[head][chunk][d + 3]`:
/// `num[d]`, `den`, max, recomputed flag): `M = max_c m_c`, `o = Σ_c
/// e^(m_c − M)·num_c / Σ_c e^(m_c − M)·den_c`. Returns the heads that
/// recomputed in any chunk (the interpreter's rule). Overwrites each
/// chunk's max with its weight.
fn combine(partials: &mut [f32], chunks: usize, d: usize, o: &mut [f16]) -> u64 {
    // d elements a block: the sums stay on the stack and reach `o` by one
    // slice conversion (F16C where the CPU has it), and each chunk's
    // weight is taken once. Summing through a Vec of chunk slices with
    // every element converted alone took 5–8 µs of a two-thread call
    // (Qwen2-1.5B, 12 heads of 128; Sapphire Rapids-class Xeon).
    const BLOCK: usize = 64;
    let state = d + 3;
    let mut recomputed = 0;
    let mut sum = [0f32; BLOCK];
    for (parts, out) in partials.chunks_mut(chunks * state).zip(o.chunks_mut(d)) {
        let m = parts
            .chunks(state)
            .map(|p| p[d + 1])
            .fold(f32::NEG_INFINITY, f32::max);
        // Each chunk's max becomes its weight e^(m_c − M), then that over
        // the denominator.
        let mut den = 0.0;
        for p in parts.chunks_mut(state) {
            p[d + 1] = (p[d + 1] - m).exp();
            den += p[d] * p[d + 1];
        }
        for p in parts.chunks_mut(state) {
            p[d + 1] /= den;
        }
        for (b, out) in out.chunks_mut(BLOCK).enumerate() {
            let sum = &mut sum[..out.len()];
            sum.fill(0.0);
            for p in parts.chunks(state) {
                let w = p[d + 1];
                for (s, x) in sum.iter_mut().zip(&p[b * BLOCK..d]) {
                    *s += w * x;
                }
            }
            out.convert_from_f32_slice(sum);
        }
        recomputed += u64::from(parts.chunks(state).any(|p| p[d + 2] > 0.0));
    }
    recomputed
}

/// An executor of `threads` scoped OS threads (the caller is worker 0):
/// what [`HostAttention::run`] uses when the caller has no pool.
pub fn scoped_threads(threads: usize) -> impl Fn(&(dyn Fn(usize) + Sync)) {
    move |job: &(dyn Fn(usize) + Sync)| {
        std::thread::scope(|scope| {
            for t in 1..threads.max(1) {
                scope.spawn(move || job(t));
            }
            job(0);
        });
    }
}

/// `work(item)` for every item, item `t` on worker `t` of `exec`; items an
/// executor with fewer workers leaves run on the calling thread. Each item
/// sits behind its own lock, which only its worker (or the caller,
/// afterwards) takes.
fn on_workers<T: Send>(items: Vec<T>, exec: &RangeExecutor<'_>, work: impl Fn(T) + Sync) {
    let slots: Vec<Mutex<Option<T>>> = items.into_iter().map(|i| Mutex::new(Some(i))).collect();
    let take = |t: usize| {
        // A panic in another worker poisons nothing half-taken.
        let item = slots
            .get(t)
            .and_then(|m| m.lock().unwrap_or_else(|e| e.into_inner()).take());
        if let Some(item) = item {
            work(item);
        }
    };
    exec(&take);
    (0..slots.len()).for_each(take);
}

/// The first `rows` rows of a cache of `cols` columns, borrowed in place.
pub fn prefix<'a>(c: KvCache<'a>, rows: usize, cols: usize) -> Result<KvCache<'a>, AttentionError> {
    let elems = rows * cols;
    match c {
        KvCache::F16(x) => x
            .get(..elems)
            .map(KvCache::F16)
            .ok_or_else(|| shape("cache elements", elems, x.len())),
        KvCache::Quant(t) => {
            // One scale (and offset) per row, or none (fp8): what the
            // decode kernel reads; other groupings are refused there.
            let per_row = |v: &'a [f32]| -> Result<&'a [f32], AttentionError> {
                if v.is_empty() {
                    Ok(v)
                } else if v.len() == t.rows {
                    Ok(&v[..rows])
                } else {
                    Err(shape("cache parameters", "one per row", v.len()))
                }
            };
            if t.rows < rows || t.cols != cols {
                return Err(shape(
                    "quantized cache [rows, cols]",
                    format!("at least [{rows}, {cols}]"),
                    format!("[{}, {}]", t.rows, t.cols),
                ));
            }
            Ok(KvCache::QuantRows {
                format: t.format,
                rows,
                cols,
                codes: t
                    .codes
                    .get(..elems)
                    .ok_or_else(|| shape("cache codes", elems, t.codes.len()))?,
                scales: per_row(&t.scales)?,
                offsets: per_row(&t.offsets)?,
            })
        }
        KvCache::QuantRows {
            format,
            rows: r,
            cols: c,
            codes,
            scales,
            offsets,
        } => {
            if r < rows || c != cols {
                return Err(shape(
                    "quantized cache [rows, cols]",
                    format!("at least [{rows}, {cols}]"),
                    format!("[{r}, {c}]"),
                ));
            }
            let cut = |v: &'a [f32]| if v.len() == r { &v[..rows] } else { v };
            Ok(KvCache::QuantRows {
                format,
                rows,
                cols,
                codes: codes
                    .get(..elems)
                    .ok_or_else(|| shape("cache codes", elems, codes.len()))?,
                scales: cut(scales),
                offsets: cut(offsets),
            })
        }
    }
}

/// One worker's share of a whole-prefill call: its query tokens and its
/// query heads.
type PrefillPart = (Range<usize>, Range<usize>);

/// How a whole-prefill call is shared among `threads` workers: whole KV
/// heads (with their query heads) where the KV heads divide evenly among
/// the workers — equal work, each K/V block converted by one worker only —
/// else [`token_runs`] over every head.
fn prefill_parts(s: usize, t: usize, hq: usize, kvh: usize, threads: usize) -> Vec<PrefillPart> {
    let workers = threads.max(1);
    if workers > 1 && kvh.is_multiple_of(workers) {
        let heads = hq / workers;
        (0..workers)
            .map(|w| (0..t, w * heads..(w + 1) * heads))
            .collect()
    } else {
        token_runs(s, t, threads)
            .into_iter()
            .map(|r| (r, 0..hq))
            .collect()
    }
}

/// Tokens `0..t` of a prefill over `s` keys in at most `threads`
/// contiguous non-empty runs of about equal cost (token i sees
/// `s − t + i + 1` keys), covering every token once.
pub fn token_runs(s: usize, t: usize, threads: usize) -> Vec<Range<usize>> {
    let threads = threads.clamp(1, t.max(1));
    let cost = |i: usize| (s.saturating_sub(t) + i + 1) as u128;
    let total: u128 = (0..t).map(cost).sum();
    let (mut out, mut start, mut acc) = (Vec::new(), 0, 0u128);
    for w in 1..=threads {
        let target = total * w as u128 / threads as u128;
        let mut end = start;
        while end < t && (w == threads || acc + cost(end) <= target) {
            acc += cost(end);
            end += 1;
        }
        if end > start {
            out.push(start..end);
        }
        start = end;
    }
    out
}

/// A chunk job's index and the partial-state slots it fills.
type JobSlots<'a> = (usize, Vec<&'a mut [f32]>);

/// Query heads of one KV head a decode kernel computes together (a tile:
/// x86's 8 lanes of a ymm), which sizes the per-tile part of the scratch.
pub const DECODE_TILE_HEADS: usize = 8;
/// Keys whose scores a decode tile keeps at once (x86's super-block).
pub const DECODE_SUPER_BLOCK: usize = 256;
/// f32 of a decode tile's record in the scratch (x86's cursors and
/// per-head vectors).
pub const DECODE_TILE_RECORD: usize = 88;
/// f32 after a decode tile's widened q: x86's zmm score loop lays q out
/// in 32-d chunks of 8 head slots (512 bytes), and its AMX score loop
/// adds q's two int8 parts in 64-d chunks of 16 columns (1 KiB) after
/// them, so a short or odd head dim's q (d = 8, 72) takes more than its
/// `8·d` f32: at most `16·(d + 24) + 16·(d + 56)` bytes.
pub const DECODE_Q_PAD: usize = 320;

/// Tiles of a decode call over query heads `head0 .. head0 + heads` with
/// `group` query heads per KV head: each tile is
/// `min(group − h % group, end − h, DECODE_TILE_HEADS)` heads from `h`.
pub fn decode_tiles(head0: usize, heads: usize, group: usize) -> usize {
    decode_tile_heads(head0, heads, group).count()
}

/// The head count of each of [`decode_tiles`]' tiles, in order.
pub fn decode_tile_heads(head0: usize, heads: usize, group: usize) -> impl Iterator<Item = usize> {
    let (mut h, end) = (head0, head0 + heads);
    std::iter::from_fn(move || {
        (h < end).then(|| {
            let tile = (group - h % group).min(end - h).min(DECODE_TILE_HEADS);
            h += tile;
            tile
        })
    })
}

/// f32 of scratch one call over `s` keys in `tiles` tiles of query heads
/// gets: what every host emitter needs (cranelift and NEON `s + 3·d`, x86
/// more: its [`scratch_floats`](crate::x86::attention::scratch_floats)),
/// checked.
fn scratch_floats(s: usize, d: usize, tiles: usize) -> Result<usize, AttentionError> {
    let per_tile = d
        .checked_mul(17)
        .and_then(|a| a.checked_add(DECODE_TILE_RECORD + DECODE_Q_PAD + 8 * DECODE_SUPER_BLOCK));
    s.checked_add(24)
        .and_then(|a| d.checked_mul(3).and_then(|b| a.checked_add(b)))
        .zip(per_tile.and_then(|p| p.checked_mul(tiles)))
        .and_then(|(a, b)| a.checked_add(b))
        .ok_or_else(|| shape("attention scratch", "no overflow", "overflow"))
}

/// f32 of scratch a whole-prefill call in `blocks` takes (R query rows, C
/// keys): the transposed q `(R + 8)·d`, the output accumulators
/// `(R + 2)·d`, scores `R·C`, converted K and V `2·C·(d + 16)` (the spare
/// lines keep strides off powers of two), per-row limit (f32 and u64),
/// max, sum, α and output pointer `8·R`, and 16 to align the start to a
/// cache line, checked.
pub fn prefill_scratch_floats(d: usize, blocks: PrefillBlocks) -> Result<usize, AttentionError> {
    let (r, c) = (blocks.rows as usize, blocks.keys as usize);
    let per_d = (r + 8) + (r + 2) + 2 * c;
    let fixed = r
        .checked_mul(c)
        .and_then(|rc| rc.checked_add(32 * c + 8 * r + 16));
    d.checked_mul(per_d)
        .zip(fixed)
        .and_then(|(a, b)| a.checked_add(b))
        .ok_or_else(|| shape("prefill scratch", "no overflow", "overflow"))
}

/// f32 after each whole-prefill worker's scratch that must stay
/// [`GUARD_BITS`].
const SCRATCH_GUARD: usize = 16;
/// A NaN no kernel computes: the guard's pattern.
const GUARD_BITS: u32 = 0x7fc0_dead;

/// Fewest keys a split chunk gets: below this the combine and the extra
/// calls cost more than the idle thread they would feed.
pub const MIN_SPLIT_KEYS: usize = 256;

/// `len · copies` zeroed f32, allocated fallibly (lengths come from input).
fn zeroed(len: usize, copies: usize) -> Result<Vec<f32>, AttentionError> {
    let total = len
        .checked_mul(copies)
        .ok_or_else(|| shape("attention scratch", "no overflow", "overflow"))?;
    let mut v = Vec::new();
    v.try_reserve_exact(total)
        .map_err(|_| shape("attention scratch", "memory for it", format!("{total} f32")))?;
    v.resize(total, 0.0);
    Ok(v)
}

/// `len · copies` f16 zeros, allocated fallibly.
fn zeroed_f16(len: usize, copies: usize) -> Result<Vec<f16>, AttentionError> {
    let total = len
        .checked_mul(copies)
        .ok_or_else(|| shape("attention output scratch", "no overflow", "overflow"))?;
    let mut v = Vec::new();
    v.try_reserve_exact(total).map_err(|_| {
        shape(
            "attention output scratch",
            "memory for it",
            format!("{total} f16"),
        )
    })?;
    v.resize(total, f16::ZERO);
    Ok(v)
}

#[cfg(test)]
mod tests {
    /// The scratch every call gets holds what each host emitter's code
    /// writes (x86's areas, and the `s + 3·d` of cranelift and NEON).
    #[test]
    fn every_host_emitter_fits_the_scratch() {
        for s in [1usize, 7, 64, 65, 4096, 32768] {
            for d in [8usize, 64, 80, 128, 256] {
                for tiles in [1usize, 2, 32] {
                    let have = super::scratch_floats(s, d, tiles).unwrap();
                    assert!(have >= s + 3 * d, "s={s} d={d}");
                    #[cfg(feature = "emitters")]
                    assert!(
                        have >= crate::x86::attention::scratch_floats(s, d, tiles),
                        "s={s} d={d} tiles={tiles}"
                    );
                }
            }
        }
        assert!(super::scratch_floats(usize::MAX - 8, 8, 1).is_err());
        assert!(super::scratch_floats(8, 8, usize::MAX / 64).is_err());
    }

    /// Tiles never cross a KV head's group and hold at most 8 heads.
    #[test]
    fn decode_tiles_follow_groups() {
        use super::{decode_tile_heads, decode_tiles};
        assert_eq!(decode_tiles(0, 32, 1), 32);
        assert_eq!(decode_tiles(0, 12, 6), 2);
        assert_eq!(decode_tiles(0, 18, 9), 4);
        assert_eq!(decode_tiles(3, 4, 6), 2);
        assert_eq!(decode_tiles(5, 0, 6), 0);
        assert_eq!(decode_tiles(0, 8, 8), 1);
        let heads =
            |head0, heads, group| decode_tile_heads(head0, heads, group).collect::<Vec<_>>();
        assert_eq!(heads(0, 12, 6), [6, 6]);
        assert_eq!(heads(0, 18, 9), [8, 1, 8, 1]);
        assert_eq!(heads(3, 4, 6), [3, 1]);
        assert_eq!(heads(0, 12, 12), [8, 4]);
    }

    /// Whole KV heads per worker where they divide evenly (every (token,
    /// head) row once), else token runs over every head.
    #[test]
    fn prefill_parts_cover_every_row_once() {
        for (s, t, hq, kvh, threads) in [
            (100usize, 60usize, 12usize, 2usize, 2usize),
            (100, 60, 32, 32, 2),
            (100, 60, 9, 3, 2),
            (5, 5, 4, 1, 4),
            (10, 3, 4, 2, 1),
        ] {
            let parts = super::prefill_parts(s, t, hq, kvh, threads);
            assert!(!parts.is_empty() && parts.len() <= threads.max(1));
            let mut seen = vec![0u8; t * hq];
            for (tokens, heads) in &parts {
                for i in tokens.clone() {
                    for h in heads.clone() {
                        seen[i * hq + h] += 1;
                    }
                }
            }
            assert!(
                seen.iter().all(|&n| n == 1),
                "{s} {t} {hq} {kvh} {threads}: {parts:?}"
            );
            if threads > 1 && kvh % threads == 0 {
                assert!(parts.iter().all(|(tokens, _)| *tokens == (0..t)));
            }
        }
    }
}
