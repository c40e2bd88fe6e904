//! The cranelift backend's listing (canonical IR text) pinned for a small
//! canonical kernel, a lowering panic surfacing as an error, and a timing
//! smoke (ignored: `cargo test -p tessera-codegen --release --test
//! clif_listing -- --ignored --nocapture`).

use std::time::Instant;

use cranelift_codegen::ir::types::{F16X8, I64};
use cranelift_codegen::ir::{
    AbiParam, Function, InstBuilder, MemFlagsData, Signature, UserFuncName,
};
use cranelift_codegen::isa::CallConv;
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use tessera_codegen::artifact::{Artifact, Backend};
use tessera_codegen::clif::{
    CLIF_X86, ClifBackend, DotLowering, compile_function, matmul, quantize,
};
use tessera_codegen::host::{HostInput, HostMatmul, HostOutput, HostTile, WeightsIn};
use tessera_codegen::tile::{Problem, solve};
use tessera_dsl::library;

/// matmul-f32 with the best tile of an 8-register cranelift budget.
#[test]
fn clif_listing_snapshot_matmul_f32() {
    let kernel = library::get("matmul-f32").unwrap();
    let caps = CLIF_X86.with_registers(8);
    let tile = solve(&caps, &Problem::from_kernel(&caps, &kernel).unwrap()).unwrap()[0];
    let func = matmul::build(&kernel, &tile, DotLowering::Pmaddwd, true).unwrap();
    let text = func.display().to_string();
    assert_eq!(
        text,
        matmul::build(&kernel, &tile, DotLowering::Pmaddwd, true)
            .unwrap()
            .display()
            .to_string()
    );
    insta::assert_snapshot!(format!("tile {}x{}x{}\n{text}", tile.ep, tile.hp, tile.lp));
}

#[test]
fn clif_listing_snapshot_quantizer() {
    let kernel = library::get("matmul-w8a8").unwrap();
    let tile = solve(
        &CLIF_X86,
        &Problem::from_kernel(&CLIF_X86, &kernel).unwrap(),
    )
    .unwrap()[0];
    let func = quantize::build(&kernel, &tile).unwrap();
    insta::assert_snapshot!(format!(
        "tile {}x{}x{}\n{}",
        tile.ep,
        tile.hp,
        tile.lp,
        func.display()
    ));
}

/// `fma` of f16x8 is one of the lowerings cranelift 0.135 does not handle;
/// whatever it does (panic or error), the backend returns an error.
#[test]
fn clif_lowering_failure_is_an_error_not_a_panic() {
    let backend = ClifBackend::host().unwrap();
    let mut sig = Signature::new(CallConv::SystemV);
    sig.params.push(AbiParam::new(I64));
    let mut func = Function::with_name_signature(UserFuncName::testcase("f16x8_fma"), sig);
    let mut ctx = FunctionBuilderContext::new();
    {
        let mut b = FunctionBuilder::new(&mut func, &mut ctx);
        let entry = b.create_block();
        b.append_block_params_for_function_params(entry);
        b.switch_to_block(entry);
        b.seal_block(entry);
        let p = b.block_params(entry)[0];
        let v = b.ins().load(F16X8, MemFlagsData::new(), p, 0);
        let r = b.ins().fma(v, v, v);
        b.ins().store(MemFlagsData::new(), r, p, 0);
        b.ins().return_(&[]);
        b.finalize(backend.isa().frontend_config());
    }
    let result = compile_function(backend.isa(), func);
    assert!(
        result.is_err(),
        "f16x8 fma compiled: {} bytes",
        result.map(|b| b.len()).unwrap_or(0)
    );
}

#[test]
fn clif_listing_is_the_ir_and_bytes_are_deterministic() {
    let backend = ClifBackend::host().unwrap();
    let kernel = library::get("matmul-w4a8").unwrap();
    let tile = backend.tiles(&kernel).unwrap()[0];
    let a = backend.emit(&kernel, &tile).unwrap();
    let b = backend.emit(&kernel, &tile).unwrap();
    assert_eq!(a, b);
    let Artifact::Machine(code) = a else {
        panic!("machine code expected")
    };
    assert!(
        code.listing.starts_with("function "),
        "{}",
        &code.listing[..80]
    );
    assert!(!code.bytes.is_empty());
}

fn time_matmul(m: usize, n: usize, k: usize, threads: usize) -> (f64, f64) {
    let backend = ClifBackend::host().unwrap();
    let kernel = library::get("matmul-f32").unwrap();
    let caps = backend.caps();
    let mut problem = Problem::from_kernel(caps, &kernel).unwrap();
    problem.e = m as u64;
    problem.h = n as u64;
    problem.l = k as u64;
    let tile = solve(caps, &problem).unwrap()[0];
    let Artifact::Machine(code) = backend.emit(&kernel, &tile).unwrap() else {
        unreachable!()
    };
    let host = HostMatmul::new(&kernel, HostTile::from(&tile), None, &code).unwrap();
    let x: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 * 0.1).collect();
    let w: Vec<f32> = (0..n * k).map(|i| (i % 5) as f32 * 0.1).collect();
    let bias = vec![0f32; n];
    let packed = host.pack_weights(n, k, WeightsIn::F32(&w)).unwrap();
    let mut y = vec![0f32; m * n];
    let mut best = f64::MAX;
    for _ in 0..3 {
        let t = Instant::now();
        host.run(
            HostInput::F32(&x),
            m,
            &packed,
            Some(&bias),
            HostOutput::F32(&mut y),
            threads,
        )
        .unwrap();
        best = best.min(t.elapsed().as_secs_f64());
    }
    eprintln!("  tile {}", tile.summary());
    (
        2.0 * (m * n * k) as f64 / best / 1e9,
        (n * k * 4) as f64 / best / 1e9,
    )
}

