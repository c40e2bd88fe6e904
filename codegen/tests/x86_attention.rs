//! The x86 backend's decode attention (AVX2, FMA, F16C) against the
//! reference interpreter: f16 and int8/fp8 caches, GQA groups from 1 to
//! more than a tile (8), sequence lengths around the P·V key block (64),
//! head dims around the 32-lane chunk group, both softmax modes, the async
//! recompute path, the split over the sequence, and refusals. Skips (with a
//! line on stderr) where the CPU lacks the features.

use half::f16;
use tessera_codegen::artifact::PrefillBlocks;
use tessera_codegen::host_attention::{HostAttention, KvCache, decode_tile_heads};
use tessera_codegen::x86::attention::{self, DecodeIsa, HEAD_DIM_MULTIPLE, KeyDot};
use tessera_dsl::interp::{self, Bindings, Value};

mod attention_inputs;
use tessera_dsl::ir::{Format, Kernel, Op, SoftmaxMode};
use tessera_dsl::library;

fn runnable() -> bool {
    let missing = tessera_codegen::x86::missing_features();
    if !missing.is_empty() {
        eprintln!("SKIP x86 attention: the CPU lacks {missing:?}");
    }
    missing.is_empty()
}

fn compile(kernel: &Kernel) -> HostAttention {
    compile_for(kernel, DecodeIsa::default())
}

fn compile_for(kernel: &Kernel, isa: DecodeIsa) -> HostAttention {
    let code = attention::emit_for(kernel, PrefillBlocks::DEFAULT, isa).expect("emit");
    assert_eq!(code.head_dim_multiple, HEAD_DIM_MULTIPLE);
    // The requirement travels with the code: no caller has to add it.
    HostAttention::new(kernel, &code).expect("map")
}

/// The kernel's code in every form this CPU runs: plain AVX2; each VNNI
/// encoding of the int8-key dot it has (f16 keys have none); and with
/// AVX512VL the P·V passes in ymm0–31, on the plain and the best dot.
/// A form of the kernel's code and what it was emitted for.
type Form = (DecodeIsa, HostAttention);

fn every_form(kernel: &Kernel) -> Vec<Form> {
    use tessera_codegen::x86::{host_has_avx_vnni, host_has_avx512_bf16, host_has_avx512_vnni};
    let int8_keys = kernel.tensor("k").unwrap().format != Format::F16;
    let mut dots = vec![KeyDot::Maddwd];
    if int8_keys && host_has_avx_vnni() {
        dots.push(KeyDot::VexVnni);
    }
    if int8_keys && host_has_avx512_vnni() {
        dots.push(KeyDot::EvexVnni);
    }
    if int8_keys && dots.len() == 1 {
        eprintln!("SKIP {}: no VNNI here, vpdpwssd untested", kernel.name);
    }
    let mut forms: Vec<DecodeIsa> = dots
        .iter()
        .map(|&key_dot| DecodeIsa {
            key_dot,
            ymm32: false,
            bf16_values: false,
            f16_pv: false,
            zmm_scores: false,
            amx_scores: false,
            lane_scores: false,
            lane_int8_q: false,
        })
        .collect();
    // host_has_avx512_vnni includes AVX512VL.
    if host_has_avx512_vnni() {
        for key_dot in [dots[0], dots[dots.len() - 1]] {
            forms.push(DecodeIsa {
                key_dot,
                ymm32: true,
                bf16_values: false,
                f16_pv: false,
                zmm_scores: false,
                amx_scores: false,
                lane_scores: false,
                lane_int8_q: false,
            });
        }
        forms.dedup();
    } else {
        eprintln!("SKIP {}: no AVX512VL here, ymm16-31 untested", kernel.name);
    }
    let fp8_values = kernel.tensor("v").unwrap().format == Format::Fp8E4M3;
    if fp8_values && host_has_avx512_vnni() && host_has_avx512_bf16() {
        // The bf16 P·V beside each score loop: with the zmm scores the
        // exponentials leave several-head tiles' bf16 pairs themselves; keys
        // in lanes with it is what the runtime runs on Zen 4 and Zen 5.
        for (zmm_scores, lane_scores) in [(false, false), (true, false), (true, int8_keys)] {
            forms.push(DecodeIsa {
                key_dot: dots[dots.len() - 1],
                ymm32: true,
                bf16_values: true,
                f16_pv: false,
                zmm_scores,
                amx_scores: false,
                lane_scores,
                lane_int8_q: false,
            });
        }
        forms.dedup();
    } else if fp8_values {
        eprintln!(
            "SKIP {}: no AVX512_BF16/VBMI here, the bf16 P·V untested",
            kernel.name
        );
    }
    if host_has_avx512_vnni() {
        forms.push(DecodeIsa {
            key_dot: dots[dots.len() - 1],
            ymm32: true,
            bf16_values: false,
            f16_pv: false,
            zmm_scores: true,
            amx_scores: false,
            lane_scores: false,
            lane_int8_q: false,
        });
        if int8_keys {
            forms.push(lane_form());
        }
    }
    if tessera_codegen::x86::host_has_avx512_fp16() {
        forms.push(DecodeIsa {
            key_dot: dots[dots.len() - 1],
            ymm32: true,
            bf16_values: false,
            f16_pv: true,
            zmm_scores: true,
            amx_scores: false,
            lane_scores: false,
            lane_int8_q: false,
        });
    } else {
        eprintln!(
            "SKIP {}: no AVX512-FP16 here, the f16 P·V untested",
            kernel.name
        );
    }
    if int8_keys && host_has_avx512_vnni() && tessera_codegen::x86::amx::request_tile_data() {
        forms.push(amx_form());
    } else if int8_keys {
        eprintln!(
            "SKIP {}: no AMX-INT8 here, the AMX scores untested",
            kernel.name
        );
    }
    forms
        .into_iter()
        .map(|isa| (isa, compile_for(kernel, isa)))
        .collect()
}

