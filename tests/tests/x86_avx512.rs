//! The AVX-512 f32 path: the EVEX encoder byte-for-byte against llvm-mc,
//! the kernel's listing against its bytes, the kernel against plain f64
//! math (tails in m, n and k, several K blocks, bias and relu, every
//! variant, 1 and 2 threads), the solver's `x86-avx512` f32 tile and a
//! listing snapshot. Kernel runs print `SKIP: no avx512f` on hosts
//! without AVX-512F.

#![cfg(target_arch = "x86_64")]

use tessera_codegen::artifact::Variant;
use tessera_codegen::host::{HostMatmul, HostTile};
use tessera_codegen::target::TargetCaps;
use tessera_codegen::tile::{Problem, TileConfig, feasible, solve};
use tessera_codegen::x86::amx::{TileMem, Tmm};
use tessera_codegen::x86::asm::*;
use tessera_codegen::x86::avx512::{self, Avx512Spec};
use tessera_codegen::x86::evex::{Kreg, Zmm};
use tessera_codegen::x86::{AVX512_NAME, X86Backend, host_has_avx512};
use tessera_dsl::ir::{Activation, Kernel};
use tessera_dsl::library;
use tessera_tests::llvm_mc::evex_sweep::{BASES, DISPS, ZMMS};
use tessera_tests::llvm_mc::{McError, assert_x86_encodings, check_x86, x86_case};
use tessera_tests::reference::check_host_matmul;

const MATTR: &str = "+avx512f,+avx512vl,+avx512bw";

// ---- the encoder against llvm-mc ------------------------------------------

/// Every encoder method over registers 0, 7, 8, 15, 16, 31, bases rax, rsp,
/// rbp, r12, r13, r15 and small, scaled and large displacements: our bytes
/// equal llvm-mc's for the logged line.
#[test]
fn evex_encoder_matches_llvm_mc_byte_for_byte() {
    let mut cases: Vec<(String, Vec<u8>)> = Vec::new();
    let mut add = |f: &dyn Fn(&mut X86Asm)| cases.push(x86_case(f));
    for (n, &d) in ZMMS.iter().enumerate() {
        let (d, x, y) = (Zmm(d), Zmm(ZMMS[(n + 1) % 6]), Zmm(ZMMS[(n + 3) % 6]));
        for a2 in ZMMS {
            let a2 = Zmm(a2);
            add(&|a| a.vfmadd231ps_zmm(d, a2, y));
            add(&|a| a.vpxord_zmm(d, a2, x));
            add(&|a| a.vaddps_zmm(d, a2, y));
            add(&|a| a.vmaxps_zmm(d, a2, x));
        }
        for base in BASES {
            for disp in DISPS {
                let m = mem(base, disp);
                let k = Kreg(1 + (n as u8 % 7));
                add(&|a| a.vmovups_zmm_load(d, m));
                add(&|a| a.vmovups_zmm_load_masked(d, k, m));
                add(&|a| a.vmovups_zmm_store(m, d));
                add(&|a| a.vmovups_zmm_store_masked(m, k, d));
                add(&|a| a.vbroadcastss_zmm_load(d, m));
                add(&|a| a.vfmadd231ps_zmm_mem(d, x, m));
                add(&|a| a.vfmadd231ps_zmm_bcst(d, y, m));
                add(&|a| a.vaddps_zmm_mem(d, x, m));
            }
        }
    }
    for k in 1..8 {
        for g in 0..16 {
            add(&|a| a.kmovw_from_gp(Kreg(k), Gp(g)));
        }
    }
    assert!(cases.len() > 3000, "{}", cases.len());
    assert_x86_encodings(&cases, MATTR);
}

