//! The reactor thread: its rounds over the watched slots, and how it waits
//! between them.

use super::backoff::Backoff;
use super::config::{ReactorConfig, WakeMode};
use super::slots::{Shared, SlotState, State};
use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::Waker;
use std::time::{Duration, Instant};
use sys::CUresult;

/// The host function of [`WakeMode::HostFn`]: unpark the reactor thread.
pub(super) unsafe extern "C" fn wake_reactor(data: *mut c_void) {
    // SAFETY: `data` is the Arc leaked by `register`, handed over exactly once.
    let shared = unsafe { Arc::from_raw(data as *const Shared) };
    let _ = catch_unwind(AssertUnwindSafe(|| Shared::kick(&shared.lock())));
}

/// Shorten timer slack so that parks of a few microseconds last about that
/// long (Linux rounds sleeps of ordinary threads up by 50 µs by default).
fn tighten_timer_slack() {
    #[cfg(target_os = "linux")]
    // SAFETY: PR_SET_TIMERSLACK takes an integer and affects this thread only.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong);
    }
}

/// The reactor thread.
pub(super) fn run(shared: &Shared) {
    tighten_timer_slack();
    // SAFETY: the context outlives the thread (its Drop joins it first).
    let bound = unsafe { (shared.driver.cuCtxSetCurrent)(shared.ctx) };
    if bound != CUresult::CUDA_SUCCESS {
        tracing::error!(?bound, "the reactor thread could not bind its context");
    }
    let mut last_activity = Instant::now();
    let mut last_check = Instant::now();
    let mut backoff = Backoff::default();
    let mut wakers = Vec::new();
    loop {
        let next = {
            let mut state = shared.lock();
            if state.shutdown {
                return;
            }
            let now = Instant::now();
            let check_events = now.duration_since(last_check) >= state.config.error_check;
            if check_events {
                last_check = now;
            }
            let plan = scan(shared, &mut state, now, check_events, &mut wakers);
            if plan.finished || std::mem::take(&mut state.activity) {
                last_activity = now;
                backoff.reset(&state.config);
            }
            let next = next_wait(&state.config, &plan, now, last_activity, &mut backoff);
            if let Next::Park(_) = next {
                state.stats.parks += 1;
            }
            next
        };
        for waker in wakers.drain(..) {
            // A waker is user code (an executor's); it must not take the
            // reactor down.
            if catch_unwind(AssertUnwindSafe(|| waker.wake())).is_err() {
                tracing::error!("a waker panicked; the reactor goes on");
            }
        }
        match next {
            Next::Sleep => {
                std::thread::park();
                last_activity = Instant::now();
            }
            Next::Spin => std::hint::spin_loop(),
            Next::Park(timeout) => std::thread::park_timeout(timeout),
        }
    }
}

/// How the thread waits before its next round.
enum Next {
    /// Nothing is watched: until a new wait unparks it.
    Sleep,
    /// Look again at once.
    Spin,
    /// Until this timeout, or an unpark.
    Park(Duration),
}

fn next_wait(
    config: &ReactorConfig,
    plan: &Plan,
    now: Instant,
    last_activity: Instant,
    backoff: &mut Backoff,
) -> Next {
    if !plan.watching {
        return Next::Sleep;
    }
    match config.mode {
        WakeMode::Spin => Next::Spin,
        WakeMode::Adaptive if plan.due_now => Next::Spin,
        WakeMode::Adaptive
            if plan.youngest_unforeseen.is_some()
                && now.duration_since(last_activity) < config.spin =>
        {
            Next::Spin
        }
        WakeMode::Adaptive => {
            // Waits with no history (or past their window) set the
            // back-off; foreseen ones only cut a park short so that
            // the thread is awake when their window opens.
            let mut timeout = match plan.youngest_unforeseen {
                Some(youngest) => backoff.park(config, youngest),
                None => config.error_check,
            };
            if let Some(next) = plan.next_window {
                timeout = timeout.min(next.saturating_duration_since(now));
            }
            Next::Park(timeout)
        }
        // The host function wakes us; the timeout only serves the
        // error checks (a faulted stream may run no host function).
        WakeMode::HostFn => Next::Park(config.error_check),
    }
}

/// What one round over the watched slots found, and so how to wait next.
#[derive(Default)]
struct Plan {
    /// Some wait finished.
    finished: bool,
    /// Slots are still watched.
    watching: bool,
    /// A pending wait is inside its window: spin.
    due_now: bool,
    /// How long the youngest pending wait with no window (or past it) has
    /// been pending; if any, the thread backs off.
    youngest_unforeseen: Option<Duration>,
    /// The earliest window still to open.
    next_window: Option<Instant>,
}

/// One round over the watched slots. Returns whether any finished.
fn scan(
    shared: &Shared,
    state: &mut State,
    now: Instant,
    check_events: bool,
    wakers: &mut Vec<Waker>,
) -> Plan {
    state.stats.scans += 1;
    let mut plan = Plan::default();
    let mut i = 0;
    while i < state.watched.len() {
        let slot = state.watched[i];
        let seq = state.slots[slot as usize].seq;
        let landed = Shared::flag(state, slot).load(Ordering::Acquire) == seq;
        let outcome = if landed {
            Some(CUresult::CUDA_SUCCESS)
        } else if check_events && !state.slots[slot as usize].event.is_null() {
            // SAFETY: a live event owned by the reactor; the context is current.
            match unsafe { (shared.driver.cuEventQuery)(state.slots[slot as usize].event) } {
                CUresult::CUDA_ERROR_NOT_READY => None,
                // Complete after the write: the write is done too.
                CUresult::CUDA_SUCCESS => Some(CUresult::CUDA_SUCCESS),
                error => Some(error),
            }
        } else {
            None
        };
        let Some(code) = outcome else {
            let entry = &state.slots[slot as usize];
            if entry.state == SlotState::Pending {
                match entry.window {
                    Some(window) if now < entry.registered + window.start => {
                        let opens = entry.registered + window.start;
                        plan.next_window = Some(plan.next_window.map_or(opens, |t| t.min(opens)));
                    }
                    Some(window) if now <= entry.registered + window.end => plan.due_now = true,
                    _ => {
                        let age = now.duration_since(entry.registered);
                        plan.youngest_unforeseen =
                            Some(plan.youngest_unforeseen.map_or(age, |y| y.min(age)));
                    }
                }
            }
            i += 1;
            continue;
        };
        plan.finished = true;
        state.watched.swap_remove(i);
        if let Some(index) = state.slots[slot as usize].watch.take() {
            state.watch_streams[index].pending -= 1;
        }
        let entry = &mut state.slots[slot as usize];
        match entry.state {
            SlotState::Pending => {
                if landed {
                    let (key, length) = (entry.key, now.duration_since(entry.registered));
                    state.predictor.observe(key, length);
                }
                let entry = &mut state.slots[slot as usize];
                entry.state = SlotState::Done(code);
                wakers.extend(entry.waker.take());
                state.stats.completed += 1;
                if code != CUresult::CUDA_SUCCESS {
                    state.stats.failed += 1;
                }
            }
            SlotState::Cancelled => {
                entry.state = SlotState::Free;
                let event = std::mem::replace(&mut entry.event, std::ptr::null_mut());
                if !event.is_null() {
                    state.spare_events.push(event);
                }
                state.free.push(slot);
            }
            SlotState::Free | SlotState::Done(_) => {}
        }
    }
    plan.watching = !state.watched.is_empty();
    plan
}
