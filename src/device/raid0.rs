//! `raid0`: N member disks striped with a fixed stripe unit, behind member buses (SCSI
//! HBAs, each shared by `members / buses` disks) and host links (Fibre Channel HBAs).
//! A request is split at stripe boundaries; each part goes to its member, and the request
//! completes when its last part does.
//!
//! Data crosses the links store-and-forward at their rates, each link a timeline: a
//! write's part crosses the host link then its member bus before the disk sees it; a
//! read's part crosses its member bus then the host link after the disk read it. The
//! least busy host link carries each part.

use super::hdd::{self, HddDevice, HddParams};
use super::{DeviceModel, DeviceStats, Finished, Submitted};
use crate::types::{NANOS_PER_SEC, Nanos, Op, Request};
use serde::{Deserialize, Serialize};
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Parameters of the array (all settable in a scenario's `[device]`; member disk
/// parameters under `member`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Raid0Params {
    /// Member disks.
    pub members: u32,
    /// Stripe unit, KiB.
    pub stripe_kib: u32,
    /// Buses the members hang on (member i on bus i × buses / members).
    pub buses: u32,
    /// Rate of one member bus, MB/s.
    pub bus_mb_s: f64,
    /// Links between host and array.
    pub host_links: u32,
    /// Rate of one host link, MB/s.
    pub host_link_mb_s: f64,
    /// Every member disk.
    pub member: HddParams,
}

/// A named array configuration.
#[derive(Debug, Clone, Copy)]
pub struct Raid0Preset {
    /// Name a scenario selects it by.
    pub name: &'static str,
    /// The array it models, in one line.
    pub about: &'static str,
    /// Its parameters.
    pub params: Raid0Params,
}

/// The shipped arrays.
pub fn presets() -> &'static [Raid0Preset] {
    &[Raid0Preset {
        name: "scsi-10k-73g-x8",
        about: "eight scsi-10k-73g disks, 128 KiB stripe, four 80 MB/s SCSI buses, \
                two 100 MB/s FC links (the token-bucket paper's array)",
        params: Raid0Params {
            members: 8,
            stripe_kib: 128,
            buses: 4,
            bus_mb_s: 80.0,
            host_links: 2,
            host_link_mb_s: 100.0,
            member: hdd::SCSI_10K_73G,
        },
    }]
}

/// Looks a preset up by name.
pub fn preset(name: &str) -> Option<&'static Raid0Preset> {
    presets().iter().find(|p| p.name == name)
}

/// Checks parameters a scenario may have set by hand; the error names the field.
pub fn check(p: &Raid0Params) -> Result<(), crate::config::Invalid> {
    use crate::config::Invalid;
    for (name, v) in [
        ("members", p.members),
        ("buses", p.buses),
        ("host_links", p.host_links),
    ] {
        if v == 0 {
            return Err(Invalid::new(name, "must be ≥ 1"));
        }
    }
    if p.buses > p.members {
        return Err(Invalid::new(
            "buses",
            format!("{} must not exceed members ({})", p.buses, p.members),
        ));
    }
    if p.stripe_kib == 0 || !p.stripe_kib.is_multiple_of(4) {
        return Err(Invalid::new(
            "stripe_kib",
            format!("must be a positive multiple of 4, got {}", p.stripe_kib),
        ));
    }
    for (name, v) in [
        ("bus_mb_s", p.bus_mb_s),
        ("host_link_mb_s", p.host_link_mb_s),
    ] {
        if !(v.is_finite() && v > 0.0) {
            return Err(Invalid::new(name, format!("must be > 0, got {v}")));
        }
    }
    hdd::check(&p.member).map_err(|e| e.within("member"))
}

#[derive(Debug, Clone, Copy)]
struct Parent {
    request: Request,
    submitted: Nanos,
    parts_left: u32,
    finish: Nanos,
    /// The members' heads' time on its parts so far.
    busy: Nanos,
}

/// A part's place: which parent slot it belongs to is its request id.
type Timed = Reverse<(Nanos, u64, usize, u64, u32, u64)>;

/// The array.
#[derive(Debug, Clone)]
pub struct Raid0Device {
    members: Vec<HddDevice>,
    stripe: u64,
    member_capacity: u64,
    bus_of: Vec<usize>,
    bus_free: Vec<Nanos>,
    link_free: Vec<Nanos>,
    bus_ns_per_mb: f64,
    link_ns_per_mb: f64,
    parents: Vec<Option<Parent>>,
    free_slots: Vec<usize>,
    /// Write parts on their way to a disk: (arrival at the disk, seq, member, member
    /// offset, len, slot).
    to_disk: BinaryHeap<Timed>,
    /// Read parts on their way to the host: (arrival at the host, seq, slot, ...).
    to_host: BinaryHeap<Timed>,
    seq: u64,
    scratch: Vec<Finished>,
    done: Vec<Finished>,
}

