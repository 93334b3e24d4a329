//! What a scenario will cost before it runs: the SSD model's memory and aging time, the
//! time series' bins, and the requests a run will simulate: what open loops offer, plus,
//! where a closed loop keeps the device busy, as many as the device could complete at
//! the smallest request size the tenants send (an upper bound from its links and
//! units, not a prediction). `ioshare sim` refuses a
//! scenario past [`Limits`] with the estimate in the message (`--force` runs it
//! anyway), instead of aborting on an allocation or running for days.
//!
//! The per-GiB figures were measured with `ioshare precondition` on the development
//! machine (2 vCPUs): 32 GiB `nvme-p4500` and `sata-840pro` models held 74–78 MB
//! resident and aged one pass in 2.9–3.2 s. They are rounded up.

use super::Scenario;
use crate::device::hdd::HddParams;
use crate::device::spec::DeviceSpec;
use crate::device::ssd::Precondition;
use crate::workload::{Arrivals, SizeDist};

/// Resident bytes of the SSD model per GiB of logical capacity.
pub const SSD_BYTES_PER_GIB: f64 = 2.5e6;
/// Seconds of aging per GiB and pass.
pub const AGING_SECONDS_PER_GIB_PASS: f64 = 0.1;
/// Bytes a tenant's time series keeps per interval and policy (one row of counters).
pub const BIN_BYTES: f64 = 256.0;

/// What a scenario is estimated to cost, per policy run where it says so.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cost {
    /// Memory the device model and the time series take, bytes.
    pub memory_bytes: f64,
    /// Of which the time series of all policies' runs (kept until the report is
    /// written; a sweep keeps every point's).
    pub series_bytes: f64,
    /// Of which one device model (a run holds two: the one built and its copy).
    pub device_bytes: f64,
    /// Seconds to age the SSD model before the runs (0 for other devices).
    pub aging_seconds: f64,
    /// Requests one policy's run simulates at most: what the open-loop tenants offer,
    /// plus the device's bound over the run when a closed loop keeps it busy.
    pub requests: f64,
}

/// Above these a scenario is refused unless forced.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// Bytes of memory.
    pub memory_bytes: f64,
    /// Seconds of aging.
    pub aging_seconds: f64,
    /// Requests simulated in one policy's run.
    pub requests: f64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            memory_bytes: 8.0 * (1u64 << 30) as f64,
            aging_seconds: 600.0,
            requests: 1.0e9,
        }
    }
}

/// The most requests of `size` bytes a second the device can complete: its host link
/// (SSD, array), its media and per-command time (disk), its units (fixed model). A
/// bound, often far above what a run gets (GC, seeks).
pub fn iops_bound(device: &DeviceSpec, size: f64) -> f64 {
    let disk = |p: &HddParams| 1e6 / (p.overhead_us + size / p.media_mb_s);
    match device {
        DeviceSpec::Fixed(p) => {
            f64::from(p.parallelism) * 1e6 / (p.latency_us + size / p.bandwidth_mb_s)
        }
        // Every request takes its cost from the media clock.
        // Reads and writes on their own clocks at once; within the cache writes go at
        // the units' pace.
        DeviceSpec::Fitted(p) => {
            use crate::types::Op;
            let cost = p.cost_model();
            let len = size.clamp(1.0, f64::from(u32::MAX)) as u32;
            let reads = 1e9 / cost.cost(Op::Read, 0, len, false).max(1.0);
            let mut writes = 1e9 / cost.cost(Op::Write, 0, len, false).max(1.0);
            if p.write_cache_mib > 0.0 {
                let unit = p.unit_time(Op::Write, len, false) as f64;
                writes = writes.max(f64::from(p.units) * 1e9 / unit.max(1.0));
            }
            reads + writes
        }
        // A request takes whole pages of the link, in one direction (half duplex) or
        // each (full duplex: reads and writes at once), and one command time.
        DeviceSpec::Ssd { params, .. } => {
            let directions = if params.half_duplex { 1.0 } else { 2.0 };
            // 1e6 / 0 is infinite: no command cap.
            (directions * params.host_mb_s * 1e6 / size.max(4096.0)).min(1e6 / params.command_us)
        }
        DeviceSpec::Hdd { params, .. } => disk(params),
        DeviceSpec::Raid0 { params, .. } => (f64::from(params.members) * disk(&params.member))
            .min(f64::from(params.host_links) * params.host_link_mb_s * 1e6 / size),
    }
}

