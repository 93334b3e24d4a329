//! The conformance suite: every proportional-share policy run through a matrix of
//! *properties* on several devices — not the papers' scenarios, but what a user meets
//! on day one: a light tenant beside a heavy one (work conservation), many tenants with
//! mixed workloads (weight accuracy whole-run and per second, 8 to 1,024 tenants with
//! weights 1–1000), a tenant coming back from idle, a tenant leaving, a deep device
//! queue, open-loop Poisson arrivals, requests of very different cost, a sequential
//! reader beside random ones — on write-through and write-back SSDs, a disk and an
//! array.
//!
//! Each property is a scenario built here (so it reads like any scenario file), run on
//! the simulator under `none` and the policies, and judged from the results: one
//! figure per policy with the target it must meet. Shares are judged in the currency
//! each policy shares: device time (each request's cost in the device's model) for the
//! defaults, bytes for the papers' literal variants, requests for mClock.
//! Deterministic: the same property, device and seed give the same figures.
//! `ioshare conformance` prints the matrix; `tests/conformance.rs` asserts the targets
//! that hold; `docs/conformance.md` has the full table.

pub mod slo;

use crate::device::cost::Currency;
use crate::metrics::entitled::Claim;
use crate::metrics::insulation::INSULATED;
use crate::metrics::{RunResult, ScenarioResult, max_min_error, measurable, share_error};
use crate::policy::floor::FLOOR_EVERY;
use crate::scenario::Scenario;
use crate::sim::{RunOptions, run_scenarios_with};
use std::fmt::Write as _;

/// The policies every property judges (`none` is the baseline), as a scenario's
/// `policies` entries name them. The defaults share device time; beside them the
/// papers' literal readings, shown and not held: `mcfq` (MoTS on CFQ's slices, by
/// bytes), `bfq-paper` (budgets of bytes, idling 8 ms), `feedbac-paper` (credits of
/// bytes, the literal early refill, no depth of its own), `sfq-bytes` (tags of bytes).
/// `feedbac-wc` is FeedBAC without a depth of its own, `mclock-d0` mClock without one
/// (the paper's scheduler alone; mClock's default without an SLO tenant before the
/// adaptive depth became its default).
pub const POLICIES: [&str; 12] = [
    "\"cfq\"",
    "\"mots\"",
    "{ name = \"mots\", label = \"mcfq\", base = \"cfq\", cost = \"bytes\" }",
    "\"bfq\"",
    "{ name = \"bfq\", label = \"bfq-paper\", cost = \"bytes\", slice_idle_ms = 8 }",
    "\"feedbac\"",
    "{ name = \"feedbac\", label = \"feedbac-paper\", cost = \"bytes\", backlog_refill = false, depth = 0 }",
    "{ name = \"feedbac\", label = \"feedbac-wc\", depth = 0 }",
    "\"sfq\"",
    "{ name = \"sfq\", label = \"sfq-bytes\", cost = \"bytes\" }",
    "\"mclock\"",
    "{ name = \"mclock\", label = \"mclock-d0\", depth = 0 }",
];

/// The policies shown as baselines (no targets): CFQ (what MoTS corrects), the
/// papers' literal byte-charging readings and the ordering policies without a depth of
/// their own.
pub const BASELINES: [&str; 7] = [
    "cfq",
    "mcfq",
    "bfq-paper",
    "feedbac-paper",
    "feedbac-wc",
    "sfq-bytes",
    "mclock-d0",
];

/// A device the suite runs on. The first three SSDs are write-through (the presets with
/// `write_buffer_mib = 0`): a write completes when programmed, so a tenant's
/// completions carry its device cost. The `-wb` two are the presets as shipped, with
/// their write-back buffers: a write is acknowledged from the buffer and its program
/// (and the garbage collection it causes) lands later, in whoever's requests come
/// next — the policies charge it at dispatch what the model says it will cost. Then a
/// disk and an array.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    /// `sata-840pro`, aged (garbage collection active), 4 GiB, write-through.
    SataAged,
    /// `nvme-p4500`, clean, 4 GiB, write-through.
    NvmeClean,
    /// `nvme-p4500`, aged, 4 GiB, write-through.
    NvmeAged,
    /// `sata-840pro`, aged, 4 GiB, its 8 MiB write-back buffer.
    SataAgedWb,
    /// `nvme-p4500`, aged, 4 GiB, its 16 MiB write-back buffer.
    NvmeAgedWb,
    /// One `scsi-10k-73g` disk (queue of 16, SPTF).
    Hdd,
    /// `scsi-10k-73g-x8`: eight of them striped.
    Raid0,
}

impl Device {
    /// Every device.
    pub const ALL: [Device; 7] = [
        Device::SataAged,
        Device::NvmeClean,
        Device::NvmeAged,
        Device::SataAgedWb,
        Device::NvmeAgedWb,
        Device::Hdd,
        Device::Raid0,
    ];

    /// The write-through SSDs.
    pub const WRITE_THROUGH: [Device; 3] = [Device::SataAged, Device::NvmeClean, Device::NvmeAged];

