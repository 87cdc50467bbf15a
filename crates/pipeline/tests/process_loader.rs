//! The multi-process loader with real worker processes: this test binary
//! runs itself again as the workers, with only the ignored
//! `process_loader_worker_entry` selected, which serves the fills below.

mod common;

use common::ctx;
use cuda_streams_pipeline::driver::{Context, DeviceBuffer};
use cuda_streams_pipeline::{
    Error, ProcessLoader, ProcessLoaderBuilder, WorkerCommand, serve_if_worker,
};
use kernels::typed::Elementwise;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use test_support::Gate;
use test_support::serial;

const LEN: usize = 3000;
/// The batch whose job `stall` never finishes.
const STALLED: u64 = 3;
/// The normalisation: `out = A * x + B`.
const A: f32 = 0.5;
const B: f32 = -1.0;

/// Batch `batch`'s raw values, exact in `f32` for the batches used here.
fn raw_value(batch: u64, i: usize) -> f32 {
    (batch * LEN as u64 + i as u64) as f32
}

fn ramp(batch: u64, out: &mut [f32]) {
    for (i, value) in out.iter_mut().enumerate() {
        *value = raw_value(batch, i);
    }
}

/// `ramp`, except that the job of batch `STALLED` never finishes.
fn stall(batch: u64, out: &mut [f32]) {
    if batch == STALLED {
        loop {
            std::thread::park();
        }
    }
    ramp(batch, out);
}

/// `ramp`, except that the fill of batch `STALLED` panics.
fn panics(batch: u64, out: &mut [f32]) {
    assert_ne!(batch, STALLED, "a fill that fails");
    ramp(batch, out);
}

/// Not a test: the workers' entry point, run by the tests below in child
/// processes (`--ignored`), where it never returns.
#[test]
#[ignore = "the loader's workers: run as child processes by the tests of this file"]
fn process_loader_worker_entry() {
    serve_if_worker(&[("ramp", ramp), ("stall", stall), ("panics", panics)]);
}

fn workers_command() -> WorkerCommand {
    WorkerCommand::current_exe()
        .unwrap()
        .args([
            "process_loader_worker_entry",
            "--exact",
            "--ignored",
            "--quiet",
        ])
        .discard_stdout()
}

/// A loader of `fill` normalising each batch with `scale_add` (`A * x + B * 1`).
fn loader(ctx: &Arc<Context>, fill: &str, workers: usize, batches: u64) -> ProcessLoaderBuilder {
    let kernels = Elementwise::load(ctx).unwrap();
    let setup = driver::Stream::new(ctx).unwrap();
    let mut ones = DeviceBuffer::<f32>::new_async(&setup, LEN).unwrap();
    kernels.fill_f32(&setup, 1.0, &mut ones).unwrap();
    setup.synchronize().unwrap();
    ProcessLoader::builder(fill, LEN)
        .workers(workers)
        .batches(batches)
        .command(workers_command())
        .gpu_step(move |stream, raw, out| kernels.scale_add(stream, A, raw, B, &ones, out))
}

fn expected(batch: u64) -> Vec<f32> {
    (0..LEN)
        .map(|i| kernels::reference::scale_add_element(A, raw_value(batch, i), B, 1.0))
        .collect()
}

/// This process's open descriptors.
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Deliver every batch and check each against its index, then drop the
/// loader and check that its workers are reaped and its descriptors closed.
fn delivers_in_order(workers: usize, batches: u64) {
    let _serial = serial();
    let ctx = ctx();
    let fds = open_fds();
    let mut loader = loader(&ctx, "ramp", workers, batches).build(&ctx).unwrap();
    let pids: Vec<u32> = loader.workers().iter().map(|w| w.pid).collect();
    assert_eq!(pids.len(), workers);
    let stream = loader.stream().clone();
    let mut seen = 0;
    while let Some(batch) = loader.next_batch().unwrap() {
        assert_eq!(batch.index(), seen, "batches arrive in order");
        assert_eq!(
            batch.data().to_vec(&stream).unwrap(),
            expected(seen),
            "batch {seen}"
        );
        seen += 1;
    }
    assert_eq!(seen, batches);
    assert!(
        loader.next_batch().unwrap().is_none(),
        "the loader stays at its end"
    );
    let device_memory = stream.counters();
    drop(loader);
    assert_eq!(
        device_memory.metrics().current_memory,
        0,
        "every device buffer freed"
    );
    for pid in pids {
        // A reaped child has no /proc entry (a zombie would).
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "worker {pid} reaped"
        );
    }
    assert_eq!(
        open_fds(),
        fds,
        "the region's and the sockets' descriptors are closed"
    );
}

#[test]
fn one_worker_delivers_every_batch_normalised_in_order() {
    delivers_in_order(1, 12);
}

