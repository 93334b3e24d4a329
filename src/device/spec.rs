//! A simulated device as configurations describe it (`[device]` of a scenario,
//! `backend.device` of the emulated backend): a model, a preset, overrides of any preset
//! parameter, and for SSDs how they are aged. Checked when loaded; built (and aged, from
//! a seed) when a run needs it.

use super::DeviceModel;
use super::fitted::{self, FittedDevice, FittedParams};
use super::fixed::{FixedDevice, FixedParams};
use super::hdd::{self, HddDevice, HddParams};
use super::raid0::{self, Raid0Device, Raid0Params};
use super::ssd::{self, DEFAULT_AGING_PASSES, Precondition, SsdDevice, SsdParams};
use crate::config::Invalid;
use crate::device::cost::{CostModel, OpCost};
use crate::units::format_bytes;
use serde::Deserialize;

/// A disk's cost: the command overhead, a seek and half a turn for a random request,
/// the media rate per 512 B sector; an array of `disks` serves that many at once.
fn disk_cost(p: &HddParams, disks: f64) -> CostModel {
    let us = |x: f64| x * 1000.0;
    let op = OpCost {
        per_request_ns: us(p.overhead_us) / disks,
        per_unit_ns: us(512.0 / p.media_mb_s) / disks,
        random_ns: us(p.full_stroke_ms * 1000.0 / 3.0 + 30.0e6 / p.rpm) / disks,
        random_unit_ns: 0.0,
    };
    CostModel {
        read: op,
        write: op,
        unit: 512,
        partial_write_ns: 0.0,
    }
}

/// `[device]` as written: `model`, optional `preset`, `precondition`, `aging_passes`,
/// and any of the preset's parameters to override.
#[derive(Debug, Clone, Deserialize)]
pub struct DeviceFile {
    model: String,
    preset: Option<String>,
    precondition: Option<Precondition>,
    aging_passes: Option<f64>,
    #[serde(flatten)]
    overrides: toml::Table,
}

/// The device of a scenario, ready to build.
#[derive(Debug, Clone, PartialEq)]
pub enum DeviceSpec {
    /// The fixed-latency, fixed-bandwidth model.
    Fixed(FixedParams),
    /// The model `ioshare calibrate` fits ([`super::fitted`]).
    Fitted(FittedParams),
    /// The NAND SSD model.
    Ssd {
        /// Name of the preset the parameters start from (`None`: custom).
        preset: Option<String>,
        /// The preset's parameters with the overrides applied.
        params: SsdParams,
        /// State the drive is brought to before a run.
        precondition: Precondition,
        /// Random overwrites when aging, as multiples of the logical space.
        aging_passes: f64,
    },
    /// The rotating-disk model.
    Hdd {
        /// Name of the preset the parameters start from (`None`: custom).
        preset: Option<String>,
        /// The preset's parameters with the overrides applied.
        params: HddParams,
    },
    /// The striped disk array model.
    Raid0 {
        /// Name of the preset the parameters start from (`None`: custom).
        preset: Option<String>,
        /// The preset's parameters with the overrides applied.
        params: Raid0Params,
    },
}

impl DeviceSpec {
    /// Heads that move independently: 1 for a disk, its members for an array, `None`
    /// for a device without seeks (what turns on the device are sized by,
    /// [`crate::policy::PolicyParams::actuators`]).
    pub fn actuators(&self) -> Option<u32> {
        match self {
            DeviceSpec::Hdd { .. } => Some(1),
            DeviceSpec::Raid0 { params, .. } => Some(params.members),
            _ => None,
        }
    }

