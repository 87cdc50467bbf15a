//! cudarc interop (feature `cudarc`): cudarc streams as ours, cudarc slices
//! in our checked launches and copies, our buffers in cudarc's copies and
//! memsets, and events ordering work across the two, each checked on the
//! data.
//!
//! cudarc always talks to `libcuda.so.1`, so nearly everything here needs
//! NVIDIA's driver: on the software driver each such test says why it skips
//! (the keeping alive of a borrowed stream is tested on the software driver by
//! the driver's unit tests, `interop::cudarc::tests`). With
//! `CUDA_STREAMS_DRIVER=cuda` every test runs, and a missing GPU fails it.
//!
//! One thing cudarc does to us needs no GPU to check: it makes its own
//! context current on the calling thread. On the software driver a raw
//! `cuCtxSetCurrent` through our table stands in for it; on two GPUs cudarc
//! itself does it.

mod support;

use cuda_streams_driver::interop::cudarc::{CudarcSlice, CudarcSliceMut, CudarcStreamExt};
use cuda_streams_driver::{Context, DeviceBuffer, Error, KernelArg, LaunchConfig, Stream};
use cudarc::driver::{CudaContext, CudaSlice};
use std::sync::Arc;
use support::{GATE_LIMIT, Gate, kernel};
use sys::{CUcontext, CUresult};

const N: usize = 1 << 16;

/// Our context and cudarc's on the same device, or `None` (and why) on the
/// software driver.
fn contexts(test: &str) -> Option<(Arc<Context>, Arc<CudaContext>)> {
    let ctx = support::ctx();
    if !ctx.is_gpu() {
        eprintln!(
            "{test}: skipped: cudarc needs NVIDIA's driver (libcuda.so.1) and this run uses the \
             software driver; run with CUDA_STREAMS_DRIVER=cuda on a GPU machine"
        );
        return None;
    }
    let ordinal = ctx.info().ordinal as usize;
    let cuda = CudaContext::new(ordinal).expect("cudarc opens the device our context is on");
    Some((ctx, cuda))
}

#[test]
fn a_cudarc_stream_is_one_of_ours_and_stays_alive_while_we_hold_it() {
    let Some((ctx, cuda)) = contexts("cudarc stream as ours") else {
        return;
    };
    let cs = cuda.new_stream().unwrap();
    let raw = cs.cu_stream() as usize;
    let ours = Stream::from_cudarc(&ctx, &cs).unwrap();
    assert_eq!(ours.as_raw() as usize, raw);
    // cudarc's handle goes away; ours keeps the stream alive.
    drop(cs);
    let mut buffer = DeviceBuffer::<u32>::new_async(&ours, N).unwrap();
    ours.memset_u32_async(&mut buffer, 0xC0FFEE).unwrap();
    assert!(buffer.to_vec(&ours).unwrap().iter().all(|&v| v == 0xC0FFEE));
    // It orders against our streams like any other.
    let other = Stream::new(&ctx).unwrap();
    other.wait_stream(&ours).unwrap();
    other.synchronize().unwrap();
}

#[test]
fn a_cudarc_slice_is_an_argument_to_our_checked_launches_and_copies() {
    let Some((ctx, cuda)) = contexts("cudarc slice in our launches") else {
        return;
    };
    let cs = cuda.new_stream().unwrap();
    let ours = Stream::new(&ctx).unwrap();
    let x: Vec<f32> = (0..N).map(|i| (i % 97) as f32).collect();
    let xs: CudaSlice<f32> = cs.clone_htod(&x).unwrap();
    let mut ys: CudaSlice<f32> = cs.alloc_zeros(N).unwrap();

    let fill = kernel(&ctx, &kernels::ELEMENTWISE, "fill_f32");
    let saxpy = kernel(&ctx, &kernels::ELEMENTWISE, "saxpy");
    let cfg = LaunchConfig::for_num_elems(N as u32);
    {
        let x_arg = CudarcSlice::new(&ctx, &xs).unwrap();
        let mut y_arg = CudarcSliceMut::new(&ctx, &mut ys).unwrap();
        // y = 1, then y = 2x + y: our stream, cudarc's memory, checked launches.
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
        // A slice too short for the count is refused like one of ours.
        let short = cs.alloc_zeros::<f32>(N / 2).unwrap();
        let short_arg = CudarcSlice::new(&ctx, &short).unwrap();
        let args = [
            KernelArg::from(N as u64),
            2.0f32.into(),
            (&short_arg).into(),
            (&mut y_arg).into(),
        ];
        assert!(ours.launch(&saxpy, cfg, &args).is_err());
    }
    // cudarc reads on its own stream, with no host wait: its stream waits for
    // our launches (the wrapper ordered it after each use).
    let y = cs.clone_dtoh(&ys).unwrap();
    for (i, (&y, &x)) in y.iter().zip(&x).enumerate() {
        assert_eq!(y, 2.0f32.mul_add(x, 1.0), "element {i}");
    }
    // Our copy from a cudarc view.
    let view = xs.slice(10..20);
    let mut host = [0.0f32; 10];
    ours.copy_to_host(&mut host, &CudarcSlice::new(&ctx, &view).unwrap())
        .unwrap();
    assert_eq!(&host[..], &x[10..20]);
}

