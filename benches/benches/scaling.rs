//! The multi-GPU table by device count: every device the driver reports
//! (`SCALE_DEVICES=N` takes the first N), one thread driving all ranks.
//!
//! - AllReduce bus bandwidth at 16 MiB, 256 MiB and 1 GiB, and 8 B
//!   latency (`collectives::Group` over `Communicator::all_devices`);
//! - all-to-all bus bandwidth at 256 MiB;
//! - the peer-copy matrix: `Stream::copy_peer_async` of 1 GiB from every
//!   device to every other.
//!
//! Each against the raw calls in the same run, their batches alternating:
//! `ncclGroupStart`, one `ncclAllReduce` or `ncclSend`/`ncclRecv` per rank,
//! then `ncclGroupEnd`; `cuMemcpyPeerAsync`. Bus bandwidth is NCCL's
//! (nccl-tests' `busbw`): AllReduce moves bytes x 2 (n - 1) / n, all-to-all
//! bytes x (n - 1) / n. Lines are prefixed `n=N` so that runs on machines of
//! several sizes make one table (`docs/multi-gpu.md`); PyTorch's side is
//! `benches/anchors/torch_scale.py`.
//!
//! The AllReduce buffers are stream-ordered on each rank's stream (uses
//! there need no tracking). Skips, printing why, with fewer than two
//! devices. On the software driver the sizes stop at 16 MiB and the peer
//! copies are 16 MiB (a memmove says nothing of a GPU).

use collectives::{Communicator, Group, ReduceOp};
use cuda_streams_benches::{compare, figure, per_call_pair, reps_for};
use driver::{Context, DeviceBuffer, DeviceMemory, Stream};
use std::ffi::c_void;
use std::sync::Arc;
use sys::nccl::{ncclDataType_t, ncclRedOp_t};

const MIB: usize = 1 << 20;

/// The devices of the run, a context and a stream on each.
struct Devices {
    ctx: Vec<Arc<Context>>,
    streams: Vec<Arc<Stream>>,
}

impl Devices {
    fn open() -> Option<Self> {
        let count = usize::try_from(Context::device_count().expect("a driver")).unwrap_or(0);
        let wanted = std::env::var("SCALE_DEVICES")
            .ok()
            .map(|v| v.parse::<usize>().expect("SCALE_DEVICES is a number"))
            .unwrap_or(count);
        if count < 2 || wanted < 2 || wanted > count {
            println!(
                "scaling bench skipped: needs two devices or more, the driver reports {count}, SCALE_DEVICES asks {wanted}"
            );
            return None;
        }
        let ctx: Vec<_> = (0..wanted as i32)
            .map(|d| Context::new(d).unwrap())
            .collect();
        let streams = ctx.iter().map(|c| Stream::new(c).unwrap()).collect();
        Some(Self { ctx, streams })
    }

    fn n(&self) -> usize {
        self.ctx.len()
    }

    fn gpu(&self) -> bool {
        self.ctx[0].is_gpu()
    }

    fn stream_refs(&self) -> Vec<&Stream> {
        self.streams.iter().map(|s| &**s).collect()
    }
}

fn label(bytes: usize) -> String {
    if bytes >= 1 << 30 {
        format!("{} GiB", bytes >> 30)
    } else if bytes >= MIB {
        format!("{} MiB", bytes / MIB)
    } else {
        format!("{bytes} B")
    }
}

/// A RATIO line for a name made at run time (`compare` keeps `'static`
/// names for its summary): the few names are leaked once.
fn compare_named(name: String, ours_secs: f64, raw_secs: f64) {
    compare(
        Box::leak(name.into_boxed_str()),
        ours_secs * 1e9,
        raw_secs * 1e9,
    );
}

