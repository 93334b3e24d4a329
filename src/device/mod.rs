//! Simulated devices: given a request and the time it is dispatched, a model answers
//! when the device finishes it. Models keep their own resource timelines (dies,
//! channels, links, heads), so the simulator needs no events inside the device.

pub mod fixed;
pub mod ftl;
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
}

/// Simulated timing of a device.
pub trait DeviceModel: Send {
    /// The device accepts `request` at `now`; returns when it completes (≥ `now`).
    fn submit(&mut self, request: &Request, now: Nanos) -> Nanos;
    /// Counters since creation or the last [`DeviceModel::reset_stats`].
    fn stats(&self) -> DeviceStats;
    /// Forgets counters (after preconditioning, before a measured run).
    fn reset_stats(&mut self);
    /// Logical capacity in bytes.
    fn capacity_bytes(&self) -> u64;
    /// An independent copy in the same state, for the next policy of a comparison.
    fn clone_box(&self) -> Box<dyn DeviceModel>;
}

/// Write amplification from host and relocated page counts.
pub fn write_amplification(host_pages: u64, moved_pages: u64) -> f64 {
    if host_pages == 0 {
        1.0
    } else {
        (host_pages + moved_pages) as f64 / host_pages as f64
    }
}
