//! The live server's device loop: `server.threads` engine threads ("shards"), each with
//! its own io_uring ring, sharing the open files, the sockets of every connection past
//! its handshake, and the [`EngineCore`] that decides everything else. Sockets are read
//! and written on the same ring as the files, so a request goes from the client's bytes
//! to the policy, to the backend and back to the client without a thread hand-off, and
//! one `io_uring_enter` submits and reaps socket and file I/O together. This shell only
//! carries out the core's [`Intent`]s on a ring and hands it what the ring returns, with
//! the wall-clock time; rare messages (a new connection, a reload, the drain) come on a
//! channel with an eventfd read kept on shard 0's ring to wake it.
//!
//! Shards: the core places each connection on a shard (the one serving the fewest
//! when it attaches, between equals the next in turn: [`EngineCore::home`]); its
//! receives, sends and its requests' file I/O go on that shard's ring. The core (one
//! policy, one host: the promises are the same with any number of threads) sits behind
//! one lock, which a shard takes once a turn of its loop for everything the turn brings
//! (the completions of one wait, the intents they make, the policy's decisions), and
//! lets go before it submits and waits: the kernel's work (socket copies, file I/O,
//! wake-ups), most of a request's CPU, runs on every shard at once. An intent of another shard's connection
//! (a completion here let the policy dispatch a request of a connection there) is left
//! in that shard's mail and the shard woken through its eventfd.
//!
//! Its own rule: teardown waits for every entry a shard put on its ring before a buffer
//! is freed (`Shard::settle`), on every shard, whatever ended the loop.

// io_uring submissions (buffers outlive their entries) and the eventfd.
#![allow(unsafe_code)]

use super::backend::{Files, Store};
use super::capture::Capture;
use super::config::{ServerConfig, TenantConfig};
use super::conn::{Attach, Slot};
use super::core::{CoreConfig, CoreTenant, EngineCore, Intent, PUBLISH_EVERY};
use super::stats::LiveStats;
use crate::device::{DeviceModel, DeviceStats};
use crate::io::ring::Ring;
use crate::limits::governor::Limits;
use crate::metrics::Recorder;
use crate::policy::{Observation, Policy};
use crate::types::{Nanos, TenantId, TenantSpec};
use io_uring::{opcode, types};
use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::mpsc::{Receiver, Sender, TryRecvError};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

/// What a completion on the ring belongs to: `user_data` is a request id (below
/// `TAG_RECV`), or a tag with a connection's slot, or `WAKE`.
const TAG_RECV: u64 = 1 << 62;
const TAG_SEND: u64 = 2 << 62;
const TAG_MASK: u64 = 3 << 62;
/// `user_data` of the eventfd read that wakes the loop.
const WAKE: u64 = u64::MAX;
/// The rbd backend's eventfd read: its images have completions.
const IMAGES: u64 = u64::MAX - 1;

/// `IORING_RECVSEND_POLL_FIRST`: a receive waits for the socket to be readable before
/// its first try (a receive is asked for right after the last one emptied the socket,
/// so a first try would mostly find nothing).
const RECV_POLL_FIRST: u16 = 1;

/// What the accepting side tells the engine.
pub enum Message {
    /// A connection finished its handshake; the engine serves it from now on.
    Attach(Attach),
    /// A tenant's weight, SLO, reservation or limit changed (configuration reload).
    Update {
        /// Which tenant.
        tenant: TenantId,
        /// Its new promise.
        spec: TenantSpec,
    },
    /// A tenant joins (`add-tenant`), with its image opened ([`Files::open_added`]).
    /// Its id is the number of tenants before it.
    Add(Box<(TenantConfig, Files)>),
    /// Stop reading one tenant's connections, serve what they sent, close them, and
    /// refuse new ones (`drain-tenant`, `remove-tenant`).
    DrainTenant(TenantId),
    /// A drained tenant takes connections again.
    ResumeTenant(TenantId),
    /// Limits decided outside the policy (a cluster's fronts: [`super::front`]), per
    /// tenant, from now on.
    Limits(Vec<(TenantId, Limits)>),
    /// Finish what was received, sync every file, and stop.
    Drain,
}

/// The sending side: the accepting side hands connections and control through it.
#[derive(Clone)]
pub struct EngineHandle {
    tx: Sender<Message>,
    wake: Arc<File>,
}

