//! What the C API tests share: the reference interpreter's linear layer.

use tessera_dsl::interp::{self, Bindings, Value};
use tessera_dsl::library;
use tessera_dsl::quant;
use tessera_runtime::WeightFormat;

/// The interpreter's y = x·wᵀ + bias in `format` (weights quantized as the
/// runtime quantizes them).
pub fn reference_linear(
    format: WeightFormat,
    x: &[f32],
    w: &[f32],
    bias: &[f32],
    (m, n, k): (usize, usize, usize),
) -> Vec<f32> {
    let kernel = library::get(format.library_kernel()).unwrap();
    let mm = kernel.as_matmul().unwrap();
    let w_format = kernel.tensor(&mm.w).unwrap().format;
    let x_format = kernel.tensor(&mm.x).unwrap().format;
    let wv = match Value::from_f32(w_format, w) {
        Some(v) => v,
        None => Value::Quant(quant::quantize(w_format, n, k, w).unwrap()),
    };
    let b = Bindings::new()
        .extent("e", m)
        .extent("h", n)
        .extent("l", k)
        .tensor("x", Value::from_f32(x_format, x).unwrap())
        .tensor("w", wv)
        .tensor("bias", Value::F32(bias.to_vec()));
    interp::run(&kernel, &b).unwrap().get("y").unwrap().to_vec()
}
