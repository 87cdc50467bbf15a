//! The device's primary context, shared by every handle, and binding it to threads.

use crate::ground::callback_thread::{in_stream_callback, refuse_inside_callback};
use crate::ground::error::{Error, Result};
use crate::ground::loaded_driver::{DriverKind, LoadedDriver};
use crate::ground::select::driver;
use crate::objects::priority::PriorityRange;
use std::any::Any;
use std::cell::Cell;
use std::ffi::CStr;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use sys::{CUcontext, CUdevice, CUdevice_attribute, CUresult, Driver};

thread_local! {
    /// The id of the `Context` this thread last made current (0: none). It
    /// saves a `cuCtxSetCurrent` per call; `Context::still_current` says when
    /// it is trusted alone.
    static CURRENT: Cell<u64> = const { Cell::new(0) };
}

static NEXT_CONTEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Live contexts, so that `Context::new` on the same device shares one handle.
type Registry = Mutex<Vec<(DriverKind, i32, Weak<Context>)>>;
static REGISTRY: Registry = Mutex::new(Vec::new());

/// Every context ever made, by id: its driver, device ordinal and handle, so
/// an error can name the device of memory known only by its context id, and a
/// peer copy can find the context of each side. Ids are never reused; an entry
/// is a few words.
type ById = Mutex<Vec<(u64, DriverKind, i32, Weak<Context>)>>;
static BY_ID: ById = Mutex::new(Vec::new());

/// The driver and device ordinal of the context with id `id`, if one was made.
pub(crate) fn describe(id: u64) -> Option<(DriverKind, i32)> {
    let by_id = BY_ID.lock().unwrap_or_else(|p| p.into_inner());
    by_id
        .iter()
        .find(|(found, ..)| *found == id)
        .map(|&(_, kind, ordinal, _)| (kind, ordinal))
}

/// The live context with id `id`.
pub(crate) fn by_id(id: u64) -> Option<Arc<Context>> {
    let by_id = BY_ID.lock().unwrap_or_else(|p| p.into_inner());
    by_id
        .iter()
        .find(|(found, ..)| *found == id)
        .and_then(|(_, _, _, weak)| weak.upgrade())
}

/// What the driver reports about a device.
///
/// ```
/// let ctx = cuda_streams_driver::Context::new(0).unwrap();
/// let info = ctx.info();
/// let (major, minor) = info.compute_capability;
/// println!("{}: sm_{major}{minor}, {} SMs, {} copy engines, {} MiB",
///          info.name, info.multiprocessor_count, info.async_engine_count,
///          info.total_memory >> 20);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceInfo {
    /// The device ordinal.
    pub ordinal: i32,
    /// The device's name, e.g. `NVIDIA H200`.
    pub name: String,
    /// Compute capability (major, minor).
    pub compute_capability: (u32, u32),
    /// Streaming multiprocessors.
    pub multiprocessor_count: u32,
    /// Total device memory in bytes.
    pub total_memory: usize,
    /// Copy engines that can run alongside kernels.
    pub async_engine_count: u32,
    /// The stream priority range (`cuCtxGetStreamPriorityRange`).
    pub priority_range: PriorityRange,
    /// Whether `cuMemAllocAsync` memory pools are supported.
    pub memory_pools_supported: bool,
    /// Whether managed (unified) memory is supported.
    pub managed_memory: bool,
    /// Whether host and device may touch managed memory at the same time.
    pub concurrent_managed_access: bool,
}

