//! Attention over a KV cache that grows in place.
//!
//! [`KvCache`] stores keys and values as `[s, kvh, d]` with the growing
//! sequence axis outermost (seed 000 IV.F, Transformer-Lite 2.3), so
//! appending a token writes its rows after the last ones and a kernel
//! reads the first `s` tokens as a prefix of the same buffer: nothing is
//! copied per step. The buffer is allocated at the maximum length when it
//! is known ([`KvCapacity::Max`]), or in whole chunks ([`KvCapacity::Chunked`]):
//! when a chunk fills, the capacity grows by whole chunks and at least
//! doubles, so the one copy a growth costs is amortized to O(1) per token
//! (the kernels read one contiguous `[s, kvh, d]` buffer, so chunks cannot
//! stay separate).
//!
//! On an OpenCL device ([`KvCache::for_device`]) the same `[s, kvh, d]`
//! buffers live on the device: a token is written after the last ones
//! (one small host-to-device write), and a growth allocates larger
//! buffers and copies the old tokens on the device, by the same chunk
//! policy.
//!
//! [`Attention::decode`] runs the JIT (or prebuilt) decode kernel on the
//! whole cache; on OpenCL and CUDA, the split-K decode program over the
//! device cache. [`Attention::prefill`] runs the device's whole-prefill kernel
//! where it has one (x86 and NEON: each K/V block read once per block of
//! query rows, an online softmax in registers), else the decode kernel once per
//! prompt token over the causal prefix it may see (token i of t sits at
//! position s − t + i and sees keys 0..=s − t + i, the interpreter's
//! prefill semantics); either way the tokens are split over the pool by
//! per-core weights and by cost (later tokens see more keys). On OpenCL,
//! prefill is one launch of the fused prefill program (head dims up to
//! 256); on CUDA, one launch of the tensor-core prefill program (head dims
//! that are multiples of 16, up to 256), else one decode launch per prompt
//! token, in order.

use std::ops::Range;
use std::sync::{Arc, Mutex};

use crate::kv_append::{AppendKernel, KvRowsMut};
use half::f16;
use tessera_codegen::host_attention::{HostAttention, KvCache as KvView};
use tessera_dsl::ir::{Format, Group, ParamType};
use tessera_dsl::quant;

use crate::backend::Device;
use crate::error::{RuntimeError, check_len, shape};

/// Key/value storage formats (those the library's decode kernels declare).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvFormat {
    /// Keys and values f16 (`attention-decode-f16`).
    F16,
    /// Keys int8 asymmetric per row, values fp8 e4m3 (`attention-decode-kv8`).
    Kv8,
}

impl KvFormat {
    /// `rows` rows of keys and of values (`d` each) as a device cache of
    /// this format stores them.
    #[cfg(any(feature = "opencl", feature = "cuda"))]
    fn encode_rows(
        self,
        rows: usize,
        d: usize,
        k: &[f32],
        v: &[f32],
    ) -> Result<(crate::gpu_kv::Encoded, crate::gpu_kv::Encoded), RuntimeError> {
        Ok((
            crate::gpu_kv::encode(self.key_format(), rows, d, k)?,
            crate::gpu_kv::encode(self.value_format(), rows, d, v)?,
        ))
    }

    pub fn kernel_name(self) -> &'static str {
        match self {
            KvFormat::F16 => "attention-decode-f16",
            KvFormat::Kv8 => "attention-decode-kv8",
        }
    }

    /// The library's prefill kernel over the same cache formats.
    pub fn prefill_kernel_name(self) -> &'static str {
        match self {
            KvFormat::F16 => "attention-prefill-f16",
            KvFormat::Kv8 => "attention-prefill-kv8",
        }
    }

    pub fn key_format(self) -> Format {
        match self {
            KvFormat::F16 => Format::F16,
            KvFormat::Kv8 => Format::I8Asym(Group::Row, ParamType::F32),
        }
    }

    pub fn value_format(self) -> Format {
        match self {
            KvFormat::F16 => Format::F16,
            KvFormat::Kv8 => Format::Fp8E4M3,
        }
    }
}

/// How a cache allocates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvCapacity {
    /// All at once, for at most this many tokens (appending more is an Err).
    Max(usize),
    /// In chunks of this many tokens, without limit.
    Chunked(usize),
}

/// One of K or V.
#[derive(Debug)]
enum Store {
    F16(Vec<f16>),
    /// One byte per element, one scale (and offset, if asymmetric) per row.
    Rows {
        format: Format,
        codes: Vec<u8>,
        scales: Vec<f32>,
        offsets: Vec<f32>,
    },
}

/// `v` reserved to hold `total` elements, or the error naming `what` and
/// the bytes asked for (a KV cache is sized by the caller: never abort).
fn try_hold<T>(v: &mut Vec<T>, total: usize, what: &str) -> Result<(), RuntimeError> {
    v.try_reserve_exact(total.saturating_sub(v.len()))
        .map_err(|_| RuntimeError::OutOfMemory {
            what: what.to_string(),
            bytes: total.saturating_mul(std::mem::size_of::<T>()),
        })
}

impl Store {
    fn new(format: Format, elems: usize, rows: usize) -> Result<Store, RuntimeError> {
        let mut store = match format {
            Format::F16 => Store::F16(Vec::new()),
            f => Store::Rows {
                format: f,
                codes: Vec::new(),
                scales: Vec::new(),
                offsets: Vec::new(),
            },
        };
        store.reserve(elems, rows)?;
        Ok(store)
    }

