//! `fitted`: the device `ioshare calibrate` measures and writes — a few numbers any
//! block device has, each one a measurement, rather than the inside of a drive.
//!
//! The model has two resources a request needs, and it finishes when both are done:
//! * **units**: `units` requests are served at once; one holds a unit for its
//!   latency at queue depth 1: `{op}_latency_us` + `{op}_random_us` when it does not
//!   continue its tenant's last request + `len / {op}_transfer_mb_s`. This is what one
//!   synchronous process sees (the QD1 curve per size);
//! * **the media**: a clock per direction, each request advancing its own by its cost
//!   in the linear [`CostModel`] the policies charge by (`{op}_request_us` +
//!   `len / {op}_media_mb_s` in 4 KiB units + the random part): what a deep queue of
//!   such requests gets (1 / IOPS per size at queue depth 32). The directions meet
//!   twice: a read waits for `writes_delay_reads` of the write work queued ahead of it
//!   (the write clock past now, the cache's backlog among it: on flash, the programs
//!   queued on its die; a drive that suspends programs for reads waits less), and a
//!   read advances the write clock by `reads_delay_writes` × its cost (what it takes
//!   from writes' throughput: all of it on one disk arm or a half-duplex link, little
//!   on flash, where a page read is short beside a program). The cost model a policy
//!   uses is the device's own.
//!
//! A write-back cache of `write_cache_mib` lets writes finish ahead of the media by
//! what it holds (the media time of that many 1 MiB writes); a flush waits for the
//! media. Readings chosen: the media clock is a *virtual* clock (a request never waits
//! behind one reserved for a later-arriving request); a write's media time counts
//! from its arrival, so a long burst is acknowledged at the cache's pace until the
//! backlog passes the cache, then at the media's — the burst the calibration measures.
//! Sub-4 KiB requests cost a whole unit on the media, as the SSD model's pages do.
//! Nothing here ages: a drive whose speed depends on its fill is fitted in the state
//! it was measured in.

use super::{DeviceModel, Submitted};
use crate::device::cost::{CostModel, OpCost, Sequence};
use crate::types::{Nanos, Op, Request};
use serde::{Deserialize, Serialize};

/// The media's unit of cost, bytes (a 4 KiB page or block).
pub const UNIT_BYTES: u32 = 4096;

/// How far back the media's write use counts for read collisions, ns (a decaying
/// window).
pub const BUSY_WINDOW_NS: f64 = 10_000_000.0;

/// The expected largest of `k` waits, each 0 with chance `1 - busy` and otherwise
/// uniform on [0, 1]: ∫₀¹ 1 − (1 − busy·t)^k dt.
pub fn collision_share(k: u32, busy: f64) -> f64 {
    let busy = busy.clamp(0.0, 1.0);
    if busy <= 0.0 {
        return 0.0;
    }
    let k1 = f64::from(k.max(1)) + 1.0;
    1.0 - (1.0 - (1.0 - busy).powf(k1)) / (busy * k1)
}

