//! A backend that stops answering must not stop the others. The live server's tenants
//! are files on file systems that can hang (a FUSE daemon, a network file system, a
//! failing disk) or slow to seconds per request; the device queue (`queue_depth`) is
//! shared, so a tenant whose requests never come back would hold every slot of it and
//! nobody else would be served. With [`Stall`] set (the live server sets it from
//! `server.backend_stall_ms`; the simulator's devices do not hang and leave it off):
//! * a tenant is **stalled** while its oldest request in flight has been there longer
//!   than `after`, and from a completion that took longer than that until one takes
//!   less than half of it (a backend at seconds a request stays stalled between its
//!   completions, instead of taking the whole queue again each time they return); a
//!   stalled tenant keeps at most an even share of `queue_depth` over
//!   the tenants with work (at least one slot): what the policy releases for it beyond
//!   that is **parked** in the host, in order, and sent once it is under its share
//!   again (parked requests count against its `queue_limit`, so its client feels
//!   back-pressure);
//! * a request in flight longer than `2 × after` **gives its slot back**: it no longer
//!   counts against `queue_depth` (it is still the tenant's, and still completes once),
//!   so requests that never return cannot hold the device queue.
//!
//! The share is even, not by weight: the host does not know the policy's weights, and a
//! stalled tenant's share only bounds how much of the queue it can take out of service.
//! No reading of a paper: an operational guard of the live server.

use crate::types::{Nanos, Request, TenantId};
use rustc_hash::FxHashSet;
use std::collections::VecDeque;

/// When a tenant counts as stalled (see the module).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stall {
    /// A tenant whose oldest request in flight is older than this is stalled; a request
    /// in flight twice this long gives its device slot back.
    pub after: Nanos,
}

/// The bookkeeping of [`Stall`], per tenant.
#[derive(Debug)]
pub(crate) struct Stalls {
    after: Nanos,
    /// Per tenant: its requests in flight (id, dispatched at), in dispatch order.
    outstanding: Vec<VecDeque<(u64, Nanos)>>,
    outstanding_total: usize,
    /// Per tenant: requests the policy released past the tenant's share while stalled.
    parked: Vec<VecDeque<Request>>,
    parked_total: usize,
    /// Requests in flight whose device slot was given back.
    released: FxHashSet<u64>,
    /// Per tenant: its last completion took longer than `after` (until one takes less
    /// than half of it).
    slow: Vec<bool>,
    /// The earliest time a request still holding its slot is due to give it back.
    next_release: Option<Nanos>,
}

impl Stalls {
    pub(crate) fn new(stall: Stall, tenants: usize) -> Stalls {
        assert!(
            stall.after > 0,
            "a stall threshold of 0 would stall everyone"
        );
        Stalls {
            after: stall.after,
            outstanding: vec![VecDeque::new(); tenants],
            outstanding_total: 0,
            parked: vec![VecDeque::new(); tenants],
            parked_total: 0,
            released: FxHashSet::default(),
            slow: vec![false; tenants],
            next_release: None,
        }
    }

    /// One more tenant (the last id), with nothing in flight.
    pub(crate) fn add(&mut self) {
        self.outstanding.push(VecDeque::new());
        self.parked.push(VecDeque::new());
        self.slow.push(false);
    }

    /// Whether `tenant`'s oldest request in flight is older than the threshold.
    pub(crate) fn stalled(&self, tenant: TenantId, now: Nanos) -> bool {
        self.slow[tenant as usize]
            || self.outstanding[tenant as usize]
                .front()
                .is_some_and(|&(_, at)| now.saturating_sub(at) > self.after)
    }

    /// `request` went to the device at `now`.
    pub(crate) fn dispatched(&mut self, request: &Request, now: Nanos) {
        self.outstanding[request.tenant as usize].push_back((request.id, now));
        self.outstanding_total += 1;
        let due = now + 2 * self.after;
        if self.next_release.is_none_or(|n| due < n) {
            self.next_release = Some(due);
        }
    }

    /// `id` of `tenant` completed at `now`; whether its slot had been given back already.
    pub(crate) fn completed(&mut self, tenant: TenantId, id: u64, now: Nanos) -> bool {
        let q = &mut self.outstanding[tenant as usize];
        let i = q
            .iter()
            .position(|&(r, _)| r == id)
            .unwrap_or_else(|| panic!("tenant {tenant}: request {id} completed but not in flight"));
        let (_, at) = q.remove(i).expect("found");
        let took = now.saturating_sub(at);
        if took > self.after {
            self.slow[tenant as usize] = true;
        } else if took < self.after / 2 {
            self.slow[tenant as usize] = false;
        }
        self.outstanding_total -= 1;
        if self.outstanding_total == 0 {
            self.next_release = None;
        }
        self.released.remove(&id)
    }

    /// Gives back the slots of requests in flight for `2 × after` by `now`; how many.
    pub(crate) fn release_overdue(&mut self, now: Nanos) -> u32 {
        if self.next_release.is_none_or(|n| now < n) {
            return 0;
        }
        let mut released = 0;
        let mut next: Option<Nanos> = None;
        for q in &self.outstanding {
            for &(id, at) in q {
                if self.released.contains(&id) {
                    continue;
                }
                let due = at + 2 * self.after;
                if due <= now {
                    self.released.insert(id);
                    released += 1;
                } else if next.is_none_or(|n| due < n) {
                    next = Some(due);
                }
            }
        }
        self.next_release = next;
        released
    }

    /// When a slot is next due to be given back.
    pub(crate) fn next_alarm(&self) -> Option<Nanos> {
        self.next_release
    }

    /// Parks a request of a stalled tenant.
    pub(crate) fn park(&mut self, request: Request) {
        self.parked[request.tenant as usize].push_back(request);
        self.parked_total += 1;
    }

    /// `tenant`'s first parked request.
    pub(crate) fn unpark(&mut self, tenant: TenantId) -> Option<Request> {
        let r = self.parked[tenant as usize].pop_front()?;
        self.parked_total -= 1;
        Some(r)
    }

    /// Every parked request (at the drain deadline).
    pub(crate) fn withdraw_parked(&mut self) -> Vec<Request> {
        self.parked_total = 0;
        self.parked.iter_mut().flat_map(|q| q.drain(..)).collect()
    }

    /// Parked requests of `tenant`.
    pub(crate) fn parked(&self, tenant: TenantId) -> usize {
        self.parked[tenant as usize].len()
    }

    /// Parked requests over all tenants.
    pub(crate) fn parked_total(&self) -> usize {
        self.parked_total
    }

    /// Requests in flight whose slot was given back.
    pub(crate) fn released(&self) -> u32 {
        self.released.len() as u32
    }

    /// Requests of `tenant` in flight, as tracked here.
    pub(crate) fn outstanding(&self, tenant: TenantId) -> usize {
        self.outstanding[tenant as usize].len()
    }
}
