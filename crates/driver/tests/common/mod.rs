//! Shared helpers for the driver-table tests: the table as the upper layers get
//! it (`cuda_streams_driver::driver()`, so the same tests run on the software
//! driver and, with `CUDA_STREAMS_DRIVER=cuda`, on the GPU), binding the primary
//! context on the calling thread, and small RAII wrappers so a failing
//! assertion does not leak streams.
#![allow(
    dead_code,
    unused_imports,
    reason = "each test binary uses a different subset"
)]

use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard, mpsc};
use std::time::Duration;
use sys::signature::{Access, Extent, Param, Scalar};
use sys::{CUdeviceptr, CUevent, CUresult, CUstream, Driver};

pub(crate) use test_support::serial;

/// How long a test waits for something that must happen before it calls it a
/// hang. Generous: this is a deadlock guard, not a speed assertion.
pub(crate) const HANG: Duration = Duration::from_secs(20);

/// The selected driver's table, with the primary context current on this
/// thread.
pub(crate) fn table() -> &'static Driver {
    let loaded = cuda_streams_driver::driver().expect("a driver is selected");
    bind(loaded.table);
    loaded.table
}

/// Whether the selected driver is the GPU.
pub(crate) fn is_gpu() -> bool {
    cuda_streams_driver::driver()
        .expect("a driver is selected")
        .is_gpu()
}

/// True (and prints why) when the test needs the software driver.
pub(crate) fn skip_on_gpu(why: &str) -> bool {
    if is_gpu() {
        eprintln!("skipped on the GPU: {why}");
        true
    } else {
        false
    }
}

pub(crate) use test_support::skip_under_sanitizer;

