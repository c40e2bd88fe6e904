//! Prebuilt decode attention: an `ATTENTION` table shaped exactly as the
//! `kernels.rs` of `tessera-kernels-gen` writes it (host machine code from
//! cranelift, OpenCL C from the OpenCL backend), loaded with
//! `PrebuiltSet::add_attention`, and run by `Attention` on a device opened
//! with that set: host code through `HostAttention`, OpenCL source built
//! instead of a generated program (a broken prebuilt source fails the
//! build, which shows it is the one used). Checked against the reference
//! interpreter.

#![cfg(feature = "jit")]

use std::sync::Arc;

use half::f16;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tessera_codegen::artifact::{Artifact, Backend as _};
use tessera_codegen::clif::ClifBackend;
use tessera_dsl::interp::{Bindings, Value, run};
use tessera_dsl::library;
use tessera_dsl::quant::quantize;
use tessera_runtime::manifest::{EmbeddedAttention, EmbeddedCode};
use tessera_runtime::{
    Attention, Backend, Device, DeviceOptions, KvCache, KvCapacity, KvFormat, PrebuiltSet,
    current_generator,
};

/// PoCL's compiler is not safe to drive from several contexts at once.
#[cfg(feature = "opencl")]
static CL_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

const KV: [(&str, &str, KvFormat); 2] = [
    ("f16", "attention-decode-f16", KvFormat::F16),
    ("kv8", "attention-decode-kv8", KvFormat::Kv8),
];

fn entry(kv: &str, library_name: &str, target: &str, code: EmbeddedCode) -> EmbeddedAttention {
    let g = current_generator();
    EmbeddedAttention {
        kernel: leak(format!("{}_{target}", library_name.replace('-', "_"))),
        library: leak(library_name.to_string()),
        kv: leak(kv.to_string()),
        target: leak(target.to_string()),
        heads: 4,
        kv_heads: 2,
        head_dim: 16,
        head_dim_multiple: 1,
        prefill_blocks: None,
        every_head_state: false,
        code,
        generator_version: leak(g.version),
        template_hash: leak(g.template_hash),
    }
}

/// The table `kernels.rs` would embed for targets `host` and `opencl`.
fn table() -> Vec<EmbeddedAttention> {
    let clif = ClifBackend::host().unwrap();
    let any = library::get("matmul-f32").unwrap();
    let tile = clif.tiles(&any).unwrap()[0];
    let mut out = Vec::new();
    for (kv, name, _) in KV {
        let kernel = library::get(name).unwrap();
        let Artifact::Machine(code) = clif.emit(&kernel, &tile).unwrap() else {
            panic!("cranelift emitted source");
        };
        out.push(entry(
            kv,
            name,
            "host",
            EmbeddedCode::Machine {
                bytes: Box::leak(code.bytes.into_boxed_slice()),
                listing: "",
                quantizer: None,
            },
        ));
        let program =
            tessera_codegen::opencl::OpenClBackend::new(tessera_codegen::opencl::Fp16Mode::Storage)
                .attention_program(&kernel)
                .unwrap();
        out.push(entry(
            kv,
            name,
            "opencl",
            EmbeddedCode::Source(leak(program.source().to_string())),
        ));
    }
    out
}

fn reference(format: KvFormat, q: &[f16], kd: &[f32], vd: &[f32], s: usize) -> Vec<f32> {
    let (hq, kvh, d) = (4, 2, 16);
    let kernel = library::get(format.kernel_name()).unwrap();
    let cache = |f: tessera_dsl::Format, data: &[f32]| match f {
        tessera_dsl::Format::F16 => Value::F16(data.iter().map(|&v| f16::from_f32(v)).collect()),
        f => Value::Quant(quantize(f, s * kvh, d, data).unwrap()),
    };
    let b = Bindings::decode_attention(
        [hq, kvh, d, s],
        Value::F16(q.to_vec()),
        cache(format.key_format(), kd),
        cache(format.value_format(), vd),
    );
    run(&kernel, &b).unwrap().get("o").unwrap().to_vec()
}

