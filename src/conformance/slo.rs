//! The SLO part of the conformance suite: the token-bucket policies (TA1/TA2/TA3, Kim,
//! Kim and Eom, "I/O scheduling with response-time SLOs by token buckets", `specs/`
//! token-bucket paper, §3–§4) and mClock's reservations judged on the tenant they exist
//! to protect — a *compliant* tenant, one that sends no more than its SLO's IOPS —
//! in mixes no paper ran: evenly spaced, Poisson and bursty arrivals (on/off, Pareto:
//! at 0.8 of the SLO's rate, within its default burst), equal and mixed response time
//! targets, 1–8 SLO tenants beside 0–4 flooders (some with SLOs they exceed, some
//! without any, some weighted 1:4 and ×10⁵, one that comes and goes, a sequential
//! reader beside a random one), 1,024 SLO tenants with reservations beside two
//! flooders, on an aged and a clean NVMe SSD, a single 10k RPM disk and the paper's
//! RAID 0 array.
//!
//! Each case is run twice from the same preconditioned device:
//! * the **feasibility run**: every tenant with an SLO offers exactly its SLO (with the
//!   case's arrivals), tenants without one are left out, under `none`. The SLOs are
//!   *jointly feasible* when every tenant then completes ≥ 99.5 % within its rt: the
//!   device can serve every SLO at once, and the policies are held to their targets
//!   only there (an infeasible case is reported, not judged);
//! * the **case**: the compliant SLO tenants at their rates, the flooders closed-loop at
//!   a deep iodepth, under `none`, `ta1`, `ta2`, `ta3`, `mclock` (reservation = the SLO's
//!   IOPS; with SLO tenants its dispatch depth adapts by default) and `mclock-d0` (no
//!   dispatch depth of its own: the paper's scheduler alone).
//!
//! What each policy is held to (the project's issues on SLO policies and on device
//! time, "Targets"): the worst compliant tenant ≥ 99 % within rt, and never below
//! `none` on that figure (the baseline capped at 99 %: a policy at 99.8 % beside a
//! `none` at 100 % has lost nothing a tenant was promised); TA2 and TA3 also never below
//! TA1, with a total throughput ≥ TA1's (within 1 %) and ≤ 10 switch transitions per
//! second per switch (tenants with an SLO). The worst compliant tenant's p99 is reported
//! beside it, as a multiple of its rt. Two mixes have no violators: an SLO tenant
//! beside weighted best-effort tenants and a limited one, and best-effort tenants with
//! no SLO tenant at all — where every policy must give the best-effort tenants at least
//! 0.9× what `none` gives them (nobody is in breach: holding them protects no one).
//! Beside a sequential and a random best-effort reader the run also judges insulation:
//! on the disk and the array each best-effort tenant must keep R ≥ 0.8 of its slice of
//! the device alone (on flash R is shown, not held). With 1,024 SLO tenants (a few
//! dozen requests each in a run) "within rt" is that of all their requests together,
//! and mClock's backlogged tenants (the flooders) are held to the service floor's
//! longest wait; the mix is not run on the disk, where the SLOs' 60 IOPS spread over
//! 1,024 tenants are four requests each.

use super::{Figure, Verdict};
use crate::metrics::{RunResult, ScenarioResult};
use crate::scenario::Scenario;
use crate::sim::{RunOptions, run_scenarios_with};
use std::fmt::Write as _;

/// The policies judged, as a scenario's `policies` entries name them (`none` is the
/// baseline, run first).
pub const POLICIES: [&str; 6] = [
    "\"none\"",
    "\"ta1\"",
    "\"ta2\"",
    "\"ta3\"",
    "\"mclock\"",
    "{ name = \"mclock\", label = \"mclock-d0\", depth = 0 }",
];

/// The label of the feasibility run (`none` over the SLO tenants alone).
const FEASIBILITY: &str = "feasibility";

