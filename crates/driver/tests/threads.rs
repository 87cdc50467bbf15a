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

/// One thread captures and ends graphs while another synchronizes the
/// context: each synchronize either runs while no capture is open or is
/// refused, and never lands inside a capture (which would invalidate it,
/// as on a GPU). Between `Context::synchronize`'s check for open captures
/// and its driver call, a capture must not begin.
#[test]
fn context_synchronize_never_invalidates_a_capture_begun_on_another_thread() {
    let _serial = support::serial();
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let buffer = Arc::new(DeviceBuffer::<u32>::new(&ctx, 64).unwrap());
    let rounds = 2_000;
    std::thread::scope(|scope| {
        let syncing = scope.spawn(|| {
            let (mut ran, mut refused) = (0, 0);
            for _ in 0..rounds {
                match ctx.synchronize() {
                    Ok(()) => ran += 1,
                    Err(cuda_streams_driver::Error::ContextCapturing { .. }) => refused += 1,
                    Err(other) => panic!("synchronize failed: {other}"),
                }
            }
            (ran, refused)
        });
        for round in 0..rounds {
            let mut capture = stream.begin_capture().unwrap();
            capture.memset_u8(&stream, &buffer, 1).unwrap();
            if let Err(err) = capture.end() {
                panic!("capture {round} failed: {err}");
            }
        }
        let (ran, refused) = syncing.join().unwrap();
        assert_eq!(ran + refused, rounds);
    });
}

/// One thread captures and ends graphs on a stream while another queries
/// and synchronizes that stream: each call waits or is refused, and never
/// lands inside a capture that began after its check.
#[test]
fn stream_query_and_synchronize_never_invalidate_a_capture_begun_on_another_thread() {
    let _serial = support::serial();
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let buffer = Arc::new(DeviceBuffer::<u32>::new(&ctx, 64).unwrap());
    let rounds = 2_000;
    std::thread::scope(|scope| {
        let syncing = scope.spawn(|| {
            let (mut ran, mut refused) = (0, 0);
            for _ in 0..rounds {
                // A query and a synchronize, each waiting or refused.
                let polled = stream.query().map(drop);
                match polled.and_then(|()| stream.synchronize()) {
                    Ok(()) => ran += 1,
                    Err(cuda_streams_driver::Error::StreamCapturing { .. }) => refused += 1,
                    Err(other) => panic!("synchronize failed: {other}"),
                }
            }
            (ran, refused)
        });
        for round in 0..rounds {
            let mut capture = stream.begin_capture().unwrap();
            capture.memset_u8(&stream, &buffer, 1).unwrap();
            if let Err(err) = capture.end() {
                panic!("capture {round} failed: {err}");
            }
        }
        let (ran, refused) = syncing.join().unwrap();
        assert_eq!(ran + refused, rounds);
    });
}
