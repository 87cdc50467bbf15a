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
//! `a` and `c` change every round. Rounds overlap: up to [`IN_FLIGHT`] are
//! enqueued before the host checks the oldest, each downloading into its
//! own page-locked buffer, and a round's result is waited for (its download
//! operation's completion) only when the host checks it, on a sample of its
//! elements against the CPU reference, or in full with `--verify-all`. So
//! neither the host's wait nor the check sits between one round's
//! operations and the next's. The inputs `x` and `y` are rewritten every
//! round: each upload runs after the previous round's readers of its
//! buffer, by the engine's edges.
//!
//! With `demo --verbose`, host time per operation is printed three ways,
//! from the second round on (the first warms up, as the bench's untimed
//! first batch does): in all,
//! in the operations' bodies (the closures, whose launches and copies are
//! the demo's work, not the engine's), and the difference, the engine's
//! share (its waits, completion record and bookkeeping, and retiring each
//! checked round with what it was ordered after, so that the graph keeps
//! only the rounds in flight). Beside it, the
//! engine bench's per-operation shape (`benches/benches/engine.rs` section
//! 1: one wait and one record, an empty body) run here on the same streams,
//! timed the same way, once before the DAG and once after it, and the ratio
//! of the DAG's share to the mean of the two: the host's speed drifts over a
//! run (on the H100 machine the same shape read 0.53 to 0.98 µs from one
//! run to the next), and bracketing the DAG in time gives a drift during
//! the DAG the same weight on both sides of the ratio.
//! The engine's share is also given separately for the rounds enqueued
//! right after a host wait that blocked and for those enqueued right after
//! another round, which is where a gap from the bench's shape that comes
//! from the host's wait (cold caches, a sleeping thread) would show.

use crate::demo_sizes::{DemoResult, Sizes};
use cuda_streams::engine::OpBuilder;
use cuda_streams::kernels::{self, reference};
use cuda_streams::prelude::*;
use indicatif::ProgressBar;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Elements checked per round (without `--verify-all`).
const SAMPLE: usize = 4096;

/// Operations in a round.
const ROUND_OPERATIONS: u32 = 6;

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
/// says where it is spent. The retirement after the host's checks
/// ([`HostTime::retire`]) counts as the engine's share too.
#[derive(Default)]
struct HostTime {
    total: Duration,
    bodies: Duration,
    /// The engine's share spent retiring after the host's checks.
    retiring: Duration,
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

    /// Retire `checked`, whose round the host has just checked, and what it
    /// was ordered after ([`OperationGraph::retire_through`]: one query),
    /// timed as the engine's share. The graph then keeps only the rounds in
    /// flight, and the completion events of the retired rounds are recorded
    /// again while still warm. Left to the automatic sweeps (every 32
    /// completions per stream), a stream with one operation per round holds
    /// 32 rounds of operations and their events.
    fn retire(&mut self, graph: &OperationGraph, checked: OperationId) -> DemoResult<usize> {
        let started = Instant::now();
        let retired = graph.retire_through(checked)?;
        let time = started.elapsed();
        self.total += time;
        self.retiring += time;
        Ok(retired)
    }

    /// The figures of `self` and `other` together (their operations and
    /// times added; not by name).
    fn with(&self, other: &HostTime) -> HostTime {
        HostTime {
            total: self.total + other.total,
            bodies: self.bodies + other.bodies,
            retiring: self.retiring + other.retiring,
            before: self.before + other.before,
            operations: self.operations + other.operations,
            by_name: Vec::new(),
        }
    }

    /// The engine's share so far (all operations together).
    fn engine(&self) -> Duration {
        self.total.saturating_sub(self.bodies)
    }

    fn per_operation(&self, time: Duration) -> f64 {
        time.as_secs_f64() * 1e6 / f64::from(self.operations.max(1))
    }