/// The fraction within rt a policy must keep.
const WITHIN: f64 = 0.99;
/// The fraction within rt that makes a case feasible: every SLO tenant reaches it in
/// the feasibility run.
const FEASIBLE: f64 = 0.995;
/// What best-effort tenants must get beside no SLO tenant, × `none`.
const BEST_EFFORT: f64 = 0.9;
/// The insulation each best-effort tenant of mixed kinds must keep beside an SLO
/// tenant (the issue on bursts and SLOs, "Targets").
const BEST_EFFORT_R: f64 = 0.8;
/// TA2 and TA3 must carry at least TA1's total, less this much (the runs differ by a
/// tenth of a percent where every policy is at the device's limit).
const TOTAL_VS_TA1: f64 = 0.99;
/// Switch transitions per second per switch TA2 and TA3 may make.
const SWITCHES_PER_S: f64 = 10.0;

/// A device the SLO suite runs on, with the SLOs that fit it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SloDevice {
    /// `nvme-p4500`, aged (garbage collection active), 4 GiB.
    NvmeAged,
    /// `nvme-p4500`, clean, 4 GiB.
    NvmeClean,
    /// One `scsi-10k-73g` disk.
    Hdd,
    /// The token-bucket paper's RAID 0 of eight `scsi-10k-73g` disks.
    Raid0,
}

/// The SLOs and loads that fit one device.
struct Fit {
    /// The `[device]` table.
    device: &'static str,
    /// Device queue depth.
    queue_depth: u32,
    /// Each tenant's region: its size, and how far apart regions start (tenant `i` at
    /// `i ×` this); the token-bucket paper's tenants each used 128 MiB of the array.
    region: (&'static str, u64),
    /// The same with [`MANY`] tenants or more: small enough that every region fits.
    many_region: (&'static str, u64),
    /// Simulated seconds (long enough for a few hundred requests of the slowest SLO
    /// tenant).
    duration_s: f64,
    /// The compliant tenants' IOPS together (split evenly among them).
    slo_iops: f64,
    /// Their rt (µs); in a mixed case every other one has [`Fit::loose_rt_us`].
    rt_us: u64,
    /// The looser rt of mixed cases (µs): every other compliant tenant, and violators.
    loose_rt_us: u64,
    /// The IOPS of a violator's SLO (it sends far more).
    violator_iops: f64,
    /// A flooder's pattern and size (violators and flooders alike).
    flooder: &'static str,
    /// A flooder's iodepth.
    flooder_iodepth: u32,
}

impl Fit {
    /// Each tenant's region with `mix`: its size, and how far apart regions start.
    fn region(&self, mix: Mix) -> (&'static str, u64) {
        if mix.tenants() >= MANY {
            self.many_region
        } else {
            self.region
        }
    }
}

impl SloDevice {
    /// Every device.
    pub const ALL: [SloDevice; 4] = [
        SloDevice::NvmeAged,
        SloDevice::NvmeClean,
        SloDevice::Hdd,
        SloDevice::Raid0,
    ];

    /// Its name in tables and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            SloDevice::NvmeAged => "nvme-aged",
            SloDevice::NvmeClean => "nvme-clean",
            SloDevice::Hdd => "hdd",
            SloDevice::Raid0 => "raid0",
        }
    }

    fn fit(self) -> Fit {
        match self {
            SloDevice::NvmeAged | SloDevice::NvmeClean => Fit {
                device: if self == SloDevice::NvmeAged {
                    "model = \"ssd\"\npreset = \"nvme-p4500\"\nprecondition = \"aged\"\ncapacity_gib = 4\nwrite_buffer_mib = 0"
                } else {
                    "model = \"ssd\"\npreset = \"nvme-p4500\"\nprecondition = \"clean\"\ncapacity_gib = 4\nwrite_buffer_mib = 0"
                },
                queue_depth: 32,
                region: ("256m", 320 << 20),
                many_region: ("2m", 3 << 20),
                duration_s: 4.0,
                slo_iops: 8000.0,
                rt_us: 5_000,
                loose_rt_us: 20_000,
                violator_iops: 500.0,
                flooder: "pattern = \"randwrite\", size = \"4k\"",
                flooder_iodepth: 32,
            },
            SloDevice::Hdd => Fit {
                device: "model = \"hdd\"\npreset = \"scsi-10k-73g\"",
                queue_depth: 16,
                region: ("128m", 1 << 30),
                many_region: ("16m", 64 << 20),
                duration_s: 60.0,
                slo_iops: 60.0,
                rt_us: 100_000,
                loose_rt_us: 400_000,
                violator_iops: 10.0,
                flooder: "pattern = \"randwrite\", size = \"4k\"",
                flooder_iodepth: 16,
            },
            SloDevice::Raid0 => Fit {
                device: "model = \"raid0\"\npreset = \"scsi-10k-73g-x8\"",
                queue_depth: 64,
                region: ("128m", 1 << 30),
                many_region: ("1m", 1 << 20),
                duration_s: 10.0,
                slo_iops: 3000.0,
                rt_us: 41_000,
                loose_rt_us: 160_000,
                violator_iops: 500.0,
                flooder: "pattern = \"randread\", size = \"4k\"",
                flooder_iodepth: 32,
            },
        }
    }
}

