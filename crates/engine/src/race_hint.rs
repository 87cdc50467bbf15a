//! The message of an operation whose work was refused for a race: inside an
//! operation graph the fix is a dependency between its operations
//! (`.after(id)`), not the event and stream calls the driver suggests to
//! code that enqueues on streams by hand.

use crate::driver;
use std::fmt::Display;

/// "`operation` (`label`) failed: `source`", where a race with an earlier
/// labelled operation (the graph labels each of its own) is followed by the
/// graph's fix.
pub(crate) fn failed(operation: &dyn Display, label: &str, source: &driver::Error) -> String {
    let driver::Error::UnorderedAccess(race) = source else {
        return format!("{operation} ({label:?}) failed: {source}");
    };
    let Some(earlier) = &race.earlier.label else {
        return format!("{operation} ({label:?}) failed: {source}");
    };
    format!(
        "{operation} ({label:?}) failed: {}; order the two operations: build '{label}' with \
         `.after(&[id])`, where id is the `Op::id` of '{earlier}' (or, when '{earlier}' was \
         not enqueued through this graph, make stream {} wait for it with \
         Stream::wait_stream)",
        race.facts(),
        race.later.stream,
    )
}
