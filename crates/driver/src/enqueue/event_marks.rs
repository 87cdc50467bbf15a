//! Where events meet streams: recording an event on a stream and making a
//! stream wait for one, each through the enqueue protocol as its mark kinds
//! (`Work::Record`, `Work::Wait`: they pass captures, where they are edges
//! of the graph). Around the protocol call: the record count that tells
//! whether a record is still the event's latest (`latest_mark.rs` relies on
//! it), the capture the record was made in, the capture isolation of a
//! wait, and what the stream-order tracker learns from each.

use crate::enqueue::protocol::Work;
use crate::ground::error::{Error, Result};
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
        // Before the driver call: what another thread queues meanwhile is
        // not covered by the record.
        let point = crate::enqueue::order::record_point(stream);
        let record = |driver: &sys::Driver, raw| {
            if !exclusive {
                self.records.fetch_add(1, Ordering::SeqCst);
            }
            // SAFETY: both handles are live (owned by `self` and `stream`);
            // the context is current (bound by the protocol).
            let code = unsafe { (driver.cuEventRecord)(self.raw, raw) };
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
            code
        };
        let learn = || {
            self.recorded.store(true, Ordering::Relaxed);
            self.captured_in
                .store(stream.capture_id(), Ordering::Release);
            let from_kept = crate::enqueue::order::recorded(self, point.as_ref(), exclusive);
            Ok(match point {
                Some(crate::enqueue::order::Point::Kept(kept)) if from_kept => Some(kept),
                _ => None,
            })
        };
        stream.enqueue_mark(Work::Record, record, learn)
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

impl Stream {
    /// Make work enqueued after this call wait until `event` completes (the host
    /// does not wait). An event never recorded completes at once. The event
    /// may belong to another device: the GPU orders across devices.
    ///
    /// During a stream capture ([`crate::Capture`]) the stream and the event
    /// must be on the same side of it: a capturing stream cannot wait on an
    /// event recorded outside its capture, and a stream outside a capture
    /// cannot wait on an event recorded in one (on a GPU the first invalidates
    /// the capture and the second pulls the stream into it; use
    /// [`crate::Capture::fork`]). Both are refused with
    /// [`Error::CaptureIsolation`].
    ///
    /// ```
    /// use cuda_streams_driver::{Context, Stream};
    /// # fn main() -> cuda_streams_driver::Result<()> {
    /// let last = Context::device_count()? - 1; // another device when there are two
    /// let (a, b) = (Stream::new(&Context::new(0)?)?, Stream::new(&Context::new(last)?)?);
    /// let done_on_a = a.record_event()?;
    /// b.wait_event(&done_on_a)?; // b's later work runs after a's work so far
    /// b.synchronize()?;
    /// assert!(done_on_a.query()?);
    /// # Ok(())
    /// # }
    /// ```
    pub fn wait_event(&self, event: &Event) -> Result<()> {
        self.wait_event_unlearned(event)?;
        crate::enqueue::order::waited(self, event);
        Ok(())
    }

    /// [`Stream::wait_event`] without telling the order tracker: for the
    /// tracker's own waits, which learn the event's record under the lock
    /// they take next anyway.
    #[inline]
    pub(crate) fn wait_event_unlearned(&self, event: &Event) -> Result<()> {
        self.check_driver("the event", event.context())?;
        let (mine, its) = (self.capture_id(), event.captured_in());
        if mine != its {
            return Err(self.capture_isolation(mine, its));
        }
        // The latest mark ends even when the call fails: a mark kept before
        // is not reused.
        let raw_event = event.as_raw();
        let wait = |driver: &sys::Driver, raw| {
            // SAFETY: both handles are live; flags 0 is CU_EVENT_WAIT_DEFAULT;
            // the context is current (bound by the protocol).
            unsafe { (driver.cuStreamWaitEvent)(raw, raw_event, 0) }
        };
        self.enqueue_mark(Work::Wait, wait, || Ok(()))
    }

    /// Make this stream wait for `home`'s work so far, as one protocol
    /// call: `record` records an event on `home` (and hands it back) while
    /// `home` is held out of captures, and this stream waits for it before
    /// `home` may begin one. Refused with
    /// [`Error::StreamCapturing`], naming `operation`, while `home`
    /// captures: recorded in a capture, the mark would be no point in
    /// time. Nothing is recorded or waited for then.
    ///
    /// What `record` returns is handed back once waited for, so a caller
    /// may keep the event (or hand back a reference to where it keeps it)
    /// for later waits, which need no record.
    ///
    /// `record` runs while `home` is held out of captures, as under
    /// [`Stream::enqueue_gate`]: beginning a capture on `home` inside it
    /// waits forever, as locking a held `Mutex` does.
    ///
    /// ```
    /// use cuda_streams_driver::{Context, Stream};
    /// # fn main() -> cuda_streams_driver::Result<()> {
    /// let ctx = Context::new(0)?;
    /// let (home, other) = (Stream::new(&ctx)?, Stream::new(&ctx)?);
    /// let ready = other.wait_for_home(&home, "a first use on other", |home| home.mark())?;
    /// other.synchronize()?;
    /// assert!(ready.query()?);
    /// let capture = home.begin_capture()?;
    /// let err = other.wait_for_home(&home, "a first use on other", |home| home.mark()).unwrap_err();
    /// assert!(err.to_string().contains("a first use on other"), "{err}");
    /// drop(capture);
    /// # Ok(())
    /// # }
    /// ```
    pub fn wait_for_home<E: std::ops::Deref<Target = Event>>(
        &self,
        home: &Stream,
        operation: &'static str,
        record: impl FnOnce(&Stream) -> Result<E>,
    ) -> Result<E> {
        let _home_gate = home.enqueue_gate(operation)?;
        let event = record(home)?;
        self.wait_event(&event)?;
        Ok(event)
    }

    /// Why this stream (in capture `mine`, 0: none) cannot wait for an
    /// event recorded in capture `its` (0: none). Out of line: the wait's
    /// path is the protocol's call, inlined.
    #[cold]
    fn capture_isolation(&self, mine: u64, its: u64) -> Error {
        let id = self.id();
        Error::CaptureIsolation {
            reason: match (mine, its) {
                (0, its) => format!(
                    "stream {id} is not capturing and cannot wait on an event recorded in capture {its}; bring it into the capture with Capture::fork"
                ),
                (mine, 0) => format!(
                    "stream {id} is capturing (capture {mine}) and cannot wait on an event recorded outside the capture"
                ),
                (mine, its) => format!(
                    "stream {id} takes part in capture {mine} and cannot wait on an event recorded in capture {its}"
                ),
            },
        }
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
