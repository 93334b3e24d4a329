use super::*;
use proptest::prelude::*;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// A circular log at `[start, start + size)` written in `block`-byte commits, `passes`
/// times over; answers each write's verdict.
fn log_writes(
    d: &mut JournalDetector,
    start: u64,
    size: u64,
    block: u32,
    passes: u32,
) -> Vec<Verdict> {
    let mut out = Vec::new();
    for _ in 0..passes {
        let mut at = start;
        while at < start + size {
            out.push(d.write(at, block));
            at += u64::from(block);
        }
    }
    out
}

/// A 64 MiB journal in one group: missed on the first pass, marked early in the second
/// (after `min_run_bytes` of it), and every later write is journal.
#[test]
fn a_circular_log_is_marked_on_its_second_pass() {
    let mut d = JournalDetector::new(4 * GIB, JournalParams::default());
    let start = 2 * 128 * MIB + 16 * MIB;
    let verdicts = log_writes(&mut d, start, 64 * MIB, 64 << 10, 3);
    let per_pass = (64 * MIB / (64 << 10)) as usize;
    assert!(verdicts[..per_pass].iter().all(|&v| v == Verdict::Data));
    // Second pass: data until its run is 4 MiB long (64 writes), journal from then on.
    let first_journal = verdicts
        .iter()
        .position(|&v| v == Verdict::Journal)
        .unwrap();
    assert_eq!(first_journal, per_pass + 63);
    assert!(
        verdicts[first_journal..]
            .iter()
            .all(|&v| v == Verdict::Journal)
    );
    assert_eq!(d.journal_groups().collect::<Vec<_>>(), vec![2]);
    assert_eq!(d.marked(), 1);
    assert!(d.is_journal(start) && !d.is_journal(start + 128 * MIB));
}

/// Tracking that starts in the middle of a pass: the first wrap lands below the run's
/// start, which is no wrap (a stream running into a file written before is not a
/// log): the log is found one pass later, with its whole extent.
#[test]
fn tracking_from_the_middle_of_a_pass_finds_the_log_a_pass_later() {
    let mut d = JournalDetector::new(GIB, JournalParams::default());
    let (start, size) = (32 * MIB, 48 * MIB);
    let mut at = start + 20 * MIB;
    while at < start + size {
        let _ = d.write(at, 4096);
        at += 4096;
    }
    let _ = log_writes(&mut d, start, size, 4096, 1);
    assert_eq!(d.marked(), 0);
    let _ = log_writes(&mut d, start, size, 4096, 1);
    assert_eq!(d.journal_groups().collect::<Vec<_>>(), vec![0]);
    assert_eq!(
        d.journal_extents().collect::<Vec<_>>(),
        vec![(start, start + size)]
    );
}

/// A log that restarted from its start before it ever wrapped (the guest remounted):
/// marked on the partial pass, its extent grows to the whole log once two full passes
/// have run.
#[test]
fn a_log_restarted_early_is_covered_after_two_full_passes() {
    let mut d = JournalDetector::new(GIB, JournalParams::default());
    let (start, size) = (32 * MIB, 48 * MIB);
    let _ = log_writes(&mut d, start, 20 * MIB, 4096, 2);
    assert_eq!(
        d.journal_extents().collect::<Vec<_>>(),
        vec![(start, start + 20 * MIB)]
    );
    let verdicts = log_writes(&mut d, start, size, 4096, 3);
    let per_pass = (size / 4096) as usize;
    assert!(
        verdicts[2 * per_pass..]
            .iter()
            .all(|&v| v == Verdict::Journal)
    );
    assert_eq!(
        d.journal_extents().collect::<Vec<_>>(),
        vec![(start, start + size)]
    );
}

/// A journal over two groups is marked in both, each when the log comes back to it.
#[test]
fn a_journal_across_groups_is_marked_in_each() {
    let mut d = JournalDetector::new(GIB, JournalParams::default());
    let _ = log_writes(&mut d, 100 * MIB, 100 * MIB, 128 << 10, 3);
    assert_eq!(d.journal_groups().collect::<Vec<_>>(), vec![0, 1]);
}

