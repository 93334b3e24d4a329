//! Running under a service manager: readiness and status by the `sd_notify` protocol
//! (a datagram of `KEY=value` lines to the socket `NOTIFY_SOCKET` names; no systemd
//! library), listening sockets handed over by socket activation (`LISTEN_FDS`,
//! `LISTEN_PID`: descriptors 3 onwards), and a pid file.
//!
//! Readings: `READY=1` is sent once the listeners are bound and the engine runs, so a
//! client the manager lets through is accepted; `STOPPING=1` when a drain begins;
//! `STATUS=` lines say what the server does. Inherited sockets are told apart by their
//! family: one Unix-domain listener takes the place of `server.unix` (its file belongs
//! to the manager and is not removed), one TCP listener that of `server.tcp`; anything
//! else inherited is an error naming the descriptor. `LISTEN_*` are removed from the
//! environment once read, as `sd_listen_fds(1)` does.

#![allow(unsafe_code)]

use std::net::TcpListener;
use std::os::fd::{FromRawFd, RawFd};
use std::os::unix::net::{UnixDatagram, UnixListener};
use std::path::{Path, PathBuf};

/// The first descriptor socket activation passes.
const FIRST_FD: RawFd = 3;

/// Where readiness and status go: the manager's datagram socket.
pub struct Notifier {
    socket: UnixDatagram,
    to: std::os::unix::net::SocketAddr,
}

impl Notifier {
    /// The socket `NOTIFY_SOCKET` names (a path, or `@name` in the abstract
    /// namespace); `None` when it is unset (not under a manager) or unusable.
    pub fn from_env() -> Option<Notifier> {
        let name = std::env::var_os("NOTIFY_SOCKET")?;
        let name = name.to_str()?;
        let to = match name.strip_prefix('@') {
            Some(abstract_name) => {
                use std::os::linux::net::SocketAddrExt as _;
                std::os::unix::net::SocketAddr::from_abstract_name(abstract_name).ok()?
            }
            None => std::os::unix::net::SocketAddr::from_pathname(name).ok()?,
        };
        let socket = UnixDatagram::unbound().ok()?;
        Some(Notifier { socket, to })
    }

    /// Sends `state` (`KEY=value` lines); a manager that is gone is not an error.
    pub fn send(&self, state: &str) {
        let _ = self.socket.send_to_addr(state.as_bytes(), &self.to);
    }
}

/// Listening sockets a manager handed over.
#[derive(Debug, Default)]
pub struct Inherited {
    /// The Unix-domain listener, in place of `server.unix`.
    pub unix: Option<UnixListener>,
    /// The TCP listener, in place of `server.tcp`.
    pub tcp: Option<TcpListener>,
}

/// Why inherited sockets could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum ActivationError {
    /// `LISTEN_FDS` is not a count of descriptors.
    #[error("LISTEN_FDS = '{0}' is not a number of descriptors")]
    Count(String),
    /// A descriptor is not a listening socket of a family the server serves.
    #[error("descriptor {fd} handed over by the service manager: {why}")]
    Descriptor {
        /// The descriptor.
        fd: RawFd,
        /// What is wrong with it.
        why: String,
    },
}

/// The listening sockets socket activation handed to this process (none when
/// `LISTEN_PID` is not this process or `LISTEN_FDS` is unset).
pub fn inherited() -> Result<Inherited, ActivationError> {
    let ours = std::env::var("LISTEN_PID")
        .ok()
        .and_then(|p| p.parse::<u32>().ok())
        .is_some_and(|p| p == std::process::id());
    let count = std::env::var("LISTEN_FDS").ok();
    // SAFETY: removing variables this process alone reads, before any thread reads the
    // environment concurrently (at start, on the main thread).
    unsafe {
        std::env::remove_var("LISTEN_PID");
        std::env::remove_var("LISTEN_FDS");
        std::env::remove_var("LISTEN_FDNAMES");
    }
    let (true, Some(count)) = (ours, count) else {
        return Ok(Inherited::default());
    };
    let n: RawFd = count
        .parse()
        .ok()
        .filter(|&n| (0..=64).contains(&n))
        .ok_or(ActivationError::Count(count))?;
    let mut got = Inherited::default();
    for fd in FIRST_FD..FIRST_FD + n {
        take(fd, &mut got)?;
    }
    Ok(got)
}

