//! Calibration: measure a device and fit the [`crate::device::fitted`] model to it, so
//! that a scenario's `[device]` (and the emulated backend's `backend.device`, and the
//! cost a policy charges) is the measured drive instead of numbers typed in by hand.
//!
//! The measurements are the SSD-analysis paper's kind (`specs/interference.md`: one
//! synchronous process per pattern and size) plus what a QoS controller's cost model
//! needs (iocost's and mClock's per-device parameters are per-request and per-byte
//! costs at full load):
//! * **queue depth 1**, random reads and writes of [`QD1_SIZES`], and 4 KiB sequential
//!   ones: the unit time per size (a straight line in the size, fitted to relative
//!   error: latency + size / transfer rate), and the seek (random − sequential at 4 KiB);
//! * **queue depth [`DEEP`]**, random reads and writes of [`DEEP_SIZES`]: 1 / IOPS per
//!   size is the media cost, fitted the same way (per request + per byte) — the linear
//!   [`crate::device::cost::CostModel`]; the writes run after a warm-up as long as the
//!   cache burst, so they are the sustained rate;
//! * **a write burst**: 1 MiB sequential writes at queue depth [`DEEP`] from idle,
//!   bandwidth per interval: the bytes acknowledged above the sustained rate before it
//!   settles are the write cache.
//!
//! Units (requests served at once) are what makes the QD1 unit time and the deep
//! queue's rate agree: the deep 4 KiB random rate × the QD1 4 KiB time, rounded up,
//! the larger of reads' and writes'; one when two readers get no more than one.
//!
//! Readings chosen: times are 1 / IOPS of a closed loop (what a client sees, driver
//! overheads included), not the device's service time alone; the fit is on relative
//! error, so 4 KiB and 4 MiB points count alike; a negative intercept (a device faster
//! per request than its slope says) is clamped to zero and the slope refitted.

pub use crate::characterize::runner::{ModelRunner, Runner};
use crate::characterize::{Bench, Characterization, MeasureError, Pattern, ensure};
use crate::device::fitted::FittedParams;
use crate::scenario::Scenario;
use crate::types::Op;
use serde::Serialize;
use std::fmt::Write as _;

/// Request sizes measured one at a time.
pub const QD1_SIZES: [u64; 6] = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20];
/// Request sizes measured at a deep queue.
pub const DEEP_SIZES: [u64; 3] = [4 << 10, 64 << 10, 1 << 20];
/// The deep queue's depth.
pub const DEEP: u32 = 32;
/// A QD1 time within this factor of the deep queue's time per request is media-bound.
pub const MEDIA_BOUND: f64 = 1.1;
/// Two readers getting less than this many times one reader's rate share one unit (a
/// disk arm).
pub const PAIR_PARALLEL: f64 = 1.15;
/// Two readers getting less than this many times one reader's rate (but more than
/// [`PAIR_PARALLEL`]) share a path: the fitted `shared_path_us`.
pub const PAIR_SHARED: f64 = 1.9;
/// Where every QD1 point is media-bound, the unit line is this share of the media's.
pub const UNDER_MEDIA: f64 = 0.9;

/// One closed-loop measurement: an operation, random or sequential, a size, a depth.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Probe {
    /// Read or write.
    pub op: ProbeOp,
    /// Random offsets (`false`: sequential).
    pub random: bool,
    /// Request size, bytes.
    pub size: u64,
    /// Requests kept outstanding.
    pub depth: u32,
}

/// The two directions measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ProbeOp {
    /// Reads.
    Read,
    /// Writes.
    Write,
}

impl Probe {
    /// The workload pattern name.
    fn pattern(&self) -> Pattern {
        match (self.op, self.random) {
            (ProbeOp::Read, false) => Pattern::SeqRead,
            (ProbeOp::Read, true) => Pattern::RandRead,
            (ProbeOp::Write, false) => Pattern::SeqWrite,
            (ProbeOp::Write, true) => Pattern::RandWrite,
        }
    }
}

/// What one probe measured.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Probed {
    /// The probe.
    pub probe: Probe,
    /// Requests per second.
    pub iops: f64,
    /// Bytes per second.
    pub bytes_per_s: f64,
}

