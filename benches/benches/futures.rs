//! How soon the host learns that GPU work ended, and what it costs to wait.
//!
//! Each round launches a 200 µs `spin` kernel and times, from the launch,
//! how long until the waiting thread knows it ended. The floor is busy
//! polling `cuEventQuery` (the soonest the host can know, one core spinning);
//! every other mode is reported as its median *beyond* that floor, measured
//! in the same run, together with the CPU the process used per second of
//! waiting (`getrusage`, all threads: the reactor's and the driver's).
//!
//! Modes: busy polling; a blocking-sync event (`CU_EVENT_BLOCKING_SYNC` +
//! `cuEventSynchronize`); a host function (`cuLaunchHostFunc`) that unparks
//! the waiter; and the reactor's futures (`Stream::completion`) in each
//! `WakeMode`. Then the reactor's CPU with nothing pending.
//!
//! The default mode learns wait lengths per stream (`ReactorConfig::predict`),
//! which a loop of equal kernels suits best; so the default and the plain
//! back-off also run over kernels of varied length (50–400 µs, a fixed
//! pseudo-random sequence), against busy polling over the same sequence.
//!
//! On the software driver the kernel is a sleeping CPU twin and the driver's
//! threads are ordinary threads: the figures say nothing about a GPU. Run it
//! on the H200: `cargo bench -p cuda-streams-benches --bench futures` with
//! `CUDA_STREAMS_DRIVER=cuda` (or through `cargo xtask gpu-bundle`).

use criterion::Criterion;
use cuda_streams_benches::{compare, criterion_summary, figure, run_criterion, thread_cpu_ns};
use driver::{Context, Event, EventFlags, ReactorConfig, Stream, WakeMode};
use kernels::typed::Timing;
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context as TaskContext, Poll, Wake, Waker};
use std::time::{Duration, Instant};

const KERNEL: Duration = Duration::from_micros(200);

/// Rounds per mode: enough for a stable median, little GPU time (≈ 0.1 s).
fn rounds() -> usize {
    std::env::var("CUDA_STREAMS_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(400)
}

struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// A minimal executor: poll, park until woken.
fn block_on<F: Future>(f: F) -> F::Output {
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut f = pin!(f);
    loop {
        if let Poll::Ready(out) = f.as_mut().poll(&mut TaskContext::from_waker(&waker)) {
            return out;
        }
        std::thread::park();
    }
}

/// Unparks the waiting thread and notes when the reactor called the waker.
struct StampedUnpark {
    thread: std::thread::Thread,
    woken: std::sync::Mutex<Option<Instant>>,
}

impl Wake for StampedUnpark {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        let now = Instant::now();
        self.woken
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get_or_insert(now);
        self.thread.unpark();
    }
}

/// [`block_on`], returning also when the future's waker was first called:
/// the moment the reactor knew the work ended and made the future ready,
/// before the OS resumed the parked thread.
fn block_on_stamped<F: Future>(f: F) -> (F::Output, Option<Instant>) {
    let stamp = Arc::new(StampedUnpark {
        thread: std::thread::current(),
        woken: std::sync::Mutex::new(None),
    });
    let waker = Waker::from(Arc::clone(&stamp));
    let mut f = pin!(f);
    loop {
        if let Poll::Ready(out) = f.as_mut().poll(&mut TaskContext::from_waker(&waker)) {
            let woken = *stamp
                .woken
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            return (out, woken);
        }
        std::thread::park();
    }
}

/// A spinning executor: polls until ready, never parks, so the time it
/// returns is when the future became ready (no thread wake-up in between).
fn spin_on<F: Future>(f: F) -> F::Output {
    let waker = Waker::noop();
    let mut f = pin!(f);
    loop {
        if let Poll::Ready(out) = f.as_mut().poll(&mut TaskContext::from_waker(waker)) {
            return out;
        }
        std::hint::spin_loop();
    }
}

/// CPU time of the whole process so far (user + system).
fn cpu_time() -> Duration {
    // SAFETY: getrusage writes one rusage through a valid pointer.
    let usage = unsafe {
        let mut usage = std::mem::zeroed::<libc::rusage>();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// `n` kernel lengths from 50 to 400 µs, the same sequence every run.
fn varied_lengths(n: usize) -> Vec<Duration> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            Duration::from_micros(50 + x % 351)
        })
        .collect()
}

struct Measured {
    median: Duration,
    /// Median launch→waker called, where the wait reports it.
    woken: Option<Duration>,
    /// CPU seconds per second of the loop (cores busy).
    cores: f64,
}

