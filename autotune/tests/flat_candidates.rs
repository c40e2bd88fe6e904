//! The GEMV and flat candidates of x86 with AVX-512: the solver's zmm tiles
//! are offered beside the ymm ones, only in shapes the ymm target has no tile
//! of (the record names a tile by its shape, and the runtime rebuilds it on
//! the first x86 target that has one), and they are recorded as
//! `x86-avx512`.

use tessera_autotune::tune::SolverCtx;
use tessera_codegen::target::TargetCaps;
use tessera_codegen::tile::{Problem, TileConfig, feasible};
use tessera_dsl::ir::Variant;

fn accept_all(_: &TileConfig) -> bool {
    true
}

fn solver(gemm: &'static str, kernel: &str) -> SolverCtx<'static> {
    let avx2 = TargetCaps::by_name("x86-avx2").unwrap();
    let k = tessera_dsl::library::get(kernel).unwrap();
    let p = Problem::from_kernel(avx2, &k).unwrap();
    SolverCtx {
        caps: avx2,
        gemv_caps: avx2,
        gemm_caps: TargetCaps::by_name(gemm).unwrap(),
        class: p.class,
        weight_dequant: p.weight_dequant,
        weight_groups: p.weight_groups,
        nibble_runs: p.nibble_runs,
        accept: &accept_all,
    }
}

#[test]
fn zmm_flat_tiles_are_candidates_in_shapes_ymm_has_none_of() {
    for kernel in ["matmul-f32", "matmul-q4_0"] {
        let s = solver("x86-avx512", kernel);
        // N = 16: the zmm ranking reaches narrow tiles, shapes ymm has too.
        let cands = s.candidates(Variant::FlatGemm, 16, 4096, 12).unwrap();
        let ymm_tiles = feasible(s.caps, &s.problem(8, 16, 4096)).unwrap();
        let wide: Vec<_> = cands
            .iter()
            .filter(|c| s.caps_of(Variant::FlatGemm, &c.tile).name == "x86-avx512")
            .collect();
        assert!(!wide.is_empty(), "{kernel}: no zmm flat candidate");
        assert!(wide.len() < cands.len(), "{kernel}: no ymm flat candidate");
        for c in wide {
            assert_eq!(c.tile.accounting.budget, 32);
            let shape = [c.tile.ep, c.tile.hp, c.tile.lp];
            assert!(
                !ymm_tiles.iter().any(|t| [t.ep, t.hp, t.lp] == shape),
                "{kernel}: {shape:?} is a ymm tile too"
            );
        }
        // The flat target's own optimum keeps order 0: a tie goes to it,
        // not to a zmm tile.
        let first = cands.iter().min_by_key(|c| c.order).unwrap();
        assert_eq!(
            s.caps_of(Variant::FlatGemm, &first.tile).name,
            "x86-avx2",
            "{kernel}"
        );
    }
}

#[test]
fn without_a_wider_gemm_target_the_flat_candidates_are_the_flat_targets() {
    let s = solver("x86-avx2", "matmul-f32");
    let cands = s.candidates(Variant::FlatGemm, 4096, 4096, 2).unwrap();
    assert!(!cands.is_empty());
    for c in &cands {
        assert_eq!(c.tile.accounting.budget, 16);
        assert_eq!(s.caps_of(Variant::FlatGemm, &c.tile).name, "x86-avx2");
    }
}

#[test]
fn zmm_gemv_tiles_are_one_row_candidates_too() {
    for kernel in ["matmul-f32", "matmul-q4_0"] {
        let s = solver("x86-avx512", kernel);
        let cands = s.candidates(Variant::Gemv, 4096, 4096, 2).unwrap();
        let wide: Vec<_> = cands
            .iter()
            .filter(|c| s.caps_of(Variant::Gemv, &c.tile).name == "x86-avx512")
            .collect();
        assert!(!wide.is_empty(), "{kernel}: no zmm GEMV candidate");
        assert!(wide.len() < cands.len(), "{kernel}: no ymm GEMV candidate");
        let ymm_tiles = feasible(s.caps, &s.problem(1, 4096, 4096)).unwrap();
        for c in wide {
            assert_eq!(c.tile.ep, 1, "{kernel}");
            let shape = [c.tile.ep, c.tile.hp, c.tile.lp];
            assert!(!ymm_tiles.iter().any(|t| [t.ep, t.hp, t.lp] == shape));
        }
    }
}
