//! SM partitions (green contexts) through the safe layer: the SMs granted
//! after rounding, the errors that name what was asked, streams that keep
//! their partition alive, kernels launched in any partition, memory of
//! another device refused, and the ordering between partitions: a stream of
//! one partition does not wait for another partition's work, unless an event
//! orders it (shown with gates, not timing), and a graph captured on a
//! partition's stream that replays after the partition's handles are gone.
//! Every test holds the serial lock: a capture elsewhere in the process
//! would refuse the context-wide calls the others make.

mod support;

use cuda_streams_driver::{
    Context, DeviceBuffer, Error, GraphArg, Kernel, KernelArg, LaunchConfig, Sms, Stream,
    StreamPriority,
};
use std::sync::Arc;
use std::time::Duration;
use support::{GATE_LIMIT, Gate, kernel, serial};

/// The `fill_f32` kernel of `stream`'s device.
fn fill_kernel(stream: &Stream) -> Kernel {
    kernel(stream.context(), &kernels::ELEMENTWISE, "fill_f32")
}

/// `fill_f32(n, value, out)` on `stream`.
fn fill(stream: &Stream, value: f32, out: &mut DeviceBuffer<f32>) {
    fill_with(&fill_kernel(stream), stream, value, out);
}

/// `fill_f32(n, value, out)` of `fill` on `stream`.
fn fill_with(fill: &Kernel, stream: &Stream, value: f32, out: &mut DeviceBuffer<f32>) {
    let n = out.len();
    let args = [KernelArg::from(n as u64), value.into(), out.into()];
    stream
        .launch(fill, LaunchConfig::for_num_elems(n as u32), &args)
        .expect("fill launches in a partition");
}

#[test]
fn partitions_report_the_sms_granted_after_rounding_and_the_remainder() {
    let _serial = serial();
    let ctx = support::ctx();
    let (total, granularity) = ctx.partitionable_sms().unwrap();
    let split = ctx
        .partition(&[Sms(1), Sms(granularity + 1)])
        .expect("two small partitions fit");
    let granted: Vec<u32> = split.partitions.iter().map(|p| p.sms()).collect();
    assert_eq!(
        granted,
        [granularity, 2 * granularity],
        "rounded up to {granularity}"
    );
    let requested: Vec<_> = split.partitions.iter().map(|p| p.requested()).collect();
    assert_eq!(requested, [Some(1), Some(granularity + 1)]);
    let rest = split.remainder.as_ref().expect("SMs are left");
    // The remainder holds what partitions cannot take besides what is left.
    assert!(rest.sms() >= total - 3 * granularity, "{}", rest.sms());
    assert_eq!(rest.requested(), None);
    assert!(std::sync::Arc::ptr_eq(rest.context(), &ctx));
}

#[test]
fn partitions_of_one_size_are_one_group_each_and_mixed_sizes_several() {
    let _serial = serial();
    let ctx = support::ctx();
    if ctx.is_gpu() {
        eprintln!("skipped on the GPU: how a descriptor was made is the software driver's to tell");
        return;
    }
    let (_, granularity) = ctx.partitionable_sms().unwrap();
    let groups = |split: &cuda_streams_driver::Partitions| -> Vec<Option<u32>> {
        split
            .partitions
            .iter()
            .map(|p| soft_driver::green_context_groups(p.as_raw()))
            .collect()
    };
    // Two partitions of 4 groups' worth: each one group of that size, as
    // green-context code splits a device itself.
    let same = ctx
        .partition(&[Sms(4 * granularity), Sms(4 * granularity - 1)])
        .unwrap();
    assert_eq!(groups(&same), [Some(1), Some(1)]);
    assert_eq!(
        same.partitions.iter().map(|p| p.sms()).collect::<Vec<_>>(),
        [4 * granularity; 2]
    );
    drop(same);
    // Mixed sizes: groups of the granularity, as many as each needs.
    let mixed = ctx
        .partition(&[Sms(4 * granularity), Sms(granularity)])
        .unwrap();
    assert_eq!(groups(&mixed), [Some(4), Some(1)]);
}