/// `cuInit`, retain the primary context (once per thread) and make it current.
pub(crate) fn bind(table: &Driver) {
    thread_local! {
        static BOUND: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
    if BOUND.with(|b| b.get()) {
        return;
    }
    // SAFETY: every out-pointer is a valid local.
    unsafe {
        ok((table.cuInit)(0));
        let mut dev = 0;
        ok((table.cuDeviceGet)(&mut dev, 0));
        let mut ctx = std::ptr::null_mut();
        ok((table.cuDevicePrimaryCtxRetain)(&mut ctx, dev));
        ok((table.cuCtxSetCurrent)(ctx));
    }
    BOUND.with(|b| b.set(true));
}

/// Assert success, naming the code otherwise.
#[track_caller]
pub(crate) fn ok(code: CUresult) {
    assert_eq!(
        code,
        CUresult::CUDA_SUCCESS,
        "expected CUDA_SUCCESS, got {}",
        sys::error_name(code).unwrap_or("an unknown code")
    );
}

/// Assert a specific code.
#[track_caller]
pub(crate) fn expect(code: CUresult, wanted: CUresult) {
    assert_eq!(
        code,
        wanted,
        "expected {}, got {}",
        sys::error_name(wanted).unwrap_or("?"),
        sys::error_name(code).unwrap_or("?")
    );
}

/// A stream destroyed on drop.
pub(crate) struct Stream {
    pub(crate) raw: CUstream,
    table: &'static Driver,
}

// SAFETY: CUDA handles may be used from any thread that has the context
// current; the wrappers hold nothing else.
unsafe impl Send for Stream {}
// SAFETY: as above.
unsafe impl Sync for Stream {}
// SAFETY: as above.
unsafe impl Send for Event {}
// SAFETY: as above.
unsafe impl Sync for Event {}

impl Stream {
    pub(crate) fn new(table: &'static Driver) -> Self {
        Self::with(table, 0, 0)
    }

    pub(crate) fn with(table: &'static Driver, flags: u32, priority: i32) -> Self {
        let mut raw = std::ptr::null_mut();
        // SAFETY: raw is a valid local.
        ok(unsafe { (table.cuStreamCreateWithPriority)(&mut raw, flags, priority) });
        Self { raw, table }
    }

    pub(crate) fn sync(&self) {
        // SAFETY: a live stream.
        ok(unsafe { (self.table.cuStreamSynchronize)(self.raw) });
    }

    pub(crate) fn query(&self) -> CUresult {
        // SAFETY: a live stream.
        unsafe { (self.table.cuStreamQuery)(self.raw) }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: a live stream, destroyed once.
        unsafe { (self.table.cuStreamDestroy)(self.raw) };
    }
}

/// An event destroyed on drop.
pub(crate) struct Event {
    pub(crate) raw: CUevent,
    table: &'static Driver,
}

impl Event {
    pub(crate) fn new(table: &'static Driver, flags: u32) -> Self {
        let mut raw = std::ptr::null_mut();
        // SAFETY: raw is a valid local.
        ok(unsafe { (table.cuEventCreate)(&mut raw, flags) });
        Self { raw, table }
    }

    pub(crate) fn record(&self, stream: CUstream) {
        // SAFETY: live event and stream.
        ok(unsafe { (self.table.cuEventRecord)(self.raw, stream) });
    }

    pub(crate) fn query(&self) -> CUresult {
        // SAFETY: a live event.
        unsafe { (self.table.cuEventQuery)(self.raw) }
    }

    pub(crate) fn sync(&self) {
        // SAFETY: a live event.
        ok(unsafe { (self.table.cuEventSynchronize)(self.raw) });
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: a live event, destroyed once.
        unsafe { (self.table.cuEventDestroy)(self.raw) };
    }
}

/// Device memory freed on drop.
pub(crate) struct DeviceMem {
    pub(crate) ptr: CUdeviceptr,
    pub(crate) len: usize,
    table: &'static Driver,
}

impl DeviceMem {
    pub(crate) fn new(table: &'static Driver, len: usize) -> Self {
        let mut ptr = 0;
        // SAFETY: ptr is a valid local.
        ok(unsafe { (table.cuMemAlloc)(&mut ptr, len) });
        Self { ptr, len, table }
    }
}

impl Drop for DeviceMem {
    fn drop(&mut self) {
        // SAFETY: a live allocation, freed once.
        unsafe { (self.table.cuMemFree)(self.ptr) };
    }
}

/// Page-locked host memory freed on drop.
pub(crate) struct Pinned {
    pub(crate) ptr: *mut u8,
    pub(crate) len: usize,
    table: &'static Driver,
}

// SAFETY: plain host memory; tests synchronise access through the driver.
unsafe impl Send for Pinned {}
// SAFETY: as above.
unsafe impl Sync for Pinned {}

impl Pinned {
    pub(crate) fn new(table: &'static Driver, len: usize) -> Self {
        let mut ptr = std::ptr::null_mut();
        // SAFETY: ptr is a valid local.
        ok(unsafe { (table.cuMemHostAlloc)(&mut ptr, len, 0) });
        Self {
            ptr: ptr.cast(),
            len,
            table,
        }
    }

    /// The bytes. Only call while no stream operation touches them.
    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: len bytes allocated; callers only look after synchronising.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// Overwrite the bytes with `data`. Only call while no stream operation
    /// touches them.
    pub(crate) fn fill(&self, data: &[u8]) {
        assert_eq!(data.len(), self.len);
        // SAFETY: len bytes allocated, not aliased by a live slice (callers
        // hold no `bytes()` borrow across this call) nor used by a stream.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr, self.len) };
    }

    pub(crate) fn void(&self) -> *mut c_void {
        self.ptr.cast()
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // SAFETY: a live pinned allocation, freed once.
        unsafe { (self.table.cuMemFreeHost)(self.ptr.cast()) };
    }
}

/// Run `f` on `stream`'s host-function path (`cuLaunchHostFunc`), boxed.
pub(crate) fn host_fn(table: &Driver, stream: CUstream, f: impl FnOnce() + Send + 'static) {
    type Boxed = Box<dyn FnOnce() + Send>;
    unsafe extern "C" fn trampoline(data: *mut c_void) {
        // SAFETY: data is the Box<Boxed> leaked below, taken back exactly once.
        let f = unsafe { Box::from_raw(data.cast::<Boxed>()) };
        // A panic must not unwind into the driver.
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_err() {
            eprintln!("a test host function panicked");
            std::process::abort();
        }
    }
    let data = Box::into_raw(Box::new(Box::new(f) as Boxed));
    // SAFETY: trampoline takes back exactly this pointer, once.
    let code = unsafe { (table.cuLaunchHostFunc)(stream, Some(trampoline), data.cast()) };
    if code != CUresult::CUDA_SUCCESS {
        // SAFETY: the driver refused it, so it will never run: reclaim it.
        drop(unsafe { Box::from_raw(data) });
    }
    ok(code);
}

/// A gate: `block` enqueues a host function that blocks its stream until
/// `open` is called (or [`HANG`] passes, so a broken driver fails instead of
/// hanging the test).
///
/// A gate holds [`DEVICE_WIDE`] for reading: a device-wide wait (see
/// [`device_wide`]) in another test would otherwise wait for this stream while
/// this test waits for something the device-wide wait holds up.
pub(crate) struct Gate {
    tx: Option<mpsc::Sender<()>>,
    _shared: Option<RwLockReadGuard<'static, ()>>,
}

/// Held for writing by calls that wait for the whole device
/// (`cuCtxSynchronize`, an async allocation that runs out of memory, which
/// CUDA makes wait for pending work); held for reading by every [`Gate`].
pub(crate) static DEVICE_WIDE: RwLock<()> = RwLock::new(());

/// Exclusive use of the device: no other test holds a stream blocked.
pub(crate) fn device_wide() -> RwLockWriteGuard<'static, ()> {
    DEVICE_WIDE.write().unwrap_or_else(|e| e.into_inner())
}

