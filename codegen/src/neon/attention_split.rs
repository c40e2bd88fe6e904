//! Flash-decoding on NEON: one decode step split over the KV sequence as
//! well as the heads, for long contexts with few KV heads (at batch 1,
//! `HostAttention`'s split over KV heads leaves cores idle when kvh <
//! threads).
//!
//! Each job is one query head over one chunk of the cache: the decode
//! kernel of [`super::attention`], called with `s` = the chunk length and
//! K/V (and the key scales and offsets) pointing at the chunk's first row,
//! reading the cache in place. The kernel leaves its softmax state in
//! scratch (the unnormalised `num[d]`, `den` and the max `m` its
//! exponentials were taken against: the running max, or `phi` when the
//! unified-max softmax held for that chunk). The combine step is on the
//! host, per head: `o = Σ_c e^(m_c − M)·num_c / Σ_c e^(m_c − M)·den_c` with
//! `M = max_c m_c`. A head counts as recomputed when any of its chunks fell
//! back to the online softmax, which is when one of its scores was out of
//! range: the interpreter's rule.

use half::f16;
use tessera_dsl::ir::{AttentionKind, Format, Group, Kernel};

use super::attention_prefill::prefix;
use crate::abi::KernelFn;
use crate::artifact::MachineCode;
use crate::host_attention::{AttentionArgs, AttentionError, KvCache};
use crate::jit::JitCode;

/// A decode attention kernel mapped for split-sequence calls.
pub struct NeonSplitDecode {
    keys: Format,
    values: Format,
    code: JitCode,
}

impl std::fmt::Debug for NeonSplitDecode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NeonSplitDecode")
            .field("keys", &self.keys)
            .field("values", &self.values)
            .finish()
    }
}

fn shape(what: &'static str, expected: impl ToString, got: impl ToString) -> AttentionError {
    AttentionError::Shape {
        what,
        expected: expected.to_string(),
        got: got.to_string(),
    }
}

/// Raw pointers of one validated cache side: codes, per-row scales and
/// offsets (null when the format has none), bytes per element.
#[derive(Clone, Copy)]
struct Side {
    data: *const u8,
    scales: *const f32,
    offsets: *const f32,
    bytes: usize,
}

fn side(c: KvCache<'_>, want: Format, rows: usize, cols: usize) -> Result<Side, AttentionError> {
    match prefix(c, rows, cols)? {
        KvCache::F16(x) if want == Format::F16 => Ok(Side {
            data: x.as_ptr() as *const u8,
            scales: std::ptr::null(),
            offsets: std::ptr::null(),
            bytes: 2,
        }),
        KvCache::QuantRows {
            format,
            codes,
            scales,
            offsets,
            ..
        } if format == want && want != Format::F16 => {
            let per_row = format.group() == Some(Group::Row);
            let want_scales = if per_row { rows } else { 0 };
            let want_offsets = if format.is_asymmetric() { rows } else { 0 };
            if scales.len() != want_scales {
                return Err(shape("cache scales", want_scales, scales.len()));
            }
            if offsets.len() != want_offsets {
                return Err(shape("cache offsets", want_offsets, offsets.len()));
            }
            let ptr = |v: &[f32]| {
                if v.is_empty() {
                    std::ptr::null()
                } else {
                    v.as_ptr()
                }
            };
            Ok(Side {
                data: codes.as_ptr(),
                scales: ptr(scales),
                offsets: ptr(offsets),
                bytes: 1,
            })
        }
        _ => Err(shape("cache format", want, "another format")),
    }
}

/// One job's result: the chunk's softmax state and whether it recomputed.
struct Partial {
    num: Vec<f32>,
    den: f32,
    max: f32,
    recomputed: u64,
}

struct Shared(AttentionArgs, Side, Side);
// SAFETY: the pointers refer to buffers borrowed for the whole scoped call;
// every job writes only its own o, scratch and counter.
unsafe impl Sync for Shared {}

impl Shared {
    /// By method, so closures capture the whole (Sync) struct.
    fn get(&self) -> (AttentionArgs, Side, Side) {
        (self.0, self.1, self.2)
    }
}

impl NeonSplitDecode {
    /// `kernel` a decode attention kernel, `code` what the NEON backend
    /// emitted for it.
    pub fn new(kernel: &Kernel, code: &MachineCode) -> Result<NeonSplitDecode, AttentionError> {
        let a = match kernel.as_attention() {
            Some(a) if a.kind == AttentionKind::Decode => a,
            _ => {
                return Err(AttentionError::NotDecode {
                    kernel: kernel.name.clone(),
                });
            }
        };
        let fmt = |n: &str| {
            kernel
                .tensor(n)
                .map(|t| t.format)
                .ok_or_else(|| shape("tensor", n, "missing"))
        };
        Ok(NeonSplitDecode {
            keys: fmt(&a.k)?,
            values: fmt(&a.v)?,
            code: JitCode::map(code)?,
        })
    }

