//! An owned shelf of shared plain events for one owner that keeps its events
//! behind an `Arc` (the engine keeps each operation's completion event in its
//! table, in the handle `run` returns and as its stream's latest mark).
//!
//! Taking from it is a `Vec::pop`, putting back a uniqueness check and a
//! push: no lock, no thread-local look-up and no `Arc` allocated or freed,
//! where a round trip through the pool ([`EventPool::acquire_event`]) costs
//! all three. Its owner already serialises its own accesses (the engine's
//! table lock), so it takes `&mut self` and needs no lock of its own. Its
//! events go back to the pool when it is trimmed or dropped.

use super::{EventPool, PooledEvent, UniqueEvent};
use crate::ground::error::Result;
use std::fmt;
use std::sync::Arc;

/// Free plain events of one [`EventPool`], each kept with its `Arc`, for one
/// owner. From [`EventPool::local_shelf`].
///
/// It keeps an event put back only when nothing else can still see it (the
/// last handle: no other `Arc`, no `Weak`), when it is a plain event of this
/// shelf's pool, while it holds fewer than its limit, and never for a capped
/// pool ([`EventPool::with_capacity_limit`]), whose free events must stay
/// within reach of its other users.
///
/// ```
/// use cuda_streams_driver::{Context, Stream};
/// use std::sync::Arc;
/// # fn main() -> cuda_streams_driver::Result<()> {
/// let ctx = Context::new(0)?;
/// let stream = Stream::new(&ctx)?;
/// let pool = ctx.event_pool();
/// let mut shelf = pool.local_shelf(8);
/// let event = shelf.acquire()?.into_arc(); // empty shelf: from the pool
/// event.record(&stream)?;
/// let copy = Arc::clone(&event);
/// assert!(shelf.put(event).is_some(), "another handle still sees it: not kept");
/// assert!(shelf.put(copy).is_none(), "the last handle: kept");
/// assert_eq!(shelf.len(), 1);
/// let again = shelf.take().expect("kept just above");
/// # drop(again);
/// # Ok(())
/// # }
/// ```
pub struct LocalShelf {
    pool: Arc<EventPool>,
    events: Vec<UniqueEvent>,
    limit: usize,
}

impl EventPool {
    /// An empty [`LocalShelf`] of this pool's plain events, holding at most
    /// `limit` (nothing for a capped pool).
    pub fn local_shelf(self: &Arc<Self>, limit: usize) -> LocalShelf {
        LocalShelf {
            pool: Arc::clone(self),
            events: Vec::new(),
            limit: if self.per_thread { limit } else { 0 },
        }
    }
}

impl LocalShelf {
    /// A kept event, if any.
    #[inline]
    pub fn take(&mut self) -> Option<UniqueEvent> {
        self.events.pop()
    }

    /// A kept event, or else a plain event from the pool in a new `Arc`.
    pub fn acquire(&mut self) -> Result<UniqueEvent> {
        match self.take() {
            Some(event) => Ok(event),
            None => Ok(UniqueEvent::new(self.pool.acquire_event(false)?)),
        }
    }

    /// Keep `event` for a later [`take`](Self::take); `None` when kept. It
    /// is handed back when the shelf cannot keep it (see [`LocalShelf`]):
    /// drop it where dropping is fine (its pool takes it back then; a caller
    /// holding a lock may prefer to drop it after).
    #[inline]
    pub fn put(&mut self, event: Arc<PooledEvent>) -> Option<Arc<PooledEvent>> {
        if self.events.len() >= self.limit
            || event.is_timing()
            || !Arc::ptr_eq(event.pool(), &self.pool)
        {
            return Some(event);
        }
        // The last handle: a user still holding it would see its next
        // record.
        match UniqueEvent::try_from_arc(event) {
            Ok(event) => {
                self.events.push(event);
                None
            }
            Err(event) => Some(event),
        }
    }

