//! Differential tests of every NEON kernel against the reference
//! interpreter, run on aarch64 (under `qemu-aarch64` here). Each path is
//! gated on run-time feature detection, since a SIGILL would kill the whole
//! binary: `-cpu max` runs all four targets, `-cpu cortex-a76` (dotprod, no
//! i8mm) and `-cpu cortex-a72` (neither) prove the dispatch falls back.
#![cfg(target_arch = "aarch64")]

use half::f16;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tessera_codegen::artifact::{Artifact, Backend, Variant};
use tessera_codegen::host::{HostInput, HostMatmul, HostOutput, HostTile, WeightsIn};
use tessera_codegen::neon::{NeonBackend, with_signed_codes};
use tessera_codegen::tile::{Problem, neighbours, solve};
use tessera_codegen::{TileConfig, mac_class};
use tessera_dsl::interp::{self, Bindings, Value};
use tessera_dsl::ir::ParamType;
use tessera_dsl::quant::quantize;
use tessera_dsl::{Format, Group, Kernel, library};
use tessera_tests::guarded::Guarded;

/// Targets this CPU can run, best first.
fn runnable() -> Vec<&'static str> {
    use std::arch::is_aarch64_feature_detected as has;
    let mut t = Vec::new();
    if has!("i8mm") && has!("dotprod") && has!("fp16") {
        t.push("aarch64-i8mm");
    }
    if has!("dotprod") && has!("fp16") {
        t.push("aarch64-dotprod");
    }
    if has!("fp16") {
        t.push("aarch64-fp16");
    }
    t.push("aarch64-neon");
    t
}

fn with_weight_format(mut k: Kernel, f: Format) -> Kernel {
    for t in &mut k.tensors {
        if t.name == "w" {
            t.format = f;
        }
    }
    if let tessera_dsl::Op::Matmul(mm) = &mut k.op {
        mm.epilogue.zero_point = f.is_asymmetric();
    }
    k
}

/// The solver's optimum for (e, n, k), its first neighbour the emitter
/// takes and, where it differs, the optimum of the same problem without
/// grouped weights: a tile too wide for register partial sums (the
/// `smmla` GEMM's 10×8 beside its 10×4), which keeps them on the stack.
fn tiles(target: &str, kernel: &Kernel, e: u64) -> Vec<TileConfig> {
    let be = NeonBackend::new(target).unwrap();
    let p = problem(be.caps(), kernel, e);
    // The best tile the kernel's layout admits (4-bit weights need hp·lp a
    // multiple of 32), as the autotuner would pick.
    let first = |p: &Problem| {
        solve(be.caps(), p)
            .unwrap()
            .into_iter()
            .find(|t| be.emit(kernel, t).is_ok())
            .unwrap()
    };
    let best = first(&p);
    let mut out = vec![best];
    for t in neighbours(be.caps(), &p, &best, 8).unwrap() {
        if be.emit(kernel, &t).is_ok() {
            out.push(t);
            break;
        }
    }
    let wide = first(&Problem {
        weight_groups: false,
        ..p
    });
    if out.iter().all(|t| (t.ep, t.hp) != (wide.ep, wide.hp)) {
        out.push(wide);
    }
    out
}

/// The kernel's problem on `caps` (grouped weights and all, as the
/// runtime and the tuner pose it) at `e` rows, n = k = 4096.
fn problem(caps: &tessera_codegen::target::TargetCaps, kernel: &Kernel, e: u64) -> Problem {
    let mut p = Problem::from_kernel(caps, kernel).unwrap();
    (p.e, p.h, p.l) = (e, 4096, 4096);
    p
}