/// A device's primary context. Every handle holds an `Arc<Context>`.
///
/// [`Context::new`] on a device that already has a live `Context` returns the
/// same one, so creating contexts freely is cheap. Dropping the last `Arc`
/// waits for the device to finish the context's work and releases the primary
/// context.
///
/// When that last `Arc` is dropped inside a stream callback, where CUDA
/// forbids driver calls, the wait and the release happen on a short-lived
/// thread (`cuda-streams-context-release`) instead, once the callback has
/// returned; the drop itself makes no driver call.
///
/// ```
/// use cuda_streams_driver::Context;
/// let ctx = Context::new(0).unwrap();
/// let info = ctx.info();
/// assert!(info.multiprocessor_count > 0);
/// assert!(info.priority_range.greatest <= info.priority_range.least);
/// ctx.bind().unwrap(); // cheap: this thread already has it current
/// println!("{} on the {} driver", info.name, ctx.loaded_driver().name());
/// ```
pub struct Context {
    driver: LoadedDriver,
    device: CUdevice,
    raw: CUcontext,
    id: u64,
    info: DeviceInfo,
    /// The service that stands on this context (the reactor that wakes its
    /// futures), made on first use by the layer that defines it.
    service: OnceLock<Box<dyn ContextService>>,
    /// The context's shared event pool while anything holds it
    /// ([`Context::event_pool`], defined beside the pool): weak, since the
    /// pool's events hold the context, and typed by the pool's file so that
    /// this lower file does not name it.
    pub(crate) shared_events: Mutex<Weak<dyn Any + Send + Sync>>,
    /// Ids of the contexts this one has peer access to.
    peers: Mutex<Vec<u64>>,
    /// Stream captures open in this context ([`crate::Capture`]), counted
    /// from just before the driver begins one.
    pub(crate) captures: std::sync::atomic::AtomicUsize,
    /// Held shared by [`Context::synchronize`] from its check of `captures`
    /// through its driver call, and exclusively by a capture while it joins
    /// `captures`: a capture never begins between the two, where the
    /// synchronization would invalidate it.
    sync_gate: std::sync::RwLock<()>,
    /// Modules dropped while a capture was open here (`CUmodule`s, as
    /// addresses): unloaded after the next successful
    /// [`Context::synchronize`], when no kernel of theirs can still run.
    deferred_unloads: Mutex<Vec<usize>>,
    /// The stream-order policy and the accesses to this context's memory.
    pub(crate) order: crate::enqueue::order::ContextOrder,
}

// SAFETY: a CUDA context handle may be used from any thread (that is what
// cuCtxSetCurrent is for); `Context` only hands it to the driver and holds no
// other shared mutable state.
unsafe impl Send for Context {}
// SAFETY: as above; every method takes `&self` and only calls the driver,
// which is thread-safe.
unsafe impl Sync for Context {}

impl Context {
    /// The primary context of device `ordinal` on the selected driver
    /// ([`crate::driver`], from `CUDA_STREAMS_DRIVER`), made current on this thread.
    pub fn new(ordinal: i32) -> Result<Arc<Self>> {
        Self::with_driver(driver()?, ordinal)
    }

    /// The primary context of device `ordinal` on an explicitly chosen driver.
    pub fn with_driver(driver: LoadedDriver, ordinal: i32) -> Result<Arc<Self>> {
        let mut registry = REGISTRY.lock().unwrap_or_else(|p| p.into_inner());
        registry.retain(|(_, _, weak)| weak.strong_count() > 0);
        if let Some(ctx) = registry
            .iter()
            .filter(|(kind, ord, _)| *kind == driver.kind && *ord == ordinal)
            .find_map(|(_, _, weak)| weak.upgrade())
        {
            drop(registry);
            ctx.bind()?;
            return Ok(ctx);
        }
        let ctx = Arc::new(Self::create(driver, ordinal)?);
        registry.push((driver.kind, ordinal, Arc::downgrade(&ctx)));
        BY_ID.lock().unwrap_or_else(|p| p.into_inner()).push((
            ctx.id,
            driver.kind,
            ordinal,
            Arc::downgrade(&ctx),
        ));
        Ok(ctx)
    }

    /// How many devices the selected driver ([`crate::driver`]) reports.
    ///
    /// ```
    /// use cuda_streams_driver::Context;
    /// let count = Context::device_count().unwrap();
    /// assert!(count >= 1);
    /// // Each ordinal below the count has a context; the count itself does not.
    /// assert!(Context::new(count - 1).is_ok());
    /// assert!(Context::new(count).is_err());
    /// ```
    pub fn device_count() -> Result<i32> {
        Self::device_count_with(driver()?)
    }

    /// How many devices `driver` reports (`cuInit`, `cuDeviceGetCount`).
    pub fn device_count_with(driver: LoadedDriver) -> Result<i32> {
        crate::ground::driver_calls::device_count(driver)
    }

