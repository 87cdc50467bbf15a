//! Recording an event on a stream: the record count that tells whether a
//! record is still the event's latest (`latest_mark.rs` relies on it), the
//! capture the record was made in, and the stream-order tracker's point.
//! Apart from the event itself, since it is where events meet streams.

use crate::ground::error::Result;
use crate::objects::event::Event;
use crate::objects::stream::Stream;
use std::sync::atomic::Ordering;

impl Event {
    /// Mark the current end of `stream`; the event completes when the stream
    /// gets there. May be called again to move the mark.
    pub fn record(&self, stream: &Stream) -> Result<()> {
        self.record_counted(stream, false)
    }

    /// [`Event::record`], counting it in the record count, which is even
    /// while no record is in progress (`latest_mark.rs` reuses a mark only
    /// while the count is what it was right after the mark's record). A
    /// record bumps the count before its driver call and again after it, so
    /// a fork that checks a mark while its event is being recorded again
    /// elsewhere sees the count moved and records its own. `exclusive`: the
    /// caller holds the event's only handle ([`UniqueEvent`](crate::UniqueEvent)),
    /// so no record can overlap this one and one bump of two after the call
    /// keeps the count even.
    pub(crate) fn record_counted(&self, stream: &Stream, exclusive: bool) -> Result<()> {
        self.record_at(stream, exclusive).map(drop)
    }

    /// [`Event::record_counted`], handing back the point this thread kept
    /// of the stream when the tracker wrote the record from it: for a
    /// caller holding the event's only handle, what a wait for this record
    /// learns, readable where it is kept (`order::kept::learn_kept`).
    #[inline]
    pub(crate) fn record_at(
        &self,
        stream: &Stream,
        exclusive: bool,
    ) -> Result<Option<crate::enqueue::order::KeptPoint>> {
        stream.check_context("the event", &self.ctx)?;
        self.ctx.bind()?;
        // Before the driver call: what another thread queues meanwhile is
        // not covered by the record.
        let point = crate::enqueue::order::record_point(stream);
        if !exclusive {
            self.records.fetch_add(1, Ordering::SeqCst);
        }
        // SAFETY: both handles are live (owned by `self` and `stream`); the context is current.
        let code = unsafe { (self.ctx.driver().cuEventRecord)(self.raw, stream.as_raw()) };
        // Counted even when the call failed: the count stays even, and a
        // mark kept before is given up (the event's state is unknown).
        if exclusive {
            // No other thread can reach the event: a load and a store, no
            // atomic read-modify-write (it becomes shared through an `Arc`
            // or a lock, which publish the store).
            let count = self.records.load(Ordering::Relaxed);
            self.records.store(count + 2, Ordering::Release);
        } else {
            self.records.fetch_add(1, Ordering::SeqCst);
        }
        self.ctx.check(code)?;
        self.recorded.store(true, Ordering::Relaxed);
        self.captured_in
            .store(stream.capture_id(), Ordering::Release);
        let from_kept = crate::enqueue::order::recorded(self, point.as_ref(), exclusive);
        Ok(match point {
            Some(crate::enqueue::order::Point::Kept(kept)) if from_kept => Some(kept),
            _ => None,
        })
    }

    /// Record on `stream`, and say whether no other record of this event
    /// overlapped this one: `Some(count)` when so, `count` being
    /// [`Event::record_count`] right after it. Any later record changes the
    /// count (before its driver call), so while it is unchanged this record
    /// is the event's latest.
    pub(crate) fn record_alone(&self, stream: &Stream) -> Result<Option<u64>> {
        let before = self.records.load(Ordering::SeqCst);
        self.record(stream)?;
        let after = self.records.load(Ordering::SeqCst);
        // Alone: no record was in progress when ours began (an odd count),
        // and none began since (ours are the two bumps).
        Ok((before.is_multiple_of(2) && after == before + 2).then_some(after))
    }
}

#[cfg(all(test, any(feature = "cudarc", feature = "cust")))]
mod tests {
    use crate::objects::context::Context;
    use crate::objects::event::Event;
    use crate::objects::stream::Stream;

    /// A raw record (interop's) counts as a record: what a host wait saw
    /// before no longer stands, and the count stays even.
    #[test]
    fn a_raw_record_is_counted_and_unsees_the_wait_before_it() {
        let ctx = Context::new(0).unwrap();
        let stream = Stream::new(&ctx).unwrap();
        let event = Event::plain(&ctx).unwrap();
        event.record(&stream).unwrap();
        event.synchronize().unwrap();
        assert!(event.is_known_complete());
        let before = event.record_count();
        event.count_raw_record();
        assert_eq!(event.record_count(), before + 2);
        assert!(!event.is_known_complete(), "a wait before a newer record");
    }
}
