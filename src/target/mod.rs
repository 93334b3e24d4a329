//! Real targets for `characterize` and `calibrate`: a file or a block device measured
//! with `O_DIRECT` I/O on io_uring, through the file backend's request state machine
//! ([`crate::io::transfer::Transfer`], what the live server does with a request).
//!
//! A [`RingDevice`] stands where a device model stands in the simulator: the same
//! driver issues the scenario's requests through the same host core and policy, but
//! waits for the device in wall time ([`crate::device::Wall`]). What it writes is
//! not data anyone keeps, so opening a target for writing is guarded: a file is
//! written only if `characterize` / `calibrate` created it, a block device never while
//! a file system on it (or on one of its partitions) is mounted, and anything else only
//! with `destroy_data`. The kernel's I/O scheduler of a block device is switched
//! through sysfs by a [`SchedulerGuard`] that puts the old one back when dropped.

// The ring: an entry points at buffers its slot owns until the completion is reaped
// (slots are boxed, and `Drop` waits for everything in flight).
#![allow(unsafe_code)]

use crate::buffer::IoBuf;
use crate::device::{DeviceModel, Finished, Submitted, Wall};
use crate::io::ring::Ring;
use crate::io::transfer::{Cache, DIRECT_ALIGN, Next, Target as FileTarget, Transfer};
use crate::nbd::CommandKind;
use crate::types::{Nanos, Op, Request};
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Why a target could not be opened, prepared or switched.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    /// What was asked would be unsafe or cannot be done here (the message says which
    /// option or path, and what to do instead).
    #[error("{0}")]
    Refused(String),
    /// A system call failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done, naming its path.
        what: String,
        /// Why.
        source: std::io::Error,
    },
    /// The target failed a request while it was written.
    #[error("{0}")]
    Failed(String),
}

/// Refuses with a formatted message.
macro_rules! refuse {
    ($($t:tt)*) => {
        return Err(TargetError::Refused(format!($($t)*)))
    };
}

/// An I/O result with what was being done.
trait At<T> {
    fn at(self, what: impl FnOnce() -> String) -> Result<T, TargetError>;
}

impl<T> At<T> for std::io::Result<T> {
    fn at(self, what: impl FnOnce() -> String) -> Result<T, TargetError> {
        self.map_err(|source| TargetError::Io {
            what: what(),
            source,
        })
    }
}

/// What a target is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// A regular file; `created`: this run made it (and removes it when done).
    File {
        /// Made by this run.
        created: bool,
    },
    /// A block device; `sysfs` is its name under `/sys/block` (a partition's disk).
    Block {
        /// The disk's name under `/sys/block`.
        sysfs: String,
    },
}

/// An opened target.
#[derive(Debug)]
pub struct Target {
    /// Its path.
    pub path: PathBuf,
    /// File or block device.
    pub kind: Kind,
    /// Bytes measured (the file's or device's size, down to 2 MiB).
    pub size: u64,
    direct: Arc<File>,
    buffered: Arc<File>,
    /// A block device written to: held open exclusively for the run.
    _exclusive: Option<File>,
    /// Whether writes are allowed.
    pub writable: bool,
}

/// Targets are measured in whole 2 MiB (so two tenants' halves stay aligned).
const MIN_BYTES: u64 = 2 << 20;

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Makes SIGINT and SIGTERM stop a measurement as a failure ("interrupted"), so that
/// what it changed is put back as it unwinds (a created file removed, a scheduler
/// restored) instead of the process dying with it changed. Once: a second signal
/// kills the process as usual.
pub fn stop_on_signals() {
    // SAFETY: a zeroed sigaction with a handler that only stores to an atomic.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_signal as *const () as libc::sighandler_t;
        action.sa_flags = libc::SA_RESETHAND;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(libc::SIGTERM, &action, std::ptr::null_mut());
        libc::sigaction(libc::SIGINT, &action, std::ptr::null_mut());
    }
}

/// Why a measurement must stop, when SIGINT or SIGTERM came ([`stop_on_signals`]).
pub fn interrupted() -> Option<String> {
    INTERRUPTED
        .load(Ordering::SeqCst)
        .then(|| "interrupted (SIGINT or SIGTERM)".to_string())
}

