//! Workload generators: one per tenant, fio-like (pattern, request size, region, closed
//! loop with an iodepth or open loop with Poisson arrivals), optionally in phases whose
//! load changes over time. Every random choice comes from the tenant's seeded RNG.

pub mod standins;
pub mod trace;

use crate::config::Invalid;
use crate::types::{Nanos, Op, secs_to_nanos};
use crate::units::ByteSize;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Deserialize;

/// Access pattern, named as in fio's `rw=`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Pattern {
    /// Sequential reads.
    Read,
    /// Sequential writes.
    Write,
    /// Sequential mixed reads and writes (`read_mix` of them reads).
    Rw,
    /// Random reads.
    RandRead,
    /// Random writes.
    RandWrite,
    /// Random mixed reads and writes (`read_mix` of them reads).
    RandRw,
}

impl Pattern {
    fn is_random(self) -> bool {
        matches!(
            self,
            Pattern::RandRead | Pattern::RandWrite | Pattern::RandRw
        )
    }
}

/// A workload as written in a scenario: either a stand-in's name or this table. Phases
/// take the same keys (plus `duration_s` and `idle`) and override the base.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadTable {
    /// A named stand-in (`fileserver`, `varmail`, ...) whose mix and size become defaults.
    pub standin: Option<String>,
    /// Access pattern (fio's `rw=`).
    pub pattern: Option<Pattern>,
    /// Fraction of reads for `rw` and `randrw` (0..=1).
    pub read_mix: Option<f64>,
    /// Fixed request size.
    pub size: Option<ByteSize>,
    /// Mean request size; sizes are drawn uniformly from aligned sizes around it.
    pub size_mean: Option<ByteSize>,
    /// Alignment of offsets and sizes (default 4 KiB).
    pub align: Option<ByteSize>,
    /// Closed loop: requests kept outstanding.
    pub iodepth: Option<u32>,
    /// Open loop: mean arrival rate, requests per second.
    pub rate_iops: Option<f64>,
    /// How open-loop arrivals are spaced: `poisson` (default), `linear` (evenly, as
    /// fio's `rate_process`), `pareto` (heavy-tailed gaps: bunches and silences) or
    /// `onoff` (Poisson in on periods of `on_ms`, nothing for `off_ms`; the mean stays
    /// `rate_iops`).
    pub rate_process: Option<ProcessName>,
    /// With `rate_process = "onoff"`: how long each on period lasts (ms, default 100).
    pub on_ms: Option<f64>,
    /// With `rate_process = "onoff"`: how long each off period lasts (ms, default 400).
    pub off_ms: Option<f64>,
    /// Phase length in seconds (phases only; the last phase may omit it to run to the end).
    pub duration_s: Option<f64>,
    /// No I/O in this phase.
    pub idle: Option<bool>,
    /// Segments run one after another; after the last one ends the tenant is idle.
    pub phases: Option<Vec<WorkloadTable>>,
    /// A recorded trace to replay instead of drawn requests ([`crate::trace::replay`]):
    /// its path (`${VAR}` and `$VAR` read from the environment; relative to the
    /// scenario file).
    pub trace: Option<String>,
    /// The trace's format (`auto`, the default, recognises it from its first line).
    pub format: Option<String>,
    /// Which of the trace's records this tenant replays.
    pub select: Option<SelectTable>,
    /// `original` (the default: the trace's arrival times, scaled by `speed`) or
    /// `closed` (as fast as `iodepth` allows).
    pub timing: Option<String>,
    /// With `timing = "original"`: how much faster than recorded (default 1).
    pub speed: Option<f64>,
    /// Start the trace again at its end (default false: the tenant goes idle).
    #[serde(rename = "loop")]
    pub looped: Option<bool>,
    /// How offsets land in the tenant's region: `wrap` (the default) or `scale`.
    pub remap: Option<String>,
    /// What a bad line does: `skip` (the default: counted in results.json) or `stop`.
    pub on_error: Option<String>,
}

/// Which records of a trace a tenant replays.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SelectTable {
    /// Only this volume (MSR's disk number, UMass's ASU, Alibaba's device id, Tencent's
    /// volume id, an iolog's file index from 0).
    pub disk: Option<u64>,
    /// The same as `disk`.
    pub volume: Option<u64>,
    /// Only records this many seconds or more after the trace's first.
    pub from_s: Option<f64>,
    /// Only records before this many seconds after the trace's first.
    pub to_s: Option<f64>,
    /// `blkparse`: the event taken as the request (`Q`, the default; `D`; `C`).
    pub event: Option<String>,
}

