//! The cranelift backend's decode attention against the reference
//! interpreter: f16 and int8/fp8 caches, GQA, sequence lengths around the
//! softmax block (64), head dims with tails, both softmax modes, and an
//! async case whose scores leave the bounds so every row is recomputed.

use half::f16;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tessera_codegen::artifact::{Artifact, Backend};
use tessera_codegen::clif::ClifBackend;
use tessera_codegen::host::RangeExecutor;
use tessera_codegen::host_attention::{HostAttention, KvCache, scoped_threads};
use tessera_codegen::tile::TileConfig;
use tessera_dsl::interp::{self, Bindings, Value};
use tessera_dsl::ir::{Format, Kernel, Op, SoftmaxMode};

#[path = "../../tests/src/guarded.rs"]
mod guarded;
use guarded::GuardedCache;
use tessera_dsl::{library, quant};

fn any_tile() -> TileConfig {
    // Attention ignores the tile; any solver tile will do.
    let backend = ClifBackend::host().unwrap();
    backend.tiles(&library::get("matmul-f32").unwrap()).unwrap()[0]
}

fn compile(kernel: &Kernel) -> HostAttention {
    let backend = ClifBackend::host().unwrap();
    let code = match backend.emit(kernel, &any_tile()).expect("emit") {
        Artifact::Machine(m) => m,
        other => panic!("expected machine code, got {other}"),
    };
    HostAttention::new(kernel, &code).expect("map")
}

fn online(mut kernel: Kernel) -> Kernel {
    if let Op::Attention(a) = &mut kernel.op {
        a.softmax = SoftmaxMode::Online;
    }
    kernel.name.push_str("-online");
    kernel
}

fn cache(
    format: Format,
    rows: usize,
    d: usize,
    data: &[f32],
) -> (Value, Option<quant::QuantTensor>, Vec<f16>) {
    if format == Format::F16 {
        let h: Vec<f16> = data.iter().map(|&x| f16::from_f32(x)).collect();
        (Value::F16(h.clone()), None, h)
    } else {
        let q = quant::quantize(format, rows, d, data).expect("quantize");
        (Value::Quant(q.clone()), Some(q), Vec::new())
    }
}

/// How a check calls the kernel.
#[derive(Clone, Copy)]
enum How<'a> {
    /// `run`: scoped threads.
    Whole,
    /// `run_chunked` with this many keys per chunk.
    Chunked(usize),
    /// `run_on` with the caller's executor.
    On(&'a RangeExecutor<'a>),
}

impl std::fmt::Debug for How<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            How::Whole => write!(f, "run"),
            How::Chunked(c) => write!(f, "chunks of {c}"),
            How::On(_) => write!(f, "run_on"),
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn check(
    att: &HostAttention,
    kernel: &Kernel,
    s: usize,
    hq: usize,
    kvh: usize,
    d: usize,
    q_amp: f32,
    threads: usize,
    how: How<'_>,
    seed: u64,
) -> u64 {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let a = kernel.as_attention().unwrap();
    let kf = kernel.tensor(&a.k).unwrap().format;
    let vf = kernel.tensor(&a.v).unwrap().format;
    let qv: Vec<f16> = (0..hq * d)
        .map(|_| f16::from_f32(rng.gen_range(-q_amp..q_amp)))
        .collect();
    let kd: Vec<f32> = (0..s * kvh * d).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let vd: Vec<f32> = (0..s * kvh * d).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let (kval, kq, k16) = cache(kf, s * kvh, d, &kd);
    let (vval, vq, v16) = cache(vf, s * kvh, d, &vd);
    let bindings = Bindings::decode_attention([hq, kvh, d, s], Value::F16(qv.clone()), kval, vval);
    let out = interp::run(kernel, &bindings).expect("interp");
    let want = out.get("o").unwrap();
    let stats = out.softmax.unwrap();
    // K and V end at inaccessible pages: a read past either faults.
    let guarded = |q: &Option<quant::QuantTensor>, h: &[f16]| match q {
        Some(q) => GuardedCache::quant(q),
        None => GuardedCache::halves(h),
    };
    let (kg, vg) = (guarded(&kq, &k16), guarded(&vq, &v16));
    let (kc, vc) = (kg.cache(), vg.cache());
    let mut o = vec![f16::ZERO; hq * d];
    let recomputed = match how {
        How::Whole => att.run(&qv, kc, vc, s, hq, kvh, d, &mut o, threads),
        How::Chunked(c) => att.run_chunked(&qv, kc, vc, s, hq, kvh, d, &mut o, threads, c),
        How::On(exec) => att.run_on(&qv, kc, vc, s, hq, kvh, d, &mut o, threads, exec),
    }
    .expect("run");
    assert_eq!(
        recomputed as usize, stats.recomputed,
        "{} recomputed rows",
        kernel.name
    );
    for (i, (g, w)) in o.iter().zip(want).enumerate() {
        let g = g.to_f32();
        let tol = 2e-3 * w.abs() + 2e-3;
        assert!(
            (g - w).abs() <= tol,
            "{} s={s} hq={hq} kvh={kvh} d={d} threads={threads} {how:?}: o[{i}] = {g}, want {w}",
            kernel.name
        );
    }
    recomputed
}

