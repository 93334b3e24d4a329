//! A trace as a tenant's workload: its records become the tenant's requests, in order.
//!
//! Readings:
//! * **Timing.** `original`: a record arrives at its trace time divided by `speed`
//!   (open loop: the trace's arrivals, whatever the device does — what the papers'
//!   trace-driven runs do); `closed`: records go as fast as `iodepth` outstanding
//!   requests allow, the trace's times ignored.
//! * **Offsets** land in the tenant's region: `wrap` takes the offset modulo the region
//!   (a trace's hot spots stay hot, a volume larger than the region folds onto it);
//!   `scale` maps the trace's largest end offset (found by reading the trace once when
//!   the scenario is loaded) to the region's end, keeping distances in proportion.
//!   Either way offsets are rounded down to 512 B, lengths up to whole 512 B sectors,
//!   and a request that would cross the region's end is moved back to end at it (a
//!   request longer than the region is cut to the region).
//! * **Times** count from the first record replayed (a slice `select = { from_s = 60 }`
//!   starts at once, not after a minute).
//! * **Loop**: at the trace's end it starts again, one mean gap of the pass after its
//!   last arrival; a pass that yields no record ends the replay instead of spinning.
//! * Bad lines are skipped and counted or end the replay (`on_error`); what happened is
//!   in [`ReplayStats`], which the simulator writes to results.json beside the tenant.

use super::{Format, OnError, Reader, Select};
use crate::types::{Nanos, Op};
use serde::Serialize;
use std::path::PathBuf;

/// How a trace's records are timed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Timing {
    /// At the trace's times divided by `speed`.
    Original {
        /// > 0; 2.0 replays twice as fast.
        speed: f64,
    },
    /// As fast as `iodepth` outstanding requests allow.
    Closed {
        /// Requests kept outstanding (≥ 1).
        iodepth: u32,
    },
}

/// How a trace's offsets land in the tenant's region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Remap {
    /// Modulo the region.
    Wrap,
    /// In proportion: the trace's largest end offset (`span`, bytes) at the region's end.
    Scale {
        /// The largest end offset of the records replayed.
        span: u64,
    },
}

/// A trace workload, resolved (see the module).
#[derive(Debug, Clone, PartialEq)]
pub struct TraceSpec {
    /// The file.
    pub path: PathBuf,
    /// Its format (`None`: recognised from its first line).
    pub format: Option<Format>,
    /// Which records.
    pub select: Select,
    /// How they are timed.
    pub timing: Timing,
    /// Where their offsets land.
    pub remap: Remap,
    /// Start again at the end.
    pub looped: bool,
    /// What a bad line does.
    pub on_error: OnError,
}

/// What a replay did (results.json, per tenant).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ReplayStats {
    /// The file.
    pub file: String,
    /// Records issued.
    pub records: u64,
    /// Bad lines skipped.
    pub skipped: u64,
    /// The first bad lines skipped, with file and line.
    pub skipped_lines: Vec<String>,
    /// Passes started (more than 1 with `loop`).
    pub passes: u32,
    /// Why the replay ended early: a bad line with `on_error = "stop"`, a file that could
    /// not be read.
    pub stopped: Option<String>,
}

/// One tenant's replay of a trace.
pub struct Replay {
    spec: TraceSpec,
    region_start: u64,
    region_len: u64,
    reader: Option<Reader>,
    /// Arrival time of the pass's first record.
    base: Nanos,
    last: Nanos,
    in_pass: u64,
    /// Trace times of the pass's first and last records.
    pass_first: Option<Nanos>,
    pass_last: Nanos,
    stats: ReplayStats,
}

impl Replay {
    /// Opens the trace for a tenant whose region is `region_len` bytes from
    /// `region_start` (> 0). A file that cannot be opened ends the replay at once,
    /// recorded in [`Replay::stats`].
    pub fn open(spec: &TraceSpec, region_start: u64, region_len: u64) -> Replay {
        assert!(region_len >= 512, "a region holds a sector");
        let mut r = Replay {
            spec: spec.clone(),
            region_start,
            region_len: region_len / 512 * 512,
            reader: None,
            base: 0,
            last: 0,
            in_pass: 0,
            pass_first: None,
            pass_last: 0,
            stats: ReplayStats {
                file: spec.path.display().to_string(),
                ..ReplayStats::default()
            },
        };
        r.start_pass();
        r
    }

