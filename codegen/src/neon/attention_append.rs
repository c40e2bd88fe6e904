//! The KV append for NEON: quantize the new token's K and V (f16
//! `[kvh, d]`, straight from the projections) and write them in place at
//! cache row `pos`, in the attention kernel's cache formats. The codes,
//! scales and offsets are bit-for-bit those of `tessera_dsl::quant::quantize`
//! (tested).
//!
//! - f16 keys or values: copied.
//! - `i8asym:row` keys: per (token, KV head) row, min and max in f32, then
//!   `scale = f32((max − min) / 255)` and the codes
//!   `round_even((w − min) / scale) − 128` computed in f64 scalar (the
//!   reference's arithmetic, operation for operation), clamped to
//!   [-128, 127]; `offset = f32(min + 128·scale)`.
//! - fp8 values, from the f16 bit pattern: e5m2 rounds the 10-bit mantissa
//!   to 2 bits (round to nearest even, carry into the exponent); e4m3 does
//!   the same to 3 bits and re-biases the exponent, except below 2^-6 where
//!   the code is `round_even(|x|·2^9)`; both saturate to the largest finite
//!   code, and NaN becomes the format's NaN code.
//!
//! Scalar code: one token's rows are `kvh·d` elements, noise next to the
//! `s·kvh·d` an attention step reads.

use half::f16;
use tessera_dsl::ir::{Format, Group, Kernel, ParamType};

use super::asm::{A64, Cond, V, X};
use super::attention_asm::AttentionAsm;
use super::frame;
use crate::abi::KernelFn;
use crate::artifact::{Arch, EmitError, MachineCode};
use crate::jit::{JitCode, JitError};
use crate::target::TargetCaps;

/// Arguments of the KV append kernel.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AppendArgs {
    /// f16 `[kvh, d]`: the new token's keys.
    pub k_new: *const u8,
    /// f16 `[kvh, d]`: the new token's values.
    pub v_new: *const u8,
    /// Key cache `[capacity, kvh, d]`.
    pub k: *mut u8,
    /// One f32 per cache row (quantized keys), or null.
    pub k_scales: *mut f32,
    /// One f32 per cache row (asymmetric keys), or null.
    pub k_offsets: *mut f32,
    /// Value cache `[capacity, kvh, d]`.
    pub v: *mut u8,
    /// The token row to write.
    pub pos: usize,
    pub kvh: usize,
    pub d: usize,
}

const AP_K_NEW: u32 = std::mem::offset_of!(AppendArgs, k_new) as u32;
const AP_V_NEW: u32 = std::mem::offset_of!(AppendArgs, v_new) as u32;
const AP_K: u32 = std::mem::offset_of!(AppendArgs, k) as u32;
const AP_K_SCALES: u32 = std::mem::offset_of!(AppendArgs, k_scales) as u32;
const AP_K_OFFSETS: u32 = std::mem::offset_of!(AppendArgs, k_offsets) as u32;
const AP_V: u32 = std::mem::offset_of!(AppendArgs, v) as u32;
const AP_POS: u32 = std::mem::offset_of!(AppendArgs, pos) as u32;
const AP_KVH: u32 = std::mem::offset_of!(AppendArgs, kvh) as u32;
const AP_D: u32 = std::mem::offset_of!(AppendArgs, d) as u32;

/// Cache formats the append writes: keys f16 or `i8asym:row`, values f16,
/// e4m3 or e5m2.
fn formats(caps: &TargetCaps, kernel: &Kernel) -> Result<(Format, Format), EmitError> {
    let unsupported = |what: String| EmitError::Unsupported {
        backend: caps.name,
        what,
    };
    let a = kernel
        .as_attention()
        .ok_or_else(|| unsupported(format!("kernel `{}` is not attention", kernel.name)))?;
    let fmt = |n: &str| {
        kernel
            .tensor(n)
            .map(|t| t.format)
            .ok_or_else(|| unsupported(format!("missing tensor `{n}`")))
    };
    let (kf, vf) = (fmt(&a.k)?, fmt(&a.v)?);
    if !matches!(kf, Format::F16 | Format::I8Asym(Group::Row, ParamType::F32)) {
        return Err(unsupported(format!(
            "KV append of {kf} keys (NEON: f16, i8asym:row)"
        )));
    }
    if !matches!(vf, Format::F16 | Format::Fp8E4M3 | Format::Fp8E5M2) {
        return Err(unsupported(format!(
            "KV append of {vf} values (NEON: f16, fp8e4m3, fp8e5m2)"
        )));
    }
    Ok((kf, vf))
}

