//! A small typed EVEX (AVX-512) encoder: exactly the 512-bit instructions
//! the AVX-512 f32 GEMM ([`super::avx512`]) needs, since dynasm 5.1 has no
//! EVEX encoder. Each method encodes its bytes here and hands them with its
//! Intel-syntax line to [`X86Asm::raw`], so the listing stays the emitter's
//! own log and the llvm-mc cross-check covers these instructions too.
//!
//! Encoding (Intel SDM vol. 2, 2.7): `62 P0 P1 P2 opcode modrm [sib]
//! [disp]` with
//!
//! - P0 = `R̄ X̄ B̄ R̄' 0 m m m` (R, R' = bits 3, 4 of the ModRM.reg
//!   register; B, X = bits 3, 4 of a ModRM.rm register, or B = bit 3 of the
//!   base register and X̄ = 1 without an index),
//! - P1 = `W v̄v̄v̄v̄ 1 p p`, P2 = `z L'L b V̄' a a a` (L'L = 10: 512 bits;
//!   b: embedded broadcast; aaa: the opmask; z: zeroing-masking).
//!
//! Memory displacements use disp8·N compression: a displacement that is a
//! multiple of N (64 for a whole zmm, 4 for a broadcast or scalar f32) with
//! a quotient in i8 range takes one byte, as llvm-mc encodes it, so the
//! bytes equal llvm-mc's and the unit test compares them exactly.
//! `rsp`/`r12` bases take a SIB byte; `rbp`/`r13` with no displacement take
//! a zero disp8 (mod 00 would mean RIP-relative).

use super::asm::{Gp, Mem, X86Asm, Ymm};

/// A 512-bit vector register, zmm0-zmm31.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Zmm(pub u8);

impl std::fmt::Display for Zmm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "zmm{}", self.0 & 31)
    }
}

/// An opmask register k1-k7 (k0 in a mask field means "no mask").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Kreg(pub u8);

impl std::fmt::Display for Kreg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "k{}", self.0 & 7)
    }
}

/// The ModRM.rm operand.
#[derive(Clone, Copy, Debug)]
enum Rm {
    Reg(u8),
    Mem(Mem),
}

/// Opcode map (P0.mm).
const MAP_0F: u8 = 1;
const MAP_0F38: u8 = 2;
const MAP_0F3A: u8 = 3;
/// Maps 5 and 6 (AVX512-FP16's arithmetic and FMAs; P0.mmm = 101, 110).
const MAP_5: u8 = 5;
const MAP_6: u8 = 6;
/// Implied prefix (P1.pp).
const PP_NONE: u8 = 0;
const PP_66: u8 = 1;
const PP_F3: u8 = 2;
const PP_F2: u8 = 3;

/// One EVEX.512 instruction.
#[derive(Clone, Copy, Debug)]
struct Evex {
    map: u8,
    pp: u8,
    opcode: u8,
    /// ModRM.reg register (0-31).
    reg: u8,
    /// The second source (0-31); 0 when the instruction has none (which
    /// encodes as the required v̄v̄v̄v̄ = 1111, V̄' = 1).
    vvvv: u8,
    rm: Rm,
    /// Opmask register (0: none).
    mask: u8,
    zeroing: bool,
    broadcast: bool,
    /// disp8·N scale of a memory operand.
    n: i32,
}

impl Evex {
    /// A register-or-memory instruction with no mask and no broadcast.
    fn plain(map: u8, pp: u8, opcode: u8, reg: u8, vvvv: u8, rm: Rm, n: i32) -> Evex {
        Evex {
            map,
            pp,
            opcode,
            reg: reg & 31,
            vvvv: vvvv & 31,
            rm,
            mask: 0,
            zeroing: false,
            broadcast: false,
            n,
        }
    }
}

/// ModRM (+ SIB + displacement) for `reg` and a memory operand, with
/// displacements compressed by `n` when they fit.
fn modrm_mem(out: &mut Vec<u8>, reg: u8, m: Mem, n: i32) {
    modrm_address(out, reg, m.base, None, m.disp, n);
}

/// ModRM, SIB and displacement for `reg` and `[base + index + disp]`
/// (index None: no index, scale 1), as llvm-mc encodes them: a SIB byte
/// with an index or an rsp/r12 base, no displacement unless the base is
/// rbp/r13 (mod 00 would mean RIP-relative or no base), disp8 where `disp`
/// is a multiple of `n` whose quotient fits (EVEX's disp8·N; 1 elsewhere).
pub(super) fn modrm_address(
    out: &mut Vec<u8>,
    reg: u8,
    base: Gp,
    index: Option<Gp>,
    disp: i32,
    n: i32,
) {
    let b = base.0 & 7;
    let (md, bytes): (u8, Vec<u8>) = if disp == 0 && b != 5 {
        (0, vec![])
    } else if disp % n == 0 && i8::try_from(disp / n).is_ok() {
        (1, vec![(disp / n) as i8 as u8])
    } else {
        (2, disp.to_le_bytes().to_vec())
    };
    match index {
        Some(i) => {
            out.push((md << 6) | ((reg & 7) << 3) | 0b100);
            out.push(((i.0 & 7) << 3) | b);
        }
        None => {
            out.push((md << 6) | ((reg & 7) << 3) | b);
            if b == 4 {
                // SIB: no index (100), base rsp/r12.
                out.push(0x24);
            }
        }
    }
    out.extend(bytes);
}

impl Evex {
    fn encode(&self) -> Vec<u8> {
        let inv = |bit: u8| (!bit) & 1;
        let r = (self.reg >> 3) & 1;
        let r2 = (self.reg >> 4) & 1;
        let (b, x) = match self.rm {
            Rm::Reg(v) => ((v >> 3) & 1, (v >> 4) & 1),
            Rm::Mem(m) => ((m.base.0 >> 3) & 1, 0),
        };
        let p0 = (inv(r) << 7) | (inv(x) << 6) | (inv(b) << 5) | (inv(r2) << 4) | self.map;
        let p1 = (((!self.vvvv) & 15) << 3) | (1 << 2) | self.pp;
        let p2 = (u8::from(self.zeroing) << 7)
            | (0b10 << 5)
            | (u8::from(self.broadcast) << 4)
            | (inv((self.vvvv >> 4) & 1) << 3)
            | (self.mask & 7);
        let mut out = vec![0x62, p0, p1, p2, self.opcode];
        match self.rm {
            Rm::Reg(v) => out.push(0xC0 | ((self.reg & 7) << 3) | (v & 7)),
            Rm::Mem(m) => modrm_mem(&mut out, self.reg, m, self.n),
        }
        out
    }

    /// The same instruction under opmask `k`, the lanes not in it zeroed
    /// (and, for a load, not read); k0: unmasked.
    fn zero_masked(self, k: Kreg) -> Evex {
        Evex {
            mask: k.0 & 7,
            zeroing: k.0 & 7 != 0,
            ..self
        }
    }

    /// The same instruction with EVEX.W = 1 (64-bit elements).
    fn encode_w1(&self) -> Vec<u8> {
        let mut out = self.encode();
        out[2] |= 0x80;
        out
    }

    /// The same instruction on 256 bits (L'L = 01, AVX512VL): ymm0-15 name
    /// the same registers as zmm0-15's low halves.
    fn encode_256(&self) -> Vec<u8> {
        let mut out = self.encode();
        out[3] = (out[3] & !0x60) | 0x20;
        out
    }
}

/// `{k} {z}` after a destination under [`Evex::zero_masked`], nothing for
/// k0.
fn zero_mask_suffix(k: Kreg) -> String {
    mask_suffix(k, k.0 & 7 != 0)
}

/// `{k1}` / `{k1} {z}` after a destination, nothing for k0.
fn mask_suffix(k: Kreg, zeroing: bool) -> String {
    match (k.0 & 7, zeroing) {
        (0, _) => String::new(),
        (_, false) => format!(" {{{k}}}"),
        (_, true) => format!(" {{{k}}} {{z}}"),
    }
}

/// A full-width f32 instruction `op dst, a, b` in map 0F without prefix
/// (vaddps, vmaxps, ...).
fn ps_rrr(opcode: u8, dst: Zmm, a: Zmm, b: Zmm) -> Evex {
    Evex {
        map: MAP_0F,
        pp: PP_NONE,
        opcode,
        reg: dst.0 & 31,
        vvvv: a.0 & 31,
        rm: Rm::Reg(b.0 & 31),
        mask: 0,
        zeroing: false,
        broadcast: false,
        n: 64,
    }
}

impl X86Asm {
    fn evex(&mut self, e: Evex, line: String) {
        let bytes = e.encode();
        self.raw(&bytes, line);
    }

    /// [`Self::evex`] with an immediate byte after the operands.
    fn evex_ib(&mut self, e: Evex, imm: u8, line: String) {
        let mut bytes = e.encode();
        bytes.push(imm);
        self.raw(&bytes, line);
    }

    /// `vmovups zmm, zmmword ptr [m]`
    pub fn vmovups_zmm_load(&mut self, dst: Zmm, m: Mem) {
        self.vmovups_zmm_load_masked(dst, Kreg(0), m);
    }

