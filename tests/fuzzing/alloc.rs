//! A counting allocator, so that an input which makes gpuq reserve memory in
//! proportion to a number it announces (rather than to the bytes it sent)
//! shows up as a crash instead of passing unnoticed on a machine with memory
//! to spare. Each binary that runs the targets installs it:
//! `#[global_allocator] static A: fuzzing::alloc::Counting = fuzzing::alloc::Counting;`
//!
//! Counting is per thread (inputs run on one thread each), and only between
//! [`arm`] and [`disarm`].

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

std::thread_local! {
    static ARMED: Cell<bool> = const { Cell::new(false) };
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

/// The system allocator, counting live bytes per thread while armed.
pub struct Counting;

fn note(delta: isize) {
    // `try_with`: the thread-locals may be gone while a thread exits.
    let _ = ARMED.try_with(|armed| {
        if armed.get() {
            let live = LIVE.with(|l| {
                l.set(l.get() + delta);
                l.get()
            });
            PEAK.with(|p| p.set(p.get().max(live)));
        }
    });
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size() as isize);
        System.alloc(layout)
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size() as isize);
        System.alloc_zeroed(layout)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        note(-(layout.size() as isize));
        System.dealloc(ptr, layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size as isize - layout.size() as isize);
        System.realloc(ptr, layout, new_size)
    }
}

/// Starts counting this thread's allocations from zero.
pub fn arm() {
    LIVE.with(|l| l.set(0));
    PEAK.with(|p| p.set(0));
    ARMED.with(|a| a.set(true));
}

/// Stops counting; returns the most bytes live at once since [`arm`]
/// (0 when the binary did not install [`Counting`]).
pub fn disarm() -> usize {
    ARMED.with(|a| a.set(false));
    PEAK.with(|p| p.get().max(0) as usize)
}
