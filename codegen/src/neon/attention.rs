//! Decode attention on NEON, ABI [`crate::host_attention::AttentionArgs`]
//! (so [`crate::host_attention::HostAttention::run`] drives it, one call
//! per slice of KV heads): one query token, GQA, keys f16 or int8 per
//! (token, KV head) row, values f16 or fp8, softmax in f32 exactly as the
//! interpreter defines it (the cranelift lowering in `clif/attention.rs`
//! is the same algorithm).
//!
//! Per query head of the call (KV head `h / (hq / kvh)`):
//!
//! 1. q widened to f32 in scratch (× 1/sqrt(d) unless the kernel says q
//!    is prescaled), and on fp16 cores also kept as f16 for `fmla .8h`.
//! 2. QKᵀ, K read in place from the cache row `[j, kv, :]`: fp16 cores
//!    `fmla .8h` into four f16 accumulators (32 lanes of d, so each lane sums
//!    d/32 products), widened to f32 once per key; other cores `fcvtl` /
//!    `sxtl`+`scvtf` and `fmla .4s`. int8 keys `w = s·c + o` are folded out
//!    of the loop: `q·w = s·(q·c) + o·Σq`.
//! 3. Async mode: one scan checks `score − phi ∈ [lo, hi]` for every key;
//!    if any is out (or NaN) the row is recomputed with the online softmax
//!    and `*recomputed += 1`.
//! 4. Per block of [`ONLINE_BLOCK`] keys: the reference max (online: the
//!    running max, rescale `e^(m_old − m_new)`, 0 before the first block;
//!    unified: `phi`, rescale 1), `p = e^(x − max)` four lanes at a time
//!    (degree-6 polynomial, as the cranelift `exp`), then PV with the
//!    output chunk (8 lanes of d) held in two f32 registers across the
//!    block's keys, V read in place and widened in registers (f16 `fcvtl`;
//!    fp8 bytes become f16 bit patterns with `shll`, e4m3 through
//!    `sshr`+`and` and a 2⁸ scale folded into the denominator).
//! 5. `o = num / den`, rounded to f16. The head's softmax state stays in
//!    scratch (`den` at `s`, `num` at `s + d`, the max the exps were taken
//!    against at `s + 2d`): `HostAttention`'s flash-decoding split
//!    (`split s`) combines chunks of the sequence from it.
//!
//! A prefill kernel with the online softmax emits the flash loop of
//! `super::attention_prefill` instead; with the async softmax it emits
//! this same code, which `HostAttention::prefill` runs once per query
//! token with that token's causal prefix.
//!
//! Tails: d need not be a multiple of 8 (a scalar tail over the last
//! `d % 8` lanes), s need not be a multiple of the block (the last block is
//! short). Nothing is read past a cache row's end.

use tessera_dsl::interp::ONLINE_BLOCK;
use tessera_dsl::ir::{AttentionKind, Format, Group, Kernel, ParamType, SoftmaxMode};

use super::asm::{A64, Cond, V, X};
use super::attention_asm::AttentionAsm;
use super::frame;
use crate::artifact::{Arch, EmitError, MachineCode, PrefillBlocks};
use crate::host_attention::*;
use crate::target::TargetCaps;

/// Head dims the whole-prefill code takes: multiples of its 4-lane chunks
/// ([`MachineCode::head_dim_multiple`] of a prefill kernel's code).
pub const PREFILL_HEAD_DIM_MULTIPLE: usize = 4;

/// How keys are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyStore {
    F16,
    /// int8 codes, one f32 scale (and for `asym` one offset) per row.
    I8 {
        asym: bool,
    },
}

/// How values are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueStore {
    F16,
    E4M3,
    E5M2,
}

impl KeyStore {
    /// The format's text name.
    pub fn name(self) -> &'static str {
        match self {
            KeyStore::F16 => "f16",
            KeyStore::I8 { asym: false } => "i8sym:row",
            KeyStore::I8 { asym: true } => "i8asym:row",
        }
    }
}

impl ValueStore {
    /// The format's text name.
    pub fn name(self) -> &'static str {
        match self {
            ValueStore::F16 => "f16",
            ValueStore::E4M3 => "fp8e4m3",
            ValueStore::E5M2 => "fp8e5m2",
        }
    }
}

/// Everything that changes the emitted decode attention code.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionSpec {
    /// `fmla .8h` for QKᵀ (FEAT_FP16); otherwise `fmla .4s`.
    pub fp16: bool,
    pub keys: KeyStore,
    pub values: ValueStore,
    pub softmax: SoftmaxMode,
    pub q_prescaled: bool,
}

