//! `ioshare sim` and `ioshare demo`: scenarios run in the simulator, their reports
//! written.

use super::*;

/// What `ioshare sim` and `ioshare advise` are given.
#[derive(clap::Args, Debug)]
pub(crate) struct SimArgs {
    /// Scenario file (see scenarios/ for examples).
    pub scenario: PathBuf,
    /// Write results.json, timeseries.csv and report.html into this directory.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Run only these policies (repeatable; default: `sim` runs the scenario's list,
    /// `advise` every registered policy and the scenario's own variants).
    #[arg(long = "policy", value_name = "P")]
    pub policies: Vec<String>,
    /// Override the scenario's seed.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Override the scenario's duration, seconds.
    #[arg(long, allow_negative_numbers = true)]
    pub duration: Option<f64>,
    /// No progress bar.
    #[arg(long, short)]
    pub quiet: bool,
    /// Run even when the scenario's estimated cost (memory, aging time, requests) is
    /// past the limits a run is refused above.
    #[arg(long)]
    pub force: bool,
    /// Also run each tenant alone on the same device and judge every tenant's
    /// insulation: what it got over what its entitled slice of the device gives it
    /// alone (the scenario's `insulation = true`; `advise` always does).
    #[arg(long)]
    pub insulation: bool,
    /// The order promises are ranked in by the verdict, first first: some of `slo`,
    /// `reservation`, `limit`, `weights`, separated by commas (those left out follow in
    /// that order). A policy that breaks a promise of an earlier kind never heads the
    /// list above one that keeps it. A tenant's `priority` in the scenario puts its
    /// promises before (higher) or after (lower) everyone else's.
    #[arg(
        long,
        value_name = "KINDS",
        default_value = "slo,reservation,limit,weights"
    )]
    pub rank: String,
}

/// What a run prints.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Show {
    /// The table of every tenant, then the verdict (`sim`).
    Table,
    /// The verdict alone, of every policy unless some were named (`advise`).
    Verdict,
}

/// `ioshare sim` and `ioshare advise`: every point of the scenario checked first, then
/// run.
pub(crate) fn run(args: SimArgs, show: Show) -> Result<()> {
    let SimArgs {
        scenario,
        out,
        policies,
        seed,
        duration,
        quiet,
        force,
        insulation,
        rank,
    } = args;
    let ranking =
        report::verdict::Ranking::parse(&rank).map_err(|e| anyhow::anyhow!("--rank: {e}"))?;
    let points = Scenario::load_points(&scenario)?;
    let point = |i: usize| -> Result<Scenario> {
        let mut s = points.get(i)?;
        if show == Show::Verdict && policies.is_empty() {
            every_policy(&mut s);
        }
        override_scenario(&mut s, seed, duration, &policies)?;
        s.insulation |= insulation || show == Show::Verdict;
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
        (!quiet, show, ""),
        &ranking,
    );
    match failed {
        Some(e) => Err(e),
        None => result,
    }
}

/// `ioshare demo`: the built-in scenario under every policy, its report and a legend.
pub(crate) fn demo(out: PathBuf) -> Result<()> {
    let mut s = Scenario::parse(ioshare::DEMO_SCENARIO, "built-in demo scenario", "demo")?;
    s.policies = policy::names()
        .into_iter()
        .map(PolicyChoice::named)
        .collect();
    // The demo shows the judge: every tenant against its own slice alone.
    s.insulation = true;
    let aged = aged_ssd(&s);
    simulate(
        [s],
        aged,
        Some(&out),
        (true, Show::Table, DEMO_LEGEND),
        &report::verdict::Ranking::default(),
    )
}

