//! The live server's device loop: one thread that owns the policy, the io_uring ring and
//! the open files. Requests from every connection arrive on a channel (an eventfd read
//! kept on the ring wakes the loop), enter the policy with the wall-clock time, and what
//! the policy dispatches goes to the backend while fewer than `queue_depth` are in
//! flight. Completions go back to the policy and, as replies, to the connection.
//!
//! With `cache = "none"` aligned requests use an `O_DIRECT` descriptor and aligned
//! buffers; unaligned ones go through a second, buffered descriptor of the same file
//! (Linux writes back and invalidates the page cache around direct I/O, so both views
//! stay coherent) instead of a read-modify-write that would have to lock block ranges.

use super::config::{BackendKind, Cache, ServerConfig, Storage};
use super::stats::LiveStats;
use crate::device::{DeviceModel, Finished, Submitted};
use crate::nbd::CommandKind;
use crate::nbd::proto;
use crate::policy::{Dispatch, Policy};
use crate::types::{Completion, Nanos, Op, Request, TenantSpec};
use io_uring::{IoUring, opcode, types};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::sync::mpsc::{Receiver, Sender, TryRecvError};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

/// Alignment of `O_DIRECT` requests and buffers (covers 512 and 4096-byte sectors).
pub const DIRECT_ALIGN: u64 = 4096;
/// `user_data` of the eventfd read that wakes the loop.
const WAKE: u64 = u64::MAX;
/// How often the policy's state is published for `/metrics`.
const PUBLISH_EVERY: Nanos = 100_000_000;

/// A reply for a connection's writer.
#[derive(Debug)]
pub struct Reply {
    pub handle: u64,
    pub error: u32,
    /// Read data, exactly the request's length.
    pub data: Option<Buffer>,
}

/// A request from a connection.
#[derive(Debug)]
pub struct Submission {
    pub tenant: u32,
    pub handle: u64,
    pub offset: u64,
    pub len: u32,
    pub kind: CommandKind,
    pub reply: Sender<Reply>,
}

pub enum Message {
    Submit(Submission),
    /// A tenant's weight, SLO, reservation or limit changed (configuration reload).
    Update {
        tenant: u32,
        spec: TenantSpec,
    },
    /// Finish what was submitted, sync every file, and stop.
    Drain,
}

/// Per-tenant bound on requests inside the engine: a connection that cannot take a
/// credit stops reading its socket (back-pressure instead of unbounded memory).
#[derive(Debug)]
pub struct Gate {
    held: Mutex<u32>,
    freed: Condvar,
    limit: u32,
}

impl Gate {
    pub fn new(limit: u32) -> Self {
        Gate {
            held: Mutex::new(0),
            freed: Condvar::new(),
            limit,
        }
    }

    /// Waits for a credit.
    pub fn acquire(&self) {
        let mut held = self.held.lock().expect("gate lock");
        while *held >= self.limit {
            held = self.freed.wait(held).expect("gate lock");
        }
        *held += 1;
    }

    pub fn release(&self) {
        let mut held = self.held.lock().expect("gate lock");
        *held -= 1;
        self.freed.notify_one();
    }
}

/// The sending side: connections submit through it.
#[derive(Clone)]
pub struct EngineHandle {
    tx: Sender<Message>,
    wake: Arc<File>,
    gates: Arc<Vec<Gate>>,
}

impl EngineHandle {
    /// Hands a request to the engine (after taking the tenant's credit).
    pub fn submit(&self, s: Submission) -> bool {
        self.gates[s.tenant as usize].acquire();
        let tenant = s.tenant;
        if self.tx.send(Message::Submit(s)).is_err() {
            self.gates[tenant as usize].release();
            return false;
        }
        self.poke();
        true
    }

    pub fn drain(&self) {
        let _ = self.tx.send(Message::Drain);
        self.poke();
    }

