//! The live server's device loop: one thread that owns the io_uring ring, the open
//! files, the sockets of every connection past its handshake, and the [`EngineCore`]
//! that decides everything else. Sockets are read and written on the same ring as the
//! files, so a request goes from the client's bytes to the policy, to the backend and
//! back to the client without a thread hand-off, and one `io_uring_enter` submits and
//! reaps socket and file I/O together. This shell only carries out the core's
//! [`Intent`]s on the ring and hands it what the ring returns, with the wall-clock time;
//! rare messages (a new connection, a reload, the drain) come on a channel with an
//! eventfd read kept on the ring to wake the loop. Its own rule: teardown waits for
//! every entry it put on the ring before a buffer is freed (`Engine::settle`).

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
use crate::metrics::Recorder;
use crate::policy::governor::Limits;
use crate::policy::{Observation, Policy};
use crate::types::{Nanos, TenantId, TenantSpec};
use io_uring::{opcode, types};
use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, TryRecvError};
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
    // SAFETY: plain syscall; the descriptor is owned by the File from here on.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(EngineError::Eventfd(std::io::Error::last_os_error()));
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
    let offload = offloaded(config, &files);
    let mut engine = Engine {
        offload,
        ring: new_ring(config.queue_depth)?,
        wake_buf: Box::new([0; 8]),
        wake,
        wake_armed: false,
        images_buf: Box::new([0; 8]),
        images_armed: false,
        reaped: Vec::new(),
        files,
        core: Some(core),
        sockets: Vec::new(),
        clock,
        cqes: Vec::new(),
        intents: Vec::new(),
        capture,
    };
    // A panic in the loop is caught only to wait for the ring before the buffers go,
    // then goes on as it was.
    let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| engine.run(&rx)));
    let settled = engine.settle();
    let ran = ran.unwrap_or_else(|panic| std::panic::resume_unwind(panic));
    // The capture is closed whatever became of the run.
    if let Some(c) = engine.capture.take()
        && let Err(e) = c.finish(engine.now())
    {
        tracing::info!("{e}");
    }
    ran?;
    if !settled {
        return Err(EngineError::Unsettled);
    }
    if let Err(e) = engine.files.sync_all() {
        tracing::warn!("final sync failed: {e}");
    }
    let end = engine.now();
    let out = engine.core.take().expect("the core is there").finish();
    Ok(Outcome {
        end,
        device: out.device,
        policy: out.policy,
        recorder: out.recorder,
        journal: out.journal,
    })
}

/// A ring with room for the device queue plus a receive and a send per connection
/// (made on the engine's thread, the only one that submits).
fn new_ring(queue_depth: u32) -> Result<Ring, EngineError> {
    Ring::for_this_thread((queue_depth * 2 + 64).next_power_of_two()).map_err(EngineError::Ring)
}

/// A connection's socket, with what its sends need and its places under the
/// connection limits (given back when it is dropped).
struct Socket {
    fd: OwnedFd,
    /// The message header a send on the ring reads.
    msg: Box<libc::msghdr>,
    _slots: Vec<Slot>,
}

/// Everything the device loop owns.
struct Engine {
    /// [`Engine::settle`] waits for what is still on it before anything is dropped.
    ring: Ring,
    wake_buf: Box<[u8; 8]>,
    wake: Arc<File>,
    /// The eventfd read is on the ring.
    wake_armed: bool,
    /// The rbd images' eventfd read: its buffer, and whether it is on the ring.
    images_buf: Box<[u8; 8]>,
    images_armed: bool,
    /// Finished rbd operations of one wake-up (kept for its allocation).
    reaped: Vec<(u64, i32)>,
    files: Files,
    /// The decisions; `None` only once finished (or leaked by [`Engine::settle`]).
    core: Option<EngineCore>,
    /// Sockets by the core's connection slots.
    sockets: Vec<Option<Socket>>,
    clock: Instant,
    /// The ring's completions of one turn of the loop (kept for its allocation).
    cqes: Vec<(u64, i32)>,
    /// The core's intents being carried out (kept for its allocation).
    intents: Vec<Intent>,
    /// `serve --capture`: every request as it arrives.
    capture: Option<Capture>,
    /// Descriptors of images on file systems that may block a submitting thread (FUSE,
    /// network file systems): their operations go to the kernel's workers at once.
    offload: std::collections::HashSet<std::os::fd::RawFd>,
}

