//! `cargo xtask build-kernels`: compile `kernels/*.cu` and
//! `crates/driver/kernels/*.cu` into committed fatbins.
//!
//! One fatbin per source, written next to it (`kernels/saxpy.cu` ->
//! `kernels/saxpy.fatbin`), holding SASS for every architecture in [`SASS`] and
//! PTX for [`PTX`] so newer GPUs can JIT it. The images are committed and embedded
//! with `include_bytes!`, so building the workspace needs no CUDA toolkit.
//!
//! The driver crate's own kernels (`crates/driver/kernels`) call the device
//! runtime (`cudaGraphKernelNodeSetParam`), which lives in `libcudadevrt.a`:
//! they are compiled as relocatable device code and device-linked with it,
//! SASS only (linked code has no PTX a driver could JIT without linking the
//! device runtime again at load time).
//!
//! The output is byte-for-byte reproducible. nvcc embeds no paths or temporary
//! names as long as `-lineinfo`/`-G` are left out (both record the working
//! directory and the include paths), so we compile without them, from `kernels/`
//! with relative source names, and `--check` clears `NVCC_PREPEND_FLAGS`/
//! `NVCC_APPEND_FLAGS` so a developer's environment cannot change the bytes.
//!
//! `--check` compiles into `target/build-kernels` and fails, naming every stale
//! image, when a committed fatbin differs from the fresh one or has no source.
//!
//! nvcc is found and configured by the `cc` crate (`cc::Build` with
//! `.cuda(true)`), so the conventions of every Rust build that compiles CUDA
//! apply, first match wins:
//!
//! 1. `NVCC` (or `NVCC_<target>`, `HOST_NVCC`, as `cc` reads it): that nvcc;
//! 2. `CUDA_PATH`: `$CUDA_PATH/bin/nvcc`, the toolkit's usual variable;
//! 3. otherwise the pinned CUDA 13.0 wheels in `target/cuda-toolchain` (or
//!    `CUDA_STREAMS_CUDA_ROOT`), installed on first use, so a machine without
//!    CUDA builds the same bytes.
//!
//! Extra flags go where nvcc itself reads them, `NVCC_PREPEND_FLAGS` and
//! `NVCC_APPEND_FLAGS`. Writing honours them (and says so: the images then
//! differ from the pinned build); `--check` clears them, because it verifies
//! the committed images against the pinned invocation.

use crate::{Result, cuda_toolchain, workspace_root, write_or_check};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Architectures that get SASS: Ampere (A100, consumer Ampere), Ada, Hopper,
/// Blackwell (data centre and consumer).
const SASS: &[u32] = &[80, 86, 89, 90, 100, 120];

/// The virtual architectures whose PTX is embedded, for GPUs without SASS
/// here (the driver compiles the newest one the GPU can run). compute_90 too,
/// so that a kernel that calls `cudaGridDependencySynchronize` (sm_90+: no
/// such call in compute_80 PTX) keeps the call on such a GPU; a programmatic
/// launch of it there would otherwise race.
const PTX: &[u32] = &[80, 90];

/// How a directory's sources become fatbins.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Linking {
    /// Whole-program compilation: SASS and PTX.
    Whole,
    /// Relocatable device code linked with the device runtime: SASS only.
    DeviceRuntime,
}

/// The kernel directories, relative to the workspace root.
const DIRECTORIES: &[(&str, Linking)] = &[
    ("kernels", Linking::Whole),
    ("crates/driver/kernels", Linking::DeviceRuntime),
];

/// Compile every kernel source; write the fatbins, or with `check` compare them.
pub(crate) fn run(check: bool) -> Result<()> {
    let scratch = workspace_root().join("target").join("build-kernels");
    // A fresh directory, so a fatbin from an earlier run can never be mistaken
    // for this run's output.
    if scratch.exists() {
        std::fs::remove_dir_all(&scratch)
            .map_err(|e| format!("cannot clear {}: {e}", scratch.display()))?;
    }
    std::fs::create_dir_all(&scratch)
        .map_err(|e| format!("cannot create {}: {e}", scratch.display()))?;
    let nvcc = find_nvcc(&scratch, check)?;
    let mut problems = Vec::new();
    let mut images = 0;
    for &(dir, linking) in DIRECTORIES {
        let kernels = workspace_root().join(dir);
        images += build_directory(&nvcc, &kernels, &scratch, linking, check, &mut problems)?;
    }
    if problems.is_empty() {
        if check {
            eprintln!("{images} kernel images are up to date");
        }
        Ok(())
    } else {
        Err(problems.join("\n"))
    }
}

