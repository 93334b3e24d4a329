//! The file backend: opening the tenants' images (or regions of one shared file or block
//! device). Each request's I/O is [`crate::io::transfer`]'s state machine (re-exported
//! here), which `target/` drives too; the cache modes it implements are these:
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

use super::config::{BackendKind, Cache, ServerConfig, Storage, TenantConfig};
use crate::io::transfer::Target;
use crate::units::format_bytes;
use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::PathBuf;

/// Where a tenant's requests go.
#[derive(Debug, Clone, Copy)]
pub enum Store {
    /// A file or block device (its own image or a region of the shared one).
    File(Target),
    /// An image of the rbd backend: its index among [`Files::images`].
    Image(usize),
}

impl Store {
    /// Where the tenant's export starts in its store.
    pub fn base(&self) -> u64 {
        match self {
            Store::File(t) => t.base,
            Store::Image(_) => 0,
        }
    }

    /// The file target, when the store is one.
    pub fn file(&self) -> Option<Target> {
        match self {
            Store::File(t) => Some(*t),
            Store::Image(_) => None,
        }
    }
}

/// Opens every tenant's storage as the configuration says.
pub struct Files {
    files: Vec<File>,
    targets: Vec<Option<Store>>,
    /// The rbd backend's open images and connections.
    images: Option<super::rbd::Images>,
    /// Whose each image is (a tenant's name, or `backend.path`), its path and its
    /// buffered descriptor's place in `files`.
    named: Vec<(String, PathBuf, usize)>,
    /// Images this opening created (they did not exist): the caller removes them again,
    /// with their markers, if the server (or the added tenant) does not start
    /// ([`Files::take_created`]); an opening that fails half-way removes them itself.
    created: Vec<PathBuf>,
    /// The shared file's descriptors (buffered, direct) when tenants are its regions.
    shared: Option<(RawFd, Option<RawFd>)>,
    /// Descriptors of images on file systems that may block a submitting thread
    /// ([`MAY_BLOCK`]): the engine submits their operations with `IOSQE_ASYNC`.
    offload: Vec<RawFd>,
}

/// Images a start created, removed again (with their markers) when dropped before
/// [`Created::keep`]: a server that fails to start — or an opening that fails half-way —
/// leaves nothing it made behind.
#[derive(Debug, Default)]
pub struct Created(Vec<PathBuf>);

impl Created {
    /// The start succeeded: the images stay.
    pub fn keep(self) {
        let _ = self.into_paths();
    }

    /// The paths, no longer removed on drop.
    fn into_paths(mut self) -> Vec<PathBuf> {
        std::mem::take(&mut self.0)
    }
}

impl Drop for Created {
    fn drop(&mut self) {
        for path in self.0.drain(..) {
            if std::fs::remove_file(&path).is_ok() {
                let _ = std::fs::remove_file(marker_of(&path));
                tracing::info!(
                    "removed {}, which this failed start had created",
                    path.display()
                );
            }
        }
    }
}

impl Files {
    /// Descriptors whose operations go to the kernel's workers at once: images on a
    /// file system that may block the thread submitting them (FUSE, network ones), so
    /// that a hung daemon or server stalls that image's requests in the kernel's
    /// workers, never an engine thread.
    pub fn offload(&self) -> &[RawFd] {
        &self.offload
    }

    /// Where each tenant's requests go (`None`: the null backend), in order.
    pub fn targets(&self) -> Vec<Option<Store>> {
        self.targets.clone()
    }

    /// Watches the images served for deletion and replacement ([`super::watch`]).
    pub fn watch(&self) -> super::watch::Watch {
        super::watch::Watch::new(
            self.named
                .iter()
                .map(|(who, path, i)| (who.clone(), path.clone(), &self.files[*i]))
                .collect(),
        )
    }

    /// Flushes every file's data to stable storage, and every image (at shutdown);
    /// the first error.
    pub fn sync_all(&self) -> std::io::Result<()> {
        for f in &self.files {
            f.sync_data()?;
        }
        if let Some(images) = &self.images {
            images.flush_all().map_err(std::io::Error::other)?;
        }
        Ok(())
    }

