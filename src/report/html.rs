//! `report.html`: one self-contained page (inline SVG, no scripts, no external files).

use super::{CHART_W, FONT, Mark, TITLE_FONT, chart_box, legend};
use crate::metrics::ScenarioResult;
use crate::metrics::{PhaseResult, RunResult};
use crate::output::WriteError;
use crate::types::nanos_to_secs;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::fmt::Write as _;
use std::path::Path;

const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

fn color(i: usize) -> RGBColor {
    COLORS[i % COLORS.len()]
}

pub(super) fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

pub(super) fn run_label(run: &RunResult) -> String {
    if run.variant.is_empty() {
        run.policy.clone()
    } else {
        format!("{} [{}]", run.policy, run.variant)
    }
}

type PlotResult = Result<(), Box<dyn std::error::Error>>;

/// Tenants drawn one by one in a chart; the rest are summed into one "others" series, so
/// that a thousand tenants make a legend of eight lines, not an overflowing list.
pub const NAMED_TENANTS: usize = 7;

/// The tenants a chart names: all of them when they fit, else the [`NAMED_TENANTS`] with
/// the largest `key` (ties to the first), in their own order.
fn named_tenants(count: usize, key: impl Fn(usize) -> f64) -> Vec<usize> {
    if count <= NAMED_TENANTS + 1 {
        return (0..count).collect();
    }
    let mut order: Vec<usize> = (0..count).collect();
    order.sort_by(|&a, &b| key(b).total_cmp(&key(a)).then(a.cmp(&b)));
    order.truncate(NAMED_TENANTS);
    order.sort_unstable();
    order
}

fn others_label(count: usize) -> String {
    format!("others ({count} tenants, summed)")
}

const OTHERS_COLOR: RGBColor = RGBColor(160, 160, 160);

/// A chart and the legend under it.
type Chart = (String, String);

/// A line per named tenant (and the others summed): (legend, colour, value per
/// interval).
type Series = Vec<(String, RGBColor, Vec<f64>)>;
/// A horizontal line: (legend, colour, how drawn, value).
type Marks = Vec<(String, RGBColor, Mark, f64)>;

/// The time chart's lines (MB/s, or IOPS with `iops`) and its reservation and limit
/// marks (with `iops` only).
fn time_series(run: &RunResult, iops: bool) -> (Series, Marks) {
    let ts = &run.timeseries;
    let secs = nanos_to_secs(ts.interval);
    let bins = ts.bytes.first().map_or(0, |b| b.len());
    let per_s = |i: usize, b: usize| match iops {
        true => ts.ios[i][b] as f64 / secs,
        false => ts.bytes[i][b] as f64 / secs / 1e6,
    };
    // The same tenants, in the same colours, as the share chart: the heaviest.
    let named = named_tenants(run.tenants.len(), |i| run.tenants[i].weight);
    let rest: Vec<usize> = (0..run.tenants.len())
        .filter(|i| !named.contains(i))
        .collect();
    let mut series: Series = named
        .iter()
        .enumerate()
        .map(|(k, &i)| {
            let t = &run.tenants[i];
            let values = (0..bins).map(|b| per_s(i, b)).collect();
            (format!("{} (w={})", t.name, t.weight), color(k), values)
        })
        .collect();
    if !rest.is_empty() {
        let summed = (0..bins)
            .map(|b| rest.iter().map(|&i| per_s(i, b)).sum::<f64>())
            .collect();
        series.push((others_label(rest.len()), OTHERS_COLOR, summed));
    }
    let mut marks: Marks = Vec::new();
    for (k, &i) in named.iter().enumerate() {
        let t = &run.tenants[i];
        if let Some(r) = t.reservation_iops.filter(|_| iops) {
            marks.push((
                format!("{}: reservation {r:.0} IOPS", t.name),
                color(k),
                Mark::Dashed,
                r,
            ));
        }
        if let Some(l) = t.limit_iops.filter(|_| iops) {
            marks.push((
                format!("{}: limit {l:.0} IOPS", t.name),
                color(k),
                Mark::Dotted,
                l,
            ));
        }
    }
    (series, marks)
}

