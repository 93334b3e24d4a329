//! The trace formats, a line at a time. Each takes one line (without its end) and
//! answers a [`Record`], nothing (a header, a comment, a line of no request), or what is
//! wrong with it.
//!
//! | format | a line | units |
//! |---|---|---|
//! | `msr` | `Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime` | Windows FILETIME (100 ns), `Read`/`Write`, bytes; no header line |
//! | `umass` | `ASU,LBA,Size,Opcode,Timestamp` | LBA in 512 B sectors, size in bytes, `r`/`w`, seconds |
//! | `alibaba` | `device_id,opcode,offset,length,timestamp` | `R`/`W`, bytes, µs |
//! | `tencent` | `Timestamp,Offset,Size,IOType,VolumeID` | Unix seconds, 512 B sectors, `0` read / `1` write |
//! | `blkparse` | `8,0  3  1  0.000000000  697  Q  W 223490 + 8 [proc]` | seconds, sectors; one event (`Q` by default) |
//! | `fio2` | `file action offset length` after `fio version 2 iolog` | bytes; `wait` lines in µs |
//! | `fio3` | `time file action offset length` after `fio version 3 iolog` | µs, bytes |
//!
//! Readings: a CSV line may carry spaces around its fields and more fields than named
//! (UMass files from SPC have a sixth); a first line that names the columns is skipped;
//! `#` lines are comments. A `blkparse` line whose first field is not `major,minor` (its
//! summary at the end, `CPU0 (8,0):`) is not a request and is passed over, as are events
//! other than the chosen one and requests of no sectors that are not flushes. An op of
//! `D` in blkparse's RWBS is a discard (a trim), `F` alone a flush.

use super::{Format, MAX_REQUEST, Record};
use crate::iolog::{self, Action, Line, Version};
use crate::types::{Nanos, Op};
use std::collections::HashMap;

/// The most distinct files an iolog may name (a bound on the reader's memory).
pub const MAX_FILES: usize = 65_536;

/// The parser of one format, with the state its lines need.
#[derive(Debug)]
pub(crate) struct LineParser {
    format: Format,
    /// `blkparse`: the event kept.
    event: char,
    /// fio iologs: whether the header was seen.
    header: bool,
    /// fio iologs: file name → index.
    files: HashMap<String, u64>,
    /// fio version 2: the sum of the waits so far, ns.
    waited: Nanos,
}

impl LineParser {
    pub(crate) fn new(format: Format, event: char) -> LineParser {
        LineParser {
            format,
            event,
            header: false,
            files: HashMap::new(),
            waited: 0,
        }
    }

    /// One line; `number` is its 1-based number (a header is looked for on line 1).
    pub(crate) fn parse(&mut self, line: &str, number: u64) -> Result<Option<Record>, String> {
        let start = line.trim_start();
        if start.is_empty() || start.starts_with('#') {
            return Ok(None);
        }
        match self.format {
            Format::Msr => csv_line(line, number, "timestamp", msr),
            Format::Umass => csv_line(line, number, "asu", umass),
            Format::Alibaba => csv_line(line, number, "device_id", alibaba),
            Format::Tencent => csv_line(line, number, "timestamp", tencent),
            Format::Blkparse => blkparse(line, self.event),
            Format::FioV2 | Format::FioV3 => self.fio(line, number),
        }
    }

    fn fio(&mut self, line: &str, number: u64) -> Result<Option<Record>, String> {
        let version = if self.format == Format::FioV3 {
            Version::V3
        } else {
            Version::V2
        };
        if !self.header {
            return match Version::of_header(line) {
                Some(v) if v == version => {
                    self.header = true;
                    Ok(None)
                }
                _ if number == 1 => Err(format!(
                    "'{}' is not '{}'",
                    line.escape_debug(),
                    if version == Version::V3 {
                        iolog::HEADER
                    } else {
                        iolog::HEADER_V2
                    }
                )),
                _ => Err("no iolog header before this line".into()),
            };
        }
        let e = match iolog::parse_line(line, version)? {
            Line::Io(e) => e,
            Line::Wait(us) => {
                self.waited = self.waited.saturating_add(us.saturating_mul(1000));
                return Ok(None);
            }
            Line::File(name) => {
                self.file_index(name)?;
                return Ok(None);
            }
            Line::Blank => return Ok(None),
        };
        let volume = self.file_index(&e.file)?;
        let time = match version {
            Version::V3 => e.time_us.saturating_mul(1000),
            Version::V2 => self.waited,
        };
        let op = match e.action {
            Action::Read => Op::Read,
            Action::Write => Op::Write,
            Action::Trim => Op::Trim,
            Action::Datasync => {
                return Ok(Some(Record {
                    time,
                    op: Op::Flush,
                    offset: 0,
                    len: 0,
                    volume,
                }));
            }
        };
        request(time, op, e.offset, e.len, volume).map(Some)
    }

