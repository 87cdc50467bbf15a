//! Sticky errors: what a fault during stream work leaves behind, on its
//! stream and on its device's context.
//!
//! A stream keeps its own fault (see `stream`); this file keeps each
//! context's: the first fault of any of its streams (what `cuCtxSynchronize`
//! answers) and the fault that poisoned it, which every stream of the device
//! then answers. Why errors are sticky, and how tests make and clear them, is
//! told in `faults`, the fault-injection API built on this.

use crate::errors::fail;
use crate::handles::lock;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use sys::CUresult;

/// A sticky stream error: what a faulting kernel leaves behind on a GPU.
#[derive(Clone, Debug)]
pub(crate) struct Fault {
    pub(crate) code: CUresult,
    pub(crate) detail: String,
}

/// Each device's context's sticky errors, indexed by device.
static CONTEXTS: Mutex<Vec<ContextFaults>> = Mutex::new(Vec::new());
/// Whether any context is poisoned: checked on every submission and by every
/// worker before each operation, so the common case takes no lock.
static ANY_POISONED: AtomicBool = AtomicBool::new(false);

#[derive(Clone, Default)]
struct ContextFaults {
    /// The first fault of any stream of the context (for `cuCtxSynchronize`).
    first: Option<Fault>,
    /// The fault that poisoned the whole context, if one did.
    poison: Option<Fault>,
}

/// Run `f` on device `device`'s entry, created on first use.
fn with_context<R>(device: i32, f: impl FnOnce(&mut ContextFaults) -> R) -> R {
    let mut all = lock(&CONTEXTS);
    let index = usize::try_from(device).unwrap_or(0);
    if all.len() <= index {
        all.resize_with(index + 1, ContextFaults::default);
    }
    f(&mut all[index])
}

/// A stream of `device` faulted: its context is faulted too (for
/// `cuCtxSynchronize`). With `poison` (an error during the work itself, as
/// opposed to one taken over from a stream it waited on, or the software
/// NCCL's), every other stream of the context fails with it too, as on a GPU.
pub(crate) fn note_context_fault(device: i32, fault: &Fault, poison: bool) {
    with_context(device, |context| {
        context.first.get_or_insert_with(|| fault.clone());
        if poison {
            context.poison.get_or_insert_with(|| fault.clone());
        }
    });
    if poison {
        ANY_POISONED.store(true, Ordering::Release);
    }
}

/// The fault that poisoned `device`'s context, if one did.
pub(crate) fn poison(device: i32) -> Option<Fault> {
    if !ANY_POISONED.load(Ordering::Acquire) {
        return None;
    }
    with_context(device, |context| context.poison.clone())
}

/// `device`'s context's sticky error, if it is poisoned: what a call on a
/// faulted context answers on a GPU (allocations, new streams and events).
pub(crate) fn check_context(device: i32) -> Result<(), CUresult> {
    match poison(device) {
        Some(fault) => Err(fail(fault.code, fault.detail)),
        None => Ok(()),
    }
}

/// `device`'s context's sticky error, for `cuCtxSynchronize`: the first fault
/// of any of its streams.
pub(crate) fn context_fault(device: i32) -> Result<(), CUresult> {
    match with_context(device, |context| context.first.clone()) {
        Some(fault) => Err(fail(fault.code, fault.detail)),
        None => Ok(()),
    }
}

/// Forget `device`'s context's sticky errors: the context was destroyed, or
/// fault injection cleared its last faulted stream.
pub(crate) fn forget_context_faults(device: i32) {
    with_context(device, |context| *context = ContextFaults::default());
    refresh_any_poisoned();
}

/// Forget every context's sticky errors (fault injection's `reset`).
pub(crate) fn forget_all_context_faults() {
    lock(&CONTEXTS).clear();
    ANY_POISONED.store(false, Ordering::Release);
}

fn refresh_any_poisoned() {
    let any = lock(&CONTEXTS).iter().any(|c| c.poison.is_some());
    ANY_POISONED.store(any, Ordering::Release);
}