/// Each tenant's service per interval in one run, and the legend to go under it: MB/s,
/// or, when some tenant holds a reservation or a limit (promised in requests a second),
/// IOPS with each reservation drawn dashed and each limit dotted in its tenant's colour.
fn bandwidth_plot(run: &RunResult) -> Result<Chart, Box<dyn std::error::Error>> {
    let mut svg = String::new();
    let iops = run
        .tenants
        .iter()
        .any(|t| t.reservation_iops.is_some() || t.limit_iops.is_some());
    let ts = &run.timeseries;
    let secs = nanos_to_secs(ts.interval);
    let start = nanos_to_secs(ts.start);
    let bins = ts.bytes.first().map_or(0, |b| b.len());
    let end = start + bins as f64 * secs;
    let (series, marks) = time_series(run, iops);
    let max = (series.iter().flat_map(|s| &s.2).copied())
        .chain(marks.iter().map(|m| m.3))
        .fold(0.0, f64::max)
        .max(1e-3);
    let x_range = start..end.max(start + secs);
    {
        let root = SVGBackend::with_string(&mut svg, (CHART_W, 320)).into_drawing_area();
        root.fill(&WHITE)?;
        let what = if iops { "IOPS" } else { "bandwidth" };
        let mut chart = ChartBuilder::on(&root)
            .caption(
                format!("{}: {what} per tenant", run_label(run)),
                ("sans-serif", TITLE_FONT),
            )
            .margin(8)
            // Room for the last tick's label, centred on the axis's end.
            .margin_right(40)
            .x_label_area_size(52)
            .y_label_area_size(70)
            .build_cartesian_2d(x_range.clone(), 0.0..max * 1.1)?;
        chart
            .configure_mesh()
            .x_desc("time since the start (s)")
            .y_desc(if iops {
                "requests per second (IOPS)"
            } else {
                "bandwidth (MB/s)"
            })
            .label_style(("sans-serif", FONT))
            .axis_desc_style(("sans-serif", FONT))
            .light_line_style(WHITE.mix(0.0))
            .draw()?;
        // Widest first: tenants that got the same show as nested bands, none hidden.
        let count = series.len() as u32;
        for (k, (_, c, values)) in series.iter().enumerate() {
            let points = values
                .iter()
                .enumerate()
                .map(|(b, &v)| (start + (b as f64 + 0.5) * secs, v));
            let width = 2 + 3 * (count - 1 - k as u32) / 2;
            chart.draw_series(LineSeries::new(points, c.stroke_width(width)))?;
        }
        for (_, c, mark, v) in &marks {
            let (dash, gap) = if *mark == Mark::Dashed {
                (10, 6)
            } else {
                (3, 5)
            };
            let line = [(x_range.start, *v), (x_range.end, *v)];
            chart.draw_series(DashedLineSeries::new(line, dash, gap, c.stroke_width(2)))?;
        }
        root.present()?;
    }
    let mut items: Vec<(String, RGBColor, Mark)> = series
        .into_iter()
        .map(|(l, c, _)| (l, c, Mark::Line))
        .collect();
    items.extend(marks.into_iter().map(|(l, c, m, _)| (l, c, m)));
    Ok((svg, legend(&items)))
}

