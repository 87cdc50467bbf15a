//! The nodes a [`Capture`] records: kernel launches, work another crate
//! enqueues, copies, memsets and host callbacks, and the memory a graph
//! owns. Each checks its stream and its buffers (a node that touches
//! memory, its place in the graph's order too), makes its driver call, and
//! keeps what the replays need.

use super::args::{ArgInner, GraphArg, HostNode, HostSlot, Kept, KeptHost, host_node_trampoline};
use super::capture::Capture;
use crate::enqueue::order::Touches;
use crate::enqueue::protocol::Use;
use crate::features::kernel_arg::KernelArg;
use crate::features::launch_config::LaunchConfig;
use crate::features::launch_raw::{LaunchAttrs, launch_raw};
use crate::features::module::Kernel;
use crate::features::pdl_policy::Dependency;
use crate::ground::error::{Error, Result};
use crate::objects::memory::sealed::HostUse;
use crate::objects::memory::{DeviceBuffer, DeviceCopy, DeviceMemory, HostMemory, PinnedBuffer};
use crate::objects::stream::Stream;
use std::any::Any;
use std::ffi::c_void;
use std::marker::PhantomData;
use std::sync::Arc;

impl Capture {
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
        self.launch_checked(stream, kernel, config, args, Dependency::Stream, false)
    }

    /// [`Capture::launch`], after the node before it as `dependency` says
    /// (an ordinary edge, or a programmatic one), as a device-updatable
    /// node when `device_updatable` (`device_update.rs`).
    pub(super) fn launch_checked(
        &mut self,
        stream: &Stream,
        kernel: &Kernel,
        config: LaunchConfig,
        args: &[GraphArg],
        dependency: Dependency,
        device_updatable: bool,
    ) -> Result<()> {
        let lent: Vec<KernelArg<'_>> = args.iter().map(GraphArg::arg).collect();
        kernel.check_args(&lent)?;
        // SAFETY: every argument matches the kernel's declared parameters
        // (checked above), as in `Stream::launch`.
        unsafe { self.launch_node(stream, kernel, config, args, dependency, device_updatable) }
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
        // SAFETY: the caller's contract.
        unsafe { self.launch_node(stream, kernel, config, args, Dependency::Stream, false) }
    }

    /// The launch node, programmatic as `dependency` decides
    /// (`features/dependent_launch.rs`): capture turns a programmatic launch
    /// into a programmatic edge from the node before it. A device-updatable
    /// node when `device_updatable` (`device_update.rs`).
    ///
    /// # Safety
    /// As for [`Capture::launch_unchecked`].
    pub(super) unsafe fn launch_node(
        &mut self,
        stream: &Stream,
        kernel: &Kernel,
        config: LaunchConfig,
        args: &[GraphArg],
        dependency: Dependency,
        device_updatable: bool,
    ) -> Result<()> {
        self.check_member(stream)?;
        config.validate()?;
        stream.check_context("the kernel", kernel.context())?;
        let programmatic = dependency.resolve(kernel, stream.context().info())?;
        self.check_args(stream, args)?;
        self.check_conditions(kernel, args)?;
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
            let function = stream.function_for(kernel)?;
            // SAFETY: a live stream of the current context and the kernel's
            // function for it; the buffers are kept alive by the graph's
            // resources (pushed below) for every replay; the arguments'
            // meaning is the caller's contract.
            let code = unsafe {
                launch_raw(
                    ctx.driver(),
                    stream.as_raw(),
                    function,
                    config,
                    &lent,
                    LaunchAttrs {
                        programmatic,
                        device_updatable,
                    },
                )
            };
            ctx.check(code)?;
            capture.resources.add_args(args);
            capture.resources.add_kernel(kernel);
            if let Some(partition) = stream.partition() {
                // The replays launch the partition's copy of the kernel.
                capture.resources.add_external(partition.keep_alive());
            }
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
        self.check_args(stream, args)?;
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
    /// For scratch that lives only during a replay, and that graphs launched
    /// into one stream share, use [`Capture::graph_buffer`] instead.
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
        crate::features::copy::check_len("Capture::copy", dst.device_len(), src.device_len())?;
        self.copy_kept(stream, dst.clone(), src.clone())
    }

    /// Capture a device-to-device copy of `src` into `dst` (lengths checked
    /// by the callers): [`Capture::copy`] and the graph-memory copies.
    pub(super) fn copy_kept(
        &mut self,
        stream: &Stream,
        dst: Arc<dyn Kept>,
        src: Arc<dyn Kept>,
    ) -> Result<()> {
        self.check_member(stream)?;
        for memory in [&dst, &src] {
            self.check_kept(stream, &**memory)?;
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
        crate::features::copy::check_len(
            "Capture::copy_from_host",
            dst.device_len(),
            src.host_len(),
        )?;
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
        crate::features::copy::check_len(
            "Capture::copy_to_host",
            dst.host_len(),
            src.device_len(),
        )?;
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
        self.memset_kept(stream, dst.clone(), value)
    }

    /// Capture a memset of every byte of `dst`: [`Capture::memset_u8`] and
    /// [`Capture::memset_graph`].
    pub(super) fn memset_kept(
        &mut self,
        stream: &Stream,
        dst: Arc<dyn Kept>,
        value: u8,
    ) -> Result<()> {
        self.check_member(stream)?;
        self.check_kept(stream, &*dst)?;
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
}

impl Capture {
    /// Every buffer of `args` must be of `stream`'s context, and a graph's
    /// memory of this capture's graph.
    fn check_args(&self, stream: &Stream, args: &[GraphArg]) -> Result<()> {
        for (memory, _) in args.iter().filter_map(GraphArg::buffer) {
            self.check_kept(stream, &**memory)?;
        }
        Ok(())
    }
}

/// Which way a captured host copy goes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum HostCopy {
    ToDevice,
    ToHost,
}
