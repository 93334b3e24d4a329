//! The host core: what stands between the tenants' requests and the device, written
//! once and driven twice — by the simulator in virtual time and by the live server's
//! engine in wall time. Sans-I/O: it is handed requests, completions and the time, and
//! answers what to send to the device and when it wants to be woken.
//!
//! It owns
//! * **pricing**: every request admitted is stamped with what it costs the device
//!   ([`Request::cost`], from the device's cost model, [`crate::device::cost::Pricer`]),
//!   once, in arrival order: the policy charges it and the observers count it;
//! * **admission**: a request is offered with [`Host::admit`]; the host refuses it when
//!   its tenant already has `queue_limit` requests waiting ([`Refusal::QueueFull`]), the
//!   policy may refuse it ([`Refusal::Policy`]; with [`Refuse::Hold`] the host holds it
//!   back instead and offers it again), and past the drain deadline everything is
//!   refused ([`Refusal::Stopping`]). The live server asks [`Host::has_room`] before
//!   reading a tenant's connections, so its clients feel back-pressure instead of
//!   refusals;
//! * **dispatch**: [`Host::dispatch`] hands out what the policy releases while fewer than
//!   `queue_depth` requests are on the device;
//! * **completion**: [`Host::complete`] tells the policy and frees the slot;
//! * **alarms**: the policy's "ask me again at T", its periodic timer and the drain
//!   deadline, as one time ([`Host::next_alarm`]) the driver calls [`Host::on_time`] at;
//! * **stalls** (live only, [`stall`]): a tenant whose requests stop coming back keeps
//!   at most an even share of the device queue, and a request gone for long gives its
//!   slot back;
//! * **drain**: [`Host::start_drain`] sets a deadline; at [`Host::on_deadline`] what
//!   the policy still holds is withdrawn and refused as [`Refusal::Stopping`];
//! * **accounting** per tenant (held by the policy, on the device), with assertions on
//!   every count, and one [`Observer`] that sees every event (the simulator's
//!   [`crate::metrics::Recorder`], the live counters, the checker).
//!
//! `queue_limit` has one meaning in both drivers: the requests a tenant may have
//! *waiting in the host* (held by the policy, not yet on the device). Requests on the
//! device are bounded by `queue_depth` over all tenants, so a tenant never has more than
//! `queue_limit + queue_depth` requests inside the host.

pub mod stall;

use crate::device::cost::{CostModel, Pricer};
use crate::policy::{Admission, Detail, Dispatch, Observation, Policy, Refusal};
use crate::types::{Completion, Nanos, Request, TenantId, TenantSpec};
pub use stall::Stall;

/// How a request the device finished ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Served.
    Ok,
    /// The backend failed it (the client gets an error); it moved no data.
    Failed,
}

/// Sees every event of the host, in order. Recording (the simulator's results, the live
/// counters, `serve --out`) and checking plug in here, so there is one recording path
/// for both drivers.
pub trait Observer {
    /// A request was offered to the host (at `request.arrival`). Every request offered
    /// is then refused, or dispatched and completed, exactly once.
    fn arrived(&mut self, request: &Request);
    /// A request offered (and possibly held for a while) was refused at `now`.
    fn refused(&mut self, request: &Request, reason: Refusal, now: Nanos);
    /// The policy refused a request and the host holds it back to offer it again
    /// ([`Refuse::Hold`]); it is still to be dispatched or refused.
    fn held_back(&mut self, _request: &Request, _now: Nanos) {}
    /// A request went to the device at `now`.
    fn dispatched(&mut self, request: &Request, now: Nanos);
    /// A request on the device finished.
    fn completed(&mut self, completion: &Completion, status: Status);
    /// The device measured what `request` took of it (a disk's, an array's heads'
    /// time, ns): told just before its [`Observer::completed`], which then counts this
    /// as its device time in place of the cost model's price.
    fn measured(&mut self, _request: &Request, _device_ns: Nanos) {}
}

/// An observer that records nothing.
impl Observer for () {
    fn arrived(&mut self, _request: &Request) {}
    fn refused(&mut self, _request: &Request, _reason: Refusal, _now: Nanos) {}
    fn dispatched(&mut self, _request: &Request, _now: Nanos) {}
    fn completed(&mut self, _completion: &Completion, _status: Status) {}
}