/// The keys-in-lanes score loop with the P·V the runtime runs beside it
/// on an AVX512-VNNI CPU without AVX512-FP16 (f32 in ymm0–31).
fn lane_form() -> DecodeIsa {
    DecodeIsa {
        key_dot: KeyDot::EvexVnni,
        ymm32: true,
        bf16_values: false,
        f16_pv: false,
        zmm_scores: true,
        amx_scores: false,
        lane_scores: true,
        lane_int8_q: false,
    }
}

/// The AMX score loop beside the CPU's best P·V (f16 FMAs where it has
/// AVX512-FP16, else f32 in ymm0–31).
fn amx_form() -> DecodeIsa {
    DecodeIsa {
        key_dot: KeyDot::EvexVnni,
        ymm32: true,
        bf16_values: false,
        f16_pv: tessera_codegen::x86::host_has_avx512_fp16(),
        zmm_scores: true,
        amx_scores: true,
        lane_scores: false,
        lane_int8_q: false,
    }
}

fn online(mut kernel: Kernel) -> Kernel {
    if let Op::Attention(a) = &mut kernel.op {
        a.softmax = SoftmaxMode::Online;
    }
    kernel.name.push_str("-online");
    kernel
}

struct Case {
    s: usize,
    hq: usize,
    kvh: usize,
    d: usize,
    q_amp: f32,
    /// V uniform in ±`v_amp`; o is checked to `2e-3 · v_amp` absolute, or
    /// where the form rounds p more coarsely to its bound
    /// ([`DecodeIsa::fp8_p_rounding`]).
    v_amp: f32,
    threads: usize,
    chunk: Option<usize>,
    seed: u64,
}

/// Run one case against the interpreter; returns the recomputed rows.
fn check(form: &Form, kernel: &Kernel, c: &Case) -> u64 {
    let (s, hq, kvh, d) = (c.s, c.hq, c.kvh, c.d);
    let inp =
        attention_inputs::inputs_with_values(kernel, hq * d, s * kvh, d, c.q_amp, c.v_amp, c.seed);
    check_inputs(form, kernel, c, &inp)
}

