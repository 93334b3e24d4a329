//! Scenarios: an experiment as a TOML file (device, tenants with weights/SLOs and
//! workloads, policies to compare, duration, seed). Loading validates everything and
//! names the file, the field and the problem.

pub mod cost;
mod sweep;

use crate::config::{
    ConfigError, Invalid, PolicyChoice, PolicyEntry, QosFields, parse_problem, tenant_field,
};
use crate::device::spec::{DeviceFile, DeviceSpec};
use crate::host::Refuse;
use crate::policy;
use crate::types::{Nanos, Slo, TenantSpec, secs_to_nanos};
use crate::units::{ByteSize, format_bytes};
use crate::workload::{Workload, WorkloadConfig};
use serde::Deserialize;
use std::path::Path;

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
    refuse: Option<String>,
    /// Run each tenant alone too and judge every run's insulation.
    insulation: Option<bool>,
    /// Give tenants without an explicit region equal consecutive partitions.
    partition: Option<bool>,
    policies: Option<Vec<PolicyEntry>>,
    /// Taken out before deserializing (see `sweep::Sweep`); never read here.
    #[allow(dead_code)]
    sweep: Option<toml::Table>,
    device: DeviceFile,
    #[serde(default)]
    tenant: Vec<TenantFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantFile {
    name: String,
    weight: Option<f64>,
    slo: Option<Slo>,
    reservation_iops: Option<f64>,
    limit_iops: Option<f64>,
    /// Where its promises come in the verdict: higher first (default 0).
    priority: Option<i32>,
    offset: Option<ByteSize>,
    size: Option<ByteSize>,
    /// Read with [`WorkloadConfig::from_value`], so its errors name the tenant too.
    workload: toml::Value,
}

/// One tenant of a scenario.
#[derive(Debug, Clone, PartialEq)]
pub struct TenantSetup {
    /// The tenant's promise (weight, SLO, reservation, limit).
    pub spec: TenantSpec,
    /// Byte offset of the tenant's region on the device.
    pub offset: u64,
    /// Byte size of the region.
    pub size: u64,
    /// What the tenant sends.
    pub workload: Workload,
    /// Its random stream (1-based tenant index in the file): the same requests in
    /// whatever run it is in, alone or beside others.
    pub stream: u64,
    /// Where its promises come in the verdict: a tenant's of higher priority before
    /// those of lower (default 0), then SLOs, reservations, limits, weights.
    pub priority: i32,
}

/// A loaded, validated scenario.
#[derive(Debug, Clone, PartialEq)]
pub struct Scenario {
    /// The scenario's name (the file's stem unless given).
    pub name: String,
    /// Which point of a `[sweep]` this is (`size=4k, precondition=aged`); empty without one.
    pub variant: String,
    /// What it shows.
    pub description: String,
    /// Every random choice derives from it.
    pub seed: u64,
    /// Simulated length of each run.
    pub duration: Nanos,
    /// Start of the measured span.
    pub warmup: Nanos,
    /// Time-series bin.
    pub interval: Nanos,
    /// Requests the device holds at once, over all tenants.
    pub queue_depth: u32,
    /// Requests a tenant may have waiting in the engine (held by the policy); a request
    /// beyond it is refused and counted. `None`: unbounded.
    pub queue_limit: Option<u32>,
    /// What becomes of a request the policy refuses: answered with an error
    /// (`"error"`, the default: an open-loop client cannot be slowed down) or held back
    /// in the host (`"hold"`, needs `queue_limit`), as the live server does by default.
    pub refuse: Refuse,
    /// The device every run starts from (a fresh copy per policy).
    pub device: DeviceSpec,
    /// The tenants, in order (their index is their [`crate::types::TenantId`]).
    pub tenants: Vec<TenantSetup>,
    /// The policies to compare, each run on its own copy of the device.
    pub policies: Vec<PolicyChoice>,
    /// Judge insulation: each tenant also runs alone on a copy of the device
    /// ([`crate::sim::alone`]) and every run gets each tenant's R.
    pub insulation: bool,
}

