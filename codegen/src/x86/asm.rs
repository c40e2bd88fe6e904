//! A typed x86-64 instruction layer over `dynasmrt`.
//!
//! Every method encodes one instruction through `dynasm!` into a
//! [`VecAssembler`] (bytes on any host; the JIT maps the same bytes) and
//! appends its Intel-syntax text to the listing, so the listing is the
//! emitter's own instruction log. A test assembles the listing with
//! `llvm-mc -triple=x86_64` and compares the disassembly of both.
//!
//! Known dynasm 5.1 quirks this layer hides:
//! - `vbroadcastss ymm, [mem]` is encoded as the xmm form; broadcasts from
//!   memory use `vpbroadcastd` (same bits, same port on Zen 3 / Intel).
//! - there is no `vpdpbusd` (AVX-VNNI): it is emitted as raw VEX bytes.
//! - `vcmpps d, a, b, pred` encodes with `a` and `b` swapped; the method
//!   passes them swapped so the instruction means what the listing says.
//! - memory operands with a run-time base register always carry a SIB byte
//!   (`riz` in a disassembly); harmless, one byte longer.

// dynasm! expands run-time register operands to `.into()` calls.
#![allow(clippy::useless_conversion)]

use dynasmrt::x64::X64Relocation;
use dynasmrt::{DynamicLabel, DynasmApi, DynasmLabelApi, VecAssembler, dynasm};

/// A 64-bit general-purpose register, by hardware number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Gp(pub u8);

/// A 256-bit vector register (its low half is the xmm of the same number).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ymm(pub u8);

pub const RAX: Gp = Gp(0);
pub const RCX: Gp = Gp(1);
pub const RDX: Gp = Gp(2);
pub const RBX: Gp = Gp(3);
pub const RSP: Gp = Gp(4);
pub const RBP: Gp = Gp(5);
pub const RSI: Gp = Gp(6);
pub const RDI: Gp = Gp(7);
pub const R8: Gp = Gp(8);
pub const R9: Gp = Gp(9);
pub const R10: Gp = Gp(10);
pub const R11: Gp = Gp(11);
pub const R12: Gp = Gp(12);
pub const R13: Gp = Gp(13);
pub const R14: Gp = Gp(14);
pub const R15: Gp = Gp(15);

const GP_NAMES: [&str; 16] = [
    "rax", "rcx", "rdx", "rbx", "rsp", "rbp", "rsi", "rdi", "r8", "r9", "r10", "r11", "r12", "r13",
    "r14", "r15",
];

impl std::fmt::Display for Gp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(GP_NAMES[usize::from(self.0 & 15)])
    }
}

/// The 32-bit name of a general-purpose register (`eax`, `r8d`).
fn gp32(r: Gp) -> String {
    const N: [&str; 8] = ["eax", "ecx", "edx", "ebx", "esp", "ebp", "esi", "edi"];
    match r.0 & 15 {
        n @ 0..8 => N[usize::from(n)].to_string(),
        n => format!("r{n}d"),
    }
}

/// The 16-bit name of a general-purpose register (`ax`, `r8w`).
fn gp16(r: Gp) -> String {
    const N: [&str; 8] = ["ax", "cx", "dx", "bx", "sp", "bp", "si", "di"];
    match r.0 & 15 {
        n @ 0..8 => N[usize::from(n)].to_string(),
        n => format!("r{n}w"),
    }
}

impl std::fmt::Display for Ymm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ymm{}", self.0 & 15)
    }
}

impl Ymm {
    /// The low 128 bits, for listings of xmm-form instructions.
    pub fn xmm(self) -> String {
        format!("xmm{}", self.0 & 15)
    }
}

/// A memory operand `[base + disp]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mem {
    pub base: Gp,
    pub disp: i32,
}

/// `[base + disp]`.
pub fn mem(base: Gp, disp: i32) -> Mem {
    Mem { base, disp }
}

impl std::fmt::Display for Mem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.disp {
            0 => write!(f, "[{}]", self.base),
            d if d < 0 => write!(f, "[{} - {}]", self.base, -(d as i64)),
            d => write!(f, "[{} + {}]", self.base, d),
        }
    }
}

/// A branch target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Label {
    id: DynamicLabel,
    number: usize,
}

/// Condition codes for `jcc`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cond {
    /// unsigned below
    B,
    /// unsigned above or equal
    Ae,
    /// unsigned above
    A,
    /// unsigned below or equal
    Be,
    E,
    Ne,
    /// signed less
    L,
    /// signed greater or equal
    Ge,
    /// signed greater
    G,
    /// signed less or equal
    Le,
}

/// Assembler plus listing.
pub struct X86Asm {
    ops: VecAssembler<X64Relocation>,
    listing: Vec<String>,
    labels: usize,
}

impl Default for X86Asm {
    fn default() -> Self {
        Self::new()
    }
}

macro_rules! vex3 {
    ($name:ident, $mn:literal) => {
        #[doc = concat!("`", $mn, " dst, a, b` on ymm.")]
        pub fn $name(&mut self, dst: Ymm, a: Ymm, b: Ymm) {
            self.log(format!(concat!($mn, " {}, {}, {}"), dst, a, b));
            let (d, x, y) = (dst.0, a.0, b.0);
            dynasm!(self.ops ; .arch x64 ; $name Ry(d), Ry(x), Ry(y));
        }
    };
}

impl X86Asm {
    pub fn new() -> Self {
        X86Asm {
            ops: VecAssembler::new(0),
            listing: Vec::new(),
            labels: 0,
        }
    }

    fn log(&mut self, line: String) {
        self.listing.push(format!("    {line}"));
    }

    /// A `# comment` line in the listing (no bytes).
    pub fn comment(&mut self, text: &str) {
        self.listing.push(format!("    # {text}"));
    }

