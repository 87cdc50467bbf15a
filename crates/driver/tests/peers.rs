//! Two devices through the safe layer: contexts per device, peer copies both
//! ways, a stream of one device ordered after another device's stream, and
//! memory of one device refused (naming both) on another device's stream.
//! Each test skips, saying why, when the driver has fewer than two devices.

mod support;

use cuda_streams_driver::{
    Context, DeviceBuffer, Error, KernelArg, LaunchConfig, PinnedBuffer, Stream,
};
use std::sync::Arc;
use support::{GATE_LIMIT, Gate, XorShift, kernel};

/// Devices 0 and 1, or `None` (printed why) with fewer than two.
fn two_devices() -> Option<[Arc<Context>; 2]> {
    let count = Context::device_count().expect("the driver answers");
    if count < 2 {
        eprintln!("skipped: needs two devices, the driver reports {count}");
        return None;
    }
    Some([Context::new(0).unwrap(), Context::new(1).unwrap()])
}

#[test]
fn every_device_has_its_own_context() {
    let all = Context::all().unwrap();
    assert_eq!(all.len() as i32, Context::device_count().unwrap());
    for (ordinal, ctx) in all.iter().enumerate() {
        assert_eq!(ctx.ordinal(), ordinal as i32);
        assert!(Arc::ptr_eq(ctx, &Context::new(ordinal as i32).unwrap()));
    }
    if all.len() > 1 {
        assert_ne!(all[0].id(), all[1].id());
        assert_ne!(all[0].as_raw(), all[1].as_raw());
    }
}

#[test]
fn peer_copies_carry_data_both_ways() {
    let Some([gpu0, gpu1]) = two_devices() else {
        return;
    };
    let (s0, s1) = (Stream::new(&gpu0).unwrap(), Stream::new(&gpu1).unwrap());
    let mut rng = XorShift::new(17);
    let len = (1 << 18) + 5;
    let (data0, data1) = (rng.u32s(len), rng.u32s(len));
    let on0 = DeviceBuffer::from_slice(&s0, &data0).unwrap();
    let on1 = DeviceBuffer::from_slice(&s1, &data1).unwrap();
    let mut into1 = DeviceBuffer::<u32>::new_async(&s1, len).unwrap();
    let mut into0 = DeviceBuffer::<u32>::new(&gpu0, len).unwrap();
    // 0 -> 1 on device 1's stream, 1 -> 0 on device 0's.
    s1.wait_stream(&s0).unwrap();
    s1.copy_peer_async(&mut into1, &on0).unwrap();
    s0.wait_stream(&s1).unwrap();
    s0.copy_peer_async(&mut into0, &on1).unwrap();
    assert_eq!(into1.to_vec(&s1).unwrap(), data0);
    assert_eq!(into0.to_vec(&s0).unwrap(), data1);
    if gpu0.can_access_peer(&gpu1).unwrap() {
        assert!(gpu0.has_peer_access(&gpu1) && gpu1.has_peer_access(&gpu0));
    }
    assert!(s1.metrics().bytes_transferred as usize >= len * 4);
    let mut short = DeviceBuffer::<u32>::new(&gpu1, 3).unwrap();
    let err = s1.copy_peer_async(&mut short, &on0).unwrap_err();
    assert!(matches!(err, Error::SizeMismatch { .. }), "{err}");
}

#[test]
fn a_peer_copy_waits_for_a_producer_on_the_other_device() {
    let Some([gpu0, gpu1]) = two_devices() else {
        return;
    };
    let (producer, consumer) = (Stream::new(&gpu0).unwrap(), Stream::new(&gpu1).unwrap());
    let mut src = DeviceBuffer::<u32>::new(&gpu0, 4096).unwrap();
    producer.memset_u32_async(&mut src, 1).unwrap();
    producer.synchronize().unwrap();
    let mut dst = DeviceBuffer::<u32>::new(&gpu1, 4096).unwrap();
    consumer.memset_u32_async(&mut dst, 0).unwrap();
    let mut out = PinnedBuffer::<u32>::new(&gpu1, 4096).unwrap();

    let gate = Gate::close_within(&producer, GATE_LIMIT);
    producer.memset_u32_async(&mut src, 7).unwrap();
    let written = producer.record_event().unwrap();
    consumer.wait_event(&written).unwrap();
    consumer.copy_peer_async(&mut dst, &src).unwrap();
    consumer.copy_to_host_async(&mut out, &dst).unwrap();
    let done = consumer.record_event().unwrap();
    if gate.still_held() {
        assert!(
            !done.query().unwrap(),
            "device 1 ran ahead of device 0's gate"
        );
        assert!(!consumer.query().unwrap());
    }
    gate.open();
    assert!(out.as_slice().unwrap().iter().all(|&v| v == 7));
    // The copy read what device 0 wrote, so the consumer passed `written`.
    // (`as_slice` waits for the copy, not for `done`, recorded after it.)
    assert!(written.query().unwrap());
    done.synchronize().unwrap();
}

