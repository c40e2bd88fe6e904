//! A strict GGUF reader (versions 2 and 3, little-endian), written for
//! Tessera rather than taken from a crate: it checks every field against
//! the file's length before using it, never allocates by a count it has
//! not bounded, and names the file, the tensor or key, and the field in
//! every error.
//!
//! Layout (ggml `docs/gguf.md`):
//!
//! ```text
//! magic "GGUF" | version u32 | tensor_count u64 | kv_count u64
//! kv_count × (key: string, value_type u32, value)
//! tensor_count × (name: string, n_dims u32, ne[n_dims] u64, type u32, offset u64)
//! padding to general.alignment (default 32)
//! tensor data: each tensor at data_start + offset (offset a multiple of the alignment)
//! string = len u64, then len bytes of UTF-8
//! ```
//!
//! Tensor dims are ggml's `ne`, innermost first; [`GgufTensor::shape`]
//! gives them outermost first (numpy's and safetensors' order), so a
//! weight `[n, k]` has `ne = [k, n]`.

use std::ops::Range;

use super::error::{Location, ModelFileError};
use super::ggml_type::GgmlType;

/// Default `general.alignment`.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml's `GGML_MAX_DIMS`.
pub const MAX_DIMS: u32 = 4;
/// ggml's `GGML_MAX_NAME` (tensor names are shorter).
pub const MAX_NAME: u64 = 64;
/// Longest metadata key the GGUF specification allows.
pub const MAX_KEY: u64 = 65_535;

/// A metadata value's type id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueType {
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    F32,
    Bool,
    String,
    Array,
    U64,
    I64,
    F64,
}

impl ValueType {
    fn from_id(id: u32) -> Option<ValueType> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// Bytes of a fixed-size value (None: string or array).
    fn size(self) -> Option<u64> {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => Some(1),
            U16 | I16 => Some(2),
            U32 | I32 | F32 => Some(4),
            U64 | I64 | F64 => Some(8),
            String | Array => None,
        }
    }
}

/// A metadata array, not materialized: its element type, length and the
/// bytes it spans in the file.
#[derive(Clone, Debug, PartialEq)]
pub struct MetaArray {
    pub elem: ValueType,
    pub len: u64,
    pub bytes: Range<usize>,
}

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    U64(u64),
    I64(i64),
    F64(f64),
    Array(MetaArray),
}

impl MetaValue {
    /// A non-negative integer of any width.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetaValue::U8(v) => Some(v.into()),
            MetaValue::U16(v) => Some(v.into()),
            MetaValue::U32(v) => Some(v.into()),
            MetaValue::U64(v) => Some(v),
            MetaValue::I8(v) => u64::try_from(v).ok(),
            MetaValue::I16(v) => u64::try_from(v).ok(),
            MetaValue::I32(v) => u64::try_from(v).ok(),
            MetaValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// The type's name, for errors.
    pub fn type_name(&self) -> &'static str {
        match self {
            MetaValue::U8(_) => "u8",
            MetaValue::I8(_) => "i8",
            MetaValue::U16(_) => "u16",
            MetaValue::I16(_) => "i16",
            MetaValue::U32(_) => "u32",
            MetaValue::I32(_) => "i32",
            MetaValue::F32(_) => "f32",
            MetaValue::Bool(_) => "bool",
            MetaValue::String(_) => "string",
            MetaValue::U64(_) => "u64",
            MetaValue::I64(_) => "i64",
            MetaValue::F64(_) => "f64",
            MetaValue::Array(_) => "array",
        }
    }
}

/// One tensor's info, checked against the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GgufTensor {
    pub name: String,
    /// ggml's `ne`, innermost (contiguous) dimension first.
    pub ne: Vec<u64>,
    pub dtype: GgmlType,
    /// Offset of the data from the start of the data section.
    pub offset: u64,
    /// Byte size of the data.
    pub size: u64,
}

impl GgufTensor {
    /// Dimensions outermost first (`[n, k]` for a weight), as usize (the
    /// reader checked each fits).
    pub fn shape(&self) -> Vec<usize> {
        self.ne.iter().rev().map(|&d| d as usize).collect()
    }
}

/// A parsed GGUF header: metadata, tensor infos and where the data starts.
/// The tensor data stays in the caller's buffer (a memory map).
#[derive(Clone, Debug)]
pub struct GgufHeader {
    pub version: u32,
    pub alignment: u64,
    /// Absolute file offset of the data section.
    pub data_start: u64,
    pub metadata: Vec<(String, MetaValue)>,
    pub tensors: Vec<GgufTensor>,
}

