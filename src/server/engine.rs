//! The live server's device loop: one thread that owns the policy, the io_uring ring, the
//! open files and every connection past its handshake. Sockets are read and written on
//! the same ring as the files, so a request goes from the client's bytes to the policy,
//! to the backend and back to the client without a thread hand-off, and one
//! `io_uring_enter` submits and reaps socket and file I/O together. Requests enter the
//! policy with the wall-clock time; what the policy dispatches goes to the backend while
//! fewer than `queue_depth` are in flight. Rare messages (a new connection, a reload, the
//! drain) come on a channel with an eventfd read kept on the ring to wake the loop.
//!
//! What a request does on the file backend (which ring entry, what a completion means)
//! is [`super::backend`]'s; admission, dispatch and drain are the [`crate::host`] core
//! the simulator drives too.

// io_uring submissions (buffers outlive their entries) and the eventfd.
#![allow(unsafe_code)]

use super::backend::{Files, Next, Transfer};
use super::budget;
use super::capture::Capture;
use super::config::{Cache, ServerConfig};
use super::conn::{Attach, Conn};
use super::stats::LiveStats;
use crate::buffer::IoBuf;
use crate::device::{DeviceModel, DeviceStats, Finished, Submitted};
use crate::host::{Host, Limits, Status};
use crate::journal::{JournalDetector, Verdict};
use crate::metrics::Recorder;
use crate::nbd::proto;
use crate::nbd::{Command, CommandKind, Event};
use crate::policy::{Admission, Detail, Observation, Policy, Refusal};
use crate::types::{Completion, Nanos, Request, TenantId, TenantSpec};
use io_uring::{IoUring, opcode, types};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, TryRecvError};
use std::time::Instant;

/// How often the policy's state is published for `/metrics`.
const PUBLISH_EVERY: Nanos = 100_000_000;
/// After the drain deadline, how long replies may still take to reach a client before
/// its connection is cut.
const SEND_GRACE: Nanos = 1_000_000_000;

/// What a completion on the ring belongs to: `user_data` is a request id (below
/// `TAG_RECV`), or a tag with a connection's slot, or `WAKE`.
const TAG_RECV: u64 = 1 << 62;
const TAG_SEND: u64 = 2 << 62;
const TAG_MASK: u64 = 3 << 62;
/// `user_data` of the eventfd read that wakes the loop.
const WAKE: u64 = u64::MAX;

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

    /// Applies a tenant's new weight/SLO/reservation/limit from the policy's next
    /// period on.
    pub fn update(&self, tenant: TenantId, spec: TenantSpec) {
        let _ = self.tx.send(Message::Update { tenant, spec });
        self.poke();
    }

    fn poke(&self) {
        poke(&self.wake);
    }
}

/// A request from a connection.
/// Who is waiting for a request's reply.
#[derive(Debug, Clone, Copy)]
struct Submission {
    tenant: TenantId,
    /// Slot of the connection in the engine.
    conn: usize,
    handle: u64,
    /// Data the request holds of the memory budget (its payload or its read data).
    bytes: u64,
}

/// A request the host holds or the backend serves.
struct Live {
    sub: Submission,
    request: Request,
    /// When the policy dispatched it (`None`: still held by the policy).
    start: Option<Nanos>,
    /// Its I/O on the backend.
    io: Transfer,
    /// Emulated backend: when the device model finishes the request (`None` while a
    /// deferring model has not decided yet).
    model_finish: Option<Nanos>,
    /// Emulated backend: the reply's error once the data I/O is done, while the model's
    /// finish time is still ahead.
    io_result: Option<u32>,
}

/// The receiving side of the engine's channel.
pub struct Inbox {
    rx: Receiver<Message>,
    wake: Arc<File>,
}

/// Creates the engine's channel; [`run`] consumes the receiving side.
pub fn channel() -> anyhow::Result<(EngineHandle, Inbox)> {
    let (tx, rx) = std::sync::mpsc::channel();
    // SAFETY: plain syscall; the descriptor is owned by the File from here on.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if fd < 0 {
        anyhow::bail!("eventfd: {}", std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor nobody else owns.
    let wake = Arc::new(unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) });
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