impl Raid0Device {
    /// An idle array with the given parameters.
    pub fn new(params: Raid0Params) -> Self {
        let stripe = params.stripe_kib as u64 * 1024;
        let member = HddDevice::new(params.member);
        let member_capacity = member.capacity_bytes() / stripe * stripe;
        let n = params.members as usize;
        Raid0Device {
            members: vec![member; n],
            stripe,
            member_capacity,
            bus_of: (0..n).map(|i| i * params.buses as usize / n).collect(),
            bus_free: vec![0; params.buses as usize],
            link_free: vec![0; params.host_links as usize],
            bus_ns_per_mb: NANOS_PER_SEC as f64 / params.bus_mb_s,
            link_ns_per_mb: NANOS_PER_SEC as f64 / params.host_link_mb_s,
            parents: Vec::new(),
            free_slots: Vec::new(),
            to_disk: BinaryHeap::new(),
            to_host: BinaryHeap::new(),
            seq: 0,
            scratch: Vec::new(),
            done: Vec::new(),
        }
    }

    /// The member parts of `[offset, offset + len)`: (member, member offset, len).
    pub fn split(&self, offset: u64, len: u32) -> Vec<(usize, u64, u32)> {
        let n = self.members.len() as u64;
        let mut parts = Vec::new();
        let (mut off, end) = (offset, offset + len as u64);
        while off < end {
            let unit = off / self.stripe;
            let within = off % self.stripe;
            let take = (self.stripe - within).min(end - off);
            parts.push((
                (unit % n) as usize,
                unit / n * self.stripe + within,
                take as u32,
            ));
            off += take;
        }
        parts
    }

    fn bytes_ns(ns_per_mb: f64, bytes: u32) -> Nanos {
        (bytes as f64 * ns_per_mb / 1e6).round() as Nanos
    }

    /// Reserves the member bus then the least busy host link (reads: in that order;
    /// writes: link first) from `at`; returns when the data is across both.
    fn cross(&mut self, member: usize, bytes: u32, at: Nanos, to_host: bool) -> Nanos {
        if bytes == 0 {
            return at;
        }
        let bus = self.bus_of[member];
        let link = (0..self.link_free.len())
            .min_by_key(|&i| (self.link_free[i], i))
            .expect("at least one link");
        let bus_ns = Self::bytes_ns(self.bus_ns_per_mb, bytes);
        let link_ns = Self::bytes_ns(self.link_ns_per_mb, bytes);
        if to_host {
            self.bus_free[bus] = self.bus_free[bus].max(at) + bus_ns;
            self.link_free[link] = self.link_free[link].max(self.bus_free[bus]) + link_ns;
            self.link_free[link]
        } else {
            self.link_free[link] = self.link_free[link].max(at) + link_ns;
            self.bus_free[bus] = self.bus_free[bus].max(self.link_free[link]) + bus_ns;
            self.bus_free[bus]
        }
    }

    fn part_done(&mut self, slot: usize, at: Nanos) {
        let members = self.members.len() as Nanos;
        let p = self.parents[slot].as_mut().expect("live parent");
        p.parts_left -= 1;
        p.finish = p.finish.max(at);
        if p.parts_left == 0 {
            let p = self.parents[slot].take().expect("live parent");
            self.free_slots.push(slot);
            self.done.push(Finished {
                request: p.request,
                submitted: p.submitted,
                finish: p.finish,
                busy: Some(p.busy / members),
            });
        }
    }

    fn part_request(&self, slot: usize, offset: u64, len: u32) -> Request {
        let parent = self.parents[slot].expect("live parent").request;
        Request {
            id: slot as u64,
            offset,
            len,
            ..parent
        }
    }

    fn next_internal(&self) -> Option<Nanos> {
        let members = self.members.iter().filter_map(|m| m.next_event()).min();
        let disk = self.to_disk.peek().map(|Reverse(t)| t.0);
        let host = self.to_host.peek().map(|Reverse(t)| t.0);
        [members, disk, host].into_iter().flatten().min()
    }

