//! The live server's configuration (TOML): where to listen, the policy, the backend,
//! and the tenants, each an NBD export backed by its own image file or by a region of
//! one shared file or block device. Relative paths are taken from the config file's
//! folder; export names are only ever looked up, never turned into paths.

use super::identity::Identity;
use crate::config::{
    ConfigError, Invalid, PolicyChoice, PolicyEntry, QosFields, parse_problem, tenant_field,
};
use crate::device::spec::{DeviceFile, DeviceSpec};
use crate::host::Refuse;
use crate::journal::JournalParams;
use crate::types::{Nanos, Slo, TenantSpec, secs_to_nanos};
use crate::units::{ByteSize, format_bytes};
use serde::Deserialize;
use std::path::{Path, PathBuf};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    #[serde(default)]
    server: ServerFile,
    backend: Option<BackendFile>,
    #[serde(default)]
    tenant: Vec<TenantFile>,
    cluster: Option<super::front::ClusterFile>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ServerFile {
    unix: Option<PathBuf>,
    tcp: Option<String>,
    queue_depth: Option<u32>,
    queue_limit: Option<u32>,
    threads: Option<u32>,
    refuse: Option<String>,
    policy: Option<PolicyEntry>,
    interval_s: Option<f64>,
    metrics: Option<String>,
    drain_timeout_s: Option<f64>,
    backend_stall_ms: Option<f64>,
    backend_timeout_s: Option<f64>,
    max_inflight_bytes: Option<ByteSize>,
    handshake_timeout_s: Option<f64>,
    max_connections: Option<u32>,
    max_connections_per_tenant: Option<u32>,
    max_connections_per_peer: Option<u32>,
    tls: Option<String>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    tls_client_ca: Option<PathBuf>,
    tls_psk: Option<PathBuf>,
    allow_plaintext: Option<bool>,
    image_dirs: Option<Vec<PathBuf>>,
    default_export: Option<toml::Value>,
    control: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct BackendFile {
    kind: Option<String>,
    cache: Option<String>,
    /// The shared file or block device tenants with `offset` are regions of.
    path: Option<PathBuf>,
    /// Size of the shared file when it is created.
    size: Option<ByteSize>,
    /// The emulated backend's device model, as a scenario's `[device]`.
    device: Option<DeviceFile>,
    /// Seed of the emulated device's aging.
    seed: Option<u64>,
    /// The rbd backend's cluster configuration file (`ceph.conf`).
    conf: Option<PathBuf>,
    /// The rbd backend's pool (tenants may name another).
    pool: Option<String>,
    /// The rbd backend's client id (`admin`; tenants may name another).
    client_id: Option<String>,
    /// The journal detector's thresholds (`cache = "pdc"`).
    pdc: Option<PdcFile>,
    /// A file with a `[device]` table (`ioshare calibrate --out`): what the policy
    /// charges requests by.
    cost_device: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PdcFile {
    group: Option<ByteSize>,
    min_run: Option<ByteSize>,
    confirm: Option<ByteSize>,
    wrap_tolerance: Option<ByteSize>,
    gap: Option<ByteSize>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TenantFile {
    name: String,
    weight: Option<f64>,
    slo: Option<Slo>,
    reservation_iops: Option<f64>,
    limit_iops: Option<f64>,
    /// Own image file (created sparse with `size` when missing and `create` is set).
    file: Option<PathBuf>,
    /// Create `file` when it is missing (otherwise a missing image is an error).
    #[serde(default)]
    create: bool,
    /// Serve `file` at `size` although the image holds another size (a smaller image
    /// is grown; of a larger one the first `size` bytes are served).
    #[serde(default)]
    resize: bool,
    /// Its image in the rbd backend's pool.
    image: Option<String>,
    /// Its image's pool (default `backend.pool`).
    pool: Option<String>,
    /// The client id its image is opened as (default `backend.client_id`).
    client_id: Option<String>,
    /// Region of the shared backend file.
    offset: Option<ByteSize>,
    size: Option<ByteSize>,
    #[serde(default)]
    read_only: bool,
    /// This tenant's cache mode (default: `backend.cache`).
    cache: Option<String>,
    /// A line about the export, sent to clients that ask (`NBD_INFO_DESCRIPTION`).
    description: Option<String>,
}

pub use crate::io::transfer::Cache;

impl Cache {
    /// Parses a cache mode as the configuration spells it.
    fn parse(field: &str, text: &str) -> Result<Cache, Invalid> {
        match text {
            "none" => Ok(Cache::None),
            "writeback" => Ok(Cache::Writeback),
            "pdc" => Ok(Cache::Pdc),
            other => Err(Invalid::new(
                field,
                format!("'{other}' is not one of none, writeback, pdc"),
            )),
        }
    }

    /// The mode as the configuration spells it.
    pub fn name(self) -> &'static str {
        match self {
            Cache::None => "none",
            Cache::Writeback => "writeback",
            Cache::Pdc => "pdc",
        }
    }

    /// Whether the mode needs an `O_DIRECT` descriptor.
    pub fn direct(self) -> bool {
        self != Cache::Writeback
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
/// What serves the tenants' requests.
pub enum BackendKind {
    /// Files or block devices through io_uring.
    File,
    /// Completes every request at once; reads return zeroes (measures the engine).
    Null,
    /// Data in `backend.path`, timing from a simulated device: a request completes
    /// when its I/O is done and the model says the device would have finished it.
    Emulated,
    /// Images of a Ceph cluster through librbd ([`super::rbd`]).
    Rbd,
}

/// Where a tenant's bytes live.
#[derive(Debug, Clone, PartialEq)]
pub enum Storage {
    /// Its own file: byte `x` of the export is byte `x` of the file.
    Own(PathBuf),
    /// Bytes `offset..offset + size` of the shared backend file.
    Region {
        /// Where the export starts in the shared file.
        offset: u64,
    },
    /// An image of a Ceph cluster (rbd backend): byte `x` of the export is byte `x` of
    /// the image.
    Image(super::rbd::ImageRef),
    /// No storage (null backend).
    Nothing,
}

/// `server.max_connections_per_tenant` when not given: an even share of
/// `max_connections` (at least 4, at most all of them), so that no tenant's connections
/// take the places of the others'.
pub fn default_per_tenant(max_connections: u32, tenants: usize) -> u32 {
    max_connections
        .div_ceil(tenants.max(1) as u32)
        .max(4)
        .min(max_connections)
}

/// A Unix-socket client process's connections when `server.max_connections_per_peer`
/// is not given: a quarter of `max_connections`, at least 8 (at most all of them). One
/// process flooding the socket with connections is then closed at accept, which costs
/// the accept loop microseconds, instead of each taking a handshake thread (measured:
/// docs/benchmarks.md, "Hostile clients").
pub fn default_per_local_peer(max_connections: u32) -> u32 {
    (max_connections / 4).max(8).min(max_connections)
}

#[derive(Debug, Clone, PartialEq)]
/// One export, checked.
pub struct TenantConfig {
    /// The tenant's promise (weight, SLO, reservation, limit); its name is the export name.
    pub spec: TenantSpec,
    /// Export size in bytes.
    pub size: u64,
    /// Writes, trims and zeroing are refused.
    pub read_only: bool,
    /// Where its bytes live.
    pub storage: Storage,
    /// Its own image may be created when missing (`create = true`); a missing image
    /// is otherwise an error, not a blank disk served to a guest that expects its data.
    pub create: bool,
    /// Its own image is served at `size` although it holds another (`resize = true`: a
    /// smaller image is grown, of a larger one the first `size` bytes are served);
    /// otherwise a differing size is refused when the image is opened.
    pub resize: bool,
    /// How its requests use the host's page cache (`cache`, default `backend.cache`).
    pub cache: Cache,
    /// A line about the export for clients that ask (`NBD_INFO_DESCRIPTION`).
    pub description: String,
}

/// A loaded, checked configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    /// Unix socket to listen on (mode 0600).
    pub unix: Option<PathBuf>,
    /// TCP address to listen on.
    pub tcp: Option<String>,
    /// Requests on the device at once, over all tenants.
    pub queue_depth: u32,
    /// Engine threads, each with its own io_uring ring, serving the connections between
    /// them (the server's engine).
    pub threads: u32,
    /// Requests a tenant may have waiting in the host (held by the policy) before its
    /// connections stop being read.
    pub queue_limit: u32,
    /// What becomes of a request the policy refuses: held back (`"hold"`, the default:
    /// the client sees slow I/O) or answered with an error (`"error"`).
    pub refuse: Refuse,
    /// The scheduler: `server.policy`, or [`crate::policy::DEFAULT_POLICY`].
    pub policy: PolicyChoice,
    /// Whether `server.policy` named it (the log says when the default was taken).
    pub policy_named: bool,
    /// Seconds between the per-tenant lines on stderr (0: quiet); also the report's interval.
    pub interval_s: f64,
    /// Address of the Prometheus `/metrics` HTTP endpoint, if any.
    pub metrics: Option<String>,
    /// How long a SIGTERM drain waits for the policy to release what it holds.
    pub drain_timeout: Nanos,
    /// A tenant whose oldest request has been with its backend this long keeps at most
    /// an even share of the device queue, and a request gone twice as long gives its
    /// slot back (`None`: off). [`crate::host::stall`].
    pub backend_stall: Option<Nanos>,
    /// A request its backend has not answered in this long is answered `EIO` and the
    /// tenant's backend marked degraded (`None`: never).
    pub backend_timeout: Option<Nanos>,
    /// Request data in the server at once, over all connections: from a request's
    /// arrival until the last byte of its reply is sent. Connections stop being read
    /// while it is reached.
    pub max_inflight_bytes: u64,
    /// How long a client may take over its handshake (each read and write of it).
    pub handshake_timeout: std::time::Duration,
    /// Connections open at once (handshaking and served); more are closed at accept.
    pub max_connections: u32,
    /// Served connections one export may have at once; a client selecting an export at
    /// its limit is refused (`NBD_REP_ERR_POLICY`). Default: an even share of
    /// `max_connections` over the exports, at least 4.
    pub max_connections_per_tenant: u32,
    /// Connections (handshaking and served) one peer may have open at once: a TCP
    /// client's address (its /64 for IPv6), a Unix-socket client's process. `None` (the
    /// default): no limit of its own over TCP, only `max_connections` (many guests
    /// share a hypervisor's address); on the Unix socket [`default_per_local_peer`].
    pub max_connections_per_peer: Option<u32>,
    /// TLS for the exports (`NBD_OPT_STARTTLS`).
    pub tls: Tls,
    /// What serves the requests.
    pub backend: BackendKind,
    /// The rbd backend's cluster, pool and client for tenants that name none.
    pub rbd: Option<RbdDefaults>,
    /// How the file backend uses the page cache (the tenants' default).
    pub cache: Cache,
    /// The journal detector's thresholds, for tenants with `cache = "pdc"`.
    pub pdc: JournalParams,
    /// The shared file and its size when tenants are regions of one.
    pub shared: Option<(PathBuf, Option<u64>)>,
    /// The emulated backend's device model and aging seed.
    pub emulated: Option<(DeviceSpec, u64)>,
    /// The device whose cost model the policy charges by (`backend.cost_device`, else
    /// the emulated device); `None`: the policy's default.
    pub cost_device: Option<DeviceSpec>,
    /// The exports, in order (their index is their [`crate::types::TenantId`]).
    pub tenants: Vec<TenantConfig>,
    /// The tenant the empty export name selects (`server.default_export`; by default
    /// the only tenant when there is one, else none).
    pub default_export: Option<usize>,
    /// The control socket (`server.control`, mode 0600): `ioshare ctl` adds, changes,
    /// drains and removes tenants there while the server runs.
    pub control: Option<PathBuf>,
    /// This server is one front of a shared cluster (`[cluster]`, [`super::front`]):
    /// its exports are the cluster tenants' volumes, limited by what the fronts agree.
    pub cluster: Option<super::front::ClusterConfig>,
    /// Where images may be (`server.image_dirs`, or by default the folders of the
    /// images the configuration file names: [`ImageDirs`]).
    pub image_dirs: ImageDirs,
    /// Files this run of the server writes or keeps besides its configuration (the pid
    /// file, the capture), which no image may be: [`ServerConfig::with_run_files`].
    pub run_files: Vec<(String, PathBuf)>,
}

/// Where images may be. With `server.image_dirs` (`said`), every image must lie in one
/// of its folders (or be one of its entries: a block device may be named itself).
/// Without, the folders of the file images and the block devices the configuration
/// file names are where tenants added later (`ioshare ctl add-tenant`, a reload) may
/// have their images. Either way an image in a system folder (`/etc`, `/usr`, `/boot`,
/// `/proc`, `/sys`, `/bin`, `/sbin`, `/lib*`) is refused unless `server.image_dirs`
/// names a folder that holds it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ImageDirs {
    /// The folders (and devices), canonical where they exist.
    pub dirs: Vec<PathBuf>,
    /// Whether `server.image_dirs` gave them.
    pub said: bool,
}

/// Tenants one server holds at most, those added while running and removed ones
/// included (a removed tenant keeps its id and counters until a restart).
pub const MAX_TENANTS: usize = 1024;

impl ServerConfig {
    /// The policy as the log names it: its label, and when the configuration named
    /// none, that it is the default and how to have none.
    pub fn policy_described(&self) -> String {
        if self.policy_named {
            self.policy.label.clone()
        } else {
            format!(
                "{} (the default; `policy = \"none\"` under [server] for no control)",
                self.policy.label
            )
        }
    }

    /// Connections one Unix-socket client process may have open at once.
    pub fn local_peer_limit(&self) -> u32 {
        self.max_connections_per_peer
            .unwrap_or_else(|| default_per_local_peer(self.max_connections))
    }

    /// What the host prices requests by: the model fitted to the emulated device
    /// (`model`, built from it) when that is the cost device, `backend.cost_device`'s
    /// model otherwise, else the default SSD model
    /// ([`crate::device::cost::CostModel::generic_ssd`]).
    pub fn cost_model(
        &self,
        model: Option<&dyn crate::device::DeviceModel>,
    ) -> crate::device::cost::CostModel {
        match (&self.cost_device, &self.emulated, model) {
            (Some(spec), Some((emulated, _)), Some(model)) if spec == emulated => {
                spec.fitted_cost(model)
            }
            (Some(spec), _, _) => spec.cost_model(),
            (None, _, _) => crate::device::cost::CostModel::generic_ssd(),
        }
    }

    /// Loads and checks a configuration file; relative paths are taken from its folder.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let source = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .map_err(|e| Invalid::whole(format!("cannot read: {e}")).in_file(&source))?;
        let base = path.parent().unwrap_or(Path::new("."));
        Self::parse_from(&text, base, Some(path))
            .map_err(|e| crate::config::located(e, &text, &source))
    }

    /// Parses a configuration whose relative paths are taken from `base`.
    pub fn parse(text: &str, base: &Path) -> Result<Self, Invalid> {
        Self::parse_from(text, base, None)
    }

    /// [`ServerConfig::parse`] of the text of `config_file`, when it came from one (no
    /// image may be that file).
    fn parse_from(text: &str, base: &Path, config_file: Option<&Path>) -> Result<Self, Invalid> {
        let doc: toml::Table = toml::from_str(text).map_err(parse_problem)?;
        count_tenants(&doc)?;
        let file: ConfigFile = crate::config::from_table(doc)?;
        let at = |p: PathBuf| if p.is_absolute() { p } else { base.join(p) };
        let mut file = file;
        let default_name = file.server.default_export.take();
        let policy_given = file.server.policy.is_some();
        let cluster = file
            .cluster
            .take()
            .map(super::front::cluster_section)
            .transpose()?;
        let exports = exports_of(&file.tenant);
        let mut server = server_section(file.server, &at)?;
        let cluster_specs = match &cluster {
            Some(c) => {
                if policy_given && server.policy.name != "limited" {
                    return Err(Invalid::new(
                        "server.policy",
                        "a cluster front's policy is \"limited\" (the limits the fronts agree on); leave it out",
                    ));
                }
                server.policy = PolicyChoice::named("limited");
                Some(super::front::check_exports(c, &exports)?)
            }
            None => None,
        };
        let backend = backend_section(file.backend.unwrap_or_default(), &at)?;
        if file.tenant.is_empty() {
            return Err(Invalid::new(
                "tenant",
                "no [[tenant]]: a server needs at least one export",
            ));
        }
        let mut tenants: Vec<TenantConfig> = Vec::new();
        for (i, t) in file.tenant.into_iter().enumerate() {
            let field = tenant_field(i + 1, &t.name);
            let tenant = tenant_config(t, &tenants, &backend, &at).map_err(|e| e.within(&field))?;
            tenants.push(tenant);
        }
        if let Some(specs) = cluster_specs {
            for (t, spec) in tenants.iter_mut().zip(specs) {
                t.spec = spec;
            }
        }
        let default_export = default_export(default_name, &tenants)?;
        let config = ServerConfig {
            unix: server.unix,
            tcp: server.tcp,
            queue_depth: server.queue_depth,
            threads: server.threads,
            queue_limit: server.queue_limit,
            refuse: server.refuse,
            policy: server.policy,
            policy_named: policy_given,
            interval_s: server.interval_s,
            metrics: server.metrics,
            drain_timeout: server.drain_timeout,
            backend_stall: server.backend_stall,
            backend_timeout: server.backend_timeout,
            max_inflight_bytes: server.max_inflight_bytes,
            handshake_timeout: server.handshake_timeout,
            max_connections: server.max_connections,
            max_connections_per_tenant: server
                .max_connections_per_tenant
                .unwrap_or_else(|| default_per_tenant(server.max_connections, tenants.len())),
            max_connections_per_peer: server.max_connections_per_peer,
            tls: server.tls,
            backend: backend.kind,
            rbd: backend.rbd,
            cache: backend.cache,
            pdc: backend.pdc,
            shared: backend.shared,
            emulated: backend.emulated,
            cost_device: backend.cost_device,
            tenants,
            default_export,
            control: server.control,
            cluster,
            image_dirs: ImageDirs::default(),
            run_files: Vec::new(),
        };
        assert!(config.tenants.len() <= MAX_TENANTS, "counted above");
        let mut config = config;
        config.image_dirs = match server.image_dirs {
            Some(dirs) => ImageDirs::said(&dirs)?,
            None => ImageDirs::of_images(&config),
        };
        check_images(&config, config_file)?;
        Ok(config)
    }

    /// Names files this run writes besides its configuration (`what`, the path: the
    /// pid file, the capture) and checks that no image is one of them.
    pub fn with_run_files(
        &mut self,
        files: Vec<(String, PathBuf)>,
        config_file: Option<&Path>,
    ) -> Result<(), Invalid> {
        self.run_files = files;
        check_images(self, config_file)
    }

    /// A tenant to add while running (`add-tenant`), from the fields a `[[tenant]]`
    /// table has (`table`; relative paths from `base`), checked as the configuration
    /// file's tenants are: against every tenant the server holds (names, regions and
    /// images), the server's own files (`config_file` among them), and
    /// [`MAX_TENANTS`]. It is not added here.
    pub fn tenant_to_add(
        &self,
        table: toml::Table,
        base: &Path,
        config_file: Option<&Path>,
    ) -> Result<TenantConfig, Invalid> {
        if self.cluster.is_some() {
            return Err(Invalid::new(
                "tenant",
                "a cluster front's exports are its configuration's, as every front's list of cluster tenants is: change both and restart",
            ));
        }
        let t: TenantFile = crate::config::from_table(table)?;
        let at = |p: PathBuf| if p.is_absolute() { p } else { base.join(p) };
        let tenant = tenant_config(t, &self.tenants, &self.backend(), &at)?;
        self.check_new_tenant(&tenant, config_file)?;
        Ok(tenant)
    }

    /// Whether `tenant` (checked on its own) may join the tenants held now: a name
    /// none has, a region clear of theirs, an image that is none of theirs nor one of
    /// the server's own files, and room under [`MAX_TENANTS`].
    pub fn check_new_tenant(
        &self,
        tenant: &TenantConfig,
        config_file: Option<&Path>,
    ) -> Result<(), Invalid> {
        if self.tenants.len() >= MAX_TENANTS {
            return Err(Invalid::whole(format!(
                "this server holds {MAX_TENANTS} tenants (removed ones count until a restart), its most"
            )));
        }
        if self.tenants.iter().any(|x| x.spec.name == tenant.spec.name) {
            return Err(Invalid::new("name", "used by another tenant"));
        }
        if let Storage::Region { offset } = tenant.storage {
            check_region(offset, tenant.size, &self.tenants, &self.backend())?;
        }
        let mut with = self.clone();
        with.tenants.push(tenant.clone());
        check_images(&with, config_file)
    }

    /// The `[backend]` it was loaded with.
    fn backend(&self) -> Backend {
        Backend {
            kind: self.backend,
            rbd: self.rbd.clone(),
            cache: self.cache,
            pdc: self.pdc,
            shared: self.shared.clone(),
            emulated: self.emulated.clone(),
            cost_device: self.cost_device.clone(),
        }
    }

    /// The first thing in `new` that a running server cannot take on: everything but
    /// the tenants' weights, SLOs, reservations and limits, tenants added or removed,
    /// and `interval_s`, needs a restart (a tenant, matched by name, keeps its export).
    /// `None` when `new` can be applied by a reload.
    pub fn reload_conflict(&self, new: &ServerConfig) -> Option<String> {
        let server = [
            ("server.unix", self.unix == new.unix),
            ("server.tcp", self.tcp == new.tcp),
            ("server.queue_depth", self.queue_depth == new.queue_depth),
            ("server.threads", self.threads == new.threads),
            (
                "server.image_dirs",
                !self.image_dirs.said && !new.image_dirs.said || self.image_dirs == new.image_dirs,
            ),
            ("server.queue_limit", self.queue_limit == new.queue_limit),
            ("server.refuse", self.refuse == new.refuse),
            ("server.policy", self.policy == new.policy),
            ("server.metrics", self.metrics == new.metrics),
            (
                "server.drain_timeout_s",
                self.drain_timeout == new.drain_timeout,
            ),
            (
                "server.backend_stall_ms",
                self.backend_stall == new.backend_stall,
            ),
            (
                "server.backend_timeout_s",
                self.backend_timeout == new.backend_timeout,
            ),
            (
                "server.max_inflight_bytes",
                self.max_inflight_bytes == new.max_inflight_bytes,
            ),
            (
                "server.handshake_timeout_s",
                self.handshake_timeout == new.handshake_timeout,
            ),
            (
                "server.max_connections",
                self.max_connections == new.max_connections,
            ),
            (
                "server.max_connections_per_tenant",
                // Its default follows the number of exports, which is reported as such.
                self.tenants.len() != new.tenants.len()
                    || self.max_connections_per_tenant == new.max_connections_per_tenant,
            ),
            (
                "server.max_connections_per_peer",
                self.max_connections_per_peer == new.max_connections_per_peer,
            ),
            ("server.tls*", self.tls == new.tls),
            ("server.control", self.control == new.control),
            (
                "server.default_export",
                // Its default follows the number of exports, which is reported as such.
                self.tenants.len() != new.tenants.len()
                    || self.default_export == new.default_export,
            ),
            ("backend.kind", self.backend == new.backend),
            ("backend.cache", self.cache == new.cache),
            ("backend.pdc", self.pdc == new.pdc),
            ("backend.path/size", self.shared == new.shared),
            ("backend.device", self.emulated == new.emulated),
            ("backend.cost_device", self.cost_device == new.cost_device),
            ("backend.conf/pool/client_id", self.rbd == new.rbd),
            ("cluster", self.cluster == new.cluster),
        ];
        if let Some((field, _)) = server.iter().find(|(_, same)| !same) {
            return Some(field.to_string());
        }
        // Tenants are matched by name: one added or removed is the control socket's
        // to apply; one in both must keep its export.
        for (i, a) in self.tenants.iter().enumerate() {
            let Some(b) = new.tenants.iter().find(|b| b.spec.name == a.spec.name) else {
                continue;
            };
            let fields = [
                ("size", a.size == b.size),
                ("read_only", a.read_only == b.read_only),
                ("file/offset", a.storage == b.storage),
                ("cache", a.cache == b.cache),
                ("description", a.description == b.description),
            ];
            if let Some((field, _)) = fields.iter().find(|(_, same)| !same) {
                return Some(format!("tenant {} ('{}'): {field}", i + 1, a.spec.name));
            }
        }
        None
    }

    /// The tenants' promises, in order.
    pub fn specs(&self) -> Vec<TenantSpec> {
        self.tenants.iter().map(|t| t.spec.clone()).collect()
    }
}

/// `[server]`, checked.
struct Server {
    unix: Option<PathBuf>,
    tcp: Option<String>,
    queue_depth: u32,
    threads: u32,
    queue_limit: u32,
    refuse: Refuse,
    policy: PolicyChoice,
    interval_s: f64,
    metrics: Option<String>,
    drain_timeout: Nanos,
    backend_stall: Option<Nanos>,
    backend_timeout: Option<Nanos>,
    max_inflight_bytes: u64,
    handshake_timeout: std::time::Duration,
    max_connections: u32,
    max_connections_per_tenant: Option<u32>,
    max_connections_per_peer: Option<u32>,
    tls: Tls,
    control: Option<PathBuf>,
    image_dirs: Option<Vec<PathBuf>>,
}

/// Whether clients may or must use TLS (`server.tls`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsMode {
    /// No TLS: `NBD_OPT_STARTTLS` is refused (`"off"`).
    Off,
    /// Offered: a client may start TLS or go on in the clear (`"optional"`, also
    /// written `"on"`).
    On,
    /// Required of TCP clients: nothing is served to one until it starts TLS
    /// (`"require"`). Clients on the Unix socket (mode 0600, local) may still use it.
    Require,
}

