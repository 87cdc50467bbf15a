//! Event coordination: pooled events against `cuEventCreate` + `cuEventDestroy`;
//! the coordinator's host overhead per operation with 100k operations in
//! flight, against the driver calls it makes; the async waiter's latency
//! (event done -> callback) and its CPU time while idle and while a long
//! wait is pending.
//!
//! The coordinator and its driver calls are timed in alternating batches
//! ([`alternating`]), each batch followed by an untimed synchronize, and the
//! overhead is the median over neighbouring pairs: timed one after the
//! other, the same figure moved by +35% / -26% between runs on the H100.
//!
//! `EVENTS_COUNT=<scenario>:<n>` runs one scenario `n` times and nothing
//! else, for counting instructions under callgrind (`valgrind
//! --tool=callgrind --separate-threads=yes --toggle-collect='events::counted*'`
//! counts the repetitions alone, on the calling thread): `op` (the coordinator's register + begin + complete, 100k in
//! flight), `record` (its `cuEventRecord` alone), `dep` (an operation
//! depending on the previous one on the other stream), `raw-dep` (its wait +
//! record alone).
//!
//! `EVENTS_WAITER=1` runs only the async waiter's figures: its latency, and
//! the CPU and reactor wake-ups per second of a long pending wait, with the
//! reactor's long parks and with its short back-off alone.

use criterion::Criterion;
use cuda_streams_benches::{
    Pair, alternating, compare, criterion_summary, figure, median_ns, run_criterion, spin_kernel,
    thread_cpu_ns,
};
use driver::{Context, Event, LaunchConfig, Stream};
use events::{AsyncEventWaiter, EventPool, EventPriority, OperationCoordinator, OperationType};
use std::hint::black_box;
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

/// Operations registered and left waiting, so the maps are realistically full.
const IN_FLIGHT: usize = 100_000;
/// Alternating batches per side, and calls per batch.
const SAMPLES: usize = 200;
const BATCH: usize = 250;
/// The waiter's thread and the context's reactor (names cut to 15 bytes).
const WAITER_THREAD: &str = "cuda-streams-ev";
const REACTOR_THREAD: &str = "cuda-streams-re";

fn setup() -> (Arc<Context>, Arc<EventPool>) {
    let ctx = Context::new(0).expect("a context");
    let pool = Arc::new(EventPool::new(&ctx, 64, 16).expect("a pool"));
    (ctx, pool)
}

fn pool_round_trip(pool: &Arc<EventPool>) {
    drop(black_box(pool.acquire_event(false).expect("an event")));
}

fn create_and_destroy(ctx: &Arc<Context>) {
    drop(black_box(Event::plain(ctx).expect("an event")));
}

/// A coordinator holding `IN_FLIGHT` registered operations that never run.
fn loaded_coordinator(pool: &Arc<EventPool>, stream: &Arc<Stream>) -> OperationCoordinator {
    let coordinator = OperationCoordinator::new(Arc::clone(pool));
    for _ in 0..IN_FLIGHT {
        coordinator
            .register_operation(
                OperationType::Kernel,
                EventPriority::Low,
                stream,
                vec![],
                "idle",
            )
            .expect("register");
    }
    coordinator
}

fn one_operation(coordinator: &OperationCoordinator, stream: &Arc<Stream>) {
    let id = coordinator
        .register_operation(
            OperationType::Kernel,
            EventPriority::Normal,
            stream,
            vec![],
            "op",
        )
        .expect("register");
    coordinator.begin_operation(id, stream).expect("begin");
    coordinator.complete_operation(id).expect("complete");
}

/// Operations on two streams, each depending on the previous one, which ran
/// on the other stream: one `cuStreamWaitEvent` and one `cuEventRecord`
/// each, the coordinator's way and the raw way.
struct Chain<'a> {
    coordinator: &'a OperationCoordinator,
    streams: [&'a Arc<Stream>; 2],
    previous: Option<events::OperationId>,
    /// The raw side's last event on each stream.
    raw_events: [events::PooledEvent; 2],
}