    /// Logical capacity in bytes (without building the device).
    pub fn capacity_bytes(&self) -> u64 {
        let gib = match self {
            DeviceSpec::Fixed(p) => p.capacity_gib,
            DeviceSpec::Fitted(p) => p.capacity_gib,
            DeviceSpec::Ssd { params, .. } => params.capacity_gib,
            DeviceSpec::Hdd { params, .. } => params.capacity_gib,
            DeviceSpec::Raid0 { params, .. } => {
                return Raid0Device::new(*params).capacity_bytes();
            }
        };
        ((gib * (1u64 << 30) as f64) as u64) / 4096 * 4096
    }

    /// Builds and preconditions the device. Aging is seeded, so deterministic.
    pub fn build(&self, seed: u64) -> Box<dyn DeviceModel> {
        match self {
            DeviceSpec::Fixed(p) => Box::new(FixedDevice::new(*p)),
            DeviceSpec::Fitted(p) => Box::new(FittedDevice::new(p.clone())),
            DeviceSpec::Ssd {
                params,
                precondition,
                aging_passes,
                ..
            } => {
                let mut d = SsdDevice::new(*params);
                d.precondition(*precondition, *aging_passes, seed);
                Box::new(d)
            }
            DeviceSpec::Hdd { params, .. } => Box::new(HddDevice::new(*params)),
            DeviceSpec::Raid0 { params, .. } => Box::new(Raid0Device::new(*params)),
        }
    }

    /// What requests cost this device where it runs as a model (the simulator, the
    /// emulated backend): the cost model fitted to the built `device` at full load
    /// (`device::probe`), exact for each request type run alone; for a `fitted`
    /// device, its own (measured) model.
    pub fn fitted_cost(&self, device: &dyn DeviceModel) -> CostModel {
        match self {
            DeviceSpec::Fitted(p) => p.cost_model(),
            _ => super::probe::fit(device, self.cost_model().unit),
        }
    }

