//! Sampling: time every Nth scope of one name on each stream, count them all.

use crate::error::{Error, Result};
use crate::profiler::StreamProfiler;
use crate::scope::ScopeGuard;
use crate::timeline::Name;
use driver::Stream;
use std::sync::{Arc, Mutex};

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

/// What a sampler shares with the profiler's reports.
pub(crate) struct SamplerState {
    pub(crate) name: Name,
    every: u64,
    /// Per stream id: (scopes made, scopes timed). Few streams per sampler,
    /// so a short list beats a map.
    per_stream: Mutex<Vec<(u64, u64, u64)>>,
}

impl SamplerState {
    pub(crate) fn new(name: Name, every: u32) -> Result<Self> {
        if every == 0 {
            return Err(Error::InvalidSampling {
                name: name.into_owned(),
            });
        }
        Ok(Self {
            name,
            every: u64::from(every),
            per_stream: Mutex::new(Vec::new()),
        })
    }

    /// Count a scope on `stream`; whether it is to be timed.
    fn count(&self, stream: u64) -> bool {
        let mut per_stream = self.per_stream.lock().unwrap_or_else(|p| p.into_inner());
        let entry = match per_stream.iter().position(|e| e.0 == stream) {
            Some(i) => &mut per_stream[i],
            None => {
                per_stream.push((stream, 0, 0));
                per_stream.last_mut().expect("just pushed")
            }
        };
        let timed = entry.1 % self.every == 0;
        entry.1 += 1;
        if timed {
            entry.2 += 1;
        }
        timed
    }

    /// Scopes counted on `stream` but not timed.
    pub(crate) fn skipped(&self, stream: u64) -> u64 {
        let per_stream = self.per_stream.lock().unwrap_or_else(|p| p.into_inner());
        per_stream
            .iter()
            .find(|e| e.0 == stream)
            .map_or(0, |e| e.1 - e.2)
    }
}

impl<'a> Sampler<'a> {
    pub(crate) fn new(profiler: &'a StreamProfiler, state: Arc<SamplerState>) -> Self {
        Self { profiler, state }
    }

    /// The name its scopes report under.
    pub fn name(&self) -> &str {
        &self.state.name
    }

    /// One scope in `every` is timed.
    pub fn every(&self) -> u64 {
        self.state.every
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
            .field("every", &self.state.every)
            .finish()
    }
}
