//! Storage formats as the macro sees them: a mirror of `tessera_dsl::ir::Format`
//! (this crate cannot depend on tessera-dsl), parsed from the same spellings
//! that `Format`'s `Display` prints, so a format can be copied from the
//! canonical text into `kernel!` and back.

use crate::error::Loc;
use crate::parse::ident_or;
use proc_macro2::TokenStream;
use quote::quote;
use syn::Ident;
use syn::parse::ParseStream;

/// Quantization group along the reduction axis (`g32` or `row`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Group {
    Size(u32),
    Row,
}

/// Mirror of `tessera_dsl::ir::ParamType`: storage precision of group
/// parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamType {
    F32,
    F16,
}

/// Mirror of `tessera_dsl::ir::Format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    F32,
    F16,
    BF16,
    I8Dyn,
    U4Asym(Group, ParamType),
    U4Sym(Group, ParamType),
    I8Sym(Group, ParamType),
    I8Asym(Group, ParamType),
    E0M4(Group, ParamType),
    Fp8E4M3,
    Fp8E5M2,
}

/// The spellings listed in error messages.
pub const FORMAT_HELP: &str = "f32, f16, bf16, i8dyn, fp8e4m3, fp8e5m2, \
     or a grouped format u4asym:G, u4sym:G, i8sym:G, i8asym:G, e0m4:G with G = gN (N a positive \
     multiple of 4, e.g. g32) or row, optionally followed by :f16 for f16 group parameters";

impl Format {
    pub fn is_float(self) -> bool {
        matches!(
            self,
            Format::F32 | Format::F16 | Format::BF16 | Format::Fp8E4M3 | Format::Fp8E5M2
        )
    }

    pub fn is_quantized(self) -> bool {
        !self.is_float()
    }

    pub fn is_asymmetric(self) -> bool {
        matches!(
            self,
            Format::U4Asym(..) | Format::I8Asym(..) | Format::E0M4(..)
        )
    }

    pub fn bits(self) -> u32 {
        match self {
            Format::F32 => 32,
            Format::F16 | Format::BF16 => 16,
            Format::I8Dyn | Format::I8Sym(..) | Format::I8Asym(..) => 8,
            Format::Fp8E4M3 | Format::Fp8E5M2 => 8,
            Format::U4Asym(..) | Format::U4Sym(..) | Format::E0M4(..) => 4,
        }
    }

    /// Floats a matmul output or an attention query may be computed in.
    pub fn is_compute_float(self) -> bool {
        matches!(self, Format::F32 | Format::F16 | Format::BF16)
    }

    /// The canonical spelling (same as the IR's `Display`).
    pub fn spelling(self) -> String {
        let grouped = |base: &str, g: Group, p: ParamType| {
            let params = match p {
                ParamType::F32 => "",
                ParamType::F16 => ":f16",
            };
            match g {
                Group::Size(n) => format!("{base}:g{n}{params}"),
                Group::Row => format!("{base}:row{params}"),
            }
        };
        match self {
            Format::F32 => "f32".into(),
            Format::F16 => "f16".into(),
            Format::BF16 => "bf16".into(),
            Format::I8Dyn => "i8dyn".into(),
            Format::U4Asym(g, p) => grouped("u4asym", g, p),
            Format::U4Sym(g, p) => grouped("u4sym", g, p),
            Format::I8Sym(g, p) => grouped("i8sym", g, p),
            Format::I8Asym(g, p) => grouped("i8asym", g, p),
            Format::E0M4(g, p) => grouped("e0m4", g, p),
            Format::Fp8E4M3 => "fp8e4m3".into(),
            Format::Fp8E5M2 => "fp8e5m2".into(),
        }
    }

