//! What a request costs the device, for the policies that share the device rather than
//! bytes. Byte-fair sharing is wrong when bytes cost the device differently: a 512 B
//! write costs an SSD a whole 4 KiB page program, so beside 4 MiB writers the byte-fair
//! policies gave the small writer a third of the bytes, at hundreds of page programs
//! each, and the device ran at 0.21–0.39× of what it does unscheduled (the conformance
//! suite's "512 B, 4 KiB and 4 MiB requests").
//!
//! **Reading** — a linear model, the shape Linux's blk-iocost uses: per operation (read,
//! write) a fixed part per request, a part per *unit* of data (the device's smallest
//! transfer: a 4 KiB page on an SSD, so sub-page requests cost a page, and a write that
//! covers a page only in part also costs reading it, as the SSD model's read-modify-write
//! does; the model charges that read whether or not the page holds data yet, which only
//! the FTL knows), and for disks an
//! extra part for a request that does not continue where the tenant's last one ended
//! (a seek). Costs are in nanoseconds of device time at full load: what one more such
//! request takes away from everyone else. The defaults come from the device's preset
//! ([`crate::device::spec::DeviceSpec::cost_model`]): for an SSD, the command overhead
//! per request and, per page, the slowest of the flash dies (all working at once), the
//! channels and the host link; a write page on an aged drive is charged for the
//! garbage collection greedy GC does at its fill (write amplification
//! `1 / (1 − u)` pages programmed per page written, `u` the occupancy of a victim block,
//! taken as the logical fill). It is a model, not a measurement: calibrating it from
//! the device is the work of the calibration issue.

use crate::types::{Nanos, Op, Request, TenantId};

/// The cost of one kind of operation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OpCost {
    /// Per request, ns.
    pub per_request_ns: f64,
    /// Per unit of data (rounded up), ns.
    pub per_unit_ns: f64,
    /// Extra for a request that does not start where the tenant's last one ended, ns
    /// (a seek; negative on a device where such a request costs less than one that
    /// continues a stream).
    pub random_ns: f64,
    /// Extra per unit for such a request, ns: a device that moves data in place at
    /// another rate than in a stream (the NVMe preset's random reads of 16 KiB and
    /// more run at a third of its sequential rate).
    pub random_unit_ns: f64,
}

/// A linear cost model (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostModel {
    /// Reads.
    pub read: OpCost,
    /// Writes, trims and flushes (a trim or flush costs the per-request part).
    pub write: OpCost,
    /// The unit data is charged in, bytes (≥ 1).
    pub unit: u32,
    /// Extra for each unit a write covers only in part, ns: an SSD reads the page
    /// before it programs the merged one (read-modify-write).
    pub partial_write_ns: f64,
}

impl CostModel {
    /// Whether the device is bound by seeks: a random 4 KiB read costs it four times or
    /// more what one in a stream does (a disk, an array of disks).
    pub fn seeks(&self) -> bool {
        self.cost(Op::Read, 0, 4096, true) >= 4.0 * self.cost(Op::Read, 0, 4096, false).max(1.0)
    }

    /// The cost of `op` of `len` bytes at `offset`; `random`: it did not continue the
    /// tenant's last. A block status ([`Op::Status`]) costs what a random read of one
    /// unit does, whatever its range: the file system reads its extent map where it
    /// lies (the walk a status makes is bounded: [`crate::io::extents::MAX_WALK`]).
    pub fn cost(&self, op: Op, offset: u64, len: u32, random: bool) -> f64 {
        if op == Op::Status {
            return self.cost(Op::Read, 0, self.unit.max(1), true);
        }
        let c = match op {
            Op::Read | Op::Status => &self.read,
            Op::Write | Op::Trim | Op::Flush => &self.write,
        };
        let unit = u64::from(self.unit.max(1));
        let end = offset + u64::from(len.max(1));
        let (units, partial) = match op {
            Op::Read | Op::Write | Op::Status => {
                let units = end.div_ceil(unit) - offset / unit;
                let head = !offset.is_multiple_of(unit);
                let tail = !end.is_multiple_of(unit);
                let partial = match op {
                    Op::Write if units == 1 => u64::from(head || tail),
                    Op::Write => u64::from(head) + u64::from(tail),
                    _ => 0,
                };
                (units, partial)
            }
            Op::Trim | Op::Flush => (0, 0),
        };
        let ns = c.per_request_ns
            + c.per_unit_ns * units as f64
            + self.partial_write_ns * partial as f64
            + if random {
                c.random_ns + c.random_unit_ns * units as f64
            } else {
                0.0
            };
        ns.max(0.0)
    }
}