    /// The rbd backend's images, when tenants have some.
    pub fn images(&mut self) -> Option<&mut super::rbd::Images> {
        self.images.as_mut()
    }

    /// Opens every file the configuration names (creating the shared file, and images
    /// whose tenant says `create = true`, when missing).
    pub fn open(config: &ServerConfig) -> Result<Files, BackendError> {
        Files::empty().opening(|f| f.open_all(config))
    }

    /// Runs `open` on these files; when it fails, the images it created are removed
    /// again (with their markers).
    fn opening(
        mut self,
        open: impl FnOnce(&mut Files) -> Result<(), BackendError>,
    ) -> Result<Files, BackendError> {
        match open(&mut self) {
            Ok(()) => Ok(self),
            Err(e) => {
                drop(Created(std::mem::take(&mut self.created)));
                Err(e)
            }
        }
    }

    fn open_all(&mut self, config: &ServerConfig) -> Result<(), BackendError> {
        let f = self;
        if let (Some((path, size)), BackendKind::File | BackendKind::Emulated) =
            (&config.shared, config.backend)
        {
            let (need, cache) = shared_needs(config, size.unwrap_or(0));
            // The shared file (or the emulated device's) is created when missing.
            // The shared file grows to hold every region.
            let (buffered, direct, index) =
                f.open_pair("backend.path", path, need, true, true, cache)?;
            f.named
                .push(("backend.path".to_string(), path.clone(), index));
            f.shared = Some((buffered, direct));
        }
        for t in &config.tenants {
            let target = f.target_of(t).map_err(|e| BackendError::OfTenant {
                tenant: t.spec.name.clone(),
                inner: Box::new(e),
            })?;
            f.targets.push(target);
        }
        Ok(())
    }

    /// Opens the image of one tenant added while running (`add-tenant`), for
    /// [`Files::absorb`] on the engine's side (a region of the shared file needs nothing
    /// opened: the engine's files hold it).
    pub fn open_added(t: &TenantConfig) -> Result<Files, BackendError> {
        Files::empty().opening(|f| {
            if let Storage::Own(_) | Storage::Image(_) = &t.storage {
                let target = f.target_of(t)?;
                f.targets.push(target);
            }
            Ok(())
        })
    }

    /// Takes over the files [`Files::open_added`] opened for `t`, and answers where its
    /// requests go (the next tenant's target).
    pub fn absorb(&mut self, mut added: Files, t: &TenantConfig) -> Option<Store> {
        if let Storage::Image(_) = &t.storage {
            let images = added.images.take().expect("open_added opened its image");
            let index = match self.images.as_mut() {
                Some(set) => set.absorb(images),
                None => {
                    self.images = Some(images);
                    0
                }
            };
            let target = Some(Store::Image(index));
            self.targets.push(target);
            return target;
        }
        self.offload.append(&mut added.offload);
        let base = self.files.len();
        self.files.append(&mut added.files);
        self.named.extend(
            added
                .named
                .drain(..)
                .map(|(who, path, i)| (who, path, i + base)),
        );
        let target = match &t.storage {
            Storage::Own(_) => added.targets.pop().expect("opened by open_added"),
            Storage::Image(_) => unreachable!("an image joins the images above"),
            // Nothing to open: a region of the shared file, or the null backend.
            _ => self.target_of(t).expect("opens nothing"),
        };
        self.targets.push(target);
        target
    }

    fn empty() -> Files {
        Files {
            files: Vec::new(),
            targets: Vec::new(),
            named: Vec::new(),
            created: Vec::new(),
            shared: None,
            images: None,
            offload: Vec::new(),
        }
    }

