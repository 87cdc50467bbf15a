//! Size classes: how a request is rounded, which segments serve it, and when a
//! free block is split.
//!
//! The scheme is PyTorch's caching allocator's: requests are rounded up to
//! 512 bytes; small ones (at most 1 MiB) are packed into 2 MiB segments,
//! medium ones (up to 10 MiB) share 20 MiB segments, and large ones get a
//! segment of their own rounded up to 2 MiB (which later serves smaller
//! requests by splitting). Small and large blocks never share a segment, so a
//! long-lived small block cannot pin a large segment.

/// Every block size is a multiple of this.
pub const BLOCK_GRANULE: usize = 512;
/// Requests up to this size are small.
pub const SMALL_LIMIT: usize = 1 << 20;
/// The segment size for small requests.
pub const SMALL_SEGMENT: usize = 2 << 20;
/// Requests up to this size (and above [`SMALL_LIMIT`]) share a
/// [`MEDIUM_SEGMENT`].
pub const MEDIUM_LIMIT: usize = 10 << 20;
/// The segment size for medium requests.
pub const MEDIUM_SEGMENT: usize = 20 << 20;
/// Large segments are a multiple of this.
pub const SEGMENT_GRANULE: usize = 2 << 20;

/// Which free lists a block lives in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Class {
    Small,
    Large,
}

impl Class {
    pub(crate) fn of(rounded: usize) -> Self {
        if rounded <= SMALL_LIMIT {
            Self::Small
        } else {
            Self::Large
        }
    }

    /// Whether a free block of `block` bytes serving `rounded` bytes is split,
    /// leaving the rest free. Large blocks keep remainders of 1 MiB or less
    /// attached, so the large lists do not fill with slivers.
    pub(crate) fn should_split(self, block: usize, rounded: usize) -> bool {
        let rest = block - rounded;
        match self {
            Self::Small => rest >= BLOCK_GRANULE,
            Self::Large => rest > SMALL_LIMIT,
        }
    }
}

/// `bytes` rounded up to [`BLOCK_GRANULE`]; `None` on overflow.
pub(crate) fn round_request(bytes: usize) -> Option<usize> {
    bytes.checked_next_multiple_of(BLOCK_GRANULE)
}

/// The segment size that a request of `rounded` bytes allocates from the
/// driver when nothing cached fits; `None` on overflow.
pub(crate) fn segment_size(rounded: usize) -> Option<usize> {
    if rounded <= SMALL_LIMIT {
        Some(SMALL_SEGMENT)
    } else if rounded <= MEDIUM_LIMIT {
        Some(MEDIUM_SEGMENT)
    } else {
        rounded.checked_next_multiple_of(SEGMENT_GRANULE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_to_512_bytes() {
        assert_eq!(round_request(1), Some(512));
        assert_eq!(round_request(512), Some(512));
        assert_eq!(round_request(513), Some(1024));
        assert_eq!(round_request(usize::MAX), None);
    }

    #[test]
    fn segments_by_class() {
        assert_eq!(segment_size(512), Some(SMALL_SEGMENT));
        assert_eq!(segment_size(SMALL_LIMIT), Some(SMALL_SEGMENT));
        assert_eq!(segment_size(SMALL_LIMIT + 512), Some(MEDIUM_SEGMENT));
        assert_eq!(segment_size(MEDIUM_LIMIT), Some(MEDIUM_SEGMENT));
        assert_eq!(segment_size(MEDIUM_LIMIT + 512), Some(12 << 20));
        assert_eq!(segment_size(usize::MAX - 511), None);
        assert_eq!(Class::of(SMALL_LIMIT), Class::Small);
        assert_eq!(Class::of(SMALL_LIMIT + 512), Class::Large);
    }

    #[test]
    fn splitting_keeps_large_remainders_only() {
        assert!(Class::Small.should_split(SMALL_SEGMENT, 512));
        assert!(!Class::Small.should_split(1024, 1024));
        assert!(Class::Large.should_split(MEDIUM_SEGMENT, 2 << 20));
        assert!(!Class::Large.should_split(3 << 20, 2 << 20));
    }
}