/// `server.tls` and its credentials, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tls {
    /// Whether TLS is off, offered or required.
    pub mode: TlsMode,
    /// The server's certificate chain (PEM), leaf first.
    pub cert: Option<PathBuf>,
    /// The server's private key (PEM: PKCS #8, PKCS #1 or SEC1).
    pub key: Option<PathBuf>,
    /// CA certificates (PEM) a client must present a certificate signed by; `None`:
    /// clients are not asked for one.
    pub client_ca: Option<PathBuf>,
    /// Pre-shared keys instead of certificates: a file of `identity:hexkey` lines, as
    /// qemu's `tls-creds-psk` and nbdkit's `--tls-psk` read.
    pub psk: Option<PathBuf>,
}

/// Whether a `server.tcp` address is on this machine only (the loopback range or
/// `localhost`); anything else, a name included, may be reached from the network.
pub fn is_loopback_address(address: &str) -> bool {
    if let Ok(a) = address.parse::<std::net::SocketAddr>() {
        return a.ip().is_loopback();
    }
    address
        .rsplit_once(':')
        .is_some_and(|(host, _)| host.eq_ignore_ascii_case("localhost"))
}

fn tls_section(s: &ServerFile, at: &impl Fn(PathBuf) -> PathBuf) -> Result<Tls, Invalid> {
    let field = |name: &str, problem: String| Invalid::new(format!("server.{name}"), problem);
    let network = s.tcp.as_deref().filter(|a| !is_loopback_address(a));
    let has_cert = s.tls_cert.is_some() || s.tls_key.is_some() || s.tls_psk.is_some();
    let mode = match s.tls.as_deref() {
        Some("off") => TlsMode::Off,
        Some("optional" | "on") => TlsMode::On,
        Some("require") => TlsMode::Require,
        Some(other) => {
            return Err(field(
                "tls",
                format!(
                    "must be \"off\", \"optional\" (also written \"on\") or \"require\", got \"{other}\""
                ),
            ));
        }
        // Tenants' data does not cross a network in the clear unless asked for.
        None if network.is_some() => TlsMode::Require,
        // Keys that say who may connect are kept by every TCP client, loopback ones
        // too: offered only, any local process would read the exports without them.
        None if s.tls_psk.is_some() || s.tls_client_ca.is_some() => TlsMode::Require,
        None if has_cert => TlsMode::On,
        None => TlsMode::Off,
    };
    let (cert, key) = (s.tls_cert.clone().map(at), s.tls_key.clone().map(at));
    let client_ca = s.tls_client_ca.clone().map(at);
    let psk = s.tls_psk.clone().map(at);
    if psk.is_some()
        && let Some(name) = [
            ("tls_cert", cert.is_some()),
            ("tls_key", key.is_some()),
            ("tls_client_ca", client_ca.is_some()),
        ]
        .iter()
        .find_map(|(n, set)| set.then_some(*n))
    {
        return Err(field(
                name,
                "give either certificates (tls_cert, tls_key, tls_client_ca) or pre-shared keys (tls_psk), not both".into(),
            ));
    }
    plaintext_said(s, mode, psk.is_some(), client_ca.is_some())?;
    if mode == TlsMode::Off {
        if let Some(name) = [
            ("tls_cert", cert.is_some()),
            ("tls_key", key.is_some()),
            ("tls_client_ca", client_ca.is_some()),
            ("tls_psk", psk.is_some()),
        ]
        .iter()
        .find_map(|(n, set)| set.then_some(*n))
        {
            return Err(field(name, "is set but server.tls = \"off\"".into()));
        }
    } else if psk.is_none() && (cert.is_none() || key.is_none()) {
        let why = match (s.tls.is_none(), network) {
            (true, Some(address)) => format!(
                "server.tcp = \"{address}\" is not a loopback address, so TLS is required by \
                 default: set server.tls_cert and server.tls_key (PEM) or server.tls_psk, or server.tls = \"off\" \
                 to serve the tenants' data unencrypted to the network"
            ),
            _ => {
                "TLS needs server.tls_cert and server.tls_key (PEM files), or server.tls_psk".into()
            }
        };
        let missing = if cert.is_none() {
            "tls_cert"
        } else {
            "tls_key"
        };
        return Err(field(missing, why));
    }
    Ok(Tls {
        mode,
        cert,
        key,
        client_ca,
        psk,
    })
}

