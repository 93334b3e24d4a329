//! The live server (`ioshare serve`): every tenant is an NBD export. A thread per new
//! connection runs the handshake (the [`crate::nbd`] codec), then hands the socket to
//! the `engine` thread, which reads requests, runs the same [`crate::policy::Policy`]
//! objects as the simulator in wall-clock time, does the I/O and writes replies, all on
//! one io_uring ring.
//!
//! SIGTERM or SIGINT: stop accepting and reading, serve what was received (at most
//! `drain_timeout_s` for what the policy still holds), sync every file, exit 0.
//!
//! SIGHUP: read the configuration file again and apply changed weights, SLOs,
//! reservations and limits (and `interval_s`) to the running policy. Anything else
//! that changed needs a restart; the reload says what and applies nothing.

// Signal handlers that only store to atomics, and poll on the listeners.
#![allow(unsafe_code)]

pub(crate) mod backend;
pub(crate) mod budget;
pub(crate) mod capture;
pub mod config;
pub(crate) mod conn;
pub mod control;
pub(crate) mod core;
pub(crate) mod engine;
mod error;
pub mod front;
pub(crate) mod gate;
pub(crate) mod identity;
pub mod logs;
pub(crate) mod lookups;
pub(crate) mod prometheus;
pub mod rbd;
pub(crate) mod service;
pub(crate) mod stats;
pub mod swarm;
pub(crate) mod tls;
pub(crate) mod watch;

use crate::metrics::Recorder;
use crate::metrics::ScenarioResult;
use crate::nbd::{Event, ExportInfo, ServerCodec, TlsPolicy};
use crate::types::TenantId;
pub use backend::BackendError;
pub use capture::CaptureError;
use config::ServerConfig;
use conn::{Attach, Slot};
pub use engine::EngineError;
use engine::EngineHandle;
use error::ConnectionError;
pub use error::ServeError;
use gate::{Entry, ExportPlaces, Gate};
pub use prometheus::MetricsError;
use stats::LiveStats;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
pub use tls::TlsError;

static STOP: AtomicBool = AtomicBool::new(false);
static RELOAD: AtomicBool = AtomicBool::new(false);
/// TLS connections whose relay still runs (a drain waits for them to flush).
static RELAYS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

extern "C" fn on_signal(signal: libc::c_int) {
    if signal == libc::SIGHUP {
        RELOAD.store(true, Ordering::SeqCst);
    } else {
        STOP.store(true, Ordering::SeqCst);
    }
}

/// A client connection over either kind of socket.
#[derive(Debug)]
enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Stream {
    fn try_clone(&self) -> std::io::Result<Stream> {
        Ok(match self {
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
        })
    }
    fn shutdown(&self, how: Shutdown) {
        let _ = match self {
            Stream::Unix(s) => s.shutdown(how),
            Stream::Tcp(s) => s.shutdown(how),
        };
    }
    /// Bounds every blocking read and write (`None`: no bound).
    fn set_timeouts(&self, t: Option<std::time::Duration>) -> std::io::Result<()> {
        match self {
            Stream::Unix(s) => {
                s.set_read_timeout(t)?;
                s.set_write_timeout(t)
            }
            Stream::Tcp(s) => {
                s.set_read_timeout(t)?;
                s.set_write_timeout(t)
            }
        }
    }
}

impl Stream {
    /// Who is connected, for the per-peer log budget: a TCP client's address without
    /// its port, `local` on the Unix socket.
    fn peer(&self) -> Arc<str> {
        match self {
            Stream::Unix(s) => local_peer(s),
            Stream::Tcp(s) => match s.peer_addr().map(|a| a.ip()) {
                Ok(std::net::IpAddr::V6(ip)) if ip.to_ipv4_mapped().is_none() => {
                    let s = ip.segments();
                    format!("{:x}:{:x}:{:x}:{:x}::/64", s[0], s[1], s[2], s[3]).into()
                }
                Ok(ip) => ip.to_canonical().to_string().into(),
                Err(_) => "unknown".into(),
            },
        }
    }
}