/// Parameters of the fitted model (what `ioshare calibrate` writes).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FittedParams {
    /// Logical capacity in GiB.
    pub capacity_gib: f64,
    /// Requests in service at once.
    pub units: u32,
    /// Fixed part of a read at queue depth 1, µs.
    pub read_latency_us: f64,
    /// A read's transfer rate at queue depth 1, MB/s.
    pub read_transfer_mb_s: f64,
    /// A write's fixed part at queue depth 1, µs.
    pub write_latency_us: f64,
    /// A write's transfer rate at queue depth 1, MB/s.
    pub write_transfer_mb_s: f64,
    /// Extra for a read that does not continue its tenant's last request (a seek), µs;
    /// at queue depth 1 and on the media.
    #[serde(default)]
    pub read_random_us: f64,
    /// The same for writes, µs.
    #[serde(default)]
    pub write_random_us: f64,
    /// Media time per read request, µs.
    pub read_request_us: f64,
    /// Media rate of reads, MB/s (a deep queue of large reads).
    pub read_media_mb_s: f64,
    /// Media time per write request, µs.
    pub write_request_us: f64,
    /// Media rate of writes, MB/s (sustained: after the cache is full).
    pub write_media_mb_s: f64,
    /// Write-back cache, MiB (0: writes finish with the media).
    #[serde(default)]
    pub write_cache_mib: f64,
    /// Share of a write's media time that reads wait for too, 0 ..= 1.
    #[serde(default = "one")]
    pub writes_delay_reads: f64,
    /// Share of a read's media time that writes wait for too, 0 ..= 1.
    #[serde(default = "one")]
    pub reads_delay_writes: f64,
    /// How long a read that finds the media writing waits for the write in progress,
    /// µs (0: never): on flash, a page read behind a program on its die. A read of
    /// `k` 4 KiB units waits `read_collision_us` × the expected largest of `k` waits,
    /// each uniform over the write with the chance the media is writing (the write
    /// clock's use over the last [`BUSY_WINDOW_NS`]).
    #[serde(default)]
    pub read_collision_us: f64,
    /// The most 4 KiB units of a read that count for its collisions (0: all): on flash
    /// a 64 KiB read meets programs on 16 dies, on a virtual disk's backing store it is
    /// one request.
    #[serde(default)]
    pub collision_spread: u32,
    /// A path every request takes one batch at a time, µs (0: none): a notification,
    /// an interrupt, a host's I/O thread. A batch takes this long and carries every
    /// request that arrived before it started; a request that arrives while one is in
    /// service waits for the next. It is part of the QD1 time (the unit is held for the
    /// rest; reads and writes take it, flushes and trims do not), so one stream is as
    /// fast as without it as long as its requests take longer than the path (the
    /// fitter keeps it under the 4 KiB read and write times); two streams wait for each other's
    /// batches and together get less than twice one stream, while a deep queue,
    /// carried many at a time, hardly notices.
    #[serde(default)]
    pub shared_path_us: f64,
    /// Share of a sequential request's saving (`{op}_random_us`) it loses when another
    /// tenant's request reached the device since its tenant's last one, 0 ..= 1 (0:
    /// none): a disk arm that moved away, a flash die's page register that another
    /// read emptied. 1 makes an interrupted stream as slow as a random one.
    #[serde(default)]
    pub sequential_break: f64,
    /// Measured unit times of random reads, `[size in bytes, µs]` by size: where
    /// given, a read's unit time is interpolated between them (and continued past the
    /// ends along the nearest segment) instead of the latency + transfer line.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub read_points: Vec<[f64; 2]>,
    /// The same for writes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub write_points: Vec<[f64; 2]>,
}

/// `points` (by size) at `x`, linearly between them and past the ends along the
/// nearest segment; a single point is a constant.
fn interpolate(points: &[[f64; 2]], x: f64) -> f64 {
    match points {
        [] => 0.0,
        [only] => only[1],
        _ => {
            let i = points
                .windows(2)
                .position(|w| x <= w[1][0])
                .unwrap_or(points.len() - 2);
            let (a, b) = (points[i], points[i + 1]);
            let slope = (b[1] - a[1]) / (b[0] - a[0]);
            a[1] + slope * (x - a[0])
        }
    }
}

fn one() -> f64 {
    1.0
}

impl FittedParams {
    /// The media's cost model: what a request takes from the shared clock, and what a
    /// policy charges for it.
    pub fn cost_model(&self) -> CostModel {
        let op = |request_us: f64, media_mb_s: f64, random_us: f64| OpCost {
            per_request_ns: request_us * 1000.0,
            per_unit_ns: f64::from(UNIT_BYTES) / media_mb_s * 1000.0,
            random_ns: random_us * 1000.0,
            random_unit_ns: 0.0,
        };
        CostModel {
            read: op(
                self.read_request_us,
                self.read_media_mb_s,
                self.read_random_us,
            ),
            write: op(
                self.write_request_us,
                self.write_media_mb_s,
                self.write_random_us,
            ),
            unit: UNIT_BYTES,
            partial_write_ns: 0.0,
        }
    }