/// `tls = "optional"` beside keys or a CA serves clear clients the keys do not
/// authenticate: refused unless `allow_plaintext = true` says it is meant; that setting
/// anywhere else is an error.
fn plaintext_said(
    s: &ServerFile,
    mode: TlsMode,
    psk: bool,
    client_ca: bool,
) -> Result<(), Invalid> {
    let field = |name: &str, problem: String| Invalid::new(format!("server.{name}"), problem);
    if mode == TlsMode::On
        && let Some(name) = [("tls_psk", psk), ("tls_client_ca", client_ca)]
            .iter()
            .find_map(|(n, set)| set.then_some(*n))
        && s.allow_plaintext != Some(true)
    {
        return Err(field(
            "tls",
            format!(
                "\"optional\" serves a client that skips TLS in plain text, so server.{name} \
                 would authenticate nobody: use \"require\" (the default with {name}), or set \
                 server.allow_plaintext = true to say that clear clients are meant to be served"
            ),
        ));
    }
    if s.allow_plaintext.is_some() && mode != TlsMode::On {
        return Err(field(
            "allow_plaintext",
            "applies only where server.tls = \"optional\" (clear clients beside TLS ones)".into(),
        ));
    }
    Ok(())
}

/// Each `[[tenant]]`'s name, and whether it gives a promise of its own (a cluster
/// front's exports must not).
fn exports_of(tenants: &[TenantFile]) -> Vec<(String, bool)> {
    tenants
        .iter()
        .map(|t| {
            let own = t.weight.is_some()
                || t.slo.is_some()
                || t.reservation_iops.is_some()
                || t.limit_iops.is_some();
            (t.name.clone(), own)
        })
        .collect()
}