/// Whether each tenant's requests continue where its last one ended.
#[derive(Debug, Clone, Default)]
pub struct Sequence {
    next: Vec<Option<u64>>,
}

impl Sequence {
    /// For `tenants` tenants.
    pub fn new(tenants: usize) -> Self {
        Sequence {
            next: vec![None; tenants],
        }
    }

    /// Makes room for `tenant` (a device model learns its tenants as they come).
    pub fn cover(&mut self, tenant: TenantId) {
        if self.next.len() <= tenant as usize {
            self.next.resize(tenant as usize + 1, None);
        }
    }

    /// Whether a request of `tenant` at `offset` is random (does not continue its
    /// last), and remembers where it ends.
    pub fn random(&mut self, tenant: TenantId, offset: u64, len: u32) -> bool {
        let slot = &mut self.next[tenant as usize];
        let random = *slot != Some(offset);
        *slot = Some(offset + u64::from(len));
        random
    }
}

/// What one request costs the device, for the host to stamp on every request it admits
/// ([`crate::types::Request::cost`]): the device's cost model, and where each tenant's
/// last request ended (a request that does not continue it is random). Requests are
/// priced once, in the order the host admits them, so the policy that charges a request
/// and the recorder that counts its device time read the same number.
#[derive(Debug, Clone)]
pub struct Pricer {
    model: CostModel,
    sequence: Sequence,
}

impl Pricer {
    /// Prices requests of `tenants` tenants by `model`.
    pub fn new(model: CostModel, tenants: usize) -> Self {
        Pricer {
            model,
            sequence: Sequence::new(tenants),
        }
    }

    /// The device time `request` costs, ns (at least 1: nothing the device does is
    /// free); remembers where the tenant's request ends. Call once per request, in the
    /// order the tenant's requests arrive.
    pub fn price(&mut self, request: &Request) -> Nanos {
        if request.op == Op::Status {
            // Moves no data: the tenant's stream goes on where its data left it.
            let ns = self
                .model
                .cost(Op::Status, request.offset, request.len, true);
            return (ns.round() as Nanos).max(1);
        }
        self.sequence.cover(request.tenant);
        let random = self
            .sequence
            .random(request.tenant, request.offset, request.len);
        let ns = self
            .model
            .cost(request.op, request.offset, request.len, random);
        (ns.round() as Nanos).max(1)
    }

    /// The model requests are priced by.
    pub fn model(&self) -> &CostModel {
        &self.model
    }
}

/// What a policy shares between tenants by weight: device time (the house currency,
/// each request's [`crate::types::Request::cost`]), bytes (the papers' literal
/// readings), or requests (mClock's tags, the token buckets).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Currency {
    /// Device time by the device's cost model, ns.
    #[default]
    DeviceTime,
    /// The request's length in bytes (at least 1).
    Bytes,
    /// One per request.
    Requests,
}

impl Currency {
    /// What `request` costs in this currency.
    #[inline]
    pub fn price(self, request: &Request) -> u64 {
        match self {
            Currency::DeviceTime => request.cost.max(1),
            Currency::Bytes => u64::from(request.len.max(1)),
            Currency::Requests => 1,
        }
    }

