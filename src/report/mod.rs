//! Turning results into things people read: a terminal table, `results.json`,
//! `timeseries.csv`, and a self-contained `report.html` with SVG plots.

mod characterize;
mod compare;
mod html;
pub mod insulation;
mod trace;
pub mod verdict;

pub use characterize::{characterize_html, write_characterization};
pub use compare::{PolicyFigures, figures};

pub use html::write_html;
pub use trace::{trace_html, write_trace_html};

use crate::metrics::ScenarioResult;
use crate::output::{self, WriteError};
use crate::types::nanos_to_secs;
use std::fmt::Write as _;
use std::path::Path;

/// Charts are drawn this wide (SVG units) and shown at the page's width, never narrower
/// than [`CHART_MIN_PX`]: on a phone a chart's box scrolls sideways, the page does not.
pub(crate) const CHART_W: u32 = 1000;
/// The narrowest a chart is shown, px.
pub(crate) const CHART_MIN_PX: u32 = 720;
/// Text in a chart, in the chart library's units (it writes `font-size` as this / 1.24:
/// 14.5 px), shown at 720 / 1000 of that at the narrowest: 10.4 px.
pub(crate) const FONT: u32 = 18;
/// A chart's title, in the same units.
pub(crate) const TITLE_FONT: u32 = 21;

/// The head of every report page: the viewport a phone needs, and one style — text that
/// wraps, charts and wide tables in boxes that scroll on their own, legends as HTML
/// under their charts.
pub(crate) fn page_head(title: &str) -> String {
    format!(
        "<!doctype html>\n<html><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>{}</title>\n<style>\
body{{font-family:sans-serif;font-size:16px;line-height:1.4;max-width:1100px;margin:1.5em auto;padding:0 1em;color:#222}}\
p,li,h1,h2,h3,td.text{{overflow-wrap:anywhere}}\
.chart,.wide{{overflow-x:auto;max-width:100%}}\
svg{{display:block;width:100%;min-width:{CHART_MIN_PX}px;height:auto;margin:.5em 0}}\
table{{border-collapse:collapse;font-size:14px;margin:.5em 0}}\
td,th{{border:1px solid #ccc;padding:2px 6px;text-align:right;vertical-align:top}}\
td:first-child,th:first-child,td.text,th.text{{text-align:left}}\
.legend{{display:flex;flex-wrap:wrap;gap:.2em 1.2em;font-size:14px;margin:0 0 1em}}\
.legend span{{white-space:nowrap}}\
.legend i{{display:inline-block;width:1.6em;height:0;margin-right:.4em;vertical-align:middle}}\
.note,small{{font-size:14px;color:#444}}\
@media (max-width:600px){{body{{margin:.5em auto;padding:0 .5em}}h1{{font-size:1.5em}}}}\
</style></head><body>\n",
        html::escape(title)
    )
}

/// How a legend entry is drawn.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Mark {
    /// A solid line.
    Line,
    /// A dashed line (a reservation).
    Dashed,
    /// A dotted line (a limit).
    Dotted,
    /// A filled bar.
    Bar,
}

/// A chart's legend, as HTML under it (never over the data): (label, colour, mark).
pub(crate) fn legend(items: &[(String, plotters::style::RGBColor, Mark)]) -> String {
    let mut out = String::from("<div class=\"legend\">");
    for (label, c, mark) in items {
        let colour = format!("#{:02x}{:02x}{:02x}", c.0, c.1, c.2);
        let style = match mark {
            Mark::Line => format!("border-top:3px solid {colour}"),
            Mark::Dashed => format!("border-top:3px dashed {colour}"),
            Mark::Dotted => format!("border-top:3px dotted {colour}"),
            Mark::Bar => format!("height:.8em;background:{colour}"),
        };
        let _ = write!(
            out,
            "<span><i style=\"{style}\"></i>{}</span>",
            html::escape(label)
        );
    }
    out.push_str("</div>\n");
    out
}

/// An SVG chart in its box.
pub(crate) fn chart_box(svg: &str) -> String {
    format!("<div class=\"chart\">{svg}</div>\n")
}

fn mb(bytes_per_s: f64) -> f64 {
    bytes_per_s / 1e6
}

/// A latency in the unit that fits it: `85 µs`, `4.66 ms`, `1.20 s`.
pub fn latency(us: f64) -> String {
    if us < 1000.0 {
        format!("{us:.0} µs")
    } else if us < 1e6 {
        format!("{:.2} ms", us / 1e3)
    } else {
        format!("{:.2} s", us / 1e6)
    }
}

