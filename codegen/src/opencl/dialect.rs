//! OpenCL specifics as data (tinygrad `renderer/cstyle.py`, Halide
//! `CodeGen_OpenCL_Dev.cpp`): address-space qualifiers, work-item
//! functions, barriers, and the two precision modes' spellings. The kernel
//! printers only ever ask this table; nothing OpenCL-specific is spelled
//! elsewhere.

/// How `half` data is computed with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Fp16Mode {
    /// `half` arithmetic under `cl_khr_fp16` (every mobile GPU reports it):
    /// weights dequantize to `half`, products in `half`, sums in `float`.
    Native,
    /// `half` only as storage, read and written with `vload_half` /
    /// `vstore_half`, all arithmetic in `float` (devices without
    /// `cl_khr_fp16`, e.g. PoCL on a CPU).
    #[default]
    Storage,
}

impl Fp16Mode {
    /// The mode a device supports: native when it reports `cl_khr_fp16`.
    pub fn for_extensions(extensions: &str) -> Fp16Mode {
        if extensions.split_whitespace().any(|e| e == "cl_khr_fp16") {
            Fp16Mode::Native
        } else {
            Fp16Mode::Storage
        }
    }
}

impl std::fmt::Display for Fp16Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Fp16Mode::Native => "native",
            Fp16Mode::Storage => "storage",
        })
    }
}

impl std::str::FromStr for Fp16Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Fp16Mode, String> {
        match s {
            "native" => Ok(Fp16Mode::Native),
            "storage" => Ok(Fp16Mode::Storage),
            _ => Err(format!("unknown fp16 mode `{s}`; valid: native, storage")),
        }
    }
}

/// The language's fixed spellings.
#[derive(Clone, Copy, Debug)]
pub struct Dialect {
    pub kernel: &'static str,
    pub global: &'static str,
    pub local: &'static str,
    pub restrict: &'static str,
    pub inline: &'static str,
    pub local_barrier: &'static str,
    pub global_id: &'static str,
    pub local_id: &'static str,
    pub group_id: &'static str,
    pub num_groups: &'static str,
    pub image_ro: &'static str,
    /// Program-scope sampler for unnormalised, clamped, nearest texel reads.
    pub sampler: &'static str,
    pub read_texel: &'static str,
    pub unroll: &'static str,
}

/// OpenCL C 1.2.
pub const OPENCL: Dialect = Dialect {
    kernel: "__kernel",
    global: "__global",
    local: "__local",
    restrict: "restrict",
    inline: "inline",
    local_barrier: "barrier(CLK_LOCAL_MEM_FENCE);",
    global_id: "get_global_id",
    local_id: "get_local_id",
    group_id: "get_group_id",
    num_groups: "get_num_groups",
    image_ro: "__read_only image2d_t",
    sampler: "__constant sampler_t weight_sampler = CLK_NORMALIZED_COORDS_FALSE | CLK_ADDRESS_CLAMP | CLK_FILTER_NEAREST;",
    read_texel: "read_imageui",
    unroll: "#pragma unroll",
};

/// The spellings that depend on [`Fp16Mode`].
#[derive(Clone, Copy, Debug)]
pub struct Precision {
    pub mode: Fp16Mode,
    /// Arithmetic type of dequantized weights and activations.
    pub t: &'static str,
    pub t4: &'static str,
    pub pragma: Option<&'static str>,
}

impl Precision {
    pub fn new(mode: Fp16Mode) -> Precision {
        match mode {
            Fp16Mode::Native => Precision {
                mode,
                t: "half",
                t4: "half4",
                pragma: Some("#pragma OPENCL EXTENSION cl_khr_fp16 : enable"),
            },
            Fp16Mode::Storage => Precision {
                mode,
                t: "float",
                t4: "float4",
                pragma: None,
            },
        }
    }

    pub fn native(&self) -> bool {
        self.mode == Fp16Mode::Native
    }

    /// One half at `ptr[idx]` as the arithmetic type.
    pub fn load_half(&self, idx: &str, ptr: &str) -> String {
        match self.mode {
            Fp16Mode::Native => format!("{ptr}[{idx}]"),
            Fp16Mode::Storage => format!("vload_half({idx}, {ptr})"),
        }
    }

    /// One half at `ptr[idx]` as float (softmax and reductions).
    pub fn load_half_f32(&self, idx: &str, ptr: &str) -> String {
        match self.mode {
            Fp16Mode::Native => format!("(float){ptr}[{idx}]"),
            Fp16Mode::Storage => format!("vload_half({idx}, {ptr})"),
        }
    }

