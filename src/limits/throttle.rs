//! `govern`: the kernel's cgroup I/O throttle in front of the device, its limits set
//! every period by the [`super::governor::Governor`] — what `ioshare govern` does to a
//! host's cgroups, run in the simulator so that its period and gains are tuned
//! deterministically before a real disk sees them.
//!
//! The throttle is Linux's blk-throttle as `io.max` (cgroup v2) and
//! `blkio.throttle.{read,write}_{iops,bps}_device` (v1) configure it: per tenant and
//! direction (reads; writes, trims and flushes), a request passes once its direction's
//! budget of requests and of bytes allows; the budget accrues at the limit and holds at
//! most a slice of it (`slice_ms`: the kernel's `throtl_slice`, 20 ms on a
//! non-rotational device, 100 ms on a disk), so an idle tenant cannot bank a burst. A
//! request larger than a slice's bytes passes on a full budget and leaves a debt, as
//! the kernel lets a large bio through over several slices. What passes goes to the
//! device in the order it passed (the device's own queue: `none`). A direction without
//! a limit passes at once.
//!
//! What the governor is fed is what the kernel counts: requests and bytes per tenant
//! and direction as they pass the throttle (`io.stat`, `blkio.throttle.io_serviced`),
//! and the device's completions with their times in the device (`/proc/diskstats`).

use super::governor::{Allocator, DeviceUsage, Governor, Limits, Params, Usage};
use crate::device::cost::CostModel;
use crate::policy::{
    Admission, Detail, Dispatch, Gauge, Observation, Policy, PolicyError, PolicyParams,
};
use crate::types::{Completion, Nanos, Op, Request, TenantId, TenantSpec, nanos_to_secs};
use std::collections::{BTreeSet, VecDeque};

/// One direction's budget.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Budget {
    /// Requests and bytes a second (`None`: no limit).
    iops: Option<f64>,
    bps: Option<f64>,
    /// What is left to spend (may be below zero after a large request).
    requests: f64,
    bytes: f64,
    /// When it last accrued.
    at: Nanos,
}

impl Budget {
    fn open() -> Self {
        Budget {
            iops: None,
            bps: None,
            requests: 0.0,
            bytes: 0.0,
            at: 0,
        }
    }

    /// Accrues up to `now`, holding at most a slice's worth.
    fn accrue(&mut self, now: Nanos, slice: Nanos) {
        let secs = nanos_to_secs(now.saturating_sub(self.at));
        self.at = self.at.max(now);
        let s = nanos_to_secs(slice);
        if let Some(r) = self.iops {
            self.requests = (self.requests + r * secs).min((r * s).max(1.0));
        }
        if let Some(b) = self.bps {
            self.bytes = (self.bytes + b * secs).min((b * s).max(1.0));
        }
    }

    /// Whether a request of `len` bytes may pass now.
    fn allows(&self, len: u32, slice: Nanos) -> bool {
        let s = nanos_to_secs(slice);
        let requests = self.iops.is_none_or(|_| self.requests >= 1.0);
        let bytes = self
            .bps
            .is_none_or(|b| self.bytes >= f64::from(len).min((b * s).max(1.0)));
        requests && bytes
    }

    /// When a request of `len` bytes may pass, accruing from now.
    fn ready_at(&self, len: u32, slice: Nanos) -> Nanos {
        let s = nanos_to_secs(slice);
        let wait = |have: f64, need: f64, rate: Option<f64>| match rate {
            Some(r) if r > 0.0 && have < need.min((r * s).max(1.0)) => {
                (need.min((r * s).max(1.0)) - have) / r
            }
            _ => 0.0,
        };
        let secs =
            wait(self.requests, 1.0, self.iops).max(wait(self.bytes, f64::from(len), self.bps));
        self.at + (secs * 1e9).ceil() as Nanos
    }

    fn spend(&mut self, len: u32) {
        if self.iops.is_some() {
            self.requests -= 1.0;
        }
        if self.bps.is_some() {
            self.bytes -= f64::from(len);
        }
    }

    /// New limits; what was left stays, within the new slice. A direction that had no
    /// limit starts with a full slice, as the kernel's first slice allows a slice's
    /// worth at once.
    fn set(&mut self, iops: Option<f64>, bps: Option<f64>, slice: Nanos) {
        let s = nanos_to_secs(slice);
        if let Some(r) = iops {
            let cap = (r * s).max(1.0);
            self.requests = if self.iops.is_none() {
                cap
            } else {
                self.requests.min(cap)
            };
        }
        if let Some(b) = bps {
            let cap = (b * s).max(1.0);
            self.bytes = if self.bps.is_none() {
                cap
            } else {
                self.bytes.min(cap)
            };
        }
        self.iops = iops;
        self.bps = bps;
    }
}