/// A Unix-socket client as a peer: its process (`SO_PEERCRED`), so one process's flood
/// of connections counts against its own limit, not every local client's.
fn local_peer(s: &UnixStream) -> Arc<str> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cred`, which outlives the call.
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc == 0 && cred.pid > 0 {
        format!("local pid {} (uid {})", cred.pid, cred.uid).into()
    } else {
        "local".into()
    }
}

impl AsRawFd for Stream {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        match self {
            Stream::Unix(s) => s.as_raw_fd(),
            Stream::Tcp(s) => s.as_raw_fd(),
        }
    }
}

/// A handshaking connection: in the clear, or over TLS once the client started it.
enum Transport {
    Plain(Stream),
    Tls(Box<rustls::StreamOwned<rustls::ServerConnection, Stream>>),
    Psk(Box<openssl::ssl::SslStream<tls::Prepended<Stream>>>),
}

impl Read for Transport {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Transport::Plain(s) => s.read(buf),
            Transport::Tls(s) => s.read(buf),
            Transport::Psk(s) => s.read(buf),
        }
    }
}

impl Write for Transport {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Transport::Plain(s) => s.write(buf),
            Transport::Tls(s) => s.write(buf),
            Transport::Psk(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Transport::Plain(s) => s.flush(),
            Transport::Tls(s) => s.flush(),
            Transport::Psk(s) => s.flush(),
        }
    }
}

/// What the handshake offers: the TLS policy for connections on the TCP listener and
/// on the Unix socket, and the configuration that serves it.
#[derive(Clone)]
struct TlsOffer {
    tcp: TlsPolicy,
    unix: TlsPolicy,
    config: Option<tls::Credentials>,
}

impl TlsOffer {
    fn new(tls: &config::Tls) -> Result<TlsOffer, TlsError> {
        let (tcp, unix) = match tls.mode {
            config::TlsMode::Off => (TlsPolicy::Off, TlsPolicy::Off),
            config::TlsMode::On => (TlsPolicy::Offered, TlsPolicy::Offered),
            config::TlsMode::Require => (TlsPolicy::Required, TlsPolicy::Offered),
        };
        let config = match tls.mode {
            config::TlsMode::Off => None,
            _ => Some(tls::credentials(tls)?),
        };
        Ok(TlsOffer { tcp, unix, config })
    }

    fn policy(&self, stream: &Stream) -> TlsPolicy {
        match stream {
            Stream::Tcp(_) => self.tcp,
            Stream::Unix(_) => self.unix,
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(buf),
            Stream::Tcp(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write(buf),
            Stream::Tcp(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Open connections, so shutdown can stop their readers.
type Registry = Arc<Mutex<HashMap<u64, Handshaking>>>;

/// A connection in its handshake, as the accept loop sees it: a clone of its socket, to
/// shut down (at a drain, for a newcomer, or past its deadline), and when its
/// handshake must be done.
struct Handshaking {
    stream: Stream,
    deadline: Instant,
}

/// Runs the server until SIGTERM/SIGINT. `source` is the configuration file SIGHUP
/// reloads (`None`: SIGHUP is ignored). With `out` (a folder, created now), the run is
/// recorded and its result returned at shutdown, in the simulator's form, for the
/// caller to write there (`report::write_all`). With `capture` (a file and its size
/// limit), every request is recorded there as it arrives (`server::capture`).
pub fn serve(
    mut config: ServerConfig,
    source: Option<PathBuf>,
    out: Option<PathBuf>,
    capture: Option<(PathBuf, u64)>,
    pidfile: Option<PathBuf>,
    log_format: logs::LogFormat,
) -> Result<Option<ScenarioResult>, ServeError> {
    logs::install(log_format);
    // Read first, before any thread could read the environment.
    let inherited = service::inherited()?;
    let notifier = service::Notifier::from_env();
    // Found out now, not after hours of serving.
    create_out(out.as_deref())?;
    let specs = config.specs();
    check_policy(&config)?;
    let run_files = (pidfile.as_ref(), capture.as_ref());
    check_run_files(&mut config, run_files, source.as_deref())?;
    let mut files = backend::Files::open(&config)?;
    // Removed again if anything below fails: a failed start leaves nothing it made.
    let created = files.take_created();
    // On a thread of its own: looking at an image on a hung file system blocks.
    files.watch().spawn();
    let model = emulated_model(&config);
    let stats = Arc::new(LiveStats::new(
        &specs
            .iter()
            .map(|s| (s.name.clone(), s.weight))
            .collect::<Vec<_>>(),
    ));
    let offer = TlsOffer::new(&config.tls)?;
    let listeners = Listeners::bind(&config, inherited)?;
    let _pid_file = match &pidfile {
        Some(path) => Some(service::PidFile::create(path).map_err(ServeError::PidFile)?),
        None => None,
    };
    install_signals();
    let metrics_at = spawn_metrics(&config, &stats)?;
    let clock = Instant::now();
    let (handle, inbox) = engine::channel()?;
    let front = bind_front(&config, &stats, &handle, clock)?;
    let recorder = out
        .as_ref()
        .map(|_| Recorder::open(&specs, 0, report_interval(&config)));
    let capture = open_capture(capture.as_ref(), &specs)?;
    let cost = config.cost_model(model.as_deref());
    let policy = engine_policy(&config, &specs, &cost)?;
    let engine_thread = {
        let (config, stats) = (config.clone(), stats.clone());
        std::thread::Builder::new()
            .name("engine".into())
            .spawn(move || {
                engine::run(
                    &config, files, policy, cost, model, inbox, stats, clock, recorder, capture,
                )
            })
            .map_err(ServeError::Thread)?
    };
    created.keep();
    if let Some(front) = front {
        front.spawn().map_err(ServeError::Thread)?;
    }
    let gate = Gate::of(&config);
    let (control, _control_socket) =
        start_control(&config, source.clone(), &handle, &gate, &stats)?;
    warn_of_exposure(&config, metrics_at, &listeners);
    tracing::info!(
        "serving {} export(s) on {} with policy {} (queue depth {}, {} engine thread(s)); SIGTERM drains and exits",
        config.tenants.len(),
        listeners.describe(&config),
        config.policy_described(),
        config.queue_depth,
        config.threads
    );
    warn_of_unkept(&config);
    // Ready: the listeners are bound and the engine runs, so a client is accepted.
    let notify = |state: &str| notifier.iter().for_each(|n| n.send(state));
    notify(&format!(
        "READY=1\nSTATUS=serving {} export(s) on {}",
        config.tenants.len(),
        listeners.describe(&config)
    ));
    let registry = accept_until_stopped(
        &config,
        (&control, gate),
        &listeners,
        &handle,
        &stats,
        &offer,
        &|| engine_thread.is_finished(),
    );
    // Every tenant held at the end, added ones included, is in the summary.
    let config = control.lock().expect("control lock").config().clone();
    notify("STOPPING=1\nSTATUS=draining: serving what was received, then syncing");
    let outcome = stop(&config, listeners, &registry, handle, engine_thread)?;
    Ok(summarize(&config, &stats, outcome, out.is_some(), clock))
}

/// `serve --out`'s folder, created.
fn create_out(out: Option<&std::path::Path>) -> Result<(), ServeError> {
    match out {
        Some(dir) => std::fs::create_dir_all(dir).map_err(|source| ServeError::Output {
            dir: dir.to_path_buf(),
            source,
        }),
        None => Ok(()),
    }
}

/// No image may be a file this run writes: `--pidfile` or `--capture` (checked before
/// either is opened, and kept for `add-tenant` to check against).
fn check_run_files(
    config: &mut ServerConfig,
    (pidfile, capture): (Option<&PathBuf>, Option<&(PathBuf, u64)>),
    source: Option<&std::path::Path>,
) -> Result<(), ServeError> {
    let run_files = [("--pidfile", pidfile), ("--capture", capture.map(|c| &c.0))]
        .into_iter()
        .filter_map(|(what, p)| Some((what.to_string(), p?.clone())))
        .collect();
    config.with_run_files(run_files, source).map_err(|e| {
        let file = source.map_or("the configuration".into(), |f| f.display().to_string());
        ServeError::Config(e.in_file(&file))
    })
}

/// The policy the engine runs: the configuration's, or on a cluster's front the gate
/// holding the limits the fronts agree on (nothing of its own).
fn engine_policy(
    config: &ServerConfig,
    specs: &[crate::types::TenantSpec],
    cost: &crate::device::cost::CostModel,
) -> Result<Box<dyn crate::policy::Policy>, ServeError> {
    if config.cluster.is_some() {
        return Ok(Box::new(crate::limits::throttle::Limited::new(
            specs.len(),
            crate::limits::throttle::default_slice(cost),
        )));
    }
    Ok(crate::policy::build_on(
        &config.policy.name,
        config.policy.params.clone(),
        specs,
        Some(cost),
        config
            .cost_device
            .as_ref()
            .and_then(crate::device::spec::DeviceSpec::actuators),
    )?)
}

/// A cluster's front (`[cluster]`), its socket bound and its peers resolved; `None`
/// for a server on its own.
fn bind_front(
    config: &ServerConfig,
    stats: &Arc<LiveStats>,
    handle: &EngineHandle,
    clock: Instant,
) -> Result<Option<front::Front>, ServeError> {
    let Some(cluster) = &config.cluster else {
        return Ok(None);
    };
    Ok(Some(front::Front::bind(
        config,
        cluster,
        stats.clone(),
        handle.clone(),
        clock,
    )?))
}

/// What the control socket and SIGHUP change, and the socket when `server.control`
/// asks for one (its file removed when dropped).
fn start_control(
    config: &ServerConfig,
    source: Option<PathBuf>,
    handle: &EngineHandle,
    gate: &Gate,
    stats: &Arc<LiveStats>,
) -> Result<(Arc<Mutex<control::Control>>, Option<SocketFile>), ServeError> {
    let control = Arc::new(Mutex::new(control::Control::new(
        config.clone(),
        source,
        handle.clone(),
        gate.exports().clone(),
        stats.clone(),
    )));
    let socket = match &config.control {
        Some(path) => {
            let listener = bind_unix(path, "server.control")?;
            control::spawn(listener, control.clone()).map_err(ServeError::Thread)?;
            Some(SocketFile(path.clone()))
        }
        None => None,
    };
    Ok((control, socket))
}

/// The metrics endpoint, when `server.metrics` asks for one: where it listens.
fn spawn_metrics(
    config: &ServerConfig,
    stats: &Arc<LiveStats>,
) -> Result<Option<std::net::SocketAddr>, ServeError> {
    let Some(addr) = &config.metrics else {
        return Ok(None);
    };
    let source = prometheus::MetricsSource {
        stats: stats.clone(),
        policy: config.policy.label.clone(),
    };
    Ok(Some(prometheus::spawn(addr, source)?))
}

/// The capture file `serve --capture` asks for, with its size limit.
fn open_capture(
    capture: Option<&(PathBuf, u64)>,
    specs: &[crate::types::TenantSpec],
) -> Result<Option<capture::Capture>, ServeError> {
    let Some((path, limit)) = capture else {
        return Ok(None);
    };
    let names: Vec<String> = specs.iter().map(|s| s.name.clone()).collect();
    Ok(Some(capture::Capture::open(path, &names, *limit)?))
}

/// The emulated device model, when the configuration asks for one (built now: an aged
/// SSD takes a while).
fn emulated_model(config: &ServerConfig) -> Option<Box<dyn crate::device::DeviceModel>> {
    config.emulated.as_ref().map(|(device, seed)| {
        let t = Instant::now();
        let model = device.build(*seed);
        tracing::info!(
            "emulating {} (built in {:.1} s)",
            device.describe(),
            t.elapsed().as_secs_f64()
        );
        model
    })
}

/// SIGTERM, SIGINT and SIGHUP set flags the accept loop reads.
fn install_signals() {
    // SAFETY: installing a handler that only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGHUP, on_signal as *const () as libc::sighandler_t);
    }
}

/// The accept loop ended: stops listening, stops every connection's reading, drains
/// the engine and waits for it and for the TLS relays. The engine may have stopped on
/// its own (an error, a panic): nothing was being served, so the server stops with it,
/// non-zero, for a supervisor to restart it.
fn stop(
    config: &ServerConfig,
    listeners: Listeners,
    registry: &Registry,
    handle: EngineHandle,
    engine_thread: std::thread::JoinHandle<Result<engine::Outcome, engine::EngineError>>,
) -> Result<engine::Outcome, ServeError> {
    let engine_died = engine_thread.is_finished();
    if engine_died {
        tracing::warn!("the engine stopped while serving; closing every connection");
    } else {
        tracing::info!("stopping: serving what was received, then syncing");
    }
    drop(listeners);
    if let Some(p) = &config.unix {
        let _ = std::fs::remove_file(p);
    }
    for h in registry.lock().expect("registry").values() {
        h.stream.shutdown(Shutdown::Read);
    }
    handle.drain();
    drop(handle);
    let outcome = joined(engine_thread, engine_died)?;
    // The engine closed its ends; TLS relays send what is left and close.
    let waiting = Instant::now();
    while RELAYS.load(Ordering::SeqCst) > 0 && waiting.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(outcome)
}

/// The policy, checked before an emulated device is built (seconds; it is built again
/// on the device's cost model), and said once when it charges by a default model.
fn check_policy(config: &ServerConfig) -> Result<(), ServeError> {
    if config.cluster.is_some() {
        return Ok(());
    }
    let policy = crate::policy::build(
        &config.policy.name,
        config.policy.params.clone(),
        &config.specs(),
    )?;
    // `none` charges nothing: no model to speak of.
    if config.cost_device.is_none()
        && policy.name() != "none"
        && policy.currency() == crate::device::cost::Currency::DeviceTime
    {
        tracing::info!(
            "policy '{}' shares device time, and nothing says what this backend's requests cost: it charges them by the default SSD model (Linux blk-iocost's defaults; `ioshare calibrate --out` fits one for this device, for backend.cost_device)",
            config.policy.label
        );
    }
    Ok(())
}

/// The engine's end: its outcome, or why there is none (an error, a panic, or it
/// stopped without being asked: `died`).
fn joined(
    engine: std::thread::JoinHandle<Result<engine::Outcome, engine::EngineError>>,
    died: bool,
) -> Result<engine::Outcome, ServeError> {
    match engine.join() {
        Ok(Ok(_)) if died => Err(ServeError::EngineStopped),
        Ok(outcome) => Ok(outcome?),
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "no message".into());
            Err(ServeError::EnginePanicked(what))
        }
    }
}

/// Says at start what the tenants write that the policy does not keep (`none`'s
/// weights, a weight policy's SLOs: [`crate::policy::unkept`]).
fn warn_of_unkept(config: &ServerConfig) {
    let specs: Vec<crate::types::TenantSpec> =
        config.tenants.iter().map(|t| t.spec.clone()).collect();
    for line in crate::policy::unkept(&config.policy.name, &specs) {
        tracing::warn!("{line}");
    }
}

/// The start-up lines on what is reachable from other machines: the metrics endpoint,
/// and a TCP listener without TLS or without client authentication.
fn warn_of_exposure(
    config: &ServerConfig,
    metrics_at: Option<std::net::SocketAddr>,
    listeners: &Listeners,
) {
    if let Some(a) = metrics_at {
        tracing::info!("metrics on http://{a}/metrics");
        if !a.ip().is_loopback() {
            tracing::warn!(
                "server.metrics ({a}) is reachable beyond this machine: tenant names and their I/O figures are readable by anyone who can connect"
            );
        }
    }
    if let Some(a) = listeners.tcp.as_ref().and_then(|l| l.local_addr().ok())
        && !a.ip().is_loopback()
    {
        let authenticated = config.tls.client_ca.is_some() || config.tls.psk.is_some();
        match (config.tls.mode, authenticated) {
            (config::TlsMode::Require, true) => {}
            (config::TlsMode::Require, false) => tracing::warn!(
                "server.tcp ({a}) is reachable beyond this machine; TLS encrypts it, but any client that trusts the certificate may connect (server.tls_client_ca asks clients for certificates)"
            ),
            _ => tracing::warn!(
                "server.tcp ({a}) is reachable beyond this machine and TLS is not required (server.tls): anyone who can connect reads and writes the exports"
            ),
        }
    }
}

/// The closing lines per tenant, and when the run was recorded, its result.
fn summarize(
    config: &ServerConfig,
    stats: &LiveStats,
    outcome: engine::Outcome,
    recorded: bool,
    clock: Instant,
) -> Option<ScenarioResult> {
    let snapshot = stats.snapshot();
    for (t, c) in snapshot.iter().zip(&config.tenants) {
        let journal = if c.cache == config::Cache::Pdc {
            format!(
                "; pdc: {} journal group(s), {} bypassed the host cache",
                t.journal_groups,
                crate::units::format_bytes(t.journal_bytes)
            )
        } else {
            String::new()
        };
        tracing::info!(
            tenant = %t.name,
            completed = t.completed,
            read_bytes = t.read_bytes,
            written_bytes = t.written_bytes,
            errors = t.answered_error_total(),
            refused = t.refused,
            held_back = t.held_back,
            "{}: {} requests, {} read, {} written, {} error{}{}, {} refused, {} held back{journal}",
            t.name,
            t.completed,
            crate::units::format_bytes(t.read_bytes),
            crate::units::format_bytes(t.written_bytes),
            t.answered_error_total(),
            if t.answered_error_total() == 1 {
                ""
            } else {
                "s"
            },
            stats::reasons(&t.errors_by_reason()),
            t.refused,
            t.held_back
        );
    }
    recorded.then(|| live_result(config, outcome, &snapshot, clock.elapsed().as_secs_f64()))
}

/// The sockets clients connect to.
struct Listeners {
    unix: Option<UnixListener>,
    tcp: Option<TcpListener>,
    /// When an accept failure (out of descriptors, say) was last logged.
    failure_logged: Mutex<Option<Instant>>,
    /// The unix socket's file, removed when the listeners go (a start that fails after
    /// binding leaves no socket behind).
    _socket: Option<SocketFile>,
}

/// A socket file this server bound; removed when dropped.
struct SocketFile(PathBuf);

impl Drop for SocketFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Accept failures are logged at most this often; the loop backs off after one.
const ACCEPT_FAILURE_LOG_EVERY: Duration = Duration::from_secs(10);

/// Closes the connection that has been in its handshake longest (the registry holds
/// only connections still handshaking; the lowest number came first). False when none
/// is: every connection is served.
fn evict_oldest_handshake(registry: &Registry) -> bool {
    let mut handshaking = registry.lock().expect("registry");
    let Some(&oldest) = handshaking.keys().min() else {
        return false;
    };
    let h = handshaking.remove(&oldest).expect("present");
    h.stream.shutdown(Shutdown::Both);
    true
}

/// Closes every connection whose handshake has run past its deadline: the read timeout
/// bounds each read, this the whole handshake (a client sending a byte a second, a TLS
/// ClientHello included, renewed the read timeout with every byte).
fn close_overdue_handshakes(registry: &Registry, now: Instant) {
    registry.lock().expect("registry").retain(|_, h| {
        let overdue = now >= h.deadline;
        if overdue {
            h.stream.shutdown(Shutdown::Both);
        }
        !overdue
    });
}

impl Listeners {
    /// Listens where the configuration says, or on what a service manager handed over
    /// (in place of the setting of the same kind); non-blocking, so one poll serves
    /// both.
    fn bind(config: &ServerConfig, inherited: service::Inherited) -> Result<Listeners, ServeError> {
        let (unix, socket) = match (inherited.unix, &config.unix) {
            // The manager's socket file is the manager's: not removed at exit.
            (Some(l), _) => (Some(l), None),
            (None, Some(path)) => (
                Some(bind_unix(path, "server.unix")?),
                Some(SocketFile(path.clone())),
            ),
            (None, None) => (None, None),
        };
        let tcp = match (inherited.tcp, &config.tcp) {
            (Some(l), _) => Some(l),
            (None, None) => None,
            (None, Some(addr)) => Some(
                TcpListener::bind(addr)
                    .and_then(|l| l.set_nonblocking(true).map(|()| l))
                    .and_then(|l| deepest_backlog(l.as_raw_fd()).map(|()| l))
                    .map_err(|source| ServeError::Listen {
                        setting: "server.tcp",
                        at: addr.to_string(),
                        source,
                    })?,
            ),
        };
        Ok(Listeners {
            unix,
            tcp,
            failure_logged: Mutex::new(None),
            _socket: socket,
        })
    }

    fn fds(&self) -> impl Iterator<Item = std::os::fd::RawFd> {
        [
            self.unix.as_ref().map(|l| l.as_raw_fd()),
            self.tcp.as_ref().map(|l| l.as_raw_fd()),
        ]
        .into_iter()
        .flatten()
    }

    /// `unix:PATH, tcp:ADDR` for the start-up line.
    fn describe(&self, config: &ServerConfig) -> String {
        let mut listening = Vec::new();
        if let Some(l) = &self.unix {
            match l.local_addr().ok().as_ref().and_then(|a| a.as_pathname()) {
                Some(p) => listening.push(format!("unix:{}", p.display())),
                None => listening.push(format!(
                    "unix:{}",
                    config
                        .unix
                        .as_deref()
                        .unwrap_or(std::path::Path::new("?"))
                        .display()
                )),
            }
        }
        if let Some(l) = &self.tcp {
            match l.local_addr() {
                Ok(at) => listening.push(format!("tcp:{at}")),
                Err(_) => listening.push(format!("tcp:{}", config.tcp.as_deref().unwrap_or("?"))),
            }
        }
        listening.join(", ")
    }

    /// Waits up to `timeout_ms` for a connection, then hands every waiting one to `on`.
    fn accept(&self, timeout_ms: i32, on: impl Fn(Stream)) {
        let mut fds: Vec<libc::pollfd> = self
            .fds()
            .map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: `fds` is a valid array of pollfd for the call's duration.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
        // An accepted socket does not inherit the listener's O_NONBLOCK: it blocks, as
        // the handshake wants.
        if let Some(l) = &self.unix {
            loop {
                match l.accept() {
                    Ok((s, _)) => on(Stream::Unix(s)),
                    Err(e) => {
                        self.failed(e);
                        break;
                    }
                }
            }
        }
        if let Some(l) = &self.tcp {
            loop {
                match l.accept() {
                    Ok((s, _)) => on(Stream::Tcp(s)),
                    Err(e) => {
                        self.failed(e);
                        break;
                    }
                }
            }
        }
    }

    /// An accept failed: nothing waiting is no failure; anything else (out of
    /// descriptors, most likely) is logged once in a while and backed off from, as the
    /// connection still waits and the next poll returns at once.
    fn failed(&self, e: std::io::Error) {
        if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::Interrupted
        {
            return;
        }
        let mut logged = self.failure_logged.lock().expect("failure_logged");
        if logged.is_none_or(|at| at.elapsed() >= ACCEPT_FAILURE_LOG_EVERY) {
            tracing::warn!(
                "cannot accept a connection: {e} (idle clients holding descriptors? raise `ulimit -n`); backing off, next report in {} s",
                ACCEPT_FAILURE_LOG_EVERY.as_secs()
            );
            *logged = Some(Instant::now());
        }
        drop(logged);
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Threads accepting connections: under a flood of connections from one process, two
/// threads accept (and close what the gate refuses) where one could not keep the
/// kernel's backlog clear for other processes' clients.
const ACCEPT_THREADS: usize = 2;

/// What the accepting threads share: the gate's decisions, the refusals logged, and
/// the connections' numbers.
struct Admission {
    gate: Gate,
    refused: Refusals,
    next_conn: u64,
    /// When the accept loop started (the gate's clock).
    started: Instant,
}

/// Accepts connections (each handshakes on a thread of its own; [`ACCEPT_THREADS`]
/// accept), reloads on SIGHUP and prints the per-tenant line, until SIGTERM/SIGINT or
/// until `engine_gone` (checked at least every 0.2 s). Returns the connections still
/// handshaking.
fn accept_until_stopped(
    config: &ServerConfig,
    (control, gate): (&Mutex<control::Control>, Gate),
    listeners: &Listeners,
    handle: &EngineHandle,
    stats: &LiveStats,
    offer: &TlsOffer,
    engine_gone: &(dyn Fn() -> bool + Sync),
) -> Registry {
    let registry: Registry = Arc::new(Mutex::new(HashMap::new()));
    let mut interval_s = config.interval_s;
    let mut last = (Instant::now(), stats.snapshot());
    let admission = Mutex::new(Admission {
        gate,
        refused: Refusals::default(),
        next_conn: 0,
        started: Instant::now(),
    });
    let done = AtomicBool::new(false);
    let admit = |stream: Stream| admit(config, &admission, stream, handle, &registry, offer);
    std::thread::scope(|scope| {
        for _ in 1..ACCEPT_THREADS {
            scope.spawn(|| {
                while !done.load(Ordering::SeqCst) {
                    listeners.accept(200, admit);
                }
            });
        }
        while !STOP.load(Ordering::SeqCst) {
            if engine_gone() {
                break;
            }
            if RELOAD.swap(false, Ordering::SeqCst) {
                let mut control = control.lock().expect("control lock");
                if let Err(e) = control.reload() {
                    tracing::info!("reload: {e}");
                }
                interval_s = control.config().interval_s;
            }
            {
                let mut a = admission.lock().expect("admission");
                let now = a.started.elapsed().as_nanos() as u64;
                a.gate.tidy(now);
            }
            close_overdue_handshakes(&registry, Instant::now());
            listeners.accept(200, admit);
            print_interval(interval_s, stats, &mut last);
        }
        done.store(true, Ordering::SeqCst);
    });
    registry
}

/// A new connection, let in (its handshake started on a thread of its own) or closed,
/// as the gate says.
fn admit(
    config: &ServerConfig,
    admission: &Mutex<Admission>,
    stream: Stream,
    handle: &EngineHandle,
    registry: &Registry,
    offer: &TlsOffer,
) {
    let peer = stream.peer();
    let local = matches!(stream, Stream::Unix(_));
    let max = config.max_connections;
    let (places, id, exports) = {
        let mut a = admission.lock().expect("admission");
        let now = a.started.elapsed().as_nanos() as u64;
        let places = match a
            .gate
            .arrive(&peer, local, now, || evict_oldest_handshake(registry))
        {
            Entry::In { places, evicted } => {
                if evicted {
                    a.refused.log_full(max, true);
                }
                places
            }
            // Closed as it is dropped: a flood of clients cannot take every descriptor.
            Entry::PeerFull { limit } => return a.refused.log_peer(limit, &peer),
            Entry::PeerTooFast { per_second, burst } => {
                return a.refused.log_pace((per_second, burst), &peer);
            }
            Entry::Full => return a.refused.log_full(max, false),
        };
        a.next_conn += 1;
        (places, a.next_conn, a.gate.exports().clone())
    };
    if let Stream::Tcp(s) = &stream {
        let _ = s.set_nodelay(true);
    }
    spawn_connection(
        stream,
        id,
        config.handshake_timeout,
        places,
        &exports,
        handle,
        registry,
        offer,
    );
}

/// When the refusals at accept were last logged (each kind at most every
/// [`ACCEPT_FAILURE_LOG_EVERY`]).
#[derive(Default)]
struct Refusals {
    full: Option<Instant>,
    peer: Option<Instant>,
    pace: Option<Instant>,
}

impl Refusals {
    /// Whether a refusal last logged at `at` may be logged again now (and notes it).
    fn due(at: &mut Option<Instant>) -> bool {
        let due = at.is_none_or(|t| t.elapsed() >= ACCEPT_FAILURE_LOG_EVERY);
        if due {
            *at = Some(Instant::now());
        }
        due
    }

    /// `max_connections` reached: handshakes closed for new connections (`evicted`), or
    /// new connections closed.
    fn log_full(&mut self, max: u32, evicted: bool) {
        if Self::due(&mut self.full) {
            tracing::warn!(
                "server.max_connections ({max}) reached: {} (reported every {} s)",
                if evicted {
                    "closing the connections longest in their handshake for new ones"
                } else {
                    "every one is served or closing; closing new connections"
                },
                ACCEPT_FAILURE_LOG_EVERY.as_secs()
            );
        }
    }

    /// A peer opening connections faster than it is let in.
    fn log_pace(&mut self, (per_second, burst): (usize, usize), peer: &str) {
        if Self::due(&mut self.pace) {
            tracing::warn!(
                "{peer} opens connections faster than {per_second} a second (after a burst of {burst}): closing its new connections at once (reported every {} s)",
                ACCEPT_FAILURE_LOG_EVERY.as_secs()
            );
        }
    }

    /// A peer at its limit.
    fn log_peer(&mut self, limit: usize, peer: &str) {
        if Self::due(&mut self.peer) {
            tracing::warn!(
                "server.max_connections_per_peer ({limit}) reached by {peer}: closing its new connections (reported every {} s)",
                ACCEPT_FAILURE_LOG_EVERY.as_secs()
            );
        }
    }
}

/// The per-tenant line every `interval_s` (0: never), when anything completed since.
fn print_interval(
    interval_s: f64,
    stats: &LiveStats,
    last: &mut (Instant, Vec<stats::TenantCounters>),
) {
    if interval_s <= 0.0 || last.0.elapsed().as_secs_f64() < interval_s {
        return;
    }
    let now = stats.snapshot();
    let secs = last.0.elapsed().as_secs_f64();
    if now.len() != last.1.len()
        || now
            .iter()
            .zip(&last.1)
            .any(|(n, b)| n.completed != b.completed)
    {
        for i in stats::interval_lines(&last.1, &now, secs) {
            tracing::info!(
                target: logs::INTERVAL,
                tenant = %i.tenant,
                mb_s = i.mb_s,
                iops = i.iops,
                p99_us = i.p99_us,
                share_pct = i.share_pct,
                ideal_pct = i.ideal_pct,
                errors = i.errors,
                refused = i.refused,
                "{}",
                i.text
            );
        }
    }
    *last = (Instant::now(), now);
}

/// The report's interval: the terminal line's, or a second when that is off.
fn report_interval(config: &ServerConfig) -> crate::types::Nanos {
    let secs = if config.interval_s > 0.0 {
        config.interval_s
    } else {
        1.0
    };
    crate::types::secs_to_nanos(secs)
}

/// The live run as the simulator reports a scenario: one run (the configured policy),
/// measured from the server's start to the end of its drain.
fn live_result(
    config: &ServerConfig,
    outcome: engine::Outcome,
    counters: &[stats::TenantCounters],
    wall_seconds: f64,
) -> ScenarioResult {
    let host_cache = serde_json::Value::Array(
        config
            .tenants
            .iter()
            .zip(counters)
            .zip(&outcome.journal)
            .map(|((t, c), groups)| {
                let mut o = serde_json::json!({ "tenant": t.spec.name, "cache": t.cache.name() });
                if let Some(groups) = groups {
                    o["journal_group_bytes"] = config.pdc.group_bytes.into();
                    o["journal_groups"] = serde_json::json!(groups);
                    o["journal_writes"] = c.journal_writes.into();
                    o["journal_bypassed_bytes"] = c.journal_bytes.into();
                }
                o
            })
            .collect(),
    );
    let mut recorder = outcome.recorder.expect("recorded with --out");
    recorder.end_at(outcome.end);
    let specs = config.specs();
    let workloads: Vec<String> = config
        .tenants
        .iter()
        .map(|t| format!("NBD export {}", t.spec.name))
        .collect();
    let device = match &config.emulated {
        Some((device, seed)) => format!("emulated {} (seed {seed})", device.describe()),
        None => format!("{:?} backend, cache {:?}", config.backend, config.cache).to_lowercase(),
    };
    let mut run = recorder.finish(
        &config.policy.label,
        &specs,
        &workloads,
        outcome.device,
        wall_seconds,
        outcome.policy,
    );
    run.policy_name = config.policy.name.clone();
    run.host_cache = host_cache;
    for (t, c) in run.tenants.iter_mut().zip(counters) {
        t.errors = c.errors_by_reason().into_iter().collect();
    }
    ScenarioResult {
        scenario: "live".into(),
        description: format!(
            "ioshare serve: {} tenant(s), policy {}, {device}",
            specs.len(),
            config.policy.label
        ),
        seed: config.emulated.as_ref().map_or(0, |(_, seed)| *seed),
        duration_s: crate::types::nanos_to_secs(outcome.end),
        device,
        runs: vec![run],
    }
}

/// Binds the unix socket with mode 0600, non-blocking, replacing a stale socket (never
/// another file).
fn bind_unix(path: &PathBuf, setting: &'static str) -> Result<UnixListener, ServeError> {
    let listen = |source| ServeError::Listen {
        setting,
        at: path.display().to_string(),
        source,
    };
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(ServeError::SocketPath {
                path: path.clone(),
                why: "exists and is not a socket; not replacing it",
            });
        }
        if UnixStream::connect(path).is_ok() {
            return Err(ServeError::SocketPath {
                path: path.clone(),
                why: "is in use by a running server",
            });
        }
        std::fs::remove_file(path).map_err(listen)?;
    }
    let l = UnixListener::bind(path).map_err(listen)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(listen)?;
    l.set_nonblocking(true).map_err(listen)?;
    deepest_backlog(l.as_raw_fd()).map_err(listen)?;
    Ok(l)
}

/// Sets a listening socket's backlog to the most the kernel allows
/// (`net.core.somaxconn`): clients of other peers keep finding room while one peer's
/// burst of connections is being closed.
fn deepest_backlog(fd: std::os::fd::RawFd) -> std::io::Result<()> {
    // SAFETY: plain syscall on a listening socket this process owns; a backlog past
    // somaxconn is cut to it by the kernel.
    if unsafe { libc::listen(fd, i32::MAX) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn spawn_connection(
    stream: Stream,
    id: u64,
    timeout: std::time::Duration,
    slots: Vec<Slot>,
    limits: &Arc<ExportPlaces>,
    engine: &EngineHandle,
    registry: &Registry,
    offer: &TlsOffer,
) {
    let Ok(clone) = stream.try_clone() else {
        return;
    };
    let deadline = Instant::now() + timeout;
    registry.lock().expect("registry").insert(
        id,
        Handshaking {
            stream: clone,
            deadline,
        },
    );
    let (engine, registry) = (engine.clone(), registry.clone());
    // The exports as they are now: one added later is offered to later connections.
    let exports = limits.infos();
    let limits = limits.clone();
    let tls = (offer.policy(&stream), offer.config.clone());
    let peer = stream.peer();
    let spawned = std::thread::Builder::new()
        .name(format!("conn-{id}"))
        .spawn(move || {
            let handed_off = || {
                registry.lock().expect("registry").remove(&id);
            };
            if let Err(e) = connection(
                stream,
                (id, peer.clone()),
                timeout,
                slots,
                (exports, limits),
                engine,
                tls,
                handed_off,
            ) {
                // A client that hangs up mid-conversation is not news.
                // Nor is one that sat silent past the handshake timeout (logged below
                // would let idle clients fill the log). A TLS handshake cut because this
                // side closed it (its deadline, room for a newcomer: no longer in the
                // registry) is not the client's failure.
                let closed_here =
                    e.in_tls_handshake() && !registry.lock().expect("registry").contains_key(&id);
                if !e.is_gone() && !closed_here {
                    logs::PeerLog::global()
                        .line(&peer, || format!("ioshare: connection {id} ({peer}): {e}"));
                }
            }
            registry.lock().expect("registry").remove(&id);
        });
    if let Err(e) = spawned {
        tracing::warn!("connection {id}: cannot start a thread: {e}");
    }
}

/// Runs one connection's handshake (TLS included, when the client starts it), then
/// hands it to the engine, which serves its requests from then on; over TLS, this
/// thread then relays between the client and the engine ([`tls::relay`]).
/// `handed_off` runs once an export is selected, before the client is told (from then
/// on neither a drain nor an eviction cuts the connection as a handshake).
#[allow(clippy::too_many_arguments)]
fn connection(
    stream: Stream,
    (id, peer): (u64, Arc<str>),
    timeout: std::time::Duration,
    mut slots: Vec<Slot>,
    (exports, limits): (Arc<Vec<ExportInfo>>, Arc<ExportPlaces>),
    engine: EngineHandle,
    (policy, tls): (TlsPolicy, Option<tls::Credentials>),
    handed_off: impl FnOnce(),
) -> Result<(), ConnectionError> {
    // A client that connects and says nothing (or reads nothing) is dropped after
    // `server.handshake_timeout_s`, not kept with its thread and descriptors; the accept
    // loop closes a handshake that takes longer than that in all.
    stream.set_timeouts(Some(timeout))?;
    let mut codec = ServerCodec::with_tls(exports.clone(), policy);
    let Some((export, io)) = handshake(
        Transport::Plain(stream),
        &mut codec,
        &mut slots,
        (id, &peer),
        (&exports, &limits),
        tls,
        handed_off,
    )?
    else {
        return Ok(());
    };
    let attach = |fd: OwnedFd, codec: ServerCodec, slots: Vec<Slot>| {
        // An engine that is gone drops the connection, which closes it.
        let attached = engine.attach(Attach {
            id,
            peer: peer.clone(),
            fd,
            codec,
            tenant: export as TenantId,
            slots,
        });
        if !attached && !STOP.load(Ordering::SeqCst) {
            tracing::warn!("connection {id}: the engine is gone; closed");
        }
    };
    match io {
        Transport::Plain(stream) => {
            stream.set_timeouts(None)?;
            let fd: OwnedFd = match stream {
                Stream::Unix(s) => s.into(),
                Stream::Tcp(s) => s.into(),
            };
            attach(fd, codec, slots);
        }
        Transport::Tls(owned) => {
            let (conn, net) = owned.into_parts();
            net.set_timeouts(None)?;
            relay_from(tls::RustlsSession { conn, net }, codec, slots, attach)?;
        }
        Transport::Psk(ssl) => {
            ssl.get_ref().get_ref().set_timeouts(None)?;
            let session = tls::OpensslSession {
                ssl: *ssl,
                blocked: false,
            };
            relay_from(session, codec, slots, attach)?;
        }
    }
    Ok(())
}

/// A connection's handshake, until its client selects an export (returned with the
/// transport, which may have become TLS) or goes away (`None`). An export at its
/// connection limit is refused and the client may choose again.
fn handshake(
    mut io: Transport,
    codec: &mut ServerCodec,
    slots: &mut Vec<Slot>,
    (id, peer): (u64, &Arc<str>),
    (exports, limits): (&Arc<Vec<ExportInfo>>, &ExportPlaces),
    tls: Option<tls::Credentials>,
    handed_off: impl FnOnce(),
) -> Result<Option<(usize, Transport)>, ConnectionError> {
    let mut buf = vec![0u8; 64 << 10];
    io.write_all(&codec.take_output())?;
    let export = loop {
        let n = io.read(&mut buf)?;
        if n == 0 {
            return Ok(None);
        }
        codec.receive(&buf[..n]);
        // One poll answers every complete option; it stops at an event or for bytes.
        let selected = match codec.poll() {
            Ok(Some(Event::Selected { export })) if !limits.is_open(export) => {
                // Drained or removed since this connection read the exports.
                codec.refuse_selected(&format!(
                    "export '{}' is drained by this server's operator: it takes no connections now",
                    exports[export].name
                ));
                io.write_all(&codec.take_output())?;
                if codec.is_closed() {
                    return Ok(None);
                }
                continue;
            }
            Ok(Some(Event::Selected { export })) => match limits.take(export) {
                Some(served) => {
                    slots.push(served);
                    Some(export)
                }
                None => {
                    refuse_at_tenant_limit(
                        codec,
                        &mut io,
                        (id, peer),
                        &exports[export].name,
                        limits.limit(),
                    )?;
                    if codec.is_closed() {
                        return Ok(None);
                    }
                    continue;
                }
            },
            Ok(Some(Event::Disconnect)) => {
                io.write_all(&codec.take_output())?;
                return Ok(None);
            }
            Ok(Some(Event::StartTls)) => {
                io.write_all(&codec.take_output())?;
                let (Transport::Plain(plain), Some(credentials)) = (io, tls.clone()) else {
                    unreachable!("the codec starts TLS once, where it is offered");
                };
                io = start_tls(plain, credentials, codec.take_unparsed())?;
                codec.tls_started();
                None
            }
            Ok(Some(_)) => unreachable!("requests come only after an export is selected"),
            Ok(None) => None,
            Err(e) => {
                let _ = io.write_all(&codec.take_output());
                return Err(ConnectionError::Protocol(e));
            }
        };
        if let Some(e) = selected {
            // Out of the registry before the client hears its export is selected: a
            // client that has its answer is served, never evicted as a handshake.
            handed_off();
            io.write_all(&codec.take_output())?;
            break e;
        }
        io.write_all(&codec.take_output())?;
    };
    Ok(Some((export, io)))
}

/// Runs the TLS handshake on a connection whose client sent `NBD_OPT_STARTTLS`; `early`
/// is what it sent right behind that option (a ClientHello already on its way).
fn start_tls(
    plain: Stream,
    credentials: tls::Credentials,
    early: Vec<u8>,
) -> Result<Transport, ConnectionError> {
    Ok(match credentials {
        tls::Credentials::X509(config) => {
            let mut conn =
                rustls::ServerConnection::new(config).map_err(|e| ConnectionError::tls("", e))?;
            // All of it (read_tls takes at most 4 KiB at a time), processed,
            // so a whole ClientHello sent early is answered.
            let mut rest = early.as_slice();
            while !rest.is_empty() {
                conn.read_tls(&mut rest)?;
                conn.process_new_packets()
                    .map_err(|e| ConnectionError::tls("", e))?;
            }
            let mut owned = rustls::StreamOwned::new(conn, plain);
            while owned.conn.is_handshaking() {
                owned
                    .conn
                    .complete_io(&mut owned.sock)
                    .map_err(ConnectionError::tls_io)?;
            }
            Transport::Tls(Box::new(owned))
        }
        tls::Credentials::OpenSsl(context) => {
            let ssl = openssl::ssl::Ssl::new(&context).map_err(|e| ConnectionError::tls("", e))?;
            let stream = ssl.accept(tls::Prepended::new(early, plain)).map_err(|e| {
                ConnectionError::tls(
                    " (OpenSSL: with pre-shared keys an unknown identity or a wrong key fails it)",
                    e,
                )
            })?;
            Transport::Psk(Box::new(stream))
        }
    })
}

/// A client selected an export at its `max_connections_per_tenant`: it hears why (or,
/// after `NBD_OPT_EXPORT_NAME`, is closed), and the peer's log says so.
fn refuse_at_tenant_limit(
    codec: &mut ServerCodec,
    io: &mut Transport,
    (id, peer): (u64, &Arc<str>),
    name: &str,
    limit: usize,
) -> std::io::Result<()> {
    // Other tenants keep their places: this one is at its own limit.
    logs::PeerLog::global().line(peer, || {
        format!(
            "ioshare: connection {id}: export '{name}' refused: it has {limit} connections, server.max_connections_per_tenant"
        )
    });
    codec.refuse_selected(&format!(
        "export '{name}' has {limit} connections, this server's limit for one export"
    ));
    io.write_all(&codec.take_output())
}

/// Hands the engine one end of a socket pair and relays between it and the TLS
/// `session` on this thread until the connection ends.
fn relay_from(
    session: impl tls::Session,
    codec: ServerCodec,
    slots: Vec<Slot>,
    attach: impl FnOnce(OwnedFd, ServerCodec, Vec<Slot>),
) -> std::io::Result<()> {
    let (ours, engines) = UnixStream::pair()?;
    RELAYS.fetch_add(1, Ordering::SeqCst);
    attach(engines.into(), codec, slots);
    let relayed = tls::relay(session, ours);
    RELAYS.fetch_sub(1, Ordering::SeqCst);
    relayed
}
