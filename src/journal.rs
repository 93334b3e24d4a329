//! Guest file-system journal detection for the PDC cache mode (Kim & Lee, "Analysis and
//! improvement of I/O performance degradation by journaling in a virtualized
//! environment"; the English specification's "Mechanism", item 1).
//!
//! The paper keeps, per 128 MB group of the disk (ext4's block group), the most recent
//! write address, and marks as *journal* the groups whose writes run sequentially and
//! then wrap around and repeat: a circular log. It misses the first pass over the
//! journal; after that its detection matches the ground truth.
//!
//! Readings chosen (the paper gives the rule, not its thresholds), checked against
//! real ext4 request streams (`tests/journal_ext4.rs`, `bench/pdc.sh`'s accuracy part):
//! * A *run* is a stretch of writes each starting where the last ended (`gap_bytes`
//!   past it at most; default 0: jbd2 writes its log without holes, while ext4's
//!   allocator leaves small holes between files, and with a 64 KiB gap dbench's
//!   files, freed and reallocated from a group's start, chained into runs that wrapped
//!   like a log: 50–90 MiB of data routed as journal in 40 s). A group follows up to
//!   [`RUNS`] runs at once, so data writes landing in a journal's group between its
//!   commits do not break the journal's run; a write that extends none replaces the
//!   run that grew least recently, never the longest. Up to `RUNS - 2` data writes in
//!   the group between two commits leave the journal's run in place.
//! * A *wrap* is a write that starts within `wrap_tolerance_bytes` of the start of a
//!   run at least `min_run_bytes` long: the log came back to its beginning. It starts
//!   a run of its own, remembered as a second pass. A short run (at most
//!   `wrap_tolerance_bytes`) that itself starts where a wrap would, and is extended,
//!   becomes the second pass: jbd2 rewrites the log's first block (its superblock) in
//!   place, and the log's next pass continues from it. Of several runs a write
//!   extends, a second pass wins, then the longest. A long run never turns into a
//!   second pass (two sequential writers in one group do not make a log), and a
//!   stream that starts more than `wrap_tolerance_bytes` before a long run and runs
//!   into it is no wrap. Where tracking began in the middle of a pass, the log is found
//!   one pass later.
//! * A group is marked journal when a second pass has itself run `confirm_bytes`: the
//!   log wrapped *and repeated*, which one backwards write after a long sequential file
//!   does not do. Marks are kept (a file system's journal does not move while mounted).
//! * Only the log is journal, not its whole group: when a group is marked, its log is
//!   taken to span the marking pass and the pass it wrapped from (the run that wrap
//!   came back to most recently), and a write is journal when it overlaps that extent.
//!   ext4 puts block bitmaps and inode tables beside a journal that does not fill its
//!   group; those stay cached. When a later pass begins, the extent widens to where
//!   the last two passes both ended: a log that restarted before it ever wrapped (a
//!   remount) is covered once two full passes have run, while data a guest wrote
//!   right after the log's end, which joins that one pass's run, is not taken in.
//! * A write that spans groups counts in each, cut at the boundary; a journal larger
//!   than a group is then detected group by group, each when the log comes back to the
//!   group's first journal block. A journal's part in a group shorter than
//!   `min_run_bytes` is not found there.
//! * Known false positive, as in the paper: a region of at least `min_run_bytes`
//!   rewritten sequentially from the same start (once is enough: a fixed-size log an
//!   application keeps, a large file rewritten in place) is a circular log too, and is
//!   marked.
//! * jbd2's journal, zeroed at `mkfs` (`lazy_journal_init=0`), arrives as zeroing
//!   requests, which the server does not feed to the detector: the first pass it
//!   misses is the log's own.
//!
//! Sans-I/O and bounded: one fixed-size entry per group of the export, nothing else
//! grows.

/// Runs followed per group at once.
pub const RUNS: usize = 8;
/// Groups of one export at most (about 310 bytes each: 2.4 GiB at the bound, a 1 PiB
/// export in 128 MiB groups; a 1 TiB export takes 2.4 MiB).
pub const MAX_GROUPS: u64 = 1 << 23;
const _: () = assert!(RUNS > 1, "one slot is kept for the longest run");

/// The detector's thresholds; defaults are the paper's group and readings for ext4's
/// journal (jbd2 writes whole blocks in order; a pass covers at least its 32 MiB
/// minimum journal).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct JournalParams {
    /// Size of a group (ext4's block group: 128 MiB), bytes.
    pub group_bytes: u64,
    /// A run this long before a wrap makes the wrap a possible second pass, bytes.
    pub min_run_bytes: u64,
    /// A second pass this long confirms a circular log, bytes.
    pub confirm_bytes: u64,
    /// A wrap may land this far before or past the start of the run it returns to,
    /// bytes.
    pub wrap_tolerance_bytes: u64,
    /// A write this far past a run's end still extends it, bytes (0: only a write
    /// that starts where the run ends).
    pub gap_bytes: u64,
}

