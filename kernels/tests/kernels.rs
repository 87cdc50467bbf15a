//! Every kernel, loaded through the selected driver (the GPU with
//! `CUDA_STREAMS_DRIVER=cuda`, the software driver and its CPU twins otherwise),
//! launched on a stream over random data and checked against the CPU reference.
//!
//! Floating-point results must match bit for bit: the kernels write every fused
//! multiply-add as `fmaf` and the reference as `f32::mul_add`, both correctly
//! rounded.

use cuda_streams_kernels::{self as kernels, KernelImage, reference};
use std::ffi::{CString, c_void};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};
use sys::{CUdeviceptr, CUevent, CUfunction, CUmodule, CUresult, CUstream, Driver};

/// Check a driver call, naming it on failure.
#[track_caller]
fn ok(d: &Driver, what: &str, code: CUresult) {
    if let Err(e) = d.check(code) {
        panic!("{what}: {e}");
    }
}

/// The selected driver, with the device's primary context current on this thread.
fn driver() -> &'static Driver {
    let loaded = driver::driver().expect("no driver could be selected");
    let d = loaded.table;
    let (mut dev, mut ctx) = (0, std::ptr::null_mut());
    // SAFETY: each call writes through a valid pointer to a local.
    unsafe {
        ok(d, "cuInit", (d.cuInit)(0));
        ok(d, "cuDeviceGet", (d.cuDeviceGet)(&mut dev, 0));
        ok(
            d,
            "cuDevicePrimaryCtxRetain",
            (d.cuDevicePrimaryCtxRetain)(&mut ctx, dev),
        );
        ok(d, "cuCtxSetCurrent", (d.cuCtxSetCurrent)(ctx));
    }
    d
}

/// One test's driver objects, released on drop.
struct Gpu {
    d: &'static Driver,
    stream: CUstream,
    modules: Vec<CUmodule>,
    buffers: Vec<CUdeviceptr>,
    /// This binary's tests run one at a time: a neighbour's `cuMemFree` or
    /// `cuModuleUnload` waits for the whole device, and would hold up the
    /// spin test's queries until its spin is over. Dropped after the handles.
    _serial: MutexGuard<'static, ()>,
}

impl Gpu {
    fn new() -> Self {
        static SERIAL: Mutex<()> = Mutex::new(());
        let serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
        let d = driver();
        let mut stream = std::ptr::null_mut();
        // SAFETY: writes the new stream through a valid pointer.
        ok(d, "cuStreamCreateWithPriority", unsafe {
            (d.cuStreamCreateWithPriority)(&mut stream, 1, 0)
        });
        Gpu {
            d,
            stream,
            modules: Vec::new(),
            buffers: Vec::new(),
            _serial: serial,
        }
    }

    fn function(&mut self, image: &'static KernelImage, name: &str) -> CUfunction {
        let mut module = std::ptr::null_mut();
        if std::ptr::eq(self.d, soft_driver::driver()) {
            // The software driver runs the declarations' twins: a module
            // made from them, as `Module::load(&ctx, image)` makes it.
            module = soft_driver::module_from_declarations().unwrap();
            for decl in image.twins() {
                let twin = decl.twin.expect("every kernel here has a twin");
                soft_driver::define_kernel(module, decl.name, decl.params, twin).unwrap();
            }
        } else {
            // SAFETY: the image is a complete fatbin that lives for the whole program.
            ok(self.d, "cuModuleLoadData", unsafe {
                (self.d.cuModuleLoadData)(&mut module, image.fatbin().as_ptr().cast())
            });
        }
        self.modules.push(module);
        let mut function = std::ptr::null_mut();
        let cname = CString::new(name).unwrap();
        // SAFETY: the module was just loaded; the name is NUL-terminated.
        ok(self.d, name, unsafe {
            (self.d.cuModuleGetFunction)(&mut function, module, cname.as_ptr())
        });
        function
    }

    fn alloc<T>(&mut self, len: usize) -> CUdeviceptr {
        let mut ptr = 0;
        // SAFETY: writes the allocation's address through a valid pointer.
        ok(self.d, "cuMemAlloc", unsafe {
            (self.d.cuMemAlloc)(&mut ptr, size_of::<T>() * len.max(1))
        });
        self.buffers.push(ptr);
        ptr
    }

