//! The NVRTC calls: the compiler, loaded once, and one compilation.

use super::{CheckedSource, Output, Program, assertion};
use crate::ground::arch::Arch;
use crate::ground::error::{Error, Result};
use std::ffi::{CStr, CString, c_char};
use std::fmt;
use std::sync::OnceLock;
use sys::nvrtc::Nvrtc;
use sys::nvrtc::bindings::nvrtcProgram;

/// NVRTC, loaded, with its version and the architectures it can target.
///
/// ```
/// use cuda_streams_driver::Compiler;
/// match Compiler::global() {
///     Ok(nvrtc) => assert!(nvrtc.version().0 >= 13),
///     // This machine has no NVRTC: the error says what to install.
///     Err(err) => assert!(err.to_string().contains("nvidia-cuda-nvrtc"), "{err}"),
/// }
/// ```
pub struct Compiler {
    table: Nvrtc,
    version: (i32, i32),
    archs: Vec<i32>,
}

impl Compiler {
    /// NVRTC as [`Nvrtc::load`] finds it, loaded once per process.
    pub fn global() -> Result<&'static Compiler> {
        static GLOBAL: OnceLock<std::result::Result<Compiler, String>> = OnceLock::new();
        GLOBAL
            .get_or_init(|| {
                let table = Nvrtc::load().map_err(|err| err.to_string())?;
                // SAFETY: the table was filled from libnvrtc by its own names.
                unsafe { Compiler::from_table(table) }.map_err(|err| err.to_string())
            })
            .as_ref()
            .map_err(|reason| Error::NvrtcUnavailable {
                reason: reason.clone(),
            })
    }

    /// A compiler over `table`; asks it for its version and architectures.
    ///
    /// # Safety
    /// Every function in `table` must behave as the NVRTC entry point of its
    /// name (as a table from [`Nvrtc::load`] does).
    pub unsafe fn from_table(table: Nvrtc) -> Result<Self> {
        let nvrtc_call = |call: &'static str, source| Error::NvrtcCall { call, source };
        let (mut major, mut minor) = (0, 0);
        // SAFETY: two valid out-pointers.
        let status = unsafe { (table.nvrtcVersion)(&mut major, &mut minor) };
        table
            .check(status)
            .map_err(|e| nvrtc_call("nvrtcVersion", e))?;
        let mut count = 0;
        // SAFETY: a valid out-pointer.
        let status = unsafe { (table.nvrtcGetNumSupportedArchs)(&mut count) };
        table
            .check(status)
            .map_err(|e| nvrtc_call("nvrtcGetNumSupportedArchs", e))?;
        let mut archs = vec![0; usize::try_from(count).unwrap_or(0)];
        if !archs.is_empty() {
            // SAFETY: room for the `count` ints NVRTC said it writes.
            let status = unsafe { (table.nvrtcGetSupportedArchs)(archs.as_mut_ptr()) };
            table
                .check(status)
                .map_err(|e| nvrtc_call("nvrtcGetSupportedArchs", e))?;
        }
        Ok(Self {
            table,
            version: (major, minor),
            archs,
        })
    }

    /// NVRTC's version (major, minor).
    pub fn version(&self) -> (i32, i32) {
        self.version
    }

    /// The architectures it can target, as `major * 10 + minor`.
    pub fn supported_archs(&self) -> &[i32] {
        &self.archs
    }
}

impl fmt::Debug for Compiler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Compiler")
            .field("version", &self.version)
            .field("archs", &self.archs)
            .finish()
    }
}

