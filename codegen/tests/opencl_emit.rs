//! OpenCL C emission: every kernel × variant × precision mode prints, the
//! native-half programs pass `clang -cl-std=CL2.0 -fsyntax-only` with
//! cl_khr_fp16 (PoCL cannot build them), and a canonical set is pinned by
//! insta snapshots.

use std::io::Write as _;
use std::process::Command;

use tessera_codegen::artifact::{Backend, EmitError, Variant};
use tessera_codegen::gpu::{self, WeightMemory};
use tessera_codegen::opencl::{self, Fp16Mode, OpenClBackend};
use tessera_codegen::{Problem, TileConfig, solve};
use tessera_dsl::{Format, Kernel, library};

/// The solver's best tile for `kernel` at `e` rows on the OpenCL target.
fn tile(kernel: &Kernel, e: u64) -> TileConfig {
    let caps = opencl::caps();
    let mut p = Problem::from_kernel(caps, kernel).unwrap();
    p.e = e;
    solve(caps, &p).unwrap().remove(0)
}

fn rows(v: Variant) -> u64 {
    match v {
        Variant::Gemv => 1,
        Variant::FlatGemm => 8,
        Variant::Gemm => 4096,
    }
}

/// The GPU matmul kernels: the library's A16 kernels and f16 weights in the
/// GPU layout.
fn matmuls() -> Vec<Kernel> {
    let mut v: Vec<Kernel> = library::gpu_matmul_names()
        .iter()
        .map(|n| library::get(n).unwrap())
        .collect();
    v.push(gpu::with_gpu_weight_layout(&library::get("matmul-f16").unwrap()).unwrap());
    v
}

fn attentions() -> Vec<Kernel> {
    ["attention-decode-f16", "attention-decode-kv8"]
        .iter()
        .map(|n| library::get(n).unwrap())
        .collect()
}

/// Every (name, source) the backend emits, both modes, both weight memories.
fn all_sources(mode: Fp16Mode) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for k in matmuls() {
        for v in Variant::ALL {
            let t = tile(&k, rows(v));
            let be = OpenClBackend::new(mode);
            out.push((
                format!("{}-{v}", k.name),
                be.emit_variant(&k, &t, v).unwrap().to_string(),
            ));
            if v == Variant::Gemv && k.tensor("w").unwrap().format != Format::F16 {
                let be = be.with_weights(WeightMemory::Image);
                out.push((
                    format!("{}-{v}-image", k.name),
                    be.emit_variant(&k, &t, v).unwrap().to_string(),
                ));
            }
        }
    }
    for k in attentions() {
        let be = OpenClBackend::new(mode);
        let src = be.attention_program(&k).unwrap().source().to_string();
        out.push((k.name.clone(), src));
    }
    // The prefill programs, one per head dim: the smallest key block (256)
    // and the largest (64).
    for name in ["attention-prefill-f16", "attention-prefill-kv8"] {
        let k = library::get(name).unwrap();
        for d in [64, 256] {
            let src = OpenClBackend::new(mode)
                .prefill_program(&k, d)
                .unwrap()
                .source()
                .to_string();
            out.push((format!("{name}-d{d}"), src));
        }
    }
    out
}

/// clang, or None after a SKIP (a failure under CI) naming `check`.
fn clang(check: &str) -> Option<&'static str> {
    let found = Command::new("clang")
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|_| "clang");
    if found.is_none() {
        tessera_dsl::testing::missing_tool(check, "clang not installed");
    }
    found
}