/// GEMV tiles as the runtime solves them (on `NeonBackend::target`: the
/// dotprod loop on i8mm; a grouped GEMV's partial sums in registers), the
/// widest one the emitter takes (partial sums through the stack when they
/// do not fit) and, where it differs, the target's own GEMV tile (the i8mm
/// `smmla` one the tuner also measures).
fn gemv_tiles(target: &str, kernel: &Kernel) -> Vec<TileConfig> {
    let be = NeonBackend::new(target).unwrap();
    let caps = be.target(kernel, Variant::Gemv);
    let first = |p: &Problem| {
        solve(caps, p)
            .unwrap()
            .into_iter()
            .find(|t| be.emit_variant(kernel, t, Variant::Gemv).is_ok())
            .unwrap()
    };
    let p = problem(caps, kernel, 1);
    let mut out = vec![first(&p)];
    let wide = first(&Problem {
        weight_groups: false,
        ..p
    });
    if wide.hp != out[0].hp {
        out.push(wide);
    }
    if caps.name != be.caps().name {
        out.push(tiles(target, kernel, 1)[0]);
    }
    out
}

fn machine(a: Artifact) -> tessera_codegen::artifact::MachineCode {
    match a {
        Artifact::Machine(m) => m,
        _ => panic!("not machine code"),
    }
}

/// Run one case on `target` and compare with the interpreter.
#[allow(clippy::too_many_arguments)]
fn check(
    target: &str,
    kernel: &Kernel,
    tile: &TileConfig,
    variant: Variant,
    m: usize,
    n: usize,
    k: usize,
    seed: u64,
) {
    let be = NeonBackend::new(target).unwrap();
    let code = machine(
        be.emit_variant(kernel, tile, variant)
            .unwrap_or_else(|e| panic!("{target} {}: {e}", kernel.name)),
    );
    check_code(target, kernel, tile, &code, m, n, k, seed);
    let _ = variant;
}

/// Run emitted `code` for one case and compare with the interpreter.
#[allow(clippy::too_many_arguments)]
fn check_code(
    target: &str,
    kernel: &Kernel,
    tile: &TileConfig,
    code: &tessera_codegen::artifact::MachineCode,
    m: usize,
    n: usize,
    k: usize,
    seed: u64,
) {
    let be = NeonBackend::new(target).unwrap();
    let variant = code.listing.lines().next().unwrap_or("").to_string();
    let quant = be.quantizer(kernel, tile).unwrap();
    let host = HostMatmul::new(kernel, HostTile::from(tile), quant.as_ref(), code).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let x: Vec<f32> = (0..m * k).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
    let w: Vec<f32> = (0..n * k).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
    let bias: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
    let mm = kernel.as_matmul().unwrap();
    let fmt = |t: &str| kernel.tensor(t).unwrap().format;
    let (xf, wf, yf) = (fmt(&mm.x), fmt(&mm.w), fmt(&mm.y));
    let mut b = Bindings::new().extent("e", m).extent("h", n).extent("l", k);
    b = b.tensor("x", Value::from_f32(xf, &x).unwrap());
    b = b.tensor("bias", Value::F32(bias.clone()));
    let qt;
    let weights = if wf.is_quantized() {
        qt = quantize(wf, n, k, &w).unwrap();
        b = b.tensor("w", Value::Quant(qt.clone()));
        host.pack_weights(n, k, WeightsIn::Quant(&qt)).unwrap()
    } else {
        b = b.tensor("w", Value::from_f32(wf, &w).unwrap());
        host.pack_weights(n, k, WeightsIn::F32(&w)).unwrap()
    };
    let want = interp::run(kernel, &b).unwrap().get("y").unwrap().to_vec();
    let threads = 1 + (seed as usize % 2);
    let got: Vec<f32> = if xf == Format::F16 {
        // x ends at an inaccessible page: a read past it faults.
        let xh: Vec<f16> = x.iter().map(|&v| f16::from_f32(v)).collect();
        let xg = Guarded::from_halves(&xh);
        let mut y = vec![f16::ZERO; m * n];
        host.run(
            HostInput::F16(xg.halves()),
            m,
            &weights,
            Some(&bias),
            HostOutput::F16(&mut y),
            threads,
        )
        .unwrap();
        y.iter().map(|v| v.to_f32()).collect()
    } else {
        let mut y = vec![f32::NAN; m * n];
        if yf == Format::F16 {
            unreachable!()
        }
        let xg = Guarded::from_floats(&x);
        host.run(
            HostInput::F32(xg.floats()),
            m,
            &weights,
            Some(&bias),
            HostOutput::F32(&mut y),
            threads,
        )
        .unwrap();
        y
    };
    // Tolerance from the magnitude of the sum: f32 rounding of the int8
    // path's scale products, or the float path's accumulation.
    let eps = if xf == Format::F16 {
        2f32.powi(-10)
    } else {
        2f32.powi(-22)
    };
    let steps = if xf.is_quantized() {
        4.0
    } else {
        (k as f32).sqrt() * 2.0 + 2.0
    };
    for r in 0..m {
        for c in 0..n {
            let mag: f32 = (0..k)
                .map(|l| (x[r * k + l] * w[c * k + l]).abs())
                .sum::<f32>()
                + bias[c].abs()
                + 1.0;
            let tol = eps * steps * mag;
            let (g, e) = (got[r * n + c], want[r * n + c]);
            assert!(
                (g - e).abs() <= tol,
                "{target} {} {variant} tile {}x{}x{} m={m} n={n} k={k}: y[{r},{c}] = {g}, want {e} (tol {tol})",
                kernel.name,
                tile.ep,
                tile.hp,
                tile.lp
            );
        }
    }
}

