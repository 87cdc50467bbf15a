//! The pipeline's rotation (three batches in flight): a slot's next compute
//! waits for the download still reading that slot's outputs, however far
//! the download stream lags.

mod common;

use common::{ctx, kernel};
use cuda_streams_pipeline::driver::LaunchConfig;
use cuda_streams_pipeline::{AsyncCoordinator, GpuPipelineStage, PipelineStageManager};
use test_support::Gate;

const ELEMENTS: usize = 1 << 12;

#[test]
fn a_held_download_keeps_its_slot_from_the_next_compute() {
    let ctx = ctx();
    let compute = kernel(&ctx, &kernels::COMPUTE, "compute");
    let cfg = LaunchConfig::for_num_elems(ELEMENTS as u32);
    let mut pipeline =
        PipelineStageManager::new(AsyncCoordinator::new(&ctx).unwrap(), ELEMENTS).unwrap();
    // compute(x, 1 step) = 1.5 x.
    let stage = pipeline.add_stage(GpuPipelineStage::compute("c", compute, cfg, 1, 0, 1));
    pipeline.set_inputs(vec![0]);
    pipeline.set_order(vec![stage]).unwrap();
    // Hold every download while batches 0 to 4 go in: batch 3's compute
    // writes the slot whose outputs batch 0's download (held) must read.
    let gate = Gate::close(pipeline.coordinator().download_stream());
    for batch in 0..5 {
        pipeline.input_mut(0).unwrap().fill(batch as f32 + 1.0);
        pipeline.execute_iteration().unwrap();
    }
    gate.open();
    for batch in 0..3 {
        let expected = 1.5 * (batch as f32 + 1.0);
        let output = pipeline.output_of(batch, 1).unwrap();
        assert!(
            output.iter().all(|&v| v == expected),
            "batch {batch}: expected {expected}, found {} (a later batch's result)",
            output[0]
        );
    }
    pipeline.drain().unwrap();
}
