//! Every instruction of the aarch64 layer, assembled by llvm-mc from the
//! listing, must give exactly the emitter's bytes.

use tessera_codegen::neon::asm::{A64, Addr, Cond, Prefetch, V, X};
use tessera_tests::llvm_mc::{McError, check_aarch64};

const MATTR: &str = "+neon,+dotprod,+i8mm,+fullfp16";

fn check(a: A64) {
    let (bytes, listing) = a.finish().unwrap();
    match check_aarch64(&listing, &bytes, MATTR) {
        Ok(()) => {}
        Err(McError::Missing) => eprintln!("llvm-mc not installed: skipped"),
        Err(McError::Failed(e)) => panic!("{e}\n{listing}"),
    }
}

#[test]
fn every_instruction_encodes_as_llvm_mc_assembles_it() {
    let mut a = A64::new();
    let top = a.new_label();
    a.bind(top);
    let (x1, x2, x3, x9, x28) = (X(1), X(2), X(3), X(9), X(28));
    let (v0, v1, v7, v15, v16, v31) = (V(0), V(1), V(7), V(15), V(16), V(31));
    a.ldr_x(x9, x1, 88);
    a.str_x(x9, x28, 8);
    a.ldr_x_sp(x2, 32);
    a.str_x_sp(x2, 4088);
    a.push_pair(X(19), X(20));
    a.pop_pair(X(19), X(20));
    a.push_pair_d(V(8), V(9));
    a.pop_pair_d(V(8), V(9));
    a.sub_sp(16);
    a.sub_sp(5 * 4096 + 32);
    a.add_sp(5 * 4096 + 32);
    a.add_from_sp(x3, 64);
    a.mov(x3, x28);
    for v in [0u64, 7, 0x1234_5678, 0x7f80_0000, 1 << 40] {
        a.mov_imm(x2, v);
    }
    a.add_imm(x2, x3, 100);
    a.add_imm(x2, x3, 0x12345);
    a.sub_imm(x2, x3, 5);
    a.subs_imm(x2, x2, 1);
    a.add(x1, x2, x3);
    a.add_lsl(x1, x2, x3, 4);
    a.sub(x1, x2, x3);
    a.subs(x1, x2, x3);
    a.mul(x1, x2, x3);
    a.madd(x1, x2, x3, x9);
    a.udiv(x1, x2, x3);
    a.lsl_imm(x1, x2, 3);
    a.lsr_imm(x1, x2, 2);
    a.cmp(x1, x2);
    a.cmp_imm(x1, 12);
    for c in [
        Cond::Eq,
        Cond::Ne,
        Cond::Lo,
        Cond::Hs,
        Cond::Hi,
        Cond::Ls,
        Cond::Gt,
        Cond::Lt,
        Cond::Ge,
        Cond::Le,
        Cond::Vs,
    ] {
        a.csel(x1, x2, x3, c);
        a.b_cond(c, top);
    }
    a.ldr_q_post(v31, x1, 16);
    a.ldr_q(v16, x2, 32);
    a.str_q(v16, x2, 48);
    a.str_q_post(v1, x3, 16);
    a.ldp_q_post(v0, v1, x9, 32);
    a.ldp_q(v0, v1, x9, 64);
    a.stp_q(v15, v16, x9, 96);
    a.ldr_d_post(v7, x1, 8);
    a.ldr_s_post(v7, x1, 4);
    a.ldr_h_post(v7, x1, 2);
    a.ldr_d(v7, x1, 8);
    a.ldr_s(v7, x1, 12);
    a.ldr_h_off(v7, x1, 6);
    a.ldr_h_off(v31, x28, 0);
    a.str_d(v7, x1, 8);
    a.str_s(v7, x1, 12);
    a.str_d_post(v7, x1, 8);
    a.str_s_post(v7, x1, 4);
    a.str_h_post(v7, x1, 2);
    a.ld1r_4s(v1, x2);
    a.ld1r_4s_post(v1, x2, x3);
    a.ld1r_2d(v31, x2);
    a.ld1r_2s(v31, x2);
    a.ld1r_2s(v1, x28);
    a.ld1_s_lane_post(v1, 3, x2, x3);
    a.ld1_s_lane_post4(v1, 2, x2);
    a.ld1_h_lane_post2(v1, 7, x2);
    a.ld1_s_lane(v1, 1, x2);
    a.ld1_h_lane(v1, 2, x2);
    a.ld1_h_lane(v31, 7, x28);
    a.st1_d_lane1(v1, x2);
    a.zero(v31);
    a.movi_16b(v7, 15);
    a.mov_v(v1, v31);
    a.and_16b(v0, v1, v7);
    a.ushr_16b(v0, v1, 4);
    a.sdot_elem(v16, v0, v7, 3);
    a.sdot_elem(v31, v15, v31, 0);
    a.smmla(v16, v4(), v0);
    a.smmla(v31, v15, v16);
    a.smull_8b(v1, v2(), v3());
    a.smlal2_16b(v1, v2(), v3());
    a.sadalp_8h(v31, v1);
    a.addp_4s(v1, v2(), v3());
    a.add_4s(v1, v2(), v3());
    a.sub_4s(v1, v2(), v3());
    a.sub_4s(v31, v16, v0);
    a.shl_4s(v1, v2(), 3);
    a.shl_4s(v31, v16, 31);
    a.addv_4s(v1, v2());
    a.trn1_4s(v1, v1, v1);
    a.zip1_4s(v1, v2(), v31);
    a.scvtf_4s(v16, v16);
    a.fcvtns_4s(v1, v2());
    a.sqxtn_4h(v1, v2());
    a.sqxtn2_8h(v1, v2());
    a.sqxtn_8b(v1, v2());
    a.sqxtn2_16b(v1, v2());
    a.fabs_4s(v1, v2());
    a.fmaxnm_4s(v1, v2(), v3());
    a.fmaxnmv_4s(v1, v2());
    a.fmaxnm_s(v1, v2(), v3());
    a.fabs_s(v1, v2());
    a.fdiv_s(v1, v2(), v3());
    a.fadd_s(v1, v2(), v3());
    a.fcmp_s(v1, v2());
    a.fmov_s_w(v1, x9);
    a.fcvt_h_s(v1, v2());
    a.fcvt_s_h(v1, v2());
    a.dup_4s(v1, v2(), 2);
    a.fmul_4s(v1, v2(), v3());
    a.fmul_4s_elem(v1, v2(), v31, 3);
    a.fadd_4s(v1, v2(), v3());
    a.fmla_4s(v1, v2(), v3());
    a.fmla_4s_elem(v16, v2(), v31, 1);
    a.fmla_8h_elem(v16, v31, v15, 7);
    a.fcvtl_4s(v1, v2());
    a.fcvtl2_4s(v1, v2());
    a.fcvtn_4h(v1, v31);
    let end = a.new_label();
    a.cbz(x1, end);
    a.cbnz(x28, end);
    a.b(top);
    a.bind(end);
    a.ret();
    check(a);
}

