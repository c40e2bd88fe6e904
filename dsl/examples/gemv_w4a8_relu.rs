//! A custom kernel a user might add: a W4A8 GEMV (one token) with a bias and
//! a ReLU in the epilogue, written with `kernel!`.
//!
//! What it does now: builds the kernel (the macro checks it at compile time,
//! `build()` verifies it) and prints the IR with `{:#?}`. Running it through
//! the reference interpreter on random inputs is wired in once
//! `tessera_dsl::interp` lands.
//!
//! Run with `cargo run -p tessera-dsl --example gemv_w4a8_relu`.

use tessera_dsl::{VerifyError, kernel};

fn main() -> Result<(), VerifyError> {
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
    println!("{gemv:#?}");
    Ok(())
}