/// Decode over 70 tokens (two 64-key splits, chunked growth) and compare.
fn check_decode(dev: &Arc<Device>, format: KvFormat, rng: &mut ChaCha8Rng) {
    let (hq, kvh, d, s) = (4, 2, 16, 70);
    let att = Attention::new(dev, hq, kvh, d, format).unwrap();
    let mut cache = KvCache::for_device(dev, format, kvh, d, KvCapacity::Chunked(32)).unwrap();
    let kd: Vec<f32> = (0..s * kvh * d).map(|_| rng.gen_range(-1.5..1.5)).collect();
    let vd: Vec<f32> = (0..s * kvh * d).map(|_| rng.gen_range(-2.0..2.0)).collect();
    cache.append(&kd, &vd, s).unwrap();
    let q: Vec<f16> = (0..hq * d)
        .map(|_| f16::from_f32(rng.gen_range(-1.0..1.0)))
        .collect();
    let mut o = vec![f16::ZERO; hq * d];
    att.decode(&q, &cache, &mut o).unwrap();
    let want = reference(format, &q, &kd, &vd, s);
    for (i, (g, &w)) in o.iter().zip(&want).enumerate() {
        let g = g.to_f32();
        assert!(
            (g - w).abs() <= 4e-3 * w.abs() + 2e-3,
            "{:?} on {} at {i}: got {g} want {w}",
            format,
            dev.backend()
        );
    }
}

#[test]
fn host_machine_code_from_the_attention_table_runs_without_jit() {
    let table = table();
    let mut set = PrebuiltSet::new(current_generator());
    assert_eq!(set.add_attention(&table, "host").unwrap(), 2);
    assert_eq!(set.add_attention(&table, "host").unwrap(), 0, "kept once");
    assert!(set.attention("attention-decode-kv8").is_some());
    assert!(set.sources.is_empty(), "host entries are machine code");
    let dev = Arc::new(
        Device::open(
            Backend::HostClif,
            DeviceOptions {
                threads: Some(2),
                prebuilt: Some(set),
                ..Default::default()
            },
        )
        .unwrap(),
    );
    let mut rng = ChaCha8Rng::seed_from_u64(31);
    for (_, _, format) in KV {
        check_decode(&dev, format, &mut rng);
    }
    // A set without attention says so instead of JIT-compiling one.
    let bare = Arc::new(
        Device::open(
            Backend::HostClif,
            DeviceOptions {
                prebuilt: Some(PrebuiltSet::new(current_generator())),
                ..Default::default()
            },
        )
        .unwrap(),
    );
    let e = Attention::new(&bare, 4, 2, 16, KvFormat::F16).unwrap_err();
    assert!(e.to_string().contains("not in the prebuilt set"), "{e}");
}

#[test]
fn entries_of_another_generator_are_refused() {
    let mut table = table();
    table[0].template_hash = "0000";
    let mut set = PrebuiltSet::new(current_generator());
    let e = set.add_attention(&table, "host").unwrap_err();
    assert!(e.to_string().contains("0000"), "{e}");
}

