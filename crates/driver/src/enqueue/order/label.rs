//! Labels: the names that operations carry into race reports
//! ([`labelled`]).

use super::kept::THIS_THREAD;
use super::policy::EVER_ON;
use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::Ordering;

thread_local! {
    static LABEL: RefCell<Option<Arc<str>>> = const { RefCell::new(None) };
    /// The label made last on this thread: an operation labelled as the one
    /// before it (a loop's) shares its string instead of allocating one.
    static LAST_LABEL: RefCell<Option<Arc<str>>> = const { RefCell::new(None) };
}

/// Run `f` with `label` naming the operations it enqueues on this thread, in
/// the reports of [`OrderPolicy::Check`](super::OrderPolicy::Check) and
/// [`OrderPolicy::Report`](super::OrderPolicy::Report) (the engine labels each
/// operation this way). Costs nothing while every context's policy is
/// [`OrderPolicy::Off`](super::OrderPolicy::Off).
///
/// ```
/// use cuda_streams_driver::{order, Context, DeviceBuffer, Stream};
/// let ctx = Context::new(0).unwrap();
/// let stream = Stream::new(&ctx).unwrap();
/// let mut data = DeviceBuffer::<u32>::new(&ctx, 4).unwrap();
/// order::labelled("clear", || stream.memset_u32_async(&mut data, 0)).unwrap();
/// ```
pub fn labelled<R>(label: &str, f: impl FnOnce() -> R) -> R {
    if label.is_empty() || !EVER_ON.load(Ordering::Relaxed) {
        return f();
    }
    let shared = LAST_LABEL.with(|last| {
        let mut last = last.borrow_mut();
        match &*last {
            Some(same) if **same == *label => Arc::clone(same),
            _ => Arc::clone(last.insert(Arc::from(label))),
        }
    });
    let previous = LABEL.with(|l| l.replace(Some(shared)));
    THIS_THREAD.with(|t| t.labelled.set(true));
    let _restore = Restore(previous);
    f()
}

struct Restore(Option<Arc<str>>);

impl Drop for Restore {
    fn drop(&mut self) {
        let previous = self.0.take();
        THIS_THREAD.with(|t| t.labelled.set(previous.is_some()));
        LABEL.with(|l| *l.borrow_mut() = previous);
    }
}

#[inline]
pub(super) fn current_label() -> Option<Arc<str>> {
    if !THIS_THREAD.with(|t| t.labelled.get()) {
        return None;
    }
    LABEL.with(|l| l.borrow().clone())
}

#[cfg(test)]
mod tests {
    use super::super::policy::OrderPolicy;
    use super::super::tests::under;
    use super::*;
    use crate::ground::error::Error;
    use crate::objects::stream::Stream;

    /// A label shared with the operation before it is the same label; a
    /// different one is not taken for it.
    #[test]
    fn labels_name_their_own_operation_in_a_loop() {
        let (ctx, _policy) = under(OrderPolicy::Check);
        let (a, b) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
        let mut data = crate::DeviceBuffer::<u32>::new(&ctx, 16).unwrap();
        for _ in 0..2 {
            labelled("fill", || a.memset_u32_async(&mut data, 1)).unwrap();
        }
        let refused = labelled("clear", || b.memset_u32_async(&mut data, 0));
        let Err(Error::UnorderedAccess(race)) = refused else {
            panic!("an unordered write was let through: {refused:?}");
        };
        assert_eq!(race.earlier.label.as_deref(), Some("fill"));
        assert_eq!(race.later.label.as_deref(), Some("clear"));
        a.synchronize().unwrap();
    }

    /// A label names what is enqueued inside its scope only, an inner one
    /// hides an outer one until it ends (this thread's flag for "a label
    /// is set" follows), and a write recorded over an earlier write takes
    /// its own label, or none, in place of the earlier one's.
    #[test]
    fn labels_nest_and_a_write_over_a_write_takes_its_own_label() {
        let (ctx, _policy) = under(OrderPolicy::Check);
        assert_eq!(current_label(), None);
        labelled("outer", || {
            assert_eq!(current_label().as_deref(), Some("outer"));
            labelled("inner", || {
                assert_eq!(current_label().as_deref(), Some("inner"));
            });
            labelled("", || {
                assert_eq!(current_label().as_deref(), Some("outer"), "no label given");
            });
            assert_eq!(current_label().as_deref(), Some("outer"), "restored");
        });
        assert_eq!(current_label(), None, "none outside");
        let (a, b) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
        let mut data = crate::DeviceBuffer::<u32>::new(&ctx, 16).unwrap();
        // Each write on `a` is recorded over the one before, then `b`'s
        // unordered write is refused naming the latest.
        let mut earlier_label = |label: Option<&str>| {
            match label {
                Some(label) => labelled(label, || a.memset_u32_async(&mut data, 1)),
                None => a.memset_u32_async(&mut data, 1),
            }
            .unwrap();
            let refused = b.memset_u32_async(&mut data, 0);
            let Err(Error::UnorderedAccess(race)) = refused else {
                panic!("an unordered write was let through: {refused:?}");
            };
            race.earlier.label
        };
        assert_eq!(earlier_label(Some("fill")).as_deref(), Some("fill"));
        assert_eq!(earlier_label(Some("fill")).as_deref(), Some("fill"));
        assert_eq!(earlier_label(Some("refill")).as_deref(), Some("refill"));
        assert_eq!(earlier_label(None), None, "an unlabelled write");
        assert_eq!(earlier_label(Some("fill")).as_deref(), Some("fill"));
        a.synchronize().unwrap();
    }
}