    /// Four halves at `ptr` (2-byte aligned) as the arithmetic vector.
    pub fn load_half4(&self, ptr: &str) -> String {
        match self.mode {
            Fp16Mode::Native => format!("vload4(0, {ptr})"),
            Fp16Mode::Storage => format!("vload_half4(0, {ptr})"),
        }
    }

    /// Eight halves, the `idx`-th 16-byte chunk at `ptr`: one 128-bit load.
    pub fn load_half8(&self, idx: &str, ptr: &str) -> String {
        match self.mode {
            Fp16Mode::Native => format!("vload8({idx}, {ptr})"),
            Fp16Mode::Storage => format!("vload_half8({idx}, {ptr})"),
        }
    }

    /// Store a float or arithmetic value `v` as a half at `ptr[idx]`.
    pub fn store_half(&self, v: &str, idx: &str, ptr: &str) -> String {
        match self.mode {
            Fp16Mode::Native => format!("{ptr}[{idx}] = (half)({v});"),
            Fp16Mode::Storage => format!("vstore_half({v}, {idx}, {ptr});"),
        }
    }

    /// A literal of the arithmetic type.
    pub fn lit(&self, v: f32) -> String {
        let f = float_lit(v);
        match self.mode {
            Fp16Mode::Native => format!("(half){f}"),
            Fp16Mode::Storage => f,
        }
    }

    /// The arithmetic vector converted to float4.
    pub fn to_float4(&self, v: &str) -> String {
        match self.mode {
            Fp16Mode::Native => format!("convert_float4({v})"),
            Fp16Mode::Storage => v.to_string(),
        }
    }
}

/// A float literal that round-trips (`1.0f`, `-16.8f`, `8388608.0f`).
pub fn float_lit(v: f32) -> String {
    if v == f32::INFINITY {
        return "INFINITY".to_string();
    }
    if v == f32::NEG_INFINITY {
        return "(-INFINITY)".to_string();
    }
    let s = format!("{v:?}");
    let s = if s.contains('.') || s.contains('e') {
        s
    } else {
        format!("{s}.0")
    };
    if v < 0.0 {
        format!("({s}f)")
    } else {
        format!("{s}f")
    }
}

/// Plain text with indentation: the one printer every kernel goes through.
#[derive(Default)]
pub struct Writer {
    out: String,
    depth: usize,
}

impl Writer {
    pub fn new() -> Writer {
        Writer::default()
    }

    /// One line at the current depth (empty lines stay empty).
    pub fn line(&mut self, s: impl AsRef<str>) {
        let s = s.as_ref();
        if !s.is_empty() {
            for _ in 0..self.depth {
                self.out.push_str("    ");
            }
            self.out.push_str(s);
        }
        self.out.push('\n');
    }

    /// `head {` and one level deeper.
    pub fn open(&mut self, head: impl AsRef<str>) {
        let head = head.as_ref();
        if head.is_empty() {
            self.line("{");
        } else {
            self.line(format!("{head} {{"));
        }
        self.depth += 1;
    }

    /// `}` (plus `tail`) one level up.
    pub fn close(&mut self, tail: &str) {
        self.depth = self.depth.saturating_sub(1);
        self.line(format!("}}{tail}"));
    }

    /// A line one level up that stays open (`} else {`).
    pub fn middle(&mut self, s: &str) {
        self.depth = self.depth.saturating_sub(1);
        self.line(s);
        self.depth += 1;
    }

    pub fn blank(&mut self) {
        self.out.push('\n');
    }

    pub fn finish(self) -> String {
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_literals_round_trip() {
        assert_eq!(float_lit(1.0), "1.0f");
        assert_eq!(float_lit(-16.8), "(-16.8f)");
        assert_eq!(float_lit(8_388_608.0), "8388608.0f");
        assert_eq!(float_lit(6.5), "6.5f");
        assert_eq!(float_lit(f32::NEG_INFINITY), "(-INFINITY)");
    }

    #[test]
    fn fp16_mode_from_extensions() {
        assert_eq!(
            Fp16Mode::for_extensions("cl_khr_icd cl_khr_fp16 cl_khr_fp64"),
            Fp16Mode::Native
        );
        assert_eq!(
            Fp16Mode::for_extensions("cl_khr_fp16x cl_khr_fp64"),
            Fp16Mode::Storage
        );
        assert_eq!("native".parse::<Fp16Mode>(), Ok(Fp16Mode::Native));
        assert!("fast".parse::<Fp16Mode>().is_err());
    }
}
