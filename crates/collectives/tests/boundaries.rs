//! What a collective must refuse before NCCL sees it: a capturing stream
//! (the graph would keep none of its buffers), and ranks in this process
//! that disagree (NCCL would hang or read and write past the buffers).
//! Skips, saying why, with fewer than two devices.

use cuda_streams_collectives::driver::{Context, DeviceBuffer, Stream};
use cuda_streams_collectives::{Communicator, Error, Group, ReduceOp, UniqueId};
use std::sync::Arc;

/// Every device, or `None` (printed why) with fewer than two.
fn devices() -> Option<Vec<Arc<Context>>> {
    let contexts = Context::all().unwrap();
    if contexts.len() < 2 {
        eprintln!(
            "skipped: needs two devices, the driver reports {}",
            contexts.len()
        );
        return None;
    }
    Some(contexts)
}

/// The error of a call that must be refused. Were it issued instead, its
/// rank's stream would wait for the other ranks' parts for ever: the
/// communicator is aborted (which fails that wait) before the test fails,
/// so a regression fails the test instead of hanging it.
fn refused(
    result: Result<(), Error>,
    comm: Communicator,
    what: &str,
) -> (Error, Option<Communicator>) {
    match result {
        Err(err) => (err, Some(comm)),
        Ok(()) => {
            let rank = comm.rank();
            comm.abort().unwrap();
            panic!("rank {rank}: {what} was issued instead of refused");
        }
    }
}

#[test]
fn a_collective_on_a_capturing_stream_is_refused_and_everything_stays_usable() {
    let Some(contexts) = devices() else { return };
    let contexts = &contexts[..2];
    let comms = Communicator::all_devices(contexts).unwrap();
    let streams: Vec<Arc<Stream>> = contexts.iter().map(|c| Stream::new(c).unwrap()).collect();
    let send: Vec<DeviceBuffer<u32>> = streams
        .iter()
        .enumerate()
        .map(|(r, s)| DeviceBuffer::from_slice(s, &[r as u32 + 1; 64]).unwrap())
        .collect();
    let mut recv: Vec<DeviceBuffer<u32>> = streams
        .iter()
        .map(|s| DeviceBuffer::from_slice(s, &[0; 64]).unwrap())
        .collect();

    let mut capture = streams[0].begin_capture().unwrap();
    // Alone, on a communicator of one rank (which meets no other rank, so
    // nothing but the capture check stands between the call and NCCL):
    // refused at once, naming the collective, the rank and the stream.
    let single = Communicator::all_devices(&contexts[..1]).unwrap().remove(0);
    match single.all_reduce(&streams[0], &send[0], &mut recv[0], ReduceOp::Sum) {
        Err(
            e @ Error::StreamCapturing {
                collective: "all_reduce",
                rank: 0,
                stream,
            },
        ) => {
            assert_eq!(stream, streams[0].id());
            let text = e.to_string();
            assert!(
                text.contains("all_reduce") && text.contains(&format!("stream {stream}")),
                "{text}"
            );
        }
        other => panic!("expected StreamCapturing, got {other:?}"),
    }
    // In a group: refused at the group's call too.
    let mut group = Group::new();
    let err = group
        .broadcast_in_place(&comms[0], &streams[0], &mut recv[0], 0)
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::StreamCapturing {
                collective: "broadcast",
                ..
            }
        ),
        "{err}"
    );
    drop(group);
    assert_eq!(capture.node_count(), 0, "nothing was captured");
    let graph = capture.end().unwrap();
    assert_eq!(graph.node_count(), 0, "the graph holds no collective");
    let mut alone = DeviceBuffer::from_slice(&streams[0], &[5u32; 64]).unwrap();
    single
        .all_reduce_in_place(&streams[0], &mut alone, ReduceOp::Sum)
        .unwrap();
    assert_eq!(alone.to_vec(&streams[0]).unwrap(), vec![5; 64]);

    // A group made before the captures began is refused at its end, and
    // issues none of its collectives. (Both streams capture, so that were a
    // collective to reach NCCL, neither rank's part would run and wait for
    // the other's: the test fails instead of hanging.)
    let mut group = Group::new();
    for (i, out) in recv.iter_mut().enumerate() {
        group
            .all_reduce(&comms[i], &streams[i], &send[i], out, ReduceOp::Sum)
            .unwrap();
    }
    let mut captures: Vec<_> = streams.iter().map(|s| s.begin_capture().unwrap()).collect();
    match group.end() {
        Err(Error::StreamCapturing {
            collective: "all_reduce",
            rank: 0,
            ..
        }) => {}
        other => panic!("expected StreamCapturing, got {other:?}"),
    }
    for capture in &mut captures {
        assert_eq!(capture.node_count(), 0, "nothing was captured");
        assert_eq!(capture.end().unwrap().node_count(), 0);
    }

    // Nothing reached NCCL: the streams, the communicators and the buffers
    // work, and the ranks' collectives still pair up.
    let mut group = Group::new();
    for (i, out) in recv.iter_mut().enumerate() {
        group
            .all_reduce(&comms[i], &streams[i], &send[i], out, ReduceOp::Sum)
            .unwrap();
    }
    group.end().unwrap();
    for (stream, out) in streams.iter().zip(&recv) {
        assert_eq!(out.to_vec(stream).unwrap(), vec![3; 64]);
        stream.synchronize().unwrap();
    }
    for comm in &comms {
        comm.async_error().unwrap();
    }
}