/// The AMX encoders over every tile register, bases rax, rsp, rbp, r12,
/// r13, r15, every stride register but rsp and small, scaled and large
/// displacements: our bytes equal llvm-mc's.
#[test]
fn amx_encoder_matches_llvm_mc_byte_for_byte() {
    let mut cases: Vec<(String, Vec<u8>)> = Vec::new();
    let mut add = |f: &dyn Fn(&mut X86Asm)| cases.push(x86_case(f));
    for t in 0..8 {
        let (acc, x, y) = (Tmm(t), Tmm((t + 3) % 8), Tmm((t + 5) % 8));
        add(&|a| a.tilezero(acc));
        add(&|a| a.tdpbssd(acc, x, y));
        for base in BASES {
            for stride in (0..16).map(Gp).filter(|&r| r != RSP) {
                for disp in DISPS {
                    let m = TileMem { base, stride, disp };
                    add(&|a| a.tileloadd(acc, m));
                    add(&|a| a.tilestored(m, acc));
                }
            }
        }
    }
    for base in BASES {
        for disp in DISPS {
            add(&|a| a.ldtilecfg(base, disp));
        }
    }
    add(&|a| a.tilerelease());
    assert!(cases.len() > 3000, "{}", cases.len());
    assert_x86_encodings(&cases, "+amx-tile,+amx-int8");
}

// ---- tiles -----------------------------------------------------------------

fn avx512_caps() -> &'static TargetCaps {
    TargetCaps::by_name(AVX512_NAME).unwrap()
}

fn f32_kernel(bias: bool, act: Activation) -> Kernel {
    let mut k = library::get("matmul-f32").unwrap();
    tessera_tests::kernels::set_epilogue(&mut k, bias, act);
    k
}

fn best_at(kernel: &Kernel, m: u64) -> TileConfig {
    let caps = avx512_caps();
    let p = Problem {
        e: m,
        ..Problem::from_kernel(caps, kernel).unwrap()
    };
    solve(caps, &p).unwrap()[0]
}

fn tile_at(kernel: &Kernel, ep: u32, hp: u32) -> TileConfig {
    let caps = avx512_caps();
    let p = Problem::from_kernel(caps, kernel).unwrap();
    feasible(caps, &p)
        .unwrap()
        .into_iter()
        .find(|t| (t.ep, t.hp) == (ep, hp))
        .unwrap_or_else(|| panic!("{ep}x{hp} is not a feasible x86-avx512 tile"))
}

