//! [`GraphMemoryUsage`]: what a device's graph memory holds for the memory
//! nodes of graphs ([`GraphBuffer`](super::GraphBuffer)), read with
//! `cuDeviceGetGraphMemAttribute`, and giving back what no graph needs
//! (`cuDeviceGraphMemTrim`).

use crate::ground::error::Result;
use crate::ground::units::format_bytes;
use crate::objects::context::Context;
use std::fmt;
use sys::CUgraphMem_attribute;

/// A device's graph memory: what graph launches hold for their memory
/// nodes now and at most, and what the driver keeps reserved for them. N
/// graphs that share their memory ([`GraphMemoryShare`](super::GraphMemoryShare)) peak at about
/// the largest one's footprint; N graphs launched on N streams at the sum.
///
/// ```
/// use cuda_streams_driver::{Context, Stream};
/// # fn main() -> cuda_streams_driver::Result<()> {
/// let ctx = Context::new(0)?;
/// let stream = Stream::new(&ctx)?;
/// let mut capture = stream.begin_capture()?;
/// let scratch = capture.graph_buffer::<u8>(&stream, 1 << 20)?;
/// capture.memset_graph(&stream, &scratch, 0)?;
/// let exec = capture.end()?.instantiate()?;
/// exec.launch(&stream)?;
/// stream.synchronize()?;
/// let first = ctx.graph_memory_usage()?;
/// exec.launch(&stream)?; // the second launch reuses the first one's memory
/// stream.synchronize()?;
/// let second = ctx.graph_memory_usage()?;
/// assert_eq!(second.used_high, first.used_high, "{second}");
/// // e.g. "graph memory: 1.0 MiB in use (peak 1.0 MiB), 1.0 MiB reserved
/// // (peak 1.0 MiB)"; a GPU reserves whole granules (32 MiB on an H100).
/// println!("{second}");
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct GraphMemoryUsage {
    /// Bytes held for graphs now (`CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT`).
    pub used: u64,
    /// The most bytes held for graphs since the peaks were last reset
    /// (`CU_GRAPH_MEM_ATTR_USED_MEM_HIGH`).
    pub used_high: u64,
    /// Bytes the driver keeps reserved for graphs
    /// (`CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT`).
    pub reserved: u64,
    /// The most bytes reserved since the peaks were last reset
    /// (`CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH`).
    pub reserved_high: u64,
}

impl fmt::Display for GraphMemoryUsage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "graph memory: {} in use (peak {}), {} reserved (peak {})",
            format_bytes(self.used),
            format_bytes(self.used_high),
            format_bytes(self.reserved),
            format_bytes(self.reserved_high)
        )
    }
}

impl Context {
    /// What this context's device holds for graph memory nodes.
    pub fn graph_memory_usage(&self) -> Result<GraphMemoryUsage> {
        use CUgraphMem_attribute as A;
        self.bind()?;
        let read = |attr: A| -> Result<u64> {
            let mut value: u64 = 0;
            // SAFETY: a valid device of a bound context; the attribute's value
            // is a `cuuint64_t`, written through a valid pointer.
            let code = unsafe {
                (self.driver().cuDeviceGetGraphMemAttribute)(
                    self.device(),
                    attr,
                    (&raw mut value).cast(),
                )
            };
            self.check(code).map(|()| value)
        };
        Ok(GraphMemoryUsage {
            used: read(A::CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT)?,
            used_high: read(A::CU_GRAPH_MEM_ATTR_USED_MEM_HIGH)?,
            reserved: read(A::CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT)?,
            reserved_high: read(A::CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH)?,
        })
    }

    /// Start the peaks of [`Context::graph_memory_usage`] again from the
    /// current figures (for measuring one workload's peak).
    pub fn reset_graph_memory_peaks(&self) -> Result<()> {
        use CUgraphMem_attribute as A;
        self.bind()?;
        for attr in [
            A::CU_GRAPH_MEM_ATTR_USED_MEM_HIGH,
            A::CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH,
        ] {
            let mut zero: u64 = 0;
            // SAFETY: a valid device of a bound context; 0 is the one value
            // a high mark may be set to, passed through a valid pointer.
            let code = unsafe {
                (self.driver().cuDeviceSetGraphMemAttribute)(
                    self.device(),
                    attr,
                    (&raw mut zero).cast(),
                )
            };
            self.check(code)?;
        }
        Ok(())
    }

    /// Give the graph memory that no graph launch in flight holds back to
    /// the device (`cuDeviceGraphMemTrim`).
    pub fn trim_graph_memory(&self) -> Result<()> {
        self.bind()?;
        // SAFETY: a valid device of a bound context.
        self.check(unsafe { (self.driver().cuDeviceGraphMemTrim)(self.device()) })
    }
}
