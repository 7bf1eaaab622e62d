//! An allocator for the processes a zygote's template forks (see `docs/warm.md`): until
//! [`use_fresh_arena`] switches it on it is the system allocator; after, in a process just
//! forked, small allocations come from a fresh mapping of that process's own, so that the
//! allocator never walks, splits or links the chunks the template left free in its heap —
//! each such write copied a page of the template's heap in the fork (PID 1's setup: ~60
//! copy-on-write faults a run). Large blocks still come from the system allocator (glibc maps
//! them on their own). Memory the template allocated and the fork frees is left as it is
//! (written to, it would be copied; it is the template's memory, charged to no run).
//!
//! Written here rather than taken from an allocator crate (`talc`, `linked_list_allocator`,
//! `buddy_system_allocator` serve a region they are given): what this needs is the switch and
//! the routing — the system allocator until a fork asks, then every block by its origin, the
//! template's never written, the fork's large ones given back — which would be this same code
//! around any of them; the region itself needs only power-of-two free lists, a few lines that
//! a crate would not shorten.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// The global allocator a zygote binary installs (`#[global_allocator]`).
pub struct ForkArena;

/// Small blocks are powers of two from 16 bytes to [`LARGEST`].
const SMALLEST_CLASS: u32 = 4;
const CLASSES: usize = 13;
const LARGEST: usize = 1 << (SMALLEST_CLASS as usize + CLASSES - 1);
/// A block's address is a multiple of its size up to this.
const MAX_ALIGN: usize = 64;
/// The arena's address space (reserved, not committed: only the pages in use are allocated,
/// and charged to the process's memory cgroup). Past it, small blocks come from the system.
const ARENA: usize = 16 << 20;
/// Large blocks the fork took from the system allocator, remembered so that freeing one
/// gives it back (one the template allocated is kept instead); past this many at once, a
/// large block freed is kept too.
const LARGE: usize = 64;

static ACTIVE: AtomicBool = AtomicBool::new(false);
static LOCK: AtomicBool = AtomicBool::new(false);
static BASE: AtomicUsize = AtomicUsize::new(0);
static NEXT: AtomicUsize = AtomicUsize::new(0);
static END: AtomicUsize = AtomicUsize::new(0);
/// Each class's free blocks, linked through their first word.
static FREE: [AtomicUsize; CLASSES] = [const { AtomicUsize::new(0) }; CLASSES];
/// The large blocks the fork took from the system allocator (0: a free slot).
static TAKEN: [AtomicUsize; LARGE] = [const { AtomicUsize::new(0) }; LARGE];

/// Switches this process's allocations to a fresh arena. For a process just forked (or
/// cloned) from a single-threaded parent, before it starts any thread; a second call does
/// nothing. Only where no address-space limit is in force (a run without a cgroup falls back
/// to `RLIMIT_AS`, which the reservation would eat into): otherwise it does nothing. Without
/// [`ForkArena`] installed as the global allocator nothing changes but the reserved (never
/// used) address space.
pub fn use_fresh_arena() -> std::io::Result<()> {
    if ACTIVE.load(Ordering::Acquire) {
        return Ok(());
    }
    let (soft, _) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_AS)?;
    if soft != nix::sys::resource::RLIM_INFINITY {
        return Ok(());
    }
    let prot = libc::PROT_READ | libc::PROT_WRITE;
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
    // SAFETY: a fresh private anonymous mapping, owned by the arena for the process's life.
    let base = unsafe { libc::mmap(std::ptr::null_mut(), ARENA, prot, flags, -1, 0) };
    if base == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    let base = base as usize;
    BASE.store(base, Ordering::Relaxed);
    NEXT.store(base, Ordering::Relaxed);
    END.store(base + ARENA, Ordering::Relaxed);
    ACTIVE.store(true, Ordering::Release);
    Ok(())
}

/// The block class of `layout`, if the arena serves it.
fn class(layout: Layout) -> Option<usize> {
    let size = layout.size().max(1 << SMALLEST_CLASS).next_power_of_two();
    let fits = size <= LARGEST && layout.align() <= size.min(MAX_ALIGN);
    fits.then(|| (size.trailing_zeros() - SMALLEST_CLASS) as usize)
}

fn in_arena(ptr: *mut u8) -> bool {
    let at = ptr as usize;
    at >= BASE.load(Ordering::Relaxed) && at < END.load(Ordering::Relaxed)
}

/// A spin lock: the forks are single-threaded when they allocate here (the interpreter's
/// threads allocate with its own allocator), so it is never contended in practice.
struct Held;

