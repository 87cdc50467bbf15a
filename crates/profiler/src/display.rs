//! Terminal tables for the reports.

use crate::report::{ComprehensiveReport, StreamReport};
use driver::{format_bytes, format_duration};
use std::fmt;

/// Columns padded to their widest cell; the first column and any named in
/// `left` (text) left-aligned, the rest (numbers) right-aligned.
struct Table {
    rows: Vec<Vec<String>>,
    left: Vec<usize>,
}

impl Table {
    fn new(header: &[&str]) -> Self {
        Self {
            rows: vec![header.iter().map(|h| h.to_string()).collect()],
            left: vec![0],
        }
    }

    /// Column `column` holds text: left-aligned.
    fn left_aligned(mut self, column: usize) -> Self {
        self.left.push(column);
        self
    }

    fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    fn write(&self, f: &mut fmt::Formatter<'_>, indent: &str) -> fmt::Result {
        let columns = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let widths: Vec<usize> = (0..columns)
            .map(|c| {
                self.rows
                    .iter()
                    .filter_map(|r| r.get(c))
                    .map(|cell| cell.chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        for row in &self.rows {
            let mut line = String::from(indent);
            for (c, cell) in row.iter().enumerate() {
                let pad = widths[c] - cell.chars().count();
                if c > 0 {
                    line.push_str("  ");
                }
                if self.left.contains(&c) {
                    line.push_str(cell);
                    line.extend(std::iter::repeat_n(' ', pad));
                } else {
                    line.extend(std::iter::repeat_n(' ', pad));
                    line.push_str(cell);
                }
            }
            writeln!(f, "{}", line.trim_end())?;
        }
        Ok(())
    }
}

impl StreamReport {
    fn write_operations(&self, f: &mut fmt::Formatter<'_>, indent: &str) -> fmt::Result {
        if self.operations.is_empty() {
            return writeln!(f, "{indent}(no operations)");
        }
        let mut table = Table::new(&[
            "operation",
            "count",
            "total",
            "mean",
            "min",
            "max",
            "p50",
            "p99",
        ]);
        for (name, s) in &self.operations {
            // A sampled name shows how many of its runs were timed.
            let count = if s.timed == s.count {
                s.count.to_string()
            } else {
                format!("{} ({} timed)", s.count, s.timed)
            };
            table.row(vec![
                name.clone(),
                count,
                format_duration(s.total),
                format_duration(s.mean),
                format_duration(s.min),
                format_duration(s.max),
                format_duration(s.p50),
                format_duration(s.p99),
            ]);
        }
        table.write(f, indent)
    }

    fn write_summary(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "stream {}: {} operations, {} {} ({} busy on the timeline), {} kernel launches, {} transfers ({})",
            self.stream_id,
            self.operation_count,
            format_duration(self.total_time),
            time_word(self.timed_by_gpu),
            format_duration(self.busy_time),
            self.kernel_launches,
            self.memory_transfers,
            format_bytes(self.bytes_transferred),
        )?;
        if self.graph_launches > 0 {
            writeln!(
                f,
                "  {} CUDA graph replays, {} nodes",
                self.graph_launches, self.graph_nodes
            )?;
        }
        if self.unresolved > 0 {
            writeln!(f, "  ({} operations not yet resolved)", self.unresolved)?;
        }
        Ok(())
    }
}

/// ```
/// # use cuda_streams_profiler::StreamReport;
/// let text = StreamReport::default().to_string();
/// assert!(text.starts_with("stream 0: 0 operations"));
/// ```
impl fmt::Display for StreamReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write_summary(f)?;
        self.write_operations(f, "  ")
    }
}

/// "GPU time" where a GPU timed the work; plain "time" on the software
/// driver, whose times come from the host's clock while CPU threads run it.
fn time_word(timed_by_gpu: bool) -> &'static str {
    if timed_by_gpu { "GPU time" } else { "time" }
}

/// Operation names of a stream for the streams table: what ran on it.
fn work(stream: &StreamReport) -> String {
    const SHOWN: usize = 3;
    let names: Vec<&str> = stream.operations.keys().map(String::as_str).collect();
    match names.len() {
        0 => "-".to_string(),
        n if n <= SHOWN => names.join(", "),
        n => format!("{} and {} more", names[..SHOWN].join(", "), n - SHOWN),
    }
}

/// The head of a [`ComprehensiveReport`]: its summary line, the streams
/// table and the streams-busy-at-once table, without each stream's
/// operations ([`ComprehensiveReport::summary`]).
struct Summary<'a>(&'a ComprehensiveReport);