    /// The primary context of every device of the selected driver, by ordinal.
    ///
    /// ```
    /// use cuda_streams_driver::Context;
    /// let all = Context::all().unwrap();
    /// for (ordinal, ctx) in all.iter().enumerate() {
    ///     assert_eq!(ctx.ordinal(), ordinal as i32);
    /// }
    /// ```
    pub fn all() -> Result<Vec<Arc<Self>>> {
        let driver = driver()?;
        (0..Self::device_count_with(driver)?)
            .map(|ordinal| Self::with_driver(driver, ordinal))
            .collect()
    }

    /// Whether this context's device can access `peer`'s memory directly
    /// (`cuDeviceCanAccessPeer`); `false` for the same device, and for a
    /// context of another driver.
    ///
    /// ```
    /// use cuda_streams_driver::Context;
    /// let ctx = Context::new(0).unwrap();
    /// assert!(!ctx.can_access_peer(&ctx).unwrap());
    /// if Context::device_count().unwrap() > 1 {
    ///     let other = Context::new(1).unwrap();
    ///     println!("0 -> 1 peer access: {}", ctx.can_access_peer(&other).unwrap());
    /// }
    /// ```
    pub fn can_access_peer(&self, peer: &Context) -> Result<bool> {
        if peer.kind() != self.kind() || peer.device == self.device {
            return Ok(false);
        }
        let mut can = 0;
        // SAFETY: writes one int through a valid pointer; both devices exist.
        self.check(unsafe {
            (self.driver.table.cuDeviceCanAccessPeer)(&mut can, self.device, peer.device)
        })?;
        Ok(can != 0)
    }

    /// Let kernels and memsets of this context touch memory of `peer`
    /// (`cuCtxEnablePeerAccess`), and make copies between them direct. Once
    /// per pair of `Context`s (later calls make no driver call); the access
    /// lasts while both live. `peer` being this context is a no-op.
    ///
    /// Fails with [`Error::PeerAccessUnsupported`] when the devices cannot be
    /// peers ([`Context::can_access_peer`]), and with
    /// [`Error::ContextMismatch`] for a context of another driver.
    ///
    /// ```
    /// use cuda_streams_driver::Context;
    /// let ctx = Context::new(0).unwrap();
    /// ctx.enable_peer_access(&ctx).unwrap(); // itself: nothing to do
    /// if Context::device_count().unwrap() > 1 {
    ///     let other = Context::new(1).unwrap();
    ///     if ctx.can_access_peer(&other).unwrap() {
    ///         ctx.enable_peer_access(&other).unwrap();
    ///         ctx.enable_peer_access(&other).unwrap(); // again: already on
    ///         assert!(ctx.has_peer_access(&other));
    ///     }
    /// }
    /// ```
    pub fn enable_peer_access(&self, peer: &Context) -> Result<()> {
        if peer.id == self.id {
            return Ok(());
        }
        if peer.kind() != self.kind() {
            return Err(Error::ContextMismatch {
                what: "the peer context",
                expected: self.id,
                found: peer.id,
            });
        }
        let mut peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        if peers.contains(&peer.id) {
            return Ok(());
        }
        if !self.can_access_peer(peer)? {
            return Err(Error::PeerAccessUnsupported {
                from: self.ordinal(),
                to: peer.ordinal(),
            });
        }
        self.bind()?;
        // SAFETY: `peer.raw` is a retained primary context, valid while `peer`
        // lives; flags must be 0; this context is current.
        let code = unsafe { (self.driver.table.cuCtxEnablePeerAccess)(peer.raw, 0) };
        match self.driver.table.check(code) {
            Ok(()) => {}
            // Enabled by someone else (raw calls, another library): on is on.
            Err(err) if err.code() == CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => {}
            Err(err) => return Err(err.into()),
        }
        tracing::debug!(
            context = self.id,
            peer = peer.id,
            "peer access from device {} to device {} enabled",
            self.ordinal(),
            peer.ordinal()
        );
        peers.push(peer.id);
        Ok(())
    }

    /// Whether [`Context::enable_peer_access`] has enabled access to `peer`
    /// (or `peer` is this context).
    pub fn has_peer_access(&self, peer: &Context) -> bool {
        peer.id == self.id
            || self
                .peers
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains(&peer.id)
    }

