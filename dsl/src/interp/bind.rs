//! Binding validation: resolve axis extents, check every bound tensor against
//! its declaration, and give the ops uniform access to logical elements.

use super::{Bindings, InterpError, Value};
use crate::ir::{Extent, Format, Kernel, Role, Tensor};
use crate::quant::QuantTensor;

/// A kernel with every axis extent resolved and every binding checked for
/// names; tensors are checked when an op asks for them.
pub(crate) struct Env<'a> {
    kernel: &'a Kernel,
    bindings: &'a Bindings,
    extents: Vec<(&'a str, usize)>,
}

impl<'a> Env<'a> {
    pub(crate) fn new(kernel: &'a Kernel, bindings: &'a Bindings) -> Result<Self, InterpError> {
        let extent_names: Vec<&str> = bindings.extents.iter().map(|(n, _)| n.as_str()).collect();
        let tensor_names: Vec<&str> = bindings.tensors.iter().map(|(n, _)| n.as_str()).collect();
        for names in [&extent_names, &tensor_names] {
            if let Some(name) = first_duplicate(names) {
                return Err(InterpError::DuplicateBinding {
                    name: name.to_string(),
                });
            }
        }
        for name in &extent_names {
            if kernel.axis(name).is_none() {
                return Err(InterpError::UnknownAxisBinding {
                    axis: name.to_string(),
                });
            }
        }
        for name in &tensor_names {
            match kernel.tensor(name) {
                Some(t) if t.role != Role::Output => {}
                _ => {
                    return Err(InterpError::UnknownTensorBinding {
                        tensor: name.to_string(),
                    });
                }
            }
        }
        let mut extents = Vec::with_capacity(kernel.axes.len());
        for axis in &kernel.axes {
            let bound = bindings
                .extents
                .iter()
                .find(|(n, _)| *n == axis.name)
                .map(|&(_, n)| n);
            let n = match (axis.extent, bound) {
                (Extent::Fixed(fixed), Some(b)) if b != fixed as usize => {
                    return Err(InterpError::FixedExtent {
                        axis: axis.name.clone(),
                        fixed: fixed as usize,
                        bound: b,
                    });
                }
                (Extent::Fixed(fixed), _) => fixed as usize,
                (Extent::Dyn, Some(b)) => b,
                (Extent::Dyn, None) => {
                    return Err(InterpError::UnboundAxis {
                        axis: axis.name.clone(),
                    });
                }
            };
            extents.push((axis.name.as_str(), n));
        }
        Ok(Env {
            kernel,
            bindings,
            extents,
        })
    }

    /// The resolved extent of `axis`.
    pub(crate) fn extent(&self, axis: &str) -> Result<usize, InterpError> {
        self.extents
            .iter()
            .find(|(n, _)| *n == axis)
            .map(|&(_, n)| n)
            .ok_or_else(|| InterpError::UndeclaredAxis {
                axis: axis.to_string(),
            })
    }