/// How the ranks of the disagreement test get their communicators.
#[derive(Clone, Copy, Debug)]
enum Made {
    /// `all_devices` on this thread, then each moved to its rank's thread.
    Together,
    /// `init_rank` in each rank's thread, from one unique id.
    OneByOne,
}

/// Every device a rank in its own thread; each all-reduces a buffer alone,
/// the last rank's half as long. Returns each rank's result of that call,
/// then checks that a matching collective still works.
fn disagree_alone(made: Made) {
    let Some(contexts) = devices() else { return };
    let n = contexts.len();
    let id = UniqueId::new().unwrap();
    let mut together: Vec<Option<Communicator>> = match made {
        Made::Together => Communicator::all_devices(&contexts)
            .unwrap()
            .into_iter()
            .map(Some)
            .collect(),
        Made::OneByOne => (0..n).map(|_| None).collect(),
    };
    let errors: Vec<Error> = std::thread::scope(|s| {
        let joins: Vec<_> = contexts
            .iter()
            .zip(&mut together)
            .enumerate()
            .map(|(rank, (ctx, comm))| {
                let comm = comm.take();
                s.spawn(move || {
                    let comm =
                        comm.unwrap_or_else(|| Communicator::init_rank(ctx, n, &id, rank).unwrap());
                    let stream = Stream::new(ctx).unwrap();
                    let len = if rank == n - 1 { 4 } else { 8 };
                    let mut data = DeviceBuffer::from_slice(&stream, &vec![1.0f32; len]).unwrap();
                    // Returns (no hang), with nothing handed to NCCL.
                    let err = comm
                        .all_reduce_in_place(&stream, &mut data, ReduceOp::Sum)
                        .expect_err("ranks with 8 and 4 elements must be refused");
                    // The same communicators, in agreement, still work.
                    let mut ok = DeviceBuffer::from_slice(&stream, &[rank as u64; 16]).unwrap();
                    comm.all_reduce_in_place(&stream, &mut ok, ReduceOp::Sum)
                        .unwrap();
                    let sum = (n * (n - 1) / 2) as u64;
                    assert_eq!(ok.to_vec(&stream).unwrap(), vec![sum; 16]);
                    assert_eq!(data.to_vec(&stream).unwrap(), vec![1.0; len]);
                    comm.async_error().unwrap();
                    err
                })
            })
            .collect();
        joins.into_iter().map(|j| j.join().unwrap()).collect()
    });
    for (rank, err) in errors.iter().enumerate() {
        let text = err.to_string();
        assert!(
            matches!(err, Error::RanksDisagree { index: 0, .. }),
            "{made:?}, rank {rank}: {text}"
        );
        // Both ranks and both counts named.
        for part in [
            "rank 0 calls all_reduce of 8 element(s) of f32".to_string(),
            format!("rank {} calls all_reduce of 4 element(s) of f32", n - 1),
        ] {
            assert!(text.contains(&part), "{made:?}, rank {rank}: {text}");
        }
    }
}

