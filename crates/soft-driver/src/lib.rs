//! A software CUDA driver: the `cuda-sys` function table implemented on CPU
//! threads, so that everything above it runs, and is tested, without a GPU.
//!
//! It executes CUDA's semantics rather than returning canned answers:
//!
//! - **devices**: [`device_count`] of them (`CUDA_STREAMS_SOFT_DEVICES`,
//!   default 2), each with its primary context, memory capacity, default
//!   pool and streams; every pair may be peers (`cuCtxEnablePeerAccess`), and
//!   a stream of one device may wait on an event of another;
//! - a **stream** is an in-order queue drained by its own worker thread; work on
//!   different streams runs concurrently; priorities (0 least to -5 greatest)
//!   are stored and reported;
//! - an **event** is a marker in a stream; query/synchronize follow the worker
//!   passing it, elapsed time comes from host clocks read as it passes;
//! - **device memory** is host memory (256-byte aligned, pointers are
//!   addresses), counted against its device's configurable
//!   [`device_capacity`]; kernels and memsets fault on another device's memory
//!   unless peer access is enabled, while copies cross devices freely;
//! - **kernels** run as CPU twins: safe ones ([`Twin`], over checked typed
//!   slices) defined with their declarations ([`define_kernel`]), or raw
//!   ones registered with the `unsafe` escape hatch [`register_image`];
//! - **handles** are checked against registries: a destroyed or foreign handle
//!   is `CUDA_ERROR_INVALID_HANDLE`, never undefined behaviour;
//! - an error during a stream's work (a failed launch, an illegal address) is
//!   **sticky** for its device's whole context, as on a GPU, and a stream that
//!   waits for failed work fails with it; [`faults`] injects launch failures,
//!   out-of-memory and worker delays;
//! - a **software NCCL** ([`nccl`]): communicators over the software devices,
//!   collectives done by the ranks' stream workers over host memory, in
//!   stream order;
//! - **SM partitions** (green contexts, [`green_contexts`]): [`SM_COUNT`] SMs
//!   per device, split in steps of [`SM_GRANULARITY`]; a green context's
//!   streams have workers of their own, so one partition's work never waits
//!   for another's unless an event orders it;
//! - a **host function** that calls the driver is refused
//!   (`CUDA_ERROR_NOT_PERMITTED`, counted by [`refused_in_host_functions`]), as
//!   CUDA may refuse it.
//!
//! Where it differs from a GPU is listed in `docs/testing.md`.
//!
//! ```
//! use cuda_streams_soft_driver as soft;
//! use cuda_streams_soft_driver::sys::{CUresult, CUstream};
//! let table = soft::driver();
//! // SAFETY: every pointer passed is a valid local.
//! unsafe {
//!     let (mut dev, mut ctx, mut stream) = (0, std::ptr::null_mut(), std::ptr::null_mut());
//!     assert_eq!((table.cuDeviceGet)(&mut dev, 0), CUresult::CUDA_SUCCESS);
//!     assert_eq!((table.cuDevicePrimaryCtxRetain)(&mut ctx, dev), CUresult::CUDA_SUCCESS);
//!     assert_eq!((table.cuCtxSetCurrent)(ctx), CUresult::CUDA_SUCCESS);
//!     assert_eq!((table.cuStreamCreateWithPriority)(&mut stream, 0, -9), CUresult::CUDA_SUCCESS);
//!     let mut priority = 0;
//!     (table.cuStreamGetPriority)(stream, &mut priority);
//!     assert_eq!(priority, -5, "clamped to the device's range, as CUDA does");
//!     assert_eq!((table.cuStreamSynchronize)(stream), CUresult::CUDA_SUCCESS);
//!     assert_eq!((table.cuStreamDestroy)(stream), CUresult::CUDA_SUCCESS);
//!     let destroyed: CUstream = stream;
//!     assert_eq!((table.cuStreamQuery)(destroyed), CUresult::CUDA_ERROR_INVALID_HANDLE);
//! }
//! ```
//!
//! This crate is `unsafe` by nature: its entry points are `extern "C"`
//! functions taking raw pointers, with CUDA's contracts.
#![allow(
    non_snake_case,
    reason = "entry points and their parameters keep cuda.h's names"
)]