/// `server.threads`, checked; the default when not given.
fn threads_of(given: Option<u32>) -> Result<u32, Invalid> {
    let threads = given.unwrap_or_else(default_threads);
    if !(1..=MAX_THREADS).contains(&threads) {
        return Err(Invalid::new(
            "server.threads",
            format!("must be 1 ..= {MAX_THREADS}, got {threads}"),
        ));
    }
    Ok(threads)
}

/// The most engine threads `server.threads` may ask for.
pub const MAX_THREADS: u32 = 64;
/// Engine threads by default: one a core, at most this many.
pub const DEFAULT_THREADS_CAP: u32 = 8;

/// `server.threads` by default: the cores this process may run on, at most
/// [`DEFAULT_THREADS_CAP`].
pub fn default_threads() -> u32 {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get() as u32)
        .min(DEFAULT_THREADS_CAP)
}

/// `server.max_inflight_bytes` by default.
pub const DEFAULT_MAX_INFLIGHT_BYTES: u64 = 512 << 20;

/// `server.policy`, or the default; a name no policy has is said here, where the error
/// can name the line.
fn policy_of(entry: Option<PolicyEntry>) -> Result<PolicyChoice, Invalid> {
    let Some(p) = entry else {
        return Ok(PolicyChoice::named(crate::policy::DEFAULT_POLICY));
    };
    let choice = p.choice().map_err(|e| e.within("server.policy"))?;
    if !crate::policy::is_registered(&choice.name) {
        return Err(Invalid::new(
            "server.policy",
            crate::policy::PolicyError::unknown(&choice.name).to_string(),
        ));
    }
    Ok(choice)
}

fn server_section(s: ServerFile, at: &impl Fn(PathBuf) -> PathBuf) -> Result<Server, Invalid> {
    let field = |name: &str, problem: String| Invalid::new(format!("server.{name}"), problem);
    let tls = tls_section(&s, at)?;
    let queue_depth = s.queue_depth.unwrap_or(32);
    if !(1..=4096).contains(&queue_depth) {
        return Err(field(
            "queue_depth",
            format!("must be 1 ..= 4096, got {queue_depth}"),
        ));
    }
    let threads = threads_of(s.threads)?;
    let queue_limit = s.queue_limit.unwrap_or(256);
    if queue_limit == 0 {
        return Err(field("queue_limit", "must be > 0".into()));
    }
    let refuse = Refuse::parse(s.refuse.as_deref().unwrap_or("hold"))
        .map_err(|e| field("refuse", e.to_string()))?;
    let interval_s = s.interval_s.unwrap_or(1.0);
    if !(interval_s >= 0.0 && interval_s.is_finite()) {
        return Err(field(
            "interval_s",
            format!("must be >= 0 (0: quiet), got {interval_s}"),
        ));
    }
    let max_inflight_bytes = s
        .max_inflight_bytes
        .map_or(DEFAULT_MAX_INFLIGHT_BYTES, |b| b.0);
    let least = 2 * u64::from(crate::nbd::proto::MAX_PAYLOAD);
    if max_inflight_bytes < least {
        return Err(field(
            "max_inflight_bytes",
            format!(
                "must be at least {} (two requests of the largest size a client may send), got {}",
                format_bytes(least),
                format_bytes(max_inflight_bytes)
            ),
        ));
    }
    let max_connections = s.max_connections.unwrap_or(256);
    if !(1..=1_000_000).contains(&max_connections) {
        return Err(field(
            "max_connections",
            format!("must be 1 ..= 1000000, got {max_connections}"),
        ));
    }
    for (name, value) in [
        ("max_connections_per_tenant", s.max_connections_per_tenant),
        ("max_connections_per_peer", s.max_connections_per_peer),
    ] {
        if let Some(v) = value
            && !(1..=max_connections).contains(&v)
        {
            return Err(field(
                name,
                format!("must be 1 ..= server.max_connections ({max_connections}), got {v}"),
            ));
        }
    }
    let handshake_timeout_s = s.handshake_timeout_s.unwrap_or(10.0);
    if !(handshake_timeout_s > 0.0 && handshake_timeout_s <= 3600.0) {
        return Err(field(
            "handshake_timeout_s",
            format!("must be in (0, 3600] seconds, got {handshake_timeout_s}"),
        ));
    }
    let (drain_timeout, backend_stall, backend_timeout) = waits(&s)?;
    let policy = policy_of(s.policy)?;
    let unix = match (s.unix, &s.tcp) {
        (Some(u), _) => Some(at(u)),
        (None, Some(_)) => None,
        (None, None) => Some(at(PathBuf::from("ioshare.sock"))),
    };
    Ok(Server {
        unix,
        tcp: s.tcp,
        queue_depth,
        threads,
        queue_limit,
        refuse,
        policy,
        interval_s,
        metrics: s.metrics,
        drain_timeout,
        backend_stall,
        backend_timeout,
        max_inflight_bytes,
        handshake_timeout: std::time::Duration::from_secs_f64(handshake_timeout_s),
        max_connections,
        max_connections_per_tenant: s.max_connections_per_tenant,
        max_connections_per_peer: s.max_connections_per_peer,
        tls,
        control: s.control.map(at),
        image_dirs: s.image_dirs.map(|dirs| dirs.into_iter().map(at).collect()),
    })
}

/// `server.drain_timeout_s` (default 30), `server.backend_stall_ms` (default 500) and
/// `server.backend_timeout_s` (default 30), checked; 0 turns either of the last two off.
type Waits = (Nanos, Option<Nanos>, Option<Nanos>);

fn waits(s: &ServerFile) -> Result<Waits, Invalid> {
    let field = |name: &str, problem: String| Invalid::new(format!("server.{name}"), problem);
    let drain_timeout_s = s.drain_timeout_s.unwrap_or(30.0);
    if !(0.0..=86_400.0).contains(&drain_timeout_s) {
        return Err(field(
            "drain_timeout_s",
            format!("must be 0 ..= 86400 seconds, got {drain_timeout_s}"),
        ));
    }
    let backend_stall_ms = s.backend_stall_ms.unwrap_or(500.0);
    if !(0.0..=3_600_000.0).contains(&backend_stall_ms) {
        return Err(field(
            "backend_stall_ms",
            format!("must be 0 (off) ..= 3600000 milliseconds, got {backend_stall_ms}"),
        ));
    }
    let backend_timeout_s = s.backend_timeout_s.unwrap_or(30.0);
    if !(0.0..=86_400.0).contains(&backend_timeout_s) {
        return Err(field(
            "backend_timeout_s",
            format!("must be 0 (never) ..= 86400 seconds, got {backend_timeout_s}"),
        ));
    }
    Ok((
        secs_to_nanos(drain_timeout_s),
        (backend_stall_ms > 0.0).then(|| secs_to_nanos(backend_stall_ms / 1000.0)),
        (backend_timeout_s > 0.0).then(|| secs_to_nanos(backend_timeout_s)),
    ))
}

/// The rbd backend's defaults for its tenants' images.
#[derive(Debug, Clone, PartialEq)]
pub struct RbdDefaults {
    /// The cluster's configuration file.
    pub conf: PathBuf,
    /// The pool.
    pub pool: String,
    /// The client id.
    pub client_id: String,
}

/// `[backend]`, checked.
struct Backend {
    kind: BackendKind,
    rbd: Option<RbdDefaults>,
    cache: Cache,
    pdc: JournalParams,
    shared: Option<(PathBuf, Option<u64>)>,
    emulated: Option<(DeviceSpec, u64)>,
    cost_device: Option<DeviceSpec>,
}

fn backend_section(b: BackendFile, at: &impl Fn(PathBuf) -> PathBuf) -> Result<Backend, Invalid> {
    let kind = match b.kind.as_deref().unwrap_or("file") {
        "file" => BackendKind::File,
        "null" => BackendKind::Null,
        "emulated" => BackendKind::Emulated,
        "rbd" => BackendKind::Rbd,
        other => {
            return Err(Invalid::new(
                "backend.kind",
                format!("'{other}' is not one of file, null, emulated, rbd"),
            ));
        }
    };
    let rbd = match (kind, b.conf) {
        (BackendKind::Rbd, conf) => {
            let conf = conf.map(&at).ok_or_else(|| {
                Invalid::new(
                    "backend.conf",
                    "the rbd backend needs the cluster's ceph.conf (e.g. conf = \"/etc/ceph/ceph.conf\")",
                )
            })?;
            if b.path.is_some() {
                return Err(Invalid::new(
                    "backend.path",
                    "the rbd backend has no shared file: each tenant names its image",
                ));
            }
            Some(RbdDefaults {
                conf,
                pool: b.pool.unwrap_or_else(|| "rbd".into()),
                client_id: b.client_id.unwrap_or_else(|| "admin".into()),
            })
        }
        (_, Some(_)) => {
            return Err(Invalid::new(
                "backend.conf",
                "only the rbd backend has a cluster",
            ));
        }
        (_, None) => {
            if b.pool.is_some() || b.client_id.is_some() {
                return Err(Invalid::new(
                    "backend.pool/client_id",
                    "only the rbd backend has pools and clients",
                ));
            }
            None
        }
    };
    let emulated = match (kind, b.device) {
        (BackendKind::Emulated, Some(d)) => {
            let spec = d.spec().map_err(|e| e.within("backend.device"))?;
            Some((spec, b.seed.unwrap_or(1)))
        }
        (BackendKind::Emulated, None) => {
            return Err(Invalid::new(
                "backend.device",
                "the emulated backend needs a device model, e.g. { model = \"ssd\", preset = \"nvme-p4500\", precondition = \"aged\", capacity_gib = 16 }",
            ));
        }
        (_, Some(_)) => {
            return Err(Invalid::new(
                "backend.device",
                "only the emulated backend has a device model",
            ));
        }
        (_, None) => None,
    };
    if kind == BackendKind::Emulated && b.path.is_none() {
        return Err(Invalid::new(
            "backend.path",
            "the emulated backend keeps the tenants' data in one file; name it",
        ));
    }
    let cache = Cache::parse("backend.cache", b.cache.as_deref().unwrap_or("writeback"))?;
    let pdc = pdc_params(b.pdc.unwrap_or_default())?;
    let shared = b.path.map(|p| (at(p), b.size.map(|s| s.0)));
    if kind == BackendKind::Null && shared.is_some() {
        return Err(Invalid::new("backend.path", "the null backend has no file"));
    }
    let cost_device = match b.cost_device {
        Some(p) => Some(DeviceSpec::of_file(&at(p), "backend.cost_device")?),
        None => emulated.as_ref().map(|(d, _)| d.clone()),
    };
    if kind == BackendKind::Rbd && cache == Cache::Pdc {
        return Err(Invalid::new(
            "backend.cache",
            "pdc keeps journal writes out of the host's page cache; rbd images have none",
        ));
    }
    Ok(Backend {
        kind,
        rbd,
        cache,
        pdc,
        shared,
        emulated,
        cost_device,
    })
}

