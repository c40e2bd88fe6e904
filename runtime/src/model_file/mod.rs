//! Model files as a weights source: open a GGUF or safetensors file
//! (memory-mapped, never copied), list its tensors, and make a [`Linear`]
//! from a named tensor on any [`Device`], packed once.
//!
//! - [`gguf`]: a strict GGUF v2/v3 reader (header, metadata, tensor infos,
//!   alignment, data offsets), every field checked against the file.
//! - [`mod@safetensors`]: the tensor table of a safetensors file, through
//!   Hugging Face's `safetensors` crate.
//! - [`ggml_type`]: ggml's tensor types and their block geometry.
//! - [`kquants`]: Q4_K and Q6_K dequantized exactly as ggml does.
//! - [`convert`]: a tensor's bytes into a kernel's weights, and what that
//!   did to the values ([`Conversion`]: repacked bit for bit, exact, or
//!   requantized with its error).
//!
//! Which format a file type loads into ([`weight_format_for`]): Q4_0,
//! Q4_1, Q8_0 → `q4_0`, `q4_1`, `q8_0` (repacked, ggml's values bit for
//! bit); F16 → `f16`; F32 and BF16 → `f32`; Q4_K → `q4_1` and Q6_K →
//! `q8_0` (requantized from ggml's exact values, error reported).
//! [`ModelFile::linear`] takes any format the caller names instead.

use std::path::Path;
use std::sync::Arc;

use tessera_dsl::ir::Format;

use crate::backend::Device;
use crate::error::RuntimeError;
use crate::format::WeightFormat;
use crate::linear::{Linear, Weights};

pub mod convert;
pub mod error;
pub mod ggml_type;
pub mod gguf;
pub mod kquants;
pub mod safetensors;

pub use convert::{Conversion, ErrorStats, OwnedWeights};
pub use error::{Location, ModelFileError};
pub use ggml_type::GgmlType;
pub use gguf::{GgufHeader, GgufTensor, MetaValue};

/// A tensor's element type as the file stores it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TensorType {
    Ggml(GgmlType),
    /// A safetensors dtype Tessera does not load (its name).
    Other(String),
}

impl std::fmt::Display for TensorType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TensorType::Ggml(t) => f.pad(t.name()),
            TensorType::Other(s) => f.pad(s),
        }
    }
}

/// A tensor as [`ModelFile::tensors`] lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    /// Outermost dimension first: a weight is `[n, k]`.
    pub shape: Vec<usize>,
    pub dtype: TensorType,
}

/// The file's bytes: a read-only memory map (or, for tests, owned bytes).
enum Backing {
    Map(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Backing::Map(m) => m,
            Backing::Owned(v) => v,
        }
    }
}

enum Kind {
    Gguf(GgufHeader),
    Safetensors(Vec<safetensors::SafeTensor>),
}

/// An open model file.
pub struct ModelFile {
    path: String,
    data: Backing,
    kind: Kind,
}

impl std::fmt::Debug for ModelFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelFile")
            .field("path", &self.path)
            .field("format", &self.format_name())
            .field("tensors", &self.tensor_count())
            .finish()
    }
}

/// A [`Linear`] made from a file tensor, with what loading did to it.
#[derive(Debug)]
pub struct LoadedLinear {
    pub linear: Linear,
    pub format: WeightFormat,
    pub conversion: Conversion,
}

/// The runtime format a file type loads into by default (see the module
/// table); None for types Tessera does not load.
pub fn weight_format_for(dtype: GgmlType) -> Option<WeightFormat> {
    Some(match dtype {
        GgmlType::Q4_0 => WeightFormat::Q4_0,
        GgmlType::Q4_1 => WeightFormat::Q4_1,
        GgmlType::Q8_0 => WeightFormat::Q8_0,
        GgmlType::F16 => WeightFormat::F16,
        GgmlType::F32 | GgmlType::BF16 => WeightFormat::F32,
        GgmlType::Q4_K => WeightFormat::Q4_1,
        GgmlType::Q6_K => WeightFormat::Q8_0,
        _ => return None,
    })
}

/// The formats [`ModelFile::linear_on`] tries for a file type, in order:
/// the default, then formats that keep every value (other backends run
/// them), then lossy ones.
pub fn format_candidates(dtype: GgmlType) -> Vec<WeightFormat> {
    use WeightFormat::*;
    match dtype {
        GgmlType::Q4_0 => vec![Q4_0, Q4_0A16, W4A8, W4A16, F32],
        GgmlType::Q4_1 => vec![Q4_1, Q4_1A16, W4A8, W4A16, F32],
        GgmlType::Q8_0 => vec![Q8_0, Q8_0A16, F32, F16, W8A8, W8A16],
        GgmlType::Q4_K => vec![Q4_1, Q4_1A16, W4A8, W4A16, Q4_0, F32, F16],
        GgmlType::Q6_K => vec![Q8_0, Q8_0A16, F32, F16, W8A8, W8A16],
        GgmlType::F32 | GgmlType::BF16 => vec![F32, F16],
        GgmlType::F16 => vec![F16, F32],
        _ => Vec::new(),
    }
}

