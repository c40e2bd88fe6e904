//! AMX (Advanced Matrix Extensions) encoders: exactly the tile
//! instructions the decode attention's int8 score loop uses, since dynasm
//! 5.1 has none. Each method hands its bytes and Intel-syntax line to
//! [`X86Asm::raw`], so the listing stays the emitter's own log and the
//! llvm-mc cross-check covers them.
//!
//! Every AMX instruction is VEX-encoded in map 0F38 with L = 0 and W = 0:
//! `C4 [R̄ X̄ B̄ 00010] [0 v̄v̄v̄v̄ 0 pp] opcode modrm [sib] [disp]`. Tile loads
//! and stores address `[base + index + disp]`, the index register holding
//! the row stride (an index is required: no index means a stride of 0).
//!
//! Using AMX needs the OS's permission first ([`request_tile_data`]).

use super::asm::{Gp, X86Asm};

/// A tile register, tmm0–tmm7.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tmm(pub u8);

impl std::fmt::Display for Tmm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "tmm{}", self.0 & 7)
    }
}

/// A tile row walk `[base + stride + disp]`: row r at `base + disp + r·stride`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TileMem {
    pub base: Gp,
    pub stride: Gp,
    pub disp: i32,
}

impl std::fmt::Display for TileMem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (b, i) = (self.base, self.stride);
        match self.disp {
            0 => write!(f, "[{b} + {i}]"),
            d if d < 0 => write!(f, "[{b} + {i} - {}]", -(d as i64)),
            d => write!(f, "[{b} + {i} + {d}]"),
        }
    }
}

/// Implied prefix (VEX.pp).
const PP_NONE: u8 = 0;
const PP_F3: u8 = 2;
const PP_F2: u8 = 3;

/// The 3-byte VEX prefix of map 0F38 (L = 0, W = 0) for ModRM.reg bit 3
/// `r`, index bit 3 `x`, base / rm bit 3 `b` and the `vvvv` register.
fn vex(r: u8, x: u8, b: u8, vvvv: u8, pp: u8) -> [u8; 3] {
    let byte1 = ((!r & 1) << 7) | ((!x & 1) << 6) | ((!b & 1) << 5) | 0b00010;
    let byte2 = ((!vvvv & 15) << 3) | pp;
    [0xC4, byte1, byte2]
}

/// ModRM, SIB and displacement of `[base + index + disp]` with `reg` in
/// ModRM.reg (VEX has no compressed displacement).
fn address(reg: u8, base: Gp, index: Option<Gp>, disp: i32) -> Vec<u8> {
    let mut out = Vec::with_capacity(7);
    super::evex::modrm_address(&mut out, reg, base, index, disp, 1);
    out
}

impl X86Asm {
    fn amx(&mut self, prefix: [u8; 3], opcode: u8, rest: &[u8], line: String) {
        let mut bytes = prefix.to_vec();
        bytes.push(opcode);
        bytes.extend_from_slice(rest);
        self.raw(&bytes, line);
    }

    /// `ldtilecfg [m]`: the 64-byte tile configuration (palette, each
    /// tile's rows and bytes per row) at `base + disp`.
    pub fn ldtilecfg(&mut self, base: Gp, disp: i32) {
        let m = super::asm::mem(base, disp);
        let prefix = vex(0, 0, base.0 >> 3, 0, PP_NONE);
        self.amx(
            prefix,
            0x49,
            &address(0, base, None, disp),
            format!("ldtilecfg {m}"),
        );
    }

    /// `tilerelease`: every tile back to its initial state, so the thread
    /// leaves AMX unused (and its state out of context switches).
    pub fn tilerelease(&mut self) {
        self.amx(
            vex(0, 0, 0, 0, PP_NONE),
            0x49,
            &[0xC0],
            "tilerelease".into(),
        );
    }

    /// `tilezero dst`.
    pub fn tilezero(&mut self, dst: Tmm) {
        let modrm = 0xC0 | ((dst.0 & 7) << 3);
        self.amx(
            vex(0, 0, 0, 0, PP_F2),
            0x49,
            &[modrm],
            format!("tilezero {dst}"),
        );
    }

    /// `tileloadd dst, [m]`: the configured rows of `dst`, row r from
    /// `base + disp + r·stride`.
    pub fn tileloadd(&mut self, dst: Tmm, m: TileMem) {
        let prefix = vex(0, m.stride.0 >> 3, m.base.0 >> 3, 0, PP_F2);
        let rest = address(dst.0, m.base, Some(m.stride), m.disp);
        self.amx(prefix, 0x4B, &rest, format!("tileloadd {dst}, {m}"));
    }

