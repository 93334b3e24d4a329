//! Request streams in fio's iolog format, version 3: what `serve --capture` writes and
//! what the journal detector's tests read (real ext4 streams, replayable by
//! `fio --read_iolog`).
//!
//! ```text
//! fio version 3 iolog
//! 0 mail1 add
//! 0 mail1 open
//! 1532 mail1 write 1073741824 4096
//! 1540 mail1 datasync 0 0
//! 1571 mail1 write 4096 8192 fua
//! 90000 mail1 close
//! ```
//!
//! A line is a time (microseconds since the capture began: fio 3.31 and later replay
//! the gaps between lines as such), a file (the export's name), an action, and for I/O
//! a byte offset and length. The actions are fio's: `read`, `write`, `trim`, and
//! `datasync` for a flush. An optional fifth field holds flags fio does not know and
//! skips (it reads the first four fields): `fua` (force unit access), `zero` (a
//! zeroing write, no data), comma-separated.

use std::fmt::Write as _;

/// The first line of a version 3 iolog.
pub const HEADER: &str = "fio version 3 iolog";

/// What a line does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Reads `len` bytes at `offset`.
    Read,
    /// Writes `len` bytes at `offset` (`zero`: writes zeroes).
    Write,
    /// Discards `len` bytes at `offset`.
    Trim,
    /// Makes what was written durable (an NBD flush).
    Datasync,
}

impl Action {
    /// The action as fio spells it.
    pub fn name(self) -> &'static str {
        match self {
            Action::Read => "read",
            Action::Write => "write",
            Action::Trim => "trim",
            Action::Datasync => "datasync",
        }
    }
}

/// One I/O line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Microseconds since the capture began.
    pub time_us: u64,
    /// The file (export) it is on.
    pub file: String,
    /// What it does.
    pub action: Action,
    /// Byte offset.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
    /// Force unit access.
    pub fua: bool,
    /// A zeroing write.
    pub zero: bool,
}

/// A line that is not a version 3 iolog line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {what}")]
pub struct ParseError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong with it.
    pub what: String,
}

/// A name fio can read as a file: the export's name where it is 1 to 200 printable
/// characters without spaces, else `tenant<index>` (1-based).
pub fn file_name(name: &str, index: usize) -> String {
    let plain = !name.is_empty() && name.len() <= 200 && name.chars().all(|c| c.is_ascii_graphic());
    if plain {
        name.to_string()
    } else {
        format!("tenant{}", index + 1)
    }
}

/// The header and each file's `add` and `open` lines.
pub fn start(files: &[String]) -> String {
    let mut s = format!("{HEADER}\n");
    for f in files {
        let _ = writeln!(s, "0 {f} add\n0 {f} open");
    }
    s
}

/// Appends one I/O line to `out`.
pub fn push(out: &mut String, e: &Entry) {
    let _ = write!(
        out,
        "{} {} {} {} {}",
        e.time_us,
        e.file,
        e.action.name(),
        e.offset,
        e.len
    );
    match (e.fua, e.zero) {
        (false, false) => {}
        (true, false) => out.push_str(" fua"),
        (false, true) => out.push_str(" zero"),
        (true, true) => out.push_str(" fua,zero"),
    }
    out.push('\n');
}

/// Each file's `close` line at `time_us`.
pub fn finish(files: &[String], time_us: u64) -> String {
    let mut s = String::new();
    for f in files {
        let _ = writeln!(s, "{time_us} {f} close");
    }
    s
}

/// The first line of a version 2 iolog (no times: `wait` lines space the requests).
pub const HEADER_V2: &str = "fio version 2 iolog";

/// Which version of the format a file is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// `file action [offset length]`, with `wait` lines (µs since the previous wait).
    V2,
    /// `time file action [offset length]`, time in µs since the log began.
    V3,
}

impl Version {
    /// The version whose header `line` is.
    pub fn of_header(line: &str) -> Option<Version> {
        match line.trim_end() {
            HEADER => Some(Version::V3),
            HEADER_V2 => Some(Version::V2),
            _ => None,
        }
    }
}

/// One line of an iolog, past its header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Line<'a> {
    /// An I/O (in version 2 its `time_us` is 0: the reader adds the waits).
    Io(Entry),
    /// A version 2 `wait` of this many microseconds.
    Wait(u64),
    /// `add`, `open` or `close` of this file.
    File(&'a str),
    /// Nothing (a blank line).
    Blank,
}

