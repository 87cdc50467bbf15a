//! Run-time compilation of CUDA C++ with NVRTC, loaded at run time.
//!
//! [`Program`] holds a source and how to compile it; [`Program::compile_for`]
//! makes a [`Module`](crate::Module) for a context:
//! - on a GPU, NVRTC compiles the source for the context's compute
//!   capability (or [`Program::arch`]), to a cubin or PTX
//!   ([`Program::output`]); a compile error carries NVRTC's log; images are
//!   cached on disk (see [`CACHE_ENV`]), and a cache hit calls no NVRTC
//!   entry point;
//! - on the software driver there is nothing to compile for: the module is
//!   made from the kernels' declarations and their safe CPU twins, and the
//!   source is still read, so that every declaration is checked against its
//!   `__global__` function exactly as on a GPU. NVRTC is not needed, and a
//!   C++ error the parameter lists do not show is found only by NVRTC
//!   ([`Program::compile`] runs it anywhere it is installed).
//!
//! Either way [`Module::kernel`](crate::Module::kernel) compares a
//! declaration ([`crate::kernel!`]) with the source's parameter list and
//! refuses one that differs, naming the parameter: that check is what
//! makes the declaration safe.
//!
//! ```
//! use cuda_streams_driver::{Context, DeviceBuffer, LaunchConfig, Program, Stream, kernel};
//! kernel! {
//!     /// `y[i] = a * y[i]`
//!     pub struct Scale: fn scale(n: u64, a: f32, y: &mut [f32; n]);
//!     twin = per_thread(|t, n, a, y| {
//!         let i = t.global_x();
//!         if (i as u64) < n {
//!             y[i] *= a;
//!         }
//!     });
//! }
//! const SOURCE: &str = r#"
//! extern "C" __global__ void scale(unsigned long long n, float a, float* y) {
//!     unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x;
//!     if (i < n) y[i] *= a;
//! }"#;
//! # fn main() -> cuda_streams_driver::Result<()> {
//! let ctx = Context::new(0)?;
//! let stream = Stream::new(&ctx)?;
//! let module = Program::new(SOURCE).name("scale.cu").compile_for(&ctx)?;
//! let scale: Scale = module.kernel()?;
//! let mut y = DeviceBuffer::from_slice(&stream, &[1.0f32, 2.0, 3.0])?;
//! scale.launch(&stream, LaunchConfig::for_num_elems(3), 3, 2.0, &mut y)?;
//! assert_eq!(y.to_vec(&stream)?, [2.0, 4.0, 6.0]);
//! # Ok(())
//! # }
//! ```

mod cache;
pub(crate) mod parse;

pub use cache::{CACHE_ENV, CACHE_SETTING};

use crate::features::module::Module;
use crate::ground::arch::Arch;
use crate::ground::error::{Error, Result};
use crate::ground::select::DriverKind;
use crate::objects::context::Context;
use std::ffi::{CStr, CString, c_char};
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use sys::nvrtc::Nvrtc;
use sys::nvrtc::bindings::nvrtcProgram;

impl Arch {
    /// The context's device's compute capability.
    pub fn of(ctx: &Context) -> Self {
        let (major, minor) = ctx.info().compute_capability;
        Self { major, minor }
    }
}

/// What NVRTC produces.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Output {
    /// A cubin for exactly the architecture (`--gpu-architecture=sm_XY`):
    /// loads without a JIT step.
    #[default]
    Cubin,
    /// PTX for the virtual architecture (`compute_XY`), which the driver
    /// JIT-compiles at load, also on newer GPUs.
    Ptx,
}

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

/// Whether and where to cache.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Cache {
    FromEnv,
    Off,
    Dir(PathBuf),
}

/// A CUDA C++ source and how to compile it.
///
/// ```
/// use cuda_streams_driver::{Output, Program};
/// let program = Program::new("extern \"C\" __global__ void k(int* x) { *x = 1; }")
///     .name("k.cu")
///     .options(["--use_fast_math"])
///     .output(Output::Ptx);
/// assert_eq!(program.program_name(), "k.cu");
/// ```
#[derive(Clone, Debug)]
pub struct Program {
    source: Arc<str>,
    name: String,
    options: Vec<String>,
    name_expressions: Vec<String>,
    output: Output,
    arch: Option<Arch>,
    cache: Cache,
}

impl Program {
    /// A program of `source` (CUDA C++), named `program.cu`, compiled to a
    /// cubin for the context's architecture, cached as the environment says.
    pub fn new(source: impl Into<String>) -> Self {
        Self {
            source: source.into().into(),
            name: "program.cu".into(),
            options: Vec::new(),
            name_expressions: Vec::new(),
            output: Output::Cubin,
            arch: None,
            cache: Cache::FromEnv,
        }
    }

