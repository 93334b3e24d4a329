//! Files ioshare writes for itself (the server's pid file, image markers, `--capture`,
//! `govern`'s state), opened so that nothing planted in their place is written through:
//! a symlink at the name is refused (`O_NOFOLLOW`, so a dangling one's target is not
//! created either), as are anything but a regular file (a FIFO would block the opener,
//! a device would be written to) and a file with another hard link (its other name is
//! someone else's file). Folders on the way are the caller's choice and are followed.
//!
//! Two ways to write: [`open`] gives the file itself, for a writer that keeps it open
//! (a lock taken on it first, then written in place — the pid file); [`replace`] writes
//! a whole new file under a fresh name made with `O_EXCL` and renames it over the old
//! one, so a reader never sees half a file and a name planted beside it (`NAME.tmp`) is
//! never opened.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

/// Opens `path` for writing (created with `mode` when missing; not truncated), refusing
/// a symlink, anything but a regular file, and a file with other hard links.
pub fn open(path: &Path, mode: u32) -> std::io::Result<File> {
    let f = OpenOptions::new()
        .write(true)
        .read(true)
        .create(true)
        .truncate(false)
        .mode(mode)
        // Non-blocking so that a FIFO in the file's place is refused, not waited on.
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                refused("a symlink (not written through)")
            } else {
                e
            }
        })?;
    // O_NONBLOCK stays: it changes nothing for a regular file, which is all this is.
    check(&f)?;
    Ok(f)
}

/// Writes `bytes` as the whole of `path`: into a new file beside it (a fresh name,
/// created exclusively, with `mode`), synced, then renamed over `path`. A symlink at
/// `path` is replaced, never followed.
pub fn replace(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| refused("no file name"))?
        .to_string_lossy();
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(".tmp")
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(mode))
        .tempfile_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_data()?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// `f` is a regular file with one name.
fn check(f: &File) -> std::io::Result<()> {
    let meta = f.metadata()?;
    let kind = meta.file_type();
    if !kind.is_file() {
        let what = if kind.is_fifo() {
            "a FIFO"
        } else if kind.is_block_device() || kind.is_char_device() {
            "a device"
        } else if kind.is_socket() {
            "a socket"
        } else {
            "not a regular file"
        };
        return Err(refused(what));
    }
    if meta.nlink() > 1 {
        return Err(refused(
            "a file with another name (a hard link): not written through",
        ));
    }
    Ok(())
}

fn refused(why: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidInput, why.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    #[allow(unsafe_code)]
    fn symlinks_links_and_fifos_are_not_written_through() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        std::fs::write(&target, "precious").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let e = open(&link, 0o644).unwrap_err();
        assert!(e.to_string().contains("a symlink"), "{e}");
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "precious");
        // A dangling symlink's target is not created.
        let dangling = dir.path().join("dangling");
        std::os::unix::fs::symlink(dir.path().join("nowhere"), &dangling).unwrap();
        assert!(open(&dangling, 0o644).is_err());
        assert!(!dir.path().join("nowhere").exists());
        // A hard link to someone's file.
        let hard = dir.path().join("hard");
        std::fs::hard_link(&target, &hard).unwrap();
        let e = open(&hard, 0o644).unwrap_err();
        assert!(e.to_string().contains("hard link"), "{e}");
        // A FIFO is refused at once, not waited on.
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = open(&fifo, 0o644).unwrap_err();
        assert!(
            e.to_string().contains("FIFO") || e.raw_os_error() == Some(libc::ENXIO),
            "{e}"
        );
        // A plain new file is made, and an existing one is opened without truncation.
        let plain = dir.path().join("plain");
        let mut f = open(&plain, 0o600).unwrap();
        f.write_all(b"abc").unwrap();
        drop(f);
        let mut text = String::new();
        open(&plain, 0o600)
            .unwrap()
            .read_to_string(&mut text)
            .unwrap();
        assert_eq!(text, "abc");
    }

    #[test]
    fn a_replacement_never_follows_a_planted_name() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        std::fs::write(&target, "precious").unwrap();
        let state = dir.path().join("state.json");
        // The old way's temporary name, planted.
        std::os::unix::fs::symlink(&target, dir.path().join("state.tmp")).unwrap();
        replace(&state, b"one", 0o600).unwrap();
        assert_eq!(std::fs::read_to_string(&state).unwrap(), "one");
        // A symlink at the name itself is replaced, not followed.
        std::fs::remove_file(&state).unwrap();
        std::os::unix::fs::symlink(&target, &state).unwrap();
        replace(&state, b"two", 0o600).unwrap();
        assert_eq!(std::fs::read_to_string(&state).unwrap(), "two");
        assert!(!std::fs::symlink_metadata(&state).unwrap().is_symlink());
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "precious");
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .filter(|n| n.ends_with(".tmp") && n != "state.tmp")
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }
}
