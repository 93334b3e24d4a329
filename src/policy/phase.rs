//! Read and write phases on flash: the weight phase sends one kind of request at a
//! time, so a read rarely reaches a die while it programs. Park and Shen, "FIOS: A Fair,
//! Efficient Flash I/O Scheduler", FAST 2012 (reads and writes kept apart on the
//! device, reads preferred while the writers keep their share of the time).
//!
//! Together, two 4 KiB random readers and a 4 KiB random writer kept the aged SATA and
//! NVMe models busy 0.79 and 0.82 s/s of their fitted cost models, where each kind alone
//! runs at 1.00: a read queued behind a program holds one of the device queue's places
//! while it waits. In turns of 5–20 ms the same tenants ran at 0.95–1.02 s/s
//! (docs/conformance.md, "What is still missed").
//!
//! A phase: the weight phase dispatches only heads of the phase's kind while the
//! smallest weight tag (`P`) among them is within `window` of the smallest among the
//! other kind's heads; past it, or with none of its kind queued for `hold` (at once
//! when none of its kind is in the device either), the other kind's phase starts. A
//! tenant first by weight with nothing in the device goes whatever the phase (the
//! policy asks before it asks the phase), and one with requests in the device keeps its
//! `P` when its next arrives (mClock: it is not back from idle; virtual time ran ahead
//! with the other kind's phase, and starting it there lost a writer its share: 3.5–6.5
//! % of the device for a third).
//!
//! **Off by default (`phase_window_ms = 0`): measured, phases do not pay as a default.**
//! Two 4 KiB random readers and a writer, each at iodepth 32 on the aged drives
//! (`scenarios/read-write-mix.toml` deepened), run at 1.01 (SATA) and 0.96 (NVMe) s/s
//! with a 20 ms window against 0.89 and 0.78 without phases, shares within 0.5–1.0 %; at
//! iodepth 16 (the scenario as it is) 0.84 and 0.87 (0.89 and 0.78 without): a writer
//! bound by its own depth cannot fill the device in its phase. Over the conformance
//! matrix's 45 flash cells `mclock` with phases passed 13 against 15 without. (All with
//! `depth = 0`, mClock's default then; with the adaptive depth, its default now: 0.97
//! and 0.94 s/s at iodepth 32, 0.80 and 0.77 at 16 against 0.85 and 0.72, and 14 flash
//! cells against 21.) Numbers: docs/readings.md, `phase.rs`.
//!
//! Readings chosen:
//! * **The phase ends by the tags, not by the clock.** Ending it by a time slice gives
//!   each kind equal time whatever the weights (two readers and one writer would get
//!   half the device each); ending it when its tenants' tags pass the other kind's by a
//!   window keeps every tenant's `P` within a window of the others', so the shares per
//!   interval stay those of the weights and the phases are as long as the window lets
//!   the kind run.
//! * **No drain between phases**: the ending kind's requests finish beside the next
//!   kind's first. Waiting for them first (the device holding one kind only) passed 5
//!   of the 45 cells: with a device queue of 128 every phase ended in a long drain
//!   (device work 0.14–0.6× `none`).
//! * **A light tenant does not wait out a phase**: without that a reader under its
//!   share waited for the writers' phase (latency 1.9–5.0× `none`'s).
//! * **Kinds**: writes (data moved to the device) are one; reads, flushes, trims and
//!   block status lookups are the other (flushes and trims would fit either; a status
//!   lookup does not reach the flash).
//! * Reservations, the service floor and limits are not phased: a request due by its
//!   reservation goes at once, whatever the phase.
//! * Sans-I/O: the policy reports what it dispatched and what completed, and asks which
//!   kind may go by weight.

use super::frame::Kind;
use crate::types::Op;

/// `phase_hold_ms` by default: how long a phase whose kind has nothing queued, and
/// requests in the device, waits for its kind's next request.
pub const DEFAULT_PHASE_HOLD_MS: f64 = 1.0;

/// The kind of a request, as phases group them: 0 reads (and all that does not write
/// data), 1 writes.
pub fn kind(op: Op) -> usize {
    usize::from(Kind::of(op) == Kind::Write)
}

/// What the weight phase may do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pick {
    /// Dispatch the smallest `P` among heads of this kind.
    Kind(usize),
    /// Nothing by weight until the given time: the phase's kind has its requests in the
    /// device, and its tenants may send the next as they complete.
    Wait(u64),
}

/// Phases on the device (module doc).
#[derive(Debug, Clone)]
pub struct Phases {
    /// How far (in `P`'s units, ns of virtual time) a phase's tags may run ahead of the
    /// other kind's.
    window: u64,
    /// The kind whose phase it is.
    current: usize,
    switches: u64,
    /// How long a phase whose kind has nothing queued waits for its next request.
    hold: u64,
    /// Since when the phase's kind has had nothing queued (while the other had).
    empty_since: Option<u64>,
}

