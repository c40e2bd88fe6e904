//! `tessera-kernels-gen gen`: the build-time generation command works; bad
//! targets, models and formats exit 1 naming the valid choices.

use std::path::Path;
use std::process::{Command, Output};

fn cli(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tessera-kernels-gen"))
        .args(args)
        .output()
        .expect("the binary runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn out_dir(name: &str) -> String {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("gen-cli-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    dir.display().to_string()
}

#[test]
fn gen_writes_qwen2_kernels_manifest_and_kernels_rs() {
    let out = out_dir("qwen");
    let o = cli(&[
        "gen",
        "--target",
        "opencl,ptx-sm80,aarch64-i8mm",
        "--model",
        "qwen2-1.5b",
        "--out",
        &out,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    // 3 targets × 4 shapes × 3 variants, and on aarch64-i8mm the flat
    // range's 3 per-M steps (ep 2, 4, 6 below the 8-row flat tile).
    assert!(stdout.contains("48 entries"), "{stdout}");
    let text = std::fs::read_to_string(Path::new(&out).join("manifest.json")).unwrap();
    let manifest = tessera_runtime::manifest::Manifest::from_json(&text, "manifest.json").unwrap();
    assert_eq!(manifest.model, "qwen2-1.5b");
    let targets: std::collections::BTreeSet<&str> =
        manifest.entries.iter().map(|e| e.target.as_str()).collect();
    assert_eq!(
        targets.into_iter().collect::<Vec<_>>(),
        ["aarch64-i8mm", "opencl", "ptx-sm80"]
    );
    for e in &manifest.entries {
        assert!(Path::new(&out).join(&e.file).is_file(), "{}", e.file);
    }
    assert!(Path::new(&out).join("kernels.rs").is_file());

    // Again: nothing rewritten.
    let o = cli(&[
        "gen",
        "--target",
        "opencl,ptx-sm80,aarch64-i8mm",
        "--model",
        "qwen2-1.5b",
        "--out",
        &out,
    ]);
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stdout).contains(" 0 written"));
}

#[test]
fn gen_takes_formats_and_a_config_json() {
    let out = out_dir("formats");
    let config = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/small-config.json");
    let o = cli(&[
        "gen",
        "--target",
        "aarch64-dotprod",
        "--model",
        config,
        "--format",
        "w8a8,f16",
        "--out",
        &out,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(Path::new(&out).join("manifest.json")).unwrap();
    assert!(text.contains("\"format\": \"w8a8\"") && text.contains("\"format\": \"f16\""));
    assert!(text.contains("\"model\": \"small-decoder\""));
}

#[test]
fn unknown_target_exits_1_listing_the_targets() {
    let o = cli(&[
        "gen",
        "--target",
        "opencl,sm_80",
        "--model",
        "tiny",
        "--out",
        &out_dir("t"),
    ]);
    assert_eq!(o.status.code(), Some(1));
    let e = stderr(&o);
    assert!(e.contains("unknown target `sm_80`"), "{e}");
    for t in ["x86-avx2", "aarch64-i8mm", "opencl"] {
        assert!(e.contains(t), "{e}");
    }
}

#[test]
fn unknown_model_exits_1_listing_the_models() {
    let o = cli(&[
        "gen",
        "--target",
        "opencl",
        "--model",
        "gpt5",
        "--out",
        &out_dir("m"),
    ]);
    assert_eq!(o.status.code(), Some(1));
    let e = stderr(&o);
    assert!(
        e.contains("unknown model `gpt5`") && e.contains("qwen2-1.5b"),
        "{e}"
    );
}

#[test]
fn unknown_format_and_missing_record_exit_1() {
    let o = cli(&[
        "gen",
        "--target",
        "opencl",
        "--model",
        "tiny",
        "--format",
        "int3",
        "--out",
        &out_dir("f"),
    ]);
    assert_eq!(o.status.code(), Some(1));
    let e = stderr(&o);
    assert!(
        e.contains("unknown format `int3`") && e.contains("w4a16"),
        "{e}"
    );

    let o = cli(&[
        "gen",
        "--target",
        "opencl",
        "--model",
        "tiny",
        "--record",
        "/no/such/record.json",
        "--out",
        &out_dir("r"),
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("/no/such/record.json"),
        "{}",
        stderr(&o)
    );
}