    /// The `[device]` of a file (a scenario, a `calibrate --out` file, or the table
    /// alone); errors name `field`.
    pub fn of_file(path: &std::path::Path, field: &str) -> Result<DeviceSpec, Invalid> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Invalid::new(field, format!("cannot read {}: {e}", path.display())))?;
        let mut doc: toml::Table = toml::from_str(&text)
            .map_err(|e| Invalid::new(field, format!("{}: {}", path.display(), e.message())))?;
        let table = match doc.remove("device") {
            Some(toml::Value::Table(t)) => t,
            _ if doc.contains_key("model") => doc,
            _ => {
                return Err(Invalid::new(
                    field,
                    format!("{}: no [device] table", path.display()),
                ));
            }
        };
        let file: DeviceFile = toml::Value::Table(table)
            .try_into()
            .map_err(|e: toml::de::Error| Invalid::new(field, e.message().to_string()))?;
        file.spec().map_err(|e| e.within(field))
    }

    /// What requests cost this device, estimated from its parameters alone
    /// ([`crate::device::cost`]): the sum of the resources a request uses, before any
    /// device is built (`backend.cost_device` naming a preset, estimates). A loaded
    /// device overlaps those resources; where the device is built, what it is charged
    /// by is [`DeviceSpec::fitted_cost`].
    pub fn cost_model(&self) -> CostModel {
        let us = |x: f64| x * 1000.0;
        match self {
            DeviceSpec::Fixed(p) => {
                let parallel = f64::from(p.parallelism.max(1));
                CostModel {
                    read: OpCost {
                        per_request_ns: us(p.latency_us) / parallel,
                        per_unit_ns: us(4096.0 / p.bandwidth_mb_s) / parallel,
                        random_ns: 0.0,
                        random_unit_ns: 0.0,
                    },
                    write: OpCost {
                        per_request_ns: us(p.latency_us) / parallel,
                        per_unit_ns: us(4096.0 / p.bandwidth_mb_s) / parallel,
                        random_ns: 0.0,
                        random_unit_ns: 0.0,
                    },
                    unit: 4096,
                    partial_write_ns: 0.0,
                }
            }
            DeviceSpec::Fitted(p) => p.cost_model(),
            DeviceSpec::Ssd {
                params: p,
                precondition,
                ..
            } => {
                let dies = f64::from(p.channels * p.dies_per_channel);
                let links =
                    (4096.0 / p.host_mb_s).max(4096.0 / (p.channel_mb_s * f64::from(p.channels)));
                // Greedy GC on a full drive programs about (1 + op) / (2 op) pages per page
                // written (what the FTL measures: 7.2 on the SATA preset, 3.1 on NVMe).
                let amplification = match precondition {
                    Precondition::Aged => (1.0 + p.op_ratio) / (2.0 * p.op_ratio),
                    Precondition::Clean => 1.0,
                };
                let read_page = us((p.read_us / dies).max(links));
                // Pages read in order share their read unit's sensing; a read
                // elsewhere pays one sensing of its own.
                let read_next =
                    us((p.read_us / f64::from(p.read_unit_pages.max(1)) / dies).max(links));
                CostModel {
                    read: OpCost {
                        per_request_ns: us(p.command_us),
                        per_unit_ns: read_next,
                        random_ns: read_page - read_next,
                        random_unit_ns: 0.0,
                    },
                    write: OpCost {
                        per_request_ns: us(p.command_us),
                        per_unit_ns: us((p.program_us * amplification / dies).max(links)),
                        random_ns: 0.0,
                        random_unit_ns: 0.0,
                    },
                    unit: 4096,
                    partial_write_ns: read_page,
                }
            }
            DeviceSpec::Hdd { params, .. } => disk_cost(params, 1.0),
            DeviceSpec::Raid0 { params, .. } => {
                disk_cost(&params.member, f64::from(params.members))
            }
        }
    }

    /// One line for reports.
    pub fn describe(&self) -> String {
        match self {
            DeviceSpec::Fixed(p) => format!(
                "fixed: {} µs + {} MB/s × {} units, {}",
                p.latency_us,
                p.bandwidth_mb_s,
                p.parallelism,
                format_bytes(self.capacity_bytes())
            ),
            DeviceSpec::Fitted(p) => format!(
                "fitted: {} units{}, read {:.0} µs + {:.0} MB/s (media {:.0} MB/s), write {:.0} µs + {:.0} MB/s (media {:.0} MB/s{}), {}",
                p.units,
                if p.shared_path_us > 0.0 {
                    format!(" behind a {:.0} µs shared path", p.shared_path_us)
                } else {
                    String::new()
                },
                p.read_latency_us,
                p.read_transfer_mb_s,
                p.read_media_mb_s,
                p.write_latency_us,
                p.write_transfer_mb_s,
                p.write_media_mb_s,
                if p.write_cache_mib > 0.0 {
                    format!(", cache {:.1} MiB", p.write_cache_mib)
                } else {
                    String::new()
                },
                format_bytes(self.capacity_bytes())
            ),
            DeviceSpec::Ssd {
                preset,
                precondition,
                params,
                ..
            } => format!(
                "ssd {} ({}), {}{}",
                preset.as_deref().unwrap_or("custom"),
                format!("{precondition:?}").to_lowercase(),
                format_bytes(self.capacity_bytes()),
                changed(
                    params,
                    preset.as_deref().and_then(ssd::preset).map(|p| &p.params)
                )
            ),
            DeviceSpec::Hdd { preset, params } => format!(
                "hdd {} ({} rpm, queue {}), {}{}",
                preset.as_deref().unwrap_or("custom"),
                params.rpm,
                params.queue_depth,
                format_bytes(self.capacity_bytes()),
                changed(
                    params,
                    preset.as_deref().and_then(hdd::preset).map(|p| &p.params)
                )
            ),
            DeviceSpec::Raid0 { preset, params } => format!(
                "raid0 {} ({} × {} rpm, {} KiB stripe, disk queue {}), {}",
                preset.as_deref().unwrap_or("custom"),
                params.members,
                params.member.rpm,
                params.stripe_kib,
                params.member.queue_depth,
                format_bytes(self.capacity_bytes())
            ),
        }
    }
}