    /// The time one request holds a unit, ns (at least 1).
    pub fn unit_time(&self, op: Op, len: u32, random: bool) -> Nanos {
        let (latency, random_us, rate, points) = match op {
            Op::Read => (
                self.read_latency_us,
                self.read_random_us,
                self.read_transfer_mb_s,
                &self.read_points[..],
            ),
            Op::Write => (
                self.write_latency_us,
                self.write_random_us,
                self.write_transfer_mb_s,
                &self.write_points[..],
            ),
            Op::Flush | Op::Trim => (self.write_latency_us, 0.0, f64::INFINITY, &[][..]),
            // A metadata lookup: a read's command, no data.
            Op::Status => (self.read_latency_us, 0.0, f64::INFINITY, &[][..]),
        };
        let us = if points.is_empty() {
            latency + random_us + f64::from(len) / rate
        } else {
            // Below the first point a request costs what the first does (a whole unit).
            interpolate(points, f64::from(len).max(points[0][0]))
        } - if random { 0.0 } else { random_us };
        ((us * 1000.0).round() as Nanos).max(1)
    }

    /// How much media time the cache holds, ns: its size in 1 MiB writes (the size
    /// the calibration's burst uses).
    fn cache_ns(&self) -> Nanos {
        let mib = self.cost_model().cost(Op::Write, 0, 1 << 20, false);
        (self.write_cache_mib * mib).round() as Nanos
    }
}

/// The fitted model: units and a shared media clock (see the module docs).
#[derive(Debug, Clone)]
pub struct FittedDevice {
    params: FittedParams,
    cost: CostModel,
    cache_ns: Nanos,
    units: Vec<Nanos>,
    /// The read media clock.
    read_at: Nanos,
    /// The write media clock.
    write_at: Nanos,
    /// The shared path: when the batch in service ends, and the one after it (0: none
    /// formed yet).
    path_end: Nanos,
    path_next: Nanos,
    path_ns: Nanos,
    /// Requests served so far, and each tenant's count at its last request (whether
    /// another tenant came in between).
    served: u64,
    last_served: Vec<u64>,
    /// Write media work over the decaying window, ns, as of `busy_at`.
    write_busy: f64,
    busy_at: Nanos,
    sequence: Sequence,
}

impl FittedDevice {
    /// A device with the given parameters, idle.
    pub fn new(params: FittedParams) -> Self {
        FittedDevice {
            cost: params.cost_model(),
            cache_ns: params.cache_ns(),
            units: vec![0; params.units.max(1) as usize],
            path_ns: (params.shared_path_us * 1000.0).round() as Nanos,
            params,
            read_at: 0,
            write_at: 0,
            path_end: 0,
            path_next: 0,
            served: 0,
            last_served: Vec::new(),
            write_busy: 0.0,
            busy_at: 0,
            sequence: Sequence::default(),
        }
    }