    fn file_index(&mut self, name: &str) -> Result<u64, String> {
        if let Some(&i) = self.files.get(name) {
            return Ok(i);
        }
        if self.files.len() >= MAX_FILES {
            return Err(format!("more than {MAX_FILES} files in one iolog"));
        }
        let i = self.files.len() as u64;
        self.files.insert(name.to_string(), i);
        Ok(i)
    }
}

/// The format whose line `first` is, if it is one of them.
pub(crate) fn detect(first: &str) -> Option<Format> {
    match Version::of_header(first) {
        Some(Version::V3) => return Some(Format::FioV3),
        Some(Version::V2) => return Some(Format::FioV2),
        None => {}
    }
    let f: Vec<&str> = first.split(',').map(str::trim).collect();
    let num = |i: usize| f.get(i).is_some_and(|s| s.parse::<f64>().is_ok());
    let op = |i: usize, set: &[&str]| f.get(i).is_some_and(|s| set.contains(s));
    if f.len() >= 7 && num(0) && op(3, &["Read", "Write", "read", "write"]) {
        return Some(Format::Msr);
    }
    if f.len() >= 5 && num(0) && op(1, &["R", "W", "r", "w"]) {
        return Some(Format::Alibaba);
    }
    if f.len() >= 5 && num(0) && op(3, &["R", "W", "r", "w"]) {
        return Some(Format::Umass);
    }
    if f.len() == 5 && num(0) && op(3, &["0", "1"]) {
        return Some(Format::Tencent);
    }
    let mut words = first.split_ascii_whitespace();
    if words.next().is_some_and(is_device) && words.count() >= 5 {
        return Some(Format::Blkparse);
    }
    None
}

/// A CSV line of at least `N` fields; line 1 naming its columns (its first field
/// `header`, in any case) is skipped.
fn csv_line<const N: usize>(
    line: &str,
    number: u64,
    header: &str,
    parse: fn([&str; N]) -> Result<Record, String>,
) -> Result<Option<Record>, String> {
    let mut fields = [""; N];
    let bytes = line.as_bytes();
    let mut start = 0;
    for (i, slot) in fields.iter_mut().enumerate() {
        if start > bytes.len() {
            return Err(format!("only {i} of the {N} fields"));
        }
        // Commas are ASCII: the slice boundaries are character boundaries.
        let end = bytes[start..]
            .iter()
            .position(|&b| b == b',')
            .map_or(bytes.len(), |p| start + p);
        let field = &line[start..end];
        *slot = if field.starts_with([' ', '\t']) || field.ends_with([' ', '\t']) {
            field.trim()
        } else {
            field
        };
        start = end + 1;
    }
    if number == 1 && fields[0].eq_ignore_ascii_case(header) {
        return Ok(None);
    }
    parse(fields).map(Some)
}

fn int(field: &str, what: &str) -> Result<u64, String> {
    field
        .parse()
        .map_err(|_| format!("{what} '{}' is not a whole number", field.escape_debug()))
}

/// Seconds as a decimal (`0.551706`) to ns, exactly for up to 9 decimals.
fn seconds(field: &str, what: &str) -> Result<Nanos, String> {
    let bad = || format!("{what} '{}' is not a time in seconds", field.escape_debug());
    let (whole, frac) = field.split_once('.').unwrap_or((field, ""));
    if whole.is_empty() && frac.is_empty() {
        return Err(bad());
    }
    let whole: u64 = if whole.is_empty() {
        0
    } else {
        whole.parse().map_err(|_| bad())?
    };
    if !frac.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let digits = &frac[..frac.len().min(9)];
    let mut ns: u64 = if digits.is_empty() {
        0
    } else {
        digits.parse().map_err(|_| bad())?
    };
    for _ in digits.len()..9 {
        ns *= 10;
    }
    whole
        .checked_mul(1_000_000_000)
        .and_then(|s| s.checked_add(ns))
        .ok_or_else(bad)
}

/// A read, write or trim, checked: a length of 1 byte to [`MAX_REQUEST`], a range that
/// does not overflow.
fn request(time: Nanos, op: Op, offset: u64, len: u64, volume: u64) -> Result<Record, String> {
    if len == 0 {
        return Err("length 0".into());
    }
    if len > MAX_REQUEST {
        return Err(format!(
            "length {len} is above the {} MiB a request may be",
            MAX_REQUEST >> 20
        ));
    }
    offset
        .checked_add(len)
        .ok_or_else(|| format!("offset {offset} + length {len} overflows"))?;
    Ok(Record {
        time,
        op,
        offset,
        len: len as u32,
        volume,
    })
}

