//! Work enqueued outside this crate (`Stream::enqueue_external`,
//! `Stream::prepare_uses`): its step in the stream order stays in flight
//! until the work is on the stream, so an event recorded on the stream
//! before then does not cover it, and a stream that waited for that event
//! is not ordered after it.

use cuda_streams_driver::sys::CUresult;
use cuda_streams_driver::{
    BufferUse, Context, DeviceBuffer, DeviceMemory, Error, Event, OrderPolicy, Stream,
};
use std::sync::{Arc, Mutex, MutexGuard};

/// The tests switch the shared context's policy: one at a time, and the
/// policy is put back afterwards.
static POLICY: Mutex<()> = Mutex::new(());

struct Policy {
    ctx: Arc<Context>,
    before: OrderPolicy,
    _turn: MutexGuard<'static, ()>,
}

fn check(ctx: &Arc<Context>) -> Policy {
    let turn = POLICY.lock().unwrap_or_else(|p| p.into_inner());
    let before = ctx.ordering();
    ctx.set_ordering(OrderPolicy::Check)
        .expect("check is accepted by every driver");
    Policy {
        ctx: Arc::clone(ctx),
        before,
        _turn: turn,
    }
}

impl Drop for Policy {
    fn drop(&mut self) {
        // The policy it had was accepted then; a refusal here only leaves
        // `check` in place, which every test of this file runs under.
        if let Err(e) = self.ctx.set_ordering(self.before) {
            eprintln!("cannot restore the order policy: {e}");
        }
    }
}

/// A raw `cuMemsetD8Async` of `bytes` bytes at `ptr` on `stream`, as a
/// library outside this crate would enqueue it.
fn raw_memset(ctx: &Context, stream: &Stream, ptr: u64, value: u8, bytes: usize) {
    ctx.bind().unwrap();
    // SAFETY: the callers pass a buffer of `stream`'s context that holds
    // `bytes` bytes and is tracked once the memset is enqueued.
    let code = unsafe { (ctx.driver().cuMemsetD8Async)(ptr, value, bytes, stream.as_raw()) };
    assert_eq!(code, CUresult::CUDA_SUCCESS);
}

/// The reader waited for `early`, recorded before the external write was
/// on the writer's stream: its read is refused, naming the external work.
/// Once it waits for a record taken after, it reads what was written.
fn assert_early_record_does_not_cover(
    writer: &Stream,
    reader: &Stream,
    early: &Event,
    buf: &DeviceBuffer<u8>,
    value: u8,
) {
    reader.wait_event(early).unwrap();
    let err = buf.to_vec(reader).unwrap_err();
    let Error::UnorderedAccess(race) = err else {
        panic!("expected an unordered access, got {err}");
    };
    assert_eq!(race.earlier.what, "external work");
    assert!(race.earlier.writes && !race.later.writes);
    assert_eq!(race.earlier.stream, writer.id());
    assert_eq!(race.later.stream, reader.id());
    reader.wait_event(&writer.record_event().unwrap()).unwrap();
    assert_eq!(buf.to_vec(reader).unwrap(), vec![value; buf.device_len()]);
}

#[test]
fn a_record_taken_while_prepared_work_is_held_does_not_cover_it() {
    let ctx = Context::new(0).unwrap();
    let _policy = check(&ctx);
    let (writer, reader) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let mut buf = DeviceBuffer::<u8>::new(&ctx, 256).unwrap();
    let ptr = buf.device_ptr();
    let uses = [BufferUse::write(&mut buf)];
    let work = writer.prepare_uses(&uses).unwrap();
    // Checked and given its step, but not on the stream yet (as a
    // collective in an NCCL group until `ncclGroupEnd`).
    let early = writer.record_event().unwrap();
    raw_memset(&ctx, &writer, ptr, 7, 256);
    work.enqueued().unwrap();
    assert_early_record_does_not_cover(&writer, &reader, &early, &buf, 7);
}

#[test]
fn a_record_taken_inside_enqueue_external_before_its_call_does_not_cover_it() {
    let ctx = Context::new(0).unwrap();
    let _policy = check(&ctx);
    let (writer, reader) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let mut buf = DeviceBuffer::<u8>::new(&ctx, 64).unwrap();
    let ptr = buf.device_ptr();
    let uses = [BufferUse::write(&mut buf)];
    let early = writer
        .enqueue_external(&uses, || {
            let early = writer.record_event()?;
            raw_memset(&ctx, &writer, ptr, 9, 64);
            Ok::<_, Error>(early)
        })
        .unwrap();
    assert_early_record_does_not_cover(&writer, &reader, &early, &buf, 9);
}

/// The uses are checked before the work: an unordered write is refused and
/// the closure never runs.
#[test]
fn enqueue_external_refuses_an_unordered_use_before_running_the_work() {
    let ctx = Context::new(0).unwrap();
    let _policy = check(&ctx);
    let (a, b) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let mut buf = DeviceBuffer::<u8>::new(&ctx, 64).unwrap();
    a.memset_u8_async(&mut buf, 1).unwrap();
    let uses = [BufferUse::write(&mut buf)];
    let mut ran = false;
    let err = b
        .enqueue_external(&uses, || {
            ran = true;
            Ok::<_, Error>(())
        })
        .unwrap_err();
    assert!(matches!(err, Error::UnorderedAccess(_)), "{err}");
    assert!(!ran, "the work ran although its use was refused");
}

/// A buffer of another device is refused by `check_uses` and by
/// `prepare_uses`, naming both devices.
#[test]
fn a_buffer_of_another_device_is_refused() {
    let contexts = Context::all().unwrap();
    if contexts.len() < 2 {
        eprintln!(
            "skipped: needs two devices, the driver reports {}",
            contexts.len()
        );
        return;
    }
    let stream = Stream::new(&contexts[0]).unwrap();
    let other = DeviceBuffer::<u8>::new(&contexts[1], 8).unwrap();
    let uses = [BufferUse::read(&other)];
    for err in [
        stream.check_uses(&uses).unwrap_err(),
        stream.prepare_uses(&uses).unwrap_err(),
    ] {
        assert!(matches!(err, Error::DeviceMismatch { .. }), "{err}");
        let text = err.to_string();
        assert!(
            text.contains("device 0") && text.contains("device 1"),
            "{text}"
        );
    }
}
