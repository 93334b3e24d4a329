//! The file backend's side of a request: opening the tenants' images (or regions of one
//! shared file or block device), and each request's I/O as a small state machine —
//! which ring entry comes next, and what a completion means (a short transfer goes
//! again, an unsupported trim is advisory, zeroing falls back to writing zeroes, FUA
//! adds a sync). No ring and no clock here: the engine submits what
//! [`Transfer::entry`] builds and feeds [`Transfer::step`] what the ring returns, so the
//! state machine is tested without I/O.
//!
//! With `cache = "none"` aligned requests use an `O_DIRECT` descriptor and aligned
//! buffers; unaligned ones go through a second, buffered descriptor of the same file
//! (Linux writes back and invalidates the page cache around direct I/O, so both views
//! stay coherent) instead of a read-modify-write that would have to lock block ranges.
//!
//! With `cache = "pdc"` (Kim & Lee's PDC, `specs/pdc.md`) everything goes through the
//! page cache as with `writeback`, except writes the engine's journal detector marks as
//! journal: aligned ones go through the `O_DIRECT` descriptor, unaligned ones through
//! the page cache, and after either the range gets `POSIX_FADV_DONTNEED`, as the paper
//! does. For a direct write the kernel has already written back and dropped the cached
//! pages it overlaps, so the advice is belt and braces (it cost no measurable latency:
//! an A/B in an earlier form of `bench/pdc.sh`'s main setting, reads throttled to
//! 1,000 a second, two 20 s windows each, gave the mail guests an fsync p50 of 530 µs
//! with it and 602 µs without; `docs/benchmarks.md`); for a buffered one it only starts writeback (dirty
//! pages are not dropped), so unaligned journal writes stay cached until written back
//! and are not counted as bypassed. The direct descriptor is opened with
//! `POSIX_FADV_NOREUSE`, the paper's hint; Linux ignores it for `O_DIRECT` I/O, which
//! never caches.
//! Flush and FUA mean what they mean in the other modes: a flush is an `fdatasync` of
//! the file, which covers both descriptors, and FUA is `RWF_DSYNC` on the write.

use super::config::{BackendKind, Cache, ServerConfig, Storage};
use crate::buffer::IoBuf;
use crate::nbd::CommandKind;
use crate::nbd::proto;
use crate::types::Op;
use io_uring::{opcode, types};
use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};

/// Alignment of `O_DIRECT` requests and buffers (covers 512 and 4096-byte sectors).
pub const DIRECT_ALIGN: u64 = 4096;

/// Where a tenant's requests go.
#[derive(Debug, Clone, Copy)]
pub struct Target {
    /// The descriptor through the page cache (always there).
    pub buffered: RawFd,
    /// The `O_DIRECT` descriptor of the same file (`cache = "none"` or `"pdc"`).
    pub direct: Option<RawFd>,
    /// Where the tenant's export starts in the file.
    pub base: u64,
    /// The tenant's cache mode.
    pub cache: Cache,
}

/// The stage a request on the backend is in.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Stage {
    Transfer,
    /// Zeroing by writing zeroes (the file system cannot zero a range).
    ZeroWrite,
    /// The `fdatasync` after a FUA trim or zeroing.
    Sync,
    /// `POSIX_FADV_DONTNEED` on a journal write's range (`cache = "pdc"`).
    Drop,
}

/// One request's I/O on the backend.
#[derive(Debug)]
pub struct Transfer {
    kind: CommandKind,
    offset: u64,
    len: u32,
    /// A read's data, or the zeroes a zeroing write writes.
    buf: Option<IoBuf>,
    /// Bytes moved so far in this stage.
    done: u32,
    stage: Stage,
    direct: bool,
    /// The journal detector found the write in a journal group (`cache = "pdc"`).
    journal: bool,
}

/// The most zeroes written at once where the file system cannot zero a range.
const ZERO_CHUNK: usize = 1 << 20;

/// What comes after a completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a transfer goes again or is done: dropping this loses the request"]
pub enum Next {
    /// Submit [`Transfer::entry`] again (the rest of a short transfer, or the next stage).
    Again,
    /// The request is over; the reply carries this NBD error value (0: success).
    Done(u32),
    /// A read met the end of its file before its end: the image is shorter than when
    /// it was opened (truncated while served). The reply is `EIO`, not zeroes the guest
    /// would take for its data; the server says so in its log.
    PastEnd,
}

