//! The control socket (`server.control`; `ioshare ctl`): tenants added, changed,
//! drained, resumed and removed while the server runs, and the `/metrics` figures read,
//! without a restart and without touching the other tenants' connections.
//!
//! **Protocol** (QEMU's QMP is the model): a Unix socket, mode 0600 (whoever may use it
//! may reconfigure the server); one JSON object per line each way. On connecting the
//! server says `{"ioshare": {"version": …, "commands": […]}}`; each request
//! `{"execute": "COMMAND", "arguments": {…}}` is answered `{"return": …}` or
//! `{"error": {"class": …, "desc": …}}`, in order. A line longer than [`MAX_LINE`] or
//! that is not such an object is answered with an error and the connection goes on; at
//! most [`MAX_CLIENTS`] connections are served at once (more are told so and closed),
//! and one silent for [`IDLE`] is closed.
//!
//! **Readings.** A tenant keeps its id for the server's life: `remove-tenant` drains it
//! (its connections stop being read, what they sent is answered, then they close) and
//! withdraws its export from the list; its image and counters stay, and
//! `resume-tenant` serves it again. Ids are never reused, so a series in `/metrics`
//! always means one tenant; [`super::config::MAX_TENANTS`] bounds them. A tenant added
//! here is checked as a `[[tenant]]` of the file is (names, images, regions, the
//! server's own files) and opened before the answer; the engine takes it on between two
//! turns of its loop. A change of weight, SLO, reservation or limit reaches the policy
//! as SIGHUP's does (`EngineHandle::update`). SIGHUP stays: it applies
//! what changed in the file since it was last read — tenants new in the file are
//! added, tenants gone from it removed (those added here are left alone), changed
//! promises set — through the same operations.

use super::backend::Files;
use super::config::{ServerConfig, TenantConfig};
use super::engine::EngineHandle;
use super::gate::ExportPlaces;
use super::prometheus::{self, MetricsSource};
use super::stats::{LiveStats, TenantState};
use crate::config::{Invalid, QosFields};
use crate::types::{Slo, TenantId, TenantSpec};
use serde_json::{Map, Value, json};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The longest request line.
pub const MAX_LINE: usize = 64 << 10;
/// Control connections served at once.
pub const MAX_CLIENTS: usize = 16;
/// A control connection silent this long is closed.
pub const IDLE: Duration = Duration::from_secs(300);

/// The commands, with what each does (the greeting lists them; `ioshare ctl --help`
/// shows them).
pub const COMMANDS: [(&str, &str); 8] = [
    (
        "tenants",
        "every tenant: id, state, promise, export, connections and counters",
    ),
    (
        "add-tenant",
        "add a tenant; arguments are a [[tenant]] table's fields (name, file or offset, size, create, weight, slo, ...)",
    ),
    (
        "set-tenant",
        "change a tenant's weight, slo, reservation_iops or limit_iops (null clears one)",
    ),
    (
        "drain-tenant",
        "stop reading a tenant's connections, answer what they sent, close them, refuse new ones",
    ),
    (
        "remove-tenant",
        "drain a tenant and withdraw its export (its image and counters stay)",
    ),
    ("resume-tenant", "serve a drained or removed tenant again"),
    (
        "metrics",
        "the figures /metrics exports, in the Prometheus text format",
    ),
    (
        "reload",
        "apply what changed in the configuration file (as SIGHUP does)",
    ),
];

/// Why a request was not carried out; `class` is what the answer names.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum CtlError {
    /// The request line is not a request.
    #[error("{0}")]
    Malformed(String),
    /// No such command.
    #[error("unknown command '{0}' (known: {known})", known = command_names())]
    UnknownCommand(String),
    /// An argument is missing, unknown or out of range.
    #[error("{0}")]
    Invalid(String),
    /// No tenant has this name.
    #[error("no tenant is named '{0}'")]
    NotFound(String),
    /// Valid, but the server could not do it (an image that does not open, a stopping
    /// engine, a change that needs a restart).
    #[error("{0}")]
    Failed(String),
}

impl CtlError {
    /// The error's class in the answer.
    pub fn class(&self) -> &'static str {
        match self {
            CtlError::Malformed(_) => "Malformed",
            CtlError::UnknownCommand(_) => "CommandNotFound",
            CtlError::Invalid(_) => "InvalidArgument",
            CtlError::NotFound(_) => "TenantNotFound",
            CtlError::Failed(_) => "Failed",
        }
    }
}

