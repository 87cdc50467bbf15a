//! The memory part of the text report: what the tracked allocators held
//! while profiling was enabled, in total and per stream, as
//! `torch.profiler` reports with `profile_memory=True`.

use allocator::{MemoryEvent, MemoryEventKind};
use driver::format_bytes;
use std::collections::BTreeMap;
use std::fmt;

/// The memory of the allocators a profiler tracks
/// ([`StreamProfiler::track_memory`](crate::StreamProfiler::track_memory)),
/// over the allocations and frees made while profiling was enabled; in
/// [`ComprehensiveReport::memory`](crate::ComprehensiveReport::memory) and
/// its text.
///
/// ```
/// use cuda_streams_profiler::StreamProfiler;
/// use cuda_streams_profiler::allocator::StreamOrderedAllocator;
/// use cuda_streams_profiler::driver::{Context, Stream};
/// # fn main() -> cuda_streams_profiler::Result<()> {
/// let ctx = Context::new(0)?;
/// let stream = Stream::new(&ctx)?;
/// let allocator = StreamOrderedAllocator::new(&ctx)?;
/// let profiler = StreamProfiler::new(&ctx)?;
/// profiler.track_memory(&allocator)?;
/// profiler.enable();
/// let kept = allocator.allocate_for_stream(&stream, 1 << 20)?;
/// drop(allocator.allocate_for_stream(&stream, 1 << 20)?);
/// let report = profiler.get_comprehensive_report();
/// let memory = report.memory.as_ref().expect("the allocator is tracked");
/// assert_eq!((memory.allocations, memory.frees), (2, 1));
/// assert_eq!((memory.allocated_bytes, memory.peak_allocated_bytes), (1 << 20, 2 << 20));
/// assert_eq!(memory.per_stream[0].stream_id, stream.id());
/// assert_eq!(memory.per_stream[0].peak_allocated_bytes, 2 << 20);
/// let text = report.to_string();
/// assert!(text.contains("memory: 1.00 MiB in use, peak 2.00 MiB"), "{text}");
/// assert!(text.contains(&format!("stream {}: 1.00 MiB in use, peak 2.00 MiB", stream.id())), "{text}");
/// # drop(kept);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemoryReport {
    /// Allocations made while profiling was enabled.
    pub allocations: u64,
    /// Frees made while profiling was enabled.
    pub frees: u64,
    /// Bytes live at the last allocation or free (every tracked allocator).
    pub allocated_bytes: u64,
    /// The most bytes live at once.
    pub peak_allocated_bytes: u64,
    /// Bytes the allocators held from the driver at the last event.
    pub reserved_bytes: u64,
    /// The most bytes held from the driver at once.
    pub peak_reserved_bytes: u64,
    /// Per stream, in stream id order.
    pub per_stream: Vec<StreamMemory>,
}

/// One stream's memory in a [`MemoryReport`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StreamMemory {
    /// The stream's id.
    pub stream_id: u64,
    /// Allocations made for it.
    pub allocations: u64,
    /// Frees of its blocks.
    pub frees: u64,
    /// Bytes live on it at its last event.
    pub allocated_bytes: u64,
    /// The most bytes live on it at once.
    pub peak_allocated_bytes: u64,
}

impl MemoryReport {
    /// Folds the events, in the order they happened. Each event carries its
    /// allocator's figures after it; allocators of several devices add up.
    pub(crate) fn build<'e>(events: impl IntoIterator<Item = &'e MemoryEvent>) -> Self {
        let mut report = MemoryReport::default();
        let mut devices: BTreeMap<i32, (u64, u64)> = BTreeMap::new();
        let mut streams: BTreeMap<u64, StreamMemory> = BTreeMap::new();
        for event in events {
            let stream = streams
                .entry(event.stream_id)
                .or_insert_with(|| StreamMemory {
                    stream_id: event.stream_id,
                    ..StreamMemory::default()
                });
            match event.kind {
                MemoryEventKind::Alloc => {
                    report.allocations += 1;
                    stream.allocations += 1;
                }
                MemoryEventKind::Free => {
                    report.frees += 1;
                    stream.frees += 1;
                }
                // A kind added later still moves the figures below.
                _ => {}
            }
            stream.allocated_bytes = event.stream_allocated_bytes as u64;
            stream.peak_allocated_bytes = stream.peak_allocated_bytes.max(stream.allocated_bytes);
            devices.insert(
                event.device,
                (event.allocated_bytes as u64, event.reserved_bytes as u64),
            );
            report.allocated_bytes = devices.values().map(|d| d.0).sum();
            report.reserved_bytes = devices.values().map(|d| d.1).sum();
            report.peak_allocated_bytes = report.peak_allocated_bytes.max(report.allocated_bytes);
            report.peak_reserved_bytes = report.peak_reserved_bytes.max(report.reserved_bytes);
        }
        report.per_stream = streams.into_values().collect();
        report
    }
}

impl fmt::Display for MemoryReport {
    /// A summary line, then one line per stream.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "memory: {} in use, peak {}; {} reserved, peak {}; {} allocation(s), {} free(s)",
            format_bytes(self.allocated_bytes),
            format_bytes(self.peak_allocated_bytes),
            format_bytes(self.reserved_bytes),
            format_bytes(self.peak_reserved_bytes),
            self.allocations,
            self.frees,
        )?;
        for stream in &self.per_stream {
            write!(f, "\n  {stream}")?;
        }
        Ok(())
    }
}

impl fmt::Display for StreamMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "stream {}: {} in use, peak {}; {} allocation(s), {} free(s)",
            self.stream_id,
            format_bytes(self.allocated_bytes),
            format_bytes(self.peak_allocated_bytes),
            self.allocations,
            self.frees,
        )
    }
}
