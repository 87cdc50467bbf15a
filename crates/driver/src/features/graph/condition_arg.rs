//! A [`Condition`] as a kernel argument, and where one may go.
//!
//! A condition handle means something only to the graph that made it: a
//! kernel launched on a stream, or captured into another graph, that calls
//! `cudaGraphSetConditional` with it sets a condition of no node it belongs
//! to (on a GPU, undefined behaviour). So a handle is an argument of its own
//! kind ([`ArgKind::Condition`]) that carries its capture family, for a
//! parameter of its own kind ([`Param::Condition`](sys::signature::Param)):
//! a `u64` cannot stand for one, eager launches refuse it, and a capture
//! refuses one of another family, by the check its conditional nodes use.

use super::args::{ArgInner, GraphArg};
use super::capture::Capture;
use super::conditional::Condition;
use crate::features::kernel_arg::{ArgValue, KernelArg};
use crate::features::module::Kernel;
use crate::ground::arg_kind::ArgKind;
use crate::ground::error::{Error, Result};
use sys::signature::Param;

impl From<Condition> for KernelArg<'_> {
    /// The argument a [`kernel!`](crate::kernel!) launcher passes for a
    /// parameter declared `name: Condition`.
    fn from(condition: Condition) -> Self {
        KernelArg::from_value(condition.value())
    }
}

impl From<Condition> for GraphArg {
    fn from(condition: Condition) -> Self {
        GraphArg {
            inner: ArgInner::Scalar(condition.value()),
        }
    }
}

impl Condition {
    fn value(self) -> ArgValue {
        ArgValue::Condition(self.raw, self.family)
    }
}

impl Capture {
    /// A condition of another capture's graph is refused, naming where it
    /// was to be used (`what`: "the node", "kernel `k`").
    pub(super) fn check_family(&self, condition: Condition, what: &str) -> Result<()> {
        check_family(self.family, condition, what)
    }

    /// Every condition among `args` must be of this capture's family.
    pub(super) fn check_conditions(&self, kernel: &Kernel, args: &[GraphArg]) -> Result<()> {
        check_conditions(self.family, kernel, args)
    }
}

/// A condition of another graph family than `family` (the capture where
/// it is used, or the graph whose node is set) is refused, naming where it
/// was to be used.
fn check_family(family: u64, condition: Condition, what: &str) -> Result<()> {
    if condition.family == family {
        return Ok(());
    }
    Err(Error::Conditional {
        reason: format!(
            "condition {:#x} belongs to the graph of capture {}, not to that of capture {family} \
             where {what} is captured",
            condition.raw, condition.family
        ),
    })
}

/// Every condition among `args` of `kernel` must be of the graph family
/// `family`.
pub(super) fn check_conditions(family: u64, kernel: &Kernel, args: &[GraphArg]) -> Result<()> {
    for arg in args {
        if let ArgInner::Scalar(ArgValue::Condition(raw, family_of)) = arg.inner {
            let what = format!("kernel `{}`", kernel.name());
            check_family(
                family,
                Condition {
                    raw,
                    family: family_of,
                },
                &what,
            )?;
        }
    }
    Ok(())
}

/// An eager launch of `kernel` with a condition among `args` is refused: no
/// graph of its condition's runs it.
#[inline]
pub(crate) fn refuse_eager_conditions(kernel: &Kernel, args: &[KernelArg<'_>]) -> Result<()> {
    match args.iter().position(|arg| arg.kind() == ArgKind::Condition) {
        None => Ok(()),
        Some(index) => Err(eager_condition_error(kernel, index)),
    }
}

/// [`refuse_eager_conditions`] for a checked launch, from the kernel's
/// signature (whose condition parameters its arguments were checked to
/// match): a declared kernel's signature is a constant, and where it has no
/// condition this folds away.
#[inline(always)]
pub(crate) fn refuse_eager_condition_params(kernel: &Kernel, signature: &[Param]) -> Result<()> {
    match signature
        .iter()
        .position(|param| matches!(param, Param::Condition))
    {
        None => Ok(()),
        Some(index) => Err(eager_condition_error(kernel, index)),
    }
}

#[cold]
fn eager_condition_error(kernel: &Kernel, index: usize) -> Error {
    Error::Conditional {
        reason: format!(
            "kernel `{}` takes a graph condition as argument {index}, which is valid only in \
             the capture of its graph: capture the launch there (`Capture::launch`, or a \
             declared kernel's `launch_captured`), not on a stream",
            kernel.name()
        ),
    }
}
