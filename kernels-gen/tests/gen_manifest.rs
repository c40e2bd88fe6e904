//! `gen`: what the manifest says, that generation is deterministic and
//! incremental, that a record's tiles and breakpoints are used, and that a
//! manifest from another generator is refused.

use std::path::{Path, PathBuf};

use tessera_dsl::ir::Variant;
use tessera_kernels_gen::r#gen as kgen;
use tessera_kernels_gen::{GenConfig, ModelSpec, generate};
use tessera_runtime::manifest::{KernelKind, MSource, Manifest, ManifestError};
use tessera_runtime::record::{
    DeviceEntry, GeneratorId, Limits, RECORD_SCHEMA, ShapeEntry, TuningRecord, Winner,
};

const SMALL_CONFIG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/small-config.json");

/// A fresh directory under cargo's per-crate test temp dir.
fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("gen-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn config(targets: &[&str], model: &str, out: &Path) -> GenConfig {
    GenConfig::new(targets.iter().copied(), ModelSpec::named(model), out)
}

/// The manifest with what changes whenever any template changes (the
/// template hash, content hashes) masked, so the snapshot pins names,
/// tiles, ranges and files.
fn redacted(manifest_json: &str) -> String {
    let mut out = String::new();
    for line in manifest_json.lines() {
        let trimmed = line.trim_start();
        let indent = &line[..line.len() - trimmed.len()];
        if trimmed.starts_with("\"template_hash\"") {
            out.push_str(&format!("{indent}\"template_hash\": \"[template hash]\"\n"));
        } else if trimmed.starts_with("\"fnv1a64\"") {
            out.push_str(&format!("{indent}\"fnv1a64\": \"[hash]\"\n"));
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// Every file in `dir`, sorted, with its bytes.
fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    v.sort();
    v
}

#[test]
fn manifest_snapshot_for_a_small_model_config() {
    let out = scratch("snapshot-small");
    let cfg = config(&["opencl", "aarch64-i8mm", "x86-avx2"], SMALL_CONFIG, &out);
    let report = generate(&cfg).unwrap();
    assert!(report.written.len() > 3, "{report:?}");
    assert_eq!(report.inputs, vec![PathBuf::from(SMALL_CONFIG)]);
    let text = std::fs::read_to_string(out.join("manifest.json")).unwrap();
    insta::assert_snapshot!("small_model_manifest", redacted(&text));
}

#[test]
fn manifest_snapshot_for_qwen2_1_5b_example_targets() {
    let out = scratch("snapshot-qwen");
    // The example crate's build.rs: same targets, same order.
    let cfg = config(&["aarch64-i8mm", "opencl", "ptx-sm80"], "qwen2-1.5b", &out);
    generate(&cfg).unwrap();
    let text = std::fs::read_to_string(out.join("manifest.json")).unwrap();
    insta::assert_snapshot!("qwen2_1_5b_manifest", redacted(&text));
}

#[test]
fn every_entry_names_an_existing_file_whose_hash_matches() {
    let out = scratch("hashes");
    generate(&config(
        &["opencl", "aarch64-i8mm", "x86-avx2"],
        "tiny",
        &out,
    ))
    .unwrap();
    let text = std::fs::read_to_string(out.join("manifest.json")).unwrap();
    let manifest = Manifest::from_json(&text, "manifest.json").unwrap();
    assert!(manifest.check(&kgen::generator()).is_ok());
    for e in &manifest.entries {
        let bytes = std::fs::read(out.join(&e.file)).unwrap();
        Manifest::verify(e, &bytes).unwrap();
        assert_eq!(
            e.listing.is_some(),
            e.file.ends_with(".bin"),
            "machine code and only machine code has a listing: {e:?}"
        );
        if let Some(l) = &e.listing {
            assert!(!std::fs::read(out.join(l)).unwrap().is_empty());
        }
        // W4A8 machine code carries its activation quantizer; GPU code
        // quantizes nothing (W4A16).
        assert_eq!(e.quantizer.is_some(), e.file.ends_with(".bin"), "{e:?}");
        if let Some(q) = &e.quantizer {
            Manifest::verify_file(q, &std::fs::read(out.join(&q.file)).unwrap()).unwrap();
            assert!(q.listing.as_ref().is_some_and(|l| out.join(l).is_file()));
        }
        let name: tessera_dsl::naming::InstanceName = e.kernel.parse().unwrap();
        assert_eq!(name.to_string(), e.kernel, "names round-trip the grammar");
        assert!(e.file.starts_with(&format!("{}.{}.", e.kernel, e.variant)));
    }
    // Every M from 1 up is served exactly once per target, format, shape.
    for e in &manifest.entries {
        for m in [1, 2, 7, 31, 32, 33, 4096] {
            let serving = manifest
                .entries
                .iter()
                .filter(|o| {
                    o.target == e.target
                        && o.format == e.format
                        && o.n == e.n
                        && o.k == e.k
                        && o.serves(m)
                })
                .count();
            assert_eq!(
                serving, 1,
                "{} {} [{}, {}] m={m}",
                e.target, e.format, e.n, e.k
            );
        }
    }
    // Cranelift emits all three variants (GEMV and flat GEMM share its
    // default loop; GEMM is K-blocked): one entry per variant and shape,
    // and every M is served by exactly one of them.
    let host_out = scratch("hashes-host");
    let report = generate(&config(&["host"], "tiny", &host_out)).unwrap();
    assert!(
        !report.notes.iter().any(|n| n.contains("no gemv loop")),
        "{:?}",
        report.notes
    );
    let host = kgen::manifest(&config(&["host"], "tiny", &host_out)).unwrap();
    for variant in [Variant::Gemv, Variant::FlatGemm, Variant::Gemm] {
        assert!(
            host.entries.iter().any(|e| e.variant == variant),
            "no host {variant:?} entry"
        );
    }
    for e in &host.entries {
        for m in [1, 2, 8, 64, 4096] {
            let serving = host
                .entries
                .iter()
                .filter(|o| o.format == e.format && o.n == e.n && o.k == e.k && o.serves(m))
                .count();
            assert_eq!(serving, 1, "host {} [{}, {}] m={m}", e.format, e.n, e.k);
        }
    }
}

#[test]
fn generating_twice_gives_byte_identical_files_and_rewrites_nothing() {
    let a = scratch("twice-a");
    let b = scratch("twice-b");
    let targets = ["aarch64-i8mm", "opencl", "x86-avx2", "host"];
    let first = generate(&config(&targets, "tiny", &a)).unwrap();
    generate(&config(&targets, "tiny", &b)).unwrap();
    assert_eq!(files(&a), files(&b));
    assert!(first.unchanged.is_empty());

    let mtimes = |dir: &Path| -> Vec<std::time::SystemTime> {
        let mut v: Vec<(String, std::time::SystemTime)> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (
                    e.file_name().to_string_lossy().into_owned(),
                    e.metadata().unwrap().modified().unwrap(),
                )
            })
            .collect();
        v.sort();
        v.into_iter().map(|(_, t)| t).collect()
    };
    let before = mtimes(&a);
    let before_files = files(&a);
    let again = generate(&config(&targets, "tiny", &a)).unwrap();
    assert!(again.written.is_empty(), "rewrote {:?}", again.written);
    assert_eq!(again.unchanged.len(), before_files.len());
    assert_eq!(mtimes(&a), before);
    assert_eq!(files(&a), before_files);
}