/// A mix with this many tenants or more has small regions ([`Fit::many_region`]), is
/// not run on the disk (its SLO rate spread over them is a few requests each), and
/// holds mClock's backlogged tenants to the service floor's wait.
const MANY: usize = 64;

/// How arrivals of the compliant tenants are spaced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spacing {
    /// Evenly (fio's `rate_process = "linear"`; the paper's workloads).
    Even,
    /// Exponential gaps.
    Poisson,
    /// Bursts: Poisson in 100 ms on periods at five times the mean, nothing for the
    /// 400 ms between, at [`BURSTY_MEAN`] of the SLO's rate.
    OnOff,
    /// Pareto gaps (shape 1.5: bunches and silences) at [`BURSTY_MEAN`] of the rate.
    Pareto,
}

/// A bursty compliant tenant's mean rate, as a fraction of its SLO's: under the rate,
/// its bursts within the SLO's default burst (one second of the rate).
pub const BURSTY_MEAN: f64 = 0.8;

impl Spacing {
    /// Every spacing, in table order.
    pub const ALL: [Spacing; 4] = [
        Spacing::Even,
        Spacing::Poisson,
        Spacing::OnOff,
        Spacing::Pareto,
    ];

    /// The workload keys of the process.
    fn process(self) -> &'static str {
        match self {
            Spacing::Even => "rate_process = \"linear\"",
            Spacing::Poisson => "rate_process = \"poisson\"",
            Spacing::OnOff => "rate_process = \"onoff\", on_ms = 100, off_ms = 400",
            Spacing::Pareto => "rate_process = \"pareto\"",
        }
    }

    /// What a compliant tenant sends, as a fraction of its SLO's rate.
    fn load(self) -> f64 {
        match self {
            Spacing::Even | Spacing::Poisson => 1.0,
            Spacing::OnOff | Spacing::Pareto => BURSTY_MEAN,
        }
    }

    /// Its name in tables.
    pub fn name(self) -> &'static str {
        match self {
            Spacing::Even => "even",
            Spacing::Poisson => "Poisson",
            Spacing::OnOff => "on/off",
            Spacing::Pareto => "Pareto",
        }
    }
}

/// Who shares the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mix {
    /// Compliant tenants with SLOs, each sending its SLO's IOPS.
    pub compliant: usize,
    /// Whether every other compliant tenant, and every violator, has a looser rt.
    pub mixed_rt: bool,
    /// Flooders with an SLO far below what they send.
    pub violators: usize,
    /// Flooders without an SLO (weighted 1 and 4 in turn when the mix has limited
    /// tenants).
    pub flooders: usize,
    /// Flooders without an SLO held to a limit (mClock's `limit_iops`).
    pub limited: usize,
    /// Flooders without an SLO that come and go (a second on, a second off).
    pub intermittent: usize,
    /// Best-effort readers of 1 MiB sequential requests (beside the flooders: best
    /// effort of mixed kinds).
    pub sequential: usize,
    /// The flooders' weights are multiplied by 10 to this power.
    pub weight_scale: u32,
}

