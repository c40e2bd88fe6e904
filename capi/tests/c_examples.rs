//! The C API from C and C++: `examples/linear.c`, `examples/decode.cpp`
//! and `examples/bad_calls.c` are compiled with the system compiler
//! against the installed-style layout (header + `tessera.pc`), linked once
//! against `libtessera.a` and once against `libtessera.so`, and run. The
//! static builds run natively; the dynamic builds of `linear.c` and
//! `bad_calls.c` run under valgrind (memcheck, full leak check, any error
//! fails). `decode.cpp` JITs its attention kernels with cranelift, which
//! valgrind slows twentyfold, so it is checked with AddressSanitizer and
//! LeakSanitizer instead (built with `-fsanitize=address`, static library).
//!
//! The examples compare their outputs with reference values written here
//! by Tessera's reference interpreter (`tessera_dsl::interp`), so the C
//! side checks the same semantics the Rust tests do.
//!
//! Tools missing (cc, c++, pkg-config, valgrind): with `CI` set the test
//! fails naming the tool; without it, it prints a SKIP line and passes.

use std::path::{Path, PathBuf};
use std::process::Command;

mod common;
use common::reference_linear;

use half::f16;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tessera_dsl::interp::{self, Bindings, Value};
use tessera_dsl::ir::Format;
use tessera_dsl::library;
use tessera_dsl::quant;
use tessera_runtime::device::Fingerprint;
use tessera_runtime::record::{DeviceEntry, Limits, RECORD_SCHEMA, TuningRecord};
use tessera_runtime::{Backend, KvFormat, WeightFormat, current_generator};

/// Whether `tool` runs; without it, fail under CI, else say SKIP.
fn have(tool: &str) -> bool {
    let found = Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        if std::env::var_os("CI").is_some() {
            panic!(
                "`{tool}` is required by the C API tests (CI is set); scripts/test.sh installs it"
            );
        }
        // Straight to the stderr handle: the test harness captures
        // `println!`, and a skip must be visible.
        use std::io::Write as _;
        let _ = writeln!(
            std::io::stderr(),
            "SKIP c_examples: `{tool}` not found (install it, or run scripts/test.sh)"
        );
    }
    found
}

fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

fn randv(r: &mut ChaCha8Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| r.gen_range(-1.0f32..1.0)).collect()
}

fn write_f32(dir: &Path, name: &str, v: &[f32]) {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    std::fs::write(dir.join(name), bytes).unwrap();
}

fn write_f16(dir: &Path, name: &str, v: &[f16]) {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect();
    std::fs::write(dir.join(name), bytes).unwrap();
}

/// The interpreter's attention for the last `t` of `s` cached tokens.
fn reference_attention(
    format: KvFormat,
    q: &[f16],
    k: &[f32],
    v: &[f32],
    (t, s): (usize, usize),
    (hq, kvh, d): (usize, usize, usize),
) -> Vec<f32> {
    let name = if t == 1 {
        format.kernel_name()
    } else {
        "attention-prefill-f16"
    };
    let kernel = library::get(name).unwrap();
    let bind = |f: Format, x: &[f32]| match f {
        Format::F16 => Value::F16(x.iter().map(|&v| f16::from_f32(v)).collect()),
        f => Value::Quant(quant::quantize(f, s * kvh, d, x).unwrap()),
    };
    let mut b = Bindings::new()
        .extent("hq", hq)
        .extent("kvh", kvh)
        .extent("d", d)
        .extent("s", s)
        .tensor("q", Value::F16(q.to_vec()))
        .tensor("k", bind(format.key_format(), k))
        .tensor("v", bind(format.value_format(), v));
    if t != 1 {
        b = b.extent("t", t);
    }
    interp::run(&kernel, &b).unwrap().get("o").unwrap().to_vec()
}

/// Inputs and references for `linear.c`.
fn write_linear_data(dir: &Path) {
    let (n, k) = (37, 64);
    let ms = [1usize, 3, 17];
    let mut r = rng(7);
    let w = randv(&mut r, n * k);
    let bias = randv(&mut r, n);
    let wh: Vec<f16> = w.iter().map(|&x| f16::from_f32(x)).collect();
    let w_from_h: Vec<f32> = wh.iter().map(|x| x.to_f32()).collect();
    write_f32(dir, "w.f32", &w);
    write_f16(dir, "w.f16", &wh);
    write_f32(dir, "bias.f32", &bias);
    // The W4A8 weights as a model file would hold them (the runtime's own
    // quantizer, so the layer equals the one made from f32).
    let kernel = library::get(WeightFormat::W4A8.library_kernel()).unwrap();
    let w_format = kernel
        .tensor(&kernel.as_matmul().unwrap().w)
        .unwrap()
        .format;
    let q = quant::quantize(w_format, n, k, &w).unwrap();
    std::fs::write(dir.join("wq.codes"), &q.codes).unwrap();
    write_f32(dir, "wq.scales", &q.scales);
    write_f32(dir, "wq.offsets", &q.offsets);
    for &m in &ms {
        let x = randv(&mut r, m * k);
        write_f32(dir, &format!("x_m{m}.f32"), &x);
        let shape = (m, n, k);
        let f32_ref = reference_linear(WeightFormat::F32, &x, &w, &bias, shape);
        let w4a8 = reference_linear(WeightFormat::W4A8, &x, &w, &bias, shape);
        let w4a8_h = reference_linear(WeightFormat::W4A8, &x, &w_from_h, &bias, shape);
        write_f32(dir, &format!("y_f32_m{m}.f32"), &f32_ref);
        write_f32(dir, &format!("y_w4a8_m{m}.f32"), &w4a8);
        write_f32(dir, &format!("y_w4a8_f16w_m{m}.f32"), &w4a8_h);
    }
    let list: Vec<String> = ms.iter().map(ToString::to_string).collect();
    std::fs::write(
        dir.join("linear.txt"),
        format!("{n} {k} {} {}\n", ms.len(), list.join(" ")),
    )
    .unwrap();
}

