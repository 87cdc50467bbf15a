//! The demo's operation DAG: six dependent operations over four pool
//! streams, ordered only by the event coordinator (cuStreamWaitEvent on
//! completion events), each timed by the profiler, checked every round.
//!
//! ```text
//! upload x (s0) ─┐
//!                ├─> y += 2x (s1) ─┐
//! upload y (s1) ─┘                 ├─> out = 0.5 y + 2 z (s3) ─> download out (s0)
//! z = 3 (s2) ──────────────────────┘
//! ```

use crate::demo::{DemoResult, Sizes};
use cuda_streams::kernels::{self, reference};
use cuda_streams::prelude::*;
use indicatif::ProgressBar;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

/// A small xorshift: varied, never-all-zero data for every round.
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

pub(crate) fn run(
    pool: &StreamPool,
    profiler: &StreamProfiler,
    sizes: &Sizes,
    progress: &ProgressBar,
) -> DemoResult<String> {
    let start = Instant::now();
    let n = sizes.dag_elements;
    let ctx = pool.context();
    let s: Vec<Arc<Stream>> = pool.streams().cloned().collect();
    let coordinator = OperationCoordinator::new(Arc::new(EventPool::new(ctx, 16, 0)?));
    let elementwise = Module::load(ctx, &kernels::ELEMENTWISE)?;
    let (saxpy, fill, scale_add) = (
        elementwise.function("saxpy")?,
        elementwise.function("fill_f32")?,
        elementwise.function("scale_add")?,
    );
    let cfg = LaunchConfig::for_num_elems(n.min(1 << 20) as u32);
    let len = n as u64;
    let (mut x, mut y, mut z, mut out) = (
        DeviceBuffer::<f32>::new(ctx, n)?,
        DeviceBuffer::<f32>::new(ctx, n)?,
        DeviceBuffer::<f32>::new(ctx, n)?,
        DeviceBuffer::<f32>::new(ctx, n)?,
    );
    let mut host_x = PinnedBuffer::<f32>::new(ctx, n)?;
    let mut host_y = PinnedBuffer::<f32>::new(ctx, n)?;
    let mut host_out = PinnedBuffer::<f32>::new(ctx, n)?;
    let callbacks = Arc::new(AtomicUsize::new(0));

    for round in 0..sizes.dag_rounds {
        let (xs, ys) = (data(2 * round as u64 + 1, n), data(2 * round as u64 + 2, n));
        host_x.as_mut_slice()?.copy_from_slice(&xs);
        host_y.as_mut_slice()?.copy_from_slice(&ys);

        let register = |ty, stream: &Arc<Stream>, deps, name: &str| {
            coordinator.register_operation(ty, EventPriority::Normal, stream, deps, name)
        };
        let up_x = register(OperationType::MemoryTransfer, &s[0], vec![], "upload x")?;
        let up_y = register(OperationType::MemoryTransfer, &s[1], vec![], "upload y")?;
        let axpy = register(OperationType::Kernel, &s[1], vec![up_x, up_y], "y += 2x")?;
        let fill_z = register(OperationType::Kernel, &s[2], vec![], "z = 3")?;
        let join = register(
            OperationType::Kernel,
            &s[3],
            vec![axpy, fill_z],
            "out = 0.5y + 2z",
        )?;
        let down = register(
            OperationType::MemoryTransfer,
            &s[0],
            vec![join],
            "download out",
        )?;
        if !coordinator.detect_deadlocks().is_empty() {
            return Err(format!(
                "round {round}: the coordinator found a deadlock in an acyclic plan"
            )
            .into());
        }
        let counter = Arc::clone(&callbacks);
        coordinator.add_completion_callback(down, move || {
            counter.fetch_add(1, Ordering::Relaxed);
        })?;

        // Each operation: begin (the stream waits for its dependencies'
        // events), its GPU work inside a profiler scope, complete.
        macro_rules! operation {
            ($id:expr, $stream:expr, $name:literal, $work:expr) => {{
                coordinator.begin_operation($id, $stream)?;
                profiler.time($stream, concat!("dag ", $name), $work)??;
                coordinator.complete_operation($id)?;
            }};
        }
        operation!(up_x, &s[0], "upload x", |st| st
            .copy_from_host_async(&mut x, &host_x));
        operation!(up_y, &s[1], "upload y", |st| st
            .copy_from_host_async(&mut y, &host_y));
        operation!(axpy, &s[1], "saxpy", |st| st.launch(
            &saxpy,
            cfg,
            &[len.into(), 2.0f32.into(), (&x).into(), (&mut y).into()]
        ));
        operation!(fill_z, &s[2], "fill", |st| st.launch(
            &fill,
            cfg,
            &[len.into(), 3.0f32.into(), (&mut z).into()]
        ));
        let join_args = [
            len.into(),
            0.5f32.into(),
            (&y).into(),
            2.0f32.into(),
            (&z).into(),
            (&mut out).into(),
        ];
        operation!(join, &s[3], "scale_add", |st| st
            .launch(&scale_add, cfg, &join_args));
        operation!(down, &s[0], "download", |st| st
            .copy_to_host_async(&mut host_out, &out));

        // The download is last in the plan: once it is done, all six are.
        let mut expected_y = ys;
        reference::saxpy(2.0, &xs, &mut expected_y);
        let mut expected = vec![0.0; n];
        reference::scale_add(0.5, &expected_y, 2.0, &vec![3.0; n], &mut expected);
        let got = host_out.as_slice()?;
        if let Some(i) = (0..n).find(|&i| got[i] != expected[i]) {
            return Err(format!(
                "DAG round {round}: element {i} is {}, expected {}",
                got[i], expected[i]
            )
            .into());
        }
        progress.inc(1);
    }
    for stream in &s {
        stream.synchronize()?;
    }
    coordinator.retire_completed();
    let metrics = coordinator.metrics();
    let fired = callbacks.load(Ordering::Relaxed);
    if fired != sizes.dag_rounds {
        return Err(format!("{fired} of {} completion callbacks ran", sizes.dag_rounds).into());
    }
    Ok(format!(
        "operation DAG: {} rounds x 6 operations on 4 pool streams, {} completed, every round verified, {fired} completion callbacks at GPU time, {:.1} µs host time per operation, {:.3} s",
        sizes.dag_rounds,
        metrics.completed_operations,
        metrics.average_coordination_time.as_secs_f64() * 1e6,
        start.elapsed().as_secs_f64()
    ))
}
