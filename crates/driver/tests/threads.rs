//! Many threads sharing one context and stream (and buffers) copy and launch
//! concurrently; every result is right and the counters add up exactly.

mod support;

use cuda_streams_driver::{DeviceBuffer, KernelArg, LaunchConfig, PinnedBuffer, Stream};
use kernels::reference;
use std::sync::Arc;
use support::{XorShift, checksum, ctx, kernel};

const THREADS: usize = 8;
const ROUNDS: usize = 12;
const N: usize = 3000;

#[test]
fn threads_sharing_a_stream_copy_and_launch() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let saxpy = kernel(&ctx, &kernels::ELEMENTWISE, "saxpy");

    std::thread::scope(|scope| {
        for t in 0..THREADS {
            let (ctx, stream, saxpy) = (Arc::clone(&ctx), Arc::clone(&stream), saxpy.clone());
            scope.spawn(move || {
                let mut rng = XorShift::new(1000 + t as u64);
                for _ in 0..ROUNDS {
                    let (a, x, y) = (rng.next_f32(), rng.f32s(N), rng.f32s(N));
                    let px = PinnedBuffer::from_slice(&ctx, &x).unwrap();
                    let py = PinnedBuffer::from_slice(&ctx, &y).unwrap();
                    let mut dx = DeviceBuffer::<f32>::new_async(&stream, N).unwrap();
                    let mut dy = DeviceBuffer::<f32>::new_async(&stream, N).unwrap();
                    stream.copy_from_host_async(&mut dx, &px).unwrap();
                    stream.copy_from_host_async(&mut dy, &py).unwrap();
                    let args = [
                        KernelArg::from(N as u64),
                        a.into(),
                        (&dx).into(),
                        (&mut dy).into(),
                    ];
                    stream
                        .launch(&saxpy, LaunchConfig::for_num_elems(N as u32), &args)
                        .unwrap();
                    let mut out = PinnedBuffer::<f32>::new(&ctx, N).unwrap();
                    stream.copy_to_host_async(&mut out, &dy).unwrap();
                    let mut expected = y;
                    reference::saxpy(a, &x, &mut expected);
                    assert_eq!(out.as_slice().unwrap(), &expected[..]);
                }
            });
        }
    });

    let m = stream.metrics();
    let work = (THREADS * ROUNDS) as u64;
    assert_eq!(m.kernel_launches, work);
    assert_eq!(m.memory_transfers, 3 * work);
    assert_eq!(m.bytes_transferred, 3 * work * (N * 4) as u64);
    assert_eq!(m.operations_count, 4 * work);
    assert_eq!(m.current_memory, 0, "every buffer was freed");
    assert!(m.peak_memory >= 2 * (N * 4) as u64);
}

#[test]
fn threads_read_a_shared_buffer_on_their_own_streams() {
    let ctx = ctx();
    let home = Stream::new(&ctx).unwrap();
    let checksum_kernel = kernel(&ctx, &kernels::REDUCE, "checksum");
    let data = XorShift::new(4242).u32s(N);
    let expected = reference::checksum(&data);
    let shared = Arc::new(DeviceBuffer::from_slice(&home, &data).unwrap());

    let sums: Vec<_> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..THREADS)
            .map(|_| {
                let (ctx, shared, kernel) = (
                    Arc::clone(&ctx),
                    Arc::clone(&shared),
                    checksum_kernel.clone(),
                );
                scope.spawn(move || {
                    let stream = Stream::new(&ctx).unwrap();
                    let mut sum = DeviceBuffer::<u64>::zeroed_async(&stream, 1).unwrap();
                    for _ in 0..ROUNDS {
                        checksum(&stream, &kernel, &shared, &mut sum);
                    }
                    // The last thread to finish frees the shared buffer here,
                    // possibly while other streams still read it.
                    drop(shared);
                    sum.to_vec(&stream).unwrap()[0]
                })
            })
            .collect();
        // From here a thread's Arc may be the last one.
        drop(shared);
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let want = expected.wrapping_mul(ROUNDS as u64);
    assert!(sums.iter().all(|&s| s == want), "{sums:?} != {want}");
}

/// `ROUNDS` captures begun and ended on `stream` on this thread while
/// another thread makes `call` as often: each call runs or is refused
/// (`refused` says which errors are refusals), and no capture fails, as a
/// call landing inside one would make it (on a GPU too).
fn captures_against(
    stream: &Stream,
    call: impl Fn() -> cuda_streams_driver::Result<()> + Sync,
    refused: impl Fn(&cuda_streams_driver::Error) -> bool + Sync,
) {
    const ROUNDS: usize = 2_000;
    let buffer = Arc::new(DeviceBuffer::<u32>::new(stream.context(), 64).unwrap());
    std::thread::scope(|scope| {
        let calling = scope.spawn(|| {
            for _ in 0..ROUNDS {
                match call() {
                    Err(err) if !refused(&err) => panic!("the call failed: {err}"),
                    _ => {}
                }
            }
        });
        for round in 0..ROUNDS {
            let mut capture = stream.begin_capture().unwrap();
            capture.memset_u8(stream, &buffer, 1).unwrap();
            if let Err(err) = capture.end() {
                panic!("capture {round} failed: {err}");
            }
        }
        calling.join().unwrap();
    });
}

