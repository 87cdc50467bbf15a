//! An observer of a graph's operations: told about each operation's work as
//! it runs, so a profiler can time every operation under its graph label,
//! and no label has to be written twice. The graph's methods that set one
//! and run work inside it are in `observe.rs`.

use crate::operation::{OperationId, OperationType};
use driver::Stream;
use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

/// Told about the work of every operation an [`OperationGraph`] runs
/// through its builder ([`OperationGraph::op`], [`OperationGraph::op_from`],
/// [`OpBuilder::fork_join`](crate::OpBuilder::fork_join),
/// [`OperationGraph::parallel`]), on the thread that runs it: after the
/// operation's stream waits for its dependencies, before its completion
/// event is recorded. Set with [`OperationGraph::observe`].
///
/// Operations of the seed calls (`register_operation`, `begin_operation`,
/// `complete_operation`) have no closure to wrap, and captured operations
/// run at every replay: neither is observed.
///
/// `cuda_streams_profiler::StreamProfiler` is one: it times each operation
/// as a scope named by the operation's label.
///
/// ```
/// use cuda_streams_engine::{OperationGraph, OperationObserver, ObservedOperation};
/// use cuda_streams_engine::driver::{Context, DeviceBuffer, Stream};
/// use std::sync::{Arc, Mutex};
///
/// /// Writes down the label of every operation it sees.
/// #[derive(Default)]
/// struct Labels(Mutex<Vec<String>>);
///
/// impl OperationObserver for Labels {
///     fn around_work(&self, operation: &ObservedOperation<'_>, work: &mut dyn FnMut()) {
///         self.0.lock().unwrap().push(operation.label().to_string());
///         work();
///     }
/// }
///
/// # fn main() -> cuda_streams_engine::Result<()> {
/// let ctx = Context::new(0)?;
/// let stream = Stream::new(&ctx)?;
/// let graph = OperationGraph::for_context(&ctx);
/// let labels = Arc::new(Labels::default());
/// graph.observe(labels.clone());
/// let mut buf = DeviceBuffer::<u32>::new(&ctx, 64)?;
/// let clear = graph.op(&stream).label("clear").run(|s| s.memset_u32_async(&mut buf, 0))?;
/// let fill = graph.op(&stream).after(&[clear.id()]).label("fill")
///     .run(|s| s.memset_u32_async(&mut buf, 1))?;
/// fill.wait()?;
/// assert_eq!(*labels.0.lock().unwrap(), ["clear", "fill"]);
/// # Ok(())
/// # }
/// ```
///
/// [`OperationGraph`]: crate::OperationGraph
/// [`OperationGraph::op`]: crate::OperationGraph::op
/// [`OperationGraph::op_from`]: crate::OperationGraph::op_from
/// [`OperationGraph::parallel`]: crate::OperationGraph::parallel
/// [`OperationGraph::observe`]: crate::OperationGraph::observe
pub trait OperationObserver: Send + Sync {
    /// Run `work`, the operation's own work, once, with whatever the
    /// observer does around it. Work not run by the observer is run by the
    /// graph right after (and a `tracing` warning says so), so an operation
    /// never loses its work; a panic propagates as a panic of the work
    /// would.
    fn around_work(&self, operation: &ObservedOperation<'_>, work: &mut dyn FnMut());
}

/// What an [`OperationObserver`] is told about an operation whose work is
/// about to run.
#[derive(Debug)]
pub struct ObservedOperation<'a> {
    pub(crate) stream: &'a Stream,
    pub(crate) label: &'a Cow<'static, str>,
    pub(crate) kind: OperationType,
    pub(crate) dependencies: &'a [OperationId],
}

impl ObservedOperation<'_> {
    /// The stream its work is enqueued on.
    pub fn stream(&self) -> &Stream {
        self.stream
    }

    /// Its label (`""` when it was given none).
    pub fn label(&self) -> &str {
        self.label
    }

    /// Its label, owned: a `&'static str` label stays borrowed, so keeping
    /// it costs no allocation.
    pub fn label_owned(&self) -> Cow<'static, str> {
        self.label.clone()
    }

    /// What kind of work it is ([`crate::OpBuilder::kind`]).
    pub fn kind(&self) -> OperationType {
        self.kind
    }

    /// The operations it runs after.
    pub fn dependencies(&self) -> &[OperationId] {
        self.dependencies
    }
}

/// Where a graph keeps its observer: a flag read on every operation, the
/// observer itself read only when the flag is set.
#[derive(Default)]
pub(crate) struct ObserverSlot {
    set: AtomicBool,
    observer: RwLock<Option<Arc<dyn OperationObserver>>>,
}

impl ObserverSlot {
    /// Inlined: the flag's load is all an unobserved operation pays.
    #[inline]
    pub(crate) fn get(&self) -> Option<Arc<dyn OperationObserver>> {
        if !self.set.load(Ordering::Acquire) {
            return None;
        }
        self.observer
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub(crate) fn replace(
        &self,
        observer: Option<Arc<dyn OperationObserver>>,
    ) -> Option<Arc<dyn OperationObserver>> {
        let mut slot = self.observer.write().unwrap_or_else(|p| p.into_inner());
        self.set.store(observer.is_some(), Ordering::Release);
        std::mem::replace(&mut *slot, observer)
    }
}
