//! The `ioshare` command line.

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use ioshare::config::PolicyChoice;
use ioshare::device::DeviceModel;
use ioshare::device::ssd::{self, Precondition, SsdDevice};
use ioshare::scenario::Scenario;
use ioshare::scenario::cost::{self, Limits};
use ioshare::{policy, report, sim, workload};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Parser)]
#[command(
    name = "ioshare",
    version,
    about = "Storage QoS for tenants sharing one device: proportional share, SLOs, and the measurements to prove it."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Options of a real TARGET.
#[derive(clap::Args, Debug, Clone)]
struct RealTarget {
    /// Create TARGET as a file of this size when it does not exist (e.g. 4g).
    #[arg(long)]
    size: Option<String>,
    /// Allow writing to a TARGET this run did not create (a file or block device: its
    /// data is overwritten).
    #[arg(long)]
    destroy_data: bool,
    /// What the policies charge on a real TARGET: a TOML file with a [device] table,
    /// such as `calibrate --out` writes (default: a `fixed` stand-in of its size).
    #[arg(long, value_name = "FILE")]
    cost_device: Option<String>,
}

#[derive(Subcommand)]
enum Command {
    /// Run a scenario (TOML) in the deterministic simulator and compare its policies.
    Sim {
        /// Scenario file (see scenarios/ for examples).
        scenario: PathBuf,
        /// Write results.json, timeseries.csv and report.html into this directory.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Run only these policies (repeatable; default: the scenario's list).
        #[arg(long = "policy", value_name = "P")]
        policies: Vec<String>,
        /// Override the scenario's seed.
        #[arg(long)]
        seed: Option<u64>,
        /// Override the scenario's duration, seconds.
        #[arg(long)]
        duration: Option<f64>,
        /// No progress bar.
        #[arg(long, short)]
        quiet: bool,
        /// Run even when the scenario's estimated cost (memory, aging time, requests)
        /// is past the limits a run is refused above.
        #[arg(long)]
        force: bool,
    },
    /// Run the built-in demo (4 tenants, weights 10:7:4:1, aged SATA SSD: two busy, one
    /// that idles and returns, one with an SLO and a reservation; every policy) and write
    /// its report.
    Demo {
        /// Where the report goes.
        #[arg(long, default_value = "ioshare-demo")]
        out: PathBuf,
    },
    /// Serve the tenants of CONFIG as NBD exports (unix socket and/or TCP), scheduling
    /// their I/O with the configured policy; SIGTERM or Ctrl-C drains, syncs and exits;
    /// SIGHUP reloads tenants' weights, SLOs, reservations and limits from CONFIG.
    Serve {
        /// Server configuration (see examples/serve.toml).
        config: PathBuf,
        /// At shutdown, write the run's results.json, timeseries.csv and report.html
        /// (the simulator's formats, measured from start to the end of the drain) here.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Record every request as it arrives (time, export, operation, offset, length,
        /// FUA) to FILE in fio's iolog v3 format: `fio --read_iolog=FILE` replays it,
        /// one file per export.
        #[arg(long, value_name = "FILE")]
        capture: Option<PathBuf>,
        /// The capture file grows to at most this size (e.g. 512m, 4g); requests beyond
        /// it are counted and reported, not written.
        #[arg(long, value_name = "SIZE", default_value = "1g", requires = "capture")]
        capture_limit: ioshare::units::ByteSize,
    },
    /// Run the conformance suite: every proportional-share policy through a matrix of
    /// properties (work conservation, weight accuracy with 8 to 1,024 tenants, a deep
    /// device queue, return from idle, a tenant leaving, Poisson overload, mixed request
    /// sizes, a sequential stream beside random I/O) on SSD, disk and array models, and
    /// print the figures with their targets as a Markdown table (shares judged in device
    /// time). With --slo: the SLO policies (ta1, ta2, ta3, mclock) through compliant
    /// tenants beside violators and flooders instead.
    Conformance {
        /// Only this device: sata-aged, nvme-clean, nvme-aged, sata-aged-wb,
        /// nvme-aged-wb, hdd or raid0; with --slo nvme-aged, nvme-clean, hdd or raid0
        /// (repeatable; default all).
        #[arg(long = "device", value_name = "D")]
        devices: Vec<String>,
        /// Run the SLO part of the suite.
        #[arg(long)]
        slo: bool,
        /// Seed of every run.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Run the matrix for this many seeds (from --seed on) and print pass counts per
        /// property and policy instead of every figure.
        #[arg(long, default_value_t = 1)]
        seeds: u64,
    },
    /// Interference characterization (the SSD-analysis paper's method): a foreground
    /// stream — sequential or random, read or write, 4 KiB to 32 MiB — beside no
    /// background, a 4 KiB random reader or a 4 KiB random writer, under each policy
    /// (and each kernel scheduler of a block device). On a model (--device) or a real
    /// TARGET (a file or block device, O_DIRECT on io_uring). Prints the baseline
    /// bandwidth per pattern and size and the foreground's percentage of it with each
    /// background; --out writes characterize.json, characterize.csv and report.html.
    Characterize {
        /// A file or block device to measure (instead of --device). A path that does
        /// not exist is created with --size, filled, measured and removed.
        target: Option<PathBuf>,
        /// A device preset (see `ioshare list`) or a TOML file with a [device] table (a
        /// scenario, a `calibrate --out` file, or a file holding only that table).
        #[arg(long)]
        device: Option<String>,
        /// SSD models: clean or aged (default: the file's, else clean).
        #[arg(long)]
        precondition: Option<String>,
        /// Capacity of an SSD or disk model, GiB (default for a preset: 8; for a file:
        /// its own).
        #[arg(long)]
        capacity_gib: Option<f64>,
        /// Policies to compare (repeatable; default none, unless --kernel is given).
        #[arg(long = "policy", value_name = "P")]
        policies: Vec<String>,
        /// Kernel schedulers of a block-device TARGET, comma-separated, or `all` (each
        /// switched in sysfs for its runs and put back afterwards).
        #[arg(long, value_delimiter = ',')]
        kernel: Vec<String>,
        /// Foreground request sizes, comma-separated (default 4k,8k,...,32m).
        #[arg(long, value_delimiter = ',')]
        sizes: Vec<String>,
        /// Shortest cell, seconds (large requests get longer cells).
        #[arg(long, default_value_t = 1.0)]
        duration: f64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        #[command(flatten)]
        real: RealTarget,
        /// Write characterize.json, characterize.csv and report.html here.
        #[arg(long)]
        out: Option<PathBuf>,
        /// No progress bars.
        #[arg(long, short)]
        quiet: bool,
        /// Run even when a cell's estimated cost is past the limits.
        #[arg(long)]
        force: bool,
    },
    /// Measure a device and fit the `fitted` model to it: QD1 and QD32 times per size
    /// and direction, a write burst (the cache), reads beside writes. Writes the model
    /// as a [device] table (a scenario's, or the emulated backend's backend.device; a
    /// policy's cost model comes from it), then checks it: the characterize matrix of
    /// the target beside the model's, cell by cell, with the median and 90th
    /// percentile error.
    Calibrate {
        /// A file or block device to measure (instead of --device). A path that does
        /// not exist is created with --size, filled, measured and removed.
        target: Option<PathBuf>,
        /// A device model to calibrate against instead (a preset or a TOML file).
        #[arg(long)]
        device: Option<String>,
        /// SSD models: clean or aged.
        #[arg(long)]
        precondition: Option<String>,
        /// Capacity of a model, GiB (default for a preset: 8).
        #[arg(long)]
        capacity_gib: Option<f64>,
        /// Write the fitted [device] table here (default: print it).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Sizes of the check's characterize matrix, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "4k,64k,1m,16m")]
        check_sizes: Vec<String>,
        /// Skip the check.
        #[arg(long)]
        no_check: bool,
        /// Seconds per measurement (the write burst takes four times this).
        #[arg(long, default_value_t = 1.0)]
        probe_seconds: f64,
        /// Age a real TARGET first: random 4 KiB writes, this many times its size (a
        /// flash drive's steady state; takes long: 2 passes of 100 GiB at 100 MB/s is
        /// over an hour). A model ages with --precondition aged.
        #[arg(long, value_name = "PASSES")]
        age: Option<f64>,
        /// Write the measurements and the check as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
        #[command(flatten)]
        real: RealTarget,
        /// No progress bars.
        #[arg(long, short)]
        quiet: bool,
    },
    /// Score the PDC journal detector on a captured request stream (`serve --capture`)
    /// against the journal's true place: precision and recall per byte and per group,
    /// and what the first pass over the journal costs (the detector needs the log to
    /// wrap). The journal's place comes from `debugfs -R "stat <8>" DEVICE`.
    JournalCheck {
        /// The capture (fio iolog v3, as `serve --capture` writes it).
        capture: PathBuf,
        /// A file holding `debugfs -R "stat <8>"` output for the export's file system
        /// (the journal inode's extents).
        #[arg(long, value_name = "FILE")]
        extents: PathBuf,
        /// The file system's block size, bytes.
        #[arg(long, default_value_t = 4096)]
        block_size: u64,
        /// The export to score (default: the capture's only one).
        #[arg(long)]
        export: Option<String>,
        /// The export's size (default: the end of its furthest request).
        #[arg(long)]
        size: Option<ioshare::units::ByteSize>,
        /// Detector group size (as backend.pdc.group).
        #[arg(long)]
        group: Option<ioshare::units::ByteSize>,
        /// Minimum run before a wrap (as backend.pdc.min_run).
        #[arg(long)]
        min_run: Option<ioshare::units::ByteSize>,
        /// How far a second pass runs before it confirms the log (as
        /// backend.pdc.confirm).
        #[arg(long)]
        confirm: Option<ioshare::units::ByteSize>,
        /// How far past a run's end a write still extends it (as backend.pdc.gap).
        #[arg(long)]
        gap: Option<ioshare::units::ByteSize>,
        /// Print the scores as JSON.
        #[arg(long)]
        json: bool,
    },
    /// List policies, device presets and workload stand-ins.
    List,
    /// Build and precondition an SSD model and report how long it took (aging speed).
    Precondition {
        /// SSD preset.
        #[arg(long, default_value = "sata-840pro")]
        preset: String,
        /// Capacity in GiB (default: the preset's).
        #[arg(long)]
        capacity_gib: Option<f64>,
        /// Random overwrites as multiples of the logical space.
        #[arg(long, default_value_t = ssd::DEFAULT_AGING_PASSES)]
        passes: f64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Run even when the estimated memory or aging time is past the limits.
        #[arg(long)]
        force: bool,
    },
}