/// [`check`] on given inputs (`c.q_amp` and `c.seed` unused).
fn check_inputs(
    (isa, att): &Form,
    kernel: &Kernel,
    c: &Case,
    inp: &attention_inputs::Inputs,
) -> u64 {
    let (s, hq, kvh, d) = (c.s, c.hq, c.kvh, c.d);
    let qv = &inp.q;
    let bindings = Bindings::decode_attention(
        [hq, kvh, d, s],
        Value::F16(qv.clone()),
        inp.k.value.clone(),
        inp.v.value.clone(),
    );
    let out = interp::run(kernel, &bindings).expect("interp");
    let want = out.get("o").unwrap();
    let stats = out.softmax.unwrap();
    // The absolute part of the tolerance, a fraction of max |v|: 2e-3, or
    // where the form rounds p more coarsely (fp8 values by bf16 dots:
    // 2^-8) that bound and a twentieth for the f32 sums (o's own f16
    // rounding is in the relative part). Tight enough that p truncated to
    // bf16 (2^-7) fails.
    let p_rounding = match kernel.tensor("v").unwrap().format {
        Format::Fp8E4M3 => isa.fp8_p_rounding(),
        _ => 0.0,
    };
    let v_share = f32::max(2e-3, 1.05 * p_rounding);
    // K and V each end at an inaccessible page: a read past either faults.
    let (kg, vg) = (inp.k.guarded(), inp.v.guarded());
    let (kc, vc) = (kg.cache(), vg.cache());
    let mut o = vec![f16::ZERO; hq * d];
    let recomputed = match c.chunk {
        None => att.run(qv, kc, vc, s, hq, kvh, d, &mut o, c.threads),
        Some(ch) => att.run_chunked(qv, kc, vc, s, hq, kvh, d, &mut o, c.threads, ch),
    }
    .expect("run");
    let what = format!(
        "{} s={s} hq={hq} kvh={kvh} d={d} threads={} chunk={:?}",
        kernel.name, c.threads, c.chunk
    );
    assert_eq!(
        recomputed as usize, stats.recomputed,
        "{what}: recomputed rows"
    );
    for (i, (g, w)) in o.iter().zip(want).enumerate() {
        let g = g.to_f32();
        let tol = 2e-3 * w.abs() + v_share * c.v_amp;
        let agree = (g - w).abs() <= tol || (g.is_nan() && w.is_nan());
        assert!(agree, "{what}: o[{i}] = {g}, want {w}");
    }
    recomputed
}

fn sweep(kernel: &Kernel) {
    for form in every_form(kernel) {
        eprintln!("{}: {:?}", kernel.name, form.0);
        sweep_one(&form, kernel);
    }
}

fn sweep_one(form: &Form, kernel: &Kernel) {
    let mut seed = 11;
    // Past 256 keys the kernel keeps its scores super-block by super-block
    // and rescales what it summed when a head's reference max moves.
    for &s in &[1usize, 7, 64, 65, 200, 300, 700] {
        for &(hq, kvh) in &[
            (4usize, 2usize),
            (3, 3),
            (6, 2),
            (8, 2),
            (12, 2),
            (10, 2),
            (9, 1),
            (7, 1),
            (16, 2),
            // Four KV heads of 4: a lane tile whose keys' parameters go
            // one by one.
            (16, 4),
            (8, 8),
            // Multi-head attention with more heads than one ymm's lanes.
            (12, 12),
        ] {
            for &d in &[8usize, 40, 64, 80, 128] {
                for threads in [1, 2] {
                    seed += 1;
                    let c = Case {
                        s,
                        hq,
                        kvh,
                        d,
                        q_amp: 0.5,
                        v_amp: 1.0,
                        threads,
                        chunk: None,
                        seed,
                    };
                    check(form, kernel, &c);
                }
            }
        }
    }
}

#[test]
fn x86_attention_decode_f16() {
    if runnable() {
        sweep(&library::get("attention-decode-f16").unwrap());
    }
}

#[test]
fn x86_attention_decode_kv8() {
    if runnable() {
        sweep(&library::get("attention-decode-kv8").unwrap());
    }
}

#[test]
fn x86_attention_online_modes() {
    if runnable() {
        sweep(&online(library::get("attention-decode-f16").unwrap()));
        sweep(&online(library::get("attention-decode-kv8").unwrap()));
    }
}

#[test]
fn x86_attention_kv8_head_dims_past_512() {
    // Past d = 512 the i16 form of q takes a smaller code range, computed
    // in the kernel from d, so that d products of |c| ≤ 128 stay below
    // 2^31 (an arithmetic bound; these random inputs do not reach it);
    // d = 1032 also has the leading half chunk.
    if !runnable() {
        return;
    }
    let kernel = library::get("attention-decode-kv8").unwrap();
    for form in every_form(&kernel) {
        for &(d, seed) in &[(520usize, 71u64), (1032, 72)] {
            let c = Case {
                s: 70,
                hq: 4,
                kvh: 2,
                d,
                q_amp: 0.5,
                v_amp: 1.0,
                threads: 1,
                chunk: None,
                seed,
            };
            check(&form, &kernel, &c);
        }
    }
}