    /// Finish: bytes and listing. Fails if a label was used but never bound.
    pub fn finish(self) -> Result<(Vec<u8>, String), String> {
        let bytes = self.ops.finalize().map_err(|e| format!("{e:?}"))?;
        let mut listing = self.listing.join("\n");
        listing.push('\n');
        Ok((bytes, listing))
    }

    /// Append bytes encoded elsewhere with their Intel-syntax line: the
    /// hook for encoders dynasm 5.1 lacks (EVEX, see [`super::evex`]).
    pub fn raw(&mut self, bytes: &[u8], line: String) {
        self.log(line);
        self.ops.extend(bytes.iter().copied());
    }

    /// Bytes emitted so far.
    pub fn offset(&self) -> usize {
        self.ops.offset().0
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
        dynasm!(self.ops ; .arch x64 ; =>id);
    }

    pub fn jmp(&mut self, label: Label) {
        self.log(format!("jmp .L{}", label.number));
        let id = label.id;
        dynasm!(self.ops ; .arch x64 ; jmp =>id);
    }

    pub fn jcc(&mut self, cond: Cond, label: Label) {
        let id = label.id;
        let mn = match cond {
            Cond::B => {
                dynasm!(self.ops ; .arch x64 ; jb =>id);
                "jb"
            }
            Cond::Ae => {
                dynasm!(self.ops ; .arch x64 ; jae =>id);
                "jae"
            }
            Cond::A => {
                dynasm!(self.ops ; .arch x64 ; ja =>id);
                "ja"
            }
            Cond::Be => {
                dynasm!(self.ops ; .arch x64 ; jbe =>id);
                "jbe"
            }
            Cond::E => {
                dynasm!(self.ops ; .arch x64 ; je =>id);
                "je"
            }
            Cond::Ne => {
                dynasm!(self.ops ; .arch x64 ; jne =>id);
                "jne"
            }
            Cond::L => {
                dynasm!(self.ops ; .arch x64 ; jl =>id);
                "jl"
            }
            Cond::Ge => {
                dynasm!(self.ops ; .arch x64 ; jge =>id);
                "jge"
            }
            Cond::G => {
                dynasm!(self.ops ; .arch x64 ; jg =>id);
                "jg"
            }
            Cond::Le => {
                dynasm!(self.ops ; .arch x64 ; jle =>id);
                "jle"
            }
        };
        self.log(format!("{mn} .L{}", label.number));
    }

    // ---- general-purpose ------------------------------------------------

    pub fn push(&mut self, r: Gp) {
        self.log(format!("push {r}"));
        let r = r.0;
        dynasm!(self.ops ; .arch x64 ; push Rq(r));
    }

    pub fn pop(&mut self, r: Gp) {
        self.log(format!("pop {r}"));
        let r = r.0;
        dynasm!(self.ops ; .arch x64 ; pop Rq(r));
    }

    pub fn ret(&mut self) {
        self.log("ret".into());
        dynasm!(self.ops ; .arch x64 ; ret);
    }

    /// `mov dst, qword ptr [m]`
    pub fn load64(&mut self, dst: Gp, m: Mem) {
        self.log(format!("mov {dst}, qword ptr {m}"));
        let (d, b, o) = (dst.0, m.base.0, m.disp);
        dynasm!(self.ops ; .arch x64 ; mov Rq(d), QWORD [Rq(b) + o]);
    }

    /// `mov qword ptr [m], src`
    pub fn store64(&mut self, m: Mem, src: Gp) {
        self.log(format!("mov qword ptr {m}, {src}"));
        let (s, b, o) = (src.0, m.base.0, m.disp);
        dynasm!(self.ops ; .arch x64 ; mov QWORD [Rq(b) + o], Rq(s));
    }

    pub fn mov(&mut self, dst: Gp, src: Gp) {
        self.log(format!("mov {dst}, {src}"));
        let (d, s) = (dst.0, src.0);
        dynasm!(self.ops ; .arch x64 ; mov Rq(d), Rq(s));
    }

    /// `mov dst, imm` (sign-extended 32-bit immediate).
    pub fn mov_imm(&mut self, dst: Gp, imm: i32) {
        self.log(format!("mov {dst}, {imm}"));
        let d = dst.0;
        dynasm!(self.ops ; .arch x64 ; mov Rq(d), imm);
    }

    pub fn lea(&mut self, dst: Gp, m: Mem) {
        self.log(format!("lea {dst}, {m}"));
        let (d, b, o) = (dst.0, m.base.0, m.disp);
        dynasm!(self.ops ; .arch x64 ; lea Rq(d), [Rq(b) + o]);
    }

    pub fn add(&mut self, dst: Gp, src: Gp) {
        self.log(format!("add {dst}, {src}"));
        let (d, s) = (dst.0, src.0);
        dynasm!(self.ops ; .arch x64 ; add Rq(d), Rq(s));
    }

    pub fn add_imm(&mut self, dst: Gp, imm: i32) {
        self.log(format!("add {dst}, {imm}"));
        let d = dst.0;
        dynasm!(self.ops ; .arch x64 ; add Rq(d), DWORD imm);
    }

    pub fn sub(&mut self, dst: Gp, src: Gp) {
        self.log(format!("sub {dst}, {src}"));
        let (d, s) = (dst.0, src.0);
        dynasm!(self.ops ; .arch x64 ; sub Rq(d), Rq(s));
    }

    pub fn sub_imm(&mut self, dst: Gp, imm: i32) {
        self.log(format!("sub {dst}, {imm}"));
        let d = dst.0;
        dynasm!(self.ops ; .arch x64 ; sub Rq(d), DWORD imm);
    }

    pub fn imul(&mut self, dst: Gp, src: Gp) {
        self.log(format!("imul {dst}, {src}"));
        let (d, s) = (dst.0, src.0);
        dynasm!(self.ops ; .arch x64 ; imul Rq(d), Rq(s));
    }