fn main() {
    let cli = Cli::parse();
    if let Err(e) = run(cli) {
        eprintln!("error: {e:#}");
        std::process::exit(2);
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Sim {
            scenario,
            out,
            policies,
            seed,
            duration,
            quiet,
            force,
        } => {
            let points = Scenario::load_points(&scenario)?;
            let point = |i: usize| -> Result<Scenario> {
                let mut s = points.get(i)?;
                override_scenario(&mut s, seed, duration, &policies)?;
                Ok(s)
            };
            // Every point is read and checked before the first runs (a mistake in the
            // last point is not found after hours), one point in memory at a time.
            let limits = Limits::default();
            let (mut series, mut device, mut aged) = (0.0f64, 0.0f64, false);
            for i in 0..points.len() {
                let s = point(i)?;
                aged |= aged_ssd(&s);
                if !force && let Some(why) = s.too_costly(limits) {
                    bail!(
                        "{}: not run: {why}. Make the scenario smaller, or give --force to run it anyway",
                        scenario.display()
                    );
                }
                let c = s.cost();
                series += c.series_bytes;
                device = device.max(c.device_bytes);
            }
            // A sweep keeps every point's time series for the report, and up to
            // KEPT_DEVICES devices built.
            let total = series + device * (ioshare::sim::KEPT_DEVICES + 1) as f64;
            if !force && points.len() > 1 && total > limits.memory_bytes {
                bail!(
                    "{}: not run: its {} points would take about {:.1} GiB of memory (every point's time series, {:.1} GiB, and the devices), more than {:.0} GiB. Split the sweep, lengthen interval_s, or give --force to run it anyway",
                    scenario.display(),
                    points.len(),
                    total / (1u64 << 30) as f64,
                    series / (1u64 << 30) as f64,
                    limits.memory_bytes / (1u64 << 30) as f64
                );
            }
            // Built again one at a time as the runs reach them (they were fine above; a
            // failure would stop the sweep with its error, after the points before it).
            let mut failed = None;
            let first = point(0)?;
            let rest = (1..points.len()).map_while(|i| match point(i) {
                Ok(s) => Some(s),
                Err(e) => {
                    failed = Some(e);
                    None
                }
            });
            let result = simulate(
                std::iter::once(first).chain(rest),
                aged,
                out.as_deref(),
                !quiet,
            );
            match failed {
                Some(e) => Err(e),
                None => result,
            }
        }
        Command::Demo { out } => {
            let mut s = Scenario::parse(ioshare::DEMO_SCENARIO, "built-in demo scenario", "demo")?;
            s.policies = policy::names()
                .into_iter()
                .map(PolicyChoice::named)
                .collect();
            let aged = aged_ssd(&s);
            simulate([s], aged, Some(&out), true)?;
            print!("{DEMO_LEGEND}");
            Ok(())
        }
        Command::Serve {
            config,
            out,
            capture,
            capture_limit,
        } => {
            let loaded = ioshare::server::config::ServerConfig::load(&config)?;
            let capture = capture.map(|path| (path, capture_limit.0));
            ioshare::server::serve(loaded, Some(config), out, capture)
        }
        Command::Conformance {
            devices,
            slo,
            seed,
            seeds,
        } => {
            if slo {
                slo_conformance(&devices, seed, seeds)
            } else {
                conformance(&devices, seed, seeds)
            }
        }
        Command::Characterize {
            target,
            device,
            precondition,
            capacity_gib,
            policies,
            kernel,
            sizes,
            duration,
            seed,
            real,
            out,
            quiet,
            force,
        } => characterize(Characterize {
            target: target.as_deref(),
            device: device.as_deref(),
            precondition: precondition.as_deref(),
            capacity_gib,
            policies: &policies,
            kernel: &kernel,
            sizes: &sizes,
            duration,
            seed,
            real: &real,
            out: out.as_deref(),
            progress: !quiet,
            force,
        }),
        Command::Calibrate {
            target,
            device,
            precondition,
            capacity_gib,
            out,
            check_sizes,
            no_check,
            probe_seconds,
            age,
            json,
            real,
            quiet,
        } => calibrate(Calibrate {
            target: target.as_deref(),
            device: device.as_deref(),
            precondition: precondition.as_deref(),
            capacity_gib,
            out: out.as_deref(),
            check_sizes: &check_sizes,
            check: !no_check,
            probe_seconds,
            age,
            json: json.as_deref(),
            real: &real,
            progress: !quiet,
        }),
        Command::JournalCheck {
            capture,
            extents,
            block_size,
            export,
            size,
            group,
            min_run,
            confirm,
            gap,
            json,
        } => journal_check(JournalCheck {
            capture: &capture,
            extents: &extents,
            block_size,
            export: export.as_deref(),
            size: size.map(|s| s.0),
            group: group.map(|s| s.0),
            min_run: min_run.map(|s| s.0),
            confirm: confirm.map(|s| s.0),
            gap: gap.map(|s| s.0),
            json,
        }),
        Command::List => {
            println!("policies:");
            for p in policy::registry() {
                println!("  {:<10} {}", p.name, p.summary);
            }
            println!("ssd presets:");
            for p in ssd::presets() {
                println!("  {:<12} {}", p.name, p.description);
            }
            println!("hdd presets:");
            for p in ioshare::device::hdd::presets() {
                println!("  {:<16} {}", p.name, p.about);
            }
            println!("raid0 presets:");
            for p in ioshare::device::raid0::presets() {
                println!("  {:<16} {}", p.name, p.about);
            }
            println!(
                "workload stand-ins (synthetic: published mix and mean size, not the traces):"
            );
            for w in workload::standins::STANDINS {
                println!("  {:<12} {}", w.name, w.source);
            }
            Ok(())
        }
        Command::Precondition {
            preset,
            capacity_gib,
            passes,
            seed,
            force,
        } => {
            let p = ssd::preset(&preset).with_context(|| format!("unknown preset '{preset}'"))?;
            let mut params = p.params;
            if let Some(c) = capacity_gib {
                // The scenario's own range (4 KiB of pages to 4 TiB).
                if !(c.is_finite() && c * 1024.0 * 1024.0 >= 4.0 && c <= 4096.0) {
                    bail!("--capacity-gib must be in [4 KiB, 4096] GiB, got {c}");
                }
                params.capacity_gib = c;
            }
            if !(passes.is_finite() && passes > 0.0 && passes <= 100.0) {
                bail!("--passes must be in (0, 100], got {passes}");
            }
            let limits = Limits::default();
            let memory = params.capacity_gib * cost::SSD_BYTES_PER_GIB;
            let aging = params.capacity_gib * passes * cost::AGING_SECONDS_PER_GIB_PASS;
            if !force && (memory > limits.memory_bytes || aging > limits.aging_seconds) {
                bail!(
                    "not run: about {:.1} GiB of memory and {aging:.0} s of aging (limits {:.0} GiB, {:.0} s); give --force to run it anyway",
                    memory / (1u64 << 30) as f64,
                    limits.memory_bytes / (1u64 << 30) as f64,
                    limits.aging_seconds
                );
            }
            let t = Instant::now();
            let mut d = SsdDevice::new(params);
            let built = t.elapsed();
            d.precondition(Precondition::Aged, passes, seed);
            let aged = t.elapsed();
            let g = d.ftl().geometry();
            println!(
                "{preset}: {:.1} GiB, {} dies × {} blocks × {} pages; allocated in {:.2} s, aged ({} passes) in {:.2} s",
                d.capacity_bytes() as f64 / (1u64 << 30) as f64,
                g.dies,
                g.blocks_per_die,
                g.pages_per_block,
                built.as_secs_f64(),
                passes,
                aged.as_secs_f64()
            );
            Ok(())
        }
    }
}

