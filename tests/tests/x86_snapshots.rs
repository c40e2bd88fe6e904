//! Listing snapshots of the x86-avx2 canonical set: each CPU-family library
//! matmul with the solver's best tile (plain AVX2 and AVX-VNNI for the
//! integer ones; AVX512-VNNI's differs from AVX-VNNI's in encoding only)
//! and the activation quantizers. Review changes with `cargo insta review`.

use tessera_codegen::tile::{Problem, solve};
use tessera_codegen::x86::{X86Backend, plan};

fn best(kernel: &tessera_dsl::Kernel) -> tessera_codegen::TileConfig {
    let caps = plan::target();
    solve(caps, &Problem::from_kernel(caps, kernel).unwrap()).unwrap()[0]
}

#[test]
fn x86_canonical_listings() {
    for name in ["matmul-f32", "matmul-f16", "matmul-w8a8", "matmul-w4a8"] {
        let kernel = tessera_dsl::library::get(name).unwrap();
        let tile = best(&kernel);
        let tag = format!("{name}_{}x{}x{}", tile.ep, tile.hp, tile.lp);
        let plain = X86Backend::default();
        let code = plain.emit_code(&kernel, &tile).unwrap();
        insta::assert_snapshot!(tag.clone(), code.listing);
        if let Some(q) = plain.emit_quantizer(&kernel, &tile).unwrap() {
            insta::assert_snapshot!(format!("{tag}_quantizer"), q.listing);
            let vnni = X86Backend {
                vnni: true,
                ..X86Backend::default()
            }
            .emit_code(&kernel, &tile)
            .unwrap();
            insta::assert_snapshot!(format!("{tag}_vnni"), vnni.listing);
            // AVX512-VNNI's form is the same program with each vpdpbusd
            // EVEX-encoded on ymm.
            let evex = X86Backend {
                avx512_vnni: true,
                ..X86Backend::default()
            }
            .emit_code(&kernel, &tile)
            .unwrap();
            let want = vnni
                .listing
                .replace("{vex} vpdpbusd", "{evex} vpdpbusd")
                .replace("mac vpdpbusd", "mac {evex} vpdpbusd");
            assert!(evex.listing == want, "{tag}: the EVEX listing differs");
        }
    }
}

/// The flat-GEMM and GEMV variants of the same canonical tiles.
#[test]
fn x86_variant_listings() {
    use tessera_codegen::artifact::Variant;
    for name in ["matmul-f32", "matmul-w4a8"] {
        let kernel = tessera_dsl::library::get(name).unwrap();
        let tile = best(&kernel);
        for v in [Variant::FlatGemm, Variant::Gemv] {
            let tag = format!("{name}_{}x{}x{}_{v}", tile.ep, tile.hp, tile.lp);
            let code = X86Backend::default()
                .emit_code_variant(&kernel, &tile, v)
                .unwrap();
            insta::assert_snapshot!(tag, code.listing);
        }
    }
}

#[test]
fn emission_is_deterministic() {
    for name in ["matmul-f32", "matmul-w4a8"] {
        let kernel = tessera_dsl::library::get(name).unwrap();
        let tile = best(&kernel);
        let b = X86Backend::default();
        assert_eq!(
            b.emit_code(&kernel, &tile).unwrap(),
            b.emit_code(&kernel, &tile).unwrap()
        );
    }
}
