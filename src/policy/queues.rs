//! The per-tenant bookkeeping every queueing policy shares, written once: a FIFO of
//! requests per tenant, its weight, the requests of each tenant the policy has sent to
//! the device, and the totals, with every count asserted on the way (a completion of a
//! tenant with nothing on the device is a bug, not a number to saturate at zero).
//!
//! A policy keeps its own per-tenant state (tags, credits, slices) beside this, indexed
//! the same way; [`TenantQueues::check`] is the part of its [`super::Policy::check`] that
//! every policy has.

use crate::types::{Request, TenantId, TenantSpec};
use std::collections::VecDeque;

/// One tenant's queue and counts.
#[derive(Debug, Clone)]
struct Slot {
    weight: f64,
    queue: VecDeque<Request>,
    /// Dispatched by the policy, not yet completed.
    in_flight: u32,
}

/// Per-tenant FIFOs, weights and counts (module doc).
#[derive(Debug, Clone)]
pub struct TenantQueues {
    slots: Vec<Slot>,
    queued: usize,
    in_flight: u64,
    /// Tenants with a request waiting or on the device.
    active: usize,
    /// Whether each queue is in arrival order (`check` holds it to that); `false` for
    /// queues that take requests as a gate releases them (the token buckets' storage
    /// queue, where a request bypassing the bucket passes older ones still behind it).
    arrival_order: bool,
}

impl Slot {
    fn active(&self) -> bool {
        !self.queue.is_empty() || self.in_flight > 0
    }
}

impl TenantQueues {
    /// Empty queues for `tenants`, with their weights.
    pub fn new(tenants: &[TenantSpec]) -> Self {
        TenantQueues {
            slots: tenants
                .iter()
                .map(|t| Slot {
                    weight: t.weight,
                    queue: VecDeque::new(),
                    in_flight: 0,
                })
                .collect(),
            queued: 0,
            in_flight: 0,
            active: 0,
            arrival_order: true,
        }
    }

    /// The same queues, holding requests in the order they are pushed rather than
    /// the order they arrived in (`arrival_order` above).
    pub fn in_push_order(mut self) -> Self {
        self.arrival_order = false;
        self
    }

    /// Appends a tenant with `spec`'s weight and nothing queued; its id is the number of
    /// tenants before it.
    pub fn add(&mut self, spec: &TenantSpec) -> TenantId {
        self.slots.push(Slot {
            weight: spec.weight,
            queue: VecDeque::new(),
            in_flight: 0,
        });
        (self.slots.len() - 1) as TenantId
    }

    /// Number of tenants.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether there are no tenants.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Appends `request` to its tenant's queue; `true` when the queue was empty (the
    /// tenant just became backlogged).
    #[inline]
    pub fn push(&mut self, request: Request) -> bool {
        let slot = &mut self.slots[request.tenant as usize];
        let was_empty = slot.queue.is_empty();
        if was_empty && slot.in_flight == 0 {
            self.active += 1;
        }
        slot.queue.push_back(request);
        self.queued += 1;
        was_empty
    }

    /// Puts a request back at the head of its tenant's queue (taken with
    /// [`TenantQueues::pop`] and not sent after all).
    pub fn push_front(&mut self, request: Request) {
        let slot = &mut self.slots[request.tenant as usize];
        if !slot.active() {
            self.active += 1;
        }
        slot.queue.push_front(request);
        self.queued += 1;
    }

    /// The head of `tenant`'s queue.
    #[inline]
    pub fn front(&self, tenant: TenantId) -> Option<&Request> {
        self.slots[tenant as usize].queue.front()
    }

    /// Takes the head of `tenant`'s queue without sending it (a policy that moves it to
    /// a queue of its own); see [`TenantQueues::dispatch`] for one going to the device.
    #[inline]
    pub fn pop(&mut self, tenant: TenantId) -> Option<Request> {
        let slot = &mut self.slots[tenant as usize];
        let r = slot.queue.pop_front()?;
        if !slot.active() {
            self.active -= 1;
        }
        self.queued -= 1;
        Some(r)
    }

