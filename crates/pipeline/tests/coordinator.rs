//! The async coordinator: real dependencies through events, poll() that only
//! reports finished work, staged host memory, and its errors.

mod common;

use common::{ONE_THREAD, XorShift, ctx, kernel, reference_compute, spin_kernel};
use cuda_streams_pipeline::{AsyncCoordinator, Error, OperationId, StreamPurpose};
use driver::{DeviceBuffer, LaunchConfig, PinnedBuffer};

const SPIN_NS: u64 = 300_000_000;

#[test]
fn poll_does_not_report_work_the_gpu_has_not_finished() {
    let ctx = ctx();
    let mut coordinator = AsyncCoordinator::new(&ctx).unwrap();
    let spin = spin_kernel(&ctx);
    let mut buffer = DeviceBuffer::<f32>::new(&ctx, 256).unwrap();
    let mut host = PinnedBuffer::<f32>::new(&ctx, 256).unwrap();
    let upload = coordinator.queue_upload(&[1.5; 256], &mut buffer).unwrap();
    let held = coordinator
        .queue_compute(&spin, ONE_THREAD, &[SPIN_NS.into()], &[upload])
        .unwrap();
    let download = coordinator.queue_download(&buffer, &mut host).unwrap();
    // The spin holds the compute stream for 300 ms and the download waits
    // for it: neither may be reported yet.
    let early = coordinator.poll().unwrap();
    assert!(
        early
            .iter()
            .all(|op| op.op_id != held && op.op_id != download),
        "reported unfinished work: {early:?}"
    );
    assert!(!coordinator.is_complete(download).unwrap());
    coordinator.wait(download).unwrap();
    assert!(coordinator.is_complete(held).unwrap());
    let late: Vec<_> = coordinator
        .poll()
        .unwrap()
        .into_iter()
        .chain(early)
        .map(|op| (op.op_id, op.op_type))
        .collect();
    for expected in [
        (upload, StreamPurpose::ConfigUpload),
        (held, StreamPurpose::KernelExecution),
        (download, StreamPurpose::TelemetryDownload),
    ] {
        assert!(
            late.contains(&expected),
            "{expected:?} missing from {late:?}"
        );
    }
    // Reported once only.
    assert!(coordinator.poll().unwrap().is_empty());
    assert_eq!(host.as_slice().unwrap(), &[1.5; 256]);
}

#[test]
fn upload_compute_download_are_ordered_by_events() {
    let ctx = ctx();
    let mut coordinator = AsyncCoordinator::new(&ctx).unwrap();
    let compute = kernel(&ctx, &kernels::COMPUTE, "compute");
    let spin = spin_kernel(&ctx);
    let n = 50_000;
    let mut rng = XorShift::new(42);
    let one = LaunchConfig::for_num_elems(1);
    let cfg = LaunchConfig::for_num_elems(n as u32);
    let mut x = DeviceBuffer::<f32>::new(&ctx, n).unwrap();
    let mut y = DeviceBuffer::<f32>::new(&ctx, n).unwrap();
    let mut out = PinnedBuffer::<f32>::new(&ctx, n).unwrap();
    for round in 0..3u32 {
        let mut data = rng.f32s(n);
        let expected = reference_compute(5 + round, &data);
        let up = coordinator.queue_upload(&data, &mut x).unwrap();
        // The caller's memory is free at once: the upload reads staging.
        data.iter_mut().for_each(|v| *v = f32::NAN);
        drop(data);
        // A slow start on the compute stream: a download that did not wait
        // for the compute would read the previous round's values.
        let args = [
            (n as u64).into(),
            (5 + round).into(),
            (&x).into(),
            (&mut y).into(),
        ];
        let c = coordinator
            .queue_compute_with(&[up], |s| {
                s.launch(&spin, one, &[30_000_000u64.into()])?;
                s.launch(&compute, cfg, &args)
            })
            .unwrap();
        let down = coordinator.queue_download(&y, &mut out).unwrap();
        assert!(c < down && up < c);
        assert_eq!(out.as_slice().unwrap(), &expected[..], "round {round}");
        coordinator.poll().unwrap();
    }
    // H2D went on the upload stream and D2H on the download stream.
    assert_eq!(coordinator.upload_stream().metrics().memory_transfers, 3);
    assert_eq!(coordinator.download_stream().metrics().memory_transfers, 3);
    assert_eq!(coordinator.compute_stream().metrics().memory_transfers, 0);
    let ids = [
        coordinator.upload_stream().id(),
        coordinator.compute_stream().id(),
        coordinator.download_stream().id(),
    ];
    assert!(ids[0] != ids[1] && ids[1] != ids[2] && ids[0] != ids[2]);
}

