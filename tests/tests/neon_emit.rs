//! NEON emitter on any host: listing snapshots of the canonical set, the
//! llvm-mc byte-equality check of every emitted kernel, and the register
//! plans against the solver's accounting.

use tessera_codegen::TileConfig;
use tessera_codegen::artifact::{Artifact, Backend, MachineCode, Variant};
use tessera_codegen::neon::asm::V;
use tessera_codegen::neon::{NeonBackend, with_signed_codes};
use tessera_codegen::tile::{Problem, neighbours, solve};
use tessera_dsl::ir::ParamType;
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
    // The kernel's own problem (grouped weights included), as the runtime
    // and the tuner pose it.
    let mut p = Problem::from_kernel(be.caps(), kernel).unwrap();
    (p.e, p.h, p.l) = (e, 4096, 4096);
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
    assert_eq!((t.ep, t.hp, t.lp), (12, 4, 4));
    let (p, _) = be.plan(&w4, &t).unwrap();
    assert_eq!(
        (p.a, p.b, p.mask, p.stage, p.partials, p.acc),
        (0..3, 3..5, V(5), V(6), 7..19, 20..32)
    );
    // Per-row weights: Table 2's 12×8×4, every register to the int8 tile.
    let w8 = library::get("matmul-w8a8").unwrap();
    let (t, _) = tiles("aarch64-dotprod", &w8, 4096);
    assert_eq!((t.ep, t.hp, t.lp), (12, 8, 4));
    let (p, _) = be.plan(&w8, &t).unwrap();
    assert_eq!(
        (p.a, p.b, p.mask, p.stage, p.acc),
        (0..3, 3..5, V(5), V(6), 8..32)
    );
    let be = NeonBackend::new("aarch64-i8mm").unwrap();
    let (t, _) = tiles("aarch64-i8mm", &w4, 4096);
    assert_eq!((t.ep, t.hp, t.lp), (10, 4, 8));
    let (p, _) = be.plan(&w4, &t).unwrap();
    assert_eq!(
        (p.a, p.b, p.mask, p.stage, p.partials, p.acc),
        (0..5, 5..7, V(7), V(8), 9..19, 22..32)
    );
}

