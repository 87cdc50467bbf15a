//! A pool of reusable events: acquiring one is a short lock and a `Vec::pop`,
//! not a `cuEventCreate`.
//!
//! The lock is a spin lock rather than a `Mutex`: its critical sections are a
//! push or a pop, and its release is a plain store where a futex mutex's is an
//! atomic swap, which takes two of the six atomic operations of an acquire +
//! release round trip (the others: the lock's compare-exchange each way and
//! the pool's reference count each way).

use crate::error::{Error, Result};
use driver::{Context, Event, EventFlags};
use std::cell::UnsafeCell;
use std::fmt;
use std::mem::ManuallyDrop;
use std::ops::Deref;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// Spins before a waiting thread starts yielding its time slice (the holder
/// may have been preempted).
const SPINS: u32 = 64;

/// A `Vec` of free events behind a spin lock, reached only through
/// [`FreeList::with`].
struct FreeList {
    locked: AtomicBool,
    events: UnsafeCell<Vec<Event>>,
}

// SAFETY: the Vec is only reached through `with`, which holds `locked` for
// the whole access, so one thread at a time uses it; `Event` is `Send`.
unsafe impl Sync for FreeList {}

/// Releases the lock when dropped, so a panic in the critical section (an
/// allocation failure growing the Vec) cannot leave it locked.
struct Unlock<'a>(&'a AtomicBool);

impl Drop for Unlock<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl FreeList {
    fn new(events: Vec<Event>) -> Self {
        Self {
            locked: AtomicBool::new(false),
            events: UnsafeCell::new(events),
        }
    }

    /// Run `f` on the Vec under the lock. `f` must not call `with` again.
    #[inline]
    fn with<R>(&self, f: impl FnOnce(&mut Vec<Event>) -> R) -> R {
        if self
            .locked
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            self.lock_contended();
        }
        let _unlock = Unlock(&self.locked);
        // SAFETY: this thread holds `locked` (taken above with Acquire, so it
        // sees the previous holder's writes) until `_unlock` drops, after `f`
        // returns or unwinds; no other reference to the Vec exists meanwhile,
        // and `f` cannot keep this one (it is borrowed for the call only).
        f(unsafe { &mut *self.events.get() })
    }

    #[cold]
    fn lock_contended(&self) {
        let mut spins = 0;
        loop {
            while self.locked.load(Ordering::Relaxed) {
                if spins < SPINS {
                    spins += 1;
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
            if self
                .locked
                .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return;
            }
        }
    }
}

/// Free events of one kind, and how many of that kind exist.
struct Shelf {
    free: FreeList,
    /// Events of this kind created so far (free + in use). Only growth writes it.
    created: AtomicUsize,
    cap: usize,
    flags: EventFlags,
    kind: &'static str,
}

impl Shelf {
    fn new(ctx: &Arc<Context>, flags: EventFlags, count: usize, cap: usize) -> Result<Self> {
        let kind = if flags.timing { "timing" } else { "regular" };
        if count > cap {
            return Err(Error::CapacityBelowInitial {
                kind,
                requested: count,
                cap,
            });
        }
        let free = (0..count)
            .map(|_| Event::new(ctx, flags))
            .collect::<driver::Result<Vec<_>>>()?;
        Ok(Self {
            free: FreeList::new(free),
            created: AtomicUsize::new(count),
            cap,
            flags,
            kind,
        })
    }

    /// Free events now.
    fn available(&self) -> usize {
        self.free.with(|free| free.len())
    }

    /// Create one more event, unless the cap is reached.
    fn grow(&self, ctx: &Arc<Context>) -> Result<Event> {
        self.created
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.cap).then_some(n + 1)
            })
            .map_err(|_| Error::PoolExhausted {
                kind: self.kind,
                cap: self.cap,
            })?;
        Event::new(ctx, self.flags).map_err(|err| {
            self.created.fetch_sub(1, Ordering::AcqRel);
            err.into()
        })
    }
}

/// A pool of plain ("regular") and timing events, reused instead of created
/// and destroyed for every use.
///
/// Acquiring pops a free event under a short spin lock; dropping the
/// [`PooledEvent`] pushes it back. No driver call happens on that path. When a
/// kind runs out, the pool creates one more event of that kind (counted by
/// [`EventPool::growth_count`]) unless the cap is reached, which is an
/// [`Error::PoolExhausted`].
///
/// A pooled event may still carry the mark of its previous use: record it
/// before waiting on it or querying it.
///
/// ```
/// use driver::{Context, Stream};
/// use cuda_streams_event_coord::EventPool;
/// use std::sync::Arc;
/// # fn main() -> cuda_streams_event_coord::Result<()> {
/// let ctx = Context::new(0)?;
/// let stream = Stream::new(&ctx)?;
/// let pool = Arc::new(EventPool::new(&ctx, 2, 1)?);
/// let event = pool.acquire_event(false)?;
/// event.record(&stream)?; // derefs to driver::Event
/// event.synchronize()?;
/// assert_eq!(pool.utilization(), (1, 1, 1));
/// drop(event); // back to the pool
/// assert_eq!(pool.utilization(), (2, 1, 0));
/// # Ok(())
/// # }
/// ```
pub struct EventPool {
    ctx: Arc<Context>,
    regular: Shelf,
    timing: Shelf,
    growth: AtomicU64,
}

