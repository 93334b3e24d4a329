//! A tenant's limit (`limit_iops`) as a gate in front of a policy: requests pass to the
//! policy no faster than the limit, and wait in the gate until they may. The limit tag
//! is mClock's (Gulati, Merchant and Varman, "mClock: Handling Throughput Variability
//! for Hypervisor IO Scheduling", OSDI 2010, §3: `L = max(L' + 1/l, arrival)`, a request
//! eligible once `L` has come), so a tenant that was idle banks nothing and a backlogged
//! one passes exactly `l` requests a second.
//!
//! The proportional-share policies (`sfq`, `feedbac`, `bfq`, `cfq`, `mots`) share the
//! device by weight and knew no limits: a tenant with `limit_iops = 1000` beside another
//! got half an NVMe drive, 90,000 IOPS, under every one of them (the verdict said "not
//! its aim"). The gate composes with any of them unchanged: with no tenant limited it
//! passes every request at once, the policy sees the same calls at the same times, and
//! its figures are those without the gate (the conformance matrices, byte for byte).
//!
//! Readings chosen:
//! * **In front, not inside.** A request held by its limit is not the policy's yet: it
//!   has no tag and takes no place in the policy's order, so it cannot be counted as
//!   waiting (a starved tenant to the depth, a waiting one to the floor) while only its
//!   own limit holds it. It enters the policy when its tag comes, as a new arrival.
//! * **A tenant's requests pass in their order**, each tagged from its arrival and the
//!   tag of the one before.
//! * A change of limit applies from the next tag on; removing it lets what waits pass.
//! * **A slice's owner held by its limit keeps its slice.** CFQ keeps a tenant's slice
//!   while it has requests in flight and idles after (Linux's blk-throttle in front of
//!   CFQ does the same): a limited tenant's slice runs at its limit, the others wait
//!   for it to end. The limit is kept; the device is not full meanwhile.
//! * Sans-I/O: the wrapper is a [`Policy`]; the gate answers when it next has a request
//!   to pass, which the wrapper's `dispatch` gives as the time to be asked again.

use super::{Admission, Detail, Dispatch, Gauge, Observation, Policy};
use crate::device::cost::Currency;
use crate::limits::governor;
use crate::types::{Completion, NANOS_PER_SEC, Nanos, Request, TenantId, TenantSpec};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

/// One tenant's limit and what waits for it.
#[derive(Debug, Clone, Default)]
struct Tenant {
    /// 1 / `limit_iops`, ns (`None`: no limit).
    inc: Option<Nanos>,
    /// The tag of the last request that passed (`None` before the first).
    last: Option<Nanos>,
    /// Requests waiting for their tag, in arrival order.
    waiting: VecDeque<Request>,
    /// Requests held here so far (they waited for their tag).
    held: u64,
}

impl Tenant {
    fn new(spec: &TenantSpec) -> Self {
        Tenant {
            inc: inc_of(spec),
            ..Tenant::default()
        }
    }

    /// The tag `request` gets after the last that passed.
    fn tag(&self, request: &Request) -> Nanos {
        match (self.inc, self.last) {
            (Some(inc), Some(last)) => last.saturating_add(inc).max(request.arrival),
            _ => request.arrival,
        }
    }
}

/// 1 / `spec.limit_iops` in ns, when it has a limit.
fn inc_of(spec: &TenantSpec) -> Option<Nanos> {
    spec.limit_iops
        .map(|l| ((NANOS_PER_SEC as f64 / l).round() as Nanos).max(1))
}

/// A policy behind the limit gate (module doc).
pub struct LimitGate {
    inner: Box<dyn Policy>,
    tenants: Vec<Tenant>,
    /// (tag of the head, tenant) for every tenant with requests waiting, one entry
    /// each.
    due: BinaryHeap<Reverse<(Nanos, TenantId)>>,
    /// Requests waiting in the gate, over all tenants.
    waiting: usize,
}

impl LimitGate {
    /// `inner` behind a gate holding `tenants` to their limits.
    pub fn new(inner: Box<dyn Policy>, tenants: &[TenantSpec]) -> Self {
        LimitGate {
            inner,
            tenants: tenants.iter().map(Tenant::new).collect(),
            due: BinaryHeap::new(),
            waiting: 0,
        }
    }

    /// Hands `request` to the policy behind the gate, its tag spent.
    fn pass(&mut self, request: Request, tag: Nanos, now: Nanos) -> Admission {
        let t = request.tenant as usize;
        let admission = self.inner.enqueue(request, now);
        if admission == Admission::Queued {
            self.tenants[t].last = Some(tag);
        }
        admission
    }