/// A scenario file's points (one per point of its `[sweep]`, one without), each built
/// and checked when asked for.
#[derive(Debug, Clone)]
pub struct Points {
    sweep: sweep::Sweep,
    source_name: String,
    default_name: String,
    /// The scenario file's folder: relative trace paths are taken from it.
    base_dir: Option<std::path::PathBuf>,
    /// The file's text, to say on which line a field is ([`Self::located`]).
    text: String,
}

impl Points {
    /// How many points.
    pub fn len(&self) -> usize {
        self.sweep.len()
    }

    /// Never: a file has at least one point.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Point `index` (< [`Points::len`]), parsed and checked; errors name the file and
    /// the point.
    pub fn get(&self, index: usize) -> Result<Scenario, ConfigError> {
        let (label, doc) = self
            .sweep
            .point(index)
            .map_err(|e| e.in_file(&self.source_name))?;
        let mut doc = doc;
        if let Some(base) = &self.base_dir {
            trace_paths_from(&mut doc, base);
        }
        // The point's label goes after the file and its line.
        let file: ScenarioFile =
            crate::config::from_table(doc).map_err(|e| self.located(e, &label))?;
        let mut s = validate(file, &self.default_name).map_err(|e| self.located(e, &label))?;
        s.variant = label;
        Ok(s)
    }

    /// The error naming the file and, where the field is found in it, the line
    /// (`file.toml:12`); an unknown key is looked for by its own name.
    fn located(&self, e: Invalid, point: &str) -> ConfigError {
        let e = crate::config::located(e, &self.text, &self.source_name);
        if point.is_empty() {
            e
        } else {
            ConfigError {
                source: format!("{} [{point}]", e.source),
                ..e
            }
        }
    }

    /// The points in order, each built when reached.
    pub fn iter(&self) -> impl Iterator<Item = Result<Scenario, ConfigError>> + '_ {
        (0..self.len()).map(|i| self.get(i))
    }
}

impl Scenario {
    /// Loads a scenario file: one scenario per point of its `[sweep]` (one without).
    pub fn load(path: &Path) -> Result<Vec<Scenario>, ConfigError> {
        Scenario::load_points(path)?.iter().collect()
    }

