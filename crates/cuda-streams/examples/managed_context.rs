//! The managed context in both modes: synchronous (one stream, each step
//! returns its result) and asynchronous (stream pool and triple buffer,
//! results two steps behind). Both must produce the same results.
//!
//! The context runs your step kernel over your element type; here the step
//! is the seed's shape, a configuration in and telemetry out, with
//! `kernels::COMPUTE`'s `compute` as the kernel. `StepConfig` and
//! `Telemetry` are this example's types, not the library's.
//!
//! `cargo run -p cuda-streams --example managed_context`

use cuda_streams::kernels;
use cuda_streams::prelude::*;
use std::sync::Arc;

/// What one step uploads (the seed's `RuntimeConfig`).
#[derive(Clone)]
struct StepConfig {
    input: Vec<f32>,
}

/// What one step sends back.
#[derive(Debug, PartialEq)]
struct Telemetry {
    step: u64,
    output: Vec<f32>,
}

impl From<StepResult<f32>> for Telemetry {
    fn from(result: StepResult<f32>) -> Self {
        Telemetry {
            step: result.step,
            output: result.output,
        }
    }
}

const ITERATIONS: u32 = 3;
const ELEMENTS: usize = 4096;

/// `compute(n, iterations, x, y)`: `ITERATIONS` steps of `v = v / 2 + x`
/// on the step's input, written to its output.
fn compute_step(device: &Arc<Context>) -> Result<GpuPipelineStage, cuda_streams::Error> {
    let compute = Module::load(device, &kernels::COMPUTE)?.function("compute")?;
    let cfg = LaunchConfig::for_num_elems(ELEMENTS as u32);
    Ok(GpuPipelineStage::builder("compute", compute, cfg)
        .len()
        .u32(ITERATIONS)
        .reads(ManagedGpuContext::INPUT)
        .writes(ManagedGpuContext::OUTPUT)
        .build())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let device = Context::new(0)?;
    // The seed's constructor, then the step kernel...
    let mut sync = ManagedGpuContext::new(&device, false)?;
    sync.set_step(compute_step(&device)?)?;
    // ...or the builder, naming the mode.
    let mut pipelined = ManagedGpuContext::builder(&device)
        .asynchronous()
        .step(compute_step(&device)?)
        .build()?;
    println!(
        "sync mode: stream management {}; async mode: stream management {}, kernel stream {:?}",
        sync.has_stream_management(),
        pipelined.has_stream_management(),
        pipelined
            .get_stream(StreamPurpose::KernelExecution)
            .map(|s| s.id())
    );

    let (mut from_sync, mut from_async) = (Vec::<Telemetry>::new(), Vec::<Telemetry>::new());
    for step in 0..10u32 {
        let input: Vec<f32> = (0..ELEMENTS)
            .map(|i| (i % 17) as f32 + step as f32)
            .collect();
        let config = StepConfig { input };
        from_sync.extend(
            sync.triple_buffered_step(&config.input)?
                .map(Telemetry::from),
        );
        let result = pipelined.triple_buffered_step(&config.input)?;
        println!(
            "step {step}: async returned {}",
            match &result {
                Some(t) => format!("the result of step {}", t.step),
                None => "nothing yet (pipeline filling)".to_string(),
            }
        );
        from_async.extend(result.map(Telemetry::from));
    }
    from_async.extend(pipelined.finish_steps()?.into_iter().map(Telemetry::from));
    assert_eq!(from_sync.len(), 10);
    assert_eq!(
        from_sync, from_async,
        "both modes compute the same telemetry"
    );
    let expected = kernels::reference::compute_element(ITERATIONS, 5.0);
    assert_eq!(from_sync[0].output[5], expected);
    println!("10 steps in each mode, identical results");
    Ok(())
}