/// Data writes landing in the journal's group between its commits do not hide it.
#[test]
fn data_writes_between_commits_do_not_hide_the_journal() {
    let mut d = JournalDetector::new(GIB, JournalParams::default());
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    for _ in 0..3 {
        let mut at = 8 * MIB;
        while at < 40 * MIB {
            let _ = d.write(at, 16 << 10);
            at += 16 << 10;
            for _ in 0..3 {
                let o = rng.random_range(0..128 * MIB / 4096) * 4096;
                let _ = d.write(o, 4096);
            }
        }
    }
    assert_eq!(d.journal_groups().collect::<Vec<_>>(), vec![0]);
}

/// What is not a circular log is not marked: random writes, files written once in
/// order one after another, and one long file followed by a backwards write that does
/// not run on.
#[test]
fn data_is_not_marked() {
    let mut d = JournalDetector::new(4 * GIB, JournalParams::default());
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    for _ in 0..200_000 {
        let o = rng.random_range(0..4 * GIB / 4096) * 4096;
        let _ = d.write(o, 4096 * rng.random_range(1..32));
    }
    // Sequential files, each written once, later ones higher up.
    let mut at = 0;
    for _ in 0..40 {
        let len = rng.random_range(1..64) * MIB;
        let mut o = at;
        while o < at + len {
            let _ = d.write(o, 256 << 10);
            o += 256 << 10;
        }
        at += len + rng.random_range(0..8) * MIB;
    }
    // A long file, then a short write back at its start.
    let mut o = 3 * GIB;
    while o < 3 * GIB + 64 * MIB {
        let _ = d.write(o, 1 << 20);
        o += 1 << 20;
    }
    let _ = d.write(3 * GIB, 4096);
    assert_eq!(
        d.marked(),
        0,
        "{:?}",
        d.journal_groups().collect::<Vec<_>>()
    );
}

/// Writes past the end are ignored; a write over the last group's end is cut there.
#[test]
fn writes_past_the_end_are_ignored() {
    let mut d = JournalDetector::new(200 * MIB, JournalParams::default());
    assert_eq!(d.write(10 * GIB, 4096), Verdict::Data);
    assert_eq!(d.write(200 * MIB - 4096, 1 << 20), Verdict::Data);
    assert_eq!(d.journal_groups().count(), 0);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, .. ProptestConfig::default() })]

    /// A circular log of any size and placement, its commits any size, among random data
    /// writes: marked in every group it covers after its second pass, and no other group.
    #[test]
    fn a_log_among_random_data_is_found_and_nothing_else(
        start_mib in 0u64..900,
        size_mib in 8u64..200,
        commit_kib in prop_oneof![Just(4u32), Just(16), Just(64), Just(512)],
        noise in 0u32..4,
        seed in any::<u64>(),
    ) {
        let capacity = 2 * GIB;
        let mut d = JournalDetector::new(capacity, JournalParams::default());
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let (start, size) = (start_mib * MIB, size_mib * MIB);
        for _ in 0..3 {
            let mut at = start;
            while at < start + size {
                let _ = d.write(at, commit_kib << 10);
                at += u64::from(commit_kib) << 10;
                for _ in 0..noise {
                    let o = rng.random_range(0..capacity / 4096) * 4096;
                    let _ = d.write(o, 4096);
                }
            }
        }
        let g = 128 * MIB;
        let covered: Vec<usize> = ((start / g) as usize..=((start + size - 1) / g) as usize)
            // A group the log only grazes (less than a run's worth) cannot show a run.
            .filter(|&i| {
                let (lo, hi) = (i as u64 * g, (i as u64 + 1) * g);
                (start + size).min(hi) - start.max(lo) >= 4 * MIB + (u64::from(commit_kib) << 10)
            })
            .collect();
        let found: Vec<usize> = d.journal_groups().collect();
        for i in &covered {
            prop_assert!(found.contains(i), "group {i} of {covered:?} not found: {found:?}");
        }
        for i in &found {
            prop_assert!(
                (start / g..=(start + size - 1) / g).contains(&(*i as u64)),
                "group {i} marked, the log is in {covered:?}"
            );
        }
    }
}