impl<'a> Chain<'a> {
    fn new(
        coordinator: &'a OperationCoordinator,
        pool: &Arc<EventPool>,
        streams: [&'a Arc<Stream>; 2],
    ) -> Self {
        let raw_events = streams.map(|s| {
            let event = pool.acquire_event(false).expect("an event");
            event.record(s).expect("record");
            event
        });
        Self {
            coordinator,
            streams,
            previous: None,
            raw_events,
        }
    }

    /// Call `i`: on stream `i % 2`, after the previous operation.
    fn ours(&mut self, i: usize) {
        let on = self.streams[i % 2];
        let id = self
            .coordinator
            .register_operation(
                OperationType::Kernel,
                EventPriority::Normal,
                on,
                self.previous.take().into_iter().collect(),
                "chained",
            )
            .expect("register");
        self.coordinator.begin_operation(id, on).expect("begin");
        self.coordinator.complete_operation(id).expect("complete");
        self.previous = Some(id);
    }

    /// The same driver calls: wait for the other stream's last event, record.
    fn raw(&mut self, i: usize) {
        let on = self.streams[i % 2];
        on.wait_event(&self.raw_events[(i + 1) % 2]).expect("wait");
        self.raw_events[i % 2].record(on).expect("record");
    }
}

fn criterion_groups(c: &mut Criterion) {
    let (ctx, pool) = setup();
    let stream = Stream::new(&ctx).expect("a stream");
    let mut group = c.benchmark_group("events");
    group.bench_function("pool acquire + release", |b| {
        b.iter(|| pool_round_trip(&pool))
    });
    let capped = Arc::new(EventPool::with_capacity_limit(&ctx, 64, 16, 1 << 20).expect("a pool"));
    group.bench_function(
        "pool acquire + release, shared shelf only (capped pool)",
        |b| b.iter(|| pool_round_trip(&capped)),
    );
    group.bench_function("baseline: Event::plain + drop", |b| {
        b.iter(|| create_and_destroy(&ctx))
    });
    let coordinator = loaded_coordinator(&pool, &stream);
    group.bench_function(
        "coordinator register+begin+complete (100k in flight)",
        |b| b.iter(|| one_operation(&coordinator, &stream)),
    );
    group.finish();
    stream.synchronize().expect("synchronize");
}

/// [`alternating`] with this bench's sample and batch counts.
fn per_call_pair(ours: impl FnMut(usize), raw: impl FnMut(usize), settle: impl FnMut()) -> Pair {
    alternating(SAMPLES, BATCH, ours, raw, settle)
}

/// Median time from the stream reaching a point to the waiter's callback for
/// an event recorded right after that point.
fn waiter_latency(stream: &Stream, waiter: &AsyncEventWaiter) -> Duration {
    let mut samples = Vec::new();
    for _ in 0..101 {
        let reached = Arc::new(Mutex::new(None::<Instant>));
        let r = Arc::clone(&reached);
        // Let the reactor back off fully before the event completes.
        stream
            .add_callback(move || {
                std::thread::sleep(Duration::from_millis(3));
                *r.lock().unwrap() = Some(Instant::now());
            })
            .expect("callback");
        let event = stream.record_event().expect("event");
        let (tx, rx) = mpsc::channel();
        waiter.wait_async(event, move || tx.send(Instant::now()).unwrap());
        let fired = rx.recv().expect("the callback runs");
        let at = reached.lock().unwrap().expect("the stream got there first");
        samples.push(fired.saturating_duration_since(at));
    }
    samples.sort();
    samples[samples.len() / 2]
}

fn ratios() {
    let (ctx, pool) = setup();
    let stream = Stream::new(&ctx).expect("a stream");

    let ours = median_ns(101, 10_000, || pool_round_trip(&pool));
    let baseline = median_ns(31, 200, || create_and_destroy(&ctx));
    compare(
        "event pool acquire+release vs cuEventCreate+cuEventDestroy",
        ours,
        baseline,
    );
    figure(
        "event pool acquire+release (target <= 60 ns on the H200)",
        ours,
        "ns",
    );
    // A capped pool keeps every free event on the shared, locked shelf: the
    // same round trip without the per-thread shelves.
    let capped = Arc::new(EventPool::with_capacity_limit(&ctx, 64, 16, 1 << 20).expect("a pool"));
    let shared_only = median_ns(101, 10_000, || pool_round_trip(&capped));
    compare(
        "event pool acquire+release: per-thread shelf vs shared shelf only (capped pool)",
        ours,
        shared_only,
    );

    // Per operation the coordinator makes one driver call (cuEventRecord of
    // the completion event); the baseline is that call alone, on a pooled
    // event, in alternating batches.
    let other = Stream::new(&ctx).expect("a stream");
    let settle = || {
        stream.synchronize().expect("synchronize");
        other.synchronize().expect("synchronize");
    };
    let coordinator = loaded_coordinator(&pool, &stream);
    let event = pool.acquire_event(false).expect("an event");
    // Whether a background thread competes with the measured one (a
    // reactor polling events takes the driver's locks too).
    let (reactor_before, started) = (thread_cpu_ns("cuda-streams-re"), Instant::now());
    let per_op = per_call_pair(
        |_| one_operation(&coordinator, &stream),
        |_| event.record(&stream).expect("record"),
        settle,
    );
    // No reactor thread (yet) counts as none spent.
    let reactor_ns = thread_cpu_ns("cuda-streams-re")
        .unwrap_or(0)
        .saturating_sub(reactor_before.unwrap_or(0));
    figure(
        "reactor CPU during the coordinator measurement (per second)",
        reactor_ns as f64 / 1e3 / started.elapsed().as_secs_f64(),
        "us",
    );
    compare(
        "coordinator operation (100k in flight) vs its cuEventRecord",
        per_op.ours,
        per_op.raw,
    );
    figure(
        "coordinator host overhead per operation, driver calls excluded (target <= 1000 ns)",
        per_op.over_raw_ns,
        "ns",
    );
    figure(
        "coordinator operation over its cuEventRecord",
        per_op.over_raw_percent,
        "%",
    );
    // With a dependency on the other stream: one more driver call
    // (cuStreamWaitEvent) on each side.
    let mut chain = Chain::new(&coordinator, &pool, [&stream, &other]);
    let chain = std::cell::RefCell::new(&mut chain);
    let per_dep_op = per_call_pair(
        |i| chain.borrow_mut().ours(i),
        |i| chain.borrow_mut().raw(i),
        settle,
    );
    compare(
        "coordinator operation with one cross-stream dependency vs its wait + record",
        per_dep_op.ours,
        per_dep_op.raw,
    );
    figure(
        "coordinator operation with one cross-stream dependency",
        per_dep_op.ours,
        "ns",
    );
    figure(
        "  ... host overhead, driver calls excluded",
        per_dep_op.over_raw_ns,
        "ns",
    );
    let m = coordinator.metrics();
    figure(
        "coordinator metrics: average coordination time (driver calls included)",
        m.average_coordination_time.as_nanos() as f64,
        "ns",
    );
    drop(event);
    settle();

    waiter_figures(&ctx, &stream);
}

/// The async waiter: its latency, and the CPU (its own thread's, and the
/// reactor's that watches for it) while idle and while a wait is pending.
/// The reactor's long parks are measured against the short back-off alone
/// (`long_park` at zero, as before they existed) in the same run.
fn waiter_figures(ctx: &Arc<Context>, stream: &Stream) {
    let waiter = AsyncEventWaiter::new();
    let reactor = ctx.reactor();
    let original = reactor.config();
    let mut short_only = original;
    short_only.long_park = Duration::ZERO;
    let latency = waiter_latency(stream, &waiter);
    reactor.set_config(short_only);
    let short_latency = waiter_latency(stream, &waiter);
    reactor.set_config(original);
    figure(
        "async waiter latency, event done -> callback (median)",
        latency.as_secs_f64() * 1e6,
        "us",
    );
    // Its 3 ms waits are shorter than 128 × max_park: no long parks, the
    // same latency.
    figure(
        "  ... with the reactor's short back-off alone (long_park 0)",
        short_latency.as_secs_f64() * 1e6,
        "us",
    );

    // Idle with nothing to wait for: the thread sleeps on a condvar.
    let window = Duration::from_secs(1);
    let before = thread_cpu_ns(WAITER_THREAD);
    std::thread::sleep(window);
    let after = thread_cpu_ns(WAITER_THREAD);
    reactor.set_config(short_only);
    let short = pending_wait(ctx, stream, &waiter, window);
    reactor.set_config(original);
    let long = pending_wait(ctx, stream, &waiter, window);
    figure(
        "async waiter polls while a wait is pending (per second)",
        long.polls as f64,
        "polls",
    );
    if let (Some(ours), Some(baseline)) = (long.reactor_cpu_ns, short.reactor_cpu_ns) {
        figure(
            "reactor CPU while the waiter's wait is pending (per second)",
            ours as f64 / 1e3,
            "us",
        );
        figure(
            "  ... with the short back-off alone (long_park 0)",
            baseline as f64 / 1e3,
            "us",
        );
        // Above 1: the long parks cost the reactor less.
        compare(
            "reactor CPU per second of a pending wait: long parks vs the short back-off alone",
            ours as f64,
            baseline as f64,
        );
    }
    figure(
        "reactor wake-ups while the waiter's wait is pending (per second)",
        long.reactor_parks as f64,
        "parks",
    );
    figure(
        "  ... with the short back-off alone (long_park 0)",
        short.reactor_parks as f64,
        "parks",
    );
    match (before, after, long.waiter_cpu_ns) {
        (Some(b), Some(a), Some(pending)) => {
            figure(
                "async waiter CPU while idle, no waits (per second)",
                (a - b) as f64 / 1e3,
                "us",
            );
            figure(
                "async waiter CPU while a wait is pending (per second)",
                pending as f64 / 1e3,
                "us",
            );
        }
        _ => println!("FIGURE async waiter CPU: not measured (no /proc/self/task/*/schedstat)"),
    }
    let m = waiter.metrics();
    figure("async waiter polls during the run", m.polls as f64, "polls");
}

/// What one wait pending for a whole window cost.
struct PendingCost {
    /// The waiter thread's CPU, ns.
    waiter_cpu_ns: Option<u64>,
    /// The reactor thread's CPU, ns.
    reactor_cpu_ns: Option<u64>,
    /// The reactor's parks, each a wake-up.
    reactor_parks: u64,
    /// The waiter's own polls.
    polls: u64,
}

/// Wait on an event the GPU holds back for the whole `window` (after a
/// first 100 ms): the reactor watches, the waiter's thread sleeps until the
/// reactor wakes it.
fn pending_wait(
    ctx: &Arc<Context>,
    stream: &Stream,
    waiter: &AsyncEventWaiter,
    window: Duration,
) -> PendingCost {
    let spin = spin_kernel(ctx);
    let one = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (1, 1, 1),
        shared_mem_bytes: 0,
    };
    let settle = Duration::from_millis(100); // past the reactor's spin
    stream
        .launch(
            &spin,
            one,
            &[((window + settle).as_nanos() as u64 + 100_000_000).into()],
        )
        .expect("spin");
    let (tx, rx) = mpsc::channel();
    waiter.wait_async(stream.record_event().expect("event"), move || {
        tx.send(()).unwrap()
    });
    std::thread::sleep(settle);
    let polls_before = waiter.metrics().polls;
    let parks_before = ctx.reactor().stats().parks;
    let (waiter_before, reactor_before) =
        (thread_cpu_ns(WAITER_THREAD), thread_cpu_ns(REACTOR_THREAD));
    std::thread::sleep(window);
    let (waiter_after, reactor_after) =
        (thread_cpu_ns(WAITER_THREAD), thread_cpu_ns(REACTOR_THREAD));
    let reactor_parks = ctx.reactor().stats().parks - parks_before;
    let polls = waiter.metrics().polls - polls_before;
    rx.recv().expect("the wait fires");
    let per_window = |b: Option<u64>, a: Option<u64>| Some(a? - b?);
    PendingCost {
        waiter_cpu_ns: per_window(waiter_before, waiter_after),
        reactor_cpu_ns: per_window(reactor_before, reactor_after),
        reactor_parks,
        polls,
    }
}