    /// Runs every internal event due by `now`, in time order.
    fn progress(&mut self, now: Nanos) {
        while let Some(t) = self.next_internal().filter(|&t| t <= now) {
            while let Some(Reverse((_, _, member, offset, len, slot))) =
                self.to_disk.peek().copied().filter(|Reverse(x)| x.0 == t)
            {
                self.to_disk.pop();
                let part = self.part_request(slot as usize, offset, len);
                let queued = self.members[member].submit(&part, t);
                // A disk decides its order later: the finish comes out of `advance`.
                assert_eq!(queued, Submitted::Queued, "a member disk defers its finish");
            }
            for m in 0..self.members.len() {
                if self.members[m].next_event().is_some_and(|e| e <= t) {
                    let mut finished = std::mem::take(&mut self.scratch);
                    self.members[m].advance(t, &mut finished);
                    for f in finished.drain(..) {
                        let slot = f.request.id as usize;
                        self.parents[slot].as_mut().expect("live parent").busy +=
                            f.busy.expect("a member disk measures its heads' time");
                        if f.request.op == Op::Read {
                            let at = self.cross(m, f.request.len, f.finish, true);
                            self.seq += 1;
                            self.to_host
                                .push(Reverse((at, self.seq, m, 0, 0, slot as u64)));
                        } else {
                            self.part_done(slot, f.finish);
                        }
                    }
                    self.scratch = finished;
                }
            }
            while let Some(Reverse((at, _, _, _, _, slot))) =
                self.to_host.peek().copied().filter(|Reverse(x)| x.0 == t)
            {
                self.to_host.pop();
                self.part_done(slot as usize, at);
            }
        }
    }
}

impl DeviceModel for Raid0Device {
    fn submit(&mut self, request: &Request, now: Nanos) -> Submitted {
        self.progress(now);
        let parts: Vec<(usize, u64, u32)> = match request.op {
            Op::Read | Op::Write | Op::Trim if request.len > 0 => {
                self.split(request.offset, request.len)
            }
            // A flush (or an empty command) goes to every member.
            _ => (0..self.members.len()).map(|m| (m, 0, 0)).collect(),
        };
        let slot = self.free_slots.pop().unwrap_or_else(|| {
            self.parents.push(None);
            self.parents.len() - 1
        });
        self.parents[slot] = Some(Parent {
            request: *request,
            submitted: now,
            parts_left: parts.len() as u32,
            finish: now,
            busy: 0,
        });
        for (member, offset, len) in parts {
            let data = if request.op == Op::Write { len } else { 0 };
            let at = self.cross(member, data, now, false);
            let part = self.part_request(slot, offset, len);
            if at <= now {
                let queued = self.members[member].submit(&part, now);
                // A disk decides its order later: the finish comes out of `advance`.
                assert_eq!(queued, Submitted::Queued, "a member disk defers its finish");
            } else {
                self.seq += 1;
                self.to_disk
                    .push(Reverse((at, self.seq, member, offset, len, slot as u64)));
            }
        }
        Submitted::Queued
    }

    fn next_event(&self) -> Option<Nanos> {
        let done = self.done.iter().map(|d| d.finish).min();
        done.into_iter().chain(self.next_internal()).min()
    }

    fn advance(&mut self, now: Nanos, done: &mut Vec<Finished>) {
        self.progress(now);
        self.done.sort_by_key(|d| (d.finish, d.request.id));
        done.append(&mut self.done);
    }

    fn stats(&self) -> DeviceStats {
        let busy: u64 = self.members.iter().filter_map(|m| m.stats().busy_ns).sum();
        DeviceStats {
            write_amplification: 1.0,
            busy_ns: Some(busy / self.members.len().max(1) as u64),
            ..DeviceStats::default()
        }
    }

    fn reset_stats(&mut self) {
        for m in &mut self.members {
            m.reset_stats();
        }
    }

    fn measure_from(&mut self, from: Nanos) {
        for m in &mut self.members {
            m.measure_from(from);
        }
    }

    fn capacity_bytes(&self) -> u64 {
        self.member_capacity * self.members.len() as u64
    }

