//! The journal detector on real ext4 request streams (captured with `serve --capture`,
//! see tests/data/pdc/README.md), scored against the journal's extents from debugfs.

use ioshare::iolog::{self, Action, Entry};
use ioshare::journal::accuracy::{self, debugfs_extents};
use ioshare::journal::{JournalDetector, JournalParams, Verdict};
use std::io::Read;
use std::ops::Range;

const MIB: u64 = 1 << 20;

fn load(name: &str) -> (Vec<Entry>, Vec<Range<u64>>) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/pdc");
    let gz = std::fs::File::open(dir.join(format!("{name}.iolog.gz"))).unwrap();
    let mut text = String::new();
    flate2::read::GzDecoder::new(gz)
        .read_to_string(&mut text)
        .unwrap();
    let entries = iolog::parse(&text).unwrap();
    let debugfs = std::fs::read_to_string(dir.join(format!("{name}.debugfs.txt"))).unwrap();
    (entries, debugfs_extents(&debugfs, 4096).unwrap())
}

fn inside(journal: &[Range<u64>], e: &Entry) -> bool {
    journal
        .iter()
        .any(|r| e.offset < r.end && e.offset + e.len > r.start)
}

fn capacity(entries: &[Entry]) -> u64 {
    entries.iter().map(|e| e.offset + e.len).max().unwrap()
}

/// Every stream: the journal's groups and only they are marked, no data byte is routed
/// as journal, and after the log's first wrap each group misses at most its
/// confirmation run (`confirm_bytes`) of journal.
#[test]
fn ext4_journals_are_found_and_nothing_else() {
    let params = JournalParams::default();
    for (name, groups) in [
        ("ext4-def", vec![15]),
        ("ext4-j16", vec![8]),
        ("ext4-j256", vec![15, 16, 17]),
    ] {
        let (entries, journal) = load(name);
        let a = accuracy::score(&entries, "g", capacity(&entries), params, &journal);
        assert_eq!(a.journal_groups, groups, "{name}");
        assert_eq!(a.marked_groups, groups, "{name}: {a:?}");
        assert_eq!(a.false_positive_bytes, 0, "{name}");
        assert_eq!(a.byte_precision(), 1.0);
        // The first pass is all the detector misses before the wrap...
        assert_eq!(a.missed_first_pass_bytes, a.first_pass_bytes, "{name}");
        // ...and after it, each group's confirmation (the superblock's rewrites in the
        // same span may add a few blocks).
        let bound = groups.len() as u64 * (params.confirm_bytes + 256 * 1024);
        assert!(
            a.missed_after_wrap_bytes <= bound,
            "{name}: {} missed after the wrap",
            a.missed_after_wrap_bytes
        );
        assert!(a.missed_after_wrap_bytes >= params.confirm_bytes - 64 * 1024);
        let (wrap, found) = (a.first_wrap_us.unwrap(), a.detected_us.unwrap());
        assert!(found > wrap && found - wrap < 500_000, "{name}: {a:?}");
    }
}

/// Once a group is marked, every journal write in it is journal: recall after
/// detection is exact, write by write.
#[test]
fn after_detection_every_journal_write_is_journal() {
    for name in ["ext4-def", "ext4-j16", "ext4-j256"] {
        let (entries, journal) = load(name);
        let mut d = JournalDetector::new(capacity(&entries), JournalParams::default());
        let (mut checked, mut wrong) = (0, 0);
        for e in entries
            .iter()
            .filter(|e| e.action == Action::Write && !e.zero)
        {
            // The group's log is known once its pass has covered this spot: from the
            // next pass on (the superblock block is rewritten before the log reaches
            // it again, so it is judged like the rest).
            let known = d
                .journal_extents()
                .any(|(a, b)| e.offset >= a && e.offset + e.len <= b);
            let v = d.write(e.offset, e.len as u32);
            if known && inside(&journal, e) {
                checked += 1;
                wrong += u64::from(v != Verdict::Journal);
            }
        }
        assert!(checked > 1000, "{name}: {checked} writes checked");
        assert_eq!(wrong, 0, "{name}: of {checked}");
    }
}

/// The same streams without their journal writes: the file system's data and metadata
/// alone (small files created and deleted, blocks reused) mark no group.
#[test]
fn ext4_data_alone_marks_nothing() {
    for name in ["ext4-def", "ext4-j16", "ext4-j256"] {
        let (entries, journal) = load(name);
        let mut d = JournalDetector::new(capacity(&entries), JournalParams::default());
        let mut writes = 0;
        for e in entries
            .iter()
            .filter(|e| e.action == Action::Write && !e.zero && !inside(&journal, e))
        {
            writes += 1;
            assert_eq!(
                d.write(e.offset, e.len as u32),
                Verdict::Data,
                "{name}: {e:?}"
            );
        }
        assert!(writes > 3000, "{name}: {writes}");
        assert_eq!(d.marked(), 0, "{name}");
    }
}

/// The detector's readings matter: with runs that may skip 64 KiB and a 1 MiB
/// confirmation, files freed and reallocated from a group's start chain into runs that
/// wrap like a log (the false positive the defaults avoid).
#[test]
fn loose_runs_take_block_reuse_for_a_log() {
    let (entries, journal) = load("ext4-def");
    let params = JournalParams {
        confirm_bytes: MIB,
        gap_bytes: 64 << 10,
        ..JournalParams::default()
    };
    let a = accuracy::score(&entries, "g", capacity(&entries), params, &journal);
    assert!(a.group_precision() < 1.0, "{a:?}");
}
