//! `ioshare trace stats --html`: one self-contained page per run of the command — for
//! each trace its figures, IOPS over time, and its sizes and gaps between requests as
//! histograms (inline SVG, no scripts, no external files).

use super::html::escape;
use crate::output::WriteError;
use crate::trace::stats::{TraceStats, format_gap};
use crate::units::format_bytes;
use plotters::prelude::*;
use std::fmt::Write as _;
use std::path::Path;

type Plot = Result<String, Box<dyn std::error::Error>>;

const BLUE: RGBColor = RGBColor(31, 119, 180);

/// Requests a second per bin.
fn iops_plot(s: &TraceStats) -> Plot {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (1000, 280)).into_drawing_area();
        root.fill(&WHITE)?;
        let bins = s.per_bin.len().max(1);
        let end = bins as f64 * s.bin_s;
        let max = s.per_bin.iter().copied().max().unwrap_or(0) as f64 / s.bin_s;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                format!("IOPS per {} s", s.bin_s),
                ("sans-serif", super::TITLE_FONT),
            )
            .margin(8)
            .margin_right(40)
            .x_label_area_size(52)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..end, 0.0..max.max(1.0) * 1.1)?;
        chart
            .configure_mesh()
            .x_desc("time from the first record (s)")
            .y_desc("requests per second (IOPS)")
            .label_style(("sans-serif", super::FONT))
            .axis_desc_style(("sans-serif", super::FONT))
            .light_line_style(WHITE.mix(0.0))
            .draw()?;
        let points = s
            .per_bin
            .iter()
            .enumerate()
            .map(|(i, &n)| ((i as f64 + 0.5) * s.bin_s, n as f64 / s.bin_s));
        chart.draw_series(LineSeries::new(points, BLUE.stroke_width(2)))?;
        root.present()?;
    }
    Ok(svg)
}

/// A histogram of power-of-two buckets, labelled by `label`.
fn buckets_plot(title: &str, buckets: &[(u64, u64)], label: fn(u64) -> String) -> Plot {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (super::CHART_W, 300)).into_drawing_area();
        root.fill(&WHITE)?;
        let n = buckets.len().max(1);
        let max = buckets.iter().map(|b| b.1).max().unwrap_or(0).max(1);
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", super::TITLE_FONT))
            .margin(8)
            .margin_right(24)
            .x_label_area_size(52)
            .y_label_area_size(70)
            .build_cartesian_2d((0..n).into_segmented(), 0..max + max / 10)?;
        let labels: Vec<String> = buckets.iter().map(|b| label(b.0)).collect();
        chart
            .configure_mesh()
            .x_labels(n.min(12))
            .x_label_formatter(&|v| match v {
                SegmentValue::CenterOf(i) => labels.get(*i).cloned().unwrap_or_default(),
                _ => String::new(),
            })
            .y_desc("requests")
            .label_style(("sans-serif", super::FONT))
            .axis_desc_style(("sans-serif", super::FONT))
            .light_line_style(WHITE.mix(0.0))
            .draw()?;
        chart.draw_series(
            Histogram::vertical(&chart)
                .style(BLUE.filled())
                .margin(2)
                .data(buckets.iter().enumerate().map(|(i, b)| (i, b.1))),
        )?;
        root.present()?;
    }
    Ok(svg)
}

fn figures(out: &mut String, s: &TraceStats) {
    let pct = |x: f64| format!("{:.1} %", 100.0 * x);
    let rows = [
        ("requests", s.requests.to_string()),
        (
            "reads",
            format!("{} ({})", s.reads.requests, format_bytes(s.reads.bytes)),
        ),
        (
            "writes",
            format!("{} ({})", s.writes.requests, format_bytes(s.writes.bytes)),
        ),
        (
            "trims",
            format!("{} ({})", s.trims.requests, format_bytes(s.trims.bytes)),
        ),
        ("flushes", s.flushes.to_string()),
        (
            "reads by count / by bytes",
            format!("{} / {}", pct(s.read_fraction), pct(s.read_byte_fraction)),
        ),
        ("span", format!("{:.3} s", s.span_s)),
        ("mean IOPS", format!("{:.1}", s.mean_iops)),
        ("mean size", format_bytes(s.mean_size as u64)),
        ("sequential", pct(s.sequential_fraction)),
        (
            "footprint (reused)",
            format!(
                "{} ({})",
                format_bytes(s.footprint_bytes),
                format_bytes(s.reused_bytes)
            ),
        ),
        ("volumes", s.volumes.to_string()),
        ("records out of time order", s.out_of_order.to_string()),
    ];
    out.push_str("<div class=\"wide\"><table>\n");
    for (k, v) in rows {
        let _ = writeln!(out, "<tr><td>{k}</td><td>{}</td></tr>", escape(&v));
    }
    out.push_str("</table></div>\n");
}

/// The page for `traces`: (file name, its figures), in order.
pub fn trace_html(traces: &[(String, TraceStats)]) -> Result<String, Box<dyn std::error::Error>> {
    let mut out = super::page_head("ioshare: trace stats");
    out.push_str("<h1>ioshare trace stats</h1>\n");
    for (file, s) in traces {
        let _ = writeln!(out, "<h2>{}</h2>", escape(file));
        figures(&mut out, s);
        out.push_str(&super::chart_box(&iops_plot(s)?));
        out.push_str(&super::chart_box(&buckets_plot(
            "request sizes",
            &s.sizes,
            format_bytes,
        )?));
        out.push_str(&super::chart_box(&buckets_plot(
            "gaps between requests",
            &s.interarrival_ns,
            format_gap,
        )?));
    }
    out.push_str("</body></html>\n");
    Ok(out)
}

/// Writes the page to `path`.
pub fn write_trace_html(traces: &[(String, TraceStats)], path: &Path) -> Result<(), WriteError> {
    let html = trace_html(traces).map_err(|e| WriteError::Draw {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    crate::output::write(path, html)
}