#[test]
fn four_workers_deliver_every_batch_normalised_in_order() {
    delivers_in_order(4, 40);
}

#[test]
fn a_slot_goes_back_to_a_worker_only_after_its_upload_has_completed() {
    let _serial = serial();
    let ctx = ctx();
    let slots = 4;
    let mut loader = loader(&ctx, "ramp", 1, 12)
        .slots(slots)
        .build(&ctx)
        .unwrap();
    let stream = loader.stream().clone();
    let gate = Gate::close(loader.upload_stream());
    // Every upload waits behind the gate: each slot is uploaded once, and
    // none may go back to the worker.
    let held: Vec<_> = (0..slots)
        .map(|_| loader.next_batch().unwrap().unwrap())
        .collect();
    if gate.still_held() {
        assert_eq!(loader.batches_handed_out(), slots as u64);
    }
    gate.open();
    for batch in held {
        assert_eq!(
            batch.data().to_vec(&stream).unwrap(),
            expected(batch.index())
        );
    }
    for index in slots as u64..12 {
        let batch = loader.next_batch().unwrap().unwrap();
        assert_eq!(batch.index(), index);
        assert_eq!(batch.data().to_vec(&stream).unwrap(), expected(index));
    }
    assert_eq!(loader.batches_handed_out(), 12);
}

#[test]
fn uploads_go_on_while_the_gpu_steps_wait() {
    let _serial = serial();
    let ctx = ctx();
    let slots = 4;
    let mut loader = loader(&ctx, "ramp", 1, 8)
        .slots(slots)
        .deadline(Duration::from_secs(5)) // well inside the gate's limit
        .build(&ctx)
        .unwrap();
    let stream = loader.stream().clone();
    assert_ne!(loader.upload_stream().id(), stream.id());
    let gate = Gate::close(&stream);
    // Batches 0..4 take the four slots; batch 4 needs slot 0 back, which
    // comes once batch 0's upload has completed. Every GPU step waits
    // behind the gate: were the uploads behind the steps, slot 0 would not
    // come back before the deadline, and batch 4 would be an error.
    let held: Vec<_> = (0..=slots)
        .map(|_| loader.next_batch().unwrap().unwrap())
        .collect();
    let held_then = gate.still_held();
    gate.open();
    if held_then {
        // Slots 0 and 1 at most: batch 2's upload is behind the free of
        // batch 0's upload buffer, which waits for batch 0's step.
        let handed = loader.batches_handed_out();
        assert!((5..=6).contains(&handed), "{handed} batches handed out");
    }
    for batch in held {
        assert_eq!(
            batch.data().to_vec(&stream).unwrap(),
            expected(batch.index())
        );
    }
    for index in slots as u64 + 1..8 {
        let batch = loader.next_batch().unwrap().unwrap();
        assert_eq!(batch.data().to_vec(&stream).unwrap(), expected(index));
    }
}

#[test]
fn a_worker_killed_mid_batch_is_named_with_its_batch_and_nothing_leaks() {
    let _serial = serial();
    let ctx = ctx();
    let fds = open_fds();
    let mut loader = loader(&ctx, "stall", 2, 10)
        .deadline(Duration::from_secs(60))
        .build(&ctx)
        .unwrap();
    let pids: Vec<u32> = loader.workers().iter().map(|w| w.pid).collect();
    for index in 0..STALLED {
        assert_eq!(loader.next_batch().unwrap().unwrap().index(), index);
    }
    let holder = loader
        .worker_holding(STALLED)
        .expect("a worker holds the stalled batch");
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &holder.pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let device_memory = loader.stream().counters();
    let upload_memory = loader.upload_stream().counters();
    let err = loader.next_batch().unwrap_err();
    match &err {
        Error::WorkerDied {
            worker,
            pid,
            batch,
            status,
        } => {
            assert_eq!(
                (*worker, *pid, *batch),
                (holder.index, holder.pid, Some(STALLED))
            );
            assert_eq!(status, "was killed by signal 9");
        }
        other => panic!("expected WorkerDied, got {other:?}"),
    }
    assert_eq!(
        err.to_string(),
        format!(
            "process loader: worker {} (pid {}) was killed by signal 9 while filling batch {STALLED}",
            holder.index, holder.pid
        )
    );
    // Later calls repeat the error; the iterator yields it once, then ends.
    assert!(
        matches!(loader.next_batch(), Err(Error::LoaderFailed(message)) if message == err.to_string())
    );
    assert!(matches!(loader.next(), Some(Err(Error::LoaderFailed(_)))));
    assert!(loader.next().is_none());
    // Every batch delivered was dropped; the last upload, which its GPU
    // step read, is freed with the loader.
    assert_eq!(device_memory.metrics().current_memory, 0);
    assert_eq!(upload_memory.metrics().current_memory, (LEN * 4) as u64);
    drop(loader);
    assert_eq!(
        (
            device_memory.metrics().current_memory,
            upload_memory.metrics().current_memory
        ),
        (0, 0),
        "every device buffer freed"
    );
    for pid in pids {
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "worker {pid} reaped"
        );
    }
    assert_eq!(
        open_fds(),
        fds,
        "the region's and the sockets' descriptors are closed"
    );
}

