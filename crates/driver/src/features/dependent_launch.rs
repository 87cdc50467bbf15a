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

use crate::features::declare::{Declared, DeclaredKernel};
use crate::features::launch::{KernelArg, LaunchConfig};
use crate::features::module::Kernel;
use crate::ground::error::{Error, Result};
use crate::objects::context::DeviceInfo;
use crate::objects::stream::Stream;
use std::ffi::c_void;
use std::sync::OnceLock;

/// A [`kernel!`](crate::kernel!) declaration that says its kernel calls
/// `cudaGridDependencySynchronize` (`calls cudaGridDependencySynchronize;`),
/// and so may be launched with programmatic dependent launch. Implemented
/// by the macro, never by hand: a kernel that does not synchronise would
/// read what the kernel ahead of it is still writing.
#[diagnostic::on_unimplemented(
    message = "kernel `{Self}` does not declare that it calls cudaGridDependencySynchronize",
    label = "programmatic dependent launch needs that declaration",
    note = "add `calls cudaGridDependencySynchronize;` to its kernel! declaration, if its body calls it before touching memory earlier work writes; otherwise launch it with `launch`"
)]
pub trait GridDependencySync: DeclaredKernel {}

/// Which launches use programmatic dependent launch, for the process
/// (`CUDA_STREAMS_PDL`, [`PDL_SETTING`]).
///
/// ```
/// use cuda_streams_driver::PdlPolicy;
/// assert_eq!(PdlPolicy::parse("opt-in"), Ok(PdlPolicy::OptIn));
/// assert_eq!(PdlPolicy::default(), PdlPolicy::OptIn);
/// assert!(PdlPolicy::parse("always").unwrap_err().contains("off, opt-in or declared"));
/// ```
///
/// Not `#[non_exhaustive]`: the three cover every launch (none, those
/// asked, all that may).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum PdlPolicy {
    /// No launch is programmatic; launches asked to be launch plain.
    Off,
    /// Only the launches asked for one at a time.
    #[default]
    OptIn,
    /// Those, and every checked launch of a kernel that declares
    /// `cudaGridDependencySynchronize`, where the device has PDL.
    Declared,
}

impl PdlPolicy {
    /// The policy `value` names: `off`, `opt-in` or `declared`.
    pub fn parse(value: &str) -> std::result::Result<Self, String> {
        match value.trim() {
            "off" => Ok(Self::Off),
            "opt-in" => Ok(Self::OptIn),
            "declared" => Ok(Self::Declared),
            other => Err(format!(
                "{other:?} is no programmatic dependent launch policy: expected off, opt-in or \
                 declared"
            )),
        }
    }

    /// The process's policy: `CUDA_STREAMS_PDL`, read once, or
    /// [`PdlPolicy::OptIn`]. A value that does not parse is an error naming
    /// it, at every launch that would need it.
    pub fn from_env() -> Result<Self> {
        static FROM_ENV: OnceLock<std::result::Result<PdlPolicy, sys::env::EnvError>> =
            OnceLock::new();
        FROM_ENV
            .get_or_init(|| match PDL_SETTING.from_env()? {
                None => Ok(Self::default()),
                Some(found) => Self::parse(&found.value).map_err(|reason| found.error(reason)),
            })
            .clone()
            .map_err(Error::from)
    }
}

/// `CUDA_STREAMS_PDL`: which launches use programmatic dependent launch.
pub const PDL_SETTING: sys::env::Setting = sys::env::Setting {
    name: "CUDA_STREAMS_PDL",
    aliases: &[],
    default: "opt-in",
    about: "programmatic dependent launch: off, opt-in (launches that ask) or declared (every \
            kernel that declares cudaGridDependencySynchronize)",
};

/// What a launch asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dependency {
    /// A plain launch (programmatic only under [`PdlPolicy::Declared`]).
    Stream,
    /// A programmatic dependent launch, asked for.
    Programmatic,
}

impl Dependency {
    /// Whether the launch of `kernel` on `device` is programmatic, or why
    /// it is refused.
    #[inline]
    pub(crate) fn resolve(self, kernel: &Kernel, device: &DeviceInfo) -> Result<bool> {
        if self == Self::Stream && !kernel.declares_grid_dependency_sync() {
            return Ok(false);
        }
        decide(
            PdlPolicy::from_env()?,
            self,
            kernel.name(),
            kernel.declares_grid_dependency_sync(),
            device,
        )
    }
}

/// The decision, from plain values.
fn decide(
    policy: PdlPolicy,
    asked: Dependency,
    kernel: &str,
    declares_sync: bool,
    device: &DeviceInfo,
) -> Result<bool> {
    let supported = device.compute_capability.0 >= 9;
    match asked {
        Dependency::Programmatic if !declares_sync => Err(Error::NoGridDependencySync {
            kernel: kernel.to_string(),
        }),
        Dependency::Programmatic if policy == PdlPolicy::Off => Ok(false),
        Dependency::Programmatic if !supported => Err(Error::ProgrammaticLaunchUnsupported {
            ordinal: device.ordinal,
            name: device.name.clone(),
            compute_capability: device.compute_capability,
        }),
        Dependency::Programmatic => Ok(true),
        Dependency::Stream => Ok(policy == PdlPolicy::Declared && declares_sync && supported),
    }
}

