//! A thin layer over cranelift's `FunctionBuilder`: counted loops and
//! conditionals over `Variable`s, typed constants, and the numeric helpers
//! every kernel needs (f16/bf16/fp8 widening in integer ops, f32 → f16
//! rounding, a vector `exp`), all in 128-bit vectors.

use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::types::{F32X4, I8, I16, I32, I32X4, I64};
use cranelift_codegen::ir::{
    AbiParam, ConstantData, Endianness, Function, InstBuilder, MemFlagsData, Signature, Type,
    UserFuncName, Value,
};
use cranelift_codegen::isa::{CallConv, TargetFrontendConfig};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext, Variable};
use target_lexicon::PointerWidth;

/// Loads and stores of kernel buffers: never trapping (the runner checked
/// every length), alignment not assumed.
pub(crate) fn mem() -> MemFlagsData {
    MemFlagsData::new().with_notrap()
}

/// Lane order of vector bitcasts.
pub(crate) fn lanes() -> MemFlagsData {
    MemFlagsData::new().with_endianness(Endianness::Little)
}

/// A function `extern "C" fn(*const Args)` with the host's C convention.
pub(crate) fn new_function(name: &str) -> Function {
    let call_conv = if cfg!(target_arch = "aarch64") || !cfg!(windows) {
        CallConv::SystemV
    } else {
        CallConv::WindowsFastcall
    };
    let call_conv = if cfg!(target_arch = "aarch64") && cfg!(target_vendor = "apple") {
        CallConv::AppleAarch64
    } else {
        call_conv
    };
    let mut sig = Signature::new(call_conv);
    sig.params.push(AbiParam::new(I64));
    let mut func = Function::with_name_signature(UserFuncName::testcase(name), sig);
    func.name = UserFuncName::testcase(name);
    func
}

/// The emitter's builder: a `FunctionBuilder` plus loop helpers.
pub(crate) struct Fb<'a> {
    pub b: FunctionBuilder<'a>,
}

impl<'a> Fb<'a> {
    /// Start `func`; returns the builder and the argument-block pointer.
    pub(crate) fn start(
        func: &'a mut Function,
        ctx: &'a mut FunctionBuilderContext,
    ) -> (Self, Value) {
        let mut b = FunctionBuilder::new(func, ctx);
        let entry = b.create_block();
        b.append_block_params_for_function_params(entry);
        b.switch_to_block(entry);
        b.seal_block(entry);
        let args = b.block_params(entry)[0];
        (Fb { b }, args)
    }

    pub(crate) fn finish(mut self) {
        self.b.ins().return_(&[]);
        self.b.seal_all_blocks();
        let call_conv = self.b.func.signature.call_conv;
        self.b.finalize(TargetFrontendConfig {
            default_call_conv: call_conv,
            pointer_width: PointerWidth::U64,
            page_size_align_log2: 12,
        });
    }

    pub(crate) fn var(&mut self, ty: Type, init: Value) -> Variable {
        let v = self.b.declare_var(ty);
        self.b.def_var(v, init);
        v
    }

    pub(crate) fn get(&mut self, v: Variable) -> Value {
        self.b.use_var(v)
    }

    pub(crate) fn set(&mut self, v: Variable, x: Value) {
        self.b.def_var(v, x)
    }

    pub(crate) fn i64c(&mut self, x: i64) -> Value {
        self.b.ins().iconst(I64, x)
    }

    pub(crate) fn i32c(&mut self, x: i64) -> Value {
        self.b.ins().iconst(I32, x)
    }

    pub(crate) fn f32c(&mut self, x: f32) -> Value {
        self.b.ins().f32const(x)
    }

    /// A vector constant: one `vconst`, which the x86-64 lowering reads
    /// from the constant pool as a memory operand (no splat at run time,
    /// and nothing to hoist out of a loop).
    fn vconst(&mut self, ty: Type, lane: [u8; 4]) -> Value {
        let bytes: Vec<u8> = lane.iter().copied().cycle().take(16).collect();
        let c = self.b.func.dfg.constants.insert(ConstantData::from(bytes));
        self.b.ins().vconst(ty, c)
    }

    pub(crate) fn f32x4c(&mut self, x: f32) -> Value {
        self.vconst(F32X4, x.to_le_bytes())
    }

    pub(crate) fn i32x4c(&mut self, x: i64) -> Value {
        self.vconst(I32X4, (x as i32).to_le_bytes())
    }

