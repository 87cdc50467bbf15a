//! A pool of reusable events: acquiring one is a `Vec::pop` from the thread's
//! own shelf or, failing that, from the shared one under a short lock; never a
//! `cuEventCreate` unless the pool has run out.
//!
//! Every context has one ([`Context::event_pool`]), which the driver layer's
//! own event users share: stream ordering ([`Stream::wait_stream`](crate::Stream::wait_stream)),
//! timed sections, the buffers' use tracking. Separate pools
//! ([`EventPool::new`]) serve callers that want their own counts or a cap.

mod builder;
mod local_shelf;
mod per_context;
mod shelf;
mod thread_shelf;
mod unique;

use crate::ground::error::{Error, Result};
use crate::objects::context::Context;
use crate::objects::event::{Event, EventFlags};
pub use builder::EventPoolBuilder;
pub use local_shelf::LocalShelf;
use shelf::Shelf;
use std::fmt;
use std::mem::ManuallyDrop;
use std::ops::Deref;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use thread_shelf::HeldCounts;
pub use unique::UniqueEvent;

/// Free events of one kind, and how many of that kind exist.
type EventShelf = Shelf<Event>;

/// A shelf of `count` new events of kind `flags`, at most `cap` ever.
fn event_shelf(
    ctx: &Arc<Context>,
    flags: EventFlags,
    count: usize,
    cap: usize,
) -> Result<EventShelf> {
    let kind = kind_of(flags);
    if count > cap {
        return Err(Error::EventPoolCapBelowInitial {
            kind,
            requested: count,
            cap,
        });
    }
    let free = (0..count)
        .map(|_| Event::new(ctx, flags))
        .collect::<Result<Vec<_>>>()?;
    Ok(Shelf::new(free, cap, kind))
}

fn kind_of(flags: EventFlags) -> &'static str {
    if flags.timing { "timing" } else { "regular" }
}

/// How many events of an [`EventPool`] are free and in use, from
/// [`EventPool::utilization`].
///
/// ```
/// use cuda_streams_driver::{Context, EventPool, EventPoolUtilization};
/// use std::sync::Arc;
/// # fn main() -> cuda_streams_driver::Result<()> {
/// let ctx = Context::new(0)?;
/// let pool = Arc::new(EventPool::new(&ctx, 3, 1)?);
/// let held = pool.acquire_event(true)?;
/// let usage = pool.utilization();
/// assert_eq!(usage, EventPoolUtilization { available_regular: 3, available_timing: 0, in_use: 1 });
/// assert_eq!(usage.total(), 4);
/// # drop(held);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct EventPoolUtilization {
    /// Free plain events.
    pub available_regular: usize,
    /// Free timing events.
    pub available_timing: usize,
    /// Events acquired and not yet dropped.
    pub in_use: usize,
}

impl EventPoolUtilization {
    /// Every event the pool has created and not destroyed.
    pub const fn total(&self) -> usize {
        self.available_regular + self.available_timing + self.in_use
    }
}

/// A pool of plain ("regular") and timing events, reused instead of created
/// and destroyed for every use.
///
/// Acquiring pops a free event; dropping the [`PooledEvent`] puts it back. No
/// driver call happens on that path. When a kind runs out, the pool creates
/// one more event of that kind (counted by [`EventPool::growth_count`]) unless
/// the cap is reached, which is an [`Error::EventPoolExhausted`].
///
/// **Per-thread shelves.** A pool without a cap ([`EventPool::new`]) lets each
/// thread keep up to 32 free events of each kind that it released, and
/// acquire takes from there first: the common round trip on one thread then
/// takes no lock. Events released inside a stream callback, and events beyond
/// those 32, go to the shared shelf. Kept events count as available in
/// [`EventPool::utilization`]; they return to the shared shelf when their
/// thread ends, or are destroyed then if the pool is gone (or earlier, when
/// the thread next starts keeping events for another pool). Another thread
/// cannot take them, so under a producer/consumer pattern the pool may grow by
/// up to 32 events per thread and kind. A capped pool
/// ([`EventPool::with_capacity_limit`]) keeps every free event shared, so that
/// a free event is never out of reach of a thread that hit the cap.
///
/// A pooled event may still carry the mark of its previous use: record it
/// before waiting on it or querying it.
///
/// ```
/// use cuda_streams_driver::{Context, Stream};
/// use cuda_streams_driver::EventPool;
/// use std::sync::Arc;
/// # fn main() -> cuda_streams_driver::Result<()> {
/// let ctx = Context::new(0)?;
/// let stream = Stream::new(&ctx)?;
/// let pool = Arc::new(EventPool::new(&ctx, 2, 1)?);
/// let event = pool.acquire_event(false)?;
/// event.record(&stream)?; // derefs to Event
/// event.synchronize()?;
/// let usage = pool.utilization();
/// assert_eq!((usage.available_regular, usage.available_timing, usage.in_use), (1, 1, 1));
/// drop(event); // back to the pool
/// assert_eq!(pool.utilization().available_regular, 2);
/// # Ok(())
/// # }
/// ```
pub struct EventPool {
    ctx: Arc<Context>,
    regular: EventShelf,
    timing: EventShelf,
    growth: AtomicU64,
    /// Whether threads keep their released events (uncapped pools only).
    per_thread: bool,
    /// The counts of events each thread keeps, for `utilization`.
    threads: Mutex<Vec<Weak<HeldCounts>>>,
}

impl EventPool {
    /// A pool with `regular` plain events and `timing` timing events created up
    /// front, growing without a cap.
    pub fn new(ctx: &Arc<Context>, regular: usize, timing: usize) -> Result<EventPool> {
        Self::with_capacity_limit(ctx, regular, timing, usize::MAX)
    }

