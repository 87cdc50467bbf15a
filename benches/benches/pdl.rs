//! Programmatic dependent launch (PDL): a chain of `CHAIN` dependent
//! kernels (`chain_step_f32` over 64Ki floats, `a -> b -> a ...`, 256 blocks
//! of 256 threads: `frontier.cu`'s shape), plain and PDL, eager and in a
//! graph, ours against the raw calls in the same run:
//!
//! - eager ours: the typed launcher's `launch` / `launch_programmatic`;
//! - eager raw: `cuLaunchKernelEx` without / with
//!   `CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`, and for PDL
//!   the same inside our enqueue gate (what the gate alone costs);
//! - graph ours: `Capture::launch` / `Capture::launch_programmatic`, one
//!   `GraphExec::launch`;
//! - graph raw: the same launches captured with `cuStreamBeginCapture`, one
//!   `cuGraphLaunch`.
//!
//! Printed per kernel (FIGURE), with RATIO lines: ours against raw for each
//! of the four (goal: PDL at most raw + 5% per kernel, eager and in a
//! graph), and, to decide where PDL pays, plain against PDL for ours.
//!
//! The eager cases of one mode (ours, raw, and for plain chains raw
//! `cuLaunchKernel`) run in turn within each round rather than one case's
//! runs after another's: an H100 run timed raw `cuLaunchKernelEx` 10%
//! faster than raw `cuLaunchKernel` when each ran in its own block, which
//! order alone may explain.
//!
//! On the software driver the kernels are CPU twins and PDL is ordinary
//! stream order, so only the host-side figures mean anything there (and the
//! chain is shorter).

use driver::{
    Context, DeclaredKernel, DeviceBuffer, DeviceMemory, GraphArg, LaunchConfig, Module, Stream,
};
use kernels::ChainStepF32;
use std::borrow::Borrow;
use std::ffi::c_void;
use std::sync::Arc;
use std::time::{Duration, Instant};
use sys::{CUlaunchAttribute, CUlaunchAttributeID, CUlaunchConfig, CUresult, CUstreamCaptureMode};

/// Timed runs of each case: a multiple of the eager rounds' three cases,
/// so that each case takes each place in a round equally often.
const RUNS: usize = 9;

fn ok(code: CUresult) {
    assert_eq!(code, CUresult::CUDA_SUCCESS, "a raw driver call failed");
}

/// The chain's shape.
struct Chain {
    n: usize,
    kernels: usize,
    cfg: LaunchConfig,
}

/// Two buffers of `n` floats: step `k` reads one and writes the other.
struct Pair<B> {
    a: B,
    b: B,
}

impl<B> Pair<B> {
    /// The buffers of step `k`: read, written.
    fn step(&mut self, k: usize) -> (&B, &mut B) {
        if k.is_multiple_of(2) {
            (&self.a, &mut self.b)
        } else {
            (&self.b, &mut self.a)
        }
    }

    /// Their device pointers for step `k`: read, written.
    fn pointers(&mut self, k: usize) -> (sys::CUdeviceptr, sys::CUdeviceptr)
    where
        B: Borrow<DeviceBuffer<f32>>,
    {
        let (from, to) = self.step(k);
        (from.borrow().device_ptr(), (*to).borrow().device_ptr())
    }
}

/// The pair each case runs on: the eager cases lend buffers mutably, the
/// graphs keep them by `Arc`.
type EagerPair = Pair<DeviceBuffer<f32>>;
type GraphPair = Pair<Arc<DeviceBuffer<f32>>>;

/// The median of `RUNS` calls of `f` (after one warm-up), per kernel, in ns.
fn per_kernel(chain: &Chain, mut f: impl FnMut()) -> f64 {
    f();
    let mut times: Vec<Duration> = (0..RUNS)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed()
        })
        .collect();
    times.sort();
    times[RUNS / 2].as_nanos() as f64 / chain.kernels as f64
}

/// One eager chain on the pair: the chain's launches, then a sync.
type EagerChain<'a> = &'a mut dyn FnMut(&mut EagerPair);