/// Opens every tenant's storage as the configuration says.
pub struct Files {
    files: Vec<File>,
    targets: Vec<Option<Target>>,
}

impl Files {
    /// Where tenant `t`'s requests go (`None`: the null backend).
    pub fn target(&self, t: usize) -> Option<Target> {
        self.targets[t]
    }

    /// Flushes every file's data to stable storage (at shutdown); the first error.
    pub fn sync_all(&self) -> std::io::Result<()> {
        for f in &self.files {
            f.sync_data()?;
        }
        Ok(())
    }

    /// Opens every file the configuration names (creating the shared file, and images
    /// whose tenant says `create = true`, when missing).
    pub fn open(config: &ServerConfig) -> anyhow::Result<Files> {
        let mut files = Vec::new();
        let mut targets = Vec::new();
        // `cache` needs a direct descriptor; with pdc it carries POSIX_FADV_NOREUSE.
        let mut open_pair = |path: &std::path::Path,
                             size: u64,
                             create: bool,
                             cache: Cache|
         -> anyhow::Result<(RawFd, Option<RawFd>)> {
            let f = open_sized(path, size, create)?;
            let buffered = f.as_raw_fd();
            files.push(f);
            let d = if cache.direct() {
                let f = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .custom_flags(libc::O_DIRECT)
                    .open(path)
                    .map_err(|e| {
                        anyhow::anyhow!(
                            "{}: cache = \"{}\" needs O_DIRECT, which failed: {e} (tmpfs, for one, has no O_DIRECT; use cache = \"writeback\")",
                            path.display(),
                            cache.name()
                        )
                    })?;
                let fd = f.as_raw_fd();
                if cache == Cache::Pdc {
                    // SAFETY: plain syscall on a descriptor we own. Advice: its failure
                    // changes nothing the server promises.
                    unsafe { libc::posix_fadvise(fd, 0, 0, libc::POSIX_FADV_NOREUSE) };
                }
                files.push(f);
                Some(fd)
            } else {
                None
            };
            Ok((buffered, d))
        };
        let shared = match (&config.shared, config.backend) {
            (Some((path, size)), BackendKind::File | BackendKind::Emulated) => {
                let regions = config
                    .tenants
                    .iter()
                    .filter(|t| matches!(t.storage, Storage::Region { .. }));
                let need = regions
                    .clone()
                    .filter_map(|t| match t.storage {
                        Storage::Region { offset } => Some(offset + t.size),
                        _ => None,
                    })
                    .max()
                    .unwrap_or(0)
                    .max(size.unwrap_or(0));
                // One direct descriptor serves every region that needs one.
                let cache = regions
                    .map(|t| t.cache)
                    .max_by_key(|c| match c {
                        Cache::Writeback => 0,
                        Cache::None => 1,
                        Cache::Pdc => 2,
                    })
                    .unwrap_or(config.cache);
                // The shared file (or the emulated device's) is created when missing.
                Some(open_pair(path, need, true, cache)?)
            }
            _ => None,
        };
        for t in &config.tenants {
            targets.push(match &t.storage {
                Storage::Nothing => None,
                Storage::Own(path) => {
                    let (buffered, direct) = open_pair(path, t.size, t.create, t.cache)?;
                    Some(Target {
                        buffered,
                        direct,
                        base: 0,
                        cache: t.cache,
                    })
                }
                Storage::Region { offset } => {
                    let (buffered, direct) = shared.expect("checked by the config");
                    Some(Target {
                        buffered,
                        direct,
                        base: *offset,
                        cache: t.cache,
                    })
                }
            });
        }
        Ok(Files { files, targets })
    }
}

