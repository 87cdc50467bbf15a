//! The workspace's one loom shim: the atomics, locks and cells that the
//! protocols checked by loom (docs/testing.md) are built from. std's, or
//! loom's when a crate's *own* unit tests run under `--cfg loom`.
//!
//! A macro, not a module of re-exports, because the choice has to be made in
//! the crate being tested: `cfg(test)` holds only there. A module here
//! could only switch on `cfg(loom)` alone, which would turn this crate's
//! atomics into loom's in every `--cfg loom` build that compiles it, a
//! downstream crate's own loom tests included (its code would then run
//! ours under its models, or outside a model, where loom's types panic),
//! and would make loom a dependency of the published crate. Expanded in the
//! crate under test, `cfg(all(test, loom))` keeps loom in that crate's tests:
//! the crates that depend on it never see loom, even in a `--cfg loom`
//! build. Each crate expands it once, into its own `sync` module, and
//! declares loom as a `cfg(loom)` dev-dependency.

/// Expands to `use` items for the shim's names, with the visibility given
/// (`pub(crate)`, `pub(super)`, …): loom's under `cfg(all(test, loom))` in
/// the crate that expands it, std's otherwise. The names: `AtomicBool`,
/// `AtomicU8`, `AtomicU32`, `AtomicU64`, `AtomicUsize`, `Ordering`, `fence`,
/// `Mutex`, `MutexGuard`, `spin_loop` and `yield_now` (a wait for another
/// thread must yield to loom, or the model never ends), and `UnsafeCell`
/// with loom's closure API (`with`, `with_mut`), which lets loom check
/// every access to the cell.
///
/// For this workspace's crates only (hidden, no stability promised):
///
/// ```
/// mod sync {
///     cuda_streams_driver::loom_shim!(pub(crate));
/// }
/// use sync::{AtomicU32, Ordering, UnsafeCell};
///
/// let slot = AtomicU32::new(0);
/// slot.store(7, Ordering::Release);
/// let cell = UnsafeCell::new(slot.load(Ordering::Acquire));
/// // SAFETY: `cell` is this thread's alone.
/// cell.with_mut(|value| unsafe { *value += 1 });
/// // SAFETY: as above.
/// assert_eq!(cell.with(|value| unsafe { *value }), 8);
/// ```
#[doc(hidden)]
#[macro_export]
macro_rules! loom_shim {
    ($vis:vis) => {
        // Each crate uses some of the names: the rest are no mistake.
        #[cfg(all(test, loom))]
        #[allow(unused_imports)]
        $vis use ::loom::{
            cell::UnsafeCell,
            hint::spin_loop,
            sync::{
                Mutex, MutexGuard,
                atomic::{
                    AtomicBool, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering, fence,
                },
            },
            thread::yield_now,
        };
        #[cfg(not(all(test, loom)))]
        #[allow(unused_imports)]
        $vis use {
            $crate::__LoomShimCell as UnsafeCell,
            ::std::hint::spin_loop,
            ::std::sync::{
                Mutex, MutexGuard,
                atomic::{
                    AtomicBool, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering, fence,
                },
            },
            ::std::thread::yield_now,
        };
    };
}

/// std's `UnsafeCell` with loom's API (`loom::cell::UnsafeCell`), so that
/// code written once runs on either: the closures are inlined away.
#[doc(hidden)]
#[derive(Debug, Default)]
pub struct StdCell<T>(std::cell::UnsafeCell<T>);

impl<T> StdCell<T> {
    /// A cell holding `value`.
    #[inline]
    pub const fn new(value: T) -> Self {
        Self(std::cell::UnsafeCell::new(value))
    }

    /// `f` on a pointer to the value, for reading.
    #[inline(always)]
    pub fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }

    /// `f` on a pointer to the value, for reading or writing.
    #[inline(always)]
    pub fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}

// The driver's own names.
loom_shim!(pub(crate));
