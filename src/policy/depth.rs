//! Dispatch depth: how many requests a policy lets into the device at once, fixed or
//! adapted to what the tenants lose in the device's queue (`depth = "auto"`).
//!
//! An ordering policy (SFQ(D) of Jin, Chase, Kaur, "Interposed proportional sharing for a
//! storage service utility", SIGMETRICS 2004; mClock of Gulati, Merchant, Varman, OSDI
//! 2010) is fair only among the requests it still holds: once `D` requests are in the
//! device, the device serves them in its own order, and a tenant whose few requests all
//! sit in a deep device queue behind another tenant's many loses its share. SFQ(D)'s §4
//! trades fairness against `D` for that reason and advises the smallest `D` that keeps
//! the device busy, but which `D` that is depends on the device and on the mix: a fixed
//! depth small enough to restore the weights costs throughput, and one that costs none
//! keeps much of the error (measured: docs/readings.md, `depth.rs`; docs/conformance.md,
//! "Adaptive depth").
//!
//! `depth = "auto"` makes the paper's advice a feedback loop on the policy's own
//! fairness, not on device latency or throughput (both of which garbage collection
//! moves more than depth does; three such host-wide controllers were measured and
//! dropped, see docs/conformance.md). Every `window` the depth is judged on what
//! happened in it:
//! * a tenant *starved in the device* — a request of its arrived on one of its
//!   completions (within [`FOLLOWS_NS`]: a closed loop waiting on the device) while
//!   none of its others were held by the policy, some were in the device, and the
//!   policy says the tenant is behind (SFQ: its last finish tag is below virtual time,
//!   others were dispatched past it) — and the tenant never ran out of work in the
//!   window (an idle or light tenant falls behind because it sends little, not because
//!   it waits):
//!   the depth shrinks by an eighth (from the most requests outstanding in the window
//!   when there was no limit yet), never below `min_depth`;
//! * a request of a *timed* tenant (one whose completions the policy judges against a
//!   response-time target: mClock's tenants with an SLO that keep to their reservation)
//!   completed late (the policy says what late is: mClock, above `late` × the tenant's
//!   `rt` in the device) — the same, but down to a depth of 1: the tenant's guaranteed
//!   requests (mClock's reservations) go out past the limit
//!   ([`DispatchDepth::dispatched_exempt`]), so a short limit holds back only the
//!   requests in front of them;
//! * otherwise, when the depth held back a request the policy had queued, it grows by a
//!   sixteenth — but while a timed tenant is active (a request of its in the device, or
//!   a judged completion in the last second), only once [`GROW_AFTER`] timed completions
//!   in time have come since the depth last moved. Growth is earned by evidence, not by
//!   the passing of windows: a disk completes under one SLO request per 10 ms window,
//!   and a window without one said nothing about latency, yet grew the depth (measured:
//!   docs/readings.md, `depth.rs`). With `late` and `GROW_AFTER` the controller keeps
//!   roughly one timed completion in `8 × 1.5` (the eighth it shrinks by at a depth of
//!   ~12) above `late` × `rt`: a quantile, not a mean.
//!
//! **Reading: a window holds enough completions to judge by.** A window ends when its
//! `window_ms` have passed *and* [`WINDOW_COMPLETIONS`] requests completed in it (or
//! when a hundred times the time has passed, so an idle device still moves on). On an
//! SSD 10 ms hold thousands; on a disk one or two, and a window without an arrival of
//! the starved tenant grew the depth again, so the depth swung and the shares were far
//! off (measured: docs/readings.md, `depth.rs`).
//!
//! Shrinking fast and growing slowly keeps share error low; `min_depth` bounds what a
//! tenant that looks starved but is not (a light tenant sending exactly as fast as it is
//! served) can cost. The depth never grows much past what the engine's device queue lets
//! out: a depth the engine never reaches never binds.
//!
//! The controller is sans-I/O like the policies: it is told arrivals, dispatches and
//! completions with their times and keeps per-tenant counts, which it asserts never go
//! negative.

use super::{Gauge, PolicyError, PolicyParams};
use crate::types::{Nanos, TenantId};