#[test]
fn x86_attention_async_recomputes_out_of_range_rows() {
    if !runnable() {
        return;
    }
    for name in ["attention-decode-f16", "attention-decode-kv8"] {
        let kernel = library::get(name).unwrap();
        for (form, chunk) in every_form(&kernel)
            .iter()
            .flat_map(|form| [(form, None), (form, Some(64))])
        {
            // |q| up to 8 over d = 16 puts scores far outside [-16.8, 6.5];
            // GQA, and multi-head attention (a tile per head).
            for (hq, kvh) in [(6, 2), (10, 10)] {
                let c = Case {
                    s: 700,
                    hq,
                    kvh,
                    d: 16,
                    q_amp: 8.0,
                    v_amp: 1.0,
                    threads: 2,
                    chunk,
                    seed: 99,
                };
                let r = check(form, &kernel, &c);
                assert!(r > 0, "{name} {hq}/{kvh} {chunk:?}: nothing recomputed");
            }
        }
    }
}

/// Values near the top of their format's range: the f16 P·V's sums in f16
/// must not overflow (f16 values are scaled by 2^-8 and p taken against
/// the running max, so 16 keys sum to at most 4094; fp8 values' to 7168),
/// in both softmax modes, with scores in and far out of the async range.
#[test]
fn x86_attention_large_values_match_the_interpreter() {
    if !runnable() {
        return;
    }
    let mut seed = 900;
    for (name, v_amp) in [
        ("attention-decode-f16", 60000.0),
        ("attention-decode-kv8", 440.0),
    ] {
        let base = library::get(name).unwrap();
        for kernel in [base.clone(), online(base)] {
            for form in every_form(&kernel) {
                // Tiles of 6 heads and of 5 (whose bf16 P·V reads its
                // lookup tables' second halves from memory, not registers).
                for (s, q_amp, hq) in [(40, 0.5, 12), (300, 0.5, 12), (300, 8.0, 12), (40, 0.5, 10)]
                {
                    seed += 1;
                    let c = Case {
                        s,
                        hq,
                        kvh: 2,
                        d: 128,
                        q_amp,
                        v_amp,
                        threads: 1,
                        chunk: None,
                        seed,
                    };
                    check(&form, &kernel, &c);
                }
            }
        }
    }
}

/// fp8 values at e4m3's smallest subnormal (2^-9) with every p tiny: the
/// plain AVX2 P·V widens them to f32 bits of 2^-120 of the value and sums
/// them × 2^-56 until a tile finishes. Every key's row is the same one
/// near 1 and q is −0.13, so every score is near −16.6, just inside the
/// async range, and p ≈ e^-16.6 against phi: each product the same, and o
/// exactly 2^-9. Sums scaled further down lose it: with p × 2^8 each
/// product lands on f32's subnormal grid at about 17 steps, rounded the
/// same way every key (1% off). The online softmax takes p against the
/// max instead (1).
#[test]
fn x86_attention_kv8_subnormal_values_match_the_interpreter() {
    use rand::{Rng, SeedableRng};
    if !runnable() {
        return;
    }
    let base = library::get("attention-decode-kv8").unwrap();
    let d = 128;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1300);
    let key: Vec<f32> = (0..d).map(|_| rng.gen_range(0.99..1.0)).collect();
    for kernel in [base.clone(), online(base)] {
        for form in every_form(&kernel) {
            for (hq, kvh, s) in [(8, 8, 70), (6, 2, 300)] {
                let rows = s * kvh;
                let q = vec![f16::from_f32(-0.13); hq * d];
                let kd: Vec<f32> = key.iter().copied().cycle().take(rows * d).collect();
                let v_amp = 2f32.powi(-9);
                let vd = vec![v_amp; rows * d];
                let inp = attention_inputs::inputs_from(&kernel, q, &kd, &vd, rows, d);
                let c = Case {
                    s,
                    hq,
                    kvh,
                    d,
                    q_amp: 0.0,
                    v_amp,
                    threads: 2,
                    chunk: None,
                    seed: 0,
                };
                let recomputed = check_inputs(&form, &kernel, &c, &inp);
                assert_eq!(
                    recomputed, 0,
                    "{}: scores left the async range",
                    kernel.name
                );
            }
        }
    }
}