    /// A device copy of `data`. The host side is read before the stream is
    /// synchronised, so callers keep `data` alive until then.
    fn upload<T>(&mut self, data: &[T]) -> CUdeviceptr {
        let ptr = self.alloc::<T>(data.len());
        // SAFETY: `data` is valid for its size in bytes and outlives the copy
        // (every test synchronises before its host data goes away).
        ok(self.d, "cuMemcpyHtoDAsync", unsafe {
            (self.d.cuMemcpyHtoDAsync)(ptr, data.as_ptr().cast(), size_of_val(data), self.stream)
        });
        ptr
    }

    /// Copy `out.len()` elements back and wait for the stream.
    fn download<T>(&self, from: CUdeviceptr, out: &mut [T]) {
        // SAFETY: `out` is writable for its size and the stream is synchronised
        // before it is used again.
        unsafe {
            ok(
                self.d,
                "cuMemcpyDtoHAsync",
                (self.d.cuMemcpyDtoHAsync)(
                    out.as_mut_ptr().cast(),
                    from,
                    size_of_val(out),
                    self.stream,
                ),
            );
            ok(
                self.d,
                "cuStreamSynchronize",
                (self.d.cuStreamSynchronize)(self.stream),
            );
        }
    }

    /// Launch `f` with the arguments at `args` (each a pointer to one argument).
    fn launch(
        &self,
        f: CUfunction,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        args: &mut [*mut c_void],
    ) {
        // SAFETY: `args` holds one pointer per kernel parameter, to a value of
        // the parameter's type, alive for the call (the driver copies them).
        ok(self.d, "cuLaunchKernel", unsafe {
            (self.d.cuLaunchKernel)(
                f,
                grid.0,
                grid.1,
                grid.2,
                block.0,
                block.1,
                block.2,
                0,
                self.stream,
                args.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        });
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        // Results are ignored: a failed test may leave the stream in any state,
        // and a panic in drop would hide the test's own message.
        // SAFETY: every handle was created by this Gpu and is released once.
        unsafe {
            (self.d.cuStreamSynchronize)(self.stream);
            for &ptr in &self.buffers {
                (self.d.cuMemFree)(ptr);
            }
            for &module in &self.modules {
                (self.d.cuModuleUnload)(module);
            }
            (self.d.cuStreamDestroy)(self.stream);
        }
    }
}

/// A pointer to one kernel argument, for the kernelParams array.
fn arg<T>(value: &mut T) -> *mut c_void {
    (value as *mut T).cast()
}

struct XorShift(u64);

impl XorShift {
    fn next_u32(&mut self) -> u32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 32) as u32
    }
    /// Uniform in [-1, 1), never zero.
    fn next_f32(&mut self) -> f32 {
        let v = (self.next_u32() >> 8) as f32 / (1u32 << 23) as f32 - 1.0;
        if v == 0.0 { 0.25 } else { v }
    }
    fn f32s(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.next_f32()).collect()
    }
    fn u32s(&mut self, n: usize) -> Vec<u32> {
        (0..n).map(|_| self.next_u32() | 1).collect()
    }
}

/// Not a multiple of any block size, so the last block is partial.
const N: usize = 100_003;

/// Fewer threads than elements, so every thread does several (grid-stride).
const GRID: (u32, u32, u32) = (13, 1, 1);
const BLOCK: (u32, u32, u32) = (256, 1, 1);

#[test]
fn every_listed_function_loads() {
    let mut gpu = Gpu::new();
    for image in kernels::ALL {
        for name in image.functions() {
            assert!(
                !gpu.function(image, name).is_null(),
                "{}: {name}",
                image.name()
            );
        }
    }
}

#[test]
fn saxpy_matches_reference() {
    let mut gpu = Gpu::new();
    let f = gpu.function(&kernels::ELEMENTWISE, "saxpy");
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    let (a, x, y) = (rng.next_f32(), rng.f32s(N), rng.f32s(N));
    let (mut dx, mut dy) = (gpu.upload(&x), gpu.upload(&y));
    let (mut n, mut a_arg) = (N as u64, a);
    gpu.launch(
        f,
        GRID,
        BLOCK,
        &mut [arg(&mut n), arg(&mut a_arg), arg(&mut dx), arg(&mut dy)],
    );
    let mut got = vec![0.0f32; N];
    gpu.download(dy, &mut got);

    let mut expected = y.clone();
    reference::saxpy(a, &x, &mut expected);
    assert_eq!(got, expected);
}

