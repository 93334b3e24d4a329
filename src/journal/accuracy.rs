//! How well the journal detector finds a real journal: a captured request stream
//! ([`crate::iolog`]) is fed to a [`JournalDetector`] as the server would feed it, and
//! every write's verdict is scored against the journal's true place on the disk (its
//! extents from `debugfs -R "stat <8>"`).
//!
//! Readings:
//! * Per byte: a write's bytes inside the journal are journal bytes. Routed as journal,
//!   they are true positives; bytes outside the journal routed as journal are false
//!   positives (data a guest wrote next to its journal in the same group).
//! * The *first wrap* is the first journal write that starts more than half the
//!   journal before the one before it, in the journal's logical order (its extents as
//!   listed), not counting writes to the journal's first block (jbd2's superblock,
//!   rewritten in place as the log's tail moves). Half, because a commit split across
//!   two extents can reach the server in either order. The bytes before it are the
//!   first pass, which the paper's detector misses by design; recall is reported after
//!   it.
//! * Per group: a group is a journal group when the journal has a block in it.

use super::{JournalDetector, JournalParams, Verdict};
use crate::iolog::{Action, Entry};
use serde::Serialize;
use std::ops::Range;

/// The byte ranges of a journal from `debugfs -R "stat <8>"` output: its extent lines,
/// `(0-16383):491520-507903` (logical blocks, then physical) or `(5):1234` for one
/// block, separated by commas or lines; `block_size` is the file system's.
pub fn debugfs_extents(text: &str, block_size: u64) -> Result<Vec<Range<u64>>, String> {
    let mut out: Vec<Range<u64>> = Vec::new();
    let start = text.find("EXTENTS:").map_or(0, |i| i + "EXTENTS:".len());
    for item in text[start..].split([',', '\n']) {
        let item = item.trim();
        if item.is_empty() {
            continue;
        }
        // Lines past the extent list (dumpe2fs headers, say) end it.
        if !item.starts_with('(') {
            break;
        }
        let Some((_, physical)) = item.split_once(':') else {
            return Err(format!(
                "'{item}': no ':' between logical and physical blocks"
            ));
        };
        let physical = physical.trim();
        // Index blocks of the extent tree are listed as "(ETB0):1234": not journal.
        if item.starts_with("(ETB") {
            continue;
        }
        let number = |s: &str| {
            s.trim()
                .parse::<u64>()
                .map_err(|_| format!("'{item}': '{s}' is not a block number"))
        };
        let (a, b) = match physical.split_once('-') {
            Some((a, b)) => (number(a)?, number(b)?),
            None => {
                let a = number(physical)?;
                (a, a)
            }
        };
        if b < a {
            return Err(format!("'{item}': the extent ends before it starts"));
        }
        out.push(a * block_size..(b + 1) * block_size);
    }
    if out.is_empty() {
        return Err("no extents found (expected lines like (0-16383):491520-507903)".into());
    }
    Ok(out)
}

/// The detector's accuracy on one export's stream.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Accuracy {
    /// Writes in the stream.
    pub writes: u64,
    /// Bytes they wrote.
    pub written_bytes: u64,
    /// Of those, bytes inside the journal.
    pub journal_bytes: u64,
    /// Journal bytes written before the first wrap (the first pass).
    pub first_pass_bytes: u64,
    /// Microseconds into the stream of the first wrap (`None`: the log never wrapped).
    pub first_wrap_us: Option<u64>,
    /// Microseconds into the stream of the first group marked journal.
    pub detected_us: Option<u64>,
    /// Journal bytes routed as journal.
    pub true_positive_bytes: u64,
    /// Data bytes routed as journal.
    pub false_positive_bytes: u64,
    /// Journal bytes routed as data before the first wrap.
    pub missed_first_pass_bytes: u64,
    /// Journal bytes routed as data after the first wrap.
    pub missed_after_wrap_bytes: u64,
    /// Groups holding journal blocks.
    pub journal_groups: Vec<usize>,
    /// Groups the detector marked.
    pub marked_groups: Vec<usize>,
}

impl Accuracy {
    /// Share of the bytes routed as journal that are journal (1 when none were routed).
    pub fn byte_precision(&self) -> f64 {
        ratio(
            self.true_positive_bytes,
            self.true_positive_bytes + self.false_positive_bytes,
        )
    }

    /// Share of the journal bytes written after the first wrap that were routed as
    /// journal (1 when there were none).
    pub fn byte_recall_after_wrap(&self) -> f64 {
        let found = self.journal_bytes - self.first_pass_bytes - self.missed_after_wrap_bytes;
        ratio(found, self.journal_bytes - self.first_pass_bytes)
    }

    /// Share of the marked groups that hold journal blocks (1 when none are marked).
    pub fn group_precision(&self) -> f64 {
        let right = self
            .marked_groups
            .iter()
            .filter(|g| self.journal_groups.contains(g))
            .count();
        ratio(right as u64, self.marked_groups.len() as u64)
    }

    /// Share of the journal's groups that were marked (1 when the journal has none).
    pub fn group_recall(&self) -> f64 {
        let found = self
            .journal_groups
            .iter()
            .filter(|g| self.marked_groups.contains(g))
            .count();
        ratio(found as u64, self.journal_groups.len() as u64)
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 1.0 } else { a as f64 / b as f64 }
}

/// Bytes of `offset..offset + len` inside `journal`.
fn overlap(journal: &[Range<u64>], offset: u64, len: u64) -> u64 {
    journal
        .iter()
        .map(|r| {
            let a = r.start.max(offset);
            let b = r.end.min(offset + len);
            b.saturating_sub(a)
        })
        .sum()
}

