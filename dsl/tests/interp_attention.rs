//! The attention oracle checked against a naive softmax(QKᵀ)V, for decode and
//! prefill, GQA, odd head dims, every KV format, and both softmax modes.

use half::{bf16, f16};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tessera_dsl::interp::{Bindings, ONLINE_BLOCK, Outputs, SoftmaxStats, Value, run};
use tessera_dsl::quant::{QuantTensor, fp8_e4m3_to_f32, fp8_e5m2_to_f32, groups_per_row};
use tessera_dsl::*;

const ASYNC_WIDE: SoftmaxMode = SoftmaxMode::Async {
    phi: 0.0,
    lo: -30.0,
    hi: 30.0,
};

fn tensor(name: &str, role: Role, dims: &[&str], format: Format) -> Tensor {
    Tensor {
        name: name.into(),
        role,
        dims: dims.iter().map(|d| d.to_string()).collect(),
        format,
        layout: Layout::row_major(dims),
    }
}

#[derive(Clone, Copy)]
struct Spec {
    kind: AttentionKind,
    q: Format,
    k: Format,
    v: Format,
    o: Format,
    prescaled: bool,
    softmax: SoftmaxMode,
}

impl Spec {
    fn new(kind: AttentionKind, k: Format, v: Format) -> Self {
        Spec {
            kind,
            q: Format::F32,
            k,
            v,
            o: Format::F32,
            prescaled: false,
            softmax: SoftmaxMode::Online,
        }
    }
}

/// An attention kernel as a struct literal (no reliance on `verify`).
fn kernel(spec: &Spec) -> Kernel {
    let axes = [
        ("t", AxisKind::Spatial),
        ("hq", AxisKind::Spatial),
        ("kvh", AxisKind::Spatial),
        ("d", AxisKind::Reduce),
        ("s", AxisKind::Reduce),
    ];
    Kernel {
        name: "attention-test".into(),
        axes: axes
            .iter()
            .map(|&(name, kind)| Axis {
                name: name.into(),
                extent: Extent::Dyn,
                kind,
            })
            .collect(),
        tensors: vec![
            tensor("q", Role::Input, &["t", "hq", "d"], spec.q),
            tensor("k", Role::Cache, &["s", "kvh", "d"], spec.k),
            tensor("v", Role::Cache, &["s", "kvh", "d"], spec.v),
            tensor("o", Role::Output, &["t", "hq", "d"], spec.o),
        ],
        op: Op::Attention(Attention {
            kind: spec.kind,
            q: "q".into(),
            k: "k".into(),
            v: "v".into(),
            o: "o".into(),
            tokens: "t".into(),
            heads: "hq".into(),
            kv_heads: "kvh".into(),
            head_dim: "d".into(),
            seq: "s".into(),
            q_prescaled: spec.prescaled,
            softmax: spec.softmax,
        }),
        schedule: Schedule::default(),
    }
}

#[derive(Clone, Copy, Debug)]
struct Dims {
    t: usize,
    hq: usize,
    kvh: usize,
    d: usize,
    s: usize,
}

/// Float data in `format` and its stored values widened to f64.
fn float_value(format: Format, data: &[f32]) -> (Value, Vec<f64>) {
    match format {
        Format::F32 => (
            Value::F32(data.to_vec()),
            data.iter().map(|&v| f64::from(v)).collect(),
        ),
        Format::F16 => {
            let v: Vec<f16> = data.iter().map(|&v| f16::from_f32(v)).collect();
            let w = v.iter().map(|&v| f64::from(v)).collect();
            (Value::F16(v), w)
        }
        Format::BF16 => {
            let v: Vec<bf16> = data.iter().map(|&v| bf16::from_f32(v)).collect();
            let w = v.iter().map(|&v| f64::from(v)).collect();
            (Value::BF16(v), w)
        }
        f => panic!("not a float format: {f}"),
    }
}