impl AttentionSpec {
    /// The spec of a decode attention `kernel` on `caps`, or why the NEON
    /// backend cannot emit it.
    pub fn new(caps: &TargetCaps, kernel: &Kernel) -> Result<AttentionSpec, EmitError> {
        let unsupported = |what: String| EmitError::Unsupported {
            backend: caps.name,
            what,
        };
        let a = kernel
            .as_attention()
            .ok_or_else(|| unsupported(format!("kernel `{}` is not attention", kernel.name)))?;
        // A prefill kernel is the decode kernel run once per query row with
        // that row's causal length (`HostAttention::prefill`).
        let fmt = |n: &str| {
            kernel
                .tensor(n)
                .map(|t| t.format)
                .ok_or_else(|| unsupported(format!("missing tensor `{n}`")))
        };
        let (qf, kf, vf, of) = (fmt(&a.q)?, fmt(&a.k)?, fmt(&a.v)?, fmt(&a.o)?);
        if qf != Format::F16 || of != Format::F16 {
            return Err(unsupported(format!(
                "attention with q {qf} and o {of} (NEON attention takes f16 q and o)"
            )));
        }
        let keys = match kf {
            Format::F16 => KeyStore::F16,
            Format::I8Sym(Group::Row, ParamType::F32) => KeyStore::I8 { asym: false },
            Format::I8Asym(Group::Row, ParamType::F32) => KeyStore::I8 { asym: true },
            f => {
                return Err(unsupported(format!(
                    "attention keys {f} (NEON: f16, i8sym:row, i8asym:row)"
                )));
            }
        };
        let values = match vf {
            Format::F16 => ValueStore::F16,
            Format::Fp8E4M3 => ValueStore::E4M3,
            Format::Fp8E5M2 => ValueStore::E5M2,
            f => {
                return Err(unsupported(format!(
                    "attention values {f} (NEON: f16, fp8e4m3, fp8e5m2)"
                )));
            }
        };
        if let SoftmaxMode::Async { phi, lo, hi } = a.softmax
            && !(phi.is_finite() && lo.is_finite() && hi.is_finite() && lo <= hi)
        {
            return Err(unsupported(format!(
                "async softmax bounds phi {phi}, lo {lo}, hi {hi}"
            )));
        }
        Ok(AttentionSpec {
            fp16: caps.features.contains(&"fp16"),
            keys,
            values,
            softmax: a.softmax,
            q_prescaled: a.q_prescaled,
        })
    }

    pub(super) fn key_bytes(&self) -> u32 {
        match self.keys {
            KeyStore::F16 => 2,
            KeyStore::I8 { .. } => 1,
        }
    }

    pub(super) fn value_bytes(&self) -> u32 {
        match self.values {
            ValueStore::F16 => 2,
            _ => 1,
        }
    }
}

/// The register plan, printed at the top of every listing.
const PLAN: &[&str] = &[
    "| registers | holds |",
    "|---|---|",
    "| x1 x2 x5 x6 x7 | q, k, v, o, scratch (scores[s]) |",
    "| x9 x10 x11 x22 | s, hq/kvh, d, d rounded down to 8 |",
    "| x12 x13 | query head, end of this call's heads |",
    "| x14 x15 x20 | K row advance, V row stride, kvh·4 (row parameter stride) |",
    "| x16 x17 x19 | q f32 [d], num f32 [d], q f16 [d] (scratch) |",
    "| x21 | 1 when the unified-max softmax holds for this head |",
    "| x0 x3 x4 x8 x23-x28 | loop counters and cursors |",
    "| v0-v7 | K/V/q chunks, exp temporaries, PV accumulators (v4 v5) |",
    "| v8-v11 | QK accumulators (f16 x 4 on fp16 cores, f32 x 2 otherwise) |",
    "| v12-v14 | QK reduction, scalar tail accumulator |",
    "| v15 | 1/sqrt(d) |",
    "| v16-v27 | exp constants (clamps, log2 e, -ln 2 split, 1/k!, bias 127) |",
    "| v28 v29 v30 v31 | sum of q (asym keys), denominator, running max, block max |",
];

