//! The PTX split-K decode attention on a CUDA device against the reference
//! interpreter (f16 and int8-key/fp8-value caches, GQA, tails in d and in
//! the sequence, adversarial scores that force the recompute path), and
//! the runner's input checks, which need no device. Without a CUDA driver
//! the device tests print a visible SKIP line.

#![cfg(feature = "cuda")]

use half::f16;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tessera_codegen::ptx::{PtxAttentionProgram, PtxBackend, Sm};
use tessera_dsl::interp::{Bindings, Value, run};
use tessera_dsl::ir::ParamType;
use tessera_dsl::quant::quantize;
use tessera_dsl::{Format, Group, Kernel, library};
use tessera_runtime::cuda::{
    CudaDevice, CudaError, check_attention, driver_present, run_attention, run_prefill,
};

/// The device, or a SKIP line naming why there is none.
fn device(test: &str) -> Option<CudaDevice> {
    if !driver_present() {
        eprintln!("SKIP {test}: no CUDA driver (libcuda not found)");
        return None;
    }
    match CudaDevice::first() {
        Ok(d) => Some(d),
        Err(e) => {
            eprintln!("SKIP {test}: no CUDA device ({e})");
            None
        }
    }
}

fn kernels() -> Vec<Kernel> {
    let v: Vec<Kernel> = ["attention-decode-f16", "attention-decode-kv8"]
        .iter()
        .map(|n| library::get(n).unwrap())
        .collect();
    assert_eq!(
        v[1].tensor("k").unwrap().format,
        Format::I8Asym(Group::Row, ParamType::F32)
    );
    assert_eq!(v[1].tensor("v").unwrap().format, Format::Fp8E4M3);
    v
}

fn program(sm: Sm, k: &Kernel) -> PtxAttentionProgram {
    PtxBackend::new(sm).attention_program(k).unwrap()
}

fn cache(format: Format, rows: usize, d: usize, data: &[f32]) -> Value {
    match format {
        Format::F16 => Value::F16(data.iter().map(|&v| f16::from_f32(v)).collect()),
        f => Value::Quant(quantize(f, rows, d, data).unwrap()),
    }
}

struct Shape {
    hq: usize,
    kvh: usize,
    d: usize,
    s: usize,
}

struct Case {
    q: Vec<f16>,
    k: Value,
    v: Value,
}

fn case(kernel: &Kernel, sh: &Shape, q_amp: f32, k_amp: f32, rng: &mut ChaCha8Rng) -> Case {
    let Shape { hq, kvh, d, s } = *sh;
    let kf = kernel.tensor("k").unwrap().format;
    let vf = kernel.tensor("v").unwrap().format;
    let q = (0..hq * d)
        .map(|_| f16::from_f32(rng.gen_range(-q_amp..q_amp)))
        .collect();
    let kd: Vec<f32> = (0..s * kvh * d)
        .map(|_| rng.gen_range(-k_amp..k_amp))
        .collect();
    let vd: Vec<f32> = (0..s * kvh * d).map(|_| rng.gen_range(-2.0..2.0)).collect();
    Case {
        q,
        k: cache(kf, s * kvh, d, &kd),
        v: cache(vf, s * kvh, d, &vd),
    }
}

