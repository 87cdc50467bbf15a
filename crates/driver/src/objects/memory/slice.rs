//! Views of a sub-range of a [`DeviceBuffer`]: [`DeviceSlice`] (read) and
//! [`DeviceSliceMut`] (write), from [`DeviceBuffer::slice`] and
//! [`DeviceBuffer::slice_mut`]. They implement the memory traits with the
//! range's own address and length, so launches, copies, memsets and the
//! stream-order tracker see exactly those bytes, and they forward the use
//! hooks to the buffer, which keeps tracking its uses (its free waits for
//! them). They borrow the buffer: a mutable view excludes every other view
//! of it, as `&mut [T]` does. A [`SharedDeviceSlice`] holds a share of a
//! buffer in an `Arc` instead, for a graph to keep alive
//! ([`GraphArg::read_range`](crate::GraphArg::read_range)).

use super::{DeviceBuffer, DeviceCopy, DeviceMemory, DeviceMemoryMut};
use crate::ground::error::{Error, Result};
use crate::objects::stream::Stream;
use std::fmt;
use std::ops::{Bound, Deref, Range, RangeBounds};
use std::sync::Arc;
use sys::CUdeviceptr;

/// `range` of a buffer of `len` elements as `start..end`, refused (with the
/// range and the length named) when it ends past the buffer, starts after
/// it ends, or is empty (no buffer of this crate has length 0).
fn resolve(range: impl RangeBounds<usize>, len: usize) -> Result<Range<usize>> {
    let start = match range.start_bound() {
        Bound::Included(&s) => Some(s),
        Bound::Excluded(&s) => s.checked_add(1),
        Bound::Unbounded => Some(0),
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e.checked_add(1),
        Bound::Excluded(&e) => Some(e),
        Bound::Unbounded => Some(len),
    };
    let shown = |bound: Option<usize>| {
        bound.map_or_else(|| "usize::MAX + 1".to_string(), |b| b.to_string())
    };
    let refuse = |reason: &'static str| Error::SliceOutOfRange {
        range: format!("{}..{}", shown(start), shown(end)),
        len,
        reason,
    };
    let (Some(start), Some(end)) = (start, end) else {
        return Err(refuse("it ends past the buffer"));
    };
    if start > end {
        Err(refuse("it starts after it ends"))
    } else if end > len {
        Err(refuse("it ends past the buffer"))
    } else if start == end {
        Err(refuse(
            "it is empty: zero-length buffers are refused (docs/architecture.md#empty-buffers)",
        ))
    } else {
        Ok(start..end)
    }
}