#[cfg(feature = "opencl")]
#[test]
fn opencl_source_from_the_attention_table_is_the_program_built() {
    let _guard = CL_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let table = table();
    let mut set = PrebuiltSet::new(current_generator());
    assert_eq!(set.add_attention(&table, "opencl").unwrap(), 2);
    assert_eq!(set.sources.len(), 2);
    let open = |set: PrebuiltSet| {
        Device::open(
            Backend::OpenCl,
            DeviceOptions {
                prebuilt: Some(set),
                ..Default::default()
            },
        )
        .map(Arc::new)
    };
    let dev = match open(set.clone()) {
        Ok(d) => d,
        Err(e) => {
            tessera_dsl::testing::missing_tool(
                "opencl prebuilt attention",
                &format!("no OpenCL platform (PoCL): {e}"),
            );
            return;
        }
    };
    let mut rng = ChaCha8Rng::seed_from_u64(32);
    for (_, _, format) in KV {
        check_decode(&dev, format, &mut rng);
    }
    drop(dev);
    // A prebuilt source that does not compile fails Attention::new with the
    // build log: the device builds the prebuilt text, not its own.
    let mut broken = set.clone();
    for s in &mut broken.sources {
        s.text.push_str("\n#error prebuilt source was built\n");
    }
    let dev = open(broken).unwrap();
    let e = Attention::new(&dev, 4, 2, 16, KvFormat::F16).unwrap_err();
    assert!(e.to_string().contains("prebuilt source was built"), "{e}");
    drop(dev);
    // A source for another entry point is refused before any build.
    let mut wrong = set;
    for s in &mut wrong.sources {
        s.text = "__kernel void something_else(void) {}".into();
    }
    let dev = open(wrong).unwrap();
    let e = Attention::new(&dev, 4, 2, 16, KvFormat::F16).unwrap_err();
    assert!(e.to_string().contains("has no entry"), "{e}");
}

/// OpenCL matmul text from a `KERNELS` table: used when its header names
/// the tile the device plans (a broken one fails its build, and the device
/// falls back to the next solver tile it can build itself).
#[cfg(feature = "opencl")]
#[test]
fn opencl_matmul_sources_from_the_kernel_table_are_tried_first() {
    let _guard = CL_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    use tessera_codegen::tile::{Problem, solve};
    use tessera_dsl::ir::Variant;
    use tessera_runtime::manifest::EmbeddedKernel;
    use tessera_runtime::{Linear, WeightFormat, Weights};

    let (n, k) = (40, 96);
    let kernel =
        tessera_codegen::gpu::with_gpu_weight_layout(&library::get("matmul-w4a16").unwrap())
            .unwrap();
    let caps = tessera_codegen::opencl::caps();
    let backend =
        tessera_codegen::opencl::OpenClBackend::new(tessera_codegen::opencl::Fp16Mode::Storage);
    let g = current_generator();
    let mut table = Vec::new();
    for (variant, m) in [
        (Variant::Gemv, 1),
        (Variant::FlatGemm, 8),
        (Variant::Gemm, 128),
    ] {
        let mut p = Problem::from_kernel(caps, &kernel).unwrap();
        (p.e, p.h, p.l) = (m, n as u64, k as u64);
        let tile = solve(caps, &p).unwrap()[0];
        let program = backend.program(&kernel, &tile, variant).unwrap();
        table.push(EmbeddedKernel {
            kernel: leak(format!("w4a16_{variant}")),
            layer: "t",
            n,
            k,
            format: "w4a16",
            target: "opencl",
            variant,
            tile: [tile.ep, tile.hp, tile.lp],
            m_min: 1,
            m_max: usize::MAX,
            code: EmbeddedCode::Source(leak(format!(
                "{}\n#error prebuilt matmul was built\n",
                program.source()
            ))),
            generator_version: leak(g.version.clone()),
            template_hash: leak(g.template_hash.clone()),
        });
    }
    let mut set = PrebuiltSet::new(current_generator());
    assert_eq!(
        set.add_matmul_sources(&table, "opencl", "w4a16").unwrap(),
        3
    );
    let dev = match Device::open(
        Backend::OpenCl,
        DeviceOptions {
            prebuilt: Some(set),
            ..Default::default()
        },
    ) {
        Ok(d) => Arc::new(d),
        Err(e) => {
            tessera_dsl::testing::missing_tool(
                "opencl prebuilt matmul",
                &format!("no OpenCL platform (PoCL): {e}"),
            );
            return;
        }
    };
    let w = vec![0.125f32; n * k];
    let lin = Linear::new(&dev, WeightFormat::W4A16, Weights::F32(&w), n, k, None).unwrap();
    for (v, e) in lin.plan().variants.iter().zip(&table) {
        assert_ne!(
            v.tile, e.tile,
            "{}: the broken prebuilt tile was skipped for one the device built",
            v.variant
        );
    }
}
