//! `ioshare trace stats`: what a trace asks of a device, in one pass, in memory bounded
//! by the trace's footprint rather than its length — the figures the papers' workload
//! tables give (requests, read/write ratio by count and bytes, size distribution,
//! IOPS over time, inter-arrival times, sequentiality, footprint and working set).
//!
//! Readings:
//! * **Sequential**: a request that starts where the previous request *on its volume*
//!   ended (flushes do not count and do not move the position).
//! * **Footprint**: distinct 4 KiB blocks a request touched, over all volumes;
//!   **reused**: those touched by more than one request — the part of the footprint a
//!   cache can win on. Both exact (bitmaps per GiB touched).
//! * **IOPS over time**: requests per bin from the first record; bins start at a second
//!   and double (pairs merged) whenever the trace would need more than [`MAX_BINS`].
//! * Sizes and gaps in power-of-two buckets (`bucket k` holds `[2^k, 2^(k+1))`, gaps of
//!   0 in bucket 0).

use super::Record;
use crate::types::{Nanos, Op};
use serde::Serialize;
use std::collections::HashMap;
use std::fmt::Write as _;

/// The most IOPS bins kept; past it bins double in width.
pub const MAX_BINS: usize = 4096;
/// The most volumes whose positions are followed for sequentiality.
pub const MAX_VOLUMES: usize = 65_536;

const BLOCK: u64 = 4096;
const BLOCKS_PER_CHUNK: u64 = 1 << 18; // 1 GiB of 4 KiB blocks

/// Counts of one kind of request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct OpCount {
    /// Requests.
    pub requests: u64,
    /// Bytes.
    pub bytes: u64,
}

/// A trace's figures (see the module).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TraceStats {
    /// Requests (flushes included).
    pub requests: u64,
    /// Reads.
    pub reads: OpCount,
    /// Writes.
    pub writes: OpCount,
    /// Trims.
    pub trims: OpCount,
    /// Flushes.
    pub flushes: u64,
    /// Reads as a fraction of reads and writes, by count.
    pub read_fraction: f64,
    /// Reads as a fraction of read and written bytes.
    pub read_byte_fraction: f64,
    /// Seconds from the first record to the last.
    pub span_s: f64,
    /// Requests a second over the span.
    pub mean_iops: f64,
    /// Mean size of reads, writes and trims, bytes.
    pub mean_size: f64,
    /// Size buckets: `(smallest size of the bucket, requests)`, non-empty ones.
    pub sizes: Vec<(u64, u64)>,
    /// Gaps between consecutive requests, ns buckets: `(smallest gap, count)`.
    pub interarrival_ns: Vec<(u64, u64)>,
    /// Fraction of reads, writes and trims that start where their volume's previous one ended.
    pub sequential_fraction: f64,
    /// Distinct 4 KiB blocks touched, bytes.
    pub footprint_bytes: u64,
    /// Blocks touched by more than one request, bytes.
    pub reused_bytes: u64,
    /// Distinct volumes.
    pub volumes: u64,
    /// Width of an IOPS bin, seconds.
    pub bin_s: f64,
    /// Requests in each bin from the first record.
    pub per_bin: Vec<u64>,
    /// Records whose time went back (replayed at the later time).
    pub out_of_order: u64,
}

/// Builds [`TraceStats`] one record at a time.
#[derive(Debug)]
pub struct Collector {
    reads: OpCount,
    writes: OpCount,
    trims: OpCount,
    flushes: u64,
    sizes: [u64; 64],
    gaps: [u64; 64],
    sequential: u64,
    last_time: Option<Nanos>,
    first_time: Option<Nanos>,
    out_of_order: u64,
    ends: HashMap<u64, u64>,
    seen: HashMap<u64, Box<[u64]>>,
    again: HashMap<u64, Box<[u64]>>,
    footprint: u64,
    reused: u64,
    bin_ns: Nanos,
    bins: Vec<u64>,
}

fn bucket(x: u64) -> usize {
    if x == 0 {
        0
    } else {
        63 - x.leading_zeros() as usize
    }
}