/// What the live engine records: the counters behind the terminal line and `/metrics`,
/// and, with `serve --out`, the run's [`Recorder`].
type LiveObserver = (Arc<LiveStats>, Option<Recorder>);

/// The device loop. Returns when drained. With a `recorder`, every request is recorded
/// in it (arrival, completion, refusal) for the report of the run.
#[allow(clippy::too_many_arguments)]
pub fn run(
    config: &ServerConfig,
    files: Files,
    policy: Box<dyn Policy>,
    cost: crate::policy::cost::CostModel,
    model: Option<Box<dyn DeviceModel>>,
    inbox: Inbox,
    stats: Arc<LiveStats>,
    clock: Instant,
    recorder: Option<Recorder>,
    capture: Option<Capture>,
) -> anyhow::Result<Outcome> {
    let Inbox { rx, wake } = inbox;
    let limits = Limits {
        queue_depth: config.queue_depth,
        queue_limit: Some(config.queue_limit),
        refuse: config.refuse,
    };
    let mut engine = Engine {
        ring: new_ring(config.queue_depth)?,
        on_ring: 0,
        wake_buf: Box::new([0; 8]),
        wake,
        wake_armed: false,
        config,
        files,
        host: Host::new(
            policy,
            (stats, recorder),
            limits,
            config.tenants.len(),
            cost,
        ),
        model,
        clock,
        live: HashMap::new(),
        next_id: 0,
        conns: Vec::new(),
        cancelled: Vec::new(),
        finished: Vec::new(),
        cqes: Vec::new(),
        due: BinaryHeap::new(),
        model_done: Vec::new(),
        inflight_bytes: 0,
        past_end_logged: vec![None; config.tenants.len()],
        detectors: config
            .tenants
            .iter()
            .map(|t| (t.cache == Cache::Pdc).then(|| JournalDetector::new(t.size, config.pdc)))
            .collect(),
        capture,
        panic_after: std::env::var(PANIC_AFTER_VAR)
            .ok()
            .and_then(|v| v.parse().ok()),
    };
    // A panic in the loop is caught only to wait for the ring before the buffers go,
    // then goes on as it was.
    let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| engine.run(&rx)));
    engine.settle();
    let ran = ran.unwrap_or_else(|panic| std::panic::resume_unwind(panic));
    // The capture is closed whatever became of the run.
    if let Some(c) = engine.capture.take()
        && let Err(e) = c.finish(engine.now())
    {
        eprintln!("ioshare: {e}");
    }
    ran?;
    if let Err(e) = engine.files.sync_all() {
        eprintln!("ioshare: final sync failed: {e}");
    }
    let end = engine.now();
    let journal = engine
        .detectors
        .iter()
        .map(|d| d.as_ref().map(|d| d.journal_groups().collect()))
        .collect();
    let device = engine.model.as_ref().map(|m| m.stats()).unwrap_or_default();
    let ((_, recorder), policy) = engine.host.finish();
    Ok(Outcome {
        end,
        device,
        policy,
        recorder,
        journal,
    })
}

/// A ring with room for the device queue plus a receive and a send per connection;
/// completions beyond the queue are kept by the kernel rather than dropped.
fn new_ring(queue_depth: u32) -> anyhow::Result<IoUring> {
    let entries = (queue_depth * 2 + 64).next_power_of_two();
    // Only the engine thread submits; task work may wait for its next system call.
    let tuned = IoUring::builder()
        .setup_cqsize(entries * 8)
        .setup_single_issuer()
        .setup_coop_taskrun()
        .build(entries);
    match tuned {
        Ok(ring) => Ok(ring),
        // Kernels before 6.0 lack the flags.
        Err(_) => Ok(IoUring::builder()
            .setup_cqsize(entries * 8)
            .build(entries)?),
    }
}