#[test]
fn fills_write_exactly_n_elements() {
    let mut gpu = Gpu::new();
    let (ff, fu) = (
        gpu.function(&kernels::ELEMENTWISE, "fill_f32"),
        gpu.function(&kernels::ELEMENTWISE, "fill_u32"),
    );
    let mut rng = XorShift(0x2545_f491_4f6c_dd1d);
    let (before_f, before_u) = (rng.f32s(N), rng.u32s(N));
    let (mut vf, mut vu) = (rng.next_f32(), rng.next_u32() | 1);
    let (mut of, mut ou) = (gpu.upload(&before_f), gpu.upload(&before_u));
    let mut n = N as u64 - 1;
    gpu.launch(
        ff,
        GRID,
        BLOCK,
        &mut [arg(&mut n), arg(&mut vf), arg(&mut of)],
    );
    gpu.launch(
        fu,
        (2, 3, 1),
        (32, 2, 2),
        &mut [arg(&mut n), arg(&mut vu), arg(&mut ou)],
    );
    let (mut got_f, mut got_u) = (vec![0.0f32; N], vec![0u32; N]);
    gpu.download(of, &mut got_f);
    gpu.download(ou, &mut got_u);

    let (mut expected_f, mut expected_u) = (before_f.clone(), before_u.clone());
    reference::fill_f32(vf, &mut expected_f[..N - 1]);
    reference::fill_u32(vu, &mut expected_u[..N - 1]);
    assert_eq!(got_f, expected_f);
    assert_eq!(got_u, expected_u);
}

#[test]
fn scale_add_matches_reference() {
    let mut gpu = Gpu::new();
    let f = gpu.function(&kernels::ELEMENTWISE, "scale_add");
    let mut rng = XorShift(0x6c07_8965_d5f3_1a2b);
    let (a, b, x, y) = (rng.next_f32(), rng.next_f32(), rng.f32s(N), rng.f32s(N));
    let (mut dx, mut dy) = (gpu.upload(&x), gpu.upload(&y));
    let mut dout = gpu.alloc::<f32>(N);
    let (mut n, mut a_arg, mut b_arg) = (N as u64, a, b);
    gpu.launch(
        f,
        GRID,
        BLOCK,
        &mut [
            arg(&mut n),
            arg(&mut a_arg),
            arg(&mut dx),
            arg(&mut b_arg),
            arg(&mut dy),
            arg(&mut dout),
        ],
    );
    let mut got = vec![0.0f32; N];
    gpu.download(dout, &mut got);

    let mut expected = vec![0.0; N];
    reference::scale_add(a, &x, b, &y, &mut expected);
    assert_eq!(got, expected);
}

#[test]
fn checksum_matches_reference_for_any_launch_shape() {
    let mut gpu = Gpu::new();
    let f = gpu.function(&kernels::REDUCE, "checksum");
    let mut rng = XorShift(0xd1b5_4a32_d192_ed03);
    let data = rng.u32s(N);
    let start = u64::from(rng.next_u32()) << 32 | u64::from(rng.next_u32());
    let mut ddata = gpu.upload(&data);
    let mut dout = gpu.upload(std::slice::from_ref(&start));
    let mut n = N as u64;
    // The kernel adds to *out: two launches of different shapes (one with partial
    // warps, in three dimensions) must add the same amount each.
    gpu.launch(
        f,
        (40, 1, 1),
        (128, 1, 1),
        &mut [arg(&mut n), arg(&mut ddata), arg(&mut dout)],
    );
    gpu.launch(
        f,
        (3, 2, 2),
        (17, 3, 2),
        &mut [arg(&mut n), arg(&mut ddata), arg(&mut dout)],
    );
    let mut got = 0u64;
    gpu.download(dout, std::slice::from_mut(&mut got));

    let sum = reference::checksum(&data);
    assert_eq!(got, start.wrapping_add(sum).wrapping_add(sum));
}