impl Held {
    fn take() -> Held {
        while LOCK
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            std::hint::spin_loop();
        }
        Held
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        LOCK.store(false, Ordering::Release);
    }
}

/// A block of `class`: a freed one, else carved from the arena's unused end.
fn take_block(class: usize) -> *mut u8 {
    let _held = Held::take();
    let head = FREE[class].load(Ordering::Relaxed);
    if head != 0 {
        // SAFETY: `head` is a free block of this class; its first word links the next.
        let next = unsafe { (head as *const usize).read() };
        FREE[class].store(next, Ordering::Relaxed);
        return head as *mut u8;
    }
    let size = 1usize << (class as u32 + SMALLEST_CLASS);
    let start = NEXT
        .load(Ordering::Relaxed)
        .next_multiple_of(size.min(MAX_ALIGN));
    match start.checked_add(size) {
        Some(end) if end <= END.load(Ordering::Relaxed) => {
            NEXT.store(end, Ordering::Relaxed);
            start as *mut u8
        }
        _ => std::ptr::null_mut(),
    }
}

fn give_back(ptr: *mut u8, class: usize) {
    let _held = Held::take();
    // SAFETY: `ptr` is a block of this class no one uses any more; its first word (blocks are
    // at least 16 bytes, aligned to 16) links the list.
    unsafe { (ptr as *mut usize).write(FREE[class].load(Ordering::Relaxed)) };
    FREE[class].store(ptr as usize, Ordering::Relaxed);
}

/// Remembers a large block the fork took from the system allocator (if a slot is free).
fn remember(ptr: *mut u8) {
    if ptr.is_null() {
        return;
    }
    let _held = Held::take();
    if let Some(slot) = TAKEN.iter().find(|slot| slot.load(Ordering::Relaxed) == 0) {
        slot.store(ptr as usize, Ordering::Relaxed);
    }
}

/// Forgets a large block; whether the fork had taken it (else the template allocated it).
fn forget(ptr: *mut u8) -> bool {
    let _held = Held::take();
    let taken = TAKEN
        .iter()
        .find(|slot| slot.load(Ordering::Relaxed) == ptr as usize);
    taken
        .inspect(|slot| slot.store(0, Ordering::Relaxed))
        .is_some()
}

