//! `u4sym` weights stored as signed codes (the layout's `signed-codes`):
//! what the NEON pass changes and leaves alone, and that every backend
//! whose loops read unsigned codes refuses them by the field's name
//! instead of misreading them. (NEON runs them: `tests/neon_run.rs` and
//! the runtime's tests, under qemu.)

use tessera_codegen::artifact::{Backend, EmitError, Variant};
use tessera_codegen::clif::ClifBackend;
use tessera_codegen::neon::{NeonBackend, with_signed_codes};
use tessera_codegen::opencl::{self, Fp16Mode, OpenClBackend};
use tessera_codegen::ptx::{PtxBackend, Sm};
use tessera_codegen::target::TargetCaps;
use tessera_codegen::tile::{Problem, TileConfig, solve};
use tessera_codegen::x86::X86Backend;
use tessera_dsl::{Format, Group, Kernel, ParamType, library};

fn weight_layout(k: &Kernel) -> &tessera_dsl::Layout {
    &k.tensor("w").unwrap().layout
}

fn first_tile(caps: &TargetCaps, k: &Kernel) -> TileConfig {
    solve(caps, &Problem::from_kernel(caps, k).unwrap()).unwrap()[0]
}

fn assert_refused(what: &str, r: Result<impl std::fmt::Debug, EmitError>) {
    match r {
        Err(EmitError::Unsupported { what: why, .. }) => assert!(
            why.contains("int4_signed_codes"),
            "{what}: the refusal must name the field: {why}"
        ),
        other => panic!("{what}: expected a refusal naming int4_signed_codes, got {other:?}"),
    }
}

#[test]
fn the_pass_marks_grouped_u4sym_only() {
    let q4 = library::get("matmul-q4_0").unwrap();
    let signed = with_signed_codes(&q4).unwrap();
    assert!(weight_layout(&signed).int4_signed_codes);
    assert!(!weight_layout(&q4).int4_signed_codes);
    // Idempotent; everything else but the flag is the library kernel.
    assert_eq!(with_signed_codes(&signed).unwrap(), signed);
    let mut back = signed.clone();
    for t in &mut back.tensors {
        t.layout.int4_signed_codes = false;
    }
    assert_eq!(back, q4);
    // Other weight formats and whole-row groups come back unchanged.
    for name in ["matmul-w4a8", "matmul-q4_1", "matmul-q8_0", "matmul-f32"] {
        let k = library::get(name).unwrap();
        assert_eq!(with_signed_codes(&k).unwrap(), k, "{name}");
    }
    let mut row = q4.clone();
    for t in &mut row.tensors {
        if t.name == "w" {
            t.format = Format::U4Sym(Group::Row, ParamType::F16);
        }
    }
    assert_eq!(with_signed_codes(&row).unwrap(), row);
}

#[test]
fn neon_refuses_signed_codes_with_whole_row_groups() {
    let mut row = with_signed_codes(&library::get("matmul-q4_0").unwrap()).unwrap();
    for t in &mut row.tensors {
        if t.name == "w" {
            t.format = Format::U4Sym(Group::Row, ParamType::F16);
        }
    }
    tessera_dsl::verify(&row).unwrap();
    for target in ["aarch64-i8mm", "aarch64-dotprod", "aarch64-neon"] {
        let be = NeonBackend::new(target).unwrap();
        let tile = first_tile(be.caps(), &row);
        assert_refused(target, be.emit_variant(&row, &tile, Variant::Gemm));
    }
}

#[test]
fn unsigned_code_backends_refuse_signed_codes() {
    let signed = with_signed_codes(&library::get("matmul-q4_0").unwrap()).unwrap();
    for x86 in [
        X86Backend::default(),
        X86Backend {
            vnni: true,
            avx512: true,
            avx512_vnni: true,
            ..X86Backend::default()
        },
    ] {
        for variant in Variant::ALL {
            let tile = first_tile(x86.target(&signed, variant), &signed);
            assert_refused("x86", x86.emit_variant(&signed, &tile, variant));
            assert_refused("x86 quantizer", x86.emit_quantizer(&signed, &tile));
        }
    }
    let clif = ClifBackend::host().unwrap();
    let tile = first_tile(clif.caps(), &signed);
    assert_refused(
        "cranelift",
        clif.emit_variant(&signed, &tile, Variant::Gemm),
    );
    // The GPU layout pass writes a fresh (unsigned) layout; a kernel that
    // asks for signed codes in the GPU layout is refused.
    assert!(
        !weight_layout(&tessera_codegen::gpu::with_gpu_weight_layout(&signed).unwrap())
            .int4_signed_codes
    );
    let mut gpu = library::get("matmul-q4_0a16").unwrap();
    if !tessera_dsl::library::has_gpu_weight_layout(&gpu) {
        gpu = tessera_codegen::gpu::with_gpu_weight_layout(&gpu).unwrap();
    }
    for t in &mut gpu.tensors {
        if t.name == "w" {
            t.layout.int4_signed_codes = true;
        }
    }
    tessera_dsl::verify(&gpu).unwrap();
    let ptx = PtxBackend::new(Sm::Sm80);
    let tile = first_tile(Sm::Sm80.caps(), &gpu);
    assert_refused("ptx", ptx.emit_variant(&gpu, &tile, Variant::Gemv));
    let cl = OpenClBackend::new(Fp16Mode::Storage);
    let tile = first_tile(opencl::caps(), &gpu);
    assert_refused("opencl", cl.emit_variant(&gpu, &tile, Variant::Gemv));
}
