//! Where a file holds data and where holes: the `base:allocation` metadata context of
//! the NBD protocol ("Metadata querying"), answered from `lseek(SEEK_DATA)` and
//! `lseek(SEEK_HOLE)` as nbdkit's file plugin and qemu-nbd answer it. A hole reads as
//! zeroes (`STATE_HOLE | STATE_ZERO`); data is reported as data (0), zeroes written
//! into it included. A file system that cannot tell (`EINVAL`, `ENOTSUP`) reports the
//! whole range as data, which is always true.

#![allow(unsafe_code)]

use crate::nbd::proto::{STATE_HOLE, STATE_ZERO};
use std::os::fd::RawFd;

/// The most extents one block status walks (and answers): the protocol lets a reply
/// cover less than the range asked for (the client asks again from where it ends), so
/// the work of one request is bounded however fragmented the file (the codec's reply
/// room holds [`crate::nbd::proto::MAX_EXTENTS`]).
pub const MAX_WALK: usize = 64;

/// The extents of `len` bytes of `fd` from `at`, at most `max` of them (`max` ≥ 1), as
/// (length, state flags) with neighbours of the same state merged; they cover the range
/// from its start, the whole of it unless `max` cut it short. `Err(errno)` when the
/// file could not be looked at.
pub fn allocation(fd: RawFd, at: u64, len: u32, max: usize) -> Result<Vec<(u32, u32)>, i32> {
    assert!(max >= 1, "at least one extent");
    let end = at + u64::from(len);
    let mut out: Vec<(u32, u32)> = Vec::new();
    let mut pos = at;
    let push = |out: &mut Vec<(u32, u32)>, n: u64, flags: u32| match out.last_mut() {
        Some(last) if last.1 == flags => last.0 += n as u32,
        _ => out.push((n as u32, flags)),
    };
    while pos < end && (out.len() < max || out.last().is_some()) {
        let data = seek(fd, pos, libc::SEEK_DATA);
        let (n, flags) = match data {
            // No data from here to the end of the file: a hole.
            Err(libc::ENXIO) => (end - pos, STATE_HOLE | STATE_ZERO),
            Err(e) if e == libc::EINVAL || e == libc::ENOTSUP || e == libc::EOPNOTSUPP => {
                (end - pos, 0)
            }
            Err(e) => return Err(e),
            Ok(d) if d > pos => (d.min(end) - pos, STATE_HOLE | STATE_ZERO),
            Ok(_) => {
                let hole = seek(fd, pos, libc::SEEK_HOLE).unwrap_or(end);
                (hole.min(end).max(pos + 1) - pos, 0)
            }
        };
        let merges = out.last().is_some_and(|l| l.1 == flags);
        if !merges && out.len() == max {
            break;
        }
        push(&mut out, n, flags);
        pos += n;
    }
    Ok(out)
}

fn seek(fd: RawFd, pos: u64, whence: libc::c_int) -> Result<u64, i32> {
    // SAFETY: lseek on a descriptor the caller owns; it only moves the file offset,
    // which this server never reads or writes by (its I/O is positioned).
    let r = unsafe { libc::lseek(fd, pos as libc::off_t, whence) };
    if r < 0 {
        Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO))
    } else {
        Ok(r as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Seek, SeekFrom, Write};
    use std::os::fd::AsRawFd;

    #[test]
    fn holes_and_data_of_a_sparse_file() {
        // On the target directory's file system (tmpfs and ext4 both know holes).
        let mut f = tempfile::tempfile_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        f.set_len(16 << 20).unwrap();
        f.seek(SeekFrom::Start(4 << 20)).unwrap();
        f.write_all(&vec![7u8; 1 << 20]).unwrap();
        f.sync_all().unwrap();
        let fd = f.as_raw_fd();
        let e = allocation(fd, 0, 16 << 20, 64).unwrap();
        let hole = STATE_HOLE | STATE_ZERO;
        if e == vec![(16 << 20, 0)] {
            // A file system that does not report holes: all data, which is true.
            return;
        }
        assert_eq!(e, vec![(4 << 20, hole), (1 << 20, 0), (11 << 20, hole)]);
        // From inside the data, and cut to one extent.
        assert_eq!(
            allocation(fd, (4 << 20) + 4096, 8192, 64).unwrap(),
            vec![(8192, 0)]
        );
        assert_eq!(
            allocation(fd, 0, 16 << 20, 1).unwrap(),
            vec![(4 << 20, hole)]
        );
        // The whole covered, summing to the length asked.
        let e = allocation(fd, 1 << 20, 8 << 20, 64).unwrap();
        assert_eq!(e.iter().map(|x| u64::from(x.0)).sum::<u64>(), 8 << 20);
    }

    #[test]
    fn a_bad_descriptor_is_an_error() {
        assert_eq!(allocation(-1, 0, 4096, 4), Err(libc::EBADF));
    }
}
