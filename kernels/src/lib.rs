//! The CUDA kernels cuda-streams needs, as committed fatbins, with CPU twins.
//!
//! Each `kernels/<name>.cu` is compiled by `cargo xtask build-kernels` (nvcc 13.0)
//! into `kernels/<name>.fatbin` — SASS for sm_80, sm_86, sm_89, sm_90, sm_100 and
//! sm_120, PTX for compute_80 and compute_90 — which is committed and embedded
//! here, so building needs no CUDA toolkit. `cargo xtask build-kernels --check` fails when a
//! committed image is stale.
//!
//! | image | function | arguments |
//! | --- | --- | --- |
//! | [`ELEMENTWISE`] | `saxpy` | `(u64 n, f32 a, const f32* x, f32* y)`: `y[i] = fma(a, x[i], y[i])` |
//! | | `fill_f32` | `(u64 n, f32 value, f32* out)` |
//! | | `fill_u32` | `(u64 n, u32 value, u32* out)` |
//! | | `scale_add` | `(u64 n, f32 a, const f32* x, f32 b, const f32* y, f32* out)`: `out[i] = fma(a, x[i], b * y[i])` |
//! | | `chain_step_f32` | `(u64 n, const f32* x, f32* y)`: `y[i] = x[i] + 1` after `cudaGridDependencySynchronize()` (programmatic dependent launch) |
//! | [`REDUCE`] | `checksum` | `(u64 n, const u32* data, u64* out)`: `*out +=` [`reference::checksum`]`(data)` |
//! | [`TIMING`] | `spin` | `(u64 nanoseconds)`: busy-waits on `%globaltimer` |
//! | [`COMPUTE`] | `compute` | `(u64 n, u32 iterations, const f32* x, f32* y)`: `iterations` dependent FMAs per element |
//!
//! Pointers are `CUdeviceptr`s (8 bytes). Every kernel loops grid-stride over the
//! flattened thread index, so **any launch shape is correct** (1-, 2- or 3-D, any
//! block size up to the device's limit, no dynamic shared memory); a typical
//! launch is blocks of 256 threads and enough blocks to fill the GPU, e.g.
//! `min(ceil(n / 256), 4 * SMs)`. `spin` needs one thread: every thread waits the
//! full time on its own. `checksum` *adds* to `*out`: zero it first.
//!
//! [`typed`] has a safe method per kernel (`Elementwise::saxpy`, …) taking
//! buffers of the right element type and checking their lengths; the raw
//! kernels of an image loaded with its signatures (`Module::load(&ctx,
//! &ELEMENTWISE)`) come with them from `Module::function`, so
//! `Stream::launch` checks their arguments too. The signatures are declared
//! here, beside the twins, and nothing outside this crate can change them.
//!
//! Floating-point results are bit-identical to [`reference`](mod@reference): the CUDA source
//! writes every fused multiply-add as `fmaf`, the reference as `f32::mul_add`.
//!
//! Each kernel is declared in [`twins`] with `driver::kernel!`, as a user
//! kernel is, with a safe per-grid CPU twin: on the software driver,
//! `Module::load(&ctx, &IMAGE)` makes the module from those declarations.
//! The `spin` twin sleeps instead of spinning: the stream is busy for the
//! time asked, without using a core.
//!
//! ```
//! use cuda_streams_kernels as kernels;
//! for image in kernels::ALL {
//!     println!("{}: {} bytes, {:?}", image.name(), image.fatbin().len(),
//!              image.functions().collect::<Vec<_>>());
//! }
//! ```

mod image;
pub mod reference;
pub mod twins;
pub mod typed;

/// The safe driver layer the typed wrappers launch through.
pub use driver;

pub use driver::{KernelDecl, LaunchDims};
use image::Aligned;
pub use image::KernelImage;
pub use twins::{
    ChainStepF32, Checksum, Compute, CountWhileBelow, FillF32, FillU32, JacobiSweep, Saxpy,
    ScaleAdd, SetWhileF32Above, Spin,
};

/// A [`KernelImage`] for `kernels/<name>.fatbin`. The bytes live in their own
/// static so they have one fixed address for the whole run.
macro_rules! kernel_image {
    ($name:literal, $twins:expr) => {{
        static BYTES: &Aligned<[u8]> = &Aligned(*include_bytes!(concat!("../", $name, ".fatbin")));
        KernelImage::new($name, BYTES, $twins)
    }};
}

/// `kernels/elementwise.cu`: `saxpy`, `fill_f32`, `fill_u32`, `scale_add`,
/// `chain_step_f32`.
pub static ELEMENTWISE: KernelImage = kernel_image!("elementwise", twins::ELEMENTWISE);

/// `kernels/reduce.cu`: `checksum`.
pub static REDUCE: KernelImage = kernel_image!("reduce", twins::REDUCE);

/// `kernels/timing.cu`: `spin`.
pub static TIMING: KernelImage = kernel_image!("timing", twins::TIMING);

/// `kernels/compute.cu`: `compute`.
pub static COMPUTE: KernelImage = kernel_image!("compute", twins::COMPUTE);

/// `kernels/solver.cu`: `jacobi_sweep`, `set_while_f32_above` (a graph's
/// WHILE loop to a tolerance), `count_while_below` (a loop of a count).
pub static SOLVER: KernelImage = kernel_image!("solver", twins::SOLVER);

/// Every image above.
pub static ALL: &[&KernelImage] = &[&ELEMENTWISE, &REDUCE, &TIMING, &COMPUTE, &SOLVER];

/// The image holding `function`, if any of ours does.
///
/// ```
/// let image = cuda_streams_kernels::image_of("spin").unwrap();
/// assert_eq!(image.name(), "timing");
/// ```
pub fn image_of(function: &str) -> Option<&'static KernelImage> {
    ALL.iter()
        .copied()
        .find(|image| image.twin(function).is_some())
}