/// One `[[tenant]]`, checked against the backend and the tenants before it; errors name
/// fields of the tenant's table.
/// The longest description a tenant may have (the NBD protocol's strings are at most
/// 4 KiB).
const MAX_DESCRIPTION: usize = 4096;

/// `server.default_export`: a tenant's name, or `false` for none; absent, the only
/// tenant when there is one.
fn default_export(
    value: Option<toml::Value>,
    tenants: &[TenantConfig],
) -> Result<Option<usize>, Invalid> {
    let field = "server.default_export";
    match value {
        None => Ok((tenants.len() == 1).then_some(0)),
        Some(toml::Value::Boolean(false)) => Ok(None),
        Some(toml::Value::String(name)) => tenants
            .iter()
            .position(|t| t.spec.name == name)
            .map(Some)
            .ok_or_else(|| {
                let names: Vec<&str> = tenants.iter().map(|t| t.spec.name.as_str()).collect();
                Invalid::new(
                    field,
                    format!(
                        "'{name}' is no tenant's name (tenants: {})",
                        names.join(", ")
                    ),
                )
            }),
        Some(other) => Err(Invalid::new(
            field,
            format!("{other} is neither a tenant's name nor false (no default export)"),
        )),
    }
}

fn tenant_config(
    t: TenantFile,
    before: &[TenantConfig],
    backend: &Backend,
    at: &impl Fn(PathBuf) -> PathBuf,
) -> Result<TenantConfig, Invalid> {
    if t.name.is_empty() || t.name.len() > 4096 {
        return Err(Invalid::new(
            "name",
            "the export name must be 1 to 4096 bytes",
        ));
    }
    if before.iter().any(|x| x.spec.name == t.name) {
        return Err(Invalid::new("name", "used twice"));
    }
    let spec = QosFields {
        weight: t.weight,
        slo: t.slo,
        reservation_iops: t.reservation_iops,
        limit_iops: t.limit_iops,
    }
    .spec(&t.name)?;
    if t.create && t.image.is_some() && t.size.is_none() {
        return Err(Invalid::new("size", "an image to create needs its size"));
    }
    let (storage, size) = storage(&t, backend, at)?;
    if size == 0 {
        return Err(Invalid::new("size", "is 0"));
    }
    if let Storage::Region { offset } = storage {
        check_region(offset, size, before, backend)?;
    }
    if t.create && t.file.is_none() && t.image.is_none() {
        return Err(Invalid::new(
            "create",
            "applies only to a tenant's own file or image",
        ));
    }
    if t.resize && t.file.is_none() {
        return Err(Invalid::new(
            "resize",
            "applies only to a tenant's own file",
        ));
    }
    let cache = match &t.cache {
        Some(c) => Cache::parse("cache", c)?,
        None => backend.cache,
    };
    let groups = size.div_ceil(backend.pdc.group_bytes);
    if cache == Cache::Pdc && groups > crate::journal::MAX_GROUPS {
        return Err(Invalid::new(
            "cache",
            format!(
                "pdc would follow {groups} groups of {} (at most {}); make backend.pdc.group larger",
                format_bytes(backend.pdc.group_bytes),
                crate::journal::MAX_GROUPS
            ),
        ));
    }
    let description = t.description.unwrap_or_default();
    if description.len() > MAX_DESCRIPTION || description.contains(['\n', '\r']) {
        return Err(Invalid::new(
            "description",
            format!("one line of at most {MAX_DESCRIPTION} bytes"),
        ));
    }
    Ok(TenantConfig {
        spec,
        size,
        read_only: t.read_only,
        storage,
        create: t.create,
        resize: t.resize,
        cache,
        description,
    })
}

/// `[backend.pdc]`, checked: the journal detector's thresholds (defaults: the paper's
/// group and the readings in [`crate::journal`]).
fn pdc_params(p: PdcFile) -> Result<JournalParams, Invalid> {
    let d = JournalParams::default();
    let params = JournalParams {
        group_bytes: p.group.map_or(d.group_bytes, |b| b.0),
        min_run_bytes: p.min_run.map_or(d.min_run_bytes, |b| b.0),
        confirm_bytes: p.confirm.map_or(d.confirm_bytes, |b| b.0),
        wrap_tolerance_bytes: p.wrap_tolerance.map_or(d.wrap_tolerance_bytes, |b| b.0),
        gap_bytes: p.gap.map_or(d.gap_bytes, |b| b.0),
    };
    params
        .check()
        .map_err(|e| Invalid::new(format!("backend.pdc.{}", e.field), e.problem))?;
    Ok(params)
}

/// What an image holds: a file's length, a block device's size (its sectors in sysfs,
/// which a device's metadata does not give: its length there is 0).
fn image_size(path: &Path) -> std::io::Result<u64> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let meta = std::fs::metadata(path)?;
    if !meta.file_type().is_block_device() {
        return Ok(meta.len());
    }
    let rdev = meta.rdev();
    let sectors = std::fs::read_to_string(format!(
        "/sys/dev/block/{}:{}/size",
        libc::major(rdev),
        libc::minor(rdev)
    ))?;
    let sectors: u64 = sectors
        .trim()
        .parse()
        .map_err(|_| std::io::Error::other(format!("sysfs size '{}'", sectors.trim())))?;
    sectors
        .checked_mul(512)
        .ok_or_else(|| std::io::Error::other("a size past 2^64 bytes"))
}

/// How long looking up an rbd image's size (a tenant without `size`) may take, s.
const IMAGE_SIZE_TIMEOUT_S: u64 = 30;

/// Where a tenant's bytes live, and how many there are.
fn storage(
    t: &TenantFile,
    backend: &Backend,
    at: &impl Fn(PathBuf) -> PathBuf,
) -> Result<(Storage, u64), Invalid> {
    let size = t.size.map(|s| s.0);
    if backend.kind != BackendKind::Rbd
        && (t.image.is_some() || t.pool.is_some() || t.client_id.is_some())
    {
        return Err(Invalid::new(
            "image/pool/client_id",
            "only tenants of the rbd backend have images",
        ));
    }
    if let Some(rbd) = &backend.rbd {
        if t.file.is_some() || t.offset.is_some() {
            return Err(Invalid::new(
                "file/offset",
                "the rbd backend serves images: give image = \"name\" (in backend.pool or the tenant's pool)",
            ));
        }
        let image = t
            .image
            .clone()
            .ok_or_else(|| Invalid::new("image", "needed with the rbd backend"))?;
        let at = super::rbd::ImageRef {
            conf: rbd.conf.clone(),
            client_id: t.client_id.clone().unwrap_or_else(|| rbd.client_id.clone()),
            pool: t.pool.clone().unwrap_or_else(|| rbd.pool.clone()),
            image,
        };
        let size = match size {
            Some(s) => s,
            None => super::rbd::image_size(&at, IMAGE_SIZE_TIMEOUT_S).map_err(|e| {
                Invalid::new("size", format!("not given and {at} cannot be read ({e})"))
            })?,
        };
        return Ok((Storage::Image(at), size));
    }
    match (backend.kind, &t.file, t.offset) {
        (BackendKind::Null, None, None) => Ok((
            Storage::Nothing,
            size.ok_or_else(|| Invalid::new("size", "needed with the null backend"))?,
        )),
        (BackendKind::Null, _, _) => Err(Invalid::new(
            "file/offset",
            "the null backend stores nothing",
        )),
        (BackendKind::Emulated, Some(_), _) => Err(Invalid::new(
            "file",
            "the emulated backend keeps every tenant in backend.path; give an offset (the tenant's place on the emulated device)",
        )),
        (BackendKind::Emulated, None, None) => Err(Invalid::new(
            "offset",
            "needed with the emulated backend (the tenant's place on the emulated device)",
        )),
        (BackendKind::File, Some(_), Some(_)) => Err(Invalid::new(
            "file/offset",
            "give either file (its own image) or offset (a region of backend.path), not both",
        )),
        (BackendKind::File, Some(f), None) => {
            let path = at(f.clone());
            // A size that differs from an existing image's is refused when the image
            // is opened (`BackendError::SizeDiffers`), unless the tenant says resize.
            let size = match size {
                Some(s) => s,
                None => image_size(&path).map_err(|e| {
                    Invalid::new(
                        "size",
                        format!("not given and {} cannot be read ({e})", path.display()),
                    )
                })?,
            };
            Ok((Storage::Own(path), size))
        }
        (BackendKind::File | BackendKind::Emulated, None, Some(offset)) => {
            if backend.shared.is_none() {
                return Err(Invalid::new(
                    "offset",
                    "a region needs backend.path (the shared file)",
                ));
            }
            let size = size.ok_or_else(|| Invalid::new("size", "a region needs its size"))?;
            Ok((Storage::Region { offset: offset.0 }, size))
        }
        (BackendKind::File, None, None) => Err(Invalid::new(
            "file/offset",
            "needs file = \"image\" or offset (with backend.path)",
        )),
        (BackendKind::Rbd, _, _) => unreachable!("rbd tenants are placed above"),
    }
}

/// The tenants are counted before any work per tenant: a file of 100,000 tenants is
/// refused at once, not after checking each against every other.
fn count_tenants(doc: &toml::Table) -> Result<(), Invalid> {
    match doc.get("tenant") {
        Some(toml::Value::Array(tenants)) if tenants.len() > MAX_TENANTS => Err(Invalid::new(
            "tenant",
            format!(
                "{} [[tenant]]s; a server holds at most {MAX_TENANTS}",
                tenants.len()
            ),
        )),
        _ => Ok(()),
    }
}

