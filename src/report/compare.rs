//! The report's first chart: the policies side by side on what people choose between —
//! how far the shares are from the weights, what the policy costs in total throughput
//! against `none`, the worst tenant's p99 latency and the worst SLO satisfaction.
//!
//! The share error shown is the per-interval one (each interval's shares against the
//! weights of the tenants backlogged in that interval): a tenant that idles for a phase
//! and comes back makes the whole-run figure wrong for every policy, since its ideal
//! share over the run is not its weight's.
//!
//! One row per run (policy, and sweep point where there is one), labelled by its name.
//! A figure that has nothing under it is `None` and shown as "n/a": share error with no
//! tenant backlogged, throughput against `none` where `none` was not run (or moved
//! nothing) for the same point, p99 where no request completed, SLO satisfaction where
//! no tenant has an SLO or none of their requests was judged.

use super::html::{escape, run_label};
use crate::metrics::{RunResult, ScenarioResult};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::fmt::Write as _;

/// The most runs charted; past this the comparison is a table only (the bars would be
/// thinner than their labels).
pub const MAX_CHARTED_RUNS: usize = 60;

/// One run's figures in the comparison (`is_none`: the run is of the `none` policy,
/// the baseline drawn apart).
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyFigures {
    /// The run's label: policy, and `[sweep point]` where there is one.
    pub label: String,
    /// The run is of the `none` policy (the baseline).
    pub is_none: bool,
    /// Share error per interval (fraction), `None` when no interval had a backlogged
    /// tenant moving data.
    pub share_error: Option<f64>,
    /// Total throughput over `none`'s at the same sweep point.
    pub vs_none: Option<f64>,
    /// The highest p99 latency of any tenant that completed a request, µs.
    pub worst_p99_us: Option<f64>,
    /// The lowest SLO satisfaction of the tenants that have a judged SLO (fraction).
    pub worst_slo: Option<f64>,
}

/// The comparison's figures, one per run, in the runs' order.
pub fn figures(result: &ScenarioResult) -> Vec<PolicyFigures> {
    result
        .runs
        .iter()
        .map(|run| figures_of(result, run))
        .collect()
}

/// One run's figures in the comparison.
pub(super) fn figures_of(result: &ScenarioResult, run: &RunResult) -> PolicyFigures {
    let none_total = result
        .runs
        .iter()
        .find(|r| r.policy_name == "none" && r.variant == run.variant)
        .map(|r| r.total_bandwidth_bytes_per_s)
        .filter(|&t| t > 0.0);
    PolicyFigures {
        label: run_label(run),
        is_none: run.policy_name == "none",
        share_error: (run.intervals_judged > 0).then_some(run.interval_share_error),
        vs_none: none_total.map(|n| run.total_bandwidth_bytes_per_s / n),
        worst_p99_us: run
            .tenants
            .iter()
            .filter(|t| t.ios > 0)
            .map(|t| t.latency_us.p99)
            .reduce(f64::max),
        worst_slo: run
            .tenants
            .iter()
            .filter_map(|t| t.slo_satisfaction)
            .reduce(f64::min),
    }
}

fn shown(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map_or_else(|| "n/a".to_string(), f)
}

fn percent(x: f64) -> String {
    format!("{:.1}%", x * 100.0)
}

fn times(x: f64) -> String {
    format!("{x:.2}×")
}

/// Writes the comparison section: the chart (up to [`MAX_CHARTED_RUNS`] runs) and a table
/// with the same figures.
pub fn section(
    out: &mut String,
    result: &ScenarioResult,
) -> Result<(), Box<dyn std::error::Error>> {
    let rows = figures(result);
    if rows.is_empty() {
        return Ok(());
    }
    out.push_str("<h2>Policies compared</h2>\n");
    out.push_str("<p>Lower is better for share error and p99, higher for throughput and SLO satisfaction. Share error: how far each interval's shares of the device (interval_s, 1 s by default) are from the weights of the tenants backlogged in that interval. Throughput: the total over <code>none</code>'s. Worst p99: the slowest tenant's 99th percentile. SLO: the least satisfied tenant with an SLO.</p>\n");
    if rows.len() <= MAX_CHARTED_RUNS {
        out.push_str(&super::chart_box(&chart(&rows)?));
    } else {
        let _ = writeln!(
            out,
            "<p>{} runs are more than the chart shows ({MAX_CHARTED_RUNS}); the table has them all.</p>",
            rows.len()
        );
    }
    out.push_str("<div class=\"wide\"><table><tr><th>policy</th><th>share error per interval</th><th>throughput vs none</th><th>worst p99</th><th>worst SLO satisfaction</th></tr>\n");
    for r in &rows {
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(&r.label),
            shown(r.share_error, percent),
            shown(r.vs_none, times),
            shown(r.worst_p99_us, super::latency),
            shown(r.worst_slo, percent),
        );
    }
    out.push_str("</table></div>\n");
    Ok(())
}

