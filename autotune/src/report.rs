//! What a run shows: the summary table per weight shape and an SVG plot of
//! throughput against M per variant with M1 and M2 marked.

use std::fmt::Write as _;
use std::path::Path;

use plotters::prelude::*;
use tessera_dsl::ir::Variant;
use tessera_runtime::record::{DeviceEntry, Measurement, ShapeEntry};

use crate::tune::{MAX_M, representative_m};

/// A breakpoint as printed: `> 4096` when the search found none.
pub fn show_m(m: usize) -> String {
    if m > MAX_M {
        format!("> {MAX_M}")
    } else {
        m.to_string()
    }
}

/// The winner's measurement at its variant's representative M.
fn headline(shape: &ShapeEntry, variant: Variant) -> Option<&Measurement> {
    let w = shape.winner(variant)?;
    shape
        .measurements
        .iter()
        .find(|m| m.variant == variant && m.tile == w.tile && m.m == representative_m(variant))
}

/// The table for one shape.
pub fn shape_table(shape: &ShapeEntry) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{} [N={}, K={}]  M1 = {}  M2 = {}  ({} measurements)",
        shape.name,
        shape.n,
        shape.k,
        show_m(shape.m1),
        show_m(shape.m2),
        shape.measurements.len()
    );
    let _ = writeln!(
        s,
        "  {:<9} {:>10} {:>5} {:>11} {:>9} {:>8} {:>9}",
        "variant", "tile", "at M", "time (us)", "GFLOP/s", "GB/s", "roofline"
    );
    for variant in Variant::ALL {
        let Some(w) = shape.winner(variant) else {
            continue;
        };
        let tile = format!("{}x{}x{}", w.tile[0], w.tile[1], w.tile[2]);
        match headline(shape, variant) {
            Some(m) => {
                let _ = writeln!(
                    s,
                    "  {:<9} {:>10} {:>5} {:>11.1} {:>9.1} {:>8.1} {:>8.0}%",
                    variant.to_string(),
                    tile,
                    m.m,
                    m.median_ns / 1e3,
                    m.gflops,
                    m.gbps,
                    m.roofline * 100.0
                );
            }
            None => {
                let _ = writeln!(s, "  {:<9} {:>10}", variant.to_string(), tile);
            }
        }
        if !w.kernel.is_empty() {
            let _ = writeln!(s, "            {}", w.kernel);
        }
    }
    if let Some(line) = savings_line(shape) {
        let _ = writeln!(s, "  {line}");
    }
    let ties = shape.notes.ties().count();
    if !shape.notes.decisions.is_empty() {
        let _ = writeln!(
            s,
            "  {} decisions, {ties} ties (to the solver's cost); noise floor {:.1}%, drift {:.1}%",
            shape.notes.decisions.len(),
            shape.notes.noise_floor * 100.0,
            shape.notes.drift * 100.0
        );
    }
    s
}

/// What the breakpoints save (see [`crate::savings`]), one line; `None`
/// for records without savings.
pub fn savings_line(shape: &ShapeEntry) -> Option<String> {
    let v = shape.notes.savings.as_ref()?;
    let p = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{:+.1}%", x * 100.0));
    Some(format!(
        "saves vs M1-1 {} M1+1 {} | M2-{st} {} M2+{st} {} | over M 1..{}: vs always gemv {} flat {} gemm {}",
        p(v.vs_m1_minus),
        p(v.vs_m1_plus),
        p(v.vs_m2_minus),
        p(v.vs_m2_plus),
        v.range_m,
        p(v.vs_always_gemv),
        p(v.vs_always_flat),
        p(v.vs_always_gemm),
        st = v.m2_step,
    ))
}