/// Everything the fit uses.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Measurements {
    /// The target, in one line.
    pub target: String,
    /// Its capacity, GiB.
    pub capacity_gib: f64,
    /// Every probe, in the order of [`probes`].
    pub probes: Vec<Probed>,
    /// The burst's interval, seconds.
    pub burst_interval_s: f64,
    /// The burst's write bandwidth per interval from idle, bytes per second.
    pub burst_bytes_per_s: Vec<f64>,
    /// 4 KiB random reads beside 4 KiB random writes, at [`MIXED_DEPTHS`].
    pub mixed: Vec<Mixed>,
    /// Length of each mixed measurement, seconds.
    pub mixed_seconds: f64,
    /// Its warm-up, seconds.
    pub mixed_warmup: f64,
    /// Two 4 KiB random readers, one request each, on their own halves: reads per
    /// second together (against one reader's: one unit or more).
    pub pair_read_iops: f64,
    /// A 4 KiB sequential reader beside a 4 KiB random reader, one request each, on
    /// their own halves: the sequential reader's reads per second (does the other break
    /// its stream?).
    pub seq_beside_random_iops: f64,
    /// 64 KiB random reads beside 4 KiB random writes, one request each: reads per
    /// second (how a read's collisions grow with its size).
    pub large_read_beside_writes_iops: f64,
}

/// Depths (each side's) of the mixed measurements: one at a time, as the
/// characterize matrix's backgrounds, and half the deep queue each.
pub const MIXED_DEPTHS: [u32; 2] = [1, DEEP / 2];

/// Reads and writes at once: what each got.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Mixed {
    /// Requests each side kept outstanding.
    pub depth: u32,
    /// Reads per second.
    pub read_iops: f64,
    /// Writes per second.
    pub write_iops: f64,
}

/// How long each measurement runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timing {
    /// One probe, seconds (a fifth of it warm-up; deep writes also warm up for the burst).
    pub probe_s: f64,
    /// The burst, seconds.
    pub burst_s: f64,
    /// Intervals the burst is cut into.
    pub burst_intervals: u32,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            probe_s: 1.0,
            burst_s: 4.0,
            burst_intervals: 80,
        }
    }
}

/// The probes: QD1 random reads and writes per size, QD1 4 KiB sequential, deep random
/// per size.
pub fn probes() -> Vec<Probe> {
    let mut v = Vec::new();
    for op in [ProbeOp::Read, ProbeOp::Write] {
        for &size in &QD1_SIZES {
            v.push(Probe {
                op,
                random: true,
                size,
                depth: 1,
            });
        }
        v.push(Probe {
            op,
            random: false,
            size: 4096,
            depth: 1,
        });
        for &size in &DEEP_SIZES {
            v.push(Probe {
                op,
                random: true,
                size,
                depth: DEEP,
            });
        }
    }
    v
}

fn workload(pattern: Pattern, size: u64, depth: u32) -> String {
    format!(
        "{{ pattern = \"{}\", size = {size}, iodepth = {depth} }}",
        pattern.workload_name()
    )
}

/// Measures what the fit needs on `runner`.
pub fn measure(
    runner: &mut dyn Runner,
    timing: Timing,
    seed: u64,
    progress: bool,
) -> Result<Measurements, MeasureError> {
    let device = runner.device();
    let probes = probes();
    let dt = timing.burst_s / f64::from(timing.burst_intervals.max(1));
    let scenarios = measurement_scenarios(&device, timing, seed, &probes)?;
    let runs = runner.run(&scenarios, progress)?;
    ensure!(
        runs.len() == scenarios.len(),
        "{} results for {} measurements",
        runs.len(),
        scenarios.len()
    );
    let burst = &runs[0].timeseries;
    let burst_bytes_per_s = burst.bytes[0]
        .iter()
        .map(|&b| b as f64 / crate::types::nanos_to_secs(burst.interval))
        .collect();
    let pair = runs.last().expect("the pair ran");
    let pair_read_iops = pair.tenants[0].iops + pair.tenants[1].iops;
    let seq_beside_random_iops = runs[runs.len() - 2].tenants[0].iops;
    let large_read_beside_writes_iops = runs[runs.len() - 3].tenants[0].iops;
    let mixed = MIXED_DEPTHS
        .iter()
        .zip(&runs[1 + probes.len()..])
        .map(|(&depth, r)| Mixed {
            depth,
            read_iops: r.tenants[0].iops,
            write_iops: r.tenants[1].iops,
        })
        .collect();
    let probed = probes
        .iter()
        .zip(&runs[1..])
        .map(|(p, r)| {
            let t = &r.tenants[0];
            ensure!(
                t.ios > 0,
                "no {} request of {} completed at depth {}: the target is too slow for a \
                 {} s probe",
                p.pattern().name(),
                crate::units::format_bytes(p.size),
                p.depth,
                timing.probe_s
            );
            Ok(Probed {
                probe: *p,
                iops: t.iops,
                bytes_per_s: t.bandwidth_bytes_per_s,
            })
        })
        .collect::<Result<_, MeasureError>>()?;
    Ok(Measurements {
        target: runner.describe(),
        capacity_gib: runner.capacity_bytes() as f64 / (1u64 << 30) as f64,
        probes: probed,
        burst_interval_s: dt,
        burst_bytes_per_s,
        mixed,
        mixed_seconds: timing.burst_s + timing.probe_s,
        mixed_warmup: timing.burst_s,
        pair_read_iops,
        seq_beside_random_iops,
        large_read_beside_writes_iops,
    })
}

