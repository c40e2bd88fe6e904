//! The instructions only the attention kernels use (the exp polynomial,
//! fp8 and int8 widening, fp16 `fmla`/`scvtf`, scalar softmax arithmetic),
//! encoded by hand through [`A64::encoded`] so the shared typed layer
//! stays the matmuls' own. Every word is checked against llvm-mc by the
//! listing byte test (`tests/tests/neon_attention.rs`).

use super::asm::{A64, V, X};

fn rd_rn_rm(base: u32, d: V, n: V, m: V) -> u32 {
    base | u32::from(m.0) << 16 | u32::from(n.0) << 5 | u32::from(d.0)
}

fn rd_rn(base: u32, d: u8, n: u8) -> u32 {
    base | u32::from(n) << 5 | u32::from(d)
}

/// Attention-only instructions on [`A64`].
pub trait AttentionAsm {
    /// `fmax vd.4s, vn.4s, vm.4s` (NaN where either lane is NaN)
    fn fmax_4s(&mut self, d: V, n: V, m: V);
    /// `fmin vd.4s, vn.4s, vm.4s` (NaN where either lane is NaN)
    fn fmin_4s(&mut self, d: V, n: V, m: V);
    fn fsub_4s(&mut self, d: V, n: V, m: V);
    fn fdiv_4s(&mut self, d: V, n: V, m: V);
    fn faddp_4s(&mut self, d: V, n: V, m: V);
    /// `faddp sd, vn.2s`
    fn faddp_s(&mut self, d: V, n: V);
    fn fsub_s(&mut self, d: V, n: V, m: V);
    fn fmul_s(&mut self, d: V, n: V, m: V);
    /// `fmadd sd, sn, sm, sa` (d = a + n·m)
    fn fmadd_s(&mut self, d: V, n: V, m: V, a: V);
    /// `fsqrt sd, sn`
    fn fsqrt_s(&mut self, d: V, n: V);
    /// `fmla vd.8h, vn.8h, vm.8h` (FEAT_FP16)
    fn fmla_8h(&mut self, d: V, n: V, m: V);
    /// `scvtf vd.8h, vn.8h` (FEAT_FP16)
    fn scvtf_8h(&mut self, d: V, n: V);
    /// `sxtl vd.8h, vn.8b`
    fn sxtl_8h(&mut self, d: V, n: V);
    /// `sxtl vd.4s, vn.4h`
    fn sxtl_4s(&mut self, d: V, n: V);
    /// `sxtl2 vd.4s, vn.8h`
    fn sxtl2_4s(&mut self, d: V, n: V);
    /// `shll vd.8h, vn.8b, #8` (each byte to the top of its halfword)
    fn shll_8h(&mut self, d: V, n: V);
    /// `sshr vd.8h, vn.8h, #1`
    fn sshr1_8h(&mut self, d: V, n: V);
    /// `mvni vd.8h, #0x40, lsl #8` (every halfword 0xbfff)
    fn mvni_bfff_8h(&mut self, d: V);
    /// `fcvtn2 vd.8h, vn.4s`
    fn fcvtn2_8h(&mut self, d: V, n: V);
    /// `scvtf sd, wn`
    fn scvtf_s_w(&mut self, d: V, n: X);
    /// `ucvtf sd, xn`
    fn ucvtf_s_x(&mut self, d: V, n: X);
    /// `ldrsb wt, [xn], #1`
    fn ldrsb_w_post1(&mut self, t: X, n: X);
    /// `ldr bt, [xn]`
    fn ldr_b(&mut self, t: V, n: X);
    /// `ldr ht, [xn]`
    fn ldr_h(&mut self, t: V, n: X);
    /// `fmov dd, xn`
    fn fmov_d_x(&mut self, d: V, n: X);
    /// `fcvt dd, sn`
    fn fcvt_d_s(&mut self, d: V, n: V);
    /// `fcvt sd, dn`
    fn fcvt_s_d(&mut self, d: V, n: V);
    /// `fcvt dd, hn`
    fn fcvt_d_h(&mut self, d: V, n: V);
    fn fsub_d(&mut self, d: V, n: V, m: V);
    fn fdiv_d(&mut self, d: V, n: V, m: V);
    /// `fmadd dd, dn, dm, da` (d = a + n·m, one rounding)
    fn fmadd_d(&mut self, d: V, n: V, m: V, a: V);
    /// `fcvtns xd, dn` (round to nearest, ties to even)
    fn fcvtns_x_d(&mut self, d: X, n: V);
    /// `fcvtns wd, sn`
    fn fcvtns_w_s(&mut self, d: X, n: V);
    fn fminnm_s(&mut self, d: V, n: V, m: V);
    /// `ldrh wt, [xn], #2`
    fn ldrh_post2(&mut self, t: X, n: X);
    /// `strh wt, [xn], #2`
    fn strh_post2(&mut self, t: X, n: X);
    /// `strb wt, [xn], #1`
    fn strb_post1(&mut self, t: X, n: X);
    /// `and xd, xn, xm`
    fn and(&mut self, d: X, n: X, m: X);
    /// `orr xd, xn, xm`
    fn orr(&mut self, d: X, n: X, m: X);
    /// `fcmgt vd.4s, vn.4s, vm.4s` (all ones where n > m, ordered)
    fn fcmgt_4s(&mut self, d: V, n: V, m: V);
    /// `bit vd.16b, vn.16b, vm.16b`: n's bits into d where m's are set
    fn bit_16b(&mut self, d: V, n: V, m: V);
    /// `bic vd.16b, vn.16b, vm.16b`: n with m's bits cleared
    fn bic_16b(&mut self, d: V, n: V, m: V);
    /// `st1 {vt.s}[lane], [xn], xm` (post-index by a register)
    fn st1_s_lane_post(&mut self, t: V, lane: u32, n: X, m: X);
}

