//! The verdict: which policy keeps the tenants' promises best here, at what throughput
//! cost, and why — the paragraph and table at the top of every report, and what
//! `ioshare advise` prints.
//!
//! A tenant's promises are its SLO (`{iops, size, rt}`), its reservation and its limit
//! (mClock's, in requests a second) and its weight (every tenant has one). Each run is
//! checked against every promise the scenario's tenants hold:
//! * an SLO: at least [`SLO_MET`] of the tenant's requests within its response time
//!   (the SLO conformance matrix's bar);
//! * a reservation: its deficit past half a second of the reservation for at most
//!   [`RARELY`] of the time it asked ([`crate::metrics::promise`]);
//! * a limit: its excess past half a second of the limit for at most [`RARELY`] of the
//!   time;
//! * weights: every backlogged tenant insulated — at least [`INSULATED`] of what its
//!   entitled slice of the device gives it alone ([`crate::metrics::insulation`]) —
//!   and the per-interval share error in device time, against what weights,
//!   reservations and limits entitle each tenant to ([`crate::metrics::entitled`]), at
//!   most [`WEIGHTS_WITHIN`]. Without alone runs, the share error alone.
//!
//! **Ranking.** Promises have an order: by default SLOs, then reservations, then
//! limits, then weights ([`Ranking`], `advise --rank`); a tenant's `priority` puts all
//! its promises before (higher) or after (lower) everyone else's. Runs are compared by
//! what they miss at the first level, then the next — how many, then how far (the
//! shortfalls summed, [`Check::shortfall`]): a policy that breaks a promise of a higher
//! level never heads the list above one that keeps it, and among those that all miss
//! it the nearest comes first. Ties go to total
//! throughput against `none` in steps of [`SAME_THROUGHPUT`] (highest first), then the
//! share error, then the worst tenant's p99 (an insulation above the bar is kept: how
//! far above does not rank).
//!
//! **Infeasible promises.** An SLO or reservation the tenant misses even alone on the
//! device (its alone run, [`crate::sim::alone`]) is said to be infeasible with the
//! alone figure and what would be feasible; it counts against no policy.
//!
//! Figures that miss a target never round onto it: a fraction that must reach a bar
//! is shown rounded down, one that must stay under a bar rounded up.
//!
//! Each policy is also judged on the promises it makes ([`crate::policy::Aims`]): a
//! figure it does not aim at is marked so — a token bucket far from the weights is
//! doing what it was built to do — but it still counts against it when the tenants
//! hold that promise, since the question is which policy these tenants should run
//! under.

use super::html::escape;
use crate::metrics::insulation::INSULATED;
use crate::metrics::{RunResult, ScenarioResult, TenantResult};
use crate::policy::{Aims, aims};
use std::cmp::Ordering;
use std::fmt::Write as _;

/// Weights are kept when the per-interval share error is at most this.
pub const WEIGHTS_WITHIN: f64 = 0.05;
/// An SLO is kept when at least this fraction of the tenant's requests met it.
pub const SLO_MET: f64 = crate::metrics::SLO_MET;
/// A reservation or limit is kept when missed for at most this fraction of the time.
pub const RARELY: f64 = 0.05;
/// Totals within this fraction of each other count as the same throughput.
pub const SAME_THROUGHPUT: f64 = 0.02;
/// Misses of one level nearer than this to each other count as equally far.
pub const SHORTFALL_STEP: f64 = 0.01;

/// A kind of promise.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Promise {
    /// A response-time objective.
    Slo,
    /// A reservation (minimum requests a second).
    Reservation,
    /// A limit (maximum requests a second).
    Limit,
    /// The weights: insulation and the per-interval share.
    Weights,
}

impl Promise {
    /// Every kind, in the default order.
    pub const ALL: [Promise; 4] = [
        Promise::Slo,
        Promise::Reservation,
        Promise::Limit,
        Promise::Weights,
    ];

    /// Its name in `--rank`.
    pub fn name(self) -> &'static str {
        match self {
            Promise::Slo => "slo",
            Promise::Reservation => "reservation",
            Promise::Limit => "limit",
            Promise::Weights => "weights",
        }
    }
}

/// The order promises are ranked in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ranking {
    order: Vec<Promise>,
}

