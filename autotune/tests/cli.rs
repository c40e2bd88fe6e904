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
        // One winner per variant, plus the per-M flat steps on the flat
        // winner's hp and lp.
        assert_eq!(s.winners.len(), 3 + s.flat_steps().len(), "{s:?}");
        let flat = s.winner(tessera_dsl::ir::Variant::FlatGemm).unwrap();
        assert!(
            s.flat_steps()
                .iter()
                .all(|(m, w)| *m >= s.m1 && *m < s.m2 && w.tile[1..] == flat.tile[1..])
        );
        assert!(!s.measurements.is_empty());
        assert!(
            s.measurements
                .iter()
                .all(|m| m.median_ns > 0.0 && m.samples >= 3)
        );
    }
    assert!(entry.limits.read_gbps > 0.0 && entry.limits.mac_gops > 0.0);
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