impl DeviceFile {
    /// The device this describes, checked; errors name fields under the device table.
    pub fn spec(self) -> Result<DeviceSpec, Invalid> {
        device_spec(self)
    }
}

/// The parameters that differ from the preset's, as `, key = value, …` (capacity is
/// shown apart); empty when none do or there is no preset.
fn changed<T: serde::Serialize>(params: &T, preset: Option<&T>) -> String {
    let (Some(preset), Ok(now)) = (preset, toml::Table::try_from(params)) else {
        return String::new();
    };
    let Ok(base) = toml::Table::try_from(preset) else {
        return String::new();
    };
    now.iter()
        .filter(|(k, v)| k.as_str() != "capacity_gib" && base.get(k.as_str()) != Some(v))
        .map(|(k, v)| format!(", {k} = {v}"))
        .collect()
}

fn device_spec(d: DeviceFile) -> Result<DeviceSpec, Invalid> {
    match d.model.as_str() {
        "fixed" => {
            if d.preset.is_some() || d.precondition.is_some() || d.aging_passes.is_some() {
                return Err("the fixed model takes no preset, precondition or aging_passes".into());
            }
            let p = toml::Value::Table(d.overrides)
                .try_into::<FixedParams>()
                .map_err(crate::config::parse_problem)?;
            check_fixed(&p)?;
            Ok(DeviceSpec::Fixed(p))
        }
        "fitted" => {
            if d.preset.is_some() || d.precondition.is_some() || d.aging_passes.is_some() {
                return Err(
                    "the fitted model takes no preset, precondition or aging_passes (it is \
                     fitted in the state it was measured in)"
                        .into(),
                );
            }
            let p = toml::Value::Table(d.overrides)
                .try_into::<FittedParams>()
                .map_err(crate::config::parse_problem)?;
            fitted::check(&p)?;
            Ok(DeviceSpec::Fitted(p))
        }
        "ssd" => {
            let preset_name = d.preset.unwrap_or_else(|| "sata-840pro".into());
            let preset = ssd::preset(&preset_name).ok_or_else(|| {
                unknown_preset(&preset_name, ssd::presets().iter().map(|p| p.name))
            })?;
            let mut table = toml::Table::try_from(preset.params).map_err(|e| e.to_string())?;
            for (k, v) in d.overrides {
                if !table.contains_key(&k) {
                    let known: Vec<_> = table.keys().cloned().collect();
                    return Err(Invalid::new(
                        k,
                        format!(
                            "unknown field (known: model, preset, precondition, aging_passes, {})",
                            known.join(", ")
                        ),
                    ));
                }
                table.insert(k, v);
            }
            let params: SsdParams = toml::Value::Table(table)
                .try_into()
                .map_err(|e: toml::de::Error| e.to_string().trim_end().to_string())?;
            check_ssd(&params)?;
            let aging_passes = d.aging_passes.unwrap_or(DEFAULT_AGING_PASSES);
            if !(aging_passes.is_finite() && aging_passes >= 0.0) {
                return Err(Invalid::new(
                    "aging_passes",
                    format!("must be ≥ 0, got {aging_passes}"),
                ));
            }
            Ok(DeviceSpec::Ssd {
                preset: Some(preset_name),
                params,
                precondition: d.precondition.unwrap_or(Precondition::Clean),
                aging_passes,
            })
        }
        "hdd" => {
            no_aging(&d)?;
            let name = d.preset.unwrap_or_else(|| "scsi-10k-73g".into());
            let p = hdd::preset(&name)
                .ok_or_else(|| unknown_preset(&name, hdd::presets().iter().map(|p| p.name)))?;
            let params: HddParams = with_overrides(&p.params, d.overrides)?;
            hdd::check(&params)?;
            Ok(DeviceSpec::Hdd {
                preset: Some(name),
                params,
            })
        }
        "raid0" => {
            no_aging(&d)?;
            let name = d.preset.unwrap_or_else(|| "scsi-10k-73g-x8".into());
            let p = raid0::preset(&name)
                .ok_or_else(|| unknown_preset(&name, raid0::presets().iter().map(|p| p.name)))?;
            let params: Raid0Params = with_overrides(&p.params, d.overrides)?;
            raid0::check(&params)?;
            Ok(DeviceSpec::Raid0 {
                preset: Some(name),
                params,
            })
        }
        other => Err(Invalid::new(
            "model",
            format!("unknown model '{other}' (known: ssd, hdd, raid0, fixed, fitted)"),
        )),
    }
}

