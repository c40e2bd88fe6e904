//! The built-in kernel library: named, ready-made kernels written with
//! [`kernel!`](crate::kernel), so the CLI, the tests and later the runtime
//! all start from the same descriptions. The names are a contract (see
//! [`crate::naming`]), and so are the canonical texts: `tests/library/`
//! pins each kernel's text, and a test fails if one changes silently.
//!
//! # Matmul conventions
//!
//! Every matmul computes `y[e, h] = Σ_l x[e, l] · w[h, l] + bias[h]` over the
//! axes `e` (tokens, dynamic, spatial), `h` (output channels, dynamic,
//! spatial) and `l` (reduction, dynamic). The tiles `ep`, `hp`, `lp` split
//! them and are all left to the register-constraint solver. Work is split
//! across threads along `h`: weights are the streamed operand, so each thread
//! streams its own slice of them (MNN-LLM 5.2). `bias[h]` is f32 and
//! optional at call time; the output is f32 except for `matmul-f16`.
//!
//! Two families, by where they are meant to run:
//!
//! | kernel | x | w | w layout | epilogue |
//! |---|---|---|---|---|
//! | `matmul-f32` | f32, row-major | f32 | `[h/hp, l/lp, hp, lp]` | bias |
//! | `matmul-f16` | f16, row-major | f16 | `[h/hp, l/lp, hp, lp]` | bias (y is f16) |
//! | `matmul-w4a8` | i8dyn, `[e/ep, l/lp, ep, lp]` | u4asym:g32 | `[h/hp, l/lp, hp, lp]` + int4 pair transpose | scale, zero point, bias |
//! | `matmul-w8a8` | i8dyn, `[e/ep, l/lp, ep, lp]` | i8sym:row | `[h/hp, l/lp, hp, lp]` | scale, bias |
//! | `matmul-q4_0` | i8dyn, `[e/ep, l/lp, ep, lp]` | u4sym:g32:f16 (ggml Q4_0, 4.5 bits/weight) | `[h/hp, l/lp, hp, lp]` + int4 pair transpose | scale, bias |
//! | `matmul-q4_1` | i8dyn, `[e/ep, l/lp, ep, lp]` | u4asym:g32:f16 (ggml Q4_1, 5 bits/weight) | `[h/hp, l/lp, hp, lp]` + int4 pair transpose | scale, zero point, bias |
//! | `matmul-q8_0` | i8dyn, `[e/ep, l/lp, ep, lp]` | i8sym:g32:f16 (ggml Q8_0, 8.5 bits/weight) | `[h/hp, l/lp, hp, lp]` | scale, bias |
//! | `matmul-w4a16` | f16, row-major | u4asym:g32 | `[l/lp, h, lp]` | scale, zero point, bias |
//! | `matmul-q4_0a16` | f16, row-major | u4sym:g32:f16 (ggml Q4_0) | `[l/lp, h, lp]` | scale, bias |
//! | `matmul-q4_1a16` | f16, row-major | u4asym:g32:f16 (ggml Q4_1) | `[l/lp, h, lp]` | scale, zero point, bias |
//! | `matmul-q8_0a16` | f16, row-major | i8sym:g32:f16 (ggml Q8_0) | `[l/lp, h, lp]` | scale, bias |
//! | `matmul-w8a16` | f16, row-major | i8sym:row | `[l/lp, h, lp]` | scale, bias |
//! | `matmul-e0m4a16` | f16, row-major | e0m4:g32 | `[l/lp, h, lp]` | scale, zero point (the E0M4 bias), bias |
//!
//! - **CPU family** (f32, f16, W4A8, W8A8): weights packed offline in the
//!   `[h/hp, l/lp, hp, lp]` order of seed 000 IV.D, so the inner loop reads
//!   one contiguous `hp × lp` block per MAC step (sdot/smmla/fmla). Plain
//!   float kernels use the same packing as the integer ones: packing is free
//!   (offline) and the solver's tile then applies uniformly. Float
//!   activations stay row-major (packing them would cost a pass per call);
//!   `i8dyn` activations are quantized by the kernel into the
//!   `[e/ep, l/lp, ep, lp]` order the MAC instructions want.
//! - **GPU family** (the A16 kernels W4A16, W8A16, E0M4A16, and ggml's
//!   Q4_0 / Q4_1 / Q8_0 blocks as Q4_0A16 / Q4_1A16 / Q8_0A16, read with
//!   their f16 parameters, so a GGUF file runs unconverted): weights in the
//!   MNN-LLM 5.1 layout `[l/lp, h, lp]` so neighbouring work items (along
//!   `h`) issue coalesced 128-bit loads, and loads along `l` are
//!   double-buffered (FlashDecoding++ section 4). E0M4 is Transformer-Lite's
//!   mobile-GPU format (2.3), so it belongs here.
//!
//! # Attention conventions
//!
//! Axes `t` (query tokens: `Fixed(1)` for decode, dynamic for prefill),
//! `hq` (query heads), `kvh` (KV heads, dividing `hq` for GQA), `d` (head
//! dimension) and `s` (KV sequence, reduction), all dynamic except decode's
//! `t`. The head dimension stays dynamic so one library kernel serves every
//! model (64, 80, 128, 256, ...); an emitted instance fixes it and its name
//! says so (`d128` in [`crate::naming::AttentionInstance`]).
//! `q[t, hq, d]` is an f16 input already multiplied by 1/sqrt(d) (MNN-LLM
//! 5.3); the caches `k[s, kvh, d]`, `v[s, kvh, d]` are row-major with the
//! growing `s` outermost so appends are in place; `o[t, hq, d]` is f16 (the
//! softmax runs in fp32, the result is stored in the activations' dtype).
//! Work is split across threads along `kvh`: one thread serves every query
//! head of its KV group, so each K/V row is loaded once per group.