// General-purpose registers.
const Q: X = X(1);
const K: X = X(2);
const VB: X = X(5);
const O: X = X(6);
const SC: X = X(7);
const S: X = X(9);
const GROUP: X = X(10);
const D: X = X(11);
const H: X = X(12);
const HEND: X = X(13);
const KADV: X = X(14);
const VSTR: X = X(15);
const QS: X = X(16);
const NUM: X = X(17);
const Q16: X = X(19);
const KVH4: X = X(20);
const UNI: X = X(21);
const D8: X = X(22);
const T0: X = X(0);
const T3: X = X(3);
const T4: X = X(4);
const T8: X = X(8);
const T23: X = X(23);
const T24: X = X(24);
const T25: X = X(25);
const T26: X = X(26);
const T27: X = X(27);
const T28: X = X(28);

// Vector registers.
const INV_SQRT_D: V = V(15);
pub(super) const EXP_LO: V = V(16);
const EXP_HI: V = V(17);
const LOG2E: V = V(18);
const NLN2_HI: V = V(19);
const NLN2_LO: V = V(20);
const C720: V = V(21);
const C120: V = V(22);
const C24: V = V(23);
const C6: V = V(24);
const C2: V = V(25);
pub(super) const ONE: V = V(26);
const BIAS: V = V(27);
const SUMQ: V = V(28);
const DEN: V = V(29);
const MAX: V = V(30);
const BMAX: V = V(31);

/// Stack frame: the argument pointer at [sp].
const FRAME: u32 = 16;

/// Emit the attention kernel `kernel` for `caps`: the decode loop, or for
/// a prefill kernel with the online softmax the flash loop of
/// `super::attention_prefill` in the default blocks.
pub fn emit(caps: &TargetCaps, kernel: &Kernel) -> Result<MachineCode, EmitError> {
    emit_with(caps, kernel, PrefillBlocks::DEFAULT)
}

/// [`emit`] with a prefill kernel's flash loop in `blocks` (rows a
/// multiple of 16, keys of 4; a decode kernel ignores them).
pub fn emit_with(
    caps: &TargetCaps,
    kernel: &Kernel,
    blocks: PrefillBlocks,
) -> Result<MachineCode, EmitError> {
    let spec = AttentionSpec::new(caps, kernel)?;
    let prefill = kernel.as_attention().map(|a| a.kind) == Some(AttentionKind::Prefill);
    if prefill && spec.softmax == SoftmaxMode::Online {
        return super::attention_prefill::emit(caps.name, &kernel.name, &spec, blocks);
    }
    let mut a = A64::new();
    if prefill {
        a.header("prefill: this decode kernel runs once per query token with s = its causal prefix (HostAttention::prefill): the flash prefill runs the online softmax only");
    }
    a.header(&format!(
        "{} {} decode attention: keys {}, values {}, QK {}, softmax {}",
        kernel.name,
        caps.name,
        spec.keys.name(),
        spec.values.name(),
        if spec.fp16 { "fmla .8h" } else { "fmla .4s" },
        match spec.softmax {
            SoftmaxMode::Online => "online".to_string(),
            SoftmaxMode::Async { phi, lo, hi } => format!("async(phi={phi}, lo={lo}, hi={hi})"),
        }
    ));
    for line in PLAN {
        a.header(line);
    }
    emit_body(&mut a, &spec);
    let (bytes, listing) = a.finish().map_err(EmitError::Assembler)?;
    Ok(MachineCode {
        arch: Arch::Aarch64,
        bytes,
        listing,
        head_dim_multiple: 1,
        whole_prefill: None,
        every_head_state: false,
    })
}

/// An f32 constant splatted into all four lanes of `v` (via `tmp`).
pub(super) fn splat_f32(a: &mut A64, v: V, value: f32, tmp: X) {
    a.mov_imm(tmp, u64::from(value.to_bits()));
    a.fmov_s_w(v, tmp);
    a.dup_4s(v, v, 0);
}

/// An f32 constant in lane 0 of `v` (upper lanes zero).
fn scalar_f32(a: &mut A64, v: V, value: f32, tmp: X) {
    a.mov_imm(tmp, u64::from(value.to_bits()));
    a.fmov_s_w(v, tmp);
}

/// `body` run `cnt` times (counted down by `step`, `cnt` a multiple of
/// it); nothing when `cnt` is 0.
fn count_loop(a: &mut A64, cnt: X, step: u32, body: impl FnOnce(&mut A64)) {
    let top = a.new_label();
    let done = a.new_label();
    a.cbz(cnt, done);
    a.bind(top);
    body(a);
    a.subs_imm(cnt, cnt, step);
    a.b_cond(Cond::Ne, top);
    a.bind(done);
}

