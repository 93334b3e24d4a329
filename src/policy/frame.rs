//! The scheduling frame: what every queueing policy needs, owned once — the tenants'
//! queues, what each tenant has in the device (per kind of request), the dispatch depth
//! ([`super::depth`]), the service floor ([`super::floor`]) and the checks on them. A
//! policy on the frame keeps only its decisions: which tenant goes next (by its tags,
//! credits or budgets), what a dispatch is charged, and what it does each tick.
//!
//! The same bookkeeping was written into each policy by hand (arrival → depth, queue,
//! floor; dispatch → queue, depth, floor; completion → queue, depth), each with its own
//! order and its own `check()`; a policy that forgot a step (the floor told of a
//! dispatch, the depth of a completion) was wrong only in the simulator's checker, and
//! only where a test reached it. Here every call checks its preconditions (a dispatch
//! from an empty queue, a completion of a kind with nothing of it in the device, a floor
//! dispatch of a tenant that is not due) and every step its postconditions (the depth's
//! count of requests in the device is the queues'), with `assert!`, in the server as in
//! the simulator.
//!
//! Readings chosen:
//! * **Three kinds**: reads, writes (data moved to the device, zeroing included) and the
//!   rest (flushes, trims, block status lookups), counted in the device, so that a
//!   policy shapes by kind (read/write phases on flash: FIOS, Park and Shen, FAST 2012,
//!   [`super::phase`]) without counts of its own.
//! * **A tenant's queue stays one FIFO.** Its requests leave in the order they came
//!   whatever their kind; a policy that wants a kind asks for the tenants whose *head*
//!   is of it. Reordering a tenant's own requests by kind would reorder a write and a
//!   later read of the same block.
//! * **How a dispatch was decided is the caller's to say** ([`Service`]): by the policy's
//!   share (it counts against the depth and earns the floor its eighth), by the floor (it
//!   counts against the depth, spends the floor's credit), or outside both (a
//!   reservation: mClock's constraint phase, neither the depth nor the floor).
//! * Sans-I/O: given events and the time, it answers what the policy may do.

use super::depth::DispatchDepth;
use super::floor::Floor;
use super::{Gauge, PolicyError, PolicyParams, TenantQueues};
use crate::types::{Completion, Nanos, Op, Request, TenantId, TenantSpec};

/// The kinds of request the frame counts apart (module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Reads.
    Read,
    /// Writes, zeroing included.
    Write,
    /// Flushes, trims, block status lookups.
    Other,
}

impl Kind {
    /// The kind of `op`.
    pub fn of(op: Op) -> Kind {
        match op {
            Op::Read => Kind::Read,
            Op::Write => Kind::Write,
            Op::Flush | Op::Trim | Op::Status => Kind::Other,
        }
    }

    /// Its index in per-kind arrays.
    pub fn index(self) -> usize {
        self as usize
    }
}

/// How a dispatch was decided (module doc).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Service {
    /// By the policy's share, costing this much in its currency.
    Share(f64),
    /// By the service floor (the tenant [`Frame::floor_due`] named), costing this much.
    Floor(f64),
    /// Outside the depth and the floor (a reservation).
    Outside,
}

/// The frame (module doc).
#[derive(Debug, Clone)]
pub struct Frame {
    queues: TenantQueues,
    depth: DispatchDepth,
    floor: Floor,
    /// Requests in the device per kind.
    in_device: [u64; 3],
    /// Requests sent outside the depth and the floor, not yet completed, by id.
    outside: rustc_hash::FxHashSet<u64>,
    /// The tenant the floor named last and nobody has taken since.
    floor_named: Option<TenantId>,
}

impl Frame {
    /// A frame over `tenants` with `depth` and `floor`.
    pub fn new(tenants: &[TenantSpec], depth: DispatchDepth, floor: Floor) -> Self {
        Frame {
            queues: TenantQueues::new(tenants),
            depth,
            floor,
            in_device: [0; 3],
            outside: Default::default(),
            floor_named: None,
        }
    }