    fn clone_box(&self) -> Box<dyn DeviceModel> {
        Box::new(self.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> Raid0Params {
        Raid0Params {
            members: 4,
            stripe_kib: 8,
            buses: 2,
            bus_mb_s: 10.0,
            host_links: 1,
            host_link_mb_s: 20.0,
            member: HddParams {
                capacity_gib: 0.01,
                rpm: 6000.0,
                media_mb_s: 1.0,
                heads: 2,
                track_to_track_ms: 1.0,
                full_stroke_ms: 5.0,
                overhead_us: 50.0,
                queue_depth: 1,
                age_weight: 0.0,
            },
        }
    }

    fn req(op: Op, offset: u64, len: u32) -> Request {
        Request {
            id: 77,
            tenant: 3,
            op,
            offset,
            len,
            arrival: 0,
            cost: 0,
        }
    }

    #[test]
    fn splits_at_stripe_boundaries_round_robin() {
        let d = Raid0Device::new(small());
        // 8 KiB units over 4 members: [4k, 20k) touches units 0, 1, 2.
        assert_eq!(
            d.split(4096, 16384),
            vec![(0, 4096, 4096), (1, 0, 8192), (2, 0, 4096)]
        );
        // Unit 5 is the second unit on member 1.
        assert_eq!(d.split(5 * 8192, 8192), vec![(1, 8192, 8192)]);
    }

    #[test]
    fn a_request_carries_its_parts_heads_time_over_the_members() {
        let mut d = Raid0Device::new(small());
        // Three parts (members 0, 1, 2), and one on member 3 alone.
        let a = Request {
            id: 1,
            ..req(Op::Write, 4096, 16384)
        };
        let b = Request {
            id: 2,
            ..req(Op::Read, 3 * 8192, 4096)
        };
        assert_eq!(d.submit(&a, 0), Submitted::Queued);
        assert_eq!(d.submit(&b, 0), Submitted::Queued);
        let done = crate::device::drain(&mut d);
        assert_eq!(done.len(), 2);
        let busy: u64 = done
            .iter()
            .map(|f| f.busy.expect("an array measures"))
            .sum();
        // The array's busy time is its members' mean; each request's share of it is
        // its parts' time over the members (rounded down, a nanosecond a request).
        let total = d.stats().busy_ns.unwrap();
        assert!(busy <= total && total - busy <= 2, "{busy} {total}");
        let member_time = |offset: u64, len: u32, op: Op| {
            let mut m = HddDevice::new(small().member);
            assert_eq!(m.submit(&req(op, offset, len), 0), Submitted::Queued);
            crate::device::drain(&mut m)[0].busy.unwrap()
        };
        let b_done = done.iter().find(|f| f.request.id == 2).unwrap();
        assert_eq!(b_done.busy, Some(member_time(0, 4096, Op::Read) / 4));
    }

    #[test]
    fn a_split_read_completes_with_its_last_part_plus_transfers() {
        // Two 4 KiB parts on members 0 and 1 (one bus each? members 0,1 share bus 0).
        let mut d = Raid0Device::new(small());
        let r = req(Op::Read, 4096, 8192);
        assert_eq!(d.submit(&r, 0), Submitted::Queued);
        let done = crate::device::drain(&mut d);
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].request, r);
        // Each member alone: what the disk takes, then 4 KiB over the 10 MB/s bus
        // (409.6 µs) and the 20 MB/s link (204.8 µs). Both parts share bus 0 and the
        // link, so the second waits for the first's bus transfer.
        let disk = |offset: u64| {
            let mut m = HddDevice::new(small().member);
            assert_eq!(m.submit(&req(Op::Read, offset, 4096), 0), Submitted::Queued);
            crate::device::drain(&mut m)[0].finish
        };
        let (a, b) = (disk(4096), disk(0));
        let bus = 409_600;
        let link = 204_800;
        let (first, second) = (a.min(b), a.max(b));
        let bus_a = first + bus;
        let link_a = bus_a + link;
        let bus_b = second.max(bus_a) + bus;
        let link_b = bus_b.max(link_a) + link;
        assert_eq!(done[0].finish, link_a.max(link_b));
    }

    #[test]
    fn writes_cross_the_links_before_the_disk() {
        let mut d = Raid0Device::new(small());
        assert_eq!(d.submit(&req(Op::Write, 0, 4096), 0), Submitted::Queued);
        // Member 0 sees the write after 204.8 µs (link) + 409.6 µs (bus).
        let mut m = HddDevice::new(small().member);
        assert_eq!(
            m.submit(&req(Op::Write, 0, 4096), 614_400),
            Submitted::Queued
        );
        let alone = crate::device::drain(&mut m);
        let done = crate::device::drain(&mut d);
        assert_eq!(done[0].finish, alone[0].finish);
        assert_eq!(done[0].submitted, 0);
    }

    #[test]
    fn flush_touches_every_member_and_capacity_is_whole_stripes() {
        let mut d = Raid0Device::new(small());
        assert_eq!(d.submit(&req(Op::Flush, 0, 0), 1000), Submitted::Queued);
        let done = crate::device::drain(&mut d);
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].finish, 1000 + 50_000);
        assert_eq!(d.capacity_bytes() % (4 * 8192), 0);
    }
}