    /// `imul dst, src, imm`
    pub fn imul_imm(&mut self, dst: Gp, src: Gp, imm: i32) {
        self.log(format!("imul {dst}, {src}, {imm}"));
        let (d, s) = (dst.0, src.0);
        dynasm!(self.ops ; .arch x64 ; imul Rq(d), Rq(s), DWORD imm);
    }

    pub fn shl_imm(&mut self, dst: Gp, imm: i8) {
        self.log(format!("shl {dst}, {imm}"));
        let d = dst.0;
        dynasm!(self.ops ; .arch x64 ; shl Rq(d), imm);
    }

    /// Shift left by cl.
    pub fn shl_cl(&mut self, dst: Gp) {
        self.log(format!("shl {dst}, cl"));
        let d = dst.0;
        dynasm!(self.ops ; .arch x64 ; shl Rq(d), cl);
    }

    /// Logical right shift.
    pub fn shr_imm(&mut self, dst: Gp, imm: i8) {
        self.log(format!("shr {dst}, {imm}"));
        let d = dst.0;
        dynasm!(self.ops ; .arch x64 ; shr Rq(d), imm);
    }

    pub fn cmp(&mut self, a: Gp, b: Gp) {
        self.log(format!("cmp {a}, {b}"));
        let (x, y) = (a.0, b.0);
        dynasm!(self.ops ; .arch x64 ; cmp Rq(x), Rq(y));
    }

    pub fn cmp_imm(&mut self, a: Gp, imm: i32) {
        self.log(format!("cmp {a}, {imm}"));
        let x = a.0;
        dynasm!(self.ops ; .arch x64 ; cmp Rq(x), DWORD imm);
    }

    /// `test a, imm32` (64-bit): flags of `a & imm` without a register.
    pub fn test_imm(&mut self, a: Gp, imm: i32) {
        self.log(format!("test {a}, {imm}"));
        let x = a.0;
        dynasm!(self.ops ; .arch x64 ; test Rq(x), DWORD imm);
    }

    /// `cmp a, qword ptr [m]`
    pub fn cmp_mem(&mut self, a: Gp, m: Mem) {
        self.log(format!("cmp {a}, qword ptr {m}"));
        let (x, b, o) = (a.0, m.base.0, m.disp);
        dynasm!(self.ops ; .arch x64 ; cmp Rq(x), QWORD [Rq(b) + o]);
    }

    // ---- vector ---------------------------------------------------------

    /// `vmovups dst, ymmword ptr [m]`
    pub fn vmovups_load(&mut self, dst: Ymm, m: Mem) {
        self.log(format!("vmovups {dst}, ymmword ptr {m}"));
        let (d, b, o) = (dst.0, m.base.0, m.disp);
        dynasm!(self.ops ; .arch x64 ; vmovups Ry(d), YWORD [Rq(b) + o]);
    }

    /// `vmovups ymmword ptr [m], src`
    pub fn vmovups_store(&mut self, m: Mem, src: Ymm) {
        self.log(format!("vmovups ymmword ptr {m}, {src}"));
        let (s, b, o) = (src.0, m.base.0, m.disp);
        dynasm!(self.ops ; .arch x64 ; vmovups YWORD [Rq(b) + o], Ry(s));
    }

    /// `vmovdqu dst, ymmword ptr [m]`
    pub fn vmovdqu_load(&mut self, dst: Ymm, m: Mem) {
        self.log(format!("vmovdqu {dst}, ymmword ptr {m}"));
        let (d, b, o) = (dst.0, m.base.0, m.disp);
        dynasm!(self.ops ; .arch x64 ; vmovdqu Ry(d), YWORD [Rq(b) + o]);
    }

    /// `vmovdqu xmm, xmmword ptr [m]` (16 bytes, upper half zeroed).
    pub fn vmovdqu_load128(&mut self, dst: Ymm, m: Mem) {
        self.log(format!("vmovdqu {}, xmmword ptr {m}", dst.xmm()));
        let (d, b, o) = (dst.0, m.base.0, m.disp);
        dynasm!(self.ops ; .arch x64 ; vmovdqu Rx(d), OWORD [Rq(b) + o]);
    }

    /// `vmaskmovps dst, mask, ymmword ptr [m]`: loads lanes whose mask sign
    /// bit is set, zeroes the others, never faults on masked-off lanes.
    pub fn vmaskmovps_load(&mut self, dst: Ymm, mask: Ymm, m: Mem) {
        self.log(format!("vmaskmovps {dst}, {mask}, ymmword ptr {m}"));
        let (d, k, b, o) = (dst.0, mask.0, m.base.0, m.disp);
        dynasm!(self.ops ; .arch x64 ; vmaskmovps Ry(d), Ry(k), YWORD [Rq(b) + o]);
    }

    /// `vmaskmovps ymmword ptr [m], mask, src`
    pub fn vmaskmovps_store(&mut self, m: Mem, mask: Ymm, src: Ymm) {
        self.log(format!("vmaskmovps ymmword ptr {m}, {mask}, {src}"));
        let (s, k, b, o) = (src.0, mask.0, m.base.0, m.disp);
        dynasm!(self.ops ; .arch x64 ; vmaskmovps YWORD [Rq(b) + o], Ry(k), Ry(s));
    }

    /// Broadcast one f32 / i32 from memory to all 8 lanes (`vpbroadcastd`;
    /// see the module doc for why not `vbroadcastss`).
    pub fn vpbroadcastd_load(&mut self, dst: Ymm, m: Mem) {
        self.log(format!("vpbroadcastd {dst}, dword ptr {m}"));
        let (d, b, o) = (dst.0, m.base.0, m.disp);
        dynasm!(self.ops ; .arch x64 ; vpbroadcastd Ry(d), DWORD [Rq(b) + o]);
    }

    /// Broadcast one 16-bit word from memory to all 16 lanes.
    pub fn vpbroadcastw_load(&mut self, dst: Ymm, m: Mem) {
        self.log(format!("vpbroadcastw {dst}, word ptr {m}"));
        let (d, b, o) = (dst.0, m.base.0, m.disp);
        dynasm!(self.ops ; .arch x64 ; vpbroadcastw Ry(d), WORD [Rq(b) + o]);
    }

