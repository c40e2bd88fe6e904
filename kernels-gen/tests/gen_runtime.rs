//! What `gen` writes is what the runtime runs: x86 machine code generated
//! for a small model, loaded as prebuilt kernels (no emitter involved at
//! load), runs a W4A8 `Linear` that matches the reference interpreter at
//! every variant's M, the flat range on its generated per-M steps, and the
//! `Attention` prefill through the generated whole-prefill kernel.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use half::f16;
use tessera_codegen::artifact::Arch;
use tessera_dsl::interp::{Bindings, Value, run};
use tessera_dsl::library;
use tessera_dsl::quant::quantize;
use tessera_kernels_gen::{GenConfig, ModelSpec, generate};
use tessera_runtime::manifest::{EmbeddedAttention, EmbeddedCode, EmbeddedKernel, Manifest};
use tessera_runtime::{
    Attention, Backend, Device, DeviceOptions, KvCache, KvCapacity, KvFormat, Linear, PrebuiltSet,
    WeightFormat, Weights,
};

/// `gen` for x86-avx2 and the tiny model into a fresh `folder`, and its
/// manifest (checked against this build's generator).
fn generate_tiny_x86(folder: &str) -> (PathBuf, Manifest) {
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(folder);
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
    manifest
        .check(&tessera_runtime::current_generator())
        .unwrap();
    (out, manifest)
}

/// The x86 device on two threads running only the prebuilt `set`.
fn x86_device(set: PrebuiltSet) -> Arc<Device> {
    let options = DeviceOptions {
        threads: Some(2),
        prebuilt: Some(set),
        ..Default::default()
    };
    Arc::new(Device::open(Backend::HostX86, options).unwrap())
}

/// A string as `'static` data, as `kernels.rs`'s literals are.
fn s(v: &str) -> &'static str {
    v.to_string().leak()
}

/// The bytes of generated file `f` in `dir`, leaked as `include_bytes!`
/// data is.
fn read(dir: &Path, f: &str) -> &'static [u8] {
    std::fs::read(dir.join(f)).unwrap().leak()
}

/// The attention entries as `kernels.rs`'s `ATTENTION` table would hold
/// them.
fn attention_table(dir: &Path, manifest: &Manifest) -> Vec<EmbeddedAttention> {
    manifest
        .attention
        .iter()
        .map(|a| EmbeddedAttention {
            kernel: s(&a.kernel),
            library: s(&a.library),
            kv: s(&a.kv),
            target: s(&a.target),
            heads: a.heads,
            kv_heads: a.kv_heads,
            head_dim: a.head_dim,
            head_dim_multiple: a.head_dim_multiple,
            prefill_blocks: a.prefill_blocks,
            every_head_state: a.every_head_state,
            code: EmbeddedCode::Machine {
                bytes: read(dir, &a.file),
                listing: "",
                quantizer: None,
            },
            generator_version: s(&manifest.generator.version),
            template_hash: s(&manifest.generator.template_hash),
        })
        .collect()
}

/// The generated files as the `kernels.rs` table would hold them (leaked
/// to `'static`, as `include_bytes!` data is).
fn table(dir: &Path, manifest: &Manifest) -> Vec<EmbeddedKernel> {
    let read = |f: &str| read(dir, f);
    let text = |f: &str| -> &'static str { std::str::from_utf8(read(f)).unwrap() };
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
    let (out, manifest) = generate_tiny_x86("gen-runtime-x86");
    let generator = tessera_runtime::current_generator();
    let table = table(&out, &manifest);
    let set = EmbeddedKernel::prebuilt_set(&table, "x86-avx2", "w4a8", generator);
    assert!(!set.kernels.is_empty());
    let dev = x86_device(set);
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

/// The generated x86 attention (decode and the whole prefill) loaded as
/// prebuilt kernels runs the runtime's `Attention` with no emitter: the
/// prefill in one call per thread, both against the interpreter.
#[test]
fn generated_x86_attention_prefills_whole_through_the_runtime() {
    if Arch::host() != Some(Arch::X86_64) || !tessera_codegen::x86::missing_features().is_empty() {
        eprintln!("SKIP: needs an x86-64 host with AVX2, FMA and F16C to run x86-avx2 code");
        return;
    }
    let (out, manifest) = generate_tiny_x86("gen-runtime-x86-attention");
    let generator = tessera_runtime::current_generator();
    let table = attention_table(&out, &manifest);
    let mut set = EmbeddedKernel::prebuilt_set(&[], "x86-avx2", "w4a8", generator);
    assert_eq!(set.add_attention(&table, "x86-avx2").unwrap(), 4);
    let dev = x86_device(set);
    // tiny: 5 query heads over 1 KV head of 40.
    let (hq, kvh, d, p, t) = (5, 1, 40, 3, 30);
    let att = Attention::new(&dev, hq, kvh, d, KvFormat::F16).unwrap();
    assert!(att.prefills_whole(), "the prebuilt x86 prefill kernel");
    let mut cache = KvCache::new(KvFormat::F16, kvh, d, KvCapacity::Max(64)).unwrap();
    let val = |i: usize, m: usize| ((i * m) % 97) as f32 / 97.0 - 0.5;
    let k: Vec<f32> = (0..(p + t) * kvh * d).map(|i| val(i, 31)).collect();
    let v: Vec<f32> = (0..(p + t) * kvh * d).map(|i| val(i, 17)).collect();
    cache.append(&k, &v, p + t).unwrap();
    let q: Vec<f16> = (0..t * hq * d).map(|i| f16::from_f32(val(i, 13))).collect();
    let mut o = vec![f16::ZERO; t * hq * d];
    att.prefill(&q, t, &cache, &mut o).unwrap();
    let half = |x: &[f32]| -> Vec<f16> { x.iter().map(|&x| f16::from_f32(x)).collect() };
    let b = Bindings::new()
        .extent("t", t)
        .extent("hq", hq)
        .extent("kvh", kvh)
        .extent("d", d)
        .extent("s", p + t)
        .tensor("q", Value::F16(q.clone()))
        .tensor("k", Value::F16(half(&k)))
        .tensor("v", Value::F16(half(&v)));
    let prefill = library::get("attention-prefill-f16").unwrap();
    let want = run(&prefill, &b).unwrap().get("o").unwrap().to_vec();
    for (i, (g, w)) in o.iter().zip(&want).enumerate() {
        let g = g.to_f32();
        assert!(
            (g - w).abs() <= 2e-3 * w.abs() + 2e-3,
            "o[{i}] = {g}, want {w}"
        );
    }
}
