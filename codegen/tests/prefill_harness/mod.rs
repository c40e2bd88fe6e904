//! The causal prefill cases every whole-prefill emitter (x86, NEON) runs
//! against the reference interpreter: f16 and quantized caches, GQA groups
//! 1 to 8, head dims 64, 80, 96, 128, 256 (and small ones for chunk tails),
//! prefixes p ∈ {0, 1, 17} already cached, query rows around the row block
//! (96: up to 70 tokens × 6 heads) and contexts past the key block (128),
//! scores far outside the usual range, 1 and 2 threads. Each test file
//! passes its own compiled kernel.

#![allow(dead_code)]

use half::f16;
use tessera_codegen::host_attention::HostAttention;
use tessera_dsl::interp::{self, Bindings, Value};
use tessera_dsl::ir::Kernel;

#[path = "../attention_inputs/mod.rs"]
pub mod attention_inputs;

pub struct Case {
    /// Tokens cached before the prompt.
    pub p: usize,
    /// Prompt tokens (queries).
    pub t: usize,
    pub hq: usize,
    pub kvh: usize,
    pub d: usize,
    pub q_amp: f32,
    pub threads: usize,
    pub seed: u64,
}

/// One prefill call against the interpreter (relative tolerance 2e-3:
/// f16 output).
pub fn check(att: &HostAttention, kernel: &Kernel, c: &Case) {
    let (t, hq, kvh, d) = (c.t, c.hq, c.kvh, c.d);
    let s = c.p + t;
    let inp = attention_inputs::inputs(kernel, t * hq * d, s * kvh, d, c.q_amp, c.seed);
    let qv = &inp.q;
    let bindings = Bindings::new()
        .extent("t", t)
        .extent("hq", hq)
        .extent("kvh", kvh)
        .extent("d", d)
        .extent("s", s)
        .tensor("q", Value::F16(qv.clone()))
        .tensor("k", inp.k.value.clone())
        .tensor("v", inp.v.value.clone());
    let out = interp::run(kernel, &bindings).expect("interp");
    let want = out.get("o").unwrap();
    let mut o = vec![f16::from_f32(f32::NAN); t * hq * d];
    // K and V end at inaccessible pages: a read past either faults.
    let (kg, vg) = (inp.k.guarded(), inp.v.guarded());
    let recomputed = att
        .prefill(
            qv,
            kg.cache(),
            vg.cache(),
            t,
            s,
            hq,
            kvh,
            d,
            &mut o,
            c.threads,
        )
        .expect("prefill");
    let what = format!(
        "{} p={} t={t} hq={hq} kvh={kvh} d={d} threads={} amp={}",
        kernel.name, c.p, c.threads, c.q_amp
    );
    // The online softmax recomputes nothing; the async one (decode code
    // per token) the rows the interpreter recomputes.
    assert_eq!(
        recomputed as usize,
        out.softmax.map_or(0, |s| s.recomputed),
        "{what}: rows recomputed"
    );
    for (i, (g, w)) in o.iter().zip(want).enumerate() {
        let g = g.to_f32();
        let tol = 2e-3 * w.abs() + 2e-3;
        assert!(
            (g - w).abs() <= tol,
            "{what}: o[{i}] (token {}, head {}) = {g}, want {w}",
            i / (hq * d),
            i / d % hq
        );
    }
}

/// Two prefills across the row and key blocks (a prefix of 17 with 70
/// tokens × 3 heads per KV head, and 33 tokens with no prefix at d = 128),
/// on `threads` threads: a quick check of code in other blocks or modes.
pub fn spot_checks(att: &HostAttention, kernel: &Kernel, threads: usize, seed: u64) {
    for (p, t, hq, kvh, d) in [(17, 70, 6, 2, 64), (0, 33, 4, 4, 128)] {
        check(
            att,
            kernel,
            &Case {
                p,
                t,
                hq,
                kvh,
                d,
                q_amp: 0.5,
                threads,
                seed: seed + p as u64,
            },
        );
    }
}

