//! The managed context: synchronous and asynchronous modes agree, streams by purpose.

mod common;

use common::{XorShift, compute_step, ctx, reference_compute};
use cuda_streams_pipeline::{Error, ManagedGpuContext, StreamPurpose};

/// The step kernel's iteration count in these tests.
const ITERATIONS: u32 = 3;

/// A managed context in the seed's form, given the compute step.
fn managed(enable_async: bool) -> ManagedGpuContext {
    let device = ctx();
    let mut managed = ManagedGpuContext::new(&device, enable_async).unwrap();
    managed.set_step(compute_step(&device, ITERATIONS)).unwrap();
    managed
}

fn run(enable_async: bool, configs: &[Vec<f32>]) -> Vec<(u64, Vec<f32>)> {
    let mut managed = managed(enable_async);
    let mut out = Vec::new();
    for (k, config) in configs.iter().enumerate() {
        let telemetry = managed.triple_buffered_step(config).unwrap();
        if enable_async {
            // Results lag by two steps (pipeline depth 3).
            assert_eq!(
                telemetry.as_ref().map(|t| t.step),
                k.checked_sub(2).map(|s| s as u64)
            );
        } else {
            assert_eq!(telemetry.as_ref().map(|t| t.step), Some(k as u64));
        }
        out.extend(telemetry.map(|t| (t.step, t.output)));
    }
    out.extend(
        managed
            .finish_steps()
            .unwrap()
            .into_iter()
            .map(|t| (t.step, t.output)),
    );
    out
}

#[test]
fn sync_and_async_modes_give_identical_results() {
    let mut rng = XorShift::new(2024);
    let configs: Vec<Vec<f32>> = (0..9).map(|_| rng.f32s(20_000)).collect();
    let sync = run(false, &configs);
    let asynchronous = run(true, &configs);
    assert_eq!(sync.len(), configs.len());
    assert!(sync == asynchronous, "the two modes disagree");
    for (step, output) in &sync {
        let input = &configs[*step as usize];
        assert!(
            *output == reference_compute(ITERATIONS, input),
            "step {step} differs from the CPU reference"
        );
    }
}

/// The in-place form: the same steps, filled into the pinned upload slots
/// and read from the pinned download slots, in both modes.
fn run_in_place(enable_async: bool, configs: &[Vec<f32>]) -> Vec<(u64, Vec<f32>)> {
    let mut managed = managed(enable_async);
    let mut out = Vec::new();
    for (k, config) in configs.iter().enumerate() {
        let done = managed
            .step_in_place(config.len(), |slot| slot.copy_from_slice(config))
            .unwrap();
        let expected_step = if enable_async {
            k.checked_sub(2)
        } else {
            Some(k)
        };
        assert_eq!(
            done.as_ref().map(|d| d.step()),
            expected_step.map(|s| s as u64)
        );
        if let Some(done) = done {
            out.push((done.step(), done.output().unwrap().to_vec()));
        }
    }
    managed
        .finish_steps_in_place(|done| {
            out.push((done.step(), done.output()?.to_vec()));
            Ok(())
        })
        .unwrap();
    out
}

#[test]
fn in_place_steps_match_the_copying_steps() {
    let mut rng = XorShift::new(77);
    let configs: Vec<Vec<f32>> = (0..8).map(|_| rng.f32s(10_000)).collect();
    let copied = run(true, &configs);
    for enable_async in [false, true] {
        let in_place = run_in_place(enable_async, &configs);
        assert_eq!(in_place.len(), configs.len());
        assert!(
            in_place == copied,
            "in-place (async: {enable_async}) differs"
        );
    }
    // A step of another length is refused, naming both lengths.
    let mut managed = managed(true);
    let _ = managed.step_in_place(16, |s| s.fill(1.0)).unwrap();
    let err = managed.step_in_place(8, |s| s.fill(1.0)).unwrap_err();
    assert!(
        err.to_string().contains("16") && err.to_string().contains("8"),
        "{err}"
    );
}

#[test]
fn streams_by_purpose_only_with_stream_management() {
    let device = ctx();
    let managed = ManagedGpuContext::new(&device, true).unwrap();
    assert!(managed.has_stream_management());
    let coordinator = managed.async_coordinator().unwrap();
    let upload = managed.get_stream(StreamPurpose::ConfigUpload).unwrap();
    let kernels = managed.get_stream(StreamPurpose::KernelExecution).unwrap();
    let download = managed
        .get_stream(StreamPurpose::TelemetryDownload)
        .unwrap();
    assert_eq!(upload.id(), coordinator.upload_stream().id());
    assert_eq!(kernels.id(), coordinator.compute_stream().id());
    assert_eq!(download.id(), coordinator.download_stream().id());
    assert!(managed.get_stream(StreamPurpose::AuxCompute).is_some());
    let buffer = managed.create_triple_buffer::<u32>(128).unwrap();
    assert_eq!(buffer.size(), 128);
    assert!(managed.create_pipeline_manager(128).is_ok());

    let mut sync = ManagedGpuContext::new(&device, false).unwrap();
    sync.set_step(compute_step(&device, 1)).unwrap();
    assert!(!sync.has_stream_management());
    assert!(sync.get_stream(StreamPurpose::KernelExecution).is_none());
    assert!(sync.async_coordinator_mut().is_none());
    assert!(matches!(
        sync.create_pipeline_manager(128),
        Err(Error::Mode(_))
    ));
    // A step of a different length than the first is refused.
    assert!(sync.triple_buffered_step(&[1.0; 8]).unwrap().is_some());
    let err = sync.triple_buffered_step(&[1.0; 9]).unwrap_err();
    assert!(
        err.to_string()
            .contains("holds 8 element(s) but the host side holds 9"),
        "{err}"
    );
}

#[test]
fn the_element_type_and_kernel_are_the_callers() {
    // fill_u32(n, value, out) over u32 buffers: step k's output is all 7s
    // whatever its input, two steps late in asynchronous mode.
    let device = ctx();
    let fill = common::kernel(&device, &kernels::ELEMENTWISE, "fill_u32");
    let step = cuda_streams_pipeline::GpuPipelineStage::builder(
        "fill",
        fill,
        driver::LaunchConfig::for_num_elems(64),
    )
    .len()
    .u32(7)
    .writes(ManagedGpuContext::OUTPUT)
    .build();
    let mut managed = ManagedGpuContext::builder(&device)
        .asynchronous()
        .element::<u32>()
        .step(step)
        .build()
        .unwrap();
    let mut steps = Vec::new();
    for k in 0..5u32 {
        if let Some(done) = managed.triple_buffered_step(&[k; 64]).unwrap() {
            assert_eq!(done.output, [7; 64], "step {}", done.step);
            steps.push(done.step);
        }
    }
    for done in managed.finish_steps().unwrap() {
        assert_eq!(done.output, [7; 64], "step {}", done.step);
        steps.push(done.step);
    }
    assert_eq!(steps, [0, 1, 2, 3, 4]);

    // A kernel whose buffer parameters are another type is refused at the
    // first step, naming the step kernel, before anything is queued.
    let compute = compute_step(&device, 1);
    let mut wrong = ManagedGpuContext::builder(&device)
        .element::<u32>()
        .step(compute)
        .build()
        .unwrap();
    let err = wrong.triple_buffered_step(&[1; 8]).unwrap_err();
    assert!(err.to_string().contains("step kernel \"compute\""), "{err}");
}
