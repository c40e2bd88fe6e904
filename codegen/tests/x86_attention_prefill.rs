//! The x86 backend's causal prefill attention (flash loop: row blocks ×
//! key blocks, AVX2 + FMA + F16C) against the reference interpreter: f16
//! and int8/fp8 caches, GQA groups 1 to 8, head dims 64, 80, 96, 128, 256
//! (and 8, 40 for chunk tails), prefixes p ∈ {0, 1, 17} already cached,
//! query rows around the row block (96: t up to 70 tokens × 6 heads) and
//! contexts past the key block (128), scores far outside the usual range,
//! 1 and 2 threads, and refusals. Skips (with a line on stderr) where the
//! CPU lacks the features.

use half::f16;
use tessera_codegen::host_attention::{HostAttention, KvCache, token_runs};
use tessera_codegen::x86::attention;
use tessera_dsl::ir::{Kernel, Op, SoftmaxMode};
use tessera_dsl::library;

mod prefill_harness;
use prefill_harness::{far_scores, head_dims_and_long_contexts, sweep};

/// Prompt lengths of the sweeps: 70 tokens × 6 heads cross the row block.
const TS: [usize; 5] = [1, 5, 9, 50, 70];

fn runnable() -> bool {
    let missing = tessera_codegen::x86::missing_features();
    if !missing.is_empty() {
        eprintln!("SKIP x86 prefill attention: the CPU lacks {missing:?}");
    }
    missing.is_empty()
}

fn compile(kernel: &Kernel) -> HostAttention {
    compile_for(kernel, attention::DecodeIsa::default())
}

/// The kernel with its flash loop on zmm (`ymm32`: AVX512F and AVX512VL),
/// or None (and a SKIP line) where the CPU lacks them.
fn compile_zmm(kernel: &Kernel) -> Option<HostAttention> {
    if !tessera_codegen::x86::host_has_avx512_vnni() {
        eprintln!(
            "SKIP {}: no AVX512VL here, the zmm flash loop untested",
            kernel.name
        );
        return None;
    }
    let isa = attention::DecodeIsa {
        ymm32: true,
        ..attention::DecodeIsa::default()
    };
    Some(compile_for(kernel, isa))
}

fn compile_for(kernel: &Kernel, isa: attention::DecodeIsa) -> HostAttention {
    let code = attention::emit_for(
        kernel,
        tessera_codegen::artifact::PrefillBlocks::DEFAULT,
        isa,
    )
    .expect("emit");
    assert!(
        code.whole_prefill.is_some(),
        "{}: whole-prefill code",
        kernel.name
    );
    let att = HostAttention::new(kernel, &code).expect("map");
    assert!(att.whole_prefill());
    att
}

#[test]
fn x86_prefill_f16() {
    if runnable() {
        let kernel = library::get("attention-prefill-f16").unwrap();
        sweep(&compile(&kernel), &kernel, &[8, 64, 80, 128], &TS);
    }
}

#[test]
fn x86_prefill_kv8() {
    if runnable() {
        let kernel = library::get("attention-prefill-kv8").unwrap();
        sweep(&compile(&kernel), &kernel, &[8, 64, 80, 128], &TS);
    }
}

/// The head dims of the models served (64, 80, 96, 128, 256; 40 for a tail of
/// lanes), and contexts past several key blocks.
#[test]
fn x86_prefill_head_dims_and_long_contexts() {
    if !runnable() {
        return;
    }
    for name in ["attention-prefill-f16", "attention-prefill-kv8"] {
        let kernel = library::get(name).unwrap();
        head_dims_and_long_contexts(&compile(&kernel), &kernel, &[40, 64, 80, 96, 128, 256]);
    }
}

