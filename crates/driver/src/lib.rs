//! Safe RAII layer over the CUDA driver: the same code runs on NVIDIA's driver
//! and on the software driver.
//!
//! # A walk-through
//!
//! ```
//! use cuda_streams_driver::{Context, DeviceBuffer, PinnedBuffer, Stream, StreamPriority};
//! use std::sync::mpsc;
//!
//! # fn main() -> cuda_streams_driver::Result<()> {
//! // The device's primary context (driver chosen by CUDA_STREAMS_DRIVER).
//! let ctx = Context::new(0)?;
//! // A non-blocking stream at the device's greatest priority.
//! let stream = Stream::new_with_priority(&ctx, StreamPriority::High)?;
//!
//! // Page-locked host memory can be copied asynchronously.
//! let input = PinnedBuffer::from_slice(&ctx, &[1u32, 2, 3, 4])?;
//! let mut device = DeviceBuffer::<u32>::new_async(&stream, 4)?; // freed in stream order
//! let mut output = PinnedBuffer::<u32>::new(&ctx, 4)?;
//! stream.copy_from_host_async(&mut device, &input)?;
//! stream.copy_to_host_async(&mut output, &device)?;
//!
//! // A callback runs when the stream gets there, not at synchronize().
//! let (tx, rx) = mpsc::channel();
//! stream.add_callback(move || tx.send("copies done").unwrap())?;
//! assert_eq!(rx.recv().unwrap(), "copies done");
//!
//! stream.synchronize()?;
//! assert_eq!(output.as_slice()?, &[1, 2, 3, 4]);
//! let metrics = stream.metrics();
//! assert_eq!((metrics.memory_transfers, metrics.bytes_transferred), (2, 32));
//! # Ok(())
//! # }
//! ```
//!
//! # The pieces
//!
//! - [`driver`] / [`select`]: which implementation fills the function table.
//! - [`Context`]: a device's primary context, shared as `Arc<Context>` by every
//!   handle. [`Context::bind`] makes it current on the calling thread; it is
//!   cached per thread, and every method here binds first, so handles work
//!   from any thread.
//! - [`Stream`]: priorities ([`StreamPriority`] mapped onto the device's
//!   [`PriorityRange`]), copies, memsets, prefetches, callbacks, kernel
//!   launches, event waits, and [`StreamMetrics`].
//! - [`Event`]: plain or timing; record, query, synchronize, elapsed time.
//! - [`DeviceBuffer`], [`PinnedBuffer`], [`UnifiedBuffer`] of [`DeviceCopy`]
//!   values; [`DeviceMemory`] / [`DeviceMemoryMut`], the open memory model
//!   every launch, copy and memset takes (the allocator's views and other
//!   crates' buffers implement it too).
//! - [`Module`], [`Kernel`], [`LaunchConfig`], [`KernelArg`], [`ArgKind`]:
//!   kernels with declared signatures ([`sys::signature`]) launch safely
//!   through [`Stream::launch`]; others only through the `unsafe`
//!   [`Stream::launch_unchecked`].
//! - Graphs: [`Stream::begin_capture`] returns a [`Capture`]; work enqueued
//!   through it (forked to other streams and joined back) becomes a
//!   [`Graph`], instantiated as a [`GraphExec`] that replays it on any stream
//!   for a fraction of the launch cost, and can be updated in place.
//! - Futures: [`Stream::completion`], [`Event::wait_async`] (and `.await` on
//!   `&Event`), [`Stream::copy_to_host_future`] resolve through the context's
//!   [`Reactor`], which watches flags the streams write into mapped pinned
//!   memory. Runtime-agnostic: only `std::task`.
//! - [`Error`]: one enum for everything; driver failures carry the `CUresult`.
//!
//! Three levels, as in cudarc: the raw function table ([`sys`]), the result
//! layer ([`result`]: one checked wrapper per call the crates above need,
//! `unsafe` where the caller must keep a contract) and the safe types. The
//! other crates of the workspace call only the last two.
//!
//! Raw access for interop: `as_raw()` on every handle, [`Stream::from_raw`],
//! [`KernelArg::raw_pointer`] (unchecked launches only), and
//! [`Context::driver`] for the function table.
//!
//! # The safety design
//!
//! GPU work is asynchronous: a call returns once the work is *enqueued*, and
//! the memory it touches must outlive the work, not the call. Two rules make
//! that hold for safe code.
//!
//! **1. Host memory used by an asynchronous copy stays alive and untouched
//! until the stream has passed the copy.** Asynchronous copies take only
//! [`PinnedBuffer`] and [`UnifiedBuffer`] as host memory ([`HostMemory`]).
//! Each such buffer remembers its outstanding uses as one event per stream
//! that used it (created on first use, re-recorded after each later use).
//! Host access waits for them: [`PinnedBuffer::as_slice`] for the uses that
//! write the buffer, [`PinnedBuffer::as_mut_slice`] and `Drop` for all. Copies
//! writing the buffer need `&mut`, so no slice can be borrowed while one is
//! enqueued. Plain slices get a synchronous form ([`Stream::copy_from_host`],
//! [`Stream::copy_to_host`]: enqueue, then wait for that copy) and an
//! `unsafe` asynchronous form ([`Stream::copy_from_host_async_unchecked`]) with
//! its contract written beside it.
//!
//! **2. Every device free is stream-ordered after every use.** A
//! [`DeviceBuffer`] from [`DeviceBuffer::new_async`] has a *home stream*.
//! Using it on another stream (a copy, a memset, a kernel argument) records an
//! event on that stream (one per buffer and stream, re-recorded: one
//! `cuEventRecord` per use; nothing extra on the home stream), and the first
//! such use makes that stream wait until the home stream has passed the
//! allocation. On `Drop` the home stream waits on those events
//! (`cuStreamWaitEvent`) and the memory is freed with `cuMemFreeAsync` there:
//! the host does not block. Buffers from `cuMemAlloc` ([`DeviceBuffer::new`])
//! and unified buffers wait for their events on the host, then free. Streams
//! used by a buffer need not outlive it; its home stream does (it holds an
//! `Arc`). So safe code cannot make the GPU read or write freed memory.
//!
//! **3. The GPU writes only what it was lent mutably, and only as much as it
//! was lent.** A checked launch ([`Stream::launch`]) compares every argument
//! with the kernel's declared signature: exact scalar types, buffers of the
//! declared element type holding every element the kernel is told to touch
//! (the extent names the count parameter), and `&mut` for every parameter
//! the kernel writes. The signature is the one the kernel's image declared
//! when it was loaded ([`ModuleImage`]), validated then; no safe call can
//! declare or change one. A shared borrow lends memory for reading only, so no
//! host slice (`UnifiedBuffer::as_slice`) sees a GPU write. Kernels whose
//! parameters the library cannot know launch through `unsafe`
//! [`Stream::launch_unchecked`]. [`borrow_rules`] shows each rule as code
//! that does not compile.
//!
//! What stays the caller's job, as in CUDA: ordering the *contents* of a buffer
//! between streams (a write on one stream and a read on another need
//! [`Stream::wait_event`]). That is a data race on device memory, not a
//! use-after-free. `Drop` never panics: failures are logged, and memory that
//! could still be in use is leaked rather than freed. Callbacks run on a driver
//! thread and must not call the driver (methods there return
//! [`Error::InsideCallback`]); their panics are caught.