#[test]
fn bad_tiles_and_targets_are_errors() {
    let w4 = library::get("matmul-w4a8").unwrap();
    assert!(NeonBackend::new("x86-avx2").is_err());
    assert!(NeonBackend::new("nope").is_err());
    let be = NeonBackend::new("aarch64-dotprod").unwrap();
    let (t, _) = tiles("aarch64-dotprod", &w4, 4096);
    assert_eq!((t.hp, t.lp), (4, 4)); // 16-code blocks, paired steps
    let mut bad = t;
    bad.hp = 12; // 48 codes per step: no whole 32-code runs, not 16
    assert!(be.emit(&w4, &bad).is_err());
    // Paired steps: the GEMM and flat loops, not the GEMV's.
    assert!(be.emit_variant(&w4, &t, Variant::FlatGemm).is_ok());
    let mut gemv = t;
    gemv.ep = 1;
    assert!(be.emit_variant(&w4, &gemv, Variant::Gemv).is_err());
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

/// The flat-GEMM formats: (label, library kernel, weight format override).
fn flat_formats() -> Vec<(&'static str, Kernel)> {
    let with = |name: &str, f: Option<tessera_dsl::Format>| {
        let mut k = library::get(name).unwrap();
        if let Some(f) = f {
            for t in &mut k.tensors {
                if t.name == "w" {
                    t.format = f;
                }
            }
            if let tessera_dsl::Op::Matmul(mm) = &mut k.op {
                mm.epilogue.zero_point = f.is_asymmetric();
            }
        }
        k
    };
    use tessera_dsl::{Format, Group};
    vec![
        ("w4a8", with("matmul-w4a8", None)),
        (
            "w4a8-row",
            with(
                "matmul-w4a8",
                Some(Format::U4Asym(Group::Row, ParamType::F32)),
            ),
        ),
        ("w8a8", with("matmul-w8a8", None)),
        (
            "w8a8-asym-g32",
            with(
                "matmul-w8a8",
                Some(Format::I8Asym(Group::Size(32), ParamType::F32)),
            ),
        ),
        ("f32", with("matmul-f32", None)),
        ("f16", with("matmul-f16", None)),
        ("q4_0", with("matmul-q4_0", None)),
        ("q4_1", with("matmul-q4_1", None)),
        ("q8_0", with("matmul-q8_0", None)),
        (
            "u4sym-row-f16",
            with(
                "matmul-q4_0",
                Some(Format::U4Sym(Group::Row, ParamType::F16)),
            ),
        ),
    ]
}

const TARGETS: [&str; 4] = [
    "aarch64-neon",
    "aarch64-fp16",
    "aarch64-dotprod",
    "aarch64-i8mm",
];

/// The solver's flat tile for M = `e` (the kernel's own problem with the
/// real M) that the emitter takes.
fn flat_tile(target: &str, kernel: &Kernel, e: u64) -> TileConfig {
    let be = NeonBackend::new(target).unwrap();
    let mut p = Problem::from_kernel(be.caps(), kernel).unwrap();
    p.e = e;
    solve(be.caps(), &p)
        .unwrap()
        .into_iter()
        .find(|t| be.emit_variant(kernel, t, Variant::FlatGemm).is_ok())
        .unwrap()
}

#[test]
fn flat_canonical_listings_are_pinned() {
    let set = [
        ("aarch64-i8mm", "w4a8"),
        ("aarch64-dotprod", "w4a8"),
        ("aarch64-neon", "w4a8"),
        ("aarch64-dotprod", "w8a8"),
        ("aarch64-neon", "f32"),
        ("aarch64-fp16", "f16"),
    ];
    let formats = flat_formats();
    for (target, label) in set {
        let kernel = &formats.iter().find(|(l, _)| *l == label).unwrap().1;
        let t = flat_tile(target, kernel, 8);
        let code = machine(
            NeonBackend::new(target)
                .unwrap()
                .emit_variant(kernel, &t, Variant::FlatGemm)
                .unwrap(),
        );
        let name = format!("{target}_{label}_flat_{}x{}x{}", t.ep, t.hp, t.lp);
        insta::assert_snapshot!(name, code.listing);
    }
}

/// Every flat listing (every target and format, the tiles for M = 2, 8,
/// 16, default and small K blocks) assembles to the emitted bytes.
#[test]
fn llvm_mc_flat_listings() {
    for target in TARGETS {
        let be = NeonBackend::new(target).unwrap();
        for (label, kernel) in flat_formats() {
            for e in [2, 8, 16] {
                let t = flat_tile(target, &kernel, e);
                let what = format!("{target} {label} flat e={e}");
                mc(
                    &machine(be.emit_variant(&kernel, &t, Variant::FlatGemm).unwrap()),
                    &what,
                );
                mc(
                    &machine(be.emit_flat(&kernel, &t, 256).unwrap()),
                    &format!("{what} small K block"),
                );
            }
        }
    }
}

/// The flat loop's row block is the solver's ep for the real M, its
/// registers are the solver's accounting, and for every M in 2..=16 one
/// pass covers all rows: each weight byte comes from memory once per call.
#[test]
fn flat_plans_follow_the_solver() {
    for target in TARGETS {
        let be = NeonBackend::new(target).unwrap();
        for (label, kernel) in flat_formats() {
            for m in 2..=16u64 {
                let t = flat_tile(target, &kernel, m);
                let f = be.flat_plan(&kernel, &t).unwrap();
                let (plan, acc) = be.plan(&kernel, &t).unwrap();
                let what = format!("{target} {label} m={m} tile {}", t.summary());
                assert_eq!(f.row_block, t.ep, "{what}");
                assert_eq!(acc, t.accounting, "{what}");
                assert_eq!(plan.acc_count(), acc.accumulators, "{what}");
                assert_eq!(plan.total(), acc.total, "{what}");
                assert!(acc.total <= acc.budget, "{what}");
                assert_eq!(f.passes(m), 1, "{what}");
                // The tail row block runs a loop of the fewest rows that
                // cover it: counts ascend in MAC units up to ep.
                let counts = f.row_counts();
                assert_eq!(counts.last(), Some(&t.ep), "{what}");
                assert!(counts.windows(2).all(|w| w[0] < w[1]), "{what}");
                assert!(counts.iter().all(|c| c % f.row_unit == 0), "{what}");
                let tail = (m - 1) % u64::from(t.ep) + 1;
                let run = counts.iter().find(|&&c| u64::from(c) >= tail).unwrap();
                assert!(
                    u64::from(*run) < 2 * tail.max(u64::from(f.row_unit)),
                    "{what}"
                );
                assert!(f.pass_rows() >= 16, "{what}");
                // When the rows fit one register tile, there is one row block.
                if m <= u64::from(t.ep) {
                    assert_eq!(m.div_ceil(u64::from(f.row_block)), 1, "{what}");
                }
                if let Some(b) = f.k_block_bytes() {
                    assert!(b <= tessera_codegen::neon::FLAT_K_BLOCK_BYTES.max(f.step_bytes * 128));
                }
            }
        }
    }
}

/// The flat loop prefetches (L1 for this block, L2 for the next) and the
/// GEMM loop does not; `FlatGemm` is a different loop from `Gemm`.
#[test]
fn flat_loop_prefetches_and_differs_from_gemm() {
    for target in TARGETS {
        let be = NeonBackend::new(target).unwrap();
        for (label, kernel) in flat_formats() {
            let t = flat_tile(target, &kernel, 8);
            let flat = machine(be.emit_variant(&kernel, &t, Variant::FlatGemm).unwrap()).listing;
            let gemm = machine(be.emit_variant(&kernel, &t, Variant::Gemm).unwrap()).listing;
            assert!(flat.contains("prfm pldl1keep"), "{target} {label}");
            if !label.ends_with("-row") && !label.contains("-row-") {
                assert!(flat.contains("prfm pldl2strm"), "{target} {label}");
            }
            assert!(!gemm.contains("prfm"), "{target} {label}");
            assert!(flat.contains("// flat: row block"), "{target} {label}");
            let f = be.flat_plan(&kernel, &t).unwrap();
            for c in f.row_counts() {
                assert!(
                    flat.contains(&format!("// {c} row(s)")),
                    "{target} {label} {c}"
                );
            }
        }
    }
    let w4 = library::get("matmul-w4a8").unwrap();
    let be = NeonBackend::new("aarch64-dotprod").unwrap();
    let t = flat_tile("aarch64-dotprod", &w4, 8);
    assert!(be.emit_flat(&w4, &t, 0).is_err());
}

/// The compact formats (ggml's Q4_0, Q4_1, Q8_0: f16 group parameters,
/// Q4_0's implied zero point 8) on every target and variant: the listing
/// says what the group epilogue holds, widens f16 parameters with fcvtl,
/// handles the zero point in int32 (signed codes and scvtf #4 in the
/// many-row tiles, accumulators starting at -8·Σqx in the GEMV, a
/// subtraction on the smull fallback) without offset loads, and
/// assembles to the emitted bytes.
#[test]
fn compact_formats_every_target_and_variant() {
    for target in TARGETS {
        let be = NeonBackend::new(target).unwrap();
        for name in ["matmul-q4_0", "matmul-q4_1", "matmul-q8_0"] {
            let kernel = library::get(name).unwrap();
            let (best, _) = tiles(target, &kernel, 4096);
            for (t, variant) in every_variant(target, &kernel) {
                let what = format!("{target} {name} {variant} {}x{}x{}", t.ep, t.hp, t.lp);
                let code = machine(be.emit_variant(&kernel, &t, variant).unwrap());
                let l = &code.listing;
                assert!(l.contains("// group epilogue: f16 "), "{what}");
                assert!(l.contains("fcvtl "), "{what}");
                // The solver's grouped GEMV tile leaves room for its f32
                // partial sums on the sdot targets (the i8mm GEMV is sdot),
                // and its GEMM tiles (sdot, smmla) do too; flat tiles keep
                // them on the stack.
                let sdot = target.contains("dotprod") || target.contains("i8mm");
                let gemm = sdot && variant == Variant::Gemm;
                assert_eq!(
                    l.contains("| f32 partial sums"),
                    (variant == Variant::Gemv && sdot && t.lp == 4) || gemm,
                    "{what}"
                );
                let zp = name == "matmul-q4_0";
                // Q4_0's zero point: many-row sdot/smmla tiles make the
                // codes signed in the loop (eor 0x88, 16x sums, scvtf #4);
                // the GEMV's accumulators start each group at -8·Σqx; the
                // smull fallback's lane partials subtract it after.
                let smull = matches!(target, "aarch64-neon" | "aarch64-fp16");
                let signed = l.contains("codes made signed");
                if variant == Variant::Gemm && t == best && !smull {
                    assert_eq!(signed, zp, "{what}: the GEMM tile's zero point");
                }
                assert!(!signed || (zp && !smull), "{what}");
                assert_eq!(l.contains("shl "), zp, "{what}");
                assert_eq!(l.contains("eor v"), signed, "{what}");
                assert_eq!(l.contains(".4s, #4"), signed, "{what}");
                assert_eq!(l.contains("sub v"), zp && smull, "{what}");
                assert_eq!(l.contains("neg v"), zp && !smull && !signed, "{what}");
                assert_eq!(l.contains("zero point 8"), zp, "{what}");
                mc(&code, &what);
            }
        }
    }
}

/// The tiles a listing check covers: the GEMM at the solver's tile and
/// its neighbour, the GEMV and the flat GEMM at M = 8.
fn every_variant(target: &str, kernel: &Kernel) -> [(TileConfig, Variant); 4] {
    let (best, next) = tiles(target, kernel, 4096);
    let (g, _) = tiles(target, kernel, 1);
    [
        (best, Variant::Gemm),
        (next, Variant::Gemm),
        (g, Variant::Gemv),
        (flat_tile(target, kernel, 8), Variant::FlatGemm),
    ]
}

/// Q4_0 with its codes stored signed (`signed-codes`, what NEON devices
/// pack): every target and variant unpacks with `shl` #4 / `and` 0xF0
/// alone (no `eor`, no 0x88 constant, no Σqx term: no `neg`, `sub` or
/// row-sum load) and converts with `scvtf` #4; the listing says so and
/// assembles to the emitted bytes.
#[test]
fn signed_codes_every_target_and_variant() {
    let kernel = with_signed_codes(&library::get("matmul-q4_0").unwrap()).unwrap();
    for target in TARGETS {
        let be = NeonBackend::new(target).unwrap();
        for (t, variant) in every_variant(target, &kernel) {
            let what = format!("{target} signed q4_0 {variant} {}x{}x{}", t.ep, t.hp, t.lp);
            let code = machine(be.emit_variant(&kernel, &t, variant).unwrap());
            let l = &code.listing;
            assert!(l.contains("codes stored signed"), "{what}");
            assert!(l.contains("0xF0 nibble mask (signed codes)"), "{what}");
            assert!(l.contains(".4s, #4"), "{what}");
            assert!(l.contains("shl "), "{what}");
            for absent in ["eor v", ".16b, #136", "neg v", "sub v", "ushr v"] {
                assert!(!l.contains(absent), "{what}: {absent}");
            }
            mc(&code, &what);
        }
    }
}

/// Listings of the compact formats: Q4_0 (u4sym:g32:f16) on sdot, Q4_1
/// (u4asym:g32:f16) on smmla and Q8_0 (i8sym:g32:f16) on the smull
/// fallback, at the solver's GEMV tiles.
#[test]
fn compact_listings_are_pinned() {
    for (target, name, label) in [
        ("aarch64-dotprod", "matmul-q4_0", "q4_0"),
        ("aarch64-i8mm", "matmul-q4_1", "q4_1"),
        ("aarch64-neon", "matmul-q8_0", "q8_0"),
        ("aarch64-dotprod", "signed", "q4_0_signed"),
    ] {
        let kernel = match name {
            "signed" => with_signed_codes(&library::get("matmul-q4_0").unwrap()).unwrap(),
            name => library::get(name).unwrap(),
        };
        let (g, _) = tiles(target, &kernel, 1);
        let code = machine(
            NeonBackend::new(target)
                .unwrap()
                .emit_variant(&kernel, &g, Variant::Gemv)
                .unwrap(),
        );
        let snap = format!("{target}_{label}_gemv_{}x{}x{}", g.ep, g.hp, g.lp);
        insta::assert_snapshot!(snap, code.listing);
    }
}
