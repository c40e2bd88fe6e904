//! The causal prefill's blocks (query rows × keys per block) measured for
//! a model's heads on a host backend that emits a whole prefill (x86,
//! NEON): every candidate timed on a prompt with no earlier context, and a
//! candidate taken over the default only when it beats it by [`MARGIN`] in
//! two separate measurements, so a noisy run keeps the default and runs
//! repeat. On the Zen 3 this was built on every candidate stayed within
//! noise of the default (`docs/PERFORMANCE.md`, "Prefill blocks on x86"):
//! the choice matters where caches differ.

use std::time::Duration;

use half::f16;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tessera_codegen::artifact::{MachineCode, PrefillBlocks};
use tessera_codegen::host_attention::{HostAttention, KvCache};
use tessera_dsl::library;
use tessera_runtime::record::{PrefillEntry, PrefillMeasurement};

use crate::model_source::AttentionHeads;
use crate::stats::median_call_secs;

/// How much faster than the default a candidate must be, twice.
pub const MARGIN: f64 = 1.10;
/// The prompt length timed (no earlier context: the causal square).
pub const SEQ: usize = 512;
/// The KV format timed: the runtime's default cache.
const KV: &str = "f16";
/// The library kernel of that format.
const KERNEL: &str = "attention-prefill-f16";

/// The candidates, the default first: rows 48, 96, 192 (multiples of both
/// emitters' score tiles, 24 on x86 and 16 on NEON) × keys 64, 128, 256.
pub fn candidates() -> Vec<PrefillBlocks> {
    let mut out = vec![PrefillBlocks::DEFAULT];
    for rows in [48, 96, 192] {
        for keys in [64, 128, 256] {
            let b = PrefillBlocks { rows, keys };
            if b != PrefillBlocks::DEFAULT {
                out.push(b);
            }
        }
    }
    out
}

/// The decision from two rounds of median ms per candidate (`first[i]`,
/// and `second` for the default and round one's best, re-measured): that
/// best when it beat the default by [`MARGIN`] both times, else the
/// default. `first[0]` is the default's.
pub fn decide(
    candidates: &[PrefillBlocks],
    first: &[f64],
    second: Option<(f64, f64)>,
) -> PrefillBlocks {
    let Some(best) = best_index(first) else {
        return PrefillBlocks::DEFAULT;
    };
    if best == 0 || first[0] < MARGIN * first[best] {
        return PrefillBlocks::DEFAULT;
    }
    match second {
        Some((default_ms, best_ms)) if default_ms >= MARGIN * best_ms => candidates[best],
        _ => PrefillBlocks::DEFAULT,
    }
}

/// The index of the fastest finite time.
fn best_index(ms: &[f64]) -> Option<usize> {
    ms.iter()
        .enumerate()
        .filter(|(_, t)| t.is_finite())
        .min_by(|a, b| a.1.total_cmp(b.1))
        .map(|(i, _)| i)
}

/// A backend's whole-prefill emitter: `None` where it has none.
pub type EmitPrefill<'a> =
    &'a dyn Fn(&tessera_dsl::Kernel, PrefillBlocks) -> Option<Result<MachineCode, String>>;

/// Time every candidate `emit` builds for `heads` on `threads` threads,
/// each for about `slice`, and decide. None when the backend emits no whole
/// prefill (or the head dim is off its lanes).
pub fn tune(
    emit: EmitPrefill<'_>,
    heads: AttentionHeads,
    threads: usize,
    slice: Duration,
) -> Result<Option<PrefillEntry>, String> {
    let kernel = library::get(KERNEL).map_err(|e| e.to_string())?;
    let AttentionHeads {
        heads: hq,
        kv_heads: kvh,
        head_dim: d,
    } = heads;
    let candidates = candidates();
    let mut atts = Vec::new();
    for &b in &candidates {
        let Some(code) = emit(&kernel, b) else {
            return Ok(None);
        };
        let code = code?;
        if code.whole_prefill.is_none() || !d.is_multiple_of(code.head_dim_multiple.max(1)) {
            return Ok(None);
        }
        atts.push(HostAttention::new(&kernel, &code).map_err(|e| e.to_string())?);
    }
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let q: Vec<f16> = (0..SEQ * hq * d)
        .map(|_| f16::from_f32(rng.gen_range(-0.5..0.5)))
        .collect();
    let kv: Vec<f16> = (0..SEQ * kvh * d)
        .map(|_| f16::from_f32(rng.gen_range(-1.0..1.0)))
        .collect();
    let mut o = vec![f16::ZERO; SEQ * hq * d];
    let mut time = |att: &HostAttention| -> Result<f64, String> {
        let call = || {
            att.prefill(
                &q,
                KvCache::F16(&kv),
                KvCache::F16(&kv),
                SEQ,
                SEQ,
                hq,
                kvh,
                d,
                &mut o,
                threads,
            )
            .map(drop)
            .map_err(|e| e.to_string())
        };
        Ok(median_call_secs(call, 3, 50, slice)? * 1e3)
    };
    let first = atts
        .iter()
        .map(&mut time)
        .collect::<Result<Vec<f64>, String>>()?;
    let second = match best_index(&first) {
        Some(best) if best != 0 && first[0] >= MARGIN * first[best] => {
            Some((time(&atts[0])?, time(&atts[best])?))
        }
        _ => None,
    };
    let blocks = decide(&candidates, &first, second);
    Ok(Some(PrefillEntry {
        heads: hq,
        kv_heads: kvh,
        head_dim: d,
        seq: SEQ,
        kv: KV.to_string(),
        blocks: [blocks.rows, blocks.keys],
        default: [PrefillBlocks::DEFAULT.rows, PrefillBlocks::DEFAULT.keys],
        measurements: candidates
            .iter()
            .zip(&first)
            .map(|(b, &ms)| PrefillMeasurement {
                blocks: [b.rows, b.keys],
                ms,
            })
            .collect(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_stands_unless_a_candidate_wins_twice_by_the_margin() {
        let c = candidates();
        assert_eq!(c[0], PrefillBlocks::DEFAULT);
        assert_eq!(c.len(), 9);
        let mut first = vec![10.0; c.len()];
        // Within the margin: the default.
        first[3] = 9.5;
        assert_eq!(
            decide(&c, &first, Some((10.0, 9.5))),
            PrefillBlocks::DEFAULT
        );
        // Past it once, not on the re-measure: the default.
        first[3] = 8.0;
        assert_eq!(
            decide(&c, &first, Some((10.0, 9.6))),
            PrefillBlocks::DEFAULT
        );
        assert_eq!(decide(&c, &first, None), PrefillBlocks::DEFAULT);
        // Past it twice: the candidate.
        assert_eq!(decide(&c, &first, Some((10.0, 8.5))), c[3]);
        // The default fastest, or no finite time: the default.
        first[0] = 7.0;
        assert_eq!(decide(&c, &first, Some((7.0, 8.0))), PrefillBlocks::DEFAULT);
        assert_eq!(decide(&c, &[f64::NAN; 9], None), PrefillBlocks::DEFAULT);
    }
}