/// Each of `cases` run on `pair` once to warm up, then `RUNS` rounds in
/// which every case runs once, in turn: drift over the run (clocks, the
/// driver's caches) falls on every case alike, where timing one case's
/// runs after another's would hand it to whichever ran later. Each round
/// starts one case further on, so that no case always runs first, or
/// always after the same other one. The median per case, per kernel, in
/// ns.
fn interleaved_per_kernel(
    chain: &Chain,
    pair: &mut EagerPair,
    cases: &mut [EagerChain<'_>],
) -> Vec<f64> {
    for case in cases.iter_mut() {
        case(pair);
    }
    let mut times = vec![Vec::with_capacity(RUNS); cases.len()];
    let n = cases.len();
    for round in 0..RUNS {
        for at in (0..n).map(|j| (round + j) % n) {
            let start = Instant::now();
            cases[at](pair);
            times[at].push(start.elapsed());
        }
    }
    times
        .into_iter()
        .map(|mut samples| {
            samples.sort();
            samples[RUNS / 2].as_nanos() as f64 / chain.kernels as f64
        })
        .collect()
}

/// Ours, eager: `kernels` typed launches, then a sync.
fn eager_ours(
    stream: &Stream,
    step: &ChainStepF32,
    chain: &Chain,
    pair: &mut EagerPair,
    pdl: bool,
) {
    for k in 0..chain.kernels {
        let (from, to) = pair.step(k);
        let n = chain.n as u64;
        if pdl {
            step.launch_programmatic(stream, chain.cfg, n, from, to)
        } else {
            step.launch(stream, chain.cfg, n, from, to)
        }
        .expect("a launch");
    }
    stream.synchronize().expect("sync");
}

/// One raw `cuLaunchKernelEx` of step `k` on `stream`.
///
/// # Safety
/// `stream` is a live stream of the kernel's context, current here.
/// `x` and `y` are live buffers of `chain.n` floats.
unsafe fn raw_launch(
    d: &sys::Driver,
    stream: sys::CUstream,
    step: &ChainStepF32,
    chain: &Chain,
    (x, y): (sys::CUdeviceptr, sys::CUdeviceptr),
    pdl: bool,
) {
    let (mut n, mut x, mut y) = (chain.n as u64, x, y);
    let mut args = [
        (&raw mut n).cast::<c_void>(),
        (&raw mut x).cast(),
        (&raw mut y).cast(),
    ];
    let mut attr = CUlaunchAttribute {
        id: CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
        ..Default::default()
    };
    attr.value.programmaticStreamSerializationAllowed = 1;
    let config = CUlaunchConfig {
        gridDimX: chain.cfg.grid_dim.0,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: chain.cfg.block_dim.0,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: 0,
        hStream: stream,
        attrs: &mut attr,
        numAttrs: u32::from(pdl),
    };
    // SAFETY: chain_step_f32(u64 n, const f32* x, f32* y) with x and y of n
    // floats, alive for the chain; the caller's stream.
    ok(unsafe {
        (d.cuLaunchKernelEx)(
            &config,
            step.kernel().as_raw(),
            args.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    });
}

/// Raw, eager: `kernels` `cuLaunchKernelEx`, then a sync.
fn eager_raw(stream: &Stream, step: &ChainStepF32, chain: &Chain, pair: &mut EagerPair, pdl: bool) {
    let d = stream.context().driver();
    for k in 0..chain.kernels {
        let pointers = pair.pointers(k);
        // SAFETY: a live stream of the current context; the pair's
        // buffers hold `n` floats and outlive the chain.
        unsafe { raw_launch(d, stream.as_raw(), step, chain, pointers, pdl) };
    }
    // SAFETY: a live stream.
    ok(unsafe { (d.cuStreamSynchronize)(stream.as_raw()) });
}

/// Raw, eager, PDL, each launch inside our enqueue gate
/// ([`Stream::enqueue_gate`]: the capture check, and the latest-mark count
/// when it goes): how much of the gap between ours and raw the gate's
/// atomics make, against the checks and bookkeeping of the rest.
fn eager_raw_gated(stream: &Stream, step: &ChainStepF32, chain: &Chain, pair: &mut EagerPair) {
    let d = stream.context().driver();
    for k in 0..chain.kernels {
        let pointers = pair.pointers(k);
        let _gate = stream.enqueue_gate("a raw launch").expect("the gate");
        // SAFETY: as in `eager_raw`; the gate only holds captures off.
        unsafe { raw_launch(d, stream.as_raw(), step, chain, pointers, true) };
    }
    // SAFETY: a live stream.
    ok(unsafe { (d.cuStreamSynchronize)(stream.as_raw()) });
}

/// Raw, eager, plain, through `cuLaunchKernel` (the call our plain
/// launches make) instead of `cuLaunchKernelEx`: tells whether a gap
/// between our plain chain and the raw one is the entry point's or ours.
fn eager_raw_launch_kernel(
    stream: &Stream,
    step: &ChainStepF32,
    chain: &Chain,
    pair: &mut EagerPair,
) {
    let d = stream.context().driver();
    for k in 0..chain.kernels {
        let (mut x, mut y) = pair.pointers(k);
        let mut n = chain.n as u64;
        let mut args = [
            (&raw mut n).cast::<c_void>(),
            (&raw mut x).cast(),
            (&raw mut y).cast(),
        ];
        // SAFETY: chain_step_f32(u64 n, const f32* x, f32* y) with x
        // and y of n floats, alive for the chain; a live stream of the
        // current context.
        ok(unsafe {
            (d.cuLaunchKernel)(
                step.kernel().as_raw(),
                chain.cfg.grid_dim.0,
                1,
                1,
                chain.cfg.block_dim.0,
                1,
                1,
                0,
                stream.as_raw(),
                args.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        });
    }
    // SAFETY: a live stream.
    ok(unsafe { (d.cuStreamSynchronize)(stream.as_raw()) });
}

/// Ours, in a graph: the chain captured once, one replay per run.
fn graph_ours(
    stream: &Arc<Stream>,
    step: &ChainStepF32,
    chain: &Chain,
    pair: &mut GraphPair,
    pdl: bool,
) -> f64 {
    let mut capture = stream.begin_capture().expect("a capture");
    for k in 0..chain.kernels {
        let (from, to) = pair.step(k);
        let args = [
            GraphArg::from(chain.n as u64),
            GraphArg::read(from),
            GraphArg::write(to),
        ];
        if pdl {
            capture.launch_programmatic(stream, step.kernel(), chain.cfg, &args)
        } else {
            capture.launch(stream, step.kernel(), chain.cfg, &args)
        }
        .expect("a captured launch");
    }
    let exec = capture
        .end()
        .expect("a graph")
        .instantiate()
        .expect("an exec");
    per_kernel(chain, || {
        exec.launch(stream).expect("a replay");
        stream.synchronize().expect("sync");
    })
}

/// Raw, in a graph: the same launches captured with the table's calls.
fn graph_raw(
    ctx: &Arc<Context>,
    step: &ChainStepF32,
    chain: &Chain,
    pair: &mut GraphPair,
    pdl: bool,
) -> f64 {
    let d = ctx.driver();
    let side = Stream::new(ctx).expect("a stream");
    let (mut graph, mut exec) = (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: a live stream of the current context, captured and ended
    // here; valid out-pointers.
    unsafe {
        ok((d.cuStreamBeginCapture)(
            side.as_raw(),
            CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
        ));
        for k in 0..chain.kernels {
            raw_launch(d, side.as_raw(), step, chain, pair.pointers(k), pdl);
        }
        ok((d.cuStreamEndCapture)(side.as_raw(), &mut graph));
        ok((d.cuGraphInstantiate)(&mut exec, graph, 0));
    }
    let t = per_kernel(chain, || {
        // SAFETY: a live executable graph and stream; the buffers outlive
        // the replays (synchronized before they are dropped).
        unsafe {
            ok((d.cuGraphLaunch)(exec, side.as_raw()));
            ok((d.cuStreamSynchronize)(side.as_raw()));
        }
    });
    // SAFETY: destroyed once; nothing runs any more.
    unsafe {
        ok((d.cuGraphExecDestroy)(exec));
        ok((d.cuGraphDestroy)(graph));
    }
    t
}

fn main() {
    let ctx = Context::new(0).expect("a context");
    let stream = Stream::new(&ctx).expect("a stream");
    let step: ChainStepF32 = Module::load(&ctx, &kernels::ELEMENTWISE)
        .expect("the elementwise image")
        .kernel()
        .expect("chain_step_f32");
    let (major, minor) = ctx.info().compute_capability;
    if major < 9 {
        println!("SKIP pdl: device 0 has compute capability {major}.{minor}; PDL needs 9.0");
        return;
    }
    let gpu = ctx.is_gpu();
    let (n, kernels) = if gpu {
        (1 << 16, 2_000)
    } else {
        (1 << 10, 200)
    };
    let chain = Chain {
        n,
        kernels,
        cfg: LaunchConfig::for_num_elems(n as u32),
    };
    let zeros = || DeviceBuffer::from_slice(&stream, &vec![0.0f32; n]).expect("a buffer");
    let mut eager_pair = Pair {
        a: zeros(),
        b: zeros(),
    };
    let mut graph_pair = Pair {
        a: Arc::new(zeros()),
        b: Arc::new(zeros()),
    };
    stream.synchronize().expect("sync");
    let mut results = Vec::new();
    for pdl in [false, true] {
        let mode = if pdl { "pdl" } else { "plain" };
        // Plain chains also run through `cuLaunchKernel` (the call our
        // plain launches make), in the same rounds.
        let mut ours = |p: &mut EagerPair| eager_ours(&stream, &step, &chain, p, pdl);
        let mut raw = |p: &mut EagerPair| eager_raw(&stream, &step, &chain, p, pdl);
        let mut via = |p: &mut EagerPair| eager_raw_launch_kernel(&stream, &step, &chain, p);
        let mut gated = |p: &mut EagerPair| eager_raw_gated(&stream, &step, &chain, p);
        let times = if pdl {
            interleaved_per_kernel(
                &chain,
                &mut eager_pair,
                &mut [&mut ours, &mut raw, &mut gated],
            )
        } else {
            interleaved_per_kernel(
                &chain,
                &mut eager_pair,
                &mut [&mut ours, &mut raw, &mut via],
            )
        };
        let eager = (times[0], times[1]);
        let graph = (
            graph_ours(&stream, &step, &chain, &mut graph_pair, pdl),
            graph_raw(&ctx, &step, &chain, &mut graph_pair, pdl),
        );
        for (case, (ours, raw)) in [("eager", eager), ("graph", graph)] {
            let name = format!("pdl/{case}_{mode}_chain_of_{kernels}");
            figure(&format!("{name}_ours"), ours / 1e3, "us/kernel");
            figure(&format!("{name}_raw"), raw / 1e3, "us/kernel");
            compare(&format!("{name}_ours_vs_raw"), ours, raw);
        }
        results.push((eager.0, graph.0));
        if let (true, Some(&gated)) = (pdl, times.get(2)) {
            let name = format!("pdl/eager_pdl_chain_of_{kernels}");
            figure(&format!("{name}_raw_in_our_gate"), gated / 1e3, "us/kernel");
            compare(&format!("{name}_raw_in_our_gate_vs_raw"), gated, eager.1);
            compare(&format!("{name}_ours_vs_raw_in_our_gate"), eager.0, gated);
        }
        if let (false, Some(&via)) = (pdl, times.get(2)) {
            let name = format!("pdl/eager_plain_chain_of_{kernels}");
            figure(
                &format!("{name}_raw_cuLaunchKernel"),
                via / 1e3,
                "us/kernel",
            );
            compare(&format!("{name}_ours_vs_raw_cuLaunchKernel"), eager.0, via);
        }
    }
    let (plain, pdl) = (results[0], results[1]);
    compare("pdl/eager_pdl_vs_plain_ours", pdl.0, plain.0);
    compare("pdl/graph_pdl_vs_plain_ours", pdl.1, plain.1);
    // Every step adds one to what the step before it wrote, whichever way
    // it ran: `a` holds the number of steps run on its pair (2 modes, ours
    // and raw, `RUNS` + 1 chains each, and for the eager pair the plain
    // chains through `cuLaunchKernel` and the PDL chains inside our gate)
    // only if every chain stayed ordered.
    let chains = |sets: usize| (sets * (RUNS + 1) * kernels) as f32;
    for (name, a, steps) in [
        ("eager", &eager_pair.a, chains(6)),
        ("graph", &*graph_pair.a, chains(4)),
    ] {
        let a = a.to_vec(&stream).expect("read a");
        assert!(
            a.iter().all(|&v| v == steps),
            "the {name} chains lost their order: a[0] = {}, expected {steps}",
            a[0]
        );
    }
}

/// `FIGURE` and `RATIO` lines, as `cuda_streams_benches` prints them, for
/// names made at run time.
fn figure(name: &str, value: f64, unit: &str) {
    cuda_streams_benches::figure(name, value, unit);
}

fn compare(name: &str, ours_ns: f64, baseline_ns: f64) {
    println!(
        "RATIO {name}: ours {ours_ns:.1} ns, baseline {baseline_ns:.1} ns, {:.2}x",
        baseline_ns / ours_ns
    );
}
