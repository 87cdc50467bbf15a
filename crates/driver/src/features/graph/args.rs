//! What a graph keeps alive while any of its instances may run: the
//! arguments of captured launches ([`GraphArg`]), host buffers it copies
//! from or to ([`HostSlot`]), host-callback nodes, and the keep-alive list
//! ([`Resources`]) that every executable instance holds.

use crate::features::callback::panic_message;
use crate::features::kernel_arg::{ArgValue, KernelArg};
use crate::features::module::Kernel;
use crate::ground::callback_thread::HostFnGuard;
use crate::ground::error::Result;
use crate::objects::memory::sealed::HostUse;
use crate::objects::memory::{
    DeviceBuffer, DeviceCopy, DeviceMemory, DeviceUse, PinnedBuffer, device_bytes,
};
use crate::objects::metrics::Counters;
use std::any::Any;
use std::ffi::c_void;
use std::fmt;
use std::marker::PhantomData;
use std::ops::RangeBounds;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

/// A buffer a graph uses, kept alive by it.
pub(super) trait Kept: Send + Sync {
    fn as_use(&self) -> &dyn DeviceUse;
    fn arg(&self, writable: bool) -> KernelArg<'_>;
    fn bytes(&self) -> usize;
    fn ptr(&self) -> sys::CUdeviceptr;
    /// For a graph's own memory ([`GraphBuffer`](super::GraphBuffer)), the
    /// capture whose graph allocates it: valid in that graph only, and
    /// nothing the replays need to keep or track.
    fn graph_family(&self) -> Option<u64> {
        None
    }
}

impl<M: DeviceMemory + Send + Sync + 'static> Kept for M {
    fn as_use(&self) -> &dyn DeviceUse {
        self
    }
    fn arg(&self, writable: bool) -> KernelArg<'_> {
        KernelArg::lend(self, writable)
    }
    fn bytes(&self) -> usize {
        device_bytes(self)
    }
    fn ptr(&self) -> sys::CUdeviceptr {
        self.device_ptr()
    }
}

