//! Error locations. A [`Loc`] remembers the first and last token of a piece of
//! input so that an error underlines all of it (`u4asym:g32`, `[e, l]`), which
//! a single `Span` cannot do on stable Rust (`Span::join` is nightly-only).

use proc_macro2::{Ident, Span, TokenStream, TokenTree};

/// The source range of a piece of input: first and last token.
#[derive(Clone, Copy, Debug)]
pub struct Loc {
    pub first: Span,
    pub last: Span,
}

impl Loc {
    pub fn of(span: Span) -> Loc {
        Loc {
            first: span,
            last: span,
        }
    }

    /// From the start of `self` to the end of `other`.
    pub fn to(self, other: Loc) -> Loc {
        Loc {
            first: self.first,
            last: other.last,
        }
    }

    /// A spanned error underlining the whole range.
    pub fn error(self, message: impl std::fmt::Display) -> syn::Error {
        let mut tokens = TokenStream::new();
        tokens.extend([
            TokenTree::Ident(Ident::new("first", self.first)),
            TokenTree::Ident(Ident::new("last", self.last)),
        ]);
        syn::Error::new_spanned(tokens, message)
    }
}

impl From<Span> for Loc {
    fn from(span: Span) -> Loc {
        Loc::of(span)
    }
}

/// Shorthand for an `Err` at `loc`.
pub fn fail<T>(loc: impl Into<Loc>, message: impl std::fmt::Display) -> syn::Result<T> {
    Err(loc.into().error(message))
}
