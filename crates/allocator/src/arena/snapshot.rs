//! The arena's segments and blocks as plain values, for
//! [`crate::StreamOrderedAllocator::snapshot`]. A child of `arena`, so it
//! reads the arena's private structure without widening it.

use super::{Arena, State};
use crate::snapshot::{BlockSnapshot, BlockState, SegmentSnapshot};

impl Arena {
    /// Every segment by address, each with its blocks by address.
    pub(crate) fn segments_snapshot(&self) -> Vec<SegmentSnapshot> {
        let mut segments: Vec<SegmentSnapshot> = self
            .segments
            .values()
            .map(|segment| SegmentSnapshot {
                address: segment.base,
                size: segment.size,
                blocks: Vec::new(),
            })
            .collect();
        segments.sort_by_key(|s| s.address);
        for (&address, block) in &self.blocks {
            let Ok(i) = segments.binary_search_by_key(&block.segment, |s| s.address) else {
                continue;
            };
            let (state, requested, used_on) = match &block.state {
                State::Free => (BlockState::Free, 0, Vec::new()),
                State::Live(live) => (
                    BlockState::Live,
                    live.requested,
                    live.uses.iter().map(|s| s.id()).collect(),
                ),
                State::Pending => (BlockState::PendingFree, 0, Vec::new()),
            };
            segments[i].blocks.push(BlockSnapshot {
                address,
                size: block.size,
                state,
                requested,
                used_on,
            });
        }
        for segment in &mut segments {
            segment.blocks.sort_by_key(|b| b.address);
        }
        segments
    }
}
