//! One request's I/O on a file or block device as a small state machine — which ring
//! entry comes next, and what a completion means (a short transfer goes again, an
//! unsupported trim is advisory, zeroing falls back to writing zeroes, FUA adds a sync,
//! a journal write under PDC drops its range from the page cache). No ring and no clock
//! here: a driver submits what [`Transfer::entry`] builds and feeds [`Transfer::step`]
//! what the ring returns, so the state machine is tested without I/O. The live server's
//! engine and `target/`'s ring device both drive it (the cache modes are described in
//! `server::backend`).

use crate::buffer::IoBuf;
use crate::nbd::CommandKind;
use crate::nbd::proto;
use crate::types::Op;
use io_uring::{opcode, types};
use std::os::fd::RawFd;

/// How a tenant's requests use the host's page cache (`backend.cache`, per tenant
/// `cache`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cache {
    /// `O_DIRECT`: requests go to the device, no host caching.
    None,
    /// The page cache: writes are durable after a flush or with FUA.
    Writeback,
    /// The page cache for everything but the guest file system's journal: writes the
    /// journal detector ([`crate::journal`]) finds in a journal group go `O_DIRECT`, and
    /// their range is dropped from the page cache (Kim & Lee's PDC).
    Pdc,
}

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

/// One operation on a target's file, as a driver performs it: the ring ([`Transfer::entry`])
/// or a simulated disk. Its result is what a completion carries: bytes moved, or a
/// negative errno.
#[derive(Debug)]
pub enum FileOp<'a> {
    /// `pread` into `buf`.
    Read {
        /// The descriptor.
        fd: RawFd,
        /// Byte offset in the file.
        at: u64,
        /// Where the data goes.
        buf: &'a mut [u8],
    },
    /// `pwrite` of `data` (with `RWF_DSYNC` when `dsync`).
    Write {
        /// The descriptor.
        fd: RawFd,
        /// Byte offset in the file.
        at: u64,
        /// What is written.
        data: &'a [u8],
        /// The write is durable when it returns (FUA).
        dsync: bool,
    },
    /// `fdatasync`: what was written is durable when it returns.
    Sync {
        /// The descriptor.
        fd: RawFd,
    },
    /// `POSIX_FADV_DONTNEED` on a range (a journal write under `cache = "pdc"`).
    DropCache {
        /// The descriptor.
        fd: RawFd,
        /// Byte offset in the file.
        at: u64,
        /// Bytes.
        len: u32,
    },
    /// `fallocate(PUNCH_HOLE | KEEP_SIZE)` (a trim).
    PunchHole {
        /// The descriptor.
        fd: RawFd,
        /// Byte offset in the file.
        at: u64,
        /// Bytes.
        len: u32,
    },
    /// `fallocate(ZERO_RANGE | KEEP_SIZE)` (write zeroes).
    ZeroRange {
        /// The descriptor.
        fd: RawFd,
        /// Byte offset in the file.
        at: u64,
        /// Bytes.
        len: u32,
    },
}

