//! `report.html` of `ioshare characterize`: the SSD-analysis paper's figures — baseline
//! bandwidth per pattern and request size (its Fig. 2), and heat maps of the
//! foreground's bandwidth as a percentage of that baseline with a 4 KiB random reader
//! and writer beside it, one row per pattern and policy (its Figs. 3 and 4).

use super::html::escape;
use crate::characterize::{Background, Characterization, PATTERNS, short_size};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::fmt::Write as _;

const LINE_COLORS: [RGBColor; 4] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
];

/// Baseline bandwidth per pattern over the sizes, one axis step per size (a log-2 axis
/// for the default doubling sizes), and the legend to go under it. Patterns that move
/// the same bandwidth (sequential and random reads on a device without a seek) would
/// hide one under the other: each is drawn a little to the side of its size, with its
/// own marker and dash, and the legend says which coincide.
fn baseline_plot(
    m: &Characterization,
    policy: &str,
) -> Result<(String, String), Box<dyn std::error::Error>> {
    let mut svg = String::new();
    let n = m.sizes.len().max(1);
    let lines: Vec<Vec<(f64, f64)>> = PATTERNS
        .into_iter()
        .map(|p| {
            (m.sizes.iter().enumerate())
                .filter_map(|(i, &s)| {
                    m.cell(p, s, Background::None, policy)
                        .map(|cell| (i as f64, cell.foreground_bytes_per_s / 1e6))
                })
                .collect()
        })
        .collect();
    let max = lines.iter().flatten().map(|p| p.1).fold(1e-3, f64::max);
    {
        let root = SVGBackend::with_string(&mut svg, (super::CHART_W, 380)).into_drawing_area();
        root.fill(&WHITE)?;
        let sizes = m.sizes.clone();
        let mut chart = ChartBuilder::on(&root)
            .caption(
                format!("baseline bandwidth, no background ({policy})"),
                ("sans-serif", super::TITLE_FONT),
            )
            .margin(8)
            .margin_right(24)
            .x_label_area_size(52)
            .y_label_area_size(70)
            .build_cartesian_2d(-0.5..(n as f64 - 0.5), 0.0..max * 1.1)?;
        chart
            .configure_mesh()
            .x_labels(n)
            .x_label_formatter(&|x| {
                let i = x.round();
                if (x - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < sizes.len() {
                    short_size(sizes[i as usize])
                } else {
                    String::new()
                }
            })
            .x_desc("foreground request size")
            .y_desc("foreground bandwidth (MB/s)")
            .label_style(("sans-serif", super::FONT))
            .axis_desc_style(("sans-serif", super::FONT))
            .light_line_style(WHITE.mix(0.0))
            .draw()?;
        for (k, points) in lines.iter().enumerate() {
            let c = LINE_COLORS[k];
            let dodge = (k as f64 - 1.5) * 0.06;
            let points: Vec<(f64, f64)> = points.iter().map(|&(x, y)| (x + dodge, y)).collect();
            if k % 2 == 0 {
                chart.draw_series(LineSeries::new(points.clone(), c.stroke_width(2)))?;
            } else {
                chart.draw_series(DashedLineSeries::new(
                    points.clone(),
                    8,
                    5,
                    c.stroke_width(2),
                ))?;
            }
            match k {
                0 => chart.draw_series(points.iter().map(|&p| Circle::new(p, 4, c.filled())))?,
                1 => chart
                    .draw_series((points.iter()).map(|&p| TriangleMarker::new(p, 6, c.filled())))?,
                2 => chart
                    .draw_series((points.iter()).map(|&p| Cross::new(p, 5, c.stroke_width(2))))?,
                _ => chart
                    .draw_series((points.iter()).map(|&p| Circle::new(p, 4, c.stroke_width(2))))?,
            };
        }
        root.present()?;
    }
    let items: Vec<(String, RGBColor, super::Mark)> = (PATTERNS.into_iter().enumerate())
        .map(|(k, p)| {
            let mark = if k % 2 == 0 {
                super::Mark::Line
            } else {
                super::Mark::Dashed
            };
            (p.name().to_string(), LINE_COLORS[k], mark)
        })
        .collect();
    let mut under = super::legend(&items);
    if let Some(same) = coinciding(&lines) {
        let _ = writeln!(
            under,
            "<p class=\"note\">Within 0.5 % of each other at every size (drawn side by side): {}.</p>",
            escape(&same)
        );
    }
    Ok((svg, under))
}

/// The patterns whose lines coincide (within 0.5 % at every size), as "a and b; …".
fn coinciding(lines: &[Vec<(f64, f64)>]) -> Option<String> {
    let same: Vec<String> = (0..lines.len())
        .flat_map(|a| (a + 1..lines.len()).map(move |b| (a, b)))
        .filter(|&(a, b)| {
            !lines[a].is_empty()
                && lines[a].len() == lines[b].len()
                && (lines[a].iter().zip(&lines[b]))
                    .all(|(p, q)| (p.1 - q.1).abs() <= 0.005 * p.1.max(q.1))
        })
        .map(|(a, b)| format!("{} and {}", PATTERNS[a].name(), PATTERNS[b].name()))
        .collect();
    (!same.is_empty()).then(|| same.join("; "))
}

/// Red at 0 % through white at 100 % to green above (a background that helps).
fn heat(x: f64) -> RGBColor {
    let mix = |a: u8, b: u8, t: f64| (f64::from(a) + (f64::from(b) - f64::from(a)) * t) as u8;
    if x <= 1.0 {
        let t = x.clamp(0.0, 1.0);
        RGBColor(mix(214, 255, t), mix(39, 255, t), mix(40, 255, t))
    } else {
        let t = ((x - 1.0) / 0.5).clamp(0.0, 1.0);
        RGBColor(mix(255, 120, t), mix(255, 200, t), mix(255, 120, t))
    }
}

/// One background's heat map: a row per pattern and policy, a column per size.
fn heat_map(
    m: &Characterization,
    background: Background,
) -> Result<String, Box<dyn std::error::Error>> {
    let rows: Vec<(crate::characterize::Pattern, &String)> = PATTERNS
        .into_iter()
        .flat_map(|p| m.policies.iter().map(move |pol| (p, pol)))
        .collect();
    let cols = m.sizes.len();
    let (label_w, cell_h, top, bottom) = (190u32, 24u32, 40u32, 40u32);
    let height = top + bottom + cell_h * rows.len() as u32;
    let width = 1000u32;
    let cell_w = f64::from(width - label_w - 10) / cols.max(1) as f64;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (width, height)).into_drawing_area();
        root.fill(&WHITE)?;
        let font = |size: u32| TextStyle::from(("sans-serif", size).into_font());
        root.draw(&Text::new(
            format!(
                "foreground bandwidth as % of its baseline, with the {} beside it",
                background.name()
            ),
            ((width / 2) as i32, 12),
            font(super::TITLE_FONT).pos(Pos::new(HPos::Center, VPos::Top)),
        ))?;
        for (r, (pattern, policy)) in rows.iter().enumerate() {
            let y = (top + cell_h * r as u32) as i32;
            root.draw(&Text::new(
                format!("{} · {policy}", pattern.name()),
                (label_w as i32 - 8, y + cell_h as i32 / 2),
                font(super::FONT).pos(Pos::new(HPos::Right, VPos::Center)),
            ))?;
            for (c, &size) in m.sizes.iter().enumerate() {
                let x0 = label_w as f64 + c as f64 * cell_w;
                let value = m
                    .cell(*pattern, size, background, policy)
                    .and_then(|cell| cell.of_baseline);
                let fill = value.map_or(RGBColor(220, 220, 220), heat);
                root.draw(&Rectangle::new(
                    [
                        (x0 as i32, y),
                        ((x0 + cell_w) as i32 - 1, y + cell_h as i32 - 1),
                    ],
                    fill.filled(),
                ))?;
                root.draw(&Text::new(
                    value.map_or("n/a".to_string(), |v| format!("{:.0}", v * 100.0)),
                    ((x0 + cell_w / 2.0) as i32, y + cell_h as i32 / 2),
                    font(super::FONT).pos(Pos::new(HPos::Center, VPos::Center)),
                ))?;
            }
        }
        let y = (top + cell_h * rows.len() as u32 + 6) as i32;
        for (c, &size) in m.sizes.iter().enumerate() {
            let x = label_w as f64 + (c as f64 + 0.5) * cell_w;
            root.draw(&Text::new(
                short_size(size),
                (x as i32, y),
                font(super::FONT).pos(Pos::new(HPos::Center, VPos::Top)),
            ))?;
        }
        root.draw(&Text::new(
            "foreground request size (cells: % of baseline; red below, green above)",
            ((width / 2) as i32, y + 18),
            font(super::FONT).pos(Pos::new(HPos::Center, VPos::Top)),
        ))?;
        root.present()?;
    }
    Ok(svg)
}