/// The solver's x86-avx512 f32 tiles as the kernel runs them: one renamed A
/// register, hb B registers, nothing reserved; every feasible tile the
/// kernel's 14 row pointers allow emits, the others are refused by name.
#[test]
fn solver_tiles_match_the_avx512_plan() {
    let kernel = f32_kernel(true, Activation::None);
    let t = best_at(&kernel, 4096);
    assert_eq!((t.ep, t.hp, t.lp), (9, 48, 1), "{}", t.summary());
    let a = t.accounting;
    assert_eq!(
        (
            a.accumulators,
            a.a_regs,
            a.b_regs,
            a.reserved,
            a.total,
            a.budget
        ),
        (27, 1, 3, 0, 31, 32)
    );
    // The runtime's representative M: flat GEMM (8) and GEMV (1) too.
    assert_eq!((best_at(&kernel, 8).ep, best_at(&kernel, 8).hp), (8, 48));
    assert_eq!(best_at(&kernel, 1).ep, 1);
    // int8 keeps its tile (the unpack registers moved to its instruction).
    let w4a8 = library::get("matmul-w4a8").unwrap();
    let caps = avx512_caps();
    let p = Problem::from_kernel(caps, &w4a8).unwrap();
    let t8 = solve(caps, &p).unwrap()[0];
    assert_eq!(
        (t8.ep, t8.hp, t8.lp, t8.accounting.reserved),
        (15, 16, 4, 0)
    );

    let backend = X86Backend {
        avx512: true,
        ..X86Backend::default()
    };
    let p = Problem::from_kernel(caps, &kernel).unwrap();
    let mut emitted = 0;
    for tile in feasible(caps, &p).unwrap() {
        let spec = Avx512Spec::new(tile.ep as usize, tile.hp as usize, true, Activation::None);
        let result = backend.emit_code(&kernel, &tile);
        if tile.ep as usize <= avx512::MAX_ROWS {
            avx512::check_plan(&spec, &tile).unwrap();
            let code = result.unwrap_or_else(|e| panic!("{}: {e}", tile.summary()));
            assert!(code.listing.contains("matmul avx512"));
            emitted += 1;
        } else {
            let e = result.unwrap_err().to_string();
            assert!(e.contains("rows"), "{}: {e}", tile.summary());
        }
    }
    assert!(emitted > 20, "{emitted}");
    // An x86-avx2 tile keeps the AVX2 kernel even with avx512 on.
    let avx2 = tessera_codegen::x86::plan::target();
    let p2 = Problem::from_kernel(avx2, &kernel).unwrap();
    let t2 = solve(avx2, &p2).unwrap()[0];
    let code = backend.emit_code(&kernel, &t2).unwrap();
    assert!(!code.listing.contains("avx512"));
    // The target the backend asks for follows the formats.
    assert_eq!(backend.target(&kernel, Variant::Gemm).name, AVX512_NAME);
    // W4A8 goes to x86-avx512 only with AVX512-VNNI on too (the int8
    // kernel), whether or not the CPU has AVX-VNNI (Zen 4 has not).
    assert_eq!(backend.target(&w4a8, Variant::Gemm).name, "x86-avx2");
    let vnni = X86Backend {
        vnni: true,
        avx512: true,
        avx512_vnni: true,
        ..X86Backend::default()
    };
    assert_eq!(vnni.target(&w4a8, Variant::Gemm).name, AVX512_NAME);
    let zen4 = X86Backend {
        avx512: true,
        avx512_vnni: true,
        ..X86Backend::default()
    };
    assert_eq!(zen4.target(&w4a8, Variant::Gemm).name, AVX512_NAME);
    assert_eq!(
        vnni.target(&library::get("matmul-w8a8").unwrap(), Variant::Gemm)
            .name,
        "x86-avx2"
    );
    assert_eq!(
        X86Backend::default().target(&kernel, Variant::Gemm).name,
        "x86-avx2"
    );
    // GEMV and flat GEMM stay on AVX2 (bandwidth-bound; see `target`).
    for v in [Variant::Gemv, Variant::FlatGemm] {
        assert_eq!(backend.target(&kernel, v).name, "x86-avx2");
        assert_eq!(vnni.target(&w4a8, v).name, "x86-avx2");
    }
}

/// A tile the kernel cannot hold is an error naming the problem.
#[test]
fn bad_tiles_are_named() {
    let kernel = f32_kernel(true, Activation::None);
    let backend = X86Backend {
        avx512: true,
        ..X86Backend::default()
    };
    let mut t = tile_at(&kernel, 5, 80);
    t.hp = 72;
    let e = backend.emit_code(&kernel, &t).unwrap_err().to_string();
    assert!(e.contains("multiple of 16"), "{e}");
    let mut spec = Avx512Spec::new(6, 96, false, Activation::None);
    assert!(avx512::emit(&spec).is_err());
    spec = Avx512Spec::new(15, 16, false, Activation::None);
    assert!(avx512::emit(&spec).is_err());
}

// ---- listings --------------------------------------------------------------

#[test]
fn avx512_kernel_listings_match_their_bytes() {
    let kernel = f32_kernel(true, Activation::Relu);
    let backend = X86Backend {
        avx512: true,
        ..X86Backend::default()
    };
    for (ep, hp) in [(5, 80), (8, 48), (14, 32), (1, 16)] {
        let tile = tile_at(&kernel, ep, hp);
        for v in Variant::ALL {
            let code = backend.emit_code_variant(&kernel, &tile, v).unwrap();
            match check_x86(&code.listing, &code.bytes, MATTR) {
                Ok(()) => {}
                Err(McError::Missing) => {
                    eprintln!("SKIP: llvm-mc not installed");
                    return;
                }
                Err(McError::Failed(why)) => panic!("{ep}x{hp} {v}: {why}"),
            }
        }
    }
    let mut spec = Avx512Spec::new(6, 64, true, Activation::Relu);
    spec.embedded_broadcast = true;
    let code = avx512::emit(&spec).unwrap();
    assert!(code.listing.contains("{1to16}"));
    if let Err(McError::Failed(why)) = check_x86(&code.listing, &code.bytes, MATTR) {
        panic!("embedded broadcast: {why}");
    }
}

