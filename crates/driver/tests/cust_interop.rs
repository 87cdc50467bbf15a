//! cust interop (feature `cust`): cust streams as ours, cust buffers in our
//! checked launches and copies, our buffers in cust's copies, and events
//! ordering work across the two, each checked on the data.
//!
//! cust links `libcuda` at build time, so this binary builds where a CUDA
//! toolkit is installed or against the link stub `cargo xtask cust-stub`
//! makes (CI), and starts where a `libcuda.so.1` is: NVIDIA's driver, or in
//! CI the stub, whose entry points all fail. With NVIDIA's driver and
//! `CUDA_STREAMS_DRIVER=cuda` every test runs and a missing GPU fails it;
//! with the software driver the tests that need our context on the GPU say
//! why they skip, and the refusal test runs where cust finds a GPU.

mod support;

use cuda_streams_driver::interop::cust::{CustBuffer, CustBufferMut, CustStreamExt};
use cuda_streams_driver::{Context, DeviceBuffer, Error, KernelArg, LaunchConfig, Stream};
use cust::event::{Event as CustEvent, EventFlags, EventStatus};
use cust::memory::{CopyDestination, DeviceBuffer as CustDeviceBuffer};
use cust::stream::{Stream as CustStream, StreamFlags};
use std::sync::Arc;
use support::{GATE_LIMIT, Gate, kernel};

const N: usize = 1 << 16;

/// cust on the device `ordinal`: its primary context, current on this
/// thread (cust keeps no context per thread for us).
fn cust_context(ordinal: u32) -> cust::context::Context {
    cust::init(cust::CudaFlags::empty()).expect("cust initialises NVIDIA's driver");
    let device = cust::device::Device::get_device(ordinal).expect("cust opens our device");
    cust::context::Context::new(device).expect("cust retains the primary context")
}

/// Our context and cust's on the same device, or `None` (and why) on the
/// software driver.
fn contexts(test: &str) -> Option<(Arc<Context>, cust::context::Context)> {
    let ctx = support::ctx();
    if !ctx.is_gpu() {
        eprintln!(
            "{test}: skipped: cust needs NVIDIA's driver and this run uses the software driver; \
             run with CUDA_STREAMS_DRIVER=cuda on a GPU machine"
        );
        return None;
    }
    let cust = cust_context(ctx.info().ordinal as u32);
    Some((ctx, cust))
}

fn cust_stream() -> Arc<CustStream> {
    Arc::new(CustStream::new(StreamFlags::NON_BLOCKING, None).unwrap())
}

#[test]
fn a_cust_stream_is_one_of_ours_and_stays_alive_while_we_hold_it() {
    let Some((ctx, _cust)) = contexts("cust stream as ours") else {
        return;
    };
    let cs = cust_stream();
    let raw = cs.as_inner() as usize;
    let ours = Stream::from_cust(&ctx, &cs).unwrap();
    assert_eq!(ours.as_raw() as usize, raw);
    // cust's handle goes away; ours keeps the stream alive.
    drop(cs);
    let mut buffer = DeviceBuffer::<u32>::new_async(&ours, N).unwrap();
    ours.memset_u32_async(&mut buffer, 0xC0FFEE).unwrap();
    assert!(buffer.to_vec(&ours).unwrap().iter().all(|&v| v == 0xC0FFEE));
    let other = Stream::new(&ctx).unwrap();
    other.wait_stream(&ours).unwrap();
    other.synchronize().unwrap();
}