/// A `[s·kvh, d]` cache in `format` with random contents, and its values.
fn cache(rng: &mut impl Rng, format: Format, rows: usize, cols: usize) -> (Value, Vec<f64>) {
    if matches!(format, Format::F32 | Format::F16 | Format::BF16) {
        let data: Vec<f32> = (0..rows * cols).map(|_| rng.gen_range(-1.0..1.0)).collect();
        return float_value(format, &data);
    }
    let fp8 = |b: u8| match format {
        Format::Fp8E4M3 => fp8_e4m3_to_f32(b),
        _ => fp8_e5m2_to_f32(b),
    };
    let code = |rng: &mut ChaCha8Rng| -> u8 {
        match format {
            Format::U4Asym(..) | Format::E0M4(..) => rng.gen_range(0..=15),
            Format::I8Sym(..) => rng.gen_range(-127i8..=127) as u8,
            Format::I8Asym(..) => rng.gen_range(-128i8..=127) as u8,
            // Finite fp8 values of moderate size.
            _ => loop {
                let b: u8 = rng.r#gen();
                if fp8(b).is_finite() && fp8(b).abs() <= 8.0 {
                    break b;
                }
            },
        }
    };
    let mut crng = ChaCha8Rng::seed_from_u64(rng.r#gen());
    let params = format.group().map_or(0, |g| rows * groups_per_row(g, cols));
    let q = QuantTensor {
        format,
        rows,
        cols,
        codes: (0..rows * cols).map(|_| code(&mut crng)).collect(),
        scales: (0..params).map(|_| rng.gen_range(0.002f32..0.02)).collect(),
        offsets: if format.is_asymmetric() {
            (0..params).map(|_| rng.gen_range(-0.5f32..0.5)).collect()
        } else {
            Vec::new()
        },
    };
    q.validate().unwrap();
    let values = q.dequantize().iter().map(|&v| f64::from(v)).collect();
    (Value::Quant(q), values)
}

struct Case {
    bindings: Bindings,
    q: Vec<f64>,
    k: Vec<f64>,
    v: Vec<f64>,
}

fn make_case(spec: &Spec, dims: Dims, seed: u64) -> Case {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let qdata: Vec<f32> = (0..dims.t * dims.hq * dims.d)
        .map(|_| rng.gen_range(-1.5..1.5))
        .collect();
    let (qv, q) = float_value(spec.q, &qdata);
    let (kv, k) = cache(&mut rng, spec.k, dims.s * dims.kvh, dims.d);
    let (vv, v) = cache(&mut rng, spec.v, dims.s * dims.kvh, dims.d);
    Case {
        bindings: bind(dims, qv, kv, vv),
        q,
        k,
        v,
    }
}

fn bind(dims: Dims, q: Value, k: Value, v: Value) -> Bindings {
    Bindings::new()
        .extent("t", dims.t)
        .extent("hq", dims.hq)
        .extent("kvh", dims.kvh)
        .extent("d", dims.d)
        .extent("s", dims.s)
        .tensor("q", q)
        .tensor("k", k)
        .tensor("v", v)
}

/// softmax(q·kᵀ [/ sqrt d]) · v, written plainly: full max, then exp, sum,
/// divide. Causal for prefill.
fn naive(
    kind: AttentionKind,
    prescaled: bool,
    dims: Dims,
    q: &[f64],
    k: &[f64],
    v: &[f64],
) -> Vec<f64> {
    let Dims { t, hq, kvh, d, s } = dims;
    let mut o = vec![0.0; t * hq * d];
    for ti in 0..t {
        let visible = match kind {
            AttentionKind::Decode => s,
            AttentionKind::Prefill => s - t + ti + 1,
        };
        for h in 0..hq {
            let kv = h / (hq / kvh);
            let scores: Vec<f64> = (0..visible)
                .map(|j| {
                    let dot: f64 = (0..d)
                        .map(|c| q[(ti * hq + h) * d + c] * k[(j * kvh + kv) * d + c])
                        .sum();
                    if prescaled {
                        dot
                    } else {
                        dot / (d as f64).sqrt()
                    }
                })
                .collect();
            let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let p: Vec<f64> = scores.iter().map(|x| (x - max).exp()).collect();
            let sum: f64 = p.iter().sum();
            for c in 0..d {
                let num: f64 = (0..visible).map(|j| p[j] * v[(j * kvh + kv) * d + c]).sum();
                o[(ti * hq + h) * d + c] = num / sum;
            }
        }
    }
    o
}

fn assert_close(got: &[f32], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(g.is_finite(), "{what}: non-finite output {g} at {i}");
        assert!(
            (f64::from(g) - w).abs() <= tol,
            "{what}: at {i} got {g}, want {w}, tol {tol}"
        );
    }
}

