//! The profiler as an operation graph's observer: every operation the graph
//! runs is timed as a scope named by its graph label, so no label is
//! written twice.

use crate::profiler::StreamProfiler;
use engine::{ObservedOperation, OperationObserver};

/// Attach a profiler to an operation graph with
/// [`OperationGraph::observe`](engine::OperationGraph::observe): each
/// operation's work becomes a scope on its stream, named by the operation's
/// label (an unlabelled one by its kind, e.g. `Kernel`). A failure to time a
/// scope never fails the operation; it is counted in
/// [`StreamProfiler::error_count`].
///
/// ```
/// use cuda_streams_profiler::StreamProfiler;
/// use cuda_streams_profiler::driver::{Context, DeviceBuffer, Stream};
/// use cuda_streams_profiler::engine::OperationGraph;
/// use std::sync::Arc;
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let ctx = Context::new(0)?;
/// let (copies, compute) = (Stream::new(&ctx)?, Stream::new(&ctx)?);
/// let profiler = Arc::new(StreamProfiler::new(&ctx)?);
/// profiler.enable();
/// let graph = OperationGraph::for_context(&ctx);
/// graph.observe(profiler.clone());
///
/// let mut data = DeviceBuffer::<u32>::new(&ctx, 1 << 16)?;
/// let fill = graph.op(&copies).label("fill").run(|s| s.memset_u32_async(&mut data, 1))?;
/// let scale = graph.op(&compute).after(&[fill.id()]).label("scale")
///     .run(|s| s.memset_u32_async(&mut data, 2))?;
/// scale.wait()?;
///
/// let report = profiler.get_comprehensive_report();
/// assert_eq!(report.total_streams, 2);
/// let fills = profiler.get_stream_report(&copies).unwrap();
/// assert_eq!(fills.operations["fill"].count, 1);
/// let scales = profiler.get_stream_report(&compute).unwrap();
/// assert_eq!(scales.operations["scale"].count, 1);
/// # Ok(())
/// # }
/// ```
impl OperationObserver for StreamProfiler {
    fn around_work(&self, operation: &ObservedOperation<'_>, work: &mut dyn FnMut()) {
        let name = if operation.label().is_empty() {
            format!("{:?}", operation.kind()).into()
        } else {
            operation.label_owned()
        };
        match self.scope(operation.stream(), name) {
            Ok(scope) => {
                work();
                if let Err(err) = scope.finish() {
                    self.note_error(&err);
                }
            }
            Err(err) => {
                self.note_error(&err);
                work();
            }
        }
    }
}
