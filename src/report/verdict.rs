//! The verdict: which policy keeps the tenants' promises best here, at what throughput
//! cost, and why — the paragraph and table at the top of every report, and what
//! `ioshare advise` prints.
//!
//! A tenant's promises are its weight (every tenant has one), its reservation and its
//! limit (mClock's, in requests a second) and its SLO (`{iops, size, rt}`). Each run is
//! checked against every promise the scenario's tenants hold:
//! * weights: the per-interval share error in device time, against what each tenant's
//!   weight, reservation and limit entitle it to ([`crate::metrics::entitled`]), at
//!   most [`WEIGHTS_WITHIN`];
//! * a reservation: missed in at most [`RARELY`] of the intervals in which the tenant
//!   asked for it ([`crate::metrics::TenantResult::reservation_missed`]);
//! * a limit: passed in at most [`RARELY`] of the intervals;
//! * an SLO: at least [`SLO_MET`] of the tenant's requests within its response time
//!   (the SLO conformance matrix's bar).
//!
//! The policies are ranked by the promises they miss (fewest first), then by total
//! throughput against `none` in steps of [`SAME_THROUGHPUT`] (highest first), then by
//! share error, then by the worst tenant's p99. Each policy is also judged on the
//! promises it makes ([`crate::policy::Aims`]): a figure it does not aim at is marked
//! so — a token bucket far from the weights is doing what it was built to do — but it
//! still counts against it when the tenants hold that promise, since the question is
//! which policy these tenants should run under.

use super::html::escape;
use crate::metrics::{RunResult, ScenarioResult};
use crate::policy::{Aims, aims};
use std::fmt::Write as _;

/// Weights are kept when the per-interval share error is at most this.
pub const WEIGHTS_WITHIN: f64 = 0.05;
/// An SLO is kept when at least this fraction of the tenant's requests met it.
pub const SLO_MET: f64 = 0.99;
/// A reservation or limit is kept when missed in at most this fraction of intervals.
pub const RARELY: f64 = 0.05;
/// Totals within this fraction of each other count as the same throughput.
pub const SAME_THROUGHPUT: f64 = 0.02;

/// One promise checked in one run.
#[derive(Debug, Clone, PartialEq)]
pub struct Check {
    /// What was checked, in words, with the figure ("weights within 1.8 %").
    pub text: String,
    /// Whether the run kept it.
    pub kept: bool,
    /// Whether the policy aims at this kind of promise.
    pub aimed: bool,
}

/// One run judged.
#[derive(Debug, Clone, PartialEq)]
pub struct Judged {
    /// The run's label (policy, and sweep point).
    pub label: String,
    /// The checks, weights first, then per tenant.
    pub checks: Vec<Check>,
    /// Total throughput over `none`'s at the same point.
    pub vs_none: Option<f64>,
    /// Per-interval share error in device time, when judged.
    pub share_error: Option<f64>,
    /// The worst p99 of any tenant that completed a request, µs.
    pub worst_p99_us: Option<f64>,
}

impl Judged {
    /// How many promises it missed.
    pub fn missed(&self) -> usize {
        self.checks.iter().filter(|c| !c.kept).count()
    }

    fn key(&self) -> (usize, i64, f64, f64) {
        (
            self.missed(),
            // Highest throughput first, in steps.
            -(self.vs_none.unwrap_or(1.0) / SAME_THROUGHPUT).round() as i64,
            self.share_error.unwrap_or(0.0),
            self.worst_p99_us.unwrap_or(0.0),
        )
    }

    fn kept_text(&self) -> String {
        self.checks
            .iter()
            .filter(|c| c.kept)
            .map(|c| c.text.clone())
            .collect::<Vec<_>>()
            .join("; ")
    }

    fn missed_text(&self) -> String {
        self.checks
            .iter()
            .filter(|c| !c.kept)
            .map(|c| {
                if c.aimed {
                    c.text.clone()
                } else {
                    format!("{} (not its aim)", c.text)
                }
            })
            .collect::<Vec<_>>()
            .join("; ")
    }