    fn create(driver: LoadedDriver, ordinal: i32) -> Result<Self> {
        let table = driver.table;
        // On the software driver two stream workers never race on the same
        // host memory: `CUDA_STREAMS_ORDERING` asking for a policy that lets
        // them is refused before anything is made.
        let policy = crate::enqueue::order::initial_policy(driver.kind)?;
        let check = |code: CUresult| table.check(code).map_err(Error::from);
        // SAFETY: cuInit takes flags (0) and no pointers.
        check(unsafe { (table.cuInit)(0) })?;
        let mut count = 0;
        // SAFETY: writes one int through a valid pointer.
        check(unsafe { (table.cuDeviceGetCount)(&mut count) })?;
        if ordinal < 0 || ordinal >= count {
            return Err(Error::InvalidDevice { ordinal, count });
        }
        let mut device: CUdevice = 0;
        // SAFETY: writes one CUdevice through a valid pointer; the ordinal is in range.
        check(unsafe { (table.cuDeviceGet)(&mut device, ordinal) })?;
        let mut raw: CUcontext = std::ptr::null_mut();
        // SAFETY: writes one context handle through a valid pointer.
        check(unsafe { (table.cuDevicePrimaryCtxRetain)(&mut raw, device) })?;
        // From here on, dropping `ctx` releases the retain.
        let mut ctx = Self {
            driver,
            device,
            raw,
            id: NEXT_CONTEXT_ID.fetch_add(1, Ordering::Relaxed),
            info: DeviceInfo::default(),
            service: OnceLock::new(),
            shared_events: Mutex::new(Weak::<()>::new()),
            peers: Mutex::default(),
            captures: std::sync::atomic::AtomicUsize::new(0),
            sync_gate: std::sync::RwLock::new(()),
            deferred_unloads: Mutex::default(),
            order: crate::enqueue::order::ContextOrder::new(policy),
        };
        ctx.bind()?;
        ctx.info = ctx.query_info(ordinal)?;
        Ok(ctx)
    }

    fn query_info(&self, ordinal: i32) -> Result<DeviceInfo> {
        let table = self.driver.table;
        let mut name = [0 as std::os::raw::c_char; 256];
        // SAFETY: the buffer holds `len` bytes; the driver writes a NUL-terminated name.
        self.check(unsafe { (table.cuDeviceGetName)(name.as_mut_ptr(), 256, self.device) })?;
        name[255] = 0;
        // SAFETY: NUL-terminated within the buffer (forced above).
        let name = unsafe { CStr::from_ptr(name.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        let mut total_memory = 0usize;
        // SAFETY: writes one usize through a valid pointer.
        self.check(unsafe { (table.cuDeviceTotalMem)(&mut total_memory, self.device) })?;
        let (mut least, mut greatest) = (0, 0);
        // SAFETY: writes two ints through valid pointers; the context is current (bound).
        self.check(unsafe { (table.cuCtxGetStreamPriorityRange)(&mut least, &mut greatest) })?;
        let attr = |attribute| self.attribute(attribute);
        let flag = |attribute| self.attribute(attribute).map(|v| v != 0).unwrap_or(false);
        use CUdevice_attribute as A;
        Ok(DeviceInfo {
            ordinal,
            name,
            compute_capability: (
                attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)? as u32,
                attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)? as u32,
            ),
            multiprocessor_count: attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32,
            total_memory,
            async_engine_count: attr(A::CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT)? as u32,
            priority_range: PriorityRange { least, greatest },
            memory_pools_supported: flag(A::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED),
            managed_memory: flag(A::CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY),
            concurrent_managed_access: flag(A::CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS),
        })
    }

    /// One `cuDeviceGetAttribute` value of this context's device.
    pub fn attribute(&self, attribute: CUdevice_attribute) -> Result<i32> {
        let mut value = 0;
        // SAFETY: writes one int through a valid pointer.
        self.check(unsafe {
            (self.driver.table.cuDeviceGetAttribute)(&mut value, attribute, self.device)
        })?;
        Ok(value)
    }

    /// Make this context current on the calling thread.
    ///
    /// Cheap: a thread-local remembers the last context bound, so repeated calls
    /// make no driver call. Every method of this crate that calls the driver
    /// binds first, so handles can be used from any thread. With the `cudarc`
    /// or `cust` feature, whose libraries make their own contexts current on
    /// the same threads, the remembered context is also confirmed with the
    /// driver (`cuCtxGetCurrent`), so their calls cannot send our work to
    /// another device. Without them, code that changes the current context
    /// behind this crate's back (raw `cuCtxSetCurrent` calls, a library this
    /// crate does not know) must call [`Context::force_bind`] afterwards.
    ///
    /// Fails with [`Error::InsideCallback`] inside a stream callback, where CUDA
    /// forbids driver calls.
    #[inline]
    pub fn bind(&self) -> Result<()> {
        refuse_inside_callback()?;
        if CURRENT.with(Cell::get) == self.id && self.still_current() {
            return Ok(());
        }
        self.force_bind()
    }

