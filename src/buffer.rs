//! Request data buffers: aligned for `O_DIRECT`, and recycled, so a request's bytes are
//! received, written, read and sent from one allocation without a copy between the
//! socket and the device, and a busy server does not pay an allocation (a fresh `mmap`,
//! page faults, zeroing) per request.
//!
//! Freed buffers go to a pool of the thread that drops them (an engine thread, in the
//! server), by power-of-two size class; the pool keeps at most [`POOL_CLASS_BYTES`] per
//! class — divided among the threads that share the work ([`share_pool`]: N engine
//! threads keep together what one would, not N times as much) — and nothing above
//! [`POOL_MAX_BUFFER`].

// Aligned allocations for O_DIRECT: raw alloc/dealloc behind a safe owner.
#![allow(unsafe_code)]

use std::alloc::Layout;
use std::cell::{Cell, RefCell};
use std::ops::{Deref, DerefMut};

/// Alignment of every buffer: enough for `O_DIRECT` on any common device.
pub const IO_ALIGN: usize = 4096;
/// Largest buffer the pool keeps (bigger ones are rare: freed at once).
pub const POOL_MAX_BUFFER: usize = 1 << 20;
/// Bytes the pool keeps per size class.
pub const POOL_CLASS_BYTES: usize = 16 << 20;

/// Smallest class: one alignment unit.
const MIN_CLASS_SHIFT: u32 = IO_ALIGN.trailing_zeros();
const CLASSES: usize = (POOL_MAX_BUFFER.trailing_zeros() - MIN_CLASS_SHIFT + 1) as usize;

thread_local! {
    static POOL: RefCell<[Vec<Block>; CLASSES]> = RefCell::new(Default::default());
    /// How many threads this thread's pool shares [`POOL_CLASS_BYTES`] with.
    static SHARERS: Cell<usize> = const { Cell::new(1) };
}

/// Makes this thread's pool keep its part of [`POOL_CLASS_BYTES`] per class when it is
/// one of `threads` threads doing the same work (the server's engine threads): the
/// buffers pooled in the process stay about what one thread would keep, however many
/// there are. At least one buffer of a class is kept.
pub fn share_pool(threads: usize) {
    SHARERS.with(|s| s.set(threads.max(1)));
}

/// How many freed buffers of `capacity` a pool shared by `sharers` threads keeps.
fn kept(capacity: usize, sharers: usize) -> usize {
    (POOL_CLASS_BYTES / sharers.max(1) / capacity).max(1)
}

/// One aligned allocation of a class's capacity.
struct Block {
    ptr: *mut u8,
    capacity: usize,
}

impl Block {
    fn layout(capacity: usize) -> Layout {
        Layout::from_size_align(capacity, IO_ALIGN).expect("buffer layout")
    }

    /// An initialised allocation (zeroes, or a slab block's earlier bytes), so reusing
    /// it never reads uninitialised memory. Small ones are carved from slabs
    /// ([`crate::slab`]: no alignment overhead), larger ones from the allocator.
    fn allocate(capacity: usize) -> Block {
        let layout = Self::layout(capacity);
        if capacity <= crate::slab::MAX_BLOCK {
            let ptr = crate::slab::allocate(capacity)
                .unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
            return Block { ptr, capacity };
        }
        // SAFETY: the layout's size is at least IO_ALIGN, never zero.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        Block { ptr, capacity }
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        if self.capacity <= crate::slab::MAX_BLOCK {
            crate::slab::free(self.ptr, self.capacity);
            return;
        }
        // SAFETY: allocated in `allocate` with this layout.
        unsafe { std::alloc::dealloc(self.ptr, Self::layout(self.capacity)) };
    }
}

/// Empties this thread's pool: its buffers are freed (their slabs unmapped once
/// empty). For a thread that has served a burst and has nothing to serve now.
pub fn trim_pool() {
    let _ = POOL.try_with(|p| {
        for class in p.borrow_mut().iter_mut() {
            class.clear();
        }
    });
}

/// The capacity a buffer of `len` bytes gets, and its pool class (`None`: not pooled).
fn class_of(len: usize) -> (usize, Option<usize>) {
    let capacity = len.max(IO_ALIGN).next_power_of_two();
    if capacity > POOL_MAX_BUFFER {
        // Not pooled: no need to round up to a power of two.
        return (len.next_multiple_of(IO_ALIGN), None);
    }
    let class = (capacity.trailing_zeros() - MIN_CLASS_SHIFT) as usize;
    (capacity, Some(class))
}

/// `len` bytes at an [`IO_ALIGN`]-aligned address, owned, returned to the thread's pool
/// when dropped.
pub struct IoBuf {
    block: std::mem::ManuallyDrop<Block>,
    len: usize,
}

// SAFETY: the buffer is uniquely owned; its pointer is never shared.
unsafe impl Send for IoBuf {}

impl IoBuf {
    /// A buffer whose bytes the caller overwrites before anyone reads them: it holds
    /// zeroes or an earlier request's bytes (initialised memory either way).
    pub fn for_overwrite(len: usize) -> IoBuf {
        let (capacity, class) = class_of(len);
        let block = class
            .and_then(|c| POOL.with(|p| p.borrow_mut()[c].pop()))
            .unwrap_or_else(|| Block::allocate(capacity));
        IoBuf {
            block: std::mem::ManuallyDrop::new(block),
            len,
        }
    }

    /// A buffer of zeroes.
    pub fn zeroed(len: usize) -> IoBuf {
        let mut b = IoBuf::for_overwrite(len);
        b.fill(0);
        b
    }

