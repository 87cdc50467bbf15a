//! Stress: 16 streams driven by 8 threads, 100,000 mixed operations (copies,
//! memsets, host functions, event records, cross-stream waits). No deadlock,
//! no lost callback, every byte verified.

mod common;

use common::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use sys::{CUevent_flags, CUresult};

const STREAMS: usize = 16;
const THREADS: usize = 8;
const OPERATIONS: usize = 100_000;
const SLOT: usize = 1024;
const SOURCE: usize = 64 * 1024;

static CALLBACKS: AtomicUsize = AtomicUsize::new(0);
static MISMATCHES: AtomicUsize = AtomicUsize::new(0);

struct Lane {
    stream: Stream,
    a: DeviceMem,
    b: DeviceMem,
    out: Pinned,
    event: Event,
}

/// A host function that checks, in stream order, that `out` holds what the
/// preceding copies must have put there.
fn verify(table: &sys::Driver, lane: &Lane, len: usize, expected: Expected) {
    let out = lane.out.ptr as usize;
    host_fn(table, lane.stream.raw, move || {
        // SAFETY: the copy into `out` precedes this function on the stream,
        // and only this stream touches this lane's buffer.
        let got = unsafe { std::slice::from_raw_parts(out as *const u8, len) };
        let good = match expected {
            Expected::Byte(value) => got.iter().all(|&b| b == value),
            Expected::Source(at) => {
                // SAFETY: the source is immutable and outlives every stream.
                let want = unsafe { std::slice::from_raw_parts(at as *const u8, len) };
                got == want
            }
        };
        if !good {
            MISMATCHES.fetch_add(1, Ordering::SeqCst);
        }
        CALLBACKS.fetch_add(1, Ordering::SeqCst);
    });
}

#[derive(Clone, Copy)]
enum Expected {
    Byte(u8),
    Source(usize),
}

/// One thread's share: returns (operations, host functions) it enqueued.
fn drive(
    lanes: &[Lane],
    mine: [usize; 2],
    source: &Pinned,
    seed: u64,
    budget: usize,
) -> (usize, usize) {
    let table = table();
    let mut state = seed | 1;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let (mut ops, mut callbacks) = (0, 0);
    while ops < budget {
        let r = next();
        let lane = &lanes[mine[(r & 1) as usize]];
        let len = 1 + (r >> 8) as usize % SLOT;
        let s = lane.stream.raw;
        match (r >> 32) % 10 {
            0..=2 => {
                let value = (r >> 40) as u8;
                // SAFETY: the lane's allocations and buffer hold SLOT bytes.
                unsafe {
                    ok((table.cuMemsetD8Async)(lane.a.ptr, value, len, s));
                    ok((table.cuMemcpyDtoHAsync)(
                        lane.out.void(),
                        lane.a.ptr,
                        len,
                        s,
                    ));
                }
                verify(table, lane, len, Expected::Byte(value));
                ops += 3;
                callbacks += 1;
            }
            3..=5 => {
                let at = source.ptr as usize + (r >> 16) as usize % (SOURCE - SLOT);
                // SAFETY: as above; the source has SLOT bytes from `at`.
                unsafe {
                    ok((table.cuMemcpyHtoDAsync)(
                        lane.a.ptr,
                        at as *const _,
                        len,
                        s,
                    ));
                    ok((table.cuMemcpyDtoDAsync)(lane.b.ptr, lane.a.ptr, len, s));
                    ok((table.cuMemcpyDtoHAsync)(
                        lane.out.void(),
                        lane.b.ptr,
                        len,
                        s,
                    ));
                }
                verify(table, lane, len, Expected::Source(at));
                ops += 4;
                callbacks += 1;
            }
            6 => {
                lane.event.record(s);
                ops += 1;
            }
            7 | 8 => {
                // Wait on any stream's event, including other threads'.
                let other = &lanes[(r >> 20) as usize % STREAMS];
                // SAFETY: live stream and event.
                ok(unsafe { (table.cuStreamWaitEvent)(s, other.event.raw, 0) });
                ops += 1;
            }
            _ => {
                host_fn(table, s, || {
                    CALLBACKS.fetch_add(1, Ordering::SeqCst);
                });
                ops += 1;
                callbacks += 1;
            }
        }
    }
    for &i in &mine {
        lanes[i].stream.sync();
    }
    (ops, callbacks)
}

#[test]
fn sixteen_streams_eight_threads_a_hundred_thousand_operations() {
    let table = table();
    let source = Arc::new(Pinned::new(table, SOURCE));
    source.fill(&random_bytes(0x5EED, SOURCE));
    let lanes: Arc<Vec<Lane>> = Arc::new(
        (0..STREAMS)
            .map(|_| Lane {
                stream: Stream::new(table),
                a: DeviceMem::new(table, SLOT),
                b: DeviceMem::new(table, SLOT),
                out: Pinned::new(table, SLOT),
                event: Event::new(table, CUevent_flags::CU_EVENT_DISABLE_TIMING.0),
            })
            .collect(),
    );
    // The whole run happens on other threads so that a deadlock fails the
    // test after HANG instead of hanging it.
    let (tx, rx) = mpsc::channel();
    let runner = {
        let (lanes, source) = (Arc::clone(&lanes), Arc::clone(&source));
        std::thread::spawn(move || {
            let workers: Vec<_> = (0..THREADS)
                .map(|t| {
                    let (lanes, source) = (Arc::clone(&lanes), Arc::clone(&source));
                    std::thread::spawn(move || {
                        drive(
                            &lanes,
                            [2 * t, 2 * t + 1],
                            &source,
                            0x9E37_79B9 * (t as u64 + 1),
                            OPERATIONS / THREADS,
                        )
                    })
                })
                .collect();
            let totals = workers
                .into_iter()
                .map(|w| w.join().expect("a driving thread panicked"))
                .fold((0, 0), |acc, (o, c)| (acc.0 + o, acc.1 + c));
            let _ = tx.send(totals);
        })
    };
    let (ops, callbacks) = rx
        .recv_timeout(HANG * 3)
        .expect("no deadlock: every thread finished");
    runner.join().unwrap();
    // SAFETY: no arguments.
    ok(unsafe { (table.cuCtxSynchronize)() });
    assert!(ops >= OPERATIONS, "{ops} operations");
    assert_eq!(
        CALLBACKS.load(Ordering::SeqCst),
        callbacks,
        "no lost (or extra) callback"
    );
    assert_eq!(MISMATCHES.load(Ordering::SeqCst), 0, "every copy verified");
    for lane in lanes.iter() {
        expect(lane.stream.query(), CUresult::CUDA_SUCCESS);
    }
    eprintln!("{ops} operations, {callbacks} host functions, all verified");
}