/// A host buffer a graph copies from or to, kept alive by it.
pub(super) trait KeptHost: Send + Sync {
    fn as_host(&self) -> &dyn HostUse;
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

impl<H: HostUse + Send + Sync + 'static> KeptHost for H {
    fn as_host(&self) -> &dyn HostUse {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// A page-locked host buffer the graph owns, from [`Capture::upload_owned`](super::Capture::upload_owned)
/// or [`Capture::download_owned`](super::Capture::download_owned): reach it with [`GraphExec::host`](super::GraphExec::host).
///
/// Owned by the graph, the buffer is touched by the host only through an
/// executable instance borrowed mutably, which no replay can be launched
/// through meanwhile; so a copy writing it needs no `unsafe`, unlike
/// [`Capture::copy_to_host_unchecked`](super::Capture::copy_to_host_unchecked).
#[derive(Debug)]
pub struct HostSlot<T> {
    pub(super) capture: u64,
    pub(super) index: usize,
    pub(super) _marker: PhantomData<fn() -> T>,
}

#[derive(Clone)]
pub(super) enum ArgInner {
    /// A scalar's value, as an eager launch passes it.
    Scalar(ArgValue),
    Buffer(Arc<dyn Kept>, bool),
}

/// One argument of a captured kernel launch: a scalar, or a buffer the
/// graph keeps alive.
///
/// A buffer is lent for reading with [`GraphArg::read`] (any
/// [`DeviceMemory`] in an `Arc`) and for writing with [`GraphArg::write`]
/// (a [`DeviceBuffer`] in an `Arc`: it has no host view, so no host slice
/// can see the writes of a replay). Ordering a replay's writes against
/// other work on the same buffer is the caller's job, as for eager work on
/// several streams.
///
/// ```
/// use cuda_streams_driver::{Context, DeviceBuffer, GraphArg, Stream};
/// use std::sync::Arc;
/// let ctx = Context::new(0).unwrap();
/// let stream = Stream::new(&ctx).unwrap();
/// let out = Arc::new(DeviceBuffer::<f32>::new_async(&stream, 4).unwrap());
/// let args = [GraphArg::from(4u64), 2.5f32.into(), GraphArg::write(&out)];
/// assert_eq!(args.len(), 3);
/// ```
#[derive(Clone)]
pub struct GraphArg {
    pub(super) inner: ArgInner,
}

impl GraphArg {
    /// `memory`, lent to every replay for reading.
    pub fn read<M: DeviceMemory + Send + Sync + 'static>(memory: &Arc<M>) -> Self {
        Self {
            inner: ArgInner::Buffer(Arc::clone(memory) as Arc<dyn Kept>, false),
        }
    }

    /// `buffer`, lent to every replay for writing.
    pub fn write<T: DeviceCopy>(buffer: &Arc<DeviceBuffer<T>>) -> Self {
        Self {
            inner: ArgInner::Buffer(Arc::clone(buffer) as Arc<dyn Kept>, true),
        }
    }

    /// The elements in `range` of `buffer`, lent to every replay for
    /// reading: the launch, and the stream-order tracker, see only those
    /// bytes. Fails, naming the range and the buffer's length, when the
    /// range is empty or does not fit ([`DeviceBuffer::slice`]).
    ///
    /// ```
    /// use cuda_streams_driver::{Context, DeviceBuffer, GraphArg, Stream};
    /// use std::sync::Arc;
    /// let ctx = Context::new(0).unwrap();
    /// let stream = Stream::new(&ctx).unwrap();
    /// let batch = Arc::new(DeviceBuffer::<f32>::new_async(&stream, 16).unwrap());
    /// let crops: Vec<GraphArg> = (0..4)
    ///     .map(|i| GraphArg::read_range(&batch, i * 4..(i + 1) * 4))
    ///     .collect::<Result<_, _>>()
    ///     .unwrap();
    /// assert_eq!(crops.len(), 4);
    /// assert!(GraphArg::read_range(&batch, 12..17).is_err());
    /// ```
    pub fn read_range<T: DeviceCopy>(
        buffer: &Arc<DeviceBuffer<T>>,
        range: impl RangeBounds<usize>,
    ) -> Result<Self> {
        Self::range(buffer, range, false)
    }

    /// The elements in `range` of `buffer`, lent to every replay for
    /// writing (a [`DeviceBuffer`] has no host view, as for
    /// [`GraphArg::write`]). Fails as [`GraphArg::read_range`] does.
    pub fn write_range<T: DeviceCopy>(
        buffer: &Arc<DeviceBuffer<T>>,
        range: impl RangeBounds<usize>,
    ) -> Result<Self> {
        Self::range(buffer, range, true)
    }

    /// `range` of `buffer` as a kept view, lent for writing when `writable`.
    fn range<T: DeviceCopy>(
        buffer: &Arc<DeviceBuffer<T>>,
        range: impl RangeBounds<usize>,
        writable: bool,
    ) -> Result<Self> {
        let view = buffer.slice_shared(range)?;
        Ok(Self {
            inner: ArgInner::Buffer(Arc::new(view) as Arc<dyn Kept>, writable),
        })
    }

    /// `memory`, lent to every replay (for writing when `writable`).
    pub(super) fn kept(memory: Arc<dyn Kept>, writable: bool) -> Self {
        Self {
            inner: ArgInner::Buffer(memory, writable),
        }
    }

    /// The buffer it lends and whether for writing; `None` for a scalar.
    pub(super) fn buffer(&self) -> Option<(&Arc<dyn Kept>, bool)> {
        match &self.inner {
            ArgInner::Buffer(memory, writable) => Some((memory, *writable)),
            ArgInner::Scalar(_) => None,
        }
    }

    pub(super) fn arg(&self) -> KernelArg<'_> {
        match &self.inner {
            ArgInner::Scalar(value) => KernelArg::from_value(*value),
            ArgInner::Buffer(memory, writable) => memory.arg(*writable),
        }
    }
}

impl fmt::Debug for GraphArg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.arg().fmt(f)
    }
}

macro_rules! scalar_graph_arg {
    ($($t:ty),*) => { $(
        impl From<$t> for GraphArg {
            fn from(value: $t) -> Self {
                Self { inner: ArgInner::Scalar(KernelArg::from(value).value()) }
            }
        }
    )* };
}
// `usize` is a `u64` (`size_t`) on every platform CUDA supports, as for
// `KernelArg`.
scalar_graph_arg!(u8, u32, i32, u64, i64, f32, f64, usize);

/// A host callback node: called at every replay, never freed by a call.
pub(super) struct HostNode {
    pub(super) f: Box<dyn Fn() + Send + Sync + 'static>,
    pub(super) counters: Arc<Counters>,
    pub(super) stream_id: u64,
}

/// The `CUhostFn` of every captured callback. Never unwinds into the driver.
pub(super) unsafe extern "C" fn host_node_trampoline(user_data: *mut c_void) {
    // SAFETY: `user_data` is a `HostNode` inside an `Arc` that the graph's
    // keep-alive list holds until every launch of every executable instance
    // has passed this node (released in stream order, see `release`).
    let node = unsafe { &*user_data.cast::<HostNode>() };
    let _ = catch_unwind(AssertUnwindSafe(|| {
        let _guard = HostFnGuard::enter();
        if let Err(panic) = catch_unwind(AssertUnwindSafe(&node.f)) {
            let message = panic_message(&*panic);
            let _ = catch_unwind(AssertUnwindSafe(move || drop(panic)));
            node.counters.callback_panicked(node.stream_id, message);
        }
    }));
}

