//! `hdd`: a rotating disk with no cache. A request costs the command overhead, a seek
//! that grows with the square root of the cylinder distance, the rotational wait until
//! its first sector passes under the head, and the media transfer. With a tagged queue
//! (`queue_depth` > 1) the disk serves next, among the first `queue_depth` commands it
//! holds, the one with the shortest positioning time (seek + rotation; SPTF), so its
//! throughput grows with its queue the way real drives' does.
//!
//! Geometry is simple on purpose: one zone (every track holds what one revolution
//! transfers at `media_mb_s`), logical blocks laid out track after track, cylinder after
//! cylinder, no track skew. The platter angle is a function of absolute time, so a
//! request's rotational wait is exact and deterministic.

use super::{DeviceModel, DeviceStats, Finished, Submitted};
use crate::types::{NANOS_PER_SEC, Nanos, Op, Request};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

/// Parameters of the disk model (all settable in a scenario's `[device]`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HddParams {
    /// Logical capacity in GiB.
    pub capacity_gib: f64,
    /// Spindle speed, revolutions per minute.
    pub rpm: f64,
    /// Media transfer rate, MB/s (10^6 bytes); also sets the bytes per track.
    pub media_mb_s: f64,
    /// Recording surfaces (tracks per cylinder).
    pub heads: u32,
    /// Seek to the next cylinder, ms.
    pub track_to_track_ms: f64,
    /// Seek across the whole stroke, ms.
    pub full_stroke_ms: f64,
    /// Controller time per command, µs.
    pub overhead_us: f64,
    /// Commands the disk reorders (tagged queue); 1 serves in arrival order.
    pub queue_depth: u32,
    /// Aged SPTF: each millisecond a command has waited takes this many milliseconds
    /// off its positioning time when the disk chooses, which bounds SPTF's starvation
    /// of far-away sectors. 0 is pure SPTF.
    #[serde(default)]
    pub age_weight: f64,
}

/// A named disk configuration.
#[derive(Debug, Clone, Copy)]
pub struct HddPreset {
    /// Name a scenario selects it by.
    pub name: &'static str,
    /// The disk it models, in one line.
    pub about: &'static str,
    /// Its parameters.
    pub params: HddParams,
}

/// A 10,000 RPM 73 GB SCSI disk; see docs/devices.md for where the numbers come from.
pub const SCSI_10K_73G: HddParams = HddParams {
    capacity_gib: 68.0,
    rpm: 10_000.0,
    media_mb_s: 68.0,
    heads: 4,
    track_to_track_ms: 0.3,
    full_stroke_ms: 8.5,
    overhead_us: 100.0,
    queue_depth: 16,
    age_weight: 0.05,
};

/// The shipped disks.
pub fn presets() -> &'static [HddPreset] {
    &[HddPreset {
        name: "scsi-10k-73g",
        about: "10,000 RPM 73 GB Ultra320 SCSI disk (2004-era enterprise drive)",
        params: SCSI_10K_73G,
    }]
}

/// Looks a preset up by name.
pub fn preset(name: &str) -> Option<&'static HddPreset> {
    presets().iter().find(|p| p.name == name)
}

/// Checks parameters a scenario may have set by hand; the error names the field.
pub fn check(p: &HddParams) -> Result<(), crate::config::Invalid> {
    use crate::config::Invalid;
    for (name, v) in [
        ("capacity_gib", p.capacity_gib),
        ("rpm", p.rpm),
        ("media_mb_s", p.media_mb_s),
    ] {
        if !(v.is_finite() && v > 0.0) {
            return Err(Invalid::new(name, format!("must be > 0, got {v}")));
        }
    }
    for (name, v) in [
        ("track_to_track_ms", p.track_to_track_ms),
        ("full_stroke_ms", p.full_stroke_ms),
        ("overhead_us", p.overhead_us),
        ("age_weight", p.age_weight),
    ] {
        if !(v.is_finite() && v >= 0.0) {
            return Err(Invalid::new(name, format!("must be ≥ 0, got {v}")));
        }
    }
    if p.full_stroke_ms < p.track_to_track_ms {
        return Err(Invalid::new(
            "full_stroke_ms",
            "must be ≥ track_to_track_ms",
        ));
    }
    if p.heads == 0 {
        return Err(Invalid::new("heads", "must be ≥ 1"));
    }
    if p.queue_depth == 0 {
        return Err(Invalid::new("queue_depth", "must be ≥ 1"));
    }
    if p.capacity_gib > 1024.0 * 1024.0 {
        return Err(Invalid::new(
            "capacity_gib",
            format!("{} is too large", p.capacity_gib),
        ));
    }
    Ok(())
}