/// Two observers seeing the same events, the first first.
impl<A: Observer, B: Observer> Observer for (A, B) {
    fn measured(&mut self, request: &Request, device_ns: Nanos) {
        self.0.measured(request, device_ns);
        self.1.measured(request, device_ns);
    }
    fn held_back(&mut self, request: &Request, now: Nanos) {
        self.0.held_back(request, now);
        self.1.held_back(request, now);
    }
    fn arrived(&mut self, request: &Request) {
        self.0.arrived(request);
        self.1.arrived(request);
    }
    fn refused(&mut self, request: &Request, reason: Refusal, now: Nanos) {
        self.0.refused(request, reason, now);
        self.1.refused(request, reason, now);
    }
    fn dispatched(&mut self, request: &Request, now: Nanos) {
        self.0.dispatched(request, now);
        self.1.dispatched(request, now);
    }
    fn completed(&mut self, completion: &Completion, status: Status) {
        self.0.completed(completion, status);
        self.1.completed(completion, status);
    }
}

/// An optional observer (`serve --out` records only when asked).
impl<O: Observer> Observer for Option<O> {
    fn measured(&mut self, request: &Request, device_ns: Nanos) {
        if let Some(o) = self {
            o.measured(request, device_ns);
        }
    }
    fn held_back(&mut self, request: &Request, now: Nanos) {
        if let Some(o) = self {
            o.held_back(request, now);
        }
    }
    fn arrived(&mut self, request: &Request) {
        if let Some(o) = self {
            o.arrived(request);
        }
    }
    fn refused(&mut self, request: &Request, reason: Refusal, now: Nanos) {
        if let Some(o) = self {
            o.refused(request, reason, now);
        }
    }
    fn dispatched(&mut self, request: &Request, now: Nanos) {
        if let Some(o) = self {
            o.dispatched(request, now);
        }
    }
    fn completed(&mut self, completion: &Completion, status: Status) {
        if let Some(o) = self {
            o.completed(completion, status);
        }
    }
}

/// The bounds the host enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Requests on the device at once, over all tenants (≥ 1).
    pub queue_depth: u32,
    /// Requests a tenant may have waiting in the host; `None`: unbounded.
    pub queue_limit: Option<u32>,
    /// What becomes of a request the policy refuses.
    pub refuse: Refuse,
    /// When a tenant whose requests do not come back is held to a share of the device
    /// queue ([`stall`]); `None`: never (the simulator's devices do not hang).
    pub stall: Option<Stall>,
}

/// What the host does with a request the policy refuses ([`Refusal::Policy`]: a token
/// bucket's queue could not let it pass within its response time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refuse {
    /// Refuse it: the client is answered with an error at once (the token-bucket
    /// paper's "the host is told"; the simulator's default, whose open-loop clients
    /// cannot be slowed down).
    Error,
    /// Hold it back in the host, counted against the tenant's `queue_limit`, and offer
    /// it to the policy again (first in, first out) until it is taken: the client sees
    /// slow I/O, not failed I/O (a guest's file system remounts read-only on the first
    /// error). The live server's default; its tenants feel back-pressure once their
    /// queue limit is reached.
    Hold,
}

impl Refuse {
    /// `"error"` or `"hold"`.
    pub fn parse(text: &str) -> Result<Refuse, UnknownRefuse> {
        match text {
            "error" => Ok(Refuse::Error),
            "hold" => Ok(Refuse::Hold),
            other => Err(UnknownRefuse(other.to_string())),
        }
    }
}

/// A `refuse` setting that is neither `"hold"` nor `"error"`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("expected \"hold\" or \"error\", got \"{0}\"")]
pub struct UnknownRefuse(pub String);

/// How often the host offers held-back requests again when nothing else wakes it.
const RETRY_NS: Nanos = 1_000_000;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct TenantCount {
    /// Offered, not yet dispatched or refused: held by the policy.
    held: u32,
    /// Dispatched, not yet completed.
    in_flight: u32,
}

/// The host core. `O` records and checks.
pub struct Host<O: Observer> {
    policy: Box<dyn Policy>,
    observer: O,
    limits: Limits,
    pricer: Pricer,
    tenants: Vec<TenantCount>,
    held: usize,
    in_flight: u32,
    /// The policy's pending "ask me again at T" (cleared once delivered).
    wake_at: Option<Nanos>,
    /// Set by [`Host::start_drain`].
    deadline: Option<Nanos>,
    /// The drain deadline passed: nothing is dispatched or admitted any more.
    stopped: bool,
    /// Per tenant, requests the policy refused and the host holds back ([`Refuse::Hold`]),
    /// in arrival order; counted in `held`.
    deferred: Vec<std::collections::VecDeque<Request>>,
    deferred_total: usize,
    /// With [`Limits::stall`]: requests in flight by age, parked ones, given-back slots.
    stalls: Option<stall::Stalls>,
}