    fn start_pass(&mut self) {
        self.keep_skipped();
        match Reader::open(
            &self.spec.path,
            self.spec.format,
            self.spec.select,
            self.spec.on_error,
        ) {
            Ok(reader) => {
                self.reader = Some(reader);
                self.stats.passes += 1;
                self.in_pass = 0;
                self.pass_first = None;
                self.base = self.last;
            }
            Err(e) => {
                self.reader = None;
                self.stats.stopped = Some(e.to_string());
            }
        }
    }

    /// Counts what the current pass's reader skipped, and closes it.
    fn keep_skipped(&mut self) {
        if let Some(reader) = self.reader.take() {
            add_skipped(&mut self.stats, &reader);
        }
    }

    /// The next request: its arrival (ns from the replay's start; with closed timing
    /// meaningless), operation, absolute offset and length. `None`: the replay ended.
    pub fn next_io(&mut self) -> Option<(Nanos, Op, u64, u32)> {
        loop {
            let reader = self.reader.as_mut()?;
            match reader.next() {
                Some(Ok(rec)) => {
                    self.in_pass += 1;
                    self.stats.records += 1;
                    let first = *self.pass_first.get_or_insert(rec.time);
                    self.pass_last = self.pass_last.max(rec.time);
                    let at = match self.spec.timing {
                        Timing::Original { speed } => {
                            self.base + (rec.time.saturating_sub(first) as f64 / speed) as Nanos
                        }
                        Timing::Closed { .. } => self.last,
                    };
                    self.last = self.last.max(at);
                    let (offset, len) = self.place(rec.op, rec.offset, rec.len);
                    return Some((self.last, rec.op, offset, len));
                }
                Some(Err(e)) => {
                    self.keep_skipped();
                    self.stats.stopped = Some(e.to_string());
                    return None;
                }
                None => {
                    let empty = self.in_pass == 0;
                    self.keep_skipped();
                    if !self.spec.looped || empty {
                        return None;
                    }
                    // The next pass starts one mean gap of this one after its last record.
                    if let (Timing::Original { speed }, Some(first)) =
                        (self.spec.timing, self.pass_first)
                    {
                        let gap = (self.pass_last - first) / (self.in_pass - 1).max(1);
                        self.last += ((gap as f64 / speed) as Nanos).max(1);
                    }
                    self.start_pass();
                }
            }
        }
    }

    /// Where a record's range lands in the region.
    fn place(&self, op: Op, offset: u64, len: u32) -> (u64, u32) {
        if op == Op::Flush {
            return (self.region_start, 0);
        }
        let region = self.region_len;
        let len = (len as u64).div_ceil(512).max(1) * 512;
        let len = len.min(region);
        let at = match self.spec.remap {
            Remap::Wrap => offset % region,
            Remap::Scale { span } => (offset as u128 * region as u128 / span.max(1) as u128) as u64,
        };
        let at = (at / 512 * 512).min(region - len);
        (self.region_start + at, len as u32)
    }

    /// What the replay did so far (skipped lines counted at the end of each pass).
    pub fn stats(&self) -> ReplayStats {
        let mut s = self.stats.clone();
        if let Some(r) = &self.reader {
            add_skipped(&mut s, r);
        }
        s
    }
}

/// Adds what `reader` skipped to `stats` (the first [`super::KEPT_ERRORS`] lines kept).
fn add_skipped(stats: &mut ReplayStats, reader: &Reader) {
    stats.skipped += reader.skipped();
    for e in reader.errors() {
        if stats.skipped_lines.len() < super::KEPT_ERRORS {
            stats.skipped_lines.push(e.to_string());
        }
    }
}

/// The largest end offset of the records `spec` selects (for [`Remap::Scale`]), read
/// through once; the first problem is an error.
pub fn span(
    path: &std::path::Path,
    format: Option<Format>,
    select: Select,
    on_error: OnError,
) -> Result<u64, super::TraceError> {
    let mut end = 0;
    for r in Reader::open(path, format, select, on_error)? {
        let r = r?;
        end = end.max(r.offset + r.len as u64);
    }
    Ok(end)
}
