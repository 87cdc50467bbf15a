//! The CUPTI backend: GPU start and end times of every kernel, copy and
//! memset from CUPTI's activity records, attributed to scopes by stream and
//! by the host time their enqueue call was made. No event on the hot path: a
//! scope costs two reads of CUPTI's clock.
//!
//! CUPTI's activity API is process-wide, so one [`Collector`] (created on
//! first use, never dropped) owns the registration: it hands CUPTI buffers,
//! keeps the records of the streams some profiler watches, and drops the
//! rest. The kinds are enabled while at least one CUPTI profiler is alive.
//!
//! Attribution: each work record carries the correlation id of the driver
//! call that enqueued it, and the driver-API record of that call carries the
//! host time (CUPTI's clock) it was made. A scope on stream S open over host
//! times `[open, close]` owns the records on S whose enqueue call started in
//! that window: the same rule as the event backend's (work enqueued on the
//! stream while the scope was open), without recording anything on the
//! stream. Its GPU time runs from its first record's start to its last's end.

use crate::timed_op::{Name, TimedOp};
use driver::sys::CUcontext;
use driver::sys::cupti::bindings::{
    CUpti_Activity, CUpti_ActivityAPI, CUpti_ActivityFlag, CUpti_ActivityKernel10,
    CUpti_ActivityKind, CUpti_ActivityMemcpy6, CUpti_ActivityMemset4,
    CUpti_driver_api_trace_cbid as Cbid,
};
use driver::sys::cupti::{Cupti, CuptiError, result};
use driver::{Context, Stream};
use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Instant;

/// The bytes of each buffer handed to CUPTI (CUPTI's samples use 8 MiB; a
/// 10,000-kernel burst takes about 3 MiB of records).
const BUFFER_BYTES: usize = 4 << 20;
const BUFFER_WORDS: usize = BUFFER_BYTES / 8;

/// Enqueue calls whose API record is kept (every other API record is
/// dropped on arrival): the ones that make kernel, copy and memset records.
const WORK_CALLS: &[Cbid] = &[
    Cbid::CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel,
    Cbid::CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx,
    Cbid::CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel,
    Cbid::CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch,
    Cbid::CUPTI_DRIVER_TRACE_CBID_cuMemcpyAsync,
    Cbid::CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoDAsync_v2,
    Cbid::CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoHAsync_v2,
    Cbid::CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoDAsync_v2,
    Cbid::CUPTI_DRIVER_TRACE_CBID_cuMemcpyPeerAsync,
    Cbid::CUPTI_DRIVER_TRACE_CBID_cuMemsetD8Async,
    Cbid::CUPTI_DRIVER_TRACE_CBID_cuMemsetD16Async,
    Cbid::CUPTI_DRIVER_TRACE_CBID_cuMemsetD32Async,
];

/// The record kinds the backend enables.
const KINDS: [CUpti_ActivityKind; 4] = [
    CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
    CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_MEMCPY,
    CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_MEMSET,
    CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_DRIVER,
];

/// API records older than this (CUPTI clock, ns) whose work never showed up
/// on a watched stream are dropped when a profiler resolves: they belong to
/// streams no profiler watches.
const API_RECORD_TTL_NS: u64 = 60_000_000_000;

/// A stream as CUPTI names it: context id and stream id.
pub(crate) type StreamKey = (u32, u32);

/// One kernel, copy or memset on a watched stream.
#[derive(Clone, Copy, Debug)]
struct Work {
    correlation: u32,
    start: u64,
    end: u64,
    /// When its enqueue call began (CUPTI's clock), once joined with the
    /// call's API record.
    enqueued: Option<u64>,
}

/// One profiler slot watching a stream: its records not yet consumed.
pub(crate) type WatchId = u64;

#[derive(Default)]
struct Records {
    /// Watched streams, and for each watcher its records not yet consumed
    /// (each watcher gets every record of the stream).
    streams: HashMap<StreamKey, HashMap<WatchId, Vec<Work>>>,
    /// Correlation id to the host time (CUPTI clock) its enqueue call began.
    api: HashMap<u32, u64>,
    next_watch: WatchId,
}

/// The process-wide CUPTI registration and the records it collected.
pub(crate) struct Collector {
    cupti: Cupti,
    records: Mutex<Records>,
    /// Live CUPTI profilers; the kinds are enabled while it is above 0.
    users: Mutex<usize>,
}

