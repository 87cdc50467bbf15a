//! [`Capture`]: the second enqueue API, through which work is recorded into
//! a graph while a stream captures. Its methods take buffers by `Arc` and
//! keep them (see the module `args`).

use super::args::{ArgInner, HostNode, HostSlot, Kept, KeptHost, Resources, host_node_trampoline};
use super::{Graph, GraphArg};
use crate::enqueue::Use;
use crate::error::{Error, Result};
use crate::launch::{KernelArg, LaunchConfig, launch_raw};
use crate::memory::sealed::HostUse;
use crate::memory::{DeviceBuffer, DeviceCopy, DeviceMemory, HostMemory, PinnedBuffer};
use crate::module::Kernel;
use crate::order::{CaptureOrder, Touches};
use crate::stream::Stream;
use std::any::Any;
use std::ffi::c_void;
use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use sys::{CUgraph, CUstreamCaptureMode};

static NEXT_CAPTURE_ID: AtomicU64 = AtomicU64::new(1);

/// A stream taking part in a capture besides the one that began it.
struct Member {
    stream: Arc<Stream>,
    /// It holds captured work not yet joined back into the origin.
    unjoined: bool,
}

/// A stream capture in progress: work enqueued through it is recorded into
/// a [`Graph`] instead of running ([`Stream::begin_capture`]).
///
/// Work can fork to other streams ([`Capture::fork`]) and must be joined
/// back ([`Capture::join`]) before [`Capture::end`]. The capturing streams'
/// own enqueueing methods, `synchronize` and `query`, and
/// [`Context::synchronize`](crate::Context::synchronize) are refused meanwhile, with the capture left
/// usable. Dropping a capture that was not ended ends it and discards the
/// graph.
///
/// ```
/// use cuda_streams_driver::{Context, DeviceBuffer, GraphArg, LaunchConfig, Module, Stream};
/// use kernels::ELEMENTWISE;
/// use std::sync::Arc;
/// # fn main() -> cuda_streams_driver::Result<()> {
/// let ctx = Context::new(0)?;
/// let stream = Stream::new(&ctx)?;
/// let fill = Module::load(&ctx, &ELEMENTWISE)?.function("fill_f32")?;
/// let out = Arc::new(DeviceBuffer::<f32>::new_async(&stream, 4)?);
///
/// let mut capture = stream.begin_capture()?;
/// let args = [GraphArg::from(4u64), 2.5f32.into(), GraphArg::write(&out)];
/// capture.launch(&stream, &fill, LaunchConfig::for_num_elems(4), &args)?;
/// assert!(stream.synchronize().is_err(), "refused during capture");
/// let graph = capture.end()?;
///
/// let exec = graph.instantiate()?;
/// exec.launch(&stream)?;
/// assert_eq!(out.to_vec(&stream)?, [2.5; 4]);
/// # Ok(())
/// # }
/// ```
#[must_use = "a capture records nothing unless work is enqueued through it and it is ended"]
pub struct Capture {
    origin: Arc<Stream>,
    id: u64,
    members: Vec<Member>,
    resources: Resources,
    callbacks: Vec<Arc<HostNode>>,
    nodes: usize,
    open: bool,
    /// The graph's own order, checked node by node (`None` when the
    /// context's policy is `Off`).
    order: Option<CaptureOrder>,
}

impl Stream {
    /// Begin capturing this stream into a graph. Fails when the stream
    /// already takes part in a capture.
    pub fn begin_capture(&self) -> Result<Capture> {
        let ctx = self.context();
        ctx.bind()?;
        let id = NEXT_CAPTURE_ID.fetch_add(1, Ordering::Relaxed);
        // Exclusively: every eager enqueue in flight finishes first, and
        // none can start until the flag says "capturing".
        self.enter_capture("Stream::begin_capture", || {
            if self
                .capture
                .compare_exchange(0, id, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                return Err(Error::StreamCapturing {
                    operation: "Stream::begin_capture",
                    stream: self.id(),
                });
            }
            self.order.enter_capture();
            // Relaxed: the safe layer refuses the calls CUDA's stricter modes
            // would, with a clear error, and a capture may end on another thread.
            let mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
            // SAFETY: a live stream of the current context.
            let code = unsafe { (ctx.driver().cuStreamBeginCapture)(self.as_raw(), mode) };
            if let Err(err) = ctx.check(code) {
                self.capture.store(0, Ordering::Release);
                self.order.leave_capture();
                return Err(err);
            }
            Ok(())
        })?;
        ctx.captures.fetch_add(1, Ordering::AcqRel);
        tracing::debug!(stream = self.id(), capture = id, "stream capture begun");
        Ok(Capture {
            origin: self.to_arc(),
            id,
            members: Vec::new(),
            resources: Resources {
                capture: id,
                ..Resources::default()
            },
            callbacks: Vec::new(),
            nodes: 0,
            open: true,
            order: CaptureOrder::begin(self),
        })
    }
}