/// Folders no image is taken from unless `server.image_dirs` names a folder that
/// holds it: the system's own files.
const SYSTEM_DIRS: [&str; 11] = [
    "/etc", "/boot", "/proc", "/sys", "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64",
    "/libx32",
];

/// Where `path` is: its canonical path, or (not there yet) its folder's and its name.
fn place_of(path: &Path) -> PathBuf {
    if let Ok(p) = path.canonicalize() {
        return p;
    }
    let name = path.file_name().map(PathBuf::from).unwrap_or_default();
    let folder = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    folder
        .canonicalize()
        .unwrap_or_else(|_| folder.to_path_buf())
        .join(name)
}

impl ImageDirs {
    /// `server.image_dirs`: each must exist.
    fn said(dirs: &[PathBuf]) -> Result<ImageDirs, Invalid> {
        let mut out = Vec::with_capacity(dirs.len());
        for d in dirs {
            let c = d
                .canonicalize()
                .map_err(|e| Invalid::new("server.image_dirs", format!("{}: {e}", d.display())))?;
            out.push(c);
        }
        Ok(ImageDirs {
            dirs: out,
            said: true,
        })
    }

    /// The folders of the file images and the block devices `config` names.
    fn of_images(config: &ServerConfig) -> ImageDirs {
        use std::os::unix::fs::FileTypeExt;
        let mut dirs: Vec<PathBuf> = Vec::new();
        let images = config
            .tenants
            .iter()
            .filter_map(|t| match &t.storage {
                Storage::Own(p) => Some(p),
                _ => None,
            })
            .chain(config.shared.iter().map(|(p, _)| p));
        for image in images {
            let place = place_of(image);
            let device = std::fs::metadata(&place).is_ok_and(|m| m.file_type().is_block_device());
            let dir = match place.parent() {
                Some(folder) if !device => folder.to_path_buf(),
                _ => place,
            };
            if !dirs.contains(&dir) {
                dirs.push(dir);
            }
        }
        ImageDirs { dirs, said: false }
    }

    /// Why `image` may not be served from where it is, if it may not.
    fn refuses(&self, image: &Path) -> Option<String> {
        let place = place_of(image);
        let said_holds = self.said && self.dirs.iter().any(|d| place.starts_with(d));
        if let Some(system) = SYSTEM_DIRS.iter().find(|d| place.starts_with(d))
            && !said_holds
        {
            return Some(format!(
                "{} is in {system}, a system folder: an image there is refused unless server.image_dirs names a folder that holds it",
                place.display()
            ));
        }
        if self.dirs.iter().any(|d| place.starts_with(d)) {
            return None;
        }
        let list = self
            .dirs
            .iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(", ");
        Some(if self.said {
            format!(
                "{} is outside server.image_dirs ({list}): add its folder there to serve it",
                place.display()
            )
        } else {
            format!(
                "{} is outside the folders of the configuration's images ({list}): list its folder in server.image_dirs to serve it",
                place.display()
            )
        })
    }
}

/// Every image holds bytes of its own, under any name (a hard link, a `mknod` alias, a
/// loop device over it at any depth, a partition or volume of it:
/// [`super::identity`]): a tenant's image is no other tenant's and not the shared
/// backend file or device (two exports on the same bytes would overwrite each other),
/// no image is one of the server's own files — its configuration (`config_file`), TLS
/// certificate, key, client CA or pre-shared keys (a tenant would read them through its
/// disk, or overwrite them), its sockets, the files this run writes (pid file,
/// capture: [`ServerConfig::run_files`]) or an image's marker — and every image lies
/// where [`ImageDirs`] allows. An image whose stack cannot be followed is refused.
/// Each path's identity is looked up once.
fn check_images(config: &ServerConfig, config_file: Option<&Path>) -> Result<(), Invalid> {
    let tls = &config.tls;
    let identity = |field: &str, p: &Path| {
        Identity::of(p).map_err(|e| Invalid::new(field, format!("{}: {e}", p.display())))
    };
    let mut server_files: Vec<(String, &Path, Identity)> = Vec::new();
    for (what, p) in [
        ("the configuration file", config_file),
        ("server.tls_cert", tls.cert.as_deref()),
        ("server.tls_key", tls.key.as_deref()),
        ("server.tls_client_ca", tls.client_ca.as_deref()),
        ("server.tls_psk", tls.psk.as_deref()),
        ("server.unix", config.unix.as_deref()),
        ("server.control", config.control.as_deref()),
    ]
    .into_iter()
    .filter_map(|(what, p)| Some((what.to_string(), p?)))
    .chain(
        config
            .run_files
            .iter()
            .map(|(w, p)| (w.clone(), p.as_path())),
    ) {
        server_files.push((what.clone(), p, identity(&what, p)?));
    }
    let not_a_server_file = |field: &str, image: &Path, id: &Identity| {
        if let Some(name) = image.file_name().and_then(|n| n.to_str())
            && name.starts_with('.')
            && name.ends_with(".ioshare")
        {
            return Err(Invalid::new(
                field,
                format!(
                    "{} is named as the marker the server keeps beside an image: not an image",
                    image.display()
                ),
            ));
        }
        if let Some(why) = config.image_dirs.refuses(image) {
            return Err(Invalid::new(field, why));
        }
        match server_files.iter().find(|(_, _, f)| f.overlaps(id)) {
            Some((what, p, _)) => Err(Invalid::new(
                field,
                format!(
                    "{} is {what} ({}): an image must not be one of the server's own files",
                    image.display(),
                    p.display()
                ),
            )),
            None => Ok(()),
        }
    };
    let shared = match &config.shared {
        Some((p, _)) => Some((p, identity("backend.path", p)?)),
        None => None,
    };
    let mut before: Vec<(&str, &Path, Identity)> = Vec::new();
    for (i, t) in config.tenants.iter().enumerate() {
        let Storage::Own(path) = &t.storage else {
            continue;
        };
        let field = tenant_field(i + 1, &t.spec.name) + ".file";
        let id = identity(&field, path)?;
        if let Some((shared, shared_id)) = &shared
            && shared_id.overlaps(&id)
        {
            return Err(Invalid::new(
                field,
                format!(
                    "{} holds the same bytes as backend.path ({}), which other tenants' regions live in",
                    path.display(),
                    shared.display()
                ),
            ));
        }
        if let Some((name, p, _)) = before.iter().find(|(_, _, other)| other.overlaps(&id)) {
            return Err(Invalid::new(
                field,
                format!(
                    "{} holds the same bytes as tenant '{name}''s image ({})",
                    path.display(),
                    p.display()
                ),
            ));
        }
        not_a_server_file(&field, path, &id)?;
        before.push((&t.spec.name, path, id));
    }
    if let Some((p, id)) = &shared {
        not_a_server_file("backend.path", p, id)?;
    }
    Ok(())
}

