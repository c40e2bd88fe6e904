//! The AVX-512 W4A8 path: its EVEX integer encodings byte-for-byte against
//! llvm-mc, the kernel's listing against its bytes, the routing of W4A8
//! kernels on `x86-avx512` tiles, and the kernel against the reference
//! interpreter (tails in m, n and k, a partial last group, g8 to g128,
//! u4asym, u4sym and i8sym with f32 and f16 parameters — ggml's Q4_0,
//! Q4_1 and Q8_0 —,
//! bias and relu, every variant, 1 and 2 threads). Kernel runs print
//! `SKIP: no avx512vnni` on hosts without AVX512-VNNI.

#![cfg(target_arch = "x86_64")]

use tessera_codegen::artifact::Variant;
use tessera_codegen::target::TargetCaps;
use tessera_codegen::tile::{Problem, TileConfig, feasible, solve};
use tessera_codegen::x86::asm::*;
use tessera_codegen::x86::avx512_int8::{self, Avx512Int8Spec};
use tessera_codegen::x86::evex::{Kreg, Zmm};
use tessera_codegen::x86::int8::ZeroPoint;
use tessera_codegen::x86::{AVX512_NAME, X86Backend, host_has_avx512_vnni};
use tessera_dsl::ir::ParamType;
use tessera_dsl::ir::{Activation, Format, Group, Kernel};
use tessera_dsl::library;
use tessera_tests::llvm_mc::evex_sweep::{BASES, DISPS, ZMMS};
use tessera_tests::llvm_mc::{McError, assert_x86_encodings, check_x86, x86_case};
use tessera_tests::reference::check_host_matmul;

const MATTR: &str = "+avx512f,+avx512vl,+avx512bw,+avx512vnni";

// ---- the encoder against llvm-mc ------------------------------------------

#[test]
fn int_evex_encodings_match_llvm_mc_byte_for_byte() {
    let mut cases: Vec<(String, Vec<u8>)> = Vec::new();
    let mut add = |f: &dyn Fn(&mut X86Asm)| cases.push(x86_case(f));
    for (n, &d) in ZMMS.iter().enumerate() {
        let (d, x, y) = (Zmm(d), Zmm(ZMMS[(n + 1) % 6]), Zmm(ZMMS[(n + 3) % 6]));
        for a2 in ZMMS {
            let a2 = Zmm(a2);
            add(&|a| a.vpdpbusd_zmm(d, a2, y));
            add(&|a| a.vpandd_zmm(d, a2, x));
            add(&|a| a.vcvtdq2ps_zmm(d, a2));
            add(&|a| a.vpsrlw_zmm_imm(d, a2, 4));
            add(&|a| a.vpslld_zmm_imm(d, a2, 3));
            add(&|a| a.vpsubd_zmm(d, a2, x));
            add(&|a| a.vpaddd_zmm(d, a2, x));
            add(&|a| a.vshufi32x4_zmm(d, a2, y, 0x50));
            add(&|a| a.vcvtph2ps_zmm(d, Ymm(a2.0)));
            for k in [0, 2, 7] {
                add(&|a| a.vpsrld_zmm_imm(d, Kreg(k), a2, 4));
            }
        }
        for base in BASES {
            for disp in DISPS {
                let m = mem(base, disp);
                add(&|a| a.vpdpbusd_zmm_bcst(d, x, m));
                add(&|a| a.vpandd_zmm_bcst(d, y, m));
                add(&|a| a.vpbroadcastd_zmm_load(d, m));
                add(&|a| a.vbroadcasti32x4_zmm_load(d, m));
                add(&|a| a.vbroadcasti64x4_zmm_load(d, m));
                add(&|a| a.vmovdqu8_zmm_load(d, m));
                add(&|a| a.vmovdqu32_zmm_load(d, m));
                add(&|a| a.vcvtdq2ps_zmm_bcst(d, m));
                add(&|a| a.vmulps_zmm_bcst(d, x, m));
                add(&|a| a.vcvtph2ps_zmm_load(d, m));
                add(&|a| a.vpxord_zmm_bcst(d, x, m));
                add(&|a| a.vshufi32x4_zmm_mem(d, x, m, 0x88));
                add(&|a| a.vpermq_zmm_mem_imm(d, m, 0xD8));
            }
        }
    }
    assert!(cases.len() > 3000, "{}", cases.len());
    assert_x86_encodings(&cases, MATTR);
}

// ---- tiles and routing -----------------------------------------------------

fn avx512_caps() -> &'static TargetCaps {
    TargetCaps::by_name(AVX512_NAME).unwrap()
}

