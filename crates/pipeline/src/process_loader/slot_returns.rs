//! Slots coming back from the GPU. Each upload reads its slot through a
//! [`PinnedRegion`](driver::PinnedRegion), whose drop hands the slot back
//! here with the event of the stream that read it (the driver's own
//! mechanism for lent pinned memory, as the host pool uses it); a slot goes
//! back to a worker only once those events have completed.

use crate::error::{Error, Result};
use driver::{Completion, RegionOwner, ReturnedRegion};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What the regions' drops hand back (a `Mutex`: `give_back` takes `&self`).
#[derive(Default)]
struct Returns(Mutex<Vec<ReturnedRegion>>);

impl RegionOwner for Returns {
    fn give_back(&self, region: ReturnedRegion) {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(region);
    }
}

/// Slots whose uploads may still be reading them, oldest first. A slot's
/// [`ReturnedRegion::token`] is its index.
#[derive(Default)]
pub(crate) struct Draining {
    returns: Arc<Returns>,
    waiting: VecDeque<ReturnedRegion>,
}

impl Draining {
    /// The owner to give each slot's region.
    pub(crate) fn owner(&self) -> Arc<dyn RegionOwner> {
        self.returns.clone()
    }

    fn collect(&mut self) {
        let mut returned = self
            .returns
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        self.waiting.extend(returned.drain(..));
    }

    /// The slots whose uploads have all completed, without waiting.
    pub(crate) fn completed(&mut self) -> Result<Vec<usize>> {
        self.collect();
        let mut done = Vec::new();
        let mut still = VecDeque::with_capacity(self.waiting.len());
        for region in self.waiting.drain(..) {
            let mut finished = true;
            for used in &region.uses {
                finished &= used.event.query()?;
            }
            if finished {
                done.push(region.token as usize);
            } else {
                still.push_back(region);
            }
        }
        self.waiting = still;
        Ok(done)
    }

    /// Wait on the host for the oldest waiting slot's uploads (its events
    /// only, not the whole stream) until `deadline`, and return it; `None`
    /// if none waits. Past the deadline,
    /// [`Error::UploadTimeout`](crate::Error::UploadTimeout) for `batch`
    /// (the one that needs the slot), naming the loader's deadline
    /// `waited`; the slot keeps waiting.
    pub(crate) fn wait_oldest(
        &mut self,
        batch: u64,
        deadline: Instant,
        waited: Duration,
    ) -> Result<Option<usize>> {
        self.collect();
        let Some(region) = self.waiting.pop_front() else {
            return Ok(None);
        };
        for used in &region.uses {
            // The reactor wakes the thread when the event completes: no
            // polling, and a deadline.
            let outcome = used
                .event
                .wait_async()
                .map_err(|err| (0, err))
                .and_then(|wait| {
                    let left = deadline.saturating_duration_since(Instant::now());
                    Completion::wait_any(&mut [wait], Some(left))
                });
            let timed_out = match outcome {
                Ok(Some(_)) => continue,
                Ok(None) => Error::UploadTimeout {
                    batch,
                    slot: region.token as usize,
                    stream: used.stream_id,
                    waited,
                },
                Err((_, err)) => err.into(),
            };
            self.waiting.push_front(region);
            return Err(timed_out);
        }
        Ok(Some(region.token as usize))
    }

    /// Wait for every upload still reading a slot, before the region is
    /// unregistered and unmapped. Never panics; a failed wait is logged (a
    /// failed context runs no more copies).
    pub(crate) fn wait_all(&mut self) {
        self.collect();
        for region in self.waiting.drain(..) {
            for used in &region.uses {
                if let Err(err) = used.event.synchronize() {
                    tracing::warn!(
                        "process loader: waiting for the upload of slot {} on stream {}: {err}",
                        region.token,
                        used.stream_id
                    );
                }
            }
        }
    }
}