#[test]
fn regenerating_with_fewer_targets_removes_their_files() {
    let out = scratch("fewer");
    generate(&config(&["opencl", "aarch64-i8mm"], "tiny", &out)).unwrap();
    let report = generate(&config(&["opencl"], "tiny", &out)).unwrap();
    assert!(
        report
            .removed
            .iter()
            .any(|p| p.to_string_lossy().ends_with(".quant.bin"))
    );
    for (name, _) in files(&out) {
        assert!(!name.contains("aarch64"), "{name} left behind");
    }
    let kernels_rs = std::fs::read_to_string(out.join("kernels.rs")).unwrap();
    assert!(!kernels_rs.contains("aarch64"));
}

#[test]
fn a_manifest_from_another_generator_is_stale() {
    let out = scratch("stale");
    generate(&config(&["opencl"], "tiny", &out)).unwrap();
    let text = std::fs::read_to_string(out.join("manifest.json")).unwrap();
    let mut manifest = Manifest::from_json(&text, "manifest.json").unwrap();
    let current = kgen::generator();
    assert!(manifest.check(&current).is_ok());
    manifest.generator.template_hash = "0000000000000000".into();
    let err = manifest.check(&current).unwrap_err();
    assert!(matches!(err, ManifestError::Stale { .. }));
    assert!(err.to_string().contains(&current.template_hash), "{err}");
    manifest.generator = GeneratorId {
        version: "0.0.1".into(),
        ..current.clone()
    };
    assert!(manifest.check(&current).is_err());
}

