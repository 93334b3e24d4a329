//! Turns on a seek-bound device: the tenant picked by weight keeps the device for a
//! quantum of real time, and is charged the time it held it. Wachs, Abd-El-Malek,
//! Thereska and Ganger, "Argon: Performance Insulation for Shared Storage Servers",
//! FAST 2007, §3.3 (disk time quanta: each workload gets the disk to itself for a
//! quantum long enough that the seek into its region is a small part of it); Valente
//! and Checconi's BFQ budgets and Linux CFQ's slices are the same idea in the kernel.
//!
//! Interleaved request by request, a 1 MiB stream and a writer in a small region of
//! the `hdd` model each paid a seek at every turn: beside a 60 IOPS reader with an SLO,
//! the writer got 0.41–0.48 of its slice of the disk alone under `none`, `sfq` and
//! `mclock`, whatever the shares said (docs/conformance.md, "SLO conformance").
//!
//! A turn: the first dispatch by weight while no turn is on starts one for that tenant;
//! while it lasts only that tenant is dispatched by weight; it closes when its
//! `quantum` has passed, or when the tenant has had nothing queued or in the device for
//! `anticipation` (its next request did not come: BFQ's and Argon's idling for a
//! dependent reader), and ends when the requests it sent in the turn have completed —
//! nobody else's go out by weight while they drain, so the next turn starts on an
//! empty device queue and the time is the tenant's alone.
//!
//! Readings chosen:
//! * **A turn is charged the real time it held the device**, from its first dispatch
//!   to its last completion, less the cost-model price of requests that went out
//!   during it outside the turn (reservations, the service floor). The cost model
//!   prices a request by its kind and size, not by where it lies: a writer in a 128 MiB
//!   region did 825 writes a second alone where the model prices 240. Charged by the
//!   model, a turn would give it no more than interleaving did; charged by the clock,
//!   it gets its share of the disk's time.
//! * The quantum is a bound on real time, so a tenant's turn ends with whatever it has
//!   in the device: at most one device queue of its requests past the quantum.
//! * Sans-I/O: the policy reports dispatches and completions with the time, and asks
//!   who may go by weight.

use crate::types::{Nanos, TenantId};
use rustc_hash::FxHashSet;

/// `quantum_ms` by default on a seek-bound device.
pub const DEFAULT_QUANTUM_MS: f64 = 100.0;

/// `quantum_idle_ms` by default: how long a turn waits for its tenant's next request.
pub const DEFAULT_QUANTUM_IDLE_MS: f64 = 4.0;

/// The shortest turn: below it (many tenants active) there are no turns, and the
/// device is shared request by request.
pub const MIN_TURN: Nanos = 20_000_000;

/// Who may be dispatched by weight now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// No turn is on: pick by weight, and the pick starts one.
    Free,
    /// Only this tenant, which has a request queued.
    Open(TenantId),
    /// Nobody by weight: the tenant in its turn may send again (until the given time
    /// at the latest), or its turn's requests are draining (until a completion).
    Hold(Option<Nanos>),
}

/// A turn that ended: its tenant and the device time to charge it, ns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a turn's time must be charged to its tenant"]
pub struct Charge {
    /// Whose turn it was.
    pub tenant: TenantId,
    /// Real time it held the device, less what went out outside it meanwhile, ns.
    pub device_ns: u64,
}

#[derive(Debug, Clone)]
struct Current {
    tenant: TenantId,
    started: Nanos,
    ends: Nanos,
    /// When its tenant last had something queued or in the device.
    busy_at: Nanos,
    /// No more dispatches: its requests drain.
    closing: bool,
    /// Price of the requests that completed outside the turn while it was on, ns.
    outside_ns: u64,
    /// When the anticipation ran out, for a turn closed by it: what it is charged to.
    idle_end: Option<Nanos>,
}

/// Turns on the device (module doc).
#[derive(Debug, Clone)]
pub struct Quanta {
    quantum: Nanos,
    anticipation: Nanos,
    /// A round of turns of every active tenant takes at most this long.
    round: Nanos,
    current: Option<Current>,
    /// Requests sent in the current turn and not completed.
    in_turn: FxHashSet<u64>,
    turns: u64,
}