impl<T: DeviceCopy> DeviceBuffer<T> {
    /// A view of the elements in `range`, for reading (a kernel argument
    /// that is only read, a copy's source). Fails, naming the range and the
    /// buffer's length, when the range is empty or does not fit.
    ///
    /// ```
    /// use cuda_streams_driver::{Context, DeviceBuffer, Stream};
    /// # fn main() -> cuda_streams_driver::Result<()> {
    /// let ctx = Context::new(0)?;
    /// let stream = Stream::new(&ctx)?;
    /// let batch = DeviceBuffer::from_slice(&stream, &[1u32, 2, 3, 4, 5, 6])?;
    /// let mut crop = [0u32; 2];
    /// stream.copy_to_host(&mut crop, &batch.slice(2..4)?)?;
    /// assert_eq!(crop, [3, 4]);
    /// let err = batch.slice(4..8).unwrap_err();
    /// assert!(err.to_string().contains("slice 4..8"), "{err}");
    /// assert!(err.to_string().contains("6 element(s)"), "{err}");
    /// # Ok(())
    /// # }
    /// ```
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<DeviceSlice<'_, T>> {
        let range = resolve(range, self.len())?;
        Ok(DeviceView {
            buffer: self,
            range,
        })
    }

    /// A view of the elements in `range` that the GPU may write (a copy's
    /// destination, a memset, a kernel parameter it writes). Fails as
    /// [`DeviceBuffer::slice`] does.
    ///
    /// ```
    /// use cuda_streams_driver::{Context, DeviceBuffer, Stream};
    /// # fn main() -> cuda_streams_driver::Result<()> {
    /// let ctx = Context::new(0)?;
    /// let stream = Stream::new(&ctx)?;
    /// let mut batch = DeviceBuffer::from_slice(&stream, &[0u32; 8])?;
    /// for (crop, value) in [(0..4, 1), (4..8, 2)] {
    ///     stream.memset_u32_async(&mut batch.slice_mut(crop)?, value)?;
    /// }
    /// assert_eq!(batch.to_vec(&stream)?, [1, 1, 1, 1, 2, 2, 2, 2]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn slice_mut(&mut self, range: impl RangeBounds<usize>) -> Result<DeviceSliceMut<'_, T>> {
        let range = resolve(range, self.len())?;
        Ok(DeviceView {
            buffer: self,
            range,
        })
    }

    /// A read-only view of the elements in `range` that holds a share of
    /// the buffer, so it lives as long as it is needed: a graph keeps it
    /// alive ([`GraphArg::read_range`](crate::GraphArg::read_range)). Fails
    /// as [`DeviceBuffer::slice`] does.
    ///
    /// ```
    /// use cuda_streams_driver::{Context, DeviceBuffer, Stream};
    /// use std::sync::Arc;
    /// # fn main() -> cuda_streams_driver::Result<()> {
    /// let ctx = Context::new(0)?;
    /// let stream = Stream::new(&ctx)?;
    /// let batch = Arc::new(DeviceBuffer::from_slice(&stream, &[1u32, 2, 3, 4])?);
    /// let tail = batch.slice_shared(2..)?;
    /// drop(batch); // the view keeps the buffer alive
    /// assert_eq!(tail.to_vec(&stream)?, [3, 4]);
    /// assert!(tail.slice(5..6).is_err());
    /// # Ok(())
    /// # }
    /// ```
    pub fn slice_shared(
        self: &Arc<Self>,
        range: impl RangeBounds<usize>,
    ) -> Result<SharedDeviceSlice<T>> {
        let range = resolve(range, self.len())?;
        Ok(DeviceView {
            buffer: Arc::clone(self),
            range,
        })
    }
}

/// A view of a sub-range of a [`DeviceBuffer`], borrowed through `B`:
/// [`DeviceSlice`] (`&DeviceBuffer`, for reading) or [`DeviceSliceMut`]
/// (`&mut DeviceBuffer`, which the GPU may also write).
pub struct DeviceView<B> {
    buffer: B,
    range: Range<usize>,
}

/// A read-only view of a sub-range of a [`DeviceBuffer`]
/// ([`DeviceBuffer::slice`]).
pub type DeviceSlice<'a, T> = DeviceView<&'a DeviceBuffer<T>>;

/// A writable view of a sub-range of a [`DeviceBuffer`]
/// ([`DeviceBuffer::slice_mut`]).
pub type DeviceSliceMut<'a, T> = DeviceView<&'a mut DeviceBuffer<T>>;

/// A read-only view of a sub-range of a [`DeviceBuffer`] that holds a share
/// of it ([`DeviceBuffer::slice_shared`]).
pub type SharedDeviceSlice<T> = DeviceView<Arc<DeviceBuffer<T>>>;

impl<T: DeviceCopy, B: Deref<Target = DeviceBuffer<T>>> DeviceView<B> {
    /// The elements of the buffer it spans.
    pub fn range(&self) -> Range<usize> {
        self.range.clone()
    }

    /// The number of elements (never 0).
    pub fn len(&self) -> usize {
        self.range.len()
    }

    /// Always `false`: empty slices are refused.
    pub fn is_empty(&self) -> bool {
        self.range.is_empty()
    }

    /// A view of `range` of this view (relative to its start), for
    /// reading. Fails as [`DeviceBuffer::slice`] does.
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<DeviceSlice<'_, T>> {
        let inner = resolve(range, self.len())?;
        Ok(DeviceView {
            buffer: &*self.buffer,
            range: self.range.start + inner.start..self.range.start + inner.end,
        })
    }

    /// The contents copied into a `Vec` (a synchronous copy on `stream`).
    pub fn to_vec(&self, stream: &Stream) -> Result<Vec<T>> {
        super::device::device_to_vec(stream, self)
    }
}

