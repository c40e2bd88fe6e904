//! The decode attention's P·V form for fp8 values, measured for a model's
//! heads where a backend has two: the CPU's packed form (on x86 f16 FMAs,
//! `vfmadd231ph`, with AVX512-FP16, else bf16 dot products, `vdpbf16ps`,
//! with AVX512_BF16) or f32 FMAs. The feature bit does not say which is
//! faster: `vdpbf16ps` issues at about 2 per cycle on Zen 4 and about 0.5
//! on Sapphire Rapids, where the FMA form took Qwen2-1.5B's kv8 decode
//! from 473 to 317–340 µs, and the f16 form to 258–263
//! (`docs/PERFORMANCE.md`). The FMA form is taken only when it beats the
//! packed form by [`MARGIN`] in two separate measurements, so a noisy run
//! keeps the default.
//!
//! Where the backend also has two forms of int8 key scores (x86 with
//! AVX512-VNNI and no AMX: a key in each lane, the default, or two keys
//! along d), they are timed next with the fp8 form chosen, and the pair
//! loop taken only when it beats keys in lanes by the same margin twice:
//! on an AMD Zen 5 keys in lanes took Qwen2-1.5B's kv8 decode about 8%
//! faster; other cores may order them otherwise.
//!
//! Where keys stay in lanes, q rounded to int8 in 32-d blocks for them (as
//! ggml rounds q to Q8_0 against a q8_0 K cache) is timed last against
//! the i16 form and taken by the same rule: it halves the lanes loop's
//! dots and q broadcasts but moves the scores (by at most 1/254 of each
//! block's largest |q|), so only a clear, repeated win takes it.

use std::time::Duration;

use half::f16;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tessera_codegen::artifact::MachineCode;
use tessera_codegen::host_attention::{HostAttention, KvCache};
use tessera_dsl::library;
use tessera_dsl::quant::quantize;
use tessera_runtime::record::{DecodeEntry, DecodeMeasurement, KeyMeasurement, QMeasurement};

use crate::decide::beats_twice;
use crate::model_source::AttentionHeads;
use crate::stats::median_call_secs;

/// How much faster than the packed form the FMA form must be, twice.
pub const MARGIN: f64 = 1.05;
/// The context length timed.
pub const CTX: usize = 4096;
/// The KV format timed: the one with fp8 values.
const KV: &str = "kv8";
/// The library kernel of that format.
const KERNEL: &str = "attention-decode-kv8";

/// Whether fp8 values stay on the packed form, from two rounds of median
/// µs `[packed, f32 FMAs]` (`second` only when round one favoured FMAs):
/// FMAs only when they beat the packed form by [`MARGIN`] both times.
pub fn decide(first: [f64; 2], second: Option<[f64; 2]>) -> bool {
    !beats_twice(MARGIN, first, second)
}

/// A backend's decode attention with fp8 values in the packed form (the
/// first `true`) or f32 FMAs, int8 keys in lanes (the second `true`) or
/// in pairs, and q as int8 blocks for the keys in lanes (the third
/// `true`) or i16: `None` where it has no such choices.
pub type EmitDecode<'a> =
    &'a dyn Fn(&tessera_dsl::Kernel, bool, bool, bool) -> Option<Result<MachineCode, String>>;

/// The decode forms a backend has: the name of its packed fp8 form (None:
/// f32 FMAs only), and whether it has int8 keys in lanes beside pairs.
#[derive(Clone, Copy, Debug)]
pub struct DecodeForms<'a> {
    pub packed: Option<&'a str>,
    pub key_lanes: bool,
}

/// Whether int8 keys stay in lanes, from two rounds of median µs `[in
/// lanes, in pairs]`: pairs only when they beat lanes by [`MARGIN`] both
/// times.
pub fn decide_keys(first: [f64; 2], second: Option<[f64; 2]>) -> bool {
    !beats_twice(MARGIN, first, second)
}