mod alloc_api;
mod conditional;
mod context;
mod context_api;
mod copy;
mod device;
mod device_node;
mod errors;
mod event;
pub mod faults;
mod graph;
mod graph_edges;
mod graph_exec_params;
mod graph_memory;
mod green;
mod green_contexts;
mod handles;
mod host_pool;
mod host_pool_registry;
mod host_register;
mod ipc_event;
mod launch_dims;
mod launch_ex;
mod memory;
mod modules;
mod nccl;
mod node_handle;
mod ops;
mod pool;
mod pool_stats;
mod shuffle;
mod sticky_errors;
mod stream;
mod stream_api;
mod stream_memops;
mod twin;
mod vmm;

pub use conditional::set_conditional;
pub use context::{primary_context_retains, refused_in_host_functions};
pub use device::{
    DEFAULT_DEVICES, DEVICE_NAME, DEVICES_ENV, DEVICES_SETTING, DRIVER_VERSION, MAX_DEVICES,
    device_count,
};
pub use device_node::{graph_uploads, set_kernel_node_param};
pub use errors::last_error_detail;
pub use green::{SM_COUNT, SM_GRANULARITY};
pub use green_contexts::green_context_groups;
pub use launch_dims::LaunchDims;
pub use launch_ex::programmatic_launches;
pub use memory::{
    ALIGNMENT, CAPACITY_ENV, CAPACITY_SETTING, DEFAULT_CAPACITY, capacity, device_capacity,
    device_memory_in_use, memory_in_use, set_capacity, set_device_capacity,
};
pub use modules::{
    KernelTwin, RegisterError, TwinSpec, define_kernel, module_from_declarations, register_image,
    registered_signature,
};
pub use nccl::{NCCL_VERSION, nccl, nccl_unique_id_process};
pub use shuffle::{SHUFFLE_ENV, SHUFFLE_SETTING, shuffle_seed};
/// The raw bindings the table is made of (and the kernel-signature vocabulary).
pub use sys;
pub use twin::{Thread, Twin, TwinArgs};

use sys::Driver;

/// The settings the software driver reads from the environment, once, at
/// first use: [`DEVICES_SETTING`], [`CAPACITY_SETTING`] and
/// [`SHUFFLE_SETTING`].
pub const SETTINGS: [sys::env::Setting; 3] = [DEVICES_SETTING, CAPACITY_SETTING, SHUFFLE_SETTING];

/// Whether every setting the software driver reads holds a usable value; the
/// first that does not is an error naming the variable and the value. `cuInit`
/// fails with `CUDA_ERROR_INVALID_VALUE` (and this text as
/// [`last_error_detail`]) while one does not, and the driver crate refuses to
/// select the software driver with this error.
///
/// ```
/// // Unset or valid in the doctest's environment.
/// cuda_streams_soft_driver::check_env().unwrap();
/// ```
pub fn check_env() -> Result<(), sys::env::EnvError> {
    device::devices_from_env().clone()?;
    memory::capacity_from_env().clone()?;
    shuffle::seed_from_env().clone()?;
    Ok(())
}

