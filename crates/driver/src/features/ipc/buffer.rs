//! Device memory that another process can map: physical memory made with
//! `cuMemCreate` for POSIX file descriptors, mapped at a reserved range of
//! this process's addresses.

use crate::ground::error::{Error, Result};
use crate::objects::context::Context;
use crate::objects::memory::{
    DeviceCopy, DeviceMemory, DeviceMemoryMut, UseTracker, byte_size, common_accessors,
    device_to_vec,
};
use crate::objects::stream::Stream;
use std::fmt;
use std::marker::PhantomData;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use sys::{
    CUdeviceptr, CUmemAccess_flags, CUmemAccessDesc, CUmemAllocationGranularity_flags,
    CUmemAllocationHandleType, CUmemAllocationProp, CUmemAllocationType,
    CUmemGenericAllocationHandle, CUmemLocation, CUmemLocationType, Ipc,
};

const POSIX_FD: CUmemAllocationHandleType =
    CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;

/// `len` values of `T` in device memory that another process can map
/// (exported over an [`IpcChannel`](crate::IpcChannel), imported there as a
/// `SharedDeviceBuffer` too).
///
/// In each process it is device memory like a [`DeviceBuffer`](crate::DeviceBuffer)
/// made with `DeviceBuffer::new`: a copy or launch argument on any stream of
/// its context; every use records its stream's event, and Drop waits for
/// them before unmapping. The physical memory lives until every process has
/// dropped its buffer (or exited): the driver and the kernel count the
/// references to it, so an exporter that drops its buffer first leaves the
/// importers' intact, and a process that dies gives its share back.
///
/// The *contents* are ordered across processes by a
/// [`SharedEvent`](crate::SharedEvent), as within a process by an event.
///
/// ```
/// use cuda_streams_driver::{Context, SharedDeviceBuffer, Stream};
/// let ctx = Context::new(0).unwrap();
/// let stream = Stream::new(&ctx).unwrap();
/// let mut shared = SharedDeviceBuffer::<u32>::new(&ctx, 1000).unwrap();
/// stream.copy_from_host(&mut shared, &[7; 1000]).unwrap();
/// assert_eq!(shared.to_vec(&stream).unwrap(), vec![7; 1000]);
/// assert!(shared.mapped_bytes() >= 4000);
/// ```
pub struct SharedDeviceBuffer<T: DeviceCopy> {
    ctx: Arc<Context>,
    ipc: &'static Ipc,
    handle: CUmemGenericAllocationHandle,
    ptr: CUdeviceptr,
    len: usize,
    /// Bytes reserved and mapped: `len` values rounded up to the granularity.
    mapped: usize,
    /// The process it was imported from.
    exporter: Option<u32>,
    tracker: UseTracker,
    _marker: PhantomData<T>,
}

fn location(ctx: &Context) -> CUmemLocation {
    CUmemLocation {
        type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        id: ctx.device(),
    }
}

/// The properties of exportable device memory on `ctx`'s device.
fn properties(ctx: &Context) -> CUmemAllocationProp {
    CUmemAllocationProp {
        type_: CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: POSIX_FD,
        location: location(ctx),
        ..CUmemAllocationProp::default()
    }
}

/// The driver's IPC table for `ctx`, or the error naming what it lacks.
pub(super) fn ipc_of(ctx: &Context) -> Result<&'static Ipc> {
    ctx.loaded_driver().ipc()
}