    /// A buffer holding a copy of `bytes`.
    pub fn copy_of(bytes: &[u8]) -> IoBuf {
        let mut b = IoBuf::for_overwrite(bytes.len());
        b.copy_from_slice(bytes);
        b
    }
}

impl Deref for IoBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: the block holds at least `len` initialised bytes owned by self.
        unsafe { std::slice::from_raw_parts(self.block.ptr, self.len) }
    }
}

impl DerefMut for IoBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, uniquely borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.block.ptr, self.len) }
    }
}

impl Drop for IoBuf {
    fn drop(&mut self) {
        // SAFETY: taken once, here; `block` is not used afterwards.
        let block = unsafe { std::mem::ManuallyDrop::take(&mut self.block) };
        let Some(class) = class_of(block.capacity).1 else {
            return; // freed
        };
        let keep = kept(block.capacity, SHARERS.try_with(Cell::get).unwrap_or(1));
        // During thread exit the pool may be gone: the block is then simply freed.
        let _ = POOL.try_with(|p| {
            let mut pool = p.borrow_mut();
            if pool[class].len() < keep {
                pool[class].push(block);
            }
        });
    }
}

impl Clone for IoBuf {
    fn clone(&self) -> IoBuf {
        IoBuf::copy_of(self)
    }
}

impl PartialEq for IoBuf {
    fn eq(&self, other: &IoBuf) -> bool {
        **self == **other
    }
}

impl std::fmt::Debug for IoBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const SHOWN: usize = 16;
        write!(
            f,
            "IoBuf({} bytes: {:02x?}",
            self.len,
            &self[..self.len.min(SHOWN)]
        )?;
        if self.len > SHOWN {
            write!(f, "…")?;
        }
        write!(f, ")")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pooled(class: usize) -> usize {
        POOL.with(|p| p.borrow()[class].len())
    }

    #[test]
    fn buffers_are_aligned_and_sized() {
        for len in [0, 1, 511, 4096, 4097, 128 << 10, (1 << 20) + 1, 3 << 20] {
            let b = IoBuf::zeroed(len);
            assert_eq!(b.len(), len);
            assert_eq!(b.as_ptr() as usize % IO_ALIGN, 0, "len {len}");
            assert!(b.iter().all(|&x| x == 0));
        }
    }

    #[test]
    fn a_freed_buffer_is_reused_by_the_next_of_its_class() {
        let (_, class) = class_of(100 << 10);
        let class = class.unwrap();
        let before = pooled(class);
        let mut a = IoBuf::for_overwrite(100 << 10);
        a.fill(7);
        let at = a.as_ptr();
        drop(a);
        assert_eq!(pooled(class), before + 1);
        // Same class (128 KiB), another length: the same memory, old bytes visible
        // only to a caller that asked for a buffer to overwrite.
        let b = IoBuf::for_overwrite(128 << 10);
        assert_eq!(b.as_ptr(), at);
        assert_eq!(b[0], 7);
        drop(b);
        let z = IoBuf::zeroed(128 << 10);
        assert_eq!(z.as_ptr(), at);
        assert!(z.iter().all(|&x| x == 0));
    }

    #[test]
    fn the_pool_is_bounded() {
        let (capacity, class) = class_of(POOL_MAX_BUFFER);
        let class = class.unwrap();
        let keep = POOL_CLASS_BYTES / capacity;
        let many: Vec<IoBuf> = (0..keep + 5)
            .map(|_| IoBuf::for_overwrite(POOL_MAX_BUFFER))
            .collect();
        drop(many);
        assert_eq!(pooled(class), keep);
        // Bigger buffers are not pooled at all.
        assert_eq!(class_of(POOL_MAX_BUFFER + 1).1, None);
        assert_eq!(class_of(POOL_MAX_BUFFER + 1).0, POOL_MAX_BUFFER + IO_ALIGN);
    }

    #[test]
    fn threads_that_share_the_work_share_the_bound() {
        // On a thread of its own: the setting and the pool are the thread's.
        std::thread::spawn(|| {
            share_pool(4);
            let (capacity, class) = class_of(POOL_MAX_BUFFER);
            let class = class.unwrap();
            let keep = POOL_CLASS_BYTES / 4 / capacity;
            let many: Vec<IoBuf> = (0..POOL_CLASS_BYTES / capacity)
                .map(|_| IoBuf::for_overwrite(POOL_MAX_BUFFER))
                .collect();
            drop(many);
            assert_eq!(pooled(class), keep, "a quarter of one thread's bound");
            // However many threads, a class keeps one buffer.
            share_pool(usize::MAX);
            let (_, small) = class_of(IO_ALIGN);
            let two = [
                IoBuf::for_overwrite(IO_ALIGN),
                IoBuf::for_overwrite(IO_ALIGN),
            ];
            drop(two);
            assert_eq!(pooled(small.unwrap()), 1);
        })
        .join()
        .unwrap();
        assert_eq!(kept(POOL_MAX_BUFFER, 0), POOL_CLASS_BYTES / POOL_MAX_BUFFER);
    }

    #[test]
    fn clones_and_comparisons_see_the_bytes() {
        let a = IoBuf::copy_of(b"xyz");
        let b = a.clone();
        assert_eq!(a, b);
        assert_ne!(a.as_ptr(), b.as_ptr());
        assert_eq!(&*b, b"xyz");
        assert_eq!(format!("{a:?}"), "IoBuf(3 bytes: [78, 79, 7a])");
    }
}