fn shapes(seed: u64, count: usize, max_k: usize) -> Vec<(usize, usize, usize)> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..count)
        .map(|_| {
            (
                rng.gen_range(1..=23),
                rng.gen_range(1..=37),
                rng.gen_range(1..=max_k),
            )
        })
        .collect()
}

#[test]
fn detect_picks_the_best_runnable_target() {
    assert_eq!(NeonBackend::detect_name(), Some(runnable()[0]));
    // scripts/test-aarch64.sh names the target each emulated CPU must get.
    if let Ok(want) = std::env::var("TESSERA_EXPECT_TARGET") {
        assert_eq!(NeonBackend::detect_name(), Some(want.as_str()));
    }
}

#[test]
fn w4a8_every_target_group_and_tile() {
    for target in runnable() {
        for g in [
            Group::Size(32),
            Group::Size(64),
            Group::Size(128),
            Group::Row,
        ] {
            let kernel = with_weight_format(
                library::get("matmul-w4a8").unwrap(),
                Format::U4Asym(g, ParamType::F32),
            );
            for (i, tile) in tiles(target, &kernel, 4096).iter().enumerate() {
                for (s, (m, n, k)) in shapes(i as u64 * 7 + 1, 3, 300).into_iter().enumerate() {
                    check(target, &kernel, tile, Variant::Gemm, m, n, k, s as u64);
                }
            }
        }
    }
}

#[test]
fn w8a8_every_target() {
    for target in runnable() {
        for f in [
            Format::I8Sym(Group::Row, ParamType::F32),
            Format::I8Sym(Group::Size(64), ParamType::F32),
            Format::I8Asym(Group::Size(32), ParamType::F32),
        ] {
            let kernel = with_weight_format(library::get("matmul-w8a8").unwrap(), f);
            for tile in tiles(target, &kernel, 4096) {
                for (s, (m, n, k)) in shapes(11, 2, 200).into_iter().enumerate() {
                    check(target, &kernel, &tile, Variant::Gemm, m, n, k, s as u64);
                }
            }
        }
    }
}

#[test]
fn gemv_every_target() {
    for target in runnable() {
        for name in ["matmul-w4a8", "matmul-w8a8", "matmul-f32", "matmul-f16"] {
            let kernel = library::get(name).unwrap();
            for tile in gemv_tiles(target, &kernel) {
                for (s, (_, n, k)) in shapes(5, 3, 300).into_iter().enumerate() {
                    check(target, &kernel, &tile, Variant::Gemv, 1, n, k, s as u64);
                }
                check(target, &kernel, &tile, Variant::Gemv, 3, 17, 70, 9);
            }
        }
    }
}

#[test]
fn float_every_target() {
    for target in runnable() {
        for name in ["matmul-f32", "matmul-f16"] {
            let kernel = library::get(name).unwrap();
            for tile in tiles(target, &kernel, 4096) {
                for (s, (m, n, k)) in shapes(3, 2, 150).into_iter().enumerate() {
                    check(target, &kernel, &tile, Variant::Gemm, m, n, k, s as u64);
                }
            }
        }
    }
}

