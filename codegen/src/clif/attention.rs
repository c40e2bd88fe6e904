//! Decode attention in cranelift IR (placeholder until the emitter lands).

use cranelift_codegen::ir::Function;
use tessera_dsl::ir::Kernel;

use crate::artifact::EmitError;

pub fn build(kernel: &Kernel) -> Result<Function, EmitError> {
    Err(EmitError::Unsupported {
        backend: "host",
        what: format!("kernel `{}`", kernel.name),
    })
}
