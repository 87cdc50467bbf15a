//! A sampler's counts: which of its scopes on each stream are timed, and how
//! many were not, for the profiler's reports. Apart from the `Sampler` so
//! the profiler can keep them without knowing the sampler, which uses it.

use crate::error::{Error, Result};
use crate::timed_op::Name;
use std::sync::Mutex;

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
    pub(crate) fn count(&self, stream: u64) -> bool {
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

    /// One scope in `every` is timed.
    pub(crate) fn every(&self) -> u64 {
        self.every
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
