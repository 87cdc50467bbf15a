//! Project automation: `cargo xtask <command>`.
//!
//! One binary, no async runtime and no CLI framework: the commands are few and
//! their arguments simple, so a `match` over `std::env::args` is all we need.

mod bench_report;
mod build_kernels;
mod cuda_toolchain;
mod cust_stub;
mod doctests;
mod gen_bindings;
mod gen_cupti;
mod gen_nccl;
mod gen_nvrtc;
mod gpu_bundle;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

const HELP: &str = "\
cargo xtask <command> [options]

Commands:
  bindgen [--check]        regenerate cuda-sys/src/{bindings,driver_table,error_names}.rs
                           and cuda-sys/src/nccl/{bindings,table}.rs (nccl.h of NCCL 2.28)
                           and cuda-sys/src/cupti/{bindings,table}.rs (CUDA 13.0's cupti.h)
                           and cuda-sys/src/nvrtc/{bindings,table}.rs (CUDA 13.0's nvrtc.h)
                           from CUDA 13.0's cuda.h; --check fails when the committed
                           files differ from a fresh generation
  gpu-bundle [--no-bench]  build every test binary, the doc tests, the benches and the CLI
                           in release mode into target/gpu-bundle with run.sh
                           (see docs/testing.md)
  build-kernels [--check]  compile kernels/*.cu and crates/driver/kernels/*.cu with nvcc 13.0 into fatbins
                           (SASS sm_80..sm_120, PTX compute_80, compute_90); --check rebuilds
                           and fails naming each committed image that is stale
  bench-report [--from LOG_DIR] [--out PATH]
                           write docs/benchmarks.md from the benches' RATIO and FIGURE
                           lines: from LOG_DIR/bench-*.log and gpu.txt as
                           target/gpu-bundle/run.sh writes them, or (no --from) by
                           running `cargo bench -p cuda-streams-benches` here
  cust-stub                build target/cuda-stub/lib64/libcuda.so, a link stub (soname
                           libcuda.so.1, every entry point cust declares returns
                           CUDA_ERROR_STUB_LIBRARY) so that the `cust` feature links
                           without NVIDIA's driver: CUDA_LIBRARY_PATH=target/cuda-stub
  help                     print this text

The CUDA 13.0 headers come from NVIDIA's Python wheels, installed on first use
into target/cuda-toolchain (pinned to 13.0, the GPU machines' driver); bindgen needs libclang
(`apt-get install libclang-dev`), which is installed when missing and possible.
";

/// The error type of every command: a message for the person at the terminal.
pub(crate) type Result<T> = std::result::Result<T, String>;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (command, rest) = match args.split_first() {
        Some((command, rest)) => (command.as_str(), rest),
        None => ("help", &[][..]),
    };
    let check = rest.iter().any(|a| a == "--check");
    let result = match command {
        "bindgen" => gen_bindings::run(check),
        "build-kernels" => build_kernels::run(check),
        "bench-report" => bench_report::run(rest),
        "cust-stub" => cust_stub::run_stub(),
        "gpu-bundle" => gpu_bundle::run_bundle(!rest.iter().any(|a| a == "--no-bench")),
        "help" | "--help" | "-h" => {
            print!("{HELP}");
            Ok(())
        }
        other => Err(format!("unknown command `{other}`\n\n{HELP}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("xtask {command}: {message}");
            ExitCode::FAILURE
        }
    }
}

/// The workspace root (xtask lives one level below it).
///
/// `cargo run` (so `cargo xtask`) sets `CARGO_MANIFEST_DIR` for the process
/// too, and that one wins over the path compiled in: cargo reuses an xtask
/// binary built in a clone of this repository that shared the target folder
/// (its fingerprint does not include the checkout's path), and the compiled-in
/// path would then point every command at that clone.
pub(crate) fn workspace_root() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        // Inherited from some other package's `cargo run`, it is not ours.
        .filter(|dir| dir.ends_with("xtask"))
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
        .parent()
        .expect("xtask sits inside the workspace")
        .to_path_buf()
}

/// Write `contents` to `path`, or with `check` compare and report a stale file,
/// naming `command`, the xtask subcommand that regenerates it.
pub(crate) fn write_or_check(
    path: &Path,
    contents: &[u8],
    check: bool,
    command: &str,
) -> Result<bool> {
    let current = std::fs::read(path).ok();
    let same = current.as_deref() == Some(contents);
    if check {
        if !same {
            return Err(format!(
                "{} is stale: run `cargo xtask {command}` and commit the result",
                path.display()
            ));
        }
        return Ok(false);
    }
    if !same {
        std::fs::write(path, contents)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(!same)
}