/// The software driver's table: every entry point of [`sys::Driver`],
/// implemented on CPU threads.
pub fn driver() -> &'static Driver {
    use alloc_api::*;
    use conditional::*;
    use context_api::*;
    use copy::*;
    use device::*;
    use device_node::*;
    use errors::*;
    use event::*;
    use graph::*;
    use graph_edges::*;
    use graph_exec_params::*;
    use graph_memory::*;
    use host_register::*;
    use launch_ex::*;
    use modules::*;
    use pool::*;
    use stream_api::*;
    use stream_memops::*;
    static TABLE: Driver = Driver {
        cuInit,
        cuDriverGetVersion,
        cuDeviceGetCount,
        cuDeviceGet,
        cuDeviceGetName,
        cuDeviceGetAttribute,
        cuDeviceTotalMem,
        cuDeviceCanAccessPeer,
        cuDevicePrimaryCtxRetain,
        cuDevicePrimaryCtxRelease,
        cuCtxSetCurrent,
        cuCtxGetCurrent,
        cuCtxSynchronize,
        cuCtxGetStreamPriorityRange,
        cuCtxEnablePeerAccess,
        cuCtxDisablePeerAccess,
        cuStreamCreateWithPriority,
        cuStreamDestroy,
        cuStreamQuery,
        cuStreamSynchronize,
        cuStreamWaitEvent,
        cuStreamGetPriority,
        cuStreamGetFlags,
        cuLaunchHostFunc,
        cuStreamWriteValue32,
        cuEventCreate,
        cuEventDestroy,
        cuEventRecord,
        cuEventQuery,
        cuEventSynchronize,
        cuEventElapsedTime,
        cuMemGetInfo,
        cuMemAlloc,
        cuMemFree,
        cuMemAllocAsync,
        cuMemFreeAsync,
        cuMemAllocFromPoolAsync,
        cuDeviceGetDefaultMemPool,
        cuMemPoolTrimTo,
        cuMemPoolSetAttribute,
        cuMemPoolGetAttribute,
        cuMemHostAlloc,
        cuMemFreeHost,
        cuMemHostGetDevicePointer,
        cuMemHostRegister,
        cuMemHostUnregister,
        cuMemAllocManaged,
        cuMemcpyHtoDAsync,
        cuMemcpyDtoHAsync,
        cuMemcpyDtoDAsync,
        cuMemcpyPeerAsync,
        cuMemsetD8Async,
        cuMemsetD32Async,
        cuMemPrefetchAsync,
        cuModuleLoadData,
        cuModuleUnload,
        cuModuleGetFunction,
        cuLaunchKernel,
        cuLaunchKernelEx,
        cuStreamBeginCapture,
        cuStreamEndCapture,
        cuStreamIsCapturing,
        cuGraphInstantiate,
        cuGraphUpload,
        cuGraphLaunch,
        cuGraphExecUpdate,
        cuGraphExecDestroy,
        cuGraphDestroy,
        cuGraphCreate,
        cuGraphConditionalHandleCreate,
        cuGraphAddNode,
        cuStreamBeginCaptureToGraph,
        cuStreamGetCaptureInfo,
        cuStreamUpdateCaptureDependencies,
        cuGraphAddDependencies,
        cuGraphExecKernelNodeSetParams,
        cuGraphKernelNodeGetAttribute,
        cuDeviceGetGraphMemAttribute,
        cuDeviceSetGraphMemAttribute,
        cuDeviceGraphMemTrim,
        cuGetErrorName,
        cuGetErrorString,
    };
    &TABLE
}

/// The software driver's green-context table: every entry point of
/// [`sys::GreenContexts`] (SM partitions), on the software devices.
///
/// ```
/// use cuda_streams_soft_driver as soft;
/// use cuda_streams_soft_driver::sys::{CUdevResource, CUdevResourceType, CUresult};
/// let green = soft::green_contexts();
/// let (mut all, mut part, mut rest) = (CUdevResource::default(), CUdevResource::default(), CUdevResource::default());
/// let mut groups = 1;
/// // SAFETY: every pointer passed is a valid local.
/// unsafe {
///     let sm = CUdevResourceType::CU_DEV_RESOURCE_TYPE_SM;
///     assert_eq!((green.cuDeviceGetDevResource)(0, &mut all, sm), CUresult::CUDA_SUCCESS);
///     // 12 SMs asked, 16 granted: the granularity is 8.
///     assert_eq!((green.cuDevSmResourceSplitByCount)(&mut part, &mut groups, &all, &mut rest, 0, 12), CUresult::CUDA_SUCCESS);
///     assert_eq!((groups, part.__bindgen_anon_1.sm.smCount, rest.__bindgen_anon_1.sm.smCount), (1, 16, soft::SM_COUNT - 16));
/// }
/// ```
pub fn green_contexts() -> &'static sys::GreenContexts {
    &green::TABLE
}