/// Requests aligned to this (`O_DIRECT`).
const ALIGN: u64 = DIRECT_ALIGN;

impl Target {
    /// Opens `path`. A missing path is created as a file of `create_bytes` (fill it
    /// with [`Target::fill`] so reads read something); writing to anything this call
    /// did not create needs `destroy_data`, and a block device that is mounted, swap,
    /// or held by device-mapper, md or another measurement is refused even then.
    pub fn open(
        path: &Path,
        create_bytes: Option<u64>,
        writes: bool,
        destroy_data: bool,
    ) -> Result<Target, TargetError> {
        if !path.exists() {
            let Some(bytes) = create_bytes else {
                refuse!(
                    "{} does not exist: give --size to create a file of that size to measure",
                    path.display()
                );
            };
            if bytes < MIN_BYTES {
                refuse!("--size {bytes}: a target is at least 2 MiB");
            }
            let f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(path)
                .at(|| format!("cannot create {}", path.display()))?;
            // Removed again if anything below fails.
            let opened = f
                .set_len(bytes)
                .at(|| format!("cannot size {} to {bytes} bytes", path.display()))
                .and_then(|()| Target::open_existing(path, true, writes, destroy_data));
            if opened.is_err() {
                let _ = std::fs::remove_file(path);
            }
            return opened;
        }
        if let Some(bytes) = create_bytes {
            let has = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
            refuse!(
                "--size {bytes} is for a TARGET that does not exist; {} does ({has} bytes)",
                path.display()
            );
        }
        Target::open_existing(path, false, writes, destroy_data)
    }

