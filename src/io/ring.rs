//! The io_uring ring both of the crate's ring drivers use (the live server's engine and
//! `target/`'s real-device model), with the rule they share: every entry put on the ring
//! is counted until its completion has been taken, and teardown waits for that count to
//! reach zero before any buffer an entry points to may be freed ([`Ring::settle`]);
//! when it cannot, the caller leaks its buffers rather than free them under the kernel.
//! Waiting with a timeout, and the errors a wait may return that are not failures
//! (`ETIME`, `EINTR`, `EBUSY`), are here once.

// Submissions point at buffers their owners keep (the contract of `Ring::push`).
#![allow(unsafe_code)]

use io_uring::{IoUring, squeue, types};
use std::time::{Duration, Instant};

/// A ring and the count of entries on it.
pub struct Ring {
    ring: IoUring,
    /// Task work waits for a wait on the ring (`IORING_SETUP_DEFER_TASKRUN`): a wait
    /// that must not block still has to ask for completions.
    deferred: bool,
    /// Entries pushed whose completions have not been taken.
    on_ring: u64,
}

impl Ring {
    /// A ring of `entries` submission entries with `entries * 8` completion entries
    /// (completions beyond the queue are kept by the kernel rather than dropped), which
    /// may be moved to another thread.
    pub fn new(entries: u32) -> std::io::Result<Ring> {
        let ring = IoUring::builder()
            .setup_cqsize(entries * 8)
            .build(entries)?;
        Ok(Ring {
            ring,
            deferred: false,
            on_ring: 0,
        })
    }

    /// [`Ring::new`] for a ring only the calling thread will ever submit to: on kernels
    /// that have them, single-issuer and deferred task running (the kernel's completion
    /// work for this ring waits for the thread's next wait on it, and is done in one
    /// batch there instead of interrupting it); cooperative task running before 6.1.
    pub fn for_this_thread(entries: u32) -> std::io::Result<Ring> {
        let deferred = IoUring::builder()
            .setup_cqsize(entries * 8)
            .setup_single_issuer()
            .setup_defer_taskrun()
            .build(entries);
        if let Ok(ring) = deferred {
            return Ok(Ring {
                ring,
                deferred: true,
                on_ring: 0,
            });
        }
        let tuned = IoUring::builder()
            .setup_cqsize(entries * 8)
            .setup_single_issuer()
            .setup_coop_taskrun()
            .build(entries);
        let ring = match tuned {
            Ok(ring) => ring,
            // Kernels before 6.0 lack the flags.
            Err(_) => IoUring::builder()
                .setup_cqsize(entries * 8)
                .build(entries)?,
        };
        Ok(Ring {
            ring,
            deferred: false,
            on_ring: 0,
        })
    }

    /// Whether the kernel can wait with a timeout (Linux 5.11 or later).
    pub fn waits_with_timeout(&self) -> bool {
        self.ring.params().is_feature_ext_arg()
    }

    /// Queues `entry` (submitting what is queued when the queue is full) and counts it
    /// until its completion is taken.
    ///
    /// # Safety
    /// Every buffer `entry` points to must stay in place, untouched by anyone but the
    /// kernel, until its completion has been taken with [`Ring::completions`] (or the
    /// ring settled, [`Ring::settle`]).
    pub unsafe fn push(&mut self, entry: &squeue::Entry) -> std::io::Result<()> {
        // SAFETY: the caller's contract.
        while unsafe { self.ring.submission().push(entry) }.is_err() {
            self.ring.submit()?;
        }
        self.on_ring += 1;
        Ok(())
    }

    /// Whether the kernel has deferred task running (Linux 6.1 or later), and with it
    /// everything the engine may ask of a receive (`IORING_RECVSEND_POLL_FIRST`, 5.19).
    pub fn is_deferred(&self) -> bool {
        self.deferred
    }

    /// Entries on the ring whose completions have not been taken.
    pub fn on_ring(&self) -> u64 {
        self.on_ring
    }