    /// Reads a scenario file's points without building them: each is parsed and checked
    /// when [`Points::get`] asks for it.
    pub fn load_points(path: &Path) -> Result<Points, ConfigError> {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .map_err(|e| Invalid::whole(format!("cannot read: {e}")).in_file(&name))?;
        let stem = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "scenario".into());
        let mut points = Scenario::points(&text, &name, &stem)?;
        points.base_dir = path.parent().map(|p| p.to_path_buf());
        Ok(points)
    }

    /// Parses scenario text with its sweep expanded; `source_name` names it in errors
    /// (with the sweep point, when one of them is wrong), `default_name` is used when
    /// the file has no `name`.
    pub fn parse_all(
        text: &str,
        source_name: &str,
        default_name: &str,
    ) -> Result<Vec<Scenario>, ConfigError> {
        Scenario::points(text, source_name, default_name)?
            .iter()
            .collect()
    }

    /// Parses scenario text up to its sweep: the points are built one at a time by
    /// [`Points::get`].
    pub fn points(
        text: &str,
        source_name: &str,
        default_name: &str,
    ) -> Result<Points, ConfigError> {
        let doc: toml::Table =
            toml::from_str(text).map_err(|e| parse_problem(e).in_file(source_name))?;
        let sweep = sweep::Sweep::new(doc).map_err(|e| e.in_file(source_name))?;
        Ok(Points {
            sweep,
            source_name: source_name.to_string(),
            default_name: default_name.to_string(),
            base_dir: None,
            text: text.to_string(),
        })
    }

    /// Parses a scenario that has no sweep.
    pub fn parse(
        text: &str,
        source_name: &str,
        default_name: &str,
    ) -> Result<Scenario, ConfigError> {
        let mut all = Scenario::parse_all(text, source_name, default_name)?;
        if all.len() != 1 {
            return Err(Invalid::new(
                "sweep",
                format!("expected one scenario, the sweep makes {}", all.len()),
            )
            .in_file(source_name));
        }
        Ok(all.remove(0))
    }

    /// The tenants' promises, in order.
    pub fn specs(&self) -> Vec<TenantSpec> {
        self.tenants.iter().map(|t| t.spec.clone()).collect()
    }

    /// Per tenant: whether its requests come at a rate (open loop) in every phase in
    /// which it does I/O (see [`crate::metrics::DEMAND_MET_FRACTION`]).
    pub fn open_loop(&self) -> Vec<bool> {
        self.tenants
            .iter()
            .map(|t| {
                let mut active = t
                    .workload
                    .phases
                    .iter()
                    .filter(|p| !matches!(p.arrivals, crate::workload::Arrivals::Idle))
                    .peekable();
                active.peek().is_some()
                    && active.all(|p| {
                        matches!(
                            p.arrivals,
                            crate::workload::Arrivals::Open { .. }
                                | crate::workload::Arrivals::Trace
                        )
                    })
            })
            .collect()
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

/// Makes the tenants' relative `workload.trace` paths (those not starting with `/` or
/// `$`) relative to `base`, the scenario file's folder.
fn trace_paths_from(doc: &mut toml::Table, base: &Path) {
    let Some(toml::Value::Array(tenants)) = doc.get_mut("tenant") else {
        return;
    };
    for t in tenants {
        if let Some(toml::Value::String(path)) = t
            .get_mut("workload")
            .and_then(|w| w.as_table_mut())
            .and_then(|w| w.get_mut("trace"))
            && !path.starts_with('/')
            && !path.starts_with('$')
        {
            *path = base.join(&*path).display().to_string();
        }
    }
}

fn positive_secs(field: &str, v: f64) -> Result<Nanos, Invalid> {
    if v.is_finite() && v > 0.0 {
        Ok(secs_to_nanos(v))
    } else {
        Err(Invalid::new(field, format!("must be > 0, got {v}")))
    }
}

fn validate(file: ScenarioFile, default_name: &str) -> Result<Scenario, Invalid> {
    let duration = positive_secs("duration_s", file.duration_s)?;
    let warmup = match file.warmup_s {
        None => 0,
        Some(w) if w.is_finite() && w >= 0.0 && secs_to_nanos(w) < duration => secs_to_nanos(w),
        Some(w) => {
            return Err(Invalid::new(
                "warmup_s",
                format!("must be ≥ 0 and shorter than duration_s, got {w}"),
            ));
        }
    };
    let interval = positive_secs("interval_s", file.interval_s.unwrap_or(1.0))?;
    let queue_depth = match file.queue_depth.unwrap_or(32) {
        q @ 1..=65_536 => q,
        q => {
            return Err(Invalid::new(
                "queue_depth",
                format!("must be 1 ..= 65536, got {q}"),
            ));
        }
    };
    let queue_limit = match file.queue_limit {
        Some(0) => {
            return Err(Invalid::new(
                "queue_limit",
                "must be ≥ 1 (leave it out for no bound)",
            ));
        }
        q => q,
    };
    let refuse = Refuse::parse(file.refuse.as_deref().unwrap_or("error"))
        .map_err(|e| Invalid::new("refuse", e.to_string()))?;
    if refuse == Refuse::Hold && queue_limit.is_none() {
        return Err(Invalid::new(
            "refuse",
            "\"hold\" needs a queue_limit: simulated clients do not slow down, so what is held back needs a bound",
        ));
    }
    let device = file.device.spec().map_err(|e| e.within("device"))?;
    if file.tenant.is_empty() {
        return Err(Invalid::new(
            "tenant",
            "no tenants: add at least one [[tenant]]",
        ));
    }
    let capacity = device.capacity_bytes();
    let regions = Regions {
        capacity,
        partition: file
            .partition
            .unwrap_or(false)
            .then(|| capacity / file.tenant.len() as u64 / 4096 * 4096),
    };
    let mut tenants: Vec<TenantSetup> = Vec::with_capacity(file.tenant.len());
    for (i, t) in file.tenant.into_iter().enumerate() {
        let at = tenant_field(i + 1, &t.name);
        if t.name.trim().is_empty() {
            return Err(Invalid::new(format!("tenant {}", i + 1), "name is empty"));
        }
        if tenants.iter().any(|x| x.spec.name == t.name) {
            return Err(Invalid::new("name", "used twice").within(&at));
        }
        let setup = tenant_setup(t, i, &regions, queue_limit).map_err(|e| e.within(&at))?;
        tenants.push(setup);
    }
    let specs: Vec<TenantSpec> = tenants.iter().map(|t| t.spec.clone()).collect();
    let policies = policies(file.policies, &specs)?;
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
        refuse,
        device,
        tenants,
        policies,
        insulation: file.insulation.unwrap_or(false),
    })
}