    /// `vmovups zmm {k} {z}, zmmword ptr [m]`: loads the lanes set in `k`,
    /// zeroes the others; masked-off lanes never fault.
    pub fn vmovups_zmm_load_masked(&mut self, dst: Zmm, k: Kreg, m: Mem) {
        let masked = k.0 & 7 != 0;
        let line = format!("vmovups {dst}{}, zmmword ptr {m}", mask_suffix(k, masked));
        self.evex(
            Evex {
                map: MAP_0F,
                pp: PP_NONE,
                opcode: 0x10,
                reg: dst.0 & 31,
                vvvv: 0,
                rm: Rm::Mem(m),
                mask: k.0 & 7,
                zeroing: masked,
                broadcast: false,
                n: 64,
            },
            line,
        );
    }

    /// `vmovups zmmword ptr [m], zmm`
    pub fn vmovups_zmm_store(&mut self, m: Mem, src: Zmm) {
        self.vmovups_zmm_store_masked(m, Kreg(0), src);
    }

    /// `vmovups zmmword ptr [m] {k}, zmm`: stores the lanes set in `k`.
    pub fn vmovups_zmm_store_masked(&mut self, m: Mem, k: Kreg, src: Zmm) {
        let line = format!("vmovups zmmword ptr {m}{}, {src}", mask_suffix(k, false));
        self.evex(
            Evex {
                map: MAP_0F,
                pp: PP_NONE,
                opcode: 0x11,
                reg: src.0 & 31,
                vvvv: 0,
                rm: Rm::Mem(m),
                mask: k.0 & 7,
                zeroing: false,
                broadcast: false,
                n: 64,
            },
            line,
        );
    }

    /// `vbroadcastss zmm, dword ptr [m]`: one f32 to all 16 lanes.
    pub fn vbroadcastss_zmm_load(&mut self, dst: Zmm, m: Mem) {
        self.evex(
            Evex {
                map: MAP_0F38,
                pp: PP_66,
                opcode: 0x18,
                reg: dst.0 & 31,
                vvvv: 0,
                rm: Rm::Mem(m),
                mask: 0,
                zeroing: false,
                broadcast: false,
                n: 4,
            },
            format!("vbroadcastss {dst}, dword ptr {m}"),
        );
    }

    /// `vfmadd231ps dst, a, b`: dst += a · b.
    pub fn vfmadd231ps_zmm(&mut self, dst: Zmm, a: Zmm, b: Zmm) {
        self.evex(
            Evex {
                map: MAP_0F38,
                pp: PP_66,
                opcode: 0xB8,
                reg: dst.0 & 31,
                vvvv: a.0 & 31,
                rm: Rm::Reg(b.0 & 31),
                mask: 0,
                zeroing: false,
                broadcast: false,
                n: 64,
            },
            format!("vfmadd231ps {dst}, {a}, {b}"),
        );
    }

    /// `vfmadd231ps dst, a, zmmword ptr [m]`
    pub fn vfmadd231ps_zmm_mem(&mut self, dst: Zmm, a: Zmm, m: Mem) {
        self.evex(
            Evex {
                map: MAP_0F38,
                pp: PP_66,
                opcode: 0xB8,
                reg: dst.0 & 31,
                vvvv: a.0 & 31,
                rm: Rm::Mem(m),
                mask: 0,
                zeroing: false,
                broadcast: false,
                n: 64,
            },
            format!("vfmadd231ps {dst}, {a}, zmmword ptr {m}"),
        );
    }

    /// `vfmadd231ps dst, a, dword ptr [m]{1to16}`: dst += a · (one f32
    /// from memory, broadcast by the FMA itself).
    pub fn vfmadd231ps_zmm_bcst(&mut self, dst: Zmm, a: Zmm, m: Mem) {
        self.evex(
            Evex {
                map: MAP_0F38,
                pp: PP_66,
                opcode: 0xB8,
                reg: dst.0 & 31,
                vvvv: a.0 & 31,
                rm: Rm::Mem(m),
                mask: 0,
                zeroing: false,
                broadcast: true,
                n: 4,
            },
            format!("vfmadd231ps {dst}, {a}, dword ptr {m}{{1to16}}"),
        );
    }

    /// `vpxord dst, a, b` (AVX-512F; `vxorps zmm` would need AVX512DQ):
    /// with a = b = dst, the zero idiom.
    pub fn vpxord_zmm(&mut self, dst: Zmm, a: Zmm, b: Zmm) {
        self.evex(
            Evex {
                map: MAP_0F,
                pp: PP_66,
                opcode: 0xEF,
                reg: dst.0 & 31,
                vvvv: a.0 & 31,
                rm: Rm::Reg(b.0 & 31),
                mask: 0,
                zeroing: false,
                broadcast: false,
                n: 64,
            },
            format!("vpxord {dst}, {a}, {b}"),
        );
    }

    /// `vaddps dst, a, b`
    pub fn vaddps_zmm(&mut self, dst: Zmm, a: Zmm, b: Zmm) {
        self.evex(ps_rrr(0x58, dst, a, b), format!("vaddps {dst}, {a}, {b}"));
    }

    /// `vaddps dst, a, zmmword ptr [m]`
    pub fn vaddps_zmm_mem(&mut self, dst: Zmm, a: Zmm, m: Mem) {
        let e = Evex {
            rm: Rm::Mem(m),
            ..ps_rrr(0x58, dst, a, Zmm(0))
        };
        self.evex(e, format!("vaddps {dst}, {a}, zmmword ptr {m}"));
    }

    /// `vcmpps k, a, b, pred`: lanes where `a pred b` holds into k.
    pub fn vcmpps_zmm_k(&mut self, k: Kreg, a: Zmm, b: Zmm, pred: u8) {
        let e = Evex::plain(MAP_0F, PP_NONE, 0xC2, k.0 & 7, a.0, Rm::Reg(b.0 & 31), 64);
        self.evex_ib(e, pred, format!("vcmpps {k}, {a}, {b}, {pred}"));
    }

    /// `vmovaps dst {k} ({z}), src`: the lanes in k from src, the others
    /// kept or (`zeroing`) zeroed; k0 copies every lane.
    pub fn vmovaps_zmm_masked(&mut self, dst: Zmm, k: Kreg, src: Zmm, zeroing: bool) {
        let e = Evex {
            mask: k.0 & 7,
            zeroing: zeroing && k.0 & 7 != 0,
            ..Evex::plain(MAP_0F, PP_NONE, 0x28, dst.0, 0, Rm::Reg(src.0 & 31), 64)
        };
        let line = format!("vmovaps {dst}{}, {src}", mask_suffix(k, e.zeroing));
        self.evex(e, line);
    }

    /// `vmaxps dst, a, b`
    pub fn vmaxps_zmm(&mut self, dst: Zmm, a: Zmm, b: Zmm) {
        self.evex(ps_rrr(0x5F, dst, a, b), format!("vmaxps {dst}, {a}, {b}"));
    }

    /// `vminps dst, a, b`
    pub fn vminps_zmm(&mut self, dst: Zmm, a: Zmm, b: Zmm) {
        self.evex(ps_rrr(0x5D, dst, a, b), format!("vminps {dst}, {a}, {b}"));
    }

    /// `kmovw k, r32`: the low 16 bits of `src` into an opmask.
    pub fn kmovw_from_gp(&mut self, k: Kreg, src: Gp) {
        self.kmov_from_gp32("kmovw", PP_NONE, k, src);
    }

    /// `kandw dst, a, b` (VEX.L1.0F.W0 41): the 16-bit masks' AND.
    pub fn kandw(&mut self, dst: Kreg, a: Kreg, b: Kreg) {
        let vex = 0x80 | (((!a.0) & 15) << 3) | 0x04;
        let modrm = 0xC0 | ((dst.0 & 7) << 3) | (b.0 & 7);
        self.raw(&[0xC5, vex, 0x41, modrm], format!("kandw {dst}, {a}, {b}"));
    }

    /// `op k, r32` (VEX.L0.W0 92 with prefix `pp`: kmovw, kmovd): the
    /// 2-byte VEX form when `src` < r8, as llvm-mc encodes it.
    fn kmov_from_gp32(&mut self, op: &str, pp: u8, k: Kreg, src: Gp) {
        let (kk, s) = (k.0 & 7, src.0 & 15);
        let modrm = 0xC0 | (kk << 3) | (s & 7);
        let bytes = if s < 8 {
            // C5 [R̄=1 v̄v̄v̄v̄=1111 L=0 pp]
            vec![0xC5, 0xF8 | pp, 0x92, modrm]
        } else {
            // C4 [R̄=1 X̄=1 B̄=0 m=00001] [W=0 v̄v̄v̄v̄=1111 L=0 pp]
            vec![0xC4, 0xC1, 0x78 | pp, 0x92, modrm]
        };
        self.raw(&bytes, format!("{op} {k}, {}", gp32_name(src)));
    }
}

/// `ymm0`-`ymm31` by number (the VEX [`Ymm`] display names 0-15 only).
fn ymm_name(r: Ymm) -> String {
    format!("ymm{}", r.0 & 31)
}

/// EVEX forms (AVX512VL) of the ymm instructions the decode attention's
/// P·V pass uses, so its accumulators and broadcasts reach ymm16-31.
impl X86Asm {
    /// `vfmadd231ps dst, a, b` on ymm0-31.
    pub fn vfmadd231ps_ymm_evex(&mut self, dst: Ymm, a: Ymm, b: Ymm) {
        let e = Evex::plain(MAP_0F38, PP_66, 0xB8, dst.0, a.0, Rm::Reg(b.0 & 31), 32);
        let line = format!(
            "vfmadd231ps {}, {}, {}",
            ymm_name(dst),
            ymm_name(a),
            ymm_name(b)
        );
        self.raw(&e.encode_256(), line);
    }