impl<O: Observer> Host<O> {
    /// A host for `tenants` tenants around `policy`, pricing requests by `cost`.
    pub fn new(
        policy: Box<dyn Policy>,
        observer: O,
        limits: Limits,
        tenants: usize,
        cost: CostModel,
    ) -> Self {
        assert!(
            limits.queue_depth >= 1,
            "a device holds at least one request"
        );
        assert!(
            limits.queue_limit != Some(0),
            "a queue limit of 0 admits nothing"
        );
        Host {
            policy,
            observer,
            limits,
            pricer: Pricer::new(cost, tenants),
            tenants: vec![TenantCount::default(); tenants],
            held: 0,
            in_flight: 0,
            wake_at: None,
            deadline: None,
            stopped: false,
            deferred: vec![std::collections::VecDeque::new(); tenants],
            deferred_total: 0,
            stalls: limits.stall.map(|s| stall::Stalls::new(s, tenants)),
        }
    }

    /// Whether `tenant` is below its queue limit. The live server reads a tenant's
    /// connections only then. (Once stopped, everything offered is refused at once, so a
    /// stopped host has room: what clients already sent is answered, not left unread.)
    #[inline]
    pub fn has_room(&self, tenant: TenantId) -> bool {
        self.limits
            .queue_limit
            .is_none_or(|limit| self.tenants[tenant as usize].held < limit)
    }

    /// Offers a request (`request.arrival` is now); the host stamps its
    /// [`Request::cost`] unless it refuses it itself. A refused request is the caller's to answer; a queued one
    /// leaves through [`Host::dispatch`] or, when stopping, comes back from
    /// [`Host::on_deadline`].
    #[inline]
    pub fn admit(&mut self, mut request: Request, now: Nanos) -> Admission {
        let t = request.tenant as usize;
        assert!(t < self.tenants.len(), "tenant {t} out of range");
        self.observer.arrived(&request);
        let refusal = if self.stopped {
            Some(Refusal::Stopping)
        } else if !self.has_room(request.tenant) {
            Some(Refusal::QueueFull)
        } else {
            None
        };
        if let Some(reason) = refusal {
            self.observer.refused(&request, reason, now);
            return Admission::Refused(request, reason);
        }
        // Priced only once it enters: a request turned away here never reaches the
        // device, and must not move where its tenant's stream is said to be.
        request.cost = self.pricer.price(&request);
        self.tenants[t].held += 1;
        self.held += 1;
        if !self.deferred[t].is_empty() {
            // Behind the tenant's requests held back before it, in arrival order.
            self.defer(request, now);
            return Admission::Queued;
        }
        match self.policy.enqueue(request, now) {
            Admission::Queued => Admission::Queued,
            Admission::Refused(r, reason) => {
                assert_eq!(
                    r.id, request.id,
                    "a policy refuses only the request offered"
                );
                if reason == Refusal::Policy && self.limits.refuse == Refuse::Hold {
                    self.defer(r, now);
                    return Admission::Queued;
                }
                self.release_held(r.tenant);
                self.observer.refused(&r, reason, now);
                Admission::Refused(r, reason)
            }
        }
    }

    fn defer(&mut self, request: Request, now: Nanos) {
        self.observer.held_back(&request, now);
        self.deferred[request.tenant as usize].push_back(request);
        self.deferred_total += 1;
    }

    /// Offers the held-back requests to the policy again, each tenant's in arrival
    /// order until the policy refuses one; asks to be woken to try again while any
    /// remain.
    fn retry_deferred(&mut self, now: Nanos) {
        for t in 0..self.deferred.len() {
            while let Some(r) = self.deferred[t].pop_front() {
                match self.policy.enqueue(r, now) {
                    Admission::Queued => self.deferred_total -= 1,
                    Admission::Refused(back, _) => {
                        assert_eq!(back.id, r.id, "a policy refuses only the request offered");
                        self.deferred[t].push_front(back);
                        break;
                    }
                }
            }
        }
        if self.deferred_total > 0 {
            let at = now + RETRY_NS;
            if self.wake_at.is_none_or(|w| at < w || w <= now) {
                self.wake_at = Some(at);
            }
        }
    }

