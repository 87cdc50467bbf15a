//! `cargo xtask bindgen`: the cuda-sys bindings, driver table and error names.
//!
//! One bindgen run over `cuda-sys/wrapper.h` produces three files:
//! - `bindings.rs`: the `cu*`/`CU*` types and constants. Function declarations are
//!   left out on purpose: nothing may link libcuda at build time.
//! - `driver_table.rs`: the `Driver` struct, one `unsafe extern "C" fn` field per
//!   entry point in [`ENTRY_POINTS`], its signature copied from the declaration
//!   bindgen produced. Because `cuda.h` renames versioned functions with macros
//!   (`#define cuMemAlloc cuMemAlloc_v2`), the declaration's name is the symbol the
//!   13.0 headers select, and that is the symbol the loader looks up.
//! - `green_table.rs`: the `GreenContexts` struct, one field per entry point in
//!   [`GREEN_ENTRY_POINTS`]: the SM partitions (green contexts) of CUDA 12.4 and
//!   later, a table of its own because older drivers lack them and loading the
//!   main table must not fail there.
//! - `ipc_table.rs`: the `Ipc` struct, one field per entry point in
//!   [`IPC_ENTRY_POINTS`]: device memory and events shared between processes
//!   (the virtual memory management API with POSIX file descriptors, IPC
//!   event handles), a table of its own because not every driver or platform
//!   has them.
//! - `host_pool_table.rs`: the `HostPools` struct, one field per entry point
//!   in [`HOST_POOL_ENTRY_POINTS`]: memory pools of one's own, which the
//!   workspace makes of page-locked host memory (CUDA 12.2 and later), a
//!   table of its own because loading the main table must not need them.
//! - `error_names.rs`: `CUresult` value to its name, so an error can be named
//!   without a driver call.

use crate::{Result, cuda_toolchain, workspace_root, write_or_check};
use quote::{format_ident, quote};
use std::collections::BTreeMap;

/// Every driver entry point the workspace calls, by the name `cuda.h` documents.
const ENTRY_POINTS: &[&str] = &[
    // Initialisation and devices.
    "cuInit",
    "cuDriverGetVersion",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetName",
    "cuDeviceGetAttribute",
    "cuDeviceTotalMem",
    "cuDeviceCanAccessPeer",
    // Contexts.
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease",
    "cuCtxSetCurrent",
    "cuCtxGetCurrent",
    "cuCtxSynchronize",
    "cuCtxGetStreamPriorityRange",
    "cuCtxEnablePeerAccess",
    "cuCtxDisablePeerAccess",
    // Streams.
    "cuStreamCreateWithPriority",
    "cuStreamDestroy",
    "cuStreamQuery",
    "cuStreamSynchronize",
    "cuStreamWaitEvent",
    "cuStreamGetPriority",
    "cuStreamGetFlags",
    "cuLaunchHostFunc",
    "cuStreamWriteValue32",
    // Events.
    "cuEventCreate",
    "cuEventDestroy",
    "cuEventRecord",
    "cuEventQuery",
    "cuEventSynchronize",
    "cuEventElapsedTime",
    // Memory.
    "cuMemGetInfo",
    "cuMemAlloc",
    "cuMemFree",
    "cuMemAllocAsync",
    "cuMemFreeAsync",
    "cuMemAllocFromPoolAsync",
    "cuDeviceGetDefaultMemPool",
    "cuMemPoolTrimTo",
    "cuMemPoolSetAttribute",
    "cuMemPoolGetAttribute",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuMemHostGetDevicePointer",
    "cuMemHostRegister",
    "cuMemHostUnregister",
    "cuMemAllocManaged",
    "cuMemcpyHtoDAsync",
    "cuMemcpyDtoHAsync",
    "cuMemcpyDtoDAsync",
    "cuMemcpyPeerAsync",
    "cuMemsetD8Async",
    "cuMemsetD32Async",
    "cuMemPrefetchAsync",
    // Modules and launches.
    "cuModuleLoadData",
    "cuModuleUnload",
    "cuModuleGetFunction",
    "cuLaunchKernel",
    // Launches with attributes (CUDA 12.0+): programmatic dependent launch
    // (CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, Hopper+).
    "cuLaunchKernelEx",
    // Graphs (stream capture).
    "cuStreamBeginCapture",
    "cuStreamEndCapture",
    "cuStreamIsCapturing",
    "cuGraphInstantiate",
    "cuGraphUpload",
    "cuGraphLaunch",
    "cuGraphExecUpdate",
    "cuGraphExecDestroy",
    "cuGraphDestroy",
    // Conditional nodes (CUDA 12.4+): an empty graph, a condition handle, a
    // conditional node whose bodies are captured with `cuStreamBeginCaptureToGraph`,
    // and the calls that put a node into a capture in progress.
    "cuGraphCreate",
    "cuGraphConditionalHandleCreate",
    "cuGraphAddNode",
    "cuStreamBeginCaptureToGraph",
    "cuStreamGetCaptureInfo",
    "cuStreamUpdateCaptureDependencies",
    // An edge into a node already captured (CUDA 12.3+): the order check's
    // repair of a conditional node, whose accesses are known only once its
    // body is captured after it.
    "cuGraphAddDependencies",
    // A kernel node's launch parameters set in an executable graph (CUDA
    // 12.0+ for the `_v2` struct): new arguments without capturing or
    // instantiating again.
    "cuGraphExecKernelNodeSetParams",
    // A kernel node's launch attribute read back (CUDA 12.4+ for the one
    // read): a kernel captured with CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE
    // has a device-side handle (`devNode`) only this call gives out, which
    // kernels pass to `cudaGraphKernelNodeSetParam` to change its arguments.
    "cuGraphKernelNodeGetAttribute",
    // Graph memory nodes (CUDA 11.4+): what the device's graph allocations
    // use and keep, and giving the kept memory back.
    "cuDeviceGetGraphMemAttribute",
    "cuDeviceSetGraphMemAttribute",
    "cuDeviceGraphMemTrim",
    // Errors.
    "cuGetErrorName",
    "cuGetErrorString",
];

