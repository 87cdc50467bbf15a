//! Memory that knows capture: [`GraphBuffer`], device memory allocated
//! *inside* a graph by an allocation node and freed by a free node of the
//! same graph, so that a replayed graph takes its scratch memory from the
//! device's graph memory, which graphs launched into one stream share,
//! instead of each graph holding memory of its own between replays.
//!
//! # Why a graph buffer is not a `DeviceBuffer`
//!
//! [`Capture::graph_buffer`] records `cuMemAllocAsync` on the capturing
//! stream: CUDA (11.4 and later) turns it into an allocation node, whose
//! address is fixed for the life of the graph, and the capture's end
//! records the matching free (`cuMemFreeAsync`) as the graph's last node.
//! The memory behind that address exists only while a replay runs between
//! the two nodes; the rest of the time the driver may have mapped the same
//! physical memory to another graph's allocation. So a safe API must never
//! let the host or eager work touch it:
//!
//! - a [`GraphBuffer`] has no host view, no length-taking eager method, and
//!   is no [`DeviceMemory`](crate::DeviceMemory): no eager copy, launch or
//!   download accepts it;
//! - it is only an argument of work captured into the graph that allocated
//!   it (its launches through [`GraphArg::graph`], [`Capture::memset_graph`],
//!   [`Capture::copy_to_graph`], [`Capture::copy_from_graph`]), including
//!   the bodies of that graph's conditional nodes. Any other capture refuses
//!   it with [`Error::GraphMemory`], naming both captures;
//! - it is freed *in the graph*, never at the graph's destruction: every
//!   replay allocates and frees it, and nothing outlives the replay. Its
//!   contents do not survive from one replay to the next.
//!
//! A graph with memory nodes has one executable instance at a time (CUDA
//! refuses a second, [`Error::GraphMemory`] here, until the first is
//! dropped), and cannot be updated in place ([`GraphExec::update`]): the
//! addresses its kernels were given belong to its own allocation nodes.
//! A conditional node's body cannot allocate (CUDA allows no memory nodes
//! there); allocate in the top-level capture and pass the buffer in.
//!
//! Where graphs launched into one stream share memory, and how to make
//! several graphs share on purpose, see [`GraphMemoryShare`](super::GraphMemoryShare); what the
//! device's graph memory holds, see [`GraphMemoryUsage`](super::GraphMemoryUsage).
//!
//! ```
//! use cuda_streams_driver::{Context, DeviceBuffer, GraphArg, LaunchConfig, Module, Stream};
//! use std::sync::Arc;
//! # fn main() -> cuda_streams_driver::Result<()> {
//! let ctx = Context::new(0)?;
//! let stream = Stream::new(&ctx)?;
//! let fill = Module::load(&ctx, &kernels::ELEMENTWISE)?.function("fill_f32")?;
//! let out = Arc::new(DeviceBuffer::<f32>::new(&ctx, 256)?);
//!
//! let mut capture = stream.begin_capture()?;
//! let scratch = capture.graph_buffer::<f32>(&stream, 256)?; // an allocation node
//! let args = [GraphArg::from(256u64), 1.5f32.into(), GraphArg::graph(&scratch, true)];
//! capture.launch(&stream, &fill, LaunchConfig::for_num_elems(256), &args)?;
//! capture.copy_from_graph(&stream, &out, &scratch)?;
//! let graph = capture.end()?; // ends with the free node
//!
//! let exec = graph.instantiate()?;
//! for _ in 0..3 {
//!     exec.launch(&stream)?; // each replay allocates and frees the scratch
//! }
//! assert_eq!(out.to_vec(&stream)?, vec![1.5; 256]);
//! # Ok(())
//! # }
//! ```

use super::allocation::GraphAllocation;
use super::args::{GraphArg, Kept};
use super::capture::Capture;
use crate::ground::error::{Error, Result};
use crate::objects::memory::{DeviceBuffer, DeviceCopy, DeviceMemory, byte_size};
use crate::objects::stream::Stream;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use sys::CUdeviceptr;