    /// `tilestored [m], src`.
    pub fn tilestored(&mut self, m: TileMem, src: Tmm) {
        let prefix = vex(0, m.stride.0 >> 3, m.base.0 >> 3, 0, PP_F3);
        let rest = address(src.0, m.base, Some(m.stride), m.disp);
        self.amx(prefix, 0x4B, &rest, format!("tilestored {m}, {src}"));
    }

    /// `tdpbssd acc, a, b`: `acc[m][n] += Σ_k a[m][4k..4k+4] · b[k][4n..4n+4]`,
    /// signed bytes into i32 (AMX-INT8).
    pub fn tdpbssd(&mut self, acc: Tmm, a: Tmm, b: Tmm) {
        let modrm = 0xC0 | ((acc.0 & 7) << 3) | (a.0 & 7);
        let line = format!("tdpbssd {acc}, {a}, {b}");
        self.amx(vex(0, 0, 0, b.0 & 7, PP_F2), 0x5E, &[modrm], line);
    }
}

/// Whether this process may run AMX-INT8 code: the CPU has AMX-TILE and
/// AMX-INT8 (CPUID leaf 7) and Linux granted the tile data state
/// (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`, asked once; a
/// tile instruction without it raises SIGILL). False elsewhere.
pub fn request_tile_data() -> bool {
    static GRANTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *GRANTED.get_or_init(|| {
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        {
            const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
            const XFEATURE_XTILEDATA: libc::c_long = 18;
            let leaf7 = std::arch::x86_64::__cpuid_count(7, 0);
            let (amx_tile, amx_int8) = (leaf7.edx >> 24 & 1 == 1, leaf7.edx >> 25 & 1 == 1);
            if !(amx_tile && amx_int8) {
                return false;
            }
            // SAFETY: arch_prctl with ARCH_REQ_XCOMP_PERM takes two integer
            // arguments and only changes this process's permitted xstate.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_arch_prctl,
                    ARCH_REQ_XCOMP_PERM,
                    XFEATURE_XTILEDATA,
                )
            };
            r == 0
        }
        #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
        {
            false
        }
    })
}

#[cfg(test)]
mod tests {
    use super::super::asm::*;
    use super::*;

    /// The score loop's tile instructions, bytes from llvm-mc 19 (the
    /// sweep over registers and addresses is in the tests crate).
    #[test]
    fn known_encodings() {
        let tm = |base, stride, disp| TileMem { base, stride, disp };
        let cases: [(Vec<u8>, &[u8]); 8] = [
            (
                bytes_of(|a| a.tileloadd(Tmm(4), tm(RSI, R14, 0))).0,
                &[0xC4, 0xA2, 0x7B, 0x4B, 0x24, 0x36],
            ),
            (
                bytes_of(|a| a.tileloadd(Tmm(7), tm(R13, R11, 64))).0,
                &[0xC4, 0x82, 0x7B, 0x4B, 0x7C, 0x1D, 0x40],
            ),
            (
                bytes_of(|a| a.tileloadd(Tmm(0), tm(RSP, RAX, 4096))).0,
                &[0xC4, 0xE2, 0x7B, 0x4B, 0x84, 0x04, 0x00, 0x10, 0x00, 0x00],
            ),
            (
                bytes_of(|a| a.tdpbssd(Tmm(0), Tmm(4), Tmm(5))).0,
                &[0xC4, 0xE2, 0x53, 0x5E, 0xC4],
            ),
            (
                bytes_of(|a| a.tilestored(tm(RSP, R11, 1600), Tmm(2))).0,
                &[0xC4, 0xA2, 0x7A, 0x4B, 0x94, 0x1C, 0x40, 0x06, 0x00, 0x00],
            ),
            (
                bytes_of(|a| a.ldtilecfg(RSP, 5504)).0,
                &[0xC4, 0xE2, 0x78, 0x49, 0x84, 0x24, 0x80, 0x15, 0x00, 0x00],
            ),
            (
                bytes_of(|a| a.tilezero(Tmm(3))).0,
                &[0xC4, 0xE2, 0x7B, 0x49, 0xD8],
            ),
            (
                bytes_of(|a| a.tilerelease()).0,
                &[0xC4, 0xE2, 0x78, 0x49, 0xC0],
            ),
        ];
        for (ours, theirs) in cases {
            assert_eq!(ours, theirs);
        }
        let (_, l) = bytes_of(|a| a.tileloadd(Tmm(1), tm(RBP, R12, -8)));
        assert_eq!(l.trim(), "tileloadd tmm1, [rbp + r12 - 8]");
    }
}
