//! An all-to-all exchange over every device: rank `r` sends chunk `q` of its
//! buffer to rank `q` and receives rank `q`'s chunk `r` into its chunk `q`
//! (`Communicator::all_to_all`, grouped `ncclSend`/`ncclRecv` as NCCL
//! documents it), the layout expert-parallel and sequence-parallel codes
//! exchange. One thread drives every rank through a `Group`; every element
//! is checked.
//!
//! `cargo run -p cuda-streams --example all_to_all` (the software driver has
//! two devices by default; `CUDA_STREAMS_SOFT_DEVICES=N` changes that).

use cuda_streams::collectives::{Communicator, Group};
use cuda_streams::prelude::*;

/// Elements each rank sends to each other rank.
const CHUNK: usize = 4096;

/// What rank `r` holds at element `i` of its chunk for rank `q`.
fn value(r: usize, q: usize, i: usize) -> u64 {
    ((r as u64) << 40) | ((q as u64) << 20) | i as u64
}

fn main() -> Result<(), cuda_streams::Error> {
    let contexts = Context::all()?;
    let n = contexts.len();
    if n < 2 {
        println!("all_to_all needs two devices; the driver reports {n}");
        return Ok(());
    }
    let comms = Communicator::all_devices(&contexts)?;
    let streams = contexts
        .iter()
        .map(Stream::new)
        .collect::<Result<Vec<_>, _>>()?;
    let sends = streams
        .iter()
        .enumerate()
        .map(|(r, stream)| {
            let host: Vec<u64> = (0..n * CHUNK)
                .map(|j| value(r, j / CHUNK, j % CHUNK))
                .collect();
            DeviceBuffer::from_slice(stream, &host)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut recvs = streams
        .iter()
        .map(|stream| DeviceBuffer::<u64>::new_async(stream, n * CHUNK))
        .collect::<Result<Vec<_>, _>>()?;
    let mut group = Group::new();
    for (((comm, stream), send), recv) in comms.iter().zip(&streams).zip(&sends).zip(&mut recvs) {
        group.all_to_all(comm, stream, send, recv)?;
    }
    group.end()?;
    for (r, (stream, recv)) in streams.iter().zip(&recvs).enumerate() {
        let got = recv.to_vec(stream)?;
        for q in 0..n {
            for i in 0..CHUNK {
                assert_eq!(
                    got[q * CHUNK + i],
                    value(q, r, i),
                    "rank {r}, element {i} from rank {q}"
                );
            }
        }
    }
    println!(
        "all_to_all: {n} ranks exchanged {} elements each, every one checked",
        n * CHUNK
    );
    Ok(())
}