    fn open_existing(
        path: &Path,
        created: bool,
        writes: bool,
        destroy_data: bool,
    ) -> Result<Target, TargetError> {
        let meta = std::fs::metadata(path).at(|| path.display().to_string())?;
        let kind = if meta.file_type().is_block_device() {
            Kind::Block {
                sysfs: disk_name(meta.rdev())?,
            }
        } else if meta.is_file() {
            Kind::File { created }
        } else {
            refuse!(
                "{} is neither a regular file nor a block device",
                path.display()
            );
        };
        if writes && !created && !destroy_data {
            refuse!(
                "{} exists and measuring writes to it destroys its data: give --destroy-data \
                 if that is what you want (or a path that does not exist, with --size, to \
                 measure a new file)",
                path.display()
            );
        }
        let block = matches!(kind, Kind::Block { .. });
        let open = |direct: bool, exclusive: bool| {
            OpenOptions::new()
                .read(true)
                .write(writes)
                .custom_flags(
                    if direct { libc::O_DIRECT } else { 0 }
                        | if exclusive { libc::O_EXCL } else { 0 },
                )
                .open(path)
        };
        // A block device written to is opened exclusively first, and kept so: the
        // kernel refuses while a file system is mounted on it (in any namespace), it
        // holds swap, or device-mapper / md / a claimed partition uses it — and
        // nothing can mount it while the run lasts.
        let exclusive = if block && writes {
            match open(false, true) {
                Ok(f) => Some(f),
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    let why = mounted(meta.rdev()).ok().flatten().map_or(
                        "in use: mounted, swap, or held by device-mapper, md, a partition or another measurement"
                            .to_string(),
                        |m| format!("holds a mounted file system ({m})"),
                    );
                    refuse!("{} {why}; refusing to write to it", path.display());
                }
                Err(e) => return Err(e).at(|| format!("cannot open {}", path.display())),
            }
        } else {
            None
        };
        let direct = open(true, false).map_err(|e| match e.raw_os_error() {
            Some(libc::EINVAL) => TargetError::Refused(format!(
                "{}: its file system does not support O_DIRECT (tmpfs does not): measure a \
                 file on the disk itself",
                path.display()
            )),
            _ => TargetError::Io {
                what: format!("cannot open {}", path.display()),
                source: e,
            },
        })?;
        let buffered = open(false, false).at(|| format!("cannot open {}", path.display()))?;
        let bytes = match kind {
            Kind::Block { .. } => {
                let mut f = &buffered;
                std::io::Seek::seek(&mut f, std::io::SeekFrom::End(0))
                    .at(|| format!("cannot find the size of {}", path.display()))?
            }
            Kind::File { .. } => meta.len(),
        };
        let size = bytes / MIN_BYTES * MIN_BYTES;
        if size == 0 {
            refuse!("{} is smaller than 2 MiB", path.display());
        }
        Ok(Target {
            path: path.to_path_buf(),
            kind,
            size,
            direct: Arc::new(direct),
            buffered: Arc::new(buffered),
            _exclusive: exclusive,
            writable: writes,
        })
    }

    /// One line for reports.
    pub fn describe(&self) -> String {
        let what = match &self.kind {
            Kind::File { .. } => "file".to_string(),
            Kind::Block { sysfs } => format!("block device {sysfs}"),
        };
        format!(
            "{} ({what}), {}",
            self.path.display(),
            crate::units::format_bytes(self.size)
        )
    }

    /// Writes the whole target once, 1 MiB at a time at queue depth 16, so that reads
    /// read data (a fresh file's holes read as zeroes without touching the disk).
    pub fn fill(&self, progress: bool) -> Result<(), TargetError> {
        let chunk = 1u64 << 20;
        let count = self.size / chunk;
        self.write_pass("filling", count, chunk as u32, 16, |i| i * chunk, progress)
    }

    /// Ages the target: random 4 KiB writes at queue depth 32, `passes` times its size
    /// in all (seeded: the same offsets every run), so that a flash drive is measured
    /// in the steady state its garbage collection reaches rather than fresh.
    pub fn age(&self, passes: f64, progress: bool) -> Result<(), TargetError> {
        use rand::{RngExt, SeedableRng};
        if !(passes.is_finite() && passes > 0.0 && passes <= 100.0) {
            refuse!("aging passes must be in (0, 100], got {passes}");
        }
        let slots = self.size / 4096;
        let count = (passes * slots as f64) as u64;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        self.write_pass(
            "aging",
            count,
            4096,
            32,
            move |_| rng.random_range(0..slots) * 4096,
            progress,
        )
    }

    /// `count` writes of `len` bytes at the offsets `at` gives, `depth` at a time.
    fn write_pass(
        &self,
        label: &str,
        count: u64,
        len: u32,
        depth: usize,
        mut at: impl FnMut(u64) -> u64,
        progress: bool,
    ) -> Result<(), TargetError> {
        let bar = progress.then(|| {
            let b = indicatif::ProgressBar::new(count);
            b.set_style(
                indicatif::ProgressStyle::with_template(&format!(
                    "{label} [{{bar:30}}] {{pos}}/{{len}} writes ({{eta}} left)"
                ))
                .expect("valid template")
                .progress_chars("=> "),
            );
            b
        });
        let mut dev = self.device()?;
        let mut issued = 0u64;
        let mut done = Vec::new();
        let mut in_flight = 0;
        while issued < count || in_flight > 0 {
            while in_flight < depth && issued < count {
                let r = Request {
                    id: issued + 1,
                    tenant: 0,
                    op: Op::Write,
                    offset: at(issued),
                    len,
                    arrival: 0,
                    cost: 0,
                };
                let _ = dev.submit(&r, dev.now());
                issued += 1;
                in_flight += 1;
            }
            dev.wait(dev.now() + 1_000_000_000);
            if let Some(e) = dev.failure() {
                return Err(TargetError::Failed(format!(
                    "{label} {}: {e}",
                    self.path.display()
                )));
            }
            done.clear();
            let now = dev.now();
            dev.advance(now, &mut done);
            in_flight -= done.len();
            if let Some(b) = &bar {
                b.inc(done.len() as u64);
            }
        }
        if let Some(b) = bar {
            b.finish_and_clear();
        }
        self.direct
            .sync_all()
            .at(|| format!("{label} {}: sync", self.path.display()))?;
        Ok(())
    }

    /// A device on a ring of its own over this target.
    pub fn device(&self) -> Result<RingDevice, TargetError> {
        RingDevice::new(self)
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        if let Kind::File { created: true } = self.kind {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// The sysfs folder of the disk (not partition) a block device number is or is part of.
pub(crate) fn disk_dir(rdev: u64) -> Result<std::path::PathBuf, TargetError> {
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    let link = format!("/sys/dev/block/{major}:{minor}");
    let real = std::fs::canonicalize(&link).at(|| format!("cannot resolve {link}"))?;
    // A partition's directory sits inside its disk's.
    Ok(if real.join("partition").exists() {
        real.parent().map(Path::to_path_buf).unwrap_or(real)
    } else {
        real
    })
}

/// The disk (not partition) name under `/sys/block` of a block device number.
fn disk_name(rdev: u64) -> Result<String, TargetError> {
    Ok(disk_dir(rdev)?
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default())
}

/// Where a file system on the device (or one of its partitions) is mounted, if any.
fn mounted(rdev: u64) -> Result<Option<String>, TargetError> {
    let disk = disk_name(rdev)?;
    let mut numbers = vec![format!("{}:{}", libc::major(rdev), libc::minor(rdev))];
    if let Ok(entries) = std::fs::read_dir(format!("/sys/block/{disk}")) {
        for e in entries.flatten() {
            if e.path().join("partition").exists()
                && let Ok(dev) = std::fs::read_to_string(e.path().join("dev"))
            {
                numbers.push(dev.trim().to_string());
            }
        }
    }
    let whole = std::fs::read_to_string(format!("/sys/block/{disk}/dev")).unwrap_or_default();
    numbers.push(whole.trim().to_string());
    let info = std::fs::read_to_string("/proc/self/mountinfo")
        .at(|| "cannot read /proc/self/mountinfo".into())?;
    Ok(info.lines().find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        (f.len() > 4 && numbers.iter().any(|n| n == f[2])).then(|| f[4].to_string())
    }))
}