/// What a tenant lost in the device's queue in the current window.
#[derive(Debug, Clone)]
struct TenantLoss {
    /// Requests dispatched and not yet completed.
    in_flight: u32,
    /// When the tenant last ran out of work (nothing held, nothing in flight).
    idle_since: Option<Nanos>,
    /// When a request of the tenant's last completed.
    last_completion: Option<Nanos>,
    /// Whether the tenant had nothing outstanding at some time in this window.
    idle_in_window: bool,
    /// Whether a request arrived in this window while the tenant's others were all in
    /// the device and it was behind.
    starved_in_window: bool,
    /// Whether the policy judges the tenant's completions against a response-time
    /// target ([`DispatchDepth::set_timed`]).
    timed: bool,
    /// When its last judged completion came.
    last_judged: Option<Nanos>,
}

impl TenantLoss {
    /// A tenant with nothing outstanding since `now`.
    fn idle(now: Nanos) -> Self {
        TenantLoss {
            in_flight: 0,
            idle_since: Some(now),
            last_completion: None,
            idle_in_window: true,
            starved_in_window: false,
            timed: false,
            last_judged: None,
        }
    }
}

/// `min_depth` by default.
pub const MIN_DEPTH: u64 = 16;

/// An arrival this soon after one of its tenant's completions was sent on it (module
/// doc): 50 µs, a client's turnaround over a local socket.
pub const FOLLOWS_NS: Nanos = 50_000;

/// Completions a window holds at least (module doc).
pub const WINDOW_COMPLETIONS: u32 = 32;

/// `min_depth` by default on a device bound by seeks.
pub const DISK_MIN_DEPTH: u64 = 4;

/// Depth changes kept for the report; later ones are counted, not kept.
const HISTORY: usize = 1024;

/// Timed completions in time that earn one step of growth while a timed tenant is
/// active (module doc).
pub const GROW_AFTER: u32 = 8;

/// How long a timed tenant counts as active after its last judged completion.
const TIMED_MEMORY: Nanos = 1_000_000_000;

/// The adaptive part of [`DispatchDepth`].
#[derive(Debug, Clone)]
struct Auto {
    /// Windows that shortened / lengthened the depth.
    shrinks: u64,
    grows: u64,
    /// The first [`HISTORY`] changes: (ms since start, new depth).
    history: Vec<(u64, u32)>,
    /// Smallest and largest limit set so far (`None` before the first).
    range: Option<(u32, u32)>,
    min_depth: u32,
    window: Nanos,
    window_start: Nanos,
    /// Whether the depth held back a queued request this window.
    binding: bool,
    /// Most requests outstanding at once this window.
    peak: u32,
    /// A request of a timed tenant completed late this window.
    late: bool,
    /// A timed tenant's request completed (late or not) this window.
    timed_seen: bool,
    /// Timed completions in time since the depth last moved.
    in_time: u32,
    /// Completions in this window.
    completed: u32,
    /// Completions a window holds at least before it ends.
    min_completions: u32,
}

/// A policy's dispatch depth: `0` = no limit of its own (the engine's device queue
/// applies), a fixed limit, or an adaptive one.
#[derive(Debug, Clone)]
pub struct DispatchDepth {
    limit: u32,
    /// The most requests the limit lets be outstanding now: the limit, or what was out
    /// when it was last lowered, until completions bring that under it.
    ceiling: u32,
    /// Requests in the device that the limit counts.
    outstanding: u32,
    /// Requests in the device dispatched outside the limit ([`Self::dispatched_exempt`]).
    exempt: u32,
    tenants: Vec<TenantLoss>,
    auto: Option<Auto>,
}

impl DispatchDepth {
    /// A fixed depth (`0`: no limit of its own) over `tenants` tenants.
    pub fn fixed(tenants: usize, limit: u32) -> Self {
        DispatchDepth {
            limit,
            ceiling: limit,
            outstanding: 0,
            exempt: 0,
            tenants: vec![TenantLoss::idle(0); tenants],
            auto: None,
        }
    }

