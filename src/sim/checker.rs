//! The simulator as a checker: after every event of a run, what must hold is asserted,
//! and a broken invariant stops the run with the time and what broke (TigerBeetle's way:
//! the simulator doubles as the test harness). On in debug builds, and in release when
//! [`super::RunOptions::check`] asks (the swarm test does).
//!
//! Checked:
//! * every request id is offered once, ids increase, and each request offered is then
//!   refused, or dispatched and completed, exactly once, in that order;
//! * a completion finishes no earlier than its dispatch, which is no earlier than its
//!   arrival, and carries the dispatch time the host saw;
//! * Σ held per tenant = the host's total = the policy's `queued()`; the requests the
//!   host counts held and in flight are exactly the ones this checker saw in those
//!   states; in flight ≤ `queue_depth`; held ≤ `queue_limit` per tenant
//!   ([`Host::check`]);
//! * the device model's own invariants (the FTL's mapping tables, free lists and valid
//!   counts) every [`DEVICE_CHECK_EVERY`] completions.

use crate::device::DeviceModel;
use crate::host::{Host, Observer, Status};
use crate::policy::Refusal;
use crate::types::{Completion, Nanos, Request};
use std::cell::Cell;
use std::collections::HashMap;

/// Completions between two checks of the device model (an FTL check walks every page).
pub const DEVICE_CHECK_EVERY: u64 = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Held,
    /// On the device since.
    InFlight(Nanos),
}

/// An observer that follows every request through its states, asserting each step, and
/// passes the events on to `inner`.
#[derive(Debug)]
pub struct Checker<O> {
    inner: O,
    states: HashMap<u64, State>,
    last_id: Option<u64>,
    held: usize,
    in_flight: u32,
    completed: u64,
    /// Completions counted when the device was last checked.
    device_checked_at: Cell<u64>,
}

impl<O: Observer> Checker<O> {
    /// Checks the events `inner` records.
    pub fn new(inner: O) -> Self {
        Checker {
            inner,
            states: HashMap::new(),
            last_id: None,
            held: 0,
            in_flight: 0,
            completed: 0,
            device_checked_at: Cell::new(0),
        }
    }

    /// The observer checked.
    pub fn finish(self) -> O {
        self.inner
    }

    fn take(&mut self, id: u64, what: &str) -> State {
        self.states
            .remove(&id)
            .unwrap_or_else(|| panic!("request {id} {what}, but it is not in the host"))
    }
}

impl<O: Observer> Observer for Checker<O> {
    fn arrived(&mut self, request: &Request) {
        assert!(
            self.last_id.is_none_or(|last| request.id > last),
            "request {} offered after request {:?}: ids must increase",
            request.id,
            self.last_id
        );
        self.last_id = Some(request.id);
        self.states.insert(request.id, State::Held);
        self.held += 1;
        self.inner.arrived(request);
    }

    fn refused(&mut self, request: &Request, reason: Refusal, now: Nanos) {
        let state = self.take(request.id, "refused");
        assert_eq!(
            state,
            State::Held,
            "request {} refused ({reason:?}) while on the device",
            request.id
        );
        assert!(
            now >= request.arrival,
            "request {} refused before it arrived",
            request.id
        );
        self.held -= 1;
        self.inner.refused(request, reason, now);
    }

    fn dispatched(&mut self, request: &Request, now: Nanos) {
        let state = self.take(request.id, "dispatched");
        assert_eq!(
            state,
            State::Held,
            "request {} dispatched twice",
            request.id
        );
        assert!(
            now >= request.arrival,
            "request {} dispatched before it arrived",
            request.id
        );
        self.states.insert(request.id, State::InFlight(now));
        self.held -= 1;
        self.in_flight += 1;
        self.inner.dispatched(request, now);
    }

    fn completed(&mut self, completion: &Completion, status: Status) {
        let id = completion.request.id;
        match self.take(id, "completed") {
            State::InFlight(start) => assert_eq!(
                start, completion.start,
                "request {id} completed with another dispatch time than it was dispatched at"
            ),
            State::Held => panic!("request {id} completed without being dispatched"),
        }
        assert!(
            completion.finish >= completion.start,
            "request {id} finished before it was dispatched"
        );
        self.in_flight -= 1;
        self.completed += 1;
        self.inner.completed(completion, status);
    }

    fn measured(&mut self, request: &Request, device_ns: Nanos) {
        assert!(
            matches!(self.states.get(&request.id), Some(State::InFlight(_))),
            "request {} measured while not on the device",
            request.id
        );
        self.inner.measured(request, device_ns);
    }
}

/// Checks a run between two events (see the module docs); panics with what broke.
pub fn check_run<O: Observer>(host: &Host<Checker<O>>, device: &dyn DeviceModel, now: Nanos) {
    let fail = |what: String| panic!("invariant broken at t = {now} ns: {what}");
    if let Err(e) = host.check() {
        fail(e);
    }
    let c = host.observer();
    if c.held != host.queued() {
        fail(format!(
            "the host holds {} requests, the checker saw {} held",
            host.queued(),
            c.held
        ));
    }
    if c.in_flight != host.in_flight() {
        fail(format!(
            "the host has {} in flight, the checker saw {}",
            host.in_flight(),
            c.in_flight
        ));
    }
    if c.completed >= c.device_checked_at.get() + DEVICE_CHECK_EVERY {
        c.device_checked_at.set(c.completed);
        if let Err(e) = device.check() {
            fail(format!("device model: {e}"));
        }
    }
}
