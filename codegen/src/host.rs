//! Running emitted matmul kernels on this host, safely.
//!
//! [`HostMatmul`] owns the mapped code of one matmul kernel instance (and of
//! its activation quantizer when x is `i8dyn`); [`HostWeights`] holds weights
//! packed once, in the layout the kernel's IR declares, for the tile it was
//! emitted with. [`HostMatmul::run`] checks every shape, length and format
//! before the single `unsafe` call per thread, then splits the output
//! channels across threads by whole hp-panels.
//!
//! The backend-independent part of every host backend (x86, cranelift,
//! NEON on an aarch64 host) lives here, so each backend only emits code.
//!
//! Parameters (`w_params`) order: for CPU panel layouts `[h/hp, ...]`, per
//! panel p: its scales `[groups, hp]` then, for asymmetric formats, its
//! offsets `[groups, hp]` (so one panel's parameters are contiguous: panel
//! stride = groups·hp·(1 or 2) parameters). For other layouts (GPU `[l/lp,
//! h, lp]`): scales `[groups, n_pad]` then offsets `[groups, n_pad]`, where
//! `n_pad` is n rounded up to hp. Each parameter is stored in the format's
//! [`ParamType`]: 4 bytes (f32) or 2 (f16 bits), little-endian.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use half::{bf16, f16};
use tessera_dsl::ir::{Format, Kernel, Matmul, ParamType};
use tessera_dsl::quant::{
    self, PackPlan, ParamOrder, QuantError, QuantTensor, groups_per_row, pack_params,
};

use crate::abi::{KernelFn, MatmulArgs, QuantizeArgs};
use crate::aligned::AlignedBytes;
use crate::artifact::MachineCode;
use crate::jit::{JitCode, JitError};
use crate::tile::TileConfig;

