//! Two devices: peer-copy bandwidth (`Stream::copy_peer_async`) at 1, 16,
//! 256 and 1024 MiB, NCCL AllReduce bus bandwidth from 8 B to 1 GiB
//! (`collectives::Group` over `Communicator::all_devices`), send/recv
//! bandwidth and all-to-all bus bandwidth at 16 MiB, 256 MiB and 1 GiB,
//! each against the raw calls (`cuMemcpyPeerAsync`; `ncclGroupStart` +
//! `ncclAllReduce`, `ncclSend`, `ncclRecv` + `ncclGroupEnd`) in the same
//! run; and an 8 B AllReduce captured into a CUDA graph against the eager
//! one (one thread per rank). The AllReduce buffers are stream-ordered on
//! each rank's stream (their home, where uses need no tracking); the 8 B row
//! is also measured with plain buffers, which record an event per use.
//!
//! Bus bandwidth is NCCL's: the algorithm bandwidth (bytes / time) times
//! 2 (n - 1) / n, so it compares across rank counts (nccl-tests' `busbw`).
//! The anchor on two H200s (PyTorch 2.11, NCCL 2.28): peer copy
//! 393 GB/s at 1 GiB; AllReduce 330 GB/s at 1 GiB, 295 at 256 MiB, 219 at
//! 16 MiB, 48.6 µs at 8 B.
//!
//! First, the host time of enqueueing an 8 B AllReduce on both ranks against
//! the raw group calls, the devices' time left out (`MULTIGPU_HOST_COST_ONLY=1`
//! stops after it; `MULTIGPU_HOST_COST_SIDE=ours` or `raw` runs one side, for
//! callgrind's instruction counts).
//!
//! Skips, printing why, with fewer than two devices. On the software driver
//! the sizes stop at 16 MiB (a memmove per copy says nothing of a GPU).

use collectives::{Communicator, Group, ReduceOp};
use criterion::Criterion;
use cuda_streams_benches::{
    compare, criterion_summary, figure, per_call_pair, reps_for, run_criterion,
};
use driver::{Context, DeviceBuffer, DeviceMemory, Stream};
use std::sync::Arc;
use std::time::{Duration, Instant};
use sys::nccl::{ncclDataType_t, ncclRedOp_t};

const MIB: usize = 1 << 20;

struct Two {
    ctx: [Arc<Context>; 2],
    streams: [Arc<Stream>; 2],
}

fn two() -> Option<Two> {
    let count = Context::device_count().expect("a driver");
    if count < 2 {
        println!("multigpu bench skipped: needs two devices, the driver reports {count}");
        return None;
    }
    let ctx = [Context::new(0).unwrap(), Context::new(1).unwrap()];
    let streams = [Stream::new(&ctx[0]).unwrap(), Stream::new(&ctx[1]).unwrap()];
    Some(Two { ctx, streams })
}

/// Seconds per call of `enqueue`, from `reps` calls back to back between two
/// synchronisations of every stream, best of 3 batches.
fn per_call(streams: &[&Stream], reps: usize, mut enqueue: impl FnMut()) -> f64 {
    let sync = || Stream::synchronize_all(streams).expect("synchronize");
    enqueue(); // warm-up: lazy set-up (peer access, NCCL channels)
    sync();
    (0..3)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..reps {
                enqueue();
            }
            sync();
            start.elapsed().as_secs_f64() / reps as f64
        })
        .fold(f64::INFINITY, f64::min)
}

/// One in-place Sum AllReduce of `bufs` over both ranks, in one group.
fn group_all_reduce(
    comms: &[Communicator],
    streams: &[Arc<Stream>; 2],
    bufs: &mut [DeviceBuffer<f32>; 2],
) {
    let [a, b] = bufs;
    let mut group = Group::new();
    group
        .all_reduce_in_place(&comms[0], &streams[0], a, ReduceOp::Sum)
        .unwrap();
    group
        .all_reduce_in_place(&comms[1], &streams[1], b, ReduceOp::Sum)
        .unwrap();
    group.end().unwrap();
}

