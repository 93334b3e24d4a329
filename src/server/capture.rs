//! `serve --capture FILE`: every tenant's request stream, as it arrives, in fio's iolog
//! version 3 format ([`crate::iolog`]), one file name per export. The engine formats
//! lines; a thread of its own writes them, so a slow disk under the capture file does
//! not stall the device loop.
//!
//! Bounded: the file stops growing at its limit (`--capture-limit`), and lines the
//! writer has not caught up with are held up to [`PENDING_LIMIT`]; past either, lines
//! are counted as lost, said once in the log when it starts and in the closing line.
//! Lines reach the writer every 256 KiB and at least every tenth of a second (the
//! engine calls [`Capture::flush`]); a server killed with SIGKILL loses what it held
//! since, at most that tenth of a second.

use crate::iolog::{self, Action, Entry};
use crate::nbd::CommandKind;
use crate::types::Nanos;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};

/// Formatted lines held while the writer is behind, bytes.
pub const PENDING_LIMIT: usize = 16 << 20;
/// Lines are handed to the writer in chunks of about this many bytes.
const CHUNK: usize = 256 << 10;

/// Why the capture could not start or finish.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// The file could not be created.
    #[error("--capture: cannot create {}: {source}", path.display())]
    Create {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Writing it failed.
    #[error("--capture: writing {}: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Its writer thread could not be started.
    #[error("--capture: cannot start its writer: {0}")]
    Thread(std::io::Error),
    /// The writer thread panicked.
    #[error("--capture: the writer thread panicked")]
    WriterPanicked,
}

/// A request as it arrived, what the capture writes of it.
#[derive(Debug, Clone, Copy)]
pub struct Arrival {
    /// When (nanoseconds since the server started).
    pub at: Nanos,
    /// Whose.
    pub tenant: usize,
    /// What it does.
    pub action: Action,
    /// With FUA.
    pub fua: bool,
    /// A zeroing write.
    pub zero: bool,
    /// Byte offset in the export.
    pub offset: u64,
    /// Bytes.
    pub len: u32,
}

impl Arrival {
    /// The arrival of a request of `tenant` at `at`.
    pub fn of(at: Nanos, tenant: usize, kind: &CommandKind, offset: u64, len: u32) -> Self {
        let (action, fua, zero) = match kind {
            CommandKind::Read => (Action::Read, false, false),
            CommandKind::Write { fua, .. } => (Action::Write, *fua, false),
            CommandKind::WriteZeroes { fua, .. } => (Action::Write, *fua, true),
            CommandKind::Trim { fua } => (Action::Trim, *fua, false),
            CommandKind::Flush => (Action::Datasync, false, false),
        };
        Arrival {
            at,
            tenant,
            action,
            fua,
            zero,
            offset,
            len,
        }
    }
}

/// The capture of one server run.
pub struct Capture {
    path: PathBuf,
    files: Vec<String>,
    /// Lines formatted and not yet handed to the writer.
    pending: String,
    tx: Option<SyncSender<String>>,
    writer: Option<std::thread::JoinHandle<std::io::Result<()>>>,
    /// Bytes handed to the writer (the header included).
    bytes: u64,
    limit: u64,
    lines: u64,
    lost: u64,
}

impl Capture {
    /// Creates (or truncates) `path` and starts its writer; `names` are the exports in
    /// tenant order. The file holds at most `limit` bytes. A symlink, a hard link or
    /// anything but a plain file at `path` is refused ([`crate::owned_file::open`]).
    pub fn open(path: &Path, names: &[String], limit: u64) -> Result<Capture, CaptureError> {
        let create = |source| CaptureError::Create {
            path: path.into(),
            source,
        };
        let file = crate::owned_file::open(path, 0o644).map_err(create)?;
        file.set_len(0).map_err(create)?;
        let mut files: Vec<String> = Vec::new();
        for (i, n) in names.iter().enumerate() {
            let mut f = iolog::file_name(n, i);
            // Two exports cannot share a file name in the log.
            if files.contains(&f) {
                f = format!("tenant{}", i + 1);
            }
            let mut k = 1;
            while files.contains(&f) {
                f = format!("tenant{}-{k}", i + 1);
                k += 1;
            }
            files.push(f);
        }
        let (tx, rx) = sync_channel::<String>(8);
        let writer = std::thread::Builder::new()
            .name("capture".into())
            .spawn(move || write_all(file, rx))
            .map_err(CaptureError::Thread)?;
        let mut c = Capture {
            path: path.to_path_buf(),
            pending: iolog::start(&files),
            files,
            tx: Some(tx),
            writer: Some(writer),
            bytes: 0,
            limit,
            lines: 0,
            lost: 0,
        };
        c.hand_over(true);
        Ok(c)
    }

    /// A tenant added while running (`add-tenant`): its file is added to the log at
    /// `now`, under the next tenant number.
    pub fn add(&mut self, name: &str, now: Nanos) {
        let i = self.files.len();
        let mut f = iolog::file_name(name, i);
        let mut k = 1;
        while self.files.contains(&f) {
            f = format!("tenant{}-{k}", i + 1);
            k += 1;
        }
        let at = now / 1000;
        self.pending
            .push_str(&format!("{at} {f} add\n{at} {f} open\n"));
        self.files.push(f);
    }