#[test]
fn long_reduction_k_11008() {
    for target in runnable() {
        let kernel = library::get("matmul-w4a8").unwrap();
        let tile = tiles(target, &kernel, 4096)[0];
        check(target, &kernel, &tile, Variant::Gemm, 3, 9, 11008, 1);
        let tile = tiles(target, &kernel, 1)[0];
        check(target, &kernel, &tile, Variant::Gemv, 1, 11, 11008, 2);
    }
    let kernel = library::get("matmul-f32").unwrap();
    let tile = tiles("aarch64-neon", &kernel, 4096)[0];
    check(
        "aarch64-neon",
        &kernel,
        &tile,
        Variant::Gemm,
        2,
        5,
        11008,
        3,
    );
}

/// Every NEON matmul format the flat-GEMM variant serves: (library kernel,
/// weight format override).
fn flat_formats() -> Vec<(&'static str, Option<Format>)> {
    vec![
        ("matmul-w4a8", None),
        (
            "matmul-w4a8",
            Some(Format::U4Asym(Group::Row, ParamType::F32)),
        ),
        ("matmul-w8a8", None),
        (
            "matmul-w8a8",
            Some(Format::I8Asym(Group::Size(32), ParamType::F32)),
        ),
        ("matmul-f32", None),
        ("matmul-f16", None),
    ]
}

fn flat_kernel(name: &str, f: Option<Format>) -> Kernel {
    let k = library::get(name).unwrap();
    match f {
        Some(f) => with_weight_format(k, f),
        None => k,
    }
}

/// The flat tile for M = `e` that the kernel's layout admits (what the
/// runtime and kernels-gen solve for).
fn flat_tile(target: &str, kernel: &Kernel, e: u64) -> TileConfig {
    let be = NeonBackend::new(target).unwrap();
    let class = mac_class(be.caps(), kernel).unwrap();
    let mut p = Problem::from_kernel(be.caps(), kernel).unwrap();
    p.e = e;
    assert_eq!(p.class, class);
    solve(be.caps(), &p)
        .unwrap()
        .into_iter()
        .find(|t| be.emit_variant(kernel, t, Variant::FlatGemm).is_ok())
        .unwrap()
}

/// The flat tile of `e` rows that packs its weights like the GEMM tile
/// (same hp and lp: one packed copy for both), where it differs from the
/// solver's flat tile and the emitter takes it: the `sdot` 8×4×4 (paired
/// steps) and the `smmla` 8×4×8 for 4-bit weights.
fn gemm_packed_flat_tile(target: &str, kernel: &Kernel, e: u64) -> Option<TileConfig> {
    let be = NeonBackend::new(target).unwrap();
    let gemm = tiles(target, kernel, 4096)[0];
    let flat = flat_tile(target, kernel, e);
    if (flat.hp, flat.lp) == (gemm.hp, gemm.lp) {
        return None;
    }
    let mut p = Problem::from_kernel(be.caps(), kernel).unwrap();
    p.e = e;
    solve(be.caps(), &p).unwrap().into_iter().find(|t| {
        (t.hp, t.lp) == (gemm.hp, gemm.lp) && be.emit_variant(kernel, t, Variant::FlatGemm).is_ok()
    })
}