#[test]
#[ignore = "timing smoke, run by hand"]
fn clif_timing_smoke_f32() {
    for threads in [1, 2] {
        let (gflops, _) = time_matmul(512, 4096, 4096, threads);
        eprintln!("F32 GEMM M=512 N=K=4096 threads={threads}: {gflops:.1} GFLOP/s");
        let (gflops, gbs) = time_matmul(1, 4096, 4096, threads);
        eprintln!(
            "F32 GEMV M=1 N=K=4096 threads={threads}: {gflops:.1} GFLOP/s, {gbs:.1} GB/s of weights"
        );
    }
}

/// With dotprod, the i8 dot tree lowers to `sdot v.4s, v.16b, v.16b`
/// (encoding 0x4e809400 | Rm<<16 | Rn<<5 | Rd).
#[cfg(target_arch = "aarch64")]
#[test]
fn clif_int8_dot_lowers_to_sdot_on_aarch64() {
    let backend = ClifBackend::host().unwrap();
    if !backend.has_dotprod() {
        eprintln!("host has no dotprod; skipping");
        return;
    }
    let kernel = library::get("matmul-w8a8").unwrap();
    let tile = backend.tiles(&kernel).unwrap()[0];
    let Artifact::Machine(code) = backend.emit(&kernel, &tile).unwrap() else {
        unreachable!()
    };
    let sdots = code
        .bytes
        .chunks_exact(4)
        .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
        .filter(|&w| w & 0xffe0_fc00 == 0x4e80_9400)
        .count();
    assert!(sdots > 0, "no sdot in {} bytes", code.bytes.len());
}

/// The f32 GEMM loop of the solver's M = 512 tile keeps its accumulators
/// in registers on x86-64: the unrolled trip (the block with the most
/// fmas) has no stack access and no vector register move (regalloc2's
/// answer to the x86 fma overwriting a multiplicand depends on the loop's
/// shape, see `matmul::float_unroll`).
/// The disassembly of the hottest block (most MACs) of the cranelift f32
/// kernel for M×4096×4096 and `variant`, the MAC mnemonic, and the
/// tile's vectors per row.
#[cfg(target_arch = "x86_64")]
fn f32_hot_loop(
    m: u64,
    variant: tessera_codegen::artifact::Variant,
) -> (String, &'static str, usize) {
    use cranelift_codegen::Context;
    use cranelift_codegen::control::ControlPlane;

    let backend = ClifBackend::host().expect("backend");
    let kernel = library::get("matmul-f32").unwrap();
    let caps = backend.caps();
    let mut problem = Problem::from_kernel(caps, &kernel).unwrap();
    (problem.e, problem.h, problem.l) = (m, 4096, 4096);
    let tile = solve(caps, &problem).unwrap()[0];
    let fused = backend.has_flag("has_fma");
    let func = matmul::build_variant(&kernel, &tile, variant, DotLowering::Pmaddwd, fused).unwrap();
    let mut ctx = Context::for_function(func);
    ctx.set_disasm(true);
    let code = ctx
        .compile(backend.matmul_isa(), &mut ControlPlane::default())
        .expect("compile");
    let vcode = code.vcode.clone().expect("disassembly");
    let mac = if fused { "vfmadd" } else { "mulps" };
    let trip = vcode
        .split("\nblock")
        .max_by_key(|b| b.matches(mac).count())
        .unwrap()
        .to_string();
    (trip, mac, tile.hp as usize / 4)
}

/// Vector stack accesses in `trip`.
#[cfg(target_arch = "x86_64")]
fn vector_spills(trip: &str) -> Vec<&str> {
    trip.lines()
        .map(str::trim)
        .filter(|l| l.contains("%xmm") && l.contains("rsp"))
        .collect()
}

/// The GEMM loop (12 accumulators, each step an ep×hp/4 outer product of
/// fmas) has no stack access and no vector register move (regalloc2's
/// answer to the x86 fma overwriting a multiplicand depends on the loop's
/// shape, see `matmul::float_unroll`).
#[cfg(target_arch = "x86_64")]
#[test]
fn clif_gemm_f32_loop_has_no_spills_or_moves() {
    let (trip, mac, _) = f32_hot_loop(512, tessera_codegen::artifact::Variant::Gemm);
    assert!(trip.matches(mac).count() >= 2 * 12, "{trip}");
    assert_eq!(vector_spills(&trip), Vec::<&str>::new(), "{trip}");
    for line in trip.lines().map(str::trim) {
        let vector = line.contains("%xmm");
        let reg_move = vector && line.starts_with("mov") && !line.contains('(');
        let vreg_move = vector && line.starts_with("vmov") && !line.contains('(');
        assert!(
            !(reg_move || vreg_move),
            "`{line}` in the GEMM loop:\n{trip}"
        );
    }
}

/// The GEMV loop broadcasts x once per k step, not once per multiply
/// (one row: the weight vector is the operand the fma may overwrite), and
/// keeps its accumulators in registers.
#[cfg(target_arch = "x86_64")]
#[test]
fn clif_gemv_f32_loop_broadcasts_once_per_k_step() {
    let (trip, mac, vectors) = f32_hot_loop(1, tessera_codegen::artifact::Variant::Gemv);
    let macs = trip.matches(mac).count();
    let broadcasts = trip.matches("broadcast").count() + trip.matches("shufps").count();
    assert!(macs >= 2 * vectors, "{trip}");
    assert!(
        broadcasts * vectors <= macs,
        "{broadcasts} broadcasts for {macs} MACs of {vectors} per step:\n{trip}"
    );
    assert_eq!(vector_spills(&trip), Vec::<&str>::new(), "{trip}");
}