/// The page.
pub fn characterize_html(m: &Characterization) -> Result<String, Box<dyn std::error::Error>> {
    let mut out = String::new();
    out.push_str(&super::page_head(&format!(
        "ioshare characterize: {}",
        m.device
    )));
    let _ = writeln!(
        out,
        "<h1>Interference characterization: {}</h1>",
        escape(&m.device)
    );
    let _ = writeln!(
        out,
        "<p>One foreground stream (one request at a time) beside no background, a 4 KiB random reader or a 4 KiB random writer (one request at a time each), on separate halves of the device; seed {} · policies: {}. Method of the SSD-analysis paper (Park &amp; Yoo), Figs. 2–4.</p>",
        m.seed,
        escape(&m.policies.join(", "))
    );
    out.push_str("<h2>Baseline</h2>\n");
    // One stream alone: the policies' baselines are compared in a sentence, the first
    // one drawn (the paper: with a single stream the schedulers hardly differ).
    if let Some(first) = m.policies.first() {
        let (svg, under) = baseline_plot(m, first)?;
        out.push_str(&super::chart_box(&svg));
        out.push_str(&under);
        let mut worst: Option<(f64, String)> = None;
        for c in m.cells.iter().filter(|c| c.background == Background::None) {
            if let Some(base) = m.cell(c.pattern, c.size, Background::None, first)
                && base.foreground_bytes_per_s > 0.0
            {
                let d = (c.foreground_bytes_per_s / base.foreground_bytes_per_s - 1.0).abs();
                if worst.as_ref().is_none_or(|(w, _)| d > *w) {
                    worst = Some((
                        d,
                        format!("{} {} {}", c.policy, c.pattern.name(), short_size(c.size)),
                    ));
                }
            }
        }
        if m.policies.len() > 1
            && let Some((d, at)) = worst
        {
            let _ = writeln!(
                out,
                "<p>Alone, the other policies' baselines are within {:.1}% of {}'s (largest: {}).</p>",
                d * 100.0,
                escape(first),
                escape(&at)
            );
        }
    }
    for b in [Background::Reader4k, Background::Writer4k] {
        let _ = writeln!(out, "<h2>With the {}</h2>", b.name());
        out.push_str(&super::chart_box(&heat_map(m, b)?));
    }
    out.push_str("</body></html>\n");
    Ok(out)
}

/// Writes `characterize.json`, `characterize.csv` and `report.html` for `m` into `dir`.
pub fn write_characterization(
    m: &Characterization,
    dir: &std::path::Path,
) -> Result<(), crate::output::WriteError> {
    m.write_data(dir)?;
    let page = dir.join("report.html");
    let html = characterize_html(m).map_err(|e| crate::output::WriteError::Draw {
        path: page.clone(),
        reason: e.to_string(),
    })?;
    crate::output::write(&page, html)
}
