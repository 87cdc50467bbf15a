//! The host's clock: what any thread has seen complete (a stream or an
//! event synchronized, a query that answered "done", a future that
//! resolved), which each stream takes in at its next enqueue.

use super::clock::{Vc, VectorClock};
use super::stats::counted;
use super::stream_state::StreamState;
use crate::objects::event::Event;
use crate::objects::stream::Stream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

impl StreamState {
    /// Take in what the host has seen complete since the last enqueue.
    #[inline]
    pub(super) fn learn_host(&mut self) {
        let version = HOST_VERSION.load(Ordering::Acquire);
        if version != self.host_seen {
            self.learn_host_now(version);
        }
    }

    #[cold]
    #[inline(never)]
    fn learn_host_now(&mut self, version: u64) {
        counted();
        self.host = Arc::clone(&HOST.lock().unwrap_or_else(|p| p.into_inner()));
        self.host_seen = version;
    }
}

/// What every thread has seen complete.
/// Copied on write: streams hold the version they last saw.
static HOST: std::sync::LazyLock<Mutex<Arc<Vc>>> = std::sync::LazyLock::new(Mutex::default);
/// Bumped whenever `HOST` learns something.
static HOST_VERSION: AtomicU64 = AtomicU64::new(0);

fn host_learns(clock: &VectorClock) {
    counted();
    let mut host = HOST.lock().unwrap_or_else(|p| p.into_inner());
    if !host.covers(clock) {
        Arc::make_mut(&mut host).learn(clock);
        HOST_VERSION.fetch_add(1, Ordering::Release);
    }
}

/// The host is about to wait for (or query) everything enqueued on
/// `stream` so far: what it would learn, taken before the wait.
#[inline]
pub(crate) fn stream_point(stream: &Stream) -> Option<VectorClock> {
    stream
        .context()
        .order
        .is_on()
        .then(|| stream.order.snapshot())
}

/// The host is about to wait for `event`: what it would learn.
#[inline]
pub(crate) fn event_point(event: &Event) -> Option<VectorClock> {
    if event.context().order.is_on() {
        // A captured record teaches the host nothing about eager work.
        event
            .order
            .get()
            .and_then(|(clock, captured)| (!captured).then_some(clock))
    } else {
        None
    }
}

/// The host saw `point` complete.
#[inline]
pub(crate) fn completed(point: Option<VectorClock>) {
    if let Some(point) = point {
        host_learns(&point);
    }
}

#[cfg(test)]
mod tests {
    use super::super::policy::OrderPolicy;
    use super::super::tests::{buffer, streams, under};
    use crate::ground::error::Error;

    /// The host's knowledge orders what it saw complete, and nothing after
    /// it: a write enqueued after the host's wait is still unordered.
    #[test]
    fn the_host_orders_only_what_it_saw_complete() {
        let (ctx, _policy) = under(OrderPolicy::Check);
        let [a, b] = streams(&ctx);
        let mut data = buffer(&ctx);
        a.memset_u32_async(&mut data, 1).unwrap();
        a.synchronize().unwrap();
        // The step right after the one the host saw complete.
        a.memset_u32_async(&mut data, 3).unwrap();
        // Not seen complete by the host, not waited for by b.
        let refused = b.memset_u32_async(&mut data, 4);
        assert!(
            matches!(refused, Err(Error::UnorderedAccess(_))),
            "{refused:?}"
        );
        a.synchronize().unwrap();
        // b never waited for a; the host did.
        b.memset_u32_async(&mut data, 5).unwrap();
        assert_eq!(data.to_vec(&b).unwrap(), [5; 64]);
    }
}
