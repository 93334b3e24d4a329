//! What identifies an image however it is named, so that two claims on the same bytes
//! are refused: a file by its device and inode (hard links, other spellings, symlinks);
//! a block device by its device number (a `mknod` alias is the same device), a
//! partition together with its whole disk, and a loop device together with the file
//! behind it (`LOOP_GET_STATUS64`: the backing file's device and inode, which stay right
//! when the file is renamed). A path that does not exist yet (an image `create = true`
//! will make) is its folder's canonical path and its name.
//!
//! What it does not see: device-mapper and LVM volumes (a logical volume and its
//! physical volume are different devices here), and a loop device's offset (a loop
//! device over part of a file overlaps the whole file here: refused, when it need not
//! be).

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// The loop driver's block major number.
const LOOP_MAJOR: u32 = 7;
/// `LOOP_GET_STATUS64` (linux/loop.h).
const LOOP_GET_STATUS64: libc::c_ulong = 0x4C05;

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

/// What an image is.
#[derive(Clone, Debug, PartialEq)]
pub enum Identity {
    /// A file: its file system's device and its inode.
    File {
        /// `st_dev`.
        dev: u64,
        /// `st_ino`.
        ino: u64,
    },
    /// A block device.
    Block {
        /// Its device number (`st_rdev`).
        rdev: u64,
        /// The whole disk's device number (its own when it is not a partition).
        disk: u64,
        /// For a loop device (or a partition of one) bound to a file: that file's
        /// device and inode.
        backing: Option<(u64, u64)>,
    },
    /// Not there yet: the canonical folder and the name.
    Path(PathBuf),
}

impl Identity {
    /// The identity of what `path` names (symlinks followed).
    pub fn of(path: &Path) -> Identity {
        let Ok(meta) = std::fs::metadata(path) else {
            let name = path.file_name().map(PathBuf::from).unwrap_or_default();
            let folder = path
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            return Identity::Path(
                folder
                    .canonicalize()
                    .unwrap_or_else(|_| folder.to_path_buf())
                    .join(name),
            );
        };
        if !meta.file_type().is_block_device() {
            return Identity::File {
                dev: meta.dev(),
                ino: meta.ino(),
            };
        }
        let rdev = meta.rdev();
        let disk = whole_disk(rdev).unwrap_or(rdev);
        let backing = (libc::major(disk) == LOOP_MAJOR)
            .then(|| loop_backing(disk))
            .flatten();
        Identity::Block {
            rdev,
            disk,
            backing,
        }
    }

    /// Whether the two share bytes.
    pub fn overlaps(&self, other: &Identity) -> bool {
        use Identity::*;
        match (self, other) {
            (File { dev, ino }, Block { backing, .. })
            | (Block { backing, .. }, File { dev, ino }) => *backing == Some((*dev, *ino)),
            (
                Block {
                    rdev: r1,
                    disk: d1,
                    backing: b1,
                },
                Block {
                    rdev: r2,
                    disk: d2,
                    backing: b2,
                },
            ) => {
                // The same device, a disk and its partition, two loop devices on one file.
                r1 == r2 || r1 == d2 || r2 == d1 || (b1.is_some() && b1 == b2)
            }
            (a, b) => a == b,
        }
    }

    /// For a loop device bound to a file: that file's path, as the loop driver tells it
    /// (`/sys/dev/block/M:m/loop/backing_file`), when it still names the same file.
    pub fn backing_file(&self) -> Option<PathBuf> {
        let Identity::Block {
            disk,
            backing: Some((dev, ino)),
            ..
        } = self
        else {
            return None;
        };
        let text = std::fs::read_to_string(format!(
            "/sys/dev/block/{}:{}/loop/backing_file",
            libc::major(*disk),
            libc::minor(*disk)
        ))
        .ok()?;
        let path = PathBuf::from(text.trim_end_matches('\n'));
        let meta = std::fs::metadata(&path).ok()?;
        ((meta.dev(), meta.ino()) == (*dev, *ino)).then_some(path)
    }
}

/// The whole disk a partition belongs to (the sysfs folder [`crate::target::disk_dir`]
/// finds); `None` for a whole disk or where sysfs cannot tell.
fn whole_disk(rdev: u64) -> Option<u64> {
    let text = std::fs::read_to_string(crate::target::disk_dir(rdev).ok()?.join("dev")).ok()?;
    let (major, minor) = text.trim().split_once(':')?;
    let disk = libc::makedev(major.parse().ok()?, minor.parse().ok()?);
    (disk != rdev).then_some(disk)
}

/// The file behind loop device `rdev` (its device and inode), asked of the device
/// itself; `None` when it is not bound or cannot be opened.
fn loop_backing(rdev: u64) -> Option<(u64, u64)> {
    use std::os::fd::AsRawFd;
    let node = format!(
        "/sys/dev/block/{}:{}/uevent",
        libc::major(rdev),
        libc::minor(rdev)
    );
    let uevent = std::fs::read_to_string(node).ok()?;
    let name = uevent.lines().find_map(|l| l.strip_prefix("DEVNAME="))?;
    let dev = std::fs::File::open(format!("/dev/{name}")).ok()?;
    // SAFETY: all-zero bytes are a valid loop_info64 (integers and byte arrays).
    let mut info: LoopInfo64 = unsafe { std::mem::zeroed() };
    // SAFETY: the ioctl writes a loop_info64 into `info`, which lives through the call.
    let r = unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_GET_STATUS64 as _, &mut info) };
    (r == 0).then_some((info.lo_device, info.lo_inode))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_known_by_inode_and_blocks_by_device() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.img");
        std::fs::write(&a, b"x").unwrap();
        std::fs::hard_link(&a, dir.path().join("b.img")).unwrap();
        std::os::unix::fs::symlink(&a, dir.path().join("c.img")).unwrap();
        let id = Identity::of(&a);
        assert!(id.overlaps(&Identity::of(&dir.path().join("b.img"))));
        assert!(id.overlaps(&Identity::of(&dir.path().join("c.img"))));
        assert!(id.overlaps(&Identity::of(&dir.path().join(".").join("a.img"))));
        let missing = Identity::of(&dir.path().join("new.img"));
        assert!(missing.overlaps(&Identity::of(&dir.path().join("./new.img"))));
        assert!(!missing.overlaps(&id));
        let File { dev, ino } = id else {
            panic!("{id:?}")
        };
        use Identity::*;
        let disk = Block {
            rdev: 10,
            disk: 10,
            backing: None,
        };
        let part = |n: u64| Block {
            rdev: 10 + n,
            disk: 10,
            backing: None,
        };
        assert!(disk.overlaps(&part(1)) && part(1).overlaps(&disk));
        assert!(!part(1).overlaps(&part(2)), "two partitions of one disk");
        let on_file = |rdev| Block {
            rdev,
            disk: rdev,
            backing: Some((dev, ino)),
        };
        assert!(on_file(20).overlaps(&id) && id.overlaps(&on_file(20)));
        assert!(
            on_file(20).overlaps(&on_file(21)),
            "two loop devices on one file"
        );
        assert!(!on_file(20).overlaps(&disk));
    }
}