impl EngineHandle {
    /// Hands a connection to the engine; `false` when the engine is gone.
    pub fn attach(&self, a: Attach) -> bool {
        let sent = self.tx.send(Message::Attach(a)).is_ok();
        self.poke();
        sent
    }

    /// Stops receiving: what was received is served, then the engine returns.
    pub fn drain(&self) {
        let _ = self.tx.send(Message::Drain);
        self.poke();
    }

    /// Hands the engine a tenant added while running, its image opened.
    pub fn add_tenant(&self, tenant: TenantConfig, files: Files) -> bool {
        let sent = self
            .tx
            .send(Message::Add(Box::new((tenant, files))))
            .is_ok();
        self.poke();
        sent
    }

    /// Drains one tenant (`resume: false`) or serves it again.
    pub fn close_tenant(&self, tenant: TenantId, closed: bool) {
        let m = if closed {
            Message::DrainTenant(tenant)
        } else {
            Message::ResumeTenant(tenant)
        };
        let _ = self.tx.send(m);
        self.poke();
    }

    /// Applies a tenant's new weight/SLO/reservation/limit from the policy's next
    /// period on.
    pub fn update(&self, tenant: TenantId, spec: TenantSpec) {
        let _ = self.tx.send(Message::Update { tenant, spec });
        self.poke();
    }

    /// Hands the policy limits decided outside it (a cluster's fronts); `false` when
    /// the engine is gone.
    pub fn set_limits(&self, limits: Vec<(TenantId, Limits)>) -> bool {
        let sent = self.tx.send(Message::Limits(limits)).is_ok();
        self.poke();
        sent
    }

    fn poke(&self) {
        poke(&self.wake);
    }
}

/// Why the engine could not start or stopped on its own.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The eventfd that wakes the loop could not be made.
    #[error("eventfd: {0}")]
    Eventfd(std::io::Error),
    /// The ring failed (set-up, submission or a wait).
    #[error("io_uring: {0}")]
    Ring(std::io::Error),
    /// The loop ended with I/O the kernel still had; its buffers were leaked.
    #[error("the engine stopped with I/O still in the kernel")]
    Unsettled,
    /// An engine thread could not be started.
    #[error("cannot start an engine thread: {0}")]
    Thread(std::io::Error),
}

/// The receiving side of the engine's channel.
pub struct Inbox {
    rx: Receiver<Message>,
    wake: Arc<File>,
}

#[cfg(test)]
impl Inbox {
    /// What was sent so far, in order, as (kind, tenant) for tests of the sending side.
    pub(crate) fn sent(&self) -> Vec<(&'static str, Option<TenantId>)> {
        self.rx
            .try_iter()
            .map(|m| match m {
                Message::Attach(a) => ("attach", Some(a.tenant)),
                Message::Update { tenant, .. } => ("update", Some(tenant)),
                Message::Add(_) => ("add", None),
                Message::DrainTenant(t) => ("drain", Some(t)),
                Message::ResumeTenant(t) => ("resume", Some(t)),
                Message::Limits(_) => ("limits", None),
                Message::Drain => ("drain all", None),
            })
            .collect()
    }
}

/// Creates the engine's channel; [`run`] consumes the receiving side.
pub fn channel() -> Result<(EngineHandle, Inbox), EngineError> {
    let (tx, rx) = std::sync::mpsc::channel();
    let wake = Arc::new(eventfd()?);
    Ok((
        EngineHandle {
            tx,
            wake: wake.clone(),
        },
        Inbox { rx, wake },
    ))
}

/// What the engine hands back when it stops, for the run's report.
pub struct Outcome {
    /// The recorder given to [`run`], with every request of the run in it.
    pub recorder: Option<Recorder>,
    /// When the engine stopped (nanoseconds since the server's clock started).
    pub end: Nanos,
    /// The device model's counters (emulated backend), or zeroes.
    pub device: DeviceStats,
    /// The policy's full observation at the end.
    pub policy: Observation,
    /// Per tenant with `cache = "pdc"`, the groups its journal detector marked.
    pub journal: Vec<Option<Vec<usize>>>,
}