impl Scenario {
    /// The scenario's estimated cost.
    pub fn cost(&self) -> Cost {
        let (device_bytes, aging_seconds) = match &self.device {
            DeviceSpec::Ssd {
                params,
                precondition,
                aging_passes,
                ..
            } => {
                let aging = match precondition {
                    Precondition::Aged => {
                        params.capacity_gib * aging_passes * AGING_SECONDS_PER_GIB_PASS
                    }
                    _ => 0.0,
                };
                (params.capacity_gib * SSD_BYTES_PER_GIB, aging)
            }
            _ => (0.0, 0.0),
        };
        let seconds = self.duration as f64 / 1e9;
        let bins = (seconds / (self.interval.max(1) as f64 / 1e9)).ceil();
        let series = bins * self.tenants.len() as f64 * BIN_BYTES * self.policies.len() as f64;
        let open_requests: f64 = self
            .tenants
            .iter()
            .flat_map(|t| &t.workload.phases)
            .map(|p| match p.arrivals {
                Arrivals::Open { rate_iops, .. } => {
                    let end = p.end.unwrap_or(self.duration).min(self.duration);
                    rate_iops * end.saturating_sub(p.start) as f64 / 1e9
                }
                _ => 0.0,
            })
            .sum();
        let closed = self.tenants.iter().any(|t| {
            t.workload
                .phases
                .iter()
                .any(|p| matches!(p.arrivals, Arrivals::Closed { .. }))
        });
        let closed_requests = if closed {
            let smallest = self
                .tenants
                .iter()
                .flat_map(|t| &t.workload.phases)
                .filter(|p| matches!(p.arrivals, Arrivals::Closed { .. }))
                .map(|p| match p.size {
                    SizeDist::Fixed(n) => n,
                    SizeDist::Uniform { min, .. } => min,
                })
                .min()
                .unwrap_or(4096)
                .max(512);
            iops_bound(&self.device, f64::from(smallest)) * seconds
        } else {
            0.0
        };
        Cost {
            memory_bytes: 2.0 * device_bytes + series,
            series_bytes: series,
            device_bytes,
            aging_seconds,
            requests: open_requests + closed_requests,
        }
    }

