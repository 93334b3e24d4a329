//! Page-mapped flash translation layer with greedy garbage collection.
//!
//! Logical pages are 4 KiB. Physical pages live in erase blocks; every die owns a
//! contiguous range of blocks, its own free-block pool, one open block for host writes
//! and one for GC relocations (so relocated, colder data is not mixed with fresh host
//! data). Host writes are striped over dies round-robin. When a die's pool falls below
//! the GC threshold, the die picks the full block with the fewest valid pages (greedy)
//! and reclaims it *incrementally*: each host page written to the die relocates
//! `ceil(v / (ppb − v))` of the victim's valid pages (v valid of ppb at selection), the
//! pace at which reclaiming keeps up with host writes, and the block is erased when
//! empty. Spreading the work this way, as drives with preemptible GC do, keeps one
//! collection from stalling a die for hundreds of milliseconds. Only when the pool
//! reaches its last reserve block does a die collect in one go.
//!
//! This module holds the mapping state only; [`super::ssd`] turns the work it reports
//! (page programs, relocations, erases) into time on dies and channels.

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Marks an unmapped logical page or an invalid physical page.
pub const NONE: u32 = u32::MAX;

/// Size of a logical (mapping) page in bytes.
pub const PAGE_BYTES: u64 = 4096;

/// Geometry of the flash behind the FTL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// User-visible capacity in 4 KiB logical pages.
    pub logical_pages: u32,
    /// Flash dies, each with its own blocks and free pool.
    pub dies: u32,
    /// Erase blocks per die, over-provisioning and GC reserve included.
    pub blocks_per_die: u32,
    /// Erase block size in 4 KiB pages.
    pub pages_per_block: u32,
    /// GC runs on a die while its free pool holds fewer blocks than this (≥ 2).
    pub gc_threshold: u32,
}

impl Geometry {
    /// Lays out `logical_pages` over `dies` with `op_ratio` extra physical space. The
    /// blocks GC keeps out of use (about `gc_threshold` free ones plus the unfilled
    /// halves of the two open blocks) come on top of the over-provisioning, so a
    /// scaled-down drive with few blocks per die keeps the same effective spare space,
    /// and GC behaves about the same, as a full-size one.
    pub fn new(
        logical_pages: u32,
        op_ratio: f64,
        dies: u32,
        pages_per_block: u32,
        gc_threshold: u32,
    ) -> Self {
        let gc_threshold = gc_threshold.max(2);
        let physical = (logical_pages as f64 * (1.0 + op_ratio.max(0.0))).ceil() as u64;
        let per_die = physical.div_ceil(dies as u64);
        let data_blocks = ((per_die as f64 / pages_per_block as f64).round() as u64).max(
            (logical_pages as u64)
                .div_ceil(dies as u64)
                .div_ceil(pages_per_block as u64),
        );
        let blocks_per_die = (data_blocks + gc_threshold as u64 + 1) as u32;
        Geometry {
            logical_pages,
            dies,
            blocks_per_die,
            pages_per_block,
            gc_threshold,
        }
    }

    /// Erase blocks on all dies.
    pub fn blocks(&self) -> u32 {
        self.dies * self.blocks_per_die
    }

    /// Physical 4 KiB pages on all dies.
    pub fn physical_pages(&self) -> u64 {
        self.blocks() as u64 * self.pages_per_block as u64
    }

    /// Die that owns a physical page.
    pub fn die_of_page(&self, ppn: u32) -> u32 {
        ppn / self.pages_per_block / self.blocks_per_die
    }
}

/// An open block being filled page by page.
#[derive(Debug, Clone, Copy)]
struct OpenBlock {
    block: u32,
    next: u32,
}

/// A block being reclaimed a few pages at a time.
#[derive(Debug, Clone, Copy)]
struct Victim {
    block: u32,
    /// Next page of the block to look at.
    cursor: u32,
    /// Valid pages to relocate per host page written to the die.
    pace: u32,
}

#[derive(Debug, Clone)]
struct Die {
    free: Vec<u32>,
    host: Option<OpenBlock>,
    gc: Option<OpenBlock>,
    victim: Option<Victim>,
}

