//! Interference characterization: how much of a foreground stream's bandwidth is left
//! when a small random reader or writer shares the device, per access pattern, request
//! size and scheduler.
//!
//! The method is the SSD-analysis paper's (Park & Yoo, "A performance analysis of Solid
//! State Disk for Linux I/O scheduler", Fig. 2–4; `specs/interference.md`): a
//! foreground process issuing one synchronous request at a time (sequential or random,
//! read or write, 4 KiB … 32 MiB doubling; the paper's 64 MB is past the largest
//! request a workload sends), beside no background, a 4 KiB random reader
//! or a 4 KiB random writer (each also one request at a time). Output 1 is the
//! foreground's baseline bandwidth per pattern and size (no background); output 2 its
//! bandwidth with each background as a percentage of that baseline, per scheduler.
//!
//! Readings chosen: "one process doing O_DIRECT I/O" is a closed loop of depth 1; the
//! foreground and background own the first and second half of the device (separate
//! files in the paper), so the background never touches the foreground's blocks; each
//! cell runs long enough for at least [`MIN_REQUESTS`] foreground requests at
//! [`FLOOR_MB_S`], however large they are, and its first fifth is warm-up. The
//! schedulers are ioshare's policies (the paper's CFQ, Anticipatory, Deadline and Noop
//! are kernel schedulers; `none` is the paper's Noop), run on the simulator's models:
//! every cell is deterministic for a device, seed and size list.

pub mod runner;

use crate::scenario::Scenario;
use runner::Runner;
use serde::Serialize;
use std::fmt::Write as _;

/// Why a measurement (`characterize`, `calibrate`) could not be made.
#[derive(Debug, thiserror::Error)]
pub enum MeasureError {
    /// What was asked cannot be measured, or what was measured cannot be fitted.
    #[error("{0}")]
    Invalid(String),
    /// A scenario of the matrix does not load.
    #[error(transparent)]
    Scenario(#[from] crate::config::ConfigError),
    /// A policy does not build.
    #[error(transparent)]
    Policy(#[from] crate::policy::PolicyError),
    /// A `[device]` table is wrong (`table` says which).
    #[error("{table} {}: {}", invalid.field, invalid.problem)]
    Device {
        /// Which table (`[device]`, `fitted`).
        table: &'static str,
        /// What is wrong.
        invalid: crate::config::Invalid,
    },
    /// The real target could not be opened or failed.
    #[error(transparent)]
    Target(#[from] crate::target::TargetError),
    /// The results could not be written.
    #[error(transparent)]
    Write(#[from] crate::output::WriteError),
}

/// Refuses a measurement unless `cond` holds, saying why.
macro_rules! ensure {
    ($cond:expr, $($t:tt)*) => {
        if !$cond {
            return Err($crate::characterize::MeasureError::Invalid(format!($($t)*)));
        }
    };
}
pub(crate) use ensure;

/// The foreground's access patterns, as a workload's `pattern` names them.
pub const PATTERNS: [Pattern; 4] = [
    Pattern::SeqRead,
    Pattern::SeqWrite,
    Pattern::RandRead,
    Pattern::RandWrite,
];

/// The backgrounds: none, the 4 KiB random reader, the 4 KiB random writer.
pub const BACKGROUNDS: [Background; 3] =
    [Background::None, Background::Reader4k, Background::Writer4k];

/// Each cell runs for at least this many foreground requests at [`FLOOR_MB_S`].
pub const MIN_REQUESTS: f64 = 8.0;
/// The slowest foreground the cell length is planned for, MB/s.
pub const FLOOR_MB_S: f64 = 50.0;

/// A foreground access pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Pattern {
    /// Sequential reads.
    SeqRead,
    /// Sequential writes.
    SeqWrite,
    /// Random reads.
    RandRead,
    /// Random writes.
    RandWrite,
}

impl Pattern {
    /// The name in tables and files.
    pub fn name(self) -> &'static str {
        match self {
            Pattern::SeqRead => "seq-read",
            Pattern::SeqWrite => "seq-write",
            Pattern::RandRead => "rand-read",
            Pattern::RandWrite => "rand-write",
        }
    }

    /// The name a workload's `pattern` gives it.
    pub fn workload_name(self) -> &'static str {
        match self {
            Pattern::SeqRead => "read",
            Pattern::SeqWrite => "write",
            Pattern::RandRead => "randread",
            Pattern::RandWrite => "randwrite",
        }
    }
}

/// What runs beside the foreground.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Background {
    /// Nothing: the baseline.
    None,
    /// 4 KiB random reads, one at a time (the paper's 4kReader).
    Reader4k,
    /// 4 KiB random writes, one at a time (the paper's 4kWriter).
    Writer4k,
}