/// jbd2 rewrites the journal's first block (its superblock) in place, before the log
/// starts and now and then while it runs. The runs those writes leave at the log's
/// start must not hide the wrap: the second pass is marked after `min_run_bytes`, as
/// without them (found on a captured ext4 stream, where detection waited a whole pass).
#[test]
fn superblock_rewrites_at_the_start_do_not_hide_the_wrap() {
    for sb_during_pass in [false, true] {
        let mut d = JournalDetector::new(4 * GIB, JournalParams::default());
        let start = 15 * 128 * MIB;
        let block = 4096u32;
        // The superblock twice, then the log from block 1.
        for _ in 0..2 {
            let _ = d.write(start, block);
        }
        let mut verdicts = Vec::new();
        for _pass in 0..2 {
            for b in 1..(64 * MIB / 4096) {
                verdicts.push(d.write(start + b * 4096, block));
                if sb_during_pass && b % 3000 == 0 {
                    let _ = d.write(start, block);
                }
            }
        }
        let per_pass = (64 * MIB / 4096 - 1) as usize;
        let first = verdicts
            .iter()
            .position(|&v| v == Verdict::Journal)
            .expect("marked");
        // The second pass continues the superblock's 4 KiB run: 4 MiB after 1023 writes.
        assert_eq!(
            first,
            per_pass + 1022,
            "sb writes during the pass: {sb_during_pass}"
        );
    }
}

/// Sequential writers that are not logs: two streams in one group, and a long stream
/// that runs up to a file written before it. Neither wraps, and neither is marked.
#[test]
fn sequential_writers_side_by_side_are_not_a_log() {
    let mut d = JournalDetector::new(GIB, JournalParams::default());
    for i in 0..(60 * MIB / 65536) {
        let _ = d.write(i * 65536, 65536);
        let _ = d.write(64 * MIB + i * 65536, 65536);
    }
    assert_eq!(d.marked(), 0, "two streams");
    let mut d = JournalDetector::new(GIB, JournalParams::default());
    for i in 0..(8 * MIB / 65536) {
        let _ = d.write(64 * MIB + i * 65536, 65536);
    }
    for i in 0..(64 * MIB / 65536) {
        let _ = d.write(i * 65536, 65536);
    }
    assert_eq!(d.marked(), 0, "a stream up to a file");
}

/// Only the log is journal: data written right after the log's end, or in a long run
/// right before its start, stays data once the log is found.
#[test]
fn the_log_extent_does_not_take_in_neighbouring_data() {
    let mut d = JournalDetector::new(GIB, JournalParams::default());
    let (start, size) = (40 * MIB, 16 * MIB);
    // A superblock write, then two and a half passes of the log.
    let _ = d.write(start, 4096);
    for _ in 0..2 {
        for b in 1..(size / 4096) {
            let _ = d.write(start + b * 4096, 4096);
        }
    }
    assert_eq!(d.marked(), 1);
    assert_eq!(
        d.journal_extents().collect::<Vec<_>>(),
        vec![(start, start + size)]
    );
    // Data just past the end, sequentially, and a long run ending at the start.
    for i in 0..1024 {
        assert_eq!(d.write(start + size + i * 4096, 4096), Verdict::Data);
    }
    for i in 0..1024 {
        assert_eq!(d.write(start - 4 * MIB + i * 4096, 4096), Verdict::Data);
    }
    // The log's next pass is still journal, write by write.
    for b in 1..(size / 4096) {
        assert_eq!(d.write(start + b * 4096, 4096), Verdict::Journal);
    }
    assert_eq!(
        d.journal_extents().collect::<Vec<_>>(),
        vec![(start, start + size)]
    );
}

/// `newly_marked` names the groups the last write marked, and only that write's.
#[test]
fn newly_marked_names_the_groups_of_the_marking_write() {
    let mut d = JournalDetector::new(GIB, JournalParams::default());
    let mut marks = Vec::new();
    let (start, size) = (100 * MIB, 100 * MIB);
    for _ in 0..3 {
        let mut at = start;
        while at < start + size {
            let _ = d.write(at, 1 << 20);
            marks.extend_from_slice(d.newly_marked());
            at += 1 << 20;
        }
    }
    assert_eq!(marks, vec![0, 1]);
    assert_eq!(d.marked(), 2);
    let _ = d.write(0, 4096);
    assert!(d.newly_marked().is_empty());
}