fn max_abs(v: &[f64]) -> f64 {
    v.iter().fold(0.0, |m, x| m.max(x.abs()))
}

/// Run and compare with the naive reference; returns the outputs.
fn check(spec: &Spec, dims: Dims, seed: u64) -> Outputs {
    let case = make_case(spec, dims, seed);
    let what = format!(
        "{:?} q {} k {} v {} o {} {dims:?}",
        spec.kind, spec.q, spec.k, spec.v, spec.o
    );
    let out = run(&kernel(spec), &case.bindings).unwrap_or_else(|e| panic!("{what}: {e}"));
    let want = naive(spec.kind, spec.prescaled, dims, &case.q, &case.k, &case.v);
    let eps = match spec.o {
        Format::F16 => 2f64.powi(-10),
        Format::BF16 => 2f64.powi(-7),
        _ => 2f64.powi(-22),
    };
    assert_close(out.get("o").unwrap(), &want, eps * max_abs(&case.v), &what);
    assert_eq!(
        out.softmax.map(|s| s.rows),
        Some(dims.t * dims.hq),
        "{what}"
    );
    out
}

fn dims(t: usize, d: usize, s: usize) -> Dims {
    Dims {
        t,
        hq: 8,
        kvh: 2,
        d,
        s,
    }
}

const KINDS: [AttentionKind; 2] = [AttentionKind::Decode, AttentionKind::Prefill];

fn tokens(kind: AttentionKind, s: usize) -> usize {
    match kind {
        AttentionKind::Decode => 1,
        AttentionKind::Prefill => s.min(7),
    }
}

#[test]
fn every_kv_format_combination() {
    let keys = [
        Format::F16,
        Format::F32,
        Format::BF16,
        Format::I8Asym(Group::Row, ParamType::F32),
        Format::U4Asym(Group::Row, ParamType::F32),
    ];
    let values = [Format::F16, Format::F32, Format::Fp8E4M3, Format::Fp8E5M2];
    let mut seed = 0;
    for kind in KINDS {
        for k in keys {
            for v in values {
                seed += 1;
                let spec = Spec::new(kind, k, v);
                check(&spec, dims(tokens(kind, 65), 20, 65), seed);
                let spec = Spec {
                    softmax: ASYNC_WIDE,
                    ..spec
                };
                let out = check(&spec, dims(tokens(kind, 65), 20, 65), seed);
                assert_eq!(out.softmax.unwrap().recomputed, 0);
            }
        }
    }
}

#[test]
fn sequence_lengths_head_dims_and_kinds() {
    let mut seed = 100;
    for kind in KINDS {
        for s in [1, 63, 64, 65, 200] {
            for d in [64, 20] {
                for (k, v) in [
                    (Format::F16, Format::F16),
                    (Format::I8Asym(Group::Row, ParamType::F32), Format::Fp8E4M3),
                    (Format::U4Asym(Group::Row, ParamType::F32), Format::Fp8E5M2),
                ] {
                    seed += 1;
                    check(&Spec::new(kind, k, v), dims(tokens(kind, s), d, s), seed);
                }
            }
        }
    }
}