/// Header and every shape's table.
pub fn summary(entry: &DeviceEntry, mac_path: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{} | backend {} | {} | model {} | {} thread(s){}",
        entry.fingerprint.cpu_model,
        entry.backend,
        entry.format,
        entry.model,
        entry.threads,
        if entry.partial { " | PARTIAL" } else { "" }
    );
    let _ = writeln!(
        s,
        "limits: read {:.1} GB/s, peak {:.1} GMAC/s ({mac_path}); core weights {:?}",
        entry.limits.read_gbps, entry.limits.mac_gops, entry.core_weights
    );
    for shape in &entry.shapes {
        s.push('\n');
        s.push_str(&shape_table(shape));
    }
    s
}

/// Points (M, GFLOP/s) of each variant's winner, sorted by M.
pub fn curves(shape: &ShapeEntry) -> Vec<(Variant, Vec<(f64, f64)>)> {
    Variant::ALL
        .into_iter()
        .filter_map(|v| {
            let w = shape.winner(v)?;
            let mut pts: Vec<(f64, f64)> = shape
                .measurements
                .iter()
                .filter(|m| m.variant == v && m.tile == w.tile)
                .map(|m| (m.m as f64, m.gflops))
                .collect();
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            Some((v, pts))
        })
        .collect()
}

/// Why a plot could not be written.
#[derive(Debug, thiserror::Error)]
#[error("plot {path}: {why}")]
pub struct PlotError {
    pub path: String,
    pub why: String,
}

/// Write the SVG plot of one shape: GFLOP/s against M (log scale) for each
/// variant's winner, with M1 and M2 as vertical lines.
pub fn plot(shape: &ShapeEntry, path: &Path) -> Result<(), PlotError> {
    let err = |why: String| PlotError {
        path: path.display().to_string(),
        why,
    };
    let data = curves(shape);
    let top = data
        .iter()
        .flat_map(|(_, p)| p.iter().map(|q| q.1))
        .fold(1.0f64, f64::max)
        * 1.15;
    let right = data
        .iter()
        .flat_map(|(_, p)| p.iter().map(|q| q.0))
        .chain([shape.m1.min(MAX_M) as f64, shape.m2.min(MAX_M) as f64, 16.0])
        .fold(2.0f64, f64::max)
        * 1.5;
    let root = SVGBackend::new(path, (720, 440)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(e.to_string()))?;
    let mut chart = ChartBuilder::on(&root)
        .margin(16)
        .x_label_area_size(36)
        .y_label_area_size(48)
        .caption(
            format!(
                "{} [{}, {}]: GFLOP/s vs M; M1 = {}, M2 = {}",
                shape.name,
                shape.n,
                shape.k,
                show_m(shape.m1),
                show_m(shape.m2)
            ),
            ("sans-serif", 16),
        )
        .build_cartesian_2d((1f64..right).log_scale(), 0f64..top)
        .map_err(|e| err(e.to_string()))?;
    chart
        .configure_mesh()
        .x_desc("M (rows)")
        .y_desc("GFLOP/s")
        .draw()
        .map_err(|e| err(e.to_string()))?;
    let colors = [RED, BLUE, GREEN];
    for ((variant, pts), color) in data.iter().zip(colors) {
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
            .map_err(|e| err(e.to_string()))?
            .label(variant.to_string())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color));
        chart
            .draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))
            .map_err(|e| err(e.to_string()))?;
    }
    for (m, label) in [(shape.m1, "M1"), (shape.m2, "M2")] {
        if m <= MAX_M {
            let x = m as f64;
            chart
                .draw_series(LineSeries::new(
                    [(x, 0.0), (x, top)],
                    BLACK.mix(0.6).stroke_width(1),
                ))
                .map_err(|e| err(e.to_string()))?;
            chart
                .draw_series(std::iter::once(Text::new(
                    label.to_string(),
                    (x, top * 0.97),
                    ("sans-serif", 13),
                )))
                .map_err(|e| err(e.to_string()))?;
        }
    }
    if let Some(line) = savings_line(shape) {
        chart
            .draw_series(std::iter::once(Text::new(
                line,
                (1.05, top * 0.06),
                ("sans-serif", 11),
            )))
            .map_err(|e| err(e.to_string()))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(e.to_string()))?;
    root.present().map_err(|e| err(e.to_string()))?;
    Ok(())
}