/// Sets `block`'s bit in `map`; whether it was clear.
fn mark(map: &mut HashMap<u64, Box<[u64]>>, block: u64) -> bool {
    let chunk = map
        .entry(block / BLOCKS_PER_CHUNK)
        .or_insert_with(|| vec![0u64; (BLOCKS_PER_CHUNK / 64) as usize].into_boxed_slice());
    let i = block % BLOCKS_PER_CHUNK;
    let (word, bit) = ((i / 64) as usize, 1u64 << (i % 64));
    let was_clear = chunk[word] & bit == 0;
    chunk[word] |= bit;
    was_clear
}

impl Default for Collector {
    fn default() -> Self {
        Collector::new()
    }
}

impl Collector {
    /// An empty collector.
    pub fn new() -> Collector {
        Collector {
            reads: OpCount::default(),
            writes: OpCount::default(),
            trims: OpCount::default(),
            flushes: 0,
            sizes: [0; 64],
            gaps: [0; 64],
            sequential: 0,
            last_time: None,
            first_time: None,
            out_of_order: 0,
            ends: HashMap::new(),
            seen: HashMap::new(),
            again: HashMap::new(),
            footprint: 0,
            reused: 0,
            bin_ns: 1_000_000_000,
            bins: Vec::new(),
        }
    }

    /// Counts one record.
    pub fn add(&mut self, r: &Record) {
        let first = *self.first_time.get_or_insert(r.time);
        if let Some(last) = self.last_time {
            if r.time < last {
                self.out_of_order += 1;
            }
            self.gaps[bucket(r.time.saturating_sub(last))] += 1;
        }
        self.last_time = Some(self.last_time.map_or(r.time, |l| l.max(r.time)));
        self.bin(r.time.saturating_sub(first));
        let count = match r.op {
            Op::Flush => {
                self.flushes += 1;
                return;
            }
            Op::Read => &mut self.reads,
            Op::Write => &mut self.writes,
            Op::Trim => &mut self.trims,
            Op::Status => unreachable!("a trace's records are data requests and flushes"),
        };
        count.requests += 1;
        count.bytes += r.len as u64;
        self.sizes[bucket(r.len as u64)] += 1;
        let end = r.offset + r.len as u64;
        let key = r.volume;
        if self.ends.get(&key) == Some(&r.offset) {
            self.sequential += 1;
        }
        if self.ends.len() < MAX_VOLUMES || self.ends.contains_key(&key) {
            self.ends.insert(key, end);
        }
        // Volumes apart: a volume's blocks from 2^44 blocks (64 PiB) up.
        let base = (r.volume & 0xfffff) << 44;
        for b in r.offset / BLOCK..end.div_ceil(BLOCK) {
            if mark(&mut self.seen, base | b) {
                self.footprint += 1;
            } else if mark(&mut self.again, base | b) {
                self.reused += 1;
            }
        }
    }

    fn bin(&mut self, since_first: Nanos) {
        let mut i = (since_first / self.bin_ns) as usize;
        while i >= MAX_BINS {
            let merged: Vec<u64> = self.bins.chunks(2).map(|p| p.iter().sum()).collect();
            self.bins = merged;
            self.bin_ns *= 2;
            i = (since_first / self.bin_ns) as usize;
        }
        if self.bins.len() <= i {
            self.bins.resize(i + 1, 0);
        }
        self.bins[i] += 1;
    }