#[test]
fn compute_matches_reference() {
    const ITERATIONS: u32 = 300;
    const LEN: usize = 20_011;
    let mut gpu = Gpu::new();
    let f = gpu.function(&kernels::COMPUTE, "compute");
    let mut rng = XorShift(0x8cb9_2ba7_2f3d_8dd7);
    let x = rng.f32s(LEN);
    let mut dx = gpu.upload(&x);
    let mut dy = gpu.alloc::<f32>(LEN);
    let (mut n, mut iterations) = (LEN as u64, ITERATIONS);
    gpu.launch(
        f,
        GRID,
        BLOCK,
        &mut [
            arg(&mut n),
            arg(&mut iterations),
            arg(&mut dx),
            arg(&mut dy),
        ],
    );
    let mut got = vec![0.0f32; LEN];
    gpu.download(dy, &mut got);

    let mut expected = vec![0.0; LEN];
    reference::compute(ITERATIONS, &x, &mut expected);
    assert_eq!(got, expected);
}

#[test]
fn spin_keeps_the_stream_busy_for_the_time_asked() {
    let mut gpu = Gpu::new();
    let f = gpu.function(&kernels::TIMING, "spin");
    // The queries prove the stream busy only if they come before the spin can
    // have ended. No neighbouring test can hold them up (`Gpu` runs this
    // binary's tests one at a time), so only a stalled host makes them late:
    // try again then, but never pass without having checked. A launch that
    // blocked the host for the spin (not asynchronous) fails here.
    let checked = (0..3).any(|_| spin_once(&gpu, f));
    assert!(
        checked,
        "spin: the queries came after the spin's end three times: the launch blocked the host, or the host stalled"
    );
}

/// Launch one spin between two timing events. Returns whether the queries came
/// soon enough after the launch to prove the stream busy.
fn spin_once(gpu: &Gpu, f: CUfunction) -> bool {
    const SPIN: Duration = Duration::from_millis(100);
    let d = gpu.d;
    let (mut start, mut end): (CUevent, CUevent) = (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: event handles are written through valid pointers and used on
    // this test's stream only.
    unsafe {
        ok(d, "cuEventCreate", (d.cuEventCreate)(&mut start, 0));
        ok(d, "cuEventCreate", (d.cuEventCreate)(&mut end, 0));
        ok(d, "cuEventRecord", (d.cuEventRecord)(start, gpu.stream));
    }
    let mut ns = SPIN.as_nanos() as u64;
    let launched = Instant::now();
    gpu.launch(f, (1, 1, 1), (1, 1, 1), &mut [arg(&mut ns)]);
    // SAFETY: as above.
    unsafe {
        ok(d, "cuEventRecord", (d.cuEventRecord)(end, gpu.stream));
        let (stream, event) = ((d.cuStreamQuery)(gpu.stream), (d.cuEventQuery)(end));
        // The spin cannot have finished before SPIN has passed since the launch
        // began; after that, the queries prove nothing.
        let in_time = launched.elapsed() < SPIN;
        if in_time {
            assert_eq!(
                stream,
                CUresult::CUDA_ERROR_NOT_READY,
                "stream idle during a spin"
            );
            assert_eq!(
                event,
                CUresult::CUDA_ERROR_NOT_READY,
                "event passed during a spin"
            );
        }
        ok(d, "cuEventSynchronize", (d.cuEventSynchronize)(end));
        ok(d, "cuStreamQuery", (d.cuStreamQuery)(gpu.stream));
        let mut ms = 0.0f32;
        ok(
            d,
            "cuEventElapsedTime",
            (d.cuEventElapsedTime)(&mut ms, start, end),
        );
        // A lower bound only, less the timers' resolution (%globaltimer ticks in
        // microseconds, event timestamps in about half a microsecond).
        assert!(
            ms >= SPIN.as_secs_f32() * 1000.0 - 0.1,
            "spin of {SPIN:?} measured {ms} ms"
        );
        ok(d, "cuEventDestroy", (d.cuEventDestroy)(start));
        ok(d, "cuEventDestroy", (d.cuEventDestroy)(end));
        in_time
    }
}