#[test]
fn zero_sms_and_more_sms_than_are_left_are_errors_naming_the_partition() {
    let _serial = serial();
    let ctx = support::ctx();
    let (total, granularity) = ctx.partitionable_sms().unwrap();
    let err = ctx.partition(&[Sms(8), Sms(0)]).unwrap_err();
    assert!(
        matches!(err, Error::PartitionOfZeroSms { index: 1 }),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("partition 1 asks for 0 SMs"),
        "{err}"
    );

    let err = ctx.partition(&[Sms(total + 1)]).unwrap_err();
    match &err {
        Error::PartitionTooLarge {
            index: 0,
            requested,
            available,
            total: all,
            ..
        } => {
            assert_eq!((*requested, *available), (total + 1, total));
            assert!(
                *all >= total,
                "the device has {all} SMs, partitions take {total}"
            );
        }
        other => panic!("expected PartitionTooLarge, got {other:?}"),
    }
    let text = err.to_string();
    assert!(
        text.contains(&format!("asks for {} SMs", total + 1))
            && text.contains(&format!("can take {total} more SMs")),
        "{text}"
    );

    // The second partition finds what the first left.
    let err = ctx.partition(&[Sms(granularity), Sms(total)]).unwrap_err();
    assert!(
        matches!(err, Error::PartitionTooLarge { index: 1, available, .. } if available == total - granularity),
        "{err:?}"
    );
    // The refusals gave everything back: partitions take all they can again.
    let again = ctx
        .partition(&[Sms(total)])
        .expect("every SM is free again");
    assert_eq!(again.partitions[0].sms(), total);
}

#[test]
fn streams_keep_their_partition_alive_and_launch_kernels_there() {
    let _serial = serial();
    let ctx = support::ctx();
    let (_, granularity) = ctx.partitionable_sms().unwrap();
    let split = ctx.partition(&[Sms(granularity)]).unwrap();
    let high = split.partitions[0].stream(StreamPriority::High).unwrap();
    let low = split.partitions[0].stream(StreamPriority::Low).unwrap();
    let range = ctx.priority_range();
    assert_eq!(high.priority().unwrap(), range.greatest);
    assert_eq!(low.priority().unwrap(), range.least);
    drop(split);
    // The partition lives on in its streams.
    assert_eq!(
        high.partition().expect("made in a partition").sms(),
        granularity
    );
    assert!(Stream::new(&ctx).unwrap().partition().is_none());
    let mut out = DeviceBuffer::<f32>::new_async(&high, 64).unwrap();
    fill(&high, 2.5, &mut out);
    assert_eq!(out.to_vec(&high).unwrap(), vec![2.5; 64]);
    // A buffer moves between the partition's streams (and the device's).
    low.wait_event(&high.record_event().unwrap()).unwrap();
    fill(&low, 4.0, &mut out);
    let plain = Stream::new(&ctx).unwrap();
    plain.wait_event(&low.record_event().unwrap()).unwrap();
    assert_eq!(out.to_vec(&plain).unwrap(), vec![4.0; 64]);
}

#[test]
fn a_raw_priority_outside_the_range_is_refused() {
    let _serial = serial();
    let ctx = support::ctx();
    let split = ctx.partition(&[Sms(1)]).unwrap();
    let range = ctx.priority_range();
    let beyond = range.greatest.min(range.least) - 1;
    let err = split.partitions[0]
        .stream_with_raw_priority(beyond)
        .unwrap_err();
    assert!(
        matches!(err, Error::InvalidPriority { value, .. } if value == beyond),
        "{err:?}"
    );
}

