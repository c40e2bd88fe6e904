//! A typed aarch64 instruction layer over `dynasmrt`.
//!
//! Every method encodes one instruction through `dynasm!` into a
//! [`VecAssembler`] (bytes on any host; the JIT maps the same bytes) and
//! appends its text, in the syntax `llvm-mc -triple=aarch64` accepts, to the
//! listing, so the listing is the emitter's own instruction log. aarch64
//! encodings are fixed-width, so a test assembles the listing with llvm-mc
//! and asserts the bytes are *equal*, not just equivalent.
//!
//! dynasm 5.1 has no `smmla` (FEAT_I8MM): it is emitted as its 32-bit word,
//! `0x4E80A400 | m << 16 | n << 5 | d`, and the llvm-mc check covers it.

// dynasm! expands run-time register operands to `.into()` calls.
#![allow(clippy::useless_conversion)]

use std::fmt;

use dynasmrt::aarch64::Aarch64Relocation;
use dynasmrt::{DynamicLabel, DynasmApi, DynasmLabelApi, VecAssembler, dynasm};

/// A 64-bit general-purpose register `x0..x30` (31 is never used: it means
/// xzr or sp depending on the instruction).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct X(pub u8);

/// A `prfm` operation: where the line goes and whether it is kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prefetch {
    /// Into L1, to be read soon and kept (the weight block a loop is on).
    Pldl1keep,
    /// Into L2, streaming (the next weight block: read once per pass).
    Pldl2strm,
}

impl Prefetch {
    fn name(self) -> &'static str {
        match self {
            Prefetch::Pldl1keep => "pldl1keep",
            Prefetch::Pldl2strm => "pldl2strm",
        }
    }

    /// The prfop field: type (PLD 00), target (L1 00, L2 01), policy (KEEP 0, STRM 1).
    fn code(self) -> u32 {
        match self {
            Prefetch::Pldl1keep => 0b00000,
            Prefetch::Pldl2strm => 0b00011,
        }
    }
}

/// A 128-bit vector register `v0..v31`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct V(pub u8);

impl fmt::Display for X {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "x{}", self.0)
    }
}

impl X {
    /// The 32-bit view.
    pub fn w(self) -> String {
        format!("w{}", self.0)
    }
}

impl fmt::Display for V {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}", self.0)
    }
}

/// How a run of loads addresses memory: post-incrementing the pointer,
/// or at growing offsets from it (an unrolled loop bumps the pointer once
/// per iteration, so its loads do not wait on each other's write-back).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Addr {
    Post,
    /// The next load's offset from the pointer.
    Offset(u32),
}

/// A branch target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Label {
    id: DynamicLabel,
    number: usize,
}

/// Condition codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cond {
    Eq,
    Ne,
    /// unsigned lower
    Lo,
    /// unsigned higher or same
    Hs,
    /// unsigned higher
    Hi,
    /// unsigned lower or same
    Ls,
    /// signed greater than
    Gt,
    /// signed less than
    Lt,
    /// signed greater or equal
    Ge,
    /// signed less or equal
    Le,
    /// float: unordered or not equal (used after fcmp)
    Vs,
}

impl Cond {
    fn name(self) -> &'static str {
        match self {
            Cond::Eq => "eq",
            Cond::Ne => "ne",
            Cond::Lo => "lo",
            Cond::Hs => "hs",
            Cond::Hi => "hi",
            Cond::Ls => "ls",
            Cond::Gt => "gt",
            Cond::Lt => "lt",
            Cond::Ge => "ge",
            Cond::Le => "le",
            Cond::Vs => "vs",
        }
    }

    /// The 4-bit condition field.
    fn code(self) -> u32 {
        match self {
            Cond::Eq => 0,
            Cond::Ne => 1,
            Cond::Hs => 2,
            Cond::Lo => 3,
            Cond::Vs => 6,
            Cond::Hi => 8,
            Cond::Ls => 9,
            Cond::Ge => 10,
            Cond::Lt => 11,
            Cond::Gt => 12,
            Cond::Le => 13,
        }
    }
}

/// Assembler plus listing.
pub struct A64 {
    ops: VecAssembler<Aarch64Relocation>,
    listing: Vec<String>,
    labels: usize,
    /// Instruction count (for the listing's statistics).
    count: usize,
}

impl Default for A64 {
    fn default() -> Self {
        Self::new()
    }
}

impl A64 {
    pub fn new() -> Self {
        A64 {
            ops: VecAssembler::new(0),
            listing: Vec::new(),
            labels: 0,
            count: 0,
        }
    }

    fn log(&mut self, line: String) {
        self.count += 1;
        self.listing.push(format!("    {line}"));
    }

    /// A `// comment` line (no bytes).
    pub fn comment(&mut self, text: &str) {
        self.listing.push(format!("    // {text}"));
    }

    /// A `//` line at column 0 (headers).
    pub fn header(&mut self, text: &str) {
        self.listing.push(format!("// {text}"));
    }

    /// Instructions emitted so far.
    pub fn instructions(&self) -> usize {
        self.count
    }

    /// Finish: bytes and listing. Fails if a label was used but never bound.
    pub fn finish(self) -> Result<(Vec<u8>, String), String> {
        let bytes = self.ops.finalize().map_err(|e| format!("{e:?}"))?;
        let mut listing = self.listing.join("\n");
        listing.push('\n');
        Ok((bytes, listing))
    }

    /// Raw 32-bit instruction word (instructions dynasm does not know).
    fn word(&mut self, w: u32) {
        self.ops.extend(w.to_le_bytes());
    }

    /// One instruction given as its llvm-mc text and its 32-bit encoding,
    /// for kernel-specific instructions kept beside their emitter (the
    /// attention kernels' `attention_asm`); the llvm-mc byte check covers
    /// them like every other instruction.
    pub fn encoded(&mut self, text: String, word: u32) {
        self.log(text);
        self.word(word);
    }

    // ---- labels and branches -------------------------------------------

    pub fn new_label(&mut self) -> Label {
        let id = self.ops.new_dynamic_label();
        self.labels += 1;
        Label {
            id,
            number: self.labels,
        }
    }

    pub fn bind(&mut self, label: Label) {
        self.listing.push(format!(".L{}:", label.number));
        let id = label.id;
        dynasm!(self.ops ; .arch aarch64 ; =>id);
    }

    pub fn b(&mut self, label: Label) {
        self.log(format!("b .L{}", label.number));
        let id = label.id;
        dynasm!(self.ops ; .arch aarch64 ; b =>id);
    }

