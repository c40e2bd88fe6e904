//! The emitted i8dyn activation quantizer is byte-exact against
//! `quantize_row_i8dyn` packed into the kernel's x layout.

#![cfg(target_arch = "x86_64")]

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tessera_codegen::abi::{KernelFn, QuantizeArgs};
use tessera_codegen::jit::JitCode;
use tessera_codegen::x86::int8::{Dot, Int8Spec, ZeroPoint};
use tessera_codegen::x86::{missing_features, quantize};
use tessera_dsl::ir::{Activation, Format};
use tessera_dsl::quant::layouts::activation_plan;
use tessera_dsl::quant::{ElemWidth, quantize_row_i8dyn};

struct Quantized {
    codes: Vec<u8>,
    scales: Vec<f32>,
    sums: Vec<i32>,
}

/// One quantizer call: rows of `ep` interleaved, Σq per group of `group`
/// (None: no sums), written for kernels that fold with `zero` and sum
/// with `dot`.
#[derive(Debug)]
struct Case {
    ep: usize,
    group: Option<usize>,
    zero: ZeroPoint,
    dot: Dot,
    m: usize,
    k: usize,
}

impl Case {
    /// The zero point the kernel folds with (what decides how the quantizer
    /// writes Σq); ungrouped kernels have none.
    fn zero(&self) -> ZeroPoint {
        if self.group.is_some() {
            self.zero
        } else {
            ZeroPoint::None
        }
    }

    /// The group length the quantizer is told (k when ungrouped).
    fn spec(&self) -> Int8Spec {
        Int8Spec {
            ep: self.ep,
            hb: 1,
            group: self.group,
            wbits: if self.zero == ZeroPoint::Implied128 {
                8
            } else {
                4
            },
            zero: self.zero(),
            params: tessera_dsl::ir::ParamType::F32,
            y: Format::F32,
            bias: false,
            activation: Activation::None,
            dot: self.dot,
        }
    }

    fn group_len(&self) -> usize {
        self.group.unwrap_or(self.k.max(1))
    }

    /// Rows padded to whole row blocks, and groups per row.
    fn sizes(&self) -> (usize, usize) {
        (
            self.m.div_ceil(self.ep) * self.ep,
            self.k.div_ceil(self.group_len()),
        )
    }
}

fn emitted(c: &Case, x: &[f32]) -> Quantized {
    let spec = c.spec();
    let code = JitCode::map(&quantize::emit(&spec).unwrap()).unwrap();
    let plan = activation_plan(ElemWidth::B8, c.m, c.k, c.ep, 4).unwrap();
    let (m_pad, groups) = c.sizes();
    let mut q = Quantized {
        codes: vec![0; plan.packed_bytes()],
        scales: vec![0.0; m_pad],
        sums: vec![0; m_pad * groups],
    };
    let args = QuantizeArgs {
        x: x.as_ptr(),
        x_stride: c.k * 4,
        out: q.codes.as_mut_ptr(),
        out_scales: q.scales.as_mut_ptr(),
        out_sums: if c.group.is_some() {
            q.sums.as_mut_ptr()
        } else {
            std::ptr::null_mut()
        },
        m: c.m,
        k: c.k,
        group: c.group_len(),
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
fn reference(c: &Case, x: &[f32]) -> Quantized {
    let (k, g) = (c.k, c.group_len());
    let plan = activation_plan(ElemWidth::B8, c.m, k, c.ep, 4).unwrap();
    let (m_pad, groups) = c.sizes();
    let mut logical = Vec::new();
    let mut scales = vec![0.0; m_pad];
    let mut sums = vec![0; m_pad * groups];
    for r in 0..c.m {
        let (codes, s) = quantize_row_i8dyn(&x[r * k..(r + 1) * k]);
        scales[r] = s;
        if c.group.is_some() {
            for (i, &q) in codes.iter().enumerate() {
                sums[r * groups + i / g] += i32::from(q);
            }
        }
        logical.extend(codes.iter().map(|&q| q as u8));
    }
    if let Some(bits) = c.zero().implied_shift() {
        sums.iter_mut().for_each(|s| *s = -(*s << bits));
    }
    if c.spec().sums_in_int16_halves() {
        // int16 group sums start from two halves: −2^s·Σq over the codes
        // at k ≡ 0, 1 (mod 4) low, over k ≡ 2, 3 high.
        let bits = c
            .zero()
            .implied_shift()
            .expect("halves fold an implied zero point");
        let mut halves = vec![[0i32; 2]; m_pad * groups];
        for r in 0..c.m {
            let codes = &logical[r * k..(r + 1) * k];
            for (i, &q) in codes.iter().enumerate() {
                halves[r * groups + i / g][(i % 4) / 2] += i32::from(q as i8);
            }
        }
        for (s, [lo, hi]) in sums.iter_mut().zip(halves) {
            let (lo, hi) = (-(lo << bits), -(hi << bits));
            let half = |v: i32| i32::from(i16::try_from(v).expect("a half fits i16") as u16);
            *s = half(lo) | (half(hi) << 16);
        }
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
            for (zero, dot) in [
                (ZeroPoint::Offset, Dot::MaddUbsw),
                (ZeroPoint::Implied8, Dot::MaddUbsw),
                (ZeroPoint::Implied8, Dot::VexVnni),
                (ZeroPoint::Implied128, Dot::VexVnni),
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
                        let case = Case {
                            ep,
                            group,
                            zero,
                            dot,
                            m,
                            k,
                        };
                        let (a, b) = (emitted(&case, &x), reference(&case, &x));
                        let what = format!("{case:?}");
                        assert_eq!(a.scales, b.scales, "scales {what}");
                        assert_eq!(a.codes, b.codes, "codes {what}");
                        assert_eq!(a.sums, b.sums, "sums {what}");
                    }
                }
            }
        }
    }
}
