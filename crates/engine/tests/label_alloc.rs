//! A `&'static str` label costs an operation no allocation (and so no free
//! when it retires, inside a later operation's sweep).

use cuda_streams_engine::OperationGraph;
use cuda_streams_engine::driver::Stream;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use test_support::ctx;

/// Counts the allocations made on a thread while it is counting.
struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static COUNT: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: forwards every call to the system allocator unchanged; the
// counters are thread-locals of plain `Cell`s (no allocation, no reentry).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.with(Cell::get) {
            COUNT.with(|c| c.set(c.get() + 1));
        }
        // SAFETY: the caller's contract for `alloc`, passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract for `dealloc`, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Allocations `f` makes on this thread.
fn allocations(f: impl FnOnce()) -> usize {
    COUNT.with(|c| c.set(0));
    COUNTING.with(|c| c.set(true));
    f();
    COUNTING.with(|c| c.set(false));
    COUNT.with(Cell::get)
}

#[test]
fn a_static_label_is_kept_without_an_allocation() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let graph = OperationGraph::for_context(&ctx);
    let named = allocations(|| drop(graph.op(&stream).label("upload x")));
    assert_eq!(named, 0, "a static label allocated");
    // An owned name is kept too, and both read back the same.
    let owned = format!("round {}", 2);
    let a = graph.op(&stream).label("upload x").run(|_| Ok(())).unwrap();
    let b = graph.op(&stream).label(owned).run(|_| Ok(())).unwrap();
    assert_eq!(graph.metadata(a.id()).unwrap().description, "upload x");
    assert_eq!(graph.metadata(b.id()).unwrap().description, "round 2");
    b.wait().unwrap();
}