impl EventPool {
    /// A pool with `regular` plain events and `timing` timing events created up
    /// front, growing without a cap.
    pub fn new(ctx: &Arc<Context>, regular: usize, timing: usize) -> Result<EventPool> {
        Self::with_capacity_limit(ctx, regular, timing, usize::MAX)
    }

    /// The same, with at most `cap` events of each kind in existence; growth
    /// beyond it is an [`Error::PoolExhausted`]. A `cap` below `regular` or
    /// `timing` is an [`Error::CapacityBelowInitial`].
    pub fn with_capacity_limit(
        ctx: &Arc<Context>,
        regular: usize,
        timing: usize,
        cap: usize,
    ) -> Result<EventPool> {
        Ok(EventPool {
            ctx: Arc::clone(ctx),
            regular: Shelf::new(ctx, EventFlags::PLAIN, regular, cap)?,
            timing: Shelf::new(ctx, EventFlags::TIMING, timing, cap)?,
            growth: AtomicU64::new(0),
        })
    }

    fn shelf(&self, timing: bool) -> &Shelf {
        if timing { &self.timing } else { &self.regular }
    }

    /// A free event of the kind asked for (timing or plain), creating one when
    /// none is free and the cap allows.
    pub fn acquire_event(self: &Arc<Self>, timing: bool) -> Result<PooledEvent> {
        let shelf = self.shelf(timing);
        let popped = shelf.free.with(Vec::pop);
        let event = match popped {
            Some(event) => event,
            None => {
                let event = shelf.grow(&self.ctx)?;
                self.growth.fetch_add(1, Ordering::Relaxed);
                event
            }
        };
        Ok(PooledEvent {
            event: ManuallyDrop::new(event),
            pool: Arc::clone(self),
        })
    }

    /// Give an event back; the same as dropping it. An event always returns to
    /// the pool it came from, whichever pool this is called on.
    pub fn release_event(&self, event: PooledEvent) {
        drop(event);
    }

    /// `(available regular, available timing, in use)` at this moment.
    pub fn utilization(&self) -> (usize, usize, usize) {
        let regular = self.regular.available();
        let timing = self.timing.available();
        let created = self.regular.created.load(Ordering::Acquire)
            + self.timing.created.load(Ordering::Acquire);
        // Another thread may grow or release between the reads above.
        (regular, timing, created.saturating_sub(regular + timing))
    }

    /// How many events were created after construction because a kind ran out.
    pub fn growth_count(&self) -> u64 {
        self.growth.load(Ordering::Relaxed)
    }

    /// The cap on events of each kind (`usize::MAX` for [`EventPool::new`]).
    pub fn capacity_limit(&self) -> usize {
        self.regular.cap
    }

    /// The context the events belong to.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }
}

impl fmt::Debug for EventPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (regular, timing, in_use) = self.utilization();
        f.debug_struct("EventPool")
            .field("available_regular", &regular)
            .field("available_timing", &timing)
            .field("in_use", &in_use)
            .field("growth", &self.growth_count())
            .finish()
    }
}

/// An event borrowed from an [`EventPool`]. Derefs to [`driver::Event`];
/// returns to its pool when dropped (no driver call, so dropping one inside a
/// stream callback is fine).
pub struct PooledEvent {
    event: ManuallyDrop<Event>,
    pool: Arc<EventPool>,
}

impl PooledEvent {
    /// The pool it returns to.
    pub fn pool(&self) -> &Arc<EventPool> {
        &self.pool
    }
}

impl Deref for PooledEvent {
    type Target = Event;

    fn deref(&self) -> &Event {
        &self.event
    }
}

impl Drop for PooledEvent {
    fn drop(&mut self) {
        // SAFETY: `event` is taken exactly once, here, and `self` is not used
        // afterwards.
        let event = unsafe { ManuallyDrop::take(&mut self.event) };
        let shelf = self.pool.shelf(event.is_timing());
        shelf.free.with(|free| free.push(event));
    }
}

impl fmt::Debug for PooledEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("PooledEvent").field(&*self.event).finish()
    }
}
