//! The CLI's contract: outputs, exit codes and error messages.

use std::io::Write;
use std::process::{Command, Output};

fn cli(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tessera-kernels-gen"))
        .args(args)
        .output()
        .expect("the binary runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn show_list_names_every_library_kernel() {
    let o = cli(&["show", "--list"]);
    assert!(o.status.success());
    let names: Vec<String> = stdout(&o).lines().map(str::to_string).collect();
    assert_eq!(names, tessera_dsl::library::names());
}

#[test]
fn show_prints_canonical_text_that_parses_back() {
    for name in tessera_dsl::library::names() {
        let o = cli(&["show", name]);
        assert!(o.status.success(), "{name}: {}", stderr(&o));
        let text = stdout(&o);
        let k: tessera_dsl::Kernel = text.parse().expect("canonical text parses");
        assert_eq!(k, tessera_dsl::library::get(name).unwrap());
        assert_eq!(k.to_string(), text);
    }
}

#[test]
fn unknown_kernel_lists_the_valid_ones() {
    let o = cli(&["show", "matmul-w5a8"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("matmul-w4a8"), "{}", stderr(&o));
}

fn temp_file(name: &str, text: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("tessera-cli-{}-{name}", std::process::id()));
    let mut f = std::fs::File::create(&path).unwrap();
    f.write_all(text.as_bytes()).unwrap();
    path
}

#[test]
fn check_accepts_a_valid_file_and_prints_canonical_text() {
    let k = tessera_dsl::library::get("attention-decode-kv8").unwrap();
    let text = format!("# a comment\n\n{k}");
    let path = temp_file("ok.tk", &text);
    let o = cli(&["check", path.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), k.to_string());
}

#[test]
fn check_names_the_line_and_the_problem() {
    let k = tessera_dsl::library::get("matmul-w4a8")
        .unwrap()
        .to_string();
    let bad = k.replace("u4asym:g32", "u5asym:g32");
    let line = bad.lines().position(|l| l.contains("u5asym")).unwrap() + 1;
    let path = temp_file("bad.tk", &bad);
    let o = cli(&["check", path.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(err.contains(&format!("line {line}")), "{err}");
    assert!(err.contains("u5asym"), "{err}");
}

#[test]
fn check_reports_verify_errors_and_missing_files() {
    let k = tessera_dsl::library::get("matmul-w4a8")
        .unwrap()
        .to_string();
    let bad = k.replace(" zero-point", "");
    let path = temp_file("nozp.tk", &bad);
    let o = cli(&["check", path.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("zero"), "{}", stderr(&o));
    let o = cli(&["check", "/nonexistent/kernel.tk"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("/nonexistent/kernel.tk"));
}

/// The first line `solve` prints for `kernel` on `target` (it must succeed).
fn solve_first_line(target: &str, kernel: &str) -> String {
    let o = cli(&["solve", "--target", target, "--kernel", kernel]);
    assert!(o.status.success(), "{}", stderr(&o));
    stdout(&o).lines().next().unwrap_or_default().to_string()
}

#[test]
fn solve_prints_the_table_2_rows_first() {
    // Per-row scales (W8A8): the int8 tile alone, as Table 2 counts it.
    let first = solve_first_line("aarch64-i8mm", "matmul-w8a8");
    assert!(first.starts_with("ep=10 hp=8 lp=8 "), "{first}");
    let first = solve_first_line("aarch64-dotprod", "matmul-w8a8");
    assert!(first.starts_with("ep=12 hp=8 lp=4 "), "{first}");
    // Grouped W4A8 on sdot: 16-code blocks and register partial sums.
    let first = solve_first_line("aarch64-dotprod", "matmul-w4a8");
    assert!(
        first.starts_with("ep=12 hp=4 lp=4 ") && first.contains(" partial_sums=12 "),
        "{first}"
    );
    // Grouped W4A8 on smmla: a partial-sum register per accumulator.
    let first = solve_first_line("aarch64-i8mm", "matmul-w4a8");
    assert!(
        first.starts_with("ep=10 hp=4 lp=8 ") && first.contains(" partial_sums=10 "),
        "{first}"
    );
}

#[test]
fn solve_top_and_json() {
    let o = cli(&[
        "solve",
        "--target",
        "x86-avx2",
        "--kernel",
        "matmul-f32",
        "--top",
        "3",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o).lines().filter(|l| l.starts_with('#')).count(), 3);
    let o = cli(&[
        "solve",
        "--target",
        "aarch64-i8mm",
        "--kernel",
        "matmul-w4a8",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("valid JSON");
    assert!(v.to_string().contains("\"ep\":10"), "{v}");
}

#[test]
fn solve_errors_list_the_choices() {
    let o = cli(&["solve", "--target", "riscv", "--kernel", "matmul-w4a8"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("aarch64-i8mm"));
    let o = cli(&["solve", "--target", "opencl-gpu", "--kernel", "matmul-w4a8"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("i8dyn") || stderr(&o).contains("int8"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn emit_i8mm_uses_smmla_and_dotprod_uses_sdot_only() {
    let o = cli(&[
        "emit",
        "--target",
        "aarch64-i8mm",
        "--kernel",
        "matmul-w4a8",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("smmla"));
    let o = cli(&[
        "emit",
        "--target",
        "aarch64-dotprod",
        "--kernel",
        "matmul-w4a8",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("sdot") && !stdout(&o).contains("smmla"));
}

#[test]
fn emit_x86_host_and_opencl() {
    let o = cli(&["emit", "--target", "x86-avx2", "--kernel", "matmul-w4a8"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("vpmaddubsw"));
    // The AVX-512 kernels: zmm FMAs / vpdpbusd on x86-avx512 tiles; other
    // formats are refused by name.
    let o = cli(&["emit", "--target", "x86-avx512", "--kernel", "matmul-f32"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("vfmadd231ps zmm") && stdout(&o).contains("/32"));
    let o = cli(&["emit", "--target", "x86-avx512", "--kernel", "matmul-w4a8"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("vpdpbusd zmm17, zmm"), "{}", stdout(&o));
    let o = cli(&["emit", "--target", "x86-avx512", "--kernel", "matmul-w8a8"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("f32 and W4A8 matmul kernels only"),
        "{}",
        stderr(&o)
    );
    let o = cli(&["emit", "--target", "host", "--kernel", "matmul-f32"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("function %matmul-f32"));
    let o = cli(&[
        "emit",
        "--target",
        "opencl",
        "--kernel",
        "matmul-w4a16",
        "--variant",
        "gemv",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("__kernel"));
}

#[test]
fn emit_writes_bytes_and_refuses_bad_requests() {
    let path = std::env::temp_dir().join(format!("tessera-cli-{}.bin", std::process::id()));
    let o = cli(&[
        "emit",
        "--target",
        "aarch64-dotprod",
        "--kernel",
        "matmul-f32",
        "--bin",
        path.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let bytes = std::fs::read(&path).unwrap();
    assert!(!bytes.is_empty() && bytes.len().is_multiple_of(4));
    let o = cli(&["emit", "--target", "riscv", "--kernel", "matmul-f32"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("x86-avx2"), "{}", stderr(&o));
    let o = cli(&[
        "emit",
        "--target",
        "x86-avx2",
        "--kernel",
        "matmul-f32",
        "--tile",
        "7,7",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("E,H,L"), "{}", stderr(&o));
    let o = cli(&[
        "emit",
        "--target",
        "x86-avx2",
        "--kernel",
        "matmul-f32",
        "--tile",
        "99,8,1",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("not feasible"), "{}", stderr(&o));
    // x86 attention is emitted on x86-avx2 only, and a prefill program on
    // OpenCL needs a head dim its code takes.
    let o = cli(&[
        "emit",
        "--target",
        "x86-avx512",
        "--kernel",
        "attention-decode-f16",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("runs on x86-avx2"), "{}", stderr(&o));
    let o = cli(&[
        "emit",
        "--target",
        "opencl",
        "--kernel",
        "attention-prefill-f16",
        "--head-dim",
        "512",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("head dim 512"), "{}", stderr(&o));
    let o = cli(&[
        "emit",
        "--target",
        "opencl",
        "--kernel",
        "matmul-w4a16",
        "--bin",
        "/tmp/x",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("source text"), "{}", stderr(&o));
}

#[test]
fn emit_ptx_gemm_uses_mma_and_gemv_uses_shuffles() {
    let o = cli(&[
        "emit",
        "--target",
        "ptx-sm80",
        "--kernel",
        "matmul-f16",
        "--variant",
        "gemm",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("mma.sync.aligned.m16n8k16"),
        "{}",
        stdout(&o)
    );
    assert!(stdout(&o).contains("cp.async"));
    // The flat GEMM is the GEMV over several rows of e.
    let o = cli(&[
        "emit",
        "--target",
        "ptx-sm80",
        "--kernel",
        "matmul-f16",
        "--variant",
        "flat-gemm",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("rows of e per thread"),
        "{}",
        stdout(&o)
    );
    assert!(stdout(&o).contains("shfl.sync"));
    let o = cli(&[
        "emit",
        "--target",
        "ptx-sm90",
        "--kernel",
        "matmul-w4a16",
        "--variant",
        "gemv",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("shfl.sync"));
}

#[test]
fn emit_ptx_decode_attention_prints_both_entries() {
    let o = cli(&[
        "emit",
        "--target",
        "ptx-sm80",
        "--kernel",
        "attention-decode-f16",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    for needle in [
        ".target sm_80",
        ".visible .entry attention_decode_f16_partial(",
        ".visible .entry attention_decode_f16_combine(",
        "shfl.sync.bfly.b32",
        "ex2.approx",
    ] {
        assert!(text.contains(needle), "lacks {needle}:\n{text}");
    }
    // fp8 values: sm_90 converts them with cvt, sm_80 with bit operations.
    let o = cli(&[
        "emit",
        "--target",
        "ptx-sm90",
        "--kernel",
        "attention-decode-kv8",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("cvt.rn.f16x2.e4m3x2"));
    let o = cli(&[
        "emit",
        "--target",
        "ptx-sm80",
        "--kernel",
        "attention-decode-kv8",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!stdout(&o).contains("e4m3x2"));
    // Prefill has no GPU kernel: a clear error, exit code 1.
    let o = cli(&[
        "emit",
        "--target",
        "ptx-sm80",
        "--kernel",
        "attention-prefill-f16",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("prefill"), "{}", stderr(&o));
}

/// Attention on every CPU target, and the OpenCL prefill program for the
/// head dim asked for.
#[test]
fn emit_prints_x86_attention_and_opencl_prefill_programs() {
    for (target, kernel, want) in [
        ("x86-avx2", "attention-decode-f16", "attention decode"),
        (
            "x86-avx2",
            "attention-prefill-kv8",
            "attention prefill (flash",
        ),
        (
            "aarch64-neon",
            "attention-prefill-f16",
            "attention prefill (flash",
        ),
    ] {
        let o = cli(&["emit", "--target", target, "--kernel", kernel]);
        assert!(o.status.success(), "{target} {kernel}: {}", stderr(&o));
        assert!(
            stdout(&o).contains(want),
            "{target} {kernel}: {}",
            stdout(&o)
        );
    }
    let o = cli(&[
        "emit",
        "--target",
        "opencl",
        "--kernel",
        "attention-prefill-f16",
        "--head-dim",
        "80",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("head dim 80") && out.contains("float qr[80]"),
        "{out}"
    );
}