impl Capture {
    /// The stream that began the capture.
    pub fn origin(&self) -> &Arc<Stream> {
        &self.origin
    }

    /// Nodes captured so far (launches, copies, memsets, callbacks).
    pub fn node_count(&self) -> usize {
        self.nodes
    }

    /// A process-unique id of this capture (never 0): what
    /// [`HostSlot`]s and the engine's captured operation ids name.
    pub fn id(&self) -> u64 {
        self.id
    }

    fn check_open(&self) -> Result<()> {
        if self.open {
            Ok(())
        } else {
            Err(Error::CaptureEnded {
                origin: self.origin.id(),
            })
        }
    }

    /// `Ok` when `stream` takes part in this capture.
    fn check_member(&self, stream: &Stream) -> Result<()> {
        self.check_open()?;
        if stream.capture_id() == self.id {
            Ok(())
        } else {
            Err(Error::CaptureIsolation {
                reason: format!(
                    "stream {} does not take part in the capture begun on stream {}; fork it in \
                     with Capture::fork",
                    stream.id(),
                    self.origin.id()
                ),
            })
        }
    }

    /// Captured work was added on `stream`.
    fn worked_on(&mut self, stream: &Stream) {
        self.nodes += 1;
        if let Some(member) = self
            .members
            .iter_mut()
            .find(|m| m.stream.id() == stream.id())
        {
            member.unjoined = true;
        }
    }

    /// Capture one node with `node`, checked within the graph's own order
    /// first: the bytes it touches (`touches`, computed only while the
    /// policy is not `Off`) against the nodes captured before it.
    fn ordered_node(
        &mut self,
        stream: &Stream,
        what: &'static str,
        touches: impl FnOnce() -> Touches,
        node: impl FnOnce(&mut Self) -> Result<()>,
    ) -> Result<()> {
        let Some(mut order) = self.order.take() else {
            return node(self);
        };
        let touches = touches();
        let captured = order
            .check(stream, what, &touches)
            .and_then(|races| node(self).map(|()| races));
        let result = captured.map(|races| order.record(stream, what, &touches, races));
        self.order = Some(order);
        result
    }

    /// Capture a launch of `kernel` on `stream` (the origin or a stream
    /// forked in), checking `args` against the kernel's signature as
    /// [`Stream::launch`] does. The buffers and the kernel are kept alive by
    /// the graph.
    pub fn launch(
        &mut self,
        stream: &Stream,
        kernel: &Kernel,
        config: LaunchConfig,
        args: &[GraphArg],
    ) -> Result<()> {
        let lent: Vec<KernelArg<'_>> = args.iter().map(GraphArg::arg).collect();
        kernel.check_args(&lent)?;
        // SAFETY: every argument matches the kernel's declared parameters
        // (checked above), as in `Stream::launch`.
        unsafe { self.launch_unchecked(stream, kernel, config, args) }
    }

