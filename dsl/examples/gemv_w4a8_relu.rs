//! A custom kernel a user might add: a W4A8 GEMV (one token) with a bias and
//! a ReLU in the epilogue, written with `kernel!` and run through the
//! reference interpreter.
//!
//! The weights are quantized to uint4 in groups of 32 along `l` with
//! `tessera_dsl::quant::quantize`; the interpreter quantizes the activations
//! to int8 per row on the fly, as the kernel does. The result is checked
//! against plain f32 math over the dequantized weights: the only difference
//! left is the activations' int8 rounding, at most half a step `sx/2` per
//! element, so `|error[h]| <= sx/2 · Σ_l |w[h, l]|` (ReLU never widens it).
//! The sizes are not multiples of the tiles or of the group (`l = 100`), so
//! the partial last group is exercised too.
//!
//! Run with `cargo run -p tessera-dsl --example gemv_w4a8_relu`.

use std::error::Error;
use tessera_dsl::interp::{self, Bindings, Value};
use tessera_dsl::quant::quantize;
use tessera_dsl::{Format, Group, ParamType, kernel};

const H: usize = 37;
const L: usize = 100;

fn main() -> Result<(), Box<dyn Error>> {
    // y[0, h] = relu(Σ_l x[0, l] · w[h, l] + b[h]), with x quantized per row
    // to int8 on the fly and w stored as uint4 codes in groups of 32 along l.
    let gemv = kernel! {
        gemv-w4a8-relu(e = 1, h, l) {
            tile h by hp, l by lp;                    // the solver picks hp and lp
            x: input  i8dyn      [e, l];
            w: weight u4asym:g32 [h, l] layout [h/hp, l/lp, hp, lp] pair_transpose;
            b: input  f32        [h];
            y: output f32        [e, h];
            y[e, h] = sum(l) x[e, l] * w[h, l];
            epilogue scale, zero_point, bias(b), relu;
            parallel h;
        }
    }?;
    println!("{gemv}");

    let mut random = SplitMix(0x7e55_e7a0);
    let x: Vec<f32> = (0..L).map(|_| random.uniform(-2.0, 2.0)).collect();
    let w: Vec<f32> = (0..H * L).map(|_| random.uniform(-0.5, 0.5)).collect();
    let b: Vec<f32> = (0..H).map(|_| random.uniform(-1.0, 1.0)).collect();
    let w_quant = quantize(Format::U4Asym(Group::Size(32), ParamType::F32), H, L, &w)?;
    let w_dequant = w_quant.dequantize();

    let bindings = Bindings::new()
        .extent("h", H)
        .extent("l", L)
        .tensor("x", Value::F32(x.clone()))
        .tensor("w", Value::Quant(w_quant))
        .tensor("b", Value::F32(b.clone()));
    let outputs = interp::run(&gemv, &bindings)?;
    let y = outputs.get("y").ok_or("the interpreter returned no `y`")?;

    // The activations' int8 step: the kernel's scale is absmax / 127.
    let absmax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let half_step = absmax / 127.0 / 2.0;
    let mut max_error = 0.0f32;
    let mut worst_margin = f32::INFINITY;
    for h in 0..H {
        let row = &w_dequant[h * L..(h + 1) * L];
        let dot: f32 = x.iter().zip(row).map(|(x, w)| x * w).sum();
        let expected = (dot + b[h]).max(0.0);
        let error = (y[h] - expected).abs();
        let bound = half_step * row.iter().map(|w| w.abs()).sum::<f32>() + 1e-5;
        max_error = max_error.max(error);
        worst_margin = worst_margin.min(bound - error);
        if error > bound {
            return Err(format!(
                "y[{h}] = {} but f32 math gives {expected}: error {error} exceeds the int8 bound {bound}",
                y[h]
            )
            .into());
        }
    }
    let active = y.iter().filter(|&&v| v > 0.0).count();
    println!("y[0, ..8] = {:?}", &y[..8]);
    println!(
        "{H} outputs ({active} past the ReLU): max |interpreter - f32 math| = {max_error:.3e}, \
         within the int8 activation bound (smallest margin {worst_margin:.3e})"
    );
    Ok(())
}

/// A tiny deterministic generator (splitmix64), so the example prints the
/// same numbers on every run without extra dependencies.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[lo, hi)`.
    fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        let unit = (self.next() >> 40) as f32 / (1u64 << 24) as f32;
        lo + (hi - lo) * unit
    }
}
