//! NEON decode attention: listing snapshots of the canonical set and the
//! llvm-mc byte check of every variant (any host), and the differential
//! suite against the reference interpreter (aarch64, under qemu here):
//! head dims 64 and 128 (and tails), GQA 1/4/8, contexts 1..4096 with
//! non-multiples of every tile, both softmax modes, adversarial scores that
//! force the recompute path, every KV format, fp16 and plain NEON paths
//! (each gated on run-time detection: a SIGILL would kill the binary).

use tessera_codegen::artifact::MachineCode;
use tessera_codegen::neon::{NeonBackend, attention_append};
use tessera_dsl::ir::ParamType;
use tessera_dsl::ir::{Format, Group, Kernel, Op, SoftmaxMode};
use tessera_dsl::library;
use tessera_dsl::testing::attention_with_formats as with_formats;
use tessera_tests::llvm_mc::{McError, check_aarch64, emulated};

const MATTR: &str = "+neon,+fullfp16";

const TARGETS: [&str; 4] = [
    "aarch64-i8mm",
    "aarch64-dotprod",
    "aarch64-fp16",
    "aarch64-neon",
];

fn online(mut k: Kernel) -> Kernel {
    if let Op::Attention(a) = &mut k.op {
        a.softmax = SoftmaxMode::Online;
    }
    k.name.push_str("-online");
    k
}

fn unscaled(mut k: Kernel) -> Kernel {
    if let Op::Attention(a) = &mut k.op {
        a.q_prescaled = false;
    }
    k.name.push_str("-unscaled");
    k
}

/// Every KV format pair the emitter takes.
fn format_pairs() -> Vec<(Format, Format)> {
    let keys = [
        Format::F16,
        Format::I8Asym(Group::Row, ParamType::F32),
        Format::I8Sym(Group::Row, ParamType::F32),
    ];
    let values = [Format::F16, Format::Fp8E4M3, Format::Fp8E5M2];
    let mut out = Vec::new();
    for k in keys {
        for v in values {
            out.push((k, v));
        }
    }
    out
}

/// Every kernel variant: library kernels, all format pairs, both softmax
/// modes, prescaled or not.
fn variants() -> Vec<Kernel> {
    let base = library::get("attention-decode-f16").unwrap();
    let mut out = vec![library::get("attention-decode-kv8").unwrap()];
    for (kf, vf) in format_pairs() {
        let k = with_formats(base.clone(), kf, vf);
        out.push(online(k.clone()));
        out.push(k);
    }
    out.push(unscaled(base.clone()));
    out.push(unscaled(online(base)));
    // Prefill kernels (online softmax: the flash loop of
    // neon/attention_prefill.rs) in every format pair, and with q unscaled.
    let prefill = library::get("attention-prefill-f16").unwrap();
    for (kf, vf) in format_pairs() {
        out.push(with_formats(prefill.clone(), kf, vf));
    }
    out.push(unscaled(prefill));
    out
}

fn emit(target: &str, k: &Kernel) -> MachineCode {
    NeonBackend::new(target)
        .unwrap()
        .emit_attention(k)
        .unwrap_or_else(|e| panic!("{target} {}: {e}", k.name))
}

#[test]
fn listing_snapshots_of_the_canonical_set() {
    for target in ["aarch64-fp16", "aarch64-neon"] {
        for name in ["attention-decode-f16", "attention-decode-kv8"] {
            let code = emit(target, &library::get(name).unwrap());
            insta::assert_snapshot!(format!("{target}_{name}"), code.listing);
        }
    }
}

#[test]
fn fp16_targets_use_fmla_8h_and_plain_neon_never_does() {
    let k = library::get("attention-decode-f16").unwrap();
    for target in TARGETS {
        let l = emit(target, &k).listing;
        let fp16 = target != "aarch64-neon";
        assert_eq!(l.contains("fmla v8.8h, v0.8h, v4.8h"), fp16, "{target}");
        let fmla_8h = l
            .lines()
            .any(|x| x.trim_start().starts_with("fmla") && x.contains(".8h"));
        assert_eq!(fmla_8h, fp16, "{target}");
        assert!(l.contains("fmla v4.4s, v1.4s, v0.s[0]"), "{target}: PV");
    }
}