    /// Whether this context, which the thread's cache says is current, still
    /// is for the driver.
    ///
    /// With an interop feature on, another library shares the thread's
    /// current context: cudarc makes the context of each of its calls current,
    /// and cust pushes and pops its own. One cudarc call on device 1 would
    /// otherwise leave the cache saying device 0, and our next stream, event,
    /// allocation or module would be made on device 1 while its handle claims
    /// device 0. So the driver is asked, as cudarc asks before each of its own
    /// calls; no entry point of ours sees every foreign call, so invalidating
    /// the cache at our interop calls could not be enough. Without those
    /// features only this crate and the caller's `unsafe` raw calls change the
    /// current context, and the cache alone is trusted: `bind`, made on every
    /// enqueue, stays a thread-local read there.
    #[inline]
    fn still_current(&self) -> bool {
        #[cfg(any(feature = "cudarc", feature = "cust"))]
        {
            let mut current: CUcontext = std::ptr::null_mut();
            // SAFETY: writes one context handle through a valid pointer.
            let code = unsafe { (self.driver.table.cuCtxGetCurrent)(&mut current) };
            code == CUresult::CUDA_SUCCESS && current == self.raw
        }
        #[cfg(not(any(feature = "cudarc", feature = "cust")))]
        true
    }

    /// Make this context current with `cuCtxSetCurrent`, whatever the cache says.
    pub fn force_bind(&self) -> Result<()> {
        // SAFETY: `raw` is a retained primary context, valid while `self` lives.
        self.check(unsafe { (self.driver.table.cuCtxSetCurrent)(self.raw) })?;
        CURRENT.with(|current| current.set(self.id));
        Ok(())
    }

    /// Wait for all work in this context (`cuCtxSynchronize`).
    ///
    /// Refused ([`Error::ContextCapturing`]) while a stream of this context
    /// is being captured into a graph: on a GPU the call would invalidate the
    /// capture. A capture begun from another thread meanwhile waits for
    /// this to return. Modules dropped during a capture are unloaded here.
    pub fn synchronize(&self) -> Result<()> {
        // The guard holds no state: a panic under it left nothing half done.
        let _no_capture_begins = self.sync_gate.read().unwrap_or_else(|p| p.into_inner());
        self.refuse_during_capture("Context::synchronize")?;
        self.bind()?;
        // SAFETY: no arguments; the context is current.
        self.check(unsafe { (self.driver.table.cuCtxSynchronize)() })?;
        self.unload_deferred();
        Ok(())
    }

    /// Unload `module` once the context can be synchronized (see
    /// `deferred_unloads`): a module dropped while a capture is open here,
    /// where a synchronization would invalidate the capture.
    pub(crate) fn defer_unload(&self, module: sys::CUmodule) {
        self.deferred_unloads
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(module as usize);
    }

    /// Unload the deferred modules; the context was just synchronized, and
    /// no handle to them is left (their `Module`s are gone), so no kernel
    /// of theirs runs or can be launched.
    fn unload_deferred(&self) {
        let modules = std::mem::take(
            &mut *self
                .deferred_unloads
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        );
        for module in modules {
            let raw = module as sys::CUmodule;
            self.release_in_drop(format_args!("module {raw:p}"), "unloading", |driver| {
                // SAFETY: a module whose `Module` was dropped (it handed its
                // handle over instead of unloading it), unloaded once here.
                unsafe { (driver.cuModuleUnload)(raw) }
            });
        }
    }

    /// Count a capture about to begin, once no [`Context::synchronize`] is
    /// between its check and its driver call (those in flight finish
    /// first; later ones are refused). Undone by [`Context::capture_ended`].
    pub(crate) fn capture_beginning(&self) {
        let _exclusive = self.sync_gate.write().unwrap_or_else(|p| p.into_inner());
        self.captures
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }

