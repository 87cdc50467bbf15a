//! The Chrome trace parses, has one named track per stream, and its events
//! order and nest as the work did.

mod support;

use cuda_streams_profiler::StreamProfiler;
use cuda_streams_profiler::allocator::StreamOrderedAllocator;
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
            "C" => {
                assert_eq!(e["cat"], "memory", "{e}");
                assert!(e["ts"].as_f64().is_some(), "{e}");
                assert!(e["args"]["allocated"].is_u64(), "{e}");
                assert!(e["args"]["reserved"].is_u64(), "{e}");
            }
            "i" => {
                assert_eq!(e["cat"], "memory", "{e}");
                assert_eq!(e["s"], "t", "{e}");
                assert!(e["args"]["bytes"].is_u64(), "{e}");
                assert!(e["args"]["address"].as_str().unwrap().starts_with("0x"));
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

#[test]
fn the_trace_has_memory_counter_tracks_beside_the_stream_tracks() {
    let ctx = ctx();
    let spin_kernel = kernel(&ctx, &kernels::TIMING, "spin");
    let (a, b) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let allocator = StreamOrderedAllocator::new(&ctx).unwrap();
    let profiler = StreamProfiler::new(&ctx).unwrap();
    profiler.track_memory(&allocator).unwrap();
    // Before enabling: not on the timeline.
    drop(allocator.allocate_for_stream(&a, 1 << 10).unwrap());
    profiler.enable();

    let sizes = [1usize << 20, 3 << 20, 5 << 20];
    let mut held = Vec::new();
    for &bytes in &sizes {
        let block = allocator.allocate_for_stream(&a, bytes).unwrap();
        profiler
            .time(&a, "spin", |s| {
                spin(s, &spin_kernel, Duration::from_millis(2))
            })
            .unwrap();
        held.push(block);
    }
    // After the GPU finished the spins (the host waits for it here), so
    // after them on the timeline. A stream with memory and no scope still
    // gets a named track.
    a.synchronize().unwrap();
    let on_b = allocator.allocate_for_stream(&b, 4096).unwrap();
    drop(held);
    drop(on_b);

    let trace = profiler.to_chrome_trace().unwrap();
    let (events, tracks) = parse(&trace);
    assert_eq!(tracks[&a.id()].len(), sizes.len());
    let counters = |name: &str| -> Vec<(f64, u64, u64)> {
        events
            .iter()
            .filter(|e| e["ph"] == "C" && e["name"] == name)
            .map(|e| {
                (
                    e["ts"].as_f64().unwrap(),
                    e["args"]["allocated"].as_u64().unwrap(),
                    e["args"]["reserved"].as_u64().unwrap(),
                )
            })
            .collect()
    };
    let device = counters(&format!("GPU {} memory", ctx.ordinal()));
    let stream_a = counters(&format!("stream {} memory", a.id()));
    let stream_b = counters(&format!("stream {} memory", b.id()));
    // 3 + 1 allocations and as many frees while enabled.
    assert_eq!(device.len(), 8, "{device:?}");
    assert_eq!((stream_a.len(), stream_b.len()), (6, 2));
    // In time order; every value as the allocator saw it.
    assert!(device.windows(2).all(|w| w[0].0 <= w[1].0), "{device:?}");
    let total: u64 = sizes.iter().map(|&s| s as u64).sum::<u64>() + 4096;
    assert_eq!(device.iter().map(|c| c.1).max(), Some(total));
    assert_eq!(device.last().unwrap().1, 0);
    assert!(
        device.iter().all(|c| c.2 >= c.1),
        "reserved below allocated: {device:?}"
    );
    assert_eq!(stream_a[2].1, sizes.iter().sum::<usize>() as u64);
    // The memory events sit on the same timeline as the scopes: host
    // instants mapped onto the GPU clock. The allocation on b came after the
    // host saw the last spin finish.
    let last = tracks[&a.id()]
        .iter()
        .map(|c| c.ts + c.dur)
        .fold(0.0, f64::max);
    assert!(stream_b[0].0 + 1.0 >= last, "{stream_b:?} after {last}");
    assert!(stream_a[0].0 < last);
    // Allocations and frees as instant events on their streams' tracks.
    let instants: Vec<_> = events.iter().filter(|e| e["ph"] == "i").collect();
    assert_eq!(instants.len(), 8);
    assert!(
        instants
            .iter()
            .any(|e| e["name"] == "alloc 3.00 MiB" && e["tid"] == a.id()),
        "{instants:?}"
    );
    let named = |tid: u64| {
        events
            .iter()
            .any(|e| e["ph"] == "M" && e["name"] == "thread_name" && e["tid"] == tid)
    };
    assert!(named(a.id()) && named(b.id()));
}