impl Gate {
    pub(crate) fn block(table: &Driver, stream: CUstream) -> Self {
        let shared = DEVICE_WIDE.read().unwrap_or_else(|e| e.into_inner());
        let (tx, rx) = mpsc::channel::<()>();
        host_fn(table, stream, move || {
            let _ = rx.recv_timeout(HANG);
        });
        Self {
            tx: Some(tx),
            _shared: Some(shared),
        }
    }

    pub(crate) fn open(&mut self) {
        if let Some(tx) = self.tx.take() {
            let _ = tx.send(());
        }
        self._shared = None;
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.open();
    }
}

/// A counter bumped by host functions.
pub(crate) fn bump(counter: &'static AtomicUsize) -> impl FnOnce() + Send + 'static {
    move || {
        counter.fetch_add(1, Ordering::SeqCst);
    }
}

/// Deterministic non-zero test data (xorshift64*).
pub(crate) fn random_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed | 1;
    (0..len)
        .map(|_| {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            (state.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 56) as u8
        })
        .collect()
}

/// A test kernel image: PTX for `add_u32(unsigned* data, unsigned n, unsigned
/// value)` (data[i] += value for i < n), compiled by nvcc 13.0 for compute_80,
/// so the GPU loads it; the software driver runs [`add_u32_twin`] for it.
pub(crate) static TEST_IMAGE: &[u8] = b"//\n// test image for crates/driver/tests (nvcc 13.0 -ptx -arch=compute_80)\n//\n\
.version 9.0\n.target sm_80\n.address_size 64\n\
.visible .entry add_u32(\n\t.param .u64 add_u32_param_0,\n\t.param .u32 add_u32_param_1,\n\t.param .u32 add_u32_param_2\n)\n{\n\
\t.reg .pred \t%p<2>;\n\t.reg .b32 \t%r<9>;\n\t.reg .b64 \t%rd<5>;\n\
\tld.param.u64 \t%rd1, [add_u32_param_0];\n\tld.param.u32 \t%r3, [add_u32_param_1];\n\tld.param.u32 \t%r2, [add_u32_param_2];\n\
\tmov.u32 \t%r4, %ctaid.x;\n\tmov.u32 \t%r5, %ntid.x;\n\tmov.u32 \t%r6, %tid.x;\n\tmad.lo.s32 \t%r1, %r4, %r5, %r6;\n\
\tsetp.ge.u32 \t%p1, %r1, %r3;\n\t@%p1 bra \t$L__BB0_2;\n\tcvta.to.global.u64 \t%rd2, %rd1;\n\tmul.wide.u32 \t%rd3, %r1, 4;\n\
\tadd.s64 \t%rd4, %rd2, %rd3;\n\tld.global.u32 \t%r7, [%rd4];\n\tadd.s32 \t%r8, %r7, %r2;\n\tst.global.u32 \t[%rd4], %r8;\n\
$L__BB0_2:\n\tret;\n}\n\0";

