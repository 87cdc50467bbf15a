//! The demo's operation DAG: six dependent operations over four pool
//! streams, built with the engine's builder and ordered only by its events
//! (cuStreamWaitEvent on completion events), each timed by the profiler.
//! The scratch buffers `z` and `out` come from the stream-ordered allocator
//! every round, so the trace shows its memory counter tracks.
//!
//! ```text
//! upload x (s0) ─┐
//!                ├─> y += a x (s1) ─┐
//! upload y (s1) ─┘                  ├─> out = 0.5 y + 2 z (s3) ─> download out (s0)
//! z = c (s2) ───────────────────────┘
//! ```
//!
//! `a` and `c` change every round. Each round's result is checked on a
//! sample of its elements against the CPU reference, or in full with
//! `--verify-all`.
//!
//! Host time per operation is printed three ways, from the second round on
//! (the first warms up, as the bench's untimed first batch does): in all,
//! in the operations' bodies (the closures, whose launches and copies are
//! the demo's work, not the engine's), and the difference, the engine's
//! share (its waits, completion record and bookkeeping). Beside it, the
//! engine bench's per-operation shape (`benches/benches/engine.rs` section
//! 1: one wait and one record, an empty body) run here after the DAG on the
//! same graph and streams, timed the same way, and the ratio of the two.

use crate::demo::{DemoResult, Sizes};
use cuda_streams::engine::OpBuilder;
use cuda_streams::kernels::{self, reference};
use cuda_streams::prelude::*;
use indicatif::ProgressBar;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Elements checked per round (without `--verify-all`).
const SAMPLE: usize = 4096;

/// A small xorshift: varied, never-all-zero data.
fn data(seed: u64, n: usize) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % 1000) as f32 * 0.01
        })
        .collect()
}

/// Host time of the operations' `run` calls: in all, and in their bodies
/// (the closures, which enqueue the launch or copy). The engine's share is
/// the difference: its waits for dependencies, the completion record and its
/// bookkeeping, which is what the engine bench's per-operation figure
/// measures (with its own driver calls, on an empty body). The share is also
/// split where the body runs, into the part before it (the dependencies'
/// lookup and waits) and the part after it (the completion record and the
/// bookkeeping), and by operation name, so that a figure off the bench's
/// says where it is spent.
#[derive(Default)]
struct HostTime {
    total: Duration,
    bodies: Duration,
    /// The engine's share before the bodies.
    before: Duration,
    operations: u32,
    /// The engine's share and the count of each operation name, in the
    /// order first run.
    by_name: Vec<(&'static str, Duration, u32)>,
}

impl HostTime {
    /// Build and run one operation named `name`, timing it and its body.
    fn run(
        &mut self,
        name: &'static str,
        builder: OpBuilder<'_>,
        work: impl FnOnce(&Stream) -> cuda_streams::driver::Result<()>,
    ) -> Result<Op, cuda_streams::Error> {
        let mut in_work = Duration::ZERO;
        let mut before = Duration::ZERO;
        let started = Instant::now();
        let op = builder.run(|s| {
            let work_started = Instant::now();
            before = work_started - started;
            let result = work(s);
            in_work = work_started.elapsed();
            result
        })?;
        let total = started.elapsed();
        self.total += total;
        self.bodies += in_work;
        self.before += before;
        self.operations += 1;
        let engine = total.saturating_sub(in_work);
        match self.by_name.iter_mut().find(|(n, ..)| *n == name) {
            Some((_, time, count)) => {
                *time += engine;
                *count += 1;
            }
            None => self.by_name.push((name, engine, 1)),
        }
        Ok(op)
    }

    fn per_operation(&self, time: Duration) -> f64 {
        time.as_secs_f64() * 1e6 / f64::from(self.operations.max(1))
    }

    /// `total`, `bodies` and the engine's share, µs per operation.
    fn figures(&self) -> (f64, f64, f64) {
        let engine = self.total.saturating_sub(self.bodies);
        (
            self.per_operation(self.total),
            self.per_operation(self.bodies),
            self.per_operation(engine),
        )
    }

    /// The engine's share before the bodies and after them, µs per
    /// operation.
    fn split(&self) -> (f64, f64) {
        let engine = self.total.saturating_sub(self.bodies);
        (
            self.per_operation(self.before),
            self.per_operation(engine.saturating_sub(self.before)),
        )
    }