/// The async range's flags per head, where only its low side or a NaN
/// fails: every score of some heads far under `phi + lo` (the high side and
/// the running max never see them), and a NaN in one head's q. The
/// kernels recompute exactly the heads the interpreter does, and agree on
/// o (NaN for the NaN head).
#[test]
fn x86_attention_async_flags_scores_under_the_range_and_nan() {
    use rand::{Rng, SeedableRng};
    if !runnable() {
        return;
    }
    for name in ["attention-decode-f16", "attention-decode-kv8"] {
        let kernel = library::get(name).unwrap();
        let Op::Attention(a) = &kernel.op else {
            unreachable!()
        };
        let SoftmaxMode::Async { phi, lo, .. } = a.softmax else {
            panic!("{name}: the library's decode kernel is async")
        };
        for form in every_form(&kernel) {
            for (hq, kvh, s, d) in [(6, 2, 300, 32), (12, 2, 70, 128), (8, 8, 70, 32)] {
                let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1400 + hq as u64);
                let rows = s * kvh;
                // K in [0.5, 1): q = −2 gives every score under −d.
                let kd: Vec<f32> = (0..rows * d).map(|_| rng.gen_range(0.5..1.0)).collect();
                let vd: Vec<f32> = (0..rows * d).map(|_| rng.gen_range(-1.0..1.0)).collect();
                assert!(-(d as f32) < phi + lo, "{name}: scores under the range");
                for nan in [false, true] {
                    let q: Vec<f16> = (0..hq * d)
                        .map(|i| match (i / d) % 3 {
                            0 if !nan => f16::from_f32(-2.0),
                            0 if i % d == 3 => f16::NAN,
                            _ => f16::from_f32(rng.gen_range(-0.1..0.1)),
                        })
                        .collect();
                    let inp = attention_inputs::inputs_from(&kernel, q, &kd, &vd, rows, d);
                    let c = Case {
                        s,
                        hq,
                        kvh,
                        d,
                        q_amp: 0.0,
                        v_amp: 1.0,
                        threads: 2,
                        chunk: None,
                        seed: 0,
                    };
                    let recomputed = check_inputs(&form, &kernel, &c, &inp);
                    assert_eq!(
                        recomputed as usize,
                        hq.div_ceil(3),
                        "{name} {hq}/{kvh} nan={nan}: the flagged heads"
                    );
                }
            }
        }
    }
}

#[test]
fn x86_attention_split_chunks_match_the_interpreter() {
    if !runnable() {
        return;
    }
    let mut seed = 500;
    for name in ["attention-decode-f16", "attention-decode-kv8"] {
        let kernel = library::get(name).unwrap();
        for form in every_form(&kernel) {
            for &(s, chunk) in &[(65usize, 1usize), (200, 7), (700, 300)] {
                for &(hq, kvh) in &[(4usize, 2usize), (6, 1), (9, 9)] {
                    seed += 1;
                    let c = Case {
                        s,
                        hq,
                        kvh,
                        d: 64,
                        q_amp: 0.5,
                        v_amp: 1.0,
                        threads: 2,
                        chunk: Some(chunk),
                        seed,
                    };
                    check(&form, &kernel, &c);
                }
            }
        }
    }
}

#[test]
fn x86_attention_refusals_name_the_reason() {
    let kernel = library::get("attention-decode-f16").unwrap();
    let mut raw = kernel.clone();
    if let Op::Attention(a) = &mut raw.op {
        a.q_prescaled = false;
    }
    raw.tensors.iter_mut().for_each(|t| {
        if t.name == "q" {
            t.layout.int4_pair_transpose = false;
        }
    });
    let e = attention::emit(&raw).unwrap_err().to_string();
    assert!(e.contains("pre-scaled"), "{e}");
    let mut e5 = kernel.clone();
    e5.tensors.iter_mut().for_each(|t| {
        if t.name == "v" {
            t.format = Format::Fp8E5M2;
        }
    });
    let e = attention::emit(&e5).unwrap_err().to_string();
    assert!(e.contains("values fp8e5m2"), "{e}");
    if !runnable() {
        return;
    }
    // A head dim the code does not handle is refused at the call.
    let att = compile(&kernel);
    let (q, k, mut o) = (
        vec![f16::ZERO; 13],
        vec![f16::ZERO; 26],
        vec![f16::ZERO; 13],
    );
    let e = att
        .run(
            &q,
            KvCache::F16(&k),
            KvCache::F16(&k),
            2,
            1,
            1,
            13,
            &mut o,
            1,
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("multiple of 8"), "{e}");
}