fn sizes(gpu: bool, all: &[usize]) -> Vec<usize> {
    all.iter()
        .copied()
        .filter(|&b| gpu || b <= 16 * MIB)
        .collect()
}

fn peer_copies(t: &Two) {
    let gpu = t.ctx[0].is_gpu();
    for bytes in sizes(gpu, &[MIB, 16 * MIB, 256 * MIB, 1024 * MIB]) {
        let src = DeviceBuffer::<u8>::new(&t.ctx[0], bytes).unwrap();
        let mut dst = DeviceBuffer::<u8>::new(&t.ctx[1], bytes).unwrap();
        let s = &t.streams[1];
        let reps = reps_for(bytes);
        let ours = per_call(&[s], reps, || s.copy_peer_async(&mut dst, &src).unwrap());
        let (d, sp, dp) = (t.ctx[1].driver(), src.device_ptr(), dst.device_ptr());
        let (c0, c1) = (t.ctx[0].as_raw(), t.ctx[1].as_raw());
        let raw = per_call(&[s], reps, || {
            // SAFETY: both buffers hold `bytes` bytes and outlive the
            // synchronisation at the end of the batch.
            let code = unsafe { (d.cuMemcpyPeerAsync)(dp, c1, sp, c0, bytes, s.as_raw()) };
            assert_eq!(code, sys::CUresult::CUDA_SUCCESS);
        });
        let mib = bytes / MIB;
        figure(
            &format!("peer copy {mib} MiB GB/s"),
            bytes as f64 / ours / 1e9,
            "GB/s",
        );
        figure(
            &format!("peer copy {mib} MiB GB/s, raw cuMemcpyPeerAsync"),
            bytes as f64 / raw / 1e9,
            "GB/s",
        );
        if bytes == 1024 * MIB || (!gpu && bytes == 16 * MIB) {
            compare("peer copy vs cuMemcpyPeerAsync", ours * 1e9, raw * 1e9);
        }
    }
}

fn all_reduces(t: &Two) {
    let comms = Communicator::all_devices(&t.ctx).unwrap();
    let nccl_raw = comms.iter().map(Communicator::as_raw).collect::<Vec<_>>();
    let gpu = t.ctx[0].is_gpu();
    let table = comms[0].nccl();
    let all: Vec<usize> = (3..=30)
        .step_by(3)
        .map(|p| 1usize << p)
        .chain([16 * MIB, 256 * MIB])
        .collect();
    let mut all = all;
    all.sort_unstable();
    all.dedup();
    let streams = [&*t.streams[0], &*t.streams[1]];
    for bytes in sizes(gpu, &all) {
        let count = bytes / 4;
        // Stream-ordered on each rank's stream, the buffers' home: uses there
        // need no tracking (see `DeviceBuffer`). Plain buffers record an
        // event per use on every other stream; the 8 B row measures that too.
        let mut bufs = [
            DeviceBuffer::<f32>::new_async(&t.streams[0], count).unwrap(),
            DeviceBuffer::<f32>::new_async(&t.streams[1], count).unwrap(),
        ];
        let reps = reps_for(bytes);
        let ptrs = [bufs[0].device_ptr(), bufs[1].device_ptr()];
        let raw = || {
            // SAFETY: each buffer holds `count` floats of its rank's device
            // and outlives the batch's synchronisation; a group around both
            // ranks, as one thread driving two devices needs.
            unsafe {
                (table.ncclGroupStart)().result().unwrap();
                for rank in 0..2 {
                    let p = ptrs[rank] as usize as *mut std::ffi::c_void;
                    (table.ncclAllReduce)(
                        p,
                        p,
                        count,
                        ncclDataType_t::ncclFloat32,
                        ncclRedOp_t::ncclSum,
                        nccl_raw[rank],
                        t.streams[rank].as_raw(),
                    )
                    .result()
                    .unwrap();
                }
                (table.ncclGroupEnd)().result().unwrap();
            }
            t.ctx[0].force_bind().unwrap();
        };
        let (ours, raw_secs) = per_call_pair(
            &streams,
            reps,
            7,
            || group_all_reduce(&comms, &t.streams, &mut bufs),
            raw,
        );
        let ours_plain = (bytes == 8).then(|| {
            let mut plain = [
                DeviceBuffer::<f32>::new(&t.ctx[0], count).unwrap(),
                DeviceBuffer::<f32>::new(&t.ctx[1], count).unwrap(),
            ];
            per_call_pair(
                &streams,
                reps,
                7,
                || group_all_reduce(&comms, &t.streams, &mut plain),
                raw,
            )
        });
        let raw = raw_secs;
        let bus = |secs: f64| bytes as f64 / secs / 1e9 * 2.0 * (2 - 1) as f64 / 2.0;
        let label = if bytes >= MIB {
            format!("{} MiB", bytes / MIB)
        } else if bytes >= 1024 {
            format!("{} KiB", bytes / 1024)
        } else {
            format!("{bytes} B")
        };
        figure(&format!("all_reduce {label} bus GB/s"), bus(ours), "GB/s");
        figure(
            &format!("all_reduce {label} bus GB/s, raw NCCL"),
            bus(raw),
            "GB/s",
        );
        figure(&format!("all_reduce {label} time"), ours * 1e6, "us");
        if bytes == 8 {
            compare("all_reduce 8 B vs raw NCCL group", ours * 1e9, raw * 1e9);
        }
        if let Some((plain, raw)) = ours_plain {
            compare(
                "all_reduce 8 B, plain buffers (an event per use) vs raw NCCL group",
                plain * 1e9,
                raw * 1e9,
            );
        }
        if bytes == 1 << 30 || (!gpu && bytes == 16 * MIB) {
            compare(
                "all_reduce largest vs raw NCCL group",
                ours * 1e9,
                raw * 1e9,
            );
        }
    }
}

