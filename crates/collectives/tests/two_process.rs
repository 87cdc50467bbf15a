//! Two ranks that meet through a unique id sent over a TCP socket on
//! localhost, as ranks on different hosts would: rank 0 makes the id and
//! listens, rank 1 connects and reads it, both make their communicator
//! (`ncclCommInitRank`) and all-reduce, each checking the result.
//!
//! On GPUs rank 1 is a second process (this test binary again, running the
//! ignored `rank_one` test). The software NCCL spans the threads of one
//! process only, so on the software driver rank 1 is a thread; the id still
//! travels through the socket. Two processes on the software driver fail at
//! once, each saying that the software NCCL spans one process.

use cuda_streams_collectives::driver::{Context, DeviceBuffer, Stream};
use cuda_streams_collectives::{Communicator, Error, ReduceOp, Rendezvous, Store, UniqueId};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// Where rank 1 finds rank 0, set for the child process.
const ADDR_ENV: &str = "CUDA_STREAMS_TEST_RANK0_ADDR";

/// One rank's whole life: join, all-reduce `[rank + 1; N]`, check the sum.
fn rank_main(rank: usize, id: &UniqueId) {
    let ctx = Context::new(rank as i32).unwrap();
    let comm = Communicator::init_rank(&ctx, 2, id, rank).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let mut data = DeviceBuffer::from_slice(&stream, &[rank as f32 + 1.0; 4096]).unwrap();
    comm.all_reduce_in_place(&stream, &mut data, ReduceOp::Sum)
        .unwrap();
    assert_eq!(data.to_vec(&stream).unwrap(), vec![3.0; 4096]);
    comm.async_error().unwrap();
}

/// Rank 1: read the id from rank 0's socket, then run.
fn rank_one_at(addr: &str) {
    let mut socket = TcpStream::connect(addr).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut bytes = [0u8; 128];
    socket.read_exact(&mut bytes).unwrap();
    rank_main(1, &UniqueId::from_bytes(&bytes).unwrap());
    socket.write_all(b"done").unwrap();
}

#[test]
#[ignore = "rank 1 of two_ranks_meet_through_a_unique_id_sent_over_tcp, run by it in a child process"]
fn rank_one() {
    let addr = std::env::var(ADDR_ENV).expect("run by the two-rank test, which sets the address");
    rank_one_at(&addr);
}

#[test]
fn two_ranks_meet_through_a_unique_id_sent_over_tcp() {
    let count = Context::device_count().unwrap();
    if count < 2 {
        eprintln!("skipped: needs two devices, the driver reports {count}");
        return;
    }
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let gpu = Context::new(0).unwrap().is_gpu();
    let mut child = None;
    let mut thread = None;
    if gpu {
        let exe = std::env::current_exe().unwrap();
        child = Some(
            std::process::Command::new(exe)
                .args(["--exact", "rank_one", "--ignored", "--nocapture"])
                .env(ADDR_ENV, &addr)
                .spawn()
                .unwrap(),
        );
    } else {
        let addr = addr.clone();
        thread = Some(std::thread::spawn(move || rank_one_at(&addr)));
    }
    let (mut socket, _) = listener.accept().unwrap();
    let id = UniqueId::new().unwrap();
    socket.write_all(&id.to_bytes()).unwrap();
    rank_main(0, &id);
    let mut done = [0u8; 4];
    socket
        .set_read_timeout(Some(Duration::from_secs(120)))
        .unwrap();
    socket.read_exact(&mut done).unwrap();
    assert_eq!(&done, b"done");
    if let Some(mut child) = child {
        let status = child.wait().unwrap();
        assert!(status.success(), "rank 1's process: {status}");
    }
    if let Some(thread) = thread {
        thread.join().unwrap();
    }
}

fn soft_vars(rank: usize, port: &str) -> [(&'static str, String); 6] {
    [
        ("RANK", rank.to_string()),
        // One device does: the ranks never get as far as using it.
        ("LOCAL_RANK", "0".into()),
        ("WORLD_SIZE", "2".into()),
        ("MASTER_PORT", port.into()),
        ("CUDA_STREAMS_LAUNCH_TIMEOUT_S", "60".into()),
        ("CUDA_STREAMS_LAUNCH_TOKEN", "two-process-test".into()),
    ]
}

#[test]
#[ignore = "rank 1 of software_nccl_ranks_in_two_processes_both_fail_at_once, run by it in a child process"]
fn soft_rank_one() {
    let start = Instant::now();
    let err = Communicator::from_env().unwrap_err();
    assert!(
        matches!(err, Error::SoftNcclAcrossProcesses { rank: 1, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("one process"), "{err}");
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn software_nccl_ranks_in_two_processes_both_fail_at_once() {
    if Context::new(0).unwrap().is_gpu() {
        eprintln!("skipped: the software NCCL's limit; on GPUs the two-process tests run NCCL");
        return;
    }
    let store = Store::bind("127.0.0.1:0").unwrap();
    let port = store.port().to_string();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "soft_rank_one", "--ignored", "--nocapture"])
        .envs(soft_vars(1, &port))
        .spawn()
        .unwrap();
    let vars = soft_vars(0, &port);
    let launch =
        Rendezvous::from_vars(|k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone()))
            .unwrap();
    let start = Instant::now();
    let err = Communicator::from_launch_with_store(&launch, store).unwrap_err();
    let waited = start.elapsed();
    let status = child.wait().unwrap();
    assert!(
        matches!(err, Error::SoftNcclAcrossProcesses { rank: 0, other, .. } if other == child.id()),
        "{err}"
    );
    // Well before the 60 s deadline: neither waits in the software NCCL.
    assert!(waited < Duration::from_secs(30), "{waited:?}");
    assert!(status.success(), "rank 1's process: {status}");
}

#[test]
fn a_software_nccl_id_from_another_process_is_refused_when_joining() {
    let ctx = Context::new(0).unwrap();
    if ctx.is_gpu() {
        eprintln!("skipped: the software NCCL's limit");
        return;
    }
    let mut bytes = UniqueId::new().unwrap().to_bytes();
    // Where the software NCCL keeps the process that made the id.
    let other = std::process::id().wrapping_add(1);
    bytes[24..28].copy_from_slice(&other.to_le_bytes());
    let id = UniqueId::from_bytes(&bytes).unwrap();
    let err = Communicator::init_rank(&ctx, 2, &id, 0).unwrap_err();
    assert!(
        matches!(err, Error::SoftNcclAcrossProcesses { rank: 0, other: o, .. } if o == other),
        "{err}"
    );
    let err = Communicator::init_rank_within(&ctx, 2, &id, 1, Duration::from_secs(60)).unwrap_err();
    assert!(
        matches!(err, Error::SoftNcclAcrossProcesses { rank: 1, .. }),
        "{err}"
    );
}