impl Quanta {
    /// Turns of `quantum` ns at most, waiting `anticipation` ns for the tenant's next
    /// request, and short enough that one each of the active tenants fits in `round`
    /// ns (the service floor's wait: turns do not make it fire).
    pub fn new(quantum: Nanos, anticipation: Nanos, round: Nanos) -> Self {
        assert!(quantum > 0, "a turn lasts some time");
        Quanta {
            quantum,
            anticipation,
            round,
            current: None,
            in_turn: FxHashSet::default(),
            turns: 0,
        }
    }

    /// Who may go by weight at `now`; `queued(t)`: whether tenant `t` has a request
    /// waiting in the host. A turn that ends here is returned to be charged.
    pub fn poll(
        &mut self,
        now: Nanos,
        queued: impl Fn(TenantId) -> bool,
    ) -> (Turn, Option<Charge>) {
        let Some(c) = self.current.as_mut() else {
            return (Turn::Free, None);
        };
        if !c.closing {
            let has = queued(c.tenant);
            if has || !self.in_turn.is_empty() {
                c.busy_at = now;
            }
            if now >= c.ends {
                c.closing = true;
            } else if has {
                return (Turn::Open(c.tenant), None);
            } else if !self.in_turn.is_empty() {
                // Its requests are in the device: it sends the next as one completes.
                return (Turn::Hold(Some(c.ends)), None);
            } else if now < c.busy_at + self.anticipation {
                return (
                    Turn::Hold(Some((c.busy_at + self.anticipation).min(c.ends))),
                    None,
                );
            } else {
                c.closing = true;
                c.idle_end = Some(c.busy_at + self.anticipation);
            }
        }
        if self.in_turn.is_empty() {
            let charge = self.end(now);
            (Turn::Free, Some(charge))
        } else {
            (Turn::Hold(None), None)
        }
    }

    fn end(&mut self, now: Nanos) -> Charge {
        let c = self.current.take().expect("a turn to end");
        assert!(self.in_turn.is_empty(), "a turn ends once drained");
        let end = c.idle_end.map_or(now, |at| at.min(now));
        Charge {
            tenant: c.tenant,
            device_ns: (end - c.started).saturating_sub(c.outside_ns).max(1),
        }
    }

    /// How long a turn is with `active` tenants (requests waiting or on the device);
    /// `None` when that is under [`MIN_TURN`].
    pub fn length(&self, active: usize) -> Option<Nanos> {
        let length = self.quantum.min(self.round / active.max(1) as Nanos);
        (length >= MIN_TURN.min(self.quantum)).then_some(length)
    }

    /// Request `id` of `tenant` went out by weight at `now` (the tenant [`Turn::Open`]
    /// named, or any when [`Turn::Free`]: that starts its turn, unless with `active`
    /// tenants turns would be too short).
    pub fn dispatched(&mut self, tenant: TenantId, id: u64, now: Nanos, active: usize) {
        match &self.current {
            Some(c) => {
                assert!(
                    c.tenant == tenant && !c.closing,
                    "only the open turn's tenant goes by weight"
                );
            }
            None => {
                let Some(length) = self.length(active) else {
                    return;
                };
                self.turns += 1;
                self.current = Some(Current {
                    tenant,
                    started: now,
                    ends: now + length,
                    busy_at: now,
                    closing: false,
                    outside_ns: 0,
                    idle_end: None,
                });
            }
        }
        assert!(self.in_turn.insert(id), "request {id} sent twice in a turn");
    }

    /// Request `id` completed at `now`, having cost `cost` ns by the model; a turn
    /// that ends with it is returned to be charged.
    pub fn completed(&mut self, id: u64, cost: u64, now: Nanos) -> Option<Charge> {
        let c = self.current.as_mut()?;
        if self.in_turn.remove(&id) {
            c.busy_at = now;
            if c.closing && self.in_turn.is_empty() {
                return Some(self.end(now));
            }
        } else {
            c.outside_ns += cost;
        }
        None
    }

    /// Turns started so far.
    pub fn turns(&self) -> u64 {
        self.turns
    }

    /// Forgets the current turn (the host withdrew everything).
    pub fn clear(&mut self) {
        self.current = None;
        self.in_turn.clear();
    }