    fn reserve(&mut self, elems: usize, rows: usize) -> Result<(), RuntimeError> {
        match self {
            Store::F16(v) => try_hold(v, elems, "KV cache (f16 values)"),
            Store::Rows {
                format,
                codes,
                scales,
                offsets,
            } => {
                try_hold(codes, elems, "KV cache (codes)")?;
                if format.group().is_some() {
                    try_hold(scales, rows, "KV cache (row scales)")?;
                }
                if format.is_asymmetric() {
                    try_hold(offsets, rows, "KV cache (row offsets)")?;
                }
                Ok(())
            }
        }
    }

    /// Append `rows` rows of `d` values (already checked finite and sized).
    fn append(&mut self, rows: usize, d: usize, data: &[f32]) -> Result<(), RuntimeError> {
        match self {
            Store::F16(v) => v.extend(data.iter().map(|&x| f16::from_f32(x))),
            Store::Rows {
                format,
                codes,
                scales,
                offsets,
            } => {
                let t = quant::quantize(*format, rows, d, data)?;
                codes.extend_from_slice(&t.codes);
                scales.extend_from_slice(&t.scales);
                offsets.extend_from_slice(&t.offsets);
            }
        }
        Ok(())
    }

    /// The first `rows` rows, borrowed in place.
    fn view(&self, rows: usize, d: usize) -> KvView<'_> {
        match self {
            Store::F16(v) => KvView::F16(&v[..rows * d]),
            Store::Rows {
                format,
                codes,
                scales,
                offsets,
            } => KvView::QuantRows {
                format: *format,
                rows,
                cols: d,
                codes: &codes[..rows * d],
                scales: &scales[..if format.group().is_some() { rows } else { 0 }],
                offsets: &offsets[..if format.is_asymmetric() { rows } else { 0 }],
            },
        }
    }

    /// Exactly `rows` rows of `d`: new rows zero (written in place next),
    /// dropped rows forgotten. Within the reserved capacity.
    fn resize_rows(&mut self, rows: usize, d: usize) {
        match self {
            Store::F16(v) => v.resize(rows * d, f16::ZERO),
            Store::Rows {
                format,
                codes,
                scales,
                offsets,
            } => {
                codes.resize(rows * d, 0);
                if format.group().is_some() {
                    scales.resize(rows, 0.0);
                }
                if format.is_asymmetric() {
                    offsets.resize(rows, 0.0);
                }
            }
        }
    }

    /// Every row, writable, as the append kernel takes them.
    fn rows_mut(&mut self) -> KvRowsMut<'_> {
        match self {
            Store::F16(v) => KvRowsMut::F16(v),
            Store::Rows {
                codes,
                scales,
                offsets,
                ..
            } => KvRowsMut::Codes {
                codes,
                scales,
                offsets,
            },
        }
    }

    fn capacity_elems(&self) -> usize {
        match self {
            Store::F16(v) => v.capacity(),
            Store::Rows { codes, .. } => codes.capacity(),
        }
    }

    /// Base address (to show appends never move the buffer within a chunk).
    fn base(&self) -> usize {
        match self {
            Store::F16(v) => v.as_ptr() as usize,
            Store::Rows { codes, .. } => codes.as_ptr() as usize,
        }
    }
}

/// A KV cache `[s, kvh, d]` for one layer, appended in place.
#[derive(Debug)]
pub struct KvCache {
    format: KvFormat,
    kvh: usize,
    d: usize,
    len: usize,
    /// Tokens the buffers hold without reallocating.
    capacity: usize,
    mode: KvCapacity,
    growths: usize,
    storage: Storage,
}

/// Where the cached tokens live: host memory, or the device buffers of
/// the OpenCL device the attention runs on.
#[derive(Debug)]
enum Storage {
    Host {
        k: Store,
        v: Store,
    },
    #[cfg(feature = "opencl")]
    OpenCl {
        dev: Arc<crate::opencl::ClDevice>,
        cache: crate::opencl::ClKvCache,
    },
    #[cfg(feature = "cuda")]
    Cuda {
        dev: crate::cuda::CudaDevice,
        cache: Box<crate::cuda::CudaKvCache>,
    },
}

impl KvCache {
    /// A cache in host memory (what the host backends read).
    pub fn new(
        format: KvFormat,
        kvh: usize,
        d: usize,
        capacity: KvCapacity,
    ) -> Result<KvCache, RuntimeError> {
        let (tokens, rows, elems) = KvCache::check(kvh, d, capacity)?;
        let (k, v) = (
            Store::new(format.key_format(), elems, rows)?,
            Store::new(format.value_format(), elems, rows)?,
        );
        Ok(KvCache::empty(
            format,
            kvh,
            d,
            tokens,
            capacity,
            Storage::Host { k, v },
        ))
    }

    /// No tokens yet, room for `tokens` in `storage`.
    fn empty(
        format: KvFormat,
        kvh: usize,
        d: usize,
        tokens: usize,
        mode: KvCapacity,
        storage: Storage,
    ) -> KvCache {
        KvCache {
            format,
            kvh,
            d,
            len: 0,
            capacity: tokens,
            mode,
            growths: 0,
            storage,
        }
    }

