//! What a report says: two operations, the bytes they share, and the edge
//! that would order them. Plain data that the stream-order tracker fills
//! in, so the error that carries a race stands on the ground with it.

use std::fmt;

/// One of the two operations of a [`Race`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RaceOp {
    /// What it is: "kernel launch", "copy", "memset", "peer copy",
    /// "graph launch", "external work" (collectives and other libraries'
    /// work through [`crate::Stream::prepare_uses`]).
    pub what: &'static str,
    /// The label it was enqueued under (an engine operation's label), if any
    /// ([`crate::order::labelled`]).
    pub label: Option<String>,
    /// The [`crate::Stream::id`] of its stream.
    pub stream: u64,
    /// The device ordinal of its stream.
    pub device: i32,
    /// Whether it writes the bytes (a read otherwise).
    pub writes: bool,
}

/// Two operations on different streams that touch the same bytes, at least
/// one of them writing, with no happens-before path between them: the
/// error of [`crate::Error::UnorderedAccess`] under
/// [`OrderPolicy::Check`](crate::OrderPolicy::Check), and the tracing event
/// under [`OrderPolicy::Report`](crate::OrderPolicy::Report).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Race {
    /// The operation enqueued first.
    pub earlier: RaceOp,
    /// The operation being enqueued, which was refused (or reported).
    pub later: RaceOp,
    /// The start address of the buffer as the later operation uses it.
    pub buffer: u64,
    /// Its size in bytes, as the later operation uses it.
    pub buffer_bytes: usize,
    /// The overlapping bytes, as offsets into that buffer.
    pub overlap: std::ops::Range<u64>,
}

impl fmt::Display for RaceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.label {
            Some(label) => write!(f, "{} '{label}'", self.what)?,
            None => write!(f, "{}", self.what)?,
        }
        let access = if self.writes { "writes" } else { "reads" };
        write!(
            f,
            " ({access}) on stream {} (device {})",
            self.stream, self.device
        )
    }
}

impl fmt::Display for Race {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let earlier = match &self.earlier.label {
            Some(label) => format!("operation '{label}'"),
            None => format!("the {}", self.earlier.what),
        };
        write!(
            f,
            "unordered access: {} and earlier {} both touch bytes {}..{} of buffer {:#x} ({} bytes) \
             with no order between them; stream {} must wait for an event recorded after {earlier} \
             on stream {} (Stream::wait_stream, or Event::record then Stream::wait_event)",
            self.later,
            self.earlier,
            self.overlap.start,
            self.overlap.end,
            self.buffer,
            self.buffer_bytes,
            self.later.stream,
            self.earlier.stream,
        )
    }
}