impl Background {
    /// The name in tables and files.
    pub fn name(self) -> &'static str {
        match self {
            Background::None => "none",
            Background::Reader4k => "4k-reader",
            Background::Writer4k => "4k-writer",
        }
    }

    fn workload(self) -> &'static str {
        match self {
            // Present but idle, so that the foreground keeps the same half of the device.
            Background::None => {
                "{ pattern = \"randread\", size = \"4k\", iodepth = 1, phases = [{ idle = true }] }"
            }
            Background::Reader4k => "{ pattern = \"randread\", size = \"4k\", iodepth = 1 }",
            Background::Writer4k => "{ pattern = \"randwrite\", size = \"4k\", iodepth = 1 }",
        }
    }
}

/// What to characterize.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The device, as a scenario's `[device]` table.
    pub device: toml::Table,
    /// The policies (schedulers), as a scenario's `policies` entries name them.
    pub policies: Vec<String>,
    /// Foreground request sizes, bytes.
    pub sizes: Vec<u64>,
    /// Shortest cell, simulated seconds.
    pub min_seconds: f64,
    /// Seed of every run.
    pub seed: u64,
    /// Kernel I/O schedulers to run the matrix under (a block device's, switched in
    /// sysfs and put back), each with ioshare's `none` on top: cells labelled
    /// `kernel:<name>`.
    pub kernel: Vec<String>,
}

/// A measurement: one device, tenants on their own parts of it (`partition`), a list
/// of policies. Characterization and calibration build their scenarios with it.
#[derive(Debug, Clone, Copy)]
pub struct Bench<'a> {
    /// The device, as a scenario's `[device]` table.
    pub device: &'a toml::Table,
    /// Seed of the runs.
    pub seed: u64,
    /// Length, seconds.
    pub seconds: f64,
    /// Warm-up, seconds (not measured).
    pub warmup: f64,
    /// Time-series interval, seconds.
    pub interval: f64,
    /// Device queue depth (`None`: the scenario default).
    pub queue_depth: Option<u32>,
    /// Policies, as a scenario's `policies` entries name them (TOML strings).
    pub policies: &'a [String],
}

impl Bench<'_> {
    /// The scenario of these tenants: `(name, workload as an inline TOML table)`.
    pub fn scenario(
        &self,
        tenants: &[(&str, String)],
    ) -> Result<Scenario, crate::config::ConfigError> {
        let mut s = String::new();
        let _ = writeln!(s, "name = \"characterize\"");
        let _ = writeln!(s, "seed = {}", self.seed);
        let _ = writeln!(s, "duration_s = {}", self.seconds);
        let _ = writeln!(s, "warmup_s = {}", self.warmup);
        let _ = writeln!(s, "interval_s = {}", self.interval);
        if let Some(q) = self.queue_depth {
            let _ = writeln!(s, "queue_depth = {q}");
        }
        let _ = writeln!(s, "partition = true");
        let _ = writeln!(s, "policies = [{}]", self.policies.join(", "));
        let mut device = toml::Table::new();
        device.insert("device".into(), toml::Value::Table(self.device.clone()));
        let device = toml::to_string(&device).expect("a TOML table serializes");
        let _ = writeln!(s, "{device}");
        for (name, workload) in tenants {
            let _ = writeln!(s, "[[tenant]]\nname = \"{name}\"\nworkload = {workload}");
        }
        Scenario::parse(&s, "characterize", "characterize")
    }
}

/// The paper's sizes, 4 KiB doubling, up to 32 MiB: the largest request a workload
/// sends (the paper's last, 64 MB, is left out); 14 sizes.
pub fn default_sizes() -> Vec<u64> {
    (12..=25).map(|p| 1u64 << p).collect()
}

/// One cell of the matrix.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Cell {
    /// Foreground pattern.
    pub pattern: Pattern,
    /// Foreground request size, bytes.
    pub size: u64,
    /// What ran beside it.
    pub background: Background,
    /// The policy's label.
    pub policy: String,
    /// Foreground bandwidth, bytes per second.
    pub foreground_bytes_per_s: f64,
    /// Background bandwidth, bytes per second (0 without one).
    pub background_bytes_per_s: f64,
    /// Foreground p99 latency, µs (0 when nothing completed).
    pub foreground_p99_us: f64,
    /// Foreground bandwidth over its baseline (same pattern, size and policy, no
    /// background); `None` for the baseline itself or a baseline that moved nothing.
    pub of_baseline: Option<f64>,
}