    /// `x / d` for a positive constant `d`: a shift when `d` is a power of
    /// two (no division instruction is left to the optimiser).
    pub(crate) fn udiv_c(&mut self, x: Value, d: i64) -> Value {
        if d > 0 && (d as u64).is_power_of_two() {
            self.b.ins().ushr_imm_s(x, i64::from(d.trailing_zeros()))
        } else {
            self.b.ins().udiv_imm_s(x, d)
        }
    }

    /// `x % d` for a positive constant `d` (a mask for a power of two).
    pub(crate) fn urem_c(&mut self, x: Value, d: i64) -> Value {
        if d > 0 && (d as u64).is_power_of_two() {
            self.b.ins().band_imm_s(x, d - 1)
        } else {
            self.b.ins().urem_imm_s(x, d)
        }
    }

    /// `x · c` for a constant `c` (a shift for a power of two).
    pub(crate) fn mul_c(&mut self, x: Value, c: i64) -> Value {
        if c > 0 && (c as u64).is_power_of_two() {
            self.b.ins().ishl_imm_s(x, i64::from(c.trailing_zeros()))
        } else {
            self.b.ins().imul_imm_s(x, c)
        }
    }

    /// Load a field of the argument block.
    pub(crate) fn arg(&mut self, args: Value, ty: Type, offset: i32) -> Value {
        self.b.ins().load(ty, MemFlagsData::trusted(), args, offset)
    }

    pub(crate) fn load(&mut self, ty: Type, base: Value, offset: i32) -> Value {
        self.b.ins().load(ty, mem(), base, offset)
    }

    pub(crate) fn store(&mut self, x: Value, base: Value, offset: i32) {
        self.b.ins().store(mem(), x, base, offset);
    }

    /// `base + index·scale` (bytes).
    pub(crate) fn addr(&mut self, base: Value, index: Value, scale: i64) -> Value {
        let off = if scale == 1 {
            index
        } else {
            self.mul_c(index, scale)
        };
        self.b.ins().iadd(base, off)
    }

    /// `while cond() { body() }`, the condition evaluated in the loop
    /// header. Loop-carried values (the caller's variables) become header
    /// parameters, so each value the body computes for the next trip has
    /// one use, the back edge. (A bottom-tested loop would also pass it to
    /// the exit; cranelift's lowering then counts everything it was
    /// computed from as used more than once and stops folding the trip's
    /// loads into their users: `vbroadcastss` from memory, memory
    /// operands.)
    pub(crate) fn while_loop(
        &mut self,
        mut cond: impl FnMut(&mut Self) -> Value,
        mut body: impl FnMut(&mut Self),
    ) {
        let header = self.b.create_block();
        let body_block = self.b.create_block();
        let exit = self.b.create_block();
        self.b.ins().jump(header, &[]);
        self.b.switch_to_block(header);
        let c = cond(self);
        self.b.ins().brif(c, body_block, &[], exit, &[]);
        self.b.switch_to_block(body_block);
        self.b.seal_block(body_block);
        body(self);
        self.b.ins().jump(header, &[]);
        self.b.seal_block(header);
        self.b.switch_to_block(exit);
        self.b.seal_block(exit);
    }

    /// `for i in (start..end).step_by(step) { body(i) }`, i64 induction.
    pub(crate) fn for_range(
        &mut self,
        start: Value,
        end: Value,
        step: i64,
        mut body: impl FnMut(&mut Self, Value),
    ) {
        let i = self.var(I64, start);
        let header = self.b.create_block();
        let body_block = self.b.create_block();
        let exit = self.b.create_block();
        self.b.ins().jump(header, &[]);
        self.b.switch_to_block(header);
        let iv = self.get(i);
        let more = self.b.ins().icmp(IntCC::SignedLessThan, iv, end);
        self.b.ins().brif(more, body_block, &[], exit, &[]);
        self.b.switch_to_block(body_block);
        self.b.seal_block(body_block);
        let iv = self.get(i);
        body(self, iv);
        let iv = self.get(i);
        let next = self.b.ins().iadd_imm_s(iv, step);
        self.set(i, next);
        self.b.ins().jump(header, &[]);
        self.b.seal_block(header);
        self.b.switch_to_block(exit);
        self.b.seal_block(exit);
    }

