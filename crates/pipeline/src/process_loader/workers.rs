//! The worker processes, seen from the GPU process: one child and one socket
//! each, a thread per worker that turns what its socket says into events on
//! one channel, and the jobs each worker holds.
//!
//! A worker's death shows as the end of its socket: the kernel closes a
//! process's descriptors when it dies, however it dies, so the reader thread
//! sees end-of-file (no polling of pids). The child's end of each socket is
//! open only in that child (closed on exec everywhere else), so no other
//! process keeps it open.

use super::command::WorkerCommand;
use super::wire::{ChannelSpec, EXIT_BAD_CHANNEL, EXIT_BAD_JOB, EXIT_UNKNOWN_FILL, Job};
use crate::error::{Error, Result};
use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, ExitStatus};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::Duration;

/// Which worker, for errors and for tests that signal one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkerId {
    /// Its index, `0..workers`.
    pub index: usize,
    /// Its process id.
    pub pid: u32,
}

/// What a reader thread reports.
#[derive(Debug)]
pub(crate) enum WorkerEvent {
    /// The worker filled a job's slot.
    Filled { worker: usize, job: Job },
    /// The worker's socket ended (it died or closed it) or failed.
    Gone { worker: usize },
}

struct Worker {
    id: WorkerId,
    child: Child,
    socket: UnixStream,
    reader: Option<JoinHandle<()>>,
    /// Jobs sent and not yet reported filled, oldest first (a worker serves
    /// its jobs in the order they were sent).
    jobs: VecDeque<Job>,
}

/// The workers of one loader.
pub(crate) struct WorkerSet {
    fill: String,
    workers: Vec<Worker>,
    events: Receiver<WorkerEvent>,
}

impl WorkerSet {
    /// Start `count` workers running `fill` over the region behind `region_fd`.
    pub(crate) fn spawn(
        command: &WorkerCommand,
        fill: &str,
        count: usize,
        region_fd: i32,
        slots: usize,
        slot_len: usize,
    ) -> Result<Self> {
        let (sender, events) = mpsc::channel();
        let mut set = Self {
            fill: fill.to_owned(),
            workers: Vec::with_capacity(count),
            events,
        };
        // On an error part-way, dropping `set` reaps the workers started so far.
        for index in 0..count {
            let worker = spawn_one(command, fill, index, region_fd, slots, slot_len, &sender)?;
            set.workers.push(worker);
        }
        Ok(set)
    }

    pub(crate) fn ids(&self) -> Vec<WorkerId> {
        self.workers.iter().map(|w| w.id).collect()
    }

    /// The worker holding the job for `batch`, if one does.
    pub(crate) fn holder_of(&self, batch: u64) -> Option<WorkerId> {
        self.workers
            .iter()
            .find(|w| w.jobs.iter().any(|job| job.batch == batch))
            .map(|w| w.id)
    }

    /// Send `job` to the worker holding the fewest jobs.
    pub(crate) fn assign(&mut self, job: Job) -> Result<()> {
        let worker = self
            .workers
            .iter_mut()
            .min_by_key(|w| w.jobs.len())
            .expect("a loader has at least one worker");
        match worker.socket.write_all(&job.encode()) {
            Ok(()) => {
                worker.jobs.push_back(job);
                Ok(())
            }
            // The worker is gone (its end closed): say who, and what it held.
            Err(_) => {
                worker.jobs.push_back(job);
                let index = worker.id.index;
                Err(self.died(index))
            }
        }
    }

    /// Wait up to `timeout` for a report.
    pub(crate) fn recv(
        &self,
        timeout: Duration,
    ) -> std::result::Result<WorkerEvent, RecvTimeoutError> {
        self.events.recv_timeout(timeout)
    }

    /// A report, if one is there now.
    pub(crate) fn try_recv(&self) -> Option<WorkerEvent> {
        self.events.try_recv().ok()
    }

    /// Take `job` off `worker`'s list, as the oldest it held; anything else
    /// is a worker that broke the protocol.
    pub(crate) fn filled(&mut self, worker: usize, job: Job) -> Result<()> {
        let w = &mut self.workers[worker];
        if w.jobs.front() == Some(&job) {
            w.jobs.pop_front();
            return Ok(());
        }
        Err(Error::InvalidConfig(format!(
            "process loader: worker {worker} (pid {}) reported slot {} filled with batch {}, \
             which is not the oldest job it holds ({:?})",
            w.id.pid,
            job.slot,
            job.batch,
            w.jobs.front()
        )))
    }