/// Host time of enqueueing one 8 B AllReduce on both ranks (a `Group` of
/// `Communicator::all_devices` ranks against `ncclGroupStart` + two
/// `ncclAllReduce` + `ncclGroupEnd`), the streams drained outside the timed
/// part: what the checks and the bookkeeping cost, whatever the devices
/// take. On the software driver this is the figure that means something.
fn host_cost(t: &Two) {
    let comms = Communicator::all_devices(&t.ctx).unwrap();
    let table = comms[0].nccl();
    let nccl_raw = comms.iter().map(Communicator::as_raw).collect::<Vec<_>>();
    // Stream-ordered on the ranks' streams, as in `all_reduces`.
    let mut bufs = [
        DeviceBuffer::<f32>::new_async(&t.streams[0], 2).unwrap(),
        DeviceBuffer::<f32>::new_async(&t.streams[1], 2).unwrap(),
    ];
    let streams = [&*t.streams[0], &*t.streams[1]];
    let ptrs = [bufs[0].device_ptr(), bufs[1].device_ptr()];
    // `MULTIGPU_HOST_COST_SIDE=ours` (or `raw`) runs one side alone, for
    // instruction counts under callgrind (`--separate-threads=yes`).
    let side = std::env::var("MULTIGPU_HOST_COST_SIDE").ok();
    // Seconds per call, best of 5 batches of 20 x 50 calls, drained after
    // each 50.
    let timed = |name: &str, enqueue: &mut dyn FnMut()| {
        if side.as_deref().is_some_and(|side| side != name) {
            return f64::NAN;
        }
        enqueue();
        Stream::synchronize_all(&streams).unwrap();
        (0..5)
            .map(|_| {
                let mut spent = Duration::ZERO;
                for _ in 0..20 {
                    let start = Instant::now();
                    for _ in 0..50 {
                        enqueue();
                    }
                    spent += start.elapsed();
                    Stream::synchronize_all(&streams).unwrap();
                }
                spent.as_secs_f64() / 1000.0
            })
            .fold(f64::INFINITY, f64::min)
    };
    let ours = timed("ours", &mut || {
        let [a, b] = &mut bufs;
        let mut group = Group::new();
        group
            .all_reduce_in_place(&comms[0], &t.streams[0], a, ReduceOp::Sum)
            .unwrap();
        group
            .all_reduce_in_place(&comms[1], &t.streams[1], b, ReduceOp::Sum)
            .unwrap();
        group.end().unwrap();
    });
    let raw = timed("raw", &mut || {
        // SAFETY: each buffer holds 2 floats of its rank's device and
        // outlives the batch's synchronisation; a group around both ranks.
        unsafe {
            (table.ncclGroupStart)().result().unwrap();
            for rank in 0..2 {
                let p = ptrs[rank] as usize as *mut std::ffi::c_void;
                (table.ncclAllReduce)(
                    p,
                    p,
                    2,
                    ncclDataType_t::ncclFloat32,
                    ncclRedOp_t::ncclSum,
                    nccl_raw[rank],
                    t.streams[rank].as_raw(),
                )
                .result()
                .unwrap();
            }
            (table.ncclGroupEnd)().result().unwrap();
        }
        t.ctx[0].force_bind().unwrap();
    });
    figure("all_reduce 8 B host enqueue", ours * 1e9, "ns");
    figure(
        "all_reduce 8 B host enqueue, raw NCCL group",
        raw * 1e9,
        "ns",
    );
    compare(
        "all_reduce 8 B host enqueue vs raw NCCL group",
        ours * 1e9,
        raw * 1e9,
    );
}