/// `EVENTS_COUNT=<scenario>:<n>`: run that scenario alone, `n` times.
fn count(spec: &str) {
    let (scenario, n) = spec
        .split_once(':')
        .unwrap_or_else(|| panic!("EVENTS_COUNT={spec:?}: expected <scenario>:<n>"));
    let n: usize = n
        .parse()
        .unwrap_or_else(|_| panic!("EVENTS_COUNT={spec:?}: {n:?} is not a count"));
    let (ctx, pool) = setup();
    let (stream, other) = (
        Stream::new(&ctx).expect("a stream"),
        Stream::new(&ctx).expect("a stream"),
    );
    let coordinator = loaded_coordinator(&pool, &stream);
    let event = pool.acquire_event(false).expect("an event");
    let mut chain = Chain::new(&coordinator, &pool, [&stream, &other]);
    let mut step = |i: usize| match scenario {
        "op" => one_operation(&coordinator, &stream),
        "record" => event.record(&stream).expect("record"),
        "dep" => chain.ours(i),
        "raw-dep" => chain.raw(i),
        _ => panic!("EVENTS_COUNT={spec:?}: unknown scenario {scenario:?}"),
    };
    counted(n, &mut step, || {
        stream.synchronize().expect("synchronize");
        other.synchronize().expect("synchronize");
    });
}

/// `n` steps in batches with a settle between them, as in the timed run.
/// Its own function, so that callgrind can count it alone
/// (`--toggle-collect='events::counted*'`), without the set-up and the
/// tear-down of 100k operations.
#[inline(never)]
fn counted(n: usize, step: &mut dyn FnMut(usize), mut settle: impl FnMut()) {
    for start in (0..n).step_by(BATCH) {
        for i in start..n.min(start + BATCH) {
            step(i);
        }
        settle();
    }
}

fn main() {
    if let Ok(spec) = std::env::var("EVENTS_COUNT") {
        return count(&spec);
    }
    if std::env::var_os("EVENTS_WAITER").is_some() {
        let (ctx, _) = setup();
        let stream = Stream::new(&ctx).expect("a stream");
        return waiter_figures(&ctx, &stream);
    }
    run_criterion(&[criterion_groups]);
    ratios();
    criterion_summary();
}
