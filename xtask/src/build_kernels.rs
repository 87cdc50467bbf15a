//! `cargo xtask build-kernels`: compile `kernels/*.cu` into committed fatbins.
//!
//! One fatbin per source, written next to it (`kernels/saxpy.cu` ->
//! `kernels/saxpy.fatbin`), holding SASS for every architecture in [`SASS`] and
//! PTX for [`PTX`] so newer GPUs can JIT it. The images are committed and embedded
//! with `include_bytes!`, so building the workspace needs no CUDA toolkit.
//!
//! The output is byte-for-byte reproducible. nvcc embeds no paths or temporary
//! names as long as `-lineinfo`/`-G` are left out (both record the working
//! directory and the include paths), so we compile without them, from `kernels/`
//! with relative source names, and with `NVCC_PREPEND_FLAGS`/`NVCC_APPEND_FLAGS`
//! cleared so a developer's environment cannot change the bytes.
//!
//! `--check` compiles into `target/build-kernels` and fails, naming every stale
//! image, when a committed fatbin differs from the fresh one or has no source.

use crate::{Result, cuda_toolchain, workspace_root, write_or_check};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Architectures that get SASS: Ampere (A100, consumer Ampere), Ada, Hopper,
/// Blackwell (data centre and consumer).
const SASS: &[u32] = &[80, 86, 89, 90, 100, 120];

/// The virtual architecture whose PTX is embedded, for GPUs newer than [`SASS`].
const PTX: u32 = 80;

/// Compile every kernel source; write the fatbins, or with `check` compare them.
pub(crate) fn run(check: bool) -> Result<()> {
    let toolchain = cuda_toolchain::ensure()?;
    let nvcc = toolchain.nvcc();
    if !nvcc.is_file() {
        return Err(format!("nvcc not found at {}", nvcc.display()));
    }
    let kernels = workspace_root().join("kernels");
    let scratch = workspace_root().join("target").join("build-kernels");
    // A fresh directory, so a fatbin from an earlier run can never be mistaken
    // for this run's output.
    if scratch.exists() {
        std::fs::remove_dir_all(&scratch)
            .map_err(|e| format!("cannot clear {}: {e}", scratch.display()))?;
    }
    std::fs::create_dir_all(&scratch)
        .map_err(|e| format!("cannot create {}: {e}", scratch.display()))?;

    let sources = files_with_extension(&kernels, "cu")?;
    if sources.is_empty() {
        return Err(format!("no .cu sources in {}", kernels.display()));
    }
    let mut problems = Vec::new();
    for source in &sources {
        let stem = stem(source);
        let built = scratch.join(format!("{stem}.fatbin"));
        compile(&nvcc, &kernels, source, &built)?;
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
    for image in files_with_extension(&kernels, "fatbin")? {
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

    if problems.is_empty() {
        if check {
            eprintln!("{} kernel images are up to date", sources.len());
        }
        Ok(())
    } else {
        Err(problems.join("\n"))
    }
}

/// Run nvcc on one source from `dir`, the source named relative to it.
fn compile(nvcc: &Path, dir: &Path, source: &Path, output: &Path) -> Result<()> {
    let name = source
        .file_name()
        .ok_or_else(|| format!("{} has no file name", source.display()))?;
    let mut command = Command::new(nvcc);
    command
        .current_dir(dir)
        .env_remove("NVCC_PREPEND_FLAGS")
        .env_remove("NVCC_APPEND_FLAGS")
        .args(["--fatbin", "-O3", "-std=c++17", "-Werror", "all-warnings"])
        .args(gencode_flags())
        .arg("-o")
        .arg(output)
        .arg(name);
    cuda_toolchain::run(&mut command).map_err(|e| format!("compiling {}: {e}", source.display()))
}

/// `-gencode` pairs: SASS for each of [`SASS`], plus SASS and PTX for [`PTX`].
fn gencode_flags() -> Vec<String> {
    SASS.iter()
        .flat_map(|&sm| {
            let code = if sm == PTX {
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
