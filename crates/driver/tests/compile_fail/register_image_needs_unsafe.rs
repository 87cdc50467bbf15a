//! The attack of issue 28, in safe code: register a twin for `fill_f32`
//! with an extent of one element, so that a checked launch of `fill_f32`
//! would trust it and write 512 floats into a buffer of one. Registering is
//! an `unsafe fn` whose contract this breaks: safe code cannot call it.
#![forbid(unsafe_code)]

use soft_driver::sys::signature::{Access, Extent, Param, Scalar};
use soft_driver::{LaunchDims, TwinSpec};

const ONE_ELEMENT: &[Param] = &[
    Param::Scalar(Scalar::U64),
    Param::Scalar(Scalar::F32),
    Param::Pointer { elem: Scalar::F32, access: Access::Write, extent: Extent::Elements(1) },
];

fn nothing(_: &LaunchDims, _: *mut *mut std::ffi::c_void) {}

fn main() {
    let shrunk = TwinSpec { name: "fill_f32", params: ONE_ELEMENT, run: nothing };
    let _ = soft_driver::register_image(kernels::ELEMENTWISE.fatbin(), &[shrunk]);
}