/// A workload in a scenario: a stand-in name or a table ([`WorkloadConfig::from_value`]).
#[derive(Debug, Clone)]
pub enum WorkloadConfig {
    /// A stand-in's name, with its defaults.
    Named(String),
    /// A workload table.
    Table(Box<WorkloadTable>),
}

/// How request sizes are drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SizeDist {
    /// Every request this many bytes.
    Fixed(u32),
    /// Uniform over multiples of `align` in `[min, max]`, or — with probability
    /// `wider` per million — in `[min, max + align]`: a mean that is not a whole number
    /// of half steps from `min` is kept exactly (the mixture of the two ranges).
    Uniform {
        /// Smallest size, bytes.
        min: u32,
        /// Largest size of the narrower range, bytes.
        max: u32,
        /// Step between sizes, bytes.
        align: u32,
        /// Draws per million that take the range one step wider.
        wider: u32,
    },
}

/// [`SizeDist::Uniform`]'s `wider` is per this many draws.
pub const PER_MILLION: u32 = 1_000_000;

impl SizeDist {
    /// Mean request size in bytes.
    pub fn mean(&self) -> f64 {
        match *self {
            SizeDist::Fixed(s) => s as f64,
            SizeDist::Uniform {
                min,
                max,
                wider,
                align,
            } => {
                (min as f64 + max as f64) / 2.0
                    + align as f64 / 2.0 * wider as f64 / PER_MILLION as f64
            }
        }
    }

    /// Largest request size in bytes.
    pub fn max(&self) -> u32 {
        match *self {
            SizeDist::Fixed(s) => s,
            SizeDist::Uniform {
                max, wider, align, ..
            } => max + if wider > 0 { align } else { 0 },
        }
    }
}

/// A spacing of open-loop arrivals as a workload table names it (`rate_process`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProcessName {
    /// [`RateProcess::Poisson`].
    #[default]
    Poisson,
    /// [`RateProcess::Linear`].
    Linear,
    /// [`RateProcess::Pareto`].
    Pareto,
    /// [`RateProcess::OnOff`], with `on_ms` and `off_ms`.
    OnOff,
}

/// Spacing of open-loop arrivals (fio's `rate_process`, and two bursty ones).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RateProcess {
    /// Exponential gaps: a Poisson process.
    #[default]
    Poisson,
    /// Equal gaps of 1 / rate: a source that conforms to a token bucket of its rate.
    Linear,
    /// Pareto gaps of shape [`PARETO_SHAPE`] and mean 1 / rate: infinite variance, so
    /// arrivals come in bunches (up to three times the rate) between long silences, as
    /// self-similar storage traffic does.
    Pareto,
    /// On periods of Poisson arrivals at rate × (on + off) / on, then nothing for the
    /// off period: a mean of the rate, in bursts.
    OnOff {
        /// Length of an on period, ns.
        on: Nanos,
        /// Length of an off period, ns.
        off: Nanos,
    },
}

/// The shape of [`RateProcess::Pareto`]'s gaps: 1.5 (finite mean, infinite variance).
pub const PARETO_SHAPE: f64 = 1.5;

/// How requests arrive.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arrivals {
    /// Keep `iodepth` requests outstanding.
    Closed {
        /// Requests kept outstanding.
        iodepth: u32,
    },
    /// Arrivals at a mean rate (requests per second).
    Open {
        /// Mean arrival rate, requests per second.
        rate_iops: f64,
        /// How arrivals are spaced.
        process: RateProcess,
    },
    /// At the times of a recorded trace ([`Workload::trace`], `timing = "original"`).
    Trace,
    /// No I/O.
    Idle,
}

/// One resolved phase.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Phase {
    /// When the phase begins, ns from the start of the run.
    pub start: Nanos,
    /// `None`: runs to the end of the run.
    pub end: Option<Nanos>,
    /// Access pattern.
    pub pattern: Pattern,
    /// Fraction of requests that are reads (1 for read patterns, 0 for write patterns).
    pub read_mix: f64,
    /// How request sizes are drawn.
    pub size: SizeDist,
    /// Alignment of offsets, bytes (a multiple of 512).
    pub align: u32,
    /// How requests arrive.
    pub arrivals: Arrivals,
}

