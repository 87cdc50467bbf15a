//! Each context's shared event pool ([`Context::event_pool`]), found by the
//! context's id: the pool stands on the context (its events hold it), so the
//! context does not hold the pool; this registry does, weakly.

use super::EventPool;
use crate::objects::context::Context;
use std::sync::{Arc, Mutex, Weak};

/// The shared pool of each context that has one alive, by context id (ids
/// are never reused). Weak: a pool lives while a stream or a caller holds it.
static SHARED: Mutex<Vec<(u64, Weak<EventPool>)>> = Mutex::new(Vec::new());

impl Context {
    /// The context's shared pool of plain and timing events, growing without
    /// a cap. Streams use it for their waits on other streams, timed sections
    /// and buffer tracking; take events from it rather than creating them.
    /// It lives while any stream that used it, or any caller, holds it.
    ///
    /// ```
    /// use cuda_streams_driver::{Context, Stream};
    /// use std::sync::Arc;
    /// let ctx = Context::new(0).unwrap();
    /// let pool = ctx.event_pool();
    /// assert!(Arc::ptr_eq(&pool, &ctx.event_pool())); // one per context
    /// let stream = Stream::new(&ctx).unwrap();
    /// let event = pool.acquire_event(false).unwrap();
    /// event.record(&stream).unwrap();
    /// event.synchronize().unwrap();
    /// ```
    pub fn event_pool(self: &Arc<Self>) -> Arc<EventPool> {
        let mut shared = SHARED.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(pool) = shared
            .iter()
            .find(|(id, _)| *id == self.id())
            .and_then(|(_, weak)| weak.upgrade())
        {
            return pool;
        }
        // A missing or dead entry: make the pool, and drop the entries of
        // pools nobody holds any more (this context's old one among them).
        shared.retain(|(_, weak)| weak.strong_count() > 0);
        let pool = Arc::new(EventPool::empty(self));
        shared.push((self.id(), Arc::downgrade(&pool)));
        pool
    }
}