    /// [`Capture::launch`] without checking `args` against a signature.
    ///
    /// # Safety
    /// As for [`Stream::launch_unchecked`]: the arguments must be what the
    /// kernel's parameters are, and the kernel must not write through a
    /// buffer lent with [`GraphArg::read`].
    pub unsafe fn launch_unchecked(
        &mut self,
        stream: &Stream,
        kernel: &Kernel,
        config: LaunchConfig,
        args: &[GraphArg],
    ) -> Result<()> {
        self.check_member(stream)?;
        config.validate()?;
        stream.check_context("the kernel", kernel.context())?;
        check_args_context(stream, args)?;
        let touches = || {
            args.iter()
                .filter_map(|arg| match &arg.inner {
                    ArgInner::Buffer(memory, writable) => {
                        Some(Use::Device(memory.as_use(), *writable).touch())
                    }
                    _ => None,
                })
                .collect()
        };
        self.ordered_node(stream, "kernel launch", touches, |capture| {
            let lent: Vec<KernelArg<'_>> = args.iter().map(GraphArg::arg).collect();
            let ctx = stream.context();
            ctx.bind()?;
            // SAFETY: a live stream of the current context; the buffers are
            // kept alive by the graph's resources (pushed below) for every
            // replay; the arguments' meaning is the caller's contract.
            let code = unsafe { launch_raw(ctx.driver(), stream.as_raw(), kernel, config, &lent) };
            ctx.check(code)?;
            capture.resources.add_args(args);
            capture.resources.add_kernel(kernel);
            capture.worked_on(stream);
            Ok(())
        })
    }

    /// Capture work that another crate enqueues on `stream` itself (an NCCL
    /// collective): `enqueue` makes its calls on `stream.as_raw()` while
    /// the stream captures, so they become nodes of the graph. The buffers
    /// of `args` and `keep` (the communicator) are kept alive by the graph,
    /// whatever `enqueue` returns, and every replay orders the buffers like
    /// a captured launch's. Within the graph the work is one node
    /// ("external work") touching `args` as lent, checked against the other
    /// nodes like a captured launch. `stream` must be the origin or a
    /// stream forked in; its context is made current before `enqueue` runs.
    ///
    /// # Safety
    /// The work `enqueue` enqueues on `stream` may touch only the device
    /// memory of `args` (and write only what is lent with
    /// [`GraphArg::write`]) and what `keep` keeps alive, and must enqueue
    /// on no stream outside this capture.
    pub unsafe fn record_external<R, E: From<Error>>(
        &mut self,
        stream: &Stream,
        args: &[GraphArg],
        keep: Arc<dyn Any + Send + Sync>,
        enqueue: impl FnOnce() -> std::result::Result<R, E>,
    ) -> std::result::Result<R, E> {
        self.check_member(stream)?;
        check_args_context(stream, args)?;
        stream.context().bind()?;
        // Kept before the work is recorded: whatever part of it the graph
        // holds finds its memory alive at every replay.
        self.resources.add_args(args);
        self.resources.add_external(keep);
        // Not `ordered_node`: `enqueue`'s error is the caller's type. The
        // node's step in the graph's order is taken once `enqueue` has
        // made its calls (as the driver calls of the other nodes), and
        // whatever it returned: part of its work may be in the graph.
        let touches: Touches = args
            .iter()
            .filter_map(|arg| match &arg.inner {
                ArgInner::Buffer(memory, writable) => {
                    Some(Use::Device(memory.as_use(), *writable).touch())
                }
                _ => None,
            })
            .collect();
        let races = match &mut self.order {
            Some(order) => Some(order.check(stream, "external work", &touches)?),
            None => None,
        };
        let recorded = enqueue();
        if let (Some(order), Some(races)) = (&mut self.order, races) {
            order.record(stream, "external work", &touches, races);
        }
        let recorded = recorded?;
        self.worked_on(stream);
        Ok(recorded)
    }

