//! The PTX matmuls (GEMV, flat GEMM and GEMM; F16, W4A16, W8A16, E0M4A16
//! weights; sm_80 and sm_90) executed by the test simulator against the
//! reference interpreter: rows, output channels and reduction lengths with
//! tails (l not a multiple of 8 takes the unaligned activation path, l not
//! a multiple of 32 a partial weight block), the dequantization bit
//! tricks, the reductions, the `ldmatrix`/`mma` fragments, the `cp.async`
//! pipeline (copies land only at the wait that covers them) and the bias
//! epilogue.

mod ptx_common;
mod ptx_sim;

use half::f16;
use ptx_common::{matmuls, rows, tiles};
use ptx_sim::{MatmulOperands, run_matmul};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tessera_codegen::artifact::Variant;
use tessera_codegen::gpu::WEIGHT_LP;
use tessera_codegen::ptx::{PtxBackend, Sm};
use tessera_dsl::interp::{Bindings, Value, run};
use tessera_dsl::quant::{
    ElemWidth, PackPlan, Tile, WeightPacking, gpu_weight_layout, pack_weights, quantize,
};
use tessera_dsl::{Format, Kernel};

thread_local! {
    /// The tile's e extent for the cases of this thread (None: the
    /// solver's), as the runtime's flat steps size it to the real M.
    static TILE_EP: std::cell::Cell<Option<u32>> = const { std::cell::Cell::new(None) };
}

/// One random case: (want, got) for `[e, h, l]`.
fn case(
    k: &Kernel,
    sm: Sm,
    v: Variant,
    shape: [usize; 3],
    rng: &mut ChaCha8Rng,
) -> (Vec<f32>, Vec<f32>) {
    case_with(k, sm, v, shape, rng, |_| {})
}

/// [`case`] with the activations edited by `edit` first.
fn case_with(
    k: &Kernel,
    sm: Sm,
    v: Variant,
    [e, h, l]: [usize; 3],
    rng: &mut ChaCha8Rng,
    edit: impl Fn(&mut [f16]),
) -> (Vec<f32>, Vec<f32>) {
    let mut x: Vec<f16> = (0..e * l)
        .map(|_| f16::from_f32(rng.gen_range(-1.0..1.0)))
        .collect();
    edit(&mut x);
    let raw: Vec<f32> = (0..h * l).map(|_| rng.gen_range(-0.5..0.7)).collect();
    let bias: Vec<f32> = (0..h).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let format = k.tensor("w").unwrap().format;
    let (w, codes, scales, offsets) = if format == Format::F16 {
        let w: Vec<f16> = raw.iter().map(|&v| f16::from_f32(v)).collect();
        let plan = PackPlan::new(
            &gpu_weight_layout(),
            &[("h", h), ("l", l)],
            &[Tile::new("lp", "l", WEIGHT_LP as usize)],
            ElemWidth::B16,
        )
        .unwrap();
        let bytes: Vec<u8> = w.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect();
        (Value::F16(w), plan.pack(&bytes).unwrap(), vec![], vec![])
    } else {
        let q = quantize(format, h, l, &raw).unwrap();
        let p = pack_weights(
            &q,
            WeightPacking::Gpu {
                lp: WEIGHT_LP as usize,
            },
        )
        .unwrap();
        (
            Value::Quant(q),
            p.codes,
            tessera_dsl::quant::param_bytes(format, &p.scales),
            tessera_dsl::quant::param_bytes(format, &p.offsets),
        )
    };
    let b = Bindings::new()
        .extent("e", e)
        .extent("h", h)
        .extent("l", l)
        .tensor("x", Value::F16(x.clone()))
        .tensor("w", w)
        .tensor("bias", Value::F32(bias.clone()));
    let want = run(k, &b).unwrap().get("y").unwrap().to_vec();

    // The first solver tile the backend takes (as kernels-gen picks), its
    // e extent replaced where a test asks (the runtime's flat steps).
    let prog = tiles(sm, k, rows(v))
        .into_iter()
        .map(|mut t| {
            if let Some(ep) = TILE_EP.get() {
                t.ep = ep;
            }
            t
        })
        .find_map(|t| PtxBackend::new(sm).program(k, &t, v).ok())
        .unwrap();
    let ops = MatmulOperands {
        x_f16: x.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect(),
        codes,
        scales,
        offsets,
        bias,
    };
    let got = run_matmul(&prog, ops, [e, h, l]);
    (want, got)
}

