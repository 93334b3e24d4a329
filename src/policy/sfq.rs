//! `sfq`: start-time fair queueing with dispatch depth D — SFQ(D) (Jin, Chase, Kaur,
//! "Interposed proportional sharing for a storage service utility", SIGMETRICS 2004), the
//! classic work-conserving fair-queueing scheduler for storage; a baseline for FeedBAC.
//!
//! Every request gets a start tag `S = max(v, F_prev)` and a finish tag `F = S + cost / w`
//! where `F_prev` is the finish tag of the tenant's previous request and `w` its weight.
//! Requests are dispatched in increasing start-tag order while fewer than `depth` are
//! outstanding. Virtual time `v` is the start tag of the last request dispatched
//! (SFQ(D)'s reading), so a tenant that was idle restarts at the current virtual time
//! and cannot claim service for the time it did not use.
//!
//! **Reading: the cost is device time** (`cost = "device"`, the default): each request
//! costs what the device spends on it by its cost model ([`crate::device::cost`], stamped by the
//! host), so a 1 MiB sequential read and a 4 KiB random one on a disk, or a 512 B write
//! and a 4 MiB one on an SSD, are compared by what they take from everyone else. The
//! paper's cost is the request's size: `cost = "bytes"` (with at least `min_cost` bytes,
//! 4096, so tiny requests and flushes are not free) stays for its literal reading. On a
//! disk beside 4 KiB random readers a byte-fair SFQ gave a 1 MiB sequential reader a
//! quarter of the *bytes* — a few requests a second at seconds each — and the disk ran at
//! 0.04× `none`'s bytes.
//!
//! **Reading: tags are computed when a request reaches the head of its tenant's queue.**
//! The queues are FIFO, so this is the paper's arrival-time tag (a request arriving
//! behind others of its tenant gets `F_prev`, which virtual time cannot have passed
//! while they wait); it keeps one heap entry per backlogged tenant (O(log n) per
//! request at any tenant count) and lets a weight change apply to everything not yet
//! tagged.
//!
//! The depth is [`super::depth::DispatchDepth`]: SFQ(D) is fair only among requests it
//! still holds, so in a deep device queue a fixed `D` either controls nothing or costs
//! throughput; the default here, `depth = "auto"`, moves `D` by what the tenants lose in
//! the device's queue (that module's doc says how and why). A tenant counts as *behind*
//! when its last finish tag is below virtual time: others were dispatched past it while
//! all its requests were in the device.
//!
//! A backlogged tenant is served at least once every `max_wait_ms` (500) by the service
//! floor ([`super::floor`]), which charges it nothing: with 1,024 tenants of weights
//! 1–1000 the lightest one's share is a request every few seconds.
//!
//! Parameters: `depth` (`"auto"`, the default; `0` = no limit of its own, classic SFQ
//! with the engine's device queue depth; a positive integer = a fixed SFQ(D)),
//! `min_depth` and `window_ms` (for `"auto"`), `cost` (`"device"`, the default;
//! `"bytes"`; `"requests"`), `min_cost` bytes (default 4096, with `cost = "bytes"`),
//! `max_wait_ms` (500; 0: no floor). Weight changes apply to requests tagged after the
//! change.

use super::depth::DispatchDepth;
use super::floor::Floor;
use super::frame::{Frame, Service};
use super::{Admission, Detail, Dispatch, Gauge, Observation, Policy, PolicyError, PolicyParams};
use crate::device::cost::Currency;
use crate::types::{Completion, Nanos, Request, TenantId, TenantSpec};
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Fixed-point scale of virtual time (tags are cost × SCALE / weight).
const SCALE: f64 = 1024.0;

#[derive(Debug, Clone)]
struct Flow {
    /// Finish tag of the tenant's last tagged request.
    last_finish: u64,
    /// Start tag of its queue's head (`None`: nothing queued).
    head_start: Option<u64>,
    /// Factor on its weight (MoTS's correction; 1 otherwise).
    factor: f64,
}