    /// Like `HostAttention::run`, with the sequence cut into chunks of
    /// `chunk` tokens (the last one shorter) run as separate jobs.
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
        chunk: usize,
    ) -> Result<u64, AttentionError> {
        if kvh == 0 || !hq.is_multiple_of(kvh) {
            return Err(shape(
                "query heads",
                format!("a multiple of kv heads {kvh}"),
                hq,
            ));
        }
        if s == 0 || chunk == 0 {
            return Err(shape(
                "sequence length and chunk",
                "at least 1",
                format!("{s}, {chunk}"),
            ));
        }
        let row = hq
            .checked_mul(d)
            .ok_or_else(|| shape("hq·d", "no overflow", "overflow"))?;
        if q.len() != row || o.len() != row {
            return Err(shape(
                "q and o elements (hq·d)",
                row,
                format!("{}, {}", q.len(), o.len()),
            ));
        }
        let rows = s
            .checked_mul(kvh)
            .ok_or_else(|| shape("s·kvh", "no overflow", "overflow"))?;
        rows.checked_mul(d)
            .ok_or_else(|| shape("s·kvh·d", "no overflow", "overflow"))?;
        let ks = side(k, self.keys, rows, d)?;
        let vs = side(v, self.values, rows, d)?;
        let chunks = s.div_ceil(chunk);
        let jobs: Vec<(usize, usize)> = (0..hq)
            .flat_map(|h| (0..chunks).map(move |c| (h, c)))
            .collect();
        let base = Shared(
            AttentionArgs {
                q: q.as_ptr() as *const u8,
                k: std::ptr::null(),
                k_scales: std::ptr::null(),
                k_offsets: std::ptr::null(),
                v: std::ptr::null(),
                o: std::ptr::null_mut(),
                scratch: std::ptr::null_mut(),
                recomputed: std::ptr::null_mut(),
                s: 0,
                hq,
                kvh,
                d,
                head0: 0,
                heads: 1,
            },
            ks,
            vs,
        );
        let entry = self.code.entry() as usize;
        let run_job = |&(h, c): &(usize, usize)| -> Partial {
            let (args0, ks, vs) = base.get();
            let s0 = c * chunk;
            let len = chunk.min(s - s0);
            let r0 = s0 * kvh;
            let mut scratch = vec![0f32; len + 3 * d];
            let mut out = vec![f16::ZERO; hq * d];
            let mut counter = 0u64;
            let off = |p: *const f32| {
                if p.is_null() { p } else { p.wrapping_add(r0) }
            };
            let args = AttentionArgs {
                k: ks.data.wrapping_add(r0 * d * ks.bytes),
                k_scales: off(ks.scales),
                k_offsets: off(ks.offsets),
                v: vs.data.wrapping_add(r0 * d * vs.bytes),
                o: out.as_mut_ptr() as *mut u8,
                scratch: scratch.as_mut_ptr(),
                recomputed: &mut counter,
                s: len,
                head0: h,
                heads: 1,
                ..args0
            };
            // SAFETY: the code is the decode kernel of this kernel's formats
            // (AttentionArgs ABI); rows r0 .. r0 + len·kvh of both caches and
            // their parameters lie within the `s·kvh` rows validated above;
            // q holds hq·d f16, `out` hq·d, the scratch len + 3·d f32.
            unsafe {
                let f: KernelFn<AttentionArgs> = std::mem::transmute(entry as *const u8);
                f(&args);
            }
            Partial {
                num: scratch[len + d..len + 2 * d].to_vec(),
                den: if d > 0 { scratch[len] } else { 0.0 },
                max: if d > 0 { scratch[len + 2 * d] } else { 0.0 },
                recomputed: counter,
            }
        };
        let threads = threads.clamp(1, jobs.len());
        let per = jobs.len().div_ceil(threads);
        let partials: Vec<Partial> = if threads == 1 {
            jobs.iter().map(run_job).collect()
        } else {
            std::thread::scope(|sc| {
                let handles: Vec<_> = jobs
                    .chunks(per)
                    .map(|js| {
                        let run_job = &run_job;
                        sc.spawn(move || js.iter().map(run_job).collect::<Vec<_>>())
                    })
                    .collect();
                handles
                    .into_iter()
                    .flat_map(|h| h.join().expect("attention job panicked"))
                    .collect()
            })
        };
        let mut recomputed = 0;
        for (h, parts) in partials.chunks(chunks).enumerate() {
            let m = parts
                .iter()
                .map(|p| p.max)
                .fold(f32::NEG_INFINITY, f32::max);
            let w: Vec<f32> = parts.iter().map(|p| (p.max - m).exp()).collect();
            let den: f32 = parts.iter().zip(&w).map(|(p, w)| p.den * w).sum();
            for i in 0..d {
                let num: f32 = parts.iter().zip(&w).map(|(p, w)| p.num[i] * w).sum();
                o[h * d + i] = f16::from_f32(num / den);
            }
            recomputed += u64::from(parts.iter().any(|p| p.recomputed > 0));
        }
        Ok(recomputed)
    }
}