    /// The figures.
    pub fn finish(self) -> TraceStats {
        let data = self.reads.requests + self.writes.requests + self.trims.requests;
        let requests = data + self.flushes;
        let span = self.last_time.unwrap_or(0) - self.first_time.unwrap_or(0);
        let span_s = span as f64 / 1e9;
        let ratio = |a: u64, b: u64| {
            if a + b == 0 {
                0.0
            } else {
                a as f64 / (a + b) as f64
            }
        };
        let buckets = |b: &[u64; 64]| -> Vec<(u64, u64)> {
            b.iter()
                .enumerate()
                .filter(|(_, n)| **n > 0)
                .map(|(k, &n)| (if k == 0 { 0 } else { 1u64 << k }, n))
                .collect()
        };
        let mut sizes = buckets(&self.sizes);
        if let Some(first) = sizes.first_mut()
            && first.0 == 0
        {
            first.0 = 1;
        }
        TraceStats {
            requests,
            reads: self.reads,
            writes: self.writes,
            trims: self.trims,
            flushes: self.flushes,
            read_fraction: ratio(self.reads.requests, self.writes.requests),
            read_byte_fraction: ratio(self.reads.bytes, self.writes.bytes),
            span_s,
            mean_iops: if span > 0 {
                requests as f64 / span_s
            } else {
                0.0
            },
            mean_size: if data > 0 {
                (self.reads.bytes + self.writes.bytes + self.trims.bytes) as f64 / data as f64
            } else {
                0.0
            },
            sizes,
            interarrival_ns: buckets(&self.gaps),
            sequential_fraction: if data > 0 {
                self.sequential as f64 / data as f64
            } else {
                0.0
            },
            footprint_bytes: self.footprint * BLOCK,
            reused_bytes: self.reused * BLOCK,
            volumes: self.ends.len() as u64,
            bin_s: self.bin_ns as f64 / 1e9,
            per_bin: self.bins,
            out_of_order: self.out_of_order,
        }
    }
}

/// `ns` as "850 ns", "12 µs", "3 ms", "2 s" (the gap buckets' labels, here and in the
/// page's histogram).
pub fn format_gap(ns: u64) -> String {
    match ns {
        0..1_000 => format!("{ns} ns"),
        1_000..1_000_000 => format!("{} µs", ns / 1_000),
        1_000_000..1_000_000_000 => format!("{} ms", ns / 1_000_000),
        _ => format!("{} s", ns / 1_000_000_000),
    }
}

impl TraceStats {
    /// The figures as text.
    pub fn render(&self) -> String {
        use crate::units::format_bytes;
        let mut s = String::new();
        let _ = writeln!(s, "requests        {}", self.requests);
        for (name, c) in [
            ("reads", self.reads),
            ("writes", self.writes),
            ("trims", self.trims),
        ] {
            let _ = writeln!(s, "{name:<15} {} ({})", c.requests, format_bytes(c.bytes));
        }
        let _ = writeln!(s, "flushes         {}", self.flushes);
        let _ = writeln!(
            s,
            "read fraction   {:.1} % of requests, {:.1} % of bytes",
            100.0 * self.read_fraction,
            100.0 * self.read_byte_fraction
        );
        let _ = writeln!(
            s,
            "span            {:.3} s, {:.1} IOPS",
            self.span_s, self.mean_iops
        );
        let _ = writeln!(s, "mean size       {}", format_bytes(self.mean_size as u64));
        let _ = writeln!(
            s,
            "sequential      {:.1} %",
            100.0 * self.sequential_fraction
        );
        let _ = writeln!(
            s,
            "footprint       {} ({} reused)",
            format_bytes(self.footprint_bytes),
            format_bytes(self.reused_bytes)
        );
        let _ = writeln!(s, "volumes         {}", self.volumes);
        if self.out_of_order > 0 {
            let _ = writeln!(s, "out of order    {} records", self.out_of_order);
        }
        let _ = writeln!(s, "sizes:");
        for (low, n) in &self.sizes {
            let _ = writeln!(s, "  >= {:<10} {n}", format_bytes(*low));
        }
        let _ = writeln!(s, "gaps between requests:");
        for (low, n) in &self.interarrival_ns {
            let _ = writeln!(s, "  >= {:<10} {n}", format_gap(*low));
        }
        let peak = self.per_bin.iter().max().copied().unwrap_or(0);
        let _ = writeln!(
            s,
            "IOPS per {} s bin: peak {:.1}, {} bins",
            self.bin_s,
            peak as f64 / self.bin_s,
            self.per_bin.len()
        );
        s
    }
}
