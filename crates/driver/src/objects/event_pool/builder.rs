//! Named settings for an [`EventPool`], beside the positional
//! [`EventPool::new`]`(&ctx, regular, timing)` of the seed.

use super::EventPool;
use crate::ground::error::Result;
use crate::objects::context::Context;
use std::sync::Arc;

/// Settings for an [`EventPool`], from [`EventPool::builder`]: how many plain
/// and timing events to create up front, and an optional cap on each kind.
/// Unset counts are 0 (events are then created on first use).
///
/// ```
/// use cuda_streams_driver::{Context, EventPool};
/// # fn main() -> cuda_streams_driver::Result<()> {
/// let ctx = Context::new(0)?;
/// let pool = EventPool::builder(&ctx).plain(8).timing(2).build()?;
/// let utilization = pool.utilization();
/// assert_eq!((utilization.available_regular, utilization.available_timing), (8, 2));
/// // The seed's positional form makes the same pool.
/// let seed = EventPool::new(&ctx, 8, 2)?;
/// assert_eq!(seed.utilization().available_regular, 8);
///
/// // A cap: growing past it is an error that names the cap.
/// let capped = EventPool::builder(&ctx).plain(1).capacity_limit(1).build()?;
/// let first = capped.acquire_event(false)?;
/// assert!(capped.acquire_event(false).is_err());
/// # drop(first);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
#[must_use = "an event pool builder does nothing until `build`"]
pub struct EventPoolBuilder {
    ctx: Arc<Context>,
    plain: usize,
    timing: usize,
    cap: usize,
}

impl EventPool {
    /// Settings for a pool on `ctx`, named rather than positional.
    pub fn builder(ctx: &Arc<Context>) -> EventPoolBuilder {
        EventPoolBuilder {
            ctx: Arc::clone(ctx),
            plain: 0,
            timing: 0,
            cap: usize::MAX,
        }
    }
}

impl EventPoolBuilder {
    /// Plain events (ordering only, cheapest to record) created up front.
    pub fn plain(mut self, count: usize) -> Self {
        self.plain = count;
        self
    }

    /// Timing events (for elapsed times) created up front.
    pub fn timing(mut self, count: usize) -> Self {
        self.timing = count;
        self
    }

    /// At most `cap` events of each kind in existence
    /// ([`EventPool::with_capacity_limit`]); without it the pool grows
    /// without a cap.
    pub fn capacity_limit(mut self, cap: usize) -> Self {
        self.cap = cap;
        self
    }

    /// Create the pool, shared (acquiring an event needs an `Arc`).
    pub fn build(self) -> Result<Arc<EventPool>> {
        EventPool::with_capacity_limit(&self.ctx, self.plain, self.timing, self.cap).map(Arc::new)
    }
}
