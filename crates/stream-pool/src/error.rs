//! The stream pool's error type.

use std::fmt;

/// Everything the stream pool and the coordinator can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A call into the safe driver layer failed.
    #[error(transparent)]
    Driver(#[from] driver::Error),
    /// A pool of zero streams was asked for.
    #[error("a stream pool of 0 streams: the size must be at least 1")]
    EmptyPool,
    /// `CUDA_STREAMS_POOL_SIZE` holds something that is not a usable size.
    #[error("{var}={value:?} is not a valid pool size: {reason}")]
    InvalidPoolSize {
        /// The variable read (`CUDA_STREAMS_POOL_SIZE`).
        var: &'static str,
        /// The value found.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
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

/// One stream's failure inside [`Error::Parallel`].
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

#[cfg(test)]
mod tests {
    use super::*;

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