    /// Its `[device]` table.
    fn toml(self) -> &'static str {
        match self {
            Device::SataAged => {
                "model = \"ssd\"\npreset = \"sata-840pro\"\nprecondition = \"aged\"\ncapacity_gib = 4\nwrite_buffer_mib = 0"
            }
            Device::NvmeClean => {
                "model = \"ssd\"\npreset = \"nvme-p4500\"\nprecondition = \"clean\"\ncapacity_gib = 4\nwrite_buffer_mib = 0"
            }
            Device::NvmeAged => {
                "model = \"ssd\"\npreset = \"nvme-p4500\"\nprecondition = \"aged\"\ncapacity_gib = 4\nwrite_buffer_mib = 0"
            }
            Device::SataAgedWb => {
                "model = \"ssd\"\npreset = \"sata-840pro\"\nprecondition = \"aged\"\ncapacity_gib = 4"
            }
            Device::NvmeAgedWb => {
                "model = \"ssd\"\npreset = \"nvme-p4500\"\nprecondition = \"aged\"\ncapacity_gib = 4"
            }
            Device::Hdd => "model = \"hdd\"\npreset = \"scsi-10k-73g\"",
            Device::Raid0 => "model = \"raid0\"\npreset = \"scsi-10k-73g-x8\"",
        }
    }

    /// Its name in tables.
    pub fn name(self) -> &'static str {
        match self {
            Device::SataAged => "sata-840pro aged",
            Device::NvmeClean => "nvme-p4500 clean",
            Device::NvmeAged => "nvme-p4500 aged",
            Device::SataAgedWb => "sata-840pro aged, write-back",
            Device::NvmeAgedWb => "nvme-p4500 aged, write-back",
            Device::Hdd => "hdd scsi-10k-73g",
            Device::Raid0 => "raid0 scsi-10k-73g-x8",
        }
    }

    /// Its name on the command line.
    pub fn key(self) -> &'static str {
        match self {
            Device::SataAged => "sata-aged",
            Device::NvmeClean => "nvme-clean",
            Device::NvmeAged => "nvme-aged",
            Device::SataAgedWb => "sata-aged-wb",
            Device::NvmeAgedWb => "nvme-aged-wb",
            Device::Hdd => "hdd",
            Device::Raid0 => "raid0",
        }
    }

    /// Whether it is rotating media.
    pub fn is_disk(self) -> bool {
        matches!(self, Device::Hdd | Device::Raid0)
    }

    /// A rate a light 4 KiB reader keeps to, well under any share it would get.
    fn light_rate(self) -> f64 {
        match self {
            Device::SataAged | Device::SataAgedWb => 2000.0,
            Device::NvmeClean | Device::NvmeAged | Device::NvmeAgedWb => 5000.0,
            Device::Hdd => 20.0,
            Device::Raid0 => 150.0,
        }
    }
}

/// What is judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Property {
    /// A weight-4 open-loop reader that uses less than its share beside a backlogged
    /// weight-1 writer: the writer must get the rest (total ≥ 0.95× `none`).
    WorkConservation,
    /// The same with the weights swapped.
    WorkConservationSwapped,
    /// `n` backlogged tenants, weights 1…8, mixed workloads: share error whole-run and
    /// per second.
    Weights(usize),
    /// `n` backlogged tenants, weights spread evenly over 1–1000, the mixed workloads at
    /// iodepth 2: shares, and that nobody waits.
    Many(usize),
    /// 8 tenants as in [`Property::Weights`] on a device queue of 128.
    DeepQueue,
    /// A weight-4 tenant (others 2:1:1) idle for the first 1.5 s: how long until it
    /// gets its share, and by how much it overshoots.
    ReturnFromIdle,
    /// Weights 4:2:1:1; the weight-4 tenant stops at 1.5 s: the others must share its
    /// part by their weights and keep the device busy.
    Leaving,
    /// Three open-loop tenants, weights 1:2:4, Poisson arrivals, each offering more than
    /// the device serves (queue limit 64).
    PoissonOverload,
    /// Four closed loops, weights 100:50:25:10, 4 KiB random 50/50 at iodepth 32 each,
    /// device queue 128: every request sits in the device (the FeedBAC paper's setting).
    DeepClosedLoops,
    /// Equal weights, requests of very different cost: 512 B random writes, 4 KiB
    /// random reads, 4 MiB sequential writes.
    MixedCost,
    /// Equal weights: 512 B random reads, 1 MiB sequential reads, 1 MiB random writes.
    SizeMix,
    /// Equal weights: a 1 MiB sequential reader beside three 4 KiB random tenants (two
    /// readers, a writer), each at iodepth 16 — the mix that breaks byte-fair policies
    /// on disks.
    SequentialBesideRandom,
}

impl Property {
    /// Every property, in table order.
    pub const ALL: [Property; 15] = [
        Property::WorkConservation,
        Property::WorkConservationSwapped,
        Property::Weights(8),
        Property::Weights(64),
        Property::Many(128),
        Property::Many(256),
        Property::Many(1024),
        Property::DeepQueue,
        Property::ReturnFromIdle,
        Property::Leaving,
        Property::PoissonOverload,
        Property::DeepClosedLoops,
        Property::MixedCost,
        Property::SizeMix,
        Property::SequentialBesideRandom,
    ];

    /// Its name in tables.
    pub fn name(self) -> String {
        match self {
            Property::WorkConservation => "work conservation".into(),
            Property::WorkConservationSwapped => "work conservation, weights swapped".into(),
            Property::Weights(n) => format!("weights, {n} mixed tenants"),
            Property::Many(n) => format!("{n} tenants, weights 1–1000"),
            Property::DeepQueue => "weights, device queue 128".into(),
            Property::ReturnFromIdle => "return from idle".into(),
            Property::Leaving => "a tenant leaves".into(),
            Property::PoissonOverload => "Poisson overload".into(),
            Property::DeepClosedLoops => "closed loops in a queue of 128".into(),
            Property::MixedCost => "512 B, 4 KiB and 4 MiB requests".into(),
            Property::SizeMix => "512 B reads, 1 MiB sequential reads, 1 MiB random writes".into(),
            Property::SequentialBesideRandom => {
                "1 MiB sequential reader beside 4 KiB random".into()
            }
        }
    }
}

/// Simulated seconds of every property's run.
const DURATION_S: f64 = 4.0;
/// When the returning tenant starts, and when the leaving one stops.
const CHANGE_S: f64 = 1.5;
/// The bin the per-interval figures use.
const INTERVAL_S: f64 = 0.1;

