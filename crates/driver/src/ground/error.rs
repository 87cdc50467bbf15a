//! The driver layer's error type.

use sys::{DriverError, LoadError};

use super::error_text::{detail_suffix, device_mismatch_fix, zero_size_message};
use crate::ground::arg_kind::ArgKind;
use sys::signature::{InvalidSignature, Param, Scalar};

/// Everything the safe driver layer can fail with.
///
/// Messages name the values involved:
///
/// ```
/// use cuda_streams_driver::{Context, DeviceBuffer, Error, Stream};
/// let ctx = Context::new(0).unwrap();
/// let stream = Stream::new(&ctx).unwrap();
/// let err = DeviceBuffer::<f32>::new_async(&stream, 0).unwrap_err();
/// assert!(matches!(err, Error::ZeroSize { len: 0, .. }));
/// assert_eq!(err.to_string(), "a DeviceBuffer of 0 element(s) would be empty: zero-length buffers are refused (docs/architecture.md#empty-buffers)");
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A driver call failed.
    #[error(transparent)]
    Driver(#[from] DriverError),
    /// Work on a stream failed (`CUDA_ERROR_LAUNCH_FAILED`,
    /// `CUDA_ERROR_ILLEGAL_ADDRESS`) and the driver says why: on the
    /// software driver, the CPU twin that panicked and the panic's message,
    /// or the access that was out of bounds. NVIDIA's driver says nothing
    /// more, so on a GPU the same failure is [`Error::Driver`].
    #[error("{source}: {detail}")]
    WorkFailed {
        /// The driver's error.
        #[source]
        source: DriverError,
        /// What the driver says about the failure.
        detail: String,
    },
    /// `CUDA_STREAMS_DRIVER=cuda` (or an explicit request for the GPU) and the
    /// CUDA driver could not be loaded.
    #[error("the CUDA driver was requested but could not be loaded: {0}")]
    Load(#[from] LoadError),
    /// The CUDA driver loaded but reports no usable device.
    #[error("the CUDA driver was requested but found no usable device: {0}")]
    NoDevice(DriverError),
    /// `CUDA_STREAMS_DRIVER` holds something other than `cuda`, `soft` or `auto`.
    #[error("CUDA_STREAMS_DRIVER={value:?} is not one of `cuda`, `soft`, `auto`")]
    InvalidDriverChoice {
        /// The value found in the environment.
        value: String,
    },
    /// An environment variable the driver reads (or the software driver's:
    /// `CUDA_STREAMS_SOFT_DEVICES`, `CUDA_STREAMS_SOFT_CAPACITY_MB`) holds a
    /// value that cannot be used; the message names it.
    #[error(transparent)]
    InvalidEnv(#[from] sys::env::EnvError),
    /// Two operations on different streams touch the same bytes, one
    /// writing, with no order between them; the context's
    /// [`crate::OrderPolicy`] is `Check` (or `Auto` could not repair it).
    /// Nothing was enqueued.
    #[error("{0}")]
    UnorderedAccess(Box<crate::ground::race::Race>),
    /// An [`OrderPolicy`](crate::OrderPolicy) the driver in use does not
    /// accept: the software driver refuses `Off` and `Report`, under which
    /// two stream workers could touch the same host memory at once (a data
    /// race). From [`Context::set_ordering`](crate::Context::set_ordering)
    /// (the policy stays as it was), or from making a context when
    /// `CUDA_STREAMS_ORDERING` asks for it (`from_env` holds its value).
    ///
    /// ```
    /// use cuda_streams_driver::{Context, DriverKind, Error, OrderPolicy};
    /// let ctx = Context::new(0).unwrap();
    /// if ctx.kind() == DriverKind::Soft {
    ///     let err = ctx.set_ordering(OrderPolicy::Report).unwrap_err();
    ///     assert!(matches!(
    ///         err,
    ///         Error::OrderPolicyRefused { policy: OrderPolicy::Report, driver: DriverKind::Soft, from_env: None }
    ///     ));
    ///     assert!(err.to_string().starts_with("ordering policy report is refused on the software driver"));
    /// }
    /// ```
    #[error("{}", crate::ground::order_policy::refusal_message(.policy, .driver, .from_env))]
    OrderPolicyRefused {
        /// The policy asked for.
        policy: crate::ground::order_policy::OrderPolicy,
        /// The driver that refuses it.
        driver: crate::ground::loaded_driver::DriverKind,
        /// `CUDA_STREAMS_ORDERING`'s value, as written, when the policy
        /// came from there.
        from_env: Option<String>,
    },
    /// Selecting the driver failed earlier in this process (the message of that failure).
    #[error("driver selection failed: {0}")]
    Selection(String),
    /// A device ordinal outside `0..count`.
    #[error("device {ordinal} does not exist: the driver reports {count} device(s)")]
    InvalidDevice {
        /// The ordinal asked for.
        ordinal: i32,
        /// How many devices the driver reports.
        count: i32,
    },
    /// An [`EventPool`](crate::EventPool) would need more events of one kind
    /// than its cap allows.
    #[error("event pool exhausted: all {cap} {kind} event(s) allowed by the cap are in use")]
    EventPoolExhausted {
        /// `regular` or `timing`.
        kind: &'static str,
        /// The cap on events of that kind.
        cap: usize,
    },
    /// An [`EventPool`](crate::EventPool) asked to create more events up
    /// front than its cap allows.
    #[error("event pool cap {cap} is below the {requested} {kind} event(s) requested up front")]
    EventPoolCapBelowInitial {
        /// `regular` or `timing`.
        kind: &'static str,
        /// How many were requested up front.
        requested: usize,
        /// The cap.
        cap: usize,
    },
    /// A raw stream priority outside the device's range.
    #[error(
        "stream priority {value} is outside the device's range {greatest} (greatest) ..= {least} (least)"
    )]
    InvalidPriority {
        /// The priority asked for.
        value: i32,
        /// The least priority (numerically largest).
        least: i32,
        /// The greatest priority (numerically smallest).
        greatest: i32,
    },
    /// An allocation of zero elements (or of a zero-sized type).
    #[error("{}", zero_size_message(.what, *.len, *.elem_size))]
    ZeroSize {
        /// What was being allocated, e.g. `DeviceBuffer<f32>`.
        what: &'static str,
        /// The number of elements asked for.
        len: usize,
        /// The size of one element.
        elem_size: usize,
    },
    /// An allocation whose size in bytes does not fit in `usize`.
    #[error("a {what} of {len} element(s) is too large: its size in bytes overflows usize")]
    SizeOverflow {
        /// What was being allocated.
        what: &'static str,
        /// The number of elements asked for.
        len: usize,
        /// The size of one element.
        elem_size: usize,
    },
    /// A copy between regions of different lengths.
    #[error(
        "{operation}: the destination holds {expected} element(s) but the source holds {actual}"
    )]
    SizeMismatch {
        /// The operation, e.g. `copy_from_host_async`.
        operation: &'static str,
        /// The destination's length in elements.
        expected: usize,
        /// The source's length in elements.
        actual: usize,
    },
    /// `memset_u32_async` on a region whose size is not a multiple of 4 bytes.
    #[error("memset_u32_async on {bytes} bytes: the size must be a multiple of 4")]
    MisalignedMemset {
        /// The region's size in bytes.
        bytes: usize,
    },
    /// `cuMemHostRegister` refused host memory, most likely because it is
    /// page-locked already: pinned by `cuMemHostAlloc` (a `PinnedBuffer`, a
    /// `HostPool` block) or registered, which needs no registration.
    #[error(
        "registering {bytes} bytes at {address:#x} with cuMemHostRegister was refused ({source}): {reason}"
    )]
    HostRegister {
        /// The memory's first byte.
        address: u64,
        /// Its size in bytes.
        bytes: usize,
        /// The driver's code: `CUDA_ERROR_INVALID_VALUE` or
        /// `CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED`.
        source: DriverError,
        /// Why, and what to do instead.
        reason: &'static str,
    },
    /// Objects from two different contexts were combined.
    #[error("{what} belongs to context {found}, but the stream belongs to context {expected}")]
    ContextMismatch {
        /// The object that does not match.
        what: &'static str,
        /// The stream's context id.
        expected: u64,
        /// The object's context id.
        found: u64,
    },
    /// Memory, an event or a kernel of one device used on a stream of another,
    /// where the operation needs them on the stream's own device.
    #[error(
        "{what} belongs to device {found_device} (context {found}), but the stream belongs to \
         device {stream_device} (context {expected}): {}",
        device_mismatch_fix(.what, *.found_device, *.stream_device)
    )]
    DeviceMismatch {
        /// The object that does not match.
        what: &'static str,
        /// The stream's device ordinal.
        stream_device: i32,
        /// The object's device ordinal.
        found_device: i32,
        /// The stream's context id.
        expected: u64,
        /// The object's context id.
        found: u64,
    },
    /// Peer access between two devices that cannot be peers.
    #[error(
        "device {from} cannot access the memory of device {to} (cuDeviceCanAccessPeer says no)"
    )]
    PeerAccessUnsupported {
        /// The device that would access.
        from: i32,
        /// The device whose memory it would access.
        to: i32,
    },
    /// A launch configuration the hardware cannot run.
    #[error("invalid launch configuration: {reason}")]
    InvalidLaunchConfig {
        /// What is wrong, naming the value.
        reason: String,
    },
    /// A kernel launched with the wrong number of arguments.
    #[error("kernel `{kernel}` takes {expected} argument(s) but {actual} were given")]
    ArgumentCount {
        /// The kernel's name.
        kernel: String,
        /// The count its signature declares.
        expected: usize,
        /// The count given.
        actual: usize,
    },
    /// A kernel argument that is not what its parameter declares.
    #[error("kernel `{kernel}` argument {index}: expected {expected} but got {actual}")]
    ArgumentMismatch {
        /// The kernel's name.
        kernel: String,
        /// The argument's position, from 0.
        index: usize,
        /// What the signature declares.
        expected: Param,
        /// What was given.
        actual: ArgKind,
    },
    /// A buffer shorter than the elements the kernel is told to touch.
    #[error(
        "kernel `{kernel}` argument {index}: the kernel touches {elements} element(s) of {elem} but the buffer holds {} element(s) of {elem}",
        .bytes / .elem.size()
    )]
    ArgumentTooShort {
        /// The kernel's name.
        kernel: String,
        /// The buffer argument's position, from 0.
        index: usize,
        /// The elements the kernel would touch.
        elements: u64,
        /// Their type.
        elem: Scalar,
        /// The buffer's size in bytes (the message counts the whole
        /// elements of `elem` it holds).
        bytes: usize,
    },
    /// An object of another CUDA library (cudarc) that cannot be used with
    /// this one: another context, the software driver, a per-thread stream.
    #[error("interop: {reason}")]
    Interop {
        /// What does not match, naming both sides.
        reason: String,
    },
    /// A [`crate::DeviceMemory`] implementation's use hook failed for a
    /// reason of its own (not a driver error).
    #[error("a buffer could not be used on the stream: {reason}")]
    MemoryHook {
        /// What went wrong, from the implementation.
        reason: String,
    },
    /// A checked launch of a kernel without a declared signature.
    #[error(
        "kernel `{kernel}` has no declared signature, so its arguments cannot be checked: load it from an image that declares it (`Module::load(&ctx, &kernels::ELEMENTWISE)`, or the unsafe `ModuleImage::declared`), declare one with the unsafe `Kernel::with_signature`, or launch with the unsafe `Stream::launch_unchecked`"
    )]
    UncheckedKernel {
        /// The kernel's name.
        kernel: String,
    },
    /// A programmatic dependent launch of a kernel whose declaration does
    /// not say that it calls `cudaGridDependencySynchronize`.
    #[error(
        "kernel `{kernel}` cannot be launched with programmatic dependent launch: its declaration does not say that it calls cudaGridDependencySynchronize (kernel! {{ ..; calls cudaGridDependencySynchronize; }}), so it could read what the kernel before it is still writing; launch it with Stream::launch"
    )]
    NoGridDependencySync {
        /// The kernel's name.
        kernel: String,
    },
    /// A programmatic dependent launch on a device that cannot run one
    /// (compute capability below 9.0).
    #[error(
        "programmatic dependent launch needs compute capability 9.0 (Hopper) or newer; device {ordinal} ({name}) has {}.{}: launch with Stream::launch instead",
        compute_capability.0, compute_capability.1
    )]
    ProgrammaticLaunchUnsupported {
        /// The device ordinal.
        ordinal: i32,
        /// The device's name.
        name: String,
        /// Its compute capability (major, minor).
        compute_capability: (u32, u32),
    },
    /// A signature whose pointer extents do not name integer parameters.
    #[error("kernel `{kernel}`: invalid signature: {source}")]
    InvalidSignature {
        /// The kernel's name.
        kernel: String,
        /// What is wrong.
        #[source]
        source: InvalidSignature,
    },
    /// The software driver refused the CPU twins of a declared image: one of
    /// its kernels is already registered there with other parameters.
    #[error("the software driver refused the image's CPU twins: {0}")]
    Twins(#[from] soft_driver::RegisterError),
    /// Loading a module image failed.
    #[error("loading a module image of {bytes} bytes failed: {source}{}", detail_suffix(.detail))]
    ModuleLoad {
        /// The image's size.
        bytes: usize,
        /// The driver's error.
        #[source]
        source: DriverError,
        /// More detail from the software driver, when it has any.
        detail: Option<String>,
    },
    /// A module image that is empty.
    #[error("a module image of 0 bytes cannot be loaded")]
    EmptyImage,
    /// Looking up a kernel by name failed.
    #[error("kernel `{name}` not found in the module: {source}{}", detail.as_ref().map(|d| format!(" ({d})")).unwrap_or_default())]
    FunctionNotFound {
        /// The name looked up.
        name: String,
        /// The driver's error.
        #[source]
        source: DriverError,
        /// The software driver's explanation, when it gives one (boxed to
        /// keep the error small).
        detail: Option<Box<str>>,
    },
    /// NVRTC, needed to compile CUDA source on a GPU, could not be loaded.
    #[error("run-time compilation needs NVRTC: {reason}")]
    NvrtcUnavailable {
        /// Why it could not be loaded: what was tried and what to install.
        reason: String,
    },
    /// An NVRTC call other than the compilation itself failed.
    #[error("{call} failed: {source}")]
    NvrtcCall {
        /// The entry point.
        call: &'static str,
        /// NVRTC's error.
        #[source]
        source: sys::nvrtc::NvrtcError,
    },
    /// The source did not compile; the log is NVRTC's.
    #[error("compiling {program} for {arch} failed:\n{log}")]
    Compile {
        /// The program's name.
        program: String,
        /// The architecture compiled for.
        arch: crate::ground::arch::Arch,
        /// NVRTC's log.
        log: String,
    },
    /// On the software driver without NVRTC, the source was not compiled,
    /// and the check it could make without a compiler (its brackets) failed.
    #[error(
        "the CUDA source of {program} was not compiled (the software driver has no compiler and \
         NVRTC is not installed), and its bracket check failed: {problem}; install NVRTC for a \
         real compile check without a GPU: pip install nvidia-cuda-nvrtc==13.0.* (docs/kernels.md#checking-cuda-source-in-ci)"
    )]
    SourceNotCompiled {
        /// The program's name.
        program: String,
        /// What the check found, naming the lines.
        problem: String,
    },
    /// NVRTC cannot compile for the architecture asked for.
    #[error("NVRTC {nvrtc} cannot target {arch}; it supports {supported}")]
    UnsupportedArch {
        /// The architecture asked for.
        arch: crate::ground::arch::Arch,
        /// NVRTC's version.
        nvrtc: String,
        /// The architectures it supports.
        supported: String,
    },
    /// A kernel's declaration differs from the source (or image) it was
    /// checked against; the reason names the parameter.
    #[error("the declaration of kernel `{kernel}` does not match {program}: {reason}")]
    DeclarationMismatch {
        /// The kernel's declared name.
        kernel: &'static str,
        /// The program (or image) checked against.
        program: String,
        /// What differs.
        reason: String,
    },
    /// A declaration that nothing in the module can confirm.
    #[error(
        "kernel `{kernel}`: its module is bare bytes that declare nothing, so its declaration \
         cannot be checked; compile it from source (Program), load the image with \
         ModuleImage::declared, or take the declaration on trust with the unsafe \
         Module::kernel_unchecked"
    )]
    UncheckableDeclaration {
        /// The kernel.
        kernel: String,
    },
    /// The software driver runs kernels as the CPU twins of their
    /// declarations, and this one has none.
    #[error(
        "kernel `{kernel}` has no CPU twin, so the software driver cannot run it: add \
         `twin = per_thread(|thread, args..| ..);` or `twin = per_grid(|dims, args..| ..);` to \
         its kernel! declaration (docs/kernels.md), or run on a GPU (CUDA_STREAMS_DRIVER=cuda)"
    )]
    NoTwin {
        /// The kernel.
        kernel: String,
    },
    /// A kernel name containing a NUL byte.
    #[error("kernel name {name:?} contains a NUL byte")]
    InvalidName {
        /// The name given.
        name: String,
    },
    /// `Event::elapsed` on an event created without timing.
    #[error(
        "elapsed time needs two timing events, but the {which} event was created without timing"
    )]
    NotTimingEvent {
        /// `start` or `end`.
        which: &'static str,
    },
    /// `Event::elapsed` on an event that was never recorded.
    #[error("elapsed time needs recorded events, but the {which} event was never recorded")]
    EventNotRecorded {
        /// `start` or `end`.
        which: &'static str,
    },
    /// Callbacks on a stream panicked (the panics were caught).
    #[error("{count} callback(s) on stream {stream} panicked; the last said: {message}")]
    CallbackPanicked {
        /// The stream's id.
        stream: u64,
        /// How many panicked since the last check.
        count: u64,
        /// The last panic's message.
        message: String,
    },
    /// A driver call from inside a stream callback, which CUDA forbids.
    #[error(
        "{operation} was called from inside a stream callback; CUDA forbids driver calls there"
    )]
    InsideCallback {
        /// What was attempted.
        operation: &'static str,
    },
    /// A call that is not allowed on a stream while it is being captured into
    /// a graph. The capture is left as it was and stays usable.
    #[error(
        "{operation} on stream {stream} is not allowed while the stream is being captured into a graph (end the capture first, or enqueue through the Capture); the capture is still usable"
    )]
    StreamCapturing {
        /// What was attempted.
        operation: &'static str,
        /// The stream's id.
        stream: u64,
    },
    /// A capture begun (or a stream forked into one) from a
    /// [`crate::WorkObserver`], which runs inside an enqueue: the capture
    /// would have to wait for the enqueue it interrupts.
    #[error(
        "{operation} on stream {stream} was called from a WorkObserver, inside an enqueue; begin the capture after the enqueue returns"
    )]
    CaptureInsideEnqueue {
        /// What was attempted.
        operation: &'static str,
        /// The stream that would have entered the capture.
        stream: u64,
    },
    /// A context-wide call while a capture is open in the context.
    #[error(
        "{operation} is not allowed while {captures} stream capture(s) are open in the context; the captures are still usable"
    )]
    ContextCapturing {
        /// What was attempted.
        operation: &'static str,
        /// How many captures are open.
        captures: usize,
    },
    /// Waiting on the host for an event recorded during a capture.
    #[error(
        "{operation} on an event last recorded during stream capture {capture}: such an event marks a point in a graph, not in a stream; record it outside the capture"
    )]
    CapturedEvent {
        /// What was attempted.
        operation: &'static str,
        /// The capture's id.
        capture: u64,
    },
    /// A dependency that would cross a capture's boundary, or a stream used
    /// with a capture it does not take part in.
    #[error("{reason}")]
    CaptureIsolation {
        /// What crosses the boundary, naming the streams and captures.
        reason: String,
    },
    /// Ending a capture with a stream forked into it whose work was not
    /// joined back into the stream that began it.
    #[error(
        "stream {stream} was forked into the capture begun on stream {origin} but its work was not joined back (Capture::join); the capture is still open"
    )]
    CaptureUnjoined {
        /// The unjoined stream's id.
        stream: u64,
        /// The stream that began the capture.
        origin: u64,
    },
    /// A conditional node that cannot be captured: a condition of another
    /// graph, a body holding work a body may not hold, a driver without
    /// conditional nodes.
    #[error("conditional node: {reason}")]
    Conditional {
        /// What was refused, naming the condition, capture or driver version.
        reason: String,
    },
    /// Graph memory ([`crate::GraphBuffer`]) used outside its graph, a
    /// memory node where CUDA allows none, a second instance or an update
    /// of a graph with memory nodes, or a launch off the stream a
    /// [`crate::GraphMemoryShare`] holds its graphs to.
    #[error("graph memory: {reason}")]
    GraphMemory {
        /// What was refused, naming the buffer, captures or streams.
        reason: String,
    },
    /// A capture that was already ended.
    #[error("the capture begun on stream {origin} has already ended")]
    CaptureEnded {
        /// The stream that began the capture.
        origin: u64,
    },
    /// An executable graph could not be updated in place from a graph.
    #[error("the executable graph cannot be updated in place ({result}): {source}")]
    GraphUpdate {
        /// The driver's update result, e.g. `CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED`.
        result: String,
        /// The driver's error.
        #[source]
        source: DriverError,
    },
    /// A kernel node's arguments could not be set in place
    /// ([`crate::GraphExec::set_args`]).
    #[error("the kernel node's arguments cannot be set in place: {reason}")]
    NodeUpdate {
        /// What was refused, naming the node, the kernel or the capture.
        reason: String,
    },
    /// Host access to a graph's own host buffer that is not safe now.
    #[error("the graph's host buffer cannot be reached: {reason}")]
    GraphHostAccess {
        /// Why, naming the slot or what still shares it.
        reason: String,
    },
    /// The context's reactor thread (which wakes futures) could not start.
    #[error("the reactor thread that wakes futures could not start: {0}")]
    ReactorThread(String),
    /// A sub-range of a buffer that is empty or does not fit it
    /// (`DeviceBuffer::slice`).
    #[error("slice {range} of a buffer of {len} element(s): {reason}")]
    SliceOutOfRange {
        /// The range asked for, as `start..end`.
        range: String,
        /// The buffer's (or view's) length in elements.
        len: usize,
        /// Why it was refused.
        reason: &'static str,
    },
    /// A memory pool attribute that cuda.h 13.0 does not define: its size,
    /// and so the memory the driver would write, is unknown.
    #[error(
        "memory pool attribute {attribute} is not one of cuda.h 13.0's (CU_MEMPOOL_ATTR_*): its size is unknown"
    )]
    UnknownPoolAttribute {
        /// The attribute's value.
        attribute: u32,
    },
    /// The driver lacks the entry points SM partitions (green contexts) need.
    #[error(
        "SM partitions (green contexts) need a CUDA 12.4 driver or later; this driver \
         (version {driver_version}) lacks {}",
        .missing.join(", ")
    )]
    PartitionsUnsupported {
        /// The driver's version, as `cuDriverGetVersion` numbers it (12040 is 12.4).
        driver_version: i32,
        /// The entry points it lacks.
        missing: Vec<&'static str>,
    },
    /// The driver lacks the entry points that share memory and events
    /// between processes.
    #[error(
        "sharing memory and events between processes needs the virtual memory management and \
         IPC entry points; this driver (version {driver_version}) lacks {}",
        .missing.join(", ")
    )]
    IpcUnsupported {
        /// The driver's version, as `cuDriverGetVersion` numbers it.
        driver_version: i32,
        /// The entry points it lacks.
        missing: Vec<&'static str>,
    },
    /// The driver makes no memory pools of host memory.
    #[error(
        "memory pools of host memory need a CUDA 12.2 driver or later; this driver (version \
         {driver_version}) lacks {}",
        .missing.join(", ")
    )]
    HostPoolsUnsupported {
        /// The driver's version, as `cuDriverGetVersion` numbers it (12020 is 12.2).
        driver_version: i32,
        /// What it lacks: entry points, or host pools themselves.
        missing: Vec<&'static str>,
    },
    /// Sharing memory or an event with another process was refused: a
    /// forged or stale handle, a handle for another device, a peer that is
    /// not who it must be, or one that went away.
    #[error("interprocess sharing: {reason}")]
    Ipc {
        /// What was refused, naming the values.
        reason: String,
    },
    /// A partition asked for zero SMs.
    #[error("partition {index} asks for 0 SMs: a partition needs at least one")]
    PartitionOfZeroSms {
        /// Its place in the request.
        index: usize,
    },
    /// A partition asked for more SMs than the device has left.
    #[error(
        "partition {index} asks for {requested} SMs ({rounded} after rounding up to the \
         granularity of {granularity}), but partitions can take {available} more SMs of device \
         {device}, which has {total}"
    )]
    PartitionTooLarge {
        /// Its place in the request.
        index: usize,
        /// The SMs asked for.
        requested: u32,
        /// The SMs it would get: `requested` rounded up to the granularity.
        rounded: u32,
        /// The device's SM granularity (8 on Hopper).
        granularity: u32,
        /// The SMs partitions can still take after the ones before it
        /// (whole groups of the granularity, as many as the driver makes).
        available: u32,
        /// The device's SMs.
        total: u32,
        /// The device's ordinal.
        device: i32,
    },
    /// An error of a crate built on this one (the allocator's, the
    /// profiler's, the facade's `cuda_streams::Error`...), carried where a
    /// driver `Result` is expected: the work of an operation graph's
    /// operation returns one, and `?` on another crate's call inside it
    /// lands here. Each such crate converts its error with `From`; a driver
    /// failure it wraps comes back as itself, not as this. The error keeps
    /// its type ([`Error::downcast_ref`]) and its source chain.
    #[error("{0}")]
    Other(#[source] Box<dyn std::error::Error + Send + Sync + 'static>),
}