#[test]
fn a_partitions_stream_does_not_wait_for_another_partitions_work() {
    let _serial = serial();
    let ctx = support::ctx();
    if ctx.is_gpu()
        && test_support::skip_under_sanitizer("it serialises kernels, so every partition waits")
    {
        return;
    }
    let split = ctx.partition(&[Sms(1), Sms(1)]).unwrap();
    let busy = split.partitions[0].stream(StreamPriority::Low).unwrap();
    let urgent = split.partitions[1].stream(StreamPriority::High).unwrap();
    let mut out = DeviceBuffer::<f32>::new_async(&urgent, 64).unwrap();
    // Loaded before the gate: a module's unload waits for the whole context,
    // and on a GPU loading the kernel into a partition waits for the device.
    let kernel = fill_kernel(&urgent);
    split.partitions[1].load(&kernel).unwrap();
    // The busy partition holds until the gate opens (or its limit passes).
    let gate = Gate::close_within(&busy, GATE_LIMIT);
    fill_with(&kernel, &urgent, 7.0, &mut out);
    let seen = out.to_vec(&urgent).unwrap();
    // Had the urgent stream waited for the busy one, the gate would have
    // opened itself before the copy came back.
    assert!(
        gate.still_held(),
        "the urgent partition waited for the busy one"
    );
    assert!(!busy.query().unwrap(), "the busy partition is still held");
    assert_eq!(seen, vec![7.0; 64]);
    gate.open();
    busy.synchronize().unwrap();
}

#[test]
fn an_event_orders_one_partitions_stream_after_anothers() {
    let _serial = serial();
    let ctx = support::ctx();
    let split = ctx.partition(&[Sms(1)]).unwrap();
    let first = split.partitions[0].stream(StreamPriority::Normal).unwrap();
    let then = split
        .remainder
        .as_ref()
        .expect("SMs are left")
        .stream(StreamPriority::Normal)
        .unwrap();
    // A buffer for each stream, homed there: only the event orders them
    // (a shared buffer's own tracking would order the second use as well).
    let mut a = DeviceBuffer::<f32>::new_async(&first, 64).unwrap();
    let mut b = DeviceBuffer::<f32>::new_async(&then, 64).unwrap();
    // Loaded before the gate: a module's unload waits for the whole context.
    let kernel = fill_kernel(&first);
    then.synchronize().unwrap();
    // The gate opens itself: nothing here opens it.
    let gate = Gate::close_within(&first, Duration::from_millis(500));
    fill_with(&kernel, &first, 1.0, &mut a);
    then.wait_event(&first.record_event().unwrap()).unwrap();
    fill_with(&kernel, &then, 3.0, &mut b);
    // Returns once `then` is done: if the event orders it, only after
    // `first` passed its gate and its fill; without the event, at once,
    // while `first` is still held.
    then.synchronize().unwrap();
    assert!(
        first.query().unwrap(),
        "the second partition finished while the first was held: the event did not order it"
    );
    drop(gate);
    assert_eq!(b.to_vec(&then).unwrap(), vec![3.0; 64]);
    assert_eq!(a.to_vec(&first).unwrap(), vec![1.0; 64]);
}

#[test]
fn a_kernel_loads_into_its_own_contexts_partitions_only() {
    let _serial = serial();
    let ctx = support::ctx();
    let split = ctx.partition(&[Sms(1)]).unwrap();
    let partition = &split.partitions[0];
    let kernel = fill_kernel(&Stream::new(&ctx).unwrap());
    partition.load(&kernel).unwrap();
    partition.load(&kernel).expect("loading again is a lookup");
    let stream = partition.stream(StreamPriority::High).unwrap();
    let mut out = DeviceBuffer::<f32>::new_async(&stream, 16).unwrap();
    fill_with(&kernel, &stream, 3.0, &mut out);
    assert_eq!(out.to_vec(&stream).unwrap(), vec![3.0; 16]);
    if Context::device_count().unwrap() < 2 {
        eprintln!("skipped the other device: needs two devices");
        return;
    }
    let gpu1 = Context::new(1).unwrap();
    let elsewhere = gpu1.partition(&[Sms(1)]).unwrap();
    match elsewhere.partitions[0].load(&kernel) {
        Err(Error::ContextMismatch {
            expected, found, ..
        }) => assert_eq!((expected, found), (gpu1.id(), ctx.id())),
        other => panic!("expected ContextMismatch, got {other:?}"),
    }
}

