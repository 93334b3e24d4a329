//! `ioshare govern CONFIG`: ioshare's policy for containers without a network disk.
//! Tenants are cgroups on one block device; every period the governor
//! ([`crate::limits::governor`], the same one the simulator's `govern` policy runs) is
//! given what each cgroup did (the kernel's counters) and what the device did
//! (`/proc/diskstats`), and its limits are written into the cgroups' throttle files —
//! the kernel enforces them. Nothing sits in the I/O path.
//!
//! **Nothing lost.** Before it writes a limit, the governor reads the limits each cgroup
//! has on the device and writes them into a state file; on exit (SIGTERM, SIGINT, the
//! end of `--duration`) it writes them back and removes the file. A process that was
//! killed leaves the file, and `ioshare govern --restore STATE` puts them back.

pub mod cgroup;

use crate::config::{Invalid, QosFields};
use crate::device::cost::CostModel;
use crate::limits::governor::{Allocator, DeviceUsage, Governor, Limits, Params, Usage};
use crate::types::{Slo, TenantSpec};
use cgroup::{Cgroup, CgroupError, Dev};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    govern: GovernFile,
    #[serde(default)]
    tenant: Vec<TenantFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GovernFile {
    device: String,
    period_ms: Option<f64>,
    allocator: Option<String>,
    target_us: Option<f64>,
    state: Option<PathBuf>,
    cost_device: Option<PathBuf>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantFile {
    name: String,
    cgroup: PathBuf,
    weight: Option<f64>,
    slo: Option<Slo>,
    reservation_iops: Option<f64>,
    limit_iops: Option<f64>,
}

/// A checked `govern` configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct GovernConfig {
    /// The device the cgroups' limits are on.
    pub device: Dev,
    /// The governor's settings.
    pub params: Params,
    /// What a request costs the device: `govern.cost_device`'s model (`ioshare
    /// calibrate --out`), else the generic SSD model.
    pub cost: CostModel,
    /// Whether `govern.cost_device` named one.
    pub calibrated: bool,
    /// Where the limits found are kept while it runs.
    pub state: PathBuf,
    /// The tenants: their promise and their cgroup folder.
    pub tenants: Vec<(TenantSpec, PathBuf)>,
}

