//! Conditional nodes through the raw table: WHILE loops, IF-ELSE, defaults
//! assigned at each launch, and the refusals (a handle of another graph, a
//! host function in a body).

use cuda_streams_soft_driver as soft;
use soft::sys::signature::{Access, Extent, Param, Scalar};
use soft::sys::{
    CU_GRAPH_COND_ASSIGN_DEFAULT, CUDA_CONDITIONAL_NODE_PARAMS, CUdeviceptr, CUgraph,
    CUgraphConditionalHandle, CUgraphConditionalNodeType, CUgraphNode, CUgraphNodeParams,
    CUgraphNodeType, CUresult, CUstream, CUstreamCaptureMode, CUstreamCaptureStatus,
    CUstreamUpdateCaptureDependencies_flags, Driver,
};
use std::ffi::c_void;
use std::sync::Mutex;

/// Captures are process-wide state: one test at a time.
static SERIAL: Mutex<()> = Mutex::new(());

static IMAGE: [u8; 16] = *b"conditional-test";

/// Twin of `count_down(unsigned* counter, unsigned* data, unsigned n,
/// cudaGraphConditionalHandle h)`: `data[0..n] += 1`, `counter[0] -= 1`, and
/// the condition is whether the counter is still above zero.
///
/// # Safety
/// `params` holds the four registered arguments.
unsafe fn count_down(_: &soft::LaunchDims, params: *mut *mut c_void) {
    // SAFETY: the driver passes copies of the registered arguments, whose
    // pointers it checked (one counter, n data words).
    unsafe {
        let counter = *(*params.add(0)).cast::<*mut u32>();
        let data = *(*params.add(1)).cast::<*mut u32>();
        let n = *(*params.add(2)).cast::<u32>();
        let handle = *(*params.add(3)).cast::<u64>();
        for i in 0..n as usize {
            *data.add(i) += 1;
        }
        *counter = (*counter).saturating_sub(1);
        soft::set_conditional(handle, u32::from(*counter > 0));
    }
}

/// Twin of `add(unsigned* data, unsigned n, unsigned value)`.
///
/// # Safety
/// `params` holds the three registered arguments.
unsafe fn add(_: &soft::LaunchDims, params: *mut *mut c_void) {
    // SAFETY: as for `count_down`.
    unsafe {
        let data = *(*params.add(0)).cast::<*mut u32>();
        let n = *(*params.add(1)).cast::<u32>();
        let value = *(*params.add(2)).cast::<u32>();
        for i in 0..n as usize {
            *data.add(i) += value;
        }
    }
}

const COUNT_DOWN: &[Param] = &[
    Param::Pointer {
        elem: Scalar::U32,
        access: Access::Write,
        extent: Extent::Elements(1),
    },
    Param::Pointer {
        elem: Scalar::U32,
        access: Access::Write,
        extent: Extent::Arg(2),
    },
    Param::Scalar(Scalar::U32),
    Param::Scalar(Scalar::U64),
];
const ADD: &[Param] = &[
    Param::Pointer {
        elem: Scalar::U32,
        access: Access::Write,
        extent: Extent::Arg(1),
    },
    Param::Scalar(Scalar::U32),
    Param::Scalar(Scalar::U32),
];

fn ok(code: CUresult) {
    assert_eq!(
        code,
        CUresult::CUDA_SUCCESS,
        "{:?}",
        soft::last_error_detail()
    );
}

struct Setup {
    table: &'static Driver,
    stream: CUstream,
    count_down: soft::sys::CUfunction,
    add: soft::sys::CUfunction,
}

