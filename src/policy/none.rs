//! `none`: first in, first out across all tenants, no control. The baseline every
//! other policy is compared against (the papers' "no scheduler" / TA0).

use super::{Admission, Dispatch, Policy};
use crate::types::{Completion, Nanos, Request, TenantId, TenantSpec};
use std::collections::VecDeque;

/// FIFO: requests leave in the order they arrived, whoever sent them.
pub struct Fifo {
    queue: VecDeque<Request>,
    tenants: usize,
}

impl Fifo {
    /// An empty FIFO; the number of tenants does not matter to it.
    pub fn new(tenants: usize) -> Self {
        Fifo {
            queue: VecDeque::new(),
            tenants,
        }
    }
}

impl Policy for Fifo {
    fn name(&self) -> &'static str {
        "none"
    }

    fn enqueue(&mut self, request: Request, _now: Nanos) -> Admission {
        self.queue.push_back(request);
        Admission::Queued
    }

    fn dispatch(&mut self, _now: Nanos) -> Dispatch {
        match self.queue.pop_front() {
            Some(r) => Dispatch::Request(r),
            None => Dispatch::Idle,
        }
    }

    fn complete(&mut self, _completion: &Completion, _now: Nanos) {}

    fn update_tenant(&mut self, _tenant: TenantId, _spec: &TenantSpec, _now: Nanos) {}

    fn add_tenant(&mut self, _spec: &TenantSpec, _now: Nanos) -> TenantId {
        self.tenants += 1;
        (self.tenants - 1) as TenantId
    }

    fn queued(&self) -> usize {
        self.queue.len()
    }

    fn withdraw_all(&mut self) -> Vec<Request> {
        self.queue.drain(..).collect()
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