impl Default for Ranking {
    fn default() -> Self {
        Ranking {
            order: Promise::ALL.to_vec(),
        }
    }
}

impl Ranking {
    /// Parses `slo,reservation,limit,weights` (any order; kinds left out come after
    /// the named ones, in the default order).
    pub fn parse(text: &str) -> Result<Ranking, String> {
        let mut order = Vec::new();
        for word in text.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            let p = Promise::ALL
                .into_iter()
                .find(|p| p.name() == word.to_ascii_lowercase())
                .ok_or_else(|| {
                    format!(
                        "`{word}` is not a kind of promise: name some of slo, reservation, limit, weights, separated by commas"
                    )
                })?;
            if order.contains(&p) {
                return Err(format!("`{word}` is named twice"));
            }
            order.push(p);
        }
        if order.is_empty() {
            return Err("name at least one of slo, reservation, limit, weights".into());
        }
        let rest: Vec<Promise> = Promise::ALL
            .into_iter()
            .filter(|p| !order.contains(p))
            .collect();
        order.extend(rest);
        Ok(Ranking { order })
    }

    /// Where `promise` comes: 0 first.
    fn place(&self, promise: Promise) -> usize {
        self.order
            .iter()
            .position(|&p| p == promise)
            .expect("every kind is in the order")
    }

    /// The order, in words.
    pub fn describe(&self) -> String {
        self.order
            .iter()
            .map(|p| p.name())
            .collect::<Vec<_>>()
            .join(" > ")
    }
}

/// One promise checked in one run.
#[derive(Debug, Clone, PartialEq)]
pub struct Check {
    /// What was checked, in words, with the figure ("weights within 1.8 %").
    pub text: String,
    /// Whether the run kept it.
    pub kept: bool,
    /// Whether the policy aims at this kind of promise.
    pub aimed: bool,
    /// Its kind.
    pub promise: Promise,
    /// Its tenant's priority (0 for the weights, which are everyone's).
    pub priority: i32,
    /// Missed even alone: no policy can keep it; why, with the alone figure.
    pub infeasible: Option<String>,
    /// How far it is from kept (0 when kept): the SLO's or insulation's distance under
    /// its bar, the reservation's or limit's time past [`RARELY`], the share error's
    /// past [`WEIGHTS_WITHIN`].
    pub shortfall: f64,
}

impl Check {
    /// Whether it counts as missed: not kept, and feasible.
    pub fn missed(&self) -> bool {
        !self.kept && self.infeasible.is_none()
    }
}

/// Where a promise comes: `(−priority, place of its kind)`, first first.
type Level = (i32, usize);

/// One run judged.
#[derive(Debug, Clone, PartialEq)]
pub struct Judged {
    /// The run's label (policy, and sweep point).
    pub label: String,
    /// The checks, per tenant (SLO, reservation, limit), then the weights.
    pub checks: Vec<Check>,
    /// Total throughput over `none`'s at the same point.
    pub vs_none: Option<f64>,
    /// Per-interval share error in device time, when judged.
    pub share_error: Option<f64>,
    /// The lowest insulation of a backlogged tenant, when judged.
    pub min_insulation: Option<f64>,
    /// The worst p99 of any tenant that completed a request, µs.
    pub worst_p99_us: Option<f64>,
}

impl Judged {
    /// How many promises it missed (infeasible ones not counted).
    pub fn missed(&self) -> usize {
        self.checks.iter().filter(|c| c.missed()).count()
    }

    /// How many promises could be kept (infeasible ones not counted).
    pub fn feasible(&self) -> usize {
        self.checks
            .iter()
            .filter(|c| c.infeasible.is_none())
            .count()
    }

    /// Misses per level, first level first: `(−priority, place of the kind)` with how
    /// many and how far (their shortfalls summed, in steps of [`SHORTFALL_STEP`]).
    fn misses(&self, ranking: &Ranking) -> Vec<(Level, (usize, i64))> {
        let mut levels: Vec<(Level, (usize, f64))> = Vec::new();
        for c in self.checks.iter().filter(|c| c.missed()) {
            let level = (-c.priority, ranking.place(c.promise));
            match levels.iter_mut().find(|(l, _)| *l == level) {
                Some((_, (n, far))) => {
                    *n += 1;
                    *far += c.shortfall;
                }
                None => levels.push((level, (1, c.shortfall))),
            }
        }
        levels.sort_by_key(|l| l.0);
        levels
            .into_iter()
            .map(|(l, (n, far))| (l, (n, (far / SHORTFALL_STEP).round() as i64)))
            .collect()
    }