/// The weight format of `format`'s library kernel.
pub fn kernel_weight_format(format: WeightFormat) -> Result<Format, RuntimeError> {
    let kernel = tessera_dsl::library::get(format.library_kernel())?;
    kernel
        .as_matmul()
        .and_then(|m| kernel.tensor(&m.w))
        .map(|t| t.format)
        .ok_or_else(|| RuntimeError::NoKernel {
            what: format.library_kernel().to_string(),
            why: "not a matmul with a weight tensor".into(),
        })
}

impl ModelFile {
    /// Open and check a GGUF (by its magic) or safetensors file.
    pub fn open(path: impl AsRef<Path>) -> Result<ModelFile, ModelFileError> {
        let p = path.as_ref();
        let name = p.display().to_string();
        let io = |source| ModelFileError::Io {
            path: name.clone(),
            source,
        };
        let file = std::fs::File::open(p).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        let data = if len == 0 {
            Backing::Owned(Vec::new())
        } else {
            // SAFETY: the map is read-only and lives as long as the
            // ModelFile, which only hands out borrows of it. As with any
            // file mapping, another process truncating or rewriting the
            // file while it is open makes reads see the new bytes or fault:
            // model files must not be modified while they are open.
            Backing::Map(unsafe { memmap2::Mmap::map(&file) }.map_err(io)?)
        };
        Self::from_backing(name, data)
    }

    /// Check a file already in memory (`name` names it in errors).
    pub fn from_bytes(name: &str, bytes: Vec<u8>) -> Result<ModelFile, ModelFileError> {
        Self::from_backing(name.to_string(), Backing::Owned(bytes))
    }

    fn from_backing(path: String, data: Backing) -> Result<ModelFile, ModelFileError> {
        let bytes = data.bytes();
        let kind = if bytes.starts_with(b"GGUF")
            || !(path.ends_with(".safetensors") || bytes.get(8) == Some(&b'{'))
        {
            Kind::Gguf(gguf::parse(bytes, &path)?)
        } else {
            Kind::Safetensors(safetensors::parse(bytes, &path)?)
        };
        Ok(ModelFile { path, data, kind })
    }

    pub fn path(&self) -> &str {
        &self.path
    }

    /// `GGUF v3` or `safetensors`.
    pub fn format_name(&self) -> String {
        match &self.kind {
            Kind::Gguf(h) => format!("GGUF v{}", h.version),
            Kind::Safetensors(_) => "safetensors".into(),
        }
    }

    /// The GGUF header (metadata, tensor infos), for GGUF files.
    pub fn gguf(&self) -> Option<&GgufHeader> {
        match &self.kind {
            Kind::Gguf(h) => Some(h),
            Kind::Safetensors(_) => None,
        }
    }

    pub fn tensor_count(&self) -> usize {
        match &self.kind {
            Kind::Gguf(h) => h.tensors.len(),
            Kind::Safetensors(t) => t.len(),
        }
    }

    /// Every tensor, in file order, with its shape (outermost first) and
    /// type.
    pub fn tensors(&self) -> Vec<TensorInfo> {
        match &self.kind {
            Kind::Gguf(h) => h
                .tensors
                .iter()
                .map(|t| TensorInfo {
                    name: t.name.clone(),
                    shape: t.shape(),
                    dtype: TensorType::Ggml(t.dtype),
                })
                .collect(),
            Kind::Safetensors(ts) => ts
                .iter()
                .map(|t| TensorInfo {
                    name: t.name.clone(),
                    shape: t.shape.clone(),
                    dtype: match &t.dtype {
                        Ok(g) => TensorType::Ggml(*g),
                        Err(s) => TensorType::Other(s.clone()),
                    },
                })
                .collect(),
        }
    }

    pub fn tensor(&self, name: &str) -> Result<TensorInfo, ModelFileError> {
        self.tensors()
            .into_iter()
            .find(|t| t.name == name)
            .ok_or_else(|| ModelFileError::NoTensor {
                path: self.path.clone(),
                tensor: name.to_string(),
            })
    }

