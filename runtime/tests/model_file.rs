//! Model files against llama.cpp's own GGUF writer and dequantizer (PyPI
//! `gguf`) and the `safetensors` crate's writer:
//!
//! - a GGUF with Q4_0, Q4_1, Q8_0, Q4_K, Q6_K, F16, BF16 and F32 tensors
//!   (and a Q5_0 one) opens; its tensors list with gguf's names, shapes and
//!   types; every supported tensor dequantizes to gguf's values bit for bit;
//!   Q5_0 is refused by name;
//! - each supported tensor gives a `Linear` on every backend here (x86,
//!   cranelift, OpenCL on PoCL) whose output matches an f64 matmul over
//!   gguf's dequantized weights, within a bound derived from the kernel's
//!   activation precision and the conversion's measured error;
//! - Q4_0 / Q4_1 / Q8_0 repack bit for bit into q4_0 / q4_1 / q8_0; K-quants
//!   requantize into the caller's format exactly as Tessera's (= ggml's)
//!   quantizer does on gguf's values, with the reported error recomputed
//!   here;
//! - safetensors F32 / F16 / BF16 tensors load the same way; I64 is refused.
//!
//! Shapes have tails: n is never a multiple of a tile, k is a multiple of 32
//! (256 for K-quants) as ggml requires, and not of 64 where the type allows.

#![cfg(feature = "jit")]

mod model_file_common;

use std::collections::HashMap;
use std::sync::Arc;

use half::{bf16, f16};
use model_file_common::{devices, gguf_pythonpath, read_f32, temp_dir, write_gguf};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tessera_dsl::ir::Format;
use tessera_dsl::quant;
use tessera_runtime::model_file::{
    Conversion, GgmlType, ModelFileError, OwnedWeights, TensorType, convert, kernel_weight_format,
};
use tessera_runtime::{Backend, Device, Input, ModelFile, Output, WeightFormat};

/// (name, ggml type, rows n, cols k)
const TENSORS: &[(&str, &str, usize, usize)] = &[
    ("blk.0.attn_q.weight", "Q4_0", 37, 96),
    ("blk.0.attn_k.weight", "Q4_1", 19, 160),
    ("blk.0.attn_v.weight", "Q8_0", 23, 96),
    ("blk.0.ffn_gate.weight", "Q4_K", 13, 512),
    ("blk.0.ffn_down.weight", "Q6_K", 11, 256),
    ("blk.0.attn_output.weight", "F16", 29, 48),
    ("blk.0.ffn_up.weight", "BF16", 7, 40),
    ("output.weight", "F32", 9, 33),
    ("blk.0.ffn_norm.weight", "Q5_0", 4, 64),
];

fn specs() -> Vec<String> {
    TENSORS
        .iter()
        .map(|(n, t, r, c)| format!("{n}:{t}:{r}:{c}"))
        .collect()
}

/// The file and gguf's dequantized values per tensor, or None (SKIP).
fn gguf_file(test: &str) -> Option<(ModelFile, HashMap<String, Vec<f32>>)> {
    let py = gguf_pythonpath(test)?;
    let dir = temp_dir(test);
    write_gguf(&py, &dir, 11, &specs(), &[]);
    let file = ModelFile::open(dir.join("model.gguf")).expect("gguf's file opens");
    let deq = TENSORS
        .iter()
        .map(|(n, ..)| (n.to_string(), read_f32(&dir.join(format!("{n}.deq")))))
        .collect();
    Some((file, deq))
}