    /// A part of the frame is chosen (`what`) before any request came.
    fn assert_unused(&self, what: &str) {
        assert!(
            self.queues.queued() == 0 && self.queues.in_flight() == 0,
            "{what} before any request"
        );
    }

    /// The same frame with `floor` in place of its floor, before any request came.
    pub fn with_floor(mut self, floor: Floor) -> Self {
        self.assert_unused("the floor is replaced");
        self.floor = floor;
        self
    }

    /// The same frame taking requests in the order a gate releases them, not the
    /// order they arrived in (the token buckets' storage queue: a request bypassing
    /// its bucket passes older ones still behind it); its checks then do not hold the
    /// queues to arrival order.
    pub fn in_release_order(mut self) -> Self {
        self.assert_unused("the order is chosen");
        self.queues = self.queues.in_push_order();
        self
    }

    /// The same frame with `depth` in place of its depth, before any request came.
    pub fn with_depth(mut self, depth: DispatchDepth) -> Self {
        self.assert_unused("the depth is replaced");
        self.depth = depth;
        self
    }

    /// A frame with the depth and floor `params` give (`depth`, `min_depth`,
    /// `window_ms`, `max_wait_ms`); `auto_depth`: whether the depth adapts unless the
    /// parameters say otherwise.
    pub fn from_params(
        params: &mut PolicyParams,
        tenants: &[TenantSpec],
        auto_depth: bool,
    ) -> Result<Self, PolicyError> {
        let depth = DispatchDepth::from_params(params, tenants.len(), auto_depth)?;
        let floor = Floor::from_params(params, tenants.len())?;
        Ok(Frame::new(tenants, depth, floor))
    }

    /// The queues, weights and counts (read only: the frame changes them).
    #[inline]
    pub fn queues(&self) -> &TenantQueues {
        &self.queues
    }

    /// The head of `tenant`'s queue.
    #[inline]
    pub fn front(&self, tenant: TenantId) -> Option<&Request> {
        self.queues.front(tenant)
    }

    /// Whether `tenant` has requests waiting.
    #[inline]
    pub fn is_backlogged(&self, tenant: TenantId) -> bool {
        self.queues.is_backlogged(tenant)
    }

    /// `tenant`'s weight.
    #[inline]
    pub fn weight(&self, tenant: TenantId) -> f64 {
        self.queues.weight(tenant)
    }

    /// Requests waiting, over all tenants.
    #[inline]
    pub fn queued(&self) -> usize {
        self.queues.queued()
    }

    /// Requests of `kind` in the device.
    pub fn in_device_of_kind(&self, kind: Kind) -> u64 {
        self.in_device[kind.index()]
    }

    /// The dispatch depth (read only).
    #[cfg(test)]
    pub fn depth(&self) -> &DispatchDepth {
        &self.depth
    }

    /// `request` arrived at `now`; `behind`: the policy's tags say its tenant has
    /// fallen behind the others (the depth's signal). Queues it and answers whether it
    /// is its tenant's new head (the queue was empty: the policy tags it).
    #[must_use = "a new head must be tagged or listed by the policy"]
    pub fn arrive(&mut self, request: Request, now: Nanos, behind: bool) -> bool {
        let t = request.tenant;
        assert!(
            (t as usize) < self.queues.len(),
            "request {} of tenant {t}, which the frame does not know",
            request.id
        );
        self.depth
            .arrival(t, now, self.queues.is_backlogged(t), behind);
        let head = self.queues.push(request);
        if head {
            self.floor.backlogged(t, now);
        }
        head
    }

    /// Whether the depth lets one more request go to the device now.
    #[must_use]
    pub fn may_dispatch(&mut self, now: Nanos) -> bool {
        self.depth.may_dispatch(now, self.queues.queued())
    }