    /// The declaration of tensor `name`.
    pub(crate) fn decl(&self, name: &str) -> Result<&'a Tensor, InterpError> {
        self.kernel
            .tensor(name)
            .ok_or_else(|| InterpError::UndeclaredTensor {
                tensor: name.to_string(),
            })
    }

    /// Shape of tensor `name`, whose dims must be exactly `axes` in any order
    /// (with `last`, if given, as the innermost dim).
    fn shape(&self, name: &str, axes: &[&str], last: Option<&str>) -> Result<Shape, InterpError> {
        let decl = self.decl(name)?;
        let dims_err = || InterpError::Dims {
            tensor: name.to_string(),
            expected: match last {
                Some(l) => format!("[{}] in any order with `{l}` last", axes.join(", ")),
                None => format!("[{}] in any order", axes.join(", ")),
            },
            got: decl.dims.clone(),
        };
        let is_permutation = decl.dims.len() == axes.len()
            && axes
                .iter()
                .all(|a| decl.dims.iter().filter(|d| d.as_str() == *a).count() == 1);
        if !is_permutation || last.is_some_and(|l| decl.dims.last().map(String::as_str) != Some(l))
        {
            return Err(dims_err());
        }
        // Strides of the bound (row-major over decl.dims) data, per dim.
        let mut dim_strides = vec![0usize; decl.dims.len()];
        let mut len = 1usize;
        for (i, dim) in decl.dims.iter().enumerate().rev() {
            dim_strides[i] = len;
            len = len
                .checked_mul(self.extent(dim)?)
                .ok_or_else(|| InterpError::Overflow {
                    what: format!("tensor `{name}`"),
                })?;
        }
        let mut extents = Vec::with_capacity(axes.len());
        let mut strides = Vec::with_capacity(axes.len());
        for a in axes {
            let i = decl.dims.iter().position(|d| d == a).ok_or_else(dims_err)?;
            extents.push(self.extent(a)?);
            strides.push(dim_strides[i]);
        }
        Ok(Shape {
            extents,
            strides,
            len,
        })
    }

    /// A bound input, weight or cache tensor, checked against its declaration.
    ///
    /// `axes` is the op's canonical order of the tensor's axes; `reduction`
    /// names the axis that must be the columns of a quantized binding (None:
    /// the tensor may not be quantized).
    pub(crate) fn input(
        &self,
        name: &str,
        axes: &[&str],
        reduction: Option<&str>,
    ) -> Result<Operand<'a>, InterpError> {
        let decl = self.decl(name)?;
        let format = decl.format;
        let quantized = !matches!(
            format,
            Format::F32 | Format::F16 | Format::BF16 | Format::I8Dyn
        );
        if reduction.is_none() && !matches!(format, Format::F32 | Format::F16 | Format::BF16) {
            return Err(InterpError::UnsupportedFormat {
                tensor: name.to_string(),
                format,
                why: "this operand must be f32, f16 or bf16",
            });
        }
        let shape = self.shape(name, axes, if quantized { reduction } else { None })?;
        let value = self
            .bindings
            .tensors
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v)
            .ok_or_else(|| InterpError::UnboundTensor {
                tensor: name.to_string(),
            })?;
        let wrong = |expected: &'static str| InterpError::WrongValue {
            tensor: name.to_string(),
            format,
            expected,
            got: value.kind(),
        };
        let got_len = match (format, value) {
            (Format::F32 | Format::I8Dyn, Value::F32(v)) => v.len(),
            (Format::F32 | Format::I8Dyn, _) => return Err(wrong("Value::F32")),
            (Format::F16, Value::F16(v)) => v.len(),
            (Format::F16, _) => return Err(wrong("Value::F16")),
            (Format::BF16, Value::BF16(v)) => v.len(),
            (Format::BF16, _) => return Err(wrong("Value::BF16")),
            (_, Value::Quant(q)) if q.format == format => {
                let cols = reduction.map_or(Ok(1), |r| self.extent(r))?;
                let rows = match shape.len.checked_div(cols) {
                    Some(rows) => rows,
                    // No columns: the rows are the other axes' product.
                    None => {
                        let mut rows = 1usize;
                        for (a, &n) in axes.iter().zip(&shape.extents) {
                            if Some(*a) != reduction {
                                rows =
                                    rows.checked_mul(n).ok_or_else(|| InterpError::Overflow {
                                        what: format!("rows of tensor `{name}`"),
                                    })?;
                            }
                        }
                        rows
                    }
                };
                if q.rows != rows || q.cols != cols {
                    return Err(InterpError::QuantShape {
                        tensor: name.to_string(),
                        expected_rows: rows,
                        expected_cols: cols,
                        rows: q.rows,
                        cols: q.cols,
                    });
                }
                q.validate().map_err(|source| InterpError::Quant {
                    tensor: name.to_string(),
                    source,
                })?;
                shape.len
            }
            (_, _) => return Err(wrong("Value::Quant with the declared format")),
        };
        if got_len != shape.len {
            return Err(InterpError::Length {
                tensor: name.to_string(),
                expected: shape.len,
                got: got_len,
            });
        }
        Ok(Operand {
            format,
            value,
            shape,
        })
    }

    /// An output tensor: dims exactly `axes` in any order, format f32, f16 or
    /// bf16.
    pub(crate) fn output(&self, name: &str, axes: &[&str]) -> Result<OutputSlot, InterpError> {
        let decl = self.decl(name)?;
        if !matches!(decl.format, Format::F32 | Format::F16 | Format::BF16) {
            return Err(InterpError::UnsupportedFormat {
                tensor: name.to_string(),
                format: decl.format,
                why: "outputs must be f32, f16 or bf16",
            });
        }
        let shape = self.shape(name, axes, None)?;
        Ok(OutputSlot {
            name: name.to_string(),
            format: decl.format,
            shape,
        })
    }
}

