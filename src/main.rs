//! The `ioshare` command line.

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use ioshare::config::PolicyChoice;
use ioshare::device::DeviceModel;
use ioshare::device::ssd::{self, Precondition, SsdDevice};
use ioshare::scenario::Scenario;
use ioshare::scenario::cost::{self, Limits};
use ioshare::{policy, report, workload};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Instant;

mod cli;

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
    Sim(cli::sim::SimArgs),
    /// Say which policy keeps a scenario's promises best: run it under every policy (or
    /// those named) and print the verdict — one paragraph, then a table with each
    /// policy's promises kept and missed and its throughput against `none`. A promise
    /// is a tenant's weight, reservation, limit or SLO; `sim` and every report end on
    /// the same verdict.
    Advise(cli::sim::SimArgs),
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
        /// Write the server's process id into FILE while it serves, locked, and remove it
        /// at exit; a FILE another running server holds is refused, and a symlink or
        /// anything but a plain file there is never written through.
        #[arg(long, value_name = "FILE")]
        pidfile: Option<PathBuf>,
        /// How log lines are written to stderr: `human` (`ioshare: ...`) or `json` (one
        /// object a line: timestamp, level, message and fields such as `tenant`).
        #[arg(long, value_enum, default_value = "human")]
        log_format: ioshare::server::logs::LogFormat,
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
        /// Judge these policies instead of the suite's (repeatable: a registered name,
        /// or a scenario's inline table such as `{ name = "govern", probe = 1.05 }`);
        /// a policy outside the suite, such as `govern`, is held to the suite's targets.
        #[arg(long = "policy", value_name = "P")]
        policies: Vec<String>,
        /// Print every cell's figures as a Markdown table (the one docs/conformance.md
        /// holds) instead of the summary.
        #[arg(long, conflicts_with = "json")]
        table: bool,
        /// Print every cell as JSON instead of the summary.
        #[arg(long)]
        json: bool,
    },
    /// Interference characterization (the SSD-analysis paper's method): a foreground
    /// stream — sequential or random, read or write, 4 KiB to 32 MiB — beside no
    /// background, a 4 KiB random reader or a 4 KiB random writer, under each policy
    /// (and each kernel scheduler of a block device). On a model (--device) or a real
    /// TARGET (a file or block device, O_DIRECT on io_uring). Prints the baseline
    /// bandwidth per pattern and size and the foreground's percentage of it with each
    /// background; --out writes characterize.json, characterize.csv and report.html.
    Characterize(cli::characterize::Args),
    /// Measure a device and fit the `fitted` model to it: QD1 and QD32 times per size
    /// and direction, a write burst (the cache), reads beside writes. Writes the model
    /// as a [device] table (a scenario's, or the emulated backend's backend.device; a
    /// policy's cost model comes from it), then checks it: the characterize matrix of
    /// the target beside the model's, cell by cell, with the median and 90th
    /// percentile error.
    Calibrate(cli::calibrate::Args),
    /// Score the PDC journal detector on a captured request stream (`serve --capture`)
    /// against the journal's true place: precision and recall per byte and per group,
    /// and what the first pass over the journal costs (the detector needs the log to
    /// wrap). The journal's place comes from `debugfs -R "stat <8>" DEVICE`.
    JournalCheck(cli::journal_check::Args),
    /// Recorded block traces (MSR Cambridge, UMass/SPC, Alibaba, Tencent CBS, blkparse,
    /// fio iologs and `serve --capture`): their figures, and conversion between formats.
    /// A scenario replays one with `workload = { trace = "FILE" }`.
    Trace(cli::trace::Args),
    /// List policies, device presets and workload stand-ins.
    List,
    /// Share a block device between cgroups by ioshare's governor: every period each
    /// cgroup's I/O is read and the kernel's throttle limits (`io.max`, v1
    /// `blkio.throttle.*`) set from the weights and SLOs; the limits found are put back at the end.
    /// Experimental: on real devices the weights hold but not yet the throughput
    /// (docs/govern.md).
    Govern(cli::govern::Args),
    /// Send one request to a running server's control socket (`server.control`): add,
    /// change, drain, resume or remove a tenant, or read its figures, without a restart.
    #[command(after_help = cli::ctl::commands_help())]
    Ctl(cli::ctl::Args),
    /// Print the shell completion script for SHELL (e.g. `ioshare completions bash >
    /// /etc/bash_completion.d/ioshare`).
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
    /// Write man pages (ioshare.1 and one per subcommand) into a folder.
    Man {
        /// The folder (created when missing).
        #[arg(long, default_value = "man")]
        out: PathBuf,
    },
    /// Run the live engine's core on a simulated network and disk with faults (slow and
    /// vanishing clients, short and failed I/O, crashes), seed by seed, checking its
    /// properties after every event; a failing seed is printed with the command that
    /// replays it.
    EngineSwarm(cli::engine_swarm::Args),
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
        if ioshare::server::logs::json() {
            tracing::error!("{}", explain(&e));
        } else {
            // Names from the configuration stay inside the line (as in the log).
            eprintln!(
                "error: {}",
                ioshare::server::logs::escape_controls(&explain(&e))
            );
        }
        std::process::exit(2);
    }
}