/// The error per term of the reduction: the GEMV and the flat GEMM (the
/// GEMV with several rows of e) accumulate in f32; the tensor-core GEMM
/// multiplies halves (weights dequantized to f16, ~2^-11 each).
fn tolerance(v: Variant) -> f32 {
    match v {
        Variant::Gemv | Variant::FlatGemm => 1e-5,
        _ => 2.0f32.powi(-10),
    }
}

fn check(v: Variant, shapes: &[[usize; 3]], seed: u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let rel = tolerance(v);
    for sm in Sm::ALL {
        for k in matmuls() {
            for &shape in shapes {
                let (want, got) = case(&k, sm, v, shape, &mut rng);
                assert_eq!(got.len(), want.len());
                let l = shape[2] as f32;
                for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                    // Terms are |x·w| < 1: the error grows with l; f16
                    // outputs round.
                    let tol = rel * l + 2e-3 * w.abs();
                    assert!(
                        (g - w).abs() <= tol,
                        "{} {v} {} {shape:?} at {i}: got {g} want {w}",
                        k.name,
                        sm.arch()
                    );
                }
            }
        }
    }
}

#[test]
fn simulated_gemv_matches_the_interpreter() {
    check(
        Variant::Gemv,
        &[[1, 37, 70], [2, 64, 256], [1, 130, 264], [3, 9, 33]],
        41,
    );
}

#[test]
fn simulated_flat_gemm_matches_the_interpreter() {
    check(
        Variant::FlatGemm,
        &[[5, 37, 72], [8, 70, 64], [11, 16, 40]],
        42,
    );
}

/// The flat GEMM built for 1, 2 and 3 rows (1, 2 and 4 rows of e a
/// thread, [`tessera_codegen::gpu::ptx_flat_rows`]) over M = 3 and 5: rows
/// past e recompute the last and store nothing.
#[test]
fn simulated_flat_gemm_rows_follow_the_tile() {
    for ep in [1, 2, 3] {
        TILE_EP.set(Some(ep));
        check(
            Variant::FlatGemm,
            &[[3, 20, 64], [5, 9, 40]],
            45 + u64::from(ep),
        );
    }
    TILE_EP.set(None);
}

#[test]
fn simulated_gemm_matches_the_interpreter() {
    check(Variant::Gemm, &[[20, 40, 72], [3, 17, 36]], 43);
}

/// Non-finite activations mean what the interpreter says: a NaN makes its
/// row's outputs NaN, an infinity makes them ±inf (NaN where a weight is
/// exactly 0 or infinities of both signs meet). The GEMV forms weights in
/// f32 as the interpreter does and matches it exactly; the tensor-core
/// kernels form them in f16, so a weight that cancels to 0 in one and not
/// the other turns inf·w into NaN or ±inf: there every output the
/// interpreter makes non-finite must be non-finite, and NaN rows NaN.
/// Rows: a NaN (one at the end of l too); +inf; -inf and a NaN; finite.
#[test]
fn simulated_non_finite_activations_match_the_interpreter() {
    let mut rng = ChaCha8Rng::seed_from_u64(44);
    // l = 70: rows not 16-byte aligned (every chunk loads halves one by
    // one); l = 72: whole aligned chunks (the flat GEMM's word-major path).
    let h = 37;
    for (v, e, l) in [
        (Variant::Gemv, 4, 70),
        (Variant::FlatGemm, 4, 70),
        (Variant::FlatGemm, 4, 72),
        (Variant::Gemm, 4, 70),
    ] {
        for sm in Sm::ALL {
            for k in matmuls() {
                let (want, got) = case_with(&k, sm, v, [e, h, l], &mut rng, |x| {
                    x[5] = f16::NAN;
                    x[l - 1] = f16::NAN;
                    x[l + 7] = f16::INFINITY;
                    x[2 * l] = f16::NEG_INFINITY;
                    x[2 * l + 3] = f16::NAN;
                });
                for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                    let nan_row = matches!(i / h, 0 | 2);
                    let f32_weights = v != Variant::Gemm;
                    let same = if f32_weights && w.is_nan() || nan_row {
                        g.is_nan()
                    } else if f32_weights && w.is_infinite() {
                        g == w
                    } else if !w.is_finite() {
                        !g.is_finite()
                    } else {
                        g.is_finite() && (g - w).abs() <= tolerance(v) * l as f32 + 2e-3 * w.abs()
                    };
                    assert!(
                        same,
                        "{} {v} {}: y[{}, {}] = {g}, interpreter {w}",
                        k.name,
                        sm.arch(),
                        i / h,
                        i % h
                    );
                }
            }
        }
    }
}