fn no_aging(d: &DeviceFile) -> Result<(), String> {
    if d.precondition.is_some() || d.aging_passes.is_some() {
        return Err(format!(
            "the {} model takes no precondition or aging_passes (disks do not age)",
            d.model
        ));
    }
    Ok(())
}

fn unknown_preset<'a>(name: &str, known: impl Iterator<Item = &'a str>) -> Invalid {
    Invalid::new(
        "preset",
        format!(
            "unknown preset '{name}' (known: {})",
            known.collect::<Vec<_>>().join(", ")
        ),
    )
}

/// A preset's parameters with the scenario's keys laid over them; a key the preset does
/// not have is an error that lists the known ones (nested tables merge key by key).
fn with_overrides<T>(preset: &T, overrides: toml::Table) -> Result<T, String>
where
    T: serde::Serialize + serde::de::DeserializeOwned,
{
    fn merge(base: &mut toml::Table, over: toml::Table, at: &str) -> Result<(), String> {
        for (k, v) in over {
            match (base.get_mut(&k), v) {
                (Some(toml::Value::Table(b)), toml::Value::Table(o)) => {
                    merge(b, o, &format!("{at}{k}."))?
                }
                (Some(slot), v) => *slot = v,
                (None, _) => {
                    let known: Vec<_> = base.keys().map(|k| format!("{at}{k}")).collect();
                    return Err(format!(
                        "unknown field '{at}{k}' (known: model, preset, {})",
                        known.join(", ")
                    ));
                }
            }
        }
        Ok(())
    }
    let mut table = toml::Table::try_from(preset).map_err(|e| e.to_string())?;
    merge(&mut table, overrides, "")?;
    toml::Value::Table(table)
        .try_into()
        .map_err(|e: toml::de::Error| e.to_string().trim_end().to_string())
}

/// The fixed model's numbers in the ranges where it means something: a device with no
/// bandwidth completes nothing, a negative latency is no latency.
fn check_fixed(p: &FixedParams) -> Result<(), Invalid> {
    let ranges = [
        (
            "capacity_gib",
            p.capacity_gib,
            1.0 / 1024.0 / 256.0,
            1024.0 * 1024.0,
        ),
        ("latency_us", p.latency_us, 0.0, 60.0e6),
        ("bandwidth_mb_s", p.bandwidth_mb_s, 0.001, 1.0e6),
    ];
    for (field, v, lo, hi) in ranges {
        if !(v.is_finite() && v >= lo && v <= hi) {
            return Err(Invalid::new(
                field,
                format!("must be in [{lo}, {hi}], got {v}"),
            ));
        }
    }
    if !(1..=65_536).contains(&p.parallelism) {
        return Err(Invalid::new(
            "parallelism",
            format!("must be 1 ..= 65536, got {}", p.parallelism),
        ));
    }
    Ok(())
}

