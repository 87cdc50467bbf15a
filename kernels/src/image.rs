//! A compiled kernel image, embedded in the binary, with its CPU twins.

use driver::ModuleImage;
use soft_driver::TwinSpec;
use std::sync::OnceLock;

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
    twins: &'static [TwinSpec],
    registered: OnceLock<()>,
}

impl KernelImage {
    pub(crate) const fn new(
        name: &'static str,
        bytes: &'static Aligned<[u8]>,
        twins: &'static [TwinSpec],
    ) -> Self {
        Self {
            name,
            bytes,
            twins,
            registered: OnceLock::new(),
        }
    }

    /// The source's name: `elementwise` for `kernels/elementwise.cu`.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The fatbin, for `cuModuleLoadData`; 64-byte aligned, and the same
    /// address every time (the software driver finds the twins by it).
    ///
    /// The first call registers the CPU twins with the software driver.
    pub fn fatbin(&'static self) -> &'static [u8] {
        let bytes = &self.bytes.0;
        self.registered.get_or_init(|| {
            // SAFETY: each twin's parameters are its kernel's in `kernels/*.cu`
            // (tests/images.rs checks them against the sources), and each
            // twin touches only the declared extents of its pointers
            // (tests/kernels.rs runs them against `reference`).
            let registered = unsafe { soft_driver::register_image(bytes, self.twins) };
            // This runs before anything outside the crate can see the bytes'
            // address, so no other registration can come first, and the
            // declarations are validated by this crate's tests: an error here
            // is a bug in this crate's own tables.
            if let Err(err) = registered {
                panic!(
                    "the kernels crate's image `{}` is invalid: {err}",
                    self.name
                );
            }
        });
        bytes
    }

    /// The image with its kernels' declared signatures, for
    /// [`Module::load`](driver::Module::load) (`&IMAGE` converts into it too).
    pub fn module_image(&'static self) -> ModuleImage {
        // SAFETY: as in `fatbin`: the twins' parameters are the kernels' own
        // and the twins are sound; `fatbin()` returns this image's bytes.
        unsafe { ModuleImage::declared(self.fatbin(), self.twins) }
    }

    /// The names of the kernel functions in the image, for `cuModuleGetFunction`.
    pub fn functions(&self) -> impl Iterator<Item = &'static str> + use<> {
        self.twins.iter().map(|twin| twin.name)
    }

    /// The parameters of `function` (exact scalar types; pointers with their
    /// element type, access and extent), or `None` when the image has no such
    /// function.
    pub fn signature(
        &self,
        function: &str,
    ) -> Option<&'static [soft_driver::sys::signature::Param]> {
        self.twin(function).map(|twin| twin.params)
    }

    /// The CPU twin of `function`, or `None` when the image has no such function.
    pub fn twin(&self, function: &str) -> Option<&'static TwinSpec> {
        self.twins.iter().find(|twin| twin.name == function)
    }

    /// All the image's twins, one per function.
    pub fn twins(&self) -> &'static [TwinSpec] {
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
    fn every_declared_signature_is_valid() {
        for image in crate::ALL {
            for twin in image.twins() {
                signature::validate(twin.params)
                    .unwrap_or_else(|err| panic!("{}::{}: {err}", image.name(), twin.name));
            }
            // Registering the twins (which validates them too) succeeds.
            assert!(!image.fatbin().is_empty());
        }
    }
}