#[test]
fn prefill_of_the_whole_sequence_is_fully_causal() {
    for s in [1, 63, 65] {
        let spec = Spec::new(AttentionKind::Prefill, Format::F16, Format::F16);
        check(&spec, dims(s, 20, s), s as u64);
        let spec = Spec {
            softmax: ASYNC_WIDE,
            ..spec
        };
        check(&spec, dims(s, 20, s), s as u64);
    }
    // Query 0 sees only key 0, so its output is v[0] itself.
    let spec = Spec::new(AttentionKind::Prefill, Format::F32, Format::F32);
    let d = dims(5, 20, 5);
    let case = make_case(&spec, d, 9);
    let out = run(&kernel(&spec), &case.bindings).unwrap();
    let o = out.get("o").unwrap();
    for h in 0..d.hq {
        let kv = h / (d.hq / d.kvh);
        for c in 0..d.d {
            assert_eq!(f64::from(o[h * d.d + c]), case.v[kv * d.d + c]);
        }
    }
}

#[test]
fn gqa_maps_query_heads_to_kv_heads() {
    // Every value of KV head j is j + 1: the output of query head i is the
    // index of the KV head it reads, plus one.
    for (hq, kvh) in [(8, 2), (8, 8), (8, 1), (6, 3)] {
        let dm = Dims {
            t: 1,
            hq,
            kvh,
            d: 20,
            s: 65,
        };
        let spec = Spec::new(AttentionKind::Decode, Format::F32, Format::F32);
        let mut case = make_case(&spec, dm, 3);
        let v: Vec<f32> = (0..dm.s * kvh * dm.d)
            .map(|i| ((i / dm.d) % kvh + 1) as f32)
            .collect();
        case.bindings = bind(
            dm,
            case.bindings.tensors()[0].1.clone(),
            case.bindings.tensors()[1].1.clone(),
            Value::F32(v),
        );
        let out = run(&kernel(&spec), &case.bindings).unwrap();
        for (i, &o) in out.get("o").unwrap().iter().enumerate() {
            let head = i / dm.d;
            let want = (head / (hq / kvh) + 1) as f32;
            assert!(
                (o - want).abs() <= 1e-6 * want,
                "hq {hq} kvh {kvh}: {o} vs {want}"
            );
        }
        check(&spec, dm, 4);
    }
}

#[test]
fn f16_and_bf16_inputs_and_outputs() {
    for (q, o) in [
        (Format::F16, Format::F16),
        (Format::BF16, Format::BF16),
        (Format::F16, Format::F32),
    ] {
        for kind in KINDS {
            let spec = Spec {
                q,
                o,
                ..Spec::new(kind, Format::F16, Format::Fp8E4M3)
            };
            let out = check(&spec, dims(tokens(kind, 65), 64, 65), 11);
            for &x in out.get("o").unwrap() {
                let rounded = match o {
                    Format::F16 => f16::from_f32(x).to_f32(),
                    Format::BF16 => bf16::from_f32(x).to_f32(),
                    _ => x,
                };
                assert_eq!(rounded, x, "output not representable in {o}");
            }
        }
    }
}

#[test]
fn q_prescaled_true_equals_scaling_q_by_hand() {
    for kind in KINDS {
        let dm = dims(tokens(kind, 65), 64, 65);
        let spec = Spec::new(kind, Format::F16, Format::F16);
        let case = make_case(&spec, dm, 21);
        let unscaled = run(&kernel(&spec), &case.bindings).unwrap();
        // Same q, but multiplied by 1/sqrt(d) = 1/8 (exact in f32) by the caller.
        let q: Vec<f32> = case.q.iter().map(|&x| x as f32 / 8.0).collect();
        let pre = Spec {
            prescaled: true,
            ..spec
        };
        let b = bind(
            dm,
            Value::F32(q),
            case.bindings.tensors()[1].1.clone(),
            case.bindings.tensors()[2].1.clone(),
        );
        let prescaled = run(&kernel(&pre), &b).unwrap();
        assert_eq!(prescaled.get("o"), unscaled.get("o"));
        // And prescaled = true really skips the scale: it matches the naive
        // reference without 1/sqrt(d) on the unscaled q.
        let out = run(&kernel(&pre), &case.bindings).unwrap();
        let want = naive(kind, true, dm, &case.q, &case.k, &case.v);
        assert_close(out.get("o").unwrap(), &want, 1e-6, "prescaled");
        let scaled = naive(kind, false, dm, &case.q, &case.k, &case.v);
        assert!(
            want.iter().zip(&scaled).any(|(a, b)| (a - b).abs() > 1e-3),
            "the scale must matter for this case"
        );
    }
}