    /// `total`, `bodies` and the engine's share, µs per operation.
    fn figures(&self) -> (f64, f64, f64) {
        let engine = self.engine();
        (
            self.per_operation(self.total),
            self.per_operation(self.bodies),
            self.per_operation(engine),
        )
    }

    /// The engine's share before the bodies and after them, µs per
    /// operation.
    fn split(&self) -> (f64, f64) {
        let engine = self.engine();
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

/// Operations of the engine bench's shape timed before the DAG and again
/// after it: each on one of two streams, after the previous one (on the
/// other), with an empty body: one wait and one record, as
/// `benches/benches/engine.rs` section 1.
const BENCH_SHAPE_OPERATIONS: u32 = 2000;

/// Completion events the bench's shape holds at the most (live operations
/// of its two streams between sweeps, and the spares its graph keeps), made
/// with the DAG's before any clock starts.
const SHAPE_EVENTS: usize = 512;

/// The engine bench's per-operation shape, run here on `graph` over the
/// DAG's streams and timed as the DAG's operations are, so that the two figures
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

/// Rounds in flight at most, each downloading into a page-locked buffer of
/// its own. When every buffer is in flight, the host checks all the rounds
/// but the newest (waiting for each one's download in turn), so the GPU
/// has a round queued while the host checks, and the next `IN_FLIGHT - 1`
/// rounds are enqueued back to back with no host wait between them.
const IN_FLIGHT: usize = 4;
// One round stays in flight while the others are checked.
const _: () = assert!(IN_FLIGHT >= 2);

/// A round enqueued and not yet checked.
struct InFlight {
    round: usize,
    /// Its coefficients: `y += a x`, `z = c`.
    a: f32,
    c: f32,
    /// Its last operation: once it is done, all six are.
    download: Op,
    /// Where `download` writes the round's result.
    host_out: PinnedBuffer<f32>,
}

/// The operations of a round that the next round's uploads must follow:
/// the last readers of `x` and `y`.
#[derive(Clone, Copy)]
struct Readers {
    /// On the stream of `upload x`, and after `saxpy` (which reads `x`)
    /// through its edge to `scale_add`: an edge to an operation on the
    /// same stream costs no wait.
    download: OperationId,
    /// Reads `y` on a stream of its own (`saxpy`, which also reads it,
    /// is on the stream of `upload y`).
    scale_add: OperationId,
}

/// How rounds are checked against the CPU reference.
struct Verify<'a> {
    xs: &'a [f32],
    ys: &'a [f32],
    all: bool,
}

impl Verify<'_> {
    /// Wait for `round`'s download, only now that its result is needed, and
    /// compare the round's sample (every element with `--verify-all`) with
    /// the CPU reference. Returns how many elements were checked.
    fn check(&self, round: &InFlight) -> DemoResult<usize> {
        round.download.wait()?;
        let got = round.host_out.as_slice()?;
        let (a, c) = (round.a, round.c);
        let expected = |i: usize| {
            let y = reference::saxpy_element(a, self.xs[i], self.ys[i]);
            reference::scale_add_element(0.5, y, 2.0, c)
        };
        let n = got.len();
        let stride = if self.all { 1 } else { (n / SAMPLE).max(1) };
        let offset = (round.round * 7919) % stride;
        if let Some(i) = (offset..n).step_by(stride).find(|&i| got[i] != expected(i)) {
            return Err(format!(
                "DAG round {}: element {i} is {}, expected {}",
                round.round,
                got[i],
                expected(i)
            )
            .into());
        }
        Ok((offset..n).step_by(stride).len())
    }
}

/// The engine's share of the timed rounds, by what the host did just
/// before enqueuing the round: blocked in a wait for an earlier round's
/// download, or enqueued the previous round.
#[derive(Default)]
struct AfterWait {
    /// Engine time and rounds right after a host wait that blocked.
    waited: (Duration, u32),
    /// Engine time and rounds right after another round.
    back_to_back: (Duration, u32),
}

