//! Terminal tables for the reports.

use crate::report::{ComprehensiveReport, StreamReport};
use std::fmt;
use std::time::Duration;

/// A duration in the unit that keeps 3-4 significant digits: `812 ns`,
/// `12.34 µs`, `1.234 ms`, `2.500 s`.
pub fn format_duration(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns < 1_000 {
        format!("{ns} ns")
    } else if ns < 1_000_000 {
        format!("{:.2} µs", ns as f64 / 1e3)
    } else if ns < 1_000_000_000 {
        format!("{:.3} ms", ns as f64 / 1e6)
    } else {
        format!("{:.3} s", ns as f64 / 1e9)
    }
}

/// A byte count in binary units: `512 B`, `1.50 KiB`, `3.00 GiB`.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.2} {}", UNITS[unit])
}

/// Columns padded to their widest cell; the first column left-aligned, the
/// rest (numbers) right-aligned.
struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    fn new(header: &[&str]) -> Self {
        Self {
            rows: vec![header.iter().map(|h| h.to_string()).collect()],
        }
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
                if c == 0 {
                    line.push_str(cell);
                    line.extend(std::iter::repeat_n(' ', pad));
                } else {
                    line.push_str("  ");
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
            "stream {}: {} operations, {} GPU time ({} busy on the timeline), {} kernel launches, {} transfers ({})",
            self.stream_id,
            self.operation_count,
            format_duration(self.total_time),
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

/// ```
/// # use cuda_streams_profiler::ComprehensiveReport;
/// let text = ComprehensiveReport::default().to_string();
/// assert!(text.contains("0 streams"));
/// ```
impl fmt::Display for ComprehensiveReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} streams, {} operations within a {} span of GPU time; overlap efficiency {:.2} (the streams' busy times summed / wall span: streams busy on average, above 1 when they overlap), at most {} streams busy at once",
            self.total_streams,
            self.total_operations,
            format_duration(self.wall_span),
            self.overlap_efficiency,
            self.max_concurrency,
        )?;
        if self.errors > 0 {
            writeln!(f, "{} recording errors (see error_count)", self.errors)?;
        }
        if !self.streams.is_empty() {
            writeln!(f)?;
            let mut table = Table::new(&[
                "stream",
                "ops",
                "GPU time",
                "busy",
                "busy %",
                "kernels",
                "transfers",
                "bytes",
            ]);
            for s in &self.streams {
                let share = if self.wall_span.is_zero() {
                    0.0
                } else {
                    100.0 * s.busy_time.as_secs_f64() / self.wall_span.as_secs_f64()
                };
                table.row(vec![
                    s.stream_id.to_string(),
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
        if !self.wall_span.is_zero() {
            writeln!(f)?;
            let mut table = Table::new(&["streams busy", "time", "share %"]);
            for (k, time) in self.concurrency.iter().enumerate() {
                let share = 100.0 * time.as_secs_f64() / self.wall_span.as_secs_f64();
                table.row(vec![
                    k.to_string(),
                    format_duration(*time),
                    format!("{share:.1}"),
                ]);
            }
            table.write(f, "")?;
        }
        for s in &self.streams {
            writeln!(f)?;
            s.write_summary(f)?;
            s.write_operations(f, "  ")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
