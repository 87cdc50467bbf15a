//! Loaded kernel images and the functions in them.

use crate::features::kernel_decl::KernelDecl;
use crate::features::program::source_info::SourceInfo;
use crate::ground::error::{Error, Result};
use crate::objects::context::Context;
use std::ffi::CString;
use std::fmt;
use std::sync::Arc;
use sys::signature::{self, Param};
use sys::{CUfunction, CUmodule};

/// A kernel image as [`Module::load`] takes it: the bytes of a cubin, fatbin
/// or PTX, and the declared signatures of kernels in it.
///
/// The signatures belong to the image: a kernel of a declared image comes
/// out of [`Module::function`] with its signature and launches checked
/// ([`crate::Stream::launch`]), on either driver, and nothing can change the
/// signature afterwards. Bytes alone declare nothing: their kernels need the
/// `unsafe` [`Kernel::with_signature`] or [`crate::Stream::launch_unchecked`].
/// The kernels crate's images convert into declared ones.
///
/// ```
/// use cuda_streams_driver::{Context, Module, ModuleImage};
/// let ctx = Context::new(0).unwrap();
/// // The kernels crate declares its kernels' signatures beside their twins.
/// let declared = ModuleImage::from(&kernels::ELEMENTWISE);
/// assert_eq!(declared.signature("saxpy").unwrap().len(), 4);
/// let saxpy = Module::load(&ctx, declared).unwrap().function("saxpy").unwrap();
/// assert_eq!(saxpy.signature().unwrap().len(), 4);
/// // The same bytes without their declarations: on a GPU the kernel is
/// // found, but only an unsafe call can say what it takes; the software
/// // driver has no twin to run for bare bytes.
/// let bytes: &'static [u8] = kernels::ELEMENTWISE.fatbin();
/// if ctx.is_gpu() {
///     let saxpy = Module::load(&ctx, bytes).unwrap().function("saxpy").unwrap();
///     assert!(saxpy.signature().is_none());
/// } else {
///     assert!(Module::load(&ctx, bytes).is_err());
/// }
/// ```
#[derive(Clone, Copy, Debug)]
pub struct ModuleImage {
    bytes: &'static [u8],
    kernels: &'static [KernelDecl],
}

impl ModuleImage {
    /// An image that declares no signatures.
    pub const fn new(bytes: &'static [u8]) -> Self {
        Self {
            bytes,
            kernels: &[],
        }
    }

    /// An image whose kernels `kernels` declares: each one's name,
    /// parameters ([`sys::signature::Param`]) and safe CPU twin, as
    /// [`kernel!`](crate::kernel!) makes them. [`Module::load`] validates
    /// the parameters, and on the software driver makes the module from the
    /// declarations' twins (the bytes are not read there).
    ///
    /// ```
    /// use cuda_streams_driver::{Context, DeclaredKernel, Module, ModuleImage, kernel};
    /// kernel! {
    ///     /// `zero(unsigned int* out)`: writes out[0].
    ///     pub struct Zero: fn zero(out: &mut [u32; 1]);
    ///     twin = per_grid(|_dims, out| out[0] = 0);
    /// }
    /// static IMAGE: [u8; 8] = *b"declare\0"; // stands in for a cubin or PTX image
    /// // SAFETY: zero(u32* out) in IMAGE writes exactly out[0], as declared.
    /// let image = unsafe { ModuleImage::declared(&IMAGE, &[Zero::DECL]) };
    /// assert!(image.signature("zero").is_some());
    /// let ctx = Context::new(0).unwrap();
    /// if !ctx.is_gpu() {
    ///     let zero: Zero = Module::load(&ctx, image).unwrap().kernel().unwrap();
    ///     assert_eq!(zero.kernel().signature(), Some(Zero::DECL.params));
    /// }
    /// ```
    ///
    /// # Safety
    /// For each entry of `kernels`, `params` are the parameters of the
    /// kernel `name` in `bytes`, exactly: their count, order and types; a
    /// pointer the kernel writes through is
    /// [`Access::Write`](sys::signature::Access::Write), and the kernel
    /// touches no element beyond a pointer's declared extent, counted from
    /// the pointer. Checked launches of the kernel on a GPU trust this. An
    /// entry whose `grid_dependency_sync` is set calls
    /// `cudaGridDependencySynchronize` before it touches any memory that
    /// work earlier on its stream may write: programmatic dependent
    /// launches trust that.
    pub const unsafe fn declared(bytes: &'static [u8], kernels: &'static [KernelDecl]) -> Self {
        Self { bytes, kernels }
    }

