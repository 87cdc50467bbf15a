//! Kernel declarations: a kernel's Rust signature stated once, with its CPU
//! twin, by [`kernel!`](crate::kernel!).
//!
//! A declaration gives the parameter list that checked launches and the
//! software driver's pointer checks read, a typed launcher, and the twin the
//! software driver runs. Where the declaration comes from decides what is
//! checked and what is promised:
//! - a kernel of a source compiled at run time is declared on its program
//!   with the `unsafe` [`Program::declare`](crate::Program::declare): the
//!   compiler checks the signature (an assertion of the kernel's exact type,
//!   after preprocessing), and the caller promises what no compiler can
//!   check, that the body touches only the elements the declaration gives
//!   it; [`crate::Module::kernel`] then gives it safely;
//! - the kernels crate's images come declared (their bodies reviewed and
//!   tested under memcheck), so their kernels need no promise from the user;
//! - a binary image declares it through the `unsafe`
//!   [`ModuleImage::declared`](crate::ModuleImage::declared), or a kernel of
//!   a binary is given one with the `unsafe`
//!   [`Module::kernel_unchecked`](crate::Module::kernel_unchecked): the one
//!   promise the library cannot check.

use crate::features::kernel_arg::KernelArg;
use crate::features::kernel_decl::{KernelDecl, validate_decl};
use crate::features::launch_config::LaunchConfig;
use crate::features::module::{Kernel, Module};
use crate::features::pdl_policy::Dependency;
use crate::ground::error::{Error, Result};
use crate::objects::stream::Stream;
pub use soft_driver::{LaunchDims, Thread, Twin, TwinArgs, set_conditional};
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

/// A type made by [`kernel!`](crate::kernel!): the declaration, and a typed
/// launcher around a [`Kernel`].
pub trait DeclaredKernel: Sized {
    /// The declaration.
    const DECL: KernelDecl;

    /// Wrap a kernel. Launches through the wrapper are checked against the
    /// kernel's own signature, so wrapping one that does not match (or has
    /// none) makes launches fail, never unsound.
    fn from_kernel(kernel: Kernel) -> Self;

    /// The kernel.
    fn kernel(&self) -> &Kernel;
}

/// The kernel inside a type made by [`kernel!`](crate::kernel!), with
/// whether its signature is `K`'s declaration, found once when it is wrapped
/// (a kernel's signature never changes, and only [`Declared::new`] makes
/// one of these).
///
/// That lets the typed launcher check its arguments against `K::DECL`, a
/// constant: inlined into the launcher, where each argument's type is known
/// too, the check folds down to the length comparisons and nothing else.
/// A kernel whose signature is not the declaration's launches through
/// [`Stream::launch`], checked against its own signature, as before.
///
/// ```
/// use cuda_streams_driver::{Context, Declared, DeclaredKernel, DeviceBuffer, LaunchConfig, Module, Stream};
/// use kernels::FillF32;
/// let ctx = Context::new(0).unwrap();
/// let stream = Stream::new(&ctx).unwrap();
/// let module = Module::load(&ctx, &kernels::ELEMENTWISE).unwrap();
/// let mut out = DeviceBuffer::<f32>::new_async(&stream, 4).unwrap();
/// let fill: FillF32 = module.kernel().unwrap();
/// fill.launch(&stream, LaunchConfig::for_num_elems(4), 4, 2.5, &mut out).unwrap();
/// assert_eq!(out.to_vec(&stream).unwrap(), [2.5; 4]);
/// // fill_u32 wrapped as fill_f32: the signatures differ, the launch is refused.
/// let wrong = FillF32::from_kernel(module.function("fill_u32").unwrap());
/// let err = wrong.launch(&stream, LaunchConfig::for_num_elems(4), 4, 2.5, &mut out).unwrap_err();
/// assert!(err.to_string().contains("fill_u32"), "{err}");
/// ```
pub struct Declared<K> {
    kernel: Kernel,
    /// `kernel.signature() == Some(K::DECL.params)`.
    matches: bool,
    decl: PhantomData<fn() -> K>,
}

impl<K: DeclaredKernel> Declared<K> {
    /// Wrap `kernel`, noting whether its signature is `K`'s declaration.
    pub fn new(kernel: Kernel) -> Self {
        let matches = kernel.signature() == Some(K::DECL.params);
        Self {
            kernel,
            matches,
            decl: PhantomData,
        }
    }