fn w4a8(group: u32, bias: bool, act: Activation) -> Kernel {
    w4(
        Format::U4Asym(Group::Size(group), ParamType::F32),
        bias,
        act,
    )
}

/// The W4A8 kernel with weights in `format` (4-bit), or the Q8_0 one
/// (8-bit, no pair transpose) for an `i8sym` format.
fn w4(format: Format, bias: bool, act: Activation) -> Kernel {
    let base = if matches!(format, Format::I8Sym(..)) {
        "matmul-q8_0"
    } else {
        "matmul-w4a8"
    };
    let mut k = library::get(base).unwrap();
    k.tensors.iter_mut().find(|t| t.name == "w").unwrap().format = format;
    tessera_tests::kernels::set_epilogue(&mut k, bias, act);
    k
}

/// ggml's Q4_0 (u4sym, f16 scales), Q4_1 (u4asym, f16 scales and mins)
/// and Q8_0 (i8sym, f16 scales), and the other corners of the format
/// space the kernel reads.
fn other_formats() -> [Format; 6] {
    [
        Format::U4Sym(Group::Size(32), ParamType::F16),
        Format::U4Asym(Group::Size(32), ParamType::F16),
        Format::U4Sym(Group::Size(64), ParamType::F32),
        Format::U4Asym(Group::Size(128), ParamType::F16),
        Format::I8Sym(Group::Size(32), ParamType::F16),
        Format::I8Sym(Group::Size(128), ParamType::F32),
    ]
}

fn best(kernel: &Kernel) -> TileConfig {
    let caps = avx512_caps();
    let p = Problem::from_kernel(caps, kernel).unwrap();
    solve(caps, &p).unwrap()[0]
}

/// Feasible x86-avx512 tiles (hp a multiple of 16); the kernel holds them
/// all (2·ep·hp/16 + hp/16 + 1 ≤ 32 zmm, checked).
fn kernel_tiles(kernel: &Kernel) -> Vec<TileConfig> {
    let caps = avx512_caps();
    let p = Problem::from_kernel(caps, kernel).unwrap();
    feasible(caps, &p)
        .unwrap()
        .into_iter()
        .filter(|t| {
            assert!(
                avx512_int8::zmm_needed(t.ep as usize, t.hp as usize / 16) <= 32,
                "{}",
                t.summary()
            );
            t.hp % 16 == 0
        })
        .collect()
}

const AVX512: X86Backend = X86Backend {
    vnni: false,
    avx512: true,
    avx512_vnni: false,
    avx512_bf16: false,
    avx512_fp16: false,
    amx: false,
    int8_keys_in_lanes: false,
    int8_q_in_lanes: false,
    int8_prefetch: tessera_codegen::x86::WeightPrefetch::INT8,
    float_prefetch: tessera_codegen::x86::WeightPrefetch::FLOAT,
};

#[test]
fn w4a8_routes_to_the_avx512_int8_kernel_on_avx512_tiles() {
    let kernel = w4a8(32, true, Activation::None);
    let t = best(&kernel);
    assert_eq!((t.ep, t.hp, t.lp), (15, 16, 4), "{}", t.summary());
    let acc = t.accounting;
    assert_eq!((acc.group_sums, acc.reserved, acc.total), (15, 0, 32));
    let code = AVX512.emit_code(&kernel, &t).unwrap();
    assert!(code.listing.contains("matmul avx512"), "{}", code.listing);
    assert!(code.listing.contains("vpdpbusd zmm"));
    let q = AVX512.emit_quantizer(&kernel, &t).unwrap().unwrap();
    assert!(q.listing.contains("[e/15, l/4, 15, 4]"), "{}", q.listing);
    // An x86-avx2 tile keeps the AVX2 kernel.
    let avx2 = tessera_codegen::x86::plan::target();
    let p2 = Problem::from_kernel(avx2, &kernel).unwrap();
    let t2 = solve(avx2, &p2).unwrap()[0];
    let code = AVX512.emit_code(&kernel, &t2).unwrap();
    assert!(!code.listing.contains("avx512"));
    // The backend asks for avx512 tiles for W4A8 with avx512 and vnni on,
    // whatever the host.
    let both = X86Backend {
        vnni: true,
        avx512: true,
        avx512_vnni: true,
        ..X86Backend::default()
    };
    assert_eq!(both.target(&kernel, Variant::Gemm).name, AVX512_NAME);
    assert_eq!(AVX512.target(&kernel, Variant::Gemm).name, "x86-avx2");
    assert_eq!(
        X86Backend::default().target(&kernel, Variant::Gemm).name,
        "x86-avx2"
    );
    assert_eq!(
        both.target(&library::get("matmul-w8a8").unwrap(), Variant::Gemm)
            .name,
        "x86-avx2"
    );
    // Every tile the kernel holds emits and checks against the solver.
    let tiles = kernel_tiles(&kernel);
    assert!(tiles.len() > 5, "{}", tiles.len());
    for tile in &tiles {
        AVX512
            .emit_code(&kernel, tile)
            .unwrap_or_else(|e| panic!("{}: {e}", tile.summary()));
    }
}

