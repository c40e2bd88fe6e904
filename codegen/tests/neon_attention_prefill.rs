//! The NEON backend's causal prefill attention (the flash loop of
//! `neon/attention_prefill.rs`) against the reference interpreter: every
//! cache format the NEON attention takes (f16, int8 keys with and without
//! offsets, fp8 e4m3 and e5m2 values), q pre-scaled or not, GQA groups 1
//! to 8, head dims 64, 80, 96, 128, 256 (and 4, 12 for the P·V chunk
//! tails), prefixes p ∈ {0, 1, 17}, prompts across the row block and
//! contexts past the key block, far scores, 1 and 2 threads. The code is
//! the same on every NEON target (f32 arithmetic only), so plain NEON is
//! emitted; it runs on aarch64 hosts (qemu-aarch64 here), the emission
//! checks on any host.

use tessera_codegen::artifact::PrefillBlocks;
use tessera_codegen::neon::NeonBackend;
use tessera_dsl::ir::{Kernel, Op, SoftmaxMode};
use tessera_dsl::library;

mod prefill_harness;

fn emit(kernel: &Kernel) -> tessera_codegen::artifact::MachineCode {
    NeonBackend::new("aarch64-neon")
        .unwrap()
        .emit_attention(kernel)
        .unwrap_or_else(|e| panic!("{}: {e}", kernel.name))
}

#[test]
fn online_prefill_kernels_get_the_flash_loop_async_ones_the_decode_loop() {
    let kernel = library::get("attention-prefill-f16").unwrap();
    let code = emit(&kernel);
    assert_eq!(code.whole_prefill, Some(PrefillBlocks::DEFAULT));
    assert_eq!(code.head_dim_multiple, 4);
    assert!(
        code.listing.contains("attention prefill (flash"),
        "{}",
        code.listing
    );
    let mut slow = kernel.clone();
    if let Op::Attention(a) = &mut slow.op {
        a.softmax = SoftmaxMode::Async {
            phi: 0.0,
            lo: -16.8,
            hi: 6.5,
        };
    }
    let code = emit(&slow);
    assert!(code.whole_prefill.is_none());
    assert!(
        code.listing
            .starts_with("// prefill: this decode kernel runs once per query token"),
        "{}",
        code.listing
    );
}

/// The emitted loop nest, pinned: a change to the blocks, tiles or register
/// plan shows up here for review.
#[test]
fn neon_prefill_listing() {
    let code = emit(&library::get("attention-prefill-f16").unwrap());
    insta::assert_snapshot!("neon_attention_prefill_f16", code.listing);
}

#[cfg(target_arch = "aarch64")]
mod run {
    use super::*;
    use half::f16;
    use prefill_harness::{Case, check, far_scores, head_dims_and_long_contexts, sweep};
    use tessera_codegen::host_attention::{HostAttention, KvCache};
    use tessera_dsl::ir::{Format, Group, ParamType};
    use tessera_dsl::testing::attention_with_formats as with_formats;