    /// Takes the head of `tenant`'s queue for the device: it counts as in flight until
    /// [`TenantQueues::complete`].
    ///
    /// # Panics
    /// When the tenant has nothing queued.
    #[inline]
    pub fn dispatch(&mut self, tenant: TenantId) -> Request {
        let r = self
            .pop(tenant)
            .unwrap_or_else(|| panic!("tenant {tenant}: dispatched from an empty queue"));
        self.sent(tenant);
        r
    }

    /// A request of `tenant` taken with [`TenantQueues::pop`] went to the device.
    #[inline]
    pub fn sent(&mut self, tenant: TenantId) {
        let slot = &mut self.slots[tenant as usize];
        if !slot.active() {
            self.active += 1;
        }
        slot.in_flight += 1;
        self.in_flight += 1;
    }

    /// A request of `tenant` the policy sent completed.
    ///
    /// # Panics
    /// When the tenant has nothing in flight: a completion the policy did not send.
    #[inline]
    pub fn complete(&mut self, tenant: TenantId) {
        let slot = &mut self.slots[tenant as usize];
        slot.in_flight = slot
            .in_flight
            .checked_sub(1)
            .unwrap_or_else(|| panic!("tenant {tenant}: a completion with nothing in flight"));
        if !slot.active() {
            self.active -= 1;
        }
        self.in_flight -= 1;
    }

    /// Requests `tenant` has waiting.
    #[inline]
    pub fn queued_of(&self, tenant: TenantId) -> usize {
        self.slots[tenant as usize].queue.len()
    }

    /// Whether `tenant` has requests waiting.
    #[inline]
    pub fn is_backlogged(&self, tenant: TenantId) -> bool {
        !self.slots[tenant as usize].queue.is_empty()
    }

    /// Requests of `tenant` on the device.
    #[inline]
    pub fn in_flight_of(&self, tenant: TenantId) -> u32 {
        self.slots[tenant as usize].in_flight
    }

    /// Whether `tenant` has requests waiting or on the device.
    #[inline]
    pub fn is_active(&self, tenant: TenantId) -> bool {
        let s = &self.slots[tenant as usize];
        !s.queue.is_empty() || s.in_flight > 0
    }

    /// Tenants with a request waiting or on the device.
    #[inline]
    pub fn active(&self) -> usize {
        self.active
    }

    /// Requests waiting, over all tenants.
    #[inline]
    pub fn queued(&self) -> usize {
        self.queued
    }

    /// Requests on the device, over all tenants.
    pub fn in_flight(&self) -> u64 {
        self.in_flight
    }

    /// `tenant`'s weight.
    #[inline]
    pub fn weight(&self, tenant: TenantId) -> f64 {
        self.slots[tenant as usize].weight
    }

    /// Changes `tenant`'s weight.
    pub fn set_weight(&mut self, tenant: TenantId, weight: f64) {
        self.slots[tenant as usize].weight = weight;
    }

    /// The tenants' ids, in order.
    pub fn ids(&self) -> impl Iterator<Item = TenantId> + use<> {
        0..self.slots.len() as TenantId
    }

    /// `tenant`'s waiting requests, oldest first.
    pub fn iter_of(&self, tenant: TenantId) -> impl Iterator<Item = &Request> {
        self.slots[tenant as usize].queue.iter()
    }

    /// Hands back every waiting request (each tenant's in order, tenants in order) and
    /// forgets them; what is on the device stays counted.
    pub fn withdraw_all(&mut self) -> Vec<Request> {
        let all: Vec<Request> = self
            .slots
            .iter_mut()
            .flat_map(|s| s.queue.drain(..))
            .collect();
        self.queued -= all.len();
        self.active = self.slots.iter().filter(|s| s.active()).count();
        all
    }