/// A region of the shared file: aligned, inside the emulated device, and clear of every
/// other tenant's region.
fn check_region(
    offset: u64,
    size: u64,
    before: &[TenantConfig],
    backend: &Backend,
) -> Result<(), Invalid> {
    let region = || format!("region {}+{}", format_bytes(offset), format_bytes(size));
    if !offset.is_multiple_of(4096) || !size.is_multiple_of(4096) {
        return Err(Invalid::new(
            "offset/size",
            "offset and size of a region must be multiples of 4 KiB",
        ));
    }
    let Some(end) = offset.checked_add(size) else {
        return Err(Invalid::new(
            "offset/size",
            format!("{} ends past 2^64 bytes", region()),
        ));
    };
    if let Some((device, _)) = &backend.emulated
        && end > device.capacity_bytes()
    {
        return Err(Invalid::new(
            "offset/size",
            format!(
                "{} ends past the emulated device ({})",
                region(),
                format_bytes(device.capacity_bytes())
            ),
        ));
    }
    if let Some(other) = before.iter().find(|x| match x.storage {
        Storage::Region { offset: o } => o < end && offset < o + x.size,
        _ => false,
    }) {
        return Err(Invalid::new(
            "offset/size",
            format!("{} overlaps tenant '{}'", region(), other.spec.name),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ServerConfig, String> {
        ServerConfig::parse(text, Path::new("/srv"))
            .map_err(|e| e.in_file("serve.toml").to_string())
    }

    #[test]
    fn defaults_and_relative_paths() {
        let c = parse(
            r#"
            [[tenant]]
            name = "vm1"
            file = "vm1.img"
            size = "1g"
            [[tenant]]
            name = "vm2"
            file = "/abs/vm2.img"
            size = "4k"
            weight = 2
            read_only = true
            "#,
        )
        .unwrap();
        assert_eq!(c.unix, Some(PathBuf::from("/srv/ioshare.sock")));
        assert_eq!((c.queue_depth, c.queue_limit), (32, 256));
        assert_eq!(c.threads, default_threads());
        assert!((1..=DEFAULT_THREADS_CAP).contains(&c.threads));
        assert_eq!(c.policy.name, crate::policy::DEFAULT_POLICY);
        assert!(!c.policy_named);
        assert!(
            c.policy_described().starts_with("mclock (the default; "),
            "{}",
            c.policy_described()
        );
        // `none` only when named.
        let named = parse(
            "[server]\npolicy = 'none'\n[[tenant]]\nname='a'\nfile='a'\nsize='1m'\nweight=4\n",
        )
        .unwrap();
        assert_eq!(
            (named.policy.name.as_str(), named.policy_named),
            ("none", true)
        );
        assert_eq!(named.policy_described(), "none");
        assert_eq!(c.cache, Cache::Writeback);
        assert_eq!(c.tenants[0].storage, Storage::Own("/srv/vm1.img".into()));
        assert_eq!(c.tenants[0].size, 1 << 30);
        assert_eq!(c.tenants[1].storage, Storage::Own("/abs/vm2.img".into()));
        assert!(c.tenants[1].read_only);
        assert_eq!(c.tenants[1].spec.weight, 2.0);
    }

    /// The rbd backend: images in the backend's pool as its client unless a tenant
    /// names others; relative paths from the configuration's folder; what does not
    /// apply to images is refused, naming the field.
    #[test]
    fn rbd_images_and_their_errors() {
        let c = parse(
            r#"
            [backend]
            kind = "rbd"
            conf = "ceph.conf"
            [[tenant]]
            name = "a"
            image = "vm-a"
            size = "1g"
            [[tenant]]
            name = "b"
            image = "vm-b"
            pool = "fast"
            client_id = "front1"
            size = "2g"
            "#,
        )
        .unwrap();
        let image = |pool: &str, client: &str, name: &str| {
            Storage::Image(super::super::rbd::ImageRef {
                conf: "/srv/ceph.conf".into(),
                client_id: client.into(),
                pool: pool.into(),
                image: name.into(),
            })
        };
        assert_eq!(c.tenants[0].storage, image("rbd", "admin", "vm-a"));
        assert_eq!(c.tenants[1].storage, image("fast", "front1", "vm-b"));
        let bad = |backend: &str, tenant: &str| {
            parse(&format!(
                "[backend]\n{backend}\n[[tenant]]\nname = \"t\"\n{tenant}\n"
            ))
            .unwrap_err()
        };
        let e = bad("kind = \"rbd\"", "image = \"x\"\nsize = \"1g\"");
        assert!(e.contains("backend.conf") && e.contains("ceph.conf"), "{e}");
        let e = bad(
            "kind = \"rbd\"\nconf = \"c\"",
            "file = \"x.img\"\nsize = \"1g\"",
        );
        assert!(e.contains("file/offset") && e.contains("image ="), "{e}");
        let e = bad("kind = \"rbd\"\nconf = \"c\"", "size = \"1g\"");
        assert!(
            e.contains("image") && e.contains("needed with the rbd backend"),
            "{e}"
        );
        let e = bad(
            "kind = \"rbd\"\nconf = \"c\"\ncache = \"pdc\"",
            "image = \"x\"\nsize = \"1g\"",
        );
        assert!(
            e.contains("backend.cache") && e.contains("page cache"),
            "{e}"
        );
        let e = bad(
            "kind = \"rbd\"\nconf = \"c\"",
            "image = \"x\"\ncreate = true",
        );
        assert!(
            e.contains("size") && e.contains("create needs its size"),
            "{e}"
        );
        let e = bad("conf = \"c\"", "file = \"x.img\"\nsize = \"1g\"");
        assert!(
            e.contains("backend.conf") && e.contains("only the rbd backend"),
            "{e}"
        );
        let e = bad("", "file = \"x.img\"\nimage = \"x\"\nsize = \"1g\"");
        assert!(e.contains("image/pool/client_id"), "{e}");
    }

    /// The per-export share of connections: even over the exports, at least 4, never
    /// above `max_connections`; the per-peer limit off unless given; both within
    /// `max_connections`.
    #[test]
    fn connection_limits_per_tenant_and_per_peer() {
        let tenants = |n: usize| -> String {
            (0..n)
                .map(|i| {
                    format!("[[tenant]]\nname = \"t{i}\"\nfile = \"t{i}.img\"\nsize = \"1m\"\n")
                })
                .collect()
        };
        let c = parse(&tenants(3)).unwrap();
        assert_eq!((c.max_connections, c.max_connections_per_tenant), (256, 86));
        assert_eq!(c.max_connections_per_peer, None);
        assert_eq!(
            c.local_peer_limit(),
            64,
            "a quarter of 256 on the Unix socket"
        );
        let c = parse(&format!("[server]\nmax_connections = 20\n{}", tenants(1))).unwrap();
        assert_eq!(c.local_peer_limit(), 8);
        let c = parse(&format!("[server]\nmax_connections = 5\n{}", tenants(1))).unwrap();
        assert_eq!(c.local_peer_limit(), 5);
        let c = parse(&tenants(100)).unwrap();
        assert_eq!(c.max_connections_per_tenant, 4);
        let c = parse(&format!("[server]\nmax_connections = 3\n{}", tenants(2))).unwrap();
        assert_eq!(c.max_connections_per_tenant, 3);
        let c = parse(&format!(
            "[server]\nmax_connections_per_tenant = 10\nmax_connections_per_peer = 20\n{}",
            tenants(2)
        ))
        .unwrap();
        assert_eq!(
            (c.max_connections_per_tenant, c.max_connections_per_peer),
            (10, Some(20))
        );
        for bad in [
            "max_connections_per_tenant = 0",
            "max_connections_per_peer = 257",
        ] {
            let e = parse(&format!("[server]\n{bad}\n{}", tenants(1))).unwrap_err();
            let key = bad.split(' ').next().unwrap();
            assert!(
                e.contains(&format!("server.{key}")) && e.contains("max_connections (256)"),
                "{e}"
            );
        }
    }

    /// `cache` per server and per tenant, and the detector's thresholds.
    #[test]
    fn cache_modes_per_tenant_and_pdc_thresholds() {
        let c = parse(
            "[backend]\ncache = \"pdc\"\n[backend.pdc]\nmin_run = \"8m\"\n\
             [[tenant]]\nname = \"a\"\nfile = \"a.img\"\nsize = \"1g\"\n\
             [[tenant]]\nname = \"b\"\nfile = \"b.img\"\nsize = \"1g\"\ncache = \"none\"\n",
        )
        .unwrap();
        assert_eq!(c.cache, Cache::Pdc);
        assert_eq!(c.tenants[0].cache, Cache::Pdc);
        assert_eq!(c.tenants[1].cache, Cache::None);
        assert_eq!(c.pdc.min_run_bytes, 8 << 20);
        assert_eq!(c.pdc.group_bytes, 128 << 20, "the paper's group by default");
        let t = "[[tenant]]\nname = \"a\"\nfile = \"a.img\"\nsize = \"1g\"\n";
        for (text, want) in [
            (
                format!("{t}cache = \"lru\""),
                "tenant 1 ('a').cache: 'lru' is not one of none, writeback, pdc",
            ),
            (
                format!("[backend.pdc]\ngroup = \"1000\"\n{t}"),
                "backend.pdc.group",
            ),
            (
                format!("[backend.pdc]\nmin_run = \"256m\"\n{t}"),
                "backend.pdc.min_run",
            ),
            (
                format!("[backend.pdc]\nconfirm = \"0\"\n{t}"),
                "backend.pdc.confirm",
            ),
            (
                format!("[backend.pdc]\nwrap_tolerance = \"4m\"\n{t}"),
                "backend.pdc.wrap_tolerance",
            ),
            (
                format!("[backend.pdc]\nsize = \"4m\"\n{t}"),
                "unknown field",
            ),
        ] {
            let e = parse(&text).unwrap_err();
            assert!(e.contains(want), "{text}: {e}");
        }
        // A tenant's cache mode needs a restart to change.
        let mut other = c.clone();
        other.tenants[1].cache = Cache::Pdc;
        assert_eq!(
            c.reload_conflict(&other).as_deref(),
            Some("tenant 2 ('b'): cache")
        );
    }

    /// TLS is required by default where TCP is not loopback, and then needs its
    /// certificate; offered when a certificate is given; off otherwise.
    #[test]
    fn tls_defaults_follow_the_tcp_address() {
        let t = "[[tenant]]\nname = \"vm1\"\nfile = \"vm1.img\"\nsize = \"1g\"\n";
        let cert = "tls_cert = \"c.pem\"\ntls_key = \"k.pem\"\n";
        let mode = |server: &str| parse(&format!("[server]\n{server}{t}")).map(|c| c.tls.mode);
        assert_eq!(mode("tcp = \"127.0.0.1:10809\"\n"), Ok(TlsMode::Off));
        assert_eq!(mode("tcp = \"localhost:10809\"\n"), Ok(TlsMode::Off));
        assert_eq!(mode("tcp = \"[::1]:10809\"\n"), Ok(TlsMode::Off));
        assert_eq!(mode(cert), Ok(TlsMode::On));
        assert_eq!(
            mode(&format!("tcp = \"0.0.0.0:10809\"\n{cert}")),
            Ok(TlsMode::Require)
        );
        assert_eq!(
            mode("tcp = \"0.0.0.0:10809\"\ntls = \"off\"\n"),
            Ok(TlsMode::Off)
        );
        assert_eq!(
            mode("tcp = \"0.0.0.0:10809\"\ntls_psk = \"k.psk\"\n"),
            Ok(TlsMode::Require),
            "pre-shared keys instead of a certificate"
        );
        // Keys that say who may connect: required of every TCP client, loopback
        // included, unless said optional.
        assert_eq!(
            mode("tcp = \"127.0.0.1:10809\"\ntls_psk = \"k.psk\"\n"),
            Ok(TlsMode::Require)
        );
        assert_eq!(
            mode(&format!(
                "tcp = \"127.0.0.1:10809\"\n{cert}tls_client_ca = \"ca.pem\"\n"
            )),
            Ok(TlsMode::Require)
        );
        // Optional beside keys serves clear clients too: said in words, or refused.
        assert_eq!(
            mode(
                "tcp = \"127.0.0.1:10809\"\ntls = \"optional\"\ntls_psk = \"k.psk\"\nallow_plaintext = true\n"
            ),
            Ok(TlsMode::On)
        );
        let c = parse(&format!("[server]\n{cert}tls_client_ca = \"ca.pem\"\n{t}")).unwrap();
        assert_eq!(c.tls.cert, Some(PathBuf::from("/srv/c.pem")));
        assert_eq!(c.tls.client_ca, Some(PathBuf::from("/srv/ca.pem")));
        for (server, says) in [
            (
                "tcp = \"0.0.0.0:10809\"\n",
                "server.tls_cert: server.tcp = \"0.0.0.0:10809\" is not a loopback address, so TLS is required by default",
            ),
            (
                "tls = \"require\"\n",
                "server.tls_cert: TLS needs server.tls_cert",
            ),
            (
                "tls = \"on\"\ntls_cert = \"c.pem\"\n",
                "server.tls_key: TLS needs",
            ),
            (
                "tls = \"off\"\ntls_client_ca = \"ca.pem\"\n",
                "server.tls_client_ca: is set but server.tls = \"off\"",
            ),
            (
                "tls = \"yes\"\n",
                "server.tls: must be \"off\", \"optional\" (also written \"on\") or \"require\"",
            ),
            (
                "tls_psk = \"k.psk\"\ntls_cert = \"c.pem\"\n",
                "server.tls_cert: give either certificates",
            ),
            (
                "tls = \"off\"\ntls_psk = \"k.psk\"\n",
                "server.tls_psk: is set but server.tls = \"off\"",
            ),
            (
                "tls = \"optional\"\ntls_psk = \"k.psk\"\n",
                "server.tls: \"optional\" serves a client that skips TLS in plain text, so server.tls_psk would authenticate nobody",
            ),
            (
                "tls = \"on\"\ntls_client_ca = \"ca.pem\"\ntls_cert = \"c.pem\"\ntls_key = \"k.pem\"\nallow_plaintext = false\n",
                "server.tls_client_ca would authenticate nobody",
            ),
            (
                "tls = \"require\"\ntls_psk = \"k.psk\"\nallow_plaintext = true\n",
                "server.allow_plaintext: applies only where server.tls = \"optional\"",
            ),
        ] {
            let e = mode(server).unwrap_err();
            assert!(e.contains(says), "{server}: {e}");
        }
    }

    /// A file with more tenants than a server holds is refused by its count, before
    /// any tenant is checked against the others (which grows with their square).
    #[test]
    fn too_many_tenants_are_refused_by_their_count() {
        let dir = tempfile::tempdir().unwrap();
        let mut text = String::from("[backend]\nkind = 'null'\n");
        for i in 0..100_000 {
            text.push_str(&format!("[[tenant]]\nname = 't{i}'\nsize = '1m'\n"));
        }
        let e = ServerConfig::parse(&text, dir.path())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("100000 [[tenant]]s; a server holds at most 1024"),
            "{e}"
        );
        let at_most: String = text
            .split("[[tenant]]")
            .take(1025)
            .collect::<Vec<_>>()
            .join("[[tenant]]");
        let c = ServerConfig::parse(&at_most, dir.path()).unwrap();
        assert_eq!(c.tenants.len(), 1024);
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            (
                "[server]\nqueue_depth = 0\n[[tenant]]\nname='a'\nfile='a'\nsize=4096",
                "server.queue_depth",
            ),
            (
                "[server]\nthreads = 0\n[[tenant]]\nname='a'\nfile='a'\nsize=4096",
                "server.threads: must be 1 ..= 64, got 0",
            ),
            (
                "[server]\nthreads = 65\n[[tenant]]\nname='a'\nfile='a'\nsize=4096",
                "server.threads: must be 1 ..= 64, got 65",
            ),
            (
                "[server]\npolicy = { label = 'x' }\n[[tenant]]\nname='a'\nfile='a'\nsize=4096",
                "server.policy: a policy table needs `name`",
            ),
            (
                "[backend]\ncache = 'direct'\n[[tenant]]\nname='a'\nfile='a'\nsize=4096",
                "backend.cache: 'direct'",
            ),
            (
                "[[tenant]]\nname='a'\noffset=0\nsize=4096",
                "offset: a region needs backend.path",
            ),
            (
                "[backend]\npath='d'\n[[tenant]]\nname='a'\noffset=0\nsize='8k'\n[[tenant]]\nname='b'\noffset='4k'\nsize='4k'",
                "tenant 2 ('b').offset/size: region 4 KiB+4 KiB overlaps tenant 'a'",
            ),
            (
                "[backend]\npath='d'\n[[tenant]]\nname='a'\noffset=0\nsize='8k'\n[[tenant]]\nname='b'\noffset='17179869183g'\nsize='2g'",
                "2 GiB ends past 2^64 bytes",
            ),
            (
                "[[tenant]]\nname='a'\nfile='a'\nsize=4096\nweight=0",
                "tenant 1 ('a').weight: must be in (0, 1000000], got 0",
            ),
            (
                "[[tenant]]\nname='a'\nfile='a'\nsize=4096\nsizes=1",
                "unknown field `sizes`",
            ),
            ("", "no [[tenant]]"),
            (
                "[backend]\nkind='null'\n[[tenant]]\nname='a'",
                "size: needed with the null backend",
            ),
            (
                "[server]\ndrain_timeout_s = -1\n[[tenant]]\nname='a'\nfile='a'\nsize=4096",
                "server.drain_timeout_s",
            ),
            (
                "[server]\nmax_inflight_bytes = '32m'\n[[tenant]]\nname='a'\nfile='a'\nsize=4096",
                "server.max_inflight_bytes: must be at least 64 MiB",
            ),
            (
                "[backend]\nkind='emulated'\npath='d'\n[[tenant]]\nname='a'\noffset=0\nsize=4096",
                "backend.device: the emulated backend needs a device model",
            ),
            (
                "[backend]\nkind='emulated'\npath='d'\ndevice={model='ssd',preset='x'}\n[[tenant]]\nname='a'\noffset=0\nsize=4096",
                "backend.device.preset: unknown preset 'x'",
            ),
            (
                "[backend]\nkind='emulated'\npath='d'\ndevice={model='fixed',capacity_gib=1}\n[[tenant]]\nname='a'\nfile='a'\nsize=4096",
                "tenant 1 ('a').file: the emulated backend keeps every tenant in backend.path",
            ),
            (
                "[backend]\nkind='emulated'\npath='d'\ndevice={model='fixed',capacity_gib=1}\n[[tenant]]\nname='a'\noffset='1023m'\nsize='2m'",
                "tenant 1 ('a').offset/size: region 1023 MiB+2 MiB ends past the emulated device (1 GiB)",
            ),
            (
                "[backend]\nkind='emulated'\ndevice={model='fixed'}\n[[tenant]]\nname='a'\noffset=0\nsize=4096",
                "backend.path: the emulated backend keeps the tenants' data in one file",
            ),
            (
                "[backend]\ndevice={model='fixed'}\n[[tenant]]\nname='a'\nfile='a'\nsize=4096",
                "backend.device: only the emulated backend has a device model",
            ),
            (
                "[backend]\npath='shared.img'\n[[tenant]]\nname='a'\noffset=0\nsize=4096\ncreate=true",
                "tenant 1 ('a').create: applies only to a tenant's own file",
            ),
            (
                "[[tenant]]\nname='a'\nfile='a.img'\nsize=4096\n[[tenant]]\nname='b'\nfile='./a.img'\nsize=4096",
                "tenant 2 ('b').file: /srv/./a.img holds the same bytes as tenant 'a''s image (/srv/a.img)",
            ),
            (
                "[backend]\npath='shared.img'\n[[tenant]]\nname='a'\noffset=0\nsize=4096\n[[tenant]]\nname='b'\nfile='shared.img'\nsize=4096",
                "tenant 2 ('b').file: /srv/shared.img holds the same bytes as backend.path (/srv/shared.img)",
            ),
        ];
        for (text, want) in cases {
            let err = parse(text).unwrap_err();
            assert!(err.contains(want), "{text:?}: {err}");
        }
    }

    #[test]
    fn a_misspelt_policy_is_said_at_its_line_with_the_name_it_resembles() {
        let text = "[server]\npolicy = 'sfqq'\n[[tenant]]\nname='a'\nfile='a'\nsize='1m'\n";
        let e = ServerConfig::parse(text, Path::new("/srv")).unwrap_err();
        let e = crate::config::located(e, text, "serve.toml").to_string();
        assert!(
            e.starts_with(
                "serve.toml:2: server.policy: unknown policy 'sfqq': did you mean 'sfq'?"
            ),
            "{e}"
        );
    }

    #[test]
    fn reload_takes_weights_and_slos_but_not_exports() {
        let base =
            "[server]\npolicy = 'sfq'\n[[tenant]]\nname='a'\nfile='a'\nsize='1m'\nweight=1\n";
        let old = parse(base).unwrap();
        let weights = parse(&base.replace(
            "weight=1",
            "weight=5\nslo = { iops = 100, size = 4096, rt_us = 5000 }",
        ))
        .unwrap();
        assert_eq!(old.reload_conflict(&weights), None);
        // Tenants added or removed are the control socket's to apply.
        let more = parse(&format!("{base}[[tenant]]\nname='b'\nfile='b'\nsize=4096")).unwrap();
        assert_eq!(old.reload_conflict(&more), None);
        assert_eq!(more.reload_conflict(&old), None);
        let cases = [
            (base.replace("'sfq'", "'bfq'"), "server.policy"),
            (
                base.replace("size='1m'", "size='2m'"),
                "tenant 1 ('a'): size",
            ),
            (
                base.replace("file='a'", "file='b'"),
                "tenant 1 ('a'): file/offset",
            ),
            (format!("{base}[backend]\ncache='none'"), "backend.cache"),
        ];
        for (text, want) in cases {
            let new = parse(&text).unwrap();
            let got = old.reload_conflict(&new).unwrap_or_default();
            assert!(got.contains(want), "{text:?}: {got:?}");
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]

        /// Region arithmetic anywhere in the 64-bit range, sizes as exact byte strings:
        /// the configuration is never accepted with two regions that overlap or one that
        /// runs past 2^64, and reading it never panics.
        #[test]
        fn regions_are_refused_exactly_when_they_overlap_or_overflow(
            a in region(), b in region(),
        ) {
            let text = format!(
                "[backend]\npath='d'\n[[tenant]]\nname='a'\noffset='{}'\nsize='{}'\n\
                 [[tenant]]\nname='b'\noffset='{}'\nsize='{}'\n",
                a.0, a.1, b.0, b.1
            );
            let parsed = parse(&text);
            let end = |(o, n): (u64, u64)| u128::from(o) + u128::from(n);
            let fits = |r: (u64, u64)| end(r) <= u128::from(u64::MAX) && r.1 > 0;
            let apart = end(a) <= u128::from(b.0) || end(b) <= u128::from(a.0);
            let aligned = [a.0, a.1, b.0, b.1].iter().all(|x| x % 4096 == 0);
            proptest::prop_assert_eq!(
                parsed.is_ok(),
                fits(a) && fits(b) && apart && aligned,
                "{:?}", parsed.map(|c| c.tenants.len())
            );
        }

        /// Any bytes in a configuration's place: an error naming what is wrong, never a
        /// panic.
        #[test]
        fn garbage_configs_are_errors_not_panics(text in "(\\[server\\]|\\[\\[tenant\\]\\]|[a-z_]{1,12} = ('[a-z0-9.]{0,8}'|-?[0-9]{1,20}|true)|\n){0,12}") {
            let _ = parse(&text);
        }
    }

    /// Offsets and sizes: mostly 4 KiB multiples, near 0 or near 2^64, sometimes not.
    fn region() -> impl proptest::strategy::Strategy<Value = (u64, u64)> {
        use proptest::prelude::*;
        let value = prop_oneof![
            (0u64..64).prop_map(|k| k * 4096),
            (0u64..64).prop_map(|k| u64::MAX - 4095 - k * 4096),
            (0u64..(1 << 52)).prop_map(|k| k * 4096),
            any::<u64>(),
        ];
        (value.clone(), value.prop_filter("a size", |&n| n > 0))
    }
}
