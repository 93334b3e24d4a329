//! Block status lookups off the engine's threads. io_uring has no `lseek`, and a
//! `SEEK_DATA` walk can block: on a FUSE or network file system it waits on the daemon
//! or the server, on a fragmented file it walks extent after extent. Done on an engine
//! thread it stopped every tenant of that thread (measured: 0 requests completed for
//! 10–12 s while one tenant's image hung; docs/benchmarks.md, "Hostile clients"), so
//! the engine hands each lookup the policy dispatched to a small pool of threads of
//! its own and takes the extents back on its next turn.
//!
//! **One lookup at a time per tenant.** A worker takes the first waiting lookup whose
//! tenant has none in progress: one tenant flooding block status keeps one worker busy,
//! not all of them (the CPU its walks take is one thread's, beside the engine's), and a
//! tenant whose image's file system hangs holds one worker while the others serve the
//! other tenants (regions of one shared file included).
//!
//! Bounded: [`WORKERS`] threads (nice 10: a walk is background work beside the engine),
//! at most [`MAX_QUEUED`] lookups waiting and [`MAX_QUEUED_PER_TENANT`] of one tenant (past
//! that, one is answered at once with `EBUSY`, which the client gets as `EIO`), each
//! walking at most its ask's extents ([`crate::io::extents::MAX_WALK`]). A lookup
//! carries the backend timeout's deadline: one still waiting past it (the core has
//! answered its request `EIO` already) is dropped unwalked, so a hung image leaves no
//! queue of dead work. Each lookup holds its own descriptor (a duplicate), so a worker
//! stuck in a hung file system never reads through a descriptor closed or reused after
//! the engine stopped; workers are not waited for at shutdown.

use super::core::StatusAsk;
use crate::types::TenantId;
use std::collections::VecDeque;
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

/// Threads walking extents: as many tenants' lookups at once.
pub const WORKERS: usize = 4;
/// Lookups waiting for a worker at most.
pub const MAX_QUEUED: usize = 1024;
/// Lookups of one tenant waiting at most.
pub const MAX_QUEUED_PER_TENANT: usize = 256;

/// What a lookup answers: the extents, or an errno.
pub type Found = Result<Vec<(u32, u32)>, i32>;

/// One lookup to make.
struct Job {
    id: u64,
    /// Whose it is.
    tenant: TenantId,
    fd: OwnedFd,
    ask: StatusAsk,
    /// Past this, nobody waits for the answer.
    deadline: Option<Instant>,
}

/// What the workers and the engine share.
#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    /// Tenants with a lookup in progress.
    busy: Vec<TenantId>,
    stop: bool,
}

impl Queue {
    /// The first lookup whose tenant has none in progress, taken (its tenant marked
    /// busy); lookups past their deadline met on the way are answered `ETIMEDOUT` into
    /// `expired`.
    fn take(&mut self, now: Instant, expired: &mut Vec<(u64, Found)>) -> Option<Job> {
        self.jobs.retain(|j| {
            let late = j.deadline.is_some_and(|d| now >= d);
            if late {
                // Answered EIO by the core already: not walked.
                expired.push((j.id, Err(libc::ETIMEDOUT)));
            }
            !late
        });
        let at = self
            .jobs
            .iter()
            .position(|j| !self.busy.contains(&j.tenant))?;
        let job = self.jobs.remove(at).expect("found above");
        self.busy.push(job.tenant);
        Some(job)
    }

    /// When the earliest waiting lookup's deadline passes.
    fn next_deadline(&self) -> Option<Instant> {
        self.jobs.iter().filter_map(|j| j.deadline).min()
    }
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
    /// when it cannot be (its descriptor could not be duplicated, or too many wait).
    pub fn submit(&self, id: u64, ask: StatusAsk, deadline: Option<Instant>) -> Result<(), i32> {
        let (lock, ready) = &*self.queue;
        let mut q = lock.lock().expect("lookup queue");
        let of_tenant = q.jobs.iter().filter(|j| j.tenant == ask.tenant).count();
        if q.jobs.len() >= MAX_QUEUED || of_tenant >= MAX_QUEUED_PER_TENANT {
            return Err(libc::EBUSY);
        }
        // SAFETY: duplicating a descriptor the engine holds open; the copy is owned here.
        let fd = unsafe { libc::fcntl(ask.fd, libc::F_DUPFD_CLOEXEC, 0) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO));
        }
        // SAFETY: `fd` was just made and nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        q.jobs.push_back(Job {
            id,
            tenant: ask.tenant,
            fd,
            ask,
            deadline,
        });
        // One worker is enough: a lookup it cannot take (its tenant busy) is taken by the
        // worker on that tenant once it is done, which looks again without being woken.
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
    let mut expired = Vec::new();
    loop {
        let job = {
            let mut q = lock.lock().expect("lookup queue");
            loop {
                if q.stop {
                    return;
                }
                let job = q.take(Instant::now(), &mut expired);
                if !expired.is_empty() {
                    answer(found, wake, &mut expired);
                }
                if let Some(job) = job {
                    break job;
                }
                q = match q.next_deadline() {
                    Some(d) => {
                        let wait = d.saturating_duration_since(Instant::now());
                        ready.wait_timeout(q, wait).expect("lookup queue").0
                    }
                    None => ready.wait(q).expect("lookup queue"),
                };
            }
        };
        let a = job.ask;
        let walked = crate::io::extents::allocation(job.fd.as_raw_fd(), a.at, a.len, a.max_extents);
        drop(job.fd);
        lock.lock()
            .expect("lookup queue")
            .busy
            .retain(|&t| t != job.tenant);
        answer(found, wake, &mut vec![(job.id, walked)]);
    }
}

/// Hands `answers` to the engine and pokes it.
fn answer(found: &Mutex<Vec<(u64, Found)>>, wake: &File, answers: &mut Vec<(u64, Found)>) {
    found.lock().expect("lookup answers").append(answers);
    let _ = (&*wake).write(&1u64.to_ne_bytes());
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
            tenant: 0,
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

    /// A worker takes the first lookup whose tenant has none in progress; lookups past
    /// their deadline are answered on the way, unwalked.
    #[test]
    fn one_lookup_at_a_time_per_tenant_and_none_past_its_deadline() {
        let null = File::open("/dev/null").unwrap();
        let job = |id: u64, tenant: TenantId, deadline: Option<Instant>| Job {
            id,
            tenant,
            fd: OwnedFd::from(null.try_clone().unwrap()),
            ask: StatusAsk {
                tenant,
                fd: 3,
                at: 0,
                len: 4096,
                max_extents: 1,
            },
            deadline,
        };
        let now = Instant::now();
        let past = now - std::time::Duration::from_millis(1);
        let mut q = Queue::default();
        for (id, tenant, deadline) in [
            (1, 10, None),
            (2, 10, None),
            (3, 11, Some(past)),
            (4, 12, None),
        ] {
            q.jobs.push_back(job(id, tenant, deadline));
        }
        let mut expired = Vec::new();
        assert_eq!(q.take(now, &mut expired).map(|j| j.id), Some(1));
        assert_eq!(expired, vec![(3, Err(libc::ETIMEDOUT))]);
        assert_eq!(
            q.take(now, &mut expired).map(|j| j.id),
            Some(4),
            "tenant 10 is busy"
        );
        assert!(q.take(now, &mut expired).is_none());
        q.busy.retain(|&i| i != 10);
        assert_eq!(q.take(now, &mut expired).map(|j| j.id), Some(2));
        assert!(q.jobs.is_empty());
    }
}