    pub fn b_cond(&mut self, cond: Cond, label: Label) {
        self.log(format!("b.{} .L{}", cond.name(), label.number));
        let id = label.id;
        // The condition is a field of b.cond; dynasm takes it literally, so
        // each condition is its own expansion.
        match cond {
            Cond::Eq => dynasm!(self.ops ; .arch aarch64 ; b.eq =>id),
            Cond::Ne => dynasm!(self.ops ; .arch aarch64 ; b.ne =>id),
            Cond::Lo => dynasm!(self.ops ; .arch aarch64 ; b.lo =>id),
            Cond::Hs => dynasm!(self.ops ; .arch aarch64 ; b.hs =>id),
            Cond::Hi => dynasm!(self.ops ; .arch aarch64 ; b.hi =>id),
            Cond::Ls => dynasm!(self.ops ; .arch aarch64 ; b.ls =>id),
            Cond::Gt => dynasm!(self.ops ; .arch aarch64 ; b.gt =>id),
            Cond::Lt => dynasm!(self.ops ; .arch aarch64 ; b.lt =>id),
            Cond::Ge => dynasm!(self.ops ; .arch aarch64 ; b.ge =>id),
            Cond::Le => dynasm!(self.ops ; .arch aarch64 ; b.le =>id),
            Cond::Vs => dynasm!(self.ops ; .arch aarch64 ; b.vs =>id),
        }
    }

    pub fn cbz(&mut self, r: X, label: Label) {
        self.log(format!("cbz {r}, .L{}", label.number));
        let (r, id) = (r.0, label.id);
        dynasm!(self.ops ; .arch aarch64 ; cbz X(r), =>id);
    }

    pub fn cbnz(&mut self, r: X, label: Label) {
        self.log(format!("cbnz {r}, .L{}", label.number));
        let (r, id) = (r.0, label.id);
        dynasm!(self.ops ; .arch aarch64 ; cbnz X(r), =>id);
    }

    pub fn ret(&mut self) {
        self.log("ret".into());
        dynasm!(self.ops ; .arch aarch64 ; ret);
    }

    // ---- general-purpose ------------------------------------------------

    /// `ldr xd, [xn, #off]` (off a multiple of 8).
    pub fn ldr_x(&mut self, d: X, n: X, off: u32) {
        self.log(format!("ldr {d}, [{n}, #{off}]"));
        let (d, n) = (d.0, n.0);
        dynasm!(self.ops ; .arch aarch64 ; ldr X(d), [X(n), off]);
    }

    /// `str xt, [xn, #off]` (off a multiple of 8).
    pub fn str_x(&mut self, t: X, n: X, off: u32) {
        self.log(format!("str {t}, [{n}, #{off}]"));
        let (t, n) = (t.0, n.0);
        dynasm!(self.ops ; .arch aarch64 ; str X(t), [X(n), off]);
    }

    /// `ldr xd, [sp, #off]`
    pub fn ldr_x_sp(&mut self, d: X, off: u32) {
        self.log(format!("ldr {d}, [sp, #{off}]"));
        let d = d.0;
        dynasm!(self.ops ; .arch aarch64 ; ldr X(d), [sp, off]);
    }

    /// `str xt, [sp, #off]`
    pub fn str_x_sp(&mut self, t: X, off: u32) {
        self.log(format!("str {t}, [sp, #{off}]"));
        let t = t.0;
        dynasm!(self.ops ; .arch aarch64 ; str X(t), [sp, off]);
    }

    /// `stp xa, xb, [sp, #-16]!`
    pub fn push_pair(&mut self, a: X, b: X) {
        self.log(format!("stp {a}, {b}, [sp, #-16]!"));
        let (a, b) = (a.0, b.0);
        dynasm!(self.ops ; .arch aarch64 ; stp X(a), X(b), [sp, -16]!);
    }

    /// `ldp xa, xb, [sp], #16`
    pub fn pop_pair(&mut self, a: X, b: X) {
        self.log(format!("ldp {a}, {b}, [sp], #16"));
        let (a, b) = (a.0, b.0);
        dynasm!(self.ops ; .arch aarch64 ; ldp X(a), X(b), [sp], 16);
    }

    /// `stp da, db, [sp, #-16]!` (callee-saved low halves of v8..v15)
    pub fn push_pair_d(&mut self, a: V, b: V) {
        self.log(format!("stp d{}, d{}, [sp, #-16]!", a.0, b.0));
        let (a, b) = (a.0, b.0);
        dynasm!(self.ops ; .arch aarch64 ; stp D(a), D(b), [sp, -16]!);
    }

    /// `ldp da, db, [sp], #16`
    pub fn pop_pair_d(&mut self, a: V, b: V) {
        self.log(format!("ldp d{}, d{}, [sp], #16", a.0, b.0));
        let (a, b) = (a.0, b.0);
        dynasm!(self.ops ; .arch aarch64 ; ldp D(a), D(b), [sp], 16);
    }

    /// `sub sp, sp, #imm` (imm < 4096 · 4096, a multiple of 16).
    pub fn sub_sp(&mut self, imm: u32) {
        let (lo, hi) = (imm & 0xfff, imm >> 12);
        if hi > 0 {
            self.log(format!("sub sp, sp, #{hi}, lsl #12"));
            dynasm!(self.ops ; .arch aarch64 ; sub sp, sp, hi, lsl 12);
        }
        if lo > 0 || hi == 0 {
            self.log(format!("sub sp, sp, #{lo}"));
            dynasm!(self.ops ; .arch aarch64 ; sub sp, sp, lo);
        }
    }

    /// `add sp, sp, #imm`
    pub fn add_sp(&mut self, imm: u32) {
        let (lo, hi) = (imm & 0xfff, imm >> 12);
        if hi > 0 {
            self.log(format!("add sp, sp, #{hi}, lsl #12"));
            dynasm!(self.ops ; .arch aarch64 ; add sp, sp, hi, lsl 12);
        }
        if lo > 0 || hi == 0 {
            self.log(format!("add sp, sp, #{lo}"));
            dynasm!(self.ops ; .arch aarch64 ; add sp, sp, lo);
        }
    }

    /// `add xd, sp, #imm` (imm < 4096 · 4096: split into 12-bit halves).
    pub fn add_from_sp(&mut self, d: X, imm: u32) {
        let (lo, hi) = (imm & 0xfff, imm >> 12);
        assert!(hi < 4096, "add immediate {imm} out of range");
        if hi == 0 {
            self.log(format!("add {d}, sp, #{imm}"));
            let d = d.0;
            dynasm!(self.ops ; .arch aarch64 ; add XSP(d), sp, imm);
            return;
        }
        self.log(format!("add {d}, sp, #{hi}, lsl #12"));
        let r = d.0;
        dynasm!(self.ops ; .arch aarch64 ; add XSP(r), sp, hi, lsl 12);
        if lo > 0 {
            self.add_imm(d, d, lo);
        }
    }