    /// Passes every waiting head whose tag has come by `now`.
    fn release(&mut self, now: Nanos) {
        while let Some(&Reverse((at, t))) = self.due.peek() {
            if at > now {
                break;
            }
            self.due.pop();
            let x = &mut self.tenants[t as usize];
            let r = x.waiting.pop_front().expect("a tenant listed has a head");
            self.waiting -= 1;
            let admission = self.pass(r, at, now);
            assert!(
                admission == Admission::Queued,
                "the policy behind a limit gate refused request {}: it cannot be answered now",
                r.id
            );
            self.relist(t);
        }
    }

    /// Lists `t`'s head by its tag, if it has one waiting.
    fn relist(&mut self, t: TenantId) {
        let x = &self.tenants[t as usize];
        if let Some(head) = x.waiting.front() {
            self.due.push(Reverse((x.tag(head), t)));
        }
    }

    /// When the next waiting head may pass.
    fn next_due(&self) -> Option<Nanos> {
        self.due.peek().map(|Reverse((at, _))| *at)
    }
}

impl Policy for LimitGate {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn enqueue(&mut self, request: Request, now: Nanos) -> Admission {
        let t = request.tenant as usize;
        let x = &mut self.tenants[t];
        let tag = x.tag(&request);
        if x.waiting.is_empty() && tag <= now {
            return self.pass(request, tag, now);
        }
        x.waiting.push_back(request);
        x.held += 1;
        self.waiting += 1;
        if x.waiting.len() == 1 {
            self.due.push(Reverse((tag, request.tenant)));
        }
        Admission::Queued
    }

    fn dispatch(&mut self, now: Nanos) -> Dispatch {
        self.release(now);
        match self.inner.dispatch(now) {
            Dispatch::Request(r) => Dispatch::Request(r),
            Dispatch::Wait(at) => Dispatch::Wait(self.next_due().map_or(at, |d| d.min(at))),
            Dispatch::Idle => self
                .next_due()
                .map_or(Dispatch::Idle, |d| Dispatch::Wait(d.max(now + 1))),
        }
    }

    fn complete(&mut self, completion: &Completion, now: Nanos) {
        self.inner.complete(completion, now);
    }

    fn next_timer(&self) -> Option<Nanos> {
        self.inner.next_timer()
    }

    fn on_timer(&mut self, now: Nanos) {
        self.inner.on_timer(now);
    }

    fn update_tenant(&mut self, tenant: TenantId, spec: &TenantSpec, now: Nanos) {
        let x = &mut self.tenants[tenant as usize];
        x.inc = inc_of(spec);
        // The head's place in `due` was its old tag: list it again by the new one (the
        // old entry, now stale, is found and dropped below).
        let before = self.due.len();
        self.due.retain(|Reverse((_, t))| *t != tenant);
        debug_assert!(before - self.due.len() <= 1, "one entry a tenant");
        self.relist(tenant);
        self.inner.update_tenant(tenant, spec, now);
    }

    fn set_limits(&mut self, tenant: TenantId, limits: &governor::Limits, now: Nanos) -> bool {
        self.inner.set_limits(tenant, limits, now)
    }

    fn add_tenant(&mut self, spec: &TenantSpec, now: Nanos) -> TenantId {
        self.tenants.push(Tenant::new(spec));
        let id = self.inner.add_tenant(spec, now);
        assert_eq!(
            id as usize,
            self.tenants.len() - 1,
            "the gate numbers tenants as the policy does"
        );
        id
    }

    fn queued(&self) -> usize {
        self.waiting + self.inner.queued()
    }

    fn withdraw_all(&mut self) -> Vec<Request> {
        let mut all = self.inner.withdraw_all();
        for x in &mut self.tenants {
            all.extend(x.waiting.drain(..));
        }
        self.waiting = 0;
        self.due.clear();
        all
    }

    fn observe(&self, detail: Detail) -> Observation {
        let mut o = self.inner.observe(detail);
        for (i, x) in self.tenants.iter().enumerate() {
            if x.inc.is_some() {
                o.gauges.push(Gauge::tenant(
                    "limit_held_total",
                    "Requests that waited for the tenant's limit before the policy saw them",
                    i,
                    x.held as f64,
                ));
            }
        }
        o
    }

    fn currency(&self) -> Currency {
        self.inner.currency()
    }