impl Phases {
    /// Phases whose tags may run `window` ns of virtual time ahead of the other kind's.
    pub fn new(window: u64, hold: u64) -> Self {
        assert!(window > 0, "a phase lets its kind run some way ahead");
        Phases {
            window,
            current: 0,
            switches: 0,
            hold,
            empty_since: None,
        }
    }

    /// Which kind may go by weight at `now`, given the smallest `P` among the heads of
    /// each kind that may go by weight (`None`: no such head) and the requests of each
    /// kind in the device (whatever sent them; the frame counts them).
    pub fn pick(
        &mut self,
        now: u64,
        smallest: [Option<u64>; 2],
        in_device: [u64; 2],
    ) -> Option<Pick> {
        let (mine, other) = (self.current, 1 - self.current);
        if smallest[mine].is_some() {
            self.empty_since = None;
        }
        match (smallest[mine], smallest[other]) {
            (None, None) => None,
            (Some(_), None) => Some(Pick::Kind(mine)),
            (Some(p), Some(q)) if p <= q.saturating_add(self.window) => Some(Pick::Kind(mine)),
            // Its kind's requests are all in the device: their tenants may send the next
            // as they complete (closed loops), so the phase waits for them a while.
            (None, Some(_))
                if in_device[mine] > 0
                    && now < *self.empty_since.get_or_insert(now) + self.hold =>
            {
                Some(Pick::Wait(self.empty_since.expect("set above") + self.hold))
            }
            (_, Some(_)) => {
                self.current = other;
                self.empty_since = None;
                self.switches += 1;
                Some(Pick::Kind(other))
            }
        }
    }

    /// Phases that ended so far.
    pub fn switches(&self) -> u64 {
        self.switches
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_phase_runs_until_its_tags_pass_the_others_by_the_window() {
        let mut p = Phases::new(10, 0);
        // Reads at P 100, writes at 95: reads go (within the window).
        assert_eq!(
            p.pick(0, [Some(100), Some(95)], [0, 0]),
            Some(Pick::Kind(0))
        );
        assert_eq!(
            p.pick(0, [Some(105), Some(95)], [1, 0]),
            Some(Pick::Kind(0))
        );
        // 106 > 95 + 10: the write phase starts at once (no drain), and runs while
        // writes are within 106 + 10.
        assert_eq!(
            p.pick(0, [Some(106), Some(95)], [1, 0]),
            Some(Pick::Kind(1))
        );
        assert_eq!(p.switches(), 1);
        assert_eq!(
            p.pick(0, [Some(106), Some(116)], [1, 0]),
            Some(Pick::Kind(1))
        );
        assert_eq!(
            p.pick(0, [Some(106), Some(117)], [1, 0]),
            Some(Pick::Kind(0))
        );
        assert_eq!(p.switches(), 2);
    }

    #[test]
    fn a_kind_alone_runs_and_an_empty_phase_ends_at_once() {
        let mut p = Phases::new(10, 5);
        assert_eq!(p.pick(0, [None, None], [0, 0]), None);
        // Only writes: the read phase (nothing in the device) ends, writes go.
        assert_eq!(p.pick(0, [None, Some(1_000)], [0, 0]), Some(Pick::Kind(1)));
        // Only writes, far ahead of nothing: they keep going.
        assert_eq!(p.pick(0, [None, Some(5_000)], [0, 1]), Some(Pick::Kind(1)));
        // A read comes, far behind the writes' tags: the read phase starts.
        assert_eq!(
            p.pick(0, [Some(10), Some(5_000)], [0, 1]),
            Some(Pick::Kind(0))
        );
        assert_eq!(kind(Op::Write), 1);
        assert_eq!(
            [Op::Read, Op::Flush, Op::Trim, Op::Status].map(kind),
            [0; 4]
        );
    }

    #[test]
    fn a_phase_whose_requests_are_all_in_the_device_waits_for_the_next_a_while() {
        let mut p = Phases::new(10, 5);
        assert_eq!(p.pick(0, [Some(1), Some(1)], [0, 0]), Some(Pick::Kind(0)));
        // Nothing of its kind queued, one read in the device, writes waiting: it waits
        // until 100 + 5 for the reader's next request.
        assert_eq!(p.pick(100, [None, Some(1)], [1, 0]), Some(Pick::Wait(105)));
        assert_eq!(p.pick(104, [None, Some(1)], [1, 0]), Some(Pick::Wait(105)));
        // It came: the phase goes on, and the wait starts again from the next gap.
        assert_eq!(p.pick(104, [Some(2), Some(1)], [1, 0]), Some(Pick::Kind(0)));
        assert_eq!(p.pick(110, [None, Some(1)], [1, 0]), Some(Pick::Wait(115)));
        // None by then: the write phase starts.
        assert_eq!(p.pick(115, [None, Some(1)], [1, 0]), Some(Pick::Kind(1)));
    }
}
