//! Launch cost: the declared kernel's typed launcher (`kernel!`), the
//! checked `Stream::launch` and the `unsafe` `Stream::launch_unchecked` of
//! the same kernel and arguments (same tracking, no signature check), and a
//! raw `cuLaunchKernel` from the table, in the same run.
//!
//! The kernel is `fill_f32` over 256 elements: one pointer parameter whose
//! extent is checked, two scalars. Launches go in batches of 256 with the
//! stream drained after each batch (outside the timing), so the GPU's launch
//! queue never fills and blocks the host. Each overhead comes from
//! [`alternating`]: the batches of the two sides alternate, and the FIGURE
//! is the median over pairs of neighbouring batches of one minus the other,
//! so a change of the host's state during the run (the GPU hosts move
//! between states up to 1.7 times apart) moves both sides of each pair alike.
//!
//! `LAUNCH_COUNT=<side>:<n>` (`declared`, `checked`, `unchecked` or `raw`)
//! runs `n` launches of that side and nothing else, for counting
//! instructions under callgrind: two counts with different `n`, subtracted,
//! give the cost per launch without the set-up. `LAUNCH_ORDERING` sets the
//! context's order policy for it (default: the context's own, `off` on a
//! GPU, `check` on the software driver, which refuses `off`).

use criterion::Criterion;
use cuda_streams_benches::{
    Pair, alternating_on, compare, criterion_summary, figure, median_ns, run_criterion,
};
use driver::{
    Context, DeviceBuffer, DeviceMemory, Kernel, LaunchConfig, Module, OrderPolicy, Stream,
};
use kernels::FillF32;
use std::ffi::c_void;
use std::hint::black_box;
use std::sync::Arc;

const ELEMENTS: usize = 256;
const BATCH: usize = 256;
const SAMPLES: usize = 400;

struct Setup {
    stream: Arc<Stream>,
    declared: FillF32,
    fill: Kernel,
    out: DeviceBuffer<f32>,
    cfg: LaunchConfig,
}

fn setup() -> Setup {
    let ctx = Context::new(0).expect("a context");
    let stream = Stream::new(&ctx).expect("a stream");
    let module = Module::load(&ctx, &kernels::ELEMENTWISE).expect("the image loads");
    let declared: FillF32 = module.kernel().expect("the image declares fill_f32");
    let fill = module.function("fill_f32").expect("fill_f32");
    let out = DeviceBuffer::<f32>::new_async(&stream, ELEMENTS).expect("a buffer");
    Setup {
        stream,
        declared,
        fill,
        out,
        cfg: LaunchConfig::for_num_elems(ELEMENTS as u32),
    }
}

#[inline(never)] // its own symbol, for callgrind
fn declared(s: &mut Setup) {
    s.declared
        .launch(
            &s.stream,
            s.cfg,
            ELEMENTS as u64,
            black_box(1.5f32),
            &mut s.out,
        )
        .expect("launch");
}

#[inline(never)] // its own symbol, for callgrind
fn checked(s: &mut Setup) {
    let args = [
        (ELEMENTS as u64).into(),
        black_box(1.5f32).into(),
        (&mut s.out).into(),
    ];
    s.stream.launch(&s.fill, s.cfg, &args).expect("launch");
}

#[inline(never)] // its own symbol, for callgrind
fn unchecked(s: &mut Setup) {
    let args = [
        (ELEMENTS as u64).into(),
        black_box(1.5f32).into(),
        (&mut s.out).into(),
    ];
    // SAFETY: fill_f32(u64 n, f32 value, f32* out) with n = the buffer's length.
    unsafe { s.stream.launch_unchecked(&s.fill, s.cfg, &args) }.expect("launch");
}

