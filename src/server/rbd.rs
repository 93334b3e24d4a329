//! The RBD backend (`backend.kind = "rbd"`): tenants' disks are images of a Ceph
//! cluster, served through librbd's asynchronous API, so that ioshare is the per-host
//! QoS front of a store it does not own.
//!
//! **Loading.** librbd and librados are opened when a configuration names the backend
//! (`dlopen` of Debian's `librbd.so.1` and `librados.so.2`, the runtime packages
//! `librbd1`/`librados2`), not linked: the binary builds and runs everywhere else
//! without Ceph's libraries, and a server asked for RBD where they are missing says so
//! and which package brings them. No maintained Rust binding of librbd builds with
//! current compilers, and the ~20 calls used are declared here.
//!
//! **Completions into the engine's ring.** Each image is told to signal an eventfd
//! (`rbd_set_image_notification`, `EVENT_TYPE_EVENTFD`) and its completions are made
//! without callbacks: librbd queues them and writes the eventfd, whose read the engine
//! keeps on its io_uring ring beside the sockets and files; when it returns, the engine
//! drains each image's queue (`rbd_poll_io_events`, several completions a wake-up). A
//! completion callback would run on a librbd thread, and the engine's state is its
//! thread's alone. Reading the eventfd before draining loses no wake-up: a completion
//! queued after the drain writes the eventfd again.
//!
//! **Semantics.** Reads, writes, flushes, trims (`rbd_aio_discard`) and zeroing
//! (`rbd_aio_write_zeroes`) go to the image at the export's offsets; a store that
//! cannot zero gets zeroes written, as on a file (`Transfer`'s fallback). The client's
//! cache is off (`rbd_cache = false`, set on every connection whatever `ceph.conf`
//! says), so librbd acknowledges a write once every replica has it: a write acknowledged
//! to the NBD client survives the server's crash, and FUA needs no flush of its own. A
//! flush is `rbd_aio_flush` all the same. Operations that get no answer fail with
//! `ETIMEDOUT` after `rados_osd_op_timeout` (the server's `backend_timeout_s`, 30 s by
//! default) instead of hanging the tenant for ever; errors become NBD errors as a
//! file's errnos do.

use crate::io::transfer::Part;
use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::OnceLock;

type Handle = *mut c_void;

/// Declares [`Lib`], one function pointer per entry point with its C signature, and
/// its loader, which resolves each in its library: one list, no signature written twice.
macro_rules! entry_points {
    ($($lib:ident: $name:ident($($arg:ty),*) $(-> $ret:ty)?;)*) => {
        /// The librados and librbd entry points used, resolved once per process.
        struct Lib {
            $($name: unsafe extern "C" fn($($arg),*) $(-> $ret)?,)*
        }

        impl Lib {
            /// Resolves every entry point in `rados` and `rbd` (handles of the opened
            /// libraries).
            fn resolve(rados: *mut c_void, rbd: *mut c_void) -> Result<Lib, String> {
                Ok(Lib {
                    $($name: {
                        let library = match stringify!($lib) {
                            "rados" => rados,
                            _ => rbd,
                        };
                        // SAFETY: a NUL-terminated symbol name in a library just opened.
                        let p = unsafe {
                            libc::dlsym(library, concat!(stringify!($name), "\0").as_ptr().cast())
                        };
                        if p.is_null() {
                            return Err(format!("{}: {}", stringify!($name), dl_error()));
                        }
                        // SAFETY: the symbol is the C function librados.h / librbd.h
                        // declare with this signature (Ceph 16's headers).
                        unsafe {
                            std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($arg),*) $(-> $ret)?>(p)
                        }
                    },)*
                })
            }
        }
    };
}