/// Runs the SLO conformance matrix and prints it.
fn slo_conformance(devices: &[String], first_seed: u64, seeds: u64) -> Result<()> {
    use ioshare::conformance::slo::{self, Case, SloDevice};
    let known: Vec<&str> = SloDevice::ALL.iter().map(|d| d.name()).collect();
    let devices: Vec<SloDevice> = if devices.is_empty() {
        SloDevice::ALL.to_vec()
    } else {
        devices
            .iter()
            .map(|d| {
                SloDevice::ALL
                    .into_iter()
                    .find(|k| k.name() == d)
                    .ok_or_else(|| {
                        anyhow::anyhow!(
                            "--device: unknown device '{d}' for --slo (known: {})",
                            known.join(", ")
                        )
                    })
            })
            .collect::<Result<_>>()?
    };
    if seeds == 0 {
        bail!("--seeds must be ≥ 1");
    }
    let mut outcomes = Vec::new();
    let (mut passed, mut total) = (0, 0);
    for seed in first_seed..first_seed.saturating_add(seeds) {
        for case in Case::all()
            .into_iter()
            .filter(|c| devices.contains(&c.device))
        {
            let t = Instant::now();
            let o = slo::check(case, seed);
            let pass = o.verdicts.iter().filter(|v| v.pass()).count();
            passed += pass;
            total += o.verdicts.len();
            eprintln!(
                "seed {seed}, {} on {} ({}): {pass} of {} policies pass ({:.1} s)",
                case.mix.name(),
                case.device.name(),
                case.spacing.name(),
                o.verdicts.len(),
                t.elapsed().as_secs_f64()
            );
            outcomes.push(o);
        }
    }
    if seeds > 1 {
        print!("{}", slo::sweep_markdown(&outcomes));
    } else {
        print!("{}", slo::markdown(&outcomes));
    }
    eprintln!("{passed} of {total} pass");
    Ok(())
}

