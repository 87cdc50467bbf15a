//! One stream pool per device, behind one handle.

use crate::error::Result;
use crate::kinds::{AllocationStrategy, StreamPurpose};
use crate::pool::StreamPool;
use driver::{Context, PerDevice, Stream};
use std::sync::Arc;

/// A [`StreamPool`] for each device, by ordinal: the handle multi-GPU code
/// passes around instead of one pool per device by hand.
///
/// Each pool's streams belong to its device's context, so work picked from
/// `for_device(d)` runs on device `d`. Peer copies go on the destination
/// device's [`StreamPurpose::P2PTransfer`] stream ([`DevicePools::p2p_stream`]),
/// which pulls the data over the link without holding up that device's
/// kernel streams.
///
/// ```
/// use cuda_streams_stream_pool::driver::DeviceBuffer;
/// use cuda_streams_stream_pool::{AllocationStrategy, DevicePools, StreamPurpose};
/// # fn main() -> Result<(), cuda_streams_stream_pool::Error> {
/// let pools = DevicePools::new(4, AllocationStrategy::RoundRobin)?;
/// let last = pools.len() as i32 - 1; // device 1 when there are two
/// let compute = pools.for_device(0)?.get_stream_for_purpose(StreamPurpose::KernelExecution);
/// let results = DeviceBuffer::from_slice(&compute, &[1.5f32, 2.5])?;
///
/// // Device `last` pulls the results on its peer-copy stream, after compute.
/// let p2p = pools.p2p_stream(last)?;
/// let mut copy = DeviceBuffer::<f32>::new_async(&p2p, 2)?;
/// p2p.wait_stream(&compute)?;
/// p2p.copy_peer_async(&mut copy, &results)?;
/// assert_eq!(copy.to_vec(&p2p)?, [1.5, 2.5]);
/// assert!(pools.for_device(last + 1).is_err());
/// # Ok(())
/// # }
/// ```
pub struct DevicePools {
    pools: PerDevice<Arc<StreamPool>>,
}

impl DevicePools {
    /// A pool of `size_per_device` streams for every device of the selected
    /// driver ([`Context::all`]).
    pub fn new(size_per_device: usize, strategy: AllocationStrategy) -> Result<Self> {
        Self::with_contexts(&Context::all()?, size_per_device, strategy)
    }

    /// A pool of `size_per_device` streams for each of `contexts`, which must
    /// be devices 0, 1, ... in order (so that `for_device` indexes them).
    pub fn with_contexts(
        contexts: &[Arc<Context>],
        size_per_device: usize,
        strategy: AllocationStrategy,
    ) -> Result<Self> {
        let pools = PerDevice::try_new(contexts, |ctx| {
            StreamPool::new_with_strategy(ctx, size_per_device, strategy).map(Arc::new)
        })?;
        Ok(Self { pools })
    }

    /// The pool of device `ordinal`, or [`crate::Error::UnknownDevice`].
    pub fn for_device(&self, ordinal: i32) -> Result<&Arc<StreamPool>> {
        Ok(self.pools.get(ordinal)?)
    }

    /// The stream that carries peer copies into device `ordinal`: its pool's
    /// [`StreamPurpose::P2PTransfer`] stream.
    pub fn p2p_stream(&self, ordinal: i32) -> Result<Arc<Stream>> {
        Ok(self
            .for_device(ordinal)?
            .get_stream_for_purpose(StreamPurpose::P2PTransfer))
    }

    /// How many devices have a pool.
    pub fn len(&self) -> usize {
        self.pools.len()
    }

    /// Whether there are no pools (never, for [`DevicePools::new`]: a driver
    /// has at least one device).
    pub fn is_empty(&self) -> bool {
        self.pools.is_empty()
    }

    /// The pools, by ordinal.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &Arc<StreamPool>> + '_ {
        self.pools.iter()
    }
}

impl std::fmt::Debug for DevicePools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DevicePools")
            .field("devices", &self.pools.len())
            .finish()
    }
}