impl Stream {
    /// Launch `kernel` as a programmatic dependent launch: checked as
    /// [`Stream::launch`] checks, then launched with programmatic stream
    /// serialization, so that it may start before the kernel ahead of it on
    /// the stream has finished. The kernel must declare that it calls
    /// `cudaGridDependencySynchronize` (see the [module docs](self) for why
    /// that keeps it ordered after the earlier work, and for the policy).
    ///
    /// Refused with [`Error::NoGridDependencySync`] for a kernel that does
    /// not, and with [`Error::ProgrammaticLaunchUnsupported`] on a device
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
        let Some(signature) = kernel.signature() else {
            return Err(Error::UncheckedKernel {
                kernel: kernel.name().to_string(),
            });
        };
        // SAFETY: it is the kernel's signature.
        unsafe { self.launch_against(kernel, signature, config, args, Dependency::Programmatic) }
    }
}

impl<K: GridDependencySync> Declared<K> {
    /// [`Declared::launch`] as a programmatic dependent launch
    /// ([`Stream::launch_programmatic`]); the typed `launch_programmatic`
    /// of a [`kernel!`](crate::kernel!) that declares
    /// `calls cudaGridDependencySynchronize;` calls this.
    #[inline]
    pub fn launch_programmatic(
        &self,
        stream: &Stream,
        cfg: LaunchConfig,
        args: &[KernelArg<'_>],
    ) -> Result<()> {
        if self.matches() {
            // SAFETY: `K::DECL.params` is the kernel's signature (`matches`).
            unsafe {
                stream.launch_against(
                    self.kernel(),
                    K::DECL.params,
                    cfg,
                    args,
                    Dependency::Programmatic,
                )
            }
        } else {
            stream.launch_programmatic(self.kernel(), cfg, args)
        }
    }
}

/// `cuLaunchKernelEx` of `function` with programmatic stream serialization
/// allowed, `params` as `kernelParams`.
///
/// # Safety
/// As for `launch_raw` (`features/launch.rs`), whose argument layout
/// `params` is.
pub(crate) unsafe fn launch_raw_programmatic(
    driver: &sys::Driver,
    stream: sys::CUstream,
    function: sys::CUfunction,
    config: LaunchConfig,
    params: *mut *mut c_void,
) -> sys::CUresult {
    let mut attr = sys::CUlaunchAttribute {
        id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
        ..Default::default()
    };
    attr.value.programmaticStreamSerializationAllowed = 1;
    let (gx, gy, gz) = config.grid_dim;
    let (bx, by, bz) = config.block_dim;
    let launch = sys::CUlaunchConfig {
        gridDimX: gx,
        gridDimY: gy,
        gridDimZ: gz,
        blockDimX: bx,
        blockDimY: by,
        blockDimZ: bz,
        sharedMemBytes: config.shared_mem_bytes,
        hStream: stream,
        attrs: &mut attr,
        numAttrs: 1,
    };
    // SAFETY: `launch` and `attr` live for the call (the driver copies
    // them); the rest is the caller's contract.
    unsafe { (driver.cuLaunchKernelEx)(&launch, function, params, std::ptr::null_mut()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(major: u32) -> DeviceInfo {
        DeviceInfo {
            ordinal: 3,
            name: "Old GPU".into(),
            compute_capability: (major, 0),
            ..DeviceInfo::default()
        }
    }

    #[test]
    fn each_policy_decides_as_documented() {
        use Dependency::{Programmatic, Stream};
        use PdlPolicy::{Declared, Off, OptIn};
        let hopper = device(9);
        let ask = |policy, asked, sync| decide(policy, asked, "k", sync, &hopper);
        // Asked: programmatic unless off; never for a kernel without sync.
        assert!(ask(OptIn, Programmatic, true).unwrap());
        assert!(ask(Declared, Programmatic, true).unwrap());
        assert!(!ask(Off, Programmatic, true).unwrap());
        for policy in [Off, OptIn, Declared] {
            let err = ask(policy, Programmatic, false).unwrap_err();
            assert!(matches!(err, Error::NoGridDependencySync { ref kernel } if kernel == "k"));
        }
        // Plain: programmatic only under `declared`, for a kernel with sync.
        assert!(!ask(Off, Stream, true).unwrap());
        assert!(!ask(OptIn, Stream, true).unwrap());
        assert!(ask(Declared, Stream, true).unwrap());
        assert!(!ask(Declared, Stream, false).unwrap());
    }

    #[test]
    fn a_device_below_9_0_refuses_a_request_and_launches_the_policy_plain() {
        let ampere = device(8);
        let err = decide(
            PdlPolicy::OptIn,
            Dependency::Programmatic,
            "k",
            true,
            &ampere,
        )
        .unwrap_err();
        let message = err.to_string();
        assert!(message.contains("device 3 (Old GPU) has 8.0"), "{message}");
        assert!(!decide(PdlPolicy::Declared, Dependency::Stream, "k", true, &ampere).unwrap());
        // Off: the request launches plain, on any device.
        assert!(!decide(PdlPolicy::Off, Dependency::Programmatic, "k", true, &ampere).unwrap());
    }
}
