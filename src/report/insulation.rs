//! The report's insulation section: per tenant and policy, R — what the tenant got over
//! what its entitled slice of the device gives it alone ([`crate::metrics::insulation`],
//! after Argon, Wachs et al., FAST 2007) — drawn as a bar against the 0.9 bar, beside
//! the tenant's slice and what it did alone.

use super::html::{escape, run_label};
use crate::metrics::insulation::INSULATED;
use crate::metrics::{RunResult, ScenarioResult};
use std::fmt::Write as _;

/// Tenants shown per table: those with the lowest R under any policy.
pub const SHOWN: usize = 16;

/// Width of a bar at R = 1.2 (the scale's end), px.
const BAR_PX: f64 = 72.0;
/// The scale's end: R above it is drawn full.
const SCALE: f64 = 1.2;

/// One cell: R as a bar with the 0.9 mark, and the figure.
fn cell(r: Option<f64>, backlogged: bool) -> String {
    let Some(r) = r else {
        return "<td>n/a</td>".into();
    };
    let w = (r.clamp(0.0, SCALE) / SCALE * BAR_PX).round();
    let mark = (INSULATED / SCALE * BAR_PX).round();
    let (fill, miss) = if r < INSULATED && backlogged {
        ("#c0392b", " ✗")
    } else {
        ("#2e86c1", "")
    };
    format!(
        "<td><svg width=\"{BAR_PX}\" height=\"10\" role=\"img\" aria-label=\"R {r:.2}\"><rect width=\"{w}\" height=\"10\" fill=\"{fill}\"/><line x1=\"{mark}\" x2=\"{mark}\" y1=\"0\" y2=\"10\" stroke=\"#333\" stroke-width=\"1\"/></svg> {:.2}{miss}</td>",
        (r * 100.0 + 1e-9).floor() / 100.0
    )
}

/// Writes the section, when the runs judged insulation.
pub fn section(out: &mut String, result: &ScenarioResult) {
    if !result
        .runs
        .iter()
        .any(|r| r.tenants.iter().any(|t| t.alone.is_some()))
    {
        return;
    }
    out.push_str("<h2>Insulation</h2>\n");
    let _ = writeln!(
        out,
        "<p class=\"note\">R: what each tenant got over what its entitled slice of the device gives it alone (its throughput alone on the same device × its entitled device time ÷ the device time it used alone); the slice is max-min by weight over what each tenant used alone, clamped by reservations and limits. The mark is at {INSULATED:.1}; ✗: a backlogged tenant under it. n/a: a slice too small to measure.</p>"
    );
    let mut variants: Vec<&str> = result.runs.iter().map(|r| r.variant.as_str()).collect();
    variants.dedup();
    for variant in variants {
        let runs: Vec<&RunResult> = result
            .runs
            .iter()
            .filter(|r| r.variant == variant)
            .collect();
        let Some(first) = runs.first() else { continue };
        if !variant.is_empty() {
            let _ = writeln!(out, "<h3>{}</h3>", escape(variant));
        }
        // The tenants with the lowest R under any policy first.
        let lowest = |i: usize| {
            runs.iter()
                .filter_map(|r| r.tenants[i].insulation)
                .fold(f64::INFINITY, f64::min)
        };
        let mut order: Vec<usize> = (0..first.tenants.len()).collect();
        order.sort_by(|&a, &b| lowest(a).total_cmp(&lowest(b)).then(a.cmp(&b)));
        let hidden = order.len().saturating_sub(SHOWN);
        order.truncate(SHOWN);
        order.sort_unstable();
        out.push_str("<div class=\"wide\"><table><tr><th class=\"text\">tenant</th><th>slice</th><th>alone MB/s</th>");
        for r in &runs {
            let _ = write!(out, "<th>{}</th>", escape(&run_label(r)));
        }
        out.push_str("</tr>\n");
        for i in order {
            let t = &first.tenants[i];
            let _ = write!(
                out,
                "<tr><td class=\"text\">{}</td><td>{}</td><td>{}</td>",
                escape(&t.name),
                t.entitled_device_share
                    .map_or_else(|| "n/a".into(), |s| format!("{:.1} %", s * 100.0)),
                t.alone.map_or_else(
                    || "n/a".into(),
                    |a| format!("{:.1}", a.bandwidth_bytes_per_s / 1e6)
                ),
            );
            for r in &runs {
                out.push_str(&cell(r.tenants[i].insulation, r.tenants[i].backlogged));
            }
            out.push_str("</tr>\n");
        }
        out.push_str("</table></div>\n");
        if hidden > 0 {
            let _ = writeln!(
                out,
                "<p class=\"note\">{hidden} more tenants, none lower than those shown (results.json has every one).</p>"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backlogged_tenant_under_the_bar_is_marked_and_never_rounded_onto_it() {
        let c = cell(Some(0.899), true);
        assert!(c.contains(" 0.89 ✗"), "{c}");
        assert!(c.contains("fill=\"#c0392b\""), "{c}");
        // Not backlogged: shown, not marked.
        assert!(!cell(Some(0.5), false).contains('✗'));
        assert_eq!(cell(None, true), "<td>n/a</td>");
        // Above the scale the bar is full.
        assert!(cell(Some(3.0), true).contains("rect width=\"72\""));
    }
}