/// `statfs` magic numbers of file systems whose operations may block the thread that
/// submits them even when io_uring asks for a non-blocking attempt first (a FUSE read
/// can wait on its daemon for attributes, a network file system on its server).
const MAY_BLOCK: [(i64, &str); 8] = [
    (0x6573_5546, "FUSE"),
    (0x6969, "NFS"),
    (0xFF53_4D42, "CIFS"),
    (0xFE53_4D42, "SMB2"),
    (0x0102_1997, "9P"),
    (0x00C3_6400, "Ceph"),
    (0x5346_414F, "AFS"),
    (0x7364_6673, "SSHFS"),
];

/// The descriptors of tenants whose images are on a [`MAY_BLOCK`] file system, said once
/// per tenant: their file operations are submitted with `IOSQE_ASYNC`, so that a hung
/// daemon or server stalls that tenant's requests in the kernel's workers, never the
/// engine thread (which serves every tenant).
fn offloaded(
    config: &ServerConfig,
    files: &Files,
) -> std::collections::HashSet<std::os::fd::RawFd> {
    config
        .tenants
        .iter()
        .zip(files.targets())
        .filter_map(|(t, target)| Some(may_block(&t.spec.name, target?.file()?)))
        .flatten()
        .collect()
}

/// `target`'s descriptors when its image is on a [`MAY_BLOCK`] file system (said once,
/// naming tenant `name`), else none.
fn may_block(name: &str, target: crate::io::transfer::Target) -> Vec<std::os::fd::RawFd> {
    // SAFETY: an all-zero statfs is valid; fstatfs fills it for a descriptor we own.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstatfs(target.buffered, &mut st) } != 0 {
        return Vec::new();
    }
    let Some((_, fs)) = MAY_BLOCK.iter().find(|(m, _)| *m == st.f_type as i64) else {
        return Vec::new();
    };
    tracing::info!(
        "{name}: its image is on {fs}: its file operations go to kernel workers (IOSQE_ASYNC), so a hung {fs} cannot stop the other tenants"
    );
    std::iter::once(target.buffered)
        .chain(target.direct)
        .collect()
}

/// Environment variable for tests of the server's supervision: the engine panics once
/// this many requests have arrived, as a bug in it would.
pub const PANIC_AFTER_VAR: &str = "IOSHARE_TEST_ENGINE_PANIC_AFTER";

impl Engine {
    fn now(&self) -> Nanos {
        self.clock.elapsed().as_nanos() as Nanos
    }

    fn core(&mut self) -> &mut EngineCore {
        self.core.as_mut().expect("the core runs")
    }

    fn run(&mut self, rx: &Receiver<Message>) -> Result<(), EngineError> {
        let mut last_flush: Option<Nanos> = None;
        loop {
            self.take_messages(rx)?;
            let now = self.now();
            self.core().turn(now);
            self.apply()?;
            if last_flush.is_none_or(|at| now >= at + PUBLISH_EVERY) {
                // The capture reaches its file at least this often.
                if let Some(c) = self.capture.as_mut() {
                    c.flush();
                }
                last_flush = Some(now);
            }
            if self.core().is_done() {
                return Ok(());
            }
            self.wait(self.wake_at())?;
            self.take_completions()?;
        }
    }

    /// Handles every message waiting on the channel; a closed channel drains.
    fn take_messages(&mut self, rx: &Receiver<Message>) -> Result<(), EngineError> {
        loop {
            let now = self.now();
            match rx.try_recv() {
                Ok(Message::Attach(a)) => self.attach(a, now),
                Ok(Message::Update { tenant, spec }) => self.core().update(tenant, &spec, now),
                Ok(Message::Drain) => self.core().drain(now),
                Ok(Message::Add(added)) => self.add_tenant(*added, now),
                Ok(Message::DrainTenant(t)) => self.core().drain_tenant(t),
                Ok(Message::ResumeTenant(t)) => self.core().resume_tenant(t),
                Ok(Message::Limits(limits)) => {
                    for (t, l) in limits {
                        self.core().set_limits(t, &l, now);
                    }
                }
                Err(TryRecvError::Empty) => return Ok(()),
                Err(TryRecvError::Disconnected) => {
                    self.core().drain(now);
                    return self.apply();
                }
            }
            self.apply()?;
        }
    }