fn pct(x: f64) -> String {
    if x.is_finite() {
        format!("{:.1}%", x * 100.0)
    } else {
        "inf".into()
    }
}

/// The run's fairness figures, joined by `sep`; "n/a" for a figure with nothing under
/// it (no tenant backlogged over the run, or in any interval), not a perfect 0.0 %.
fn fairness(run: &crate::metrics::RunResult, sep: &str) -> String {
    let whole = run.tenants.iter().any(|t| t.backlogged);
    let per = run.intervals_judged > 0;
    if !whole && !per {
        return "share error n/a (no tenant backlogged)".to_string();
    }
    let na = |ok: bool, x: String| if ok { x } else { "n/a".to_string() };
    format!(
        "share error {} (per interval {}){sep}of bytes {} (per interval {}){sep}ratio error {}{sep}Jain {}",
        na(whole, pct(run.share_error)),
        na(per, pct(run.interval_share_error)),
        na(whole, pct(run.byte_share_error)),
        na(per, pct(run.interval_byte_share_error)),
        na(whole, pct(run.ratio_error)),
        na(whole, format!("{:.3}", run.jain)),
    )
}

/// The comparison table: one row per policy × tenant and a summary row per policy.
pub fn table(result: &ScenarioResult) -> String {
    let mut out = String::new();
    let mut variants: Vec<&str> = result.runs.iter().map(|r| r.variant.as_str()).collect();
    variants.dedup();
    if variants.len() > 1 {
        // A sweep: the seed, duration and device may differ per point, so the header
        // does not show the first point's as if they were everyone's.
        let _ = writeln!(
            out,
            "scenario {}, a sweep of {} points (each point's values after --)",
            result.scenario,
            variants.len()
        );
    } else {
        let _ = writeln!(
            out,
            "scenario {} (seed {}), {} s, {}",
            result.scenario,
            result.seed,
            crate::config::shown(result.duration_s),
            result.device
        );
    }
    let _ = writeln!(
        out,
        "{:<12} {:<10} {:>6} {:>9} {:>9} {:>7} {:>7} {:>9} {:>9}  SLO / workload",
        "policy", "tenant", "weight", "MB/s", "IOPS", "share", "ideal", "p50", "p99"
    );
    let _ = writeln!(
        out,
        "{:<12} {:<10} {:>6} {:>9} {:>9} {:>7}",
        "", "", "", "", "", "(device time)"
    );
    let mut variant = "";
    for run in &result.runs {
        if run.variant != variant {
            variant = &run.variant;
            let _ = writeln!(out, "-- {variant}");
        }
        let none = result
            .runs
            .iter()
            .find(|r| r.policy_name == "none" && r.variant == run.variant);
        tenant_rows(&mut out, run);
        let versus = |x: f64, of_none: fn(&crate::metrics::RunResult) -> f64| {
            none.map(of_none)
                .filter(|&n| n > 0.0)
                .map(|n| format!(" ({:.2}x none)", x / n))
                .unwrap_or_default()
        };
        let rel = versus(run.total_bandwidth_bytes_per_s, |r| {
            r.total_bandwidth_bytes_per_s
        });
        let work = versus(run.device_work_rate, |r| r.device_work_rate);
        // Fairness figures mean nothing when no tenant was backlogged (nobody asked for
        // more than it got): say so instead of printing a perfect 0.0 %.
        let mut fairness = fairness(run, ", ");
        if let (Some(r), Some(who)) = (run.min_insulation, &run.min_insulation_tenant) {
            fairness = format!("lowest R {r:.2} ({who}), {fairness}");
        }
        let _ = writeln!(
            out,
            "{:<12} {:<10} total {:.1} MB/s{rel}, device {:.2} s/s{work}, {fairness}, longest wait {}, WA {:.2}, GC runs {}, {} requests in {:.2} s",
            run.policy,
            "= summary",
            mb(run.total_bandwidth_bytes_per_s),
            run.device_work_rate,
            latency(run.longest_wait_s * 1e6),
            run.device.write_amplification,
            run.device.gc_runs,
            run.sim.requests,
            run.sim.wall_seconds,
        );
        phase_rows(&mut out, run);
    }
    out
}

