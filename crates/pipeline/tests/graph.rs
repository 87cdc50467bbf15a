//! The stage manager's step captured as CUDA graphs gives, batch for batch,
//! what the eager pipeline gives; new inputs between steps are picked up.

mod common;

use common::{XorShift, ctx, kernel, reference_compute};
use cuda_streams_pipeline::{AsyncCoordinator, Error, GpuPipelineStage, PipelineStageManager};
use driver::LaunchConfig;

const N: usize = 1_000;

#[test]
fn a_replayed_step_gives_the_eager_pipelines_results_batch_for_batch() {
    let ctx = ctx();
    let compute = kernel(&ctx, &kernels::COMPUTE, "compute");
    let cfg = LaunchConfig::for_num_elems(N as u32);
    let mut pipeline = PipelineStageManager::new(AsyncCoordinator::new(&ctx).unwrap(), N).unwrap();
    let a = pipeline.add_stage(GpuPipelineStage::compute(
        "a",
        compute.clone(),
        cfg,
        2,
        0,
        1,
    ));
    let b = pipeline.add_stage(GpuPipelineStage::compute("b", compute, cfg, 3, 1, 2));
    pipeline.set_inputs(vec![0]);
    pipeline.set_order(vec![a, b]).unwrap();
    let mut rng = XorShift::new(33);
    let first = rng.f32s(N);
    pipeline.fill_input(0, &first).unwrap();

    let mut graph = pipeline.capture_graph().unwrap();
    assert_eq!(graph.node_count(), 4, "upload, two stages, download");
    assert!(
        matches!(graph.output(2), Err(Error::InvalidConfig(_))),
        "nothing replayed yet"
    );
    let expect = |x: &[f32]| reference_compute(3, &reference_compute(2, x));
    // The captured inputs, then a new batch per step through input_mut.
    for _ in 0..3 {
        graph.execute_iteration().unwrap();
    }
    assert_eq!(graph.output(2).unwrap(), &expect(&first)[..]);
    for step in 0..7 {
        let batch = rng.f32s(N);
        graph.input_mut(0).unwrap().copy_from_slice(&batch);
        let slot = graph.execute_iteration().unwrap();
        assert_eq!(slot, (3 + step) % 3);
        assert_eq!(graph.output(2).unwrap(), &expect(&batch)[..], "step {step}");
    }
    assert_eq!(graph.steps(), 10);
    let err = graph.fill_input(5, &first).unwrap_err();
    assert!(
        err.to_string().contains("buffer 5 is not a pipeline input"),
        "{err}"
    );

    // The eager pipeline over the captured inputs agrees, and still works.
    for _ in 0..3 {
        pipeline.execute_iteration().unwrap();
    }
    pipeline.drain().unwrap();
    assert_eq!(pipeline.output(2).unwrap(), &expect(&first)[..]);
}