/// Scores of magnitude up to ~100 (q amplitude 8 at d = 128): the running
/// max moves between key blocks by far more than the exp's range, so α
/// must rescale O and l exactly as the online softmax defines.
#[test]
fn x86_prefill_far_scores() {
    if !runnable() {
        return;
    }
    for name in ["attention-prefill-f16", "attention-prefill-kv8"] {
        let kernel = library::get(name).unwrap();
        far_scores(&compile(&kernel), &kernel);
    }
}

/// A decode call on whole-prefill code is a one-token prefill that sees
/// every key: checked against the interpreter's decode of the same inputs.
#[test]
fn x86_prefill_code_decodes_one_token() {
    if !runnable() {
        return;
    }
    prefill_harness::library_decodes_one_token(&compile);
}

#[test]
fn token_runs_cover_every_token_once_at_even_cost() {
    for (s, t, threads) in [
        (10usize, 10usize, 2usize),
        (1000, 7, 3),
        (5, 1, 4),
        (64, 64, 1),
    ] {
        let runs = token_runs(s, t, threads);
        assert!(runs.len() <= threads && !runs.is_empty());
        assert_eq!(runs[0].start, 0);
        assert_eq!(runs.last().unwrap().end, t);
        for w in runs.windows(2) {
            assert_eq!(w[0].end, w[1].start);
        }
        assert!(runs.iter().all(|r| !r.is_empty()));
    }
    // Causal cost: the later half of 100 tokens over 100 keys is dearer,
    // so the first run holds more tokens.
    let runs = token_runs(100, 100, 2);
    assert!(runs[0].len() > runs[1].len(), "{runs:?}");
}

/// A prefill kernel with the async softmax gets the decode loop, run once
/// per query token (the flash loop runs the online softmax only): what the
/// kernel says, checked against the interpreter.
#[test]
fn x86_async_prefill_decodes_per_token() {
    let mut kernel = library::get("attention-prefill-f16").unwrap();
    if let Op::Attention(a) = &mut kernel.op {
        a.softmax = SoftmaxMode::Async {
            phi: 0.0,
            lo: -16.8,
            hi: 6.5,
        };
    }
    kernel.name.push_str("-async");
    let code = attention::emit(&kernel).unwrap();
    assert!(code.whole_prefill.is_none());
    assert!(
        code.listing
            .contains("this decode kernel runs once per query token"),
        "{}",
        code.listing
    );
    if !runnable() {
        return;
    }
    let att = HostAttention::new(&kernel, &code).unwrap();
    assert!(!att.whole_prefill());
    prefill_harness::spot_checks(&att, &kernel, 2, 70);
}

#[test]
fn x86_prefill_refuses_bad_calls() {
    if !runnable() {
        return;
    }
    let kernel = library::get("attention-prefill-f16").unwrap();
    let att = compile(&kernel);
    let (t, s, hq, kvh, d) = (4usize, 6usize, 4usize, 2usize, 64usize);
    let q = vec![f16::ZERO; t * hq * d];
    let kv = vec![f16::ZERO; s * kvh * d];
    let mut o = vec![f16::ZERO; t * hq * d];
    let run = |t: usize, s: usize, d: usize, o: &mut [f16]| {
        att.prefill(
            &q,
            KvCache::F16(&kv),
            KvCache::F16(&kv),
            t,
            s,
            hq,
            kvh,
            d,
            o,
            1,
        )
        .map(|_| ())
        .map_err(|e| e.to_string())
    };
    assert!(run(t, s, d, &mut o).is_ok());
    assert!(
        run(t, t - 1, d, &mut o)
            .unwrap_err()
            .contains("sequence length")
    );
    assert!(run(t, s + 1, d, &mut o).unwrap_err().contains("cache"));
    assert!(
        run(t, s, 60, &mut o)
            .unwrap_err()
            .contains("head dimension")
    );
    assert!(run(t + 1, s, d, &mut o).unwrap_err().contains("q elements"));
    // Whole-prefill code belongs to a prefill kernel.
    let code = attention::emit(&kernel).unwrap();
    let decode = library::get("attention-decode-f16").unwrap();
    assert!(HostAttention::new(&decode, &code).is_err());
}

