//! Element types, reduction operations and unique ids.

use crate::error::{Error, Result};
use driver::DeviceCopy;
use sys::nccl::{ncclDataType_t, ncclRedOp_t, ncclUniqueId};

mod sealed {
    pub trait Sealed {}
}

/// Element types NCCL reduces: 8-, 32- and 64-bit integers, `f32`, `f64`.
/// Sealed: the data type must be one NCCL knows.
pub trait NcclType: DeviceCopy + sealed::Sealed {
    /// NCCL's name for the type.
    const DATA_TYPE: ncclDataType_t;
}

macro_rules! nccl_type {
    ($($t:ty => $d:ident),*) => { $(
        impl sealed::Sealed for $t {}
        impl NcclType for $t {
            const DATA_TYPE: ncclDataType_t = ncclDataType_t::$d;
        }
    )* };
}
nccl_type!(
    i8 => ncclInt8, u8 => ncclUint8, i32 => ncclInt32, u32 => ncclUint32,
    i64 => ncclInt64, u64 => ncclUint64, f32 => ncclFloat32, f64 => ncclFloat64
);

/// How a reduction combines the ranks' values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// The sum.
    Sum,
    /// The product.
    Prod,
    /// The maximum.
    Max,
    /// The minimum.
    Min,
    /// The mean (the sum divided by the number of ranks).
    Avg,
}

impl ReduceOp {
    pub(crate) fn raw(self) -> ncclRedOp_t {
        match self {
            Self::Sum => ncclRedOp_t::ncclSum,
            Self::Prod => ncclRedOp_t::ncclProd,
            Self::Max => ncclRedOp_t::ncclMax,
            Self::Min => ncclRedOp_t::ncclMin,
            Self::Avg => ncclRedOp_t::ncclAvg,
        }
    }
}

/// The id that names one communicator across processes and hosts
/// (`ncclGetUniqueId`): made by one rank, sent to the others over any
/// channel as [`UniqueId::to_bytes`], given to every
/// [`crate::Communicator::init_rank`].
///
/// ```
/// use cuda_streams_collectives::UniqueId;
/// let id = UniqueId::new().unwrap();
/// let bytes = id.to_bytes(); // send these to the other ranks
/// assert_eq!(UniqueId::from_bytes(&bytes).unwrap(), id);
/// assert!(UniqueId::from_bytes(&bytes[..5]).is_err());
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct UniqueId(pub(crate) ncclUniqueId);

impl UniqueId {
    /// A fresh id from the selected driver's NCCL.
    pub fn new() -> Result<Self> {
        let nccl = crate::table::nccl(driver::driver()?.kind)?;
        Ok(Self(sys::nccl::result::get_unique_id(nccl)?))
    }

    /// The id's 128 bytes, to send to the other ranks.
    pub fn to_bytes(&self) -> [u8; 128] {
        self.0.internal.map(|c| c as u8)
    }

    /// The id from the bytes [`UniqueId::to_bytes`] made.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let bytes: [u8; 128] = bytes
            .try_into()
            .map_err(|_| Error::InvalidUniqueId { len: bytes.len() })?;
        Ok(Self(ncclUniqueId {
            internal: bytes.map(|b| b as std::ffi::c_char),
        }))
    }
}

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hash = self
            .to_bytes()
            .iter()
            .fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
                (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
            });
        write!(f, "UniqueId({hash:016x})")
    }
}