fn v2() -> V {
    V(2)
}
fn v3() -> V {
    V(3)
}
fn v4() -> V {
    V(4)
}

#[test]
fn a_wrong_listing_is_caught() {
    let mut a = A64::new();
    a.add(X(1), X(2), X(3));
    let (bytes, _) = a.finish().unwrap();
    match check_aarch64("    add x1, x2, x4\n", &bytes, MATTR) {
        Err(McError::Failed(e)) => assert!(e.contains("instruction 0"), "{e}"),
        Err(McError::Missing) => eprintln!("llvm-mc not installed: skipped"),
        Ok(()) => panic!("a mismatching listing passed"),
    }
}

/// The flat loop's additions: prefetches (both ops, offsets up to the
/// field's reach), `fadd .8h`, a large `add xd, sp, #imm`, and loads at
/// offsets (`Addr::Offset` advances by what each load reads).
#[test]
fn flat_loop_instructions_encode_as_llvm_mc_assembles_them() {
    let mut a = A64::new();
    let (x3, x13) = (X(3), X(13));
    for off in [0, 8, 512, 16384, 32760] {
        a.prfm(Prefetch::Pldl1keep, x13, off);
        a.prfm(Prefetch::Pldl2strm, x13, off);
    }
    a.fadd_8h(V(8), V(9), V(31));
    a.add_from_sp(x3, 4096 + 48);
    a.add_from_sp(x3, 3 * 4096);
    let mut at = Addr::Offset(0);
    a.ldp_q_at(V(0), V(1), x13, &mut at);
    a.ldr_q_at(V(2), x13, &mut at);
    a.ldr_d_at(V(3), x13, &mut at);
    a.ldr_s_at(V(4), x13, &mut at);
    assert_eq!(at, Addr::Offset(32 + 16 + 8 + 4));
    let mut post = Addr::Post;
    a.ldp_q_at(V(0), V(1), x13, &mut post);
    a.ldr_s_at(V(4), x13, &mut post);
    assert_eq!(post, Addr::Post);
    check(a);
}

#[test]
#[should_panic(expected = "multiple of 8 below 32768")]
fn prefetch_offsets_out_of_the_field_are_refused() {
    A64::new().prfm(Prefetch::Pldl1keep, X(1), 32768);
}
