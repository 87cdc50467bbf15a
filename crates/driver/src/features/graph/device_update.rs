//! Kernel nodes whose scalar parameters the GPU changes (CUDA 12.4+
//! device-updatable kernel nodes): [`Capture::launch_device_updatable`]
//! hands back a [`DeviceNode`], whose scalar parameters are named
//! ([`DeviceNode::scalar`]) and gathered into a [`ScalarTable`] of an
//! instance ([`GraphExec::scalar_table`](crate::GraphExec::scalar_table)); [`GraphExec::set_scalars`](crate::GraphExec::set_scalars) then
//! sets every one of them from a device buffer with one kernel launch
//! (`device_params.rs`), however many nodes there are. Setting 10,000
//! nodes from the host costs 10,000 driver calls
//! ([`GraphExec::set_args`](crate::GraphExec::set_args)); this costs one launch, and the new values
//! may be computed on the GPU.
//!
//! **What may change.** Only scalars that bound no memory: a parameter
//! that a pointer's extent counts (`n` in `x: &[f32; n]`) stays as
//! captured, because the launch's checks and the order tracker took the
//! buffer's extent from it; pointers never change (the graph keeps its
//! buffers alive and ordered by what it captured). Any value of any other
//! scalar is one the declaration allows, so a set racing a replay can give
//! that replay old or new values, never an unchecked access.
//!
//! **CUDA's rules, kept by construction.** A graph with such nodes is
//! instantiated once (refused after, [`Error::NodeUpdate`](crate::Error::NodeUpdate)), and neither it
//! nor its instance takes part in [`GraphExec::update`](crate::GraphExec::update). Host-side sets of
//! these nodes would race the device's, so a [`DeviceNode`] has none.
//!
//! **Order and lifetime.** Each instance with such nodes has a token
//! buffer: every replay reads it and every set writes it, so the order
//! tracker sees a set and a replay on two unordered streams as the race it
//! is, and dropping the instance waits for the sets still in flight (they
//! write into the instance's parameters) before destroying it.

use super::args::GraphArg;
use super::capture::Capture;
use crate::features::launch_config::LaunchConfig;
use crate::features::module::Kernel;
use crate::features::pdl_policy::Dependency;
use crate::ground::error::{Error, Result};
use crate::objects::stream::Stream;
use std::marker::PhantomData;
use sys::CUgraphNode;
use sys::signature::{Extent, Param, ScalarType, param_layout};

/// A kernel node captured with [`Capture::launch_device_updatable`]: its
/// scalar parameters can be set on the GPU ([`GraphExec::set_scalars`](crate::GraphExec::set_scalars)).
/// It means something only to the one instance of its graph.
#[derive(Clone)]
pub struct DeviceNode {
    pub(super) raw: CUgraphNode,
    /// The capture that recorded it.
    pub(super) capture: u64,
    /// Its place among the capture's nodes, for messages.
    pub(super) position: usize,
    pub(super) kernel: Kernel,
}

// SAFETY: the node handle is an identifier the driver accepts from any
// thread; it is only read, in `GraphExec::scalar_table`.
unsafe impl Send for DeviceNode {}
// SAFETY: as above.
unsafe impl Sync for DeviceNode {}

impl std::fmt::Debug for DeviceNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceNode")
            .field("capture", &self.capture)
            .field("position", &self.position)
            .field("kernel", &self.kernel.name())
            .finish()
    }
}

/// One scalar parameter of a [`DeviceNode`], of type `T`, that the GPU
/// may set: [`DeviceNode::scalar`].
#[derive(Clone, Debug)]
pub struct NodeScalar<T> {
    pub(super) node: DeviceNode,
    /// The parameter's place in the signature.
    pub(super) index: usize,
    /// Its byte offset in the node's parameter buffer (CUDA's layout).
    pub(super) offset: u64,
    _type: PhantomData<fn() -> T>,
}

impl<T> NodeScalar<T> {
    /// The node.
    pub fn node(&self) -> &DeviceNode {
        &self.node
    }

    /// The parameter's index in the kernel's signature.
    pub fn index(&self) -> usize {
        self.index
    }

    /// Its byte offset in the node's kernel parameters.
    pub fn offset(&self) -> u64 {
        self.offset
    }
}

impl DeviceNode {
    /// The kernel it launches.
    pub fn kernel(&self) -> &Kernel {
        &self.kernel
    }

    /// Its place among its capture's nodes.
    pub fn position(&self) -> usize {
        self.position
    }

