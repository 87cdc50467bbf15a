//! The Chrome trace parses, has one named track per stream, and its events
//! order and nest as the work did.

mod support;

use cuda_streams_profiler::StreamProfiler;
use driver::Stream;
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::Duration;
use support::{ctx, kernel, spin};

/// A complete event, in microseconds.
#[derive(Debug, Clone)]
struct Complete {
    name: String,
    ts: f64,
    dur: f64,
    depth: u64,
}

fn parse(trace: &str) -> (Vec<Value>, BTreeMap<u64, Vec<Complete>>) {
    let root: Value = serde_json::from_str(trace).expect("the trace is valid JSON");
    let events = root["traceEvents"]
        .as_array()
        .expect("traceEvents is an array")
        .clone();
    let mut tracks: BTreeMap<u64, Vec<Complete>> = BTreeMap::new();
    for e in &events {
        assert!(e["pid"].is_i64() || e["pid"].is_u64(), "{e}");
        assert!(e["tid"].is_u64(), "{e}");
        match e["ph"].as_str().unwrap() {
            "M" => assert!(e["name"].is_string(), "{e}"),
            "X" => {
                assert_eq!(e["cat"], "gpu");
                tracks
                    .entry(e["tid"].as_u64().unwrap())
                    .or_default()
                    .push(Complete {
                        name: e["name"].as_str().unwrap().to_string(),
                        ts: e["ts"].as_f64().unwrap(),
                        dur: e["dur"].as_f64().unwrap(),
                        depth: e["args"]["depth"].as_u64().unwrap(),
                    });
            }
            other => panic!("unexpected phase {other}: {e}"),
        }
    }
    (events, tracks)
}

#[test]
fn the_trace_has_a_track_per_stream_with_nested_ordered_events() {
    let ctx = ctx();
    let spin_kernel = kernel(&ctx, &kernels::TIMING, "spin");
    let streams: Vec<_> = (0..3).map(|_| Stream::new(&ctx).unwrap()).collect();
    let profiler = StreamProfiler::new(&ctx).unwrap();
    profiler.enable();
    for (i, stream) in streams.iter().enumerate() {
        for step in 0..2 {
            let _outer = profiler.scope(stream, "step").unwrap();
            for _ in 0..3 {
                let _inner = profiler.scope(stream, "spin").unwrap();
                spin(stream, &spin_kernel, Duration::from_millis(1 + i as u64));
            }
            if step == 0 {
                // Work in the outer scope after its last child.
                spin(stream, &spin_kernel, Duration::from_millis(1));
            }
        }
    }
    let trace = profiler.to_chrome_trace().unwrap();
    let (events, tracks) = parse(&trace);

    // One thread_name per stream, naming it.
    for stream in &streams {
        let named = events.iter().any(|e| {
            e["ph"] == "M"
                && e["name"] == "thread_name"
                && e["tid"].as_u64() == Some(stream.id())
                && e["args"]["name"] == format!("stream {}", stream.id()).as_str()
        });
        assert!(named, "no thread_name for stream {}", stream.id());
    }
    assert!(events.iter().any(|e| e["name"] == "process_name"));
    assert_eq!(tracks.len(), 3);

    for (i, stream) in streams.iter().enumerate() {
        let track = &tracks[&stream.id()];
        assert_eq!(track.len(), 2 + 6, "{track:?}");
        let outers: Vec<&Complete> = track.iter().filter(|e| e.depth == 0).collect();
        let inners: Vec<&Complete> = track.iter().filter(|e| e.depth == 1).collect();
        assert!(outers.iter().all(|e| e.name == "step"));
        assert!(inners.iter().all(|e| e.name == "spin"));
        // Events appear in start order.
        assert!(track.windows(2).all(|w| w[0].ts <= w[1].ts), "{track:?}");
        // One stream runs its operations one after another.
        for level in [&outers, &inners] {
            for w in level.windows(2) {
                // Half a nanosecond of slack for the decimal-to-float rounding.
                assert!(
                    w[1].ts + 5e-4 >= w[0].ts + w[0].dur,
                    "overlap on one stream: {w:?}"
                );
            }
        }
        // Each inner lies within an outer; three per outer.
        for (k, outer) in outers.iter().enumerate() {
            let children: Vec<_> = inners
                .iter()
                .filter(|c| c.ts + 5e-4 >= outer.ts && c.ts + c.dur <= outer.ts + outer.dur + 5e-4)
                .collect();
            assert_eq!(children.len(), 3, "outer {k} {outer:?} of {track:?}");
            let spin_ms = (1 + i) as f64 * 1e3;
            for c in &children {
                assert!(c.dur >= 0.9 * spin_ms, "{c:?}");
            }
            // The first outer also holds a 1 ms spin after its children.
            let children_us: f64 = children.iter().map(|c| c.dur).sum();
            if k == 0 {
                assert!(outer.dur >= children_us + 900.0, "{outer:?} {children:?}");
            }
        }
    }
}

#[test]
fn names_are_escaped_and_written_to_any_writer() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let profiler = StreamProfiler::new(&ctx).unwrap();
    profiler.enable();
    let name = "say \"hi\" \\ to\nnew lines, tabs\t, \u{1} and ünïcødé";
    let mut buf = driver::DeviceBuffer::<u32>::new_async(&stream, 16).unwrap();
    profiler
        .time(&stream, name, |s| s.memset_u32_async(&mut buf, 3))
        .unwrap()
        .unwrap();
    let mut out = Vec::new();
    profiler.export_chrome_trace(&mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    let (_, tracks) = parse(&text);
    assert_eq!(tracks[&stream.id()][0].name, name);
    assert_eq!(text, profiler.to_chrome_trace().unwrap());
}