fn record_with(generator: GeneratorId) -> TuningRecord {
    let shape = |name: &str, n, k, tile| ShapeEntry {
        name: name.into(),
        n,
        k,
        m1: 3,
        m2: 20,
        winners: vec![
            Winner {
                variant: Variant::Gemv,
                target: "aarch64-i8mm".into(),
                tile,
                kernel: String::new(),
                from_m: None,
            },
            Winner {
                variant: Variant::Gemm,
                target: "aarch64-i8mm".into(),
                tile: [8, 8, 8],
                kernel: String::new(),
                from_m: None,
            },
        ],
        measurements: vec![],
        notes: Default::default(),
    };
    let fp = tessera_runtime::device::from_cpuinfo("processor\t: 0\nmodel name\t: Test\n");
    TuningRecord {
        schema: RECORD_SCHEMA,
        entries: vec![DeviceEntry {
            prefill: None,
            decode: None,
            weight_prefetch: None,
            fingerprint: fp,
            generator,
            backend: "neon".into(),
            format: "w4a8".into(),
            model: "tiny".into(),
            threads: 1,
            partial: false,
            created_unix: 0,
            limits: Limits::default(),
            core_weights: vec![1.0],
            // tiny's `o` is [200, 200].
            shapes: vec![shape("o", 200, 200, [2, 8, 8])],
        }],
    }
}

#[test]
fn a_record_gives_tiles_and_m_ranges_and_is_an_input() {
    let out = scratch("record");
    let record_path = out.join("record.json");
    record_with(kgen::generator()).save(&record_path).unwrap();
    let mut cfg = config(&["aarch64-i8mm", "opencl"], "tiny", &out.join("k"));
    cfg.record = Some(record_path.clone());
    let report = generate(&cfg).unwrap();
    assert!(report.inputs.contains(&record_path));
    // The record is this generator's and fits: no notes at all (NEON and
    // OpenCL both ship decode attention).
    assert_eq!(report.notes, Vec::<String>::new());
    let manifest = kgen::manifest(&cfg).unwrap();
    let o: Vec<_> = manifest
        .entries
        .iter()
        .filter(|e| e.target == "aarch64-i8mm" && e.n == 200 && e.k == 200)
        .collect();
    let ranges: Vec<_> = o
        .iter()
        .map(|e| (e.variant, e.tile, e.m_min, e.m_max, e.m_source))
        .collect();
    // The record has no flat winner: the flat tile is the solver's (8 rows
    // on i8mm), and M = 3–6 run its per-M steps, whose ep is M rounded up
    // to smmla's 2-row unit.
    let flat_tile = o[o.len() - 2].tile;
    assert_eq!(flat_tile[0], 8, "{ranges:?}");
    assert_eq!(
        ranges,
        vec![
            (Variant::Gemv, [2, 8, 8], 1, Some(2), MSource::Record),
            (Variant::FlatGemm, [4, 8, 8], 3, Some(4), MSource::Record),
            (Variant::FlatGemm, [6, 8, 8], 5, Some(6), MSource::Record),
            (Variant::FlatGemm, flat_tile, 7, Some(19), MSource::Record),
            (Variant::Gemm, [8, 8, 8], 20, None, MSource::Record),
        ]
    );
    // Other shapes, and the other target, fall back to the solver defaults.
    assert!(
        manifest
            .entries
            .iter()
            .filter(|e| !(e.target == "aarch64-i8mm" && e.n == 200 && e.k == 200))
            .all(|e| e.m_source == MSource::Solver)
    );
    let gemv = manifest
        .entries
        .iter()
        .find(|e| e.target == "opencl" && e.variant == Variant::Gemv)
        .unwrap();
    assert_eq!((gemv.m_min, gemv.m_max), (1, Some(kgen::DEFAULT_M1 - 1)));

    // A record from another generator is still used, with a note.
    let other = GeneratorId {
        version: "0.0.1".into(),
        template_hash: "x".into(),
    };
    record_with(other).save(&record_path).unwrap();
    let report = generate(&cfg).unwrap();
    assert!(
        report.notes.iter().any(|n| n.contains("0.0.1")),
        "{:?}",
        report.notes
    );
}