/// The constants [`exp`] reads, splatted into v16–v27 (via `tmp`).
pub(super) fn exp_constants(a: &mut A64, tmp: X) {
    a.comment("exp constants");
    for (v, c) in [
        (EXP_LO, -87.3f32),
        (EXP_HI, 88.7),
        (LOG2E, std::f32::consts::LOG2_E),
        (NLN2_HI, -0.693_359_4),
        (NLN2_LO, 2.121_944_4e-4),
        (C720, 1.0 / 720.0),
        (C120, 1.0 / 120.0),
        (C24, 1.0 / 24.0),
        (C6, 1.0 / 6.0),
        (C2, 0.5),
        (ONE, 1.0),
    ] {
        splat_f32(a, v, c, tmp);
    }
    a.mov_imm(tmp, 127);
    a.fmov_s_w(BIAS, tmp);
    a.dup_4s(BIAS, BIAS, 0);
}

/// `x = e^x` on four lanes (clobbers `t1`, `t2`): clamp to [-87.3, 88.7],
/// n = round(x·log2 e), r = x − n·ln 2 (two-part), Taylor degree 6 in
/// Horner form, times 2^n built in the exponent bits. The clamps are
/// `fmax`/`fmin`, which keep a NaN (as the interpreter's e^NaN), where
/// `fmaxnm` would clamp it to e^-87.3 and a head whose q holds a NaN would
/// give the mean of V.
pub(super) fn exp(a: &mut A64, x: V, t1: V, t2: V) {
    a.fmax_4s(x, x, EXP_LO);
    a.fmin_4s(x, x, EXP_HI);
    a.fmul_4s(t1, x, LOG2E);
    a.fcvtns_4s(t2, t1);
    a.scvtf_4s(t1, t2);
    a.fmla_4s(x, t1, NLN2_HI);
    a.fmla_4s(x, t1, NLN2_LO);
    a.mov_v(t1, C720);
    for c in [C120, C24, C6, C2, ONE, ONE] {
        a.fmul_4s(t1, t1, x);
        a.fadd_4s(t1, t1, c);
    }
    a.add_4s(t2, t2, BIAS);
    a.shl_4s(t2, t2, 23);
    a.fmul_4s(x, t1, t2);
}

fn emit_body(a: &mut A64, spec: &AttentionSpec) {
    let kbytes = spec.key_bytes();
    let vbytes = spec.value_bytes();
    let kshift = kbytes.trailing_zeros();
    let vshift = vbytes.trailing_zeros();
    let asym = spec.keys == KeyStore::I8 { asym: true };
    let quant_keys = matches!(spec.keys, KeyStore::I8 { .. });

    frame::prologue(a, FRAME);
    a.comment("arguments");
    a.str_x_sp(X(0), 0);
    let args = X(0);
    a.ldr_x(Q, args, AT_Q as u32);
    a.ldr_x(K, args, AT_K as u32);
    a.ldr_x(VB, args, AT_V as u32);
    a.ldr_x(O, args, AT_O as u32);
    a.ldr_x(SC, args, AT_SCRATCH as u32);
    a.ldr_x(S, args, AT_S as u32);
    a.ldr_x(D, args, AT_D as u32);
    a.ldr_x(H, args, AT_HEAD0 as u32);
    a.ldr_x(HEND, args, AT_HEADS as u32);
    a.add(HEND, HEND, H);
    a.ldr_x(T3, args, AT_HQ as u32);
    a.ldr_x(T4, args, AT_KVH as u32);
    a.udiv(GROUP, T3, T4);
    a.lsl_imm(KVH4, T4, 2);
    a.comment("K row advance (kvh - 1)·d·kbytes, V row stride kvh·d·vbytes");
    a.mul(KADV, T4, D);
    a.sub(KADV, KADV, D);
    if kshift > 0 {
        a.lsl_imm(KADV, KADV, kshift);
    }
    a.mul(VSTR, T4, D);
    if vshift > 0 {
        a.lsl_imm(VSTR, VSTR, vshift);
    }
    a.comment("scratch: scores[s] | q f32 [d] | num [d] | q f16 [d]");
    a.add_lsl(QS, SC, S, 2);
    a.add_lsl(NUM, QS, D, 2);
    a.add_lsl(Q16, NUM, D, 2);
    a.lsr_imm(D8, D, 3);
    a.lsl_imm(D8, D8, 3);
    exp_constants(a, T3);
    if !spec.q_prescaled {
        a.comment("1/sqrt(d)");
        a.ucvtf_s_x(V(0), D);
        a.fsqrt_s(V(0), V(0));
        scalar_f32(a, INV_SQRT_D, 1.0, T3);
        a.fdiv_s(INV_SQRT_D, INV_SQRT_D, V(0));
    }

    let head_loop = a.new_label();
    let all_done = a.new_label();
    a.bind(head_loop);
    a.cmp(H, HEND);
    a.b_cond(Cond::Hs, all_done);

    a.comment("this head's KV rows: kv = h / group");
    a.udiv(T23, H, GROUP);
    a.mul(T24, T23, D);
    a.add_lsl(T24, K, T24, kshift);
    if quant_keys {
        a.ldr_x_sp(T8, 0);
        a.ldr_x(T25, T8, AT_K_SCALES as u32);
        a.add_lsl(T25, T25, T23, 2);
        if asym {
            a.ldr_x(T26, T8, AT_K_OFFSETS as u32);
            a.add_lsl(T26, T26, T23, 2);
        }
    }
    a.mul(T23, T23, D);
    a.add_lsl(T23, VB, T23, vshift);

    emit_q_prep(a, spec);
    emit_scores(a, spec, asym, quant_keys);
    emit_range_check(a, spec);
    emit_softmax_pv(a, spec);
    emit_output(a, spec);

    a.add_imm(H, H, 1);
    a.b(head_loop);
    a.bind(all_done);
    frame::epilogue(a, FRAME);
}