#[test]
fn a_cudarc_slice_is_not_freed_under_our_work() {
    let Some((ctx, cuda)) = contexts("cudarc slice lifetime") else {
        return;
    };
    let cs = cuda.new_stream().unwrap();
    let ours = Stream::new(&ctx).unwrap();
    let mut slice: CudaSlice<u32> = cs.alloc_zeros(N).unwrap();
    // Our stream is held behind a gate; the memset and a copy wait there.
    let gate = Gate::close_within(&ours, GATE_LIMIT);
    ours.memset_u32_async(&mut CudarcSliceMut::new(&ctx, &mut slice).unwrap(), 5)
        .unwrap();
    let mut staging = cuda_streams_driver::PinnedBuffer::<u32>::new(&ctx, N).unwrap();
    ours.copy_to_host_async(&mut staging, &CudarcSlice::new(&ctx, &slice).unwrap())
        .unwrap();
    // cudarc frees the slice on its stream, which waits for ours.
    drop(slice);
    let marker = cs.record_event(None).unwrap();
    if gate.still_held() {
        assert!(
            !marker.is_complete(),
            "cudarc's stream went past the free while our work on the slice was held"
        );
    }
    gate.open();
    marker.synchronize().unwrap();
    assert!(staging.as_slice().unwrap().iter().all(|&v| v == 5));
}

#[test]
fn our_buffers_are_arguments_to_cudarc_copies_and_memsets() {
    let Some((ctx, cuda)) = contexts("our buffers in cudarc") else {
        return;
    };
    let cs = cuda.new_stream().unwrap();
    let home = Stream::new(&ctx).unwrap();
    let data: Vec<u32> = (0..N as u32)
        .map(|i| i.wrapping_mul(2_654_435_761))
        .collect();
    let mut buffer = DeviceBuffer::from_slice(&home, &data).unwrap();

    // Another stream than the buffer's home: it waits for the allocation and
    // the upload, and the host waits for it after the copy.
    assert_eq!(
        cs.clone_dtoh(&buffer.as_cudarc(&cs).unwrap()).unwrap(),
        data
    );
    let mut copy: CudaSlice<u32> = cs.alloc_zeros(N).unwrap();
    cs.memcpy_dtod(&buffer.as_cudarc(&cs).unwrap(), &mut copy)
        .unwrap();
    assert_eq!(cs.clone_dtoh(&copy).unwrap(), data);
    cs.memset_zeros(&mut buffer.as_cudarc_mut(&cs).unwrap())
        .unwrap();
    assert!(buffer.to_vec(&home).unwrap().iter().all(|&v| v == 0));

    // A buffer whose home is the cudarc stream: no host wait at all.
    let ours = Stream::from_cudarc(&ctx, &cs).unwrap();
    let homed = DeviceBuffer::from_slice(&ours, &data).unwrap();
    assert_eq!(cs.clone_dtoh(&homed.as_cudarc(&cs).unwrap()).unwrap(), data);
}