fn all_reduces(d: &Devices, comms: &[Communicator]) {
    let n = d.n();
    let table = comms[0].nccl();
    let nccl_raw: Vec<_> = comms.iter().map(Communicator::as_raw).collect();
    let streams = d.stream_refs();
    let sizes: &[usize] = if d.gpu() {
        &[8, 16 * MIB, 256 * MIB, 1 << 30]
    } else {
        &[8, 16 * MIB]
    };
    for &bytes in sizes {
        let count = bytes / 4;
        let mut bufs: Vec<DeviceBuffer<f32>> = d
            .streams
            .iter()
            .map(|s| DeviceBuffer::new_async(s, count).unwrap())
            .collect();
        let ptrs: Vec<_> = bufs.iter().map(|b| b.device_ptr()).collect();
        let raw = || {
            // SAFETY: each buffer holds `count` floats of its rank's device
            // and outlives the batch's synchronisation; one group around
            // every rank, as one thread driving several devices needs.
            unsafe {
                (table.ncclGroupStart)().result().unwrap();
                for rank in 0..n {
                    let p = ptrs[rank] as usize as *mut c_void;
                    (table.ncclAllReduce)(
                        p,
                        p,
                        count,
                        ncclDataType_t::ncclFloat32,
                        ncclRedOp_t::ncclSum,
                        nccl_raw[rank],
                        d.streams[rank].as_raw(),
                    )
                    .result()
                    .unwrap();
                }
                (table.ncclGroupEnd)().result().unwrap();
            }
            d.ctx[0].force_bind().unwrap();
        };
        let ours = || {
            let mut group = Group::new();
            for ((comm, stream), buf) in comms.iter().zip(&d.streams).zip(bufs.iter_mut()) {
                group
                    .all_reduce_in_place(comm, stream, buf, ReduceOp::Sum)
                    .unwrap();
            }
            group.end().unwrap();
        };
        let (ours, raw) = per_call_pair(&streams, reps_for(bytes), 5, ours, raw);
        let size = label(bytes);
        if bytes == 8 {
            figure(&format!("n={n} all_reduce 8 B"), ours * 1e6, "us");
            figure(&format!("n={n} all_reduce 8 B, raw NCCL"), raw * 1e6, "us");
        } else {
            let bus = |secs: f64| bytes as f64 / secs / 1e9 * 2.0 * (n - 1) as f64 / n as f64;
            figure(&format!("n={n} all_reduce {size} bus"), bus(ours), "GB/s");
            figure(
                &format!("n={n} all_reduce {size} bus, raw NCCL"),
                bus(raw),
                "GB/s",
            );
        }
        compare_named(
            format!("n={n} all_reduce {size} vs raw NCCL group"),
            ours,
            raw,
        );
    }
}

fn all_to_all(d: &Devices, comms: &[Communicator]) {
    let n = d.n();
    let table = comms[0].nccl();
    let nccl_raw: Vec<_> = comms.iter().map(Communicator::as_raw).collect();
    let streams = d.stream_refs();
    // A multiple of n chunks of whole elements.
    let bytes = if d.gpu() { 256 * MIB } else { 16 * MIB } / n * n;
    let send: Vec<DeviceBuffer<u8>> = d
        .ctx
        .iter()
        .map(|c| DeviceBuffer::new(c, bytes).unwrap())
        .collect();
    let mut recv: Vec<DeviceBuffer<u8>> = d
        .ctx
        .iter()
        .map(|c| DeviceBuffer::new(c, bytes).unwrap())
        .collect();
    let chunk = bytes / n;
    let sp: Vec<_> = send.iter().map(|b| b.device_ptr()).collect();
    let rp: Vec<_> = recv.iter().map(|b| b.device_ptr()).collect();
    let raw = || {
        // SAFETY: each buffer holds `bytes` bytes of its rank's device, n
        // chunks of `chunk`, and outlives the batch's synchronisation; one
        // group around every pair.
        unsafe {
            (table.ncclGroupStart)().result().unwrap();
            for rank in 0..n {
                for peer in 0..n {
                    let offset = (peer * chunk) as sys::CUdeviceptr;
                    (table.ncclSend)(
                        (sp[rank] + offset) as usize as *const c_void,
                        chunk,
                        ncclDataType_t::ncclUint8,
                        peer as i32,
                        nccl_raw[rank],
                        d.streams[rank].as_raw(),
                    )
                    .result()
                    .unwrap();
                    (table.ncclRecv)(
                        (rp[rank] + offset) as usize as *mut c_void,
                        chunk,
                        ncclDataType_t::ncclUint8,
                        peer as i32,
                        nccl_raw[rank],
                        d.streams[rank].as_raw(),
                    )
                    .result()
                    .unwrap();
                }
            }
            (table.ncclGroupEnd)().result().unwrap();
        }
        d.ctx[0].force_bind().unwrap();
    };
    let ours = || {
        let mut group = Group::new();
        for (((comm, stream), s), r) in comms.iter().zip(&d.streams).zip(&send).zip(recv.iter_mut())
        {
            group.all_to_all(comm, stream, s, r).unwrap();
        }
        group.end().unwrap();
    };
    let (ours, raw) = per_call_pair(&streams, reps_for(bytes), 5, ours, raw);
    let size = label(bytes);
    let bus = |secs: f64| bytes as f64 / secs / 1e9 * (n - 1) as f64 / n as f64;
    figure(&format!("n={n} all_to_all {size} bus"), bus(ours), "GB/s");
    figure(
        &format!("n={n} all_to_all {size} bus, raw NCCL"),
        bus(raw),
        "GB/s",
    );
    compare_named(
        format!("n={n} all_to_all {size} vs raw NCCL group"),
        ours,
        raw,
    );
}

