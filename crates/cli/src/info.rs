//! `cuda-streams info`: the settings in effect, what driver answered and
//! what each device is.
//!
//! Driver version and device count come from the driver's result layer;
//! each device is described by its `Context`.

use cuda_streams::{pipeline, pool, profiler};
use driver::sys::env::{Setting, Source};
use driver::{Context, DeviceInfo, DriverChoice, DriverKind, LoadedDriver};
use std::error::Error;

pub(crate) fn run() -> Result<(), Box<dyn Error>> {
    // Every setting is checked by the code that reads it; the first bad one
    // fails the command once the list shows it.
    let problems = check_settings();
    print_settings(&problems)?;
    if let Some(first) = problems.into_iter().next() {
        return Err(first);
    }
    let choice = DriverChoice::from_env()?;
    // Asked for the GPU and there is none: a failure (exit code 1, the cause
    // on stderr), as `CUDA_STREAMS_DRIVER=cuda` promises no silent fallback.
    let loaded = driver::select(choice)?;
    if choice == DriverChoice::Auto && loaded.kind == DriverKind::Soft {
        println!(
            "No GPU answered (libcuda.so.1 did not load or found no device); using the software driver."
        );
    }
    print(&loaded)?;
    Ok(())
}

fn print(loaded: &LoadedDriver) -> Result<(), driver::Error> {
    let version = driver::result::driver_version(*loaded)?;
    let count = Context::device_count_with(*loaded)?;
    println!("driver:          {} (version {version})", loaded.name());
    println!("devices:         {count}");
    let mut contexts = Vec::new();
    for ordinal in 0..count {
        // The safe layer already knows how to describe a device.
        let ctx = Context::with_driver(*loaded, ordinal)?;
        print_device(loaded, ctx.info());
        contexts.push(ctx);
    }
    print_peers(&contexts)
}

/// Which ordered pairs of devices can access each other's memory
/// (`cuDeviceCanAccessPeer`), one line per device.
fn print_peers(contexts: &[std::sync::Arc<Context>]) -> Result<(), driver::Error> {
    if contexts.len() < 2 {
        println!("peer access:     none (one device)");
        return Ok(());
    }
    println!("peer access:");
    for from in contexts {
        let peers = contexts
            .iter()
            .filter(|to| to.ordinal() != from.ordinal())
            .map(|to| {
                let can = from.can_access_peer(to)?;
                Ok(format!(
                    "{} {}",
                    to.ordinal(),
                    if can { "yes" } else { "no" }
                ))
            })
            .collect::<Result<Vec<_>, driver::Error>>()?;
        println!("  device {} -> {}", from.ordinal(), peers.join(", "));
    }
    Ok(())
}

fn print_device(loaded: &LoadedDriver, info: &DeviceInfo) {
    let (major, minor) = info.compute_capability;
    let range = info.priority_range;
    let total = info.total_memory;
    println!("device {}:        {}", info.ordinal, info.name);
    println!("  compute capability: {major}.{minor}");
    println!("  multiprocessors:    {}", info.multiprocessor_count);
    println!(
        "  memory:             {:.1} GiB ({total} bytes)",
        total as f64 / (1u64 << 30) as f64
    );
    println!("  async copy engines: {}", info.async_engine_count);
    println!(
        "  stream priorities:  {} (least) to {} (greatest)",
        range.least, range.greatest
    );
    let pools = if info.memory_pools_supported {
        "supported"
    } else {
        "not supported"
    };
    println!("  memory pools:       {pools}");
    let managed = if info.concurrent_managed_access {
        "concurrent access"
    } else {
        "no concurrent access"
    };
    println!("  managed memory:     {managed}");
    if loaded.kind == DriverKind::Soft {
        println!(
            "  (software driver: device memory is host memory, capped at the capacity above; \
             set CUDA_STREAMS_SOFT_CAPACITY_MB to change it, CUDA_STREAMS_SOFT_DEVICES for the \
             number of devices)"
        );
    }
}

/// Every setting the libraries and this tool read from the environment.
fn settings() -> Vec<Setting> {
    let mut all = driver::DRIVER_SETTINGS.to_vec();
    all.push(pool::POOL_SIZE_SETTING);
    all.extend(pipeline::PLANNER_SETTINGS);
    all.push(profiler::BACKEND_SETTING);
    all.push(driver::CACHE_SETTING);
    all.push(driver::sys::cupti::LIBRARY_SETTING);
    all.push(driver::sys::nvrtc::LIBRARY_SETTING);
    all.push(driver::sys::nccl::LIBRARY_SETTING);
    all.push(crate::LOG_SETTING);
    all
}

/// Each bad setting, as the code that reads it reports it.
fn check_settings() -> Vec<Box<dyn Error>> {
    let mut problems: Vec<Box<dyn Error>> = Vec::new();
    if let Err(err) = driver::check_env() {
        problems.push(err.into());
    }
    match pool::POOL_SIZE_SETTING.from_env() {
        Ok(Some(found)) => {
            if let Err(err) = pool::parse_pool_size(&found.value) {
                problems.push(err.into());
            }
        }
        Ok(None) => {}
        Err(err) => problems.push(err.into()),
    }
    if let Err(err) = pipeline::PlannerConfig::from_env() {
        problems.push(err.into());
    }
    if let Err(err) = profiler::Backend::from_env() {
        problems.push(err.into());
    }
    problems
}

/// One line per setting: its name, its value, and where the value came from.
fn print_settings(problems: &[Box<dyn Error>]) -> Result<(), Box<dyn Error>> {
    println!("environment (ours win over other names for the same setting):");
    for setting in settings() {
        let Some(found) = setting.from_env()? else {
            println!("  {:<30} {:<24} default", setting.name, setting.default);
            continue;
        };
        let mut from = match found.source() {
            Source::Ours(var) => format!("from {var}"),
            Source::Alias(var) => format!("from {var} (another name for {})", setting.name),
        };
        for lost in &found.overridden {
            from.push_str(&format!("; {lost} is set too, and ignored"));
        }
        let shown = format!("{}={:?}", found.var, found.value);
        if problems.iter().any(|p| p.to_string().contains(&shown)) {
            from.push_str("; INVALID");
        }
        println!(
            "  {:<30} {:<24} {from}",
            setting.name,
            format!("{:?}", found.value.trim())
        );
    }
    Ok(())
}
