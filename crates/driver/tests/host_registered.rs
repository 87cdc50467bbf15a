//! `HostRegistered`: a user's own memory as a copy source and destination,
//! registered while borrowed; dropping it waits for its copies; the driver's
//! refusals (empty, already registered, pinned already) come back as errors. The borrow rules
//! themselves are proved by `compile_fail/registered_*.rs`.
//!
//! Each test holds `serial()`: two tests' buffers may share a page, and two
//! registrations may not.

mod support;

use cuda_streams_driver::sys::CUresult;
use cuda_streams_driver::{DeviceBuffer, Error, HostRegistered, PinnedBuffer, Stream};
use std::time::Duration;
use support::{Gate, ctx, serial};

#[test]
fn registered_memory_round_trips_through_the_device() {
    let _serial = serial();
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let mut data: Vec<u32> = (0..4096).collect();
    let mut device = DeviceBuffer::<u32>::new_async(&stream, data.len()).unwrap();
    let len = HostRegistered::scope(&ctx, &mut data, |registered| {
        stream.copy_from_host_async(&mut device, registered)?;
        // Writing waits for the copy that reads the old values.
        registered.as_mut_slice()?.fill(0);
        stream.memset_u32_async(&mut device, 5).unwrap();
        stream.copy_to_host_async(registered, &device)?;
        assert_eq!(registered.as_slice()?, &[5u32; 4096][..]);
        Ok::<_, Error>(registered.len())
    })
    .unwrap()
    .unwrap();
    assert_eq!(len, 4096);
    assert!(data.iter().all(|&v| v == 5));
}

#[test]
fn the_scope_waits_for_copies_into_the_memory_before_it_ends() {
    let _serial = serial();
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let device = DeviceBuffer::from_slice(&stream, &[7u32; 1024]).unwrap();
    let mut data = vec![0u32; 1024];
    // The gate opens by itself; until then the copy cannot run. Had the
    // scope not waited for it, `data` would still be zeros afterwards.
    let gate = Gate::close_within(&stream, Duration::from_millis(300));
    HostRegistered::scope(&ctx, &mut data, |registered| {
        stream.copy_to_host_async(registered, &device).unwrap();
    })
    .unwrap();
    assert!(
        data.iter().all(|&v| v == 7),
        "the scope ended before the copy"
    );
    drop(gate);
}

#[test]
fn new_and_drop_register_and_unregister() {
    let _serial = serial();
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let mut data = vec![3u8; 10_000];
    let mut device = DeviceBuffer::<u8>::new_async(&stream, data.len()).unwrap();
    {
        // SAFETY: dropped at the end of this block, before `data` is used again.
        let registered = unsafe { HostRegistered::new(&ctx, &mut data) }.unwrap();
        stream
            .copy_from_host_async(&mut device, &registered)
            .unwrap();
    }
    assert_eq!(device.to_vec(&stream).unwrap(), vec![3u8; 10_000]);
    // Unregistered by the drop: the same memory registers again.
    HostRegistered::scope(&ctx, &mut data, |r| assert_eq!(r.size_in_bytes(), 10_000)).unwrap();
}

#[test]
fn empty_and_doubly_registered_memory_is_refused() {
    let _serial = serial();
    let ctx = ctx();
    let mut empty: Vec<f32> = Vec::new();
    let err = HostRegistered::scope(&ctx, &mut empty, |_| ()).unwrap_err();
    assert!(matches!(err, Error::ZeroSize { len: 0, .. }), "{err}");
    assert!(err.to_string().contains("HostRegistered"), "{err}");

    if ctx.is_gpu() {
        eprintln!(
            "skipped on the GPU: page sharing between registrations is the software driver's model"
        );
        return;
    }
    // Two halves of one small Vec share a page: the second registration is
    // refused, as a GPU driver refuses memory it has already registered.
    let mut data = vec![0u8; 256];
    let (front, back) = data.split_at_mut(128);
    HostRegistered::scope(&ctx, front, |_| {
        let err = HostRegistered::scope(&ctx, &mut *back, |_| ()).unwrap_err();
        assert!(matches!(err, Error::HostRegister { .. }), "{err:?}");
        let text = err.to_string();
        assert!(text.contains("ALREADY_REGISTERED"), "{text}");
        assert!(text.contains("needs no second registration"), "{text}");
    })
    .unwrap();
}

/// On either driver: a `PinnedBuffer`'s memory (from `cuMemHostAlloc`) is
/// page-locked already; the refusal (a GPU driver's `INVALID_VALUE`) says
/// that it needs no registration.
#[test]
fn pinned_memory_is_refused_saying_it_needs_no_registration() {
    let _serial = serial();
    let ctx = ctx();
    let mut pinned = PinnedBuffer::<u8>::new(&ctx, 4096).unwrap();
    let address = pinned.as_slice().unwrap().as_ptr() as u64;
    let err = HostRegistered::scope(&ctx, pinned.as_mut_slice().unwrap(), |_| ()).unwrap_err();
    let Error::HostRegister {
        address: refused,
        bytes,
        ref source,
        ..
    } = err
    else {
        panic!("{err:?}");
    };
    assert_eq!((refused, bytes), (address, 4096));
    assert_eq!(source.code(), CUresult::CUDA_ERROR_INVALID_VALUE);
    let text = err.to_string();
    assert!(
        text.contains(&format!("4096 bytes at {address:#x}"))
            && text.contains("page-locked already")
            && text.contains("needs no registration"),
        "{text}"
    );
}
