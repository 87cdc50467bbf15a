//! Stream priority classes and their mapping onto a device's real range.

/// A stream's priority class, mapped onto the device's range by [`PriorityRange::value`].
///
/// CUDA numbers priorities so that lower is more urgent: on the H200 the range
/// is 0 (least) to -5 (greatest).
///
/// ```
/// use cuda_streams_driver::{PriorityRange, StreamPriority};
/// let h200 = PriorityRange { least: 0, greatest: -5 };
/// assert_eq!(h200.value(StreamPriority::High), -5);
/// assert_eq!(h200.value(StreamPriority::Normal), -2);
/// assert_eq!(h200.value(StreamPriority::Low), 0);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum StreamPriority {
    /// The device's greatest priority (numerically lowest).
    High,
    /// The midpoint of the range, rounded toward the least priority.
    #[default]
    Normal,
    /// The device's least priority (numerically highest; CUDA's default).
    Low,
}

impl StreamPriority {
    /// All classes, most urgent first.
    pub const ALL: [StreamPriority; 3] = [Self::High, Self::Normal, Self::Low];
}

/// A device's stream priority range, as `cuCtxGetStreamPriorityRange` reports it.
///
/// ```
/// use cuda_streams_driver::{PriorityRange, StreamPriority};
/// let range = PriorityRange { least: 0, greatest: -5 };
/// assert!(range.contains(-3) && !range.contains(1));
/// assert_eq!(range.class_of(-5), StreamPriority::High);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct PriorityRange {
    /// The least priority (numerically largest, usually 0).
    pub least: i32,
    /// The greatest priority (numerically smallest, e.g. -5).
    pub greatest: i32,
}

impl PriorityRange {
    /// The raw priority for a class: `High` = `greatest`, `Low` = `least`,
    /// `Normal` = the midpoint rounded toward `least` (so with a range of
    /// two values `Normal` equals `Low`, and `High` stays strictly above both).
    pub fn value(&self, priority: StreamPriority) -> i32 {
        let (least, greatest) = self.ordered();
        match priority {
            StreamPriority::High => greatest,
            StreamPriority::Low => least,
            // Computed in i64 so that no range can overflow; ceil moves toward least.
            StreamPriority::Normal => {
                let span = i64::from(least) - i64::from(greatest);
                (i64::from(greatest) + (span + 1) / 2) as i32
            }
        }
    }

    /// Whether `value` is a priority the device accepts.
    pub fn contains(&self, value: i32) -> bool {
        let (least, greatest) = self.ordered();
        (greatest..=least).contains(&value)
    }

    /// The class whose value is nearest to `value` (ties go to the less urgent class).
    pub fn class_of(&self, value: i32) -> StreamPriority {
        StreamPriority::ALL
            .into_iter()
            .rev()
            .min_by_key(|class| (i64::from(self.value(*class)) - i64::from(value)).abs())
            .unwrap_or_default()
    }

    /// (least, greatest) with greatest <= least, whatever the driver reported.
    fn ordered(&self) -> (i32, i32) {
        (self.least.max(self.greatest), self.least.min(self.greatest))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_map_onto_ranges() {
        let cases = [
            ((0, -5), (-5, -2, 0)),
            ((0, -1), (-1, 0, 0)),
            ((0, 0), (0, 0, 0)),
            ((0, -2), (-2, -1, 0)),
            ((3, -4), (-4, 0, 3)),
        ];
        for ((least, greatest), (high, normal, low)) in cases {
            let range = PriorityRange { least, greatest };
            assert_eq!(range.value(StreamPriority::High), high, "{range:?}");
            assert_eq!(range.value(StreamPriority::Normal), normal, "{range:?}");
            assert_eq!(range.value(StreamPriority::Low), low, "{range:?}");
        }
    }

    #[test]
    fn classify_round_trips() {
        let range = PriorityRange {
            least: 0,
            greatest: -5,
        };
        for class in StreamPriority::ALL {
            assert_eq!(range.class_of(range.value(class)), class);
        }
    }
}
