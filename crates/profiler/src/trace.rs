//! Chrome Trace Event Format (JSON), written by hand: Perfetto
//! (<https://ui.perfetto.dev>) and `chrome://tracing` open it.
//!
//! One process per device (pid = device ordinal), one thread per stream
//! (tid = stream id), named by metadata events; each timed operation is a
//! complete event (`"ph":"X"`) with `ts` and `dur` in microseconds after the
//! profiler's base event.

use crate::timeline::TimedOp;
use std::fmt::Write as _;
use std::io::{self, Write};

/// What one stream contributes to a trace.
pub(crate) struct StreamTrack {
    pub(crate) stream_id: u64,
    pub(crate) ops: Vec<TimedOp>,
}

/// The process (device) the tracks belong to.
pub(crate) struct Process {
    pub(crate) pid: i64,
    pub(crate) name: String,
}

/// Write the whole trace. Operations are sorted per stream by start, a parent
/// before the children it contains, so viewers nest them correctly.
pub(crate) fn write_trace(
    out: &mut dyn Write,
    process: &Process,
    mut tracks: Vec<StreamTrack>,
) -> io::Result<()> {
    tracks.sort_by_key(|t| t.stream_id);
    let mut events: Vec<String> = Vec::new();
    events.push(metadata(process.pid, 0, "process_name", &process.name));
    for (index, track) in tracks.iter_mut().enumerate() {
        let tid = track.stream_id;
        events.push(metadata(
            process.pid,
            tid,
            "thread_name",
            &format!("stream {tid}"),
        ));
        let mut sort = String::new();
        let _ = write!(
            sort,
            r#"{{"name":"thread_sort_index","ph":"M","pid":{},"tid":{tid},"args":{{"sort_index":{index}}}}}"#,
            process.pid
        );
        events.push(sort);
        track
            .ops
            .sort_by(|a, b| (a.start_ns, b.end_ns, a.depth).cmp(&(b.start_ns, a.end_ns, b.depth)));
        for op in &track.ops {
            let mut e = String::with_capacity(128);
            let _ = write!(
                e,
                r#"{{"name":{},"cat":"gpu","ph":"X","ts":{},"dur":{},"pid":{},"tid":{tid},"args":{{"depth":{}}}}}"#,
                json_string(&op.name),
                micros(op.start_ns),
                micros(op.end_ns - op.start_ns),
                process.pid,
                op.depth
            );
            events.push(e);
        }
    }
    out.write_all(b"{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n")?;
    for (i, event) in events.iter().enumerate() {
        let sep = if i + 1 < events.len() { ",\n" } else { "\n" };
        out.write_all(event.as_bytes())?;
        out.write_all(sep.as_bytes())?;
    }
    out.write_all(b"]}\n")?;
    out.flush()
}

fn metadata(pid: i64, tid: u64, kind: &str, name: &str) -> String {
    format!(
        r#"{{"name":"{kind}","ph":"M","pid":{pid},"tid":{tid},"args":{{"name":{}}}}}"#,
        json_string(name)
    )
}

/// Nanoseconds as microseconds with three decimals (exact: no float).
fn micros(ns: u64) -> String {
    format!("{}.{:03}", ns / 1000, ns % 1000)
}

/// A JSON string literal: quotes, backslashes and control characters escaped
/// (RFC 8259 section 7); everything else passes through as UTF-8.
pub(crate) fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0C}' => out.push_str("\\f"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_escaped() {
        assert_eq!(json_string("plain"), r#""plain""#);
        assert_eq!(
            json_string("a\"b\\c\nd\te\u{1}f\u{7f}é"),
            "\"a\\\"b\\\\c\\nd\\te\\u0001f\u{7f}é\""
        );
    }

    #[test]
    fn micros_are_exact() {
        assert_eq!(micros(0), "0.000");
        assert_eq!(micros(1_234_567), "1234.567");
        assert_eq!(micros(999), "0.999");
    }
}