    /// The counts add up, every queued request sits in its own tenant's queue, and each
    /// queue is in arrival order (unless [`TenantQueues::in_push_order`]).
    pub fn check(&self) -> Result<(), String> {
        let queued: usize = self.slots.iter().map(|s| s.queue.len()).sum();
        if queued != self.queued {
            return Err(format!(
                "queues hold {queued} requests, the total says {}",
                self.queued
            ));
        }
        let active = self.slots.iter().filter(|s| s.active()).count();
        if active != self.active {
            return Err(format!(
                "{active} tenants active, the count says {}",
                self.active
            ));
        }
        let in_flight: u64 = self.slots.iter().map(|s| u64::from(s.in_flight)).sum();
        if in_flight != self.in_flight {
            return Err(format!(
                "tenants have {in_flight} in flight, the total says {}",
                self.in_flight
            ));
        }
        for (t, s) in self.slots.iter().enumerate() {
            if let Some(r) = s.queue.iter().find(|r| r.tenant as usize != t) {
                return Err(format!(
                    "request {} of tenant {} in tenant {t}'s queue",
                    r.id, r.tenant
                ));
            }
            if self.arrival_order
                && s.queue
                    .iter()
                    .zip(s.queue.iter().skip(1))
                    .any(|(a, b)| b.arrival < a.arrival)
            {
                return Err(format!("tenant {t}'s queue is out of arrival order"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::test_request;

    fn two() -> TenantQueues {
        TenantQueues::new(&[
            TenantSpec::weighted("a", 1.0),
            TenantSpec::weighted("b", 3.0),
        ])
    }

    #[test]
    fn counts_follow_pushes_dispatches_and_completions() {
        let mut q = two();
        assert!(q.push(test_request(1, 0, 4096, 0)));
        assert!(!q.push(test_request(2, 0, 4096, 1)));
        assert!(q.push(test_request(3, 1, 4096, 1)));
        assert_eq!((q.queued(), q.queued_of(0), q.queued_of(1)), (3, 2, 1));
        assert_eq!(q.dispatch(0).id, 1);
        assert_eq!((q.queued(), q.in_flight(), q.in_flight_of(0)), (2, 1, 1));
        assert!(q.is_active(0) && q.is_backlogged(0));
        q.complete(0);
        assert_eq!(q.in_flight(), 0);
        assert_eq!(q.weight(1), 3.0);
        q.set_weight(1, 5.0);
        assert_eq!(q.weight(1), 5.0);
        let all = q.withdraw_all();
        assert_eq!(all.iter().map(|r| r.id).collect::<Vec<_>>(), vec![2, 3]);
        assert_eq!(q.queued(), 0);
        q.check().unwrap();
    }

    #[test]
    fn active_counts_tenants_with_anything_queued_or_in_flight() {
        let mut q = two();
        assert_eq!(q.active(), 0);
        q.push(test_request(1, 0, 4096, 0));
        q.push(test_request(2, 0, 4096, 0));
        assert_eq!(q.active(), 1);
        let _ = q.dispatch(0);
        let _ = q.dispatch(0);
        // Both on the device: still active.
        assert_eq!(q.active(), 1);
        q.push(test_request(3, 1, 4096, 0));
        assert_eq!(q.active(), 2);
        q.complete(0);
        assert_eq!(q.active(), 2);
        q.complete(0);
        assert_eq!(q.active(), 1);
        assert_eq!(q.withdraw_all().len(), 1);
        assert_eq!(q.active(), 0);
        q.check().unwrap();
    }

    #[test]
    #[should_panic(expected = "a completion with nothing in flight")]
    fn a_completion_never_sent_is_a_bug() {
        let mut q = two();
        q.push(test_request(1, 0, 4096, 0));
        q.complete(0);
    }

    #[test]
    fn check_finds_a_request_in_the_wrong_queue() {
        let mut q = two();
        q.push(test_request(1, 0, 4096, 0));
        q.slots[1].queue.push_back(test_request(2, 0, 4096, 0));
        q.queued += 1;
        q.active += 1;
        assert!(q.check().unwrap_err().contains("tenant 1's queue"));
    }
}