#[test]
fn llvm_mc_assembles_every_variant_to_the_same_bytes() {
    if emulated() {
        eprintln!("SKIP llvm-mc under emulation: the host run checks these bytes");
        return;
    }
    for target in ["aarch64-fp16", "aarch64-neon"] {
        for k in variants() {
            let code = emit(target, &k);
            match check_aarch64(&code.listing, &code.bytes, MATTR) {
                Ok(()) => {}
                Err(McError::Missing) => {
                    eprintln!("llvm-mc not installed: skipped");
                    return;
                }
                Err(McError::Failed(e)) => panic!("{target} {}: {e}", k.name),
            }
        }
    }
}

/// Cache format pairs the KV append writes.
fn append_pairs() -> Vec<(Format, Format)> {
    let mut out = Vec::new();
    for kf in [Format::F16, Format::I8Asym(Group::Row, ParamType::F32)] {
        for vf in [Format::F16, Format::Fp8E4M3, Format::Fp8E5M2] {
            out.push((kf, vf));
        }
    }
    out
}

fn emit_append(target: &str, k: &Kernel) -> MachineCode {
    let be = NeonBackend::new(target).unwrap();
    attention_append::emit(be.caps(), k).unwrap_or_else(|e| panic!("{target} {}: {e}", k.name))
}

#[test]
fn kv_append_assembles_to_the_same_bytes_and_refuses_other_formats() {
    let base = library::get("attention-decode-f16").unwrap();
    for (kf, vf) in append_pairs() {
        if emulated() {
            eprintln!("SKIP llvm-mc under emulation: the host run checks these bytes");
            break;
        }
        let code = emit_append("aarch64-neon", &with_formats(base.clone(), kf, vf));
        match check_aarch64(&code.listing, &code.bytes, MATTR) {
            Ok(()) => {}
            Err(McError::Missing) => return,
            Err(McError::Failed(e)) => panic!("append {kf} {vf}: {e}"),
        }
    }
    let be = NeonBackend::new("aarch64-neon").unwrap();
    let sym = with_formats(base, Format::I8Sym(Group::Row, ParamType::F32), Format::F16);
    let e = attention_append::emit(be.caps(), &sym)
        .unwrap_err()
        .to_string();
    assert!(e.contains("KV append of i8sym:row keys"), "{e}");
}

#[test]
fn unsupported_kernels_are_refused_with_a_reason() {
    let be = NeonBackend::new("aarch64-fp16").unwrap();
    let base = library::get("attention-decode-f16").unwrap();
    let k4 = with_formats(
        base.clone(),
        Format::U4Asym(Group::Row, ParamType::F32),
        Format::F16,
    );
    let e = be.emit_attention(&k4).unwrap_err().to_string();
    assert!(e.contains("keys"), "{e}");
    let mm = library::get("matmul-f16").unwrap();
    assert!(be.emit_attention(&mm).is_err());
}

#[cfg(target_arch = "aarch64")]
mod run {
    use super::*;
    use half::f16;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;
    use tessera_codegen::host_attention::HostAttention;
    use tessera_dsl::interp::{self, Bindings, Value};
    use tessera_dsl::quant::{self, QuantTensor};
    use tessera_tests::guarded::GuardedCache;

