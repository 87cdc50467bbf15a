//! The profiler: GPU-timed nested scopes around fills and spin kernels on
//! three streams, the report table, and a Chrome trace for Perfetto
//! (written to the path given, or to the system's temporary directory).
//!
//! `cargo run -p cuda-streams --example profiler -- trace.json`

use cuda_streams::kernels;
use cuda_streams::prelude::*;
use std::time::Duration;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .map(Into::into)
        .unwrap_or_else(|| std::env::temp_dir().join("cuda-streams-profiler-example.json"));
    let ctx = Context::new(0)?;
    let spin = Module::load(&ctx, &kernels::TIMING)?.function("spin")?;
    let fill = Module::load(&ctx, &kernels::ELEMENTWISE)?.function("fill_f32")?;
    let one = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (1, 1, 1),
        shared_mem_bytes: 0,
    };
    let streams = (0..3)
        .map(|_| Stream::new(&ctx))
        .collect::<Result<Vec<_>, _>>()?;

    let profiler = StreamProfiler::new(&ctx)?;
    profiler.enable();
    for (i, stream) in streams.iter().enumerate() {
        let mut buf = DeviceBuffer::<f32>::new_async(stream, 1 << 20)?;
        for step in 0..3 {
            let _step = profiler.scope(stream, format!("step {step}"))?;
            let args = [(1u64 << 20).into(), (i as f32).into(), (&mut buf).into()];
            profiler.time(stream, "fill", |s| {
                s.launch(&fill, LaunchConfig::for_num_elems(1 << 20), &args)
            })??;
            let ns = Duration::from_millis(2 + i as u64).as_nanos() as u64;
            profiler.time(stream, "spin", |s| s.launch(&spin, one, &[ns.into()]))??;
        }
    }

    let report = profiler.get_comprehensive_report();
    println!("{report}");
    assert_eq!(report.total_streams, 3);
    let spin_time = report.stream(streams[2].id()).expect("profiled").operations["spin"].total;
    assert!(
        spin_time >= Duration::from_millis(8),
        "three 4 ms spins, GPU-timed: {spin_time:?}"
    );
    std::fs::write(&path, profiler.to_chrome_trace()?)?;
    println!(
        "trace written to {}: open it in https://ui.perfetto.dev",
        path.display()
    );
    Ok(())
}
