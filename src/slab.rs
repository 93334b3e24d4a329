//! Small aligned blocks (4 to 32 KiB, [`IO_ALIGN`]-aligned) carved from 2 MiB slabs
//! mapped for them. The C allocator's aligned allocation (`posix_memalign`) takes a
//! block of the size plus the alignment and gives the cut-off head back to its free
//! lists, where request buffers never reuse it: a server holding 128 MiB of 4 KiB read
//! replies held 274 MB of memory (2.1×; a C program doing the same, 2.0×), and kept it
//! after every client had gone. Here a slab holds blocks of one size back to back —
//! nothing between them — and is unmapped as soon as its last block is freed, so
//! what the server holds is what its buffers hold, and a burst's memory goes back to
//! the system when the burst does.
//!
//! One lock guards the slabs; it is taken only when a thread's buffer pool has no
//! block to give ([`crate::buffer`]) or keeps no more, not per request.

#![allow(unsafe_code)]

use std::collections::HashMap;
use std::sync::Mutex;

/// Alignment of every block.
pub const IO_ALIGN: usize = 4096;
/// The largest block carved from a slab; larger ones come from the C allocator, whose
/// overhead (a page) is then at most 1/16 of the block.
pub const MAX_BLOCK: usize = 32 << 10;
/// One slab's size (and alignment, so a block finds its slab by its address).
pub const SLAB_BYTES: usize = 2 << 20;

/// A slab: `SLAB_BYTES` mapped, cut into blocks of one size.
struct Slab {
    block: usize,
    /// Indices of its free blocks.
    free: Vec<u32>,
}

impl Slab {
    fn blocks(&self) -> usize {
        SLAB_BYTES / self.block
    }
}

/// Every slab by its base address, and per block size the slabs with a free block.
#[derive(Default)]
struct Slabs {
    by_base: HashMap<usize, Slab>,
    with_room: HashMap<usize, Vec<usize>>,
}

static SLABS: Mutex<Option<Slabs>> = Mutex::new(None);

/// A block of `size` bytes (a power of two from [`IO_ALIGN`] to [`MAX_BLOCK`]); its
/// bytes are initialised (zeroes, or what an earlier owner wrote). `None` when the
/// system has no memory to map.
pub fn allocate(size: usize) -> Option<*mut u8> {
    assert!(
        size.is_power_of_two() && (IO_ALIGN..=MAX_BLOCK).contains(&size),
        "a slab block is a power of two from 4 to 32 KiB"
    );
    let mut guard = SLABS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let slabs = guard.get_or_insert_with(Slabs::default);
    let base = match slabs.with_room.get(&size).and_then(|v| v.last().copied()) {
        Some(base) => base,
        None => {
            let base = map_slab()?;
            let n = (SLAB_BYTES / size) as u32;
            slabs.by_base.insert(
                base,
                Slab {
                    block: size,
                    free: (0..n).rev().collect(),
                },
            );
            slabs.with_room.entry(size).or_default().push(base);
            base
        }
    };
    let slab = slabs
        .by_base
        .get_mut(&base)
        .expect("a slab with room is known");
    let index = slab.free.pop().expect("a slab with room has a free block");
    if slab.free.is_empty() {
        let room = slabs.with_room.get_mut(&size).expect("listed");
        room.retain(|&b| b != base);
    }
    Some((base + index as usize * size) as *mut u8)
}

/// Gives back a block [`allocate`] made of `size` bytes; a slab whose blocks are all
/// free is unmapped.
pub fn free(ptr: *mut u8, size: usize) {
    let at = ptr as usize;
    let base = at & !(SLAB_BYTES - 1);
    let mut guard = SLABS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let slabs = guard.as_mut().expect("a block was allocated");
    let slab = slabs
        .by_base
        .get_mut(&base)
        .expect("a block of a known slab");
    assert_eq!(slab.block, size, "a block is freed with its size");
    let index = ((at - base) / size) as u32;
    debug_assert!(!slab.free.contains(&index), "a block is freed once");
    let was_full = slab.free.is_empty();
    slab.free.push(index);
    let room = slabs.with_room.entry(size).or_default();
    if slab.free.len() == slab.blocks() {
        room.retain(|&b| b != base);
        slabs.by_base.remove(&base);
        // SAFETY: the slab was mapped by `map_slab` with this size; no block of it is
        // held any more.
        unsafe { libc::munmap(base as *mut libc::c_void, SLAB_BYTES) };
    } else if was_full {
        room.push(base);
    }
}

/// Bytes mapped for slabs now.
pub fn mapped_bytes() -> usize {
    let guard = SLABS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    guard.as_ref().map_or(0, |s| s.by_base.len() * SLAB_BYTES)
}

/// Maps a slab aligned to its size (twice that mapped, the rest unmapped again).
fn map_slab() -> Option<usize> {
    // SAFETY: an anonymous private mapping; nothing else refers to it.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            2 * SLAB_BYTES,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return None;
    }
    let start = p as usize;
    let base = start.next_multiple_of(SLAB_BYTES);
    // SAFETY: the parts before and after the aligned slab belong to this mapping.
    unsafe {
        if base > start {
            libc::munmap(start as *mut libc::c_void, base - start);
        }
        let end = start + 2 * SLAB_BYTES;
        if end > base + SLAB_BYTES {
            libc::munmap(
                (base + SLAB_BYTES) as *mut libc::c_void,
                end - base - SLAB_BYTES,
            );
        }
    }
    Some(base)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Blocks are aligned, distinct and back to back; a slab goes once its last block
    /// does. (Other tests allocate buffers too: only this test's own slabs are counted,
    /// by address.)
    #[test]
    fn blocks_are_packed_and_slabs_given_back() {
        let size = 16 << 10;
        let per_slab = SLAB_BYTES / size;
        let blocks: Vec<*mut u8> = (0..per_slab + 1).map(|_| allocate(size).unwrap()).collect();
        let mut bases: Vec<usize> = blocks
            .iter()
            .map(|&p| p as usize & !(SLAB_BYTES - 1))
            .collect();
        for &p in &blocks {
            assert_eq!(p as usize % IO_ALIGN, 0);
            // SAFETY: the block is this test's, `size` bytes long.
            unsafe { p.write_bytes(0xab, size) };
        }
        let mut sorted = blocks.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), blocks.len(), "distinct blocks");
        bases.sort();
        bases.dedup();
        assert!(bases.len() >= 2, "a slab holds {per_slab} blocks");
        for &p in &blocks {
            free(p, size);
        }
        let guard = SLABS.lock().unwrap();
        for b in bases {
            // A slab another test allocated from at the same time may stay; this test's
            // blocks are all back, so any of its slabs left holds other blocks.
            if let Some(s) = guard.as_ref().unwrap().by_base.get(&b) {
                assert!(s.free.len() < s.blocks(), "an empty slab is unmapped");
            }
        }
    }
}