/// The next part of a request, wherever it goes: a file ([`FileOp`] adds the descriptor)
/// or another store (an RBD image). Its result is what a completion carries: bytes
/// moved, or a negative errno.
#[derive(Debug)]
pub enum Part<'a> {
    /// Read into `buf`.
    Read {
        /// Byte offset in the store.
        at: u64,
        /// Where the data goes.
        buf: &'a mut [u8],
    },
    /// Write `data` (durable when done with `fua`).
    Write {
        /// Byte offset in the store.
        at: u64,
        /// What is written.
        data: &'a [u8],
        /// The write is durable when it returns.
        fua: bool,
    },
    /// Write zeroes by writing them, where the store cannot zero a range.
    ZeroWrite {
        /// Byte offset in the store.
        at: u64,
        /// Zeroes.
        data: &'a [u8],
        /// The write is durable when it returns.
        fua: bool,
    },
    /// Make what was written durable.
    Flush,
    /// Drop the range from the host's page cache (a journal write under `cache = "pdc"`).
    DropCache {
        /// Byte offset in the store.
        at: u64,
        /// Bytes.
        len: u32,
    },
    /// Discard a range (a trim).
    Discard {
        /// Byte offset in the store.
        at: u64,
        /// Bytes.
        len: u32,
    },
    /// Zero a range without writing its zeroes.
    WriteZeroes {
        /// Byte offset in the store.
        at: u64,
        /// Bytes.
        len: u32,
    },
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

    /// What the file operation at this stage is, for messages: `read`, `write`,
    /// `write-zeroes`, `trim`, `flush`, `zeroing write` (zeroes written where the file
    /// system cannot zero a range), `sync` (after a FUA trim or zeroing) or `advice`.
    pub fn what(&self) -> &'static str {
        match (&self.stage, &self.kind) {
            (Stage::ZeroWrite, _) => "zeroing write",
            (Stage::Sync, _) => "sync",
            (Stage::Drop, _) => "advice",
            (Stage::Transfer, CommandKind::Read) => "read",
            (Stage::Transfer, CommandKind::Write { .. }) => "write",
            (Stage::Transfer, CommandKind::WriteZeroes { .. }) => "write-zeroes",
            (Stage::Transfer, CommandKind::Trim { .. }) => "trim",
            (Stage::Transfer, CommandKind::Flush) => "flush",
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

    /// The next part of the request as an operation on the target's files. The buffers
    /// it lends live in `self`, which must stay in place until the operation's result
    /// has been handed to [`Transfer::step`].
    pub fn next_op(&mut self, target: Target) -> FileOp<'_> {
        let buffered = target.buffered;
        let direct = self.choose_path(target.base, target.cache, target.direct.is_some());
        let fd = if direct {
            target.direct.expect("direct")
        } else {
            buffered
        };
        match self.next_part(target.base) {
            Part::Read { at, buf } => FileOp::Read { fd, at, buf },
            Part::Write { at, data, fua } => FileOp::Write {
                fd,
                at,
                data,
                dsync: fua,
            },
            // Zeroes go through the page cache: the chunk is not the request's alignment.
            Part::ZeroWrite { at, data, fua } => FileOp::Write {
                fd: buffered,
                at,
                data,
                dsync: fua,
            },
            Part::Flush => FileOp::Sync { fd: buffered },
            Part::DropCache { at, len } => FileOp::DropCache {
                fd: buffered,
                at,
                len,
            },
            Part::Discard { at, len } => FileOp::PunchHole {
                fd: buffered,
                at,
                len,
            },
            Part::WriteZeroes { at, len } => FileOp::ZeroRange {
                fd: buffered,
                at,
                len,
            },
        }
    }

    /// Decides, before the first part, whether the data goes through the `O_DIRECT`
    /// descriptor (`direct_fd`: the target has one); answers the decision (the same for
    /// every later part). [`Transfer::next_part`] then allocates a read's buffer.
    fn choose_path(&mut self, base: u64, cache: Cache, direct_fd: bool) -> bool {
        if self.buf.is_none() && self.stage == Stage::Transfer {
            let aligned = self.offset.is_multiple_of(DIRECT_ALIGN)
                && base.is_multiple_of(DIRECT_ALIGN)
                && (self.len as u64).is_multiple_of(DIRECT_ALIGN);
            let wanted = match cache {
                Cache::None => true,
                Cache::Pdc => self.journal,
                Cache::Writeback => false,
            };
            self.direct = wanted && direct_fd && aligned;
            // Only pdc marks requests as journal.
            self.journal &= cache == Cache::Pdc;
        }
        self.direct
    }

    /// The next part of the request on a store that is not a file (a block image
    /// such as RBD's): the same stages, short transfers and fallbacks as on a file, with
    /// the store's own offsets from `base`. Nothing goes through a host cache. The
    /// buffers it lends live in `self`, which must stay in place until the part's
    /// result has been handed to [`Transfer::step`].
    pub fn next_part(&mut self, base: u64) -> Part<'_> {
        // Buffers are aligned, so a write goes out from its payload as received; a
        // read's buffer is made before its first part.
        if self.buf.is_none()
            && self.stage == Stage::Transfer
            && matches!(self.kind, CommandKind::Read)
        {
            self.buf = Some(IoBuf::for_overwrite(self.len as usize));
        }
        let len = self.len;
        let at = base + self.offset + self.done as u64;
        let rest = len - self.done;
        let done = self.done as usize;
        match (&self.stage, &self.kind) {
            (Stage::Drop, _) => Part::DropCache {
                at: base + self.offset,
                len,
            },
            (Stage::Sync, _) | (Stage::Transfer, CommandKind::Flush) => Part::Flush,
            (Stage::Transfer, CommandKind::Read) => {
                let buf = self.buf.as_mut().expect("read buffer");
                Part::Read {
                    at,
                    buf: &mut buf[done..],
                }
            }
            (Stage::Transfer, CommandKind::Write { data, fua }) => Part::Write {
                at,
                data: &data[done..],
                fua: *fua,
            },
            (Stage::Transfer, CommandKind::Trim { .. }) => Part::Discard { at, len },
            (Stage::Transfer, CommandKind::WriteZeroes { .. }) => Part::WriteZeroes { at, len },
            (Stage::ZeroWrite, CommandKind::WriteZeroes { fua, .. }) => {
                // A zeroing request may cover 4 GiB: zeroes go out a chunk at a time
                // from one buffer, not from one the request's size.
                let buf = self
                    .buf
                    .get_or_insert_with(|| IoBuf::zeroed((len as usize).min(ZERO_CHUNK)));
                let rest = (rest as usize).min(buf.len());
                Part::ZeroWrite {
                    at,
                    data: &buf[..rest],
                    fua: *fua,
                }
            }
            (Stage::ZeroWrite, _) => unreachable!("only zeroing writes zeroes"),
        }
    }

    /// The next part of the request as a ring entry (without its `user_data`): the
    /// operation of [`Transfer::next_op`], under the same rule for its buffers.
    pub fn entry(&mut self, target: Target) -> io_uring::squeue::Entry {
        match self.next_op(target) {
            FileOp::Read { fd, at, buf } => {
                opcode::Read::new(types::Fd(fd), buf.as_mut_ptr(), buf.len() as u32)
                    .offset(at)
                    .build()
            }
            FileOp::Write {
                fd,
                at,
                data,
                dsync,
            } => opcode::Write::new(types::Fd(fd), data.as_ptr(), data.len() as u32)
                .offset(at)
                .rw_flags(if dsync { libc::RWF_DSYNC } else { 0 })
                .build(),
            FileOp::Sync { fd } => opcode::Fsync::new(types::Fd(fd))
                .flags(types::FsyncFlags::DATASYNC)
                .build(),
            FileOp::DropCache { fd, at, len } => {
                opcode::Fadvise::new(types::Fd(fd), len as libc::off_t, libc::POSIX_FADV_DONTNEED)
                    .offset(at)
                    .build()
            }
            FileOp::PunchHole { fd, at, len } => opcode::Fallocate::new(types::Fd(fd), len as u64)
                .offset(at)
                .mode(libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE)
                .build(),
            FileOp::ZeroRange { fd, at, len } => opcode::Fallocate::new(types::Fd(fd), len as u64)
                .offset(at)
                .mode(libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE)
                .build(),
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
                // A fast zero that the file system cannot do without writing fails at
                // once, as the client asked (it will write the zeroes itself, or not).
                (Stage::Transfer, CommandKind::WriteZeroes { fast: true, .. })
                    if is_unsupported(errno) =>
                {
                    Next::Done(proto::ENOTSUP)
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
            | (Stage::Transfer, CommandKind::WriteZeroes { fua, .. }) => after_range(l, *fua),
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
pub fn nbd_error(errno: i32) -> u32 {
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

    /// Write-zeroes of `len` bytes at 0.
    fn zeroes(fua: bool, fast: bool, len: u32) -> Transfer {
        Transfer::new(CommandKind::WriteZeroes { fua, fast }, 0, len)
    }

    #[test]
    fn a_fast_zero_the_file_system_cannot_do_fails_at_once() {
        let mut t = zeroes(false, true, 8192);
        let _ = t.entry(target(false, 0));
        assert_eq!(t.step(-libc::EOPNOTSUPP), Next::Done(proto::ENOTSUP));
        let mut t = zeroes(false, true, 8192);
        let _ = t.entry(target(false, 0));
        assert_eq!(t.step(0), Next::Done(0), "zeroed in place: done");
    }

    #[test]
    fn zeroing_falls_back_to_writing_zeroes() {
        let mut t = zeroes(true, false, 8192);
        let _ = t.entry(target(false, 0));
        assert_eq!(t.step(-libc::EOPNOTSUPP), Next::Again);
        let _ = t.entry(target(false, 0));
        // FUA rides on the write itself (RWF_DSYNC): no separate sync.
        assert_eq!(t.step(4096), Next::Again, "a short write goes again");
        let _ = t.entry(target(false, 0));
        assert_eq!(t.step(4096), Next::Done(0));
        // 3 GiB of zeroes: written a megabyte at a time from one 1 MiB buffer.
        let len = 3u32 << 30;
        let mut t = zeroes(false, false, len);
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
}