    /// Targets this CPU runs: the fp16 path if it has FEAT_FP16, and plain
    /// NEON always.
    fn runnable() -> Vec<&'static str> {
        let mut t = Vec::new();
        if std::arch::is_aarch64_feature_detected!("fp16") {
            t.push("aarch64-fp16");
        }
        t.push("aarch64-neon");
        t
    }

    #[test]
    fn detection_matches_the_emulated_cpu() {
        if let Ok(want) = std::env::var("TESSERA_EXPECT_TARGET") {
            assert_eq!(NeonBackend::detect_name(), Some(want.as_str()));
        }
    }

    fn cache(
        format: Format,
        rows: usize,
        d: usize,
        data: &[f32],
    ) -> (Value, Option<QuantTensor>, Vec<f16>) {
        if format == Format::F16 {
            let h: Vec<f16> = data.iter().map(|&x| f16::from_f32(x)).collect();
            (Value::F16(h.clone()), None, h)
        } else {
            let q = quant::quantize(format, rows, d, data).expect("quantize");
            (Value::Quant(q.clone()), Some(q), Vec::new())
        }
    }

    /// A cache as the kernel reads it, quantized rows or f16, in memory
    /// that ends at an inaccessible page (a read past it faults).
    fn guarded((q, h): &(Option<QuantTensor>, Vec<f16>)) -> GuardedCache {
        match q {
            Some(q) => GuardedCache::quant(q),
            None => GuardedCache::halves(h),
        }
    }

    /// One decode problem on random inputs (q from ±`q_amp`, K and V from
    /// ±1, quantized as the kernel's formats say) and the reference
    /// interpreter's answer for it.
    struct Decode {
        q: Vec<f16>,
        k: (Option<QuantTensor>, Vec<f16>),
        v: (Option<QuantTensor>, Vec<f16>),
        want: Vec<f32>,
        recomputed: usize,
    }

    impl Decode {
        fn new(
            kernel: &Kernel,
            (s, hq, kvh, d): (usize, usize, usize, usize),
            q_amp: f32,
            seed: u64,
        ) -> Decode {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let a = kernel.as_attention().unwrap();
            let kf = kernel.tensor(&a.k).unwrap().format;
            let vf = kernel.tensor(&a.v).unwrap().format;
            let q: Vec<f16> = (0..hq * d)
                .map(|_| f16::from_f32(rng.gen_range(-q_amp..q_amp)))
                .collect();
            let kd: Vec<f32> = (0..s * kvh * d).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let vd: Vec<f32> = (0..s * kvh * d).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let (kval, kq, k16) = cache(kf, s * kvh, d, &kd);
            let (vval, vq, v16) = cache(vf, s * kvh, d, &vd);
            let bindings =
                Bindings::decode_attention([hq, kvh, d, s], Value::F16(q.clone()), kval, vval);
            let out = interp::run(kernel, &bindings).expect("interp");
            Decode {
                want: out.get("o").unwrap().to_vec(),
                recomputed: out.softmax.unwrap().recomputed,
                q,
                k: (kq, k16),
                v: (vq, v16),
            }
        }

        /// The caches as the kernel reads them.
        /// K and V in guarded memory ([`GuardedCache::cache`] reads them).
        fn guarded(&self) -> (GuardedCache, GuardedCache) {
            (guarded(&self.k), guarded(&self.v))
        }

        /// `o` against the interpreter. f16 accumulation of QK on fp16
        /// cores (d/32 products per lane) rounds scores by ~1e-3 relative:
        /// invisible at ordinary scores (worst seen 6e-4), up to ~6e-3 at
        /// the adversarial |score| ~ 40.
        fn assert_close(&self, o: &[f16], target: &str, q_amp: f32, what: &str) {
            let tol = if target != "aarch64-neon" && q_amp > 1.0 {
                1.5e-2
            } else {
                2e-3
            };
            assert_eq!(o.len(), self.want.len(), "{what}: output length");
            for (i, (g, w)) in o.iter().zip(&self.want).enumerate() {
                let g = g.to_f32();
                assert!(
                    (g - w).abs() <= tol * w.abs() + tol,
                    "{what}: o[{i}] = {g}, want {w}"
                );
            }
        }
    }

    struct Case {
        s: usize,
        hq: usize,
        kvh: usize,
        d: usize,
        q_amp: f32,
        threads: usize,
        seed: u64,
    }

    /// Run one case; returns the recomputed-row count (checked equal to the
    /// interpreter's).
    fn check(target: &str, att: &HostAttention, kernel: &Kernel, c: &Case) -> u64 {
        let Case {
            s,
            hq,
            kvh,
            d,
            q_amp,
            threads,
            seed,
        } = *c;
        let p = Decode::new(kernel, (s, hq, kvh, d), q_amp, seed);
        let (kg, vg) = p.guarded();
        let (kc, vc) = (kg.cache(), vg.cache());
        let mut o = vec![f16::ZERO; hq * d];
        let recomputed = att
            .run(&p.q, kc, vc, s, hq, kvh, d, &mut o, threads)
            .expect("run");
        let what = format!(
            "{target} {} s={s} hq={hq} kvh={kvh} d={d} threads={threads}",
            kernel.name
        );
        assert_eq!(recomputed as usize, p.recomputed, "{what}: recomputed rows");
        p.assert_close(&o, target, q_amp, &what);
        recomputed
    }

    fn compile(target: &str, kernel: &Kernel) -> HostAttention {
        HostAttention::new(kernel, &emit(target, kernel)).expect("map")
    }

    /// Many short contexts (around the 64-key block and the 4-lane exp) on
    /// every GQA ratio and head dim.
    fn sweep(kernel: &Kernel, dims: &[usize], lens: &[usize]) {
        for target in runnable() {
            let att = compile(target, kernel);
            let mut seed = 11;
            for &s in lens {
                for &(hq, kvh) in &[(2usize, 2usize), (8, 2), (8, 1)] {
                    for &d in dims {
                        seed += 1;
                        let c = Case {
                            s,
                            hq,
                            kvh,
                            d,
                            q_amp: 0.5,
                            threads: 1 + (seed as usize % 2),
                            seed,
                        };
                        check(target, &att, kernel, &c);
                    }
                }
            }
        }
    }

    #[test]
    fn library_kernels_short_contexts() {
        for name in ["attention-decode-f16", "attention-decode-kv8"] {
            let k = library::get(name).unwrap();
            sweep(&k, &[64, 128], &[1, 3, 63, 64, 65, 130]);
            sweep(&online(k), &[64, 128], &[1, 5, 64, 129]);
        }
    }

    #[test]
    fn every_kv_format_and_head_dim_tails() {
        let base = library::get("attention-decode-f16").unwrap();
        for (kf, vf) in format_pairs() {
            let k = with_formats(base.clone(), kf, vf);
            sweep(&k, &[13, 64, 72], &[1, 66]);
            sweep(&online(k), &[8, 37], &[2, 70]);
        }
        sweep(&unscaled(base.clone()), &[64, 20], &[1, 67]);
        sweep(&unscaled(online(base)), &[128], &[100]);
    }

    #[test]
    fn long_contexts() {
        let cases = [
            ("attention-decode-f16", 4096, 8, 2, 128),
            ("attention-decode-kv8", 4096, 8, 1, 64),
            ("attention-decode-kv8", 1001, 4, 1, 128),
            ("attention-decode-f16", 2047, 8, 8, 64),
        ];
        for target in runnable() {
            for (i, &(name, s, hq, kvh, d)) in cases.iter().enumerate() {
                let k = library::get(name).unwrap();
                let att = compile(target, &k);
                let c = Case {
                    s,
                    hq,
                    kvh,
                    d,
                    q_amp: 0.5,
                    threads: 2,
                    seed: 500 + i as u64,
                };
                check(target, &att, &k, &c);
            }
        }
    }

    /// The append writes row `pos` bit-for-bit as the reference quantizer
    /// would, and nothing else.
    #[test]
    fn kv_append_matches_the_reference_quantizer_bit_for_bit() {
        use tessera_codegen::neon::attention_append::{KvRowsMut, NeonKvAppend};
        let base = library::get("attention-decode-f16").unwrap();
        let be = NeonBackend::new("aarch64-neon").unwrap();
        let mut seed = 40;
        for (kf, vf) in append_pairs() {
            let kernel = with_formats(base.clone(), kf, vf);
            let app = NeonKvAppend::new(be.caps(), &kernel, &emit_append("aarch64-neon", &kernel))
                .unwrap();
            for &(kvh, d, cap, pos, amp) in &[
                (1usize, 64usize, 3usize, 0usize, 1.0f32),
                (4, 128, 5, 4, 3.0),
                (2, 13, 4, 2, 0.01),
                (8, 64, 2, 1, 500.0),
            ] {
                seed += 1;
                let mut rng = ChaCha8Rng::seed_from_u64(seed);
                let new = |rng: &mut ChaCha8Rng| -> Vec<f16> {
                    (0..kvh * d)
                        .map(|_| f16::from_f32(rng.gen_range(-amp..amp)))
                        .collect()
                };
                let (kn, mut vn) = (new(&mut rng), new(&mut rng));
                // Specials the fp8 encoders must saturate or keep: inf, NaN,
                // values past the largest code, the subnormal boundary.
                for (i, x) in [
                    f16::INFINITY,
                    f16::NEG_INFINITY,
                    f16::NAN,
                    f16::from_f32(470.0),
                    f16::from_f32(0.015625),
                    f16::from_f32(-0.0009),
                ]
                .into_iter()
                .enumerate()
                {
                    if i < vn.len() && vf != Format::F16 {
                        vn[i] = x;
                    }
                }
                let rows = cap * kvh;
                let garbage = |rng: &mut ChaCha8Rng, n: usize| -> Vec<u8> {
                    (0..n).map(|_| rng.r#gen()).collect()
                };
                let check_side =
                    |rng: &mut ChaCha8Rng,
                     f: Format,
                     new: &[f16],
                     run: &mut dyn FnMut(KvRowsMut<'_>)| {
                        let new32: Vec<f32> = new.iter().map(|x| x.to_f32()).collect();
                        if f == Format::F16 {
                            let mut c: Vec<f16> = garbage(rng, rows * d)
                                .iter()
                                .map(|&b| f16::from_bits(u16::from(b) * 3))
                                .collect();
                            let before = c.clone();
                            run(KvRowsMut::F16(&mut c));
                            let row0 = pos * kvh * d;
                            for (i, (a, b)) in c.iter().zip(&before).enumerate() {
                                let want = if (row0..row0 + kvh * d).contains(&i) {
                                    new[i - row0]
                                } else {
                                    *b
                                };
                                assert_eq!(a.to_bits(), want.to_bits(), "f16 element {i}");
                            }
                            return;
                        }
                        // NaN is refused by the reference quantizer: compare
                        // those elements with the fp8 NaN code directly.
                        let finite: Vec<f32> = new32
                            .iter()
                            .map(|&x| if x.is_finite() { x } else { 0.0 })
                            .collect();
                        let want = quant::quantize(f, kvh, d, &finite).unwrap();
                        let mut codes = garbage(rng, rows * d);
                        let mut scales = vec![7.0f32; if f.is_asymmetric() { rows } else { 0 }];
                        let mut offsets = scales.clone();
                        let (cb, sb) = (codes.clone(), scales.clone());
                        run(KvRowsMut::Codes {
                            codes: &mut codes,
                            scales: &mut scales,
                            offsets: &mut offsets,
                        });
                        let row0 = pos * kvh * d;
                        for i in 0..rows * d {
                            let w = if (row0..row0 + kvh * d).contains(&i) {
                                let x = new32[i - row0];
                                let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
                                match (x.is_nan(), x.is_infinite(), f) {
                                    (true, _, Format::Fp8E4M3) => sign | 0x7F,
                                    (true, _, _) => sign | 0x7E,
                                    (_, true, Format::Fp8E4M3) => sign | 0x7E,
                                    (_, true, _) => sign | 0x7B,
                                    _ => want.codes[i - row0],
                                }
                            } else {
                                cb[i]
                            };
                            assert_eq!(
                                codes[i],
                                w,
                                "{f} kvh={kvh} d={d} pos={pos}: code {i} (input {:?})",
                                new32.get(i.wrapping_sub(row0))
                            );
                        }
                        for r in 0..scales.len() {
                            if r / kvh == pos {
                                assert_eq!(
                                    scales[r].to_bits(),
                                    want.scales[r % kvh].to_bits(),
                                    "scale row {r}"
                                );
                                assert_eq!(
                                    offsets[r].to_bits(),
                                    want.offsets[r % kvh].to_bits(),
                                    "offset row {r}"
                                );
                            } else {
                                assert_eq!(scales[r], sb[r]);
                                assert_eq!(offsets[r], sb[r]);
                            }
                        }
                    };
                // Keys then values, each against a dummy other side.
                let mut vdummy16 = vec![f16::ZERO; rows * d];
                let mut vdummy8 = vec![0u8; rows * d];
                let (mut e1, mut e2) = (Vec::new(), Vec::new());
                check_side(&mut rng, kf, &kn, &mut |kc| {
                    let vc = if vf == Format::F16 {
                        KvRowsMut::F16(&mut vdummy16)
                    } else {
                        KvRowsMut::Codes {
                            codes: &mut vdummy8,
                            scales: &mut e1,
                            offsets: &mut e2,
                        }
                    };
                    app.run(&kn, &vn, kc, vc, pos, kvh, d).unwrap();
                });
                let mut kdummy16 = vec![f16::ZERO; rows * d];
                let mut kdummy8 = vec![0u8; rows * d];
                let mut ks = vec![0f32; rows];
                let mut ko = vec![0f32; rows];
                check_side(&mut rng, vf, &vn, &mut |vc| {
                    let kc = if kf == Format::F16 {
                        KvRowsMut::F16(&mut kdummy16)
                    } else {
                        KvRowsMut::Codes {
                            codes: &mut kdummy8,
                            scales: &mut ks,
                            offsets: &mut ko,
                        }
                    };
                    app.run(&kn, &vn, kc, vc, pos, kvh, d).unwrap();
                });
            }
            // Too short a cache is refused.
            let mut small = vec![f16::ZERO; 3];
            let mut small2 = vec![f16::ZERO; 3];
            let kn = vec![f16::ZERO; 8];
            assert!(
                app.run(
                    &kn,
                    &kn,
                    KvRowsMut::F16(&mut small),
                    KvRowsMut::F16(&mut small2),
                    0,
                    1,
                    8
                )
                .is_err()
            );
        }
    }

    /// Flash-decoding (`split s`): chunks of the sequence as separate jobs
    /// of the NEON kernel, combined by `HostAttention` from the state each
    /// call leaves in scratch, against the interpreter (outputs and
    /// recomputed rows).
    #[test]
    fn split_over_the_sequence_matches_the_interpreter() {
        let cases = [
            // (kernel, s, hq, kvh, d, chunk, q amplitude)
            (
                "attention-decode-f16",
                4096usize,
                4usize,
                1usize,
                128usize,
                1000usize,
                0.5f32,
            ),
            ("attention-decode-kv8", 1500, 8, 1, 64, 256, 0.5),
            ("attention-decode-f16", 65, 2, 2, 64, 64, 0.5),
            ("attention-decode-kv8", 1, 4, 4, 64, 64, 0.5),
            ("attention-decode-f16", 300, 4, 2, 64, 100, 4.0),
        ];
        for target in runnable() {
            for (i, &(name, s, hq, kvh, d, chunk, amp)) in cases.iter().enumerate() {
                for k in [
                    library::get(name).unwrap(),
                    online(library::get(name).unwrap()),
                ] {
                    let split = compile(target, &k);
                    let p = Decode::new(&k, (s, hq, kvh, d), amp, 700 + i as u64);
                    let (kg, vg) = p.guarded();
                    let (kc, vc) = (kg.cache(), vg.cache());
                    let mut o = vec![f16::ZERO; hq * d];
                    let r = split
                        .run_chunked(&p.q, kc, vc, s, hq, kvh, d, &mut o, 2, chunk)
                        .unwrap();
                    let what = format!("{target} {} s={s} chunk={chunk}", k.name);
                    assert_eq!(r as usize, p.recomputed, "{what}");
                    if amp > 1.0 && k.as_attention().unwrap().softmax != SoftmaxMode::Online {
                        assert!(r > 0, "{what}: nothing recomputed");
                    }
                    p.assert_close(&o, target, amp, &what);
                }
            }
        }
    }

    #[test]
    fn adversarial_scores_force_the_recompute_path() {
        for target in runnable() {
            for name in ["attention-decode-f16", "attention-decode-kv8"] {
                let k = library::get(name).unwrap();
                let att = compile(target, &k);
                // |q| up to 4 over d = 64: scores far outside [-16.8, 6.5].
                for (s, d, seed) in [(200usize, 64usize, 99u64), (70, 128, 98)] {
                    let c = Case {
                        s,
                        hq: 8,
                        kvh: 2,
                        d,
                        q_amp: 4.0,
                        threads: 2,
                        seed,
                    };
                    let r = check(target, &att, &k, &c);
                    assert!(
                        r > 0,
                        "{target} {name}: the adversarial case recomputed nothing"
                    );
                }
            }
        }
    }
}