#[test]
fn explicit_shapes_and_bad_inputs() {
    let out = scratch("explicit");
    let cfg = GenConfig::new(
        ["opencl"],
        ModelSpec::Shapes {
            model: "two".into(),
            shapes: vec![tessera_dsl::models::LayerShape {
                name: "proj".into(),
                n: 100,
                k: 96,
            }],
        },
        &out,
    );
    let m = kgen::manifest(&cfg).unwrap();
    assert_eq!(m.model, "two");
    assert_eq!(m.entries.len(), 3);
    assert!(
        m.entries
            .iter()
            .all(|e| e.format == "w4a16" && e.layer == "proj")
    );

    let err = |c: GenConfig| generate(&c).unwrap_err().to_string();
    let e = err(config(&["sm80"], "tiny", &out));
    assert!(
        e.contains("unknown target `sm80`") && e.contains("aarch64-i8mm"),
        "{e}"
    );
    let e = err(config(&[], "tiny", &out));
    assert!(e.contains("no target"), "{e}");
    let e = err(config(&["opencl"], "no-such-model", &out));
    assert!(e.contains("qwen2-1.5b"), "{e}");
    let mut bad_format = config(&["opencl"], "tiny", &out);
    bad_format.formats = vec!["w3a3".into()];
    let e = err(bad_format);
    assert!(
        e.contains("unknown format `w3a3`") && e.contains("w4a16"),
        "{e}"
    );
    // A format no target can run is an error naming the reason…
    let mut unrunnable = config(&["opencl"], "tiny", &out);
    unrunnable.formats = vec!["w8a8".into()];
    let e = err(unrunnable);
    assert!(e.contains("opencl cannot generate format w8a8"), "{e}");
    // …one that some formats cannot is skipped there with a note.
    let mut mixed = config(&["opencl", "aarch64-i8mm"], "tiny", &out);
    mixed.formats = vec!["w4a8".into(), "f16".into()];
    let report = generate(&mixed).unwrap();
    assert!(
        report
            .notes
            .iter()
            .any(|n| n.contains("opencl skips format w4a8")),
        "{:?}",
        report.notes
    );
}