fn command_names() -> String {
    COMMANDS.map(|(c, _)| c).join(", ")
}

impl From<Invalid> for CtlError {
    fn from(e: Invalid) -> Self {
        CtlError::Invalid(e.to_string())
    }
}

/// What the control socket changes, shared with the accept loop (which applies SIGHUP
/// through it and reads the tenants at the end).
pub struct Control {
    /// The running configuration: every tenant the server holds, in id order (added
    /// and removed ones included).
    config: ServerConfig,
    /// Per tenant: whether its export is served.
    states: Vec<TenantState>,
    /// The configuration file (SIGHUP and `reload` read it; relative paths of added
    /// tenants are taken from its folder).
    source: Option<PathBuf>,
    /// Names of the tenants the file had when last read.
    from_file: Vec<String>,
    engine: EngineHandle,
    exports: Arc<ExportPlaces>,
    stats: Arc<LiveStats>,
}

/// A tenant's export fields as `tenants` shows them.
fn export_json(t: &TenantConfig) -> Value {
    use super::config::Storage;
    let storage = match &t.storage {
        Storage::Nothing => json!(null),
        Storage::Own(path) => json!({ "file": path.display().to_string() }),
        Storage::Region { offset } => json!({ "offset": offset }),
        Storage::Image(at) => json!({
            "pool": at.pool,
            "image": at.image,
            "client_id": at.client_id,
        }),
    };
    json!({
        "size": t.size,
        "read_only": t.read_only,
        "cache": t.cache.name(),
        "storage": storage,
        "description": t.description,
    })
}

fn spec_json(spec: &TenantSpec) -> Value {
    json!({
        "weight": spec.weight,
        "slo": spec.slo,
        "reservation_iops": spec.reservation_iops,
        "limit_iops": spec.limit_iops,
    })
}

impl Control {
    /// Control over a server started with `config` (read from `source`).
    pub fn new(
        config: ServerConfig,
        source: Option<PathBuf>,
        engine: EngineHandle,
        exports: Arc<ExportPlaces>,
        stats: Arc<LiveStats>,
    ) -> Control {
        Control {
            states: vec![TenantState::Serving; config.tenants.len()],
            from_file: config.tenants.iter().map(|t| t.spec.name.clone()).collect(),
            config,
            source,
            engine,
            exports,
            stats,
        }
    }

    /// The running configuration (every tenant held, in id order).
    pub fn config(&self) -> &ServerConfig {
        &self.config
    }

    /// Carries out one request.
    pub fn execute(&mut self, command: &str, args: &Map<String, Value>) -> Result<Value, CtlError> {
        let no_arguments = |args: &Map<String, Value>| match args.keys().next() {
            Some(k) => Err(CtlError::Invalid(format!(
                "{command} takes no arguments, got '{k}'"
            ))),
            None => Ok(()),
        };
        match command {
            "tenants" => no_arguments(args).map(|()| self.tenants()),
            "add-tenant" => self.add(args),
            "set-tenant" => self.set(args),
            "drain-tenant" => self.change_state(args, TenantState::Drained),
            "remove-tenant" => self.change_state(args, TenantState::Removed),
            "resume-tenant" => self.change_state(args, TenantState::Serving),
            "metrics" => no_arguments(args).map(|()| self.metrics()),
            "reload" => {
                no_arguments(args)?;
                self.reload()
            }
            other => Err(CtlError::UnknownCommand(other.to_string())),
        }
    }

    fn tenants(&self) -> Value {
        let counters = self.stats.snapshot();
        let list: Vec<Value> = self
            .config
            .tenants
            .iter()
            .enumerate()
            .map(|(id, t)| {
                let mut o = json!({
                    "id": id,
                    "name": t.spec.name,
                    "state": self.states[id].name(),
                    "promise": spec_json(&t.spec),
                    "export": export_json(t),
                    "from_file": self.from_file.contains(&t.spec.name),
                });
                if let Some(c) = counters.get(id) {
                    o["connections"] = c.connections.into();
                    o["arrived"] = c.arrived.into();
                    o["completed"] = c.completed.into();
                    o["queued"] = c.queued().into();
                    o["read_bytes"] = c.read_bytes.into();
                    o["written_bytes"] = c.written_bytes.into();
                    o["errors"] = c
                        .errors_by_reason()
                        .into_iter()
                        .map(|(k, n)| (k, json!(n)))
                        .collect::<Map<_, _>>()
                        .into();
                }
                o
            })
            .collect();
        Value::Array(list)
    }

