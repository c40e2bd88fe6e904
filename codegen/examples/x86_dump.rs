//! Print an x86 kernel's listing: `cargo run -p tessera-codegen --example x86_dump -- matmul-w4a8 [quant]`;
//! for an attention kernel (`attention-decode-kv8`, `attention-prefill-f16`) the form this CPU runs.
//! `TILE=4x16` (ep×hp, one of the solver's feasible tiles) and `VARIANT=flat-gemm`
//! pick a matmul tile and variant other than the solver's first and the GEMM;
//! `AVX512=1` solves on the `x86-avx512` target (the zmm kernels).
use tessera_codegen::artifact::Variant;
use tessera_codegen::tile::{Problem, solve};
use tessera_codegen::x86::{X86Backend, plan};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let kernel = tessera_dsl::library::get(&args[1]).unwrap();
    let b = X86Backend::detect().unwrap_or_default();
    if matches!(kernel.op, tessera_dsl::ir::Op::Attention(_)) {
        let blocks = tessera_codegen::artifact::PrefillBlocks::DEFAULT;
        print!("{}", b.attention(&kernel, blocks).unwrap().listing);
        return;
    }
    let caps = if std::env::var("AVX512").is_ok_and(|v| v == "1") {
        tessera_codegen::target::TargetCaps::by_name(tessera_codegen::x86::AVX512_NAME).unwrap()
    } else {
        plan::target()
    };
    let ranked = solve(caps, &Problem::from_kernel(caps, &kernel).unwrap()).unwrap();
    let tile = match std::env::var("TILE") {
        Ok(want) => *ranked
            .iter()
            .find(|t| format!("{}x{}", t.ep, t.hp) == want)
            .expect("TILE: not among the solver's feasible tiles"),
        Err(_) => ranked[0],
    };
    let variant = std::env::var("VARIANT")
        .map(|v| v.parse().expect("VARIANT: gemv, flat-gemm or gemm"))
        .unwrap_or(Variant::Gemm);
    let code = if args.get(2).is_some_and(|a| a == "quant") {
        b.emit_quantizer(&kernel, &tile).unwrap().unwrap()
    } else {
        b.emit_code_variant(&kernel, &tile, variant).unwrap()
    };
    print!("{}", code.listing);
}