/// The kernel schedulers a disk offers, and the one in use (a device with a single
/// one, as device-mapper's `none`, lists it without brackets).
pub fn schedulers(disk: &str) -> Result<(Vec<String>, String), TargetError> {
    let path = format!("/sys/block/{disk}/queue/scheduler");
    let text = std::fs::read_to_string(&path).at(|| format!("cannot read {path}"))?;
    let mut current = String::new();
    let names: Vec<String> = text
        .split_whitespace()
        .map(|w| {
            if let Some(n) = w.strip_prefix('[').and_then(|w| w.strip_suffix(']')) {
                current = n.to_string();
                n.to_string()
            } else {
                w.to_string()
            }
        })
        .collect();
    if current.is_empty() && names.len() == 1 {
        current = names[0].clone();
    }
    Ok((names, current))
}

/// A disk's scheduler switched; the old one comes back when this is dropped, with the
/// queue's `nr_requests` and the old scheduler's tunables (`queue/iosched/*`), which a
/// switch resets. On a partition, the whole disk's scheduler is switched.
pub struct SchedulerGuard {
    disk: String,
    old: String,
    nr_requests: Option<String>,
    tunables: Vec<(PathBuf, String)>,
}

impl SchedulerGuard {
    /// Switches `disk` to `scheduler` (which it must offer).
    pub fn switch(disk: &str, scheduler: &str) -> Result<SchedulerGuard, TargetError> {
        let (names, old) = schedulers(disk)?;
        if !names.iter().any(|n| n == scheduler) {
            refuse!(
                "{disk} offers no scheduler '{scheduler}' (it has: {})",
                names.join(", ")
            );
        }
        let queue = PathBuf::from(format!("/sys/block/{disk}/queue"));
        let nr_requests = std::fs::read_to_string(queue.join("nr_requests"))
            .ok()
            .map(|s| s.trim().to_string());
        let mut tunables = Vec::new();
        if let Ok(entries) = std::fs::read_dir(queue.join("iosched")) {
            for e in entries.flatten() {
                if let Ok(v) = std::fs::read_to_string(e.path()) {
                    tunables.push((e.path(), v.trim().to_string()));
                }
            }
        }
        eprintln!("{disk}: scheduler {old} -> {scheduler} (put back when done)");
        set_scheduler(disk, scheduler)?;
        Ok(SchedulerGuard {
            disk: disk.to_string(),
            old,
            nr_requests,
            tunables,
        })
    }
}