    /// `vmovups ymm, ymmword ptr [m]` on ymm0-31.
    pub fn vmovups_ymm_evex_load(&mut self, dst: Ymm, m: Mem) {
        let e = Evex::plain(MAP_0F, PP_NONE, 0x10, dst.0, 0, Rm::Mem(m), 32);
        let line = format!("vmovups {}, ymmword ptr {m}", ymm_name(dst));
        self.raw(&e.encode_256(), line);
    }

    /// `vmovups ymmword ptr [m], ymm` on ymm0-31.
    pub fn vmovups_ymm_evex_store(&mut self, m: Mem, src: Ymm) {
        let e = Evex::plain(MAP_0F, PP_NONE, 0x11, src.0, 0, Rm::Mem(m), 32);
        let line = format!("vmovups ymmword ptr {m}, {}", ymm_name(src));
        self.raw(&e.encode_256(), line);
    }

    /// `vbroadcastss ymm, dword ptr [m]` on ymm0-31.
    pub fn vbroadcastss_ymm_evex_load(&mut self, dst: Ymm, m: Mem) {
        let e = Evex::plain(MAP_0F38, PP_66, 0x18, dst.0, 0, Rm::Mem(m), 4);
        let line = format!("vbroadcastss {}, dword ptr {m}", ymm_name(dst));
        self.raw(&e.encode_256(), line);
    }
}

/// The integer instructions of the AVX-512 int8 GEMM ([`super::avx512_int8`]):
/// AVX512-VNNI `vpdpbusd`, the int4 unpack (`vpandd`, shifts, lane
/// shuffles), dword broadcasts and `vcvtdq2ps`.
impl X86Asm {
    /// `vpdpbusd dst, a, b`: dst.i32 += Σ₄ a.u8 · b.s8 (AVX512-VNNI).
    pub fn vpdpbusd_zmm(&mut self, dst: Zmm, a: Zmm, b: Zmm) {
        let e = Evex::plain(MAP_0F38, PP_66, 0x50, dst.0, a.0, Rm::Reg(b.0 & 31), 64);
        self.evex(e, format!("vpdpbusd {dst}, {a}, {b}"));
    }

    /// `{evex} vpdpbusd dst, a, b` on ymm (AVX512-VNNI with AVX512VL): the
    /// AVX2 int8 kernels' dot product on CPUs that have AVX512-VNNI but
    /// not AVX-VNNI (Zen 4, Ice Lake).
    pub fn vpdpbusd_ymm_evex(&mut self, dst: Ymm, a: Ymm, b: Ymm) {
        let e = Evex::plain(MAP_0F38, PP_66, 0x50, dst.0, a.0, Rm::Reg(b.0 & 15), 32);
        let bytes = e.encode_256();
        self.raw(&bytes, format!("{{evex}} vpdpbusd {dst}, {a}, {b}"));
    }

    /// `{evex} vpdpwssd dst, a, b` on ymm (AVX512-VNNI with AVX512VL):
    /// dst.i32 += Σ₂ a.i16 · b.i16, the decode attention's int8-key dot
    /// where the CPU has AVX512-VNNI but not AVX-VNNI.
    pub fn vpdpwssd_ymm_evex(&mut self, dst: Ymm, a: Ymm, b: Ymm) {
        let e = Evex::plain(MAP_0F38, PP_66, 0x52, dst.0, a.0, Rm::Reg(b.0 & 15), 32);
        let bytes = e.encode_256();
        self.raw(&bytes, format!("{{evex}} vpdpwssd {dst}, {a}, {b}"));
    }

    /// `vpdpbusd dst, a, dword ptr [m]{1to16}`: b is one dword (4 signed
    /// bytes) from memory in every lane.
    pub fn vpdpbusd_zmm_bcst(&mut self, dst: Zmm, a: Zmm, m: Mem) {
        let e = Evex {
            broadcast: true,
            ..Evex::plain(MAP_0F38, PP_66, 0x50, dst.0, a.0, Rm::Mem(m), 4)
        };
        self.evex(e, format!("vpdpbusd {dst}, {a}, dword ptr {m}{{1to16}}"));
    }

    /// `vpdpwssd dst, a, b`: dst.i32 += Σ₂ a.i16 · b.i16 (AVX512-VNNI).
    pub fn vpdpwssd_zmm(&mut self, dst: Zmm, a: Zmm, b: Zmm) {
        let e = Evex::plain(MAP_0F38, PP_66, 0x52, dst.0, a.0, Rm::Reg(b.0 & 31), 64);
        self.evex(e, format!("vpdpwssd {dst}, {a}, {b}"));
    }

    /// `vpunpcklqdq dst, a, b`: per 128-bit lane, a's low qword then b's.
    pub fn vpunpcklqdq_zmm(&mut self, dst: Zmm, a: Zmm, b: Zmm) {
        let e = Evex::plain(MAP_0F, PP_66, 0x6C, dst.0, a.0, Rm::Reg(b.0 & 31), 64);
        self.raw(&e.encode_w1(), format!("vpunpcklqdq {dst}, {a}, {b}"));
    }

    /// `vpunpckldq dst, a, b`: per 128-bit lane, dwords 0 and 1 of a and b
    /// interleaved (a0 b0 a1 b1).
    pub fn vpunpckldq_zmm(&mut self, dst: Zmm, a: Zmm, b: Zmm) {
        let e = Evex::plain(MAP_0F, PP_66, 0x62, dst.0, a.0, Rm::Reg(b.0 & 31), 64);
        self.evex(e, format!("vpunpckldq {dst}, {a}, {b}"));
    }

    /// `vpunpckhdq dst, a, b`: per 128-bit lane, dwords 2 and 3 of a and b
    /// interleaved (a2 b2 a3 b3).
    pub fn vpunpckhdq_zmm(&mut self, dst: Zmm, a: Zmm, b: Zmm) {
        let e = Evex::plain(MAP_0F, PP_66, 0x6A, dst.0, a.0, Rm::Reg(b.0 & 31), 64);
        self.evex(e, format!("vpunpckhdq {dst}, {a}, {b}"));
    }

    /// `vpunpckhqdq dst, a, b`: per 128-bit lane, a's high qword then b's.
    pub fn vpunpckhqdq_zmm(&mut self, dst: Zmm, a: Zmm, b: Zmm) {
        let e = Evex::plain(MAP_0F, PP_66, 0x6D, dst.0, a.0, Rm::Reg(b.0 & 31), 64);
        self.raw(&e.encode_w1(), format!("vpunpckhqdq {dst}, {a}, {b}"));
    }

    /// `vshufps dst, a, b, imm`: per 128-bit lane, two dwords of a then two
    /// of b, two bits of `imm` each.
    pub fn vshufps_zmm(&mut self, dst: Zmm, a: Zmm, b: Zmm, imm: u8) {
        let e = Evex::plain(MAP_0F, PP_NONE, 0xC6, dst.0, a.0, Rm::Reg(b.0 & 31), 64);
        self.evex_ib(e, imm, format!("vshufps {dst}, {a}, {b}, {imm}"));
    }

    /// `vextracti64x4 dst, src, 1`: src's high 256 bits.
    pub fn vextracti64x4_hi(&mut self, dst: Ymm, src: Zmm) {
        let e = Evex::plain(MAP_0F3A, PP_66, 0x3B, src.0, 0, Rm::Reg(dst.0 & 31), 32);
        let mut bytes = e.encode_w1();
        bytes.push(1);
        let line = format!("vextracti64x4 {}, {src}, 1", ymm_name(dst));
        self.raw(&bytes, line);
    }

    /// `vpbroadcastd zmm, dword ptr [m]`
    pub fn vpbroadcastd_zmm_load(&mut self, dst: Zmm, m: Mem) {
        let e = Evex::plain(MAP_0F38, PP_66, 0x58, dst.0, 0, Rm::Mem(m), 4);
        self.evex(e, format!("vpbroadcastd {dst}, dword ptr {m}"));
    }

    /// `vbroadcasti32x4 zmm, xmmword ptr [m]`: 16 bytes to all four lanes.
    pub fn vbroadcasti32x4_zmm_load(&mut self, dst: Zmm, m: Mem) {
        let e = Evex::plain(MAP_0F38, PP_66, 0x5A, dst.0, 0, Rm::Mem(m), 16);
        self.evex(e, format!("vbroadcasti32x4 {dst}, xmmword ptr {m}"));
    }

    /// `vbroadcasti64x4 zmm, ymmword ptr [m]`: 32 bytes to both halves
    /// (a load alone, no shuffle µop, on Intel).
    pub fn vbroadcasti64x4_zmm_load(&mut self, dst: Zmm, m: Mem) {
        let e = Evex::plain(MAP_0F38, PP_66, 0x5B, dst.0, 0, Rm::Mem(m), 32);
        self.raw(
            &e.encode_w1(),
            format!("vbroadcasti64x4 {dst}, ymmword ptr {m}"),
        );
    }

    /// `vmovdqu8 zmm, zmmword ptr [m]` (AVX512BW)
    pub fn vmovdqu8_zmm_load(&mut self, dst: Zmm, m: Mem) {
        let e = Evex::plain(MAP_0F, PP_F2, 0x6F, dst.0, 0, Rm::Mem(m), 64);
        self.evex(e, format!("vmovdqu8 {dst}, zmmword ptr {m}"));
    }