impl Program {
    /// One NVRTC compilation of `checked`: the image (PTX with its NUL), the
    /// log and the lowered names of the program's name expressions.
    #[allow(clippy::type_complexity, reason = "private, named in the doc")]
    pub(super) fn run_nvrtc(
        &self,
        compiler: &Compiler,
        checked: &CheckedSource,
        options: &[String],
        arch: Arch,
    ) -> Result<(Vec<u8>, String, Vec<(String, String)>)> {
        let table = &compiler.table;
        let call = |call: &'static str, status| {
            table
                .check(status)
                .map_err(|source| Error::NvrtcCall { call, source })
        };
        let nul = |what: &str, text: &str| {
            CString::new(text).map_err(|_| Error::InvalidName {
                name: format!("{what} {text:?} (contains a NUL byte)"),
            })
        };
        let source = nul("source of", &self.name).and_then(|_| nul("source", &checked.source))?;
        let name = nul("program name", &self.name)?;
        let options: Vec<CString> = options
            .iter()
            .map(|o| nul("option", o))
            .collect::<Result<_>>()?;
        let expressions: Vec<CString> = checked
            .expressions
            .iter()
            .map(|e| nul("name expression", e))
            .collect::<Result<_>>()?;
        let mut program: nvrtcProgram = std::ptr::null_mut();
        // SAFETY: NUL-terminated source and name; no headers.
        let status = unsafe {
            (table.nvrtcCreateProgram)(
                &mut program,
                source.as_ptr(),
                name.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        call("nvrtcCreateProgram", status)?;
        let guard = ProgramGuard { table, program };
        for expression in &expressions {
            // SAFETY: a live program and a NUL-terminated expression.
            let status = unsafe { (table.nvrtcAddNameExpression)(program, expression.as_ptr()) };
            call("nvrtcAddNameExpression", status)?;
        }
        let option_ptrs: Vec<*const c_char> = options.iter().map(|o| o.as_ptr()).collect();
        // SAFETY: a live program and `option_ptrs.len()` NUL-terminated options.
        let compiled = unsafe {
            (table.nvrtcCompileProgram)(program, option_ptrs.len() as i32, option_ptrs.as_ptr())
        };
        let log = guard.log()?;
        if compiled == sys::nvrtc::bindings::nvrtcResult::NVRTC_ERROR_COMPILATION {
            if let Some(err) = self.declaration_error(checked, &log) {
                return Err(err);
            }
            return Err(Error::Compile {
                program: self.name.clone(),
                arch,
                log,
            });
        }
        call("nvrtcCompileProgram", compiled)?;
        let image = guard.output(self.output)?;
        let mut lowered = Vec::new();
        for (text, expression) in checked.expressions.iter().zip(&expressions) {
            let mut name: *const c_char = std::ptr::null();
            // SAFETY: a live, compiled program; the expression was added.
            let status =
                unsafe { (table.nvrtcGetLoweredName)(program, expression.as_ptr(), &mut name) };
            call("nvrtcGetLoweredName", status)?;
            if !name.is_null() {
                // SAFETY: NVRTC returns a NUL-terminated string owned by the
                // program, alive until it is destroyed (after this copy).
                let name = unsafe { CStr::from_ptr(name) }
                    .to_string_lossy()
                    .into_owned();
                lowered.push((text.clone(), name));
            }
        }
        drop(guard);
        if !self.declarations.is_empty() {
            // The assertions' last line was compiled, so they were too (an
            // unclosed comment in the source would have swallowed them).
            let sentinel = lowered.iter().position(|(e, _)| e == assertion::SENTINEL);
            match sentinel {
                Some(index) => {
                    lowered.remove(index);
                }
                None => {
                    return Err(Error::Compile {
                        program: self.name.clone(),
                        arch,
                        log: format!(
                            "{log}\ncuda-streams: the declarations' check appended to the source \
                             was not compiled (is a comment or a directive left open at its end?)"
                        ),
                    });
                }
            }
        }
        Ok((image, log, lowered))
    }
}

/// Destroys an NVRTC program on every path out of a compilation.
struct ProgramGuard<'a> {
    table: &'a Nvrtc,
    program: nvrtcProgram,
}

impl ProgramGuard<'_> {
    /// Read a size, then that many bytes, with a pair of entry points.
    fn bytes(
        &self,
        size_call: (
            &'static str,
            unsafe extern "C" fn(nvrtcProgram, *mut usize) -> sys::nvrtc::bindings::nvrtcResult,
        ),
        data_call: (
            &'static str,
            unsafe extern "C" fn(nvrtcProgram, *mut c_char) -> sys::nvrtc::bindings::nvrtcResult,
        ),
    ) -> Result<Vec<u8>> {
        let mut size = 0usize;
        // SAFETY: a live program and a valid out-pointer.
        let status = unsafe { (size_call.1)(self.program, &mut size) };
        self.table
            .check(status)
            .map_err(|source| Error::NvrtcCall {
                call: size_call.0,
                source,
            })?;
        let mut bytes = vec![0u8; size];
        if size > 0 {
            // SAFETY: room for the `size` bytes NVRTC reported.
            let status = unsafe { (data_call.1)(self.program, bytes.as_mut_ptr().cast()) };
            self.table
                .check(status)
                .map_err(|source| Error::NvrtcCall {
                    call: data_call.0,
                    source,
                })?;
        }
        Ok(bytes)
    }

    fn log(&self) -> Result<String> {
        let mut log = self.bytes(
            ("nvrtcGetProgramLogSize", self.table.nvrtcGetProgramLogSize),
            ("nvrtcGetProgramLog", self.table.nvrtcGetProgramLog),
        )?;
        while log.last() == Some(&0) {
            log.pop();
        }
        Ok(String::from_utf8_lossy(&log).into_owned())
    }

    fn output(&self, output: Output) -> Result<Vec<u8>> {
        match output {
            Output::Ptx => self.bytes(
                ("nvrtcGetPTXSize", self.table.nvrtcGetPTXSize),
                ("nvrtcGetPTX", self.table.nvrtcGetPTX),
            ),
            Output::Cubin => self.bytes(
                ("nvrtcGetCUBINSize", self.table.nvrtcGetCUBINSize),
                ("nvrtcGetCUBIN", self.table.nvrtcGetCUBIN),
            ),
        }
    }
}

impl Drop for ProgramGuard<'_> {
    fn drop(&mut self) {
        // SAFETY: the program was created by nvrtcCreateProgram and is
        // destroyed once.
        let status = unsafe { (self.table.nvrtcDestroyProgram)(&mut self.program) };
        if let Err(err) = self.table.check(status) {
            tracing::warn!("nvrtcDestroyProgram failed: {err}");
        }
    }
}
