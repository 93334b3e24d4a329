//! `fixed`: a device with constant per-request latency, a bandwidth, and a number of
//! requests it serves in parallel. Useful as a well-understood reference device and for
//! testing policies against a device whose speed is known exactly.

use super::{DeviceModel, Submitted};
use crate::types::{NANOS_PER_SEC, Nanos, Request};
use serde::{Deserialize, Serialize};

/// Parameters of the fixed model (all settable in a scenario's `[device]`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FixedParams {
    /// Logical capacity in GiB.
    #[serde(default = "default_capacity")]
    pub capacity_gib: f64,
    /// Service latency of every request, microseconds.
    #[serde(default = "default_latency")]
    pub latency_us: f64,
    /// Transfer bandwidth of one parallel unit, MB/s (10^6 bytes).
    #[serde(default = "default_bandwidth")]
    pub bandwidth_mb_s: f64,
    /// Requests served at the same time.
    #[serde(default = "default_parallelism")]
    pub parallelism: u32,
}

fn default_capacity() -> f64 {
    64.0
}
fn default_latency() -> f64 {
    100.0
}
fn default_bandwidth() -> f64 {
    500.0
}
fn default_parallelism() -> u32 {
    8
}

impl Default for FixedParams {
    fn default() -> Self {
        FixedParams {
            capacity_gib: default_capacity(),
            latency_us: default_latency(),
            bandwidth_mb_s: default_bandwidth(),
            parallelism: default_parallelism(),
        }
    }
}

/// The fixed model: each request takes the earliest free unit for
/// `latency + len / bandwidth`.
#[derive(Debug, Clone)]
pub struct FixedDevice {
    params: FixedParams,
    latency: Nanos,
    /// Nanoseconds per byte, scaled by 2^20 to keep integer arithmetic exact enough.
    ns_per_byte_q20: u64,
    units: Vec<Nanos>,
}

impl FixedDevice {
    /// A device with the given parameters, every unit idle.
    pub fn new(params: FixedParams) -> Self {
        let ns_per_byte = NANOS_PER_SEC as f64 / (params.bandwidth_mb_s * 1e6);
        FixedDevice {
            params,
            latency: (params.latency_us * 1000.0).round() as Nanos,
            ns_per_byte_q20: (ns_per_byte * (1u64 << 20) as f64).round() as u64,
            units: vec![0; params.parallelism.max(1) as usize],
        }
    }

    /// Accepts a request at `now` and answers when it finishes.
    pub fn serve(&mut self, request: &Request, now: Nanos) -> Nanos {
        let (idx, free_at) = self
            .units
            .iter()
            .copied()
            .enumerate()
            .min_by_key(|&(i, t)| (t, i))
            .expect("at least one unit");
        let finish = free_at.max(now) + self.service_time(request.len);
        self.units[idx] = finish;
        finish
    }

    /// Service time of one request of `len` bytes: at least 1 ns, so that a closed loop
    /// on a zero-latency, very fast unit still moves the clock.
    pub fn service_time(&self, len: u32) -> Nanos {
        (self.latency + ((len as u64 * self.ns_per_byte_q20) >> 20)).max(1)
    }
}

impl DeviceModel for FixedDevice {
    fn submit(&mut self, request: &Request, now: Nanos) -> Submitted {
        Submitted::Finishes(self.serve(request, now))
    }

    fn capacity_bytes(&self) -> u64 {
        (self.params.capacity_gib * (1u64 << 30) as f64) as u64
    }

    fn clone_box(&self) -> Box<dyn DeviceModel> {
        Box::new(self.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Op;

    fn req(len: u32) -> Request {
        Request {
            id: 0,
            tenant: 0,
            op: Op::Read,
            offset: 0,
            len,
            arrival: 0,
            cost: 0,
        }
    }

    #[test]
    fn serves_in_parallel_then_queues() {
        let mut d = FixedDevice::new(FixedParams {
            capacity_gib: 1.0,
            latency_us: 100.0,
            bandwidth_mb_s: 1000.0,
            parallelism: 2,
        });
        // 1 MB at 1000 MB/s = 1 ms, plus 100 µs latency. 10^6 bytes exactly.
        let t = d.service_time(1_000_000);
        assert!((1_099_999..=1_100_001).contains(&t), "{t}");
        let a = d.serve(&req(1_000_000), 0);
        let b = d.serve(&req(1_000_000), 0);
        let c = d.serve(&req(1_000_000), 0);
        assert_eq!(a, t);
        assert_eq!(b, t);
        assert_eq!(c, 2 * t);
    }
}
