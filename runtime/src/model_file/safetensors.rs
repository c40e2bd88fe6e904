//! safetensors files, read with Hugging Face's `safetensors` crate (its
//! header parser checks the header size, that tensors tile the data
//! section with no gap or overlap, and that each tensor's byte size matches
//! its dtype and shape). Only the tensor table is kept here; the data stays
//! in the memory map. F32, F16 and BF16 tensors load (as ggml's types of
//! the same name); other dtypes are listed and refused by name.

use std::ops::Range;

use safetensors::{Dtype, SafeTensors};

use super::error::{Location, ModelFileError};
use super::ggml_type::GgmlType;

/// One tensor of a safetensors file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SafeTensor {
    pub name: String,
    /// The element type when Tessera loads it, else the dtype's name.
    pub dtype: Result<GgmlType, String>,
    pub shape: Vec<usize>,
    /// Absolute byte range in the file.
    pub bytes: Range<usize>,
}

fn ggml_type(d: Dtype) -> Result<GgmlType, String> {
    match d {
        Dtype::F32 => Ok(GgmlType::F32),
        Dtype::F16 => Ok(GgmlType::F16),
        Dtype::BF16 => Ok(GgmlType::BF16),
        other => Err(format!("{other:?}")),
    }
}

/// The tensor table of a safetensors file held in `bytes`, in data order.
pub fn parse(bytes: &[u8], path: &str) -> Result<Vec<SafeTensor>, ModelFileError> {
    let err = |why: String| ModelFileError::Format {
        path: path.to_string(),
        at: Location::Header,
        field: "safetensors header".into(),
        why,
    };
    let (header_len, metadata) =
        SafeTensors::read_metadata(bytes).map_err(|e| err(format!("{e:?}")))?;
    let data_start = 8 + header_len;
    let mut out: Vec<SafeTensor> = Vec::new();
    for name in metadata.offset_keys() {
        let info = metadata
            .info(&name)
            .ok_or_else(|| err(format!("tensor `{name}` is listed but has no info")))?;
        let (s, e) = info.data_offsets;
        let range = data_start
            .checked_add(s)
            .zip(data_start.checked_add(e))
            .filter(|(a, b)| a <= b && *b <= bytes.len())
            .map(|(a, b)| a..b)
            .ok_or_else(|| ModelFileError::Format {
                path: path.to_string(),
                at: Location::Tensor(name.clone()),
                field: "data_offsets".into(),
                why: format!("[{s}, {e}) lies outside the file"),
            })?;
        let shape = info.shape.clone();
        out.push(SafeTensor {
            name,
            dtype: ggml_type(info.dtype),
            shape,
            bytes: range,
        });
    }
    Ok(out)
}