/// Why a host kernel cannot be prepared or called.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("kernel `{kernel}` is not a matmul")]
    NotMatmul { kernel: String },
    #[error("kernel `{kernel}` has x format {format}, which needs {need}")]
    Quantizer {
        kernel: String,
        format: Format,
        need: &'static str,
    },
    #[error("{what}: expected {expected}, got {got}")]
    Shape {
        what: &'static str,
        expected: String,
        got: String,
    },
    #[error("weights were packed for {packed}, this kernel needs {needed}")]
    WeightsMismatch { packed: String, needed: String },
    #[error("{0}")]
    Quant(#[from] QuantError),
    #[error("{0}")]
    Jit(#[from] JitError),
    #[error("size overflow computing {0}")]
    Overflow(&'static str),
}

/// Activations as the caller holds them.
#[derive(Clone, Copy, Debug)]
pub enum HostInput<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    BF16(&'a [bf16]),
}

/// Output buffer as the caller holds it.
#[derive(Debug)]
pub enum HostOutput<'a> {
    F32(&'a mut [f32]),
    F16(&'a mut [f16]),
    BF16(&'a mut [bf16]),
}

/// Weights in their source form.
#[derive(Clone, Copy, Debug)]
pub enum WeightsIn<'a> {
    /// f32 `[n, k]` row-major, converted or quantized to the kernel's format.
    F32(&'a [f32]),
    /// Already quantized (rows n, cols k) in the kernel's format.
    Quant(&'a QuantTensor),
}

/// The tile sizes a kernel instance was emitted for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HostTile {
    pub ep: usize,
    pub hp: usize,
    pub lp: usize,
}

impl HostTile {
    /// Whether weights packed for `self` serve a kernel of `other`: the
    /// weight layouts tile h and l only, so tiles that differ in ep alone
    /// (per-M flat tiles) share one packed copy.
    pub fn packs_like(&self, other: &HostTile) -> bool {
        (self.hp, self.lp) == (other.hp, other.lp)
    }
}

impl From<&TileConfig> for HostTile {
    fn from(t: &TileConfig) -> Self {
        HostTile {
            ep: t.ep as usize,
            hp: t.hp as usize,
            lp: t.lp as usize,
        }
    }
}

/// Weights packed once for one kernel and tile.
#[derive(Clone, Debug)]
pub struct HostWeights {
    pub format: Format,
    pub n: usize,
    pub k: usize,
    pub tile: HostTile,
    /// Codes or values in the kernel's weight layout (padded to whole
    /// tiles), 64-byte aligned so vector loads do not straddle lines.
    pub codes: AlignedBytes,
    /// Parameters in the order of the module doc, in the format's
    /// parameter precision (empty for float formats).
    pub params: AlignedBytes,
    /// Whether the layout is a CPU panel layout `[h/hp, ...]`.
    pub panel_layout: bool,
}

/// Tensor names and formats of a matmul kernel.
fn matmul_of(kernel: &Kernel) -> Result<&Matmul, HostError> {
    kernel.as_matmul().ok_or_else(|| HostError::NotMatmul {
        kernel: kernel.name.clone(),
    })
}

fn format_of(kernel: &Kernel, tensor: &str) -> Result<Format, HostError> {
    kernel
        .tensor(tensor)
        .map(|t| t.format)
        .ok_or_else(|| HostError::Shape {
            what: "tensor",
            expected: tensor.to_string(),
            got: "missing".into(),
        })
}

fn tile_sizes<'a>(mm: &'a Matmul, kernel: &'a Kernel, tile: HostTile) -> Vec<(&'a str, usize)> {
    let mut out = Vec::new();
    for tv in &kernel.schedule.tiles {
        let size = if tv.axis == mm.e {
            tile.ep
        } else if tv.axis == mm.h {
            tile.hp
        } else if tv.axis == mm.l {
            tile.lp
        } else {
            continue;
        };
        out.push((tv.name.as_str(), size));
    }
    out
}

fn is_panel_layout(kernel: &Kernel, mm: &Matmul) -> bool {
    kernel
        .tensor(&mm.w)
        .is_some_and(|t| t.layout.is_panelled_by(&mm.h))
}

fn check_len(what: &'static str, expected: usize, got: usize) -> Result<(), HostError> {
    if expected == got {
        Ok(())
    } else {
        Err(HostError::Shape {
            what,
            expected: expected.to_string(),
            got: got.to_string(),
        })
    }
}

impl HostWeights {
    /// Pack `w` (`[n, k]`) for `kernel` emitted with `tile`.
    pub fn pack(
        kernel: &Kernel,
        tile: HostTile,
        n: usize,
        k: usize,
        w: WeightsIn<'_>,
    ) -> Result<HostWeights, HostError> {
        let mm = matmul_of(kernel)?;
        let format = format_of(kernel, &mm.w)?;
        let extents = [(mm.h.as_str(), n), (mm.l.as_str(), k)];
        let tiles = tile_sizes(mm, kernel, tile);
        let plan = PackPlan::for_tensor(kernel, &mm.w, &extents, &tiles)?;
        let panel_layout = is_panel_layout(kernel, mm);
        let nk = n.checked_mul(k).ok_or(HostError::Overflow("n·k"))?;
        let (codes, params) = match (format, w) {
            (Format::F32, WeightsIn::F32(v)) => {
                check_len("weights", nk, v.len())?;
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                (plan.pack(&bytes)?, Vec::new())
            }
            (Format::F16, WeightsIn::F32(v)) => {
                check_len("weights", nk, v.len())?;
                let bytes: Vec<u8> = v
                    .iter()
                    .flat_map(|x| f16::from_f32(*x).to_le_bytes())
                    .collect();
                (plan.pack(&bytes)?, Vec::new())
            }
            (Format::BF16, WeightsIn::F32(v)) => {
                check_len("weights", nk, v.len())?;
                let bytes: Vec<u8> = v
                    .iter()
                    .flat_map(|x| bf16::from_f32(*x).to_le_bytes())
                    .collect();
                (plan.pack(&bytes)?, Vec::new())
            }
            (f, WeightsIn::F32(v)) if f.is_quantized() => {
                let t = quant::quantize(f, n, k, v)?;
                Self::pack_quant(&plan, &t, tile, panel_layout)?
            }
            (f, WeightsIn::Quant(t)) if f.is_quantized() => {
                if t.format != f || t.rows != n || t.cols != k {
                    return Err(HostError::WeightsMismatch {
                        packed: format!("{} [{}, {}]", t.format, t.rows, t.cols),
                        needed: format!("{f} [{n}, {k}]"),
                    });
                }
                Self::pack_quant(&plan, t, tile, panel_layout)?
            }
            (f, _) => {
                return Err(HostError::WeightsMismatch {
                    packed: "quantized weights".into(),
                    needed: format!("{f} weights given as f32"),
                });
            }
        };
        Ok(HostWeights {
            format,
            n,
            k,
            tile,
            codes: AlignedBytes::from(codes),
            params: AlignedBytes::from(params),
            panel_layout,
        })
    }

    fn pack_quant(
        plan: &PackPlan,
        t: &QuantTensor,
        tile: HostTile,
        panel_layout: bool,
    ) -> Result<(Vec<u8>, Vec<u8>), HostError> {
        t.validate()?;
        let codes = plan.pack(&t.codes)?;
        let groups = t.groups_per_row();
        let hp = tile.hp.max(1);
        let n_pad = t.rows.div_ceil(hp) * hp;
        // Pad rows to whole panels so every panel has hp parameters.
        let pad = |v: &[f32]| {
            let mut p = v.to_vec();
            p.resize(n_pad * groups, 0.0);
            p
        };
        let scales = pad(&t.scales);
        let offsets = if t.offsets.is_empty() {
            Vec::new()
        } else {
            pad(&t.offsets)
        };
        let params = if panel_layout {
            let order = ParamOrder::RowTiled { tile: hp };
            let s = pack_params(&scales, n_pad, groups, order)?;
            let o = if offsets.is_empty() {
                Vec::new()
            } else {
                pack_params(&offsets, n_pad, groups, order)?
            };
            let per_panel = groups * hp;
            let mut out = Vec::with_capacity(s.len() + o.len());
            for p in 0..n_pad / hp {
                out.extend_from_slice(&s[p * per_panel..(p + 1) * per_panel]);
                if !o.is_empty() {
                    out.extend_from_slice(&o[p * per_panel..(p + 1) * per_panel]);
                }
            }
            out
        } else {
            let mut out = pack_params(&scales, n_pad, groups, ParamOrder::GroupMajor)?;
            if !offsets.is_empty() {
                out.extend(pack_params(
                    &offsets,
                    n_pad,
                    groups,
                    ParamOrder::GroupMajor,
                )?);
            }
            out
        };
        Ok((codes, param_bytes(&params, t.format.params())))
    }
}

/// Parameters as stored: f32 or f16 bits, little-endian. Values of f16
/// formats are exact f16 ([`QuantTensor::validate`] checked), so the
/// conversion does not round.
fn param_bytes(values: &[f32], precision: Option<ParamType>) -> Vec<u8> {
    match precision.unwrap_or_default() {
        ParamType::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        ParamType::F16 => values
            .iter()
            .flat_map(|v| f16::from_f32(*v).to_le_bytes())
            .collect(),
    }
}

/// A matmul kernel instance mapped executable on this host.
pub struct HostMatmul {
    kernel: Kernel,
    tile: HostTile,
    quantizer: Option<JitCode>,
    /// The quantizer's bytes: kernels whose quantizers are byte-identical
    /// can read each other's [`QuantizedInput`].
    quantizer_code: Option<Arc<[u8]>>,
    matmul: JitCode,
    /// The activation quantizer's output, kept between calls so a decode
    /// step allocates nothing (a call that finds it busy uses its own).
    scratch: std::sync::Mutex<QuantScratch>,
    /// The last quantizer key computed: a decode loop asks for the same
    /// (m, k) every call, and building x's pack plan is most of a key.
    last_key: std::sync::Mutex<Option<InputKey>>,
}

/// Buffers of the activation quantizer's output (packed codes, one scale
/// per row, Σq per row and weight group).
#[derive(Default)]
struct QuantScratch {
    qx: Vec<u8>,
    scales: Vec<f32>,
    sums: Vec<i32>,
}

/// What a quantizer's output depends on: its code (which fixes the packed
/// layout and whether Σq is folded for a zero point) and the call's rows,
/// reduction length, weight group and buffer sizes.
#[derive(Clone, Debug)]
struct InputKey {
    code: Arc<[u8]>,
    m: usize,
    k: usize,
    group: usize,
    m_pad: usize,
    packed_bytes: usize,
}

impl PartialEq for InputKey {
    fn eq(&self, other: &Self) -> bool {
        (self.m, self.k, self.group, self.m_pad, self.packed_bytes)
            == (
                other.m,
                other.k,
                other.group,
                other.m_pad,
                other.packed_bytes,
            )
            && (Arc::ptr_eq(&self.code, &other.code) || self.code == other.code)
    }
}

/// Activations quantized once ([`HostMatmul::quantize_input`]) for every
/// kernel that reads the same x with the same quantizer: the Q, K and V
/// projections, or gate and up, quantize their shared input once, the way
/// KleidiAI packs one LHS for several RHS.
pub struct QuantizedInput {
    key: InputKey,
    buffers: QuantScratch,
}

impl std::fmt::Debug for QuantizedInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuantizedInput")
            .field("m", &self.key.m)
            .field("k", &self.key.k)
            .field("group", &self.key.group)
            .field("bytes", &self.key.packed_bytes)
            .finish()
    }
}

impl QuantizedInput {
    /// Rows of x.
    pub fn m(&self) -> usize {
        self.key.m
    }

    /// Elements per row of x.
    pub fn k(&self) -> usize {
        self.key.k
    }
}

/// `v` cleared and zero-filled to `len` elements, growing fallibly.
fn refill<T: Copy + Default>(
    v: &mut Vec<T>,
    len: usize,
    what: &'static str,
) -> Result<(), HostError> {
    v.clear();
    v.try_reserve(len).map_err(|_| HostError::Overflow(what))?;
    v.resize(len, T::default());
    Ok(())
}

impl std::fmt::Debug for HostMatmul {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostMatmul")
            .field("kernel", &self.kernel.name)
            .field("tile", &self.tile)
            .finish()
    }
}

