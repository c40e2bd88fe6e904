//! Library kernels with another epilogue: plain data edits of the IR, so
//! the reference interpreter reads the same kernel the emitter gets.

use tessera_dsl::ir::{Activation, Kernel, Op};

/// Set `kernel`'s activation and drop its bias (and the bias tensor)
/// unless `bias`.
pub fn set_epilogue(kernel: &mut Kernel, bias: bool, act: Activation) {
    if let Op::Matmul(mm) = &mut kernel.op {
        mm.epilogue.activation = act;
        if !bias {
            mm.epilogue.bias = None;
        }
    }
    if !bias {
        kernel.tensors.retain(|t| t.name != "bias");
    }
}

/// Every library matmul the x86-avx2 backend runs: f32 and f16, per-row
/// W8A8, and the grouped int8 formats (W4A8 and ggml's Q4_0, Q4_1, Q8_0).
pub const X86_MATMULS: [&str; 7] = [
    "matmul-f32",
    "matmul-f16",
    "matmul-w8a8",
    "matmul-w4a8",
    "matmul-q4_0",
    "matmul-q4_1",
    "matmul-q8_0",
];
