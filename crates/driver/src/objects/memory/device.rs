//! Device memory whose free is ordered after every stream that used it.

use super::tracker::UseTracker;
use super::{DeviceCopy, DeviceMemory, DeviceMemoryMut, byte_size};
use crate::ground::error::{Error, Result};
use crate::objects::context::Context;
use crate::objects::stream::Stream;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use sys::CUdeviceptr;

/// `len` values of `T` in device memory.
///
/// Two kinds, by how the memory was allocated:
/// - **stream-ordered** ([`DeviceBuffer::new_async`], `cuMemAllocAsync`): the
///   buffer has a *home stream*. Uses on the home stream cost nothing extra. A
///   use on any other stream first makes that stream wait for the allocation
///   (once per stream), then records an event there (one per buffer and
///   stream, re-recorded on each use). Drop makes the home stream wait for
///   those events and frees with `cuMemFreeAsync` on it: the host never blocks.
/// - **plain** ([`DeviceBuffer::new`], `cuMemAlloc`): every use records its
///   stream's event; Drop waits for those events on the host, then `cuMemFree`.
///
/// Either way the memory is freed only after every stream has passed its last
/// use, so safe code cannot make the GPU touch freed memory. The *contents*
/// are not ordered across streams for you: a write on one stream and a read on
/// another need an event between them ([`Stream::wait_event`]), as in CUDA.
///
/// ```
/// use cuda_streams_driver::{Context, DeviceBuffer, Stream};
/// let ctx = Context::new(0).unwrap();
/// let stream = Stream::new(&ctx).unwrap();
/// let buf = DeviceBuffer::from_slice(&stream, &[1u32, 2, 3]).unwrap();
/// assert_eq!((buf.len(), buf.size_in_bytes()), (3, 12));
/// assert_eq!(buf.to_vec(&stream).unwrap(), [1, 2, 3]);
/// assert!(DeviceBuffer::<u32>::new_async(&stream, 0).is_err());
/// ```
pub struct DeviceBuffer<T: DeviceCopy> {
    ctx: Arc<Context>,
    home: Option<Arc<Stream>>,
    ptr: CUdeviceptr,
    len: usize,
    tracker: UseTracker,
    _marker: PhantomData<T>,
}

impl<T: DeviceCopy> DeviceBuffer<T> {
    /// Allocate with `cuMemAlloc` (synchronous, usable on every stream at
    /// once). The contents are whatever the memory held.
    pub fn new(ctx: &Arc<Context>, len: usize) -> Result<Self> {
        let bytes = byte_size::<T>("DeviceBuffer", len)?;
        let ptr = crate::objects::result::mem_alloc(ctx, bytes)?;
        Ok(Self {
            ctx: Arc::clone(ctx),
            home: None,
            ptr,
            len,
            tracker: UseTracker::default(),
            _marker: PhantomData,
        })
    }

    /// Allocate in stream order on `stream` (`cuMemAllocAsync`), which becomes
    /// the buffer's home stream. The contents are whatever the memory held.
    pub fn new_async(stream: &Arc<Stream>, len: usize) -> Result<Self> {
        let bytes = byte_size::<T>("DeviceBuffer", len)?;
        // Refused while `stream` captures: the allocation would become a
        // node of the graph.
        let ptr = stream.allocate_raw(bytes, "DeviceBuffer::new_async")?;
        let ctx = stream.context();
        stream.counters.allocated(bytes);
        Ok(Self {
            ctx: Arc::clone(ctx),
            home: Some(Arc::clone(stream)),
            ptr,
            len,
            tracker: UseTracker::default(),
            _marker: PhantomData,
        })
    }

    /// [`DeviceBuffer::new_async`], then zero it on the home stream.
    pub fn zeroed_async(stream: &Arc<Stream>, len: usize) -> Result<Self> {
        let mut buffer = Self::new_async(stream, len)?;
        stream.memset_u8_async(&mut buffer, 0)?;
        Ok(buffer)
    }

    /// A stream-ordered buffer on `stream` holding a copy of `data` (the copy
    /// has finished when this returns, so `data` is free again).
    pub fn from_slice(stream: &Arc<Stream>, data: &[T]) -> Result<Self> {
        let mut buffer = Self::new_async(stream, data.len())?;
        stream.copy_from_host(&mut buffer, data)?;
        Ok(buffer)
    }

    /// Copy the contents back through `stream`, waiting for the copy.
    pub fn to_vec(&self, stream: &Stream) -> Result<Vec<T>> {
        device_to_vec(stream, self)
    }

    common_accessors!();

    /// The device address (for raw calls and interop; the buffer keeps owning it).
    pub fn as_device_ptr(&self) -> CUdeviceptr {
        self.ptr
    }

    /// The home stream of a stream-ordered buffer.
    pub fn home_stream(&self) -> Option<&Arc<Stream>> {
        self.home.as_ref()
    }

    /// Whether the buffer is freed in stream order on a home stream.
    pub fn is_stream_ordered(&self) -> bool {
        self.home.is_some()
    }

    /// How many streams (other than the home stream) have used the buffer.
    pub fn foreign_stream_count(&self) -> usize {
        self.tracker.stream_count()
    }

