//! The attack of issue 28, in safe code: register `fill_f32`'s twin again
//! with an extent of one element, so that a checked launch of `fill_f32`
//! would trust it and write 512 floats into a buffer of one. Registering is
//! an `unsafe fn` whose contract this breaks: safe code cannot call it.
#![forbid(unsafe_code)]

use soft_driver::TwinSpec;
use soft_driver::sys::signature::{Access, Extent, Param, Scalar};

const ONE_ELEMENT: &[Param] = &[
    Param::Scalar(Scalar::U64),
    Param::Scalar(Scalar::F32),
    Param::Pointer { elem: Scalar::F32, access: Access::Write, extent: Extent::Elements(1) },
];

fn main() {
    let real = *kernels::ELEMENTWISE.twin("fill_f32").unwrap();
    let shrunk = TwinSpec { params: ONE_ELEMENT, ..real };
    let _ = soft_driver::register_image(kernels::ELEMENTWISE.fatbin(), &[shrunk]);
}