    /// A capture counted by [`Context::capture_beginning`] has ended, or
    /// failed to begin.
    pub(crate) fn capture_ended(&self) {
        self.captures
            .fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }

    /// `Err` naming `operation` while a capture is open in this context.
    pub(crate) fn refuse_during_capture(&self, operation: &'static str) -> Result<()> {
        match self.captures.load(std::sync::atomic::Ordering::Acquire) {
            0 => Ok(()),
            captures => Err(Error::ContextCapturing {
                operation,
                captures,
            }),
        }
    }

    /// Free and total device memory in bytes (`cuMemGetInfo`).
    pub fn memory_info(&self) -> Result<(usize, usize)> {
        self.bind()?;
        let (mut free, mut total) = (0, 0);
        // SAFETY: writes two usizes through valid pointers; the context is current.
        self.check(unsafe { (self.driver.table.cuMemGetInfo)(&mut free, &mut total) })?;
        Ok((free, total))
    }

    /// The context's service of type `S`, made by `make` on first use.
    /// `None` when the slot already holds a service of another type: a
    /// context holds one service, and only the reactor is one.
    pub(crate) fn service<S: ContextService>(&self, make: impl FnOnce() -> S) -> Option<&S> {
        let service: &dyn Any = &**self.service.get_or_init(|| Box::new(make()));
        service.downcast_ref()
    }

    /// The device's description, queried once at creation.
    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// The device's stream priority range.
    pub fn priority_range(&self) -> PriorityRange {
        self.info.priority_range
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> i32 {
        self.info.ordinal
    }

    /// The raw device handle.
    pub fn device(&self) -> CUdevice {
        self.device
    }

    /// The raw context handle (for interop).
    pub fn as_raw(&self) -> CUcontext {
        self.raw
    }

    /// A process-unique id for this context (never 0).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The function table, for raw calls in interop with other libraries.
    /// Bind (`ctx.bind()`) before calling it. The crates of this workspace
    /// call the driver through [`crate::result`] and the safe types instead.
    pub fn driver(&self) -> &'static Driver {
        self.driver.table
    }

    /// Which driver this context runs on.
    pub fn kind(&self) -> DriverKind {
        self.driver.kind
    }

    /// The driver table together with its kind.
    pub fn loaded_driver(&self) -> LoadedDriver {
        self.driver
    }

    /// Whether this context runs on a real GPU.
    pub fn is_gpu(&self) -> bool {
        self.driver.is_gpu()
    }

    /// `CUresult` to this crate's `Result`, with the driver's description.
    #[inline]
    pub(crate) fn check(&self, code: CUresult) -> Result<()> {
        self.driver.check(code)
    }

    /// A query's code (`cuStreamQuery`, `cuEventQuery`): `NOT_READY` is `false`.
    #[inline]
    pub(crate) fn check_ready(&self, code: CUresult) -> Result<bool> {
        // "Not yet" is the common answer of a poll: no error to describe
        // (building one asks the driver for the code's text).
        if code == CUresult::CUDA_ERROR_NOT_READY {
            return Ok(false);
        }
        self.driver.check(code).map(|()| true)
    }

    /// `Ok` when `id` is this context's id; otherwise an error that
    /// names both devices when `id` is a context of another device.
    #[inline]
    pub(crate) fn check_context_id(&self, what: &'static str, id: u64) -> Result<()> {
        if id == self.id() {
            return Ok(());
        }
        Err(self.context_mismatch(what, id))
    }

    /// The error of [`Context::check_context_id`], out of the launch path:
    /// every enqueue checks each buffer's context.
    #[cold]
    fn context_mismatch(&self, what: &'static str, id: u64) -> Error {
        match describe(id) {
            Some((kind, found_device)) if kind == self.kind() && found_device != self.ordinal() => {
                Error::DeviceMismatch {
                    what,
                    stream_device: self.ordinal(),
                    found_device,
                    expected: self.id(),
                    found: id,
                }
            }
            _ => Error::ContextMismatch {
                what,
                expected: self.id(),
                found: id,
            },
        }
    }