    pub fn mov(&mut self, d: X, n: X) {
        self.log(format!("mov {d}, {n}"));
        let (d, n) = (d.0, n.0);
        dynasm!(self.ops ; .arch aarch64 ; mov X(d), X(n));
    }

    /// Any 64-bit constant, as `movz` plus the `movk`s it needs.
    pub fn mov_imm(&mut self, d: X, value: u64) {
        let r = d.0;
        let mut first = true;
        for shift in [0u32, 16, 32, 48] {
            let part = ((value >> shift) & 0xffff) as u32;
            if part == 0 && !(first && shift == 48) && !(first && value == 0) {
                continue;
            }
            if first {
                self.log(format!("movz {d}, #{part}, lsl #{shift}"));
                dynasm!(self.ops ; .arch aarch64 ; movz X(r), part, lsl shift);
                first = false;
            } else {
                self.log(format!("movk {d}, #{part}, lsl #{shift}"));
                dynasm!(self.ops ; .arch aarch64 ; movk X(r), part, lsl shift);
            }
            if value == 0 {
                break;
            }
        }
    }

    /// `add xd, xn, #imm` for any imm (split into 12-bit halves).
    pub fn add_imm(&mut self, d: X, n: X, imm: u32) {
        let (lo, hi) = (imm & 0xfff, imm >> 12);
        assert!(hi < 4096, "add immediate {imm} out of range");
        let (rd, rn) = (d.0, n.0);
        if hi > 0 {
            self.log(format!("add {d}, {n}, #{hi}, lsl #12"));
            dynasm!(self.ops ; .arch aarch64 ; add XSP(rd), XSP(rn), hi, lsl 12);
            if lo > 0 {
                self.log(format!("add {d}, {d}, #{lo}"));
                dynasm!(self.ops ; .arch aarch64 ; add XSP(rd), XSP(rd), lo);
            }
        } else {
            self.log(format!("add {d}, {n}, #{lo}"));
            dynasm!(self.ops ; .arch aarch64 ; add XSP(rd), XSP(rn), lo);
        }
    }

    /// `sub xd, xn, #imm` (imm < 4096)
    pub fn sub_imm(&mut self, d: X, n: X, imm: u32) {
        self.log(format!("sub {d}, {n}, #{imm}"));
        let (d, n) = (d.0, n.0);
        dynasm!(self.ops ; .arch aarch64 ; sub XSP(d), XSP(n), imm);
    }

    /// `subs xd, xn, #imm` (imm < 4096)
    pub fn subs_imm(&mut self, d: X, n: X, imm: u32) {
        self.log(format!("subs {d}, {n}, #{imm}"));
        let (d, n) = (d.0, n.0);
        dynasm!(self.ops ; .arch aarch64 ; subs X(d), XSP(n), imm);
    }

    pub fn add(&mut self, d: X, n: X, m: X) {
        self.log(format!("add {d}, {n}, {m}"));
        let (d, n, m) = (d.0, n.0, m.0);
        dynasm!(self.ops ; .arch aarch64 ; add X(d), X(n), X(m));
    }

    /// `add xd, xn, xm, lsl #s`
    pub fn add_lsl(&mut self, d: X, n: X, m: X, s: u32) {
        self.log(format!("add {d}, {n}, {m}, lsl #{s}"));
        let (d, n, m) = (d.0, n.0, m.0);
        dynasm!(self.ops ; .arch aarch64 ; add X(d), X(n), X(m), lsl s);
    }

    pub fn sub(&mut self, d: X, n: X, m: X) {
        self.log(format!("sub {d}, {n}, {m}"));
        let (d, n, m) = (d.0, n.0, m.0);
        dynasm!(self.ops ; .arch aarch64 ; sub X(d), X(n), X(m));
    }

    pub fn subs(&mut self, d: X, n: X, m: X) {
        self.log(format!("subs {d}, {n}, {m}"));
        let (d, n, m) = (d.0, n.0, m.0);
        dynasm!(self.ops ; .arch aarch64 ; subs X(d), X(n), X(m));
    }

    pub fn mul(&mut self, d: X, n: X, m: X) {
        self.log(format!("mul {d}, {n}, {m}"));
        let (d, n, m) = (d.0, n.0, m.0);
        dynasm!(self.ops ; .arch aarch64 ; mul X(d), X(n), X(m));
    }

    /// `madd xd, xn, xm, xa` = a + n·m
    pub fn madd(&mut self, d: X, n: X, m: X, a: X) {
        self.log(format!("madd {d}, {n}, {m}, {a}"));
        let (d, n, m, a) = (d.0, n.0, m.0, a.0);
        dynasm!(self.ops ; .arch aarch64 ; madd X(d), X(n), X(m), X(a));
    }

    pub fn udiv(&mut self, d: X, n: X, m: X) {
        self.log(format!("udiv {d}, {n}, {m}"));
        let (d, n, m) = (d.0, n.0, m.0);
        dynasm!(self.ops ; .arch aarch64 ; udiv X(d), X(n), X(m));
    }

    pub fn lsl_imm(&mut self, d: X, n: X, s: u32) {
        self.log(format!("lsl {d}, {n}, #{s}"));
        let (d, n) = (d.0, n.0);
        dynasm!(self.ops ; .arch aarch64 ; lsl X(d), X(n), s);
    }

    pub fn lsr_imm(&mut self, d: X, n: X, s: u32) {
        self.log(format!("lsr {d}, {n}, #{s}"));
        let (d, n) = (d.0, n.0);
        dynasm!(self.ops ; .arch aarch64 ; lsr X(d), X(n), s);
    }

    pub fn cmp(&mut self, n: X, m: X) {
        self.log(format!("cmp {n}, {m}"));
        let (n, m) = (n.0, m.0);
        dynasm!(self.ops ; .arch aarch64 ; cmp X(n), X(m));
    }

    /// `cmp xn, #imm` (imm < 4096)
    pub fn cmp_imm(&mut self, n: X, imm: u32) {
        self.log(format!("cmp {n}, #{imm}"));
        let n = n.0;
        dynasm!(self.ops ; .arch aarch64 ; cmp XSP(n), imm);
    }