    /// Applies a tenant's new weight/SLO/reservation/limit from the policy's next
    /// period on.
    pub fn update(&self, tenant: u32, spec: TenantSpec) {
        let _ = self.tx.send(Message::Update { tenant, spec });
        self.poke();
    }

    fn poke(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writing 8 bytes from a valid buffer to an eventfd we own.
        unsafe { libc::write(self.wake.as_raw_fd(), one.as_ptr().cast(), 8) };
    }
}

/// Bytes of a request: plain, or aligned for `O_DIRECT`.
#[derive(Debug)]
pub enum Buffer {
    Plain(Vec<u8>),
    Aligned(AlignedBuf),
}

impl Buffer {
    pub fn as_slice(&self) -> &[u8] {
        match self {
            Buffer::Plain(v) => v,
            Buffer::Aligned(a) => a.as_slice(),
        }
    }
    fn as_mut_ptr(&mut self) -> *mut u8 {
        match self {
            Buffer::Plain(v) => v.as_mut_ptr(),
            Buffer::Aligned(a) => a.ptr,
        }
    }
    fn fill_zero_from(&mut self, from: usize) {
        match self {
            Buffer::Plain(v) => v[from..].fill(0),
            Buffer::Aligned(a) => a.as_mut_slice()[from..].fill(0),
        }
    }
}