/// q row → f32 scratch (scaled unless prescaled), f16 copy on fp16 cores,
/// Σq for asymmetric keys.
fn emit_q_prep(a: &mut A64, spec: &AttentionSpec) {
    let asym = spec.keys == KeyStore::I8 { asym: true };
    a.comment("q row to f32 (and f16) scratch");
    a.mul(T3, H, D);
    a.add_lsl(T3, Q, T3, 1);
    a.mov(T4, QS);
    a.mov(T8, Q16);
    a.mov(T0, D);
    if asym {
        a.zero(SUMQ);
    }
    count_loop(a, T0, 1, |a| {
        a.ldr_h_post(V(0), T3, 2);
        if spec.fp16 && spec.q_prescaled {
            a.str_h_post(V(0), T8, 2);
        }
        a.fcvt_s_h(V(0), V(0));
        if !spec.q_prescaled {
            a.fmul_s(V(0), V(0), INV_SQRT_D);
            if spec.fp16 {
                a.fcvt_h_s(V(1), V(0));
                a.str_h_post(V(1), T8, 2);
            }
        }
        a.str_s_post(V(0), T4, 4);
        if asym {
            a.fadd_s(SUMQ, SUMQ, V(0));
        }
    });
}

/// scores[j] = q·k_j for every cached token j.
fn emit_scores(a: &mut A64, spec: &AttentionSpec, asym: bool, quant_keys: bool) {
    a.comment("scores: q·k_j, K read in place");
    a.mov(T27, S);
    a.mov(T28, SC);
    count_loop(a, T27, 1, |a| {
        if spec.fp16 {
            qk_fp16(a, spec);
        } else {
            qk_f32(a, spec);
        }
        a.comment("tail lanes d % 8 in f32");
        a.add_lsl(T3, QS, D8, 2);
        a.zero(V(14));
        a.sub(T0, D, D8);
        count_loop(a, T0, 1, |a| {
            match spec.keys {
                KeyStore::F16 => {
                    a.ldr_h_post(V(0), T24, 2);
                    a.fcvt_s_h(V(0), V(0));
                }
                KeyStore::I8 { .. } => {
                    a.ldrsb_w_post1(T4, T24);
                    a.scvtf_s_w(V(0), T4);
                }
            }
            a.ldr_s_post(V(1), T3, 4);
            a.fmadd_s(V(14), V(0), V(1), V(14));
        });
        a.faddp_4s(V(12), V(12), V(12));
        a.faddp_s(V(12), V(12));
        a.fadd_s(V(12), V(12), V(14));
        if quant_keys {
            a.comment("w = s·c + o: score = s·(q·c) + o·Σq");
            a.ldr_s(V(0), T25, 0);
            a.add(T25, T25, KVH4);
            a.fmul_s(V(12), V(12), V(0));
            if asym {
                a.ldr_s(V(1), T26, 0);
                a.add(T26, T26, KVH4);
                a.fmadd_s(V(12), V(1), SUMQ, V(12));
            }
        }
        a.str_s_post(V(12), T28, 4);
        a.add(T24, T24, KADV);
    });
}