    /// Compares what two runs miss, level by level: at the first level where they
    /// differ, fewer misses first, then the nearer misses.
    fn cmp_misses(&self, other: &Judged, ranking: &Ranking) -> Ordering {
        let (a, b) = (self.misses(ranking), other.misses(ranking));
        let mut levels: Vec<Level> = a.iter().chain(&b).map(|(l, _)| *l).collect();
        levels.sort();
        levels.dedup();
        let at = |m: &[(Level, (usize, i64))], l| {
            m.iter().find(|(x, _)| *x == l).map_or((0, 0), |(_, n)| *n)
        };
        for l in levels {
            match at(&a, l).cmp(&at(&b, l)) {
                Ordering::Equal => continue,
                o => return o,
            }
        }
        Ordering::Equal
    }

    /// Throughput in steps of [`SAME_THROUGHPUT`], highest first.
    fn throughput_step(&self) -> i64 {
        -(self.vs_none.unwrap_or(1.0) / SAME_THROUGHPUT).round() as i64
    }

    fn cmp(&self, other: &Judged, ranking: &Ranking) -> Ordering {
        self.cmp_misses(other, ranking)
            .then(self.throughput_step().cmp(&other.throughput_step()))
            .then(
                self.share_error
                    .unwrap_or(0.0)
                    .total_cmp(&other.share_error.unwrap_or(0.0)),
            )
            .then(
                self.worst_p99_us
                    .unwrap_or(0.0)
                    .total_cmp(&other.worst_p99_us.unwrap_or(0.0)),
            )
    }