    /// `csel xd, xn, xm, cond`: d = cond ? n : m.
    pub fn csel(&mut self, d: X, n: X, m: X, cond: Cond) {
        self.log(format!("csel {d}, {n}, {m}, {}", cond.name()));
        // csel: sf=1 0 0 11010100 Rm cond 0 0 Rn Rd
        let w = 0x9A80_0000
            | u32::from(m.0) << 16
            | cond.code() << 12
            | u32::from(n.0) << 5
            | u32::from(d.0);
        self.word(w);
    }

    // ---- vector loads and stores ------------------------------------------

    /// `ldr qt, [xn], #imm` (post-index, imm < 256)
    pub fn ldr_q_post(&mut self, t: V, n: X, imm: i32) {
        self.log(format!("ldr q{}, [{n}], #{imm}", t.0));
        let (t, n) = (t.0, n.0);
        dynasm!(self.ops ; .arch aarch64 ; ldr Q(t), [X(n)], imm);
    }

    /// `ldr qt, [xn, #off]` (off a multiple of 16)
    pub fn ldr_q(&mut self, t: V, n: X, off: u32) {
        self.log(format!("ldr q{}, [{n}, #{off}]", t.0));
        let (t, n) = (t.0, n.0);
        dynasm!(self.ops ; .arch aarch64 ; ldr Q(t), [X(n), off]);
    }

    /// `str qt, [xn, #off]`
    pub fn str_q(&mut self, t: V, n: X, off: u32) {
        self.log(format!("str q{}, [{n}, #{off}]", t.0));
        let (t, n) = (t.0, n.0);
        dynasm!(self.ops ; .arch aarch64 ; str Q(t), [X(n), off]);
    }

    /// `str qt, [xn], #imm` (post-index)
    pub fn str_q_post(&mut self, t: V, n: X, imm: i32) {
        self.log(format!("str q{}, [{n}], #{imm}", t.0));
        let (t, n) = (t.0, n.0);
        dynasm!(self.ops ; .arch aarch64 ; str Q(t), [X(n)], imm);
    }

    /// `ldp qa, qb, [xn], #imm` (post-index, imm a multiple of 16)
    pub fn ldp_q_post(&mut self, a: V, b: V, n: X, imm: i32) {
        self.log(format!("ldp q{}, q{}, [{n}], #{imm}", a.0, b.0));
        let (a, b, n) = (a.0, b.0, n.0);
        dynasm!(self.ops ; .arch aarch64 ; ldp Q(a), Q(b), [X(n)], imm);
    }

    /// `ldp qa, qb, [xn, #off]`
    pub fn ldp_q(&mut self, a: V, b: V, n: X, off: i32) {
        self.log(format!("ldp q{}, q{}, [{n}, #{off}]", a.0, b.0));
        let (a, b, n) = (a.0, b.0, n.0);
        dynasm!(self.ops ; .arch aarch64 ; ldp Q(a), Q(b), [X(n), off]);
    }

    /// `stp qa, qb, [xn, #off]`
    pub fn stp_q(&mut self, a: V, b: V, n: X, off: i32) {
        self.log(format!("stp q{}, q{}, [{n}, #{off}]", a.0, b.0));
        let (a, b, n) = (a.0, b.0, n.0);
        dynasm!(self.ops ; .arch aarch64 ; stp Q(a), Q(b), [X(n), off]);
    }

    /// `ldr dt, [xn], #imm` (post-index)
    pub fn ldr_d_post(&mut self, t: V, n: X, imm: i32) {
        self.log(format!("ldr d{}, [{n}], #{imm}", t.0));
        let (t, n) = (t.0, n.0);
        dynasm!(self.ops ; .arch aarch64 ; ldr D(t), [X(n)], imm);
    }

    /// `ldr st, [xn], #imm` (post-index)
    pub fn ldr_s_post(&mut self, t: V, n: X, imm: i32) {
        self.log(format!("ldr s{}, [{n}], #{imm}", t.0));
        let (t, n) = (t.0, n.0);
        dynasm!(self.ops ; .arch aarch64 ; ldr S(t), [X(n)], imm);
    }

    /// `ldr ht, [xn], #imm` (post-index)
    pub fn ldr_h_post(&mut self, t: V, n: X, imm: i32) {
        self.log(format!("ldr h{}, [{n}], #{imm}", t.0));
        let (t, n) = (t.0, n.0);
        dynasm!(self.ops ; .arch aarch64 ; ldr H(t), [X(n)], imm);
    }

    /// `ldr ht, [xn, #off]` (`off` a multiple of 2)
    pub fn ldr_h_off(&mut self, t: V, n: X, off: u32) {
        self.log(format!("ldr h{}, [{n}, #{off}]", t.0));
        let (t, n) = (t.0, n.0);
        dynasm!(self.ops ; .arch aarch64 ; ldr H(t), [X(n), off]);
    }

    /// `ldr dt, [xn, #off]`
    pub fn ldr_d(&mut self, t: V, n: X, off: u32) {
        self.log(format!("ldr d{}, [{n}, #{off}]", t.0));
        let (t, n) = (t.0, n.0);
        dynasm!(self.ops ; .arch aarch64 ; ldr D(t), [X(n), off]);
    }

    /// `ldr st, [xn, #off]`
    pub fn ldr_s(&mut self, t: V, n: X, off: u32) {
        self.log(format!("ldr s{}, [{n}, #{off}]", t.0));
        let (t, n) = (t.0, n.0);
        dynasm!(self.ops ; .arch aarch64 ; ldr S(t), [X(n), off]);
    }

    /// `str dt, [xn, #off]`
    pub fn str_d(&mut self, t: V, n: X, off: u32) {
        self.log(format!("str d{}, [{n}, #{off}]", t.0));
        let (t, n) = (t.0, n.0);
        dynasm!(self.ops ; .arch aarch64 ; str D(t), [X(n), off]);
    }

    /// `str st, [xn, #off]`
    pub fn str_s(&mut self, t: V, n: X, off: u32) {
        self.log(format!("str s{}, [{n}, #{off}]", t.0));
        let (t, n) = (t.0, n.0);
        dynasm!(self.ops ; .arch aarch64 ; str S(t), [X(n), off]);
    }

    /// `str dt, [xn], #imm` (post-index)
    pub fn str_d_post(&mut self, t: V, n: X, imm: i32) {
        self.log(format!("str d{}, [{n}], #{imm}", t.0));
        let (t, n) = (t.0, n.0);
        dynasm!(self.ops ; .arch aarch64 ; str D(t), [X(n)], imm);
    }

