//! `ioshare trace convert`: a trace written in another format, a record a line, so that
//! fio replays any trace against an export (`fio3`: `--read_iolog` with
//! `ioengine=nbd`) and a capture goes where the CSV tools are.
//!
//! Readings: times are written from the trace's first record (0), in the target's unit,
//! rounded down; a volume number becomes the target's volume field (`msr`'s disk
//! number, `umass`'s ASU, ...; fio's files are named `vol<N>`); the target's fields the
//! source has not (MSR's host name and response time) are written as `ioshare` and 0.
//! What the target cannot say is refused with the record's position: a trim or a
//! flush in a CSV format (they know reads and writes only), an offset or size that is
//! not whole 512 B sectors where the target counts sectors. `blkparse` is read only.

use super::{Format, Record};
use crate::types::Op;
use std::collections::HashSet;
use std::io::Write;

/// Writes records in one format.
pub struct Writer<W: Write> {
    out: W,
    format: Format,
    /// fio iologs: files announced with `add` and `open`.
    files: HashSet<u64>,
    last_us: u64,
    written: u64,
}

/// A record the target format cannot hold.
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    /// The target has no way to say it.
    #[error("record {index}: {problem}")]
    Unsayable {
        /// 1-based position among the records written.
        index: u64,
        /// What cannot be said.
        problem: String,
    },
    /// Writing failed.
    #[error("cannot write: {0}")]
    Io(#[from] std::io::Error),
}

impl<W: Write> Writer<W> {
    /// A writer in `format` (not `blkparse`), its header written.
    pub fn new(mut out: W, format: Format) -> Result<Writer<W>, ConvertError> {
        match format {
            Format::Blkparse => {
                return Err(ConvertError::Unsayable {
                    index: 0,
                    problem: "blkparse is read, not written".into(),
                });
            }
            Format::FioV3 => writeln!(out, "{}", crate::iolog::HEADER)?,
            Format::FioV2 => writeln!(out, "{}", crate::iolog::HEADER_V2)?,
            _ => {}
        }
        Ok(Writer {
            out,
            format,
            files: HashSet::new(),
            last_us: 0,
            written: 0,
        })
    }

    /// Writes one record.
    pub fn write(&mut self, r: &Record) -> Result<(), ConvertError> {
        self.written += 1;
        let index = self.written;
        let bad = |problem: String| ConvertError::Unsayable { index, problem };
        let csv_op = |read: &'static str, write: &'static str| match r.op {
            Op::Read => Ok(read),
            Op::Write => Ok(write),
            other => Err(bad(format!(
                "a {other:?} cannot be written in {} (reads and writes only)",
                self.format.name()
            ))),
        };
        let sectors = |bytes: u64, what: &str| {
            if bytes.is_multiple_of(512) {
                Ok(bytes / 512)
            } else {
                Err(bad(format!("{what} {bytes} is not whole 512 B sectors")))
            }
        };
        let (t, o, l, v) = (r.time, r.offset, r.len as u64, r.volume);
        match self.format {
            Format::Msr => {
                let op = csv_op("Read", "Write")?;
                writeln!(self.out, "{},ioshare,{v},{op},{o},{l},0", t / 100)?;
            }
            Format::Umass => {
                let op = csv_op("r", "w")?;
                let lba = sectors(o, "offset")?;
                writeln!(
                    self.out,
                    "{v},{lba},{l},{op},{}.{:09}",
                    t / 1_000_000_000,
                    t % 1_000_000_000
                )?;
            }
            Format::Alibaba => {
                let op = csv_op("R", "W")?;
                writeln!(self.out, "{v},{op},{o},{l},{}", t / 1000)?;
            }
            Format::Tencent => {
                let op = csv_op("0", "1")?;
                let (so, sl) = (sectors(o, "offset")?, sectors(l, "size")?);
                writeln!(self.out, "{},{so},{sl},{op},{v}", t / 1_000_000_000)?;
            }
            Format::FioV2 | Format::FioV3 => self.fio(r)?,
            Format::Blkparse => unreachable!("refused in new"),
        }
        Ok(())
    }

    fn fio(&mut self, r: &Record) -> Result<(), ConvertError> {
        let v3 = self.format == Format::FioV3;
        let us = r.time / 1000;
        let stamp = if v3 { format!("{us} ") } else { String::new() };
        if self.files.insert(r.volume) {
            writeln!(self.out, "{stamp}vol{} add", r.volume)?;
            writeln!(self.out, "{stamp}vol{} open", r.volume)?;
        }
        if !v3 && us > self.last_us {
            writeln!(self.out, "vol{} wait {} 0", r.volume, us - self.last_us)?;
        }
        self.last_us = self.last_us.max(us);
        let action = match r.op {
            Op::Read => "read",
            Op::Write => "write",
            Op::Trim => "trim",
            Op::Flush => "datasync",
            Op::Status => unreachable!("a trace's records are data requests and flushes"),
        };
        writeln!(
            self.out,
            "{stamp}vol{} {action} {} {}",
            r.volume, r.offset, r.len
        )?;
        Ok(())
    }

    /// Closes fio's files and flushes; the records written.
    pub fn finish(mut self) -> Result<u64, ConvertError> {
        if matches!(self.format, Format::FioV2 | Format::FioV3) {
            let mut files: Vec<u64> = self.files.iter().copied().collect();
            files.sort_unstable();
            for f in files {
                if self.format == Format::FioV3 {
                    writeln!(self.out, "{} vol{f} close", self.last_us)?;
                } else {
                    writeln!(self.out, "vol{f} close")?;
                }
            }
        }
        self.out.flush()?;
        Ok(self.written)
    }
}
