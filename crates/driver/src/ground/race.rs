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
    /// The kernel, for a checked kernel launch whose argument touched the
    /// bytes (known for the operation being enqueued).
    pub kernel: Option<String>,
    /// The kernel argument (its position, from 0) that touched the bytes,
    /// when known.
    pub argument: Option<usize>,
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
    /// The ordering policy that found the race (`check`, `report`, or
    /// `auto` where it could not repair it), by name.
    pub policy: &'static str,
    /// Whether it was found on a GPU, where the check is off by default.
    pub on_gpu: bool,
}

impl fmt::Display for RaceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.label {
            Some(label) => write!(f, "{} '{label}'", self.what)?,
            None => write!(f, "{}", self.what)?,
        }
        if let Some(kernel) = &self.kernel {
            write!(f, " of kernel `{kernel}`")?;
        }
        if let Some(argument) = self.argument {
            write!(f, " through argument {argument}")?;
        }
        let access = if self.writes { "writes" } else { "reads" };
        write!(
            f,
            " ({access}) on stream {} (device {})",
            self.stream, self.device
        )
    }
}

impl Race {
    /// What happened, without a fix: the two operations, the bytes they
    /// share and the policy that found it. The engine words its own fix
    /// (`.after(id)`) after this; [`Display`](fmt::Display) adds the
    /// streams' fix.
    ///
    /// ```
    /// use cuda_streams_driver::{Race, RaceOp};
    /// let op = |what, label: &str, stream, writes| RaceOp {
    ///     what, label: Some(label.into()), stream, device: 0, writes, kernel: None, argument: None,
    /// };
    /// let race = Race {
    ///     earlier: op("kernel launch", "produce", 1, true),
    ///     later: RaceOp { kernel: Some("scale".into()), argument: Some(2), ..op("kernel launch", "consume", 2, false) },
    ///     buffer: 0x1000, buffer_bytes: 64, overlap: 0..64, policy: "check", on_gpu: false,
    /// };
    /// assert!(race.facts().contains("kernel launch 'consume' of kernel `scale` through argument 2 (reads)"));
    /// assert!(race.to_string().contains("Stream::wait_stream"));
    /// ```
    pub fn facts(&self) -> String {
        let mut text = format!(
            "unordered access: {} and earlier {} both touch bytes {}..{} of buffer {:#x} \
             ({} bytes) with no order between them (found by ordering policy {}",
            self.later,
            self.earlier,
            self.overlap.start,
            self.overlap.end,
            self.buffer,
            self.buffer_bytes,
            self.policy,
        );
        if self.on_gpu {
            text.push_str(
                "; on a GPU this check is off unless CUDA_STREAMS_ORDERING or \
                 Context::set_ordering turns it on",
            );
        }
        text.push(')');
        text
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
            "{}; stream {} must wait for an event recorded after {earlier} on stream {} \
             (Stream::wait_stream, or Event::record then Stream::wait_event)",
            self.facts(),
            self.later.stream,
            self.earlier.stream,
        )
    }
}