    /// A tenant added while running: its files join the engine's, the core serves it.
    fn add_tenant(&mut self, (tenant, files): (TenantConfig, Files), now: Nanos) {
        let target = self.files.absorb(files, &tenant);
        if let Some(t) = target.and_then(|s| s.file()) {
            self.offload.extend(may_block(&tenant.spec.name, t));
        }
        if let Some(c) = self.capture.as_mut() {
            c.add(&tenant.spec.name, now);
        }
        let core = CoreTenant {
            name: tenant.spec.name.clone(),
            size: tenant.size,
            cache: tenant.cache,
        };
        let _ = self.core().add_tenant(core, &tenant.spec, target, now);
    }

    /// A connection past its handshake: its socket goes in the slot the core gives it;
    /// when the core is stopping, dropping it closes the connection.
    fn attach(&mut self, a: Attach, now: Nanos) {
        let Some(slot) = self.core().attach(a.id, a.peer, a.tenant, a.codec, now) else {
            return;
        };
        if self.sockets.len() <= slot {
            self.sockets.resize_with(slot + 1, || None);
        }
        assert!(self.sockets[slot].is_none(), "a slot holds one socket");
        self.sockets[slot] = Some(Socket {
            fd: a.fd,
            // SAFETY: an all-zero msghdr is a valid empty message.
            msg: Box::new(unsafe { std::mem::zeroed() }),
            _slots: a.slots,
        });
    }

    /// Carries out what the core asked for, writes its log lines and hands its
    /// arrivals to the capture.
    fn apply(&mut self) -> Result<(), EngineError> {
        // Rounds until none is left: answering a block status makes a send.
        loop {
            let mut intents = std::mem::take(&mut self.intents);
            self.core().take_intents(&mut intents);
            let done = intents.is_empty();
            for &intent in &intents {
                self.carry_out(intent)?;
            }
            intents.clear();
            self.intents = intents;
            if done {
                break;
            }
        }
        let core = self.core.as_mut().expect("the core runs");
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
        if let Some(c) = self.capture.as_mut() {
            for a in &arrivals {
                c.record(a);
            }
        }
        Ok(())
    }