/// The device loop, on `config.threads` threads. Returns when drained. With a
/// `recorder`, every request is recorded in it (arrival, completion, refusal) for the
/// report of the run.
#[allow(clippy::too_many_arguments)]
pub fn run(
    config: &ServerConfig,
    files: Files,
    policy: Box<dyn Policy>,
    cost: crate::device::cost::CostModel,
    model: Option<Box<dyn DeviceModel>>,
    inbox: Inbox,
    stats: Arc<LiveStats>,
    clock: Instant,
    recorder: Option<Recorder>,
    capture: Option<Capture>,
) -> Result<Outcome, EngineError> {
    let Inbox { rx, wake } = inbox;
    let mut core = EngineCore::new(
        CoreConfig::of(config),
        files.targets(),
        policy,
        cost,
        model,
        stats,
        recorder,
        capture.is_some(),
    );
    core.panic_after(
        std::env::var(PANIC_AFTER_VAR)
            .ok()
            .and_then(|v| v.parse().ok()),
    );
    let threads = config.threads.max(1) as usize;
    let mut wakes = vec![wake];
    for _ in 1..threads {
        wakes.push(Arc::new(eventfd()?));
    }
    let lookups = super::lookups::Lookups::start(wakes[0].clone()).map_err(EngineError::Thread)?;
    let shared = Mutex::new(Shared {
        lookups,
        lookup_timeout: config.backend_timeout.map(std::time::Duration::from_nanos),
        offload: files.offload().iter().copied().collect(),
        files,
        core: Some(core),
        sockets: Vec::new(),
        capture,
        mail: vec![Vec::new(); threads],
        stop: false,
        timer_at: Nanos::MAX,
    });
    let ring_entries = (config.queue_depth * 2 + 64).next_power_of_two();
    let ends = run_shards(&shared, &wakes, &rx, ring_entries, clock);
    let mut shared = shared.into_inner().unwrap_or_else(PoisonError::into_inner);
    // The images' operations use the core's buffers too.
    let images_settled = match shared.files.images() {
        Some(images) => images.settle(TEARDOWN_WAIT, &mut Vec::new()),
        None => true,
    };
    let settled = images_settled && ends.iter().all(|e| e.settled);
    if !settled {
        tracing::warn!(
            "the engine stops with I/O still in the kernel: its buffers are left allocated"
        );
        std::mem::forget(shared.core.take());
        std::mem::forget(std::mem::take(&mut shared.sockets));
    }
    // The capture is closed whatever became of the run.
    let now = clock.elapsed().as_nanos() as Nanos;
    if let Some(c) = shared.capture.take()
        && let Err(e) = c.finish(now)
    {
        tracing::info!("{e}");
    }
    let mut failed = None;
    for end in ends {
        match end.ran {
            Err(panic) => std::panic::resume_unwind(panic),
            Ok(Err(e)) => failed = failed.or(Some(e)),
            Ok(Ok(())) => {}
        }
    }
    if let Some(e) = failed {
        return Err(e);
    }
    if !settled {
        return Err(EngineError::Unsettled);
    }
    if let Err(e) = shared.files.sync_all() {
        tracing::warn!("final sync failed: {e}");
    }
    let end = clock.elapsed().as_nanos() as Nanos;
    let out = shared.core.take().expect("the core is there").finish();
    Ok(Outcome {
        end,
        device: out.device,
        policy: out.policy,
        recorder: out.recorder,
        journal: out.journal,
    })
}

/// A fresh eventfd, for a shard's wake-ups.
fn eventfd() -> Result<File, EngineError> {
    // SAFETY: plain syscall; the descriptor is owned by the File from here on.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(EngineError::Eventfd(std::io::Error::last_os_error()));
    }
    // SAFETY: `fd` is a fresh descriptor nobody else owns.
    Ok(unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) })
}

/// Runs shard 0 on this thread and the others on threads of their own; returns how each
/// ended once all have, their rings settled.
fn run_shards(
    shared: &Mutex<Shared>,
    wakes: &[Arc<File>],
    rx: &Receiver<Message>,
    ring_entries: u32,
    clock: Instant,
) -> Vec<ShardEnd> {
    std::thread::scope(|scope| {
        let mut others = Vec::new();
        let mut ends = Vec::new();
        for index in 1..wakes.len() {
            let spawned = std::thread::Builder::new()
                .name(format!("engine-{index}"))
                .spawn_scoped(scope, move || {
                    shard(index, shared, wakes, None, ring_entries, clock)
                });
            match spawned {
                Ok(h) => others.push(h),
                Err(e) => {
                    stop_all(shared, wakes);
                    ends.push(ShardEnd {
                        ran: Ok(Err(EngineError::Thread(e))),
                        settled: true,
                    });
                    break;
                }
            }
        }
        ends.push(shard(0, shared, wakes, Some(rx), ring_entries, clock));
        for h in others {
            ends.push(h.join().unwrap_or_else(|panic| ShardEnd {
                ran: Err(panic),
                // A shard's own panic is caught before it settles: this is one in the
                // settling, when its buffers may still be the kernel's.
                settled: false,
            }));
        }
        ends
    })
}