    fn metrics(&self) -> Value {
        Value::String(prometheus::render(&MetricsSource {
            stats: self.stats.clone(),
            policy: self.config.policy.label.clone(),
        }))
    }

    /// The tenant named by `args["name"]`.
    fn named(&self, args: &Map<String, Value>) -> Result<TenantId, CtlError> {
        let name = match args.get("name") {
            Some(Value::String(n)) => n,
            Some(other) => {
                return Err(CtlError::Invalid(format!(
                    "name: a tenant's name is a string, got {other}"
                )));
            }
            None => return Err(CtlError::Invalid("name: which tenant? (missing)".into())),
        };
        self.config
            .tenants
            .iter()
            .position(|t| &t.spec.name == name)
            .map(|i| i as TenantId)
            .ok_or_else(|| CtlError::NotFound(name.clone()))
    }

    fn add(&mut self, args: &Map<String, Value>) -> Result<Value, CtlError> {
        let table = toml_table(args)?;
        let base = self
            .source
            .as_deref()
            .and_then(Path::parent)
            .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
        let name = args.get("name").and_then(Value::as_str).unwrap_or("?");
        let tenant = self
            .config
            .tenant_to_add(table, &base, self.source.as_deref())
            .map_err(|e| CtlError::Invalid(format!("add-tenant '{name}': {e}")))?;
        let id = self.add_checked(tenant, "control")?;
        Ok(json!({ "id": id, "name": name }))
    }

    /// Opens a checked tenant's image and hands it to the engine; offered to new
    /// connections once the engine has it on its channel.
    fn add_checked(&mut self, tenant: TenantConfig, by: &str) -> Result<TenantId, CtlError> {
        let mut files = Files::open_added(&tenant)
            .map_err(|e| CtlError::Failed(format!("add-tenant '{}': {e}", tenant.spec.name)))?;
        let created = files.take_created();
        let id = self.config.tenants.len() as TenantId;
        assert_eq!(
            self.stats.add_tenant(&tenant.spec.name, tenant.spec.weight),
            id,
            "the counters number tenants as the configuration does"
        );
        self.exports.add();
        if !self.engine.add_tenant(tenant.clone(), files) {
            // Counted and placed but never served: the server is stopping anyway.
            self.exports.set_open(id as usize, false);
            return Err(CtlError::Failed("the engine is stopping".into()));
        }
        created.keep();
        tracing::info!(
            "{by}: added tenant {} ('{}'): weight {}, {}",
            id,
            tenant.spec.name,
            tenant.spec.weight,
            crate::units::format_bytes(tenant.size)
        );
        self.config.tenants.push(tenant);
        self.states.push(TenantState::Serving);
        self.offer();
        Ok(id)
    }

    fn set(&mut self, args: &Map<String, Value>) -> Result<Value, CtlError> {
        let id = self.named(args)?;
        let old = self.config.tenants[id as usize].spec.clone();
        let mut q = QosFields {
            weight: Some(old.weight),
            slo: old.slo,
            reservation_iops: old.reservation_iops,
            limit_iops: old.limit_iops,
        };
        for (key, v) in args {
            let field = |problem: String| CtlError::Invalid(format!("{key}: {problem}"));
            let number = || match v {
                Value::Null => Ok(None),
                Value::Number(n) => Ok(n.as_f64()),
                other => Err(field(format!("a number or null, got {other}"))),
            };
            match key.as_str() {
                "name" => {}
                "weight" => {
                    q.weight =
                        Some(number()?.ok_or_else(|| field("a weight cannot be cleared".into()))?);
                }
                "reservation_iops" => q.reservation_iops = number()?,
                "limit_iops" => q.limit_iops = number()?,
                "slo" => {
                    q.slo = match v {
                        Value::Null => None,
                        v => Some(serde_json::from_value::<Slo>(v.clone()).map_err(|e| {
                            field(format!("{e} (an slo is {{iops, size, rt_us}})"))
                        })?),
                    }
                }
                other => {
                    return Err(CtlError::Invalid(format!(
                        "unknown field '{other}' (set-tenant changes weight, slo, reservation_iops, limit_iops)"
                    )));
                }
            }
        }
        let spec = q.spec(&old.name)?;
        if spec == old {
            return Ok(json!({ "changed": false }));
        }
        self.apply_spec(id, spec, "control");
        Ok(json!({ "changed": true, "promise": spec_json(&self.config.tenants[id as usize].spec) }))
    }