    /// The tenant the service floor serves now, if one is due and the floor's share
    /// allows it: the caller takes its head with [`Service::Floor`].
    pub fn floor_due(&mut self, now: Nanos) -> Option<TenantId> {
        let t = self.floor.due(now);
        if let Some(t) = t {
            assert!(
                self.queues.is_backlogged(t),
                "the floor named tenant {t}, which has nothing queued"
            );
        }
        self.floor_named = t;
        t
    }

    /// When the floor next has a tenant due (for a policy that would otherwise wait).
    pub fn floor_next_due(&mut self) -> Option<Nanos> {
        self.floor.next_due()
    }

    /// `tenant`, backlogged, may not be served before `from` (a limit holds it): the
    /// floor counts its wait from then.
    pub fn floor_postpone(&mut self, tenant: TenantId, from: Nanos) {
        self.floor.postpone(tenant, from);
    }

    /// Dispatches so far by the floor.
    pub fn floor_dispatches(&self) -> u64 {
        self.floor.dispatches()
    }

    /// The longest the floor lets a backlogged tenant wait (`None`: no floor).
    pub fn floor_max_wait(&self) -> Option<Nanos> {
        self.floor.max_wait()
    }

    /// Takes the head of `tenant`'s queue for the device at `now`, decided as
    /// `service` says; answers it and whether the tenant has more waiting.
    ///
    /// # Panics
    /// When the tenant has nothing queued, when the depth is full for a dispatch it
    /// counts, or when a floor dispatch is of another tenant than the floor named.
    pub fn take(&mut self, tenant: TenantId, now: Nanos, service: Service) -> (Request, bool) {
        if !matches!(service, Service::Outside) {
            assert!(
                self.depth.has_room(),
                "a dispatch of tenant {tenant} past the dispatch depth"
            );
        }
        let request = self.queues.dispatch(tenant);
        self.in_device[Kind::of(request.op).index()] += 1;
        let more = self.queues.is_backlogged(tenant);
        match service {
            Service::Share(cost) => {
                self.depth.dispatched(tenant);
                self.floor.served(tenant, now, more, cost);
            }
            Service::Floor(cost) => {
                assert_eq!(
                    self.floor_named.take(),
                    Some(tenant),
                    "a floor dispatch of a tenant the floor did not name"
                );
                self.depth.dispatched(tenant);
                self.floor.took(tenant, now, more, cost);
            }
            Service::Outside => {
                self.depth.dispatched_exempt(tenant);
                self.floor.served_outside(tenant, now, more);
                assert!(
                    self.outside.insert(request.id),
                    "request {} sent twice",
                    request.id
                );
            }
        }
        if self.floor_named == Some(tenant) {
            self.floor_named = None;
        }
        self.assert_counts();
        (request, more)
    }

    /// A request the frame took completed at `now`; answers whether its tenant has
    /// more waiting.
    ///
    /// # Panics
    /// When its tenant has nothing of its kind in the device.
    pub fn complete(&mut self, completion: &Completion, now: Nanos) -> bool {
        let r = &completion.request;
        let t = r.tenant;
        let kind = Kind::of(r.op).index();
        self.in_device[kind] = self.in_device[kind].checked_sub(1).unwrap_or_else(|| {
            panic!(
                "request {} of tenant {t} completed with nothing of its kind in the device",
                r.id
            )
        });
        self.queues.complete(t);
        let more = self.queues.is_backlogged(t);
        if !self.outside.is_empty() && self.outside.remove(&r.id) {
            self.depth.completed_exempt(t, now, more);
        } else {
            self.depth.completed(t, now, more);
        }
        self.assert_counts();
        more
    }

    /// The depth counts what the queues have in the device.
    #[inline]
    fn assert_counts(&self) {
        assert_eq!(
            u64::from(self.depth.outstanding()),
            self.queues.in_flight(),
            "the depth's count of requests in the device is not the queues'"
        );
    }

    /// Whether the policy judges `tenant`'s completions against a response time now
    /// (the depth's [`DispatchDepth::set_timed`]).
    pub fn set_timed(&mut self, tenant: TenantId, timed: bool) {
        self.depth.set_timed(tenant, timed);
    }