/// A resolved, validated workload.
#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    /// Short description for reports (`fileserver (synthetic stand-in)`, `randwrite 4 KiB qd32`).
    pub label: String,
    /// The phases in time order, back to back from time 0 (a trace workload has one:
    /// its arrivals, closed or [`Arrivals::Trace`]).
    pub phases: Vec<Phase>,
    /// The trace replayed, for a trace workload.
    pub trace: Option<crate::trace::replay::TraceSpec>,
}

impl Workload {
    /// Phase active at time `t`, if any.
    pub fn phase_at(&self, t: Nanos) -> Option<(usize, &Phase)> {
        self.phases
            .iter()
            .enumerate()
            .find(|(_, p)| p.start <= t && p.end.is_none_or(|e| t < e))
    }

    /// Largest request this workload can issue.
    pub fn max_size(&self) -> u32 {
        self.phases.iter().map(|p| p.size.max()).max().unwrap_or(0)
    }
}

/// The settings a phase inherits and overrides.
#[derive(Debug, Clone)]
struct Knobs {
    pattern: Option<Pattern>,
    read_mix: Option<f64>,
    size: Option<u64>,
    size_mean: Option<u64>,
    align: u64,
    iodepth: Option<u32>,
    rate_iops: Option<f64>,
    rate_process: ProcessName,
    on_ms: Option<f64>,
    off_ms: Option<f64>,
    idle: bool,
}

/// The deepest closed loop a tenant may keep (fio's own `iodepth` limit is 65,536 too).
pub const MAX_IODEPTH: u32 = 65_536;
/// The highest open-loop rate a tenant may offer: ten million requests a second, above
/// any single device the presets model.
pub const MAX_RATE_IOPS: f64 = 10_000_000.0;

/// Settings one table may not give together: one of them would silently win.
fn conflicts(t: &WorkloadTable) -> Result<(), Invalid> {
    if let Some(key) = trace::trace_keys(t) {
        return Err(Invalid::new(
            key,
            "applies to a trace workload (set `trace`)",
        ));
    }
    if t.iodepth.is_some() && t.rate_iops.is_some() {
        return Err(Invalid::new(
            "iodepth/rate_iops",
            "a closed loop (iodepth) and an open loop (rate_iops) together: give one",
        ));
    }
    if t.size.is_some() && t.size_mean.is_some() {
        return Err(Invalid::new(
            "size/size_mean",
            "a fixed size and a drawn one together: give one",
        ));
    }
    if t.read_mix.is_some()
        && matches!(
            t.pattern,
            Some(Pattern::Read | Pattern::RandRead | Pattern::Write | Pattern::RandWrite)
        )
    {
        return Err(Invalid::new(
            "read_mix",
            "applies to the mixed patterns rw and randrw only",
        ));
    }
    Ok(())
}

impl Knobs {
    fn apply(&mut self, t: &WorkloadTable) {
        if t.pattern.is_some() {
            self.pattern = t.pattern;
        }
        if t.read_mix.is_some() {
            self.read_mix = t.read_mix;
        }
        if let Some(s) = t.size {
            self.size = Some(s.0);
            self.size_mean = None;
        }
        if let Some(s) = t.size_mean {
            self.size_mean = Some(s.0);
            self.size = None;
        }
        if let Some(a) = t.align {
            self.align = a.0;
        }
        if let Some(d) = t.iodepth {
            self.iodepth = Some(d);
            self.rate_iops = None;
        }
        if let Some(r) = t.rate_iops {
            self.rate_iops = Some(r);
            self.iodepth = None;
        }
        if let Some(p) = t.rate_process {
            self.rate_process = p;
        }
        if let Some(v) = t.on_ms {
            self.on_ms = Some(v);
        }
        if let Some(v) = t.off_ms {
            self.off_ms = Some(v);
        }
        self.idle = t.idle.unwrap_or(false);
    }

    /// The arrival process the knobs name, with its periods checked.
    fn process(&self) -> Result<RateProcess, Invalid> {
        if self.rate_process != ProcessName::OnOff {
            for (key, v) in [("on_ms", self.on_ms), ("off_ms", self.off_ms)] {
                if v.is_some() {
                    return Err(Invalid::new(
                        key,
                        "applies with rate_process = \"onoff\" only",
                    ));
                }
            }
        }
        Ok(match self.rate_process {
            ProcessName::Poisson => RateProcess::Poisson,
            ProcessName::Linear => RateProcess::Linear,
            ProcessName::Pareto => RateProcess::Pareto,
            ProcessName::OnOff => {
                let period = |key: &str, v: Option<f64>, default: f64| {
                    let ms = v.unwrap_or(default);
                    if !(0.001..=3_600_000.0).contains(&ms) {
                        return Err(Invalid::new(
                            key,
                            format!("must be in [0.001, 3600000] ms, got {ms}"),
                        ));
                    }
                    Ok(secs_to_nanos(ms / 1e3).max(1))
                };
                RateProcess::OnOff {
                    on: period("on_ms", self.on_ms, 100.0)?,
                    off: period("off_ms", self.off_ms, 400.0)?,
                }
            }
        })
    }

