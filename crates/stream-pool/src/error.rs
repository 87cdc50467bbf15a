//! The stream pool's error type.

use std::fmt;

/// Everything the stream pool and the coordinator can fail with.
///
/// Each message names the streams and values involved:
///
/// ```
/// use cuda_streams_stream_pool::driver::{Context, Stream};
/// use cuda_streams_stream_pool::{Error, MultiStreamCoordinator, StreamPool};
/// # fn main() -> Result<(), cuda_streams_stream_pool::Error> {
/// let ctx = Context::new(0)?;
/// assert!(matches!(StreamPool::new(&ctx, 0), Err(Error::EmptyPool)));
/// let (a, b) = (Stream::new(&ctx)?, Stream::new(&ctx)?);
/// let mut coordinator = MultiStreamCoordinator::new([a.clone(), b.clone()]);
/// coordinator.add_dependency(&a, &b)?; // a waits for b
/// let err = coordinator.add_dependency(&b, &a).unwrap_err();
/// assert!(matches!(&err, Error::Cycle { path } if *path == [b.id(), a.id(), b.id()]));
/// let (a, b) = (a.id(), b.id());
/// let cycle = format!("stream {b} -> stream {a} -> stream {b}");
/// assert_eq!(err.to_string(), format!("dependency would close a cycle: {cycle}"));
/// # Ok(())
/// # }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A call into the safe driver layer failed.
    #[error(transparent)]
    Driver(#[from] driver::Error),
    /// A device ordinal that [`crate::DevicePools`] has no pool for.
    #[error("no stream pool for device {ordinal}: the pools cover {count} device(s)")]
    UnknownDevice {
        /// The ordinal asked for.
        ordinal: i32,
        /// How many devices have a pool.
        count: usize,
    },
    /// A pool of zero streams was asked for.
    #[error("a stream pool of 0 streams: the size must be at least 1")]
    EmptyPool,
    /// `CUDA_STREAMS_POOL_SIZE` holds something that is not a usable size
    /// (the message names the variable and the value).
    #[error(transparent)]
    InvalidPoolSize(#[from] driver::sys::env::EnvError),
    /// A class split whose parts do not add up to the pool size.
    #[error(
        "class split {high} high + {normal} normal + {low} low = {} streams, but the pool has {size}",
        high + normal + low
    )]
    ClassSplitMismatch {
        /// Streams asked for in the High class.
        high: usize,
        /// Streams asked for in the Normal class.
        normal: usize,
        /// Streams asked for in the Low class.
        low: usize,
        /// The pool size.
        size: usize,
    },
    /// A stream given to the coordinator that it does not manage.
    #[error("stream {id} is not one of this coordinator's streams")]
    UnknownStream {
        /// The stream's id.
        id: u64,
    },
    /// A dependency that would make a stream wait, transitively, on itself.
    #[error("dependency would close a cycle: {}", CyclePath(.path))]
    Cycle {
        /// The stream ids along the cycle, first and last equal; each waits
        /// for the next.
        path: Vec<u64>,
    },
    /// `execute_parallel`: the closure failed on some streams (every failure kept).
    #[error("{} of {total} streams failed: {}", failures.len(), FailureList(.failures))]
    Parallel {
        /// Each failure, in stream order.
        failures: Vec<StreamFailure>,
        /// How many streams the closure ran on.
        total: usize,
    },
    /// An operation-graph failure the variants above do not cover (the
    /// coordinator is a view on `cuda_streams_engine::OperationGraph`).
    #[error(transparent)]
    Engine(engine::Error),
    /// An error from user code run by the coordinator (see [`Error::other`]).
    #[error(transparent)]
    Other(Box<dyn std::error::Error + Send + Sync>),
}

impl Error {
    /// Wrap any error (or message) from user code, e.g. inside
    /// `execute_parallel`'s closure.
    pub fn other(error: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Self::Other(error.into())
    }
}

/// A device the [`crate::DevicePools`] has no pool for.
impl From<driver::UnknownDevice> for Error {
    fn from(driver::UnknownDevice { ordinal, count }: driver::UnknownDevice) -> Self {
        Self::UnknownDevice { ordinal, count }
    }
}