/// Load chunk `c` (8 lanes of d) of the key row at `T24` into `k` as f16
/// lanes (fp16 cores). Offsets, not post-increments: the cursor moves
/// once per trip, so loads do not queue behind one base register.
fn key_chunk_f16(a: &mut A64, spec: &AttentionSpec, k: V, c: u32) {
    match spec.keys {
        KeyStore::F16 => a.ldr_q(k, T24, 16 * c),
        KeyStore::I8 { .. } => {
            a.ldr_d(k, T24, 8 * c);
            a.sxtl_8h(k, k);
            a.scvtf_8h(k, k);
        }
    }
}

/// QKᵀ of one key with `fmla .8h`: 32 lanes per trip in four f16
/// accumulators, then 8-lane chunks into the first; widened to f32 in v12.
fn qk_fp16(a: &mut A64, spec: &AttentionSpec) {
    for acc in 8..12 {
        a.zero(V(acc));
    }
    a.mov(T3, Q16);
    a.lsr_imm(T0, D, 5);
    count_loop(a, T0, 1, |a| {
        for c in 0..4u8 {
            key_chunk_f16(a, spec, V(c), u32::from(c));
        }
        a.ldp_q(V(4), V(5), T3, 0);
        a.ldp_q(V(6), V(7), T3, 32);
        a.add_imm(T24, T24, 4 * 8 * spec.key_bytes());
        a.add_imm(T3, T3, 64);
        for c in 0..4u8 {
            a.fmla_8h(V(8 + c), V(c), V(4 + c));
        }
    });
    a.comment("8-lane chunks left after the 32-lane trips");
    a.lsr_imm(T0, D, 3);
    a.lsr_imm(T4, D, 5);
    a.lsl_imm(T4, T4, 2);
    a.sub(T0, T0, T4);
    count_loop(a, T0, 1, |a| {
        key_chunk_f16(a, spec, V(0), 0);
        a.ldr_q(V(4), T3, 0);
        a.add_imm(T24, T24, 8 * spec.key_bytes());
        a.add_imm(T3, T3, 16);
        a.fmla_8h(V(8), V(0), V(4));
    });
    a.fcvtl_4s(V(12), V(8));
    a.fcvtl2_4s(V(13), V(8));
    for acc in 9..12 {
        a.fcvtl_4s(V(0), V(acc));
        a.fcvtl2_4s(V(1), V(acc));
        a.fadd_4s(V(12), V(12), V(0));
        a.fadd_4s(V(13), V(13), V(1));
    }
    a.fadd_4s(V(12), V(12), V(13));
}

/// QKᵀ of one key with `fmla .4s` (keys widened in registers); into v12.
fn qk_f32(a: &mut A64, spec: &AttentionSpec) {
    a.zero(V(8));
    a.zero(V(9));
    a.mov(T3, QS);
    a.mov(T0, D8);
    count_loop(a, T0, 8, |a| {
        match spec.keys {
            KeyStore::F16 => {
                a.ldr_q(V(0), T24, 0);
                a.fcvtl_4s(V(1), V(0));
                a.fcvtl2_4s(V(2), V(0));
            }
            KeyStore::I8 { .. } => {
                a.ldr_d(V(0), T24, 0);
                a.sxtl_8h(V(0), V(0));
                a.sxtl_4s(V(1), V(0));
                a.sxtl2_4s(V(2), V(0));
                a.scvtf_4s(V(1), V(1));
                a.scvtf_4s(V(2), V(2));
            }
        }
        a.ldp_q(V(3), V(4), T3, 0);
        a.add_imm(T24, T24, 8 * spec.key_bytes());
        a.add_imm(T3, T3, 32);
        a.fmla_4s(V(8), V(1), V(3));
        a.fmla_4s(V(9), V(2), V(4));
    });
    a.fadd_4s(V(12), V(8), V(9));
}

/// Async mode: UNI = 1 when every `score − phi` lies in [lo, hi];
/// otherwise UNI = 0 and the row counts as recomputed.
fn emit_range_check(a: &mut A64, spec: &AttentionSpec) {
    let SoftmaxMode::Async { phi, lo, hi } = spec.softmax else {
        a.mov_imm(UNI, 0);
        return;
    };
    a.comment("async softmax: every score - phi in [lo, hi]?");
    scalar_f32(a, V(5), phi, T3);
    scalar_f32(a, V(6), lo, T3);
    scalar_f32(a, V(7), hi, T3);
    a.mov_imm(UNI, 1);
    let out = a.new_label();
    let done = a.new_label();
    a.mov(T3, SC);
    a.mov(T0, S);
    count_loop(a, T0, 1, |a| {
        a.ldr_s_post(V(0), T3, 4);
        a.fsub_s(V(0), V(0), V(5));
        a.fcmp_s(V(0), V(6));
        // lt: less than, or unordered (NaN)
        a.b_cond(Cond::Lt, out);
        a.fcmp_s(V(0), V(7));
        a.b_cond(Cond::Gt, out);
    });
    a.b(done);
    a.bind(out);
    a.comment("out of range: recompute with the online softmax");
    a.mov_imm(UNI, 0);
    a.ldr_x_sp(T3, 0);
    a.ldr_x(T3, T3, AT_RECOMPUTED as u32);
    a.ldr_x(T4, T3, 0);
    a.add_imm(T4, T4, 1);
    a.str_x(T4, T3, 0);
    a.bind(done);
}

