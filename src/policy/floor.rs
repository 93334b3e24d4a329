//! The service floor: a backlogged tenant is served at least once every `max_wait`
//! (default 0.5 s), whatever its weight — a reservation of two requests a second for
//! every tenant, in mClock's manner (Gulati, Merchant, Varman, OSDI 2010: a request
//! dispatched for a reservation does not advance the tenant's proportional-share tag).
//!
//! Exact proportional share starves light tenants in large populations for seconds at a
//! time: beside 1,023 others with weights 1–1000 (Σw ≈ 512,000), a weight-1 tenant's
//! share of an SSD serving 100,000 requests a second is one request every five seconds,
//! and under CFQ-style rounds it waited far longer (measured: docs/readings.md,
//! `floor.rs`). The floor bounds the wait; the share it costs the others is at most one
//! request per backlogged tenant per `max_wait`.
//!
//! **Reading: half a second.** What is promised is that no backlogged tenant goes a
//! whole second without a completion. A floor of one dispatch a second leaves gaps of a
//! second plus the request's time in the device; half a second keeps every gap under a
//! second, at some cost in per-second share error (measured: docs/readings.md,
//! `floor.rs`).
//!
//! **Reading: what a floor dispatch charges.** Nothing: the policy does not advance the
//! tenant's tags or take its credits (the reservation reading), so a tenant served by
//! the floor keeps its place by weight; otherwise a light tenant's tags would run further
//! ahead with every floor service, and the floor would become its only service.
//!
//! **Reading: the floor is itself bounded, in the policy's currency.** When one request
//! per backlogged tenant per `max_wait` is more than the device serves (1,024 tenants on
//! a disk completing 200 requests a second), floor dispatches would take the whole
//! device and the weights nothing. So the floor spends at most one [`FLOOR_EVERY`]th of
//! what the policy dispatches, counted as the policy counts (device time by default):
//! each dispatch by weight earns it an eighth of its cost, each floor dispatch spends
//! its own. A first reading counted dispatches (one in eight): where the floor's
//! requests were the expensive ones, its eighth of the dispatches took far more than an
//! eighth of the device's time, and the heaviest tenants lost most of their shares
//! (measured: docs/readings.md, `floor.rs`). Past the bound the wait stretches to what
//! that eighth of the device serves — stated as: a backlogged tenant waits at most
//! `max(max_wait, FLOOR_EVERY × Σ backlogged tenants' request cost / device work
//! rate)`.
//!
//! Sans-I/O and O(log n) per event: a heap of (due time, tenant) with at most one entry
//! per tenant, each a lower bound on its tenant's due time, put back at the real one
//! when it surfaces early.

use crate::types::{Nanos, TenantId};
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// The floor spends at most one this-many-th of what the policy dispatches.
pub const FLOOR_EVERY: u32 = 8;

/// `max_wait_ms` by default.
pub const DEFAULT_MAX_WAIT_MS: f64 = 500.0;

/// Who is due for a floor dispatch (module doc).
#[derive(Debug, Clone)]
pub struct Floor {
    /// `None`: the floor is off.
    max_wait: Option<Nanos>,
    /// Per tenant: since when it has waited (backlogged and not served); `None` while
    /// its queue is empty.
    waiting_since: Vec<Option<Nanos>>,
    /// (due, tenant), at most one entry per tenant (module doc).
    due: BinaryHeap<Reverse<(Nanos, TenantId)>>,
    /// Whether the tenant has its entry in `due`.
    in_heap: Vec<bool>,
    /// What the floor may spend (an eighth of what was dispatched by weight, less what
    /// it spent), capped at [`FLOOR_EVERY`] mean requests.
    credit: f64,
    /// Moving mean of a dispatch's cost (α = 1/64).
    mean_cost: f64,
    /// Floor dispatches so far.
    served: u64,
}

impl Floor {
    /// One more tenant, not waiting (the last id).
    pub fn add(&mut self) {
        self.waiting_since.push(None);
        self.in_heap.push(false);
    }

    /// The longest wait it allows, ns (`None`: the floor is off).
    pub fn max_wait(&self) -> Option<Nanos> {
        self.max_wait
    }

