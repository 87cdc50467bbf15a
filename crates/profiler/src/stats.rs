//! Arithmetic over GPU intervals: per-name statistics, busy time, and how many
//! streams were busy at once.

use std::time::Duration;

/// Statistics of one operation name on one stream.
///
/// ```
/// use cuda_streams_profiler::StreamProfiler;
/// use cuda_streams_profiler::driver::{Context, Stream};
/// use std::time::Duration;
/// # fn main() -> cuda_streams_profiler::Result<()> {
/// let ctx = Context::new(0)?;
/// let stream = Stream::new(&ctx)?;
/// let profiler = StreamProfiler::new(&ctx)?;
/// profiler.enable();
/// for ms in [3, 1, 2] {
///     profiler.record_operation(&stream, "decode", Duration::from_millis(ms));
/// }
/// let stats = profiler.get_stream_report(&stream).unwrap().operations["decode"];
/// let ms = Duration::from_millis;
/// assert_eq!((stats.count, stats.total, stats.mean), (3, ms(6), ms(2)));
/// assert_eq!((stats.min, stats.p50, stats.p99, stats.max), (ms(1), ms(2), ms(3), ms(3)));
/// assert_eq!(
///     stats.to_string(),
///     "3 × 2.000 ms mean (total 6.000 ms; min 1.000 ms, p50 2.000 ms, p99 3.000 ms, max 3.000 ms)",
/// );
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct OperationStats {
    /// How many times it ran: timed, recorded, or skipped by a
    /// [`crate::Sampler`].
    pub count: u64,
    /// How many of those were timed or recorded: the rest of the fields
    /// describe these (`count` unless sampled).
    pub timed: u64,
    /// Their total duration.
    pub total: Duration,
    /// `total / timed`.
    pub mean: Duration,
    /// The shortest.
    pub min: Duration,
    /// The longest.
    pub max: Duration,
    /// Median (nearest rank).
    pub p50: Duration,
    /// 99th percentile (nearest rank).
    pub p99: Duration,
}

impl std::fmt::Display for OperationStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use driver::format_duration as d;
        write!(f, "{} × {} mean", self.count, d(self.mean))?;
        if self.timed != self.count {
            write!(f, " ({} timed)", self.timed)?;
        }
        write!(
            f,
            " (total {}; min {}, p50 {}, p99 {}, max {})",
            d(self.total),
            d(self.min),
            d(self.p50),
            d(self.p99),
            d(self.max)
        )
    }
}

/// Statistics over `durations` (ns), which this sorts. `None` when empty.
pub(crate) fn operation_stats(durations: &mut [u64]) -> Option<OperationStats> {
    durations.sort_unstable();
    let (&min, &max) = (durations.first()?, durations.last()?);
    let count = durations.len() as u64;
    let total: u128 = durations.iter().map(|&d| u128::from(d)).sum();
    Some(OperationStats {
        count,
        timed: count,
        total: nanos(total),
        mean: nanos(total / u128::from(count)),
        min: Duration::from_nanos(min),
        max: Duration::from_nanos(max),
        p50: Duration::from_nanos(percentile(durations, 50)),
        p99: Duration::from_nanos(percentile(durations, 99)),
    })
}

/// Nearest-rank percentile of sorted, non-empty `values`: the smallest value
/// with at least `p`% of the values at or below it.
pub(crate) fn percentile(values: &[u64], p: u32) -> u64 {
    let n = values.len();
    let rank = (n * p as usize).div_ceil(100).clamp(1, n);
    values[rank - 1]
}

fn nanos(ns: u128) -> Duration {
    Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
}

/// Sorted, disjoint intervals covering the same time as `intervals`.
pub(crate) fn merge(mut intervals: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    intervals.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(intervals.len());
    for (start, end) in intervals {
        match merged.last_mut() {
            Some(last) if start <= last.1 => last.1 = last.1.max(end),
            _ => merged.push((start, end)),
        }
    }
    merged
}

/// Total length of disjoint intervals, ns.
pub(crate) fn covered(merged: &[(u64, u64)]) -> u64 {
    merged.iter().map(|(s, e)| e - s).sum()
}

/// For each stream's merged busy intervals, the time spent with exactly `k`
/// streams busy (index `k`) between the first start and the last end.
pub(crate) fn concurrency(per_stream: &[Vec<(u64, u64)>]) -> Vec<Duration> {
    // +1 at each start, -1 at each end; ends sort before starts at the same
    // instant so that back-to-back intervals do not count as overlapping.
    let mut edges: Vec<(u64, i32)> = per_stream
        .iter()
        .flatten()
        .flat_map(|&(s, e)| [(s, 1), (e, -1)])
        .collect();
    edges.sort_unstable();
    let mut histogram: Vec<u64> = Vec::new();
    let mut busy = 0i32;
    let mut previous = None;
    for (at, delta) in edges {
        if let Some(previous) = previous {
            let k = busy.max(0) as usize;
            if histogram.len() <= k {
                histogram.resize(k + 1, 0);
            }
            histogram[k] += at - previous;
        }
        busy += delta;
        previous = Some(at);
    }
    // Zero-length intervals can leave trailing buckets that saw no time.
    while histogram.last() == Some(&0) && histogram.len() > 1 {
        histogram.pop();
    }
    histogram.into_iter().map(Duration::from_nanos).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let values: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&values, 50), 50);
        assert_eq!(percentile(&values, 99), 99);
        assert_eq!(percentile(&[7], 99), 7);
        assert_eq!(percentile(&[1, 2], 50), 1);
        assert_eq!(percentile(&[1, 2, 3], 99), 3);
    }

    #[test]
    fn stats_over_unsorted_durations() {
        let mut d = vec![30, 10, 20, 40];
        let s = operation_stats(&mut d).unwrap();
        assert_eq!(s.count, 4);
        assert_eq!(s.total, Duration::from_nanos(100));
        assert_eq!(s.mean, Duration::from_nanos(25));
        assert_eq!(
            (s.min, s.max),
            (Duration::from_nanos(10), Duration::from_nanos(40))
        );
        assert_eq!(s.p50, Duration::from_nanos(20));
        assert_eq!(s.p99, Duration::from_nanos(40));
        assert!(operation_stats(&mut []).is_none());
    }

    #[test]
    fn merging_joins_overlaps_and_touching_intervals() {
        let merged = merge(vec![(5, 8), (0, 2), (1, 3), (3, 4), (10, 10)]);
        assert_eq!(merged, vec![(0, 4), (5, 8), (10, 10)]);
        assert_eq!(covered(&merged), 7);
    }

    #[test]
    fn concurrency_histogram() {
        // Stream a busy 0..10, stream b busy 5..15 and 20..30.
        let h = concurrency(&[vec![(0, 10)], vec![(5, 15), (20, 30)]]);
        let ns: Vec<u64> = h.iter().map(|d| d.as_nanos() as u64).collect();
        // idle 15..20 = 5; one busy 0..5, 10..15, 20..30 = 20; two busy 5..10 = 5.
        assert_eq!(ns, vec![5, 20, 5]);
        // Back to back on two streams is never two at once.
        let h = concurrency(&[vec![(0, 10)], vec![(10, 20)]]);
        assert_eq!(h.len(), 2, "{h:?}");
        assert!(concurrency(&[]).is_empty());
    }
}