    /// Invariants: requests in a turn only while one is on, none beyond `in_flight`
    /// (the policy's count of requests in the device).
    pub fn check(&self, in_flight: u64) -> Result<(), String> {
        if self.current.is_none() && !self.in_turn.is_empty() {
            return Err(format!("{} requests in no turn", self.in_turn.len()));
        }
        if self.in_turn.len() as u64 > in_flight {
            return Err(format!(
                "{} requests in the turn, {in_flight} in flight",
                self.in_turn.len()
            ));
        }
        if let Some(c) = &self.current
            && (c.ends <= c.started || c.ends > c.started + self.quantum)
        {
            return Err(format!(
                "a turn from {} to {} is longer than {}",
                c.started, c.ends, self.quantum
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Nanos = 1_000_000;

    #[test]
    fn a_turn_holds_the_device_drains_and_is_charged_its_time() {
        let mut q = Quanta::new(100 * MS, 4 * MS, 500 * MS);
        assert_eq!(q.poll(0, |_| true), (Turn::Free, None));
        q.dispatched(2, 10, 0, 3);
        q.dispatched(2, 11, MS, 3);
        // Tenant 2 has more queued: only it goes.
        assert_eq!(q.poll(2 * MS, |t| t == 2), (Turn::Open(2), None));
        // Nothing queued but in the device: hold for it.
        assert_eq!(
            q.poll(3 * MS, |_| false),
            (Turn::Hold(Some(100 * MS)), None)
        );
        // A reservation's request of 5 ms completed meanwhile: not the turn's time.
        assert_eq!(q.completed(99, 5 * MS, 20 * MS), None);
        assert_eq!(q.completed(10, 1, 30 * MS), None);
        // The quantum passes with a request in the device: closing, draining.
        assert_eq!(q.poll(100 * MS, |_| true), (Turn::Hold(None), None));
        let charge = q.completed(11, 1, 110 * MS).expect("drained");
        assert_eq!(
            charge,
            Charge {
                tenant: 2,
                device_ns: 105 * MS
            }
        );
        assert_eq!(q.poll(110 * MS, |_| true), (Turn::Free, None));
        assert_eq!(q.turns(), 1);
        q.check(0).unwrap();
    }

    #[test]
    fn a_tenant_that_stops_sending_keeps_its_turn_only_for_the_anticipation() {
        let mut q = Quanta::new(100 * MS, 4 * MS, 500 * MS);
        q.dispatched(0, 1, 0, 3);
        assert_eq!(q.completed(1, 1, 3 * MS), None);
        // Waiting for its next request until 3 + 4 ms.
        assert_eq!(q.poll(5 * MS, |_| false), (Turn::Hold(Some(7 * MS)), None));
        // It sends again in time: its turn goes on.
        assert_eq!(q.poll(6 * MS, |t| t == 0), (Turn::Open(0), None));
        q.dispatched(0, 2, 6 * MS, 3);
        assert_eq!(q.completed(2, 1, 9 * MS), None);
        // Not in time: the turn ends, charged from its start to the end of the
        // anticipation (9 + 4 ms), not to when it was asked.
        let (turn, charge) = q.poll(15 * MS, |_| false);
        assert_eq!(turn, Turn::Free);
        assert_eq!(charge.map(|c| (c.tenant, c.device_ns)), Some((0, 13 * MS)));
    }

    #[test]
    fn turns_shorten_with_more_tenants_and_stop_under_the_shortest() {
        let mut q = Quanta::new(100 * MS, 4 * MS, 500 * MS);
        assert_eq!(q.length(1), Some(100 * MS));
        assert_eq!(q.length(8), Some(62_500_000));
        assert_eq!(q.length(25), Some(MIN_TURN));
        assert_eq!(q.length(26), None);
        // With 30 tenants active a dispatch starts no turn.
        q.dispatched(4, 1, 0, 30);
        assert_eq!(q.poll(MS, |_| true), (Turn::Free, None));
        assert_eq!(q.turns(), 0);
    }

    #[test]
    #[should_panic(expected = "only the open turn's tenant")]
    fn another_tenant_cannot_go_by_weight_in_a_turn() {
        let mut q = Quanta::new(100 * MS, 4 * MS, 500 * MS);
        q.dispatched(0, 1, 0, 3);
        q.dispatched(1, 2, MS, 3);
    }
}
