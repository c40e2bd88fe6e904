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

/// One random case: (want, got) for `[e, h, l]`.
fn case(
    k: &Kernel,
    sm: Sm,
    v: Variant,
    [e, h, l]: [usize; 3],
    rng: &mut ChaCha8Rng,
) -> (Vec<f32>, Vec<f32>) {
    let x: Vec<f16> = (0..e * l)
        .map(|_| f16::from_f32(rng.gen_range(-1.0..1.0)))
        .collect();
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
        (Value::Quant(q), p.codes, p.scales, p.offsets)
    };
    let b = Bindings::new()
        .extent("e", e)
        .extent("h", h)
        .extent("l", l)
        .tensor("x", Value::F16(x.clone()))
        .tensor("w", w)
        .tensor("bias", Value::F32(bias.clone()));
    let want = run(k, &b).unwrap().get("y").unwrap().to_vec();

    // The first solver tile the backend takes (as kernels-gen picks).
    let prog = tiles(sm, k, rows(v))
        .iter()
        .find_map(|t| PtxBackend::new(sm).program(k, t, v).ok())
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

fn check(v: Variant, shapes: &[[usize; 3]], seed: u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    // GEMV accumulates in f32; the tensor-core kernels multiply halves
    // (weights dequantized to f16, ~2^-11 each).
    let rel = match v {
        Variant::Gemv => 1e-5,
        _ => 2.0f32.powi(-10),
    };
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

#[test]
fn simulated_gemm_matches_the_interpreter() {
    check(Variant::Gemm, &[[20, 40, 72], [3, 17, 36]], 43);
}