    fn apply_spec(&mut self, id: TenantId, spec: TenantSpec, by: &str) {
        let old = &self.config.tenants[id as usize].spec;
        tracing::info!(
            "{by}: {}: weight {} -> {}, slo {} -> {}, reservation {} -> {}, limit {} -> {}",
            spec.name,
            old.weight,
            spec.weight,
            describe(&old.slo),
            describe(&spec.slo),
            describe(&old.reservation_iops),
            describe(&spec.reservation_iops),
            describe(&old.limit_iops),
            describe(&spec.limit_iops),
        );
        self.stats.set_weight(id, spec.weight);
        self.engine.update(id, spec.clone());
        self.config.tenants[id as usize].spec = spec;
    }

    fn change_state(
        &mut self,
        args: &Map<String, Value>,
        to: TenantState,
    ) -> Result<Value, CtlError> {
        if let Some(k) = args.keys().find(|k| *k != "name") {
            return Err(CtlError::Invalid(format!(
                "unknown field '{k}' (only name)"
            )));
        }
        let id = self.named(args)?;
        let from = self.states[id as usize];
        if from != to {
            self.set_state(id, to, "control");
        }
        Ok(json!({ "state": to.name(), "was": from.name() }))
    }

    fn set_state(&mut self, id: TenantId, to: TenantState, by: &str) {
        let i = id as usize;
        let serving = to == TenantState::Serving;
        self.exports.set_open(i, serving);
        self.engine.close_tenant(id, !serving);
        self.states[i] = to;
        self.stats.set_state(id, to);
        self.offer();
        tracing::info!(
            "{by}: {} is {}",
            self.config.tenants[i].spec.name,
            match to {
                TenantState::Serving => "served again",
                TenantState::Drained => "drained: its connections close once answered",
                TenantState::Removed => "removed: drained, and its export withdrawn",
            }
        );
    }

    /// Offers the exports as they are now to new connections.
    fn offer(&self) {
        let mut infos = super::gate::infos_of(&self.config);
        for (info, state) in infos.iter_mut().zip(&self.states) {
            info.offered = *state != TenantState::Removed;
        }
        self.exports.set_infos(infos);
    }

    /// Applies what changed in the configuration file since it was last read (SIGHUP
    /// and `reload`); a change that needs a restart, or a file that does not load,
    /// applies nothing.
    pub fn reload(&mut self) -> Result<Value, CtlError> {
        let Some(path) = self.source.clone() else {
            return Err(CtlError::Failed("no configuration file to reload".into()));
        };
        let new = ServerConfig::load(&path)
            .map_err(|e| CtlError::Failed(format!("{e}; nothing applied")))?;
        if let Some(field) = self.config.reload_conflict(&new) {
            return Err(CtlError::Failed(format!(
                "{field} changed, which needs a restart; nothing applied"
            )));
        }
        // Added tenants are checked against the running ones (and each other) before
        // anything changes.
        let mut scratch = self.config.clone();
        // The file is the operator's: its images' folders are where its tenants' images
        // may be (server.image_dirs, when given, is the same in both: a change of it
        // needs a restart).
        scratch.image_dirs = new.image_dirs.clone();
        let mut added = Vec::new();
        for t in &new.tenants {
            if scratch.tenants.iter().any(|r| r.spec.name == t.spec.name) {
                continue;
            }
            scratch.check_new_tenant(t, Some(&path)).map_err(|e| {
                CtlError::Invalid(format!("tenant '{}': {e}; nothing applied", t.spec.name))
            })?;
            scratch.tenants.push(t.clone());
            added.push(t.clone());
        }
        let mut changes = Vec::new();
        for t in &new.tenants {
            let Some(id) = self
                .config
                .tenants
                .iter()
                .position(|r| r.spec.name == t.spec.name)
            else {
                continue;
            };
            let id = id as TenantId;
            if self.config.tenants[id as usize].spec != t.spec {
                self.apply_spec(id, t.spec.clone(), "reload");
                changes.push(format!("set {}", t.spec.name));
            }
            if self.states[id as usize] == TenantState::Removed {
                self.set_state(id, TenantState::Serving, "reload");
                changes.push(format!("resumed {}", t.spec.name));
            }
        }
        for t in added {
            let name = t.spec.name.clone();
            self.add_checked(t, "reload")?;
            changes.push(format!("added {name}"));
        }
        for name in self.from_file.clone() {
            if new.tenants.iter().any(|t| t.spec.name == name) {
                continue;
            }
            let id = self.named(&Map::from_iter([("name".to_string(), json!(name))]))?;
            if self.states[id as usize] != TenantState::Removed {
                self.set_state(id, TenantState::Removed, "reload");
                changes.push(format!("removed {name}"));
            }
        }
        self.from_file = new.tenants.iter().map(|t| t.spec.name.clone()).collect();
        self.config.interval_s = new.interval_s;
        if changes.is_empty() {
            tracing::info!("reload: nothing changed");
        }
        Ok(json!({ "changes": changes }))
    }
}