#![cfg_attr(docsrs, feature(doc_cfg))]

/// The examples of `docs/ordering.md`, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/ordering.md")]
mod ordering_docs {}

pub mod borrow_rules;
mod enqueue;
mod features;
mod ground;
pub mod nvtx;
mod objects;
mod settings;

pub use enqueue::order;
#[cfg(any(feature = "cudarc", feature = "cust"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "cudarc", feature = "cust"))))]
pub use features::interop;
pub use ground::arch::Arch;
pub use objects::result;

pub use enqueue::external::{BufferUse, PreparedWork};
pub use enqueue::gate::EnqueueGate;
pub use features::callback::panic_message;
pub use features::copy::check_len;
pub use features::declare::GridDependencySync;
/// What a [`ModuleImage`] declares per kernel: its name, parameters and CPU
/// twin (the software driver's).
pub use features::declare::{
    Declared, DeclaredKernel, LaunchDims, Thread, Twin, TwinArgs, set_conditional,
};
pub use features::future::{Completion, CopyFuture};
pub use features::graph::{
    CONDITIONAL_DRIVER_VERSION, Capture, Condition, DeviceNode, Graph, GraphArg, GraphBuffer,
    GraphExec, GraphMemoryShare, GraphMemoryUsage, HostSlot, KernelNode, MULTI_BODY_DRIVER_VERSION,
    NodeScalar, ScalarTable,
};
pub use features::ipc::{IpcChannel, IpcListener, IpcToken, SharedDeviceBuffer, SharedEvent};
pub use features::kernel_arg::KernelArg;
pub use features::kernel_decl::KernelDecl;
pub use features::launch_config::LaunchConfig;
pub use features::module::{Kernel, Module, ModuleImage};
pub use features::pdl_policy::{PDL_SETTING, PdlPolicy};
pub use features::program::{CACHE_ENV, CACHE_SETTING, CompiledProgram, Compiler, Output, Program};
pub use features::reactor::{Reactor, ReactorConfig, ReactorStats, WakeMode};
pub use ground::arg_kind::ArgKind;
pub use ground::callback_thread::in_stream_callback;
pub use ground::error::{Error, Result};
pub use ground::id_hash::{IdBuildHasher, IdHasher, IdMap};
pub use ground::loaded_driver::{DriverKind, LoadedDriver};
pub use ground::select::{DRIVER_ENV, DRIVER_SETTING, DriverChoice, driver, select};
pub use ground::units::{format_bytes, format_duration};
pub use objects::completion_trail::{CompletionTrail, TrailSearch};
pub use objects::context::{Context, DeviceInfo};
pub use objects::event::{Event, EventFlags};
pub use objects::event_pool::{
    EventPool, EventPoolBuilder, EventPoolUtilization, LocalShelf, PooledEvent, UniqueEvent,
};
pub use objects::memory::{
    DeviceBuffer, DeviceCopy, DeviceMemory, DeviceMemoryMut, DeviceSlice, DeviceSliceMut,
    DeviceView, HostMemPool, HostMemory, HostRegistered, MemPool, PinnedBuffer, PinnedRegion,
    RegionOwner, ReturnedRegion, SharedDeviceSlice, StreamUse, UnifiedBuffer, region_bytes,
};
pub use objects::metrics::{StreamCounters, StreamMetrics};
pub use objects::partition::{Partition, Partitions, Sms};
pub use objects::per_device::{PerDevice, UnknownDevice};
pub use objects::priority::{PriorityRange, StreamPriority};
pub use objects::stream::{Stream, WorkObserver};
pub use order::{ORDERING_SETTING, OrderPolicy, OrderStats, Race, RaceOp};
pub use settings::{DRIVER_SETTINGS, check_env};
pub use soft_driver::{KernelTwin, TwinSpec};
/// The raw bindings this crate is built on, for interop and raw calls.
pub use sys;

/// The loom shim's cell (`loom_shim!`), named from the crates that expand it.
#[doc(hidden)]
pub use ground::sync::StdCell as __LoomShimCell;
