//! What identifies an image however it is named and however deep it sits, so that two
//! claims on the same bytes are refused: a file by its device and inode (hard links,
//! other spellings, symlinks); a block device by its device number (a `mknod` alias is
//! the same device), followed down the whole stack below it — a partition to its whole
//! disk, a device-mapper or md volume to the devices it is made of
//! (`/sys/dev/block/M:m/slaves`), a loop device to what it is bound to
//! (`LOOP_GET_STATUS64`: the backing file's device and inode, which stay right when the
//! file is renamed), and that again, to any depth: a loop device over a loop device
//! over a file is that file. A file is followed to the device its file system lives
//! on, so an image inside a file system mounted from another tenant's image is seen
//! too. A path that does not exist yet (an image `create = true` will make) is its
//! folder's canonical path and its name.
//!
//! Two images overlap when what one *is* lies anywhere below the other. What an image
//! is: itself and, through loop devices, what they are bound to (a loop device is all
//! of its backing file here). What lies below it: that, and through partitions and
//! volumes, the disks and devices they are *part of*. So a disk and its partition
//! overlap, two partitions of one disk do not, two loop devices over one file do, and
//! two logical volumes on one physical volume do not (each is part of it) — while
//! either overlaps the physical volume itself.
//!
//! Readings: a loop device's offset is not looked at (a loop device over part of a
//! file overlaps the whole file: refused, when it need not be); device-mapper tables
//! are not read (a volume is part of each device below it). What cannot be resolved is
//! refused, not guessed: a loop device whose backing file is gone (deleted, or its path
//! no longer names it while it is a device node whose device must be followed), a
//! stack deeper than [`MAX_DEPTH`].

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// The loop driver's block major number.
const LOOP_MAJOR: u32 = 7;
/// `LOOP_GET_STATUS64` (linux/loop.h).
const LOOP_GET_STATUS64: libc::c_ulong = 0x4C05;
/// Layers followed below an image at most (a loop over a volume over a partition …).
pub const MAX_DEPTH: usize = 16;

/// `struct loop_info64` (linux/loop.h); only the backing file's fields are read.
#[repr(C)]
#[allow(dead_code)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; 64],
    lo_crypt_name: [u8; 64],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
}

/// One thing bytes live in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Atom {
    /// A file: its file system's device and its inode.
    File {
        /// `st_dev`.
        dev: u64,
        /// `st_ino`.
        ino: u64,
    },
    /// A block device, by its number.
    Device(u64),
    /// Not there yet: the canonical folder and the name.
    Path(PathBuf),
}

/// What an image is, and everything below it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// What it is: itself, and what its loop devices are bound to, all the way down.
    is: Vec<Atom>,
    /// What its bytes lie in: `is`, and the disks and devices it is part of.
    within: Vec<Atom>,
    /// The innermost regular file of a loop device's chain, by a path that names it
    /// now: the file to lock beside the device.
    backing_file: Option<PathBuf>,
}

/// Why an image's stack could not be followed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unresolved(pub String);

impl Identity {
    /// The identity of what `path` names (symlinks followed), with the whole stack
    /// below it.
    pub fn of(path: &Path) -> Result<Identity, Unresolved> {
        let Ok(meta) = std::fs::metadata(path) else {
            let name = path.file_name().map(PathBuf::from).unwrap_or_default();
            let folder = path
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            let atom = Atom::Path(
                folder
                    .canonicalize()
                    .unwrap_or_else(|_| folder.to_path_buf())
                    .join(name),
            );
            return Ok(Identity {
                is: vec![atom.clone()],
                within: vec![atom],
                backing_file: None,
            });
        };
        let mut walk = Walk::default();
        if meta.file_type().is_block_device() {
            walk.device(meta.rdev(), true, 0)?;
        } else {
            walk.file(&meta, true, 0)?;
        }
        Ok(Identity {
            is: walk.is,
            within: walk.within,
            backing_file: walk.backing_file,
        })
    }

    /// An identity made of these parts: what it is and what it is part of.
    #[cfg(test)]
    pub fn of_parts(is: Vec<Atom>, part_of: Vec<Atom>) -> Identity {
        let mut within = is.clone();
        within.extend(part_of);
        Identity {
            is,
            within,
            backing_file: None,
        }
    }

    /// Whether the two share bytes: what either is lies within the other.
    pub fn overlaps(&self, other: &Identity) -> bool {
        self.is.iter().any(|a| other.within.contains(a))
            || other.is.iter().any(|a| self.within.contains(a))
    }

