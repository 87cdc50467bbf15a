//! Which of the pool's streams serve which class, workload type and purpose.
//!
//! The streams are laid out once, most urgent class first (High, Normal,
//! Low), and never move. Every set a getter picks from is a contiguous run of
//! that list, so a set is two numbers, and a workload's set can be replaced
//! with one atomic store while getters read it without a lock.

use crate::kinds::{StreamPurpose, WorkloadType};
use driver::StreamPriority;
use std::sync::atomic::{AtomicU64, Ordering};

/// A contiguous run `start..start + len` of the pool's streams (`len >= 1`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Span {
    pub(crate) start: u32,
    pub(crate) len: u32,
}

impl Span {
    pub(crate) fn new(start: usize, len: usize) -> Self {
        Self {
            start: start as u32,
            len: len as u32,
        }
    }

    pub(crate) fn indices(self) -> std::ops::Range<usize> {
        self.start as usize..(self.start + self.len) as usize
    }

    /// The `k`-th stream of the run, wrapping.
    #[inline]
    pub(crate) fn nth(self, k: usize) -> usize {
        self.start as usize + k % self.len as usize
    }

    fn pack(self) -> u64 {
        (u64::from(self.start) << 32) | u64::from(self.len)
    }

    fn unpack(bits: u64) -> Self {
        Self {
            start: (bits >> 32) as u32,
            len: bits as u32,
        }
    }
}

/// A [`Span`] that can be replaced while others read it.
pub(crate) struct AtomicSpan(AtomicU64);

impl AtomicSpan {
    pub(crate) fn new(span: Span) -> Self {
        Self(AtomicU64::new(span.pack()))
    }

    #[inline]
    pub(crate) fn load(&self) -> Span {
        Span::unpack(self.0.load(Ordering::Acquire))
    }

    pub(crate) fn store(&self, span: Span) {
        self.0.store(span.pack(), Ordering::Release);
    }
}

/// How many streams each priority class gets.
///
/// ```
/// use cuda_streams_stream_pool::ClassSplit;
/// assert_eq!(ClassSplit::default_for(8), ClassSplit { high: 2, normal: 4, low: 2 });
/// assert_eq!(ClassSplit::default_for(3), ClassSplit { high: 1, normal: 1, low: 1 });
/// assert_eq!(ClassSplit::default_for(1), ClassSplit { high: 0, normal: 1, low: 0 });
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ClassSplit {
    /// Streams at the device's greatest priority.
    pub high: usize,
    /// Streams at the midpoint of the range.
    pub normal: usize,
    /// Streams at the device's least priority.
    pub low: usize,
}

impl ClassSplit {
    /// A quarter High, a quarter Low (at least one each from three streams
    /// up), the rest Normal.
    pub fn default_for(size: usize) -> Self {
        match size {
            0 | 1 => Self {
                high: 0,
                normal: size,
                low: 0,
            },
            2 => Self {
                high: 1,
                normal: 1,
                low: 0,
            },
            _ => {
                let edge = (size / 4).max(1);
                Self {
                    high: edge,
                    normal: size - 2 * edge,
                    low: edge,
                }
            }
        }
    }

    /// The total number of streams.
    pub fn total(&self) -> usize {
        self.high + self.normal + self.low
    }

    /// The class of the stream at `index` in the pool's layout.
    pub(crate) fn class_at(&self, index: usize) -> StreamPriority {
        if index < self.high {
            StreamPriority::High
        } else if index < self.high + self.normal {
            StreamPriority::Normal
        } else {
            StreamPriority::Low
        }
    }

    fn count(&self, class: StreamPriority) -> usize {
        match class {
            StreamPriority::High => self.high,
            StreamPriority::Normal => self.normal,
            StreamPriority::Low => self.low,
        }
    }

    fn own_span(&self, class: StreamPriority) -> Option<Span> {
        let start = match class {
            StreamPriority::High => 0,
            StreamPriority::Normal => self.high,
            StreamPriority::Low => self.high + self.normal,
        };
        let len = self.count(class);
        (len > 0).then(|| Span::new(start, len))
    }

    /// The streams serving `class`; an empty class borrows its nearest
    /// neighbour's (High and Low borrow Normal first; Normal borrows Low first).
    pub(crate) fn class_span(&self, class: StreamPriority) -> Span {
        use StreamPriority::{High, Low, Normal};
        let order = match class {
            High => [High, Normal, Low],
            Normal => [Normal, Low, High],
            Low => [Low, Normal, High],
        };
        order
            .into_iter()
            .find_map(|c| self.own_span(c))
            .unwrap_or(Span::new(0, self.total().max(1)))
    }

    /// The default assignment documented on [`WorkloadType`].
    pub(crate) fn default_workload_spans(&self) -> [Span; 4] {
        let normal = self.class_span(StreamPriority::Normal);
        let (memory, mixed) = if normal.len >= 2 {
            let first = normal.len.div_ceil(2);
            (
                Span {
                    start: normal.start,
                    len: first,
                },
                Span {
                    start: normal.start + first,
                    len: normal.len - first,
                },
            )
        } else {
            (normal, normal)
        };
        [
            self.class_span(StreamPriority::High),
            memory,
            mixed,
            self.class_span(StreamPriority::Low),
        ]
    }

