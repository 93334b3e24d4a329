//! `ioshare characterize`: the interference matrix on a model or a real target.

use super::*;

/// The arguments of `ioshare characterize`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// A file or block device to measure (instead of --device). A path that does
    /// not exist is created with --size, filled, measured and removed.
    pub(crate) target: Option<PathBuf>,
    /// A device preset (see `ioshare list`) or a TOML file with a [device] table (a
    /// scenario, a `calibrate --out` file, or a file holding only that table).
    #[arg(long)]
    pub(crate) device: Option<String>,
    /// SSD models: clean or aged (default: the file's, else clean).
    #[arg(long)]
    pub(crate) precondition: Option<String>,
    /// Capacity of an SSD or disk model, GiB (default for a preset: 8; for a file:
    /// its own).
    #[arg(long)]
    pub(crate) capacity_gib: Option<f64>,
    /// Policies to compare (repeatable; default none, unless --kernel is given).
    #[arg(long = "policy", value_name = "P")]
    pub(crate) policies: Vec<String>,
    /// Kernel schedulers of a block-device TARGET, comma-separated, or `all` (each
    /// switched in sysfs for its runs and put back afterwards).
    #[arg(long, value_delimiter = ',')]
    pub(crate) kernel: Vec<String>,
    /// Foreground request sizes, comma-separated (default 4k,8k,...,32m).
    #[arg(long, value_delimiter = ',')]
    pub(crate) sizes: Vec<String>,
    /// Shortest cell, seconds (large requests get longer cells).
    #[arg(long, default_value_t = 1.0)]
    pub(crate) duration: f64,
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    #[command(flatten)]
    pub(crate) real: RealTarget,
    /// Write characterize.json, characterize.csv and report.html here.
    #[arg(long)]
    pub(crate) out: Option<PathBuf>,
    /// No progress bars.
    #[arg(long, short)]
    pub(crate) quiet: bool,
    /// Run even when a cell's estimated cost is past the limits.
    #[arg(long)]
    pub(crate) force: bool,
}

/// `ioshare characterize`.
pub(crate) fn run(a: Args) -> Result<()> {
    let Args {
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
    } = a;
    characterize(Characterize {
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
    })
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
        report::write_characterization(&m, dir)?;
        println!(
            "wrote {}, {} and {}",
            dir.join("characterize.json").display(),
            dir.join("characterize.csv").display(),
            dir.join("report.html").display()
        );
    }
    Ok(())
}