entry_points! {
    rados: rados_create(*mut Handle, *const c_char) -> c_int;
    rados: rados_conf_read_file(Handle, *const c_char) -> c_int;
    rados: rados_conf_set(Handle, *const c_char, *const c_char) -> c_int;
    rados: rados_connect(Handle) -> c_int;
    rados: rados_shutdown(Handle);
    rados: rados_ioctx_create(Handle, *const c_char, *mut Handle) -> c_int;
    rados: rados_ioctx_destroy(Handle);
    rbd: rbd_open(Handle, *const c_char, *mut Handle, *const c_char) -> c_int;
    rbd: rbd_close(Handle) -> c_int;
    rbd: rbd_get_size(Handle, *mut u64) -> c_int;
    rbd: rbd_create(Handle, *const c_char, u64, *mut c_int) -> c_int;
    rbd: rbd_flush(Handle) -> c_int;
    rbd: rbd_set_image_notification(Handle, c_int, c_int) -> c_int;
    rbd: rbd_aio_create_completion(*mut c_void, Handle, *mut Handle) -> c_int;
    rbd: rbd_aio_read(Handle, u64, usize, *mut c_char, Handle) -> c_int;
    rbd: rbd_aio_write(Handle, u64, usize, *const c_char, Handle) -> c_int;
    rbd: rbd_aio_discard(Handle, u64, u64, Handle) -> c_int;
    rbd: rbd_aio_write_zeroes(Handle, u64, usize, Handle, c_int, c_int) -> c_int;
    rbd: rbd_aio_flush(Handle, Handle) -> c_int;
    rbd: rbd_poll_io_events(Handle, *mut Handle, c_int) -> c_int;
    rbd: rbd_aio_get_return_value(Handle) -> isize;
    rbd: rbd_aio_get_arg(Handle) -> *mut c_void;
    rbd: rbd_aio_release(Handle);
}

/// librbd's `EVENT_TYPE_EVENTFD`.
const EVENT_TYPE_EVENTFD: c_int = 2;

/// What went wrong with the RBD backend.
#[derive(Debug, thiserror::Error)]
pub enum RbdError {
    /// librbd or librados could not be loaded.
    #[error("the rbd backend needs Ceph's client libraries: {0} (Debian: apt-get install librbd1)")]
    Library(String),
    /// A call failed.
    #[error("{what}: {}", std::io::Error::from_raw_os_error(*.errno))]
    Call {
        /// What was being done, with its names.
        what: String,
        /// The errno librados or librbd answered.
        errno: i32,
    },
    /// The eventfd for completions could not be made.
    #[error("eventfd for the rbd backend's completions: {0}")]
    Eventfd(std::io::Error),
    /// A name holds a NUL byte.
    #[error("{0} holds a NUL byte")]
    Nul(String),
}

fn dl_error() -> String {
    // SAFETY: dlerror returns a thread-local string or null.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown error".into()
    } else {
        // SAFETY: non-null, NUL-terminated by dlerror.
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

impl Lib {
    /// The libraries, loaded at the first call (an error is answered every time).
    fn get() -> Result<&'static Lib, RbdError> {
        static LIB: OnceLock<Result<Lib, String>> = OnceLock::new();
        LIB.get_or_init(Lib::load)
            .as_ref()
            .map_err(|e| RbdError::Library(e.clone()))
    }

    fn load() -> Result<Lib, String> {
        let open = |name: &CStr| {
            // SAFETY: a NUL-terminated name; the handle is never closed (the functions
            // are used for the process's life).
            let h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
            if h.is_null() { Err(dl_error()) } else { Ok(h) }
        };
        let rados = open(c"librados.so.2")?;
        let rbd = open(c"librbd.so.1")?;
        Lib::resolve(rados, rbd)
    }
}

fn cstr(what: &str, s: &str) -> Result<CString, RbdError> {
    CString::new(s).map_err(|_| RbdError::Nul(format!("{what} '{s}'")))
}

fn check(r: c_int, what: impl FnOnce() -> String) -> Result<(), RbdError> {
    if r < 0 {
        Err(RbdError::Call {
            what: what(),
            errno: -r,
        })
    } else {
        Ok(())
    }
}

/// Where a tenant's image is: the cluster (its `ceph.conf` and the client's id), the pool
/// and the image's name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ImageRef {
    /// The cluster's configuration file (monitors, keyring).
    pub conf: std::path::PathBuf,
    /// The client's id (`admin` for `client.admin`).
    pub client_id: String,
    /// The pool.
    pub pool: String,
    /// The image.
    pub image: String,
}

impl std::fmt::Display for ImageRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "rbd:{}/{} (client.{})",
            self.pool, self.image, self.client_id
        )
    }
}

/// One connection to a cluster (a `rados_t`), shared by the images opened through it.
struct Cluster {
    lib: &'static Lib,
    handle: Handle,
    /// Pools' I/O contexts, by name.
    pools: HashMap<String, Handle>,
}