    /// A cache where `device`'s attention reads it: device memory on
    /// OpenCL and CUDA (appended in place there; a growth copies on the
    /// device), host memory otherwise.
    pub fn for_device(
        device: &Device,
        format: KvFormat,
        kvh: usize,
        d: usize,
        capacity: KvCapacity,
    ) -> Result<KvCache, RuntimeError> {
        #[cfg(feature = "opencl")]
        if let Some(dev) = device.opencl() {
            let (tokens, _, _) = KvCache::check(kvh, d, capacity)?;
            let (k, v) = crate::gpu_kv::gpu_formats(format);
            let cache = crate::opencl::ClKvCache::new(dev, k, v, kvh, d, tokens)
                .map_err(|e| gpu_err(device, e))?;
            let storage = Storage::OpenCl {
                dev: Arc::clone(dev),
                cache,
            };
            return Ok(KvCache::empty(format, kvh, d, tokens, capacity, storage));
        }
        #[cfg(feature = "cuda")]
        if let Some(dev) = device.cuda() {
            let (tokens, _, _) = KvCache::check(kvh, d, capacity)?;
            let (k, v) = crate::gpu_kv::gpu_formats(format);
            let cache = crate::cuda::CudaKvCache::new(dev, k, v, kvh, d, tokens)
                .map_err(|e| gpu_err(device, e))?;
            let storage = Storage::Cuda {
                dev: dev.clone(),
                cache: Box::new(cache),
            };
            return Ok(KvCache::empty(format, kvh, d, tokens, capacity, storage));
        }
        let _ = device;
        KvCache::new(format, kvh, d, capacity)
    }

    /// Whether the tokens live in device buffers (not host memory).
    pub fn on_device(&self) -> bool {
        !matches!(self.storage, Storage::Host { .. })
    }

    /// (tokens, rows, elements) of a first allocation, checked.
    fn check(
        kvh: usize,
        d: usize,
        capacity: KvCapacity,
    ) -> Result<(usize, usize, usize), RuntimeError> {
        if kvh == 0 || d == 0 {
            return Err(shape(
                "KV cache kvh, d",
                "both ≥ 1",
                format!("kvh={kvh}, d={d}"),
            ));
        }
        let tokens = match capacity {
            KvCapacity::Max(n) | KvCapacity::Chunked(n) if n > 0 => n,
            _ => return Err(shape("KV cache capacity", "at least 1 token", 0)),
        };
        let rows = tokens
            .checked_mul(kvh)
            .ok_or_else(|| shape("KV cache tokens·kvh", "no overflow", "overflow"))?;
        let elems = rows
            .checked_mul(d)
            .ok_or_else(|| shape("KV cache tokens·kvh·d", "no overflow", "overflow"))?;
        Ok((tokens, rows, elems))
    }

    pub fn format(&self) -> KvFormat {
        self.format
    }

    /// Tokens cached.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Tokens the current allocation holds.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// How many times the allocation grew (by whole chunks).
    pub fn growths(&self) -> usize {
        self.growths
    }

    /// Base addresses of the K and V buffers (device buffer handles on a
    /// GPU); they change only on growth.
    pub fn addresses(&self) -> (usize, usize) {
        match &self.storage {
            Storage::Host { k, v } => (k.base(), v.base()),
            #[cfg(feature = "opencl")]
            Storage::OpenCl { cache, .. } => cache.addresses(),
            #[cfg(feature = "cuda")]
            Storage::Cuda { dev, cache } => cache.addresses(dev),
        }
    }

    /// Append `tokens` tokens of keys and values, each f32 `[tokens, kvh, d]`
    /// (stored in the cache's formats, quantized per row).
    pub fn append(&mut self, k: &[f32], v: &[f32], tokens: usize) -> Result<(), RuntimeError> {
        let row = self.check_rows(tokens, k.len(), v.len())?;
        if let Some(i) = k.iter().chain(v).position(|x| !x.is_finite()) {
            return Err(shape("K/V values", "finite", format!("element {i} is not")));
        }
        self.make_room(tokens)?;
        let rows = tokens * self.kvh;
        match &mut self.storage {
            Storage::Host { k: ks, v: vs } => {
                ks.append(rows, self.d, k)?;
                vs.append(rows, self.d, v)?;
                debug_assert!(ks.capacity_elems() >= self.capacity * row);
            }
            #[cfg(feature = "opencl")]
            Storage::OpenCl { dev, cache } => {
                let (ke, ve) = self.format.encode_rows(rows, self.d, k, v)?;
                cache
                    .write(dev, self.len, tokens, ke.rows(), ve.rows())
                    .map_err(|e| RuntimeError::Gpu {
                        backend: "opencl".into(),
                        why: e.to_string(),
                    })?;
            }
            #[cfg(feature = "cuda")]
            Storage::Cuda { dev, cache } => {
                let (ke, ve) = self.format.encode_rows(rows, self.d, k, v)?;
                cache
                    .write(dev, self.len, tokens, ke.rows(), ve.rows())
                    .map_err(|e| RuntimeError::Gpu {
                        backend: "cuda".into(),
                        why: e.to_string(),
                    })?;
            }
        }
        self.len += tokens;
        Ok(())
    }