/// "16 MiB", "1 GiB", "8 B".
fn size_label(bytes: usize) -> String {
    if bytes >= 1 << 30 {
        format!("{} GiB", bytes >> 30)
    } else if bytes >= MIB {
        format!("{} MiB", bytes / MIB)
    } else if bytes >= 1024 {
        format!("{} KiB", bytes / 1024)
    } else {
        format!("{bytes} B")
    }
}

/// Rank 0 sends `bytes` to rank 1 (`Group::send` + `Group::recv`) against
/// `ncclGroupStart` + `ncclSend` + `ncclRecv` + `ncclGroupEnd`; bandwidth is
/// bytes over time, as nccl-tests' sendrecv reports it.
fn send_recvs(t: &Two) {
    let comms = Communicator::all_devices(&t.ctx).unwrap();
    let nccl_raw = comms.iter().map(Communicator::as_raw).collect::<Vec<_>>();
    let table = comms[0].nccl();
    let gpu = t.ctx[0].is_gpu();
    let streams = [&*t.streams[0], &*t.streams[1]];
    for bytes in sizes(gpu, &[16 * MIB, 256 * MIB, 1024 * MIB]) {
        let src = DeviceBuffer::<u8>::new(&t.ctx[0], bytes).unwrap();
        let mut dst = DeviceBuffer::<u8>::new(&t.ctx[1], bytes).unwrap();
        let reps = reps_for(bytes);
        let ours = per_call(&streams, reps, || {
            let mut group = Group::new();
            group.send(&comms[0], &t.streams[0], &src, 1).unwrap();
            group.recv(&comms[1], &t.streams[1], &mut dst, 0).unwrap();
            group.end().unwrap();
        });
        let (sp, dp) = (src.device_ptr(), dst.device_ptr());
        let raw = per_call(&streams, reps, || {
            // SAFETY: both buffers hold `bytes` bytes of their rank's
            // device and outlive the batch's synchronisation; one group
            // around the pair, as one thread driving both ranks needs.
            unsafe {
                (table.ncclGroupStart)().result().unwrap();
                (table.ncclSend)(
                    sp as usize as *const std::ffi::c_void,
                    bytes,
                    ncclDataType_t::ncclUint8,
                    1,
                    nccl_raw[0],
                    t.streams[0].as_raw(),
                )
                .result()
                .unwrap();
                (table.ncclRecv)(
                    dp as usize as *mut std::ffi::c_void,
                    bytes,
                    ncclDataType_t::ncclUint8,
                    0,
                    nccl_raw[1],
                    t.streams[1].as_raw(),
                )
                .result()
                .unwrap();
                (table.ncclGroupEnd)().result().unwrap();
            }
            t.ctx[0].force_bind().unwrap();
        });
        let label = size_label(bytes);
        let gbs = |secs: f64| bytes as f64 / secs / 1e9;
        figure(&format!("send/recv {label} GB/s"), gbs(ours), "GB/s");
        figure(
            &format!("send/recv {label} GB/s, raw NCCL"),
            gbs(raw),
            "GB/s",
        );
        compare_named(format!("send/recv {label} vs raw NCCL group"), ours, raw);
    }
}

