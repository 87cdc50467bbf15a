//! Device-updatable kernel nodes through the raw table: a kernel captured
//! with `CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE`, its device node
//! handle read back with `cuGraphKernelNodeGetAttribute`, and its arguments
//! changed by `set_kernel_node_param` (from the test thread and from a
//! twin) for the executable graph's later launches; and CUDA's refusals.

use cuda_streams_soft_driver as soft;
use soft::sys::signature::{Access, Extent, Param, Scalar};
use soft::sys::{
    CUdeviceptr, CUfunction, CUgraph, CUgraphExec, CUgraphExecUpdateResultInfo, CUgraphNode,
    CUkernelNodeAttrValue, CUlaunchAttribute, CUlaunchAttributeID, CUlaunchConfig, CUresult,
    CUstream, CUstreamCaptureMode, CUstreamCaptureStatus, Driver,
};
use std::ffi::c_void;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// Captures and the gate are process-wide state: one test at a time.
static SERIAL: Mutex<()> = Mutex::new(());

static IMAGE: [u8; 16] = *b"device-node-test";

/// Holds `hold`'s twin until opened.
static GATE: AtomicBool = AtomicBool::new(true);

/// Twin of `fill_u32(u64 n, u32 value, u32* out)`: `out[0..n] = value`.
///
/// # Safety
/// `params` holds the three registered arguments.
unsafe fn fill_u32(_: &soft::LaunchDims, params: *mut *mut c_void) {
    // SAFETY: the driver passes copies of the registered arguments and
    // checked that `out` holds `n` words.
    unsafe {
        let n = *(*params.add(0)).cast::<u64>();
        let value = *(*params.add(1)).cast::<u32>();
        let out = *(*params.add(2)).cast::<*mut u32>();
        for i in 0..n as usize {
            *out.add(i) = value;
        }
    }
}

/// Twin of `update(u64 node, u32 value)`: sets `fill_u32`'s `value`
/// (offset 8) through the device node handle, as a CUDA kernel calls
/// `cudaGraphKernelNodeSetParam`.
///
/// # Safety
/// `params` holds the two registered arguments.
unsafe fn update(_: &soft::LaunchDims, params: *mut *mut c_void) {
    // SAFETY: the driver passes copies of the registered arguments.
    let (node, value) = unsafe {
        (
            *(*params.add(0)).cast::<u64>(),
            *(*params.add(1)).cast::<u32>(),
        )
    };
    soft::set_kernel_node_param(node, 8, &value.to_ne_bytes());
}

/// Twin of `hold()`: waits until the test opens [`GATE`].
unsafe fn hold(_: &soft::LaunchDims, _: *mut *mut c_void) {
    while !GATE.load(Ordering::Acquire) {
        std::thread::yield_now();
    }
}

const FILL_U32: &[Param] = &[
    Param::Scalar(Scalar::U64),
    Param::Scalar(Scalar::U32),
    Param::Pointer {
        elem: Scalar::U32,
        access: Access::Write,
        extent: Extent::Arg(0),
    },
];
const UPDATE: &[Param] = &[Param::Scalar(Scalar::U64), Param::Scalar(Scalar::U32)];

/// Words of the output buffer.
const WORDS: usize = 4;

fn ok(code: CUresult) {
    assert_eq!(
        code,
        CUresult::CUDA_SUCCESS,
        "{:?}",
        soft::last_error_detail()
    );
}

/// `code`, with the driver's detail, which must contain `needle`.
fn refused(code: CUresult, expected: CUresult, needle: &str) {
    let detail = soft::last_error_detail().unwrap_or_default();
    assert_eq!(code, expected, "{detail}");
    assert!(detail.contains(needle), "{needle:?} not in {detail:?}");
}

