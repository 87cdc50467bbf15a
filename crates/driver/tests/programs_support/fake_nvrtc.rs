//! A fake NVRTC table that records every call, for the compile-error and
//! cache tests of `programs.rs` (which include it as its `fake` module).

use super::*;
use cuda_streams_driver::sys::nvrtc::bindings::{nvrtcProgram, nvrtcResult};
use std::cell::RefCell;
use std::ffi::{CStr, CString, c_char, c_int};

thread_local! {
    /// The NVRTC entry points this thread called, in order. Each test
    /// compiles on its own thread, so the tests do not see each other.
    static CALLS: RefCell<Vec<&'static str>> = const { RefCell::new(Vec::new()) };
}

fn record(call: &'static str) {
    CALLS.with(|calls| calls.borrow_mut().push(call));
}

pub(super) fn calls() -> Vec<&'static str> {
    CALLS.with(|calls| calls.borrow().clone())
}

/// What the fake keeps per program.
struct FakeProgram {
    source: String,
    log: CString,
    image: Vec<u8>,
    expressions: Vec<CString>,
}

pub(super) const ARCHS: [c_int; 3] = [75, 80, 90];
pub(super) const SYNTAX_ERROR_LOG: &str = "programs.cu(3): error: expected a \";\"";

fn program<'a>(prog: nvrtcProgram) -> &'a mut FakeProgram {
    // SAFETY: every nvrtcProgram the fake hands out is a leaked
    // Box<FakeProgram>, live until nvrtcDestroyProgram.
    unsafe { &mut *prog.cast::<FakeProgram>() }
}

/// Copy `bytes` to `out`, which has room for them (the size call said so).
fn copy_out(bytes: &[u8], out: *mut c_char) -> nvrtcResult {
    // SAFETY: the caller sized `out` by the matching size call.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), out.cast(), bytes.len()) };
    nvrtcResult::NVRTC_SUCCESS
}

/// Write `value` through `out`, a valid out-pointer from the caller.
fn put<T>(out: *mut T, value: T) -> nvrtcResult {
    // SAFETY: NVRTC's out-parameters are valid pointers.
    unsafe { out.write(value) };
    nvrtcResult::NVRTC_SUCCESS
}

unsafe extern "C" fn error_string(_: nvrtcResult) -> *const c_char {
    c"fake NVRTC error".as_ptr()
}
unsafe extern "C" fn version(major: *mut c_int, minor: *mut c_int) -> nvrtcResult {
    record("nvrtcVersion");
    put(major, 13);
    put(minor, 0)
}
unsafe extern "C" fn num_archs(count: *mut c_int) -> nvrtcResult {
    record("nvrtcGetNumSupportedArchs");
    put(count, ARCHS.len() as c_int)
}
unsafe extern "C" fn archs(out: *mut c_int) -> nvrtcResult {
    record("nvrtcGetSupportedArchs");
    // SAFETY: room for the count nvrtcGetNumSupportedArchs gave.
    unsafe { std::ptr::copy_nonoverlapping(ARCHS.as_ptr(), out, ARCHS.len()) };
    nvrtcResult::NVRTC_SUCCESS
}
unsafe extern "C" fn create(
    prog: *mut nvrtcProgram,
    source: *const c_char,
    _name: *const c_char,
    _headers: c_int,
    _contents: *const *const c_char,
    _include_names: *const *const c_char,
) -> nvrtcResult {
    record("nvrtcCreateProgram");
    // SAFETY: the caller passes a NUL-terminated source.
    let source = unsafe { CStr::from_ptr(source) }
        .to_string_lossy()
        .into_owned();
    let fake = Box::new(FakeProgram {
        source,
        log: CString::default(),
        image: Vec::new(),
        expressions: Vec::new(),
    });
    put(prog, Box::into_raw(fake).cast())
}
unsafe extern "C" fn destroy(prog: *mut nvrtcProgram) -> nvrtcResult {
    record("nvrtcDestroyProgram");
    // SAFETY: a pointer to a program the fake created, destroyed once.
    drop(unsafe { Box::from_raw((*prog).cast::<FakeProgram>()) });
    put(prog, std::ptr::null_mut())
}
unsafe extern "C" fn compile(
    prog: nvrtcProgram,
    _count: c_int,
    _options: *const *const c_char,
) -> nvrtcResult {
    record("nvrtcCompileProgram");
    let fake = program(prog);
    if fake.source.contains("syntax error") {
        fake.log = CString::new(SYNTAX_ERROR_LOG).unwrap();
        return nvrtcResult::NVRTC_ERROR_COMPILATION;
    }
    if let Some(log) = refused_assertion(&fake.source) {
        fake.log = CString::new(log).unwrap();
        return nvrtcResult::NVRTC_ERROR_COMPILATION;
    }
    fake.image = format!("// fake image of {} bytes of source\n\0", fake.source.len()).into();
    nvrtcResult::NVRTC_SUCCESS
}
unsafe extern "C" fn image_size(prog: nvrtcProgram, size: *mut usize) -> nvrtcResult {
    record("nvrtcGetImageSize");
    put(size, program(prog).image.len())
}
unsafe extern "C" fn image(prog: nvrtcProgram, out: *mut c_char) -> nvrtcResult {
    record("nvrtcGetImage");
    copy_out(&program(prog).image, out)
}
unsafe extern "C" fn log_size(prog: nvrtcProgram, size: *mut usize) -> nvrtcResult {
    record("nvrtcGetProgramLogSize");
    put(size, program(prog).log.as_bytes_with_nul().len())
}
unsafe extern "C" fn log(prog: nvrtcProgram, out: *mut c_char) -> nvrtcResult {
    record("nvrtcGetProgramLog");
    copy_out(program(prog).log.as_bytes_with_nul(), out)
}
unsafe extern "C" fn add_name(prog: nvrtcProgram, expression: *const c_char) -> nvrtcResult {
    record("nvrtcAddNameExpression");
    // SAFETY: the caller passes a NUL-terminated expression.
    let expression = unsafe { CStr::from_ptr(expression) }.to_owned();
    program(prog).expressions.push(expression);
    nvrtcResult::NVRTC_SUCCESS
}
unsafe extern "C" fn lowered(
    prog: nvrtcProgram,
    expression: *const c_char,
    out: *mut *const c_char,
) -> nvrtcResult {
    record("nvrtcGetLoweredName");
    // SAFETY: the caller passes a NUL-terminated expression.
    let expression = unsafe { CStr::from_ptr(expression) };
    let kept = program(prog)
        .expressions
        .iter()
        .find(|e| e.as_c_str() == expression);
    // The fake "lowers" a name to itself, kept alive by the program.
    put(out, kept.map_or(std::ptr::null(), |e| e.as_ptr()))
}