impl AttentionAsm for A64 {
    fn fmax_4s(&mut self, d: V, n: V, m: V) {
        let w = rd_rn_rm(0x4E20_F400, d, n, m);
        self.encoded(format!("fmax {d}.4s, {n}.4s, {m}.4s"), w);
    }

    fn fmin_4s(&mut self, d: V, n: V, m: V) {
        let w = rd_rn_rm(0x4EA0_F400, d, n, m);
        self.encoded(format!("fmin {d}.4s, {n}.4s, {m}.4s"), w);
    }

    fn fsub_4s(&mut self, d: V, n: V, m: V) {
        let w = rd_rn_rm(0x4EA0_D400, d, n, m);
        self.encoded(format!("fsub {d}.4s, {n}.4s, {m}.4s"), w);
    }

    fn fdiv_4s(&mut self, d: V, n: V, m: V) {
        let w = rd_rn_rm(0x6E20_FC00, d, n, m);
        self.encoded(format!("fdiv {d}.4s, {n}.4s, {m}.4s"), w);
    }

    fn faddp_4s(&mut self, d: V, n: V, m: V) {
        let w = rd_rn_rm(0x6E20_D400, d, n, m);
        self.encoded(format!("faddp {d}.4s, {n}.4s, {m}.4s"), w);
    }

    fn faddp_s(&mut self, d: V, n: V) {
        let w = rd_rn(0x7E30_D800, d.0, n.0);
        self.encoded(format!("faddp s{}, {n}.2s", d.0), w);
    }

    fn fsub_s(&mut self, d: V, n: V, m: V) {
        let w = rd_rn_rm(0x1E20_3800, d, n, m);
        self.encoded(format!("fsub s{}, s{}, s{}", d.0, n.0, m.0), w);
    }

    fn fmul_s(&mut self, d: V, n: V, m: V) {
        let w = rd_rn_rm(0x1E20_0800, d, n, m);
        self.encoded(format!("fmul s{}, s{}, s{}", d.0, n.0, m.0), w);
    }

    fn fmadd_s(&mut self, d: V, n: V, m: V, a: V) {
        let w = rd_rn_rm(0x1F00_0000, d, n, m) | u32::from(a.0) << 10;
        self.encoded(format!("fmadd s{}, s{}, s{}, s{}", d.0, n.0, m.0, a.0), w);
    }

    fn fsqrt_s(&mut self, d: V, n: V) {
        let w = rd_rn(0x1E21_C000, d.0, n.0);
        self.encoded(format!("fsqrt s{}, s{}", d.0, n.0), w);
    }

