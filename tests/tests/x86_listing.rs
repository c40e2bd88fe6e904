//! The x86 instruction layer's listing means what its bytes mean.

use tessera_codegen::x86::asm::*;
use tessera_tests::llvm_mc::{McError, check_x86};

/// llvm-mc's bytes for `listing` under `features` equal `bytes`: true when
/// they do, false when llvm-mc is not installed (the caller skips the
/// rest), a panic naming `what` when they differ.
fn agrees_with_llvm_mc(listing: &str, bytes: &[u8], features: &str, what: &str) -> bool {
    match check_x86(listing, bytes, features) {
        Ok(()) => true,
        Err(McError::Missing) => {
            eprintln!("SKIP: llvm-mc not installed (scripts/test.sh installs it)");
            false
        }
        Err(McError::Failed(why)) => panic!("{what}: {why}\nlisting:\n{listing}"),
    }
}

#[test]
fn every_instruction_of_the_x86_layer_round_trips_through_llvm_mc() {
    let mut a = X86Asm::new();
    let top = a.new_label();
    a.push(R12);
    a.load64(RAX, mem(RDI, 8));
    a.store64(mem(RSP, -16), RAX);
    a.mov(RCX, RDX);
    a.mov_imm(R9, -5);
    a.lea(R10, mem(R11, 4096));
    a.bind(top);
    a.add(RAX, RCX);
    a.add_imm(RSI, 128);
    a.sub(RAX, RCX);
    a.sub_imm(R13, 1);
    a.imul(RAX, R8);
    a.imul_imm(RAX, R8, 36);
    a.shl_imm(RBX, 2);
    a.cmp(RAX, RBX);
    a.cmp_imm(RAX, 7);
    a.vmovups_load(Ymm(0), mem(RSI, 32));
    a.vmovups_store(mem(RDX, -64), Ymm(15));
    a.vmovdqu_load(Ymm(8), mem(R12, 0));
    a.vmovdqu_load128(Ymm(9), mem(R13, 16));
    a.vmaskmovps_load(Ymm(1), Ymm(2), mem(RDI, 0));
    a.vmaskmovps_store(mem(RDI, 4), Ymm(2), Ymm(3));
    a.vpbroadcastd_load(Ymm(4), mem(R8, 12));
    a.vpbroadcastw_load(Ymm(5), mem(R9, 2));
    a.vbroadcasti128_load(Ymm(6), mem(R10, 48));
    a.vcvtph2ps_load(Ymm(7), mem(RAX, 16));
    a.vcvtph2ps_load64(Ymm(9), mem(RSP, 72));
    a.vmovups_store128(mem(RSP, 88), Ymm(12));
    a.vpmovsxbw_load(Ymm(10), mem(RCX, 16));
    a.vpmovsxbd_load(Ymm(11), mem(R12, 8));
    a.vpmovsxbd_load(Ymm(2), mem(RAX, 0));
    a.vpmovsxbd_load(Ymm(3), mem(R13, 0));
    a.vpmovzxbd_load(Ymm(12), mem(RSP, 1024));
    a.vpmovzxbd_load(Ymm(4), mem(RBP, -8));
    a.vfmadd231ps_mem(Ymm(11), Ymm(12), mem(RBP, 96));
    a.vfmadd231ps(Ymm(1), Ymm(2), Ymm(3));
    a.vaddps(Ymm(1), Ymm(2), Ymm(3));
    a.vmulps(Ymm(1), Ymm(2), Ymm(3));
    a.vmaxps(Ymm(1), Ymm(2), Ymm(3));
    a.vxorps(Ymm(1), Ymm(1), Ymm(1));
    a.vpaddd(Ymm(13), Ymm(14), Ymm(15));
    a.vpand(Ymm(1), Ymm(2), Ymm(3));
    a.vpmaddubsw(Ymm(1), Ymm(2), Ymm(3));
    a.vpmaddwd(Ymm(1), Ymm(2), Ymm(3));
    a.vpsignb(Ymm(1), Ymm(2), Ymm(3));
    a.vpunpcklbw(Ymm(1), Ymm(2), Ymm(3));
    a.vpunpckhbw(Ymm(1), Ymm(2), Ymm(3));
    a.vpdpbusd(Ymm(9), Ymm(1), Ymm(12));
    a.vpdpwssd(Ymm(10), Ymm(2), Ymm(13));
    a.vpabsb(Ymm(1), Ymm(2));
    a.vcvtdq2ps(Ymm(1), Ymm(2));
    a.vcvtps2dq(Ymm(1), Ymm(2));
    a.vpsrlw_imm(Ymm(1), Ymm(2), 4);
    a.vbroadcastss_reg(Ymm(1), Ymm(2));
    a.vextractf128_hi(Ymm(1), Ymm(2));
    a.prefetcht0(mem(RSI, 512));
    a.store32_imm(mem(RSP, 8), -1);
    a.load16(RAX, mem(RSP, 64));
    a.load16(R9, mem(R10, 2));
    a.store16(mem(R12, 14), RAX);
    a.store16(mem(RDX, 0), R11);
    a.shr_imm(R14, 2);
    a.shl_imm(RAX, 1);
    a.cmp_mem(RBP, mem(RDI, 72));
    a.vaddps_mem(Ymm(1), Ymm(2), mem(RSI, 32));
    a.vmulps_mem(Ymm(3), Ymm(4), mem(R9, -32));
    a.vpmaddwd_mem(Ymm(5), Ymm(6), mem(RSP, 96));
    a.vcvtph2ps_reg(Ymm(7), Ymm(8));
    a.vcvtps2ph_store(mem(R13, 16), Ymm(9), 0);
    a.vcmpps(Ymm(5), Ymm(4), Ymm(0), 1);
    a.vpermilps_imm(Ymm(1), Ymm(0), 0x0E);
    a.vpshufd(Ymm(5), Ymm(6), 0xB1u8 as i8);
    a.vextracti128_hi(Ymm(5), Ymm(1));
    a.vmovd_store(mem(R9, 20), Ymm(5));
    a.vmovss_store(mem(RAX, 0), Ymm(2));
    a.vpaddw(Ymm(1), Ymm(2), Ymm(3));
    a.vpsrlvd(Ymm(10), Ymm(10), Ymm(11));
    a.vpackssdw(Ymm(1), Ymm(1), Ymm(1));
    a.vpacksswb(Ymm(1), Ymm(1), Ymm(1));
    a.vdivps(Ymm(2), Ymm(0), Ymm(4));
    a.vandps(Ymm(1), Ymm(1), Ymm(7));
    a.vsubps(Ymm(1), Ymm(2), Ymm(11));
    a.vminps(Ymm(9), Ymm(2), Ymm(3));
    a.vorps(Ymm(1), Ymm(12), Ymm(3));
    a.vandnps(Ymm(14), Ymm(2), Ymm(3));
    a.vpcmpgtd(Ymm(1), Ymm(2), Ymm(3));
    a.vhaddps(Ymm(8), Ymm(2), Ymm(13));
    a.vperm2f128(Ymm(1), Ymm(0), Ymm(12), 0x31);
    a.vfmadd213ps_mem(Ymm(2), Ymm(10), mem(RSP, 800));
    a.vminps_mem(Ymm(0), Ymm(9), mem(RSP, 672));
    a.vsubps_mem(Ymm(11), Ymm(1), mem(R10, 32));
    a.vpmovsxbd_load(Ymm(8), mem(RSI, 8));
    a.vpmovzxbd_load(Ymm(10), mem(R12, 16));
    a.vmovmskps(RAX, Ymm(14));
    a.vmovmskps(R11, Ymm(3));
    a.vmovss_load(Ymm(12), mem(RSP, 1248));
    a.popcnt(RAX, R9);
    a.and_imm(RCX, 255);
    a.and(RAX, RDX);
    a.not(R10);
    a.zero(R12);
    a.zero(RDX);
    a.div(RCX);
    a.vcvtsi2ss(Ymm(3), R9);
    a.jcc(Cond::Ne, top);
    a.jcc(Cond::B, top);
    a.jmp(top);
    a.pop(R12);
    a.vzeroupper();
    a.ret();
    let (bytes, listing) = a.finish().expect("assembles");
    agrees_with_llvm_mc(
        &listing,
        &bytes,
        "+avx2,+fma,+f16c,+avxvnni",
        "the x86 layer",
    );
}

