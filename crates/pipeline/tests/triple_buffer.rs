//! The triple buffer's state machine: legal and illegal transitions, FIFO
//! rotation, real data through a slot, and many threads at once.

mod common;

use common::{XorShift, ctx};
use cuda_streams_pipeline::{Error, GpuTripleBuffer, SlotState, SlotStatus};
use driver::Stream;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

fn states(buffer: &GpuTripleBuffer<f32>) -> Vec<SlotState> {
    buffer.get_states().iter().map(|s| s.state).collect()
}

#[test]
fn legal_cycle_and_fifo_rotation() {
    use SlotState::*;
    let buffer = GpuTripleBuffer::<f32>::new(&ctx(), 16).unwrap();
    assert_eq!(buffer.size(), 16);
    assert_eq!(states(&buffer), [Free, Free, Free]);
    // Three uploads take slots 0, 1, 2 in order; a fourth finds none free.
    let slots: Vec<usize> = (0..3)
        .map(|_| buffer.get_upload_buffer().unwrap().slot())
        .collect();
    assert_eq!(slots, [0, 1, 2]);
    assert!(buffer.get_upload_buffer().is_none());
    assert_eq!(states(&buffer), [Uploading, Uploading, Uploading]);
    // Processing takes the oldest upload first.
    let p = buffer.get_process_buffer().unwrap();
    assert_eq!((p.slot(), p.stage()), (0, Processing));
    assert_eq!(
        buffer.get_states()[0],
        SlotStatus {
            state: Processing,
            held: true
        }
    );
    // While slot 0 is held for processing, slot 0 cannot be downloaded.
    assert!(buffer.get_download_buffer().is_none());
    p.finish();
    let d = buffer.get_download_buffer().unwrap();
    assert_eq!(d.slot(), 0);
    // advance while the download guard holds the slot is an error naming it.
    match buffer.advance() {
        Err(Error::IllegalTransition {
            slot: 0,
            from: Downloading,
            to: Free,
            held: true,
        }) => {}
        other => panic!("expected an illegal transition, got {other:?}"),
    }
    drop(d);
    buffer.advance().unwrap();
    assert_eq!(states(&buffer), [Free, Uploading, Uploading]);
    // The next upload goes to slot 0 again: the rotation wraps.
    assert_eq!(buffer.get_upload_buffer().unwrap().slot(), 0);
    assert_eq!(buffer.get_process_buffer().unwrap().slot(), 1);
}

#[test]
fn illegal_transitions_are_refused_without_changing_state() {
    use SlotState::*;
    let buffer = GpuTripleBuffer::<f32>::new(&ctx(), 4).unwrap();
    // Free -> Processing / Downloading / (advance) Free: refused.
    assert!(buffer.get_process_buffer().is_none());
    assert!(buffer.get_download_buffer().is_none());
    let err = buffer.advance().unwrap_err();
    assert!(
        err.to_string()
            .contains("slot 0: illegal transition Free -> Free"),
        "{err}"
    );
    assert_eq!(states(&buffer), [Free, Free, Free]);
    // Uploading -> Downloading (skipping processing): refused.
    drop(buffer.get_upload_buffer().unwrap());
    assert!(buffer.get_download_buffer().is_none());
    assert!(matches!(
        buffer.advance(),
        Err(Error::IllegalTransition {
            from: Uploading,
            held: false,
            ..
        })
    ));
    // A slot held for upload cannot be processed until the guard goes.
    let up = buffer.get_upload_buffer().unwrap();
    assert_eq!(up.slot(), 1);
    assert_eq!(buffer.get_process_buffer().unwrap().slot(), 0);
    assert!(
        buffer.get_process_buffer().is_none(),
        "slot 1 is still held"
    );
    drop(up);
    assert_eq!(buffer.get_process_buffer().unwrap().slot(), 1);
    // The pure transition table agrees.
    for from in [Free, Uploading, Processing, Downloading] {
        for to in [Free, Uploading, Processing, Downloading] {
            assert_eq!(from.can_become(to), to == from.next(), "{from:?} -> {to:?}");
        }
    }
}