/// Closed-loop workloads tenants cycle through in the weight properties: random reads
/// and writes of several sizes, a sequential writer, a file-server mix.
const MIXED: [&str; 6] = [
    "{ pattern = \"randread\", size = \"4k\", iodepth = 8 }",
    "{ pattern = \"randwrite\", size = \"16k\", iodepth = 8 }",
    "{ pattern = \"randrw\", read_mix = 0.5, size = \"8k\", iodepth = 8 }",
    "{ pattern = \"write\", size = \"128k\", iodepth = 4 }",
    "{ standin = \"fileserver\", iodepth = 8 }",
    "{ pattern = \"randread\", size = \"64k\", iodepth = 4 }",
];

/// The scenario of `property` on `device`.
pub fn scenario(property: Property, device: Device, seed: u64) -> Scenario {
    scenario_with(property, device, seed, &POLICIES)
}

/// The scenario of `property` on `device` for `policies` (entries of a scenario's
/// `policies` list) beside `none`.
pub fn scenario_with(property: Property, device: Device, seed: u64, policies: &[&str]) -> Scenario {
    let mut s = String::new();
    let policies: Vec<&str> = std::iter::once("\"none\"")
        .chain(policies.iter().copied())
        .collect();
    let queue_depth = match property {
        Property::DeepQueue | Property::DeepClosedLoops => 128,
        _ => 32,
    };
    let duration = match property {
        Property::Many(_) => DURATION_S + 1.0,
        _ => DURATION_S,
    };
    let _ = writeln!(
        s,
        "name = \"conformance\"\nseed = {seed}\nduration_s = {duration}\ninterval_s = {INTERVAL_S}\nqueue_depth = {queue_depth}\npartition = true\ninsulation = true\npolicies = [{}]",
        policies.join(", ")
    );
    if property == Property::PoissonOverload {
        s.push_str("queue_limit = 64\n");
    }
    if let Property::Many(_) = property {
        // The first round of a thousand tenants (each served once as it arrives) is not
        // the steady state the property is about: measured from 1 s, for as long.
        let _ = writeln!(s, "warmup_s = 1.0");
    }
    let _ = writeln!(s, "[device]\n{}", device.toml());
    for (name, weight, workload) in tenants(property, device) {
        let _ = writeln!(
            s,
            "[[tenant]]\nname = \"{name}\"\nweight = {weight}\nworkload = {workload}"
        );
    }
    Scenario::parse(&s, "conformance scenario", "conformance")
        .expect("conformance scenarios are valid")
}

/// The tenants of `property`'s scenario on `device`: name, weight, workload (TOML).
fn tenants(property: Property, device: Device) -> Vec<(String, f64, String)> {
    let mut out = Vec::new();
    let mut tenant = |name: String, weight: f64, workload: &str| {
        out.push((name, weight, workload.to_string()));
    };
    match property {
        Property::WorkConservation | Property::WorkConservationSwapped => {
            let (light, heavy) = match property {
                Property::WorkConservation => (4.0, 1.0),
                _ => (1.0, 4.0),
            };
            let reader = format!(
                "{{ pattern = \"randread\", size = \"4k\", rate_iops = {} }}",
                device.light_rate()
            );
            tenant("light".into(), light, &reader);
            tenant(
                "heavy".into(),
                heavy,
                "{ pattern = \"randwrite\", size = \"64k\", iodepth = 32 }",
            );
        }
        Property::Weights(_) | Property::DeepQueue => {
            let n = match property {
                Property::Weights(n) => n,
                _ => 8,
            };
            for i in 0..n {
                let workload = if property == Property::DeepQueue {
                    MIXED[i % MIXED.len()].replace("iodepth = 8", "iodepth = 16")
                } else {
                    MIXED[i % MIXED.len()].to_string()
                };
                tenant(format!("t{i}"), (i % 8 + 1) as f64, &workload);
            }
        }
        Property::Many(n) => {
            for i in 0..n {
                let workload = MIXED[i % MIXED.len()]
                    .replace("iodepth = 8", "iodepth = 2")
                    .replace("iodepth = 4", "iodepth = 2");
                // Evenly over 1–1000, in thousandths.
                let w = (1.0 + 999.0 * i as f64 / (n - 1) as f64) * 1000.0;
                tenant(format!("t{i}"), w.round() / 1000.0, &workload);
            }
        }
        Property::ReturnFromIdle | Property::Leaving => {
            let first = if property == Property::ReturnFromIdle {
                format!(
                    "{{ pattern = \"randread\", size = \"16k\", phases = [{{ idle = true, duration_s = {CHANGE_S} }}, {{ iodepth = 16 }}] }}"
                )
            } else {
                format!(
                    "{{ pattern = \"randread\", size = \"16k\", phases = [{{ iodepth = 16, duration_s = {CHANGE_S} }}] }}"
                )
            };
            tenant("t0".into(), 4.0, &first);
            tenant(
                "t1".into(),
                2.0,
                "{ pattern = \"randwrite\", size = \"16k\", iodepth = 16 }",
            );
            tenant(
                "t2".into(),
                1.0,
                "{ pattern = \"randread\", size = \"16k\", iodepth = 16 }",
            );
            tenant(
                "t3".into(),
                1.0,
                "{ pattern = \"randrw\", read_mix = 0.5, size = \"16k\", iodepth = 16 }",
            );
        }
        fixed => fixed_tenants(fixed, &mut tenant),
    }
    out
}