fn sweep(kernel: Kernel) {
    let att = compile(&kernel);
    let mut seed = 7;
    for &s in &[1usize, 63, 65, 200] {
        for &(hq, kvh) in &[(4usize, 2usize), (3, 3), (8, 2)] {
            for &d in &[8usize, 13] {
                for threads in [1, 2] {
                    seed += 1;
                    check(&att, &kernel, s, hq, kvh, d, 0.5, threads, How::Whole, seed);
                }
            }
        }
    }
}

#[test]
fn clif_attention_decode_f16() {
    sweep(library::get("attention-decode-f16").unwrap());
}

#[test]
fn clif_attention_decode_kv8() {
    sweep(library::get("attention-decode-kv8").unwrap());
}

#[test]
fn clif_attention_online_modes() {
    sweep(online(library::get("attention-decode-f16").unwrap()));
    sweep(online(library::get("attention-decode-kv8").unwrap()));
}

#[test]
fn clif_attention_async_recomputes_out_of_range_rows() {
    for name in ["attention-decode-f16", "attention-decode-kv8"] {
        let kernel = library::get(name).unwrap();
        let att = compile(&kernel);
        // |q| up to 8 over d = 16 puts scores far outside [-16.8, 6.5].
        for how in [How::Whole, How::Chunked(7), How::Chunked(64)] {
            let recomputed = check(&att, &kernel, 200, 4, 2, 16, 8.0, 2, how, 99);
            assert!(
                recomputed > 0,
                "{name} {how:?}: the adversarial case recomputed nothing"
            );
        }
    }
}

/// `split s`: chunks of every length from one key to more than a softmax
/// block, combined, agree with the interpreter, with and without `parallel
/// kvh`, in both softmax modes.
#[test]
fn clif_attention_split_chunks_match_the_interpreter() {
    let mut seed = 300;
    for base in ["attention-decode-f16", "attention-decode-kv8"] {
        let kernel = library::get(base).unwrap();
        let mut serial = kernel.clone();
        serial.schedule.parallel.clear();
        for kernel in [kernel.clone(), online(kernel), serial] {
            let att = compile(&kernel);
            for &(s, chunk) in &[(65usize, 1usize), (200, 7), (200, 64), (700, 300)] {
                for &(hq, kvh) in &[(4usize, 2usize), (6, 1), (3, 3)] {
                    for threads in [1, 2] {
                        seed += 1;
                        check(
                            &att,
                            &kernel,
                            s,
                            hq,
                            kvh,
                            13,
                            0.5,
                            threads,
                            How::Chunked(chunk),
                            seed,
                        );
                    }
                }
            }
        }
    }
}

/// The schedule decides the split: one KV head on two threads splits a
/// long sequence (and still agrees); a kernel without `split s` refuses a
/// chunked call, and without `parallel kvh` it runs, on one thread.
#[test]
fn clif_attention_schedule_decides_the_split() {
    let kernel = library::get("attention-decode-f16").unwrap();
    let att = compile(&kernel);
    assert_eq!(
        att.keys_per_chunk(600, 1, 2),
        300,
        "one KV head, two threads"
    );
    assert_eq!(att.keys_per_chunk(600, 2, 2), 600, "a KV head per thread");
    assert_eq!(att.keys_per_chunk(300, 1, 2), 300, "too short to split");
    check(&att, &kernel, 600, 4, 1, 16, 0.5, 2, How::Whole, 5);
    let mut whole = kernel.clone();
    whole.schedule.split = None;
    whole.schedule.parallel.clear();
    let att = compile(&whole);
    assert_eq!(att.keys_per_chunk(600, 1, 2), 600, "no `split s`");
    check(&att, &whole, 600, 4, 2, 16, 0.5, 2, How::Whole, 6);
    let (q, k, mut o) = (
        vec![f16::ZERO; 16],
        vec![f16::ZERO; 32],
        vec![f16::ZERO; 16],
    );
    let err = att
        .run_chunked(
            &q,
            KvCache::F16(&k),
            KvCache::F16(&k),
            2,
            1,
            1,
            16,
            &mut o,
            2,
            1,
        )
        .unwrap_err()
        .to_string();
    assert!(err.contains("split s"), "{err}");
}

