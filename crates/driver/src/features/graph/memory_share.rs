//! [`GraphMemoryShare`]: graphs that share one pool of graph memory because
//! the library holds their launches to one stream, so that they never run
//! at once (PyTorch's `graph_pool_handle()`, enforced instead of promised).
//!
//! CUDA backs a graph's memory nodes ([`GraphBuffer`](super::GraphBuffer))
//! from the device's graph memory and lets graphs launched into the same
//! stream reuse the same physical memory, since one stream runs them one
//! after the other; graphs launched into different streams may run at once
//! and each keep memory of their own. N graphs that share therefore peak at
//! about the largest one's footprint, where N graphs on N streams peak at
//! the sum.
//!
//! PyTorch lets graphs share a private pool on the user's word that they
//! never run concurrently; if they do, they silently corrupt each other's
//! memory. Here the word is not needed: an instance made with
//! [`Graph::instantiate_shared`] is refused ([`Error::GraphMemory`]) on any
//! stream but the share's, so sharing is a safe call. Work of other
//! streams that feeds the graphs joins the share's stream with
//! [`Stream::wait_stream`](crate::Stream::wait_stream) or events, as for any work.

use super::exec::{Graph, GraphExec};
use crate::ground::error::Result;
use crate::objects::stream::Stream;
use std::fmt;
use std::sync::Arc;

/// A set of graphs sharing their graph memory: every instance made through
/// it ([`Graph::instantiate_shared`]) launches only on its stream, so none
/// runs while another does, and their memory nodes reuse one footprint.
///
/// ```
/// use cuda_streams_driver::{Context, DeviceBuffer, GraphMemoryShare, Stream};
/// use std::sync::Arc;
/// # fn main() -> cuda_streams_driver::Result<()> {
/// let ctx = Context::new(0)?;
/// let (stream, other) = (Stream::new(&ctx)?, Stream::new(&ctx)?);
/// let out = Arc::new(DeviceBuffer::<u8>::new(&ctx, 1 << 20)?);
/// let share = GraphMemoryShare::new(&stream);
/// let mut execs = Vec::new();
/// for value in 1..=3u8 {
///     let mut capture = stream.begin_capture()?;
///     let scratch = capture.graph_buffer::<u8>(&stream, 1 << 20)?;
///     capture.memset_graph(&stream, &scratch, value)?;
///     capture.copy_from_graph(&stream, &out, &scratch)?;
///     execs.push(capture.end()?.instantiate_shared(&share)?);
/// }
/// for exec in &execs {
///     exec.launch(&stream)?; // one after the other: one footprint serves all
/// }
/// assert!(execs[0].launch(&other).is_err(), "held to the share's stream");
/// assert_eq!(out.to_vec(&stream)?[0], 3);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct GraphMemoryShare {
    stream: Arc<Stream>,
}

impl GraphMemoryShare {
    /// A share whose graphs launch on `stream`.
    pub fn new(stream: &Stream) -> Self {
        Self {
            stream: stream.to_arc(),
        }
    }

    /// The stream every instance of the share launches on.
    pub fn stream(&self) -> &Arc<Stream> {
        &self.stream
    }
}

impl fmt::Debug for GraphMemoryShare {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GraphMemoryShare")
            .field("stream", &self.stream.id())
            .finish()
    }
}

impl Graph {
    /// An executable instance that shares graph memory with the other
    /// instances of `share`: its launches are held to the share's stream
    /// ([`GraphExec::launch`] on another stream is refused with
    /// [`Error::GraphMemory`](crate::Error::GraphMemory)).
    pub fn instantiate_shared(&self, share: &GraphMemoryShare) -> Result<GraphExec> {
        share
            .stream
            .check_context("the graph memory share's stream", &self.ctx)?;
        self.instantiate_held(Some(Arc::clone(&share.stream)))
    }
}
