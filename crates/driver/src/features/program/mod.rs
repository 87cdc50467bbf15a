//! Run-time compilation of CUDA C++ with NVRTC, loaded at run time.
//!
//! [`Program`] holds a source, the kernels declared in it
//! ([`Program::declare`]) and how to compile it; [`Program::compile_for`]
//! makes a [`Module`](crate::Module) for a context:
//! - on a GPU, NVRTC compiles the source for the context's compute
//!   capability (or [`Program::arch`]), to a cubin or PTX
//!   ([`Program::output`]), with an assertion of each declared kernel's
//!   exact type appended, so the compiler itself checks every declaration
//!   after preprocessing; a compile error carries NVRTC's log; images are
//!   cached on disk (see [`CACHE_ENV`]), and a cache hit calls no NVRTC
//!   entry point;
//! - on the software driver there is nothing to compile for: the module is
//!   made from the kernels' declarations and their safe CPU twins. The
//!   source's parameter lists are read and every declaration compared with
//!   its `__global__` function, and one that depends on a macro is refused
//!   (only a compiler could check it). A C++ error is found only by NVRTC
//!   ([`Program::compile`] runs it anywhere it is installed).
//!
//! Declaring a kernel on a program is `unsafe`, once: the signature is
//! checked, but what the kernel's body does with its pointers is the user's
//! promise. [`Module::kernel`](crate::Module::kernel) then gives only
//! declared kernels, and every launch of them is safe and checked.
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
//! // SAFETY: scale touches y[i] for i < n only.
//! let program = unsafe { Program::new(SOURCE).name("scale.cu").declare::<Scale>() };
//! let module = program.compile_for(&ctx)?;
//! let scale: Scale = module.kernel()?;
//! let mut y = DeviceBuffer::from_slice(&stream, &[1.0f32, 2.0, 3.0])?;
//! scale.launch(&stream, LaunchConfig::for_num_elems(3), 3, 2.0, &mut y)?;
//! assert_eq!(y.to_vec(&stream)?, [2.0, 4.0, 6.0]);
//! # Ok(())
//! # }
//! ```

mod assertion;
mod cache;
mod nvrtc;
pub(crate) mod parse;
pub(crate) mod source_info;
mod syntax;

pub use cache::{CACHE_ENV, CACHE_SETTING};
pub use nvrtc::Compiler;

use crate::features::declare::DeclaredKernel;
use crate::features::kernel_decl::KernelDecl;
use crate::features::module::Module;
use crate::ground::arch::Arch;
use crate::ground::error::{Error, Result};
use crate::objects::context::Context;
use source_info::SourceInfo;
use std::path::PathBuf;
use std::sync::Arc;

impl Arch {
    /// The context's device's compute capability.
    pub fn of(ctx: &Context) -> Self {
        let (major, minor) = ctx.info().compute_capability;
        Self { major, minor }
    }
}