impl GgufHeader {
    pub fn meta(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    pub fn tensor(&self, name: &str) -> Option<&GgufTensor> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The absolute byte range of `t`'s data (checked at parse time to lie
    /// inside the file).
    pub fn data_range(&self, t: &GgufTensor) -> Range<usize> {
        let start = (self.data_start + t.offset) as usize;
        start..start + t.size as usize
    }
}

/// Bytes every metadata entry takes at least (key length, one key byte,
/// value type, one value byte).
const MIN_KV_BYTES: u64 = 8 + 1 + 4 + 1;
/// Bytes every tensor info takes at least (name length, one name byte,
/// n_dims, one dim, type, offset).
const MIN_TENSOR_BYTES: u64 = 8 + 1 + 4 + 8 + 4 + 8;

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
    path: &'a str,
}

impl<'a> Reader<'a> {
    fn err(&self, at: &Location, field: &str, why: impl Into<String>) -> ModelFileError {
        ModelFileError::Format {
            path: self.path.to_string(),
            at: at.clone(),
            field: field.to_string(),
            why: why.into(),
        }
    }

    fn left(&self) -> u64 {
        (self.bytes.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, at: &Location, field: &str) -> Result<&'a [u8], ModelFileError> {
        if n > self.left() {
            return Err(self.err(
                at,
                field,
                format!(
                    "needs {n} byte(s) at offset {}, but the file ends after {} (truncated)",
                    self.pos,
                    self.left()
                ),
            ));
        }
        let s = &self.bytes[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn array<const N: usize>(
        &mut self,
        at: &Location,
        field: &str,
    ) -> Result<[u8; N], ModelFileError> {
        let s = self.take(N as u64, at, field)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, at: &Location, field: &str) -> Result<u32, ModelFileError> {
        Ok(u32::from_le_bytes(self.array(at, field)?))
    }

    fn u64(&mut self, at: &Location, field: &str) -> Result<u64, ModelFileError> {
        Ok(u64::from_le_bytes(self.array(at, field)?))
    }

    /// A GGUF string of at most `max` bytes (None: any length the file holds).
    fn string(
        &mut self,
        at: &Location,
        field: &str,
        max: Option<u64>,
    ) -> Result<String, ModelFileError> {
        let len = self.u64(at, &format!("{field} length"))?;
        if let Some(max) = max
            && len > max
        {
            return Err(self.err(
                at,
                field,
                format!("is {len} bytes long; the limit is {max}"),
            ));
        }
        let raw = self.take(len, at, field)?;
        let s = std::str::from_utf8(raw)
            .map_err(|e| self.err(at, field, format!("is not UTF-8 ({e})")))?;
        let mut out = String::new();
        out.try_reserve_exact(s.len())
            .map_err(|e| self.err(at, field, format!("cannot allocate {len} bytes: {e}")))?;
        out.push_str(s);
        Ok(out)
    }

    /// Skip a string, checking it is UTF-8 (array elements are not kept).
    fn skip_string(&mut self, at: &Location, field: &str) -> Result<(), ModelFileError> {
        let len = self.u64(at, &format!("{field} length"))?;
        let raw = self.take(len, at, field)?;
        std::str::from_utf8(raw)
            .map(|_| ())
            .map_err(|e| self.err(at, field, format!("is not UTF-8 ({e})")))
    }

    fn value(&mut self, ty: ValueType, at: &Location) -> Result<MetaValue, ModelFileError> {
        let f = "value";
        Ok(match ty {
            ValueType::U8 => MetaValue::U8(self.array::<1>(at, f)?[0]),
            ValueType::I8 => MetaValue::I8(i8::from_le_bytes(self.array(at, f)?)),
            ValueType::U16 => MetaValue::U16(u16::from_le_bytes(self.array(at, f)?)),
            ValueType::I16 => MetaValue::I16(i16::from_le_bytes(self.array(at, f)?)),
            ValueType::U32 => MetaValue::U32(self.u32(at, f)?),
            ValueType::I32 => MetaValue::I32(i32::from_le_bytes(self.array(at, f)?)),
            ValueType::F32 => MetaValue::F32(f32::from_le_bytes(self.array(at, f)?)),
            ValueType::U64 => MetaValue::U64(self.u64(at, f)?),
            ValueType::I64 => MetaValue::I64(i64::from_le_bytes(self.array(at, f)?)),
            ValueType::F64 => MetaValue::F64(f64::from_le_bytes(self.array(at, f)?)),
            ValueType::Bool => match self.array::<1>(at, f)?[0] {
                0 => MetaValue::Bool(false),
                1 => MetaValue::Bool(true),
                b => return Err(self.err(at, f, format!("bool byte is {b}, not 0 or 1"))),
            },
            ValueType::String => MetaValue::String(self.string(at, f, None)?),
            ValueType::Array => {
                let id = self.u32(at, "array element type")?;
                let elem = ValueType::from_id(id).ok_or_else(|| {
                    self.err(
                        at,
                        "array element type",
                        format!("{id} is not a GGUF value type"),
                    )
                })?;
                if elem == ValueType::Array {
                    return Err(self.err(
                        at,
                        "array element type",
                        "arrays of arrays are not supported (ggml does not read them either)",
                    ));
                }
                let len = self.u64(at, "array length")?;
                let start = self.pos;
                match elem.size() {
                    Some(size) => {
                        let bytes = len.checked_mul(size).filter(|&b| b <= self.left());
                        let Some(bytes) = bytes else {
                            return Err(self.err(
                                at,
                                "array length",
                                format!(
                                    "{len} elements of {size} byte(s) do not fit in the {} byte(s) left (truncated or corrupt)",
                                    self.left()
                                ),
                            ));
                        };
                        self.take(bytes, at, "array data")?;
                    }
                    None => {
                        // Each string takes at least its 8-byte length.
                        if len > self.left() / 8 {
                            return Err(self.err(
                                at,
                                "array length",
                                format!(
                                    "{len} strings cannot fit in the {} byte(s) left (truncated or corrupt)",
                                    self.left()
                                ),
                            ));
                        }
                        for i in 0..len {
                            self.skip_string(at, &format!("array element {i}"))?;
                        }
                    }
                }
                MetaValue::Array(MetaArray {
                    elem,
                    len,
                    bytes: start..self.pos,
                })
            }
        })
    }
}

/// Parse and check a GGUF file held in `bytes` (`path` names it in errors).
pub fn parse(bytes: &[u8], path: &str) -> Result<GgufHeader, ModelFileError> {
    let mut r = Reader {
        bytes,
        pos: 0,
        path,
    };
    let h = Location::Header;
    let magic = r.array::<4>(&h, "magic")?;
    if &magic != b"GGUF" {
        return Err(r.err(
            &h,
            "magic",
            format!("is {magic:02x?}, not \"GGUF\" (47 47 55 46): not a GGUF file"),
        ));
    }
    let version = r.u32(&h, "version")?;
    match version {
        2 | 3 => {}
        1 => {
            return Err(r.err(
                &h,
                "version",
                "is 1 (32-bit counts, from 2023); only versions 2 and 3 are read: convert the file with a current llama.cpp",
            ));
        }
        v if v.swap_bytes() == 2 || v.swap_bytes() == 3 => {
            return Err(r.err(
                &h,
                "version",
                format!(
                    "reads as {v:#x}: a big-endian GGUF file; only little-endian files are read"
                ),
            ));
        }
        v => {
            return Err(r.err(
                &h,
                "version",
                format!("is {v}; only versions 2 and 3 are read"),
            ));
        }
    }
    let tensor_count = r.u64(&h, "tensor_count")?;
    let kv_count = r.u64(&h, "metadata_kv_count")?;
    if kv_count > r.left() / MIN_KV_BYTES {
        return Err(r.err(
            &h,
            "metadata_kv_count",
            format!(
                "{kv_count} entries cannot fit in the {} byte(s) left (each takes at least {MIN_KV_BYTES}): truncated or corrupt",
                r.left()
            ),
        ));
    }
    if tensor_count > r.left() / MIN_TENSOR_BYTES {
        return Err(r.err(
            &h,
            "tensor_count",
            format!(
                "{tensor_count} tensors cannot fit in the {} byte(s) left (each info takes at least {MIN_TENSOR_BYTES}): truncated or corrupt",
                r.left()
            ),
        ));
    }

    let mut metadata: Vec<(String, MetaValue)> = Vec::new();
    for i in 0..kv_count {
        let at = Location::Metadata(format!("#{i}"));
        let key = r.string(&at, "key", Some(MAX_KEY))?;
        let at = Location::Metadata(key.clone());
        if key.is_empty() {
            return Err(r.err(&Location::Metadata(format!("#{i}")), "key", "is empty"));
        }
        if metadata.iter().any(|(k, _)| *k == key) {
            return Err(r.err(&at, "key", "appears twice"));
        }
        let id = r.u32(&at, "value type")?;
        let ty = ValueType::from_id(id)
            .ok_or_else(|| r.err(&at, "value type", format!("{id} is not a GGUF value type")))?;
        let value = r.value(ty, &at)?;
        metadata.push((key, value));
    }

    let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some((_, MetaValue::U32(a))) if a.is_power_of_two() => u64::from(*a),
        Some((k, v)) => {
            return Err(r.err(
                &Location::Metadata(k.clone()),
                "value",
                format!("must be a u32 power of two, found {} {v:?}", v.type_name()),
            ));
        }
    };

    let mut tensors: Vec<GgufTensor> = Vec::new();
    for i in 0..tensor_count {
        let at = Location::Tensor(format!("#{i}"));
        let name = r.string(&at, "name", Some(MAX_NAME))?;
        if name.is_empty() {
            return Err(r.err(&at, "name", "is empty"));
        }
        let at = Location::Tensor(name.clone());
        if tensors.iter().any(|t| t.name == name) {
            return Err(r.err(&at, "name", "appears twice"));
        }
        let n_dims = r.u32(&at, "n_dims")?;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(r.err(
                &at,
                "n_dims",
                format!("is {n_dims}; ggml tensors have 1 to {MAX_DIMS}"),
            ));
        }
        let mut ne = Vec::new();
        let mut elements: u64 = 1;
        for d in 0..n_dims {
            let field = format!("ne[{d}]");
            let v = r.u64(&at, &field)?;
            if v == 0 {
                return Err(r.err(&at, &field, "is 0 (empty tensors are not loaded)"));
            }
            elements = elements
                .checked_mul(v)
                .filter(|&e| e <= i64::MAX as u64 && usize::try_from(e).is_ok())
                .ok_or_else(|| {
                    r.err(
                        &at,
                        &field,
                        format!("{v} makes the element count overflow (absurd dimension)"),
                    )
                })?;
            ne.push(v);
        }
        let id = r.u32(&at, "type")?;
        let dtype = GgmlType::from_id(id)
            .ok_or_else(|| r.err(&at, "type", format!("{id} is not a ggml type id")))?;
        let offset = r.u64(&at, "offset")?;
        if !offset.is_multiple_of(alignment) {
            return Err(r.err(
                &at,
                "offset",
                format!("{offset} is not a multiple of the alignment {alignment} (misaligned)"),
            ));
        }
        let row = dtype.row_bytes(ne[0]).ok_or_else(|| {
            r.err(
                &at,
                "ne[0]",
                format!(
                    "{} is not a whole number of {dtype} blocks of {} weights",
                    ne[0],
                    dtype.block_len()
                ),
            )
        })?;
        let size = row
            .checked_mul(elements / ne[0])
            .ok_or_else(|| r.err(&at, "ne", "the byte size overflows (absurd dimensions)"))?;
        tensors.push(GgufTensor {
            name,
            ne,
            dtype,
            offset,
            size,
        });
    }