    /// Accepts a request at `now` and answers when it finishes.
    pub fn serve(&mut self, request: &Request, now: Nanos) -> Nanos {
        // Only data moves a tenant's position (a flush at offset 0 would otherwise
        // make its next write a seek).
        let random = match request.op {
            Op::Read | Op::Write => {
                self.sequence.cover(request.tenant);
                self.sequence
                    .random(request.tenant, request.offset, request.len)
            }
            Op::Flush | Op::Trim | Op::Status => false,
        };
        let (idx, free_at) = self
            .units
            .iter()
            .copied()
            .enumerate()
            .min_by_key(|&(i, t)| (t, i))
            .expect("at least one unit");
        let cost = self
            .cost
            .cost(request.op, request.offset, request.len, random);
        // The write media's use over the window, decayed to now.
        let since = now.saturating_sub(self.busy_at) as f64;
        self.write_busy *= (-since / BUSY_WINDOW_NS).exp();
        self.busy_at = self.busy_at.max(now);
        let collision = match request.op {
            Op::Read if self.params.read_collision_us > 0.0 => {
                let mut k = request.len.div_ceil(UNIT_BYTES).max(1);
                if self.params.collision_spread > 0 {
                    k = k.min(self.params.collision_spread);
                }
                let share = collision_share(k, self.write_busy / BUSY_WINDOW_NS);
                (self.params.read_collision_us * 1000.0 * share).round() as Nanos
            }
            Op::Write | Op::Trim => {
                self.write_busy += cost;
                0
            }
            _ => 0,
        };
        let mut unit_time = self.params.unit_time(request.op, request.len, random);
        if matches!(request.op, Op::Read | Op::Write) {
            let t = request.tenant as usize;
            if self.last_served.len() <= t {
                self.last_served.resize(t + 1, 0);
            }
            self.served += 1;
            let interrupted = self.last_served[t] > 0 && self.served > self.last_served[t] + 1;
            self.last_served[t] = self.served;
            if !random && interrupted && self.params.sequential_break > 0.0 {
                let saving = match request.op {
                    Op::Read => self.params.read_random_us,
                    _ => self.params.write_random_us,
                };
                unit_time += (saving * self.params.sequential_break * 1000.0).round() as Nanos;
            }
        }
        let data = matches!(request.op, Op::Read | Op::Write);
        let (start, unit_time) = if self.path_ns > 0 && data {
            let through = self.through_path(now);
            (through, unit_time.saturating_sub(self.path_ns).max(1))
        } else {
            (now, unit_time)
        };
        let unit_end = free_at.max(start) + unit_time + collision;
        self.units[idx] = unit_end;
        let advance = |clock: &mut Nanos, share: f64| {
            *clock = (*clock).max(now) + (cost * share).round() as Nanos;
        };
        let media_done = match request.op {
            Op::Read | Op::Status => {
                // The writes queued ahead (the cache's backlog among them): a read
                // waits for its share of them, then for itself.
                let backlog = self.write_at.saturating_sub(now) as f64;
                let behind =
                    now + (backlog * self.params.writes_delay_reads + cost).round() as Nanos;
                advance(&mut self.read_at, 1.0);
                advance(&mut self.write_at, self.params.reads_delay_writes);
                self.read_at.max(behind)
            }
            Op::Write | Op::Trim => {
                advance(&mut self.write_at, 1.0);
                self.write_at.saturating_sub(self.cache_ns)
            }
            Op::Flush => {
                advance(&mut self.write_at, 1.0);
                self.write_at
            }
        };
        unit_end.max(media_done)
    }
}

impl FittedDevice {
    /// When a request that arrives at `now` is through the shared path: with the batch
    /// starting now when the path is idle, else with the next batch.
    fn through_path(&mut self, now: Nanos) -> Nanos {
        if now >= self.path_end && self.path_next > self.path_end && now < self.path_next {
            // The batch that was next is in service now.
            self.path_end = self.path_next;
            self.path_next = 0;
        }
        if now >= self.path_end {
            self.path_end = now + self.path_ns;
            self.path_next = 0;
            return self.path_end;
        }
        if self.path_next <= self.path_end {
            self.path_next = self.path_end + self.path_ns;
        }
        self.path_next
    }
}

impl DeviceModel for FittedDevice {
    fn submit(&mut self, request: &Request, now: Nanos) -> Submitted {
        Submitted::Finishes(self.serve(request, now))
    }

    fn capacity_bytes(&self) -> u64 {
        (self.params.capacity_gib * (1u64 << 30) as f64) as u64 / 4096 * 4096
    }

    fn clone_box(&self) -> Box<dyn DeviceModel> {
        Box::new(self.clone())
    }
}