#[test]
fn gguf_lists_tensors_and_dequantizes_like_gguf_bit_for_bit() {
    let Some((file, deq)) = gguf_file("gguf_dequantize") else {
        return;
    };
    assert_eq!(file.format_name(), "GGUF v3");
    let h = file.gguf().unwrap();
    assert_eq!(
        h.meta("general.architecture").and_then(|v| v.as_str()),
        Some("llama")
    );
    assert_eq!(
        h.meta("llama.embedding_length").and_then(|v| v.as_u64()),
        Some(64)
    );
    let listed = file.tensors();
    assert_eq!(listed.len(), TENSORS.len());
    for (name, ty, n, k) in TENSORS {
        let t = listed.iter().find(|t| t.name == *name).unwrap();
        assert_eq!(t.shape, vec![*n, *k], "{name}");
        assert_eq!(t.dtype.to_string(), *ty, "{name}");
        if *ty == "Q5_0" {
            let err = file.dequantize(name).unwrap_err();
            assert!(
                matches!(&err, ModelFileError::UnsupportedType { dtype, tensor, .. } if dtype == "Q5_0" && tensor == name),
                "{err}"
            );
            let msg = err.to_string();
            assert!(msg.contains("model.gguf") && msg.contains("Q5_0"), "{msg}");
            continue;
        }
        let ours = file.dequantize(name).unwrap();
        let theirs = &deq[*name];
        assert_eq!(ours.len(), theirs.len(), "{name}");
        for (i, (a, b)) in ours.iter().zip(theirs).enumerate() {
            assert_eq!(
                a.to_bits(),
                b.to_bits(),
                "{name} ({ty}): weight {i} (row {}, col {}) is {a}, gguf says {b}",
                i / k,
                i % k
            );
        }
    }
}

#[test]
fn ggml_blocks_repack_bit_for_bit_and_k_quants_requantize_as_the_quantizer_does() {
    let Some((file, deq)) = gguf_file("gguf_repack") else {
        return;
    };
    for (name, ty, n, k) in TENSORS {
        let Ok(TensorType::Ggml(dtype)) = file.tensor(name).map(|t| t.dtype) else {
            unreachable!()
        };
        if !dtype.is_supported() {
            continue;
        }
        let exact = &deq[*name];
        for format in [WeightFormat::Q4_0, WeightFormat::Q4_1, WeightFormat::Q8_0] {
            let target = kernel_weight_format(format).unwrap();
            let (w, conversion, shape) = file.weights(name, target).unwrap();
            assert_eq!(shape, [*n, *k]);
            let OwnedWeights::Quant(q) = w else {
                panic!("{name}: {format} weights are quantized")
            };
            assert_eq!(q.format, target);
            let values: Vec<f32> = (0..n * k).map(|i| q.value(i / k, i % k)).collect();
            if dtype.name() == format.name().to_uppercase() {
                assert_eq!(conversion, Conversion::Repacked, "{name} as {format}");
                for (i, (a, b)) in values.iter().zip(exact).enumerate() {
                    assert_eq!(a.to_bits(), b.to_bits(), "{name} as {format}: weight {i}");
                }
                continue;
            }
            // Requantized: exactly the quantizer on gguf's values, with the
            // reported error recomputed here.
            let want = quant::quantize(target, *n, *k, exact).unwrap();
            assert_eq!(q, want, "{name} ({ty}) as {format}");
            let Conversion::Requantized(stats) = conversion else {
                panic!("{name} ({ty}) as {format}: {conversion:?}")
            };
            let (mut max_abs, mut sq) = (0.0f64, 0.0f64);
            for (a, b) in values.iter().zip(exact) {
                let d = (f64::from(*a) - f64::from(*b)).abs();
                max_abs = max_abs.max(d);
                sq += d * d;
            }
            let rms = (sq / exact.len() as f64).sqrt();
            assert_eq!(stats.max_abs, max_abs, "{name} as {format}");
            assert!((stats.rms - rms).abs() <= 1e-12 * rms.max(1e-30), "{name}");
            // An error bound of the target format: half a step of the
            // group's range (asymmetric) or of its largest magnitude.
            let max_w = exact.iter().fold(0.0f32, |m, v| m.max(v.abs())) as f64;
            let step = match format {
                WeightFormat::Q8_0 => max_w / 127.0,
                _ => 2.0 * max_w / 15.0,
            };
            assert!(
                max_abs <= step,
                "{name} ({ty}) as {format}: error {max_abs} above one step {step}"
            );
            println!(
                "{name} ({ty}) as {format}: max abs {:.3e}, rms {:.3e}, max |w| {:.3e}",
                stats.max_abs, stats.rms, stats.max_weight
            );
        }
    }
}

/// Bound on |y − y_exact| for one output: the kernel's activation rounding
/// (int8 per row, or f16), the weights' conversion error, f16 staging on a
/// GPU and f16 output, plus f32 summation.
struct Bound {
    x_format: Format,
    weight_err: f64,
    gpu: bool,
    f16_out: bool,
    /// NEON's f16 kernels accumulate in f16 (`fmla .8h`) on fp16 cores:
    /// the bound of the NEON suite's own f16 checks (2^-10 per √k step).
    f16_accumulation: bool,
}

