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
//! | `matmul-w4a16` | f16, row-major | u4asym:g32 | `[l/lp, h, lp]` | scale, zero point, bias |
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
//! - **GPU family** (the A16 kernels W4A16, W8A16, E0M4A16): weights in the
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
const ENTRIES: [Entry; 10] = [
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
                parallel h;
                double_buffer l;
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
                parallel h;
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
                parallel h;
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
                parallel h;
                double_buffer l;
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
                parallel h;
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
                parallel h;
                double_buffer l;
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
                parallel h;
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

/// The `KernelBuilder` descriptions the `kernel!` entries replaced, kept for
/// one commit to show that both give the same kernels.
#[cfg(test)]
mod builder_versions {
    use super::ASYNC_SOFTMAX;
    use crate::builder::KernelBuilder;
    use crate::ir::*;
    use crate::verify::VerifyError;

    type Entry = (&'static str, fn() -> Result<Kernel, VerifyError>);

    pub const ENTRIES: [Entry; 10] = [
        ("attention-decode-f16", || {
            attention(AttentionSpec::decode(
                "attention-decode-f16",
                Format::F16,
                Format::F16,
            ))
        }),
        ("attention-decode-kv8", || {
            attention(AttentionSpec::decode(
                "attention-decode-kv8",
                Format::I8Asym(Group::Row),
                Format::Fp8E4M3,
            ))
        }),
        ("attention-prefill-f16", || {
            attention(AttentionSpec {
                name: "attention-prefill-f16",
                kind: AttentionKind::Prefill,
                k: Format::F16,
                v: Format::F16,
            })
        }),
        ("matmul-e0m4a16", || {
            matmul(MatmulSpec::gpu("matmul-e0m4a16", Format::E0M4(G32)))
        }),
        ("matmul-f16", || {
            matmul(MatmulSpec::cpu(
                "matmul-f16",
                Format::F16,
                Format::F16,
                Format::F16,
            ))
        }),
        ("matmul-f32", || {
            matmul(MatmulSpec::cpu(
                "matmul-f32",
                Format::F32,
                Format::F32,
                Format::F32,
            ))
        }),
        ("matmul-w4a16", || {
            matmul(MatmulSpec::gpu("matmul-w4a16", Format::U4Asym(G32)))
        }),
        ("matmul-w4a8", || {
            matmul(MatmulSpec::cpu(
                "matmul-w4a8",
                Format::I8Dyn,
                Format::U4Asym(G32),
                Format::F32,
            ))
        }),
        ("matmul-w8a16", || {
            matmul(MatmulSpec::gpu("matmul-w8a16", Format::I8Sym(Group::Row)))
        }),
        ("matmul-w8a8", || {
            matmul(MatmulSpec::cpu(
                "matmul-w8a8",
                Format::I8Dyn,
                Format::I8Sym(Group::Row),
                Format::F32,
            ))
        }),
    ];

    /// Group size of the 4-bit weight kernels: 32 codes = one 16-byte load with
    /// the int4 pair transpose, and MNN-LLM's GPU `lp`.
    const G32: Group = Group::Size(32);

    /// Where a matmul's weights live and so how they are laid out.
    #[derive(Clone, Copy)]
    enum Family {
        /// `[h/hp, l/lp, hp, lp]` weights, packed activations for `i8dyn`.
        Cpu,
        /// `[l/lp, h, lp]` weights, row-major f16 activations, double-buffered `l`.
        Gpu,
    }

    struct MatmulSpec {
        name: &'static str,
        family: Family,
        x: Format,
        w: Format,
        y: Format,
    }

    impl MatmulSpec {
        fn cpu(name: &'static str, x: Format, w: Format, y: Format) -> Self {
            MatmulSpec {
                name,
                family: Family::Cpu,
                x,
                w,
                y,
            }
        }

        /// The A16 kernels: f16 activations, f32 output.
        fn gpu(name: &'static str, w: Format) -> Self {
            MatmulSpec {
                name,
                family: Family::Gpu,
                x: Format::F16,
                w,
                y: Format::F32,
            }
        }
    }

    /// `[outer/tile, reduce/rtile, tile, rtile]`: the packed order of seed 000 IV.D.
    fn packed(
        outer: &str,
        tile: &str,
        reduce: &str,
        rtile: &str,
        int4_pair_transpose: bool,
    ) -> Layout {
        Layout {
            dims: vec![
                LayoutDim::outer(outer, tile),
                LayoutDim::outer(reduce, rtile),
                LayoutDim::inner(tile),
                LayoutDim::inner(rtile),
            ],
            int4_pair_transpose,
        }
    }

    fn matmul(spec: MatmulSpec) -> Result<Kernel, VerifyError> {
        let x_layout = if spec.x == Format::I8Dyn {
            packed("e", "ep", "l", "lp", false)
        } else {
            Layout::row_major(&["e", "l"])
        };
        let w_layout = match spec.family {
            Family::Cpu => packed("h", "hp", "l", "lp", spec.w.bits() == 4),
            Family::Gpu => Layout {
                dims: vec![
                    LayoutDim::outer("l", "lp"),
                    LayoutDim::whole("h"),
                    LayoutDim::inner("lp"),
                ],
                int4_pair_transpose: false,
            },
        };
        let mut builder = KernelBuilder::new(spec.name)
            .dyn_axis("e")
            .dyn_axis("h")
            .reduce_axis("l")
            .tile("ep", "e", TileSize::Solve)
            .tile("hp", "h", TileSize::Solve)
            .tile("lp", "l", TileSize::Solve)
            .tensor_with_layout("x", Role::Input, &["e", "l"], spec.x, x_layout)
            .tensor_with_layout("w", Role::Weight, &["h", "l"], spec.w, w_layout)
            .tensor("bias", Role::Input, &["h"], Format::F32)
            .tensor("y", Role::Output, &["e", "h"], spec.y)
            .op(Op::Matmul(Matmul {
                x: "x".into(),
                w: "w".into(),
                y: "y".into(),
                e: "e".into(),
                h: "h".into(),
                l: "l".into(),
                epilogue: Epilogue {
                    scale: spec.x.is_quantized() || spec.w.is_quantized(),
                    zero_point: spec.w.is_asymmetric(),
                    bias: Some("bias".into()),
                    activation: Activation::None,
                },
            }))
            .parallel("h");
        if let Family::Gpu = spec.family {
            builder = builder.double_buffer("l");
        }
        builder.build()
    }

    struct AttentionSpec {
        name: &'static str,
        kind: AttentionKind,
        k: Format,
        v: Format,
    }

    impl AttentionSpec {
        fn decode(name: &'static str, k: Format, v: Format) -> Self {
            AttentionSpec {
                name,
                kind: AttentionKind::Decode,
                k,
                v,
            }
        }
    }

    /// Decode kernels use the asynchronous softmax and split `s` across threads
    /// (flash-decoding: one query token gives too little parallelism
    /// otherwise); prefill has `t × hq` rows of work already and runs the
    /// exact online softmax.
    fn attention(spec: AttentionSpec) -> Result<Kernel, VerifyError> {
        let decode = spec.kind == AttentionKind::Decode;
        let tokens = if decode {
            Extent::Fixed(1)
        } else {
            Extent::Dyn
        };
        let mut builder = KernelBuilder::new(spec.name)
            .axis("t", tokens, AxisKind::Spatial)
            .dyn_axis("hq")
            .dyn_axis("kvh")
            .dyn_axis("d")
            .reduce_axis("s")
            .tensor("q", Role::Input, &["t", "hq", "d"], Format::F16)
            .tensor("k", Role::Cache, &["s", "kvh", "d"], spec.k)
            .tensor("v", Role::Cache, &["s", "kvh", "d"], spec.v)
            .tensor("o", Role::Output, &["t", "hq", "d"], Format::F16)
            .op(Op::Attention(Attention {
                kind: spec.kind,
                q: "q".into(),
                k: "k".into(),
                v: "v".into(),
                o: "o".into(),
                tokens: "t".into(),
                heads: "hq".into(),
                kv_heads: "kvh".into(),
                head_dim: "d".into(),
                seq: "s".into(),
                q_prescaled: true,
                softmax: if decode {
                    ASYNC_SOFTMAX
                } else {
                    SoftmaxMode::Online
                },
            }))
            .parallel("kvh");
        if decode {
            builder = builder.split("s");
        }
        builder.build()
    }

    #[test]
    fn kernel_macro_entries_equal_the_builder_versions() {
        assert_eq!(super::ENTRIES.len(), ENTRIES.len());
        for ((name, by_macro), (builder_name, by_builder)) in super::ENTRIES.iter().zip(&ENTRIES) {
            assert_eq!(name, builder_name);
            let (by_macro, by_builder) = (by_macro(), by_builder());
            assert!(by_macro.is_ok(), "{name}: {by_macro:?}");
            assert_eq!(by_macro, by_builder, "{name}");
            let text = |k: &Result<Kernel, VerifyError>| k.as_ref().map(|k| k.to_string()).ok();
            assert_eq!(text(&by_macro), text(&by_builder), "{name}");
        }
    }
}
