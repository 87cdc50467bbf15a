//! A stream: an in-order queue drained by its own worker thread.
//!
//! Every operation gets a ticket (1, 2, 3 ... in submission order); the worker
//! runs them in order and counts `completed`. "Has the stream passed point t"
//! is `completed >= t`, which is what events, waits and synchronize ask. A wait
//! only ever names a ticket that was already submitted when the wait was, so the
//! waits between workers follow submission order and cannot form a cycle.

use crate::errors::{Status, fail};
use crate::handles::{Registry, lock, mint};
use crate::ops::{Action, Op, Template};
use crate::sticky_errors::Fault;
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::Duration;
use sys::{CUresult, CUstream};

/// Streams by handle (what the API resolves).
pub(crate) static STREAMS: Registry<Stream> = Registry::new();
/// Streams whose worker is still running, including destroyed streams that are
/// draining: `cuCtxSynchronize` waits for all of them.
static LIVE: Registry<Stream> = Registry::new();

pub(crate) struct Stream {
    pub(crate) handle: usize,
    /// The device of the context it was created in.
    pub(crate) device: i32,
    pub(crate) flags: u32,
    pub(crate) priority: i32,
    state: Mutex<State>,
    /// The worker waits here for work (or for the stream to close).
    work: Condvar,
    /// Threads waiting for the worker to pass a ticket wait here.
    done: Condvar,
}

pub(crate) struct State {
    queue: VecDeque<Op>,
    submitted: u64,
    completed: u64,
    closing: bool,
    /// Threads blocked on `done`; the worker skips the wake-up when zero.
    waiters: usize,
    /// The device of the stream (for its context's sticky error).
    device: i32,
    pub(crate) fault: Option<Fault>,
    /// The ticket of the operation that faulted (meaningful with `fault`):
    /// a stream waiting for an earlier point is not held to it.
    fault_ticket: u64,
    pub(crate) inject_launch_fault: bool,
    /// Launches made with programmatic stream serialization allowed
    /// (`cuLaunchKernelEx`), for [`crate::programmatic_launches`].
    pub(crate) programmatic_launches: u64,
    pub(crate) delay: Option<Duration>,
    pub(crate) capture: Option<crate::graph::Capturing>,
}

impl State {
    /// The sticky error, as the code to return (with its detail for this thread).
    pub(crate) fn fault_status(&self) -> Status {
        match self
            .fault
            .clone()
            .or_else(|| crate::sticky_errors::poison(self.device))
        {
            Some(fault) => Err(fail(fault.code, fault.detail)),
            None => Ok(()),
        }
    }

    /// Forget the stream's own sticky error (fault injection's `clear`).
    pub(crate) fn clear_fault(&mut self) {
        self.fault = None;
        self.fault_ticket = 0;
    }
}

impl Stream {
    /// A new stream with a running worker, registered as live.
    pub(crate) fn spawn(
        handle: usize,
        flags: u32,
        priority: i32,
        device: i32,
    ) -> Result<Arc<Self>, CUresult> {
        let stream = Arc::new(Stream {
            handle,
            device,
            flags,
            priority,
            state: Mutex::new(State {
                queue: VecDeque::new(),
                submitted: 0,
                completed: 0,
                closing: false,
                waiters: 0,
                device,
                fault: None,
                fault_ticket: 0,
                inject_launch_fault: false,
                programmatic_launches: 0,
                delay: None,
                capture: None,
            }),
            work: Condvar::new(),
            done: Condvar::new(),
        });
        LIVE.insert_at(handle, Arc::clone(&stream));
        let worker = Arc::clone(&stream);
        let spawned = std::thread::Builder::new()
            .name(format!("soft-cuda-stream-{handle:#x}"))
            .spawn(move || worker.work());
        if spawned.is_err() {
            let _ = LIVE.remove(handle);
            return Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
        }
        Ok(stream)
    }