/// Time the forms `emit` builds for `heads` at [`CTX`] on `threads`
/// threads, each for about `slice`, and decide: the fp8 values' form
/// (keys in lanes where there are), then the int8 keys' form with the fp8
/// form chosen. None where the backend has one form of each.
pub fn tune(
    emit: EmitDecode<'_>,
    forms: DecodeForms<'_>,
    heads: AttentionHeads,
    threads: usize,
    slice: Duration,
) -> Result<Option<DecodeEntry>, String> {
    if forms.packed.is_none() && !forms.key_lanes {
        return Ok(None);
    }
    let kernel = library::get(KERNEL).map_err(|e| e.to_string())?;
    let at = kernel
        .as_attention()
        .ok_or_else(|| format!("{KERNEL} is not an attention kernel"))?;
    let format_of = |name: &str| {
        kernel
            .tensor(name)
            .map(|t| t.format)
            .ok_or_else(|| format!("{KERNEL} has no tensor `{name}`"))
    };
    let (k_format, v_format) = (format_of(&at.k)?, format_of(&at.v)?);
    let AttentionHeads {
        heads: hq,
        kv_heads: kvh,
        head_dim: d,
    } = heads;
    let build =
        |packed: bool, lanes: bool, int8_q: bool| -> Result<Option<HostAttention>, String> {
            let Some(code) = emit(&kernel, packed, lanes, int8_q) else {
                return Ok(None);
            };
            let code = code?;
            if !d.is_multiple_of(code.head_dim_multiple.max(1)) {
                return Ok(None);
            }
            HostAttention::new(&kernel, &code)
                .map(Some)
                .map_err(|e| e.to_string())
        };
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let q: Vec<f16> = (0..hq * d)
        .map(|_| f16::from_f32(rng.gen_range(-0.5..0.5)))
        .collect();
    let mut cache = |format| {
        let data: Vec<f32> = (0..CTX * kvh * d)
            .map(|_| rng.gen_range(-1.0..1.0))
            .collect();
        quantize(format, CTX * kvh, d, &data).map_err(|e| e.to_string())
    };
    let (k, v) = (cache(k_format)?, cache(v_format)?);
    let mut o = vec![f16::ZERO; hq * d];
    let mut time = |att: &HostAttention| -> Result<f64, String> {
        let call = || {
            att.run(
                &q,
                KvCache::Quant(&k),
                KvCache::Quant(&v),
                CTX,
                hq,
                kvh,
                d,
                &mut o,
                threads,
            )
            .map(drop)
            .map_err(|e| e.to_string())
        };
        Ok(median_call_secs(call, 5, 200, slice)? * 1e6)
    };
    // Two forms timed against each other, the default first: the first
    // round's µs and whether the default stays.
    let mut duel = |a: &HostAttention,
                    b: &HostAttention,
                    keep: fn([f64; 2], Option<[f64; 2]>) -> bool|
     -> Result<([f64; 2], bool), String> {
        let first = [time(a)?, time(b)?];
        let second = if keep(first, Some(first)) {
            None
        } else {
            Some([time(a)?, time(b)?])
        };
        Ok((first, keep(first, second)))
    };
    let lanes = forms.key_lanes;
    let (mut fp8_values_packed, mut measurements) = (false, Vec::new());
    if forms.packed.is_some() {
        let (Some(packed), Some(fma)) = (build(true, lanes, false)?, build(false, lanes, false)?)
        else {
            return Ok(None);
        };
        let (first, keep) = duel(&packed, &fma, decide)?;
        fp8_values_packed = keep;
        measurements = [true, false]
            .into_iter()
            .zip(first)
            .map(|(fp8_values_packed, us)| DecodeMeasurement {
                fp8_values_packed,
                us,
            })
            .collect();
    }
    let (mut int8_keys_in_lanes, mut key_measurements) = (None, Vec::new());
    if lanes {
        let (Some(in_lanes), Some(in_pairs)) = (
            build(fp8_values_packed, true, false)?,
            build(fp8_values_packed, false, false)?,
        ) else {
            return Ok(None);
        };
        let (first, keep) = duel(&in_lanes, &in_pairs, decide_keys)?;
        int8_keys_in_lanes = Some(keep);
        key_measurements = [true, false]
            .into_iter()
            .zip(first)
            .map(|(in_lanes, us)| KeyMeasurement { in_lanes, us })
            .collect();
    }
    let (mut int8_q_in_lanes, mut q_measurements) = (None, Vec::new());
    if int8_keys_in_lanes == Some(true) {
        let (Some(i16_q), Some(int8_q)) = (
            build(fp8_values_packed, true, false)?,
            build(fp8_values_packed, true, true)?,
        ) else {
            return Ok(None);
        };
        // The same rule as the key forms': the default (i16) stays unless
        // int8 q beats it by the margin twice.
        let (first, keep) = duel(&i16_q, &int8_q, decide_keys)?;
        int8_q_in_lanes = Some(!keep);
        q_measurements = [false, true]
            .into_iter()
            .zip(first)
            .map(|(int8_q, us)| QMeasurement { int8_q, us })
            .collect();
    }
    Ok(Some(DecodeEntry {
        heads: hq,
        kv_heads: kvh,
        head_dim: d,
        ctx: CTX,
        kv: KV.to_string(),
        fp8_values_packed,
        packed: forms.packed.unwrap_or("packed").to_string(),
        measurements,
        int8_keys_in_lanes,
        key_measurements,
        int8_q_in_lanes,
        q_measurements,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{self, BackendKind};

    #[test]
    fn fma_only_when_it_wins_by_the_margin_twice() {
        let (fast, slow) = (100.0, 100.0 * MARGIN * 1.01);
        assert!(!decide([slow, fast], Some([slow, fast])));
        // Once is not enough; a second round lost or missing keeps packed.
        assert!(decide([slow, fast], Some([fast, fast])));
        assert!(decide([slow, fast], None));
        // Within the margin, or packed faster, keeps packed.
        assert!(decide([fast * 1.02, fast], Some([fast * 1.02, fast])));
        assert!(decide([fast, slow], Some([fast, slow])));
        // A failed timing never switches.
        assert!(decide([f64::NAN, fast], Some([f64::NAN, fast])));
        assert!(decide([slow, f64::NAN], Some([slow, f64::NAN])));
    }

    #[test]
    fn pairs_only_when_they_win_by_the_margin_twice() {
        let (fast, slow) = (100.0, 100.0 * MARGIN * 1.01);
        assert!(!decide_keys([slow, fast], Some([slow, fast])));
        assert!(decide_keys([slow, fast], Some([fast, fast])));
        assert!(decide_keys([slow, fast], None));
        assert!(decide_keys([fast * 1.02, fast], Some([fast * 1.02, fast])));
        assert!(decide_keys([fast, slow], Some([fast, slow])));
    }

    /// Every host backend: each pair of forms timed where the backend has
    /// two (x86 with AVX512_BF16 or AVX512-FP16 for fp8 values, with
    /// AVX512-VNNI and no AMX for int8 keys), none elsewhere.
    #[test]
    fn both_forms_are_timed_where_the_backend_has_two() {
        let heads = AttentionHeads {
            heads: 12,
            kv_heads: 2,
            head_dim: 16,
        };
        let slice = Duration::from_millis(5);
        for kind in BackendKind::available() {
            if !matches!(
                kind,
                BackendKind::Host | BackendKind::X86 | BackendKind::Neon
            ) {
                continue;
            }
            let b = backend::open(kind).unwrap();
            let x86 = (kind == BackendKind::X86)
                .then(tessera_codegen::x86::X86Backend::detect)
                .and_then(Result::ok);
            let two_fp8 = x86.is_some_and(|x| x.packed_fp8_form().is_some());
            let two_keys = x86.is_some_and(|x| x.has_int8_key_lanes());
            assert_eq!(b.has_int8_key_lanes(), two_keys, "{kind:?}");
            let forms = DecodeForms {
                packed: b.packed_fp8_form(),
                key_lanes: b.has_int8_key_lanes(),
            };
            let entry = tune(
                &|k, packed, lanes, int8_q| b.decode_attention(k, packed, lanes, int8_q),
                forms,
                heads,
                2,
                slice,
            )
            .unwrap();
            let Some(entry) = entry else {
                assert!(!two_fp8 && !two_keys, "{kind:?}: no entry");
                continue;
            };
            assert!(two_fp8 || two_keys, "{kind:?}: an entry without two forms");
            assert_eq!(
                (entry.heads, entry.kv_heads, entry.head_dim, entry.ctx),
                (12, 2, 16, CTX)
            );
            let fp8_forms: Vec<bool> = entry
                .measurements
                .iter()
                .map(|m| m.fp8_values_packed)
                .collect();
            assert_eq!(fp8_forms, if two_fp8 { vec![true, false] } else { vec![] });
            let key_forms: Vec<bool> = entry.key_measurements.iter().map(|m| m.in_lanes).collect();
            assert_eq!(key_forms, if two_keys { vec![true, false] } else { vec![] });
            assert_eq!(entry.int8_keys_in_lanes.is_some(), two_keys);
            // q's form is timed exactly where keys stayed in lanes.
            let in_lanes = entry.int8_keys_in_lanes == Some(true);
            let q_forms: Vec<bool> = entry.q_measurements.iter().map(|m| m.int8_q).collect();
            assert_eq!(q_forms, if in_lanes { vec![false, true] } else { vec![] });
            assert_eq!(entry.int8_q_in_lanes.is_some(), in_lanes);
            assert!(
                entry
                    .measurements
                    .iter()
                    .map(|m| m.us)
                    .chain(entry.key_measurements.iter().map(|m| m.us))
                    .chain(entry.q_measurements.iter().map(|m| m.us))
                    .all(|us| us.is_finite() && us > 0.0)
            );
        }
    }
}