/// Runs a call's per-range function (`0..ranges.len()`) on some threads:
/// see [`HostMatmul::run_ranges`].
pub type RangeExecutor<'a> = dyn Fn(&(dyn Fn(usize) + Sync)) + 'a;

/// Kernel (or quantizer) arguments shared by the threads of one call.
struct SharedArgs<A: Copy>(A);
// SAFETY: the pointers refer to buffers borrowed for the whole call;
// threads only read through them, except the outputs, where each thread
// writes a disjoint part: columns n0..n1 of `y` (`HostMatmul::launch`),
// whole row blocks of the quantizer's buffers (`HostMatmul::quantize_into`).
unsafe impl<A: Copy> Sync for SharedArgs<A> {}

impl<A: Copy> SharedArgs<A> {
    /// A copy (a method, so closures capture the Sync wrapper, not the field).
    fn get(&self) -> A {
        self.0
    }
}

impl HostMatmul {
    /// Map the code of a kernel instance. `quantizer` is required exactly
    /// when the kernel's x format is `i8dyn`.
    pub fn new(
        kernel: &Kernel,
        tile: HostTile,
        quantizer: Option<&MachineCode>,
        matmul: &MachineCode,
    ) -> Result<HostMatmul, HostError> {
        let mm = matmul_of(kernel)?;
        let x_format = format_of(kernel, &mm.x)?;
        match (x_format == Format::I8Dyn, quantizer.is_some()) {
            (true, false) => {
                return Err(HostError::Quantizer {
                    kernel: kernel.name.clone(),
                    format: x_format,
                    need: "an activation quantizer",
                });
            }
            (false, true) => {
                return Err(HostError::Quantizer {
                    kernel: kernel.name.clone(),
                    format: x_format,
                    need: "no activation quantizer",
                });
            }
            _ => {}
        }
        Ok(HostMatmul {
            kernel: kernel.clone(),
            tile,
            quantizer: quantizer.map(JitCode::map).transpose()?,
            quantizer_code: quantizer.map(|q| Arc::from(q.bytes.as_slice())),
            matmul: JitCode::map(matmul)?,
            scratch: std::sync::Mutex::new(QuantScratch::default()),
            last_key: std::sync::Mutex::new(None),
        })
    }