    /// The image's bytes.
    pub fn bytes(&self) -> &'static [u8] {
        self.bytes
    }

    /// The kernels it declares, with their twins (none for bare bytes).
    pub fn kernels(&self) -> &'static [KernelDecl] {
        self.kernels
    }

    /// The declared parameters of `kernel`, if the image declares it.
    pub fn signature(&self, kernel: &str) -> Option<&'static [Param]> {
        self.kernels
            .iter()
            .find(|declared| declared.name == kernel)
            .map(|declared| declared.params)
    }

    /// Whether the image declares that `kernel` calls
    /// `cudaGridDependencySynchronize` ([`KernelDecl::grid_dependency_sync`]).
    pub fn declares_grid_dependency_sync(&self, kernel: &str) -> bool {
        self.kernels
            .iter()
            .any(|declared| declared.name == kernel && declared.grid_dependency_sync)
    }
}

impl From<&'static [u8]> for ModuleImage {
    fn from(bytes: &'static [u8]) -> Self {
        Self::new(bytes)
    }
}

impl<const N: usize> From<&'static [u8; N]> for ModuleImage {
    fn from(bytes: &'static [u8; N]) -> Self {
        Self::new(bytes)
    }
}

/// A loaded cubin, fatbin or PTX image (`cuModuleLoadData`).
///
/// ```
/// use cuda_streams_driver::{Context, Module};
/// let ctx = Context::new(0).unwrap();
/// // An image of the kernels crate: a fatbin with its kernels' signatures and
/// // CPU twins (which serve the software driver).
/// let module = Module::load(&ctx, &kernels::ELEMENTWISE).unwrap();
/// let kernel = module.function("saxpy").unwrap();
/// assert_eq!(kernel.name(), "saxpy");
/// assert!(module.function("no_such_kernel").is_err());
/// ```
pub struct Module {
    ctx: Arc<Context>,
    raw: CUmodule,
    /// The image it was loaded from, with the signatures it declares.
    pub(crate) image: ModuleImage,
    /// The source it was compiled from, whose parameter lists declarations
    /// are checked against.
    pub(crate) source: Option<SourceInfo>,
}

// SAFETY: module handles may be used from any thread; `Module` only passes it
// to the driver.
unsafe impl Send for Module {}
// SAFETY: as above; all methods take `&self` and only call the driver.
unsafe impl Sync for Module {}

