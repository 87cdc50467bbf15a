//! Futures: awaiting streams, events and copies, woken by the context's
//! [`Reactor`](crate::Reactor).
//!
//! They depend on `std::task` only, so any executor polls them (tokio,
//! async-std, smol, `futures::executor::block_on`, a hand-written one).

use crate::enqueue::protocol::{Use, Work};
use crate::features::reactor::{Target, Ticket};
use crate::ground::error::{Error, Result};
use crate::objects::completion_trail::CompletionTrail;
use crate::objects::context::Context;
use crate::objects::event::Event;
use crate::objects::memory::{DeviceCopy, DeviceMemory, DeviceMemoryMut, HostMemory};
use crate::objects::metrics::Counters;
use crate::objects::stream::Stream;
use std::fmt;
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use sys::CUresult;

/// A future that resolves when the GPU has passed a point in a stream: `Ok`
/// once the work before it completed, `Err` with the stream's error when it
/// failed.
///
/// From [`Stream::completion`], [`Event::wait_async`] or `.await` on an
/// `&Event`. Dropping it cancels the wait (the work itself still runs) and
/// frees its slot in the reactor once the GPU has passed the point.
///
/// ```
/// use cuda_streams_driver::{Context, DeviceBuffer, PinnedBuffer, Stream};
/// # fn block_on<F: std::future::Future>(f: F) -> F::Output {
/// #     use std::task::{Context, Poll, Wake, Waker};
/// #     struct Unpark(std::thread::Thread);
/// #     impl Wake for Unpark { fn wake(self: std::sync::Arc<Self>) { self.0.unpark() } }
/// #     let waker = Waker::from(std::sync::Arc::new(Unpark(std::thread::current())));
/// #     let mut f = std::pin::pin!(f);
/// #     loop {
/// #         if let Poll::Ready(v) = f.as_mut().poll(&mut Context::from_waker(&waker)) { return v; }
/// #         std::thread::park();
/// #     }
/// # }
/// # fn main() -> cuda_streams_driver::Result<()> {
/// let ctx = Context::new(0)?;
/// let stream = Stream::new(&ctx)?;
/// let mut device = DeviceBuffer::<u32>::new_async(&stream, 256)?;
/// stream.memset_u32_async(&mut device, 9)?;
/// let mut host = PinnedBuffer::<u32>::new(&ctx, 256)?;
/// block_on(async {
///     let host = stream.copy_to_host_future(&mut host, &device)?.await?;
///     assert!(host.as_slice()?.iter().all(|&v| v == 9));
///     stream.completion()?.await
/// })?;
/// # Ok(())
/// # }
/// ```
#[must_use = "a future does nothing unless awaited; dropping it cancels the wait"]
pub struct Completion {
    state: State,
    /// For a stream's completion: the stream's callbacks enqueued before its
    /// point, whose panics it reports (see [`Stream::add_callback`]).
    callbacks: Option<Callbacks>,
    /// What the host learns when it resolves (the stream-order tracker).
    point: Option<crate::enqueue::order::VectorClock>,
}

/// The callbacks a [`Completion`] answers for.
struct Callbacks {
    counters: Arc<Counters>,
    stream: u64,
    through: u64,
}

enum State {
    Waiting {
        ctx: Arc<Context>,
        ticket: Ticket,
    },
    /// Failed before waiting (from `IntoFuture`, which cannot return an error).
    Failed(Option<Error>),
    Finished,
}

impl Completion {
    fn register(
        ctx: &Arc<Context>,
        target: Target,
        callbacks: Option<Callbacks>,
        point: Option<crate::enqueue::order::VectorClock>,
    ) -> Result<Self> {
        ctx.bind()?;
        let ticket = ctx.reactor().register(ctx, target)?;
        Ok(Self {
            state: State::Waiting {
                ctx: Arc::clone(ctx),
                ticket,
            },
            callbacks,
            point,
        })
    }

    /// Whether the future has already produced its output.
    pub fn is_finished(&self) -> bool {
        matches!(self.state, State::Finished)
    }

    /// Block the calling thread until the future resolves: the thread parks
    /// until the reactor wakes it (no polling loop, no sleep).
    ///
    /// ```
    /// use cuda_streams_driver::{Context, Event, Stream};
    /// let ctx = Context::new(0).unwrap();
    /// let stream = Stream::new(&ctx).unwrap();
    /// let before = Event::plain(&ctx).unwrap();
    /// before.record(&stream).unwrap();
    /// stream.completion().unwrap().wait().unwrap();
    /// // What was enqueued before the completion has run. (The stream itself
    /// // may still be finishing the host function that woke the reactor.)
    /// assert!(before.query().unwrap());
    /// ```
    pub fn wait(self) -> Result<()> {
        let mut this = self;
        match Self::wait_any(std::slice::from_mut(&mut this), None) {
            Ok(Some(_)) => Ok(()),
            Ok(None) => unreachable!("no timeout was given"),
            Err((_, err)) => Err(err),
        }
    }