fn set_scheduler(disk: &str, scheduler: &str) -> Result<(), TargetError> {
    let path = format!("/sys/block/{disk}/queue/scheduler");
    std::fs::write(&path, scheduler).map_err(|source| {
        let root = matches!(
            source.raw_os_error(),
            Some(libc::EACCES) | Some(libc::EPERM)
        );
        TargetError::Io {
            what: format!(
                "cannot write '{scheduler}' to {path}{}",
                if root { " (root is needed)" } else { "" }
            ),
            source,
        }
    })
}

impl Drop for SchedulerGuard {
    fn drop(&mut self) {
        if self.old.is_empty() {
            return;
        }
        if let Err(e) = set_scheduler(&self.disk, &self.old) {
            eprintln!(
                "could not put {}'s scheduler back to {}: {e}",
                self.disk, self.old
            );
            return;
        }
        let queue = PathBuf::from(format!("/sys/block/{}/queue", self.disk));
        let put = |path: &Path, value: &str| {
            if let Err(e) = std::fs::write(path, value)
                // Read-only entries (EACCES) and values the scheduler refuses (EINVAL)
                // stay as they are.
                && !matches!(e.raw_os_error(), Some(libc::EACCES) | Some(libc::EINVAL))
            {
                eprintln!("could not put {} back to {value}: {e}", path.display());
            }
        };
        if let Some(n) = &self.nr_requests {
            put(&queue.join("nr_requests"), n);
        }
        for (path, value) in &self.tunables {
            put(path, value);
        }
    }
}

/// One request on the ring.
struct Slot {
    request: Request,
    submitted: Nanos,
    transfer: Transfer,
}

/// A real device in the simulator's place: requests go to the target on io_uring;
/// completions come back at the wall-clock time they were reaped.
pub struct RingDevice {
    /// Dropped first: nothing is in flight by then (see `Drop`).
    ring: Ring,
    direct: Arc<File>,
    buffered: Arc<File>,
    capacity: u64,
    writable: bool,
    start: Instant,
    slots: Vec<Option<Box<Slot>>>,
    free: Vec<usize>,
    in_flight: usize,
    ready: Vec<Finished>,
    failure: Arc<Mutex<Option<String>>>,
    /// Write payloads back from completed writes, to write again ([`Self::payload`]).
    spare: Vec<IoBuf>,
}