impl Module {
    /// The CUDA source as NVRTC compiles it: [`Program::compile_for`].
    pub fn from_cuda_source(ctx: &Arc<Context>, program: &Program) -> Result<Arc<Self>> {
        program.compile_for(ctx)
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
    /// The kernels declared with [`Program::declare`]: each one's type is
    /// asserted to the compiler, and only these come out of
    /// [`Module::kernel`].
    declarations: Vec<KernelDecl>,
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
            declarations: Vec::new(),
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

    /// Declare the kernel `K` describes ([`kernel!`](crate::kernel!)) as a
    /// kernel of this program, so that [`Module::kernel`] gives it, with
    /// safe, checked launches, from the compiled module.
    ///
    /// The declaration's signature is checked, not trusted: when NVRTC
    /// compiles the program, an assertion of the kernel's exact function
    /// type is appended to the source, so the compiler compares the
    /// declaration with the `__global__` function after preprocessing
    /// (macros, typedefs, templates, included types), and a difference is an
    /// [`Error::DeclarationMismatch`] naming the kernel and both types. The
    /// source's parameter list is also read beforehand, for a message that
    /// names the parameter (and, on the software driver, where there is no
    /// compiler, a declaration that depends on a macro is refused).
    ///
    /// What no compiler can check is what the kernel's body does with the
    /// pointers it is given. That is the promise this call makes, once per
    /// kernel and program; every launch after it is safe and checked.
    ///
    /// ```
    /// use cuda_streams_driver::{Context, Error, Program, kernel};
    /// kernel! {
    ///     pub struct Fill: fn fill(n: u64, y: &mut [f32; n]);
    ///     twin = per_thread(|t, n, y| if (t.global_x() as u64) < n { y[t.global_x()] = 1.0 });
    /// }
    /// const SOURCE: &str = r#"
    /// #define float double
    /// extern "C" __global__ void fill(unsigned long long n, float* y) {
    ///     unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x;
    ///     if (i < n) y[i] = 1;
    /// }"#;
    /// let ctx = Context::new(0).unwrap();
    /// // SAFETY: fill writes y[i] for i < n only, and reads nothing else.
    /// let program = unsafe { Program::new(SOURCE).name("fill.cu").declare::<Fill>() };
    /// // `float` is `double` here: the kernel would write 8n bytes into a
    /// // buffer of n f32s. The declaration is refused before any launch.
    /// match program.compile_for(&ctx) {
    ///     Err(Error::DeclarationMismatch { kernel: "fill", .. }) => {}
    ///     Err(Error::NvrtcUnavailable { .. }) if ctx.is_gpu() => {}
    ///     other => panic!("{other:?}"),
    /// }
    /// ```
    ///
    /// # Safety
    /// The body of kernel `K::DECL.name` in this program, as compiled with
    /// its options, touches only the elements the declaration gives it:
    /// through each pointer parameter, only elements `0..count` of the
    /// declared count (another parameter's value, or a number), and writes
    /// only through pointers declared `&mut [T; count]`. The parameters'
    /// types are checked by the compiler (on a GPU) and need no promise.
    /// A declaration that says `calls cudaGridDependencySynchronize`
    /// ([`KernelDecl::grid_dependency_sync`](crate::KernelDecl::grid_dependency_sync))
    /// promises too that the body calls it before it touches any memory
    /// that work earlier on its stream may write.
    pub unsafe fn declare<K: DeclaredKernel>(mut self) -> Self {
        self.declarations.push(K::DECL);
        self
    }

    /// The kernels declared with [`Program::declare`].
    pub fn declarations(&self) -> &[KernelDecl] {
        &self.declarations
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
    /// it. Each declaration ([`Program::declare`]) is first compared with the
    /// source's parameter list. On a GPU, NVRTC compiles the source for the
    /// context's compute capability (or [`Program::arch`]), asserting each
    /// declared kernel's type, or the image comes from the disk cache
    /// ([`CACHE_ENV`]); a compile error carries NVRTC's log. On the software
    /// driver the module is made from the declarations' CPU twins, and a
    /// declaration that depends on a macro of the source or the options is
    /// refused, since only a compiler could check it. The source is compiled
    /// there too when NVRTC is installed (it needs no GPU: `pip install
    /// nvidia-cuda-nvrtc==13.0.*`), so a compile error fails as on a GPU;
    /// without NVRTC only its brackets are checked
    /// ([`Error::SourceNotCompiled`]), and a source that passes may still not
    /// compile.
    ///
    /// ```
    /// use cuda_streams_driver::{Context, Error, Program};
    /// let ctx = Context::new(0).unwrap();
    /// let broken = Program::new("extern \"C\" __global__ void k(float* y) { y[0] = 1.0f;");
    /// let err = broken.compile_for(&ctx).unwrap_err();
    /// assert!(
    ///     matches!(err, Error::SourceNotCompiled { .. } | Error::Compile { .. }),
    ///     "{err}"
    /// );
    /// ```
    pub fn compile_for(&self, ctx: &Arc<Context>) -> Result<Arc<Module>> {
        let info = SourceInfo {
            program: self.name.clone(),
            kernels: parse::kernels(&self.source),
            name_expressions: self.name_expressions.clone(),
            lowered: Vec::new(),
            declared: self.declarations.clone(),
        };
        for decl in &self.declarations {
            info.check(decl.name, decl.params)?;
        }
        if ctx.loaded_driver().runs_twins() {
            self.check_without_gpu(ctx)?;
            let macros = parse::macros(&self.source, &self.options);
            for decl in &self.declarations {
                if let Some(name) = parse::macro_in_declaration(decl.name, &info.kernels, &macros) {
                    return Err(info.mismatch(
                        decl.name,
                        format!(
                            "its declaration depends on the macro `{name}` (defined by the \
                             source or an option), which only NVRTC can expand; the software \
                             driver has no compiler to check it, so it refuses what it cannot \
                             read"
                        ),
                    ));
                }
            }
            Module::from_declarations(ctx, info)
        } else {
            let arch = self.arch.unwrap_or_else(|| Arch::of(ctx));
            let compiled = self.compile(arch)?;
            let info = SourceInfo {
                lowered: compiled.lowered.clone(),
                ..info
            };
            Module::load_compiled(ctx, &compiled.image, info)
        }
    }

    /// On the software driver, which runs twins and needs no image: compile
    /// with NVRTC when it is installed, for the program's architecture or
    /// else the newest NVRTC targets, so the source is checked as on a GPU;
    /// without NVRTC, check what can be checked without a compiler.
    fn check_without_gpu(&self, ctx: &Context) -> Result<()> {
        let compiler = match Compiler::global() {
            Ok(compiler) => compiler,
            Err(Error::NvrtcUnavailable { reason }) => {
                tracing::debug!(program = %self.name, "not compiled: {reason}");
                return match syntax::bracket_problem(&self.source) {
                    Some(problem) => Err(Error::SourceNotCompiled {
                        program: self.name.clone(),
                        problem,
                    }),
                    None => Ok(()),
                };
            }
            Err(other) => return Err(other),
        };
        let newest = compiler.supported_archs().iter().max().copied();
        let arch = match (self.arch, newest) {
            (Some(arch), _) => arch,
            (None, Some(newest))
                if !compiler
                    .supported_archs()
                    .contains(&(Arch::of(ctx).number() as i32)) =>
            {
                let newest = u32::try_from(newest).unwrap_or(0);
                Arch::new(newest / 10, newest % 10)
            }
            _ => Arch::of(ctx),
        };
        self.compile_with(compiler, arch).map(drop)
    }

    /// Compile for `arch` with NVRTC ([`Compiler::global`]), or take the
    /// image from the cache; needs no GPU.
    pub fn compile(&self, arch: Arch) -> Result<CompiledProgram> {
        self.compile_with(Compiler::global()?, arch)
    }

    /// [`Program::compile`] with a given compiler.
    pub fn compile_with(&self, compiler: &Compiler, arch: Arch) -> Result<CompiledProgram> {
        if !compiler.supported_archs().contains(&(arch.number() as i32)) {
            let (major, minor) = compiler.version();
            return Err(Error::UnsupportedArch {
                arch,
                nvrtc: format!("{major}.{minor}"),
                supported: compiler
                    .supported_archs()
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
        let checked = self.checked_source()?;
        let key = format!(
            "nvrtc {}.{}\noutput {:?}\noptions {options:?}\nnames {:?}\nsource\n{}",
            compiler.version().0,
            compiler.version().1,
            self.output,
            checked.expressions,
            checked.source
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
        let (image, log, lowered) = self.run_nvrtc(compiler, &checked, &options, arch)?;
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

    /// The source NVRTC compiles: the program's, followed by the assertions
    /// of its declarations, and the name expressions with the one that
    /// proves the assertions were compiled.
    fn checked_source(&self) -> Result<CheckedSource> {
        if self.declarations.is_empty() {
            return Ok(CheckedSource {
                source: self.source.to_string(),
                expressions: self.name_expressions.clone(),
                lines: Vec::new(),
            });
        }
        for decl in &self.declarations {
            if !assertion::valid_name(decl.name) {
                return Err(Error::DeclarationMismatch {
                    kernel: decl.name,
                    program: self.name.clone(),
                    reason: "the declared name is no C++ name or name expression the compiler \
                             can be asked about (letters, digits, `_`, `::`, `<…>`, `,`, `*`, \
                             `&` and spaces only)"
                        .into(),
                });
            }
        }
        let appended = assertion::append(&self.declarations);
        let mut expressions = self.name_expressions.clone();
        expressions.push(assertion::SENTINEL.to_string());
        Ok(CheckedSource {
            source: format!("{}{}", self.source, appended.text),
            expressions,
            lines: appended.lines,
        })
    }

    /// A compile error as the declaration it refused, when the log says
    /// the compiler refused one of the assertions.
    fn declaration_error(&self, checked: &CheckedSource, log: &str) -> Option<Error> {
        let (decl, failure) = self
            .declarations
            .iter()
            .zip(&checked.lines)
            .find_map(|(decl, line)| Some((decl, assertion::failure(log, *line)?)))?;
        let declared = assertion::function_type(decl.params);
        let reason = match &failure.source_type {
            Some(source) => format!(
                "NVRTC, after preprocessing, gives `{}` the type {source}, but the declaration \
                 says {declared}",
                decl.name
            ),
            None => format!(
                "NVRTC could not confirm that `{}` has the declared type {declared}: {}",
                decl.name,
                failure.lines.join(" / ")
            ),
        };
        Some(Error::DeclarationMismatch {
            kernel: decl.name,
            program: self.name.clone(),
            reason,
        })
    }
}

/// What NVRTC is given for a program: its source with the declarations'
/// assertions, the name expressions, and the assertions' lines.
struct CheckedSource {
    source: String,
    expressions: Vec<String>,
    lines: Vec<u32>,
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