    /// `if cond { then() }` (cond: an integer, non-zero is true).
    pub(crate) fn if_then(&mut self, cond: Value, then: impl FnOnce(&mut Self)) {
        let then_block = self.b.create_block();
        let join = self.b.create_block();
        self.b.ins().brif(cond, then_block, &[], join, &[]);
        self.b.switch_to_block(then_block);
        self.b.seal_block(then_block);
        then(self);
        self.b.ins().jump(join, &[]);
        self.b.switch_to_block(join);
        self.b.seal_block(join);
    }

    /// `if cond { then() } else { other() }`.
    pub(crate) fn if_else(
        &mut self,
        cond: Value,
        then: impl FnOnce(&mut Self),
        other: impl FnOnce(&mut Self),
    ) {
        let then_block = self.b.create_block();
        let else_block = self.b.create_block();
        let join = self.b.create_block();
        self.b.ins().brif(cond, then_block, &[], else_block, &[]);
        self.b.switch_to_block(then_block);
        self.b.seal_block(then_block);
        then(self);
        self.b.ins().jump(join, &[]);
        self.b.switch_to_block(else_block);
        self.b.seal_block(else_block);
        other(self);
        self.b.ins().jump(join, &[]);
        self.b.switch_to_block(join);
        self.b.seal_block(join);
    }

    pub(crate) fn imin(&mut self, a: Value, b: Value) -> Value {
        self.b.ins().smin(a, b)
    }

    /// `a.div_ceil(d)` for a positive constant `d`.
    pub(crate) fn div_ceil(&mut self, a: Value, d: i64) -> Value {
        let t = self.b.ins().iadd_imm_s(a, d - 1);
        self.udiv_c(t, d)
    }

    /// Horizontal sum of an f32x4 (lanes added in order 0+1, 2+3, then both).
    pub(crate) fn hsum(&mut self, v: Value) -> Value {
        let l: Vec<Value> = (0..4).map(|i| self.b.ins().extractlane(v, i)).collect();
        let a = self.b.ins().fadd(l[0], l[1]);
        let c = self.b.ins().fadd(l[2], l[3]);
        self.b.ins().fadd(a, c)
    }

    /// `a·b + c` in f32 lanes: one fused op where the ISA has it without a
    /// libcall, else a multiply and an add.
    pub(crate) fn madd(&mut self, fused: bool, a: Value, b: Value, c: Value) -> Value {
        if fused {
            self.b.ins().fma(a, b, c)
        } else {
            let p = self.b.ins().fmul(a, b);
            self.b.ins().fadd(p, c)
        }
    }

    fn as_f32x4(&mut self, bits: Value) -> Value {
        self.b.ins().bitcast(F32X4, lanes(), bits)
    }

    fn as_i32x4(&mut self, v: Value) -> Value {
        self.b.ins().bitcast(I32X4, lanes(), v)
    }

    /// f16 bit patterns (zero-extended in i32x4 lanes) → f32x4, exactly:
    /// exponent and mantissa moved into place and rescaled by 2^112
    /// (subnormals come out right), infinities and NaNs patched, sign ORed.
    pub(crate) fn f16_to_f32(&mut self, h: Value) -> Value {
        let mag = self.i32x4_and(h, 0x7fff, h);
        let shifted = self.b.ins().ishl_imm_s(mag, 13);
        let f = self.as_f32x4(shifted);
        let magic = self.f32x4c(f32::from_bits(0x7780_0000)); // 2^112
        let scaled = self.b.ins().fmul(f, magic);
        let scaled = self.as_i32x4(scaled);
        // Inf / NaN: exponent all ones.
        let exp = self.i32x4_and(h, 0x7c00, h);
        let all_ones = self.i32x4c(0x7c00);
        let is_special = self.b.ins().icmp(IntCC::Equal, exp, all_ones);
        let special_bits = self.i32x4c(0x7f80_0000);
        let special = self.b.ins().bor(shifted, special_bits);
        let body = self.b.ins().bitselect(is_special, special, scaled);
        let sign = self.i32x4_and(h, 0x8000, h);
        let sign = self.b.ins().ishl_imm_s(sign, 16);
        let bits = self.b.ins().bor(body, sign);
        self.as_f32x4(bits)
    }

    /// `x & mask` for i32x4 (the `_unused` argument keeps call sites uniform).
    fn i32x4_and(&mut self, x: Value, mask: i64, _unused: Value) -> Value {
        let m = self.i32x4c(mask);
        self.b.ins().band(x, m)
    }

