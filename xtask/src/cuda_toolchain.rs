//! The CUDA 13.0 toolchain from NVIDIA's Python wheels, installed on demand.
//!
//! The GPU machine's driver is CUDA 13.0 and PTX from a newer toolkit does not
//! load on an older driver, so every version here is pinned.

use crate::Result;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The wheels that make up the toolchain, pinned to CUDA 13.0.
const WHEELS: &[&str] = &[
    "nvidia-cuda-nvcc==13.0.88",
    "nvidia-cuda-crt==13.0.88",
    "nvidia-nvvm==13.0.88",
    "nvidia-cuda-runtime==13.0.96",
    "nvidia-cuda-cccl==13.0.85",
    // `cupti.h` for the profiler's CUPTI backend (the library itself is opened
    // at run time from the GPU machine's CUDA install).
    "nvidia-cuda-cupti==13.0.85",
    // `nvrtc.h` for the run-time compiler's bindings (the library itself is
    // opened at run time from the GPU machine's CUDA install or a wheel).
    "nvidia-cuda-nvrtc==13.0.88",
];

/// The NCCL wheel whose `nccl.h` the NCCL bindings come from: NCCL 2.28, the
/// version PyTorch 2.11 ships and the GPU machines run.
pub(crate) const NCCL_WHEEL: &str = "nvidia-nccl-cu13==2.28.9";

/// `.../nvidia/nccl/include`, holding `nccl.h` from [`NCCL_WHEEL`], installed
/// into the toolchain's virtual environment when missing.
/// `CUDA_STREAMS_NCCL_INCLUDE` may point at a directory holding `nccl.h`
/// (NCCL 2.28) instead.
pub(crate) fn ensure_nccl() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("CUDA_STREAMS_NCCL_INCLUDE") {
        let dir = PathBuf::from(dir);
        if dir.join("nccl.h").is_file() {
            return Ok(dir);
        }
        return Err(format!(
            "CUDA_STREAMS_NCCL_INCLUDE={} has no nccl.h",
            dir.display()
        ));
    }
    ensure()?;
    let venv = crate::workspace_root()
        .join("target")
        .join("cuda-toolchain");
    let find = || {
        let lib = std::fs::read_dir(venv.join("lib")).ok()?;
        lib.filter_map(|entry| entry.ok())
            .map(|entry| entry.path().join("site-packages/nvidia/nccl/include"))
            .find(|dir| dir.join("nccl.h").is_file())
    };
    if let Some(dir) = find() {
        return Ok(dir);
    }
    eprintln!(
        "xtask: installing {NCCL_WHEEL} (nccl.h) into {}",
        venv.display()
    );
    run(Command::new(venv.join("bin").join("pip")).args([
        "install",
        "--quiet",
        "--disable-pip-version-check",
        NCCL_WHEEL,
    ]))
    .map_err(|e| {
        format!(
            "{e}\ncould not install {NCCL_WHEEL}; this needs access to the Python package \
             index. Offline, set CUDA_STREAMS_NCCL_INCLUDE to a directory holding nccl.h \
             from NCCL 2.28"
        )
    })?;
    find().ok_or_else(|| {
        format!("{NCCL_WHEEL} installed but no nvidia/nccl/include/nccl.h was found")
    })
}

/// Paths into an installed toolchain.
pub(crate) struct CudaToolchain {
    /// `.../nvidia/cu13`: holds `bin/nvcc` and `include/cuda.h`.
    pub(crate) root: PathBuf,
}

impl CudaToolchain {
    pub(crate) fn include_dir(&self) -> PathBuf {
        self.root.join("include")
    }

    pub(crate) fn nvcc(&self) -> PathBuf {
        self.root.join("bin").join("nvcc")
    }
}

