//! The managed context in both modes: synchronous (one stream, each step
//! returns its result) and asynchronous (stream pool and triple buffer,
//! results two steps behind). Both must produce the same telemetry.
//!
//! `cargo run -p cuda-streams --example managed_context`

use cuda_streams::prelude::*;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let device = Context::new(0)?;
    let mut sync = ManagedGpuContext::new(&device, false)?;
    let mut pipelined = ManagedGpuContext::new(&device, true)?;
    println!(
        "sync mode: stream management {}; async mode: stream management {}, kernel stream {:?}",
        sync.has_stream_management(),
        pipelined.has_stream_management(),
        pipelined
            .get_stream(StreamPurpose::KernelExecution)
            .map(|s| s.id())
    );

    let (mut from_sync, mut from_async) = (Vec::new(), Vec::new());
    for step in 0..10u32 {
        let input: Vec<f32> = (0..4096).map(|i| (i % 17) as f32 + step as f32).collect();
        let config = StepConfig {
            input,
            iterations: 3,
        };
        from_sync.extend(sync.triple_buffered_step(config.clone())?);
        let result = pipelined.triple_buffered_step(config)?;
        println!(
            "step {step}: async returned {}",
            match &result {
                Some(t) => format!("the result of step {}", t.step),
                None => "nothing yet (pipeline filling)".to_string(),
            }
        );
        from_async.extend(result);
    }
    from_async.extend(pipelined.finish_steps()?);
    assert_eq!(from_sync.len(), 10);
    assert_eq!(
        from_sync, from_async,
        "both modes compute the same telemetry"
    );
    let expected = cuda_streams::kernels::reference::compute_element(3, 5.0);
    assert_eq!(from_sync[0].output[5], expected);
    println!("10 steps in each mode, identical results");
    Ok(())
}