impl Module {
    /// Load an image: bare bytes (`&'static [u8]`), or a [`ModuleImage`]
    /// that declares its kernels' signatures (the kernels crate's images
    /// convert into one: `Module::load(&ctx, &kernels::ELEMENTWISE)`).
    /// The bytes are `'static` because the software driver finds the CPU
    /// twins of an image's kernels by the image's address.
    ///
    /// A declared signature that cannot be checked (a pointer counted by a
    /// parameter that does not exist or is not an integer) is an
    /// [`Error::InvalidSignature`] naming the kernel and the parameter. On the
    /// software driver the declared twins are registered under the bytes; a
    /// kernel registered there before with other parameters is an
    /// [`Error::Twins`].
    ///
    /// On the GPU, an image that is not 8-byte aligned, or a PTX text without
    /// its terminating NUL, is first copied into an aligned, terminated buffer.
    /// A failure on the software driver carries its explanation.
    pub fn load(ctx: &Arc<Context>, image: impl Into<ModuleImage>) -> Result<Arc<Self>> {
        let declared = image.into();
        let image = declared.bytes;
        if image.is_empty() {
            return Err(Error::EmptyImage);
        }
        for kernel in declared.kernels {
            signature::validate(kernel.params).map_err(|source| Error::InvalidSignature {
                kernel: kernel.name.to_string(),
                source,
            })?;
        }
        if ctx.loaded_driver().runs_twins() && !declared.kernels.is_empty() {
            let module = Self::soft_module(ctx, declared, None)?;
            for kernel in declared.kernels {
                if let Some(twin) = kernel.twin {
                    soft_driver::define_kernel(module.raw, kernel.name, kernel.params, twin)?;
                }
            }
            return Ok(module);
        }
        let aligned =
            (!ctx.loaded_driver().runs_twins() && needs_copy(image)).then(|| aligned_copy(image));
        let data = match &aligned {
            Some(words) => words.as_ptr().cast::<std::ffi::c_void>(),
            None => image.as_ptr().cast(),
        };
        // SAFETY: `data` points at a complete image (the original, or an
        // aligned NUL-terminated copy alive until after the call).
        unsafe { Self::load_data(ctx, data, image.len(), declared, None) }
    }

    /// `cuModuleLoadData` of the image at `data` (`bytes` long, for the
    /// error), kept as a module declaring `image`'s kernels.
    ///
    /// # Safety
    /// `data` must point at a complete image (aligned and NUL-terminated
    /// where the driver needs it) that stays alive until this returns.
    unsafe fn load_data(
        ctx: &Arc<Context>,
        data: *const std::ffi::c_void,
        bytes: usize,
        image: ModuleImage,
        source: Option<SourceInfo>,
    ) -> Result<Arc<Self>> {
        ctx.bind()?;
        let mut raw: CUmodule = std::ptr::null_mut();
        // SAFETY: the caller's contract for `data`; the context is current.
        let code = unsafe { (ctx.driver().cuModuleLoadData)(&mut raw, data) };
        if let Err(source) = ctx.driver().check(code) {
            return Err(Error::ModuleLoad {
                bytes,
                source,
                detail: ctx.loaded_driver().last_error_detail(),
            });
        }
        Ok(Arc::new(Self {
            ctx: Arc::clone(ctx),
            raw,
            image,
            source,
        }))
    }

    /// A software-driver module with no image: its kernels are defined from
    /// declarations and their twins.
    fn soft_module(
        ctx: &Arc<Context>,
        image: ModuleImage,
        source: Option<SourceInfo>,
    ) -> Result<Arc<Self>> {
        ctx.bind()?;
        let raw = soft_driver::module_from_declarations()?;
        Ok(Arc::new(Self {
            ctx: Arc::clone(ctx),
            raw,
            image,
            source,
        }))
    }

    /// The software driver's module for a program: nothing to compile;
    /// [`Module::kernel`] checks each declaration against the source and
    /// defines its twin.
    pub(crate) fn from_declarations(ctx: &Arc<Context>, source: SourceInfo) -> Result<Arc<Self>> {
        Self::soft_module(ctx, ModuleImage::new(b"\0"), Some(source))
    }

    /// A module of a compiled program's image (the driver copies it).
    pub(crate) fn load_compiled(
        ctx: &Arc<Context>,
        image: &[u8],
        source: SourceInfo,
    ) -> Result<Arc<Self>> {
        let words = aligned_copy(image);
        // SAFETY: `words` holds the complete image, 8-byte aligned and
        // NUL-terminated, alive until after the call.
        unsafe {
            Self::load_data(
                ctx,
                words.as_ptr().cast(),
                image.len(),
                ModuleImage::new(b"\0"),
                Some(source),
            )
        }
    }

