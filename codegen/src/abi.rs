//! The calling convention of every emitted host kernel (x86-64, aarch64,
//! cranelift).
//!
//! A kernel is a function of one pointer, `extern "C" fn(*const Args)`: the
//! first integer argument register (rdi on x86-64 System V, x0 on aarch64)
//! points to a `#[repr(C)]` argument block. One pointer keeps every backend's
//! prologue identical and lets the block grow without changing registers.
//! Field offsets are part of the ABI: emitters read them through the
//! `*_OFFSET` constants below (checked against `std::mem::offset_of!`).
//!
//! Threads split the output channels. Pointers always point at the start
//! of the whole tensors; a call computes channels `n0 .. n0 + n` of
//! `n_total`, where `n0` is a multiple of the tile's hp. The kernel derives
//! its panel offsets itself, so one convention serves every weight layout
//! (CPU panels `[h/hp, ...]` and GPU `[l/lp, h, lp]` alike).

use std::mem::offset_of;

/// Arguments of a matmul kernel: y[m, n] = x[m, k] · w[n, k]ᵀ (+ epilogue).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MatmulArgs {
    /// Activations. Float kernels: rows of `k` elements of the kernel's x
    /// format, `x_stride` bytes apart. Integer kernels: the activation
    /// quantizer's output (its layout is the kernel's x layout).
    pub x: *const u8,
    /// Bytes between consecutive rows of `x` (float kernels).
    pub x_stride: usize,
    /// Integer kernels: one f32 scale per row of x (from the quantizer).
    pub x_scales: *const f32,
    /// Integer kernels with asymmetric (or `u4sym`) weights: Σ qx per row
    /// and weight group, `[m, groups]` i32, for the zero-point correction.
    pub x_sums: *const i32,
    /// Packed weights (the whole tensor).
    pub w: *const u8,
    /// Packed per-group weight parameters, f32 or f16 as the weight
    /// format stores them (see `tessera_codegen::host` for their order).
    pub w_params: *const u8,
    /// Bias per output channel (f32, `n_total` of them), or null.
    pub bias: *const f32,
    /// Output rows, `y_stride` bytes apart, in the kernel's output format.
    pub y: *mut u8,
    pub y_stride: usize,
    pub m: usize,
    /// Channels this call computes.
    pub n: usize,
    pub k: usize,
    /// First channel this call computes (a multiple of hp).
    pub n0: usize,
    /// Channels in the whole weight tensor.
    pub n_total: usize,
}

/// Arguments of an activation quantizer (the `i8dyn` format's emitted pass).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct QuantizeArgs {
    /// f32 rows of `k` elements, `x_stride` bytes apart.
    pub x: *const f32,
    pub x_stride: usize,
    /// Quantized (and packed) activations.
    pub out: *mut u8,
    /// One f32 scale per row.
    pub out_scales: *mut f32,
    /// Σ q per row and group (`[m, groups]` i32), or null when the weights
    /// are symmetric.
    pub out_sums: *mut i32,
    pub m: usize,
    pub k: usize,
    /// Group length along k for `out_sums`.
    pub group: usize,
}

macro_rules! offsets {
    ($ty:ident { $($field:ident => $name:ident),* $(,)? }) => {
        $(
            #[doc = concat!("Byte offset of `", stringify!($ty), "::", stringify!($field), "`.")]
            pub const $name: i32 = offset_of!($ty, $field) as i32;
        )*
    };
}

offsets!(MatmulArgs {
    x => MM_X,
    x_stride => MM_X_STRIDE,
    x_scales => MM_X_SCALES,
    x_sums => MM_X_SUMS,
    w => MM_W,
    w_params => MM_W_PARAMS,
    bias => MM_BIAS,
    y => MM_Y,
    y_stride => MM_Y_STRIDE,
    m => MM_M,
    n => MM_N,
    k => MM_K,
    n0 => MM_N0,
    n_total => MM_N_TOTAL,
});

offsets!(QuantizeArgs {
    x => Q_X,
    x_stride => Q_X_STRIDE,
    out => Q_OUT,
    out_scales => Q_OUT_SCALES,
    out_sums => Q_OUT_SUMS,
    m => Q_M,
    k => Q_K,
    group => Q_GROUP,
});

/// The entry-point type of every emitted kernel.
pub type KernelFn<A> = unsafe extern "C" fn(*const A);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_are_the_c_layout_on_64_bit_hosts() {
        if std::mem::size_of::<usize>() == 8 {
            assert_eq!(
                [MM_X, MM_X_STRIDE, MM_X_SCALES, MM_X_SUMS, MM_W, MM_W_PARAMS],
                [0, 8, 16, 24, 32, 40]
            );
            assert_eq!(
                [MM_BIAS, MM_Y, MM_Y_STRIDE, MM_M, MM_N, MM_K],
                [48, 56, 64, 72, 80, 88]
            );
            assert_eq!([Q_X, Q_OUT, Q_M, Q_GROUP], [0, 16, 40, 56]);
        }
    }
}
