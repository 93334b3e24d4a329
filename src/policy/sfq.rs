//! `sfq`: start-time fair queueing with dispatch depth D — SFQ(D) (Jin, Chase, Kaur,
//! "Interposed proportional sharing for a storage service utility", SIGMETRICS 2004), the
//! classic work-conserving fair-queueing scheduler for storage; a baseline for FeedBAC.
//!
//! Every request gets a start tag `S = max(v, F_prev)` and a finish tag `F = S + cost / w`
//! where `F_prev` is the finish tag of the tenant's previous request, `w` its weight and
//! `cost` the request's size in bytes (a minimum of 4 KiB, so tiny requests and flushes
//! are not free). Requests are dispatched in increasing start-tag order while fewer than
//! `depth` are outstanding. Virtual time `v` is the start tag of the last request
//! dispatched (SFQ(D)'s reading), so a tenant that was idle restarts at the current
//! virtual time and cannot claim service for the time it did not use.
//!
//! The depth is [`super::depth::DispatchDepth`]: SFQ(D) is fair only among requests it
//! still holds, so in a deep device queue a fixed `D` either controls nothing or costs
//! throughput; the default here, `depth = "auto"`, moves `D` by what the tenants lose in
//! the device's queue (that module's doc says how and why). A tenant counts as *behind*
//! when its last finish tag is below virtual time: others were dispatched past it while
//! all its requests were in the device.
//!
//! Parameters: `depth` (`"auto"`, the default; `0` = no limit of its own, classic SFQ
//! with the engine's device queue depth; a positive integer = a fixed SFQ(D)),
//! `min_depth` and `window_ms` (for `"auto"`), `min_cost` bytes (default 4096), `cost`
//! (`"bytes"`, the default; `"requests"`; `"device"`: the device's cost model,
//! [`super::cost`], instead of bytes). Weight changes apply to requests tagged after the
//! change.

use super::cost::Charge;
use super::depth::DispatchDepth;
use super::{Admission, Detail, Dispatch, Gauge, Observation, Policy, PolicyError, PolicyParams};
use crate::types::{Completion, Nanos, Request, TenantId, TenantSpec};
use std::collections::{BinaryHeap, VecDeque};

/// Fixed-point scale of virtual time (tags are cost × SCALE / weight).
const SCALE: f64 = 1024.0;

struct Flow {
    weight: f64,
    last_finish: u64,
    queue: VecDeque<(u64, Request)>,
}

/// SFQ(D) state.
pub struct Sfq {
    flows: Vec<Flow>,
    /// Tenants with queued requests, by (start tag of their head, tenant) ascending.
    heads: BinaryHeap<std::cmp::Reverse<(u64, TenantId)>>,
    virtual_time: u64,
    depth: DispatchDepth,
    min_cost: u64,
    queued: usize,
    /// What a request costs; `None`: its bytes, at least `min_cost`.
    charge: Option<Charge>,
}

impl Sfq {
    /// SFQ(D) over `tenants` with dispatch depth `depth` (0: no limit of its own) and
    /// a request cost of at least `min_cost` bytes.
    pub fn new(tenants: &[TenantSpec], depth: u32, min_cost: u64) -> Self {
        Self::with_depth(
            tenants,
            DispatchDepth::fixed(tenants.len(), depth),
            min_cost,
        )
    }

    /// SFQ over `tenants` with the dispatch depth `depth`.
    pub fn with_depth(tenants: &[TenantSpec], depth: DispatchDepth, min_cost: u64) -> Self {
        Sfq {
            flows: tenants
                .iter()
                .map(|t| Flow {
                    weight: t.weight,
                    last_finish: 0,
                    queue: VecDeque::new(),
                })
                .collect(),
            heads: BinaryHeap::new(),
            virtual_time: 0,
            depth,
            min_cost,
            queued: 0,
            charge: None,
        }
    }

    /// Tags requests by `charge` instead of their bytes (`cost = "requests"` or
    /// `"device"`).
    pub fn with_charge(mut self, charge: Charge) -> Self {
        self.charge = match charge {
            Charge::Bytes => None,
            other => Some(other),
        };
        self
    }

    /// Builds SFQ(D) from `depth` and `min_cost`.
    pub fn build(
        params: &mut PolicyParams,
        tenants: &[TenantSpec],
    ) -> Result<Box<dyn Policy>, PolicyError> {
        let depth = DispatchDepth::from_params(params, tenants.len(), true)?;
        let min_cost = params.u64_or("min_cost", 4096)?;
        let charge = params.charge("cost", "bytes", tenants.len())?;
        Ok(Box::new(
            Sfq::with_depth(tenants, depth, min_cost).with_charge(charge),
        ))
    }

    /// Start and finish tags of a new request.
    fn tags(&mut self, request: &Request) -> (u64, u64) {
        let cost = match self.charge.as_mut() {
            None => (request.len as u64).max(self.min_cost) as f64,
            Some(c) => c.charge(request),
        };
        let f = &self.flows[request.tenant as usize];
        let start = self.virtual_time.max(f.last_finish);
        (
            start,
            start + (cost * SCALE / f.weight).round().max(1.0) as u64,
        )
    }
}