/// The direction a request counts in.
fn direction(op: Op) -> usize {
    match op {
        Op::Read | Op::Status => 0,
        Op::Write | Op::Trim | Op::Flush => 1,
    }
}

/// The enforcement alone: per tenant and direction, budgets at the limits it is given
/// and the requests waiting for them; what passes goes out in the order it passed. It
/// decides nothing: [`Throttle`] sets its limits from its governor every period, and
/// [`Limited`] takes them from outside (a cluster's fronts agreeing on each tenant's
/// part, `crate::cluster`).
#[derive(Debug, Clone)]
pub struct Gate {
    slice: Nanos,
    /// Per tenant, per direction: requests waiting for their budget, in arrival order.
    waiting: Vec<[VecDeque<Request>; 2]>,
    budgets: Vec<[Budget; 2]>,
    /// Requests that passed, waiting for the device, in the order they passed.
    passed: VecDeque<Request>,
    /// Requests in `waiting`.
    held: usize,
    /// Every queue in `waiting` that holds requests, keyed by when its head may pass:
    /// (time, tenant, direction). A pass takes the queues that are due, not every
    /// tenant (1,024 tenants cost a dispatch 2,048 looks otherwise).
    ready: BTreeSet<(Nanos, usize, usize)>,
    /// The time each queue is keyed by in `ready`.
    ready_at: Vec<[Option<Nanos>; 2]>,
    /// This period's counts per tenant, as they pass.
    usage: Vec<Usage>,
}

impl Gate {
    /// A gate for `tenants` tenants, no limits yet, budgets holding `slice` ns.
    pub fn new(tenants: usize, slice: Nanos) -> Gate {
        let mut g = Gate {
            slice: slice.max(1),
            waiting: Vec::new(),
            budgets: Vec::new(),
            passed: VecDeque::new(),
            held: 0,
            ready: BTreeSet::new(),
            ready_at: Vec::new(),
            usage: Vec::new(),
        };
        for _ in 0..tenants {
            g.grow();
        }
        g
    }

    /// One more tenant (the next id), no limits.
    pub fn grow(&mut self) {
        self.waiting.push([VecDeque::new(), VecDeque::new()]);
        self.budgets.push([Budget::open(), Budget::open()]);
        self.ready_at.push([None, None]);
        self.usage.push(Usage::default());
    }

    /// Number of tenants.
    pub fn tenants(&self) -> usize {
        self.waiting.len()
    }

    /// Requests of `tenant` waiting for their budget.
    pub fn waiting(&self, tenant: usize) -> usize {
        self.waiting[tenant][0].len() + self.waiting[tenant][1].len()
    }

    /// What passed since the last call, per tenant (the kernel's counts).
    pub fn take_usage(&mut self) -> Vec<Usage> {
        std::mem::replace(&mut self.usage, vec![Usage::default(); self.waiting.len()])
    }

    /// Keys queue (`t`, `d`) in `ready` by when its head may pass (unkeyed when empty).
    fn rekey(&mut self, t: usize, d: usize, now: Nanos) {
        if let Some(at) = self.ready_at[t][d].take() {
            let removed = self.ready.remove(&(at, t, d));
            assert!(
                removed,
                "queue ({t}, {d}) keyed at {at} was in the ready set"
            );
        }
        if let Some(r) = self.waiting[t][d].front() {
            // Never now or before: a head the rounding leaves a hair short is looked
            // at again a nanosecond later, not in a loop.
            let at = self.budgets[t][d].ready_at(r.len, self.slice).max(now + 1);
            self.ready.insert((at, t, d));
            self.ready_at[t][d] = Some(at);
        }
    }

    /// Sets every tenant's budgets to `limits`, accrued to `now`.
    pub fn apply(&mut self, limits: &[Limits], now: Nanos) {
        assert_eq!(limits.len(), self.waiting.len(), "limits per tenant");
        for (t, l) in limits.iter().enumerate() {
            self.set(t, l, now);
        }
    }

    /// Sets tenant `t`'s budgets to `l`, accrued to `now`.
    pub fn set(&mut self, t: usize, l: &Limits, now: Nanos) {
        let b = &mut self.budgets[t];
        for d in b.iter_mut() {
            d.accrue(now, self.slice);
        }
        b[0].set(l.riops, l.rbps, self.slice);
        b[1].set(l.wiops, l.wbps, self.slice);
        for d in 0..2 {
            if self.ready_at[t][d].is_some() {
                self.rekey(t, d, now);
            }
        }
    }