/// The message `f` panics with.
fn panic_message(f: impl FnOnce() + std::panic::UnwindSafe) -> String {
    let panic = std::panic::catch_unwind(f).expect_err("it must panic");
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

struct Setup {
    table: &'static Driver,
    stream: CUstream,
    fill: CUfunction,
    update: CUfunction,
    hold: CUfunction,
    out: CUdeviceptr,
}

fn setup(device: i32) -> Setup {
    let table = soft::driver();
    // SAFETY: the twins match their registered parameters and touch only
    // their checked pointer arguments.
    unsafe {
        soft::register_image(
            &IMAGE,
            &[
                soft::TwinSpec {
                    name: "fill_u32",
                    params: FILL_U32,
                    run: fill_u32,
                },
                soft::TwinSpec {
                    name: "update",
                    params: UPDATE,
                    run: update,
                },
                soft::TwinSpec {
                    name: "hold",
                    params: &[],
                    run: hold,
                },
            ],
        )
    }
    .unwrap();
    let (mut dev, mut ctx, mut stream, mut module) = (
        0,
        std::ptr::null_mut(),
        std::ptr::null_mut(),
        std::ptr::null_mut(),
    );
    let mut functions = [std::ptr::null_mut(); 3];
    let mut out = 0;
    // SAFETY: valid out-pointers; the image was registered above.
    unsafe {
        ok((table.cuInit)(0));
        ok((table.cuDeviceGet)(&mut dev, device));
        ok((table.cuDevicePrimaryCtxRetain)(&mut ctx, dev));
        ok((table.cuCtxSetCurrent)(ctx));
        ok((table.cuStreamCreateWithPriority)(&mut stream, 1, 0));
        ok((table.cuModuleLoadData)(&mut module, IMAGE.as_ptr().cast()));
        for (f, name) in functions.iter_mut().zip([c"fill_u32", c"update", c"hold"]) {
            ok((table.cuModuleGetFunction)(f, module, name.as_ptr()));
        }
        ok((table.cuMemAlloc)(&mut out, WORDS * 4));
    }
    let [fill, update, hold] = functions;
    Setup {
        table,
        stream,
        fill,
        update,
        hold,
        out,
    }
}

fn device_updatable(value: i32) -> CUlaunchAttribute {
    let mut attr = CUlaunchAttribute {
        id: CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE,
        ..Default::default()
    };
    attr.value.deviceUpdatableKernelNode.deviceUpdatable = value;
    attr
}

impl Setup {
    /// `cuLaunchKernelEx` of `f` on `stream` with `attrs`.
    fn launch_ex(
        &self,
        f: CUfunction,
        args: &mut [*mut c_void],
        attrs: &mut [CUlaunchAttribute],
        stream: CUstream,
    ) -> CUresult {
        let config = CUlaunchConfig {
            gridDimX: 1,
            gridDimY: 1,
            gridDimZ: 1,
            blockDimX: 1,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: 0,
            hStream: stream,
            attrs: attrs.as_mut_ptr(),
            numAttrs: attrs.len() as u32,
        };
        // SAFETY: `args` point at live arguments of the kernel's types.
        unsafe {
            (self.table.cuLaunchKernelEx)(&config, f, args.as_mut_ptr(), std::ptr::null_mut())
        }
    }

    /// Launch `fill_u32(WORDS, value, out)` on `stream` with `attrs`.
    fn fill(&self, value: u32, attrs: &mut [CUlaunchAttribute], stream: CUstream) -> CUresult {
        let (mut n, mut value, mut out) = (WORDS as u64, value, self.out);
        let mut args = [
            (&raw mut n).cast(),
            (&raw mut value).cast(),
            (&raw mut out).cast(),
        ];
        self.launch_ex(self.fill, &mut args, attrs, stream)
    }

    /// Capture a memset of the buffer to 0 (a node of another kind), then
    /// `fill_u32(WORDS, value, out)`, device-updatable or not; returns the
    /// graph, the kernel node and the memset node.
    fn capture_fill(&self, value: u32, updatable: bool) -> (CUgraph, CUgraphNode, CUgraphNode) {
        let t = self.table;
        // SAFETY: a live stream; `out` holds WORDS words.
        unsafe {
            ok((t.cuStreamBeginCapture)(
                self.stream,
                CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
            ));
            ok((t.cuMemsetD32Async)(self.out, 0, WORDS, self.stream));
        }
        let memset = self.frontier();
        let mut attrs = [device_updatable(1)];
        let attrs: &mut [CUlaunchAttribute] = if updatable { &mut attrs } else { &mut [] };
        ok(self.fill(value, attrs, self.stream));
        let kernel = self.frontier();
        let mut graph = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        ok(unsafe { (t.cuStreamEndCapture)(self.stream, &mut graph) });
        (graph, kernel, memset)
    }

    /// The capturing stream's one frontier node.
    fn frontier(&self) -> CUgraphNode {
        let mut status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        let (mut deps, mut count) = (std::ptr::null(), 0usize);
        // SAFETY: valid out-pointers.
        ok(unsafe {
            (self.table.cuStreamGetCaptureInfo)(
                self.stream,
                &mut status,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                &mut deps,
                std::ptr::null_mut(),
                &mut count,
            )
        });
        assert_eq!(count, 1);
        // SAFETY: the driver's array of `count` nodes.
        unsafe { *deps }
    }

    /// The node's device-updatable attribute: (deviceUpdatable, devNode).
    fn attribute(&self, node: CUgraphNode) -> Result<(i32, u64), CUresult> {
        let mut value = CUkernelNodeAttrValue::default();
        // SAFETY: valid out-pointer.
        let code = unsafe {
            (self.table.cuGraphKernelNodeGetAttribute)(
                node,
                CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE,
                &mut value,
            )
        };
        if code != CUresult::CUDA_SUCCESS {
            return Err(code);
        }
        // SAFETY: the attribute asked says which member the driver set.
        let set = unsafe { value.deviceUpdatableKernelNode };
        Ok((set.deviceUpdatable, set.devNode as u64))
    }

    fn instantiate(&self, graph: CUgraph) -> Result<CUgraphExec, CUresult> {
        let mut exec = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        let code = unsafe { (self.table.cuGraphInstantiate)(&mut exec, graph, 0) };
        if code == CUresult::CUDA_SUCCESS {
            Ok(exec)
        } else {
            Err(code)
        }
    }

    /// Clear the buffer, launch `exec` and read the buffer back.
    fn run(&self, exec: CUgraphExec) -> Vec<u32> {
        // SAFETY: `out` holds WORDS words; a live executable graph.
        unsafe {
            ok((self.table.cuMemsetD32Async)(
                self.out,
                0,
                WORDS,
                self.stream,
            ));
            ok((self.table.cuGraphLaunch)(exec, self.stream));
        }
        self.read()
    }

    fn read(&self) -> Vec<u32> {
        let mut out = vec![0u32; WORDS];
        // SAFETY: WORDS words each side; synchronised next.
        unsafe {
            ok((self.table.cuMemcpyDtoHAsync)(
                out.as_mut_ptr().cast(),
                self.out,
                WORDS * 4,
                self.stream,
            ));
            ok((self.table.cuStreamSynchronize)(self.stream));
        }
        out
    }

    /// Launch `update(node, value)` on the stream (an update made when the
    /// stream gets to it: a graph launch enqueued before then keeps the
    /// arguments it was enqueued with).
    fn enqueue_update(&self, node: u64, value: u32) {
        let (mut node, mut value) = (node, value);
        let mut args = [(&raw mut node).cast(), (&raw mut value).cast()];
        ok(self.launch_ex(self.update, &mut args, &mut [], self.stream));
    }
}

#[test]
fn a_device_node_update_reaches_the_executable_graphs_later_launches() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let s = setup(0);
    let t = s.table;
    let (graph, kernel, memset) = s.capture_fill(3, true);
    let (updatable, node) = s.attribute(kernel).unwrap();
    assert_eq!(updatable, 1);
    assert_ne!(node, 0, "a device-updatable node has a device node handle");
    // Not instantiated yet: nowhere to write.
    let why = panic_message(|| soft::set_kernel_node_param(node, 8, &7u32.to_ne_bytes()));
    assert!(why.contains("has not been instantiated"), "{why}");

    let exec = s.instantiate(graph).unwrap();
    assert_eq!(s.run(exec), [3; WORDS]);
    // From the host thread: `value` is at offset 8 (after the u64 `n`).
    soft::set_kernel_node_param(node, 8, &7u32.to_ne_bytes());
    assert_eq!(s.run(exec), [7; WORDS]);
    // From a twin on a stream, as a kernel does it.
    s.enqueue_update(node, 9);
    // SAFETY: a live stream.
    ok(unsafe { (t.cuStreamSynchronize)(s.stream) });
    assert_eq!(s.run(exec), [9; WORDS]);
    // Part of a parameter: the low 4 bytes of the u64 `n`.
    soft::set_kernel_node_param(node, 0, &2u32.to_ne_bytes());
    assert_eq!(s.run(exec), [9, 9, 0, 0]);
    soft::set_kernel_node_param(node, 0, &(WORDS as u32).to_ne_bytes());

    // A launch enqueued before the update ran still takes it, as on a GPU,
    // where a node's parameters are read when it runs: `hold` keeps the
    // stream from running the update until the graph is launched.
    GATE.store(false, Ordering::Release);
    ok(s.launch_ex(s.hold, &mut [], &mut [], s.stream));
    // SAFETY: `out` holds WORDS words.
    ok(unsafe { (t.cuMemsetD32Async)(s.out, 0, WORDS, s.stream) });
    s.enqueue_update(node, 11);
    // SAFETY: a live executable graph.
    ok(unsafe { (t.cuGraphLaunch)(exec, s.stream) });
    GATE.store(true, Ordering::Release);
    assert_eq!(s.read(), [11; WORDS], "launched before the update ran");
    assert_eq!(s.run(exec), [11; WORDS], "launched after it");

    // The graph's node still answers; the memset is no kernel node.
    assert_eq!(s.attribute(kernel), Ok((1, node)));
    refused(
        s.attribute(memset).unwrap_err(),
        CUresult::CUDA_ERROR_INVALID_VALUE,
        "is not a kernel node",
    );
    let mut value = CUkernelNodeAttrValue::default();
    // SAFETY: valid out-pointer.
    let code = unsafe {
        (t.cuGraphKernelNodeGetAttribute)(
            kernel,
            CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_COOPERATIVE,
            &mut value,
        )
    };
    let cooperative = CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_COOPERATIVE.0;
    refused(
        code,
        CUresult::CUDA_ERROR_NOT_SUPPORTED,
        &format!("not attribute {cooperative}"),
    );

    // Once destroyed, the executable graph takes no more updates.
    // SAFETY: live handles, destroyed once.
    unsafe {
        ok((t.cuGraphExecDestroy)(exec));
    }
    let why = panic_message(|| soft::set_kernel_node_param(node, 8, &7u32.to_ne_bytes()));
    assert!(why.contains("was destroyed"), "{why}");
    // SAFETY: as above.
    unsafe { ok((t.cuGraphDestroy)(graph)) };
}