#[test]
fn clif_attention_rejects_bad_shapes() {
    let kernel = library::get("attention-decode-f16").unwrap();
    let att = compile(&kernel);
    let q = vec![f16::ZERO; 6];
    let k = vec![f16::ZERO; 4 * 2 * 3];
    let mut o = vec![f16::ZERO; 6];
    // hq = 3 is not a multiple of kvh = 2.
    assert!(
        att.run(
            &q,
            KvCache::F16(&k),
            KvCache::F16(&k),
            4,
            3,
            2,
            2,
            &mut o,
            1
        )
        .is_err()
    );
    // Cache too short.
    assert!(
        att.run(
            &q,
            KvCache::F16(&k[1..]),
            KvCache::F16(&k),
            4,
            2,
            2,
            3,
            &mut o,
            1
        )
        .is_err()
    );
}

/// A prefill kernel is the decode loop run per query token over its causal
/// prefix (`HostAttention::prefill`): against the interpreter, with a
/// prefix p ∈ {0, 1, 17} before the t new tokens.
#[test]
fn clif_prefill_is_causal_and_matches_the_interpreter() {
    let kernel = library::get("attention-prefill-f16").unwrap();
    let att = compile(&kernel);
    let mut rng = ChaCha8Rng::seed_from_u64(41);
    for &(p, t, hq, kvh, d) in &[
        (0usize, 5usize, 4usize, 2usize, 16usize),
        (1, 9, 6, 2, 13),
        (17, 7, 3, 3, 8),
    ] {
        let s = p + t;
        let qv: Vec<f16> = (0..t * hq * d)
            .map(|_| f16::from_f32(rng.gen_range(-0.5..0.5)))
            .collect();
        let kv: Vec<f16> = (0..s * kvh * d)
            .map(|_| f16::from_f32(rng.gen_range(-1.0..1.0)))
            .collect();
        let vv: Vec<f16> = (0..s * kvh * d)
            .map(|_| f16::from_f32(rng.gen_range(-1.0..1.0)))
            .collect();
        let bindings = Bindings::new()
            .extent("t", t)
            .extent("hq", hq)
            .extent("kvh", kvh)
            .extent("d", d)
            .extent("s", s)
            .tensor("q", Value::F16(qv.clone()))
            .tensor("k", Value::F16(kv.clone()))
            .tensor("v", Value::F16(vv.clone()));
        let out = interp::run(&kernel, &bindings).expect("interp");
        let want = out.get("o").unwrap();
        let mut o = vec![f16::ZERO; t * hq * d];
        let (kc, vc) = (KvCache::F16(&kv), KvCache::F16(&vv));
        att.prefill(&qv, kc, vc, t, s, hq, kvh, d, &mut o, 2)
            .expect("prefill");
        for (i, (g, w)) in o.iter().zip(want).enumerate() {
            let g = g.to_f32();
            assert!(
                (g - w).abs() <= 2e-3 * w.abs() + 2e-3,
                "p={p} t={t} hq={hq} kvh={kvh} d={d}: o[{i}] = {g}, want {w}"
            );
        }
    }
    // A cache shorter than s is refused, not read past.
    let short = vec![f16::ZERO; 3 * 8];
    let mut o = vec![f16::ZERO; 2 * 2 * 8];
    let q = vec![f16::ZERO; 2 * 2 * 8];
    let (kc, vc) = (KvCache::F16(&short), KvCache::F16(&short));
    assert!(att.prefill(&q, kc, vc, 2, 4, 2, 1, 8, &mut o, 1).is_err());
}

/// A caller's executor (a runtime's persistent pool) runs the workers: as a
/// pool does (every worker index, in parallel), with more workers than the
/// call has work for, and with fewer (the call runs the rest itself); each
/// agrees with the interpreter, whole and split.
#[test]
fn clif_attention_runs_on_a_callers_executor() {
    let (two, four, one) = (scoped_threads(2), scoped_threads(4), scoped_threads(1));
    let kernel = library::get("attention-decode-f16").unwrap();
    let att = compile(&kernel);
    let mut seed = 700;
    for exec in [&two as &RangeExecutor<'_>, &four, &one] {
        // Two KV heads on two workers; one KV head split over two chunks.
        for &(s, hq, kvh) in &[(300usize, 4usize, 2usize), (600, 4, 1), (90, 3, 3)] {
            seed += 1;
            check(&att, &kernel, s, hq, kvh, 16, 0.5, 2, How::On(exec), seed);
        }
    }
}