/// One line per tenant of `run`.
fn tenant_rows(out: &mut String, run: &crate::metrics::RunResult) {
    for t in &run.tenants {
        let mut extra = match t.slo_satisfaction {
            Some(s) => format!("SLO {} | {}", pct(s), t.workload),
            None => t.workload.clone(),
        };
        if let Some(r) = t.insulation {
            extra = format!("R {r:.2} | {extra}");
        }
        if t.refused > 0 {
            let full = if t.queue_full > 0 {
                format!(" ({} with its queue full)", t.queue_full)
            } else {
                String::new()
            };
            extra = format!("{} refused{full} | {extra}", t.refused);
        }
        let _ = writeln!(
            out,
            "{:<12} {:<10} {:>6} {:>9.1} {:>9.0} {:>7} {:>7} {:>9} {:>9}  {}",
            run.policy,
            t.name,
            t.weight,
            mb(t.bandwidth_bytes_per_s),
            t.iops,
            pct(t.device_share),
            if t.backlogged {
                pct(t.ideal_share)
            } else {
                "-".into()
            },
            latency(t.latency_us.p50),
            latency(t.latency_us.p99),
            extra
        );
    }
}

/// With more than one phase, a line per phase of `run`.
fn phase_rows(out: &mut String, run: &crate::metrics::RunResult) {
    if run.phases.len() > 1 {
        for p in &run.phases {
            let _ = write!(
                out,
                "{:<12}   phase {:<2} {:>5.0}-{:<5.0}s {:>7.0} IOPS:",
                run.policy, p.phase, p.start_s, p.end_s, p.iops
            );
            for t in &p.tenants {
                let _ = write!(out, "  {} {:.0}", t.name, t.iops);
                if let Some(s) = t.slo_satisfaction {
                    let _ = write!(out, " SLO {}", pct(s));
                }
                if let Some(on) = t.switch_on {
                    let _ = write!(out, " on {:.0}%", on * 100.0);
                }
                if t.refused > 0 {
                    let _ = write!(out, " refused {}", t.refused);
                }
            }
            let _ = writeln!(out);
        }
    }
}

/// Writes `results.json`, `timeseries.csv` and `report.html` into `dir`.
pub fn write_all(result: &ScenarioResult, dir: &Path) -> Result<(), WriteError> {
    output::folder(dir)?;
    output::write_json(&dir.join("results.json"), result)?;
    write_timeseries(result, &dir.join("timeseries.csv"))?;
    write_html(result, &dir.join("report.html"))?;
    Ok(())
}

/// One row per policy × tenant × interval.
pub fn write_timeseries(result: &ScenarioResult, path: &Path) -> Result<(), WriteError> {
    output::write_csv(path, |w| {
        w.write_record([
            "policy",
            "tenant",
            "interval_start_s",
            "bytes",
            "bandwidth_bytes_per_s",
            "iops",
            "mean_latency_us",
            "device_seconds",
        ])?;
        for run in &result.runs {
            let ts = &run.timeseries;
            let secs = nanos_to_secs(ts.interval);
            for (i, t) in run.tenants.iter().enumerate() {
                for (bin, &bytes) in ts.bytes[i].iter().enumerate() {
                    let ios = ts.ios[i][bin];
                    let start = nanos_to_secs(ts.start + bin as u64 * ts.interval);
                    let mean_lat = if ios > 0 {
                        ts.latency_sum_ns[i][bin] as f64 / ios as f64 / 1000.0
                    } else {
                        0.0
                    };
                    w.write_record([
                        run.policy.clone(),
                        t.name.clone(),
                        format!("{start}"),
                        bytes.to_string(),
                        format!("{:.1}", bytes as f64 / secs),
                        format!("{:.1}", ios as f64 / secs),
                        format!("{mean_lat:.1}"),
                        format!(
                            "{:.9}",
                            ts.device_ns[i].get(bin).copied().unwrap_or(0) as f64 / 1e9
                        ),
                    ])?;
                }
            }
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use crate::scenario::Scenario;

    fn summary(text: &str) -> String {
        let s = Scenario::parse(text, "t.toml", "t").unwrap();
        let table = super::table(&crate::sim::run_scenario(&s, false).unwrap());
        table
            .lines()
            .find(|l| l.contains("= summary"))
            .unwrap()
            .to_string()
    }

    /// With nobody backlogged there is no share to get wrong: the summary says so
    /// rather than printing a perfect 0.0 %.
    #[test]
    fn share_error_is_not_applicable_without_a_backlogged_tenant() {
        let light = r#"
            duration_s = 1
            [device]
            model = "fixed"
            latency_us = 100.0
            [[tenant]]
            name = "a"
            workload = { pattern = "randread", size = "4k", rate_iops = 100.0 }
        "#;
        let line = summary(light);
        assert!(
            line.contains("share error n/a (no tenant backlogged)"),
            "{line}"
        );
        let busy = light.replace("rate_iops = 100.0", "iodepth = 4");
        let line = summary(&busy);
        assert!(line.contains("share error 0.0%"), "{line}");
    }
}