/// The whole matrix.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Characterization {
    /// The device, in one line.
    pub device: String,
    /// Seed of every run.
    pub seed: u64,
    /// The policies' labels, in order.
    pub policies: Vec<String>,
    /// The sizes, bytes.
    pub sizes: Vec<u64>,
    /// Every cell: pattern × size × background × policy.
    pub cells: Vec<Cell>,
}

impl Plan {
    /// The scenario of one pattern, size and background, every policy in it.
    pub fn scenario(
        &self,
        pattern: Pattern,
        size: u64,
        background: Background,
    ) -> Result<Scenario, crate::config::ConfigError> {
        if self.policies.is_empty() {
            // Only kernel schedulers: their runs have ioshare's `none` on top.
            return self.scenario_with(pattern, size, background, &["\"none\"".to_string()]);
        }
        self.scenario_with(pattern, size, background, &self.policies)
    }

    fn scenario_with(
        &self,
        pattern: Pattern,
        size: u64,
        background: Background,
        policies: &[String],
    ) -> Result<Scenario, crate::config::ConfigError> {
        let seconds = self
            .min_seconds
            .max(MIN_REQUESTS * size as f64 / (FLOOR_MB_S * 1e6));
        let bench = Bench {
            device: &self.device,
            seed: self.seed,
            seconds,
            warmup: seconds / 5.0,
            interval: seconds / 10.0,
            queue_depth: None,
            policies,
        };
        bench.scenario(&[
            (
                "fg",
                format!(
                    "{{ pattern = \"{}\", size = {size}, iodepth = 1 }}",
                    pattern.workload_name()
                ),
            ),
            ("bg", background.workload().to_string()),
        ])
    }

    /// Every scenario of the matrix, in order: pattern, size, background.
    pub fn scenarios(
        &self,
    ) -> impl Iterator<Item = Result<Scenario, crate::config::ConfigError>> + '_ {
        PATTERNS.into_iter().flat_map(move |p| {
            self.sizes.iter().flat_map(move |&size| {
                BACKGROUNDS
                    .into_iter()
                    .map(move |b| self.scenario(p, size, b))
            })
        })
    }

    /// Runs the matrix on the simulator (every scenario on a copy of one device, built
    /// and preconditioned once), with progress bars when `progress`.
    pub fn run(&self, progress: bool) -> Result<Characterization, MeasureError> {
        self.run_on(
            &mut runner::ModelRunner {
                device: self.device.clone(),
            },
            None,
            progress,
        )
    }

    /// Runs the matrix on `runner` (`self.device` should be its [`Runner::device`]);
    /// the kernel schedulers are switched on `disk` (its name under `/sys/block`).
    pub fn run_on(
        &self,
        runner: &mut dyn Runner,
        disk: Option<&str>,
        progress: bool,
    ) -> Result<Characterization, MeasureError> {
        ensure!(!self.sizes.is_empty(), "no request sizes to characterize");
        ensure!(
            !self.policies.is_empty() || !self.kernel.is_empty(),
            "no policies or schedulers to characterize"
        );
        ensure!(
            self.kernel.is_empty() || disk.is_some(),
            "kernel schedulers are a block device's: this target has none"
        );
        let keys: Vec<(Pattern, u64, Background)> = PATTERNS
            .into_iter()
            .flat_map(|p| {
                self.sizes
                    .iter()
                    .flat_map(move |&size| BACKGROUNDS.into_iter().map(move |b| (p, size, b)))
            })
            .collect();
        // One pass for ioshare's policies, one per kernel scheduler.
        let none = ["\"none\"".to_string()];
        let mut passes: Vec<(Option<&str>, &[String])> = Vec::new();
        if !self.policies.is_empty() {
            passes.push((None, &self.policies));
        }
        for k in &self.kernel {
            passes.push((Some(k.as_str()), &none));
        }
        let mut cells = Vec::new();
        let mut policies = Vec::new();
        for (kernel, list) in passes {
            let scenarios: Vec<Scenario> = keys
                .iter()
                .map(|&(p, size, b)| self.scenario_with(p, size, b, list))
                .collect::<Result<_, _>>()?;
            let _guard = match (kernel, disk) {
                (Some(k), Some(d)) => Some(crate::target::SchedulerGuard::switch(d, k)?),
                _ => None,
            };
            let runs = runner.run(&scenarios, progress)?;
            let per = list.len();
            ensure!(
                runs.len() == scenarios.len() * per,
                "{} runs for {} scenarios of {per} policies",
                runs.len(),
                scenarios.len()
            );
            let label = |run: &crate::metrics::RunResult| match kernel {
                Some(k) => format!("kernel:{k}"),
                None => run.policy.clone(),
            };
            policies.extend(runs[..per].iter().map(label));
            for (&(p, size, b), runs) in keys.iter().zip(runs.chunks(per)) {
                for run in runs {
                    let fg = &run.tenants[0];
                    cells.push(Cell {
                        pattern: p,
                        size,
                        background: b,
                        policy: label(run),
                        foreground_bytes_per_s: fg.bandwidth_bytes_per_s,
                        background_bytes_per_s: run.tenants[1].bandwidth_bytes_per_s,
                        foreground_p99_us: if fg.ios > 0 { fg.latency_us.p99 } else { 0.0 },
                        of_baseline: None,
                    });
                }
            }
        }
        let device = runner.describe();
        against_baselines(&mut cells);
        Ok(Characterization {
            device,
            seed: self.seed,
            policies,
            sizes: self.sizes.clone(),
            cells,
        })
    }
}