/// Every measurement of [`measure`] as a scenario on `device`, in the order its
/// results are read: the burst (from idle), the probes, the mixes, 64 KiB reads beside
/// writes, a sequential reader beside a random one, and the pair of readers.
fn measurement_scenarios(
    device: &toml::Table,
    timing: Timing,
    seed: u64,
    probes: &[Probe],
) -> Result<Vec<Scenario>, MeasureError> {
    let none = ["\"none\"".to_string()];
    let bench = |seconds: f64, warmup: f64, interval: f64| Bench {
        device,
        seed,
        seconds,
        warmup,
        interval,
        queue_depth: Some(DEEP),
        policies: &none,
    };
    let mut scenarios = Vec::with_capacity(probes.len() + 1);
    let dt = timing.burst_s / f64::from(timing.burst_intervals.max(1));
    // The burst first, from idle; then the probes.
    scenarios.push(
        bench(timing.burst_s, 0.0, dt)
            .scenario(&[("burst", workload(Pattern::SeqWrite, 1 << 20, DEEP))])?,
    );
    for p in probes {
        let warmup = if p.op == ProbeOp::Write && p.depth > 1 {
            timing.burst_s
        } else {
            timing.probe_s / 5.0
        };
        scenarios.push(
            bench(warmup + timing.probe_s, warmup, timing.probe_s / 5.0)
                .scenario(&[("probe", workload(p.pattern(), p.size, p.depth))])?,
        );
    }
    for &depth in &MIXED_DEPTHS {
        scenarios.push(mixed_scenario(
            &bench(
                timing.burst_s + timing.probe_s,
                timing.burst_s,
                timing.probe_s / 5.0,
            ),
            depth,
        )?);
    }
    // 64 KiB reads beside 4 KiB writes: how collisions grow with a read's size.
    scenarios.push(large_read_scenario(&bench(
        timing.burst_s + timing.probe_s,
        timing.burst_s,
        timing.probe_s / 5.0,
    ))?);
    // A sequential reader beside a random one: whether the other breaks its stream.
    scenarios.push(seq_beside_random_scenario(&bench(
        timing.probe_s,
        timing.probe_s / 5.0,
        timing.probe_s / 5.0,
    ))?);
    // Two readers one request each, on their own halves: one unit or more.
    scenarios.push(
        bench(timing.probe_s, timing.probe_s / 5.0, timing.probe_s / 5.0).scenario(&[
            ("a", workload(Pattern::RandRead, 4096, 1)),
            ("b", workload(Pattern::RandRead, 4096, 1)),
        ])?,
    );
    Ok(scenarios)
}

/// 64 KiB random reads beside 4 KiB random writes, one request each.
fn large_read_scenario(bench: &Bench) -> Result<Scenario, MeasureError> {
    Ok(bench.scenario(&[
        ("reads", workload(Pattern::RandRead, 64 << 10, 1)),
        ("writes", workload(Pattern::RandWrite, 4096, 1)),
    ])?)
}

/// A 4 KiB sequential reader beside a 4 KiB random reader, one request each.
fn seq_beside_random_scenario(bench: &Bench) -> Result<Scenario, MeasureError> {
    Ok(bench.scenario(&[
        ("seq", workload(Pattern::SeqRead, 4096, 1)),
        ("rand", workload(Pattern::RandRead, 4096, 1)),
    ])?)
}