    /// Lets through every waiting request its budget allows, in tenant order among the
    /// queues that are due.
    fn pass(&mut self, now: Nanos) {
        let mut due = Vec::new();
        while let Some(&(at, t, d)) = self.ready.first() {
            if at > now {
                break;
            }
            self.ready.pop_first();
            self.ready_at[t][d] = None;
            due.push((t, d));
        }
        due.sort_unstable();
        for (t, d) in due {
            let budget = &mut self.budgets[t][d];
            budget.accrue(now, self.slice);
            while let Some(r) = self.waiting[t][d].front() {
                if !budget.allows(r.len, self.slice) {
                    break;
                }
                let r = self.waiting[t][d].pop_front().expect("a head");
                budget.spend(r.len);
                self.held -= 1;
                count(&mut self.usage[t], &r);
                self.passed.push_back(r);
            }
            self.rekey(t, d, now);
        }
    }

    /// When the earliest waiting head may pass.
    fn next_pass(&self) -> Option<Nanos> {
        self.ready.first().map(|&(at, _, _)| at)
    }

    /// A request arrives: it passes if its direction's budget allows and nothing of
    /// its tenant and direction waits, else it waits.
    pub fn enqueue(&mut self, request: Request, now: Nanos) {
        let t = request.tenant as usize;
        let d = direction(request.op);
        let budget = &mut self.budgets[t][d];
        budget.accrue(now, self.slice);
        if self.waiting[t][d].is_empty() && budget.allows(request.len, self.slice) {
            budget.spend(request.len);
            count(&mut self.usage[t], &request);
            self.passed.push_back(request);
        } else {
            self.waiting[t][d].push_back(request);
            self.held += 1;
            if self.waiting[t][d].len() == 1 {
                self.rekey(t, d, now);
            }
        }
    }

    /// The next request that passed, or when one may.
    pub fn dispatch(&mut self, now: Nanos) -> Dispatch {
        if self.passed.is_empty() && self.ready.first().is_some_and(|&(at, _, _)| at <= now) {
            self.pass(now);
        }
        if let Some(r) = self.passed.pop_front() {
            return Dispatch::Request(r);
        }
        match self.next_pass() {
            Some(at) => Dispatch::Wait(at.max(now + 1)),
            None => Dispatch::Idle,
        }
    }

    /// Requests waiting or passed and not yet dispatched.
    pub fn queued(&self) -> usize {
        self.held + self.passed.len()
    }

    /// Hands back every request it holds.
    pub fn withdraw_all(&mut self) -> Vec<Request> {
        let mut all: Vec<Request> = self.passed.drain(..).collect();
        for w in &mut self.waiting {
            for d in w.iter_mut() {
                all.extend(d.drain(..));
            }
        }
        self.held = 0;
        self.ready.clear();
        for r in &mut self.ready_at {
            *r = [None, None];
        }
        all
    }

    /// Its invariants: the counts add up and every waiting queue is keyed once.
    pub fn check(&self) -> Result<(), String> {
        let waiting: usize = self.waiting.iter().map(|w| w[0].len() + w[1].len()).sum();
        if waiting != self.held {
            return Err(format!("{waiting} requests wait, {} counted", self.held));
        }
        for (t, w) in self.waiting.iter().enumerate() {
            for (d, q) in w.iter().enumerate() {
                let keyed = self.ready_at[t][d].is_some_and(|at| self.ready.contains(&(at, t, d)));
                if keyed == q.is_empty() {
                    return Err(format!(
                        "tenant {t} direction {d}: {} waiting, keyed {keyed}",
                        q.len()
                    ));
                }
            }
        }
        let keys: usize = self
            .ready_at
            .iter()
            .flatten()
            .filter(|a| a.is_some())
            .count();
        if keys != self.ready.len() {
            return Err(format!("{} ready keys for {keys} queues", self.ready.len()));
        }
        Ok(())
    }
}

/// The throttle and its governor (module docs).
pub struct Throttle {
    governor: Governor,
    gate: Gate,
    /// This period's counts of the device.
    device: DeviceUsage,
    next_period: Nanos,
}

impl Throttle {
    /// A throttle for `tenants` governed by `governor`, budgets holding `slice` ns.
    pub fn new(tenants: &[TenantSpec], governor: Governor, slice: Nanos) -> Throttle {
        let mut t = Throttle {
            next_period: governor.period(),
            governor,
            gate: Gate::new(tenants.len(), slice),
            device: DeviceUsage::default(),
        };
        t.gate.apply(&t.governor.limits(), 0);
        t
    }