/// An f64 constant in the low lane of `v` (via `tmp`).
fn f64_const(a: &mut A64, v: V, value: f64, tmp: X) {
    a.mov_imm(tmp, value.to_bits());
    a.fmov_d_x(v, tmp);
}

/// Emit the KV append kernel for the cache formats of attention `kernel`.
pub fn emit(caps: &TargetCaps, kernel: &Kernel) -> Result<MachineCode, EmitError> {
    let (kf, vf) = formats(caps, kernel)?;
    let mut a = A64::new();
    a.header(&format!(
        "{} {} KV append: keys {kf}, values {vf} (scalar, in place at row pos)",
        kernel.name, caps.name
    ));
    a.header("x1 x2: new K, V (f16) | x3 x4 x5 x6: K codes, scales, offsets, V | x10: pos·kvh | x11: pos·kvh·d | x12: kvh·d");
    frame::prologue(&mut a, 16);
    let args = X(0);
    a.ldr_x(X(1), args, AP_K_NEW);
    a.ldr_x(X(2), args, AP_V_NEW);
    a.ldr_x(X(3), args, AP_K);
    a.ldr_x(X(4), args, AP_K_SCALES);
    a.ldr_x(X(5), args, AP_K_OFFSETS);
    a.ldr_x(X(6), args, AP_V);
    a.ldr_x(X(7), args, AP_POS);
    a.ldr_x(X(8), args, AP_KVH);
    a.ldr_x(X(9), args, AP_D);
    a.mul(X(10), X(7), X(8));
    a.mul(X(11), X(10), X(9));
    a.mul(X(12), X(8), X(9));

    match kf {
        Format::F16 => {
            a.comment("keys: copy the f16 row");
            a.add_lsl(X(13), X(3), X(11), 1);
            copy_f16(&mut a, X(1), X(13), X(12));
        }
        _ => keys_i8asym(&mut a),
    }
    match vf {
        Format::F16 => {
            a.comment("values: copy the f16 row");
            a.add_lsl(X(13), X(6), X(11), 1);
            copy_f16(&mut a, X(2), X(13), X(12));
        }
        f => values_fp8(&mut a, f == Format::Fp8E4M3),
    }
    frame::epilogue(&mut a, 16);
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

/// `n` halfwords from `src` to `dst` (both advanced).
fn copy_f16(a: &mut A64, src: X, dst: X, n: X) {
    a.mov(X(14), n);
    count(a, X(14), |a| {
        a.ldrh_post2(X(15), src);
        a.strh_post2(X(15), dst);
    });
}

fn count(a: &mut A64, cnt: X, body: impl FnOnce(&mut A64)) {
    let top = a.new_label();
    let done = a.new_label();
    a.cbz(cnt, done);
    a.bind(top);
    body(a);
    a.subs_imm(cnt, cnt, 1);
    a.b_cond(Cond::Ne, top);
    a.bind(done);
}

/// Per row: min/max, scale and offset (f64 as the reference), codes.
fn keys_i8asym(a: &mut A64) {
    a.comment("keys i8asym:row: per row min/max, scale, offset, codes (f64 like the reference)");
    a.add(X(13), X(3), X(11)); // codes
    a.add_lsl(X(16), X(4), X(10), 2); // scales
    a.add_lsl(X(17), X(5), X(10), 2); // offsets
    f64_const(a, V(5), 255.0, X(14));
    f64_const(a, V(17), 128.0, X(14));
    a.mov_imm(X(26), (-128i64) as u64);
    a.mov_imm(X(27), 127);
    a.mov(X(19), X(8));
    count(a, X(19), |a| {
        a.mov(X(20), X(1));
        a.mov_imm(X(14), u64::from(f32::INFINITY.to_bits()));
        a.fmov_s_w(V(0), X(14));
        a.mov_imm(X(14), u64::from(f32::NEG_INFINITY.to_bits()));
        a.fmov_s_w(V(1), X(14));
        a.mov(X(21), X(9));
        count(a, X(21), |a| {
            a.ldr_h_post(V(2), X(20), 2);
            a.fcvt_s_h(V(2), V(2));
            a.fminnm_s(V(0), V(0), V(2));
            a.fmaxnm_s(V(1), V(1), V(2));
        });
        a.fcvt_d_s(V(3), V(1));
        a.fcvt_d_s(V(4), V(0));
        a.fsub_d(V(3), V(3), V(4));
        a.fdiv_d(V(3), V(3), V(5));
        a.fcvt_s_d(V(6), V(3));
        a.str_s_post(V(6), X(16), 4);
        a.fcvt_d_s(V(7), V(6));
        a.fmadd_d(V(16), V(7), V(17), V(4));
        a.fcvt_s_d(V(16), V(16));
        a.str_s_post(V(16), X(17), 4);
        a.mov(X(21), X(9));
        count(a, X(21), |a| {
            a.ldr_h_post(V(2), X(1), 2);
            a.fcvt_d_h(V(2), V(2));
            a.fsub_d(V(2), V(2), V(4));
            a.fdiv_d(V(2), V(2), V(7));
            a.fcvtns_x_d(X(14), V(2));
            a.sub_imm(X(14), X(14), 128);
            a.cmp(X(14), X(26));
            a.csel(X(14), X(26), X(14), Cond::Lt);
            a.cmp(X(14), X(27));
            a.csel(X(14), X(27), X(14), Cond::Gt);
            a.strb_post1(X(14), X(13));
        });
    });
}

/// fp8 values from the f16 bits (see the module doc).
fn values_fp8(a: &mut A64, e4m3: bool) {
    a.comment(if e4m3 {
        "values fp8 e4m3: round the f16 mantissa to 3 bits, re-bias; below 2^-6 round |x|·2^9"
    } else {
        "values fp8 e5m2: round the f16 mantissa to 2 bits"
    });
    let (shift, max_code, nan_code) = if e4m3 {
        (7, 0x7E, 0x7F)
    } else {
        (8, 0x7B, 0x7E)
    };
    a.add(X(13), X(6), X(11));
    a.mov_imm(X(19), 0x7FFF);
    a.mov_imm(X(20), 0x80);
    a.mov_imm(X(21), 0x7C00);
    a.mov_imm(X(22), 1);
    a.mov_imm(X(23), max_code);
    a.mov_imm(X(24), nan_code);
    a.mov_imm(X(25), 0x2400);
    if e4m3 {
        a.mov_imm(X(14), u64::from(512f32.to_bits()));
        a.fmov_s_w(V(18), X(14));
    }
    a.mov(X(28), X(12));
    count(a, X(28), |a| {
        if e4m3 {
            a.ldr_h(V(0), X(2));
        }
        a.ldrh_post2(X(14), X(2));
        a.and(X(15), X(14), X(19));
        a.lsr_imm(X(16), X(14), 8);
        a.and(X(16), X(16), X(20));
        a.lsr_imm(X(17), X(15), shift);
        a.and(X(17), X(17), X(22));
        a.add(X(17), X(17), X(15));
        a.add_imm(X(17), X(17), (1 << (shift - 1)) - 1);
        a.lsr_imm(X(17), X(17), shift);
        if e4m3 {
            a.sub_imm(X(17), X(17), 64);
            a.fcvt_s_h(V(0), V(0));
            a.fabs_s(V(0), V(0));
            a.fmul_s(V(0), V(0), V(18));
            a.fcvtns_w_s(X(7), V(0));
            a.cmp(X(15), X(25));
            a.csel(X(17), X(7), X(17), Cond::Lo);
        }
        a.cmp(X(17), X(23));
        a.csel(X(17), X(23), X(17), Cond::Hi);
        a.cmp(X(15), X(21));
        a.csel(X(17), X(24), X(17), Cond::Hi);
        a.orr(X(17), X(17), X(16));
        a.strb_post1(X(17), X(13));
    });
}

/// Why an append cannot run.
#[derive(Debug, thiserror::Error)]
pub enum AppendError {
    #[error("{what}: expected {expected}, got {got}")]
    Shape {
        what: &'static str,
        expected: String,
        got: String,
    },
    #[error("{0}")]
    Jit(#[from] JitError),
}

/// One side of the cache the append writes, borrowed mutably: f16 rows,
/// or codes with per-row parameters (`scales`, `offsets` empty when the
/// format has none).
#[derive(Debug)]
pub enum KvRowsMut<'a> {
    F16(&'a mut [f16]),
    Codes {
        codes: &'a mut [u8],
        scales: &'a mut [f32],
        offsets: &'a mut [f32],
    },
}

/// The KV append kernel mapped executable.
pub struct NeonKvAppend {
    keys: Format,
    values: Format,
    code: JitCode,
}

impl std::fmt::Debug for NeonKvAppend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NeonKvAppend")
            .field("keys", &self.keys)
            .field("values", &self.values)
            .finish()
    }
}

