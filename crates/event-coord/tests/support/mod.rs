//! Helpers shared by the event-coord tests: the generic ones from
//! `test_support`, and what only these tests need.
#![allow(
    dead_code,
    unused_imports,
    reason = "each test file uses a different subset"
)]

use cuda_streams_event_coord::EventPool;
use driver::{Context, Stream};
use std::sync::Arc;

pub(crate) use test_support::{Gate, HANG, XorShift, ctx, kernel, spin};

/// A pool on `ctx` with a few events of each kind.
pub(crate) fn pool(ctx: &Arc<Context>) -> Arc<EventPool> {
    Arc::new(EventPool::new(ctx, 8, 2).expect("an event pool"))
}

/// `n` fresh streams.
pub(crate) fn streams(ctx: &Arc<Context>, n: usize) -> Vec<Arc<Stream>> {
    (0..n)
        .map(|_| Stream::new(ctx).expect("a stream"))
        .collect()
}