    /// Look up `symbol` (defining the twin first on the software driver)
    /// and give it the declaration's signature.
    pub(crate) fn attach(self: &Arc<Self>, decl: &KernelDecl, symbol: &str) -> Result<Kernel> {
        let twins = self.ctx.loaded_driver().runs_twins();
        if twins && self.image.bytes.len() <= 1 {
            let twin = decl.twin.ok_or_else(|| Error::NoTwin {
                kernel: decl.name.to_string(),
            })?;
            soft_driver::define_kernel(self.raw, decl.name, decl.params, twin)?;
        }
        // Twins are defined under their declared names; a binary's kernels
        // under their (maybe lowered) symbols.
        let lookup = if twins { decl.name } else { symbol };
        let mut kernel = self.function(lookup)?;
        if !twins && let Some(param_info) = sys::optional::func_get_param_info() {
            let raw = kernel.raw;
            let size = |index: usize| {
                let (mut offset, mut size) = (0usize, 0usize);
                // SAFETY: `raw` is a live function of this context's module,
                // from the libcuda the entry point comes from; two valid
                // out-pointers. Past the last parameter it returns an error.
                let code = unsafe { param_info(raw, index, &mut offset, &mut size) };
                (code == sys::CUresult::CUDA_SUCCESS).then_some(size)
            };
            check_param_sizes(decl.params, size).map_err(|reason| Error::DeclarationMismatch {
                kernel: decl.name,
                program: "its binary (cuFuncGetParamInfo)".into(),
                reason,
            })?;
        }
        kernel.name = decl.name.into();
        kernel.signature = Some(Arc::from(decl.params));
        kernel.grid_dependency_sync = decl.grid_dependency_sync;
        Ok(kernel)
    }

    /// Look up a kernel by its (unmangled, `extern "C"`) name.
    ///
    /// A kernel the image declares ([`ModuleImage`]: every image of the
    /// kernels crate) comes with its declared signature, validated at load, so
    /// it launches safely ([`crate::Stream::launch`]); others need the
    /// `unsafe` [`Kernel::with_signature`] first.
    pub fn function(self: &Arc<Self>, name: &str) -> Result<Kernel> {
        let c_name = CString::new(name).map_err(|_| Error::InvalidName {
            name: name.to_string(),
        })?;
        self.ctx.bind()?;
        let mut raw: CUfunction = std::ptr::null_mut();
        // SAFETY: writes one handle through a valid pointer; the name is
        // NUL-terminated; the module is live.
        let code =
            unsafe { (self.ctx.driver().cuModuleGetFunction)(&mut raw, self.raw, c_name.as_ptr()) };
        if let Err(source) = self.ctx.driver().check(code) {
            let declared_without_twin = self
                .image
                .kernels
                .iter()
                .any(|k| k.name == name && k.twin.is_none());
            if self.ctx.loaded_driver().runs_twins() && declared_without_twin {
                return Err(Error::NoTwin {
                    kernel: name.to_string(),
                });
            }
            // An image that declares its kernels knows every name it has:
            // say which, and the closest, whichever driver runs it.
            let mut declared: Vec<&str> = self.image.kernels.iter().map(|k| k.name).collect();
            if let Some(source) = &self.source {
                declared.extend(source.kernels.iter().map(|k| k.name.as_str()));
            }
            let detail = if declared.is_empty() {
                self.ctx.loaded_driver().last_error_detail()
            } else if declared.contains(&name) {
                // There, but not by this lookup: on the software driver a
                // kernel of a compiled program runs as the twin of its
                // declaration, which `Module::kernel` registers.
                if self.ctx.loaded_driver().runs_twins() && self.source.is_some() {
                    Some(format!(
                        "on the software driver a kernel compiled from source runs as the CPU \
                         twin of its declaration: declare `{name}` with kernel! and \
                         Program::declare, then take it with Module::kernel"
                    ))
                } else {
                    self.ctx.loaded_driver().last_error_detail()
                }
            } else {
                Some(crate::features::closest_name::no_such_name(
                    "the module has no kernel named",
                    name,
                    &declared,
                ))
            };
            return Err(Error::FunctionNotFound {
                name: name.to_string(),
                source,
                detail: detail.map(String::into_boxed_str),
            });
        }
        Ok(Kernel {
            module: Arc::clone(self),
            raw,
            name: name.into(),
            // The image's own declaration, never a registry that a later
            // call could change.
            signature: self.image.signature(name).map(Arc::from),
            grid_dependency_sync: self.image.declares_grid_dependency_sync(name),
            partition_function: Arc::default(),
        })
    }