/// Block life cycle: free → open → full → (GC) → free.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum BlockState {
    Free,
    Open,
    Full,
}

/// Work done on one die while placing a host page: what the timing model must charge.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteWork {
    /// Die the host page was programmed on.
    pub die: u32,
    /// Valid pages GC relocated on that die before the write could proceed.
    pub moved: u32,
    /// Blocks GC erased on that die.
    pub erased: u32,
}

/// Counters since creation or the last [`Ftl::reset_counters`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FtlCounters {
    /// 4 KiB pages written by the host.
    pub host_pages_written: u64,
    /// Garbage collections started (victim blocks chosen).
    pub gc_runs: u64,
    /// Valid pages GC relocated.
    pub pages_moved: u64,
    /// Blocks GC erased.
    pub blocks_erased: u64,
}

/// The mapping state. Cloning it copies a preconditioned drive for another run.
#[derive(Debug, Clone)]
pub struct Ftl {
    geo: Geometry,
    l2p: Vec<u32>,
    p2l: Vec<u32>,
    valid: Vec<u32>,
    state: Vec<BlockState>,
    dies: Vec<Die>,
    next_die: u32,
    counters: FtlCounters,
}

impl Ftl {
    /// A fresh drive: nothing mapped, every block free.
    pub fn new(geo: Geometry) -> Self {
        let blocks = geo.blocks();
        let dies = (0..geo.dies)
            .map(|d| {
                let first = d * geo.blocks_per_die;
                // Pop from the end: keep low block numbers first for readability in tests.
                let free = (first..first + geo.blocks_per_die).rev().collect();
                Die {
                    free,
                    host: None,
                    gc: None,
                    victim: None,
                }
            })
            .collect();
        Ftl {
            geo,
            l2p: vec![NONE; geo.logical_pages as usize],
            p2l: vec![NONE; geo.physical_pages() as usize],
            valid: vec![0; blocks as usize],
            state: vec![BlockState::Free; blocks as usize],
            dies,
            next_die: 0,
            counters: FtlCounters::default(),
        }
    }

    /// The flash layout.
    pub fn geometry(&self) -> &Geometry {
        &self.geo
    }

    /// Counters since creation or the last [`Ftl::reset_counters`].
    pub fn counters(&self) -> FtlCounters {
        self.counters
    }

    /// Sets every counter back to zero.
    pub fn reset_counters(&mut self) {
        self.counters = FtlCounters::default();
    }

    /// Physical page holding a logical page, if it was ever written (and not trimmed).
    #[inline]
    pub fn lookup(&self, lpn: u32) -> Option<u32> {
        let p = self.l2p[lpn as usize];
        (p != NONE).then_some(p)
    }

    /// Die that would serve a read of `lpn`: where it lives, or a fixed stripe when the
    /// page was never written (the drive still spends a read answering it).
    #[inline]
    pub fn read_die(&self, lpn: u32) -> u32 {
        match self.lookup(lpn) {
            Some(p) => self.geo.die_of_page(p),
            None => lpn % self.geo.dies,
        }
    }

    /// Free blocks on a die.
    pub fn free_blocks(&self, die: u32) -> usize {
        self.dies[die as usize].free.len()
    }

    /// Drops a logical page (TRIM): its physical page becomes invalid.
    pub fn trim(&mut self, lpn: u32) {
        let old = self.l2p[lpn as usize];
        if old != NONE {
            self.invalidate(old);
            self.l2p[lpn as usize] = NONE;
        }
    }

    #[inline]
    fn invalidate(&mut self, ppn: u32) {
        self.p2l[ppn as usize] = NONE;
        self.valid[(ppn / self.geo.pages_per_block) as usize] -= 1;
    }