    /// A floor of one dispatch every `max_wait` (`None`: off) for `tenants` tenants.
    pub fn new(tenants: usize, max_wait: Option<Nanos>) -> Self {
        Floor {
            max_wait: max_wait.map(|w| w.max(1)),
            waiting_since: vec![None; tenants],
            due: BinaryHeap::new(),
            in_heap: vec![false; tenants],
            credit: 0.0,
            mean_cost: 0.0,
            served: 0,
        }
    }

    /// Reads `max_wait_ms` (default [`DEFAULT_MAX_WAIT_MS`]; 0 turns the floor off).
    pub fn from_params(
        params: &mut super::PolicyParams,
        tenants: usize,
    ) -> Result<Self, super::PolicyError> {
        let ms = params.f64_or("max_wait_ms", DEFAULT_MAX_WAIT_MS)?;
        if ms > 3_600_000.0 {
            return Err(params.invalid(
                "max_wait_ms",
                format!("must be at most an hour (3600000), got {ms}"),
            ));
        }
        Ok(Floor::new(
            tenants,
            (ms > 0.0).then(|| crate::types::secs_to_nanos(ms / 1e3)),
        ))
    }

    /// `tenant`'s queue went from empty to non-empty at `now`.
    #[inline]
    pub fn backlogged(&mut self, tenant: TenantId, now: Nanos) {
        let Some(wait) = self.max_wait else { return };
        let t = tenant as usize;
        if self.waiting_since[t].is_none() {
            self.waiting_since[t] = Some(now);
            if !self.in_heap[t] {
                self.in_heap[t] = true;
                self.due.push(Reverse((now.saturating_add(wait), tenant)));
            }
        }
    }

    /// A request of `tenant` costing `cost` (in the policy's currency) went to the
    /// device at `now` by weight; `still_backlogged`: it has more waiting.
    #[inline]
    pub fn served(&mut self, tenant: TenantId, now: Nanos, still_backlogged: bool, cost: f64) {
        if self.max_wait.is_none() {
            return;
        }
        self.mean_cost += (cost - self.mean_cost) / 64.0;
        let cap = f64::from(FLOOR_EVERY) * self.mean_cost;
        self.credit = (self.credit + cost / f64::from(FLOOR_EVERY)).min(cap);
        self.waiting_since[tenant as usize] = still_backlogged.then_some(now);
    }

    /// A request of `tenant` went to the device at `now` outside the weights and the
    /// floor (mClock's reservations): its wait starts again, and the floor earns
    /// nothing from it.
    pub fn served_outside(&mut self, tenant: TenantId, now: Nanos, still_backlogged: bool) {
        if self.max_wait.is_some() {
            self.waiting_since[tenant as usize] = still_backlogged.then_some(now);
        }
    }

    /// `tenant`, backlogged, may not be served before `from` (a limit holds it): its
    /// wait counts from then.
    pub fn postpone(&mut self, tenant: TenantId, from: Nanos) {
        if let Some(since) = self.waiting_since[tenant as usize].as_mut() {
            *since = (*since).max(from);
        }
    }

    /// Forgets every waiting tenant (the policy withdrew everything).
    pub fn clear(&mut self) {
        self.waiting_since.iter_mut().for_each(|w| *w = None);
        self.in_heap.iter_mut().for_each(|h| *h = false);
        self.due.clear();
    }

    /// The earliest live entry, putting back entries that surfaced early and dropping
    /// those of tenants no longer waiting.
    fn earliest(&mut self) -> Option<(Nanos, TenantId)> {
        let wait = self.max_wait?;
        while let Some(&Reverse((at, t))) = self.due.peek() {
            match self.waiting_since[t as usize] {
                Some(s) if s.saturating_add(wait) == at => return Some((at, t)),
                Some(s) => {
                    // Served since the entry was made: it is due later.
                    self.due.pop();
                    self.due.push(Reverse((s.saturating_add(wait), t)));
                }
                None => {
                    self.due.pop();
                    self.in_heap[t as usize] = false;
                }
            }
        }
        None
    }

