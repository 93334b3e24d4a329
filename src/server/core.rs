//! The live engine's decisions as a sans-I/O state machine: connections past their
//! handshake, back-pressure, the memory budget, the drain and its send grace, the order
//! of replies and the emulated device's timing. It is given events (a connection
//! attached, a receive or a send returned, a request's file I/O returned, a reload, the
//! drain) and the time, and answers with [`Intent`]s (receive into this buffer, send
//! these iovecs, submit this request's next file operation, shut or close this socket)
//! and when it wants to be woken ([`EngineCore::next_wake`]). No clock, socket, ring or
//! thread here: [`super::engine`] runs it on io_uring, [`super::swarm`] runs it on a
//! simulated network and disk with faults, seed by seed.
//!
//! Contract and invariants (asserted where named):
//! * a request is answered once: its `Live` entry is removed when it completes or is
//!   withdrawn (`expect("… is live")`), and a connection's `outstanding` count never
//!   goes below zero (`Conn::reply` runs after `outstanding -= 1`, which panics on
//!   underflow in debug and is checked by the swarm's accounting in release);
//! * memory: the data and reply header of every request from its header's check
//!   ([`budget::may_take`]) until its reply is sent or dropped count in
//!   `inflight_bytes`, which never exceeds `max_inflight_bytes` except for one small
//!   request per connection holding nothing (the rule in [`budget`]); a finished
//!   connection holds nothing (`close_finished`);
//! * a tenant at its `queue_limit` has its connections left unread (back-pressure
//!   through the host's `has_room`);
//! * drain: nothing more is received; what was received is served; at the deadline what
//!   the policy still holds is answered `ESHUTDOWN`; a client that does not take its
//!   replies within [`SEND_GRACE`] after that is cut; the core is done when no request
//!   and no connection is left ([`EngineCore::is_done`]).
//!
//! What a request does on the file backend is [`crate::io::transfer`]'s; admission,
//! dispatch and drain are the [`crate::host`] core the simulator drives too.

use super::backend::Store;
use super::budget;
use super::capture::Arrival;
use super::conn::{Conn, Input, Output};
use super::stats::LiveStats;
use crate::buffer::IoBuf;
use crate::device::driver::Driver;
use crate::device::{DeviceModel, DeviceStats, Finished, Submitted};
use crate::host::{Host, Limits, Refuse, Status};
#[cfg(test)]
use crate::io::transfer::Target;
use crate::io::transfer::{Cache, Next, Transfer};
use crate::journal::{JournalDetector, JournalParams, Verdict};
use crate::metrics::Recorder;
use crate::nbd::proto;
use crate::nbd::{Command, CommandKind, Event, ServerCodec};
use crate::policy::{Admission, Detail, Observation, Policy, Refusal};
use crate::types::{Completion, Nanos, Request, TenantId, TenantSpec};
use rustc_hash::FxHashMap;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;

/// How often the policy's state is published for `/metrics`.
pub const PUBLISH_EVERY: Nanos = 100_000_000;
/// After the drain deadline, how long replies may still take to reach a client before
/// its connection is cut.
pub const SEND_GRACE: Nanos = 1_000_000_000;
/// How often a tenant's reads past the end of its image are logged.
const PAST_END_LOG_EVERY: Nanos = 10_000_000_000;
/// A tenant's backend errors are logged at most this often (the first at once).
const BACKEND_ERROR_LOG_EVERY: Nanos = 10_000_000_000;

/// Whether a request of this kind changes the image's data.
fn changes_data(op: crate::types::Op) -> bool {
    matches!(op, crate::types::Op::Write | crate::types::Op::Trim)
}

/// When a kind of trouble was last logged (per tenant) and how many were not since.
#[derive(Clone, Debug, Default)]
struct Reported {
    at: Option<Nanos>,
    held: u64,
}

impl Reported {
    /// Whether to log one now, at most once `every`: if so, how many were held back
    /// since the last line.
    fn due(&mut self, now: Nanos, every: Nanos) -> Option<u64> {
        if self.at.is_some_and(|at| now < at + every) {
            self.held += 1;
            return None;
        }
        self.at = Some(now);
        Some(std::mem::take(&mut self.held))
    }

    /// What a line says of the `between` held back before it.
    fn since(between: u64) -> String {
        if between > 0 {
            format!(", {between} more since the last report")
        } else {
            String::new()
        }
    }
}
/// Which engine shard serves each connection: the one serving the fewest when it
/// attaches, between equals the next after the last one chosen (so that connections
/// arriving one after another spread too); kept until the connection closes.
#[derive(Debug)]
struct Placement {
    /// Per slot: its connection's shard (kept after the close; the next attach to the
    /// slot places it again).
    homes: Vec<usize>,
    /// Per shard: the connections it serves.
    load: Vec<usize>,
    /// The shard the last connection went to.
    last: usize,
}

impl Placement {
    fn new(shards: usize) -> Self {
        assert!(shards > 0, "at least one shard");
        Placement {
            homes: Vec::new(),
            load: vec![0; shards],
            last: shards - 1,
        }
    }

    /// The connection attached in `slot` gets its shard.
    fn place(&mut self, slot: usize) {
        let n = self.load.len();
        let shard = (0..n)
            .map(|k| (self.last + 1 + k) % n)
            .min_by_key(|&i| self.load[i])
            .expect("at least one shard");
        self.last = shard;
        if self.homes.len() <= slot {
            self.homes.resize(slot + 1, 0);
        }
        self.homes[slot] = shard;
        self.load[shard] += 1;
    }

    /// The connection in `slot` closed.
    fn leave(&mut self, slot: usize) {
        let shard = self.homes[slot];
        self.load[shard] = self.load[shard]
            .checked_sub(1)
            .expect("a connection leaves once");
    }

    fn shard(&self, slot: usize) -> usize {
        self.homes[slot]
    }
}

/// Log lines held for the shell; more are counted, not kept.
const LOG_LIMIT: usize = 4096;

/// What the core needs of the server's configuration.
#[derive(Debug, Clone)]
pub struct CoreConfig {
    /// Requests on the device at once.
    pub queue_depth: u32,
    /// Requests a tenant may have waiting in the host.
    pub queue_limit: u32,
    /// What becomes of a request the policy refuses.
    pub refuse: Refuse,
    /// How long the drain waits for the policy before answering `ESHUTDOWN`.
    pub drain_timeout: Nanos,
    /// When a tenant whose requests do not come back is held to a share of the device
    /// queue ([`crate::host::stall`]); `None`: never.
    pub stall: Option<crate::host::Stall>,
    /// A request its backend has not answered in this long is answered `EIO`.
    pub backend_timeout: Option<Nanos>,
    /// Data and reply bytes all connections may hold at once.
    pub max_inflight_bytes: u64,
    /// The journal detector's parameters (tenants with `cache = "pdc"`).
    pub pdc: JournalParams,
    /// Per tenant: name, export size, cache mode.
    pub tenants: Vec<CoreTenant>,
    /// Engine threads the connections are spread over (`server.threads`): each
    /// connection's intents name its shard ([`EngineCore::home`]).
    pub shards: usize,
}

/// A tenant as the core sees it.
#[derive(Debug, Clone)]
pub struct CoreTenant {
    /// Its export's name (log lines).
    pub name: String,
    /// Its export's size in bytes.
    pub size: u64,
    /// How its requests use the page cache.
    pub cache: Cache,
}

impl CoreConfig {
    /// What the core takes from a server configuration.
    pub fn of(config: &super::config::ServerConfig) -> Self {
        CoreConfig {
            queue_depth: config.queue_depth,
            shards: config.threads.max(1) as usize,
            queue_limit: config.queue_limit,
            refuse: config.refuse,
            drain_timeout: config.drain_timeout,
            stall: config
                .backend_stall
                .map(|after| crate::host::Stall { after }),
            backend_timeout: config.backend_timeout,
            max_inflight_bytes: config.max_inflight_bytes,
            pdc: config.pdc,
            tenants: config
                .tenants
                .iter()
                .map(|t| CoreTenant {
                    name: t.spec.name.clone(),
                    size: t.size,
                    cache: t.cache,
                })
                .collect(),
        }
    }
}

/// What the core asks its shell to do. Connections are named by slot, requests by id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "an intent not carried out stalls its connection or request"]
pub enum Intent {
    /// Receive into [`EngineCore::receive_buffer`]; hand the result to
    /// [`EngineCore::received`].
    Receive(usize),
    /// Send [`EngineCore::send_iov`]; hand the result to [`EngineCore::sent`].
    Send(usize),
    /// Perform [`EngineCore::transfer`]'s next operation; hand the result to
    /// [`EngineCore::io_done`].
    Io(u64),
    /// Shut the socket's reading side: a receive on its way returns.
    ShutRead(usize),
    /// Shut both sides: a send stuck on a client that does not read fails.
    Cut(usize),
    /// The connection is over: close its socket. Its slot may be given to the next
    /// connection attached.
    Close(usize),
    /// Find the allocation of [`EngineCore::block_status_ask`]'s range (holes and data,
    /// `SEEK_DATA`/`SEEK_HOLE`) off the engine's threads; hand the extents to
    /// [`EngineCore::block_status_done`]. The request was dispatched by the policy like
    /// any other and may be answered `EIO` past `backend_timeout` before its extents
    /// come back.
    BlockStatus(u64),
}

/// A block status request the shell is to answer: the file, where the range starts in
/// it, its length, and how many extents at most.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatusAsk {
    /// Whose it is.
    pub tenant: TenantId,
    /// The descriptor of the tenant's file (through the page cache).
    pub fd: std::os::fd::RawFd,
    /// Where the range starts in the file.
    pub at: u64,
    /// Its length.
    pub len: u32,
    /// Extents at most (1 with `NBD_CMD_FLAG_REQ_ONE`).
    pub max_extents: usize,
}