fn describe<T: std::fmt::Debug>(value: &Option<T>) -> String {
    match value {
        Some(v) => format!("{v:?}"),
        None => "none".into(),
    }
}

/// A request's arguments as a `[[tenant]]` table (JSON null has no TOML form: a field
/// left out is the default).
fn toml_table(args: &Map<String, Value>) -> Result<toml::Table, CtlError> {
    args.iter()
        .map(|(k, v)| Ok((k.clone(), toml_of(k, v)?)))
        .collect()
}

fn toml_of(key: &str, v: &Value) -> Result<toml::Value, CtlError> {
    Ok(match v {
        Value::Null => {
            return Err(CtlError::Invalid(format!(
                "{key}: null (leave the field out for its default)"
            )));
        }
        Value::Bool(b) => toml::Value::Boolean(*b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => toml::Value::Integer(i),
            None => toml::Value::Float(n.as_f64().unwrap_or(f64::NAN)),
        },
        Value::String(s) => toml::Value::String(s.clone()),
        Value::Array(a) => toml::Value::Array(
            a.iter()
                .map(|v| toml_of(key, v))
                .collect::<Result<_, _>>()?,
        ),
        Value::Object(o) => toml::Value::Table(toml_table(o)?),
    })
}

/// The greeting a control connection starts with.
pub fn greeting() -> Value {
    json!({
        "ioshare": {
            "version": env!("CARGO_PKG_VERSION"),
            "commands": COMMANDS.map(|(c, _)| c),
        }
    })
}

/// The answer to one request line.
pub fn answer(control: &Mutex<Control>, line: &[u8]) -> Value {
    let reply = parse(line).and_then(|(command, args)| {
        control
            .lock()
            .expect("control lock")
            .execute(&command, &args)
    });
    match reply {
        Ok(v) => json!({ "return": v }),
        Err(e) => json!({ "error": { "class": e.class(), "desc": e.to_string() } }),
    }
}

/// A request line: its command and arguments.
fn parse(line: &[u8]) -> Result<(String, Map<String, Value>), CtlError> {
    let text = std::str::from_utf8(line)
        .map_err(|_| CtlError::Malformed("the request is not UTF-8".into()))?;
    let v: Value =
        serde_json::from_str(text).map_err(|e| CtlError::Malformed(format!("not JSON: {e}")))?;
    let Value::Object(mut o) = v else {
        return Err(CtlError::Malformed(
            "a request is an object: {\"execute\": \"COMMAND\", \"arguments\": {...}}".into(),
        ));
    };
    let command = match o.remove("execute") {
        Some(Value::String(c)) => c,
        _ => {
            return Err(CtlError::Malformed(
                "\"execute\" (the command, a string) is missing".into(),
            ));
        }
    };
    let args = match o.remove("arguments") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(a)) => a,
        Some(other) => {
            return Err(CtlError::Malformed(format!(
                "\"arguments\" is an object, got {other}"
            )));
        }
    };
    if let Some(k) = o.keys().next() {
        return Err(CtlError::Malformed(format!(
            "unknown key '{k}' (a request has execute and arguments)"
        )));
    }
    Ok((command, args))
}