/// Every rank sends `bytes / 2` to each rank (`Group::all_to_all` on both)
/// against the raw group of one `ncclSend` and one `ncclRecv` per pair;
/// bus bandwidth as nccl-tests' alltoall: bytes / time * (n - 1) / n.
fn all_to_alls(t: &Two) {
    let comms = Communicator::all_devices(&t.ctx).unwrap();
    let nccl_raw = comms.iter().map(Communicator::as_raw).collect::<Vec<_>>();
    let table = comms[0].nccl();
    let gpu = t.ctx[0].is_gpu();
    let streams = [&*t.streams[0], &*t.streams[1]];
    for bytes in sizes(gpu, &[16 * MIB, 256 * MIB, 1024 * MIB]) {
        let send = [
            DeviceBuffer::<u8>::new(&t.ctx[0], bytes).unwrap(),
            DeviceBuffer::<u8>::new(&t.ctx[1], bytes).unwrap(),
        ];
        let mut recv = [
            DeviceBuffer::<u8>::new(&t.ctx[0], bytes).unwrap(),
            DeviceBuffer::<u8>::new(&t.ctx[1], bytes).unwrap(),
        ];
        let reps = reps_for(bytes);
        let ours = per_call(&streams, reps, || {
            let [r0, r1] = &mut recv;
            let mut group = Group::new();
            group
                .all_to_all(&comms[0], &t.streams[0], &send[0], r0)
                .unwrap();
            group
                .all_to_all(&comms[1], &t.streams[1], &send[1], r1)
                .unwrap();
            group.end().unwrap();
        });
        let chunk = bytes / 2;
        let sp = [send[0].device_ptr(), send[1].device_ptr()];
        let rp = [recv[0].device_ptr(), recv[1].device_ptr()];
        let raw = per_call(&streams, reps, || {
            // SAFETY: each buffer holds `bytes` bytes of its rank's device,
            // two chunks of `chunk`, and outlives the batch's
            // synchronisation; one group around every pair.
            unsafe {
                (table.ncclGroupStart)().result().unwrap();
                for rank in 0..2 {
                    for peer in 0..2 {
                        let offset = (peer * chunk) as sys::CUdeviceptr;
                        (table.ncclSend)(
                            (sp[rank] + offset) as usize as *const std::ffi::c_void,
                            chunk,
                            ncclDataType_t::ncclUint8,
                            peer as i32,
                            nccl_raw[rank],
                            t.streams[rank].as_raw(),
                        )
                        .result()
                        .unwrap();
                        (table.ncclRecv)(
                            (rp[rank] + offset) as usize as *mut std::ffi::c_void,
                            chunk,
                            ncclDataType_t::ncclUint8,
                            peer as i32,
                            nccl_raw[rank],
                            t.streams[rank].as_raw(),
                        )
                        .result()
                        .unwrap();
                    }
                }
                (table.ncclGroupEnd)().result().unwrap();
            }
            t.ctx[0].force_bind().unwrap();
        });
        let label = size_label(bytes);
        let bus = |secs: f64| bytes as f64 / secs / 1e9 * (2 - 1) as f64 / 2.0;
        figure(&format!("all_to_all {label} bus GB/s"), bus(ours), "GB/s");
        figure(
            &format!("all_to_all {label} bus GB/s, raw NCCL"),
            bus(raw),
            "GB/s",
        );
        compare_named(format!("all_to_all {label} vs raw NCCL group"), ours, raw);
    }
}

/// A RATIO line for a name made at run time (`compare` takes a `'static`
/// name, for its summary): the few per-size names are leaked once.
fn compare_named(name: String, ours_secs: f64, baseline_secs: f64) {
    compare(
        Box::leak(name.into_boxed_str()),
        ours_secs * 1e9,
        baseline_secs * 1e9,
    );
}

