//! Shared helpers for the criterion benches.
//!
//! Criterion gives the careful per-benchmark statistics; a claimed speed-up
//! also needs its baseline measured in the same run and the ratio printed, so
//! each bench file ends by calling [`compare`], which times both sides with
//! [`median_ns`] and prints one `RATIO` line that `run.sh` and
//! `cargo xtask bench-report` pick up.

mod alternating;
mod batches;
mod harness;

pub use alternating::{Pair, alternating, alternating_on};
pub use batches::{per_call_pair, reps_for};
pub use harness::{criterion, criterion_summary, run_criterion};
pub use test_support::{kernel, spin_kernel};

use std::hint::black_box;
use std::time::{Duration, Instant};

/// The median time of one call of `f`, in nanoseconds, over `samples` batches
/// of `batch` calls each (batches amortise the clock read for fast calls).
pub fn median_ns(samples: usize, batch: usize, mut f: impl FnMut()) -> f64 {
    assert!(
        samples > 0 && batch > 0,
        "median_ns needs samples and batch > 0"
    );
    // Warm up: first calls pay for lazy initialisation and cold caches.
    for _ in 0..batch.min(1000) {
        f();
    }
    let mut per_call: Vec<f64> = (0..samples)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..batch {
                f();
            }
            start.elapsed().as_nanos() as f64 / batch as f64
        })
        .collect();
    per_call.sort_by(f64::total_cmp);
    per_call[per_call.len() / 2]
}

/// One measured comparison: ours against a baseline, both in nanoseconds.
#[derive(Clone, Copy, Debug)]
pub struct Comparison {
    /// What is compared, e.g. `pool get vs stream create`.
    pub name: &'static str,
    /// Our median, ns.
    pub ours_ns: f64,
    /// The baseline's median, ns.
    pub baseline_ns: f64,
}

impl Comparison {
    /// How many times faster ours is (above 1 means faster).
    pub fn speedup(&self) -> f64 {
        self.baseline_ns / self.ours_ns
    }
}

/// Print one comparison as a `RATIO` line and return it.
///
/// Format: `RATIO <name>: ours <x> ns, baseline <y> ns, <r>x` (parsed by
/// `cargo xtask bench-report`; keep it stable).
pub fn compare(name: &'static str, ours_ns: f64, baseline_ns: f64) -> Comparison {
    let c = Comparison {
        name,
        ours_ns,
        baseline_ns,
    };
    println!(
        "RATIO {name}: ours {} ns, baseline {} ns, {:.2}x",
        format_ns(ours_ns),
        format_ns(baseline_ns),
        c.speedup()
    );
    c
}

/// Print a single figure with no baseline (e.g. a wall time on the GPU only).
pub fn figure(name: &str, value: f64, unit: &str) {
    println!("FIGURE {name}: {value:.3} {unit}");
}

fn format_ns(ns: f64) -> String {
    if ns >= 100.0 {
        format!("{ns:.0}")
    } else {
        format!("{ns:.1}")
    }
}

/// Time one call of a long operation (ms scale) `runs` times and return the median.
pub fn median_duration(runs: usize, mut f: impl FnMut()) -> Duration {
    let mut times: Vec<Duration> = (0..runs.max(1))
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed()
        })
        .collect();
    times.sort();
    times[times.len() / 2]
}

/// CPU time the named thread of this process has used so far, in
/// nanoseconds (`/proc/self/task/*/schedstat`; Linux only). Thread names are
/// cut to 15 characters by the kernel: pass a prefix of at most that.
pub fn thread_cpu_ns(name_prefix: &str) -> Option<u64> {
    for entry in std::fs::read_dir("/proc/self/task").ok()? {
        let dir = entry.ok()?.path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if comm.trim_end().starts_with(name_prefix) {
            let stat = std::fs::read_to_string(dir.join("schedstat")).ok()?;
            return stat.split_whitespace().next()?.parse().ok();
        }
    }
    None
}

/// Keep a value alive and opaque to the optimiser.
pub fn keep<T>(value: T) -> T {
    black_box(value)
}