// SAFETY: blocks are at least `layout.size()` long and aligned to `layout.align()` (`class`
// refuses what they are not), each handed out once until given back; what the arena does not
// serve goes to the system allocator, and memory is given back to whichever allocator made it
// (or, the template's after the switch, kept).
unsafe impl GlobalAlloc for ForkArena {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !ACTIVE.load(Ordering::Acquire) {
            // SAFETY: the caller's layout, as `GlobalAlloc::alloc` requires.
            return unsafe { System.alloc(layout) };
        }
        if let Some(class) = class(layout) {
            let block = take_block(class);
            if !block.is_null() {
                return block;
            }
        }
        // SAFETY: as above.
        let block = unsafe { System.alloc(layout) };
        remember(block);
        block
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if in_arena(ptr) {
            if let Some(class) = class(layout) {
                give_back(ptr, class);
            }
        } else if !ACTIVE.load(Ordering::Acquire) || forget(ptr) {
            // SAFETY: `ptr` came from the system allocator with this layout.
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !ACTIVE.load(Ordering::Acquire) || class(layout).is_none() {
            // SAFETY: the caller's layout.
            let block = unsafe { System.alloc_zeroed(layout) };
            if ACTIVE.load(Ordering::Acquire) {
                remember(block);
            }
            return block;
        }
        // SAFETY: the caller's layout; the block is `layout.size()` bytes long.
        let block = unsafe { self.alloc(layout) };
        if !block.is_null() {
            // SAFETY: as above.
            unsafe { block.write_bytes(0, layout.size()) };
        }
        block
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if !ACTIVE.load(Ordering::Acquire) {
            // SAFETY: before the switch every block is the system allocator's.
            return unsafe { System.realloc(ptr, layout, new_size) };
        }
        let Ok(new) = Layout::from_size_align(new_size, layout.align()) else {
            return std::ptr::null_mut();
        };
        if in_arena(ptr) && class(layout).is_some() && class(layout) == class(new) {
            return ptr; // the block already holds `new_size`
        }
        if !in_arena(ptr) && class(new).is_none() && forget(ptr) {
            // SAFETY: a block the fork took from the system allocator with `layout`.
            let moved = unsafe { System.realloc(ptr, layout, new_size) };
            remember(if moved.is_null() { ptr } else { moved });
            return moved;
        }
        // SAFETY: `new` is a valid layout of non-zero size (`new_size` is, by contract).
        let moved = unsafe { self.alloc(new) };
        if !moved.is_null() {
            // SAFETY: both blocks hold at least the smaller size and do not overlap.
            unsafe { std::ptr::copy_nonoverlapping(ptr, moved, layout.size().min(new_size)) };
            // SAFETY: `ptr` with its layout, no longer used.
            unsafe { self.dealloc(ptr, layout) };
        }
        moved
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_hold_their_layouts() {
        let layout = |size, align| Layout::from_size_align(size, align).unwrap();
        assert_eq!(class(layout(1, 1)), Some(0));
        assert_eq!(class(layout(16, 8)), Some(0));
        assert_eq!(class(layout(17, 8)), Some(1));
        assert_eq!(class(layout(LARGEST, 8)), Some(CLASSES - 1));
        assert_eq!(class(layout(LARGEST + 1, 8)), None);
        // An alignment above the block's own (or above 64) goes to the system.
        assert_eq!(class(layout(16, 32)), None);
        assert_eq!(class(layout(4096, 4096)), None);
        assert_eq!(class(layout(128, 64)), Some(3));
    }

    fn layout(size: usize, align: usize) -> Layout {
        Layout::from_size_align(size, align).unwrap()
    }

    fn alloc(size: usize, align: usize) -> *mut u8 {
        // SAFETY: a layout of non-zero size.
        unsafe { ForkArena.alloc(layout(size, align)) }
    }

    fn zeroed(size: usize) -> *mut u8 {
        // SAFETY: as above.
        unsafe { ForkArena.alloc_zeroed(layout(size, 8)) }
    }

    fn free(block: *mut u8, size: usize, align: usize) {
        // SAFETY: the tests free each block once, with the layout it was made with.
        unsafe { ForkArena.dealloc(block, layout(size, align)) }
    }

    fn grow(block: *mut u8, size: usize, new_size: usize) -> *mut u8 {
        // SAFETY: a block made with this layout, grown once and not used after.
        unsafe { ForkArena.realloc(block, layout(size, 8), new_size) }
    }

    fn fill(block: *mut u8, byte: u8, len: usize) {
        // SAFETY: the tests fill at most the block's own size.
        unsafe { block.write_bytes(byte, len) }
    }

    fn bytes(block: *mut u8, len: usize) -> Vec<u8> {
        // SAFETY: as above, for reading.
        unsafe { std::slice::from_raw_parts(block, len) }.to_vec()
    }

    /// Switched on (only `ForkArena`'s own calls see it: it is not this test binary's
    /// allocator), blocks come from the arena, aligned, reused once freed, and keep their
    /// bytes when they grow; a block from the system allocator grows into the arena.
    #[test]
    fn the_arena_serves_aligned_blocks_and_reuses_them() {
        let before = alloc(100, 8);
        assert!(!before.is_null() && !in_arena(before));
        use_fresh_arena().unwrap();
        for (size, align) in [(1, 1), (24, 8), (100, 64), (5000, 8), (LARGEST, 16)] {
            let block = alloc(size, align);
            assert!(in_arena(block), "{size}");
            assert_eq!(block as usize % align, 0, "{size}");
            fill(block, 7, size);
            free(block, size, align);
            let again = alloc(size, align);
            assert_eq!(again, block, "a freed block of {size} bytes is taken again");
            free(again, size, align);
        }
        fill(before, 9, 100);
        let grown = grow(before, 100, 3000);
        assert!(in_arena(grown));
        assert_eq!(bytes(grown, 100), [9; 100]);
        free(grown, 3000, 8);
        let cleared = zeroed(3000);
        assert_eq!(cleared, grown, "the freed block, with its old bytes zeroed");
        assert!(bytes(cleared, 3000).iter().all(|b| *b == 0));
        // A large block comes from the system allocator and goes back to it when freed; one
        // the template allocated (before the switch) is kept.
        let is_taken = |block: *mut u8| {
            TAKEN
                .iter()
                .any(|t| t.load(Ordering::Relaxed) == block as usize)
        };
        let large = alloc(LARGEST + 1, 8);
        assert!(!large.is_null() && !in_arena(large) && is_taken(large));
        let larger = grow(large, LARGEST + 1, 4 * LARGEST);
        assert!(is_taken(larger) && (larger == large || !is_taken(large)));
        free(larger, 4 * LARGEST, 8);
        assert!(!is_taken(larger));
    }
}