    /// Submits what is queued and waits for a completion or `timeout` (`None`: no
    /// limit; zero: no wait). A timeout, a signal or a busy ring is not an error.
    pub fn wait(&mut self, timeout: Option<Duration>) -> std::io::Result<()> {
        let submitted = match timeout {
            // Deferred task work runs only in a wait: one that times out at once.
            Some(t) if t.is_zero() && self.deferred => self.ring.submitter().submit_with_args(
                1,
                &types::SubmitArgs::new().timespec(&types::Timespec::new()),
            ),
            Some(t) if t.is_zero() => self.ring.submit(),
            Some(t) => {
                let ts = types::Timespec::new()
                    .sec(t.as_secs())
                    .nsec(t.subsec_nanos());
                self.ring
                    .submitter()
                    .submit_with_args(1, &types::SubmitArgs::new().timespec(&ts))
            }
            None => self.ring.submit_and_wait(1),
        };
        match submitted {
            Ok(_) => Ok(()),
            Err(e) if not_a_failure(&e) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Submits what is queued without waiting.
    pub fn submit(&mut self) -> std::io::Result<()> {
        self.wait(Some(Duration::ZERO))
    }

    /// Appends the completions waiting (`user_data`, result) to `out`.
    pub fn completions(&mut self, out: &mut Vec<(u64, i32)>) {
        let before = out.len();
        out.extend(self.ring.completion().map(|c| (c.user_data(), c.result())));
        self.on_ring = self
            .on_ring
            .checked_sub((out.len() - before) as u64)
            .expect("every completion is of an entry pushed on the ring");
    }

    /// Teardown: after `unblock` (which makes what may wait forever return: shut the
    /// sockets, wake the eventfd), waits up to `limit` for every entry on the ring to
    /// complete, dropping their completions. Returns whether it did; when not (the ring
    /// failed, or it took too long), the caller must leak every buffer an entry may
    /// point to. No panic here: it runs after one too.
    pub fn settle(&mut self, limit: Duration, unblock: impl FnOnce()) -> bool {
        if self.on_ring == 0 {
            return true;
        }
        unblock();
        let give_up = Instant::now() + limit;
        while self.on_ring > 0 && Instant::now() < give_up {
            if self.wait(Some(Duration::from_millis(100))).is_err() {
                break;
            }
            let taken = self.ring.completion().count() as u64;
            // A count off is treated as everything returned, which the check in
            // `completions` rules out while running.
            self.on_ring = self.on_ring.saturating_sub(taken);
        }
        self.on_ring == 0
    }
}

/// What a wait on the ring may return that is not a failure: its timeout, a signal, a
/// ring whose completion queue is full (the completions are taken next).
fn not_a_failure(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ETIME) | Some(libc::EINTR) | Some(libc::EBUSY)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use io_uring::opcode;

    #[test]
    fn entries_are_counted_until_their_completions_are_taken() {
        let mut ring = Ring::new(8).expect("io_uring");
        for id in 0..20u64 {
            // More than the queue holds: a full queue is submitted, not refused.
            // SAFETY: a no-op points at no buffer.
            unsafe { ring.push(&opcode::Nop::new().build().user_data(id)) }.unwrap();
        }
        assert_eq!(ring.on_ring(), 20);
        let mut done = Vec::new();
        while done.len() < 20 {
            ring.wait(Some(Duration::from_secs(1))).unwrap();
            ring.completions(&mut done);
        }
        assert_eq!(ring.on_ring(), 0);
        let mut ids: Vec<u64> = done.iter().map(|d| d.0).collect();
        ids.sort_unstable();
        assert_eq!(ids, (0..20).collect::<Vec<_>>());
        assert!(ring.settle(Duration::from_secs(1), || panic!("nothing to unblock")));
    }

    #[test]
    fn settle_waits_for_what_unblock_releases() {
        let mut ring = Ring::new(8).expect("io_uring");
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let mut buf = [0u8; 8];
        use std::os::fd::AsRawFd;
        let e = opcode::Recv::new(types::Fd(a.as_raw_fd()), buf.as_mut_ptr(), 8)
            .build()
            .user_data(1);
        // SAFETY: `buf` outlives the receive: settle waits for it below.
        unsafe { ring.push(&e) }.unwrap();
        ring.submit().unwrap();
        assert_eq!(ring.on_ring(), 1);
        let settled = ring.settle(Duration::from_secs(5), || {
            // SAFETY: plain syscall on a descriptor this test holds.
            unsafe { libc::shutdown(a.as_raw_fd(), libc::SHUT_RDWR) };
        });
        assert!(settled);
        assert_eq!(ring.on_ring(), 0);
        drop(b);
    }
}