/// Flat GEMM, every format, M = 1..16 with tails in M, N and K, at the
/// flat tile solved for M = 8 (the default), for M itself, and at the
/// GEMM's packing.
#[test]
fn flat_gemm_every_format_m_1_to_16() {
    for target in runnable() {
        for (name, f) in flat_formats() {
            let kernel = flat_kernel(name, f);
            let t8 = flat_tile(target, &kernel, 8);
            let shared = gemm_packed_flat_tile(target, &kernel, 8);
            // Grouped 4-bit weights: the sdot and smmla GEMMs pack at hp 4,
            // so the shared-packing flat tile must exist (and run) there.
            if name == "matmul-w4a8"
                && f.is_none()
                && (target.contains("dotprod") || target.contains("i8mm"))
            {
                assert!(
                    shared.is_some(),
                    "{target} {name}: no flat tile at the GEMM's packing"
                );
            }
            let mut rng = ChaCha8Rng::seed_from_u64(41);
            for m in 1..=16usize {
                let n = rng.gen_range(1..=37);
                let k = rng.gen_range(1..=200);
                check(target, &kernel, &t8, Variant::FlatGemm, m, n, k, m as u64);
                if let Some(t) = &shared {
                    check(target, &kernel, t, Variant::FlatGemm, m, n, k, m as u64 + 2);
                }
                let tm = flat_tile(target, &kernel, m as u64);
                if (tm.ep, tm.hp) != (t8.ep, t8.hp) {
                    check(
                        target,
                        &kernel,
                        &tm,
                        Variant::FlatGemm,
                        m,
                        n,
                        k,
                        m as u64 + 1,
                    );
                }
            }
        }
    }
}

/// Small K blocks (a few groups) so K-block boundaries, several row blocks
/// per pass and a second pass (m > 16) all happen at a small k.
#[test]
fn flat_gemm_k_blocks_and_passes() {
    for target in runnable() {
        let be = NeonBackend::new(target).unwrap();
        for (name, f) in flat_formats() {
            let kernel = flat_kernel(name, f);
            let default = flat_tile(target, &kernel, 8);
            let shared = gemm_packed_flat_tile(target, &kernel, 8);
            for tile in std::iter::once(default).chain(shared) {
                let plan = be.flat_plan(&kernel, &tile).unwrap();
                // At most ~3 groups (int8) or ~24 l (float) per K block.
                let small = (plan.step_bytes * 24).min(3 * 128 * plan.step_bytes / tile.lp);
                let code = machine(be.emit_flat(&kernel, &tile, small).unwrap());
                let mut rng = ChaCha8Rng::seed_from_u64(43);
                for m in [3usize, 9, 16, 17, 23, 40] {
                    let n = rng.gen_range(1..=29);
                    let k = rng.gen_range(100..=400);
                    check_code(target, &kernel, &tile, &code, m, n, k, m as u64);
                }
            }
        }
    }
}

/// The default K block at a Llama-sized reduction: more than one block of
/// 16 KiB per panel for the int8 and the float loops.
#[test]
fn flat_gemm_long_reduction() {
    for target in runnable() {
        for (name, f) in [("matmul-w4a8", None), ("matmul-f32", None)] {
            let kernel = flat_kernel(name, f);
            let default = flat_tile(target, &kernel, 8);
            let shared = gemm_packed_flat_tile(target, &kernel, 8);
            for tile in std::iter::once(default).chain(shared) {
                check(target, &kernel, &tile, Variant::FlatGemm, 5, 9, 11008, 1);
                check(target, &kernel, &tile, Variant::FlatGemm, 12, 6, 4100, 2);
            }
        }
    }
}

/// The compact formats: ggml's Q4_0, Q4_1 and Q8_0 blocks (f16 group
/// parameters; Q4_0's implied zero point 8 folded in int32), longer
/// groups, f16 parameters on the other int8 formats, and the grouped
/// Q4_0 formats with signed codes.
fn compact_formats() -> Vec<(Kernel, u32)> {
    let v = |name: &str, f: Format| with_weight_format(library::get(name).unwrap(), f);
    let mut formats = vec![
        (library::get("matmul-q4_0").unwrap(), 32),
        (library::get("matmul-q4_1").unwrap(), 32),
        (library::get("matmul-q8_0").unwrap(), 32),
        (
            v(
                "matmul-q4_0",
                Format::U4Sym(Group::Size(64), ParamType::F16),
            ),
            64,
        ),
        (
            v(
                "matmul-q4_1",
                Format::U4Asym(Group::Size(128), ParamType::F16),
            ),
            128,
        ),
        (
            v(
                "matmul-q4_0",
                Format::U4Sym(Group::Size(128), ParamType::F32),
            ),
            128,
        ),
        (
            v(
                "matmul-q8_0",
                Format::I8Sym(Group::Size(64), ParamType::F16),
            ),
            64,
        ),
        (
            v(
                "matmul-w8a8",
                Format::I8Asym(Group::Size(32), ParamType::F16),
            ),
            32,
        ),
        (
            v("matmul-q4_0", Format::U4Sym(Group::Row, ParamType::F16)),
            0,
        ),
    ];
    // The grouped `u4sym` formats again with their codes stored signed
    // (`signed-codes`, the layout NEON devices pack): another unpack and
    // epilogue in every loop.
    let signed: Vec<(Kernel, u32)> = formats
        .iter()
        .filter_map(|(k, g)| {
            let s = with_signed_codes(k).unwrap();
            (s != *k).then_some((s, *g))
        })
        .collect();
    assert_eq!(signed.len(), 3, "Q4_0 g32, g64 and g128 with signed codes");
    formats.extend(signed);
    formats
}