/// What NVRTC 13.0 logs (seen on an H200) when `#define float double`
/// changes `fill`'s type under its declaration's assertion: the line is
/// found from the appended text, as the real compiler reports it.
fn refused_assertion(source: &str) -> Option<String> {
    if !source.contains("#define float double") {
        return None;
    }
    let (_, appended) = source.split_once("#line 1 \"cuda-streams-declarations\"\n")?;
    let line = appended
        .lines()
        .position(|l| l.contains("decltype(&fill)"))?
        + 1;
    Some(format!(
        "cuda-streams-declarations(15): error: static assertion failed with \"cuda-streams: a \
         kernel's declaration (D, from Rust) differs from its __global__ function (S) after \
         preprocessing\"\n          detected during instantiation of class \
         \"__cuda_streams_check<__cuda_streams_K, __cuda_streams_D, __cuda_streams_S> [with \
         __cuda_streams_K=__cuda_streams_kernel_fill, __cuda_streams_D=void (*)(unsigned long \
         long, float *), __cuda_streams_S=void (*)(unsigned long long, double *)]\" at line \
         {line}\n\n1 error detected in the compilation of \"fill.cu\".\n"
    ))
}

/// A compiler over the fake table.
pub(super) fn compiler() -> Compiler {
    let table = Nvrtc {
        nvrtcGetErrorString: error_string,
        nvrtcVersion: version,
        nvrtcGetNumSupportedArchs: num_archs,
        nvrtcGetSupportedArchs: archs,
        nvrtcCreateProgram: create,
        nvrtcDestroyProgram: destroy,
        nvrtcCompileProgram: compile,
        nvrtcGetPTXSize: image_size,
        nvrtcGetPTX: image,
        nvrtcGetCUBINSize: image_size,
        nvrtcGetCUBIN: image,
        nvrtcGetProgramLogSize: log_size,
        nvrtcGetProgramLog: log,
        nvrtcAddNameExpression: add_name,
        nvrtcGetLoweredName: lowered,
    };
    // SAFETY: each entry point behaves as NVRTC's of its name does, for
    // the calls the compiler makes (sizes before data, programs created
    // before use and destroyed once).
    unsafe { Compiler::from_table(table) }.unwrap()
}
