//! Event coordination: pooled events against `cuEventCreate` + `cuEventDestroy`;
//! the coordinator's host overhead per operation with 100k operations in
//! flight, against the driver calls it makes; the async waiter's latency
//! (event done -> callback) and its CPU time while idle.

use criterion::Criterion;
use cuda_streams_benches::{
    compare, criterion_summary, figure, median_ns, run_criterion, spin_kernel, thread_cpu_ns,
};
use driver::{Context, Event, LaunchConfig, Stream};
use events::{AsyncEventWaiter, EventPool, EventPriority, OperationCoordinator, OperationType};
use std::hint::black_box;
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

/// Operations registered and left waiting, so the maps are realistically full.
const IN_FLIGHT: usize = 100_000;

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

/// Median time from the stream reaching a point to the waiter's callback for
/// an event recorded right after that point.
fn waiter_latency(stream: &Stream, waiter: &AsyncEventWaiter) -> Duration {
    let mut samples = Vec::new();
    for _ in 0..101 {
        let reached = Arc::new(Mutex::new(None::<Instant>));
        let r = Arc::clone(&reached);
        // Let the waiter back off fully before the event completes.
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
    // the completion event); the baseline is that call alone, on a pooled event.
    let coordinator = loaded_coordinator(&pool, &stream);
    let event = pool.acquire_event(false).expect("an event");
    let record = median_ns(51, 1_000, || event.record(&stream).expect("record"));
    let per_op = median_ns(51, 1_000, || one_operation(&coordinator, &stream));
    compare(
        "coordinator operation (100k in flight) vs its cuEventRecord",
        per_op,
        record,
    );
    figure(
        "coordinator host overhead per operation, driver calls excluded (target <= 1000 ns)",
        (per_op - record).max(0.0),
        "ns",
    );
    // With a dependency on another stream: one more driver call (cuStreamWaitEvent).
    let other = Stream::new(&ctx).expect("a stream");
    let mut previous = None;
    let mut chained = || {
        let on = if previous.is_some() { &stream } else { &other };
        let id = coordinator
            .register_operation(
                OperationType::Kernel,
                EventPriority::Normal,
                on,
                previous.take().into_iter().collect(),
                "chained",
            )
            .expect("register");
        coordinator.begin_operation(id, on).expect("begin");
        coordinator.complete_operation(id).expect("complete");
        previous = Some(id);
    };
    let wait = median_ns(51, 1_000, || other.wait_event(&event).expect("wait"));
    let per_dep_op = median_ns(51, 1_000, &mut chained);
    figure(
        "coordinator operation with one cross-stream dependency",
        per_dep_op,
        "ns",
    );
    figure(
        "  ... host overhead, driver calls excluded",
        (per_dep_op - record - wait / 2.0).max(0.0),
        "ns",
    );
    let m = coordinator.metrics();
    figure(
        "coordinator metrics: average coordination time (driver calls included)",
        m.average_coordination_time.as_nanos() as f64,
        "ns",
    );
    drop(event);
    stream.synchronize().expect("synchronize");
    other.synchronize().expect("synchronize");

    let waiter = AsyncEventWaiter::new();
    let latency = waiter_latency(&stream, &waiter);
    figure(
        "async waiter latency, event done -> callback (median)",
        latency.as_secs_f64() * 1e6,
        "us",
    );

    // Idle with nothing to wait for: the thread sleeps on a condvar.
    let window = Duration::from_secs(1);
    let name = "cuda-streams-ev"; // thread names are cut to 15 bytes
    let before = thread_cpu_ns(name);
    std::thread::sleep(window);
    let after = thread_cpu_ns(name);
    // Waiting on an event the GPU holds back for the whole window (back-off polling).
    let spin = spin_kernel(&ctx);
    let one = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (1, 1, 1),
        shared_mem_bytes: 0,
    };
    stream
        .launch(
            &spin,
            one,
            &[(window.as_nanos() as u64 + 200_000_000).into()],
        )
        .expect("spin");
    let (tx, rx) = mpsc::channel();
    waiter.wait_async(stream.record_event().expect("event"), move || {
        tx.send(()).unwrap()
    });
    std::thread::sleep(Duration::from_millis(100)); // past the quick polls
    let pending_before = thread_cpu_ns(name);
    std::thread::sleep(window);
    let pending_after = thread_cpu_ns(name);
    rx.recv().expect("the wait fires");
    match (before, after, pending_before, pending_after) {
        (Some(b), Some(a), Some(pb), Some(pa)) => {
            figure(
                "async waiter CPU while idle, no waits (per second)",
                (a - b) as f64 / 1e3,
                "us",
            );
            figure(
                "async waiter CPU while a wait is pending (per second)",
                (pa - pb) as f64 / 1e3,
                "us",
            );
        }
        _ => println!("FIGURE async waiter CPU: not measured (no /proc/self/task/*/schedstat)"),
    }
    let m = waiter.metrics();
    figure("async waiter polls during the run", m.polls as f64, "polls");
}

fn main() {
    run_criterion(&[criterion_groups]);
    ratios();
    criterion_summary();
}