/// Measured vs ideal share of device time per tenant, grouped by run. Returns the SVG,
/// and the legend and key (the runs' numbers, when their names do not fit under their
/// groups; why a bar has no tick) to go under it.
fn share_plot(result: &ScenarioResult) -> Result<Chart, Box<dyn std::error::Error>> {
    let mut svg = String::new();
    let first = result.runs.first();
    let count = first.map_or(0, |r| r.tenants.len());
    let named = first.map_or_else(Vec::new, |r| named_tenants(count, |i| r.tenants[i].weight));
    let others = count > named.len();
    let groups = result.runs.len();
    let bars = named.len() + usize::from(others);
    let width = (bars + 1) as f64;
    // Names under the groups when the longest fits in a group's width (10 px a letter),
    // else numbers and a key under the chart.
    let labels: Vec<String> = result.runs.iter().map(run_label).collect();
    let group_px = f64::from(CHART_W - 90) / groups.max(1) as f64;
    let longest = labels.iter().map(|l| l.chars().count()).max().unwrap_or(0);
    let numbered = longest as f64 * 10.0 > group_px;
    let cells: Vec<Vec<ShareCell>> = result.runs.iter().map(|r| share_cells(r, &named)).collect();
    // The y axis fits the data: the tallest bar or tick and a little room.
    let top = (cells.iter().flatten())
        .flat_map(|c| [c.0, c.1.unwrap_or(0.0)])
        .fold(0.0, f64::max);
    let top = (top * 1.15).clamp(0.05, 1.0);
    let mut untick = false;
    {
        let root = SVGBackend::with_string(&mut svg, (CHART_W, 360)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                "share of the device per tenant: measured (bars), ideal (black ticks)",
                ("sans-serif", TITLE_FONT),
            )
            .margin(8)
            .x_label_area_size(52)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..(groups as f64 * width).max(1.0), -0.1 * top..top)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(0)
            .y_label_formatter(&|v| {
                if *v < 0.0 {
                    String::new()
                } else {
                    format!("{:.0}%", v * 100.0)
                }
            })
            .x_desc(if numbered {
                "run (numbered as in the key below; one bar per tenant)"
            } else {
                "policy (one bar per tenant)"
            })
            .y_desc("share of device time (%)")
            .label_style(("sans-serif", FONT))
            .axis_desc_style(("sans-serif", FONT))
            .draw()?;
        for (g, run_cells) in cells.iter().enumerate() {
            let centre = g as f64 * width + width / 2.0;
            let label = if numbered {
                format!("{}", g + 1)
            } else {
                labels[g].clone()
            };
            chart.draw_series(std::iter::once(Text::new(
                label,
                (centre, -0.03 * top),
                TextStyle::from(("sans-serif", FONT).into_font())
                    .pos(Pos::new(HPos::Center, VPos::Top)),
            )))?;
            for (k, (share, ideal, _, c)) in run_cells.iter().enumerate() {
                let x0 = g as f64 * width + 0.5 + k as f64;
                chart.draw_series(std::iter::once(Rectangle::new(
                    [(x0, 0.0), (x0 + 0.9, *share)],
                    c.filled(),
                )))?;
                match ideal {
                    Some(ideal) => {
                        chart.draw_series(std::iter::once(PathElement::new(
                            vec![(x0, *ideal), (x0 + 0.9, *ideal)],
                            BLACK.stroke_width(2),
                        )))?;
                    }
                    None => untick = true,
                }
            }
        }
        root.present()?;
    }
    Ok((
        svg,
        share_notes(&cells, numbered.then_some(&labels[..]), untick),
    ))
}

/// What goes under the share chart: its legend, the key of numbered runs, and why a
/// bar may have no tick.
fn share_notes(cells: &[Vec<ShareCell>], numbered: Option<&[String]>, untick: bool) -> String {
    let items: Vec<(String, RGBColor, Mark)> = (cells.first().into_iter().flatten())
        .map(|(_, _, l, c)| (l.clone(), *c, Mark::Bar))
        .collect();
    let mut under = legend(&items);
    let mut notes = Vec::new();
    if let Some(labels) = numbered {
        let key = labels
            .iter()
            .enumerate()
            .map(|(i, l)| format!("{} = {}", i + 1, escape(l)))
            .collect::<Vec<_>>()
            .join(" · ");
        notes.push(format!("Runs: {key}."));
    }
    if untick {
        notes.push("A bar without a tick: that tenant was not backlogged (busy under half the time, or an open loop that got what it asked for), so no share of the device was owed to it.".to_string());
    }
    if !notes.is_empty() {
        let _ = writeln!(under, "<p class=\"note\">{}</p>", notes.join(" "));
    }
    under
}

/// One bar of the share plot: the share, the ideal share if every tenant in the bar is
/// backlogged, the legend, the colour.
type ShareCell = (f64, Option<f64>, String, RGBColor);

