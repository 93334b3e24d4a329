//! Recorded block traces: the published formats the source papers evaluated with (MSR
//! Cambridge, UMass/SPC Financial), the cloud traces users bring (Alibaba, Tencent CBS),
//! `blkparse` text and fio's iologs — ioshare's own `serve --capture` among them.
//!
//! A [`Reader`] streams one file: memory stays flat in the trace's length (a line
//! buffer and, for fio iologs, the file names seen), gzip and zstd input is recognised
//! by its magic bytes and decompressed on the fly. Every line becomes a [`Record`] or a
//! [`TraceError`] naming the file, the line and what is wrong with it; with
//! [`OnError::Skip`] bad lines are counted ([`Reader::skipped`]) and the first few kept,
//! with [`OnError::Stop`] the first one ends the trace. No bytes make a reader panic
//! (property-tested).
//!
//! Times are the trace's own, in ns since its first record ([`Record::time`]); what
//! replays them ([`replay`]) decides what an arrival time means. The formats' fields and
//! units are in [`formats`] and in `docs/scenarios.md`, "Traces".

pub mod convert;
pub mod formats;
pub mod replay;
pub mod stats;

use crate::types::{Nanos, Op};
use formats::LineParser;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

/// The largest request a trace line may carry (the simulator's and the server's cap).
pub const MAX_REQUEST: u64 = 32 << 20;

/// Bad lines kept whole with [`OnError::Skip`] (the rest are only counted).
pub const KEPT_ERRORS: usize = 10;

/// A trace file's format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// SNIA IOTTA / MSR Cambridge CSV.
    Msr,
    /// UMass / SPC (Financial, WebSearch).
    Umass,
    /// Alibaba cloud block traces (2020).
    Alibaba,
    /// Tencent CBS (SNIA IOTTA).
    Tencent,
    /// `blkparse`'s default text output.
    Blkparse,
    /// fio iolog version 2.
    FioV2,
    /// fio iolog version 3 (what `serve --capture` writes).
    FioV3,
}

impl Format {
    /// Every format, in the order `--help` lists them.
    pub const ALL: [Format; 7] = [
        Format::Msr,
        Format::Umass,
        Format::Alibaba,
        Format::Tencent,
        Format::Blkparse,
        Format::FioV2,
        Format::FioV3,
    ];

    /// Its name in scenarios and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Format::Msr => "msr",
            Format::Umass => "umass",
            Format::Alibaba => "alibaba",
            Format::Tencent => "tencent",
            Format::Blkparse => "blkparse",
            Format::FioV2 => "fio2",
            Format::FioV3 => "fio3",
        }
    }

    /// The format named `name`; `None` for `"auto"`. The error lists the names.
    pub fn parse(name: &str) -> Result<Option<Format>, String> {
        if name == "auto" {
            return Ok(None);
        }
        Format::ALL
            .into_iter()
            .find(|f| f.name() == name)
            .map(Some)
            .ok_or_else(|| {
                let names: Vec<&str> = Format::ALL.iter().map(|f| f.name()).collect();
                format!(
                    "unknown trace format '{}' (known: auto, {})",
                    name.escape_debug(),
                    names.join(", ")
                )
            })
    }
}

/// One request of a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    /// When it was issued, ns since the trace's first record (a record stamped before
    /// the first one reads 0).
    pub time: Nanos,
    /// What it does (a flush carries no range).
    pub op: Op,
    /// Byte offset on its volume.
    pub offset: u64,
    /// Length in bytes.
    pub len: u32,
    /// The volume it is on: MSR's disk number, UMass's ASU, Alibaba's device id,
    /// Tencent's volume id, blkparse's `major << 20 | minor`, an iolog's file index (in
    /// the order the files first appear, from 0).
    pub volume: u64,
}

/// A line that is not a record, or a file that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.render())]
pub struct TraceError {
    /// The file.
    pub file: String,
    /// 1-based line number; 0 when the problem is the file's, not a line's.
    pub line: u64,
    /// What is wrong.
    pub problem: String,
}

impl TraceError {
    fn render(&self) -> String {
        if self.line == 0 {
            format!("{}: {}", self.file, self.problem)
        } else {
            format!("{}:{}: {}", self.file, self.line, self.problem)
        }
    }
}

/// What a reader does with a bad line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnError {
    /// Count it, keep the first [`KEPT_ERRORS`], go on.
    #[default]
    Skip,
    /// End the trace with it.
    Stop,
}

impl OnError {
    /// `"skip"` or `"stop"`.
    pub fn parse(text: &str) -> Result<OnError, String> {
        match text {
            "skip" => Ok(OnError::Skip),
            "stop" => Ok(OnError::Stop),
            other => Err(format!(
                "expected \"skip\" or \"stop\", got \"{}\"",
                other.escape_debug()
            )),
        }
    }
}