/// SFQ(D) state.
pub struct Sfq {
    /// Queues, depth and floor ([`super::frame`]).
    frame: Frame,
    flows: Vec<Flow>,
    /// (start tag of a head, tenant), ascending; an entry whose tag is no longer its
    /// tenant's head's is stale and dropped when it surfaces.
    heads: BinaryHeap<Reverse<(u64, TenantId)>>,
    virtual_time: u64,
    min_cost: u64,
    currency: Currency,
}

impl Sfq {
    /// SFQ(D) over `tenants` with dispatch depth `depth` (0: no limit of its own), by
    /// device time, no service floor.
    pub fn new(tenants: &[TenantSpec], depth: u32) -> Self {
        Self::with_depth(tenants, DispatchDepth::fixed(tenants.len(), depth))
    }

    /// SFQ over `tenants` with the dispatch depth `depth`, by device time, no floor.
    pub fn with_depth(tenants: &[TenantSpec], depth: DispatchDepth) -> Self {
        Self::on(
            Frame::new(tenants, depth, Floor::new(tenants.len(), None)),
            tenants,
        )
    }

    /// SFQ over `tenants` on `frame`, by device time.
    fn on(frame: Frame, tenants: &[TenantSpec]) -> Self {
        Sfq {
            frame,
            flows: vec![
                Flow {
                    last_finish: 0,
                    head_start: None,
                    factor: 1.0,
                };
                tenants.len()
            ],
            heads: BinaryHeap::new(),
            virtual_time: 0,
            min_cost: 4096,
            currency: Currency::DeviceTime,
        }
    }

    /// Shares `currency` (bytes: at least `min_cost` per request).
    pub fn with_currency(mut self, currency: Currency, min_cost: u64) -> Self {
        self.currency = currency;
        self.min_cost = min_cost;
        self
    }

    /// Serves every backlogged tenant at least as often as `floor` says.
    pub fn with_floor(mut self, floor: Floor) -> Self {
        self.frame = self.frame.with_floor(floor);
        self
    }

    /// Builds SFQ(D) from `depth`, `cost`, `min_cost` and `max_wait_ms`.
    pub fn build(
        params: &mut PolicyParams,
        tenants: &[TenantSpec],
    ) -> Result<Box<dyn Policy>, PolicyError> {
        Ok(Box::new(Self::from_params(params, tenants)?))
    }

    /// [`Sfq::build`], unboxed (MoTS runs on it).
    pub fn from_params(
        params: &mut PolicyParams,
        tenants: &[TenantSpec],
    ) -> Result<Self, PolicyError> {
        let frame = Frame::from_params(params, tenants, true)?;
        let currency = params.currency("cost", Currency::DeviceTime)?;
        if params.is_set("min_cost") && currency != Currency::Bytes {
            return Err(params.invalid("min_cost", "applies only with cost = \"bytes\""));
        }
        let min_cost = params.u64_or("min_cost", 4096)?;
        Ok(Sfq::on(frame, tenants).with_currency(currency, min_cost))
    }

    /// What `request` costs in tag units.
    fn cost(&self, request: &Request) -> f64 {
        let c = self.currency.price(request);
        if self.currency == Currency::Bytes {
            c.max(self.min_cost) as f64
        } else {
            c as f64
        }
    }

    /// Tags the head of `tenant`'s queue (it has one) and lists it.
    fn tag_head(&mut self, tenant: TenantId) {
        let request = *self.frame.front(tenant).expect("a head to tag");
        let cost = self.cost(&request);
        let weight = self.frame.weight(tenant) * self.flows[tenant as usize].factor;
        let f = &mut self.flows[tenant as usize];
        let start = self.virtual_time.max(f.last_finish);
        f.last_finish = start + (cost * SCALE / weight).round().max(1.0) as u64;
        f.head_start = Some(start);
        self.heads.push(Reverse((start, tenant)));
    }

    /// The tenant whose head has the smallest start tag, dropping stale entries.
    fn first(&mut self) -> Option<(u64, TenantId)> {
        while let Some(&Reverse((start, t))) = self.heads.peek() {
            if self.flows[t as usize].head_start == Some(start) {
                return Some((start, t));
            }
            self.heads.pop();
        }
        None
    }