/// The keys-in-lanes score loop computes the pair loop's integer dots
/// exactly (unsigned keys, q in two int8 parts, the bias taken back) and
/// finishes them with the same f32 operations, so with the same P·V the
/// two forms' outputs are equal bit for bit: tiles of 4–7 heads (and 2, 3
/// and 8, which stay on the pair loop), head dims with and without a
/// partial 64-byte chunk, keys in 16-key trips and the pair loop's rest,
/// one and two threads; one, two and four KV heads, whose keys' scales
/// and offsets the trips gather as one vector, as two and one by one.
#[test]
fn x86_attention_lane_scores_equal_the_pair_loops_bit_for_bit() {
    if !runnable() {
        return;
    }
    if !tessera_codegen::x86::host_has_avx512_vnni() {
        eprintln!("SKIP: no AVX512-VNNI here");
        return;
    }
    let kernel = library::get("attention-decode-kv8").unwrap();
    let lanes = compile_for(&kernel, lane_form());
    let pairs = compile_for(
        &kernel,
        DecodeIsa {
            lane_scores: false,
            ..lane_form()
        },
    );
    let shapes = [(8, 2), (12, 2), (7, 1), (10, 2), (16, 2), (6, 2), (16, 4)];
    assert_equal_bits(&kernel, &lanes, &pairs, [16, 47, 333, 1000], &shapes, 700);
}

/// The lanes loop with q rounded to int8 in 32-d blocks
/// ([`DecodeIsa::lane_int8_q`]) against a reference that rounds q the
/// same way (`max|q|/127` a block, codes rounded to nearest even) and
/// takes the offsets' term with q's own sum, as the kernel defines its
/// scores; everything after the scores in f64. q's blocks differ in
/// magnitude by up to 60×, so a per-head scale, a block's scale in
/// another block's place or a dropped key bias fails. Head dims with a
/// partial 64-byte chunk and each partial 32-d block (d % 32 = 8, 16,
/// 24), tiles of 4 to 7 heads, keys in trips and the pair loop's rest
/// (which takes the same rounded q), groups whose tiles of 8 and 2 keep
/// the i16 q (the lanes loop does not take them), both softmax modes, one
/// and two threads and flash-decoding chunks, the f32 and bf16 P·V.
#[test]
fn x86_attention_lane_int8_q_matches_its_rounding() {
    use tessera_codegen::x86::{host_has_avx512_bf16, host_has_avx512_vnni};
    if !runnable() {
        return;
    }
    if !host_has_avx512_vnni() {
        eprintln!("SKIP: no AVX512-VNNI here");
        return;
    }
    let q8 = DecodeIsa {
        lane_int8_q: true,
        ..lane_form()
    };
    assert_eq!(q8.q_int8_rounding(), 1.0 / 254.0);
    assert_eq!(lane_form().q_int8_rounding(), 0.0);
    let mut forms = vec![q8];
    if host_has_avx512_bf16() {
        forms.push(DecodeIsa {
            bf16_values: true,
            ..q8
        });
    }
    let base = library::get("attention-decode-kv8").unwrap();
    let mut seed = 900;
    for kernel in [base.clone(), online(base)] {
        for isa in &forms {
            let form = (*isa, compile_for(&kernel, *isa));
            for s in [16usize, 47, 300, 700] {
                for (hq, kvh) in [
                    (12usize, 2usize),
                    (8, 2),
                    (10, 2),
                    (7, 1),
                    (14, 2),
                    (16, 4),
                    (16, 2),
                    (20, 2),
                ] {
                    for d in [8usize, 40, 56, 64, 80, 128] {
                        // One call per worker, and flash-decoding chunks of
                        // 64 keys (calls from a KV head's first query head).
                        for (threads, chunk) in [(1, None), (2, None), (2, Some(64))] {
                            seed += 1;
                            let shape = [s, hq, kvh, d];
                            check_int8_q(&form, &kernel, shape, (threads, chunk), seed);
                        }
                    }
                }
            }
        }
    }
}

