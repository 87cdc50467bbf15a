//! The launch from environment variables (`RANK`, `WORLD_SIZE`,
//! `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`): rank 0 publishes NCCL's
//! unique id over the TCP store, the others fetch it, and every rank checks
//! an all-reduce, an all-to-all and a ring of sends and receives over every
//! device.
//!
//! On GPUs each rank is a process of its own (this test process is rank 0;
//! the others are this test binary again, running the ignored `env_rank`
//! test with the variables set), one per device: the launch `torchrun`
//! makes. The software NCCL spans the threads
//! of one process, so on the software driver each rank is a thread reading
//! its own variables (`Rendezvous::from_vars`); the id still travels through
//! the store.

use cuda_streams_collectives::driver::{Context, DeviceBuffer, Stream};
use cuda_streams_collectives::{
    Communicator, Error, Group, LaunchSecret, ReduceOp, Rendezvous, Store,
};
use std::collections::HashMap;
use std::time::{Duration, Instant};

fn vars(rank: usize, n: usize, port: u16) -> HashMap<String, String> {
    [
        ("RANK", rank.to_string()),
        ("LOCAL_RANK", rank.to_string()),
        ("WORLD_SIZE", n.to_string()),
        ("MASTER_ADDR", "127.0.0.1".to_string()),
        ("MASTER_PORT", port.to_string()),
        ("CUDA_STREAMS_LAUNCH_TIMEOUT_S", "120".to_string()),
        ("CUDA_STREAMS_LAUNCH_TOKEN", "launch-test".to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

fn launch(vars: &HashMap<String, String>) -> Rendezvous {
    Rendezvous::from_vars(|k| vars.get(k).cloned()).unwrap()
}

/// Child processes, killed when dropped unless waited for: a rank that
/// fails ends the others at once instead of leaving them to their deadline.
struct Children(Vec<std::process::Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// One rank's whole life, from its communicator.
fn rank_main(comm: Communicator, launch: &Rendezvous) {
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
    let launch = Rendezvous::from_env().unwrap();
    rank_main(Communicator::from_launch(&launch).unwrap(), &launch);
}

#[test]
fn every_rank_launched_from_the_environment() {
    let n = Context::device_count().unwrap() as usize;
    if n < 2 {
        eprintln!("skipped: needs two devices, the driver reports {n}");
        return;
    }
    // Rank 0's port comes from the OS, bound before any rank is told it.
    let store = Store::bind("127.0.0.1:0").unwrap();
    let port = store.port();
    if Context::new(0).unwrap().is_gpu() {
        // One process per GPU, as torchrun starts them: this one is rank 0.
        let exe = std::env::current_exe().unwrap();
        let mut children = Children(
            (1..n)
                .map(|rank| {
                    std::process::Command::new(&exe)
                        .args(["--exact", "env_rank", "--ignored", "--nocapture"])
                        .envs(vars(rank, n, port))
                        .spawn()
                        .unwrap()
                })
                .collect(),
        );
        let comm = Communicator::from_launch_with_store(&launch(&vars(0, n, port)), store);
        rank_main(comm.unwrap(), &launch(&vars(0, n, port)));
        for (rank, child) in children.0.iter_mut().enumerate() {
            let status = child.wait().unwrap();
            assert!(status.success(), "rank {}'s process: {status}", rank + 1);
        }
        children.0.clear();
    } else {
        std::thread::scope(|s| {
            for rank in 1..n {
                s.spawn(move || {
                    let launch = launch(&vars(rank, n, port));
                    rank_main(Communicator::from_launch(&launch).unwrap(), &launch);
                });
            }
            let launch = launch(&vars(0, n, port));
            rank_main(
                Communicator::from_launch_with_store(&launch, store).unwrap(),
                &launch,
            );
        });
    }
}

#[test]
fn a_rank_whose_rank_0_never_answers_times_out_naming_the_store() {
    // The port is held, and connections complete, but nobody answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let mut vars = vars(1, 2, port);
    vars.insert("CUDA_STREAMS_LAUNCH_TIMEOUT_S".into(), "0.5".into());
    // Device 0: the store times out before any rank needs a second device,
    // and a machine with one GPU runs this test too.
    vars.insert("LOCAL_RANK".into(), "0".into());
    let launch = launch(&vars);
    assert_eq!(launch.timeout, Duration::from_millis(500));
    let start = Instant::now();
    let err = Communicator::from_launch(&launch).unwrap_err();
    assert!(matches!(err, Error::StoreTimeout { rank: 1, .. }), "{err}");
    assert!(
        err.to_string().contains(&format!("127.0.0.1:{port}")),
        "{err}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn rank_0_gives_up_when_a_rank_never_comes() {
    let store = Store::bind("127.0.0.1:0").unwrap();
    let mut vars = vars(0, 3, store.port());
    vars.insert("CUDA_STREAMS_LAUNCH_TIMEOUT_S".into(), "0.3".into());
    let err = Communicator::from_launch_with_store(&launch(&vars), store).unwrap_err();
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
fn rank_0_gives_up_inside_nccls_init_when_a_served_rank_never_joins() {
    // Rank 1 fetches the id and dies before joining NCCL: rank 0's deadline
    // still holds inside ncclCommInitRank.
    let store = Store::bind("127.0.0.1:0").unwrap();
    let port = store.port();
    let mut rank0 = vars(0, 2, port);
    rank0.insert("CUDA_STREAMS_LAUNCH_TIMEOUT_S".into(), "2".into());
    std::thread::scope(|s| {
        s.spawn(move || launch(&vars(1, 2, port)).fetch_unique_id().unwrap());
        let start = Instant::now();
        let err = Communicator::from_launch_with_store(&launch(&rank0), store).unwrap_err();
        assert!(
            matches!(
                err,
                Error::JoinTimeout {
                    rank: 0,
                    nranks: 2,
                    ..
                }
            ),
            "{err}"
        );
        let waited = start.elapsed();
        // Under compute-sanitizer NCCL's init and abort take seconds of
        // their own (15.4 s here on an H100): the error is checked, the time not.
        if !test_support::skip_under_sanitizer("NCCL's abort takes seconds under it: the time") {
            assert!(waited < Duration::from_secs(4), "{waited:?}");
        }
    });
}

#[test]
fn only_rank_0_publishes_through_a_store() {
    let store = Store::bind("127.0.0.1:0").unwrap();
    let vars = vars(1, 2, store.port());
    let err = Communicator::from_launch_with_store(&launch(&vars), store).unwrap_err();
    assert!(matches!(err, Error::InvalidRank { rank: 1, .. }), "{err}");
}

#[test]
fn the_secret_comes_from_the_token_or_the_job_id_and_off_loopback_is_required() {
    let with = |extra: &[(&str, &str)]| {
        let mut vars: HashMap<String, String> = [("RANK", "1"), ("WORLD_SIZE", "2")]
            .iter()
            .chain(extra)
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        vars.entry("MASTER_ADDR".into())
            .or_insert("10.1.2.3".into());
        Rendezvous::from_vars(|k| vars.get(k).cloned())
    };
    let refused = with(&[]).unwrap_err().to_string();
    assert!(refused.contains("CUDA_STREAMS_LAUNCH_TOKEN"), "{refused}");
    assert!(refused.contains("MASTER_ADDR=10.1.2.3"), "{refused}");
    let torch = with(&[("TORCHELASTIC_RUN_ID", "a1b2"), ("SLURM_JOB_ID", "7")]).unwrap();
    assert_eq!(torch.secret.source(), "TORCHELASTIC_RUN_ID");
    assert!(!torch.secret.is_public());
    // torchrun's default run id is no id.
    let slurm = with(&[("TORCHELASTIC_RUN_ID", "none"), ("SLURM_JOB_ID", "7")]).unwrap();
    assert_eq!(slurm.secret.source(), "SLURM_JOB_ID");
    assert_ne!(slurm.secret, with(&[("SLURM_JOB_ID", "8")]).unwrap().secret);
    let token = with(&[("CUDA_STREAMS_LAUNCH_TOKEN", "t"), ("SLURM_JOB_ID", "7")]).unwrap();
    assert_eq!(token.secret, LaunchSecret::from_token("t"));
    let empty = with(&[("CUDA_STREAMS_LAUNCH_TOKEN", "")]).unwrap_err();
    assert!(
        empty.to_string().contains("CUDA_STREAMS_LAUNCH_TOKEN=\"\""),
        "{empty}"
    );
    let insecure = with(&[("CUDA_STREAMS_LAUNCH_INSECURE", "1")]).unwrap();
    assert!(insecure.secret.is_public());
    let bad = with(&[("CUDA_STREAMS_LAUNCH_INSECURE", "yes")]).unwrap_err();
    assert!(
        bad.to_string()
            .contains("CUDA_STREAMS_LAUNCH_INSECURE=\"yes\""),
        "{bad}"
    );
    for loopback in ["127.0.0.1", "localhost", "::1", "[::1]", "127.8.9.10"] {
        let open = with(&[("MASTER_ADDR", loopback)]).unwrap();
        assert!(open.secret.is_public(), "{loopback}");
    }
    // A name that may resolve anywhere is not taken for loopback.
    assert!(with(&[("MASTER_ADDR", "node7")]).is_err());
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
            "SLURM_JOB_ID" => Some("4242"),
            _ => None,
        }
        .map(String::from)
    };
    let launch = Rendezvous::from_vars(slurm).unwrap();
    assert_eq!(
        (launch.rank, launch.world_size, launch.local_rank),
        (3, 4, 1)
    );
    assert_eq!(launch.store_addr(), "node7:1234");
    let missing = Rendezvous::from_vars(|_| None).unwrap_err();
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
    let err = Rendezvous::from_vars(bad_port).unwrap_err();
    assert!(err.to_string().contains("MASTER_PORT=\"http\""), "{err}");
}

/// Code that names the type by its old name, `Launch`, keeps compiling: it
/// is `Rendezvous`.
#[test]
#[allow(deprecated)]
fn the_old_name_launch_is_the_rendezvous() {
    let vars = |name: &str| match name {
        "RANK" => Some("0".to_string()),
        "WORLD_SIZE" => Some("1".to_string()),
        _ => None,
    };
    let old: cuda_streams_collectives::Launch =
        cuda_streams_collectives::Launch::from_vars(vars).unwrap();
    let new: Rendezvous = old.clone();
    assert_eq!((new.rank, new.world_size), (0, 1));
    assert_eq!(new, Rendezvous::from_vars(vars).unwrap());
}