impl Mix {
    /// Every mix, in table order.
    pub const ALL: [Mix; 14] = [
        Mix::new(1, false, 0, 0),
        Mix::new(1, false, 1, 0),
        Mix::new(1, false, 0, 1),
        Mix::new(1, true, 2, 0),
        Mix::new(2, true, 1, 1),
        Mix::new(4, false, 2, 2),
        Mix::new(8, true, 0, 0),
        Mix::new(8, false, 2, 2),
        Mix {
            limited: 1,
            ..Mix::new(1, false, 0, 2)
        },
        Mix::new(0, false, 0, 2),
        Mix {
            limited: 1,
            weight_scale: 5,
            ..Mix::new(1, false, 0, 2)
        },
        Mix {
            intermittent: 1,
            ..Mix::new(1, false, 0, 0)
        },
        Mix {
            sequential: 1,
            ..Mix::new(1, false, 0, 1)
        },
        Mix::new(1024, false, 0, 2),
    ];

    const fn new(compliant: usize, mixed_rt: bool, violators: usize, flooders: usize) -> Mix {
        Mix {
            compliant,
            mixed_rt,
            violators,
            flooders,
            limited: 0,
            intermittent: 0,
            sequential: 0,
            weight_scale: 0,
        }
    }

    /// Every tenant of the mix.
    fn tenants(self) -> usize {
        self.compliant + self.violators + self.best_effort()
    }

    /// Tenants without an SLO.
    fn best_effort(self) -> usize {
        self.flooders + self.limited + self.intermittent + self.sequential
    }

    /// Weight of flooder `i`.
    fn flooder_weight(self, i: usize) -> f64 {
        let w = if self.limited > 0 && i % 2 == 1 {
            4.0
        } else {
            1.0
        };
        w * 10f64.powi(self.weight_scale as i32)
    }

    /// Its name in tables, e.g. "2 SLO + 1 violator + 1 flooder, mixed rt".
    pub fn name(self) -> String {
        let mut s = format!("{} SLO", self.compliant);
        let plural = |n: usize| if n == 1 { "" } else { "s" };
        if self.violators > 0 {
            let _ = write!(
                s,
                " + {} violator{}",
                self.violators,
                plural(self.violators)
            );
        }
        if self.flooders > 0 {
            let weighted = match (self.limited > 0, self.weight_scale) {
                (false, _) => String::new(),
                (true, 0) => " weighted 1:4".to_string(),
                (true, e) => format!(" weighted 1:4 ×10^{e}"),
            };
            let _ = write!(
                s,
                " + {} flooder{}{weighted}",
                self.flooders,
                plural(self.flooders)
            );
        }
        if self.limited > 0 {
            let _ = write!(s, " + {} limited", self.limited);
        }
        if self.intermittent > 0 {
            let _ = write!(s, " + {} coming and going", self.intermittent);
        }
        if self.sequential > 0 {
            let _ = write!(s, " + {} sequential", self.sequential);
        }
        s.push_str(if self.mixed_rt {
            ", mixed rt"
        } else {
            ", equal rt"
        });
        s
    }
}

/// One cell of the matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Case {
    /// Who shares the device.
    pub mix: Mix,
    /// The device.
    pub device: SloDevice,
    /// The compliant tenants' arrivals.
    pub spacing: Spacing,
}

impl Case {
    /// Every case, in table order.
    pub fn all() -> Vec<Case> {
        let mut cases = Vec::new();
        for device in SloDevice::ALL {
            for mix in Mix::ALL {
                if mix.compliant >= MANY && device == SloDevice::Hdd {
                    // 60 IOPS over 1,024 tenants: four requests each in a run.
                    continue;
                }
                for spacing in Spacing::ALL {
                    cases.push(Case {
                        mix,
                        device,
                        spacing,
                    });
                }
            }
        }
        cases
    }
}

