//! Printing: `Display` for [`Kernel`] (the canonical text) and for the
//! pieces other code reuses ([`Layout`], [`LayoutDim`]).

use std::fmt;

use crate::ir::*;

impl fmt::Display for LayoutDim {
    /// `h`, `h/hp` (number of tiles of `h`) or `hp` (position in a tile).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LayoutDim::Whole(axis) => f.write_str(axis),
            LayoutDim::Outer { axis, tile } => write!(f, "{axis}/{tile}"),
            LayoutDim::Inner { tile } => f.write_str(tile),
        }
    }
}

impl fmt::Display for Layout {
    /// `[h/hp, l/lp, hp, lp]`, then ` pair-transpose` and ` signed-codes`
    /// where set.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        write_list(f, &self.dims)?;
        f.write_str("]")?;
        if self.int4_pair_transpose {
            f.write_str(" pair-transpose")?;
        }
        if self.int4_signed_codes {
            f.write_str(" signed-codes")?;
        }
        Ok(())
    }
}

fn write_list<T: fmt::Display>(f: &mut fmt::Formatter<'_>, items: &[T]) -> fmt::Result {
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            f.write_str(", ")?;
        }
        write!(f, "{item}")?;
    }
    Ok(())
}

/// `name[a, b]`: a tensor with index names.
fn indexed(f: &mut fmt::Formatter<'_>, name: &str, idx: &[&str]) -> fmt::Result {
    write!(f, "{name}[")?;
    write_list(f, idx)?;
    f.write_str("]")
}

pub(crate) fn role_word(role: Role) -> &'static str {
    match role {
        Role::Input => "input",
        Role::Weight => "weight",
        Role::Output => "output",
        Role::Cache => "cache",
    }
}

pub(crate) fn activation_word(act: Activation) -> &'static str {
    match act {
        Activation::None => "none",
        Activation::Relu => "relu",
        Activation::Silu => "silu",
    }
}

fn axis_line(f: &mut fmt::Formatter<'_>, a: &Axis) -> fmt::Result {
    write!(f, "axis {}: ", a.name)?;
    match a.extent {
        Extent::Dyn => f.write_str("dyn")?,
        Extent::Fixed(n) => write!(f, "{n}")?,
    }
    if a.kind == AxisKind::Reduce {
        f.write_str(" reduce")?;
    }
    writeln!(f)
}

fn tile_line(f: &mut fmt::Formatter<'_>, t: &TileVar) -> fmt::Result {
    write!(f, "tile {} of {}: ", t.name, t.axis)?;
    match t.size {
        TileSize::Solve => writeln!(f, "solve"),
        TileSize::Fixed(n) => writeln!(f, "{n}"),
    }
}

fn tensor_line(f: &mut fmt::Formatter<'_>, t: &Tensor) -> fmt::Result {
    write!(f, "{} {}[", role_word(t.role), t.name)?;
    write_list(f, &t.dims)?;
    write!(f, "]: {}", t.format)?;
    if t.layout.int4_pair_transpose || t.layout.int4_signed_codes || !t.layout.is_row_major(&t.dims)
    {
        write!(f, " layout {}", t.layout)?;
    }
    writeln!(f)
}

fn matmul_line(f: &mut fmt::Formatter<'_>, m: &Matmul) -> fmt::Result {
    let (e, h, l) = (m.e.as_str(), m.h.as_str(), m.l.as_str());
    f.write_str("matmul ")?;
    indexed(f, &m.y, &[e, h])?;
    f.write_str(" = ")?;
    indexed(f, &m.x, &[e, l])?;
    f.write_str(" * ")?;
    indexed(f, &m.w, &[h, l])?;
    let ep = &m.epilogue;
    f.write_str(" epilogue")?;
    if ep.scale {
        f.write_str(" scale")?;
    }
    if ep.zero_point {
        f.write_str(" zero-point")?;
    }
    if let Some(b) = &ep.bias {
        write!(f, " bias({b})")?;
    }
    writeln!(f, " act({})", activation_word(ep.activation))
}

fn attention_line(f: &mut fmt::Formatter<'_>, a: &Attention) -> fmt::Result {
    let (t, hq, kvh, d, s) = (
        a.tokens.as_str(),
        a.heads.as_str(),
        a.kv_heads.as_str(),
        a.head_dim.as_str(),
        a.seq.as_str(),
    );
    let kind = match a.kind {
        AttentionKind::Decode => "decode",
        AttentionKind::Prefill => "prefill",
    };
    write!(f, "attention {kind} ")?;
    indexed(f, &a.o, &[t, hq, d])?;
    f.write_str(" = softmax(")?;
    indexed(f, &a.q, &[t, hq, d])?;
    f.write_str(" * ")?;
    indexed(f, &a.k, &[s, kvh, d])?;
    f.write_str(") * ")?;
    indexed(f, &a.v, &[s, kvh, d])?;
    if a.q_prescaled {
        f.write_str(" q-prescaled")?;
    }
    match a.softmax {
        SoftmaxMode::Online => writeln!(f, " softmax online"),
        SoftmaxMode::Async { phi, lo, hi } => {
            writeln!(f, " softmax async(phi={phi:?}, lo={lo:?}, hi={hi:?})")
        }
    }
}

fn schedule_lines(f: &mut fmt::Formatter<'_>, s: &Schedule) -> fmt::Result {
    if !s.parallel.is_empty() {
        write!(f, "parallel ")?;
        write_list(f, &s.parallel)?;
        writeln!(f)?;
    }
    if let Some(axis) = &s.split {
        writeln!(f, "split {axis}")?;
    }
    Ok(())
}

impl fmt::Display for Kernel {
    /// The canonical text form (see [`crate::text`]); one line per
    /// declaration, each ending in a newline.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "kernel {}", self.name)?;
        for a in &self.axes {
            axis_line(f, a)?;
        }
        for t in &self.schedule.tiles {
            tile_line(f, t)?;
        }
        for t in &self.tensors {
            tensor_line(f, t)?;
        }
        match &self.op {
            Op::Matmul(m) => matmul_line(f, m)?,
            Op::Attention(a) => attention_line(f, a)?,
        }
        schedule_lines(f, &self.schedule)
    }
}