/// The disk. Requests wait in arrival order; the first `queue_depth` of them are the
/// tagged window the disk chooses from.
#[derive(Debug, Clone)]
pub struct HddDevice {
    params: HddParams,
    capacity: u64,
    rev_ns: Nanos,
    track_bytes: u64,
    cylinders: u64,
    overhead_ns: Nanos,
    track_to_track_ns: f64,
    full_stroke_ns: f64,
    head_cylinder: u64,
    pending: VecDeque<(Request, Nanos)>,
    serving: Option<Finished>,
    done: Vec<Finished>,
    /// Time spent positioning and transferring since creation or the last
    /// [`DeviceModel::reset_stats`], ns (counted when a command starts).
    busy_ns: u64,
    /// Busy time counts from here on ([`DeviceModel::measure_from`]).
    measure_from: Nanos,
}

impl HddDevice {
    /// An idle disk with the head on cylinder 0.
    pub fn new(params: HddParams) -> Self {
        let rev_ns = (60.0 * NANOS_PER_SEC as f64 / params.rpm).round() as Nanos;
        // One revolution's worth of media transfer, in whole sectors.
        let track_bytes =
            ((params.media_mb_s * 1e6 * rev_ns as f64 / NANOS_PER_SEC as f64) as u64 / 512 * 512)
                .max(512);
        let capacity = (params.capacity_gib * (1u64 << 30) as f64) as u64 / 4096 * 4096;
        let tracks = capacity.div_ceil(track_bytes);
        HddDevice {
            params,
            capacity,
            rev_ns,
            track_bytes,
            cylinders: tracks.div_ceil(params.heads as u64).max(1),
            overhead_ns: (params.overhead_us * 1000.0).round() as Nanos,
            track_to_track_ns: params.track_to_track_ms * 1e6,
            full_stroke_ns: params.full_stroke_ms * 1e6,
            head_cylinder: 0,
            pending: VecDeque::new(),
            serving: None,
            done: Vec::new(),
            busy_ns: 0,
            measure_from: 0,
        }
    }

    /// Cylinders on the disk.
    pub fn cylinders(&self) -> u64 {
        self.cylinders
    }

    /// Time of one revolution.
    pub fn revolution(&self) -> Nanos {
        self.rev_ns
    }

    fn cylinder_of(&self, offset: u64) -> u64 {
        (offset / self.track_bytes / self.params.heads as u64).min(self.cylinders - 1)
    }

    /// Seek time over `distance` cylinders: 0 for none, track-to-track for one, growing
    /// with the square root of the distance to the full stroke.
    pub fn seek_time(&self, distance: u64) -> Nanos {
        if distance == 0 {
            return 0;
        }
        let span = (self.cylinders - 1).max(1) as f64;
        let frac = ((distance - 1) as f64 / span).min(1.0).sqrt();
        (self.track_to_track_ns + (self.full_stroke_ns - self.track_to_track_ns) * frac).round()
            as Nanos
    }

    /// Media transfer time of `len` bytes.
    pub fn transfer_time(&self, len: u32) -> Nanos {
        len as u64 * self.rev_ns / self.track_bytes
    }