/// A threshold that cannot work: the field (as `[backend.pdc]` names it) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadParam {
    /// `group`, `min_run`, `confirm` or `wrap_tolerance`.
    pub field: &'static str,
    /// What is wrong with it.
    pub problem: String,
}

impl JournalParams {
    /// Checks the thresholds against each other ([`JournalDetector::new`] asserts what
    /// this answers).
    pub fn check(&self) -> Result<(), BadParam> {
        let bad = |field, problem: String| Err(BadParam { field, problem });
        let group = crate::units::format_bytes(self.group_bytes);
        if self.group_bytes < 4096 || !self.group_bytes.is_multiple_of(4096) {
            return bad(
                "group",
                format!("{group} is not a whole number of 4 KiB blocks of at least one"),
            );
        }
        for (field, v) in [
            ("min_run", self.min_run_bytes),
            ("confirm", self.confirm_bytes),
        ] {
            if v == 0 || v > self.group_bytes {
                return bad(
                    field,
                    format!("must be more than 0 and at most the group ({group})"),
                );
            }
        }
        if self.wrap_tolerance_bytes >= self.min_run_bytes {
            return bad(
                "wrap_tolerance",
                format!(
                    "must be less than min_run ({}): a run's own next write would count as its wrap",
                    crate::units::format_bytes(self.min_run_bytes)
                ),
            );
        }
        Ok(())
    }
}

impl Default for JournalParams {
    fn default() -> Self {
        JournalParams {
            group_bytes: 128 << 20,
            min_run_bytes: 4 << 20,
            confirm_bytes: 4 << 20,
            wrap_tolerance_bytes: 1 << 20,
            gap_bytes: 0,
        }
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Run {
    start: u64,
    end: u64,
    /// Began with a wrap (a second pass).
    second_pass: bool,
    /// Was extended at least once.
    grown: bool,
    /// When it last grew (the group's write count).
    used: u64,
}

impl Run {
    fn len(&self) -> u64 {
        self.end - self.start
    }
}

#[derive(Debug, Clone, Default)]
struct Group {
    runs: [Option<Run>; RUNS],
    writes: u64,
    /// The log's extent in the group (set when the group is marked).
    log: Option<(u64, u64)>,
    /// Where the log's last pass ended, as seen when the next one began.
    last_pass_end: Option<u64>,
}

/// What one write was found to be.
#[must_use]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// It overlaps the log found in its group (a write marking the group counts
    /// already).
    Journal,
    /// Not (or not yet) known to be journal.
    Data,
}

/// The detector for one export (one guest disk).
#[derive(Debug, Clone)]
pub struct JournalDetector {
    params: JournalParams,
    groups: Vec<Group>,
    marked: u64,
    /// The groups the last write marked (kept for its allocation).
    newly: Vec<usize>,
}

impl JournalDetector {
    /// A detector for an export of `capacity` bytes. `params.group_bytes` must be at
    /// least 4 KiB, `confirm_bytes` more than 0 and `wrap_tolerance_bytes` less than
    /// `min_run_bytes` (else a run's own next write would be its wrap).
    pub fn new(capacity: u64, params: JournalParams) -> Self {
        assert!(params.group_bytes >= 4096, "a group is at least 4 KiB");
        assert!(
            capacity.div_ceil(params.group_bytes) <= MAX_GROUPS,
            "at most {MAX_GROUPS} groups"
        );
        assert!(params.confirm_bytes > 0, "a second pass has some length");
        assert!(
            params.wrap_tolerance_bytes < params.min_run_bytes,
            "a run's next write is no wrap"
        );
        let groups = capacity.div_ceil(params.group_bytes).max(1) as usize;
        JournalDetector {
            params,
            groups: vec![Group::default(); groups],
            marked: 0,
            newly: Vec::new(),
        }
    }

    /// The thresholds in use.
    pub fn params(&self) -> &JournalParams {
        &self.params
    }

    /// Takes a write of `len` bytes at `offset` and answers whether it is journal.
    /// Writes past the export's end are ignored (the server refuses them before).
    pub fn write(&mut self, offset: u64, len: u32) -> Verdict {
        let g = self.params.group_bytes;
        let mut at = offset;
        let end = offset.saturating_add(u64::from(len.max(1)));
        let first = (offset / g) as usize;
        self.newly.clear();
        while at < end {
            let index = (at / g) as usize;
            let cut = end.min((at / g).saturating_add(1).saturating_mul(g));
            if index < self.groups.len() {
                self.observe(index, at, cut);
            }
            at = cut;
        }
        let last = ((end - 1) / g) as usize;
        let inside = (first..=last).any(|i| {
            self.groups
                .get(i)
                .and_then(|x| x.log)
                .is_some_and(|(a, b)| offset < b && end > a)
        });
        if inside {
            Verdict::Journal
        } else {
            Verdict::Data
        }
    }

