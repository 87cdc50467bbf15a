//! A device whose context failed during work (a kernel that faulted: on the
//! software driver, a failed launch or a twin that panicked) works again once
//! every handle of the failed context is dropped and a new context is made,
//! as on a GPU, where dropping the last handle destroys the context. Its own
//! binary: the test drops every context of device 0.

use cuda_streams_driver::{Context, DeviceBuffer, Error, LaunchConfig, Module, Result, Stream};
use kernels::FillF32;
use std::sync::Arc;

const N: usize = 64;

/// Launch `fill_f32(N, value, out)` on `stream` into a new buffer: the
/// buffer, and what the launch returned.
fn fill(stream: &Arc<Stream>, value: f32) -> (DeviceBuffer<f32>, Result<()>) {
    let ctx = stream.context();
    let kernel: FillF32 = Module::load(ctx, &kernels::ELEMENTWISE)
        .unwrap()
        .kernel()
        .unwrap();
    let mut out = DeviceBuffer::<f32>::new(ctx, N).unwrap();
    let cfg = LaunchConfig::for_num_elems(N as u32);
    let launched = kernel.launch(stream, cfg, N as u64, value, &mut out);
    (out, launched)
}

/// The sticky error of a failed launch: `CUDA_ERROR_LAUNCH_FAILED`.
fn is_launch_failure(err: &Error) -> bool {
    matches!(err, Error::Driver(_) | Error::WorkFailed { .. })
        && err.to_string().contains("CUDA_ERROR_LAUNCH_FAILED")
}

#[test]
fn a_new_context_after_the_failed_one_is_dropped_works() {
    if Context::new(0).unwrap().is_gpu() {
        eprintln!("skipped on the GPU: fault injection is a software-driver feature");
        return;
    }
    // The failed context lives and dies on a thread of its own: a thread
    // keeps the free events it released for its next acquire (the event
    // pool's per-thread shelf), and they hold their context until the
    // thread ends.
    let failed = std::thread::spawn(|| {
        let ctx = Context::new(0).unwrap();
        let stream = Stream::new(&ctx).unwrap();
        assert!(test_support::fail_next_launch(&stream));
        // The failure is asynchronous: as on a GPU, it surfaces at the first
        // call after the work failed, which is the launch itself when the
        // stream's worker got there before the launch tracked its buffer's
        // use (an event recorded after it). Either way it is sticky, so the
        // synchronize after it answers it too.
        let (out, launched) = fill(&stream, 1.0);
        if let Err(err) = &launched {
            assert!(is_launch_failure(err), "{err}");
        }
        let err = stream.synchronize().unwrap_err();
        assert!(is_launch_failure(&err), "{err}");
        // Sticky while the context lives: a new stream of it fails too.
        assert!(matches!(
            Stream::new(&ctx).map(drop),
            Err(Error::Driver(_) | Error::WorkFailed { .. })
        ));
        drop((out, stream));
        ctx.id()
    })
    .join()
    .unwrap();

    // Every handle of the failed context is gone; the next one starts clean.
    let ctx = Context::new(0).unwrap();
    assert_ne!(ctx.id(), failed, "a new context, not the failed one");
    let stream = Stream::new(&ctx).unwrap();
    let (out, launched) = fill(&stream, 2.5);
    launched.unwrap();
    assert_eq!(out.to_vec(&stream).unwrap(), vec![2.5; N]);
}