    /// Broadcast a 128-bit lane from memory to both halves.
    pub fn vbroadcasti128_load(&mut self, dst: Ymm, m: Mem) {
        self.log(format!("vbroadcasti128 {dst}, xmmword ptr {m}"));
        let (d, b, o) = (dst.0, m.base.0, m.disp);
        dynasm!(self.ops ; .arch x64 ; vbroadcasti128 Ry(d), OWORD [Rq(b) + o]);
    }

    /// 8 f16 from memory → 8 f32.
    pub fn vcvtph2ps_load(&mut self, dst: Ymm, m: Mem) {
        self.log(format!("vcvtph2ps {dst}, xmmword ptr {m}"));
        let (d, b, o) = (dst.0, m.base.0, m.disp);
        dynasm!(self.ops ; .arch x64 ; vcvtph2ps Ry(d), OWORD [Rq(b) + o]);
    }

    /// 4 f16 from memory → 4 f32 in the low half (upper half zeroed).
    pub fn vcvtph2ps_load64(&mut self, dst: Ymm, m: Mem) {
        self.log(format!("vcvtph2ps {}, qword ptr {m}", dst.xmm()));
        let (d, b, o) = (dst.0, m.base.0, m.disp);
        dynasm!(self.ops ; .arch x64 ; vcvtph2ps Rx(d), QWORD [Rq(b) + o]);
    }

    /// `vmovups xmmword ptr [m], xmm` (the low 16 bytes).
    pub fn vmovups_store128(&mut self, m: Mem, src: Ymm) {
        self.log(format!("vmovups xmmword ptr {m}, {}", src.xmm()));
        let (s, b, o) = (src.0, m.base.0, m.disp);
        dynasm!(self.ops ; .arch x64 ; vmovups OWORD [Rq(b) + o], Rx(s));
    }

    /// 16 signed bytes from memory → 16 i16.
    pub fn vpmovsxbw_load(&mut self, dst: Ymm, m: Mem) {
        self.log(format!("vpmovsxbw {dst}, xmmword ptr {m}"));
        let (d, b, o) = (dst.0, m.base.0, m.disp);
        dynasm!(self.ops ; .arch x64 ; vpmovsxbw Ry(d), OWORD [Rq(b) + o]);
    }

    /// 8 signed bytes from memory → 8 i16 in the low lanes of `dst`.
    pub fn vpmovsxbw_load64(&mut self, dst: Ymm, m: Mem) {
        self.log(format!("vpmovsxbw {}, qword ptr {m}", dst.xmm()));
        let (d, b, o) = (dst.0, m.base.0, m.disp);
        dynasm!(self.ops ; .arch x64 ; vpmovsxbw Rx(d), QWORD [Rq(b) + o]);
    }

    /// i16 lanes shifted right by `imm`, the sign shifted in.
    pub fn vpsraw_imm(&mut self, dst: Ymm, src: Ymm, imm: i8) {
        self.log(format!("vpsraw {dst}, {src}, {imm}"));
        let (d, s) = (dst.0, src.0);
        dynasm!(self.ops ; .arch x64 ; vpsraw Ry(d), Ry(s), imm);
    }

    /// `vpextrd dword ptr [m], xmm, lane`: i32 lane `lane` (0–3) of `src`'s
    /// low 128 bits.
    pub fn vpextrd_store(&mut self, m: Mem, src: Ymm, lane: i8) {
        self.log(format!("vpextrd dword ptr {m}, {}, {lane}", src.xmm()));
        let (s, b, o) = (src.0, m.base.0, m.disp);
        dynasm!(self.ops ; .arch x64 ; vpextrd DWORD [Rq(b) + o], Rx(s), lane);
    }

    /// i16 lanes shifted left by `imm`.
    pub fn vpsllw_imm(&mut self, dst: Ymm, src: Ymm, imm: i8) {
        self.log(format!("vpsllw {dst}, {src}, {imm}"));
        let (d, s) = (dst.0, src.0);
        dynasm!(self.ops ; .arch x64 ; vpsllw Ry(d), Ry(s), imm);
    }

    /// `vfmadd231ps dst, a, ymmword ptr [m]`: dst += a · mem.
    pub fn vfmadd231ps_mem(&mut self, dst: Ymm, a: Ymm, m: Mem) {
        self.log(format!("vfmadd231ps {dst}, {a}, ymmword ptr {m}"));
        let (d, x, b, o) = (dst.0, a.0, m.base.0, m.disp);
        dynasm!(self.ops ; .arch x64 ; vfmadd231ps Ry(d), Ry(x), YWORD [Rq(b) + o]);
    }

    vex3!(vfmadd231ps, "vfmadd231ps");
    vex3!(vaddps, "vaddps");
    vex3!(vmulps, "vmulps");
    vex3!(vmaxps, "vmaxps");
    vex3!(vxorps, "vxorps");
    vex3!(vpaddd, "vpaddd");
    vex3!(vpand, "vpand");
    vex3!(vpxor, "vpxor");
    vex3!(vpmaddubsw, "vpmaddubsw");
    vex3!(vpmaddwd, "vpmaddwd");
    vex3!(vpsignb, "vpsignb");
    vex3!(vpunpcklbw, "vpunpcklbw");
    vex3!(vpunpckhbw, "vpunpckhbw");

    /// AVX-VNNI `vpdpbusd dst, a, b` (u8·s8 dot of 4, added to i32 lanes),
    /// emitted as raw VEX bytes since dynasm 5.1 lacks it.
    pub fn vpdpbusd(&mut self, dst: Ymm, a: Ymm, b: Ymm) {
        self.vex_vnni(0x50, "vpdpbusd", dst, a, b);
    }