/// The case's scenario (`feasibility`: the feasibility run's instead: SLO tenants at
/// exactly their SLO, no flooders without one, under `none` only).
pub fn scenario(case: Case, seed: u64, feasibility: bool) -> Scenario {
    let fit = case.device.fit();
    let mix = case.mix;
    let policies = if feasibility {
        format!("{{ name = \"none\", label = \"{FEASIBILITY}\" }}")
    } else {
        POLICIES.join(", ")
    };
    let mut s = format!(
        "name = \"slo conformance\"\nseed = {seed}\nduration_s = {}\nwarmup_s = 0.5\n\
         queue_depth = {}\nqueue_limit = 256\npolicies = [{policies}]\n\
         [device]\n{}\n",
        fit.duration_s, fit.queue_depth, fit.device
    );
    let process = case.spacing.process();
    let (size, apart) = fit.region(mix);
    let region = |i: usize| format!("offset = {}\nsize = \"{size}\"\n", i as u64 * apart);
    let rate = fit.slo_iops / mix.compliant as f64;
    let load = case.spacing.load();
    // Every tenant's weight is scaled alike (1 by default).
    let scale = 10f64.powi(mix.weight_scale as i32);
    for i in 0..mix.compliant {
        let rt = if mix.mixed_rt && i % 2 == 1 {
            fit.loose_rt_us
        } else {
            fit.rt_us
        };
        let _ = writeln!(
            s,
            "[[tenant]]\nname = \"slo{i}\"\nweight = {scale}\n{}slo = {{ iops = {rate}, size = 4096, rt_us = {rt} }}\n\
             reservation_iops = {rate}\nworkload = {{ pattern = \"randread\", size = \"4k\", \
             rate_iops = {}, {process} }}",
            region(i),
            rate * load
        );
    }
    let violator_rt = if mix.mixed_rt {
        fit.loose_rt_us
    } else {
        fit.rt_us
    };
    let flood = format!("{{ {}, iodepth = {} }}", fit.flooder, fit.flooder_iodepth);
    for i in 0..mix.violators {
        let workload = if feasibility {
            // At exactly its SLO, in the flooder's pattern.
            format!(
                "{{ {}, rate_iops = {}, {process} }}",
                fit.flooder,
                fit.violator_iops * load
            )
        } else {
            flood.clone()
        };
        let _ = writeln!(
            s,
            "[[tenant]]\nname = \"violator{i}\"\nweight = {scale}\n{}slo = {{ iops = {}, size = 4096, rt_us = {violator_rt} }}\n\
             reservation_iops = {}\nworkload = {workload}",
            region(mix.compliant + i),
            fit.violator_iops,
            fit.violator_iops
        );
    }
    if !feasibility {
        best_effort_tenants(&mut s, &fit, mix, scale);
    }
    Scenario::parse(&s, "slo conformance scenario", "slo conformance")
        .expect("SLO conformance scenarios are valid")
}

/// Appends the tenants without an SLO of `mix` to scenario text `s`: flooders, limited
/// tenants, ones that come and go, sequential readers (and with those, the alone runs
/// insulation is judged by).
fn best_effort_tenants(s: &mut String, fit: &Fit, mix: Mix, scale: f64) {
    let (size, apart) = fit.region(mix);
    let region = |i: usize| format!("offset = {}\nsize = \"{size}\"\n", i as u64 * apart);
    let flood = format!("{{ {}, iodepth = {} }}", fit.flooder, fit.flooder_iodepth);
    for i in 0..mix.flooders {
        let _ = writeln!(
            s,
            "[[tenant]]\nname = \"flooder{i}\"\nweight = {}\n{}workload = {flood}",
            mix.flooder_weight(i),
            region(mix.compliant + mix.violators + i)
        );
    }
    let mut next = mix.compliant + mix.violators + mix.flooders;
    for i in 0..mix.limited {
        let _ = writeln!(
            s,
            "[[tenant]]\nname = \"limited{i}\"\nweight = {scale}\nlimit_iops = {}\n{}workload = {flood}",
            fit.violator_iops,
            region(next)
        );
        next += 1;
    }
    // A second on, a second off, to the end of the run.
    let cycles = (fit.duration_s / 2.0).ceil() as usize;
    let phases = vec!["{ duration_s = 1 }, { duration_s = 1, idle = true }"; cycles].join(", ");
    for i in 0..mix.intermittent {
        let _ = writeln!(
            s,
            "[[tenant]]\nname = \"intermittent{i}\"\nweight = {scale}\n{}workload = {{ {}, iodepth = {}, phases = [{phases}] }}",
            region(next),
            fit.flooder,
            fit.flooder_iodepth
        );
        next += 1;
    }
    for i in 0..mix.sequential {
        let _ = writeln!(
            s,
            "[[tenant]]\nname = \"sequential{i}\"\nweight = {scale}\n{}workload = {{ pattern = \"read\", size = \"1m\", iodepth = 4 }}",
            region(next)
        );
        next += 1;
    }
    if mix.sequential > 0 {
        // Mixed best effort is judged by insulation (each alone under `none`).
        *s = s.replacen("policies = [", "insulation = true\npolicies = [", 1);
    }
}

