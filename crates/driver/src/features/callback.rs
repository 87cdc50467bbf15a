//! Host callbacks: a Rust closure run when the stream reaches it (`cuLaunchHostFunc`).

use crate::enqueue::protocol::Work;
use crate::ground::callback_thread::HostFnGuard;
use crate::ground::error::Result;
use crate::objects::metrics::Counters;
use crate::objects::stream::Stream;
use std::any::Any;
use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use sys::CUresult;

/// What the trampoline receives: the closure and where to count a panic.
struct Payload {
    f: Box<dyn FnOnce() + Send + 'static>,
    counters: Arc<Counters>,
    stream_id: u64,
    /// Its number among the stream's callbacks (see `report_callback_panics`).
    seq: u64,
}

impl Stream {
    /// Run `f` on a driver thread when the stream reaches this point: after the
    /// work enqueued before it and before the work enqueued after it (not at
    /// `synchronize`).
    ///
    /// `f` must be quick and must not call the driver: CUDA forbids driver
    /// calls in a stream callback, so this crate's methods return
    /// [`crate::Error::InsideCallback`] there, and handles dropped inside `f`
    /// leak their driver object (with a log line) instead of deadlocking. Send
    /// results out through a channel or an atomic.
    ///
    /// A panic in `f` is caught (it cannot unwind into the driver), counted
    /// ([`crate::StreamMetrics::callback_panics`]) and reported once, as
    /// [`crate::Error::CallbackPanicked`] naming the stream and the panic's
    /// message, by whichever comes first: the stream's next
    /// [`Stream::synchronize`], a [`Stream::completion`] (or copy future) of
    /// the stream whose point comes after the callback, or
    /// [`Stream::check_callback_panics`]. The stream stays usable: once
    /// reported, the next synchronize is `Ok` again. [`crate::Event`]s do not
    /// report it: an event is a point any stream may wait for, and the panic
    /// belongs to the stream that ran the callback, so `Event::synchronize`
    /// and `Event::query` answer for the GPU work only.
    ///
    /// ```
    /// use cuda_streams_driver::{Context, Stream};
    /// use std::sync::mpsc;
    /// let ctx = Context::new(0).unwrap();
    /// let stream = Stream::new(&ctx).unwrap();
    /// let (tx, rx) = mpsc::channel();
    /// stream.add_callback(move || tx.send("reached").unwrap()).unwrap();
    /// // The callback fires without anyone synchronizing.
    /// assert_eq!(rx.recv().unwrap(), "reached");
    /// assert_eq!(stream.metrics().callbacks, 1);
    /// ```
    pub fn add_callback<F>(&self, f: F) -> Result<()>
    where
        F: FnOnce() + Send + 'static,
    {
        // A captured callback would run on every replay, but this payload
        // is freed by its first run: captures take `Capture::add_callback`.
        // The protocol's gate keeps a capture from beginning before the
        // driver call: the trampoline frees the payload when it runs, so it
        // must run once.
        self.enqueue_tracked(std::iter::empty(), Work::Callback, |driver, stream| {
            let payload = Box::into_raw(Box::new(Payload {
                f: Box::new(f),
                counters: Arc::clone(&self.counters),
                stream_id: self.id(),
                seq: self.counters.next_callback_seq(),
            }));
            // SAFETY: the stream is live; `trampoline` matches CUhostFn and
            // takes ownership of `payload` when (and only when) the driver
            // runs it.
            let code =
                unsafe { (driver.cuLaunchHostFunc)(stream, Some(trampoline), payload.cast()) };
            if code != CUresult::CUDA_SUCCESS {
                // SAFETY: the driver refused the callback, so it will never
                // run and the payload is still ours, from Box::into_raw above.
                drop(unsafe { Box::from_raw(payload) });
            }
            code
        })
    }
}

/// The `CUhostFn` every callback goes through. Never unwinds into the driver.
unsafe extern "C" fn trampoline(user_data: *mut c_void) {
    // SAFETY: `user_data` is the `Payload` leaked by `add_callback`, handed to
    // this function exactly once by the driver.
    let payload = unsafe { Box::from_raw(user_data.cast::<Payload>()) };
    // Reporting can panic too (a closed stderr); nothing may escape into C.
    let _ = catch_unwind(AssertUnwindSafe(move || run(*payload)));
}

fn run(payload: Payload) {
    let _guard = HostFnGuard::enter();
    let Payload {
        f,
        counters,
        stream_id,
        seq,
    } = payload;
    // The closure's captures drop inside the call, so their panics are caught too.
    if let Err(panic) = catch_unwind(AssertUnwindSafe(f)) {
        let message = panic_message(&*panic);
        // Dropping a panic payload can itself panic.
        let _ = catch_unwind(AssertUnwindSafe(move || drop(panic)));
        counters.callback_panicked_at(stream_id, seq, message);
    }
}

/// The text of a caught panic's payload (`panic!` with a string or a format),
/// for reports and errors; a payload of another type is named as such.
///
/// ```
/// let caught = std::panic::catch_unwind(|| panic!("at step {}", 3)).unwrap_err();
/// assert_eq!(cuda_streams_driver::panic_message(&*caught), "at step 3");
/// ```
pub fn panic_message(panic: &(dyn Any + Send)) -> String {
    if let Some(text) = panic.downcast_ref::<&str>() {
        (*text).to_string()
    } else if let Some(text) = panic.downcast_ref::<String>() {
        text.clone()
    } else {
        "a panic with a non-string payload".to_string()
    }
}
