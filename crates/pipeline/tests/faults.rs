//! Work that fails on the GPU is never handed out as a result: a launch
//! failure is sticky for the whole context (as on a GPU; the software driver
//! models it), so every result that depends on it, and every later one, is an
//! error. The fault is injected behind a busy stream, so the failing work is
//! still queued when the work that depends on it is enqueued.
//!
//! Every test takes `serial()`: an injected fault fails the whole context,
//! and so every other test of this binary that ran meanwhile.

mod common;

use common::{compute_step, ctx, kernel, reference_compute};
use cuda_streams_pipeline::AsyncCoordinator;
use cuda_streams_pipeline::ManagedGpuContext;
use driver::{DeviceBuffer, LaunchConfig, PinnedBuffer};
use test_support::{FaultReset, Gate, fail_next_launch, serial};

#[test]
fn a_download_after_a_failed_compute_is_an_error_not_stale_data() {
    let _serial = serial();
    let _reset = FaultReset;
    let ctx = ctx();
    let mut coordinator = AsyncCoordinator::new(&ctx).unwrap();
    let compute = kernel(&ctx, &kernels::COMPUTE, "compute");
    let n = 1024;
    let (mut x, mut y) = (
        DeviceBuffer::<f32>::new(&ctx, n).unwrap(),
        DeviceBuffer::<f32>::new(&ctx, n).unwrap(),
    );
    let mut out = PinnedBuffer::<f32>::new(&ctx, n).unwrap();
    // A first round that works: `out` then holds its result.
    let cfg = LaunchConfig::for_num_elems(n as u32);
    let first = coordinator.queue_upload(&[1.0; 1024], &mut x).unwrap();
    let args = [(n as u64).into(), 1u32.into(), (&x).into(), (&mut y).into()];
    coordinator
        .queue_compute(&compute, cfg, &args, &[first])
        .unwrap();
    let download = coordinator.queue_download(&y, &mut out).unwrap();
    coordinator.wait(download).unwrap();
    assert_eq!(
        out.as_slice().unwrap(),
        &reference_compute(1, &[1.0; 1024])[..]
    );
    coordinator.poll().unwrap();

    // The second round's compute fails while the download waiting on it is
    // already queued.
    let gate = Gate::close(coordinator.compute_stream());
    if !fail_next_launch(coordinator.compute_stream()) {
        return;
    }
    let upload = coordinator.queue_upload(&[2.0; 1024], &mut x).unwrap();
    let args = [(n as u64).into(), 1u32.into(), (&x).into(), (&mut y).into()];
    let failed = coordinator
        .queue_compute(&compute, cfg, &args, &[upload])
        .unwrap();
    let download = coordinator.queue_download(&y, &mut out).unwrap();
    gate.open();

    let err = coordinator.wait(download).unwrap_err();
    assert!(
        err.to_string().contains("CUDA_ERROR_LAUNCH_FAILED"),
        "the download reports the launch failure, got {err}"
    );
    assert!(coordinator.wait(failed).is_err());
    assert!(coordinator.is_complete(download).is_err());
    assert!(
        coordinator.poll().is_err(),
        "poll reports no failed work as completed"
    );
    assert!(
        out.as_slice().is_err(),
        "the first round's result is not handed out as the second's"
    );
    assert!(coordinator.synchronize_all().is_err());
    // The coordinator refuses new work on the failed context, as a GPU does.
    assert!(coordinator.queue_upload(&[3.0; 1024], &mut x).is_err());
}

#[test]
fn no_step_result_after_a_failed_compute_is_ok() {
    let _serial = serial();
    let _reset = FaultReset;
    let device = ctx();
    let mut managed = ManagedGpuContext::builder(&device)
        .asynchronous()
        .step(compute_step(&device, 1))
        .build()
        .unwrap();
    let fill = |step: u32| move |input: &mut [f32]| input.fill(step as f32 + 1.0);
    let expected = |step: u32| reference_compute(1, &[step as f32 + 1.0; 256]);
    // Steps 0 and 1 fill the pipeline; step k returns step k - 2's result.
    assert!(managed.step_in_place(256, fill(0)).unwrap().is_none());
    assert!(managed.step_in_place(256, fill(1)).unwrap().is_none());
    let compute = std::sync::Arc::clone(
        managed
            .async_coordinator()
            .expect("asynchronous mode")
            .compute_stream(),
    );
    // Step 2 queues the compute of step 1's input behind the gate, and it
    // will fail; step 0's result does not depend on it.
    let gate = Gate::close(&compute);
    if !fail_next_launch(&compute) {
        return;
    }
    {
        let step0 = managed.step_in_place(256, fill(2)).unwrap().unwrap();
        assert_eq!(
            (step0.step(), step0.output().unwrap()),
            (0, &expected(0)[..])
        );
    }
    // Step 3 queues the download of step 1's result (and step 2's compute)
    // while the failing compute is still held: every call succeeds, as on a
    // GPU, and the failure shows when the result is read.
    let step1 = managed.step_in_place(256, fill(3)).unwrap().unwrap();
    assert_eq!(step1.step(), 1);
    gate.open();
    let err = step1.output().unwrap_err();
    assert!(
        err.to_string().contains("CUDA_ERROR_LAUNCH_FAILED"),
        "step 1's result reports the launch failure, got {err}"
    );
    // Every later step, and the finish, report an error instead of a result:
    // the context failed. A caller that goes on after an error never gets an
    // older step's output.
    for step in 4..8 {
        match managed.step_in_place(256, fill(step)) {
            Err(_) => {}
            Ok(None) => panic!("step {step} returned no result"),
            Ok(Some(out)) => {
                let read = out.output();
                assert!(read.is_err(), "step {step} handed out {read:?}");
            }
        }
    }
    assert!(managed.finish_steps().is_err());
}