    /// `vmovdqu32 zmm, zmmword ptr [m]`
    pub fn vmovdqu32_zmm_load(&mut self, dst: Zmm, m: Mem) {
        let e = Evex::plain(MAP_0F, PP_F3, 0x6F, dst.0, 0, Rm::Mem(m), 64);
        self.evex(e, format!("vmovdqu32 {dst}, zmmword ptr {m}"));
    }

    /// `vpandd dst, a, b`
    pub fn vpandd_zmm(&mut self, dst: Zmm, a: Zmm, b: Zmm) {
        let e = Evex::plain(MAP_0F, PP_66, 0xDB, dst.0, a.0, Rm::Reg(b.0 & 31), 64);
        self.evex(e, format!("vpandd {dst}, {a}, {b}"));
    }

    /// `vpandd dst, a, dword ptr [m]{1to16}`: and with a dword constant.
    pub fn vpandd_zmm_bcst(&mut self, dst: Zmm, a: Zmm, m: Mem) {
        let e = Evex {
            broadcast: true,
            ..Evex::plain(MAP_0F, PP_66, 0xDB, dst.0, a.0, Rm::Mem(m), 4)
        };
        self.evex(e, format!("vpandd {dst}, {a}, dword ptr {m}{{1to16}}"));
    }

    /// `vpxord dst, a, dword ptr [m]{1to16}`: xor with a dword constant.
    pub fn vpxord_zmm_bcst(&mut self, dst: Zmm, a: Zmm, m: Mem) {
        let e = Evex {
            broadcast: true,
            ..Evex::plain(MAP_0F, PP_66, 0xEF, dst.0, a.0, Rm::Mem(m), 4)
        };
        self.evex(e, format!("vpxord {dst}, {a}, dword ptr {m}{{1to16}}"));
    }

    /// `vpxord dst {k}{z}, a, zmmword ptr [m]`: a 64-byte load xored with
    /// `a`, the dwords not in k zeroed and not read (k0: every dword).
    pub fn vpxord_zmm_load_masked(&mut self, dst: Zmm, k: Kreg, a: Zmm, m: Mem) {
        let e = Evex::plain(MAP_0F, PP_66, 0xEF, dst.0, a.0, Rm::Mem(m), 64).zero_masked(k);
        let line = format!("vpxord {dst}{}, {a}, zmmword ptr {m}", zero_mask_suffix(k));
        self.evex(e, line);
    }

    /// `vpsubd dst, a, dword ptr [m]{1to16}`: i32 a minus a dword constant.
    pub fn vpsubd_zmm_bcst(&mut self, dst: Zmm, a: Zmm, m: Mem) {
        let e = Evex {
            broadcast: true,
            ..Evex::plain(MAP_0F, PP_66, 0xFA, dst.0, a.0, Rm::Mem(m), 4)
        };
        self.evex(e, format!("vpsubd {dst}, {a}, dword ptr {m}{{1to16}}"));
    }

    /// `vcmpps k {mask}, a, b, pred`: lanes where `a pred b` holds and that
    /// are in `mask` into k (so a chain of them ANDs the conditions).
    pub fn vcmpps_zmm_k_masked(&mut self, k: Kreg, mask: Kreg, a: Zmm, b: Zmm, pred: u8) {
        let e = Evex {
            mask: mask.0 & 7,
            ..Evex::plain(MAP_0F, PP_NONE, 0xC2, k.0 & 7, a.0, Rm::Reg(b.0 & 31), 64)
        };
        let line = format!("vcmpps {k}{}, {a}, {b}, {pred}", mask_suffix(mask, false));
        self.evex_ib(e, pred, line);
    }

    /// `vpsrld dst {k}, src, imm`: dwords shifted right, only the lanes in
    /// `k` written (merge masking; k0 = all lanes).
    pub fn vpsrld_zmm_imm(&mut self, dst: Zmm, k: Kreg, src: Zmm, imm: u8) {
        // Group 13 (66 0F 72 /2 ib): ModRM.reg = 2, the destination in vvvv.
        let e = Evex {
            mask: k.0 & 7,
            ..Evex::plain(MAP_0F, PP_66, 0x72, 2, dst.0, Rm::Reg(src.0 & 31), 64)
        };
        let line = format!("vpsrld {dst}{}, {src}, {imm}", mask_suffix(k, false));
        self.evex_ib(e, imm, line);
    }

    /// `vpslld dst, src, imm`: dwords shifted left.
    pub fn vpslld_zmm_imm(&mut self, dst: Zmm, src: Zmm, imm: u8) {
        // Group 13 (66 0F 72 /6 ib): ModRM.reg = 6, the destination in vvvv.
        let e = Evex::plain(MAP_0F, PP_66, 0x72, 6, dst.0, Rm::Reg(src.0 & 31), 64);
        self.evex_ib(e, imm, format!("vpslld {dst}, {src}, {imm}"));
    }

    /// `vpaddd dst, a, b`: i32 a + b.
    pub fn vpaddd_zmm(&mut self, dst: Zmm, a: Zmm, b: Zmm) {
        let e = Evex::plain(MAP_0F, PP_66, 0xFE, dst.0, a.0, Rm::Reg(b.0 & 31), 64);
        self.evex(e, format!("vpaddd {dst}, {a}, {b}"));
    }

    /// `vpsubd dst, a, b`: i32 a − b.
    pub fn vpsubd_zmm(&mut self, dst: Zmm, a: Zmm, b: Zmm) {
        let e = Evex::plain(MAP_0F, PP_66, 0xFA, dst.0, a.0, Rm::Reg(b.0 & 31), 64);
        self.evex(e, format!("vpsubd {dst}, {a}, {b}"));
    }

    /// `vcvtph2ps zmm, ymmword ptr [m]`: 16 f16 values widened to f32
    /// (group parameters stored as f16). A half-width memory operand:
    /// disp8 scales by 32.
    pub fn vcvtph2ps_zmm_load(&mut self, dst: Zmm, m: Mem) {
        let e = Evex::plain(MAP_0F38, PP_66, 0x13, dst.0, 0, Rm::Mem(m), 32);
        self.evex(e, format!("vcvtph2ps {dst}, ymmword ptr {m}"));
    }

    /// `vcvtph2ps dst {k} {z}, ymmword ptr [m]`: 16 halves to f32, the
    /// lanes not in `k` zeroed and not read (k0: all 16).
    pub fn vcvtph2ps_zmm_load_masked(&mut self, dst: Zmm, k: Kreg, m: Mem) {
        let e = Evex::plain(MAP_0F38, PP_66, 0x13, dst.0, 0, Rm::Mem(m), 32).zero_masked(k);
        let line = format!("vcvtph2ps {dst}{}, ymmword ptr {m}", zero_mask_suffix(k));
        self.evex(e, line);
    }

    /// `vpsrlw dst, src, imm` (AVX512BW)
    pub fn vpsrlw_zmm_imm(&mut self, dst: Zmm, src: Zmm, imm: u8) {
        // Group 12 (66 0F 71 /2 ib).
        let e = Evex::plain(MAP_0F, PP_66, 0x71, 2, dst.0, Rm::Reg(src.0 & 31), 64);
        self.evex_ib(e, imm, format!("vpsrlw {dst}, {src}, {imm}"));
    }

    /// `vshufi32x4 dst, a, b, imm`: lanes 0-1 of dst from a, 2-3 from b,
    /// two bits of `imm` per lane choosing the 128-bit source lane.
    pub fn vshufi32x4_zmm(&mut self, dst: Zmm, a: Zmm, b: Zmm, imm: u8) {
        let e = Evex::plain(MAP_0F3A, PP_66, 0x43, dst.0, a.0, Rm::Reg(b.0 & 31), 64);
        self.evex_ib(e, imm, format!("vshufi32x4 {dst}, {a}, {b}, {imm}"));
    }

    /// `vshufi32x4 dst, a, zmmword ptr [m], imm`: lanes 0-1 of dst from
    /// a, 2-3 from the 64 bytes at m.
    pub fn vshufi32x4_zmm_mem(&mut self, dst: Zmm, a: Zmm, m: Mem, imm: u8) {
        let e = Evex::plain(MAP_0F3A, PP_66, 0x43, dst.0, a.0, Rm::Mem(m), 64);
        self.evex_ib(
            e,
            imm,
            format!("vshufi32x4 {dst}, {a}, zmmword ptr {m}, {imm}"),
        );
    }

    /// `vpermq dst, zmmword ptr [m], imm`: within each 256-bit half, qword
    /// i of dst = qword (imm >> 2i) & 3 of that half.
    pub fn vpermq_zmm_mem_imm(&mut self, dst: Zmm, m: Mem, imm: u8) {
        let e = Evex::plain(MAP_0F3A, PP_66, 0x00, dst.0, 0, Rm::Mem(m), 64);
        let mut bytes = e.encode_w1();
        bytes.push(imm);
        self.raw(&bytes, format!("vpermq {dst}, zmmword ptr {m}, {imm}"));
    }

    /// `vcvtph2ps zmm, ymm`: 16 f16 values in a register widened to f32.
    pub fn vcvtph2ps_zmm(&mut self, dst: Zmm, src: Ymm) {
        let e = Evex::plain(MAP_0F38, PP_66, 0x13, dst.0, 0, Rm::Reg(src.0 & 31), 32);
        self.evex(e, format!("vcvtph2ps {dst}, {}", ymm_name(src)));
    }

