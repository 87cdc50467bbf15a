//! Whether the calling thread is running a stream callback, where CUDA
//! forbids driver calls: a thread flag that every layer may ask, kept apart
//! from the context so that the files a context stands on can ask it too.

use crate::ground::error::{Error, Result};
use std::cell::Cell;

thread_local! {
    /// Set while a stream callback runs on this thread.
    static IN_HOST_FN: Cell<bool> = const { Cell::new(false) };
}

/// Whether the calling thread is running a stream callback (a closure given to
/// [`crate::Stream::add_callback`]), where CUDA forbids driver calls.
///
/// Code that may run in a callback and would otherwise make a driver call
/// later on this thread (a cache whose entries are destroyed at thread exit,
/// say) checks it first.
///
/// ```
/// use cuda_streams_driver::{Context, Stream, in_stream_callback};
/// use std::sync::mpsc;
/// assert!(!in_stream_callback());
/// let ctx = Context::new(0).unwrap();
/// let stream = Stream::new(&ctx).unwrap();
/// let (tx, rx) = mpsc::channel();
/// stream.add_callback(move || tx.send(in_stream_callback()).unwrap()).unwrap();
/// assert!(rx.recv().unwrap());
/// ```
#[inline]
pub fn in_stream_callback() -> bool {
    IN_HOST_FN.with(Cell::get)
}

/// [`Error::InsideCallback`] inside a stream callback, where CUDA forbids
/// driver calls: what [`Context::bind`] checks first, for steps that may make
/// driver calls without needing a context current themselves.
#[inline]
pub(crate) fn refuse_inside_callback() -> Result<()> {
    if in_stream_callback() {
        return Err(Error::InsideCallback {
            operation: "a driver call",
        });
    }
    Ok(())
}

/// Marks the calling thread as running a stream callback for the guard's life.
pub(crate) struct HostFnGuard(bool);

impl HostFnGuard {
    pub(crate) fn enter() -> Self {
        Self(IN_HOST_FN.with(|flag| flag.replace(true)))
    }
}

impl Drop for HostFnGuard {
    fn drop(&mut self) {
        IN_HOST_FN.with(|flag| flag.set(self.0));
    }
}