    /// A completion of a timed tenant was `late` or in time (the depth's
    /// [`DispatchDepth::timed`]).
    pub fn timed(&mut self, tenant: TenantId, now: Nanos, late: bool) {
        self.depth.timed(tenant, now, late);
    }

    /// Changes `tenant`'s weight.
    pub fn set_weight(&mut self, tenant: TenantId, weight: f64) {
        self.queues.set_weight(tenant, weight);
    }

    /// One more tenant, with `spec`'s weight, idle since `now`; its id.
    pub fn add(&mut self, spec: &TenantSpec, now: Nanos) -> TenantId {
        self.floor.add();
        self.depth.add(now);
        self.queues.add(spec)
    }

    /// Hands back every waiting request and forgets them (what is in the device stays
    /// counted).
    pub fn withdraw_all(&mut self) -> Vec<Request> {
        self.floor.clear();
        self.floor_named = None;
        self.queues.withdraw_all()
    }

    /// The depth's `outstanding` and `depth` gauges.
    pub fn gauges(&self) -> [Gauge; 2] {
        self.depth.gauges()
    }

    /// results.json's `depth` of the policy's stats.
    pub fn depth_report(&self) -> serde_json::Value {
        self.depth.report()
    }

    /// Every count agrees: the queues', the kinds', the depth's and the floor's.
    pub fn check(&self) -> Result<(), String> {
        self.queues.check()?;
        self.floor.check(|t| self.queues.is_backlogged(t))?;
        self.depth.check(self.queues.in_flight())?;
        let total: u64 = self.in_device.iter().sum();
        if total != self.queues.in_flight() {
            return Err(format!(
                "{:?} in the device by kind, {} by the queues",
                self.in_device,
                self.queues.in_flight()
            ));
        }
        Ok(())
    }
}

/// First come, first served across tenants, on the frame: the sequence of the tenants
/// whose requests the frame holds, one entry a request, in the order they came. A
/// tenant's next request in that sequence is the head of its FIFO, so taking the first
/// entry's tenant's head is taking the oldest request, in O(1) (`none`; the token
/// buckets' storage queue).
#[derive(Debug, Clone, Default)]
pub struct ArrivalOrder {
    order: std::collections::VecDeque<TenantId>,
}

impl ArrivalOrder {
    /// A request of `tenant` came to the frame.
    pub fn push(&mut self, tenant: TenantId) {
        self.order.push_back(tenant);
    }

    /// The tenant whose head is the oldest request held, taken off the sequence.
    pub fn pop(&mut self) -> Option<TenantId> {
        self.order.pop_front()
    }

