//! Which [`OrderPolicy`] a context runs under: where it comes from
//! (`CUDA_STREAMS_ORDERING`, the driver's default, [`Context::set_ordering`]),
//! and what a switch keeps. Which policies each driver accepts, and its
//! default, the driver seam answers (`ground/seam.rs`).
//!
//! On the software driver a race between two streams is two worker threads
//! touching the same host memory: a data race in Rust's sense. So there
//! only the policies that stop every unordered conflicting pair before it
//! runs (`Check`, which refuses the later operation, and `Auto`, which makes
//! it wait) are accepted, and a switch never forgets what the tracker knows.
//! On a GPU an unordered pair gives a wrong result, not undefined behaviour
//! in the host program, so every policy is accepted and `Off` is the default.

use crate::ground::error::{Error, Result};
use crate::ground::loaded_driver::DriverKind;
pub use crate::ground::order_policy::{ORDERING_SETTING, OrderPolicy};
use crate::objects::context::Context;
use std::sync::atomic::{AtomicBool, Ordering};

/// Set once any context turns tracking on: until then, labels cost nothing.
pub(super) static EVER_ON: AtomicBool = AtomicBool::new(false);

/// The policy `CUDA_STREAMS_ORDERING` asks for, if set, with the value as
/// written (for an error that names it).
fn from_env() -> Result<Option<(OrderPolicy, String)>> {
    type Found = std::result::Result<Option<(OrderPolicy, String)>, sys::env::EnvError>;
    static FROM_ENV: std::sync::OnceLock<Found> = std::sync::OnceLock::new();
    FROM_ENV
        .get_or_init(|| {
            let Some(found) = ORDERING_SETTING.from_env()? else {
                return Ok(None);
            };
            OrderPolicy::parse(&found.value)
                .map(|policy| Some((policy, found.value.clone())))
                .map_err(|reason| found.error(reason))
        })
        .clone()
        .map_err(Error::from)
}

/// The policy `CUDA_STREAMS_ORDERING` asks for, if set (checked as a value
/// only: whether the driver accepts it is [`initial_policy`]'s question).
pub(crate) fn policy_from_env() -> Result<Option<OrderPolicy>> {
    Ok(from_env()?.map(|(policy, _)| policy))
}

/// The policy a new context on `driver` starts under: the one
/// `CUDA_STREAMS_ORDERING` asks for, refused if `driver` does not accept
/// it, or the driver's default (`Check` on the software driver, which is
/// sound by default; `Off` on a GPU).
pub(crate) fn initial_policy(driver: DriverKind) -> Result<OrderPolicy> {
    match from_env()? {
        Some((policy, _)) if driver.accepts_order_policy(policy) => Ok(policy),
        Some((policy, value)) => Err(Error::OrderPolicyRefused {
            policy,
            driver,
            from_env: Some(value),
        }),
        None => Ok(driver.default_order_policy()),
    }
}

impl Context {
    /// The context's [`OrderPolicy`].
    pub fn ordering(&self) -> OrderPolicy {
        self.order.policy()
    }

    /// Change the context's [`OrderPolicy`] (for every thread using it).
    ///
    /// - A policy the driver does not accept is refused with
    ///   [`Error::OrderPolicyRefused`] and the policy stays as it was: on
    ///   the software driver, `Off` and `Report`.
    /// - Between tracking policies (`Check`, `Report`, `Auto`) the tracker
    ///   keeps what it knows: work in flight when the policy changes is
    ///   checked against (or waited for) as before.
    /// - From `Off` to a tracking policy (on a GPU only: the software
    ///   driver is never `Off`), nothing was recorded while off, so this
    ///   first waits for all of the context's work ([`Context::synchronize`],
    ///   refused while a stream of the context is being captured) and then
    ///   starts from nothing, which is then true. Work that other threads
    ///   enqueue while the switch is under way is not seen by the tracker.
    ///
    /// ```
    /// use cuda_streams_driver::{Context, Error, OrderPolicy};
    /// let ctx = Context::new(0).unwrap();
    /// let before = ctx.ordering();
    /// ctx.set_ordering(OrderPolicy::Auto).unwrap();
    /// assert_eq!(ctx.ordering(), OrderPolicy::Auto);
    /// if !ctx.is_gpu() {
    ///     // Two stream workers racing would be a data race on host memory.
    ///     let err = ctx.set_ordering(OrderPolicy::Off).unwrap_err();
    ///     assert!(matches!(err, Error::OrderPolicyRefused { policy: OrderPolicy::Off, .. }));
    ///     assert_eq!(ctx.ordering(), OrderPolicy::Auto);
    /// }
    /// ctx.set_ordering(before).unwrap();
    /// ```
    pub fn set_ordering(&self, policy: OrderPolicy) -> Result<()> {
        if !self.kind().accepts_order_policy(policy) {
            return Err(Error::OrderPolicyRefused {
                policy,
                driver: self.kind(),
                from_env: None,
            });
        }
        let tracks = policy != OrderPolicy::Off;
        let mut synchronized = false;
        loop {
            let mut shadow = self.order.shadow();
            // Read under the lock, so that a switch by another thread in
            // between is not missed.
            let from_off = tracks && !self.order.is_on();
            if from_off && !synchronized {
                // The shadow holds nothing of the work enqueued while off:
                // once that work has completed, nothing can conflict with
                // it and an empty shadow tells the truth. Waited for outside
                // the lock, which the work's completion may need.
                drop(shadow);
                self.synchronize()?;
                synchronized = true;
                continue;
            }
            if from_off {
                shadow.clear();
                EVER_ON.store(true, Ordering::Relaxed);
            }
            self.order.policy.store(policy.to_u8(), Ordering::Relaxed);
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `Off` to a tracking policy waits for the work enqueued while off
    /// before starting from nothing, so the tracker never takes a write
    /// still in flight for finished. (Only a GPU can be `Off`; the software
    /// driver gets there through the tests' back door.)
    #[test]
    fn turning_tracking_on_waits_for_the_work_enqueued_while_off() {
        let (ctx, _policy) = super::super::tests::under(OrderPolicy::Check);
        let [stream, other] = std::array::from_fn(|_| crate::Stream::new(&ctx).unwrap());
        let mut data = crate::DeviceBuffer::<u32>::new(&ctx, 64).unwrap();
        ctx.order.force(OrderPolicy::Off);
        // Holds `stream` until it gives up on a message that never comes:
        // `set_ordering` can only return after that.
        let limit = std::time::Duration::from_millis(300);
        let (_never, held) = std::sync::mpsc::channel::<()>();
        let closed_at = std::time::Instant::now();
        stream
            .add_callback(move || {
                let _ = held.recv_timeout(limit);
            })
            .unwrap();
        stream.memset_u32_async(&mut data, 1).unwrap();
        ctx.set_ordering(OrderPolicy::Check).unwrap();
        assert!(
            stream.query().unwrap(),
            "the write enqueued while off is still in flight after the switch"
        );
        assert!(closed_at.elapsed() >= limit);
        // Nothing is in flight, so the empty shadow is the truth: a write
        // on another stream is ordered after the host's wait.
        other.memset_u32_async(&mut data, 2).unwrap();
        assert_eq!(data.to_vec(&other).unwrap(), [2; 64]);
    }
}