    /// One stream per purpose: a stream of the preferred class that no other
    /// purpose has yet, else one of any class, else a shared one of the
    /// preferred class.
    pub(crate) fn purpose_table(&self) -> [usize; 5] {
        // The order decides who gets a stream to itself when streams are few.
        const ORDER: [StreamPurpose; 5] = [
            StreamPurpose::KernelExecution,
            StreamPurpose::ConfigUpload,
            StreamPurpose::TelemetryDownload,
            StreamPurpose::AuxCompute,
            StreamPurpose::P2PTransfer,
        ];
        let total = self.total().max(1);
        let mut used = vec![false; total];
        let mut table = [0; 5];
        for (k, purpose) in ORDER.into_iter().enumerate() {
            let preferred = self.class_span(purpose.preferred_class());
            let fresh = preferred
                .indices()
                .chain(0..total)
                .find(|&index| !used[index]);
            let index = fresh.unwrap_or_else(|| preferred.nth(k));
            used[index] = true;
            table[purpose.index()] = index;
        }
        table
    }
}

/// Runs in [`WorkloadType::ALL`] order sized in proportion to `loads`, each at
/// least one stream. `None` when there are fewer streams than workload types
/// or no load at all.
pub(crate) fn proportional_spans(total: usize, loads: [f64; 4]) -> Option<[Span; 4]> {
    let types = WorkloadType::ALL.len();
    let sum: f64 = loads.iter().sum();
    if total < types || sum <= 0.0 || !sum.is_finite() {
        return None;
    }
    let spare = total - types;
    let exact: Vec<f64> = loads.iter().map(|l| l / sum * spare as f64).collect();
    let mut counts: Vec<usize> = exact.iter().map(|e| 1 + e.floor() as usize).collect();
    let mut left = total - counts.iter().sum::<usize>();
    // Largest remainder first; ties go to the earlier (more urgent) type.
    let mut by_remainder: Vec<usize> = (0..types).collect();
    by_remainder.sort_by(|&a, &b| {
        let (ra, rb) = (exact[a] - exact[a].floor(), exact[b] - exact[b].floor());
        rb.total_cmp(&ra).then(a.cmp(&b))
    });
    for &i in by_remainder.iter().cycle() {
        if left == 0 {
            break;
        }
        counts[i] += 1;
        left -= 1;
    }
    let mut spans = [Span::new(0, 1); 4];
    let mut start = 0;
    for (span, count) in spans.iter_mut().zip(counts) {
        *span = Span::new(start, count);
        start += count;
    }
    Some(spans)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_split_covers_every_size() {
        for size in 1..64 {
            let split = ClassSplit::default_for(size);
            assert_eq!(split.total(), size);
            for class in StreamPriority::ALL {
                let span = split.class_span(class);
                assert!(
                    span.len >= 1 && span.indices().end <= size,
                    "{size} {class:?}"
                );
            }
            let table = split.purpose_table();
            assert!(table.iter().all(|&i| i < size));
            let distinct: std::collections::HashSet<_> = table.iter().collect();
            assert_eq!(distinct.len(), size.min(5), "size {size}: {table:?}");
        }
    }

    #[test]
    fn classes_are_contiguous_most_urgent_first() {
        let split = ClassSplit::default_for(8);
        assert_eq!(split.class_span(StreamPriority::High), Span::new(0, 2));
        assert_eq!(split.class_span(StreamPriority::Normal), Span::new(2, 4));
        assert_eq!(split.class_span(StreamPriority::Low), Span::new(6, 2));
        let [compute, memory, mixed, coordination] = split.default_workload_spans();
        assert_eq!(
            (compute, memory, mixed, coordination),
            (
                Span::new(0, 2),
                Span::new(2, 2),
                Span::new(4, 2),
                Span::new(6, 2)
            )
        );
        let table = split.purpose_table();
        assert_eq!(
            split.class_at(table[StreamPurpose::KernelExecution.index()]),
            StreamPriority::High
        );
        assert_eq!(
            split.class_at(table[StreamPurpose::ConfigUpload.index()]),
            StreamPriority::Normal
        );
        assert_eq!(
            split.class_at(table[StreamPurpose::P2PTransfer.index()]),
            StreamPriority::Low
        );
    }

    #[test]
    fn empty_classes_borrow_a_neighbour() {
        let split = ClassSplit {
            high: 0,
            normal: 0,
            low: 3,
        };
        for class in StreamPriority::ALL {
            assert_eq!(split.class_span(class), Span::new(0, 3));
        }
    }

    #[test]
    fn proportional_spans_follow_the_load() {
        let spans = proportional_spans(8, [90.0, 5.0, 3.0, 2.0]).unwrap();
        assert_eq!(spans[0], Span::new(0, 5));
        assert_eq!(spans.iter().map(|s| s.len).sum::<u32>(), 8);
        assert!(spans[1..].iter().all(|s| s.len == 1));
        let even = proportional_spans(8, [1.0; 4]).unwrap();
        assert!(even.iter().all(|s| s.len == 2));
        assert_eq!(proportional_spans(3, [1.0; 4]), None);
        assert_eq!(proportional_spans(8, [0.0; 4]), None);
    }

    #[test]
    fn atomic_span_round_trips() {
        let span = AtomicSpan::new(Span::new(3, 9));
        assert_eq!(span.load(), Span::new(3, 9));
        span.store(Span::new(u32::MAX as usize - 1, 1));
        assert_eq!(span.load(), Span::new(u32::MAX as usize - 1, 1));
    }
}