    /// bf16 bit patterns (i32x4 lanes) → f32x4: the top half of an f32.
    pub(crate) fn bf16_to_f32(&mut self, h: Value) -> Value {
        let bits = self.b.ins().ishl_imm_s(h, 16);
        self.as_f32x4(bits)
    }

    /// fp8 e4m3 (OCP, finite: 0x7F/0xFF are NaN) bytes in i32x4 lanes →
    /// f32x4, exactly (exponent rebias by a 2^120 multiply).
    pub(crate) fn e4m3_to_f32(&mut self, b: Value) -> Value {
        let mag = self.i32x4_and(b, 0x7f, b);
        let shifted = self.b.ins().ishl_imm_s(mag, 20);
        let f = self.as_f32x4(shifted);
        let magic = self.f32x4c(f32::from_bits(0x7b80_0000)); // 2^120
        let scaled = self.b.ins().fmul(f, magic);
        let scaled = self.as_i32x4(scaled);
        let nan_code = self.i32x4c(0x7f);
        let is_nan = self.b.ins().icmp(IntCC::Equal, mag, nan_code);
        let nan = self.i32x4c(0x7fc0_0000);
        let body = self.b.ins().bitselect(is_nan, nan, scaled);
        let sign = self.i32x4_and(b, 0x80, b);
        let sign = self.b.ins().ishl_imm_s(sign, 24);
        let bits = self.b.ins().bor(body, sign);
        self.as_f32x4(bits)
    }

    /// fp8 e5m2 bytes (i32x4 lanes) → f32x4: the top byte of an f16.
    pub(crate) fn e5m2_to_f32(&mut self, b: Value) -> Value {
        let h = self.b.ins().ishl_imm_s(b, 8);
        self.f16_to_f32(h)
    }

    /// f32 → f16 bits (in the low 16 of an i32), round to nearest even,
    /// overflow to infinity, NaN to a quiet NaN; vector form, i32x4 lanes.
    pub(crate) fn f32_to_f16(&mut self, x: Value) -> Value {
        let bits = self.as_i32x4(x);
        let sign_mask = self.i32x4c(0x8000_0000u32 as i32 as i64);
        let sign = self.b.ins().band(bits, sign_mask);
        let f = self.b.ins().bxor(bits, sign);
        // Overflow / inf / NaN.
        let f16max = self.i32x4c((127 + 16) << 23);
        let is_big = self
            .b
            .ins()
            .icmp(IntCC::SignedGreaterThanOrEqual, f, f16max);
        let f32inf = self.i32x4c(255 << 23);
        let is_nan = self.b.ins().icmp(IntCC::SignedGreaterThan, f, f32inf);
        let qnan = self.i32x4c(0x7e00);
        let inf = self.i32x4c(0x7c00);
        let big = self.b.ins().bitselect(is_nan, qnan, inf);
        // Subnormal results (and zero): add a magic number in f32 so the
        // FPU's own rounding is round-to-nearest-even at the f16 ulp.
        let denorm_magic_bits = ((127 - 15) + (23 - 10) + 1) << 23;
        let denorm_magic = self.i32x4c(denorm_magic_bits);
        let ff = self.as_f32x4(f);
        let dm = self.as_f32x4(denorm_magic);
        let sum = self.b.ins().fadd(ff, dm);
        let sum = self.as_i32x4(sum);
        let small = self.b.ins().isub(sum, denorm_magic);
        let min_normal = self.i32x4c(113 << 23);
        let is_small = self.b.ins().icmp(IntCC::SignedLessThan, f, min_normal);
        // Normal: rebias, round to nearest even on bit 13.
        let odd = self.b.ins().ushr_imm_s(f, 13);
        let one = self.i32x4c(1);
        let odd = self.b.ins().band(odd, one);
        let rebias = self.i32x4c((((15 - 127) << 23) + 0xfff) as i64);
        let n = self.b.ins().iadd(f, rebias);
        let n = self.b.ins().iadd(n, odd);
        let normal = self.b.ins().ushr_imm_s(n, 13);
        let r = self.b.ins().bitselect(is_small, small, normal);
        let r = self.b.ins().bitselect(is_big, big, r);
        let sign16 = self.b.ins().ushr_imm_s(sign, 16);
        self.b.ins().bor(r, sign16)
    }