/// A log line for the shell to write: rate-limited per peer when it names one.
#[derive(Debug, Clone)]
pub struct LogLine {
    /// The client it is about.
    pub peer: Option<Arc<str>>,
    /// The line.
    pub text: String,
}

/// Who is waiting for a request's reply.
#[derive(Debug, Clone, Copy)]
struct Submission {
    tenant: TenantId,
    /// Slot of the connection.
    conn: usize,
    handle: u64,
    /// A read's offset (its reply, structured, carries it).
    read_at: Option<u64>,
    /// What the request holds of the memory budget (its data and its reply's header).
    bytes: u64,
}

/// A request the host holds or the backend serves.
struct Live {
    sub: Submission,
    request: Request,
    /// When the policy dispatched it (`None`: still held by the policy).
    start: Option<Nanos>,
    /// What it does on the backend.
    work: Work,
    /// Emulated backend: when the device model finishes the request (`None` while a
    /// deferring model has not decided yet).
    model_finish: Option<Nanos>,
    /// Emulated backend: the device time the model measured it took (a disk's, an
    /// array's heads' time), counted in place of its price.
    model_busy: Option<Nanos>,
    /// Emulated backend: the reply's error once the data I/O is done, while the model's
    /// finish time is still ahead.
    io_result: Option<u32>,
    /// Answered `EIO` past `backend_timeout` while its file operation is still with the
    /// kernel: kept (its buffer is the kernel's until then) and dropped at completion.
    abandoned: bool,
}

/// What a live request does on the backend.
#[derive(Debug)]
enum Work {
    /// Data, a flush or a trim: its transfer.
    Io(Transfer),
    /// A block status: the range to look up.
    Status(StatusAsk),
}

impl Live {
    /// Its transfer (a block status has none: asking is a bug).
    fn io(&mut self) -> &mut Transfer {
        match &mut self.work {
            Work::Io(io) => io,
            Work::Status(_) => panic!("a block status moves no data"),
        }
    }

    /// What it is, where and how long, for a log line.
    fn what(&self) -> (&'static str, u64, u32) {
        match &self.work {
            Work::Io(io) => (io.what(), io.offset(), io.len()),
            Work::Status(ask) => ("block status", ask.at, ask.len),
        }
    }
}

/// What the live engine records: the counters behind the terminal line and `/metrics`,
/// and, with `serve --out`, the run's [`Recorder`].
pub type LiveObserver = (Arc<LiveStats>, Option<Recorder>);

/// What the core hands back when it stops.
pub struct CoreOutcome {
    /// The recorder it was given, with every request of the run in it.
    pub recorder: Option<Recorder>,
    /// The device model's counters (emulated backend), or zeroes.
    pub device: DeviceStats,
    /// The policy's full observation at the end.
    pub policy: Observation,
    /// Per tenant with `cache = "pdc"`, the groups its journal detector marked.
    pub journal: Vec<Option<Vec<usize>>>,
}

/// Bugs a test plants to show the fault swarm catches them.
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Plant {
    /// Reads a connection whose tenant is at its `queue_limit`.
    IgnoreHasRoom,
    /// Lets the memory budget go one byte over.
    BudgetOffByOne,
    /// Answers a flush without syncing the files.
    FlushWithoutSync,
}

/// The engine's state and decisions.
pub struct EngineCore {
    cfg: CoreConfig,
    /// Where each tenant's requests go (`None`: the null backend).
    targets: Vec<Option<Store>>,
    /// Admission, dispatch, drain and recording: the same core the simulator drives.
    host: Host<LiveObserver>,
    /// Emulated backend: the device model, driven as the simulator drives it.
    model: Option<Driver>,
    /// Every request the host holds or the backend serves, by id. Ids are the core's
    /// own (`next_id`), never a client's handle, so an unkeyed hash cannot be steered.
    live: FxHashMap<u64, Live>,
    next_id: u64,
    /// Connections by slot; a slot is reused once its connection is closed.
    conns: Vec<Option<Conn>>,
    /// The engine shard of each connection.
    placement: Placement,
    /// Requests the host withdrew at the drain deadline, to answer `ESHUTDOWN`.
    cancelled: Vec<Request>,
    /// Emulated backend: requests whose data I/O is done, by the model's finish time.
    due: BinaryHeap<Reverse<(Nanos, u64)>>,
    /// File requests by when their backend must have answered (`backend_timeout`).
    timeouts: BinaryHeap<Reverse<(Nanos, u64)>>,
    /// Per tenant: its backend's timeouts, as logged.
    timeouts_logged: Vec<Reported>,
    /// Per tenant: writes (and trims) answered `EIO` past the timeout and not yet back
    /// from the backend; while any is, the tenant's new ones fail at once.
    fenced: Vec<u32>,
    model_done: Vec<Finished>,
    /// Bytes every connection holds of the memory budget.
    inflight_bytes: u64,
    /// When a read past the end of each tenant's image was last logged.
    past_end_logged: Vec<Option<Nanos>>,
    /// Per tenant: its backend's errors, as logged.
    backend_errors: Vec<Reported>,
    /// Per tenant: drained by the control socket (its connections stop being read and
    /// close once answered; new ones are refused) until resumed.
    closed: Vec<bool>,
    /// Per tenant with `cache = "pdc"`, its journal detector (fed every write as it
    /// arrives).
    detectors: Vec<Option<JournalDetector>>,
    /// `serve --capture`: requests as they arrive, until the shell takes them.
    arrivals: Option<Vec<Arrival>>,
    intents: Vec<Intent>,
    logs: Vec<LogLine>,
    logs_lost: u64,
    last_publish: Option<Nanos>,
    /// Testing only: panic when this many requests have arrived.
    panic_after: Option<u64>,
    #[cfg(test)]
    plant: Option<Plant>,
}