    fn fmla_8h(&mut self, d: V, n: V, m: V) {
        let w = rd_rn_rm(0x4E40_0C00, d, n, m);
        self.encoded(format!("fmla {d}.8h, {n}.8h, {m}.8h"), w);
    }

    fn scvtf_8h(&mut self, d: V, n: V) {
        let w = rd_rn(0x4E79_D800, d.0, n.0);
        self.encoded(format!("scvtf {d}.8h, {n}.8h"), w);
    }

    fn sxtl_8h(&mut self, d: V, n: V) {
        let w = rd_rn(0x0F08_A400, d.0, n.0);
        self.encoded(format!("sxtl {d}.8h, {n}.8b"), w);
    }

    fn sxtl_4s(&mut self, d: V, n: V) {
        let w = rd_rn(0x0F10_A400, d.0, n.0);
        self.encoded(format!("sxtl {d}.4s, {n}.4h"), w);
    }

    fn sxtl2_4s(&mut self, d: V, n: V) {
        let w = rd_rn(0x4F10_A400, d.0, n.0);
        self.encoded(format!("sxtl2 {d}.4s, {n}.8h"), w);
    }

    fn shll_8h(&mut self, d: V, n: V) {
        let w = rd_rn(0x2E21_3800, d.0, n.0);
        self.encoded(format!("shll {d}.8h, {n}.8b, #8"), w);
    }

    fn sshr1_8h(&mut self, d: V, n: V) {
        let w = rd_rn(0x4F1F_0400, d.0, n.0);
        self.encoded(format!("sshr {d}.8h, {n}.8h, #1"), w);
    }

    fn mvni_bfff_8h(&mut self, d: V) {
        let w = 0x6F02_A400 | u32::from(d.0);
        self.encoded(format!("mvni {d}.8h, #0x40, lsl #8"), w);
    }

    fn fcvtn2_8h(&mut self, d: V, n: V) {
        let w = rd_rn(0x4E21_6800, d.0, n.0);
        self.encoded(format!("fcvtn2 {d}.8h, {n}.4s"), w);
    }

    fn scvtf_s_w(&mut self, d: V, n: X) {
        let w = rd_rn(0x1E22_0000, d.0, n.0);
        self.encoded(format!("scvtf s{}, {}", d.0, n.w()), w);
    }

    fn ucvtf_s_x(&mut self, d: V, n: X) {
        let w = rd_rn(0x9E23_0000, d.0, n.0);
        self.encoded(format!("ucvtf s{}, {n}", d.0), w);
    }

    fn ldrsb_w_post1(&mut self, t: X, n: X) {
        assert_ne!(t, n, "ldrsb with writeback: base and target must differ");
        let w = rd_rn(0x38C0_1400, t.0, n.0);
        self.encoded(format!("ldrsb {}, [{n}], #1", t.w()), w);
    }

    fn ldr_b(&mut self, t: V, n: X) {
        let w = rd_rn(0x3D40_0000, t.0, n.0);
        self.encoded(format!("ldr b{}, [{n}]", t.0), w);
    }

    fn ldr_h(&mut self, t: V, n: X) {
        let w = rd_rn(0x7D40_0000, t.0, n.0);
        self.encoded(format!("ldr h{}, [{n}]", t.0), w);
    }

    fn fmov_d_x(&mut self, d: V, n: X) {
        let w = rd_rn(0x9E67_0000, d.0, n.0);
        self.encoded(format!("fmov d{}, {n}", d.0), w);
    }

    fn fcvt_d_s(&mut self, d: V, n: V) {
        let w = rd_rn(0x1E22_C000, d.0, n.0);
        self.encoded(format!("fcvt d{}, s{}", d.0, n.0), w);
    }

    fn fcvt_s_d(&mut self, d: V, n: V) {
        let w = rd_rn(0x1E62_4000, d.0, n.0);
        self.encoded(format!("fcvt s{}, d{}", d.0, n.0), w);
    }

    fn fcvt_d_h(&mut self, d: V, n: V) {
        let w = rd_rn(0x1EE2_C000, d.0, n.0);
        self.encoded(format!("fcvt d{}, h{}", d.0, n.0), w);
    }