    /// The context it is loaded in.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// The image it was loaded from, with the signatures it declares.
    pub fn image(&self) -> ModuleImage {
        self.image
    }

    /// The raw handle (for interop; it stays owned by this `Module`).
    pub fn as_raw(&self) -> CUmodule {
        self.raw
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        // Kernels launched from this module may still be queued; unloading the
        // code under them is not something CUDA promises to wait for. Modules
        // are dropped rarely, so wait for the context (binding it first).
        match self.ctx.synchronize() {
            Ok(()) => {}
            // The synchronization would invalidate the capture: the context
            // unloads the module after its next one.
            Err(Error::ContextCapturing { .. }) => {
                tracing::debug!("module {:p} unloaded after the open captures", self.raw);
                self.ctx.defer_unload(self.raw);
                return;
            }
            Err(err) => {
                tracing::warn!("leaking module {:p}: {err}", self.raw);
                return;
            }
        }
        let what = format_args!("module {:p}", self.raw);
        self.ctx.release_in_drop(what, "unloading", |driver| {
            // SAFETY: the module is owned by `self` and unloaded once.
            unsafe { (driver.cuModuleUnload)(self.raw) }
        });
    }
}

impl fmt::Debug for Module {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Module").field("raw", &self.raw).finish()
    }
}

/// A kernel function in a loaded [`Module`] (which it keeps loaded), with the
/// signature that checked launches need.
///
/// ```
/// use cuda_streams_driver::{Context, DeviceBuffer, KernelArg, LaunchConfig, Module, Stream};
/// use kernels::ELEMENTWISE;
/// let ctx = Context::new(0).unwrap();
/// let stream = Stream::new(&ctx).unwrap();
/// // saxpy(u64 n, f32 a, const f32* x, f32* y): y = a * x + y; the kernels
/// // crate declares its signature, so it comes with the function.
/// let saxpy = Module::load(&ctx, &ELEMENTWISE).unwrap().function("saxpy").unwrap();
/// assert_eq!(saxpy.signature().unwrap().len(), 4);
/// let x = DeviceBuffer::from_slice(&stream, &[1.0f32, 2.0, 3.0]).unwrap();
/// let mut y = DeviceBuffer::from_slice(&stream, &[10.0f32, 20.0, 30.0]).unwrap();
/// let cfg = LaunchConfig::for_num_elems(3);
/// saxpy.launch(&stream, cfg, &[3u64.into(), 2.0f32.into(), (&x).into(), (&mut y).into()]).unwrap();
/// assert_eq!(y.to_vec(&stream).unwrap(), [12.0, 24.0, 36.0]);
/// // A wrong argument count or kind is caught before the driver sees it.
/// let err = saxpy.launch(&stream, cfg, &[3u64.into(), 2.0f64.into()]).unwrap_err();
/// assert!(err.to_string().contains("takes 4 argument(s) but 2 were given"), "{err}");
/// ```
#[derive(Clone)]
pub struct Kernel {
    module: Arc<Module>,
    raw: CUfunction,
    name: Arc<str>,
    pub(crate) signature: Option<Arc<[Param]>>,
    /// Whether its declaration says it calls `cudaGridDependencySynchronize`
    /// (which programmatic dependent launches need).
    pub(crate) grid_dependency_sync: bool,
    /// Its handle for the partition it was last launched in, shared by its
    /// clones (`partition_function.rs`).
    pub(crate) partition_function: Arc<crate::features::partition_function::PartitionFunction>,
}