    /// An adaptive depth, unlimited until the first tenant starves, never below
    /// `min_depth`, judged every `window` ns.
    pub fn auto(tenants: usize, min_depth: u32, window: Nanos) -> Self {
        DispatchDepth {
            auto: Some(Auto {
                shrinks: 0,
                grows: 0,
                history: Vec::new(),
                range: None,
                min_depth: min_depth.max(1),
                window: window.max(1),
                window_start: 0,
                binding: false,
                peak: 0,
                late: false,
                timed_seen: false,
                in_time: 0,
                completed: 0,
                min_completions: 0,
            }),
            ..Self::fixed(tenants, 0)
        }
    }

    /// Reads `depth` (`"auto"` or absent: `auto_by_default` decides; a non-negative
    /// integer: fixed, `0` = none), `min_depth` (default 16; 4 on a device bound by
    /// seeks, [`crate::device::cost::CostModel::seeks`]) and `window_ms` (default 10),
    /// the last two only with `"auto"`.
    pub fn from_params(
        params: &mut PolicyParams,
        tenants: usize,
        auto_by_default: bool,
    ) -> Result<Self, PolicyError> {
        let depth = params.depth_or_auto("depth", auto_by_default)?;
        if depth.is_some() {
            for key in ["min_depth", "window_ms"] {
                if params.is_set(key) {
                    return Err(params.invalid(key, "applies only with depth = \"auto\""));
                }
            }
        }
        // A disk reorders what it holds (its own queue of 16 on the shipped one): a
        // floor of 16 left nothing for the policy to order there.
        let default_min = if params.device().is_some_and(|d| d.seeks()) {
            DISK_MIN_DEPTH
        } else {
            MIN_DEPTH
        };
        let min_depth = params.u64_or("min_depth", default_min)?;
        if !(1..=4096).contains(&min_depth) {
            return Err(
                params.invalid("min_depth", format!("must be in 1..=4096, got {min_depth}"))
            );
        }
        let window_ms = params.f64_or("window_ms", 10.0)?;
        if !(window_ms > 0.0 && window_ms <= 60_000.0) {
            return Err(params.invalid(
                "window_ms",
                format!("must be in (0, 60000], got {window_ms}"),
            ));
        }
        Ok(match depth {
            Some(limit) => Self::fixed(tenants, limit),
            None => Self::auto(tenants, min_depth as u32, (window_ms * 1e6) as Nanos)
                .with_window_completions(WINDOW_COMPLETIONS),
        })
    }

    /// An adaptive depth's windows hold at least `n` completions (module doc).
    pub fn with_window_completions(mut self, n: u32) -> Self {
        if let Some(a) = self.auto.as_mut() {
            a.min_completions = n;
        }
        self
    }

    /// The limit now (`0`: none of its own).
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// Requests dispatched and not yet completed (within the limit and exempt).
    pub fn outstanding(&self) -> u32 {
        self.outstanding + self.exempt
    }

    /// Ends the window when `now` is past it and moves the depth (module doc).
    fn roll(&mut self, now: Nanos) {
        let Some(a) = self.auto.as_mut() else {
            return;
        };
        let elapsed = now.saturating_sub(a.window_start);
        if elapsed < a.window
            || a.completed < a.min_completions && elapsed < a.window.saturating_mul(100)
        {
            return;
        }
        let unfair = self
            .tenants
            .iter()
            .any(|t| t.starved_in_window && !t.idle_in_window);
        let before = self.limit;
        if unfair || a.late {
            // Lateness may shorten the queue below `min_depth`: the requests it limits
            // are not the late tenant's guaranteed ones (those go out exempt).
            let floor = if unfair { a.min_depth } else { 1 };
            let base = if self.limit == 0 { a.peak } else { self.limit };
            let shrunk = base.saturating_sub((base / 8).max(1)).max(floor);
            // Never a raise: lateness may have taken the limit below `min_depth`, and
            // a starved tenant in the same or a later window must not lift it back
            // (it did: 9 → 16 on the disk of the SLO matrix, docs/conformance.md).
            self.limit = if self.limit == 0 {
                shrunk
            } else {
                shrunk.min(self.limit)
            };
        } else if a.binding && self.limit > 0 {
            let timed_active = a.timed_seen
                || self.tenants.iter().any(|t| {
                    t.timed
                        && (t.in_flight > 0
                            || t.last_judged.is_some_and(|at| now - at <= TIMED_MEMORY))
                });
            if !timed_active || a.in_time >= GROW_AFTER {
                self.limit += (self.limit / 16).max(1);
            }
        }
        if self.limit != before {
            self.ceiling = self.limit.max(self.outstanding);
            a.in_time = 0;
            if self.limit < before || before == 0 {
                a.shrinks += 1;
            } else {
                a.grows += 1;
            }
            if a.history.len() < HISTORY {
                a.history.push((now / 1_000_000, self.limit));
            }
            let (lo, hi) = a.range.unwrap_or((self.limit, self.limit));
            a.range = Some((lo.min(self.limit), hi.max(self.limit)));
        }
        a.window_start = now;
        a.completed = 0;
        a.binding = false;
        a.late = false;
        a.timed_seen = false;
        a.peak = self.outstanding;
        for t in &mut self.tenants {
            t.starved_in_window = false;
            t.idle_in_window = t.idle_since.is_some();
        }
    }

