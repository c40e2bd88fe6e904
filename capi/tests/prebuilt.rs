//! A kernel set written by `tessera-kernels-gen gen` opens through the C API
//! (`options.prebuilt_dir`): the device runs those kernels, no JIT, and its
//! outputs agree with the reference interpreter (and equal the JIT
//! device's: both run the same emitted code). A missing directory and a
//! tampered kernel file are refused with a status and a message.

use std::ffi::{CStr, CString};

use tessera::*;
use tessera_runtime::WeightFormat;

mod common;
use common::reference_linear;
use tessera_dsl::models::LayerShape;
use tessera_kernels_gen::{GenConfig, ModelSpec, generate};

fn last_error() -> String {
    // SAFETY: the library returns a valid NUL-terminated string.
    unsafe { CStr::from_ptr(tessera_last_error()) }
        .to_string_lossy()
        .into_owned()
}

fn open(prebuilt: Option<&CString>) -> Result<TesseraDevice, (TesseraStatus, String)> {
    let mut opts = std::mem::MaybeUninit::<TesseraDeviceOptions>::uninit();
    let mut dev = TesseraDevice::default();
    // SAFETY: opts is written by the default call before it is read.
    let status = unsafe {
        assert_eq!(
            tessera_device_options_default(opts.as_mut_ptr()),
            TesseraStatus::Ok
        );
        let mut opts = opts.assume_init();
        opts.backend = TESSERA_BACKEND_X86;
        opts.threads = 2;
        if let Some(dir) = prebuilt {
            opts.prebuilt_dir = dir.as_ptr();
        }
        tessera_device_open(&opts, &mut dev)
    };
    if status == TesseraStatus::Ok {
        Ok(dev)
    } else {
        Err((status, last_error()))
    }
}

fn run(dev: TesseraDevice, w: &[f32], n: usize, k: usize, x: &[f32], m: usize) -> Vec<f32> {
    let mut lin = TesseraLinear::default();
    let mut y = vec![0.0f32; m * n];
    // SAFETY: every pointer comes with its true length.
    unsafe {
        let s = tessera_linear_create_f32(
            dev,
            TESSERA_FORMAT_W4A8,
            w.as_ptr(),
            w.len(),
            n,
            k,
            std::ptr::null(),
            0,
            &mut lin,
        );
        assert_eq!(s, TesseraStatus::Ok, "{}", last_error());
        let s = tessera_linear_forward(
            lin,
            x.as_ptr().cast(),
            x.len(),
            m,
            y.as_mut_ptr().cast(),
            y.len(),
        );
        assert_eq!(s, TesseraStatus::Ok, "{}", last_error());
    }
    assert_eq!(tessera_linear_close(lin), TesseraStatus::Ok);
    y
}

#[test]
fn a_generated_directory_runs_through_the_c_api() {
    let Ok(jit) = open(None) else {
        println!("SKIP prebuilt C API test: no x86 backend on this CPU");
        return;
    };
    let (n, k) = (24, 64);
    let dir = std::env::temp_dir().join(format!("tessera-capi-prebuilt-{}", std::process::id()));
    let mut cfg = GenConfig::new(
        ["x86-avx2"],
        ModelSpec::Shapes {
            model: "capi-test".into(),
            shapes: vec![LayerShape {
                name: "o".into(),
                n,
                k,
            }],
        },
        &dir,
    );
    cfg.formats = vec!["w4a8".into()];
    generate(&cfg).expect("generate a kernel set");
    let cdir = CString::new(dir.to_str().unwrap()).unwrap();
    let pre = open(Some(&cdir)).unwrap_or_else(|(s, m)| panic!("{s:?}: {m}"));

    let w: Vec<f32> = (0..n * k)
        .map(|i| ((i * 37) % 23) as f32 / 23.0 - 0.5)
        .collect();
    for m in [1, 3, 17, 40] {
        let x: Vec<f32> = (0..m * k)
            .map(|i| ((i * 11) % 13) as f32 / 13.0 - 0.4)
            .collect();
        let reference = reference_linear(WeightFormat::W4A8, &x, &w, &vec![0.0; n], (m, n, k));
        let got = run(pre, &w, n, k, &x, m);
        let scale = reference.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        for (i, (a, b)) in got.iter().zip(&reference).enumerate() {
            assert!(
                (a - b).abs() <= 1e-4 * (1.0 + scale),
                "m={m} y[{i}] = {a}, the interpreter gives {b}"
            );
        }
        let want = run(jit, &w, n, k, &x, m);
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert!(
                (a - b).abs() <= 1e-5 * (1.0 + scale),
                "m={m} y[{i}] = {a}, JIT gives {b}"
            );
        }
    }
    assert_eq!(tessera_device_close(pre), TesseraStatus::Ok);
    assert_eq!(tessera_device_close(jit), TesseraStatus::Ok);

    // A kernel file that no longer matches the manifest is refused.
    let bin = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "bin"))
        .expect("a machine-code kernel file");
    let mut bytes = std::fs::read(&bin).unwrap();
    bytes[0] ^= 0xFF;
    std::fs::write(&bin, bytes).unwrap();
    let (status, message) = open(Some(&cdir)).unwrap_err();
    assert_eq!(status, TesseraStatus::Unavailable, "{message}");
    assert!(message.contains("does not match the manifest"), "{message}");
    std::fs::remove_dir_all(&dir).ok();

    // A directory that does not exist.
    let (status, message) = open(Some(&cdir)).unwrap_err();
    assert_eq!(status, TesseraStatus::Io, "{message}");
    assert!(message.contains("manifest.json"), "{message}");
}