/// Why `govern` could not start, or stopped.
#[derive(Debug, thiserror::Error)]
pub enum GovernError {
    /// The configuration.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// A cgroup's or the device's files.
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    /// The state file.
    #[error("{}: {source}", path.display())]
    State {
        /// The file.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// The state file does not hold what `govern` writes.
    #[error("{}: not a govern state file: {why}", path.display())]
    BadState {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
}

/// The device `text` names: `MAJ:MIN`, or a block device's path.
fn device_of(text: &str) -> Result<Dev, Invalid> {
    let field = "govern.device";
    if let Some((a, b)) = text.split_once(':')
        && let (Ok(major), Ok(minor)) = (a.parse(), b.parse())
    {
        let dev = Dev { major, minor };
        if !Path::new(&format!("/sys/dev/block/{dev}")).exists() {
            return Err(Invalid::new(
                field,
                format!("no block device {dev} on this machine"),
            ));
        }
        return Ok(dev);
    }
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let meta = std::fs::metadata(text).map_err(|e| {
        Invalid::new(
            field,
            format!("{text}: {e} (give a block device or MAJ:MIN)"),
        )
    })?;
    if !meta.file_type().is_block_device() {
        return Err(Invalid::new(field, format!("{text} is not a block device")));
    }
    let rdev = meta.rdev();
    Ok(Dev {
        major: libc::major(rdev),
        minor: libc::minor(rdev),
    })
}

impl GovernConfig {
    /// Loads and checks a configuration file; relative paths are taken from its folder.
    pub fn load(path: &Path) -> Result<GovernConfig, crate::config::ConfigError> {
        let source = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .map_err(|e| Invalid::whole(format!("cannot read: {e}")).in_file(&source))?;
        let base = path.parent().unwrap_or(Path::new("."));
        Self::parse(&text, base).map_err(|e| crate::config::located(e, &text, &source))
    }

    /// Parses a configuration whose relative paths are taken from `base`.
    pub fn parse(text: &str, base: &Path) -> Result<GovernConfig, Invalid> {
        let doc: toml::Table =
            toml::from_str(text).map_err(|e| Invalid::whole(e.message().to_string()))?;
        let file: File = crate::config::from_table(doc)?;
        let at = |p: PathBuf| if p.is_absolute() { p } else { base.join(p) };
        let device = device_of(&file.govern.device)?;
        let g = &file.govern;
        let cost = match &g.cost_device {
            Some(p) => {
                crate::device::spec::DeviceSpec::of_file(&at(p.clone()), "govern.cost_device")?
                    .cost_model()
            }
            None => CostModel::generic_ssd(),
        };
        let mut params = Params::for_device(&cost);
        if let Some(named) = g.allocator.as_deref() {
            params.allocator = Allocator::named(named).ok_or_else(|| {
                Invalid::new(
                    "govern.allocator",
                    format!("'{named}' is none of {}", Allocator::NAMES),
                )
            })?;
        }
        if let Some(ms) = g.period_ms {
            if !(10.0..=60_000.0).contains(&ms) {
                return Err(Invalid::new("govern.period_ms", "must be 10 to 60000"));
            }
            params.period = (ms * 1e6) as u64;
        }
        if let Some(us) = g.target_us {
            if !(1.0..=10_000_000.0).contains(&us) {
                return Err(Invalid::new("govern.target_us", "must be 1 to 10000000"));
            }
            params.target = (us * 1e3) as u64;
        }
        if file.tenant.is_empty() {
            return Err(Invalid::new(
                "tenant",
                "no [[tenant]]: name at least one cgroup",
            ));
        }
        let mut tenants: Vec<(TenantSpec, PathBuf)> = Vec::new();
        for (i, t) in file.tenant.into_iter().enumerate() {
            let field = crate::config::tenant_field(i + 1, &t.name);
            if tenants.iter().any(|(s, _)| s.name == t.name) {
                return Err(Invalid::new("name", "used twice").within(&field));
            }
            let cgroup = at(t.cgroup);
            if tenants.iter().any(|(_, c)| *c == cgroup) {
                return Err(Invalid::new("cgroup", "another tenant's cgroup").within(&field));
            }
            let spec = QosFields {
                weight: t.weight,
                slo: t.slo,
                reservation_iops: t.reservation_iops,
                limit_iops: t.limit_iops,
            }
            .spec(&t.name)
            .map_err(|e| e.within(&field))?;
            tenants.push((spec, cgroup));
        }
        let state = at(g
            .state
            .clone()
            .unwrap_or_else(|| PathBuf::from(".govern-state.json")));
        Ok(GovernConfig {
            device,
            params,
            cost,
            calibrated: g.cost_device.is_some(),
            state,
            tenants,
        })
    }
}

/// What the state file keeps: the device and each cgroup's limits as found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct State {
    /// The device.
    pub device: Dev,
    /// Each cgroup's folder, its interface and the limits it had.
    pub cgroups: Vec<(PathBuf, cgroup::Version, [Option<f64>; 4])>,
}

fn as_array(l: &Limits) -> [Option<f64>; 4] {
    [l.riops, l.wiops, l.rbps, l.wbps]
}

fn from_array(a: [Option<f64>; 4]) -> Limits {
    Limits {
        riops: a[0],
        wiops: a[1],
        rbps: a[2],
        wbps: a[3],
    }
}

/// Writes `state` to `path` (a new file renamed over it: never half a file, and never
/// through a symlink or a name planted beside it; [`crate::owned_file::replace`]).
fn save(path: &Path, state: &State) -> Result<(), GovernError> {
    let text = serde_json::to_string_pretty(state).expect("a state serializes");
    crate::owned_file::replace(path, text.as_bytes(), 0o600).map_err(|source| GovernError::State {
        path: path.into(),
        source,
    })
}

/// The most a state file may hold: a line of a few hundred bytes a cgroup.
const MAX_STATE_BYTES: u64 = 16 << 20;

/// Puts back the limits a state file holds and removes it (`govern --restore`).
/// Everything in it is checked before anything is written: the device exists, each
/// folder is a cgroup of a mounted hierarchy reached without a symlink and of the
/// interface recorded, no folder twice (so no more entries than cgroups exist), every
/// limit a positive finite number.
pub fn restore(path: &Path) -> Result<usize, GovernError> {
    let bad = |why: String| GovernError::BadState {
        path: path.into(),
        why,
    };
    let text = read_bounded(path, MAX_STATE_BYTES).map_err(|source| GovernError::State {
        path: path.into(),
        source,
    })?;
    let state: State = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let checked = check_state(&state).map_err(bad)?;
    put_back_all(state.device, &checked)?;
    std::fs::remove_file(path).map_err(|source| GovernError::State {
        path: path.into(),
        source,
    })?;
    Ok(checked.len())
}

/// At most `limit` bytes of `path` as text; a larger file is an error.
fn read_bounded(path: &Path, limit: u64) -> std::io::Result<String> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)?
        .take(limit + 1)
        .read_to_string(&mut text)?;
    if text.len() as u64 > limit {
        return Err(std::io::Error::other(format!(
            "larger than {limit} bytes: not a state file govern wrote"
        )));
    }
    Ok(text)
}