impl Bound {
    fn of(&self, x_row: &[f32], w_row: &[f32], y: f64) -> f64 {
        let sum_xw: f64 = x_row
            .iter()
            .zip(w_row)
            .map(|(a, b)| f64::from(*a).abs() * f64::from(*b).abs())
            .sum();
        let sum_x: f64 = x_row.iter().map(|a| f64::from(*a).abs()).sum();
        let sum_w: f64 = w_row.iter().map(|a| f64::from(*a).abs()).sum();
        let amax = x_row.iter().fold(0.0f64, |m, a| m.max(f64::from(*a).abs()));
        let act = match self.x_format {
            Format::I8Dyn => amax / 127.0 * 0.5 * sum_w * 1.01,
            Format::F16 => sum_xw * 2f64.powi(-11),
            _ => 0.0,
        };
        let staging = if self.gpu {
            sum_xw * 2f64.powi(-10)
        } else {
            0.0
        };
        let accumulation = if self.f16_accumulation {
            sum_xw * 2f64.powi(-10) * (2.0 * (x_row.len() as f64).sqrt() + 2.0)
        } else {
            0.0
        };
        let out = if self.f16_out {
            y.abs() * 2f64.powi(-10)
        } else {
            0.0
        };
        act + sum_x * self.weight_err + staging + accumulation + out + 1e-5 * sum_xw + 1e-5
    }
}

/// Run `lin` on random x for several M and check it against the f64
/// matmul over `exact` (gguf's weights).
#[allow(clippy::too_many_arguments)]
fn check_linear(
    what: &str,
    dev: &Arc<Device>,
    lin: &tessera_runtime::Linear,
    format: WeightFormat,
    conversion: Conversion,
    exact: &[f32],
    bias: &[f32],
    n: usize,
    k: usize,
    r: &mut ChaCha8Rng,
) {
    let kernel = tessera_dsl::library::get(format.library_kernel()).unwrap();
    let mm = kernel.as_matmul().unwrap();
    let bound = Bound {
        x_format: kernel.tensor(&mm.x).unwrap().format,
        weight_err: match conversion {
            Conversion::Requantized(s) => s.max_abs,
            _ => 0.0,
        },
        gpu: dev.is_gpu(),
        f16_out: format.output() == Format::F16,
        f16_accumulation: dev.backend() == Backend::Neon && format == WeightFormat::F16,
    };
    for m in [1, 4, 19] {
        let x: Vec<f32> = (0..m * k).map(|_| r.gen_range(-1.0f32..1.0)).collect();
        let x16: Vec<f16> = x.iter().map(|&v| f16::from_f32(v)).collect();
        // What the kernel sees: f16 activations are rounded for the oracle too.
        let xs: Vec<f32> = if format.input() == Format::F16 {
            x16.iter().map(|v| v.to_f32()).collect()
        } else {
            x.clone()
        };
        let mut y = vec![0.0f32; m * n];
        let mut y16 = vec![f16::ZERO; m * n];
        let input = if format.input() == Format::F16 {
            Input::F16(&x16)
        } else {
            Input::F32(&x)
        };
        let output = if format.output() == Format::F16 {
            Output::F16(&mut y16)
        } else {
            Output::F32(&mut y)
        };
        lin.forward(input, m, output)
            .unwrap_or_else(|e| panic!("{what}: forward m={m}: {e}"));
        if format.output() == Format::F16 {
            y = y16.iter().map(|v| v.to_f32()).collect();
        }
        for i in 0..m {
            for j in 0..n {
                let xr = &xs[i * k..(i + 1) * k];
                let wr = &exact[j * k..(j + 1) * k];
                let want: f64 = xr
                    .iter()
                    .zip(wr)
                    .map(|(a, b)| f64::from(*a) * f64::from(*b))
                    .sum::<f64>()
                    + f64::from(bias[j]);
                let got = f64::from(y[i * n + j]);
                let tol = bound.of(xr, wr, want);
                assert!(
                    (got - want).abs() <= tol,
                    "{what} m={m}: y[{i}, {j}] = {got}, oracle {want} (|diff| {} > bound {tol})",
                    (got - want).abs()
                );
            }
        }
    }
}