/// The entry points SM partitions (green contexts) need, by the name `cuda.h`
/// documents: loaded together, and only where the driver has every one.
const GREEN_ENTRY_POINTS: &[&str] = &[
    "cuDeviceGetDevResource",
    "cuDevSmResourceSplitByCount",
    "cuDevResourceGenerateDesc",
    "cuGreenCtxCreate",
    "cuGreenCtxDestroy",
    "cuCtxFromGreenCtx",
    "cuGreenCtxGetDevResource",
    "cuGreenCtxStreamCreate",
    "cuStreamGetGreenCtx",
    // Context-less kernels (CUDA 12.0): a kernel launched on a partition's
    // stream runs in the partition's green context, which a module loaded in
    // the primary context cannot serve; a library's kernel takes its context
    // from the stream.
    "cuLibraryLoadData",
    "cuLibraryGetKernel",
    "cuLibraryUnload",
    // Loads a library's kernel into the current (green) context up front:
    // loading it at its first launch waits for the device's other work.
    "cuKernelGetFunction",
    "cuFuncLoad",
];

/// The entry points that share device memory and events between processes,
/// by the name `cuda.h` documents: loaded together, and only where the driver
/// has every one.
const IPC_ENTRY_POINTS: &[&str] = &[
    // Device memory through the virtual memory management API: physical
    // memory exported as a POSIX file descriptor, mapped at a reserved range.
    "cuMemGetAllocationGranularity",
    "cuMemCreate",
    "cuMemRelease",
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cuMemMap",
    "cuMemUnmap",
    "cuMemSetAccess",
    "cuMemExportToShareableHandle",
    "cuMemImportFromShareableHandle",
    // Events: there is no file-descriptor path for them.
    "cuIpcGetEventHandle",
    "cuIpcOpenEventHandle",
    // Which device a handle was made on, the same in every process.
    "cuDeviceGetUuid",
];

