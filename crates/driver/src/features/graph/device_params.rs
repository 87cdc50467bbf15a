//! Setting device nodes' scalars on the GPU (`device_update.rs` says what
//! may change and why): a [`ScalarTable`] holds, in device memory, the
//! device handle and the parameter offset of each scalar, checked when it
//! is made; [`GraphExec::set_scalars`] launches this crate's
//! `set_node_params_*` kernel (`crates/driver/kernels/graph_update.cu`)
//! over the table and a buffer of new values.

use super::device_sets::DeviceSets;
use super::device_update::NodeScalar;
use super::exec::GraphExec;
use crate::enqueue::protocol::{Use, Work};
use crate::features::kernel_arg::KernelArg;
use crate::features::kernel_decl::KernelDecl;
use crate::features::launch_config::LaunchConfig;
use crate::features::launch_raw::{LaunchAttrs, launch_raw};
use crate::features::module::{Kernel, Module, ModuleImage};
use crate::ground::error::{Error, Result};
use crate::objects::memory::{DeviceBuffer, DeviceCopy, DeviceMemory};
use crate::objects::stream::Stream;
use crate::{DeclaredKernel, kernel};
use std::marker::PhantomData;
use std::sync::Arc;
use sys::signature::ScalarType;

kernel! {
    /// `set_node_params_u8(u64 count, const u64* nodes, const u64* offsets,
    /// const u8* values)`: for each i, `cudaGraphKernelNodeSetParam(nodes[i],
    /// offsets[i], &values[i], 1)`.
    struct SetNodeParamsU8: fn set_node_params_u8(count: u64, nodes: &[u64; count], offsets: &[u64; count], values: &[u8; count]);
    twin = per_grid(|_, _count, nodes, offsets, values| {
        for ((node, offset), value) in nodes.iter().zip(offsets).zip(values) {
            soft_driver::set_kernel_node_param(*node, *offset as usize, &value.to_ne_bytes());
        }
    });
}

kernel! {
    /// `set_node_params_u32(...)`: as `set_node_params_u8`, 4-byte values.
    struct SetNodeParamsU32: fn set_node_params_u32(count: u64, nodes: &[u64; count], offsets: &[u64; count], values: &[u32; count]);
    twin = per_grid(|_, _count, nodes, offsets, values| {
        for ((node, offset), value) in nodes.iter().zip(offsets).zip(values) {
            soft_driver::set_kernel_node_param(*node, *offset as usize, &value.to_ne_bytes());
        }
    });
}

kernel! {
    /// `set_node_params_u64(...)`: as `set_node_params_u8`, 8-byte values.
    struct SetNodeParamsU64: fn set_node_params_u64(count: u64, nodes: &[u64; count], offsets: &[u64; count], values: &[u64; count]);
    twin = per_grid(|_, _count, nodes, offsets, values| {
        for ((node, offset), value) in nodes.iter().zip(offsets).zip(values) {
            soft_driver::set_kernel_node_param(*node, *offset as usize, &value.to_ne_bytes());
        }
    });
}

/// `graph_update.cu`, device-linked with the device runtime by
/// `cargo xtask build-kernels`.
static GRAPH_UPDATE: &[u8] = include_bytes!("../../../kernels/graph_update.fatbin");

/// Its declarations.
static DECLARED: &[KernelDecl] = &[
    SetNodeParamsU8::DECL,
    SetNodeParamsU32::DECL,
    SetNodeParamsU64::DECL,
];

/// The kernel that sets scalars `width` bytes wide, loaded in `stream`'s
/// context.
fn setter(stream: &Stream, width: usize) -> Result<Kernel> {
    // SAFETY: graph_update.cu's kernels take exactly these parameters and
    // read `count` elements of each pointer, writing none of them (they
    // write kernel node parameters, through the device runtime).
    let image = unsafe { ModuleImage::declared(GRAPH_UPDATE, DECLARED) };
    let module = Module::load(stream.context(), image)?;
    let name = match width {
        1 => SetNodeParamsU8::DECL.name,
        4 => SetNodeParamsU32::DECL.name,
        8 => SetNodeParamsU64::DECL.name,
        other => {
            return Err(Error::NodeUpdate {
                reason: format!("no kernel sets {other}-byte scalars on the device"),
            });
        }
    };
    module.function(name)
}