/// The CPU twin of `add_u32`, over the whole grid.
///
/// # Safety
/// `params` holds `(unsigned* data, unsigned n, unsigned value)` as registered.
pub(crate) unsafe fn add_u32_twin(dims: &soft_driver::LaunchDims, params: *mut *mut c_void) {
    // SAFETY: the driver passes copies of the three registered arguments.
    let (data, n, value) = unsafe {
        (
            *(*params.add(0)).cast::<*mut u32>(),
            *(*params.add(1)).cast::<u32>(),
            *(*params.add(2)).cast::<u32>(),
        )
    };
    let threads = dims.grid.0 as u64 * dims.block.0 as u64;
    for i in 0..threads.min(u64::from(n)) {
        // SAFETY: i < n, the caller's buffer length.
        unsafe { *data.add(i as usize) += value };
    }
}

/// Register the test image's twin with the software driver (harmless on the
/// GPU, which never looks at it).
pub(crate) fn register_test_image() {
    // SAFETY: add_u32(unsigned* data, unsigned n, unsigned value) adds to
    // data[0..n], and so does its twin (within the threads launched).
    let registered = unsafe {
        soft_driver::register_image(
            TEST_IMAGE,
            &[soft_driver::TwinSpec {
                name: "add_u32",
                params: &[
                    Param::Pointer {
                        elem: Scalar::U32,
                        access: Access::Write,
                        extent: Extent::Arg(1),
                    },
                    Param::Scalar(Scalar::U32),
                    Param::Scalar(Scalar::U32),
                ],
                run: add_u32_twin,
            }],
        )
    };
    registered.expect("the test image's twin registers");
}

/// Load the test image and look up `add_u32`.
pub(crate) fn load_add_u32(table: &'static Driver) -> (sys::CUmodule, sys::CUfunction) {
    register_test_image();
    let mut module = std::ptr::null_mut();
    let mut function = std::ptr::null_mut();
    // SAFETY: valid out-pointers; the image is NUL-terminated PTX.
    unsafe {
        ok((table.cuModuleLoadData)(
            &mut module,
            TEST_IMAGE.as_ptr().cast(),
        ));
        ok((table.cuModuleGetFunction)(
            &mut function,
            module,
            c"add_u32".as_ptr(),
        ));
    }
    (module, function)
}

/// Launch `add_u32(data, n, value)` on `stream` with 256-thread blocks.
pub(crate) fn launch_add_u32(
    table: &Driver,
    function: sys::CUfunction,
    stream: CUstream,
    data: CUdeviceptr,
    n: u32,
    value: u32,
) {
    let mut data = data;
    let mut n_arg = n;
    let mut value = value;
    let mut params = [
        (&mut data as *mut CUdeviceptr).cast::<c_void>(),
        (&mut n_arg as *mut u32).cast::<c_void>(),
        (&mut value as *mut u32).cast::<c_void>(),
    ];
    let blocks = n.div_ceil(256).max(1);
    // SAFETY: params points at three live arguments matching the kernel.
    ok(unsafe {
        (table.cuLaunchKernel)(
            function,
            blocks,
            1,
            1,
            256,
            1,
            1,
            0,
            stream,
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    });
}

/// Counter type re-exported for tests.
pub(crate) type Counter = AtomicUsize;