/// Launch the kernel, then `wait`; time launch→known for each round.
/// Kernels run `lengths` in turn; every time is reported as if each kernel
/// had lasted [`KERNEL`] (its own length taken off, `KERNEL` added), so
/// medians over varied lengths compare with the fixed-length ones.
fn measure(
    stream: &Stream,
    timing: &Timing,
    lengths: &[Duration],
    mut wait: impl FnMut(),
) -> Measured {
    measure_stamped(stream, timing, lengths, || {
        wait();
        None
    })
}

/// [`measure`] for a wait that also returns when its waker was called.
fn measure_stamped(
    stream: &Stream,
    timing: &Timing,
    lengths: &[Duration],
    mut wait: impl FnMut() -> Option<Instant>,
) -> Measured {
    // Warm up (lazy initialisation, reactor thread start, caches).
    for round in 0..10 {
        timing
            .spin(stream, lengths[round % lengths.len()])
            .expect("spin launches");
        wait();
    }
    let rounds = rounds();
    let mut samples = Vec::with_capacity(rounds);
    let mut woken = Vec::with_capacity(rounds);
    let (cpu0, wall0) = (cpu_time(), Instant::now());
    for round in 0..rounds {
        let length = lengths[round % lengths.len()];
        let start = Instant::now();
        timing.spin(stream, length).expect("spin launches");
        let stamp = wait();
        samples.push(start.elapsed() + KERNEL - length);
        woken.extend(stamp.map(|at| at.duration_since(start) + KERNEL - length));
    }
    let (cpu, wall) = (cpu_time() - cpu0, wall0.elapsed());
    samples.sort();
    woken.sort();
    Measured {
        median: samples[samples.len() / 2],
        // Only when every round reported its wake (a future that was ready
        // at its first poll is never woken).
        woken: (woken.len() == samples.len()).then(|| woken[woken.len() / 2]),
        cores: cpu.as_secs_f64() / wall.as_secs_f64(),
    }
}

fn report(mode: &'static str, ratio_name: &'static str, m: &Measured, floor: &Measured) {
    let beyond = m.median.as_secs_f64() * 1e6 - floor.median.as_secs_f64() * 1e6;
    figure(
        &format!("futures wake, {mode}: latency beyond busy polling"),
        beyond,
        "us",
    );
    figure(
        &format!("futures wake, {mode}: CPU while waiting"),
        m.cores,
        "cores",
    );
    compare(
        ratio_name,
        m.median.as_nanos() as f64,
        floor.median.as_nanos() as f64,
    );
}

fn bench_completion(c: &mut Criterion) {
    let ctx = Context::new(0).expect("a context");
    let stream = Stream::new(&ctx).expect("a stream");
    c.bench_function("futures: completion of an idle stream, awaited", |b| {
        b.iter(|| block_on(stream.completion().expect("a completion")).expect("completes"))
    });
}