/// Find the toolchain under `target/cuda-toolchain`, installing it when missing.
///
/// `CUDA_STREAMS_CUDA_ROOT` may point at an existing `cu13`-style root (a directory
/// with `bin/nvcc` and `include/cuda.h`) to skip the install.
pub(crate) fn ensure() -> Result<CudaToolchain> {
    if let Some(root) = std::env::var_os("CUDA_STREAMS_CUDA_ROOT") {
        let root = PathBuf::from(root);
        if root.join("include/cuda.h").is_file() {
            return Ok(CudaToolchain { root });
        }
        return Err(format!(
            "CUDA_STREAMS_CUDA_ROOT={} has no include/cuda.h",
            root.display()
        ));
    }
    let venv = crate::workspace_root()
        .join("target")
        .join("cuda-toolchain");
    if let Some(root) = find_root(&venv) {
        if root.join("include/cupti.h").is_file() && root.join("include/nvrtc.h").is_file() {
            return Ok(CudaToolchain { root });
        }
        // A toolchain installed before the CUPTI or NVRTC wheels were added:
        // add them.
        let added: Vec<&str> = WHEELS
            .iter()
            .copied()
            .filter(|w| w.starts_with("nvidia-cuda-cupti") || w.starts_with("nvidia-cuda-nvrtc"))
            .collect();
        eprintln!("xtask: adding {} to {}", added.join(" "), venv.display());
        run(Command::new(venv.join("bin").join("pip"))
            .args(["install", "--quiet", "--disable-pip-version-check"])
            .args(&added))?;
        return Ok(CudaToolchain { root });
    }
    eprintln!(
        "xtask: installing the CUDA 13.0 toolchain (nvcc, headers) from PyPI into {}",
        venv.display()
    );
    run(Command::new("python3").arg("-m").arg("venv").arg(&venv)).map_err(|e| {
        format!("{e}\nPython 3 with the venv module is needed to install the CUDA toolchain")
    })?;
    let pip = venv.join("bin").join("pip");
    run(Command::new(&pip)
        .args(["install", "--quiet", "--disable-pip-version-check"])
        .args(WHEELS))
    .map_err(|e| {
        format!(
            "{e}\ncould not install the CUDA 13.0 wheels ({}); this needs access to the Python \
                 package index. Offline, set CUDA_STREAMS_CUDA_ROOT to a directory holding \
                 bin/nvcc and include/cuda.h from CUDA 13.0",
            WHEELS.join(" ")
        )
    })?;
    let root = find_root(&venv).ok_or_else(|| {
        format!(
            "the CUDA wheels installed but no nvidia/cu13/include/cuda.h was found under {}",
            venv.display()
        )
    })?;
    Ok(CudaToolchain { root })
}

/// `lib/python3.*/site-packages/nvidia/cu13` inside a virtual environment.
fn find_root(venv: &Path) -> Option<PathBuf> {
    let lib = std::fs::read_dir(venv.join("lib")).ok()?;
    lib.filter_map(|entry| entry.ok())
        .map(|entry| entry.path().join("site-packages/nvidia/cu13"))
        .find(|root| root.join("include/cuda.h").is_file())
}

/// Make sure bindgen can find libclang, installing Debian's `libclang-dev` when
/// it is missing and we are allowed to.
pub(crate) fn ensure_libclang() -> Result<()> {
    if libclang_present() {
        return Ok(());
    }
    eprintln!("xtask: libclang not found; trying `apt-get install libclang-dev`");
    let installed = run(Command::new("apt-get").args(["update", "-q"]))
        .and_then(|()| run(Command::new("apt-get").args(["install", "-y", "-q", "libclang-dev"])));
    match installed {
        Ok(()) if libclang_present() => Ok(()),
        Ok(()) => Err(
            "libclang-dev installed but libclang.so is still not found; set LIBCLANG_PATH".into(),
        ),
        Err(e) => Err(format!(
            "{e}\nbindgen needs libclang. Install it with `apt-get install libclang-dev` \
             (as root, with network access), or set LIBCLANG_PATH to the directory holding libclang.so"
        )),
    }
}

fn libclang_present() -> bool {
    if let Some(dir) = std::env::var_os("LIBCLANG_PATH") {
        return Path::new(&dir).exists();
    }
    let dirs = [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib64",
        "/usr/lib",
        "/usr/lib/aarch64-linux-gnu",
    ];
    let has_in = |dir: &Path| {
        std::fs::read_dir(dir).is_ok_and(|entries| {
            entries
                .filter_map(|e| e.ok())
                .any(|e| is_libclang(&e.file_name().to_string_lossy()))
        })
    };
    dirs.iter().any(|d| has_in(Path::new(d)))
        || std::fs::read_dir("/usr/lib")
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with("llvm-"))
            .any(|e| has_in(&e.path().join("lib")))
}

/// Whether `name` is a library bindgen loads: `libclang.so`, `libclang-N.so`
/// or a versioned one. `libclang-cpp.so.N` (LLVM's C++ library, which some
/// machines have without libclang) is not: bindgen skips it, so counting it
/// would leave libclang uninstalled and bindgen failing.
fn is_libclang(name: &str) -> bool {
    name.starts_with("libclang") && name.contains(".so") && !name.starts_with("libclang-cpp")
}

/// Run a command, turning a failure into a message naming it.
pub(crate) fn run(command: &mut Command) -> Result<()> {
    let shown = format!("{command:?}");
    let status = command
        .status()
        .map_err(|e| format!("could not start {shown}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{shown} failed with {status}"))
    }
}

#[cfg(test)]
mod tests {
    use super::is_libclang;

    #[test]
    fn only_the_libraries_bindgen_loads_count_as_libclang() {
        for name in [
            "libclang.so",
            "libclang.so.1",
            "libclang-14.so.1",
            "libclang-18.so",
        ] {
            assert!(is_libclang(name), "{name}");
        }
        for name in [
            "libclang-cpp.so.14",
            "libclang-cpp.so",
            "libclangBasic.a",
            "libLLVM.so.14",
        ] {
            assert!(!is_libclang(name), "{name}");
        }
    }
}