#[test]
fn events_order_work_across_the_two_libraries() {
    let Some((ctx, cuda)) = contexts("events across libraries") else {
        return;
    };
    let cs = cuda.new_stream().unwrap();
    let ours = Stream::new(&ctx).unwrap();

    // cudarc waits for our stream.
    let gate = Gate::close_within(&ours, GATE_LIMIT);
    cs.wait_stream(&ours).unwrap();
    let after = cs.record_event(None).unwrap();
    if gate.still_held() {
        assert!(
            !after.is_complete(),
            "cudarc's stream did not wait for ours"
        );
    }
    gate.open();
    after.synchronize().unwrap();

    // cudarc waits for one of our events.
    let gate = Gate::close_within(&ours, GATE_LIMIT);
    let event = ours.record_event().unwrap();
    cs.wait_event(&event).unwrap();
    let after = cs.record_event(None).unwrap();
    if gate.still_held() {
        assert!(
            !after.is_complete(),
            "cudarc's stream did not wait for our event"
        );
    }
    gate.open();
    after.synchronize().unwrap();

    // Our stream waits for a cudarc event, recorded behind our gate on a
    // cudarc stream that is also one of ours.
    let held = Stream::from_cudarc(&ctx, &cs).unwrap();
    let gate = Gate::close_within(&held, GATE_LIMIT);
    let theirs = cs.record_event(None).unwrap();
    ours.wait_cudarc_event(&theirs).unwrap();
    let mark = ours.mark().unwrap();
    if gate.still_held() {
        assert!(
            !mark.query().unwrap(),
            "our stream did not wait for cudarc's event"
        );
    }
    gate.open();
    mark.synchronize().unwrap();
}

#[test]
fn a_software_driver_context_is_refused() {
    let Some((_ctx, cuda)) = contexts("software context refused") else {
        return;
    };
    // The software driver beside the GPU, in the same process.
    let soft = cuda_streams_driver::select(cuda_streams_driver::DriverChoice::Soft).unwrap();
    let soft_ctx = Context::with_driver(soft, 0).unwrap();
    let cs = cuda.new_stream().unwrap();
    let err = Stream::from_cudarc(&soft_ctx, &cs).unwrap_err();
    assert!(matches!(err, Error::Interop { .. }), "{err}");
    assert!(err.to_string().contains("software driver"), "{err}");
    let slice = cs.alloc_zeros::<u32>(4).unwrap();
    assert!(matches!(
        CudarcSlice::new(&soft_ctx, &slice),
        Err(Error::Interop { .. })
    ));
    // Nothing was made of it: cudarc's stream and slice still work.
    assert_eq!(cs.clone_dtoh(&slice).unwrap(), [0; 4]);
}

#[test]
fn another_context_is_refused_with_both_named() {
    let Some((ctx, _cuda)) = contexts("context mismatch") else {
        return;
    };
    let count = CudaContext::device_count().unwrap();
    if count < 2 {
        eprintln!("context mismatch: skipped: one device, so no second context to mix up");
        return;
    }
    let other = CudaContext::new(1).unwrap();
    let cs = other.new_stream().unwrap();
    let err = Stream::from_cudarc(&ctx, &cs).unwrap_err();
    assert!(matches!(err, Error::Interop { .. }), "{err}");
    assert!(err.to_string().contains("device 1"), "{err}");
}

/// The thread's current context, as the driver (our table) has it.
fn current_context(ctx: &Context) -> CUcontext {
    let mut current: CUcontext = std::ptr::null_mut();
    // SAFETY: writes one context handle through a valid pointer.
    let code = unsafe { (ctx.driver().cuCtxGetCurrent)(&mut current) };
    assert_eq!(code, CUresult::CUDA_SUCCESS, "cuCtxGetCurrent");
    current
}

/// Device 0's and device 1's contexts, this thread's cache saying device 0,
/// or `None` (and why) with one device.
fn two_devices(test: &str) -> Option<(Arc<Context>, Arc<Context>)> {
    let count = Context::device_count().unwrap();
    if count < 2 {
        eprintln!(
            "{test}: skipped: {count} device, and the wrong device needs a second one \
             (the software driver has two unless CUDA_STREAMS_SOFT_DEVICES says otherwise)"
        );
        return None;
    }
    let ctx1 = Context::new(1).unwrap();
    let ctx0 = support::ctx();
    ctx0.bind().unwrap();
    assert_eq!(current_context(&ctx0), ctx0.as_raw());
    Some((ctx0, ctx1))
}