/// Build (or check) the fatbins of one directory's sources, and remove (or
/// report) fatbins whose source is gone; each mismatch goes to `problems`.
/// The number of sources.
fn build_directory(
    nvcc: &Nvcc,
    kernels: &Path,
    scratch: &Path,
    linking: Linking,
    check: bool,
    problems: &mut Vec<String>,
) -> Result<usize> {
    let sources = files_with_extension(kernels, "cu")?;
    if sources.is_empty() {
        return Err(format!("no .cu sources in {}", kernels.display()));
    }
    for source in &sources {
        let stem = stem(source);
        let built = scratch.join(format!("{stem}.fatbin"));
        match linking {
            Linking::Whole => compile(nvcc, kernels, source, &built)?,
            Linking::DeviceRuntime => compile_linked(nvcc, kernels, source, scratch, &built)?,
        }
        let bytes =
            std::fs::read(&built).map_err(|e| format!("cannot read {}: {e}", built.display()))?;
        let committed = kernels.join(format!("{stem}.fatbin"));
        match write_or_check(&committed, &bytes, check, "build-kernels") {
            Ok(true) => eprintln!("wrote {} ({} bytes)", committed.display(), bytes.len()),
            Ok(false) if !check => {
                eprintln!(
                    "{} is up to date ({} bytes)",
                    committed.display(),
                    bytes.len()
                )
            }
            Ok(false) => {}
            Err(message) => problems.push(message),
        }
    }

    // A fatbin whose source is gone would still be embedded by anyone who
    // refers to it; it is stale by definition.
    for image in files_with_extension(kernels, "fatbin")? {
        let stem = stem(&image);
        if sources.iter().any(|s| self::stem(s) == stem) {
            continue;
        }
        if check {
            problems.push(format!(
                "{} is stale: its source {stem}.cu no longer exists; run `cargo xtask \
                 build-kernels` and commit the result",
                image.display()
            ));
        } else {
            std::fs::remove_file(&image)
                .map_err(|e| format!("cannot remove {}: {e}", image.display()))?;
            eprintln!("removed {} (no {stem}.cu)", image.display());
        }
    }
    Ok(sources.len())
}

/// The user's flag variables that nvcc reads itself.
const NVCC_FLAG_VARS: [&str; 2] = ["NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS"];

/// nvcc as `cc` finds and configures it, ready to take our arguments.
struct Nvcc {
    /// The executable.
    path: PathBuf,
    /// Variables `cc` sets for the compiler (e.g. `LC_ALL=C`).
    env: Vec<(OsString, OsString)>,
    /// Whether `NVCC_PREPEND_FLAGS`/`NVCC_APPEND_FLAGS` are cleared.
    clear_flags: bool,
}

/// Find nvcc through `cc::Build` with `.cuda(true)`.
///
/// `cc` is made for object files and libraries: `Build::compile` runs
/// `nvcc -c` and archives the result, and `get_compiler()` adds host-compiler
/// arguments (`-ccbin`, warning flags wrapped in `-Xcompiler`, `CXXFLAGS`) that
/// a fatbin does not use and that would change its invocation. So `cc`
/// supplies only what it is good at: which nvcc (the `NVCC` convention) and
/// the environment to run it in. [`compile`] then runs that nvcc with the
/// fatbin flags itself.
fn find_nvcc(scratch: &Path, check: bool) -> Result<Nvcc> {
    // cc reads TARGET/HOST/OPT_LEVEL from Cargo's build-script variables; an
    // xtask is no build script, so they are given here.
    let triple = format!("{}-unknown-linux-gnu", std::env::consts::ARCH);
    let tool = cc::Build::new()
        .cuda(true)
        .cudart("none")
        .ccbin(false)
        .no_default_flags(true)
        .target(&triple)
        .host(&triple)
        .opt_level(3)
        .debug(false)
        .out_dir(scratch)
        .cargo_metadata(false)
        .cargo_warnings(false)
        .try_get_compiler()
        .map_err(|e| format!("cc could not configure nvcc: {e}"))?;
    // cc answers a bare `nvcc` (to be looked up on PATH) when no NVCC
    // variable is set: then CUDA_PATH, then the pinned wheels.
    let path = if tool.path() != Path::new("nvcc") {
        tool.path().to_path_buf()
    } else if let Some(cuda) = std::env::var_os("CUDA_PATH").filter(|v| !v.is_empty()) {
        let nvcc = PathBuf::from(&cuda).join("bin").join("nvcc");
        if !nvcc.is_file() {
            return Err(format!(
                "CUDA_PATH={} has no bin/nvcc; unset it to use the pinned CUDA 13.0 wheels",
                Path::new(&cuda).display()
            ));
        }
        nvcc
    } else {
        cuda_toolchain::ensure()?.nvcc()
    };
    if !path.is_file() && path.components().count() > 1 {
        return Err(format!("nvcc not found at {}", path.display()));
    }
    let clear_flags = check;
    for var in NVCC_FLAG_VARS {
        if let Some(value) = std::env::var_os(var).filter(|v| !v.is_empty()) {
            if clear_flags {
                eprintln!(
                    "build-kernels --check: ignoring {var}={value:?} (checks the pinned flags)"
                );
            } else {
                eprintln!(
                    "build-kernels: nvcc adds {var}={value:?}; the images will differ from \
                     the pinned build that `--check` compares against"
                );
            }
        }
    }
    eprintln!("build-kernels: nvcc is {}", path.display());
    let env = tool
        .get_envs()
        .map(|(k, v)| (k.to_os_string(), v.to_os_string()))
        .collect();
    Ok(Nvcc {
        path,
        env,
        clear_flags,
    })
}

