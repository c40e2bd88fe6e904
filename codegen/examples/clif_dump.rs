//! Write the cranelift machine code of a matmul kernel to a file, for
//! `objdump -D -b binary -m i386:x86-64 FILE`:
//! `cargo run -p tessera-codegen --example clif_dump -- matmul-f32 1 4096 4096 /tmp/k.bin`
//! (`VARIANT=gemm|flat-gemm|gemv` picks the variant; flat GEMM by default;
//! `TILE=EPxHP` overrides the solver's ep and hp).
use tessera_codegen::artifact::{Artifact, Backend};
use tessera_codegen::clif::ClifBackend;
use tessera_codegen::tile::{Problem, solve};

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let kernel = tessera_dsl::library::get(&a[1]).expect("kernel");
    let backend = ClifBackend::host().expect("backend");
    let caps = backend.caps();
    let mut p = Problem::from_kernel(caps, &kernel).expect("problem");
    p.e = a[2].parse().expect("m");
    p.h = a[3].parse().expect("n");
    p.l = a[4].parse().expect("k");
    let mut tile = solve(caps, &p).expect("solve")[0];
    if let Some((ep, hp)) = std::env::var("TILE").ok().and_then(|t| {
        let (a, b) = t.split_once('x')?;
        Some((a.parse().ok()?, b.parse().ok()?))
    }) {
        (tile.ep, tile.hp) = (ep, hp);
    }
    let variant = std::env::var("VARIANT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(tessera_codegen::artifact::Variant::FlatGemm);
    let Artifact::Machine(code) = backend.emit_variant(&kernel, &tile, variant).expect("emit")
    else {
        return;
    };
    std::fs::write(&a[5], &code.bytes).expect("write");
    println!("{} bytes, tile {}", code.bytes.len(), tile.summary());
}
