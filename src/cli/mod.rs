//! The command line's subcommands, one module each; `main.rs` declares the arguments and
//! hands each subcommand to its module. What several of them share is here.

pub(crate) mod calibrate;
pub(crate) mod characterize;
pub(crate) mod conformance;
pub(crate) mod ctl;
pub(crate) mod engine_swarm;
pub(crate) mod generate;
pub(crate) mod govern;
pub(crate) mod journal_check;
pub(crate) mod list;
pub(crate) mod precondition;
pub(crate) mod sim;
pub(crate) mod trace;

use crate::*;

/// Fails now, not after the run, when `--out` cannot take the report: the folder is
/// created and a file written into it and removed.
pub(crate) fn check_out(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir)
        .map_err(|e| anyhow::anyhow!("--out {}: cannot create it: {e}", dir.display()))?;
    let probe = dir.join(".ioshare-write-test");
    std::fs::write(&probe, b"")
        .map_err(|e| anyhow::anyhow!("--out {}: cannot write into it: {e}", dir.display()))?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

/// Refuses a `--policy` given twice, naming which time.
pub(crate) fn no_policy_twice(policies: &[String]) -> Result<()> {
    if let Some((i, p)) = policies
        .iter()
        .enumerate()
        .find(|(i, p)| policies[..*i].contains(p))
    {
        bail!("--policy {p} is given twice (the {} time)", ordinal(i + 1));
    }
    Ok(())
}

/// "2nd", "3rd", "4th".
pub(crate) fn ordinal(n: usize) -> String {
    let suffix = match (n % 10, n % 100) {
        (1, x) if x != 11 => "st",
        (2, x) if x != 12 => "nd",
        (3, x) if x != 13 => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

/// Request sizes from the command line, sorted; `None` when none were given.
pub(crate) fn parse_sizes(flag: &str, sizes: &[String]) -> Result<Option<Vec<u64>>> {
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

/// The `[device]` table of a preset name or a TOML file, with the precondition and
/// capacity given on the command line.
pub(crate) fn device_table(
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

/// What is measured: a model, or a real target opened as the options say.
pub(crate) enum Measured {
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
