//! Code: turn a checked [`Spec`] into the `KernelBuilder` calls that build
//! the IR `Kernel`. The expansion names everything by absolute
//! `::tessera_dsl::...` paths, so it works in any crate that depends on
//! tessera-dsl (and inside tessera-dsl, through `extern crate self`).

use crate::check::{Activation, AttentionSpec, LayoutDim, MatmulSpec, OpSpec, Spec, TensorSpec};
use crate::parse::{AttentionKind, Role, SoftmaxMode};
use proc_macro2::{Literal, TokenStream};
use quote::quote;

/// The expression `Result<Kernel, VerifyError>` for a checked kernel.
pub fn emit(spec: &Spec) -> TokenStream {
    let name = &spec.name;
    let axes = spec.axes.iter().map(|a| {
        let n = &a.name;
        let extent = match a.fixed {
            Some(size) => quote!(::tessera_dsl::ir::Extent::Fixed(#size)),
            None => quote!(::tessera_dsl::ir::Extent::Dyn),
        };
        let kind = if a.reduce {
            quote!(::tessera_dsl::ir::AxisKind::Reduce)
        } else {
            quote!(::tessera_dsl::ir::AxisKind::Spatial)
        };
        quote!(.axis(#n, #extent, #kind))
    });
    let tiles = spec.tiles.iter().map(|t| {
        let (n, axis) = (&t.name, &t.axis);
        let size = match t.fixed {
            Some(size) => quote!(::tessera_dsl::ir::TileSize::Fixed(#size)),
            None => quote!(::tessera_dsl::ir::TileSize::Solve),
        };
        quote!(.tile(#n, #axis, #size))
    });
    let tensors = spec.tensors.iter().map(emit_tensor);
    let op = match &spec.op {
        OpSpec::Matmul(m) => emit_matmul(m),
        OpSpec::Attention(a) => emit_attention(a),
    };
    let parallel = spec.parallel.iter().map(|a| quote!(.parallel(#a)));
    let split = spec.split.iter().map(|a| quote!(.split(#a)));
    quote! {
        ::tessera_dsl::KernelBuilder::new(#name)
            #(#axes)*
            #(#tiles)*
            #(#tensors)*
            .op(#op)
            #(#parallel)*
            #(#split)*
            .build()
    }
}

fn string(s: &str) -> TokenStream {
    quote!(::std::string::String::from(#s))
}

fn emit_tensor(t: &TensorSpec) -> TokenStream {
    let name = &t.name;
    let role = match t.role {
        Role::Input => quote!(::tessera_dsl::ir::Role::Input),
        Role::Weight => quote!(::tessera_dsl::ir::Role::Weight),
        Role::Output => quote!(::tessera_dsl::ir::Role::Output),
        Role::Cache => quote!(::tessera_dsl::ir::Role::Cache),
    };
    let dims = &t.dims;
    let format = t.format.to_ir();
    let pair = t.pair_transpose;
    let signed = t.signed_codes;
    let dims_layout: Vec<TokenStream> = match &t.layout {
        Some(layout) => layout.iter().map(emit_layout_dim).collect(),
        None => t
            .dims
            .iter()
            .map(|d| emit_layout_dim(&LayoutDim::Whole(d.clone())))
            .collect(),
    };
    quote! {
        .tensor_with_layout(
            #name,
            #role,
            &[#(#dims),*],
            #format,
            ::tessera_dsl::ir::Layout {
                dims: ::std::vec![#(#dims_layout),*],
                int4_pair_transpose: #pair,
                int4_signed_codes: #signed,
            },
        )
    }
}

fn emit_layout_dim(d: &LayoutDim) -> TokenStream {
    match d {
        LayoutDim::Whole(axis) => {
            let axis = string(axis);
            quote!(::tessera_dsl::ir::LayoutDim::Whole(#axis))
        }
        LayoutDim::Outer { axis, tile } => {
            let (axis, tile) = (string(axis), string(tile));
            quote!(::tessera_dsl::ir::LayoutDim::Outer { axis: #axis, tile: #tile })
        }
        LayoutDim::Inner { tile } => {
            let tile = string(tile);
            quote!(::tessera_dsl::ir::LayoutDim::Inner { tile: #tile })
        }
    }
}

fn emit_matmul(m: &MatmulSpec) -> TokenStream {
    let [x, w, y, e, h, l] = [&m.x, &m.w, &m.y, &m.e, &m.h, &m.l].map(|s| string(s));
    let (scale, zero_point) = (m.scale, m.zero_point);
    let bias = match &m.bias {
        Some(b) => {
            let b = string(b);
            quote!(::std::option::Option::Some(#b))
        }
        None => quote!(::std::option::Option::None),
    };
    let activation = match m.activation {
        Activation::None => quote!(::tessera_dsl::ir::Activation::None),
        Activation::Relu => quote!(::tessera_dsl::ir::Activation::Relu),
        Activation::Silu => quote!(::tessera_dsl::ir::Activation::Silu),
    };
    quote! {
        ::tessera_dsl::ir::Op::Matmul(::tessera_dsl::ir::Matmul {
            x: #x,
            w: #w,
            y: #y,
            e: #e,
            h: #h,
            l: #l,
            epilogue: ::tessera_dsl::ir::Epilogue {
                scale: #scale,
                zero_point: #zero_point,
                bias: #bias,
                activation: #activation,
            },
        })
    }
}

/// An f32 literal; the sign is a separate token because a negative literal
/// is not a single token in Rust.
fn float(v: f32) -> TokenStream {
    let magnitude = Literal::f32_suffixed(if v.is_finite() { v.abs() } else { 0.0 });
    if v.is_sign_negative() {
        quote!(-#magnitude)
    } else {
        quote!(#magnitude)
    }
}

fn emit_attention(a: &AttentionSpec) -> TokenStream {
    let [q, k, v, o, tokens, heads, kv_heads, head_dim, seq] = [
        &a.q,
        &a.k,
        &a.v,
        &a.o,
        &a.tokens,
        &a.heads,
        &a.kv_heads,
        &a.head_dim,
        &a.seq,
    ]
    .map(|s| string(s));
    let kind = match a.kind {
        AttentionKind::Decode => quote!(::tessera_dsl::ir::AttentionKind::Decode),
        AttentionKind::Prefill => quote!(::tessera_dsl::ir::AttentionKind::Prefill),
    };
    let softmax = match a.softmax {
        SoftmaxMode::Online => quote!(::tessera_dsl::ir::SoftmaxMode::Online),
        SoftmaxMode::Async { phi, lo, hi } => {
            let (phi, lo, hi) = (float(phi), float(lo), float(hi));
            quote!(::tessera_dsl::ir::SoftmaxMode::Async { phi: #phi, lo: #lo, hi: #hi })
        }
    };
    let prescaled = a.q_prescaled;
    quote! {
        ::tessera_dsl::ir::Op::Attention(::tessera_dsl::ir::Attention {
            kind: #kind,
            q: #q,
            k: #k,
            v: #v,
            o: #o,
            tokens: #tokens,
            heads: #heads,
            kv_heads: #kv_heads,
            head_dim: #head_dim,
            seq: #seq,
            q_prescaled: #prescaled,
            softmax: #softmax,
        })
    }
}
