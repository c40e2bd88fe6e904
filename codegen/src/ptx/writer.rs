//! A PTX text writer: virtual registers numbered in order of first use
//! (deterministic names, `.reg` declarations sized at the end), labels
//! numbered the same way, one instruction per line.

use std::fmt::Write as _;

/// The register classes this backend declares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegClass {
    Pred,
    B16,
    B32,
    F32,
    B64,
}

impl RegClass {
    const ALL: [RegClass; 5] = [
        RegClass::Pred,
        RegClass::B16,
        RegClass::B32,
        RegClass::F32,
        RegClass::B64,
    ];

    fn prefix(self) -> &'static str {
        match self {
            RegClass::Pred => "p",
            RegClass::B16 => "hs",
            RegClass::B32 => "r",
            RegClass::F32 => "f",
            RegClass::B64 => "rd",
        }
    }

    fn ptx_type(self) -> &'static str {
        match self {
            RegClass::Pred => ".pred",
            RegClass::B16 => ".b16",
            RegClass::B32 => ".b32",
            RegClass::F32 => ".f32",
            RegClass::B64 => ".b64",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// One kernel body under construction.
#[derive(Debug, Default)]
pub struct Body {
    lines: Vec<String>,
    counts: [u32; 5],
    labels: u32,
}

impl Body {
    pub fn new() -> Body {
        Body::default()
    }

    /// A fresh register of `class`.
    pub fn reg(&mut self, class: RegClass) -> String {
        let i = class.index();
        let n = self.counts[i];
        self.counts[i] += 1;
        format!("%{}{n}", class.prefix())
    }

    pub fn pred(&mut self) -> String {
        self.reg(RegClass::Pred)
    }
    pub fn r(&mut self) -> String {
        self.reg(RegClass::B32)
    }
    pub fn f(&mut self) -> String {
        self.reg(RegClass::F32)
    }
    pub fn rd(&mut self) -> String {
        self.reg(RegClass::B64)
    }
    pub fn h(&mut self) -> String {
        self.reg(RegClass::B16)
    }

    /// A fresh label name with a readable stem.
    pub fn label(&mut self, stem: &str) -> String {
        let n = self.labels;
        self.labels += 1;
        format!("$L_{stem}_{n}")
    }

    /// One instruction (the `;` is added).
    pub fn op(&mut self, text: impl AsRef<str>) {
        self.lines.push(format!("\t{};", text.as_ref()));
    }

    /// A comment line.
    pub fn comment(&mut self, text: impl AsRef<str>) {
        self.lines.push(format!("\t// {}", text.as_ref()));
    }

    /// Places a label.
    pub fn place(&mut self, label: &str) {
        self.lines.push(format!("{label}:"));
    }

    /// A raw line (declarations).
    pub fn raw(&mut self, text: impl AsRef<str>) {
        self.lines.push(format!("\t{}", text.as_ref()));
    }

    /// `dst = 32-bit value` of an immediate.
    pub fn imm(&mut self, value: u32) -> String {
        let r = self.r();
        self.op(format!("mov.b32 {r}, {value:#010x}"));
        r
    }

    /// The declarations for every register used, then the body lines.
    pub fn finish(self) -> String {
        let mut s = String::new();
        for class in RegClass::ALL {
            let n = self.counts[class.index()];
            if n > 0 {
                let _ = writeln!(s, "\t.reg {} %{}<{n}>;", class.ptx_type(), class.prefix());
            }
        }
        for line in self.lines {
            s.push_str(&line);
            s.push('\n');
        }
        s
    }
}

/// A float literal as PTX's exact hexadecimal form (`0fXXXXXXXX`).
pub fn f32_lit(v: f32) -> String {
    format!("0f{:08X}", v.to_bits())
}