#[test]
fn a_listing_that_disagrees_with_its_bytes_is_caught() {
    let mut a = X86Asm::new();
    a.vfmadd231ps(Ymm(3), Ymm(14), Ymm(15));
    a.ret();
    let (bytes, listing) = a.finish().expect("assembles");
    let wrong = listing.replace("ymm15", "ymm13");
    match check_x86(&wrong, &bytes, "+avx2,+fma") {
        Err(McError::Failed(why)) => assert!(why.contains("instruction 0"), "{why}"),
        Err(McError::Missing) => eprintln!("SKIP: llvm-mc not installed"),
        Ok(()) => panic!("a wrong listing passed the cross-check"),
    }
}

#[test]
fn every_x86_attention_listing_matches_its_bytes() {
    use tessera_dsl::ir::{Op, SoftmaxMode};
    for name in ["attention-decode-f16", "attention-decode-kv8"] {
        let kernel = tessera_dsl::library::get(name).unwrap();
        let mut online = kernel.clone();
        if let Op::Attention(a) = &mut online.op {
            a.softmax = SoftmaxMode::Online;
        }
        for k in [kernel, online] {
            use tessera_codegen::x86::attention::{self, DecodeIsa, KeyDot};
            for (key_dot, ymm32, bf16_values, f16_pv) in [
                (KeyDot::Maddwd, false, false, false),
                (KeyDot::VexVnni, false, false, false),
                (KeyDot::EvexVnni, false, false, false),
                (KeyDot::EvexVnni, true, false, false),
                (KeyDot::EvexVnni, true, true, false),
                (KeyDot::EvexVnni, true, false, true),
            ] {
                for (zmm_scores, amx_scores, lane_scores, lane_int8_q) in [
                    (false, false, false, false),
                    (true, false, false, false),
                    (true, true, false, false),
                    (true, false, true, false),
                    (true, false, true, true),
                ] {
                    let blocks = tessera_codegen::artifact::PrefillBlocks::DEFAULT;
                    let isa = DecodeIsa {
                        key_dot,
                        ymm32,
                        bf16_values,
                        f16_pv,
                        zmm_scores,
                        amx_scores,
                        lane_scores,
                        lane_int8_q,
                    };
                    let code = attention::emit_for(&k, blocks, isa).unwrap();
                    if !agrees_with_llvm_mc(
                        &code.listing,
                        &code.bytes,
                        "+avx2,+fma,+f16c,+popcnt,+avxvnni,+avx512vl,+avx512vnni,+avx512bw,+avx512vbmi,+avx512bf16,+avx512fp16,+amx-tile,+amx-int8",
                        &format!("{name} {isa:?}"),
                    ) {
                        return;
                    }
                }
            }
        }
    }
    // The prefill's flash loop: ymm, and with AVX512VL its zmm scores (48-row
    // tiles in blocks of a multiple of 48 rows, else a zmm and a ymm) and
    // P·V.
    for name in ["attention-prefill-f16", "attention-prefill-kv8"] {
        let kernel = tessera_dsl::library::get(name).unwrap();
        use tessera_codegen::artifact::PrefillBlocks;
        use tessera_codegen::x86::attention::{self, DecodeIsa};
        for (ymm32, blocks) in [
            (false, PrefillBlocks::DEFAULT),
            (true, PrefillBlocks::DEFAULT),
            (
                true,
                PrefillBlocks {
                    rows: 72,
                    keys: 128,
                },
            ),
        ] {
            let isa = DecodeIsa {
                ymm32,
                ..DecodeIsa::default()
            };
            let code = attention::emit_for(&kernel, blocks, isa).unwrap();
            assert!(code.whole_prefill.is_some(), "{name}");
            if !agrees_with_llvm_mc(
                &code.listing,
                &code.bytes,
                "+avx2,+fma,+f16c,+popcnt,+avx512vl,+avx512f",
                &format!("{name} {blocks} {isa:?}"),
            ) {
                return;
            }
        }
    }
}

