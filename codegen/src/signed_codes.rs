//! `u4sym` weights stored as signed codes (q − 8, the layout's
//! `signed-codes`): the explicit `Kernel -> Kernel` pass that asks the
//! packer for them. Only the NEON loops read them (no zero-point term, no
//! per-load fix-up); this module is outside the emitters so a runtime
//! built without them (prebuilt aarch64 sets) packs what that code reads.

use tessera_dsl::Kernel;
use tessera_dsl::ir::{Format, Group};

use crate::artifact::EmitError;

/// The same matmul with its `u4sym` weights stored as signed codes
/// (q − 8, the layout's `signed-codes`): the form the NEON loops read
/// without a zero-point term or an `eor` per load (see `neon::int8`). Kernels
/// with other weights, whole-row groups or weights outside the CPU panel
/// layout come back unchanged. The layout is a contract with the packer,
/// so this is explicit, never applied silently; x86, cranelift and the
/// GPU backends refuse its result.
pub fn with_signed_codes(kernel: &Kernel) -> Result<Kernel, EmitError> {
    let unsupported = |what: String| EmitError::Unsupported {
        backend: "aarch64",
        what,
    };
    let Some(mm) = kernel.as_matmul() else {
        return Ok(kernel.clone());
    };
    let takes = kernel.is_blocked(&mm.w, &mm.h, &mm.l)
        && kernel.tensor(&mm.w).is_some_and(|t| {
            matches!(t.format, Format::U4Sym(Group::Size(_), _)) && t.layout.int4_pair_transpose
        });
    if !takes {
        return Ok(kernel.clone());
    }
    let mut out = kernel.clone();
    for t in &mut out.tensors {
        if t.name == mm.w {
            t.layout.int4_signed_codes = true;
        }
    }
    tessera_dsl::verify(&out).map_err(|e| unsupported(format!("signed codes: {e}")))?;
    Ok(out)
}