/// The tenants of the properties whose sets do not depend on the device.
fn fixed_tenants(property: Property, tenant: &mut dyn FnMut(String, f64, &str)) {
    match property {
        Property::DeepClosedLoops => {
            for (i, w) in [100.0, 50.0, 25.0, 10.0].into_iter().enumerate() {
                tenant(
                    format!("c{i}"),
                    w,
                    "{ pattern = \"randrw\", read_mix = 0.5, size = \"4k\", iodepth = 32 }",
                );
            }
        }
        Property::MixedCost => {
            tenant(
                "small".into(),
                1.0,
                "{ pattern = \"randwrite\", size = 512, align = 512, iodepth = 16 }",
            );
            tenant(
                "reads".into(),
                1.0,
                "{ pattern = \"randread\", size = \"4k\", iodepth = 16 }",
            );
            tenant(
                "large".into(),
                1.0,
                "{ pattern = \"write\", size = \"4m\", iodepth = 4 }",
            );
        }
        Property::SizeMix => {
            tenant(
                "small".into(),
                1.0,
                "{ pattern = \"randread\", size = 512, align = 512, iodepth = 16 }",
            );
            tenant(
                "stream".into(),
                1.0,
                "{ pattern = \"read\", size = \"1m\", iodepth = 4 }",
            );
            tenant(
                "large".into(),
                1.0,
                "{ pattern = \"randwrite\", size = \"1m\", iodepth = 4 }",
            );
        }
        Property::SequentialBesideRandom => {
            tenant(
                "stream".into(),
                1.0,
                "{ pattern = \"read\", size = \"1m\", iodepth = 16 }",
            );
            for (name, pattern) in [("r1", "randread"), ("r2", "randread"), ("w1", "randwrite")] {
                tenant(
                    name.into(),
                    1.0,
                    &format!("{{ pattern = \"{pattern}\", size = \"4k\", iodepth = 16 }}"),
                );
            }
        }
        Property::PoissonOverload => {
            for (i, w) in [1.0, 2.0, 4.0].into_iter().enumerate() {
                tenant(
                    format!("t{i}"),
                    w,
                    "{ pattern = \"randread\", size = \"16k\", rate_iops = 200000.0 }",
                );
            }
        }
        other => unreachable!("{other:?} has tenants of its own"),
    }
}

/// How a policy did on one property.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// The policy.
    pub policy: String,
    /// Device work rate (device time completed per second) ÷ `none`'s in the same
    /// scenario.
    pub vs_none: f64,
    /// Bytes per second ÷ `none`'s.
    pub bytes_vs_none: f64,
    /// The property's figures, in table order.
    pub figures: Vec<Figure>,
}

impl Verdict {
    /// Whether every figure with a target met it.
    pub fn pass(&self) -> bool {
        self.figures.iter().all(Figure::met)
    }

    /// The figure called `name`.
    pub fn figure(&self, name: &str) -> Option<&Figure> {
        self.figures.iter().find(|f| f.name == name)
    }
}

/// One judged number.
#[derive(Debug, Clone, PartialEq)]
pub struct Figure {
    /// What it is.
    pub name: &'static str,
    /// Its value (a fraction for errors and ratios, seconds for times).
    pub value: f64,
    /// The bound it must stay on the right side of; `None`: reported, not held (the
    /// baselines whose weaknesses the others fix).
    pub target: Option<f64>,
    /// `true`: the value must be at least the target; `false`: at most.
    pub at_least: bool,
}

impl Figure {
    /// `name` at `value`, held to `target` from below (`at_least`) or above.
    pub fn new(name: &'static str, value: f64, target: Option<f64>, at_least: bool) -> Self {
        Figure {
            name,
            value,
            target,
            at_least,
        }
    }
}

impl Figure {
    /// Whether the value is on the right side of the target (always, without one).
    pub fn met(&self) -> bool {
        match self.target {
            None => true,
            Some(t) if self.at_least => self.value >= t,
            Some(t) => self.value <= t,
        }
    }

    /// `name value (op target)`, with ✗ when missed: seconds, milliseconds, transitions
    /// per second and multiples (names ending `(s)`, `(ms)`, `(/s)`, `(× …)`) as
    /// numbers, the rest as percent.
    pub fn render(&self) -> String {
        let number = self.name.ends_with("(s)")
            || self.name.ends_with("(ms)")
            || self.name.ends_with("(/s)")
            || self.name.contains("(×");
        let value = if self.value.is_infinite() {
            "never".to_string()
        } else if self.name.contains("(×") {
            format!("{:.2}", self.value)
        } else if number {
            format!("{:.1}", self.value)
        } else {
            format!("{:.1} %", self.value * 100.0)
        };
        let op = if self.at_least { "≥" } else { "≤" };
        let target = match self.target {
            None => String::new(),
            Some(t) if self.name.contains("(×") => format!(" ({op} {t:.2})"),
            Some(t) if number => format!(" ({op} {t:.1})"),
            Some(t) => format!(" ({op} {:.0} %)", t * 100.0),
        };
        let mark = if self.met() { "" } else { " ✗" };
        format!("{} {value}{target}{mark}", self.name)
    }
}

/// What a policy shares, as a series per tenant: device time, bytes or requests.
fn shared(r: &RunResult) -> &[Vec<u64>] {
    match r.currency {
        Currency::DeviceTime => &r.timeseries.device_ns,
        Currency::Bytes => &r.timeseries.bytes,
        Currency::Requests => &r.timeseries.ios,
    }
}

/// The targets a policy is held to (`None`: reported only).
struct Targets {
    total: Option<f64>,
    whole_run: Option<f64>,
    per_second: Option<f64>,
    time_to_share: Option<f64>,
    overshoot: Option<f64>,
    /// Held to the longest-wait bound.
    waits: bool,
}

