//! The work a stream carries: what is enqueued, what a capture records, and how
//! the worker executes each piece.

use crate::event::Event;
use crate::launch_dims::LaunchDims;
use crate::sticky_errors::Fault;
use crate::stream::Stream;
use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use sys::CUresult;
use sys::signature::{Extent, Param, count_from_bytes};

/// A kernel launch with its arguments copied at launch time, as CUDA copies
/// them: the caller may free its `kernelParams` as soon as the call returns.
#[derive(Clone)]
pub(crate) struct Launch {
    pub(crate) name: &'static str,
    pub(crate) twin: crate::modules::Run,
    /// The kernel's declared parameters: pointers are checked against the
    /// allocation table before the twin runs.
    pub(crate) params: &'static [Param],
    pub(crate) dims: LaunchDims,
    /// One buffer per argument, 16-byte aligned so any by-value argument
    /// (including `float4`/`double2`) is read at its natural alignment.
    pub(crate) args: Vec<Box<[u128]>>,
    /// Its device node handle (`devNode`), for a launch made with
    /// `CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE` (see `device_node`).
    pub(crate) device_node: Option<usize>,
}

/// One unit of stream work that does not involve events.
#[derive(Clone)]
pub(crate) enum Action {
    /// `memmove`; a side marked `device` must still be live memory when the
    /// worker gets to it (a stream-ordered use-after-free becomes an illegal
    /// address fault, not silent corruption).
    Copy {
        dst: usize,
        src: usize,
        len: usize,
        dst_device: bool,
        src_device: bool,
    },
    Set8 {
        dst: usize,
        value: u8,
        count: usize,
    },
    Set32 {
        dst: usize,
        value: u32,
        count: usize,
    },
    Host {
        f: unsafe extern "C" fn(*mut c_void),
        data: usize,
    },
    Kernel(Arc<Launch>),
    /// A launch that fault injection turned into a failing one.
    InjectedFault(&'static str),
    /// A stream-ordered free (`cuMemFreeAsync`).
    Free(usize),
    /// A stream-ordered allocation becomes usable (`cuMemAllocAsync`).
    Ready(usize),
    /// A graph's allocation node: its memory is usable from here on.
    GraphAlloc(Arc<crate::graph_memory::GraphAllocation>),
    /// A graph's free node: its memory is usable no more.
    GraphFree(Arc<crate::graph_memory::GraphAllocation>),
    /// An ordered operation with no effect here (prefetch).
    Nop,
    /// `cuStreamWriteValue32`: an atomic store (see `stream_memops`).
    Write32 {
        dst: usize,
        value: u32,
    },
    /// Work of another part of the driver (the software NCCL's collectives),
    /// given the stream's device and whether the stream has a sticky error;
    /// it runs even then, so that peers waiting for it are not left hanging.
    Call(Arc<dyn Fn(i32, bool) -> Option<Fault> + Send + Sync>),
    /// Work made anew each time it is enqueued: eagerly, once; captured,
    /// at every graph launch. The software NCCL numbers a communicator's
    /// calls when they are enqueued, and a replayed collective is a new
    /// call.
    Instance(Arc<dyn Fn() -> Action + Send + Sync>),
    /// A conditional node of a graph (see `conditional`).
    Conditional(Arc<crate::conditional::Conditional>),
    /// The start of a graph launch: its condition handles take their
    /// defaults.
    AssignDefaults(Arc<[Arc<crate::conditional::Slot>]>),
}

/// What a stream in capture mode records, replayed by `cuGraphLaunch`.
#[derive(Clone)]
pub(crate) enum Template {
    Act(Action),
    Record(Arc<Event>),
    Wait(Arc<Event>),
}

/// What a stream's queue holds, ready to run.
pub(crate) enum Op {
    Act(Action),
    /// An event's marker; the number is the record generation it belongs to.
    Marker(Arc<Event>, u64),
    /// Block until `stream` has completed its operation number `ticket`.
    Wait(Arc<Stream>, u64),
}

impl Op {
    /// Run the operation on the worker of a stream of `device`. `faulted`:
    /// the stream already has a sticky error, so only what must still happen
    /// (host functions, frees, markers and waits) happens.
    pub(crate) fn run(self, faulted: bool, device: i32) -> Option<Fault> {
        match self {
            Op::Act(action) => action.run(faulted, device),
            Op::Marker(event, generation) => {
                event.mark(generation);
                None
            }
            Op::Wait(stream, ticket) => {
                stream.wait_for(ticket);
                // Work after the wait reads what the other stream produced:
                // if that failed, this stream fails too, rather than run on
                // stale data and report success.
                stream.failed_by(ticket).map(|fault| Fault {
                    code: fault.code,
                    detail: format!(
                        "waited for stream {:#x}, whose work failed: {}",
                        stream.handle, fault.detail
                    ),
                })
            }
        }
    }