/// Feeds the writes of `file` in `entries` to a detector for an export of `capacity`
/// bytes and scores its verdicts against `journal`'s byte ranges.
pub fn score(
    entries: &[Entry],
    file: &str,
    capacity: u64,
    params: JournalParams,
    journal: &[Range<u64>],
) -> Accuracy {
    let mut d = JournalDetector::new(capacity, params);
    let superblock = journal.first().map(|r| r.start..r.start + 4096);
    let mut a = Accuracy {
        writes: 0,
        written_bytes: 0,
        journal_bytes: 0,
        first_pass_bytes: 0,
        first_wrap_us: None,
        detected_us: None,
        true_positive_bytes: 0,
        false_positive_bytes: 0,
        missed_first_pass_bytes: 0,
        missed_after_wrap_bytes: 0,
        journal_groups: Vec::new(),
        marked_groups: Vec::new(),
    };
    let mut last_journal: Option<u64> = None;
    let size: u64 = journal.iter().map(|r| r.end - r.start).sum();
    // A byte's place in the journal's logical order.
    let logical = |offset: u64| {
        let mut before = 0;
        for r in journal {
            if r.contains(&offset) {
                return Some(before + offset - r.start);
            }
            before += r.end - r.start;
        }
        None
    };
    for e in entries {
        if e.file != file || e.action != Action::Write || e.zero {
            continue;
        }
        let len = e.len.min(u64::from(u32::MAX)) as u32;
        let verdict = d.write(e.offset, len);
        if a.detected_us.is_none() && d.marked() > 0 {
            a.detected_us = Some(e.time_us);
        }
        let inside = overlap(journal, e.offset, e.len);
        a.writes += 1;
        a.written_bytes += e.len;
        a.journal_bytes += inside;
        if let Some(at) = logical(e.offset)
            && !superblock.as_ref().is_some_and(|s| s.contains(&e.offset))
        {
            if a.first_wrap_us.is_none() && last_journal.is_some_and(|l| at + size / 2 < l) {
                a.first_wrap_us = Some(e.time_us);
            }
            last_journal = Some(at);
        }
        let first_pass = a.first_wrap_us.is_none();
        if first_pass {
            a.first_pass_bytes += inside;
        }
        match verdict {
            Verdict::Journal => {
                a.true_positive_bytes += inside;
                a.false_positive_bytes += e.len - inside;
            }
            Verdict::Data if first_pass => a.missed_first_pass_bytes += inside,
            Verdict::Data => a.missed_after_wrap_bytes += inside,
        }
    }
    let g = params.group_bytes;
    let groups = capacity.div_ceil(g) as usize;
    a.journal_groups = (0..groups)
        .filter(|&i| overlap(journal, i as u64 * g, g) > 0)
        .collect();
    a.marked_groups = d.journal_groups().collect();
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debugfs_extents_are_byte_ranges() {
        let text = "Inode: 8   Type: regular\nEXTENTS:\n(0-16383):491520-507903\n";
        assert_eq!(
            debugfs_extents(text, 4096).unwrap(),
            vec![491520 * 4096..507904 * 4096]
        );
        let text = "EXTENTS:\n(ETB0):100, (0-1):300-301, (2):200\nBlock count: 5\n";
        assert_eq!(
            debugfs_extents(text, 1024).unwrap(),
            vec![300 * 1024..302 * 1024, 200 * 1024..201 * 1024],
            "in logical order"
        );
        assert!(debugfs_extents("EXTENTS:\n", 4096).is_err());
        assert!(
            debugfs_extents("(0-1):9-x", 4096)
                .unwrap_err()
                .contains("'x'")
        );
    }

    fn w(time_us: u64, offset: u64, len: u64) -> Entry {
        Entry {
            time_us,
            file: "g".into(),
            action: Action::Write,
            offset,
            len,
            fua: false,
            zero: false,
        }
    }

    #[test]
    fn a_log_is_scored_after_its_first_wrap() {
        // A 8 MiB log at 16 MiB in a 64 MiB export, three passes of 64 KiB writes,
        // the superblock written now and then, and data elsewhere.
        let mib = 1u64 << 20;
        let journal = std::iter::once(16 * mib..24 * mib).collect::<Vec<_>>();
        let mut entries = Vec::new();
        let mut t = 0;
        for _pass in 0..3 {
            for i in 0..127 {
                t += 1;
                entries.push(w(t, 16 * mib + 4096 + i * 65536, 65536));
                if i % 32 == 0 {
                    entries.push(w(t, 16 * mib, 4096));
                    entries.push(w(t, 40 * mib + i * 4096 * 3, 4096));
                }
            }
        }
        let params = JournalParams {
            group_bytes: 32 * mib,
            ..JournalParams::default()
        };
        let a = score(&entries, "g", 64 * mib, params, &journal);
        assert_eq!(a.journal_groups, vec![0]);
        assert_eq!(a.marked_groups, vec![0]);
        assert_eq!(a.group_precision(), 1.0);
        assert_eq!(a.group_recall(), 1.0);
        // The first pass: 127 writes of 64 KiB and 4 superblock writes.
        assert_eq!(a.first_pass_bytes, 127 * 65536 + 4 * 4096);
        assert_eq!(a.first_wrap_us, Some(128));
        assert_eq!(a.false_positive_bytes, 0, "data is in another group");
        assert!(a.detected_us.unwrap() > a.first_wrap_us.unwrap());
        // The second pass is marked once it has run confirm_bytes (4 MiB): 64 writes.
        assert_eq!(a.missed_after_wrap_bytes, 63 * 65536 + 2 * 4096);
        assert_eq!(a.byte_precision(), 1.0);
        assert!(a.byte_recall_after_wrap() > 0.7);
    }
}
