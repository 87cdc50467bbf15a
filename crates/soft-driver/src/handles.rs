//! Opaque handles and the registries that resolve them.
//!
//! Every handle the driver gives out (stream, event, module, function, pool,
//! graph) is a number minted from one process-wide counter, never an address of
//! driver state. A handle is resolved only through its kind's registry, so a
//! destroyed handle, a handle of another kind or a pointer from nowhere answers
//! `CUDA_ERROR_INVALID_HANDLE` instead of being dereferenced. Numbers are never
//! reused, so a stale handle cannot alias a newer object.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use sys::CUresult;

/// Minted handles are 16-byte aligned and start well above the null page, so
/// they look like pointers to code that prints them, and no small integer (a
/// forgotten `0`, `1` or `2`, which CUDA gives special meanings) ever matches.
static NEXT_HANDLE: AtomicUsize = AtomicUsize::new(0x5eed_0000);

/// A fresh handle value, unique in the process.
pub(crate) fn mint() -> usize {
    NEXT_HANDLE.fetch_add(16, Ordering::Relaxed)
}

/// The objects of one handle kind, by handle value.
pub(crate) struct Registry<T> {
    objects: RwLock<Option<HashMap<usize, Arc<T>>>>,
}

impl<T> Registry<T> {
    pub(crate) const fn new() -> Self {
        Self {
            objects: RwLock::new(None),
        }
    }

    /// Register `object` under a fresh handle and return the handle.
    pub(crate) fn insert(&self, object: Arc<T>) -> usize {
        let handle = mint();
        self.insert_at(handle, object);
        handle
    }

    /// Register `object` under a handle minted by the caller.
    pub(crate) fn insert_at(&self, handle: usize, object: Arc<T>) {
        let mut objects = self.objects.write().unwrap_or_else(|e| e.into_inner());
        objects
            .get_or_insert_with(HashMap::new)
            .insert(handle, object);
    }

    /// Register `object` under `handle` unless something already is;
    /// whether it was registered.
    pub(crate) fn insert_new(&self, handle: usize, object: Arc<T>) -> bool {
        let mut objects = self.objects.write().unwrap_or_else(|e| e.into_inner());
        let map = objects.get_or_insert_with(HashMap::new);
        if map.contains_key(&handle) {
            return false;
        }
        map.insert(handle, object);
        true
    }

    /// The object behind `handle`, or `CUDA_ERROR_INVALID_HANDLE`.
    pub(crate) fn get(&self, handle: usize) -> Result<Arc<T>, CUresult> {
        let objects = self.objects.read().unwrap_or_else(|e| e.into_inner());
        objects
            .as_ref()
            .and_then(|map| map.get(&handle))
            .cloned()
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)
    }

    /// Unregister `handle`, returning its object, or `CUDA_ERROR_INVALID_HANDLE`.
    pub(crate) fn remove(&self, handle: usize) -> Result<Arc<T>, CUresult> {
        let mut objects = self.objects.write().unwrap_or_else(|e| e.into_inner());
        objects
            .as_mut()
            .and_then(|map| map.remove(&handle))
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)
    }

    /// Every registered object with its handle (a snapshot).
    pub(crate) fn entries(&self) -> Vec<(usize, Arc<T>)> {
        let objects = self.objects.read().unwrap_or_else(|e| e.into_inner());
        objects
            .as_ref()
            .map(|map| map.iter().map(|(&h, o)| (h, Arc::clone(o))).collect())
            .unwrap_or_default()
    }

    /// Every registered object (a snapshot).
    pub(crate) fn all(&self) -> Vec<Arc<T>> {
        let objects = self.objects.read().unwrap_or_else(|e| e.into_inner());
        objects
            .as_ref()
            .map(|map| map.values().cloned().collect())
            .unwrap_or_default()
    }
}

/// Lock a mutex, ignoring poisoning: driver state stays consistent across a
/// panic because user code (twins) never runs under a driver lock.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_resolve_until_removed_and_are_never_reused() {
        let registry = Registry::new();
        let a = registry.insert(Arc::new(1));
        let b = registry.insert(Arc::new(2));
        assert_ne!(a, b);
        assert_eq!(*registry.get(a).unwrap(), 1);
        registry.remove(a).unwrap();
        assert_eq!(
            registry.get(a).unwrap_err(),
            CUresult::CUDA_ERROR_INVALID_HANDLE
        );
        assert_eq!(
            registry.remove(a).unwrap_err(),
            CUresult::CUDA_ERROR_INVALID_HANDLE
        );
        let c = registry.insert(Arc::new(3));
        assert!(c != a && c != b);
        assert_eq!(
            registry.get(0).unwrap_err(),
            CUresult::CUDA_ERROR_INVALID_HANDLE
        );
    }
}