    /// AVX-VNNI `vpdpwssd dst, a, b` (i16·i16 dot of 2, added to i32
    /// lanes), raw VEX bytes like [`Self::vpdpbusd`].
    pub fn vpdpwssd(&mut self, dst: Ymm, a: Ymm, b: Ymm) {
        self.vex_vnni(0x52, "vpdpwssd", dst, a, b);
    }

    /// VEX.256.66.0F38.W0 `opcode` /r with register operands: C4 [R X B
    /// m-mmmm=00010] [W vvvv L=1 pp=01] opcode modrm.
    fn vex_vnni(&mut self, opcode: u8, name: &str, dst: Ymm, a: Ymm, b: Ymm) {
        self.log(format!("{{vex}} {name} {dst}, {a}, {b}"));
        let (d, v, r) = (dst.0 & 15, a.0 & 15, b.0 & 15);
        let byte1 = vex3_byte1(d, r, 0b00010);
        let byte2 = (((!v) & 15) << 3) | (1 << 2) | 0b01;
        let modrm = 0b1100_0000 | ((d & 7) << 3) | (r & 7);
        self.ops.extend([0xC4, byte1, byte2, opcode, modrm]);
    }

    pub fn vpabsb(&mut self, dst: Ymm, src: Ymm) {
        self.log(format!("vpabsb {dst}, {src}"));
        let (d, s) = (dst.0, src.0);
        dynasm!(self.ops ; .arch x64 ; vpabsb Ry(d), Ry(s));
    }

    pub fn vcvtdq2ps(&mut self, dst: Ymm, src: Ymm) {
        self.log(format!("vcvtdq2ps {dst}, {src}"));
        let (d, s) = (dst.0, src.0);
        dynasm!(self.ops ; .arch x64 ; vcvtdq2ps Ry(d), Ry(s));
    }

    /// f32 → i32 with the current rounding mode (nearest even by default).
    pub fn vcvtps2dq(&mut self, dst: Ymm, src: Ymm) {
        self.log(format!("vcvtps2dq {dst}, {src}"));
        let (d, s) = (dst.0, src.0);
        dynasm!(self.ops ; .arch x64 ; vcvtps2dq Ry(d), Ry(s));
    }

    /// i32 lanes shifted left by `imm`.
    pub fn vpslld_imm(&mut self, dst: Ymm, src: Ymm, imm: i8) {
        self.log(format!("vpslld {dst}, {src}, {imm}"));
        let (d, s) = (dst.0, src.0);
        dynasm!(self.ops ; .arch x64 ; vpslld Ry(d), Ry(s), imm);
    }

    pub fn vpsrlw_imm(&mut self, dst: Ymm, src: Ymm, imm: i8) {
        self.log(format!("vpsrlw {dst}, {src}, {imm}"));
        let (d, s) = (dst.0, src.0);
        dynasm!(self.ops ; .arch x64 ; vpsrlw Ry(d), Ry(s), imm);
    }

    /// Broadcast the low f32 of `src` to all lanes.
    pub fn vbroadcastss_reg(&mut self, dst: Ymm, src: Ymm) {
        self.log(format!("vbroadcastss {dst}, {}", src.xmm()));
        let (d, s) = (dst.0, src.0);
        dynasm!(self.ops ; .arch x64 ; vbroadcastss Ry(d), Rx(s));
    }

    /// Upper 128 bits of `src` into the xmm of `dst`.
    pub fn vextractf128_hi(&mut self, dst: Ymm, src: Ymm) {
        self.log(format!("vextractf128 {}, {src}, 1", dst.xmm()));
        let (d, s) = (dst.0, src.0);
        dynasm!(self.ops ; .arch x64 ; vextractf128 Rx(d), Ry(s), 1);
    }

    /// `prefetcht1 byte ptr [m]`: into L2 (and L3), not L1.
    pub fn prefetcht1(&mut self, m: Mem) {
        self.log(format!("prefetcht1 byte ptr {m}"));
        let (b, o) = (m.base.0, m.disp);
        dynasm!(self.ops ; .arch x64 ; prefetcht1 [Rq(b) + o]);
    }

    /// `prefetcht1 byte ptr [base + index]`.
    pub fn prefetcht1_indexed(&mut self, base: Gp, index: Gp) {
        self.log(format!("prefetcht1 byte ptr [{base} + {index}]"));
        let (b, i) = (base.0, index.0);
        dynasm!(self.ops ; .arch x64 ; prefetcht1 [Rq(b) + Rq(i)]);
    }

    /// `prefetcht0 byte ptr [base + index]`.
    pub fn prefetcht0_indexed(&mut self, base: Gp, index: Gp) {
        self.log(format!("prefetcht0 byte ptr [{base} + {index}]"));
        let (b, i) = (base.0, index.0);
        dynasm!(self.ops ; .arch x64 ; prefetcht0 [Rq(b) + Rq(i)]);
    }

    /// `prefetcht0 byte ptr [m]`: into every level.
    pub fn prefetcht0(&mut self, m: Mem) {
        self.log(format!("prefetcht0 byte ptr {m}"));
        let (b, o) = (m.base.0, m.disp);
        dynasm!(self.ops ; .arch x64 ; prefetcht0 [Rq(b) + o]);
    }

    /// `mov dword ptr [m], imm`
    pub fn store32_imm(&mut self, m: Mem, imm: i32) {
        self.log(format!("mov dword ptr {m}, {imm}"));
        let (b, o) = (m.base.0, m.disp);
        dynasm!(self.ops ; .arch x64 ; mov DWORD [Rq(b) + o], imm);
    }

    /// `movzx dst32, word ptr [m]` (zero-extends into the whole register).
    pub fn load16(&mut self, dst: Gp, m: Mem) {
        self.log(format!("movzx {}, word ptr {m}", gp32(dst)));
        let (d, b, o) = (dst.0, m.base.0, m.disp);
        dynasm!(self.ops ; .arch x64 ; movzx Rd(d), WORD [Rq(b) + o]);
    }