#[test]
fn an_ordinary_kernel_node_has_no_device_node() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let s = setup(0);
    let (graph, kernel, _) = s.capture_fill(3, false);
    assert_eq!(s.attribute(kernel), Ok((0, 0)));
    // And deviceUpdatable 0 is accepted, and makes no device node either.
    // SAFETY: a live stream.
    ok(unsafe {
        (s.table.cuStreamBeginCapture)(
            s.stream,
            CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
        )
    });
    ok(s.fill(5, &mut [device_updatable(0)], s.stream));
    let zero = s.frontier();
    let mut other = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    ok(unsafe { (s.table.cuStreamEndCapture)(s.stream, &mut other) });
    assert_eq!(s.attribute(zero), Ok((0, 0)));
    // Node handles name their graph: the two graphs' first nodes differ.
    assert_ne!(zero, kernel);
    // Such a graph is instantiated as often as wanted.
    let (a, b) = (s.instantiate(graph).unwrap(), s.instantiate(graph).unwrap());
    assert_eq!(s.run(b), [3; WORDS]);
    // SAFETY: live handles, destroyed once.
    unsafe {
        for exec in [a, b] {
            ok((s.table.cuGraphExecDestroy)(exec));
        }
        ok((s.table.cuGraphDestroy)(graph));
        ok((s.table.cuGraphDestroy)(other));
    }
}