/// The numbers in the ranges where they mean something; `Err` names the field.
pub fn check(p: &FittedParams) -> Result<(), crate::config::Invalid> {
    use crate::config::Invalid;
    let ranges = [
        (
            "capacity_gib",
            p.capacity_gib,
            1.0 / 1024.0,
            1024.0 * 1024.0,
        ),
        ("read_latency_us", p.read_latency_us, 0.0, 60.0e6),
        ("read_transfer_mb_s", p.read_transfer_mb_s, 0.001, 1.0e6),
        ("write_latency_us", p.write_latency_us, 0.0, 60.0e6),
        ("write_transfer_mb_s", p.write_transfer_mb_s, 0.001, 1.0e6),
        ("read_random_us", p.read_random_us, 0.0, 60.0e6),
        ("write_random_us", p.write_random_us, 0.0, 60.0e6),
        ("read_request_us", p.read_request_us, 0.0, 60.0e6),
        ("read_media_mb_s", p.read_media_mb_s, 0.001, 1.0e6),
        ("write_request_us", p.write_request_us, 0.0, 60.0e6),
        ("write_media_mb_s", p.write_media_mb_s, 0.001, 1.0e6),
        ("write_cache_mib", p.write_cache_mib, 0.0, 1.0e6),
        ("writes_delay_reads", p.writes_delay_reads, 0.0, 1.0),
        ("reads_delay_writes", p.reads_delay_writes, 0.0, 1.0),
        ("read_collision_us", p.read_collision_us, 0.0, 60.0e6),
        ("shared_path_us", p.shared_path_us, 0.0, 60.0e6),
        ("sequential_break", p.sequential_break, 0.0, 1.0),
    ];
    for (field, v, lo, hi) in ranges {
        if !(v.is_finite() && v >= lo && v <= hi) {
            return Err(Invalid::new(
                field,
                format!("must be in [{lo}, {hi}], got {v}"),
            ));
        }
    }
    for (field, points) in [
        ("read_points", &p.read_points),
        ("write_points", &p.write_points),
    ] {
        let mut last = 0.0;
        for pt in points {
            if !(pt[0].is_finite() && pt[0] > last && pt[1].is_finite() && pt[1] >= 0.0) {
                return Err(Invalid::new(
                    field,
                    format!(
                        "points must be [size > 0, µs ≥ 0] with sizes increasing, got {:?}",
                        pt
                    ),
                ));
            }
            last = pt[0];
        }
    }
    if p.collision_spread > 65_536 {
        return Err(Invalid::new(
            "collision_spread",
            format!("must be 0 ..= 65536, got {}", p.collision_spread),
        ));
    }
    if !(1..=65_536).contains(&p.units) {
        return Err(Invalid::new(
            "units",
            format!("must be 1 ..= 65536, got {}", p.units),
        ));
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A plain device: 100 µs + 1000 MB/s per request, 4 units, media 20 µs per
    /// request and 500 MB/s, writes the same, no cache.
    pub(crate) fn params() -> FittedParams {
        FittedParams {
            capacity_gib: 1.0,
            units: 4,
            read_latency_us: 100.0,
            read_transfer_mb_s: 1000.0,
            write_latency_us: 100.0,
            write_transfer_mb_s: 1000.0,
            read_random_us: 0.0,
            write_random_us: 0.0,
            read_request_us: 20.0,
            read_media_mb_s: 500.0,
            write_request_us: 20.0,
            write_media_mb_s: 500.0,
            write_cache_mib: 0.0,
            writes_delay_reads: 1.0,
            reads_delay_writes: 1.0,
            read_collision_us: 0.0,
            shared_path_us: 0.0,
            sequential_break: 0.0,
            collision_spread: 0,
            read_points: Vec::new(),
            write_points: Vec::new(),
        }
    }

    fn req(op: Op, offset: u64, len: u32) -> Request {
        Request {
            id: 0,
            tenant: 0,
            op,
            offset,
            len,
            arrival: 0,
            cost: 0,
        }
    }

    /// Alone, a request takes its unit time: latency + len / transfer (the media is
    /// faster for one request at a time).
    #[test]
    fn one_request_takes_its_queue_depth_one_latency() {
        let mut d = FittedDevice::new(params());
        // 100 µs + 4096 B / 1000 MB/s = 104.096 µs.
        assert_eq!(d.serve(&req(Op::Read, 0, 4096), 0), 104_096);
    }

    /// The expected largest wait: none when the media is idle, half the write for one
    /// unit at full use, nearly all of it for many units.
    #[test]
    fn collisions_grow_with_the_units_a_read_touches() {
        assert_eq!(collision_share(1, 0.0), 0.0);
        assert!((collision_share(1, 1.0) - 0.5).abs() < 1e-12);
        assert!((collision_share(1, 0.3) - 0.15).abs() < 1e-12);
        assert!((collision_share(16, 1.0) - 16.0 / 17.0).abs() < 1e-12);
        let mut last = 0.0;
        for k in [1, 2, 4, 16, 256] {
            let s = collision_share(k, 0.25);
            assert!(s > last && s < 1.0, "{k}: {s}");
            last = s;
        }
    }

    /// A read beside writes waits the collision time × the expected largest wait, at
    /// the write clock's use over the window; without writes it does not.
    #[test]
    fn a_read_beside_writes_waits_for_the_write_in_progress() {
        let p = FittedParams {
            read_collision_us: 100.0,
            write_cache_mib: 64.0,
            ..params()
        };
        let mut d = FittedDevice::new(p.clone());
        // Alone: the unit time.
        assert_eq!(d.serve(&req(Op::Read, 0, 4096), 0), 104_096);
        // A 4 KiB write every 56.768 µs (twice its 28.384 µs media cost) for 100 ms:
        // the window holds about half its length of write work.
        let mut t = 0;
        while t < 100_000_000 {
            let _ = d.serve(&req(Op::Write, 0, 4096), t);
            t += 56_768;
        }
        let busy = d.write_busy / BUSY_WINDOW_NS;
        assert!((busy - 0.5).abs() < 0.01, "{busy}");
        let at = t;
        let done = d.serve(&req(Op::Read, 1 << 20, 4096), at);
        // The write 56.768 µs ago has decayed a little: use just under 0.5.
        let share = collision_share(
            1,
            busy * (-((at - (t - 56_768)) as f64) / BUSY_WINDOW_NS).exp(),
        );
        assert_eq!(done - at, 104_096 + (100_000.0 * share).round() as Nanos);
        assert!(done - at > 104_096 + 24_000 && done - at < 104_096 + 25_100);
    }

    /// The shared path: one stream as fast as without it, two streams one batch each
    /// in turn, a deep queue carried many at a time.
    #[test]
    fn a_shared_path_slows_two_streams_not_one_or_a_deep_queue() {
        let p = FittedParams {
            shared_path_us: 80.0,
            ..params()
        };
        // One stream: 104.096 µs a request, path included.
        let mut d = FittedDevice::new(p.clone());
        let mut t = 0;
        for i in 0..10u64 {
            t = d.serve(&req(Op::Read, i * 8192, 4096), t);
        }
        assert_eq!(t, 10 * 104_096);
        // Two streams, each sending its next request when its last is done: after the
        // first cycle each request waits for the other's batch, 2 × 80 µs a cycle.
        let mut d = FittedDevice::new(p.clone());
        let (mut a, mut b) = (0, 0);
        for i in 0..100u64 {
            a = d.serve(&req(Op::Read, i * 8192, 4096), a);
            b = d.serve(&req(Op::Read, (1 << 29) + i * 8192, 4096), b);
        }
        let cycle = b as f64 / 100.0;
        assert!((cycle - 160_000.0).abs() < 1_000.0, "{cycle}");
        // A deep queue: one batch carries the 1000 requests; the media binds as before.
        let mut q = p;
        q.units = 64;
        let mut d = FittedDevice::new(q);
        let mut last = 0;
        for i in 0..1000u64 {
            last = d.serve(&req(Op::Read, i * 8192, 4096), 0);
        }
        assert_eq!(last, 1000 * 28_192);
    }

    /// With `collision_spread` 1 a 64 KiB read collides like a 4 KiB one; with 0 like
    /// the 16 units it touches.
    #[test]
    fn the_spread_caps_the_units_a_collision_counts() {
        let delay = |spread: u32| {
            let mut d = FittedDevice::new(FittedParams {
                read_collision_us: 100.0,
                collision_spread: spread,
                write_cache_mib: 64.0,
                ..params()
            });
            let mut t = 0;
            while t < 100_000_000 {
                let _ = d.serve(&req(Op::Write, 0, 4096), t);
                t += 56_768;
            }
            let at = t;
            d.serve(&req(Op::Read, 1 << 20, 65536), at) - at
        };
        let alone = 100_000 + 65_536_000 / 1000;
        let (one, all) = (delay(1), delay(0));
        // About half the write use: one unit waits about a quarter of the collision
        // time, sixteen nearly nine tenths of it.
        assert!((one - alone) > 24_000 && (one - alone) < 25_100, "{one}");
        assert!((all - alone) > 85_000 && (all - alone) < 90_000, "{all}");
    }

    /// A sequential stream saves its `read_random_us` until another tenant's request
    /// comes in between; then it loses `sequential_break` of the saving.
    #[test]
    fn another_tenant_breaks_a_sequential_stream_by_its_share() {
        let p = FittedParams {
            read_random_us: 40.0,
            sequential_break: 0.5,
            ..params()
        };
        let mut d = FittedDevice::new(p);
        let at = |tenant, offset| Request {
            tenant,
            ..req(Op::Read, offset, 4096)
        };
        // Tenant 0 alone: random first (144.096 µs), then sequential (104.096 µs).
        let t = 1_000_000;
        assert_eq!(d.serve(&at(0, 0), t) - t, 144_096);
        let t = 2_000_000;
        assert_eq!(d.serve(&at(0, 4096), t) - t, 104_096);
        // Tenant 1 in between: tenant 0's next sequential read loses half the saving.
        let t = 3_000_000;
        let _ = d.serve(&at(1, 1 << 29), t);
        let t = 4_000_000;
        assert_eq!(d.serve(&at(0, 8192), t) - t, 124_096);
        // Alone again: the whole saving.
        let t = 5_000_000;
        assert_eq!(d.serve(&at(0, 12288), t) - t, 104_096);
    }

    /// Many at once: the media clock binds at 20 µs + 8.192 µs per 4 KiB request,
    /// wherever the units would allow more.
    #[test]
    fn a_deep_queue_runs_at_the_media_rate() {
        let mut p = params();
        p.units = 64;
        let mut d = FittedDevice::new(p);
        let mut last = 0;
        for i in 0..1000u64 {
            last = d.serve(&req(Op::Read, i * 8192, 4096), 0);
        }
        // 1000 × (20 000 + 8192) ns.
        assert_eq!(last, 1000 * 28_192);
    }

    /// A write burst is acknowledged at the unit pace while the cache holds the media's
    /// backlog, then at the media's pace; a flush waits for the media.
    #[test]
    fn the_cache_absorbs_a_burst_then_the_media_paces_writes() {
        let mut p = params();
        p.units = 1;
        p.write_latency_us = 10.0;
        p.write_transfer_mb_s = f64::INFINITY;
        p.write_request_us = 0.0;
        p.write_media_mb_s = 40.96; // 100 µs a 4 KiB write
        p.write_cache_mib = 1.0; // 256 writes of backlog: 25.6 ms
        let mut d = FittedDevice::new(p);
        assert_eq!(d.cache_ns, 25_600_000);
        let mut now = 0;
        let mut gaps = Vec::new();
        for i in 0..400u64 {
            let done = d.serve(&req(Op::Write, i * 4096, 4096), now);
            gaps.push(done - now);
            now = done;
        }
        // The backlog grows by 90 µs a write until it passes 25.6 ms: the 285th on.
        assert!(gaps[..284].iter().all(|&g| g == 10_000), "{gaps:?}");
        assert!(gaps[290..].iter().all(|&g| g == 100_000), "{gaps:?}");
        let flush = d.serve(&req(Op::Flush, 0, 0), now);
        assert_eq!(flush, d.write_at);
        assert!(flush > now + 1_000_000, "the flush waits for the backlog");
    }

    /// A request that does not continue its tenant's last pays the random part on its
    /// unit; a sequential one does not.
    #[test]
    fn random_requests_pay_the_seek() {
        let mut p = params();
        p.read_random_us = 50.0;
        let mut d = FittedDevice::new(p);
        let first = d.serve(&req(Op::Read, 0, 4096), 0);
        assert_eq!(
            first, 154_096,
            "the first request has no predecessor: random"
        );
        let seq = d.serve(&req(Op::Read, 4096, 4096), first) - first;
        assert_eq!(seq, 104_096);
        let rand = d.serve(&req(Op::Read, 1 << 20, 4096), first + seq) - first - seq;
        assert_eq!(rand, 154_096);
    }

    /// Reads advance the write clock by their share, and wait for their share of
    /// the writes queued ahead; with no share the directions are independent.
    #[test]
    fn reads_and_writes_meet_as_their_shares_say() {
        let run = |writes_delay_reads: f64, reads_delay_writes: f64| {
            let mut p = params();
            p.units = 1024;
            // Reads held by the media alone.
            p.read_latency_us = 0.0;
            p.read_transfer_mb_s = 1.0e6;
            p.writes_delay_reads = writes_delay_reads;
            p.reads_delay_writes = reads_delay_writes;
            let mut d = FittedDevice::new(p);
            let mut last_write = 0;
            for i in 0..100u64 {
                let mut w = req(Op::Write, (1 << 30) + i * 8192, 4096);
                w.tenant = 1;
                last_write = d.serve(&w, 0);
            }
            let first_read = d.serve(&req(Op::Read, 0, 4096), 0);
            let next_write = d.serve(&req(Op::Write, 1 << 29, 4096), 0);
            (last_write, first_read, next_write)
        };
        // 100 writes of 28.192 µs queued; a read behind none of them, and takes none
        // of the writes' time.
        assert_eq!(run(0.0, 0.0), (100 * 28_192, 28_192, 101 * 28_192));
        // Behind all of them, and a write after it waits for the read too.
        assert_eq!(run(1.0, 1.0), (100 * 28_192, 101 * 28_192, 102 * 28_192));
        // Behind half.
        assert_eq!(run(0.5, 0.0).1, 51 * 28_192);
    }

    /// With measured points the unit time follows them, between and past the ends.
    #[test]
    fn points_replace_the_line() {
        let mut p = params();
        p.read_points = vec![[4096.0, 100.0], [65536.0, 200.0], [1048576.0, 2000.0]];
        assert_eq!(p.unit_time(Op::Read, 4096, true), 100_000);
        assert_eq!(
            p.unit_time(Op::Read, 2048, true),
            100_000,
            "as the first point"
        );
        let mid = p.unit_time(Op::Read, 65536 + (1048576 - 65536) / 2, true);
        assert_eq!(mid, 1_100_000);
        assert_eq!(p.unit_time(Op::Read, 2 * 1048576, true), 3_920_000);
        // Writes keep the line.
        assert_eq!(p.unit_time(Op::Write, 4096, true), 104_096);
        p.read_points = vec![[4096.0, 1.0], [4096.0, 2.0]];
        assert_eq!(check(&p).unwrap_err().field, "read_points");
    }

    #[test]
    fn out_of_range_numbers_are_named() {
        let mut p = params();
        p.read_media_mb_s = 0.0;
        assert_eq!(check(&p).unwrap_err().field, "read_media_mb_s");
        let mut p = params();
        p.units = 0;
        assert_eq!(check(&p).unwrap_err().field, "units");
        assert!(check(&params()).is_ok());
    }
}
