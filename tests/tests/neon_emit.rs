//! NEON emitter on any host: listing snapshots of the canonical set, the
//! llvm-mc byte-equality check of every emitted kernel, and the register
//! plans against the solver's accounting.

use tessera_codegen::artifact::{Artifact, Backend, MachineCode, Variant};
use tessera_codegen::neon::NeonBackend;
use tessera_codegen::neon::asm::V;
use tessera_codegen::tile::{Problem, neighbours, solve};
use tessera_codegen::{TileConfig, mac_class};
use tessera_dsl::{Kernel, library};
use tessera_tests::llvm_mc::{McError, check_aarch64};

const MATTR: &str = "+neon,+dotprod,+i8mm,+fullfp16";

fn machine(a: Artifact) -> MachineCode {
    match a {
        Artifact::Machine(m) => m,
        other => panic!("expected machine code, got {other}"),
    }
}

/// The solver's best tile for M = `e` that the kernel's layout admits, and
/// its nearest such neighbour.
fn tiles(target: &str, kernel: &Kernel, e: u64) -> (TileConfig, TileConfig) {
    let be = NeonBackend::new(target).unwrap();
    let class = mac_class(be.caps(), kernel).unwrap();
    let p = Problem::new(e, 4096, 4096, class);
    let best = solve(be.caps(), &p)
        .unwrap()
        .into_iter()
        .find(|t| be.emit(kernel, t).is_ok())
        .unwrap();
    let next = neighbours(be.caps(), &p, &best, 16)
        .unwrap()
        .into_iter()
        .find(|t| be.emit(kernel, t).is_ok())
        .unwrap();
    (best, next)
}

/// (snapshot name, target, kernel, tile, variant) of the canonical set.
fn canonical() -> Vec<(String, &'static str, Kernel, TileConfig, Variant)> {
    let w4 = library::get("matmul-w4a8").unwrap();
    let f16 = library::get("matmul-f16").unwrap();
    let mut out = Vec::new();
    for target in ["aarch64-dotprod", "aarch64-i8mm"] {
        let (best, next) = tiles(target, &w4, 4096);
        for t in [best, next] {
            out.push((
                format!("{target}_w4a8_{}x{}x{}", t.ep, t.hp, t.lp),
                target,
                w4.clone(),
                t,
                Variant::Gemm,
            ));
        }
        let (g, _) = tiles(target, &w4, 1);
        out.push((
            format!("{target}_w4a8_gemv_{}x{}x{}", g.ep, g.hp, g.lp),
            target,
            w4.clone(),
            g,
            Variant::Gemv,
        ));
    }
    let (t, _) = tiles("aarch64-fp16", &f16, 4096);
    out.push((
        format!("aarch64-fp16_f16_{}x{}x{}", t.ep, t.hp, t.lp),
        "aarch64-fp16",
        f16,
        t,
        Variant::Gemm,
    ));
    out
}

#[test]
fn canonical_listings_are_pinned() {
    for (name, target, kernel, tile, variant) in canonical() {
        let code = machine(
            NeonBackend::new(target)
                .unwrap()
                .emit_variant(&kernel, &tile, variant)
                .unwrap(),
        );
        insta::assert_snapshot!(name, code.listing);
    }
}

#[test]
fn i8mm_lists_smmla_and_dotprod_lists_sdot_only() {
    let w4 = library::get("matmul-w4a8").unwrap();
    let (t, _) = tiles("aarch64-i8mm", &w4, 4096);
    let l = machine(
        NeonBackend::new("aarch64-i8mm")
            .unwrap()
            .emit(&w4, &t)
            .unwrap(),
    )
    .listing;
    assert!(l.contains("smmla"));
    let (t, _) = tiles("aarch64-dotprod", &w4, 4096);
    let l = machine(
        NeonBackend::new("aarch64-dotprod")
            .unwrap()
            .emit(&w4, &t)
            .unwrap(),
    )
    .listing;
    assert!(l.contains("sdot") && !l.contains("smmla"));
    let l = machine(
        NeonBackend::new("aarch64-neon")
            .unwrap()
            .emit(&w4, &tiles("aarch64-neon", &w4, 4096).0)
            .unwrap(),
    )
    .listing;
    assert!(l.contains("sadalp") && !l.contains("sdot") && !l.contains("smmla"));
}

fn mc(code: &MachineCode, what: &str) {
    match check_aarch64(&code.listing, &code.bytes, MATTR) {
        Ok(()) => {}
        Err(McError::Missing) => eprintln!("llvm-mc not installed: skipped {what}"),
        Err(McError::Failed(e)) => panic!("{what}: {e}"),
    }
}

