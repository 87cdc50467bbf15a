//! The device's graph memory beside the allocator's: what the memory nodes
//! of captured graphs ([`driver::GraphBuffer`]) hold. A graph takes its
//! scratch from there at every replay instead of from this allocator (which
//! refuses a capturing stream), so a memory report names both.

use crate::allocator::StreamOrderedAllocator;
use crate::error::Result;
use driver::GraphMemoryUsage;

impl StreamOrderedAllocator {
    /// What the device's graph memory holds for captured graphs, now and at
    /// its peak: N graphs that share their memory
    /// ([`driver::GraphMemoryShare`]) peak at about the largest one's
    /// footprint, N graphs on N streams at the sum.
    ///
    /// ```
    /// use cuda_streams_allocator::StreamOrderedAllocator;
    /// use cuda_streams_allocator::driver::{Context, GraphMemoryShare, Stream};
    /// # fn main() -> cuda_streams_allocator::Result<()> {
    /// let ctx = Context::new(0)?;
    /// let stream = Stream::new(&ctx)?;
    /// let allocator = StreamOrderedAllocator::new(&ctx)?;
    /// let share = GraphMemoryShare::new(&stream);
    /// let mut execs = Vec::new();
    /// for mib in [8usize, 4, 2] {
    ///     let mut capture = stream.begin_capture()?;
    ///     let scratch = capture.graph_buffer::<u8>(&stream, mib << 20)?;
    ///     capture.memset_graph(&stream, &scratch, 0)?;
    ///     execs.push(capture.end()?.instantiate_shared(&share)?);
    /// }
    /// for exec in &execs {
    ///     exec.launch(share.stream())?;
    /// }
    /// stream.synchronize()?;
    /// let graphs = allocator.graph_memory()?;
    /// println!("{}\n{graphs}", allocator.stats());
    /// assert!(graphs.used_high >= 8 << 20);
    /// # Ok(())
    /// # }
    /// ```
    pub fn graph_memory(&self) -> Result<GraphMemoryUsage> {
        Ok(self.context().graph_memory_usage()?)
    }
}