    /// `mov word ptr [m], src16`
    pub fn store16(&mut self, m: Mem, src: Gp) {
        self.log(format!("mov word ptr {m}, {}", gp16(src)));
        let (s, b, o) = (src.0, m.base.0, m.disp);
        dynasm!(self.ops ; .arch x64 ; mov WORD [Rq(b) + o], Rw(s));
    }

    /// `vaddps dst, a, ymmword ptr [m]`
    pub fn vaddps_mem(&mut self, dst: Ymm, a: Ymm, m: Mem) {
        self.log(format!("vaddps {dst}, {a}, ymmword ptr {m}"));
        let (d, x, b, o) = (dst.0, a.0, m.base.0, m.disp);
        dynasm!(self.ops ; .arch x64 ; vaddps Ry(d), Ry(x), YWORD [Rq(b) + o]);
    }

    /// `vmaxps dst, a, ymmword ptr [m]`
    pub fn vmaxps_mem(&mut self, dst: Ymm, a: Ymm, m: Mem) {
        self.log(format!("vmaxps {dst}, {a}, ymmword ptr {m}"));
        let (d, x, b, o) = (dst.0, a.0, m.base.0, m.disp);
        dynasm!(self.ops ; .arch x64 ; vmaxps Ry(d), Ry(x), YWORD [Rq(b) + o]);
    }

    /// `vmulps dst, a, ymmword ptr [m]`
    pub fn vmulps_mem(&mut self, dst: Ymm, a: Ymm, m: Mem) {
        self.log(format!("vmulps {dst}, {a}, ymmword ptr {m}"));
        let (d, x, b, o) = (dst.0, a.0, m.base.0, m.disp);
        dynasm!(self.ops ; .arch x64 ; vmulps Ry(d), Ry(x), YWORD [Rq(b) + o]);
    }

    /// `vpmaddwd dst, a, ymmword ptr [m]`
    pub fn vpmaddwd_mem(&mut self, dst: Ymm, a: Ymm, m: Mem) {
        self.log(format!("vpmaddwd {dst}, {a}, ymmword ptr {m}"));
        let (d, x, b, o) = (dst.0, a.0, m.base.0, m.disp);
        dynasm!(self.ops ; .arch x64 ; vpmaddwd Ry(d), Ry(x), YWORD [Rq(b) + o]);
    }

    /// `vpand dst, a, ymmword ptr [m]`.
    pub fn vpand_mem(&mut self, dst: Ymm, a: Ymm, m: Mem) {
        self.log(format!("vpand {dst}, {a}, ymmword ptr {m}"));
        let (d, x, b, o) = (dst.0, a.0, m.base.0, m.disp);
        dynasm!(self.ops ; .arch x64 ; vpand Ry(d), Ry(x), YWORD [Rq(b) + o]);
    }

    /// 8 f16 in the xmm of `src` → 8 f32.
    pub fn vcvtph2ps_reg(&mut self, dst: Ymm, src: Ymm) {
        self.log(format!("vcvtph2ps {dst}, {}", src.xmm()));
        let (d, s) = (dst.0, src.0);
        dynasm!(self.ops ; .arch x64 ; vcvtph2ps Ry(d), Rx(s));
    }

    /// 8 f32 → 8 f16 stored to memory; `imm` 0 rounds to nearest even.
    pub fn vcvtps2ph_store(&mut self, m: Mem, src: Ymm, imm: i8) {
        self.log(format!("vcvtps2ph xmmword ptr {m}, {src}, {imm}"));
        let (s, b, o) = (src.0, m.base.0, m.disp);
        dynasm!(self.ops ; .arch x64 ; vcvtps2ph OWORD [Rq(b) + o], Ry(s), imm);
    }

    /// `vcmpps dst, a, b, pred` (pred 1 = less-than, ordered).
    pub fn vcmpps(&mut self, dst: Ymm, a: Ymm, b: Ymm, pred: i8) {
        self.log(format!("vcmpps {dst}, {a}, {b}, {pred}"));
        // dynasm 5.1 swaps the two sources of vcmpps (see the module doc).
        let (d, x, y) = (dst.0, a.0, b.0);
        dynasm!(self.ops ; .arch x64 ; vcmpps Ry(d), Ry(y), Ry(x), pred);
    }

    /// In-lane f32 shuffle by immediate.
    pub fn vmovaps_reg(&mut self, dst: Ymm, src: Ymm) {
        self.log(format!("vmovaps {dst}, {src}"));
        let (d, s) = (dst.0, src.0);
        dynasm!(self.ops ; .arch x64 ; vmovaps Ry(d), Ry(s));
    }

    pub fn vpermilps_imm(&mut self, dst: Ymm, src: Ymm, imm: i8) {
        self.log(format!("vpermilps {dst}, {src}, {}", imm as u8));
        let (d, s) = (dst.0, src.0);
        dynasm!(self.ops ; .arch x64 ; vpermilps Ry(d), Ry(s), imm);
    }

    /// In-lane i32 shuffle by immediate.
    pub fn vpshufd(&mut self, dst: Ymm, src: Ymm, imm: i8) {
        self.log(format!("vpshufd {dst}, {src}, {}", imm as u8));
        let (d, s) = (dst.0, src.0);
        dynasm!(self.ops ; .arch x64 ; vpshufd Ry(d), Ry(s), imm);
    }

    /// Upper 128 bits of `src` (integer domain) into the xmm of `dst`.
    pub fn vextracti128_hi(&mut self, dst: Ymm, src: Ymm) {
        self.log(format!("vextracti128 {}, {src}, 1", dst.xmm()));
        let (d, s) = (dst.0, src.0);
        dynasm!(self.ops ; .arch x64 ; vextracti128 Rx(d), Ry(s), 1);
    }

