//! A kernel's declaration as data: what a module checks a kernel against
//! and what the software driver runs as its twin. Plain values, so the
//! modules that load kernels and the typed launchers built on them
//! (`declare.rs`) both stand on it.

use crate::ground::error::{Error, Result};
use soft_driver::Twin;
use sys::signature::{self, Param};

/// A kernel's declaration as data: its name (the `extern "C"` symbol or a
/// name expression such as `scale<float>`), its parameters, and its safe
/// CPU twin, if it has one. [`kernel!`](crate::kernel!) makes these.
#[derive(Clone, Copy, Debug)]
pub struct KernelDecl {
    /// The kernel's name.
    pub name: &'static str,
    /// Its parameters, in order.
    pub params: &'static [Param],
    /// Its CPU twin, which the software driver runs.
    pub twin: Option<Twin>,
    /// Whether the kernel calls `cudaGridDependencySynchronize` before it
    /// touches memory that earlier work on its stream writes, and so may be
    /// launched with programmatic dependent launch
    /// ([`Stream::launch_programmatic`](crate::Stream::launch_programmatic)).
    /// [`kernel!`](crate::kernel!) sets it for a declaration that says
    /// `calls cudaGridDependencySynchronize;`.
    pub grid_dependency_sync: bool,
}

/// A declaration's parameters must be checkable.
pub(crate) fn validate_decl(decl: &KernelDecl) -> Result<()> {
    signature::validate(decl.params).map_err(|source| Error::InvalidSignature {
        kernel: decl.name.to_string(),
        source,
    })
}