fn targets(policy: &str) -> Targets {
    if BASELINES.contains(&policy) {
        return Targets {
            total: None,
            whole_run: None,
            per_second: None,
            time_to_share: None,
            overshoot: None,
            waits: false,
        };
    }
    // The proportional-share policies by device time; mClock (requests) keeps the
    // looser per-second bound it has always had.
    let per_second = if policy.starts_with("mclock") {
        0.10
    } else {
        0.05
    };
    Targets {
        total: Some(0.95),
        whole_run: Some(0.02),
        per_second: Some(per_second),
        time_to_share: Some(0.5),
        overshoot: Some(0.10),
        waits: true,
    }
}

/// The longest a backlogged tenant may wait without a completion: a second, or what
/// the service floor promises when it is the bound ([`crate::policy::floor`]: an
/// [`FLOOR_EVERY`]th of the device's work rate serving one request of every tenant, at
/// their mean cost, both taken from `none`'s run).
pub(crate) fn wait_bound(none: &RunResult) -> f64 {
    let round: f64 = none
        .tenants
        .iter()
        .map(|t| t.device_time_s / t.ios.max(1) as f64)
        .sum();
    if none.device_work_rate <= 0.0 {
        return f64::INFINITY;
    }
    (f64::from(FLOOR_EVERY) * round / none.device_work_rate).max(1.0)
}

/// Runs `property` on `device` and judges every policy.
pub fn check(property: Property, device: Device, seed: u64) -> (ScenarioResult, Vec<Verdict>) {
    check_with(property, device, seed, &POLICIES)
}

/// Runs `property` on `device` for `policies` (scenario `policies` entries) and judges
/// them.
pub fn check_with(
    property: Property,
    device: Device,
    seed: u64,
    policies: &[&str],
) -> (ScenarioResult, Vec<Verdict>) {
    let s = scenario_with(property, device, seed, policies);
    let result = run_scenarios_with(std::slice::from_ref(&s), false, RunOptions::default())
        .expect("every policy builds");
    let verdicts = judge(property, &result);
    (result, verdicts)
}

/// Judges the runs of one property's `scenario`.
pub fn judge(property: Property, result: &ScenarioResult) -> Vec<Verdict> {
    let none = result
        .runs
        .iter()
        .find(|r| r.policy == "none")
        .expect("the baseline ran");
    let ratio = |x: f64, of_none: f64| if of_none > 0.0 { x / of_none } else { 0.0 };
    let bound = wait_bound(none);
    result
        .runs
        .iter()
        .filter(|r| r.policy != "none")
        .map(|r| {
            let t = targets(&r.policy);
            let vs_none = ratio(r.device_work_rate, none.device_work_rate);
            let bytes_vs_none = ratio(
                r.total_bandwidth_bytes_per_s,
                none.total_bandwidth_bytes_per_s,
            );
            // `none` runs the same mix only where one light tenant sits beside one
            // backlogged one: there the device's work is compared with it. Elsewhere
            // each tenant is judged against its own slice of the device alone (R):
            // `none` lets one kind of request take the device, a different mix.
            let same_mix = matches!(
                property,
                Property::WorkConservation | Property::WorkConservationSwapped
            );
            let mut figures = vec![
                Figure::new(
                    "device work (× none)",
                    vs_none,
                    t.total.filter(|_| same_mix),
                    true,
                ),
                Figure::new("bytes (× none)", bytes_vs_none, None, true),
            ];
            if !same_mix && let Some(lowest) = r.min_insulation {
                figures.push(Figure::new(
                    "lowest R (× its slice alone)",
                    lowest,
                    t.total.map(|_| INSULATED),
                    true,
                ));
            }
            figures.extend(property_figures(property, r, &t));
            if same_mix {
                // A tenant under its share waits no longer than under no control: a
                // fair scheduler's first property (the issue on bursts and SLOs).
                let light = |run: &RunResult| run.tenants[0].latency_us;
                figures.push(Figure::new(
                    "light latency (× none)",
                    ratio(light(r).mean, light(none).mean),
                    t.total.map(|_| 1.0),
                    false,
                ));
                figures.push(Figure::new(
                    "light p99 (× none)",
                    ratio(light(r).p99, light(none).p99),
                    None,
                    false,
                ));
            }
            figures.push(Figure::new(
                "longest wait (s)",
                r.longest_wait_s,
                t.waits.then_some(bound),
                false,
            ));
            Verdict {
                policy: r.policy.clone(),
                vs_none,
                bytes_vs_none,
                figures,
            }
        })
        .collect()
}

/// The figures `property` judges `r` on beyond its totals and its longest wait.
fn property_figures(property: Property, r: &RunResult, t: &Targets) -> Vec<Figure> {
    let mut out = Vec::new();
    let series = shared(r);
    match property {
        Property::WorkConservation => {
            out.push(Figure::new(
                "light tenant served",
                light_served(r),
                t.total,
                true,
            ));
        }
        Property::WorkConservationSwapped => {}
        Property::MixedCost | Property::SizeMix => {
            // Bytes cannot compare a 512 B request with a 1 MiB one: every
            // policy is read in device time here.
            let (whole, per_second) = share_errors(r, &r.timeseries.device_ns);
            out.push(Figure::new(
                "device-time share error",
                whole,
                t.whole_run,
                false,
            ));
            out.push(Figure::new(
                "device-time share error per second",
                per_second,
                t.per_second,
                false,
            ));
        }
        Property::Weights(_)
        | Property::Many(_)
        | Property::DeepQueue
        | Property::PoissonOverload
        | Property::DeepClosedLoops
        | Property::SequentialBesideRandom => {
            let (whole, per_second) = share_errors(r, series);
            out.push(Figure::new("share error", whole, t.whole_run, false));
            out.push(Figure::new(
                "share error per second",
                per_second,
                t.per_second,
                false,
            ));
        }
        Property::ReturnFromIdle => {
            let (time, overshoot) = return_figures(r, series);
            out.push(Figure::new(
                "time to share (s)",
                time,
                t.time_to_share,
                false,
            ));
            out.push(Figure::new(
                "overshoot (points)",
                overshoot,
                t.overshoot,
                false,
            ));
        }
        Property::Leaving => out.push(Figure::new(
            "share error after",
            after_leaving_error(r, series),
            t.per_second,
            false,
        )),
    }
    out
}