/// k for an odd number of groups of `g` with a partial last one (and a
/// partial last lp-step), and one shorter than a group; whole-row formats
/// (g = 0) get odd lengths.
fn compact_ks(g: usize) -> [usize; 3] {
    match g {
        0 => [7, 101, 300],
        g => [2 * g + 5, 4 * g + 17, g - 3],
    }
}

/// Every compact format on every runnable target and variant (GEMM at the
/// solver's tile and its neighbour, GEMV, flat GEMM at the M = 8 tile and
/// with K blocks of a few groups), tails in M, N and K.
#[test]
fn compact_formats_every_target_and_variant() {
    for target in runnable() {
        let be = NeonBackend::new(target).unwrap();
        for (kernel, g) in compact_formats() {
            let ks = compact_ks(g as usize);
            for tile in tiles(target, &kernel, 4096) {
                for (s, (m, n)) in [(13, 29), (4, 9), (23, 37)].into_iter().enumerate() {
                    check(target, &kernel, &tile, Variant::Gemm, m, n, ks[s], s as u64);
                }
            }
            for tile in gemv_tiles(target, &kernel) {
                for (s, (m, n)) in [(1, 37), (1, 8), (3, 17)].into_iter().enumerate() {
                    check(target, &kernel, &tile, Variant::Gemv, m, n, ks[s], s as u64);
                }
            }
            let tile = flat_tile(target, &kernel, 8);
            for (s, (m, n)) in [(2, 19), (7, 37), (16, 5)].into_iter().enumerate() {
                check(
                    target,
                    &kernel,
                    &tile,
                    Variant::FlatGemm,
                    m,
                    n,
                    ks[s],
                    s as u64,
                );
            }
            // The flat loop at the GEMM's packing (the sdot 8×4×4 with
            // paired steps, the smmla 8×4×8), where it differs.
            if let Some(t) = gemm_packed_flat_tile(target, &kernel, 8) {
                for (s, (m, n)) in [(3, 21), (8, 6)].into_iter().enumerate() {
                    check(
                        target,
                        &kernel,
                        &t,
                        Variant::FlatGemm,
                        m,
                        n,
                        ks[s],
                        s as u64,
                    );
                }
            }
            // K blocks of ~3 groups: block boundaries, several row blocks
            // per pass and a second pass.
            let plan = be.flat_plan(&kernel, &tile).unwrap();
            let group = if g == 0 { 32 } else { g };
            let small = 3 * group * plan.step_bytes / tile.lp;
            let code = machine(be.emit_flat(&kernel, &tile, small).unwrap());
            for (s, m) in [5usize, 17, 23].into_iter().enumerate() {
                let k = 7 * group as usize + 9;
                check_code(target, &kernel, &tile, &code, m, 11 + s, k, s as u64);
            }
        }
    }
}