    /// For a request started at `t` with the head on `head`: when its transfer starts
    /// (positioning done) and when it finishes. Commands without data (flush, trim)
    /// cost the overhead only: there is no cache to write back.
    fn access(&self, head: u64, t: Nanos, request: &Request) -> (Nanos, Nanos) {
        if request.len == 0 || !matches!(request.op, Op::Read | Op::Write) {
            let end = t + self.overhead_ns;
            return (end, end);
        }
        let cylinder = self.cylinder_of(request.offset);
        let arrive = t + self.overhead_ns + self.seek_time(head.abs_diff(cylinder));
        let sector_at = (request.offset % self.track_bytes) * self.rev_ns / self.track_bytes;
        let wait = (sector_at + self.rev_ns - arrive % self.rev_ns) % self.rev_ns;
        let start = arrive + wait;
        (start, start + self.transfer_time(request.len))
    }

    /// Completes what finished by `now` and starts the next command each time the
    /// disk frees.
    fn progress(&mut self, now: Nanos) {
        while let Some(s) = self.serving.filter(|s| s.finish <= now) {
            self.serving = None;
            if s.request.len > 0 {
                self.head_cylinder = self.cylinder_of(s.request.offset + s.request.len as u64 - 1);
            }
            self.done.push(s);
            self.start_next(s.finish);
        }
    }

    /// Picks the next command at `t` (the disk just went idle): the shortest positioning
    /// time, less the aging credit, among the tagged window; the oldest on a tie.
    fn start_next(&mut self, t: Nanos) {
        let window = self.pending.len().min(self.params.queue_depth as usize);
        let weight = self.params.age_weight;
        let Some((idx, (_, finish))) = (0..window)
            .map(|i| {
                let (request, submitted) = &self.pending[i];
                let (start, finish) = self.access(self.head_cylinder, t, request);
                let credit = (t.saturating_sub(*submitted) as f64 * weight) as i64;
                (i, ((start - t) as i64 - credit, finish))
            })
            .min_by_key(|&(i, (cost, _))| (cost, i))
        else {
            return;
        };
        let (request, submitted) = self.pending.remove(idx).expect("index in window");
        self.busy_ns += finish.saturating_sub(t.max(self.measure_from));
        self.serving = Some(Finished {
            request,
            submitted,
            finish,
            busy: Some(finish - t),
        });
    }
}

impl DeviceModel for HddDevice {
    fn submit(&mut self, request: &Request, now: Nanos) -> Submitted {
        self.progress(now);
        self.pending.push_back((*request, now));
        if self.serving.is_none() {
            self.start_next(now);
        }
        Submitted::Queued
    }

    fn next_event(&self) -> Option<Nanos> {
        let done = self.done.first().map(|d| d.finish);
        let serving = self.serving.map(|s| s.finish);
        done.into_iter().chain(serving).min()
    }

    fn advance(&mut self, now: Nanos, done: &mut Vec<Finished>) {
        self.progress(now);
        done.append(&mut self.done);
    }

    fn stats(&self) -> DeviceStats {
        DeviceStats {
            write_amplification: 1.0,
            busy_ns: Some(self.busy_ns),
            ..DeviceStats::default()
        }
    }

    fn reset_stats(&mut self) {
        self.busy_ns = 0;
    }

    fn measure_from(&mut self, from: Nanos) {
        self.measure_from = from;
    }

    fn capacity_bytes(&self) -> u64 {
        self.capacity
    }