fn msr(f: [&str; 7]) -> Result<Record, String> {
    let time = int(f[0], "timestamp")?
        .checked_mul(100)
        .ok_or("timestamp overflows")?;
    let op = match f[3] {
        "Read" | "read" => Op::Read,
        "Write" | "write" => Op::Write,
        other => {
            return Err(format!(
                "type '{}': expected Read or Write",
                other.escape_debug()
            ));
        }
    };
    let volume = int(f[2], "disk number")?;
    request(time, op, int(f[4], "offset")?, int(f[5], "size")?, volume)
}

fn rw(field: &str) -> Result<Op, String> {
    match field {
        "r" | "R" => Ok(Op::Read),
        "w" | "W" => Ok(Op::Write),
        other => Err(format!(
            "opcode '{}': expected R or W",
            other.escape_debug()
        )),
    }
}

fn umass(f: [&str; 5]) -> Result<Record, String> {
    let lba = int(f[1], "LBA")?;
    let offset = lba.checked_mul(512).ok_or("LBA overflows")?;
    let time = seconds(f[4], "timestamp")?;
    request(
        time,
        rw(f[3])?,
        offset,
        int(f[2], "size")?,
        int(f[0], "ASU")?,
    )
}

fn alibaba(f: [&str; 5]) -> Result<Record, String> {
    let time = int(f[4], "timestamp")?
        .checked_mul(1000)
        .ok_or("timestamp overflows")?;
    request(
        time,
        rw(f[1])?,
        int(f[2], "offset")?,
        int(f[3], "length")?,
        int(f[0], "device id")?,
    )
}

fn tencent(f: [&str; 5]) -> Result<Record, String> {
    let time = int(f[0], "timestamp")?
        .checked_mul(1_000_000_000)
        .ok_or("timestamp overflows")?;
    let op = match f[3] {
        "0" => Op::Read,
        "1" => Op::Write,
        other => {
            return Err(format!(
                "IO type '{}': expected 0 or 1",
                other.escape_debug()
            ));
        }
    };
    let offset = int(f[1], "offset")?
        .checked_mul(512)
        .ok_or("offset overflows")?;
    let len = int(f[2], "size")?
        .checked_mul(512)
        .ok_or("size overflows")?;
    request(time, op, offset, len, int(f[4], "volume id")?)
}

/// `major,minor`.
fn is_device(word: &str) -> bool {
    word.split_once(',').is_some_and(|(a, b)| {
        !a.is_empty()
            && !b.is_empty()
            && a.bytes().all(|c| c.is_ascii_digit())
            && b.bytes().all(|c| c.is_ascii_digit())
    })
}

fn blkparse(line: &str, event: char) -> Result<Option<Record>, String> {
    let mut w = line.split_ascii_whitespace();
    let Some(dev) = w.next().filter(|d| is_device(d)) else {
        return Ok(None);
    };
    let (major, minor) = dev.split_once(',').expect("checked");
    let volume = (int(major, "major")? << 20) | int(minor, "minor")?;
    let (_cpu, _seq, time, _pid, action) = (w.next(), w.next(), w.next(), w.next(), w.next());
    let (Some(time), Some(action)) = (time, action) else {
        return Err("a line is device, cpu, sequence, time, pid, event, RWBS and sectors".into());
    };
    if action.len() != 1 || !action.starts_with(event) {
        return Ok(None);
    }
    let time = seconds(time, "time")?;
    let rwbs = w.next().ok_or("no RWBS field")?;
    let flush = rwbs.starts_with('F');
    let op = if rwbs.contains('D') {
        Op::Trim
    } else if rwbs.contains('W') {
        Op::Write
    } else if rwbs.contains('R') {
        Op::Read
    } else if flush {
        Op::Flush
    } else {
        return Ok(None);
    };
    let sector = w.next();
    let sectors = match (sector, w.next(), w.next()) {
        (Some(s), Some("+"), Some(n)) => Some((int(s, "sector")?, int(n, "sector count")?)),
        _ => None,
    };
    match sectors {
        Some((_, 0)) | None if flush => Ok(Some(Record {
            time,
            op: Op::Flush,
            offset: 0,
            len: 0,
            volume,
        })),
        Some((_, 0)) | None => Ok(None),
        Some((s, n)) => {
            let offset = s.checked_mul(512).ok_or("sector overflows")?;
            let len = n.checked_mul(512).ok_or("sector count overflows")?;
            request(time, op, offset, len, volume).map(Some)
        }
    }
}