    /// For a loop device (at any depth) bound to a file: that file's path, as the loop
    /// driver tells it, checked to name the same file.
    pub fn backing_file(&self) -> Option<PathBuf> {
        self.backing_file.clone()
    }
}

/// The stack below one image, as it is followed.
#[derive(Default)]
struct Walk {
    is: Vec<Atom>,
    within: Vec<Atom>,
    backing_file: Option<PathBuf>,
}

impl Walk {
    /// Adds `atom`: what the image is (`whole`) or what it is part of. Answers whether
    /// it was new (a stack seen twice is followed once).
    fn add(&mut self, atom: Atom, whole: bool) -> bool {
        if whole && !self.is.contains(&atom) {
            self.is.push(atom.clone());
        }
        if self.within.contains(&atom) {
            return false;
        }
        self.within.push(atom);
        true
    }

    fn deeper(depth: usize) -> Result<usize, Unresolved> {
        if depth >= MAX_DEPTH {
            return Err(Unresolved(format!(
                "more than {MAX_DEPTH} layers of devices below it: not followed"
            )));
        }
        Ok(depth + 1)
    }

    /// A regular file (or anything not a block device) and the device its file system
    /// is on (part of it).
    fn file(
        &mut self,
        meta: &std::fs::Metadata,
        whole: bool,
        depth: usize,
    ) -> Result<(), Unresolved> {
        let atom = Atom::File {
            dev: meta.dev(),
            ino: meta.ino(),
        };
        if !self.add(atom, whole) {
            return Ok(());
        }
        // Anonymous devices (tmpfs, FUSE, overlay) have no block device to follow.
        if sysfs(meta.dev()).exists() {
            self.device(meta.dev(), false, Self::deeper(depth)?)?;
        }
        Ok(())
    }

    /// Block device `rdev`, what it is bound to, and what it is part of.
    fn device(&mut self, rdev: u64, whole: bool, depth: usize) -> Result<(), Unresolved> {
        if !self.add(Atom::Device(rdev), whole) {
            return Ok(());
        }
        let dir = sysfs(rdev);
        let next = Self::deeper(depth)?;
        // A partition is part of its whole disk.
        if dir.join("partition").exists()
            && let Some(disk) = dev_file(&dir.join("..").join("dev"))
        {
            self.device(disk, false, next)?;
        }
        // A volume is part of each device it is made of.
        if let Ok(slaves) = std::fs::read_dir(dir.join("slaves")) {
            for slave in slaves.flatten() {
                if let Some(below) = dev_file(&slave.path().join("dev")) {
                    self.device(below, false, next)?;
                }
            }
        }
        if libc::major(rdev) == LOOP_MAJOR && !dir.join("partition").exists() {
            self.loop_backing(rdev, whole, next)?;
        }
        Ok(())
    }

    /// What loop device `rdev` is bound to (nothing, when unbound).
    fn loop_backing(&mut self, rdev: u64, whole: bool, depth: usize) -> Result<(), Unresolved> {
        let name = || format!("loop device {}:{}", libc::major(rdev), libc::minor(rdev));
        let Some((dev, ino)) =
            loop_status(rdev).map_err(|e| Unresolved(format!("{}: {e}", name())))?
        else {
            return Ok(());
        };
        let atom = Atom::File { dev, ino };
        // The path the driver gives, when it still names the file bound.
        let text = std::fs::read_to_string(sysfs(rdev).join("loop").join("backing_file"))
            .unwrap_or_default();
        let path = PathBuf::from(text.trim_end_matches('\n'));
        let meta = std::fs::metadata(&path)
            .ok()
            .filter(|m| (m.dev(), m.ino()) == (dev, ino));
        match meta {
            Some(m) if m.file_type().is_block_device() => {
                // Bound to a device node: what counts is the device it names.
                self.add(atom, whole);
                self.device(m.rdev(), whole, depth)
            }
            Some(m) => {
                if m.is_file() && self.backing_file.is_none() {
                    self.backing_file = Some(path);
                }
                self.file(&m, whole, depth)
            }
            None => Err(Unresolved(format!(
                "{} is bound to a file that no path names any more ({}): cannot tell what it holds",
                name(),
                if text.trim().is_empty() {
                    "the driver gives none".to_string()
                } else {
                    text.trim().to_string()
                }
            ))),
        }
    }
}