#[test]
fn a_batch_late_past_the_deadline_names_the_worker_holding_it() {
    let _serial = serial();
    let ctx = ctx();
    let mut loader = loader(&ctx, "stall", 1, 10)
        .deadline(Duration::from_millis(300))
        .build(&ctx)
        .unwrap();
    for index in 0..STALLED {
        assert_eq!(loader.next_batch().unwrap().unwrap().index(), index);
    }
    let holder = loader.worker_holding(STALLED).unwrap();
    let err = loader.next_batch().unwrap_err();
    assert!(
        matches!(err, Error::WorkerTimeout { worker: 0, batch: STALLED, pid, .. } if pid == holder.pid),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .contains(&format!("batch {STALLED} did not arrive within 300ms")),
        "{err}"
    );
    // Dropping the loader kills the stalled worker and reaps it.
    drop(loader);
    assert!(!Path::new(&format!("/proc/{}", holder.pid)).exists());
}

#[test]
fn an_upload_stalled_past_the_deadline_names_the_slot_and_its_stream() {
    let _serial = serial();
    let ctx = ctx();
    let slots = 4;
    let mut loader = loader(&ctx, "ramp", 1, 12)
        .slots(slots)
        .deadline(Duration::from_millis(300))
        .build(&ctx)
        .unwrap();
    let stream = loader.stream().clone();
    let uploads = loader.upload_stream().clone();
    let gate = Gate::close(&uploads);
    // Every slot is uploaded once, behind the gate; the next batch needs a
    // slot, and none comes back while the gate holds.
    let held: Vec<_> = (0..slots)
        .map(|_| loader.next_batch().unwrap().unwrap())
        .collect();
    let err = loader.next_batch().unwrap_err();
    let held_then = gate.still_held();
    gate.open();
    if held_then {
        assert!(
            matches!(err, Error::UploadTimeout { batch: 4, stream: s, .. } if s == uploads.id()),
            "{err:?}"
        );
        let text = err.to_string();
        assert!(text.contains("batch 4 waits for a free slot"), "{text}");
        assert!(text.contains("within 300ms"), "{text}");
    }
    // The batches handed out before are whole.
    for batch in held {
        assert_eq!(
            batch.data().to_vec(&stream).unwrap(),
            expected(batch.index())
        );
    }
}

#[test]
fn a_fill_the_workers_do_not_offer_is_named() {
    let _serial = serial();
    let ctx = ctx();
    let mut loader = loader(&ctx, "no-such-fill", 1, 4).build(&ctx).unwrap();
    let err = loader.next_batch().unwrap_err();
    let message = err.to_string();
    assert!(
        matches!(
            err,
            Error::WorkerDied {
                worker: 0,
                batch: Some(0),
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        message.contains("registers no fill named \"no-such-fill\""),
        "{message}"
    );
}

#[test]
fn a_worker_whose_fill_panics_is_named_with_its_batch() {
    let _serial = serial();
    let ctx = ctx();
    let mut loader = loader(&ctx, "panics", 2, 10).build(&ctx).unwrap();
    let taken: Vec<u64> = (0..STALLED)
        .map(|_| loader.next_batch().unwrap().unwrap().index())
        .collect();
    assert_eq!(taken, [0, 1, 2]);
    let err = loader.next_batch().unwrap_err();
    assert!(
        matches!(
            err,
            Error::WorkerDied {
                batch: Some(STALLED),
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .contains("exited with status 101 (a panic in its fill?) while filling batch 3"),
        "{err}"
    );
}

#[test]
fn a_loader_can_move_to_another_thread() {
    fn send<T: Send>() {}
    send::<ProcessLoader>();
    send::<cuda_streams_pipeline::LoadedBatch>();
}

#[test]
fn empty_batches_and_no_workers_are_refused() {
    let _serial = serial();
    let ctx = ctx();
    let err = ProcessLoader::builder("ramp", 0).build(&ctx).unwrap_err();
    assert!(err.to_string().contains("would be empty"), "{err}");
    let err = ProcessLoader::builder("ramp", 4)
        .workers(0)
        .build(&ctx)
        .unwrap_err();
    assert!(err.to_string().contains("0 workers"), "{err}");
}