#[test]
fn every_supported_gguf_tensor_is_a_linear_on_every_backend() {
    let Some((file, deq)) = gguf_file("gguf_linear") else {
        return;
    };
    let mut r = ChaCha8Rng::seed_from_u64(5);
    for dev in devices("gguf_linear", 2) {
        let backend = dev.backend();
        for (name, ty, n, k) in TENSORS {
            let bias: Vec<f32> = (0..*n).map(|_| r.gen_range(-0.5f32..0.5)).collect();
            let loaded = match file.linear_on(&dev, name, Some(&bias)) {
                Ok(l) => l,
                Err(ModelFileError::UnsupportedType { dtype, .. }) => {
                    assert_eq!(*ty, "Q5_0", "{name}: refused {dtype}");
                    assert_eq!(dtype, "Q5_0");
                    continue;
                }
                Err(e) => panic!("{backend}: {e}"),
            };
            let (format, conversion) = (loaded.format, loaded.conversion);
            println!("{backend} {name} ({ty}) → {format}: {conversion}");
            // ggml's blocks keep their own format where the backend runs it.
            if matches!(backend, Backend::HostX86 | Backend::Neon)
                && ["Q4_0", "Q4_1", "Q8_0"].contains(ty)
            {
                assert_eq!(format.name().to_uppercase(), *ty, "{name}");
                assert_eq!(conversion, Conversion::Repacked, "{name}");
            }
            // The GPUs read the same blocks with f16 activations.
            if matches!(backend, Backend::OpenCl | Backend::Cuda)
                && ["Q4_0", "Q4_1", "Q8_0"].contains(ty)
            {
                assert_eq!(format.name(), format!("{}a16", ty.to_lowercase()), "{name}");
                assert_eq!(conversion, Conversion::Repacked, "{name}");
            }
            if ["Q4_0", "Q4_1"].contains(ty) {
                assert!(
                    !matches!(conversion, Conversion::Requantized(_)),
                    "{backend} {name}: 4-bit blocks load without requantizing"
                );
            }
            let what = format!("{backend} {name} ({ty} as {format})");
            check_linear(
                &what,
                &dev,
                &loaded.linear,
                format,
                conversion,
                &deq[*name],
                &bias,
                *n,
                *k,
                &mut r,
            );
        }
    }
}

/// The caller's choice of format for K-quants and floats, on the host
/// backends (x86 runs the ggml formats; cranelift the f32-parameter ones).
#[test]
fn k_quants_and_floats_load_into_the_callers_format() {
    let Some((file, deq)) = gguf_file("gguf_choice") else {
        return;
    };
    let mut r = ChaCha8Rng::seed_from_u64(9);
    for dev in devices("gguf_choice", 1) {
        let formats: &[WeightFormat] = match dev.backend() {
            Backend::HostX86 | Backend::Neon => {
                &[WeightFormat::Q4_0, WeightFormat::Q8_0, WeightFormat::W4A8]
            }
            Backend::HostClif => &[WeightFormat::W4A8, WeightFormat::W8A8, WeightFormat::F32],
            _ => continue,
        };
        for (name, ty, n, k) in TENSORS {
            if !["Q4_K", "Q6_K", "F16", "BF16", "F32"].contains(ty) {
                continue;
            }
            for &format in formats {
                let loaded = file
                    .linear(&dev, name, format, None)
                    .unwrap_or_else(|e| panic!("{name} as {format}: {e}"));
                let what = format!("{} {name} ({ty} as {format})", dev.backend());
                if format == WeightFormat::F32 {
                    assert_eq!(loaded.conversion, Conversion::Exact, "{what}");
                } else {
                    assert!(
                        matches!(loaded.conversion, Conversion::Requantized(_)),
                        "{what}: {:?}",
                        loaded.conversion
                    );
                }
                let zeros = vec![0.0; *n];
                check_linear(
                    &what,
                    &dev,
                    &loaded.linear,
                    format,
                    loaded.conversion,
                    &deq[*name],
                    &zeros,
                    *n,
                    *k,
                    &mut r,
                );
            }
        }
    }
}