#[test]
fn a_stream_joins_streams_of_another_device() {
    let Some([gpu0, gpu1]) = two_devices() else {
        return;
    };
    let (a, b) = (Stream::new(&gpu0).unwrap(), Stream::new(&gpu1).unwrap());
    let gate = Gate::close_within(&a, GATE_LIMIT);
    b.join(&[&a]).unwrap();
    let after = b.record_event().unwrap();
    if gate.still_held() {
        assert!(!after.query().unwrap(), "the join let device 1 pass");
    }
    gate.open();
    after.synchronize().unwrap();
    assert!(a.query().unwrap());
}

fn assert_names_both_devices(result: cuda_streams_driver::Result<()>, what: &str) {
    match result {
        Err(err @ Error::DeviceMismatch { .. }) => {
            let Error::DeviceMismatch {
                stream_device,
                found_device,
                ..
            } = err
            else {
                unreachable!()
            };
            assert_eq!((stream_device, found_device), (1, 0), "{what}");
            let text = err.to_string();
            assert!(
                text.contains("device 0") && text.contains("device 1"),
                "{what}: {text}"
            );
        }
        other => panic!("{what}: expected DeviceMismatch, got {other:?}"),
    }
}

#[test]
fn memory_of_one_device_on_another_devices_stream_is_an_error_naming_both() {
    let Some([gpu0, gpu1]) = two_devices() else {
        return;
    };
    let s0 = Stream::new(&gpu0).unwrap();
    let s1 = Stream::new(&gpu1).unwrap();
    let mut on0 = DeviceBuffer::<f32>::from_slice(&s0, &[1.0; 64]).unwrap();
    let mut on1 = DeviceBuffer::<f32>::new_async(&s1, 64).unwrap();
    let mut host1 = PinnedBuffer::<f32>::new(&gpu1, 64).unwrap();
    assert_names_both_devices(s1.memset_u32_async(&mut on0, 0), "memset");
    assert_names_both_devices(
        s1.copy_device_to_device_async(&mut on1, &on0),
        "device-to-device copy",
    );
    assert_names_both_devices(s1.copy_to_host_async(&mut host1, &on0), "copy to host");
    let fill = kernel(&gpu1, &kernels::ELEMENTWISE, "fill_f32");
    let cfg = LaunchConfig::for_num_elems(64);
    let args = [KernelArg::from(64u64), 2.0f32.into(), (&mut on0).into()];
    assert_names_both_devices(s1.launch(&fill, cfg, &args), "launch");
    // A kernel of device 0 on device 1's stream, too.
    let fill0 = kernel(&gpu0, &kernels::ELEMENTWISE, "fill_f32");
    let args = [KernelArg::from(64u64), 2.0f32.into(), (&mut on1).into()];
    assert_names_both_devices(s1.launch(&fill0, cfg, &args), "kernel of device 0");
    // The refusals left everything usable: the right way still works.
    s1.copy_peer_async(&mut on1, &on0).unwrap();
    assert_eq!(on1.to_vec(&s1).unwrap(), vec![1.0; 64]);
    // An event is recorded only on its own device's streams.
    let event = cuda_streams_driver::Event::plain(&gpu0).unwrap();
    match event.record(&s1) {
        Err(Error::DeviceMismatch { .. }) => {}
        other => panic!("expected DeviceMismatch, got {other:?}"),
    }
}

#[test]
fn a_buffer_freed_right_after_a_peer_copy_outlives_the_copy() {
    let Some([gpu0, gpu1]) = two_devices() else {
        return;
    };
    let (s0, s1) = (Stream::new(&gpu0).unwrap(), Stream::new(&gpu1).unwrap());
    let data: Vec<u32> = (0..10_000).collect();
    let src = DeviceBuffer::from_slice(&s0, &data).unwrap();
    let mut dst = DeviceBuffer::<u32>::new_async(&s1, data.len()).unwrap();
    let gate = Gate::close_within(&s1, GATE_LIMIT);
    s1.copy_peer_async(&mut dst, &src).unwrap();
    // Freed in stream order on device 0 after device 1's copy, which the
    // gate still holds: the memory must stay until the copy has run.
    drop(src);
    gate.open();
    assert_eq!(dst.to_vec(&s1).unwrap(), data);
    s0.synchronize().unwrap();
}