impl From<engine::Error> for Error {
    /// The graph's errors in this crate's terms: a driver failure (also one
    /// inside an operation's work) is [`Error::Driver`], this crate's error
    /// inside an operation's work is itself, a stream cycle
    /// [`Error::Cycle`], anything else [`Error::Engine`].
    fn from(error: engine::Error) -> Self {
        match error {
            engine::Error::Driver(error) => Error::Driver(error),
            // This crate's own error, carried out of the work by `?`, is
            // itself again.
            engine::Error::OperationFailed { source, .. } => {
                source.downcast::<Error>().unwrap_or_else(Error::Driver)
            }
            engine::Error::StreamCycle { path } => Error::Cycle { path },
            other => Error::Engine(other),
        }
    }
}

/// One stream's failure inside [`Error::Parallel`].
///
/// ```
/// use cuda_streams_stream_pool::driver::Context;
/// use cuda_streams_stream_pool::{Error, StreamPool};
/// # fn main() -> Result<(), cuda_streams_stream_pool::Error> {
/// let ctx = Context::new(0)?;
/// let coordinator = StreamPool::new(&ctx, 3)?.coordinator();
/// let bad = coordinator.streams()[1].id();
/// let err = coordinator
///     .execute_parallel(|stream| match stream.id() == bad {
///         true => Err(Error::other("bad input")),
///         false => Ok(()),
///     })
///     .unwrap_err();
/// let Error::Parallel { failures, total } = err else { unreachable!() };
/// assert_eq!((failures.len(), total), (1, 3));
/// assert_eq!(failures[0].stream, bad);
/// assert_eq!(failures[0].error.to_string(), "bad input");
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct StreamFailure {
    /// The stream's id.
    pub stream: u64,
    /// What went wrong there (a panic becomes [`Error::Other`] with its message).
    pub error: Error,
}

struct CyclePath<'a>(&'a [u64]);

impl fmt::Display for CyclePath<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, id) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(" -> ")?;
            }
            write!(f, "stream {id}")?;
        }
        Ok(())
    }
}

struct FailureList<'a>(&'a [StreamFailure]);

impl fmt::Display for FailureList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, failure) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "stream {}: {}", failure.stream, failure.error)?;
        }
        Ok(())
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// `?` on a call of the stream pool inside work that returns a driver `Result`
/// (the closure of an operation graph's operation): a driver failure comes
/// back as itself, anything else as [`driver::Error::Other`], which keeps
/// it whole.
impl From<Error> for driver::Error {
    fn from(error: Error) -> Self {
        match error {
            Error::Driver(error) => error,
            other => driver::Error::other(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `?` carries this crate's error out of an operation's work as the
    /// driver's `Other`; converted back from the graph's error, it is
    /// itself again, and a driver failure stays the driver's.
    #[test]
    fn the_pools_error_inside_an_operation_is_itself_again() {
        let failed = |source: driver::Error| engine::Error::OperationFailed {
            operation: engine::OperationId(1),
            label: "op".into(),
            source,
        };
        let own = Error::UnknownDevice {
            ordinal: 7,
            count: 1,
        };
        assert!(matches!(
            Error::from(failed(own.into())),
            Error::UnknownDevice {
                ordinal: 7,
                count: 1
            }
        ));
        assert!(matches!(
            Error::from(failed(driver::Error::EmptyImage)),
            Error::Driver(driver::Error::EmptyImage)
        ));
    }

    #[test]
    fn messages_name_the_values() {
        let cycle = Error::Cycle {
            path: vec![3, 7, 3],
        };
        assert_eq!(
            cycle.to_string(),
            "dependency would close a cycle: stream 3 -> stream 7 -> stream 3"
        );
        let split = Error::ClassSplitMismatch {
            high: 1,
            normal: 2,
            low: 1,
            size: 8,
        };
        assert_eq!(
            split.to_string(),
            "class split 1 high + 2 normal + 1 low = 4 streams, but the pool has 8"
        );
        let parallel = Error::Parallel {
            failures: vec![
                StreamFailure {
                    stream: 2,
                    error: Error::other("bad input"),
                },
                StreamFailure {
                    stream: 5,
                    error: Error::EmptyPool,
                },
            ],
            total: 4,
        };
        let text = parallel.to_string();
        assert!(text.starts_with("2 of 4 streams failed: stream 2: bad input; stream 5: "));
    }
}