/// How a shard ended: its loop's result (or panic), and whether its ring settled.
struct ShardEnd {
    ran: std::thread::Result<Result<(), EngineError>>,
    settled: bool,
}

/// One shard: its ring made on its thread, its loop, then (whatever ended it, a panic
/// included) every shard told to stop and its ring settled.
fn shard(
    index: usize,
    shared: &Mutex<Shared>,
    wakes: &[Arc<File>],
    rx: Option<&Receiver<Message>>,
    ring_entries: u32,
    clock: Instant,
) -> ShardEnd {
    // The shards' buffer pools together keep what one would.
    crate::buffer::share_pool(wakes.len());
    let ring = match Ring::for_this_thread(ring_entries) {
        Ok(ring) => ring,
        Err(e) => {
            stop_all(shared, wakes);
            return ShardEnd {
                ran: Ok(Err(EngineError::Ring(e))),
                settled: true,
            };
        }
    };
    let mut me = Shard {
        index,
        ring,
        wake: wakes[index].clone(),
        wake_buf: Box::new([0; 8]),
        wake_armed: false,
        images_buf: Box::new([0; 8]),
        images_armed: false,
        reaped: Vec::new(),
        clock,
        cqes: Vec::new(),
        intents: Vec::new(),
        pokes: vec![false; wakes.len()],
        served: false,
    };
    let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| me.run(shared, wakes, rx)));
    stop_all(shared, wakes);
    let settled = me.settle(shared);
    ShardEnd { ran, settled }
}

/// Tells every shard to stop and wakes it.
fn stop_all(shared: &Mutex<Shared>, wakes: &[Arc<File>]) {
    shared.lock().unwrap_or_else(PoisonError::into_inner).stop = true;
    for w in wakes {
        poke(w);
    }
}

/// A connection's socket, with what its sends need and its places under the
/// connection limits (given back when it is dropped).
struct Socket {
    fd: OwnedFd,
    /// The message header a send on the ring reads.
    msg: Box<libc::msghdr>,
    _slots: Vec<Slot>,
}

// SAFETY: the message header's pointers point at the core's iovecs of this connection;
// they are set and read (by the kernel, for a send) only while the shard that submits
// the send holds the engine's lock or the send is on its ring, and the core leaves those
// iovecs in place until the send's completion is handed back.
unsafe impl Send for Socket {}

/// What the engine's shards share, behind one lock that a shard takes once per turn of
/// its loop (all the completions of one wait, the intents they make, and the policy's
/// decisions in one go): the core, the sockets, the files, the capture.
///
/// Sharding: a connection's receives, sends and its requests' file I/O go on the ring of
/// the shard the core placed it on ([`EngineCore::home`]), so its completions come back
/// where its other events do and the kernel's socket and file work of different
/// connections runs on different threads; a shard whose turn makes an intent of another
/// shard's connection leaves it in that shard's mail and wakes it. Shard 0 also takes
/// the channel's messages, keeps the timers (the core's next wake-up; a turn elsewhere
/// that moves it earlier wakes shard 0) and reaps the rbd images' completions.
struct Shared {
    /// The decisions; `None` only once finished (or leaked by [`run`]).
    core: Option<EngineCore>,
    /// Sockets by the core's connection slots.
    sockets: Vec<Option<Socket>>,
    files: Files,
    /// `serve --capture`: every request as it arrives.
    capture: Option<Capture>,
    /// Descriptors of images on file systems that may block a submitting thread (FUSE,
    /// network file systems): their operations go to the kernel's workers at once.
    offload: std::collections::HashSet<std::os::fd::RawFd>,
    /// Per shard: intents another shard's turn made for it.
    mail: Vec<Vec<Intent>>,
    /// Block status lookups, off the engine's threads (their answers wake shard 0).
    lookups: super::lookups::Lookups,
    /// How long a lookup's answer is waited for (`backend_timeout_s`).
    lookup_timeout: Option<std::time::Duration>,
    /// Some shard's loop ended (drained, failed, panicked): every shard stops.
    stop: bool,
    /// When shard 0 will wake on its own (`Nanos::MAX`: not before an event).
    timer_at: Nanos,
}