/// A zeroed, `DIRECT_ALIGN`-aligned heap buffer.
#[derive(Debug)]
pub struct AlignedBuf {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the buffer is uniquely owned; the pointer is never shared.
unsafe impl Send for AlignedBuf {}

impl AlignedBuf {
    fn layout(len: usize) -> std::alloc::Layout {
        std::alloc::Layout::from_size_align(len.max(1), DIRECT_ALIGN as usize).expect("layout")
    }
    pub fn zeroed(len: usize) -> Self {
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(Self::layout(len)) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(Self::layout(len));
        }
        AlignedBuf { ptr, len }
    }
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` holds `len` initialised bytes owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, uniquely borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with the same layout.
        unsafe { std::alloc::dealloc(self.ptr, Self::layout(self.len)) };
    }
}

/// Where a tenant's requests go.
#[derive(Debug, Clone, Copy)]
struct Target {
    buffered: RawFd,
    direct: Option<RawFd>,
    base: u64,
}

/// The stage a request on the backend is in.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Stage {
    Transfer,
    /// Zeroing by writing zeroes (the file system cannot zero a range).
    ZeroWrite,
    /// The `fdatasync` after a FUA trim or zeroing.
    Sync,
}

struct Live {
    sub: Submission,
    request: Request,
    /// When the policy dispatched it (`None`: still held by the policy).
    start: Option<Nanos>,
    buf: Option<Buffer>,
    done: u32,
    stage: Stage,
    direct: bool,
    /// Emulated backend: when the device model finishes the request (`None` while a
    /// deferring model has not decided yet).
    model_finish: Option<Nanos>,
    /// Emulated backend: the reply's error once the data I/O is done, while the model's
    /// finish time is still ahead.
    io_result: Option<u32>,
}

/// Opens every tenant's storage as the configuration says.
pub struct Files {
    files: Vec<File>,
    targets: Vec<Option<Target>>,
}

impl Files {
    pub fn open(config: &ServerConfig) -> anyhow::Result<Files> {
        let mut files = Vec::new();
        let mut targets = Vec::new();
        let direct = config.cache == Cache::None;
        let mut open_pair = |path: &std::path::Path,
                             size: u64|
         -> anyhow::Result<(RawFd, Option<RawFd>)> {
            let f = open_sized(path, size)?;
            let buffered = f.as_raw_fd();
            files.push(f);
            let d = if direct {
                let f = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .custom_flags(libc::O_DIRECT)
                    .open(path)
                    .map_err(|e| {
                        anyhow::anyhow!(
                            "{}: cache = \"none\" needs O_DIRECT, which failed: {e} (tmpfs, for one, has no O_DIRECT; use cache = \"writeback\")",
                            path.display()
                        )
                    })?;
                let fd = f.as_raw_fd();
                files.push(f);
                Some(fd)
            } else {
                None
            };
            Ok((buffered, d))
        };
        let shared = match (&config.shared, config.backend) {
            (Some((path, size)), BackendKind::File | BackendKind::Emulated) => {
                let need = config
                    .tenants
                    .iter()
                    .filter_map(|t| match t.storage {
                        Storage::Region { offset } => Some(offset + t.size),
                        _ => None,
                    })
                    .max()
                    .unwrap_or(0)
                    .max(size.unwrap_or(0));
                Some(open_pair(path, need)?)
            }
            _ => None,
        };
        for t in &config.tenants {
            targets.push(match &t.storage {
                Storage::Nothing => None,
                Storage::Own(path) => {
                    let (buffered, direct) = open_pair(path, t.size)?;
                    Some(Target {
                        buffered,
                        direct,
                        base: 0,
                    })
                }
                Storage::Region { offset } => {
                    let (buffered, direct) = shared.expect("checked by the config");
                    Some(Target {
                        buffered,
                        direct,
                        base: *offset,
                    })
                }
            });
        }
        Ok(Files { files, targets })
    }
}

/// Opens (creating a sparse file when missing) and makes sure it holds `size` bytes:
/// a regular file smaller than that is grown, a block device must be large enough.
fn open_sized(path: &std::path::Path, size: u64) -> anyhow::Result<File> {
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| anyhow::anyhow!("{}: cannot open: {e}", path.display()))?;
    let meta = f.metadata()?;
    let len = if meta.file_type().is_block_device() {
        f.seek(SeekFrom::End(0))?
    } else {
        meta.len()
    };
    if len < size {
        if meta.file_type().is_block_device() {
            anyhow::bail!(
                "{}: the device holds {len} bytes, fewer than the {size} configured",
                path.display()
            );
        }
        f.set_len(size)
            .map_err(|e| anyhow::anyhow!("{}: cannot grow to {size} bytes: {e}", path.display()))?;
    }
    Ok(f)
}

/// The receiving side of the engine's channel.
pub struct Inbox {
    rx: Receiver<Message>,
    wake: Arc<File>,
    gates: Arc<Vec<Gate>>,
}

/// Creates the engine's channel; [`run`] consumes the receiving side.
pub fn channel(config: &ServerConfig) -> anyhow::Result<(EngineHandle, Inbox)> {
    let (tx, rx) = std::sync::mpsc::channel();
    // SAFETY: plain syscall; the descriptor is owned by the File from here on.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if fd < 0 {
        anyhow::bail!("eventfd: {}", std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor nobody else owns.
    let wake = Arc::new(unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) });
    let gates: Arc<Vec<Gate>> = Arc::new(
        config
            .tenants
            .iter()
            .map(|_| Gate::new(config.queue_limit))
            .collect(),
    );
    Ok((
        EngineHandle {
            tx,
            wake: wake.clone(),
            gates: gates.clone(),
        },
        Inbox { rx, wake, gates },
    ))
}

/// The device loop. Returns when drained.
pub fn run(
    config: &ServerConfig,
    files: Files,
    mut policy: Box<dyn Policy>,
    mut model: Option<Box<dyn DeviceModel>>,
    inbox: Inbox,
    stats: Arc<LiveStats>,
    clock: Instant,
) -> anyhow::Result<()> {
    let Inbox { rx, wake, gates } = inbox;
    let mut ring = IoUring::new((config.queue_depth * 2 + 8).next_power_of_two())?;
    let now = || clock.elapsed().as_nanos() as Nanos;
    let mut wake_buf = [0u8; 8];
    let mut wake_armed = false;
    let mut live: HashMap<u64, Live> = HashMap::new();
    let mut next_id = 0u64;
    let mut in_flight = 0u32;
    let mut drain_deadline: Option<Nanos> = None;
    let mut abandoned = false;
    let mut last_publish: Option<Nanos> = None;
    let mut finished: Vec<(u64, i32)> = Vec::new();
    // Emulated backend: requests whose data I/O is done, by the model's finish time.
    let mut due: BinaryHeap<Reverse<(Nanos, u64)>> = BinaryHeap::new();
    let mut model_done: Vec<Finished> = Vec::new();
    loop {
        // New requests.
        loop {
            match rx.try_recv() {
                Ok(Message::Submit(s)) => {
                    let t = now();
                    next_id += 1;
                    let request = Request {
                        id: next_id,
                        tenant: s.tenant,
                        op: match s.kind {
                            CommandKind::Read => Op::Read,
                            CommandKind::Write { .. } | CommandKind::WriteZeroes { .. } => {
                                Op::Write
                            }
                            CommandKind::Flush => Op::Flush,
                            CommandKind::Trim { .. } => Op::Trim,
                        },
                        offset: files.targets[s.tenant as usize].map_or(0, |x| x.base) + s.offset,
                        len: s.len,
                        arrival: t,
                    };
                    stats.arrived(s.tenant);
                    live.insert(
                        next_id,
                        Live {
                            sub: s,
                            request,
                            start: None,
                            buf: None,
                            done: 0,
                            stage: Stage::Transfer,
                            direct: false,
                            model_finish: None,
                            io_result: None,
                        },
                    );
                    policy.enqueue(request, t);
                    while let Some(r) = policy.take_refused() {
                        let l = live.remove(&r.id).expect("refused a known request");
                        stats.refused(r.tenant);
                        answer(&gates, l.sub, proto::EIO, None);
                    }
                }
                Ok(Message::Update { tenant, spec }) => {
                    stats.set_weight(tenant, spec.weight);
                    policy.update_tenant(tenant, &spec, now());
                }
                Ok(Message::Drain) => {
                    drain_deadline.get_or_insert(now() + config.drain_timeout);
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    drain_deadline.get_or_insert(now() + config.drain_timeout);
                    break;
                }
            }
        }
        let draining = drain_deadline.is_some();
        // A policy still holding requests at the deadline (a limit, an empty bucket)
        // does not keep the server from stopping: they are answered ESHUTDOWN.
        if !abandoned && drain_deadline.is_some_and(|d| now() >= d) {
            abandoned = true;
            let held: Vec<u64> = live
                .iter()
                .filter(|(_, l)| l.start.is_none())
                .map(|(&id, _)| id)
                .collect();
            if !held.is_empty() {
                eprintln!(
                    "ioshare: drain deadline passed: answering {} request(s) the policy still holds with ESHUTDOWN",
                    held.len()
                );
            }
            for id in held {
                let l = live.remove(&id).expect("listed");
                stats.cancelled(l.sub.tenant);
                answer(&gates, l.sub, proto::ESHUTDOWN, None);
            }
        }
        if last_publish.is_none_or(|at| now() >= at + PUBLISH_EVERY) {
            stats.publish_policy(policy.gauges());
            last_publish = Some(now());
        }
        // The policy's own clock (periods, refills).
        if policy.next_timer().is_some_and(|at| at <= now()) {
            policy.on_timer(now());
        }
        // Dispatch while the device has room.
        let mut wait_until: Option<Nanos> = None;
        while in_flight < config.queue_depth && !abandoned {
            let t = now();
            match policy.dispatch(t) {
                Dispatch::Request(r) => {
                    let l = live.get_mut(&r.id).expect("dispatched a known request");
                    l.start = Some(t);
                    in_flight += 1;
                    stats.dispatched(r.tenant);
                    if let Some(m) = model.as_mut() {
                        m.advance(t, &mut model_done);
                        l.model_finish = match m.submit(&r, t) {
                            Submitted::Finishes(at) => Some(at),
                            Submitted::Queued => None,
                        };
                    }
                    match files.targets[r.tenant as usize] {
                        None => finished.push((r.id, null_result(l))),
                        Some(target) => start(&mut ring, target, r.id, l)?,
                    }
                }
                Dispatch::Wait(at) => {
                    wait_until = Some(at);
                    break;
                }
                Dispatch::Idle => break,
            }
        }
        let model_next = model.as_ref().and_then(|m| m.next_event());
        let next_due = due.peek().map(|Reverse((at, _))| *at);
        for at in [
            policy.next_timer(),
            drain_deadline.filter(|_| !abandoned),
            model_next,
            next_due,
        ]
        .into_iter()
        .flatten()
        {
            wait_until = Some(wait_until.map_or(at, |w| w.min(at)));
        }
        if draining && live.is_empty() && finished.is_empty() {
            break;
        }
        if !wake_armed {
            let e = opcode::Read::new(types::Fd(wake.as_raw_fd()), wake_buf.as_mut_ptr(), 8)
                .build()
                .user_data(WAKE);
            push(&mut ring, e)?;
            wake_armed = true;
        }
        // Wait for a completion, a new request (the eventfd) or the policy's time.
        if finished.is_empty() {
            let wait = wait_until.map(|at| at.saturating_sub(now()));
            let submitted = match wait {
                Some(0) => ring.submit(),
                Some(ns) => {
                    let ts = types::Timespec::new()
                        .sec(ns / 1_000_000_000)
                        .nsec((ns % 1_000_000_000) as u32);
                    ring.submitter()
                        .submit_with_args(1, &types::SubmitArgs::new().timespec(&ts))
                }
                None => ring.submit_and_wait(1),
            };
            match submitted {
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::ETIME) | Some(libc::EINTR) | Some(libc::EBUSY)
                    ) => {}
                Err(e) => return Err(e.into()),
            }
        } else {
            ring.submit()?;
        }
        for cqe in ring.completion() {
            if cqe.user_data() == WAKE {
                wake_armed = false;
            } else {
                finished.push((cqe.user_data(), cqe.result()));
            }
        }
        for (id, result) in std::mem::take(&mut finished) {
            let l = live.get_mut(&id).expect("completion of a known request");
            let target = files.targets[l.sub.tenant as usize];
            match step(l, result) {
                Next::Again => start(&mut ring, target.expect("file request"), id, l)?,
                Next::Done(error) if model.is_some() => {
                    // The data is there; the reply waits for the model's finish time.
                    l.io_result = Some(error);
                    if let Some(at) = l.model_finish {
                        due.push(Reverse((at, id)));
                    }
                }
                Next::Done(error) => {
                    let l = live.remove(&id).expect("known");
                    in_flight -= 1;
                    complete(l, error, now(), policy.as_mut(), &stats, &gates);
                }
            }
        }
        if let Some(m) = model.as_mut() {
            m.advance(now(), &mut model_done);
            for f in model_done.drain(..) {
                let l = live
                    .get_mut(&f.request.id)
                    .expect("modelled a known request");
                l.model_finish = Some(f.finish);
                if l.io_result.is_some() {
                    due.push(Reverse((f.finish, f.request.id)));
                }
            }
            let t = now();
            while let Some(&Reverse((at, id))) = due.peek() {
                if at > t {
                    break;
                }
                due.pop();
                let l = live.remove(&id).expect("due request is live");
                in_flight -= 1;
                let error = l.io_result.expect("data I/O done");
                complete(l, error, t, policy.as_mut(), &stats, &gates);
            }
        }
    }
    for f in &files.files {
        // SAFETY: plain syscall on an open descriptor.
        if unsafe { libc::fdatasync(f.as_raw_fd()) } != 0 {
            eprintln!(
                "ioshare: final sync failed: {}",
                std::io::Error::last_os_error()
            );
        }
    }
    Ok(())
}

/// A request is over: the policy and the counters learn of it, the client gets its reply.
fn complete(
    l: Live,
    error: u32,
    t: Nanos,
    policy: &mut dyn Policy,
    stats: &LiveStats,
    gates: &[Gate],
) {
    let c = Completion {
        request: l.request,
        start: l.start.expect("dispatched"),
        finish: t,
    };
    policy.complete(&c, t);
    stats.completed(&c, error == 0);
    let data = if l.request.op == Op::Read && error == 0 {
        l.buf
    } else {
        None
    };
    answer(gates, l.sub, error, data);
}

fn answer(gates: &[Gate], sub: Submission, error: u32, data: Option<Buffer>) {
    gates[sub.tenant as usize].release();
    // A client that went away no longer reads replies; nothing else to do.
    let _ = sub.reply.send(Reply {
        handle: sub.handle,
        error,
        data,
    });
}

/// The null backend: reads return zeroes, everything succeeds at once (the result a
/// completion of the whole length would carry).
fn null_result(l: &mut Live) -> i32 {
    match l.sub.kind {
        CommandKind::Read => {
            l.buf = Some(Buffer::Plain(vec![0; l.sub.len as usize]));
            l.sub.len as i32
        }
        CommandKind::Write { .. } => l.sub.len as i32,
        _ => 0,
    }
}

fn push(ring: &mut IoUring, e: io_uring::squeue::Entry) -> anyhow::Result<()> {
    // SAFETY: every buffer an entry points to lives in `Live` (or the loop's wake
    // buffer) until its completion has been reaped.
    while unsafe { ring.submission().push(&e) }.is_err() {
        ring.submit()?;
    }
    Ok(())
}

/// Queues the next part of a request on the ring.
fn start(ring: &mut IoUring, target: Target, id: u64, l: &mut Live) -> anyhow::Result<()> {
    let sub = &l.sub;
    let len = sub.len;
    if l.buf.is_none() && l.stage == Stage::Transfer {
        let aligned = sub.offset.is_multiple_of(DIRECT_ALIGN)
            && target.base.is_multiple_of(DIRECT_ALIGN)
            && (len as u64).is_multiple_of(DIRECT_ALIGN);
        l.direct = target.direct.is_some() && aligned;
        l.buf = match &sub.kind {
            CommandKind::Read if l.direct => {
                Some(Buffer::Aligned(AlignedBuf::zeroed(len as usize)))
            }
            CommandKind::Read => Some(Buffer::Plain(vec![0; len as usize])),
            CommandKind::Write { data, .. } if l.direct => {
                let mut a = AlignedBuf::zeroed(len as usize);
                a.as_mut_slice().copy_from_slice(data);
                Some(Buffer::Aligned(a))
            }
            CommandKind::Write { .. } => None, // written from the submission's own bytes
            _ => None,
        };
    }
    let fd = types::Fd(if l.direct {
        target.direct.expect("direct")
    } else {
        target.buffered
    });
    let at = target.base + sub.offset + l.done as u64;
    let rest = len - l.done;
    let dsync = |fua: bool| if fua { libc::RWF_DSYNC } else { 0 };
    let e = match (&l.stage, &sub.kind) {
        (Stage::Sync, _) | (Stage::Transfer, CommandKind::Flush) => {
            opcode::Fsync::new(types::Fd(target.buffered))
                .flags(types::FsyncFlags::DATASYNC)
                .build()
        }
        (Stage::Transfer, CommandKind::Read) => {
            let buf = l.buf.as_mut().expect("read buffer");
            // SAFETY: `done < len` stays inside the buffer.
            let ptr = unsafe { buf.as_mut_ptr().add(l.done as usize) };
            opcode::Read::new(fd, ptr, rest).offset(at).build()
        }
        (Stage::Transfer, CommandKind::Write { data, fua }) => {
            let ptr = match &l.buf {
                Some(b) => b.as_slice().as_ptr(),
                None => data.as_ptr(),
            };
            // SAFETY: as above.
            let ptr = unsafe { ptr.add(l.done as usize) };
            opcode::Write::new(fd, ptr, rest)
                .offset(at)
                .rw_flags(dsync(*fua))
                .build()
        }
        (Stage::Transfer, CommandKind::Trim { .. }) => {
            opcode::Fallocate::new(types::Fd(target.buffered), len as u64)
                .offset(at)
                .mode(libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE)
                .build()
        }
        (Stage::Transfer, CommandKind::WriteZeroes { .. }) => {
            opcode::Fallocate::new(types::Fd(target.buffered), len as u64)
                .offset(at)
                .mode(libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE)
                .build()
        }
        (Stage::ZeroWrite, CommandKind::WriteZeroes { fua }) => {
            let buf = l
                .buf
                .get_or_insert_with(|| Buffer::Plain(vec![0; len as usize]));
            // SAFETY: as above.
            let ptr = unsafe { buf.as_slice().as_ptr().add(l.done as usize) };
            opcode::Write::new(types::Fd(target.buffered), ptr, rest)
                .offset(at)
                .rw_flags(dsync(*fua))
                .build()
        }
        (Stage::ZeroWrite, _) => unreachable!("only zeroing writes zeroes"),
    };
    push(ring, e.user_data(id))
}

enum Next {
    Again,
    Done(u32),
}

/// What a completion means for the request: more to do, or its reply's error value.
fn step(l: &mut Live, result: i32) -> Next {
    let len = l.sub.len;
    if result < 0 {
        let errno = -result;
        return match (&l.stage, &l.sub.kind) {
            // Discarding is advisory: a file system that cannot punch holes keeps data.
            (Stage::Transfer, CommandKind::Trim { fua }) if is_unsupported(errno) => {
                after_range(l, *fua)
            }
            (Stage::Transfer, CommandKind::WriteZeroes { .. }) if is_unsupported(errno) => {
                l.stage = Stage::ZeroWrite;
                l.done = 0;
                Next::Again
            }
            _ => Next::Done(nbd_error(errno)),
        };
    }
    let n = result as u32;
    match (&l.stage, &l.sub.kind) {
        (Stage::Sync, _) | (Stage::Transfer, CommandKind::Flush) => Next::Done(0),
        (Stage::Transfer, CommandKind::Read) => {
            if n == 0 {
                // Past the end of a file: the rest reads as zeroes.
                let done = l.done as usize;
                l.buf.as_mut().expect("read buffer").fill_zero_from(done);
                return Next::Done(0);
            }
            l.done += n;
            if l.done < len {
                Next::Again
            } else {
                Next::Done(0)
            }
        }
        (Stage::Transfer, CommandKind::Write { .. }) | (Stage::ZeroWrite, _) => {
            if n == 0 {
                return Next::Done(proto::EIO);
            }
            l.done += n;
            if l.done < len {
                Next::Again
            } else {
                Next::Done(0)
            }
        }
        (Stage::Transfer, CommandKind::Trim { fua })
        | (Stage::Transfer, CommandKind::WriteZeroes { fua }) => after_range(l, *fua),
    }
}

/// A trim or zeroing is done; with FUA it is followed by a sync.
fn after_range(l: &mut Live, fua: bool) -> Next {
    if fua {
        l.stage = Stage::Sync;
        Next::Again
    } else {
        Next::Done(0)
    }
}

fn is_unsupported(errno: i32) -> bool {
    errno == libc::EOPNOTSUPP || errno == libc::EINVAL || errno == libc::ENOSYS
}

/// The NBD error value for an errno (the protocol allows a few).
fn nbd_error(errno: i32) -> u32 {
    match errno {
        libc::EPERM | libc::EROFS | libc::EACCES => proto::EPERM,
        libc::ENOMEM => proto::ENOMEM,
        libc::EINVAL => proto::EINVAL,
        libc::ENOSPC | libc::EDQUOT | libc::EFBIG => proto::ENOSPC,
        libc::EOVERFLOW => proto::EOVERFLOW,
        libc::EOPNOTSUPP => proto::ENOTSUP,
        _ => proto::EIO,
    }
}