    fn fsub_d(&mut self, d: V, n: V, m: V) {
        let w = rd_rn_rm(0x1E60_3800, d, n, m);
        self.encoded(format!("fsub d{}, d{}, d{}", d.0, n.0, m.0), w);
    }

    fn fdiv_d(&mut self, d: V, n: V, m: V) {
        let w = rd_rn_rm(0x1E60_1800, d, n, m);
        self.encoded(format!("fdiv d{}, d{}, d{}", d.0, n.0, m.0), w);
    }

    fn fmadd_d(&mut self, d: V, n: V, m: V, a: V) {
        let w = rd_rn_rm(0x1F40_0000, d, n, m) | u32::from(a.0) << 10;
        self.encoded(format!("fmadd d{}, d{}, d{}, d{}", d.0, n.0, m.0, a.0), w);
    }

    fn fcvtns_x_d(&mut self, d: X, n: V) {
        let w = rd_rn(0x9E60_0000, d.0, n.0);
        self.encoded(format!("fcvtns {d}, d{}", n.0), w);
    }

    fn fcvtns_w_s(&mut self, d: X, n: V) {
        let w = rd_rn(0x1E20_0000, d.0, n.0);
        self.encoded(format!("fcvtns {}, s{}", d.w(), n.0), w);
    }

    fn fminnm_s(&mut self, d: V, n: V, m: V) {
        let w = rd_rn_rm(0x1E20_7800, d, n, m);
        self.encoded(format!("fminnm s{}, s{}, s{}", d.0, n.0, m.0), w);
    }

    fn ldrh_post2(&mut self, t: X, n: X) {
        assert_ne!(t, n, "ldrh with writeback: base and target must differ");
        let w = rd_rn(0x7840_2400, t.0, n.0);
        self.encoded(format!("ldrh {}, [{n}], #2", t.w()), w);
    }

    fn strh_post2(&mut self, t: X, n: X) {
        assert_ne!(t, n, "strh with writeback: base and source must differ");
        let w = rd_rn(0x7800_2400, t.0, n.0);
        self.encoded(format!("strh {}, [{n}], #2", t.w()), w);
    }

    fn strb_post1(&mut self, t: X, n: X) {
        assert_ne!(t, n, "strb with writeback: base and source must differ");
        let w = rd_rn(0x3800_1400, t.0, n.0);
        self.encoded(format!("strb {}, [{n}], #1", t.w()), w);
    }

    fn and(&mut self, d: X, n: X, m: X) {
        let w = 0x8A00_0000 | u32::from(m.0) << 16 | u32::from(n.0) << 5 | u32::from(d.0);
        self.encoded(format!("and {d}, {n}, {m}"), w);
    }

    fn orr(&mut self, d: X, n: X, m: X) {
        let w = 0xAA00_0000 | u32::from(m.0) << 16 | u32::from(n.0) << 5 | u32::from(d.0);
        self.encoded(format!("orr {d}, {n}, {m}"), w);
    }

    fn fcmgt_4s(&mut self, d: V, n: V, m: V) {
        let w = rd_rn_rm(0x6EA0_E400, d, n, m);
        self.encoded(format!("fcmgt {d}.4s, {n}.4s, {m}.4s"), w);
    }

    fn bit_16b(&mut self, d: V, n: V, m: V) {
        let w = rd_rn_rm(0x6EA0_1C00, d, n, m);
        self.encoded(format!("bit {d}.16b, {n}.16b, {m}.16b"), w);
    }

    fn bic_16b(&mut self, d: V, n: V, m: V) {
        let w = rd_rn_rm(0x4E60_1C00, d, n, m);
        self.encoded(format!("bic {d}.16b, {n}.16b, {m}.16b"), w);
    }

    fn st1_s_lane_post(&mut self, t: V, lane: u32, n: X, m: X) {
        assert!(lane < 4, "st1 lane {lane} of .s");
        let w = 0x0D80_8000
            | (lane >> 1) << 30
            | u32::from(m.0) << 16
            | (lane & 1) << 12
            | u32::from(n.0) << 5
            | u32::from(t.0);
        self.encoded(format!("st1 {{ {t}.s }}[{lane}], [{n}], {m}"), w);
    }
}