/// Every ordered pair of devices: a copy of `bytes` on the destination's
/// stream, ours against `cuMemcpyPeerAsync`. One `MATRIX` line per source.
fn peer_matrix(d: &Devices) {
    let n = d.n();
    let bytes = if d.gpu() { 1 << 30 } else { 16 * MIB };
    let size = label(bytes);
    let src: Vec<DeviceBuffer<u8>> = d
        .ctx
        .iter()
        .map(|c| DeviceBuffer::new(c, bytes).unwrap())
        .collect();
    let mut worst: f64 = f64::INFINITY;
    for (from, source) in src.iter().enumerate() {
        let mut row = Vec::with_capacity(n);
        for to in 0..n {
            if from == to {
                row.push("     -".to_string());
                continue;
            }
            let mut dst = DeviceBuffer::<u8>::new(&d.ctx[to], bytes).unwrap();
            let s = &d.streams[to];
            let (drv, sp, dp) = (d.ctx[to].driver(), source.device_ptr(), dst.device_ptr());
            let (cf, ct) = (d.ctx[from].as_raw(), d.ctx[to].as_raw());
            let raw = || {
                // SAFETY: both buffers hold `bytes` bytes of their devices
                // and outlive the batch's synchronisation; the stream is
                // the destination context's.
                let code = unsafe { (drv.cuMemcpyPeerAsync)(dp, ct, sp, cf, bytes, s.as_raw()) };
                assert_eq!(code, sys::CUresult::CUDA_SUCCESS);
            };
            let ours = || s.copy_peer_async(&mut dst, source).unwrap();
            let (ours, raw) = per_call_pair(&[s], reps_for(bytes), 5, ours, raw);
            let gbs = bytes as f64 / ours / 1e9;
            worst = worst.min(raw / ours);
            figure(&format!("n={n} copy_peer {size} {from}->{to}"), gbs, "GB/s");
            figure(
                &format!("n={n} copy_peer {size} {from}->{to}, raw cuMemcpyPeerAsync"),
                bytes as f64 / raw / 1e9,
                "GB/s",
            );
            row.push(format!("{gbs:6.1}"));
        }
        println!(
            "MATRIX n={n} copy_peer {size} from {from}: {} GB/s",
            row.join(" ")
        );
    }
    figure(
        &format!("n={n} copy_peer {size}: slowest pair's speed against raw (1 = equal)"),
        worst,
        "x",
    );
}

fn main() {
    let Some(d) = Devices::open() else {
        return;
    };
    let comms = Communicator::all_devices(&d.ctx).unwrap();
    all_reduces(&d, &comms);
    all_to_all(&d, &comms);
    peer_matrix(&d);
}