    fn observe(&mut self, index: usize, start: u64, end: u64) {
        let p = self.params;
        let group = &mut self.groups[index];
        group.writes += 1;
        let now = group.writes;
        // A wrap: back within the tolerance of a long run's start. Of several, the run
        // that grew most recently (the pass that just ended).
        let wraps_to = |runs: &[Option<Run>; RUNS], at: u64, not: Option<usize>| {
            (0..RUNS)
                .filter(|&i| Some(i) != not)
                .filter_map(|i| runs[i])
                .filter(|r| {
                    r.len() >= p.min_run_bytes
                        && at.saturating_add(p.wrap_tolerance_bytes) >= r.start
                        && at <= r.start.saturating_add(p.wrap_tolerance_bytes)
                })
                .max_by_key(|r| r.used)
        };
        // When a pass of a marked group's log begins, the log widens to where the last
        // two passes both reached: one pass a guest's data write happened to extend
        // does not widen it, a log that restarted early (a remount) is widened once
        // two full passes have run.
        let widen = |log: &mut Option<(u64, u64)>, last: &mut Option<u64>, pass: Option<Run>| {
            if let (Some((a, b)), Some(r)) = (log.as_mut(), pass)
                && r.start.abs_diff(*a) <= p.wrap_tolerance_bytes
            {
                if let Some(before) = *last {
                    *b = (*b).max(before.min(r.end));
                }
                *last = Some(r.end);
                *a = (*a).min(r.start);
            }
        };
        let wrapped = wraps_to(&group.runs, start, None);
        // Extends a run: starts at its end, or a little past it. Of several, a second
        // pass first, then the longest.
        let extended = (0..RUNS)
            .filter(|&i| {
                group.runs[i]
                    .is_some_and(|r| start >= r.end && start <= r.end.saturating_add(p.gap_bytes))
            })
            .max_by_key(|&i| group.runs[i].map(|r| (r.second_pass, r.len())));
        if let Some(i) = extended {
            let mut run = group.runs[i].expect("chosen among the runs");
            // A short run left where a wrap lands (the superblock's) carries the
            // log's next pass.
            if !run.second_pass && run.len() <= p.wrap_tolerance_bytes {
                run.second_pass = wraps_to(&group.runs, run.start, Some(i)).is_some();
            }
            if run.second_pass && !run.grown {
                // A pass begins: the run it wrapped to is the pass that just ended.
                let ended = wraps_to(&group.runs, run.start, Some(i));
                widen(&mut group.log, &mut group.last_pass_end, ended);
            }
            run.grown = true;
            run.end = end;
            run.used = now;
            group.runs[i] = Some(run);
            if run.second_pass && run.len() >= p.confirm_bytes && group.log.is_none() {
                self.marked += 1;
                self.newly.push(index);
                // Over this pass and the pass it wrapped from.
                let (a, b) = wraps_to(&group.runs, run.start, Some(i))
                    .map_or((run.start, run.end), |r| (r.start, r.end));
                group.log = Some((run.start.min(a), run.end.max(b)));
            }
            return;
        }
        let fresh = Run {
            start,
            end,
            second_pass: wrapped.is_some(),
            grown: false,
            used: now,
        };
        // Takes an empty slot, else replaces the run that grew least recently, never the
        // longest (a log's pass in progress; data writes between its commits start
        // one-write runs that age out first).
        let longest = (0..RUNS).max_by_key(|&i| group.runs[i].map_or(0, |r| r.len()));
        let slot = group
            .runs
            .iter()
            .position(Option::is_none)
            .unwrap_or_else(|| {
                (0..RUNS)
                    .filter(|&i| Some(i) != longest)
                    .min_by_key(|&i| group.runs[i].map_or(0, |r| r.used))
                    .expect("RUNS > 1")
            });
        group.runs[slot] = Some(fresh);
    }

    /// Whether the group holding `offset` is marked journal.
    pub fn is_journal(&self, offset: u64) -> bool {
        self.groups
            .get((offset / self.params.group_bytes) as usize)
            .is_some_and(|g| g.log.is_some())
    }

    /// The log's extent found in group `index` (start, end bytes), once marked.
    pub fn log_in(&self, index: usize) -> Option<(u64, u64)> {
        self.groups.get(index).and_then(|g| g.log)
    }

    /// The groups the last [`JournalDetector::write`] marked, in order.
    pub fn newly_marked(&self) -> &[usize] {
        &self.newly
    }

    /// The log's extent found in each marked group, in order (start, end bytes).
    pub fn journal_extents(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.groups.iter().filter_map(|g| g.log)
    }

    /// The journal groups' indices, in order.
    pub fn journal_groups(&self) -> impl Iterator<Item = usize> + '_ {
        self.groups
            .iter()
            .enumerate()
            .filter(|(_, g)| g.log.is_some())
            .map(|(i, _)| i)
    }

    /// Groups marked so far (detection events).
    pub fn marked(&self) -> u64 {
        self.marked
    }
}

pub mod accuracy;

#[cfg(test)]
mod tests;