static COLLECTOR: OnceLock<Result<Collector, String>> = OnceLock::new();

fn collector() -> Result<&'static Collector, String> {
    COLLECTOR
        .get_or_init(|| {
            let cupti = Cupti::load().map_err(|e| e.to_string())?;
            // SAFETY: `buffer_requested` hands out 8-byte aligned buffers of
            // the size it reports, which stay alive until `buffer_completed`
            // frees them; both catch panics and make no driver calls.
            unsafe {
                result::activity_register_callbacks(
                    &cupti,
                    Some(buffer_requested),
                    Some(buffer_completed),
                )
            }
            .map_err(|e| e.to_string())?;
            Ok(Collector {
                cupti,
                records: Mutex::new(Records::default()),
                users: Mutex::new(0),
            })
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// CUPTI asks for an empty buffer (on any thread, CUPTI's own included).
unsafe extern "C" fn buffer_requested(
    buffer: *mut *mut u8,
    size: *mut usize,
    max_num_records: *mut usize,
) {
    let _ = catch_unwind(|| {
        if buffer.is_null() || size.is_null() || max_num_records.is_null() {
            return;
        }
        // 8-byte aligned, as CUPTI requires; freed in `buffer_completed`.
        let words: Box<[u64]> = vec![0u64; BUFFER_WORDS].into_boxed_slice();
        let ptr = Box::into_raw(words) as *mut u64 as *mut u8;
        // SAFETY: CUPTI passes valid out-pointers (checked non-null above).
        unsafe {
            *buffer = ptr;
            *size = BUFFER_BYTES;
            // 0: as many records as fit.
            *max_num_records = 0;
        }
    });
}

/// CUPTI hands back a buffer of records (on any thread; no driver calls
/// here). The buffer is ours to free.
unsafe extern "C" fn buffer_completed(
    _context: CUcontext,
    _stream_id: u32,
    buffer: *mut u8,
    size: usize,
    valid_size: usize,
) {
    if buffer.is_null() {
        return;
    }
    let _ = catch_unwind(AssertUnwindSafe(|| {
        if let Some(Ok(collector)) = COLLECTOR.get() {
            // SAFETY: `buffer` is one of ours, `valid_size` bytes of it
            // written by CUPTI.
            unsafe { collector.read_buffer(buffer, valid_size.min(size)) };
        }
    }));
    if size == BUFFER_BYTES {
        // SAFETY: every buffer CUPTI gets comes from `buffer_requested`: a
        // boxed slice of BUFFER_WORDS u64s, returned here exactly once.
        drop(unsafe {
            Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                buffer as *mut u64,
                BUFFER_WORDS,
            ))
        });
    }
}