    /// Block until the first of `waits` resolves, or `timeout` passes
    /// (`None`: as long as it takes). Returns the index of a resolved one,
    /// `Ok(None)` on timeout (at once for no waits), or the index and error
    /// of one that failed. The thread parks between the reactor's wake-ups. The others stay
    /// pending; dropping them cancels their waits.
    ///
    /// ```
    /// use cuda_streams_driver::{Completion, Context, Stream};
    /// use std::time::Duration;
    /// let ctx = Context::new(0).unwrap();
    /// let (a, b) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    /// let mut waits = [a.completion().unwrap(), b.completion().unwrap()];
    /// let first = Completion::wait_any(&mut waits, Some(Duration::from_secs(60))).unwrap();
    /// assert!(matches!(first, Some(0 | 1)));
    /// assert!(matches!(Completion::wait_any(&mut [], None), Ok(None))); // nothing to wait for
    /// ```
    pub fn wait_any(
        waits: &mut [Completion],
        timeout: Option<std::time::Duration>,
    ) -> std::result::Result<Option<usize>, (usize, Error)> {
        use std::task::{Wake, Waker};
        struct Unpark(std::thread::Thread);
        impl Wake for Unpark {
            fn wake(self: Arc<Self>) {
                self.0.unpark();
            }
            fn wake_by_ref(self: &Arc<Self>) {
                self.0.unpark();
            }
        }
        if waits.is_empty() {
            return Ok(None);
        }
        let deadline = timeout.map(|t| std::time::Instant::now() + t);
        let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
        let mut cx = TaskContext::from_waker(&waker);
        loop {
            for (i, wait) in waits.iter_mut().enumerate() {
                if wait.is_finished() {
                    return Ok(Some(i));
                }
                if let Poll::Ready(outcome) = Pin::new(&mut *wait).poll(&mut cx) {
                    return outcome.map(|()| Some(i)).map_err(|err| (i, err));
                }
            }
            match deadline {
                None => std::thread::park(),
                Some(deadline) => {
                    let left = deadline.saturating_duration_since(std::time::Instant::now());
                    if left.is_zero() {
                        return Ok(None);
                    }
                    std::thread::park_timeout(left);
                }
            }
        }
    }
}

impl Future for Completion {
    type Output = Result<()>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Result<()>> {
        let outcome = match &mut self.state {
            State::Waiting { ctx, ticket } => match ctx.reactor().poll(ticket, cx.waker()) {
                None => return Poll::Pending,
                // The GPU's error first; a panic not reported by it stays
                // for the next check.
                Some(CUresult::CUDA_SUCCESS) => {
                    crate::enqueue::order::completed(self.point.take());
                    match &self.callbacks {
                        Some(c) => c.counters.report_panics(c.stream, c.through),
                        None => Ok(()),
                    }
                }
                Some(code) => ctx.check(code),
            },
            State::Failed(err) => Err(err.take().unwrap_or(Error::ReactorThread(
                "the future was polled after it failed".into(),
            ))),
            State::Finished => panic!("`Completion` polled after it returned `Ready`"),
        };
        self.state = State::Finished;
        Poll::Ready(outcome)
    }
}

impl Drop for Completion {
    fn drop(&mut self) {
        if let State::Waiting { ctx, ticket } = &self.state {
            ctx.reactor().cancel(ticket);
        }
    }
}

impl fmt::Debug for Completion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Waiting { ticket, .. } => format!("waiting on slot {}", ticket.slot),
            State::Failed(_) => "failed".into(),
            State::Finished => "finished".into(),
        };
        f.debug_struct("Completion").field("state", &state).finish()
    }
}

/// A future that resolves to a host buffer once the asynchronous copy that
/// uses it has completed; it holds the borrow until then.
///
/// From [`Stream::copy_to_host_future`] (`R = &mut H`) and
/// [`Stream::copy_from_host_future`] (`R = &H`). The borrow is the convenient
/// half of the guarantee: a future can be leaked (`mem::forget`), which ends
/// the borrow early, so soundness rests on the buffer's own tracking instead
/// (host access and `Drop` wait for the copy).
#[must_use = "a future does nothing unless awaited; dropping it cancels the wait, not the copy"]
pub struct CopyFuture<R> {
    completion: Completion,
    buffer: Option<R>,
}

impl<R: Unpin> Future for CopyFuture<R> {
    type Output = Result<R>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Result<R>> {
        let this = &mut *self;
        match Pin::new(&mut this.completion).poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(outcome) => Poll::Ready(outcome.map(|()| {
                this.buffer
                    .take()
                    .expect("`CopyFuture` polled after it returned `Ready`")
            })),
        }
    }
}