// SAFETY: function handles may be used from any thread; `Kernel` only passes it
// to the driver, and the module it belongs to is kept loaded by the Arc.
unsafe impl Send for Kernel {}
// SAFETY: as above; immutable after creation.
unsafe impl Sync for Kernel {}

impl Kernel {
    /// Declare the kernel's parameters, so that it launches with
    /// [`crate::Stream::launch`], which checks every argument against them.
    /// Fails when a pointer's extent names a parameter that is not an
    /// integer scalar.
    ///
    /// ```
    /// use cuda_streams_driver::{Context, Module};
    /// use cuda_streams_driver::sys::signature::{Access, Extent, Param, Scalar};
    /// let ctx = Context::new(0).unwrap();
    /// let fill = Module::load(&ctx, &kernels::ELEMENTWISE).unwrap().function("fill_u32").unwrap();
    /// // SAFETY: fill_u32(u64 n, u32 value, u32* out) writes out[0..n].
    /// let fill = unsafe {
    ///     fill.with_signature(&[
    ///         Param::Scalar(Scalar::U64),
    ///         Param::Scalar(Scalar::U32),
    ///         Param::Pointer { elem: Scalar::U32, access: Access::Write, extent: Extent::Arg(0) },
    ///     ])
    /// }.unwrap();
    /// assert_eq!(fill.signature().unwrap().len(), 3);
    /// ```
    ///
    /// # Safety
    /// The parameters must be the kernel's own: their count, order and
    /// exact types; a pointer the kernel writes through must be declared
    /// [`Access::Write`](sys::signature::Access::Write); and the kernel must
    /// touch no element of a pointer beyond its declared extent, counted from
    /// the pointer. Checked launches trust this declaration.
    pub unsafe fn with_signature(mut self, params: &[Param]) -> crate::ground::error::Result<Self> {
        signature::validate(params).map_err(|source| Error::InvalidSignature {
            kernel: self.name.to_string(),
            source,
        })?;
        self.signature = Some(params.into());
        Ok(self)
    }

    /// The declared parameters, if any.
    pub fn signature(&self) -> Option<&[Param]> {
        self.signature.as_deref()
    }

    /// Whether its declaration says that it calls
    /// `cudaGridDependencySynchronize`, so that it may be launched with
    /// [`crate::Stream::launch_programmatic`].
    pub fn declares_grid_dependency_sync(&self) -> bool {
        self.grid_dependency_sync
    }

    /// The kernel's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The module it comes from.
    pub fn module(&self) -> &Arc<Module> {
        &self.module
    }

    /// The context it is loaded in.
    pub fn context(&self) -> &Arc<Context> {
        &self.module.ctx
    }

    /// The raw handle (for interop).
    pub fn as_raw(&self) -> CUfunction {
        self.raw
    }
}

impl fmt::Debug for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Kernel")
            .field("name", &self.name)
            .field("signature", &self.signature)
            .finish()
    }
}

/// Fatbin and ELF (cubin) images are binary; anything else is taken as PTX text.
fn needs_copy(image: &[u8]) -> bool {
    const FATBIN_MAGIC: [u8; 4] = 0xBA55_ED50u32.to_le_bytes();
    const ELF_MAGIC: [u8; 4] = *b"\x7fELF";
    let binary = image.starts_with(&FATBIN_MAGIC) || image.starts_with(&ELF_MAGIC);
    !(image.as_ptr() as usize).is_multiple_of(8) || (!binary && image.last() != Some(&0))
}

/// The image in 8-byte words, followed by at least one zero byte.
fn aligned_copy(image: &[u8]) -> Vec<u64> {
    let mut words = vec![0u64; image.len() / 8 + 1];
    // SAFETY: `words` holds at least `image.len() + 1` bytes; the regions are distinct.
    unsafe {
        std::ptr::copy_nonoverlapping(image.as_ptr(), words.as_mut_ptr().cast::<u8>(), image.len());
    }
    words
}