    /// `vcvtdq2ps dst, src`: i32 → f32.
    pub fn vcvtdq2ps_zmm(&mut self, dst: Zmm, src: Zmm) {
        let e = Evex::plain(MAP_0F, PP_NONE, 0x5B, dst.0, 0, Rm::Reg(src.0 & 31), 64);
        self.evex(e, format!("vcvtdq2ps {dst}, {src}"));
    }

    /// `vcvtdq2ps dst, dword ptr [m]{1to16}`: one i32 from memory as f32
    /// in every lane.
    pub fn vcvtdq2ps_zmm_bcst(&mut self, dst: Zmm, m: Mem) {
        let e = Evex {
            broadcast: true,
            ..Evex::plain(MAP_0F, PP_NONE, 0x5B, dst.0, 0, Rm::Mem(m), 4)
        };
        self.evex(e, format!("vcvtdq2ps {dst}, dword ptr {m}{{1to16}}"));
    }

    /// `vmaxps dst, a, dword ptr [m]{1to16}` (b's one f32 in every lane;
    /// a NaN lane of a gives the broadcast value, as `vmaxps` returns its
    /// second source).
    pub fn vmaxps_zmm_bcst(&mut self, dst: Zmm, a: Zmm, m: Mem) {
        let e = Evex {
            broadcast: true,
            ..Evex::plain(MAP_0F, PP_NONE, 0x5F, dst.0, a.0, Rm::Mem(m), 4)
        };
        self.evex(e, format!("vmaxps {dst}, {a}, dword ptr {m}{{1to16}}"));
    }

    /// `vminps dst, a, dword ptr [m]{1to16}`
    pub fn vminps_zmm_bcst(&mut self, dst: Zmm, a: Zmm, m: Mem) {
        let e = Evex {
            broadcast: true,
            ..Evex::plain(MAP_0F, PP_NONE, 0x5D, dst.0, a.0, Rm::Mem(m), 4)
        };
        self.evex(e, format!("vminps {dst}, {a}, dword ptr {m}{{1to16}}"));
    }

    /// `vcvtps2dq dst, src`: f32 to i32, rounded as MXCSR says (nearest).
    pub fn vcvtps2dq_zmm(&mut self, dst: Zmm, src: Zmm) {
        let e = Evex::plain(MAP_0F, PP_66, 0x5B, dst.0, 0, Rm::Reg(src.0 & 31), 64);
        self.evex(e, format!("vcvtps2dq {dst}, {src}"));
    }

    /// `vfmadd213ps dst, a, dword ptr [m]{1to16}`: dst = dst·a + b.
    pub fn vfmadd213ps_zmm_bcst(&mut self, dst: Zmm, a: Zmm, m: Mem) {
        let e = Evex {
            broadcast: true,
            ..Evex::plain(MAP_0F38, PP_66, 0xA8, dst.0, a.0, Rm::Mem(m), 4)
        };
        self.evex(e, format!("vfmadd213ps {dst}, {a}, dword ptr {m}{{1to16}}"));
    }

    /// `vmulps dst, a, b`
    pub fn vmulps_zmm(&mut self, dst: Zmm, a: Zmm, b: Zmm) {
        self.evex(ps_rrr(0x59, dst, a, b), format!("vmulps {dst}, {a}, {b}"));
    }

    /// `vmulps dst, a, dword ptr [m]{1to16}`
    pub fn vmulps_zmm_bcst(&mut self, dst: Zmm, a: Zmm, m: Mem) {
        let e = Evex {
            broadcast: true,
            ..Evex::plain(MAP_0F, PP_NONE, 0x59, dst.0, a.0, Rm::Mem(m), 4)
        };
        self.evex(e, format!("vmulps {dst}, {a}, dword ptr {m}{{1to16}}"));
    }
}

/// The decode attention's P·V of fp8 values by bf16 dot products
/// (AVX512_BF16), its e4m3 → bf16 byte lookups (AVX512_VBMI) and masked
/// row loads (AVX512BW).
impl X86Asm {
    /// `vpermb dst, idx, src`: `dst.byte[i] = src.byte[idx.byte[i] & 63]`.
    pub fn vpermb_zmm(&mut self, dst: Zmm, idx: Zmm, src: Zmm) {
        let e = Evex::plain(MAP_0F38, PP_66, 0x8D, dst.0, idx.0, Rm::Reg(src.0 & 31), 64);
        self.evex(e, format!("vpermb {dst}, {idx}, {src}"));
    }

    /// `vmovdqa64 dst, src`: a register copy.
    pub fn vmovdqa64_zmm(&mut self, dst: Zmm, src: Zmm) {
        let e = Evex::plain(MAP_0F, PP_66, 0x6F, dst.0, 0, Rm::Reg(src.0 & 31), 64);
        self.raw(&e.encode_w1(), format!("vmovdqa64 {dst}, {src}"));
    }

    /// `vpermi2b idx, t0, t1`: [`Self::vpermi2b_zmm_mem`] with the
    /// table's second half in a register.
    pub fn vpermi2b_zmm(&mut self, idx: Zmm, t0: Zmm, t1: Zmm) {
        let e = Evex::plain(MAP_0F38, PP_66, 0x75, idx.0, t0.0, Rm::Reg(t1.0 & 31), 64);
        self.evex(e, format!("vpermi2b {idx}, {t0}, {t1}"));
    }

    /// `vpermi2b idx, t0, zmmword ptr [m]`: each byte of `idx` replaced by
    /// entry `idx & 127` of the 128-byte table `t0 ‖ [m]`.
    pub fn vpermi2b_zmm_mem(&mut self, idx: Zmm, t0: Zmm, m: Mem) {
        let e = Evex::plain(MAP_0F38, PP_66, 0x75, idx.0, t0.0, Rm::Mem(m), 64);
        self.evex(e, format!("vpermi2b {idx}, {t0}, zmmword ptr {m}"));
    }

    /// `vpternlogd dst, b, dword ptr [m]{1to16}, imm`: the bitwise function
    /// `imm` of (dst, b, the broadcast dword).
    pub fn vpternlogd_zmm_bcst(&mut self, dst: Zmm, b: Zmm, m: Mem, imm: u8) {
        let e = Evex {
            broadcast: true,
            ..Evex::plain(MAP_0F3A, PP_66, 0x25, dst.0, b.0, Rm::Mem(m), 4)
        };
        self.evex_ib(
            e,
            imm,
            format!("vpternlogd {dst}, {b}, dword ptr {m}{{1to16}}, {imm}"),
        );
    }

    /// `vpunpcklbw dst, a, b`: per 128-bit lane, the low 8 bytes of a and b
    /// interleaved (a's first).
    pub fn vpunpcklbw_zmm(&mut self, dst: Zmm, a: Zmm, b: Zmm) {
        let e = Evex::plain(MAP_0F, PP_66, 0x60, dst.0, a.0, Rm::Reg(b.0 & 31), 64);
        self.evex(e, format!("vpunpcklbw {dst}, {a}, {b}"));
    }

    /// `vpunpckhbw dst, a, b`: likewise the high 8 bytes of each lane.
    pub fn vpunpckhbw_zmm(&mut self, dst: Zmm, a: Zmm, b: Zmm) {
        let e = Evex::plain(MAP_0F, PP_66, 0x68, dst.0, a.0, Rm::Reg(b.0 & 31), 64);
        self.evex(e, format!("vpunpckhbw {dst}, {a}, {b}"));
    }

    /// `vdpbf16ps dst, a, dword ptr [m]{1to16}`: per f32 lane, dst += the
    /// two bf16 products of a's pair and the broadcast pair (denormal
    /// inputs read as zero).
    pub fn vdpbf16ps_zmm_bcst(&mut self, dst: Zmm, a: Zmm, m: Mem) {
        let e = Evex {
            broadcast: true,
            ..Evex::plain(MAP_0F38, PP_F3, 0x52, dst.0, a.0, Rm::Mem(m), 4)
        };
        self.evex(e, format!("vdpbf16ps {dst}, {a}, dword ptr {m}{{1to16}}"));
    }

    /// `vdpbf16ps dst, a, b`: [`Self::vdpbf16ps_zmm_bcst`] with the pairs
    /// in a register.
    pub fn vdpbf16ps_zmm(&mut self, dst: Zmm, a: Zmm, b: Zmm) {
        let e = Evex::plain(MAP_0F38, PP_F3, 0x52, dst.0, a.0, Rm::Reg(b.0 & 31), 64);
        self.evex(e, format!("vdpbf16ps {dst}, {a}, {b}"));
    }

    /// `vmovdqu8 dst {k} [{z}], zmmword ptr [m]`: the bytes set in `k`
    /// loaded (masked-off bytes never fault), the others zeroed or kept.
    pub fn vmovdqu8_zmm_load_masked(&mut self, dst: Zmm, k: Kreg, zeroing: bool, m: Mem) {
        let e = Evex {
            mask: k.0 & 7,
            zeroing,
            ..Evex::plain(MAP_0F, PP_F2, 0x6F, dst.0, 0, Rm::Mem(m), 64)
        };
        self.evex(
            e,
            format!("vmovdqu8 {dst}{}, zmmword ptr {m}", mask_suffix(k, zeroing)),
        );
    }