/// Between `Context::synchronize`'s check for open captures and its driver
/// call, no capture may begin on another thread.
#[test]
fn context_synchronize_never_invalidates_a_capture_begun_on_another_thread() {
    let _serial = support::serial();
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    captures_against(
        &stream,
        || ctx.synchronize(),
        |err| matches!(err, cuda_streams_driver::Error::ContextCapturing { .. }),
    );
}

/// Nor between `Stream::query`'s or `Stream::synchronize`'s check and
/// theirs, on their own stream.
#[test]
fn stream_query_and_synchronize_never_invalidate_a_capture_begun_on_another_thread() {
    let _serial = support::serial();
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    captures_against(
        &stream,
        || stream.query().and_then(|_| stream.synchronize()),
        |err| matches!(err, cuda_streams_driver::Error::StreamCapturing { .. }),
    );
}

/// A module dropped while a capture is open in its context does not
/// synchronize the context (that would invalidate the capture): it stays
/// loaded until the context's next synchronization, then is unloaded.
#[test]
fn a_module_dropped_during_a_capture_is_unloaded_after_the_next_synchronize() {
    let _serial = support::serial();
    let ctx = ctx();
    if ctx.is_gpu() {
        eprintln!("skipped on the GPU: it asks the driver about an unloaded module's handle");
        return;
    }
    let stream = Stream::new(&ctx).unwrap();
    let buffer = Arc::new(DeviceBuffer::<u32>::new(&ctx, 64).unwrap());
    let module = cuda_streams_driver::Module::load(&ctx, &kernels::ELEMENTWISE).unwrap();
    let raw = module.as_raw();
    let loaded = || {
        let mut function = std::ptr::null_mut();
        // SAFETY: the software driver looks the handle up in its registry
        // and answers for a stale one; the name is a NUL-terminated string.
        let code =
            unsafe { (ctx.driver().cuModuleGetFunction)(&mut function, raw, c"fill_u32".as_ptr()) };
        code == sys::CUresult::CUDA_SUCCESS
    };
    let mut capture = stream.begin_capture().unwrap();
    capture.memset_u8(&stream, &buffer, 1).unwrap();
    drop(module);
    assert!(
        loaded(),
        "unloading now would have synchronized the context"
    );
    capture.end().expect("the capture was not invalidated");
    assert!(loaded(), "nothing has synchronized the context yet");
    ctx.synchronize().unwrap();
    assert!(!loaded(), "unloaded by the synchronize");
}

/// A module whose unload was deferred by a capture, when its context's
/// last handle goes before any synchronize: the context unloads it then,
/// even though the primary context lives on (another retain of it).
#[test]
fn a_deferred_module_is_unloaded_when_its_context_goes() {
    let _serial = support::serial();
    let ctx = ctx();
    if ctx.is_gpu() {
        eprintln!("skipped on the GPU: it asks the driver about an unloaded module's handle");
        return;
    }
    let driver = ctx.driver();
    let mut primary = std::ptr::null_mut();
    // SAFETY: one retain of device 0's primary context, released below.
    let code = unsafe { (driver.cuDevicePrimaryCtxRetain)(&mut primary, 0) };
    assert_eq!(code, sys::CUresult::CUDA_SUCCESS);
    let module = cuda_streams_driver::Module::load(&ctx, &kernels::ELEMENTWISE).unwrap();
    let raw = module.as_raw();
    let loaded = || {
        let mut function = std::ptr::null_mut();
        // SAFETY: as in the test above: the software driver answers for a
        // stale handle.
        let code =
            unsafe { (driver.cuModuleGetFunction)(&mut function, raw, c"fill_u32".as_ptr()) };
        code == sys::CUresult::CUDA_SUCCESS
    };
    {
        let stream = Stream::new(&ctx).unwrap();
        let buffer = Arc::new(DeviceBuffer::<u32>::new(&ctx, 64).unwrap());
        let mut capture = stream.begin_capture().unwrap();
        capture.memset_u8(&stream, &buffer, 1).unwrap();
        drop(module);
        drop(capture.end().unwrap());
    }
    assert!(loaded(), "deferred: nothing has synchronized the context");
    let weak = Arc::downgrade(&ctx);
    drop(ctx);
    if weak.upgrade().is_some() {
        eprintln!("note: another handle of the context is alive; the unload waits for it");
    } else {
        assert!(!loaded(), "unloaded as the context went");
    }
    // SAFETY: the retain taken above, released once.
    let code = unsafe { (driver.cuDevicePrimaryCtxRelease)(0) };
    assert_eq!(code, sys::CUresult::CUDA_SUCCESS);
}