/// The software driver's explanation of the last failure, when it has one.
/// Compare a declaration's parameters with the sizes a binary reports
/// (`size(i)`: parameter `i`'s size in bytes, `None` past the last one):
/// the count and each size must match. Types of one size (`f32`, `u32`) or
/// a pointer's element type cannot be told apart this way.
fn check_param_sizes(
    params: &[Param],
    size: impl Fn(usize) -> Option<usize>,
) -> std::result::Result<(), String> {
    for (index, param) in params.iter().enumerate() {
        match size(index) {
            Some(bytes) if bytes == param.size() => {}
            Some(bytes) => {
                return Err(format!(
                    "parameter {index} is {bytes} bytes in the binary, {} as declared ({param:?})",
                    param.size()
                ));
            }
            None => {
                return Err(format!(
                    "the binary's kernel takes {index} parameter(s), the declaration {}",
                    params.len()
                ));
            }
        }
    }
    if size(params.len()).is_some() {
        return Err(format!(
            "the binary's kernel takes more than the {} parameter(s) declared",
            params.len()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_are_copied_only_when_needed() {
        let ptx = b"// ptx text without NUL";
        let copy = aligned_copy(ptx);
        // SAFETY: `copy` holds at least ptx.len() + 1 bytes.
        let bytes =
            unsafe { std::slice::from_raw_parts(copy.as_ptr().cast::<u8>(), ptx.len() + 1) };
        assert_eq!(&bytes[..ptx.len()], ptx);
        assert_eq!(bytes[ptx.len()], 0);
        let words = [u64::from_le_bytes([0x50, 0xED, 0x55, 0xBA, 1, 0, 0, 0]); 2];
        // SAFETY: viewing two u64s as their 16 bytes.
        let fatbin = unsafe { std::slice::from_raw_parts(words.as_ptr().cast::<u8>(), 16) };
        assert!(!needs_copy(fatbin));
        assert!(needs_copy(&fatbin[1..]));
    }

    /// `cuFuncGetParamInfo` as a binary of `sizes` answers it.
    fn binary(sizes: &[usize]) -> impl Fn(usize) -> Option<usize> + '_ {
        |index| sizes.get(index).copied()
    }

    #[test]
    fn a_binarys_parameter_sizes_must_match_the_declaration() {
        use sys::signature::{Access, Extent, Scalar};
        // saxpy(u64 n, f32 a, const f32* x, f32* y)
        let saxpy = [
            Param::Scalar(Scalar::U64),
            Param::Scalar(Scalar::F32),
            Param::Pointer {
                elem: Scalar::F32,
                access: Access::Read,
                extent: Extent::Arg(0),
            },
            Param::Pointer {
                elem: Scalar::F32,
                access: Access::Write,
                extent: Extent::Arg(0),
            },
        ];
        assert_eq!(check_param_sizes(&saxpy, binary(&[8, 4, 8, 8])), Ok(()));

        let wider = check_param_sizes(&saxpy, binary(&[8, 8, 8, 8])).unwrap_err();
        assert!(
            wider.starts_with("parameter 1 is 8 bytes in the binary, 4 as declared"),
            "{wider}"
        );
        let fewer = check_param_sizes(&saxpy, binary(&[8, 4, 8])).unwrap_err();
        assert_eq!(
            fewer,
            "the binary's kernel takes 3 parameter(s), the declaration 4"
        );
        let more = check_param_sizes(&saxpy, binary(&[8, 4, 8, 8, 4])).unwrap_err();
        assert_eq!(
            more,
            "the binary's kernel takes more than the 4 parameter(s) declared"
        );
        assert_eq!(check_param_sizes(&[], binary(&[])), Ok(()));
    }
}