    /// `vmovd dword ptr [m], xmm`: the low 32 bits of `src`.
    pub fn vmovd_store(&mut self, m: Mem, src: Ymm) {
        self.log(format!("vmovd dword ptr {m}, {}", src.xmm()));
        let (s, b, o) = (src.0, m.base.0, m.disp);
        dynasm!(self.ops ; .arch x64 ; vmovd DWORD [Rq(b) + o], Rx(s));
    }

    /// `vmovss dword ptr [m], xmm`
    pub fn vmovss_store(&mut self, m: Mem, src: Ymm) {
        self.log(format!("vmovss dword ptr {m}, {}", src.xmm()));
        let (s, b, o) = (src.0, m.base.0, m.disp);
        dynasm!(self.ops ; .arch x64 ; vmovss DWORD [Rq(b) + o], Rx(s));
    }

    vex3!(vpaddw, "vpaddw");
    vex3!(vpsubd, "vpsubd");
    vex3!(vpsrlvd, "vpsrlvd");
    vex3!(vpackssdw, "vpackssdw");
    vex3!(vpacksswb, "vpacksswb");
    vex3!(vdivps, "vdivps");
    vex3!(vandps, "vandps");
    vex3!(vsubps, "vsubps");
    vex3!(vminps, "vminps");
    vex3!(vorps, "vorps");
    vex3!(vandnps, "vandnps");
    vex3!(vpcmpgtd, "vpcmpgtd");

    vex3!(vhaddps, "vhaddps");

    /// `vperm2f128 dst, a, b, imm` (128-bit halves of a and b).
    pub fn vperm2f128(&mut self, dst: Ymm, a: Ymm, b: Ymm, imm: i8) {
        self.log(format!("vperm2f128 {dst}, {a}, {b}, {imm}"));
        let (d, x, y) = (dst.0, a.0, b.0);
        dynasm!(self.ops ; .arch x64 ; vperm2f128 Ry(d), Ry(x), Ry(y), imm);
    }

    /// `vfmadd213ps dst, a, ymmword ptr [m]`: dst = a · dst + mem.
    pub fn vfmadd213ps_mem(&mut self, dst: Ymm, a: Ymm, m: Mem) {
        self.log(format!("vfmadd213ps {dst}, {a}, ymmword ptr {m}"));
        let (d, x, b, o) = (dst.0, a.0, m.base.0, m.disp);
        dynasm!(self.ops ; .arch x64 ; vfmadd213ps Ry(d), Ry(x), YWORD [Rq(b) + o]);
    }

    /// `vminps dst, a, ymmword ptr [m]`.
    pub fn vminps_mem(&mut self, dst: Ymm, a: Ymm, m: Mem) {
        self.log(format!("vminps {dst}, {a}, ymmword ptr {m}"));
        let (d, x, b, o) = (dst.0, a.0, m.base.0, m.disp);
        dynasm!(self.ops ; .arch x64 ; vminps Ry(d), Ry(x), YWORD [Rq(b) + o]);
    }

    /// `vsubps dst, a, ymmword ptr [m]`.
    pub fn vsubps_mem(&mut self, dst: Ymm, a: Ymm, m: Mem) {
        self.log(format!("vsubps {dst}, {a}, ymmword ptr {m}"));
        let (d, x, b, o) = (dst.0, a.0, m.base.0, m.disp);
        dynasm!(self.ops ; .arch x64 ; vsubps Ry(d), Ry(x), YWORD [Rq(b) + o]);
    }

    /// `popcnt dst, src` (64-bit).
    pub fn popcnt(&mut self, dst: Gp, src: Gp) {
        self.log(format!("popcnt {dst}, {src}"));
        let (d, x) = (dst.0, src.0);
        dynasm!(self.ops ; .arch x64 ; popcnt Rq(d), Rq(x));
    }

    /// `and dst, imm32` (64-bit).
    pub fn and_imm(&mut self, dst: Gp, imm: i32) {
        self.log(format!("and {dst}, {imm}"));
        let d = dst.0;
        dynasm!(self.ops ; .arch x64 ; and Rq(d), DWORD imm);
    }

    /// `not dst` (64-bit).
    pub fn not(&mut self, dst: Gp) {
        self.log(format!("not {dst}"));
        let d = dst.0;
        dynasm!(self.ops ; .arch x64 ; not Rq(d));
    }

    /// `and dst, src` (64-bit).
    pub fn and(&mut self, dst: Gp, src: Gp) {
        self.log(format!("and {dst}, {src}"));
        let (d, x) = (dst.0, src.0);
        dynasm!(self.ops ; .arch x64 ; and Rq(d), Rq(x));
    }

    /// 8 signed bytes from memory → 8 i32, one instruction (raw VEX:
    /// dynasm 5.1 lacks the ymm-from-memory form). On an AMD Zen 3 the
    /// `vmovq` + register form it replaces made a P·V pass of fp8 values
    /// 1.3× slower in a loop held in L1.
    pub fn vpmovsxbd_load(&mut self, dst: Ymm, m: Mem) {
        self.vex_0f38_load(0x21, "vpmovsxbd", dst, m);
    }

    /// 8 unsigned bytes from memory → 8 i32 (as [`X86Asm::vpmovsxbd_load`]).
    pub fn vpmovzxbd_load(&mut self, dst: Ymm, m: Mem) {
        self.vex_0f38_load(0x31, "vpmovzxbd", dst, m);
    }

    /// VEX.256.66.0F38.WIG `opcode` /r, ymm from a qword in memory: C4
    /// [R X=1 B m-mmmm=00010] [W=0 vvvv=1111 L=1 pp=01] opcode modrm.
    fn vex_0f38_load(&mut self, opcode: u8, name: &str, dst: Ymm, m: Mem) {
        let (d, b) = (dst.0 & 15, m.base.0 & 15);
        let byte1 = vex3_byte1(d, b, 0b00010);
        let mut bytes = vec![0xC4, byte1, 0x7D, opcode];
        super::evex::modrm_address(&mut bytes, d, m.base, None, m.disp, 1);
        self.raw(&bytes, format!("{name} {dst}, qword ptr {m}"));
    }