    /// For a destructor, which has nowhere to return an error: bind, then make
    /// the driver call `release` that frees `what` ("event 0x..."), logging a
    /// failure of either (a `tracing` error; `doing` names the call:
    /// "destroying"). When binding fails nothing is called and `what` is leaked.
    pub(crate) fn release_in_drop(
        &self,
        what: fmt::Arguments<'_>,
        doing: &str,
        release: impl FnOnce(&Driver) -> CUresult,
    ) {
        if let Err(err) = self.bind() {
            tracing::error!(context = self.id, "leaking {what}: {err}");
            return;
        }
        if let Err(err) = self.check(release(self.driver())) {
            tracing::error!(context = self.id, "{doing} {what}: {err}");
        }
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        let deferred = !self
            .deferred_unloads
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty();
        if deferred && !in_stream_callback() {
            // Modules dropped during a capture, still loaded: the context
            // may outlive this handle (another retain of the primary
            // context), so unload them now, after the work (no capture can
            // be open: a capture holds its streams, and they the context).
            if let Err(err) = self.synchronize() {
                tracing::warn!("leaking modules dropped during a capture: {err}");
            }
        }
        let release = Release {
            driver: self.driver,
            device: self.device,
            raw: self.raw,
            id: self.id,
            service: self.service.take(),
        };
        let cached = CURRENT.with(|current| current.replace(0) == self.id);
        if !in_stream_callback() {
            // Confirmed as `bind` does: the release synchronizes the current
            // context, which must be this one.
            release.run(cached && self.still_current());
            return;
        }
        // CUDA forbids driver calls in a stream callback, and this one would
        // wait for the very stream running it: hand the release to a thread
        // of its own, whose cuCtxSynchronize returns once the callback has.
        let id = self.id;
        let spawned = std::thread::Builder::new()
            .name("cuda-streams-context-release".into())
            .spawn(move || release.run(false));
        if let Err(err) = spawned {
            tracing::error!(
                context = id,
                "cannot start a thread to release context {id} outside a stream callback: {err}; \
                 its primary context stays retained"
            );
        }
    }
}

/// A service that stands on one context and lives as long as it: kept in
/// the context's slot ([`Context::service`]) so that the context, a lower
/// layer, names none of the features built on it.
pub(crate) trait ContextService: Any + Send + Sync {
    /// The context's work has finished (its last handle is gone and the
    /// device synchronized) and its release comes next: stop what serves it.
    fn context_released(&self);
}

/// What releasing a context's retain of the primary context needs, apart from
/// the `Context`, so that it can move to another thread.
struct Release {
    driver: LoadedDriver,
    device: CUdevice,
    raw: CUcontext,
    id: u64,
    /// Told once the context's work is done, before the release.
    service: Option<Box<dyn ContextService>>,
}

// SAFETY: a context handle may be used from any thread (see `Context`); the
// retain it stands for is released exactly once, by `run`, on whichever thread
// holds the `Release`.
unsafe impl Send for Release {}

impl Release {
    /// Wait for the context's work (stream-ordered frees, callbacks) and
    /// release the retain taken in `Context::create`. `bound`: the calling
    /// thread has the context current already. Never from a stream callback.
    fn run(self, bound: bool) {
        let table = self.driver.table;
        let id = self.id;
        let check = |code: CUresult| table.check(code);
        let current = if bound {
            Ok(())
        } else {
            // SAFETY: `raw` is a primary context retained until the release below.
            check(unsafe { (table.cuCtxSetCurrent)(self.raw) })
        };
        match current {
            Ok(()) => {
                // SAFETY: no arguments; the context is current on this thread.
                if let Err(err) = check(unsafe { (table.cuCtxSynchronize)() }) {
                    tracing::error!(context = id, "synchronizing context {id} on drop: {err}");
                }
            }
            Err(err) => tracing::error!(context = id, "binding context {id} on drop: {err}"),
        }
        // Whatever the service serves holds the context, so none of it is
        // left; after the synchronize above the context's work is done.
        if let Some(service) = self.service {
            service.context_released();
        }
        // SAFETY: releases the retain taken in `create`, once: `Release` is
        // made once per `Context`, in its `Drop`, and consumed here.
        let code = unsafe { (table.cuDevicePrimaryCtxRelease)(self.device) };
        if let Err(err) = check(code) {
            tracing::error!(context = id, "releasing context {id}: {err}");
        }
    }
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("id", &self.id)
            .field("driver", &self.driver.name())
            .field("device", &self.info.name)
            .field("ordinal", &self.info.ordinal)
            .finish()
    }
}