    /// Append f16 keys and values `[tokens, kvh, d]` with the NEON append
    /// kernel `append`, in place in host storage; without one (or on a
    /// device cache), through the host encoder, which writes the same
    /// bytes (the kernel is the reference quantizer bit for bit).
    fn append_f16(
        &mut self,
        k: &[f16],
        v: &[f16],
        tokens: usize,
        append: Option<&AppendKernel>,
    ) -> Result<(), RuntimeError> {
        let row = self.check_rows(tokens, k.len(), v.len())?;
        let (Some(append), Storage::Host { .. }) = (append, &self.storage) else {
            let widen = |x: &[f16]| -> Result<Vec<f32>, RuntimeError> {
                let mut out = Vec::new();
                try_hold(&mut out, x.len(), "widened K/V rows")?;
                out.extend(x.iter().map(|h| h.to_f32()));
                Ok(out)
            };
            return self.append(&widen(k)?, &widen(v)?, tokens);
        };
        if let Some(i) = k.iter().chain(v).position(|x| !x.is_finite()) {
            return Err(shape("K/V values", "finite", format!("element {i} is not")));
        }
        self.make_room(tokens)?;
        let (len, kvh, d) = (self.len, self.kvh, self.d);
        #[allow(irrefutable_let_patterns)]
        let Storage::Host { k: ks, v: vs } = &mut self.storage else {
            return Err(shape("KV cache storage", "host memory", "a device"));
        };
        // The rows to write exist (reserved above: no reallocation).
        ks.resize_rows((len + tokens) * kvh, d);
        vs.resize_rows((len + tokens) * kvh, d);
        for i in 0..tokens {
            let written = append.run(
                &k[i * row..][..row],
                &v[i * row..][..row],
                ks.rows_mut(),
                vs.rows_mut(),
                len + i,
                kvh,
                d,
            );
            if let Err(e) = written {
                ks.resize_rows(len * kvh, d);
                vs.resize_rows(len * kvh, d);
                return Err(RuntimeError::NoKernel {
                    what: "KV append".into(),
                    why: e.to_string(),
                });
            }
        }
        self.len += tokens;
        Ok(())
    }

    /// `tokens` rows of keys and of values are `k_len` and `v_len`
    /// elements; returns the elements of one token (`kvh·d`).
    fn check_rows(&self, tokens: usize, k_len: usize, v_len: usize) -> Result<usize, RuntimeError> {
        let row = self.kvh * self.d;
        let elems = tokens
            .checked_mul(row)
            .ok_or_else(|| shape("tokens·kvh·d", "no overflow", "overflow"))?;
        check_len("keys elements (tokens·kvh·d)", elems, k_len)?;
        check_len("values elements (tokens·kvh·d)", elems, v_len)?;
        Ok(row)
    }

    /// Grow (by the capacity mode) so that `tokens` more fit.
    fn make_room(&mut self, tokens: usize) -> Result<(), RuntimeError> {
        let row = self.kvh * self.d;
        let want = self
            .len
            .checked_add(tokens)
            .ok_or_else(|| shape("KV cache tokens", "no overflow", "overflow"))?;
        if want > self.capacity {
            match self.mode {
                KvCapacity::Max(max) => {
                    return Err(RuntimeError::CacheFull {
                        len: self.len,
                        adding: tokens,
                        max,
                    });
                }
                KvCapacity::Chunked(chunk) => {
                    let overflow =
                        || shape("KV cache growth (tokens·kvh·d)", "no overflow", "overflow");
                    let grown = want
                        .max(self.capacity.saturating_mul(2))
                        .div_ceil(chunk)
                        .checked_mul(chunk)
                        .ok_or_else(overflow)?;
                    let grown_rows = grown.checked_mul(self.kvh).ok_or_else(overflow)?;
                    let grown_elems = grown.checked_mul(row).ok_or_else(overflow)?;
                    match &mut self.storage {
                        Storage::Host { k, v } => {
                            k.reserve(grown_elems, grown_rows)?;
                            v.reserve(grown_elems, grown_rows)?;
                        }
                        #[cfg(feature = "opencl")]
                        Storage::OpenCl { dev, cache } => {
                            cache
                                .grow(dev, grown, self.len)
                                .map_err(|e| RuntimeError::Gpu {
                                    backend: "opencl".into(),
                                    why: e.to_string(),
                                })?;
                        }
                        #[cfg(feature = "cuda")]
                        Storage::Cuda { dev, cache } => {
                            cache
                                .grow(dev, grown, self.len)
                                .map_err(|e| RuntimeError::Gpu {
                                    backend: "cuda".into(),
                                    why: e.to_string(),
                                })?;
                        }
                    }
                    self.capacity = grown;
                    self.growths += 1;
                    tracing::debug!(tokens = grown, "KV cache grew");
                }
            }
        }
        Ok(())
    }

    /// Forget every token, keeping the allocation.
    pub fn clear(&mut self) {
        #[allow(irrefutable_let_patterns)]
        let Storage::Host { k, v } = &mut self.storage else {
            // Device buffers: the length is all that marks tokens valid.
            self.len = 0;
            return;
        };
        for store in [k, v] {
            match store {
                Store::F16(v) => v.clear(),
                Store::Rows {
                    codes,
                    scales,
                    offsets,
                    ..
                } => {
                    codes.clear();
                    scales.clear();
                    offsets.clear();
                }
            }
        }
        self.len = 0;
    }