/// Runs the conformance matrix and prints it.
fn conformance(devices: &[String], first_seed: u64, seeds: u64) -> Result<()> {
    use ioshare::conformance::{self, Device, Property};
    let devices: Vec<Device> = if devices.is_empty() {
        Device::ALL.to_vec()
    } else {
        devices
            .iter()
            .map(|d| {
                Device::ALL
                    .into_iter()
                    .find(|x| x.key() == d.as_str())
                    .ok_or_else(|| {
                        let known: Vec<&str> = Device::ALL.iter().map(|x| x.key()).collect();
                        anyhow::anyhow!(
                            "--device: unknown device '{d}' (known: {})",
                            known.join(", ")
                        )
                    })
            })
            .collect::<Result<_>>()?
    };
    if seeds == 0 {
        bail!("--seeds must be ≥ 1");
    }
    let mut rows = Vec::new();
    let (mut passed, mut total) = (0, 0);
    for seed in first_seed..first_seed.saturating_add(seeds) {
        for &device in &devices {
            for property in Property::ALL {
                let t = Instant::now();
                let (_, verdicts) = conformance::check(property, device, seed);
                passed += verdicts.iter().filter(|v| v.pass()).count();
                total += verdicts.len();
                eprintln!(
                    "seed {seed}, {} on {}: {} of {} policies pass ({:.1} s)",
                    property.name(),
                    device.name(),
                    verdicts.iter().filter(|v| v.pass()).count(),
                    verdicts.len(),
                    t.elapsed().as_secs_f64()
                );
                rows.push((property, device, verdicts));
            }
        }
    }
    if seeds > 1 {
        print!("{}", conformance::sweep_markdown(&rows));
    } else {
        print!("{}", conformance::markdown(&rows));
    }
    eprintln!("{passed} of {total} pass");
    Ok(())
}

