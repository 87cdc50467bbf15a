//! What an operation touches: bytes of one context's memory, read or
//! written ([`Touch`]).

use smallvec::SmallVec;

/// Bytes an operation touches: `bytes` at `address` in the memory of
/// context `ctx`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Touch {
    pub(crate) ctx: u64,
    pub(crate) address: u64,
    pub(crate) bytes: usize,
    pub(crate) write: bool,
}

impl Touch {
    pub(super) fn range(self) -> (u64, u64) {
        (self.address, self.address.saturating_add(self.bytes as u64))
    }
}

/// The touches of one operation, on the stack for up to eight buffers.
pub(crate) type Touches = SmallVec<[Touch; 8]>;