    /// The engine's share per operation of each name: "upload x 1.20, …" (µs).
    fn by_name(&self) -> String {
        let each: Vec<String> = self
            .by_name
            .iter()
            .map(|(name, time, count)| {
                let us = time.as_secs_f64() * 1e6 / f64::from((*count).max(1));
                format!("{name} {us:.2}")
            })
            .collect();
        each.join(", ")
    }
}

/// Operations of the engine bench's shape timed after the DAG: each on one
/// of two streams, after the previous one (on the other), with an empty
/// body: one wait and one record, as `benches/benches/engine.rs` section 1.
const BENCH_SHAPE_OPERATIONS: u32 = 2000;

/// The engine bench's per-operation shape, run here on the DAG's graph and
/// streams and timed as the DAG's operations are, so that the two figures
/// compare like with like (same machine, same run, same clock reads), each
/// operation's body being `body` (empty for the bench's own shape).
fn bench_shape(
    graph: &OperationGraph,
    streams: &[Arc<Stream>],
    mut body: impl FnMut(&Stream) -> cuda_streams::driver::Result<()>,
) -> DemoResult<HostTime> {
    let mut host = HostTime::default();
    let mut prev = host.run("first", graph.op(&streams[0]), &mut body)?.id();
    host = HostTime::default();
    for i in 0..BENCH_SHAPE_OPERATIONS as usize {
        let stream = &streams[1 + i % 2];
        prev = host
            .run("bench", graph.op(stream).after(&[prev]), &mut body)?
            .id();
        if i % 100 == 99 {
            // As the bench does after each batch (untimed): short queues.
            for stream in streams {
                stream.synchronize()?;
            }
        }
    }
    Ok(host)
}

pub(crate) fn run(
    pool: &StreamPool,
    allocator: &StreamOrderedAllocator,
    profiler: &StreamProfiler,
    sizes: &Sizes,
    verify_all: bool,
    progress: &ProgressBar,
) -> DemoResult<String> {
    let start = Instant::now();
    let n = sizes.dag_elements;
    let ctx = pool.context();
    let s: Vec<Arc<Stream>> = pool.streams().cloned().collect();
    // Enough completion events for every operation of the run, made before
    // the clock starts: the graph keeps an operation's event until a sweep
    // finds the GPU past it (every 32 completions on a stream), so a pool
    // that grew on demand would create events (a driver call of
    // microseconds each) inside the timed operations of the first rounds.
    let events = 6 * sizes.dag_rounds + 64;
    let pool = EventPool::builder(ctx).plain(events).build()?;
    let graph = OperationGraph::new(Arc::clone(&pool));
    let elementwise = Module::load(ctx, &kernels::ELEMENTWISE)?;
    let (saxpy, fill, scale_add) = (
        elementwise.function("saxpy")?,
        elementwise.function("fill_f32")?,
        elementwise.function("scale_add")?,
    );
    let cfg = LaunchConfig::for_num_elems(n.min(1 << 20) as u32);
    let len = n as u64;
    let (mut x, mut y) = (
        DeviceBuffer::<f32>::new(ctx, n)?,
        DeviceBuffer::<f32>::new(ctx, n)?,
    );
    // The inputs are made once; the coefficients vary by round.
    let (xs, ys) = (data(1, n), data(2, n));
    let mut host_x = PinnedBuffer::<f32>::new(ctx, n)?;
    let mut host_y = PinnedBuffer::<f32>::new(ctx, n)?;
    host_x.as_mut_slice()?.copy_from_slice(&xs);
    host_y.as_mut_slice()?.copy_from_slice(&ys);
    let mut host_out = PinnedBuffer::<f32>::new(ctx, n)?;
    let callbacks = Arc::new(AtomicUsize::new(0));
    let mut host = HostTime::default();
    let mut checked = 0;

    for round in 0..sizes.dag_rounds {
        let a = 1.0 + (round % 4) as f32;
        let c = 3.0 + (round % 5) as f32;
        // Scratch memory in stream order: freed at the end of the round,
        // reused by the next one without a driver call.
        let mut z = allocator.allocate_for_stream(&s[2], n * 4)?;
        let mut out = allocator.allocate_for_stream(&s[3], n * 4)?;

        // Each operation inside a profiler scope on its stream.
        macro_rules! operation {
            ($stream:expr, $name:literal, $after:expr, $work:expr) => {{
                let _scope = profiler.scope($stream, concat!("dag ", $name))?;
                host.run($name, graph.op($stream).after($after).label($name), $work)?
            }};
        }
        let up_x = operation!(&s[0], "upload x", &[], |st| st
            .copy_from_host_async(&mut x, &host_x));
        let up_y = operation!(&s[1], "upload y", &[], |st| st
            .copy_from_host_async(&mut y, &host_y));
        let axpy = operation!(&s[1], "saxpy", &[up_x.id(), up_y.id()], |st| st.launch(
            &saxpy,
            cfg,
            &[len.into(), a.into(), (&x).into(), (&mut y).into()]
        ));
        let mut z_view = z.as_device_mut::<f32>()?;
        let fill_z = operation!(&s[2], "fill", &[], |st| st.launch(
            &fill,
            cfg,
            &[len.into(), c.into(), (&mut z_view).into()]
        ));
        drop(z_view);
        let z_view = z.as_device::<f32>()?;
        let mut out_view = out.as_device_mut::<f32>()?;
        let join = operation!(&s[3], "scale_add", &[axpy.id(), fill_z.id()], |st| st
            .launch(
                &scale_add,
                cfg,
                &[
                    len.into(),
                    0.5f32.into(),
                    (&y).into(),
                    2.0f32.into(),
                    (&z_view).into(),
                    (&mut out_view).into(),
                ]
            ));
        drop((z_view, out_view));
        let out_view = out.as_device::<f32>()?;
        let down = operation!(&s[0], "download", &[join.id()], |st| st
            .copy_to_host_async(&mut host_out, &out_view));
        drop(out_view);
        let counter = Arc::clone(&callbacks);
        graph.add_completion_callback(down.id(), move || {
            counter.fetch_add(1, Ordering::Relaxed);
        })?;
        drop((z, out)); // freed in stream order, after the work that uses them

        // The download is last in the plan: once it is done, all six are.
        let got = host_out.as_slice()?;
        let expected = |i: usize| {
            let y = reference::saxpy_element(a, xs[i], ys[i]);
            reference::scale_add_element(0.5, y, 2.0, c)
        };
        let stride = if verify_all { 1 } else { (n / SAMPLE).max(1) };
        let offset = (round * 7919) % stride;
        if let Some(i) = (offset..n).step_by(stride).find(|&i| got[i] != expected(i)) {
            return Err(format!(
                "DAG round {round}: element {i} is {}, expected {}",
                got[i],
                expected(i)
            )
            .into());
        }
        checked += (offset..n).step_by(stride).len();
        if round == 0 && sizes.dag_rounds > 1 {
            // The first round is a warm-up (the first use of each stream by
            // the graph, the allocator and the profiler), as the bench's
            // first, untimed batch is: timing starts with the second.
            host = HostTime::default();
        }
        progress.inc(1);
    }
    for stream in &s {
        stream.synchronize()?;
    }
    if !graph.detect_deadlocks().is_empty() {
        return Err("the engine found a deadlock in an acyclic plan".into());
    }
    graph.retire_completed();
    let metrics = graph.metrics();
    let fired = callbacks.load(Ordering::Relaxed);
    if fired != sizes.dag_rounds {
        return Err(format!("{fired} of {} completion callbacks ran", sizes.dag_rounds).into());
    }
    let how = if verify_all {
        "every element".to_string()
    } else {
        format!(
            "{} elements of each; --verify-all checks all",
            checked / sizes.dag_rounds.max(1)
        )
    };
    let grew = pool.growth_count();
    let elapsed = start.elapsed();
    let (total, bodies, engine) = host.figures();
    let (dag_before, dag_after) = host.split();
    let shape = bench_shape(&graph, &s, |_| Ok(()))?;
    let (_, _, bench) = shape.figures();
    let (bench_before, bench_after) = shape.split();
    // The same shape with real work as each body, one 4-byte memset: the
    // engine's calls after work the GPU has to run, as the DAG's are.
    let mut word = DeviceBuffer::<u32>::new(ctx, 1)?;
    let mut value = 0u32;
    let busy = bench_shape(&graph, &s, |st| {
        value = value.wrapping_add(1);
        st.memset_u32_async(&mut word, value)
    })?;
    let (_, _, busy_engine) = busy.figures();
    let (busy_before, busy_after) = busy.split();
    Ok(format!(
        "operation DAG: {} rounds x 6 operations on 4 pool streams ({} in all), every round checked ({how}), {fired} completion callbacks at GPU time, {:.3} s\n\
         DAG host time per operation (after the first round): {total:.2} µs in all = {bodies:.2} µs in the operations' bodies (their launches and copies) + {engine:.2} µs in the engine (waits, record, bookkeeping){}\n\
         the engine bench's shape run here ({BENCH_SHAPE_OPERATIONS} operations, one wait and one record each, empty bodies): {bench:.2} µs per operation in the engine; the DAG's share is {:.1}x that\n\
         the engine's share split at the body, before it (dependency waits) / after it (completion record, bookkeeping): DAG {dag_before:.2} / {dag_after:.2} µs, the bench's shape {bench_before:.2} / {bench_after:.2} µs, the bench's shape with a 4-byte memset as each body {busy_before:.2} / {busy_after:.2} µs ({busy_engine:.2} in all); the DAG's by operation (µs; upload x comes first after the previous round's host wait): {}",
        sizes.dag_rounds,
        metrics.total_operations,
        elapsed.as_secs_f64(),
        match grew {
            0 => String::new(),
            n => format!(" (the event pool grew by {n} events while timed)"),
        },
        engine / bench.max(1e-9),
        host.by_name(),
    ))
}