/// Blocks of keys: max, rescale, p = e^(x − max) in place of the scores,
/// then PV into num.
fn emit_softmax_pv(a: &mut A64, spec: &AttentionSpec) {
    a.comment("softmax and PV, blocks of 64 keys");
    a.mov(T3, NUM);
    a.mov(T0, D);
    a.zero(V(0));
    count_loop(a, T0, 1, |a| a.str_s_post(V(0), T3, 4));
    a.zero(DEN);
    scalar_f32(a, MAX, f32::NEG_INFINITY, T3);
    a.mov(T24, SC);
    a.mov(T25, S);
    a.mov(T26, T23);
    let block = a.new_label();
    a.bind(block);
    a.mov_imm(T27, ONLINE_BLOCK as u64);
    a.cmp(T25, T27);
    a.csel(T27, T25, T27, Cond::Lo);

    let have_rescale = a.new_label();
    if let SoftmaxMode::Async { phi, .. } = spec.softmax {
        let online = a.new_label();
        a.cbz(UNI, online);
        a.comment("unified max: p = e^(x - phi), no rescale");
        splat_f32(a, BMAX, phi, T3);
        a.mov_v(V(3), ONE);
        a.b(have_rescale);
        a.bind(online);
    }
    a.comment("online: block max, rescale e^(m_old - m_new) (0 before the first block)");
    a.mov_v(V(1), MAX);
    a.mov(T3, T24);
    a.mov(T4, T27);
    count_loop(a, T4, 1, |a| {
        a.ldr_s_post(V(0), T3, 4);
        a.fmaxnm_s(V(1), V(1), V(0));
    });
    a.fsub_s(V(0), MAX, V(1));
    a.mov_v(MAX, V(1));
    a.dup_4s(BMAX, V(1), 0);
    let not_first = a.new_label();
    a.cmp(T24, SC);
    a.b_cond(Cond::Ne, not_first);
    a.zero(V(3));
    a.b(have_rescale);
    a.bind(not_first);
    exp(a, V(0), V(1), V(2));
    a.dup_4s(V(3), V(0), 0);
    a.bind(have_rescale);

    a.comment("p = e^(x - max) in place; den = den·rescale + Σp");
    a.fmul_s(DEN, DEN, V(3));
    a.zero(V(4));
    a.zero(V(5));
    a.mov(T3, T24);
    a.lsr_imm(T4, T27, 2);
    count_loop(a, T4, 1, |a| {
        a.ldr_q(V(0), T3, 0);
        a.fsub_4s(V(0), V(0), BMAX);
        exp(a, V(0), V(1), V(2));
        a.str_q_post(V(0), T3, 16);
        a.fadd_4s(V(4), V(4), V(0));
    });
    a.lsl_imm(T4, T27, 62);
    a.lsr_imm(T4, T4, 62);
    count_loop(a, T4, 1, |a| {
        a.ldr_s(V(0), T3, 0);
        a.fsub_4s(V(0), V(0), BMAX);
        exp(a, V(0), V(1), V(2));
        a.str_s_post(V(0), T3, 4);
        a.fadd_s(V(5), V(5), V(0));
    });
    a.faddp_4s(V(4), V(4), V(4));
    a.faddp_s(V(4), V(4));
    a.fadd_s(V(4), V(4), V(5));
    a.fadd_s(DEN, DEN, V(4));

    emit_pv(a, spec);

    a.add_lsl(T24, T24, T27, 2);
    a.madd(T26, T27, VSTR, T26);
    a.subs(T25, T25, T27);
    a.b_cond(Cond::Ne, block);
}

/// Widen 8 values at `T8` (then step it by the V row stride) to f32 in
/// `lo`, `hi`.
fn value_chunk(a: &mut A64, spec: &AttentionSpec, lo: V, hi: V) {
    match spec.values {
        ValueStore::F16 => a.ldr_q(hi, T8, 0),
        _ => {
            a.ldr_d(hi, T8, 0);
            a.shll_8h(hi, hi);
            if spec.values == ValueStore::E4M3 {
                a.sshr1_8h(hi, hi);
                a.and_16b(hi, hi, V(7));
            }
        }
    }
    a.add(T8, T8, VSTR);
    a.fcvtl_4s(lo, hi);
    a.fcvtl2_4s(hi, hi);
}