fn check_ssd(p: &SsdParams) -> Result<(), Invalid> {
    let pages = p.capacity_gib * (1u64 << 30) as f64 / 4096.0;
    if !(pages >= 1.0 && pages * (1.0 + p.op_ratio) < u32::MAX as f64 / 2.0) {
        return Err(Invalid::new(
            "capacity_gib",
            format!("{} is out of range (4 KiB .. 4 TiB)", p.capacity_gib),
        ));
    }
    if !(p.op_ratio > 0.0 && p.op_ratio < 4.0) {
        return Err(Invalid::new(
            "op_ratio",
            format!("must be in (0, 4), got {}", p.op_ratio),
        ));
    }
    // Upper bounds too: the model allocates per die and per block (4e9 pages a block
    // asked for terabytes).
    for (name, v, min, max) in [
        ("channels", p.channels, 1, 1024),
        ("dies_per_channel", p.dies_per_channel, 1, 1024),
        ("pages_per_block", p.pages_per_block, 2, 65_536),
    ] {
        if !(min..=max).contains(&v) {
            return Err(Invalid::new(
                name,
                format!("must be {min} ..= {max}, got {v}"),
            ));
        }
    }
    if p.gc_threshold_blocks > 1 << 20 {
        return Err(Invalid::new(
            "gc_threshold_blocks",
            format!("must be at most 1048576, got {}", p.gc_threshold_blocks),
        ));
    }
    for (name, v) in [
        ("read_us", p.read_us),
        ("program_us", p.program_us),
        ("erase_us", p.erase_us),
        ("command_us", p.command_us),
        ("read_suspend_us", p.read_suspend_us),
        ("command_latency_us", p.command_latency_us.unwrap_or(0.0)),
        ("write_ack_us", p.write_ack_us),
    ] {
        if !(v.is_finite() && v >= 0.0) {
            return Err(Invalid::new(name, format!("must be ≥ 0, got {v}")));
        }
        // A minute: past it a request's times could overflow the clock.
        if v > 60.0e6 {
            return Err(Invalid::new(
                name,
                format!("must be at most 60000000 (a minute), got {v}"),
            ));
        }
    }
    if !(p.write_buffer_mib.is_finite() && (0.0..=65_536.0).contains(&p.write_buffer_mib)) {
        return Err(Invalid::new(
            "write_buffer_mib",
            format!("must be ≥ 0, got {}", p.write_buffer_mib),
        ));
    }
    let unit = p.read_unit_pages;
    if !(1..=64).contains(&unit) || !p.pages_per_block.is_multiple_of(unit) {
        return Err(Invalid::new(
            "read_unit_pages",
            format!(
                "must be 1 ..= 64 and divide pages_per_block ({}), got {unit}",
                p.pages_per_block
            ),
        ));
    }
    for (name, v) in [("channel_mb_s", p.channel_mb_s), ("host_mb_s", p.host_mb_s)] {
        if !(v.is_finite() && v > 0.0) {
            return Err(Invalid::new(name, format!("must be > 0, got {v}")));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Op;

    /// A device's one-line description names the parameters changed from its preset,
    /// so a report of a modified drive does not read as the preset's.
    #[test]
    fn the_description_names_what_differs_from_the_preset() {
        let spec = |text: &str| {
            let file: DeviceFile = toml::from_str(text).unwrap();
            file.spec().unwrap().describe()
        };
        assert_eq!(
            spec("model = 'ssd'\npreset = 'intel-x25m'\ncapacity_gib = 8"),
            "ssd intel-x25m (clean), 8 GiB"
        );
        assert_eq!(
            spec(
                "model = 'ssd'\npreset = 'intel-x25m'\ncapacity_gib = 8\nread_suspend_us = 20.0\nhalf_duplex = false"
            ),
            "ssd intel-x25m (clean), 8 GiB, half_duplex = false, read_suspend_us = 20.0"
        );
        assert_eq!(
            spec("model = 'hdd'\nrpm = 7200.0\ncapacity_gib = 1"),
            "hdd scsi-10k-73g (7200 rpm, queue 16), 1 GiB, rpm = 7200.0"
        );
    }

    #[test]
    fn the_fixed_model_refuses_numbers_that_mean_nothing() {
        for (text, says) in [
            (
                "latency_us = -100",
                "latency_us: must be in [0, 60000000], got -100",
            ),
            ("latency_us = nan", "latency_us: must be in"),
            ("bandwidth_mb_s = 0", "bandwidth_mb_s: must be in [0.001"),
            ("parallelism = 0", "parallelism: must be 1 ..= 65536, got 0"),
            ("capacity_gib = 0", "capacity_gib: must be in"),
        ] {
            let file: DeviceFile = toml::from_str(&format!("model = 'fixed'\n{text}")).unwrap();
            let e = file.spec().unwrap_err().in_file("d.toml").to_string();
            assert!(e.contains(says), "{text}: {e}");
        }
    }

    #[test]
    fn ssd_geometry_is_bounded_before_anything_is_allocated() {
        for (text, says) in [
            (
                "pages_per_block = 4000000000",
                "pages_per_block: must be 2 ..= 65536",
            ),
            ("channels = 0", "channels: must be 1 ..= 1024, got 0"),
            (
                "dies_per_channel = 5000",
                "dies_per_channel: must be 1 ..= 1024",
            ),
            (
                "gc_threshold_blocks = 4000000000",
                "gc_threshold_blocks: must be at most",
            ),
        ] {
            let file: DeviceFile = toml::from_str(&format!(
                "model = 'ssd'\npreset = 'nvme-p4500'\ncapacity_gib = 1\n{text}"
            ))
            .unwrap();
            let e = file.spec().unwrap_err().in_file("d.toml").to_string();
            assert!(e.contains(says), "{text}: {e}");
        }
    }

    fn spec(text: &str) -> DeviceSpec {
        let file: DeviceFile = toml::from_str(text).unwrap();
        file.spec().unwrap()
    }

    #[test]
    fn an_ssd_costs_its_slowest_resource_per_page_and_aging_its_garbage_collection() {
        let clean = spec("model = 'ssd'\npreset = 'sata-840pro'\ncapacity_gib = 1").cost_model();
        // Reads: the SATA link (4096 B / 550 MB/s = 7.45 µs) is slower than 32 dies
        // reading (70 / 32 µs); 10.5 µs of command per request.
        assert!((clean.read.per_unit_ns - 4096.0 / 550.0 * 1000.0).abs() < 1e-6);
        assert_eq!(clean.read.per_request_ns, 10_500.0);
        assert_eq!(clean.read.random_ns, 0.0);
        // Writes on a clean drive: 250 µs / 32 dies = 7.8 µs a page.
        assert!((clean.write.per_unit_ns - 7812.5).abs() < 1e-6);
        // 512 B costs a page, like 4 KiB, and the read of the page it merges into.
        assert_eq!(
            clean.cost(Op::Write, 0, 512, true),
            clean.cost(Op::Write, 0, 4096, true) + clean.read.per_unit_ns
        );
        let aged =
            spec("model = 'ssd'\npreset = 'sata-840pro'\nprecondition = 'aged'\ncapacity_gib = 1")
                .cost_model();
        // Greedy GC at 7.37 % over-provisioning: (1 + op) / (2 op) ≈ 7.28 pages a page.
        let wa = (1.0 + 0.0737) / (2.0 * 0.0737);
        assert!((aged.write.per_unit_ns - 7812.5 * wa).abs() < 1e-6);
        assert_eq!(aged.read, clean.read);
    }

    #[test]
    fn a_disk_charges_a_seek_to_random_requests_only() {
        let d = spec("model = 'hdd'").cost_model();
        assert!(d.cost(Op::Read, 0, 4096, true) > 10.0 * d.cost(Op::Read, 0, 4096, false));
        let raid = spec("model = 'raid0'").cost_model();
        assert!(
            raid.read.random_ns < d.read.random_ns,
            "an array seeks in parallel"
        );
    }
}