    /// The kernel.
    pub fn kernel(&self) -> &Kernel {
        &self.kernel
    }

    /// Whether the kernel's signature is `K::DECL.params`.
    pub(crate) fn matches(&self) -> bool {
        self.matches
    }

    /// Launch on `stream`, checking `args` against the signature: against
    /// `K::DECL.params` when the kernel's signature is the declaration (a
    /// constant the check folds against), otherwise as
    /// [`Stream::launch`] does. Either way every check of a checked launch
    /// runs; the typed launchers of [`kernel!`](crate::kernel!) call this.
    #[inline]
    pub fn launch(&self, stream: &Stream, cfg: LaunchConfig, args: &[KernelArg<'_>]) -> Result<()> {
        if self.matches {
            // SAFETY: `K::DECL.params` is the kernel's signature (`matches`,
            // found when wrapped; neither changes afterwards).
            unsafe {
                stream.launch_against(&self.kernel, K::DECL.params, cfg, args, Dependency::Stream)
            }
        } else {
            stream.launch(&self.kernel, cfg, args)
        }
    }
}

impl<K> Clone for Declared<K> {
    fn clone(&self) -> Self {
        Self {
            kernel: self.kernel.clone(),
            matches: self.matches,
            decl: PhantomData,
        }
    }
}

impl<K> fmt::Debug for Declared<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Declared")
            .field("kernel", &self.kernel)
            .field("matches", &self.matches)
            .finish()
    }
}

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