/// A run's bars: one per named tenant, and one for the others together.
fn share_cells(run: &RunResult, named: &[usize]) -> Vec<ShareCell> {
    let mut cells: Vec<ShareCell> = named
        .iter()
        .enumerate()
        .filter_map(|(k, &i)| run.tenants.get(i).map(|t| (k, t)))
        .map(|(k, t)| {
            (
                t.device_share,
                t.backlogged.then_some(t.ideal_share),
                format!("{} (w={})", t.name, t.weight),
                color(k),
            )
        })
        .collect();
    let rest: Vec<_> = run
        .tenants
        .iter()
        .enumerate()
        .filter(|(i, _)| !named.contains(i))
        .map(|(_, t)| t)
        .collect();
    if !rest.is_empty() {
        cells.push((
            rest.iter().map(|t| t.device_share).sum(),
            rest.iter()
                .all(|t| t.backlogged)
                .then(|| rest.iter().map(|t| t.ideal_share).sum()),
            others_label(rest.len()),
            OTHERS_COLOR,
        ));
    }
    cells
}

fn policy_section(out: &mut String, number: usize, run: &RunResult) -> PlotResult {
    if run.variant.is_empty() {
        let _ = writeln!(out, "<h2>{number}. {}</h2>", escape(&run.policy));
    } else {
        let _ = writeln!(
            out,
            "<h2>{number}. {} <small>[{}]</small></h2>",
            escape(&run.policy),
            escape(&run.variant)
        );
    }
    let fairness = super::fairness(run, " · ");
    let _ = writeln!(
        out,
        "<p>total {:.1} MB/s · {fairness} · write amplification {:.2} · GC runs {} · pages moved {}</p>",
        run.total_bandwidth_bytes_per_s / 1e6,
        run.device.write_amplification,
        run.device.gc_runs,
        run.device.pages_moved
    );
    out.push_str("<div class=\"wide\"><table><tr><th>tenant</th><th>weight</th><th>workload</th><th>bandwidth (MB/s)</th><th>IOPS</th><th>share of device time</th><th>ideal</th><th>latency: mean</th><th>p50</th><th>p99</th><th>p99.9</th><th>max</th><th>within SLO rt</th></tr>\n");
    for t in &run.tenants {
        let l = t.latency_us;
        // Nothing completed: no latency to show.
        let lat = |us: f64| {
            if t.ios == 0 {
                "n/a".to_string()
            } else {
                super::latency(us)
            }
        };
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td>{}</td><td class=\"text\">{}</td><td>{:.1}</td><td>{:.0}</td><td>{:.1}%</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(&t.name),
            t.weight,
            escape(&t.workload),
            t.bandwidth_bytes_per_s / 1e6,
            t.iops,
            t.device_share * 100.0,
            if t.backlogged {
                format!("{:.1}%", t.ideal_share * 100.0)
            } else {
                "not backlogged".into()
            },
            lat(l.mean),
            lat(l.p50),
            lat(l.p99),
            lat(l.p999),
            lat(l.max),
            t.slo_satisfaction
                .map_or("n/a".into(), |s| format!("{:.2}%", s * 100.0)),
        );
    }
    out.push_str("</table></div>\n");
    let (svg, under) = bandwidth_plot(run)?;
    out.push_str(&chart_box(&svg));
    out.push_str(&under);
    Ok(())
}

