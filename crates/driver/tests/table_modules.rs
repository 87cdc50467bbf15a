//! Modules and launches through the driver table, with a tiny test kernel
//! (real PTX on the GPU, its registered CPU twin on the software driver).

mod common;

use common::*;
use std::ffi::c_void;
use sys::CUresult;

fn upload(table: &'static sys::Driver, stream: &Stream, words: &[u32]) -> DeviceMem {
    let dev = DeviceMem::new(table, words.len() * 4);
    // SAFETY: an allocation of words.len() * 4 bytes; synchronised below.
    unsafe {
        ok((table.cuMemcpyHtoDAsync)(
            dev.ptr,
            words.as_ptr().cast(),
            words.len() * 4,
            stream.raw,
        ));
    }
    stream.sync();
    dev
}

fn download(table: &sys::Driver, stream: &Stream, dev: &DeviceMem, n: usize) -> Vec<u32> {
    let mut out = vec![0u32; n];
    // SAFETY: n * 4 bytes on both sides; synchronised before returning.
    unsafe {
        ok((table.cuMemcpyDtoHAsync)(
            out.as_mut_ptr().cast(),
            dev.ptr,
            n * 4,
            stream.raw,
        ));
    }
    stream.sync();
    out
}

#[test]
fn a_kernel_runs_in_stream_order_with_copies() {
    let table = table();
    let (module, function) = load_add_u32(table);
    let stream = Stream::new(table);
    let n = 1000u32;
    let input: Vec<u32> = (0..n).map(|i| i * 3).collect();
    let dev = upload(table, &stream, &input);
    launch_add_u32(table, function, stream.raw, dev.ptr, n, 7);
    launch_add_u32(table, function, stream.raw, dev.ptr, n - 10, 100);
    let out = download(table, &stream, &dev, n as usize);
    for (i, (&got, &was)) in out.iter().zip(&input).enumerate() {
        let want = was + 7 + if i < (n - 10) as usize { 100 } else { 0 };
        assert_eq!(got, want, "element {i}");
    }
    // SAFETY: a loaded module, unloaded once.
    ok(unsafe { (table.cuModuleUnload)(module) });
}

#[test]
fn kernel_arguments_are_copied_at_launch() {
    let table = table();
    let (_module, function) = load_add_u32(table);
    let stream = Stream::new(table);
    let n = 256u32;
    let dev = upload(table, &stream, &vec![1u32; n as usize]);
    let mut gate = Gate::block(table, stream.raw);
    {
        // Arguments and the params array live only inside this block, and the
        // stream cannot run the kernel until after it ends.
        let mut args = Box::new((dev.ptr, n, 41u32));
        let mut params = vec![
            (&mut args.0 as *mut u64).cast::<c_void>(),
            (&mut args.1 as *mut u32).cast::<c_void>(),
            (&mut args.2 as *mut u32).cast::<c_void>(),
        ];
        // SAFETY: params points at the kernel's three arguments.
        ok(unsafe {
            (table.cuLaunchKernel)(
                function,
                1,
                1,
                1,
                256,
                1,
                1,
                0,
                stream.raw,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        });
        // Scribble over them before they are freed.
        args.2 = 0;
        params.iter_mut().for_each(|p| *p = std::ptr::null_mut());
    }
    gate.open();
    let out = download(table, &stream, &dev, n as usize);
    assert!(
        out.iter().all(|&w| w == 42),
        "the kernel saw the values at launch time"
    );
}

#[test]
fn an_unknown_function_is_not_found() {
    let table = table();
    let (module, _) = load_add_u32(table);
    let mut function = std::ptr::null_mut();
    // SAFETY: a loaded module, valid out-pointer.
    let code =
        unsafe { (table.cuModuleGetFunction)(&mut function, module, c"no_such_kernel".as_ptr()) };
    expect(code, CUresult::CUDA_ERROR_NOT_FOUND);
    if !is_gpu() {
        let detail = soft_driver::last_error_detail().expect("the software driver explains");
        assert!(
            detail.contains("no_such_kernel") && detail.contains("add_u32"),
            "{detail}"
        );
    }
}

#[test]
fn the_same_name_gives_the_same_function() {
    let table = table();
    let (module, first) = load_add_u32(table);
    let mut again = std::ptr::null_mut();
    // SAFETY: a loaded module, valid out-pointer.
    ok(unsafe { (table.cuModuleGetFunction)(&mut again, module, c"add_u32".as_ptr()) });
    assert_eq!(first, again);
}

#[test]
fn an_image_without_twins_is_an_invalid_image_naming_it() {
    if skip_on_gpu("the twin registry exists only in the software driver") {
        return;
    }
    let table = table();
    static UNREGISTERED: [u8; 8] = *b"nothing\0";
    let mut module = std::ptr::null_mut();
    // SAFETY: valid out-pointer and image bytes.
    let code = unsafe { (table.cuModuleLoadData)(&mut module, UNREGISTERED.as_ptr().cast()) };
    expect(code, CUresult::CUDA_ERROR_INVALID_IMAGE);
    let detail = soft_driver::last_error_detail().unwrap();
    assert!(
        detail.contains(&format!("{:#x}", UNREGISTERED.as_ptr() as usize)),
        "{detail}"
    );
}

#[test]
fn registration_is_idempotent() {
    register_test_image();
    register_test_image();
    let table = table();
    let (_module, function) = load_add_u32(table);
    let stream = Stream::new(table);
    let dev = upload(table, &stream, &[5, 6]);
    launch_add_u32(table, function, stream.raw, dev.ptr, 2, 1);
    assert_eq!(download(table, &stream, &dev, 2), vec![6, 7]);
}

#[test]
fn bad_launch_configurations_are_invalid() {
    let table = table();
    let (_module, function) = load_add_u32(table);
    let stream = Stream::new(table);
    let dev = DeviceMem::new(table, 16);
    let (mut ptr, mut n, mut v) = (dev.ptr, 4u32, 1u32);
    let mut params = [
        (&mut ptr as *mut u64).cast::<c_void>(),
        (&mut n as *mut u32).cast::<c_void>(),
        (&mut v as *mut u32).cast::<c_void>(),
    ];
    for (grid, block) in [((0, 1, 1), (32, 1, 1)), ((1, 1, 1), (2048, 1, 1))] {
        // SAFETY: params points at the kernel's arguments.
        let code = unsafe {
            (table.cuLaunchKernel)(
                function,
                grid.0,
                grid.1,
                grid.2,
                block.0,
                block.1,
                block.2,
                0,
                stream.raw,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        assert_ne!(
            code,
            CUresult::CUDA_SUCCESS,
            "grid {grid:?} block {block:?}"
        );
    }
    stream.sync();
}
