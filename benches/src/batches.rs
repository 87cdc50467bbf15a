//! Timing enqueues in batches between synchronisations, for the benches
//! whose work runs on several streams (the multi-GPU ones).

use driver::Stream;
use std::time::Instant;

/// Seconds per call of `ours` and of `baseline`: batches of `reps` calls
/// between synchronisations of every stream in `streams`, the two sides'
/// batches alternating (`rounds` of each, the best of each kept), so that a
/// drift of the machine during the run moves both sides alike. One untimed
/// call of each first (lazy set-up: NCCL channels, peer access, first uses).
pub fn per_call_pair(
    streams: &[&Stream],
    reps: usize,
    rounds: usize,
    mut ours: impl FnMut(),
    mut baseline: impl FnMut(),
) -> (f64, f64) {
    let sync = || Stream::synchronize_all(streams).expect("synchronize");
    ours();
    baseline();
    sync();
    let batch = |enqueue: &mut dyn FnMut()| {
        let start = Instant::now();
        for _ in 0..reps {
            enqueue();
        }
        sync();
        start.elapsed().as_secs_f64() / reps as f64
    };
    (0..rounds).fold((f64::INFINITY, f64::INFINITY), |(o, b), _| {
        (o.min(batch(&mut ours)), b.min(batch(&mut baseline)))
    })
}

/// Calls per batch: 1000 for small messages (latency), about 4 GiB moved
/// for large ones, at least 3.
pub fn reps_for(bytes: usize) -> usize {
    if bytes <= 64 << 10 {
        1000
    } else {
        ((4usize << 30) / bytes).clamp(3, 1000)
    }
}