/// The light tenant got what it asked for: its requests completed in the measured
/// span over those that arrived in it. (Over the offered rate, as before, a 4 s run
/// of 20 IOPS on the disk compared 80 ± 9 Poisson arrivals with their mean: 95.0 %
/// for every policy that served all it was sent.)
fn light_served(r: &RunResult) -> f64 {
    let light = &r.tenants[0];
    assert!(light.arrived > 0, "the light tenant sends requests");
    light.ios as f64 / light.arrived as f64
}

/// Share error over the whole run and per second (the 0.1 s intervals summed into
/// seconds) of `series` (device time, bytes or requests). Over the whole run: of the
/// tenants backlogged in the run, against their weights, each judging the tenants whose
/// share can be measured ([`measurable`]). Per second: by max-min, as the verdict's
/// per-interval figure ([`crate::metrics::entitled::max_min`]): a tenant asks for more
/// in a second when it did in any of its intervals ([`crate::metrics::Timeseries::hungry`]);
/// the others are entitled to what they moved (up to their weight's part), and each
/// tenant asking for more is compared with its entitled amount.
fn share_errors(r: &RunResult, series: &[Vec<u64>]) -> (f64, f64) {
    let per = (1.0 / INTERVAL_S).round() as usize;
    let weights: Vec<f64> = r.tenants.iter().map(|t| t.weight).collect();
    let backlogged: Vec<bool> = r.tenants.iter().map(|t| t.backlogged).collect();
    let per_request = mean_request(r, series);
    let bins = series.first().map_or(0, Vec::len);
    let sum = |from: usize, to: usize| -> Vec<f64> {
        series
            .iter()
            .map(|s| s[from..to].iter().sum::<u64>() as f64)
            .collect()
    };
    let moved = sum(0, bins);
    let whole_secs = bins as f64 * INTERVAL_S;
    let whole = share_error(
        &moved,
        &weights,
        &measurable(&moved, &weights, &backlogged, &per_request, whole_secs),
    );
    let claims: Vec<Claim> = weights
        .iter()
        .map(|&weight| Claim::weighted(weight))
        .collect();
    let hungry = &r.timeseries.hungry;
    let errors: Vec<f64> = (0..bins)
        .step_by(per)
        .filter_map(|start| {
            let end = (start + per).min(bins);
            let secs = (end - start) as f64 * INTERVAL_S;
            let moved = sum(start, end);
            let asking: Vec<bool> = (0..moved.len())
                .map(|i| {
                    hungry
                        .get(i)
                        .is_some_and(|h| h[start..end.min(h.len())].iter().any(|&x| x))
                })
                .collect();
            max_min_error(&moved, &claims, &asking, &per_request, secs)
        })
        .collect();
    (whole, mean(&errors))
}

/// Each tenant's mean request in `series`' unit over the run (0 without a completion).
fn mean_request(r: &RunResult, series: &[Vec<u64>]) -> Vec<f64> {
    series
        .iter()
        .zip(&r.timeseries.ios)
        .map(|(s, ios)| s.iter().sum::<u64>() as f64 / ios.iter().sum::<u64>().max(1) as f64)
        .collect()
}

fn mean(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        0.0
    } else {
        xs.iter().sum::<f64>() / xs.len() as f64
    }
}

/// The returning tenant (0): seconds from its return until a 0.1 s interval in which it
/// got at least 90 % of its ideal share, and the most it got above its ideal share over
/// any half second after that (in share points; half seconds, because a time-slice
/// scheduler's shares swing within one round by design).
fn return_figures(r: &RunResult, series: &[Vec<u64>]) -> (f64, f64) {
    let weights: Vec<f64> = r.tenants.iter().map(|t| t.weight).collect();
    let ideal = weights[0] / weights.iter().sum::<f64>();
    let first = (CHANGE_S / INTERVAL_S).round() as usize;
    let bins = series[0].len();
    let share = |from: usize, to: usize| {
        let total: u64 = series.iter().map(|s| s[from..to].iter().sum::<u64>()).sum();
        if total == 0 {
            0.0
        } else {
            series[0][from..to].iter().sum::<u64>() as f64 / total as f64
        }
    };
    let reached = (first..bins).find(|&b| share(b, b + 1) >= 0.9 * ideal);
    let time = reached.map_or(f64::INFINITY, |b| (b + 1 - first) as f64 * INTERVAL_S);
    let half = (0.5 / INTERVAL_S).round() as usize;
    let overshoot = (first..bins)
        .step_by(half)
        .map(|b| share(b, (b + half).min(bins)) - ideal)
        .fold(0.0_f64, f64::max);
    (time, overshoot)
}

/// After the first tenant left (from 0.5 s after it stopped): the others' share error
/// per second against their weights.
fn after_leaving_error(r: &RunResult, series: &[Vec<u64>]) -> f64 {
    let weights: Vec<f64> = r.tenants.iter().map(|t| t.weight).collect();
    let stayed: Vec<bool> = (0..weights.len()).map(|i| i != 0).collect();
    let first = ((CHANGE_S + 0.5) / INTERVAL_S).round() as usize;
    let per = (1.0 / INTERVAL_S).round() as usize;
    let bins = series[0].len();
    let mut errors = Vec::new();
    let mut start = first;
    while start < bins {
        let end = (start + per).min(bins);
        let bw: Vec<f64> = series
            .iter()
            .map(|s| s[start..end].iter().sum::<u64>() as f64)
            .collect();
        errors.push(share_error(&bw, &weights, &stayed));
        start = end;
    }
    mean(&errors)
}

