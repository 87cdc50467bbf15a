//! A new user's first hour, written from the README alone:
//!
//! 1. three streams of a pool joined through the operation graph: two
//!    producers fill a buffer each, a consumer reads both once both are done;
//! 2. a small pipeline (upload, compute, download on those three streams)
//!    whose compute step takes its output memory from the stream-ordered
//!    allocator, with a profiler observing the graph and tracking the
//!    allocator: one report with each operation's times under its label and
//!    the allocator's memory.
//!
//! Every result is checked against the CPU; a wrong one ends the program
//! with a message and exit status 1 (CI runs it:
//! `cargo run -p cuda-streams --example first_hour`).

use cuda_streams::{kernels, prelude::*};
use std::process::ExitCode;
use std::sync::Arc;

const N: usize = 4096;
const STEPS: usize = 4;
const ITERATIONS: u32 = 3;

fn main() -> ExitCode {
    match run() {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(wrong)) => {
            eprintln!("wrong result: {wrong}");
            ExitCode::FAILURE
        }
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}

/// The outer `Result` is the library's, the inner one the checks'.
fn run() -> Result<Result<(), String>, cuda_streams::Error> {
    let ctx = Context::new(0)?;
    let pool = StreamPool::new(&ctx, 3)?;
    let streams = [pool.get_stream(), pool.get_stream(), pool.get_stream()];
    let fill = Module::load(&ctx, &kernels::ELEMENTWISE)?.function("fill_f32")?;
    let compute = Module::load(&ctx, &kernels::COMPUTE)?.function("compute")?;
    let graph = OperationGraph::for_context(&ctx);
    let config = LaunchConfig::for_num_elems(N as u32);

    // Task 2: two producers on two streams, a consumer on the third after both.
    let (mut a, mut b) = (
        DeviceBuffer::<f32>::new(&ctx, N)?,
        DeviceBuffer::<f32>::new(&ctx, N)?,
    );
    let args_a = [(N as u64).into(), 1.5f32.into(), (&mut a).into()];
    let fill_a = graph
        .op(&streams[0])
        .label("fill a")
        .run(|s| s.launch(&fill, config, &args_a))?;
    let args_b = [(N as u64).into(), 2.5f32.into(), (&mut b).into()];
    let fill_b = graph
        .op(&streams[1])
        .label("fill b")
        .run(|s| s.launch(&fill, config, &args_b))?;
    let (mut host_a, mut host_b) = (vec![0.0f32; N], vec![0.0f32; N]);
    let join = graph
        .op(&streams[2])
        .after(&[fill_a.id(), fill_b.id()])
        .label("read both")
        .run(|s| {
            s.copy_to_host(&mut host_a, &a)?;
            s.copy_to_host(&mut host_b, &b)
        })?;
    join.wait()?;
    if let Some(i) = (0..N).find(|&i| host_a[i] + host_b[i] != 4.0) {
        return Ok(Err(format!(
            "join: element {i} is {} + {}, expected 1.5 + 2.5",
            host_a[i], host_b[i]
        )));
    }

    // Task 5: the allocator and the profiler on a small pipeline.
    let allocator = StreamOrderedAllocator::new(&ctx)?;
    let profiler = Arc::new(StreamProfiler::new(&ctx)?);
    profiler.track_memory(&allocator)?;
    profiler.enable();
    graph.observe(profiler.clone());
    let (upload, work, download) = (&streams[0], &streams[1], &streams[2]);
    let mut x = DeviceBuffer::<f32>::new(&ctx, N)?;
    let mut last = join.id();
    for step in 0..STEPS {
        let input: Vec<f32> = (0..N).map(|i| (step * N + i) as f32 / N as f32).collect();
        let up = graph
            .op(upload)
            .after(&[last])
            .label("upload")
            .run(|s| s.copy_from_host(&mut x, &input))?;
        let mut y = None;
        let computed = graph.op(work).after(&[up.id()]).label("compute").run(|s| {
            // The output lives in the allocator's memory, freed in stream
            // order once the download has read it.
            let block = y.insert(allocator.allocate_for_stream(s, N * size_of::<f32>())?);
            let mut y = block.as_device_mut::<f32>()?;
            s.launch(
                &compute,
                config,
                &[
                    (N as u64).into(),
                    ITERATIONS.into(),
                    (&x).into(),
                    (&mut y).into(),
                ],
            )
        })?;
        let y = y.expect("the compute operation ran");
        let mut output = vec![0.0f32; N];
        let down = graph
            .op(download)
            .after(&[computed.id()])
            .label("download")
            .run(|s| {
                let y = y.as_device::<f32>()?;
                s.copy_to_host(&mut output, &y)
            })?;
        down.wait()?;
        let expected = |i: usize| kernels::reference::compute_element(ITERATIONS, input[i]);
        if let Some(i) = (0..N).find(|&i| output[i] != expected(i)) {
            return Ok(Err(format!(
                "step {step}: element {i} is {}, expected {}",
                output[i],
                expected(i)
            )));
        }
        last = down.id();
    }

    let report = profiler.get_comprehensive_report();
    println!("{report}");
    println!("{}", allocator.stats());
    for (stream, label) in [
        (upload, "upload"),
        (work, "compute"),
        (download, "download"),
    ] {
        let count = report
            .stream(stream.id())
            .and_then(|r| r.operations.get(label))
            .map(|o| o.count);
        if count != Some(STEPS as u64) {
            return Ok(Err(format!(
                "the profiler timed {label} {count:?} time(s), expected {STEPS}"
            )));
        }
    }
    let Some(memory) = &report.memory else {
        return Ok(Err(
            "the report shows no memory, though the allocator is tracked".into(),
        ));
    };
    if memory.peak_allocated_bytes < (N * size_of::<f32>()) as u64
        || memory.allocations != STEPS as u64
    {
        return Ok(Err(format!("the report's memory is wrong: {memory}")));
    }
    println!("first hour: every result checked");
    Ok(Ok(()))
}
