//! Real targets for `characterize` and `calibrate`: a file or a block device measured
//! with `O_DIRECT` I/O on io_uring, through the file backend's request state machine
//! ([`crate::server::backend::Transfer`], what the live server does with a request).
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
use crate::nbd::CommandKind;
use crate::server::backend::{Next, Target as FileTarget, Transfer};
use crate::types::{Nanos, Op, Request};
use anyhow::{Context, bail};
use io_uring::{IoUring, types};
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

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
    /// Whether writes are allowed.
    pub writable: bool,
}

/// Requests aligned to this (`O_DIRECT`).
const ALIGN: u64 = crate::server::backend::DIRECT_ALIGN;

impl Target {
    /// Opens `path`. A missing path is created as a file of `create_bytes` (and
    /// filled with data, so reads read something); writing to anything this call did
    /// not create needs `destroy_data`, and to a block device with a mounted file
    /// system is refused even then unless `destroy_data` — the caller says so.
    pub fn open(
        path: &Path,
        create_bytes: Option<u64>,
        writes: bool,
        destroy_data: bool,
    ) -> anyhow::Result<Target> {
        let exists = path.exists();
        let created = !exists;
        if created {
            let Some(bytes) = create_bytes else {
                bail!(
                    "{} does not exist: give --size to create a file of that size to measure",
                    path.display()
                );
            };
            let f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(path)
                .with_context(|| format!("cannot create {}", path.display()))?;
            f.set_len(bytes)
                .with_context(|| format!("cannot size {} to {bytes} bytes", path.display()))?;
        }
        let meta = std::fs::metadata(path).with_context(|| format!("{}", path.display()))?;
        let kind = if meta.file_type().is_block_device() {
            Kind::Block {
                sysfs: disk_name(meta.rdev())?,
            }
        } else if meta.is_file() {
            Kind::File { created }
        } else {
            bail!(
                "{} is neither a regular file nor a block device",
                path.display()
            );
        };
        if writes && !created && !destroy_data {
            bail!(
                "{} exists and measuring writes to it destroys its data: give --destroy-data \
                 if that is what you want (or a path that does not exist, with --size, to \
                 measure a new file)",
                path.display()
            );
        }
        if let Kind::Block { .. } = kind
            && writes
            && let Some(m) = mounted(meta.rdev())?
        {
            bail!(
                "{} holds a mounted file system ({m}); refusing to write to it",
                path.display()
            );
        }
        let open = |direct: bool| {
            OpenOptions::new()
                .read(true)
                .write(writes)
                .custom_flags(if direct { libc::O_DIRECT } else { 0 })
                .open(path)
                .with_context(|| format!("cannot open {}", path.display()))
        };
        let direct = open(true)?;
        let buffered = open(false)?;
        let bytes = match kind {
            Kind::Block { .. } => {
                let mut f = &buffered;
                std::io::Seek::seek(&mut f, std::io::SeekFrom::End(0))?
            }
            Kind::File { .. } => meta.len(),
        };
        let size = bytes / (2 << 20) * (2 << 20);
        if size == 0 {
            bail!("{} is smaller than 2 MiB", path.display());
        }
        Ok(Target {
            path: path.to_path_buf(),
            kind,
            size,
            direct: Arc::new(direct),
            buffered: Arc::new(buffered),
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
    pub fn fill(&self, progress: bool) -> anyhow::Result<()> {
        let bar = progress.then(|| {
            let b = indicatif::ProgressBar::new(self.size >> 20);
            b.set_style(
                indicatif::ProgressStyle::with_template("filling [{bar:30}] {pos}/{len} MiB")
                    .expect("valid template")
                    .progress_chars("=> "),
            );
            b
        });
        let mut dev = self.device()?;
        let chunk = 1u64 << 20;
        let mut next = 0u64;
        let mut id = 0;
        let mut done = Vec::new();
        let mut in_flight = 0;
        while next < self.size || in_flight > 0 {
            while in_flight < 16 && next < self.size {
                id += 1;
                let r = Request {
                    id,
                    tenant: 0,
                    op: Op::Write,
                    offset: next,
                    len: chunk as u32,
                    arrival: 0,
                };
                let _ = dev.submit(&r, 0);
                next += chunk;
                in_flight += 1;
            }
            dev.wait(u64::MAX);
            if let Some(e) = dev.failure() {
                bail!("filling {}: {e}", self.path.display());
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
        self.direct.sync_all()?;
        Ok(())
    }

    /// A device on a ring of its own over this target.
    pub fn device(&self) -> anyhow::Result<RingDevice> {
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

/// The disk (not partition) name under `/sys/block` of a block device number.
fn disk_name(rdev: u64) -> anyhow::Result<String> {
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    let link = format!("/sys/dev/block/{major}:{minor}");
    let real = std::fs::canonicalize(&link).with_context(|| format!("cannot resolve {link}"))?;
    // A partition's directory sits inside its disk's.
    let dir = if real.join("partition").exists() {
        real.parent().map(Path::to_path_buf).unwrap_or(real)
    } else {
        real
    };
    Ok(dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default())
}

/// Where a file system on the device (or one of its partitions) is mounted, if any.
fn mounted(rdev: u64) -> anyhow::Result<Option<String>> {
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
        .context("cannot read /proc/self/mountinfo")?;
    Ok(info.lines().find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        (f.len() > 4 && numbers.iter().any(|n| n == f[2])).then(|| f[4].to_string())
    }))
}

/// The kernel schedulers a disk offers, and the one in use.
pub fn schedulers(disk: &str) -> anyhow::Result<(Vec<String>, String)> {
    let path = format!("/sys/block/{disk}/queue/scheduler");
    let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {path}"))?;
    let mut current = String::new();
    let names = text
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
    Ok((names, current))
}

/// A disk's scheduler switched; the old one comes back when this is dropped.
pub struct SchedulerGuard {
    disk: String,
    old: String,
}

impl SchedulerGuard {
    /// Switches `disk` to `scheduler` (which it must offer).
    pub fn switch(disk: &str, scheduler: &str) -> anyhow::Result<SchedulerGuard> {
        let (names, old) = schedulers(disk)?;
        if !names.iter().any(|n| n == scheduler) {
            bail!(
                "{disk} offers no scheduler '{scheduler}' (it has: {})",
                names.join(", ")
            );
        }
        set_scheduler(disk, scheduler)?;
        Ok(SchedulerGuard {
            disk: disk.to_string(),
            old,
        })
    }
}

fn set_scheduler(disk: &str, scheduler: &str) -> anyhow::Result<()> {
    let path = format!("/sys/block/{disk}/queue/scheduler");
    std::fs::write(&path, scheduler)
        .with_context(|| format!("cannot write '{scheduler}' to {path} (root is needed)"))
}

impl Drop for SchedulerGuard {
    fn drop(&mut self) {
        if let Err(e) = set_scheduler(&self.disk, &self.old) {
            eprintln!(
                "could not put {}'s scheduler back to {}: {e}",
                self.disk, self.old
            );
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
    ring: IoUring,
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
    /// Bytes every write writes (not zeroes: a device that compresses or skips zeroes
    /// would be measured doing less than it does for real data).
    pattern: Arc<Vec<u8>>,
}

impl RingDevice {
    fn new(t: &Target) -> anyhow::Result<RingDevice> {
        Ok(RingDevice {
            ring: IoUring::new(256).context("cannot set up io_uring")?,
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
            pattern: Arc::new(Vec::new()),
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
        }
    }

    fn push(&mut self, slot: usize) {
        let target = self.target();
        let s = self.slots[slot].as_mut().expect("a live slot");
        let entry = s.transfer.entry(target).user_data(slot as u64);
        // The queue holds 256 and a run keeps at most its queue depth in flight.
        // SAFETY: the buffers the entry points at live in the boxed slot, which stays
        // until its completion is reaped.
        while unsafe { self.ring.submission().push(&entry) }.is_err() {
            let _ = self.ring.submit();
        }
    }

    fn pattern(&mut self, len: usize) -> IoBuf {
        if self.pattern.len() < len {
            // A fixed pseudo-random pattern (xorshift): the same bytes every run.
            let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
            let mut v = Vec::with_capacity(len);
            while v.len() < len {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                v.extend_from_slice(&x.to_le_bytes());
            }
            v.truncate(len);
            self.pattern = Arc::new(v);
        }
        IoBuf::copy_of(&self.pattern[..len])
    }

    fn reap(&mut self) {
        let now = self.now();
        let mut again = Vec::new();
        let cqes: Vec<(u64, i32)> = self
            .ring
            .completion()
            .map(|c| (c.user_data(), c.result()))
            .collect();
        for (slot, result) in cqes {
            let slot = slot as usize;
            let s = self.slots[slot]
                .as_mut()
                .expect("a completion of a live slot");
            match s.transfer.step(result) {
                Next::Again => again.push(slot),
                Next::Done(error) => {
                    if error != 0 {
                        let why = format!(
                            "{:?} of {} bytes at {} failed: {}",
                            s.request.op,
                            s.request.len,
                            s.request.offset,
                            std::io::Error::from_raw_os_error(-result.min(-1))
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
                    });
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
        if self.ready.is_empty() {
            let ns = until.saturating_sub(self.now());
            let result = if self.in_flight == 0 {
                // Nothing to wait for but the time.
                let _ = self.ring.submit();
                if ns > 0 && ns < u64::MAX {
                    std::thread::sleep(std::time::Duration::from_nanos(ns));
                }
                Ok(0)
            } else if ns == 0 {
                self.ring.submit()
            } else {
                let ns = ns.min(3_600 * 1_000_000_000);
                let ts = types::Timespec::new()
                    .sec(ns / 1_000_000_000)
                    .nsec((ns % 1_000_000_000) as u32);
                self.ring
                    .submitter()
                    .submit_with_args(1, &types::SubmitArgs::new().timespec(&ts))
            };
            if let Err(e) = result
                && !matches!(
                    e.raw_os_error(),
                    Some(libc::ETIME) | Some(libc::EINTR) | Some(libc::EBUSY)
                )
            {
                self.fail(format!("io_uring: {e}"));
            }
        }
        self.reap();
    }

    fn failure(&self) -> Option<String> {
        self.failure.lock().expect("failure lock").clone()
    }
}

impl DeviceModel for RingDevice {
    fn submit(&mut self, request: &Request, now: Nanos) -> Submitted {
        let end = request.offset + u64::from(request.len);
        let kind = match request.op {
            Op::Read => CommandKind::Read,
            Op::Write if self.writable => CommandKind::Write {
                data: self.pattern(request.len as usize),
                fua: false,
            },
            Op::Write => {
                self.fail("a write to a target opened for reading".into());
                CommandKind::Read
            }
            Op::Flush => CommandKind::Flush,
            Op::Trim => CommandKind::Trim { fua: false },
        };
        if end > self.capacity
            || !request.offset.is_multiple_of(ALIGN)
            || !u64::from(request.len).is_multiple_of(ALIGN)
        {
            self.fail(format!(
                "a request of {} bytes at {} is past the target's {} bytes or not \
                 {ALIGN}-aligned",
                request.len, request.offset, self.capacity
            ));
        }
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
            ring: IoUring::new(256).expect("a second io_uring"),
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
            pattern: self.pattern.clone(),
        })
    }

    fn wall(&mut self) -> Option<&mut dyn Wall> {
        Some(self)
    }
}

impl Drop for RingDevice {
    fn drop(&mut self) {
        // The kernel may still write into buffers the slots own: wait for everything.
        while self.in_flight > 0 {
            if self.ring.submit_and_wait(1).is_err() {
                break;
            }
            self.reap();
        }
    }
}

#[cfg(test)]
mod tests;
