//! The launch from environment variables (`RANK`, `WORLD_SIZE`,
//! `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`): rank 0 publishes NCCL's
//! unique id over the TCP store, the others fetch it, and every rank checks
//! an all-reduce, an all-to-all and a ring of sends and receives over every
//! device.
//!
//! On GPUs each rank is a process of its own (this test binary again,
//! running the ignored `env_rank` test with the variables set), one per
//! device: the launch `torchrun` makes. The software NCCL spans the threads
//! of one process, so on the software driver each rank is a thread reading
//! its own variables (`Launch::from_vars`); the id still travels through
//! the store.

use cuda_streams_collectives::driver::{Context, DeviceBuffer, Stream};
use cuda_streams_collectives::{Communicator, Error, Group, Launch, ReduceOp};
use std::collections::HashMap;
use std::time::Duration;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn vars(rank: usize, n: usize, port: u16) -> HashMap<String, String> {
    [
        ("RANK", rank.to_string()),
        ("LOCAL_RANK", rank.to_string()),
        ("WORLD_SIZE", n.to_string()),
        ("MASTER_ADDR", "127.0.0.1".to_string()),
        ("MASTER_PORT", port.to_string()),
        ("CUDA_STREAMS_LAUNCH_TIMEOUT_S", "120".to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// One rank's whole life, from its launch.
fn rank_main(launch: &Launch) {
    let comm = Communicator::from_launch(launch).unwrap();
    let (rank, n) = (comm.rank(), comm.size());
    assert_eq!((rank, n), (launch.rank, launch.world_size));
    assert_eq!(comm.context().ordinal() as usize, launch.local_rank);
    let stream = Stream::new(comm.context()).unwrap();
    let mut sum = DeviceBuffer::from_slice(&stream, &[rank as f32 + 1.0; 1024]).unwrap();
    comm.all_reduce_in_place(&stream, &mut sum, ReduceOp::Sum)
        .unwrap();
    let total = (n * (n + 1) / 2) as f32;
    assert_eq!(sum.to_vec(&stream).unwrap(), vec![total; 1024]);
    let send: Vec<u32> = (0..n * 3).map(|i| (rank * 100 + i) as u32).collect();
    let send = DeviceBuffer::from_slice(&stream, &send).unwrap();
    let mut recv = DeviceBuffer::<u32>::new_async(&stream, n * 3).unwrap();
    comm.all_to_all(&stream, &send, &mut recv).unwrap();
    let got = recv.to_vec(&stream).unwrap();
    for q in 0..n {
        for i in 0..3 {
            assert_eq!(
                got[q * 3 + i],
                (q * 100 + rank * 3 + i) as u32,
                "rank {rank} from {q}"
            );
        }
    }
    let mut ring = DeviceBuffer::<u32>::new_async(&stream, n * 3).unwrap();
    let mut group = Group::new();
    group.send(&comm, &stream, &send, (rank + 1) % n).unwrap();
    group
        .recv(&comm, &stream, &mut ring, (rank + n - 1) % n)
        .unwrap();
    group.end().unwrap();
    let from = (rank + n - 1) % n;
    let expected: Vec<u32> = (0..n * 3).map(|i| (from * 100 + i) as u32).collect();
    assert_eq!(ring.to_vec(&stream).unwrap(), expected);
    comm.async_error().unwrap();
}

#[test]
#[ignore = "one rank of every_rank_launched_from_the_environment, run by it in a child process"]
fn env_rank() {
    rank_main(&Launch::from_env().unwrap());
}

#[test]
fn every_rank_launched_from_the_environment() {
    let n = Context::device_count().unwrap() as usize;
    if n < 2 {
        eprintln!("skipped: needs two devices, the driver reports {n}");
        return;
    }
    let port = free_port();
    if Context::new(0).unwrap().is_gpu() {
        // One process per GPU, as torchrun starts them.
        let exe = std::env::current_exe().unwrap();
        let children: Vec<_> = (0..n)
            .map(|rank| {
                std::process::Command::new(&exe)
                    .args(["--exact", "env_rank", "--ignored", "--nocapture"])
                    .envs(vars(rank, n, port))
                    .spawn()
                    .unwrap()
            })
            .collect();
        for (rank, mut child) in children.into_iter().enumerate() {
            let status = child.wait().unwrap();
            assert!(status.success(), "rank {rank}'s process: {status}");
        }
    } else {
        std::thread::scope(|s| {
            for rank in 0..n {
                s.spawn(move || {
                    let vars = vars(rank, n, port);
                    rank_main(&Launch::from_vars(|k| vars.get(k).cloned()).unwrap());
                });
            }
        });
    }
}

#[test]
fn a_rank_whose_rank_0_never_comes_times_out_naming_the_store() {
    let port = free_port();
    let mut vars = vars(1, 2, port);
    vars.insert("CUDA_STREAMS_LAUNCH_TIMEOUT_S".into(), "0.3".into());
    // Device 0: the store times out before any rank needs a second device,
    // and a machine with one GPU runs this test too.
    vars.insert("LOCAL_RANK".into(), "0".into());
    let launch = Launch::from_vars(|k| vars.get(k).cloned()).unwrap();
    assert_eq!(launch.timeout, Duration::from_millis(300));
    let err = Communicator::from_launch(&launch).unwrap_err();
    assert!(matches!(err, Error::StoreTimeout { rank: 1, .. }), "{err}");
    assert!(
        err.to_string().contains(&format!("127.0.0.1:{port}")),
        "{err}"
    );
}

#[test]
fn rank_0_gives_up_when_a_rank_never_comes() {
    let port = free_port();
    let mut vars = vars(0, 3, port);
    vars.insert("CUDA_STREAMS_LAUNCH_TIMEOUT_S".into(), "0.3".into());
    let err = Communicator::from_launch(&Launch::from_vars(|k| vars.get(k).cloned()).unwrap())
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::StoreTimeout {
                rank: 0,
                missing: 2,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn the_launchers_names_are_read_and_bad_values_named() {
    let slurm = |k: &str| {
        match k {
            "SLURM_PROCID" => Some("3"),
            "SLURM_NTASKS" => Some("4"),
            "SLURM_LOCALID" => Some("1"),
            "MASTER_ADDR" => Some("node7"),
            "MASTER_PORT" => Some("1234"),
            _ => None,
        }
        .map(String::from)
    };
    let launch = Launch::from_vars(slurm).unwrap();
    assert_eq!(
        (launch.rank, launch.world_size, launch.local_rank),
        (3, 4, 1)
    );
    assert_eq!(launch.store_addr(), "node7:1234");
    let missing = Launch::from_vars(|_| None).unwrap_err();
    assert!(missing.to_string().contains("WORLD_SIZE"), "{missing}");
    let bad_port = |k: &str| {
        match k {
            "RANK" => Some("0"),
            "WORLD_SIZE" => Some("1"),
            "MASTER_PORT" => Some("http"),
            _ => None,
        }
        .map(String::from)
    };
    let err = Launch::from_vars(bad_port).unwrap_err();
    assert!(err.to_string().contains("MASTER_PORT=\"http\""), "{err}");
}
