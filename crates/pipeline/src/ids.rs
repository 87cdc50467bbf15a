//! The ids of a pipeline's buffers and stages: two index types that cannot
//! be mixed up, each naming itself in messages.

use std::fmt;

/// A pipeline buffer, by id: an index into the buffers every batch in flight
/// has a copy of. Ids need not be dense; the pipeline allocates the ones its
/// stages, inputs and outputs name.
///
/// A `usize` converts into one, so calls that take `impl Into<BufferId>`
/// accept plain numbers; it displays as `buffer 3`, as errors name it.
///
/// ```
/// use cuda_streams_pipeline::BufferId;
/// let id = BufferId::from(3);
/// assert_eq!(id, BufferId(3));
/// assert_eq!(id.index(), 3);
/// assert_eq!(id.to_string(), "buffer 3");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BufferId(pub usize);

/// A stage of a [`crate::PipelineStageManager`], by the index
/// [`add_stage`](crate::PipelineStageManager::add_stage) returned.
///
/// A `usize` converts into one, so an order may be written `vec![0, 1, 2]`;
/// it displays as `stage 2`, as errors name it.
///
/// ```
/// use cuda_streams_pipeline::StageId;
/// let id = StageId::from(2);
/// assert_eq!(id, StageId(2));
/// assert_eq!(id.index(), 2);
/// assert_eq!(id.to_string(), "stage 2");
/// ```
///
/// A buffer is no stage, and a stage no buffer:
///
/// ```
/// # use cuda_streams_pipeline::{BufferId, PipelineStageManager, StageId};
/// fn configure(pipeline: &mut PipelineStageManager) -> cuda_streams_pipeline::Result<()> {
///     pipeline.set_inputs(vec![BufferId(0)]);
///     pipeline.set_order(vec![StageId(0)])
/// }
/// ```
///
/// ```compile_fail
/// # use cuda_streams_pipeline::{BufferId, PipelineStageManager, StageId};
/// fn configure(pipeline: &mut PipelineStageManager) -> cuda_streams_pipeline::Result<()> {
///     pipeline.set_inputs(vec![BufferId(0)]);
///     pipeline.set_order(vec![BufferId(0)])
/// }
/// ```
///
/// ```compile_fail
/// # use cuda_streams_pipeline::{BufferId, PipelineStageManager, StageId};
/// fn configure(pipeline: &mut PipelineStageManager) -> cuda_streams_pipeline::Result<()> {
///     pipeline.set_inputs(vec![StageId(0)]);
///     pipeline.set_order(vec![StageId(0)])
/// }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StageId(pub usize);

macro_rules! id {
    ($id:ident, $what:literal) => {
        impl $id {
            /// The plain index.
            pub const fn index(self) -> usize {
                self.0
            }
        }

        impl From<usize> for $id {
            fn from(index: usize) -> Self {
                Self(index)
            }
        }

        impl From<$id> for usize {
            fn from(id: $id) -> Self {
                id.0
            }
        }

        impl fmt::Display for $id {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($what, " {}"), self.0)
            }
        }
    };
}
id!(BufferId, "buffer");
id!(StageId, "stage");

/// `ids` as a list of typed ids.
pub(crate) fn collect<I, Id>(ids: I) -> Vec<Id>
where
    I: IntoIterator,
    I::Item: Into<Id>,
{
    ids.into_iter().map(Into::into).collect()
}