    /// Where `t`'s requests go, opening its own image.
    fn target_of(&mut self, t: &TenantConfig) -> Result<Option<Store>, BackendError> {
        Ok(match &t.storage {
            Storage::Nothing => None,
            Storage::Image(at) => {
                if self.images.is_none() {
                    self.images = Some(super::rbd::Images::new(OP_TIMEOUT_S)?);
                }
                let images = self.images.as_mut().expect("made above");
                let (index, len) = images.open(at, t.create.then_some(t.size))?;
                if len != t.size && !(t.resize && len > t.size) {
                    return Err(BackendError::ImageSize {
                        image: at.to_string(),
                        len,
                        size: t.size,
                    });
                }
                Some(Store::Image(index))
            }
            Storage::Own(path) => {
                let (buffered, direct, index) =
                    self.open_pair(&t.spec.name, path, t.size, t.create, t.resize, t.cache)?;
                self.named.push((t.spec.name.clone(), path.clone(), index));
                Some(Store::File(Target {
                    buffered,
                    direct,
                    base: 0,
                    cache: t.cache,
                }))
            }
            Storage::Region { offset } => {
                let (buffered, direct) = self.shared.expect("checked by the config");
                Some(Store::File(Target {
                    buffered,
                    direct,
                    base: *offset,
                    cache: t.cache,
                }))
            }
        })
    }

    /// Opens an image (its buffered descriptor, and a direct one when `cache` needs it;
    /// with pdc that one carries `POSIX_FADV_NOREUSE`): the descriptors and the buffered
    /// one's place in `files`.
    fn open_pair(
        &mut self,
        who: &str,
        path: &std::path::Path,
        size: u64,
        create: bool,
        resize: bool,
        cache: Cache,
    ) -> Result<(RawFd, Option<RawFd>, usize), BackendError> {
        let existed = std::fs::symlink_metadata(path).is_ok();
        if !resize {
            same_size(path, size)?;
        }
        let (f, backing) = open_sized(path, size, create)?;
        if !existed {
            self.created.push(path.to_path_buf());
        }
        let buffered = f.as_raw_fd();
        let index = self.files.len();
        self.files.push(f);
        // A loop device's backing file, open for its lock alone.
        self.files.extend(backing);
        let d = if cache.direct() {
            let f = OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_DIRECT)
                .open(path)
                .map_err(|source| BackendError::Direct {
                    path: path.to_path_buf(),
                    cache: cache.name(),
                    source,
                })?;
            let fd = f.as_raw_fd();
            if cache == Cache::Pdc {
                // SAFETY: plain syscall on a descriptor we own. Advice: its failure
                // changes nothing the server promises.
                unsafe { libc::posix_fadvise(fd, 0, 0, libc::POSIX_FADV_NOREUSE) };
            }
            self.files.push(f);
            Some(fd)
        } else {
            None
        };
        if let Some(fs) = may_block(buffered) {
            tracing::info!(
                "{who}: its image is on {fs}: its file operations go to kernel workers (IOSQE_ASYNC), so a hung {fs} cannot stop the other tenants"
            );
            self.offload.extend(std::iter::once(buffered).chain(d));
        }
        Ok((buffered, d, index))
    }

    /// The images this opening created, to keep once the server has started (dropped
    /// unkept, they are removed).
    pub fn take_created(&mut self) -> Created {
        Created(std::mem::take(&mut self.created))
    }
}

/// `statfs` magic numbers of file systems whose operations may block the thread that
/// submits them even when io_uring asks for a non-blocking attempt first (a FUSE read
/// can wait on its daemon for attributes, a network file system on its server).
const MAY_BLOCK: [(i64, &str); 8] = [
    (0x6573_5546, "FUSE"),
    (0x6969, "NFS"),
    (0xFF53_4D42, "CIFS"),
    (0xFE53_4D42, "SMB2"),
    (0x0102_1997, "9P"),
    (0x00C3_6400, "Ceph"),
    (0x5346_414F, "AFS"),
    (0x7364_6673, "SSHFS"),
];

/// The file system `fd` is on, when it is a [`MAY_BLOCK`] one. Asked when the image is
/// opened (the server's start, or `add-tenant` on the control thread), never on an
/// engine thread: `fstatfs` itself waits on a hung daemon.
fn may_block(fd: RawFd) -> Option<&'static str> {
    // SAFETY: an all-zero statfs is valid; fstatfs fills it for a descriptor we own.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstatfs(fd, &mut st) } != 0 {
        return None;
    }
    MAY_BLOCK
        .iter()
        .find(|(m, _)| *m == st.f_type as i64)
        .map(|(_, fs)| *fs)
}

/// How long an rbd operation may go unanswered before it fails (`ETIMEDOUT`), s: the
/// server's default `backend_timeout_s`, whose own answer (`EIO`) comes first.
const OP_TIMEOUT_S: u64 = 30;