/// The cgroups a state file names, each checked, with the limits to put back.
fn check_state(state: &State) -> Result<Vec<(Cgroup, Limits)>, String> {
    let dev = state.device;
    if !Path::new(&format!("/sys/dev/block/{dev}")).exists() {
        return Err(format!("no block device {dev} on this machine"));
    }
    let mut out: Vec<(Cgroup, Limits)> = Vec::with_capacity(state.cgroups.len().min(1024));
    for (i, (dir, version, limits)) in state.cgroups.iter().enumerate() {
        let at = |why: String| format!("cgroup {} ({}): {why}", i + 1, dir.display());
        if !dir.is_absolute() {
            return Err(at("not an absolute path".into()));
        }
        let c = Cgroup::open(dir).map_err(|e| at(e.to_string()))?;
        if c.version != *version {
            return Err(at(format!(
                "recorded as {version:?} but is a {:?} cgroup",
                c.version
            )));
        }
        if out.iter().any(|(o, _)| o.dir == c.dir) {
            return Err(at("named twice".into()));
        }
        for x in limits.iter().flatten() {
            if !(x.is_finite() && *x >= 1.0 && *x <= u64::MAX as f64) {
                return Err(at(format!("limit {x} is not a positive number")));
            }
        }
        out.push((c, from_array(*limits)));
    }
    Ok(out)
}

fn put_back(state: &State) -> Result<(), GovernError> {
    let checked = check_state(state).map_err(|why| GovernError::BadState {
        path: PathBuf::from("(the limits found)"),
        why,
    })?;
    put_back_all(state.device, &checked)
}

fn put_back_all(dev: Dev, cgroups: &[(Cgroup, Limits)]) -> Result<(), GovernError> {
    for (c, limits) in cgroups {
        c.set_limits(dev, limits)?;
    }
    Ok(())
}

/// What a run did.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// Periods decided.
    pub periods: u64,
    /// Per tenant: requests and bytes over the run.
    pub usage: Vec<Usage>,
}

/// Governs until `stop` is set (or for `duration`), then restores the limits found.
/// `log` gets a line each `report_every` periods (0: never).
pub fn run(
    config: &GovernConfig,
    stop: &AtomicBool,
    duration: Option<Duration>,
    report_every: u64,
) -> Result<Summary, GovernError> {
    let cgroups: Vec<Cgroup> = config
        .tenants
        .iter()
        .map(|(_, dir)| Cgroup::open(dir))
        .collect::<Result<_, _>>()?;
    let dev = config.device;
    let found = State {
        device: dev,
        cgroups: cgroups
            .iter()
            .map(|c| Ok((c.dir.clone(), c.version, as_array(&c.limits(dev)?))))
            .collect::<Result<_, CgroupError>>()?,
    };
    if config.state.exists() {
        return Err(GovernError::BadState {
            path: config.state.clone(),
            why: "it exists: a governor is running on these cgroups, or one was killed (`ioshare govern --restore` it first)".into(),
        });
    }
    save(&config.state, &found)?;
    let governed = govern(config, &cgroups, stop, duration, report_every);
    let restored = put_back(&found);
    if restored.is_ok() {
        let _ = std::fs::remove_file(&config.state);
    }
    let summary = governed?;
    restored?;
    Ok(summary)
}

