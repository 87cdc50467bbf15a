//! What the GPU process and a worker say to each other: the environment a
//! worker starts with, and the one frame that goes both ways over their
//! socket (a job out, the same job back once filled).

use std::os::fd::RawFd;

/// Set in a worker's environment to the name of the fill it runs; its
/// presence is what makes [`serve_if_worker`](super::serve_if_worker) serve.
pub(crate) const ENV_WORKER: &str = "CUDA_STREAMS_LOADER_WORKER";
/// Set in a worker's environment to its [`ChannelSpec`].
pub(crate) const ENV_CHANNEL: &str = "CUDA_STREAMS_LOADER_CHANNEL";

/// A worker's exit status when its binary registers no fill of the name asked for.
pub(crate) const EXIT_UNKNOWN_FILL: i32 = 3;
/// A worker's exit status when its channel (environment, descriptors, region) is unusable.
pub(crate) const EXIT_BAD_CHANNEL: i32 = 4;
/// A worker's exit status when its socket fails, or a job names no slot.
pub(crate) const EXIT_BAD_JOB: i32 = 5;

/// Fill `slot` with batch `batch`: sent to a worker, and sent back by it
/// once the slot holds the batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Job {
    pub(crate) slot: u32,
    pub(crate) batch: u64,
}

impl Job {
    /// The frame's size: the slot, four bytes of padding, the batch, little-endian.
    pub(crate) const BYTES: usize = 16;

    pub(crate) fn encode(self) -> [u8; Self::BYTES] {
        let mut frame = [0; Self::BYTES];
        frame[..4].copy_from_slice(&self.slot.to_le_bytes());
        frame[8..].copy_from_slice(&self.batch.to_le_bytes());
        frame
    }

    pub(crate) fn decode(frame: [u8; Self::BYTES]) -> Self {
        let mut slot = [0; 4];
        slot.copy_from_slice(&frame[..4]);
        let mut batch = [0; 8];
        batch.copy_from_slice(&frame[8..]);
        Self {
            slot: u32::from_le_bytes(slot),
            batch: u64::from_le_bytes(batch),
        }
    }
}

/// Where a worker finds its region and its socket, and the region's layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ChannelSpec {
    pub(crate) worker: usize,
    pub(crate) region_fd: RawFd,
    pub(crate) socket_fd: RawFd,
    pub(crate) slots: usize,
    pub(crate) slot_len: usize,
}

impl ChannelSpec {
    pub(crate) fn to_env(self) -> String {
        format!(
            "{},{},{},{},{}",
            self.worker, self.region_fd, self.socket_fd, self.slots, self.slot_len
        )
    }

    /// The spec [`to_env`](Self::to_env) wrote, or `None` for anything else.
    pub(crate) fn parse(text: &str) -> Option<Self> {
        let mut parts = text.split(',');
        let mut next = || parts.next()?.parse::<u64>().ok();
        let spec = Self {
            worker: usize::try_from(next()?).ok()?,
            region_fd: RawFd::try_from(next()?).ok()?,
            socket_fd: RawFd::try_from(next()?).ok()?,
            slots: usize::try_from(next()?).ok()?,
            slot_len: usize::try_from(next()?).ok()?,
        };
        parts.next().is_none().then_some(spec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_and_a_spec_come_back_as_they_went() {
        let job = Job {
            slot: 7,
            batch: u64::MAX - 3,
        };
        assert_eq!(Job::decode(job.encode()), job);
        let spec = ChannelSpec {
            worker: 2,
            region_fd: 9,
            socket_fd: 11,
            slots: 12,
            slot_len: 4096,
        };
        assert_eq!(ChannelSpec::parse(&spec.to_env()), Some(spec));
        assert_eq!(ChannelSpec::parse("2,9,11,12"), None);
        assert_eq!(ChannelSpec::parse("2,9,11,12,4096,1"), None);
        assert_eq!(ChannelSpec::parse("2,-9,11,12,4096"), None);
    }
}