impl Cluster {
    /// Connects as `client_id` with `conf`; operations time out after `timeout_s`.
    fn connect(
        lib: &'static Lib,
        conf: &std::path::Path,
        client_id: &str,
        timeout_s: u64,
    ) -> Result<Cluster, RbdError> {
        let id = cstr("client_id", client_id)?;
        let path = cstr("conf", &conf.to_string_lossy())?;
        let mut handle: Handle = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; `id` outlives the call.
        check(
            unsafe { (lib.rados_create)(&mut handle, id.as_ptr()) },
            || format!("rados_create as client.{client_id}"),
        )?;
        // Owned from here: dropped (shut down) on any error below.
        let cluster = Cluster {
            lib,
            handle,
            pools: HashMap::new(),
        };
        // SAFETY: a live handle, a NUL-terminated path.
        check(
            unsafe { (lib.rados_conf_read_file)(handle, path.as_ptr()) },
            || format!("reading {}", conf.display()),
        )?;
        let timeout = timeout_s.max(1).to_string();
        for (k, v) in [
            ("rbd_cache", "false"),
            ("rados_osd_op_timeout", timeout.as_str()),
            ("rados_mon_op_timeout", timeout.as_str()),
            ("client_mount_timeout", timeout.as_str()),
        ] {
            let (k, v) = (cstr("option", k)?, cstr("value", v)?);
            // SAFETY: a live handle, NUL-terminated strings.
            check(
                unsafe { (lib.rados_conf_set)(handle, k.as_ptr(), v.as_ptr()) },
                || format!("setting {k:?}"),
            )?;
        }
        // SAFETY: a configured handle.
        check(unsafe { (lib.rados_connect)(handle) }, || {
            format!(
                "connecting to the cluster of {} as client.{client_id}",
                conf.display()
            )
        })?;
        Ok(cluster)
    }

    fn pool(&mut self, pool: &str) -> Result<Handle, RbdError> {
        if let Some(&p) = self.pools.get(pool) {
            return Ok(p);
        }
        let name = cstr("pool", pool)?;
        let mut io: Handle = std::ptr::null_mut();
        // SAFETY: a connected handle; out-pointer to a local.
        check(
            unsafe { (self.lib.rados_ioctx_create)(self.handle, name.as_ptr(), &mut io) },
            || format!("opening pool '{pool}'"),
        )?;
        self.pools.insert(pool.to_string(), io);
        Ok(io)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for (_, io) in self.pools.drain() {
            // SAFETY: made by rados_ioctx_create, destroyed once; its images are closed.
            unsafe { (self.lib.rados_ioctx_destroy)(io) };
        }
        // SAFETY: made by rados_create, shut down once.
        unsafe { (self.lib.rados_shutdown)(self.handle) };
    }
}

/// An open image.
struct Image {
    handle: Handle,
    at: ImageRef,
}

/// What an operation in flight was, to read its result.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Read,
    /// A write of this many bytes.
    Write(u32),
    /// A flush, trim or zeroing: success is 0.
    Other,
}

/// The tenants' open images, their connections and the completions in flight.
pub struct Images {
    lib: &'static Lib,
    /// Opened in order; dropped (closed) before the clusters.
    images: Vec<Image>,
    clusters: Vec<((std::path::PathBuf, String), Cluster)>,
    /// The eventfd every image signals ([`completion_eventfd`]).
    events: std::os::fd::RawFd,
    /// In flight: the request's id, by completion.
    flight: HashMap<usize, (u64, Kind)>,
    timeout_s: u64,
}

// SAFETY: librados and librbd handles may be used from any thread (Ceph's clients are
// thread-safe); `Images` is used by one thread at a time (opened on one, served on the
// engine's).
unsafe impl Send for Images {}

impl std::fmt::Debug for Images {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Images")
            .field(
                "images",
                &self.images.iter().map(|i| &i.at).collect::<Vec<_>>(),
            )
            .field("in_flight", &self.flight.len())
            .finish()
    }
}

impl Images {
    /// No image yet; operations time out after `timeout_s` seconds.
    pub fn new(timeout_s: u64) -> Result<Images, RbdError> {
        let lib = Lib::get()?;
        Ok(Images {
            lib,
            images: Vec::new(),
            clusters: Vec::new(),
            events: completion_eventfd()?,
            flight: HashMap::new(),
            timeout_s,
        })
    }

    fn cluster(&mut self, at: &ImageRef) -> Result<&mut Cluster, RbdError> {
        let key = (at.conf.clone(), at.client_id.clone());
        let i = match self.clusters.iter().position(|(k, _)| *k == key) {
            Some(i) => i,
            None => {
                let c = Cluster::connect(self.lib, &at.conf, &at.client_id, self.timeout_s)?;
                self.clusters.push((key, c));
                self.clusters.len() - 1
            }
        };
        Ok(&mut self.clusters[i].1)
    }

