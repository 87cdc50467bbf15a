//! `cargo xtask gpu-bundle`: everything the H200 runs, in one folder.
//!
//! The GPU machine has no Rust toolchain, so we build here: every test binary
//! of the workspace, the doc tests (README, the `docs/*.md` guides the crates
//! include, rustdoc examples: see `doctests.rs`), the facade's examples (its
//! `examples` test runs them), the bench binaries and the CLI, in release mode,
//! stripped, next to `run.sh` (which sets `CUDA_STREAMS_DRIVER=cuda` so that a
//! missing GPU fails instead of passing on the software driver).
//!
//! Nothing in the bundle reads the source tree: it may be built in any
//! checkout and run where none is (tests embed what they compare against).
//! The test binaries that need the tree, the driver's `borrow_rules` and the
//! engine's `id_types` (trybuild compile-fail proofs: they run cargo), are
//! left out.

use crate::{Result, cuda_toolchain::run, cust_stub, doctests, workspace_root};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The bundle must travel with the device tool, which carries at most 64 MiB.
const SIZE_LIMIT: u64 = 64 << 20;
const RUN_SH: &str = include_str!("../gpu-bundle/run.sh");
/// A/B benches against a bench build of an earlier commit (`base-benches.tar.xz`).
const AB_SH: &str = include_str!("../gpu-bundle/ab.sh");
/// Every test binary through `run.sh` in parallel shards (memcheck in minutes).
const SHARDS_SH: &str = include_str!("../gpu-bundle/shards.sh");
/// Test binaries left out of the bundle because they need cargo and the
/// source tree (see their filter below).
const NEEDS_SOURCE_TREE: &[&str] = &[
    "cuda-streams-driver-borrow_rules",
    "cuda-streams-engine-id_types",
];

pub(crate) fn run_bundle(with_benches: bool) -> Result<()> {
    let root = workspace_root();
    let out = root.join("target").join("gpu-bundle");
    if out.exists() {
        std::fs::remove_dir_all(&out)
            .map_err(|e| format!("cannot clear {}: {e}", out.display()))?;
    }
    for dir in ["tests", "doctests", "examples", "benches", "bin"] {
        std::fs::create_dir_all(out.join(dir)).map_err(|e| format!("cannot create {dir}: {e}"))?;
    }

    // `cargo test` builds the examples too; the facade's `examples` test finds
    // them through CUDA_STREAMS_EXAMPLES_DIR, which run.sh sets.
    // Off-by-default features whose tests need the GPU are on here (the
    // cudarc interop tests skip without one). cust links libcuda at build
    // time: against the link stub here, the real driver on the GPU machine.
    cust_stub::run_stub()?;
    let built = built_executables(
        &root,
        &[
            "test",
            "--workspace",
            "--release",
            "--no-run",
            "--features",
            "cuda-streams-driver/cudarc,cuda-streams-driver/cust",
        ],
        Some(&cust_stub::library_dir(&root)),
    )?;
    // xtask's and the bench helpers' own unit tests have nothing to do with a GPU.
    // The borrow rules' compile-fail proofs run cargo and rustc on the source
    // tree (trybuild), which the GPU machine has neither of; they prove
    // nothing about a driver, and `cargo test` here runs them.
    let tests: Vec<_> = built
        .iter()
        .filter(|b| b.is_test)
        .filter(|b| !b.name.starts_with("xtask-") && !b.name.starts_with("cuda-streams-benches-"))
        .filter(|b| !NEEDS_SOURCE_TREE.contains(&b.name.as_str()))
        .collect();
    for test in &tests {
        copy_stripped(&test.path, &out.join("tests").join(&test.name))?;
    }
    let doctests = doctests::build(&root, &root.join("target").join("gpu-bundle-doctests"))?;
    for doctest in &doctests {
        copy_stripped(&doctest.path, &out.join("doctests").join(&doctest.name))?;
    }
    for example in built.iter().filter(|b| b.kind == "example") {
        copy_stripped(&example.path, &out.join("examples").join(&example.target))?;
    }
    let mut benches = Vec::new();
    if with_benches && root.join("benches").join("Cargo.toml").is_file() {
        benches = built_executables(&root, &["bench", "--workspace", "--no-run"], None)?
            .into_iter()
            .filter(|b| b.kind == "bench")
            .collect();
        for bench in &benches {
            copy_stripped(&bench.path, &out.join("benches").join(&bench.target))?;
        }
    }
    run(Command::new("cargo").current_dir(&root).args([
        "build",
        "--release",
        "-p",
        "cuda-streams-cli",
    ]))?;
    copy_stripped(
        &root.join("target/release/cuda-streams"),
        &out.join("bin/cuda-streams"),
    )?;
    std::fs::write(out.join("run.sh"), RUN_SH).map_err(|e| format!("cannot write run.sh: {e}"))?;
    std::fs::write(out.join("ab.sh"), AB_SH).map_err(|e| format!("cannot write ab.sh: {e}"))?;
    std::fs::write(out.join("shards.sh"), SHARDS_SH)
        .map_err(|e| format!("cannot write shards.sh: {e}"))?;

    let commit = Command::new("git")
        .current_dir(&root)
        .args(["describe", "--always", "--dirty"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let unpacked = dir_size(&out)?;
    let manifest = format!(
        "commit {commit}, {} test binaries, {} doc-test binaries, {} bench binaries, {:.1} MiB unpacked\n",
        tests.len(),
        doctests.len(),
        benches.len(),
        unpacked as f64 / (1 << 20) as f64
    );
    std::fs::write(out.join("MANIFEST"), &manifest)
        .map_err(|e| format!("cannot write MANIFEST: {e}"))?;
    // Some 60 test binaries of ~1.3 MiB each exceed what the device tool carries;
    // they compress about 4x, and run.sh unpacks them on the GPU machine.
    pack(
        &out,
        &[
            "tests", "doctests", "examples", "benches", "bin", "MANIFEST",
        ],
    )?;
    let size = dir_size(&out)?;
    if size > SIZE_LIMIT {
        return Err(format!(
            "the bundle is {:.1} MiB, over the {} MiB the device tool carries",
            size as f64 / (1 << 20) as f64,
            SIZE_LIMIT >> 20
        ));
    }
    eprintln!("xtask: target/gpu-bundle: {manifest}");
    eprintln!(
        "xtask: on the GPU machine, from the repo root: bash target/gpu-bundle/run.sh <log folder>"
    );
    Ok(())
}

/// An executable a cargo build made.
struct Built {
    /// `<package>-<target>`, or `<package>-unit` for a library's or binary's
    /// own tests: the name a test binary gets in the bundle.
    name: String,
    /// The cargo target's name.
    target: String,
    /// The target kind: `lib`, `bin`, `test`, `example`, `bench`...
    kind: String,
    /// Whether it is a test harness build.
    is_test: bool,
    path: PathBuf,
}

/// Run a cargo build with JSON messages and collect the executables it made;
/// `cust_link_stub` is the `CUDA_LIBRARY_PATH` cust's build scripts link from.
fn built_executables(
    root: &Path,
    args: &[&str],
    cust_link_stub: Option<&Path>,
) -> Result<Vec<Built>> {
    let mut command = Command::new("cargo");
    if let Some(stub) = cust_link_stub {
        command.env("CUDA_LIBRARY_PATH", stub);
    }
    let output = command
        .current_dir(root)
        .args(args)
        .arg("--message-format=json")
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("could not run cargo {}: {e}", args.join(" ")))?;
    if !output.status.success() {
        return Err(format!("cargo {} failed", args.join(" ")));
    }
    let mut found = Vec::new();
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let Ok(message) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if message["reason"] != "compiler-artifact" {
            continue;
        }
        let Some(executable) = message["executable"].as_str() else {
            continue;
        };
        let target = message["target"]["name"].as_str().unwrap_or("unknown");
        let kind = message["target"]["kind"][0].as_str().unwrap_or("");
        let package = message["package_id"]
            .as_str()
            .and_then(package_name)
            .unwrap_or_else(|| target.to_string());
        let name = match kind {
            "lib" | "bin" | "proc-macro" => format!("{package}-unit"),
            _ => format!("{package}-{target}"),
        };
        found.push(Built {
            name,
            target: target.to_string(),
            kind: kind.to_string(),
            is_test: message["profile"]["test"] == true,
            path: PathBuf::from(executable),
        });
    }
    found.sort_by(|a, b| (&a.name, a.is_test).cmp(&(&b.name, b.is_test)));
    found.dedup_by(|a, b| a.name == b.name && a.is_test == b.is_test);
    Ok(found)
}

