//! Sampling: time every Nth scope of one name on each stream, count them all.

use crate::error::Result;
use crate::profiler::StreamProfiler;
use crate::sampler_state::SamplerState;
use crate::scope::ScopeGuard;
use crate::timed_op::Name;
use driver::Stream;
use std::sync::Arc;

/// Times one scope in `every` of one name on each stream and counts every
/// one ([`StreamProfiler::sampler`]), for launch-bound loops where a timing
/// event per launch would cost more than the launch.
///
/// The first scope on each stream is timed, then every `every`-th. A scope
/// that is not timed costs a lock and a counter, no driver call. Reports
/// give the name's `count` (every scope) and `timed` (the sampled ones,
/// which the statistics describe).
///
/// ```
/// use cuda_streams_profiler::StreamProfiler;
/// use cuda_streams_profiler::driver::{Context, DeviceBuffer, Stream};
/// # fn main() -> cuda_streams_profiler::Result<()> {
/// let ctx = Context::new(0)?;
/// let stream = Stream::new(&ctx)?;
/// let mut buf = DeviceBuffer::<u32>::new_async(&stream, 1024)?;
/// let profiler = StreamProfiler::new(&ctx)?;
/// profiler.enable();
/// let memsets = profiler.sampler("memset", 10)?;
/// for i in 0..25 {
///     memsets.time(&stream, |s| s.memset_u32_async(&mut buf, i))??;
/// }
/// let stats = profiler.get_stream_report(&stream).unwrap().operations["memset"];
/// assert_eq!((stats.count, stats.timed), (25, 3)); // the 1st, 11th and 21st
/// # Ok(())
/// # }
/// ```
pub struct Sampler<'a> {
    profiler: &'a StreamProfiler,
    state: Arc<SamplerState>,
}

// Here rather than in `profiler.rs`: a sampler opens its scopes through the
// profiler, which keeps only the counts it reports (`SamplerState`).
impl StreamProfiler {
    /// A [`Sampler`] timing one scope named `name` in `every` on each stream
    /// and counting them all: the sampling mode for launch-bound loops.
    /// `every` = 0 is [`Error::InvalidSampling`](crate::Error::InvalidSampling).
    pub fn sampler(&self, name: impl Into<Name>, every: u32) -> Result<Sampler<'_>> {
        let state = Arc::new(SamplerState::new(name.into(), every)?);
        self.add_sampler(Arc::clone(&state));
        Ok(Sampler {
            profiler: self,
            state,
        })
    }
}

impl Sampler<'_> {
    /// The name its scopes report under.
    pub fn name(&self) -> &str {
        &self.state.name
    }

    /// One scope in `every` is timed.
    pub fn every(&self) -> u64 {
        self.state.every()
    }

    /// A scope of this sampler's name on `stream`: timed when its turn comes,
    /// inert (but counted) otherwise, and inert and uncounted while the
    /// profiler is disabled.
    pub fn scope<'s>(&'s self, stream: &'s Stream) -> Result<ScopeGuard<'s>> {
        if !self.profiler.is_enabled() {
            return Ok(ScopeGuard::inert());
        }
        if self.state.count(stream.id()) {
            self.profiler.scope(stream, self.state.name.clone())
        } else {
            Ok(ScopeGuard::inert())
        }
    }

    /// [`Sampler::scope`] around the work `f` enqueues, as
    /// [`StreamProfiler::time`].
    pub fn time<R>(&self, stream: &Stream, f: impl FnOnce(&Stream) -> R) -> Result<R> {
        let scope = self.scope(stream)?;
        let value = f(stream);
        scope.finish()?;
        Ok(value)
    }
}

impl std::fmt::Debug for Sampler<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sampler")
            .field("name", &self.state.name)
            .field("every", &self.state.every())
            .finish()
    }
}