    /// `kmovq k, r64`: a 64-lane byte mask from a register (VEX.W1).
    pub fn kmovq_from_gp(&mut self, k: Kreg, src: Gp) {
        let (kk, s) = (k.0 & 7, src.0 & 15);
        // C4 [R̄=1 X̄=1 B̄ m=00001] [W=1 v̄v̄v̄v̄=1111 L=0 pp=F2]
        let b_bar = u8::from(s < 8) << 5;
        let bytes = vec![0xC4, 0xC1 | b_bar, 0xFB, 0x92, 0xC0 | (kk << 3) | (s & 7)];
        self.raw(&bytes, format!("kmovq {k}, {}", gp64_name(src)));
    }

    /// `vinsertf64x4 dst, src, ymmword ptr [m], 1`: dst = src with its high
    /// 256 bits from memory.
    pub fn vinsertf64x4_hi_mem(&mut self, dst: Zmm, src: Zmm, m: Mem) {
        let e = Evex::plain(MAP_0F3A, PP_66, 0x1A, dst.0, src.0, Rm::Mem(m), 32);
        let mut bytes = e.encode_w1();
        bytes.push(1);
        self.raw(
            &bytes,
            format!("vinsertf64x4 {dst}, {src}, ymmword ptr {m}, 1"),
        );
    }

    /// `vextractf64x4 ymmword ptr [m], src, 1`: src's high 256 bits stored.
    pub fn vextractf64x4_hi_store(&mut self, m: Mem, src: Zmm) {
        let e = Evex::plain(MAP_0F3A, PP_66, 0x1B, src.0, 0, Rm::Mem(m), 32);
        let mut bytes = e.encode_w1();
        bytes.push(1);
        self.raw(&bytes, format!("vextractf64x4 ymmword ptr {m}, {src}, 1"));
    }

    /// `vcvtne2ps2bf16 dst, hi, lo` on ymm: words 0-7 the bf16 of lo's f32
    /// (round to nearest even), 8-15 of hi's.
    pub fn vcvtne2ps2bf16_ymm(&mut self, dst: Ymm, hi: Ymm, lo: Ymm) {
        let e = Evex::plain(MAP_0F38, PP_F2, 0x72, dst.0, hi.0, Rm::Reg(lo.0 & 31), 32);
        let line = format!(
            "vcvtne2ps2bf16 {}, {}, {}",
            ymm_name(dst),
            ymm_name(hi),
            ymm_name(lo)
        );
        self.raw(&e.encode_256(), line);
    }

    /// `vpermw dst, idx, src` on ymm (AVX512BW with AVX512VL).
    pub fn vpermw_ymm(&mut self, dst: Ymm, idx: Ymm, src: Ymm) {
        let e = Evex::plain(MAP_0F38, PP_66, 0x8D, dst.0, idx.0, Rm::Reg(src.0 & 31), 32);
        let mut bytes = e.encode_256();
        bytes[2] |= 0x80;
        let line = format!(
            "vpermw {}, {}, {}",
            ymm_name(dst),
            ymm_name(idx),
            ymm_name(src)
        );
        self.raw(&bytes, line);
    }

    /// `vcvtneps2bf16 dst, src`: 16 f32 to 16 bf16 (round to nearest
    /// even) in a ymm.
    pub fn vcvtneps2bf16_zmm(&mut self, dst: Ymm, src: Zmm) {
        let e = Evex::plain(MAP_0F38, PP_F3, 0x72, dst.0, 0, Rm::Reg(src.0 & 31), 64);
        self.evex(e, format!("vcvtneps2bf16 {}, {src}", ymm_name(dst)));
    }

    /// `vpermt2d t0, idx, t1`: each dword of t0 replaced by entry `idx & 31`
    /// of the 32-dword table `t0 ‖ t1`.
    pub fn vpermt2d_zmm(&mut self, t0: Zmm, idx: Zmm, t1: Zmm) {
        let e = Evex::plain(MAP_0F38, PP_66, 0x7E, t0.0, idx.0, Rm::Reg(t1.0 & 31), 64);
        self.evex(e, format!("vpermt2d {t0}, {idx}, {t1}"));
    }

    /// `vsubps dst, a, b`
    pub fn vsubps_zmm(&mut self, dst: Zmm, a: Zmm, b: Zmm) {
        self.evex(ps_rrr(0x5C, dst, a, b), format!("vsubps {dst}, {a}, {b}"));
    }
}

/// The AVX512-FP16 P·V of the decode attention ([`super::attention`]):
/// f16 FMAs on zmm with p broadcast from memory, its masked row loads,
/// and what widens the f16 sums to f32 a 128-bit lane at a time.
impl X86Asm {
    /// `vcvtph2ps dst, src.xmm` on ymm0-31: the 8 f16 of src's low half
    /// to f32.
    pub fn vcvtph2ps_ymm_evex(&mut self, dst: Ymm, src: Ymm) {
        let e = Evex::plain(MAP_0F38, PP_66, 0x13, dst.0, 0, Rm::Reg(src.0 & 31), 32);
        let line = format!("vcvtph2ps {}, xmm{}", ymm_name(dst), src.0 & 31);
        self.raw(&e.encode_256(), line);
    }

    /// `vfmadd231ph dst, a, word ptr [m]{1to32}`: 32 f16 lanes of dst +=
    /// a · the f16 at m (AVX512-FP16).
    pub fn vfmadd231ph_zmm_bcst(&mut self, dst: Zmm, a: Zmm, m: Mem) {
        self.ph_zmm_bcst("vfmadd231ph", (MAP_6, PP_66, 0xB8), dst, a, m);
    }

    /// `vmulph dst, a, word ptr [m]{1to32}` (AVX512-FP16).
    pub fn vmulph_zmm_bcst(&mut self, dst: Zmm, a: Zmm, m: Mem) {
        self.ph_zmm_bcst("vmulph", (MAP_5, PP_NONE, 0x59), dst, a, m);
    }

    fn ph_zmm_bcst(&mut self, op: &str, (map, pp, opcode): (u8, u8, u8), dst: Zmm, a: Zmm, m: Mem) {
        let e = Evex {
            broadcast: true,
            ..Evex::plain(map, pp, opcode, dst.0, a.0, Rm::Mem(m), 2)
        };
        self.evex(e, format!("{op} {dst}, {a}, word ptr {m}{{1to32}}"));
    }

    /// `vpmovsxbd dst {k} {z}, xmmword ptr [m]`: 16 signed bytes to dwords,
    /// the lanes not in `k` zeroed and not read (k0: all 16).
    pub fn vpmovsxbd_zmm_load_masked(&mut self, dst: Zmm, k: Kreg, m: Mem) {
        let e = Evex::plain(MAP_0F38, PP_66, 0x21, dst.0, 0, Rm::Mem(m), 16).zero_masked(k);
        let line = format!("vpmovsxbd {dst}{}, xmmword ptr {m}", zero_mask_suffix(k));
        self.evex(e, line);
    }

    /// `vpmovsxbw dst {k} {z}, ymmword ptr [m]`: 32 signed bytes to words,
    /// the lanes not in `k` zeroed and not read (k0: all 32).
    pub fn vpmovsxbw_zmm_load_masked(&mut self, dst: Zmm, k: Kreg, m: Mem) {
        let e = Evex::plain(MAP_0F38, PP_66, 0x20, dst.0, 0, Rm::Mem(m), 32).zero_masked(k);
        let line = format!("vpmovsxbw {dst}{}, ymmword ptr {m}", zero_mask_suffix(k));
        self.evex(e, line);
    }

    /// `vmovdqu16 dst {k} {z}, zmmword ptr [m]`: 32 words, the lanes not in
    /// `k` zeroed and not read (k0: all 32).
    pub fn vmovdqu16_zmm_load_masked(&mut self, dst: Zmm, k: Kreg, m: Mem) {
        let e = Evex::plain(MAP_0F, PP_F2, 0x6F, dst.0, 0, Rm::Mem(m), 64).zero_masked(k);
        let line = format!("vmovdqu16 {dst}{}, zmmword ptr {m}", zero_mask_suffix(k));
        self.raw(&e.encode_w1(), line);
    }

    /// `vpsllw dst, src, imm` on 32 words.
    pub fn vpsllw_zmm_imm(&mut self, dst: Zmm, src: Zmm, imm: u8) {
        // Group 12 (66 0F 71 /6 ib).
        let e = Evex::plain(MAP_0F, PP_66, 0x71, 6, dst.0, Rm::Reg(src.0 & 31), 64);
        self.evex_ib(e, imm, format!("vpsllw {dst}, {src}, {imm}"));
    }

    /// `vextracti32x4 dst.xmm, src, lane`: 128-bit lane `lane` (0-3) of src.
    pub fn vextracti32x4_zmm(&mut self, dst: Ymm, src: Zmm, lane: u8) {
        let e = Evex::plain(MAP_0F3A, PP_66, 0x39, src.0, 0, Rm::Reg(dst.0 & 31), 64);
        let line = format!("vextracti32x4 xmm{}, {src}, {}", dst.0 & 31, lane & 3);
        self.evex_ib(e, lane & 3, line);
    }

    /// `kmovd k, r32`: a 32-lane mask from a register (VEX.W0, F2).
    pub fn kmovd_from_gp(&mut self, k: Kreg, src: Gp) {
        self.kmov_from_gp32("kmovd", PP_F2, k, src);
    }
}