    fn resolve(&self, start: Nanos, end: Option<Nanos>) -> Result<Phase, Invalid> {
        let pattern = self.pattern.ok_or_else(|| {
            Invalid::new(
                "pattern",
                "missing: set it (read, write, rw, randread, randwrite, randrw), or `standin`",
            )
        })?;
        let read_mix = match pattern {
            Pattern::Read | Pattern::RandRead => 1.0,
            Pattern::Write | Pattern::RandWrite => 0.0,
            Pattern::Rw | Pattern::RandRw => self.read_mix.unwrap_or(0.5),
        };
        if !(0.0..=1.0).contains(&read_mix) {
            return Err(Invalid::new(
                "read_mix",
                format!("must be between 0 and 1, got {read_mix}"),
            ));
        }
        let align = self.align;
        if align == 0 || !align.is_multiple_of(512) {
            return Err(Invalid::new(
                "align",
                format!("must be a positive multiple of 512 bytes, got {align}"),
            ));
        }
        const MAX_REQUEST: u64 = 32 << 20;
        let size = match (self.size, self.size_mean) {
            (Some(0), _) => return Err(Invalid::new("size", "must be > 0")),
            (_, Some(0)) => return Err(Invalid::new("size_mean", "must be > 0")),
            (Some(s), _) if s > MAX_REQUEST => {
                return Err(Invalid::new(
                    "size",
                    format!("{s} exceeds the 32 MiB request cap"),
                ));
            }
            (Some(s), _) => SizeDist::Fixed(s as u32),
            (None, Some(mean)) => {
                // Uniform over aligned sizes in [align, 2·mean − align]. Where that end
                // is not a multiple of align, a share of the draws goes one step wider
                // so that the mean is `mean` (the financial stand-in's 2,437 B in 512 B
                // steps: 7.52 steps, drawn as 7 or 8).
                let twice = (2 * mean).saturating_sub(align).max(align);
                let max = twice / align * align;
                let wider = ((twice - max) as f64 / align as f64 * PER_MILLION as f64) as u32;
                if max + if wider > 0 { align } else { 0 } > MAX_REQUEST {
                    return Err(Invalid::new(
                        "size_mean",
                        format!("{mean} draws sizes past the 32 MiB request cap"),
                    ));
                }
                SizeDist::Uniform {
                    min: align as u32,
                    max: max as u32,
                    align: align as u32,
                    wider,
                }
            }
            (None, None) => SizeDist::Fixed(4096),
        };
        let arrivals = if self.idle {
            Arrivals::Idle
        } else {
            match (self.iodepth, self.rate_iops) {
                (_, Some(r)) if !(r.is_finite() && r > 0.0 && r <= MAX_RATE_IOPS) => {
                    return Err(Invalid::new(
                        "rate_iops",
                        format!("must be in (0, {MAX_RATE_IOPS}], got {r}"),
                    ));
                }
                (_, Some(r)) => Arrivals::Open {
                    rate_iops: r,
                    process: self.process()?,
                },
                (Some(0), None) => {
                    return Err(Invalid::new(
                        "iodepth",
                        "must be ≥ 1 (use idle = true for no I/O)",
                    ));
                }
                (Some(d), None) if d > MAX_IODEPTH => {
                    return Err(Invalid::new(
                        "iodepth",
                        format!("must be at most {MAX_IODEPTH}, got {d}"),
                    ));
                }
                (Some(d), None) => Arrivals::Closed { iodepth: d },
                (None, None) => Arrivals::Closed { iodepth: 1 },
            }
        };
        Ok(Phase {
            start,
            end,
            pattern,
            read_mix,
            size,
            align: align as u32,
            arrivals,
        })
    }
}

/// Default iodepth of a stand-in (a few application threads).
pub const STANDIN_IODEPTH: u32 = 16;

