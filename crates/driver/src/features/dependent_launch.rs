//! Programmatic dependent launch (PDL, compute capability 9.0 and later):
//! a kernel launched with `CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`
//! may start while the kernel ahead of it on the stream is still running,
//! and waits for that kernel's writes in `cudaGridDependencySynchronize`.
//! Its prologue (index arithmetic, loads of constants) then overlaps the
//! previous kernel's tail: 2.75–3.17 µs a kernel instead of 3.93 µs for a
//! chain of dependent kernels on an H200.
//!
//! **Who may be launched so.** Only a kernel whose declaration says that
//! it calls `cudaGridDependencySynchronize` before it touches memory that
//! earlier work on its stream writes (`calls cudaGridDependencySynchronize;`
//! in [`kernel!`](crate::kernel!), [`KernelDecl::grid_dependency_sync`]).
//! A typed launcher has `launch_programmatic` only then (its type
//! implements [`GridDependencySync`]); [`Stream::launch_programmatic`]
//! refuses any other kernel with [`Error::NoGridDependencySync`]. The claim
//! is trusted where the other promises of a declaration are: an `unsafe`
//! image declaration or `Program::declare`.
//!
//! **Why the order tracker needs nothing new.** The stream-order tracker
//! (`enqueue/order`) treats a launch as ordered after everything earlier on
//! its stream. A programmatic launch's kernel does start early, but it
//! touches none of its buffers before `cudaGridDependencySynchronize`
//! returns, and that returns only once the work ahead of it on the stream
//! has completed and its writes are visible (a trigger,
//! `cudaTriggerProgrammaticLaunchCompletion`, lets the next kernel be
//! scheduled early, never lets its wait return early). For every byte the kernel
//! reads or writes, the launch is therefore ordered after the stream's
//! earlier work exactly as a plain launch is, and the tracker's step for it
//! is the plain launch's. The same holds in a graph, where capture turns
//! the attribute into a programmatic edge. The work *after* a programmatic
//! launch is ordered as usual: the attribute relaxes only the launch's own
//! start.
//!
//! **Where it is used.** Off by default: it can cost end to end
//! (pytorch#198174), so each program measures (`benches/benches/pdl.rs`).
//! [`PdlPolicy`] (`CUDA_STREAMS_PDL`) says which launches use it:
//! `opt-in` (the default) only those asked for one at a time
//! ([`Stream::launch_programmatic`], a typed `launch_programmatic`,
//! [`Capture::launch_programmatic`](crate::Capture::launch_programmatic));
//! `off` none, the requests launching plain; `declared` every checked launch
//! of a kernel that declares the synchronisation too.
//!
//! **Devices below 9.0.** A launch asked for one at a time is refused there
//! with [`Error::ProgrammaticLaunchUnsupported`], naming the device and its
//! compute capability: a program that asks for PDL learns it does not have
//! it. Under `declared` (a process setting, for every launch), such a device
//! launches plain, which is what the setting asks for where it can be had.
//! The software driver reports 9.0 and runs a programmatic launch in
//! ordinary stream order.

use crate::features::kernel_arg::KernelArg;
use crate::features::launch_config::LaunchConfig;
use crate::features::module::Kernel;
use crate::features::pdl_policy::Dependency;
use crate::ground::error::Result;
use crate::objects::stream::Stream;

impl Stream {
    /// Launch `kernel` as a programmatic dependent launch: checked as
    /// [`Stream::launch`] checks, then launched with programmatic stream
    /// serialization, so that it may start before the kernel ahead of it on
    /// the stream has finished. The kernel must declare that it calls
    /// `cudaGridDependencySynchronize`: it touches none of its buffers
    /// before that returns, which is after the earlier work on the stream
    /// has completed, so it stays ordered after that work as a plain launch
    /// is. [`PdlPolicy`](crate::PdlPolicy) says which launches use it.
    ///
    /// Refused with [`Error::NoGridDependencySync`](crate::Error::NoGridDependencySync) for a kernel that does
    /// not, and with [`Error::ProgrammaticLaunchUnsupported`](crate::Error::ProgrammaticLaunchUnsupported) on a device
    /// below compute capability 9.0; under `CUDA_STREAMS_PDL=off` it
    /// launches plain.
    ///
    /// ```
    /// use cuda_streams_driver::{Context, DeviceBuffer, Error, LaunchConfig, Module, Stream};
    /// let ctx = Context::new(0).unwrap();
    /// let stream = Stream::new(&ctx).unwrap();
    /// let module = Module::load(&ctx, &kernels::ELEMENTWISE).unwrap();
    /// let step = module.function("chain_step_f32").unwrap();
    /// let mut a = DeviceBuffer::from_slice(&stream, &[1.0f32; 4]).unwrap();
    /// let mut b = DeviceBuffer::<f32>::new_async(&stream, 4).unwrap();
    /// let cfg = LaunchConfig::for_num_elems(4);
    /// // b = a + 1, then a = b + 1: each waits for the one before in
    /// // cudaGridDependencySynchronize.
    /// stream.launch_programmatic(&step, cfg, &[4u64.into(), (&a).into(), (&mut b).into()]).unwrap();
    /// stream.launch_programmatic(&step, cfg, &[4u64.into(), (&b).into(), (&mut a).into()]).unwrap();
    /// assert_eq!(a.to_vec(&stream).unwrap(), [3.0; 4]);
    /// // saxpy does not synchronise: refused, naming it.
    /// let saxpy = module.function("saxpy").unwrap();
    /// let args = [4u64.into(), 2.0f32.into(), (&a).into(), (&mut b).into()];
    /// let err = stream.launch_programmatic(&saxpy, cfg, &args).unwrap_err();
    /// assert!(matches!(err, Error::NoGridDependencySync { .. }) && err.to_string().contains("saxpy"));
    /// ```
    pub fn launch_programmatic(
        &self,
        kernel: &Kernel,
        config: LaunchConfig,
        args: &[KernelArg<'_>],
    ) -> Result<()> {
        self.launch_checked(kernel, config, args, Dependency::Programmatic)
    }
}