#[test]
fn avx512_listing_snapshot() {
    let kernel = f32_kernel(true, Activation::Relu);
    let tile = best_at(&kernel, 4096);
    let backend = X86Backend {
        avx512: true,
        ..X86Backend::default()
    };
    let code = backend.emit_code(&kernel, &tile).unwrap();
    assert_eq!(code, backend.emit_code(&kernel, &tile).unwrap());
    insta::assert_snapshot!(
        format!("matmul-f32-relu_avx512_{}x{}x{}", tile.ep, tile.hp, tile.lp),
        code.listing
    );
}

// ---- the kernel against plain math ----------------------------------------

fn avx512_backend() -> Option<X86Backend> {
    if !host_has_avx512() {
        eprintln!("SKIP: no avx512f");
        return None;
    }
    match X86Backend::detect() {
        Ok(b) => Some(X86Backend { avx512: true, ..b }),
        Err(e) => {
            eprintln!("SKIP: {e}");
            None
        }
    }
}

const SHAPES: [(usize, usize, usize); 10] = [
    (1, 17, 33),
    (2, 16, 1),
    (3, 81, 7),
    (5, 80, 64),
    (6, 160, 100),
    (7, 33, 257),
    (11, 95, 31),
    (13, 48, 9),
    (16, 200, 40),
    (29, 47, 130),
];

/// The backend's own path (x86-avx512 tiles, every variant) for the
/// solver's tiles and some others, with and without bias and relu.
#[test]
fn avx512_kernel_matches_the_interpreter() {
    let Some(backend) = avx512_backend() else {
        return;
    };
    for (bias, act) in [
        (true, Activation::None),
        (true, Activation::Relu),
        (false, Activation::Relu),
        (false, Activation::None),
    ] {
        let kernel = f32_kernel(bias, act);
        for (ep, hp) in [(5, 80), (8, 48), (14, 32), (6, 64), (1, 16), (3, 112)] {
            let tile = tile_at(&kernel, ep, hp);
            for v in Variant::ALL {
                let hm = backend.load_variant(&kernel, &tile, v).unwrap();
                assert!(
                    matches!(hm.tile(), HostTile { ep: e, hp: h, lp: 1 } if e == ep as usize && h == hp as usize)
                );
                let what = format!("{ep}x{hp} {v} bias {bias} {act:?}");
                check_host_matmul(&hm, &kernel, &what, &SHAPES, 7);
            }
        }
    }
}

/// K spanning several K blocks (partial sums through y, including a
/// partial block at the end) with n and m tails, and the embedded-broadcast
/// loop, with small panel blocks so the shapes stay small.
#[test]
fn avx512_k_blocks_and_embedded_broadcast() {
    if avx512_backend().is_none() {
        return;
    }
    for (bias, act) in [(true, Activation::Relu), (false, Activation::None)] {
        let kernel = f32_kernel(bias, act);
        for (ep, hp) in [(5, 80), (12, 32), (8, 48)] {
            for embedded in [false, true] {
                for block_k in [8, 24] {
                    let mut spec = Avx512Spec::new(ep, hp, bias, act);
                    spec.embedded_broadcast = embedded;
                    spec.panel_block_bytes = block_k * hp as i32 * 4;
                    assert_eq!(avx512::kc(&spec), block_k);
                    let code = avx512::emit(&spec).unwrap();
                    let hm =
                        HostMatmul::new(&kernel, HostTile { ep, hp, lp: 1 }, None, &code).unwrap();
                    let what = format!("{ep}x{hp} kc {block_k} embedded {embedded}");
                    check_host_matmul(
                        &hm,
                        &kernel,
                        &what,
                        &[(13, 90, 100), (7, 33, 24), (2, 16, 57), (1, 20, 70)],
                        7,
                    );
                }
            }
        }
    }
}