    /// `str st, [xn], #imm` (post-index)
    pub fn str_s_post(&mut self, t: V, n: X, imm: i32) {
        self.log(format!("str s{}, [{n}], #{imm}", t.0));
        let (t, n) = (t.0, n.0);
        dynasm!(self.ops ; .arch aarch64 ; str S(t), [X(n)], imm);
    }

    /// `str ht, [xn], #imm` (post-index)
    pub fn str_h_post(&mut self, t: V, n: X, imm: i32) {
        self.log(format!("str h{}, [{n}], #{imm}", t.0));
        let (t, n) = (t.0, n.0);
        dynasm!(self.ops ; .arch aarch64 ; str H(t), [X(n)], imm);
    }

    /// `ld1r {vt.4s}, [xn]`
    pub fn ld1r_4s(&mut self, t: V, n: X) {
        self.log(format!("ld1r {{ {t}.4s }}, [{n}]"));
        let (t, n) = (t.0, n.0);
        dynasm!(self.ops ; .arch aarch64 ; ld1r {V(t).S4 * 1}, [X(n)]);
    }

    /// `ld1r {vt.4s}, [xn], xm` (post-index by a register)
    pub fn ld1r_4s_post(&mut self, t: V, n: X, m: X) {
        self.log(format!("ld1r {{ {t}.4s }}, [{n}], {m}"));
        let (t, n, m) = (t.0, n.0, m.0);
        dynasm!(self.ops ; .arch aarch64 ; ld1r {V(t).S4 * 1}, [X(n)], X(m));
    }

    /// `ld1r {vt.2s}, [xn]`: 4 bytes replicated into both lanes of the
    /// low half (the high half cleared).
    pub fn ld1r_2s(&mut self, t: V, n: X) {
        self.log(format!("ld1r {{ {t}.2s }}, [{n}]"));
        let (t, n) = (t.0, n.0);
        dynasm!(self.ops ; .arch aarch64 ; ld1r {V(t).S2 * 1}, [X(n)]);
    }

    /// `ld1r {vt.2d}, [xn]`: 8 bytes replicated into both halves.
    pub fn ld1r_2d(&mut self, t: V, n: X) {
        self.log(format!("ld1r {{ {t}.2d }}, [{n}]"));
        let (t, n) = (t.0, n.0);
        dynasm!(self.ops ; .arch aarch64 ; ld1r {V(t).D2 * 1}, [X(n)]);
    }

    /// `ld1 {vt.s}[lane], [xn], xm` (post-index by a register)
    pub fn ld1_s_lane_post(&mut self, t: V, lane: u32, n: X, m: X) {
        self.log(format!("ld1 {{ {t}.s }}[{lane}], [{n}], {m}"));
        let (t, n, m) = (t.0, n.0, m.0);
        dynasm!(self.ops ; .arch aarch64 ; ld1 {V(t).S * 1}[lane], [X(n)], X(m));
    }

    /// `ld1 {vt.s}[lane], [xn], #4`
    pub fn ld1_s_lane_post4(&mut self, t: V, lane: u32, n: X) {
        self.log(format!("ld1 {{ {t}.s }}[{lane}], [{n}], #4"));
        let (t, n) = (t.0, n.0);
        dynasm!(self.ops ; .arch aarch64 ; ld1 {V(t).S * 1}[lane], [X(n)], 4);
    }

    /// `ld1 {vt.h}[lane], [xn], #2`
    pub fn ld1_h_lane_post2(&mut self, t: V, lane: u32, n: X) {
        self.log(format!("ld1 {{ {t}.h }}[{lane}], [{n}], #2"));
        let (t, n) = (t.0, n.0);
        dynasm!(self.ops ; .arch aarch64 ; ld1 {V(t).H * 1}[lane], [X(n)], 2);
    }

    /// `ld1 {vt.h}[lane], [xn]`
    pub fn ld1_h_lane(&mut self, t: V, lane: u32, n: X) {
        self.log(format!("ld1 {{ {t}.h }}[{lane}], [{n}]"));
        let (t, n) = (t.0, n.0);
        dynasm!(self.ops ; .arch aarch64 ; ld1 {V(t).H * 1}[lane], [X(n)]);
    }

    /// `ld1 {vt.s}[lane], [xn]`
    pub fn ld1_s_lane(&mut self, t: V, lane: u32, n: X) {
        self.log(format!("ld1 {{ {t}.s }}[{lane}], [{n}]"));
        let (t, n) = (t.0, n.0);
        dynasm!(self.ops ; .arch aarch64 ; ld1 {V(t).S * 1}[lane], [X(n)]);
    }

    /// `st1 {vt.d}[1], [xn]`
    pub fn st1_d_lane1(&mut self, t: V, n: X) {
        self.log(format!("st1 {{ {t}.d }}[1], [{n}]"));
        let (t, n) = (t.0, n.0);
        dynasm!(self.ops ; .arch aarch64 ; st1 {V(t).D * 1}[1], [X(n)]);
    }

    // ---- vector arithmetic ----------------------------------------------

    /// `movi vd.2d, #0`
    pub fn zero(&mut self, d: V) {
        self.log(format!("movi {d}.2d, #0000000000000000"));
        let d = d.0;
        dynasm!(self.ops ; .arch aarch64 ; movi V(d).D2, 0);
    }

    /// `movi vd.16b, #imm`
    pub fn movi_16b(&mut self, d: V, imm: u32) {
        self.log(format!("movi {d}.16b, #{imm}"));
        let d = d.0;
        dynasm!(self.ops ; .arch aarch64 ; movi V(d).B16, imm);
    }

    /// `mov vd.16b, vn.16b`
    pub fn mov_v(&mut self, d: V, n: V) {
        self.log(format!("mov {d}.16b, {n}.16b"));
        let (d, n) = (d.0, n.0);
        dynasm!(self.ops ; .arch aarch64 ; orr V(d).B16, V(n).B16, V(n).B16);
    }

    pub fn and_16b(&mut self, d: V, n: V, m: V) {
        self.log(format!("and {d}.16b, {n}.16b, {m}.16b"));
        let (d, n, m) = (d.0, n.0, m.0);
        dynasm!(self.ops ; .arch aarch64 ; and V(d).B16, V(n).B16, V(m).B16);
    }

    /// `eor vd.16b, vn.16b, vm.16b`
    pub fn eor_16b(&mut self, d: V, n: V, m: V) {
        self.log(format!("eor {d}.16b, {n}.16b, {m}.16b"));
        let (d, n, m) = (d.0, n.0, m.0);
        dynasm!(self.ops ; .arch aarch64 ; eor V(d).B16, V(n).B16, V(m).B16);
    }