/// Where tenants without a region of their own go.
struct Regions {
    capacity: u64,
    /// With `partition = true`: the size of each tenant's equal share.
    partition: Option<u64>,
}

/// The `i`-th tenant (0-based), checked; errors name fields of the tenant's table.
fn tenant_setup(
    t: TenantFile,
    i: usize,
    regions: &Regions,
    queue_limit: Option<u32>,
) -> Result<TenantSetup, Invalid> {
    let spec = QosFields {
        weight: t.weight,
        slo: t.slo,
        reservation_iops: t.reservation_iops,
        limit_iops: t.limit_iops,
    }
    .spec(&t.name)?;
    let priority = t.priority.unwrap_or(0);
    let capacity = regions.capacity;
    let (default_offset, default_size) = match regions.partition {
        Some(part) => (i as u64 * part, part),
        None => (0, capacity),
    };
    let offset = t.offset.map_or(default_offset, |b| b.0);
    let size = t
        .size
        .map_or(capacity.saturating_sub(offset).min(default_size), |b| b.0);
    if size == 0 {
        return Err(Invalid::new("size", "the region is empty"));
    }
    if !offset.is_multiple_of(4096) || !size.is_multiple_of(4096) {
        return Err(Invalid::new(
            "offset/size",
            "a region's offset and size must be multiples of 4 KiB",
        ));
    }
    if offset.checked_add(size).is_none_or(|end| end > capacity) {
        return Err(Invalid::new(
            "offset/size",
            format!(
                "region {}+{} runs past the device end ({})",
                format_bytes(offset),
                format_bytes(size),
                format_bytes(capacity)
            ),
        ));
    }
    let workload = WorkloadConfig::from_value(t.workload)
        .and_then(|w| w.resolve())
        .map_err(|e| e.within("workload"))?;
    if let Some(limit) = queue_limit
        && let Some(depth) = workload.phases.iter().find_map(|p| match p.arrivals {
            crate::workload::Arrivals::Closed { iodepth } if iodepth > limit => Some(iodepth),
            _ => None,
        })
    {
        return Err(Invalid::new(
            "workload.iodepth",
            format!(
                "{depth} is above queue_limit {limit}: a closed loop would lose the requests it cannot queue"
            ),
        ));
    }
    if workload.max_size() as u64 > size {
        return Err(Invalid::new(
            "workload",
            format!(
                "requests of up to {} do not fit the {} region",
                format_bytes(workload.max_size() as u64),
                format_bytes(size)
            ),
        ));
    }
    Ok(TenantSetup {
        spec,
        offset,
        size,
        workload,
        stream: i as u64 + 1,
        priority,
    })
}