impl EngineCore {
    /// A core serving `cfg`'s tenants on `targets` (one per tenant), with `policy`.
    /// With `capture`, arrivals are kept for [`Self::take_arrivals`].
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        cfg: CoreConfig,
        targets: Vec<Option<Store>>,
        policy: Box<dyn Policy>,
        cost: crate::device::cost::CostModel,
        model: Option<Box<dyn DeviceModel>>,
        stats: Arc<LiveStats>,
        recorder: Option<Recorder>,
        capture: bool,
    ) -> Self {
        assert_eq!(targets.len(), cfg.tenants.len(), "a target per tenant");
        let limits = Limits {
            queue_depth: cfg.queue_depth,
            queue_limit: Some(cfg.queue_limit),
            refuse: cfg.refuse,
            stall: cfg.stall,
        };
        let n = cfg.tenants.len();
        EngineCore {
            targets,
            host: Host::new(policy, (stats, recorder), limits, n, cost),
            model: model.map(Driver::new),
            live: FxHashMap::default(),
            next_id: 0,
            conns: Vec::new(),
            placement: Placement::new(cfg.shards),
            cancelled: Vec::new(),
            due: BinaryHeap::new(),
            timeouts: BinaryHeap::new(),
            timeouts_logged: vec![Reported::default(); n],
            fenced: vec![0; n],
            model_done: Vec::new(),
            inflight_bytes: 0,
            past_end_logged: vec![None; n],
            backend_errors: vec![Reported::default(); n],
            closed: vec![false; n],
            detectors: cfg
                .tenants
                .iter()
                .map(|t| (t.cache == Cache::Pdc).then(|| JournalDetector::new(t.size, cfg.pdc)))
                .collect(),
            arrivals: capture.then(Vec::new),
            intents: Vec::new(),
            logs: Vec::new(),
            logs_lost: 0,
            last_publish: None,
            panic_after: None,
            #[cfg(test)]
            plant: None,
            cfg,
        }
    }

    /// Testing the server's supervision: panic once `n` requests have arrived, as a bug
    /// would.
    pub fn panic_after(&mut self, n: Option<u64>) {
        self.panic_after = n;
    }

    #[cfg(test)]
    pub(crate) fn plant(&mut self, bug: Plant) {
        self.plant = Some(bug);
    }

    #[cfg(test)]
    fn planted(&self, bug: Plant) -> bool {
        self.plant == Some(bug)
    }

    // ---- events ----

    /// A connection finished its handshake: served from now on. Returns its slot, or
    /// `None` when the core is stopping (the shell closes it).
    #[must_use]
    pub fn attach(
        &mut self,
        id: u64,
        peer: Arc<str>,
        tenant: TenantId,
        codec: ServerCodec,
        now: Nanos,
    ) -> Option<usize> {
        if self.host.deadline().is_some() || self.closed[tenant as usize] {
            return None;
        }
        self.host.observer().0.connection(tenant, true);
        let conn = Conn::new(id, peer, tenant, codec);
        let slot = match self.conns.iter().position(Option::is_none) {
            Some(free) => free,
            None => {
                self.conns.push(None);
                self.conns.len() - 1
            }
        };
        self.conns[slot] = Some(conn);
        self.placement.place(slot);
        self.pump(slot, now);
        Some(slot)
    }

    /// A tenant's weight, SLO, reservation or limit changed.
    pub fn update(&mut self, tenant: TenantId, spec: &TenantSpec, now: Nanos) {
        self.host.observer().0.set_weight(tenant, spec.weight);
        self.host.update_tenant(tenant, spec, now);
    }

    /// Limits decided outside the policy for `tenant` (a cluster's fronts), from
    /// `now` on; a policy that does not take them ignores them.
    pub fn set_limits(
        &mut self,
        tenant: TenantId,
        limits: &crate::limits::governor::Limits,
        now: Nanos,
    ) {
        assert!(
            (tenant as usize) < self.targets.len(),
            "limits for tenant {tenant}, which the core does not serve"
        );
        let _ = self.host.set_limits(tenant, limits, now);
    }

    /// A tenant joins while running (`add-tenant`), served from now on by the policy
    /// and the recorder under the next id (returned), which the counters hold already
    /// ([`LiveStats::add_tenant`]); `target` is where its requests go (`None`: the null
    /// backend).
    pub fn add_tenant(
        &mut self,
        tenant: CoreTenant,
        spec: &TenantSpec,
        target: Option<Store>,
        now: Nanos,
    ) -> TenantId {
        let id = self.host.add_tenant(spec, now);
        let (stats, recorder) = self.host.observer_mut();
        // The counters have it first: the control side reads them at once.
        assert!(
            stats.tenants() > id as usize,
            "tenant {id} is counted before it is served"
        );
        if let Some(r) = recorder {
            r.add_tenant(spec);
        }
        self.targets.push(target);
        self.timeouts_logged.push(Reported::default());
        self.fenced.push(0);
        self.past_end_logged.push(None);
        self.backend_errors.push(Reported::default());
        self.closed.push(false);
        self.detectors.push(
            (tenant.cache == Cache::Pdc).then(|| JournalDetector::new(tenant.size, self.cfg.pdc)),
        );
        self.cfg.tenants.push(tenant);
        id
    }

    /// Drains one tenant (`drain-tenant`, `remove-tenant`): its connections are no
    /// longer read, what they sent is served, then they close; new ones are refused
    /// until [`Self::resume_tenant`]. The other tenants go on as they were.
    pub fn drain_tenant(&mut self, tenant: TenantId) {
        self.closed[tenant as usize] = true;
        for slot in 0..self.conns.len() {
            if let Some(c) = self.conns[slot].as_mut()
                && c.tenant == tenant
                && c.stop_receiving()
            {
                self.intents.push(Intent::ShutRead(slot));
            }
        }
    }

    /// A drained tenant takes connections again.
    pub fn resume_tenant(&mut self, tenant: TenantId) {
        self.closed[tenant as usize] = false;
    }

    /// Stops receiving; what was received is still served.
    pub fn drain(&mut self, now: Nanos) {
        if self.host.deadline().is_some() {
            return;
        }
        self.host.start_drain(now, self.cfg.drain_timeout);
        for slot in 0..self.conns.len() {
            if let Some(c) = self.conns[slot].as_mut()
                && c.stop_receiving()
            {
                self.intents.push(Intent::ShutRead(slot));
            }
        }
    }

    /// A receive returned `result` (bytes written into the receive buffer, or a
    /// negative errno).
    pub fn received(&mut self, slot: usize, result: i32, now: Nanos) {
        let draining = self.host.deadline().is_some();
        let c = self.conns[slot]
            .as_mut()
            .expect("receive of a live connection");
        assert!(c.receiving, "a receive returns once");
        c.receiving = false;
        match result {
            n if n > 0 => {
                c.codec.received(n as usize);
                if draining {
                    let _ = c.stop_receiving();
                }
            }
            0 => {
                let _ = c.stop_receiving();
            }
            e if e == -libc::EINTR || e == -libc::EAGAIN => {}
            e => {
                let _ = c.stop_receiving();
                // A client that hangs up mid-conversation is not news.
                if e != -libc::ECONNRESET {
                    let error = std::io::Error::from_raw_os_error(-e);
                    let text = format!("ioshare: connection {}: receive: {error}", c.id);
                    let peer = c.peer.clone();
                    self.log(Some(peer), text);
                }
            }
        }
        self.pump(slot, now);
    }

    /// A send returned `result` (bytes sent, or a negative errno): the rest of a short
    /// send goes again.
    pub fn sent(&mut self, slot: usize, result: i32, _now: Nanos) {
        let c = self.conns[slot]
            .as_mut()
            .expect("send of a live connection");
        let quiet = [libc::EPIPE, libc::ECONNRESET, libc::EINTR, libc::EAGAIN];
        let failed = (result < 0 && !quiet.contains(&-result)).then(|| {
            format!(
                "ioshare: connection {}: send: {}",
                c.id,
                std::io::Error::from_raw_os_error(-result)
            )
        });
        let again = c.sent(result);
        self.inflight_bytes -= c.take_released();
        if c.output == Output::Broken && c.input != Input::Parsed {
            // Nobody will read the answers: what the client sent after is not served.
            if c.stop_receiving() {
                self.intents.push(Intent::ShutRead(slot));
            }
            c.input = Input::Parsed;
        }
        if again {
            self.intents.push(Intent::Send(slot));
        }
        if let Some(text) = failed {
            let peer = self.conns[slot].as_ref().map(|c| c.peer.clone());
            self.log(peer, text);
        }
    }

    /// A request's file operation returned `result` (bytes moved, or a negative errno):
    /// its next part, or its end.
    pub fn io_done(&mut self, id: u64, result: i32, now: Nanos) {
        let l = self
            .live
            .get_mut(&id)
            .expect("completion of a known request");
        if l.abandoned {
            if changes_data(l.request.op) {
                let fenced = &mut self.fenced[l.sub.tenant as usize];
                *fenced = fenced
                    .checked_sub(1)
                    .expect("an abandoned write was counted");
            }
            // Answered already; its buffer is free now. An emulated device still to
            // finish it drops it then.
            if self.model.is_some() && l.model_finish.is_none() {
                l.io_result = Some(proto::EIO);
            } else {
                self.live.remove(&id);
            }
            return;
        }
        let tenant = l.sub.tenant as usize;
        let (what, offset, len) = l.what();
        let error = match l.io().step(result) {
            Next::Again => {
                assert!(
                    self.targets[tenant].is_some(),
                    "only file requests go again"
                );
                self.intents.push(Intent::Io(id));
                return;
            }
            Next::Done(error) => {
                if result < 0 && error != 0 {
                    self.backend_failed(tenant, (what, offset, len), -result, error, now);
                }
                error
            }
            Next::PastEnd => {
                self.past_end(tenant, offset, now);
                proto::EIO
            }
        };
        if self.model.is_some() {
            // The data is there; the reply waits for the model's finish time.
            let l = self.live.get_mut(&id).expect("known");
            l.io_result = Some(error);
            if let Some(at) = l.model_finish {
                self.due.push(Reverse((at, id)));
            }
        } else {
            let l = self.live.remove(&id).expect("known");
            self.complete(l, error, now);
        }
    }

    /// One turn: the host's alarms and the drain deadline, the emulated device's
    /// answers, connections that waited for room read again, what the host dispatches
    /// goes to the backend, waiting replies are sent, finished connections close.
    pub fn turn(&mut self, now: Nanos) {
        self.check_deadlines(now);
        self.emulate(now);
        // Requests answered made room under `queue_limit` or the budget: read what
        // waited; what dispatching then takes from the host makes room again, read
        // once more (not a turn later, after the next completion).
        for _ in 0..2 {
            for slot in 0..self.conns.len() {
                if self.conns[slot]
                    .as_ref()
                    .is_some_and(|c| c.input != Input::Parsed && !c.receiving)
                {
                    self.pump(slot, now);
                }
            }
            self.dispatch(now);
        }
        self.flush_replies();
        self.close_finished();
        if self.last_publish.is_none_or(|at| now >= at + PUBLISH_EVERY) {
            let gauges = self.host.observe(Detail::Gauges).gauges;
            self.host.observer().0.publish_policy(gauges);
            self.last_publish = Some(now);
        }
    }

    // ---- what the shell reads ----

    /// The intents since the last call, in the order they were made.
    pub fn take_intents(&mut self, into: &mut Vec<Intent>) {
        into.append(&mut self.intents);
    }

    /// The engine shard of the connection whose socket an intent is about, or whose
    /// request it moves: a shell with several rings carries it out on that shard's
    /// ring, so that its completion comes back where the connection's other events do.
    /// `None` for a block status (answered on the spot) and for an intent of a request
    /// no longer live.
    pub fn home(&self, intent: Intent) -> Option<usize> {
        let slot = match intent {
            Intent::Receive(slot)
            | Intent::Send(slot)
            | Intent::ShutRead(slot)
            | Intent::Cut(slot)
            | Intent::Close(slot) => slot,
            Intent::Io(id) => self.live.get(&id)?.sub.conn,
            Intent::BlockStatus(_) => return None,
        };
        Some(self.placement.shard(slot))
    }

    /// The log lines since the last call, and how many were dropped past the bound.
    pub fn take_logs(&mut self) -> (Vec<LogLine>, u64) {
        (
            std::mem::take(&mut self.logs),
            std::mem::take(&mut self.logs_lost),
        )
    }

    /// With capture on, the requests that arrived since the last call.
    pub fn take_arrivals(&mut self) -> Vec<Arrival> {
        self.arrivals
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Where [`Intent::Receive`] writes: the connection's codec buffer, which the core
    /// leaves alone until [`Self::received`].
    pub fn receive_buffer(&mut self, slot: usize) -> &mut [u8] {
        let c = self.conns[slot]
            .as_mut()
            .expect("receive of a live connection");
        assert!(c.receiving, "a receive was asked for");
        c.codec.receive_buffer()
    }

    /// What [`Intent::Send`] sends: iovecs over buffers the core leaves alone until
    /// [`Self::sent`].
    pub fn send_iov(&self, slot: usize) -> &[libc::iovec] {
        let c = self.conns[slot]
            .as_ref()
            .expect("send of a live connection");
        assert!(c.send_armed, "a send was asked for");
        c.send_iov()
    }

    /// A copy of up to `max` bytes of what [`Intent::Send`] sends (a simulated socket).
    pub fn send_bytes(&self, slot: usize, max: usize) -> Vec<u8> {
        let c = self.conns[slot]
            .as_ref()
            .expect("send of a live connection");
        assert!(c.send_armed, "a send was asked for");
        c.send_bytes(max)
    }

    /// What [`Intent::Io`] performs: the request's transfer and its tenant's target.
    pub fn transfer(&mut self, id: u64) -> (&mut Transfer, Store) {
        let l = self.live.get_mut(&id).expect("I/O of a live request");
        let target = self.targets[l.sub.tenant as usize].expect("file requests only");
        (l.io(), target)
    }

    /// When the core must run again even if nothing returns: the host's alarm, the
    /// emulated device's next decision or answer, the end of the send grace.
    pub fn next_wake(&self) -> Option<Nanos> {
        let model_next = self.model.as_ref().and_then(|m| m.next_event());
        let next_due = self.due.peek().map(|Reverse((at, _))| *at);
        let next_timeout = self.timeouts.peek().map(|Reverse((at, _))| *at);
        // After the drain deadline, replies still being sent get a grace period.
        let send_grace = self
            .host
            .deadline()
            .filter(|_| self.host.stopped() && self.conns.iter().flatten().any(|c| c.send_armed));
        [
            self.host.next_alarm(),
            send_grace.map(|d| d + SEND_GRACE),
            model_next,
            next_due,
            next_timeout,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Drained: no request and no connection left (but requests answered `EIO` past
    /// `backend_timeout` whose file operation never came back).
    pub fn is_done(&self) -> bool {
        self.host.deadline().is_some()
            && self.live.values().all(|l| l.abandoned)
            && self.conns.iter().all(Option::is_none)
    }

    /// Bytes all connections hold of the memory budget now.
    pub fn inflight_bytes(&self) -> u64 {
        self.inflight_bytes
    }

    /// The memory bound the core keeps: `max_inflight_bytes`, plus the small request
    /// each connection holding nothing may take beyond it ([`budget::may_take`]), for
    /// the connections that hold one now.
    pub fn memory_bound(&self) -> u64 {
        self.cfg.max_inflight_bytes + self.conns.iter().flatten().map(|c| c.exempt).sum::<u64>()
    }

    /// Requests inside the core (held by the policy or on the backend).
    pub fn live_requests(&self) -> usize {
        self.live.len()
    }

    /// Open connections.
    pub fn connections(&self) -> usize {
        self.conns.iter().flatten().count()
    }

    /// The drain's deadline, once draining.
    pub fn deadline(&self) -> Option<Nanos> {
        self.host.deadline()
    }

    /// Consumes the core once done.
    pub fn finish(mut self) -> CoreOutcome {
        let journal = self
            .detectors
            .iter()
            .map(|d| d.as_ref().map(|d| d.journal_groups().collect()))
            .collect();
        let device = self
            .model
            .as_ref()
            .map(|m| m.model().stats())
            .unwrap_or_default();
        // The kernel may still write into an abandoned request's buffer: never freed.
        for (_, l) in self.live.drain() {
            assert!(l.abandoned, "finished with a request in service");
            std::mem::forget(l.work);
        }
        let ((_, recorder), policy) = self.host.finish();
        CoreOutcome {
            recorder,
            device,
            policy,
            journal,
        }
    }

    // ---- decisions ----

    fn log(&mut self, peer: Option<Arc<str>>, text: String) {
        if self.logs.len() < LOG_LIMIT {
            self.logs.push(LogLine { peer, text });
        } else {
            self.logs_lost += 1;
        }
    }

    /// The host's alarms that are due: the policy's timer and wait, and the drain
    /// deadline, at which what the policy still holds (a limit, an empty bucket) is
    /// answered `ESHUTDOWN` so it does not keep the server from stopping. A client that
    /// still does not take its replies a while later is cut off.
    fn check_deadlines(&mut self, now: Nanos) {
        self.host.on_time(now, &mut self.cancelled);
        while let Some(&Reverse((at, id))) = self.timeouts.peek()
            && at <= now
        {
            self.timeouts.pop();
            self.backend_timed_out(id, now);
        }
        if !self.cancelled.is_empty() {
            let text = format!(
                "ioshare: drain deadline passed: answering {} request(s) the policy still holds with ESHUTDOWN",
                self.cancelled.len()
            );
            self.log(None, text);
        }
        for r in std::mem::take(&mut self.cancelled) {
            let l = self
                .live
                .remove(&r.id)
                .expect("a withdrawn request is live");
            self.answer(l.sub, proto::ESHUTDOWN, None);
        }
        if let Some(deadline) = self.host.deadline()
            && now >= deadline + SEND_GRACE
        {
            for slot in 0..self.conns.len() {
                if let Some(c) = self.conns[slot].as_mut()
                    && c.send_armed
                    && c.output == Output::Open
                {
                    c.output = Output::Cut;
                    self.intents.push(Intent::Cut(slot));
                }
            }
        }
    }

    /// Whether `tenant` may have another request read (back-pressure).
    fn has_room(&self, tenant: TenantId) -> bool {
        #[cfg(test)]
        if self.planted(Plant::IgnoreHasRoom) {
            return true;
        }
        self.host.has_room(tenant)
    }

    /// The memory budget's rule, as [`budget::may_take`] states it.
    fn may_take(&self, held: u64, next: u64) -> bool {
        #[cfg(test)]
        if self.planted(Plant::BudgetOffByOne) {
            return budget::may_take(
                held,
                next,
                self.inflight_bytes,
                self.cfg.max_inflight_bytes + 1,
            );
        }
        budget::may_take(held, next, self.inflight_bytes, self.cfg.max_inflight_bytes)
    }

    /// Takes a connection's requests from its codec while its tenant has room; when
    /// the codec needs bytes, a receive is asked for.
    fn pump(&mut self, slot: usize, now: Nanos) {
        loop {
            let c = self.conns[slot].as_ref().expect("pumped a live connection");
            if c.input == Input::Parsed || c.receiving || !self.has_room(c.tenant) {
                return;
            }
            if !self.reserve_next(slot) {
                return;
            }
            let c = self.conns[slot].as_mut().expect("pumped a live connection");
            match c.codec.poll() {
                Ok(Some(Event::Command(command))) => self.admit(slot, command, now),
                Ok(Some(Event::Error { handle, error })) => self.answer_now(slot, handle, error),
                Ok(Some(Event::Done { handle })) => self.answer_now(slot, handle, 0),
                Ok(Some(Event::BlockStatus {
                    handle,
                    offset,
                    len,
                    req_one,
                })) => self.block_status(slot, handle, (offset, len), req_one, now),
                Ok(Some(Event::Disconnect)) => {
                    self.inflight_bytes -= c.drop_reservation();
                    c.input = Input::Parsed;
                }
                Ok(Some(Event::Selected { .. } | Event::StartTls)) => {
                    // The codec makes neither once transmission runs.
                    c.input = Input::Parsed;
                    let text = format!(
                        "ioshare: connection {}: a handshake event in transmission",
                        c.id
                    );
                    let peer = c.peer.clone();
                    self.log(Some(peer), text);
                }
                Ok(None) if c.input == Input::Ended => c.input = Input::Parsed,
                Ok(None) => {
                    c.receiving = true;
                    self.intents.push(Intent::Receive(slot));
                    return;
                }
                Err(e) => {
                    c.input = Input::Parsed;
                    let text = format!("ioshare: connection {}: {e}", c.id);
                    let peer = c.peer.clone();
                    self.log(Some(peer), text);
                }
            }
        }
    }

    /// The memory budget, checked once a request's header is whole and before it is
    /// parsed (a write's payload buffer is taken then): a request holds its data and its
    /// reply's header from then until the reply is sent, so a client that never reads
    /// its replies, errors included, cannot make the server hold more for it. It waits
    /// unless that fits the connection's share and the budget; a connection holding
    /// nothing may always take a small one, so small requests are served while large
    /// ones wait for room. Returns whether the connection may go on parsing.
    fn reserve_next(&mut self, slot: usize) -> bool {
        let c = self.conns[slot].as_ref().expect("a live connection");
        if c.reserved != 0 {
            return true;
        }
        let Some(data) = c.codec.next_request() else {
            return true;
        };
        let next = budget::held_by(data);
        if !self.may_take(c.pending_bytes, next) {
            let c = self.conns[slot].as_mut().expect("a live connection");
            if c.input == Input::Ended {
                // Draining, or the client is gone: what it sent that does not fit is
                // not served.
                c.input = Input::Parsed;
            }
            return false;
        }
        let fits = budget::fits(
            c.pending_bytes,
            next,
            self.inflight_bytes,
            self.cfg.max_inflight_bytes,
        );
        let small = c.pending_bytes == 0 && next <= budget::ALWAYS_BYTES;
        let c = self.conns[slot].as_mut().expect("a live connection");
        c.reserve(next);
        if !fits && small {
            // Taken under the small-request rule: beyond the budget until the
            // connection holds nothing again.
            c.exempt = next;
        }
        self.inflight_bytes += next;
        true
    }

    /// Hands the replies made outside a turn (a block status the shell could not hand to
    /// its lookups) to their sends.
    pub fn send_replies(&mut self) {
        self.flush_replies();
    }

    /// Hands every connection's waiting replies to its send (one at a time each).
    fn flush_replies(&mut self) {
        for slot in 0..self.conns.len() {
            if let Some(c) = self.conns[slot].as_mut()
                && c.next_send()
            {
                self.intents.push(Intent::Send(slot));
            }
        }
    }

    /// Closes connections with nothing left to receive, serve or send.
    fn close_finished(&mut self) {
        for slot in 0..self.conns.len() {
            let Some(c) = self.conns[slot].as_mut() else {
                continue;
            };
            if !c.is_finished() {
                continue;
            }
            self.inflight_bytes -= c.drop_reservation();
            assert_eq!(c.pending_bytes, 0, "a finished connection holds no data");
            let tenant = c.tenant;
            self.conns[slot] = None;
            self.placement.leave(slot);
            self.host.observer().0.connection(tenant, false);
            self.intents.push(Intent::Close(slot));
        }
    }

    /// A request the codec answers without serving it (refused, or nothing to do) gets
    /// its reply at once, in the place its header held.
    fn answer_now(&mut self, slot: usize, handle: u64, error: u32) {
        let tenant = self.conns[slot]
            .as_ref()
            .expect("answered on a live connection")
            .tenant;
        if error != 0 {
            self.host.observer().0.answered_error(tenant, error);
        }
        let c = self.conns[slot]
            .as_mut()
            .expect("answered on a live connection");
        let bytes = std::mem::take(&mut c.reserved);
        assert_eq!(
            bytes,
            budget::REPLY_BYTES,
            "a request answered at once holds its reply"
        );
        c.reply(handle, error, None, bytes, None);
        // A connection whose sends failed drops the reply at once.
        self.inflight_bytes -= c.take_released();
    }

    /// `NBD_CMD_BLOCK_STATUS`. On the null backend, which reads zeroes, the range is
    /// one hole, and an rbd image's allocation is not asked for: answered at once. On
    /// a file it is a request like any other: admitted by the host, dispatched by the
    /// policy and charged its device time (a lookup in the file system's extent map:
    /// [`crate::device::cost::CostModel::cost`]), its walk done off the engine's
    /// threads ([`Intent::BlockStatus`]) and bounded ([`crate::io::extents::MAX_WALK`]
    /// extents), under the backend timeout. So a flood of block status is its tenant's
    /// load, not everyone's stall.
    fn block_status(
        &mut self,
        slot: usize,
        handle: u64,
        (offset, len): (u64, u32),
        req_one: bool,
        now: Nanos,
    ) {
        let c = self.conns[slot]
            .as_mut()
            .expect("asked on a live connection");
        c.outstanding += 1;
        let bytes = std::mem::take(&mut c.reserved);
        assert_eq!(
            bytes,
            budget::held_by(proto::MAX_BLOCK_STATUS_PAYLOAD),
            "a block status request holds its reply"
        );
        let sub = Submission {
            tenant: c.tenant,
            conn: slot,
            handle,
            read_at: None,
            bytes,
        };
        let target = match self.targets[sub.tenant as usize] {
            None => {
                return self
                    .block_status_reply(sub, &[(len, proto::STATE_HOLE | proto::STATE_ZERO)]);
            }
            // An image's allocation is not asked for: all of it is data, which is
            // always a true answer (a client then reads what it would have skipped).
            Some(Store::Image(_)) => return self.block_status_reply(sub, &[(len, 0)]),
            Some(Store::File(t)) => t,
        };
        self.next_id += 1;
        let ask = StatusAsk {
            tenant: sub.tenant,
            fd: target.buffered,
            at: target.base + offset,
            len,
            max_extents: if req_one {
                1
            } else {
                crate::io::extents::MAX_WALK
            },
        };
        let request = Request {
            id: self.next_id,
            tenant: sub.tenant,
            op: crate::types::Op::Status,
            offset: ask.at,
            len,
            arrival: now,
            cost: 0,
        };
        self.enqueue(sub, request, Work::Status(ask), now);
    }

    /// What the shell is to look up for [`Intent::BlockStatus`] `id`.
    pub fn block_status_ask(&self, id: u64) -> StatusAsk {
        match self.live.get(&id).map(|l| &l.work) {
            Some(Work::Status(ask)) => *ask,
            _ => panic!("an ask the core made"),
        }
    }

    /// The shell's answer to [`Intent::BlockStatus`] `id`: the range's extents from its
    /// start (at most the ask's number, covering at most its length), or the errno the
    /// lookup failed with. One answered `EIO` past the backend timeout already is
    /// dropped now.
    pub fn block_status_done(
        &mut self,
        id: u64,
        extents: Result<Vec<(u32, u32)>, i32>,
        now: Nanos,
    ) {
        let l = self.live.remove(&id).expect("an ask is answered once");
        let Work::Status(ask) = l.work else {
            panic!("a block status answered for a data request");
        };
        if l.abandoned {
            return;
        }
        let c = Completion {
            request: l.request,
            start: l.start.expect("dispatched"),
            finish: now,
        };
        match extents {
            Ok(e) => {
                assert!(
                    !e.is_empty()
                        && e.len() <= ask.max_extents
                        && e.iter().map(|x| u64::from(x.0)).sum::<u64>() <= u64::from(ask.len),
                    "block status extents within the ask"
                );
                self.host.complete(&c, Status::Ok, now);
                self.block_status_reply(l.sub, &e);
            }
            Err(errno) => {
                self.host.complete(&c, Status::Failed, now);
                let error = crate::io::transfer::nbd_error(errno);
                let tenant = l.sub.tenant as usize;
                self.backend_failed(tenant, ("block status", ask.at, ask.len), errno, error, now);
                self.answer(l.sub, error, None);
            }
        }
    }

    fn block_status_reply(&mut self, sub: Submission, extents: &[(u32, u32)]) {
        self.reply_to(&sub, |c| {
            c.reply_block_status(sub.handle, extents, sub.bytes)
        });
    }

    /// Answers `sub` on its connection with what `write` queues: the request is no
    /// longer outstanding, and what a connection whose sends failed drops is released.
    fn reply_to(&mut self, sub: &Submission, write: impl FnOnce(&mut Conn)) {
        let c = self.conns[sub.conn]
            .as_mut()
            .expect("a connection stays open while it has requests");
        c.outstanding = c
            .outstanding
            .checked_sub(1)
            .expect("a request is answered once");
        write(c);
        self.inflight_bytes -= c.take_released();
    }

    /// A request from a connection is offered to the host; a refused one is answered
    /// at once (`EIO`, or `ESHUTDOWN` past the drain deadline). With `refuse = "hold"`
    /// (the default) the policy's refusals are held back by the host, not answered.
    fn admit(&mut self, slot: usize, command: Command, now: Nanos) {
        let c = self.conns[slot]
            .as_mut()
            .expect("admitted from a live connection");
        let tenant = c.tenant;
        c.outstanding += 1;
        // Its data and reply were held for when its header was checked (`pump`).
        let bytes = std::mem::take(&mut c.reserved);
        assert_eq!(
            bytes,
            budget::REPLY_BYTES
                + match command.kind {
                    CommandKind::Read | CommandKind::Write { .. } => u64::from(command.len),
                    _ => 0,
                },
            "the request admitted is the one held for"
        );
        let sub = Submission {
            tenant,
            conn: slot,
            handle: command.handle,
            read_at: (command.kind == CommandKind::Read).then_some(command.offset),
            bytes,
        };
        if let Some(a) = self.arrivals.as_mut() {
            a.push(Arrival::of(
                now,
                tenant as usize,
                &command.kind,
                command.offset,
                command.len,
            ));
        }
        let write = matches!(command.kind, CommandKind::Write { .. });
        let mut io = Transfer::new(command.kind, command.offset, command.len);
        if write {
            self.detect_journal(tenant, &mut io, command.offset, command.len);
        }
        self.next_id += 1;
        if self.panic_after.is_some_and(|n| self.next_id >= n) {
            panic!("injected at request {}", self.next_id);
        }
        let request = Request {
            id: self.next_id,
            tenant,
            op: io.op(),
            offset: self.targets[tenant as usize].map_or(0, |x| x.base()) + io.offset(),
            len: io.len(),
            arrival: now,
            cost: 0,
        };
        self.enqueue(sub, request, Work::Io(io), now);
    }

    /// Hands `request` to the host: held for the policy (live from now on), or answered
    /// at once with why it was refused.
    fn enqueue(&mut self, sub: Submission, request: Request, work: Work, now: Nanos) {
        match self.host.admit(request, now) {
            Admission::Queued => {
                let l = Live {
                    sub,
                    request,
                    start: None,
                    work,
                    model_finish: None,
                    model_busy: None,
                    io_result: None,
                    abandoned: false,
                };
                self.live.insert(request.id, l);
            }
            Admission::Refused(_, Refusal::Stopping) => self.answer(sub, proto::ESHUTDOWN, None),
            Admission::Refused(_, Refusal::QueueFull | Refusal::Policy) => {
                self.answer(sub, proto::EIO, None)
            }
        }
    }

    /// Feeds a write to its tenant's journal detector (`cache = "pdc"`): a write in a
    /// journal group is marked to bypass the page cache; each group newly marked is
    /// counted and logged (once: a group stays marked).
    fn detect_journal(&mut self, tenant: TenantId, io: &mut Transfer, offset: u64, len: u32) {
        let Some(d) = self.detectors[tenant as usize].as_mut() else {
            return;
        };
        if d.write(offset, len) == Verdict::Journal {
            io.set_journal();
        }
        // Each group the write marked (one write may cross into the next).
        let found: Vec<(usize, (u64, u64))> = d
            .newly_marked()
            .iter()
            .map(|&i| (i, d.log_in(i).expect("a marked group has its log")))
            .collect();
        for (group, (start, end)) in found {
            self.host.observer().0.journal_group(tenant);
            let text = format!(
                "ioshare: {}: group {group} holds a circular log (the guest's journal) at bytes {start}–{end} ({}); writes there bypass the host cache from now on",
                self.cfg.tenants[tenant as usize].name,
                crate::units::format_bytes(end - start),
            );
            self.log(None, text);
        }
    }

    /// Sends to the backend what the host dispatches while the device has room.
    fn dispatch(&mut self, now: Nanos) {
        while let Some(r) = self.host.dispatch(now) {
            let l = self
                .live
                .get_mut(&r.id)
                .expect("dispatched a known request");
            l.start = Some(now);
            // The host stamped its cost: the completion carries it to the recorder.
            l.request = r;
            if self.fenced[r.tenant as usize] > 0 && changes_data(r.op) {
                // An older write of this tenant, answered EIO, may still land: a newer
                // one acknowledged now could be overwritten by it. Failed at once
                // until the backend has given every such write back.
                let l = self.live.remove(&r.id).expect("known");
                self.host.observer().0.fenced(r.tenant);
                self.complete(l, proto::EIO, now);
                continue;
            }
            if let Work::Status(_) = l.work {
                // A lookup in the file system's map, not a request to the device: the
                // emulated model does not see it.
                if let Some(t) = self.cfg.backend_timeout {
                    self.timeouts.push(Reverse((now + t, r.id)));
                }
                self.intents.push(Intent::BlockStatus(r.id));
                continue;
            }
            if let Some(m) = self.model.as_mut() {
                m.advance(now, &mut self.model_done);
                l.model_finish = match m.submit(&r, now) {
                    Submitted::Finishes(at) => Some(at),
                    Submitted::Queued => None,
                };
            }
            #[cfg(test)]
            if self.plant == Some(Plant::FlushWithoutSync) && r.op == crate::types::Op::Flush {
                let l = self
                    .live
                    .get_mut(&r.id)
                    .expect("dispatched a known request");
                let result = l.io().null_result();
                self.io_done(r.id, result, now);
                continue;
            }
            if self.targets[r.tenant as usize].is_some() {
                if let Some(t) = self.cfg.backend_timeout {
                    self.timeouts.push(Reverse((now + t, r.id)));
                }
                self.intents.push(Intent::Io(r.id));
            } else {
                let result = l.io().null_result();
                self.io_done(r.id, result, now);
            }
        }
    }

    /// A read of `tenant` at `offset` met the end of its image: logged, at most once
    /// every [`PAST_END_LOG_EVERY`] per tenant.
    fn past_end(&mut self, tenant: usize, offset: u64, now: Nanos) {
        let logged = &mut self.past_end_logged[tenant];
        if logged.is_some_and(|at| now < at + PAST_END_LOG_EVERY) {
            return;
        }
        *logged = Some(now);
        let t = &self.cfg.tenants[tenant];
        let text = format!(
            "ioshare: {}: a read at byte {offset} met the end of its image, which is shorter than the export's {} bytes (truncated while served?); answered EIO, not zeroes (reported at most every {} s)",
            t.name,
            t.size,
            PAST_END_LOG_EVERY / 1_000_000_000
        );
        self.log(None, text);
    }

    /// Request `id`'s backend has not answered by its deadline: if it is still with the
    /// backend, it is answered `EIO` now and its slot freed (the client and the policy
    /// go on), its buffer kept for the kernel until the operation returns; the tenant's
    /// backend is degraded (logged, counted in `/metrics`).
    fn backend_timed_out(&mut self, id: u64, now: Nanos) {
        let Some(l) = self.live.get_mut(&id) else {
            return;
        };
        // Done with its data (an emulated device's finish time ahead), or answered.
        if l.abandoned || l.io_result.is_some() {
            return;
        }
        l.abandoned = true;
        let (sub, request) = (l.sub, l.request);
        if changes_data(request.op) {
            self.fenced[sub.tenant as usize] += 1;
        }
        let start = l.start.expect("dispatched");
        let (what, offset, len) = l.what();
        let c = Completion {
            request,
            start,
            finish: now,
        };
        self.host.complete(&c, Status::Failed, now);
        self.host.observer().0.backend_timed_out(sub.tenant);
        self.answer(sub, proto::EIO, None);
        let tenant = sub.tenant as usize;
        let Some(between) = self.timeouts_logged[tenant].due(now, BACKEND_ERROR_LOG_EVERY) else {
            return;
        };
        let since = Reported::since(between);
        let text = format!(
            "ioshare: {}: its backend has not answered a {what} of {len} bytes at byte {offset} in {:.1} s: answered EIO; the backend is degraded (hung or failing storage under the image?), and until its unanswered writes come back its new writes fail at once (reported at most every {} s{since})",
            self.cfg.tenants[tenant].name,
            (now - start) as f64 / 1e9,
            BACKEND_ERROR_LOG_EVERY / 1_000_000_000
        );
        self.log(None, text);
    }

    /// The backend failed a request of `tenant` (`errno`, answered `error`): logged
    /// with the operation, its range and the errno, the first at once and then at most
    /// once every [`BACKEND_ERROR_LOG_EVERY`] per tenant, with how many came between.
    fn backend_failed(
        &mut self,
        tenant: usize,
        (what, offset, len): (&'static str, u64, u32),
        errno: i32,
        error: u32,
        now: Nanos,
    ) {
        let Some(between) = self.backend_errors[tenant].due(now, BACKEND_ERROR_LOG_EVERY) else {
            return;
        };
        let name = &self.cfg.tenants[tenant].name;
        let os = std::io::Error::from_raw_os_error(errno);
        let since = Reported::since(between);
        let text = format!(
            "ioshare: {name}: the backend failed a {what} of {len} bytes at byte {offset}: {os}; answered {} (reported at most every {} s{since})",
            crate::nbd::proto::error_name(error),
            BACKEND_ERROR_LOG_EVERY / 1_000_000_000
        );
        self.log(None, text);
    }

    /// Emulated backend: answers the requests whose model finish time has passed.
    fn emulate(&mut self, now: Nanos) {
        let Some(m) = self.model.as_mut() else {
            return;
        };
        m.advance(now, &mut self.model_done);
        for f in self.model_done.drain(..) {
            let l = self
                .live
                .get_mut(&f.request.id)
                .expect("modelled a known request");
            l.model_finish = Some(f.finish);
            l.model_busy = f.busy;
            if l.abandoned {
                // Answered past the backend timeout; dropped once its I/O is back too.
                if l.io_result.is_some() {
                    self.live.remove(&f.request.id);
                }
            } else if l.io_result.is_some() {
                self.due.push(Reverse((f.finish, f.request.id)));
            }
        }
        while let Some(&Reverse((at, id))) = self.due.peek() {
            if at > now {
                break;
            }
            self.due.pop();
            let l = self.live.remove(&id).expect("due request is live");
            let error = l.io_result.expect("data I/O done");
            self.complete(l, error, now);
        }
    }

    /// A request is over: the policy and the counters learn of it, the client gets its
    /// reply.
    fn complete(&mut self, mut l: Live, error: u32, t: Nanos) {
        // Bypassed: journal writes that went O_DIRECT (an unaligned one goes through
        // the page cache).
        if error == 0 && l.io().journal() && l.io().direct() {
            self.host
                .observer()
                .0
                .journal_write(l.sub.tenant, u64::from(l.io().len()));
        }
        let c = Completion {
            request: l.request,
            start: l.start.expect("dispatched"),
            finish: t,
        };
        let status = if error == 0 {
            Status::Ok
        } else {
            Status::Failed
        };
        if let Some(busy) = l.model_busy {
            crate::host::Observer::measured(self.host.observer_mut(), &l.request, busy);
        }
        self.host.complete(&c, status, t);
        let data = match l.work {
            Work::Io(io) if error == 0 => io.into_read_data(),
            _ => None,
        };
        self.answer(l.sub, error, data);
    }

    fn answer(&mut self, sub: Submission, error: u32, data: Option<IoBuf>) {
        if error != 0 {
            self.host.observer().0.answered_error(sub.tenant, error);
        }
        self.reply_to(&sub, |c| {
            c.reply(sub.handle, error, data, sub.bytes, sub.read_at)
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::transfer::FileOp;
    use crate::server::swarm::{handshaken, request_header};

    const MS: Nanos = 1_000_000;

    /// One tenant on a file target, policy `none`, no device model.
    fn core(queue_depth: u32, queue_limit: u32, max_inflight_bytes: u64) -> EngineCore {
        let cfg = CoreConfig {
            queue_depth,
            queue_limit,
            refuse: Refuse::Hold,
            drain_timeout: 100 * MS,
            stall: None,
            backend_timeout: None,
            max_inflight_bytes,
            pdc: JournalParams::default(),
            tenants: vec![CoreTenant {
                name: "a".into(),
                size: 1 << 20,
                cache: Cache::Writeback,
            }],
            shards: 2,
        };
        let target = Target {
            buffered: 3,
            direct: None,
            base: 0,
            cache: Cache::Writeback,
        };
        let policy = crate::policy::build(
            "none",
            Default::default(),
            &[TenantSpec::weighted("a", 1.0)],
        )
        .expect("none builds");
        let stats = Arc::new(LiveStats::new(&[("a".into(), 1.0)]));
        EngineCore::new(
            cfg,
            vec![Some(Store::File(target))],
            policy,
            crate::device::cost::CostModel::generic_ssd(),
            None,
            stats,
            None,
            false,
        )
    }

    fn attach(core: &mut EngineCore) -> usize {
        let codec = handshaken(&core.cfg.clone(), 0);
        core.attach(1, "test".into(), 0, codec, 0)
            .expect("not stopping")
    }

    fn intents(core: &mut EngineCore) -> Vec<Intent> {
        let mut v = Vec::new();
        core.take_intents(&mut v);
        v
    }

    /// Hands `bytes` to the receive the core asked for.
    fn receive(core: &mut EngineCore, slot: usize, bytes: &[u8], now: Nanos) {
        let buf = core.receive_buffer(slot);
        assert!(buf.len() >= bytes.len());
        buf[..bytes.len()].copy_from_slice(bytes);
        core.received(slot, bytes.len() as i32, now);
    }

    /// Completes every file operation asked for, whole.
    fn complete_io(core: &mut EngineCore, asked: &[Intent], now: Nanos) {
        for i in asked {
            if let Intent::Io(id) = *i {
                let (io, store) = core.transfer(id);
                let n = match io.next_op(store.file().expect("a file")) {
                    FileOp::Read { buf, .. } => buf.len() as i32,
                    FileOp::Write { data, .. } => data.len() as i32,
                    _ => 0,
                };
                core.io_done(id, n, now);
            }
        }
    }

    fn reads(n: u64, len: u32) -> Vec<u8> {
        (1..=n)
            .flat_map(|h| request_header(proto::CMD_READ, 0, h, 0, len))
            .collect()
    }

    /// A tenant added while running is served beside the others; drained, its
    /// connection stops being read, is answered, and closes, while the other tenant's
    /// requests go on; it takes no connection until resumed.
    #[test]
    fn a_tenant_added_then_drained_leaves_the_others_alone() {
        let mut c = core(8, 64, 64 << 20);
        let a = attach(&mut c);
        let spec = TenantSpec::weighted("b", 2.0);
        assert_eq!(c.host.observer().0.add_tenant("b", 2.0), 1);
        let target = Target {
            buffered: 4,
            direct: None,
            base: 0,
            cache: Cache::Writeback,
        };
        let b_tenant = CoreTenant {
            name: "b".into(),
            size: 1 << 20,
            cache: Cache::Writeback,
        };
        assert_eq!(
            c.add_tenant(b_tenant, &spec, Some(Store::File(target)), 0),
            1
        );
        let codec = handshaken(&c.cfg.clone(), 1);
        let b = c.attach(2, "test".into(), 1, codec, 0).expect("served");
        let _ = intents(&mut c);
        receive(&mut c, a, &reads(1, 4096), MS);
        receive(&mut c, b, &reads(1, 4096), MS);
        c.turn(MS);
        let asked = intents(&mut c);
        assert!(
            asked.contains(&Intent::Io(1)) && asked.contains(&Intent::Io(2)),
            "both dispatched: {asked:?}"
        );
        let (_, tb) = c.transfer(2);
        assert_eq!(
            tb.file().expect("a file").buffered,
            4,
            "the added tenant's request goes to its file"
        );
        complete_io(&mut c, &asked, 2 * MS);
        c.turn(2 * MS);
        let asked = intents(&mut c);
        assert!(asked.contains(&Intent::Send(a)) && asked.contains(&Intent::Send(b)));
        for slot in [a, b] {
            c.sent(slot, 4096 + 16, 2 * MS);
        }
        c.turn(2 * MS);
        let _ = intents(&mut c);
        assert_eq!(c.host.observer().0.snapshot()[1].connections, 1);
        // Drained: its receive is made to return, then it closes; a's goes on.
        c.drain_tenant(1);
        assert_eq!(intents(&mut c), vec![Intent::ShutRead(b)]);
        c.received(b, 0, 3 * MS);
        c.turn(3 * MS);
        let asked = intents(&mut c);
        assert!(asked.contains(&Intent::Close(b)), "{asked:?}");
        assert!(!asked.contains(&Intent::Close(a)), "{asked:?}");
        assert_eq!(c.host.observer().0.snapshot()[1].connections, 0);
        receive(
            &mut c,
            a,
            &request_header(proto::CMD_READ, 0, 3, 0, 4096),
            4 * MS,
        );
        c.turn(4 * MS);
        assert!(
            intents(&mut c).contains(&Intent::Io(3)),
            "a is still served"
        );
        let codec = handshaken(&c.cfg.clone(), 1);
        assert_eq!(c.attach(4, "test".into(), 1, codec, 4 * MS), None);
        c.resume_tenant(1);
        let codec = handshaken(&c.cfg.clone(), 1);
        assert!(c.attach(5, "test".into(), 1, codec, 4 * MS).is_some());
        assert_eq!(c.live_requests(), 1);
    }

    /// Connections go to the shard serving the fewest, between equals the next in turn,
    /// and a closed one frees its place.
    #[test]
    fn connections_go_to_the_least_loaded_shard_in_turn() {
        let mut p = Placement::new(3);
        for slot in 0..3 {
            p.place(slot);
        }
        assert_eq!((0..3).map(|s| p.shard(s)).collect::<Vec<_>>(), [0, 1, 2]);
        p.leave(1);
        p.place(1);
        assert_eq!(p.shard(1), 1, "the only shard with room");
        // One after another (each closed before the next): still in turn.
        let mut seen = Vec::new();
        for _ in 0..4 {
            p.place(3);
            seen.push(p.shard(3));
            p.leave(3);
        }
        assert_eq!(seen, [2, 0, 1, 2]);
        assert_eq!(p.load, [1, 1, 1]);
    }

    /// Every intent names the connection whose ring carries it out: its own slot, or
    /// for a request's I/O the connection that sent the request; none once the
    /// request is answered.
    #[test]
    fn an_intent_is_homed_on_its_connection() {
        let mut c = core(8, 64, 64 << 20);
        let a = attach(&mut c);
        let b = attach(&mut c);
        assert_ne!(a, b);
        assert_eq!(
            intents(&mut c),
            vec![Intent::Receive(a), Intent::Receive(b)]
        );
        receive(&mut c, b, &reads(1, 4096), 0);
        receive(
            &mut c,
            a,
            &request_header(proto::CMD_READ, 0, 2, 0, 4096),
            0,
        );
        c.turn(0);
        let asked = intents(&mut c);
        let homes: Vec<_> = asked.iter().map(|&i| (i, c.home(i))).collect();
        assert!(homes.contains(&(Intent::Io(1), Some(b))), "{homes:?}");
        assert!(homes.contains(&(Intent::Io(2), Some(a))), "{homes:?}");
        for (i, home) in &homes {
            if let Intent::Receive(slot) = i {
                assert_eq!(*home, Some(*slot));
            }
        }
        assert_eq!(c.home(Intent::BlockStatus(1)), None);
        complete_io(&mut c, &asked, MS);
        c.turn(MS);
        assert_eq!(c.home(Intent::Io(1)), None, "answered: no longer live");
        assert_eq!(c.home(Intent::Send(b)), Some(b));
    }

    #[test]
    fn a_tenant_at_its_queue_limit_is_not_read_until_room_is_made() {
        // One on the device, one held: the third request waits in the socket.
        let mut c = core(1, 1, 64 << 20);
        let slot = attach(&mut c);
        assert_eq!(intents(&mut c), vec![Intent::Receive(slot)]);
        // Three requests arrive at once: the codec holds them all.
        receive(&mut c, slot, &reads(3, 4096), 0);
        c.turn(0);
        let asked = intents(&mut c);
        assert_eq!(
            asked,
            vec![Intent::Io(1)],
            "one dispatched, no receive asked"
        );
        assert_eq!(
            c.live_requests(),
            2,
            "one on the device, one held: the limit"
        );
        complete_io(&mut c, &asked, MS);
        c.turn(MS);
        let asked = intents(&mut c);
        // The reply goes out, the held one is dispatched, the third is admitted.
        assert!(asked.contains(&Intent::Send(slot)), "{asked:?}");
        assert!(asked.contains(&Intent::Io(2)), "{asked:?}");
        assert_eq!(c.live_requests(), 2);
        assert!(
            !asked.contains(&Intent::Receive(slot)),
            "still at its limit"
        );
    }

    /// A backend error is logged with the operation, its range and the errno: the first
    /// at once, then at most one every 10 s per tenant, counting those between.
    #[test]
    fn backend_errors_are_logged_with_errno_and_offset_and_rate_limited() {
        let mut c = core(8, 64, 64 << 20);
        let slot = attach(&mut c);
        let _ = intents(&mut c);
        let fail = |c: &mut EngineCore, handle: u64, now: Nanos| {
            let mut req = request_header(proto::CMD_WRITE, 0, handle, 8192, 4096);
            req.extend_from_slice(&[7; 4096]);
            receive(c, slot, &req, now);
            c.turn(now);
            let asked = intents(c);
            assert!(asked.contains(&Intent::Io(handle)), "{asked:?}");
            c.io_done(handle, -libc::ENOSPC, now);
            c.turn(now);
            let _ = intents(c);
            c.take_logs().0
        };
        let first = fail(&mut c, 1, 0);
        assert_eq!(first.len(), 1, "{first:?}");
        assert_eq!(
            first[0].text,
            "ioshare: a: the backend failed a write of 4096 bytes at byte 8192: No space left on device (os error 28); answered ENOSPC (reported at most every 10 s)"
        );
        assert!(fail(&mut c, 2, MS).is_empty(), "held back");
        assert!(fail(&mut c, 3, 2 * MS).is_empty(), "held back");
        let later = fail(&mut c, 4, 10_000 * MS);
        assert_eq!(later.len(), 1, "{later:?}");
        assert!(
            later[0]
                .text
                .ends_with("(reported at most every 10 s, 2 more since the last report)"),
            "{}",
            later[0].text
        );
    }

    /// A block status is a request like any other: it waits for the policy's dispatch
    /// (here behind a read, at queue depth 1), its lookup is the shell's
    /// ([`Intent::BlockStatus`], at most [`crate::io::extents::MAX_WALK`] extents), and
    /// past the backend timeout it is answered `EIO`, its late answer dropped.
    #[test]
    fn a_block_status_is_dispatched_answered_and_timed_out_like_a_request() {
        let mut c = core(1, 64, 64 << 20);
        c.cfg.backend_timeout = Some(1_000 * MS);
        let codec = crate::server::swarm::handshaken_asking(&c.cfg.clone(), 0, true);
        let slot = c
            .attach(1, "test".into(), 0, codec, 0)
            .expect("not stopping");
        let _ = intents(&mut c);
        let mut bytes = reads(1, 4096);
        for handle in [2, 3] {
            bytes.extend(request_header(
                proto::CMD_BLOCK_STATUS,
                0,
                handle,
                0,
                1 << 20,
            ));
        }
        receive(&mut c, slot, &bytes, 0);
        c.turn(0);
        let first = intents(&mut c);
        assert!(first.contains(&Intent::Io(1)));
        assert!(
            !first.iter().any(|i| matches!(i, Intent::BlockStatus(_))),
            "queue depth 1: the read goes first {first:?}"
        );
        complete_io(&mut c, &first, MS);
        c.turn(MS);
        let second = intents(&mut c);
        assert!(second.contains(&Intent::BlockStatus(2)), "{second:?}");
        let ask = c.block_status_ask(2);
        assert_eq!(
            (ask.at, ask.len, ask.max_extents),
            (0, 1 << 20, crate::io::extents::MAX_WALK)
        );
        let hole = proto::STATE_HOLE | proto::STATE_ZERO;
        c.block_status_done(2, Ok(vec![(1 << 20, hole)]), 2 * MS);
        c.turn(2 * MS);
        let third = intents(&mut c);
        assert!(third.contains(&Intent::BlockStatus(3)), "{third:?}");
        let counters = |c: &mut EngineCore| c.host.observer().0.snapshot()[0].clone();
        assert_eq!(
            (counters(&mut c).completed, counters(&mut c).dispatched),
            (2, 3)
        );
        // Never answered: EIO at the timeout, the late answer dropped.
        c.turn(2 * MS + 1_000 * MS);
        assert_eq!(counters(&mut c).backend_timeouts, 1);
        let logs = c.take_logs().0;
        assert!(
            logs.iter().any(|l| l
                .text
                .contains("has not answered a block status of 1048576 bytes")),
            "{logs:?}"
        );
        assert_eq!(c.live_requests(), 1, "kept until the lookup comes back");
        c.block_status_done(3, Ok(vec![(1 << 20, hole)]), 3_000 * MS);
        assert_eq!(c.live_requests(), 0);
        c.host.check().unwrap();
    }

    /// A request its backend never answers is answered `EIO` at the backend timeout,
    /// counted and logged; its entry (and buffer) stays for the kernel until the
    /// operation does return, and is dropped then.
    #[test]
    fn a_request_its_backend_does_not_answer_is_answered_eio_at_the_timeout() {
        let mut c = core(8, 64, 64 << 20);
        c.cfg.backend_timeout = Some(1_000 * MS);
        let slot = attach(&mut c);
        let _ = intents(&mut c);
        receive(&mut c, slot, &reads(1, 4096), 0);
        c.turn(0);
        assert!(intents(&mut c).contains(&Intent::Io(1)));
        assert!(
            c.next_wake().is_some_and(|w| w <= 1_000 * MS),
            "woken for the timeout"
        );
        c.turn(999 * MS);
        assert!(!intents(&mut c).contains(&Intent::Send(slot)), "not yet");
        c.turn(1_000 * MS);
        assert!(intents(&mut c).contains(&Intent::Send(slot)), "answered");
        let counters = &c.host.observer().0.snapshot()[0];
        assert_eq!((counters.errors, counters.backend_timeouts), (1, 1));
        let logs = c.take_logs().0;
        assert!(
            logs.iter().any(|l| l.text.starts_with(
                "ioshare: a: its backend has not answered a read of 4096 bytes at byte 0 in 1.0 s: answered EIO"
            )),
            "{logs:?}"
        );
        assert_eq!(
            c.live_requests(),
            1,
            "kept until the kernel gives the buffer back"
        );
        assert_eq!(c.host.in_flight(), 0, "its device slot is free");
        c.io_done(1, 4096, 1_500 * MS);
        assert_eq!(c.live_requests(), 0);
        c.host.check().unwrap();
    }

    /// A write answered `EIO` past the timeout may still land: until it is back from
    /// the backend, the tenant's newer writes fail at once (none is acknowledged and
    /// then overwritten by the older one); reads go on; once it is back, writes do too.
    #[test]
    fn writes_fail_fast_while_an_abandoned_write_may_still_land() {
        let mut c = core(8, 64, 64 << 20);
        c.cfg.backend_timeout = Some(1_000 * MS);
        let slot = attach(&mut c);
        let _ = intents(&mut c);
        let write = |handle| {
            let mut w = request_header(proto::CMD_WRITE, 0, handle, 0, 4096);
            w.extend_from_slice(&[9; 4096]);
            w
        };
        receive(&mut c, slot, &write(1), 0);
        c.turn(0);
        assert!(intents(&mut c).contains(&Intent::Io(1)));
        c.turn(1_000 * MS);
        let _ = intents(&mut c);
        receive(&mut c, slot, &write(2), 1_100 * MS);
        c.turn(1_100 * MS);
        let asked = intents(&mut c);
        assert!(!asked.contains(&Intent::Io(2)), "not sent: {asked:?}");
        assert_eq!(c.host.observer().0.snapshot()[0].errors, 2);
        receive(
            &mut c,
            slot,
            &request_header(proto::CMD_READ, 0, 3, 0, 4096),
            1_200 * MS,
        );
        c.turn(1_200 * MS);
        assert!(intents(&mut c).contains(&Intent::Io(3)), "reads go on");
        c.io_done(1, 4096, 1_300 * MS);
        c.io_done(3, 4096, 1_300 * MS);
        c.turn(1_300 * MS);
        let _ = intents(&mut c);
        receive(&mut c, slot, &write(4), 1_400 * MS);
        c.turn(1_400 * MS);
        assert!(
            intents(&mut c).contains(&Intent::Io(4)),
            "the fence is down"
        );
    }

    #[test]
    fn the_memory_budget_holds_at_its_exact_bound() {
        let held = budget::held_by(4096);
        // Room for exactly two 4 KiB reads and their replies.
        let mut c = core(8, 64, 2 * held);
        let slot = attach(&mut c);
        let _ = intents(&mut c);
        receive(&mut c, slot, &reads(3, 4096), 0);
        c.turn(0);
        assert_eq!(
            c.inflight_bytes(),
            2 * held,
            "two taken, exactly the budget"
        );
        assert_eq!(c.live_requests(), 2, "the third waits");
        let asked = intents(&mut c);
        complete_io(&mut c, &asked, MS);
        c.turn(MS);
        // Replies queued but not sent still hold their bytes.
        assert_eq!(c.inflight_bytes(), 2 * held);
        assert_eq!(c.live_requests(), 0);
        let asked = intents(&mut c);
        assert!(asked.contains(&Intent::Send(slot)));
        let all = c.send_bytes(slot, usize::MAX).len();
        c.sent(slot, all as i32, 2 * MS);
        assert_eq!(c.inflight_bytes(), 0, "sent: released");
        c.turn(2 * MS);
        assert_eq!(c.inflight_bytes(), held, "the third taken now");
        assert!(c.inflight_bytes() <= c.memory_bound());
    }

    #[test]
    fn a_request_one_byte_over_the_budget_waits_and_the_planted_bug_does_not() {
        let held = budget::held_by(4096);
        for (plant, taken) in [(None, 2), (Some(Plant::BudgetOffByOne), 3)] {
            let mut c = core(8, 64, 3 * held - 1);
            if let Some(bug) = plant {
                c.plant(bug);
            }
            let slot = attach(&mut c);
            let _ = intents(&mut c);
            receive(&mut c, slot, &reads(3, 4096), 0);
            c.turn(0);
            assert_eq!(c.live_requests(), taken, "{plant:?}");
            assert_eq!(c.inflight_bytes() <= c.memory_bound(), plant.is_none());
        }
    }

    #[test]
    fn a_core_that_ignores_has_room_answers_eio_for_what_it_should_have_left_unread() {
        let mut c = core(1, 1, 64 << 20);
        c.plant(Plant::IgnoreHasRoom);
        let slot = attach(&mut c);
        let _ = intents(&mut c);
        receive(&mut c, slot, &reads(3, 4096), 0);
        c.turn(0);
        // The third was read past the limit: refused, an EIO reply on its way.
        assert!(intents(&mut c).contains(&Intent::Send(slot)));
        let reply = c.send_bytes(slot, 16);
        assert_eq!(
            u32::from_be_bytes(reply[4..8].try_into().unwrap()),
            proto::EIO
        );
    }

    #[test]
    fn a_client_that_does_not_take_its_replies_is_cut_after_the_send_grace() {
        let mut c = core(8, 64, 64 << 20);
        let slot = attach(&mut c);
        let _ = intents(&mut c);
        receive(&mut c, slot, &reads(1, 4096), 0);
        c.turn(0);
        let asked = intents(&mut c);
        complete_io(&mut c, &asked, MS);
        c.turn(MS);
        assert_eq!(intents(&mut c), vec![Intent::Send(slot)]);
        // The client never takes it. The drain starts; its deadline passes.
        c.drain(2 * MS);
        assert_eq!(intents(&mut c), vec![Intent::ShutRead(slot)]);
        let deadline = c.deadline().expect("draining");
        c.received(slot, 0, 3 * MS);
        c.turn(deadline + SEND_GRACE - 1);
        assert!(
            !intents(&mut c).contains(&Intent::Cut(slot)),
            "not before the grace ends"
        );
        assert!(!c.is_done());
        assert_eq!(c.next_wake(), Some(deadline + SEND_GRACE));
        c.turn(deadline + SEND_GRACE);
        assert_eq!(intents(&mut c), vec![Intent::Cut(slot)]);
        // The stuck send fails; the connection closes and the core is done.
        c.sent(slot, -libc::EPIPE, deadline + SEND_GRACE);
        c.turn(deadline + SEND_GRACE);
        assert_eq!(intents(&mut c), vec![Intent::Close(slot)]);
        assert!(c.is_done());
    }

    #[test]
    fn a_disconnect_closes_once_everything_is_answered() {
        let mut c = core(8, 64, 64 << 20);
        let slot = attach(&mut c);
        let _ = intents(&mut c);
        let mut bytes = reads(1, 4096);
        bytes.extend(request_header(proto::CMD_DISC, 0, 9, 0, 0));
        receive(&mut c, slot, &bytes, 0);
        c.turn(0);
        let asked = intents(&mut c);
        assert_eq!(
            asked,
            vec![Intent::Io(1)],
            "no receive after the disconnect"
        );
        assert_eq!(c.connections(), 1, "open while a request is outstanding");
        complete_io(&mut c, &asked, MS);
        c.turn(MS);
        assert_eq!(intents(&mut c), vec![Intent::Send(slot)]);
        let all = c.send_bytes(slot, usize::MAX).len();
        c.sent(slot, all as i32, 2 * MS);
        c.turn(2 * MS);
        assert_eq!(intents(&mut c), vec![Intent::Close(slot)]);
        assert_eq!((c.connections(), c.inflight_bytes()), (0, 0));
    }
}