/// 4 KiB random reads beside 4 KiB random writes, `depth` each.
fn mixed_scenario(bench: &Bench, depth: u32) -> Result<Scenario, MeasureError> {
    Ok(bench.scenario(&[
        ("reads", workload(Pattern::RandRead, 4096, depth)),
        ("writes", workload(Pattern::RandWrite, 4096, depth)),
    ])?)
}

/// `a + c · s` fitted to points `(s, t)` on relative error; `a ≥ 0`, `c ≥ 0`.
pub fn fit_line(points: &[(f64, f64)]) -> (f64, f64) {
    let w = |t: f64| 1.0 / (t * t);
    let (mut sw, mut sws, mut swss, mut swt, mut swst) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for &(s, t) in points {
        let wi = w(t);
        sw += wi;
        sws += wi * s;
        swss += wi * s * s;
        swt += wi * t;
        swst += wi * s * t;
    }
    let det = sw * swss - sws * sws;
    let (a, c) = if det.abs() > f64::EPSILON * sw * swss {
        (
            (swt * swss - sws * swst) / det,
            (sw * swst - sws * swt) / det,
        )
    } else {
        (swt / sw, 0.0)
    };
    if a < 0.0 {
        (0.0, (swst / swss).max(0.0))
    } else if c < 0.0 {
        (swt / sw, 0.0)
    } else {
        (a, c)
    }
}

/// The write cache a burst shows, and the sustained rate (the mean of the last third).
/// The cache is how far the bytes acknowledged ran ahead of the sustained rate (the
/// largest lead of the running total over the sustained line), less how far they
/// wander from it while sustained (the same lead within the last third): a target
/// that acknowledges in clumps (every few intervals, as through a FUSE mount) shows
/// clumps, not a cache. Less than two intervals of the sustained rate is no cache.
pub fn cache_from_burst(bytes_per_s: &[f64], interval_s: f64) -> (f64, f64) {
    let n = bytes_per_s.len();
    if n < 3 {
        return (0.0, bytes_per_s.last().copied().unwrap_or(0.0));
    }
    let tail = &bytes_per_s[n * 2 / 3..];
    let steady = tail.iter().sum::<f64>() / tail.len() as f64;
    // The largest lead of the running total over `steady` from the start of `rates`.
    let lead = |rates: &[f64]| {
        let mut total = 0.0;
        let mut most: f64 = 0.0;
        for (i, b) in rates.iter().enumerate() {
            total += b * interval_s;
            most = most.max(total - steady * interval_s * (i + 1) as f64);
        }
        most
    };
    let cache = lead(bytes_per_s) - lead(tail);
    // Less than two intervals' worth is a rate settling, not a cache.
    if cache < 2.0 * steady * interval_s {
        return (0.0, steady);
    }
    (cache, steady)
}

fn point(m: &Measurements, op: ProbeOp, random: bool, depth: u32) -> Vec<(f64, f64)> {
    m.probes
        .iter()
        .filter(|p| p.probe.op == op && p.probe.random == random && p.probe.depth == depth)
        .map(|p| (p.probe.size as f64, 1e6 / p.iops))
        .collect()
}

/// The fitted model's parameters from measurements (µs and MB/s; sizes in bytes, so
/// a slope in µs per byte is 1 / MB/s).
pub fn fit(m: &Measurements) -> Result<FittedParams, MeasureError> {
    let read = fit_side(m, ProbeOp::Read)?;
    let write = fit_side(m, ProbeOp::Write)?;
    let (units, shared_path_us) = fit_units(m, &read, &write);
    // The burst's sustained rate is in 1 MiB writes; the cache is measured in them.
    let (cache_bytes, _) = cache_from_burst(&m.burst_bytes_per_s, m.burst_interval_s);
    let mut p = FittedParams {
        capacity_gib: m.capacity_gib,
        units,
        read_latency_us: read.latency_us,
        read_transfer_mb_s: read.transfer_mb_s.min(1.0e6),
        write_latency_us: write.latency_us,
        write_transfer_mb_s: write.transfer_mb_s.min(1.0e6),
        read_random_us: read.random_us,
        write_random_us: write.random_us,
        read_request_us: read.request_us,
        read_media_mb_s: read.media_mb_s,
        write_request_us: write.request_us,
        write_media_mb_s: write.media_mb_s,
        write_cache_mib: cache_bytes / (1u64 << 20) as f64,
        writes_delay_reads: 1.0,
        reads_delay_writes: 1.0,
        read_collision_us: 0.0,
        shared_path_us,
        sequential_break: 0.0,
        collision_spread: 0,
        read_points: read.points,
        write_points: write.points,
    };
    fit_reads_delay_writes(m, &mut p);
    fit_writes_delay_reads(m, &mut p)?;
    fit_collision_spread(m, &mut p)?;
    fit_sequential_break(m, &mut p)?;
    crate::device::fitted::check(&p).map_err(|invalid| MeasureError::Device {
        table: "fitted",
        invalid,
    })?;
    Ok(p)
}