/// How one case came out: whether its SLOs were jointly feasible, each policy's verdict.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The case.
    pub case: Case,
    /// The worst SLO tenant's fraction within rt in the feasibility run.
    pub feasibility: f64,
    /// Every policy but `none`.
    pub verdicts: Vec<Verdict>,
}

impl Outcome {
    /// Whether the device served every SLO at once (the targets hold only then).
    pub fn feasible(&self) -> bool {
        self.feasibility >= FEASIBLE
    }
}

/// Runs `case` (the feasibility run, when it has SLO tenants, and the case) and judges
/// every policy.
pub fn check(case: Case, seed: u64) -> Outcome {
    let mut scenarios = Vec::new();
    if case.mix.compliant + case.mix.violators > 0 {
        scenarios.push(scenario(case, seed, true));
    }
    scenarios.push(scenario(case, seed, false));
    let result =
        run_scenarios_with(&scenarios, false, RunOptions::default()).expect("every policy builds");
    let duration = scenarios.last().expect("the case").duration;
    judge(case, &result, duration as f64 / 1e9)
}

/// The compliant tenants' (the first `rts.len()` tenants, one rt each) fraction within
/// rt — the worst tenant's, or with [`MANY`] tenants or more that of all their requests
/// together (a few dozen requests each: one late request would be the worst tenant's
/// 4 %) — and the worst p99 ÷ rt. A tenant with no request to judge (on bursty arrivals
/// one may send none after the warm-up) counts only if it waited past its rt for one:
/// then as none within it.
fn compliant(r: &RunResult, rts: &[f64]) -> (f64, f64) {
    let judged: Vec<(f64, f64, f64)> = r
        .tenants
        .iter()
        .zip(rts)
        .filter_map(|(t, rt_us)| {
            let starved = t.longest_wait_s * 1e6 > *rt_us;
            let within = t.slo_satisfaction.or(starved.then_some(0.0))?;
            let requests = (t.ios + t.refused).max(1) as f64;
            Some((within, requests, t.latency_us.p99 / rt_us))
        })
        .collect();
    let p99 = judged.iter().map(|j| j.2).fold(0.0, f64::max);
    let within = if rts.len() >= MANY {
        let requests: f64 = judged.iter().map(|j| j.1).sum();
        let met: f64 = judged.iter().map(|j| j.0 * j.1).sum();
        if requests > 0.0 { met / requests } else { 1.0 }
    } else {
        judged.iter().map(|j| j.0).fold(1.0, f64::min)
    };
    (within, p99)
}