    /// Writes (or overwrites) a logical page on the next die in the stripe, collecting
    /// garbage there first when the die runs short of free blocks.
    pub fn write(&mut self, lpn: u32) -> WriteWork {
        let dies = self.geo.dies;
        let start = self.next_die;
        self.next_die = (self.next_die + 1) % dies;
        // A die whose GC cannot make progress (all blocks fully valid, only possible on
        // pathological layouts) hands the page to the next die instead.
        for i in 0..dies {
            let die = (start + i) % dies;
            let mut work = WriteWork {
                die,
                ..WriteWork::default()
            };
            if let Some(ppn) = self.alloc_host(die, &mut work) {
                let old = self.l2p[lpn as usize];
                if old != NONE {
                    self.invalidate(old);
                }
                self.map(lpn, ppn);
                self.counters.host_pages_written += 1;
                return work;
            }
        }
        unreachable!("geometry reserves room for every logical page")
    }

    #[inline]
    fn map(&mut self, lpn: u32, ppn: u32) {
        self.l2p[lpn as usize] = ppn;
        self.p2l[ppn as usize] = lpn;
        self.valid[(ppn / self.geo.pages_per_block) as usize] += 1;
    }

    /// Next page of the die's open host block, opening a new block (after GC if the
    /// pool is low) when the current one is full.
    fn alloc_host(&mut self, die: u32, work: &mut WriteWork) -> Option<u32> {
        let d = &self.dies[die as usize];
        if d.victim.is_some() || d.free.len() < self.geo.gc_threshold as usize {
            self.gc_step(die, work);
        }
        if let Some(ob) = self.dies[die as usize].host
            && ob.next < self.geo.pages_per_block
        {
            self.dies[die as usize].host = Some(OpenBlock {
                next: ob.next + 1,
                ..ob
            });
            return Some(ob.block * self.geo.pages_per_block + ob.next);
        }
        if self.dies[die as usize].free.len() < 2 {
            self.collect(die, work);
        }
        // Keep one block back for GC relocations.
        if self.dies[die as usize].free.len() < 2 {
            return None;
        }
        let block = self.open_block(die);
        if let Some(old) = self.dies[die as usize]
            .host
            .replace(OpenBlock { block, next: 1 })
        {
            self.state[old.block as usize] = BlockState::Full;
        }
        Some(block * self.geo.pages_per_block)
    }

    fn open_block(&mut self, die: u32) -> u32 {
        let block = self.dies[die as usize]
            .free
            .pop()
            .expect("caller checked the pool");
        self.state[block as usize] = BlockState::Open;
        block
    }

    /// Greedy victim: the full block with the fewest valid pages that has at least one
    /// invalid page, other than the one being reclaimed.
    fn pick_victim(&self, die: u32) -> Option<u32> {
        let ppb = self.geo.pages_per_block;
        let first = die * self.geo.blocks_per_die;
        let current = self.dies[die as usize].victim.map(|v| v.block);
        let mut victim = None;
        let mut best = ppb;
        for b in first..first + self.geo.blocks_per_die {
            let v = self.valid[b as usize];
            if v < best && self.state[b as usize] == BlockState::Full && Some(b) != current {
                best = v;
                victim = Some(b);
                if best == 0 {
                    break;
                }
            }
        }
        victim
    }

    /// One increment of GC on a die: choose a victim if none, relocate its valid pages
    /// (the victim's pace of them when `paced`, else all), erase it once empty.
    /// Returns false when there was nothing to reclaim or nowhere to relocate.
    fn reclaim(&mut self, die: u32, paced: bool, work: &mut WriteWork) -> bool {
        let ppb = self.geo.pages_per_block;
        let mut victim = match self.dies[die as usize].victim {
            Some(v) => v,
            None => {
                let Some(block) = self.pick_victim(die) else {
                    return false;
                };
                let v = self.valid[block as usize];
                self.counters.gc_runs += 1;
                Victim {
                    block,
                    cursor: 0,
                    pace: v.div_ceil(ppb - v).max(1),
                }
            }
        };
        let mut left = if paced { victim.pace } else { u32::MAX };
        let base = victim.block * ppb;
        while victim.cursor < ppb && left > 0 {
            let ppn = base + victim.cursor;
            let lpn = self.p2l[ppn as usize];
            if lpn != NONE {
                let Some(dst) = self.alloc_gc(die) else {
                    self.dies[die as usize].victim = Some(victim);
                    return false;
                };
                self.invalidate(ppn);
                self.map(lpn, dst);
                work.moved += 1;
                self.counters.pages_moved += 1;
                left -= 1;
            }
            victim.cursor += 1;
        }
        // Pages past the cursor may have been overwritten meanwhile: the block is done
        // when nothing valid is left.
        if self.valid[victim.block as usize] == 0 {
            self.state[victim.block as usize] = BlockState::Free;
            self.dies[die as usize].free.push(victim.block);
            self.dies[die as usize].victim = None;
            work.erased += 1;
            self.counters.blocks_erased += 1;
        } else {
            if victim.cursor >= ppb {
                victim.cursor = 0;
            }
            self.dies[die as usize].victim = Some(victim);
        }
        true
    }