    /// The name a configuration uses for it (`cost = "device"`, `"bytes"`,
    /// `"requests"`).
    pub fn name(self) -> &'static str {
        match self {
            Currency::DeviceTime => "device",
            Currency::Bytes => "bytes",
            Currency::Requests => "requests",
        }
    }

    /// Reads a configuration's name for it.
    pub fn parse(text: &str) -> Option<Currency> {
        match text {
            "device" => Some(Currency::DeviceTime),
            "bytes" => Some(Currency::Bytes),
            "requests" => Some(Currency::Requests),
            _ => None,
        }
    }
}

impl CostModel {
    /// The model a live server charges by when it has no calibrated one
    /// (`backend.cost_device`) and no emulated device: Linux blk-iocost's default
    /// linear model for solid-state drives (its `autop` parameters: 488.6 MB/s,
    /// 8,932 sequential and 8,518 random read IOPS; 427.9 MB/s, 28,755 and 21,940 write
    /// IOPS), turned into this model's terms: per 4 KiB unit the transfer time, per
    /// request the rest of a sequential request's time, and the random request's extra.
    /// It says that a request costs about a hundred microseconds whatever its size and
    /// that large transfers cost their bytes: right in shape for any flash drive,
    /// exact for none, which is why the server says so when it charges by it.
    pub fn generic_ssd() -> CostModel {
        fn op(bytes_per_s: f64, seq_iops: f64, rand_iops: f64) -> OpCost {
            let unit = 4096.0 / bytes_per_s * 1e9;
            OpCost {
                per_request_ns: 1e9 / seq_iops - unit,
                per_unit_ns: unit,
                random_ns: 1e9 / rand_iops - 1e9 / seq_iops,
                random_unit_ns: 0.0,
            }
        }
        CostModel {
            read: op(488_636_629.0, 8_932.0, 8_518.0),
            write: op(427_891_549.0, 28_755.0, 21_940.0),
            unit: 4096,
            partial_write_ns: 0.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sub_page_requests_cost_a_page_and_seeks_cost_extra() {
        let m = CostModel {
            read: OpCost {
                per_request_ns: 10.0,
                per_unit_ns: 5.0,
                random_ns: 0.0,
                random_unit_ns: 0.0,
            },
            write: OpCost {
                per_request_ns: 10.0,
                per_unit_ns: 8.0,
                random_ns: 100.0,
                random_unit_ns: 0.0,
            },
            unit: 4096,
            partial_write_ns: 3.0,
        };
        // A sub-page write costs a page, and the read that merges it.
        assert_eq!(m.cost(Op::Write, 0, 512, false), 18.0 + 3.0);
        assert_eq!(m.cost(Op::Write, 0, 4096, false), 18.0);
        // 4097 B from 0: two pages, the second written in part.
        assert_eq!(m.cost(Op::Write, 0, 4097, true), 10.0 + 16.0 + 3.0 + 100.0);
        // 4 KiB at 2 KiB: two pages, both in part.
        assert_eq!(m.cost(Op::Write, 2048, 4096, false), 10.0 + 16.0 + 6.0);
        // Reads merge nothing; an unaligned read still touches every page it spans.
        assert_eq!(m.cost(Op::Read, 0, 8192, true), 20.0);
        assert_eq!(m.cost(Op::Read, 512, 4096, true), 20.0);
        assert_eq!(m.cost(Op::Flush, 0, 0, true), 110.0);
        // A block status costs a random read of one unit, whatever its range.
        assert_eq!(
            m.cost(Op::Status, 0, 1 << 30, false),
            m.cost(Op::Read, 4096, m.unit, true)
        );
        let mut s = Sequence::new(2);
        assert!(s.random(0, 0, 4096));
        assert!(!s.random(0, 4096, 4096));
        assert!(s.random(1, 8192, 512));
        assert!(s.random(0, 0, 512));
    }
}