#[test]
fn safetensors_float_tensors_load_and_other_dtypes_are_refused_by_name() {
    use safetensors::{Dtype, serialize, tensor::TensorView};
    let mut r = ChaCha8Rng::seed_from_u64(21);
    let (n, k) = (13, 40);
    let w: Vec<f32> = (0..n * k).map(|_| r.gen_range(-2.0f32..2.0)).collect();
    let f32_bytes: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
    let f16_bytes: Vec<u8> = w
        .iter()
        .flat_map(|v| f16::from_f32(*v).to_le_bytes())
        .collect();
    let bf16_bytes: Vec<u8> = w
        .iter()
        .flat_map(|v| bf16::from_f32(*v).to_le_bytes())
        .collect();
    let i64_bytes: Vec<u8> = (0..6i64).flat_map(|v| v.to_le_bytes()).collect();
    let views = vec![
        (
            "w.f32",
            TensorView::new(Dtype::F32, vec![n, k], &f32_bytes).unwrap(),
        ),
        (
            "w.f16",
            TensorView::new(Dtype::F16, vec![n, k], &f16_bytes).unwrap(),
        ),
        (
            "w.bf16",
            TensorView::new(Dtype::BF16, vec![n, k], &bf16_bytes).unwrap(),
        ),
        (
            "ids",
            TensorView::new(Dtype::I64, vec![2, 3], &i64_bytes).unwrap(),
        ),
    ];
    let bytes = serialize(views, None).unwrap();
    let dir = temp_dir("safetensors");
    let path = dir.join("model.safetensors");
    std::fs::write(&path, bytes).unwrap();
    let file = ModelFile::open(&path).unwrap();
    assert_eq!(file.format_name(), "safetensors");
    let listed = file.tensors();
    assert_eq!(listed.len(), 4);
    let ids = listed.iter().find(|t| t.name == "ids").unwrap();
    assert_eq!(ids.shape, vec![2, 3]);
    assert_eq!(ids.dtype, TensorType::Other("I64".into()));
    let err = file.dequantize("ids").unwrap_err().to_string();
    assert!(err.contains("`ids`") && err.contains("I64"), "{err}");

    let exact = |name: &str| -> Vec<f32> {
        match name {
            "w.f32" => w.clone(),
            "w.f16" => w.iter().map(|v| f16::from_f32(*v).to_f32()).collect(),
            _ => w.iter().map(|v| bf16::from_f32(*v).to_f32()).collect(),
        }
    };
    for (name, ty) in [("w.f32", "F32"), ("w.f16", "F16"), ("w.bf16", "BF16")] {
        let t = file.tensor(name).unwrap();
        assert_eq!(t.shape, vec![n, k]);
        assert_eq!(t.dtype.to_string(), ty);
        let got = file.dequantize(name).unwrap();
        assert_eq!(got, exact(name), "{name}");
    }
    for dev in devices("safetensors", 2) {
        for name in ["w.f32", "w.f16", "w.bf16"] {
            let bias: Vec<f32> = (0..n).map(|_| r.gen_range(-0.5f32..0.5)).collect();
            let l = file.linear_on(&dev, name, Some(&bias)).unwrap();
            let what = format!("{} {name} as {}", dev.backend(), l.format);
            check_linear(
                &what,
                &dev,
                &l.linear,
                l.format,
                l.conversion,
                &exact(name),
                &bias,
                n,
                k,
                &mut r,
            );
            // Quantized on load into the caller's format (host backends).
            if !dev.is_gpu() {
                let l = file
                    .linear(&dev, name, WeightFormat::W4A8, Some(&bias))
                    .unwrap();
                assert!(matches!(l.conversion, Conversion::Requantized(_)));
                let what = format!("{} {name} as w4a8", dev.backend());
                check_linear(
                    &what,
                    &dev,
                    &l.linear,
                    WeightFormat::W4A8,
                    l.conversion,
                    &exact(name),
                    &bias,
                    n,
                    k,
                    &mut r,
                );
            }
        }
    }
}

#[test]
fn conversions_name_what_they_cannot_do() {
    // An IQ type's bytes: refused as a type Tessera cannot dequantize.
    assert!(convert::dequantize(GgmlType::IQ4_NL, 1, 32, &[0; 18]).is_err());
    // A missing tensor is named.
    let Some((file, _)) = gguf_file("gguf_shape") else {
        return;
    };
    let target = kernel_weight_format(WeightFormat::F32).unwrap();
    assert!(file.weights("output.weight", target).is_ok());
    let err = file.weights("nope", target).unwrap_err().to_string();
    assert!(err.contains("no tensor named `nope`"), "{err}");
}
