//! The emitted i8dyn activation quantizer is byte-exact against
//! `quantize_row_i8dyn` packed into the kernel's x layout.

#![cfg(target_arch = "x86_64")]

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tessera_codegen::abi::{KernelFn, QuantizeArgs};
use tessera_codegen::jit::JitCode;
use tessera_codegen::x86::int8::{Int8Spec, ZeroPoint};
use tessera_codegen::x86::{missing_features, quantize};
use tessera_dsl::ir::{Activation, Format};
use tessera_dsl::quant::layouts::activation_plan;
use tessera_dsl::quant::{ElemWidth, quantize_row_i8dyn};

struct Quantized {
    codes: Vec<u8>,
    scales: Vec<f32>,
    sums: Vec<i32>,
}

/// The zero point a grouped kernel folds with (what decides how the
/// quantizer writes Σq); ungrouped kernels have none.
fn zero_of(group: Option<usize>, zero: ZeroPoint) -> ZeroPoint {
    if group.is_some() {
        zero
    } else {
        ZeroPoint::None
    }
}

fn emitted(
    ep: usize,
    group: Option<usize>,
    zero: ZeroPoint,
    x: &[f32],
    m: usize,
    k: usize,
) -> Quantized {
    let zero = zero_of(group, zero);
    let spec = Int8Spec {
        ep,
        hb: 1,
        group,
        wbits: if zero == ZeroPoint::Implied128 { 8 } else { 4 },
        zero,
        params: tessera_dsl::ir::ParamType::F32,
        y: Format::F32,
        bias: false,
        activation: Activation::None,
        dot: Default::default(),
    };
    let code = JitCode::map(&quantize::emit(&spec).unwrap()).unwrap();
    let plan = activation_plan(ElemWidth::B8, m, k, ep, 4).unwrap();
    let m_pad = m.div_ceil(ep) * ep;
    let g = group.unwrap_or(k.max(1));
    let groups = k.div_ceil(g);
    let mut q = Quantized {
        codes: vec![0; plan.packed_bytes()],
        scales: vec![0.0; m_pad],
        sums: vec![0; m_pad * groups],
    };
    let args = QuantizeArgs {
        x: x.as_ptr(),
        x_stride: k * 4,
        out: q.codes.as_mut_ptr(),
        out_scales: q.scales.as_mut_ptr(),
        out_sums: if group.is_some() {
            q.sums.as_mut_ptr()
        } else {
            std::ptr::null_mut()
        },
        m,
        k,
        group: g,
    };
    // SAFETY: buffers sized for (m, k, ep) as the quantizer's doc requires.
    unsafe {
        let f: KernelFn<QuantizeArgs> = std::mem::transmute(code.entry());
        f(&args);
    }
    q
}

/// Σq per row and group, written as −2^s·Σq for an implied zero point 2^s
/// (the value the kernels' group sums start from).
fn reference(
    ep: usize,
    group: Option<usize>,
    zero: ZeroPoint,
    x: &[f32],
    m: usize,
    k: usize,
) -> Quantized {
    let plan = activation_plan(ElemWidth::B8, m, k, ep, 4).unwrap();
    let m_pad = m.div_ceil(ep) * ep;
    let g = group.unwrap_or(k.max(1));
    let groups = k.div_ceil(g);
    let mut logical = Vec::new();
    let mut scales = vec![0.0; m_pad];
    let mut sums = vec![0; m_pad * groups];
    for r in 0..m {
        let (codes, s) = quantize_row_i8dyn(&x[r * k..(r + 1) * k]);
        scales[r] = s;
        if group.is_some() {
            for (c, &q) in codes.iter().enumerate() {
                sums[r * groups + c / g] += i32::from(q);
            }
        }
        logical.extend(codes.iter().map(|&q| q as u8));
    }
    if let Some(bits) = zero_of(group, zero).implied_shift() {
        sums.iter_mut().for_each(|s| *s = -(*s << bits));
    }
    Quantized {
        codes: plan.pack(&logical).unwrap(),
        scales,
        sums,
    }
}

#[test]
fn quantizer_matches_the_reference_byte_for_byte() {
    if !missing_features().is_empty() {
        eprintln!("SKIP: no AVX2/FMA/F16C");
        return;
    }
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    for ep in [1, 2, 3, 5] {
        for group in [None, Some(8), Some(32)] {
            for zero in [
                ZeroPoint::Offset,
                ZeroPoint::Implied8,
                ZeroPoint::Implied128,
            ] {
                if group.is_none() && zero != ZeroPoint::Offset {
                    continue;
                }
                for m in [1, 2, 3, 6, 11] {
                    for k in [0, 1, 3, 4, 5, 7, 8, 9, 31, 32, 33, 100, 257] {
                        let mut x: Vec<f32> =
                            (0..m * k).map(|_| rng.gen_range(-3.0..3.0)).collect();
                        if m > 1 && k > 0 {
                            // an all-zero row: scale 0, codes 0
                            x[k..2 * k].iter_mut().for_each(|v| *v = 0.0);
                        }
                        let a = emitted(ep, group, zero, &x, m, k);
                        let b = reference(ep, group, zero, &x, m, k);
                        let what = format!("ep={ep} group={group:?} zero={zero:?} m={m} k={k}");
                        assert_eq!(a.scales, b.scales, "scales {what}");
                        assert_eq!(a.codes, b.codes, "codes {what}");
                        assert_eq!(a.sums, b.sums, "sums {what}");
                    }
                }
            }
        }
    }
}