use crate::ir::*;
use crate::kernel;
use crate::verify::VerifyError;

/// Why a library kernel cannot be returned.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LibraryError {
    #[error("unknown library kernel `{name}`; valid names: {}", valid.join(", "))]
    Unknown {
        name: String,
        valid: &'static [&'static str],
    },
    /// A built-in description failed `verify()`: a bug in the library, kept
    /// as an error so callers never panic.
    #[error("built-in kernel `{name}` failed verification: {source}")]
    Invalid {
        name: &'static str,
        #[source]
        source: VerifyError,
    },
}

/// A library entry: its name and how to build it.
type Entry = (&'static str, fn() -> Result<Kernel, VerifyError>);

/// The one table of built-in kernels, sorted by name (a test checks).
///
/// Decode attention uses the asynchronous softmax with [`ASYNC_SOFTMAX`]'s
/// values (a test checks they agree) and splits `s` across threads
/// (flash-decoding: one query token gives too little parallelism otherwise);
/// prefill has `t × hq` rows of work already and runs the exact online
/// softmax.
const ENTRIES: [Entry; 17] = [
    ("attention-decode-f16", || {
        kernel! {
            attention-decode-f16(t = 1, hq, kvh, d, s) {
                q: input  f16 [t, hq, d] prescaled;
                k: cache  f16 [s, kvh, d];
                v: cache  f16 [s, kvh, d];
                o: output f16 [t, hq, d];
                o[t, hq, d] = attention(q[t, hq, d], k[s, kvh, d], v[s, kvh, d]) decode;
                softmax async(phi = 0.0, lo = -16.8, hi = 6.5);
                parallel kvh;
                split s;
            }
        }
    }),
    ("attention-decode-kv8", || {
        // Keys int8 per token (asymmetric), values fp8.
        kernel! {
            attention-decode-kv8(t = 1, hq, kvh, d, s) {
                q: input  f16        [t, hq, d] prescaled;
                k: cache  i8asym:row [s, kvh, d];
                v: cache  fp8e4m3    [s, kvh, d];
                o: output f16        [t, hq, d];
                o[t, hq, d] = attention(q[t, hq, d], k[s, kvh, d], v[s, kvh, d]) decode;
                softmax async(phi = 0.0, lo = -16.8, hi = 6.5);
                parallel kvh;
                split s;
            }
        }
    }),
    ("attention-prefill-f16", || {
        kernel! {
            attention-prefill-f16(t, hq, kvh, d, s) {
                q: input  f16 [t, hq, d] prescaled;
                k: cache  f16 [s, kvh, d];
                v: cache  f16 [s, kvh, d];
                o: output f16 [t, hq, d];
                o[t, hq, d] = attention(q[t, hq, d], k[s, kvh, d], v[s, kvh, d]) prefill;
                softmax online;
                parallel kvh;
            }
        }
    }),
    ("attention-prefill-kv8", || {
        // The decode kv8 cache: keys int8 per token (asymmetric), values fp8.
        kernel! {
            attention-prefill-kv8(t, hq, kvh, d, s) {
                q: input  f16        [t, hq, d] prescaled;
                k: cache  i8asym:row [s, kvh, d];
                v: cache  fp8e4m3    [s, kvh, d];
                o: output f16        [t, hq, d];
                o[t, hq, d] = attention(q[t, hq, d], k[s, kvh, d], v[s, kvh, d]) prefill;
                softmax online;
                parallel kvh;
            }
        }
    }),
    ("matmul-e0m4a16", || {
        // The E0M4 bias is its zero point.
        kernel! {
            matmul-e0m4a16(e, h, l) {
                tile e by ep, h by hp, l by lp;
                x:    input  f16      [e, l];
                w:    weight e0m4:g32 [h, l] layout [l/lp, h, lp];
                bias: input  f32      [h];
                y:    output f32      [e, h];
                y[e, h] = sum(l) x[e, l] * w[h, l];
                epilogue scale, zero_point, bias(bias);
                parallel e, h;
            }
        }
    }),
    ("matmul-f16", || {
        kernel! {
            matmul-f16(e, h, l) {
                tile e by ep, h by hp, l by lp;
                x:    input  f16 [e, l];
                w:    weight f16 [h, l] layout [h/hp, l/lp, hp, lp];
                bias: input  f32 [h];
                y:    output f16 [e, h];
                y[e, h] = sum(l) x[e, l] * w[h, l];
                epilogue bias(bias);
                parallel e, h;
            }
        }
    }),
    ("matmul-f32", || {
        kernel! {
            matmul-f32(e, h, l) {
                tile e by ep, h by hp, l by lp;
                x:    input  f32 [e, l];
                w:    weight f32 [h, l] layout [h/hp, l/lp, hp, lp];
                bias: input  f32 [h];
                y:    output f32 [e, h];
                y[e, h] = sum(l) x[e, l] * w[h, l];
                epilogue bias(bias);
                parallel e, h;
            }
        }
    }),
    ("matmul-q4_0", || {
        kernel! {
            matmul-q4_0(e, h, l) {
                tile e by ep, h by hp, l by lp;
                x:    input  i8dyn         [e, l] layout [e/ep, l/lp, ep, lp];
                w:    weight u4sym:g32:f16 [h, l] layout [h/hp, l/lp, hp, lp] pair_transpose;
                bias: input  f32           [h];
                y:    output f32           [e, h];
                y[e, h] = sum(l) x[e, l] * w[h, l];
                epilogue scale, bias(bias);
                parallel e, h;
            }
        }
    }),
    ("matmul-q4_0a16", || {
        kernel! {
            matmul-q4_0a16(e, h, l) {
                tile e by ep, h by hp, l by lp;
                x:    input  f16           [e, l];
                w:    weight u4sym:g32:f16 [h, l] layout [l/lp, h, lp];
                bias: input  f32           [h];
                y:    output f32           [e, h];
                y[e, h] = sum(l) x[e, l] * w[h, l];
                epilogue scale, bias(bias);
                parallel e, h;
            }
        }
    }),
    ("matmul-q4_1", || {
        kernel! {
            matmul-q4_1(e, h, l) {
                tile e by ep, h by hp, l by lp;
                x:    input  i8dyn          [e, l] layout [e/ep, l/lp, ep, lp];
                w:    weight u4asym:g32:f16 [h, l] layout [h/hp, l/lp, hp, lp] pair_transpose;
                bias: input  f32            [h];
                y:    output f32            [e, h];
                y[e, h] = sum(l) x[e, l] * w[h, l];
                epilogue scale, zero_point, bias(bias);
                parallel e, h;
            }
        }
    }),
    ("matmul-q4_1a16", || {
        kernel! {
            matmul-q4_1a16(e, h, l) {
                tile e by ep, h by hp, l by lp;
                x:    input  f16            [e, l];
                w:    weight u4asym:g32:f16 [h, l] layout [l/lp, h, lp];
                bias: input  f32            [h];
                y:    output f32            [e, h];
                y[e, h] = sum(l) x[e, l] * w[h, l];
                epilogue scale, zero_point, bias(bias);
                parallel e, h;
            }
        }
    }),
    ("matmul-q8_0", || {
        kernel! {
            matmul-q8_0(e, h, l) {
                tile e by ep, h by hp, l by lp;
                x:    input  i8dyn         [e, l] layout [e/ep, l/lp, ep, lp];
                w:    weight i8sym:g32:f16 [h, l] layout [h/hp, l/lp, hp, lp];
                bias: input  f32           [h];
                y:    output f32           [e, h];
                y[e, h] = sum(l) x[e, l] * w[h, l];
                epilogue scale, bias(bias);
                parallel e, h;
            }
        }
    }),
    ("matmul-q8_0a16", || {
        kernel! {
            matmul-q8_0a16(e, h, l) {
                tile e by ep, h by hp, l by lp;
                x:    input  f16           [e, l];
                w:    weight i8sym:g32:f16 [h, l] layout [l/lp, h, lp];
                bias: input  f32           [h];
                y:    output f32           [e, h];
                y[e, h] = sum(l) x[e, l] * w[h, l];
                epilogue scale, bias(bias);
                parallel e, h;
            }
        }
    }),
    ("matmul-w4a16", || {
        kernel! {
            matmul-w4a16(e, h, l) {
                tile e by ep, h by hp, l by lp;
                x:    input  f16        [e, l];
                w:    weight u4asym:g32 [h, l] layout [l/lp, h, lp];
                bias: input  f32        [h];
                y:    output f32        [e, h];
                y[e, h] = sum(l) x[e, l] * w[h, l];
                epilogue scale, zero_point, bias(bias);
                parallel e, h;
            }
        }
    }),
    ("matmul-w4a8", || {
        kernel! {
            matmul-w4a8(e, h, l) {
                tile e by ep, h by hp, l by lp;
                x:    input  i8dyn      [e, l] layout [e/ep, l/lp, ep, lp];
                w:    weight u4asym:g32 [h, l] layout [h/hp, l/lp, hp, lp] pair_transpose;
                bias: input  f32        [h];
                y:    output f32        [e, h];
                y[e, h] = sum(l) x[e, l] * w[h, l];
                epilogue scale, zero_point, bias(bias);
                parallel e, h;
            }
        }
    }),
    ("matmul-w8a16", || {
        kernel! {
            matmul-w8a16(e, h, l) {
                tile e by ep, h by hp, l by lp;
                x:    input  f16       [e, l];
                w:    weight i8sym:row [h, l] layout [l/lp, h, lp];
                bias: input  f32       [h];
                y:    output f32       [e, h];
                y[e, h] = sum(l) x[e, l] * w[h, l];
                epilogue scale, bias(bias);
                parallel e, h;
            }
        }
    }),
    ("matmul-w8a8", || {
        kernel! {
            matmul-w8a8(e, h, l) {
                tile e by ep, h by hp, l by lp;
                x:    input  i8dyn     [e, l] layout [e/ep, l/lp, ep, lp];
                w:    weight i8sym:row [h, l] layout [h/hp, l/lp, hp, lp];
                bias: input  f32       [h];
                y:    output f32       [e, h];
                y[e, h] = sum(l) x[e, l] * w[h, l];
                epilogue scale, bias(bias);
                parallel e, h;
            }
        }
    }),
];

const NAMES: [&str; ENTRIES.len()] = {
    let mut names = [""; ENTRIES.len()];
    let mut i = 0;
    while i < ENTRIES.len() {
        names[i] = ENTRIES[i].0;
        i += 1;
    }
    names
};

/// The names of every built-in kernel, sorted (byte order), no duplicates.
pub fn names() -> &'static [&'static str] {
    &NAMES
}

