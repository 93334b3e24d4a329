//! `none`: first in, first out across all tenants, no control. The baseline every
//! other policy is compared against (the papers' "no scheduler" / TA0).
//!
//! On the scheduling frame ([`super::frame`]) with no depth of its own and no floor:
//! the frame holds each tenant's FIFO and its counts, and the order of arrival across
//! tenants is [`super::frame::ArrivalOrder`], so a dispatch is O(1).

use super::depth::DispatchDepth;
use super::floor::Floor;
use super::frame::{ArrivalOrder, Frame, Service};
use super::{Admission, Dispatch, Policy};
use crate::types::{Completion, Nanos, Request, TenantId, TenantSpec};

/// FIFO: requests leave in the order they arrived, whoever sent them.
pub struct Fifo {
    /// The tenants' FIFOs ([`super::frame`]).
    frame: Frame,
    /// Who sent each request the frame holds, in arrival order.
    order: ArrivalOrder,
}

impl Fifo {
    /// An empty FIFO over `tenants` tenants (their weights do not matter to it).
    pub fn new(tenants: usize) -> Self {
        let specs: Vec<TenantSpec> = (0..tenants)
            .map(|i| TenantSpec::weighted(i.to_string(), 1.0))
            .collect();
        Fifo {
            frame: Frame::new(
                &specs,
                DispatchDepth::fixed(tenants, 0),
                Floor::new(tenants, None),
            ),
            order: ArrivalOrder::default(),
        }
    }
}

impl Policy for Fifo {
    fn name(&self) -> &'static str {
        "none"
    }

    fn enqueue(&mut self, request: Request, now: Nanos) -> Admission {
        let t = request.tenant;
        let _ = self.frame.arrive(request, now, false);
        self.order.push(t);
        Admission::Queued
    }

    fn dispatch(&mut self, now: Nanos) -> Dispatch {
        match self.order.pop() {
            Some(t) => Dispatch::Request(self.frame.take(t, now, Service::Share(0.0)).0),
            None => Dispatch::Idle,
        }
    }

    fn complete(&mut self, completion: &Completion, now: Nanos) {
        let _ = self.frame.complete(completion, now);
    }

    fn update_tenant(&mut self, _tenant: TenantId, _spec: &TenantSpec, _now: Nanos) {}

    fn add_tenant(&mut self, spec: &TenantSpec, now: Nanos) -> TenantId {
        self.frame.add(spec, now)
    }

    fn queued(&self) -> usize {
        self.frame.queued()
    }

    fn withdraw_all(&mut self) -> Vec<Request> {
        let withdrawn = self.frame.withdraw_all();
        self.order.order(withdrawn, self.frame.queues().len())
    }

    fn check(&self) -> Result<(), String> {
        self.frame.check()?;
        if self.order.len() != self.frame.queued() {
            return Err(format!(
                "{} in the arrival order, {} held",
                self.order.len(),
                self.frame.queued()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::TestPolicy;

    fn req(id: u64, tenant: TenantId, arrival: Nanos) -> Request {
        crate::policy::test_request(id, tenant, 4096, arrival)
    }

    #[test]
    fn dispatches_in_arrival_order_across_tenants() {
        let mut p = Fifo::new(3);
        let order = [(0, 2), (1, 0), (2, 1), (3, 0), (4, 2)];
        for (i, &(id, t)) in order.iter().enumerate() {
            p.put(req(id, t, i as Nanos * 10), i as Nanos * 10);
        }
        assert_eq!(p.queued(), 5);
        let mut got = Vec::new();
        while let Dispatch::Request(r) = p.dispatch(100) {
            got.push((r.id, r.tenant));
        }
        assert_eq!(got, order.to_vec());
        assert_eq!(p.dispatch(100), Dispatch::Idle);
        assert_eq!(p.queued(), 0);
    }

    #[test]
    fn interleaves_new_arrivals_behind_old_ones() {
        let mut p = Fifo::new(2);
        p.put(req(1, 0, 0), 0);
        assert_eq!(p.dispatch(1), Dispatch::Request(req(1, 0, 0)));
        p.put(req(2, 1, 2), 2);
        p.put(req(3, 0, 3), 3);
        assert_eq!(p.dispatch(4), Dispatch::Request(req(2, 1, 2)));
        assert_eq!(p.dispatch(4), Dispatch::Request(req(3, 0, 3)));
    }
}