/// The count stamped on each 4 KiB block written, over the whole process (every run's
/// blocks differ from every other's).
static STAMP: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl RingDevice {
    fn new(t: &Target) -> Result<RingDevice, TargetError> {
        let ring = Ring::new(256).at(|| "cannot set up io_uring".into())?;
        if !ring.waits_with_timeout() {
            refuse!(
                "this kernel's io_uring cannot wait with a timeout (Linux 5.11 or later is needed)"
            );
        }
        Ok(RingDevice {
            ring,
            direct: t.direct.clone(),
            buffered: t.buffered.clone(),
            capacity: t.size,
            writable: t.writable,
            start: Instant::now(),
            slots: Vec::new(),
            free: Vec::new(),
            in_flight: 0,
            ready: Vec::new(),
            failure: Arc::new(Mutex::new(None)),
            spare: Vec::new(),
        })
    }

    /// The first failure (a request the target refused, an I/O error), shared with
    /// whoever watches the run.
    pub fn failure_slot(&self) -> Arc<Mutex<Option<String>>> {
        self.failure.clone()
    }

    fn fail(&self, why: String) {
        let mut f = self.failure.lock().expect("failure lock");
        if f.is_none() {
            *f = Some(why);
        }
    }

    fn target(&self) -> FileTarget {
        FileTarget {
            buffered: self.buffered.as_raw_fd(),
            direct: Some(self.direct.as_raw_fd()),
            base: 0,
            cache: Cache::None,
        }
    }

    fn push(&mut self, slot: usize) {
        let target = self.target();
        let s = self.slots[slot].as_mut().expect("a live slot");
        let entry = s.transfer.entry(target).user_data(slot as u64);
        // SAFETY: the buffers the entry points at live in the boxed slot, which stays
        // until its completion is reaped, or the ring settled (`Drop`).
        if let Err(e) = unsafe { self.ring.push(&entry) } {
            self.fail(format!("io_uring: {e}"));
        }
    }

    /// A write's payload: a buffer of pseudo-random bytes (not zeroes: a device that
    /// compresses or skips zeroes would be measured doing less than it does for real
    /// data), made once per size and reused; each 4 KiB block is stamped with a
    /// running count, so no two writes carry the same blocks (a deduplicating device
    /// would skip repeats). Made before the request's time is taken (in the driver's
    /// dispatch, before `submit` is timed by the completion), a copy is never made on
    /// the way.
    fn payload(&mut self, len: usize) -> IoBuf {
        let mut buf = match self.spare.iter().position(|b| b.len() == len) {
            Some(i) => self.spare.swap_remove(i),
            None => {
                // A fixed pseudo-random pattern (xorshift): the same bytes every run.
                let mut x: u64 = 0x9E37_79B9_7F4A_7C15 ^ len as u64;
                let mut v = Vec::with_capacity(len + 8);
                while v.len() < len {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    v.extend_from_slice(&x.to_le_bytes());
                }
                v.truncate(len);
                IoBuf::copy_of(&v)
            }
        };
        // One range of counts per write: its blocks are numbered in order.
        let blocks = len.div_ceil(4096) as u64;
        let first = STAMP.fetch_add(blocks, Ordering::Relaxed) + 1;
        for (i, block) in buf.chunks_mut(4096).enumerate() {
            let n = block.len().min(8);
            block[..n].copy_from_slice(&(first + i as u64).to_le_bytes()[..n]);
        }
        buf
    }

    /// Completes a request the target cannot take without sending it anywhere (the
    /// run has failed already).
    fn refuse(&mut self, request: &Request, now: Nanos, why: String) -> Submitted {
        self.fail(why);
        self.ready.push(Finished {
            request: *request,
            submitted: now,
            finish: now,
            busy: None,
        });
        Submitted::Queued
    }

    fn reap(&mut self) {
        let now = self.now();
        let mut again = Vec::new();
        let mut cqes = Vec::new();
        self.ring.completions(&mut cqes);
        for (slot, result) in cqes {
            let slot = slot as usize;
            let s = self.slots[slot]
                .as_mut()
                .expect("a completion of a live slot");
            match s.transfer.step(result) {
                Next::Again => again.push(slot),
                Next::Done(error) => {
                    if error != 0 {
                        let what = if result < 0 {
                            std::io::Error::from_raw_os_error(-result).to_string()
                        } else {
                            format!("moved {result} of {} bytes", s.request.len)
                        };
                        let why = format!(
                            "{:?} of {} bytes at {} failed: {what}",
                            s.request.op, s.request.len, s.request.offset
                        );
                        self.fail(why);
                    }
                    let s = self.slots[slot].take().expect("a live slot");
                    self.free.push(slot);
                    self.in_flight -= 1;
                    self.ready.push(Finished {
                        request: s.request,
                        submitted: s.submitted,
                        finish: now,
                        busy: None,
                    });
                    if let Some(buf) = s.transfer.into_write_data() {
                        self.spare.push(buf);
                    }
                }
                Next::PastEnd => {
                    let why = format!(
                        "a read at {} met the end of the target: it shrank",
                        s.request.offset
                    );
                    self.fail(why);
                    let s = self.slots[slot].take().expect("a live slot");
                    self.free.push(slot);
                    self.in_flight -= 1;
                    self.ready.push(Finished {
                        request: s.request,
                        submitted: s.submitted,
                        finish: now,
                        busy: None,
                    });
                }
            }
        }
        for slot in again {
            self.push(slot);
        }
    }
}

impl Wall for RingDevice {
    fn now(&self) -> Nanos {
        self.start.elapsed().as_nanos() as Nanos
    }

