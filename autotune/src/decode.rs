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

use std::time::Duration;

use half::f16;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tessera_codegen::artifact::MachineCode;
use tessera_codegen::host_attention::{HostAttention, KvCache};
use tessera_dsl::library;
use tessera_dsl::quant::quantize;
use tessera_runtime::record::{DecodeEntry, DecodeMeasurement};

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

/// A backend's decode attention with fp8 values in the packed form (`true`) or
/// f32 FMAs: `None` where it has no such choice.
pub type EmitDecode<'a> =
    &'a dyn Fn(&tessera_dsl::Kernel, bool) -> Option<Result<MachineCode, String>>;

/// Time both forms `emit` builds for `heads` at [`CTX`] on `threads`
/// threads, each for about `slice`, and decide; `packed` names the packed
/// form for the record. None where the backend has one form only.
pub fn tune(
    emit: EmitDecode<'_>,
    packed: &str,
    heads: AttentionHeads,
    threads: usize,
    slice: Duration,
) -> Result<Option<DecodeEntry>, String> {
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
    let mut atts = Vec::new();
    for packed in [true, false] {
        let Some(code) = emit(&kernel, packed) else {
            return Ok(None);
        };
        let code = code?;
        if !d.is_multiple_of(code.head_dim_multiple.max(1)) {
            return Ok(None);
        }
        atts.push(HostAttention::new(&kernel, &code).map_err(|e| e.to_string())?);
    }
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
    let first = [time(&atts[0])?, time(&atts[1])?];
    let second = if decide(first, Some(first)) {
        None
    } else {
        Some([time(&atts[0])?, time(&atts[1])?])
    };
    Ok(Some(DecodeEntry {
        heads: hq,
        kv_heads: kvh,
        head_dim: d,
        ctx: CTX,
        kv: KV.to_string(),
        fp8_values_packed: decide(first, second),
        packed: packed.to_string(),
        measurements: [true, false]
            .into_iter()
            .zip(first)
            .map(|(fp8_values_packed, us)| DecodeMeasurement {
                fp8_values_packed,
                us,
            })
            .collect(),
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

    /// Every host backend: both forms timed where the backend has two
    /// (x86 with AVX512_BF16), none elsewhere.
    #[test]
    fn both_forms_are_timed_where_the_backend_has_two() {
        let heads = AttentionHeads {
            heads: 4,
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
            let two = kind == BackendKind::X86
                && tessera_codegen::x86::X86Backend::detect()
                    .is_ok_and(|x| x.packed_fp8_form().is_some());
            let packed = b.packed_fp8_form().unwrap_or("packed");
            let entry = tune(&|k, by| b.decode_attention(k, by), packed, heads, 2, slice).unwrap();
            let Some(entry) = entry else {
                assert!(!two, "{kind:?}: no entry");
                continue;
            };
            assert!(two, "{kind:?}: an entry without two forms");
            assert_eq!(
                (entry.heads, entry.kv_heads, entry.head_dim, entry.ctx),
                (4, 2, 16, CTX)
            );
            let forms: Vec<bool> = entry
                .measurements
                .iter()
                .map(|m| m.fp8_values_packed)
                .collect();
            assert_eq!(forms, [true, false]);
            assert!(
                entry
                    .measurements
                    .iter()
                    .all(|m| m.us.is_finite() && m.us > 0.0)
            );
        }
    }
}