    fn throughput(&self) -> String {
        self.vs_none
            .map_or_else(|| "n/a".into(), |x| format!("{x:.2}× none"))
    }
}

/// The verdict on one sweep point (or the whole scenario without a sweep).
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// The sweep point; empty without a sweep.
    pub variant: String,
    /// The runs, best first.
    pub ranked: Vec<Judged>,
}

impl Verdict {
    /// The policy to run, when any ran.
    pub fn best(&self) -> Option<&Judged> {
        self.ranked.first()
    }

    /// The verdict in one paragraph of plain text.
    pub fn paragraph(&self) -> String {
        let Some(best) = self.best() else {
            return "No policy ran.".into();
        };
        let at = match best.vs_none {
            Some(x) => format!(", at {x:.2}× the throughput of none"),
            None => String::new(),
        };
        let mut out = if best.missed() == 0 {
            let checked = best.kept_text();
            if checked.is_empty() {
                format!(
                    "{} fits: these tenants hold no promise it could miss{at}.",
                    best.label
                )
            } else {
                format!("{} keeps every promise here: {checked}{at}.", best.label)
            }
        } else {
            format!(
                "No policy keeps every promise here; {} misses fewest: {}{at}.",
                best.label,
                best.missed_text()
            )
        };
        if best.label == "none" && best.missed() == 0 {
            out.push_str(" No scheduling is needed for these tenants on this device.");
        }
        let same: Vec<&str> = self.ranked[1..]
            .iter()
            .filter(|j| j.key().0 == best.key().0 && j.key().1 == best.key().1)
            .map(|j| j.label.as_str())
            .take(3)
            .collect();
        if let Some(next) = self.ranked.get(1) {
            if !same.is_empty() && best.missed() == 0 {
                let _ = write!(
                    out,
                    " {} keep them too, further from the weights or slower at the tail.",
                    same.join(", ")
                );
            } else if next.missed() > best.missed() {
                let _ = write!(
                    out,
                    " The next, {}, misses: {}.",
                    next.label,
                    next.missed_text()
                );
            }
        }
        out
    }
}

/// One verdict per sweep point, in the runs' order.
pub fn verdicts(result: &ScenarioResult) -> Vec<Verdict> {
    let mut variants: Vec<&str> = result.runs.iter().map(|r| r.variant.as_str()).collect();
    variants.dedup();
    variants
        .into_iter()
        .map(|variant| {
            let mut ranked: Vec<Judged> = result
                .runs
                .iter()
                .filter(|r| r.variant == variant)
                .map(|r| judge(result, r))
                .collect();
            // A stable sort: equal keys keep the runs' order.
            ranked.sort_by(|a, b| {
                let (a, b) = (a.key(), b.key());
                (a.0, a.1)
                    .cmp(&(b.0, b.1))
                    .then(a.2.total_cmp(&b.2))
                    .then(a.3.total_cmp(&b.3))
            });
            Verdict {
                variant: variant.to_string(),
                ranked,
            }
        })
        .collect()
}

fn percent(x: f64) -> String {
    format!("{:.1} %", x * 100.0)
}