    /// `shl vd.16b, vn.16b, #s`
    pub fn shl_16b(&mut self, d: V, n: V, s: u32) {
        assert!(s < 8, "shl .16b takes 0..7");
        self.log(format!("shl {d}.16b, {n}.16b, #{s}"));
        let (d, n) = (d.0, n.0);
        dynasm!(self.ops ; .arch aarch64 ; shl V(d).B16, V(n).B16, s);
    }

    /// `ushr vd.16b, vn.16b, #s`
    pub fn ushr_16b(&mut self, d: V, n: V, s: u32) {
        self.log(format!("ushr {d}.16b, {n}.16b, #{s}"));
        let (d, n) = (d.0, n.0);
        dynasm!(self.ops ; .arch aarch64 ; ushr V(d).B16, V(n).B16, s);
    }

    /// `ldp qa, qb` of the next 32 bytes at `at`.
    pub fn ldp_q_at(&mut self, a: V, b: V, n: X, at: &mut Addr) {
        match at {
            Addr::Post => self.ldp_q_post(a, b, n, 32),
            Addr::Offset(o) => {
                self.ldp_q(a, b, n, *o as i32);
                *o += 32;
            }
        }
    }

    /// `ldr q` of the next 16 bytes at `at`.
    pub fn ldr_q_at(&mut self, t: V, n: X, at: &mut Addr) {
        match at {
            Addr::Post => self.ldr_q_post(t, n, 16),
            Addr::Offset(o) => {
                self.ldr_q(t, n, *o);
                *o += 16;
            }
        }
    }

    /// `ldr d` of the next 8 bytes at `at`.
    pub fn ldr_d_at(&mut self, t: V, n: X, at: &mut Addr) {
        match at {
            Addr::Post => self.ldr_d_post(t, n, 8),
            Addr::Offset(o) => {
                self.ldr_d(t, n, *o);
                *o += 8;
            }
        }
    }

    /// `ldr s` of the next 4 bytes at `at`.
    pub fn ldr_s_at(&mut self, t: V, n: X, at: &mut Addr) {
        match at {
            Addr::Post => self.ldr_s_post(t, n, 4),
            Addr::Offset(o) => {
                self.ldr_s(t, n, *o);
                *o += 4;
            }
        }
    }

    /// `prfm <op>, [xn, #off]` (off a multiple of 8, below 32768): a hint
    /// that never faults, so it may point past the end of a buffer. Emitted
    /// as its word: `0xF9800000 | off/8 << 10 | n << 5 | op`.
    pub fn prfm(&mut self, op: Prefetch, n: X, off: u32) {
        assert!(
            off.is_multiple_of(8) && off < 32768,
            "prfm offset {off} must be a multiple of 8 below 32768"
        );
        self.log(format!("prfm {}, [{n}, #{off}]", op.name()));
        self.word(0xF980_0000 | (off / 8) << 10 | u32::from(n.0) << 5 | op.code());
    }

    /// `sdot vd.4s, vn.16b, vm.4b[lane]`
    pub fn sdot_elem(&mut self, d: V, n: V, m: V, lane: u32) {
        self.log(format!("sdot {d}.4s, {n}.16b, {m}.4b[{lane}]"));
        let (d, n, m) = (d.0, n.0, m.0);
        dynasm!(self.ops ; .arch aarch64 ; sdot V(d).S4, V(n).B16, V(m).B4[lane]);
    }

    /// `smmla vd.4s, vn.16b, vm.16b` (emitted as its word).
    pub fn smmla(&mut self, d: V, n: V, m: V) {
        self.log(format!("smmla {d}.4s, {n}.16b, {m}.16b"));
        self.word(0x4E80_A400 | u32::from(m.0) << 16 | u32::from(n.0) << 5 | u32::from(d.0));
    }

    /// `smull vd.8h, vn.8b, vm.8b`
    pub fn smull_8b(&mut self, d: V, n: V, m: V) {
        self.log(format!("smull {d}.8h, {n}.8b, {m}.8b"));
        let (d, n, m) = (d.0, n.0, m.0);
        dynasm!(self.ops ; .arch aarch64 ; smull V(d).H8, V(n).B8, V(m).B8);
    }

    /// `smlal2 vd.8h, vn.16b, vm.16b`
    pub fn smlal2_16b(&mut self, d: V, n: V, m: V) {
        self.log(format!("smlal2 {d}.8h, {n}.16b, {m}.16b"));
        let (d, n, m) = (d.0, n.0, m.0);
        dynasm!(self.ops ; .arch aarch64 ; smlal2 V(d).H8, V(n).B16, V(m).B16);
    }

    /// `sadalp vd.4s, vn.8h`
    pub fn sadalp_8h(&mut self, d: V, n: V) {
        self.log(format!("sadalp {d}.4s, {n}.8h"));
        let (d, n) = (d.0, n.0);
        dynasm!(self.ops ; .arch aarch64 ; sadalp V(d).S4, V(n).H8);
    }

    /// `addp vd.4s, vn.4s, vm.4s`
    pub fn addp_4s(&mut self, d: V, n: V, m: V) {
        self.log(format!("addp {d}.4s, {n}.4s, {m}.4s"));
        let (d, n, m) = (d.0, n.0, m.0);
        dynasm!(self.ops ; .arch aarch64 ; addp V(d).S4, V(n).S4, V(m).S4);
    }

    /// `add vd.4s, vn.4s, vm.4s`
    pub fn add_4s(&mut self, d: V, n: V, m: V) {
        self.log(format!("add {d}.4s, {n}.4s, {m}.4s"));
        let (d, n, m) = (d.0, n.0, m.0);
        dynasm!(self.ops ; .arch aarch64 ; add V(d).S4, V(n).S4, V(m).S4);
    }

    /// `sub vd.4s, vn.4s, vm.4s`
    pub fn sub_4s(&mut self, d: V, n: V, m: V) {
        self.log(format!("sub {d}.4s, {n}.4s, {m}.4s"));
        let (d, n, m) = (d.0, n.0, m.0);
        dynasm!(self.ops ; .arch aarch64 ; sub V(d).S4, V(n).S4, V(m).S4);
    }

    /// `neg vd.4s, vn.4s` (the `u4sym` accumulators start at -zp·Σqx)
    pub fn neg_4s(&mut self, d: V, n: V) {
        self.log(format!("neg {d}.4s, {n}.4s"));
        let (d, n) = (d.0, n.0);
        dynasm!(self.ops ; .arch aarch64 ; neg V(d).S4, V(n).S4);
    }