    /// `vmovq xmm, qword ptr [m]` (upper lanes zeroed).
    pub fn vmovq_load(&mut self, dst: Ymm, m: Mem) {
        self.log(format!("vmovq {}, qword ptr {m}", dst.xmm()));
        let (d, b, o) = (dst.0, m.base.0, m.disp);
        dynasm!(self.ops ; .arch x64 ; vmovq Rx(d), QWORD [Rq(b) + o]);
    }

    /// The 8 sign bits of `src` → the low bits of a 32-bit register.
    pub fn vmovmskps(&mut self, dst: Gp, src: Ymm) {
        self.log(format!("vmovmskps {}, {src}", gp32(dst)));
        // dynasm 5.1 has no ymm form. VEX.256.0F.WIG 50 /r:
        // C4 [R X B m-mmmm=00001] [W vvvv=1111 L=1 pp=00] 50 modrm.
        let (d, r) = (dst.0 & 15, src.0 & 15);
        let byte1 = vex3_byte1(d, r, 0b00001);
        let byte2 = (0b1111 << 3) | (1 << 2);
        let modrm = 0b1100_0000 | ((d & 7) << 3) | (r & 7);
        self.ops.extend([0xC4, byte1, byte2, 0x50, modrm]);
    }

    /// `vmovss xmm, dword ptr [m]` (upper lanes zeroed).
    pub fn vmovss_load(&mut self, dst: Ymm, m: Mem) {
        self.log(format!("vmovss {}, dword ptr {m}", dst.xmm()));
        let (d, b, o) = (dst.0, m.base.0, m.disp);
        dynasm!(self.ops ; .arch x64 ; vmovss Rx(d), DWORD [Rq(b) + o]);
    }

    /// `vinsertps xmm, xmm, dword ptr [m], imm`: the dword into lane
    /// `imm >> 4` of `src`'s low lanes (upper 128 bits zeroed).
    pub fn vinsertps_load(&mut self, dst: Ymm, src: Ymm, m: Mem, imm: i8) {
        self.log(format!(
            "vinsertps {}, {}, dword ptr {m}, {}",
            dst.xmm(),
            src.xmm(),
            imm as u8
        ));
        let (d, x, b, o) = (dst.0, src.0, m.base.0, m.disp);
        dynasm!(self.ops ; .arch x64 ; vinsertps Rx(d), Rx(x), DWORD [Rq(b) + o], imm);
    }

    /// Unsigned `rdx:rax / src` → quotient in rax, remainder in rdx.
    pub fn div(&mut self, src: Gp) {
        self.log(format!("div {src}"));
        let s = src.0;
        dynasm!(self.ops ; .arch x64 ; div Rq(s));
    }

    /// `xor r32, r32` (zeroes the whole 64-bit register).
    pub fn zero(&mut self, dst: Gp) {
        self.log(format!("xor {}, {}", gp32(dst), gp32(dst)));
        let d = dst.0;
        dynasm!(self.ops ; .arch x64 ; xor Rd(d), Rd(d));
    }

    /// `vcvtsi2ss xmm, xmm, r64`.
    pub fn vcvtsi2ss(&mut self, dst: Ymm, src: Gp) {
        self.log(format!("vcvtsi2ss {}, {}, {src}", dst.xmm(), dst.xmm()));
        let (d, s) = (dst.0, src.0);
        dynasm!(self.ops ; .arch x64 ; vcvtsi2ss Rx(d), Rx(d), Rq(s));
    }

    pub fn vzeroupper(&mut self) {
        self.log("vzeroupper".into());
        dynasm!(self.ops ; .arch x64 ; vzeroupper);
    }
}

/// The bytes and listing `emit` writes: the encoder unit tests' view.
#[cfg(test)]
pub(crate) fn bytes_of(emit: impl FnOnce(&mut X86Asm)) -> (Vec<u8>, String) {
    let mut a = X86Asm::new();
    emit(&mut a);
    a.finish().unwrap()
}

/// The second byte of a 3-byte VEX prefix (C4): R̄ from ModRM.reg's
/// register `reg`, X̄ = 1 (no index), B̄ from ModRM.rm's register or base
/// `rm`, and the opcode map (`0b00001` 0F, `0b00010` 0F38).
fn vex3_byte1(reg: u8, rm: u8, map: u8) -> u8 {
    (((!reg >> 3) & 1) << 7) | (1 << 6) | (((!rm >> 3) & 1) << 5) | map
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listing_matches_each_instruction() {
        let mut a = X86Asm::new();
        a.vfmadd231ps(Ymm(3), Ymm(14), Ymm(15));
        a.vpbroadcastd_load(Ymm(2), mem(RDI, 4));
        a.vpdpbusd(Ymm(9), Ymm(1), Ymm(12));
        let top = a.new_label();
        a.bind(top);
        a.sub_imm(RCX, 1);
        a.jcc(Cond::Ne, top);
        a.ret();
        let (bytes, listing) = a.finish().unwrap();
        assert_eq!(&bytes[..5], &[0xc4, 0xc2, 0x0d, 0xb8, 0xdf]);
        // vpdpbusd ymm9, ymm1, ymm12 = C4 42 75 50 CC
        assert!(
            bytes
                .windows(5)
                .any(|w| w == [0xc4, 0x42, 0x75, 0x50, 0xcc])
        );
        assert!(listing.contains("vfmadd231ps ymm3, ymm14, ymm15"));
        assert!(listing.contains(".L1:"));
        assert!(listing.contains("jne .L1"));
    }

    #[test]
    fn unbound_label_is_an_error_not_a_panic() {
        let mut a = X86Asm::new();
        let l = a.new_label();
        a.jmp(l);
        assert!(a.finish().is_err());
    }
}