    fn wait(&mut self, until: Nanos) {
        let result = if !self.ready.is_empty() {
            // Completions to hand out first; what was queued meanwhile goes now.
            self.ring.submit()
        } else {
            // In slices of at most 0.1 s, so that an interruption is seen.
            let ns = until.saturating_sub(self.now()).min(100_000_000);
            if self.in_flight == 0 {
                // Nothing to wait for but the time.
                let submitted = self.ring.submit();
                std::thread::sleep(std::time::Duration::from_nanos(ns));
                submitted
            } else {
                self.ring.wait(Some(std::time::Duration::from_nanos(ns)))
            }
        };
        if let Err(e) = result {
            self.fail(format!("io_uring: {e}"));
        }
        self.reap();
    }

    fn failure(&self) -> Option<String> {
        self.failure
            .lock()
            .expect("failure lock")
            .clone()
            .or_else(interrupted)
    }
}

impl DeviceModel for RingDevice {
    fn submit(&mut self, request: &Request, now: Nanos) -> Submitted {
        let end = request.offset + u64::from(request.len);
        if end > self.capacity
            || !request.offset.is_multiple_of(ALIGN)
            || !u64::from(request.len).is_multiple_of(ALIGN)
        {
            let why = format!(
                "a request of {} bytes at {} is past the target's {} bytes or not \
                 {ALIGN}-aligned",
                request.len, request.offset, self.capacity
            );
            return self.refuse(request, now, why);
        }
        if request.op == Op::Status {
            let why = "a block status: a target runs data requests".to_string();
            return self.refuse(request, now, why);
        }
        if matches!(request.op, Op::Write | Op::Trim) && !self.writable {
            let why = format!("a {:?} to a target opened for reading", request.op);
            return self.refuse(request, now, why);
        }
        let kind = match request.op {
            Op::Read => CommandKind::Read,
            Op::Write => CommandKind::Write {
                data: self.payload(request.len as usize),
                fua: false,
            },
            Op::Flush => CommandKind::Flush,
            Op::Trim => CommandKind::Trim { fua: false },
            Op::Status => unreachable!("refused above"),
        };
        let slot = Box::new(Slot {
            request: *request,
            submitted: now,
            transfer: Transfer::new(kind, request.offset, request.len),
        });
        let idx = match self.free.pop() {
            Some(i) => {
                self.slots[i] = Some(slot);
                i
            }
            None => {
                self.slots.push(Some(slot));
                self.slots.len() - 1
            }
        };
        self.in_flight += 1;
        self.push(idx);
        Submitted::Queued
    }

    fn next_event(&self) -> Option<Nanos> {
        self.ready.iter().map(|f| f.finish).min()
    }

    fn advance(&mut self, now: Nanos, done: &mut Vec<Finished>) {
        let (due, later): (Vec<Finished>, Vec<Finished>) =
            self.ready.drain(..).partition(|f| f.finish <= now);
        self.ready = later;
        done.extend(due);
    }

    fn capacity_bytes(&self) -> u64 {
        self.capacity
    }

    fn clone_box(&self) -> Box<dyn DeviceModel> {
        // A fresh ring on the same target: a real device has one state, which the copy
        // shares.
        Box::new(RingDevice {
            ring: Ring::new(256).expect("a second io_uring"),
            direct: self.direct.clone(),
            buffered: self.buffered.clone(),
            capacity: self.capacity,
            writable: self.writable,
            start: Instant::now(),
            slots: Vec::new(),
            free: Vec::new(),
            in_flight: 0,
            ready: Vec::new(),
            failure: self.failure.clone(),
            spare: Vec::new(),
        })
    }

    fn wall(&mut self) -> Option<&mut dyn Wall> {
        Some(self)
    }
}

impl Drop for RingDevice {
    fn drop(&mut self) {
        // The kernel may still write into buffers the slots own: wait for everything,
        // or leak them rather than free them under it.
        if !self.ring.settle(std::time::Duration::from_secs(10), || {}) {
            std::mem::forget(std::mem::take(&mut self.slots));
        }
    }
}

#[cfg(test)]
mod tests;