/// Runs one case on the device; the (interpreter, kernel) recompute counts.
fn check(dev: &CudaDevice, kernel: &Kernel, sh: &Shape, c: &Case) -> (usize, usize) {
    let Shape { hq, kvh, d, s } = *sh;
    let b = Bindings::decode_attention(
        [hq, kvh, d, s],
        Value::F16(c.q.clone()),
        c.k.clone(),
        c.v.clone(),
    );
    let out = run(kernel, &b).unwrap();
    let want = out.get("o").unwrap().to_vec();
    let prog = program(dev.sm(), kernel);
    let got = run_attention(dev, &prog, &c.q, &c.k, &c.v, hq, kvh, d, s)
        .unwrap_or_else(|e| panic!("{} hq={hq} kvh={kvh} d={d} s={s}: {e}", kernel.name));
    assert_eq!(got.splits, s.div_ceil(prog.plan.keys_per_split as usize));
    assert_eq!(got.o.len(), want.len());
    for (i, (&g, &w)) in got.o.iter().zip(&want).enumerate() {
        // Outputs are f16: a few ulps relative, plus fp32 softmax noise
        // (ex2.approx is within 2 ulp).
        let tol = 4e-3 * w.abs() + 2e-3;
        assert!(
            (g - w).abs() <= tol,
            "{} hq={hq} kvh={kvh} d={d} s={s} at {i}: got {g} want {w}",
            kernel.name
        );
    }
    (out.softmax.unwrap().recomputed, got.recomputed)
}

#[test]
fn no_driver_is_a_clear_error_before_any_attention_launch() {
    if driver_present() {
        eprintln!("SKIP no_driver_is_a_clear_error_before_any_attention_launch: a driver exists");
        return;
    }
    eprintln!(
        "SKIP: no CUDA driver (libcuda not found); run_attention needs a device, which is a clear error"
    );
    match CudaDevice::first() {
        Err(CudaError::NoDriver(msg)) => assert!(msg.contains("driver"), "{msg}"),
        other => panic!("expected NoDriver, got {other:?}"),
    }
}

#[test]
fn inputs_are_checked_before_the_device() {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let [f16k, kv8] = <[Kernel; 2]>::try_from(kernels()).unwrap();
    let sh = Shape {
        hq: 4,
        kvh: 2,
        d: 40,
        s: 130,
    };
    let good = case(&kv8, &sh, 0.1, 1.0, &mut rng);
    let p8 = program(Sm::Sm80, &kv8);
    let ok = check_attention(&p8, &good.q, &good.k, &good.v, 4, 2, 40, 130).unwrap();
    assert_eq!(
        ok.splits,
        130usize.div_ceil(p8.plan.keys_per_split as usize)
    );
    // int8 keys carry one scale and offset per cached row; fp8 values none.
    assert_eq!(ok.k.codes.len(), 130 * 2 * 40);
    assert_eq!((ok.k.scales.len(), ok.k.offsets.len()), (260, 260));
    assert!(ok.v.scales.is_empty() && ok.v.offsets.is_empty());
    let is_input = |r: Result<_, CudaError>| matches!(r, Err(CudaError::Input(_)));
    // GQA must divide, KV heads must exist, the sequence must not be empty.
    assert!(is_input(check_attention(
        &p8, &good.q, &good.k, &good.v, 4, 3, 40, 130
    )));
    assert!(is_input(check_attention(
        &p8, &good.q, &good.k, &good.v, 4, 0, 40, 130
    )));
    assert!(is_input(check_attention(
        &p8, &good.q, &good.k, &good.v, 4, 2, 40, 0
    )));
    // q of the wrong length; caches of the wrong shape.
    assert!(is_input(check_attention(
        &p8,
        &good.q[1..],
        &good.k,
        &good.v,
        4,
        2,
        40,
        130
    )));
    assert!(is_input(check_attention(
        &p8, &good.q, &good.k, &good.v, 4, 2, 40, 129
    )));
    // Caches in formats the program does not read.
    let f16case = case(&f16k, &sh, 0.1, 1.0, &mut rng);
    assert!(is_input(check_attention(
        &p8, &good.q, &f16case.k, &good.v, 4, 2, 40, 130
    )));
    let pf = program(Sm::Sm90, &f16k);
    assert!(is_input(check_attention(
        &pf, &good.q, &good.k, &f16case.v, 4, 2, 40, 130
    )));
    // f16 caches travel as little-endian half bits.
    let okf = check_attention(&pf, &f16case.q, &f16case.k, &f16case.v, 4, 2, 40, 130).unwrap();
    let Value::F16(kh) = &f16case.k else {
        panic!("f16 cache")
    };
    assert_eq!(&okf.k.codes[..2], &kh[0].to_bits().to_le_bytes());
    assert_eq!(okf.k.codes.len(), 2 * kh.len());
}