    /// The same, with at most `cap` events of each kind in existence; growth
    /// beyond it is an [`Error::EventPoolExhausted`]. A `cap` below `regular` or
    /// `timing` is an [`Error::EventPoolCapBelowInitial`].
    pub fn with_capacity_limit(
        ctx: &Arc<Context>,
        regular: usize,
        timing: usize,
        cap: usize,
    ) -> Result<EventPool> {
        Ok(EventPool {
            ctx: Arc::clone(ctx),
            regular: event_shelf(ctx, EventFlags::PLAIN, regular, cap)?,
            timing: event_shelf(ctx, EventFlags::TIMING, timing, cap)?,
            growth: AtomicU64::new(0),
            per_thread: cap == usize::MAX,
            threads: Mutex::new(Vec::new()),
        })
    }

    /// An uncapped pool with no events yet: no driver call.
    pub(crate) fn empty(ctx: &Arc<Context>) -> EventPool {
        EventPool {
            ctx: Arc::clone(ctx),
            regular: Shelf::new(Vec::new(), usize::MAX, kind_of(EventFlags::PLAIN)),
            timing: Shelf::new(Vec::new(), usize::MAX, kind_of(EventFlags::TIMING)),
            growth: AtomicU64::new(0),
            per_thread: true,
            threads: Mutex::new(Vec::new()),
        }
    }

    fn shelf(&self, timing: bool) -> &EventShelf {
        if timing { &self.timing } else { &self.regular }
    }

    /// A free event of the kind asked for (timing or plain), creating one when
    /// none is free and the cap allows.
    pub fn acquire_event(self: &Arc<Self>, timing: bool) -> Result<PooledEvent> {
        let shelf = self.shelf(timing);
        let kept = if self.per_thread {
            thread_shelf::take(self, timing)
        } else {
            None
        };
        let event = match kept {
            Some(event) => event,
            None => {
                let flags = if timing {
                    EventFlags::TIMING
                } else {
                    EventFlags::PLAIN
                };
                let (event, grew) = shelf.take_or_grow(|| Event::new(&self.ctx, flags))?;
                if grew {
                    self.growth.fetch_add(1, Ordering::Relaxed);
                }
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

    /// Free and used events at this moment. Free counts the events threads
    /// keep for themselves too.
    pub fn utilization(&self) -> EventPoolUtilization {
        let (mut regular, mut timing) = (0, 0);
        self.lock_threads().retain(|held| match held.upgrade() {
            Some(held) => {
                let (r, t) = held.get();
                regular += r;
                timing += t;
                true
            }
            None => false,
        });
        let regular = regular + self.regular.lock().len();
        let timing = timing + self.timing.lock().len();
        let created = self.regular.created() + self.timing.created();
        EventPoolUtilization {
            available_regular: regular,
            available_timing: timing,
            // Another thread may grow or release between the reads above.
            in_use: created.saturating_sub(regular + timing),
        }
    }

    /// How many events were created after construction because a kind ran out.
    pub fn growth_count(&self) -> u64 {
        self.growth.load(Ordering::Relaxed)
    }

    /// The cap on events of each kind (`usize::MAX` for [`EventPool::new`]).
    pub fn capacity_limit(&self) -> usize {
        self.regular.cap()
    }

    /// The context the events belong to.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    fn lock_threads(&self) -> MutexGuard<'_, Vec<Weak<HeldCounts>>> {
        self.threads.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A thread started keeping events of this pool. Threads that have ended
    /// are dropped from the list here too, so it does not grow with every
    /// short-lived thread that ever released an event.
    pub(crate) fn register_thread(&self, held: &Arc<HeldCounts>) {
        let mut threads = self.lock_threads();
        threads.retain(|held| held.strong_count() > 0);
        threads.push(Arc::downgrade(held));
    }

    /// Put free events on the shared shelves.
    pub(crate) fn shelve(&self, events: impl Iterator<Item = Event>) {
        for event in events {
            self.shelf(event.is_timing()).put(event);
        }
    }
}

impl fmt::Debug for EventPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let usage = self.utilization();
        f.debug_struct("EventPool")
            .field("available_regular", &usage.available_regular)
            .field("available_timing", &usage.available_timing)
            .field("in_use", &usage.in_use)
            .field("growth", &self.growth_count())
            .finish()
    }
}

/// An event borrowed from an [`EventPool`]. Derefs to [`Event`];
/// returns to its pool when dropped (no driver call, so dropping one inside a
/// stream callback is fine).
///
/// ```
/// use cuda_streams_driver::{EventPool, EventPoolUtilization, PooledEvent};
/// use cuda_streams_driver::{Context, Stream};
/// use std::sync::Arc;
/// # fn main() -> cuda_streams_driver::Result<()> {
/// let ctx = Context::new(0)?;
/// let stream = Stream::new(&ctx)?;
/// let pool = Arc::new(EventPool::new(&ctx, 1, 0)?);
/// let event: PooledEvent = pool.acquire_event(false)?;
/// assert!(Arc::ptr_eq(event.pool(), &pool));
/// event.record(&stream)?; // an Event method, through Deref
/// event.synchronize()?;
/// assert!(event.query()?);
/// drop(event);
/// assert_eq!(pool.utilization().in_use, 0); // back in the pool
/// # Ok(())
/// # }
/// ```
#[must_use = "a pooled event goes back to its pool when dropped"]
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
        let event = if self.pool.per_thread {
            match thread_shelf::keep(&self.pool, event) {
                Ok(()) => return,
                Err(event) => event,
            }
        } else {
            event
        };
        self.pool.shelve(std::iter::once(event));
    }
}

impl fmt::Debug for PooledEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("PooledEvent").field(&*self.event).finish()
    }
}
