//! The element-wise reductions NCCL's operations define.

use sys::nccl::{ncclDataType_t, ncclRedOp_t};

/// The element-wise reduction NCCL's operations define.
trait Num: Copy {
    fn sum(self, other: Self) -> Self;
    fn prod(self, other: Self) -> Self;
    fn max(self, other: Self) -> Self;
    fn min(self, other: Self) -> Self;
    fn div(self, n: usize) -> Self;
}

macro_rules! num_int {
    ($($t:ty),*) => { $(
        impl Num for $t {
            fn sum(self, o: Self) -> Self { self.wrapping_add(o) }
            fn prod(self, o: Self) -> Self { self.wrapping_mul(o) }
            fn max(self, o: Self) -> Self { Ord::max(self, o) }
            fn min(self, o: Self) -> Self { Ord::min(self, o) }
            fn div(self, n: usize) -> Self { self / (n as $t) }
        }
    )* };
}
num_int!(i8, u8, i32, u32, i64, u64);

macro_rules! num_float {
    ($($t:ty),*) => { $(
        impl Num for $t {
            fn sum(self, o: Self) -> Self { self + o }
            fn prod(self, o: Self) -> Self { self * o }
            fn max(self, o: Self) -> Self { <$t>::max(self, o) }
            fn min(self, o: Self) -> Self { <$t>::min(self, o) }
            fn div(self, n: usize) -> Self { self / (n as $t) }
        }
    )* };
}
num_float!(f32, f64);

fn reduce_as<T: Num>(op: ncclRedOp_t, inputs: &[Vec<u8>]) -> Vec<u8> {
    let size = std::mem::size_of::<T>();
    let elem = |bytes: &[u8], i: usize| -> T {
        // SAFETY: `i * size + size <= bytes.len()` (i < len / size); T is a
        // plain number, valid for any bits; read_unaligned needs no alignment.
        unsafe { bytes.as_ptr().add(i * size).cast::<T>().read_unaligned() }
    };
    let n = inputs[0].len() / size;
    let mut out = vec![0u8; n * size];
    for i in 0..n {
        let mut acc = elem(&inputs[0], i);
        for input in &inputs[1..] {
            let x = elem(input, i);
            acc = match op {
                ncclRedOp_t::ncclProd => acc.prod(x),
                ncclRedOp_t::ncclMax => acc.max(x),
                ncclRedOp_t::ncclMin => acc.min(x),
                _ => acc.sum(x),
            };
        }
        if op == ncclRedOp_t::ncclAvg {
            acc = acc.div(inputs.len());
        }
        // SAFETY: as for `elem`, into `out`, which holds n elements.
        unsafe {
            out.as_mut_ptr()
                .add(i * size)
                .cast::<T>()
                .write_unaligned(acc)
        };
    }
    out
}

pub(super) fn reduce(
    dtype: ncclDataType_t,
    op: ncclRedOp_t,
    inputs: &[Vec<u8>],
) -> Result<Vec<u8>, String> {
    type D = ncclDataType_t;
    Ok(match dtype {
        D::ncclInt8 => reduce_as::<i8>(op, inputs),
        D::ncclUint8 => reduce_as::<u8>(op, inputs),
        D::ncclInt32 => reduce_as::<i32>(op, inputs),
        D::ncclUint32 => reduce_as::<u32>(op, inputs),
        D::ncclInt64 => reduce_as::<i64>(op, inputs),
        D::ncclUint64 => reduce_as::<u64>(op, inputs),
        D::ncclFloat32 => reduce_as::<f32>(op, inputs),
        D::ncclFloat64 => reduce_as::<f64>(op, inputs),
        other => return Err(format!("data type {} is not supported", other.0)),
    })
}
