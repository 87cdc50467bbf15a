//! The graph's side of observing: setting and clearing its observer, and
//! running each operation's work inside it. What an observer is, and the
//! slot a graph keeps it in, are in `observer.rs`, below the graph.

use crate::graph::{OpMeta, OperationGraph};
use crate::observer::{ObservedOperation, OperationObserver};
use driver::Stream;
use std::sync::Arc;

impl OperationGraph {
    /// Tell `observer` about the work of every operation this graph runs
    /// from now on through its builder ([`OperationObserver`]), in place
    /// of the observer set before, which is returned.
    ///
    /// A profiler is an observer: every operation is timed under its label.
    /// The profiler's own crate (`cuda_streams_profiler`) shows it.
    pub fn observe(
        &self,
        observer: Arc<dyn OperationObserver>,
    ) -> Option<Arc<dyn OperationObserver>> {
        self.observer.replace(Some(observer))
    }

    /// Stop telling the observer set by [`observe`](Self::observe), and
    /// return it.
    pub fn stop_observing(&self) -> Option<Arc<dyn OperationObserver>> {
        self.observer.replace(None)
    }

    /// `work` on `stream`, inside the observer's `around_work` when there
    /// is one.
    #[inline]
    pub(crate) fn observed<R>(
        &self,
        meta: &OpMeta,
        stream: &Stream,
        work: impl FnOnce(&Stream) -> R,
    ) -> R {
        let Some(observer) = self.observer.get() else {
            return work(stream);
        };
        let operation = ObservedOperation {
            stream,
            label: &meta.label,
            kind: meta.kind,
            dependencies: &meta.dependencies,
        };
        let mut work = Some(work);
        let mut result = None;
        observer.around_work(&operation, &mut || {
            if let Some(work) = work.take() {
                result = Some(work(stream));
            }
        });
        match (result, work) {
            (Some(result), _) => result,
            (None, Some(work)) => {
                tracing::warn!(
                    stream = stream.id(),
                    label = %meta.label,
                    "an operation observer returned without running the operation's work; the graph ran it"
                );
                work(stream)
            }
            (None, None) => {
                panic!("the operation's work panicked and its observer caught the panic")
            }
        }
    }
}
