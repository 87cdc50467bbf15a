//! Two sides timed in alternating batches, for overheads of a few percent.
//!
//! The hosts of the GPU machines run in states up to 1.7 times apart, and
//! move between them during a run. Measured one after the other, two sides
//! can land in different states, and a difference of a hundred nanoseconds
//! disappears in that noise. Here the batches of the two sides alternate,
//! and the overhead is the median over pairs of neighbouring batches, so a
//! change of state moves both sides of each pair alike.

use std::time::Instant;

/// Ns per call of one side and of the other, as medians over the run.
#[derive(Clone, Copy, Debug)]
pub struct Pair {
    /// The median of `ours`, ns per call.
    pub ours: f64,
    /// The median of the baseline, ns per call.
    pub raw: f64,
    /// The median over neighbouring batches of ours over the baseline, minus
    /// one, in percent.
    pub over_raw_percent: f64,
    /// The median over neighbouring batches of ours minus the baseline, ns
    /// per call.
    pub over_raw_ns: f64,
}

/// Ns per call of `ours` and of `raw`, over `samples` batches of `batch`
/// calls each, the two alternating batch by batch, with `settle` run untimed
/// after each batch (a synchronize keeps queues short on both sides). Each
/// call gets its index in the batch. One untimed batch of each first.
pub fn alternating(
    samples: usize,
    batch: usize,
    mut ours: impl FnMut(usize),
    mut raw: impl FnMut(usize),
    mut settle: impl FnMut(),
) -> Pair {
    assert!(
        samples > 0 && batch > 0,
        "alternating needs samples and batch > 0"
    );
    let mut timed = |f: &mut dyn FnMut(usize)| {
        let start = Instant::now();
        for i in 0..batch {
            f(i);
        }
        let ns = start.elapsed().as_nanos() as f64 / batch as f64;
        settle();
        ns
    };
    // Warm-up: pools, queues and caches on both sides.
    timed(&mut ours);
    timed(&mut raw);
    let (mut a, mut b): (Vec<f64>, Vec<f64>) = (0..samples)
        .map(|_| (timed(&mut ours), timed(&mut raw)))
        .unzip();
    let mut ratios: Vec<f64> = a.iter().zip(&b).map(|(a, b)| a / b).collect();
    let mut differences: Vec<f64> = a.iter().zip(&b).map(|(a, b)| a - b).collect();
    Pair {
        over_raw_percent: (median(&mut ratios) - 1.0) * 100.0,
        over_raw_ns: median(&mut differences),
        ours: median(&mut a),
        raw: median(&mut b),
    }
}

/// [`alternating`] over one set-up that both sides and the settle use in
/// turn (never at once): `ours` and `raw` each take it mutably, `settle`
/// shared.
pub fn alternating_on<S>(
    state: &mut S,
    samples: usize,
    batch: usize,
    ours: impl Fn(&mut S),
    raw: impl Fn(&mut S),
    settle: impl Fn(&S),
) -> Pair {
    let state = std::cell::RefCell::new(state);
    alternating(
        samples,
        batch,
        |_| ours(&mut state.borrow_mut()),
        |_| raw(&mut state.borrow_mut()),
        || settle(&state.borrow()),
    )
}

fn median(samples: &mut [f64]) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}