/// The device handles and parameter offsets of scalars of device nodes of
/// one instance ([`GraphExec::scalar_table`]), in device memory, for
/// [`GraphExec::set_scalars`].
pub struct ScalarTable<T> {
    /// The capture whose (one) instance it belongs to.
    pub(super) capture: u64,
    nodes: DeviceBuffer<u64>,
    offsets: DeviceBuffer<u64>,
    setter: Kernel,
    _type: PhantomData<fn() -> T>,
}

impl<T> ScalarTable<T> {
    /// How many scalars it sets.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether it sets none (never: an empty table is refused).
    pub fn is_empty(&self) -> bool {
        self.nodes.len() == 0
    }
}

impl<T> std::fmt::Debug for ScalarTable<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScalarTable")
            .field("capture", &self.capture)
            .field("len", &self.len())
            .finish()
    }
}

impl GraphExec {
    /// A table of `scalars` of this instance's device nodes, for
    /// [`GraphExec::set_scalars`]: each one's device handle
    /// (`cuGraphKernelNodeGetAttribute`) and parameter offset, uploaded on
    /// `stream`. Made once, used for any number of sets.
    ///
    /// Refused ([`Error::NodeUpdate`]) when `scalars` is empty, and for a
    /// scalar of a node of another graph's capture, naming the node.
    pub fn scalar_table<T: ScalarType + DeviceCopy>(
        &self,
        stream: &Arc<Stream>,
        scalars: &[NodeScalar<T>],
    ) -> Result<ScalarTable<T>> {
        if scalars.is_empty() {
            return Err(Error::NodeUpdate {
                reason: "a scalar table needs at least one scalar".to_string(),
            });
        }
        stream.check_context("the executable graph", &self.ctx)?;
        self.ctx.bind()?;
        let mut nodes = Vec::with_capacity(scalars.len());
        for scalar in scalars {
            let node = &scalar.node;
            if node.capture != self.instantiated_from {
                return Err(Error::NodeUpdate {
                    reason: format!(
                        "device node {} (`{}`) was captured by capture {}, but this executable \
                         graph was instantiated from the graph of capture {}",
                        node.position,
                        node.kernel.name(),
                        node.capture,
                        self.instantiated_from
                    ),
                });
            }
            nodes.push(self.device_handle(node)?);
        }
        let offsets: Vec<u64> = scalars.iter().map(|s| s.offset).collect();
        let sets = self.device_sets()?;
        self.upload_for_device_sets(sets, stream)?;
        Ok(ScalarTable {
            capture: self.instantiated_from,
            nodes: DeviceBuffer::from_slice(stream, &nodes)?,
            offsets: DeviceBuffer::from_slice(stream, &offsets)?,
            setter: setter(stream, size_of::<T>())?,
            _type: PhantomData,
        })
    }

    /// Upload the instance once, before its first device-side set: on a
    /// GPU the parameters a set writes are the uploaded copy, and the first
    /// upload (`cuGraphUpload`, or the first launch's) copies the host's
    /// over whatever a set wrote before it (an H100 kept the captured
    /// values so). Waited for on the host, so that a set on any stream
    /// comes after it; later launches upload nothing, since the instance
    /// takes no host-side update.
    fn upload_for_device_sets(&self, sets: &DeviceSets, stream: &Stream) -> Result<()> {
        let mut uploaded = sets.uploaded.lock().unwrap_or_else(|p| p.into_inner());
        if !*uploaded {
            self.upload(stream)?;
            stream.synchronize()?;
            *uploaded = true;
        }
        Ok(())
    }