/// Inputs and references for `decode.cpp`.
fn write_attention_data(dir: &Path) {
    let (hq, kvh, d, steps, t) = (4usize, 2usize, 32usize, 5usize, 3usize);
    let heads = (hq, kvh, d);
    let mut r = rng(11);
    let (mut ks, mut vs) = (Vec::new(), Vec::new());
    for s in 0..steps {
        let k = randv(&mut r, kvh * d);
        let v = randv(&mut r, kvh * d);
        let q: Vec<f16> = randv(&mut r, hq * d)
            .into_iter()
            .map(|x| f16::from_f32(x * 0.3))
            .collect();
        write_f32(dir, &format!("k_{s}.f32"), &k);
        write_f32(dir, &format!("v_{s}.f32"), &v);
        write_f16(dir, &format!("q_{s}.f16"), &q);
        ks.extend(k);
        vs.extend(v);
        for (format, name) in [(KvFormat::F16, "f16"), (KvFormat::Kv8, "kv8")] {
            let o = reference_attention(format, &q, &ks, &vs, (1, s + 1), heads);
            write_f32(dir, &format!("o_{name}_{s}.f32"), &o);
        }
    }
    let q: Vec<f16> = randv(&mut r, t * hq * d)
        .into_iter()
        .map(|x| f16::from_f32(x * 0.3))
        .collect();
    write_f16(dir, "q_prefill.f16", &q);
    let o = reference_attention(KvFormat::F16, &q, &ks, &vs, (t, steps), heads);
    write_f32(dir, "o_prefill.f32", &o);
    std::fs::write(
        dir.join("attention.txt"),
        format!("{hq} {kvh} {d} {steps} {t}\n"),
    )
    .unwrap();
}

/// A record measured on "another device" (this one's fingerprint with
/// another CPU model), and a file that is not a record.
fn write_records(dir: &Path) {
    let mut fingerprint = Fingerprint::detect();
    fingerprint.cpu_model = "Another CPU (capi test)".into();
    let record = TuningRecord {
        schema: RECORD_SCHEMA,
        entries: vec![DeviceEntry {
            prefill: None,
            decode: None,
            weight_prefetch: None,
            fingerprint,
            generator: current_generator(),
            // The backend the examples open (the best host backend), so
            // the fingerprint is what refuses it.
            backend: Backend::best_host().record_name().into(),
            format: "f32".into(),
            model: "capi-test".into(),
            threads: 1,
            partial: false,
            created_unix: 0,
            limits: Limits::default(),
            core_weights: vec![1.0],
            shapes: vec![],
        }],
    };
    record.save(&dir.join("foreign_record.json")).unwrap();
    std::fs::write(dir.join("not_a_record.json"), "{ not json").unwrap();
}

/// Where cargo put libtessera.{a,so} for this test run. `cargo test` builds
/// the library's staticlib and cdylib into `target/<profile>/deps` (this
/// binary's own folder) and copies them up to `target/<profile>` only on
/// `cargo build`, so the deps copy is the one that matches this run; the
/// folder above is the fallback for a library built by hand.
fn library_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap().to_path_buf();
    let has_both = |dir: &Path| {
        ["libtessera.a", "libtessera.so"]
            .iter()
            .all(|lib| dir.join(lib).is_file())
    };
    if has_both(&deps) {
        return deps;
    }
    let profile_dir = deps.parent().unwrap().to_path_buf();
    assert!(
        has_both(&profile_dir),
        "libtessera.a and libtessera.so not found in {} or {}: build them with `cargo build -p tessera-capi`",
        deps.display(),
        profile_dir.display()
    );
    profile_dir
}