    /// Parameter `index` of its kernel, as a scalar of type `T` the GPU may
    /// set. Refused ([`Error::NodeUpdate`](crate::Error::NodeUpdate), naming the node, the kernel and
    /// the parameter) when the kernel has no declared signature, when
    /// there is no parameter `index`, when it is not a scalar of type `T`,
    /// and when a pointer's extent counts it (changing it would change
    /// what the kernel may touch, which was checked at capture).
    pub fn scalar<T: ScalarType>(&self, index: usize) -> Result<NodeScalar<T>> {
        let refuse = |why: String| {
            Err(Error::NodeUpdate {
                reason: format!(
                    "parameter {index} of device node {} (`{}`) {why}",
                    self.position,
                    self.kernel.name()
                ),
            })
        };
        let Some(signature) = self.kernel.signature() else {
            return refuse(
                "cannot be set on the device: the kernel has no declared signature".to_string(),
            );
        };
        let Some(param) = signature.get(index) else {
            return refuse(format!(
                "does not exist: the kernel takes {} parameters",
                signature.len()
            ));
        };
        if *param != Param::Scalar(T::SCALAR) {
            return refuse(format!("is {param}, not {}", T::SCALAR));
        }
        let counts = signature.iter().enumerate().find(
            |(_, p)| matches!(p, Param::Pointer { extent: Extent::Arg(arg), .. } if *arg == index),
        );
        if let Some((pointer, _)) = counts {
            return refuse(format!(
                "counts the elements of pointer parameter {pointer}, whose extent was checked \
                 at capture: it stays as captured"
            ));
        }
        Ok(NodeScalar {
            node: self.clone(),
            index,
            offset: param_layout(signature)
                .nth(index)
                .map_or(0, |bytes| bytes.start as u64),
            _type: PhantomData,
        })
    }
}

impl Capture {
    /// [`Capture::launch`], as a device-updatable kernel node (CUDA 12.4+):
    /// its scalar parameters can then be set on the GPU, for every replay
    /// after, with one launch for any number of nodes
    /// ([`DeviceNode::scalar`], [`GraphExec::scalar_table`](crate::GraphExec::scalar_table),
    /// [`GraphExec::set_scalars`](crate::GraphExec::set_scalars)). The graph can then be instantiated only
    /// once, and takes no part in [`GraphExec::update`](crate::GraphExec::update) (CUDA's rules).
    /// Refused in the body of a conditional node, as
    /// [`Capture::launch_updatable`] is.
    ///
    /// ```
    /// use cuda_streams_driver::{Context, DeviceBuffer, GraphArg, LaunchConfig, Module, Stream};
    /// use std::sync::Arc;
    /// # fn main() -> cuda_streams_driver::Result<()> {
    /// let ctx = Context::new(0)?;
    /// let stream = Stream::new(&ctx)?;
    /// let fill = Module::load(&ctx, &kernels::ELEMENTWISE)?.function("fill_u32")?;
    /// let out = Arc::new(DeviceBuffer::<u32>::new(&ctx, 32)?);
    /// let mut capture = stream.begin_capture()?;
    /// let args = [GraphArg::from(32u64), 1u32.into(), GraphArg::write(&out)];
    /// let cfg = LaunchConfig::for_num_elems(32);
    /// let node = capture.launch_device_updatable(&stream, &fill, cfg, &args)?;
    /// let exec = capture.end()?.instantiate()?;
    /// // fill_u32(u64 n, u32 value, u32* out): `value` may change, `n` may not.
    /// let value = node.scalar::<u32>(1)?;
    /// assert!(node.scalar::<u64>(0).is_err(), "n counts out's elements");
    /// let table = exec.scalar_table(&stream, &[value])?;
    /// let new = DeviceBuffer::from_slice(&stream, &[7u32])?;
    /// exec.set_scalars(&stream, &table, &new)?; // one launch, on the GPU
    /// exec.launch(&stream)?;
    /// assert_eq!(out.to_vec(&stream)?, vec![7; 32]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn launch_device_updatable(
        &mut self,
        stream: &Stream,
        kernel: &Kernel,
        config: LaunchConfig,
        args: &[GraphArg],
    ) -> Result<DeviceNode> {
        if !self.owns_graph {
            return Err(Error::NodeUpdate {
                reason: format!(
                    "capture {} is the body of a conditional node: capture device-updatable \
                     launches in the top-level capture",
                    self.id
                ),
            });
        }
        self.launch_checked(stream, kernel, config, args, Dependency::Stream, true)?;
        let raw = self.launch_just_captured(stream, kernel)?;
        // Its instances keep the graph, whose node the table is read from.
        self.resources.updatable = true;
        self.resources.device_updatable = true;
        Ok(DeviceNode {
            raw,
            capture: self.id,
            position: self.nodes - 1,
            kernel: kernel.clone(),
        })
    }
}