#[test]
fn the_attribute_is_graphs_only_and_zero_or_one() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let s = setup(0);
    refused(
        s.fill(1, &mut [device_updatable(1)], s.stream),
        CUresult::CUDA_ERROR_INVALID_VALUE,
        "graphs-only",
    );
    refused(
        s.fill(1, &mut [device_updatable(2)], s.stream),
        CUresult::CUDA_ERROR_INVALID_VALUE,
        "deviceUpdatable 2",
    );
    // Beside programmatic serialization, in a capture: accepted.
    let mut programmatic = CUlaunchAttribute {
        id: CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
        ..Default::default()
    };
    programmatic.value.programmaticStreamSerializationAllowed = 1;
    // SAFETY: a live stream.
    ok(unsafe {
        (s.table.cuStreamBeginCapture)(
            s.stream,
            CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
        )
    });
    ok(s.fill(1, &mut [programmatic, device_updatable(1)], s.stream));
    let node = s.frontier();
    let mut graph = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    ok(unsafe { (s.table.cuStreamEndCapture)(s.stream, &mut graph) });
    assert_eq!(s.attribute(node).map(|(updatable, _)| updatable), Ok(1));
    assert_eq!(s.read(), [0; WORDS], "a captured launch does not run");
    // SAFETY: a live graph, destroyed once.
    unsafe { ok((s.table.cuGraphDestroy)(graph)) };
}