impl<R> fmt::Debug for CopyFuture<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CopyFuture")
            .field("completion", &self.completion)
            .finish()
    }
}

impl Stream {
    /// A future that resolves once everything enqueued on this stream so far
    /// has completed (later work is not waited for). It resolves to
    /// [`Error::CallbackPanicked`] when a callback enqueued before it panicked
    /// and was not reported yet (see [`Stream::add_callback`]).
    ///
    /// Enqueues one flag write (`cuStreamWriteValue32`) and one event record;
    /// the context's reactor wakes the future.
    pub fn completion(&self) -> Result<Completion> {
        // The flag write and the event record go on this stream as the
        // protocol's raw work: refused while it captures, since a captured
        // wake-up would free its payload at every replay.
        let pending = self.prepare_enqueue(
            std::iter::empty::<Use<'_>>(),
            Work::Raw("Stream::completion"),
        )?;
        let completion = self.register_completion()?;
        pending.enqueued()?;
        Ok(completion)
    }

    /// The flag write and event record of [`Stream::completion`], inside an
    /// enqueue that holds the stream's gate and has bound its context.
    fn register_completion(&self) -> Result<Completion> {
        let callbacks = Callbacks {
            counters: Arc::clone(&self.counters),
            stream: self.id(),
            through: self.counters.last_callback_seq(),
        };
        Completion::register(
            self.context(),
            Target::Stream(self.as_raw()),
            Some(callbacks),
            crate::enqueue::order::stream_point(self),
        )
    }

    /// [`Stream::copy_to_host_async`], then a future that resolves to `dst`
    /// once the copy (and everything before it on this stream) completed.
    pub fn copy_to_host_future<'a, T, H, D>(
        &self,
        dst: &'a mut H,
        src: &D,
    ) -> Result<CopyFuture<&'a mut H>>
    where
        T: DeviceCopy,
        H: HostMemory<T> + ?Sized,
        D: DeviceMemory<Elem = T>,
    {
        // Named as this call while the stream captures (a snapshot; the
        // enqueue's gate is what holds captures off).
        self.refuse_if_capturing("Stream::copy_to_host_future")?;
        // One enqueue for both, so the completion watches this very copy
        // and no capture can begin between them.
        let completion = self.copy_to_host_async_then(dst, src, || self.register_completion())?;
        Ok(CopyFuture {
            completion,
            buffer: Some(dst),
        })
    }

    /// [`Stream::copy_from_host_async`], then a future that resolves to `src`
    /// once the copy completed (after which writing `src` does not wait).
    pub fn copy_from_host_future<'a, T, D, H>(
        &self,
        dst: &mut D,
        src: &'a H,
    ) -> Result<CopyFuture<&'a H>>
    where
        T: DeviceCopy,
        D: DeviceMemoryMut<Elem = T>,
        H: HostMemory<T> + ?Sized,
    {
        self.refuse_if_capturing("Stream::copy_from_host_future")?;
        let completion = self.copy_from_host_async_then(dst, src, || self.register_completion())?;
        Ok(CopyFuture {
            completion,
            buffer: Some(src),
        })
    }
}

impl<T> CompletionTrail<T> {
    /// Block until the GPU has passed entry `index` (0 is the oldest), and
    /// so every entry before it, through the context's reactor
    /// ([`Event::wait_async`], [`Completion::wait`]). An index past the
    /// newest waits for the newest; an empty trail returns at once.
    pub fn wait_for<'a>(
        &'a self,
        index: usize,
        event_of: impl Fn(&'a T) -> Option<&'a Event>,
    ) -> Result<()> {
        match self.event_to_wait_for(index, event_of) {
            Some(event) => Completion::wait(event.wait_async()?),
            None => Ok(()),
        }
    }
}

impl Event {
    /// A future that resolves once the event completes (at once for an event
    /// never recorded, as in CUDA).
    ///
    /// The event's stream is not known, so one of the reactor's watch streams
    /// waits for the event (`cuStreamWaitEvent`) and writes the flag. The
    /// future does not borrow the event: once this returns, the wait holds
    /// even if the event is re-recorded or dropped.
    pub fn wait_async(&self) -> Result<Completion> {
        self.refuse_if_captured("Event::wait_async")?;
        // Not the panics of callbacks: see `Stream::add_callback`.
        Completion::register(
            self.context(),
            Target::Event(self.as_raw()),
            None,
            crate::enqueue::order::event_point(self),
        )
    }
}

impl IntoFuture for &Event {
    type Output = Result<()>;
    type IntoFuture = Completion;

    /// `event.await`: [`Event::wait_async`], with a failure to start the wait
    /// reported when the future is polled.
    fn into_future(self) -> Completion {
        self.wait_async().unwrap_or_else(|err| Completion {
            state: State::Failed(Some(err)),
            callbacks: None,
            point: None,
        })
    }
}