    /// The next request for the device while a slot is free, or `None`: no slot, the
    /// policy has nothing now (an alarm may have been set, see [`Host::next_alarm`]), or the
    /// host stopped. Call until `None` once every event of an instant has been handled.
    #[must_use = "a dispatched request must go to the device, or it is lost"]
    #[inline]
    pub fn dispatch(&mut self, now: Nanos) -> Option<Request> {
        if let Some(s) = &mut self.stalls {
            self.in_flight -= s.release_overdue(now);
        }
        if self.stopped || self.in_flight >= self.limits.queue_depth {
            return None;
        }
        if let Some(r) = self.unpark(now) {
            return Some(self.send(r, now));
        }
        if self.deferred_total > 0 {
            self.retry_deferred(now);
        }
        loop {
            match self.policy.dispatch(now) {
                Dispatch::Request(r) => {
                    if self.over_share(r.tenant, now) {
                        // Still held (counted against its queue limit) until it goes.
                        self.stalls.as_mut().expect("over share").park(r);
                        continue;
                    }
                    return Some(self.send(r, now));
                }
                Dispatch::Wait(at) => {
                    let at = at.max(now + 1);
                    if self.wake_at.is_none_or(|w| at < w || w <= now) {
                        self.wake_at = Some(at);
                    }
                    return None;
                }
                Dispatch::Idle => return None,
            }
        }
    }

    /// `r`, released by the policy, goes to the device.
    fn send(&mut self, r: Request, now: Nanos) -> Request {
        self.release_held(r.tenant);
        self.tenants[r.tenant as usize].in_flight += 1;
        self.in_flight += 1;
        assert!(self.in_flight <= self.limits.queue_depth);
        if let Some(s) = &mut self.stalls {
            s.dispatched(&r, now);
        }
        self.observer.dispatched(&r, now);
        r
    }

    /// Whether `tenant` is stalled and holds its share of the device queue already.
    fn over_share(&self, tenant: TenantId, now: Nanos) -> bool {
        self.stalls.as_ref().is_some_and(|s| s.stalled(tenant, now))
            && self.tenants[tenant as usize].in_flight >= self.stalled_share()
    }

    /// A stalled tenant's share of the device queue: an even one over the tenants with
    /// work, at least one place.
    fn stalled_share(&self) -> u32 {
        let with_work = self
            .tenants
            .iter()
            .filter(|c| c.held > 0 || c.in_flight > 0)
            .count()
            .max(1) as u32;
        (self.limits.queue_depth / with_work).max(1)
    }

    /// The first parked request whose tenant is under its share again.
    fn unpark(&mut self, now: Nanos) -> Option<Request> {
        let s = self.stalls.as_ref()?;
        if s.parked_total() == 0 {
            return None;
        }
        // Counted once for every tenant looked at (n tenants, not n² steps).
        let share = self.stalled_share();
        let t = (0..self.tenants.len() as TenantId).find(|&t| {
            s.parked(t) > 0 && !(s.stalled(t, now) && self.tenants[t as usize].in_flight >= share)
        })?;
        self.stalls.as_mut().expect("present").unpark(t)
    }

    /// A request on the device finished at `now`.
    #[inline]
    pub fn complete(&mut self, completion: &Completion, status: Status, now: Nanos) {
        let t = completion.request.tenant as usize;
        let count = &mut self.tenants[t].in_flight;
        *count = count
            .checked_sub(1)
            .unwrap_or_else(|| panic!("tenant {t}: a completion with nothing in flight"));
        let given_back = self
            .stalls
            .as_mut()
            .is_some_and(|s| s.completed(t as TenantId, completion.request.id, now));
        if !given_back {
            self.in_flight -= 1;
        }
        assert!(
            completion.finish >= completion.start && completion.start >= completion.request.arrival,
            "request {} finished before it started, or started before it arrived",
            completion.request.id
        );
        self.policy.complete(completion, now);
        self.observer.completed(completion, status);
    }