/// One direction's fit (reads or writes): its unit and media lines.
struct Side {
    latency_us: f64,
    transfer_mb_s: f64,
    random_us: f64,
    request_us: f64,
    media_mb_s: f64,
    t4k_us: f64,
    points: Vec<[f64; 2]>,
}

/// The unit and media lines of `op` from the queue-depth-1 and deep-queue points.
fn fit_side(m: &Measurements, op: ProbeOp) -> Result<Side, MeasureError> {
    let qd1 = point(m, op, true, 1);
    let seq = point(m, op, false, 1);
    let deep = point(m, op, true, DEEP);
    ensure!(
        qd1.len() >= 2 && !seq.is_empty() && deep.len() >= 2,
        "too few {op:?} measurements to fit"
    );
    let (r, mc) = fit_line(&deep);
    // A QD1 stream within 10 % of the deep queue's rate is held by the media, not
    // by its unit: the unit line is fitted to the other points, and put under the
    // media line (by UNDER_MEDIA) where fewer than two are.
    let media = |size: f64| r + mc * size;
    let bound =
        |size: f64, t: f64| (UNDER_MEDIA * media(size)..=MEDIA_BOUND * media(size)).contains(&t);
    let free: Vec<(f64, f64)> = qd1
        .iter()
        .copied()
        .filter(|&(size, t)| !bound(size, t))
        .collect();
    let (a, c) = if free.len() >= 2 {
        fit_line(&free)
    } else {
        (UNDER_MEDIA * r, UNDER_MEDIA * mc)
    };
    let t4k_rand = qd1[0].1;
    let t4k_seq = seq[0].1;
    let random_us = (t4k_rand - t4k_seq).max(0.0);
    Ok(Side {
        latency_us: (a - random_us).max(0.0),
        transfer_mb_s: if c > 0.0 { 1.0 / c } else { 1.0e6 },
        random_us,
        request_us: (r - random_us).max(0.0),
        media_mb_s: if mc > 0.0 {
            (1.0 / mc).min(1.0e6)
        } else {
            1.0e6
        },
        t4k_us: t4k_rand,
        // The measured times, media-bound ones under the media line.
        points: qd1
            .iter()
            .map(|&(size, t)| {
                // Faster than the media (a write acknowledged from a cache) stays.
                if bound(size, t) {
                    [size, UNDER_MEDIA * media(size)]
                } else {
                    [size, t]
                }
            })
            .collect(),
    })
}

/// How many requests the device serves at once, and a shared path's batch time.
fn fit_units(m: &Measurements, read: &Side, write: &Side) -> (u32, f64) {
    let units = |s: &Side, op: ProbeOp| {
        let deep4k = point(m, op, true, DEEP)[0].1;
        // Up, but not for noise just past a whole number.
        (s.t4k_us / deep4k - 0.1).ceil().clamp(1.0, f64::from(DEEP)) as u32
    };
    // Two readers that get no more than one (a disk arm, seeking between them) mean
    // one unit, whatever the deep queue gains (a disk's reordering is not units).
    let one_reader = point(m, ProbeOp::Read, true, 1)[0].1;
    let pair = m.pair_read_iops * one_reader * 1e-6;
    let units = if pair < PAIR_PARALLEL {
        1
    } else {
        units(read, ProbeOp::Read).max(units(write, ProbeOp::Write))
    };
    // Two readers that get more than one but well under two, where the deep queue
    // gains more (a virtual disk's host path, which carries a deep queue many requests
    // at a time but two synchronous streams one at a time): the shared path's batch
    // time. Two streams phase-locked on it take two batches a cycle, so the batch is
    // half of what each stream's request took beside the other.
    let shared_path_us = if (PAIR_PARALLEL..PAIR_SHARED).contains(&pair) && units > 1 {
        // Never longer than a 4 KiB request takes alone: the path is part of it.
        let write_4k = point(m, ProbeOp::Write, true, 1)[0].1;
        (1e6 / m.pair_read_iops).min(one_reader).min(write_4k)
    } else {
        0.0
    };
    (units, shared_path_us)
}