/// Everything the device loop owns.
struct Engine<'a> {
    /// [`Engine::settle`] waits for what is still on it before anything is dropped.
    ring: IoUring,
    /// Entries put on the ring whose completions have not been taken.
    on_ring: u64,
    wake_buf: Box<[u8; 8]>,
    wake: Arc<File>,
    /// The eventfd read is on the ring.
    wake_armed: bool,
    config: &'a ServerConfig,
    files: Files,
    /// Admission, dispatch, drain and recording: the same core the simulator drives.
    /// A tenant at its `queue_limit` there has its connections left unread
    /// (back-pressure).
    host: Host<LiveObserver>,
    model: Option<Box<dyn DeviceModel>>,
    clock: Instant,
    /// Every request the host holds or the backend serves, by id.
    live: HashMap<u64, Live>,
    next_id: u64,
    /// Connections by slot; a slot is reused once its connection is closed.
    conns: Vec<Option<Conn>>,
    /// Requests the host withdrew at the drain deadline, to answer `ESHUTDOWN`.
    cancelled: Vec<Request>,
    /// Request completions to handle: (id, result as a CQE carries it).
    finished: Vec<(u64, i32)>,
    /// The ring's completions of one turn of the loop (kept for its allocation).
    cqes: Vec<(u64, i32)>,
    /// Emulated backend: requests whose data I/O is done, by the model's finish time.
    due: BinaryHeap<Reverse<(Nanos, u64)>>,
    model_done: Vec<Finished>,
    /// Data bytes of every connection's requests from admission until their replies
    /// are sent: held under `server.max_inflight_bytes` by not reading connections.
    inflight_bytes: u64,
    /// When a read past the end of each tenant's image was last logged.
    past_end_logged: Vec<Option<Instant>>,
    /// Per tenant with `cache = "pdc"`, its journal detector (fed every write as it
    /// arrives).
    detectors: Vec<Option<JournalDetector>>,
    /// `serve --capture`: every request as it arrives.
    capture: Option<Capture>,
    /// Testing only ([`PANIC_AFTER_VAR`]): panic when this many requests have arrived.
    panic_after: Option<u64>,
}

/// Environment variable for tests of the server's supervision: the engine panics once
/// this many requests have arrived, as a bug in it would.
pub const PANIC_AFTER_VAR: &str = "IOSHARE_TEST_ENGINE_PANIC_AFTER";

/// How often a tenant's reads past the end of its image are logged.
const PAST_END_LOG_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