/// The entry points that make memory pools of one's own, by the name
/// `cuda.h` documents: the pinned host pool's driver backend makes one of
/// host memory (`CU_MEM_LOCATION_TYPE_HOST`, CUDA 12.2 and later). Loaded
/// together, and only where the driver has every one.
const HOST_POOL_ENTRY_POINTS: &[&str] = &[
    "cuMemPoolCreate",
    "cuMemPoolDestroy",
    // A host pool's memory is the host's alone until a device is let in.
    "cuMemPoolSetAccess",
];

const GENERATED_BY: &str = "Generated by `cargo xtask bindgen` from CUDA 13.0's cuda.h \
(nvidia-cuda-runtime 13.0.96). Do not edit by hand.";

pub(crate) fn run(check: bool) -> Result<()> {
    let toolchain = cuda_toolchain::ensure()?;
    cuda_toolchain::ensure_libclang()?;
    let root = workspace_root();
    let wrapper = root.join("cuda-sys").join("wrapper.h");
    let generated = bindgen::Builder::default()
        .header(wrapper.to_string_lossy())
        .clang_arg(format!("-I{}", toolchain.include_dir().display()))
        .allowlist_function("cu.*")
        .allowlist_type("CU.*|cu.*")
        .allowlist_var("CU.*")
        // A newtype, not a Rust enum: the driver may return values this header
        // does not know, and an out-of-range Rust enum is undefined behaviour.
        .default_enum_style(bindgen::EnumVariation::NewType {
            is_bitfield: false,
            is_global: false,
        })
        .prepend_enum_name(false)
        .derive_default(true)
        .derive_eq(true)
        .derive_hash(true)
        .layout_tests(false)
        .generate_comments(false)
        .merge_extern_blocks(true)
        .generate()
        .map_err(|e| format!("bindgen failed on {}: {e}", wrapper.display()))?
        .to_string();

    let (functions, items) = crate::gen_bindings::split_functions(&generated)?;
    let names = error_names(&items)?;
    let cuda_h = toolchain.include_dir().join("cuda.h");
    let renames = header_renames(
        &std::fs::read_to_string(&cuda_h)
            .map_err(|e| format!("cannot read {}: {e}", cuda_h.display()))?,
    );
    let bindings = crate::gen_bindings::file_of(items);

    let out = root.join("cuda-sys").join("src");
    let header = format!("// {GENERATED_BY}\n\n");
    let files = [
        (
            "bindings.rs",
            format!("{header}{}", prettyplease::unparse(&bindings)),
        ),
        (
            "driver_table.rs",
            format!("{header}{}", driver_table(&functions, &renames)?),
        ),
        (
            "green_table.rs",
            format!("{header}{}", green_table(&functions, &renames)?),
        ),
        (
            "ipc_table.rs",
            format!("{header}{}", ipc_table(&functions, &renames)?),
        ),
        (
            "host_pool_table.rs",
            format!("{header}{}", host_pool_table(&functions, &renames)?),
        ),
        ("error_names.rs", format!("{header}{}", names)),
    ];
    let mut changed = 0;
    for (name, contents) in files {
        if write_or_check(&out.join(name), contents.as_bytes(), check, "bindgen")? {
            changed += 1;
            eprintln!("xtask: wrote cuda-sys/src/{name}");
        }
    }
    changed += crate::gen_nccl::run(check)?;
    changed += crate::gen_cupti::run(check)?;
    changed += crate::gen_nvrtc::run(check)?;
    if check {
        eprintln!("xtask: cuda-sys bindings are up to date");
    } else if changed == 0 {
        eprintln!("xtask: cuda-sys bindings unchanged");
    }
    Ok(())
}

/// Bindgen's output split into the entry points' signatures (by name) and
/// every other item (types, constants), which become the bindings file.
pub(crate) fn split_functions(
    generated: &str,
) -> Result<(BTreeMap<String, syn::Signature>, Vec<syn::Item>)> {
    let file =
        syn::parse_file(generated).map_err(|e| format!("cannot parse bindgen output: {e}"))?;
    let mut functions = BTreeMap::new();
    let mut items = Vec::new();
    for item in file.items {
        match item {
            syn::Item::ForeignMod(foreign) => {
                for f in foreign.items {
                    if let syn::ForeignItem::Fn(f) = f {
                        functions.insert(f.sig.ident.to_string(), f.sig);
                    }
                }
            }
            other => items.push(other),
        }
    }
    Ok((functions, items))
}

