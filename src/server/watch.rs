//! The served images, watched from outside: an image deleted while served (no name
//! links to it any more) keeps taking writes that are lost once the server stops, and
//! a name that now leads to another file (renamed over, recreated) is not the disk
//! being served. Neither stops the server — its guests go on with the file it opened —
//! but both are logged once when they happen, with what to do, and once more when the
//! name leads back to the served file.
//!
//! Regular files only: a block device's node can be removed without touching its data.
//! [`Watch::spawn`] looks every [`Watch::EVERY`] on a thread of its own: looking at an
//! image on a hung file system (a FUSE daemon busy with that image) blocks, and nothing
//! else may wait for it.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// What a name and its served file were last seen as.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Seen {
    Served,
    Deleted,
    Replaced,
}

struct Image {
    /// Whose: a tenant's name, or `backend.path`.
    who: String,
    path: PathBuf,
    file: File,
    dev: u64,
    ino: u64,
    seen: Seen,
}

/// The images being watched.
pub struct Watch {
    images: Vec<Image>,
    last: Option<Instant>,
}

impl Watch {
    /// How often the images are looked at.
    pub const EVERY: Duration = Duration::from_secs(1);

    /// Watches `files`: (whose, its path, the open file). Files that are not regular
    /// files, or whose descriptor cannot be duplicated, are left out.
    pub fn new(files: Vec<(String, PathBuf, &File)>) -> Watch {
        let images = files
            .into_iter()
            .filter_map(|(who, path, f)| {
                let meta = f.metadata().ok()?;
                if !meta.file_type().is_file() {
                    return None;
                }
                Some(Image {
                    who,
                    path,
                    file: f.try_clone().ok()?,
                    dev: meta.dev(),
                    ino: meta.ino(),
                    seen: Seen::Served,
                })
            })
            .collect();
        Watch { images, last: None }
    }

    /// Looks at the images every [`Watch::EVERY`] on a thread of its own, for as long as
    /// the process runs, printing what changed; nothing to watch, no thread.
    pub fn spawn(mut self) {
        if self.images.is_empty() {
            return;
        }
        let started = std::thread::Builder::new()
            .name("watch".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(Self::EVERY);
                    for line in self.check(Instant::now()) {
                        super::logs::warn_line(&line);
                    }
                }
            });
        if let Err(e) = started {
            tracing::warn!("cannot start the thread that watches the images: {e}");
        }
    }

    /// Looks at the images if [`Watch::EVERY`] has passed since the last look; returns
    /// a line for each that changed.
    pub fn check(&mut self, now: Instant) -> Vec<String> {
        if self
            .last
            .is_some_and(|l| now.duration_since(l) < Self::EVERY)
        {
            return Vec::new();
        }
        self.last = Some(now);
        let mut lines = Vec::new();
        for i in &mut self.images {
            let seen = match i.file.metadata() {
                Ok(m) if m.nlink() == 0 => Seen::Deleted,
                _ => match std::fs::metadata(&i.path) {
                    Ok(m) if (m.dev(), m.ino()) == (i.dev, i.ino) => Seen::Served,
                    // Missing with links left: moved to another name, still on disk.
                    Err(_) => Seen::Served,
                    Ok(_) => Seen::Replaced,
                },
            };
            if seen == i.seen {
                continue;
            }
            i.seen = seen;
            let fd = format!("/proc/{}/fd/{}", std::process::id(), i.file.as_raw_fd());
            lines.push(match seen {
                Seen::Deleted => format!(
                    "ioshare: {}: its image {} was deleted while served: writes go on to the deleted file and are lost when the server stops; copy it back first (cp --sparse=always {fd} {})",
                    i.who,
                    i.path.display(),
                    i.path.display()
                ),
                Seen::Replaced => format!(
                    "ioshare: {}: {} is now another file than the image served (renamed over or recreated); the server goes on with the file it opened ({fd}), the new one is not served",
                    i.who,
                    i.path.display()
                ),
                Seen::Served => format!(
                    "ioshare: {}: {} is the served image again",
                    i.who,
                    i.path.display()
                ),
            });
        }
        lines
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deletion_and_replacement_are_told_once_each() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vm.img");
        std::fs::write(&path, b"data").unwrap();
        let f = File::open(&path).unwrap();
        let mut w = Watch::new(vec![("vm".into(), path.clone(), &f)]);
        let t = Instant::now();
        assert!(w.check(t).is_empty(), "nothing changed");
        // Another file renamed over the name.
        let other = dir.path().join("other.img");
        std::fs::write(&other, b"new").unwrap();
        let moved = dir.path().join("kept.img");
        std::fs::hard_link(&path, &moved).unwrap();
        std::fs::rename(&other, &path).unwrap();
        assert!(w.check(t).is_empty(), "not looked again within a second");
        let t = t + Watch::EVERY;
        let lines = w.check(t);
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0].contains("is now another file than the image served"),
            "{}",
            lines[0]
        );
        let t = t + Watch::EVERY;
        assert!(w.check(t).is_empty(), "told once");
        // The served file's last name goes: deleted.
        std::fs::remove_file(&moved).unwrap();
        let t = t + Watch::EVERY;
        let lines = w.check(t);
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0].contains("was deleted while served"),
            "{}",
            lines[0]
        );
        assert!(
            lines[0].contains("cp --sparse=always /proc/"),
            "{}",
            lines[0]
        );
        let t = t + Watch::EVERY;
        assert!(w.check(t).is_empty(), "told once");
    }

    #[test]
    fn a_file_moved_back_is_told_as_served_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vm.img");
        std::fs::write(&path, b"data").unwrap();
        let f = File::open(&path).unwrap();
        let mut w = Watch::new(vec![("vm".into(), path.clone(), &f)]);
        let t = Instant::now();
        let aside = dir.path().join("aside.img");
        std::fs::write(&aside, b"other").unwrap();
        std::fs::rename(&path, dir.path().join("real.img")).unwrap();
        std::fs::rename(&aside, &path).unwrap();
        assert_eq!(w.check(t).len(), 1, "replaced");
        std::fs::rename(dir.path().join("real.img"), &path).unwrap();
        let lines = w.check(t + Watch::EVERY);
        assert_eq!(
            lines,
            vec![format!(
                "ioshare: vm: {} is the served image again",
                path.display()
            )]
        );
    }
}