fn govern(
    config: &GovernConfig,
    cgroups: &[Cgroup],
    stop: &AtomicBool,
    duration: Option<Duration>,
    report_every: u64,
) -> Result<Summary, GovernError> {
    let dev = config.device;
    let specs: Vec<TenantSpec> = config.tenants.iter().map(|(s, _)| s.clone()).collect();
    let mut governor = Governor::new(&specs, config.cost, config.params);
    let period = Duration::from_nanos(governor.period());
    for (c, l) in cgroups.iter().zip(governor.limits()) {
        c.set_limits(dev, &l)?;
    }
    let read_all = || -> Result<(Vec<Usage>, DeviceUsage), GovernError> {
        let u = cgroups
            .iter()
            .map(|c| c.usage(dev))
            .collect::<Result<_, _>>()?;
        Ok((u, cgroup::device_usage(dev)?))
    };
    let (first, first_device) = read_all()?;
    let (mut last, mut last_device) = (first.clone(), first_device);
    let start = Instant::now();
    let mut next = start + period;
    let mut periods = 0;
    while !stop.load(Ordering::SeqCst) && duration.is_none_or(|d| start.elapsed() < d) {
        let now = Instant::now();
        if now < next {
            std::thread::sleep((next - now).min(Duration::from_millis(20)));
            continue;
        }
        next += period;
        let (now_u, now_d) = read_all()?;
        let delta: Vec<Usage> = now_u.iter().zip(&last).map(|(n, b)| minus(n, b)).collect();
        let device = now_d.since(&last_device);
        let limits = governor.decide(&delta, device);
        for (c, l) in cgroups.iter().zip(&limits) {
            c.set_limits(dev, l)?;
        }
        periods += 1;
        if report_every > 0 && periods % report_every == 0 {
            let r = governor.reading();
            tracing::info!(
                forecast_device_s = governor.capacity() / 1e9,
                latency_us = r.latency_ns / 1e3,
                base_us = r.base_ns / 1e3,
                congested = r.congested,
                "govern: period {periods}: device {} IOs, {:.0} us each (base {:.0}{}); forecast {:.3} device-s a period; read IOPS limits {:?}",
                device.ios,
                r.latency_ns / 1e3,
                r.base_ns / 1e3,
                if r.late {
                    ", congested: past an SLO's response time"
                } else if r.deep {
                    ", congested: a deep queue"
                } else if r.congested {
                    ", congested"
                } else if r.probed {
                    ", probed"
                } else {
                    ""
                },
                governor.capacity() / 1e9,
                limits
                    .iter()
                    .map(|l| l.riops.map(|x| x.round()))
                    .collect::<Vec<_>>()
            );
        }
        (last, last_device) = (now_u, now_d);
    }
    Ok(Summary {
        periods,
        usage: last.iter().zip(&first).map(|(n, b)| minus(n, b)).collect(),
    })
}