/// What the demo's columns mean, printed under its table.
const DEMO_LEGEND: &str = "How to read it (one block per policy; vm1, vm2 and vm3 keep the drive busy, vm3 is idle from 10 s to 20 s, vm4 agreed 300 reads/s within 20 ms):
  weight      the tenant's share weight (10:7:4:1)
  MB/s, IOPS  what the tenant completed, per second, after the warm-up
  share       its part of the device time all tenants used; ideal: what its weight entitles it to among the backlogged tenants, with reservations and limits as mClock's definition splits them (- when it is not: busy under half the time, or, like vm4, an open loop that got what it asked for)
  p50, p99    its response times (arrival to completion)
  SLO         the part of its requests answered within its rt (refused ones count as misses)
  R           insulation: what it got over what its entitled slice of the device gives it alone (each tenant also runs alone on the same drive); the house holds backlogged tenants to 0.9
  summary     total throughput and its ratio to none; share error (how far shares are from ideal over the whole run, and per interval: read this one here, as the whole-run figure counts vm3 short for its idle phase); Jain's fairness index; GC's write amplification
  phase lines IOPS per tenant in each part of the run (vm3's idle phase in the middle); on: how long a token bucket was switched in
  verdict     below: each policy checked against every promise the tenants hold (vm4's SLO and reservation, then the weights: every busy tenant R ≥ 0.9, shares per interval within 5 %), ranked by the promises that come first, then throughput; `ioshare advise SCENARIO` prints it for your own tenants
Policies: none (no scheduling), cfq/bfq/sfq/feedbac/mots (shares by weight), ta1/ta2/ta3 (token buckets for SLOs), mclock (reservations, weights, limits).
The report (report.html) opens on the same verdict, then the policies compared (share error per interval, throughput vs none, worst p99, worst SLO satisfaction), shares, phases and each tenant's bandwidth over time.
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

/// Every registered policy (with the scenario's parameters where it names one), then
/// the scenario's own labelled variants.
fn every_policy(s: &mut Scenario) {
    let own = std::mem::take(&mut s.policies);
    s.policies = policy::names()
        .into_iter()
        .map(|name| {
            own.iter()
                .find(|c| c.label == name)
                .cloned()
                .unwrap_or_else(|| PolicyChoice::named(name))
        })
        .collect();
    let registered = policy::names();
    s.policies.extend(
        own.into_iter()
            .filter(|c| !registered.contains(&c.label.as_str())),
    );
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
    (progress, what, legend): (bool, Show, &str),
    ranking: &report::verdict::Ranking,
) -> Result<()> {
    if let Some(dir) = out {
        check_out(dir)?;
    }
    let show = progress && std::io::stderr().is_terminal();
    if show && aged {
        eprintln!("preconditioning the device (aging)...");
    }
    let result = ioshare::sim::run_each(all, show, ioshare::sim::RunOptions::default())?;
    if what == Show::Table {
        println!("{}{legend}", report::table(&result));
    }
    print!("{}", report::verdict::text_ranked(&result, ranking));
    if let Some(dir) = out {
        report::write_all(&result, dir)?;
        println!(
            "wrote {}, {} and {}",
            dir.join("results.json").display(),
            dir.join("timeseries.csv").display(),
            dir.join("report.html").display()
        );
    }
    let stopped = trace_problems(&result);
    if stopped > 0 {
        bail!(
            "{stopped} trace replays stopped early (above); their tenants' figures cover what was replayed"
        );
    }
    Ok(())
}

/// Says, on standard error, what trace replays skipped or why they stopped (once per
/// tenant: every policy replays the same trace); how many stopped.
fn trace_problems(result: &ioshare::metrics::ScenarioResult) -> usize {
    let mut stopped = 0;
    let Some(run) = result.runs.first() else {
        return 0;
    };
    for t in &run.tenants {
        let Some(replay) = &t.trace else { continue };
        if replay.skipped > 0 {
            eprintln!(
                "tenant '{}': {} bad lines of its trace skipped (on_error = \"stop\" stops at the first); the first: {}",
                t.name,
                replay.skipped,
                replay.skipped_lines.first().map_or("", String::as_str)
            );
        }
        if let Some(why) = &replay.stopped {
            eprintln!("tenant '{}': its trace replay stopped: {why}", t.name);
            stopped += 1;
        }
    }
    stopped
}