    /// Requests in the sequence.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// `withdrawn` (what [`Frame::withdraw_all`] handed back, each tenant's in its
    /// order) put in the order they came; the sequence is then empty.
    ///
    /// # Panics
    /// When `withdrawn` is not what the sequence counts.
    pub fn order(&mut self, withdrawn: Vec<Request>, tenants: usize) -> Vec<Request> {
        assert_eq!(
            withdrawn.len(),
            self.order.len(),
            "the arrival order counts every request withdrawn"
        );
        let mut by_tenant = vec![std::collections::VecDeque::new(); tenants];
        for r in withdrawn {
            by_tenant[r.tenant as usize].push_back(r);
        }
        self.order
            .drain(..)
            .map(|t| {
                by_tenant[t as usize]
                    .pop_front()
                    .expect("every tenant in the order has a request withdrawn")
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::test_request;

    fn frame(depth: u32) -> Frame {
        Frame::new(
            &[
                TenantSpec::weighted("a", 1.0),
                TenantSpec::weighted("b", 2.0),
            ],
            DispatchDepth::fixed(2, depth),
            Floor::new(2, Some(500_000_000)),
        )
    }

    fn write(id: u64, tenant: TenantId, at: Nanos) -> Request {
        Request {
            op: Op::Write,
            ..test_request(id, tenant, 4096, at)
        }
    }

    fn done(request: Request, at: Nanos) -> Completion {
        Completion {
            request,
            start: at,
            finish: at,
        }
    }

    #[test]
    fn counts_each_kind_in_the_device() {
        let mut f = frame(0);
        assert!(f.arrive(test_request(1, 0, 4096, 0), 0, false));
        assert!(!f.arrive(write(2, 0, 1), 1, false));
        assert!(f.arrive(write(3, 1, 1), 1, false));
        let (r, more) = f.take(0, 2, Service::Share(1.0));
        assert_eq!((r.id, more), (1, true));
        assert_eq!(f.in_device_of_kind(Kind::Read), 1);
        let (w, more) = f.take(0, 3, Service::Outside);
        assert_eq!((w.id, more), (2, false));
        assert_eq!(f.depth().outstanding(), 2);
        f.check().unwrap();
        assert!(!f.complete(&done(w, 4), 4));
        assert!(!f.complete(&done(r, 5), 5));
        assert_eq!(f.in_device_of_kind(Kind::Write), 0);
        assert_eq!(f.withdraw_all().len(), 1);
        assert_eq!(f.queued(), 0);
        f.check().unwrap();
    }

    #[test]
    fn the_floor_names_a_waiting_tenant_and_only_it_is_taken_by_the_floor() {
        let mut f = frame(0);
        // A weight dispatch earns the floor its credit.
        let _ = f.arrive(test_request(1, 1, 4096, 0), 0, false);
        let _ = f.take(1, 0, Service::Share(8.0));
        let _ = f.arrive(test_request(2, 0, 4096, 0), 0, false);
        assert_eq!(f.floor_due(1), None);
        assert_eq!(f.floor_next_due(), Some(500_000_000));
        assert_eq!(f.floor_due(500_000_000), Some(0));
        let (r, _) = f.take(0, 500_000_000, Service::Floor(1.0));
        assert_eq!(r.id, 2);
        assert_eq!(f.floor_dispatches(), 1);
        f.check().unwrap();
    }

    #[test]
    #[should_panic(expected = "a floor dispatch of a tenant the floor did not name")]
    fn a_floor_dispatch_nobody_named_is_a_bug() {
        let mut f = frame(0);
        let _ = f.arrive(test_request(1, 0, 4096, 0), 0, false);
        let _ = f.take(0, 0, Service::Floor(1.0));
    }

    #[test]
    #[should_panic(expected = "nothing of its kind in the device")]
    fn a_completion_of_a_kind_not_in_the_device_is_a_bug() {
        let mut f = frame(0);
        let _ = f.arrive(test_request(1, 0, 4096, 0), 0, false);
        let (r, _) = f.take(0, 0, Service::Share(1.0));
        let _ = f.complete(&done(Request { op: Op::Write, ..r }, 1), 1);
    }

    #[test]
    fn the_depth_binds_dispatches_by_share_and_floor_but_not_outside() {
        let mut f = frame(1);
        for id in 0..3 {
            let _ = f.arrive(test_request(id, 0, 4096, 0), 0, false);
        }
        assert!(f.may_dispatch(0));
        let _ = f.take(0, 0, Service::Share(1.0));
        assert!(!f.may_dispatch(0));
        let _ = f.take(0, 0, Service::Outside);
        assert_eq!(f.depth().outstanding(), 2);
        f.check().unwrap();
    }

    #[test]
    fn the_arrival_order_takes_the_oldest_and_gives_back_in_order() {
        let mut f = frame(0);
        let mut o = ArrivalOrder::default();
        for (id, t) in [(1, 1), (2, 0), (3, 1), (4, 0)] {
            let _ = f.arrive(test_request(id, t, 4096, id), id, false);
            o.push(t);
        }
        let t = o.pop().unwrap();
        assert_eq!(f.take(t, 5, Service::Share(1.0)).0.id, 1);
        let back = o.order(f.withdraw_all(), 2);
        assert_eq!(back.iter().map(|r| r.id).collect::<Vec<_>>(), [2, 3, 4]);
        assert_eq!(o.len(), 0);
    }
}
