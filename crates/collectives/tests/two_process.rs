//! Two ranks that meet through a unique id sent over a TCP socket on
//! localhost, as ranks on different hosts would: rank 0 makes the id and
//! listens, rank 1 connects and reads it, both make their communicator
//! (`ncclCommInitRank`) and all-reduce, each checking the result.
//!
//! On GPUs rank 1 is a second process (this test binary again, running the
//! ignored `rank_one` test). The software NCCL spans the threads of one
//! process only, so on the software driver rank 1 is a thread; the id still
//! travels through the socket.

use cuda_streams_collectives::driver::{Context, DeviceBuffer, Stream};
use cuda_streams_collectives::{Communicator, ReduceOp, UniqueId};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

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