/// The matrix as a Markdown table: one row per property × device × policy.
pub fn markdown(rows: &[(Property, Device, Vec<Verdict>)]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "| property | device | policy | figures | pass |");
    let _ = writeln!(out, "|---|---|---|---|---|");
    for (property, device, verdicts) in rows {
        for v in verdicts {
            let figures: Vec<String> = v.figures.iter().map(Figure::render).collect();
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} |",
                property.name(),
                device.name(),
                v.policy,
                figures.join("; "),
                match (v.figures.iter().all(|f| f.target.is_none()), v.pass()) {
                    (true, _) => "baseline",
                    (false, true) => "yes",
                    (false, false) => "no",
                }
            );
        }
    }
    out
}

/// Whether every verdict in `verdicts` is a baseline's (figures without targets).
fn baseline(v: &Verdict) -> bool {
    v.figures.iter().all(|f| f.target.is_none())
}

/// The matrix in a few lines a person reads: per policy (rows) and device (columns)
/// the cells passed of those held (baselines shown as such, without pass or fail),
/// then per figure how many held cells missed it, then the total.
pub fn summary(rows: &[(Property, Device, Vec<Verdict>)]) -> String {
    let cells: Vec<(&str, &Verdict)> = rows
        .iter()
        .flat_map(|(_, d, vs)| vs.iter().map(move |v| (d.key(), v)))
        .collect();
    summarize(&cells)
}

/// [`summary`] of cells given as (device, verdict): a cell whose figures have no
/// target (a baseline, or a case the device cannot serve) is not held.
pub(crate) fn summarize(cells: &[(&str, &Verdict)]) -> String {
    let mut policies: Vec<&str> = Vec::new();
    let mut devices: Vec<&str> = Vec::new();
    for (d, v) in cells {
        if !devices.contains(d) {
            devices.push(d);
        }
        if !policies.contains(&v.policy.as_str()) {
            policies.push(&v.policy);
        }
    }
    let count = |policy: &str, device: Option<&str>| -> String {
        let held: Vec<&Verdict> = cells
            .iter()
            .filter(|(d, v)| v.policy == policy && device.is_none_or(|x| x == *d))
            .map(|(_, v)| *v)
            .filter(|v| !baseline(v))
            .collect();
        if held.is_empty() {
            "baseline".into()
        } else {
            format!(
                "{}/{}",
                held.iter().filter(|v| v.pass()).count(),
                held.len()
            )
        }
    };
    let mut out = String::new();
    let _ = writeln!(out, "| policy | {} | all |", devices.join(" | "));
    let _ = writeln!(out, "|---|{}---|", "---|".repeat(devices.len()));
    for p in &policies {
        let per: Vec<String> = devices.iter().map(|d| count(p, Some(d))).collect();
        let _ = writeln!(out, "| {p} | {} | {} |", per.join(" | "), count(p, None));
    }
    // Why held cells fail: each missed figure, counted once per cell.
    let held: Vec<&Verdict> = cells
        .iter()
        .map(|(_, v)| *v)
        .filter(|v| !baseline(v))
        .collect();
    let mut reasons: Vec<(&str, usize)> = Vec::new();
    for v in &held {
        for f in v.figures.iter().filter(|f| !f.met()) {
            match reasons.iter_mut().find(|(n, _)| *n == f.name) {
                Some((_, k)) => *k += 1,
                None => reasons.push((f.name, 1)),
            }
        }
    }
    reasons.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    out.push('\n');
    if reasons.is_empty() {
        out.push_str("No held cell misses a figure.\n");
    } else {
        out.push_str("Figures missed (held cells):\n");
        for (name, k) in reasons {
            let _ = writeln!(out, "  {k:>4}  {name}");
        }
    }
    let _ = writeln!(
        out,
        "\n{} of {} held cells pass ({} cells, {} not held: baselines, or cases with no target)",
        held.iter().filter(|v| v.pass()).count(),
        held.len(),
        cells.len(),
        cells.len() - held.len()
    );
    out
}

/// The matrix as JSON: one object per cell with its property, device, policy, whether
/// it passed (`null` for a baseline) and its figures with their targets.
pub fn json(rows: &[(Property, Device, Vec<Verdict>)]) -> serde_json::Value {
    let cells: Vec<serde_json::Value> = rows
        .iter()
        .flat_map(|(p, d, vs)| {
            vs.iter().map(move |v| {
                let figures: Vec<serde_json::Value> = v
                    .figures
                    .iter()
                    .map(|f| {
                        serde_json::json!({
                            "name": f.name,
                            "value": if f.value.is_finite() { serde_json::json!(f.value) } else { serde_json::Value::Null },
                            "target": f.target,
                            "at_least": f.at_least,
                            "met": f.target.map(|_| f.met()),
                        })
                    })
                    .collect();
                serde_json::json!({
                    "property": p.name(),
                    "device": d.key(),
                    "policy": v.policy,
                    "pass": (!baseline(v)).then(|| v.pass()),
                    "figures": figures,
                })
            })
        })
        .collect();
    serde_json::json!({ "cells": cells })
}

/// Which of a sweep's rows a line of its table counts.
type Keep = Box<dyn Fn(Property, Device) -> bool>;

