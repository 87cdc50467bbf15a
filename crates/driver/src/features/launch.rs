//! Launching on a stream: the checks against a kernel's signature and the
//! enqueue (the arguments are `kernel_arg`'s, the configuration
//! `launch_config`'s, the driver call `launch_raw`'s).

use crate::enqueue::protocol::{Use, Work};
use crate::features::graph::{refuse_eager_condition_params, refuse_eager_conditions};
use crate::features::kernel_arg::KernelArg;
use crate::features::launch_config::LaunchConfig;
use crate::features::launch_raw::{LaunchAttrs, launch_raw};
use crate::features::module::Kernel;
use crate::features::pdl_policy::Dependency;
use crate::ground::arg_kind::ArgKind;
use crate::ground::error::{Error, Result};
use crate::objects::stream::Stream;
use sys::signature::{Access, Extent, Param, Scalar};

impl Stream {
    /// Launch `kernel` with `config` and `args`, asynchronously, after
    /// checking every argument against the kernel's signature.
    ///
    /// The kernel must have a signature: a kernel of an image that declares
    /// it ([`ModuleImage`](crate::ModuleImage), as the kernels crate's images
    /// do) gets it when looked up
    /// ([`Module::function`](crate::Module::function)); others are declared
    /// with the `unsafe` [`Kernel::with_signature`], or launched with
    /// [`Stream::launch_unchecked`]. Checked before the driver sees anything:
    /// the configuration ([`LaunchConfig::validate`]); the argument count;
    /// each scalar's exact type (an `f64` is no `f32`, a `u32` no `u64`); each
    /// pointer parameter gets a buffer (never a raw pointer) of its element
    /// type, lent `&mut` when the kernel writes it, and holding at least the
    /// elements the kernel is told to touch; every buffer belongs to this
    /// stream's context. Then each buffer is registered as used on this
    /// stream, so none is freed, or handed to the host, before the kernel has
    /// run.
    ///
    /// ```
    /// use cuda_streams_driver::{Context, DeviceBuffer, LaunchConfig, Module, Stream};
    /// use kernels::ELEMENTWISE;
    /// let ctx = Context::new(0).unwrap();
    /// let stream = Stream::new(&ctx).unwrap();
    /// // fill_f32(u64 n, f32 value, f32* out): its signature comes with it.
    /// let fill = Module::load(&ctx, &ELEMENTWISE).unwrap().function("fill_f32").unwrap();
    /// let mut out = DeviceBuffer::<f32>::new_async(&stream, 4).unwrap();
    /// let cfg = LaunchConfig::for_num_elems(4);
    /// stream.launch(&fill, cfg, &[4u64.into(), 2.5f32.into(), (&mut out).into()]).unwrap();
    /// assert_eq!(out.to_vec(&stream).unwrap(), [2.5; 4]);
    /// // Each of these is refused before the driver sees it:
    /// let refused = |args: &[cuda_streams_driver::KernelArg<'_>], says: &str| {
    ///     let err = stream.launch(&fill, cfg, args).unwrap_err();
    ///     assert!(err.to_string().contains(says), "{err}");
    /// };
    /// refused(&[4u32.into(), 2.5f32.into(), (&mut out).into()], "expected u64");
    /// refused(&[4u64.into(), 2.5.into(), (&mut out).into()], "expected f32");
    /// refused(&[5u64.into(), 2.5f32.into(), (&mut out).into()], "holds 4 element(s)");
    /// refused(&[4u64.into(), 2.5f32.into(), (&out).into()], "lent as &");
    /// ```
    pub fn launch(
        &self,
        kernel: &Kernel,
        config: LaunchConfig,
        args: &[KernelArg<'_>],
    ) -> Result<()> {
        self.launch_checked(kernel, config, args, Dependency::Stream)
    }

    /// [`Stream::launch`], ordered after the work before it as `dependency`
    /// says (plainly, or as a programmatic dependent launch).
    #[inline]
    pub(crate) fn launch_checked(
        &self,
        kernel: &Kernel,
        config: LaunchConfig,
        args: &[KernelArg<'_>],
        dependency: Dependency,
    ) -> Result<()> {
        let Some(signature) = kernel.signature() else {
            return Err(kernel.unchecked_error());
        };
        // SAFETY: it is the kernel's signature.
        unsafe { self.launch_against(kernel, signature, config, args, dependency) }
    }

    /// [`Stream::launch`] with the kernel's signature given: a declared
    /// kernel's typed launcher passes its declaration's constant, so that,
    /// inlined there, the check folds against the arguments' known types.
    ///
    /// `dependency` says whether it was asked to be a programmatic
    /// dependent launch (`features/dependent_launch.rs`).
    ///
    /// # Safety
    /// `signature` is `kernel`'s signature.
    #[inline(always)]
    pub(crate) unsafe fn launch_against(
        &self,
        kernel: &Kernel,
        signature: &[Param],
        config: LaunchConfig,
        args: &[KernelArg<'_>],
        dependency: Dependency,
    ) -> Result<()> {
        let mut uses = CheckedUses::new();
        kernel.check_params(signature, args, &mut uses)?;
        refuse_eager_condition_params(kernel, signature)?;
        // SAFETY: every argument matches the kernel's declared parameters
        // (checked above against its signature, the caller's promise): exact
        // scalar types, and buffers of the declared element type that hold
        // every element the kernel touches, lent mutably where it writes. The
        // declaration is the contract of the `unsafe` `with_signature`, or of
        // the image's.
        unsafe { self.launch_with(kernel, config, args, uses.iter().copied(), dependency) }
    }

    /// Launch `kernel` without checking `args` against a signature (one is
    /// not needed); the configuration, the buffers' contexts and their use
    /// tracking are still handled as by [`Stream::launch`].
    ///
    /// # Safety
    /// The arguments must be what the kernel's parameters are, in count,
    /// order and type, and every pointer must address memory that holds what
    /// the kernel reads and writes through it, for as long as the kernel
    /// runs (buffers passed as [`KernelArg`]s stay allocated by themselves;
    /// raw pointers are the caller's to keep alive). The kernel must not
    /// write through a buffer lent as `&` (a shared borrow: the host may be
    /// reading it).
    pub unsafe fn launch_unchecked(
        &self,
        kernel: &Kernel,
        config: LaunchConfig,
        args: &[KernelArg<'_>],
    ) -> Result<()> {
        refuse_eager_conditions(kernel, args)?;
        let uses = args
            .iter()
            .filter_map(|arg| arg.buffer.as_ref())
            .map(|buffer| Use::Device(buffer.lent.memory, buffer.lent.writable));
        // SAFETY: the caller's contract, as above.
        unsafe { self.launch_with(kernel, config, args, uses, Dependency::Stream) }
    }

    /// The launch itself, the buffers used as `uses` says: for a checked
    /// launch, what [`Kernel::check_params`] found (the stream-order tracker
    /// sees each buffer over the bytes the signature says the kernel
    /// touches, read or written as declared); for an unchecked one, each
    /// buffer argument whole, written when lent mutably.
    /// A programmatic launch takes the same step as a plain one: its kernel
    /// touches nothing before `cudaGridDependencySynchronize`
    /// (`features/dependent_launch.rs` says why that is enough).
    ///
    /// # Safety
    /// As for [`Stream::launch_unchecked`]; `uses` are the buffers of
    /// `args`, as described above.
    unsafe fn launch_with<'u>(
        &self,
        kernel: &Kernel,
        config: LaunchConfig,
        args: &[KernelArg<'_>],
        uses: impl IntoIterator<Item = Use<'u>> + Clone,
        dependency: Dependency,
    ) -> Result<()> {
        config.validate()?;
        self.check_context("the kernel", kernel.context())?;
        let programmatic = dependency.resolve(kernel, self.context().info())?;
        let function = self.function_for(kernel)?;
        self.enqueue_tracked(uses, Work::KernelLaunch, |driver, stream| {
            // SAFETY: buffer arguments stay allocated until the stream passes
            // the launch (tracked); the function is the kernel's for this
            // stream, alive while the kernel and the stream are; what the
            // arguments mean to the kernel is the caller's contract.
            unsafe {
                launch_raw(
                    driver,
                    stream,
                    function,
                    config,
                    args,
                    LaunchAttrs::programmatic(programmatic),
                )
            }
        })
        .map_err(|err| name_the_racing_argument(err, kernel, args))
    }

    /// The handle `cuLaunchKernel` takes for `kernel` on this stream: the
    /// kernel's own, or on a partition's stream on a GPU, the same kernel
    /// loaded for the partition (`Kernel::function_in`), because a
    /// module's function runs only in the context it was loaded in.
    /// Inlined: on a stream of no partition it is one downcast per launch.
    #[inline]
    pub(crate) fn function_for(&self, kernel: &Kernel) -> Result<sys::CUfunction> {
        match self.partition() {
            Some(partition) if !self.context().loaded_driver().runs_twins() => {
                kernel.function_in(partition)
            }
            _ => Ok(kernel.as_raw()),
        }
    }
}

/// A race found for a launch names the kernel, and the argument whose
/// buffer starts where the racing bytes' buffer does: the tracker knows
/// addresses, the launch knows what they were passed as.
#[cold]
fn name_the_racing_argument(err: Error, kernel: &Kernel, args: &[KernelArg<'_>]) -> Error {
    let Error::UnorderedAccess(mut race) = err else {
        return err;
    };
    race.later.kernel = Some(kernel.name().to_string());
    race.later.argument = args.iter().position(|arg| {
        arg.buffer
            .is_some_and(|buffer| buffer.lent.memory.use_bytes().0 == race.buffer)
    });
    Error::UnorderedAccess(race)
}

impl Kernel {
    /// Launch on `stream`; the same as [`Stream::launch`].
    pub fn launch(
        &self,
        stream: &Stream,
        config: LaunchConfig,
        args: &[KernelArg<'_>],
    ) -> Result<()> {
        stream.launch(self, config, args)
    }

    /// Check `args` against the signature, as [`Stream::launch`] does.
    pub fn check_args(&self, args: &[KernelArg<'_>]) -> Result<()> {
        self.check_into(args, &mut CheckedUses::new())
    }

    /// [`Kernel::check_args`], pushing each buffer argument's use, in
    /// order, onto `uses` (the caller's, on its stack: nothing is returned
    /// by value or allocated for up to eight buffers). The loop is the only
    /// work on the success path; every error is built out of line.
    #[inline]
    pub(crate) fn check_into<'a>(
        &self,
        args: &'a [KernelArg<'_>],
        uses: &mut CheckedUses<'a>,
    ) -> Result<()> {
        let Some(signature) = self.signature() else {
            return Err(self.unchecked_error());
        };
        self.check_params(signature, args, uses)
    }

    /// [`Kernel::check_into`] against `signature`, which callers take from
    /// the kernel: inlined everywhere, so that where the signature is a
    /// constant (a declared kernel's) and the arguments were just built from
    /// typed values, the loop folds down to the length comparisons.
    #[inline(always)]
    fn check_params<'a>(
        &self,
        signature: &[Param],
        args: &'a [KernelArg<'_>],
        uses: &mut CheckedUses<'a>,
    ) -> Result<()> {
        if signature.len() != args.len() {
            return Err(self.count_error(signature.len(), args.len()));
        }
        for (index, (param, arg)) in signature.iter().zip(args).enumerate() {
            match *param {
                Param::Scalar(scalar) => {
                    if arg.scalar() != Some(scalar) {
                        return Err(self.mismatch(index, *param, arg));
                    }
                }
                Param::Condition => {
                    if arg.kind() != ArgKind::Condition {
                        return Err(self.mismatch(index, *param, arg));
                    }
                }
                Param::Pointer {
                    elem,
                    access,
                    extent,
                } => {
                    let Some(buffer) = &arg.buffer else {
                        return Err(self.mismatch(index, *param, arg));
                    };
                    let writes = access == Access::Write;
                    if buffer.elem != Some(elem) || (writes && !buffer.lent.writable) {
                        return Err(self.mismatch(index, *param, arg));
                    }
                    let count = match extent {
                        Extent::Elements(count) => count,
                        // The signature was validated: the index is an integer scalar,
                        // whose argument was checked above or is checked below.
                        Extent::Arg(at) => match args.get(at).and_then(KernelArg::count) {
                            Some(count) => count,
                            None => return Err(self.mismatch(at, signature[at], &args[at])),
                        },
                    };
                    match count.checked_mul(elem.size() as u64) {
                        Some(needed) if needed <= buffer.bytes as u64 => {
                            uses.push(Use::Extent(&buffer.lent, needed as usize, writes));
                        }
                        _ => return Err(self.too_short(index, count, elem, buffer.bytes)),
                    }
                }
            }
        }
        Ok(())
    }

    #[cold]
    pub(crate) fn unchecked_error(&self) -> Error {
        Error::UncheckedKernel {
            kernel: self.name().to_string(),
        }
    }

    #[cold]
    fn count_error(&self, expected: usize, actual: usize) -> Error {
        Error::ArgumentCount {
            kernel: self.name().to_string(),
            expected,
            actual,
        }
    }

    #[cold]
    fn mismatch(&self, index: usize, expected: Param, arg: &KernelArg<'_>) -> Error {
        Error::ArgumentMismatch {
            kernel: self.name().to_string(),
            index,
            expected,
            actual: arg.kind(),
        }
    }

    #[cold]
    fn too_short(&self, index: usize, elements: u64, elem: Scalar, bytes: usize) -> Error {
        Error::ArgumentTooShort {
            kernel: self.name().to_string(),
            index,
            elements,
            elem,
            bytes,
        }
    }
}

/// What a checked launch touches through its buffer arguments, in order
/// (each one's first bytes, written or not: the signature's extent and
/// access); on the stack for up to eight buffers.
pub(crate) type CheckedUses<'a> = smallvec::SmallVec<[Use<'a>; 8]>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Context, DeviceBuffer, Module};