    /// Block the host until every use of the buffer on a tracked stream has
    /// finished (the instance of a graph with device-updatable nodes waits
    /// so for the sets that write its parameters).
    pub(crate) fn wait_uses(&self) -> Result<()> {
        self.tracker.wait_host(&self.ctx, true)
    }

    fn is_home(&self, stream: &Stream) -> bool {
        self.home
            .as_ref()
            .is_some_and(|home| home.id() == stream.id())
    }
}

// SAFETY: `len` values at `ptr` belong to this buffer, of `ctx`; the free
// waits for every use reported here (home stream: ordered by the stream;
// others: their events, waited for by the home stream or the host); a use on
// another stream of a stream-ordered buffer first waits for the allocation.
// There is no host view of device memory.
unsafe impl<T: DeviceCopy> DeviceMemory for DeviceBuffer<T> {
    type Elem = T;

    fn device_ptr(&self) -> CUdeviceptr {
        self.ptr
    }

    fn device_len(&self) -> usize {
        self.len
    }

    fn context_id(&self) -> u64 {
        self.ctx.id()
    }

    fn before_device_use(&self, stream: &Stream) -> Result<()> {
        // Another device's stream only for peer copies (the driver layer
        // checks the device of every other use before this hook).
        stream.check_driver("the device buffer", &self.ctx)?;
        match &self.home {
            Some(home) if home.id() != stream.id() => self.tracker.order_after_home(home, stream),
            _ => Ok(()),
        }
    }

    fn after_device_use(&self, stream: &Stream, write: bool) -> Result<()> {
        if self.is_home(stream) {
            return Ok(());
        }
        self.tracker.record_use(stream, write)
    }

    /// Both hooks return at once on the home stream (`is_home`; the driver
    /// check passes there, the stream being of the buffer's context).
    fn home_stream_id(&self) -> Option<u64> {
        self.home.as_ref().map(|home| home.id())
    }
}

// SAFETY: the buffer owns its memory; `&mut self` is the only way to it.
unsafe impl<T: DeviceCopy> DeviceMemoryMut for DeviceBuffer<T> {}

impl<T: DeviceCopy> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        // Freed after every use (stream-ordered below): the next owner of the
        // address starts afresh.
        crate::enqueue::order::forget(&self.ctx, self.ptr, self.size_in_bytes());
        if let Err(err) = self.ctx.bind() {
            tracing::warn!(
                "leaking device buffer {:#x} ({} bytes): {err}",
                self.ptr,
                self.size_in_bytes()
            );
            return;
        }
        let driver = self.ctx.driver();
        match &self.home {
            Some(home) => {
                let ptr = self.ptr;
                // One protocol call from the waits to the free: captured,
                // the free would become a node of the graph (and happen at
                // every replay).
                let freed = home.enqueue_raw_after(
                    "freeing a device buffer",
                    || self.tracker.order_before_free(home),
                    |driver, raw| {
                        // SAFETY: the pointer came from cuMemAllocAsync and is
                        // freed once, after every recorded use (the home stream
                        // waits on them).
                        unsafe { (driver.cuMemFreeAsync)(ptr, raw) }
                    },
                );
                match freed {
                    Ok(true) => home.counters.freed(self.size_in_bytes()),
                    Ok(false) => tracing::warn!("leaking device buffer {:#x}", self.ptr),
                    // So the memory is leaked instead.
                    Err(Error::StreamCapturing { .. }) => tracing::warn!(
                        "leaking device buffer {:#x} ({} bytes): dropped while its home stream {} is being captured",
                        self.ptr,
                        self.size_in_bytes(),
                        home.id()
                    ),
                    Err(err) => tracing::warn!("freeing {:#x}: {err}", self.ptr),
                }
            }
            None => match self.tracker.wait_host(&self.ctx, true) {
                Ok(()) => {
                    // SAFETY: from cuMemAlloc, freed once, after every recorded use finished.
                    let code = unsafe { (driver.cuMemFree)(self.ptr) };
                    if let Err(err) = self.ctx.check(code) {
                        tracing::warn!("freeing {:#x}: {err}", self.ptr);
                    }
                }
                Err(err) => tracing::warn!("leaking device buffer {:#x}: {err}", self.ptr),
            },
        }
        self.tracker.release_events();
    }
}

impl<T: DeviceCopy> fmt::Debug for DeviceBuffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.len)
            .field("home", &self.home.as_ref().map(|s| s.id()))
            .finish()
    }
}

/// The contents of `memory`, copied back through `stream` (waiting for the
/// copy): [`DeviceBuffer::to_vec`], its views' and
/// `SharedDeviceBuffer::to_vec`.
pub(crate) fn device_to_vec<M: DeviceMemory>(stream: &Stream, memory: &M) -> Result<Vec<M::Elem>> {
    let len = memory.device_len();
    let mut out = Vec::with_capacity(len);
    // SAFETY: `out` has room for `len` values; the copy has completed when
    // this returns Ok.
    unsafe { stream.copy_to_host_raw(out.as_mut_ptr(), len, memory)? };
    // SAFETY: all `len` values were written by the copy, and any bytes are a
    // valid `T` (DeviceCopy).
    unsafe { out.set_len(len) };
    Ok(out)
}