    /// The first `tokens` tokens (at most [`KvCache::len`]) as the host
    /// attention kernels read them, in place; `None` for a device cache.
    pub fn views(&self, tokens: usize) -> Option<(KvView<'_>, KvView<'_>)> {
        if tokens > self.len {
            return None;
        }
        let rows = tokens * self.kvh;
        match &self.storage {
            Storage::Host { k, v } => Some((k.view(rows, self.d), v.view(rows, self.d))),
            #[cfg(feature = "opencl")]
            Storage::OpenCl { .. } => None,
            #[cfg(feature = "cuda")]
            Storage::Cuda { .. } => None,
        }
    }
}

#[cfg(any(feature = "opencl", feature = "cuda"))]
fn gpu_err(device: &Device, e: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Gpu {
        backend: device.backend().to_string(),
        why: e.to_string(),
    }
}

/// Multi-head (GQA) attention with f16 queries already scaled by 1/sqrt(d)
/// and f16 output.
pub struct Attention {
    device: Arc<Device>,
    hq: usize,
    kvh: usize,
    d: usize,
    format: KvFormat,
    kernel: AttentionKernel,
    /// The device's whole-prefill kernel (x86, NEON: row blocks × key blocks),
    /// where it has one; else prefill runs the decode kernel per token.
    prefill: Option<Arc<HostAttention>>,
    /// The device's own KV append (the JIT NEON device's emitted kernel).
    kv_append: Option<Arc<AppendKernel>>,
}

/// The decode kernel an [`Attention`] runs.
enum AttentionKernel {
    Host(Arc<HostAttention>),
    /// The split-K decode program, and the fused prefill program for this
    /// head dim where the GPU prefill takes it (d ≤ 256; else prefill
    /// decodes per prompt token).
    #[cfg(feature = "opencl")]
    OpenCl(
        Arc<crate::opencl::ClAttention>,
        Option<Arc<crate::opencl::ClPrefill>>,
    ),
    /// The split-K PTX pair, loaded once, and the tensor-core prefill
    /// program for this head dim where it takes it (else prefill decodes
    /// per prompt token); both read a device cache.
    #[cfg(feature = "cuda")]
    Cuda(
        Arc<crate::cuda::CudaAttention>,
        Option<Arc<crate::cuda::CudaPrefill>>,
    ),
}

impl std::fmt::Debug for Attention {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attention")
            .field("hq", &self.hq)
            .field("kvh", &self.kvh)
            .field("d", &self.d)
            .field("format", &self.format)
            .finish()
    }
}

/// A borrowed cache view as the owned value the CUDA launcher uploads.
/// Split items of the given costs into one contiguous range per weight, each
/// with a share of the total cost proportional to its weight.
fn split_by_cost(costs: &[usize], weights: &[f64]) -> Vec<Range<usize>> {
    let total: f64 = costs.iter().map(|&c| c as f64).sum();
    let w: Vec<f64> = weights
        .iter()
        .map(|&w| if w.is_finite() && w > 0.0 { w } else { 0.0 })
        .collect();
    let wsum: f64 = w.iter().sum();
    let w = if wsum > 0.0 {
        w
    } else {
        vec![1.0; weights.len().max(1)]
    };
    let wsum: f64 = w.iter().sum();
    let mut out = Vec::with_capacity(w.len());
    let (mut start, mut acc, mut target) = (0usize, 0f64, 0f64);
    let mut i = 0;
    for (j, wj) in w.iter().enumerate() {
        target += total * wj / wsum;
        let last = j + 1 == w.len();
        while i < costs.len() && (last || acc + costs[i] as f64 / 2.0 <= target) {
            acc += costs[i] as f64;
            i += 1;
        }
        out.push(start..i);
        start = i;
    }
    out
}

impl Attention {
    /// Attention with `hq` query heads over `kvh` KV heads of dimension `d`.
    pub fn new(
        device: &Arc<Device>,
        hq: usize,
        kvh: usize,
        d: usize,
        format: KvFormat,
    ) -> Result<Attention, RuntimeError> {
        if kvh == 0 || hq == 0 || !hq.is_multiple_of(kvh) {
            return Err(shape(
                "query heads",
                format!("a positive multiple of kv heads {kvh}"),
                hq,
            ));
        }
        if d == 0 {
            return Err(shape("head dimension", "at least 1", d));
        }
        let kernel = match device.backend() {
            #[cfg(feature = "opencl")]
            crate::Backend::OpenCl => AttentionKernel::OpenCl(
                device.cl_attention(format.kernel_name())?,
                (d <= tessera_codegen::gpu::PREFILL_MAX_HEAD_DIM as usize)
                    .then(|| device.cl_prefill(format.prefill_kernel_name(), d))
                    .transpose()?,
            ),
            #[cfg(feature = "cuda")]
            crate::Backend::Cuda => {
                let engine = device.cuda_engine()?;
                AttentionKernel::Cuda(
                    engine.attention(format.kernel_name())?,
                    engine.prefill(format.prefill_kernel_name(), d)?,
                )
            }
            #[cfg(not(feature = "cuda"))]
            crate::Backend::Cuda => {
                return Err(RuntimeError::Unsupported {
                    backend: "cuda".into(),
                    what: "decode attention (this build has no `cuda` feature)".into(),
                });
            }
            _ => AttentionKernel::Host(device.decode_attention(format, hq, kvh, d)?),
        };
        let (kv_append, prefill) = match kernel {
            AttentionKernel::Host(_) => (
                device.kv_append(format.kernel_name())?,
                device.prefill_attention(format.prefill_kernel_name(), hq, kvh, d)?,
            ),
            #[allow(unreachable_patterns)]
            _ => (None, None),
        };
        Ok(Attention {
            device: Arc::clone(device),
            hq,
            kvh,
            d,
            format,
            kernel,
            prefill,
            kv_append,
        })
    }