/// The smull fallback's tiles with hp not a multiple of 4: the last
/// column block loads 1 or 3 f16 scales (`ldr h`; `ldr s` + `ld1 {h}[2]`).
#[test]
fn compact_formats_odd_panel_widths() {
    let target = "aarch64-neon";
    let be = NeonBackend::new(target).unwrap();
    let kernels = ["matmul-q8_0", "matmul-q4_0", "matmul-q4_1"]
        .map(|name| library::get(name).unwrap())
        .into_iter()
        .chain([with_signed_codes(&library::get("matmul-q4_0").unwrap()).unwrap()]);
    for kernel in kernels {
        let name = kernel.name.clone();
        let class = mac_class(be.caps(), &kernel).unwrap();
        let p = Problem::new(4096, 4096, 4096, class);
        let best = solve(be.caps(), &p).unwrap()[0];
        let mut widths = Vec::new();
        for t in neighbours(be.caps(), &p, &best, 64).unwrap() {
            if t.hp % 4 != 0 && !widths.contains(&(t.hp % 4)) && be.emit(&kernel, &t).is_ok() {
                widths.push(t.hp % 4);
                check(
                    target,
                    &kernel,
                    &t,
                    Variant::Gemm,
                    5,
                    2 * t.hp as usize + 3,
                    77,
                    1,
                );
            }
        }
        if name == "matmul-q8_0" {
            assert!(
                widths.iter().any(|w| w % 2 == 1),
                "{name}: no tile with an odd hp ({widths:?})"
            );
        }
    }
}

/// `kernel` with the epilogue activation `act`.
fn with_activation(mut k: Kernel, act: tessera_dsl::ir::Activation) -> Kernel {
    if let tessera_dsl::Op::Matmul(mm) = &mut k.op {
        mm.epilogue.activation = act;
    }
    k
}

/// The epilogue's relu runs in every variant on every target (tails in M,
/// N and K; half the outputs are clamped), and what NEON does not emit is
/// refused naming the field: silu, 4-bit weights without the pair
/// transpose, weights outside the CPU panel layout.
#[test]
fn epilogue_relu_every_target_and_variant_refusals_by_field() {
    use tessera_dsl::ir::Activation;
    for target in runnable() {
        for name in [
            "matmul-f32",
            "matmul-f16",
            "matmul-w4a8",
            "matmul-w8a8",
            "matmul-q4_0",
        ] {
            let kernel = with_activation(library::get(name).unwrap(), Activation::Relu);
            let gemv = tiles(target, &kernel, 1)[0];
            check(target, &kernel, &gemv, Variant::Gemv, 1, 37, 96, 1);
            check(target, &kernel, &gemv, Variant::Gemv, 3, 17, 64, 2);
            let flat = flat_tile(target, &kernel, 8);
            check(target, &kernel, &flat, Variant::FlatGemm, 7, 23, 160, 3);
            let gemm = tiles(target, &kernel, 4096)[0];
            check(target, &kernel, &gemm, Variant::Gemm, 19, 29, 96, 4);
            let listing = machine(
                NeonBackend::new(target)
                    .unwrap()
                    .emit(&kernel, &gemm)
                    .unwrap(),
            )
            .listing;
            assert!(
                listing.contains("fmaxnm"),
                "{target} {name}: no relu in the store"
            );

            let be = NeonBackend::new(target).unwrap();
            let silu = with_activation(library::get(name).unwrap(), Activation::Silu);
            let err = be.emit(&silu, &gemm).unwrap_err().to_string();
            assert!(err.contains("silu") && err.contains("activation"), "{err}");
        }
        let be = NeonBackend::new(target).unwrap();
        let mut plain = library::get("matmul-w4a8").unwrap();
        for t in &mut plain.tensors {
            if t.name == "w" {
                t.layout.int4_pair_transpose = false;
            }
        }
        let tile = tiles(target, &library::get("matmul-w4a8").unwrap(), 4096)[0];
        let err = be.emit(&plain, &tile).unwrap_err().to_string();
        assert!(err.contains("pair_transpose"), "{err}");
        let mut row_major = library::get("matmul-f32").unwrap();
        for t in &mut row_major.tensors {
            if t.name == "w" {
                t.layout = tessera_dsl::ir::Layout::row_major(&["h", "l"]);
            }
        }
        let tile = tiles(target, &library::get("matmul-f32").unwrap(), 4096)[0];
        let err = be.emit(&row_major, &tile).unwrap_err().to_string();
        assert!(err.contains("panel layout"), "{err}");
    }
}
