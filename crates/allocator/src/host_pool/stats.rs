//! The host pool's figures.

use std::fmt;

/// A snapshot of a [`crate::HostPool`]'s figures (from
/// [`crate::HostPool::stats`]); `Display` writes them on one line.
///
/// ```
/// use cuda_streams_allocator::HostPool;
/// use cuda_streams_allocator::driver::Context;
/// # fn main() -> cuda_streams_allocator::Result<()> {
/// let ctx = Context::new(0)?;
/// let pool = HostPool::new(&ctx)?;
/// drop(pool.allocate::<u8>(1000)?); // a miss: a 1024-byte block
/// let block = pool.allocate::<u8>(1000)?; // a hit: the same block
/// let stats = pool.stats();
/// assert_eq!((stats.hits, stats.misses), (1, 1));
/// assert_eq!((stats.reserved_bytes, stats.in_use_bytes), (1024, 1024));
/// assert!(stats.to_string().contains("1 hits, 1 misses"), "{stats}");
/// # drop(block);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive] // more figures may come (e.g. per-class counts)
pub struct HostPoolStats {
    /// Page-locked bytes the pool holds from the driver.
    pub reserved_bytes: usize,
    /// The highest `reserved_bytes` since creation or [`crate::HostPool::reset_peaks`].
    pub peak_reserved_bytes: usize,
    /// Bytes in blocks handed out and not yet dropped (whole blocks).
    pub in_use_bytes: usize,
    /// The highest `in_use_bytes` since creation or the last reset.
    pub peak_in_use_bytes: usize,
    /// Bytes of dropped blocks that some stream may still be using: not
    /// reusable until those streams pass their uses.
    pub pending_bytes: usize,
    /// Bytes of dropped blocks ready for reuse.
    pub cached_bytes: usize,
    /// Requests served from a cached block.
    pub hits: u64,
    /// Requests that allocated a new block from the driver.
    pub misses: u64,
    /// The cap on `reserved_bytes`.
    pub cap_bytes: usize,
}

impl fmt::Display for HostPoolStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "host pool: {} reserved (peak {}) of a {} cap, {} in use (peak {}), \
             {} waiting for streams, {} cached; {} hits, {} misses",
            Bytes(self.reserved_bytes),
            Bytes(self.peak_reserved_bytes),
            Bytes(self.cap_bytes),
            Bytes(self.in_use_bytes),
            Bytes(self.peak_in_use_bytes),
            Bytes(self.pending_bytes),
            Bytes(self.cached_bytes),
            self.hits,
            self.misses
        )
    }
}

/// A byte count in the largest binary unit that keeps it at least 1.
pub(crate) struct Bytes(pub(crate) usize);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
        let mut value = self.0 as f64;
        let mut unit = 0;
        while value >= 1024.0 && unit + 1 < UNITS.len() {
            value /= 1024.0;
            unit += 1;
        }
        if unit == 0 {
            write!(f, "{} B", self.0)
        } else {
            write!(f, "{value:.1} {}", UNITS[unit])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_every_figure() {
        let stats = HostPoolStats {
            reserved_bytes: 3 << 20,
            peak_reserved_bytes: 4 << 20,
            in_use_bytes: 1 << 20,
            peak_in_use_bytes: 2 << 20,
            pending_bytes: 512,
            cached_bytes: (2 << 20) - 512,
            hits: 7,
            misses: 2,
            cap_bytes: 1 << 30,
        };
        assert_eq!(
            stats.to_string(),
            "host pool: 3.0 MiB reserved (peak 4.0 MiB) of a 1.0 GiB cap, 1.0 MiB in use \
             (peak 2.0 MiB), 512 B waiting for streams, 2.0 MiB cached; 7 hits, 2 misses"
        );
    }
}