    /// The paced GC increment done before each host page on a die under pressure.
    fn gc_step(&mut self, die: u32, work: &mut WriteWork) {
        self.reclaim(die, true, work);
    }

    /// Emergency GC: reclaim whole blocks until the die has its reserve back, or
    /// nothing can be reclaimed.
    fn collect(&mut self, die: u32, work: &mut WriteWork) {
        while self.dies[die as usize].free.len() < 2 {
            if !self.reclaim(die, false, work) {
                break;
            }
        }
    }

    fn alloc_gc(&mut self, die: u32) -> Option<u32> {
        let ppb = self.geo.pages_per_block;
        if let Some(ob) = self.dies[die as usize].gc
            && ob.next < ppb
        {
            self.dies[die as usize].gc = Some(OpenBlock {
                next: ob.next + 1,
                ..ob
            });
            return Some(ob.block * ppb + ob.next);
        }
        if self.dies[die as usize].free.is_empty() {
            return None;
        }
        let block = self.open_block(die);
        if let Some(old) = self.dies[die as usize]
            .gc
            .replace(OpenBlock { block, next: 1 })
        {
            self.state[old.block as usize] = BlockState::Full;
        }
        Some(block * ppb)
    }

    /// Ages the drive: writes the whole logical space once in order, then overwrites
    /// `passes` × the logical space at uniformly random pages, so greedy GC reaches its
    /// steady state. Counters are reset afterwards. Deterministic for a given seed.
    pub fn age(&mut self, passes: f64, seed: u64) {
        let n = self.geo.logical_pages;
        for lpn in 0..n {
            self.write(lpn);
        }
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let overwrites = (n as f64 * passes.max(0.0)) as u64;
        for _ in 0..overwrites {
            let lpn = rng.random_range(0..n);
            self.write(lpn);
        }
        self.reset_counters();
    }