    /// Whether a fault of this operation poisons its whole context. Errors
    /// of the work itself do, as on a GPU; a failure taken over from a
    /// stream waited for (already noted where it happened, maybe on another
    /// device) and the software NCCL's failures stay with the stream.
    pub(crate) fn poisons_context(&self) -> bool {
        !matches!(self, Op::Wait(..) | Op::Act(Action::Call(_)))
    }
}

impl Action {
    pub(crate) fn run(self, faulted: bool, device: i32) -> Option<Fault> {
        match self {
            Action::Host { f, data } => {
                // Marked, so that driver calls from `f` are refused as CUDA may.
                crate::context::as_host_function(|| {
                    // SAFETY: the caller of cuLaunchHostFunc promised that f may
                    // be called with userData once the preceding work is done;
                    // an extern "C" function cannot unwind into us.
                    unsafe { f(data as *mut c_void) }
                });
                None
            }
            Action::Free(ptr) => {
                crate::memory::release_async(ptr);
                None
            }
            Action::Ready(ptr) => {
                crate::memory::mark_ready(ptr);
                None
            }
            Action::GraphAlloc(allocation) => {
                crate::graph_memory::run_node(&allocation, true, faulted)
            }
            Action::GraphFree(allocation) => {
                crate::graph_memory::run_node(&allocation, false, faulted)
            }
            Action::Call(call) => call(device, faulted),
            // Made by `Stream::submit`; run as made if one slips through.
            Action::Instance(make) => make().run(faulted, device),
            _ if faulted => None,
            Action::Nop => None,
            Action::Conditional(cond) => cond.run(device),
            Action::AssignDefaults(slots) => {
                slots.iter().for_each(|slot| slot.assign_default());
                None
            }
            Action::InjectedFault(name) => Some(Fault {
                code: CUresult::CUDA_ERROR_LAUNCH_FAILED,
                detail: format!("injected fault: the launch of `{name}` failed"),
            }),
            Action::Copy {
                dst,
                src,
                len,
                dst_device,
                src_device,
            } => {
                if let Some(fault) = still_live(src, len, src_device, "reads")
                    .or_else(|| still_live(dst, len, dst_device, "writes"))
                {
                    return Some(fault);
                }
                // Copies may cross devices without peer access: the driver
                // stages them, as CUDA does.
                // SAFETY: device sides are inside live allocations (checked just
                // now); host sides are the caller's promise, as on CUDA. The
                // ranges may overlap for device-to-device copies, hence `copy`.
                unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len) };
                None
            }
            Action::Set8 { dst, value, count } => {
                if let Some(fault) = reachable(dst, count, device) {
                    return Some(fault);
                }
                // SAFETY: inside a live allocation (checked just now).
                unsafe { std::ptr::write_bytes(dst as *mut u8, value, count) };
                None
            }
            Action::Set32 { dst, value, count } => {
                if let Some(fault) = reachable(dst, count * 4, device) {
                    return Some(fault);
                }
                // SAFETY: inside a live allocation (checked just now) and
                // 4-byte aligned (checked at enqueue).
                let words = unsafe { std::slice::from_raw_parts_mut(dst as *mut u32, count) };
                words.fill(value);
                None
            }
            Action::Kernel(launch) => match crate::device_node::as_it_runs(&launch) {
                Some(now) => now.run(device),
                None => launch.run(device),
            },
            Action::Write32 { dst, value } => write32(dst, value),
        }
    }
}

fn still_live(ptr: usize, len: usize, device: bool, verb: &str) -> Option<Fault> {
    if !device {
        return None;
    }
    crate::memory::check_range(ptr, len).err().map(|why| Fault {
        code: CUresult::CUDA_ERROR_ILLEGAL_ADDRESS,
        detail: format!("a stream operation {verb} {len} bytes at {ptr:#x}: {why}"),
    })
}

/// The worker reached a `cuStreamWriteValue32`: store `value` at `dst`,
/// which must still be live memory. A release store, so that a host thread
/// that reads the flag with an acquire load sees everything the stream did
/// before it (see `stream_memops`).
fn write32(dst: usize, value: u32) -> Option<Fault> {
    if let Err(why) = crate::memory::check_range(dst, 4) {
        return Some(Fault {
            code: CUresult::CUDA_ERROR_ILLEGAL_ADDRESS,
            detail: format!("cuStreamWriteValue32 writes 4 bytes at {dst:#x}: {why}"),
        });
    }
    // SAFETY: inside a live allocation (checked just now) and 4-byte aligned
    // (checked at enqueue); other threads only touch a flag atomically.
    let flag = unsafe { std::sync::atomic::AtomicU32::from_ptr(dst as *mut u32) };
    flag.store(value, std::sync::atomic::Ordering::Release);
    None
}

/// A memset's destination: live, and memory a memset on `device` may write
/// (its own, or a peer's with peer access enabled).
fn reachable(ptr: usize, len: usize, device: i32) -> Option<Fault> {
    crate::memory::check_access(ptr, len, device)
        .err()
        .map(|why| Fault {
            code: CUresult::CUDA_ERROR_ILLEGAL_ADDRESS,
            detail: format!("a memset on device {device} writes {len} bytes at {ptr:#x}: {why}"),
        })
}