#[inline(never)] // its own symbol, for callgrind
fn raw(s: &mut Setup) {
    let ctx = s.stream.context();
    let mut n = ELEMENTS as u64;
    let mut value = black_box(1.5f32);
    let mut ptr = s.out.device_ptr();
    let mut params: [*mut c_void; 3] = [
        (&raw mut n).cast(),
        (&raw mut value).cast(),
        (&raw mut ptr).cast(),
    ];
    let (g, b) = (s.cfg.grid_dim, s.cfg.block_dim);
    // SAFETY: the same arguments as above; the buffer outlives the batch,
    // which is drained before it is dropped.
    let code = unsafe {
        (ctx.driver().cuLaunchKernel)(
            s.fill.as_raw(),
            g.0,
            g.1,
            g.2,
            b.0,
            b.1,
            b.2,
            0,
            s.stream.as_raw(),
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    };
    code.result().expect("raw launch");
}

/// One way of launching the same kernel and arguments.
type Side = fn(&mut Setup);

/// Ns per launch of `ours` and of `base`, in alternating batches with the
/// stream drained after each.
fn pair(s: &mut Setup, ours: Side, base: Side) -> Pair {
    alternating_on(s, SAMPLES, BATCH, ours, base, |s| {
        s.stream.synchronize().expect("drain")
    })
}

fn criterion_groups(c: &mut Criterion) {
    let mut s = setup();
    let mut group = c.benchmark_group("launch fill_f32");
    let sides: [(&str, Side); 3] = [
        ("declared", declared),
        ("checked", checked),
        ("unchecked", unchecked),
    ];
    for (name, side) in sides {
        group.bench_function(name, |b| {
            b.iter(|| side(&mut s));
            s.stream.synchronize().expect("drain");
        });
    }
    group.finish();
}

fn ratios() {
    let mut s = setup();
    let d = pair(&mut s, declared, unchecked);
    compare(
        "declared launch, kernels image vs launch_unchecked",
        d.ours,
        d.raw,
    );
    figure(
        "declared launch overhead, kernels image (goal <= 30 ns)",
        d.over_raw_ns,
        "ns",
    );
    let c = pair(&mut s, checked, unchecked);
    compare("checked launch vs unchecked launch", c.ours, c.raw);
    figure(
        "checked launch: signature check cost (checked - unchecked)",
        c.over_raw_ns,
        "ns",
    );
    let r = pair(&mut s, checked, raw);
    compare("checked launch vs raw cuLaunchKernel", r.ours, r.raw);
    // The check itself, with no driver call around it.
    let check_ns = median_ns(200, 1000, || {
        let args = [
            (ELEMENTS as u64).into(),
            black_box(1.5f32).into(),
            (&mut s.out).into(),
        ];
        s.fill.check_args(black_box(&args)).expect("checked");
    });
    figure("checked launch: signature check alone", check_ns, "ns");
}

/// `LAUNCH_COUNT=<side>:<n>`: `n` launches of that side, drained every
/// batch, and nothing else.
fn count(spec: &str) {
    let fail = |why: &str| -> ! { panic!("LAUNCH_COUNT={spec:?}: {why}") };
    let (side, n) = spec
        .split_once(':')
        .unwrap_or_else(|| fail("expected <side>:<n>"));
    let n: usize = n.parse().unwrap_or_else(|_| fail("the count is no number"));
    let side: Side = match side {
        "declared" => declared,
        "checked" => checked,
        "unchecked" => unchecked,
        "raw" => raw,
        _ => fail("the side is declared, checked, unchecked or raw"),
    };
    let mut s = setup();
    if let Ok(policy) = std::env::var("LAUNCH_ORDERING") {
        let policy = OrderPolicy::parse(&policy).unwrap_or_else(|e| fail(&e));
        let set = s.stream.context().set_ordering(policy);
        set.unwrap_or_else(|e| fail(&e.to_string()));
    }
    for i in 0..n {
        side(&mut s);
        if i % BATCH == BATCH - 1 {
            s.stream.synchronize().expect("drain");
        }
    }
    s.stream.synchronize().expect("drain");
}

fn main() {
    if let Ok(spec) = std::env::var("LAUNCH_COUNT") {
        count(&spec);
        return;
    }
    run_criterion(&[criterion_groups]);
    ratios();
    criterion_summary();
}