/// What reads take from writes: at half the deep queue each the write clock is full,
/// so the share of the reads' time writes lost is what the writes' own use leaves of it.
fn fit_reads_delay_writes(m: &Measurements, p: &mut FittedParams) {
    if let Some(mix) = m.mixed.iter().find(|x| x.depth > 1) {
        let cost = p.cost_model();
        let reads = mix.read_iops * cost.cost(Op::Read, 0, 4096, true) * 1e-9;
        let writes = mix.write_iops * cost.cost(Op::Write, 0, 4096, true) * 1e-9;
        if reads > 0.0 {
            p.reads_delay_writes = ((1.0 - writes) / reads).clamp(0.0, 1.0);
        }
    }
}

/// What writes make reads wait (see the comment inside).
fn fit_writes_delay_reads(m: &Measurements, p: &mut FittedParams) -> Result<(), MeasureError> {
    // What writes make reads wait: a reader beside a writer, one request each. With a
    // cache the burst saw, the share of the queued writes a read waits for; without,
    // the smallest cache whose backlog slows the model's reader as much (a cache too
    // small for the burst's intervals still holds programs a read waits behind).
    if let Some(mix) = m.mixed.iter().find(|x| x.depth == 1) {
        // In the window the target's mix was measured in: a cache's backlog grows
        // over it.
        let reads_with = |q: FittedParams| {
            first_tenant_iops(&q, m.mixed_seconds, m.mixed_warmup, |b| {
                mixed_scenario(b, 1)
            })
        };
        let target = mix.read_iops;
        // The write in progress a read finds (a program on its die, when a cache or a
        // shallow queue keeps the backlog short): the collision time that slows the
        // model's reader as much, up to 100 ms.
        let collision = |p: &FittedParams| -> Result<f64, MeasureError> {
            let collide = |us: f64| FittedParams {
                read_collision_us: us,
                ..p.clone()
            };
            Ok(
                bisect(0.0, 100_000.0, |us| Ok(reads_with(collide(us))? > target))?
                    .unwrap_or(100_000.0),
            )
        };
        if p.write_cache_mib > 0.0 {
            let share = |k: f64| FittedParams {
                writes_delay_reads: k,
                ..p.clone()
            };
            // Out of reach: reads wait for all of the queued writes, and still less
            // than measured; the rest is collisions.
            match bisect(0.0, 1.0, |k| Ok(reads_with(share(k))? > target))? {
                Some(k) => p.writes_delay_reads = k,
                None => {
                    p.writes_delay_reads = 1.0;
                    p.read_collision_us = collision(p)?;
                }
            }
        } else {
            let cache = |mib: f64| FittedParams {
                write_cache_mib: mib,
                ..p.clone()
            };
            if reads_with(cache(0.0))? > 1.1 * target {
                // Up to a backlog the writer could build in the measured window; a
                // target out of reach (the writer never outpaces the media, so no
                // backlog builds whatever the cache) keeps no cache.
                let units_rate = f64::from(p.units) * 4096.0
                    / (p.unit_time(Op::Write, 4096, true) as f64 * 1e-9)
                    / 1e6;
                let hi = m.mixed_seconds * units_rate.max(p.write_media_mb_s) * 1e6
                    / (1u64 << 20) as f64;
                match bisect(0.0, hi.max(1.0), |mib| Ok(reads_with(cache(mib))? > target))? {
                    Some(mib) => p.write_cache_mib = mib,
                    None => p.read_collision_us = collision(p)?,
                }
            }
        }
    }
    Ok(())
}

/// How far a read's collisions spread with its size.
fn fit_collision_spread(m: &Measurements, p: &mut FittedParams) -> Result<(), MeasureError> {
    // How far a read's collisions spread with its size: the spread (in 4 KiB units,
    // 0 for all of them) whose model comes nearest the 64 KiB reads beside the writer.
    if p.read_collision_us > 0.0 && m.large_read_beside_writes_iops > 0.0 {
        let large_with = |spread: u32| {
            let q = FittedParams {
                collision_spread: spread,
                ..p.clone()
            };
            first_tenant_iops(&q, m.mixed_seconds, m.mixed_warmup, large_read_scenario)
        };
        let target = m.large_read_beside_writes_iops;
        let mut best = (f64::INFINITY, 0);
        for spread in [1, 2, 4, 8, 0] {
            let miss = (large_with(spread)? / target).ln().abs();
            if miss < best.0 - 1e-9 {
                best = (miss, spread);
            }
        }
        p.collision_spread = best.1;
    }
    Ok(())
}