#[test]
fn decode_attention_matches_the_interpreter() {
    let Some(dev) = device("decode_attention_matches_the_interpreter") else {
        return;
    };
    let mut rng = ChaCha8Rng::seed_from_u64(21);
    let mut shapes = vec![
        Shape {
            hq: 4,
            kvh: 1,
            d: 64,
            s: 1,
        },
        Shape {
            hq: 8,
            kvh: 2,
            d: 20,
            s: 130,
        },
        Shape {
            hq: 2,
            kvh: 2,
            d: 128,
            s: 64,
        },
        Shape {
            hq: 12,
            kvh: 2,
            d: 128,
            s: 300,
        },
        Shape {
            hq: 6,
            kvh: 3,
            d: 80,
            s: 65,
        },
        // Nine 256-key splits with a tail: the combine's warps each fold
        // more than one.
        Shape {
            hq: 4,
            kvh: 2,
            d: 128,
            s: 2100,
        },
    ];
    for _ in 0..3 {
        let kvh = rng.gen_range(1..=3);
        shapes.push(Shape {
            hq: kvh * rng.gen_range(1..=4),
            kvh,
            d: rng.gen_range(1..=136),
            s: rng.gen_range(1..=300),
        });
    }
    for k in kernels() {
        for sh in &shapes {
            // Benign scores: |q·k| stays well inside [-16.8, 6.5].
            let amp = (1.0 / sh.d as f32).sqrt();
            let c = case(&k, sh, amp, 1.0, &mut rng);
            let (interp, kernel) = check(&dev, &k, sh, &c);
            assert_eq!(interp, 0, "benign scores never recompute in the oracle");
            assert_eq!(kernel, 0, "benign scores never recompute in the kernel");
        }
    }
}

#[test]
fn adversarial_scores_take_the_recompute_path() {
    let Some(dev) = device("adversarial_scores_take_the_recompute_path") else {
        return;
    };
    let mut rng = ChaCha8Rng::seed_from_u64(22);
    for k in kernels() {
        for sh in [
            Shape {
                hq: 4,
                kvh: 2,
                d: 32,
                s: 200,
            },
            Shape {
                hq: 2,
                kvh: 1,
                d: 64,
                s: 64,
            },
        ] {
            // Scores of tens to hundreds: e^(x - 0) would overflow fp32.
            let c = case(&k, &sh, 3.0, 3.0, &mut rng);
            let (interp, kernel) = check(&dev, &k, &sh, &c);
            assert!(interp > 0, "the oracle recomputed");
            assert!(kernel > 0, "the kernel took the recompute path");
        }
    }
}

