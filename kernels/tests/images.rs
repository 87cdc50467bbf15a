//! The embedded images agree with the CUDA sources: every source has an image,
//! every `extern "C" __global__` function has a twin whose argument sizes match
//! the C signature, and every twin names a function in its source.
//!
//! The sources and the committed fatbins are embedded in the test binary, so
//! that it runs where the source tree is not (the GPU bundle, built in any
//! checkout). Only the scan for sources missing from [`SOURCES`] needs the
//! tree; it says so and skips where there is none.

use cuda_streams_kernels::{ALL, KernelImage};
use std::path::Path;

/// Each image's CUDA source and committed fatbin, as they were when this test
/// was built. A new `.cu` file belongs here too (the scan below says so).
const SOURCES: &[(&str, &str, &[u8])] = &[
    (
        "compute",
        include_str!("../compute.cu"),
        include_bytes!("../compute.fatbin"),
    ),
    (
        "elementwise",
        include_str!("../elementwise.cu"),
        include_bytes!("../elementwise.fatbin"),
    ),
    (
        "solver",
        include_str!("../solver.cu"),
        include_bytes!("../solver.fatbin"),
    ),
    (
        "reduce",
        include_str!("../reduce.cu"),
        include_bytes!("../reduce.fatbin"),
    ),
    (
        "timing",
        include_str!("../timing.cu"),
        include_bytes!("../timing.fatbin"),
    ),
];

fn embedded(image: &KernelImage) -> (&'static str, &'static [u8]) {
    SOURCES
        .iter()
        .find(|(name, _, _)| *name == image.name())
        .map(|(_, source, fatbin)| (*source, *fatbin))
        .unwrap_or_else(|| panic!("{}.cu is not in this test's SOURCES", image.name()))
}

/// `(name, argument sizes)` of each kernel in a CUDA source.
fn kernels_in(source: &str) -> Vec<(String, Vec<usize>)> {
    const MARK: &str = "extern \"C\" __global__ void ";
    source
        .match_indices(MARK)
        .map(|(at, _)| {
            let rest = &source[at + MARK.len()..];
            let open = rest.find('(').unwrap();
            let close = rest.find(')').unwrap();
            let name = rest[..open].trim().to_string();
            let sizes = rest[open + 1..close]
                .split(',')
                .map(|param| c_size(param.trim()).unwrap_or_else(|| panic!("{name}: {param}")))
                .collect();
            (name, sizes)
        })
        .collect()
}

fn c_size(param: &str) -> Option<usize> {
    let ty = param
        .rsplit_once(|c: char| c.is_whitespace() || c == '*')
        .map(|(ty, _)| ty)?;
    if param.contains('*') {
        return Some(8);
    }
    match ty.trim() {
        // A conditional node's handle is an `unsigned long long`.
        "unsigned long long" | "long long" | "double" | "cudaGraphConditionalHandle" => Some(8),
        "float" | "unsigned int" | "int" => Some(4),
        _ => None,
    }
}

fn source_of(image: &KernelImage) -> &'static str {
    embedded(image).0
}

#[test]
fn every_kernel_in_the_sources_has_a_twin_with_its_signature() {
    for image in ALL {
        let kernels = kernels_in(source_of(image));
        assert!(!kernels.is_empty(), "{} declares no kernels", image.name());
        for (name, sizes) in &kernels {
            let twin = image
                .twin(name)
                .unwrap_or_else(|| panic!("{}.cu: kernel {name} has no twin", image.name()));
            let twin_sizes: Vec<usize> = twin.params.iter().map(|p| p.size()).collect();
            assert_eq!(twin_sizes, *sizes, "{}.cu: {name}", image.name());
        }
        for function in image.functions() {
            assert!(
                kernels.iter().any(|(name, _)| name == function),
                "{}: twin {function} has no kernel in the source",
                image.name()
            );
        }
    }
}

#[test]
fn every_source_has_an_embedded_image() {
    for (name, _, _) in SOURCES {
        assert!(
            ALL.iter().any(|image| image.name() == *name),
            "{name}.cu is not embedded in cuda-streams-kernels"
        );
    }
    // A source added to the tree but to neither list: only the tree can say.
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let Ok(entries) = std::fs::read_dir(dir) else {
        eprintln!(
            "skipped the scan for new .cu files: the source tree this test was built from ({}) \
             is not on this machine",
            dir.display()
        );
        return;
    };
    for entry in entries {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "cu") {
            let stem = path.file_stem().unwrap().to_str().unwrap();
            assert!(
                ALL.iter().any(|image| image.name() == stem),
                "{} is not embedded in cuda-streams-kernels",
                path.display()
            );
            assert!(
                SOURCES.iter().any(|(name, _, _)| *name == stem),
                "{} is not in the SOURCES of kernels/tests/images.rs",
                path.display()
            );
        }
    }
}

#[test]
fn images_are_the_committed_fatbins_aligned_for_the_driver() {
    for image in ALL {
        let bytes = image.fatbin();
        assert_eq!(bytes.as_ptr() as usize % 64, 0, "{}", image.name());
        assert_eq!(
            bytes.as_ptr(),
            image.fatbin().as_ptr(),
            "one address per image"
        );
        let committed = embedded(image).1;
        assert_eq!(bytes, committed, "{}", image.name());
        // A fatbin starts with its magic number, 0xBA55ED50 little-endian.
        assert_eq!(bytes[..4], [0x50, 0xED, 0x55, 0xBA], "{}", image.name());
    }
}

#[test]
fn the_bytes_register_nothing_and_the_declared_image_runs_every_function() {
    // The software driver directly, whatever CUDA_STREAMS_DRIVER selects: no
    // global registry knows the bytes any more (the escape hatch
    // `register_image` is used by nothing in the workspace).
    let d = soft_driver::driver();
    let (mut dev, mut ctx) = (0, std::ptr::null_mut());
    // SAFETY: every call writes through valid pointers to locals; the images
    // live for the whole program.
    unsafe {
        d.check((d.cuInit)(0)).unwrap();
        d.check((d.cuDeviceGet)(&mut dev, 0)).unwrap();
        d.check((d.cuDevicePrimaryCtxRetain)(&mut ctx, dev))
            .unwrap();
        d.check((d.cuCtxSetCurrent)(ctx)).unwrap();
        for image in ALL {
            let mut module = std::ptr::null_mut();
            let loaded = (d.cuModuleLoadData)(&mut module, image.fatbin().as_ptr().cast());
            assert_eq!(
                loaded,
                soft_driver::sys::CUresult::CUDA_ERROR_INVALID_IMAGE,
                "{}",
                image.name()
            );
        }
    }
    // Through the safe layer, the image's declarations make the module.
    let ctx = cuda_streams_kernels::driver::Context::new(0).unwrap();
    for image in ALL {
        let module = cuda_streams_kernels::driver::Module::load(&ctx, *image).unwrap();
        for name in image.functions() {
            let kernel = module
                .function(name)
                .unwrap_or_else(|e| panic!("{}: {name}: {e}", image.name()));
            assert_eq!(kernel.signature(), image.signature(name));
        }
    }
}

#[test]
fn every_function_is_found_by_name() {
    for image in ALL {
        for function in image.functions() {
            let found = cuda_streams_kernels::image_of(function).unwrap();
            assert!(std::ptr::eq(found, *image), "{function}");
        }
    }
    assert!(cuda_streams_kernels::image_of("no_such_kernel").is_none());
}