    /// Hand every kept event back, to drop (they return to the pool then).
    #[must_use = "the events return to the pool when the list is dropped"]
    pub fn trim(&mut self) -> Vec<UniqueEvent> {
        std::mem::take(&mut self.events)
    }

    /// The most events it keeps (0 for a capped pool's shelf).
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Keep at most `limit` events from now on (a capped pool's shelf keeps
    /// none whatever the limit). Events already kept beyond it stay until
    /// taken or trimmed.
    pub fn set_limit(&mut self, limit: usize) {
        if self.pool.per_thread {
            self.limit = limit;
        }
    }

    /// How many events it keeps now.
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// Whether it keeps none.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// The pool its events come from and return to.
    pub fn pool(&self) -> &Arc<EventPool> {
        &self.pool
    }
}

impl fmt::Debug for LocalShelf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalShelf")
            .field("kept", &self.events.len())
            .field("limit", &self.limit)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Context;

    fn plain(pool: &Arc<EventPool>) -> Arc<PooledEvent> {
        Arc::new(pool.acquire_event(false).unwrap())
    }

    #[test]
    fn keeps_only_the_last_handle_of_its_own_pools_plain_events() {
        let ctx = Context::new(0).unwrap();
        let pool = ctx.event_pool();
        let other = Arc::new(EventPool::new(&ctx, 0, 0).unwrap());
        let mut shelf = pool.local_shelf(4);
        let shared = plain(&pool);
        let _holder = Arc::clone(&shared);
        assert!(shelf.put(shared).is_some(), "kept an event still held");
        let watched = plain(&pool);
        let weak = Arc::downgrade(&watched);
        assert!(
            shelf.put(watched).is_some(),
            "kept an event a Weak can reach"
        );
        drop(weak);
        assert!(
            shelf.put(plain(&other)).is_some(),
            "kept another pool's event"
        );
        let timing = Arc::new(pool.acquire_event(true).unwrap());
        assert!(shelf.put(timing).is_some(), "kept a timing event");
        assert!(shelf.is_empty());
        let kept = plain(&pool);
        let raw = kept.as_raw();
        assert!(shelf.put(kept).is_none(), "the last handle was not kept");
        assert_eq!(shelf.take().map(|e| e.as_raw()), Some(raw));
    }

    #[test]
    fn holds_at_most_its_limit_and_nothing_for_a_capped_pool() {
        let ctx = Context::new(0).unwrap();
        let pool = Arc::new(EventPool::new(&ctx, 0, 0).unwrap());
        let mut shelf = pool.local_shelf(2);
        for _ in 0..3 {
            let _ = shelf.put(plain(&pool));
        }
        assert_eq!(shelf.len(), 2);
        shelf.set_limit(3);
        assert!(shelf.put(plain(&pool)).is_none());
        assert_eq!(shelf.len(), 3);
        let capped = Arc::new(EventPool::with_capacity_limit(&ctx, 2, 0, 2).unwrap());
        let mut none = capped.local_shelf(8);
        none.set_limit(8);
        assert_eq!(none.limit(), 0);
        assert!(none.put(plain(&capped)).is_some());
    }

    #[test]
    fn trim_and_drop_return_the_events_to_the_pool() {
        let ctx = Context::new(0).unwrap();
        let pool = Arc::new(EventPool::new(&ctx, 0, 0).unwrap());
        let mut shelf = pool.local_shelf(8);
        // From the pool while the shelf is empty.
        let events: Vec<_> = (0..3)
            .map(|_| shelf.acquire().unwrap().into_arc())
            .collect();
        assert_eq!(pool.utilization().in_use, 3);
        for event in events {
            assert!(shelf.put(event).is_none());
        }
        assert_eq!(pool.utilization().in_use, shelf.len());
        drop(shelf.trim());
        assert_eq!(pool.utilization().in_use, 0, "trim kept events");
        assert!(shelf.put(plain(&pool)).is_none());
        assert_eq!(pool.utilization().in_use, 1);
        drop(shelf);
        assert_eq!(pool.utilization().in_use, 0, "drop kept events");
    }
}