    /// f32 → bf16 bits (low 16 of an i32x4 lane), round to nearest even,
    /// NaN kept quiet.
    pub(crate) fn f32_to_bf16(&mut self, x: Value) -> Value {
        let bits = self.as_i32x4(x);
        let lsb = self.b.ins().ushr_imm_s(bits, 16);
        let one = self.i32x4c(1);
        let lsb = self.b.ins().band(lsb, one);
        let bias = self.i32x4c(0x7fff);
        let r = self.b.ins().iadd(bits, bias);
        let r = self.b.ins().iadd(r, lsb);
        let r = self.b.ins().ushr_imm_s(r, 16);
        let is_nan = self.b.ins().fcmp(FloatCC::Unordered, x, x);
        let nan = self.i32x4c(0x7fc0);
        self.b.ins().bitselect(is_nan, nan, r)
    }

    /// e^x for f32x4 lanes: x clamped to [-87.3, 88.7], n = round(x·log2 e),
    /// r = x − n·ln 2 (two-part constant), a degree-6 polynomial for e^r
    /// on |r| ≤ ln2/2, scaled by 2^n built in the exponent bits. Relative
    /// error ≈ 2 ulp; e^x for x below the clamp is ≈ 1e-38, not 0.
    pub(crate) fn exp(&mut self, x: Value) -> Value {
        let lo = self.f32x4c(-87.3);
        let hi = self.f32x4c(88.7);
        let x = self.b.ins().fmax(x, lo);
        let x = self.b.ins().fmin(x, hi);
        let log2e = self.f32x4c(std::f32::consts::LOG2_E);
        let t = self.b.ins().fmul(x, log2e);
        let n = self.b.ins().nearest(t);
        let ln2_hi = self.f32x4c(0.693_359_4);
        let ln2_lo = self.f32x4c(-2.121_944_4e-4);
        let a = self.b.ins().fmul(n, ln2_hi);
        let r = self.b.ins().fsub(x, a);
        let c = self.b.ins().fmul(n, ln2_lo);
        let r = self.b.ins().fsub(r, c);
        // Taylor coefficients 1/k!, Horner from the top.
        let coeffs = [
            1.0 / 720.0,
            1.0 / 120.0,
            1.0 / 24.0,
            1.0 / 6.0,
            0.5,
            1.0,
            1.0,
        ];
        let mut p = self.f32x4c(coeffs[0]);
        for &c in &coeffs[1..] {
            let cv = self.f32x4c(c);
            let m = self.b.ins().fmul(p, r);
            p = self.b.ins().fadd(m, cv);
        }
        let ni = self.b.ins().fcvt_to_sint_sat(I32X4, n);
        let bias = self.i32x4c(127);
        let e = self.b.ins().iadd(ni, bias);
        let e = self.b.ins().ishl_imm_s(e, 23);
        let scale = self.as_f32x4(e);
        self.b.ins().fmul(p, scale)
    }

    /// Scalar e^x through the vector routine.
    pub(crate) fn exp_scalar(&mut self, x: Value) -> Value {
        let v = self.b.ins().splat(F32X4, x);
        let e = self.exp(v);
        self.b.ins().extractlane(e, 0)
    }

    /// Widen `count` (1..=4) consecutive elements of `bits`-wide storage at
    /// `p` into the low lanes of an i32x4 (zero-extended; the other lanes
    /// zero). Uses one vector load when `count == 4`.
    pub(crate) fn load_lanes_u(&mut self, p: Value, offset: i32, bits: u32) -> Value {
        match bits {
            16 => self.b.ins().uload16x4(mem(), p, offset),
            8 => {
                let v = self.b.ins().uload8x8(mem(), p, offset);
                self.b.ins().uwiden_low(v)
            }
            _ => self.b.ins().load(I32X4, mem(), p, offset),
        }
    }

    /// Scalar load of one element of `bits` width, zero-extended to i32.
    pub(crate) fn load_u32(&mut self, p: Value, bits: u32) -> Value {
        match bits {
            8 => self.b.ins().uload8(I32, mem(), p, 0),
            16 => self.b.ins().uload16(I32, mem(), p, 0),
            _ => self.b.ins().load(I32, mem(), p, 0),
        }
    }

    /// Store the low 16 bits of lane 0 of an i32x4.
    pub(crate) fn store_u16_lane(&mut self, v: Value, lane: u8, p: Value) {
        let x = self.b.ins().extractlane(v, lane);
        let h = self.b.ins().ireduce(I16, x);
        self.store(h, p, 0);
    }

    pub(crate) fn store_i8(&mut self, x32: Value, p: Value) {
        let b = self.b.ins().ireduce(I8, x32);
        self.store(b, p, 0);
    }
}