impl WorkloadConfig {
    /// Reads a scenario's `workload` value: a stand-in's name or a table. Errors name
    /// the key and the problem (an untagged enum would only say that nothing matched).
    pub fn from_value(value: toml::Value) -> Result<Self, Invalid> {
        match value {
            toml::Value::String(name) => Ok(WorkloadConfig::Named(name)),
            toml::Value::Table(_) => serde_path_to_error::deserialize::<_, WorkloadTable>(value)
                .map(|t| WorkloadConfig::Table(Box::new(t)))
                .map_err(|e| {
                    let problem = e.inner().message().trim_end().to_string();
                    match e.path().to_string().as_str() {
                        "." | "" => Invalid::whole(problem),
                        path => Invalid::new(path, problem),
                    }
                }),
            other => Err(Invalid::whole(format!(
                "must be a stand-in's name or a table, got {} {other}",
                other.type_str()
            ))),
        }
    }

    /// Validates and resolves the workload. Errors say what is wrong; the caller adds
    /// where (file, tenant).
    pub fn resolve(&self) -> Result<Workload, Invalid> {
        match self {
            WorkloadConfig::Table(t) if t.trace.is_some() => trace::trace_workload(t),
            _ => self.resolve_drawn(),
        }
    }

    /// Resolves a stand-in or a table of drawn requests.
    fn resolve_drawn(&self) -> Result<Workload, Invalid> {
        let table = match self {
            WorkloadConfig::Named(n) => WorkloadTable {
                standin: Some(n.clone()),
                ..WorkloadTable::default()
            },
            WorkloadConfig::Table(t) => (**t).clone(),
        };
        let mut base = Knobs {
            pattern: None,
            read_mix: None,
            size: None,
            size_mean: None,
            align: 4096,
            iodepth: None,
            rate_iops: None,
            rate_process: ProcessName::Poisson,
            on_ms: None,
            off_ms: None,
            idle: false,
        };
        let mut label = String::new();
        if let Some(name) = &table.standin {
            let s = standins::standin(name).ok_or_else(|| {
                let problem = format!(
                    "unknown workload '{name}' (known: {})",
                    standins::names().join(", ")
                );
                match self {
                    WorkloadConfig::Named(_) => Invalid::whole(problem),
                    WorkloadConfig::Table(_) => Invalid::new("standin", problem),
                }
            })?;
            base.pattern = Some(Pattern::RandRw);
            base.read_mix = Some(s.read_mix);
            base.size_mean = Some(s.mean_size as u64);
            base.align = s.align as u64;
            base.iodepth = Some(STANDIN_IODEPTH);
            label = format!("{name} (synthetic stand-in)");
        }
        if table.duration_s.is_some() {
            return Err(Invalid::new(
                "duration_s",
                "belongs to a phase, not to the workload",
            ));
        }
        conflicts(&table)?;
        base.apply(&table);
        let phases = match &table.phases {
            None => vec![base.resolve(0, None)?],
            Some(list) if list.is_empty() => return Err(Invalid::new("phases", "is empty")),
            Some(list) => {
                let mut out = Vec::with_capacity(list.len());
                let mut start = 0;
                for (i, p) in list.iter().enumerate() {
                    let phase = format!("phase {}", i + 1);
                    let ctx = |e: Invalid| e.within(&phase);
                    if p.phases.is_some() || p.standin.is_some() {
                        return Err(ctx(Invalid::whole(
                            "a phase cannot contain `phases` or `standin`",
                        )));
                    }
                    conflicts(p).map_err(ctx)?;
                    let mut knobs = base.clone();
                    knobs.apply(p);
                    let end = match p.duration_s {
                        Some(d) if !(d.is_finite() && d > 0.0) => {
                            return Err(ctx(Invalid::new(
                                "duration_s",
                                format!("must be > 0, got {d}"),
                            )));
                        }
                        Some(d) => Some(start + secs_to_nanos(d)),
                        None if i + 1 == list.len() => None,
                        None => {
                            return Err(ctx(Invalid::new(
                                "duration_s",
                                "is required except on the last phase",
                            )));
                        }
                    };
                    out.push(knobs.resolve(start, end).map_err(ctx)?);
                    start = end.unwrap_or(start);
                }
                out
            }
        };
        if label.is_empty() {
            label = describe(&phases[0]);
            if phases.len() > 1 {
                label.push_str(&format!(" (+{} phases)", phases.len() - 1));
            }
        }
        Ok(Workload {
            label,
            phases,
            trace: None,
        })
    }
}