/// The 64-bit name of a general-purpose register.
fn gp64_name(r: Gp) -> String {
    const N: [&str; 8] = ["rax", "rcx", "rdx", "rbx", "rsp", "rbp", "rsi", "rdi"];
    match r.0 & 15 {
        n @ 0..8 => N[usize::from(n)].to_string(),
        n => format!("r{n}"),
    }
}

/// The 32-bit name of a general-purpose register (`eax`, `r8d`).
fn gp32_name(r: Gp) -> String {
    const N: [&str; 8] = ["eax", "ecx", "edx", "ebx", "esp", "ebp", "esi", "edi"];
    match r.0 & 15 {
        n @ 0..8 => N[usize::from(n)].to_string(),
        n => format!("r{n}d"),
    }
}

#[cfg(test)]
mod tests {
    use super::super::asm::*;
    use super::*;

    /// Encodings from the Intel SDM / llvm-mc, written down by hand.
    #[test]
    fn known_encodings() {
        let (b, l) = bytes_of(|a| a.vfmadd231ps_zmm(Zmm(0), Zmm(1), Zmm(2)));
        assert_eq!(b, [0x62, 0xF2, 0x75, 0x48, 0xB8, 0xC2]);
        assert_eq!(l.trim(), "vfmadd231ps zmm0, zmm1, zmm2");
        // zmm31 += zmm16 · [r13 + 4]{1to16}: disp8 1 (scaled by 4)
        let (b, _) = bytes_of(|a| a.vfmadd231ps_zmm_bcst(Zmm(31), Zmm(16), mem(R13, 4)));
        assert_eq!(b, [0x62, 0x42, 0x7D, 0x50, 0xB8, 0x7D, 0x01]);
        // vmovups zmm1, [rsp + 64]: SIB, disp8 1 (scaled by 64)
        let (b, _) = bytes_of(|a| a.vmovups_zmm_load(Zmm(1), mem(RSP, 64)));
        assert_eq!(b, [0x62, 0xF1, 0x7C, 0x48, 0x10, 0x4C, 0x24, 0x01]);
        // kmovw k1, eax
        let (b, _) = bytes_of(|a| a.kmovw_from_gp(Kreg(1), RAX));
        assert_eq!(b, [0xC5, 0xF8, 0x92, 0xC8]);
        // The keys-in-lanes score loop's transpose, load-xor, correction
        // and range chain (llvm-mc).
        let (b, _) = bytes_of(|a| a.vpunpckldq_zmm(Zmm(3), Zmm(17), Zmm(30)));
        assert_eq!(b, [0x62, 0x91, 0x75, 0x40, 0x62, 0xDE]);
        let (b, _) = bytes_of(|a| a.vpunpckhdq_zmm(Zmm(3), Zmm(17), Zmm(30)));
        assert_eq!(b, [0x62, 0x91, 0x75, 0x40, 0x6A, 0xDE]);
        let (b, _) = bytes_of(|a| a.vpxord_zmm_load_masked(Zmm(5), Kreg(3), Zmm(30), mem(RSI, 0)));
        assert_eq!(b, [0x62, 0xF1, 0x0D, 0xC3, 0xEF, 0x2E]);
        let (b, _) = bytes_of(|a| a.vpxord_zmm_load_masked(Zmm(17), Kreg(0), Zmm(30), mem(RSI, 0)));
        assert_eq!(b, [0x62, 0xE1, 0x0D, 0x40, 0xEF, 0x0E]);
        let (b, _) = bytes_of(|a| a.vpsubd_zmm_bcst(Zmm(2), Zmm(2), mem(RBX, 320)));
        assert_eq!(b, [0x62, 0xF1, 0x6D, 0x58, 0xFA, 0x53, 0x50]);
        let (b, _) = bytes_of(|a| a.vcmpps_zmm_k_masked(Kreg(1), Kreg(1), Zmm(7), Zmm(5), 13));
        assert_eq!(b, [0x62, 0xF1, 0x44, 0x49, 0xC2, 0xCD, 0x0D]);
        let (b, _) = bytes_of(|a| a.kandw(Kreg(1), Kreg(2), Kreg(3)));
        assert_eq!(b, [0xC5, 0xEC, 0x41, 0xCB]);
        let (b, _) = bytes_of(|a| a.kandw(Kreg(4), Kreg(4), Kreg(5)));
        assert_eq!(b, [0xC5, 0xDC, 0x41, 0xE5]);
        // vpdpbusd zmm1, zmm2, zmm3 (llvm-mc)
        let (b, _) = bytes_of(|a| a.vpdpbusd_zmm(Zmm(1), Zmm(2), Zmm(3)));
        assert_eq!(b, [0x62, 0xF2, 0x6D, 0x48, 0x50, 0xCB]);
        // {evex} vpdpbusd ymm9, ymm1, ymm12 (llvm-mc)
        let (b, l) = bytes_of(|a| a.vpdpbusd_ymm_evex(Ymm(9), Ymm(1), Ymm(12)));
        assert_eq!(b, [0x62, 0x52, 0x75, 0x28, 0x50, 0xCC]);
        assert_eq!(l.trim(), "{evex} vpdpbusd ymm9, ymm1, ymm12");
        // {evex} vpdpwssd ymm9, ymm1, ymm12 (llvm-mc)
        let (b, l) = bytes_of(|a| a.vpdpwssd_ymm_evex(Ymm(9), Ymm(1), Ymm(12)));
        assert_eq!(b, [0x62, 0x52, 0x75, 0x28, 0x52, 0xCC]);
        assert_eq!(l.trim(), "{evex} vpdpwssd ymm9, ymm1, ymm12");
        // vfmadd231ps ymm17, ymm0, ymm30; vmovups ymm20, [rdx + 64];
        // vmovups [rdx + 32], ymm31; vbroadcastss ymm18, [rsi + 8] (llvm-mc)
        let (b, l) = bytes_of(|a| a.vfmadd231ps_ymm_evex(Ymm(17), Ymm(0), Ymm(30)));
        assert_eq!(b, [0x62, 0x82, 0x7D, 0x28, 0xB8, 0xCE]);
        assert_eq!(l.trim(), "vfmadd231ps ymm17, ymm0, ymm30");
        let (b, _) = bytes_of(|a| a.vmovups_ymm_evex_load(Ymm(20), mem(RDX, 64)));
        assert_eq!(b, [0x62, 0xE1, 0x7C, 0x28, 0x10, 0x62, 0x02]);
        let (b, _) = bytes_of(|a| a.vmovups_ymm_evex_store(mem(RDX, 32), Ymm(31)));
        assert_eq!(b, [0x62, 0x61, 0x7C, 0x28, 0x11, 0x7A, 0x01]);
        let (b, _) = bytes_of(|a| a.vbroadcastss_ymm_evex_load(Ymm(18), mem(RSI, 8)));
        assert_eq!(b, [0x62, 0xE2, 0x7D, 0x28, 0x18, 0x56, 0x02]);
        // vpsrld zmm1 {k2}, zmm1, 4 (llvm-mc)
        let (b, _) = bytes_of(|a| a.vpsrld_zmm_imm(Zmm(1), Kreg(2), Zmm(1), 4));
        assert_eq!(b, [0x62, 0xF1, 0x75, 0x4A, 0x72, 0xD1, 0x04]);
    }

    /// The bf16 P·V's instructions, bytes from llvm-mc 19.
    #[test]
    fn bf16_pv_encodings() {
        let (b, l) = bytes_of(|a| a.vdpbf16ps_zmm_bcst(Zmm(8), Zmm(3), mem(RSI, 4)));
        assert_eq!(b, [0x62, 0x72, 0x66, 0x58, 0x52, 0x46, 0x01]);
        assert_eq!(l.trim(), "vdpbf16ps zmm8, zmm3, dword ptr [rsi + 4]{1to16}");
        let (b, l) = bytes_of(|a| a.vdpbf16ps_zmm(Zmm(20), Zmm(3), Zmm(26)));
        assert_eq!(b, [0x62, 0x82, 0x66, 0x48, 0x52, 0xE2]);
        assert_eq!(l.trim(), "vdpbf16ps zmm20, zmm3, zmm26");
        let (b, l) = bytes_of(|a| a.vpermi2b_zmm(Zmm(1), Zmm(4), Zmm(30)));
        assert_eq!(b, [0x62, 0x92, 0x5D, 0x48, 0x75, 0xCE]);
        assert_eq!(l.trim(), "vpermi2b zmm1, zmm4, zmm30");
        let (b, _) = bytes_of(|a| a.vpermi2b_zmm_mem(Zmm(1), Zmm(6), mem(RSP, 1536)));
        assert_eq!(b, [0x62, 0xF2, 0x4D, 0x48, 0x75, 0x4C, 0x24, 0x18]);
        let (b, _) = bytes_of(|a| a.kmovq_from_gp(Kreg(1), RAX));
        assert_eq!(b, [0xC4, 0xE1, 0xFB, 0x92, 0xC8]);
        let (b, _) = bytes_of(|a| a.kmovq_from_gp(Kreg(4), R11));
        assert_eq!(b, [0xC4, 0xC1, 0xFB, 0x92, 0xE3]);
        let (b, _) = bytes_of(|a| a.vinsertf64x4_hi_mem(Zmm(8), Zmm(8), mem(RDX, 288)));
        assert_eq!(b, [0x62, 0x73, 0xBD, 0x48, 0x1A, 0x42, 0x09, 0x01]);
        let (b, _) = bytes_of(|a| a.vextractf64x4_hi_store(mem(RDX, 320), Zmm(20)));
        assert_eq!(b, [0x62, 0xE3, 0xFD, 0x48, 0x1B, 0x62, 0x0A, 0x01]);
        let (b, _) = bytes_of(|a| a.vpermw_ymm(Ymm(2), Ymm(15), Ymm(2)));
        assert_eq!(b, [0x62, 0xF2, 0x85, 0x28, 0x8D, 0xD2]);
        let (b, l) = bytes_of(|a| a.vmovdqu8_zmm_load_masked(Zmm(0), Kreg(3), true, mem(RAX, 32)));
        assert_eq!(
            b,
            [0x62, 0xF1, 0x7F, 0xCB, 0x6F, 0x80, 0x20, 0x00, 0x00, 0x00]
        );
        assert_eq!(l.trim(), "vmovdqu8 zmm0 {k3} {z}, zmmword ptr [rax + 32]");
    }