fn shape(what: &'static str, expected: impl ToString, got: impl ToString) -> AppendError {
    AppendError::Shape {
        what,
        expected: expected.to_string(),
        got: got.to_string(),
    }
}

impl NeonKvAppend {
    /// `code` from [`emit`] for `kernel` on `caps`.
    pub fn new(
        caps: &TargetCaps,
        kernel: &Kernel,
        code: &MachineCode,
    ) -> Result<NeonKvAppend, AppendError> {
        let (keys, values) =
            formats(caps, kernel).map_err(|e| shape("cache formats", "supported", e))?;
        Ok(NeonKvAppend {
            keys,
            values,
            code: JitCode::map(code)?,
        })
    }

    /// Write the new token's `k_new`, `v_new` (f16 `[kvh, d]`) at row `pos`
    /// of caches holding at least `pos + 1` rows of `[kvh, d]`.
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &self,
        k_new: &[f16],
        v_new: &[f16],
        k: KvRowsMut<'_>,
        v: KvRowsMut<'_>,
        pos: usize,
        kvh: usize,
        d: usize,
    ) -> Result<(), AppendError> {
        let row = kvh
            .checked_mul(d)
            .ok_or_else(|| shape("kvh·d", "no overflow", "overflow"))?;
        if k_new.len() != row || v_new.len() != row {
            return Err(shape(
                "new K and V elements (kvh·d)",
                row,
                format!("{} and {}", k_new.len(), v_new.len()),
            ));
        }
        let rows = pos
            .checked_add(1)
            .and_then(|p| p.checked_mul(kvh))
            .ok_or_else(|| shape("(pos + 1)·kvh", "no overflow", "overflow"))?;
        let elems = rows
            .checked_mul(d)
            .ok_or_else(|| shape("(pos + 1)·kvh·d", "no overflow", "overflow"))?;
        let mut ptrs = [(
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        ); 2];
        for (i, (c, f)) in [(k, self.keys), (v, self.values)].into_iter().enumerate() {
            ptrs[i] = match (c, f) {
                (KvRowsMut::F16(x), Format::F16) => {
                    if x.len() < elems {
                        return Err(shape(
                            "cache elements",
                            format!("at least {elems}"),
                            x.len(),
                        ));
                    }
                    (
                        x.as_mut_ptr() as *mut u8,
                        std::ptr::null_mut(),
                        std::ptr::null_mut(),
                    )
                }
                (
                    KvRowsMut::Codes {
                        codes,
                        scales,
                        offsets,
                    },
                    f,
                ) if f != Format::F16 => {
                    if codes.len() < elems {
                        return Err(shape(
                            "cache codes",
                            format!("at least {elems}"),
                            codes.len(),
                        ));
                    }
                    let per_row = f.is_quantized() && f.group().is_some();
                    let want = if per_row { rows } else { 0 };
                    if per_row && scales.len() < want {
                        return Err(shape(
                            "cache scales",
                            format!("at least {want}"),
                            scales.len(),
                        ));
                    }
                    if f.is_asymmetric() && offsets.len() < want {
                        return Err(shape(
                            "cache offsets",
                            format!("at least {want}"),
                            offsets.len(),
                        ));
                    }
                    (
                        codes.as_mut_ptr(),
                        scales.as_mut_ptr(),
                        offsets.as_mut_ptr(),
                    )
                }
                (_, f) => return Err(shape("cache storage", f, "another storage")),
            };
        }
        let args = AppendArgs {
            k_new: k_new.as_ptr() as *const u8,
            v_new: v_new.as_ptr() as *const u8,
            k: ptrs[0].0,
            k_scales: ptrs[0].1,
            k_offsets: ptrs[0].2,
            v: ptrs[1].0,
            pos,
            kvh,
            d,
        };
        // SAFETY: the code was emitted for these cache formats with the
        // AppendArgs ABI; it writes row `pos` (elements pos·kvh·d ..
        // (pos+1)·kvh·d and parameters pos·kvh .. (pos+1)·kvh), all within
        // the lengths checked above, and reads kvh·d f16 of k_new and v_new.
        unsafe {
            let f: KernelFn<AppendArgs> = std::mem::transmute(self.code.entry());
            f(&args);
        }
        Ok(())
    }
}