fn setup() -> Setup {
    let table = soft::driver();
    // SAFETY: both twins match their registered parameters and touch only
    // their checked pointer arguments.
    unsafe {
        soft::register_image(
            &IMAGE,
            &[
                soft::TwinSpec {
                    name: "count_down",
                    params: COUNT_DOWN,
                    run: count_down,
                },
                soft::TwinSpec {
                    name: "add",
                    params: ADD,
                    run: add,
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
    let (mut f1, mut f2) = (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: valid out-pointers; the image was registered above.
    unsafe {
        ok((table.cuInit)(0));
        ok((table.cuDeviceGet)(&mut dev, 0));
        ok((table.cuDevicePrimaryCtxRetain)(&mut ctx, dev));
        ok((table.cuCtxSetCurrent)(ctx));
        ok((table.cuStreamCreateWithPriority)(&mut stream, 1, 0));
        ok((table.cuModuleLoadData)(&mut module, IMAGE.as_ptr().cast()));
        ok((table.cuModuleGetFunction)(
            &mut f1,
            module,
            c"count_down".as_ptr(),
        ));
        ok((table.cuModuleGetFunction)(
            &mut f2,
            module,
            c"add".as_ptr(),
        ));
    }
    Setup {
        table,
        stream,
        count_down: f1,
        add: f2,
    }
}

impl Setup {
    fn alloc(&self, words: usize) -> CUdeviceptr {
        let mut ptr = 0;
        // SAFETY: valid out-pointer.
        ok(unsafe { (self.table.cuMemAlloc)(&mut ptr, words * 4) });
        // SAFETY: `ptr` holds `words` words.
        ok(unsafe { (self.table.cuMemsetD32Async)(ptr, 0, words, self.stream) });
        ptr
    }

    fn set(&self, ptr: CUdeviceptr, value: u32, words: usize) {
        // SAFETY: `ptr` holds `words` words.
        ok(unsafe { (self.table.cuMemsetD32Async)(ptr, value, words, self.stream) });
    }

    fn read(&self, ptr: CUdeviceptr, words: usize) -> Vec<u32> {
        let mut out = vec![0u32; words];
        // SAFETY: `words` words each side; synchronised next.
        unsafe {
            ok((self.table.cuMemcpyDtoHAsync)(
                out.as_mut_ptr().cast(),
                ptr,
                words * 4,
                self.stream,
            ));
            ok((self.table.cuStreamSynchronize)(self.stream));
        }
        out
    }

    fn launch(&self, f: soft::sys::CUfunction, args: &mut [*mut c_void], stream: CUstream) {
        // SAFETY: `args` point at live arguments of the kernel's types.
        ok(unsafe {
            (self.table.cuLaunchKernel)(
                f,
                1,
                1,
                1,
                1,
                1,
                1,
                0,
                stream,
                args.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        });
    }

    /// Add a conditional node to `graph` after `deps`; returns the node and
    /// its bodies.
    fn add_conditional(
        &self,
        graph: CUgraph,
        deps: &[CUgraphNode],
        handle: CUgraphConditionalHandle,
        kind: CUgraphConditionalNodeType,
        size: u32,
    ) -> Result<(CUgraphNode, Vec<CUgraph>), CUresult> {
        let mut params = CUgraphNodeParams {
            type_: CUgraphNodeType::CU_GRAPH_NODE_TYPE_CONDITIONAL,
            ..Default::default()
        };
        params.__bindgen_anon_1.conditional = CUDA_CONDITIONAL_NODE_PARAMS {
            handle,
            type_: kind,
            size,
            ..Default::default()
        };
        let mut node = std::ptr::null_mut();
        // SAFETY: valid parameters and out-pointer; `deps` are its nodes.
        let code = unsafe {
            (self.table.cuGraphAddNode)(
                &mut node,
                graph,
                deps.as_ptr(),
                std::ptr::null(),
                deps.len(),
                &mut params,
            )
        };
        if code != CUresult::CUDA_SUCCESS {
            return Err(code);
        }
        // SAFETY: the driver filled `size` body handles.
        let bodies = unsafe {
            std::slice::from_raw_parts(
                params.__bindgen_anon_1.conditional.phGraph_out,
                size as usize,
            )
        };
        Ok((node, bodies.to_vec()))
    }

    /// Capture `work` on a side stream into `body`.
    fn capture_into(&self, body: CUgraph, work: impl FnOnce(CUstream)) {
        let mut side = std::ptr::null_mut();
        let mut out = std::ptr::null_mut();
        // SAFETY: valid out-pointers, a live graph.
        unsafe {
            ok((self.table.cuStreamCreateWithPriority)(&mut side, 1, 0));
            ok((self.table.cuStreamBeginCaptureToGraph)(
                side,
                body,
                std::ptr::null(),
                std::ptr::null(),
                0,
                CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
            ));
        }
        work(side);
        // SAFETY: as above.
        unsafe {
            ok((self.table.cuStreamEndCapture)(side, &mut out));
            ok((self.table.cuStreamDestroy)(side));
        }
        assert_eq!(out, body, "capture to a graph ends in that graph");
    }
}

#[test]
fn a_while_node_loops_until_the_kernel_clears_its_condition() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let s = setup();
    let t = s.table;
    let n = 8u32;
    let counter = s.alloc(1);
    let data = s.alloc(n as usize);

    // The outer graph is captured: set the counter, then the WHILE node is
    // put into the capture (as PyTorch does), then `add` 100 after it.
    let mut graph = std::ptr::null_mut();
    // SAFETY: a live stream.
    ok(unsafe {
        (t.cuStreamBeginCapture)(
            s.stream,
            CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
        )
    });
    s.set(counter, 5, 1);
    let (mut status, mut id, mut captured) = (
        CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE,
        0,
        std::ptr::null_mut(),
    );
    let (mut deps, mut count) = (std::ptr::null(), 0usize);
    // SAFETY: valid out-pointers.
    ok(unsafe {
        (t.cuStreamGetCaptureInfo)(
            s.stream,
            &mut status,
            &mut id,
            &mut captured,
            &mut deps,
            std::ptr::null_mut(),
            &mut count,
        )
    });
    assert_eq!(
        status,
        CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE
    );
    assert_eq!(count, 1, "the memset is the frontier");
    // SAFETY: the driver's array of `count` nodes.
    let deps = unsafe { std::slice::from_raw_parts(deps, count) }.to_vec();
    let mut handle = 0;
    // SAFETY: a graph under capture; valid out-pointer.
    ok(unsafe {
        (t.cuGraphConditionalHandleCreate)(
            &mut handle,
            captured,
            std::ptr::null_mut(),
            1,
            CU_GRAPH_COND_ASSIGN_DEFAULT,
        )
    });
    let (mut node, bodies) = s
        .add_conditional(
            captured,
            &deps,
            handle,
            CUgraphConditionalNodeType::CU_GRAPH_COND_TYPE_WHILE,
            1,
        )
        .unwrap();
    // SAFETY: one node of the captured graph.
    ok(unsafe {
        (t.cuStreamUpdateCaptureDependencies)(
            s.stream,
            &mut node,
            std::ptr::null(),
            1,
            CUstreamUpdateCaptureDependencies_flags::CU_STREAM_SET_CAPTURE_DEPENDENCIES.0,
        )
    });
    s.capture_into(bodies[0], |side| {
        let (mut c, mut d, mut n, mut h) = (counter, data, n, handle);
        s.launch(
            s.count_down,
            &mut [
                (&raw mut c).cast(),
                (&raw mut d).cast(),
                (&raw mut n).cast(),
                (&raw mut h).cast(),
            ],
            side,
        );
    });
    let (mut d, mut nn, mut v) = (data, n, 100u32);
    s.launch(
        s.add,
        &mut [
            (&raw mut d).cast(),
            (&raw mut nn).cast(),
            (&raw mut v).cast(),
        ],
        s.stream,
    );
    // SAFETY: valid out-pointer.
    ok(unsafe { (t.cuStreamEndCapture)(s.stream, &mut graph) });
    assert_eq!(graph, captured, "the graph the capture info named");
    assert_eq!(
        s.read(data, n as usize),
        vec![0; n as usize],
        "captured work did not run"
    );

    let mut exec = std::ptr::null_mut();
    // SAFETY: valid out-pointer and graph.
    ok(unsafe { (t.cuGraphInstantiate)(&mut exec, graph, 0) });
    // SAFETY: an instantiated graph, a live stream.
    ok(unsafe { (t.cuGraphLaunch)(exec, s.stream) });
    assert_eq!(
        s.read(data, n as usize),
        vec![105; n as usize],
        "five turns, then add 100"
    );
    assert_eq!(s.read(counter, 1), vec![0]);
    // The handle took its default (1) again at the next launch, so the loop
    // runs again, five more turns.
    // SAFETY: an instantiated graph, a live stream.
    ok(unsafe { (t.cuGraphLaunch)(exec, s.stream) });
    assert_eq!(s.read(data, n as usize), vec![210; n as usize]);
    // SAFETY: destroyed once each.
    unsafe {
        ok((t.cuGraphExecDestroy)(exec));
        ok((t.cuGraphDestroy)(graph));
        assert_eq!(
            (t.cuGraphDestroy)(bodies[0]),
            CUresult::CUDA_ERROR_INVALID_HANDLE,
            "bodies go with their graph"
        );
    }
}

#[test]
fn an_if_else_node_runs_the_body_the_condition_picks() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let s = setup();
    let t = s.table;
    let n = 4u32;
    let data = s.alloc(n as usize);
    for (default, wanted) in [(1, 7), (0, 30)] {
        s.set(data, 0, n as usize);
        let mut graph = std::ptr::null_mut();
        let mut handle = 0;
        // SAFETY: valid out-pointers.
        unsafe {
            ok((t.cuGraphCreate)(&mut graph, 0));
            ok((t.cuGraphConditionalHandleCreate)(
                &mut handle,
                graph,
                std::ptr::null_mut(),
                default,
                CU_GRAPH_COND_ASSIGN_DEFAULT,
            ));
        }
        let (_, bodies) = s
            .add_conditional(
                graph,
                &[],
                handle,
                CUgraphConditionalNodeType::CU_GRAPH_COND_TYPE_IF,
                2,
            )
            .unwrap();
        for (body, value) in bodies.iter().zip([7u32, 30]) {
            s.capture_into(*body, |side| {
                let (mut d, mut nn, mut v) = (data, n, value);
                s.launch(
                    s.add,
                    &mut [
                        (&raw mut d).cast(),
                        (&raw mut nn).cast(),
                        (&raw mut v).cast(),
                    ],
                    side,
                );
            });
        }
        let mut exec = std::ptr::null_mut();
        // SAFETY: valid out-pointer and graph.
        unsafe {
            ok((t.cuGraphInstantiate)(&mut exec, graph, 0));
            ok((t.cuGraphLaunch)(exec, s.stream));
        }
        assert_eq!(
            s.read(data, n as usize),
            vec![wanted; n as usize],
            "condition {default}"
        );
        // SAFETY: destroyed once each.
        unsafe {
            ok((t.cuGraphExecDestroy)(exec));
            ok((t.cuGraphDestroy)(graph));
        }
    }
}

#[test]
fn a_handle_of_another_graph_and_a_host_function_in_a_body_are_refused() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let s = setup();
    let t = s.table;
    let (mut g1, mut g2, mut handle) = (std::ptr::null_mut(), std::ptr::null_mut(), 0);
    // SAFETY: valid out-pointers.
    unsafe {
        ok((t.cuGraphCreate)(&mut g1, 0));
        ok((t.cuGraphCreate)(&mut g2, 0));
        ok((t.cuGraphConditionalHandleCreate)(
            &mut handle,
            g1,
            std::ptr::null_mut(),
            0,
            0,
        ));
    }
    let refused = s.add_conditional(
        g2,
        &[],
        handle,
        CUgraphConditionalNodeType::CU_GRAPH_COND_TYPE_WHILE,
        1,
    );
    assert_eq!(refused.unwrap_err(), CUresult::CUDA_ERROR_INVALID_VALUE);
    let detail = soft::last_error_detail().unwrap();
    assert!(
        detail.contains(&format!("condition handle {handle:#x} belongs to graph")),
        "{detail}"
    );

    let (_, bodies) = s
        .add_conditional(
            g1,
            &[],
            handle,
            CUgraphConditionalNodeType::CU_GRAPH_COND_TYPE_WHILE,
            1,
        )
        .unwrap();
    unsafe extern "C" fn nothing(_: *mut c_void) {}
    s.capture_into(bodies[0], |side| {
        // SAFETY: `nothing` touches nothing.
        ok(unsafe { (t.cuLaunchHostFunc)(side, Some(nothing), std::ptr::null_mut()) });
    });
    let mut exec = std::ptr::null_mut();
    // SAFETY: valid out-pointer and graph.
    let code = unsafe { (t.cuGraphInstantiate)(&mut exec, g1, 0) };
    assert_eq!(code, CUresult::CUDA_ERROR_NOT_SUPPORTED);
    let detail = soft::last_error_detail().unwrap();
    assert!(
        detail.contains("holds a host function (its node 0)"),
        "{detail}"
    );
    // SAFETY: destroyed once each.
    unsafe {
        ok((t.cuGraphDestroy)(g1));
        ok((t.cuGraphDestroy)(g2));
    }
}

/// A GPU driver refuses to instantiate a graph where one condition handle
/// serves two conditional nodes (`CUDA_ERROR_INVALID_VALUE`): siblings, or
/// a node and one in its body.
#[test]
fn a_handle_serving_two_conditional_nodes_is_refused_at_instantiation() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let s = setup();
    let t = s.table;
    let while_ = CUgraphConditionalNodeType::CU_GRAPH_COND_TYPE_WHILE;
    let if_ = CUgraphConditionalNodeType::CU_GRAPH_COND_TYPE_IF;
    for nested in [false, true] {
        let (mut graph, mut handle) = (std::ptr::null_mut(), 0);
        // SAFETY: valid out-pointers.
        unsafe {
            ok((t.cuGraphCreate)(&mut graph, 0));
            ok((t.cuGraphConditionalHandleCreate)(
                &mut handle,
                graph,
                std::ptr::null_mut(),
                0,
                CU_GRAPH_COND_ASSIGN_DEFAULT,
            ));
        }
        let (first, bodies) = s.add_conditional(graph, &[], handle, while_, 1).unwrap();
        // Adding is allowed (as on a GPU); instantiating is not.
        if nested {
            s.add_conditional(bodies[0], &[], handle, if_, 1).unwrap();
        } else {
            s.add_conditional(graph, &[first], handle, if_, 1).unwrap();
        }
        let mut exec = std::ptr::null_mut();
        // SAFETY: valid out-pointer and graph.
        let code = unsafe { (t.cuGraphInstantiate)(&mut exec, graph, 0) };
        assert_eq!(code, CUresult::CUDA_ERROR_INVALID_VALUE, "nested {nested}");
        let detail = soft::last_error_detail().unwrap();
        assert!(
            detail.contains(&format!(
                "condition handle {handle:#x} serves two conditional nodes"
            )),
            "{detail}"
        );
        // SAFETY: destroyed once.
        ok(unsafe { (t.cuGraphDestroy)(graph) });
    }
}