/// One causal prefill on the device against the interpreter: `p` cached
/// tokens, then `t` prompt tokens as queries.
#[allow(clippy::too_many_arguments)]
fn check_prefill(
    dev: &CudaDevice,
    kernel: &Kernel,
    (p, t, hq, kvh, d): (usize, usize, usize, usize, usize),
    q_amp: f32,
    rng: &mut ChaCha8Rng,
) {
    let s = p + t;
    let kf = kernel.tensor("k").unwrap().format;
    let vf = kernel.tensor("v").unwrap().format;
    let q: Vec<f16> = (0..t * hq * d)
        .map(|_| f16::from_f32(rng.gen_range(-q_amp..q_amp)))
        .collect();
    let kd: Vec<f32> = (0..s * kvh * d).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let vd: Vec<f32> = (0..s * kvh * d).map(|_| rng.gen_range(-2.0..2.0)).collect();
    let (k, v) = (cache(kf, s * kvh, d, &kd), cache(vf, s * kvh, d, &vd));
    let b = Bindings::new()
        .extent("t", t)
        .extent("hq", hq)
        .extent("kvh", kvh)
        .extent("d", d)
        .extent("s", s)
        .tensor("q", Value::F16(q.clone()))
        .tensor("k", k.clone())
        .tensor("v", v.clone());
    let out = run(kernel, &b).unwrap();
    let want = out.get("o").unwrap();
    let prog = PtxBackend::new(dev.sm())
        .prefill_program(kernel, d)
        .unwrap();
    let what = format!(
        "{} p={p} t={t} hq={hq} kvh={kvh} d={d} amp={q_amp}",
        kernel.name
    );
    let got = run_prefill(dev, &prog, &q, &k, &v, t, hq, kvh, s)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(got.len(), want.len());
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        // f16 output and f16 P in the P·V mma: a few ulps relative, plus
        // ex2.approx's 2 ulp.
        let tol = 4e-3 * w.abs() + 3e-3;
        assert!(
            (g - w).abs() <= tol,
            "{what}: o[{i}] (token {}, head {}) = {g}, want {w}",
            i / (hq * d),
            i / d % hq
        );
    }
}

/// The tensor-core prefill (`mma.sync`, `ldmatrix` and `ldmatrix.trans`,
/// `cp.async`) on the GPU: f16 and kv8 caches, head dims 64, 80, 96, 128,
/// 256, GQA 1 to 8, prefixes 0, 1 and 17, rows and keys around the 64-row
/// and 64-key blocks; scores far outside the usual range with f16 keys.
#[test]
fn prefill_matches_the_interpreter() {
    let Some(dev) = device("prefill_matches_the_interpreter") else {
        return;
    };
    let mut rng = ChaCha8Rng::seed_from_u64(41);
    for name in ["attention-prefill-f16", "attention-prefill-kv8"] {
        let kernel = library::get(name).unwrap();
        for &p in &[0usize, 1, 17] {
            for &(t, hq, kvh) in &[
                (1usize, 2usize, 2usize),
                (70, 12, 2),
                (33, 8, 1),
                (130, 6, 3),
            ] {
                for d in [64, 80, 96, 128, 256] {
                    check_prefill(&dev, &kernel, (p, t, hq, kvh, d), 0.5, &mut rng);
                }
            }
        }
        // Long prompts: many key blocks, blocks of rows in reverse.
        for &(p, t) in &[(200usize, 300usize), (0, 1000)] {
            check_prefill(&dev, &kernel, (p, t, 32, 32, 128), 0.5, &mut rng);
        }
    }
    let f16k = library::get("attention-prefill-f16").unwrap();
    for &(p, t) in &[(0usize, 100usize), (17, 200)] {
        check_prefill(&dev, &f16k, (p, t, 12, 2, 128), 8.0, &mut rng);
    }
}

/// Bad shapes are errors before the device is touched.
#[test]
fn prefill_inputs_are_checked() {
    let Some(dev) = device("prefill_inputs_are_checked") else {
        return;
    };
    let kernel = library::get("attention-prefill-f16").unwrap();
    let prog = PtxBackend::new(dev.sm())
        .prefill_program(&kernel, 64)
        .unwrap();
    let (k, v) = (
        Value::F16(vec![f16::ZERO; 4 * 64]),
        Value::F16(vec![f16::ZERO; 4 * 64]),
    );
    let q = vec![f16::ZERO; 2 * 2 * 64];
    for (t, hq, kvh, s, why) in [
        (2, 3, 2, 4, "multiple"),
        (5, 2, 1, 4, "prefill of 5 tokens"),
        (0, 2, 1, 4, "prefill of 0 tokens"),
        (2, 2, 1, 3, "k"),
    ] {
        let e = run_prefill(&dev, &prog, &q, &k, &v, t, hq, kvh, s)
            .unwrap_err()
            .to_string();
        assert!(e.contains(why), "{e}");
    }
}
