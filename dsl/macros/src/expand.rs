//! The whole macro as a plain function over `proc_macro2::TokenStream`:
//! parse, check, emit. The `#[proc_macro]` entry only converts token types,
//! so everything here runs (and is tested and fuzzed) outside the compiler.

use crate::check::{Spec, check};
use crate::emit::emit;
use crate::parse::KernelDef;
use proc_macro2::TokenStream;

/// Parse and check `kernel!`'s input.
pub fn spec(input: TokenStream) -> syn::Result<Spec> {
    let def: KernelDef = syn::parse2(input)?;
    check(&def)
}

/// `kernel!`'s expansion: the builder expression, or `compile_error!`s at the
/// offending tokens.
pub fn expand(input: TokenStream) -> TokenStream {
    match spec(input) {
        Ok(spec) => emit(&spec),
        Err(error) => error.to_compile_error(),
    }
}