fn clang_check(name: &str, src: &str, fp16: bool) -> Result<(), String> {
    let dir = std::env::temp_dir().join(format!("tessera-opencl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let path = dir.join(format!("{name}-{fp16}.cl"));
    std::fs::File::create(&path)
        .and_then(|mut f| f.write_all(src.as_bytes()))
        .map_err(|e| e.to_string())?;
    let mut cmd = Command::new("clang");
    cmd.args([
        "-x",
        "cl",
        "-cl-std=CL2.0",
        "-fsyntax-only",
        "-Werror",
        "-Xclang",
        "-finclude-default-header",
    ]);
    if fp16 {
        cmd.arg("-Xclang").arg("-cl-ext=+cl_khr_fp16");
    }
    let out = cmd.arg(&path).output().map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{name}: clang rejected the source:\n{}\n{src}",
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

#[test]
fn native_half_programs_are_valid_opencl_c() {
    if clang("native_half_programs_are_valid_opencl_c").is_none() {
        return;
    }
    let sources = all_sources(Fp16Mode::Native);
    assert!(sources.len() >= 17);
    for (name, src) in &sources {
        assert!(
            src.contains("#pragma OPENCL EXTENSION cl_khr_fp16 : enable"),
            "{name}"
        );
        clang_check(name, src, true).unwrap();
    }
}

#[test]
fn storage_programs_are_valid_without_fp16() {
    if clang("storage_programs_are_valid_without_fp16").is_none() {
        return;
    }
    for (name, src) in &all_sources(Fp16Mode::Storage) {
        assert!(
            !src.contains("#pragma OPENCL EXTENSION cl_khr_fp16"),
            "{name}"
        );
        clang_check(name, src, false).unwrap();
    }
}

#[test]
fn gemv_w4a16_has_a_kernel_and_the_bit_tricks() {
    let k = library::get("matmul-w4a16").unwrap();
    let t = tile(&k, 1);
    let src = OpenClBackend::default()
        .emit_variant(&k, &t, Variant::Gemv)
        .unwrap()
        .to_string();
    assert!(src.contains("__kernel"));
    assert!(src.contains("const uint4 p = w["), "one 128-bit load");
    assert!(
        src.contains("0x4b000000u"),
        "int4 by OR-ing a magic exponent"
    );
    let e = library::get("matmul-e0m4a16").unwrap();
    let native = OpenClBackend::new(Fp16Mode::Native)
        .emit_variant(&e, &t, Variant::Gemv)
        .unwrap()
        .to_string();
    assert!(native.contains("as_half4((convert_ushort4(n) << (ushort4)(6)) | (ushort4)(0x4000))"));
}

#[test]
fn emission_is_deterministic() {
    assert_eq!(
        all_sources(Fp16Mode::Storage),
        all_sources(Fp16Mode::Storage)
    );
}

#[test]
fn bad_inputs_are_errors() {
    let be = OpenClBackend::default();
    // CPU layout weights: a clear error pointing at the layout pass.
    let f16 = library::get("matmul-f16").unwrap();
    let t = tile(matmuls().last().unwrap(), 1);
    let err = be.emit_variant(&f16, &t, Variant::Gemv).unwrap_err();
    assert!(matches!(err, EmitError::Unsupported { .. }));
    assert!(err.to_string().contains("GPU layout"), "{err}");
    // int8 activations have no GPU path.
    let w4a8 = library::get("matmul-w4a8").unwrap();
    assert!(be.emit_variant(&w4a8, &t, Variant::Gemv).is_err());
    // Prefill attention is not a decode kernel.
    let prefill = library::get("attention-prefill-f16").unwrap();
    assert!(be.attention_program(&prefill).is_err());
    // A CPU tile has no block.
    let caps = tessera_codegen::TargetCaps::by_name("aarch64-neon").unwrap();
    let w4 = library::get("matmul-w4a16").unwrap();
    let cpu_tile = solve(caps, &Problem::from_kernel(caps, &w4).unwrap())
        .unwrap()
        .remove(0);
    assert!(matches!(
        be.emit_variant(&w4, &cpu_tile, Variant::Gemm),
        Err(EmitError::BadTile { .. })
    ));
    // f16 weights cannot sit in an image.
    let img = be.with_weights(WeightMemory::Image);
    assert!(
        img.emit_variant(matmuls().last().unwrap(), &t, Variant::Gemv)
            .is_err()
    );
}

#[test]
fn snapshots_of_the_canonical_set() {
    let w4 = library::get("matmul-w4a16").unwrap();
    let e0 = library::get("matmul-e0m4a16").unwrap();
    let w8 = library::get("matmul-w8a16").unwrap();
    let storage = OpenClBackend::new(Fp16Mode::Storage);
    let native = OpenClBackend::new(Fp16Mode::Native);
    let cases: Vec<(&str, String)> = vec![
        (
            "w4a16_gemv_storage",
            storage
                .emit_variant(&w4, &tile(&w4, 1), Variant::Gemv)
                .unwrap()
                .to_string(),
        ),
        (
            "w4a16_gemv_image_native",
            native
                .with_weights(WeightMemory::Image)
                .emit_variant(&w4, &tile(&w4, 1), Variant::Gemv)
                .unwrap()
                .to_string(),
        ),
        (
            "e0m4a16_gemv_native",
            native
                .emit_variant(&e0, &tile(&e0, 1), Variant::Gemv)
                .unwrap()
                .to_string(),
        ),
        (
            "w8a16_flat_gemm_storage",
            storage
                .emit_variant(&w8, &tile(&w8, 8), Variant::FlatGemm)
                .unwrap()
                .to_string(),
        ),
        (
            "w4a16_gemm_storage",
            storage.emit(&w4, &tile(&w4, 4096)).unwrap().to_string(),
        ),
        (
            "attention_decode_kv8_storage",
            storage
                .attention_program(&library::get("attention-decode-kv8").unwrap())
                .unwrap()
                .source()
                .to_string(),
        ),
        (
            "attention_decode_f16_native",
            native
                .attention_program(&library::get("attention-decode-f16").unwrap())
                .unwrap()
                .source()
                .to_string(),
        ),
        (
            "attention_prefill_kv8_storage_d128",
            storage
                .prefill_program(&library::get("attention-prefill-kv8").unwrap(), 128)
                .unwrap()
                .source()
                .to_string(),
        ),
    ];
    for (name, src) in cases {
        insta::assert_snapshot!(format!("opencl_{name}"), src);
    }
}