    /// The error for a worker whose socket ended: kill it if it still runs
    /// (it closed its socket but lives on), reap it, and name it, the batch
    /// it was filling and how it ended.
    pub(crate) fn died(&mut self, index: usize) -> Error {
        let fill = self.fill.clone();
        let worker = &mut self.workers[index];
        let status = match worker.child.try_wait() {
            Ok(Some(status)) => describe(status, &fill),
            // Its socket ended first: it is exiting, or closed the socket
            // and lives on. Either way it is done as a worker.
            Ok(None) => {
                let _ = worker.child.kill();
                match worker.child.wait() {
                    Ok(status) => describe(status, &fill),
                    Err(err) => format!("ended (its status is unknown: {err})"),
                }
            }
            Err(err) => format!("ended (its status is unknown: {err})"),
        };
        Error::WorkerDied {
            worker: index,
            pid: worker.id.pid,
            batch: worker.jobs.front().map(|job| job.batch),
            status,
        }
    }

    /// Stop every worker and reap it, and join the reader threads. Never
    /// panics; idempotent.
    pub(crate) fn shutdown(&mut self) {
        for worker in &mut self.workers {
            // A worker blocked reading its socket sees the end and exits; one
            // busy filling is killed (it holds nothing worth keeping: the
            // region is ours).
            let _ = worker.socket.shutdown(Shutdown::Both);
            let _ = worker.child.kill();
        }
        for worker in &mut self.workers {
            if let Err(err) = worker.child.wait() {
                tracing::warn!(
                    "process loader: reaping worker {} (pid {}): {err}",
                    worker.id.index,
                    worker.id.pid
                );
            }
            if let Some(reader) = worker.reader.take() {
                // A reader that panicked has nothing left to report.
                let _ = reader.join();
            }
        }
    }
}

impl Drop for WorkerSet {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn spawn_one(
    command: &WorkerCommand,
    fill: &str,
    index: usize,
    region_fd: i32,
    slots: usize,
    slot_len: usize,
    sender: &Sender<WorkerEvent>,
) -> Result<Worker> {
    let io_error = |what: String| move |source| Error::LoaderIo { what, source };
    let (socket, theirs) =
        UnixStream::pair().map_err(io_error(format!("a socket for worker {index}")))?;
    let spec = ChannelSpec {
        worker: index,
        region_fd,
        socket_fd: theirs.as_raw_fd(),
        slots,
        slot_len,
    };
    let child = command.spawn(fill, spec).map_err(io_error(format!(
        "starting worker {index} ({})",
        command.program().display()
    )))?;
    // Only the child may hold its end: its death must end our socket.
    drop(theirs);
    let id = WorkerId {
        index,
        pid: child.id(),
    };
    let mut worker = Worker {
        id,
        child,
        socket,
        reader: None,
        jobs: VecDeque::new(),
    };
    let reading = worker
        .socket
        .try_clone()
        .map_err(io_error(format!("a reader for worker {index}")));
    let spawned = reading.and_then(|reading| {
        let sender = sender.clone();
        std::thread::Builder::new()
            .name(format!("loader-worker-{index}"))
            .spawn(move || read_reports(index, reading, sender))
            .map_err(io_error(format!("a reader thread for worker {index}")))
    });
    match spawned {
        Ok(reader) => {
            worker.reader = Some(reader);
            Ok(worker)
        }
        Err(err) => {
            let _ = worker.child.kill();
            let _ = worker.child.wait();
            Err(err)
        }
    }
}

/// A reader thread: each frame is a filled job; the end of the socket, or
/// a failure, is the worker gone.
fn read_reports(worker: usize, mut socket: UnixStream, sender: Sender<WorkerEvent>) {
    let mut frame = [0; Job::BYTES];
    loop {
        let event = match socket.read_exact(&mut frame) {
            Ok(()) => WorkerEvent::Filled {
                worker,
                job: Job::decode(frame),
            },
            Err(_) => WorkerEvent::Gone { worker },
        };
        let gone = matches!(event, WorkerEvent::Gone { .. });
        // A closed channel: the loader is gone, nobody listens.
        if sender.send(event).is_err() || gone {
            return;
        }
    }
}

/// How a worker ended, in words, with what the library's own exit codes mean.
fn describe(status: ExitStatus, fill: &str) -> String {
    if let Some(signal) = status.signal() {
        return format!("was killed by signal {signal}");
    }
    match status.code() {
        Some(EXIT_UNKNOWN_FILL) => format!(
            "exited with status {EXIT_UNKNOWN_FILL}: its program registers no fill named {fill:?} \
             with serve_if_worker"
        ),
        Some(EXIT_BAD_CHANNEL) => format!(
            "exited with status {EXIT_BAD_CHANNEL}: it could not open the loader's shared region \
             or socket (serve_if_worker must run before the program opens any file)"
        ),
        Some(EXIT_BAD_JOB) => {
            format!("exited with status {EXIT_BAD_JOB}: its socket failed or a job named no slot")
        }
        Some(0) => "exited with status 0 without being asked to (did its program call \
                    serve_if_worker?)"
            .to_owned(),
        // Rust's exit status after a panic in `main`'s thread.
        Some(101) => "exited with status 101 (a panic in its fill?)".to_owned(),
        Some(code) => format!("exited with status {code}"),
        None => format!("ended ({status})"),
    }
}