/// Why an image could not be served; each names its file.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The rbd backend could not open an image (or load librbd, or reach the cluster).
    #[error("{0}")]
    Rbd(#[from] super::rbd::RbdError),
    /// An rbd image whose size is not the tenant's (growing an image is not done
    /// here: `rbd resize` it).
    #[error(
        "{image}: holds {}, but the tenant's size is {}: leave size out to serve the image as it is, set resize = true to serve its first {} of a larger image, or rbd resize it",
        format_bytes(*len), format_bytes(*size), format_bytes(*size)
    )]
    ImageSize {
        /// The image.
        image: String,
        /// Its size.
        len: u64,
        /// The tenant's.
        size: u64,
    },
    /// What went wrong with a tenant's image at start, and whose it was.
    #[error("tenant '{tenant}': {inner}")]
    OfTenant {
        /// The tenant's name.
        tenant: String,
        /// What went wrong.
        inner: Box<BackendError>,
    },
    /// An image to create whose folder does not exist.
    #[error("{}: its folder {} does not exist: create = true makes the image file, not its folders (mkdir -p {1})", path.display(), folder.display())]
    NoFolder {
        /// The image.
        path: PathBuf,
        /// Its folder.
        folder: PathBuf,
    },
    /// A tenant's image is missing and it does not say `create = true`.
    #[error("{}: no such image; set create = true on the tenant to create it (a missing image is not served as a blank disk)", path.display())]
    Missing {
        /// The image.
        path: PathBuf,
    },
    /// An image `create = true` would create was served before (its marker says so)
    /// and is gone: deleted or moved, not new.
    #[error("{}: missing, but a server created or served it before ({} says so): it was deleted or moved, and an empty disk is not served in its place; restore the image, or delete the marker to start with an empty one", path.display(), marker.display())]
    Vanished {
        /// The image.
        path: PathBuf,
        /// Its marker.
        marker: PathBuf,
    },
    /// A block device another holds exclusively.
    #[error("{}: busy: mounted, or claimed by another server (a block device is opened exclusively, under any name)", path.display())]
    Busy {
        /// The device.
        path: PathBuf,
    },
    /// The file could not be opened or examined.
    #[error("{}: cannot open: {source}", path.display())]
    Open {
        /// The image.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Its cache mode needs `O_DIRECT`, which the file system refused.
    #[error("{}: cache = \"{cache}\" needs O_DIRECT, which failed: {source} (tmpfs, for one, has no O_DIRECT; use cache = \"writeback\")", path.display())]
    Direct {
        /// The image.
        path: PathBuf,
        /// The cache mode's name.
        cache: &'static str,
        /// Why.
        source: std::io::Error,
    },
    /// Another process (another server, maybe) holds its lock.
    #[error("{}: cannot lock it for this server ({source}): {holder} holds it", path.display())]
    Locked {
        /// The image.
        path: PathBuf,
        /// The lock's error.
        source: std::io::Error,
        /// Who holds it, as far as `/proc/locks` says.
        holder: String,
    },
    /// An existing image file whose size is not the one configured, without
    /// `resize = true`.
    #[error(
        "{}: holds {}, but the tenant's size is {}: leave size out to serve the image as it is, or set resize = true to serve it at {} (a smaller image is grown; of a larger one the first {} are served)",
        path.display(), format_bytes(*len), format_bytes(*size), format_bytes(*size), format_bytes(*size)
    )]
    SizeDiffers {
        /// The image.
        path: PathBuf,
        /// What it holds, bytes.
        len: u64,
        /// What the configuration says, bytes.
        size: u64,
    },
    /// A block device smaller than the size configured.
    #[error("{}: the device holds {len} bytes, fewer than the {size} configured", path.display())]
    TooSmall {
        /// The device.
        path: PathBuf,
        /// What it holds, bytes.
        len: u64,
        /// What the configuration says, bytes.
        size: u64,
    },
    /// A file smaller than the size configured could not be grown.
    #[error("{}: cannot grow to {size} bytes: {source}", path.display())]
    Grow {
        /// The image.
        path: PathBuf,
        /// The size configured, bytes.
        size: u64,
        /// Why.
        source: std::io::Error,
    },
}