#[test]
fn a_cust_buffer_is_an_argument_to_our_checked_launches_and_copies() {
    let Some((ctx, _cust)) = contexts("cust buffer in our launches") else {
        return;
    };
    let ours = Stream::new(&ctx).unwrap();
    let x: Vec<f32> = (0..N).map(|i| (i % 97) as f32).collect();
    // cust's synchronous copy (the legacy default stream); our stream waits
    // for it before the first use.
    let xs = CustDeviceBuffer::from_slice(&x).unwrap();
    let mut ys = CustDeviceBuffer::from_slice(&vec![0.0f32; N]).unwrap();

    let fill = kernel(&ctx, &kernels::ELEMENTWISE, "fill_f32");
    let saxpy = kernel(&ctx, &kernels::ELEMENTWISE, "saxpy");
    let cfg = LaunchConfig::for_num_elems(N as u32);
    {
        let x_arg = CustBuffer::new(&ctx, &xs).unwrap();
        let mut y_arg = CustBufferMut::new(&ctx, &mut ys).unwrap();
        let args = [
            KernelArg::from(N as u64),
            1.0f32.into(),
            (&mut y_arg).into(),
        ];
        ours.launch(&fill, cfg, &args).unwrap();
        let args = [
            KernelArg::from(N as u64),
            2.0f32.into(),
            (&x_arg).into(),
            (&mut y_arg).into(),
        ];
        ours.launch(&saxpy, cfg, &args).unwrap();
        // A buffer too short for the count is refused like one of ours.
        let short = CustDeviceBuffer::from_slice(&vec![0.0f32; N / 2]).unwrap();
        let short_arg = CustBuffer::new(&ctx, &short).unwrap();
        let args = [
            KernelArg::from(N as u64),
            2.0f32.into(),
            (&short_arg).into(),
            (&mut y_arg).into(),
        ];
        assert!(ours.launch(&saxpy, cfg, &args).is_err());
    }
    // cust reads synchronously: the host already waited for our launches.
    let mut y = vec![0.0f32; N];
    ys.copy_to(&mut y[..]).unwrap();
    for (i, (&y, &x)) in y.iter().zip(&x).enumerate() {
        assert_eq!(y, 2.0f32.mul_add(x, 1.0), "element {i}");
    }
    // Our copy from a cust buffer.
    let mut host = vec![0.0f32; N];
    ours.copy_to_host(&mut host, &CustBuffer::new(&ctx, &xs).unwrap())
        .unwrap();
    assert_eq!(host, x);
}

#[test]
fn a_cust_buffer_can_be_dropped_as_soon_as_our_call_returns() {
    let Some((ctx, _cust)) = contexts("cust buffer lifetime") else {
        return;
    };
    let ours = Stream::new(&ctx).unwrap();
    let mut buffer = CustDeviceBuffer::from_slice(&vec![0u32; N]).unwrap();
    // A long fill, then the memset: the call returns only once the host has
    // waited for our stream, so nothing of ours is left to use the buffer.
    let mut long = DeviceBuffer::<u32>::new_async(&ours, 1 << 26).unwrap();
    ours.memset_u32_async(&mut long, 1).unwrap();
    ours.memset_u32_async(&mut CustBufferMut::new(&ctx, &mut buffer).unwrap(), 5)
        .unwrap();
    assert!(
        ours.query().unwrap(),
        "our stream still had work after the use returned"
    );
    let mut host = vec![0u32; N];
    buffer.copy_to(&mut host[..]).unwrap();
    assert!(host.iter().all(|&v| v == 5));
    drop(buffer); // cuMemFree, after our memset
    ours.synchronize().unwrap();
}

#[test]
fn our_buffer_is_a_cust_slice_inside_a_closure() {
    let Some((ctx, _cust)) = contexts("our buffer as a cust slice") else {
        return;
    };
    let ours = Stream::new(&ctx).unwrap();
    let data: Vec<u32> = (0..N as u32).collect();
    let mut buffer = DeviceBuffer::from_slice(&ours, &data).unwrap();
    // cust reads it (the legacy default stream waits for the home stream).
    let mut host = vec![0u32; N];
    // SAFETY: the slice is not kept past the closure, and only read.
    unsafe { buffer.with_cust(|slice| slice.copy_to(&mut host[..])) }
        .unwrap()
        .unwrap();
    assert_eq!(host, data);
    // cust writes it; ours reads it back on the home stream.
    let doubled: Vec<u32> = data.iter().map(|v| v * 2).collect();
    // SAFETY: as above.
    unsafe { buffer.with_cust_mut(|slice| slice.copy_from(&doubled[..])) }
        .unwrap()
        .unwrap();
    assert_eq!(buffer.to_vec(&ours).unwrap(), doubled);
    // cust's write, then the free on the home stream, which waits for it.
    // SAFETY: as above.
    unsafe { buffer.with_cust_mut(|slice| slice.copy_from(&data[..])) }
        .unwrap()
        .unwrap();
    drop(buffer);
    ours.synchronize().unwrap();
}