impl Policy for Sfq {
    fn name(&self) -> &'static str {
        "sfq"
    }

    fn enqueue(&mut self, request: Request, now: Nanos) -> Admission {
        let v = self.virtual_time;
        let (start, finish) = self.tags(&request);
        let f = &mut self.flows[request.tenant as usize];
        let held = !f.queue.is_empty();
        self.depth
            .arrival(request.tenant, now, held, f.last_finish < v);
        f.last_finish = finish;
        if !held {
            self.heads.push(std::cmp::Reverse((start, request.tenant)));
        }
        f.queue.push_back((start, request));
        self.queued += 1;
        Admission::Queued
    }

    fn dispatch(&mut self, now: Nanos) -> Dispatch {
        if !self.depth.may_dispatch(now, self.queued) {
            return Dispatch::Idle;
        }
        let Some(std::cmp::Reverse((start, tenant))) = self.heads.pop() else {
            return Dispatch::Idle;
        };
        let f = &mut self.flows[tenant as usize];
        let (_, request) = f
            .queue
            .pop_front()
            .expect("a tenant in heads has a queued request");
        if let Some(&(next, _)) = f.queue.front() {
            self.heads.push(std::cmp::Reverse((next, tenant)));
        }
        self.virtual_time = self.virtual_time.max(start);
        self.depth.dispatched(tenant);
        self.queued -= 1;
        Dispatch::Request(request)
    }

    fn complete(&mut self, completion: &Completion, now: Nanos) {
        let tenant = completion.request.tenant;
        let held = !self.flows[tenant as usize].queue.is_empty();
        self.depth.completed(tenant, now, held);
    }

    fn update_tenant(&mut self, tenant: TenantId, spec: &TenantSpec, _now: Nanos) {
        self.flows[tenant as usize].weight = spec.weight;
    }

    fn queued(&self) -> usize {
        self.queued
    }

    fn withdraw_all(&mut self) -> Vec<Request> {
        self.heads.clear();
        let all: Vec<Request> = self
            .flows
            .iter_mut()
            .flat_map(|f| f.queue.drain(..).map(|(_, r)| r))
            .collect();
        self.queued -= all.len();
        all
    }

    fn observe(&self, detail: Detail) -> Observation {
        Observation::of(
            detail,
            self.gauges(),
            || serde_json::json!({ "depth": self.depth.report() }),
        )
    }
}