/// num[c] = num[c]·rescale + Σ_j p_j·v_j[c], output chunk outer, keys inner.
fn emit_pv(a: &mut A64, spec: &AttentionSpec) {
    a.comment("PV: num = num·rescale + Σ p_j·v_j, 8 lanes of d per pass over the block");
    if spec.values == ValueStore::E4M3 {
        a.mvni_bfff_8h(V(7));
    }
    let vb = spec.value_bytes();
    a.mov(T3, NUM);
    a.mov(T4, T26);
    a.mov(T0, D8);
    count_loop(a, T0, 8, |a| {
        a.ldp_q(V(4), V(5), T3, 0);
        a.fmul_4s(V(4), V(4), V(3));
        a.fmul_4s(V(5), V(5), V(3));
        a.mov(T8, T4);
        a.mov(T28, T24);
        a.mov(T23, T27);
        count_loop(a, T23, 1, |a| {
            a.ldr_s(V(0), T28, 0);
            a.add_imm(T28, T28, 4);
            value_chunk(a, spec, V(1), V(2));
            a.fmla_4s_elem(V(4), V(1), V(0), 0);
            a.fmla_4s_elem(V(5), V(2), V(0), 0);
        });
        a.stp_q(V(4), V(5), T3, 0);
        a.add_imm(T3, T3, 32);
        a.add_imm(T4, T4, 8 * vb);
    });
    a.comment("tail lanes d % 8");
    a.sub(T0, D, D8);
    count_loop(a, T0, 1, |a| {
        a.ldr_s(V(4), T3, 0);
        a.fmul_s(V(4), V(4), V(3));
        a.mov(T8, T4);
        a.mov(T28, T24);
        a.mov(T23, T27);
        count_loop(a, T23, 1, |a| {
            a.ldr_s_post(V(0), T28, 4);
            match spec.values {
                ValueStore::F16 => {
                    a.ldr_h(V(1), T8);
                    a.fcvt_s_h(V(1), V(1));
                }
                _ => {
                    a.ldr_b(V(1), T8);
                    a.shll_8h(V(1), V(1));
                    if spec.values == ValueStore::E4M3 {
                        a.sshr1_8h(V(1), V(1));
                        a.and_16b(V(1), V(1), V(7));
                    }
                    a.fcvt_s_h(V(1), V(1));
                }
            }
            a.add(T8, T8, VSTR);
            a.fmadd_s(V(4), V(0), V(1), V(4));
        });
        a.str_s_post(V(4), T3, 4);
        a.add_imm(T4, T4, vb);
    });
}

/// o = num / den, rounded to f16.
fn emit_output(a: &mut A64, spec: &AttentionSpec) {
    a.comment("o = num / den to f16");
    if spec.values == ValueStore::E4M3 {
        a.comment("e4m3 values were widened as v·2^-8: den·2^-8");
        scalar_f32(a, V(0), 1.0 / 256.0, T3);
        a.fmul_s(DEN, DEN, V(0));
    }
    a.dup_4s(V(3), DEN, 0);
    a.mul(T4, H, D);
    a.add_lsl(T4, O, T4, 1);
    a.mov(T3, NUM);
    a.mov(T0, D8);
    count_loop(a, T0, 8, |a| {
        a.ldp_q_post(V(0), V(1), T3, 32);
        a.fdiv_4s(V(0), V(0), V(3));
        a.fdiv_4s(V(1), V(1), V(3));
        a.fcvtn_4h(V(0), V(0));
        a.fcvtn2_8h(V(0), V(1));
        a.str_q_post(V(0), T4, 16);
    });
    a.sub(T0, D, D8);
    count_loop(a, T0, 1, |a| {
        a.ldr_s_post(V(0), T3, 4);
        a.fdiv_s(V(0), V(0), DEN);
        a.fcvt_h_s(V(0), V(0));
        a.str_h_post(V(0), T4, 2);
    });
    a.comment("leave the head's softmax state: scratch[s] = den, scratch[s + 2d] = max (num stays at scratch[s + d..])");
    let skip = a.new_label();
    a.cbz(D, skip);
    a.str_s(DEN, QS, 0);
    a.str_s(BMAX, Q16, 0);
    a.bind(skip);
}