    /// Starts stopping: requests the policy still holds at `now + timeout` are
    /// withdrawn then (see [`Host::on_deadline`]). A second call keeps the first deadline.
    pub fn start_drain(&mut self, now: Nanos, timeout: Nanos) {
        if self.deadline.is_none() {
            self.deadline = Some(now.saturating_add(timeout));
        }
    }

    /// The drain deadline, once [`Host::start_drain`] was called.
    pub fn deadline(&self) -> Option<Nanos> {
        self.deadline
    }

    /// Whether the drain deadline passed (nothing is dispatched or admitted any more).
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// At or after the drain deadline: stops dispatching and admitting, and withdraws
    /// every request the policy still holds; each is refused ([`Refusal::Stopping`]) and
    /// appended to `refused` for the caller to answer. Before the deadline: nothing.
    pub fn on_deadline(&mut self, now: Nanos, refused: &mut Vec<Request>) {
        if self.stopped || self.deadline.is_none_or(|d| now < d) {
            return;
        }
        self.stopped = true;
        let mut withdrawn = self.policy.withdraw_all();
        assert_eq!(self.policy.queued(), 0, "withdraw_all leaves nothing held");
        for d in &mut self.deferred {
            withdrawn.extend(d.drain(..));
        }
        if let Some(s) = &mut self.stalls {
            withdrawn.extend(s.withdraw_parked());
        }
        self.deferred_total = 0;
        assert_eq!(
            withdrawn.len(),
            self.held,
            "the policy and the held-back queues held what the host counted"
        );
        for r in withdrawn {
            self.release_held(r.tenant);
            self.observer.refused(&r, Refusal::Stopping, now);
            refused.push(r);
        }
    }

    /// The earliest time the host wants to be woken, to call [`Host::on_time`] then: the
    /// policy's pending wait, its timer, or the drain deadline while it has not passed.
    /// The one alarm protocol of both drivers: the simulator keeps one alarm event at
    /// this time, the live engine bounds its wait on the ring by it.
    pub fn next_alarm(&self) -> Option<Nanos> {
        let deadline = self.deadline.filter(|_| !self.stopped);
        let release = self.stalls.as_ref().and_then(|s| s.next_alarm());
        [self.wake_at, self.policy.next_timer(), deadline, release]
            .into_iter()
            .flatten()
            .min()
    }

    /// Delivers every alarm due by `now`: a wait that came due, the policy's timer, the
    /// drain deadline (requests refused then go to `refused`).
    pub fn on_time(&mut self, now: Nanos, refused: &mut Vec<Request>) {
        if self.wake_at.is_some_and(|w| w <= now) {
            self.wake_at = None;
        }
        if self.policy.next_timer().is_some_and(|t| t <= now) {
            self.policy.on_timer(now);
        }
        if let Some(s) = &mut self.stalls {
            self.in_flight -= s.release_overdue(now);
        }
        self.on_deadline(now, refused);
    }

    /// A tenant's weight, SLO, reservation or limit changed while running.
    pub fn update_tenant(&mut self, tenant: TenantId, spec: &TenantSpec, now: Nanos) {
        self.policy.update_tenant(tenant, spec, now);
    }

    /// Limits decided outside the policy for `tenant` from `now` on
    /// ([`Policy::set_limits`]); `false` when the policy does not take them.
    pub fn set_limits(
        &mut self,
        tenant: TenantId,
        limits: &crate::limits::governor::Limits,
        now: Nanos,
    ) -> bool {
        self.policy.set_limits(tenant, limits, now)
    }

    /// A tenant joins while running: the host and its policy count it from now on. Its
    /// id is the number of tenants before it (the policy answers the same, asserted).
    pub fn add_tenant(&mut self, spec: &TenantSpec, now: Nanos) -> TenantId {
        let id = self.tenants.len() as TenantId;
        let policy_id = self.policy.add_tenant(spec, now);
        assert_eq!(policy_id, id, "the policy numbers tenants as the host does");
        self.tenants.push(TenantCount::default());
        self.deferred.push(std::collections::VecDeque::new());
        if let Some(s) = &mut self.stalls {
            s.add();
        }
        id
    }

    /// Number of tenants (added ones included).
    pub fn tenants(&self) -> usize {
        self.tenants.len()
    }

    /// Requests held by the policy, over all tenants.
    pub fn queued(&self) -> usize {
        self.held
    }

    /// Requests of `tenant` held by the policy.
    pub fn held(&self, tenant: TenantId) -> u32 {
        self.tenants[tenant as usize].held
    }