/// Whether another tenant's reads break a sequential stream.
fn fit_sequential_break(m: &Measurements, p: &mut FittedParams) -> Result<(), MeasureError> {
    // Whether another tenant's reads break a sequential stream (a disk arm moving away,
    // a flash die's register emptied): the share of the sequential saving lost that
    // slows the model's sequential reader beside a random one as much as the target's.
    if p.read_random_us > 0.0 && m.seq_beside_random_iops > 0.0 {
        let probe_s = m.mixed_seconds - m.mixed_warmup;
        let seq_with = |k: f64| {
            let q = FittedParams {
                sequential_break: k,
                ..p.clone()
            };
            first_tenant_iops(&q, probe_s, probe_s / 5.0, seq_beside_random_scenario)
        };
        let target = m.seq_beside_random_iops;
        p.sequential_break = bisect(0.0, 1.0, |k| Ok(seq_with(k)? > target))?.unwrap_or(1.0);
    }
    Ok(())
}

/// Runs one measurement's scenario (`seconds` long after `warmup`, as the target's
/// was) on the model `p`: its first tenant's requests per second.
fn first_tenant_iops(
    p: &FittedParams,
    seconds: f64,
    warmup: f64,
    scenario: impl Fn(&Bench) -> Result<Scenario, MeasureError>,
) -> Result<f64, MeasureError> {
    let table = device_table(p);
    let none = ["\"none\"".to_string()];
    let bench = Bench {
        device: &table,
        seed: 1,
        seconds,
        warmup,
        interval: (seconds - warmup) / 5.0,
        queue_depth: Some(DEEP),
        policies: &none,
    };
    let r = ModelRunner {
        device: table.clone(),
    }
    .run(&[scenario(&bench)?], false)?;
    Ok(r[0].tenants[0].iops)
}

/// The smallest `x` in `[lo, hi]` (to 1/2^20 of the span) where `above(x)` is false,
/// `above` true below some point and false past it: `lo` when it is false already,
/// `None` when it is still true at `hi` (nothing in the range reaches the target).
fn bisect(
    mut lo: f64,
    mut hi: f64,
    mut above: impl FnMut(f64) -> Result<bool, MeasureError>,
) -> Result<Option<f64>, MeasureError> {
    if !above(lo)? {
        return Ok(Some(lo));
    }
    if above(hi)? {
        return Ok(None);
    }
    for _ in 0..20 {
        let mid = 0.5 * (lo + hi);
        if above(mid)? {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok(Some(hi))
}

/// The `[device]` table of fitted parameters.
pub fn device_table(p: &FittedParams) -> toml::Table {
    /// Six significant digits: what a measurement supports, and a file one can read.
    fn round(v: &mut toml::Value) {
        match v {
            toml::Value::Float(x) if *x != 0.0 && x.is_finite() => {
                let scale = 10f64.powi(5 - x.abs().log10().floor() as i32);
                *x = (*x * scale).round() / scale;
            }
            // A point's size is a byte count: kept whole.
            toml::Value::Array(a) if a.len() == 2 && a.iter().all(toml::Value::is_float) => {
                round(&mut a[1])
            }
            toml::Value::Array(a) => a.iter_mut().for_each(round),
            _ => {}
        }
    }
    let mut t = toml::Table::try_from(p).expect("parameters serialize");
    t.iter_mut().for_each(|(_, v)| round(v));
    t.insert("model".into(), "fitted".into());
    t
}

/// The file `calibrate --out` writes: a comment with what was measured, then the
/// `[device]` table.
pub fn device_file(p: &FittedParams, m: &Measurements) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# Fitted by `ioshare calibrate` to {}.", m.target);
    let _ = writeln!(
        s,
        "# Use it as a scenario's [device], the emulated backend's `backend.device`, a live"
    );
    let _ = writeln!(
        s,
        "# server's `backend.cost_device`, or `characterize --cost-device`."
    );
    let mut root = toml::Table::new();
    root.insert("device".into(), toml::Value::Table(device_table(p)));
    s.push_str(&toml::to_string(&root).expect("a TOML table serializes"));
    s
}

/// One cell of the check: the target's foreground bandwidth beside the model's.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CellError {
    /// Pattern name.
    pub pattern: String,
    /// Size, bytes.
    pub size: u64,
    /// Background name.
    pub background: String,
    /// Measured on the target, bytes per second.
    pub measured: f64,
    /// On the model, bytes per second.
    pub model: f64,
    /// model / measured − 1.
    pub error: f64,
}