    /// Builds it from `allocator` (`weights`, `static`, `off`), `period_ms`, `target_us`,
    /// `over_base`, `probe`, `fast_probe`, `backoff` and `slice_ms`.
    pub fn build(
        params: &mut PolicyParams,
        tenants: &[TenantSpec],
    ) -> Result<Box<dyn Policy>, PolicyError> {
        let cost = params
            .device()
            .copied()
            .unwrap_or_else(CostModel::generic_ssd);
        let mut p = Params::for_device(&cost);
        if params.is_set("allocator") {
            let named = params.str_or("allocator", "")?;
            p.allocator = Allocator::named(&named).ok_or_else(|| {
                params.invalid(
                    "allocator",
                    format!("'{named}' is none of {}", Allocator::NAMES),
                )
            })?;
        }
        let period_ms =
            params.f64_in("period_ms", 100.0, 1.0..=60_000.0, "must be 1 to 60000 ms")?;
        p.period = (period_ms * 1e6) as Nanos;
        let target_us = params.f64_in(
            "target_us",
            p.target as f64 / 1e3,
            1.0..=10_000_000.0,
            "must be 1 µs to 10 s",
        )?;
        p.target = (target_us * 1e3) as Nanos;
        p.probe = params.f64_in("probe", p.probe, 1.0..=2.0, "must be 1 to 2")?;
        p.over_base = params.f64_in("over_base", p.over_base, 1.0..=100.0, "must be 1 to 100")?;
        p.fast_probe = params.f64_in("fast_probe", p.fast_probe, 1.0..=2.0, "must be 1 to 2")?;
        p.backoff = params.f64_in("backoff", p.backoff, 0.5..=1.0, "must be 0.5 to 1")?;
        let slice_ms = params.f64_in(
            "slice_ms",
            default_slice(&cost) as f64 / 1e6,
            1.0..=10_000.0,
            "must be 1 to 10000 ms",
        )?;
        let governor = Governor::new(tenants, cost, p);
        Ok(Box::new(Throttle::new(
            tenants,
            governor,
            (slice_ms * 1e6) as Nanos,
        )))
    }
}

/// Counts a request that passed in its tenant's usage (the kernel's counts: trims and
/// flushes with the writes).
pub fn count(u: &mut Usage, r: &Request) {
    let bytes = u64::from(r.len);
    match direction(r.op) {
        0 => {
            u.read_ios += 1;
            u.read_bytes += bytes;
        }
        _ => {
            u.write_ios += 1;
            u.write_bytes += bytes;
        }
    }
}

/// Counts a completion in the device's counters (`/proc/diskstats`' reading: its time
/// in the device).
pub fn count_device(device: &mut DeviceUsage, c: &Completion) {
    let took = c.finish.saturating_sub(c.start);
    device.ios += 1;
    device.latency_ns += took;
    if c.request.op == Op::Write {
        device.writes += 1;
        device.write_ns += took;
    }
}

impl Policy for Throttle {
    fn name(&self) -> &'static str {
        "govern"
    }

    fn enqueue(&mut self, request: Request, now: Nanos) -> Admission {
        self.gate.enqueue(request, now);
        Admission::Queued
    }

    fn dispatch(&mut self, now: Nanos) -> Dispatch {
        self.gate.dispatch(now)
    }

    fn complete(&mut self, c: &Completion, _now: Nanos) {
        count_device(&mut self.device, c);
    }

    fn next_timer(&self) -> Option<Nanos> {
        Some(self.next_period)
    }

    fn on_timer(&mut self, now: Nanos) {
        while now >= self.next_period {
            let usage = self.gate.take_usage();
            let device = std::mem::take(&mut self.device);
            let limits = self.governor.decide(&usage, device);
            self.gate.apply(&limits, now);
            self.next_period += self.governor.period();
        }
    }

    fn update_tenant(&mut self, tenant: TenantId, spec: &TenantSpec, _now: Nanos) {
        self.governor.set_spec(tenant as usize, spec);
    }

    fn add_tenant(&mut self, spec: &TenantSpec, now: Nanos) -> TenantId {
        self.gate.grow();
        self.governor.add_tenant(spec);
        let limits = self.governor.limits();
        self.gate.apply(&limits, now);
        (self.gate.tenants() - 1) as TenantId
    }

    fn queued(&self) -> usize {
        self.gate.queued()
    }

    fn withdraw_all(&mut self) -> Vec<Request> {
        self.gate.withdraw_all()
    }

    fn observe(&self, detail: Detail) -> Observation {
        let mut gauges = vec![Gauge::policy(
            "forecast_device_seconds",
            "The governor's forecast of the device time a period holds, seconds",
            self.governor.capacity() / 1e9,
        )];
        for (t, l) in self.governor.limits().iter().enumerate() {
            gauges.push(Gauge::tenant(
                "read_iops_limit",
                "The read limit the governor set, requests a second (0: none)",
                t,
                l.riops.unwrap_or(0.0),
            ));
            gauges.push(Gauge::tenant(
                "write_iops_limit",
                "The write limit the governor set, requests a second (0: none)",
                t,
                l.wiops.unwrap_or(0.0),
            ));
        }
        let (periods, congested, probes) = self.governor.counts();
        Observation::of(detail, gauges, || {
            serde_json::json!({
                "periods": periods,
                "congested_periods": congested,
                "probed_periods": probes,
                "forecast_device_seconds": self.governor.capacity() / 1e9,
            })
        })
    }

    fn check(&self) -> Result<(), String> {
        self.gate.check()
    }
}