/// Checks one run against every promise its tenants hold.
pub fn judge(result: &ScenarioResult, run: &RunResult) -> Judged {
    let aim: Aims = aims(&run.policy_name);
    let mut checks = Vec::new();
    let share_error = (run.intervals_judged > 0).then_some(run.interval_share_error);
    if let Some(e) = share_error {
        let kept = e <= WEIGHTS_WITHIN;
        checks.push(Check {
            text: if kept {
                format!("weights within {}", percent(e))
            } else {
                format!("weights {} off", percent(e))
            },
            kept,
            aimed: aim.weights,
        });
    }
    for t in &run.tenants {
        if let (Some(r), Some(missed)) = (t.reservation_iops, t.reservation_missed) {
            let kept = missed <= RARELY;
            checks.push(Check {
                text: if missed == 0.0 {
                    format!("{}'s reservation ({r:.0} IOPS) held", t.name)
                } else {
                    format!(
                        "{}'s reservation ({r:.0} IOPS) missed in {} of intervals",
                        t.name,
                        percent(missed)
                    )
                },
                kept,
                aimed: aim.reservations,
            });
        }
        if let (Some(l), Some(over)) = (t.limit_iops, t.limit_exceeded) {
            checks.push(Check {
                text: if over == 0.0 {
                    format!("{}'s limit ({l:.0} IOPS) held", t.name)
                } else {
                    format!(
                        "{} over its limit ({l:.0} IOPS) in {} of intervals",
                        t.name,
                        percent(over)
                    )
                },
                kept: over <= RARELY,
                aimed: aim.limits,
            });
        }
        if let (Some(slo), Some(met)) = (t.slo, t.slo_satisfaction) {
            checks.push(Check {
                text: format!(
                    "{}'s SLO ({:.0} IOPS within {}) met for {} of requests",
                    t.name,
                    slo.iops,
                    super::latency(slo.rt_us as f64),
                    percent(met)
                ),
                kept: met >= SLO_MET,
                aimed: aim.slo,
            });
        }
    }
    let figures = super::compare::figures_of(result, run);
    Judged {
        label: figures.label,
        checks,
        vs_none: figures.vs_none,
        share_error,
        worst_p99_us: figures.worst_p99_us,
    }
}

/// The verdicts as plain text: the paragraph and a table per sweep point.
pub fn text(result: &ScenarioResult) -> String {
    let mut out = String::new();
    for v in verdicts(result) {
        if !v.variant.is_empty() {
            let _ = writeln!(out, "-- {}", v.variant);
        }
        let _ = writeln!(out, "Verdict: {}", v.paragraph());
        let _ = writeln!(
            out,
            "{:<14} {:>6} {:>12}  why",
            "policy", "missed", "throughput"
        );
        for j in &v.ranked {
            let why = match j.missed() {
                0 => j.kept_text(),
                _ => format!("misses {}", j.missed_text()),
            };
            let _ = writeln!(
                out,
                "{:<14} {:>6} {:>12}  {}",
                j.label,
                format!("{}/{}", j.missed(), j.checks.len()),
                j.throughput(),
                if why.is_empty() {
                    "nothing to miss".into()
                } else {
                    why
                }
            );
        }
    }
    out
}