#[test]
fn bad_specs_are_named() {
    let spec = |ep, zb, group| Avx512Int8Spec {
        ep,
        zb,
        group,
        zero: ZeroPoint::Offset,
        params: ParamType::F32,
        bias: false,
        activation: Activation::None,
    };
    let e = avx512_int8::emit(&spec(16, 1, 32)).unwrap_err().to_string();
    assert!(e.contains("zmm"), "{e}");
    let e = avx512_int8::emit(&spec(1, 0, 32)).unwrap_err().to_string();
    assert!(e.contains("multiple of 16"), "{e}");
    let e = avx512_int8::emit(&spec(2, 8, 32)).unwrap_err().to_string();
    assert!(e.contains("zmm"), "{e}");
    for group in [4, 48, 256] {
        let e = avx512_int8::emit(&spec(2, 1, group))
            .unwrap_err()
            .to_string();
        assert!(e.contains("group"), "{e}");
    }
    let e = avx512_int8::emit(&Avx512Int8Spec {
        zero: ZeroPoint::None,
        ..spec(2, 1, 32)
    })
    .unwrap_err()
    .to_string();
    assert!(e.contains("i8sym"), "{e}");
    // Per-row W8A8 has no AVX-512 kernel: its GEMM stays on AVX2.
    let both = X86Backend {
        avx512: true,
        avx512_vnni: true,
        ..X86Backend::default()
    };
    let w8a8 = library::get("matmul-w8a8").unwrap();
    assert_eq!(both.target(&w8a8, Variant::Gemm).name, "x86-avx2");
    // f16 output is refused by name on the avx512 path.
    let mut k = w4a8(32, true, Activation::None);
    k.tensors.iter_mut().find(|t| t.name == "y").unwrap().format = Format::F16;
    let e = AVX512.emit_code(&k, &best(&k)).unwrap_err().to_string();
    assert!(e.contains("f32"), "{e}");
}

#[test]
fn listings_match_their_bytes() {
    let kernels = [
        w4a8(32, true, Activation::Relu),
        w4a8(8, false, Activation::None),
        w4a8(16, true, Activation::None),
    ]
    .into_iter()
    .chain(other_formats().map(|f| w4(f, true, Activation::None)));
    for kernel in kernels {
        for tile in kernel_tiles(&kernel)
            .iter()
            .filter(|t| [1, 7, 15].contains(&t.ep))
        {
            for v in Variant::ALL {
                let code = AVX512.emit_code_variant(&kernel, tile, v).unwrap();
                match check_x86(&code.listing, &code.bytes, MATTR) {
                    Ok(()) => {}
                    Err(McError::Missing) => {
                        eprintln!("SKIP: llvm-mc not installed");
                        return;
                    }
                    Err(McError::Failed(why)) => panic!("{} {v}: {why}", tile.summary()),
                }
            }
        }
    }
}

// ---- the kernel against the reference interpreter ------------------------

fn can_run() -> bool {
    if !host_has_avx512_vnni() {
        eprintln!("SKIP: no avx512vnni");
        return false;
    }
    true
}

/// Run on random data with (m, n, k) and compare with the interpreter.
fn check(kernel: &Kernel, tile: &TileConfig, variant: Variant, shapes: &[(usize, usize, usize)]) {
    let hm = AVX512
        .load_variant(kernel, tile, variant)
        .unwrap_or_else(|e| panic!("{variant} {}: {e}", tile.summary()));
    let what = format!("{variant} tile {}x{}", tile.ep, tile.hp);
    check_host_matmul(&hm, kernel, &what, shapes, 9);
}

fn shapes() -> Vec<(usize, usize, usize)> {
    let mut v = Vec::new();
    for m in [1, 2, 13, 14, 15, 29] {
        for n in [16, 9, 17, 40, 64] {
            for k in [1, 7, 31, 32, 33, 100, 257] {
                v.push((m, n, k));
            }
        }
    }
    v
}

