//! The host pool's size classes: eight per power of two, so a block wastes
//! at most an eighth of the request (PyTorch's host allocator rounds to the
//! next power of two, which turns 20.4 GiB into 32 GiB).
//!
//! A request of `b` bytes with `2^p <= b < 2^(p+1)` is rounded up to a
//! multiple of `2^(p-3)`: the eight classes between two powers of two are
//! `2^p * (8 + k) / 8`, and the rounding adds less than `2^(p-3) <= b / 8`.
//! Below [`HOST_MIN_STEP`]` * 8` bytes the step stays [`HOST_MIN_STEP`].

/// The smallest step between classes, and the smallest class.
pub const HOST_MIN_STEP: usize = 64;

/// The class (block size) serving a request of `bytes`: the smallest of
/// eight steps per power of two that holds it. `None` for 0 bytes or when
/// rounding overflows. Pure arithmetic, so it is checked without
/// allocating:
///
/// ```
/// use cuda_streams_allocator::host_size_class;
/// const GIB: usize = 1 << 30;
/// let request = 20 * GIB + 2 * GIB / 5; // 20.4 GiB
/// let class = host_size_class(request).unwrap();
/// assert_eq!(class, 22 * GIB); // under 23 GiB; a power of two would be 32
/// assert!(class - request <= request / 8);
/// assert_eq!(host_size_class(1000), Some(1024));
/// assert_eq!(host_size_class(1025), Some(1152));
/// ```
pub fn host_size_class(bytes: usize) -> Option<usize> {
    if bytes == 0 {
        return None;
    }
    let power = usize::BITS - 1 - bytes.leading_zeros(); // 2^power <= bytes
    let step = (1usize << power >> 3).max(HOST_MIN_STEP);
    bytes.checked_next_multiple_of(step)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waste_is_at_most_an_eighth_over_a_wide_range() {
        // Every size near each power of two and a spread in between.
        for power in 9..(usize::BITS - 4) {
            let base = 1usize << power;
            for bytes in [base - 1, base, base + 1, base + base / 3, 2 * base - 1] {
                let class = host_size_class(bytes).unwrap();
                assert!(class >= bytes, "{bytes} -> {class}");
                assert!(
                    class - bytes <= bytes / 8,
                    "{bytes} -> {class} wastes more than 1/8"
                );
                // A class is its own class: blocks go back to the list they came from.
                assert_eq!(host_size_class(class), Some(class), "{class}");
            }
        }
    }

    // The eight classes above 4 KiB up to and including 8 KiB.
    #[test]
    fn eight_classes_per_power_of_two() {
        let classes: std::collections::BTreeSet<usize> = (4097..=8192)
            .map(|bytes| host_size_class(bytes).unwrap())
            .collect();
        let expected: Vec<usize> = (1..=8).map(|k| 4096 + 512 * k).collect();
        assert_eq!(classes.into_iter().collect::<Vec<_>>(), expected);
    }

    #[test]
    fn a_20_4_gib_request_reserves_under_23_gib() {
        const GIB: usize = 1 << 30;
        let request = 20 * GIB + 2 * GIB / 5;
        let class = host_size_class(request).unwrap();
        assert!(class < 23 * GIB, "{class}");
        assert!(class >= request);
    }

    #[test]
    fn small_zero_and_overflowing_requests() {
        assert_eq!(host_size_class(0), None);
        assert_eq!(host_size_class(1), Some(HOST_MIN_STEP));
        assert_eq!(
            host_size_class(HOST_MIN_STEP * 8 + 1),
            Some(HOST_MIN_STEP * 9)
        );
        assert_eq!(host_size_class(usize::MAX), None);
        assert_eq!(host_size_class((1 << 63) + 1), Some((1 << 63) + (1 << 60)));
    }
}