    /// A request of `tenant` arrived at `now`; `held`: the policy holds others of the
    /// tenant's; `behind`: the policy's tags say the tenant has fallen behind the others.
    pub fn arrival(&mut self, tenant: TenantId, now: Nanos, held: bool, behind: bool) {
        if self.auto.is_none() {
            // A fixed depth judges nobody's loss.
            return;
        }
        self.roll(now);
        let t = &mut self.tenants[tenant as usize];
        // Only a request sent on a completion (a closed loop waiting on the device) says
        // the device holds the tenant back; an open-loop tenant's arrivals come when they
        // come, however few slots it has.
        let follows = t
            .last_completion
            .is_some_and(|c| now.saturating_sub(c) <= FOLLOWS_NS);
        if !held && t.in_flight > 0 && behind && follows {
            t.starved_in_window = true;
        }
        if t.idle_since.take().is_some_and(|since| now > since) {
            t.idle_in_window = true;
        }
    }

    /// Whether one more request may go to the device now; `queued`: requests the policy
    /// holds (a refusal with requests waiting counts as the depth binding).
    #[must_use]
    pub fn may_dispatch(&mut self, now: Nanos, queued: usize) -> bool {
        self.roll(now);
        if self.limit > 0 && self.outstanding >= self.limit {
            if let Some(a) = self.auto.as_mut() {
                a.binding |= queued > 0;
            }
            return false;
        }
        true
    }

    /// Whether the limit leaves room for one more request it counts (what
    /// [`Self::may_dispatch`] answered, without moving the window).
    pub fn has_room(&self) -> bool {
        self.limit == 0 || self.outstanding < self.limit
    }

    /// A request of `tenant` went to the device.
    pub fn dispatched(&mut self, tenant: TenantId) {
        self.tenants[tenant as usize].in_flight += 1;
        self.outstanding += 1;
        if let Some(a) = self.auto.as_mut() {
            a.peak = a.peak.max(self.outstanding);
        }
    }

    /// A request of `tenant` went to the device outside the limit (mClock's
    /// reservations): it counts for the tenant's requests in the device, not against
    /// the depth.
    pub fn dispatched_exempt(&mut self, tenant: TenantId) {
        self.tenants[tenant as usize].in_flight += 1;
        self.exempt += 1;
    }

    /// A request of `tenant` completed at `now`; `held`: the policy still holds others
    /// of the tenant's.
    pub fn completed(&mut self, tenant: TenantId, now: Nanos, held: bool) {
        self.roll(now);
        self.outstanding = self
            .outstanding
            .checked_sub(1)
            .expect("a completion of a request the policy dispatched");
        self.ceiling = self.limit.max(self.outstanding.min(self.ceiling));
        self.finished(tenant, now, held);
    }

    /// A request dispatched with [`Self::dispatched_exempt`] completed.
    pub fn completed_exempt(&mut self, tenant: TenantId, now: Nanos, held: bool) {
        self.roll(now);
        self.exempt = self
            .exempt
            .checked_sub(1)
            .expect("a completion of a request dispatched exempt");
        self.finished(tenant, now, held);
    }