/// An install-style prefix (include/, lib/, lib/pkgconfig/tessera.pc from
/// `tessera.pc.in`) so the examples are built the way an engine builds.
fn make_prefix(root: &Path) -> PathBuf {
    let prefix = root.join("prefix");
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    std::fs::create_dir_all(prefix.join("include")).unwrap();
    std::fs::create_dir_all(prefix.join("lib/pkgconfig")).unwrap();
    std::fs::copy(
        crate_dir.join("include/tessera.h"),
        prefix.join("include/tessera.h"),
    )
    .unwrap();
    // Copies without debug info: what the test profile keeps (line
    // tables) still makes every static link and valgrind's start slower.
    let libs = library_dir();
    for lib in ["libtessera.a", "libtessera.so"] {
        run(Command::new("strip")
            .arg("--strip-debug")
            .arg("-o")
            .arg(prefix.join("lib").join(lib))
            .arg(libs.join(lib)));
    }
    let pc = std::fs::read_to_string(crate_dir.join("tessera.pc.in"))
        .unwrap()
        .replace("@PREFIX@", prefix.to_str().unwrap())
        .replace("@VERSION@", env!("CARGO_PKG_VERSION"));
    std::fs::write(prefix.join("lib/pkgconfig/tessera.pc"), pc).unwrap();
    prefix
}

/// `pkg-config ARGS tessera`, split into arguments.
fn pkg_config(prefix: &Path, args: &[&str]) -> Vec<String> {
    let out = Command::new("pkg-config")
        .args(args)
        .arg("tessera")
        .env("PKG_CONFIG_PATH", prefix.join("lib/pkgconfig"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "pkg-config {args:?} tessera: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// How a dynamically linked example is checked for memory errors.
#[derive(Clone, Copy)]
enum Check {
    Valgrind,
    Asan,
}

fn run(cmd: &mut Command) {
    let shown = format!("{cmd:?}");
    let start = std::time::Instant::now();
    let out = cmd.output().unwrap_or_else(|e| panic!("{shown}: {e}"));
    print!("{}", String::from_utf8_lossy(&out.stdout));
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "failed ({}): {shown}", out.status);
    println!("({:.1} s) {shown}", start.elapsed().as_secs_f64());
}

#[test]
fn c_and_cpp_examples_match_the_interpreter_static_and_shared_memcheck_clean() {
    if !["cc", "c++", "pkg-config", "valgrind", "strip"]
        .into_iter()
        .all(have)
    {
        return;
    }
    let root = std::env::temp_dir().join(format!("tessera-capi-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let data = root.join("data");
    std::fs::create_dir_all(&data).unwrap();
    write_linear_data(&data);
    write_attention_data(&data);
    write_records(&data);
    let prefix = make_prefix(&root);
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let cflags = pkg_config(&prefix, &["--cflags"]);
    let shared_libs = pkg_config(&prefix, &["--libs"]);
    // The static link names the archive itself (with both present, -l
    // would pick the shared one) plus the system libraries it needs.
    let mut static_libs = vec![prefix.join("lib/libtessera.a").display().to_string()];
    static_libs.extend(
        pkg_config(&prefix, &["--static", "--libs"])
            .into_iter()
            .filter(|a| a.starts_with("-l") && a != "-ltessera"),
    );
    let rpath = format!("-Wl,-rpath,{}", prefix.join("lib").display());
    let suppressions = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/valgrind.supp");
    // How each example's dynamically linked build is checked for memory
    // errors: valgrind where it is quick; the decode example JITs its
    // attention kernels with cranelift, which valgrind slows ~20x, so it
    // is checked by AddressSanitizer (with leak detection) instead, built
    // against the static library.
    let checks = [
        ("linear.c", "cc", "-std=c11", Check::Valgrind),
        ("decode.cpp", "c++", "-std=c++17", Check::Asan),
        ("bad_calls.c", "cc", "-std=c11", Check::Valgrind),
    ];
    // One thread per example: the checked runs dominate, and they overlap.
    std::thread::scope(|scope| {
        for (source, compiler, std, check) in checks {
            let (root, data, examples) = (&root, &data, &examples);
            let (cflags, rpath, suppressions) = (&cflags, &rpath, &suppressions);
            let (static_libs, shared_libs) = (&static_libs, &shared_libs);
            scope.spawn(move || {
                let stem = source.split('.').next().unwrap();
                let build = |kind: &str, libs: &[String], extra: &[&str]| {
                    let exe = root.join(format!("{stem}-{kind}"));
                    run(Command::new(compiler)
                        .args([std, "-Wall", "-Wextra", "-Werror", "-g", "-O1"])
                        .args(extra)
                        .args(cflags)
                        .arg(examples.join(source))
                        .arg("-o")
                        .arg(&exe)
                        .args(libs)
                        .arg(rpath)
                        .arg("-lm"));
                    exe
                };
                let exe = build("static", static_libs, &[]);
                run(Command::new(&exe).arg(data));
                let exe = build("shared", shared_libs, &[]);
                match check {
                    Check::Valgrind => run(Command::new("valgrind")
                        .args([
                            "--quiet",
                            "--error-exitcode=1",
                            "--leak-check=full",
                            "--errors-for-leak-kinds=definite,possible",
                        ])
                        .arg(format!("--suppressions={}", suppressions.display()))
                        .arg(&exe)
                        .arg(data)),
                    Check::Asan => {
                        run(Command::new(&exe).arg(data));
                        let asan = ["-fsanitize=address", "-fno-omit-frame-pointer"];
                        let exe = build("asan", static_libs, &asan);
                        run(Command::new(&exe)
                            .arg(data)
                            .env("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=0"));
                    }
                }
            });
        }
    });
    std::fs::remove_dir_all(&root).unwrap();
}
