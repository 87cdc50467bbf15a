//! Profile spin and fill kernels on three streams, print the report, and write
//! a Chrome trace (`profiler_demo.json`, or the path given) for Perfetto.

use cuda_streams_profiler::StreamProfiler;
use driver::{Context, DeviceBuffer, KernelArg, LaunchConfig, Module, Stream};
use std::time::Duration;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "profiler_demo.json".into());
    let ctx = Context::new(0)?;
    let spin = Module::load(&ctx, kernels::TIMING.fatbin())?.function("spin")?;
    let fill = Module::load(&ctx, kernels::ELEMENTWISE.fatbin())?.function("fill_f32")?;
    let one = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (1, 1, 1),
        shared_mem_bytes: 0,
    };
    let streams: Vec<_> = (0..3)
        .map(|_| Stream::new(&ctx))
        .collect::<Result<_, _>>()?;

    let profiler = StreamProfiler::new(&ctx)?;
    profiler.enable();
    for (i, stream) in streams.iter().enumerate() {
        let mut buf = DeviceBuffer::<f32>::new_async(stream, 1 << 20)?;
        for step in 0..3 {
            let _step = profiler.scope(stream, format!("step {step}"))?;
            profiler.time(stream, "fill", |s| {
                let args = [
                    KernelArg::from(1u64 << 20),
                    (i as f32).into(),
                    (&mut buf).into(),
                ];
                s.launch(&fill, LaunchConfig::for_num_elems(1 << 20), &args)
            })??;
            let ns = Duration::from_millis(2 + i as u64).as_nanos() as u64;
            profiler.time(stream, "spin", |s| s.launch(&spin, one, &[ns.into()]))??;
        }
    }
    println!("{}", profiler.get_comprehensive_report());
    std::fs::write(&path, profiler.to_chrome_trace()?)?;
    println!("trace written to {path}: open it in https://ui.perfetto.dev");
    Ok(())
}