    fn finished(&mut self, tenant: TenantId, now: Nanos, held: bool) {
        let t = &mut self.tenants[tenant as usize];
        t.in_flight = t
            .in_flight
            .checked_sub(1)
            .expect("a completion of a tenant's dispatched request");
        let Some(a) = self.auto.as_mut() else {
            // A fixed depth judges nobody's loss: the count is all it keeps.
            return;
        };
        a.completed = a.completed.saturating_add(1);
        let t = &mut self.tenants[tenant as usize];
        t.last_completion = Some(now);
        if t.in_flight == 0 && !held {
            t.idle_since = Some(now);
        }
    }

    /// Its counts agree with the policy's `in_flight` (every request it sent and has
    /// not seen complete), per tenant and in total, and no more are outstanding than the
    /// limit allowed when they went out.
    pub fn check(&self, in_flight: u64) -> Result<(), String> {
        let per_tenant: u64 = self.tenants.iter().map(|t| u64::from(t.in_flight)).sum();
        let total = u64::from(self.outstanding) + u64::from(self.exempt);
        if per_tenant != total || total != in_flight {
            return Err(format!(
                "depth: {per_tenant} in flight per tenant, {total} counted, the policy has {in_flight}"
            ));
        }
        if self.limit > 0 && self.outstanding > self.ceiling {
            return Err(format!(
                "depth: {} outstanding above the limit {} (ceiling {})",
                self.outstanding, self.limit, self.ceiling
            ));
        }
        Ok(())
    }

    /// What results.json's `policy_stats.depth` shows: the mode, the limit now and, for
    /// `"auto"`, its range, how often it moved and the first changes (ms, depth).
    pub fn report(&self) -> serde_json::Value {
        match &self.auto {
            None => serde_json::json!({ "mode": "fixed", "limit": self.limit }),
            Some(a) => serde_json::json!({
                "mode": "auto",
                "limit": self.limit,
                "min_depth": a.min_depth,
                "window_ms": a.window as f64 / 1e6,
                "lowest": a.range.map(|r| r.0),
                "highest": a.range.map(|r| r.1),
                "shrinks": a.shrinks,
                "grows": a.grows,
                "history_ms_depth": a.history,
                "history_complete": a.shrinks + a.grows <= HISTORY as u64,
            }),
        }
    }

    /// A request of a timed tenant completed at `now`, `late` or in time (the policy
    /// judges what late is). A late one shortens the depth at the end of the window
    /// like a starved tenant, whether or not its tenant ran out of work — a light
    /// tenant's latency is what the target is about; those in time earn growth
    /// (module doc).
    pub fn timed(&mut self, tenant: TenantId, now: Nanos, late: bool) {
        self.roll(now);
        self.tenants[tenant as usize].last_judged = Some(now);
        if let Some(a) = self.auto.as_mut() {
            a.timed_seen = true;
            if late {
                a.late = true;
            } else {
                a.in_time += 1;
            }
        }
    }

    /// Whether the policy judges `tenant`'s completions against a response-time target
    /// now (while it is timed and has a request in the device, the depth grows only on
    /// evidence: module doc).
    pub fn set_timed(&mut self, tenant: TenantId, timed: bool) {
        self.tenants[tenant as usize].timed = timed;
    }

    /// One more tenant (the last id), idle since `now` and not timed.
    pub fn add(&mut self, now: Nanos) {
        self.tenants.push(TenantLoss::idle(now));
    }