/// Per-phase comparison across runs: completed IOPS (the token-bucket paper's Fig. 9),
/// response-time satisfaction per tenant (Figs. 10-11) and switch on-time (Fig. 8).
fn phase_tables(out: &mut String, result: &ScenarioResult) {
    let Some(first) = result.runs.first().filter(|r| r.phases.len() > 1) else {
        return;
    };
    let header = |out: &mut String, what: &str| {
        let _ = write!(
            out,
            "<h3>{what}</h3>\n<div class=\"wide\"><table><tr><th>policy</th>"
        );
        for p in &first.phases {
            let _ = write!(
                out,
                "<th>{} <small>({:.0}-{:.0} s)</small></th>",
                p.phase, p.start_s, p.end_s
            );
        }
        out.push_str("</tr>\n");
    };
    let row = |out: &mut String, run: &RunResult, cell: &dyn Fn(&PhaseResult) -> String| {
        let _ = write!(out, "<tr><td>{}</td>", escape(&run_label(run)));
        for p in &run.phases {
            let _ = write!(out, "<td>{}</td>", cell(p));
        }
        out.push_str("</tr>\n");
    };
    out.push_str("<h2>Per phase</h2>\n");
    header(out, "Completed IOPS, all tenants");
    for run in &result.runs {
        row(out, run, &|p| format!("{:.0}", p.iops));
    }
    out.push_str("</table></div>\n");
    for (i, t) in first.tenants.iter().enumerate() {
        if t.slo_satisfaction.is_none() {
            continue;
        }
        header(out, &format!("{}: requests within rt", escape(&t.name)));
        for run in &result.runs {
            row(out, run, &|p| {
                p.tenants[i]
                    .slo_satisfaction
                    .map_or("-".into(), |s| format!("{:.2}%", s * 100.0))
            });
        }
        out.push_str("</table></div>\n");
    }
    let switched: Vec<&RunResult> = result
        .runs
        .iter()
        .filter(|r| {
            r.phases
                .iter()
                .any(|p| p.tenants.iter().any(|t| t.switch_on.is_some()))
        })
        .collect();
    if !switched.is_empty() {
        header(out, "Bucket switched in, share of the phase (per tenant)");
        for run in switched {
            row(out, run, &|p| {
                p.tenants
                    .iter()
                    .map(|t| {
                        t.switch_on
                            .map_or("-".into(), |x| format!("{:.0}%", x * 100.0))
                    })
                    .collect::<Vec<_>>()
                    .join(" / ")
            });
        }
        out.push_str("</table></div>\n");
    }
}

