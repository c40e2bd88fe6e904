//! What `gen` writes is what the runtime runs: x86 machine code generated
//! for a small model, loaded as prebuilt kernels (no emitter involved at
//! load), runs a W4A8 `Linear` that matches the reference interpreter at
//! every variant's M, the flat range on its generated per-M steps.

use std::path::Path;
use std::sync::Arc;

use tessera_codegen::artifact::Arch;
use tessera_dsl::interp::{Bindings, Value, run};
use tessera_dsl::library;
use tessera_dsl::quant::quantize;
use tessera_kernels_gen::{GenConfig, ModelSpec, generate};
use tessera_runtime::manifest::{EmbeddedCode, EmbeddedKernel, Manifest};
use tessera_runtime::{Backend, Device, DeviceOptions, Linear, WeightFormat, Weights};

/// The generated files as the `kernels.rs` table would hold them (leaked
/// to `'static`, as `include_bytes!` data is).
fn table(dir: &Path, manifest: &Manifest) -> Vec<EmbeddedKernel> {
    let read = |f: &str| -> &'static [u8] { std::fs::read(dir.join(f)).unwrap().leak() };
    let text = |f: &str| -> &'static str {
        String::from_utf8(std::fs::read(dir.join(f)).unwrap())
            .unwrap()
            .leak()
    };
    let s = |v: &str| -> &'static str { v.to_string().leak() };
    manifest
        .entries
        .iter()
        .map(|e| EmbeddedKernel {
            kernel: s(&e.kernel),
            layer: s(&e.layer),
            n: e.n,
            k: e.k,
            format: s(&e.format),
            target: s(&e.target),
            variant: e.variant,
            tile: e.tile,
            m_min: e.m_min,
            m_max: e.m_max.unwrap_or(usize::MAX),
            code: match &e.listing {
                Some(l) => EmbeddedCode::Machine {
                    bytes: read(&e.file),
                    listing: text(l),
                    quantizer: e.quantizer.as_ref().map(|q| read(&q.file)),
                },
                None => EmbeddedCode::Source(text(&e.file)),
            },
            generator_version: s(&manifest.generator.version),
            template_hash: s(&manifest.generator.template_hash),
        })
        .collect()
}

#[test]
fn generated_x86_w4a8_kernels_run_a_linear_through_the_runtime() {
    if Arch::host() != Some(Arch::X86_64) || !tessera_codegen::x86::missing_features().is_empty() {
        eprintln!("SKIP: needs an x86-64 host with AVX2 and FMA to run x86-avx2 code");
        return;
    }
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("gen-runtime-x86");
    let _ = std::fs::remove_dir_all(&out);
    generate(&GenConfig::new(
        ["x86-avx2"],
        ModelSpec::named("tiny"),
        &out,
    ))
    .unwrap();
    let manifest = Manifest::from_json(
        &std::fs::read_to_string(out.join("manifest.json")).unwrap(),
        "m",
    )
    .unwrap();
    let generator = tessera_runtime::current_generator();
    manifest.check(&generator).unwrap();
    let table = table(&out, &manifest);
    let set = EmbeddedKernel::prebuilt_set(&table, "x86-avx2", "w4a8", generator);
    assert!(!set.kernels.is_empty());
    let dev = Arc::new(
        Device::open(
            Backend::HostX86,
            DeviceOptions {
                threads: Some(2),
                prebuilt: Some(set),
                ..Default::default()
            },
        )
        .unwrap(),
    );
    // tiny's `down` projection: [200, 328], tails for every tile.
    let (n, k) = (200, 328);
    let raw: Vec<f32> = (0..n * k)
        .map(|i| ((i * 37) % 101) as f32 / 101.0 - 0.45)
        .collect();
    let kernel = library::get("matmul-w4a8").unwrap();
    let format = kernel.tensor("w").unwrap().format;
    let q = quantize(format, n, k, &raw).unwrap();
    let bias: Vec<f32> = (0..n).map(|i| (i % 7) as f32 * 0.1 - 0.3).collect();
    let lin = Linear::new(
        &dev,
        WeightFormat::W4A8,
        Weights::Quant(&q),
        n,
        k,
        Some(&bias),
    )
    .unwrap();
    // The set holds the flat range's per-M steps: M rows below the flat
    // tile's ep run a kernel of M rows, the generated one.
    let plan = lin.plan();
    let flat = plan.plan(tessera_dsl::ir::Variant::FlatGemm).tile;
    assert!(flat[0] > 3, "{plan}");
    for m in 2..16 {
        if plan.variant_for(m) == tessera_dsl::ir::Variant::FlatGemm {
            let want = [(m as u32).min(flat[0]), flat[1], flat[2]];
            assert_eq!(plan.tile_for(m), want, "m={m}: {plan}");
            assert_eq!(lin.kernel_tile(m), Some(want), "m={m}: {plan}");
        }
    }
    for m in [1, 2, 3, 5, 8, 15, 33] {
        let x: Vec<f32> = (0..m * k)
            .map(|i| ((i * 13) % 29) as f32 / 29.0 - 0.5)
            .collect();
        let mut y = vec![0.0f32; m * n];
        lin.forward_f32(&x, m, &mut y).unwrap();
        let b = Bindings::new()
            .extent("e", m)
            .extent("h", n)
            .extent("l", k)
            .tensor("x", Value::F32(x.clone()))
            .tensor("w", Value::Quant(q.clone()))
            .tensor("bias", Value::F32(bias.clone()));
        let want = run(&kernel, &b).unwrap().get("y").unwrap().to_vec();
        for i in 0..want.len() {
            let tol = 1e-3 * (1.0 + want[i].abs());
            assert!(
                (y[i] - want[i]).abs() <= tol,
                "m={m} y[{i}] = {} want {}",
                y[i],
                want[i]
            );
        }
    }
}