#[test]
fn ranks_made_together_that_disagree_alone_are_refused_on_every_rank() {
    disagree_alone(Made::Together);
}

#[test]
fn ranks_made_one_by_one_that_disagree_alone_are_refused_on_every_rank() {
    disagree_alone(Made::OneByOne);
}

#[test]
fn ranks_in_their_threads_may_group_alike_but_not_differently() {
    let Some(contexts) = devices() else { return };
    let n = contexts.len();
    let id = UniqueId::new().unwrap();
    let results: Vec<(Error, Vec<i32>)> = std::thread::scope(|s| {
        let joins: Vec<_> = contexts
            .iter()
            .enumerate()
            .map(|(rank, ctx)| {
                s.spawn(move || {
                    let comm = Communicator::init_rank(ctx, n, &id, rank).unwrap();
                    let stream = Stream::new(ctx).unwrap();
                    let mut a = DeviceBuffer::from_slice(&stream, &[1i32; 8]).unwrap();
                    let mut b = DeviceBuffer::from_slice(&stream, &[2i32; 8]).unwrap();
                    // Rank 0 groups two collectives; the others make one:
                    // refused on every rank.
                    let result = if rank == 0 {
                        let mut group = Group::new();
                        group
                            .all_reduce_in_place(&comm, &stream, &mut a, ReduceOp::Sum)
                            .unwrap();
                        group
                            .all_reduce_in_place(&comm, &stream, &mut b, ReduceOp::Sum)
                            .unwrap();
                        group.end()
                    } else {
                        comm.all_reduce_in_place(&stream, &mut a, ReduceOp::Sum)
                    };
                    let (err, comm) = refused(result, comm, "a collective grouped differently");
                    let comm = comm.unwrap();
                    // Each rank's group of one rank, grouped alike: fine.
                    let mut group = Group::new();
                    group
                        .all_reduce_in_place(&comm, &stream, &mut a, ReduceOp::Sum)
                        .unwrap();
                    group
                        .all_reduce_in_place(&comm, &stream, &mut b, ReduceOp::Max)
                        .unwrap();
                    group.end().unwrap();
                    let got = [a.to_vec(&stream).unwrap(), b.to_vec(&stream).unwrap()].concat();
                    (err, got)
                })
            })
            .collect();
        joins.into_iter().map(|j| j.join().unwrap()).collect()
    });
    for (rank, (err, got)) in results.iter().enumerate() {
        match err {
            Error::MissingRank {
                rank: 0,
                calls_here: 2,
                calls_there: 1,
                ..
            } => {}
            other => panic!("rank {rank}: expected MissingRank, got {other}"),
        }
        let mut expected = vec![n as i32; 8];
        expected.extend([2; 8]);
        assert_eq!(got, &expected, "rank {rank}");
    }
}

#[test]
fn a_rank_waiting_for_a_dropped_rank_is_told_instead_of_hanging() {
    let Some(contexts) = devices() else { return };
    let contexts = &contexts[..2];
    let mut comms = Communicator::all_devices(contexts).unwrap();
    let gone = comms.pop().unwrap();
    let comm = comms.pop().unwrap();
    let err = std::thread::scope(|s| {
        let waiter = s.spawn(move || {
            let stream = Stream::new(&contexts[0]).unwrap();
            let mut data = DeviceBuffer::from_slice(&stream, &[1u8; 8]).unwrap();
            // Waits for rank 1 (or finds it gone already).
            let result = comm.all_reduce_in_place(&stream, &mut data, ReduceOp::Sum);
            let (err, _comm) = refused(result, comm, "a collective whose peer is gone");
            assert_eq!(data.to_vec(&stream).unwrap(), vec![1; 8]);
            err
        });
        drop(gone);
        waiter.join().unwrap()
    });
    match err {
        e @ Error::RankGone { rank: 0, gone: 1 } => {
            assert!(e.to_string().contains("rank 1"), "{e}")
        }
        other => panic!("expected RankGone, got {other:?}"),
    }
}
