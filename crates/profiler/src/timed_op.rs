//! An operation on the GPU timeline: what both backends (timing events and
//! CUPTI's records) turn a closed scope into, and what reports and traces
//! read.

use std::borrow::Cow;

/// An operation's name: literals cost no allocation.
pub(crate) type Name = Cow<'static, str>;

/// An operation with its GPU start and end, in ns after the timeline's zero
/// (the base event, or CUPTI's clock when the CUPTI backend started).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TimedOp {
    pub(crate) name: Name,
    pub(crate) start_ns: u64,
    pub(crate) end_ns: u64,
    /// How many scopes were open on the stream when this one started.
    pub(crate) depth: u32,
}

impl TimedOp {
    /// Its span as `(start, end)`, the form the statistics merge.
    pub(crate) fn interval(&self) -> (u64, u64) {
        (self.start_ns, self.end_ns)
    }
}