/// An 8 B AllReduce captured into a CUDA graph and replayed
/// (`Communicator::captured`) against the same AllReduce made eagerly, one
/// thread per rank (each rank captures its own stream, as one process per
/// GPU does): per call, the slower rank's time for `reps` calls back to
/// back and one synchronisation, best of 3.
fn captured_all_reduce(t: &Two) {
    const REPS: usize = 1000;
    let id = collectives::UniqueId::new().unwrap();
    let barrier = std::sync::Barrier::new(2);
    let per_rank: Vec<(f64, f64)> = std::thread::scope(|s| {
        let joins: Vec<_> = (0..2)
            .map(|rank| {
                let (ctx, stream, barrier) = (&t.ctx[rank], &t.streams[rank], &barrier);
                s.spawn(move || {
                    let comm = Communicator::init_rank(ctx, 2, &id, rank).unwrap();
                    let buffer = Arc::new(DeviceBuffer::<f32>::new(ctx, 2).unwrap());
                    let mut capture = stream.begin_capture().unwrap();
                    comm.captured(&mut capture)
                        .all_reduce_in_place(stream, &buffer, ReduceOp::Sum)
                        .unwrap();
                    let exec = capture.end().unwrap().instantiate().unwrap();
                    let mut eager = DeviceBuffer::<f32>::new(ctx, 2).unwrap();
                    let time = |f: &mut dyn FnMut()| {
                        f(); // warm-up
                        stream.synchronize().unwrap();
                        (0..3)
                            .map(|_| {
                                barrier.wait();
                                let start = Instant::now();
                                for _ in 0..REPS {
                                    f();
                                }
                                stream.synchronize().unwrap();
                                start.elapsed().as_secs_f64() / REPS as f64
                            })
                            .fold(f64::INFINITY, f64::min)
                    };
                    let captured = time(&mut || exec.launch(stream).unwrap());
                    let eager = time(&mut || {
                        comm.all_reduce_in_place(stream, &mut eager, ReduceOp::Sum)
                            .unwrap()
                    });
                    (captured, eager)
                })
            })
            .collect();
        joins.into_iter().map(|j| j.join().unwrap()).collect()
    });
    let captured = per_rank.iter().map(|r| r.0).fold(0.0, f64::max);
    let eager = per_rank.iter().map(|r| r.1).fold(0.0, f64::max);
    figure("all_reduce 8 B captured, per replay", captured * 1e6, "us");
    figure(
        "all_reduce 8 B eager, one thread per rank",
        eager * 1e6,
        "us",
    );
    compare(
        "all_reduce 8 B captured vs eager",
        captured * 1e9,
        eager * 1e9,
    );
}

fn bench_small_all_reduce(c: &mut Criterion) {
    let Some(t) = two() else { return };
    let comms = Communicator::all_devices(&t.ctx).unwrap();
    let mut bufs = [
        DeviceBuffer::<f32>::new(&t.ctx[0], 2).unwrap(),
        DeviceBuffer::<f32>::new(&t.ctx[1], 2).unwrap(),
    ];
    let mut group = c.benchmark_group("multigpu");
    group.measurement_time(Duration::from_secs(2));
    group.bench_function("all_reduce 8 B, enqueue + synchronize", |b| {
        b.iter(|| {
            let [x, y] = &mut bufs;
            let mut g = Group::new();
            g.all_reduce_in_place(&comms[0], &t.streams[0], x, ReduceOp::Sum)
                .unwrap();
            g.all_reduce_in_place(&comms[1], &t.streams[1], y, ReduceOp::Sum)
                .unwrap();
            g.end().unwrap();
            Stream::synchronize_all(&[&t.streams[0], &t.streams[1]]).unwrap();
        })
    });
    group.finish();
}

fn main() {
    if std::env::var_os("MULTIGPU_HOST_COST_ONLY").is_none() {
        run_criterion(&[bench_small_all_reduce]);
    }
    if let Some(t) = two() {
        host_cost(&t);
        if std::env::var_os("MULTIGPU_HOST_COST_ONLY").is_some() {
            return;
        }
        peer_copies(&t);
        all_reduces(&t);
        send_recvs(&t);
        all_to_alls(&t);
        captured_all_reduce(&t);
    }
    criterion_summary();
}
