//! What the tests of the tracker share: device 0's context under a policy,
//! streams, buffers, and the count of the tracker's locks.

use super::policy::OrderPolicy;
use super::stats::LOCKS;
use super::touch::Touch;
use crate::objects::context::Context;
use crate::objects::stream::Stream;
use std::sync::{Arc, Mutex, MutexGuard};

/// Held by the tests that set the policy of device 0's context, which
/// every test of this crate shares.
static POLICY: Mutex<()> = Mutex::new(());

/// A 4-byte write at `address` in `ctx`'s memory.
pub(super) fn write_of_4_bytes(ctx: &Context, address: u64) -> Touch {
    Touch {
        ctx: ctx.id(),
        address,
        bytes: 4,
        write: true,
    }
}

pub(super) fn streams<const N: usize>(ctx: &Arc<Context>) -> [Arc<Stream>; N] {
    std::array::from_fn(|_| Stream::new(ctx).unwrap())
}

pub(super) fn buffer(ctx: &Arc<Context>) -> crate::DeviceBuffer<u32> {
    crate::DeviceBuffer::new(ctx, 64).unwrap()
}

/// Device 0's context under `policy`, held until the guard drops.
pub(super) fn under(policy: OrderPolicy) -> (Arc<Context>, MutexGuard<'static, ()>) {
    let guard = POLICY.lock().unwrap_or_else(|p| p.into_inner());
    let ctx = Context::new(0).unwrap();
    ctx.set_ordering(policy).unwrap();
    (ctx, guard)
}

/// Tracker locks taken on this thread while `f` runs.
pub(super) fn locks(f: impl FnOnce()) -> u64 {
    let before = LOCKS.with(std::cell::Cell::get);
    f();
    LOCKS.with(std::cell::Cell::get) - before
}