#[test]
fn an_upload_waits_for_the_kernel_still_reading_its_buffer() {
    let ctx = ctx();
    let mut coordinator = AsyncCoordinator::new(&ctx).unwrap();
    let spin = spin_kernel(&ctx);
    let compute = kernel(&ctx, &kernels::COMPUTE, "compute");
    let n = 4096;
    let mut x = DeviceBuffer::<f32>::new(&ctx, n).unwrap();
    let mut y = DeviceBuffer::<f32>::new(&ctx, n).unwrap();
    let mut out = PinnedBuffer::<f32>::new(&ctx, n).unwrap();
    let up = coordinator.queue_upload(&vec![1.0; n], &mut x).unwrap();
    let args = [(n as u64).into(), 1u32.into(), (&x).into(), (&mut y).into()];
    coordinator
        .queue_compute_with(&[up], |s| {
            s.launch(
                &spin,
                LaunchConfig::for_num_elems(1),
                &[50_000_000u64.into()],
            )?;
            s.launch(&compute, LaunchConfig::for_num_elems(n as u32), &args)
        })
        .unwrap();
    // Overwriting x must wait for the kernel above, or it would read 9.0s.
    coordinator.queue_upload(&vec![9.0; n], &mut x).unwrap();
    coordinator.queue_download(&y, &mut out).unwrap();
    assert_eq!(out.as_slice().unwrap(), &vec![1.5; n][..]);
}

#[test]
fn errors_name_the_operation() {
    let ctx = ctx();
    let mut coordinator = AsyncCoordinator::new(&ctx).unwrap();
    let compute = kernel(&ctx, &kernels::COMPUTE, "compute");
    let mut x = DeviceBuffer::<f32>::new(&ctx, 8).unwrap();
    let mut y = DeviceBuffer::<f32>::new(&ctx, 8).unwrap();
    let args = [8u64.into(), 1u32.into(), (&x).into(), (&mut y).into()];
    let err = coordinator
        .queue_compute(
            &compute,
            LaunchConfig::for_num_elems(8),
            &args,
            &[OperationId(42)],
        )
        .unwrap_err();
    // The graph's one check of dependencies names the unknown one.
    assert!(
        matches!(
            err,
            Error::Graph(engine::Error::UnknownDependency {
                dependency: OperationId(42),
                ..
            })
        ),
        "{err}"
    );
    assert!(err.to_string().contains("operation 42"), "{err}");
    assert!(matches!(
        coordinator.wait(OperationId(7)),
        Err(Error::UnknownOperation {
            id: OperationId(7),
            ..
        })
    ));
    let err = coordinator.queue_upload(&[1.0; 3], &mut x).unwrap_err();
    // The driver's one length check, naming both lengths.
    assert!(
        matches!(
            err,
            Error::Driver(driver::Error::SizeMismatch {
                expected: 8,
                actual: 3,
                ..
            })
        ),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("the destination holds 8 element(s) but the source holds 3"),
        "{err}"
    );
    // Nothing was queued by the failures.
    assert_eq!(coordinator.pending_count(), 0);
    coordinator.synchronize_all().unwrap();
}

#[test]
fn work_after_reported_operations_waits_for_nothing() {
    let ctx = ctx();
    let mut coordinator = AsyncCoordinator::new(&ctx).unwrap();
    let mut buffer = DeviceBuffer::<f32>::new(&ctx, 64).unwrap();
    let mut host = PinnedBuffer::<f32>::new(&ctx, 64).unwrap();
    let upload = coordinator.queue_upload(&[2.0; 64], &mut buffer).unwrap();
    coordinator.synchronize_all().unwrap();
    let reported: Vec<OperationId> = coordinator
        .poll()
        .unwrap()
        .iter()
        .map(|op| op.op_id)
        .collect();
    assert_eq!(reported, [upload]);
    // A download after the reported upload (explicitly and implicitly): the
    // GPU passed it, so the download stream gets the copy and no wait.
    let download_stream = coordinator.download_stream().clone();
    let before = download_stream.operation_count();
    coordinator
        .queue_download_after(&buffer, &mut host, &[upload])
        .unwrap();
    assert_eq!(
        download_stream.operation_count() - before,
        1,
        "a wait was enqueued"
    );
    assert_eq!(host.as_slice().unwrap(), &[2.0; 64]);
}