#[test]
fn memory_of_another_device_on_a_partitions_stream_is_an_error_naming_both() {
    let _serial = serial();
    if Context::device_count().unwrap() < 2 {
        eprintln!("skipped: needs two devices");
        return;
    }
    let gpu1 = Context::new(1).unwrap();
    let on0 = DeviceBuffer::<f32>::from_slice(&Stream::new(&support::ctx()).unwrap(), &[1.0; 64])
        .unwrap();
    let split = gpu1.partition(&[Sms(1)]).unwrap();
    let stream = split.partitions[0].stream(StreamPriority::Normal).unwrap();
    let mut on1 = DeviceBuffer::<f32>::new_async(&stream, 64).unwrap();
    let err = stream
        .copy_device_to_device_async(&mut on1, &on0)
        .unwrap_err();
    match &err {
        Error::DeviceMismatch {
            stream_device,
            found_device,
            ..
        } => assert_eq!((*stream_device, *found_device), (1, 0)),
        other => panic!("expected DeviceMismatch, got {other:?}"),
    }
    let text = err.to_string();
    assert!(
        text.contains("device 0") && text.contains("device 1"),
        "{text}"
    );
}

#[test]
fn a_driver_without_partitions_is_named_with_the_version_needed() {
    let _serial = serial();
    let err = Error::PartitionsUnsupported {
        driver_version: 12020,
        missing: vec!["cuGreenCtxCreate", "cuGreenCtxStreamCreate"],
    };
    let text = err.to_string();
    assert!(
        text.contains("CUDA 12.4") && text.contains("12020"),
        "{text}"
    );
    assert!(
        text.contains("cuGreenCtxCreate, cuGreenCtxStreamCreate"),
        "{text}"
    );
}

#[test]
fn a_graph_captured_in_a_partition_replays_after_its_handles_are_gone() {
    let _serial = serial();
    let ctx = support::ctx();
    let split = ctx.partition(&[Sms(1)]).unwrap();
    let stream = split.partitions[0].stream(StreamPriority::High).unwrap();
    let fill = fill_kernel(&stream);
    let out = Arc::new(DeviceBuffer::<f32>::new(&ctx, 64).unwrap());
    let mut capture = stream.begin_capture().unwrap();
    let args = [GraphArg::from(64u64), 9.0f32.into(), GraphArg::write(&out)];
    capture
        .launch(&stream, &fill, LaunchConfig::for_num_elems(64), &args)
        .unwrap();
    let exec = capture.end().unwrap().instantiate().unwrap();
    let raw = split.partitions[0].as_raw();
    drop((stream, split));
    // The graph keeps the partition (and on a GPU its copy of the kernel).
    let green = ctx.loaded_driver().green_contexts().unwrap();
    let alive = || {
        let mut resource = cuda_streams_driver::sys::CUdevResource::default();
        let sm = cuda_streams_driver::sys::CUdevResourceType::CU_DEV_RESOURCE_TYPE_SM;
        // SAFETY: writes one resource to a local; the handle is live if the
        // graph keeps it, which is what is asserted (a stale one would be
        // an error on the software driver, which the GPU run never reaches
        // unless this assertion is already failing).
        let code = unsafe { (green.cuGreenCtxGetDevResource)(raw, &mut resource, sm) };
        code == cuda_streams_driver::sys::CUresult::CUDA_SUCCESS
    };
    assert!(alive(), "the graph keeps its partition's green context");
    let other = Stream::new(&ctx).unwrap();
    exec.launch(&other).unwrap();
    assert_eq!(out.to_vec(&other).unwrap(), vec![9.0; 64]);
}
