//! `--backend opencl` end to end on whatever OpenCL device exists (PoCL
//! here): a small custom model tuned within a small budget, the record it
//! writes selected for this device (fingerprint with the OpenCL device)
//! and loaded by the runtime's OpenCL `Device`, whose `Linear`s dispatch
//! by the record's breakpoints and still compute the right thing; and the
//! GPU/NEON error paths. Without an OpenCL platform the tuning test SKIPs.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::Arc;

use half::f16;
use tessera_runtime::opencl::ClDevice;
use tessera_runtime::record::{GeneratorId, TuningRecord};
use tessera_runtime::{
    Backend, Device, DeviceOptions, Input, Linear, Output as Out, PlanSource, WeightFormat, Weights,
};

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tessera-autotune-cl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tessera-autotune"))
        .args(args)
        .arg("--quiet")
        .output()
        .unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn opencl_tunes_a_small_model_and_the_runtime_loads_the_record() {
    let dev = match ClDevice::first() {
        Ok(d) => d,
        Err(e) => {
            tessera_dsl::testing::missing_tool(
                "opencl tuning",
                &format!("no OpenCL platform (PoCL): {e}"),
            );
            return;
        }
    };
    let cfg = tmp("small/config.json");
    std::fs::create_dir_all(cfg.parent().unwrap()).unwrap();
    std::fs::write(
        &cfg,
        r#"{"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4,
            "num_key_value_heads": 2, "vocab_size": 100}"#,
    )
    .unwrap();
    let out = tmp("small-opencl.json");
    let _ = std::fs::remove_file(&out);
    let o = run(&[
        "--model",
        cfg.to_str().unwrap(),
        "--backend",
        "opencl",
        "--budget",
        "30",
        "--out",
        out.to_str().unwrap(),
        "--no-plots",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        stdout.contains("backend opencl") && stdout.contains("M1 = "),
        "{stdout}"
    );

    let record = TuningRecord::load(&out).unwrap();
    let entry = &record.entries[0];
    assert_eq!(entry.backend, "opencl");
    assert_eq!(entry.format, "w4a16", "the GPU default format");
    assert!(!entry.partial);
    assert!(
        entry
            .fingerprint
            .gpus
            .iter()
            .any(|g| g.api == "opencl" && g.device == dev.name),
        "{:?}",
        entry.fingerprint.gpus
    );
    assert!(entry.limits.read_gbps > 0.0 && entry.limits.mac_gops > 0.0);
    assert_eq!(entry.shapes.len(), 4);
    for s in &entry.shapes {
        assert!(1 <= s.m1 && s.m1 <= s.m2 && s.m2 <= 4097, "{s:?}");
        assert_eq!(s.winners.len(), 3);
        assert!(s.winners.iter().all(|w| w.target == "opencl-gpu"));
    }
    drop(dev);

    // The runtime on the same OpenCL device takes the record.
    let generator = GeneratorId {
        version: tessera_codegen::GENERATOR_VERSION.into(),
        template_hash: tessera_codegen::TEMPLATE_HASH.into(),
    };
    let device = Arc::new(
        Device::open(
            Backend::OpenCl,
            DeviceOptions {
                record: Some(record.clone()),
                ..Default::default()
            },
        )
        .unwrap(),
    );
    assert!(
        record
            .select(device.fingerprint(), &generator, "opencl", "w4a16")
            .is_ok()
    );
    for s in &entry.shapes {
        let w: Vec<f32> = (0..s.n * s.k)
            .map(|i| ((i % 13) as f32 - 6.0) / 16.0)
            .collect();
        let lin = Linear::new(
            &device,
            WeightFormat::W4A16,
            Weights::F32(&w),
            s.n,
            s.k,
            None,
        )
        .unwrap();
        assert_eq!(lin.plan().source, PlanSource::Record, "{}", lin.plan());
        assert_eq!((lin.plan().m1, lin.plan().m2), (s.m1, s.m2));
        for (v, w) in lin.plan().variants.iter().zip(&s.winners) {
            assert_eq!(v.tile, w.tile);
        }
        // x = e_0 (one-hot): y is the first column of the dequantized w.
        let m = s.m1.min(3);
        let mut x = vec![f16::ZERO; m * s.k];
        for r in 0..m {
            x[r * s.k] = f16::ONE;
        }
        let mut y = vec![0f32; m * s.n];
        lin.forward(Input::F16(&x), m, Out::F32(&mut y)).unwrap();
        for r in 0..m {
            for c in 0..s.n {
                let want = w[c * s.k];
                let got = y[r * s.n + c];
                assert!(
                    (got - want).abs() < 0.1,
                    "[{}, {}] row {r} col {c}: {got} vs {want}",
                    s.n,
                    s.k
                );
            }
        }
    }
}

#[test]
fn gpu_and_neon_error_paths_exit_2_with_a_reason() {
    let out = tmp("never.json");
    let o = out.to_str().unwrap();
    let r = run(&["--backend", "cuda", "--out", o]);
    assert_eq!(r.status.code(), Some(2), "{}", stderr(&r));
    assert!(
        stderr(&r).contains("cuda") && stderr(&r).contains("not available"),
        "{}",
        stderr(&r)
    );
    if !cfg!(target_arch = "aarch64") {
        let r = run(&["--backend", "neon", "--out", o]);
        assert_eq!(r.status.code(), Some(2), "{}", stderr(&r));
        assert!(
            stderr(&r).contains("NEON needs an aarch64 host"),
            "{}",
            stderr(&r)
        );
    }
    if ClDevice::first().is_ok() {
        let r = run(&["--backend", "opencl", "--format", "w4a8", "--out", o]);
        assert_eq!(r.status.code(), Some(2), "{}", stderr(&r));
        assert!(
            stderr(&r).contains("OpenCL matmuls take f16"),
            "{}",
            stderr(&r)
        );
    }
    assert!(!out.exists());
}