impl Launch {
    /// The bytes of argument `index`, as copied at launch.
    fn arg_bytes(&self, index: usize) -> &[u8] {
        let size = self.params.get(index).map_or(0, Param::size);
        let words = &self.args[index];
        // SAFETY: a `[u128]` buffer viewed as its bytes; `size` is at most
        // the buffer's length in bytes (it was allocated for `size`).
        let bytes =
            unsafe { std::slice::from_raw_parts(words.as_ptr().cast::<u8>(), words.len() * 16) };
        &bytes[..size.min(bytes.len())]
    }

    /// What memcheck checks on a GPU, before the twin touches anything:
    /// every pointer parameter addresses live memory that `device` may use
    /// (its own, a peer's with peer access enabled, pinned or managed), with
    /// room for the elements the kernel is told to touch.
    fn check_pointers(&self, device: i32) -> Result<Vec<u64>, Fault> {
        let mut counts = vec![0; self.params.len()];
        for (index, param) in self.params.iter().enumerate() {
            let Param::Pointer { elem, extent, .. } = *param else {
                continue;
            };
            let count = match extent {
                Extent::Elements(count) => Some(count),
                Extent::Arg(at) => self.params.get(at).and_then(|p| match p {
                    Param::Scalar(scalar) => count_from_bytes(*scalar, self.arg_bytes(at)),
                    Param::Pointer { .. } | Param::Condition => None,
                }),
            };
            let illegal = |why: String| Fault {
                code: CUresult::CUDA_ERROR_ILLEGAL_ADDRESS,
                detail: format!("kernel `{}` parameter {index}: {why}", self.name),
            };
            let Some(count) = count else {
                return Err(illegal("its element count cannot be read".into()));
            };
            counts[index] = count;
            if count == 0 {
                continue; // touches nothing: any pointer, even null, is fine
            }
            let ptr = u64::from_ne_bytes(self.arg_bytes(index).try_into().unwrap_or([0; 8]));
            let Some(bytes) = count.checked_mul(elem.size() as u64) else {
                return Err(illegal(format!("{count} elements of {elem} overflow")));
            };
            let ptr = usize::try_from(ptr).unwrap_or(usize::MAX);
            let bytes = usize::try_from(bytes).unwrap_or(usize::MAX);
            if let Err(why) = crate::memory::check_access(ptr, bytes, device) {
                return Err(illegal(format!(
                    "{count} element(s) of {elem} at {ptr:#x}. In bytes: {why}"
                )));
            }
        }
        Ok(counts)
    }

    fn run(&self, device: i32) -> Option<Fault> {
        let counts = match self.check_pointers(device) {
            Ok(counts) => counts,
            Err(fault) => return Some(fault),
        };
        let dims = self.dims;
        let outcome = match self.twin {
            crate::modules::Run::Raw(twin) => {
                // A fresh copy per run: a twin may scribble on its arguments,
                // and a graph replays the same launch many times.
                let mut args = self.args.clone();
                let mut params: Vec<*mut c_void> =
                    args.iter_mut().map(|a| a.as_mut_ptr().cast()).collect();
                catch_unwind(AssertUnwindSafe(|| {
                    // SAFETY: the twin was registered for this kernel with these
                    // argument sizes; params[i] points at a copy of argument i.
                    unsafe { twin(&dims, params.as_mut_ptr()) }
                }))
            }
            crate::modules::Run::Safe(twin) => {
                let mut snapshots = Vec::new();
                let scalar_bytes = |index: usize| {
                    let mut bytes = [0u8; 8];
                    let arg = self.arg_bytes(index);
                    bytes[..arg.len().min(8)].copy_from_slice(&arg[..arg.len().min(8)]);
                    bytes
                };
                let views = match crate::twin::views(
                    self.name,
                    self.params,
                    scalar_bytes,
                    &counts,
                    &mut snapshots,
                ) {
                    Ok(views) => views,
                    Err(detail) => {
                        return Some(Fault {
                            code: CUresult::CUDA_ERROR_LAUNCH_FAILED,
                            detail,
                        });
                    }
                };
                // SAFETY: every pointer view was checked just now: live, in
                // bounds for its count and reachable from this device
                // (check_pointers), aligned, and no written range overlaps
                // another view's (`views` copied overlapping reads). The
                // memory stays allocated while the stream runs this launch
                // (a free is stream-ordered behind it), and the snapshots
                // live until the end of this function.
                let mut args = unsafe { crate::twin::TwinArgs::new(self.name, views) };
                let outcome = catch_unwind(AssertUnwindSafe(|| twin(&dims, &mut args)));
                drop(snapshots);
                outcome
            }
        };
        outcome.err().map(|panic| {
            let why = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".to_string());
            Fault {
                code: CUresult::CUDA_ERROR_LAUNCH_FAILED,
                detail: format!("kernel twin `{}` panicked: {why}", self.name),
            }
        })
    }
}
