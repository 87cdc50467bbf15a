//! Per-thread shelves of free events. A thread that releases an event keeps it
//! for its own next acquire, so the usual round trip (acquire, record, wait,
//! release on one thread) takes no lock: the shared shelf's mutex costs two
//! atomic read-modify-writes each way, which is most of the round trip on a
//! server CPU.

use super::EventPool;
use crate::objects::event::Event;
use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

/// Free events of each kind one thread keeps for one pool; more go back to
/// the pool's shared shelf.
pub(crate) const PER_THREAD: usize = 32;

/// How many free events one thread holds for a pool. Written by that thread
/// only (a plain store, not a read-modify-write), read by
/// [`EventPool::utilization`] on any thread.
#[derive(Default)]
pub(crate) struct HeldCounts {
    regular: AtomicUsize,
    timing: AtomicUsize,
}

impl HeldCounts {
    /// `(regular, timing)` free events the thread holds.
    pub(crate) fn get(&self) -> (usize, usize) {
        (
            self.regular.load(Ordering::Relaxed),
            self.timing.load(Ordering::Relaxed),
        )
    }
}

/// One thread's free events for one pool.
struct ThreadShelf {
    /// Weak, so that a thread's shelf does not keep its pool alive; it also
    /// keeps the pool's allocation, so the address used to find the shelf
    /// cannot be reused by another pool while the shelf exists.
    pool: Weak<EventPool>,
    regular: Vec<Event>,
    timing: Vec<Event>,
    held: Arc<HeldCounts>,
}

impl ThreadShelf {
    fn belongs_to(&self, pool: &Arc<EventPool>) -> bool {
        std::ptr::eq(self.pool.as_ptr(), Arc::as_ptr(pool))
    }

    fn kind(&mut self, timing: bool) -> (&mut Vec<Event>, &AtomicUsize) {
        if timing {
            (&mut self.timing, &self.held.timing)
        } else {
            (&mut self.regular, &self.held.regular)
        }
    }
}

impl Drop for ThreadShelf {
    /// At thread exit, or when the thread finds its pool gone: the events go
    /// back to the pool's shared shelf, or are destroyed with the pool.
    fn drop(&mut self) {
        self.held.regular.store(0, Ordering::Relaxed);
        self.held.timing.store(0, Ordering::Relaxed);
        if let Some(pool) = self.pool.upgrade() {
            pool.shelve(self.regular.drain(..).chain(self.timing.drain(..)));
        }
    }
}

thread_local! {
    static SHELVES: RefCell<Vec<ThreadShelf>> = const { RefCell::new(Vec::new()) };
}

/// A free event of the kind asked for from this thread's shelf for `pool`.
#[inline]
pub(crate) fn take(pool: &Arc<EventPool>, timing: bool) -> Option<Event> {
    SHELVES
        .try_with(|shelves| {
            let mut shelves = shelves.try_borrow_mut().ok()?;
            let shelf = shelves.iter_mut().find(|shelf| shelf.belongs_to(pool))?;
            let (events, held) = shelf.kind(timing);
            let event = events.pop()?;
            held.store(events.len(), Ordering::Relaxed);
            Some(event)
        })
        .ok()
        .flatten()
}

/// Keep `event` on this thread's shelf for `pool`, or hand it back when the
/// shelf is full or this thread cannot keep it: inside a stream callback (the
/// driver's thread must never end up destroying events), or while the
/// thread's storage is being torn down.
#[inline]
pub(crate) fn keep(pool: &Arc<EventPool>, event: Event) -> Result<(), Event> {
    if crate::ground::callback_thread::in_stream_callback() {
        return Err(event);
    }
    let timing = event.is_timing();
    let mut event = Some(event);
    let _ = SHELVES.try_with(|shelves| {
        let Ok(mut shelves) = shelves.try_borrow_mut() else {
            return;
        };
        let index = match shelves.iter().position(|shelf| shelf.belongs_to(pool)) {
            Some(index) => index,
            None => {
                // A new pool for this thread: first drop the shelves of pools
                // that are gone, so a thread that outlives many pools does not
                // hold their events until it ends.
                shelves.retain(|shelf| shelf.pool.strong_count() > 0);
                let held = Arc::new(HeldCounts::default());
                pool.register_thread(&held);
                shelves.push(ThreadShelf {
                    pool: Arc::downgrade(pool),
                    regular: Vec::new(),
                    timing: Vec::new(),
                    held,
                });
                shelves.len() - 1
            }
        };
        let (events, held) = shelves[index].kind(timing);
        if events.len() < PER_THREAD {
            events.extend(event.take());
            held.store(events.len(), Ordering::Relaxed);
        }
    });
    match event {
        Some(event) => Err(event),
        None => Ok(()),
    }
}