    /// Records a request's arrival.
    pub fn record(&mut self, a: &Arrival) {
        let full = self.bytes + self.pending.len() as u64 >= self.limit
            || self.pending.len() >= PENDING_LIMIT;
        if full {
            if self.lost == 0 {
                tracing::warn!(
                    "--capture: {} reached its limit ({} in the file, {} waiting for the disk); further requests are counted, not written",
                    self.path.display(),
                    crate::units::format_bytes(self.bytes + self.pending.len() as u64),
                    crate::units::format_bytes(self.pending.len() as u64)
                );
            }
            self.lost += 1;
            return;
        }
        iolog::push(
            &mut self.pending,
            &Entry {
                time_us: a.at / 1000,
                file: self.files[a.tenant].clone(),
                action: a.action,
                offset: a.offset,
                len: u64::from(a.len),
                fua: a.fua,
                zero: a.zero,
            },
        );
        self.lines += 1;
        if self.pending.len() >= CHUNK {
            self.hand_over(false);
        }
    }

    /// Whether lines wait to be handed to the writer.
    pub fn holds_lines(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Hands what is pending to the writer if it has room (the engine calls this every
    /// tenth of a second).
    pub fn flush(&mut self) {
        if !self.pending.is_empty() {
            self.hand_over(false);
        }
    }

    /// Hands the pending lines to the writer; without `wait`, only if it has room.
    fn hand_over(&mut self, wait: bool) {
        let Some(tx) = &self.tx else { return };
        let chunk = std::mem::take(&mut self.pending);
        let n = chunk.len() as u64;
        let sent = if wait {
            tx.send(chunk).map_err(|e| e.0)
        } else {
            tx.try_send(chunk).map_err(|e| match e {
                TrySendError::Full(c) | TrySendError::Disconnected(c) => c,
            })
        };
        match sent {
            Ok(()) => self.bytes += n,
            Err(chunk) => self.pending = chunk,
        }
    }

    /// Writes what is pending and the `close` lines at `now`, waits for the writer and
    /// says what the file holds.
    pub fn finish(mut self, now: Nanos) -> Result<(), CaptureError> {
        let close = iolog::finish(&self.files, now / 1000);
        self.pending.push_str(&close);
        self.hand_over(true);
        drop(self.tx.take());
        let written = self
            .writer
            .take()
            .expect("joined once")
            .join()
            .map_err(|_| CaptureError::WriterPanicked)?;
        written.map_err(|source| CaptureError::Write {
            path: self.path.clone(),
            source,
        })?;
        tracing::info!(
            "--capture: {} requests in {} ({}){}",
            self.lines,
            self.path.display(),
            crate::units::format_bytes(self.bytes),
            if self.lost > 0 {
                format!("; {} requests after the limit were not written", self.lost)
            } else {
                String::new()
            }
        );
        Ok(())
    }

    /// Requests recorded so far and requests lost to the limits.
    #[cfg(test)]
    pub fn counts(&self) -> (u64, u64) {
        (self.lines, self.lost)
    }
}

fn write_all(file: std::fs::File, rx: Receiver<String>) -> std::io::Result<()> {
    let mut out = std::io::BufWriter::new(file);
    for chunk in rx {
        out.write_all(chunk.as_bytes())?;
        // In the file, not in this buffer, should the server be killed.
        out.flush()?;
    }
    out.flush()?;
    out.into_inner().map_err(|e| e.into_error())?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buffer::IoBuf;

    #[test]
    fn a_capture_is_an_iolog_and_stops_at_its_limit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cap.log");
        let names = vec![
            "a".to_string(),
            "has space".to_string(),
            "tenant2".to_string(),
        ];
        let mut c = Capture::open(&path, &names, 400).unwrap();
        let write = CommandKind::Write {
            data: IoBuf::zeroed(4096),
            fua: true,
        };
        c.record(&Arrival::of(1_500_000, 0, &write, 8192, 4096));
        c.record(&Arrival::of(2_000_000, 1, &CommandKind::Flush, 0, 0));
        c.record(&Arrival::of(
            2_100_000,
            1,
            &CommandKind::WriteZeroes {
                fua: false,
                fast: false,
            },
            0,
            65536,
        ));
        for i in 0..100 {
            c.record(&Arrival::of(
                3_000_000 + i,
                0,
                &CommandKind::Read,
                i * 4096,
                4096,
            ));
        }
        let (lines, lost) = c.counts();
        assert!(lost > 0, "the limit was reached");
        assert_eq!(lines + lost, 103, "every request is written or counted");
        c.finish(9_000_000).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let entries = iolog::parse(&text).unwrap();
        assert_eq!(entries.len() as u64, lines);
        assert_eq!(
            entries[0],
            Entry {
                time_us: 1500,
                file: "a".into(),
                action: Action::Write,
                offset: 8192,
                len: 4096,
                fua: true,
                zero: false,
            }
        );
        assert_eq!(entries[1].file, "tenant2");
        assert_eq!(entries[1].action, Action::Datasync);
        assert!(entries[2].zero);
        assert!(
            text.ends_with("9000 a close\n9000 tenant2 close\n9000 tenant3 close\n"),
            "{text}"
        );
    }
}