/// The error and its causes, `: `-joined, each cause said once: a typed error's message
/// already carries its cause (`cannot write X: permission denied`), a context added here
/// does not.
fn explain(e: &anyhow::Error) -> String {
    let mut out = e.to_string();
    for cause in e.chain().skip(1) {
        let cause = cause.to_string();
        if !out.contains(&cause) {
            out.push_str(": ");
            out.push_str(&cause);
        }
    }
    out
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Sim(args) => cli::sim::run(args, cli::sim::Show::Table),
        Command::Advise(args) => cli::sim::run(args, cli::sim::Show::Verdict),
        Command::Demo { out } => cli::sim::demo(out),
        Command::Serve {
            config,
            out,
            capture,
            capture_limit,
            pidfile,
            log_format,
        } => {
            // Installed before the configuration is read, so that its errors are lines
            // of the format asked for.
            ioshare::server::logs::install(log_format);
            let loaded = ioshare::server::config::ServerConfig::load(&config)?;
            let capture = capture.map(|path| (path, capture_limit.0));
            let result = ioshare::server::serve(
                loaded,
                Some(config),
                out.clone(),
                capture,
                pidfile,
                log_format,
            )?;
            if let (Some(result), Some(dir)) = (result, out) {
                print!("{}", report::table(&result));
                report::write_all(&result, &dir)?;
                eprintln!(
                    "ioshare: report written to {}/ (results.json, timeseries.csv, report.html)",
                    dir.display()
                );
            }
            Ok(())
        }
        Command::Conformance {
            devices,
            slo,
            seed,
            seeds,
            policies,
            table,
            json,
        } => cli::conformance::run(
            devices,
            slo,
            (seed, seeds),
            policies,
            cli::conformance::Output::from_flags(table, json),
        ),
        Command::Characterize(a) => cli::characterize::run(a),
        Command::Calibrate(a) => cli::calibrate::run(a),
        Command::JournalCheck(a) => cli::journal_check::run(a),
        Command::List => cli::list::run(),
        Command::Ctl(a) => cli::ctl::run(a),
        Command::Govern(a) => cli::govern::run(a),
        Command::Completions { shell } => cli::generate::completions(shell),
        Command::Man { out } => cli::generate::man(&out),
        Command::Trace(a) => cli::trace::run(a),
        Command::EngineSwarm(a) => cli::engine_swarm::run(a),
        Command::Precondition {
            preset,
            capacity_gib,
            passes,
            seed,
            force,
        } => cli::precondition::run(preset, capacity_gib, passes, seed, force),
    }
}