impl Sfq {
    /// The gauges of [`Policy::observe`].
    fn gauges(&self) -> Vec<Gauge> {
        let mut gauges = vec![Gauge::policy(
            "virtual_time",
            "Start tag of the last dispatched request",
            self.virtual_time as f64,
        )];
        gauges.extend(self.depth.gauges());
        gauges
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::TestPolicy;

    fn req(id: u64, tenant: TenantId, len: u32) -> Request {
        crate::policy::test_request(id, tenant, len, 0)
    }

    fn drain(p: &mut Sfq) -> Vec<u64> {
        let mut out = Vec::new();
        while let Dispatch::Request(r) = p.dispatch(0) {
            out.push(r.id);
        }
        out
    }

    #[test]
    fn tags_on_a_hand_computed_sequence() {
        // Weights 2 and 1, 4 KiB requests: tenant 0's tags advance by 4096·1024/2 =
        // 2 097 152, tenant 1's by 4 194 304.
        let tenants = [
            TenantSpec::weighted("a", 2.0),
            TenantSpec::weighted("b", 1.0),
        ];
        let mut p = Sfq::new(&tenants, 0, 4096);
        for i in 0..4 {
            p.put(req(i, 0, 4096), 0); // starts 0, 2.1M, 4.2M, 6.3M
        }
        for i in 10..12 {
            p.put(req(i, 1, 4096), 0); // starts 0, 4.2M
        }
        assert_eq!(p.flows[0].last_finish, 4 * 2_097_152);
        assert_eq!(p.flows[1].last_finish, 2 * 4_194_304);
        // Ascending start tags, ties by tenant: (0,a) (0,b) (2.1M,a) (4.2M,a) (4.2M,b) (6.3M,a).
        assert_eq!(drain(&mut p), vec![0, 10, 1, 2, 11, 3]);
        assert_eq!(p.virtual_time, 3 * 2_097_152);
        assert_eq!(p.queued(), 0);
    }

    #[test]
    fn idle_tenant_restarts_at_virtual_time() {
        let tenants = [
            TenantSpec::weighted("a", 1.0),
            TenantSpec::weighted("b", 1.0),
        ];
        let mut p = Sfq::new(&tenants, 0, 4096);
        for i in 0..10 {
            p.put(req(i, 0, 4096), 0);
        }
        assert_eq!(drain(&mut p).len(), 10);
        // b was idle; its first request starts at v (the last start tag), not at 0.
        p.put(req(100, 1, 4096), 0);
        p.put(req(11, 0, 4096), 0);
        assert_eq!(p.flows[1].queue[0].0, 9 * 4_194_304);
        assert_eq!(p.flows[0].queue[0].0, 10 * 4_194_304);
        assert_eq!(drain(&mut p), vec![100, 11]);
    }

    #[test]
    fn depth_limits_outstanding() {
        let tenants = [TenantSpec::weighted("a", 1.0)];
        let mut p = Sfq::new(&tenants, 2, 4096);
        for i in 0..3 {
            p.put(req(i, 0, 4096), 0);
        }
        assert!(matches!(p.dispatch(0), Dispatch::Request(_)));
        assert!(matches!(p.dispatch(0), Dispatch::Request(_)));
        assert_eq!(p.dispatch(0), Dispatch::Idle);
        let c = Completion {
            request: req(0, 0, 4096),
            start: 0,
            finish: 1,
        };
        p.complete(&c, 1);
        assert!(matches!(p.dispatch(1), Dispatch::Request(_)));
    }

    #[test]
    fn weight_change_applies_to_later_requests() {
        let tenants = [
            TenantSpec::weighted("a", 1.0),
            TenantSpec::weighted("b", 1.0),
        ];
        let mut p = Sfq::new(&tenants, 0, 4096);
        p.put(req(0, 0, 4096), 0);
        assert_eq!(p.flows[0].last_finish, 4_194_304);
        p.update_tenant(0, &TenantSpec::weighted("a", 4.0), 0);
        p.put(req(1, 0, 4096), 0);
        assert_eq!(p.flows[0].last_finish, 4_194_304 + 1_048_576);
    }

    /// Tenant a has one request in the device while b's twenty are dispatched past it;
    /// a's next request arrives with a's tags behind virtual time.
    fn starve_a(p: &mut Sfq, at: Nanos) {
        p.put(req(at, 0, 4096), at);
        for i in 0..20 {
            p.put(req(at + 1 + i, 1, 4096), at);
        }
        while let Dispatch::Request(_) = p.dispatch(at) {}
        p.put(req(at + 100, 0, 4096), at + 1);
    }

    fn completion(request: Request) -> Completion {
        Completion {
            request,
            start: 0,
            finish: 1,
        }
    }

    fn two() -> [TenantSpec; 2] {
        [
            TenantSpec::weighted("a", 1.0),
            TenantSpec::weighted("b", 1.0),
        ]
    }

    #[test]
    fn auto_depth_shrinks_when_a_tenant_falls_behind_in_the_device() {
        const W: Nanos = 10_000_000;
        let mut p = Sfq::with_depth(&two(), DispatchDepth::auto(2, 4, W), 4096);
        starve_a(&mut p, 0);
        assert_eq!(p.dispatch(W), Dispatch::Request(req(100, 0, 4096)));
        assert_eq!(
            p.depth.limit(),
            0,
            "the first window saw tenants coming from idle"
        );
        starve_a(&mut p, W + 1);
        assert_eq!(p.depth.outstanding(), 43);
        // The window's end shrinks the depth under what is outstanding: a's request
        // waits until completions bring the count below the new limit.
        assert_eq!(p.dispatch(2 * W + 1), Dispatch::Idle);
        assert_eq!(p.depth.limit(), 43 - 43 / 8);
        for id in 0..5 {
            p.complete(&completion(req(id, 1, 4096)), 2 * W + 2);
            assert_eq!(p.dispatch(2 * W + 2), Dispatch::Idle, "{id}");
        }
        p.complete(&completion(req(5, 1, 4096)), 2 * W + 3);
        assert_eq!(
            p.dispatch(2 * W + 3),
            Dispatch::Request(req(W + 101, 0, 4096))
        );
    }

    #[test]
    fn depth_parameter_is_auto_by_default_an_integer_or_an_error() {
        let tenants = two();
        let build = |t: toml::Table| {
            let mut params = crate::policy::test_params("sfq", t);
            let p = Sfq::build(&mut params, &tenants);
            p.and_then(|p| params.finish().map(|()| p))
        };
        let depth = |p: &dyn Policy| {
            p.observe(Detail::Gauges)
                .gauges
                .iter()
                .find(|g| g.name == "depth")
                .map(|g| g.value)
        };
        let auto = build(toml::Table::new()).expect("defaults");
        assert_eq!(depth(auto.as_ref()), Some(0.0));
        let fixed = build(toml::toml! { depth = 8 }).expect("a fixed depth");
        assert_eq!(depth(fixed.as_ref()), Some(8.0));
        build(toml::toml! { depth = "auto" min_depth = 4 window_ms = 2.5 }).expect("auto");
        for bad in [
            toml::toml! { depth = "deep" },
            toml::toml! { depth = -1 },
            toml::toml! { depth = 8 min_depth = 4 },
            toml::toml! { min_depth = 0 },
            toml::toml! { window_ms = 0.0 },
            toml::toml! { window_ms = "fast" },
        ] {
            let text = bad.to_string();
            assert!(build(bad).is_err(), "accepted {text}");
        }
    }
}