/// Each cell against its baseline: same pattern, size and policy, no background.
fn against_baselines(cells: &mut [Cell]) {
    let baselines: Vec<f64> = cells
        .iter()
        .map(|c| {
            cells
                .iter()
                .find(|b| {
                    b.background == Background::None
                        && b.pattern == c.pattern
                        && b.size == c.size
                        && b.policy == c.policy
                })
                .map_or(0.0, |b| b.foreground_bytes_per_s)
        })
        .collect();
    for (c, base) in cells.iter_mut().zip(baselines) {
        if c.background != Background::None && base > 0.0 {
            c.of_baseline = Some(c.foreground_bytes_per_s / base);
        }
    }
}

impl Characterization {
    /// The cell of a pattern, size, background and policy.
    pub fn cell(
        &self,
        pattern: Pattern,
        size: u64,
        background: Background,
        policy: &str,
    ) -> Option<&Cell> {
        self.cells.iter().find(|c| {
            c.pattern == pattern
                && c.size == size
                && c.background == background
                && c.policy == policy
        })
    }

    /// The terminal tables: per policy the baseline MB/s per pattern and size, then per
    /// background, pattern and policy the foreground's percentage of its baseline.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "characterize {} (seed {})", self.device, self.seed);
        // The first column fits the longest label ("rand-write kernel:mq-deadline").
        let width = self
            .policies
            .iter()
            .map(|p| p.chars().count() + 11)
            .max()
            .unwrap_or(0)
            .max(22);
        let header = |out: &mut String, first: &str| {
            let _ = write!(out, "{first:<width$}");
            for &s in &self.sizes {
                let _ = write!(out, " {:>7}", short_size(s));
            }
            let _ = writeln!(out);
        };
        for policy in &self.policies {
            let _ = writeln!(out, "\nbaseline MB/s, no background, policy {policy}");
            header(&mut out, "pattern");
            for p in PATTERNS {
                let _ = write!(out, "{:<width$}", p.name());
                for &s in &self.sizes {
                    let v = self
                        .cell(p, s, Background::None, policy)
                        .map_or(0.0, |c| c.foreground_bytes_per_s / 1e6);
                    let _ = write!(out, " {v:>7.1}");
                }
                let _ = writeln!(out);
            }
        }
        for b in [Background::Reader4k, Background::Writer4k] {
            let _ = writeln!(out, "\nforeground % of baseline with the {}", b.name());
            header(&mut out, "pattern / policy");
            for p in PATTERNS {
                for policy in &self.policies {
                    let _ = write!(out, "{:<width$}", format!("{} {policy}", p.name()));
                    for &s in &self.sizes {
                        match self.cell(p, s, b, policy).and_then(|c| c.of_baseline) {
                            Some(x) => {
                                let _ = write!(out, " {:>6.0}%", x * 100.0);
                            }
                            None => {
                                let _ = write!(out, " {:>7}", "n/a");
                            }
                        }
                    }
                    let _ = writeln!(out);
                }
            }
        }
        out
    }

    /// Writes `characterize.json` and `characterize.csv` into `dir` (the report that
    /// draws them is `report::characterize`'s).
    pub fn write_data(&self, dir: &std::path::Path) -> Result<(), crate::output::WriteError> {
        crate::output::folder(dir)?;
        crate::output::write_json(&dir.join("characterize.json"), self)?;
        crate::output::write_csv(&dir.join("characterize.csv"), |w| {
            w.write_record([
                "pattern",
                "size_bytes",
                "background",
                "policy",
                "foreground_bytes_per_s",
                "background_bytes_per_s",
                "foreground_p99_us",
                "of_baseline",
            ])?;
            for c in &self.cells {
                w.write_record([
                    c.pattern.name().to_string(),
                    c.size.to_string(),
                    c.background.name().to_string(),
                    c.policy.clone(),
                    format!("{:.1}", c.foreground_bytes_per_s),
                    format!("{:.1}", c.background_bytes_per_s),
                    format!("{:.1}", c.foreground_p99_us),
                    c.of_baseline.map_or(String::new(), |x| format!("{x:.4}")),
                ])?;
            }
            Ok(())
        })
    }
}