impl BackendError {
    /// What went wrong, without whose image it was.
    pub fn cause(&self) -> &BackendError {
        match self {
            BackendError::OfTenant { inner, .. } => inner.cause(),
            other => other,
        }
    }
}

/// What the shared file must hold (its regions' end, at least `size`), and the cache
/// mode its direct descriptor serves (one serves every region that needs one).
fn shared_needs(config: &ServerConfig, size: u64) -> (u64, Cache) {
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
        .max(size);
    let cache = regions
        .map(|t| t.cache)
        .max_by_key(|c| match c {
            Cache::Writeback => 0,
            Cache::None => 1,
            Cache::Pdc => 2,
        })
        .unwrap_or(config.cache);
    (need, cache)
}

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

/// An existing image file holds `size` bytes (a missing one or a block device: nothing
/// to say here).
fn same_size(path: &std::path::Path, size: u64) -> Result<(), BackendError> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() && m.len() != size => Err(BackendError::SizeDiffers {
            path: path.to_path_buf(),
            len: m.len(),
            size,
        }),
        _ => Ok(()),
    }
}

/// Opens (with `create`, creating a sparse file readable by its owner only when missing;
/// without, a missing file is an error naming the setting), locks it
/// for this server alone and makes sure it holds `size` bytes: a regular file smaller
/// than that is grown, a block device must be large enough.
fn open_sized(
    path: &std::path::Path,
    size: u64,
    create: bool,
) -> Result<(File, Option<File>), BackendError> {
    let path_buf = || path.to_path_buf();
    use std::os::unix::fs::OpenOptionsExt;
    // A block device is claimed exclusively (`O_EXCL`): the kernel refuses a second
    // claim under any name, and a mounted device.
    let block = std::fs::metadata(path).is_ok_and(|m| m.file_type().is_block_device());
    let marker = create.then(|| marker_of(path));
    if let Some(marker) = &marker
        && marker.exists()
        && !path.exists()
    {
        return Err(BackendError::Vanished {
            path: path_buf(),
            marker: marker.clone(),
        });
    }
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        // Never with a block device: O_CREAT with O_EXCL fails on any existing name
        // ("File exists"), where O_EXCL alone claims the device.
        .create(create && !block)
        .truncate(false)
        .mode(0o600)
        .custom_flags(if block { libc::O_EXCL } else { 0 })
        .open(path)
        .map_err(|source| {
            if source.kind() == std::io::ErrorKind::NotFound && !create {
                BackendError::Missing { path: path_buf() }
            } else if source.kind() == std::io::ErrorKind::NotFound
                && let Some(folder) = path
                    .parent()
                    .filter(|d| !d.as_os_str().is_empty() && !d.is_dir())
            {
                BackendError::NoFolder {
                    path: path_buf(),
                    folder: folder.to_path_buf(),
                }
            } else if block && source.raw_os_error() == Some(libc::EBUSY) {
                BackendError::Busy { path: path_buf() }
            } else {
                BackendError::Open {
                    path: path_buf(),
                    source,
                }
            }
        })?;
    // An advisory lock: a second server on the same image would overwrite this one's
    // data under its guests.
    if let Err((source, holder)) = lock(&f) {
        return Err(BackendError::Locked {
            path: path_buf(),
            source,
            holder,
        });
    }
    let io = |source| BackendError::Open {
        path: path_buf(),
        source,
    };
    let backing = if block {
        lock_backing_file(path)?
    } else {
        None
    };
    let meta = f.metadata().map_err(io)?;
    let len = if meta.file_type().is_block_device() {
        f.seek(SeekFrom::End(0)).map_err(io)?
    } else {
        meta.len()
    };
    if len < size {
        if meta.file_type().is_block_device() {
            return Err(BackendError::TooSmall {
                path: path_buf(),
                len,
                size,
            });
        }
        f.set_len(size).map_err(|source| BackendError::Grow {
            path: path_buf(),
            size,
            source,
        })?;
    }
    if let Some(marker) = marker
        && meta.file_type().is_file()
        && !marker.exists()
    {
        leave_marker(path, &marker);
    }
    Ok((f, backing))
}