/// Which records of a trace a reader yields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Select {
    /// Only this volume ([`Record::volume`]).
    pub volume: Option<u64>,
    /// Only records at or after this time (ns since the first record).
    pub from: Option<Nanos>,
    /// Only records before this time.
    pub to: Option<Nanos>,
    /// `blkparse`: the event whose lines are requests (`Q` queued, the default; `D`
    /// issued to the driver; `C` completed).
    pub event: Option<char>,
}

/// A streaming reader of one trace file (see the module).
pub struct Reader {
    input: Box<dyn BufRead + Send>,
    file: String,
    format: Format,
    parser: LineParser,
    on_error: OnError,
    select: Select,
    buf: Vec<u8>,
    line: u64,
    first_time: Option<Nanos>,
    skipped: u64,
    errors: Vec<TraceError>,
    done: bool,
}

/// Gzip's and zstd's magic bytes.
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

/// Bytes read ahead from the file (and from its decompressor).
const READ_AHEAD: usize = 256 << 10;

impl Reader {
    /// Opens `path`, decompressing gzip or zstd, in `format` (`None`: recognised from its
    /// first line).
    pub fn open(
        path: &Path,
        format: Option<Format>,
        select: Select,
        on_error: OnError,
    ) -> Result<Reader, TraceError> {
        let file = path.display().to_string();
        let fail = |problem: String| TraceError {
            file: file.clone(),
            line: 0,
            problem,
        };
        let f = std::fs::File::open(path).map_err(|e| fail(format!("cannot open it: {e}")))?;
        let input = decompressed(f).map_err(|e| fail(e.to_string()))?;
        Reader::from_input(input, file, format, select, on_error)
    }

    /// A reader of bytes already open (`name` names them in errors).
    pub fn from_input(
        mut input: Box<dyn BufRead + Send>,
        name: String,
        format: Option<Format>,
        select: Select,
        on_error: OnError,
    ) -> Result<Reader, TraceError> {
        let format = match format {
            Some(f) => f,
            None => detect(&mut input).map_err(|problem| TraceError {
                file: name.clone(),
                line: 0,
                problem,
            })?,
        };
        if let Some(e) = select.event
            && !matches!(e, 'Q' | 'D' | 'C')
        {
            return Err(TraceError {
                file: name,
                line: 0,
                problem: format!("event '{e}': expected Q, D or C"),
            });
        }
        Ok(Reader {
            input,
            file: name,
            format,
            parser: LineParser::new(format, select.event.unwrap_or('Q')),
            on_error,
            select,
            buf: Vec::with_capacity(256),
            line: 0,
            first_time: None,
            skipped: 0,
            errors: Vec::new(),
            done: false,
        })
    }

    /// The file's format.
    pub fn format(&self) -> Format {
        self.format
    }

    /// Bad lines skipped so far.
    pub fn skipped(&self) -> u64 {
        self.skipped
    }

    /// The first [`KEPT_ERRORS`] bad lines skipped.
    pub fn errors(&self) -> &[TraceError] {
        &self.errors
    }

    /// Lines read so far.
    pub fn lines(&self) -> u64 {
        self.line
    }

    fn error(&self, problem: String) -> TraceError {
        TraceError {
            file: self.file.clone(),
            line: self.line,
            problem,
        }
    }

    /// The next record of any volume and time, or a bad line, or the end.
    fn next_parsed(&mut self) -> Option<Result<Record, TraceError>> {
        loop {
            self.buf.clear();
            let long = match read_line(&mut *self.input, &mut self.buf, MAX_LINE) {
                Ok(Line::End) => return None,
                Ok(Line::Whole) => false,
                Ok(Line::TooLong) => true,
                Err(e) => {
                    self.line += 1;
                    return Some(Err(self.error(format!("cannot read it: {e}"))));
                }
            };
            self.line += 1;
            if long {
                return Some(Err(self.error(format!(
                    "longer than {} KiB: not a trace line (the rest of it was passed over)",
                    MAX_LINE >> 10
                ))));
            }
            let mut end = self.buf.len();
            while end > 0 && matches!(self.buf[end - 1], b'\n' | b'\r') {
                end -= 1;
            }
            let Ok(text) = std::str::from_utf8(&self.buf[..end]) else {
                return Some(Err(self.error("not text (invalid UTF-8)".into())));
            };
            match self.parser.parse(text, self.line) {
                Ok(None) => continue,
                Ok(Some(r)) => return Some(Ok(r)),
                Err(problem) => return Some(Err(self.error(problem))),
            }
        }
    }
}

impl Iterator for Reader {
    type Item = Result<Record, TraceError>;