    /// Opens `at` (creating it at `create` bytes when it is missing and that is given);
    /// answers its index for [`Images::submit`] and its size in bytes.
    pub fn open(&mut self, at: &ImageRef, create: Option<u64>) -> Result<(usize, u64), RbdError> {
        let lib = self.lib;
        let name = cstr("image", &at.image)?;
        let io = self.cluster(at)?.pool(&at.pool)?;
        let mut handle: Handle = std::ptr::null_mut();
        // SAFETY: a live pool context, a NUL-terminated name, no snapshot.
        let mut r = unsafe { (lib.rbd_open)(io, name.as_ptr(), &mut handle, std::ptr::null()) };
        if r == -libc::ENOENT
            && let Some(size) = create
        {
            let mut order: c_int = 0;
            // SAFETY: as above; order 0 is the default object size.
            check(
                unsafe { (lib.rbd_create)(io, name.as_ptr(), size, &mut order) },
                || format!("creating {at}"),
            )?;
            tracing::info!("created {at}, {size} bytes");
            // SAFETY: as above.
            r = unsafe { (lib.rbd_open)(io, name.as_ptr(), &mut handle, std::ptr::null()) };
        }
        check(r, || format!("opening {at}"))?;
        self.images.push(Image {
            handle,
            at: at.clone(),
        });
        let mut size = 0u64;
        // SAFETY: an open image; out-pointer to a local.
        check(unsafe { (lib.rbd_get_size)(handle, &mut size) }, || {
            format!("the size of {at}")
        })?;
        // SAFETY: an open image and an eventfd this set owns for as long.
        check(
            unsafe { (lib.rbd_set_image_notification)(handle, self.events, EVENT_TYPE_EVENTFD) },
            || format!("completion notification of {at}"),
        )?;
        Ok((self.images.len() - 1, size))
    }

    /// Takes over `other`'s images and connections (a tenant added while running);
    /// answers the index its first image has here. Nothing of `other` is in flight,
    /// and its images signal the same eventfd already.
    pub fn absorb(&mut self, mut other: Images) -> usize {
        assert!(other.flight.is_empty(), "an image being opened has no I/O");
        let base = self.images.len();
        self.images.append(&mut other.images);
        self.clusters.append(&mut other.clusters);
        base
    }

    /// The eventfd every image signals when it has completions ([`Images::reap`]).
    pub fn eventfd(&self) -> std::os::fd::RawFd {
        self.events
    }

    /// Operations in flight.
    pub fn in_flight(&self) -> usize {
        self.flight.len()
    }

    /// Starts `part` of request `id` on image `image`. `Err` is the result its
    /// completion carries at once (a negative errno, or 0 for a part with nothing to do
    /// on an image); the request is then not in flight.
    pub fn submit(&mut self, image: usize, id: u64, part: Part<'_>) -> Result<(), i32> {
        let lib = self.lib;
        let img = self.images[image].handle;
        let mut c: Handle = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; no callback (completions are polled), the
        // argument is the request's id, never dereferenced.
        let r = unsafe {
            (lib.rbd_aio_create_completion)(id as *mut c_void, std::ptr::null_mut(), &mut c)
        };
        if r < 0 {
            return Err(r);
        }
        // SAFETY (each call): an open image and a fresh completion; the buffers live in
        // the request's transfer, which the engine keeps in place until this
        // completion has been reaped (or leaks if it never is: `Shard::settle`, `engine::run`).
        let (r, kind) = unsafe {
            match part {
                Part::Read { at, buf } => (
                    (lib.rbd_aio_read)(img, at, buf.len(), buf.as_mut_ptr().cast(), c),
                    Kind::Read,
                ),
                Part::Write { at, data, .. } | Part::ZeroWrite { at, data, .. } => (
                    (lib.rbd_aio_write)(img, at, data.len(), data.as_ptr().cast(), c),
                    Kind::Write(data.len() as u32),
                ),
                Part::Flush => ((lib.rbd_aio_flush)(img, c), Kind::Other),
                Part::Discard { at, len } => (
                    (lib.rbd_aio_discard)(img, at, u64::from(len), c),
                    Kind::Other,
                ),
                Part::WriteZeroes { at, len } => (
                    (lib.rbd_aio_write_zeroes)(img, at, len as usize, c, 0, 0),
                    Kind::Other,
                ),
                // No host cache in front of an image: nothing to drop.
                Part::DropCache { .. } => {
                    (lib.rbd_aio_release)(c);
                    return Err(0);
                }
            }
        };
        if r < 0 {
            // SAFETY: the completion was never handed to an operation.
            unsafe { (lib.rbd_aio_release)(c) };
            return Err(r);
        }
        let fresh = self.flight.insert(c as usize, (id, kind)).is_none();
        assert!(fresh, "a completion is in flight once");
        Ok(())
    }

