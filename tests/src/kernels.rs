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