    #[test]
    fn a_kernel_without_a_signature_launches_only_unchecked() {
        let ctx = Context::new(0).unwrap();
        let stream = Stream::new(&ctx).unwrap();
        crate::kernel! {
            struct FillU32: fn fill_u32(n: u64, value: u32, out: &mut [u32; n]);
            twin = per_grid(|_, _n, value, out| out.fill(value));
        }
        use crate::DeclaredKernel;
        static DECLS: &[crate::KernelDecl] = &[FillU32::DECL];
        // SAFETY: fill_u32(u64 n, u32 value, u32* out) writes out[0..n].
        let image = unsafe { crate::ModuleImage::declared(kernels::ELEMENTWISE.fatbin(), DECLS) };
        let module = Module::load(&ctx, image).unwrap();
        let mut fill = module.function("fill_u32").unwrap();
        // As a kernel of an image nobody declared would be.
        fill.signature = None;
        let mut out = DeviceBuffer::<u32>::new_async(&stream, 8).unwrap();
        let cfg = LaunchConfig::for_num_elems(8);
        // A declared type around it refuses too: its fast path needs the
        // kernel's signature to be the declaration, the checked path one.
        let err = FillU32::from_kernel(fill.clone())
            .launch(&stream, cfg, 8, 3, &mut out)
            .unwrap_err();
        assert!(matches!(err, Error::UncheckedKernel { .. }), "{err:?}");
        assert_eq!(stream.metrics().kernel_launches, 0);
        let args = [KernelArg::from(8u64), 3u32.into(), (&mut out).into()];
        let err = stream.launch(&fill, cfg, &args).unwrap_err();
        assert!(matches!(err, Error::UncheckedKernel { .. }), "{err:?}");
        assert!(err.to_string().contains("fill_u32"), "{err}");
        // SAFETY: fill_u32(u64 n, u32 value, u32* out) over a buffer of n u32s.
        unsafe { stream.launch_unchecked(&fill, cfg, &args) }.unwrap();
        assert_eq!(out.to_vec(&stream).unwrap(), [3; 8]);
    }
}