/// A file of `items`, to print as bindings.
/// Write (or, with `check`, compare) a library's generated `bindings.rs`
/// and `table.rs` in `cuda-sys/src/<dir>`, each headed by `generated_by`.
/// Returns how many files changed.
pub(crate) fn write_library_files(
    root: &std::path::Path,
    dir: &str,
    generated_by: &str,
    bindings: &syn::File,
    table: &str,
    check: bool,
) -> Result<usize> {
    let out = root.join("cuda-sys").join("src").join(dir);
    let header = format!("// {generated_by}\n\n");
    let files = [
        (
            "bindings.rs",
            format!("{header}{}", prettyplease::unparse(bindings)),
        ),
        ("table.rs", format!("{header}{table}")),
    ];
    let mut changed = 0;
    for (name, contents) in files {
        if write_or_check(&out.join(name), contents.as_bytes(), check, "bindgen")? {
            changed += 1;
            eprintln!("xtask: wrote cuda-sys/src/{dir}/{name}");
        }
    }
    Ok(changed)
}

pub(crate) fn file_of(items: Vec<syn::Item>) -> syn::File {
    syn::File {
        shebang: None,
        attrs: Vec::new(),
        items,
    }
}

/// What differs between the function tables generated: the driver's and NCCL's.
pub(crate) struct TableSpec<'a> {
    /// The struct's name (`Driver`, `Nccl`).
    pub(crate) name: &'a str,
    /// The struct's doc comment.
    pub(crate) doc: &'a str,
    /// The module holding the bindings' types (`crate::bindings`).
    pub(crate) types: &'a str,
    /// What the loader resolves from, for the safety comments ("the CUDA
    /// 13.0 headers").
    pub(crate) headers: &'a str,
    /// The entry points, by documented name.
    pub(crate) entries: &'a [&'a str],
}

/// The `Driver` struct and its loader, one field per entry point.
fn driver_table(
    functions: &BTreeMap<String, syn::Signature>,
    renames: &BTreeMap<String, String>,
) -> Result<String> {
    function_table(
        &TableSpec {
            name: "Driver",
            doc: " The driver's function table: one pointer per entry point the workspace\n \
                  calls. Filled from `libcuda.so.1` by [`Driver::load`](crate::Driver::load),\n \
                  or by the software driver with its own implementations.",
            types: "crate::bindings",
            headers: "the CUDA 13.0 headers",
            entries: ENTRY_POINTS,
        },
        functions,
        renames,
    )
}

/// The `GreenContexts` struct and its loader, one field per green-context
/// entry point.
fn green_table(
    functions: &BTreeMap<String, syn::Signature>,
    renames: &BTreeMap<String, String>,
) -> Result<String> {
    function_table(
        &TableSpec {
            name: "GreenContexts",
            doc: " The green-context (SM partition) entry points, CUDA 12.4 and later: a\n \
                  table of their own, because older drivers lack them. Filled from\n \
                  `libcuda.so.1` by [`optional::green_contexts`](crate::optional::green_contexts),\n \
                  or by the software driver with its own implementations.",
            types: "crate::bindings",
            headers: "the CUDA 13.0 headers",
            entries: GREEN_ENTRY_POINTS,
        },
        functions,
        renames,
    )
}

/// The `Ipc` struct and its loader, one field per entry point that shares
/// memory and events between processes.
fn ipc_table(
    functions: &BTreeMap<String, syn::Signature>,
    renames: &BTreeMap<String, String>,
) -> Result<String> {
    function_table(
        &TableSpec {
            name: "Ipc",
            doc: " The entry points that share device memory and events between processes\n \
                  (virtual memory management with POSIX file descriptors, IPC event\n \
                  handles): a table of their own, because not every driver or platform\n \
                  has them. Filled from `libcuda.so.1` by [`optional::ipc`](crate::optional::ipc),\n \
                  or by the software driver with its own implementations.",
            types: "crate::bindings",
            headers: "the CUDA 13.0 headers",
            entries: IPC_ENTRY_POINTS,
        },
        functions,
        renames,
    )
}