/// One panel: a horizontal bar per run.
struct Panel<'a> {
    title: &'a str,
    axis: &'a str,
    values: Vec<Option<f64>>,
    /// Where the axis ends (at least): 100 % for satisfaction, 1× for throughput.
    floor_max: f64,
    /// A reference line (1× none), if any.
    reference: Option<f64>,
    text: fn(f64) -> String,
}

/// The comparison's bars, a colour no other chart uses (the browser test looks for it).
pub const PANEL_COLOR: RGBColor = RGBColor(0, 90, 150);
/// The `none` row's bar: the baseline, apart from the policies.
pub const NONE_COLOR: RGBColor = RGBColor(176, 196, 222);

/// Labels longer than this are cut (the table below has them whole).
const LABEL_CHARS: usize = 34;

fn chart(rows: &[PolicyFigures]) -> Result<String, Box<dyn std::error::Error>> {
    let n = rows.len().max(1);
    let labels: Vec<String> = rows
        .iter()
        .map(|r| {
            if r.label.chars().count() > LABEL_CHARS {
                let cut: String = r.label.chars().take(LABEL_CHARS - 1).collect();
                format!("{cut}…")
            } else {
                r.label.clone()
            }
        })
        .collect();
    let is_none: Vec<bool> = rows.iter().map(|r| r.is_none).collect();
    let label_px = labels.iter().map(|l| l.chars().count()).max().unwrap_or(4) as u32 * 11 + 14;
    let panels = panels(rows);
    let panel_h = 110 + 26 * n as u32;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (1000, panel_h * 2)).into_drawing_area();
        root.fill(&WHITE)?;
        let areas = root.split_evenly((2, 2));
        for (area, panel) in areas.iter().zip(&panels) {
            let max = panel
                .values
                .iter()
                .flatten()
                .copied()
                .filter(|v| v.is_finite())
                .fold(panel.floor_max, f64::max);
            let mut chart = ChartBuilder::on(area)
                .caption(panel.title, ("sans-serif", super::TITLE_FONT))
                .margin(8)
                .margin_right(24)
                .x_label_area_size(52)
                .y_label_area_size(label_px)
                .build_cartesian_2d(0.0..max * 1.25, (0..n.max(2) - 1).into_segmented())?;
            chart
                .configure_mesh()
                .disable_y_mesh()
                .y_labels(n)
                .y_label_formatter(&|v| match v {
                    SegmentValue::CenterOf(i) if *i < n => labels[n - 1 - i].clone(),
                    _ => String::new(),
                })
                .x_labels(5)
                .x_desc(panel.axis)
                .label_style(("sans-serif", super::FONT))
                .axis_desc_style(("sans-serif", super::FONT))
                .light_line_style(WHITE.mix(0.0))
                .draw()?;
            for (i, v) in panel.values.iter().enumerate() {
                let row = n - 1 - i;
                let c = if is_none[i] { NONE_COLOR } else { PANEL_COLOR };
                let (x, text) = match v {
                    Some(v) if v.is_finite() => {
                        chart.draw_series(
                            Histogram::horizontal(&chart)
                                .style(c.filled())
                                .margin(3)
                                .data([(row, *v)]),
                        )?;
                        (*v, (panel.text)(*v))
                    }
                    Some(v) => (0.0, format!("{v}")),
                    None => (0.0, "n/a".to_string()),
                };
                chart.draw_series(std::iter::once(Text::new(
                    format!(" {text}"),
                    (x, SegmentValue::CenterOf(row)),
                    TextStyle::from(("sans-serif", super::FONT).into_font())
                        .pos(Pos::new(HPos::Left, VPos::Center)),
                )))?;
            }
            if let Some(r) = panel.reference {
                chart.draw_series(std::iter::once(PathElement::new(
                    vec![(r, SegmentValue::Exact(0)), (r, SegmentValue::Exact(n))],
                    BLACK.mix(0.6).stroke_width(1),
                )))?;
            }
        }
        root.present()?;
    }
    Ok(svg)
}

