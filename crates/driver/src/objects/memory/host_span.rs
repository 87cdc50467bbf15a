//! Page-locked host memory that this crate does not own but lends to copies:
//! a host pool's block ([`PinnedRegion`](super::PinnedRegion)) or a user's
//! registered slice ([`HostRegistered`](super::HostRegistered)). Both are a
//! [`HostSpan`]: the context, the address, the length and the streams' uses;
//! they differ only in how the memory is given back when they are dropped
//! (to its owner without a wait, or unregistered after one).

use super::DeviceCopy;
use super::sealed::{HostAccess, HostUse};
use super::tracker::UseTracker;
use crate::ground::error::Result;
use crate::objects::context::Context;
use crate::objects::stream::Stream;
use std::ptr::NonNull;
use std::sync::Arc;

/// `len` values of `T` in page-locked host memory of a context, with the
/// uses streams have made of it (see the module's docs).
pub(crate) struct HostSpan<T: DeviceCopy> {
    pub(crate) ctx: Arc<Context>,
    ptr: NonNull<T>,
    len: usize,
    pub(crate) tracker: UseTracker,
}

// SAFETY: the span has the memory to itself while it lives (the contract of
// `new`), like a `Box<[T]>`; `T` is Send + Sync (DeviceCopy) and so is the
// tracker.
unsafe impl<T: DeviceCopy> Send for HostSpan<T> {}
// SAFETY: shared access only reads the memory after waiting for device
// writes; writes need `&mut self`.
unsafe impl<T: DeviceCopy> Sync for HostSpan<T> {}

impl<T: DeviceCopy> HostSpan<T> {
    /// A span over `len` values at `ptr`, no use tracked yet.
    ///
    /// # Safety
    /// `ptr` is page-locked host memory usable by `ctx`'s device, aligned
    /// for `T`, holding `len` initialised values of `T` in
    /// `len * size_of::<T>()` bytes, and nothing but this span reads or
    /// writes it while the span lives.
    pub(crate) unsafe fn new(ctx: Arc<Context>, ptr: NonNull<T>, len: usize) -> Self {
        Self {
            ctx,
            ptr,
            len,
            tracker: UseTracker::default(),
        }
    }

    /// Its context reference, the span done with (its uses forgotten).
    pub(crate) fn into_context(self) -> Arc<Context> {
        self.ctx
    }

    /// The span as the sealed use trait (a method, so that a holder keeping
    /// the span in a `ManuallyDrop` reaches it by auto-deref too).
    pub(crate) fn as_dyn_use(&self) -> &dyn HostUse {
        self
    }

    /// Its first value's address.
    pub(crate) fn ptr(&self) -> NonNull<T> {
        self.ptr
    }

    /// The number of values.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The size in bytes.
    pub(crate) fn size_in_bytes(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }

    /// The contents, after waiting for the enqueued uses that may write them.
    pub(crate) fn as_slice(&self) -> Result<&[T]> {
        self.tracker.wait_host(&self.ctx, false)?;
        // SAFETY: `len` initialised values (the contract of `new`, written
        // since only by finished copies of `DeviceCopy` values); no write is
        // in flight (waited above; new writes need `&mut self`).
        Ok(unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) })
    }

    /// The contents for writing, after waiting for every enqueued use.
    pub(crate) fn as_mut_slice(&mut self) -> Result<&mut [T]> {
        self.tracker.wait_host(&self.ctx, true)?;
        // SAFETY: as in `as_slice`, and no stream uses them (waited above).
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) })
    }
}

impl<T: DeviceCopy> HostUse for HostSpan<T> {
    fn host_context_id(&self) -> u64 {
        self.ctx.id()
    }

    fn host_bytes(&self) -> (u64, usize) {
        (self.ptr.as_ptr() as u64, self.size_in_bytes())
    }

    fn after_host_use(&self, stream: &Stream, write: bool) -> Result<()> {
        self.tracker.record_use(stream, write)
    }

    fn as_host_use(&self) -> &dyn HostUse {
        self
    }
}

impl<T: DeviceCopy> HostAccess<T> for HostSpan<T> {
    fn host_ptr(&self) -> *mut T {
        self.ptr.as_ptr()
    }

    fn host_len(&self) -> usize {
        self.len
    }
}

/// The accessors and the host-memory traits of a type that holds its
/// memory as a `span: HostSpan<T>`, each answered by the span: expanded
/// once per such type (`$($generics)*` are its impl's parameters).
macro_rules! span_host_memory {
    ([$($generics:tt)*] $holder:ty) => {
        impl<$($generics)*> $holder {
            /// The number of elements (never 0).
            pub fn len(&self) -> usize {
                self.span.len()
            }

            /// Always `false`: empty memory is refused when it is made.
            pub fn is_empty(&self) -> bool {
                self.span.len() == 0
            }

            /// The size in bytes.
            pub fn size_in_bytes(&self) -> usize {
                self.span.size_in_bytes()
            }

            /// The context the memory belongs to.
            pub fn context(&self) -> &std::sync::Arc<$crate::objects::context::Context> {
                &self.span.ctx
            }

            /// The contents, after waiting for the enqueued uses that may
            /// write them.
            pub fn as_slice(&self) -> $crate::ground::error::Result<&[T]> {
                self.span.as_slice()
            }

            /// The contents for writing, after waiting for every enqueued use.
            pub fn as_mut_slice(&mut self) -> $crate::ground::error::Result<&mut [T]> {
                self.span.as_mut_slice()
            }
        }

        impl<$($generics)*> $crate::objects::memory::sealed::HostUse for $holder {
            fn host_context_id(&self) -> u64 {
                self.span.host_context_id()
            }

            fn host_bytes(&self) -> (u64, usize) {
                self.span.host_bytes()
            }

            fn after_host_use(
                &self,
                stream: &$crate::objects::stream::Stream,
                write: bool,
            ) -> $crate::ground::error::Result<()> {
                self.span.after_host_use(stream, write)
            }

            fn as_host_use(&self) -> &dyn $crate::objects::memory::sealed::HostUse {
                self.span.as_dyn_use()
            }
        }

        impl<$($generics)*> $crate::objects::memory::sealed::HostAccess<T> for $holder {
            fn host_ptr(&self) -> *mut T {
                self.span.host_ptr()
            }

            fn host_len(&self) -> usize {
                self.span.host_len()
            }
        }
    };
}
pub(crate) use span_host_memory;