    /// Checks every mapping invariant; used by tests. Returns the first violation.
    pub fn check_invariants(&self) -> Result<(), String> {
        let ppb = self.geo.pages_per_block;
        let mut valid = vec![0u32; self.valid.len()];
        for (ppn, &lpn) in self.p2l.iter().enumerate() {
            if lpn == NONE {
                continue;
            }
            if self.l2p[lpn as usize] != ppn as u32 {
                return Err(format!(
                    "physical page {ppn} claims logical {lpn}, which maps elsewhere"
                ));
            }
            valid[ppn / ppb as usize] += 1;
        }
        let mut mapped = 0u64;
        for (lpn, &ppn) in self.l2p.iter().enumerate() {
            if ppn == NONE {
                continue;
            }
            mapped += 1;
            if self.p2l[ppn as usize] != lpn as u32 {
                return Err(format!(
                    "logical page {lpn} maps to {ppn}, which holds something else"
                ));
            }
        }
        if valid != self.valid {
            return Err("per-block valid counts do not match the pages".into());
        }
        let total: u64 = self.valid.iter().map(|&v| v as u64).sum();
        if total != mapped {
            return Err(format!(
                "{total} valid physical pages for {mapped} mapped logical pages"
            ));
        }
        for (d, die) in self.dies.iter().enumerate() {
            for &b in &die.free {
                if self.state[b as usize] != BlockState::Free || self.valid[b as usize] != 0 {
                    return Err(format!("free block {b} of die {d} is not empty"));
                }
                if b / self.geo.blocks_per_die != d as u32 {
                    return Err(format!("free block {b} listed on die {d}"));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn small() -> Geometry {
        Geometry::new(512, 0.25, 2, 16, 2)
    }

    #[test]
    fn geometry_reserves_room() {
        let g = small();
        assert_eq!(g.dies, 2);
        assert!(g.physical_pages() >= 640);
        // Per die: 256 logical pages → 16 blocks, plus threshold 2, plus 3 spare.
        assert!(g.blocks_per_die >= 21);
    }

    #[test]
    fn writes_stripe_over_dies() {
        let mut f = Ftl::new(small());
        let dies: Vec<u32> = (0..4).map(|l| f.write(l).die).collect();
        assert_eq!(dies, vec![0, 1, 0, 1]);
        assert_eq!(f.read_die(0), 0);
        assert_eq!(f.read_die(1), 1);
        f.check_invariants().unwrap();
    }

    #[test]
    fn overwrite_invalidates_old_page() {
        let mut f = Ftl::new(small());
        f.write(7);
        let first = f.lookup(7).unwrap();
        f.write(7);
        let second = f.lookup(7).unwrap();
        assert_ne!(first, second);
        f.check_invariants().unwrap();
        f.trim(7);
        assert_eq!(f.lookup(7), None);
        f.check_invariants().unwrap();
    }

    #[test]
    fn aging_runs_gc_and_keeps_every_page() {
        let mut f = Ftl::new(small());
        f.age(3.0, 1);
        f.check_invariants().unwrap();
        assert!((0..512).all(|l| f.lookup(l).is_some()));
        // Random overwrites after aging must collect garbage.
        for l in 0..2000u32 {
            f.write((l * 7919) % 512);
        }
        let c = f.counters();
        assert!(
            c.gc_runs > 0 && c.pages_moved > 0 && c.blocks_erased > 0,
            "{c:?}"
        );
        assert_eq!(c.host_pages_written, 2000);
        f.check_invariants().unwrap();
    }

    #[test]
    fn sequential_overwrite_on_clean_drive_moves_nothing() {
        let mut f = Ftl::new(small());
        for round in 0..4 {
            for l in 0..512 {
                f.write(l);
            }
            f.check_invariants()
                .unwrap_or_else(|e| panic!("round {round}: {e}"));
        }
        // Whole blocks become invalid together: greedy GC finds empty victims.
        assert_eq!(f.counters().pages_moved, 0);
    }

    #[derive(Debug, Clone)]
    enum FtlOp {
        Write(u32),
        Trim(u32),
    }

    fn op() -> impl Strategy<Value = FtlOp> {
        prop_oneof![
            8 => (0u32..512).prop_map(FtlOp::Write),
            1 => (0u32..512).prop_map(FtlOp::Trim),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        /// Every logical page maps to exactly one valid physical page, valid counts add
        /// up, and GC never loses a page, whatever the sequence of writes and trims.
        #[test]
        fn invariants_hold_under_random_operations(
            ops in proptest::collection::vec(op(), 1..3000),
            op_ratio in 0.05f64..0.5,
            ppb in 4u32..32,
        ) {
            let geo = Geometry::new(512, op_ratio, 3, ppb, 2);
            let mut f = Ftl::new(geo);
            let mut expected = vec![false; 512];
            for o in &ops {
                match *o {
                    FtlOp::Write(l) => { f.write(l); expected[l as usize] = true; }
                    FtlOp::Trim(l) => { f.trim(l); expected[l as usize] = false; }
                }
            }
            prop_assert_eq!(f.check_invariants(), Ok(()));
            for (l, &e) in expected.iter().enumerate() {
                prop_assert_eq!(f.lookup(l as u32).is_some(), e, "logical page {}", l);
            }
            let writes = ops.iter().filter(|o| matches!(o, FtlOp::Write(_))).count() as u64;
            prop_assert_eq!(f.counters().host_pages_written, writes);
        }
    }
}