impl Engine<'_> {
    fn now(&self) -> Nanos {
        self.clock.elapsed().as_nanos() as Nanos
    }

    fn run(&mut self, rx: &Receiver<Message>) -> anyhow::Result<()> {
        let mut last_publish: Option<Nanos> = None;
        loop {
            self.take_messages(rx)?;
            self.check_deadlines();
            let now = self.now();
            if last_publish.is_none_or(|at| now >= at + PUBLISH_EVERY) {
                let gauges = self.host.observe(Detail::Gauges).gauges;
                self.host.observer().0.publish_policy(gauges);
                last_publish = Some(now);
                // The capture reaches its file at least this often.
                if let Some(c) = self.capture.as_mut() {
                    c.flush();
                }
            }
            self.dispatch()?;
            self.flush_replies()?;
            self.close_finished();
            if self.host.deadline().is_some()
                && self.live.is_empty()
                && self.finished.is_empty()
                && self.conns.iter().all(Option::is_none)
            {
                return Ok(());
            }
            self.wait(self.wake_at())?;
            self.take_completions()?;
            self.reap()?;
            self.emulate();
            // Requests answered made room under `queue_limit`: read what waited.
            for slot in 0..self.conns.len() {
                if self.conns[slot]
                    .as_ref()
                    .is_some_and(|c| !c.parsed && !c.receiving)
                {
                    self.pump(slot)?;
                }
            }
        }
    }

    /// Handles every message waiting on the channel; a closed channel drains.
    fn take_messages(&mut self, rx: &Receiver<Message>) -> anyhow::Result<()> {
        loop {
            match rx.try_recv() {
                Ok(message) => self.on_message(message)?,
                Err(TryRecvError::Empty) => return Ok(()),
                Err(TryRecvError::Disconnected) => {
                    self.start_drain();
                    return Ok(());
                }
            }
        }
    }

    /// When the loop must run again even if nothing completes: the host's alarm, the
    /// emulated device's next decision or answer, the end of the send grace, the
    /// capture's next hand-over while it holds lines.
    fn wake_at(&self) -> Option<Nanos> {
        let capture = self
            .capture
            .as_ref()
            .filter(|c| c.holds_lines())
            .map(|_| self.now() + PUBLISH_EVERY);
        let model_next = self.model.as_ref().and_then(|m| m.next_event());
        let next_due = self.due.peek().map(|Reverse((at, _))| *at);
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
            capture,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Submits what is queued on the ring and waits for a completion, a message (the
    /// eventfd) or `until`; does not wait when completions are already waiting to be
    /// handled.
    fn wait(&mut self, until: Option<Nanos>) -> anyhow::Result<()> {
        if !self.wake_armed {
            let e = opcode::Read::new(
                types::Fd(self.wake.as_raw_fd()),
                self.wake_buf.as_mut_ptr(),
                8,
            )
            .build()
            .user_data(WAKE);
            push(&mut self.ring, &mut self.on_ring, e)?;
            self.wake_armed = true;
        }
        if !self.finished.is_empty() {
            self.ring.submit()?;
            return Ok(());
        }
        let submitted = match until.map(|at| at.saturating_sub(self.now())) {
            Some(0) => self.ring.submit(),
            Some(ns) => {
                let ts = types::Timespec::new()
                    .sec(ns / 1_000_000_000)
                    .nsec((ns % 1_000_000_000) as u32);
                self.ring
                    .submitter()
                    .submit_with_args(1, &types::SubmitArgs::new().timespec(&ts))
            }
            None => self.ring.submit_and_wait(1),
        };
        match submitted {
            Ok(_) => Ok(()),
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ETIME) | Some(libc::EINTR) | Some(libc::EBUSY)
                ) =>
            {
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Takes the ring's completions: sockets are handled now, backend completions are
    /// queued for [`Engine::reap`].
    fn take_completions(&mut self) -> anyhow::Result<()> {
        // Copied out first: handling one may push to the ring.
        let mut cqes = std::mem::take(&mut self.cqes);
        let before = cqes.len();
        cqes.extend(self.ring.completion().map(|c| (c.user_data(), c.result())));
        let taken = (cqes.len() - before) as u64;
        self.on_ring = self
            .on_ring
            .checked_sub(taken)
            .expect("every completion is of an entry the engine put on the ring");
        for &(user_data, result) in &cqes {
            match user_data {
                WAKE => self.wake_armed = false,
                u if u & TAG_MASK == TAG_RECV => self.received((u & !TAG_MASK) as usize, result)?,
                u if u & TAG_MASK == TAG_SEND => self.on_sent((u & !TAG_MASK) as usize, result)?,
                id => self.finished.push((id, result)),
            }
        }
        cqes.clear();
        self.cqes = cqes;
        Ok(())
    }

    fn on_message(&mut self, message: Message) -> anyhow::Result<()> {
        match message {
            Message::Attach(a) => {
                if self.host.deadline().is_some() {
                    return Ok(()); // stopping: dropping it closes the connection
                }
                let conn = Conn::new(a);
                let slot = match self.conns.iter().position(Option::is_none) {
                    Some(free) => free,
                    None => {
                        self.conns.push(None);
                        self.conns.len() - 1
                    }
                };
                self.conns[slot] = Some(conn);
                self.pump(slot)?;
            }
            Message::Update { tenant, spec } => {
                self.host.observer().0.set_weight(tenant, spec.weight);
                let now = self.now();
                self.host.update_tenant(tenant, &spec, now);
            }
            Message::Drain => self.start_drain(),
        }
        Ok(())
    }

    /// Stops receiving; what was received is still served.
    fn start_drain(&mut self) {
        if self.host.deadline().is_none() {
            let now = self.now();
            self.host.start_drain(now, self.config.drain_timeout);
            for c in self.conns.iter_mut().flatten() {
                c.stop_receiving();
            }
        }
    }

    /// The host's alarms that are due: the policy's timer and wait, and the drain
    /// deadline, at which what the policy still holds (a limit, an empty bucket) is
    /// answered `ESHUTDOWN` so it does not keep the server from stopping. A client that
    /// still does not take its replies a while later is cut off.
    fn check_deadlines(&mut self) {
        let now = self.now();
        self.host.on_time(now, &mut self.cancelled);
        if !self.cancelled.is_empty() {
            eprintln!(
                "ioshare: drain deadline passed: answering {} request(s) the policy still holds with ESHUTDOWN",
                self.cancelled.len()
            );
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
            for c in self.conns.iter_mut().flatten() {
                if c.send_armed {
                    c.cut();
                }
            }
        }
    }

    /// Takes a connection's requests from its codec while its tenant has room; when
    /// the codec needs bytes, a receive goes on the ring.
    fn pump(&mut self, slot: usize) -> anyhow::Result<()> {
        loop {
            let c = self.conns[slot].as_mut().expect("pumped a live connection");
            if c.parsed || c.receiving || !self.host.has_room(c.tenant) {
                return Ok(());
            }
            // The memory budget, checked once a request's header is whole and before it
            // is parsed (a write's payload buffer is taken then): a request holds its
            // data and its reply's header from then until the reply is sent, so a
            // client that never reads its replies, errors included, cannot make the
            // server hold more for it. It waits unless that fits the connection's share
            // and the budget; a connection holding nothing may always take a small one,
            // so small requests are served while large ones wait for room.
            if c.reserved == 0
                && let Some(data) = c.codec.next_request()
            {
                let next = budget::held_by(data);
                if !budget::may_take(
                    c.pending_bytes,
                    next,
                    self.inflight_bytes,
                    self.config.max_inflight_bytes,
                ) {
                    if c.eof {
                        // Draining, or the client is gone: what it sent that does not
                        // fit is not served.
                        c.parsed = true;
                    }
                    return Ok(());
                }
                c.reserve(next);
                self.inflight_bytes += next;
            }
            match c.codec.poll() {
                Ok(Some(Event::Command(command))) => self.admit(slot, command),
                Ok(Some(Event::Error { handle, error })) => {
                    let bytes = std::mem::take(&mut c.reserved);
                    assert_eq!(
                        bytes,
                        budget::REPLY_BYTES,
                        "a refused request holds its reply"
                    );
                    c.reply(handle, error, None, bytes);
                    // A connection whose sends failed drops the reply at once.
                    self.inflight_bytes -= c.take_released();
                }
                Ok(Some(Event::Disconnect)) => {
                    self.inflight_bytes -= c.drop_reservation();
                    c.parsed = true;
                }
                Ok(Some(Event::Selected { .. } | Event::StartTls)) => {
                    // The codec makes neither once transmission runs.
                    let id = c.id;
                    super::logs::PeerLog::global().line(&c.peer, || {
                        format!("ioshare: connection {id}: a handshake event in transmission")
                    });
                    c.parsed = true;
                }
                Ok(None) if c.eof => c.parsed = true,
                Ok(None) => {
                    let e = c.receive_entry(TAG_RECV | slot as u64);
                    c.receiving = true;
                    return push(&mut self.ring, &mut self.on_ring, e);
                }
                Err(e) => {
                    let id = c.id;
                    super::logs::PeerLog::global()
                        .line(&c.peer, || format!("ioshare: connection {id}: {e}"));
                    c.parsed = true;
                }
            }
        }
    }

    /// A receive on the ring returned.
    fn received(&mut self, slot: usize, result: i32) -> anyhow::Result<()> {
        let draining = self.host.deadline().is_some();
        let c = self.conns[slot]
            .as_mut()
            .expect("receive of a live connection");
        c.receiving = false;
        match result {
            n if n > 0 => {
                c.codec.received(n as usize);
                if draining {
                    c.eof = true;
                }
            }
            0 => c.eof = true,
            e if e == -libc::EINTR || e == -libc::EAGAIN => {}
            e => {
                // A client that hangs up mid-conversation is not news.
                if e != -libc::ECONNRESET {
                    let id = c.id;
                    super::logs::PeerLog::global().line(&c.peer, || {
                        format!(
                            "ioshare: connection {id}: receive: {}",
                            std::io::Error::from_raw_os_error(-e)
                        )
                    });
                }
                c.eof = true;
            }
        }
        self.pump(slot)
    }

    /// Hands every connection's waiting replies to the ring (one send each at a time).
    fn flush_replies(&mut self) -> anyhow::Result<()> {
        for slot in 0..self.conns.len() {
            let Some(c) = self.conns[slot].as_mut() else {
                continue;
            };
            if c.next_send() {
                push(
                    &mut self.ring,
                    &mut self.on_ring,
                    c.send_entry(TAG_SEND | slot as u64),
                )?;
            }
        }
        Ok(())
    }

    /// A send on the ring returned: the rest of a short send goes again.
    fn on_sent(&mut self, slot: usize, result: i32) -> anyhow::Result<()> {
        let c = self.conns[slot]
            .as_mut()
            .expect("send of a live connection");
        if result < 0
            && ![libc::EPIPE, libc::ECONNRESET, libc::EINTR, libc::EAGAIN].contains(&-result)
        {
            let id = c.id;
            super::logs::PeerLog::global().line(&c.peer, || {
                format!(
                    "ioshare: connection {id}: send: {}",
                    std::io::Error::from_raw_os_error(-result)
                )
            });
        }
        let again = c.sent(result);
        self.inflight_bytes -= c.take_released();
        if c.broken && !c.parsed {
            // Nobody will read the answers: what the client sent after is not served.
            c.stop_receiving();
            c.parsed = true;
        }
        if again {
            push(
                &mut self.ring,
                &mut self.on_ring,
                c.send_entry(TAG_SEND | slot as u64),
            )?;
        }
        Ok(())
    }

    /// Closes connections with nothing left to receive, serve or send.
    fn close_finished(&mut self) {
        for c in &mut self.conns {
            if c.as_ref().is_some_and(Conn::is_finished) {
                if let Some(c) = c.as_mut() {
                    self.inflight_bytes -= c.drop_reservation();
                }
                assert_eq!(
                    c.as_ref().map(|c| c.pending_bytes),
                    Some(0),
                    "a finished connection holds no data"
                );
                *c = None;
            }
        }
    }

    /// A request from a connection is offered to the host; a refused one is answered
    /// at once (`EIO`, or `ESHUTDOWN` past the drain deadline). With `refuse = "hold"`
    /// (the default) the policy's refusals are held back by the host, not answered.
    fn admit(&mut self, slot: usize, command: Command) {
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
            bytes,
        };
        let t = self.now();
        if let Some(c) = self.capture.as_mut() {
            c.record(
                t,
                tenant as usize,
                &command.kind,
                command.offset,
                command.len,
            );
        }
        let write = matches!(command.kind, CommandKind::Write { .. });
        let mut io = Transfer::new(command.kind, command.offset, command.len);
        if write && let Some(d) = self.detectors[tenant as usize].as_mut() {
            if d.write(command.offset, command.len) == Verdict::Journal {
                io.set_journal();
            }
            // Each group the write marked (one write may cross into the next).
            if !d.newly_marked().is_empty() {
                let found: Vec<(usize, (u64, u64))> = d
                    .newly_marked()
                    .iter()
                    .map(|&i| (i, d.log_in(i).expect("a marked group has its log")))
                    .collect();
                for (group, log) in found {
                    self.journal_found(tenant, group, log);
                }
            }
        }
        self.next_id += 1;
        if self.panic_after.is_some_and(|n| self.next_id >= n) {
            panic!("injected by {PANIC_AFTER_VAR} at request {}", self.next_id);
        }
        let request = Request {
            id: self.next_id,
            tenant,
            op: io.op(),
            offset: self.files.target(tenant as usize).map_or(0, |x| x.base) + io.offset(),
            len: io.len(),
            arrival: t,
            cost: 0,
        };
        match self.host.admit(request, t) {
            Admission::Queued => {
                let l = Live {
                    sub,
                    request,
                    start: None,
                    io,
                    model_finish: None,
                    io_result: None,
                };
                self.live.insert(request.id, l);
            }
            Admission::Refused(_, Refusal::Stopping) => self.answer(sub, proto::ESHUTDOWN, None),
            Admission::Refused(_, Refusal::QueueFull | Refusal::Policy) => {
                self.answer(sub, proto::EIO, None)
            }
        }
    }

    /// Sends to the backend what the host dispatches while the device has room.
    fn dispatch(&mut self) -> anyhow::Result<()> {
        loop {
            let t = self.now();
            let Some(r) = self.host.dispatch(t) else {
                return Ok(());
            };
            let l = self
                .live
                .get_mut(&r.id)
                .expect("dispatched a known request");
            l.start = Some(t);
            // The host stamped its cost: the completion carries it to the recorder.
            l.request = r;
            if let Some(m) = self.model.as_mut() {
                m.advance(t, &mut self.model_done);
                l.model_finish = match m.submit(&r, t) {
                    Submitted::Finishes(at) => Some(at),
                    Submitted::Queued => None,
                };
            }
            match self.files.target(r.tenant as usize) {
                None => self.finished.push((r.id, l.io.null_result())),
                Some(target) => push(
                    &mut self.ring,
                    &mut self.on_ring,
                    l.io.entry(target).user_data(r.id),
                )?,
            }
        }
    }

    /// Handles the backend's completions: the next part of a request, or its end.
    fn reap(&mut self) -> anyhow::Result<()> {
        for (id, result) in std::mem::take(&mut self.finished) {
            let l = self
                .live
                .get_mut(&id)
                .expect("completion of a known request");
            let target = self.files.target(l.sub.tenant as usize);
            let (tenant, offset) = (l.sub.tenant as usize, l.io.offset());
            let error = match l.io.step(result) {
                Next::Again => {
                    let target = target.expect("only file requests go again");
                    push(
                        &mut self.ring,
                        &mut self.on_ring,
                        l.io.entry(target).user_data(id),
                    )?;
                    continue;
                }
                Next::Done(error) => error,
                Next::PastEnd => {
                    self.past_end(tenant, offset);
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
                let now = self.now();
                self.complete(l, error, now);
            }
        }
        Ok(())
    }

    /// The journal detector marked the group of `tenant`'s export holding `offset`:
    /// counted and logged (once per group: a group stays marked).
    fn journal_found(&mut self, tenant: TenantId, group: usize, (start, end): (u64, u64)) {
        self.host.observer().0.journal_group(tenant);
        eprintln!(
            "ioshare: {}: group {group} holds a circular log (the guest's journal) at bytes {start}–{end} ({}); writes there bypass the host cache from now on",
            self.config.tenants[tenant as usize].spec.name,
            crate::units::format_bytes(end - start),
        );
    }

    /// A read of `tenant` at `offset` met the end of its image: logged, at most once
    /// every [`PAST_END_LOG_EVERY`] per tenant.
    fn past_end(&mut self, tenant: usize, offset: u64) {
        let logged = &mut self.past_end_logged[tenant];
        if logged.is_some_and(|at: Instant| at.elapsed() < PAST_END_LOG_EVERY) {
            return;
        }
        *logged = Some(Instant::now());
        let t = &self.config.tenants[tenant];
        eprintln!(
            "ioshare: {}: a read at byte {offset} met the end of its image, which is shorter than the export's {} bytes (truncated while served?); answered EIO, not zeroes (reported at most every {} s)",
            t.spec.name,
            t.size,
            PAST_END_LOG_EVERY.as_secs()
        );
    }

    /// Emulated backend: answers the requests whose model finish time has passed.
    fn emulate(&mut self) {
        let Some(m) = self.model.as_mut() else {
            return;
        };
        let now = self.clock.elapsed().as_nanos() as Nanos;
        m.advance(now, &mut self.model_done);
        for f in self.model_done.drain(..) {
            let l = self
                .live
                .get_mut(&f.request.id)
                .expect("modelled a known request");
            l.model_finish = Some(f.finish);
            if l.io_result.is_some() {
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
    fn complete(&mut self, l: Live, error: u32, t: Nanos) {
        // Bypassed: journal writes that went O_DIRECT (an unaligned one goes through
        // the page cache).
        if error == 0 && l.io.journal() && l.io.direct() {
            self.host
                .observer()
                .0
                .journal_write(l.sub.tenant, u64::from(l.io.len()));
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
        self.host.complete(&c, status, t);
        let data = if error == 0 {
            l.io.into_read_data()
        } else {
            None
        };
        self.answer(l.sub, error, data);
    }

    fn answer(&mut self, sub: Submission, error: u32, data: Option<IoBuf>) {
        let c = self.conns[sub.conn]
            .as_mut()
            .expect("a connection stays open while it has requests");
        c.outstanding -= 1;
        c.reply(sub.handle, error, data, sub.bytes);
        self.inflight_bytes -= c.take_released();
    }
}

/// Queues `e` on the ring, counting it in `on_ring` until its completion is taken.
fn push(ring: &mut IoUring, on_ring: &mut u64, e: io_uring::squeue::Entry) -> anyhow::Result<()> {
    // SAFETY: every buffer an entry points to lives until its completion has been
    // reaped: in `Live` (request data), in the connection's `Conn` (its codec's receive
    // buffer, the replies being sent; a connection is not closed while a receive or a
    // send is on the ring) or in the loop (the wake buffer).
    while unsafe { ring.submission().push(&e) }.is_err() {
        ring.submit()?;
    }
    *on_ring += 1;
    Ok(())
}

/// How long a stopping engine waits for what the kernel still has of its I/O.
const TEARDOWN_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

impl Engine<'_> {
    /// Whatever ended the loop (a drain, an error, a panic), the kernel may still read
    /// from or write into buffers the engine owns (receives, sends, file I/O, the wake
    /// read): dropping the ring does not wait for them. So the sockets are shut (their
    /// receives and sends return), the eventfd is written (its read returns), and the
    /// engine waits for every entry it put on the ring before its buffers are freed;
    /// if the ring fails or that takes longer than `TEARDOWN_WAIT`, the buffers are
    /// leaked rather than freed under the kernel. Called once the loop has ended, before
    /// anything of the engine is dropped.
    fn settle(&mut self) {
        if self.on_ring == 0 {
            return;
        }
        for c in self.conns.iter_mut().flatten() {
            c.cut();
        }
        poke(&self.wake);
        let give_up = Instant::now() + TEARDOWN_WAIT;
        let ts = types::Timespec::new().nsec(100_000_000);
        while self.on_ring > 0 && Instant::now() < give_up {
            let waited = self
                .ring
                .submitter()
                .submit_with_args(1, &types::SubmitArgs::new().timespec(&ts));
            if let Err(e) = waited
                && !matches!(
                    e.raw_os_error(),
                    Some(libc::ETIME) | Some(libc::EINTR) | Some(libc::EBUSY)
                )
            {
                break;
            }
            let taken = self.ring.completion().count() as u64;
            // No panic here (this runs after a panic too): a count off is treated as
            // everything returned, which the check while running rules out.
            self.on_ring = self.on_ring.saturating_sub(taken);
        }
        if self.on_ring > 0 {
            eprintln!(
                "ioshare: {} I/O operations still in the kernel as the engine stops; their buffers are left allocated",
                self.on_ring
            );
            std::mem::forget(std::mem::take(&mut self.live));
            std::mem::forget(std::mem::take(&mut self.conns));
            std::mem::forget(std::mem::replace(&mut self.wake_buf, Box::new([0; 8])));
        }
    }
}

/// Wakes the engine's loop (its eventfd read returns).
fn poke(wake: &File) {
    let one = 1u64.to_ne_bytes();
    // SAFETY: writing 8 bytes from a valid buffer to an eventfd we own.
    unsafe { libc::write(wake.as_raw_fd(), one.as_ptr().cast(), 8) };
}