    /// Append `tokens` tokens of f16 keys and values `[tokens, kvh, d]`
    /// (as the projections produce them) to `cache`, in place and in its
    /// formats. On the JIT NEON device the NEON emitter's append kernel
    /// writes them; elsewhere the cache's own encoder, which writes the
    /// same bytes.
    pub fn append(
        &self,
        cache: &mut KvCache,
        k: &[f16],
        v: &[f16],
        tokens: usize,
    ) -> Result<(), RuntimeError> {
        if cache.format != self.format || cache.kvh != self.kvh || cache.d != self.d {
            return Err(shape(
                "KV cache (format, kvh, d)",
                format!("({:?}, {}, {})", self.format, self.kvh, self.d),
                format!("({:?}, {}, {})", cache.format, cache.kvh, cache.d),
            ));
        }
        cache.append_f16(k, v, tokens, self.kv_append.as_deref())
    }

    /// Whether [`Attention::prefill`] runs a whole-prefill kernel (each K/V
    /// block read once per block of query rows) rather than the decode
    /// kernel per prompt token.
    pub fn prefills_whole(&self) -> bool {
        match &self.kernel {
            #[cfg(feature = "opencl")]
            AttentionKernel::OpenCl(_, pre) => pre.is_some(),
            #[cfg(feature = "cuda")]
            AttentionKernel::Cuda(_, pre) => pre.is_some(),
            _ => self.prefill.is_some(),
        }
    }

    /// The blocks (query rows × keys) of the whole-prefill kernel this
    /// attention runs on the host, if it has one (the record's measured
    /// blocks on a tuned device, else the default).
    pub fn prefill_blocks(&self) -> Option<tessera_codegen::artifact::PrefillBlocks> {
        self.prefill.as_ref().and_then(|p| p.prefill_blocks())
    }

    /// Whether [`Attention::append`] runs an emitted append kernel (the
    /// JIT NEON device) rather than the host encoder.
    pub fn appends_in_kernel(&self) -> bool {
        self.kv_append.is_some()
    }

    fn check_cache(&self, cache: &KvCache) -> Result<(), RuntimeError> {
        if cache.format != self.format {
            return Err(shape(
                "KV cache format",
                format!("{:?}", self.format),
                format!("{:?}", cache.format),
            ));
        }
        if cache.kvh != self.kvh || cache.d != self.d {
            return Err(shape(
                "KV cache [kvh, d]",
                format!("[{}, {}]", self.kvh, self.d),
                format!("[{}, {}]", cache.kvh, cache.d),
            ));
        }
        if cache.len == 0 {
            return Err(shape("KV cache tokens", "at least 1", 0));
        }
        Ok(())
    }

    /// One query token (`q`, `o`: f16 `[hq, d]`) over every cached token.
    /// Returns how many rows the asynchronous softmax recomputed.
    pub fn decode(&self, q: &[f16], cache: &KvCache, o: &mut [f16]) -> Result<u64, RuntimeError> {
        self.check_cache(cache)?;
        let hd = self.hq * self.d;
        check_len("q elements (hq·d)", hd, q.len())?;
        check_len("o elements (hq·d)", hd, o.len())?;
        match &self.kernel {
            AttentionKernel::Host(kernel) => {
                let (k, v) = self.host_views(cache, cache.len)?;
                // The device's persistent pool: a decode step spawns no
                // thread (tens of µs per layer on a VM).
                let pool = self.device.pool();
                Ok(kernel.run_on(
                    q,
                    k,
                    v,
                    cache.len,
                    self.hq,
                    self.kvh,
                    self.d,
                    o,
                    pool.threads(),
                    &|job| pool.run(job),
                )?)
            }
            #[cfg(feature = "opencl")]
            AttentionKernel::OpenCl(kernel, _) => self.decode_cl(kernel, q, cache, cache.len, o),
            #[cfg(feature = "cuda")]
            AttentionKernel::Cuda(program, _) => self.decode_cuda(program, q, cache, cache.len, o),
        }
    }

    /// One token over the first `s` cached tokens on a GPU kernel; `None`
    /// for a host kernel (the host splits its work across threads instead).
    fn decode_gpu(
        &self,
        q: &[f16],
        cache: &KvCache,
        s: usize,
        o: &mut [f16],
    ) -> Option<Result<u64, RuntimeError>> {
        let _ = (q, cache, s, &o);
        match &self.kernel {
            AttentionKernel::Host(_) => None,
            #[cfg(feature = "opencl")]
            AttentionKernel::OpenCl(kernel, _) => Some(self.decode_cl(kernel, q, cache, s, o)),
            #[cfg(feature = "cuda")]
            AttentionKernel::Cuda(program, _) => Some(self.decode_cuda(program, q, cache, s, o)),
        }
    }

    /// One token over the first `s` cached tokens on the CUDA device.
    #[cfg(feature = "cuda")]
    fn decode_cuda(
        &self,
        kernel: &crate::cuda::CudaAttention,
        q: &[f16],
        cache: &KvCache,
        s: usize,
        o: &mut [f16],
    ) -> Result<u64, RuntimeError> {
        let (dev, cu) = self.cuda_cache(cache)?;
        let n = crate::cuda::attention_into(dev, kernel, q, cu, s, self.hq, o)
            .map_err(|e| gpu_err(&self.device, e))?;
        Ok(n as u64)
    }