/// One case of [`x86_attention_lane_int8_q_matches_its_rounding`].
fn check_int8_q(
    (isa, att): &Form,
    kernel: &Kernel,
    shape: [usize; 4],
    (threads, chunk): (usize, Option<usize>),
    seed: u64,
) {
    use rand::{Rng, SeedableRng};
    let [s, hq, kvh, d] = shape;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    // Blocks of 32 d at 0.5, 0.05, 1, 0.017 and 0 of q's amplitude in
    // turn, each head's pattern one block on from the last.
    let amp = [0.5f32, 0.05, 1.0, 0.017, 0.0];
    let q: Vec<f16> = (0..hq * d)
        .map(|i| f16::from_f32(amp[((i % d) / 32 + i / d) % 5] * rng.gen_range(-1.0f32..1.0)))
        .collect();
    let kd: Vec<f32> = (0..s * kvh * d).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let vd: Vec<f32> = (0..s * kvh * d).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let inp = attention_inputs::inputs_from(kernel, q.clone(), &kd, &vd, s * kvh, d);
    let kq = inp.k.quant().expect("int8 keys");
    let (k, v) = (
        kq.dequantize(),
        inp.v.quant().expect("fp8 values").dequantize(),
    );
    let (kg, vg) = (inp.k.guarded(), inp.v.guarded());
    let mut o = vec![f16::ZERO; hq * d];
    let (kc, vc) = (kg.cache(), vg.cache());
    match chunk {
        None => att.run(&q, kc, vc, s, hq, kvh, d, &mut o, threads),
        Some(ch) => att.run_chunked(&q, kc, vc, s, hq, kvh, d, &mut o, threads, ch),
    }
    .expect("run");
    // The interpreter's attention (exact q), which the output must stay
    // within the documented rounding's bound of.
    let bindings = Bindings::decode_attention(
        [hq, kvh, d, s],
        Value::F16(q.clone()),
        inp.k.value.clone(),
        inp.v.value.clone(),
    );
    let interp_out = interp::run(kernel, &bindings).expect("interp");
    let exact = interp_out.get("o").unwrap();
    let group = hq / kvh;
    let v_share = f32::max(2e-3, 1.05 * isa.fp8_p_rounding());
    // The size of the tile each head of a group falls in.
    let tile_of: Vec<usize> = decode_tile_heads(0, group, group)
        .flat_map(|t| std::iter::repeat_n(t, t))
        .collect();
    for h in 0..hq {
        let qh: Vec<f32> = q[h * d..(h + 1) * d].iter().map(|x| x.to_f32()).collect();
        // q as the kernel rounds it, block by block, in f32, where the
        // lanes loop takes the head's tile.
        let mut rounded: Vec<f64> = qh.iter().map(|&x| f64::from(x)).collect();
        let lanes = attention::LANE_TILE_HEADS.contains(&tile_of[h % group]);
        for (b, block) in qh.chunks(32).enumerate().filter(|_| lanes) {
            let m = block.iter().fold(0f32, |m, x| m.max(x.abs()));
            let m = m.max(attention::LANE_Q8_FLOOR);
            let (inv, scale) = (127.0f32 / m, m / 127.0f32);
            for (i, &x) in block.iter().enumerate() {
                rounded[32 * b + i] = f64::from((x * inv).round_ties_even() * scale);
            }
        }
        let sum_q: f64 = qh.iter().map(|&x| f64::from(x)).sum();
        let sum_rounded: f64 = rounded.iter().sum();
        let kv = h / group;
        let scores: Vec<f64> = (0..s)
            .map(|j| {
                let row = j * kvh + kv;
                let dot: f64 = (0..d).map(|i| rounded[i] * f64::from(k[row * d + i])).sum();
                dot + f64::from(kq.offsets[row]) * (sum_q - sum_rounded)
            })
            .collect();
        // Each score moves by at most `r·Σ_b max|q_b|·Σ_b|k|` from the
        // exact q's, so o by at most `(e^{2·that} − 1)·max|v|` (|v| ≤ 1).
        let r = if lanes {
            f64::from(isa.q_int8_rounding())
        } else {
            0.0
        };
        let shift = (0..s)
            .map(|j| {
                let kj = &k[(j * kvh + kv) * d..][..d];
                qh.chunks(32)
                    .zip(kj.chunks(32))
                    .map(|(qb, kb)| {
                        let m = qb.iter().fold(0f32, |m, x| m.max(x.abs()));
                        f64::from(m) * kb.iter().map(|x| f64::from(x.abs())).sum::<f64>()
                    })
                    .sum::<f64>()
            })
            .fold(0f64, f64::max)
            * r;
        let q_share = (2.0 * shift).exp_m1();
        let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let p: Vec<f64> = scores.iter().map(|x| (x - max).exp()).collect();
        let den: f64 = p.iter().sum();
        for i in 0..d {
            let want = (0..s)
                .map(|j| p[j] * f64::from(v[(j * kvh + kv) * d + i]))
                .sum::<f64>()
                / den;
            let got = f64::from(o[h * d + i].to_f32());
            let tol = 2e-3 * want.abs() + f64::from(v_share);
            let what = format!(
                "{} {isa:?} s={s} hq={hq} kvh={kvh} d={d} threads={threads} chunk={chunk:?}: o[{h}][{i}] = {got}",
                kernel.name
            );
            assert!((got - want).abs() <= tol, "{what}, want {want}");
            let w = f64::from(exact[h * d + i]);
            let bound = 2e-3 * w.abs() + f64::from(v_share) + q_share;
            assert!(
                (got - w).abs() <= bound,
                "{what}, the interpreter's {w} (bound {bound})"
            );
        }
    }
}