    /// Device memory private to the graph, for intermediate results its
    /// nodes pass each other: allocated now with `cuMemAlloc` (not from a
    /// stream-ordered pool, whose allocation a capture would record as a
    /// node), and lent to nodes through the returned `Arc`. No allocator
    /// caches it, so nothing else gets this memory while the graph, an
    /// instance of it, or the caller's `Arc` lives; it is freed after the
    /// last of them is gone (and the replays have passed it). To fill it
    /// from outside the graph, allocate it with [`Capture::alloc_from`].
    ///
    /// ```
    /// use cuda_streams_driver::{Context, Stream};
    /// # fn main() -> cuda_streams_driver::Result<()> {
    /// let ctx = Context::new(0)?;
    /// let stream = Stream::new(&ctx)?;
    /// let mut capture = stream.begin_capture()?;
    /// let scratch = capture.alloc::<f32>(1024)?;
    /// capture.memset_u8(&stream, &scratch, 0)?;
    /// let graph = capture.end()?;
    /// let weak = std::sync::Arc::downgrade(&scratch);
    /// drop(scratch);
    /// assert!(weak.upgrade().is_some(), "the graph keeps its memory");
    /// drop(graph);
    /// assert!(weak.upgrade().is_none(), "and gives it back");
    /// # Ok(())
    /// # }
    /// ```
    pub fn alloc<T: DeviceCopy>(&mut self, len: usize) -> Result<Arc<DeviceBuffer<T>>> {
        self.check_open()?;
        let buffer = Arc::new(DeviceBuffer::new(self.origin.context(), len)?);
        let kept: Arc<dyn Kept> = buffer.clone();
        self.resources.add_buffer(&kept, false);
        Ok(buffer)
    }