    /// Tokens building the IR value.
    pub fn to_ir(self) -> TokenStream {
        let group = |g: Group| match g {
            Group::Size(n) => quote!(::tessera_dsl::ir::Group::Size(#n)),
            Group::Row => quote!(::tessera_dsl::ir::Group::Row),
        };
        let params = |p: ParamType| match p {
            ParamType::F32 => quote!(::tessera_dsl::ir::ParamType::F32),
            ParamType::F16 => quote!(::tessera_dsl::ir::ParamType::F16),
        };
        match self {
            Format::F32 => quote!(::tessera_dsl::ir::Format::F32),
            Format::F16 => quote!(::tessera_dsl::ir::Format::F16),
            Format::BF16 => quote!(::tessera_dsl::ir::Format::BF16),
            Format::I8Dyn => quote!(::tessera_dsl::ir::Format::I8Dyn),
            Format::Fp8E4M3 => quote!(::tessera_dsl::ir::Format::Fp8E4M3),
            Format::Fp8E5M2 => quote!(::tessera_dsl::ir::Format::Fp8E5M2),
            Format::U4Asym(g, p) => {
                let (g, p) = (group(g), params(p));
                quote!(::tessera_dsl::ir::Format::U4Asym(#g, #p))
            }
            Format::I8Sym(g, p) => {
                let (g, p) = (group(g), params(p));
                quote!(::tessera_dsl::ir::Format::I8Sym(#g, #p))
            }
            Format::I8Asym(g, p) => {
                let (g, p) = (group(g), params(p));
                quote!(::tessera_dsl::ir::Format::I8Asym(#g, #p))
            }
            Format::E0M4(g, p) => {
                let (g, p) = (group(g), params(p));
                quote!(::tessera_dsl::ir::Format::E0M4(#g, #p))
            }
            Format::U4Sym(g, p) => {
                let (g, p) = (group(g), params(p));
                quote!(::tessera_dsl::ir::Format::U4Sym(#g, #p))
            }
        }
    }
}

/// Parse `f32` or `u4asym:g32` style formats; the returned span covers the
/// whole spelling so errors about the format point at all of it.
pub fn parse_format(input: ParseStream) -> syn::Result<(Format, Loc)> {
    let base = ident_or(input, format!("expected a storage format: {FORMAT_HELP}"))?;
    let name = base.to_string();
    let plain = match name.as_str() {
        "f32" => Some(Format::F32),
        "f16" => Some(Format::F16),
        "bf16" => Some(Format::BF16),
        "i8dyn" => Some(Format::I8Dyn),
        "fp8e4m3" => Some(Format::Fp8E4M3),
        "fp8e5m2" => Some(Format::Fp8E5M2),
        _ => None,
    };
    if let Some(format) = plain {
        if input.peek(syn::Token![:]) && !input.peek(syn::Token![::]) {
            let colon: syn::Token![:] = input.parse()?;
            return Err(syn::Error::new(
                colon.span,
                format!("`{name}` takes no group; only u4asym, u4sym, i8sym, i8asym and e0m4 do"),
            ));
        }
        return Ok((format, Loc::of(base.span())));
    }
    let make: fn(Group, ParamType) -> Format = match name.as_str() {
        "u4asym" => Format::U4Asym,
        "u4sym" => Format::U4Sym,
        "i8sym" => Format::I8Sym,
        "i8asym" => Format::I8Asym,
        "e0m4" => Format::E0M4,
        _ => {
            return Err(syn::Error::new(
                base.span(),
                format!("unknown format `{name}`; expected {FORMAT_HELP}"),
            ));
        }
    };
    if !input.peek(syn::Token![:]) || input.peek(syn::Token![::]) {
        return Err(syn::Error::new(
            base.span(),
            format!(
                "`{name}` needs a quantization group: write `{name}:g32` (group of 32 along the reduction axis) or `{name}:row`"
            ),
        ));
    }
    let _colon: syn::Token![:] = input.parse()?;
    let group_ident = ident_or(
        input,
        "expected a quantization group: `gN` (N a positive multiple of 4, e.g. `g32`) or `row`",
    )?;
    let group = parse_group(&group_ident)?;
    let mut end = Loc::of(group_ident.span());
    let mut params = ParamType::F32;
    if input.peek(syn::Token![:]) && !input.peek(syn::Token![::]) {
        let _colon: syn::Token![:] = input.parse()?;
        let p = ident_or(
            input,
            "expected a group parameter precision after `:`: `f16` (f32 is the default and not written)",
        )?;
        if p != "f16" {
            return Err(syn::Error::new(
                p.span(),
                format!(
                    "unknown group parameter precision `{p}`: expected `f16` (f32 is the default and not written)"
                ),
            ));
        }
        params = ParamType::F16;
        end = Loc::of(p.span());
    }
    Ok((make(group, params), Loc::of(base.span()).to(end)))
}

fn parse_group(ident: &Ident) -> syn::Result<Group> {
    let text = ident.to_string();
    if text == "row" {
        return Ok(Group::Row);
    }
    let bad = || {
        syn::Error::new(
            ident.span(),
            format!(
                "invalid quantization group `{text}`: expected `gN` with N a positive multiple of 4 (e.g. `g32`, `g128`) or `row`"
            ),
        )
    };
    let digits = text.strip_prefix('g').ok_or_else(bad)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let n: u32 = digits.parse().map_err(|_| bad())?;
    if n == 0 || !n.is_multiple_of(4) {
        return Err(bad());
    }
    Ok(Group::Size(n))
}

#[cfg(test)]
mod tests {
    use super::*;
    use syn::parse::Parser;

    fn parse(text: &str) -> syn::Result<Format> {
        let parser = |input: ParseStream| parse_format(input).map(|(f, _)| f);
        parser.parse_str(text)
    }

    #[test]
    fn every_spelling_round_trips() {
        let all = [
            Format::F32,
            Format::F16,
            Format::BF16,
            Format::I8Dyn,
            Format::Fp8E4M3,
            Format::Fp8E5M2,
            Format::U4Asym(Group::Size(32), ParamType::F32),
            Format::I8Sym(Group::Row, ParamType::F32),
            Format::I8Asym(Group::Size(64), ParamType::F32),
            Format::E0M4(Group::Size(128), ParamType::F32),
        ];
        for f in all {
            assert_eq!(parse(&f.spelling()).ok(), Some(f), "{}", f.spelling());
        }
    }

    #[test]
    fn bad_formats_say_what_was_expected() {
        let msg = |t: &str| parse(t).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(msg("f64").contains("unknown format `f64`"));
        assert!(msg("u4asym").contains("needs a quantization group"));
        assert!(msg("u4asym:g30").contains("invalid quantization group `g30`"));
        assert!(msg("u4asym:g0").contains("invalid quantization group"));
        assert!(msg("i8sym:col").contains("invalid quantization group `col`"));
        assert!(msg("u4asym:g99999999999").contains("invalid quantization group"));
        assert!(msg("f16:g32").contains("takes no group"));
        assert!(msg(",").contains("expected a storage format"));
    }
}
