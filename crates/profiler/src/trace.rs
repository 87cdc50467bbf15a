//! Chrome Trace Event Format (JSON), written by hand: Perfetto
//! (<https://ui.perfetto.dev>) and `chrome://tracing` open it.
//!
//! One process per device (pid = device ordinal), one thread per stream
//! (tid = stream id), named by metadata events; each timed operation is a
//! complete event (`"ph":"X"`) with `ts` and `dur` in microseconds after the
//! profiler's base event.
//!
//! The memory timeline: per device a counter track `GPU <n> memory` and per
//! stream `stream <id> memory`, each with `allocated` and `reserved` bytes
//! (counter events, `"ph":"C"`), and every allocation and free as an instant
//! event (`"ph":"i"`, `"cat":"memory"`) on its stream's track.

use crate::memory::MemorySample;
use crate::timed_op::TimedOp;
use allocator::MemoryEventKind;
use driver::format_bytes;
use std::collections::BTreeSet;
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
    mut memory: Vec<MemorySample>,
) -> io::Result<()> {
    // Streams seen only by the allocator get a (timing-less) track too.
    let timed: BTreeSet<u64> = tracks.iter().map(|t| t.stream_id).collect();
    let memory_only: BTreeSet<u64> = memory
        .iter()
        .map(|m| m.event.stream_id)
        .filter(|id| !timed.contains(id))
        .collect();
    tracks.extend(memory_only.into_iter().map(|stream_id| StreamTrack {
        stream_id,
        ops: Vec::new(),
    }));
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
    memory.sort_by_key(|m| m.ns);
    let mut devices = BTreeSet::new();
    for sample in &memory {
        let e = &sample.event;
        let pid = i64::from(e.device);
        if pid != process.pid && devices.insert(pid) {
            events.push(metadata(
                pid,
                0,
                "process_name",
                &format!("GPU {pid} memory"),
            ));
        }
        let ts = micros(sample.ns);
        events.push(counter(
            pid,
            &format!("GPU {pid} memory"),
            &ts,
            e.allocated_bytes,
            e.reserved_bytes,
        ));
        events.push(counter(
            pid,
            &format!("stream {} memory", e.stream_id),
            &ts,
            e.stream_allocated_bytes,
            e.stream_reserved_bytes,
        ));
        let what = match e.kind {
            MemoryEventKind::Alloc => "alloc",
            MemoryEventKind::Free => "free",
            _ => "memory",
        };
        let mut instant = String::with_capacity(160);
        let _ = write!(
            instant,
            r#"{{"name":{},"cat":"memory","ph":"i","s":"t","ts":{ts},"pid":{pid},"tid":{},"args":{{"address":"{:#x}","bytes":{}}}}}"#,
            json_string(&format!("{what} {}", format_bytes(e.bytes as u64))),
            e.stream_id,
            e.address,
            e.bytes
        );
        events.push(instant);
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

/// A counter event: one track per name, one series per argument.
fn counter(pid: i64, name: &str, ts: &str, allocated: usize, reserved: usize) -> String {
    format!(
        r#"{{"name":{},"cat":"memory","ph":"C","ts":{ts},"pid":{pid},"tid":0,"args":{{"allocated":{allocated},"reserved":{reserved}}}}}"#,
        json_string(name)
    )
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