impl<T: DeviceCopy> SharedDeviceBuffer<T> {
    /// Allocate `len` values of exportable device memory on `ctx`'s device
    /// (`cuMemCreate` for POSIX file descriptors, rounded up to the
    /// allocation granularity, mapped here read-write). The contents are
    /// whatever the memory held.
    pub fn new(ctx: &Arc<Context>, len: usize) -> Result<Self> {
        let bytes = byte_size::<T>("SharedDeviceBuffer", len)?;
        let ipc = ipc_of(ctx)?;
        ctx.bind()?;
        let prop = properties(ctx);
        let mut granularity = 0usize;
        // SAFETY: valid pointers to a local and to the properties.
        ctx.check(unsafe {
            (ipc.cuMemGetAllocationGranularity)(
                &mut granularity,
                &prop,
                CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            )
        })?;
        let mapped =
            bytes
                .checked_next_multiple_of(granularity.max(1))
                .ok_or(Error::SizeOverflow {
                    what: "SharedDeviceBuffer",
                    len,
                    elem_size: std::mem::size_of::<T>(),
                })?;
        let mut handle: CUmemGenericAllocationHandle = 0;
        // SAFETY: writes one handle through a valid pointer; the context is current.
        ctx.check(unsafe { (ipc.cuMemCreate)(&mut handle, mapped, &prop, 0) })?;
        Self::map(ctx, ipc, handle, len, mapped, None)
    }