    /// A loadable tensor's type, shape and bytes (refusing unsupported
    /// types by name).
    fn raw(&self, name: &str) -> Result<(GgmlType, Vec<usize>, &[u8]), ModelFileError> {
        let bytes = self.data.bytes();
        let unsupported = |dtype: String| ModelFileError::UnsupportedType {
            path: self.path.clone(),
            tensor: name.to_string(),
            dtype,
            supported: ggml_type::supported_names(),
        };
        let no_tensor = || ModelFileError::NoTensor {
            path: self.path.clone(),
            tensor: name.to_string(),
        };
        let (dtype, shape, range) = match &self.kind {
            Kind::Gguf(h) => {
                let t = h.tensor(name).ok_or_else(no_tensor)?;
                (t.dtype, t.shape(), h.data_range(t))
            }
            Kind::Safetensors(ts) => {
                let t = ts.iter().find(|t| t.name == name).ok_or_else(no_tensor)?;
                let dtype = t.dtype.clone().map_err(unsupported)?;
                (dtype, t.shape.clone(), t.bytes.clone())
            }
        };
        if !dtype.is_supported() {
            return Err(unsupported(dtype.name().to_string()));
        }
        Ok((dtype, shape, &bytes[range]))
    }

    fn quant_err(&self, name: &str) -> impl Fn(tessera_dsl::quant::QuantError) -> ModelFileError {
        let (path, tensor) = (self.path.clone(), name.to_string());
        move |source| ModelFileError::Quant {
            path: path.clone(),
            tensor: tensor.clone(),
            source,
        }
    }

    /// `[n, k]` of a 2-D tensor.
    fn matrix_shape(&self, name: &str, shape: &[usize]) -> Result<(usize, usize), ModelFileError> {
        match *shape {
            [n, k] => Ok((n, k)),
            _ => Err(ModelFileError::Tensor {
                path: self.path.clone(),
                tensor: name.to_string(),
                why: format!("has shape {shape:?}; a linear layer's weight is 2-D [n, k]"),
            }),
        }
    }

    /// The tensor's values exactly as ggml (or the file's float type)
    /// gives them, row-major.
    pub fn dequantize(&self, name: &str) -> Result<Vec<f32>, ModelFileError> {
        let (dtype, shape, bytes) = self.raw(name)?;
        let inner = shape.last().copied().unwrap_or(1);
        let outer = shape.iter().rev().skip(1).product::<usize>();
        convert::dequantize(dtype, outer, inner, bytes).map_err(self.quant_err(name))
    }

    /// A 2-D tensor as weights in `target` (a kernel's weight format), its
    /// `[n, k]`, and what the conversion did.
    pub fn weights(
        &self,
        name: &str,
        target: Format,
    ) -> Result<(OwnedWeights, Conversion, [usize; 2]), ModelFileError> {
        let (dtype, shape, bytes) = self.raw(name)?;
        let (n, k) = self.matrix_shape(name, &shape)?;
        let (w, c) = convert::convert(dtype, n, k, bytes, target).map_err(self.quant_err(name))?;
        Ok((w, c, [n, k]))
    }

    /// The format the tensor loads into by default ([`weight_format_for`]).
    pub fn default_format(&self, name: &str) -> Result<WeightFormat, ModelFileError> {
        let (dtype, _, _) = self.raw(name)?;
        Ok(weight_format_for(dtype).expect("supported types have a format"))
    }

    /// A linear layer `y = x · wᵀ + bias` from the 2-D tensor `name`
    /// (`[n, k]`) in `format` on `device`, packed once.
    pub fn linear(
        &self,
        device: &Arc<Device>,
        name: &str,
        format: WeightFormat,
        bias: Option<&[f32]>,
    ) -> Result<LoadedLinear, ModelFileError> {
        let runtime = |source: RuntimeError| ModelFileError::Runtime {
            path: self.path.clone(),
            tensor: name.to_string(),
            source: Box::new(source),
        };
        let target = kernel_weight_format(format).map_err(runtime)?;
        let (w, conversion, [n, k]) = self.weights(name, target)?;
        let weights = match &w {
            OwnedWeights::F32(v) => Weights::F32(v),
            OwnedWeights::Quant(t) => Weights::Quant(t),
        };
        let linear = Linear::new(device, format, weights, n, k, bias).map_err(runtime)?;
        Ok(LoadedLinear {
            linear,
            format,
            conversion,
        })
    }

    /// [`Self::linear`] in the first of [`format_candidates`] the device
    /// runs: the file's own format where it can, else one that keeps every
    /// value, else a lossy one (the returned conversion says which).
    pub fn linear_on(
        &self,
        device: &Arc<Device>,
        name: &str,
        bias: Option<&[f32]>,
    ) -> Result<LoadedLinear, ModelFileError> {
        let (dtype, _, _) = self.raw(name)?;
        let mut refusals = Vec::new();
        for format in format_candidates(dtype) {
            match self.linear(device, name, format, bias) {
                Ok(l) => return Ok(l),
                Err(ModelFileError::Runtime { source, .. }) => {
                    refusals.push(format!("{format}: {source}"))
                }
                Err(e) => return Err(e),
            }
        }
        Err(ModelFileError::Tensor {
            path: self.path.clone(),
            tensor: name.to_string(),
            why: format!(
                "no format for {dtype} weights runs on backend {}: {}",
                device.backend(),
                refusals.join("; ")
            ),
        })
    }
}