    /// [`Capture::alloc`], holding a copy of `data` made now, outside the
    /// graph: no node copies it, so the replays find it initialised (weights,
    /// a lookup table, a starting state). The copy runs on a stream of its
    /// own, which takes no part in the capture, and has finished when this
    /// returns. For inputs that change between replays, capture a copy from
    /// a host buffer the graph owns instead ([`Capture::upload_owned`]).
    ///
    /// ```
    /// use cuda_streams_driver::{Context, DeviceBuffer, Stream};
    /// use std::sync::Arc;
    /// # fn main() -> cuda_streams_driver::Result<()> {
    /// let ctx = Context::new(0)?;
    /// let stream = Stream::new(&ctx)?;
    /// let out = Arc::new(DeviceBuffer::<u32>::new(&ctx, 4)?);
    /// let mut capture = stream.begin_capture()?;
    /// let table = capture.alloc_from(&[10u32, 20, 30, 40])?;
    /// capture.copy(&stream, &out, &table)?; // the graph reads the table
    /// assert_eq!(capture.node_count(), 1, "filling the table is no node");
    /// let graph = capture.end()?;
    /// graph.instantiate()?.launch(&stream)?;
    /// assert_eq!(out.to_vec(&stream)?, [10, 20, 30, 40]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn alloc_from<T: DeviceCopy>(&mut self, data: &[T]) -> Result<Arc<DeviceBuffer<T>>> {
        self.check_open()?;
        let ctx = self.origin.context();
        let mut buffer = DeviceBuffer::new(ctx, data.len())?;
        // Not a capturing stream: the copy runs now instead of becoming a
        // node, and `copy_from_host` waits for it (the host's clock, and so
        // every later enqueue, is ordered after it).
        let loader = Stream::new(ctx)?;
        loader.copy_from_host(&mut buffer, data)?;
        let buffer = Arc::new(buffer);
        let kept: Arc<dyn Kept> = buffer.clone();
        self.resources.add_buffer(&kept, false);
        Ok(buffer)
    }

    /// Capture a copy of `src` into `dst` (device memory, equal lengths) on
    /// `stream`.
    pub fn copy<T, S>(
        &mut self,
        stream: &Stream,
        dst: &Arc<DeviceBuffer<T>>,
        src: &Arc<S>,
    ) -> Result<()>
    where
        T: DeviceCopy,
        S: DeviceMemory<Elem = T> + Send + Sync + 'static,
    {
        self.check_member(stream)?;
        crate::check_len("Capture::copy", dst.device_len(), src.device_len())?;
        let (dst, src): (Arc<dyn Kept>, Arc<dyn Kept>) = (dst.clone(), src.clone());
        for memory in [&dst, &src] {
            stream.check_context_id("a buffer", memory.as_use().use_context_id())?;
        }
        let touches = || {
            [(&dst, true), (&src, false)]
                .into_iter()
                .map(|(memory, write)| Use::Device(memory.as_use(), write).touch())
                .collect()
        };
        self.ordered_node(stream, "copy", touches, |capture| {
            let ctx = stream.context();
            ctx.bind()?;
            // SAFETY: both regions hold `bytes` bytes and are kept alive by
            // the graph for every replay.
            let code = unsafe {
                (ctx.driver().cuMemcpyDtoDAsync)(dst.ptr(), src.ptr(), dst.bytes(), stream.as_raw())
            };
            ctx.check(code)?;
            capture.resources.add_buffer(&dst, true);
            capture.resources.add_buffer(&src, false);
            capture.worked_on(stream);
            Ok(())
        })
    }

    /// Capture a copy of the host buffer `src` (page-locked or unified
    /// memory: a [`HostMemory`]) into `dst` on `stream`. Every replay reads
    /// `src` as it is then; the host cannot write it while the graph holds
    /// it (that needs `&mut`), and dropping it waits for the replays.
    pub fn copy_from_host<T, H>(
        &mut self,
        stream: &Stream,
        dst: &Arc<DeviceBuffer<T>>,
        src: &Arc<H>,
    ) -> Result<()>
    where
        T: DeviceCopy,
        H: HostMemory<T> + Send + Sync + 'static,
    {
        self.check_member(stream)?;
        crate::check_len("Capture::copy_from_host", dst.device_len(), src.host_len())?;
        let dst: Arc<dyn Kept> = dst.clone();
        self.host_copy_node(stream, dst, src.clone(), HostCopy::ToDevice)
    }

    /// Capture a copy of the page-locked buffer `src`, which the graph takes
    /// over, into `dst` on `stream`. Write new contents between replays with
    /// [`GraphExec::host`](super::GraphExec::host).
    pub fn upload_owned<T: DeviceCopy>(
        &mut self,
        stream: &Stream,
        dst: &Arc<DeviceBuffer<T>>,
        src: PinnedBuffer<T>,
    ) -> Result<HostSlot<T>> {
        let src = Arc::new(src);
        self.copy_from_host(stream, dst, &src)?;
        Ok(self.own(src, false))
    }

    /// Capture a copy of `src` into the page-locked buffer `dst`, which the
    /// graph takes over, on `stream`. Read what the replays wrote with
    /// [`GraphExec::host`](super::GraphExec::host).
    pub fn download_owned<T, S>(
        &mut self,
        stream: &Stream,
        dst: PinnedBuffer<T>,
        src: &Arc<S>,
    ) -> Result<HostSlot<T>>
    where
        T: DeviceCopy,
        S: DeviceMemory<Elem = T> + Send + Sync + 'static,
    {
        let dst = Arc::new(dst);
        // SAFETY: the graph takes `dst` over below (the only other `Arc` is
        // this local one, dropped there); the host reaches it only through
        // `GraphExec::host`, which needs the instance mutably (so no launch
        // meanwhile) and no graph or other instance sharing its resources.
        unsafe { self.copy_to_host_unchecked(stream, &dst, src)? };
        Ok(self.own(dst, true))
    }

    /// Replace the entry the copy just made for `host` (the last one, an
    /// `Arc` shared with `host`) with one the graph owns alone.
    fn own<T: DeviceCopy>(&mut self, host: Arc<PinnedBuffer<T>>, writable: bool) -> HostSlot<T> {
        self.resources.hosts.pop();
        let index = match Arc::try_unwrap(host) {
            Ok(host) => self.resources.own_host(host, writable),
            // Unreachable: the popped entry was the only other `Arc`. Kept
            // shared, `GraphExec::host` would refuse it, which is safe.
            Err(shared) => {
                self.resources.hosts.push((shared, writable));
                self.resources.hosts.len() - 1
            }
        };
        HostSlot {
            capture: self.id,
            index,
            _marker: PhantomData,
        }
    }

    /// Capture a copy of `src` into the host buffer `dst` on `stream`.
    /// Every replay writes `dst`; host access through its own methods waits
    /// for the replays launched before it (they are tracked like eager
    /// copies), and dropping it waits for all.
    ///
    /// # Safety
    /// A replay launched while the host holds a slice of `dst` (from
    /// `as_slice`, which a shared `Arc` allows) would write under it: no
    /// instance of the graph may be launched while any slice of `dst` is
    /// borrowed.
    pub unsafe fn copy_to_host_unchecked<T, H, S>(
        &mut self,
        stream: &Stream,
        dst: &Arc<H>,
        src: &Arc<S>,
    ) -> Result<()>
    where
        T: DeviceCopy,
        H: HostMemory<T> + Send + Sync + 'static,
        S: DeviceMemory<Elem = T> + Send + Sync + 'static,
    {
        self.check_member(stream)?;
        crate::check_len("Capture::copy_to_host", dst.host_len(), src.device_len())?;
        let src: Arc<dyn Kept> = src.clone();
        self.host_copy_node(stream, src, dst.clone(), HostCopy::ToHost)
    }

    /// One captured copy between a device region and host memory, either
    /// way: the context checks, what the copy touches (for the order
    /// checks), the driver call and what the graph keeps for its replays.
    /// The callers have checked the stream's membership and the lengths.
    fn host_copy_node<H>(
        &mut self,
        stream: &Stream,
        device: Arc<dyn Kept>,
        host: Arc<H>,
        direction: HostCopy,
    ) -> Result<()>
    where
        H: KeptHost + HostUse + 'static,
    {
        let to_device = direction == HostCopy::ToDevice;
        stream.check_context_id("the host buffer", host.host_context_id())?;
        stream.check_context_id("a buffer", device.as_use().use_context_id())?;
        let touches = || {
            [
                Use::Device(device.as_use(), to_device).touch(),
                Use::Host(&*host, !to_device).touch(),
            ]
            .into_iter()
            .collect()
        };
        self.ordered_node(stream, "copy", touches, |capture| {
            let ctx = stream.context();
            ctx.bind()?;
            let host_ptr = host.host_bytes().0 as usize as *mut c_void;
            // SAFETY: both regions hold `bytes` bytes (lengths checked by
            // the callers) and are kept alive by the graph for every
            // replay; a host source is only read, a host destination's
            // access during replays is `copy_to_host_unchecked`'s contract.
            let code = unsafe {
                if to_device {
                    (ctx.driver().cuMemcpyHtoDAsync)(
                        device.ptr(),
                        host_ptr,
                        device.bytes(),
                        stream.as_raw(),
                    )
                } else {
                    (ctx.driver().cuMemcpyDtoHAsync)(
                        host_ptr,
                        device.ptr(),
                        device.bytes(),
                        stream.as_raw(),
                    )
                }
            };
            ctx.check(code)?;
            capture.resources.add_buffer(&device, to_device);
            let kept: Arc<dyn KeptHost> = host.clone();
            capture.resources.add_host(kept, !to_device);
            capture.worked_on(stream);
            Ok(())
        })
    }

    /// Capture a memset of every byte of `dst` to `value` on `stream`.
    pub fn memset_u8<T: DeviceCopy>(
        &mut self,
        stream: &Stream,
        dst: &Arc<DeviceBuffer<T>>,
        value: u8,
    ) -> Result<()> {
        self.check_member(stream)?;
        let dst: Arc<dyn Kept> = dst.clone();
        stream.check_context_id("a buffer", dst.as_use().use_context_id())?;
        let touches = || {
            [Use::Device(dst.as_use(), true).touch()]
                .into_iter()
                .collect()
        };
        self.ordered_node(stream, "memset", touches, |capture| {
            let ctx = stream.context();
            ctx.bind()?;
            // SAFETY: the region holds `bytes` bytes and is kept alive by the
            // graph for every replay.
            let code = unsafe {
                (ctx.driver().cuMemsetD8Async)(dst.ptr(), value, dst.bytes(), stream.as_raw())
            };
            ctx.check(code)?;
            capture.resources.add_buffer(&dst, true);
            capture.worked_on(stream);
            Ok(())
        })
    }

    /// Capture a host callback on `stream`: `f` runs on a driver thread at
    /// every replay, when the replay gets there. As for
    /// [`Stream::add_callback`], `f` must be quick and must not call the
    /// driver; a panic is caught and counted on `stream`
    /// ([`Stream::check_callback_panics`]).
    pub fn add_callback<F>(&mut self, stream: &Stream, f: F) -> Result<()>
    where
        F: Fn() + Send + Sync + 'static,
    {
        self.check_member(stream)?;
        let node = Arc::new(HostNode {
            f: Box::new(f),
            counters: Arc::clone(&stream.counters),
            stream_id: stream.id(),
        });
        let ctx = stream.context();
        ctx.bind()?;
        let data = Arc::as_ptr(&node).cast_mut().cast::<c_void>();
        // SAFETY: the node stays alive while any instance of the graph may
        // run it (kept in the resources, released in stream order); the
        // trampoline only borrows it.
        let code = unsafe {
            (ctx.driver().cuLaunchHostFunc)(stream.as_raw(), Some(host_node_trampoline), data)
        };
        ctx.check(code)?;
        self.callbacks.push(node);
        self.worked_on(stream);
        Ok(())
    }

    /// Fork `branches` into the capture: work captured on each of them from
    /// now on runs after the work captured on `from` so far. Each branch
    /// must be joined back ([`Capture::join`]) before [`Capture::end`].
    ///
    /// `fork` and `join` take the same slice, `&[&Stream]`, as
    /// [`Stream::fork`] and [`Stream::join`] do; an `&Arc<Stream>` in an
    /// array literal coerces to it.
    ///
    /// ```
    /// use cuda_streams_driver::{Context, DeviceBuffer, Stream};
    /// use std::sync::Arc;
    /// # fn main() -> cuda_streams_driver::Result<()> {
    /// let ctx = Context::new(0)?;
    /// let (origin, left, right) = (Stream::new(&ctx)?, Stream::new(&ctx)?, Stream::new(&ctx)?);
    /// let (a, b) = (Arc::new(DeviceBuffer::<u8>::new(&ctx, 64)?), Arc::new(DeviceBuffer::<u8>::new(&ctx, 64)?));
    /// let mut capture = origin.begin_capture()?;
    /// let branches: [&Stream; 2] = [&left, &right];
    /// capture.fork(&origin, &branches)?;
    /// capture.memset_u8(&left, &a, 1)?;
    /// capture.memset_u8(&right, &b, 2)?;
    /// capture.join(&origin, &branches)?;
    /// let graph = capture.end()?;
    /// graph.instantiate()?.launch(&origin)?;
    /// assert_eq!((a.to_vec(&origin)?[0], b.to_vec(&origin)?[0]), (1, 2));
    /// # Ok(())
    /// # }
    /// ```
    pub fn fork(&mut self, from: &Stream, branches: &[&Stream]) -> Result<()> {
        self.check_member(from)?;
        for branch in branches {
            from.check_context("a forked stream", branch.context())?;
            if branch.is_capturing() {
                return Err(Error::StreamCapturing {
                    operation: "Capture::fork",
                    stream: branch.id(),
                });
            }
        }
        let event = from.mark()?;
        for branch in branches {
            // Marked first, so the wait is one inside the capture; under the
            // branch's gate, so no eager work of another thread slips in.
            branch.enter_capture("Capture::fork", || {
                branch
                    .capture
                    .compare_exchange(0, self.id, Ordering::AcqRel, Ordering::Acquire)
                    .map(|_| branch.order.enter_capture())
                    .map_err(|_| Error::StreamCapturing {
                        operation: "Capture::fork",
                        stream: branch.id(),
                    })
            })?;
            if let Err(err) = branch.wait_event(&event) {
                branch.capture.store(0, Ordering::Release);
                branch.order.leave_capture();
                return Err(err);
            }
            self.members.push(Member {
                stream: branch.to_arc(),
                unjoined: true,
            });
        }
        Ok(())
    }

    /// Join `branches` back into `into`: work captured on `into` from now on
    /// runs after the work captured on each branch so far.
    pub fn join(&mut self, into: &Stream, branches: &[&Stream]) -> Result<()> {
        self.check_member(into)?;
        for branch in branches {
            self.check_member(branch)?;
        }
        into.join(branches)?;
        let into_origin = into.id() == self.origin.id();
        let mut carried = false;
        for member in &mut self.members {
            if branches.iter().any(|b| b.id() == member.stream.id()) && member.unjoined {
                member.unjoined = false;
                carried = true;
            }
        }
        if carried
            && !into_origin
            && let Some(member) = self.members.iter_mut().find(|m| m.stream.id() == into.id())
        {
            member.unjoined = true;
        }
        Ok(())
    }

    /// End the capture and return the graph. Fails, leaving the capture
    /// open and usable, while a forked stream has work not joined back into
    /// the origin ([`Error::CaptureUnjoined`]).
    ///
    /// The nodes are checked within the graph's own order (its forks and
    /// joins) as they are captured: under [`crate::OrderPolicy::Check`] two
    /// nodes on different branches that touch the same bytes, one writing,
    /// with no path between them, end the capture with
    /// [`Error::UnorderedAccess`] naming both (the graph is discarded, every
    /// stream leaves the capture); `Report` logs them and returns the graph;
    /// `Auto` captured a wait between the branches when the later node was
    /// captured, so there is nothing left to tell.
    pub fn end(&mut self) -> Result<Graph> {
        self.check_open()?;
        if let Some(member) = self.members.iter().find(|m| m.unjoined) {
            return Err(Error::CaptureUnjoined {
                stream: member.stream.id(),
                origin: self.origin.id(),
            });
        }
        let order = self.order.take();
        let raw = self.close()?;
        if let Some(order) = order
            && let Err(err) = order.end(&self.origin)
        {
            let ctx = self.origin.context();
            ctx.release_in_drop(format_args!("a refused graph"), "destroying", |driver| {
                // SAFETY: the graph was just made, never handed out, and is
                // destroyed once.
                unsafe { (driver.cuGraphDestroy)(raw) }
            });
            return Err(err);
        }
        self.resources.callbacks = Arc::new(std::mem::take(&mut self.callbacks));
        Ok(Graph {
            ctx: Arc::clone(self.origin.context()),
            raw,
            lock: Mutex::new(()),
            resources: Arc::new(std::mem::take(&mut self.resources)),
            nodes: self.nodes,
        })
    }

    /// End the capture at the driver; every stream leaves it.
    fn close(&mut self) -> Result<CUgraph> {
        self.open = false;
        let ctx = self.origin.context();
        let mut raw: CUgraph = std::ptr::null_mut();
        let ended = ctx.bind().and_then(|()| {
            // SAFETY: the origin is live and capturing; valid out-pointer.
            ctx.check(unsafe { (ctx.driver().cuStreamEndCapture)(self.origin.as_raw(), &mut raw) })
        });
        self.origin.order.leave_capture();
        self.origin.capture.store(0, Ordering::Release);
        for member in &self.members {
            member.stream.order.leave_capture();
            member.stream.capture.store(0, Ordering::Release);
        }
        ctx.captures.fetch_sub(1, Ordering::AcqRel);
        tracing::debug!(
            stream = self.origin.id(),
            capture = self.id,
            nodes = self.nodes,
            "stream capture ended"
        );
        ended.map(|()| raw)
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        if !self.open {
            return;
        }
        // Joined first, so the driver ends the capture of every stream (an
        // unjoined fork could otherwise leave a stream capturing on a GPU).
        let unjoined: Vec<Arc<Stream>> = self
            .members
            .iter()
            .filter(|m| m.unjoined)
            .map(|m| Arc::clone(&m.stream))
            .collect();
        let branches: Vec<&Stream> = unjoined.iter().map(|s| &**s).collect();
        if !branches.is_empty()
            && let Err(err) = self.origin.join(&branches)
        {
            tracing::warn!("joining the forks of a dropped capture: {err}");
        }
        match self.close() {
            Ok(raw) => {
                let ctx = self.origin.context();
                ctx.release_in_drop(format_args!("a discarded graph"), "destroying", |driver| {
                    // SAFETY: the graph was just made and is destroyed once.
                    unsafe { (driver.cuGraphDestroy)(raw) }
                });
            }
            Err(err) => tracing::warn!("ending a dropped capture: {err}"),
        }
    }
}

impl fmt::Debug for Capture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Capture")
            .field("origin", &self.origin.id())
            .field("id", &self.id)
            .field("nodes", &self.nodes)
            .field("open", &self.open)
            .finish()
    }
}

/// Every buffer of `args` must be of `stream`'s context.
fn check_args_context(stream: &Stream, args: &[GraphArg]) -> Result<()> {
    for (memory, _) in args.iter().filter_map(GraphArg::buffer) {
        stream.check_context_id("a buffer", memory.as_use().use_context_id())?;
    }
    Ok(())
}

/// Which way a captured host copy goes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum HostCopy {
    ToDevice,
    ToHost,
}