#[test]
fn best_tile_every_variant_against_the_interpreter() {
    if !can_run() {
        return;
    }
    let kernel = w4a8(32, true, Activation::None);
    let tile = best(&kernel);
    for v in Variant::ALL {
        check(&kernel, &tile, v, &shapes());
    }
}

/// K past the stack's panel buffer (the multi-row loop then unpacks in the
/// loop) and just within it.
#[test]
fn long_k_with_and_without_the_panel_buffer() {
    if !can_run() {
        return;
    }
    let kernel = w4a8(32, true, Activation::Relu);
    let tile = best(&kernel);
    let per_step = 64 * tile.hp as usize / 16;
    let k_max = avx512_int8::PANEL_BUFFER_BYTES as usize / per_step * 4;
    check(
        &kernel,
        &tile,
        Variant::Gemm,
        &[(17, 17, k_max), (16, 33, k_max + 1), (2, 16, k_max + 40)],
    );
}

#[test]
fn groups_epilogues_and_tiles_against_the_interpreter() {
    if !can_run() {
        return;
    }
    let few = [
        (1, 9, 33),
        (3, 40, 7),
        (7, 17, 257),
        (15, 48, 100),
        (2, 16, 1),
    ];
    for (group, bias, act) in [
        (8, false, Activation::Relu),
        (16, true, Activation::Relu),
        (32, false, Activation::None),
    ] {
        let kernel = w4a8(group, bias, act);
        for tile in kernel_tiles(&kernel) {
            check(&kernel, &tile, Variant::Gemm, &few);
        }
    }
}

/// Q4_0, Q4_1 and the long groups: every variant of the best tile on the
/// full shape set (partial last groups: k 7, 33, 100, 257 against g32–g128),
/// and a few tiles of each.
#[test]
fn q4_formats_and_long_groups_against_the_interpreter() {
    if !can_run() {
        return;
    }
    for (n, format) in other_formats().into_iter().enumerate() {
        let kernel = w4(
            format,
            n % 2 == 0,
            [Activation::None, Activation::Relu][n / 2 % 2],
        );
        let tile = best(&kernel);
        for v in Variant::ALL {
            check(&kernel, &tile, v, &shapes());
        }
        for tile in kernel_tiles(&kernel)
            .iter()
            .filter(|t| [2, 7].contains(&t.ep))
        {
            check(
                &kernel,
                tile,
                Variant::Gemm,
                &[(3, 40, 300), (7, 17, 129), (9, 48, 64)],
            );
        }
    }
}

/// The library's ggml kernels themselves (their own packing and
/// parameter layout) on the AVX-512 path.
#[test]
fn library_ggml_formats_on_avx512_tiles() {
    if !can_run() {
        return;
    }
    for name in ["matmul-q4_0", "matmul-q4_1", "matmul-q8_0"] {
        let kernel = library::get(name).unwrap();
        let both = X86Backend {
            avx512: true,
            avx512_vnni: true,
            ..X86Backend::default()
        };
        assert_eq!(both.target(&kernel, Variant::Gemm).name, AVX512_NAME);
        let tile = best(&kernel);
        let code = AVX512.emit_code(&kernel, &tile).unwrap();
        assert!(code.listing.contains("matmul avx512"), "{name}");
        check(
            &kernel,
            &tile,
            Variant::Gemm,
            &[(17, 40, 96), (1, 9, 33), (30, 64, 257)],
        );
    }
}

/// The unpack's channel order in listings (review with `cargo insta
/// review`): the zmm GEMVs of Q4_0 and Q4_1 at 1 × 64, two pairs of column
/// blocks from one 64-byte load each, the f16 scales (and Q4_1's offsets,
/// in a pass of their own) in the unpacked order, the totals back in
/// channel order before the store; and Q4_0's flat 8 × 16, a lone block
/// whose scales and totals are shuffled by lanes (0, 2, 1, 3).
#[test]
fn unpack_order_listings() {
    for (name, ep, hp, variant) in [
        ("matmul-q4_0", 1, 64, Variant::Gemv),
        ("matmul-q4_1", 1, 64, Variant::Gemv),
        ("matmul-q4_0", 8, 16, Variant::FlatGemm),
    ] {
        let kernel = library::get(name).unwrap();
        let tile = kernel_tiles(&kernel)
            .into_iter()
            .find(|t| t.ep == ep && t.hp == hp)
            .unwrap_or_else(|| panic!("{name}: no {ep} × {hp} tile"));
        let code = AVX512.emit_code_variant(&kernel, &tile, variant).unwrap();
        insta::assert_snapshot!(format!("{name}_avx512_{ep}x{hp}x4_{variant}"), code.listing);
    }
}