    pub fn kernel(&self) -> &Kernel {
        &self.kernel
    }

    pub fn tile(&self) -> HostTile {
        self.tile
    }

    /// Pack weights for this instance.
    pub fn pack_weights(
        &self,
        n: usize,
        k: usize,
        w: WeightsIn<'_>,
    ) -> Result<HostWeights, HostError> {
        HostWeights::pack(&self.kernel, self.tile, n, k, w)
    }

    /// y[m, n] = x[m, k] · wᵀ (+ bias, epilogue), on `threads` threads
    /// (an even split of the hp panels, on scoped threads).
    pub fn run(
        &self,
        x: HostInput<'_>,
        m: usize,
        w: &HostWeights,
        bias: Option<&[f32]>,
        y: HostOutput<'_>,
        threads: usize,
    ) -> Result<(), HostError> {
        let panels = w.n.div_ceil(self.tile.hp.max(1));
        let threads = threads.clamp(1, panels.max(1));
        let per = panels.div_ceil(threads);
        let ranges: Vec<Range<usize>> = (0..threads)
            .map(|t| (t * per).min(panels)..((t + 1) * per).min(panels))
            .collect();
        self.run_ranges(x, m, w, bias, y, &ranges, &|call| {
            if threads == 1 {
                call(0);
            } else {
                std::thread::scope(|s| {
                    for t in 0..threads {
                        s.spawn(move || call(t));
                    }
                });
            }
        })
    }

    /// Like [`HostMatmul::run`], with the caller choosing the split and the
    /// threads: `ranges` are disjoint ranges of hp panels (`n.div_ceil(hp)`
    /// in all; uncovered panels are left unwritten), and `exec` is handed a
    /// function to call once per range index (`0..ranges.len()`), from any
    /// threads, before it returns (e.g. a persistent pool with per-core
    /// weights, MNN-LLM 5.2). Each range runs at most once however often
    /// its index is called; out-of-range indices are ignored. A kernel whose
    /// schedule does not list `h` in `parallel` never sees `exec`: its
    /// ranges run on the calling thread.
    #[allow(clippy::too_many_arguments)]
    pub fn run_ranges(
        &self,
        x: HostInput<'_>,
        m: usize,
        w: &HostWeights,
        bias: Option<&[f32]>,
        y: HostOutput<'_>,
        ranges: &[Range<usize>],
        exec: &RangeExecutor<'_>,
    ) -> Result<(), HostError> {
        let mm = matmul_of(&self.kernel)?;
        let k = w.k;
        let mk = m.checked_mul(k).ok_or(HostError::Overflow("m·k"))?;
        let x_format = format_of(&self.kernel, &mm.x)?;
        // x: the variant must be the kernel's x format (i8dyn takes f32).
        let (x_ptr, x_len, x_elem) = match (x, x_format) {
            (HostInput::F32(v), Format::F32 | Format::I8Dyn) => {
                (v.as_ptr() as *const u8, v.len(), 4)
            }
            (HostInput::F16(v), Format::F16) => (v.as_ptr() as *const u8, v.len(), 2),
            (HostInput::BF16(v), Format::BF16) => (v.as_ptr() as *const u8, v.len(), 2),
            (_, f) => {
                return Err(HostError::Shape {
                    what: "x format",
                    expected: f.to_string(),
                    got: match x {
                        HostInput::F32(_) => "f32",
                        HostInput::F16(_) => "f16",
                        HostInput::BF16(_) => "bf16",
                    }
                    .into(),
                });
            }
        };
        check_len("x elements (m·k)", mk, x_len)?;
        let call = self.check_call(m, w, bias, y, ranges)?;
        if m == 0 || w.n == 0 {
            return Ok(());
        }
        if self.quantizer.is_none() {
            return self.launch(&call, x_ptr, x_elem, None, ranges, exec);
        }
        // Activation quantization (i8dyn): one pass before the threads split,
        // into the kept scratch (or a call's own, when another holds it).
        let mut own = QuantScratch::default();
        let mut shared = self.scratch.try_lock().ok();
        let scratch: &mut QuantScratch = match shared.as_deref_mut() {
            Some(s) => s,
            None => &mut own,
        };
        self.quantize_into(
            x_ptr as *const f32,
            m,
            k,
            scratch,
            Some((exec, ranges.len())),
        )?;
        self.launch(
            &call,
            scratch.qx.as_ptr(),
            x_elem,
            Some(scratch),
            ranges,
            exec,
        )
    }