/// Judges the runs of one case (the feasibility run first).
pub fn judge(case: Case, result: &ScenarioResult, duration_s: f64) -> Outcome {
    let fit = case.device.fit();
    let rts: Vec<f64> = (0..case.mix.compliant)
        .map(|i| {
            if case.mix.mixed_rt && i % 2 == 1 {
                fit.loose_rt_us as f64
            } else {
                fit.rt_us as f64
            }
        })
        .collect();
    let run = |label: &str| {
        result
            .runs
            .iter()
            .find(|r| r.policy == label)
            .expect("every policy ran")
    };
    // Without an SLO tenant there is nothing to be feasible: every case is.
    let feasibility = result
        .runs
        .iter()
        .find(|r| r.policy == FEASIBILITY)
        .map_or(1.0, |r| compliant(r, &rts).0);
    let feasible = feasibility >= FEASIBLE;
    let none = run("none");
    let wait_bound = super::wait_bound(none);
    let (none_within, _) = compliant(none, &rts);
    let none_best_effort = best_effort_bytes(case, none);
    let ta1 = run("ta1");
    let (ta1_within, _) = compliant(ta1, &rts);
    let switches = (case.mix.compliant + case.mix.violators) as f64;
    let verdicts = result
        .runs
        .iter()
        .filter(|r| r.policy != "none" && r.policy != FEASIBILITY)
        .map(|r| {
            let (within, p99) = compliant(r, &rts);
            let target = |t: f64| feasible.then_some(t);
            let mut figures = Vec::new();
            if case.mix.compliant > 0 {
                figures.push(Figure::new("within rt", within, target(WITHIN), true));
                figures.push(Figure::new("p99 (× rt)", p99, None, false));
                if case.spacing.load() < 1.0 {
                    // Bursty but within rate + burst: none of theirs is ever refused.
                    let refused: u64 = r.tenants[..case.mix.compliant]
                        .iter()
                        .map(|t| t.refused)
                        .sum();
                    figures.push(Figure::new(
                        "refused (/s)",
                        refused as f64 / duration_s,
                        target(0.0),
                        false,
                    ));
                }
                // Never below the baseline, where the baseline is below the target: a
                // policy keeping 99.8 % beside a `none` at 100 % has lost nothing.
                figures.push(Figure::new(
                    "over none",
                    within - none_within.min(WITHIN),
                    target(0.0),
                    true,
                ));
            }
            figures.extend(best_effort_figures(case, r, none_best_effort, feasible));
            if case.mix.tenants() >= MANY {
                // The floor's promise with many tenants: mClock's (the token buckets
                // have no floor: shown).
                let held = r.policy.starts_with("mclock");
                figures.push(Figure::new(
                    "longest wait (ms)",
                    r.longest_wait_s * 1e3,
                    held.then_some(wait_bound * 1e3),
                    false,
                ));
            }
            if (r.policy == "ta2" || r.policy == "ta3") && case.mix.compliant > 0 {
                figures.extend(switched_figures(
                    r,
                    ta1,
                    within - ta1_within.min(WITHIN),
                    duration_s * switches,
                ));
            }
            Verdict {
                policy: r.policy.clone(),
                vs_none: r.device_work_rate / none.device_work_rate,
                bytes_vs_none: r.total_bandwidth_bytes_per_s / none.total_bandwidth_bytes_per_s,
                figures,
            }
        })
        .collect();
    Outcome {
        case,
        feasibility,
        verdicts,
    }
}

/// What the tenants without an SLO (after the first `slo_tenants`) got, bytes per
/// second.
fn best_effort_bytes(case: Case, r: &RunResult) -> f64 {
    r.tenants[case.mix.compliant + case.mix.violators..]
        .iter()
        .map(|t| t.bandwidth_bytes_per_s)
        .sum()
}

/// The figures on the tenants without an SLO: what they got against `none` (held when
/// no tenant has an SLO) and, beside a sequential reader, each one's insulation (held
/// on the disk and the array where the case is `feasible`).
fn best_effort_figures(
    case: Case,
    r: &RunResult,
    none_best_effort: f64,
    feasible: bool,
) -> Vec<Figure> {
    let mut figures = Vec::new();
    let slo_tenants = case.mix.compliant + case.mix.violators;
    if case.mix.best_effort() > 0 {
        let held = slo_tenants == 0;
        figures.push(Figure::new(
            "best effort (× none)",
            if none_best_effort > 0.0 {
                best_effort_bytes(case, r) / none_best_effort
            } else {
                1.0
            },
            held.then_some(BEST_EFFORT),
            true,
        ));
    }
    if case.mix.sequential > 0 {
        let seek_bound = matches!(case.device, SloDevice::Hdd | SloDevice::Raid0);
        // Each best-effort tenant against its slice of the device alone.
        let worst = r.tenants[slo_tenants..]
            .iter()
            .filter_map(|t| t.insulation)
            .fold(f64::INFINITY, f64::min);
        if worst.is_finite() {
            figures.push(Figure::new(
                "best effort R",
                worst,
                (feasible && seek_bound).then_some(BEST_EFFORT_R),
                true,
            ));
        }
    }
    figures
}