fn first_duplicate<'s>(names: &[&'s str]) -> Option<&'s str> {
    names
        .iter()
        .enumerate()
        .find(|(i, n)| names[..*i].contains(n))
        .map(|(_, n)| *n)
}

/// Extents of a tensor's axes in the op's canonical order, and the stride of
/// each in the bound (row-major over the declared dims) data.
#[derive(Clone, Debug)]
pub(crate) struct Shape {
    pub(crate) extents: Vec<usize>,
    strides: Vec<usize>,
    pub(crate) len: usize,
}

impl Shape {
    /// Offset in the bound data of the canonical index `idx`.
    pub(crate) fn flat(&self, idx: &[usize]) -> usize {
        idx.iter().zip(&self.strides).map(|(i, s)| i * s).sum()
    }

    /// Offsets in the bound data, visited in canonical row-major order.
    fn for_each_flat(&self, mut f: impl FnMut(usize)) {
        if self.len == 0 {
            return;
        }
        let mut idx = vec![0usize; self.extents.len()];
        loop {
            f(self.flat(&idx));
            let mut k = idx.len();
            loop {
                if k == 0 {
                    return;
                }
                k -= 1;
                idx[k] += 1;
                if idx[k] < self.extents[k] {
                    break;
                }
                idx[k] = 0;
            }
        }
    }
}

/// A validated bound tensor.
pub(crate) struct Operand<'a> {
    pub(crate) format: Format,
    value: &'a Value,
    pub(crate) shape: Shape,
}

impl Operand<'_> {
    /// Element at bound offset `flat`, widened to f64 (quantized elements
    /// through their f32 dequantization).
    fn at(&self, flat: usize) -> f64 {
        match self.value {
            Value::F32(v) => f64::from(v[flat]),
            Value::F16(v) => f64::from(v[flat]),
            Value::BF16(v) => f64::from(v[flat]),
            Value::Quant(q) => f64::from(q.value(flat / q.cols, flat % q.cols)),
        }
    }

    /// All elements widened to f64, row-major in canonical axis order.
    pub(crate) fn dense_f64(&self, what: &str) -> Result<Vec<f64>, InterpError> {
        let mut out = alloc(self.shape.len, what)?;
        self.shape.for_each_flat(|flat| out.push(self.at(flat)));
        Ok(out)
    }

    /// The f32 data of an f32 / i8dyn binding, row-major in canonical order.
    pub(crate) fn dense_f32(&self, what: &str) -> Result<Vec<f32>, InterpError> {
        let mut out = alloc(self.shape.len, what)?;
        self.shape
            .for_each_flat(|flat| out.push(self.at(flat) as f32));
        Ok(out)
    }

    /// The quantized binding, if any.
    pub(crate) fn quant(&self) -> Option<&QuantTensor> {
        match self.value {
            Value::Quant(q) => Some(q),
            _ => None,
        }
    }
}

/// Where an output is written.
pub(crate) struct OutputSlot {
    pub(crate) name: String,
    pub(crate) format: Format,
    pub(crate) shape: Shape,
}

impl OutputSlot {
    /// A zeroed buffer for the output, row-major over its declared dims.
    pub(crate) fn buffer(&self) -> Result<Vec<f32>, InterpError> {
        let mut out = alloc(self.shape.len, &format!("output `{}`", self.name))?;
        out.resize(self.shape.len, 0.0);
        Ok(out)
    }
}

/// An empty vector with room for `n` elements, or an error instead of an
/// allocation abort.
pub(crate) fn alloc<T>(n: usize, what: &str) -> Result<Vec<T>, InterpError> {
    let mut v = Vec::new();
    v.try_reserve_exact(n)
        .map_err(|_| InterpError::Allocation {
            what: what.to_string(),
            elements: n,
        })?;
    Ok(v)
}