    /// One intent on the ring (or on the socket).
    fn carry_out(&mut self, intent: Intent) -> Result<(), EngineError> {
        let core = self.core.as_mut().expect("the core runs");
        let e = match intent {
            Intent::Receive(slot) => {
                let fd = socket(&self.sockets, slot).fd.as_raw_fd();
                let room = core.receive_buffer(slot);
                opcode::Recv::new(types::Fd(fd), room.as_mut_ptr(), room.len() as u32)
                    .build()
                    .user_data(TAG_RECV | slot as u64)
            }
            Intent::Send(slot) => {
                let iov = core.send_iov(slot);
                let s = self.sockets[slot].as_mut().expect("a socket in the slot");
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
                        let images = self.files.images().expect("tenants with images have them");
                        if let Err(result) = images.submit(image, id, io.next_part(0)) {
                            // Refused at once: its completion is this.
                            core.io_done(id, result, self.clock.elapsed().as_nanos() as Nanos);
                        }
                        return Ok(());
                    }
                };
                let e = io.entry(target).user_data(id);
                if self.offload.contains(&target.buffered) {
                    e.flags(io_uring::squeue::Flags::ASYNC)
                } else {
                    e
                }
            }
            Intent::ShutRead(slot) => {
                shutdown(&socket(&self.sockets, slot).fd, libc::SHUT_RD);
                return Ok(());
            }
            Intent::Cut(slot) => {
                shutdown(&socket(&self.sockets, slot).fd, libc::SHUT_RDWR);
                return Ok(());
            }
            Intent::Close(slot) => {
                self.sockets[slot] = None;
                return Ok(());
            }
            Intent::BlockStatus(id) => {
                // Metadata only (lseek): answered on the spot, like the backend's own
                // size check at open.
                let ask = core.block_status_ask(id);
                let extents =
                    crate::io::extents::allocation(ask.fd, ask.at, ask.len, ask.max_extents)
                        .map_err(crate::io::transfer::nbd_error);
                core.block_status_done(id, extents);
                core.send_replies();
                return Ok(());
            }
        };
        push(&mut self.ring, e)
    }

    /// When the loop must run again even if nothing completes: the core's next alarm,
    /// the capture's next hand-over while it holds lines.
    fn wake_at(&self) -> Option<Nanos> {
        let capture = self
            .capture
            .as_ref()
            .filter(|c| c.holds_lines())
            .map(|_| self.now() + PUBLISH_EVERY);
        let core = self.core.as_ref().expect("the core runs").next_wake();
        [core, capture].into_iter().flatten().min()
    }

    /// Submits what is queued on the ring and waits for a completion, a message (the
    /// eventfd) or `until`.
    fn wait(&mut self, until: Option<Nanos>) -> Result<(), EngineError> {
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
            && let Some(images) = self.files.images()
        {
            let e = opcode::Read::new(types::Fd(images.eventfd()), self.images_buf.as_mut_ptr(), 8)
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
    fn take_completions(&mut self) -> Result<(), EngineError> {
        // Copied out first: handling one may push to the ring.
        let mut cqes = std::mem::take(&mut self.cqes);
        self.ring.completions(&mut cqes);
        let now = self.now();
        for &(user_data, result) in &cqes {
            let core = self.core.as_mut().expect("the core runs");
            match user_data {
                WAKE => self.wake_armed = false,
                IMAGES => {
                    self.images_armed = false;
                    let images = self.files.images().expect("armed for images");
                    images.reap(&mut self.reaped);
                    for (id, result) in self.reaped.drain(..) {
                        core.io_done(id, result, now);
                    }
                }
                u if u & TAG_MASK == TAG_RECV => {
                    core.received((u & !TAG_MASK) as usize, result, now)
                }
                u if u & TAG_MASK == TAG_SEND => core.sent((u & !TAG_MASK) as usize, result, now),
                id => core.io_done(id, result, now),
            }
            self.apply()?;
        }
        cqes.clear();
        self.cqes = cqes;
        Ok(())
    }
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
    // buffer); a teardown settles the ring first (`Engine::settle`).
    unsafe { ring.push(&e) }.map_err(EngineError::Ring)
}

/// How long a stopping engine waits for what the kernel still has of its I/O.
const TEARDOWN_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

impl Engine {
    /// Whatever ended the loop (a drain, an error, a panic), the kernel may still read
    /// from or write into buffers the engine owns (receives, sends, file I/O, the wake
    /// read): dropping the ring does not wait for them. So the sockets are shut (their
    /// receives and sends return), the eventfd is written (its read returns), and the
    /// engine waits for every entry it put on the ring before its buffers are freed;
    /// if the ring fails or that takes longer than `TEARDOWN_WAIT`, the buffers are
    /// leaked rather than freed under the kernel (and `false` returned). Called once the
    /// loop has ended, before anything of the engine is dropped.
    fn settle(&mut self) -> bool {
        let (sockets, wake) = (&self.sockets, &self.wake);
        let images = self.files.images().map(|i| i.eventfd());
        let settled = self.ring.settle(TEARDOWN_WAIT, || {
            for s in sockets.iter().flatten() {
                shutdown(&s.fd, libc::SHUT_RDWR);
            }
            poke(wake);
            if let Some(fd) = images {
                poke_fd(fd);
            }
        });
        // The images' operations use the core's buffers too.
        let images_settled = match self.files.images() {
            Some(images) => {
                let mut late = Vec::new();
                images.settle(TEARDOWN_WAIT, &mut late)
            }
            None => true,
        };
        if settled && images_settled {
            return true;
        }
        tracing::warn!(
            "{} I/O operations still in the kernel as the engine stops; their buffers are left allocated",
            self.ring.on_ring()
        );
        std::mem::forget(self.core.take());
        std::mem::forget(std::mem::take(&mut self.sockets));
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