/// Takes descriptor `fd` as the Unix or the TCP listener.
fn take(fd: RawFd, got: &mut Inherited) -> Result<(), ActivationError> {
    let bad = |why: &str| ActivationError::Descriptor {
        fd,
        why: why.to_string(),
    };
    let int_opt = |level, name| {
        let mut v: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: `v` and `len` are valid for the call; a bad descriptor is an error.
        let r = unsafe { libc::getsockopt(fd, level, name, (&raw mut v).cast(), &mut len) };
        (r == 0).then_some(v)
    };
    let listening =
        int_opt(libc::SOL_SOCKET, libc::SO_ACCEPTCONN).ok_or_else(|| bad("not a socket"))?;
    if listening == 0 {
        return Err(bad("a socket that is not listening"));
    }
    let kind = int_opt(libc::SOL_SOCKET, libc::SO_TYPE).ok_or_else(|| bad("no type"))?;
    if kind != libc::SOCK_STREAM {
        let name = match kind {
            libc::SOCK_SEQPACKET => "SOCK_SEQPACKET",
            libc::SOCK_DGRAM => "SOCK_DGRAM",
            _ => "not SOCK_STREAM",
        };
        return Err(bad(&format!(
            "a {name} socket: NBD is served on stream sockets (ListenStream= in the unit)"
        )));
    }
    let family = int_opt(libc::SOL_SOCKET, libc::SO_DOMAIN).ok_or_else(|| bad("no family"))?;
    // SAFETY: setting close-on-exec on a descriptor this process owns.
    unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    match family {
        libc::AF_UNIX if got.unix.is_none() => {
            // SAFETY: a listening Unix socket handed to this process, owned from now on.
            let l = unsafe { UnixListener::from_raw_fd(fd) };
            l.set_nonblocking(true).map_err(|e| bad(&e.to_string()))?;
            got.unix = Some(l);
        }
        libc::AF_INET | libc::AF_INET6 if got.tcp.is_none() => {
            // SAFETY: a listening TCP socket handed to this process, owned from now on.
            let l = unsafe { TcpListener::from_raw_fd(fd) };
            l.set_nonblocking(true).map_err(|e| bad(&e.to_string()))?;
            got.tcp = Some(l);
        }
        libc::AF_UNIX | libc::AF_INET | libc::AF_INET6 => {
            return Err(bad(
                "a second listener of its kind (one Unix and one TCP socket are served)",
            ));
        }
        _ => return Err(bad("not a Unix or TCP socket")),
    }
    Ok(())
}

/// A file holding this process's id while it serves, locked (`flock`) for as long as
/// the process lives; removed when dropped.
///
/// It is opened as [`crate::owned_file::open`] opens (a symlink, a hard link, a FIFO or
/// a device in its place is refused, so nothing is written through them), then locked,
/// and only then truncated and written: a second server finds the lock held and says
/// which process holds it, and a file left by a killed one (unlocked: the kernel drops
/// a dead process's locks) is taken over.
#[derive(Debug)]
pub struct PidFile {
    path: PathBuf,
    /// Held open: the lock lives with the descriptor.
    file: std::fs::File,
}

impl PidFile {
    /// Writes this process's id into `path`, locked. A file another live process has
    /// locked is an error naming it (another server).
    pub fn create(path: &Path) -> Result<PidFile, String> {
        use std::io::{Read, Seek, Write};
        use std::os::fd::AsRawFd;
        let at = |e: std::io::Error| format!("{}: {e}", path.display());
        let mut file = crate::owned_file::open(path, 0o644).map_err(at)?;
        // SAFETY: plain syscall on a descriptor this function owns.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let mut text = String::new();
            let _ = Read::by_ref(&mut file).take(64).read_to_string(&mut text);
            let who = match text.trim().parse::<u32>() {
                Ok(pid) => format!("process {pid}, which it names,"),
                Err(_) => "another process".to_string(),
            };
            return Err(format!(
                "{}: {who} holds it (another server running?)",
                path.display()
            ));
        }
        file.set_len(0).map_err(at)?;
        file.seek(std::io::SeekFrom::Start(0)).map_err(at)?;
        file.write_all(format!("{}\n", std::process::id()).as_bytes())
            .map_err(at)?;
        Ok(PidFile {
            path: path.to_path_buf(),
            file,
        })
    }
}