/// Parses one line after the header. The error says what is wrong with it; the caller
/// names the line.
pub fn parse_line(line: &str, version: Version) -> Result<Line<'_>, String> {
    let mut f = line.split_ascii_whitespace();
    let time_us = match version {
        Version::V2 => 0,
        Version::V3 => match f.next() {
            None => return Ok(Line::Blank),
            Some(t) => t
                .parse()
                .map_err(|_| format!("time '{}' is not a whole number", t.escape_debug()))?,
        },
    };
    let Some(file) = f.next() else {
        return match version {
            Version::V2 => Ok(Line::Blank),
            Version::V3 => Err(format!(
                "'{}': a line is time, file, action and for I/O offset and length",
                line.escape_debug()
            )),
        };
    };
    let Some(action) = f.next() else {
        return Err(format!(
            "'{}': a line is {}file, action and for I/O offset and length",
            line.escape_debug(),
            if version == Version::V3 { "time, " } else { "" }
        ));
    };
    let rest: [Option<&str>; 4] = [f.next(), f.next(), f.next(), f.next()];
    let action = match action {
        "add" | "open" | "close" if rest[0].is_none() => return Ok(Line::File(file)),
        "wait" if version == Version::V2 => {
            let us = rest[0].ok_or("wait needs a time in microseconds")?;
            return us
                .parse()
                .map(Line::Wait)
                .map_err(|_| format!("wait '{}' is not a whole number", us.escape_debug()));
        }
        "read" => Action::Read,
        "write" => Action::Write,
        "trim" => Action::Trim,
        "datasync" | "sync" => Action::Datasync,
        other => return Err(format!("unknown action '{}'", other.escape_debug())),
    };
    let (Some(offset), Some(len), None) = (rest[0], rest[1], rest[3]) else {
        return Err(format!(
            "'{}': {} needs an offset and a length, then optional flags",
            line.escape_debug(),
            action.name()
        ));
    };
    let number = |s: &str, what: &str| {
        s.parse::<u64>()
            .map_err(|_| format!("{what} '{}' is not a whole number", s.escape_debug()))
    };
    let offset = number(offset, "offset")?;
    let len = number(len, "length")?;
    offset
        .checked_add(len)
        .ok_or_else(|| "offset + length overflows".to_string())?;
    let (mut fua, mut zero) = (false, false);
    if let Some(flags) = rest[2] {
        for flag in flags.split(',') {
            match flag {
                "fua" => fua = true,
                "zero" => zero = true,
                other => return Err(format!("unknown flag '{}'", other.escape_debug())),
            }
        }
    }
    Ok(Line::Io(Entry {
        time_us,
        file: file.to_string(),
        action,
        offset,
        len,
        fua,
        zero,
    }))
}

/// The I/O lines of a version 3 iolog (file `add`/`open`/`close` lines are checked and
/// skipped). Every error names its line.
pub fn parse(text: &str) -> Result<Vec<Entry>, ParseError> {
    let mut lines = text.lines().enumerate();
    match lines.next() {
        Some((_, HEADER)) => {}
        Some((_, other)) => {
            return Err(ParseError {
                line: 1,
                what: format!("'{}' is not '{HEADER}'", other.escape_debug()),
            });
        }
        None => {
            return Err(ParseError {
                line: 1,
                what: "empty: no header".into(),
            });
        }
    }
    let mut out = Vec::new();
    for (i, line) in lines {
        match parse_line(line, Version::V3) {
            Ok(Line::Io(e)) => out.push(e),
            Ok(_) => {}
            Err(what) => return Err(ParseError { line: i + 1, what }),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_round_trip() {
        let files = vec!["mail1".to_string(), "tenant2".to_string()];
        let mut text = start(&files);
        let entries = [
            (Action::Write, 4096, 8192, true, false),
            (Action::Datasync, 0, 0, false, false),
            (Action::Read, 1 << 40, 512, false, false),
            (Action::Write, 0, 1 << 20, false, true),
            (Action::Trim, 4096, 4096, true, true),
        ]
        .iter()
        .enumerate()
        .map(|(i, &(action, offset, len, fua, zero))| Entry {
            time_us: 10 * i as u64,
            file: files[i % 2].clone(),
            action,
            offset,
            len,
            fua,
            zero,
        })
        .collect::<Vec<_>>();
        for e in &entries {
            push(&mut text, e);
        }
        text.push_str(&finish(&files, 99));
        assert_eq!(parse(&text).unwrap(), entries);
        assert!(text.contains("\n0 mail1 write 4096 8192 fua\n"), "{text}");
        assert!(text.ends_with("99 mail1 close\n99 tenant2 close\n"));
    }

    #[test]
    fn names_fio_cannot_read_become_tenant_numbers() {
        assert_eq!(file_name("vm-1.disk", 0), "vm-1.disk");
        assert_eq!(file_name("my disk", 2), "tenant3");
        assert_eq!(file_name("", 0), "tenant1");
        assert_eq!(file_name("dé", 1), "tenant2");
        assert_eq!(file_name(&"x".repeat(201), 0), "tenant1");
    }

    #[test]
    fn bad_lines_are_errors_naming_the_line() {
        for (text, line, what) in [
            ("fio version 2 iolog\n", 1, "is not"),
            ("", 1, "empty"),
            (
                "fio version 3 iolog\n0 a add\n5 a write 1\n",
                3,
                "needs an offset",
            ),
            ("fio version 3 iolog\n5 a write 1 x\n", 2, "length 'x'"),
            ("fio version 3 iolog\nt a read 0 1\n", 2, "time 't'"),
            ("fio version 3 iolog\n0 a punch 0 1\n", 2, "unknown action"),
            ("fio version 3 iolog\n0 a read 0 1 odd\n", 2, "unknown flag"),
            (
                "fio version 3 iolog\n0 a read 18446744073709551615 2\n",
                2,
                "overflows",
            ),
            ("fio version 3 iolog\n0 a\n", 2, "a line is"),
        ] {
            let e = parse(text).unwrap_err();
            assert_eq!(e.line, line, "{text:?}: {e}");
            assert!(e.to_string().contains(what), "{text:?}: {e}");
        }
    }
}