impl Collector {
    /// Keep the work records of watched streams and the API records of
    /// enqueue calls.
    ///
    /// # Safety
    /// `buffer` holds `valid` bytes of activity records written by CUPTI.
    unsafe fn read_buffer(&self, buffer: *mut u8, valid: usize) {
        let mut kept_work = Vec::new();
        let mut kept_api = Vec::new();
        let mut record: *mut CUpti_Activity = std::ptr::null_mut();
        loop {
            // SAFETY: `buffer`/`valid` describe CUPTI's records; `record` is
            // the previous record CUPTI returned (or null to start).
            match unsafe { result::activity_get_next_record(&self.cupti, buffer, valid, record) } {
                Ok(Some(next)) => record = next.as_ptr(),
                Ok(None) => break,
                Err(err) => {
                    // The rest of this buffer cannot be read.
                    tracing::warn!(
                        "reading CUPTI's records: {err}; the buffer's remaining records are lost"
                    );
                    break;
                }
            }
            // SAFETY: every record begins with its kind, and a record of a
            // kind is at least as long as that kind's 13.0 struct (newer
            // CUPTI versions only add fields); the records are packed, so
            // they are read unaligned.
            unsafe {
                let kind = std::ptr::read_unaligned(record as *const CUpti_ActivityKind);
                match kind {
                    CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL
                    | CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_KERNEL => {
                        let r = std::ptr::read_unaligned(record as *const CUpti_ActivityKernel10);
                        kept_work.push((
                            (r.contextId, r.streamId),
                            Work {
                                correlation: r.correlationId,
                                start: r.start,
                                end: r.end,
                                enqueued: None,
                            },
                        ));
                    }
                    CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_MEMCPY => {
                        let r = std::ptr::read_unaligned(record as *const CUpti_ActivityMemcpy6);
                        kept_work.push((
                            (r.contextId, r.streamId),
                            Work {
                                correlation: r.correlationId,
                                start: r.start,
                                end: r.end,
                                enqueued: None,
                            },
                        ));
                    }
                    CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_MEMSET => {
                        let r = std::ptr::read_unaligned(record as *const CUpti_ActivityMemset4);
                        kept_work.push((
                            (r.contextId, r.streamId),
                            Work {
                                correlation: r.correlationId,
                                start: r.start,
                                end: r.end,
                                enqueued: None,
                            },
                        ));
                    }
                    CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_DRIVER => {
                        let r = std::ptr::read_unaligned(record as *const CUpti_ActivityAPI);
                        if WORK_CALLS.iter().any(|c| c.0 == r.cbid) {
                            kept_api.push((r.correlationId, r.start));
                        }
                    }
                    _ => {}
                }
            }
        }
        let mut records = self.lock();
        records.api.extend(kept_api);
        for (key, work) in kept_work {
            if let Some(watchers) = records.streams.get_mut(&key) {
                for list in watchers.values_mut() {
                    list.push(work);
                }
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, Records> {
        // Every update leaves the records consistent, so a poisoned lock is
        // still usable.
        self.records.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// CUPTI's clock, in ns.
    fn now(&self) -> u64 {
        // CUPTI's clock fails only without CUPTI, which a collector has.
        result::get_timestamp(&self.cupti).unwrap_or(0)
    }

    /// Deliver every buffer CUPTI holds (blocking; the callback runs before
    /// this returns). No lock of ours may be held: the callback takes it.
    fn flush(&self) -> Result<(), CuptiError> {
        result::activity_flush_all(
            &self.cupti,
            CUpti_ActivityFlag::CUPTI_ACTIVITY_FLAG_FLUSH_FORCED,
        )
    }

    fn set_kinds(&self, enable: bool) -> Result<(), CuptiError> {
        for kind in KINDS {
            if enable {
                result::activity_enable(&self.cupti, kind)?;
            } else {
                result::activity_disable(&self.cupti, kind)?;
            }
        }
        Ok(())
    }
}

/// One profiler's use of CUPTI: its timeline's zero on CUPTI's clock, and the
/// host instant taken with it (for memory samples, timed by the host).
pub(crate) struct CuptiBackend {
    collector: &'static Collector,
    context: CUcontext,
    context_id: u32,
    base_ts: u64,
    host_base: Instant,
    /// Records of watched streams no scope of this profiler could claim.
    unattributed: AtomicU64,
}

// SAFETY: `context` is only passed to CUPTI (cuptiGetStreamIdEx), which may be
// called from any thread; the profiler keeps the context alive (its pool holds it).
unsafe impl Send for CuptiBackend {}
// SAFETY: as above; nothing is mutated through `&self`.
unsafe impl Sync for CuptiBackend {}

impl CuptiBackend {
    /// Start collecting for `ctx`, or say why CUPTI cannot be used.
    pub(crate) fn start(ctx: &Context) -> Result<Self, String> {
        if !ctx.is_gpu() {
            return Err(format!(
                "the {} driver has no CUPTI (CUPTI needs CUDA_STREAMS_DRIVER=cuda and a GPU)",
                ctx.loaded_driver().name()
            ));
        }
        let collector = collector()?;
        {
            let mut users = collector.users.lock().unwrap_or_else(|p| p.into_inner());
            if *users == 0
                && let Err(err) = collector.set_kinds(true)
            {
                let _ = collector.set_kinds(false);
                return Err(format!("enabling CUPTI activity records failed: {err}"));
            }
            *users += 1;
        }
        let context = ctx.as_raw();
        // SAFETY: `context` is a live context of libcuda (the caller's, on
        // the CUDA driver: checked above).
        let context_id = unsafe { result::get_context_id(&collector.cupti, context) };
        let backend = Self {
            collector,
            context,
            context_id: context_id.as_ref().map_or(0, |id| *id),
            base_ts: collector.now(),
            host_base: Instant::now(),
            unattributed: AtomicU64::new(0),
        };
        // On failure, dropping `backend` gives its use of the collector back.
        context_id.map_err(|e| e.to_string())?;
        Ok(backend)
    }

    /// CUPTI's clock now (a clock read, no driver call).
    #[inline]
    pub(crate) fn now(&self) -> u64 {
        self.collector.now()
    }

    /// Watch `stream`'s records from now on; `None` if CUPTI cannot name it.
    pub(crate) fn watch(&self, stream: &Stream) -> Option<(StreamKey, WatchId)> {
        // SAFETY: the stream and the context are alive (the caller holds the
        // stream, the profiler the context), both of libcuda.
        let id = unsafe {
            result::get_stream_id_ex(&self.collector.cupti, self.context, stream.as_raw())
        };
        let id = match id {
            Ok(id) => id,
            Err(err) => {
                tracing::warn!(
                    "CUPTI cannot name stream {}: {err}; its scopes stay empty",
                    stream.id()
                );
                return None;
            }
        };
        let key = (self.context_id, id);
        let mut records = self.collector.lock();
        let watch = records.next_watch;
        records.next_watch += 1;
        records
            .streams
            .entry(key)
            .or_default()
            .insert(watch, Vec::new());
        Some((key, watch))
    }

    /// Stop watching a stream.
    pub(crate) fn unwatch(&self, (key, watch): (StreamKey, WatchId)) {
        let mut records = self.collector.lock();
        if let Some(watchers) = records.streams.get_mut(&key) {
            watchers.remove(&watch);
            if watchers.is_empty() {
                records.streams.remove(&key);
            }
        }
    }

    /// Nanoseconds on the profiler's timeline for a host instant.
    pub(crate) fn host_ns(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.host_base).as_nanos() as u64
    }

    /// Records of watched streams enqueued by calls the backend does not
    /// follow: no scope could claim them.
    pub(crate) fn unattributed(&self) -> u64 {
        self.unattributed.load(Ordering::Relaxed)
    }

    /// Turn closed scopes of one stream into timed operations. The caller
    /// has waited for the stream, so every record of them has completed.
    /// `open_since` is the earliest open time of scopes still open on the
    /// stream: records enqueued from then on are kept for them.
    pub(crate) fn resolve(
        &self,
        watch: Option<(StreamKey, WatchId)>,
        closed: Vec<ClosedScope>,
        cutoff: u64,
        timed: &mut Vec<TimedOp>,
    ) -> Result<(), CuptiError> {
        self.collector.flush()?;
        let now = self.now();
        let mut records = self.collector.lock();
        let Records { streams, api, .. } = &mut *records;
        let mut work: Vec<(u64, Work)> = Vec::new();
        if let Some((id, watchers)) = watch.and_then(|(key, id)| Some((id, streams.get_mut(&key)?)))
        {
            // Join every watcher's records with their calls, so the calls'
            // records can go once this watcher has consumed its own.
            for list in watchers.values_mut() {
                for w in list.iter_mut().filter(|w| w.enqueued.is_none()) {
                    w.enqueued = api.get(&w.correlation).copied();
                }
            }
            if let Some(list) = watchers.get_mut(&id) {
                let mut kept = Vec::new();
                for w in list.drain(..) {
                    match w.enqueued {
                        Some(enqueued) => {
                            work.push((enqueued, w));
                            if enqueued >= cutoff {
                                // A scope still open may own it.
                                kept.push(w);
                            } else {
                                api.remove(&w.correlation);
                            }
                        }
                        // Enqueued by a call this backend does not follow (or
                        // whose record was lost): no scope can claim it.
                        None => {
                            self.unattributed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                *list = kept;
            }
        }
        // Calls whose work went to streams no profiler watches.
        api.retain(|_, enqueued| now.saturating_sub(*enqueued) < API_RECORD_TTL_NS);
        drop(records);
        let work = work
            .into_iter()
            .map(|(enqueued, w)| (enqueued, w.start, w.end))
            .collect();
        timed.extend(attribute(work, closed, self.base_ts));
        Ok(())
    }
}

/// Each closed scope's GPU span: from the first start to the last end of the
/// work (enqueue time, GPU start, GPU end; CUPTI's clock) whose enqueue call
/// began within the scope's window; empty, where the host closed it, when it
/// has none. Times on the timeline are after `base`.
fn attribute(
    mut work: Vec<(u64, u64, u64)>,
    closed: Vec<ClosedScope>,
    base: u64,
) -> impl Iterator<Item = TimedOp> {
    work.sort_unstable_by_key(|&(enqueued, _, _)| enqueued);
    closed.into_iter().map(move |scope| {
        let from = work.partition_point(|&(enqueued, _, _)| enqueued < scope.open);
        let span = work[from..]
            .iter()
            .take_while(|&&(enqueued, _, _)| enqueued <= scope.close)
            .fold(None, |span, &(_, start, end)| {
                Some(match span {
                    Some((first, last)) => (start.min(first), end.max(last)),
                    None => (start, end),
                })
            });
        let (start, end) = span.unwrap_or((scope.close, scope.close));
        let start = start.saturating_sub(base);
        TimedOp {
            name: scope.name,
            start_ns: start,
            end_ns: end.saturating_sub(base).max(start),
            depth: scope.depth,
        }
    })
}

impl Drop for CuptiBackend {
    fn drop(&mut self) {
        let mut users = self
            .collector
            .users
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        *users = users.saturating_sub(1);
        if *users == 0 {
            if let Err(err) = self.collector.set_kinds(false) {
                tracing::warn!("disabling CUPTI activity records failed: {err}");
            }
            // Deliver what CUPTI still holds, then forget the calls: no
            // profiler is left to claim their work.
            if let Err(err) = self.collector.flush() {
                tracing::warn!("flushing CUPTI's records failed: {err}");
            }
            self.collector.lock().api.clear();
        }
    }
}

/// A scope closed under the CUPTI backend, waiting for its records.
pub(crate) struct ClosedScope {
    pub(crate) name: Name,
    pub(crate) depth: u32,
    /// CUPTI's clock when it opened and closed.
    pub(crate) open: u64,
    pub(crate) close: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope(name: &'static str, depth: u32, open: u64, close: u64) -> ClosedScope {
        ClosedScope {
            name: name.into(),
            depth,
            open,
            close,
        }
    }

    fn spans(work: Vec<(u64, u64, u64)>, closed: Vec<ClosedScope>) -> Vec<(String, u64, u64)> {
        attribute(work, closed, 1_000)
            .map(|op| (op.name.into_owned(), op.start_ns, op.end_ns))
            .collect()
    }

    #[test]
    fn a_scope_owns_the_work_enqueued_while_it_was_open() {
        // (enqueued, GPU start, GPU end): one item before the scope, two in
        // it (the GPU runs them long after), one after.
        let work = vec![
            (1_100, 5_000, 9_000),
            (1_300, 9_000, 9_500),
            (1_350, 9_600, 9_900),
            (1_500, 9_900, 20_000),
        ];
        let got = spans(work, vec![scope("mine", 0, 1_200, 1_400)]);
        assert_eq!(got, vec![("mine".to_string(), 8_000, 8_900)]);
    }

    #[test]
    fn nested_scopes_contain_their_inner_work_and_empty_ones_sit_at_their_close() {
        let work = vec![(1_300, 9_000, 9_500), (1_600, 9_500, 12_000)];
        let got = spans(
            work,
            vec![
                scope("inner", 1, 1_250, 1_350),
                scope("empty", 1, 1_400, 1_450),
                scope("outer", 0, 1_200, 1_700),
            ],
        );
        assert_eq!(
            got,
            vec![
                ("inner".to_string(), 8_000, 8_500),
                ("empty".to_string(), 450, 450),
                ("outer".to_string(), 8_000, 11_000),
            ]
        );
    }

    #[test]
    fn window_edges_are_inside_and_records_out_of_order_are_sorted() {
        let work = vec![(1_400, 3_000, 3_100), (1_200, 2_000, 2_500)];
        let got = spans(work, vec![scope("edges", 0, 1_200, 1_400)]);
        assert_eq!(got, vec![("edges".to_string(), 1_000, 2_100)]);
    }

    #[test]
    fn an_incomplete_record_never_ends_before_it_starts() {
        // CUPTI writes 0 for a timestamp it could not collect.
        let got = spans(vec![(1_300, 5_000, 0)], vec![scope("odd", 0, 1_200, 1_400)]);
        assert_eq!(got, vec![("odd".to_string(), 4_000, 4_000)]);
    }
}