    /// The promises it keeps, in words.
    pub fn kept_text(&self) -> String {
        self.checks
            .iter()
            .filter(|c| c.kept)
            .map(|c| c.text.clone())
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// The promises it misses, in words (infeasible ones left out).
    pub fn missed_text(&self) -> String {
        self.checks
            .iter()
            .filter(|c| c.missed())
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
    /// The order the promises were ranked in.
    pub ranking: Ranking,
    /// Promises no policy can keep, with the alone figure (once each).
    pub infeasible: Vec<String>,
    /// Tenants whose weight does not bind under the best policy (never backlogged),
    /// each with its p99 there.
    pub unbound: Vec<(String, f64)>,
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
                    "{} fits: these tenants hold no promise it could keep or miss{at}.",
                    best.label
                )
            } else {
                format!("{} keeps every promise here: {checked}{at}.", best.label)
            }
        } else {
            let kept = best.kept_text();
            let kept = if kept.is_empty() {
                String::new()
            } else {
                format!(" It keeps: {kept}.")
            };
            format!(
                "No policy keeps every promise here; {} keeps the ones that come first ({}) and misses: {}{at}.{kept}",
                best.label,
                self.ranking.describe(),
                best.missed_text()
            )
        };
        if best.label == "none" && best.missed() == 0 {
            out.push_str(" No scheduling is needed for these tenants on this device.");
        }
        for why in &self.infeasible {
            let _ = write!(out, " Infeasible: {why}.");
        }
        if !self.unbound.is_empty() {
            let names: Vec<String> = self
                .unbound
                .iter()
                .map(|(n, p99)| format!("{n} (p99 {})", super::latency(*p99)))
                .collect();
            let _ = write!(
                out,
                " The weight of {} does not bind: never backlogged, it got all it asked for; its latency is what to read.",
                names.join(", ")
            );
        }
        let same: Vec<&str> = self.ranked[1..]
            .iter()
            .filter(|j| {
                j.cmp_misses(best, &self.ranking) == Ordering::Equal
                    && j.throughput_step() == best.throughput_step()
            })
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
            } else if next.cmp_misses(best, &self.ranking) == Ordering::Greater {
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

/// One verdict per sweep point, in the runs' order, promises in the default order.
pub fn verdicts(result: &ScenarioResult) -> Vec<Verdict> {
    verdicts_ranked(result, &Ranking::default())
}

/// [`verdicts`] with the promises in `ranking`'s order.
pub fn verdicts_ranked(result: &ScenarioResult, ranking: &Ranking) -> Vec<Verdict> {
    let mut variants: Vec<&str> = result.runs.iter().map(|r| r.variant.as_str()).collect();
    variants.dedup();
    variants
        .into_iter()
        .map(|variant| {
            let runs: Vec<&RunResult> = result
                .runs
                .iter()
                .filter(|r| r.variant == variant)
                .collect();
            let mut ranked: Vec<Judged> = runs.iter().map(|r| judge(result, r)).collect();
            // A stable sort: equal keys keep the runs' order.
            ranked.sort_by(|a, b| a.cmp(b, ranking));
            let infeasible = ranked
                .first()
                .map(|j| {
                    j.checks
                        .iter()
                        .filter_map(|c| c.infeasible.clone())
                        .collect()
                })
                .unwrap_or_default();
            let unbound = ranked
                .first()
                .and_then(|best| {
                    runs.iter()
                        .find(|r| super::html::run_label(r) == best.label)
                })
                .map(|r| unbound(r))
                .unwrap_or_default();
            Verdict {
                variant: variant.to_string(),
                ranked,
                ranking: ranking.clone(),
                infeasible,
                unbound,
            }
        })
        .collect()
}

/// Tenants whose weight does not bind in `run`: never backlogged while the weights
/// differ (with equal weights there is nothing to say), with their p99.
fn unbound(run: &RunResult) -> Vec<(String, f64)> {
    let first = run.tenants.first().map_or(1.0, |t| t.weight);
    if run.tenants.iter().all(|t| t.weight == first) {
        return Vec::new();
    }
    run.tenants
        .iter()
        .filter(|t| !t.backlogged && t.ios > 0)
        .map(|t| (t.name.clone(), t.latency_us.p99))
        .collect()
}

/// `x` as a percentage with one decimal, rounded down: for a figure that must reach a
/// bar (98.96 % is "98.9 %", never "99.0 %").
fn percent_down(x: f64) -> String {
    format!("{:.1} %", (x * 1000.0 + 1e-9).floor() / 10.0)
}

/// `x` as a percentage with one decimal, rounded up: for a figure that must stay under
/// a bar (5.04 % is "5.1 %", never "5.0 %").
fn percent_up(x: f64) -> String {
    format!("{:.1} %", (x * 1000.0 - 1e-9).ceil().max(0.0) / 10.0)
}

/// `x` with two decimals, rounded down (an insulation of 0.899 is "0.89").
fn down2(x: f64) -> String {
    format!("{:.2}", (x * 100.0 + 1e-9).floor() / 100.0)
}

/// The response time at which `alone`'s p99 is met, rounded up to a readable step.
fn feasible_rt(p99_us: f64) -> String {
    let step = if p99_us >= 10_000.0 {
        1000.0
    } else if p99_us >= 1000.0 {
        100.0
    } else {
        10.0
    };
    super::latency((p99_us / step).ceil() * step)
}

/// The SLO check of tenant `t`.
fn slo_check(t: &TenantResult, aim: &Aims) -> Option<Check> {
    let (slo, met) = (t.slo?, t.slo_satisfaction?);
    let what = format!(
        "{}'s SLO ({:.0} IOPS within {})",
        t.name,
        slo.iops,
        super::latency(slo.rt_us as f64)
    );
    let infeasible = t
        .alone
        .and_then(|a| a.slo_satisfaction.map(|s| (s, a.p99_us)))
        .filter(|(s, _)| *s < SLO_MET)
        .map(|(s, p99)| {
            format!(
                "{what} is met for {} of requests even alone (p99 {}) — no policy can keep it; alone it meets {} at rt ≥ {}{}",
                percent_down(s),
                super::latency(p99),
                percent_down(SLO_MET),
                feasible_rt(p99),
                match t.alone.and_then(|a| a.feasible_iops) {
                    Some(n) => format!(" or at ≤ {n:.0} IOPS"),
                    None => String::new(),
                }
            )
        });
    Some(Check {
        text: format!("{what} met for {} of requests", percent_down(met)),
        kept: met >= SLO_MET,
        aimed: aim.slo,
        promise: Promise::Slo,
        priority: t.priority,
        infeasible,
        shortfall: (SLO_MET - met).max(0.0),
    })
}

/// The reservation check of tenant `t`.
fn reservation_check(t: &TenantResult, aim: &Aims) -> Option<Check> {
    let (r, missed) = (t.reservation_iops?, t.reservation_missed?);
    let what = format!("{}'s reservation ({r:.0} IOPS)", t.name);
    let kept = missed <= RARELY;
    let infeasible = t
        .alone
        .and_then(|a| a.reservation_missed.map(|m| (m, a.iops)))
        .filter(|(m, _)| *m > RARELY)
        .map(|(m, iops)| {
            format!(
                "{what} is short for {} of the time it asks even alone (it gets {iops:.0} IOPS alone) — no policy can keep it",
                percent_up(m)
            )
        });
    Some(Check {
        text: if missed == 0.0 {
            format!("{what} held")
        } else if kept {
            format!(
                "{what} held but for {} of the time it asked",
                percent_up(missed)
            )
        } else {
            format!(
                "{what} short for {} of the time it asked",
                percent_up(missed)
            )
        },
        kept,
        aimed: aim.reservations,
        promise: Promise::Reservation,
        priority: t.priority,
        infeasible,
        shortfall: (missed - RARELY).max(0.0),
    })
}

/// The limit check of tenant `t`.
fn limit_check(t: &TenantResult, aim: &Aims) -> Option<Check> {
    let (l, over) = (t.limit_iops?, t.limit_exceeded?);
    let kept = over <= RARELY;
    Some(Check {
        text: if over == 0.0 {
            format!("{}'s limit ({l:.0} IOPS) held", t.name)
        } else {
            format!(
                "{} over its limit ({l:.0} IOPS) for {} of the time",
                t.name,
                percent_up(over)
            )
        },
        kept,
        aimed: aim.limits,
        promise: Promise::Limit,
        priority: t.priority,
        infeasible: None,
        shortfall: (over - RARELY).max(0.0),
    })
}

/// The weights check of `run`: insulation of the backlogged tenants (when judged) and
/// the per-interval share error.
fn weights_check(run: &RunResult, aim: &Aims) -> Option<Check> {
    let share = (run.intervals_judged > 0).then_some(run.interval_share_error);
    let judged: Vec<(&str, f64)> = run
        .tenants
        .iter()
        .filter(|t| t.backlogged)
        .filter_map(|t| t.insulation.map(|r| (t.name.as_str(), r)))
        .collect();
    if share.is_none() && judged.is_empty() {
        return None;
    }
    let mut below: Vec<(&str, f64)> = judged
        .iter()
        .copied()
        .filter(|(_, r)| *r < INSULATED)
        .collect();
    below.sort_by(|a, b| a.1.total_cmp(&b.1));
    let share_kept = share.is_none_or(|e| e <= WEIGHTS_WITHIN);
    let kept = below.is_empty() && share_kept;
    let mut parts = Vec::new();
    if !judged.is_empty() {
        if below.is_empty() {
            let (who, lowest) = judged
                .iter()
                .copied()
                .min_by(|a, b| a.1.total_cmp(&b.1))
                .expect("some tenant judged");
            parts.push(format!(
                "every backlogged tenant insulated (lowest R {}, {who})",
                down2(lowest)
            ));
        } else {
            let shown: Vec<String> = below
                .iter()
                .take(3)
                .map(|(n, r)| format!("{n} R {}", down2(*r)))
                .collect();
            let more = match below.len() {
                n if n > 3 => format!(" and {} more", n - 3),
                _ => String::new(),
            };
            parts.push(format!(
                "{}{more} under {INSULATED:.1} of its slice",
                shown.join(", ")
            ));
        }
    }
    if let Some(e) = share {
        parts.push(if e <= WEIGHTS_WITHIN {
            format!("per interval within {}", percent_up(e))
        } else {
            format!("per interval {} off", percent_up(e))
        });
    }
    Some(Check {
        text: format!("weights: {}", parts.join(", ")),
        kept,
        aimed: aim.weights,
        promise: Promise::Weights,
        priority: 0,
        infeasible: None,
        shortfall: below.first().map_or(0.0, |(_, r)| INSULATED - r)
            + share.map_or(0.0, |e| (e - WEIGHTS_WITHIN).max(0.0)),
    })
}

/// Checks one run against every promise its tenants hold.
pub fn judge(result: &ScenarioResult, run: &RunResult) -> Judged {
    let aim: Aims = aims(&run.policy_name);
    let mut checks = Vec::new();
    for t in &run.tenants {
        checks.extend(slo_check(t, &aim));
        checks.extend(reservation_check(t, &aim));
        checks.extend(limit_check(t, &aim));
    }
    checks.extend(weights_check(run, &aim));
    let figures = super::compare::figures_of(result, run);
    Judged {
        label: figures.label,
        checks,
        vs_none: figures.vs_none,
        share_error: figures.share_error,
        min_insulation: run
            .tenants
            .iter()
            .filter(|t| t.backlogged)
            .filter_map(|t| t.insulation)
            .reduce(f64::min),
        worst_p99_us: figures.worst_p99_us,
    }
}

/// The verdicts as plain text: the paragraph and a table per sweep point.
pub fn text(result: &ScenarioResult) -> String {
    text_ranked(result, &Ranking::default())
}

/// [`text`] with the promises in `ranking`'s order.
pub fn text_ranked(result: &ScenarioResult, ranking: &Ranking) -> String {
    let mut out = String::new();
    for v in verdicts_ranked(result, ranking) {
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
                format!("{}/{}", j.missed(), j.feasible()),
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
        "<p class=\"note\">Each policy checked against every promise the tenants hold: SLOs (at least {} of requests within rt), reservations and limits (short of the reservation, or over the limit, by more than half a second of it for at most {} of the time), weights (every backlogged tenant at least {INSULATED:.1} of what its entitled slice of the device gives it alone, where alone runs were made, and the per-interval share error of device time within {}). Ranked by what they miss at the first level of {}, then the next, then throughput against <code>none</code>. A promise missed even alone is infeasible and counts against no policy. <i>not its aim</i>: a promise the policy does not make, counted still, since these tenants hold it.</p>",
        percent_down(SLO_MET),
        percent_down(RARELY),
        percent_down(WEIGHTS_WITHIN),
        escape(&Ranking::default().describe()),
    );
    for v in all {
        if !v.variant.is_empty() {
            let _ = writeln!(out, "<h3>{}</h3>", escape(&v.variant));
        }
        let _ = writeln!(out, "<p><b>{}</b></p>", escape(&v.paragraph()));
        out.push_str("<div class=\"wide\"><table><tr><th>policy</th><th>promises missed</th><th>throughput vs none</th><th>lowest R</th><th class=\"text\">kept</th><th class=\"text\">missed</th></tr>\n");
        for j in &v.ranked {
            let _ = writeln!(
                out,
                "<tr><td>{}</td><td>{} of {}</td><td>{}</td><td>{}</td><td class=\"text\">{}</td><td class=\"text\">{}</td></tr>",
                escape(&j.label),
                j.missed(),
                j.feasible(),
                escape(&j.throughput()),
                j.min_insulation.map_or_else(|| "n/a".into(), down2),
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
    fn mclock_keeps_reservations_the_schedulers_by_weight_miss_them() {
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
            v.paragraph().starts_with(
                "mclock keeps every promise here: gold's reservation (3000 IOPS) held"
            ),
            "{}",
            v.paragraph()
        );
        let sfq = v.ranked.iter().find(|j| j.label == "sfq").unwrap();
        let missed = sfq.missed_text();
        assert!(
            missed.contains(
                "gold's reservation (3000 IOPS) short for 100.0 % of the time it asked (not its aim)"
            ),
            "{missed}"
        );
        // Its limit is kept by the limit gate in front of it (`policy/limit.rs`).
        assert!(!missed.contains("capped over its limit"), "{missed}");
        // sfq aims at weights: that miss (if any) is not marked.
        assert!(!missed.contains("off (not its aim)"), "{missed}");
        let ta1 = v.ranked.iter().find(|j| j.label == "ta1").unwrap();
        let ta1 = ta1.missed_text();
        assert!(
            ta1.contains("weights: ") && ta1.ends_with("(not its aim)"),
            "{ta1}"
        );
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