fn main() {
    run_criterion(&[bench_completion]);

    let ctx = Context::new(0).expect("a context");
    if !ctx.is_gpu() {
        println!(
            "note: the software driver runs the spin kernel as a sleeping CPU thread; \
             these figures say nothing about a GPU"
        );
    }
    let stream = Stream::new(&ctx).expect("a stream");
    let timing = Timing::load(&ctx).expect("the timing image loads");

    let polled = Event::new(&ctx, EventFlags::PLAIN).expect("an event");
    let fixed = [KERNEL];
    let floor = measure(&stream, &timing, &fixed, || {
        polled.record(&stream).expect("record");
        while !polled.query().expect("query") {
            std::hint::spin_loop();
        }
    });
    figure(
        "futures wake, busy polling cuEventQuery: 200 us kernel noticed after",
        floor.median.as_secs_f64() * 1e6,
        "us",
    );
    figure(
        "futures wake, busy polling cuEventQuery: CPU while waiting",
        floor.cores,
        "cores",
    );

    let blocking = Event::new(&ctx, EventFlags::PLAIN.with_blocking_sync(true)).expect("an event");
    let m = measure(&stream, &timing, &fixed, || {
        blocking.record(&stream).expect("record");
        blocking.synchronize().expect("synchronize");
    });
    report(
        "blocking-sync event",
        "futures wake: blocking-sync event vs busy polling",
        &m,
        &floor,
    );

    let m = measure(&stream, &timing, &fixed, || {
        let done = Arc::new(AtomicBool::new(false));
        let (flag, waiter) = (Arc::clone(&done), std::thread::current());
        stream
            .add_callback(move || {
                flag.store(true, Ordering::Release);
                waiter.unpark();
            })
            .expect("a host function");
        while !done.load(Ordering::Acquire) {
            std::thread::park();
        }
    });
    report(
        "cuLaunchHostFunc",
        "futures wake: cuLaunchHostFunc vs busy polling",
        &m,
        &floor,
    );

    let reactor = ctx.reactor();
    // Start the reactor's thread, so its CPU time can be read from the start.
    block_on(stream.completion().expect("a completion")).expect("completes");
    let adaptive = |spin_us: u64, min_us: u64, max_us: u64| {
        let mut config = ReactorConfig::default();
        config.spin = Duration::from_micros(spin_us);
        config.min_park = Duration::from_micros(min_us);
        config.max_park = Duration::from_micros(max_us);
        config
    };
    let backoff_only = ReactorConfig::default().with_prediction(false);
    let modes: [(ReactorConfig, &str, &str); 7] = [
        (
            ReactorConfig::default(),
            "reactor adaptive (default)",
            "futures wake: reactor adaptive (default) vs busy polling",
        ),
        (
            backoff_only,
            "reactor adaptive, no prediction",
            "futures wake: reactor adaptive, no prediction vs busy polling",
        ),
        (
            adaptive(10, 2, 8),
            "reactor adaptive, parks 2-8 us",
            "futures wake: reactor adaptive 2-8 us vs busy polling",
        ),
        (
            adaptive(10, 8, 32),
            "reactor adaptive, parks 8-32 us",
            "futures wake: reactor adaptive 8-32 us vs busy polling",
        ),
        (
            adaptive(10, 16, 64),
            "reactor adaptive, parks 16-64 us",
            "futures wake: reactor adaptive 16-64 us vs busy polling",
        ),
        (
            ReactorConfig::default().with_mode(WakeMode::Spin),
            "reactor spin",
            "futures wake: reactor spin vs busy polling",
        ),
        (
            ReactorConfig::default().with_mode(WakeMode::HostFn),
            "reactor host function",
            "futures wake: reactor host function vs busy polling",
        ),
    ];
    let varied = varied_lengths(97);
    let varied_floor = measure(&stream, &timing, &varied, || {
        polled.record(&stream).expect("record");
        while !polled.query().expect("query") {
            std::hint::spin_loop();
        }
    });
    let runs = modes
        .iter()
        .map(|&(config, name, ratio)| (config, name, Some(ratio), &fixed[..], &floor))
        .chain([
            (
                ReactorConfig::default(),
                "reactor adaptive (default), varied kernels",
                None,
                &varied[..],
                &varied_floor,
            ),
            (
                backoff_only,
                "reactor adaptive, no prediction, varied kernels",
                None,
                &varied[..],
                &varied_floor,
            ),
        ]);
    for (config, name, ratio, lengths, floor) in runs {
        reactor.set_config(config);
        // A thread that parks until woken: what an async runtime's worker
        // does; its latency includes the OS waking that thread.
        let reactor_cpu0 = thread_cpu_ns("cuda-streams-re");
        let wall0 = Instant::now();
        let m = measure_stamped(&stream, &timing, lengths, || {
            let (done, woken) = block_on_stamped(stream.completion().expect("a completion"));
            done.expect("completes");
            woken
        });
        let reactor_cores = thread_cpu_ns("cuda-streams-re")
            .zip(reactor_cpu0)
            .map(|(after, before)| (after - before) as f64 / 1e9 / wall0.elapsed().as_secs_f64());
        match ratio {
            Some(ratio) => report(name, ratio, &m, floor),
            None => figure(
                &format!("futures wake, {name}: latency beyond busy polling"),
                m.median.as_secs_f64() * 1e6 - floor.median.as_secs_f64() * 1e6,
                "us",
            ),
        }
        if let Some(woken) = m.woken {
            // The reactor's own latency: completion to the waker being
            // called (the future is ready from then on); what follows is
            // the executor's thread being resumed by the OS.
            figure(
                &format!("futures wake, {name}: waker called beyond busy polling"),
                woken.as_secs_f64() * 1e6 - floor.median.as_secs_f64() * 1e6,
                "us",
            );
        }
        if let Some(cores) = reactor_cores {
            figure(
                &format!("futures wake, {name}: reactor thread CPU while waiting"),
                cores,
                "cores",
            );
        }
        // A spinning executor: the moment the future became ready.
        let ready = measure(&stream, &timing, lengths, || {
            spin_on(stream.completion().expect("a completion")).expect("completes");
        });
        figure(
            &format!("futures wake, {name}: ready (spinning executor) beyond busy polling"),
            ready.median.as_secs_f64() * 1e6 - floor.median.as_secs_f64() * 1e6,
            "us",
        );
    }
    reactor.set_config(ReactorConfig::default());

    // Nothing pending: the reactor thread parks without a timeout.
    let (cpu0, wall0) = (cpu_time(), Instant::now());
    std::thread::sleep(Duration::from_millis(200));
    figure(
        "futures reactor, nothing pending: CPU",
        (cpu_time() - cpu0).as_secs_f64() / wall0.elapsed().as_secs_f64(),
        "cores",
    );
    criterion_summary();
}
