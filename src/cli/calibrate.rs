//! `ioshare calibrate`: a device model fitted to a real target (or a model), then checked.

use super::*;

/// The arguments of `ioshare calibrate`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// A file or block device to measure (instead of --device). A path that does
    /// not exist is created with --size, filled, measured and removed.
    pub(crate) target: Option<PathBuf>,
    /// A device model to calibrate against instead (a preset or a TOML file).
    #[arg(long)]
    pub(crate) device: Option<String>,
    /// SSD models: clean or aged.
    #[arg(long)]
    pub(crate) precondition: Option<String>,
    /// Capacity of a model, GiB (default for a preset: 8).
    #[arg(long)]
    pub(crate) capacity_gib: Option<f64>,
    /// Write the fitted [device] table here (default: print it).
    #[arg(long)]
    pub(crate) out: Option<PathBuf>,
    /// Sizes of the check's characterize matrix, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "4k,64k,1m,16m")]
    pub(crate) check_sizes: Vec<String>,
    /// Skip the check.
    #[arg(long)]
    pub(crate) no_check: bool,
    /// Seconds per measurement (the write burst takes four times this).
    #[arg(long, default_value_t = 1.0)]
    pub(crate) probe_seconds: f64,
    /// Age a real TARGET first: random 4 KiB writes, this many times its size (a
    /// flash drive's steady state; takes long: 2 passes of 100 GiB at 100 MB/s is
    /// over an hour). A model ages with --precondition aged.
    #[arg(long, value_name = "PASSES")]
    pub(crate) age: Option<f64>,
    /// Write the measurements and the check as JSON here.
    #[arg(long)]
    pub(crate) json: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) real: RealTarget,
    /// No progress bars.
    #[arg(long, short)]
    pub(crate) quiet: bool,
}

/// `ioshare calibrate`.
pub(crate) fn run(a: Args) -> Result<()> {
    let Args {
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
    } = a;
    calibrate(Calibrate {
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
    })
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
    let sizes = check_args(&a)?;
    let progress = a.progress && std::io::stderr().is_terminal();
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

/// Refuses what `calibrate` cannot do before it measures anything: bad numbers, files
/// it could not write, a file named twice. Returns the check's sizes.
fn check_args(a: &Calibrate) -> Result<Vec<u64>> {
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
    Ok(sizes)
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