/// Writes `image`'s marker (see [`marker_of`]); a failure is said, not fatal.
fn leave_marker(image: &std::path::Path, marker: &std::path::Path) {
    let text = format!(
        "ioshare served {} here. While this file exists, `create = true` does not create\n\
         an empty image in its place when it is missing (deleted or moved): the server\n\
         refuses to start instead. Delete this file to start over with an empty image.\n",
        image.display()
    );
    if let Err(e) = crate::owned_file::replace(marker, text.as_bytes(), 0o644) {
        tracing::warn!(
            "{}: cannot write {} ({e}): were the image deleted, `create = true` would serve an empty disk in its place",
            image.display(),
            marker.display()
        );
    }
}

/// How long a lock held by another is waited for before the image is refused: a server
/// killed a moment ago still holds its locks until the kernel has torn down its
/// io_uring rings (measured: a restart within ~100 ms of a SIGKILL found the lock held
/// in 9 of 12 tries).
const LOCK_PATIENCE: std::time::Duration = std::time::Duration::from_secs(1);

/// Takes this server's exclusive `flock` on `f` (trying again for [`LOCK_PATIENCE`]);
/// else why, and who holds it.
fn lock(f: &File) -> Result<(), (std::io::Error, String)> {
    let since = std::time::Instant::now();
    let e = loop {
        // SAFETY: plain syscall on a descriptor we own.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EWOULDBLOCK) || since.elapsed() >= LOCK_PATIENCE {
            break e;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let holder = f
        .metadata()
        .ok()
        .and_then(|m| lock_holder(&m))
        .unwrap_or_else(|| "another process".into());
    Err((e, holder))
}

/// For a loop device bound to a file (at any depth: a loop device over a loop device
/// over the file): that file, opened and locked as an image is, so that no server
/// serves the file while another serves a loop device over it.
fn lock_backing_file(device: &std::path::Path) -> Result<Option<File>, BackendError> {
    let id = super::identity::Identity::of(device).map_err(|e| BackendError::Open {
        path: device.to_path_buf(),
        source: std::io::Error::other(e),
    })?;
    let Some(path) = id.backing_file() else {
        return Ok(None);
    };
    let f = File::open(&path).map_err(|source| BackendError::Open {
        path: path.clone(),
        source,
    })?;
    if let Err((source, holder)) = lock(&f) {
        return Err(BackendError::Locked {
            path: device.to_path_buf(),
            source,
            holder: format!("{holder}, through the file behind it, {}", path.display()),
        });
    }
    Ok(Some(f))
}

/// The marker beside an image that `create = true` may create: `.NAME.ioshare` in the
/// image's folder. It outlives the image, so that a deleted or moved image is told from
/// a new one.
pub fn marker_of(path: &std::path::Path) -> PathBuf {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    path.with_file_name(format!(".{name}.ioshare"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_are_created_sparse_and_grown_never_shrunk() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("big.img"), vec![7u8; 3 << 20]).unwrap();
        let text = "[backend]\npath = 'shared.img'\nsize = '1m'\n\
                    [[tenant]]\nname = 'new'\nfile = 'new.img'\ncreate = true\nsize = '2m'\n\
                    [[tenant]]\nname = 'big'\nfile = 'big.img'\nsize = '1m'\nresize = true\n\
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
        assert_eq!(files.targets()[2].unwrap().base(), 4 << 20);
        assert!(
            files.targets()[0].unwrap().file().unwrap().direct.is_none(),
            "writeback: no O_DIRECT"
        );
        files.sync_all().unwrap();
    }

    #[test]
    fn an_image_to_create_in_a_missing_folder_names_the_folder_and_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        let text = "[[tenant]]\nname = 'a'\nfile = 'vms/a.img'\ncreate = true\nsize = '1m'\n";
        let config = ServerConfig::parse(text, dir.path()).unwrap();
        let e = Files::open(&config).err().unwrap();
        let folder = dir.path().join("vms");
        assert!(
            matches!(e.cause(), BackendError::NoFolder { path, folder: f }
                if *path == folder.join("a.img") && *f == folder),
            "{e}"
        );
        assert!(
            e.to_string()
                .ends_with(&format!("not its folders (mkdir -p {})", folder.display())),
            "{e}"
        );
        std::fs::create_dir(&folder).unwrap();
        assert!(Files::open(&config).is_ok());
    }

    /// A size that differs from an existing image's is refused unless the tenant says
    /// `resize = true`; without a size the image is served as it is; a size under a
    /// sector needs its unit.
    #[test]
    fn an_image_is_served_at_its_own_size_unless_resize_is_said() {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("a.img");
        std::fs::File::create(&image)
            .unwrap()
            .set_len(256 << 20)
            .unwrap();
        let open = |tenant: &str| {
            let c = ServerConfig::parse(
                &format!("[[tenant]]\nname = \"a\"\nfile = \"a.img\"\n{tenant}"),
                dir.path(),
            )
            .map_err(|e| e.in_file("serve.toml").to_string())?;
            Files::open(&c)
                .map(|_| c.tenants[0].size)
                .map_err(|e| e.to_string())
        };
        let e = open("size = \"1m\"").unwrap_err();
        assert!(
            e.contains("a.img: holds 256 MiB, but the tenant's size is 1 MiB: leave size out")
                && e.contains("set resize = true"),
            "{e}"
        );
        assert_eq!(
            std::fs::metadata(&image).unwrap().len(),
            256 << 20,
            "untouched"
        );
        assert_eq!(open("size = \"1m\"\nresize = true"), Ok(1 << 20));
        assert_eq!(
            std::fs::metadata(&image).unwrap().len(),
            256 << 20,
            "not shrunk"
        );
        assert_eq!(open(""), Ok(256 << 20));
        assert_eq!(open("size = \"1g\"\nresize = true"), Ok(1 << 30));
        assert_eq!(std::fs::metadata(&image).unwrap().len(), 1 << 30, "grown");
        let e = open("size = 256\nresize = true").unwrap_err();
        assert!(
            e.contains("tenant 1 ('a').size: 256 without a unit is 256 bytes"),
            "{e}"
        );
        let e = ServerConfig::parse(
            "[backend]\npath = \"s.img\"\n[[tenant]]\nname = \"a\"\noffset = 0\nsize = \"4k\"\nresize = true",
            dir.path(),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("resize: applies only to a tenant's own file"),
            "{e}"
        );
    }

    /// An image `create = true` made (or served) leaves a marker; with the image gone
    /// the server refuses to start rather than serve an empty disk in its place, until
    /// the marker is deleted. The shared file, created when missing, is marked too.
    #[test]
    fn a_created_image_that_vanishes_is_not_created_again() {
        let dir = tempfile::tempdir().unwrap();
        let text = "[backend]\npath = 'shared.img'\nsize = '1m'\n\
                    [[tenant]]\nname = 'new'\nfile = 'new.img'\ncreate = true\nsize = '1m'\n\
                    [[tenant]]\nname = 'r'\noffset = 0\nsize = '1m'\n";
        let config = ServerConfig::parse(text, dir.path()).unwrap();
        drop(Files::open(&config).unwrap());
        assert!(dir.path().join(".new.img.ioshare").exists());
        assert!(dir.path().join(".shared.img.ioshare").exists());
        std::fs::remove_file(dir.path().join("new.img")).unwrap();
        let Err(e) = Files::open(&config) else {
            panic!("an empty disk served in place of a deleted one")
        };
        assert!(matches!(e.cause(), BackendError::Vanished { .. }), "{e}");
        assert!(
            e.to_string()
                .contains("new.img: missing, but a server created or served it before"),
            "{e}"
        );
        assert!(!dir.path().join("new.img").exists(), "nothing created");
        std::fs::remove_file(dir.path().join("shared.img")).unwrap();
        std::fs::remove_file(dir.path().join(".new.img.ioshare")).unwrap();
        let Err(e) = Files::open(&config) else {
            panic!("the shared file recreated empty")
        };
        assert!(e.to_string().contains("shared.img: missing"), "{e}");
        std::fs::remove_file(dir.path().join(".shared.img.ioshare")).unwrap();
        drop(Files::open(&config).expect("markers deleted: created anew"));
        assert_eq!(
            std::fs::metadata(dir.path().join("new.img")).unwrap().len(),
            1 << 20
        );
    }
}