/// Pass counts over many runs of the matrix (seeds × devices): one row per property,
/// one column per policy, `passed/runs` in each cell, and the runs over all properties;
/// then the same per device. The default policy's column says so.
pub fn sweep_markdown(rows: &[(Property, Device, Vec<Verdict>)]) -> String {
    let mut policies: Vec<String> = Vec::new();
    for (_, _, verdicts) in rows {
        for v in verdicts {
            if !policies.contains(&v.policy) {
                policies.push(v.policy.clone());
            }
        }
    }
    let header: Vec<String> = policies
        .iter()
        .map(|p| match p.as_str() {
            crate::policy::DEFAULT_POLICY => format!("{p} (the default)"),
            _ => p.clone(),
        })
        .collect();
    // `passed/runs` of `policy` over the rows `keep` takes; "baseline" when no run
    // of it is held to a target.
    let count = |policy: &str, keep: &dyn Fn(Property, Device) -> bool| {
        let verdicts: Vec<&Verdict> = rows
            .iter()
            .filter(|(q, d, _)| keep(*q, *d))
            .flat_map(|(_, _, v)| v.iter().filter(|v| v.policy == policy))
            .collect();
        let passed = verdicts.iter().filter(|v| v.pass()).count();
        if verdicts
            .iter()
            .all(|v| v.figures.iter().all(|f| f.target.is_none()))
        {
            "baseline".to_string()
        } else {
            format!("{passed}/{}", verdicts.len())
        }
    };
    let mut out = String::new();
    let table = |out: &mut String, first: &str, lines: Vec<(String, Keep)>| {
        let _ = writeln!(out, "| {first} | {} |", header.join(" | "));
        let _ = writeln!(out, "|---|{}", "---|".repeat(policies.len()));
        for (name, keep) in lines {
            let cells: Vec<String> = policies.iter().map(|p| count(p, &*keep)).collect();
            let _ = writeln!(out, "| {name} | {} |", cells.join(" | "));
        }
    };
    let mut by_property: Vec<(String, Keep)> = Property::ALL
        .iter()
        .map(|&p| {
            let keep: Keep = Box::new(move |q, _| q == p);
            (p.name(), keep)
        })
        .collect();
    by_property.push(("all".to_string(), Box::new(|_, _| true)));
    table(&mut out, "property", by_property);
    let by_device: Vec<(String, Keep)> = Device::ALL
        .iter()
        .filter(|&&d| rows.iter().any(|(_, e, _)| *e == d))
        .map(|&d| {
            let keep: Keep = Box::new(move |_, e| e == d);
            (d.name().to_string(), keep)
        })
        .collect();
    out.push('\n');
    table(&mut out, "device", by_device);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(policy: &str, figures: Vec<Figure>) -> Verdict {
        Verdict {
            policy: policy.into(),
            vs_none: 1.0,
            bytes_vs_none: 1.0,
            figures,
        }
    }

    #[test]
    fn the_sweep_counts_runs_per_property_and_device_and_names_the_default() {
        let r = |v: f64| Figure::new("lowest R (× its slice alone)", v, Some(0.9), true);
        let base = |v: f64| Figure::new("lowest R (× its slice alone)", v, None, true);
        let p = Property::ALL[0];
        let q = Property::ALL[1];
        let rows = vec![
            (
                p,
                Device::Hdd,
                vec![
                    verdict("mclock", vec![r(0.95)]),
                    verdict("cfq", vec![base(0.1)]),
                ],
            ),
            (
                p,
                Device::Raid0,
                vec![
                    verdict("mclock", vec![r(0.5)]),
                    verdict("cfq", vec![base(0.1)]),
                ],
            ),
            (
                q,
                Device::Hdd,
                vec![
                    verdict("mclock", vec![r(0.91)]),
                    verdict("cfq", vec![base(0.1)]),
                ],
            ),
        ];
        let text = sweep_markdown(&rows);
        assert!(
            text.starts_with("| property | mclock (the default) | cfq |\n"),
            "{text}"
        );
        assert!(
            text.contains(&format!("| {} | 1/2 | baseline |\n", p.name())),
            "{text}"
        );
        assert!(
            text.contains(&format!("| {} | 1/1 | baseline |\n", q.name())),
            "{text}"
        );
        assert!(text.contains("| all | 2/3 | baseline |\n"), "{text}");
        assert!(
            text.contains("| device | mclock (the default) | cfq |\n"),
            "{text}"
        );
        assert!(
            text.contains("| hdd scsi-10k-73g | 2/2 | baseline |\n"),
            "{text}"
        );
        assert!(
            text.contains("| raid0 scsi-10k-73g-x8 | 0/1 | baseline |\n"),
            "{text}"
        );
        // A property no row has is counted as nothing held, a device no row has is left out.
        assert!(!text.contains("sata-840pro"), "{text}");
    }

    #[test]
    fn the_summary_counts_held_cells_and_the_figures_they_miss() {
        let r = |v: f64| Figure::new("lowest R (× its slice alone)", v, Some(0.9), true);
        let w = |v: f64| Figure::new("longest wait (s)", v, Some(1.0), false);
        let base = |v: f64| Figure::new("lowest R (× its slice alone)", v, None, true);
        let a = verdict("sfq", vec![r(0.95), w(0.2)]);
        let b = verdict("sfq", vec![r(0.5), w(2.0)]);
        let c = verdict("sfq", vec![r(0.4), w(0.1)]);
        let d = verdict("cfq", vec![base(0.1)]);
        let cells = [("hdd", &a), ("hdd", &b), ("raid0", &c), ("hdd", &d)];
        let text = summarize(&cells);
        assert!(text.contains("| sfq | 1/2 | 0/1 | 1/3 |"), "{text}");
        assert!(text.contains("| cfq | baseline | baseline |"), "{text}");
        assert!(
            text.contains("     2  lowest R (× its slice alone)\n"),
            "{text}"
        );
        assert!(text.contains("     1  longest wait (s)\n"), "{text}");
        assert!(
            text.contains("1 of 3 held cells pass (4 cells, 1 not held"),
            "{text}"
        );
    }
}