    fn next(&mut self) -> Option<Self::Item> {
        while !self.done {
            let mut r = match self.next_parsed() {
                None => {
                    self.done = true;
                    return None;
                }
                Some(Ok(r)) => r,
                Some(Err(e)) if self.on_error == OnError::Skip && e.line > 0 => {
                    self.skipped += 1;
                    if self.errors.len() < KEPT_ERRORS {
                        self.errors.push(e);
                    }
                    continue;
                }
                Some(Err(e)) => {
                    self.done = true;
                    return Some(Err(e));
                }
            };
            let first = *self.first_time.get_or_insert(r.time);
            r.time = r.time.saturating_sub(first);
            let s = &self.select;
            if s.volume.is_some_and(|v| v != r.volume) || s.from.is_some_and(|f| r.time < f) {
                continue;
            }
            if s.to.is_some_and(|t| r.time >= t) {
                // Traces are in time order: nothing later is wanted.
                self.done = true;
                return None;
            }
            return Some(Ok(r));
        }
        None
    }
}

/// The longest line a trace may have, bytes: a record is under a hundred; a line past
/// this is an error (named by its number), not a buffer that grows with the input.
pub const MAX_LINE: usize = 1 << 20;

/// What [`read_line`] found.
#[derive(Debug, PartialEq, Eq)]
enum Line {
    /// A line (with its `\n`, unless the input ended without one) is in the buffer.
    Whole,
    /// The line was longer than the limit: its first bytes are in the buffer, the rest
    /// was read past.
    TooLong,
    /// Nothing more to read.
    End,
}

/// Reads one line into `buf` (up to and with its `\n`), keeping at most `limit` bytes
/// of it: a longer line is read to its end but not kept.
fn read_line(input: &mut dyn BufRead, buf: &mut Vec<u8>, limit: usize) -> std::io::Result<Line> {
    let mut read_any = false;
    let mut too_long = false;
    loop {
        let chunk = match input.fill_buf() {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if chunk.is_empty() {
            break;
        }
        read_any = true;
        let (take, done) = match chunk.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (chunk.len(), false),
        };
        let room = limit.saturating_sub(buf.len());
        if take > room {
            too_long = true;
        }
        buf.extend_from_slice(&chunk[..take.min(room)]);
        input.consume(take);
        if done {
            break;
        }
    }
    Ok(match (read_any, too_long) {
        (false, _) => Line::End,
        (true, true) => Line::TooLong,
        (true, false) => Line::Whole,
    })
}

/// `f` read ahead, gzip or zstd decompressed when its first bytes say so.
pub fn decompressed(f: impl Read + Send + 'static) -> std::io::Result<Box<dyn BufRead + Send>> {
    let mut raw = BufReader::with_capacity(READ_AHEAD, f);
    let head = raw.fill_buf()?.to_vec();
    Ok(if head.starts_with(&GZIP_MAGIC) {
        Box::new(BufReader::with_capacity(
            READ_AHEAD,
            flate2::read::MultiGzDecoder::new(raw),
        ))
    } else if head.starts_with(&ZSTD_MAGIC) {
        let z = ruzstd::decoding::StreamingDecoder::new(raw)
            .map_err(|e| std::io::Error::other(format!("not a zstd stream: {e}")))?;
        Box::new(BufReader::with_capacity(READ_AHEAD, z))
    } else {
        Box::new(raw)
    })
}

/// Recognises the format from the first line (left unread).
fn detect(input: &mut Box<dyn BufRead + Send>) -> Result<Format, String> {
    let head = input
        .fill_buf()
        .map_err(|e| format!("cannot read it: {e}"))?;
    let end = head.iter().position(|&b| b == b'\n').unwrap_or(head.len());
    let line = &head[..end];
    // A text trace's first line is printable: anything else is said, not echoed.
    let text = std::str::from_utf8(line)
        .is_ok_and(|l| !l.chars().any(|c| c.is_control() && c != '\t' && c != '\r'));
    if !text {
        return Err(
            "not a text trace: its first line holds binary data (traces are read as text, one request a line, plain or gzip- or zstd-compressed; `ioshare trace stats --help` names the formats)"
                .to_string(),
        );
    }
    let first = String::from_utf8_lossy(line).into_owned();
    formats::detect(&first).ok_or_else(|| {
        format!(
            "cannot tell its format from its first line '{}': name it (format = \"msr\", --format msr)",
            first.chars().take(120).collect::<String>().escape_debug()
        )
    })
}

/// Reads a trace's records whole (tests, small files); the first bad line is an error.
pub fn read_all(path: &Path, format: Option<Format>) -> Result<Vec<Record>, TraceError> {
    Reader::open(path, format, Select::default(), OnError::Stop)?.collect()
}

#[cfg(test)]
mod tests;