/// Prefixes × prompt lengths `ts` × GQA layouts × `dims`, alternating 1
/// and 2 threads.
pub fn sweep(att: &HostAttention, kernel: &Kernel, dims: &[usize], ts: &[usize]) {
    let mut seed = 7;
    for &p in &[0usize, 1, 17] {
        for &t in ts {
            for &(hq, kvh) in &[(2usize, 2usize), (12, 2), (8, 1), (6, 3)] {
                for &d in dims {
                    seed += 1;
                    let c = Case {
                        p,
                        t,
                        hq,
                        kvh,
                        d,
                        q_amp: 0.5,
                        threads: 1 + (seed as usize % 2),
                        seed,
                    };
                    check(att, kernel, &c);
                }
            }
        }
    }
}

/// `dims` with prompts across the row block and contexts past several key
/// blocks.
pub fn head_dims_and_long_contexts(att: &HostAttention, kernel: &Kernel, dims: &[usize]) {
    for (i, &d) in dims.iter().enumerate() {
        for (p, t) in [(0usize, 130usize), (200, 33), (17, 97)] {
            check(
                att,
                kernel,
                &Case {
                    p,
                    t,
                    hq: 4,
                    kvh: 2,
                    d,
                    q_amp: 0.5,
                    threads: 2,
                    seed: 100 + i as u64 + p as u64,
                },
            );
        }
    }
}

/// Scores of magnitude up to ~100 (q amplitude 8 at d = 128): the running
/// max moves between key blocks by far more than the exp's range, so α
/// must rescale O and l exactly as the online softmax defines.
pub fn far_scores(att: &HostAttention, kernel: &Kernel) {
    for (seed, (p, t)) in [(0usize, 100usize), (17, 60), (1, 130)].iter().enumerate() {
        check(
            att,
            kernel,
            &Case {
                p: *p,
                t: *t,
                hq: 12,
                kvh: 2,
                d: 128,
                q_amp: 8.0,
                threads: 1,
                seed: 900 + seed as u64,
            },
        );
    }
}

/// [`decodes_one_token`] for both library prefill kernels, each compiled
/// by the backend's `compile`.
pub fn library_decodes_one_token(compile: &dyn Fn(&Kernel) -> HostAttention) {
    for (prefill, decode) in [
        ("attention-prefill-f16", "attention-decode-f16"),
        ("attention-prefill-kv8", "attention-decode-kv8"),
    ] {
        let kernel = tessera_dsl::library::get(prefill).unwrap();
        let decode = tessera_dsl::library::get(decode).unwrap();
        decodes_one_token(&compile(&kernel), &kernel, &decode);
    }
}

/// A decode call on whole-prefill code is a one-token prefill that sees
/// every key: checked against the interpreter's `decode` kernel on the
/// same inputs.
pub fn decodes_one_token(att: &HostAttention, prefill: &Kernel, decode: &Kernel) {
    let (s, hq, kvh, d) = (77usize, 8usize, 2usize, 64usize);
    let inp = attention_inputs::inputs(prefill, hq * d, s * kvh, d, 0.5, 5);
    let bindings = Bindings::decode_attention(
        [hq, kvh, d, s],
        Value::F16(inp.q.clone()),
        inp.k.value.clone(),
        inp.v.value.clone(),
    );
    let out = interp::run(decode, &bindings).expect("interp");
    let want = out.get("o").unwrap();
    let mut o = vec![f16::from_f32(f32::NAN); hq * d];
    let (kg, vg) = (inp.k.guarded(), inp.v.guarded());
    att.run(&inp.q, kg.cache(), vg.cache(), s, hq, kvh, d, &mut o, 2)
        .unwrap();
    for (i, (g, w)) in o.iter().zip(want).enumerate() {
        let g = g.to_f32();
        assert!(
            (g - w).abs() <= 2e-3 * w.abs() + 2e-3,
            "{} as decode: o[{i}] = {g}, want {w}",
            prefill.name
        );
    }
}