impl Shared {
    fn core(&mut self) -> &mut EngineCore {
        self.core.as_mut().expect("the core runs")
    }

    /// When shard 0 must run again even if nothing completes: the core's next alarm,
    /// the capture's next hand-over while it holds lines.
    fn wake_at(&self, now: Nanos) -> Option<Nanos> {
        let capture = self
            .capture
            .as_ref()
            .filter(|c| c.holds_lines())
            .map(|_| now + PUBLISH_EVERY);
        let core = self.core.as_ref().expect("the core runs").next_wake();
        [core, capture].into_iter().flatten().min()
    }
}

/// Environment variable for tests of the server's supervision: the engine panics once
/// this many requests have arrived, as a bug in it would.
pub const PANIC_AFTER_VAR: &str = "IOSHARE_TEST_ENGINE_PANIC_AFTER";

/// What one engine thread owns: its ring and the buffers of its own reads.
struct Shard {
    index: usize,
    /// [`Shard::settle`] waits for what is still on it before anything is dropped.
    ring: Ring,
    /// This shard's eventfd (shard 0's is the channel's): its read on the ring returns
    /// when another thread wants this shard to look at the shared state.
    wake: Arc<File>,
    wake_buf: Box<[u8; 8]>,
    /// The eventfd read is on the ring.
    wake_armed: bool,
    /// Shard 0: the rbd images' eventfd read: its buffer, and whether it is on the ring.
    images_buf: Box<[u8; 8]>,
    images_armed: bool,
    /// Finished rbd operations of one wake-up (kept for its allocation).
    reaped: Vec<(u64, i32)>,
    clock: Instant,
    /// The ring's completions of one turn of the loop (kept for its allocation).
    cqes: Vec<(u64, i32)>,
    /// The core's intents being carried out (kept for its allocation).
    intents: Vec<Intent>,
    /// Shards left mail in this turn, to be woken once the lock is let go.
    pokes: Vec<bool>,
    /// It has seen a connection since it last emptied its buffer pool.
    served: bool,
}

/// The engine's lock; `None` when a shard panicked holding it (that shard reports).
fn lock(shared: &Mutex<Shared>) -> Option<MutexGuard<'_, Shared>> {
    shared.lock().ok()
}

impl Shard {
    fn now(&self) -> Nanos {
        self.clock.elapsed().as_nanos() as Nanos
    }

    fn run(
        &mut self,
        shared: &Mutex<Shared>,
        wakes: &[Arc<File>],
        rx: Option<&Receiver<Message>>,
    ) -> Result<(), EngineError> {
        let mut last_flush: Option<Nanos> = None;
        loop {
            let Some(mut g) = lock(shared) else {
                return Ok(());
            };
            if g.stop {
                return Ok(());
            }
            let mail = std::mem::take(&mut g.mail[self.index]);
            for intent in mail {
                self.carry_out(&mut g, intent)?;
            }
            self.take_completions(&mut g)?;
            if let Some(rx) = rx {
                self.take_messages(&mut g, rx)?;
                // Shard 0 (the one with the channel) takes the lookups' answers.
                let now = self.now();
                for (id, found) in g.lookups.take_found() {
                    g.core().block_status_done(id, found, now);
                }
            }
            let now = self.now();
            g.core().turn(now);
            self.apply(&mut g)?;
            if self.index == 0 && last_flush.is_none_or(|at| now >= at + PUBLISH_EVERY) {
                // The capture reaches its file at least this often.
                if let Some(c) = g.capture.as_mut() {
                    c.flush();
                }
                last_flush = Some(now);
            }
            if g.core().is_done() {
                g.stop = true;
                return Ok(());
            }
            if g.core().connections() > 0 {
                self.served = true;
            } else if std::mem::take(&mut self.served) {
                // Every client gone: the burst's memory goes back to the system (each
                // shard empties its own pool; shard 0 has the C allocator trim).
                crate::buffer::trim_pool();
                if self.index == 0 {
                    // SAFETY: plain libc call; it only gives free memory back.
                    unsafe { libc::malloc_trim(0) };
                }
                for (i, poked) in self.pokes.iter_mut().enumerate() {
                    *poked |= i != self.index;
                }
            }
            let until = g.wake_at(now);
            let until = if self.index == 0 {
                g.timer_at = until.unwrap_or(Nanos::MAX);
                until
            } else {
                if let Some(at) = until
                    && at < g.timer_at
                {
                    // Shard 0 sleeps past the new alarm: woken to keep it.
                    g.timer_at = at;
                    self.pokes[0] = true;
                }
                None
            };
            let images = g.files.images().map(|i| i.eventfd());
            drop(g);
            for (w, poked) in wakes.iter().zip(self.pokes.iter_mut()) {
                if std::mem::take(poked) {
                    poke(w);
                }
            }
            self.wait(until, images.filter(|_| self.index == 0))?;
        }
    }