#[test]
fn llvm_mc_assembles_every_listing_to_the_same_bytes() {
    for (name, target, kernel, tile, variant) in canonical() {
        let be = NeonBackend::new(target).unwrap();
        mc(
            &machine(be.emit_variant(&kernel, &tile, variant).unwrap()),
            &name,
        );
        if let Some(q) = be.quantizer(&kernel, &tile).unwrap() {
            mc(&q, &format!("{name} quantizer"));
        }
    }
    // The other paths: W8A8, f32, the smull fallback, widened f16, gemv.
    for target in [
        "aarch64-neon",
        "aarch64-fp16",
        "aarch64-dotprod",
        "aarch64-i8mm",
    ] {
        for name in ["matmul-w4a8", "matmul-w8a8", "matmul-f32", "matmul-f16"] {
            let kernel = library::get(name).unwrap();
            let be = NeonBackend::new(target).unwrap();
            let (best, next) = tiles(target, &kernel, 4096);
            for t in [best, next] {
                mc(
                    &machine(be.emit(&kernel, &t).unwrap()),
                    &format!("{target} {name}"),
                );
                if let Some(q) = be.quantizer(&kernel, &t).unwrap() {
                    mc(&q, &format!("{target} {name} quantizer"));
                }
            }
            let (g, _) = tiles(target, &kernel, 1);
            mc(
                &machine(be.emit_variant(&kernel, &g, Variant::Gemv).unwrap()),
                &format!("{target} {name} gemv"),
            );
        }
    }
}

#[test]
fn register_plans_match_the_solver() {
    for target in [
        "aarch64-neon",
        "aarch64-fp16",
        "aarch64-dotprod",
        "aarch64-i8mm",
    ] {
        for name in ["matmul-w4a8", "matmul-w8a8", "matmul-f32", "matmul-f16"] {
            let kernel = library::get(name).unwrap();
            let be = NeonBackend::new(target).unwrap();
            let (best, next) = tiles(target, &kernel, 4096);
            for t in [best, next] {
                let (plan, acc) = be.plan(&kernel, &t).unwrap();
                assert_eq!(acc, t.accounting, "{target} {name}");
                assert_eq!(plan.acc.len() as u32, acc.accumulators);
                assert_eq!(plan.a.len() as u32, acc.a_regs);
                assert_eq!(plan.b.len() as u32, acc.b_regs);
                assert_eq!(plan.total(), acc.total, "{target} {name}");
                assert!(plan.total() <= 32);
                // No register holds two things.
                assert!(u32::from(plan.acc.start) >= plan.total() - acc.accumulators);
            }
        }
    }
    // The tables in the int8 module doc.
    let w4 = library::get("matmul-w4a8").unwrap();
    let be = NeonBackend::new("aarch64-dotprod").unwrap();
    let (t, _) = tiles("aarch64-dotprod", &w4, 4096);
    assert_eq!((t.ep, t.hp, t.lp), (12, 8, 4));
    let (p, _) = be.plan(&w4, &t).unwrap();
    assert_eq!(
        (p.a, p.b, p.mask, p.stage, p.acc),
        (0..3, 3..5, V(5), V(6), 8..32)
    );
    let be = NeonBackend::new("aarch64-i8mm").unwrap();
    let (t, _) = tiles("aarch64-i8mm", &w4, 4096);
    assert_eq!((t.ep, t.hp, t.lp), (10, 8, 8));
    let (p, _) = be.plan(&w4, &t).unwrap();
    assert_eq!(
        (p.a, p.b, p.mask, p.stage, p.acc),
        (0..5, 5..9, V(9), V(10), 12..32)
    );
}

#[test]
fn bad_tiles_and_targets_are_errors() {
    let w4 = library::get("matmul-w4a8").unwrap();
    assert!(NeonBackend::new("x86-avx2").is_err());
    assert!(NeonBackend::new("nope").is_err());
    let be = NeonBackend::new("aarch64-dotprod").unwrap();
    let (t, _) = tiles("aarch64-dotprod", &w4, 4096);
    let mut bad = t;
    bad.hp = 4; // 16 codes per step: no whole 32-code run
    assert!(be.emit(&w4, &bad).is_err());
    let mut bad = t;
    bad.lp = 8;
    assert!(be.emit(&w4, &bad).is_err());
    let mut bad = t;
    bad.ep = 40;
    assert!(be.emit(&w4, &bad).is_err());
    assert!(be.emit_variant(&w4, &t, Variant::Gemv).is_err());
    let attn = library::get("attention-decode-f16").unwrap();
    assert!(be.emit(&attn, &t).is_err());
}