/// Every target ships decode attention; x86 and NEON, whose backends emit
/// a whole causal prefill, ship the prefill kernels too, marked so.
#[test]
fn every_target_ships_attention_with_valid_hashes() {
    let out = scratch("attention");
    let cfg = config(
        &["opencl", "host", "ptx-sm80", "aarch64-fp16", "x86-avx2"],
        SMALL_CONFIG,
        &out,
    );
    let report = generate(&cfg).unwrap();
    let text = std::fs::read_to_string(out.join("manifest.json")).unwrap();
    let manifest = Manifest::from_json(&text, "manifest.json").unwrap();
    assert_eq!(report.attention, 14);
    let got: Vec<(&str, &str, &str)> = manifest
        .attention
        .iter()
        .map(|a| (a.target.as_str(), a.kv.as_str(), a.library.as_str()))
        .collect();
    assert_eq!(
        got,
        vec![
            ("opencl", "f16", "attention-decode-f16"),
            ("opencl", "kv8", "attention-decode-kv8"),
            ("host", "f16", "attention-decode-f16"),
            ("host", "kv8", "attention-decode-kv8"),
            ("ptx-sm80", "f16", "attention-decode-f16"),
            ("ptx-sm80", "kv8", "attention-decode-kv8"),
            ("aarch64-fp16", "f16", "attention-decode-f16"),
            ("aarch64-fp16", "kv8", "attention-decode-kv8"),
            ("aarch64-fp16", "f16", "attention-prefill-f16"),
            ("aarch64-fp16", "kv8", "attention-prefill-kv8"),
            ("x86-avx2", "f16", "attention-decode-f16"),
            ("x86-avx2", "kv8", "attention-decode-kv8"),
            ("x86-avx2", "f16", "attention-prefill-f16"),
            ("x86-avx2", "kv8", "attention-prefill-kv8"),
        ]
    );
    // small-config.json: 5 heads, 1 KV head, head_dim 40.
    for a in &manifest.attention {
        assert_eq!(a.kind, KernelKind::Attention);
        assert_eq!((a.heads, a.kv_heads, a.head_dim), (5, 1, 40), "{a:?}");
        assert!(a.kernel.contains("_d40_"), "{}", a.kernel);
        let bytes = std::fs::read(out.join(&a.file)).unwrap();
        Manifest::verify_attention(a, &bytes).unwrap();
        let mut damaged = bytes.clone();
        damaged[0] ^= 1;
        assert!(Manifest::verify_attention(a, &damaged).is_err());
        match a.target.as_str() {
            "opencl" => {
                assert!(a.listing.is_none() && a.file.ends_with(".cl"));
                let src = String::from_utf8(bytes).unwrap();
                assert!(src.contains("__kernel"), "{src}");
            }
            "ptx-sm80" => {
                assert!(a.listing.is_none() && a.file.ends_with(".ptx"));
                let src = String::from_utf8(bytes).unwrap();
                // Both entries of the split-K pair, for sm_80.
                assert!(src.contains(".target sm_80"), "{src}");
                assert!(
                    src.contains("_partial(") && src.contains("_combine("),
                    "{src}"
                );
            }
            _ => {
                assert!(a.file.ends_with(".bin"));
                let listing = a.listing.as_ref().unwrap();
                assert!(out.join(listing).is_file());
            }
        }
        let prefill = a.library.starts_with("attention-prefill");
        assert_eq!(a.prefill_blocks.is_some(), prefill, "{a:?}");
        assert!(a.kernel.starts_with(if prefill {
            "attention_prefill_"
        } else {
            "attention_decode_"
        }));
        // The x86 code takes head dims in 8-lane chunks, NEON's prefill in
        // 4-lane ones; the rest any.
        let multiple = match (a.target.as_str(), prefill) {
            ("x86-avx2", _) => 8,
            ("aarch64-fp16", true) => 4,
            _ => 1,
        };
        assert_eq!(a.head_dim_multiple, multiple, "{a:?}");
        let found = if prefill {
            manifest.lookup_prefill(&a.target, &a.kv)
        } else {
            manifest.lookup_attention(&a.target, &a.kv)
        };
        assert_eq!(found, Some(a));
    }
    // Every one of these targets has decode attention: no such note.
    assert!(
        !report
            .notes
            .iter()
            .any(|n| n.contains("no decode attention")),
        "{:?}",
        report.notes
    );
    // kernels.rs embeds them in its ATTENTION table.
    let rs = std::fs::read_to_string(out.join("kernels.rs")).unwrap();
    assert!(rs.contains("pub static ATTENTION: &[::tessera_runtime::manifest::EmbeddedAttention]"));
    for a in &manifest.attention {
        assert!(rs.contains(&format!("kernel: {:?},", a.kernel)), "{rs}");
    }
    // Explicit shapes carry no head counts: no attention, with a note.
    let shapes = GenConfig::new(
        ["opencl"],
        ModelSpec::Shapes {
            model: "m".into(),
            shapes: vec![tessera_dsl::models::LayerShape {
                name: "o".into(),
                n: 64,
                k: 64,
            }],
        },
        out.join("shapes"),
    );
    let m = kgen::manifest(&shapes).unwrap();
    assert!(m.attention.is_empty());
    assert!(!m.to_json().contains("attention"));
}
