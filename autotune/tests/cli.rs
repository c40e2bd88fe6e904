//! The command end to end: a real tuning run of the tiny model within a
//! small budget, the record it writes loading and being accepted on this
//! device, resume, merge, and every bad input's message and exit code.

use std::path::PathBuf;
use std::process::{Command, Output};

use tessera_runtime::device::Fingerprint;
use tessera_runtime::record::{GeneratorId, TuningRecord};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tessera-autotune"))
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tessera-autotune-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn run(args: &[&str]) -> Output {
    bin().args(args).arg("--quiet").output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn generator() -> GeneratorId {
    GeneratorId {
        version: tessera_codegen::GENERATOR_VERSION.into(),
        template_hash: tessera_codegen::TEMPLATE_HASH.into(),
    }
}

#[test]
fn tiny_model_tunes_loads_and_is_selected_here() {
    let out = tmp("tiny.json");
    let _ = std::fs::remove_file(&out);
    let o = run(&[
        "--model",
        "tiny",
        "--budget",
        "8",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        stdout.contains("M1 = ") && stdout.contains("roofline"),
        "{stdout}"
    );
    let record = TuningRecord::load(&out).unwrap();
    let kind = tessera_autotune::backend::BackendKind::available()[0];
    let backend = kind.name();
    // The main job's format: q4_0 on x86 and NEON, w4a8 on cranelift.
    let format = tessera_autotune::backend::default_format(kind);
    let entry = record
        .select(&Fingerprint::detect(), &generator(), backend, format)
        .unwrap();
    assert!(!entry.partial);
    assert_eq!(entry.model, "tiny");
    assert_eq!(entry.shapes.len(), 4);
    for s in &entry.shapes {
        assert!(1 <= s.m1 && s.m1 <= s.m2, "{s:?}");
        // One winner per variant, plus the per-M flat steps, each on the
        // flat winner's hp and lp or the GEMM winner's (timed against each
        // other at that M).
        assert_eq!(s.winners.len(), 3 + s.flat_steps().len(), "{s:?}");
        let flat = s.winner(tessera_dsl::ir::Variant::FlatGemm).unwrap();
        let gemm = s.winner(tessera_dsl::ir::Variant::Gemm).unwrap();
        assert!(
            s.flat_steps().iter().all(|(m, w)| *m >= s.m1
                && *m < s.m2
                && (w.tile[1..] == flat.tile[1..] || w.tile[1..] == gemm.tile[1..])),
            "{s:?}"
        );
        assert!(!s.measurements.is_empty());
        assert!(
            s.measurements
                .iter()
                .all(|m| m.median_ns > 0.0 && m.samples >= 3)
        );
    }
    assert!(entry.limits.read_gbps > 0.0 && entry.limits.mac_gops > 0.0);
    // The x86 int8 kernels' weight prefetch, timed first; other backends
    // have no such choice.
    match &entry.weight_prefetch {
        Some(p) => {
            use tessera_runtime::record::{CacheLevel, PrefetchChoice};
            assert_eq!(backend, "x86", "{p:?}");
            assert_eq!(p.stream, "int8");
            let choices = [4096, 2048, 8192].map(|bytes| PrefetchChoice {
                bytes,
                level: CacheLevel::L1,
            });
            assert!(
                choices.contains(&p.chosen) && p.default == choices[0],
                "{p:?}"
            );
            let timed: Vec<PrefetchChoice> = p.measurements.iter().map(|m| m.choice).collect();
            assert_eq!(timed, choices, "{p:?}");
            assert!(p.measurements.iter().all(|m| m.us > 0.0), "{p:?}");
            // On one thread too where the tuning has more.
            let alone = p.measurements.iter().map(|m| m.us_one_thread);
            if entry.threads > 1 {
                assert!(alone.clone().all(|t| t.is_some_and(|t| t > 0.0)), "{p:?}");
            } else {
                assert!(alone.clone().all(|t| t.is_none()), "{p:?}");
            }
            assert!(stdout.contains("int8 weight prefetch"), "{stdout}");
        }
        None => assert_ne!(backend, "x86", "an x86 q4_0 tuning times the prefetch"),
    }
    // Plots, one per shape.
    let plots = PathBuf::from(format!("{}-plots", out.display()));
    let svgs = std::fs::read_dir(&plots).unwrap().count();
    assert_eq!(svgs, 4);

    // Resuming a complete record does nothing.
    let o = run(&[
        "--model",
        "tiny",
        "--budget",
        "8",
        "--out",
        out.to_str().unwrap(),
        "--resume",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("nothing to resume"));

    // Merge with a copy from "another device": both entries kept.
    let mut other = record.clone();
    other.entries[0].fingerprint.cpu_model = "Another CPU".into();
    let b = tmp("other.json");
    other.save(&b).unwrap();
    let merged = tmp("merged.json");
    let o = bin()
        .args([
            "merge",
            out.to_str().unwrap(),
            b.to_str().unwrap(),
            "-o",
            merged.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let m = TuningRecord::load(&merged).unwrap();
    assert_eq!(m.entries.len(), 2);
    assert!(
        m.select(&Fingerprint::detect(), &generator(), backend, format)
            .is_ok()
    );
}

#[test]
fn a_budget_that_runs_out_writes_a_partial_record_and_resume_needs_its_entry() {
    let out = tmp("partial.json");
    let _ = std::fs::remove_file(&out);
    // qwen2-7b's first shape alone takes longer than 2 s to prepare here.
    let o = run(&[
        "--model",
        "qwen2-7b",
        "--budget",
        "2",
        "--out",
        out.to_str().unwrap(),
        "--no-plots",
    ]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("ran out") && err.contains("--resume"), "{err}");
    let record = TuningRecord::load(&out).unwrap();
    assert!(record.entries[0].partial);
    assert!(record.entries[0].shapes.len() < 4);
    // Resume with another (tiny) model has nothing to continue.
    let o = run(&[
        "--model",
        "tiny",
        "--budget",
        "2",
        "--out",
        out.to_str().unwrap(),
        "--resume",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("nothing to resume"), "{}", stderr(&o));
}

#[test]
fn bad_inputs_get_a_message_and_exit_code_2() {
    let out = tmp("never.json");
    let o = out.to_str().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (&["--model", "qwen9"], "unknown model `qwen9`"),
        (&["--backend", "tpu"], "unknown backend `tpu`"),
        (&["--backend", "cuda"], "available here"),
        (&["--format", "q4"], "unknown format `q4`"),
        (&["--budget", "0.5"], "too small"),
        (&["--threads", "0"], "at least 1"),
        (
            &["--model", "/nonexistent/config.json"],
            "cannot read model config",
        ),
        (
            &["--resume", "--out", "/nonexistent/rec.json"],
            "nothing to resume",
        ),
    ];
    for (args, msg) in cases {
        let mut all = args.to_vec();
        if !args.contains(&"--out") {
            all.extend(["--out", o]);
        }
        let r = run(&all);
        assert_eq!(r.status.code(), Some(2), "{args:?}: {}", stderr(&r));
        assert!(stderr(&r).contains(msg), "{args:?}: {}", stderr(&r));
    }
    let bad = tmp("config.json");
    std::fs::write(&bad, r#"{"hidden_size": 64, "num_attention_heads": 4}"#).unwrap();
    let r = run(&["--model", bad.to_str().unwrap(), "--out", o]);
    assert_eq!(r.status.code(), Some(2));
    assert!(
        stderr(&r).contains("no `intermediate_size`"),
        "{}",
        stderr(&r)
    );
    std::fs::write(&bad, "{ not json").unwrap();
    let r = run(&["--model", bad.to_str().unwrap(), "--out", o]);
    assert_eq!(r.status.code(), Some(2));
    assert!(stderr(&r).contains("not valid JSON"), "{}", stderr(&r));
    assert!(!out.exists());
}

#[test]
fn a_config_json_model_tunes() {
    let cfg = tmp("mini/config.json");
    std::fs::create_dir_all(cfg.parent().unwrap()).unwrap();
    std::fs::write(
        &cfg,
        r#"{"hidden_size": 128, "intermediate_size": 200, "num_attention_heads": 4,
            "num_key_value_heads": 2, "vocab_size": 500}"#,
    )
    .unwrap();
    let out = tmp("mini.json");
    let _ = std::fs::remove_file(&out);
    let r = run(&[
        "--model",
        cfg.to_str().unwrap(),
        "--budget",
        "6",
        "--out",
        out.to_str().unwrap(),
        "--no-plots",
    ]);
    assert!(r.status.success(), "{}", stderr(&r));
    let rec = TuningRecord::load(&out).unwrap();
    assert_eq!(rec.entries[0].model, "mini");
    let dims: Vec<(usize, usize)> = rec.entries[0].shapes.iter().map(|s| (s.n, s.k)).collect();
    assert_eq!(dims, vec![(256, 128), (128, 128), (400, 128), (128, 200)]);
}

// ---- GGUF model files --------------------------------------------------------

/// llama.cpp's `gguf` package (installed by scripts/test.sh), or None after
/// a SKIP line; missing under CI fails.
fn gguf_pythonpath(test: &str) -> Option<PathBuf> {
    let path = std::env::var_os("TESSERA_GGUF_PYTHONPATH")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
                .map(|c| c.join("tessera/gguf"))
        })
        .filter(|p| p.join("gguf").is_dir());
    if path.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "{test}: the gguf package is required in CI (scripts/test.sh installs it)"
        );
        println!("SKIP {test}: the gguf package is not installed");
    }
    path
}

/// A one-block llama GGUF written by gguf's writer
/// (runtime/tests/oracle/write_gguf.py) as `dir/<name>.gguf`: hidden 256,
/// feed-forward 256, 4 heads, 2 KV heads; Q, K, V in Q4_0, the attention
/// output in `o_type` (Q8_0 unless a test needs another), gate and up in
/// Q4_K, down in Q6_K; metadata `embedding_length` = `embd`.
fn tiny_gguf(py: &std::path::Path, name: &str, embd: usize, o_type: &str) -> PathBuf {
    let dir = tmp(&format!("gguf-{name}"));
    std::fs::create_dir_all(&dir).unwrap();
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../runtime/tests/oracle/write_gguf.py");
    let specs: Vec<String> = [
        "blk.0.attn_q.weight:Q4_0:256:256".to_string(),
        "blk.0.attn_k.weight:Q4_0:128:256".into(),
        "blk.0.attn_v.weight:Q4_0:128:256".into(),
        format!("blk.0.attn_output.weight:{o_type}:256:256"),
        "blk.0.ffn_gate.weight:Q4_K:256:256".into(),
        "blk.0.ffn_up.weight:Q4_K:256:256".into(),
        "blk.0.ffn_down.weight:Q6_K:256:256".into(),
        "output.weight:Q8_0:96:256".into(),
    ]
    .to_vec();
    let o = Command::new("python3")
        .arg(&script)
        .arg(&dir)
        .arg("7")
        .args(&specs)
        .env("PYTHONPATH", py)
        .env("GGUF_EMBD", embd.to_string())
        .env("GGUF_FF", "256")
        .env("GGUF_HEADS", "4")
        .env("GGUF_KV_HEADS", "2")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let file = dir.join(format!("{name}.gguf"));
    std::fs::rename(dir.join("model.gguf"), &file).unwrap();
    file
}

/// An entry as (format, model, [(shape name, n, k)]).
type EntryView = (String, String, Vec<(String, usize, usize)>);

/// Every entry, sorted by format.
fn entries(record: &TuningRecord) -> Vec<EntryView> {
    let mut v: Vec<_> = record
        .entries
        .iter()
        .map(|e| {
            (
                e.format.clone(),
                e.model.clone(),
                e.shapes
                    .iter()
                    .map(|s| (s.name.clone(), s.n, s.k))
                    .collect(),
            )
        })
        .collect();
    v.sort();
    v
}

fn want_gguf_entries(model: &str) -> Vec<EntryView> {
    let s = |n: &str, a, b| (n.to_string(), a, b);
    vec![
        ("q4_0".into(), model.into(), vec![s("qkv", 512, 256)]),
        ("q4_1".into(), model.into(), vec![s("gate_up", 512, 256)]),
        ("q8_0".into(), model.into(), vec![s("o+down", 256, 256)]),
    ]
}

/// The ggml formats run on x86 and NEON; elsewhere these tests SKIP.
fn ggml_backend(test: &str) -> bool {
    use tessera_autotune::backend::BackendKind;
    let ok = matches!(
        BackendKind::available().first(),
        Some(BackendKind::X86 | BackendKind::Neon)
    );
    if !ok {
        println!("SKIP {test}: no backend here runs ggml's block formats");
    }
    ok
}

#[test]
fn a_gguf_model_tunes_its_shapes_in_its_own_formats() {
    let test = "gguf_tunes";
    let Some(py) = gguf_pythonpath(test) else {
        return;
    };
    if !ggml_backend(test) {
        return;
    }
    let file = tiny_gguf(&py, "tiny-llama", 256, "Q8_0");
    let out = tmp("gguf-record.json");
    let _ = std::fs::remove_file(&out);
    let r = run(&[
        "--model",
        file.to_str().unwrap(),
        "--budget",
        "12",
        "--out",
        out.to_str().unwrap(),
        "--no-plots",
    ]);
    assert!(r.status.success(), "{}", stderr(&r));
    let rec = TuningRecord::load(&out).unwrap();
    assert_eq!(entries(&rec), want_gguf_entries("tiny-llama"));
    assert!(rec.entries.iter().all(|e| !e.partial));
}

#[test]
fn a_gguf_model_travels_to_remote_as_a_shape_list() {
    let test = "gguf_remote";
    let Some(py) = gguf_pythonpath(test) else {
        return;
    };
    if !ggml_backend(test) {
        return;
    }
    let file = tiny_gguf(&py, "remote-llama", 256, "Q8_0");
    // A runner that logs the command line it runs, then runs it here.
    let log = tmp("gguf-remote-args.log");
    let _ = std::fs::remove_file(&log);
    let runner = tmp("log-and-run.sh");
    std::fs::write(
        &runner,
        format!("echo \"$@\" >> '{}'\nexec \"$@\"\n", log.display()),
    )
    .unwrap();
    let out = tmp("gguf-remote-record.json");
    let _ = std::fs::remove_file(&out);
    let r = run(&[
        "--model",
        file.to_str().unwrap(),
        "--remote",
        &format!("run:sh {}", runner.display()),
        "--remote-bin",
        env!("CARGO_BIN_EXE_tessera-autotune"),
        "--budget",
        "12",
        "--out",
        out.to_str().unwrap(),
        "--no-plots",
    ]);
    assert!(r.status.success(), "{}", stderr(&r));
    let args = std::fs::read_to_string(&log).unwrap();
    assert!(args.contains("shapes.json"), "{args}");
    assert!(
        !args.contains(".gguf"),
        "the GGUF file itself was shipped: {args}"
    );
    let rec = TuningRecord::load(&out).unwrap();
    assert_eq!(entries(&rec), want_gguf_entries("remote-llama"));
}

#[test]
fn bad_gguf_models_are_refused_with_the_file_and_tensor() {
    let test = "gguf_bad";
    let Some(py) = gguf_pythonpath(test) else {
        return;
    };
    let out = tmp("gguf-bad.json");
    let o = out.to_str().unwrap();
    // Metadata that disagrees with the tensors.
    let file = tiny_gguf(&py, "wrong-embd", 128, "Q8_0");
    let r = run(&["--model", file.to_str().unwrap(), "--out", o]);
    assert_eq!(r.status.code(), Some(2), "{}", stderr(&r));
    let e = stderr(&r);
    assert!(
        e.contains("wrong-embd.gguf")
            && e.contains("blk.0.attn_q.weight")
            && e.contains("[256, 256]"),
        "{e}"
    );
    // A layer in a type Tessera does not load.
    let file = tiny_gguf(&py, "q5", 256, "Q5_0");
    let r = run(&["--model", file.to_str().unwrap(), "--out", o]);
    assert_eq!(r.status.code(), Some(2), "{}", stderr(&r));
    let e = stderr(&r);
    assert!(
        e.contains("q5.gguf") && e.contains("blk.0.attn_output.weight") && e.contains("Q5_0"),
        "{e}"
    );
    let not_gguf = tmp("not.gguf");
    std::fs::write(&not_gguf, b"GGUF\x07\0\0\0").unwrap();
    let r = run(&["--model", not_gguf.to_str().unwrap(), "--out", o]);
    assert_eq!(r.status.code(), Some(2));
    let e = stderr(&r);
    assert!(e.contains("not.gguf") && e.contains("`version`"), "{e}");
    assert!(!out.exists());
}