/// The software driver's table of [`sys::HostPools`]: memory pools of
/// page-locked host memory (`cuMemPoolCreate` with a host location), whose
/// allocations (`cuMemAllocFromPoolAsync`) are stream-ordered host memory
/// every device may use, returned when their stream reaches the free.
///
/// ```
/// use cuda_streams_soft_driver as soft;
/// use cuda_streams_soft_driver::sys::{
///     CUmemAllocationType, CUmemLocation, CUmemLocationType, CUmemPoolProps, CUresult,
/// };
/// let (driver, pools) = (soft::driver(), soft::host_pools());
/// let props = CUmemPoolProps {
///     allocType: CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
///     location: CUmemLocation { type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST, id: 0 },
///     ..CUmemPoolProps::default()
/// };
/// let (mut dev, mut ctx, mut pool) = (0, std::ptr::null_mut(), std::ptr::null_mut());
/// let mut ptr = 0;
/// // SAFETY: every pointer passed is a valid local; the null stream is the
/// // context's default stream.
/// unsafe {
///     assert_eq!((driver.cuDeviceGet)(&mut dev, 0), CUresult::CUDA_SUCCESS);
///     assert_eq!((driver.cuDevicePrimaryCtxRetain)(&mut ctx, dev), CUresult::CUDA_SUCCESS);
///     assert_eq!((driver.cuCtxSetCurrent)(ctx), CUresult::CUDA_SUCCESS);
///     assert_eq!((pools.cuMemPoolCreate)(&mut pool, &props), CUresult::CUDA_SUCCESS);
///     let stream = std::ptr::null_mut();
///     assert_eq!((driver.cuMemAllocFromPoolAsync)(&mut ptr, 4096, pool, stream), CUresult::CUDA_SUCCESS);
///     assert_eq!((driver.cuStreamSynchronize)(stream), CUresult::CUDA_SUCCESS);
///     // Host memory: the host writes it directly.
///     (ptr as *mut u8).write(7);
///     assert_eq!((driver.cuMemFreeAsync)(ptr, stream), CUresult::CUDA_SUCCESS);
///     assert_eq!((pools.cuMemPoolDestroy)(pool), CUresult::CUDA_SUCCESS);
/// }
/// ```
pub fn host_pools() -> &'static sys::HostPools {
    use host_pool::*;
    static TABLE: sys::HostPools = sys::HostPools {
        cuMemPoolCreate,
        cuMemPoolDestroy,
        cuMemPoolSetAccess,
    };
    &TABLE
}

/// The software driver's table of [`sys::Ipc`]: device memory and events
/// shared between processes. Physical memory is a memfd (exported as a
/// POSIX file descriptor), and an interprocess event's state is a shared
/// page, so two real processes share both (see `docs/host-memory.md`).
///
/// ```
/// use cuda_streams_soft_driver as soft;
/// use cuda_streams_soft_driver::sys::{CUresult, CUuuid};
/// let ipc = soft::ipc();
/// let (mut first, mut again) = (CUuuid::default(), CUuuid::default());
/// // SAFETY: every pointer passed is a valid local.
/// unsafe {
///     assert_eq!((ipc.cuDeviceGetUuid)(&mut first, 0), CUresult::CUDA_SUCCESS);
///     assert_eq!((ipc.cuDeviceGetUuid)(&mut again, 0), CUresult::CUDA_SUCCESS);
/// }
/// // The same device has the same UUID in every process.
/// assert_eq!(first.bytes, again.bytes);
/// ```
pub fn ipc() -> &'static sys::Ipc {
    use ipc_event::*;
    use vmm::*;
    static TABLE: sys::Ipc = sys::Ipc {
        cuMemGetAllocationGranularity,
        cuMemCreate,
        cuMemRelease,
        cuMemAddressReserve,
        cuMemAddressFree,
        cuMemMap,
        cuMemUnmap,
        cuMemSetAccess,
        cuMemExportToShareableHandle,
        cuMemImportFromShareableHandle,
        cuIpcGetEventHandle,
        cuIpcOpenEventHandle,
        cuDeviceGetUuid,
    };
    &TABLE
}