/// Serves the control socket on a thread of its own, each connection on its own
/// thread, at most [`MAX_CLIENTS`] at once.
pub fn spawn(listener: UnixListener, control: Arc<Mutex<Control>>) -> std::io::Result<()> {
    listener.set_nonblocking(false)?;
    let clients = Arc::new(AtomicUsize::new(0));
    std::thread::Builder::new()
        .name("control".into())
        .spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else {
                    // Out of descriptors: rest instead of spinning.
                    std::thread::sleep(Duration::from_millis(50));
                    continue;
                };
                if clients.fetch_add(1, Ordering::SeqCst) >= MAX_CLIENTS {
                    clients.fetch_sub(1, Ordering::SeqCst);
                    let busy = json!({ "error": { "class": "Busy", "desc": format!("{MAX_CLIENTS} control connections are open; try again") } });
                    let _ = writeln!(stream, "{busy}");
                    continue;
                }
                let (control, clients) = (control.clone(), clients.clone());
                let spawned = std::thread::Builder::new()
                    .name("control-client".into())
                    .spawn(move || {
                        let _ = serve_client(stream, &control);
                        clients.fetch_sub(1, Ordering::SeqCst);
                    });
                if spawned.is_err() {
                    tracing::warn!("control: cannot start a thread for a connection");
                }
            }
        })?;
    Ok(())
}

