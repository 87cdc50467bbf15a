//! `cargo xtask cust-stub`: a link stub of `libcuda.so` so that the `cust`
//! feature builds on a machine without NVIDIA's driver.
//!
//! Everything else in the workspace opens `libcuda.so.1` at run time; cust's
//! sys crate (`cust_raw` 0.11) links it at build time, and its build script
//! (`find_cuda_helper::include_cuda`) wants a directory with a `lib64/` to
//! search. NVIDIA's toolkits answer this with `lib64/stubs/libcuda.so`: a
//! shared library with the real soname and every entry point, used only to
//! link. The pip wheels we install for the headers ship no such file, so we
//! make one:
//!
//! - The entry points are read from `cust_raw`'s own declarations (its
//!   `src/cuda.rs`, found through `cargo metadata`): exactly the symbols cust
//!   can reference, with the versioned names (`cuCtxCreate_v2`) cust binds.
//! - Each one returns `CUDA_ERROR_STUB_LIBRARY` (34), as NVIDIA's stub does,
//!   so a binary that somehow runs against it fails with a named error
//!   instead of doing anything.
//! - The library is built by the system C compiler (found by the `cc` crate)
//!   with the soname `libcuda.so.1`, so a binary linked against it loads the
//!   real driver wherever one is installed.
//!
//! Output (`target/cuda-stub`):
//! - `lib64/libcuda.so`: what `CUDA_LIBRARY_PATH=target/cuda-stub` lets
//!   cust's build scripts find and link;
//! - `run/libcuda.so.1`: the same library under its soname, for starting a
//!   cust test binary on a machine without a driver
//!   (`LD_LIBRARY_PATH=target/cuda-stub/run`, software driver only: our own
//!   loader then finds the stub, whose `cuInit` fails, and never uses it).

use crate::{Result, cuda_toolchain::run, workspace_root};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

/// `CUDA_ERROR_STUB_LIBRARY` in cuda.h: "the CUDA driver is a stub library".
const CUDA_ERROR_STUB_LIBRARY: i32 = 34;

/// The folder to give cust's build scripts as `CUDA_LIBRARY_PATH`.
pub(crate) fn library_dir(root: &Path) -> PathBuf {
    root.join("target").join("cuda-stub")
}

pub(crate) fn run_stub() -> Result<()> {
    let root = workspace_root();
    let out = library_dir(&root);
    let declarations = cust_raw_declarations(&root)?;
    let source = std::fs::read_to_string(&declarations)
        .map_err(|e| format!("cannot read {}: {e}", declarations.display()))?;
    let symbols = entry_points(&source);
    if symbols.len() < 100 || !symbols.contains("cuInit") {
        return Err(format!(
            "found {} entry points in {} (cuInit {}): its format changed; \
             update xtask/src/cust_stub.rs",
            symbols.len(),
            declarations.display(),
            if symbols.contains("cuInit") {
                "present"
            } else {
                "missing"
            }
        ));
    }
    let lib64 = out.join("lib64");
    let run_dir = out.join("run");
    for dir in [&lib64, &run_dir] {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    let c_file = out.join("libcuda_stub.c");
    std::fs::write(&c_file, stub_source(&symbols, &declarations))
        .map_err(|e| format!("cannot write {}: {e}", c_file.display()))?;
    let library = lib64.join("libcuda.so");
    compile(&c_file, &library, &out)?;
    let loadable = run_dir.join("libcuda.so.1");
    std::fs::copy(&library, &loadable)
        .map_err(|e| format!("cannot copy the stub to {}: {e}", loadable.display()))?;
    println!(
        "cust-stub: {} entry points from {} -> {} (soname libcuda.so.1)\n\
         build cust with CUDA_LIBRARY_PATH={}",
        symbols.len(),
        declarations.display(),
        library.display(),
        out.display()
    );
    Ok(())
}

/// `cust_raw`'s `src/cuda.rs`, from the package cargo resolves for the
/// driver's `cust` feature (downloaded by cargo like any dependency).
fn cust_raw_declarations(root: &Path) -> Result<PathBuf> {
    let output = Command::new("cargo")
        .current_dir(root)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--features",
            "cuda-streams-driver/cust",
        ])
        .output()
        .map_err(|e| format!("could not run cargo metadata: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout)
        .map_err(|e| format!("cargo metadata printed no JSON: {e}"))?;
    let manifest = metadata["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == "cust_raw")
        .and_then(|p| p["manifest_path"].as_str())
        .ok_or("cargo metadata lists no cust_raw package for the `cust` feature")?;
    let declarations = Path::new(manifest)
        .parent()
        .ok_or("cust_raw's manifest has no folder")?
        .join("src")
        .join("cuda.rs");
    if !declarations.is_file() {
        return Err(format!("{} is missing", declarations.display()));
    }
    Ok(declarations)
}

/// Every `pub fn cu…` name declared in `source` (bindgen's `extern "C"`
/// blocks), sorted and without repeats.
fn entry_points(source: &str) -> BTreeSet<String> {
    source
        .split("pub fn ")
        .skip(1)
        .filter_map(|rest| {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            name.starts_with("cu").then_some(name)
        })
        .collect()
}

fn stub_source(symbols: &BTreeSet<String>, from: &Path) -> String {
    let mut c = format!(
        "/* Generated by `cargo xtask cust-stub` from {}.\n \
         * A link stub of libcuda.so.1: every entry point returns\n \
         * CUDA_ERROR_STUB_LIBRARY. Never load it where NVIDIA's driver is. */\n\
         #define STUB(name) int name(void) {{ return {CUDA_ERROR_STUB_LIBRARY}; }}\n",
        from.display()
    );
    for symbol in symbols {
        c.push_str(&format!("STUB({symbol})\n"));
    }
    c
}

/// Build `c_file` into a shared library with the driver's soname.
fn compile(c_file: &Path, library: &Path, scratch: &Path) -> Result<()> {
    // cc reads TARGET/HOST/OPT_LEVEL from Cargo's build-script variables; an
    // xtask is no build script, so they are given here.
    let triple = format!("{}-unknown-linux-gnu", std::env::consts::ARCH);
    let compiler = cc::Build::new()
        .target(&triple)
        .host(&triple)
        .opt_level(1)
        .debug(false)
        .pic(true)
        .out_dir(scratch)
        .cargo_metadata(false)
        .cargo_warnings(false)
        .try_get_compiler()
        .map_err(|e| format!("cc found no C compiler for the stub: {e}"))?;
    let mut command = compiler.to_command();
    command
        .arg("-shared")
        .arg("-Wl,-soname,libcuda.so.1")
        .arg("-o")
        .arg(library)
        .arg(c_file);
    run(&mut command)
}

#[cfg(test)]
mod tests {
    use super::entry_points;

    #[test]
    fn entry_points_are_the_declared_cu_functions() {
        let source = "extern \"C\" {\n    pub fn cuInit(Flags: u32) -> CUresult;\n}\n\
                      extern \"C\" {\n    pub fn cuCtxCreate_v2(pctx: *mut CUcontext) -> CUresult;\n}\n\
                      pub fn helper() {}\n";
        let names: Vec<_> = entry_points(source).into_iter().collect();
        assert_eq!(names, ["cuCtxCreate_v2", "cuInit"]);
    }
}
