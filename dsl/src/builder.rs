//! A small builder for [`Kernel`]s: what the `kernel!` macro expands to and
//! what the built-in library uses. `build()` runs [`verify`], so a builder
//! never yields an inconsistent kernel.

use crate::ir::*;
use crate::verify::{VerifyError, verify};

/// Accumulates the parts of a kernel; see the module doc.
#[derive(Clone, Debug)]
pub struct KernelBuilder {
    name: String,
    axes: Vec<Axis>,
    tensors: Vec<Tensor>,
    op: Option<Op>,
    schedule: Schedule,
}

impl KernelBuilder {
    pub fn new(name: impl Into<String>) -> Self {
        KernelBuilder {
            name: name.into(),
            axes: Vec::new(),
            tensors: Vec::new(),
            op: None,
            schedule: Schedule::default(),
        }
    }

    pub fn axis(mut self, name: &str, extent: Extent, kind: AxisKind) -> Self {
        self.axes.push(Axis {
            name: name.to_string(),
            extent,
            kind,
        });
        self
    }

    /// A spatial axis bound at call time.
    pub fn dyn_axis(self, name: &str) -> Self {
        self.axis(name, Extent::Dyn, AxisKind::Spatial)
    }

    /// A reduction axis bound at call time.
    pub fn reduce_axis(self, name: &str) -> Self {
        self.axis(name, Extent::Dyn, AxisKind::Reduce)
    }

    pub fn tile(mut self, name: &str, axis: &str, size: TileSize) -> Self {
        self.schedule.tiles.push(TileVar {
            name: name.to_string(),
            axis: axis.to_string(),
            size,
        });
        self
    }

    /// A tensor in row-major layout over its dims.
    pub fn tensor(self, name: &str, role: Role, dims: &[&str], format: Format) -> Self {
        let layout = Layout::row_major(dims);
        self.tensor_with_layout(name, role, dims, format, layout)
    }

    pub fn tensor_with_layout(
        mut self,
        name: &str,
        role: Role,
        dims: &[&str],
        format: Format,
        layout: Layout,
    ) -> Self {
        self.tensors.push(Tensor {
            name: name.to_string(),
            role,
            dims: dims.iter().map(|d| d.to_string()).collect(),
            format,
            layout,
        });
        self
    }

    pub fn op(mut self, op: Op) -> Self {
        self.op = Some(op);
        self
    }

    pub fn parallel(mut self, axis: &str) -> Self {
        self.schedule.parallel.push(axis.to_string());
        self
    }

    pub fn split(mut self, axis: &str) -> Self {
        self.schedule.split = Some(axis.to_string());
        self
    }

    /// Assemble and verify.
    pub fn build(self) -> Result<Kernel, VerifyError> {
        let op = self.op.ok_or(VerifyError::MissingOp)?;
        let kernel = Kernel {
            name: self.name,
            axes: self.axes,
            tensors: self.tensors,
            op,
            schedule: self.schedule,
        };
        verify(&kernel)?;
        Ok(kernel)
    }
}

impl LayoutDim {
    pub fn whole(axis: &str) -> Self {
        LayoutDim::Whole(axis.to_string())
    }
    pub fn outer(axis: &str, tile: &str) -> Self {
        LayoutDim::Outer {
            axis: axis.to_string(),
            tile: tile.to_string(),
        }
    }
    pub fn inner(tile: &str) -> Self {
        LayoutDim::Inner {
            tile: tile.to_string(),
        }
    }
}
