//! One memory pool's accounting and attributes, shared by each device's
//! default pool (kept in `memory`) and the pools of host memory (kept in
//! `host_pool_registry`). A leaf, so that both can name it without either
//! naming the other.

/// A pool's attributes, kept as CUDA defines them.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct PoolStats {
    pub(crate) used: usize,
    pub(crate) used_high: usize,
    pub(crate) reserved: usize,
    pub(crate) reserved_high: usize,
    pub(crate) release_threshold: u64,
    /// REUSE_FOLLOW_EVENT_DEPENDENCIES, REUSE_ALLOW_OPPORTUNISTIC,
    /// REUSE_ALLOW_INTERNAL_DEPENDENCIES: stored and reported (all on by
    /// default, as in CUDA); they do not change anything here.
    pub(crate) reuse: [i32; 3],
}