/// Opens (with `create`, creating a sparse file readable by its owner only when missing;
/// without, a missing file is an error naming the setting), locks it
/// for this server alone and makes sure it holds `size` bytes: a regular file smaller
/// than that is grown, a block device must be large enough.
/// Who holds an `flock` on the file `meta` describes, from `/proc/locks`: its pid and
/// command line (an ioshare server names its configuration there), cut to a line.
fn lock_holder(meta: &std::fs::Metadata) -> Option<String> {
    use std::os::unix::fs::MetadataExt as _;
    let dev = meta.dev();
    // The kernel's encoding of a device number (glibc's `major`/`minor`).
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    let id = format!("{major:02x}:{minor:02x}:{}", meta.ino());
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    let pid = locks.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        // "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF"
        (f.get(1) == Some(&"FLOCK") && f.get(5) == Some(&id.as_str())).then(|| f[4].to_string())
    })?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let words = cmdline
        .split(|&b| b == 0)
        .filter(|a| !a.is_empty())
        .collect::<Vec<_>>()
        .join(&b' ');
    let command: String = words.escape_ascii().to_string().chars().take(300).collect();
    Some(if command.is_empty() {
        format!("process {pid}")
    } else {
        format!("process {pid} ({command})")
    })
}

fn open_sized(path: &std::path::Path, size: u64, create: bool) -> anyhow::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(create)
        .truncate(false)
        .mode(0o600)
        .open(path)
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound && !create {
                anyhow::anyhow!(
                    "{}: no such image; set create = true on the tenant to create it (a missing image is not served as a blank disk)",
                    path.display()
                )
            } else {
                anyhow::anyhow!("{}: cannot open: {e}", path.display())
            }
        })?;
    // An advisory lock: a second server on the same image would overwrite this one's
    // data under its guests.
    // SAFETY: plain syscall on a descriptor we own.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = std::io::Error::last_os_error();
        let holder = f
            .metadata()
            .ok()
            .and_then(|m| lock_holder(&m))
            .unwrap_or_else(|| "another process".into());
        anyhow::bail!(
            "{}: cannot lock it for this server ({e}): {holder} holds it",
            path.display()
        );
    }
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

impl Transfer {
    /// A request's I/O, `offset` and `len` inside its export.
    pub fn new(kind: CommandKind, offset: u64, len: u32) -> Self {
        Transfer {
            kind,
            offset,
            len,
            buf: None,
            done: 0,
            stage: Stage::Transfer,
            direct: false,
            journal: false,
        }
    }

    /// Marks a write as the guest's journal: under `cache = "pdc"` it bypasses the
    /// page cache.
    pub fn set_journal(&mut self) {
        debug_assert!(matches!(self.kind, CommandKind::Write { .. }));
        self.journal = true;
    }

    /// Whether the write was marked as journal.
    pub fn journal(&self) -> bool {
        self.journal
    }

    /// The operation as the policy sees it.
    pub fn op(&self) -> Op {
        match self.kind {
            CommandKind::Read => Op::Read,
            CommandKind::Write { .. } | CommandKind::WriteZeroes { .. } => Op::Write,
            CommandKind::Flush => Op::Flush,
            CommandKind::Trim { .. } => Op::Trim,
        }
    }

    /// Byte offset inside the export.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Length in bytes.
    pub fn len(&self) -> u32 {
        self.len
    }

    /// Whether the request moves no bytes (a flush).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the data goes through the `O_DIRECT` descriptor (decided by the first
    /// [`Transfer::entry`]).
    pub fn direct(&self) -> bool {
        self.direct
    }

    /// A write's payload back, once it is done (to write again; `None` for other
    /// requests).
    pub fn into_write_data(self) -> Option<IoBuf> {
        match self.kind {
            CommandKind::Write { data, .. } => Some(data),
            _ => None,
        }
    }

    /// What a read brought, once it is done (`None` for other requests).
    pub fn into_read_data(self) -> Option<IoBuf> {
        match self.kind {
            CommandKind::Read => self.buf,
            _ => None,
        }
    }

