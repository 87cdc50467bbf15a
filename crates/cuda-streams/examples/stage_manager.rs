//! The pipeline stage manager: two kernels per batch in a validated order,
//! a new input every step, three batches in flight, every output checked,
//! statistics from timing events.
//!
//! `cargo run -p cuda-streams --example stage_manager`

use cuda_streams::kernels::{self, reference};
use cuda_streams::prelude::*;

const N: usize = 1 << 15;
const BATCHES: u64 = 24;

fn input(batch: u64) -> Vec<f32> {
    (0..N)
        .map(|i| ((batch as usize * 7 + i) % 64) as f32 * 0.5)
        .collect()
}

fn expected(batch: u64) -> Vec<f32> {
    let mut first = vec![0.0; N];
    reference::compute(2, &input(batch), &mut first);
    let mut second = vec![0.0; N];
    reference::compute(1, &first, &mut second);
    second
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let ctx = Context::new(0)?;
    let compute = Module::load(&ctx, &kernels::COMPUTE)?.function("compute")?;
    let cfg = LaunchConfig::for_num_elems(N as u32);
    let mut pipeline = PipelineStageManager::new(AsyncCoordinator::new(&ctx)?, N)?;

    // Buffer 0 is uploaded, stage "first" writes 1, stage "second" writes 2,
    // which is downloaded (the last stage's outputs).
    let first = pipeline.add_stage(GpuPipelineStage::compute(
        "first",
        compute.clone(),
        cfg,
        2,
        0,
        1,
    ));
    let second = pipeline.add_stage(GpuPipelineStage::compute("second", compute, cfg, 1, 1, 2));
    pipeline.set_inputs(vec![0]);
    let wrong = pipeline.set_order(vec![second, first]).unwrap_err();
    println!("order [second, first] rejected: {wrong}");
    pipeline.set_order(vec![first, second])?;

    // Every batch's output is read while its slot still holds it: as each
    // step reports it downloaded, and the last ones after the drain.
    let mut checked = Vec::new();
    let mut reports = Vec::new();
    for batch in 0..BATCHES {
        pipeline.input_mut(0)?.copy_from_slice(&input(batch));
        reports.push(pipeline.execute_iteration()?);
        reports.extend(if batch + 1 == BATCHES {
            pipeline.drain()?
        } else {
            Vec::new()
        });
        for report in reports.drain(..) {
            if let Some(done) = report.downloaded {
                let output = pipeline.output_of(done, 2)?;
                assert_eq!(output, &expected(done)[..], "batch {done}");
                checked.push(done);
            }
        }
    }
    assert_eq!(
        checked,
        (0..BATCHES).collect::<Vec<_>>(),
        "every batch checked once"
    );
    let checked = checked.len();

    let stats = pipeline.get_stats()?;
    println!(
        "{} batches ({checked} outputs checked): {:.3} ms per iteration, {:.0} iterations/s, compute stream busy {:.0}% of the GPU wall time",
        stats.iterations,
        stats.avg_iteration_ms,
        stats.throughput,
        stats.gpu_utilization * 100.0
    );
    assert_eq!(stats.iterations, BATCHES as usize);
    Ok(())
}
