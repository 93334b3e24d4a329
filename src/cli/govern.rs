//! `ioshare govern CONFIG`: the governor on a host's cgroups (`ioshare::govern`), until
//! SIGTERM or SIGINT (or `--duration`), the limits found put back at the end;
//! `--restore STATE` puts back what a killed run left in its state file.

use crate::*;
use std::sync::atomic::{AtomicBool, Ordering};

/// `ioshare govern`'s arguments.
#[derive(clap::Args)]
pub struct Args {
    /// The configuration (`[govern]` with the device, `[[tenant]]`s with their cgroup
    /// and weight, an SLO if they have one; docs/govern.md). Not needed with `--restore`.
    #[arg(required_unless_present = "restore")]
    pub config: Option<PathBuf>,
    /// Stop after this many seconds (default: at SIGTERM or SIGINT).
    #[arg(long)]
    pub duration: Option<f64>,
    /// Put back the limits a killed run left in this state file, and remove it.
    #[arg(long, value_name = "STATE", conflicts_with = "config")]
    pub restore: Option<PathBuf>,
    /// A line about the forecast and the limits every this many periods (0: none).
    #[arg(long, default_value_t = 10)]
    pub report_every: u64,
    /// How log lines are written: human or json.
    #[arg(long, value_enum, default_value = "human")]
    pub log_format: ioshare::server::logs::LogFormat,
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// Runs `govern` (or its `--restore`).
pub fn run(a: Args) -> Result<()> {
    ioshare::server::logs::install(a.log_format);
    if let Some(state) = a.restore {
        let n = ioshare::govern::restore(&state)?;
        eprintln!(
            "ioshare: govern: limits of {n} cgroup(s) put back from {}",
            state.display()
        );
        return Ok(());
    }
    let path = a.config.expect("clap requires it without --restore");
    let config = ioshare::govern::GovernConfig::load(&path)?;
    // SAFETY: the handler only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
    }
    let duration = match a.duration {
        Some(s) if !(s > 0.0 && s.is_finite()) => bail!("--duration must be > 0 seconds, got {s}"),
        Some(s) => Some(std::time::Duration::from_secs_f64(s)),
        None => None,
    };
    eprintln!(
        "ioshare: govern: {} cgroup(s) on device {}, a period of {} ms; the limits found are kept in {} and put back at the end",
        config.tenants.len(),
        config.device,
        config.params.period / 1_000_000,
        config.state.display()
    );
    if !config.calibrated && config.params.allocator != ioshare::limits::governor::Allocator::Off {
        eprintln!(
            "ioshare: govern: nothing says what this device's requests cost: they are priced by the default SSD model (Linux blk-iocost's defaults); `ioshare calibrate DEVICE --out FILE` fits one for govern.cost_device"
        );
    }
    let summary = ioshare::govern::run(&config, &STOP, duration, a.report_every)?;
    for ((spec, _), u) in config.tenants.iter().zip(&summary.usage) {
        eprintln!(
            "ioshare: govern: {}: {} reads, {} writes, {} read, {} written",
            spec.name,
            u.read_ios,
            u.write_ios,
            ioshare::units::format_bytes(u.read_bytes),
            ioshare::units::format_bytes(u.write_bytes)
        );
    }
    eprintln!(
        "ioshare: govern: {} periods; the limits found are back",
        summary.periods
    );
    Ok(())
}
