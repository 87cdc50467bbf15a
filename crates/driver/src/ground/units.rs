//! Byte counts and durations as people read them, for every crate's
//! reports and `Display` impls (the profiler's tables, the allocator's
//! stats, the stream metrics), so that each prints them the same way.

use std::time::Duration;

/// A duration in the unit that keeps 3-4 significant digits: `812 ns`,
/// `12.34 µs`, `1.234 ms`, `2.500 s`.
///
/// ```
/// use cuda_streams_driver::format_duration;
/// use std::time::Duration;
/// assert_eq!(format_duration(Duration::from_nanos(812)), "812 ns");
/// assert_eq!(format_duration(Duration::from_micros(1234)), "1.234 ms");
/// ```
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
///
/// ```
/// use cuda_streams_driver::format_bytes;
/// assert_eq!(format_bytes(512), "512 B");
/// assert_eq!(format_bytes(3 << 29), "1.50 GiB");
/// ```
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