/// The kernel's `throtl_slice` for a device priced by `cost`: 100 ms on a disk (it
/// seeks), 20 ms otherwise.
pub fn default_slice(cost: &CostModel) -> Nanos {
    if cost.seeks() {
        100_000_000
    } else {
        20_000_000
    }
}

/// The throttle with limits set from outside ([`Policy::set_limits`]): the same
/// [`Gate`], no governor. A cluster's front runs it, its limits the front's part of
/// each tenant's global ones (`crate::cluster`). A tenant has no limits until it is
/// given some.
pub struct Limited {
    gate: Gate,
}

impl Limited {
    /// For `tenants` tenants, budgets holding `slice` ns.
    pub fn new(tenants: usize, slice: Nanos) -> Limited {
        Limited {
            gate: Gate::new(tenants, slice),
        }
    }

    /// Requests of `tenant` waiting for their budget.
    pub fn waiting(&self, tenant: usize) -> usize {
        self.gate.waiting(tenant)
    }
}

impl Policy for Limited {
    fn name(&self) -> &'static str {
        "limited"
    }

    fn enqueue(&mut self, request: Request, now: Nanos) -> Admission {
        self.gate.enqueue(request, now);
        Admission::Queued
    }

    fn dispatch(&mut self, now: Nanos) -> Dispatch {
        self.gate.dispatch(now)
    }

    fn complete(&mut self, _c: &Completion, _now: Nanos) {}

    fn update_tenant(&mut self, _tenant: TenantId, _spec: &TenantSpec, _now: Nanos) {}

    fn add_tenant(&mut self, _spec: &TenantSpec, _now: Nanos) -> TenantId {
        self.gate.grow();
        (self.gate.tenants() - 1) as TenantId
    }

    fn set_limits(&mut self, tenant: TenantId, limits: &Limits, now: Nanos) -> bool {
        self.gate.set(tenant as usize, limits, now);
        true
    }

    fn queued(&self) -> usize {
        self.gate.queued()
    }

    fn withdraw_all(&mut self) -> Vec<Request> {
        self.gate.withdraw_all()
    }

    fn check(&self) -> Result<(), String> {
        self.gate.check()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(id: u64) -> Request {
        crate::policy::test_request(id, 0, 4096, 0)
    }

    /// `Limited` passes what the limits it is given allow (a slice's budget at once,
    /// then the rate), nothing before it is given any but everything (no limit), and
    /// other policies say they take no limits.
    #[test]
    fn limited_enforces_the_limits_it_is_given() {
        let slice = 20_000_000;
        let mut p = Limited::new(1, slice);
        let limits = Limits {
            riops: Some(1_000.0),
            ..Limits::default()
        };
        assert!(p.set_limits(0, &limits, 0));
        for id in 0..1_000 {
            let _ = p.enqueue(read(id), 0);
        }
        let (mut now, mut passed) = (0, 0);
        while now <= 100_000_000 {
            match p.dispatch(now) {
                Dispatch::Request(_) => passed += 1,
                Dispatch::Wait(at) => now = at,
                Dispatch::Idle => break,
            }
        }
        // 20 at once (a slice's worth), then one a millisecond to 100 ms.
        assert!((118..=122).contains(&passed), "{passed}");
        assert_eq!(p.queued(), 1_000 - passed);
        p.check().unwrap();
        let mut fifo = crate::policy::Fifo::new(1);
        assert!(!fifo.set_limits(0, &limits, 0));
    }
}