#[test]
fn events_order_work_across_the_two() {
    let Some((ctx, _cust)) = contexts("events across cust and ours") else {
        return;
    };
    let ours = Stream::new(&ctx).unwrap();
    let cs = cust_stream();
    let gate = Gate::close_within(&ours, GATE_LIMIT);
    // cust's stream waits for ours; a cust event after that waits too.
    cs.wait_our_stream(&ours).unwrap();
    let after_ours = CustEvent::new(EventFlags::DEFAULT).unwrap();
    after_ours.record(&cs).unwrap();
    // Another of our streams waits for cust's stream (so for ours).
    let other = Stream::new(&ctx).unwrap();
    other.wait_cust_stream(&cs).unwrap();
    let mark = other.mark().unwrap();
    // And cust's stream waits for one of our events on `other`.
    let cs2 = cust_stream();
    let ev = other.record_event().unwrap();
    cs2.wait_our_event(&ev).unwrap();
    let last = CustEvent::new(EventFlags::DEFAULT).unwrap();
    last.record(&cs2).unwrap();
    if gate.still_held() {
        assert_eq!(after_ours.query().unwrap(), EventStatus::NotReady);
        assert!(!mark.query().unwrap(), "our stream went past cust's stream");
        assert_eq!(last.query().unwrap(), EventStatus::NotReady);
    }
    gate.open();
    last.synchronize().unwrap();
    assert!(mark.query().unwrap());
    assert_eq!(after_ours.query().unwrap(), EventStatus::Ready);
}

#[test]
fn the_software_driver_and_other_contexts_are_refused() {
    let ctx = support::ctx();
    if ctx.is_gpu() {
        // On the GPU the refusal is for another context: cust's own,
        // non-primary one.
        let _cust = cust_context(ctx.info().ordinal as u32);
        let device = cust::device::Device::get_device(ctx.info().ordinal as u32).unwrap();
        let other = cust::context::legacy::Context::create_and_push(
            cust::context::legacy::ContextFlags::SCHED_AUTO,
            device,
        )
        .unwrap();
        let cs = cust_stream();
        let buffer = CustDeviceBuffer::from_slice(&[1u32, 2, 3]).unwrap();
        cust::context::legacy::ContextStack::pop().unwrap();
        let err = Stream::from_cust(&ctx, &cs).expect_err("another context's stream");
        assert!(matches!(err, Error::Interop { .. }), "{err}");
        let err = CustBuffer::new(&ctx, &buffer)
            .err()
            .expect("another context's buffer");
        assert!(matches!(err, Error::Interop { .. }), "{err}");
        // cust frees them in their own context.
        cust::context::legacy::ContextStack::push(&other).unwrap();
        drop((cs, buffer));
        cust::context::legacy::ContextStack::pop().unwrap();
        drop(other);
        return;
    }
    // The software driver. cust may find no GPU, or no driver at all: in CI
    // this binary runs against the link stub, which fails every call.
    if let Err(err) = cust::init(cust::CudaFlags::empty()) {
        eprintln!(
            "software-driver refusals: skipped: cust cannot initialise a GPU to make a stream \
             on ({err:?}; the link stub of `cargo xtask cust-stub` answers every call with \
             CUDA_ERROR_STUB_LIBRARY)"
        );
        return;
    }
    let _cust = cust_context(0);
    let cs = cust_stream();
    let buffer = CustDeviceBuffer::from_slice(&[1u32, 2, 3]).unwrap();
    let err = Stream::from_cust(&ctx, &cs).expect_err("refused on the software driver");
    assert!(err.to_string().contains("software driver"), "{err}");
    let err = CustBuffer::new(&ctx, &buffer)
        .err()
        .expect("refused on the software driver");
    assert!(matches!(err, Error::Interop { .. }), "{err}");
    let stream = Stream::new(&ctx).unwrap();
    let ours = DeviceBuffer::from_slice(&stream, &[1u32]).unwrap();
    // SAFETY: the closure keeps nothing.
    let err = unsafe { ours.with_cust(|_| ()) }.expect_err("refused");
    assert!(matches!(err, Error::Interop { .. }), "{err}");
}