    /// Takes `tenant`'s head for the device; `charged`: by its tag (the floor's
    /// dispatches are not charged: the tag goes back to where the head started).
    fn take(&mut self, tenant: TenantId, now: Nanos, charged: bool) -> Request {
        let f = &mut self.flows[tenant as usize];
        let start = f.head_start.take().expect("a tagged head");
        if charged {
            self.virtual_time = self.virtual_time.max(start);
        } else {
            f.last_finish = start;
        }
        let cost = self.cost(self.frame.front(tenant).expect("a tagged head is queued"));
        let service = if charged {
            Service::Share(cost)
        } else {
            Service::Floor(cost)
        };
        let (request, more) = self.frame.take(tenant, now, service);
        if more {
            self.tag_head(tenant);
        }
        request
    }

    /// Scales `tenant`'s weight by `factor` from its next tag on (MoTS).
    pub fn set_weight_factor(&mut self, tenant: TenantId, factor: f64) {
        self.flows[tenant as usize].factor = factor;
    }

    /// The factor on `tenant`'s weight.
    pub fn weight_factor(&self, tenant: TenantId) -> f64 {
        self.flows[tenant as usize].factor
    }
}

impl Policy for Sfq {
    fn name(&self) -> &'static str {
        "sfq"
    }

    fn enqueue(&mut self, request: Request, now: Nanos) -> Admission {
        let t = request.tenant;
        let f = &self.flows[t as usize];
        let behind = f.last_finish < self.virtual_time;
        if self.frame.arrive(request, now, behind) {
            self.tag_head(t);
        }
        Admission::Queued
    }

    fn dispatch(&mut self, now: Nanos) -> Dispatch {
        if !self.frame.may_dispatch(now) {
            return Dispatch::Idle;
        }
        if let Some(t) = self.frame.floor_due(now) {
            return Dispatch::Request(self.take(t, now, false));
        }
        let Some((_, tenant)) = self.first() else {
            return Dispatch::Idle;
        };
        self.heads.pop();
        Dispatch::Request(self.take(tenant, now, true))
    }

    fn complete(&mut self, completion: &Completion, now: Nanos) {
        let _ = self.frame.complete(completion, now);
    }

    fn update_tenant(&mut self, tenant: TenantId, spec: &TenantSpec, _now: Nanos) {
        self.frame.set_weight(tenant, spec.weight);
    }

    fn add_tenant(&mut self, spec: &TenantSpec, now: Nanos) -> TenantId {
        self.flows.push(Flow {
            last_finish: 0,
            head_start: None,
            factor: 1.0,
        });
        self.frame.add(spec, now)
    }

    fn queued(&self) -> usize {
        self.frame.queued()
    }

    fn withdraw_all(&mut self) -> Vec<Request> {
        self.heads.clear();
        for f in &mut self.flows {
            if let Some(start) = f.head_start.take() {
                // The head was tagged but never served: its tag is not spent.
                f.last_finish = start;
            }
        }
        self.frame.withdraw_all()
    }

    fn observe(&self, detail: Detail) -> Observation {
        Observation::of(detail, self.gauges(), || {
            serde_json::json!({
                "depth": self.frame.depth_report(),
                "floor_dispatches": self.frame.floor_dispatches(),
            })
        })
    }

    fn currency(&self) -> Currency {
        self.currency
    }

    fn check(&self) -> Result<(), String> {
        self.frame.check()?;
        let mut listed = vec![false; self.flows.len()];
        for Reverse((start, t)) in &self.heads {
            if self.flows[*t as usize].head_start == Some(*start) {
                listed[*t as usize] = true;
            }
        }
        for (i, f) in self.flows.iter().enumerate() {
            let t = i as TenantId;
            if f.head_start.is_some() != self.frame.is_backlogged(t) {
                return Err(format!(
                    "tenant {t}: head tagged = {}, backlogged = {}",
                    f.head_start.is_some(),
                    self.frame.is_backlogged(t)
                ));
            }
            if let Some(s) = f.head_start {
                if !listed[i] {
                    return Err(format!("tenant {t}: head tagged {s} but not listed"));
                }
                if f.last_finish <= s {
                    return Err(format!(
                        "tenant {t}: finish tag {} not after its start {s}",
                        f.last_finish
                    ));
                }
            }
        }
        Ok(())
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
        gauges.extend(self.frame.gauges());
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
        let mut p = Sfq::new(&tenants, 0);
        for i in 0..4 {
            p.put(req(i, 0, 4096), 0); // starts 0, 2.1M, 4.2M, 6.3M
        }
        for i in 10..12 {
            p.put(req(i, 1, 4096), 0); // starts 0, 4.2M
        }
        // Only the heads are tagged so far.
        assert_eq!(p.flows[0].last_finish, 2_097_152);
        assert_eq!(p.flows[1].last_finish, 4_194_304);
        // Ascending start tags, ties by tenant: (0,a) (0,b) (2.1M,a) (4.2M,a) (4.2M,b) (6.3M,a).
        assert_eq!(drain(&mut p), vec![0, 10, 1, 2, 11, 3]);
        assert_eq!(p.virtual_time, 3 * 2_097_152);
        assert_eq!(p.flows[0].last_finish, 4 * 2_097_152);
        assert_eq!(p.flows[1].last_finish, 2 * 4_194_304);
        assert_eq!(p.queued(), 0);
        p.check().unwrap();
    }

    #[test]
    fn idle_tenant_restarts_at_virtual_time() {
        let tenants = [
            TenantSpec::weighted("a", 1.0),
            TenantSpec::weighted("b", 1.0),
        ];
        let mut p = Sfq::new(&tenants, 0);
        for i in 0..10 {
            p.put(req(i, 0, 4096), 0);
        }
        assert_eq!(drain(&mut p).len(), 10);
        // b was idle; its first request starts at v (the last start tag), not at 0.
        p.put(req(100, 1, 4096), 0);
        p.put(req(11, 0, 4096), 0);
        assert_eq!(p.flows[1].head_start, Some(9 * 4_194_304));
        assert_eq!(p.flows[0].head_start, Some(10 * 4_194_304));
        assert_eq!(drain(&mut p), vec![100, 11]);
    }

    #[test]
    fn depth_limits_outstanding() {
        let tenants = [TenantSpec::weighted("a", 1.0)];
        let mut p = Sfq::new(&tenants, 2);
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
        let mut p = Sfq::new(&tenants, 0);
        p.put(req(0, 0, 4096), 0);
        assert_eq!(p.flows[0].last_finish, 4_194_304);
        p.update_tenant(0, &TenantSpec::weighted("a", 4.0), 0);
        p.put(req(1, 0, 4096), 0);
        // Tagged when it reaches the head, by the new weight.
        assert_eq!(drain(&mut p), vec![0, 1]);
        assert_eq!(p.flows[0].last_finish, 4_194_304 + 1_048_576);
    }

    /// Tenant a has a request in the device while b's twenty are dispatched past it;
    /// a's next request, sent as its other one completes, arrives with a's tags behind
    /// virtual time.
    fn starve_a(p: &mut Sfq, at: Nanos) {
        p.put(req(at, 0, 4096), at);
        p.put(req(at + 50, 0, 4096), at);
        for i in 0..20 {
            p.put(req(at + 1 + i, 1, 4096), at);
        }
        while let Dispatch::Request(_) = p.dispatch(at) {}
        // A closed loop: one of a's completes and a sends its next at once.
        p.complete(&completion(req(at, 0, 4096)), at + 1);
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
        let mut p = Sfq::with_depth(&two(), DispatchDepth::auto(2, 4, W));
        starve_a(&mut p, 0);
        assert_eq!(p.dispatch(W), Dispatch::Request(req(100, 0, 4096)));
        assert_eq!(
            p.frame.depth().limit(),
            0,
            "the first window saw tenants coming from idle"
        );
        starve_a(&mut p, W + 1);
        assert_eq!(p.frame.depth().outstanding(), 43);
        // The window's end shrinks the depth under what is outstanding: a's request
        // waits until completions bring the count below the new limit.
        assert_eq!(p.dispatch(2 * W + 1), Dispatch::Idle);
        // From the window's peak, 44 before a's completion.
        assert_eq!(p.frame.depth().limit(), 44 - 44 / 8);
        for id in 0..4 {
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