    fn compile(kernel: &Kernel) -> HostAttention {
        let code = emit(kernel);
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
    fn neon_prefill_f16() {
        let kernel = library::get("attention-prefill-f16").unwrap();
        sweep(&compile(&kernel), &kernel, &[4, 12, 64], &[1, 9, 70]);
    }

    #[test]
    fn neon_prefill_kv8() {
        let kernel = library::get("attention-prefill-kv8").unwrap();
        sweep(&compile(&kernel), &kernel, &[8, 64], &[5, 70]);
    }

    /// The formats the library kernels do not use, and q that the kernel
    /// scales by 1/√d itself.
    #[test]
    fn neon_prefill_other_formats_and_unscaled_q() {
        let base = library::get("attention-prefill-f16").unwrap();
        let mut kernels = Vec::new();
        for (kf, vf) in [
            (Format::I8Sym(Group::Row, ParamType::F32), Format::Fp8E5M2),
            (Format::F16, Format::Fp8E4M3),
            (Format::I8Asym(Group::Row, ParamType::F32), Format::F16),
        ] {
            kernels.push(with_formats(base.clone(), kf, vf));
        }
        let mut unscaled = base;
        if let Op::Attention(a) = &mut unscaled.op {
            a.q_prescaled = false;
        }
        unscaled.name.push_str("-unscaled");
        kernels.push(unscaled);
        for (i, kernel) in kernels.iter().enumerate() {
            let att = compile(kernel);
            for (p, t, hq, kvh, d) in [(0, 70, 6, 3, 64), (17, 9, 8, 1, 128), (1, 33, 4, 4, 80)] {
                check(
                    &att,
                    kernel,
                    &Case {
                        p,
                        t,
                        hq,
                        kvh,
                        d,
                        q_amp: 0.5,
                        threads: 1 + i % 2,
                        seed: 300 + i as u64 + p as u64,
                    },
                );
            }
        }
    }

    /// The head dims of real models, and contexts past several key blocks.
    #[test]
    fn neon_prefill_head_dims_and_long_contexts() {
        for name in ["attention-prefill-f16", "attention-prefill-kv8"] {
            let kernel = library::get(name).unwrap();
            head_dims_and_long_contexts(&compile(&kernel), &kernel, &[64, 80, 96, 128, 256]);
        }
    }

    #[test]
    fn neon_prefill_far_scores() {
        for name in ["attention-prefill-f16", "attention-prefill-kv8"] {
            let kernel = library::get(name).unwrap();
            far_scores(&compile(&kernel), &kernel);
        }
    }

    #[test]
    fn neon_prefill_code_decodes_one_token() {
        prefill_harness::library_decodes_one_token(&compile);
    }

    /// A head dim off the 4-lane chunks, and a cache shorter than s, are
    /// refused by name, not read past.
    #[test]
    fn neon_prefill_refuses_bad_calls() {
        let kernel = library::get("attention-prefill-f16").unwrap();
        let att = compile(&kernel);
        let (t, s, hq, kvh) = (2usize, 3usize, 2usize, 1usize);
        let run = |d: usize, s_arg: usize| {
            let q = vec![f16::ZERO; t * hq * d];
            let kv = vec![f16::ZERO; s * kvh * d];
            let mut o = vec![f16::ZERO; t * hq * d];
            att.prefill(
                &q,
                KvCache::F16(&kv),
                KvCache::F16(&kv),
                t,
                s_arg,
                hq,
                kvh,
                d,
                &mut o,
                1,
            )
            .map(|_| ())
            .map_err(|e| e.to_string())
        };
        assert!(run(8, s).is_ok());
        assert!(run(10, s).unwrap_err().contains("head dimension"));
        assert!(run(8, s + 1).unwrap_err().contains("cache"));
    }

    /// Blocks other than the default compute the same attention.
    #[test]
    fn neon_prefill_in_other_blocks() {
        let kernel = library::get("attention-prefill-f16").unwrap();
        let be = NeonBackend::new("aarch64-neon").unwrap();
        for (i, blocks) in [
            PrefillBlocks { rows: 16, keys: 4 },
            PrefillBlocks { rows: 48, keys: 64 },
            PrefillBlocks {
                rows: 192,
                keys: 256,
            },
        ]
        .into_iter()
        .enumerate()
        {
            let code = be.emit_attention_with(&kernel, blocks).unwrap();
            assert_eq!(code.whole_prefill, Some(blocks));
            let att = HostAttention::new(&kernel, &code).unwrap();
            prefill_harness::spot_checks(&att, &kernel, 1 + i % 2, 40 + i as u64);
        }
    }
}

/// Blocks off the NEON tiles (16 score rows, 4 keys) are refused by name.
#[test]
fn neon_prefill_refuses_blocks_off_its_tiles() {
    let kernel = library::get("attention-prefill-f16").unwrap();
    let be = NeonBackend::new("aarch64-neon").unwrap();
    let e = be
        .emit_attention_with(
            &kernel,
            PrefillBlocks {
                rows: 24,
                keys: 128,
            },
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("24 rows") && e.contains("multiple of 16"), "{e}");
    let e = be
        .emit_attention_with(&kernel, PrefillBlocks { rows: 96, keys: 0 })
        .unwrap_err()
        .to_string();
    assert!(e.contains("0 keys"), "{e}");
}