    /// Whether this kernel quantizes its activations (x format `i8dyn`),
    /// so [`HostMatmul::quantize_input`] applies.
    pub fn quantizes_input(&self) -> bool {
        self.quantizer.is_some()
    }

    /// Quantize x (`m` rows of `k` f32) with this kernel's quantizer, for
    /// [`HostMatmul::run_ranges_quantized`] of this kernel and of every
    /// kernel that [`HostMatmul::reads`] it. `reuse` lends the buffers of
    /// an earlier result, so a caller that keeps one allocates nothing.
    pub fn quantize_input(
        &self,
        x: &[f32],
        m: usize,
        k: usize,
        reuse: Option<QuantizedInput>,
    ) -> Result<QuantizedInput, HostError> {
        self.quantize_input_on(x, m, k, reuse, None)
    }

    /// [`HostMatmul::quantize_input`] on the caller's threads: with
    /// `spread` (an executor and its range count, as `run_ranges` takes),
    /// a large x is quantized in parts of whole row blocks, as
    /// `run_ranges` does it, with the same bytes.
    pub fn quantize_input_on(
        &self,
        x: &[f32],
        m: usize,
        k: usize,
        reuse: Option<QuantizedInput>,
        spread: Option<(&RangeExecutor<'_>, usize)>,
    ) -> Result<QuantizedInput, HostError> {
        let key = self.input_key(m, k)?;
        let mk = m.checked_mul(k).ok_or(HostError::Overflow("m·k"))?;
        check_len("x elements (m·k)", mk, x.len())?;
        let mut buffers = reuse.map(|q| q.buffers).unwrap_or_default();
        if m > 0 {
            self.quantize_into(x.as_ptr(), m, k, &mut buffers, spread)?;
        }
        Ok(QuantizedInput { key, buffers })
    }

    /// Whether `q` is exactly what this kernel's quantizer would write for
    /// its x: the same quantizer code, rows, length, group and sizes.
    pub fn reads(&self, q: &QuantizedInput) -> bool {
        self.input_key(q.key.m, q.key.k)
            .is_ok_and(|key| key == q.key)
    }

    /// [`HostMatmul::run_ranges`] on activations already quantized: `q`
    /// must be one this kernel [`HostMatmul::reads`], else it is refused.
    pub fn run_ranges_quantized(
        &self,
        q: &QuantizedInput,
        w: &HostWeights,
        bias: Option<&[f32]>,
        y: HostOutput<'_>,
        ranges: &[Range<usize>],
        exec: &RangeExecutor<'_>,
    ) -> Result<(), HostError> {
        let m = q.key.m;
        if q.key.k != w.k {
            return Err(HostError::Shape {
                what: "quantized activations' row length (k)",
                expected: w.k.to_string(),
                got: q.key.k.to_string(),
            });
        }
        let want = self.input_key(m, w.k)?;
        if want != q.key {
            return Err(HostError::Shape {
                what: "quantized activations",
                expected: format!(
                    "this kernel's quantizer output ({} code bytes, group {}, {} packed bytes, {} padded rows)",
                    want.code.len(),
                    want.group,
                    want.packed_bytes,
                    want.m_pad
                ),
                got: format!(
                    "another quantizer's ({} code bytes, group {}, {} packed bytes, {} padded rows)",
                    q.key.code.len(),
                    q.key.group,
                    q.key.packed_bytes,
                    q.key.m_pad
                ),
            });
        }
        let call = self.check_call(m, w, bias, y, ranges)?;
        if m == 0 || w.n == 0 {
            return Ok(());
        }
        self.launch(
            &call,
            q.buffers.qx.as_ptr(),
            4,
            Some(&q.buffers),
            ranges,
            exec,
        )
    }

    /// The refusal of quantized activations by a kernel that takes its x
    /// as it is.
    fn no_quantizer(&self) -> Result<HostError, HostError> {
        Ok(HostError::Quantizer {
            kernel: self.kernel.name.clone(),
            format: format_of(&self.kernel, &matmul_of(&self.kernel)?.x)?,
            need: "its activations as they are, not quantized ones",
        })
    }

    /// The key of this kernel's quantizer output for x of `m` rows of `k`.
    fn input_key(&self, m: usize, k: usize) -> Result<InputKey, HostError> {
        let Some(code) = &self.quantizer_code else {
            return Err(self.no_quantizer()?);
        };
        let mut last = self.last_key.try_lock().ok();
        if let Some(key) = last.as_deref().and_then(Option::as_ref)
            && (key.m, key.k) == (m, k)
        {
            return Ok(key.clone());
        }
        let mm = matmul_of(&self.kernel)?;
        let w_format = format_of(&self.kernel, &mm.w)?;
        let plan = PackPlan::for_tensor(
            &self.kernel,
            &mm.x,
            &[(mm.e.as_str(), m), (mm.l.as_str(), k)],
            &tile_sizes(mm, &self.kernel, self.tile),
        )?;
        let ep = self.tile.ep.max(1);
        let key = InputKey {
            code: Arc::clone(code),
            m,
            k,
            group: w_format.group().map_or(k, |g| g.len(k)).max(1),
            m_pad: m
                .div_ceil(ep)
                .checked_mul(ep)
                .ok_or(HostError::Overflow("rows"))?,
            packed_bytes: plan.packed_bytes(),
        };
        if let Some(last) = last.as_deref_mut() {
            *last = Some(key.clone());
        }
        Ok(key)
    }

    /// Run the quantizer on `m` rows of `k` f32 at `x` (m·k checked by the
    /// caller) into `out`, sized here. With `spread` (the call's executor
    /// and how many ranges it runs), a large x is quantized in up to that
    /// many parts of whole row blocks on the executor's threads.
    fn quantize_into(
        &self,
        x: *const f32,
        m: usize,
        k: usize,
        out: &mut QuantScratch,
        spread: Option<(&RangeExecutor<'_>, usize)>,
    ) -> Result<(), HostError> {
        let key = self.input_key(m, k)?;
        let Some(quantizer) = &self.quantizer else {
            return Err(self.no_quantizer()?);
        };
        let mm = matmul_of(&self.kernel)?;
        let w_format = format_of(&self.kernel, &mm.w)?;
        let groups = w_format.group().map_or(1, |g| groups_per_row(g, k));
        let sums = key
            .m_pad
            .checked_mul(groups)
            .ok_or(HostError::Overflow("sums"))?;
        refill(&mut out.qx, key.packed_bytes, "quantized activations")?;
        refill(&mut out.scales, key.m_pad, "activation scales")?;
        refill(&mut out.sums, sums, "activation sums")?;
        let parts = match spread {
            Some((_, n)) if crate::schedule::spreads(&self.kernel, &mm.h) => {
                self.quantize_parts(m, k, n, &key)?
            }
            _ => vec![RowPart {
                rows: 0..m,
                byte: 0,
            }],
        };
        let base = SharedArgs(QuantizeArgs {
            x,
            x_stride: k * 4,
            out: out.qx.as_mut_ptr(),
            out_scales: out.scales.as_mut_ptr(),
            // Always the buffer: a quantizer writes Σq where its kernel
            // folds a zero point, which may be the kernel's own (the
            // AVX-512 kernel reads i8sym codes as unsigned).
            out_sums: out.sums.as_mut_ptr(),
            m,
            k,
            group: key.group,
        });
        let claims = OncePerIndex::new(parts.len());
        let run_part = |index: usize| {
            let Some(part) = claims.claim(&parts, index) else {
                return;
            };
            let whole = base.get();
            let r0 = part.rows.start;
            // SAFETY (pointer offsets): r0 < m, so x + r0·k is within x's
            // m·k; `byte` is where the layout puts row block r0/ep, within
            // `qx` (`quantize_parts` checked it against the plan); scales
            // and sums hold m_pad rows and m_pad·groups.
            let args = unsafe {
                QuantizeArgs {
                    x: whole.x.add(r0 * k),
                    out: whole.out.add(part.byte),
                    out_scales: whole.out_scales.add(r0),
                    out_sums: whole.out_sums.add(r0 * groups),
                    m: part.rows.len(),
                    ..whole
                }
            };
            // SAFETY: `quantizer` was emitted for this kernel and tile with
            // the QuantizeArgs ABI. x holds m·k f32 (checked by every
            // caller); `qx` holds the packed size of x's layout for (m, k)
            // and this tile, `scales` m rounded up to ep, `sums` that times
            // the group count (all sized above). Parts are disjoint runs of
            // whole row blocks, so each writes its own bytes of every
            // buffer, and each runs once (its flag); all buffers outlive
            // the executor's return.
            unsafe {
                let f: KernelFn<QuantizeArgs> = std::mem::transmute(quantizer.entry());
                f(&args);
            }
        };
        if let (Some((exec, _)), true) = (spread, parts.len() > 1) {
            exec(&run_part);
        }
        // Whatever the executor left (or all, when not split) runs here.
        (0..parts.len()).for_each(run_part);
        Ok(())
    }

    /// Up to `wanted` parts of whole row blocks of x for the quantizer, or
    /// one part where x is small or the layout does not store row blocks
    /// one after another.
    fn quantize_parts(
        &self,
        m: usize,
        k: usize,
        wanted: usize,
        key: &InputKey,
    ) -> Result<Vec<RowPart>, HostError> {
        let whole = vec![RowPart {
            rows: 0..m,
            byte: 0,
        }];
        let ep = self.tile.ep.max(1);
        let blocks = m.div_ceil(ep);
        let parts = wanted.min(blocks);
        if parts <= 1 || m.saturating_mul(k) < SPLIT_QUANTIZE_MIN_ELEMS {
            return Ok(whole);
        }
        if !key.packed_bytes.is_multiple_of(blocks) {
            return Ok(whole);
        }
        let block_bytes = key.packed_bytes / blocks;
        let mm = matmul_of(&self.kernel)?;
        let plan = PackPlan::for_tensor(
            &self.kernel,
            &mm.x,
            &[(mm.e.as_str(), m), (mm.l.as_str(), k)],
            &tile_sizes(mm, &self.kernel, self.tile),
        )?;
        let bits = plan.elem().bits();
        let mut out = Vec::with_capacity(parts);
        for p in 0..parts {
            let (b0, b1) = (blocks * p / parts, blocks * (p + 1) / parts);
            let r0 = b0 * ep;
            let index: Vec<usize> = plan
                .dims()
                .map(|(name, _)| if name == mm.e { r0 } else { 0 })
                .collect();
            let at = plan.packed_index(&index).map(|e| e * bits / 8);
            if at != Some(b0 * block_bytes) {
                return Ok(whole);
            }
            out.push(RowPart {
                rows: r0..(b1 * ep).min(m),
                byte: b0 * block_bytes,
            });
        }
        Ok(out)
    }

    /// Check everything of a call but x: the weights' format and packing,
    /// y, the bias and the panel ranges.
    fn check_call(
        &self,
        m: usize,
        w: &HostWeights,
        bias: Option<&[f32]>,
        y: HostOutput<'_>,
        ranges: &[Range<usize>],
    ) -> Result<CheckedCall, HostError> {
        let mm = matmul_of(&self.kernel)?;
        let (n, k) = (w.n, w.k);
        let w_format = format_of(&self.kernel, &mm.w)?;
        let y_format = format_of(&self.kernel, &mm.y)?;
        if w.format != w_format || !w.tile.packs_like(&self.tile) {
            return Err(HostError::WeightsMismatch {
                packed: format!("{} with tile {:?}", w.format, w.tile),
                needed: format!("{w_format} with tile {:?}", self.tile),
            });
        }
        let mn = m.checked_mul(n).ok_or(HostError::Overflow("m·n"))?;
        let (y_ptr, y_len, y_elem) = match (y, y_format) {
            (HostOutput::F32(v), Format::F32) => (v.as_mut_ptr() as *mut u8, v.len(), 4),
            (HostOutput::F16(v), Format::F16) => (v.as_mut_ptr() as *mut u8, v.len(), 2),
            (HostOutput::BF16(v), Format::BF16) => (v.as_mut_ptr() as *mut u8, v.len(), 2),
            (_, f) => {
                return Err(HostError::Shape {
                    what: "y format",
                    expected: f.to_string(),
                    got: "another format".into(),
                });
            }
        };
        check_len("y elements (m·n)", mn, y_len)?;
        match (
            &self
                .kernel
                .as_matmul()
                .and_then(|m| m.epilogue.bias.clone()),
            bias,
        ) {
            (Some(_), Some(b)) => check_len("bias elements (n)", n, b.len())?,
            (Some(name), None) => {
                return Err(HostError::Shape {
                    what: "bias",
                    expected: format!("tensor `{name}` of {n} elements"),
                    got: "none".into(),
                });
            }
            (None, Some(_)) => {
                return Err(HostError::Shape {
                    what: "bias",
                    expected: "none (the kernel has no bias)".into(),
                    got: "a bias".into(),
                });
            }
            (None, None) => {}
        }
        let panels = n.div_ceil(self.tile.hp.max(1));
        let mut sorted: Vec<&Range<usize>> = ranges.iter().filter(|r| !r.is_empty()).collect();
        sorted.sort_by_key(|r| r.start);
        for pair in sorted.windows(2) {
            if pair[0].end > pair[1].start {
                return Err(HostError::Shape {
                    what: "panel ranges",
                    expected: "disjoint ranges".into(),
                    got: format!("{:?} and {:?} overlap", pair[0], pair[1]),
                });
            }
        }
        if let Some(r) = sorted.iter().find(|r| r.end > panels) {
            return Err(HostError::Shape {
                what: "panel ranges",
                expected: format!("within 0..{panels} (n={n}, hp={})", self.tile.hp),
                got: format!("{r:?}"),
            });
        }
        Ok(CheckedCall {
            m,
            n,
            k,
            y: y_ptr,
            y_elem,
            w_codes: w.codes.as_ptr(),
            w_params: w.params.as_ptr(),
            bias: bias.map_or(std::ptr::null(), |b| b.as_ptr()),
        })
    }

    /// Call the kernel once per range, through `exec` where the schedule
    /// spreads h over threads. `x` is the caller's activations or, with
    /// `quantized`, the quantizer's codes; every length was checked.
    fn launch(
        &self,
        call: &CheckedCall,
        x: *const u8,
        x_elem: usize,
        quantized: Option<&QuantScratch>,
        ranges: &[Range<usize>],
        exec: &RangeExecutor<'_>,
    ) -> Result<(), HostError> {
        let mm = matmul_of(&self.kernel)?;
        let CheckedCall { m, n, k, .. } = *call;
        let hp = self.tile.hp.max(1);
        let base = SharedArgs(MatmulArgs {
            x,
            x_stride: k * x_elem,
            x_scales: quantized.map_or(std::ptr::null(), |q| q.scales.as_ptr()),
            x_sums: quantized.map_or(std::ptr::null(), |q| q.sums.as_ptr()),
            w: call.w_codes,
            w_params: call.w_params,
            bias: call.bias,
            y: call.y,
            y_stride: n * call.y_elem,
            m,
            n: 0,
            k,
            n0: 0,
            n_total: n,
        });
        let claims = OncePerIndex::new(ranges.len());
        let run_range = |index: usize| {
            let Some(range) = claims.claim(ranges, index) else {
                return;
            };
            let n0 = range.start * hp;
            let n1 = (range.end * hp).min(n);
            if n0 >= n1 {
                return;
            }
            let args = MatmulArgs {
                n: n1 - n0,
                n0,
                ..base.get()
            };
            // SAFETY: the kernel was emitted for this IR kernel and tile with the
            // MatmulArgs ABI. Every buffer was checked against (m, n, k) by
            // `check_call` and the caller: x (or the quantizer's output for
            // this kernel's key), the packed weights and params (packed for
            // this kernel, format and tile), bias (n), y (m·n). The ranges
            // were checked disjoint and each runs at most once (its flag), so
            // calls on different threads write disjoint columns n0..n1 of y;
            // `exec` returns before the buffers go.
            unsafe {
                let f: KernelFn<MatmulArgs> = std::mem::transmute(self.matmul.entry());
                f(&args);
            }
        };
        // The schedule decides whether output channels may go to other
        // threads: without `parallel h` every range runs here, in order.
        if crate::schedule::spreads(&self.kernel, &mm.h) {
            exec(&run_range);
        } else {
            (0..ranges.len()).for_each(run_range);
        }
        Ok(())
    }
}

/// Each part of a call runs at most once, whichever threads ask for it.
struct OncePerIndex(Vec<AtomicBool>);

impl OncePerIndex {
    fn new(parts: usize) -> OncePerIndex {
        OncePerIndex((0..parts).map(|_| AtomicBool::new(false)).collect())
    }

    /// `items[index]` the first time `index` is claimed; None after that
    /// or out of range.
    fn claim<'a, T>(&self, items: &'a [T], index: usize) -> Option<&'a T> {
        let (item, flag) = (items.get(index)?, self.0.get(index)?);
        (!flag.swap(true, Ordering::AcqRel)).then_some(item)
    }
}

/// Rows of x one quantizer call packs, and where their first byte goes.
struct RowPart {
    rows: Range<usize>,
    byte: usize,
}

/// Below this many elements of x the quantizer runs on the calling thread:
/// a split costs a wake of the workers (microseconds), more than the pass.
const SPLIT_QUANTIZE_MIN_ELEMS: usize = 1 << 15;

/// A call's checked operands other than x (pointers into buffers the
/// caller borrows for the call).
#[derive(Clone, Copy)]
struct CheckedCall {
    m: usize,
    n: usize,
    k: usize,
    y: *mut u8,
    y_elem: usize,
    w_codes: *const u8,
    w_params: *const u8,
    bias: *const f32,
}
