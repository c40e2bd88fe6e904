//! Print an x86 kernel's listing: `cargo run -p tessera-codegen --example x86_dump -- matmul-w4a8 [quant]`;
//! for an attention kernel (`attention-decode-kv8`, `attention-prefill-f16`) the form this CPU runs.
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
    let caps = plan::target();
    let tile = solve(caps, &Problem::from_kernel(caps, &kernel).unwrap()).unwrap()[0];
    let code = if args.get(2).is_some_and(|a| a == "quant") {
        b.emit_quantizer(&kernel, &tile).unwrap().unwrap()
    } else {
        b.emit_code(&kernel, &tile).unwrap()
    };
    print!("{}", code.listing);
}