    let end_of_infos = r.pos as u64;
    let data_start = end_of_infos.next_multiple_of(alignment);
    let file_len = bytes.len() as u64;
    if !tensors.is_empty() && data_start > file_len {
        return Err(r.err(
            &h,
            "data section",
            format!(
                "starts at {data_start} (after the tensor infos, aligned to {alignment}), past the end of the {file_len}-byte file (truncated)"
            ),
        ));
    }
    let data_len = file_len.saturating_sub(data_start);
    for t in &tensors {
        let end = t.offset.checked_add(t.size);
        if end.is_none_or(|e| e > data_len) {
            return Err(r.err(
                &Location::Tensor(t.name.clone()),
                "offset",
                format!(
                    "data [{}, {}+{}) lies past the end of the {data_len}-byte data section (truncated or corrupt)",
                    t.offset, t.offset, t.size
                ),
            ));
        }
    }
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_by_key(|&i| tensors[i].offset);
    for w in order.windows(2) {
        let (a, b) = (&tensors[w[0]], &tensors[w[1]]);
        if a.offset + a.size > b.offset {
            return Err(r.err(
                &Location::Tensor(b.name.clone()),
                "offset",
                format!(
                    "data at {} overlaps tensor `{}` ({} bytes at {})",
                    b.offset, a.name, a.size, a.offset
                ),
            ));
        }
    }
    Ok(GgufHeader {
        version,
        alignment,
        data_start,
        metadata,
        tensors,
    })
}