impl<T: DeviceCopy> DeviceSliceMut<'_, T> {
    /// A writable view of `range` of this view (relative to its start).
    /// Fails as [`DeviceBuffer::slice`] does.
    pub fn slice_mut(&mut self, range: impl RangeBounds<usize>) -> Result<DeviceSliceMut<'_, T>> {
        let inner = resolve(range, self.len())?;
        Ok(DeviceView {
            buffer: &mut *self.buffer,
            range: self.range.start + inner.start..self.range.start + inner.end,
        })
    }
}

// SAFETY: the range lies inside the buffer (checked when the view was made),
// which the view borrows or holds a share of, so it outlives the view (no
// `&mut` to a buffer in an `Arc` exists while a share of it does); its uses are tracked by
// the buffer (the hooks forward to it), so its free waits for them. The
// buffer has no host side.
unsafe impl<T: DeviceCopy, B: Deref<Target = DeviceBuffer<T>>> DeviceMemory for DeviceView<B> {
    type Elem = T;

    fn device_ptr(&self) -> CUdeviceptr {
        self.buffer.device_ptr() + (self.range.start * std::mem::size_of::<T>()) as CUdeviceptr
    }

    fn device_len(&self) -> usize {
        self.range.len()
    }

    fn context_id(&self) -> u64 {
        self.buffer.context_id()
    }

    fn before_device_use(&self, stream: &Stream) -> Result<()> {
        self.buffer.before_device_use(stream)
    }

    fn after_device_use(&self, stream: &Stream, write: bool) -> Result<()> {
        self.buffer.after_device_use(stream, write)
    }

    fn home_stream_id(&self) -> Option<u64> {
        self.buffer.home_stream_id()
    }
}

// SAFETY: the view holds the buffer's only mutable borrow, and a device
// buffer has no host side, so no host reference sees the range.
unsafe impl<T: DeviceCopy> DeviceMemoryMut for DeviceSliceMut<'_, T> {}

impl<T: DeviceCopy> SharedDeviceSlice<T> {
    /// The buffer it views (a share of it).
    pub fn buffer(&self) -> &Arc<DeviceBuffer<T>> {
        &self.buffer
    }
}

impl<T: DeviceCopy> Clone for SharedDeviceSlice<T> {
    fn clone(&self) -> Self {
        DeviceView {
            buffer: Arc::clone(&self.buffer),
            range: self.range.clone(),
        }
    }
}

impl<T: DeviceCopy> Clone for DeviceSlice<'_, T> {
    fn clone(&self) -> Self {
        DeviceView {
            buffer: self.buffer,
            range: self.range.clone(),
        }
    }
}

impl<T: DeviceCopy, B: Deref<Target = DeviceBuffer<T>>> fmt::Debug for DeviceView<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceView")
            .field("buffer", &format_args!("{:#x}", self.buffer.device_ptr()))
            .field("range", &self.range)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::resolve;

    #[test]
    #[expect(
        clippy::reversed_empty_ranges,
        reason = "a reversed range is one of the inputs refused"
    )]
    fn ranges_resolve_or_are_refused_naming_the_range_and_the_length() {
        assert_eq!(resolve(.., 8).unwrap(), 0..8);
        assert_eq!(resolve(2..=3, 8).unwrap(), 2..4);
        assert_eq!(resolve(5.., 8).unwrap(), 5..8);
        for (range, reason) in [
            (
                resolve(4..9, 8),
                "slice 4..9 of a buffer of 8 element(s): it ends past the buffer",
            ),
            (
                resolve(6..3, 8),
                "slice 6..3 of a buffer of 8 element(s): it starts after it ends",
            ),
            (
                resolve(3..3, 8),
                "slice 3..3 of a buffer of 8 element(s): it is empty: zero-length buffers are \
                 refused (docs/architecture.md#empty-buffers)",
            ),
            (
                resolve(8.., 8),
                "slice 8..8 of a buffer of 8 element(s): it is empty: zero-length buffers are \
                 refused (docs/architecture.md#empty-buffers)",
            ),
            (
                resolve(0..=usize::MAX, 8),
                "slice 0..usize::MAX + 1 of a buffer of 8 element(s): it ends past the buffer",
            ),
        ] {
            let err = range.unwrap_err().to_string();
            assert!(err.contains(reason), "{err}");
        }
    }
}