    fn clone_box(&self) -> Box<dyn DeviceModel> {
        Box::new(self.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 6,000 RPM (10 ms per revolution), 1 MB/s → 10,000-byte tracks (rounded to
    /// 9,728 = 19 sectors), 2 heads, seeks 1 ms .. 5 ms, 50 µs overhead.
    fn params(queue_depth: u32) -> HddParams {
        HddParams {
            capacity_gib: 0.01,
            rpm: 6000.0,
            media_mb_s: 1.0,
            heads: 2,
            track_to_track_ms: 1.0,
            full_stroke_ms: 5.0,
            overhead_us: 50.0,
            queue_depth,
            age_weight: 0.0,
        }
    }

    fn req(id: u64, offset: u64, len: u32) -> Request {
        Request {
            id,
            tenant: 0,
            op: Op::Read,
            offset,
            len,
            arrival: 0,
            cost: 0,
        }
    }

    #[test]
    fn geometry_and_exact_service_time() {
        let d = HddDevice::new(params(1));
        assert_eq!(d.revolution(), 10_000_000);
        assert_eq!(d.track_bytes, 9728);
        // 0.01 GiB rounded down to 4 KiB (10,735,616 bytes) / 9,728-byte tracks / 2 heads.
        assert_eq!(d.capacity_bytes(), 10_735_616);
        assert_eq!(d.cylinders(), 552);
        assert_eq!(d.seek_time(0), 0);
        assert_eq!(d.seek_time(1), 1_000_000);
        assert_eq!(d.seek_time(d.cylinders()), 5_000_000);
        // A 512-byte read of sector 0 from an idle disk at t = 0: overhead 50 µs, no
        // seek, the platter is 50 µs past sector 0, so wait 9.95 ms, then 1/19 of a
        // revolution to transfer.
        let mut d = HddDevice::new(params(1));
        assert_eq!(d.submit(&req(1, 0, 512), 0), Submitted::Queued);
        let done = crate::device::drain(&mut d);
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].finish, 10_000_000 + 512 * 10_000_000 / 9728);
    }

    #[test]
    fn sptf_serves_the_nearest_sector_first() {
        // Disk busy with a first request; two more queue behind it: one half a
        // revolution ahead of where the head will be, one just ahead. SPTF takes the
        // near one first; FIFO keeps arrival order.
        let order = |depth| {
            let mut d = HddDevice::new(params(depth));
            assert_eq!(d.submit(&req(1, 0, 512), 0), Submitted::Queued);
            assert_eq!(d.submit(&req(2, 4864, 512), 0), Submitted::Queued); // half a track further
            assert_eq!(d.submit(&req(3, 1024, 512), 0), Submitted::Queued); // right after the first request
            crate::device::drain(&mut d)
                .iter()
                .map(|f| f.request.id)
                .collect::<Vec<_>>()
        };
        assert_eq!(order(1), vec![1, 2, 3]);
        assert_eq!(order(4), vec![1, 3, 2]);
    }

    #[test]
    fn a_deeper_queue_serves_random_reads_faster() {
        use rand::{RngExt, SeedableRng};
        let elapsed = |depth| {
            let mut d = HddDevice::new(params(depth));
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
            for id in 0..200 {
                let off = rng.random_range(0..d.capacity_bytes() / 4096) * 4096;
                assert_eq!(d.submit(&req(id, off, 4096), 0), Submitted::Queued);
            }
            crate::device::drain(&mut d).last().unwrap().finish
        };
        let fifo = elapsed(1);
        let sptf = elapsed(32);
        // The 4 ms transfers are the same in both; positioning is what SPTF saves.
        assert!(sptf * 3 < fifo * 2, "sptf {sptf} fifo {fifo}");
    }

    #[test]
    fn each_request_carries_the_heads_time_it_took_and_they_add_up_to_the_busy_time() {
        use rand::{RngExt, SeedableRng};
        let mut d = HddDevice::new(params(8));
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        for id in 0..50 {
            let off = rng.random_range(0..d.capacity_bytes() / 4096) * 4096;
            let len = [512, 4096, 65536][id as usize % 3];
            assert_eq!(
                d.submit(&req(id, off, len), id * 1_000_000),
                Submitted::Queued
            );
        }
        let done = crate::device::drain(&mut d);
        assert_eq!(done.len(), 50);
        let busy: u64 = done.iter().map(|f| f.busy.expect("a disk measures")).sum();
        assert_eq!(Some(busy), d.stats().busy_ns);
        // One head: a request's time ends at its finish and none overlaps the next.
        for pair in done.windows(2) {
            let b = pair[1].busy.unwrap();
            assert!(pair[1].finish - b >= pair[0].finish, "{pair:?}");
        }
        // A request alone takes what the model says it takes.
        let mut one = HddDevice::new(params(1));
        assert_eq!(one.submit(&req(0, 0, 4096), 0), Submitted::Queued);
        let f = crate::device::drain(&mut one)[0];
        assert_eq!(f.busy, Some(f.finish));
    }
}