impl Drop for PidFile {
    fn drop(&mut self) {
        use std::os::unix::fs::MetadataExt;
        // Removed only while the name is still this file (not one put in its place).
        let same = |m: &std::fs::Metadata| {
            self.file
                .metadata()
                .is_ok_and(|f| (f.dev(), f.ino()) == (m.dev(), m.ino()))
        };
        if std::fs::symlink_metadata(&self.path).is_ok_and(|m| same(&m)) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_notification_reaches_the_managers_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let manager = UnixDatagram::bind(&path).unwrap();
        let n = Notifier {
            socket: UnixDatagram::unbound().unwrap(),
            to: std::os::unix::net::SocketAddr::from_pathname(&path).unwrap(),
        };
        n.send("READY=1\nSTATUS=serving");
        let mut buf = [0u8; 64];
        let len = manager.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"READY=1\nSTATUS=serving");
    }

    #[test]
    fn a_pid_file_names_this_process_and_refuses_a_live_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ioshare.pid");
        {
            let _p = PidFile::create(&path).unwrap();
            let text = std::fs::read_to_string(&path).unwrap();
            assert_eq!(text.trim(), std::process::id().to_string());
            // A second server (another open file description) finds it locked.
            let e = PidFile::create(&path).unwrap_err();
            assert!(
                e.contains(&format!(
                    "process {}, which it names, holds it",
                    std::process::id()
                )),
                "{e}"
            );
        }
        assert!(!path.exists(), "removed when dropped");
        // A file left by a killed server (nobody holds its lock) is taken over, and a
        // longer old text does not survive behind the new one.
        std::fs::write(&path, "999999999\n").unwrap();
        let _p = PidFile::create(&path).unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            format!("{}\n", std::process::id())
        );
    }

    #[test]
    fn a_pid_file_is_never_written_through_a_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("precious");
        std::fs::write(&target, "keep me").unwrap();
        let path = dir.path().join("ioshare.pid");
        std::os::unix::fs::symlink(&target, &path).unwrap();
        let e = PidFile::create(&path).unwrap_err();
        assert!(e.contains("ioshare.pid: a symlink"), "{e}");
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep me");
        // A dangling one: its target is not created.
        let dangling = dir.path().join("dangling.pid");
        std::os::unix::fs::symlink(dir.path().join("made"), &dangling).unwrap();
        assert!(PidFile::create(&dangling).is_err());
        assert!(!dir.path().join("made").exists());
    }

    /// A listening `SOCK_SEQPACKET` socket is no NBD listener.
    #[test]
    #[allow(unsafe_code)]
    fn a_listening_socket_of_another_type_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("seq.sock");
        // SAFETY: plain syscalls on a socket this test owns; the address is valid.
        let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET, 0) };
        assert!(fd >= 0);
        let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
        addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
        for (d, b) in addr
            .sun_path
            .iter_mut()
            .zip(path.as_os_str().as_encoded_bytes())
        {
            *d = *b as libc::c_char;
        }
        let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
        // SAFETY: as above.
        unsafe {
            assert_eq!(libc::bind(fd, (&raw const addr).cast(), len), 0);
            assert_eq!(libc::listen(fd, 4), 0);
        }
        let mut got = Inherited::default();
        let e = take(fd, &mut got).unwrap_err().to_string();
        assert!(e.contains("a SOCK_SEQPACKET socket"), "{e}");
        assert!(got.unix.is_none());
        // SAFETY: closing the socket this test opened.
        unsafe { libc::close(fd) };
    }

    #[test]
    fn descriptors_that_are_not_listening_sockets_are_named() {
        let mut got = Inherited::default();
        let file = std::fs::File::open("/dev/null").unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
        let e = take(fd, &mut got).unwrap_err().to_string();
        assert!(
            e.contains(&format!("descriptor {fd}")) && e.contains("not a socket"),
            "{e}"
        );
    }
}