/// Device memory of one graph, allocated and freed by the graph itself at
/// every replay ([`Capture::graph_buffer`]); usable only as an argument of
/// work captured into that graph. It has no host view and is no
/// [`DeviceMemory`]: its memory exists only while a replay runs between
/// the graph's allocation and free nodes, and the driver may map the same
/// physical memory to another graph's allocation the rest of the time.
///
/// It is a handle: cloning it names the same memory, and dropping it frees
/// nothing (the graph's free node does).
///
/// Outside its graph it cannot even be named by a capture:
///
/// ```
/// use cuda_streams_driver::{Context, DeviceBuffer, Stream};
/// use std::sync::Arc;
/// # fn main() -> cuda_streams_driver::Result<()> {
/// let ctx = Context::new(0)?;
/// let stream = Stream::new(&ctx)?;
/// let out = Arc::new(DeviceBuffer::<u8>::new(&ctx, 64)?);
/// let mut first = stream.begin_capture()?;
/// let scratch = first.graph_buffer::<u8>(&stream, 64)?;
/// first.memset_graph(&stream, &scratch, 7)?;
/// let _graph = first.end()?;
///
/// let mut second = stream.begin_capture()?;
/// let err = second.copy_from_graph(&stream, &out, &scratch).unwrap_err();
/// assert!(err.to_string().contains("belongs to the graph of capture"), "{err}");
/// # Ok(())
/// # }
/// ```
///
/// and no eager call takes it:
///
/// ```compile_fail
/// use cuda_streams_driver::{Context, Stream};
/// let ctx = Context::new(0).unwrap();
/// let stream = Stream::new(&ctx).unwrap();
/// let mut capture = stream.begin_capture().unwrap();
/// let scratch = capture.graph_buffer::<f32>(&stream, 4).unwrap();
/// drop(capture.end());
/// let _ = scratch.to_vec(&stream); // no host view: it exists only during a replay
/// ```
pub struct GraphBuffer<T> {
    memory: Arc<GraphAllocation>,
    len: usize,
    _marker: PhantomData<fn() -> T>,
}

impl<T> Clone for GraphBuffer<T> {
    fn clone(&self) -> Self {
        Self {
            memory: Arc::clone(&self.memory),
            len: self.len,
            _marker: PhantomData,
        }
    }
}

impl<T> GraphBuffer<T> {
    /// Its elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always `false`: zero-length buffers are refused.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The id of the capture whose graph allocates and frees it.
    pub fn capture_id(&self) -> u64 {
        self.memory.family
    }

    /// Its device address during a replay (the same at every replay of its
    /// graph); nothing is there outside one.
    pub fn device_ptr(&self) -> CUdeviceptr {
        self.memory.ptr
    }

    fn kept(&self) -> Arc<dyn Kept> {
        Arc::clone(&self.memory) as Arc<dyn Kept>
    }
}

impl<T> fmt::Debug for GraphBuffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GraphBuffer")
            .field("ptr", &format_args!("{:#x}", self.memory.ptr))
            .field("len", &self.len)
            .field("capture", &self.memory.family)
            .finish()
    }
}

impl GraphArg {
    /// `buffer`, memory of the graph being captured, lent to every replay
    /// (for writing when `writable`). Only a capture of the graph that
    /// allocated it accepts it.
    pub fn graph<T: DeviceCopy>(buffer: &GraphBuffer<T>, writable: bool) -> Self {
        GraphArg::kept(buffer.kept(), writable)
    }
}