/// Run nvcc on one source from `dir`, the source named relative to it.
fn compile(nvcc: &Nvcc, dir: &Path, source: &Path, output: &Path) -> Result<()> {
    let name = source
        .file_name()
        .ok_or_else(|| format!("{} has no file name", source.display()))?;
    let mut command = nvcc.command(dir);
    command
        .args(["--fatbin", "-O3", "-std=c++17", "-Werror", "all-warnings"])
        .args(gencode_flags(PTX))
        .arg("-o")
        .arg(output)
        .arg(name);
    cuda_toolchain::run(&mut command).map_err(|e| format!("compiling {}: {e}", source.display()))
}

/// Compile one source as relocatable device code, then device-link it with
/// the device runtime (`-lcudadevrt`, from nvcc's own library directory)
/// into a fatbin of SASS for each of [`SASS`].
fn compile_linked(
    nvcc: &Nvcc,
    dir: &Path,
    source: &Path,
    scratch: &Path,
    output: &Path,
) -> Result<()> {
    let name = source
        .file_name()
        .ok_or_else(|| format!("{} has no file name", source.display()))?;
    let relocatable = scratch.join(format!("{}.rdc.fatbin", stem(source)));
    let sass = gencode_flags(&[]);
    let mut command = nvcc.command(dir);
    command
        .args([
            "--fatbin",
            "-rdc=true",
            "-O3",
            "-std=c++17",
            "-Werror",
            "all-warnings",
        ])
        .args(&sass)
        .arg("-o")
        .arg(&relocatable)
        .arg(name);
    cuda_toolchain::run(&mut command)
        .map_err(|e| format!("compiling {}: {e}", source.display()))?;
    let mut command = nvcc.command(dir);
    command
        .args(["--device-link", "--fatbin"])
        .args(&sass)
        .arg("-o")
        .arg(output)
        .arg(&relocatable)
        .arg("-lcudadevrt");
    cuda_toolchain::run(&mut command)
        .map_err(|e| format!("device-linking {}: {e}", source.display()))
}

impl Nvcc {
    /// nvcc, to run from `dir` in `cc`'s environment, with the user's flag
    /// variables cleared when checking.
    fn command(&self, dir: &Path) -> Command {
        let mut command = Command::new(&self.path);
        command.current_dir(dir).envs(self.env.iter().cloned());
        if self.clear_flags {
            for var in NVCC_FLAG_VARS {
                command.env_remove(var);
            }
        }
        command
    }
}

/// `-gencode` pairs: SASS for each of [`SASS`], plus PTX for each of `ptx`.
fn gencode_flags(ptx: &[u32]) -> Vec<String> {
    SASS.iter()
        .flat_map(|&sm| {
            let code = if ptx.contains(&sm) {
                format!("[sm_{sm},compute_{sm}]")
            } else {
                format!("sm_{sm}")
            };
            [
                "-gencode".to_string(),
                format!("arch=compute_{sm},code={code}"),
            ]
        })
        .collect()
}

/// The files in `dir` (not below it) ending in `.ext`, sorted by name.
fn files_with_extension(dir: &Path, ext: &str) -> Result<Vec<PathBuf>> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.is_file() && path.extension().is_some_and(|e| e == ext))
        .collect();
    files.sort();
    Ok(files)
}

fn stem(path: &Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}