/// Decode case whose head-0 scores are `big` for key `hot` and small
/// elsewhere; other heads see ordinary scores.
fn adversarial(big: f32, hot: Option<usize>, s: usize) -> (Spec, Dims, Case) {
    let dm = dims(1, 20, s);
    let spec = Spec {
        prescaled: true,
        ..Spec::new(AttentionKind::Decode, Format::F32, Format::F32)
    };
    let mut case = make_case(&spec, dm, 5);
    let mut k: Vec<f32> = case.k.iter().map(|&x| x as f32).collect();
    let mut q: Vec<f32> = case.q.iter().map(|&x| x as f32).collect();
    // Head 0 reads KV head 0. q[0] = (1, 1, ...), k rows of KV head 0 set so
    // that the score of key j is `big` (hot key) or `big`·sign otherwise.
    q[..dm.d].fill(1.0);
    // Heads 1..4 share KV head 0 (GQA group of 4): zero queries keep their
    // scores at 0, inside the bounds.
    q[dm.d..4 * dm.d].fill(0.0);
    for j in 0..s {
        let row = (j * dm.kvh) * dm.d;
        let score = match hot {
            Some(h) if h == j => big,
            Some(_) => 0.1 * (j % 7) as f32,
            None => big + (j % 5) as f32,
        };
        k[row..row + dm.d].fill(score / dm.d as f32);
    }
    case.q = q.iter().map(|&x| f64::from(x)).collect();
    case.k = k.iter().map(|&x| f64::from(x)).collect();
    case.bindings = bind(
        dm,
        Value::F32(q),
        Value::F32(k),
        case.bindings.tensors()[2].1.clone(),
    );
    (spec, dm, case)
}

fn run_modes(spec: &Spec, case: &Case, mode: SoftmaxMode) -> (Vec<f32>, SoftmaxStats) {
    let s = Spec {
        softmax: mode,
        ..*spec
    };
    let out = run(&kernel(&s), &case.bindings).unwrap();
    (out.get("o").unwrap().to_vec(), out.softmax.unwrap())
}

#[test]
fn async_recomputes_a_row_with_one_huge_score() {
    let (spec, dm, case) = adversarial(1.0e4, Some(70), 200);
    let phi = 0.0f64;
    assert!(
        (1.0e4 - phi).exp().is_infinite(),
        "without recomputation the unified-max pass would overflow"
    );
    let (online, ostats) = run_modes(&spec, &case, SoftmaxMode::Online);
    let (asynced, astats) = run_modes(&spec, &case, ASYNC_WIDE);
    assert_eq!(
        ostats,
        SoftmaxStats {
            rows: 8,
            recomputed: 0
        }
    );
    assert_eq!(
        astats,
        SoftmaxStats {
            rows: 8,
            recomputed: 1
        },
        "only head 0 leaves the bounds"
    );
    assert_eq!(asynced, online);
    let want = naive(spec.kind, true, dm, &case.q, &case.k, &case.v);
    assert_close(&asynced, &want, 1e-6, "huge score");
    // The hot key takes all the weight: head 0's output is its value row.
    let hot_row = &case.v[70 * dm.kvh * dm.d..][..dm.d];
    for (&got, &want) in asynced[..dm.d].iter().zip(hot_row) {
        assert_eq!(f64::from(got), want);
    }
}

