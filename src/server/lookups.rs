//! Block status lookups off the engine's threads. io_uring has no `lseek`, and a
//! `SEEK_DATA` walk can block: on a FUSE or network file system it waits on the daemon
//! or the server, on a fragmented file it walks extent after extent. Done on an engine
//! thread it stopped every tenant of that thread (measured: 0 requests completed for
//! 10–12 s while one tenant's image hung; docs/benchmarks.md, "Hostile clients"), so
//! the engine hands each lookup the policy dispatched to a small pool of threads of
//! its own and takes the extents back on its next turn.
//!
//! Bounded: [`WORKERS`] threads, at most [`MAX_QUEUED`] lookups waiting (past that, one
//! is answered at once with `EBUSY`, which the client gets as `EIO`), each walking at
//! most its ask's extents ([`crate::io::extents::MAX_WALK`]). A lookup carries the
//! backend timeout's deadline: one still waiting past it (the core has answered its
//! request `EIO` already) is dropped unwalked, so hung workers do not leave a queue of
//! dead work behind them. Each lookup holds its own descriptor (a duplicate), so a
//! worker stuck in a hung file system never reads through a descriptor closed or
//! reused after the engine stopped; workers are not waited for at shutdown.

use super::core::StatusAsk;
use std::collections::VecDeque;
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

/// Threads walking extents.
pub const WORKERS: usize = 2;
/// Lookups waiting for a worker at most.
pub const MAX_QUEUED: usize = 1024;

/// What a lookup answers: the extents, or an errno.
pub type Found = Result<Vec<(u32, u32)>, i32>;

/// One lookup to make.
struct Job {
    id: u64,
    fd: OwnedFd,
    ask: StatusAsk,
    /// Past this, nobody waits for the answer.
    deadline: Option<Instant>,
}

/// What the workers and the engine share.
#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    stop: bool,
}

/// The pool (see the module).
pub struct Lookups {
    queue: Arc<(Mutex<Queue>, Condvar)>,
    found: Arc<Mutex<Vec<(u64, Found)>>>,
}

impl Lookups {
    /// Starts the workers; each answer pokes `wake` (the engine shard that takes them).
    pub fn start(wake: Arc<File>) -> std::io::Result<Lookups> {
        let queue: Arc<(Mutex<Queue>, Condvar)> = Arc::default();
        let found: Arc<Mutex<Vec<(u64, Found)>>> = Arc::default();
        for n in 0..WORKERS {
            let (queue, found, wake) = (queue.clone(), found.clone(), wake.clone());
            std::thread::Builder::new()
                .name(format!("lookup-{n}"))
                .spawn(move || work(&queue, &found, &wake))?;
        }
        Ok(Lookups { queue, found })
    }

    /// Hands lookup `id` to the workers, to be answered by `deadline`; `Err(errno)`
    /// when it cannot be (its descriptor could not be duplicated, or the queue is full).
    pub fn submit(&self, id: u64, ask: StatusAsk, deadline: Option<Instant>) -> Result<(), i32> {
        // SAFETY: duplicating a descriptor the engine holds open; the copy is owned here.
        let fd = unsafe { libc::fcntl(ask.fd, libc::F_DUPFD_CLOEXEC, 0) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO));
        }
        // SAFETY: `fd` was just made and nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let (lock, ready) = &*self.queue;
        let mut q = lock.lock().expect("lookup queue");
        if q.jobs.len() >= MAX_QUEUED {
            return Err(libc::EBUSY);
        }
        q.jobs.push_back(Job {
            id,
            fd,
            ask,
            deadline,
        });
        ready.notify_one();
        Ok(())
    }

    /// The answers since the last call.
    pub fn take_found(&self) -> Vec<(u64, Found)> {
        std::mem::take(&mut *self.found.lock().expect("lookup answers"))
    }

    /// Lookups waiting for a worker now.
    #[cfg(test)]
    fn queued(&self) -> usize {
        self.queue.0.lock().expect("lookup queue").jobs.len()
    }
}

impl Drop for Lookups {
    fn drop(&mut self) {
        let (lock, ready) = &*self.queue;
        let mut q = lock.lock().expect("lookup queue");
        q.stop = true;
        q.jobs.clear();
        ready.notify_all();
    }
}

/// A worker: takes lookups until the pool stops. It runs at a lower priority than the
/// engine's threads (nice 10): a walk is background work, and on a busy machine a
/// flood of them must not take the CPU the engine serves every tenant with.
fn work(queue: &(Mutex<Queue>, Condvar), found: &Mutex<Vec<(u64, Found)>>, wake: &File) {
    // SAFETY: plain syscalls on this thread (Linux: a thread id is a PRIO_PROCESS who).
    unsafe {
        let me = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, me as libc::id_t, 10);
    }
    let (lock, ready) = queue;
    loop {
        let job = {
            let mut q = lock.lock().expect("lookup queue");
            loop {
                if q.stop {
                    return;
                }
                if let Some(job) = q.jobs.pop_front() {
                    break job;
                }
                q = ready.wait(q).expect("lookup queue");
            }
        };
        let answer = if job.deadline.is_some_and(|d| Instant::now() >= d) {
            // Answered EIO by the core already: not walked.
            Err(libc::ETIMEDOUT)
        } else {
            let a = job.ask;
            crate::io::extents::allocation(job.fd.as_raw_fd(), a.at, a.len, a.max_extents)
        };
        drop(job.fd);
        found.lock().expect("lookup answers").push((job.id, answer));
        let _ = (&*wake).write(&1u64.to_ne_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, SeekFrom};

    /// Lookups are answered by the workers and the engine's eventfd is poked; one past
    /// its deadline is dropped unwalked.
    #[test]
    fn lookups_are_answered_off_the_caller_and_bounded() {
        // SAFETY: plain syscall; the descriptor is owned by the File from now on.
        let wake = unsafe { File::from_raw_fd(libc::eventfd(0, libc::EFD_CLOEXEC)) };
        let wake = Arc::new(wake);
        let pool = Lookups::start(wake.clone()).unwrap();
        let mut f = tempfile::tempfile_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        f.set_len(8 << 20).unwrap();
        f.seek(SeekFrom::Start(1 << 20)).unwrap();
        std::io::Write::write_all(&mut f, &[1u8; 4096]).unwrap();
        let ask = StatusAsk {
            fd: f.as_raw_fd(),
            at: 0,
            len: 8 << 20,
            max_extents: 64,
        };
        pool.submit(1, ask, None).unwrap();
        let past = Instant::now() - std::time::Duration::from_secs(1);
        pool.submit(2, ask, Some(past)).unwrap();
        let mut answers = Vec::new();
        while answers.len() < 2 {
            let mut n = [0u8; 8];
            (&*wake).read_exact(&mut n).unwrap();
            answers.extend(pool.take_found());
        }
        answers.sort_by_key(|a| a.0);
        let hole = crate::nbd::proto::STATE_HOLE | crate::nbd::proto::STATE_ZERO;
        assert_eq!(answers[0].1.as_ref().unwrap()[0], (1 << 20, hole));
        assert_eq!(answers[1], (2, Err(libc::ETIMEDOUT)));
        assert_eq!(pool.queued(), 0);
        drop(pool);
        drop(f);
    }
}