/// The model against the target, cell by cell, with the median and 90th percentile of
/// the absolute errors.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Check {
    /// Every cell both matrices have.
    pub cells: Vec<CellError>,
    /// Median absolute error.
    pub median: f64,
    /// 90th percentile absolute error.
    pub p90: f64,
    /// Largest absolute error.
    pub max: f64,
}

/// Compares two characterizations (same sizes; the first policy of each).
pub fn check(measured: &Characterization, model: &Characterization) -> Check {
    let policy = |c: &Characterization| c.policies.first().cloned().unwrap_or_default();
    let (pm, pf) = (policy(measured), policy(model));
    let mut cells = Vec::new();
    for c in measured.cells.iter().filter(|c| c.policy == pm) {
        if let Some(f) = model.cell(c.pattern, c.size, c.background, &pf)
            && c.foreground_bytes_per_s > 0.0
        {
            cells.push(CellError {
                pattern: c.pattern.name().into(),
                size: c.size,
                background: c.background.name().into(),
                measured: c.foreground_bytes_per_s,
                model: f.foreground_bytes_per_s,
                error: f.foreground_bytes_per_s / c.foreground_bytes_per_s - 1.0,
            });
        }
    }
    let mut abs: Vec<f64> = cells.iter().map(|c| c.error.abs()).collect();
    abs.sort_by(f64::total_cmp);
    let at = |q: f64| {
        if abs.is_empty() {
            0.0
        } else {
            abs[((abs.len() - 1) as f64 * q).round() as usize]
        }
    };
    Check {
        median: at(0.5),
        p90: at(0.9),
        max: abs.last().copied().unwrap_or(0.0),
        cells,
    }
}

impl Check {
    /// The table `calibrate` prints.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{:<11} {:>6} {:<10} {:>11} {:>11} {:>7}",
            "pattern", "size", "background", "measured", "model", "error"
        );
        for c in &self.cells {
            let _ = writeln!(
                out,
                "{:<11} {:>6} {:<10} {:>11.1} {:>11.1} {:>+6.1}%",
                c.pattern,
                crate::characterize::short_size(c.size),
                c.background,
                c.measured / 1e6,
                c.model / 1e6,
                c.error * 100.0
            );
        }
        let _ = writeln!(
            out,
            "{} cells (MB/s): median error {:.1} %, 90th percentile {:.1} %, largest {:.1} %",
            self.cells.len(),
            self.median * 100.0,
            self.p90 * 100.0,
            self.max * 100.0
        );
        out
    }
}

impl Measurements {
    /// The measurements, one line each.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "measured {}", self.target);
        for p in &self.probes {
            let _ = writeln!(
                out,
                "  {:<10} {:>5} QD{:<3} {:>10.0} IOPS {:>9.1} MB/s {:>10.1} µs/request",
                p.probe.pattern().name(),
                crate::characterize::short_size(p.probe.size),
                p.probe.depth,
                p.iops,
                p.bytes_per_s / 1e6,
                1e6 / p.iops
            );
        }
        let (cache, steady) = cache_from_burst(&self.burst_bytes_per_s, self.burst_interval_s);
        let first = self.burst_bytes_per_s.first().copied().unwrap_or(0.0);
        for x in &self.mixed {
            let _ = writeln!(
                out,
                "  4K rand-read QD{0} beside 4K rand-write QD{0}: {1:.0} + {2:.0} IOPS",
                x.depth, x.read_iops, x.write_iops
            );
        }
        let _ = writeln!(
            out,
            "  two 4K rand-read QD1 streams: {:.0} IOPS together",
            self.pair_read_iops
        );
        let _ = writeln!(
            out,
            "  write burst (1 MiB, QD{DEEP}): {:.1} MB/s at first, {:.1} MB/s sustained, \
             cache {:.1} MiB",
            first / 1e6,
            steady / 1e6,
            cache / (1u64 << 20) as f64
        );
        out
    }
}

#[cfg(test)]
mod tests;