#[test]
fn async_recomputes_rows_whose_scores_are_all_very_negative() {
    let (spec, dm, case) = adversarial(-1.0e4, None, 65);
    assert_eq!(
        (-1.0e4f64).exp(),
        0.0,
        "the unified-max pass would give 0/0"
    );
    let (online, _) = run_modes(&spec, &case, SoftmaxMode::Online);
    let (asynced, stats) = run_modes(&spec, &case, ASYNC_WIDE);
    assert_eq!(stats.recomputed, 1);
    assert_eq!(asynced, online);
    let want = naive(spec.kind, true, dm, &case.q, &case.k, &case.v);
    assert_close(&asynced, &want, 1e-6, "very negative scores");
}

#[test]
fn async_equals_online_inside_the_bounds() {
    let mut seed = 300;
    for kind in KINDS {
        for s in [1, 63, 65, 200] {
            for d in [64, 20] {
                seed += 1;
                let dm = dims(tokens(kind, s), d, s);
                let spec = Spec::new(
                    kind,
                    Format::I8Asym(Group::Row, ParamType::F32),
                    Format::Fp8E4M3,
                );
                let case = make_case(&spec, dm, seed);
                let (online, _) = run_modes(&spec, &case, SoftmaxMode::Online);
                // phi away from the true max: still exact while in bounds.
                for phi in [0.0, 3.0, -2.0] {
                    let mode = SoftmaxMode::Async {
                        phi,
                        lo: -20.0,
                        hi: 20.0,
                    };
                    let (asynced, stats) = run_modes(&spec, &case, mode);
                    assert_eq!(stats.recomputed, 0);
                    assert_eq!(stats.rows, dm.t * dm.hq);
                    let on: Vec<f64> = online.iter().map(|&x| f64::from(x)).collect();
                    assert_close(&asynced, &on, 2e-7 * max_abs(&case.v), "async vs online");
                }
            }
        }
    }
}

#[test]
fn tight_async_bounds_recompute_every_row_and_stay_exact() {
    // With [lo, hi] = [0, 0] every score but one leaves the bounds.
    let spec = Spec::new(AttentionKind::Prefill, Format::F16, Format::F16);
    let dm = dims(7, 20, 200);
    let case = make_case(&spec, dm, 77);
    let (online, _) = run_modes(&spec, &case, SoftmaxMode::Online);
    let mode = SoftmaxMode::Async {
        phi: 0.0,
        lo: 0.0,
        hi: 0.0,
    };
    let (asynced, stats) = run_modes(&spec, &case, mode);
    assert_eq!(
        stats,
        SoftmaxStats {
            rows: 56,
            recomputed: 56
        }
    );
    assert_eq!(asynced, online);
}

#[test]
fn online_blocks_cross_a_rising_max() {
    // Scores rise block after block, forcing a rescale at every block
    // boundary; the result must still match the naive softmax.
    let s = 3 * ONLINE_BLOCK + 5;
    let (spec, dm, case) = adversarial(0.0, None, s);
    let mut k: Vec<f32> = case.k.iter().map(|&x| x as f32).collect();
    for j in 0..s {
        let row = (j * dm.kvh) * dm.d;
        k[row..row + dm.d].fill(j as f32 * 0.5 / dm.d as f32);
    }
    let kd: Vec<f64> = k.iter().map(|&x| f64::from(x)).collect();
    let b = bind(
        dm,
        case.bindings.tensors()[0].1.clone(),
        Value::F32(k),
        case.bindings.tensors()[2].1.clone(),
    );
    let out = run(&kernel(&spec), &b).unwrap();
    let want = naive(spec.kind, true, dm, &case.q, &kd, &case.v);
    assert_close(out.get("o").unwrap(), &want, 1e-6, "rising max");
}