fn describe(p: &Phase) -> String {
    let pat = format!("{:?}", p.pattern).to_lowercase();
    let size = match p.size {
        SizeDist::Fixed(s) => crate::units::format_bytes(s as u64),
        SizeDist::Uniform { .. } => {
            format!("~{}", crate::units::format_bytes(p.size.mean() as u64))
        }
    };
    let load = match p.arrivals {
        Arrivals::Closed { iodepth } => format!("qd{iodepth}"),
        Arrivals::Open {
            rate_iops,
            process: RateProcess::Poisson,
        } => format!("{rate_iops} IOPS"),
        Arrivals::Open {
            rate_iops,
            process: RateProcess::Linear,
        } => format!("{rate_iops} IOPS linear"),
        Arrivals::Open {
            rate_iops,
            process: RateProcess::Pareto,
        } => format!("{rate_iops} IOPS pareto"),
        Arrivals::Open {
            rate_iops,
            process: RateProcess::OnOff { on, off },
        } => format!(
            "{rate_iops} IOPS on/off {}/{} ms",
            on as f64 / 1e6,
            off as f64 / 1e6
        ),
        Arrivals::Trace => "at the trace's times".into(),
        Arrivals::Idle => "idle".into(),
    };
    format!("{pat} {size} {load}")
}

/// Draws the requests of one tenant inside its region.
#[derive(Debug, Clone)]
pub struct Generator {
    rng: ChaCha8Rng,
    region_start: u64,
    region_len: u64,
    cursor: u64,
    /// [`RateProcess::OnOff`]: how far into the current on period the last arrival
    /// was, ns.
    on_pos: Nanos,
}

