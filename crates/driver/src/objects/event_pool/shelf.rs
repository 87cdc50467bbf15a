//! One kind's shared shelf: the free events every thread may take, and how
//! many of the kind exist (free and in use), which growth keeps under the
//! cap. Generic over what it holds, so that loom can check the protocol
//! (`loom_tests`, `RUSTFLAGS="--cfg loom"`, see docs/testing.md) without a
//! driver behind it.

use crate::ground::error::{Error, Result};
use crate::ground::sync::{AtomicUsize, Mutex, MutexGuard, Ordering};
use std::sync::PoisonError;

pub(super) struct Shelf<E> {
    free: Mutex<Vec<E>>,
    /// Items created so far (free + in use). Only growth writes it.
    created: AtomicUsize,
    cap: usize,
    kind: &'static str,
}

impl<E> Shelf<E> {
    /// A shelf holding `free`, all of the kind that exist so far.
    pub(super) fn new(free: Vec<E>, cap: usize, kind: &'static str) -> Self {
        Self {
            created: AtomicUsize::new(free.len()),
            free: Mutex::new(free),
            cap,
            kind,
        }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, Vec<E>> {
        // A panic while holding the lock cannot leave the Vec half-updated.
        self.free.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How many exist, free and in use.
    pub(super) fn created(&self) -> usize {
        self.created.load(Ordering::Acquire)
    }

    pub(super) fn cap(&self) -> usize {
        self.cap
    }

    /// A free item, or else a new one from `create` while the cap allows;
    /// `true` with a new one.
    pub(super) fn take_or_grow(&self, create: impl FnOnce() -> Result<E>) -> Result<(E, bool)> {
        // Bind the pop's result first so the guard is released before growth.
        let popped = self.lock().pop();
        match popped {
            Some(item) => Ok((item, false)),
            None => self.grow(create).map(|item| (item, true)),
        }
    }

    /// Create one more, unless the cap is reached. The place is taken before
    /// `create` runs, so racing growers never pass the cap, and given back
    /// when it fails, so a failure does not count.
    fn grow(&self, create: impl FnOnce() -> Result<E>) -> Result<E> {
        self.created
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.cap).then_some(n + 1)
            })
            .map_err(|_| Error::EventPoolExhausted {
                kind: self.kind,
                cap: self.cap,
            })?;
        create().inspect_err(|_| {
            self.created.fetch_sub(1, Ordering::AcqRel);
        })
    }

    /// Put a free item back.
    pub(super) fn put(&self, item: E) {
        self.lock().push(item);
    }
}

#[cfg(all(test, loom))]
mod loom_tests;