/// `/sys/dev/block/M:m`.
fn sysfs(rdev: u64) -> PathBuf {
    PathBuf::from(format!(
        "/sys/dev/block/{}:{}",
        libc::major(rdev),
        libc::minor(rdev)
    ))
}

/// A sysfs `dev` file's `M:m`, as a device number.
fn dev_file(path: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    let (major, minor) = text.trim().split_once(':')?;
    Some(libc::makedev(major.parse().ok()?, minor.parse().ok()?))
}

/// The file loop device `rdev` is bound to (its device and inode), asked of the device
/// itself; `None` when it is not bound.
fn loop_status(rdev: u64) -> Result<Option<(u64, u64)>, String> {
    use std::os::fd::AsRawFd;
    let uevent = std::fs::read_to_string(sysfs(rdev).join("uevent"))
        .map_err(|e| format!("its sysfs entry: {e}"))?;
    let name = uevent
        .lines()
        .find_map(|l| l.strip_prefix("DEVNAME="))
        .ok_or("no DEVNAME in its uevent")?;
    let dev =
        std::fs::File::open(format!("/dev/{name}")).map_err(|e| format!("/dev/{name}: {e}"))?;
    // SAFETY: all-zero bytes are a valid loop_info64 (integers and byte arrays).
    let mut info: LoopInfo64 = unsafe { std::mem::zeroed() };
    // SAFETY: the ioctl writes a loop_info64 into `info`, which lives through the call.
    let r = unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_GET_STATUS64 as _, &mut info) };
    if r == 0 {
        return Ok(Some((info.lo_device, info.lo_inode)));
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        // Not bound to anything.
        Some(libc::ENXIO) => Ok(None),
        _ => Err(format!("LOOP_GET_STATUS64: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_known_by_inode() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.img");
        std::fs::write(&a, b"x").unwrap();
        std::fs::write(dir.path().join("other.img"), b"y").unwrap();
        std::fs::hard_link(&a, dir.path().join("b.img")).unwrap();
        std::os::unix::fs::symlink(&a, dir.path().join("c.img")).unwrap();
        let of = |name: &str| Identity::of(&dir.path().join(name)).unwrap();
        let id = of("a.img");
        assert!(id.overlaps(&of("b.img")));
        assert!(id.overlaps(&of("c.img")));
        assert!(id.overlaps(&of("./a.img")));
        assert!(
            !id.overlaps(&of("other.img")),
            "two files of one file system"
        );
        let missing = of("new.img");
        assert!(missing.overlaps(&of("./new.img")));
        assert!(!missing.overlaps(&id));
    }

    /// The rule on stacks, with made-up parts: what one is lies within the other.
    #[test]
    fn stacks_overlap_where_what_one_is_lies_below_the_other() {
        let file = Atom::File { dev: 1, ino: 2 };
        let (disk, p1, p2) = (Atom::Device(10), Atom::Device(11), Atom::Device(12));
        let part = |p: &Atom| Identity::of_parts(vec![p.clone()], vec![disk.clone()]);
        let whole_disk = Identity::of_parts(vec![disk.clone()], vec![]);
        assert!(whole_disk.overlaps(&part(&p1)) && part(&p1).overlaps(&whole_disk));
        assert!(
            !part(&p1).overlaps(&part(&p2)),
            "two partitions of one disk"
        );
        // Loop devices are what they are bound to.
        let on_file = |n: u64| Identity::of_parts(vec![Atom::Device(n), file.clone()], vec![]);
        let the_file = Identity::of_parts(vec![file.clone()], vec![]);
        assert!(on_file(20).overlaps(&the_file) && the_file.overlaps(&on_file(20)));
        assert!(on_file(20).overlaps(&on_file(21)), "two loops on one file");
        // A loop over a loop over the file: the chain is followed.
        let chain = Identity::of_parts(
            vec![Atom::Device(22), Atom::Device(20), file.clone()],
            vec![],
        );
        assert!(chain.overlaps(&the_file) && chain.overlaps(&on_file(20)));
        // Two volumes on one physical volume, each part of it.
        let lv = |n: u64| Identity::of_parts(vec![Atom::Device(n)], vec![p1.clone(), disk.clone()]);
        assert!(!lv(30).overlaps(&lv(31)));
        assert!(lv(30).overlaps(&part(&p1)) && lv(30).overlaps(&whole_disk));
        assert!(!lv(30).overlaps(&part(&p2)));
    }
}