/// The AMX score loop computes the zmm loop's integer dots exactly (q's
/// codes split into `256·hi + lo`), so with the same P·V the two forms'
/// outputs are equal bit for bit: GQA 4 and 6, head dims with and without
/// a partial 64-byte chunk, keys in 32- and 16-key trips and the zmm
/// loop's rest, one and two threads.
#[test]
fn x86_attention_amx_scores_equal_the_zmm_loops_bit_for_bit() {
    if !runnable() {
        return;
    }
    if !(tessera_codegen::x86::host_has_avx512_vnni()
        && tessera_codegen::x86::amx::request_tile_data())
    {
        eprintln!("SKIP: no AMX-INT8 here");
        return;
    }
    let kernel = library::get("attention-decode-kv8").unwrap();
    let amx = compile_for(&kernel, amx_form());
    let zmm = compile_for(
        &kernel,
        DecodeIsa {
            amx_scores: false,
            lane_scores: false,
            ..amx_form()
        },
    );
    let shapes = [(8, 2), (12, 2), (6, 1)];
    assert_equal_bits(&kernel, &amx, &zmm, [16, 95, 333, 1000], &shapes, 500);
}

/// Two forms of `kernel` give equal outputs, bit for bit, over contexts
/// `contexts`, head layouts `shapes` (query heads, KV heads), head dims
/// with and without a partial 64-byte chunk, and one and two threads.
fn assert_equal_bits(
    kernel: &Kernel,
    a: &HostAttention,
    b: &HostAttention,
    contexts: [usize; 4],
    shapes: &[(usize, usize)],
    mut seed: u64,
) {
    for s in contexts {
        for &(hq, kvh) in shapes {
            for d in [64usize, 72, 128, 200] {
                for threads in [1, 2] {
                    seed += 1;
                    let inp = attention_inputs::inputs_with_values(
                        kernel,
                        hq * d,
                        s * kvh,
                        d,
                        0.5,
                        1.0,
                        seed,
                    );
                    let (kg, vg) = (inp.k.guarded(), inp.v.guarded());
                    let (kc, vc) = (kg.cache(), vg.cache());
                    let run = |att: &HostAttention| {
                        let mut o = vec![f16::ZERO; hq * d];
                        att.run(&inp.q, kc, vc, s, hq, kvh, d, &mut o, threads)
                            .expect("run");
                        o.iter().map(|x| x.to_bits()).collect::<Vec<u16>>()
                    };
                    assert_eq!(
                        run(a),
                        run(b),
                        "s={s} hq={hq} kvh={kvh} d={d} threads={threads}"
                    );
                }
            }
        }
    }
}