/// The policies to compare (default: [`crate::policy::DEFAULT_POLICY`]), each built
/// once to check it.
fn policies(
    entries: Option<Vec<PolicyEntry>>,
    specs: &[TenantSpec],
) -> Result<Vec<PolicyChoice>, Invalid> {
    let list = match entries {
        None => return Ok(vec![PolicyChoice::named(crate::policy::DEFAULT_POLICY)]),
        Some(list) if list.is_empty() => return Err(Invalid::new("policies", "is empty")),
        Some(list) => list,
    };
    let mut policies: Vec<PolicyChoice> = Vec::with_capacity(list.len());
    for (i, e) in list.into_iter().enumerate() {
        let at = format!("policies[{i}]");
        let p = e.choice().map_err(|e| e.within(&at))?;
        if policies.iter().any(|q| q.label == p.label) {
            return Err(Invalid::new(
                at,
                format!("label '{}' used twice (give one a `label`)", p.label),
            ));
        }
        policy::build(&p.name, p.params.clone(), specs)
            .map_err(|e| Invalid::new(&at, e.to_string()))?;
        policies.push(p);
    }
    Ok(policies)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::ssd::Precondition;

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

    fn parse(text: &str) -> Result<Scenario, ConfigError> {
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
        assert_eq!(
            s.policies,
            vec![PolicyChoice::named(crate::policy::DEFAULT_POLICY)]
        );
        assert_eq!(s.device.capacity_bytes(), 1 << 30);
    }

    fn expect_err(text: &str, want: &str) {
        let e = parse(text).unwrap_err().to_string();
        // The file, then the line where the field is found.
        assert!(e.starts_with("test.toml:"), "{e}");
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
            "device.stripe_kib: must be a positive multiple of 4, got 6",
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
            "tenant 1 ('a').weight: must be in (0, 1000000], got 0",
        );
        expect_err(
            &BASE.replace("weight = 3", "weight = 1e308"),
            "tenant 1 ('a').weight: must be in (0, 1000000], got 1e308",
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
            "tenant 2 ('b').workload.size: must be > 0",
        );
        // Inside a workload table: the tenant, the key and the problem (an untagged
        // enum said only that nothing matched).
        for (from, to, says) in [
            (
                "iodepth = 4",
                "iodepth = 4.5",
                "tenant 2 ('b').workload.iodepth: invalid type: floating point `4.5`, expected u32",
            ),
            (
                "size = \"4k\"",
                "size = \"abc\"",
                "tenant 2 ('b').workload.size: 'abc' is not a size",
            ),
            (
                "\"randwrite\"",
                "\"zigzag\"",
                "tenant 2 ('b').workload.pattern: unknown variant `zigzag`",
            ),
            (
                "iodepth = 4",
                "iodepth = 4, bogus = 1",
                "tenant 2 ('b').workload.bogus: unknown field `bogus`",
            ),
            (
                "workload = \"varmail\"",
                "workload = 5",
                "tenant 1 ('a').workload: must be a stand-in's name or a table, got integer 5",
            ),
        ] {
            expect_err(&BASE.replace(from, to), says);
        }
        expect_err(
            &BASE.replace(
                "weight = 3",
                "weight = 3\noffset = \"900m\"\nsize = \"512m\"",
            ),
            "runs past the device end",
        );
        expect_err(
            &BASE.replace("preset = \"sata-840pro\"", "preset = \"nope\""),
            "device.preset: unknown preset 'nope'",
        );
        expect_err(
            &BASE.replace("capacity_gib = 1", "capacity_gib = 1\nchanels = 3"),
            "device.chanels: unknown field (known: model, preset",
        );
        expect_err(
            &BASE.replace("model = \"ssd\"", "model = \"tape\""),
            "device.model: unknown model 'tape'",
        );
        expect_err(
            &BASE.replace("duration_s = 2", "duration_s = 0"),
            "duration_s: must be > 0",
        );
        expect_err(
            &BASE.replace("workload = \"varmail\"", "workload = \"nope\""),
            "unknown workload 'nope'",
        );
        expect_err(
            &BASE.replace("name = \"b\"", "name = \"a\""),
            "tenant 2 ('a').name: used twice",
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
            e.contains("sweep.'tenant.zz.weight': no entry 'zz' in 'tenant'"),
            "{e}"
        );
        let bad = format!("{BASE}\n[sweep]\n\"tenant.a.weight\" = [1, 0]\n");
        let e = Scenario::parse_all(&bad, "test.toml", "test")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(
                "test.toml:11 [tenant.a.weight=0]: tenant 1 ('a').weight: must be in (0, 1000000]"
            ),
            "{e}"
        );
        // Counted before anything is built.
        let list = (1..=100)
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(", ");
        let huge = format!(
            "{BASE}\n[sweep]\nseed = [{list}]\nduration_s = [{list}]\n\"tenant.a.weight\" = [{list}]\n"
        );
        let e = Scenario::parse_all(&huge, "test.toml", "test")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("1000000 points (the product of the lists' lengths), more than 10000"),
            "{e}"
        );
    }

    /// A sweep's points are built when asked for: 10,000 of them cost nothing until
    /// read, point i is the i-th of the product (the first key slowest), and a bad
    /// value is found at its own point.
    #[test]
    fn sweep_points_are_built_one_at_a_time() {
        let list = (1..=100)
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(", ");
        let text = format!("{BASE}\n[sweep]\nseed = [{list}]\n\"tenant.a.weight\" = [{list}]\n");
        let points = Scenario::points(&text, "test.toml", "test").unwrap();
        assert_eq!(points.len(), 10_000);
        let p = points.get(123).unwrap();
        assert_eq!(p.variant, "seed=2, tenant.a.weight=24");
        assert_eq!((p.seed, p.tenants[0].spec.weight), (2, 24.0));
        assert_eq!(
            points.get(9_999).unwrap().variant,
            "seed=100, tenant.a.weight=100"
        );
        let bad = format!("{BASE}\n[sweep]\n\"tenant.a.weight\" = [1, 2, -3, 4]\n");
        let points = Scenario::points(&bad, "test.toml", "test").unwrap();
        assert!(points.get(1).is_ok());
        let e = points.get(2).unwrap_err().to_string();
        assert!(e.contains("test.toml:11 [tenant.a.weight=-3]"), "{e}");
        assert_eq!(points.iter().filter(|p| p.is_err()).count(), 1);
        // Keys in the file's reverse alphabetical order still vary in alphabetical
        // order: "seed" slowest, then "tenant.a.weight".
        let text = format!("{BASE}\n[sweep]\n\"tenant.a.weight\" = [1, 2]\nseed = [7, 8]\n");
        let points = Scenario::points(&text, "test.toml", "test").unwrap();
        let labels: Vec<String> = points.iter().map(|p| p.unwrap().variant).collect();
        assert_eq!(
            labels,
            [
                "seed=7, tenant.a.weight=1",
                "seed=7, tenant.a.weight=2",
                "seed=8, tenant.a.weight=1",
                "seed=8, tenant.a.weight=2"
            ]
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
            "policies[1]: label 'none' used twice",
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

        /// Random scenario documents (the keys a scenario has, values of every kind, in
        /// and out of range): a scenario or an error, never a panic; what parses has a
        /// cost estimate, so nothing unbounded reaches a run unasked; and what is cheap
        /// by that estimate runs to the end with figures in range.
        #[test]
        fn random_documents_parse_or_explain(
            lines in proptest::collection::vec(line(), 0..14),
        ) {
            let text = lines.join("\n");
            parse_or_explain(&text)?;
        }

        /// The same property on documents that are one valid scenario with each value
        /// drawn from good and bad ones, so that many parse and run.
        #[test]
        fn mutated_scenarios_run_or_explain(text in mutated_scenario()) {
            parse_or_explain(&text)?;
        }
    }

    /// A document parses or explains; a parsed one has a finite cost, and one cheap by
    /// that estimate runs to the end with figures in range.
    fn parse_or_explain(text: &str) -> Result<(), proptest::test_runner::TestCaseError> {
        {
            if let Ok(s) = parse(text) {
                let c = s.cost();
                proptest::prop_assert!(c.memory_bytes.is_finite() && c.requests.is_finite());
                let cheap = c.aging_seconds <= 0.5
                    && c.memory_bytes < 2e8
                    && c.requests < 1e6
                    && s.duration <= 2_000_000_000;
                if cheap {
                    let r = crate::sim::run_scenario(&s, false);
                    let r =
                        r.map_err(|e| proptest::test_runner::TestCaseError::fail(format!("{e}")))?;
                    for run in &r.runs {
                        proptest::prop_assert!(run.total_bandwidth_bytes_per_s.is_finite());
                        for t in &run.tenants {
                            proptest::prop_assert!((0.0..=1.0).contains(&t.share), "{}", t.share);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// A value that is one of `good` six times in seven, else one of `bad`.
    fn mix(
        good: &'static [&'static str],
        bad: &'static [&'static str],
    ) -> proptest::strategy::BoxedStrategy<&'static str> {
        use proptest::prelude::*;
        prop_oneof![
            6 => proptest::sample::select(good),
            1 => proptest::sample::select(bad),
        ]
        .boxed()
    }

    fn mutated_scenario() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let device = || {
            mix(
                &[
                    "model = 'fixed'\nlatency_us = 100.0\nparallelism = 8",
                    "model = 'fixed'\nbandwidth_mb_s = 50.0\nparallelism = 2",
                    "model = 'ssd'\npreset = 'sata-840pro'\ncapacity_gib = 1",
                    "model = 'ssd'\npreset = 'nvme-p4500'\ncapacity_gib = 0.5\nprecondition = 'aged'",
                    "model = 'hdd'\ncapacity_gib = 1",
                    "model = 'raid0'",
                ],
                &[
                    "model = 'fixed'\nlatency_us = -100.0",
                    "model = 'fixed'\nlatency_us = nan",
                    "model = 'fixed'\nbandwidth_mb_s = 0.0",
                    "model = 'fixed'\nparallelism = 0",
                    "model = 'ssd'\ncapacity_gib = 4096",
                    "model = 'tape'",
                ],
            )
        };
        let workload = || {
            mix(
                &[
                    "{ pattern = 'randread', size = '4k', iodepth = 4 }",
                    "{ pattern = 'randrw', read_mix = 0.5, size = '16k', rate_iops = 1000.0 }",
                    "{ pattern = 'write', size_mean = '24k', iodepth = 2 }",
                    "{ pattern = 'randwrite', size = '4k', rate_iops = 300.0, rate_process = 'linear' }",
                    "'fileserver'",
                    "{ pattern = 'read', size = '4k', iodepth = 1, phases = [{ duration_s = 0.5 }, { idle = true }] }",
                ],
                &[
                    "{ rate_iops = 1e12 }",
                    "{ pattern = 'write', size = 'abc' }",
                    "{ iodepth = 4.5 }",
                    "{ pattern = 'randread', iodepth = 4, rate_iops = 10.0 }",
                ],
            )
        };
        (
            mix(&["0.5", "1", "2"], &["-1", "nan", "1e12", "'x'"]),
            mix(&["0", "0.2"], &["5", "-1"]),
            mix(&["0.1", "1"], &["1e-9", "0"]),
            mix(&["1", "4", "32"], &["0", "1000000"]),
            device(),
            mix(&["1", "7", "0.5"], &["0", "1e308", "-1"]),
            workload(),
            workload(),
            mix(
                &[
                    "",
                    "slo = { iops = 100, size = 4096, rt_us = 5000 }",
                    "reservation_iops = 50.0",
                ],
                &["slo = { iops = -1, size = 4096, rt_us = 5000 }", "limit_iops = 0.0"],
            ),
            mix(
                &["['none']", "['sfq', 'mclock', 'ta2']", "['feedbac', 'bfq']", "['ta1', 'ta3', 'mots', 'cfq']"],
                &["['nope']"],
            ),
        )
            .prop_map(|(d, w, i, q, dev, weight, wa, wb, qos, pol)| {
                format!(
                    "duration_s = {d}\nwarmup_s = {w}\ninterval_s = {i}\nqueue_depth = {q}\npolicies = {pol}\n[device]\n{dev}\n[[tenant]]\nname = 'a'\nweight = {weight}\nworkload = {wa}\n[[tenant]]\nname = 'b'\n{qos}\nworkload = {wb}\n"
                )
            })
    }

    fn line() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let key = prop_oneof![
            Just("duration_s"),
            Just("warmup_s"),
            Just("interval_s"),
            Just("queue_depth"),
            Just("queue_limit"),
            Just("seed"),
            Just("partition"),
            Just("model"),
            Just("preset"),
            Just("capacity_gib"),
            Just("precondition"),
            Just("name"),
            Just("weight"),
            Just("workload"),
            Just("latency_us"),
            Just("parallelism"),
        ];
        let value = prop_oneof![
            (-5i64..100_000).prop_map(|v| v.to_string()),
            prop_oneof![
                Just("1e308"),
                Just("-1e9"),
                Just("nan"),
                Just("inf"),
                Just("0.5")
            ]
            .prop_map(str::to_string),
            "[a-z0-9]{0,6}".prop_map(|v| format!("'{v}'")),
            Just("true".to_string()),
            Just("{ pattern = 'randread', iodepth = 4 }".to_string()),
            Just("{ pattern = 'randrw', rate_iops = 1e6, read_mix = 2 }".to_string()),
        ];
        prop_oneof![
            Just("[device]".to_string()),
            Just("[[tenant]]".to_string()),
            (key, value).prop_map(|(k, v)| format!("{k} = {v}")),
        ]
    }
}