    /// The tenant to serve by the floor now, if one is due and the floor's share
    /// allows it; the caller dispatches its head and calls [`Floor::took`].
    #[inline]
    pub fn due(&mut self, now: Nanos) -> Option<TenantId> {
        if self.max_wait.is_none() || self.credit <= 0.0 {
            return None;
        }
        self.earliest().filter(|&(at, _)| at <= now).map(|(_, t)| t)
    }

    /// The tenant [`Floor::due`] named was served by the floor at `now`, a request
    /// costing `cost`.
    pub fn took(&mut self, tenant: TenantId, now: Nanos, still_backlogged: bool, cost: f64) {
        self.waiting_since[tenant as usize] = still_backlogged.then_some(now);
        self.credit -= cost;
        self.served += 1;
    }

    /// When the next tenant comes due (for a policy that would otherwise wait).
    pub fn next_due(&mut self) -> Option<Nanos> {
        self.earliest().map(|(at, _)| at)
    }

    /// Floor dispatches so far.
    pub fn dispatches(&self) -> u64 {
        self.served
    }

    /// Every waiting tenant has one entry in the heap, no later than its due time;
    /// `backlogged(t)` says which tenants have requests queued.
    pub fn check(&self, backlogged: impl Fn(TenantId) -> bool) -> Result<(), String> {
        let Some(wait) = self.max_wait else {
            return Ok(());
        };
        // The lowest entry of each tenant, and how many it has.
        let mut entries: Vec<(u32, Nanos)> = vec![(0, Nanos::MAX); self.waiting_since.len()];
        for Reverse((at, t)) in &self.due {
            let e = &mut entries[*t as usize];
            e.0 += 1;
            e.1 = e.1.min(*at);
        }
        for (t, since) in self.waiting_since.iter().enumerate() {
            let (count, lowest) = entries[t];
            let t = t as TenantId;
            if since.is_some() != backlogged(t) {
                return Err(format!(
                    "floor: tenant {t} waiting = {}, backlogged = {}",
                    since.is_some(),
                    backlogged(t)
                ));
            }
            if count > 1 || (count == 1) != self.in_heap[t as usize] {
                return Err(format!("floor: tenant {t} has {count} heap entries"));
            }
            if let Some(s) = since {
                let at = s.saturating_add(wait);
                if count == 0 || lowest > at {
                    return Err(format!(
                        "floor: tenant {t} is due at {at} but its entry says {lowest}"
                    ));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Nanos = 1_000_000_000;

    #[test]
    fn a_tenant_waiting_a_second_is_due_once_the_floor_has_credit() {
        let mut f = Floor::new(2, Some(S));
        f.backlogged(0, 0);
        f.backlogged(1, 10);
        // No credit before anything was dispatched by weight.
        assert_eq!(f.due(S), None);
        f.served(1, 5, true, 80.0);
        assert_eq!(f.due(S - 1), None);
        assert_eq!(f.due(S), Some(0));
        // A request of 20 spends the 10 earned (an eighth of 80) and more.
        f.took(0, S, true, 20.0);
        assert_eq!(f.due(S + 20), None);
        // Eight more of 10 by weight earn it back (10 in all; -10 + 10 is not above 0).
        for _ in 0..8 {
            f.served(1, S + 5, true, 10.0);
        }
        assert_eq!(f.due(2 * S), None, "no credit yet");
        f.served(1, S + 6, true, 10.0);
        // Tenant 1 was served by weight (due a second after that); tenant 0 at 2 s.
        assert_eq!(f.due(2 * S), Some(0));
        // The credit is capped at FLOOR_EVERY mean requests.
        let mut g = Floor::new(1, Some(S));
        for _ in 0..10_000 {
            g.served(0, 0, false, 8.0);
        }
        assert!(g.credit <= 64.0 + 1e-9, "{}", g.credit);
        assert_eq!(f.next_due(), Some(2 * S));
        f.check(|_| true).unwrap();
    }

    #[test]
    fn an_empty_queue_is_never_due() {
        let mut f = Floor::new(1, Some(S));
        f.backlogged(0, 0);
        f.served(0, 5, false, 1.0);
        assert_eq!(f.due(10 * S), None);
        assert_eq!(f.next_due(), None);
        f.check(|_| false).unwrap();
        let mut off = Floor::new(1, None);
        off.backlogged(0, 0);
        assert_eq!(off.due(10 * S), None);
    }
}