    /// The name NVRTC gives the source in its log.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Add NVRTC options (`--use_fast_math`, `-DBLOCK=256`, …); the
    /// architecture option is added from the context or [`Program::arch`].
    pub fn options<I, S>(mut self, options: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.options.extend(options.into_iter().map(Into::into));
        self
    }

    /// A name expression (`scale<float>`): instantiates a template kernel,
    /// or names a kernel that is not `extern "C"`, so a declaration of that
    /// name finds its lowered (mangled) symbol.
    pub fn name_expression(mut self, expression: impl Into<String>) -> Self {
        self.name_expressions.push(expression.into());
        self
    }

    /// Cubin (the default) or PTX.
    pub fn output(mut self, output: Output) -> Self {
        self.output = output;
        self
    }

    /// Compile for `arch` instead of the context's device.
    pub fn arch(mut self, arch: Arch) -> Self {
        self.arch = Some(arch);
        self
    }

    /// Cache compiled images in `dir` instead of the default location.
    pub fn cache_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cache = Cache::Dir(dir.into());
        self
    }

    /// Compile every time (as `CUDA_STREAMS_KERNEL_CACHE=off` does).
    pub fn no_cache(mut self) -> Self {
        self.cache = Cache::Off;
        self
    }

    /// The source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The name given with [`Program::name`].
    pub fn program_name(&self) -> &str {
        &self.name
    }

    /// The name expressions given.
    pub fn name_expressions(&self) -> &[String] {
        &self.name_expressions
    }

    /// Where compiled images of this program are cached, if anywhere.
    pub fn cache_location(&self) -> Option<PathBuf> {
        match &self.cache {
            Cache::FromEnv => cache::default_dir(),
            Cache::Off => None,
            Cache::Dir(dir) => Some(dir.clone()),
        }
    }

    /// Compile, or take the image from the cache, for the context, and load
    /// it. On a GPU, NVRTC compiles the source for the context's compute
    /// capability (or [`Program::arch`]), or the image comes from the disk
    /// cache ([`CACHE_ENV`]), and a compile error carries NVRTC's log. On the
    /// software driver nothing is compiled: the module is made from the
    /// declarations' CPU twins, and the source is still read so that
    /// [`Module::kernel`] checks each declaration against its `__global__`
    /// function exactly as on a GPU.
    pub fn compile_for(&self, ctx: &Arc<Context>) -> Result<Arc<Module>> {
        let kernels = parse::kernels(&self.source);
        let info = SourceInfo {
            program: self.name.clone(),
            kernels,
            name_expressions: self.name_expressions.clone(),
            lowered: Vec::new(),
        };
        match ctx.kind() {
            DriverKind::Soft => Module::from_declarations(ctx, info),
            DriverKind::Cuda => {
                let arch = self.arch.unwrap_or_else(|| Arch::of(ctx));
                let compiled = self.compile(arch)?;
                let info = SourceInfo {
                    lowered: compiled.lowered.clone(),
                    ..info
                };
                Module::load_compiled(ctx, &compiled.image, info)
            }
        }
    }

    /// Compile for `arch` with NVRTC ([`Compiler::global`]), or take the
    /// image from the cache; needs no GPU.
    pub fn compile(&self, arch: Arch) -> Result<CompiledProgram> {
        self.compile_with(Compiler::global()?, arch)
    }

    /// [`Program::compile`] with a given compiler.
    pub fn compile_with(&self, compiler: &Compiler, arch: Arch) -> Result<CompiledProgram> {
        if !compiler.archs.contains(&(arch.number() as i32)) {
            let (major, minor) = compiler.version;
            return Err(Error::UnsupportedArch {
                arch,
                nvrtc: format!("{major}.{minor}"),
                supported: compiler
                    .archs
                    .iter()
                    .map(|a| format!("sm_{a}"))
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        let arch_option = match self.output {
            Output::Cubin => format!("--gpu-architecture=sm_{}", arch.number()),
            Output::Ptx => format!("--gpu-architecture=compute_{}", arch.number()),
        };
        let mut options = self.options.clone();
        options.push(arch_option);
        let key = format!(
            "nvrtc {}.{}\noutput {:?}\noptions {options:?}\nnames {:?}\nsource\n{}",
            compiler.version.0, compiler.version.1, self.output, self.name_expressions, self.source
        );
        let dir = self.cache_location();
        if let Some(entry) = dir.as_deref().and_then(|dir| cache::load(dir, &key)) {
            tracing::debug!(program = %self.name, %arch, "kernel cache hit");
            return Ok(CompiledProgram {
                image: entry.image,
                log: entry.log,
                lowered: entry.lowered,
                output: self.output,
                arch,
                from_cache: true,
            });
        }
        let (image, log, lowered) = self.run_nvrtc(compiler, &options, arch)?;
        let entry = cache::Entry {
            image,
            log,
            lowered,
        };
        if let Some(dir) = &dir {
            cache::store(dir, &key, &entry);
        }
        Ok(CompiledProgram {
            image: entry.image,
            log: entry.log,
            lowered: entry.lowered,
            output: self.output,
            arch,
            from_cache: false,
        })
    }

    /// One NVRTC compilation: the image (PTX with its NUL), the log and the
    /// lowered names.
    #[allow(clippy::type_complexity, reason = "private, named in the doc")]
    fn run_nvrtc(
        &self,
        compiler: &Compiler,
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
        let source = nul("source of", &self.name).and_then(|_| nul("source", &self.source))?;
        let name = nul("program name", &self.name)?;
        let options: Vec<CString> = options
            .iter()
            .map(|o| nul("option", o))
            .collect::<Result<_>>()?;
        let expressions: Vec<CString> = self
            .name_expressions
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
            return Err(Error::Compile {
                program: self.name.clone(),
                arch,
                log,
            });
        }
        call("nvrtcCompileProgram", compiled)?;
        let image = guard.output(self.output)?;
        let mut lowered = Vec::new();
        for (text, expression) in self.name_expressions.iter().zip(&expressions) {
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

/// What NVRTC made of a [`Program`] (or what the cache kept of it).
#[derive(Clone, Debug)]
pub struct CompiledProgram {
    image: Vec<u8>,
    log: String,
    lowered: Vec<(String, String)>,
    output: Output,
    arch: Arch,
    from_cache: bool,
}

impl CompiledProgram {
    /// The cubin, or the PTX text with its terminating NUL.
    pub fn image(&self) -> &[u8] {
        &self.image
    }

    /// The PTX text, when the output is PTX.
    pub fn ptx(&self) -> Option<&str> {
        match self.output {
            Output::Ptx => std::str::from_utf8(&self.image)
                .ok()
                .map(|t| t.trim_end_matches('\0')),
            Output::Cubin => None,
        }
    }

    /// NVRTC's log (warnings; empty for a clean compile).
    pub fn log(&self) -> &str {
        &self.log
    }

    /// The lowered (mangled) symbol of a name expression.
    pub fn lowered_name(&self, expression: &str) -> Option<&str> {
        self.lowered
            .iter()
            .find(|(e, _)| e == expression)
            .map(|(_, l)| l.as_str())
    }

    /// Cubin or PTX.
    pub fn output(&self) -> Output {
        self.output
    }

    /// The architecture it was compiled for.
    pub fn arch(&self) -> Arch {
        self.arch
    }

    /// Whether it came from the disk cache (NVRTC was not called).
    pub fn from_cache(&self) -> bool {
        self.from_cache
    }
}

/// What a module compiled from source knows of it: its kernels' parameter
/// lists, for declarations to be checked against, and the lowered names.
#[derive(Clone, Debug)]
pub(crate) struct SourceInfo {
    pub(crate) program: String,
    pub(crate) kernels: Vec<parse::SourceKernel>,
    pub(crate) name_expressions: Vec<String>,
    pub(crate) lowered: Vec<(String, String)>,
}

impl SourceInfo {
    /// Check a declaration against the source; `Ok` gives the symbol to
    /// look up (the `extern "C"` name, or the name expression's lowered
    /// name; on the software driver the declared name itself).
    pub(crate) fn check(
        &self,
        name: &'static str,
        params: &[sys::signature::Param],
    ) -> Result<String> {
        let mismatch = |reason: String| Error::DeclarationMismatch {
            kernel: name,
            program: self.program.clone(),
            reason,
        };
        parse::check(name, params, &self.kernels).map_err(mismatch)?;
        let (base, _) = parse::split_name_expression(name);
        let extern_c = self
            .kernels
            .iter()
            .any(|k| k.name == base && k.extern_c && k.template_params.is_empty());
        if extern_c && base == name {
            return Ok(name.to_string());
        }
        if !self.name_expressions.iter().any(|e| e == name) {
            return Err(mismatch(format!(
                "`{base}` is not an extern \"C\" kernel, so its symbol is mangled: give \
                 `{name}` to Program::name_expression before compiling, or declare the \
                 kernel extern \"C\""
            )));
        }
        Ok(self
            .lowered
            .iter()
            .find(|(e, _)| e == name)
            .map_or_else(|| name.to_string(), |(_, l)| l.clone()))
    }
}