/// What TA2 and TA3 are held to beyond TA1's figures: never below TA1 within `rt`
/// (`over_ta1`), a total within reach of TA1's, few switch transitions (`per`: the
/// run's seconds times the tenants that can switch).
fn switched_figures(r: &RunResult, ta1: &RunResult, over_ta1: f64, per: f64) -> Vec<Figure> {
    let mut figures = Vec::new();
    figures.push(Figure::new("over ta1", over_ta1, Some(0.0), true));
    figures.push(Figure::new(
        "total vs ta1",
        r.total_bandwidth_bytes_per_s / ta1.total_bandwidth_bytes_per_s,
        Some(TOTAL_VS_TA1),
        true,
    ));
    let transitions = r.policy_stats["transitions"]
        .as_u64()
        .expect("the token buckets count transitions");
    figures.push(Figure::new(
        "switches (/s)",
        transitions as f64 / per,
        Some(SWITCHES_PER_S),
        false,
    ));
    figures
}

/// The SLO matrix in a few lines a person reads: per policy and device the verdicts
/// passed of those held (cases the device can serve), the figures missed, the total.
pub fn summary(outcomes: &[Outcome]) -> String {
    let cells: Vec<(&str, &Verdict)> = outcomes
        .iter()
        .flat_map(|o| o.verdicts.iter().map(move |v| (o.case.device.name(), v)))
        .collect();
    super::summarize(&cells)
}

/// The SLO matrix as a Markdown table: one row per case and policy.
pub fn markdown(outcomes: &[Outcome]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| device | mix | arrivals | feasible | policy | vs none | figures | pass |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|");
    for o in outcomes {
        for v in &o.verdicts {
            let figures: Vec<String> = v.figures.iter().map(Figure::render).collect();
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {:.2}× | {} | {} |",
                o.case.device.name(),
                o.case.mix.name(),
                o.case.spacing.name(),
                if o.feasible() {
                    format!("yes ({:.1} %)", o.feasibility * 100.0)
                } else {
                    format!("no ({:.1} %)", o.feasibility * 100.0)
                },
                v.policy,
                v.vs_none,
                figures.join("; "),
                if v.pass() { "yes" } else { "no" }
            );
        }
    }
    out
}

/// Pass counts over many runs (seeds): one row per device × mix, one column per policy,
/// `passed/feasible runs` in each cell (an infeasible run is not counted).
pub fn sweep_markdown(outcomes: &[Outcome]) -> String {
    let policies: Vec<String> = outcomes
        .first()
        .map(|o| o.verdicts.iter().map(|v| v.policy.clone()).collect())
        .unwrap_or_default();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| device | mix | feasible | {} |",
        policies.join(" | ")
    );
    let _ = writeln!(out, "|---|---|---|{}", "---|".repeat(policies.len()));
    for device in SloDevice::ALL {
        for mix in Mix::ALL {
            let runs: Vec<&Outcome> = outcomes
                .iter()
                .filter(|o| o.case.device == device && o.case.mix == mix)
                .collect();
            if runs.is_empty() {
                continue;
            }
            let feasible: Vec<&&Outcome> = runs.iter().filter(|o| o.feasible()).collect();
            let cells: Vec<String> = policies
                .iter()
                .map(|p| {
                    let passed = feasible
                        .iter()
                        .filter(|o| o.verdicts.iter().any(|v| &v.policy == p && v.pass()))
                        .count();
                    format!("{passed}/{}", feasible.len())
                })
                .collect();
            let _ = writeln!(
                out,
                "| {} | {} | {}/{} | {} |",
                device.name(),
                mix.name(),
                feasible.len(),
                runs.len(),
                cells.join(" | ")
            );
        }
    }
    out
}
