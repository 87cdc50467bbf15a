//! The same attack through the safe layer: load `elementwise`'s bytes with
//! `fill_f32` declared one element long. Declaring an image's signatures is
//! an `unsafe fn` whose contract this breaks: safe code cannot call it.
#![forbid(unsafe_code)]

use cuda_streams_driver::sys::signature::{Access, Extent, Param, Scalar};
use cuda_streams_driver::{Context, DeclaredKernel, KernelDecl, Module, ModuleImage};

static SHRUNK: &[KernelDecl] = &[KernelDecl {
    params: &[
        Param::Scalar(Scalar::U64),
        Param::Scalar(Scalar::F32),
        Param::Pointer { elem: Scalar::F32, access: Access::Write, extent: Extent::Elements(1) },
    ],
    ..kernels::FillF32::DECL
}];

fn main() {
    let ctx = Context::new(0).unwrap();
    let image = ModuleImage::declared(kernels::ELEMENTWISE.fatbin(), SHRUNK);
    let _ = Module::load(&ctx, image);
}
