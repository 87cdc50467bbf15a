//! One error for code that uses several crates: `?` works across them.

/// Any error of the crates behind this facade, each kept whole (match on the
/// variant to reach the crate's own error and its details).
///
/// ```
/// use cuda_streams::prelude::*;
///
/// fn upload_and_plan(data: &[f32]) -> Result<usize, cuda_streams::Error> {
///     let ctx = Context::new(0)?; // a driver error
///     let stream = Stream::new(&ctx)?;
///     let buffer = DeviceBuffer::from_slice(&stream, data)?;
///     let pool = StreamPool::new(&ctx, 2)?; // a stream-pool error
///     Ok(buffer.len() + pool.len())
/// }
/// assert_eq!(upload_and_plan(&[1.0, 2.0]).unwrap(), 4);
/// let err = upload_and_plan(&[]).unwrap_err();
/// assert!(matches!(err, cuda_streams::Error::Driver(_)), "{err}");
/// assert!(err.to_string().contains("zero-length buffers are refused"), "{err}");
///
/// // The operation graph's errors (and so event coordination's) are `Engine`.
/// fn depend_on_nothing(ctx: &std::sync::Arc<Context>) -> Result<(), cuda_streams::Error> {
///     let stream = Stream::new(ctx)?;
///     let graph = OperationGraph::for_context(ctx);
///     let missing = OperationId(42);
///     graph.op(&stream).after(&[missing]).run(|_| Ok(()))?.wait()?;
///     Ok(())
/// }
/// let err = depend_on_nothing(&Context::new(0)?).unwrap_err();
/// assert!(matches!(err, cuda_streams::Error::Engine(_)), "{err}");
/// assert!(err.to_string().contains("42"), "{err}");
/// # Ok::<(), cuda_streams::Error>(())
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// From the safe driver layer (contexts, streams, buffers, launches).
    #[error(transparent)]
    Driver(#[from] driver::Error),
    /// From the stream pool.
    #[cfg(feature = "pool")]
    #[error(transparent)]
    Pool(#[from] pool::Error),
    /// From the operation graph (`cuda_streams::engine`), and so from event
    /// coordination, whose coordinator is that graph under its seed name
    /// (`events::Error` is `engine::Error`).
    #[cfg(feature = "engine")]
    #[error(transparent)]
    Engine(#[from] engine::Error),
    /// From the allocator.
    #[cfg(feature = "allocator")]
    #[error(transparent)]
    Allocator(#[from] allocator::Error),
    /// From the profiler.
    #[cfg(feature = "profiler")]
    #[error(transparent)]
    Profiler(#[from] profiler::Error),
    /// From the collectives.
    #[cfg(feature = "collectives")]
    #[error(transparent)]
    Collectives(#[from] collectives::Error),
    /// From the pipeline.
    #[cfg(feature = "pipeline")]
    #[error(transparent)]
    Pipeline(#[from] pipeline::Error),
}

/// `Result` with the facade's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// `?` on a call of any crate behind the facade inside work that returns a driver `Result`
/// (the closure of an operation graph's operation): a driver failure comes
/// back as itself, anything else as [`driver::Error::Other`], which keeps
/// it whole.
impl From<Error> for driver::Error {
    fn from(error: Error) -> Self {
        match error {
            Error::Driver(error) => error,
            #[allow(
                unreachable_patterns,
                reason = "without the features that add variants, `Driver` is the only one"
            )]
            other => driver::Error::other(other),
        }
    }
}