impl Capture {
    /// `len` elements of device memory allocated by the graph, on `stream`
    /// (the origin or a stream forked in): an allocation node, ordered
    /// after the work captured on `stream` so far, and a free node at the
    /// end of the graph ([`Capture::end`]). See [`GraphBuffer`].
    ///
    /// Refused for zero elements, in a conditional node's body, and by a
    /// driver without memory nodes (before CUDA 11.4).
    pub fn graph_buffer<T: DeviceCopy>(
        &mut self,
        stream: &Stream,
        len: usize,
    ) -> Result<GraphBuffer<T>> {
        self.check_member(stream)?;
        let bytes = byte_size::<T>("GraphBuffer", len)?;
        if !self.owns_graph {
            return Err(Error::GraphMemory {
                reason: format!(
                    "capture {} is the body of a conditional node, which CUDA allows no memory \
                     nodes in: allocate in the top-level capture {} and pass the buffer in",
                    self.id, self.family
                ),
            });
        }
        let ctx = stream.context();
        ctx.bind()?;
        let mut ptr: CUdeviceptr = 0;
        // SAFETY: a live stream of the current context, capturing into this
        // capture's graph: the call records an allocation node; valid
        // out-pointer.
        ctx.check(unsafe { (ctx.driver().cuMemAllocAsync)(&mut ptr, bytes, stream.as_raw()) })?;
        let memory = Arc::new(GraphAllocation {
            ptr,
            bytes,
            elem: T::SCALAR,
            context_id: ctx.id(),
            family: self.family,
        });
        self.graph_memory.push(Arc::clone(&memory));
        self.worked_on(stream);
        Ok(GraphBuffer {
            memory,
            len,
            _marker: PhantomData,
        })
    }

    /// Capture a memset of every byte of the graph's memory `dst` to
    /// `value` on `stream`.
    pub fn memset_graph<T: DeviceCopy>(
        &mut self,
        stream: &Stream,
        dst: &GraphBuffer<T>,
        value: u8,
    ) -> Result<()> {
        self.memset_kept(stream, dst.kept(), value)
    }

    /// Capture a copy of `src` (any device memory) into the graph's memory
    /// `dst` (equal lengths) on `stream`.
    pub fn copy_to_graph<T, S>(
        &mut self,
        stream: &Stream,
        dst: &GraphBuffer<T>,
        src: &Arc<S>,
    ) -> Result<()>
    where
        T: DeviceCopy,
        S: DeviceMemory<Elem = T> + Send + Sync + 'static,
    {
        crate::features::copy::check_len("Capture::copy_to_graph", dst.len(), src.device_len())?;
        self.copy_kept(stream, dst.kept(), Arc::clone(src) as Arc<dyn Kept>)
    }

    /// Capture a copy of the graph's memory `src` into `dst` (equal
    /// lengths) on `stream`: how a replay's result leaves the graph.
    pub fn copy_from_graph<T: DeviceCopy>(
        &mut self,
        stream: &Stream,
        dst: &Arc<DeviceBuffer<T>>,
        src: &GraphBuffer<T>,
    ) -> Result<()> {
        crate::features::copy::check_len("Capture::copy_from_graph", dst.len(), src.len())?;
        self.copy_kept(stream, Arc::clone(dst) as Arc<dyn Kept>, src.kept())
    }

    /// `Ok` when `memory` may be used by this capture: of `stream`'s
    /// context, and, for a graph's memory, of this capture's graph.
    pub(super) fn check_kept(&self, stream: &Stream, memory: &dyn Kept) -> Result<()> {
        stream.check_context_id("a buffer", memory.as_use().use_context_id())?;
        match memory.graph_family() {
            Some(family) if family != self.family => Err(Error::GraphMemory {
                reason: format!(
                    "the graph buffer at {:#x} belongs to the graph of capture {family}, not to \
                     capture {}'s: a graph's memory exists only while that graph replays",
                    memory.ptr(),
                    self.family
                ),
            }),
            _ => Ok(()),
        }
    }

    /// The free nodes of every graph buffer this capture allocated, on the
    /// origin (every stream is joined back by now, so they come after all
    /// the work that used them).
    pub(super) fn free_graph_memory(&mut self) -> Result<()> {
        let ctx = self.origin.context();
        ctx.bind()?;
        // One at a time, so that a failure leaves the ones not yet freed to
        // a second `Capture::end`.
        while let Some(memory) = self.graph_memory.first() {
            // SAFETY: an allocation node of this capture's graph, freed once
            // (removed from the list below); the origin is live and
            // capturing: the call records a free node.
            ctx.check(unsafe { (ctx.driver().cuMemFreeAsync)(memory.ptr, self.origin.as_raw()) })?;
            self.resources.graph_memory_bytes += memory.bytes;
            self.nodes += 1;
            self.graph_memory.remove(0);
        }
        Ok(())
    }
}