impl AfterWait {
    fn add(&mut self, waited: bool, engine: Duration) {
        let bucket = if waited {
            &mut self.waited
        } else {
            &mut self.back_to_back
        };
        bucket.0 += engine;
        bucket.1 += 1;
    }

    /// "0.52 µs per operation over 3 rounds", or "no round" when none.
    fn describe((time, rounds): (Duration, u32)) -> String {
        if rounds == 0 {
            return "no round".to_string();
        }
        let us = time.as_secs_f64() * 1e6 / f64::from(rounds * ROUND_OPERATIONS);
        format!("{us:.2} µs per operation over {rounds} rounds")
    }
}

/// What the DAG did: how many rounds were checked (each of its completion
/// callbacks ran, or `run` fails), and the lines the demo prints.
pub(crate) struct DagRun {
    pub(crate) rounds_checked: usize,
    /// Operations retired after the host's checks (the diagnostics give the
    /// count; the tests read it here).
    #[cfg(test)]
    pub(crate) retired_at_checks: usize,
    /// One line for the user: what ran and that it was checked.
    pub(crate) summary: String,
    /// The engine's figures (`demo --verbose`): its host time per operation
    /// beside the engine bench's shape run in this run, and where it goes.
    pub(crate) diagnostics: String,
}

pub(crate) fn run(
    pool: &StreamPool,
    allocator: &StreamOrderedAllocator,
    profiler: &StreamProfiler,
    sizes: &Sizes,
    verify_all: bool,
    progress: &ProgressBar,
) -> DemoResult<DagRun> {
    let start = Instant::now();
    let n = sizes.dag_elements;
    let rounds = sizes.dag_rounds;
    let ctx = pool.context();
    let s: Vec<Arc<Stream>> = pool.streams().cloned().collect();
    // Enough completion events for every operation of the run, made before
    // the clock starts: the graph keeps an operation's event until a sweep
    // finds the GPU past it (every 32 completions on a stream), so a pool
    // that grew on demand would create events (a driver call of
    // microseconds each) inside the timed operations of the first rounds.
    // The bench's shape before and after the DAG takes its events from the
    // same pool: a few sweeps' worth per stream live, and the spares.
    let events = ROUND_OPERATIONS as usize * rounds + 64 + SHAPE_EVENTS;
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
    let host_x = PinnedBuffer::from_slice(ctx, &xs)?;
    let host_y = PinnedBuffer::from_slice(ctx, &ys)?;
    let verify = Verify {
        xs: &xs,
        ys: &ys,
        all: verify_all,
    };
    // The output buffers not in flight.
    let mut free = (0..IN_FLIGHT.min(rounds))
        .map(|_| PinnedBuffer::<f32>::new(ctx, n))
        .collect::<Result<Vec<_>, _>>()?;
    // The bench's shape before the DAG, on a graph of its own over the same
    // pool and streams (dropped before the DAG starts, so the DAG's graph
    // starts empty as it would without it).
    let shape_first = {
        let graph = OperationGraph::new(Arc::clone(&pool));
        let shape = bench_shape(&graph, &s, |_| Ok(()))?;
        for stream in &s {
            stream.synchronize()?;
        }
        shape
    };
    let mut in_flight = VecDeque::<InFlight>::with_capacity(IN_FLIGHT);
    let callbacks = Arc::new(AtomicUsize::new(0));
    let mut host = HostTime::default();
    let mut after_wait = AfterWait::default();
    let mut checked = 0;
    let mut rounds_checked = 0;
    // The previous round's readers of `x` and `y`.
    let mut readers: Option<Readers> = None;
    // Whether the host blocked on a download since the last round was
    // enqueued, and how many times it did in all.
    let mut waited = false;
    let mut blocked = 0;
    // Operations retired after the checks.
    let mut retired = 0;

    for round in 0..rounds {
        if free.is_empty() {
            // Every output buffer is in flight: check all the rounds but
            // the newest, which keeps the GPU busy meanwhile.
            let mut newest_checked = None;
            while in_flight.len() > 1 {
                let oldest = in_flight.pop_front().expect("more than one in flight");
                newest_checked = Some(oldest.download.id());
                if !oldest.download.is_done()? {
                    waited = true;
                    blocked += 1;
                }
                checked += verify.check(&oldest)?;
                rounds_checked += 1;
                progress.inc(1);
                free.push(oldest.host_out);
            }
            if let Some(checked) = newest_checked {
                retired += host.retire(&graph, checked)?;
            }
        }
        let mut host_out = free.pop().expect("a free output buffer: made free above");
        let engine_before = host.engine();
        let a = 1.0 + (round % 4) as f32;
        let c = 3.0 + (round % 5) as f32;
        let (after_x, after_y): (&[OperationId], &[OperationId]) = match &readers {
            Some(r) => (
                std::slice::from_ref(&r.download),
                std::slice::from_ref(&r.scale_add),
            ),
            None => (&[], &[]),
        };

        // Each operation inside a profiler scope on its stream.
        macro_rules! operation {
            ($stream:expr, $name:literal, $after:expr, $work:expr) => {{
                let _scope = profiler.scope($stream, concat!("dag ", $name))?;
                host.run($name, graph.op($stream).after($after).label($name), $work)?
            }};
        }
        let up_x = operation!(&s[0], "upload x", after_x, |st| st
            .copy_from_host_async(&mut x, &host_x));
        let up_y = operation!(&s[1], "upload y", after_y, |st| st
            .copy_from_host_async(&mut y, &host_y));
        // Scratch memory in stream order: freed at the end of the round,
        // reused by a later one without a driver call once the GPU is past
        // its uses.
        let mut z = allocator.allocate_for_stream(&s[2], n * 4)?;
        let mut out = allocator.allocate_for_stream(&s[3], n * 4)?;
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
        let download = operation!(&s[0], "download", &[join.id()], |st| st
            .copy_to_host_async(&mut host_out, &out_view));
        drop(out_view);
        let counter = Arc::clone(&callbacks);
        graph.add_completion_callback(download.id(), move || {
            counter.fetch_add(1, Ordering::Relaxed);
        })?;
        drop((z, out)); // freed in stream order, after the work that uses them
        readers = Some(Readers {
            download: download.id(),
            scale_add: join.id(),
        });
        in_flight.push_back(InFlight {
            round,
            a,
            c,
            download,
            host_out,
        });
        if round == 0 && rounds > 1 {
            // The first round is a warm-up (the first use of each stream by
            // the graph, the allocator and the profiler), as the bench's
            // first, untimed batch is: timing starts with the second.
            host = HostTime::default();
        } else {
            after_wait.add(waited, host.engine().saturating_sub(engine_before));
        }
        waited = false;
    }
    // The rounds still in flight, oldest first.
    for last in in_flight.drain(..) {
        checked += verify.check(&last)?;
        rounds_checked += 1;
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
    if fired != rounds {
        return Err(format!("{fired} of {rounds} completion callbacks ran").into());
    }
    let how = if verify_all {
        "every element".to_string()
    } else {
        format!(
            "{} elements of each; --verify-all checks all",
            checked / rounds.max(1)
        )
    };
    let grew = pool.growth_count();
    let elapsed = start.elapsed();
    let (total, bodies, engine) = host.figures();
    let retiring = host.per_operation(host.retiring);
    let (dag_before, dag_after) = host.split();
    let shape_last = bench_shape(&graph, &s, |_| Ok(()))?;
    let (_, _, first) = shape_first.figures();
    let (_, _, last) = shape_last.figures();
    let shape = shape_first.with(&shape_last);
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
    let timed = if rounds > 1 {
        "steady state: rounds 2 on, the first left out as warm-up"
    } else {
        "the one round, warm-up included"
    };
    let summary = format!(
        "operation DAG: {rounds} rounds x 6 operations on 4 pool streams ({} in all: two uploads, saxpy, fill, scale_add on scratch memory from the stream-ordered allocator, a download), ordered by the engine's events, up to {IN_FLIGHT} rounds in flight, every round checked ({how}) while later rounds ran, {:.3} s",
        metrics.total_operations,
        elapsed.as_secs_f64(),
    );
    let diagnostics = format!(
        "DAG: {fired} completion callbacks ran as rounds finished, {blocked} waits for an unfinished download\n\
         DAG host time per operation ({timed}): {total:.2} µs in all = {bodies:.2} µs in the operations' bodies (their launches and copies) + {engine:.2} µs in the engine (waits, record, bookkeeping, and {retiring:.2} retiring {retired} operations after the host's checks){}\n\
         the engine bench's shape run here before and after the DAG ({BENCH_SHAPE_OPERATIONS} operations each time, one wait and one record each, empty bodies, the first left out): {first:.2} and {last:.2} µs per operation in the engine, {bench:.2} together; the DAG's share is {:.1}x that\n\
         the engine's share split at the body, before it (dependency waits) / after it (completion record, bookkeeping, retiring): DAG {dag_before:.2} / {dag_after:.2} µs, the bench's shape {bench_before:.2} / {bench_after:.2} µs, the bench's shape with a 4-byte memset as each body {busy_before:.2} / {busy_after:.2} µs ({busy_engine:.2} in all); the DAG's by operation (µs): {}\n\
         the DAG's share in the rounds enqueued right after the host waited for a download: {}; right after the previous round: {}",
        match grew {
            0 => String::new(),
            n => format!(" (the event pool grew by {n} events while timed)"),
        },
        engine / bench.max(1e-9),
        host.by_name(),
        AfterWait::describe(after_wait.waited),
        AfterWait::describe(after_wait.back_to_back),
    );
    Ok(DagRun {
        rounds_checked,
        #[cfg(test)]
        retired_at_checks: retired,
        summary,
        diagnostics,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The demo's engine, allocator and profiler on device 0, as `demo`
    /// makes them.
    struct Setup {
        pool: StreamPool,
        allocator: StreamOrderedAllocator,
        profiler: StreamProfiler,
    }

    fn setup() -> Setup {
        let ctx = Context::new(0).unwrap();
        let allocator = StreamOrderedAllocator::new(&ctx).unwrap();
        let profiler = StreamProfiler::new(&ctx).unwrap();
        profiler.track_memory(&allocator).unwrap();
        profiler.enable();
        Setup {
            pool: StreamPool::new(&ctx, 4).unwrap(),
            allocator,
            profiler,
        }
    }

    fn sizes(rounds: usize) -> Sizes {
        Sizes {
            elements: 0,
            steps: 0,
            iterations: 0,
            dag_elements: 4 * SAMPLE,
            dag_rounds: rounds,
        }
    }

    /// Rounds that overlap (enough to fill the ring of output buffers
    /// twice and a half) each verify, every completion callback runs, and
    /// each operation is in a profiler scope. Under the `check` ordering
    /// policy (the software driver's default) this is also the race test:
    /// an upload not ordered after the previous round's readers of its
    /// buffer is refused.
    #[test]
    fn overlapping_rounds_verify_and_every_callback_runs() {
        let setup = setup();
        let policy = setup.pool.context().ordering();
        if policy != cuda_streams::driver::OrderPolicy::Check {
            eprintln!("ordering policy {policy:?}: the rounds' races are not checked in this run");
        }
        let rounds = 2 * IN_FLIGHT + 2;
        for verify_all in [false, true] {
            let ran = run(
                &setup.pool,
                &setup.allocator,
                &setup.profiler,
                &sizes(rounds),
                verify_all,
                &ProgressBar::hidden(),
            )
            .unwrap_or_else(|err| panic!("verify_all {verify_all}: {err}"));
            assert_eq!(ran.rounds_checked, rounds);
            // Checked in the loop: rounds 0-2 when round 4 finds every
            // output buffer in flight, then 3-5 at round 7. Each check
            // retires its newest round's download with every operation of
            // its round and the rounds before (the automatic sweeps, every
            // 32 completions per stream, have not come yet).
            assert_eq!(
                ran.retired_at_checks,
                6 * ROUND_OPERATIONS as usize,
                "verify_all {verify_all}"
            );
            assert!(
                ran.summary
                    .starts_with(&format!("operation DAG: {rounds} rounds x 6 operations"))
                    && !ran.summary.contains('\n'),
                "{}",
                ran.summary
            );
            assert!(
                ran.diagnostics
                    .contains(&format!(" {rounds} completion callbacks ")),
                "{}",
                ran.diagnostics
            );
            // The shape before the DAG and after it, and the two together:
            // as many operations each, so their mean.
            let (first, last, together) = shape_figures(&ran.diagnostics);
            assert!(
                (together - (first + last) / 2.0).abs() <= 0.011,
                "{first} and {last}, together {together}: {}",
                ran.diagnostics
            );
        }
        let report = setup.profiler.get_comprehensive_report();
        let downloads: u64 = report
            .streams
            .iter()
            .filter_map(|stream| stream.operations.get("dag download"))
            .map(|op| op.count)
            .sum();
        assert_eq!(downloads, 2 * rounds as u64, "{report}");
    }

    /// The shape's figures before and after the DAG and together, read
    /// back from the diagnostics.
    fn shape_figures(diagnostics: &str) -> (f64, f64, f64) {
        let line = diagnostics
            .lines()
            .find(|line| line.contains("shape run here before and after the DAG"))
            .expect("the shape's line");
        let figures = line
            .split_once("the first left out): ")
            .expect("its figures")
            .1;
        let number = |text: &str| text.trim().parse::<f64>().expect("a figure");
        let (first, rest) = figures.split_once(" and ").expect("first");
        let (last, rest) = rest
            .split_once(" µs per operation in the engine, ")
            .expect("last");
        let together = rest.split_once(" together").expect("together").0;
        (number(first), number(last), number(together))
    }

    /// A round whose result differs from the CPU reference fails, naming
    /// the round, the element and both values; with `--verify-all` also
    /// where the sample does not look.
    #[test]
    fn a_wrong_result_fails_naming_the_round_and_the_element() {
        let ctx = Context::new(0).unwrap();
        let stream = Stream::new(&ctx).unwrap();
        let graph = OperationGraph::for_context(&ctx);
        let n = 4 * SAMPLE;
        let (xs, ys) = (data(1, n), data(2, n));
        let (a, c, round) = (2.0, 4.0, 5);
        let mut right: Vec<f32> = (0..n)
            .map(|i| {
                let y = reference::saxpy_element(a, xs[i], ys[i]);
                reference::scale_add_element(0.5, y, 2.0, c)
            })
            .collect();
        let in_flight = |values: &[f32]| InFlight {
            round,
            a,
            c,
            download: graph.op(&stream).run(|_| Ok(())).unwrap(),
            host_out: PinnedBuffer::from_slice(&ctx, values).unwrap(),
        };
        let sampled = Verify {
            xs: &xs,
            ys: &ys,
            all: false,
        };
        let every = Verify {
            all: true,
            ..sampled
        };
        assert_eq!(sampled.check(&in_flight(&right)).unwrap(), SAMPLE);
        assert_eq!(every.check(&in_flight(&right)).unwrap(), n);
        // The sample's first element, then one it does not look at.
        let stride = n / SAMPLE;
        let first = (round * 7919) % stride;
        right[first] += 1.0;
        let err = sampled.check(&in_flight(&right)).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!("DAG round {round}: element {first} is ")),
            "{err}"
        );
        right[first] -= 1.0;
        right[first + 1] += 1.0;
        sampled.check(&in_flight(&right)).unwrap();
        let err = every.check(&in_flight(&right)).unwrap_err().to_string();
        assert!(err.contains(&format!("element {} is ", first + 1)), "{err}");
    }
}