/// Whether `kernel` is a matmul of the GPU family: weights in the
/// `[l/lp, h, lp]` layout (not panelled by `h`), as the OpenCL and PTX
/// backends read them.
pub fn has_gpu_weight_layout(kernel: &Kernel) -> bool {
    kernel.as_matmul().is_some_and(|mm| {
        kernel
            .tensor(&mm.w)
            .is_some_and(|t| !t.layout.is_panelled_by(&mm.h))
    })
}

/// The GPU family's matmuls by name ([`has_gpu_weight_layout`]), sorted.
pub fn gpu_matmul_names() -> Vec<&'static str> {
    names()
        .iter()
        .copied()
        .filter(|n| get(n).is_ok_and(|k| has_gpu_weight_layout(&k)))
        .collect()
}

/// The built-in kernel called `name`.
pub fn get(name: &str) -> Result<Kernel, LibraryError> {
    let Some(&(known, build)) = ENTRIES.iter().find(|(n, _)| *n == name) else {
        return Err(LibraryError::Unknown {
            name: name.to_string(),
            valid: &NAMES,
        });
    };
    build().map_err(|source| LibraryError::Invalid {
        name: known,
        source,
    })
}

/// Every built-in kernel, in [`names`] order.
///
/// # Panics
///
/// Only if a built-in description fails `verify()`, a library bug that the
/// library tests rule out; use [`get`] to handle that case as an error.
pub fn all() -> Vec<Kernel> {
    NAMES
        .iter()
        .map(|name| match get(name) {
            Ok(kernel) => kernel,
            Err(err) => panic!("{err}"),
        })
        .collect()
}

/// The unified max used by the decode kernels' asynchronous softmax, and
/// the bounds on `score - phi` outside which the row is recomputed online.
///
/// FlashDecoding++ Figure 5: for Llama2-7B over 99.99% of the softmax
/// inputs lie in [-16.8, 6.5]. With `phi = 0`, `score - phi` is the score
/// itself, so these bounds are that measured range: recomputation stays
/// rare, and `e^(score - phi)` stays within about e^±17 in fp32, far from
/// overflow and from losing precision to underflow. Scores outside still
/// give the exact result, only through the slower synchronized path.
pub const ASYNC_SOFTMAX: SoftmaxMode = SoftmaxMode::Async {
    phi: 0.0,
    lo: -16.8,
    hi: 6.5,
};
