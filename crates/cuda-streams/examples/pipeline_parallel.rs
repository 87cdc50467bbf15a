//! Pipeline parallelism across two ranks, one per device: stage 0 runs the
//! first layer of each micro-batch and sends its activations to stage 1
//! (`Communicator::send`, NCCL's `ncclSend`); stage 1 receives them, runs
//! the second layer and sends the gradient of its output back, which stage
//! 0 accumulates. Every activation, output and the accumulated gradients
//! are checked element by element.
//!
//! Launched the way users launch it: under `torchrun --no-python --nproc-per-node=2`,
//! `mpirun -np 2` or with `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`
//! and `MASTER_PORT` set by hand, each process is one stage. Run plainly, it
//! starts the two ranks itself: on GPUs, one child process per GPU with
//! those variables set (the socket transport between hosts is this run with
//! `NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1`); on the software driver, whose
//! NCCL spans the threads of one process, two threads, each reading its
//! own variables (`Rendezvous::from_vars`).
//!
//! `cargo run -p cuda-streams --example pipeline_parallel`

use cuda_streams::collectives::{Communicator, Rendezvous, Store};
use cuda_streams::kernels::typed::Elementwise;
use cuda_streams::prelude::*;
use std::collections::HashMap;

const N: usize = 1 << 14;
const MICRO_BATCHES: usize = 6;

/// Stage 0's layer: `act = 2 * x`, with micro-batch `m`'s input all `m + 1`.
fn activation(m: usize) -> f32 {
    2.0 * (m as f32 + 1.0)
}

/// Stage 1's layer: `out = 3 * act + 1`; its output is the gradient sent back.
fn output(m: usize) -> f32 {
    3.0 * activation(m) + 1.0
}

/// One stage's whole life, from its launch; rank 0 publishes NCCL's id at
/// `store` when it was bound already (to a port the OS chose).
fn stage(launch: &Rendezvous, store: Option<Store>) -> Result<(), cuda_streams::Error> {
    if launch.world_size != 2 {
        eprintln!(
            "pipeline_parallel has two stages: launch it with 2 ranks, not {}",
            launch.world_size
        );
        std::process::exit(2);
    }
    let comm = match store {
        Some(store) => Communicator::from_launch_with_store(launch, store)?,
        None => Communicator::from_launch(launch)?,
    };
    let (rank, ctx) = (comm.rank(), comm.context());
    let stream = Stream::new(ctx)?;
    let kernels = Elementwise::load(ctx)?;
    let mut act = DeviceBuffer::<f32>::new_async(&stream, N)?;
    let mut grad = DeviceBuffer::<f32>::new_async(&stream, N)?;
    if rank == 0 {
        let mut x = DeviceBuffer::<f32>::new_async(&stream, N)?;
        let mut accumulated = DeviceBuffer::from_slice(&stream, &vec![0.0f32; N])?;
        for m in 0..MICRO_BATCHES {
            kernels.fill_f32(&stream, m as f32 + 1.0, &mut x)?;
            kernels.fill_f32(&stream, 0.0, &mut act)?;
            kernels.saxpy(&stream, 2.0, &x, &mut act)?;
            comm.send(&stream, &act, 1)?;
            comm.recv(&stream, &mut grad, 1)?;
            kernels.saxpy(&stream, 1.0, &grad, &mut accumulated)?;
        }
        let expected: f32 = (0..MICRO_BATCHES).map(output).sum();
        let got = accumulated.to_vec(&stream)?;
        if let Some(i) = got.iter().position(|&v| v != expected) {
            panic!(
                "stage 0: accumulated gradient {i} is {}, not {expected}",
                got[i]
            );
        }
        println!(
            "stage 0: {MICRO_BATCHES} micro-batches sent, gradients summed to {expected} (checked)"
        );
    } else {
        let bias = DeviceBuffer::from_slice(&stream, &vec![1.0f32; N])?;
        for m in 0..MICRO_BATCHES {
            comm.recv(&stream, &mut act, 0)?;
            kernels.scale_add(&stream, 3.0, &act, 1.0, &bias, &mut grad)?;
            let (acts, outs) = (act.to_vec(&stream)?, grad.to_vec(&stream)?);
            for i in 0..N {
                assert_eq!(
                    acts[i],
                    activation(m),
                    "stage 1: micro-batch {m}, activation {i}"
                );
                assert_eq!(outs[i], output(m), "stage 1: micro-batch {m}, output {i}");
            }
            comm.send(&stream, &grad, 0)?;
        }
        stream.synchronize()?;
        println!("stage 1: {MICRO_BATCHES} micro-batches received and checked");
    }
    comm.async_error()?;
    Ok(())
}

/// Whether a launcher (or the user) set this process's rank.
fn launched() -> bool {
    ["RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"]
        .iter()
        .any(|name| std::env::var_os(name).is_some())
}

fn vars(rank: usize, port: u16) -> HashMap<String, String> {
    [
        ("RANK", rank.to_string()),
        ("LOCAL_RANK", rank.to_string()),
        ("WORLD_SIZE", "2".to_string()),
        ("MASTER_ADDR", "127.0.0.1".to_string()),
        ("MASTER_PORT", port.to_string()),
        ("CUDA_STREAMS_LAUNCH_TIMEOUT_S", "120".to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

fn main() -> Result<(), cuda_streams::Error> {
    if launched() {
        return stage(&Rendezvous::from_env()?, None);
    }
    let devices = Context::device_count()?;
    if devices < 2 {
        println!("pipeline_parallel needs two devices; the driver reports {devices}");
        return Ok(());
    }
    // Rank 0's store is bound first, to a port the OS picks, and that port
    // is handed on: no other program can take it in between.
    let store = Store::bind("127.0.0.1:0")?;
    let port = store.port();
    if Context::new(0)?.is_gpu() {
        // One process per GPU, as torchrun starts them: this one is stage 0,
        // a child is stage 1.
        let vars0 = vars(0, port);
        let launch = Rendezvous::from_vars(|k| vars0.get(k).cloned())?;
        let exe = std::env::current_exe().expect("this example's path");
        let mut child = std::process::Command::new(&exe)
            .envs(vars(1, port))
            .spawn()
            .expect("starting stage 1");
        let ours = stage(&launch, Some(store));
        if ours.is_err() {
            // Its peer would wait for stage 0 until its deadline.
            let _ = child.kill();
        }
        let status = child.wait().expect("waiting for stage 1");
        ours?;
        assert!(status.success(), "stage 1's process: {status}");
        return Ok(());
    }
    // The software NCCL spans threads: one per stage. A stage that fails
    // ends the process: its peer would wait for it forever, as an NCCL
    // peer of a dead process does.
    let mut store = Some(store);
    std::thread::scope(|s| {
        for rank in 0..2 {
            let store = if rank == 0 { store.take() } else { None };
            s.spawn(move || {
                let vars = vars(rank, port);
                let run = || stage(&Rendezvous::from_vars(|k| vars.get(k).cloned())?, store);
                match std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)) {
                    Ok(Ok(())) => {}
                    Ok(Err(err)) => {
                        eprintln!("stage {rank} failed: {err}");
                        std::process::exit(1);
                    }
                    Err(_) => {
                        eprintln!("stage {rank} panicked");
                        std::process::exit(1);
                    }
                }
            });
        }
    });
    Ok(())
}