    /// The f16 P·V's instructions, bytes from llvm-mc 14 and 19.
    #[test]
    fn f16_pv_encodings() {
        let (b, l) = bytes_of(|a| a.vcvtph2ps_ymm_evex(Ymm(0), Ymm(17)));
        assert_eq!(b, [0x62, 0xB2, 0x7D, 0x28, 0x13, 0xC1]);
        assert_eq!(l.trim(), "vcvtph2ps ymm0, xmm17");
        let (b, l) = bytes_of(|a| a.vfmadd231ph_zmm_bcst(Zmm(17), Zmm(0), mem(RSI, 4)));
        assert_eq!(b, [0x62, 0xE6, 0x7D, 0x58, 0xB8, 0x4E, 0x02]);
        assert_eq!(
            l.trim(),
            "vfmadd231ph zmm17, zmm0, word ptr [rsi + 4]{1to32}"
        );
        let (b, _) = bytes_of(|a| a.vmulph_zmm_bcst(Zmm(0), Zmm(0), mem(RSP, 2)));
        assert_eq!(b, [0x62, 0xF5, 0x7C, 0x58, 0x59, 0x44, 0x24, 0x01]);
        let (b, l) = bytes_of(|a| a.vpmovsxbw_zmm_load_masked(Zmm(0), Kreg(1), mem(RAX, 32)));
        assert_eq!(b, [0x62, 0xF2, 0x7D, 0xC9, 0x20, 0x40, 0x01]);
        assert_eq!(l.trim(), "vpmovsxbw zmm0 {k1} {z}, ymmword ptr [rax + 32]");
        let (b, _) = bytes_of(|a| a.vpmovsxbw_zmm_load_masked(Zmm(0), Kreg(0), mem(RAX, 64)));
        assert_eq!(b, [0x62, 0xF2, 0x7D, 0x48, 0x20, 0x40, 0x02]);
        // The zmm exponentials' instructions (bytes from llvm-mc 19).
        let (b, l) = bytes_of(|a| a.vmaxps_zmm_bcst(Zmm(17), Zmm(17), mem(RSP, 640)));
        assert_eq!(
            b,
            [
                0x62, 0xE1, 0x74, 0x50, 0x5F, 0x8C, 0x24, 0x80, 0x02, 0x00, 0x00
            ]
        );
        assert_eq!(
            l.trim(),
            "vmaxps zmm17, zmm17, dword ptr [rsp + 640]{1to16}"
        );
        let (b, _) = bytes_of(|a| a.vminps_zmm_bcst(Zmm(1), Zmm(2), mem(RSP, 672)));
        assert_eq!(
            b,
            [
                0x62, 0xF1, 0x6C, 0x58, 0x5D, 0x8C, 0x24, 0xA0, 0x02, 0x00, 0x00
            ]
        );
        let (b, _) = bytes_of(|a| a.vcvtps2dq_zmm(Zmm(18), Zmm(17)));
        assert_eq!(b, [0x62, 0xA1, 0x7D, 0x48, 0x5B, 0xD1]);
        let (b, _) = bytes_of(|a| a.vfmadd213ps_zmm_bcst(Zmm(2), Zmm(17), mem(RSP, 832)));
        assert_eq!(
            b,
            [
                0x62, 0xF2, 0x75, 0x50, 0xA8, 0x94, 0x24, 0x40, 0x03, 0x00, 0x00
            ]
        );
        let (b, _) = bytes_of(|a| a.vmulps_zmm(Zmm(2), Zmm(2), Zmm(18)));
        assert_eq!(b, [0x62, 0xB1, 0x6C, 0x48, 0x59, 0xD2]);
        let (b, l) = bytes_of(|a| a.vcvtph2ps_zmm_load_masked(Zmm(17), Kreg(2), mem(RSI, 32)));
        assert_eq!(b, [0x62, 0xE2, 0x7D, 0xCA, 0x13, 0x4E, 0x01]);
        assert_eq!(l.trim(), "vcvtph2ps zmm17 {k2} {z}, ymmword ptr [rsi + 32]");
        let (b, _) = bytes_of(|a| a.vpmovsxbw_zmm_load_masked(Zmm(0), Kreg(0), mem(RAX, 64)));
        assert_eq!(b, [0x62, 0xF2, 0x7D, 0x48, 0x20, 0x40, 0x02]);
        let (b, _) = bytes_of(|a| a.vmovdqu16_zmm_load_masked(Zmm(0), Kreg(1), mem(RAX, 128)));
        assert_eq!(b, [0x62, 0xF1, 0xFF, 0xC9, 0x6F, 0x40, 0x02]);
        let (b, _) = bytes_of(|a| a.vmovdqu16_zmm_load_masked(Zmm(0), Kreg(0), mem(RAX, 64)));
        assert_eq!(b, [0x62, 0xF1, 0xFF, 0x48, 0x6F, 0x40, 0x01]);
        let (b, _) = bytes_of(|a| a.vpsllw_zmm_imm(Zmm(0), Zmm(0), 7));
        assert_eq!(b, [0x62, 0xF1, 0x7D, 0x48, 0x71, 0xF0, 0x07]);
        let (b, l) = bytes_of(|a| a.vextracti32x4_zmm(Ymm(0), Zmm(17), 3));
        assert_eq!(b, [0x62, 0xE3, 0x7D, 0x48, 0x39, 0xC8, 0x03]);
        assert_eq!(l.trim(), "vextracti32x4 xmm0, zmm17, 3");
        let (b, _) = bytes_of(|a| a.vextracti32x4_zmm(Ymm(0), Zmm(5), 1));
        assert_eq!(b, [0x62, 0xF3, 0x7D, 0x48, 0x39, 0xE8, 0x01]);
        let (b, _) = bytes_of(|a| a.kmovd_from_gp(Kreg(1), RAX));
        assert_eq!(b, [0xC5, 0xFB, 0x92, 0xC8]);
        let (b, _) = bytes_of(|a| a.kmovd_from_gp(Kreg(1), R11));
        assert_eq!(b, [0xC4, 0xC1, 0x7B, 0x92, 0xCB]);
    }

    /// The zmm score loop's instructions, bytes from llvm-mc 19.
    #[test]
    fn zmm_score_encodings() {
        let (b, l) = bytes_of(|a| a.vpdpwssd_zmm(Zmm(3), Zmm(16), Zmm(18)));
        assert_eq!(b, [0x62, 0xB2, 0x7D, 0x40, 0x52, 0xDA]);
        assert_eq!(l.trim(), "vpdpwssd zmm3, zmm16, zmm18");
        let (b, _) = bytes_of(|a| a.vpunpcklqdq_zmm(Zmm(19), Zmm(0), Zmm(2)));
        assert_eq!(b, [0x62, 0xE1, 0xFD, 0x48, 0x6C, 0xDA]);
        let (b, _) = bytes_of(|a| a.vpunpckhqdq_zmm(Zmm(2), Zmm(0), Zmm(2)));
        assert_eq!(b, [0x62, 0xF1, 0xFD, 0x48, 0x6D, 0xD2]);
        let (b, l) = bytes_of(|a| a.vshufps_zmm(Zmm(19), Zmm(0), Zmm(1), 0x88));
        assert_eq!(b, [0x62, 0xE1, 0x7C, 0x48, 0xC6, 0xD9, 0x88]);
        assert_eq!(l.trim(), "vshufps zmm19, zmm0, zmm1, 136");
        let (b, l) = bytes_of(|a| a.vextracti64x4_hi(Ymm(6), Zmm(0)));
        assert_eq!(b, [0x62, 0xF3, 0xFD, 0x48, 0x3B, 0xC6, 0x01]);
        assert_eq!(l.trim(), "vextracti64x4 ymm6, zmm0, 1");
    }

    #[test]
    fn displacements_that_do_not_scale_take_four_bytes() {
        let (b, _) = bytes_of(|a| a.vmovups_zmm_load(Zmm(0), mem(RAX, 4)));
        assert_eq!(b, [0x62, 0xF1, 0x7C, 0x48, 0x10, 0x80, 4, 0, 0, 0]);
        let (b, _) = bytes_of(|a| a.vmovups_zmm_load(Zmm(0), mem(RBP, 0)));
        assert_eq!(b, [0x62, 0xF1, 0x7C, 0x48, 0x10, 0x45, 0x00]);
    }
}