/// The chart's four panels: share error, throughput against `none`, the worst p99, the
/// worst SLO satisfaction.
fn panels(rows: &[PolicyFigures]) -> [Panel<'static>; 4] {
    [
        Panel {
            title: "share error per interval (lower is better)",
            axis: "share error (%)",
            values: rows
                .iter()
                .map(|r| r.share_error.map(|x| x * 100.0))
                .collect(),
            floor_max: 1.0,
            reference: None,
            text: |x| format!("{x:.1}%"),
        },
        Panel {
            title: "total throughput vs none (higher is better)",
            axis: "throughput / none's (×)",
            values: rows.iter().map(|r| r.vs_none).collect(),
            floor_max: 1.0,
            reference: Some(1.0),
            text: |x| format!("{x:.2}×"),
        },
        Panel {
            title: "worst tenant p99 latency (lower is better)",
            axis: "p99 (ms)",
            values: rows
                .iter()
                .map(|r| r.worst_p99_us.map(|x| x / 1e3))
                .collect(),
            floor_max: 0.01,
            reference: None,
            text: |x| super::latency(x * 1e3),
        },
        Panel {
            title: "worst SLO satisfaction (higher is better)",
            axis: "requests within rt (%)",
            values: rows
                .iter()
                .map(|r| r.worst_slo.map(|x| x * 100.0))
                .collect(),
            floor_max: 100.0,
            reference: None,
            text: |x| format!("{x:.1}%"),
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::Scenario;

    const SCENARIO: &str = r#"
        duration_s = 4
        policies = ["none", "sfq", "ta1"]
        [device]
        model = "fixed"
        latency_us = 200.0
        parallelism = 4
        [[tenant]]
        name = "a"
        weight = 3
        workload = { pattern = "randread", size = "4k", iodepth = 8 }
        [[tenant]]
        name = "b"
        weight = 1
        workload = { pattern = "randread", size = "4k", iodepth = 8 }
        [[tenant]]
        name = "db"
        slo = { iops = 200, size = 4096, rt_us = 5000 }
        workload = { pattern = "randread", size = "4k", rate_iops = 150.0 }
    "#;

    fn result(text: &str) -> ScenarioResult {
        let s = Scenario::parse(text, "t.toml", "t").unwrap();
        crate::sim::run_scenario(&s, false).unwrap()
    }

    /// Each figure is the run's own: share error as the run reports it, throughput over
    /// `none`'s, the largest tenant p99 and the smallest SLO satisfaction.
    #[test]
    fn figures_are_the_runs_worst_cases() {
        let r = result(SCENARIO);
        let f = figures(&r);
        assert_eq!(
            f.iter().map(|x| x.label.as_str()).collect::<Vec<_>>(),
            ["none", "sfq", "ta1"]
        );
        for (fig, run) in f.iter().zip(&r.runs) {
            assert_eq!(
                fig.share_error,
                (run.intervals_judged > 0).then_some(run.interval_share_error)
            );
            let none = r.runs[0].total_bandwidth_bytes_per_s;
            assert_eq!(fig.vs_none, Some(run.total_bandwidth_bytes_per_s / none));
            let p99 = run
                .tenants
                .iter()
                .map(|t| t.latency_us.p99)
                .fold(0.0, f64::max);
            assert_eq!(fig.worst_p99_us, Some(p99));
            assert_eq!(fig.worst_slo, run.tenants[2].slo_satisfaction);
            assert!(fig.worst_slo.is_some());
        }
        assert_eq!(f[0].vs_none, Some(1.0));
        // sfq gives a:b 3:1; none does not.
        assert!(f[1].share_error.unwrap() < f[0].share_error.unwrap());
    }

    /// The baseline is the `none` policy whatever its label, and only it.
    #[test]
    fn the_baseline_is_found_by_policy_not_label() {
        let text = SCENARIO.replace(
            r#"["none", "sfq", "ta1"]"#,
            r#"[{ name = "none", label = "fifo" }, { name = "sfq", label = "none-like" }]"#,
        );
        let f = figures(&result(&text));
        assert_eq!(
            f.iter()
                .map(|x| (x.label.as_str(), x.is_none))
                .collect::<Vec<_>>(),
            [("fifo", true), ("none-like", false)]
        );
        assert_eq!(f[0].vs_none, Some(1.0));
        assert!(f[1].vs_none.is_some());
    }

    /// A figure with nothing under it is n/a, not a perfect score: no `none` run, no
    /// SLO, no tenant backlogged.
    #[test]
    fn missing_figures_are_not_applicable() {
        let text = SCENARIO
            .replace(r#"["none", "sfq", "ta1"]"#, r#"["sfq"]"#)
            .replace(r#"slo = { iops = 200, size = 4096, rt_us = 5000 }"#, "")
            .replace("iodepth = 8", "rate_iops = 50.0");
        let f = figures(&result(&text));
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].share_error, None);
        assert_eq!(f[0].vs_none, None);
        assert_eq!(f[0].worst_slo, None);
        assert!(f[0].worst_p99_us.is_some());
        let mut html = String::new();
        section(&mut html, &result(&text)).unwrap();
        assert!(
            html.contains("<tr><td>sfq</td><td>n/a</td><td>n/a</td>"),
            "{html}"
        );
    }
}