    /// The `t` prompt tokens over the whole device cache in one launch of
    /// the tensor-core prefill program.
    #[cfg(feature = "cuda")]
    fn prefill_cuda(
        &self,
        pre: &crate::cuda::CudaPrefill,
        q: &[f16],
        t: usize,
        cache: &KvCache,
        o: &mut [f16],
    ) -> Result<(), RuntimeError> {
        let (dev, cu) = self.cuda_cache(cache)?;
        crate::cuda::prefill_into(dev, pre, q, cu, t, cache.len, self.hq, o)
            .map_err(|e| gpu_err(&self.device, e))
    }

    /// The device and buffers of `cache`, which must live in this
    /// attention's CUDA context.
    #[cfg(feature = "cuda")]
    fn cuda_cache<'c>(
        &self,
        cache: &'c KvCache,
    ) -> Result<(&'c crate::cuda::CudaDevice, &'c crate::cuda::CudaKvCache), RuntimeError> {
        let Storage::Cuda { dev, cache: cu } = &cache.storage else {
            return Err(shape(
                "KV cache location",
                "CUDA device memory (KvCache::for_device)",
                "host memory",
            ));
        };
        let engine = self.device.cuda_engine()?;
        if !Arc::ptr_eq(engine.dev.context(), dev.context()) {
            return Err(shape(
                "KV cache device",
                "the attention's CUDA context",
                "another context",
            ));
        }
        Ok((dev, cu))
    }

    fn host_views<'c>(
        &self,
        cache: &'c KvCache,
        tokens: usize,
    ) -> Result<(KvView<'c>, KvView<'c>), RuntimeError> {
        cache.views(tokens).ok_or_else(|| {
            shape(
                "KV cache location",
                format!("host memory (attention runs on {})", self.device.backend()),
                "device buffers",
            )
        })
    }

    /// One token over the first `s` cached tokens on the OpenCL device.
    #[cfg(feature = "opencl")]
    fn decode_cl(
        &self,
        kernel: &crate::opencl::ClAttention,
        q: &[f16],
        cache: &KvCache,
        s: usize,
        o: &mut [f16],
    ) -> Result<u64, RuntimeError> {
        let (dev, cl) = self.cl_cache(cache)?;
        let n = crate::opencl::attention_into(dev, kernel, q, cl, s, self.hq, o)
            .map_err(|e| gpu_err(&self.device, e))?;
        Ok(n as u64)
    }

    /// The device and buffers of `cache`, which must live on this
    /// attention's OpenCL device.
    #[cfg(feature = "opencl")]
    fn cl_cache<'c>(
        &self,
        cache: &'c KvCache,
    ) -> Result<
        (
            &'c Arc<crate::opencl::ClDevice>,
            &'c crate::opencl::ClKvCache,
        ),
        RuntimeError,
    > {
        let Storage::OpenCl { dev, cache: cl } = &cache.storage else {
            return Err(shape(
                "KV cache location",
                "OpenCL device buffers (KvCache::for_device)",
                "host memory",
            ));
        };
        let same = self
            .device
            .opencl()
            .is_some_and(|mine| Arc::ptr_eq(mine, dev));
        if !same {
            return Err(shape(
                "KV cache device",
                "the attention's OpenCL device",
                "another device",
            ));
        }
        Ok((dev, cl))
    }

    /// The `t` prompt tokens over the whole device cache in one launch of
    /// the OpenCL prefill program.
    #[cfg(feature = "opencl")]
    fn prefill_cl(
        &self,
        pre: &crate::opencl::ClPrefill,
        q: &[f16],
        t: usize,
        cache: &KvCache,
        o: &mut [f16],
    ) -> Result<(), RuntimeError> {
        let (dev, cl) = self.cl_cache(cache)?;
        crate::opencl::prefill_into(dev, pre, q, cl, t, cache.len, self.hq, o)
            .map_err(|e| gpu_err(&self.device, e))
    }

    /// A prompt chunk in one call: its keys and values (f16 `[t, kvh, d]`,
    /// as the projections produce them) appended to `cache` in place and in
    /// its formats ([`Attention::append`]), then its `t` query tokens (`q`,
    /// `o`: f16 `[t, hq, d]`) attended causally over everything cached
    /// ([`Attention::prefill`]). q and o are checked first, so a call
    /// refused for their shapes leaves the cache as it was.
    pub fn append_prefill(
        &self,
        cache: &mut KvCache,
        q: &[f16],
        k: &[f16],
        v: &[f16],
        t: usize,
        o: &mut [f16],
    ) -> Result<u64, RuntimeError> {
        let elems = t
            .checked_mul(self.hq * self.d)
            .ok_or_else(|| shape("t·hq·d", "no overflow", "overflow"))?;
        check_len("q elements (t·hq·d)", elems, q.len())?;
        check_len("o elements (t·hq·d)", elems, o.len())?;
        self.append(cache, k, v, t)?;
        self.prefill(q, t, cache, o)
    }

    /// The last `t` cached tokens as queries (`q`, `o`: f16 `[t, hq, d]`),
    /// causal: append the prompt's K/V first. Returns recomputed rows.
    pub fn prefill(
        &self,
        q: &[f16],
        t: usize,
        cache: &KvCache,
        o: &mut [f16],
    ) -> Result<u64, RuntimeError> {
        self.check_cache(cache)?;
        let hd = self.hq * self.d;
        let elems = t
            .checked_mul(hd)
            .ok_or_else(|| shape("t·hq·d", "no overflow", "overflow"))?;
        check_len("q elements (t·hq·d)", elems, q.len())?;
        check_len("o elements (t·hq·d)", elems, o.len())?;
        if t > cache.len {
            return Err(shape(
                "prefill tokens",
                format!("at most the {} cached tokens", cache.len),
                t,
            ));
        }
        if t == 0 {
            return Ok(0);
        }
        let first = cache.len - t;
        #[cfg(feature = "opencl")]
        if let AttentionKernel::OpenCl(_, Some(pre)) = &self.kernel {
            return self.prefill_cl(pre, q, t, cache, o).map(|()| 0);
        }
        #[cfg(feature = "cuda")]
        if let AttentionKernel::Cuda(_, Some(pre)) = &self.kernel {
            return self.prefill_cuda(pre, q, t, cache, o).map(|()| 0);
        }
        if !matches!(self.kernel, AttentionKernel::Host(_)) {
            // A GPU decodes per prompt token over its causal prefix, in
            // order (one queue); a dedicated prefill kernel would reuse
            // K/V rows.
            let mut recomputed = 0;
            for i in 0..t {
                let rows = i * hd..(i + 1) * hd;
                if let Some(n) =
                    self.decode_gpu(&q[rows.clone()], cache, first + i + 1, &mut o[rows])
                {
                    recomputed += n?;
                }
            }
            return Ok(recomputed);
        }
        #[allow(irrefutable_let_patterns)]
        let AttentionKernel::Host(decode) = &self.kernel else {
            return Err(shape("attention kernel", "a host kernel", "a GPU kernel"));
        };
        let weights = self.device.core_weights();
        if let Some(whole) = &self.prefill
            && weights.windows(2).all(|w| w[0] == w[1])
        {
            // Equal cores: the kernel's own split over the pool (whole KV
            // heads per worker where they divide evenly).
            let (k, v) = self.host_views(cache, cache.len)?;
            let pool = self.device.pool();
            return Ok(whole.prefill_on(
                q,
                k,
                v,
                t,
                cache.len,
                self.hq,
                self.kvh,
                self.d,
                o,
                pool.threads(),
                &|job| pool.run(job),
            )?);
        }
        let kernel = self.prefill.as_ref().unwrap_or(decode);
        self.host_views(cache, cache.len)?;
        let costs: Vec<usize> = (0..t).map(|i| first + i + 1).collect();
        let ranges = split_by_cost(&costs, &weights);
        // Each worker owns the output rows of its tokens: ranges are
        // contiguous and in order, so `o` splits into one slice each.
        let mut owned: Vec<Mutex<&mut [f16]>> = Vec::with_capacity(ranges.len());
        let mut rest = o;
        for r in &ranges {
            let (mine, tail) = std::mem::take(&mut rest).split_at_mut(r.len() * hd);
            owned.push(Mutex::new(mine));
            rest = tail;
        }
        let failure: Mutex<Option<RuntimeError>> = Mutex::new(None);
        let recomputed = std::sync::atomic::AtomicU64::new(0);
        let work = |worker: usize| {
            let (Some(range), Some(slot)) = (ranges.get(worker), owned.get(worker)) else {
                return;
            };
            if range.is_empty() {
                return;
            }
            let mut out = slot.lock().unwrap_or_else(|e| e.into_inner());
            // This worker's tokens are a prefill of their own: the last
            // sees the first `first + range.end` cached tokens.
            let s = first + range.end;
            let Some((k, v)) = cache.views(s) else {
                return;
            };
            match kernel.prefill(
                &q[range.start * hd..range.end * hd],
                k,
                v,
                range.len(),
                s,
                self.hq,
                self.kvh,
                self.d,
                &mut out,
                1,
            ) {
                Ok(n) => {
                    recomputed.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
                }
                Err(e) => {
                    *failure.lock().unwrap_or_else(|e| e.into_inner()) = Some(e.into());
                }
            }
        };
        if ranges.len() == 1 {
            work(0);
        } else {
            self.device.pool().run(&work);
        }
        if let Some(e) = failure.into_inner().unwrap_or_else(|e| e.into_inner()) {
            return Err(e);
        }
        Ok(recomputed.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::split_by_cost;

    #[test]
    fn cost_split_is_contiguous_complete_and_balanced() {
        let costs: Vec<usize> = (1..=100).collect();
        let r = split_by_cost(&costs, &[1.0, 1.0]);
        assert_eq!(r[0].start, 0);
        assert_eq!(r[0].end, r[1].start);
        assert_eq!(r[1].end, 100);
        let a: usize = costs[r[0].clone()].iter().sum();
        let b: usize = costs[r[1].clone()].iter().sum();
        assert!(a.abs_diff(b) <= 100, "{a} vs {b}");
        let r = split_by_cost(&[5], &[1.0, 1.0, 1.0]);
        assert_eq!(r.iter().map(|r| r.len()).sum::<usize>(), 1);
        assert_eq!(r.last().unwrap().end, 1);
    }
}