/// Writes the verdict section of the report.
pub fn section(out: &mut String, result: &ScenarioResult) {
    let all = verdicts(result);
    if all.iter().all(|v| v.ranked.is_empty()) {
        return;
    }
    out.push_str("<h2>Verdict</h2>\n");
    let _ = writeln!(
        out,
        "<p class=\"note\">Each policy checked against every promise the tenants hold: weights (per-interval share error of device time within {}, against what weights, reservations and limits entitle each tenant to), reservations and limits (missed in at most {} of intervals), SLOs (at least {} of requests within rt). Ranked by promises missed, then throughput against <code>none</code>. <i>not its aim</i>: a promise the policy does not make, counted still, since these tenants hold it.</p>",
        percent(WEIGHTS_WITHIN),
        percent(RARELY),
        percent(SLO_MET)
    );
    for v in all {
        if !v.variant.is_empty() {
            let _ = writeln!(out, "<h3>{}</h3>", escape(&v.variant));
        }
        let _ = writeln!(out, "<p><b>{}</b></p>", escape(&v.paragraph()));
        out.push_str("<div class=\"wide\"><table><tr><th>policy</th><th>promises missed</th><th>throughput vs none</th><th class=\"text\">kept</th><th class=\"text\">missed</th></tr>\n");
        for j in &v.ranked {
            let _ = writeln!(
                out,
                "<tr><td>{}</td><td>{} of {}</td><td>{}</td><td class=\"text\">{}</td><td class=\"text\">{}</td></tr>",
                escape(&j.label),
                j.missed(),
                j.checks.len(),
                escape(&j.throughput()),
                escape(&j.kept_text()),
                escape(&j.missed_text())
            );
        }
        out.push_str("</table></div>\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::Scenario;

    fn run(path: &str, policies: &str) -> ScenarioResult {
        let text = std::fs::read_to_string(path).unwrap();
        let text: String = text
            .lines()
            .map(|l| match l.starts_with("policies =") {
                true => format!("policies = {policies}\n"),
                false => format!("{l}\n"),
            })
            .collect();
        let s = Scenario::parse(&text, path, "t").unwrap();
        crate::sim::run_scenario(&s, false).unwrap()
    }

    #[test]
    fn mclock_keeps_reservations_and_limits_the_schedulers_by_weight_miss() {
        let r = run(
            "scenarios/mclock-reservations.toml",
            "[\"none\", \"sfq\", \"ta1\", \"mclock\"]",
        );
        let v = &verdicts(&r)[0];
        let order: Vec<&str> = v.ranked.iter().map(|j| j.label.as_str()).collect();
        assert_eq!(order[0], "mclock", "{order:?}");
        let best = &v.ranked[0];
        assert_eq!(best.missed(), 0);
        // weights, two reservations, one limit.
        assert_eq!(best.checks.len(), 4);
        assert!(
            v.paragraph()
                .starts_with("mclock keeps every promise here: weights within ")
        );
        let sfq = v.ranked.iter().find(|j| j.label == "sfq").unwrap();
        let missed = sfq.missed_text();
        assert!(
            missed.contains(
                "gold's reservation (3000 IOPS) missed in 100.0 % of intervals (not its aim)"
            ),
            "{missed}"
        );
        assert!(
            missed.contains("capped over its limit (800 IOPS)"),
            "{missed}"
        );
        // sfq aims at weights: that miss is not marked.
        assert!(!missed.contains("off (not its aim)"), "{missed}");
        let ta1 = v.ranked.iter().find(|j| j.label == "ta1").unwrap();
        assert!(ta1.missed_text().contains("off (not its aim)"));
    }

    #[test]
    fn equal_tenants_on_one_workload_need_no_scheduling() {
        let text = "duration_s = 3\npolicies = ['sfq', 'none']\n[device]\nmodel = 'fixed'\nparallelism = 4\n\
                    [[tenant]]\nname = 'a'\nworkload = { pattern = 'randread', size = '4k', iodepth = 4 }\n\
                    [[tenant]]\nname = 'b'\nworkload = { pattern = 'randread', size = '4k', iodepth = 4 }\n";
        let s = Scenario::parse(text, "t.toml", "t").unwrap();
        let r = crate::sim::run_scenario(&s, false).unwrap();
        let v = &verdicts(&r)[0];
        // Both keep the weights at the same throughput; none's share error is no larger,
        // so either may lead, and whichever leads keeps every promise.
        assert_eq!(v.ranked.len(), 2);
        assert!(v.ranked.iter().all(|j| j.missed() == 0), "{:?}", v.ranked);
        if v.ranked[0].label == "none" {
            assert!(v.paragraph().contains("No scheduling is needed"));
        }
        let t = super::text(&r);
        assert!(t.starts_with("Verdict: "), "{t}");
        assert_eq!(t.lines().count(), 4, "{t}");
    }

    #[test]
    fn a_missed_slo_is_said_with_its_figure_and_ranks_behind() {
        let r = run("scenarios/slo-poisson-flooder.toml", "[\"none\", \"ta3\"]");
        let v = &verdicts(&r)[0];
        let none = v.ranked.iter().find(|j| j.label == "none").unwrap();
        let ta3 = v.ranked.iter().find(|j| j.label == "ta3").unwrap();
        assert!(ta3.missed() <= none.missed());
        for j in &v.ranked {
            for c in j.checks.iter().filter(|c| c.text.contains("SLO")) {
                assert!(c.text.contains("met for "), "{}", c.text);
                assert_eq!(c.aimed, j.label == "ta3");
            }
        }
    }
}