/// Declare a kernel once: its name, its Rust signature and, optionally, its
/// CPU twin. Generates a type with the [`KernelDecl`]
/// ([`DeclaredKernel::DECL`]) and a typed `launch`.
///
/// Parameters are written as Rust types:
/// - `a: f32`: a scalar of exactly that type (`u8`, `u32`, `i32`, `u64`,
///   `i64`, `f32`, `f64`), `float a` in CUDA;
/// - `x: &[f32; n]`: a read-only buffer (`const float* x`) of which the
///   kernel reads `n` elements, `n` being an integer parameter;
/// - `y: &mut [f32; n]`: a buffer the kernel may write (`float* y`);
/// - `bins: &mut [u32; 256]`: a fixed element count;
/// - `more: Condition`: a graph's condition handle
///   (`cudaGraphConditionalHandle more`), which the kernel sets with
///   `cudaGraphSetConditional` ([`Param::Condition`](crate::sys::signature::Param::Condition));
///   written `Condition`, unqualified.
///
/// The launcher takes the scalars by value and the buffers as
/// `&impl DeviceMemory<Elem = T>` / `&mut impl DeviceMemoryMut<Elem = T>`,
/// so it compiles only with the right types, and checks every count
/// against the buffers' lengths before the driver sees the launch.
/// `launch_captured` captures a launch into a [`Capture`](crate::Capture):
/// the scalars and conditions typed, the buffers as
/// [`GraphArg`](crate::GraphArg)s, checked when captured;
/// `launch_updatable` does the same and hands back the
/// [`KernelNode`](crate::KernelNode), whose arguments an instance can set
/// ([`GraphExec::set_args`](crate::GraphExec::set_args)).
///
/// A condition is valid only in the graph whose capture made it, so a
/// kernel that takes one has `launch_captured` alone: no eager `launch`
/// (nor `launch_programmatic`), and a [`Condition`](crate::Condition)
/// where the declaration has a `u64` does not compile, nor a `u64` for a
/// `Condition`. A capture refuses a condition of another capture's graph;
/// the untyped [`Stream::launch`](crate::Stream::launch) refuses any. The
/// twin receives the handle as the `u64` it is, for
/// [`set_conditional`](crate::set_conditional):
///
/// ```
/// use cuda_streams_driver::{Context, DeviceBuffer, GraphArg, LaunchConfig, Module, Stream, kernel};
/// use std::sync::Arc;
/// kernel! {
///     /// `++*counter`; the loop goes on while it is below `limit`.
///     pub struct CountTo: fn count_while_below(counter: &mut [u32; 1], limit: u32, more: Condition);
///     twin = per_grid(|_, counter, limit, more| {
///         counter[0] += 1;
///         cuda_streams_driver::set_conditional(more, u32::from(counter[0] < limit));
///     });
/// }
/// let ctx = Context::new(0).unwrap();
/// let stream = Stream::new(&ctx).unwrap();
/// // The kernels crate's image declares `count_while_below` so too.
/// let count: CountTo = Module::load(&ctx, &kernels::SOLVER).unwrap().kernel().unwrap();
/// let counter = Arc::new(DeviceBuffer::<u32>::new(&ctx, 1).unwrap());
/// let mut capture = stream.begin_capture().unwrap();
/// capture.memset_u8(&stream, &counter, 0).unwrap();
/// let more = capture.condition(&stream, 1).unwrap();
/// capture
///     .while_loop(&stream, more, |body| {
///         let origin = Arc::clone(body.origin());
///         let one = LaunchConfig::for_num_elems(1);
///         count.launch_captured(body, &origin, one, GraphArg::write(&counter), 4, more)
///     })
///     .unwrap();
/// capture.end().unwrap().instantiate().unwrap().launch(&stream).unwrap();
/// assert_eq!(counter.to_vec(&stream).unwrap(), [4]);
/// ```
///
/// A twin is `twin = per_thread(|thread, args…| …)`, run for every thread
/// of the grid in turn (a [`Thread`] gives `blockIdx`/`threadIdx`), or
/// `twin = per_grid(|dims, args…| …)`, run once (for kernels that share
/// work through shared memory or atomics). Arguments come as the scalars
/// and as `&[T]` / `&mut [T]` of the declared lengths.
///
/// ```
/// use cuda_streams_driver::kernel;
/// use cuda_streams_driver::{DeclaredKernel, sys::signature::Param};
/// kernel! {
///     /// `y = a * x + y`
///     pub struct Saxpy: fn saxpy(n: u64, a: f32, x: &[f32; n], y: &mut [f32; n]);
///     twin = per_thread(|t, n, a, x, y| {
///         let i = t.global_x();
///         if (i as u64) < n {
///             y[i] = a.mul_add(x[i], y[i]);
///         }
///     });
/// }
/// assert_eq!(Saxpy::DECL.name, "saxpy");
/// assert_eq!(Saxpy::DECL.params.iter().map(Param::size).sum::<usize>(), 28);
/// assert!(Saxpy::DECL.twin.is_some());
/// ```
///
/// A kernel that calls `cudaGridDependencySynchronize` before it touches
/// memory that earlier work on its stream writes says so with
/// `calls cudaGridDependencySynchronize;`. Its type then implements
/// [`GridDependencySync`](crate::GridDependencySync) and has a
/// `launch_programmatic` launcher (programmatic dependent launch,
/// [`Stream::launch_programmatic`](crate::Stream::launch_programmatic)),
/// and `launch_captured_programmatic` in a capture; a declaration without
/// the line has none of them, so it cannot be launched that way:
///
/// ```
/// use cuda_streams_driver::{DeclaredKernel, GridDependencySync, kernel};
/// kernel! {
///     /// `y[i] = x[i] + 1`, after `cudaGridDependencySynchronize()`.
///     pub struct Step: fn step(n: u64, x: &[f32; n], y: &mut [f32; n]);
///     twin = per_thread(|t, n, x, y| {
///         let i = t.global_x();
///         if (i as u64) < n {
///             y[i] = x[i] + 1.0;
///         }
///     });
///     calls cudaGridDependencySynchronize;
/// }
/// fn programmatic<K: GridDependencySync>() -> bool { K::DECL.grid_dependency_sync }
/// assert!(programmatic::<Step>());
/// ```
///
/// A count that names no parameter does not compile:
///
/// ```compile_fail
/// cuda_streams_driver::kernel! {
///     pub struct Bad: fn bad(n: u64, x: &[f32; m]);
/// }
/// const _: &[cuda_streams_driver::sys::signature::Param] =
///     <Bad as cuda_streams_driver::DeclaredKernel>::DECL.params;
/// ```
#[macro_export]
macro_rules! kernel {
    (
        $(#[$meta:meta])*
        $vis:vis struct $ty:ident : fn $name:ident ( $($params:tt)* ) ;
        $(twin = $kind:ident ( $twin:expr ) ;)?
        $(calls $sync:ident ;)?
    ) => {
        $crate::kernel!(@parse
            [$(#[$meta])*] [$vis] [$ty] [stringify!($name)] [$($kind ($twin))?] [$($sync)?]
            {} {} {} {} {} {} ; $($params)*
        );
    };
    (
        $(#[$meta:meta])*
        $vis:vis struct $ty:ident : fn $name:literal ( $($params:tt)* ) ;
        $(twin = $kind:ident ( $twin:expr ) ;)?
        $(calls $sync:ident ;)?
    ) => {
        $crate::kernel!(@parse
            [$(#[$meta])*] [$vis] [$ty] [$name] [$($kind ($twin))?] [$($sync)?]
            {} {} {} {} {} {} ; $($params)*
        );
    };
    // The muncher: names, launcher parameters, twin argument types, twin
    // extraction (name, kind, type), `Param`s and the captured launcher's
    // parameters.
    (@parse $head:tt $vis:tt $ty:tt $name:tt $twin:tt $sync:tt
        {$($names:tt)*} {$($launch:tt)*} {$($tys:tt)*} {$($extract:tt)*} {$($p:tt)*} {$($graph:tt)*} ;
        $n:ident : &mut [$e:ident ; $c:tt] $(, $($rest:tt)*)?
    ) => {
        $crate::kernel!(@parse $head $vis $ty $name $twin $sync
            {$($names)* stringify!($n),}
            {$($launch)* $n: &mut impl $crate::DeviceMemoryMut<Elem = $e>,}
            {$($tys)* &mut [$e],}
            {$($extract)* [$n write $e]}
            {$($p)* [write $e $c]}
            {$($graph)* $n: $crate::GraphArg,}
            ; $($($rest)*)?
        );
    };
    (@parse $head:tt $vis:tt $ty:tt $name:tt $twin:tt $sync:tt
        {$($names:tt)*} {$($launch:tt)*} {$($tys:tt)*} {$($extract:tt)*} {$($p:tt)*} {$($graph:tt)*} ;
        $n:ident : & [$e:ident ; $c:tt] $(, $($rest:tt)*)?
    ) => {
        $crate::kernel!(@parse $head $vis $ty $name $twin $sync
            {$($names)* stringify!($n),}
            {$($launch)* $n: &impl $crate::DeviceMemory<Elem = $e>,}
            {$($tys)* &[$e],}
            {$($extract)* [$n read $e]}
            {$($p)* [read $e $c]}
            {$($graph)* $n: $crate::GraphArg,}
            ; $($($rest)*)?
        );
    };
    // Before the scalars: `Condition` would match `$e:ident` too. The
    // launchers take a `Condition`, the twin the `u64` handle it is.
    (@parse $head:tt $vis:tt $ty:tt $name:tt $twin:tt $sync:tt
        {$($names:tt)*} {$($launch:tt)*} {$($tys:tt)*} {$($extract:tt)*} {$($p:tt)*} {$($graph:tt)*} ;
        $n:ident : Condition $(, $($rest:tt)*)?
    ) => {
        $crate::kernel!(@parse $head $vis $ty $name $twin $sync
            {$($names)* stringify!($n),}
            {$($launch)* $n: $crate::Condition,}
            {$($tys)* u64,}
            {$($extract)* [$n condition u64]}
            {$($p)* [condition u64 _]}
            {$($graph)* $n: $crate::Condition,}
            ; $($($rest)*)?
        );
    };
    (@parse $head:tt $vis:tt $ty:tt $name:tt $twin:tt $sync:tt
        {$($names:tt)*} {$($launch:tt)*} {$($tys:tt)*} {$($extract:tt)*} {$($p:tt)*} {$($graph:tt)*} ;
        $n:ident : $e:ident $(, $($rest:tt)*)?
    ) => {
        $crate::kernel!(@parse $head $vis $ty $name $twin $sync
            {$($names)* stringify!($n),}
            {$($launch)* $n: $e,}
            {$($tys)* $e,}
            {$($extract)* [$n scalar $e]}
            {$($p)* [scalar $e _]}
            {$($graph)* $n: $e,}
            ; $($($rest)*)?
        );
    };
    (@parse [$($meta:tt)*] [$vis:vis] [$ty:ident] [$name:expr] [$($kind:ident ($twin:expr))?] [$($sync:ident)?]
        {$($names:tt)*} {$($launch:tt)*} {$($tys:tt)*} {$([$xn:ident $xk:ident $xe:ident])*} {$([$pk:ident $pe:ident $pc:tt])*} {$($graph:tt)*} ;
    ) => {
        $($meta)*
        #[derive(Clone, Debug)]
        $vis struct $ty {
            kernel: $crate::Declared<$ty>,
        }

        impl $crate::DeclaredKernel for $ty {
            const DECL: $crate::KernelDecl = {
                const NAMES: &[&str] = &[$($names)*];
                const PARAMS: &[$crate::sys::signature::Param] =
                    &[$($crate::kernel!(@param NAMES $pk $pe $pc)),*];
                $crate::KernelDecl {
                    name: $name,
                    params: PARAMS,
                    twin: $crate::kernel!(@twin [$($xn $xk $xe)*] [$($tys)*] $($kind ($twin))?),
                    grid_dependency_sync: $crate::kernel!(@sync_flag [$($sync)?]),
                }
            };

            fn from_kernel(kernel: $crate::Kernel) -> Self {
                Self { kernel: $crate::Declared::new(kernel) }
            }

            fn kernel(&self) -> &$crate::Kernel {
                self.kernel.kernel()
            }
        }

        impl $ty {
            /// Capture a launch on `stream` (the origin of `capture`, a
            /// stream forked in, or a body's) with `config`: the scalars and
            /// conditions typed, the buffers lent as [`GraphArg`]($crate::GraphArg)s
            /// (read, write, a range, the graph's own memory), all checked
            /// against the declaration as [`Capture::launch`]($crate::Capture::launch)
            /// checks them.
            #[allow(clippy::too_many_arguments, dead_code)]
            #[inline]
            $vis fn launch_captured(
                &self,
                capture: &mut $crate::Capture,
                stream: &$crate::Stream,
                config: $crate::LaunchConfig,
                $($graph)*
            ) -> $crate::Result<()> {
                capture.launch(stream, self.kernel.kernel(), config, &[$($crate::GraphArg::from($xn)),*])
            }

            /// [`launch_captured`](Self::launch_captured), handing back the
            /// node, whose arguments an instance of the graph can then set
            /// ([`Capture::launch_updatable`]($crate::Capture::launch_updatable),
            /// [`GraphExec::set_args`]($crate::GraphExec::set_args)).
            #[allow(clippy::too_many_arguments, dead_code)]
            #[inline]
            $vis fn launch_updatable(
                &self,
                capture: &mut $crate::Capture,
                stream: &$crate::Stream,
                config: $crate::LaunchConfig,
                $($graph)*
            ) -> $crate::Result<$crate::KernelNode> {
                capture.launch_updatable(stream, self.kernel.kernel(), config, &[$($crate::GraphArg::from($xn)),*])
            }
        }

        $crate::kernel!(@eager [$($xk)*] [$($sync)?] [$vis] $ty {$($launch)*} {$($xn)*} {$($graph)*});
    };
    // The eager launchers, for a declaration without a condition: a
    // condition is valid only in its graph's capture, so a kernel that
    // takes one has `launch_captured` alone.
    (@eager [] $sync:tt [$vis:vis] $ty:ident {$($launch:tt)*} {$($xn:ident)*} $graph:tt) => {
        impl $ty {
            /// Launch on `stream` with `config`, after checking every
            /// buffer against the counts the declaration gives it.
            #[allow(clippy::too_many_arguments, dead_code)]
            #[inline]
            $vis fn launch(
                &self,
                stream: &$crate::Stream,
                config: $crate::LaunchConfig,
                $($launch)*
            ) -> $crate::Result<()> {
                self.kernel.launch(stream, config, &[$($crate::KernelArg::from($xn)),*])
            }
        }

        $crate::kernel!(@sync_launcher $sync [$vis] $ty {$($launch)*} {$($xn)*} $graph);
    };
    (@eager [condition $($k:ident)*] $($rest:tt)*) => {};
    (@eager [$k:ident $($more:ident)*] $($rest:tt)*) => {
        $crate::kernel!(@eager [$($more)*] $($rest)*);
    };
    (@sync_flag []) => { false };
    (@sync_flag [cudaGridDependencySynchronize]) => { true };
    (@sync_flag [$other:ident]) => {
        compile_error!(concat!(
            "kernel!: `calls ", stringify!($other),
            ";` is not a call a declaration can state; write `calls cudaGridDependencySynchronize;`"
        ))
    };
    (@sync_launcher [] $vis:tt $ty:ident $launch:tt $xn:tt $graph:tt) => {};
    (@sync_launcher [cudaGridDependencySynchronize] [$vis:vis] $ty:ident {$($launch:tt)*} {$($xn:ident)*} {$($graph:tt)*}) => {
        // The claim is trusted only where it was promised: a module gives
        // the kernel only for an `unsafe` image or program declaration that
        // makes it too (`Module::kernel`).
        impl $crate::GridDependencySync for $ty {}

        impl $ty {
            /// Launch on `stream` with `config` as a programmatic dependent
            /// launch ([`Stream::launch_programmatic`]($crate::Stream::launch_programmatic)):
            /// the kernel may start before the work ahead of it on the
            /// stream has finished, and waits for it in
            /// `cudaGridDependencySynchronize`.
            #[allow(clippy::too_many_arguments, dead_code)]
            #[inline]
            $vis fn launch_programmatic(
                &self,
                stream: &$crate::Stream,
                config: $crate::LaunchConfig,
                $($launch)*
            ) -> $crate::Result<()> {
                self.kernel.launch_programmatic(stream, config, &[$($crate::KernelArg::from($xn)),*])
            }

            /// Capture a programmatic dependent launch on `stream` with
            /// `config` ([`Capture::launch_programmatic`]($crate::Capture::launch_programmatic)):
            /// in the graph, a programmatic edge from the node before it.
            /// The arguments as [`launch_captured`](Self::launch_captured)
            /// takes them.
            #[allow(clippy::too_many_arguments, dead_code)]
            #[inline]
            $vis fn launch_captured_programmatic(
                &self,
                capture: &mut $crate::Capture,
                stream: &$crate::Stream,
                config: $crate::LaunchConfig,
                $($graph)*
            ) -> $crate::Result<()> {
                capture.launch_programmatic(stream, self.kernel.kernel(), config, &[$($crate::GraphArg::from($xn)),*])
            }
        }
    };
    (@sync_launcher [$other:ident] $vis:tt $ty:ident $launch:tt $xn:tt $graph:tt) => {};
    (@param $names:ident scalar $e:ident _) => {
        $crate::sys::signature::Param::Scalar(<$e as $crate::sys::signature::ScalarType>::SCALAR)
    };
    (@param $names:ident condition $e:ident _) => {
        $crate::sys::signature::Param::Condition
    };
    (@param $names:ident read $e:ident $c:tt) => {
        $crate::sys::signature::Param::Pointer {
            elem: <$e as $crate::sys::signature::ScalarType>::SCALAR,
            access: $crate::sys::signature::Access::Read,
            extent: $crate::kernel!(@extent $names $c),
        }
    };
    (@param $names:ident write $e:ident $c:tt) => {
        $crate::sys::signature::Param::Pointer {
            elem: <$e as $crate::sys::signature::ScalarType>::SCALAR,
            access: $crate::sys::signature::Access::Write,
            extent: $crate::kernel!(@extent $names $c),
        }
    };
    (@extent $names:ident $c:ident) => {
        $crate::sys::signature::Extent::Arg(
            $crate::sys::signature::index_of($names, stringify!($c)),
        )
    };
    (@extent $names:ident $c:literal) => {
        $crate::sys::signature::Extent::Elements($c)
    };
    (@twin $x:tt $tys:tt) => { None };
    (@twin [$($xn:ident $xk:ident $xe:ident)*] [$($tys:tt)*] per_thread ($twin:expr)) => {{
        fn adapter(dims: &$crate::LaunchDims, args: &mut $crate::TwinArgs<'_>) {
            let user: fn($crate::Thread, $($tys)*) = $twin;
            $( let $xn = $crate::kernel!(@take args $xk $xe); )*
            for thread in dims.threads() {
                user(thread, $($crate::kernel!(@reborrow $xk $xn)),*);
            }
        }
        Some(adapter as $crate::Twin)
    }};
    (@twin [$($xn:ident $xk:ident $xe:ident)*] [$($tys:tt)*] per_grid ($twin:expr)) => {{
        fn adapter(dims: &$crate::LaunchDims, args: &mut $crate::TwinArgs<'_>) {
            let user: fn(&$crate::LaunchDims, $($tys)*) = $twin;
            $( let $xn = $crate::kernel!(@take args $xk $xe); )*
            user(dims, $($xn),*);
        }
        Some(adapter as $crate::Twin)
    }};
    (@take $args:ident scalar $e:ident) => { $args.scalar::<$e>() };
    (@take $args:ident condition $e:ident) => { $args.scalar::<u64>() };
    (@take $args:ident read $e:ident) => { $args.slice::<$e>() };
    (@take $args:ident write $e:ident) => { $args.slice_mut::<$e>() };
    (@reborrow write $n:ident) => { &mut *$n };
    (@reborrow $k:ident $n:ident) => { $n };
}

/// How a module gives a declared kernel: found, checked against what the
/// module knows of it (its program's source, or its image's declarations),
/// and wrapped in the declaration's typed launcher.
impl Module {
    /// The kernel `K` declares ([`kernel!`](crate::kernel!)), with its
    /// declaration checked and attached, ready for `K`'s typed launcher.
    ///
    /// - A module compiled from source ([`crate::Program`]): `K` must have
    ///   been declared on the program ([`crate::Program::declare`], where the
    ///   user promises what the kernel's body touches, and the compiler
    ///   checks the signature); otherwise an [`Error::DeclarationMismatch`]
    ///   says so. The declaration is compared with the source's `__global__`
    ///   function once more, for the symbol to look up.
    /// - A declared image ([`ModuleImage::declared`](crate::ModuleImage::declared)): the image must declare
    ///   the kernel with the same parameters.
    /// - Bare bytes: nothing to check against, so
    ///   [`Error::UncheckableDeclaration`]; the `unsafe`
    ///   [`Module::kernel_unchecked`] takes the declaration on trust.
    ///
    /// On a GPU whose driver reports parameter sizes (`cuFuncGetParamInfo`,
    /// CUDA 12.4 and later) the kernel's parameter count and sizes in the
    /// binary are compared with the declaration too. On the software driver
    /// the kernel runs as the declaration's twin; a declaration without one
    /// is an [`Error::NoTwin`] saying how to add it.
    pub fn kernel<K: DeclaredKernel>(self: &Arc<Self>) -> Result<K> {
        let decl = K::DECL;
        validate_decl(&decl)?;
        let symbol = match &self.source {
            Some(source) if !source.is_declared(&decl) => {
                return Err(source.mismatch(
                    decl.name,
                    format!(
                        "it was not declared on the Program it was compiled from: declare it \
                         before compiling, with `unsafe {{ program.declare::<{}>() }}`, whose \
                         `# Safety` says what the kernel's body must not touch",
                        std::any::type_name::<K>()
                            .rsplit("::")
                            .next()
                            .unwrap_or("K")
                    ),
                ));
            }
            Some(source) => source.check(decl.name, decl.params)?,
            None => match self.image.signature(decl.name) {
                Some(_)
                    if decl.grid_dependency_sync
                        && !self.image.declares_grid_dependency_sync(decl.name) =>
                {
                    return Err(Error::DeclarationMismatch {
                        kernel: decl.name,
                        program: "its image".into(),
                        reason: "the declaration says it calls cudaGridDependencySynchronize, \
                                 the image does not"
                            .into(),
                    });
                }
                Some(params) if params == decl.params => decl.name.to_string(),
                Some(params) => {
                    return Err(Error::DeclarationMismatch {
                        kernel: decl.name,
                        program: "its image".into(),
                        reason: format!(
                            "the image declares {params:?}, the declaration {:?}",
                            decl.params
                        ),
                    });
                }
                None => {
                    return Err(Error::UncheckableDeclaration {
                        kernel: decl.name.to_string(),
                    });
                }
            },
        };
        self.attach(&decl, &symbol).map(K::from_kernel)
    }

    /// The kernel `K` declares, with the declaration taken on trust: for
    /// kernels of binaries that declare nothing. On a GPU whose driver
    /// reports parameter sizes (`cuFuncGetParamInfo`, CUDA 12.4 and later)
    /// the count and sizes are compared all the same, and a difference is an
    /// [`Error::DeclarationMismatch`]; what sizes cannot show (`f32` for
    /// `u32`, a slice's extent) stays the caller's promise. On the software
    /// driver the declaration's twin runs, so there the declaration is the
    /// kernel.
    ///
    /// # Safety
    /// The declaration's parameters are the kernel's own, as
    /// [`ModuleImage::declared`](crate::ModuleImage::declared) requires, and
    /// a declaration that says `calls cudaGridDependencySynchronize` is
    /// true of the kernel's body, as that function requires too.
    pub unsafe fn kernel_unchecked<K: DeclaredKernel>(self: &Arc<Self>) -> Result<K> {
        let decl = K::DECL;
        validate_decl(&decl)?;
        self.attach(&decl, decl.name).map(K::from_kernel)
    }
}