    /// Requests holding a place in the device queue, over all tenants (with
    /// [`Limits::stall`], requests that gave their slot back are not counted).
    pub fn in_flight(&self) -> u32 {
        self.in_flight
    }

    /// Requests of `tenant` on the device.
    pub fn tenant_in_flight(&self, tenant: TenantId) -> u32 {
        self.tenants[tenant as usize].in_flight
    }

    /// Nothing held and nothing on the device (given-back slots included).
    pub fn is_idle(&self) -> bool {
        self.held == 0
            && self.in_flight == 0
            && self.stalls.as_ref().is_none_or(|s| s.released() == 0)
    }

    /// The bounds in force.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The policy's state.
    pub fn observe(&self, detail: Detail) -> Observation {
        let mut o = self.policy.observe(detail);
        o.currency = self.policy.currency();
        o
    }

    /// The registry name of the policy.
    pub fn policy_name(&self) -> &'static str {
        self.policy.name()
    }

    /// What the policy shares by weight.
    pub fn currency(&self) -> crate::device::cost::Currency {
        self.policy.currency()
    }

    /// The cost model requests are priced by.
    pub fn cost_model(&self) -> &CostModel {
        self.pricer.model()
    }

    /// The observer.
    pub fn observer(&self) -> &O {
        &self.observer
    }

    /// The observer, to change.
    pub fn observer_mut(&mut self) -> &mut O {
        &mut self.observer
    }

    /// Ends the host: its observer, and the policy's full observation.
    pub fn finish(self) -> (O, Observation) {
        let observation = self.observe(Detail::Full);
        (self.observer, observation)
    }

    /// What must hold between events: the host's counts add up and agree with the
    /// policy's; the device holds at most `queue_depth`; the policy's own invariants
    /// ([`Policy::check`]). `Err` says what broke.
    pub fn check(&self) -> Result<(), String> {
        self.policy
            .check()
            .map_err(|e| format!("policy {}: {e}", self.policy.name()))?;
        let held: usize = self.tenants.iter().map(|t| t.held as usize).sum();
        let in_flight: u32 = self.tenants.iter().map(|t| t.in_flight).sum();
        if held != self.held {
            return Err(format!(
                "held per tenant sums to {held}, total {}",
                self.held
            ));
        }
        let deferred: usize = self.deferred.iter().map(|d| d.len()).sum();
        if deferred != self.deferred_total {
            return Err(format!(
                "held back per tenant sums to {deferred}, total {}",
                self.deferred_total
            ));
        }
        let (parked, given_back) = self
            .stalls
            .as_ref()
            .map_or((0, 0), |s| (s.parked_total(), s.released()));
        if self.policy.queued() + self.deferred_total + parked != self.held {
            return Err(format!(
                "the policy holds {} requests and the host holds back {} and parks {parked}, the host counted {}",
                self.policy.queued(),
                self.deferred_total,
                self.held
            ));
        }
        if in_flight != self.in_flight + given_back {
            return Err(format!(
                "in flight per tenant sums to {in_flight}, total {} and {given_back} given back",
                self.in_flight
            ));
        }
        if let Some(s) = &self.stalls
            && let Some((t, c)) = self
                .tenants
                .iter()
                .enumerate()
                .find(|(t, c)| s.outstanding(*t as TenantId) != c.in_flight as usize)
        {
            return Err(format!(
                "tenant {t}: {} in flight, {} tracked by age",
                c.in_flight,
                s.outstanding(t as TenantId)
            ));
        }
        if self.in_flight > self.limits.queue_depth {
            return Err(format!(
                "{} in flight, above the queue depth {}",
                self.in_flight, self.limits.queue_depth
            ));
        }
        if let Some(limit) = self.limits.queue_limit
            && let Some((t, c)) = self
                .tenants
                .iter()
                .enumerate()
                .find(|(_, c)| c.held > limit)
        {
            return Err(format!(
                "tenant {t} holds {} requests, above its queue limit {limit}",
                c.held
            ));
        }
        Ok(())
    }

    #[inline]
    fn release_held(&mut self, tenant: TenantId) {
        let count = &mut self.tenants[tenant as usize].held;
        *count = count
            .checked_sub(1)
            .unwrap_or_else(|| panic!("tenant {tenant}: released a request it did not hold"));
        self.held -= 1;
    }
}

#[cfg(test)]
mod tests;