    /// Handles every message waiting on the channel; a closed channel drains.
    fn take_messages(&mut self, g: &mut Shared, rx: &Receiver<Message>) -> Result<(), EngineError> {
        loop {
            let now = self.now();
            match rx.try_recv() {
                Ok(Message::Attach(a)) => attach(g, a, now),
                Ok(Message::Update { tenant, spec }) => g.core().update(tenant, &spec, now),
                Ok(Message::Drain) => g.core().drain(now),
                Ok(Message::Add(added)) => add_tenant(g, *added, now),
                Ok(Message::DrainTenant(t)) => g.core().drain_tenant(t),
                Ok(Message::ResumeTenant(t)) => g.core().resume_tenant(t),
                Ok(Message::Limits(limits)) => {
                    for (t, l) in limits {
                        g.core().set_limits(t, &l, now);
                    }
                }
                Err(TryRecvError::Empty) => return Ok(()),
                Err(TryRecvError::Disconnected) => {
                    g.core().drain(now);
                    return self.apply(g);
                }
            }
            self.apply(g)?;
        }
    }

    /// Carries out what the core asked for (on this ring, or left in the mail of the
    /// shard whose connection it is), writes its log lines and hands its arrivals to
    /// the capture.
    fn apply(&mut self, g: &mut Shared) -> Result<(), EngineError> {
        // Rounds until none is left: answering a block status makes a send.
        loop {
            let mut intents = std::mem::take(&mut self.intents);
            g.core().take_intents(&mut intents);
            let done = intents.is_empty();
            for &intent in &intents {
                let on_ring =
                    matches!(intent, Intent::Receive(_) | Intent::Send(_) | Intent::Io(_));
                let home = g.core().home(intent).unwrap_or(self.index);
                if on_ring && home != self.index {
                    g.mail[home].push(intent);
                    self.pokes[home] = true;
                } else {
                    // Shutting or closing a socket and a block status are done on the
                    // spot, whoever's they are: the core's order of events stays.
                    self.carry_out(g, intent)?;
                }
            }
            intents.clear();
            self.intents = intents;
            if done {
                break;
            }
        }
        let core = g.core.as_mut().expect("the core runs");
        let (logs, lost) = core.take_logs();
        let arrivals = core.take_arrivals();
        for l in logs {
            match l.peer {
                Some(peer) => super::logs::PeerLog::global().line(&peer, || l.text),
                None => super::logs::warn_line(&l.text),
            }
        }
        if lost > 0 {
            tracing::warn!("{lost} log line(s) dropped");
        }
        if let Some(c) = g.capture.as_mut() {
            for a in &arrivals {
                c.record(a);
            }
        }
        Ok(())
    }