#[test]
fn guards_hand_out_the_real_device_buffers() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let buffer = GpuTripleBuffer::<f32>::new(&ctx, 1000).unwrap();
    let mut rng = XorShift::new(7);
    let data: Vec<Vec<f32>> = (0..3).map(|_| rng.f32s(1000)).collect();
    for batch in &data {
        let mut slot = buffer.get_upload_buffer().unwrap();
        stream.copy_from_host(&mut *slot, batch).unwrap();
    }
    for batch in &data {
        let slot = buffer.get_process_buffer().unwrap();
        assert_eq!(&slot.to_vec(&stream).unwrap(), batch);
    }
}

#[test]
fn concurrent_stages_see_batches_in_order() {
    const BATCHES: u64 = 2000;
    let buffer = Arc::new(GpuTripleBuffer::<u32>::new(&ctx(), 4).unwrap());
    // The batch number in each slot, written under the upload guard.
    let tags: Arc<[AtomicU64; 3]> = Arc::new(Default::default());
    let spins = Arc::new(AtomicUsize::new(0));
    let stage = |kind: usize| {
        let (buffer, tags, spins) = (Arc::clone(&buffer), Arc::clone(&tags), Arc::clone(&spins));
        std::thread::spawn(move || {
            let mut expected = 0;
            while expected < BATCHES {
                let guard = match kind {
                    0 => buffer.get_upload_buffer(),
                    1 => buffer.get_process_buffer(),
                    _ => buffer.get_download_buffer(),
                };
                let Some(guard) = guard else {
                    spins.fetch_add(1, Ordering::Relaxed);
                    std::thread::yield_now();
                    continue;
                };
                let slot = guard.slot();
                assert_eq!(slot as u64, expected % 3, "stage {kind} took slot {slot}");
                if kind == 0 {
                    tags[slot].store(expected, Ordering::Relaxed);
                } else {
                    assert_eq!(tags[slot].load(Ordering::Relaxed), expected, "stage {kind}");
                }
                drop(guard);
                if kind == 2 {
                    buffer.advance().unwrap();
                }
                expected += 1;
            }
        })
    };
    // Two racing uploaders would break the "one producer" tagging, so race
    // extra threads on claims only: they must never win a slot out of turn.
    let racers: Vec<_> = (0..4)
        .map(|_| {
            let buffer = Arc::clone(&buffer);
            std::thread::spawn(move || {
                for _ in 0..2000 {
                    let states = buffer.get_states();
                    assert!(states.iter().filter(|s| s.held).count() <= 3);
                }
            })
        })
        .collect();
    let handles = [stage(0), stage(1), stage(2)];
    for h in handles.into_iter().chain(racers) {
        h.join().unwrap();
    }
    assert!(
        buffer
            .get_states()
            .iter()
            .all(|s| s.state == SlotState::Free && !s.held)
    );
}

#[test]
fn many_threads_claiming_at_once_get_each_slot_once() {
    for _ in 0..50 {
        let buffer = Arc::new(GpuTripleBuffer::<u8>::new(&ctx(), 1).unwrap());
        let barrier = Arc::new(std::sync::Barrier::new(8));
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let (buffer, barrier) = (Arc::clone(&buffer), Arc::clone(&barrier));
                std::thread::spawn(move || {
                    barrier.wait();
                    // Claim and keep the slot held: report which one we got.
                    let guard = buffer.get_upload_buffer();
                    let slot = guard.as_ref().map(|g| g.slot());
                    barrier.wait();
                    slot
                })
            })
            .collect();
        let mut won: Vec<usize> = handles
            .into_iter()
            .filter_map(|h| h.join().unwrap())
            .collect();
        won.sort_unstable();
        let claims = won.len();
        won.dedup();
        assert_eq!(won.len(), claims, "a slot was handed to two threads");
        // Never the same slot twice; at most three winners.
        assert!(won.len() <= 3);
        let uploading = buffer
            .get_states()
            .iter()
            .filter(|s| s.state == SlotState::Uploading)
            .count();
        assert_eq!(uploading, won.len());
    }
}