#[test]
fn every_emitted_x86_kernel_listing_matches_its_bytes() {
    use tessera_codegen::tile::{Problem, feasible};
    use tessera_codegen::x86::{X86Backend, plan};
    let caps = plan::target();
    for name in tessera_tests::kernels::X86_MATMULS {
        let kernel = tessera_dsl::library::get(name).unwrap();
        let problem = Problem::from_kernel(caps, &kernel).unwrap();
        for tile in feasible(caps, &problem).unwrap() {
            for backend in [
                X86Backend::default(),
                X86Backend {
                    vnni: true,
                    ..X86Backend::default()
                },
                // AVX512-VNNI's EVEX vpdpbusd on ymm (Zen 4, Ice Lake).
                X86Backend {
                    avx512_vnni: true,
                    ..X86Backend::default()
                },
            ] {
                let Ok(code) = backend.emit_code(&kernel, &tile) else {
                    continue;
                };
                let mut codes = vec![code];
                codes.extend(backend.emit_quantizer(&kernel, &tile).unwrap());
                for code in codes {
                    if !agrees_with_llvm_mc(
                        &code.listing,
                        &code.bytes,
                        "+avx2,+fma,+f16c,+avxvnni,+avx512vl,+avx512bw,+avx512vnni",
                        &format!("{name} {}", tile.summary()),
                    ) {
                        return;
                    }
                }
            }
        }
    }
}