    /// One intent on this shard's ring (or on the socket).
    fn carry_out(&mut self, g: &mut Shared, intent: Intent) -> Result<(), EngineError> {
        let core = g.core.as_mut().expect("the core runs");
        let e = match intent {
            Intent::Receive(slot) => {
                let fd = socket(&g.sockets, slot).fd.as_raw_fd();
                let room = core.receive_buffer(slot);
                opcode::Recv::new(types::Fd(fd), room.as_mut_ptr(), room.len() as u32)
                    .ioprio(if self.ring.is_deferred() {
                        RECV_POLL_FIRST
                    } else {
                        0
                    })
                    .build()
                    .user_data(TAG_RECV | slot as u64)
            }
            Intent::Send(slot) => {
                let iov = core.send_iov(slot);
                let s = g.sockets[slot].as_mut().expect("a socket in the slot");
                s.msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
                s.msg.msg_iovlen = iov.len() as _;
                opcode::SendMsg::new(types::Fd(s.fd.as_raw_fd()), &*s.msg)
                    .flags(libc::MSG_NOSIGNAL as u32)
                    .build()
                    .user_data(TAG_SEND | slot as u64)
            }
            Intent::Io(id) => {
                let (io, store) = core.transfer(id);
                let target = match store {
                    Store::File(target) => target,
                    Store::Image(image) => {
                        let images = g.files.images().expect("tenants with images have them");
                        if let Err(result) = images.submit(image, id, io.next_part(0)) {
                            // Refused at once: its completion is this.
                            core.io_done(id, result, self.now());
                        }
                        return Ok(());
                    }
                };
                let e = io.entry(target).user_data(id);
                if g.offload.contains(&target.buffered) {
                    e.flags(io_uring::squeue::Flags::ASYNC)
                } else {
                    e
                }
            }
            Intent::ShutRead(slot) => {
                shutdown(&socket(&g.sockets, slot).fd, libc::SHUT_RD);
                return Ok(());
            }
            Intent::Cut(slot) => {
                shutdown(&socket(&g.sockets, slot).fd, libc::SHUT_RDWR);
                return Ok(());
            }
            Intent::Close(slot) => {
                g.sockets[slot] = None;
                return Ok(());
            }
            Intent::BlockStatus(id) => {
                // The walk (lseek, which may block) off the engine's threads.
                let ask = core.block_status_ask(id);
                let deadline = g.lookup_timeout.map(|t| std::time::Instant::now() + t);
                if let Err(errno) = g.lookups.submit(id, ask, deadline) {
                    let now = self.now();
                    g.core().block_status_done(id, Err(errno), now);
                    g.core().send_replies();
                }
                return Ok(());
            }
        };
        push(&mut self.ring, e)
    }

    /// Submits what is queued on the ring and waits for a completion, a wake-up (the
    /// eventfd), the images' eventfd (`images`, shard 0) or `until`.
    fn wait(
        &mut self,
        until: Option<Nanos>,
        images: Option<std::os::fd::RawFd>,
    ) -> Result<(), EngineError> {
        if !self.wake_armed {
            let e = opcode::Read::new(
                types::Fd(self.wake.as_raw_fd()),
                self.wake_buf.as_mut_ptr(),
                8,
            )
            .build()
            .user_data(WAKE);
            push(&mut self.ring, e)?;
            self.wake_armed = true;
        }
        if !self.images_armed
            && let Some(fd) = images
        {
            let e = opcode::Read::new(types::Fd(fd), self.images_buf.as_mut_ptr(), 8)
                .build()
                .user_data(IMAGES);
            push(&mut self.ring, e)?;
            self.images_armed = true;
        }
        let timeout =
            until.map(|at| std::time::Duration::from_nanos(at.saturating_sub(self.now())));
        self.ring.wait(timeout).map_err(EngineError::Ring)
    }

    /// Hands the ring's completions to the core.
    fn take_completions(&mut self, g: &mut Shared) -> Result<(), EngineError> {
        // Copied out first: handling one may push to the ring.
        let mut cqes = std::mem::take(&mut self.cqes);
        self.ring.completions(&mut cqes);
        let now = self.now();
        for &(user_data, result) in &cqes {
            match user_data {
                WAKE => self.wake_armed = false,
                IMAGES => {
                    self.images_armed = false;
                    let images = g.files.images().expect("armed for images");
                    images.reap(&mut self.reaped);
                    for (id, result) in self.reaped.drain(..) {
                        g.core().io_done(id, result, now);
                    }
                }
                u if u & TAG_MASK == TAG_RECV => {
                    g.core().received((u & !TAG_MASK) as usize, result, now)
                }
                u if u & TAG_MASK == TAG_SEND => {
                    g.core().sent((u & !TAG_MASK) as usize, result, now)
                }
                id => g.core().io_done(id, result, now),
            }
            self.apply(g)?;
        }
        cqes.clear();
        self.cqes = cqes;
        Ok(())
    }
}