    fn check(&self) -> Result<(), String> {
        let waiting: usize = self.tenants.iter().map(|x| x.waiting.len()).sum();
        if waiting != self.waiting {
            return Err(format!(
                "limit gate: {waiting} waiting, {} counted",
                self.waiting
            ));
        }
        let mut listed = vec![0u32; self.tenants.len()];
        for Reverse((_, t)) in &self.due {
            listed[*t as usize] += 1;
        }
        for (i, x) in self.tenants.iter().enumerate() {
            if listed[i] != u32::from(!x.waiting.is_empty()) {
                return Err(format!(
                    "limit gate: tenant {i} listed {} times with {} waiting",
                    listed[i],
                    x.waiting.len()
                ));
            }
        }
        self.inner.check()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Sfq, TestPolicy};

    const MS: Nanos = 1_000_000;

    fn capped(limit: Option<f64>) -> Vec<TenantSpec> {
        let mut a = TenantSpec::weighted("a", 1.0);
        a.limit_iops = limit;
        vec![a, TenantSpec::weighted("b", 1.0)]
    }

    fn req(id: u64, tenant: TenantId, at: Nanos) -> Request {
        crate::policy::test_request(id, tenant, 4096, at)
    }

    /// Dispatches everything that may go by `until`, completing each at once; the ids
    /// and times they went at.
    fn run(p: &mut LimitGate, until: Nanos) -> Vec<(u64, Nanos)> {
        let (mut now, mut out) = (0, Vec::new());
        while now <= until {
            match p.dispatch(now) {
                Dispatch::Request(r) => {
                    out.push((r.id, now));
                    p.complete(&crate::policy::test_completion(r, now), now);
                }
                Dispatch::Wait(at) => now = at,
                Dispatch::Idle => break,
            }
            p.check().unwrap();
        }
        out
    }

    #[test]
    fn a_limited_tenant_passes_at_its_limit_and_others_at_once() {
        // 100 IOPS: one request each 10 ms, the first at once.
        let mut p = LimitGate::new(
            Box::new(Sfq::new(&capped(Some(100.0)), 0)),
            &capped(Some(100.0)),
        );
        for id in 0..5 {
            p.put(req(id, 0, 0), 0);
        }
        p.put(req(10, 1, 0), 0);
        assert_eq!(p.queued(), 6);
        let got = run(&mut p, 100 * MS);
        let a: Vec<Nanos> = got
            .iter()
            .filter(|(id, _)| *id < 10)
            .map(|&(_, at)| at)
            .collect();
        assert_eq!(a, [0, 10 * MS, 20 * MS, 30 * MS, 40 * MS]);
        assert!(
            got.contains(&(10, 0)),
            "the other tenant is not held: {got:?}"
        );
        assert_eq!(p.queued(), 0);
        // Idle since: nothing banked, the next goes at once and the one after 10 ms on.
        p.put(req(5, 0, 500 * MS), 500 * MS);
        p.put(req(6, 0, 500 * MS), 500 * MS);
        assert_eq!(p.dispatch(500 * MS), Dispatch::Request(req(5, 0, 500 * MS)));
        assert_eq!(p.dispatch(500 * MS), Dispatch::Wait(510 * MS));
    }

    #[test]
    fn without_limits_the_policy_sees_what_it_would_alone() {
        let specs = capped(None);
        let mut gated = LimitGate::new(Box::new(Sfq::new(&specs, 0)), &specs);
        let mut alone = Sfq::new(&specs, 0);
        for id in 0..8 {
            let r = req(id, (id % 2) as TenantId, id);
            gated.put(r, id);
            alone.put(r, id);
        }
        for now in 8..20 {
            assert_eq!(gated.dispatch(now), alone.dispatch(now));
        }
    }

    #[test]
    fn a_limit_removed_lets_what_waits_pass_and_withdraw_hands_back_everything() {
        let mut p = LimitGate::new(
            Box::new(Sfq::new(&capped(Some(1.0)), 0)),
            &capped(Some(1.0)),
        );
        for id in 0..3 {
            p.put(req(id, 0, 0), 0);
        }
        assert!(matches!(p.dispatch(0), Dispatch::Request(_)));
        assert_eq!(p.dispatch(0), Dispatch::Wait(1_000 * MS));
        p.update_tenant(0, &capped(None)[0], MS);
        p.check().unwrap();
        assert!(matches!(p.dispatch(MS), Dispatch::Request(_)));
        let back = p.withdraw_all();
        assert_eq!(back.len(), 1);
        assert_eq!(p.queued(), 0);
        p.check().unwrap();
    }
}
