//! CUDA graphs: capture work from streams once ([`Capture`]), instantiate it
//! ([`Graph::instantiate`]) and replay it for a fraction of the launch cost
//! ([`GraphExec::launch`]).
//!
//! # Why a capture has its own methods
//!
//! A captured launch runs again at every replay, long after the call that
//! captured it returned, so the borrow-based protocol of eager work (a
//! buffer is lent for one operation, which its use tracker orders) does not
//! hold. Work is therefore captured through the [`Capture`], whose methods
//! take buffers by `Arc` ([`GraphArg`]) and keep them, with the kernels and
//! host callbacks, in the graph's keep-alive list; every executable instance
//! holds that list. At each replay the graph's buffers are registered as
//! used on the replay stream, through the same use trackers as eager work,
//! so a buffer dropped after its graph is still freed only after the last
//! replay. Host callbacks are released in stream order, after the last
//! replay on every stream that launched the graph.
//!
//! While a stream is capturing, its own enqueueing methods, `synchronize`,
//! `query`, and [`crate::Context::synchronize`] are refused with a clear
//! error *before* the driver sees them: on a GPU such a call invalidates the
//! capture, here the capture stays usable.
//!
//! # The files
//!
//! - `args`: what a graph keeps alive ([`GraphArg`], [`HostSlot`], the
//!   host-callback nodes and the keep-alive list);
//! - `capture`: [`Capture`], the second enqueue API, used while a stream
//!   captures: its life (begun, forked, joined, ended);
//! - `capture_nodes`: the nodes a [`Capture`] records, one method each;
//! - `condition_arg`: a [`Condition`] as a kernel argument, refused
//!   outside its graph's capture;
//! - `conditional`: [`Condition`] and the conditional nodes
//!   ([`Capture::while_loop`], [`Capture::if_then`], [`Capture::if_else`],
//!   [`Capture::switch`]);
//! - `device_update`: [`Capture::launch_device_updatable`], a
//!   [`DeviceNode`] and its scalars ([`NodeScalar`]), what the GPU may set;
//! - `device_params`: [`ScalarTable`] and [`GraphExec::set_scalars`], the
//!   set itself, one launch of this crate's own kernel;
//! - `device_sets`: what an instance with device nodes keeps for the sets
//!   (a token buffer and whether it was uploaded);
//! - `exec`: [`Graph`] and [`GraphExec`], instantiated and replayed;
//! - `graph_memory`: [`GraphBuffer`], memory a graph allocates and frees
//!   itself at every replay (memory nodes);
//! - `memory_share`: [`GraphMemoryShare`], graphs that share their memory
//!   because their launches are held to one stream;
//! - `memory_usage`: [`GraphMemoryUsage`], what the device's graph memory
//!   holds, and giving it back;
//! - `node_args`: [`KernelNode`], a captured launch whose arguments an
//!   instance sets in place, and what the instance keeps of them;
//! - `node_update`: [`Capture::launch_updatable`] and
//!   [`GraphExec::set_args`], the capture and the driver call;
//! - `programmatic`: programmatic dependent launches in a capture
//!   ([`Capture::launch_programmatic`]), which become programmatic edges.

mod allocation;
mod args;
mod capture;
mod capture_nodes;
mod condition_arg;
mod conditional;
mod device_params;
mod device_sets;
mod device_update;
mod exec;
mod graph_memory;
mod memory_share;
mod memory_usage;
mod node_args;
mod node_update;
mod programmatic;

pub use args::{GraphArg, HostSlot};
pub use capture::Capture;
pub(crate) use condition_arg::{refuse_eager_condition_params, refuse_eager_conditions};
pub use conditional::{CONDITIONAL_DRIVER_VERSION, Condition, MULTI_BODY_DRIVER_VERSION};
pub use device_params::ScalarTable;
pub use device_update::{DeviceNode, NodeScalar};
pub use exec::{Graph, GraphExec};
pub use graph_memory::GraphBuffer;
pub use memory_share::GraphMemoryShare;
pub use memory_usage::GraphMemoryUsage;
pub use node_args::KernelNode;
