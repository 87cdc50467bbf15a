//! A compiled kernel image, embedded in the binary, with its CPU twins.

use driver::KernelDecl;
use driver::ModuleImage;

/// Bytes aligned for `cuModuleLoadData`, which wants an image at least 8-byte
/// aligned; 64 also suits the ELF sections inside a fatbin.
#[repr(C, align(64))]
pub(crate) struct Aligned<T: ?Sized>(pub(crate) T);

/// One fatbin from `kernels/*.cu` and what it contains.
///
/// Getting the bytes with [`fatbin`](Self::fatbin) first registers the image's
/// CPU twins with the software driver, so whichever driver loads the image can
/// run its kernels. `Module::load(&ctx, &IMAGE)` loads it with its kernels'
/// signatures (a [`ModuleImage`] that declares them), so they launch checked;
/// nothing outside this crate can declare or change them.
///
/// ```
/// use cuda_streams_kernels::driver::{Context, Module};
/// let image = &cuda_streams_kernels::ELEMENTWISE;
/// assert_eq!(image.name(), "elementwise");
/// assert!(image.functions().any(|f| f == "saxpy"));
/// let sizes: Vec<usize> = image.signature("saxpy").unwrap().iter().map(|p| p.size()).collect();
/// assert_eq!(sizes, [8, 4, 8, 8]);
/// let bytes: &'static [u8] = image.fatbin(); // ready for cuModuleLoadData
/// assert_eq!(bytes.as_ptr() as usize % 64, 0);
/// let ctx = Context::new(0).unwrap();
/// let saxpy = Module::load(&ctx, image).unwrap().function("saxpy").unwrap();
/// assert_eq!(saxpy.signature(), image.signature("saxpy"));
/// ```
pub struct KernelImage {
    name: &'static str,
    bytes: &'static Aligned<[u8]>,
    twins: &'static [KernelDecl],
}

impl KernelImage {
    pub(crate) const fn new(
        name: &'static str,
        bytes: &'static Aligned<[u8]>,
        twins: &'static [KernelDecl],
    ) -> Self {
        Self { name, bytes, twins }
    }

    /// The source's name: `elementwise` for `kernels/elementwise.cu`.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The fatbin, for `cuModuleLoadData`; 64-byte aligned, and the same
    /// address every time. Bare bytes declare nothing: load
    /// [`module_image`](Self::module_image) (or `&IMAGE`) for the kernels'
    /// declarations and, on the software driver, their twins.
    pub fn fatbin(&'static self) -> &'static [u8] {
        &self.bytes.0
    }

    /// The image with its kernels' declared signatures, for
    /// [`Module::load`](driver::Module::load) (`&IMAGE` converts into it too).
    pub fn module_image(&'static self) -> ModuleImage {
        // SAFETY: each declaration's parameters are its kernel's in
        // `kernels/*.cu` (tests/images.rs checks them against the sources,
        // as the run-time compiler's check does), and `fatbin()` returns
        // this image's bytes.
        unsafe { ModuleImage::declared(self.fatbin(), self.twins) }
    }

    /// The names of the kernel functions in the image, for `cuModuleGetFunction`.
    pub fn functions(&self) -> impl Iterator<Item = &'static str> + use<> {
        self.twins.iter().map(|decl| decl.name)
    }

    /// The parameters of `function` (exact scalar types; pointers with their
    /// element type, access and extent), or `None` when the image has no such
    /// function.
    pub fn signature(
        &self,
        function: &str,
    ) -> Option<&'static [soft_driver::sys::signature::Param]> {
        self.twin(function).map(|decl| decl.params)
    }

    /// The declaration (and CPU twin) of `function`, or `None` when the
    /// image has no such function.
    pub fn twin(&self, function: &str) -> Option<&'static KernelDecl> {
        self.twins.iter().find(|decl| decl.name == function)
    }

    /// All the image's declarations, one per function.
    pub fn twins(&self) -> &'static [KernelDecl] {
        self.twins
    }
}

impl From<&'static KernelImage> for ModuleImage {
    fn from(image: &'static KernelImage) -> Self {
        image.module_image()
    }
}

impl std::fmt::Debug for KernelImage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelImage")
            .field("name", &self.name)
            .field("bytes", &self.bytes.0.len())
            .field("functions", &self.functions().collect::<Vec<_>>())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use soft_driver::sys::signature;

    #[test]
    fn every_declared_signature_is_valid_and_has_a_twin() {
        for image in crate::ALL {
            for decl in image.twins() {
                signature::validate(decl.params)
                    .unwrap_or_else(|err| panic!("{}::{}: {err}", image.name(), decl.name));
                assert!(decl.twin.is_some(), "{} has no twin", decl.name);
            }
            assert!(!image.fatbin().is_empty());
        }
    }
}