    pub(crate) fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Take the next operation, or `None` once the stream is closed and drained.
    fn next(&self) -> Option<(Op, Option<Duration>, bool)> {
        let mut state = self.state();
        loop {
            if let Some(op) = state.queue.pop_front() {
                let delay = state.delay.take();
                let faulted =
                    state.fault.is_some() || crate::sticky_errors::poison(self.device).is_some();
                return Some((op, delay, faulted));
            }
            if state.closing {
                return None;
            }
            state = self.work.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// The worker: run operations in order until the stream is closed and
    /// drained. No driver lock is held while an operation (user code) runs.
    fn work(self: Arc<Self>) {
        let mut nth = 0;
        while let Some((op, delay, faulted)) = self.next() {
            if let Some(delay) = delay {
                std::thread::sleep(delay);
            }
            crate::shuffle::before_operation(self.handle, nth);
            nth += 1;
            let poisons = op.poisons_context();
            let fault = op.run(faulted, self.device);
            let mut state = self.state();
            // Noted before `completed` moves: a stream waiting for this
            // ticket must see the fault when its wait returns.
            if let Some(fault) = fault {
                crate::sticky_errors::note_context_fault(self.device, &fault, poisons);
                if state.fault.is_none() {
                    state.fault = Some(fault);
                    state.fault_ticket = state.completed + 1;
                }
            }
            state.completed += 1;
            if state.waiters > 0 {
                self.done.notify_all();
            }
        }
        let _ = LIVE.remove(self.handle);
    }

    /// Enqueue (or, in capture mode, record) `templates` as one contiguous
    /// batch. Fails with the stream's sticky error, or `INVALID_HANDLE` once
    /// the stream is destroyed.
    pub(crate) fn submit(self: &Arc<Self>, templates: &[Template]) -> Status {
        let mut state = self.state();
        state.fault_status()?;
        if state.closing {
            return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
        }
        if let Some(capturing) = state.capture.as_mut() {
            return capturing.record(templates);
        }
        let before = state.queue.len();
        for (index, template) in templates.iter().enumerate() {
            let op = match template {
                Template::Act(Action::Instance(make)) => Op::Act(make()),
                Template::Act(action) => Op::Act(action.clone()),
                Template::Record(event) if event.shared().is_some() => {
                    crate::ipc_event::record_op(event)
                }
                Template::Wait(event) if event.shared().is_some() => {
                    match crate::ipc_event::wait_op(event) {
                        Some(op) => op,
                        None => continue,
                    }
                }
                Template::Record(event) => {
                    let ticket = state.submitted + 1;
                    let generation = event.begin_record(Arc::clone(self), ticket);
                    Op::Marker(Arc::clone(event), generation)
                }
                Template::Wait(event) if event.captured().is_some() => {
                    // An event of a capture: this stream joins it, and the
                    // rest of the batch is captured too.
                    let Some((capture, frontier)) = event.captured() else {
                        continue;
                    };
                    let mut capturing = crate::graph::Capturing::join(self, capture, frontier)?;
                    let rest = &templates[index + 1..];
                    let recorded = capturing.record(rest);
                    state.capture = Some(capturing);
                    if state.queue.len() > before {
                        self.work.notify_one();
                    }
                    return recorded;
                }
                Template::Wait(event) => match event.target() {
                    // Never recorded: nothing to wait for, as on the GPU.
                    None => continue,
                    // Already ordered by the queue itself.
                    Some((stream, _)) if Arc::ptr_eq(&stream, self) => continue,
                    Some((stream, ticket)) => Op::Wait(stream, ticket),
                },
            };
            state.submitted += 1;
            state.queue.push_back(op);
        }
        if state.queue.len() > before {
            self.work.notify_one();
        }
        Ok(())
    }

    /// Fail with the sticky error or `STREAM_CAPTURE_UNSUPPORTED` when the
    /// stream cannot take work that does not go through [`Stream::submit`]
    /// (asynchronous allocations).
    pub(crate) fn check_usable(&self) -> Status {
        let state = self.state();
        state.fault_status()?;
        if state.capture.is_some() {
            return Err(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        }
        if state.closing {
            return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
        }
        Ok(())
    }

    /// Whether the worker has completed every operation submitted so far.
    pub(crate) fn is_idle(&self) -> bool {
        let state = self.state();
        state.completed >= state.submitted
    }

    /// Whether the worker has completed operation `ticket`.
    pub(crate) fn passed(&self, ticket: u64) -> bool {
        self.state().completed >= ticket
    }

    /// Block until the worker has completed operation `ticket`.
    pub(crate) fn wait_for(&self, ticket: u64) {
        let mut state = self.state();
        if state.completed >= ticket {
            return;
        }
        state.waiters += 1;
        while state.completed < ticket {
            state = self.done.wait(state).unwrap_or_else(|e| e.into_inner());
        }
        state.waiters -= 1;
    }

    /// The sticky error that work ordered after this stream's operation
    /// `ticket` must not run past: the stream's own fault if it came at or
    /// before `ticket`, else the fault that poisoned its context (taken as
    /// covering every point: what the worker skipped after it is unknown).
    pub(crate) fn failed_by(&self, ticket: u64) -> Option<Fault> {
        let state = self.state();
        match &state.fault {
            Some(fault) if state.fault_ticket <= ticket => Some(fault.clone()),
            _ => crate::sticky_errors::poison(self.device),
        }
    }

    /// `cuStreamSynchronize`: wait for everything submitted so far.
    pub(crate) fn synchronize(&self) -> Status {
        let ticket = {
            let state = self.state();
            if let Some(capturing) = &state.capture {
                return Err(capturing.refuse("cuStreamSynchronize", self.handle));
            }
            state.submitted
        };
        self.wait_for(ticket);
        self.state().fault_status()
    }

    /// `cuStreamQuery`.
    pub(crate) fn query(&self) -> Status {
        let state = self.state();
        if let Some(capturing) = &state.capture {
            return Err(capturing.refuse("cuStreamQuery", self.handle));
        }
        state.fault_status()?;
        if state.completed >= state.submitted {
            Ok(())
        } else {
            Err(CUresult::CUDA_ERROR_NOT_READY)
        }
    }

    /// Let the worker drain what is queued, then exit.
    pub(crate) fn close(&self) {
        let mut state = self.state();
        state.closing = true;
        state.capture = None;
        self.work.notify_one();
    }
}

/// Device `device`'s legacy default stream (the null handle,
/// `CU_STREAM_LEGACY` and `CU_STREAM_PER_THREAD`): one stream per device with
/// its own worker.
fn legacy(device: i32) -> Result<Arc<Stream>, CUresult> {
    type Spawned = OnceLock<Result<Arc<Stream>, CUresult>>;
    static LEGACY: OnceLock<Vec<Spawned>> = OnceLock::new();
    let all = LEGACY.get_or_init(|| {
        (0..crate::device::device_count())
            .map(|_| OnceLock::new())
            .collect()
    });
    all[device as usize]
        .get_or_init(|| Stream::spawn(mint(), 0, 0, device))
        .clone()
}

/// The stream behind `handle`. The null stream needs a current context, as on
/// a GPU, where it means "the current context's default stream".
pub(crate) fn resolve(handle: CUstream) -> Result<Arc<Stream>, CUresult> {
    match handle as usize {
        0..=2 => legacy(crate::context::require()?),
        handle => STREAMS.get(handle),
    }
}

/// Wait for the work submitted so far to every stream of `device` in the
/// current context (`cuCtxSynchronize`): in the primary context, every
/// stream of the device, its green contexts' too (as CUDA documents); in a
/// green context, that green context's streams only.
pub(crate) fn synchronize_all(device: i32) {
    let current = crate::context::current_green();
    let in_current = |s: &Arc<Stream>| {
        s.device == device
            && (current == 0 || crate::green_contexts::green_of_stream(s.handle) == current)
    };
    for stream in LIVE.all().into_iter().filter(in_current) {
        let ticket = {
            let state = stream.state();
            if state.capture.is_some() {
                continue;
            }
            state.submitted
        };
        stream.wait_for(ticket);
    }
}

/// Fail `call` (a context-wide synchronize) when some stream is capturing,
/// invalidating those captures, as on a GPU.
pub(crate) fn refuse_during_capture(call: &str) -> Status {
    let mut refused = Ok(());
    for stream in LIVE.all() {
        if let Some(capturing) = &stream.state().capture {
            refused = Err(capturing.refuse(call, stream.handle));
        }
    }
    refused
}

/// Every stream whose worker still runs.
pub(crate) fn live() -> Vec<Arc<Stream>> {
    LIVE.all()
}
