//! `model`: a simulated Ceph-like cluster that several fronts share. Deterministic: its
//! only randomness is a seeded RNG for the network's jitter.
//!
//! * **OSDs**: `osds` object storage daemons, each its own device model (the
//!   [`FixedDevice`] timeline model: a latency, a bandwidth and `parallelism`
//!   requests served at once, the rest waiting in its FIFO — the OSD's queue depth).
//!   **Reading:** a timeline model answers a request's finish time when it is
//!   submitted, so the cluster needs no events of its own and a request's whole path is
//!   computed at dispatch; a deferring model (a disk reordering its queue) would need
//!   the simulator to drive each OSD and is not offered.
//! * **Placement (CRUSH-lite)**: an image is cut into 4 MiB objects, as RBD does; an
//!   object's primary OSD is a hash (SplitMix64) of (image, object number) modulo the
//!   OSDs, and its replicas the next `replication − 1` OSDs in order. **Reading:** CRUSH
//!   draws each replica by its own hash and weights OSDs; for equal OSDs the spread of
//!   load is the same, and the next-OSD rule keeps the replicas distinct.
//! * **Replication**: a read goes to the primary; a write goes to the primary, which
//!   writes it and sends it on to the replicas at once; it completes when the last copy
//!   is written and acknowledged back to the primary, which answers the client.
//! * **The network**: every hop takes `net` plus a seeded uniform jitter in
//!   `[0, jitter]`.
//!
//! Its cost model ([`ClusterModel::cost_model`]) is what the fronts' governors price
//! requests by: a read costs its OSD time over all the cluster's OSD slots (so one
//! device-second a second is the cluster's nominal capacity), a write `replication`
//! times that.

use crate::device::cost::{CostModel, OpCost};
use crate::device::fixed::{FixedDevice, FixedParams};
use crate::types::{Nanos, Op, Request};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The size of an object images are cut into, bytes (RBD's default).
pub const OBJECT_BYTES: u64 = 4 << 20;

/// The cluster's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClusterParams {
    /// OSDs.
    pub osds: usize,
    /// Copies of each object (1 ≤ replication ≤ osds).
    pub replication: usize,
    /// Each OSD's device.
    pub osd: FixedParams,
    /// One network hop, ns.
    pub net: Nanos,
    /// The most a hop adds to `net`, ns (uniform, seeded).
    pub jitter: Nanos,
    /// The jitter's seed.
    pub seed: u64,
}

/// A setting the cluster cannot have.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cluster: {0}")]
pub struct ClusterError(pub String);

/// The cluster (module docs).
#[derive(Debug, Clone)]
pub struct ClusterModel {
    params: ClusterParams,
    osds: Vec<FixedDevice>,
    rng: ChaCha8Rng,
    /// Requests each OSD served.
    served: Vec<u64>,
}

