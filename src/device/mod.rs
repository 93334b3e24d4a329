//! Simulated devices: given a request and the time it is dispatched, a model answers
//! when the device finishes it. Models keep their own resource timelines (dies,
//! channels, links, heads), so the simulator needs no events inside the device.

pub mod cost;
pub mod driver;
pub mod fitted;
pub mod fixed;
pub(crate) mod ftl;
pub mod hdd;
pub(crate) mod probe;
pub mod raid0;
pub mod spec;
pub mod ssd;

use crate::types::{Nanos, Request};
use serde::Serialize;

/// Device counters reported per run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct DeviceStats {
    /// Garbage-collection invocations (each may erase several blocks).
    pub gc_runs: u64,
    /// Valid pages relocated by GC.
    pub pages_moved: u64,
    /// (host pages + relocated pages) / host pages; 1.0 when nothing was written.
    pub write_amplification: f64,
    /// Time a head spent positioning and transferring since the measured span began
    /// ([`DeviceModel::measure_from`]), ns, summed over the heads and divided by their
    /// number (a disk, an array's members); `None` for a device whose
    /// busy time is not one head's (flash serves on many dies at once).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub busy_ns: Option<u64>,
}

/// What a model says when it accepts a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "the finish time, or that the model will say it later, must be acted on"]
pub enum Submitted {
    /// The finish time is known now (timeline models: SSD, fixed).
    Finishes(Nanos),
    /// The model decides the order later (a disk reordering its queue); the completion
    /// comes out of [`DeviceModel::advance`] at a time [`DeviceModel::next_event`] names.
    Queued,
}

/// A request a deferring model finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Finished {
    /// The request as it was submitted.
    pub request: Request,
    /// When it was submitted to the model.
    pub submitted: Nanos,
    /// When the device finished it.
    pub finish: Nanos,
    /// The time its heads spent on it, for a model that measures it (a disk: from
    /// choosing it to finishing it; an array: its members' parts, over the members),
    /// so that the requests' times add up to [`DeviceStats::busy_ns`].
    pub busy: Option<Nanos>,
}

/// Simulated timing of a device.
///
/// Timeline models answer every submission with its finish time. Models whose service
/// order depends on what arrives later (a disk choosing the shortest positioning time
/// among its queued commands) answer [`Submitted::Queued`] and are driven by the caller:
/// it calls [`DeviceModel::advance`] at the time [`DeviceModel::next_event`] asks for,
/// and before every submission, so the model always sees time move forward.
pub trait DeviceModel: Send {
    /// The device accepts `request` at `now`.
    fn submit(&mut self, request: &Request, now: Nanos) -> Submitted;
    /// The earliest time the model has something to report or decide; `None` when it
    /// holds no queued request.
    fn next_event(&self) -> Option<Nanos> {
        None
    }
    /// Moves the model to `now`; queued requests that finished by then are appended to
    /// `done` in finish order.
    fn advance(&mut self, _now: Nanos, _done: &mut Vec<Finished>) {}
    /// Counters since creation or the last [`DeviceModel::reset_stats`]. Models
    /// without an FTL move no pages: no GC, write amplification 1.
    fn stats(&self) -> DeviceStats {
        DeviceStats {
            write_amplification: 1.0,
            ..DeviceStats::default()
        }
    }
    /// The model's own invariants (an FTL's mapping tables and free lists); `Err` says
    /// what broke. May walk the whole model: the simulator's checker calls it now and
    /// then, not per request.
    fn check(&self) -> Result<(), String> {
        Ok(())
    }
    /// Forgets counters (after preconditioning, before a measured run).
    fn reset_stats(&mut self) {}
    /// Counts busy time ([`DeviceStats::busy_ns`]) only from `from` on (the end of a
    /// run's warm-up).
    fn measure_from(&mut self, _from: Nanos) {}
    /// Logical capacity in bytes.
    fn capacity_bytes(&self) -> u64;
    /// An independent copy in the same state, for the next policy of a comparison.
    fn clone_box(&self) -> Box<dyn DeviceModel>;
    /// A real device (not a model) whose completions come in wall time: the driver
    /// waits on it instead of jumping to its next event. `None` for every model.
    fn wall(&mut self) -> Option<&mut dyn Wall> {
        None
    }
}

/// A device that runs in wall time ([`crate::target::RingDevice`]): the driver asks it
/// the time and waits on it; completions then come out of [`DeviceModel::advance`] at
/// the times [`DeviceModel::next_event`] names, as a deferring model's do.
pub trait Wall {
    /// Nanoseconds since the device was opened.
    fn now(&self) -> Nanos;
    /// Returns when a completion is ready or the time is `until`, whichever is first.
    fn wait(&mut self, until: Nanos);
    /// Why the device cannot go on (an I/O error); the driver stops the run.
    fn failure(&self) -> Option<String>;
}

/// Write amplification from host and relocated page counts.
pub fn write_amplification(host_pages: u64, moved_pages: u64) -> f64 {
    if host_pages == 0 {
        1.0
    } else {
        (host_pages + moved_pages) as f64 / host_pages as f64
    }
}

/// Drives a deferring model until it has nothing left; every completion in order.
#[cfg(test)]
pub(crate) fn drain(model: &mut dyn DeviceModel) -> Vec<Finished> {
    let mut out = Vec::new();
    while let Some(t) = model.next_event() {
        model.advance(t, &mut out);
    }
    out
}