/// What the demo's columns mean, printed under its table.
const DEMO_LEGEND: &str = "
How to read it (one block per policy; vm1, vm2 and vm3 keep the drive busy, vm3 is idle from 10 s to 20 s, vm4 agreed 300 reads/s within 20 ms):
  weight      the tenant's share weight (10:7:4:1)
  MB/s, IOPS  what the tenant completed, per second, after the warm-up
  share       its part of all bytes moved; ideal: what its weight entitles it to among the backlogged tenants (- when it is not: busy under half the time, or, like vm4, an open loop that got what it asked for)
  p50, p99    its response times (arrival to completion)
  SLO         the part of its requests answered within its rt (refused ones count as misses)
  summary     total throughput and its ratio to none; share error (how far shares are from ideal over the whole run, and per interval: read this one here, as the whole-run figure counts vm3 short for its idle phase); Jain's fairness index; GC's write amplification
  phase lines IOPS per tenant in each part of the run (vm3's idle phase in the middle); on: how long a token bucket was switched in
Policies: none (no scheduling), cfq/bfq/sfq/feedbac/mots (shares by weight), ta1/ta2/ta3 (token buckets for SLOs), mclock (reservations, weights, limits).
The report (report.html) opens on the policies compared (share error per interval, throughput vs none, worst p99, worst SLO satisfaction), then shares, phases and each tenant's bandwidth over time.
";

/// Applies the command line's overrides to one scenario.
fn override_scenario(
    s: &mut Scenario,
    seed: Option<u64>,
    duration: Option<f64>,
    policies: &[String],
) -> Result<()> {
    if let Some(seed) = seed {
        s.seed = seed;
    }
    if let Some(d) = duration {
        if !(d.is_finite() && d > 0.0) {
            bail!("--duration must be > 0");
        }
        let duration = ioshare::types::secs_to_nanos(d);
        if s.warmup >= duration {
            bail!(
                "--duration {d} s is not longer than the scenario's warmup_s ({} s), which is not measured: give a longer --duration",
                s.warmup as f64 / 1e9
            );
        }
        s.duration = duration;
    }
    no_policy_twice(policies)?;
    if !policies.is_empty() {
        // A name that matches one of the scenario's labels keeps its parameters.
        s.policies = policies
            .iter()
            .map(|p| {
                s.policies
                    .iter()
                    .find(|c| &c.label == p)
                    .cloned()
                    .unwrap_or_else(|| PolicyChoice::named(p))
            })
            .collect();
        for p in &s.policies {
            policy::build(&p.name, p.params.clone(), &s.specs())?;
        }
    }
    Ok(())
}

/// "2nd", "3rd", "4th".
fn ordinal(n: usize) -> String {
    let suffix = match (n % 10, n % 100) {
        (1, x) if x != 11 => "st",
        (2, x) if x != 12 => "nd",
        (3, x) if x != 13 => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

/// Fails now, not after the run, when `--out` cannot take the report: the folder is
/// created and a file written into it and removed.
fn check_out(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir)
        .map_err(|e| anyhow::anyhow!("--out {}: cannot create it: {e}", dir.display()))?;
    let probe = dir.join(".ioshare-write-test");
    std::fs::write(&probe, b"")
        .map_err(|e| anyhow::anyhow!("--out {}: cannot write into it: {e}", dir.display()))?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

/// Refuses a `--policy` given twice, naming which time.
fn no_policy_twice(policies: &[String]) -> Result<()> {
    if let Some((i, p)) = policies
        .iter()
        .enumerate()
        .find(|(i, p)| policies[..*i].contains(p))
    {
        bail!("--policy {p} is given twice (the {} time)", ordinal(i + 1));
    }
    Ok(())
}

/// `ioshare characterize`: checks every flag, builds the plan, refuses a costly one
/// unless forced, runs it and writes the report.
#[allow(clippy::too_many_arguments)]
/// `characterize`'s arguments.
struct Characterize<'a> {
    target: Option<&'a Path>,
    device: Option<&'a str>,
    precondition: Option<&'a str>,
    capacity_gib: Option<f64>,
    policies: &'a [String],
    kernel: &'a [String],
    sizes: &'a [String],
    duration: f64,
    seed: u64,
    real: &'a RealTarget,
    out: Option<&'a Path>,
    progress: bool,
    force: bool,
}

/// Request sizes from the command line, sorted; `None` when none were given.
fn parse_sizes(flag: &str, sizes: &[String]) -> Result<Option<Vec<u64>>> {
    if sizes.is_empty() {
        return Ok(None);
    }
    let mut v = Vec::new();
    for s in sizes {
        let b = ioshare::units::parse_bytes(s).map_err(|e| anyhow::anyhow!("{flag}: {e}"))?;
        if b == 0 || !b.is_multiple_of(4096) {
            bail!("{flag}: {s} is not a positive multiple of 4 KiB");
        }
        if v.contains(&b) {
            bail!("{flag}: {s} is given twice");
        }
        v.push(b);
    }
    v.sort_unstable();
    Ok(Some(v))
}

/// What is measured: a model, or a real target opened as the options say.
enum Measured {
    Model(ioshare::characterize::runner::ModelRunner),
    Live(ioshare::characterize::runner::LiveRunner),
}

impl Measured {
    fn open(
        target: Option<&Path>,
        device: Option<&str>,
        precondition: Option<&str>,
        capacity_gib: Option<f64>,
        real: &RealTarget,
        writes: bool,
    ) -> Result<Measured> {
        use ioshare::characterize::runner::{LiveRunner, ModelRunner};
        match (target, device) {
            (Some(_), Some(_)) => bail!("give a TARGET or --device, not both"),
            (None, None) => bail!(
                "nothing to measure: give a TARGET (a file or block device) or --device \
                 (a model: a preset such as intel-x25m, or a TOML file)"
            ),
            (None, Some(d)) => {
                if real.size.is_some() || real.destroy_data || real.cost_device.is_some() {
                    bail!(
                        "--size, --destroy-data and --cost-device are for a real TARGET, not a model"
                    );
                }
                Ok(Measured::Model(ModelRunner {
                    device: device_table(d, precondition, capacity_gib)?,
                }))
            }
            (Some(path), None) => {
                if precondition.is_some() || capacity_gib.is_some() {
                    bail!("--precondition and --capacity-gib are for a model, not a TARGET");
                }
                let create = real
                    .size
                    .as_deref()
                    .map(|s| {
                        ioshare::units::parse_bytes(s).map_err(|e| anyhow::anyhow!("--size: {e}"))
                    })
                    .transpose()?;
                let cost_device = real
                    .cost_device
                    .as_deref()
                    .map(|f| device_table(f, None, None))
                    .transpose()?;
                ioshare::target::stop_on_signals();
                let t = ioshare::target::Target::open(path, create, writes, real.destroy_data)?;
                let live = LiveRunner {
                    target: t,
                    cost_device,
                };
                if real.cost_device.is_some() {
                    // Checked now, not after a fill: the table with the target's size.
                    use ioshare::characterize::runner::Runner as _;
                    let file: ioshare::device::spec::DeviceFile = toml::Value::Table(live.device())
                        .try_into()
                        .map_err(|e: toml::de::Error| anyhow::anyhow!("--cost-device: {e}"))?;
                    file.spec().map_err(|e| {
                        anyhow::anyhow!("--cost-device: {}: {}", e.field, e.problem)
                    })?;
                }
                Ok(Measured::Live(live))
            }
        }
    }

    /// Fills a file this run created (so reads read data): after every flag has been
    /// checked, before the first measurement.
    fn prepare(&self, progress: bool) -> Result<()> {
        if let Measured::Live(l) = self
            && matches!(l.target.kind, ioshare::target::Kind::File { created: true })
        {
            l.target.fill(progress)?;
        }
        Ok(())
    }

    fn runner(&mut self) -> &mut dyn ioshare::characterize::runner::Runner {
        match self {
            Measured::Model(m) => m,
            Measured::Live(l) => l,
        }
    }

    /// The block device's name under /sys/block, for kernel schedulers.
    fn disk(&self) -> Option<&str> {
        match self {
            Measured::Live(l) => match &l.target.kind {
                ioshare::target::Kind::Block { sysfs } => Some(sysfs),
                _ => None,
            },
            Measured::Model(_) => None,
        }
    }
}

fn characterize(a: Characterize) -> Result<()> {
    use ioshare::characterize::{Plan, default_sizes};
    if let Some(dir) = a.out {
        check_out(dir)?;
    }
    if !(a.duration.is_finite() && a.duration > 0.0 && a.duration <= 3600.0) {
        bail!(
            "--duration must be in (0, 3600] seconds, got {}",
            a.duration
        );
    }
    let sizes = parse_sizes("--sizes", a.sizes)?.unwrap_or_else(default_sizes);
    let policies: Vec<String> = if a.policies.is_empty() && a.kernel.is_empty() {
        vec!["none".into()]
    } else {
        a.policies.to_vec()
    };
    no_policy_twice(&policies)?;
    let progress = a.progress && std::io::stderr().is_terminal();
    if let Some(k) = a
        .kernel
        .iter()
        .enumerate()
        .find_map(|(i, k)| a.kernel[..i].contains(k).then_some(k))
    {
        bail!("--kernel: {k} is given twice");
    }
    if a.kernel.len() > 1 && a.kernel.iter().any(|k| k == "all") {
        bail!("--kernel: `all` is every scheduler; give it alone");
    }
    let mut measured = Measured::open(
        a.target,
        a.device,
        a.precondition,
        a.capacity_gib,
        a.real,
        true,
    )?;
    let kernel: Vec<String> = match (a.kernel, measured.disk()) {
        ([], _) => Vec::new(),
        (_, None) => bail!(
            "--kernel: kernel schedulers are a block device's; {} (a loop device over a \
             file is one: losetup --direct-io=on -f --show FILE)",
            if a.target.is_some() {
                "this TARGET is not one"
            } else {
                "a model has none"
            }
        ),
        ([all], Some(disk)) if all == "all" => ioshare::target::schedulers(disk)?.0,
        (list, Some(disk)) => {
            let (offered, _) = ioshare::target::schedulers(disk)?;
            for k in list {
                if !offered.contains(k) {
                    bail!(
                        "--kernel: {disk} offers no '{k}' (it has: {})",
                        offered.join(", ")
                    );
                }
            }
            list.to_vec()
        }
    };
    let runner = measured.runner();
    let plan = Plan {
        device: runner.device(),
        policies: policies
            .iter()
            .map(|p| toml::Value::String(p.clone()).to_string())
            .collect(),
        sizes,
        min_seconds: a.duration,
        seed: a.seed,
        kernel,
    };
    // Every cell is parsed (sizes, device, policies checked) and costed before any runs.
    for s in plan.scenarios() {
        let s = s?;
        if !a.force
            && let Some(why) = s.too_costly(Limits::default())
        {
            bail!("not run: a cell: {why}. Give --force to run it anyway");
        }
    }
    let disk = measured.disk().map(str::to_string);
    measured.prepare(progress)?;
    let m = plan.run_on(measured.runner(), disk.as_deref(), progress)?;
    print!("{}", m.table());
    if let Some(dir) = a.out {
        m.write_all(dir)?;
        println!(
            "wrote {}, {} and {}",
            dir.join("characterize.json").display(),
            dir.join("characterize.csv").display(),
            dir.join("report.html").display()
        );
    }
    Ok(())
}

/// `calibrate`'s arguments.
struct Calibrate<'a> {
    target: Option<&'a Path>,
    device: Option<&'a str>,
    precondition: Option<&'a str>,
    capacity_gib: Option<f64>,
    out: Option<&'a Path>,
    check_sizes: &'a [String],
    check: bool,
    probe_seconds: f64,
    age: Option<f64>,
    json: Option<&'a Path>,
    real: &'a RealTarget,
    progress: bool,
}

fn calibrate(a: Calibrate) -> Result<()> {
    use ioshare::calibrate::{Timing, check, device_file, device_table, fit, measure};
    use ioshare::characterize::Plan;
    if !(a.probe_seconds.is_finite() && a.probe_seconds >= 0.05 && a.probe_seconds <= 600.0) {
        bail!(
            "--probe-seconds must be in [0.05, 600], got {}",
            a.probe_seconds
        );
    }
    let sizes = parse_sizes("--check-sizes", a.check_sizes)?.unwrap_or_default();
    for path in [a.out, a.json].into_iter().flatten() {
        if path.is_dir() {
            bail!("{} is a directory; give a file name", path.display());
        }
    }
    let progress = a.progress && std::io::stderr().is_terminal();
    if a.real.cost_device.is_some() {
        bail!("--cost-device is for characterize: calibrate writes the cost model (--out)");
    }
    if a.out.is_some() && a.out == a.json {
        bail!("--out and --json name the same file");
    }
    for (flag, path) in [("--out", a.out), ("--json", a.json)] {
        if let (Some(p), Some(d)) = (path, a.device)
            && Path::new(d) == p
        {
            bail!(
                "{flag} {} is the --device file calibrated against",
                p.display()
            );
        }
        // A name that cannot be written fails now, not after the measurements; an
        // existing file is kept as it is until the new one replaces it.
        if let Some(p) = path {
            let exists = p.exists();
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .open(p)
                .with_context(|| format!("{flag}: cannot write {}", p.display()))?;
            if !exists {
                let _ = std::fs::remove_file(p);
            }
        }
    }
    if let Some(passes) = a.age
        && !(passes.is_finite() && passes > 0.0 && passes <= 100.0)
    {
        bail!("--age must be in (0, 100] passes, got {passes}");
    }
    let mut measured = Measured::open(
        a.target,
        a.device,
        a.precondition,
        a.capacity_gib,
        a.real,
        true,
    )?;
    if a.age.is_some() && matches!(measured, Measured::Model(_)) {
        bail!("--age is for a real TARGET; a model ages with --precondition aged");
    }
    measured.prepare(progress)?;
    if let (Some(passes), Measured::Live(l)) = (a.age, &measured) {
        let t = std::time::Instant::now();
        l.target.age(passes, progress)?;
        println!(
            "aged {} with {passes} passes of random 4 KiB writes in {:.0} s",
            l.target.describe(),
            t.elapsed().as_secs_f64()
        );
    }
    let timing = Timing {
        probe_s: a.probe_seconds,
        burst_s: 4.0 * a.probe_seconds,
        burst_intervals: 80,
    };
    let started = std::time::Instant::now();
    let m = measure(measured.runner(), timing, 1, progress)?;
    print!("{}", m.table());
    let params = fit(&m)?;
    let file = device_file(&params, &m);
    println!(
        "fitted in {:.0} s: {}",
        started.elapsed().as_secs_f64(),
        ioshare::device::spec::DeviceSpec::Fitted(params.clone()).describe()
    );
    match a.out {
        Some(path) => {
            replace_file(path, file.as_bytes())?;
            println!("wrote {}", path.display());
        }
        None => print!("\n{file}"),
    }
    let checked = if a.check && !sizes.is_empty() {
        let plan = |device: toml::Table| Plan {
            device,
            policies: vec!["\"none\"".into()],
            sizes: sizes.clone(),
            min_seconds: a.probe_seconds,
            seed: 1,
            kernel: Vec::new(),
        };
        let runner = measured.runner();
        let target = plan(runner.device()).run_on(runner, None, progress)?;
        let model = plan(device_table(&params)).run(false)?;
        let c = check(&target, &model);
        println!("\nthe characterize matrix, target against model:");
        print!("{}", c.table());
        println!(
            "calibration and check took {:.0} s",
            started.elapsed().as_secs_f64()
        );
        Some(c)
    } else {
        None
    };
    if let Some(path) = a.json {
        let v = serde_json::json!({
            "measurements": m,
            "fitted": device_table(&params),
            "check": checked,
        });
        replace_file(path, (serde_json::to_string_pretty(&v)? + "\n").as_bytes())?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

/// Writes `bytes` to a file beside `path` and renames it over `path`: a reader (a
/// server reloading its `backend.cost_device`) sees the old file or the new one.
fn replace_file(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut partial = path.as_os_str().to_owned();
    partial.push(".partial");
    let partial = PathBuf::from(partial);
    std::fs::write(&partial, bytes)
        .with_context(|| format!("cannot write {}", partial.display()))?;
    std::fs::rename(&partial, path).with_context(|| format!("cannot write {}", path.display()))
}

/// The `[device]` table of a preset name or a TOML file, with the precondition and
/// capacity given on the command line.
fn device_table(
    device: &str,
    precondition: Option<&str>,
    capacity_gib: Option<f64>,
) -> Result<toml::Table> {
    let mut table = toml::Table::new();
    let model = if ssd::preset(device).is_some() {
        "ssd"
    } else if ioshare::device::hdd::preset(device).is_some() {
        "hdd"
    } else if ioshare::device::raid0::preset(device).is_some() {
        "raid0"
    } else {
        ""
    };
    if !model.is_empty() {
        table.insert("model".into(), model.into());
        table.insert("preset".into(), device.into());
        if model != "raid0" {
            table.insert("capacity_gib".into(), 8.0.into());
        }
    } else {
        let path = Path::new(device);
        if !path.is_file() {
            bail!("--device {device}: neither a preset (`ioshare list` names them) nor a file");
        }
        let text = std::fs::read_to_string(path).with_context(|| format!("--device {device}"))?;
        let mut doc: toml::Table =
            toml::from_str(&text).with_context(|| format!("--device {device}"))?;
        table = match doc.remove("device") {
            Some(toml::Value::Table(t)) => t,
            Some(_) => bail!("--device {device}: `device` is not a table"),
            None if doc.contains_key("model") => doc,
            None => bail!("--device {device}: no [device] table and no `model` key"),
        };
    }
    if let Some(p) = precondition {
        table.insert("precondition".into(), p.into());
    }
    if let Some(c) = capacity_gib {
        if table.get("model").and_then(|m| m.as_str()) == Some("raid0") {
            bail!(
                "--capacity-gib: a raid0 array's capacity is its members' (set `member.capacity_gib` in a device file)"
            );
        }
        table.insert("capacity_gib".into(), c.into());
    }
    Ok(table)
}

/// Whether the scenario starts from an aged SSD model (which takes a while to build).
fn aged_ssd(s: &Scenario) -> bool {
    matches!(
        s.device,
        ioshare::device::spec::DeviceSpec::Ssd {
            precondition: Precondition::Aged,
            ..
        }
    )
}

/// Runs the scenarios (a sweep's points, built as they are reached), prints the table
/// and writes the report into `out`.
fn simulate(
    all: impl IntoIterator<Item = Scenario>,
    aged: bool,
    out: Option<&Path>,
    progress: bool,
) -> Result<()> {
    if let Some(dir) = out {
        check_out(dir)?;
    }
    let show = progress && std::io::stderr().is_terminal();
    if show && aged {
        eprintln!("preconditioning the device (aging)...");
    }
    let result = sim::run_each(all, show, sim::RunOptions::default())?;
    print!("{}", report::table(&result));
    if let Some(dir) = out {
        report::write_all(&result, dir)?;
        println!(
            "wrote {}, {} and {}",
            dir.join("results.json").display(),
            dir.join("timeseries.csv").display(),
            dir.join("report.html").display()
        );
    }
    Ok(())
}

/// `journal-check`'s arguments.
struct JournalCheck<'a> {
    capture: &'a Path,
    extents: &'a Path,
    block_size: u64,
    export: Option<&'a str>,
    size: Option<u64>,
    group: Option<u64>,
    min_run: Option<u64>,
    confirm: Option<u64>,
    gap: Option<u64>,
    json: bool,
}

fn journal_check(a: JournalCheck) -> Result<()> {
    use ioshare::journal::{JournalParams, accuracy};
    let text = std::fs::read_to_string(a.capture)
        .with_context(|| format!("cannot read {}", a.capture.display()))?;
    let entries = ioshare::iolog::parse(&text).with_context(|| a.capture.display().to_string())?;
    let extents_text = std::fs::read_to_string(a.extents)
        .with_context(|| format!("cannot read {}", a.extents.display()))?;
    if a.block_size == 0 || !a.block_size.is_power_of_two() {
        bail!("--block-size {}: not a power of two", a.block_size);
    }
    let journal = accuracy::debugfs_extents(&extents_text, a.block_size)
        .map_err(|e| anyhow::anyhow!("{}: {e}", a.extents.display()))?;
    let mut files: Vec<&str> = entries.iter().map(|e| e.file.as_str()).collect();
    files.sort_unstable();
    files.dedup();
    let file = match (a.export, files.as_slice()) {
        (Some(e), _) if files.contains(&e) => e.to_string(),
        (Some(e), _) => bail!(
            "--export {e}: not in the capture (it has: {})",
            files.join(", ")
        ),
        (None, [one]) => one.to_string(),
        (None, []) => bail!("{}: no requests", a.capture.display()),
        (None, many) => bail!(
            "the capture has several exports ({}); name one with --export",
            many.join(", ")
        ),
    };
    let d = JournalParams::default();
    let params = JournalParams {
        group_bytes: a.group.unwrap_or(d.group_bytes),
        min_run_bytes: a.min_run.unwrap_or(d.min_run_bytes),
        confirm_bytes: a.confirm.unwrap_or(d.confirm_bytes),
        gap_bytes: a.gap.unwrap_or(d.gap_bytes),
        ..d
    };
    if let Err(e) = params.check() {
        bail!("detector thresholds: {}: {}", e.field, e.problem);
    }
    let end = entries
        .iter()
        .filter(|e| e.file == file)
        .map(|e| e.offset + e.len)
        .chain(journal.iter().map(|r| r.end))
        .max()
        .unwrap_or(0);
    let size = a.size.unwrap_or(end).max(end);
    if size.div_ceil(params.group_bytes) > ioshare::journal::MAX_GROUPS {
        bail!(
            "the export ({size} bytes, up to its furthest request) has more than {} groups of {} bytes; give a larger --group",
            ioshare::journal::MAX_GROUPS,
            params.group_bytes
        );
    }
    let s = accuracy::score(&entries, &file, size, params, &journal);
    if a.json {
        let mut v = serde_json::to_value(&s)?;
        v["byte_precision"] = s.byte_precision().into();
        v["byte_recall_after_wrap"] = s.byte_recall_after_wrap().into();
        v["group_precision"] = s.group_precision().into();
        v["group_recall"] = s.group_recall().into();
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let mib = |b: u64| b as f64 / 1048576.0;
    let secs =
        |us: Option<u64>| us.map_or("never".to_string(), |u| format!("{:.2} s", u as f64 / 1e6));
    println!(
        "export {file}: {} writes, {:.1} MiB",
        s.writes,
        mib(s.written_bytes)
    );
    println!(
        "journal: {:.1} MiB at {} ({:.1} MiB written, {:.1} % of all bytes); groups {:?}",
        mib(journal.iter().map(|r| r.end - r.start).sum()),
        journal
            .iter()
            .map(|r| format!("{}..{}", r.start, r.end))
            .collect::<Vec<_>>()
            .join(", "),
        mib(s.journal_bytes),
        100.0 * s.journal_bytes as f64 / s.written_bytes.max(1) as f64,
        s.journal_groups
    );
    println!(
        "first wrap at {}, detected at {}; first pass {:.1} MiB ({:.1} MiB of it missed)",
        secs(s.first_wrap_us),
        secs(s.detected_us),
        mib(s.first_pass_bytes),
        mib(s.missed_first_pass_bytes)
    );
    println!(
        "per byte: precision {:.4}, recall after the first wrap {:.4} ({:.2} MiB missed after it, {:.2} MiB of data routed as journal)",
        s.byte_precision(),
        s.byte_recall_after_wrap(),
        mib(s.missed_after_wrap_bytes),
        mib(s.false_positive_bytes)
    );
    println!(
        "per group: precision {:.3}, recall {:.3} (marked {:?})",
        s.group_precision(),
        s.group_recall(),
        s.marked_groups
    );
    Ok(())
}