/// The emitted loop nest, pinned: a change to the blocks, tiles or register
/// plan shows up here for review.
#[test]
fn x86_prefill_listing() {
    let code = attention::emit(&library::get("attention-prefill-f16").unwrap()).unwrap();
    insta::assert_snapshot!("x86_attention_prefill_f16", code.listing);
}

/// Blocks other than the default (the smallest the tiles allow, and larger
/// than the default) compute the same attention; blocks off the tiles are
/// refused by name.
#[test]
fn x86_prefill_in_other_blocks() {
    use tessera_codegen::artifact::PrefillBlocks;
    let kernel = library::get("attention-prefill-kv8").unwrap();
    let e = attention::emit_with(
        &kernel,
        PrefillBlocks {
            rows: 20,
            keys: 128,
        },
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("20 rows") && e.contains("multiple of 24"), "{e}");
    let e = attention::emit_with(&kernel, PrefillBlocks { rows: 96, keys: 6 })
        .unwrap_err()
        .to_string();
    assert!(e.contains("6 keys"), "{e}");
    if !runnable() {
        return;
    }
    for (i, blocks) in [
        PrefillBlocks { rows: 24, keys: 4 },
        PrefillBlocks { rows: 48, keys: 64 },
        PrefillBlocks {
            rows: 192,
            keys: 256,
        },
    ]
    .into_iter()
    .enumerate()
    {
        let code = attention::emit_with(&kernel, blocks).unwrap();
        assert_eq!(code.whole_prefill, Some(blocks));
        let att = HostAttention::new(&kernel, &code).unwrap();
        assert_eq!(att.prefill_blocks(), Some(blocks));
        prefill_harness::spot_checks(&att, &kernel, 1 + i % 2, 40 + i as u64);
    }
    // On zmm a block of a multiple of 48 rows takes 48-row score tiles
    // (three zmm), any other multiple of 24 the 24-row ones (a zmm and a
    // ymm).
    if !tessera_codegen::x86::host_has_avx512_vnni() {
        eprintln!("SKIP: no AVX512VL here, the zmm prefill's blocks untested");
        return;
    }
    let isa = attention::DecodeIsa {
        ymm32: true,
        ..attention::DecodeIsa::default()
    };
    for (i, (blocks, tile)) in [
        (PrefillBlocks { rows: 24, keys: 4 }, "24-row"),
        (PrefillBlocks { rows: 72, keys: 64 }, "24-row"),
        (PrefillBlocks { rows: 48, keys: 64 }, "48-row"),
        (
            PrefillBlocks {
                rows: 192,
                keys: 256,
            },
            "48-row",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let code = attention::emit_for(&kernel, blocks, isa).unwrap();
        assert!(
            code.listing.contains(&format!("scores: {tile}")),
            "{blocks}"
        );
        let att = HostAttention::new(&kernel, &code).unwrap();
        prefill_harness::spot_checks(&att, &kernel, 1 + i % 2, 50 + i as u64);
    }
}

/// The flash loop on zmm (AVX-512: scores of 16 rows a zmm, P·V 16 lanes
/// of d a zmm): the sweeps, the head dims of the prefill target (d = 8 and
/// 40 end in an odd 8-lane chunk, which takes the ymm P·V) and far scores.
#[test]
fn x86_prefill_zmm_pv() {
    if !runnable() {
        return;
    }
    for name in ["attention-prefill-f16", "attention-prefill-kv8"] {
        let kernel = library::get(name).unwrap();
        let Some(att) = compile_zmm(&kernel) else {
            return;
        };
        sweep(&att, &kernel, &[8, 64, 80, 128], &TS);
        head_dims_and_long_contexts(&att, &kernel, &[40, 64, 80, 96, 128, 256]);
        far_scores(&att, &kernel);
    }
}