/// A tenant added while running: its files join the engine's, the core serves it.
fn add_tenant(g: &mut Shared, (tenant, files): (TenantConfig, Files), now: Nanos) {
    // Found when its image was opened, off the engine's threads.
    g.offload.extend(files.offload().iter().copied());
    let target = g.files.absorb(files, &tenant);
    if let Some(c) = g.capture.as_mut() {
        c.add(&tenant.spec.name, now);
    }
    let core = CoreTenant {
        name: tenant.spec.name.clone(),
        size: tenant.size,
        cache: tenant.cache,
    };
    let _ = g.core().add_tenant(core, &tenant.spec, target, now);
}

/// A connection past its handshake: its socket goes in the slot the core gives it;
/// when the core is stopping, dropping it closes the connection.
fn attach(g: &mut Shared, a: Attach, now: Nanos) {
    let Some(slot) = g.core().attach(a.id, a.peer, a.tenant, a.codec, now) else {
        return;
    };
    if g.sockets.len() <= slot {
        g.sockets.resize_with(slot + 1, || None);
    }
    assert!(g.sockets[slot].is_none(), "a slot holds one socket");
    g.sockets[slot] = Some(Socket {
        fd: a.fd,
        // SAFETY: an all-zero msghdr is a valid empty message.
        msg: Box::new(unsafe { std::mem::zeroed() }),
        _slots: a.slots,
    });
}

fn socket(sockets: &[Option<Socket>], slot: usize) -> &Socket {
    sockets[slot].as_ref().expect("a socket in the slot")
}

fn shutdown(fd: &OwnedFd, how: libc::c_int) {
    // SAFETY: plain syscall on a descriptor we own.
    unsafe { libc::shutdown(fd.as_raw_fd(), how) };
}

/// Queues `e` on the ring, counted until its completion is taken.
fn push(ring: &mut Ring, e: io_uring::squeue::Entry) -> Result<(), EngineError> {
    // SAFETY: every buffer an entry points to lives until its completion has been
    // taken: in the core (request data in its live requests; a connection's receive
    // buffer and the replies being sent, which the core leaves in place while the
    // receive or send is out, and a connection is not closed before both returned), in
    // the socket's `Socket` (the send's message header) or in the loop (the wake
    // buffer); a teardown settles every ring first (`Shard::settle`).
    unsafe { ring.push(&e) }.map_err(EngineError::Ring)
}

/// How long a stopping engine waits for what the kernel still has of its I/O.
const TEARDOWN_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

impl Shard {
    /// Whatever ended the loop (a drain, an error, a panic), the kernel may still read
    /// from or write into buffers the engine owns (receives, sends, file I/O, the wake
    /// read): dropping the ring does not wait for them. So the sockets are shut (their
    /// receives and sends return), the eventfds are written (their reads return), and
    /// the shard waits for every entry it put on its ring before any buffer is freed;
    /// if the ring fails or that takes longer than `TEARDOWN_WAIT`, its own buffers are
    /// leaked here and `false` returned ([`run`] then leaks the shared ones). Called once
    /// the loop has ended, on the shard's thread.
    fn settle(&mut self, shared: &Mutex<Shared>) -> bool {
        let (index, wake) = (self.index, &self.wake);
        let settled = self.ring.settle(TEARDOWN_WAIT, || {
            let mut g = shared.lock().unwrap_or_else(PoisonError::into_inner);
            for s in g.sockets.iter().flatten() {
                shutdown(&s.fd, libc::SHUT_RDWR);
            }
            poke(wake);
            if index == 0
                && let Some(images) = g.files.images()
            {
                poke_fd(images.eventfd());
            }
        });
        if settled {
            return true;
        }
        tracing::warn!(
            "engine thread {index}: {} I/O operations still in the kernel as it stops; their buffers are left allocated",
            self.ring.on_ring()
        );
        std::mem::forget(std::mem::replace(&mut self.wake_buf, Box::new([0; 8])));
        std::mem::forget(std::mem::replace(&mut self.images_buf, Box::new([0; 8])));
        false
    }
}

/// Wakes the engine's loop (its eventfd read returns).
fn poke(wake: &File) {
    poke_fd(wake.as_raw_fd());
}

/// Makes a read of eventfd `fd` return.
fn poke_fd(fd: std::os::fd::RawFd) {
    let one = 1u64.to_ne_bytes();
    // SAFETY: writing 8 bytes from a valid buffer to an eventfd the engine holds.
    unsafe { libc::write(fd, one.as_ptr().cast(), 8) };
}