    /// Why the scenario is refused under `limits`, with the estimate; `None` when it is
    /// within them.
    pub fn too_costly(&self, limits: Limits) -> Option<String> {
        let c = self.cost();
        if c.memory_bytes > limits.memory_bytes {
            let bins = crate::config::shown(
                (self.duration as f64 / self.interval.max(1) as f64).ceil()
                    * self.tenants.len() as f64,
            );
            let what = match &self.device {
                DeviceSpec::Ssd { params, .. } => format!(
                    "the SSD model at {} GiB, and {bins} time-series bins",
                    params.capacity_gib
                ),
                _ => format!("{bins} time-series bins: interval_s against duration_s"),
            };
            return Some(format!(
                "it would take about {:.1} GiB of memory ({what}), more than {:.0} GiB",
                c.memory_bytes / (1u64 << 30) as f64,
                limits.memory_bytes / (1u64 << 30) as f64
            ));
        }
        if c.aging_seconds > limits.aging_seconds {
            return Some(format!(
                "aging the SSD model would take about {:.0} s (capacity × aging_passes), more than {:.0} s",
                c.aging_seconds, limits.aging_seconds
            ));
        }
        if c.requests > limits.requests {
            return Some(format!(
                "it could simulate about {} requests per policy (open loops' rate_iops, and closed loops as fast as the device serves its smallest requests, × duration_s), more than {} (about a million a second on two cores)",
                if c.requests >= 1e6 {
                    format!("{:.2e}", c.requests)
                } else {
                    format!("{:.0}", c.requests)
                },
                crate::config::shown(limits.requests)
            ));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scenario(text: &str) -> Scenario {
        Scenario::parse(text, "t.toml", "t").unwrap()
    }

    const TENANT: &str =
        "[[tenant]]\nname = 'a'\nworkload = { pattern = 'randread', rate_iops = 1000 }\n";

    #[test]
    fn estimates_follow_capacity_passes_duration_and_rates() {
        let s = scenario(&format!(
            "duration_s = 10\n[device]\nmodel = 'ssd'\npreset = 'nvme-p4500'\ncapacity_gib = 32\nprecondition = 'aged'\naging_passes = 2\n{TENANT}"
        ));
        let c = s.cost();
        assert_eq!(c.aging_seconds, 32.0 * 2.0 * AGING_SECONDS_PER_GIB_PASS);
        assert_eq!(c.requests, 10_000.0);
        assert!(c.memory_bytes >= 32.0 * SSD_BYTES_PER_GIB);
        assert_eq!(s.too_costly(Limits::default()), None);
        let tight = Limits {
            aging_seconds: 1.0,
            ..Limits::default()
        };
        assert!(
            s.too_costly(tight)
                .unwrap()
                .contains("aging the SSD model would take about 6 s")
        );
    }

    /// The SSD's bound: whole pages on the link (one direction or two), and no more
    /// commands than its command time allows; idle and open phases set no size.
    #[test]
    fn the_ssd_bound_counts_pages_directions_and_commands() {
        let ssd = |extra: &str| {
            scenario(&format!(
                "duration_s = 10\n[device]\nmodel = 'ssd'\npreset = 'sata-840pro'\ncapacity_gib = 1\n{extra}\n[[tenant]]\nname = 'a'\nworkload = {{ pattern = 'randread', size = 512, iodepth = 4 }}\n[[tenant]]\nname = 'b'\nworkload = {{ pattern = 'randread', size = '256b', rate_iops = 10.0 }}\n"
            ))
        };
        // 10 µs commands: 100 K a second, under the link's 2 × 550 MB/s / 4 KiB.
        let c = ssd("command_us = 10.0").cost();
        assert_eq!(c.requests, 100.0 + 100_000.0 * 10.0);
        // Without the command cap, the full-duplex link at whole pages; half duplex halves it.
        let c = ssd("command_us = 0.0\nhalf_duplex = false").cost();
        assert_eq!(c.requests, 100.0 + 2.0 * 550e6 / 4096.0 * 10.0);
        let c = ssd("command_us = 0.0\nhalf_duplex = true").cost();
        assert_eq!(c.requests, 100.0 + 550e6 / 4096.0 * 10.0);
        // Two device copies and the series.
        assert_eq!(c.memory_bytes, 2.0 * c.device_bytes + c.series_bytes);
    }

    fn hour_to(s: &Scenario, secs: u64) -> Scenario {
        let mut s = s.clone();
        s.duration = secs * 1_000_000_000;
        s
    }

    #[test]
    fn a_huge_drive_a_long_open_loop_and_tiny_intervals_are_refused() {
        let huge = scenario(&format!(
            "duration_s = 1\n[device]\nmodel = 'ssd'\npreset = 'nvme-p4500'\ncapacity_gib = 4096\n{TENANT}"
        ));
        assert!(
            huge.too_costly(Limits::default())
                .unwrap()
                .contains("GiB of memory")
        );
        let long = scenario(&format!(
            "duration_s = 1e7\n[device]\nmodel = 'fixed'\n{TENANT}"
        ));
        assert!(
            long.too_costly(Limits::default())
                .unwrap()
                .contains("about 1.00e10 requests per policy")
        );
        // A closed loop is bounded by the device: the fixed model's 8 units of 100 µs +
        // 4 KiB at 500 MB/s (108.192 µs) complete at most 73,942 requests a second.
        let closed = "[[tenant]]\nname = 'a'\nworkload = { pattern = 'randread', size = '4k', iodepth = 8 }\n";
        let hour = scenario(&format!(
            "duration_s = 3600\ninterval_s = 10\n[device]\nmodel = 'fixed'\nlatency_us = 100.0\nbandwidth_mb_s = 500.0\nparallelism = 8\n{closed}"
        ));
        let bound = 8.0 * 1e6 / (100.0 + 4096.0 / 500.0);
        assert_eq!(hour.cost().requests, bound * 3600.0);
        assert_eq!(hour.too_costly(Limits::default()), None);
        let day = hour_to(&hour, 86_400);
        assert!(
            day.too_costly(Limits::default())
                .unwrap()
                .contains("it could simulate about 6.39e9 requests per policy"),
            "{:?}",
            day.too_costly(Limits::default())
        );
        let fine = scenario(&format!(
            "duration_s = 1000\ninterval_s = 1e-6\n[device]\nmodel = 'fixed'\n{TENANT}"
        ));
        assert!(
            fine.too_costly(Limits::default())
                .unwrap()
                .contains("time-series bins")
        );
    }
}