/// What happened between two readings of cumulative counters (a counter that went
/// back, a cgroup recreated, counts from zero).
fn minus(now: &Usage, before: &Usage) -> Usage {
    let d = |n: u64, b: u64| if n >= b { n - b } else { n };
    Usage {
        read_ios: d(now.read_ios, before.read_ios),
        write_ios: d(now.write_ios, before.write_ios),
        read_bytes: d(now.read_bytes, before.read_bytes),
        write_bytes: d(now.write_bytes, before.write_bytes),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_calibrated_cost_model_is_taken_from_cost_device() {
        // Any block device this machine has.
        let Some(dev) = std::fs::read_dir("/sys/dev/block")
            .ok()
            .and_then(|mut d| d.next())
            .and_then(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
        else {
            eprintln!("no block device here: skipped");
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("disk.toml"), "[device]\nmodel = 'hdd'\n").unwrap();
        let text = |cost: &str| {
            format!("[govern]\ndevice = '{dev}'\n{cost}[[tenant]]\nname = 'a'\ncgroup = 'a'\n")
        };
        let c = GovernConfig::parse(&text("cost_device = 'disk.toml'\n"), dir.path()).unwrap();
        assert!(c.calibrated);
        let disk = crate::device::spec::DeviceSpec::of_file(&dir.path().join("disk.toml"), "x")
            .unwrap()
            .cost_model();
        assert_eq!(c.cost, disk);
        assert!(c.cost.seeks(), "a disk's model");
        assert_eq!(c.params, Params::for_device(&disk));
        // A reservation and a limit, checked as a scenario's are.
        let qos = |r: u32, l: u32| {
            format!(
                "[govern]\ndevice = '{dev}'\n[[tenant]]\nname = 'a'\ncgroup = 'a'\nreservation_iops = {r}\nlimit_iops = {l}\n"
            )
        };
        let c = GovernConfig::parse(&qos(100, 500), dir.path()).unwrap();
        assert_eq!(c.tenants[0].0.reservation_iops, Some(100.0));
        assert_eq!(c.tenants[0].0.limit_iops, Some(500.0));
        assert!(GovernConfig::parse(&qos(500, 100), dir.path()).is_err());
        let plain = GovernConfig::parse(&text(""), dir.path()).unwrap();
        assert!(!plain.calibrated);
        assert_eq!(plain.cost, CostModel::generic_ssd());
        let e = GovernConfig::parse(&text("cost_device = 'none.toml'\n"), dir.path())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("govern.cost_device") && e.contains("none.toml"),
            "{e}"
        );
    }

    #[test]
    fn configuration_errors_name_the_field() {
        let ok = "[govern]\ndevice = '254:0'\n[[tenant]]\nname = 'a'\ncgroup = 'a'\nweight = 2\n";
        if Path::new("/sys/dev/block/254:0").exists() {
            let c = GovernConfig::parse(ok, Path::new("/cg")).unwrap();
            assert_eq!(c.tenants[0].1, Path::new("/cg/a"));
            assert_eq!(c.tenants[0].0.weight, 2.0);
            assert_eq!(c.state, Path::new("/cg/.govern-state.json"));
        }
        for (text, says) in [
            (
                "[govern]\ndevice = '9999:77'\n[[tenant]]\nname='a'\ncgroup='a'",
                "no block device 9999:77",
            ),
            (
                "[govern]\ndevice = '/etc/hostname'\n[[tenant]]\nname='a'\ncgroup='a'",
                "not a block device",
            ),
            (
                "[govern]\ndevice = '/nonexistent'\n[[tenant]]\nname='a'\ncgroup='a'",
                "/nonexistent",
            ),
            (
                "[govern]\ndevice = '/etc/hostname'\nperiod = 5",
                "unknown field",
            ),
            ("[[tenant]]\nname='a'\ncgroup='a'", "govern"),
        ] {
            let e = GovernConfig::parse(text, Path::new("/cg"))
                .unwrap_err()
                .to_string();
            assert!(e.contains(says), "{text}: {e}");
        }
    }

    #[test]
    fn counters_that_go_back_count_from_zero() {
        let before = Usage {
            read_ios: 10,
            write_ios: 5,
            read_bytes: 100,
            write_bytes: 50,
        };
        let now = Usage {
            read_ios: 12,
            write_ios: 1,
            read_bytes: 140,
            write_bytes: 4,
        };
        assert_eq!(
            minus(&now, &before),
            Usage {
                read_ios: 2,
                write_ios: 1,
                read_bytes: 40,
                write_bytes: 4
            }
        );
    }
}
