//! What the ranks of one collective must agree on: its kind, count, element
//! type, operation and root, as the meeting compares them.

use crate::types::ReduceOp;
use sys::nccl::ncclDataType_t;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    AllReduce,
    Broadcast,
    Reduce,
    AllGather,
    ReduceScatter,
    /// To the peer in `Shape::root`.
    Send,
    /// From the peer in `Shape::root`.
    Recv,
}

impl Kind {
    /// A send or receive (matched with one peer), not a collective (of
    /// every rank).
    pub(crate) fn is_p2p(self) -> bool {
        matches!(self, Self::Send | Self::Recv)
    }

    /// The method's name, for errors.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::AllReduce => "all_reduce",
            Self::Broadcast => "broadcast",
            Self::Reduce => "reduce",
            Self::AllGather => "all_gather",
            Self::ReduceScatter => "reduce_scatter",
            Self::Send => "send",
            Self::Recv => "recv",
        }
    }
}

/// What the ranks of one collective must agree on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Shape {
    pub(crate) kind: Kind,
    /// Elements per rank as NCCL counts them.
    pub(crate) count: usize,
    pub(crate) dtype: ncclDataType_t,
    pub(crate) op: Option<ReduceOp>,
    /// The root; for a send or receive, the peer.
    pub(crate) root: usize,
    /// Captured into a graph, to run at its replays: the ranks in this
    /// process must all capture a step's collectives or none (NCCL forbids
    /// mixing captured and eager calls of a communicator within a step).
    pub(crate) captured: bool,
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} of {} element(s) of ", self.kind.name(), self.count)?;
        match type_name(self.dtype) {
            Some(name) => write!(f, "{name}")?,
            None => write!(f, "NCCL type {}", self.dtype.0)?,
        }
        if let Some(op) = self.op {
            write!(f, ", {op:?}")?;
        }
        match self.kind {
            Kind::Broadcast | Kind::Reduce => write!(f, ", root {}", self.root)?,
            Kind::Send => write!(f, " to rank {}", self.root)?,
            Kind::Recv => write!(f, " from rank {}", self.root)?,
            _ => {}
        }
        if self.captured {
            write!(f, ", captured into a graph")?;
        }
        Ok(())
    }
}

/// The Rust name of an element type this crate offers.
fn type_name(dtype: ncclDataType_t) -> Option<&'static str> {
    type D = ncclDataType_t;
    Some(match dtype {
        D::ncclInt8 => "i8",
        D::ncclUint8 => "u8",
        D::ncclInt32 => "i32",
        D::ncclUint32 => "u32",
        D::ncclInt64 => "i64",
        D::ncclUint64 => "u64",
        D::ncclFloat32 => "f32",
        D::ncclFloat64 => "f64",
        _ => return None,
    })
}