/// With another device's context made current behind our back: new work of
/// ours on device 0 (a stream, an allocation, a module, all made in the
/// current context) writing `early`, memory of device 0 made before. Had it
/// been made on device 1, the launch would touch device 0's memory without
/// peer access and fault, or the buffer would miss the value. Returns the new
/// stream and allocation for the caller's own checks.
fn new_work_lands_on_device_0(
    ctx0: &Arc<Context>,
    early: &mut DeviceBuffer<u32>,
) -> (Arc<Stream>, DeviceBuffer<u32>) {
    let stream = Stream::new(ctx0).unwrap();
    let mut late = DeviceBuffer::<u32>::new(ctx0, N).unwrap();
    let fill = kernel(ctx0, &kernels::ELEMENTWISE, "fill_u32");
    let cfg = LaunchConfig::for_num_elems(N as u32);
    stream
        .launch(
            &fill,
            cfg,
            &[
                KernelArg::from(N as u64),
                0xD0u32.into(),
                (&mut *early).into(),
            ],
        )
        .expect("a launch on device 0 into device 0's memory");
    stream.memset_u32_async(&mut late, 0xD1).unwrap();
    let early_back = early
        .to_vec(&stream)
        .expect("device 0's memory read back after our work on device 0");
    assert!(
        early_back.iter().all(|&v| v == 0xD0),
        "the launch did not write device 0's buffer"
    );
    assert!(late.to_vec(&stream).unwrap().iter().all(|&v| v == 0xD1));
    assert_eq!(
        current_context(ctx0),
        ctx0.as_raw(),
        "our calls on device 0 left another context current"
    );
    (stream, late)
}

#[test]
fn a_context_made_current_behind_our_back_does_not_take_our_work() {
    let Some((ctx0, ctx1)) = two_devices("context made current behind our back") else {
        return;
    };
    let home = Stream::new(&ctx0).unwrap();
    let mut early = DeviceBuffer::<u32>::zeroed_async(&home, N).unwrap();
    home.synchronize().unwrap();
    // What cudarc does at each of its calls on device 1 (the GPU test below
    // has cudarc itself do it): device 1's context current, our cache still
    // saying device 0.
    // SAFETY: a retained primary context, alive while `ctx1` is.
    let code = unsafe { (ctx1.driver().cuCtxSetCurrent)(ctx1.as_raw()) };
    assert_eq!(code, CUresult::CUDA_SUCCESS);
    new_work_lands_on_device_0(&ctx0, &mut early);
}

#[test]
fn cudarc_calls_on_another_device_do_not_take_our_work() {
    if contexts("cudarc on another device").is_none() {
        return;
    }
    let Some((ctx0, _ctx1)) = two_devices("cudarc on another device") else {
        return;
    };
    let home = Stream::new(&ctx0).unwrap();
    let mut early = DeviceBuffer::<u32>::zeroed_async(&home, N).unwrap();
    home.synchronize().unwrap();
    // cudarc work on device 1 from this thread: cudarc binds device 1.
    let cuda1 = CudaContext::new(1).unwrap();
    let cs1 = cuda1.new_stream().unwrap();
    let theirs = cs1.clone_htod(&[1u32, 2, 3]).unwrap();
    assert_eq!(cs1.clone_dtoh(&theirs).unwrap(), [1, 2, 3]);
    assert_eq!(
        current_context(&ctx0).cast::<()>(),
        cuda1.cu_ctx().cast::<()>(),
        "cudarc left its context current"
    );
    let (stream, late) = new_work_lands_on_device_0(&ctx0, &mut early);
    // The driver's own word on where the new stream and allocation are.
    use cudarc::driver::sys as cu;
    let mut owner: cu::CUcontext = std::ptr::null_mut();
    // SAFETY: writes one context handle; the stream is alive (`stream`).
    let code = unsafe { cu::cuStreamGetCtx(stream.as_raw() as cu::CUstream, &mut owner) };
    assert_eq!(code, cu::CUresult::CUDA_SUCCESS);
    assert_eq!(
        owner.cast::<()>(),
        ctx0.as_raw().cast::<()>(),
        "the new stream's context"
    );
    let mut ordinal: i32 = -1;
    // SAFETY: the attribute is an int, written to a valid place of that type;
    // the allocation is alive (`late`).
    let code = unsafe {
        cu::cuPointerGetAttribute(
            (&mut ordinal as *mut i32).cast(),
            cu::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            late.as_device_ptr(),
        )
    };
    assert_eq!(code, cu::CUresult::CUDA_SUCCESS);
    assert_eq!(ordinal, 0, "the new allocation's device");
    // And cudarc finds its own context again at its next call.
    assert_eq!(cs1.clone_dtoh(&theirs).unwrap(), [1, 2, 3]);
}
