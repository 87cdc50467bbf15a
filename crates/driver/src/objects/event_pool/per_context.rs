//! Each context's shared event pool ([`Context::event_pool`]): the pool
//! stands on the context (its events hold it), so the context keeps only a
//! weak, untyped slot for it, filled here.

use super::EventPool;
use crate::objects::context::Context;
use std::any::Any;
use std::sync::Arc;

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
        let mut slot = self.shared_events.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(pool) = slot
            .upgrade()
            .and_then(|any| any.downcast::<EventPool>().ok())
        {
            return pool;
        }
        let pool = Arc::new(EventPool::empty(self));
        let shared: Arc<dyn Any + Send + Sync> = pool.clone();
        *slot = Arc::downgrade(&shared);
        pool
    }
}