#[test]
fn a_graph_with_device_nodes_is_instantiated_once_and_never_updated() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let s = setup(0);
    let t = s.table;
    let (graph, _, _) = s.capture_fill(3, true);
    let (plain, _, _) = s.capture_fill(3, false);
    let exec = s.instantiate(graph).unwrap();
    refused(
        s.instantiate(graph).unwrap_err(),
        CUresult::CUDA_ERROR_INVALID_VALUE,
        "may be instantiated only once",
    );
    let plain_exec = s.instantiate(plain).unwrap();
    let mut info = CUgraphExecUpdateResultInfo::default();
    for (exec, graph, side) in [
        (exec, graph, "the graph holds"),
        (exec, plain, "the executable graph holds"),
        (plain_exec, graph, "the graph holds"),
    ] {
        // SAFETY: live handles, valid out-pointer.
        let code = unsafe { (t.cuGraphExecUpdate)(exec, graph, &mut info) };
        refused(code, CUresult::CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE, side);
    }
    // Still refused once the first executable graph is gone.
    // SAFETY: a live executable graph, destroyed once.
    unsafe { ok((t.cuGraphExecDestroy)(exec)) };
    refused(
        s.instantiate(graph).unwrap_err(),
        CUresult::CUDA_ERROR_INVALID_VALUE,
        "may be instantiated only once",
    );
    // SAFETY: live handles, destroyed once.
    unsafe {
        ok((t.cuGraphExecDestroy)(plain_exec));
        ok((t.cuGraphDestroy)(graph));
        ok((t.cuGraphDestroy)(plain));
    }
}

#[test]
fn a_bad_update_panics_naming_what_is_wrong() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let s = setup(0);
    let (graph, kernel, _) = s.capture_fill(3, true);
    let (_, node) = s.attribute(kernel).unwrap();
    let exec = s.instantiate(graph).unwrap();
    let word = 7u32.to_ne_bytes();
    // fill_u32's buffer: n at 0..8, value at 8..12, padding, out at 16..24.
    for (token, offset, value, expected) in [
        (0x1234, 8, &word[..], "0x1234 is not a device node handle"),
        (node + 16, 8, &word, "is not a device node handle"),
        (
            node,
            6,
            &word,
            "4 bytes at offset 6 run past the end of parameter 0",
        ),
        (node, 10, &word, "run past the end of parameter 1"),
        (node, 12, &word, "offset 12 falls in the padding"),
        (
            node,
            24,
            &word,
            "offset 24 is past the end of the parameter buffer",
        ),
        (node, usize::MAX, &word, "past the end"),
        (node, 8, &[], "an empty value"),
    ] {
        let why = panic_message(|| soft::set_kernel_node_param(token, offset, value));
        assert!(why.contains(expected), "{expected:?} not in {why:?}");
        assert!(why.contains("cudaGraphKernelNodeSetParam"), "{why}");
    }
    assert_eq!(s.run(exec), [3; WORDS], "a refused update changes nothing");
    // The pointer itself may be set (the launch checks it, as memcheck).
    soft::set_kernel_node_param(node, 16, &s.out.to_ne_bytes());
    assert_eq!(s.run(exec), [3; WORDS]);
    // SAFETY: live handles, destroyed once.
    unsafe {
        ok((s.table.cuGraphExecDestroy)(exec));
        ok((s.table.cuGraphDestroy)(graph));
    }
}

/// On device 1, alone: the failed launch leaves that device's context with
/// a sticky error, as on a GPU.
#[test]
fn a_bad_update_from_a_twin_fails_its_launch() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let s = setup(1);
    s.enqueue_update(0x1234, 1);
    // SAFETY: a live stream.
    let code = unsafe { (s.table.cuStreamSynchronize)(s.stream) };
    refused(
        code,
        CUresult::CUDA_ERROR_LAUNCH_FAILED,
        "0x1234 is not a device node handle (cudaGraphKernelNodeSetParam)",
    );
}