    /// `shl vd.4s, vn.4s, #s` (s in 0..32; the attention exp polynomial's
    /// exponent bits and the `u4sym` zero-point fold)
    pub fn shl_4s(&mut self, d: V, n: V, s: u32) {
        assert!(s < 32, "shl .4s takes 0..31");
        self.log(format!("shl {d}.4s, {n}.4s, #{s}"));
        let (d, n) = (d.0, n.0);
        dynasm!(self.ops ; .arch aarch64 ; shl V(d).S4, V(n).S4, s);
    }

    /// `addv sd, vn.4s`
    pub fn addv_4s(&mut self, d: V, n: V) {
        self.log(format!("addv s{}, {n}.4s", d.0));
        let (d, n) = (d.0, n.0);
        dynasm!(self.ops ; .arch aarch64 ; addv S(d), V(n).S4);
    }

    /// `trn1 vd.4s, vn.4s, vm.4s`
    pub fn trn1_4s(&mut self, d: V, n: V, m: V) {
        self.log(format!("trn1 {d}.4s, {n}.4s, {m}.4s"));
        let (d, n, m) = (d.0, n.0, m.0);
        dynasm!(self.ops ; .arch aarch64 ; trn1 V(d).S4, V(n).S4, V(m).S4);
    }

    /// `zip1 vd.4s, vn.4s, vm.4s`
    pub fn zip1_4s(&mut self, d: V, n: V, m: V) {
        self.log(format!("zip1 {d}.4s, {n}.4s, {m}.4s"));
        let (d, n, m) = (d.0, n.0, m.0);
        dynasm!(self.ops ; .arch aarch64 ; zip1 V(d).S4, V(n).S4, V(m).S4);
    }

    /// `scvtf vd.4s, vn.4s`
    pub fn scvtf_4s(&mut self, d: V, n: V) {
        self.log(format!("scvtf {d}.4s, {n}.4s"));
        let (d, n) = (d.0, n.0);
        dynasm!(self.ops ; .arch aarch64 ; scvtf V(d).S4, V(n).S4);
    }

    /// `scvtf vd.4s, vn.4s, #fbits`: int32 as fixed point with `fbits`
    /// fraction bits (exact division by 2^fbits after the conversion).
    pub fn scvtf_4s_fixed(&mut self, d: V, n: V, fbits: u32) {
        assert!(
            (1..=32).contains(&fbits),
            "scvtf .4s takes 1..32 fraction bits"
        );
        self.log(format!("scvtf {d}.4s, {n}.4s, #{fbits}"));
        let (d, n) = (d.0, n.0);
        dynasm!(self.ops ; .arch aarch64 ; scvtf V(d).S4, V(n).S4, fbits);
    }

    /// `fcvtns vd.4s, vn.4s` (round to nearest, ties to even)
    pub fn fcvtns_4s(&mut self, d: V, n: V) {
        self.log(format!("fcvtns {d}.4s, {n}.4s"));
        let (d, n) = (d.0, n.0);
        dynasm!(self.ops ; .arch aarch64 ; fcvtns V(d).S4, V(n).S4);
    }

    /// `sqxtn vd.4h, vn.4s`
    pub fn sqxtn_4h(&mut self, d: V, n: V) {
        self.log(format!("sqxtn {d}.4h, {n}.4s"));
        let (d, n) = (d.0, n.0);
        dynasm!(self.ops ; .arch aarch64 ; sqxtn V(d).H4, V(n).S4);
    }

    /// `sqxtn2 vd.8h, vn.4s`
    pub fn sqxtn2_8h(&mut self, d: V, n: V) {
        self.log(format!("sqxtn2 {d}.8h, {n}.4s"));
        let (d, n) = (d.0, n.0);
        dynasm!(self.ops ; .arch aarch64 ; sqxtn2 V(d).H8, V(n).S4);
    }

    /// `sqxtn vd.8b, vn.8h`
    pub fn sqxtn_8b(&mut self, d: V, n: V) {
        self.log(format!("sqxtn {d}.8b, {n}.8h"));
        let (d, n) = (d.0, n.0);
        dynasm!(self.ops ; .arch aarch64 ; sqxtn V(d).B8, V(n).H8);
    }

    /// `sqxtn2 vd.16b, vn.8h`
    pub fn sqxtn2_16b(&mut self, d: V, n: V) {
        self.log(format!("sqxtn2 {d}.16b, {n}.8h"));
        let (d, n) = (d.0, n.0);
        dynasm!(self.ops ; .arch aarch64 ; sqxtn2 V(d).B16, V(n).H8);
    }

    /// `fabs vd.4s, vn.4s`
    pub fn fabs_4s(&mut self, d: V, n: V) {
        self.log(format!("fabs {d}.4s, {n}.4s"));
        let (d, n) = (d.0, n.0);
        dynasm!(self.ops ; .arch aarch64 ; fabs V(d).S4, V(n).S4);
    }

    /// `fmaxnm vd.4s, vn.4s, vm.4s` (NaN-ignoring, like f32::max)
    pub fn fmaxnm_4s(&mut self, d: V, n: V, m: V) {
        self.log(format!("fmaxnm {d}.4s, {n}.4s, {m}.4s"));
        let (d, n, m) = (d.0, n.0, m.0);
        dynasm!(self.ops ; .arch aarch64 ; fmaxnm V(d).S4, V(n).S4, V(m).S4);
    }

    /// `fmaxnmv sd, vn.4s`
    pub fn fmaxnmv_4s(&mut self, d: V, n: V) {
        self.log(format!("fmaxnmv s{}, {n}.4s", d.0));
        let (d, n) = (d.0, n.0);
        dynasm!(self.ops ; .arch aarch64 ; fmaxnmv S(d), V(n).S4);
    }

    /// `fmaxnm sd, sn, sm`
    pub fn fmaxnm_s(&mut self, d: V, n: V, m: V) {
        self.log(format!("fmaxnm s{}, s{}, s{}", d.0, n.0, m.0));
        let (d, n, m) = (d.0, n.0, m.0);
        dynasm!(self.ops ; .arch aarch64 ; fmaxnm S(d), S(n), S(m));
    }

    /// `fabs sd, sn`
    pub fn fabs_s(&mut self, d: V, n: V) {
        self.log(format!("fabs s{}, s{}", d.0, n.0));
        let (d, n) = (d.0, n.0);
        dynasm!(self.ops ; .arch aarch64 ; fabs S(d), S(n));
    }