    /// The policy's `depth` and `outstanding` gauges.
    pub fn gauges(&self) -> [Gauge; 2] {
        [
            Gauge::policy(
                "outstanding",
                "Requests dispatched and not yet completed",
                f64::from(self.outstanding + self.exempt),
            ),
            Gauge::policy(
                "depth",
                "Most requests the policy lets out at once (0 = no limit of its own)",
                f64::from(self.limit),
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: Nanos = 10_000_000;

    /// A request of `tenant` sent on one of its completions (a closed loop).
    fn on_completion(d: &mut DispatchDepth, tenant: TenantId, at: Nanos, held: bool, behind: bool) {
        d.tenants[tenant as usize].last_completion = Some(at);
        d.arrival(tenant, at, held, behind);
    }

    /// Tenant 0 has one request in the device and sends another while behind; tenant 1
    /// has `others` in the device.
    fn starve(d: &mut DispatchDepth, at: Nanos, others: u32) {
        d.arrival(0, at, false, false);
        assert!(d.may_dispatch(at, 1));
        d.dispatched(0);
        for _ in 0..others {
            d.arrival(1, at, true, false);
            assert!(d.may_dispatch(at, 1));
            d.dispatched(1);
        }
        on_completion(d, 0, at + 1, false, true);
    }

    #[test]
    fn shrinks_by_an_eighth_of_the_peak_when_a_busy_tenant_starves() {
        let mut d = DispatchDepth::auto(2, 4, W);
        starve(&mut d, 0, 20);
        assert!(d.may_dispatch(W, 1));
        assert_eq!(
            d.limit(),
            0,
            "the first window saw only tenants coming from idle"
        );
        d.dispatched(0);
        starve(&mut d, W + 1, 20);
        assert_eq!(d.outstanding(), 43);
        assert!(
            !d.may_dispatch(2 * W + 1, 1),
            "the window's end moves the depth first"
        );
        assert_eq!(d.limit(), 43 - 43 / 8);
        // And again by an eighth of the limit, down to min_depth.
        let mut last = d.limit();
        for k in 3..40 {
            on_completion(&mut d, 0, k * W, false, true);
            let _ = d.may_dispatch(k * W + 1, 1);
            assert!(
                d.limit() < last || d.limit() == 4,
                "window {k}: {}",
                d.limit()
            );
            last = d.limit();
        }
        assert_eq!(last, 4);
    }

    #[test]
    fn grows_by_a_sixteenth_while_it_binds_and_nobody_starves() {
        let mut d = DispatchDepth::auto(1, 4, W);
        d.limit = 16;
        for _ in 0..16 {
            d.arrival(0, 0, true, false);
            assert!(d.may_dispatch(0, 10));
            d.dispatched(0);
        }
        assert!(!d.may_dispatch(0, 10), "the depth holds the rest back");
        assert!(d.may_dispatch(W, 10), "17 at the window's end");
        assert_eq!(d.limit(), 17);
        d.dispatched(0);
        // A window in which nothing was held back leaves the depth alone.
        assert!(!d.may_dispatch(W + 1, 0));
        d.completed(0, 2 * W, true);
        assert_eq!(d.limit(), 17);
    }

    #[test]
    fn a_tenant_that_ran_out_of_work_in_the_window_does_not_count() {
        let mut d = DispatchDepth::auto(2, 4, W);
        starve(&mut d, 0, 20);
        let _ = d.may_dispatch(W, 1);
        d.dispatched(0);
        // Both of tenant 0's requests complete: it runs out of work, then sends again.
        d.completed(0, W + 2, false);
        d.completed(0, W + 3, false);
        starve(&mut d, W + 5, 20);
        let _ = d.may_dispatch(2 * W + 5, 1);
        assert_eq!(
            d.limit(),
            0,
            "a light tenant's lag is not the device's doing"
        );
    }

    #[test]
    fn the_report_counts_every_move_and_keeps_a_bounded_history() {
        let mut d = DispatchDepth::auto(2, 4, W);
        starve(&mut d, 0, 20);
        // Windows alternate: tenant 0 behind (shrink), then the depth binding with
        // nobody behind (grow), so the depth moves at every window's end.
        for i in 0..(HISTORY as u64 + 200) {
            let t = (i + 1) * W;
            let _ = d.may_dispatch(t, 1);
            if i % 2 == 0 {
                on_completion(&mut d, 0, t, false, true);
            }
        }
        let r = d.report();
        assert_eq!(r["mode"], "auto");
        // 21 outstanding: 19, 20, 18, 19, 17, ... 15, 14, 15, 14: once an eighth of the
        // depth rounds to one request, a shrink and a grow cancel out.
        assert_eq!(r["lowest"], 14);
        assert_eq!(r["highest"], 20);
        let moves = r["shrinks"].as_u64().unwrap() + r["grows"].as_u64().unwrap();
        assert_eq!(moves, HISTORY as u64 + 199, "every window but the first");
        assert_eq!(r["history_ms_depth"].as_array().unwrap().len(), HISTORY);
        assert_eq!(r["history_complete"], false);
        assert_eq!(DispatchDepth::fixed(1, 8).report()["limit"], 8);
    }

    #[test]
    fn a_late_completion_shrinks_even_when_its_tenant_went_idle() {
        let mut d = DispatchDepth::auto(1, 4, W);
        d.limit = 32;
        d.arrival(0, 1, false, false);
        assert!(d.may_dispatch(1, 0));
        d.dispatched(0);
        d.completed(0, 2, false); // idle again: no starvation counts for it
        d.timed(0, 2, true);
        let _ = d.may_dispatch(W + 2, 0);
        assert_eq!(d.limit(), 28);
        // A fixed depth ignores lateness.
        let mut f = DispatchDepth::fixed(1, 32);
        f.timed(0, 2, true);
        let _ = f.may_dispatch(W + 2, 0);
        assert_eq!(f.limit(), 32);
    }

    /// While a timed tenant has a request in the device, a binding window grows the
    /// depth only after `GROW_AFTER` of its completions came in time; with none active,
    /// at every binding window.
    #[test]
    fn growth_beside_a_timed_tenant_is_earned_by_completions_in_time() {
        let mut d = DispatchDepth::auto(2, 1, W);
        d.limit = 4;
        d.set_timed(0, true);
        d.dispatched(0);
        let bind = |d: &mut DispatchDepth, at: Nanos| {
            while d.may_dispatch(at, 1) {
                d.dispatched(1);
            }
        };
        bind(&mut d, 1);
        // Windows pass with the timed tenant's request in the device: no growth.
        for w in 1..5 {
            bind(&mut d, w * W + 1);
        }
        assert_eq!(d.limit(), 4, "no evidence, no growth");
        // Seven completions in time (each followed by another dispatch of tenant 0) in a
        // binding window earn nothing; the eighth does.
        for i in 0..u64::from(GROW_AFTER) {
            d.completed(0, 5 * W + i, false);
            d.timed(0, 5 * W + i, false);
            d.dispatched(0);
            bind(&mut d, 5 * W + i);
            if i + 2 == u64::from(GROW_AFTER) {
                bind(&mut d, 6 * W + 1);
                assert_eq!(d.limit(), 4, "seven in time earn nothing");
            }
        }
        bind(&mut d, 7 * W + 1);
        assert_eq!(d.limit(), 5, "eight earned one step");
        bind(&mut d, 8 * W + 1);
        assert_eq!(d.limit(), 5, "and spent it");
        // The timed tenant leaves: a second after its last judged completion the depth
        // grows at every binding window again.
        d.completed(0, 8 * W + 2, false);
        bind(&mut d, 8 * W + 2 + TIMED_MEMORY);
        assert_eq!(d.limit(), 6);
        bind(&mut d, 9 * W + 2 + TIMED_MEMORY);
        assert_eq!(d.limit(), 7);
    }

    /// A starved tenant shrinks the depth down to `min_depth`, but never lifts a depth
    /// that lateness took below it.
    #[test]
    fn a_starved_tenant_never_raises_a_depth_below_min_depth() {
        let mut d = DispatchDepth::auto(2, 16, W);
        d.limit = 5;
        starve(&mut d, 0, 3);
        // The first window saw tenants coming from idle; the second sees tenant 0
        // starve while busy.
        on_completion(&mut d, 0, W + 1, false, true);
        assert_eq!(d.limit(), 5);
        let _ = d.may_dispatch(2 * W + 1, 1);
        assert_eq!(
            d.limit(),
            5,
            "starvation takes no depth below min_depth, nor lifts one to it (was 16)"
        );
    }

    #[test]
    fn a_fixed_depth_never_moves() {
        let mut d = DispatchDepth::fixed(2, 2);
        starve(&mut d, 0, 1);
        assert!(!d.may_dispatch(5 * W, 1));
        assert_eq!(d.limit(), 2);
        d.completed(1, 5 * W, false);
        assert!(d.may_dispatch(5 * W, 1));
    }

    #[test]
    #[should_panic(expected = "a completion of a tenant's dispatched request")]
    fn a_completion_without_a_dispatch_is_a_bug() {
        let mut d = DispatchDepth::fixed(2, 0);
        d.dispatched(0);
        d.completed(1, 1, false);
    }
}