/// SplitMix64's finalizer: a well-mixed 64-bit hash.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl ClusterModel {
    /// A cluster of `params`, every OSD idle.
    pub fn new(params: ClusterParams) -> Result<ClusterModel, ClusterError> {
        if params.osds == 0 {
            return Err(ClusterError("at least one OSD".into()));
        }
        if params.replication == 0 || params.replication > params.osds {
            return Err(ClusterError(format!(
                "replication {} must be 1 to the {} OSDs",
                params.replication, params.osds
            )));
        }
        if params.osd.parallelism == 0
            || !(params.osd.latency_us >= 0.0 && params.osd.bandwidth_mb_s > 0.0)
        {
            return Err(ClusterError(format!("an OSD of {:?}", params.osd)));
        }
        Ok(ClusterModel {
            osds: (0..params.osds)
                .map(|_| FixedDevice::new(params.osd))
                .collect(),
            rng: ChaCha8Rng::seed_from_u64(params.seed),
            served: vec![0; params.osds],
            params,
        })
    }

    /// The OSDs holding `image`'s object at `offset`: the primary first.
    pub fn placement(&self, image: u64, offset: u64) -> Vec<usize> {
        let object = offset / OBJECT_BYTES;
        let primary = (mix(mix(image) ^ object) % self.params.osds as u64) as usize;
        (0..self.params.replication)
            .map(|k| (primary + k) % self.params.osds)
            .collect()
    }

    fn hop(&mut self) -> Nanos {
        let j = if self.params.jitter > 0 {
            self.rng.random_range(0..=self.params.jitter)
        } else {
            0
        };
        self.params.net + j
    }

    /// A front sends `request` on `image` at `now`: when its answer is back at the
    /// front.
    pub fn submit(&mut self, image: u64, request: &Request, now: Nanos) -> Nanos {
        let osds = self.placement(image, request.offset);
        let at_primary = now + self.hop();
        let primary = osds[0];
        self.served[primary] += 1;
        let mut done = self.osds[primary].serve(request, at_primary);
        if matches!(request.op, Op::Write) {
            for &r in &osds[1..] {
                let at = at_primary + self.hop();
                self.served[r] += 1;
                let written = self.osds[r].serve(request, at);
                done = done.max(written + self.hop());
            }
        }
        let back = done + self.hop();
        assert!(back > now, "an answer comes after its request");
        back
    }

    /// Requests each OSD served.
    pub fn served(&self) -> &[u64] {
        &self.served
    }

    /// What the fronts price requests by (module docs).
    pub fn cost_model(&self) -> CostModel {
        let p = &self.params;
        let slots = (p.osds as f64) * f64::from(p.osd.parallelism);
        let probe = FixedDevice::new(p.osd);
        let per_request = probe.service_time(0) as f64;
        let per_unit = probe.service_time(4096) as f64 - per_request;
        let read = OpCost {
            per_request_ns: per_request / slots,
            per_unit_ns: per_unit / slots,
            random_ns: 0.0,
            random_unit_ns: 0.0,
        };
        let r = p.replication as f64;
        CostModel {
            read,
            write: OpCost {
                per_request_ns: read.per_request_ns * r,
                per_unit_ns: read.per_unit_ns * r,
                ..read
            },
            unit: 4096,
            partial_write_ns: 0.0,
        }
    }

    /// Reads of `len` bytes a second the cluster serves at most (every OSD slot busy).
    pub fn read_iops(&self, len: u32) -> f64 {
        let p = &self.params;
        let each = FixedDevice::new(p.osd).service_time(len) as f64;
        p.osds as f64 * f64::from(p.osd.parallelism) * 1e9 / each
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(replication: usize) -> ClusterParams {
        ClusterParams {
            osds: 8,
            replication,
            osd: FixedParams {
                capacity_gib: 64.0,
                latency_us: 500.0,
                bandwidth_mb_s: 1000.0,
                parallelism: 4,
            },
            net: 50_000,
            jitter: 10_000,
            seed: 1,
        }
    }

    fn req(op: Op, offset: u64) -> Request {
        Request {
            id: 1,
            tenant: 0,
            op,
            offset,
            len: 4096,
            arrival: 0,
            cost: 0,
        }
    }

    #[test]
    fn placement_is_deterministic_spread_and_distinct() {
        let c = ClusterModel::new(params(3)).unwrap();
        let mut primaries = vec![0u32; 8];
        for image in 0..50 {
            for object in 0..40 {
                let p = c.placement(image, object * OBJECT_BYTES + 7);
                assert_eq!(p, c.placement(image, object * OBJECT_BYTES));
                let mut q = p.clone();
                q.sort_unstable();
                q.dedup();
                assert_eq!(q.len(), 3, "distinct OSDs: {p:?}");
                primaries[p[0]] += 1;
            }
        }
        // 2,000 objects over 8 OSDs: each within 20 % of 250.
        assert!(
            primaries.iter().all(|&n| (200..=300).contains(&n)),
            "{primaries:?}"
        );
    }

    #[test]
    fn a_write_waits_for_its_replicas_and_a_read_for_its_primary() {
        let mut c = ClusterModel::new(params(3)).unwrap();
        let service = FixedDevice::new(params(3).osd).service_time(4096);
        let read = c.submit(1, &req(Op::Read, 0), 0);
        assert!((2 * 50_000 + service..=2 * 60_000 + service).contains(&read));
        let write = c.submit(2, &req(Op::Write, 0), 0);
        assert!(write >= 4 * 50_000 + service, "two hops more: {write}");
        assert_eq!(c.served().iter().sum::<u64>(), 4);
        // Same seed, same answers.
        let mut d = ClusterModel::new(params(3)).unwrap();
        assert_eq!(d.submit(1, &req(Op::Read, 0), 0), read);
        assert!(
            ClusterModel::new(ClusterParams {
                replication: 9,
                ..params(3)
            })
            .is_err()
        );
        assert!(
            ClusterModel::new(ClusterParams {
                osds: 0,
                ..params(3)
            })
            .is_err()
        );
    }
}