/// What a graph needs alive while any of its instances may run.
#[derive(Default)]
pub(super) struct Resources {
    /// The capture it was made by (what a [`HostSlot`] names).
    pub(super) capture: u64,
    /// Buffers and whether some node writes them.
    pub(super) buffers: Vec<(Arc<dyn Kept>, bool)>,
    /// For each of `buffers`, how many uses of it the nodes make: reads,
    /// writes (a conditional body's uses count once). What an instance
    /// subtracts a node's captured uses from when the node is set to other
    /// buffers (`node_args`).
    pub(super) counts: Vec<(u32, u32)>,
    /// Host buffers of copies, and whether a copy writes them.
    pub(super) hosts: Vec<(Arc<dyn KeptHost>, bool)>,
    pub(super) kernels: Vec<Kernel>,
    /// What work enqueued by another crate needs alive while the graph may
    /// replay it ([`Capture::record_external`](super::Capture::record_external)): an NCCL communicator.
    pub(super) external: Vec<Arc<dyn Any + Send + Sync>>,
    /// Shared with the stream callbacks that release them after the last
    /// replays (see `GraphExec::release`).
    pub(super) callbacks: Arc<Vec<Arc<HostNode>>>,
    /// The bytes its memory nodes allocate at every replay (see
    /// `graph_memory`); they are neither kept nor tracked here.
    pub(super) graph_memory_bytes: usize,
    /// Whether a node was captured with
    /// [`Capture::launch_updatable`](super::Capture::launch_updatable): its
    /// instances then keep the graph, whose node it names.
    pub(super) updatable: bool,
    /// Whether a node was captured with
    /// [`Capture::launch_device_updatable`](super::Capture::launch_device_updatable):
    /// the graph is then instantiated once, and its instance has a token
    /// buffer that orders the device's sets against its replays.
    pub(super) device_updatable: bool,
}

impl Resources {
    /// Take ownership of `host`; its index in `hosts`.
    pub(super) fn own_host<T: DeviceCopy>(
        &mut self,
        host: PinnedBuffer<T>,
        writable: bool,
    ) -> usize {
        self.hosts.push((Arc::new(host), writable));
        self.hosts.len() - 1
    }

    pub(super) fn add_host(&mut self, memory: Arc<dyn KeptHost>, writable: bool) {
        match self
            .hosts
            .iter_mut()
            .find(|(kept, _)| Arc::ptr_eq(kept, &memory))
        {
            Some((_, write)) => *write |= writable,
            None => self.hosts.push((memory, writable)),
        }
    }

    pub(super) fn add_buffer(&mut self, memory: &Arc<dyn Kept>, writable: bool) {
        if memory.graph_family().is_some() {
            // Allocated and freed by the graph itself.
            return;
        }
        let index = match self
            .buffers
            .iter()
            .position(|(kept, _)| Arc::ptr_eq(kept, memory))
        {
            Some(index) => {
                self.buffers[index].1 |= writable;
                index
            }
            None => {
                self.buffers.push((Arc::clone(memory), writable));
                self.counts.push((0, 0));
                self.buffers.len() - 1
            }
        };
        add_use(&mut self.counts[index], writable);
    }

    /// Keep every buffer of `args` for the replays, lent as each says.
    pub(super) fn add_args(&mut self, args: &[GraphArg]) {
        for (memory, writable) in args.iter().filter_map(GraphArg::buffer) {
            self.add_buffer(memory, writable);
        }
    }

    /// Keep `kernel`'s module loaded for the replays (once per kernel).
    pub(super) fn add_kernel(&mut self, kernel: &Kernel) {
        if !self.kernels.iter().any(|k| k.as_raw() == kernel.as_raw()) {
            self.kernels.push(kernel.clone());
        }
    }

    /// Keep `keep` alive for the replays (once per object).
    pub(super) fn add_external(&mut self, keep: Arc<dyn Any + Send + Sync>) {
        if !self.external.iter().any(|kept| Arc::ptr_eq(kept, &keep)) {
            self.external.push(keep);
        }
    }
}

/// One more use in a (reads, writes) pair: the graph's counts, and an
/// instance's once nodes are set (`node_args`).
pub(super) fn add_use(pair: &mut (u32, u32), write: bool) {
    let slot = if write { &mut pair.1 } else { &mut pair.0 };
    *slot += 1;
}