    /// The next part of the request as a ring entry (without its `user_data`). The
    /// buffers it points to live in `self`, which must stay in place until the entry's
    /// completion has been handed to [`Transfer::step`].
    pub fn entry(&mut self, target: Target) -> io_uring::squeue::Entry {
        let len = self.len;
        if self.buf.is_none() && self.stage == Stage::Transfer {
            let aligned = self.offset.is_multiple_of(DIRECT_ALIGN)
                && target.base.is_multiple_of(DIRECT_ALIGN)
                && (len as u64).is_multiple_of(DIRECT_ALIGN);
            let wanted = match target.cache {
                Cache::None => true,
                Cache::Pdc => self.journal,
                Cache::Writeback => false,
            };
            self.direct = wanted && target.direct.is_some() && aligned;
            // Only pdc marks requests as journal.
            self.journal &= target.cache == Cache::Pdc;
            // Buffers are aligned, so a write goes out from its payload as received.
            if matches!(self.kind, CommandKind::Read) {
                self.buf = Some(IoBuf::for_overwrite(len as usize));
            }
        }
        let fd = types::Fd(if self.direct {
            target.direct.expect("direct")
        } else {
            target.buffered
        });
        let at = target.base + self.offset + self.done as u64;
        let rest = len - self.done;
        let done = self.done as usize;
        let dsync = |fua: bool| if fua { libc::RWF_DSYNC } else { 0 };
        match (&self.stage, &self.kind) {
            (Stage::Drop, _) => opcode::Fadvise::new(
                types::Fd(target.buffered),
                len as libc::off_t,
                libc::POSIX_FADV_DONTNEED,
            )
            .offset(target.base + self.offset)
            .build(),
            (Stage::Sync, _) | (Stage::Transfer, CommandKind::Flush) => {
                opcode::Fsync::new(types::Fd(target.buffered))
                    .flags(types::FsyncFlags::DATASYNC)
                    .build()
            }
            (Stage::Transfer, CommandKind::Read) => {
                let buf = self.buf.as_mut().expect("read buffer");
                let ptr = buf[done..].as_mut_ptr();
                opcode::Read::new(fd, ptr, rest).offset(at).build()
            }
            (Stage::Transfer, CommandKind::Write { data, fua }) => {
                let ptr = data[done..].as_ptr();
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
                // A zeroing request may cover 4 GiB: zeroes go out a chunk at a time
                // from one buffer, not from one the request's size.
                let buf = self
                    .buf
                    .get_or_insert_with(|| IoBuf::zeroed((len as usize).min(ZERO_CHUNK)));
                let ptr = buf.as_ptr();
                let rest = rest.min(buf.len() as u32);
                opcode::Write::new(types::Fd(target.buffered), ptr, rest)
                    .offset(at)
                    .rw_flags(dsync(*fua))
                    .build()
            }
            (Stage::ZeroWrite, _) => unreachable!("only zeroing writes zeroes"),
        }
    }