    /// Reserve `mapped` bytes of addresses, map `handle` there and let this
    /// context's device read and write it. Releases `handle` on failure.
    pub(super) fn map(
        ctx: &Arc<Context>,
        ipc: &'static Ipc,
        handle: CUmemGenericAllocationHandle,
        len: usize,
        mapped: usize,
        exporter: Option<u32>,
    ) -> Result<Self> {
        ctx.bind()?;
        let release = |err: Error| {
            // SAFETY: the handle is ours and released once, here.
            let _ = unsafe { (ipc.cuMemRelease)(handle) };
            err
        };
        let mut ptr: CUdeviceptr = 0;
        // SAFETY: writes one address through a valid pointer.
        ctx.check(unsafe { (ipc.cuMemAddressReserve)(&mut ptr, mapped, 0, 0, 0) })
            .map_err(release)?;
        let free_range = |err: Error| {
            // SAFETY: the range was reserved above and is freed once, here.
            let _ = unsafe { (ipc.cuMemAddressFree)(ptr, mapped) };
            release(err)
        };
        // SAFETY: the range was just reserved with this size; the handle is ours.
        ctx.check(unsafe { (ipc.cuMemMap)(ptr, mapped, 0, handle, 0) })
            .map_err(|err| {
                free_range(Error::Ipc {
                    reason: format!(
                        "mapping {mapped} bytes of the shared allocation: {err} (a size that is \
                         not the exporter's is a forged or stale handle)"
                    ),
                })
            })?;
        let access = CUmemAccessDesc {
            location: location(ctx),
            flags: CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: the range is mapped; one descriptor at a valid pointer.
        if let Err(err) = ctx.check(unsafe { (ipc.cuMemSetAccess)(ptr, mapped, &access, 1) }) {
            // SAFETY: mapped above with this size, unmapped once.
            let _ = unsafe { (ipc.cuMemUnmap)(ptr, mapped) };
            return Err(free_range(err));
        }
        Ok(Self {
            ctx: Arc::clone(ctx),
            ipc,
            handle,
            ptr,
            len,
            mapped,
            exporter,
            tracker: UseTracker::default(),
            _marker: PhantomData,
        })
    }

    /// A new descriptor for the physical memory, for another process
    /// (`cuMemExportToShareableHandle`).
    pub(super) fn export_fd(&self) -> Result<OwnedFd> {
        self.ctx.bind()?;
        let mut fd: i32 = -1;
        // SAFETY: for POSIX descriptors the driver writes one int.
        self.ctx.check(unsafe {
            (self.ipc.cuMemExportToShareableHandle)(
                (&mut fd as *mut i32).cast(),
                self.handle,
                POSIX_FD,
                0,
            )
        })?;
        // SAFETY: a descriptor the driver just made for us.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// The physical memory behind `fd` (from another process), as a handle
    /// of this process (`cuMemImportFromShareableHandle`); `fd` is closed.
    pub(super) fn import_fd(
        ctx: &Context,
        ipc: &Ipc,
        fd: OwnedFd,
    ) -> Result<CUmemGenericAllocationHandle> {
        ctx.bind()?;
        let mut handle: CUmemGenericAllocationHandle = 0;
        let number = fd.as_raw_fd();
        // SAFETY: a descriptor we hold, passed by value as CUDA asks; the
        // driver takes its own reference, so ours is closed after.
        let code = unsafe {
            (ipc.cuMemImportFromShareableHandle)(&mut handle, number as usize as *mut _, POSIX_FD)
        };
        ctx.check(code).map_err(|err| Error::Ipc {
            reason: format!(
                "importing descriptor {number}: {err} (not memory exported by a process on this \
                 driver: a forged handle)"
            ),
        })?;
        Ok(handle)
    }

    common_accessors!();

    /// The device address in this process (for raw calls; the buffer keeps
    /// owning it).
    pub fn as_device_ptr(&self) -> CUdeviceptr {
        self.ptr
    }

    /// The bytes reserved and mapped: the size rounded up to the driver's
    /// allocation granularity.
    pub fn mapped_bytes(&self) -> usize {
        self.mapped
    }

    /// The process it was imported from; `None` for the exporter's own.
    pub fn exporter_pid(&self) -> Option<u32> {
        self.exporter
    }

    /// Copy the contents back through `stream`, waiting for the copy.
    pub fn to_vec(&self, stream: &Stream) -> Result<Vec<T>> {
        device_to_vec(stream, self)
    }
}

// SAFETY: `len` values at `ptr` lie in this buffer's mapping (`mapped` bytes,
// at least `len * size_of::<T>()`) on `ctx`'s device, readable and writable
// there; every use records its stream's event and Drop waits for all of them
// before unmapping. There is no host view of the memory in this process.
unsafe impl<T: DeviceCopy> DeviceMemory for SharedDeviceBuffer<T> {
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
        stream.check_driver("the shared device buffer", &self.ctx)
    }

    fn after_device_use(&self, stream: &Stream, write: bool) -> Result<()> {
        self.tracker.record_use(stream, write)
    }
}

// SAFETY: the buffer owns its mapping; `&mut self` is the only way to it in
// this process.
unsafe impl<T: DeviceCopy> DeviceMemoryMut for SharedDeviceBuffer<T> {}

impl<T: DeviceCopy> Drop for SharedDeviceBuffer<T> {
    fn drop(&mut self) {
        crate::enqueue::order::forget(&self.ctx, self.ptr, self.size_in_bytes());
        if let Err(err) = self.tracker.wait_host(&self.ctx, true) {
            tracing::warn!(
                "leaking shared device buffer {:#x} ({} bytes): {err}",
                self.ptr,
                self.mapped
            );
            return;
        }
        let (ipc, ptr, mapped, handle) = (self.ipc, self.ptr, self.mapped, self.handle);
        let what = format_args!("shared device buffer {ptr:#x}");
        // Every use has finished (waited above): unmap, give the addresses
        // back, and drop this process's reference to the physical memory.
        // SAFETY: mapped by `map` with this size, unmapped once.
        self.ctx.release_in_drop(what, "unmapping", |_| unsafe {
            (ipc.cuMemUnmap)(ptr, mapped)
        });
        // SAFETY: reserved by `map` with this size, freed once, unmapped above.
        self.ctx
            .release_in_drop(what, "freeing the addresses of", |_| unsafe {
                (ipc.cuMemAddressFree)(ptr, mapped)
            });
        // SAFETY: the handle is ours, released once.
        self.ctx
            .release_in_drop(what, "releasing", |_| unsafe { (ipc.cuMemRelease)(handle) });
        self.tracker.release_events();
    }
}

impl<T: DeviceCopy> fmt::Debug for SharedDeviceBuffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedDeviceBuffer")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.len)
            .field("mapped", &self.mapped)
            .field("exporter", &self.exporter)
            .finish()
    }
}