impl Generator {
    /// `seed` is the scenario seed; `stream` separates tenants so each has its own
    /// sequence whatever the others do.
    pub fn new(seed: u64, stream: u64, region_start: u64, region_len: u64) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        rng.set_stream(stream);
        Generator {
            rng,
            region_start,
            region_len,
            cursor: 0,
            on_pos: 0,
        }
    }

    /// The next request's operation, absolute offset and length.
    pub fn next_io(&mut self, phase: &Phase) -> (Op, u64, u32) {
        let len = match phase.size {
            SizeDist::Fixed(s) => s,
            SizeDist::Uniform {
                min,
                max,
                align,
                wider,
            } => {
                let mut steps = (max - min) / align;
                // Only a mixture draws twice: the other distributions' sequences stay.
                if wider > 0 && self.rng.random_range(0..PER_MILLION) < wider {
                    steps += 1;
                }
                min + self.rng.random_range(0..=steps) * align
            }
        };
        let op = match phase.read_mix {
            m if m >= 1.0 => Op::Read,
            m if m <= 0.0 => Op::Write,
            m => {
                if self.rng.random::<f64>() < m {
                    Op::Read
                } else {
                    Op::Write
                }
            }
        };
        let len64 = (len as u64).min(self.region_len);
        let offset = if phase.pattern.is_random() {
            let slots = (self.region_len - len64) / phase.align as u64 + 1;
            self.rng.random_range(0..slots) * phase.align as u64
        } else {
            if self.cursor + len64 > self.region_len {
                self.cursor = 0;
            }
            let o = self.cursor;
            self.cursor += len64;
            o
        };
        (op, self.region_start + offset, len64 as u32)
    }

    /// Time to the next open-loop arrival at a mean of `rate_iops` spaced as `process`
    /// says: exponential, exactly 1 / rate, Pareto, or exponential at the on periods'
    /// rate with the off periods crossed added.
    pub fn interarrival(&mut self, rate_iops: f64, process: RateProcess) -> Nanos {
        match process {
            RateProcess::Linear => secs_to_nanos(1.0 / rate_iops).max(1),
            RateProcess::Poisson => self.exponential(rate_iops),
            RateProcess::Pareto => {
                // 1 - u is in (0, 1]: the power is finite. Mean x_m × α / (α − 1).
                let u: f64 = self.rng.random::<f64>();
                let x_m = (PARETO_SHAPE - 1.0) / PARETO_SHAPE / rate_iops;
                secs_to_nanos(x_m * (1.0 - u).powf(-1.0 / PARETO_SHAPE)).max(1)
            }
            RateProcess::OnOff { on, off } => {
                let peak = rate_iops * (on + off) as f64 / on as f64;
                let gap = self.exponential(peak);
                let mut pos = self.on_pos.saturating_add(gap);
                let mut real = gap;
                if pos >= on {
                    let crossed = pos / on;
                    pos %= on;
                    real = real.saturating_add(crossed.saturating_mul(off));
                }
                self.on_pos = pos;
                real
            }
        }
    }

    /// An exponential gap at `rate_iops`.
    fn exponential(&mut self, rate_iops: f64) -> Nanos {
        let u: f64 = self.rng.random::<f64>();
        // 1 - u is in (0, 1]: ln is finite.
        secs_to_nanos(-(1.0 - u).ln() / rate_iops).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(toml_text: &str) -> WorkloadConfig {
        toml::from_str::<WorkloadTable>(toml_text)
            .map(|t| WorkloadConfig::Table(Box::new(t)))
            .unwrap()
    }

    /// The bursty processes keep the mean rate: on/off arrivals fall in the on periods
    /// only, Pareto gaps bunch (many far shorter than the mean) and have long tails.
    #[test]
    fn bursty_processes_keep_the_mean_and_come_in_bursts() {
        let w = table("pattern = 'randread'\nrate_iops = 1000\nrate_process = 'onoff'\non_ms = 50\noff_ms = 150")
            .resolve()
            .unwrap();
        let process = match w.phases[0].arrivals {
            Arrivals::Open { process, .. } => process,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            process,
            RateProcess::OnOff {
                on: 50_000_000,
                off: 150_000_000
            }
        );
        let mut g = Generator::new(7, 0, 0, 1 << 30);
        let mut at: Nanos = 0;
        let n = 20_000;
        for _ in 0..n {
            at += g.interarrival(1000.0, process);
            assert!(at % 200_000_000 < 50_000_000, "an arrival off: {at}");
        }
        let mean = at as f64 / n as f64;
        assert!((mean - 1e6).abs() < 0.05e6, "mean gap {mean} ns");
        let mut g = Generator::new(7, 0, 0, 1 << 30);
        let gaps: Vec<Nanos> = (0..n)
            .map(|_| g.interarrival(1000.0, RateProcess::Pareto))
            .collect();
        let mean = gaps.iter().sum::<Nanos>() as f64 / n as f64;
        assert!((mean - 1e6).abs() < 0.15e6, "mean gap {mean} ns");
        // The shortest is a third of the mean; half of them are under 0.53 of it.
        assert!(gaps.iter().all(|&g| g >= 333_333));
        let short = gaps.iter().filter(|&&g| g < 530_000).count();
        assert!(short > n * 45 / 100, "{short}");
        assert!(gaps.iter().any(|&g| g > 50_000_000), "a tail");
        for (text, says) in [
            (
                "pattern = 'randread'\nrate_iops = 10\non_ms = 5",
                "on_ms: applies with",
            ),
            (
                "pattern = 'randread'\nrate_iops = 10\nrate_process = 'onoff'\noff_ms = 0",
                "off_ms: must be in",
            ),
        ] {
            let e = table(text).resolve().unwrap_err().to_string();
            assert!(e.contains(says), "{text}: {e}");
        }
    }

    /// Two settings of which one would silently win, and numbers past their range, are
    /// refused with what to do.
    #[test]
    fn conflicting_and_unbounded_settings_are_refused() {
        for (text, says) in [
            (
                "pattern = 'randread'\niodepth = 4\nrate_iops = 100",
                "give one",
            ),
            (
                "pattern = 'randread'\nsize = '4k'\nsize_mean = '8k'",
                "give one",
            ),
            (
                "pattern = 'randread'\nread_mix = 0.3",
                "read_mix: applies to the mixed patterns rw and randrw only",
            ),
            (
                "pattern = 'randread'\niodepth = 1000000000",
                "iodepth: must be at most 65536",
            ),
            (
                "pattern = 'randread'\nrate_iops = 1e12",
                "rate_iops: must be in (0, 10000000]",
            ),
            (
                "pattern = 'randrw'\niodepth = 4\n[[phases]]\nduration_s = 1\niodepth = 2\nrate_iops = 5",
                "phase 1.iodepth/rate_iops: a closed loop (iodepth) and an open loop",
            ),
        ] {
            let e = table(text).resolve().unwrap_err().to_string();
            assert!(e.contains(says), "{text}: {e}");
        }
        // A phase may switch from a closed to an open loop: one setting per table.
        let w = table("pattern = 'randrw'\nread_mix = 0.7\niodepth = 4\n[[phases]]\nduration_s = 1\n[[phases]]\nrate_iops = 50")
            .resolve()
            .unwrap();
        assert_eq!(w.phases[1].read_mix, 0.7);
        assert!(matches!(w.phases[1].arrivals, Arrivals::Open { .. }));
    }

    #[test]
    fn standin_resolves_with_published_statistics() {
        let w = WorkloadConfig::Named("fileserver".into())
            .resolve()
            .unwrap();
        let p = w.phases[0];
        assert!((p.read_mix - 1.0 / 3.0).abs() < 1e-12);
        assert_eq!(p.size.mean(), 72.0 * 1024.0);
        assert_eq!(
            p.arrivals,
            Arrivals::Closed {
                iodepth: STANDIN_IODEPTH
            }
        );
        assert!(w.label.contains("synthetic stand-in"));
    }

    #[test]
    fn unknown_standin_lists_known_names() {
        let e = WorkloadConfig::Named("nope".into())
            .resolve()
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("unknown workload 'nope'") && e.contains("varmail"),
            "{e}"
        );
    }

    #[test]
    fn phases_inherit_and_override() {
        let w = table(
            r#"
            pattern = "randread"
            size = "4k"
            rate_iops = 100.0
            [[phases]]
            duration_s = 2
            [[phases]]
            duration_s = 1
            rate_iops = 300.0
            [[phases]]
            idle = true
            "#,
        )
        .resolve()
        .unwrap();
        assert_eq!(w.phases.len(), 3);
        assert_eq!(
            w.phases[0].arrivals,
            Arrivals::Open {
                rate_iops: 100.0,
                process: RateProcess::Poisson
            }
        );
        assert_eq!(
            w.phases[1].arrivals,
            Arrivals::Open {
                rate_iops: 300.0,
                process: RateProcess::Poisson
            }
        );
        assert_eq!(
            (w.phases[1].start, w.phases[1].end),
            (2_000_000_000, Some(3_000_000_000))
        );
        assert_eq!(w.phases[2].arrivals, Arrivals::Idle);
        assert_eq!(w.phase_at(2_500_000_000).unwrap().0, 1);
        assert_eq!(w.phase_at(9_000_000_000).unwrap().0, 2);
    }

    #[test]
    fn bad_values_are_named() {
        let cases = [
            ("pattern = \"randread\"\nsize = 0", "size: must be > 0"),
            ("pattern = \"randrw\"\nread_mix = 1.5", "read_mix"),
            ("pattern = \"randread\"\niodepth = 0", "iodepth"),
            ("size = \"4k\"", "pattern: missing"),
            (
                "pattern = \"read\"\n[[phases]]\nidle = true\n[[phases]]\nidle = false",
                "phase 1.duration_s: is required",
            ),
        ];
        for (text, want) in cases {
            let e = table(text).resolve().unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }

    #[test]
    fn generator_stays_in_region_and_is_aligned() {
        let w = WorkloadConfig::Named("varmail".into()).resolve().unwrap();
        let mut g = Generator::new(1, 3, 1 << 30, 64 << 20);
        let mut reads = 0;
        for _ in 0..10_000 {
            let (op, off, len) = g.next_io(&w.phases[0]);
            assert!(off >= 1 << 30 && off + len as u64 <= (1 << 30) + (64 << 20));
            assert_eq!(off % 4096, 0);
            assert_eq!(len % 4096, 0);
            reads += (op == Op::Read) as u32;
        }
        assert!((4_500..5_500).contains(&reads), "{reads}");
    }

    #[test]
    fn generator_is_deterministic_per_seed_and_stream() {
        let w = WorkloadConfig::Named("exchange".into()).resolve().unwrap();
        let draw = |seed, stream| {
            let mut g = Generator::new(seed, stream, 0, 1 << 30);
            (0..100)
                .map(|_| g.next_io(&w.phases[0]))
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(5, 1), draw(5, 1));
        assert_ne!(draw(5, 1), draw(5, 2));
        assert_ne!(draw(5, 1), draw(6, 1));
    }

    #[test]
    fn sequential_pattern_walks_and_wraps() {
        let w = table("pattern = \"write\"\nsize = \"512k\"")
            .resolve()
            .unwrap();
        let mut g = Generator::new(0, 0, 0, 2 << 20);
        let offs: Vec<u64> = (0..5).map(|_| g.next_io(&w.phases[0]).1).collect();
        assert_eq!(offs, vec![0, 512 << 10, 1 << 20, 3 << 19, 0]);
    }
}
