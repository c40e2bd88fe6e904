//! The `kernel!` proc macro for Tessera; see [`kernel!`] for the syntax
//! reference and the four canonical kernels (W4A8 linear layer, W4A16 GEMV,
//! flat GEMM, decode attention with the asynchronous softmax).
//!
//! Layout of the crate: `parse` reads the tokens into a spanned tree,
//! `check` resolves names and checks that they agree (every mistake is a
//! `syn::Error` on the offending token), `emit` writes the
//! `tessera_dsl::KernelBuilder` calls. `expand` chains the three over
//! `proc_macro2::TokenStream` so the whole macro is unit-tested and fuzzed as a
//! plain function; it never panics.

mod check;
mod emit;
mod error;
mod expand;
mod format;
mod parse;

#[cfg(test)]
mod agree;
#[cfg(test)]
mod tests;

#[doc = include_str!("syntax.md")]
#[proc_macro]
pub fn kernel(input: proc_macro::TokenStream) -> proc_macro::TokenStream {
    expand::expand(input.into()).into()
}