    /// What the instance keeps for device-side sets, or the refusal of a
    /// set on an instance without device nodes.
    fn device_sets(&self) -> Result<&DeviceSets> {
        self.device_sets.as_ref().ok_or_else(|| Error::NodeUpdate {
            reason: "this executable graph has no device nodes".to_string(),
        })
    }

    /// The device handle of `node` (`cuGraphKernelNodeGetAttribute`), as
    /// the `u64` the setting kernel takes; the context bound by the caller.
    fn device_handle(&self, node: &super::device_update::DeviceNode) -> Result<u64> {
        let mut value = sys::CUlaunchAttributeValue::default();
        // SAFETY: a node of the graph this instance keeps alive (`_graph`,
        // kept for every graph with device nodes); valid out-pointer.
        let code = unsafe {
            (self.ctx.driver().cuGraphKernelNodeGetAttribute)(
                node.raw,
                sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE,
                &mut value,
            )
        };
        self.ctx.check(code)?;
        // SAFETY: the attribute asked for says which member is set.
        let handle = unsafe { value.deviceUpdatableKernelNode.devNode } as u64;
        if handle == 0 {
            return Err(Error::NodeUpdate {
                reason: format!(
                    "the driver gave device node {} (`{}`) no device handle",
                    node.position,
                    node.kernel.name()
                ),
            });
        }
        Ok(handle)
    }

    /// Set every scalar of `table` to the matching element of `values`, on
    /// the GPU, in stream order on `stream`: one kernel launch, after which
    /// the replays launched (in stream order) see the new values. `values`
    /// may be written by earlier work on `stream` (a value computed on the
    /// GPU), and needs at least `table.len()` elements.
    ///
    /// Order it against replays on other streams as any write: the order
    /// tracker (`CUDA_STREAMS_ORDERING=check`) refuses a set and a replay
    /// on two streams that nothing orders. Refused for a table of another
    /// instance, and for too few values, naming the counts.
    pub fn set_scalars<T: ScalarType + DeviceCopy>(
        &self,
        stream: &Stream,
        table: &ScalarTable<T>,
        values: &impl DeviceMemory<Elem = T>,
    ) -> Result<()> {
        if table.capture != self.instantiated_from {
            return Err(Error::NodeUpdate {
                reason: format!(
                    "the scalar table belongs to the instance of capture {}, not to this one \
                     (capture {})",
                    table.capture, self.instantiated_from
                ),
            });
        }
        let count = table.len();
        if values.device_len() < count {
            return Err(Error::NodeUpdate {
                reason: format!(
                    "{} values for a scalar table of {count}",
                    values.device_len()
                ),
            });
        }
        let sets = self.device_sets()?;
        stream.check_context("the executable graph", &self.ctx)?;
        let uses = [
            Use::Device(&table.nodes, false),
            Use::Device(&table.offsets, false),
            Use::Device(values, false),
            Use::Device(&sets.token, true),
        ];
        let args = [
            KernelArg::from(count as u64),
            KernelArg::from(table.nodes.device_ptr()),
            KernelArg::from(table.offsets.device_ptr()),
            KernelArg::from(values.device_ptr()),
        ];
        let config = LaunchConfig::for_num_elems(count.min(u32::MAX as usize) as u32);
        let function = stream.function_for(&table.setter)?;
        stream.enqueue_tracked(uses, Work::KernelLaunch, |driver, raw| {
            // SAFETY: the setter takes (u64 count, const u64* nodes, const
            // u64* offsets, const T* values) with T as wide as the kernel's
            // values (chosen by width); each buffer holds `count` elements
            // and stays allocated until the stream passes the launch
            // (tracked); every (node, offset) was read from this instance's
            // device nodes and checked to be a scalar of type T that counts
            // no pointer's elements, and the instance outlives the launch
            // (its drop waits for the token's uses).
            unsafe { launch_raw(driver, raw, function, config, &args, LaunchAttrs::default()) }
        })
    }
}