    /// Once the eventfd was read (the engine's ring read it, which resets it), hands
    /// every finished operation's (request id, result) to `out`: bytes moved (a read's,
    /// a write's length) or 0, or a negative errno.
    pub fn reap(&mut self, out: &mut Vec<(u64, i32)>) {
        self.drain(out);
    }

    fn drain(&mut self, out: &mut Vec<(u64, i32)>) {
        const BATCH: usize = 64;
        let lib = self.lib;
        let mut done: [Handle; BATCH] = [std::ptr::null_mut(); BATCH];
        for img in &self.images {
            loop {
                // SAFETY: an open image; room for BATCH completions.
                let n = unsafe {
                    (lib.rbd_poll_io_events)(img.handle, done.as_mut_ptr(), BATCH as c_int)
                };
                if n <= 0 {
                    break;
                }
                for &c in &done[..n as usize] {
                    let (id, kind) = self
                        .flight
                        .remove(&(c as usize))
                        .expect("a completion this set made, reaped once");
                    // SAFETY: a finished completion, released once after reading.
                    let (rv, arg) = unsafe {
                        let rv = (lib.rbd_aio_get_return_value)(c);
                        let arg = (lib.rbd_aio_get_arg)(c) as u64;
                        (lib.rbd_aio_release)(c);
                        (rv, arg)
                    };
                    debug_assert_eq!(arg, id, "the completion carries its request's id");
                    let result = match kind {
                        _ if rv < 0 => rv.max(i32::MIN as isize) as i32,
                        Kind::Read => rv.min(i32::MAX as isize) as i32,
                        Kind::Write(len) => len as i32,
                        Kind::Other => 0,
                    };
                    out.push((id, result));
                }
                if (n as usize) < BATCH {
                    break;
                }
            }
        }
    }

    /// Waits up to `limit` for what is in flight (a stopping engine: the buffers the
    /// operations use must outlive them); answers whether nothing is left.
    pub fn settle(&mut self, limit: std::time::Duration, out: &mut Vec<(u64, i32)>) -> bool {
        let until = std::time::Instant::now() + limit;
        while !self.flight.is_empty() && std::time::Instant::now() < until {
            self.drain(out);
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        self.flight.is_empty()
    }

    /// Flushes every image (at shutdown); the first error.
    pub fn flush_all(&self) -> Result<(), RbdError> {
        for img in &self.images {
            // SAFETY: an open image.
            check(unsafe { (self.lib.rbd_flush)(img.handle) }, || {
                format!("flushing {}", img.at)
            })?;
        }
        Ok(())
    }
}

impl Drop for Images {
    fn drop(&mut self) {
        if !self.flight.is_empty() {
            // Closing an image waits for its operations; their buffers may be gone.
            // Leaked instead (the engine only drops a settled set).
            tracing::warn!(
                "{} rbd operation(s) still in flight; the images are left open",
                self.flight.len()
            );
            std::mem::forget(std::mem::take(&mut self.images));
            std::mem::forget(std::mem::take(&mut self.clusters));
            return;
        }
        for img in self.images.drain(..) {
            // SAFETY: an open image, closed once, nothing in flight.
            unsafe { (self.lib.rbd_close)(img.handle) };
        }
    }
}

/// The one eventfd every image of the process signals, made at the first call and open
/// for the process's life: librbd keeps writing to the descriptor an image was given,
/// so an image opened by one set and served by another (a tenant added while running)
/// must never have been given one that closes.
fn completion_eventfd() -> Result<std::os::fd::RawFd, RbdError> {
    static EVENTS: OnceLock<Result<File, String>> = OnceLock::new();
    EVENTS
        .get_or_init(|| {
            // SAFETY: plain syscall; the descriptor is owned by the File from here on.
            let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
            if fd < 0 {
                return Err(std::io::Error::last_os_error().to_string());
            }
            // SAFETY: a fresh descriptor nobody else owns.
            Ok(unsafe { File::from_raw_fd(fd) })
        })
        .as_ref()
        .map(|f| f.as_raw_fd())
        .map_err(|e| RbdError::Eventfd(std::io::Error::other(e.clone())))
}

/// The size of image `at` in bytes (a tenant whose `size` the configuration leaves to
/// the image), connecting for the question.
pub fn image_size(at: &ImageRef, timeout_s: u64) -> Result<u64, RbdError> {
    let mut set = Images::new(timeout_s)?;
    set.open(at, None).map(|(_, size)| size)
}