/// The `HostPools` struct and its loader, one field per entry point that
/// makes a memory pool of one's own.
fn host_pool_table(
    functions: &BTreeMap<String, syn::Signature>,
    renames: &BTreeMap<String, String>,
) -> Result<String> {
    function_table(
        &TableSpec {
            name: "HostPools",
            doc: " The entry points that make memory pools of one's own, used for pools of\n \
                  page-locked host memory (a `CU_MEM_LOCATION_TYPE_HOST` location, CUDA 12.2\n \
                  and later): a table of their own, so that loading the main table never\n \
                  needs them. Filled from `libcuda.so.1` by [`optional::host_pools`](crate::optional::host_pools),\n \
                  or by the software driver with its own implementations.",
            types: "crate::bindings",
            headers: "the CUDA 13.0 headers",
            entries: HOST_POOL_ENTRY_POINTS,
        },
        functions,
        renames,
    )
}

/// A function-pointer table and its resolver, one field per entry point of
/// `spec`, each field's type copied from the declaration bindgen produced.
pub(crate) fn function_table(
    spec: &TableSpec<'_>,
    functions: &BTreeMap<String, syn::Signature>,
    renames: &BTreeMap<String, String>,
) -> Result<String> {
    let mut fields = Vec::new();
    let mut resolves = Vec::new();
    let mut inits = Vec::new();
    let mut symbols = Vec::new();
    for &base in spec.entries {
        let symbol = selected_symbol(renames, base);
        if !functions.contains_key(symbol) {
            return Err(format!(
                "{} selects {symbol} for entry point {base} but declares no such function",
                spec.headers
            ));
        }
        let sig = &functions[symbol];
        let inputs = &sig.inputs;
        let output = &sig.output;
        let field = format_ident!("{base}");
        let doc = format!(" `{symbol}`");
        fields.push(quote! {
            #[doc = #doc]
            pub #field: unsafe extern "C" fn(#inputs) #output,
        });
        resolves.push(quote! {
            let #field = resolve(#symbol);
        });
        inits.push(quote! {
            #field: core::mem::transmute::<*const core::ffi::c_void, unsafe extern "C" fn(#inputs) #output>(#field),
        });
        symbols.push(quote! { (#base, #symbol), });
    }
    let count = spec.entries.len();
    let name = format_ident!("{}", spec.name);
    let types: syn::Path =
        syn::parse_str(spec.types).map_err(|e| format!("bad types path {}: {e}", spec.types))?;
    let struct_doc = spec.doc.replace("\\n", "\n");
    let struct_docs = struct_doc.lines().map(|line| quote! { #[doc = #line] });
    let symbols_doc = format!(
        " Each entry point's name as documented and the versioned symbol\n {} select for it, \
         in table order.",
        spec.headers
    );
    let symbols_docs = symbols_doc.lines().map(|line| quote! { #[doc = #line] });
    let from_resolver_safety = format!(
        " Every non-null address returned by `resolve` must be the function of that\n \
         name with the signature {} give it, and stay valid for\n as long as the table is used.",
        spec.headers
    );
    let safety_docs = from_resolver_safety
        .lines()
        .map(|line| quote! { #[doc = #line] });
    let tokens = quote! {
        use #types::*;

        #(#struct_docs)*
        #[allow(non_snake_case)]
        #[derive(Clone, Copy)]
        pub struct #name {
            #(#fields)*
        }

        #(#symbols_docs)*
        pub const SYMBOLS: [(&str, &str); #count] = [ #(#symbols)* ];

        impl #name {
            /// Build the table from a symbol resolver.
            ///
            /// `resolve` is called once per entry of [`SYMBOLS`] with the versioned
            /// symbol name and returns its address, or null when it is missing.
            /// Returns the names of all missing symbols when any is missing.
            ///
            /// # Safety
            #(#safety_docs)*
            #[allow(non_snake_case)]
            pub unsafe fn from_resolver(
                mut resolve: impl FnMut(&'static str) -> *const core::ffi::c_void,
            ) -> Result<Self, Vec<&'static str>> {
                let mut missing = Vec::new();
                let mut resolve = |symbol: &'static str| {
                    let address = resolve(symbol);
                    if address.is_null() {
                        missing.push(symbol);
                    }
                    address
                };
                #(#resolves)*
                if !missing.is_empty() {
                    return Err(missing);
                }
                Ok(unsafe { Self { #(#inits)* } })
            }
        }
    };
    let file = syn::parse2::<syn::File>(tokens)
        .map_err(|e| format!("generated {} table does not parse: {e}", spec.name))?;
    // Comments are not tokens, so the SAFETY comment is placed after formatting.
    let text = prettyplease::unparse(&file);
    let marker = "        Ok(unsafe {";
    if !text.contains(marker) {
        return Err(format!(
            "generated {} table lost its unsafe block",
            spec.name
        ));
    }
    Ok(text.replacen(
        marker,
        &format!(
            "        // SAFETY: every address is non-null (missing ones returned above) and, by the\n\
             \x20       // caller's contract, is the function {} declare under that\n\
             \x20       // symbol, whose type is the field's type.\n        Ok(unsafe {{",
            spec.headers
        ),
        1,
    ))
}

/// `error_name(code)`: the name of every `CUresult` constant in the bindings.
fn error_names(items: &[syn::Item]) -> Result<String> {
    let mut arms = Vec::new();
    for item in items {
        let syn::Item::Impl(block) = item else {
            continue;
        };
        let syn::Type::Path(ty) = &*block.self_ty else {
            continue;
        };
        if !ty.path.is_ident("cudaError_enum") {
            continue;
        }
        for item in &block.items {
            if let syn::ImplItem::Const(c) = item {
                let ident = &c.ident;
                let name = ident.to_string();
                arms.push(quote! { CUresult::#ident => Some(#name), });
            }
        }
    }
    if arms.is_empty() {
        return Err("no CUresult constants found in the bindings".into());
    }
    let tokens = quote! {
        use crate::bindings::CUresult;

        /// The name of a `CUresult` as `cuda.h` spells it, or `None` for a value
        /// the 13.0 headers do not define.
        pub fn error_name(code: CUresult) -> Option<&'static str> {
            match code {
                #(#arms)*
                _ => None,
            }
        }
    };
    let file = syn::parse2::<syn::File>(tokens)
        .map_err(|e| format!("generated error names do not parse: {e}"))?;
    Ok(prettyplease::unparse(&file))
}

/// The `#define cuX cuX_vN` renames of cuda.h: documented name to selected symbol.
///
/// Per-thread-default-stream wrappers (`__CUDA_API_PTDS(x)`, `__CUDA_API_PTSZ(x)`)
/// select `x` itself in the default compilation mode, which is ours.
fn header_renames(cuda_h: &str) -> BTreeMap<String, String> {
    let mut renames = BTreeMap::new();
    for line in cuda_h.lines() {
        let mut words = line.split_whitespace();
        if words.next() != Some("#define") {
            continue;
        }
        let (Some(name), Some(target), None) = (words.next(), words.next(), words.next()) else {
            continue;
        };
        let target = target
            .strip_prefix("__CUDA_API_PTDS(")
            .or_else(|| target.strip_prefix("__CUDA_API_PTSZ("))
            .and_then(|t| t.strip_suffix(')'))
            .unwrap_or(target);
        if name.starts_with("cu") && target.starts_with(name) && name != target {
            // The first definition wins: later ones sit in #if branches for
            // the per-thread default stream or for internal builds.
            renames
                .entry(name.to_string())
                .or_insert_with(|| target.to_string());
        }
    }
    renames
}

fn selected_symbol<'a>(renames: &'a BTreeMap<String, String>, base: &'a str) -> &'a str {
    renames.get(base).map_or(base, String::as_str)
}