    /// `fdiv sd, sn, sm`
    pub fn fdiv_s(&mut self, d: V, n: V, m: V) {
        self.log(format!("fdiv s{}, s{}, s{}", d.0, n.0, m.0));
        let (d, n, m) = (d.0, n.0, m.0);
        dynasm!(self.ops ; .arch aarch64 ; fdiv S(d), S(n), S(m));
    }

    /// `fadd sd, sn, sm`
    pub fn fadd_s(&mut self, d: V, n: V, m: V) {
        self.log(format!("fadd s{}, s{}, s{}", d.0, n.0, m.0));
        let (d, n, m) = (d.0, n.0, m.0);
        dynasm!(self.ops ; .arch aarch64 ; fadd S(d), S(n), S(m));
    }

    /// `fcmp sn, sm`
    pub fn fcmp_s(&mut self, n: V, m: V) {
        self.log(format!("fcmp s{}, s{}", n.0, m.0));
        let (n, m) = (n.0, m.0);
        dynasm!(self.ops ; .arch aarch64 ; fcmp S(n), S(m));
    }

    /// `fmov sd, wn`
    pub fn fmov_s_w(&mut self, d: V, n: X) {
        self.log(format!("fmov s{}, {}", d.0, n.w()));
        let (d, n) = (d.0, n.0);
        dynasm!(self.ops ; .arch aarch64 ; fmov S(d), W(n));
    }

    /// `fcvt hd, sn`
    pub fn fcvt_h_s(&mut self, d: V, n: V) {
        self.log(format!("fcvt h{}, s{}", d.0, n.0));
        let (d, n) = (d.0, n.0);
        dynasm!(self.ops ; .arch aarch64 ; fcvt H(d), S(n));
    }

    /// `fcvt sd, hn`
    pub fn fcvt_s_h(&mut self, d: V, n: V) {
        self.log(format!("fcvt s{}, h{}", d.0, n.0));
        let (d, n) = (d.0, n.0);
        dynasm!(self.ops ; .arch aarch64 ; fcvt S(d), H(n));
    }

    /// `dup vd.4s, vn.s[lane]`
    pub fn dup_4s(&mut self, d: V, n: V, lane: u32) {
        self.log(format!("dup {d}.4s, {n}.s[{lane}]"));
        let (d, n) = (d.0, n.0);
        dynasm!(self.ops ; .arch aarch64 ; dup V(d).S4, V(n).S[lane]);
    }

    /// `fmul vd.4s, vn.4s, vm.4s`
    pub fn fmul_4s(&mut self, d: V, n: V, m: V) {
        self.log(format!("fmul {d}.4s, {n}.4s, {m}.4s"));
        let (d, n, m) = (d.0, n.0, m.0);
        dynasm!(self.ops ; .arch aarch64 ; fmul V(d).S4, V(n).S4, V(m).S4);
    }

    /// `fmul vd.4s, vn.4s, vm.s[lane]`
    pub fn fmul_4s_elem(&mut self, d: V, n: V, m: V, lane: u32) {
        self.log(format!("fmul {d}.4s, {n}.4s, {m}.s[{lane}]"));
        let (d, n, m) = (d.0, n.0, m.0);
        dynasm!(self.ops ; .arch aarch64 ; fmul V(d).S4, V(n).S4, V(m).S[lane]);
    }

    /// `fadd vd.8h, vn.8h, vm.8h` (FEAT_FP16; emitted as its word,
    /// `0x4E401400 | m << 16 | n << 5 | d`).
    pub fn fadd_8h(&mut self, d: V, n: V, m: V) {
        self.log(format!("fadd {d}.8h, {n}.8h, {m}.8h"));
        self.word(0x4E40_1400 | u32::from(m.0) << 16 | u32::from(n.0) << 5 | u32::from(d.0));
    }

    /// `fadd vd.4s, vn.4s, vm.4s`
    pub fn fadd_4s(&mut self, d: V, n: V, m: V) {
        self.log(format!("fadd {d}.4s, {n}.4s, {m}.4s"));
        let (d, n, m) = (d.0, n.0, m.0);
        dynasm!(self.ops ; .arch aarch64 ; fadd V(d).S4, V(n).S4, V(m).S4);
    }

    /// `fmla vd.4s, vn.4s, vm.4s`
    pub fn fmla_4s(&mut self, d: V, n: V, m: V) {
        self.log(format!("fmla {d}.4s, {n}.4s, {m}.4s"));
        let (d, n, m) = (d.0, n.0, m.0);
        dynasm!(self.ops ; .arch aarch64 ; fmla V(d).S4, V(n).S4, V(m).S4);
    }

    /// `fmla vd.4s, vn.4s, vm.s[lane]`
    pub fn fmla_4s_elem(&mut self, d: V, n: V, m: V, lane: u32) {
        self.log(format!("fmla {d}.4s, {n}.4s, {m}.s[{lane}]"));
        let (d, n, m) = (d.0, n.0, m.0);
        dynasm!(self.ops ; .arch aarch64 ; fmla V(d).S4, V(n).S4, V(m).S[lane]);
    }

    /// `fmla vd.8h, vn.8h, vm.h[lane]` (m must be v0..v15)
    pub fn fmla_8h_elem(&mut self, d: V, n: V, m: V, lane: u32) {
        assert!(m.0 < 16, "fmla .8h by element takes v0..v15 as the element");
        self.log(format!("fmla {d}.8h, {n}.8h, {m}.h[{lane}]"));
        let (d, n, m) = (d.0, n.0, m.0);
        dynasm!(self.ops ; .arch aarch64 ; fmla V(d).H8, V(n).H8, V(m).H[lane]);
    }

    /// `fcvtl vd.4s, vn.4h`
    pub fn fcvtl_4s(&mut self, d: V, n: V) {
        self.log(format!("fcvtl {d}.4s, {n}.4h"));
        let (d, n) = (d.0, n.0);
        dynasm!(self.ops ; .arch aarch64 ; fcvtl V(d).S4, V(n).H4);
    }

    /// `fcvtl2 vd.4s, vn.8h`
    pub fn fcvtl2_4s(&mut self, d: V, n: V) {
        self.log(format!("fcvtl2 {d}.4s, {n}.8h"));
        let (d, n) = (d.0, n.0);
        dynasm!(self.ops ; .arch aarch64 ; fcvtl2 V(d).S4, V(n).H8);
    }

    /// `fcvtn vd.4h, vn.4s`
    pub fn fcvtn_4h(&mut self, d: V, n: V) {
        self.log(format!("fcvtn {d}.4h, {n}.4s"));
        self.word(0x0E21_6800 | u32::from(n.0) << 5 | u32::from(d.0));
    }
}