/// The package name in a cargo package id: `path+file:///w/crates/driver#cuda-streams-driver@0.1.0`
/// gives `cuda-streams-driver`; when the directory is named like the package, cargo
/// leaves the name out (`path+file:///w/crates/cuda-streams#0.1.0`) and it is the
/// last path component.
fn package_name(id: &str) -> Option<String> {
    let (url, after_hash) = id.rsplit_once('#')?;
    match after_hash.split_once('@') {
        Some((name, _version)) => Some(name.to_string()),
        None => url.rsplit('/').next().map(str::to_string),
    }
}

/// Replace `entries` of `dir` by `dir/payload.tar.xz` holding them.
fn pack(dir: &Path, entries: &[&str]) -> Result<()> {
    run(Command::new("tar")
        .current_dir(dir)
        .env("XZ_OPT", "-6 -T0")
        .args(["-cJf", "payload.tar.xz"])
        .args(entries))?;
    for entry in entries {
        let path = dir.join(entry);
        let removed = if path.is_dir() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        removed.map_err(|e| format!("cannot remove {}: {e}", path.display()))?;
    }
    Ok(())
}

fn copy_stripped(from: &Path, to: &Path) -> Result<()> {
    std::fs::copy(from, to).map_err(|e| format!("cannot copy {}: {e}", from.display()))?;
    run(Command::new("strip").arg("--strip-all").arg(to))
}

fn dir_size(dir: &Path) -> Result<u64> {
    let mut total = 0;
    for entry in
        std::fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?
    {
        let entry = entry.map_err(|e| e.to_string())?;
        let meta = entry.metadata().map_err(|e| e.to_string())?;
        total += if meta.is_dir() {
            dir_size(&entry.path())?
        } else {
            meta.len()
        };
    }
    Ok(total)
}
