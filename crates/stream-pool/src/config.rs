//! Building a pool: the constructors and the builder behind them (size,
//! strategy, class split, and the size from the environment).

use crate::error::{Error, Result};
use crate::kinds::AllocationStrategy;
use crate::layout::ClassSplit;
use crate::pool::StreamPool;
use driver::Context;
use driver::sys::env::{Found, Setting};
use std::sync::Arc;

/// The environment variable that sets the pool size ([`PoolBuilder::size_from_env`]).
pub const POOL_SIZE_ENV: &str = "CUDA_STREAMS_POOL_SIZE";

/// The pool size used when none is given.
pub const DEFAULT_POOL_SIZE: usize = 8;

/// The largest pool size accepted from the environment (a typo guard: each
/// stream is a driver object and, on the software driver, a thread).
pub const MAX_ENV_POOL_SIZE: usize = 1024;

/// `CUDA_STREAMS_POOL_SIZE` as a setting (for listings such as `cuda-streams info`).
pub const POOL_SIZE_SETTING: Setting = Setting {
    name: POOL_SIZE_ENV,
    aliases: &[],
    default: "8",
    about: "streams in a pool built with size_from_env (1 to 1024)",
};

/// Configures and builds a [`StreamPool`].
///
/// ```
/// use cuda_streams_stream_pool::driver::Context;
/// use cuda_streams_stream_pool::{AllocationStrategy, ClassSplit, StreamPool};
/// let ctx = Context::new(0).unwrap();
/// let pool = StreamPool::builder(&ctx)
///     .size(6)
///     .strategy(AllocationStrategy::LoadBalanced)
///     .class_split(ClassSplit { high: 2, normal: 2, low: 2 })
///     .build()
///     .unwrap();
/// assert_eq!(pool.len(), 6);
/// assert_eq!(pool.strategy(), AllocationStrategy::LoadBalanced);
/// ```
#[derive(Clone, Debug)]
#[must_use]
pub struct PoolBuilder {
    ctx: Arc<Context>,
    size: usize,
    strategy: AllocationStrategy,
    split: Option<ClassSplit>,
}

impl PoolBuilder {
    pub(crate) fn new(ctx: &Arc<Context>) -> Self {
        Self {
            ctx: Arc::clone(ctx),
            size: DEFAULT_POOL_SIZE,
            strategy: AllocationStrategy::default(),
            split: None,
        }
    }

    /// How many shared streams to create (default [`DEFAULT_POOL_SIZE`]).
    pub fn size(mut self, size: usize) -> Self {
        self.size = size;
        self
    }

    /// The strategy of [`StreamPool::get_stream`] (default `RoundRobin`).
    pub fn strategy(mut self, strategy: AllocationStrategy) -> Self {
        self.strategy = strategy;
        self
    }

    /// How many streams each priority class gets; must add up to the size
    /// (default [`ClassSplit::default_for`]).
    pub fn class_split(mut self, split: ClassSplit) -> Self {
        self.split = Some(split);
        self
    }

    /// Take the size from `CUDA_STREAMS_POOL_SIZE` when it is set (and keep
    /// the size given so far when it is not). A value that is not a whole
    /// number from 1 to [`MAX_ENV_POOL_SIZE`] is an error naming it.
    pub fn size_from_env(self) -> Result<Self> {
        match POOL_SIZE_SETTING.from_env()? {
            None => Ok(self),
            Some(found) => Ok(self.size(found.parse_int(1..=MAX_ENV_POOL_SIZE)?)),
        }
    }

    /// Create the streams.
    pub fn build(self) -> Result<StreamPool> {
        if self.size == 0 {
            return Err(Error::EmptyPool);
        }
        let split = self
            .split
            .unwrap_or_else(|| ClassSplit::default_for(self.size));
        if split.total() != self.size {
            return Err(Error::ClassSplitMismatch {
                high: split.high,
                normal: split.normal,
                low: split.low,
                size: self.size,
            });
        }
        StreamPool::create(&self.ctx, split, self.strategy)
    }
}

/// The constructors all go through the builder, so that every pool is
/// checked the same way.
impl StreamPool {
    /// A pool of `size` streams split across the priority classes by
    /// [`ClassSplit::default_for`], handed out by `strategy`.
    pub fn new_with_strategy(
        ctx: &Arc<Context>,
        size: usize,
        strategy: AllocationStrategy,
    ) -> Result<Self> {
        Self::builder(ctx).size(size).strategy(strategy).build()
    }

    /// A pool of `size` streams, round-robin.
    pub fn new(ctx: &Arc<Context>, size: usize) -> Result<Self> {
        Self::new_with_strategy(ctx, size, AllocationStrategy::RoundRobin)
    }

    /// A builder: size, strategy, class split, size from the environment.
    pub fn builder(ctx: &Arc<Context>) -> PoolBuilder {
        PoolBuilder::new(ctx)
    }
}

/// Parse a pool size as `CUDA_STREAMS_POOL_SIZE` holds it.
///
/// ```
/// use cuda_streams_stream_pool::parse_pool_size;
/// assert_eq!(parse_pool_size(" 16 ").unwrap(), 16);
/// let err = parse_pool_size("eight").unwrap_err().to_string();
/// assert_eq!(err, "environment variable CUDA_STREAMS_POOL_SIZE=\"eight\" is invalid: \
///                  expected a whole number from 1 to 1024");
/// ```
pub fn parse_pool_size(value: &str) -> Result<usize> {
    let found = Found {
        setting: POOL_SIZE_SETTING,
        var: POOL_SIZE_ENV,
        value: value.to_string(),
        overridden: Vec::new(),
    };
    Ok(found.parse_int(1..=MAX_ENV_POOL_SIZE)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_sizes_parse_or_name_the_bad_value() {
        assert_eq!(parse_pool_size("1").unwrap(), 1);
        assert_eq!(parse_pool_size("1024").unwrap(), 1024);
        for (bad, reason) in [
            ("", "whole number"),
            ("-3", "whole number"),
            ("4.5", "whole number"),
            ("0", "from 1 to 1024"),
            ("1025", "from 1 to 1024"),
            ("99999999999999999999999", "whole number"),
        ] {
            let message = parse_pool_size(bad).unwrap_err().to_string();
            assert!(
                message.contains(&format!("CUDA_STREAMS_POOL_SIZE={bad:?} is invalid")),
                "{message}"
            );
            assert!(message.contains(reason), "{message}");
        }
    }
}
