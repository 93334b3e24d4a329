//! The one way a device model is driven, by the simulator and by the live engine's
//! emulated backend alike: submit a request, advance the model to a time (collecting
//! what finished), and ask when it must next be advanced. A model that decides later
//! (the disk that reorders its queue) names that time with `next_event`; the driver
//! remembers the time it handed out ([`Driver::arm`]) so that a driver with an event
//! queue schedules each time once, and a driver without one asks [`Driver::next_event`].

use super::{DeviceModel, Finished, Submitted};
use crate::types::{Nanos, Request};

/// A device model and the advance it asked for.
pub struct Driver {
    model: Box<dyn DeviceModel>,
    /// The time of the pending advance handed out by [`Driver::arm`].
    armed: Option<Nanos>,
}

impl Driver {
    /// Drives `model`.
    pub fn new(model: Box<dyn DeviceModel>) -> Self {
        Driver { model, armed: None }
    }

    /// The model.
    pub fn model(&self) -> &dyn DeviceModel {
        self.model.as_ref()
    }

    /// The model, to change.
    pub fn model_mut(&mut self) -> &mut dyn DeviceModel {
        self.model.as_mut()
    }

    /// The model back.
    pub fn into_model(self) -> Box<dyn DeviceModel> {
        self.model
    }

    /// Hands `request` to the model at `now`: its finish time when known now, or
    /// `Queued` (it comes out of a later [`Driver::advance`]).
    pub fn submit(&mut self, request: &Request, now: Nanos) -> Submitted {
        self.model.submit(request, now)
    }

    /// Advances the model to `now`; what finished by then is appended to `done`.
    pub fn advance(&mut self, now: Nanos, done: &mut Vec<Finished>) {
        if self.armed.is_some_and(|at| at <= now) {
            self.armed = None;
        }
        self.model.advance(now, done);
    }

    /// For a driver with an event queue: the time to schedule an advance at, when the
    /// model wants one earlier than the one already handed out (or that one passed);
    /// `None` when the pending one stands or the model wants none.
    #[must_use = "an advance not scheduled leaves the model's queue waiting"]
    pub fn arm(&mut self, now: Nanos) -> Option<Nanos> {
        let at = self.model.next_event()?.max(now);
        if self.armed.is_none_or(|a| at < a || a < now) {
            self.armed = Some(at);
            return Some(at);
        }
        None
    }

    /// For a driver without an event queue: when the model next wants to be advanced.
    pub fn next_event(&self) -> Option<Nanos> {
        self.model.next_event()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Op;

    fn disk() -> Driver {
        Driver::new(Box::new(super::super::hdd::HddDevice::new(
            super::super::hdd::preset("scsi-10k-73g").unwrap().params,
        )))
    }

    fn read(id: u64, offset: u64) -> Request {
        Request {
            id,
            tenant: 0,
            op: Op::Read,
            offset,
            len: 4096,
            arrival: 0,
            cost: 0,
        }
    }

    #[test]
    fn a_deferring_model_is_armed_once_and_advanced_to_its_finishes() {
        let mut d = disk();
        assert_eq!(d.submit(&read(1, 0), 0), Submitted::Queued);
        assert_eq!(d.submit(&read(2, 1 << 30), 0), Submitted::Queued);
        let at = d.arm(0).expect("the disk decides when it wants");
        assert_eq!(d.arm(0), None, "the pending advance stands");
        let mut done = Vec::new();
        let mut now = at;
        for _ in 0..10 {
            d.advance(now, &mut done);
            if done.len() == 2 {
                break;
            }
            now = d.arm(now).expect("a busy model wants another advance");
        }
        let mut ids: Vec<u64> = done.iter().map(|f| f.request.id).collect();
        ids.sort_unstable();
        assert_eq!(ids, vec![1, 2]);
        assert!(done.iter().all(|f| f.finish >= at));
    }
}