    /// What a completion (a CQE's result) means for the request: more to do, or its
    /// reply's NBD error value (0: success).
    pub fn step(&mut self, result: i32) -> Next {
        let len = self.len;
        let l = self;
        if result < 0 {
            let errno = -result;
            return match (&l.stage, &l.kind) {
                // The write is done; the advice is only advice.
                (Stage::Drop, _) => Next::Done(0),
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
        match (&l.stage, &l.kind) {
            (Stage::Sync | Stage::Drop, _) | (Stage::Transfer, CommandKind::Flush) => Next::Done(0),
            (Stage::Transfer, CommandKind::Read) => {
                if n == 0 {
                    // Images are at least their export's size when opened.
                    return Next::PastEnd;
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
                } else if l.journal && l.stage == Stage::Transfer {
                    l.stage = Stage::Drop;
                    Next::Again
                } else {
                    Next::Done(0)
                }
            }
            (Stage::Transfer, CommandKind::Trim { fua })
            | (Stage::Transfer, CommandKind::WriteZeroes { fua }) => after_range(l, *fua),
        }
    }

    /// The null backend: reads return zeroes, everything succeeds at once (the result
    /// a completion of the whole length would carry).
    pub fn null_result(&mut self) -> i32 {
        match self.kind {
            CommandKind::Read => {
                self.buf = Some(IoBuf::zeroed(self.len as usize));
                self.len as i32
            }
            CommandKind::Write { .. } => self.len as i32,
            _ => 0,
        }
    }
}

/// A trim or zeroing is done; with FUA it is followed by a sync.
fn after_range(l: &mut Transfer, fua: bool) -> Next {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A target whose descriptors are never used: building entries makes no system call.
    fn target(direct: bool, base: u64) -> Target {
        Target {
            buffered: 100,
            direct: direct.then_some(101),
            base,
            cache: if direct {
                Cache::None
            } else {
                Cache::Writeback
            },
        }
    }

    fn write(len: u32, fua: bool) -> CommandKind {
        CommandKind::Write {
            data: IoBuf::zeroed(len as usize),
            fua,
        }
    }

    #[test]
    fn a_short_read_goes_again_and_a_read_past_the_end_is_an_error() {
        let mut t = Transfer::new(CommandKind::Read, 0, 8192);
        let _ = t.entry(target(false, 0));
        assert_eq!(t.step(4096), Next::Again);
        let _ = t.entry(target(false, 0));
        // End of file after 4 KiB: the image shrank; no zeroes stand in for data.
        assert_eq!(t.step(0), Next::PastEnd);
    }

    #[test]
    fn writes_go_again_until_done_and_a_zero_write_is_an_error() {
        let mut t = Transfer::new(write(8192, false), 4096, 8192);
        let _ = t.entry(target(false, 0));
        assert_eq!(t.step(1000), Next::Again);
        assert_eq!(t.step(7192), Next::Done(0));
        let mut t = Transfer::new(write(4096, false), 0, 4096);
        let _ = t.entry(target(false, 0));
        assert_eq!(t.step(0), Next::Done(proto::EIO));
        assert!(t.into_read_data().is_none(), "a write returns no data");
    }

    #[test]
    fn errors_become_the_nbd_values_the_protocol_has() {
        for (errno, want) in [
            (libc::ENOSPC, proto::ENOSPC),
            (libc::EDQUOT, proto::ENOSPC),
            (libc::EROFS, proto::EPERM),
            (libc::EIO, proto::EIO),
            (libc::ENOMEM, proto::ENOMEM),
            (libc::EOVERFLOW, proto::EOVERFLOW),
            (libc::EBADF, proto::EIO),
        ] {
            let mut t = Transfer::new(write(4096, false), 0, 4096);
            let _ = t.entry(target(false, 0));
            assert_eq!(t.step(-errno), Next::Done(want), "errno {errno}");
        }
    }

    #[test]
    fn trim_is_advisory_and_fua_adds_a_sync() {
        let mut t = Transfer::new(CommandKind::Trim { fua: false }, 0, 1 << 20);
        let _ = t.entry(target(false, 0));
        assert_eq!(t.step(-libc::EOPNOTSUPP), Next::Done(0));
        let mut t = Transfer::new(CommandKind::Trim { fua: true }, 0, 1 << 20);
        let _ = t.entry(target(false, 0));
        assert_eq!(t.step(0), Next::Again, "the sync comes next");
        let _ = t.entry(target(false, 0));
        assert_eq!(t.step(0), Next::Done(0));
        let mut t = Transfer::new(CommandKind::Trim { fua: false }, 0, 4096);
        let _ = t.entry(target(false, 0));
        assert_eq!(t.step(-libc::EIO), Next::Done(proto::EIO));
    }

    #[test]
    fn zeroing_falls_back_to_writing_zeroes() {
        let mut t = Transfer::new(CommandKind::WriteZeroes { fua: true }, 0, 8192);
        let _ = t.entry(target(false, 0));
        assert_eq!(t.step(-libc::EOPNOTSUPP), Next::Again);
        let _ = t.entry(target(false, 0));
        // FUA rides on the write itself (RWF_DSYNC): no separate sync.
        assert_eq!(t.step(4096), Next::Again, "a short write goes again");
        let _ = t.entry(target(false, 0));
        assert_eq!(t.step(4096), Next::Done(0));
        // 3 GiB of zeroes: written a megabyte at a time from one 1 MiB buffer.
        let len = 3u32 << 30;
        let mut t = Transfer::new(CommandKind::WriteZeroes { fua: false }, 0, len);
        let _ = t.entry(target(false, 0));
        assert_eq!(t.step(-libc::EOPNOTSUPP), Next::Again);
        let _ = t.entry(target(false, 0));
        assert_eq!(t.buf.as_ref().map(|b| b.len()), Some(ZERO_CHUNK));
        let chunks = len as usize / ZERO_CHUNK;
        for i in 0..chunks {
            let next = t.step(ZERO_CHUNK as i32);
            if i + 1 < chunks {
                assert_eq!(next, Next::Again);
                let _ = t.entry(target(false, 0));
            } else {
                assert_eq!(next, Next::Done(0));
            }
        }
    }

    #[test]
    fn only_aligned_requests_go_direct() {
        for (offset, len, base, direct, want) in [
            (4096, 8192, 0, true, true),
            (512, 4096, 0, true, false),
            (0, 1000, 0, true, false),
            (0, 4096, 512, true, false),
            (0, 4096, 0, false, false),
        ] {
            let mut t = Transfer::new(CommandKind::Read, offset, len);
            let _ = t.entry(target(direct, base));
            assert_eq!(
                t.direct(),
                want,
                "{offset}+{len} at {base}, direct fd {direct}"
            );
        }
    }

    /// pdc: data goes through the page cache; a journal write goes direct when aligned,
    /// buffered when not, and either way ends with DONTNEED on its range, whose failure
    /// does not fail the write.
    #[test]
    fn pdc_sends_journal_writes_past_the_cache_and_drops_their_range() {
        let pdc = Target {
            buffered: 100,
            direct: Some(101),
            base: 1 << 20,
            cache: Cache::Pdc,
        };
        let mut data = Transfer::new(write(8192, false), 4096, 8192);
        let _ = data.entry(pdc);
        assert!(!data.direct() && !data.journal());
        assert_eq!(data.step(8192), Next::Done(0), "no advice for data");
        let mut read = Transfer::new(CommandKind::Read, 4096, 4096);
        let _ = read.entry(pdc);
        assert!(!read.direct(), "reads stay cached");
        for (offset, len, direct) in [(4096, 8192, true), (512, 4096, false)] {
            for advice in [0, -libc::EINVAL] {
                let mut j = Transfer::new(write(len, true), offset, len);
                j.set_journal();
                let e = j.entry(pdc);
                assert_eq!(j.direct(), direct, "{offset}+{len}");
                assert_eq!(e.get_opcode(), u32::from(opcode::Write::CODE));
                assert_eq!(j.step(len as i32), Next::Again, "the advice comes next");
                let e = j.entry(pdc);
                assert_eq!(e.get_opcode(), u32::from(opcode::Fadvise::CODE));
                assert_eq!(j.step(advice), Next::Done(0));
            }
        }
        // A journal mark means nothing outside pdc.
        let mut j = Transfer::new(write(4096, false), 0, 4096);
        j.set_journal();
        let _ = j.entry(target(false, 0));
        assert!(!j.journal());
        assert_eq!(j.step(4096), Next::Done(0));
    }

    #[test]
    fn the_null_backend_reads_zeroes_and_completes_everything() {
        let mut t = Transfer::new(CommandKind::Read, 0, 4096);
        assert_eq!(t.null_result(), 4096);
        assert_eq!(t.step(4096), Next::Done(0));
        assert!(t.into_read_data().unwrap().iter().all(|&b| b == 0));
        let mut t = Transfer::new(CommandKind::Flush, 0, 0);
        assert_eq!(t.null_result(), 0);
        assert_eq!(t.step(0), Next::Done(0));
        assert_eq!(Transfer::new(write(512, false), 0, 512).null_result(), 512);
    }

    #[test]
    fn images_are_created_sparse_and_grown_never_shrunk() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("big.img"), vec![7u8; 3 << 20]).unwrap();
        let text = "[backend]\npath = 'shared.img'\nsize = '1m'\n\
                    [[tenant]]\nname = 'new'\nfile = 'new.img'\ncreate = true\nsize = '2m'\n\
                    [[tenant]]\nname = 'big'\nfile = 'big.img'\nsize = '1m'\n\
                    [[tenant]]\nname = 'r'\noffset = '4m'\nsize = '1m'\n";
        let config = ServerConfig::parse(text, dir.path()).unwrap();
        let files = Files::open(&config).unwrap();
        let len = |name: &str| std::fs::metadata(dir.path().join(name)).unwrap().len();
        assert_eq!(len("new.img"), 2 << 20);
        assert_eq!(len("big.img"), 3 << 20, "a larger image is kept whole");
        assert_eq!(
            len("shared.img"),
            5 << 20,
            "the shared file holds every region"
        );
        assert_eq!(files.target(2).unwrap().base, 4 << 20);
        assert!(
            files.target(0).unwrap().direct.is_none(),
            "writeback: no O_DIRECT"
        );
        files.sync_all().unwrap();
    }
}