impl Error {
    /// The driver's error under this one, if a driver call failed
    /// ([`Error::Driver`], or [`Error::WorkFailed`] with the driver's
    /// detail), so a caller can test the `CUresult` whichever driver ran.
    ///
    /// ```
    /// use cuda_streams_driver::{Error, sys::DriverError, sys::CUresult};
    /// let err = Error::from(DriverError::new(CUresult::CUDA_ERROR_OUT_OF_MEMORY));
    /// assert_eq!(err.driver_error().map(|e| e.code()), Some(CUresult::CUDA_ERROR_OUT_OF_MEMORY));
    /// ```
    pub fn driver_error(&self) -> Option<&DriverError> {
        match self {
            Self::Driver(source) | Self::WorkFailed { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Carry another crate's error as [`Error::Other`], so it can go where a
    /// driver `Result` is expected (the crates above implement `From` with
    /// this).
    ///
    /// ```
    /// use cuda_streams_driver::Error;
    /// let parse = "x".parse::<u32>().unwrap_err();
    /// let err = Error::other(parse.clone());
    /// assert_eq!(err.to_string(), parse.to_string());
    /// assert_eq!(err.downcast_ref::<std::num::ParseIntError>(), Some(&parse));
    /// assert!(std::error::Error::source(&err).is_some());
    /// ```
    pub fn other(error: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>) -> Error {
        Error::Other(error.into())
    }

    /// The error [`Error::Other`] carries, if it is an `E`.
    pub fn downcast_ref<E: std::error::Error + 'static>(&self) -> Option<&E> {
        match self {
            Error::Other(error) => error.downcast_ref::<E>(),
            _ => None,
        }
    }

    /// The error [`Error::Other`] carries, taken out, if it is an `E`;
    /// otherwise this error as it was.
    ///
    /// ```
    /// use cuda_streams_driver::Error;
    /// let parse = "x".parse::<u32>().unwrap_err();
    /// assert_eq!(Error::other(parse.clone()).downcast::<std::num::ParseIntError>().ok(), Some(parse));
    /// assert!(matches!(Error::EmptyImage.downcast::<std::num::ParseIntError>(), Err(Error::EmptyImage)));
    /// ```
    pub fn downcast<E: std::error::Error + 'static>(self) -> std::result::Result<E, Error> {
        match self {
            Error::Other(error) => error.downcast::<E>().map(|e| *e).map_err(Error::Other),
            other => Err(other),
        }
    }
}
