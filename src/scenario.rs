//! Scenarios: an experiment as a TOML file (device, tenants with weights/SLOs and
//! workloads, policies to compare, duration, seed). Loading validates everything and
//! names the file, the field and the problem.

use crate::device::DeviceModel;
use crate::device::fixed::{FixedDevice, FixedParams};
use crate::device::hdd::{self, HddDevice, HddParams};
use crate::device::raid0::{self, Raid0Device, Raid0Params};
use crate::device::ssd::{self, DEFAULT_AGING_PASSES, Precondition, SsdDevice, SsdParams};
use crate::policy;
use crate::types::{Nanos, Slo, TenantSpec, secs_to_nanos};
use crate::units::{ByteSize, format_bytes};
use crate::workload::{Workload, WorkloadConfig};
use serde::Deserialize;
use std::path::Path;

/// A scenario that could not be loaded: where and what.
#[derive(Debug, thiserror::Error)]
#[error("{source_name}: {problem}")]
pub struct ScenarioError {
    pub source_name: String,
    pub problem: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScenarioFile {
    name: Option<String>,
    description: Option<String>,
    seed: Option<u64>,
    duration_s: f64,
    warmup_s: Option<f64>,
    interval_s: Option<f64>,
    queue_depth: Option<u32>,
    queue_limit: Option<u32>,
    /// Give tenants without an explicit region equal consecutive partitions.
    partition: Option<bool>,
    policies: Option<Vec<PolicyEntry>>,
    /// Expanded before deserializing (see [`expand_sweep`]); never read here.
    #[allow(dead_code)]
    sweep: Option<toml::Table>,
    device: DeviceFile,
    #[serde(default)]
    tenant: Vec<TenantFile>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum PolicyEntry {
    Name(String),
    Table(toml::Table),
}

#[derive(Debug, Deserialize)]
pub(crate) struct DeviceFile {
    model: String,
    preset: Option<String>,
    precondition: Option<Precondition>,
    aging_passes: Option<f64>,
    #[serde(flatten)]
    overrides: toml::Table,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantFile {
    name: String,
    weight: Option<f64>,
    slo: Option<Slo>,
    reservation_iops: Option<f64>,
    limit_iops: Option<f64>,
    offset: Option<ByteSize>,
    size: Option<ByteSize>,
    workload: WorkloadConfig,
}

/// The device of a scenario, ready to build.
#[derive(Debug, Clone, PartialEq)]
pub enum DeviceSpec {
    Fixed(FixedParams),
    Ssd {
        preset: Option<String>,
        params: SsdParams,
        precondition: Precondition,
        aging_passes: f64,
    },
    Hdd {
        preset: Option<String>,
        params: HddParams,
    },
    Raid0 {
        preset: Option<String>,
        params: Raid0Params,
    },
}

impl DeviceSpec {
    /// Logical capacity in bytes (without building the device).
    pub fn capacity_bytes(&self) -> u64 {
        let gib = match self {
            DeviceSpec::Fixed(p) => p.capacity_gib,
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
            DeviceSpec::Ssd {
                preset,
                precondition,
                ..
            } => format!(
                "ssd {} ({}), {}",
                preset.as_deref().unwrap_or("custom"),
                format!("{precondition:?}").to_lowercase(),
                format_bytes(self.capacity_bytes())
            ),
            DeviceSpec::Hdd { preset, params } => format!(
                "hdd {} ({} rpm, queue {}), {}",
                preset.as_deref().unwrap_or("custom"),
                params.rpm,
                params.queue_depth,
                format_bytes(self.capacity_bytes())
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

/// One tenant of a scenario.
#[derive(Debug, Clone, PartialEq)]
pub struct TenantSetup {
    pub spec: TenantSpec,
    /// Byte offset of the tenant's region on the device.
    pub offset: u64,
    /// Byte size of the region.
    pub size: u64,
    pub workload: Workload,
}

/// A policy to run: registry name, parameters, and the label reports use.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyChoice {
    pub label: String,
    pub name: String,
    pub params: toml::Table,
}

impl PolicyChoice {
    /// A registered policy with default parameters.
    pub fn named(name: &str) -> Self {
        PolicyChoice {
            label: name.to_string(),
            name: name.to_string(),
            params: toml::Table::new(),
        }
    }
}

/// A loaded, validated scenario.
#[derive(Debug, Clone, PartialEq)]
pub struct Scenario {
    pub name: String,
    /// Which point of a `[sweep]` this is (`size=4k, precondition=aged`); empty without one.
    pub variant: String,
    pub description: String,
    pub seed: u64,
    pub duration: Nanos,
    pub warmup: Nanos,
    pub interval: Nanos,
    pub queue_depth: u32,
    /// Requests a tenant may have waiting in the engine (held by the policy); a request
    /// beyond it is rejected and counted. `None`: unbounded.
    pub queue_limit: Option<u32>,
    pub device: DeviceSpec,
    pub tenants: Vec<TenantSetup>,
    pub policies: Vec<PolicyChoice>,
}

impl Scenario {
    /// Loads a scenario file: one scenario per point of its `[sweep]` (one without).
    pub fn load(path: &Path) -> Result<Vec<Scenario>, ScenarioError> {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ScenarioError {
            source_name: name.clone(),
            problem: format!("cannot read: {e}"),
        })?;
        let stem = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "scenario".into());
        Scenario::parse_all(&text, &name, &stem)
    }

    /// Parses scenario text with its sweep expanded; `source_name` names it in errors,
    /// `default_name` is used when the file has no `name`.
    pub fn parse_all(
        text: &str,
        source_name: &str,
        default_name: &str,
    ) -> Result<Vec<Scenario>, ScenarioError> {
        let err = |problem: String| ScenarioError {
            source_name: source_name.to_string(),
            problem,
        };
        let doc: toml::Table =
            toml::from_str(text).map_err(|e| err(e.to_string().trim_end().to_string()))?;
        let variants = expand_sweep(doc).map_err(|e| err(format!("sweep: {e}")))?;
        variants
            .into_iter()
            .map(|(label, doc)| {
                let file: ScenarioFile = toml::Value::Table(doc)
                    .try_into()
                    .map_err(|e: toml::de::Error| err(e.to_string().trim_end().to_string()))?;
                let mut s = validate(file, default_name).map_err(|e| {
                    err(if label.is_empty() {
                        e
                    } else {
                        format!("[{label}] {e}")
                    })
                })?;
                s.variant = label;
                Ok(s)
            })
            .collect()
    }

    /// Parses a scenario that has no sweep.
    pub fn parse(
        text: &str,
        source_name: &str,
        default_name: &str,
    ) -> Result<Scenario, ScenarioError> {
        let mut all = Scenario::parse_all(text, source_name, default_name)?;
        if all.len() != 1 {
            return Err(ScenarioError {
                source_name: source_name.to_string(),
                problem: format!("expected one scenario, the sweep makes {}", all.len()),
            });
        }
        Ok(all.remove(0))
    }

    pub fn specs(&self) -> Vec<TenantSpec> {
        self.tenants.iter().map(|t| t.spec.clone()).collect()
    }

    /// The run's phases: every moment any tenant's workload changes, from 0.
    pub fn phase_starts(&self) -> Vec<Nanos> {
        let mut starts: Vec<Nanos> = self
            .tenants
            .iter()
            .flat_map(|t| {
                t.workload
                    .phases
                    .iter()
                    .flat_map(|p| [Some(p.start), p.end])
            })
            .flatten()
            .filter(|&t| t < self.duration)
            .chain([0])
            .collect();
        starts.sort_unstable();
        starts.dedup();
        starts
    }
}

fn positive_secs(field: &str, v: f64) -> Result<Nanos, String> {
    if v.is_finite() && v > 0.0 {
        Ok(secs_to_nanos(v))
    } else {
        Err(format!("{field} must be > 0, got {v}"))
    }
}

fn validate(file: ScenarioFile, default_name: &str) -> Result<Scenario, String> {
    let duration = positive_secs("duration_s", file.duration_s)?;
    let warmup = match file.warmup_s {
        None => 0,
        Some(w) if w.is_finite() && w >= 0.0 && secs_to_nanos(w) < duration => secs_to_nanos(w),
        Some(w) => {
            return Err(format!(
                "warmup_s must be ≥ 0 and shorter than duration_s, got {w}"
            ));
        }
    };
    let interval = positive_secs("interval_s", file.interval_s.unwrap_or(1.0))?;
    let queue_depth = match file.queue_depth.unwrap_or(32) {
        0 => return Err("queue_depth must be ≥ 1".into()),
        q => q,
    };
    let queue_limit = match file.queue_limit {
        Some(0) => return Err("queue_limit must be ≥ 1 (leave it out for no bound)".into()),
        q => q,
    };
    let device = device_spec(file.device).map_err(|e| format!("device: {e}"))?;
    if file.tenant.is_empty() {
        return Err("no tenants: add at least one [[tenant]]".into());
    }
    let capacity = device.capacity_bytes();
    let partition = file.partition.unwrap_or(false);
    let part_size = capacity / file.tenant.len() as u64 / 4096 * 4096;
    let mut tenants = Vec::with_capacity(file.tenant.len());
    for (i, t) in file.tenant.into_iter().enumerate() {
        let ctx = |e: String| format!("tenant {} ('{}'): {e}", i + 1, t.name);
        if t.name.trim().is_empty() {
            return Err(format!("tenant {}: name is empty", i + 1));
        }
        if tenants.iter().any(|x: &TenantSetup| x.spec.name == t.name) {
            return Err(ctx("name used twice".into()));
        }
        let spec =
            tenant_spec(&t.name, t.weight, t.slo, t.reservation_iops, t.limit_iops).map_err(ctx)?;
        let (default_offset, default_size) = if partition {
            (i as u64 * part_size, part_size)
        } else {
            (0, capacity)
        };
        let offset = t.offset.map_or(default_offset, |b| b.0);
        let size = t
            .size
            .map_or(capacity.saturating_sub(offset).min(default_size), |b| b.0);
        if size == 0 {
            return Err(ctx("region size is 0".into()));
        }
        if offset % 4096 != 0 || size % 4096 != 0 {
            return Err(ctx(
                "region offset and size must be multiples of 4 KiB".into()
            ));
        }
        if offset.saturating_add(size) > capacity {
            return Err(ctx(format!(
                "region {}+{} runs past the device end ({})",
                format_bytes(offset),
                format_bytes(size),
                format_bytes(capacity)
            )));
        }
        let workload = t
            .workload
            .resolve()
            .map_err(|e| ctx(format!("workload: {e}")))?;
        if let Some(limit) = queue_limit
            && let Some(depth) = workload.phases.iter().find_map(|p| match p.arrivals {
                crate::workload::Arrivals::Closed { iodepth } if iodepth > limit => Some(iodepth),
                _ => None,
            })
        {
            return Err(ctx(format!(
                "iodepth {depth} is above queue_limit {limit}: a closed loop would lose the requests it cannot queue"
            )));
        }
        if workload.max_size() as u64 > size {
            return Err(ctx(format!(
                "requests of up to {} do not fit the {} region",
                format_bytes(workload.max_size() as u64),
                format_bytes(size)
            )));
        }
        tenants.push(TenantSetup {
            spec,
            offset,
            size,
            workload,
        });
    }
    let policies = match file.policies {
        None => vec![PolicyChoice::named("none")],
        Some(list) if list.is_empty() => return Err("policies is empty".into()),
        Some(list) => list
            .into_iter()
            .enumerate()
            .map(|(i, e)| policy_choice(e).map_err(|e| format!("policies[{i}]: {e}")))
            .collect::<Result<Vec<_>, _>>()?,
    };
    let specs: Vec<TenantSpec> = tenants.iter().map(|t| t.spec.clone()).collect();
    for (i, p) in policies.iter().enumerate() {
        if policies[..i].iter().any(|q| q.label == p.label) {
            return Err(format!(
                "policies: label '{}' used twice (give one a `label`)",
                p.label
            ));
        }
        policy::build(&p.name, p.params.clone(), &specs)
            .map_err(|e| format!("policies[{i}]: {e}"))?;
    }
    Ok(Scenario {
        name: file.name.unwrap_or_else(|| default_name.to_string()),
        variant: String::new(),
        description: file.description.unwrap_or_default(),
        seed: file.seed.unwrap_or(1),
        duration,
        warmup,
        interval,
        queue_depth,
        queue_limit,
        device,
        tenants,
        policies,
    })
}

/// Expands `[sweep]`: each key is a dotted path into the scenario (`device.precondition`,
/// `tenant.B.workload.size`; inside an array of tables a segment picks the entry with
/// that `name`, an index, or `*` for all of them), each value a list. Returns one document per point of the
/// cartesian product, in order (the first key varies slowest), with its label.
fn expand_sweep(mut doc: toml::Table) -> Result<Vec<(String, toml::Table)>, String> {
    let Some(sweep) = doc.remove("sweep") else {
        return Ok(vec![(String::new(), doc)]);
    };
    let toml::Value::Table(sweep) = sweep else {
        return Err("must be a table of `path = [values]`".into());
    };
    let mut points: Vec<(String, toml::Table)> = vec![(String::new(), doc)];
    for (path, values) in sweep {
        let toml::Value::Array(values) = values else {
            return Err(format!("'{path}' must be a list of values"));
        };
        if values.is_empty() {
            return Err(format!("'{path}' has no values"));
        }
        let mut next = Vec::with_capacity(points.len() * values.len());
        for (label, doc) in &points {
            for v in &values {
                let mut d = doc.clone();
                set_path(&mut d, &path, v.clone()).map_err(|e| format!("'{path}': {e}"))?;
                let shown = match v {
                    toml::Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                let l = if label.is_empty() {
                    format!("{path}={shown}")
                } else {
                    format!("{label}, {path}={shown}")
                };
                next.push((l, d));
            }
        }
        points = next;
    }
    Ok(points)
}

fn set_path(doc: &mut toml::Table, path: &str, value: toml::Value) -> Result<(), String> {
    let segments: Vec<&str> = path.split('.').collect();
    set_segments(doc, &segments, &value)
}

/// Sets `value` at `segments` under `table`; in an array of tables the next segment picks
/// an entry by `name` or index, or `*` for every entry.
fn set_segments(
    table: &mut toml::Table,
    segments: &[&str],
    value: &toml::Value,
) -> Result<(), String> {
    let (first, rest) = segments.split_first().ok_or("empty path")?;
    if rest.is_empty() {
        table.insert(first.to_string(), value.clone());
        return Ok(());
    }
    let entry = table
        .entry(first.to_string())
        .or_insert_with(|| toml::Value::Table(toml::Table::new()));
    match entry {
        toml::Value::Table(t) => set_segments(t, rest, value),
        toml::Value::Array(items) => {
            let (pick, rest) = rest
                .split_first()
                .filter(|(_, r)| !r.is_empty())
                .ok_or_else(|| {
                    format!("'{first}' is a list: name an entry and a field after it")
                })?;
            let picked: Vec<usize> = if *pick == "*" {
                (0..items.len()).collect()
            } else {
                let idx = items
                    .iter()
                    .position(|it| it.get("name").and_then(|n| n.as_str()) == Some(*pick))
                    .or_else(|| pick.parse::<usize>().ok().filter(|&i| i < items.len()))
                    .ok_or_else(|| format!("no entry '{pick}' in '{first}'"))?;
                vec![idx]
            };
            for i in picked {
                match &mut items[i] {
                    toml::Value::Table(t) => set_segments(t, rest, value)?,
                    _ => return Err(format!("entry {i} of '{first}' is not a table")),
                }
            }
            Ok(())
        }
        _ => Err(format!(
            "'{first}' is not a table (write it as a table to sweep inside it)"
        )),
    }
}

/// A tenant's weight, SLO, reservation and limit, checked (shared with the server's
/// configuration).
pub(crate) fn tenant_spec(
    name: &str,
    weight: Option<f64>,
    slo: Option<Slo>,
    reservation_iops: Option<f64>,
    limit_iops: Option<f64>,
) -> Result<TenantSpec, String> {
    let weight = weight.unwrap_or(1.0);
    if !(weight.is_finite() && weight > 0.0) {
        return Err(format!("weight must be > 0, got {weight}"));
    }
    if let Some(slo) = &slo
        && !(slo.iops > 0.0 && slo.size > 0 && slo.rt_us > 0)
    {
        return Err("slo needs iops > 0, size > 0 and rt_us > 0".into());
    }
    for (field, v) in [
        ("reservation_iops", reservation_iops),
        ("limit_iops", limit_iops),
    ] {
        if let Some(v) = v
            && !(v.is_finite() && v > 0.0)
        {
            return Err(format!("{field} must be > 0, got {v}"));
        }
    }
    if let (Some(r), Some(l)) = (reservation_iops, limit_iops)
        && r > l
    {
        return Err(format!("reservation_iops {r} is above limit_iops {l}"));
    }
    Ok(TenantSpec {
        name: name.to_string(),
        weight,
        slo,
        reservation_iops,
        limit_iops,
    })
}

pub(crate) fn policy_choice(entry: PolicyEntry) -> Result<PolicyChoice, String> {
    match entry {
        PolicyEntry::Name(n) => Ok(PolicyChoice::named(&n)),
        PolicyEntry::Table(mut t) => {
            let name = match t.remove("name") {
                Some(toml::Value::String(s)) => s,
                Some(other) => return Err(format!("name must be a string, got {other}")),
                None => return Err("a policy table needs `name`".into()),
            };
            let label = match t.remove("label") {
                Some(toml::Value::String(s)) => s,
                Some(other) => return Err(format!("label must be a string, got {other}")),
                None => name.clone(),
            };
            Ok(PolicyChoice {
                label,
                name,
                params: t,
            })
        }
    }
}

pub(crate) fn device_spec(d: DeviceFile) -> Result<DeviceSpec, String> {
    match d.model.as_str() {
        "fixed" => {
            if d.preset.is_some() || d.precondition.is_some() || d.aging_passes.is_some() {
                return Err("the fixed model takes no preset, precondition or aging_passes".into());
            }
            toml::Value::Table(d.overrides)
                .try_into::<FixedParams>()
                .map(DeviceSpec::Fixed)
                .map_err(|e| e.to_string().trim_end().to_string())
        }
        "ssd" => {
            let preset_name = d.preset.unwrap_or_else(|| "sata-840pro".into());
            let preset = ssd::preset(&preset_name).ok_or_else(|| {
                let known: Vec<_> = ssd::presets().iter().map(|p| p.name).collect();
                format!(
                    "unknown preset '{preset_name}' (known: {})",
                    known.join(", ")
                )
            })?;
            let mut table = toml::Table::try_from(preset.params).map_err(|e| e.to_string())?;
            for (k, v) in d.overrides {
                if !table.contains_key(&k) {
                    let known: Vec<_> = table.keys().cloned().collect();
                    return Err(format!(
                        "unknown field '{k}' (known: model, preset, precondition, aging_passes, {})",
                        known.join(", ")
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
                return Err(format!("aging_passes must be ≥ 0, got {aging_passes}"));
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
        other => Err(format!(
            "unknown model '{other}' (known: ssd, hdd, raid0, fixed)"
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

fn unknown_preset<'a>(name: &str, known: impl Iterator<Item = &'a str>) -> String {
    format!(
        "unknown preset '{name}' (known: {})",
        known.collect::<Vec<_>>().join(", ")
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

fn check_ssd(p: &SsdParams) -> Result<(), String> {
    let pages = p.capacity_gib * (1u64 << 30) as f64 / 4096.0;
    if !(pages >= 1.0 && pages * (1.0 + p.op_ratio) < u32::MAX as f64 / 2.0) {
        return Err(format!(
            "capacity_gib {} is out of range (4 KiB .. 4 TiB)",
            p.capacity_gib
        ));
    }
    if !(p.op_ratio > 0.0 && p.op_ratio < 4.0) {
        return Err(format!("op_ratio must be in (0, 4), got {}", p.op_ratio));
    }
    if p.channels == 0 || p.dies_per_channel == 0 || p.pages_per_block < 2 {
        return Err("channels and dies_per_channel must be ≥ 1 and pages_per_block ≥ 2".into());
    }
    for (name, v) in [
        ("read_us", p.read_us),
        ("program_us", p.program_us),
        ("erase_us", p.erase_us),
        ("command_us", p.command_us),
    ] {
        if !(v.is_finite() && v >= 0.0) {
            return Err(format!("{name} must be ≥ 0, got {v}"));
        }
    }
    if !(p.write_buffer_mib.is_finite() && p.write_buffer_mib >= 0.0) {
        return Err(format!(
            "write_buffer_mib must be ≥ 0, got {}",
            p.write_buffer_mib
        ));
    }
    for (name, v) in [("channel_mb_s", p.channel_mb_s), ("host_mb_s", p.host_mb_s)] {
        if !(v.is_finite() && v > 0.0) {
            return Err(format!("{name} must be > 0, got {v}"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#"
        duration_s = 2
        seed = 9
        partition = true
        [device]
        model = "ssd"
        preset = "sata-840pro"
        capacity_gib = 1
        [[tenant]]
        name = "a"
        weight = 3
        workload = "varmail"
        [[tenant]]
        name = "b"
        workload = { pattern = "randwrite", size = "4k", iodepth = 4 }
    "#;

    fn parse(text: &str) -> Result<Scenario, ScenarioError> {
        Scenario::parse(text, "test.toml", "test")
    }

    #[test]
    fn loads_a_valid_scenario() {
        let s = parse(BASE).unwrap();
        assert_eq!(s.name, "test");
        assert_eq!(s.seed, 9);
        assert_eq!(s.tenants.len(), 2);
        assert_eq!(s.tenants[1].offset, 512 << 20);
        assert_eq!(s.tenants[1].size, 512 << 20);
        assert_eq!(s.tenants[1].spec.weight, 1.0);
        assert_eq!(s.policies, vec![PolicyChoice::named("none")]);
        assert_eq!(s.device.capacity_bytes(), 1 << 30);
    }

    fn expect_err(text: &str, want: &str) {
        let e = parse(text).unwrap_err().to_string();
        assert!(e.starts_with("test.toml: "), "{e}");
        assert!(e.contains(want), "wanted '{want}' in: {e}");
    }

    #[test]
    fn disk_models_take_presets_and_nested_overrides() {
        let raid = BASE.replace(
            "model = \"ssd\"\n        preset = \"sata-840pro\"\n        capacity_gib = 1",
            "model = \"raid0\"\n        stripe_kib = 64\n        member = { queue_depth = 4 }",
        );
        let s = parse(&raid).unwrap();
        let DeviceSpec::Raid0 { preset, params } = &s.device else {
            panic!("{:?}", s.device)
        };
        assert_eq!(preset.as_deref(), Some("scsi-10k-73g-x8"));
        assert_eq!(params.stripe_kib, 64);
        assert_eq!(params.member.queue_depth, 4);
        assert_eq!(params.member.rpm, 10_000.0);
        assert!(
            s.device
                .describe()
                .starts_with("raid0 scsi-10k-73g-x8 (8 × 10000 rpm")
        );
        expect_err(
            &raid.replace("queue_depth = 4", "qd = 4"),
            "device: unknown field 'member.qd'",
        );
        expect_err(
            &raid.replace("stripe_kib = 64", "stripe_kib = 6"),
            "stripe_kib must be a positive multiple of 4",
        );
        let hdd = BASE.replace(
            "model = \"ssd\"\n        preset = \"sata-840pro\"\n        capacity_gib = 1",
            "model = \"hdd\"\n        precondition = \"aged\"",
        );
        expect_err(&hdd, "the hdd model takes no precondition");
        let s = parse(&hdd.replace("precondition = \"aged\"", "rpm = 7200")).unwrap();
        assert!(matches!(s.device, DeviceSpec::Hdd { params, .. } if params.rpm == 7200.0));
    }

    #[test]
    fn errors_name_the_field_and_problem() {
        expect_err(
            &BASE.replace("weight = 3", "weight = 0"),
            "tenant 1 ('a'): weight must be > 0",
        );
        expect_err(
            &BASE.replace("weight = 3", "wieght = 3"),
            "unknown field `wieght`",
        );
        expect_err(
            &format!("policies = [\"fifo\"]\n{BASE}"),
            "unknown policy 'fifo'",
        );
        expect_err(
            &format!("policies = [{{ name = \"none\", depth = 3 }}]\n{BASE}"),
            "policy 'none': unknown parameter 'depth'",
        );
        expect_err(
            &BASE.replace("size = \"4k\"", "size = 0"),
            "tenant 2 ('b'): workload: size must be > 0",
        );
        expect_err(
            &BASE.replace(
                "weight = 3",
                "weight = 3\noffset = \"900m\"\nsize = \"512m\"",
            ),
            "runs past the device end",
        );
        expect_err(
            &BASE.replace("preset = \"sata-840pro\"", "preset = \"nope\""),
            "device: unknown preset 'nope'",
        );
        expect_err(
            &BASE.replace("capacity_gib = 1", "capacity_gib = 1\nchanels = 3"),
            "device: unknown field 'chanels'",
        );
        expect_err(
            &BASE.replace("model = \"ssd\"", "model = \"tape\""),
            "unknown model 'tape'",
        );
        expect_err(
            &BASE.replace("duration_s = 2", "duration_s = 0"),
            "duration_s must be > 0",
        );
        expect_err(
            &BASE.replace("workload = \"varmail\"", "workload = \"nope\""),
            "unknown workload 'nope'",
        );
        expect_err(
            &BASE.replace("name = \"b\"", "name = \"a\""),
            "name used twice",
        );
        expect_err(
            "duration_s = 1\n[device]\nmodel = \"fixed\"\n",
            "no tenants",
        );
    }

    #[test]
    fn sweep_expands_the_cartesian_product() {
        let text = format!(
            "{BASE}\n[sweep]\n\"device.precondition\" = [\"clean\", \"aged\"]\n\"tenant.b.workload.size\" = [\"4k\", \"8k\", \"16k\"]\n"
        );
        let all = Scenario::parse_all(&text, "test.toml", "test").unwrap();
        assert_eq!(all.len(), 6);
        assert_eq!(
            all[0].variant,
            "device.precondition=clean, tenant.b.workload.size=4k"
        );
        assert_eq!(
            all[5].variant,
            "device.precondition=aged, tenant.b.workload.size=16k"
        );
        assert!(matches!(
            all[5].device,
            DeviceSpec::Ssd {
                precondition: Precondition::Aged,
                ..
            }
        ));
        assert_eq!(
            all[4].tenants[1].workload.phases[0].size,
            crate::workload::SizeDist::Fixed(8192)
        );
        let all = format!("{BASE}\n[sweep]\n\"tenant.*.weight\" = [2, 5]\n");
        let all = Scenario::parse_all(&all, "test.toml", "test").unwrap();
        assert_eq!(all.len(), 2);
        assert!(all[1].tenants.iter().all(|t| t.spec.weight == 5.0));
        let bad = format!("{BASE}\n[sweep]\n\"tenant.zz.weight\" = [1]\n");
        let e = Scenario::parse_all(&bad, "test.toml", "test")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("sweep: 'tenant.zz.weight': no entry 'zz' in 'tenant'"),
            "{e}"
        );
        let bad = format!("{BASE}\n[sweep]\n\"tenant.a.weight\" = [1, 0]\n");
        let e = Scenario::parse_all(&bad, "test.toml", "test")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("[tenant.a.weight=0] tenant 1 ('a'): weight must be > 0"),
            "{e}"
        );
    }

    #[test]
    fn policy_tables_take_labels() {
        let s = parse(&format!(
            "policies = [\"none\", {{ name = \"none\", label = \"fifo2\" }}]\n{BASE}"
        ))
        .unwrap();
        assert_eq!(s.policies[1].label, "fifo2");
        expect_err(
            &format!("policies = [\"none\", \"none\"]\n{BASE}"),
            "label 'none' used twice",
        );
    }
}