/// One control connection: the greeting, then a reply per request line.
fn serve_client(stream: UnixStream, control: &Mutex<Control>) -> std::io::Result<()> {
    stream.set_read_timeout(Some(IDLE))?;
    stream.set_write_timeout(Some(IDLE))?;
    let mut out = stream.try_clone()?;
    writeln!(out, "{}", greeting())?;
    let mut input = BufReader::new(stream);
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = (&mut input)
            .take(MAX_LINE as u64 + 1)
            .read_until(b'\n', &mut line)?;
        if n == 0 {
            return Ok(());
        }
        if line.len() > MAX_LINE {
            let e = CtlError::Malformed(format!("a request line is at most {MAX_LINE} bytes"));
            writeln!(
                out,
                "{}",
                json!({ "error": { "class": e.class(), "desc": e.to_string() } })
            )?;
            // The rest of the long line is skipped.
            if line.last() != Some(&b'\n') {
                let mut rest = Vec::new();
                input.read_until(b'\n', &mut rest)?;
            }
            continue;
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        writeln!(out, "{}", answer(control, &line))?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::engine::{self, Inbox};
    use crate::server::gate::Gate;

    const TWO: &str = "[backend]\nkind = 'null'\n[[tenant]]\nname = 'a'\nsize = '1m'\n[[tenant]]\nname = 'b'\nsize = '1m'\n";

    fn control(text: &str, source: Option<PathBuf>) -> (Mutex<Control>, Inbox, Arc<ExportPlaces>) {
        let config = match &source {
            Some(path) => ServerConfig::load(path).expect("loads"),
            None => ServerConfig::parse(text, Path::new("/srv")).expect("parses"),
        };
        let (handle, inbox) = engine::channel().expect("eventfd");
        let gate = Gate::of(&config);
        let stats = Arc::new(LiveStats::new(
            &config
                .tenants
                .iter()
                .map(|t| (t.spec.name.clone(), t.spec.weight))
                .collect::<Vec<_>>(),
        ));
        let exports = gate.exports().clone();
        let c = Control::new(config, source, handle, exports.clone(), stats);
        (Mutex::new(c), inbox, exports)
    }

    fn ask(c: &Mutex<Control>, line: &str) -> Value {
        answer(c, line.as_bytes())
    }

    fn error_of(v: &Value) -> (String, String) {
        let e = &v["error"];
        assert!(e.is_object(), "not an error: {v}");
        (
            e["class"].as_str().unwrap().to_string(),
            e["desc"].as_str().unwrap().to_string(),
        )
    }

    #[test]
    fn malformed_requests_are_answered_with_what_is_wrong() {
        let (c, _inbox, _) = control(TWO, None);
        for (line, class, says) in [
            ("{", "Malformed", "not JSON"),
            ("[1]", "Malformed", "a request is an object"),
            ("{\"arguments\": {}}", "Malformed", "\"execute\""),
            (
                "{\"execute\": \"tenants\", \"x\": 1}",
                "Malformed",
                "unknown key 'x'",
            ),
            (
                "{\"execute\": \"tenants\", \"arguments\": 3}",
                "Malformed",
                "is an object",
            ),
            (
                "{\"execute\": \"stop\"}",
                "CommandNotFound",
                "unknown command 'stop'",
            ),
            (
                "{\"execute\": \"tenants\", \"arguments\": {\"a\": 1}}",
                "InvalidArgument",
                "takes no arguments",
            ),
            (
                "{\"execute\": \"set-tenant\", \"arguments\": {\"name\": \"zz\"}}",
                "TenantNotFound",
                "'zz'",
            ),
            (
                "{\"execute\": \"set-tenant\", \"arguments\": {\"weight\": 2}}",
                "InvalidArgument",
                "missing",
            ),
            (
                "{\"execute\": \"reload\"}",
                "Failed",
                "no configuration file",
            ),
        ] {
            let (got_class, desc) = error_of(&ask(&c, line));
            assert_eq!(got_class, class, "{line}: {desc}");
            assert!(desc.contains(says), "{line}: {desc}");
        }
        let (_, desc) = error_of(&answer(&c, &[0xff, 0xfe]));
        assert!(desc.contains("UTF-8"), "{desc}");
    }

    #[test]
    fn a_tenant_is_added_changed_drained_removed_and_resumed() {
        let (c, inbox, exports) = control(TWO, None);
        let added = ask(
            &c,
            r#"{"execute": "add-tenant", "arguments": {"name": "c", "size": "2m", "weight": 4}}"#,
        );
        assert_eq!(added["return"], json!({"id": 2, "name": "c"}), "{added}");
        assert_eq!(inbox.sent(), vec![("add", None)]);
        let infos = exports.infos();
        assert_eq!(infos.len(), 3);
        assert_eq!(
            (infos[2].name.as_str(), infos[2].size, infos[2].offered),
            ("c", 2 << 20, true)
        );
        for (args, says) in [
            (r#"{"name": "c", "size": "1m"}"#, "name: used"),
            (r#"{"name": "d"}"#, "size"),
            (
                r#"{"name": "d", "size": "1m", "wieght": 2}"#,
                "unknown field `wieght`",
            ),
            (
                r#"{"name": "d", "size": "1m", "weight": null}"#,
                "weight: null",
            ),
            (r#"{"name": "d", "size": "1m", "weight": -1}"#, "weight"),
            (
                r#"{"name": "d", "size": "1m", "file": "d.img"}"#,
                "null backend",
            ),
        ] {
            let v = ask(
                &c,
                &format!(r#"{{"execute": "add-tenant", "arguments": {args}}}"#),
            );
            let (class, desc) = error_of(&v);
            assert_eq!(class, "InvalidArgument", "{args}: {desc}");
            assert!(desc.contains(says), "{args}: {desc}");
        }
        assert!(inbox.sent().is_empty(), "nothing reached the engine");
        let set = ask(
            &c,
            r#"{"execute": "set-tenant", "arguments": {"name": "c", "weight": 2, "slo": {"iops": 100, "size": "4k", "rt_us": 5000}}}"#,
        );
        assert_eq!(set["return"]["changed"], json!(true), "{set}");
        assert_eq!(inbox.sent(), vec![("update", Some(2))]);
        let same = ask(
            &c,
            r#"{"execute": "set-tenant", "arguments": {"name": "c", "weight": 2}}"#,
        );
        assert_eq!(same["return"]["changed"], json!(false), "{same}");
        let (_, desc) = error_of(&ask(
            &c,
            r#"{"execute": "set-tenant", "arguments": {"name": "c", "weight": null}}"#,
        ));
        assert!(desc.contains("cannot be cleared"), "{desc}");
        let (_, desc) = error_of(&ask(
            &c,
            r#"{"execute": "set-tenant", "arguments": {"name": "c", "reservation_iops": 500, "limit_iops": 100}}"#,
        ));
        assert!(desc.contains("reservation"), "{desc}");
        let cleared = ask(
            &c,
            r#"{"execute": "set-tenant", "arguments": {"name": "c", "slo": null}}"#,
        );
        assert_eq!(
            cleared["return"]["promise"]["slo"],
            json!(null),
            "{cleared}"
        );
        assert_eq!(inbox.sent(), vec![("update", Some(2))]);
        let drained = ask(
            &c,
            r#"{"execute": "drain-tenant", "arguments": {"name": "b"}}"#,
        );
        assert_eq!(
            drained["return"],
            json!({"state": "drained", "was": "serving"})
        );
        assert!(
            !exports.is_open(1) && exports.infos()[1].offered,
            "listed, closed"
        );
        let removed = ask(
            &c,
            r#"{"execute": "remove-tenant", "arguments": {"name": "b"}}"#,
        );
        assert_eq!(removed["return"]["was"], json!("drained"));
        assert!(!exports.infos()[1].offered, "withdrawn");
        let resumed = ask(
            &c,
            r#"{"execute": "resume-tenant", "arguments": {"name": "b"}}"#,
        );
        assert_eq!(resumed["return"]["state"], json!("serving"));
        assert!(exports.is_open(1) && exports.infos()[1].offered);
        assert_eq!(
            inbox.sent(),
            vec![("drain", Some(1)), ("drain", Some(1)), ("resume", Some(1))]
        );
        let list = ask(&c, r#"{"execute": "tenants"}"#);
        let names: Vec<&str> = list["return"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["a", "b", "c"]);
        assert_eq!(list["return"][2]["promise"]["weight"], json!(2.0));
        assert_eq!(list["return"][2]["from_file"], json!(false));
        let metrics = ask(&c, r#"{"execute": "metrics"}"#);
        let text = metrics["return"].as_str().unwrap();
        assert!(
            text.contains("ioshare_requests_arrived_total{tenant=\"c\"} 0"),
            "{text}"
        );
    }

    /// A server holds at most MAX_TENANTS tenants, removed ones included.
    #[test]
    fn tenants_are_bounded() {
        let (c, inbox, _) = control(TWO, None);
        for i in 2..crate::server::config::MAX_TENANTS {
            let v = ask(
                &c,
                &format!(
                    r#"{{"execute": "add-tenant", "arguments": {{"name": "t{i}", "size": 4096}}}}"#
                ),
            );
            assert_eq!(v["return"]["id"], json!(i), "{v}");
        }
        let (_, desc) = error_of(&ask(
            &c,
            r#"{"execute": "add-tenant", "arguments": {"name": "one-more", "size": 4096}}"#,
        ));
        assert!(
            desc.contains("at most") || desc.contains("its most"),
            "{desc}"
        );
        assert_eq!(inbox.sent().len(), crate::server::config::MAX_TENANTS - 2);
    }

    /// SIGHUP's reload applies what changed in the file since it was read: a new
    /// tenant added, a changed promise set, a tenant gone from the file removed (one
    /// added by the control socket left alone); a change that needs a restart applies
    /// nothing.
    #[test]
    fn reload_applies_the_files_changes_through_the_same_operations() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("serve.toml");
        std::fs::write(&path, TWO).unwrap();
        let (c, inbox, exports) = control(TWO, Some(path.clone()));
        let _ = ask(
            &c,
            r#"{"execute": "add-tenant", "arguments": {"name": "x", "size": 4096}}"#,
        );
        let _ = inbox.sent();
        let changed = "[backend]\nkind = 'null'\n[[tenant]]\nname = 'a'\nsize = '1m'\nweight = 3\n[[tenant]]\nname = 'n'\nsize = '1m'\n";
        std::fs::write(&path, changed).unwrap();
        let v = ask(&c, r#"{"execute": "reload"}"#);
        assert_eq!(
            v["return"]["changes"],
            json!(["set a", "added n", "removed b"]),
            "{v}"
        );
        assert_eq!(
            inbox.sent(),
            vec![("update", Some(0)), ("add", None), ("drain", Some(1))]
        );
        let names: Vec<(String, bool)> = exports
            .infos()
            .iter()
            .map(|i| (i.name.clone(), i.offered))
            .collect();
        assert_eq!(
            names,
            [("a", true), ("b", false), ("x", true), ("n", true)].map(|(n, o)| (n.to_string(), o))
        );
        std::fs::write(
            &path,
            changed.replace("size = '1m'\nweight", "size = '2m'\nweight"),
        )
        .unwrap();
        let (class, desc) = error_of(&ask(&c, r#"{"execute": "reload"}"#));
        assert_eq!(class, "Failed");
        assert!(
            desc.contains("('a'): size") && desc.contains("nothing applied"),
            "{desc}"
        );
        assert!(inbox.sent().is_empty());
        // Back in the file: served again.
        std::fs::write(
            &path,
            format!("{changed}[[tenant]]\nname = 'b'\nsize = '1m'\n"),
        )
        .unwrap();
        let v = ask(&c, r#"{"execute": "reload"}"#);
        assert_eq!(v["return"]["changes"], json!(["resumed b"]), "{v}");
    }
}