/// Renders the whole report as one HTML string.
pub fn render(result: &ScenarioResult) -> Result<String, Box<dyn std::error::Error>> {
    let mut out = super::page_head(&format!("ioshare: {}", result.scenario));
    let _ = writeln!(out, "<h1>ioshare report: {}</h1>", escape(&result.scenario));
    if !result.description.is_empty() {
        let _ = writeln!(out, "<p>{}</p>", escape(&result.description));
    }
    let _ = writeln!(
        out,
        "<p>device: {} · duration {:.0} s · seed {} · policies: {}</p>",
        escape(&result.device),
        result.duration_s,
        result.seed,
        escape(
            &result
                .runs
                .iter()
                .map(|r| r.policy.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )
    );
    super::verdict::section(&mut out, result);
    super::compare::section(&mut out, result)?;
    super::insulation::section(&mut out, result);
    out.push_str("<h2>Shares</h2>\n");
    let (svg, under) = share_plot(result)?;
    out.push_str(&chart_box(&svg));
    out.push_str(&under);
    phase_tables(&mut out, result);
    for (i, run) in result.runs.iter().enumerate() {
        policy_section(&mut out, i + 1, run)?;
    }
    out.push_str("<p><small>Workloads marked \"synthetic stand-in\" are generators with the published read/write mix and mean request size of the named workload, not the original traces.</small></p>\n</body></html>\n");
    Ok(out)
}

/// Writes `report.html`.
pub fn write_html(result: &ScenarioResult, path: &Path) -> Result<(), WriteError> {
    let html = render(result).map_err(|e| WriteError::Draw {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    crate::output::write(path, html)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::Scenario;

    fn result(policies: &str, tenants: usize) -> ScenarioResult {
        let mut text = format!(
            "duration_s = 2\npolicies = {policies}\n[device]\nmodel = 'fixed'\nparallelism = 4\n"
        );
        for i in 0..tenants {
            text.push_str(&format!(
                "[[tenant]]\nname = 't{i}'\nweight = {}\nworkload = {{ pattern = 'randread', size = '4k', iodepth = 2 }}\n",
                i + 1
            ));
        }
        let s = Scenario::parse(&text, "t.toml", "t").unwrap();
        crate::sim::run_scenario(&s, false).unwrap()
    }

    /// The share chart's groups carry the policies' names and its axes say what they
    /// are; with many tenants the legend names the heaviest 7 and sums the rest.
    #[test]
    fn share_chart_is_labelled_by_policy_and_its_legend_is_bounded() {
        let r = result("['none', 'sfq']", 3);
        let (svg, under) = share_plot(&r).unwrap();
        assert!(!under.contains("Runs: "));
        for text in [
            "\nnone\n</text>",
            "\nsfq\n</text>",
            "policy (one bar per tenant)",
            "share of device time (%)",
        ] {
            assert!(svg.contains(text), "{text} missing");
        }
        // The legend is HTML under the chart, not drawn over it.
        assert!(under.starts_with("<div class=\"legend\">") && under.contains("t0 (w=1)"));
        assert!(!svg.contains("t0 (w=1)"));
        let many = result("['sfq']", 30);
        let (_, under) = share_plot(&many).unwrap();
        assert!(under.contains("others (23 tenants, summed)"));
        // Named: the 7 heaviest, t23 … t29 (weights 24 … 30).
        assert!(under.contains("t29 (w=30)") && under.contains("t23 (w=24)"));
        assert!(!under.contains("t22 (w=23)"));
        let (svg, under) = bandwidth_plot(&many.runs[0]).unwrap();
        assert!(under.contains("others (23 tenants, summed)") && under.contains("t23 (w=24)"));
        assert!(svg.contains("time since the start (s)") && svg.contains("bandwidth (MB/s)"));
    }

    /// The share chart's y axis fits its tallest bar or tick, not 0–100 % always.
    #[test]
    fn the_share_axis_fits_the_data() {
        let r = result("['sfq']", 4);
        let top = r.runs[0]
            .tenants
            .iter()
            .map(|t| t.device_share.max(t.ideal_share))
            .fold(0.0, f64::max);
        assert!(top < 0.5, "{top}");
        let (svg, _) = share_plot(&r).unwrap();
        assert!(!svg.contains("\n100%\n</text>"), "the axis runs to 100 %");
        assert!(
            !svg.contains("\n60%\n</text>"),
            "the axis runs past the data"
        );
    }

    /// A tenant with a reservation or limit: the time chart is in IOPS, each drawn as a
    /// line in its tenant's colour and named in the legend.
    #[test]
    fn reservations_and_limits_are_drawn_as_lines_with_their_figures() {
        let text = std::fs::read_to_string("scenarios/mclock-reservations.toml").unwrap();
        let s = Scenario::parse(&text, "m.toml", "m").unwrap();
        let r = crate::sim::run_scenario(&s, false).unwrap();
        let (svg, under) = bandwidth_plot(&r.runs[1]).unwrap();
        assert!(svg.contains("requests per second (IOPS)"));
        for item in [
            "gold: reservation 3000 IOPS",
            "silver: reservation 500 IOPS",
            "capped: limit 800 IOPS",
        ] {
            assert!(under.contains(item), "{item} missing: {under}");
        }
        assert!(under.contains("dashed") && under.contains("dotted"));
        assert!(svg.contains("stroke-dasharray") || svg.matches("<polyline").count() > 4);
    }

    /// Run names too long for their group are numbered, with a key under the chart.
    #[test]
    fn long_run_names_are_numbered_with_a_key() {
        let mut r = result("['none', 'sfq']", 2);
        for run in &mut r.runs {
            run.variant = "device.precondition=aged, tenant.*.workload=fileserver".into();
        }
        let many: Vec<RunResult> = (0..6).flat_map(|_| r.runs.clone()).collect();
        r.runs = many;
        let (svg, key) = share_plot(&r).unwrap();
        assert!(
            key.contains("Runs: 1 = none [device.precondition=aged"),
            "{key}"
        );
        assert!(key.contains("12 = sfq ["), "{key}");
        assert!(svg.contains("run (numbered as in the key below"));
    }
}