impl fmt::Display for Summary<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let report = self.0;
        let timing = if report.timed_by_gpu {
            "of GPU time"
        } else {
            "timed by the software driver on CPU threads (it shows the order and \
             overlap of the work, not a GPU's speed)"
        };
        writeln!(
            f,
            "{} streams, {} operations within a {} span {timing}; busy {:.1}% of the span (time with at least one stream busy / span), at most {} streams busy at once",
            report.total_streams,
            report.total_operations,
            format_duration(report.wall_span),
            100.0 * report.busy_fraction(),
            report.max_concurrency,
        )?;
        if report.errors > 0 {
            writeln!(f, "{} recording errors (see error_count)", report.errors)?;
        }
        if !report.streams.is_empty() {
            writeln!(f)?;
            let mut table = Table::new(&[
                "stream",
                "work",
                "ops",
                time_word(report.timed_by_gpu),
                "busy",
                "busy %",
                "kernels",
                "transfers",
                "bytes",
            ])
            .left_aligned(1);
            for s in &report.streams {
                let share = if report.wall_span.is_zero() {
                    0.0
                } else {
                    100.0 * s.busy_time.as_secs_f64() / report.wall_span.as_secs_f64()
                };
                table.row(vec![
                    s.stream_id.to_string(),
                    work(s),
                    s.operation_count.to_string(),
                    format_duration(s.total_time),
                    format_duration(s.busy_time),
                    format!("{share:.1}"),
                    s.kernel_launches.to_string(),
                    s.memory_transfers.to_string(),
                    format_bytes(s.bytes_transferred),
                ]);
            }
            table.write(f, "")?;
        }
        if !report.wall_span.is_zero() {
            writeln!(f)?;
            let mut table = Table::new(&["streams busy", "time", "share %"]);
            for (k, time) in report.concurrency.iter().enumerate() {
                let share = 100.0 * time.as_secs_f64() / report.wall_span.as_secs_f64();
                table.row(vec![
                    k.to_string(),
                    format_duration(*time),
                    format!("{share:.1}"),
                ]);
            }
            table.write(f, "")?;
        }
        Ok(())
    }
}

impl ComprehensiveReport {
    /// The report without each stream's operation table: the summary line
    /// (span, how busy the streams kept the device, the most busy at once),
    /// the streams table and the streams-busy-at-once table. `Display`
    /// prints this and then each stream's operations.
    ///
    /// ```
    /// # use cuda_streams_profiler::ComprehensiveReport;
    /// let report = ComprehensiveReport::default();
    /// let head = report.summary().to_string();
    /// assert!(head.starts_with("0 streams") && head.contains("busy 0.0% of the span"));
    /// ```
    pub fn summary(&self) -> impl fmt::Display + '_ {
        Summary(self)
    }
}

/// ```
/// # use cuda_streams_profiler::ComprehensiveReport;
/// let text = ComprehensiveReport::default().to_string();
/// assert!(text.contains("0 streams"));
/// ```
impl fmt::Display for ComprehensiveReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        Summary(self).fmt(f)?;
        for s in &self.streams {
            writeln!(f)?;
            s.write_summary(f)?;
            s.write_operations(f, "  ")?;
        }
        if let Some(memory) = &self.memory {
            write!(f, "\n{memory}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn durations_and_bytes_pick_their_unit() {
        assert_eq!(format_duration(Duration::from_nanos(812)), "812 ns");
        assert_eq!(format_duration(Duration::from_nanos(12_346)), "12.35 µs");
        assert_eq!(format_duration(Duration::from_micros(1_234)), "1.234 ms");
        assert_eq!(format_duration(Duration::from_millis(2_500)), "2.500 s");
        assert_eq!(format_bytes(512), "512 B");
        assert_eq!(format_bytes(1536), "1.50 KiB");
        assert_eq!(format_bytes(3 << 30), "3.00 GiB");
    }

    /// Two streams over 1 ms: idle for 0.25 ms, one busy for 0.5 ms, both
    /// for 0.25 ms.
    fn two_streams(timed_by_gpu: bool) -> ComprehensiveReport {
        let us = Duration::from_micros;
        let stream = |id, busy| StreamReport {
            stream_id: id,
            operation_count: 1,
            total_time: us(busy),
            busy_time: us(busy),
            timed_by_gpu,
            ..StreamReport::default()
        };
        ComprehensiveReport {
            streams: vec![stream(1, 500), stream(2, 500)],
            total_streams: 2,
            total_operations: 2,
            wall_span: us(1000),
            overlap_efficiency: 1.0,
            concurrency: vec![us(250), us(500), us(250)],
            max_concurrency: 2,
            timed_by_gpu,
            ..ComprehensiveReport::default()
        }
    }

    #[test]
    fn only_a_gpu_s_times_are_called_gpu_time() {
        let soft = two_streams(false).to_string();
        assert!(!soft.contains("GPU time"), "{soft}");
        assert!(
            soft.contains("1.000 ms span timed by the software driver on CPU threads")
                && soft.contains("stream 1: 1 operations, 500.00 µs time ("),
            "{soft}"
        );
        let gpu = two_streams(true).to_string();
        assert!(
            gpu.contains("1.000 ms span of GPU time;")
                && gpu.contains("stream 1: 1 operations, 500.00 µs GPU time (")
                && gpu.lines().any(|l| l.starts_with("stream  work")
                    && l.ends_with("GPU time       busy  busy %  kernels  transfers  bytes")),
            "{gpu}"
        );
    }

    /// One overlap figure, defined where it is given: the share of the span
    /// with a stream busy (75% here), not the busy times summed (1.0).
    #[test]
    fn the_one_overlap_figure_is_the_busy_share_of_the_span() {
        let report = two_streams(true);
        assert_eq!(report.busy_fraction(), 0.75);
        let text = report.summary().to_string();
        assert!(
            text.contains("busy 75.0% of the span (time with at least one stream busy / span)")
                && !text.contains("efficiency"),
            "{text}"
        );
        // The summary is the report without each stream's operations.
        let full = report.to_string();
        assert!(full.starts_with(&text) && full.contains("stream 2: 1 operations"));
        assert!(!text.contains("stream 2: 1 operations"), "{text}");
    }
}