/// `4K`, `1M`, `64M`: a power-of-two size in a column.
pub fn short_size(bytes: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(1 << 30, "G"), (1 << 20, "M"), (1 << 10, "K")];
    for (unit, name) in UNITS {
        if bytes >= unit && bytes.is_multiple_of(unit) {
            return format!("{}{name}", bytes / unit);
        }
    }
    format!("{bytes}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(device: &str, sizes: &[u64]) -> Plan {
        Plan {
            device: toml::from_str(device).unwrap(),
            policies: vec!["\"none\"".into(), "\"sfq\"".into()],
            sizes: sizes.to_vec(),
            min_seconds: 0.5,
            seed: 1,
            kernel: Vec::new(),
        }
    }

    /// Every pattern × size × background × policy has its cell, the baseline has no
    /// percentage and the others are against it; the same plan gives the same matrix.
    #[test]
    fn the_matrix_is_complete_and_deterministic() {
        let p = plan(
            "model = \"ssd\"\npreset = \"sata-840pro\"\ncapacity_gib = 1",
            &[4096, 1 << 20],
        );
        let m = p.run(false).unwrap();
        assert_eq!(m.cells.len(), 4 * 2 * 3 * 2);
        assert_eq!(m.policies, ["none", "sfq"]);
        for c in &m.cells {
            assert!(c.foreground_bytes_per_s > 0.0, "{c:?}");
            match c.background {
                Background::None => {
                    assert_eq!(c.of_baseline, None);
                    assert_eq!(c.background_bytes_per_s, 0.0);
                }
                _ => {
                    let base = m
                        .cell(c.pattern, c.size, Background::None, &c.policy)
                        .unwrap();
                    assert_eq!(
                        c.of_baseline,
                        Some(c.foreground_bytes_per_s / base.foreground_bytes_per_s)
                    );
                    assert!(c.background_bytes_per_s > 0.0);
                }
            }
        }
        assert_eq!(p.run(false).unwrap(), m);
        assert!(
            m.table()
                .contains("foreground % of baseline with the 4k-writer")
        );
    }

    /// On a device with one unit and a fixed service time, a foreground of depth 1
    /// beside a background of depth 1 under `none` gets the device every other request:
    /// at equal sizes, half its baseline.
    #[test]
    fn an_equal_background_halves_the_foreground_on_one_unit() {
        let p = Plan {
            policies: vec!["\"none\"".into()],
            ..plan(
                "model = \"fixed\"\nlatency_us = 100.0\nbandwidth_mb_s = 1000.0\nparallelism = 1",
                &[4096],
            )
        };
        let m = p.run(false).unwrap();
        for pattern in PATTERNS {
            let x = m
                .cell(pattern, 4096, Background::Reader4k, "none")
                .and_then(|c| c.of_baseline)
                .unwrap();
            assert!((x - 0.5).abs() < 0.01, "{pattern:?}: {x}");
        }
    }

    #[test]
    fn sizes_print_short() {
        assert_eq!(short_size(4096), "4K");
        assert_eq!(short_size(64 << 20), "64M");
        assert_eq!(short_size(3000), "3000");
        assert_eq!(default_sizes().len(), 14);
        assert_eq!(default_sizes()[13], 32 << 20);
    }
}
